/* attn_fwd_ref.c - the CPU reference of forward attention, in float64.
 *
 * This is both the oracle the GPU kernels are checked against and the engine of the daemon's CPU
 * backend, so it must be exact (float64 everywhere, a true two-pass softmax: the row max first,
 * then exp(s - max) and the sum) and not slow. The work is organised like a flash-attention tile
 * loop without the online rescaling:
 *   - per (batch, kv-head) the visible K and V rows are converted to float64 once and shared by
 *     every query head of the GQA group;
 *   - query rows go in blocks of Br; loops run key-outer, row-inner so one K or V row is loaded
 *     once per block and the Q block and accumulators stay in L1;
 *   - one scratch allocation per call, bounded by fa_attn_fwd_ref_scratch_limit(). When K and V do
 *     not fit, keys go in chunks that are converted once per row block in each pass, and scores
 *     are recomputed in pass 2 instead of stored: the arithmetic, and so the result, is the same.
 * The inner loops are small register tiles (2 query rows x 4 keys for Q K^T, 2 rows x 8 columns
 * for P V) written with two-lane vectors; each output is summed in a fixed order whatever tile
 * computes it, so the result does not depend on Br, chunking or the bh split.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref_int.h"
#include "fa_attn.h"

#define REF_DEFAULT_SCRATCH ((size_t)64 << 20)

static _Atomic size_t ref_scratch_limit = REF_DEFAULT_SCRATCH;

/* Set (bytes != 0) and return the scratch limit; see fa_attn.h. */
size_t fa_attn_fwd_ref_scratch_limit(size_t bytes)
{
	if (bytes == 0)
		return atomic_load(&ref_scratch_limit);
	return atomic_exchange(&ref_scratch_limit, bytes);
}

/* Everything one call needs, so helpers take one pointer. */
struct ref_ctx {
	const struct fa_attn_fwd_desc *d;
	const void *q, *k, *v;
	const struct ref_out *out;
	const struct ref_pages *pg; /* NULL: K and V rows by the descriptor's strides */
	int64_t br;      /* query rows per block */
	int64_t kc;      /* keys per chunk */
	bool one_chunk;  /* K and V of a whole (b, kv-head) fit: converted once, scores stored */
	int64_t k0;      /* the first key any row of the problem sees */
	int64_t nvis;    /* keys [k0, k0 + nvis) are all any row of the problem can see */
	/* scratch, all float64 except lo and hi */
	double *kd, *vd; /* [kc][D] */
	double *s;       /* [br][kc] scores, then probabilities */
	double *qd;      /* [br][D] */
	double *acc;     /* [br][D] unnormalised O */
	double *m, *l;   /* [br] row max and sum */
	int64_t *lo, *hi; /* [br] keys [lo, hi) each row sees (mask and window) */
};

/* Convert keys [j0, j0 + cn) of (b, kvh) from K (and V when want_v) into kd / vd. */
static void ref_load_kv(struct ref_ctx *c, int64_t b, int64_t kvh, int64_t j0, int64_t cn,
                        bool want_v)
{
	const struct fa_attn_fwd_desc *d = c->d;
	int64_t D = d->D;
	for (int64_t j = 0; j < cn; j++) {
		int64_t row = b, at = j0 + j; /* a paged key is row at % page_size of its page */
		if (c->pg != NULL) {
			row = c->pg->table[at / c->pg->page_size];
			at %= c->pg->page_size;
		}
		int64_t ko = d->k_stride[0] * row + d->k_stride[1] * at + d->k_stride[2] * kvh;
		ref_load_row(c->k, d->dtype, ko, D, c->kd + j * D);
		if (want_v) {
			int64_t vo = d->v_stride[0] * row + d->v_stride[1] * at + d->v_stride[2] * kvh;
			ref_load_row(c->v, d->dtype, vo, D, c->vd + j * D);
		}
	}
}

/* Two float64 lanes. GCC/clang vector extensions: SSE2 on any x86-64, NEON on arm64, scalar code
 * elsewhere; the products and sums are the same IEEE operations in every case. */
typedef double v2d __attribute__((vector_size(16)));

static inline v2d ld2(const double *p)
{
	v2d v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static inline void st2(double *p, v2d v)
{
	memcpy(p, &v, sizeof(v));
}

static inline v2d splat2(double x)
{
	return (v2d){x, x};
}

/* Every score is summed in one order, whichever tile computes it: even and odd x in two lanes,
 * each in increasing x, then lane 0 + lane 1. So results do not depend on Br, on chunking or on
 * which rows share a tile. This is the one-dot version, for tile edges. */
static inline double ref_dot(const double *a, const double *b, int64_t D)
{
	v2d s = {0, 0};
	for (int64_t x = 0; x < D; x += 2)
		s += ld2(a + x) * ld2(b + x);
	return s[0] + s[1];
}

/* Scores of query rows qa (and qb, unless NULL) against keys [0, jn) of kd: sa[j] = scale *
 * qa . k_j. Four keys at a time share each Q load; with two rows that is 8 independent
 * accumulators, enough to hide the add latency. */
static void ref_qk_rows(const double *qa, const double *qb, const double *kd, int64_t D,
                        int64_t jn, double scale, double *sa, double *sb)
{
	int64_t j = 0;
	for (; j + 4 <= jn; j += 4) {
		const double *k0 = kd + j * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
		v2d a0 = {0, 0}, a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
		if (qb != NULL) {
			for (int64_t x = 0; x < D; x += 2) {
				v2d q0 = ld2(qa + x), q1 = ld2(qb + x), kv;
				kv = ld2(k0 + x);
				a0 += q0 * kv;
				b0 += q1 * kv;
				kv = ld2(k1 + x);
				a1 += q0 * kv;
				b1 += q1 * kv;
				kv = ld2(k2 + x);
				a2 += q0 * kv;
				b2 += q1 * kv;
				kv = ld2(k3 + x);
				a3 += q0 * kv;
				b3 += q1 * kv;
			}
			sb[j] = scale * (b0[0] + b0[1]);
			sb[j + 1] = scale * (b1[0] + b1[1]);
			sb[j + 2] = scale * (b2[0] + b2[1]);
			sb[j + 3] = scale * (b3[0] + b3[1]);
		} else {
			for (int64_t x = 0; x < D; x += 2) {
				v2d q0 = ld2(qa + x);
				a0 += q0 * ld2(k0 + x);
				a1 += q0 * ld2(k1 + x);
				a2 += q0 * ld2(k2 + x);
				a3 += q0 * ld2(k3 + x);
			}
		}
		sa[j] = scale * (a0[0] + a0[1]);
		sa[j + 1] = scale * (a1[0] + a1[1]);
		sa[j + 2] = scale * (a2[0] + a2[1]);
		sa[j + 3] = scale * (a3[0] + a3[1]);
	}
	for (; j < jn; j++) {
		sa[j] = scale * ref_dot(qa, kd + j * D, D);
		if (qb != NULL)
			sb[j] = scale * ref_dot(qb, kd + j * D, D);
	}
}

/* acca[x] += sum_j pa[j] * V_j[x] (and accb with pb, unless NULL) for keys [0, jn) of vd. Eight
 * columns per row stay in registers across all keys; each element is summed in increasing j,
 * whichever tile does it, so results do not depend on tiling. */
static void ref_pv_rows(double *acca, double *accb, const double *pa, const double *pb,
                        const double *vd, int64_t D, int64_t jn)
{
	if (jn <= 0)
		return;
	for (int64_t x = 0; x < D; x += 8) {
		v2d a0 = ld2(acca + x), a1 = ld2(acca + x + 2), a2 = ld2(acca + x + 4),
		    a3 = ld2(acca + x + 6);
		if (accb != NULL) {
			v2d b0 = ld2(accb + x), b1 = ld2(accb + x + 2), b2 = ld2(accb + x + 4),
			    b3 = ld2(accb + x + 6);
			for (int64_t j = 0; j < jn; j++) {
				const double *vr = vd + j * D + x;
				v2d p = splat2(pa[j]), pq = splat2(pb[j]);
				v2d v0 = ld2(vr), v1 = ld2(vr + 2), v2 = ld2(vr + 4), v3 = ld2(vr + 6);
				a0 += p * v0;
				a1 += p * v1;
				a2 += p * v2;
				a3 += p * v3;
				b0 += pq * v0;
				b1 += pq * v1;
				b2 += pq * v2;
				b3 += pq * v3;
			}
			st2(accb + x, b0);
			st2(accb + x + 2, b1);
			st2(accb + x + 4, b2);
			st2(accb + x + 6, b3);
		} else {
			for (int64_t j = 0; j < jn; j++) {
				const double *vr = vd + j * D + x;
				v2d p = splat2(pa[j]);
				a0 += p * ld2(vr);
				a1 += p * ld2(vr + 2);
				a2 += p * ld2(vr + 4);
				a3 += p * ld2(vr + 6);
			}
		}
		st2(acca + x, a0);
		st2(acca + x + 2, a1);
		st2(acca + x + 4, a2);
		st2(acca + x + 6, a3);
	}
}

/* The keys [*a, *e) of chunk [j0, j0 + cn) that row r sees, relative to j0 (a == e: none). */
static inline void ref_chunk_span(const struct ref_ctx *c, int64_t r, int64_t j0, int64_t cn,
                                  int64_t *a, int64_t *e)
{
	int64_t lo = c->lo[r] - j0, hi = c->hi[r] - j0;
	lo = lo < 0 ? 0 : lo;
	hi = hi > cn ? cn : hi;
	*a = lo;
	*e = hi > lo ? hi : lo;
}

/* Two rows' spans [aa, ea) and [ab, eb) in a chunk: do they share keys, [*cs, *ce)? Then each row
 * does its own keys before cs, the pair does [cs, ce), each row its keys after ce: every row
 * still goes through its keys in increasing order (the P V sums depend on that). */
static inline bool ref_common(int64_t aa, int64_t ea, int64_t ab, int64_t eb, int64_t *cs,
                              int64_t *ce)
{
	*cs = aa > ab ? aa : ab;
	*ce = ea < eb ? ea : eb;
	return *ce > *cs;
}

/* Logit softcapping of scores [0, n) of one row, when the descriptor asks for it. */
static inline void ref_softcap(double *s, int64_t n, double cap)
{
	for (int64_t j = 0; j < n; j++)
		s[j] = cap * tanh(s[j] / cap);
}

/* Scaled (and capped) scores of the block's nr rows against the chunk [j0, j0 + cn) held in kd,
 * into s; only visible keys are computed. Rows go in pairs over the keys both see, then each
 * row's own. */
static void ref_scores(struct ref_ctx *c, int64_t nr, int64_t j0, int64_t cn)
{
	int64_t D = c->d->D, kc = c->kc;
	double scale = c->d->scale, cap = c->d->softcap;
	for (int64_t r = 0; r < nr; r += 2) {
		const double *qa = c->qd + r * D;
		double *sa = c->s + r * kc;
		int64_t aa, ea;
		ref_chunk_span(c, r, j0, cn, &aa, &ea);
		if (r + 1 == nr) {
			ref_qk_rows(qa, NULL, c->kd + aa * D, D, ea - aa, scale, sa + aa, NULL);
			if (cap > 0)
				ref_softcap(sa + aa, ea - aa, cap);
			break;
		}
		const double *qb = qa + D;
		double *sb = sa + kc;
		int64_t ab, eb, cs, ce;
		ref_chunk_span(c, r + 1, j0, cn, &ab, &eb);
		if (ref_common(aa, ea, ab, eb, &cs, &ce)) {
			ref_qk_rows(qa, NULL, c->kd + aa * D, D, cs - aa, scale, sa + aa, NULL);
			ref_qk_rows(qb, NULL, c->kd + ab * D, D, cs - ab, scale, sb + ab, NULL);
			ref_qk_rows(qa, qb, c->kd + cs * D, D, ce - cs, scale, sa + cs, sb + cs);
			ref_qk_rows(qa, NULL, c->kd + ce * D, D, ea - ce, scale, sa + ce, NULL);
			ref_qk_rows(qb, NULL, c->kd + ce * D, D, eb - ce, scale, sb + ce, NULL);
		} else {
			ref_qk_rows(qa, NULL, c->kd + aa * D, D, ea - aa, scale, sa + aa, NULL);
			ref_qk_rows(qb, NULL, c->kd + ab * D, D, eb - ab, scale, sb + ab, NULL);
		}
		if (cap > 0) {
			ref_softcap(sa + aa, ea - aa, cap);
			ref_softcap(sb + ab, eb - ab, cap);
		}
	}
}

/* acc += P V for the block's nr rows over the chunk [j0, j0 + cn), probabilities in s; each row
 * in increasing key order (ref_common). */
static void ref_pv(struct ref_ctx *c, int64_t nr, int64_t j0, int64_t cn)
{
	int64_t D = c->d->D, kc = c->kc;
	for (int64_t r = 0; r < nr; r += 2) {
		double *aa = c->acc + r * D;
		const double *pa = c->s + r * kc;
		int64_t a0, ea;
		ref_chunk_span(c, r, j0, cn, &a0, &ea);
		if (r + 1 == nr) {
			ref_pv_rows(aa, NULL, pa + a0, NULL, c->vd + a0 * D, D, ea - a0);
			break;
		}
		double *ab = aa + D;
		const double *pb = pa + kc;
		int64_t b0, eb, cs, ce;
		ref_chunk_span(c, r + 1, j0, cn, &b0, &eb);
		if (ref_common(a0, ea, b0, eb, &cs, &ce)) {
			/* heads, the shared keys as a pair, tails */
			ref_pv_rows(aa, NULL, pa + a0, NULL, c->vd + a0 * D, D, cs - a0);
			ref_pv_rows(ab, NULL, pb + b0, NULL, c->vd + b0 * D, D, cs - b0);
			ref_pv_rows(aa, ab, pa + cs, pb + cs, c->vd + cs * D, D, ce - cs);
			ref_pv_rows(aa, NULL, pa + ce, NULL, c->vd + ce * D, D, ea - ce);
			ref_pv_rows(ab, NULL, pb + ce, NULL, c->vd + ce * D, D, eb - ce);
		} else {
			ref_pv_rows(aa, NULL, pa + a0, NULL, c->vd + a0 * D, D, ea - a0);
			ref_pv_rows(ab, NULL, pb + b0, NULL, c->vd + b0 * D, D, eb - b0);
		}
	}
}

/* One block of query rows [i0, i0 + nr) of head h (kv head kvh) of batch b. */
static void ref_block(struct ref_ctx *c, int64_t b, int64_t h, int64_t kvh, int64_t i0, int64_t nr)
{
	const struct fa_attn_fwd_desc *d = c->d;
	int64_t D = d->D, kc = c->kc, jlo = INT64_MAX, jhi = 0;

	for (int64_t r = 0; r < nr; r++) {
		int64_t qo = d->q_stride[0] * b + d->q_stride[1] * (i0 + r) + d->q_stride[2] * h;
		ref_load_row(c->q, d->dtype, qo, D, c->qd + r * D);
		fa_attn_key_range(d, d->Sq, d->Sk, i0 + r, &c->lo[r], &c->hi[r]);
		c->m[r] = -INFINITY;
		c->l[r] = 0;
		if (c->hi[r] > c->lo[r]) {
			jlo = c->lo[r] < jlo ? c->lo[r] : jlo;
			jhi = c->hi[r] > jhi ? c->hi[r] : jhi;
		}
	}
	memset(c->acc, 0, (size_t)(nr * D) * sizeof(double));
	/* The chunks: the one of every visible key, converted per (b, kv-head); or the block's
	 * keys [jlo, jhi) kc at a time. */
	int64_t first = c->one_chunk ? c->k0 : jlo, step = c->one_chunk ? c->nvis : kc;
	if (jhi <= jlo)
		jhi = jlo = first; /* every row masked: no chunk */

	/* pass 1: the row max */
	for (int64_t j0 = first; j0 < jhi; j0 += step) {
		int64_t cn = c->one_chunk ? c->nvis : (jhi - j0 < kc ? jhi - j0 : kc);
		if (!c->one_chunk)
			ref_load_kv(c, b, kvh, j0, cn, false);
		ref_scores(c, nr, j0, cn);
		for (int64_t r = 0; r < nr; r++) {
			const double *sr = c->s + r * kc;
			int64_t a, e;
			ref_chunk_span(c, r, j0, cn, &a, &e);
			double mx = c->m[r];
			for (int64_t j = a; j < e; j++)
				mx = sr[j] > mx ? sr[j] : mx;
			c->m[r] = mx;
		}
	}
	/* pass 2: probabilities, their sum, and P V */
	for (int64_t j0 = first; j0 < jhi; j0 += step) {
		int64_t cn = c->one_chunk ? c->nvis : (jhi - j0 < kc ? jhi - j0 : kc);
		if (!c->one_chunk) {
			ref_load_kv(c, b, kvh, j0, cn, true);
			ref_scores(c, nr, j0, cn);
		}
		for (int64_t r = 0; r < nr; r++) {
			double *sr = c->s + r * kc;
			int64_t a, e;
			ref_chunk_span(c, r, j0, cn, &a, &e);
			double mx = c->m[r], sum = c->l[r];
			for (int64_t j = a; j < e; j++) {
				double p = exp(sr[j] - mx);
				sr[j] = p;
				sum += p;
			}
			c->l[r] = sum;
		}
		ref_pv(c, nr, j0, cn);
	}

	/* epilogue: normalise and store */
	const struct ref_out *out = c->out;
	for (int64_t r = 0; r < nr; r++) {
		int64_t i = i0 + r;
		double *ar = c->acc + r * D;
		bool empty = c->hi[r] <= c->lo[r];
		double lse = empty ? -INFINITY : c->m[r] + log(c->l[r]);
		for (int64_t x = 0; x < D; x++)
			ar[x] = empty ? 0.0 : ar[x] / c->l[r];
		if (out->o64 != NULL) {
			memcpy(out->o64 + ((b * d->Sq + i) * d->Hq + h) * D, ar, (size_t)D * sizeof(double));
			if (out->lse64 != NULL)
				out->lse64[out->lse64_stride[0] * b + out->lse64_stride[1] * h +
				           out->lse64_stride[2] * i] = lse;
		} else {
			int64_t oo = d->o_stride[0] * b + d->o_stride[1] * i + d->o_stride[2] * h;
			for (int64_t x = 0; x < D; x++)
				fa_store_elem(out->o, d->dtype, oo + x, ar[x]);
			if (out->lse != NULL)
				out->lse[d->lse_stride[0] * b + d->lse_stride[1] * h + d->lse_stride[2] * i] =
					(float)lse;
		}
	}
}

/* Choose Br and the key chunk within the scratch limit, and allocate. Words are 8 bytes (double
 * or int64). Returns FA_ENOMEM if even one key does not fit or malloc fails. */
static fa_status ref_scratch_alloc(struct ref_ctx *c, void **mem)
{
	const struct fa_attn_fwd_desc *d = c->d;
	size_t D = (size_t)d->D;
	size_t br = ref_block_rows(D, d->Sq); /* Q block + accumulators ~32 KiB: an L1's worth */
	size_t fixed = 2 * br * D + 4 * br; /* qd, acc, m, l, lo, hi */
	size_t per_key = 2 * D + br;        /* kd, vd rows and a column of s */
	size_t kc;

	double *w;
	fa_status st = ref_chunk_alloc(fixed, per_key, (size_t)c->nvis, &w, &kc, &c->one_chunk);

	*mem = NULL;
	if (st != FA_OK)
		return st;
	*mem = w;
	c->br = (int64_t)br;
	c->kc = (int64_t)kc;
	c->kd = w;
	c->vd = c->kd + kc * D;
	c->s = c->vd + kc * D;
	c->qd = c->s + br * kc;
	c->acc = c->qd + br * D;
	c->m = c->acc + br * D;
	c->l = c->m + br;
	c->lo = (int64_t *)(void *)(c->l + br); /* malloc'd memory has no declared type */
	c->hi = c->lo + br;
	return FA_OK;
}

/* The shared driver of every CPU forward: fa_attn_fwd_ref, fa_attn_fwd_ref64 and, per
 * sequence, attn_infer_ref.c's; see attn_ref_int.h. */
fa_status ref_fwd_run(const struct fa_attn_fwd_desc *d, const void *q, const void *k,
                      const void *v, const struct ref_out *out, const struct ref_pages *pg,
                      int64_t bh_begin, int64_t bh_end)
{
	struct ref_ctx c = {.d = d, .q = q, .k = k, .v = v, .out = out, .pg = pg};
	void *mem;
	fa_status st;

	if (d == NULL || q == NULL || k == NULL || v == NULL)
		return FA_EINVAL;
	if ((st = fa_attn_fwd_check(d, NULL, 0)) != FA_OK)
		return st;
	int64_t nbh;
	if (__builtin_mul_overflow(d->B, d->Hq, &nbh) || bh_begin < 0 || bh_end < bh_begin ||
	    bh_end > nbh)
		return FA_EINVAL;
	if (bh_begin == bh_end)
		return FA_OK;
	/* The keys any row sees: both ends of the rows' ranges grow with the row. */
	int64_t klo, khi, lo1, hi1;
	fa_attn_key_range(d, d->Sq, d->Sk, 0, &klo, &khi);
	fa_attn_key_range(d, d->Sq, d->Sk, d->Sq - 1, &lo1, &hi1);
	khi = hi1 > khi ? hi1 : khi;
	c.k0 = klo < khi ? klo : 0;
	c.nvis = khi - c.k0;
	if ((st = ref_scratch_alloc(&c, &mem)) != FA_OK)
		return st;

	int64_t Hq = d->Hq, G = d->Hq / d->Hkv;
	for (int64_t b = bh_begin / Hq; b <= (bh_end - 1) / Hq; b++) {
		int64_t hlo = bh_begin - b * Hq > 0 ? bh_begin - b * Hq : 0;
		int64_t hhi = bh_end - b * Hq < Hq ? bh_end - b * Hq : Hq;
		for (int64_t kvh = hlo / G; kvh <= (hhi - 1) / G; kvh++) {
			int64_t h0 = kvh * G > hlo ? kvh * G : hlo;
			int64_t h1 = (kvh + 1) * G < hhi ? (kvh + 1) * G : hhi;
			if (c.one_chunk)
				ref_load_kv(&c, b, kvh, c.k0, c.nvis, true);
			for (int64_t h = h0; h < h1; h++)
				for (int64_t i0 = 0; i0 < d->Sq; i0 += c.br)
					ref_block(&c, b, h, kvh, i0,
					          d->Sq - i0 < c.br ? d->Sq - i0 : c.br);
		}
	}
	free(mem);
	return FA_OK;
}

/* The CPU reference: O in dtype, lse in fp32, for bh in [bh_begin, bh_end). See fa_attn.h. */
fa_status fa_attn_fwd_ref(const struct fa_attn_fwd_desc *d, const void *q, const void *k,
                          const void *v, void *o, float *lse, int64_t bh_begin, int64_t bh_end)
{
	struct ref_out out = {.o = o, .lse = lse};
	if (o == NULL)
		return FA_EINVAL;
	return ref_fwd_run(d, q, k, v, &out, NULL, bh_begin, bh_end);
}

/* The float64 oracle, dense outputs, all of B*Hq. See fa_attn.h. */
fa_status fa_attn_fwd_ref64(const struct fa_attn_fwd_desc *d, const void *q, const void *k,
                            const void *v, double *o64, double *lse64)
{
	struct ref_out out = {.o64 = o64, .lse64 = lse64};
	fa_status st;
	if (d == NULL || o64 == NULL)
		return FA_EINVAL;
	if ((st = fa_attn_fwd_check(d, NULL, 0)) != FA_OK)
		return st; /* B*Hq below cannot overflow once this passed */
	out.lse64_stride[0] = d->Hq * d->Sq; /* dense [B, Hq, Sq] */
	out.lse64_stride[1] = d->Sq;
	out.lse64_stride[2] = 1;
	return ref_fwd_run(d, q, k, v, &out, NULL, 0, d->B * d->Hq);
}

/* ||x - ref|| / ||ref|| over every element of O; see fa_attn.h for the +inf cases. */
double fa_attn_fwd_rel_error(const struct fa_attn_fwd_desc *d, const void *o, const double *o64)
{
	double num = 0, den = 0;

	if (d == NULL || o == NULL || o64 == NULL || fa_attn_fwd_check(d, NULL, 0) != FA_OK)
		return INFINITY;
	const double *ref = o64;
	for (int64_t b = 0; b < d->B; b++)
		for (int64_t i = 0; i < d->Sq; i++)
			for (int64_t h = 0; h < d->Hq; h++) {
				int64_t oo = d->o_stride[0] * b + d->o_stride[1] * i + d->o_stride[2] * h;
				for (int64_t x = 0; x < d->D; x++, ref++) {
					double xv = fa_load_elem(o, d->dtype, oo + x);
					if (!isfinite(xv) || !isfinite(*ref))
						return INFINITY;
					num += (xv - *ref) * (xv - *ref);
					den += *ref * *ref;
				}
			}
	if (den == 0)
		return num == 0 ? 0.0 : INFINITY;
	return sqrt(num / den);
}
