/* attn_bwd_ref.c - the CPU reference of attention's backward pass, in float64.
 *
 * The oracle the GPU backward is checked against and the engine of the daemon's CPU backend. It
 * computes what the GPU kernels compute, in the same shape: P is recomputed from Q, K and the
 * forward's lse (not from a stored softmax), delta = rowsum(dO * O) comes first, and the work is
 * owned per (batch, kv head), the unit that owns a dK/dV slice, so dK and dV of a GQA group are
 * summed without sharing memory between threads.
 *   - One pass when K, V, dK and dV of a (batch, kv head) fit the scratch limit: every query row of
 *     the group runs over the visible keys once, updating dK, dV and its own dQ.
 *   - Past the limit, keys go in chunks: a pass over the chunks for dK and dV (query rows inner),
 *     then a pass over query-row blocks for dQ (chunks inner, K and V converted again per block).
 * Each output is summed in one order in both schemes (dQ_i over keys ascending; dK_j, dV_j over
 * query heads, then rows, ascending), and dS is computed by the same code, so the scheme, the block
 * size and the bkv split never change a bit of the result.
 * The sliding window and softcap as the forward's (fa_attn.h): a row sees the keys [lo, hi) of
 * fa_attn_key_range, and with softcap c the score s = scale q.k becomes c tanh(s / c), so
 * dS = P (dP - delta) (1 - tanh^2(s / c)) is the gradient of the raw score (then scale times
 * K or Q, as without it).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attn_ref_int.h"
#include "fa_attn.h"
#include "fa_attn_bwd.h"

/* Where O and lse come from and where the gradients go: the descriptor's dtype and strides, or
 * dense float64 (fa_attn_bwd_ref64). */
struct bwd_io {
	const void *o;
	const float *lse;
	void *dq, *dk, *dv;
	const double *o64, *lse64;
	double *dq64, *dk64, *dv64;
};

/* Everything one call needs, so helpers take one pointer. */
struct bwd_ctx {
	const struct fa_attn_bwd_desc *d;
	const void *q, *k, *v, *dout;
	const struct bwd_io *io;
	int64_t br;        /* query rows per block */
	int64_t kc;        /* keys per chunk */
	bool one_chunk;    /* K, V, dK, dV of a whole (b, kv head) fit: one pass */
	int64_t nvis;      /* keys any row can see lie in [0, nvis) */
	/* scratch, all float64 except n */
	double *kd, *vd;   /* [kc][D] the chunk's K and V */
	double *dkd, *dvd; /* [kc][D] their gradients, unscaled dK */
	double *qd, *dod;  /* [br][D] the block's Q and dO rows */
	double *dqd;       /* [br][D] unscaled dQ; O while delta is computed */
	double *delta;     /* [br] */
	double *lse;       /* [br] */
	int64_t *n;        /* [br] the end of each row's keys [lo, n); 0 for a row that contributes
	                    * nothing */
	int64_t *lo;       /* [br] the first key each row sees */
};

/* Two accumulators in a fixed order (even and odd x, then their sum): the order is part of the
 * result, so every dot product of the file goes through here. */
static inline double bwd_dot(const double *a, const double *b, int64_t D)
{
	double s0 = 0, s1 = 0;
	for (int64_t x = 0; x < D; x += 2) {
		s0 += a[x] * b[x];
		s1 += a[x + 1] * b[x + 1];
	}
	return s0 + s1;
}

/* acc += w * a over D elements. */
static inline void bwd_axpy(double *restrict acc, double w, const double *restrict a, int64_t D)
{
	for (int64_t x = 0; x < D; x++)
		acc[x] += w * a[x];
}

/* Convert keys [j0, j0 + cn) of (b, kvh) from K and V into kd / vd. */
static void bwd_load_kv(struct bwd_ctx *c, int64_t b, int64_t kvh, int64_t j0, int64_t cn)
{
	const struct fa_attn_fwd_desc *f = &c->d->fwd;
	int64_t D = f->D;
	for (int64_t j = 0; j < cn; j++) {
		int64_t ko = f->k_stride[0] * b + f->k_stride[1] * (j0 + j) + f->k_stride[2] * kvh;
		int64_t vo = f->v_stride[0] * b + f->v_stride[1] * (j0 + j) + f->v_stride[2] * kvh;
		ref_load_row(c->k, f->dtype, ko, D, c->kd + j * D);
		ref_load_row(c->v, f->dtype, vo, D, c->vd + j * D);
	}
}

/* Load query rows [i0, i0 + nr) of head h of batch b: Q, dO, lse, the visible keys and delta. A
 * row that sees no key or whose lse is -inf gets n = 0: it contributes nothing, and its O (which
 * the forward set to 0) is not read. */
static void bwd_load_rows(struct bwd_ctx *c, int64_t b, int64_t h, int64_t i0, int64_t nr)
{
	const struct fa_attn_bwd_desc *d = c->d;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	const struct bwd_io *io = c->io;
	int64_t D = f->D;

	for (int64_t r = 0; r < nr; r++) {
		int64_t i = i0 + r;
		double *qr = c->qd + r * D, *dor = c->dod + r * D, *orow = c->dqd + r * D;
		if (io->lse64 != NULL)
			c->lse[r] = io->lse64[(b * f->Hq + h) * f->Sq + i];
		else
			c->lse[r] = io->lse[f->lse_stride[0] * b + f->lse_stride[1] * h +
			                    f->lse_stride[2] * i];
		fa_attn_key_range(f, f->Sq, f->Sk, i, &c->lo[r], &c->n[r]);
		if (c->lo[r] == c->n[r])
			c->n[r] = 0;
		c->delta[r] = 0;
		if (c->lse[r] == -INFINITY)
			c->n[r] = 0;
		if (c->n[r] == 0)
			continue;
		ref_load_row(c->q, f->dtype, f->q_stride[0] * b + f->q_stride[1] * i + f->q_stride[2] * h,
		             D, qr);
		ref_load_row(c->dout, f->dtype,
		             d->do_stride[0] * b + d->do_stride[1] * i + d->do_stride[2] * h, D, dor);
		if (io->o64 != NULL)
			memcpy(orow, io->o64 + ((b * f->Sq + i) * f->Hq + h) * D, (size_t)D * sizeof(double));
		else
			ref_load_row(io->o, f->dtype,
			             f->o_stride[0] * b + f->o_stride[1] * i + f->o_stride[2] * h, D, orow);
		c->delta[r] = bwd_dot(dor, orow, D);
	}
	memset(c->dqd, 0, (size_t)(nr * D) * sizeof(double));
}

/* The block's nr rows against the chunk [j0, j0 + cn) held in kd / vd: dS of every visible
 * (row, key) pair, added to dK and dV (want_dkdv) and to the rows' dQ (want_dq). */
static void bwd_rows(struct bwd_ctx *c, int64_t nr, int64_t j0, int64_t cn, bool want_dq,
                     bool want_dkdv)
{
	int64_t D = c->d->fwd.D;
	double scale = c->d->fwd.scale, cap = c->d->fwd.softcap;
	for (int64_t r = 0; r < nr; r++) {
		int64_t vis = c->n[r] - j0, first = c->lo[r] - j0;
		if (vis <= 0)
			continue;
		if (vis > cn)
			vis = cn;
		if (first < 0)
			first = 0;
		const double *qr = c->qd + r * D, *dor = c->dod + r * D;
		double *dqr = c->dqd + r * D;
		double lse = c->lse[r], delta = c->delta[r];
		for (int64_t j = first; j < vis; j++) {
			const double *kj = c->kd + j * D, *vj = c->vd + j * D;
			double sc = scale * bwd_dot(qr, kj, D), t = 0;
			if (cap > 0) {
				t = tanh(sc / cap);
				sc = cap * t;
			}
			double p = exp(sc - lse);
			double ds = p * (bwd_dot(dor, vj, D) - delta);
			if (cap > 0)
				ds *= 1.0 - t * t;
			if (want_dkdv) {
				bwd_axpy(c->dvd + j * D, p, dor, D);
				bwd_axpy(c->dkd + j * D, ds, qr, D);
			}
			if (want_dq)
				bwd_axpy(dqr, ds, kj, D);
		}
	}
}

/* Store one gradient row: src * mul (src NULL: zeros) into the dtype output at element offset
 * off, or into the dense float64 output at out64 (when not NULL). */
static void bwd_store_row(void *out, fa_dtype dt, int64_t off, double *out64, const double *src,
                          double mul, int64_t D)
{
	for (int64_t x = 0; x < D; x++) {
		double g = src != NULL ? src[x] * mul : 0.0;
		if (out64 != NULL)
			out64[x] = g;
		else
			fa_store_elem(out, dt, off + x, g);
	}
}

/* Store dQ of the block's rows [i0, i0 + nr) of head h of batch b. */
static void bwd_store_dq(struct bwd_ctx *c, int64_t b, int64_t h, int64_t i0, int64_t nr)
{
	const struct fa_attn_bwd_desc *d = c->d;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	int64_t D = f->D;
	for (int64_t r = 0; r < nr; r++) {
		int64_t i = i0 + r;
		double *o64 = c->io->dq64 != NULL ? c->io->dq64 + ((b * f->Sq + i) * f->Hq + h) * D : NULL;
		int64_t off = d->dq_stride[0] * b + d->dq_stride[1] * i + d->dq_stride[2] * h;
		bwd_store_row(c->io->dq, f->dtype, off, o64, c->n[r] > 0 ? c->dqd + r * D : NULL,
		              f->scale, D);
	}
}

/* Store dK and dV of keys [j0, j0 + cn) of (b, kvh), or zeros (keys no row sees). */
static void bwd_store_dkdv(struct bwd_ctx *c, int64_t b, int64_t kvh, int64_t j0, int64_t cn,
                           bool zeros)
{
	const struct fa_attn_bwd_desc *d = c->d;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	const struct bwd_io *io = c->io;
	int64_t D = f->D;
	for (int64_t j = 0; j < cn; j++) {
		int64_t jj = j0 + j, dense = ((b * f->Sk + jj) * f->Hkv + kvh) * D;
		int64_t ko = d->dk_stride[0] * b + d->dk_stride[1] * jj + d->dk_stride[2] * kvh;
		int64_t vo = d->dv_stride[0] * b + d->dv_stride[1] * jj + d->dv_stride[2] * kvh;
		bwd_store_row(io->dk, f->dtype, ko, io->dk64 != NULL ? io->dk64 + dense : NULL,
		              zeros ? NULL : c->dkd + j * D, f->scale, D);
		bwd_store_row(io->dv, f->dtype, vo, io->dv64 != NULL ? io->dv64 + dense : NULL,
		              zeros ? NULL : c->dvd + j * D, 1.0, D);
	}
}

/* Choose Br and the key chunk within the scratch limit, and allocate. Words are 8 bytes (double
 * or int64). Returns FA_ENOMEM if even one key does not fit or malloc fails. */
static fa_status bwd_scratch_alloc(struct bwd_ctx *c, void **mem)
{
	const struct fa_attn_fwd_desc *f = &c->d->fwd;
	size_t D = (size_t)f->D;
	/* Q, dO and dQ of a block within an L1's worth or two */
	size_t br = ref_block_rows(D, f->Sq);
	size_t fixed = 3 * br * D + 4 * br; /* qd, dod, dqd, delta, lse, n, lo */
	size_t per_key = 4 * D;             /* kd, vd, dkd, dvd rows */
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
	c->dkd = c->vd + kc * D;
	c->dvd = c->dkd + kc * D;
	c->qd = c->dvd + kc * D;
	c->dod = c->qd + br * D;
	c->dqd = c->dod + br * D;
	c->delta = c->dqd + br * D;
	c->lse = c->delta + br;
	c->n = (int64_t *)(void *)(c->lse + br); /* malloc'd memory has no declared type */
	c->lo = c->n + br;
	return FA_OK;
}

/* Every gradient of one (batch, kv head): dK, dV of its keys and dQ of its query heads. */
static void bwd_pair(struct bwd_ctx *c, int64_t b, int64_t kvh)
{
	const struct fa_attn_fwd_desc *f = &c->d->fwd;
	int64_t D = f->D, G = f->Hq / f->Hkv, br = c->br, kc = c->kc, nvis = c->nvis;

	if (c->one_chunk) {
		bwd_load_kv(c, b, kvh, 0, nvis);
		memset(c->dkd, 0, (size_t)(2 * kc * D) * sizeof(double)); /* dkd and dvd */
		for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
			for (int64_t i0 = 0; i0 < f->Sq; i0 += br) {
				int64_t nr = f->Sq - i0 < br ? f->Sq - i0 : br;
				bwd_load_rows(c, b, h, i0, nr);
				bwd_rows(c, nr, 0, nvis, true, true);
				bwd_store_dq(c, b, h, i0, nr);
			}
		bwd_store_dkdv(c, b, kvh, 0, nvis, false);
	} else {
		for (int64_t j0 = 0; j0 < nvis; j0 += kc) {
			int64_t cn = nvis - j0 < kc ? nvis - j0 : kc;
			bwd_load_kv(c, b, kvh, j0, cn);
			memset(c->dkd, 0, (size_t)(2 * kc * D) * sizeof(double));
			for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
				for (int64_t i0 = 0; i0 < f->Sq; i0 += br) {
					int64_t nr = f->Sq - i0 < br ? f->Sq - i0 : br;
					bwd_load_rows(c, b, h, i0, nr);
					bwd_rows(c, nr, j0, cn, false, true);
				}
			bwd_store_dkdv(c, b, kvh, j0, cn, false);
		}
		for (int64_t h = kvh * G; h < (kvh + 1) * G; h++)
			for (int64_t i0 = 0; i0 < f->Sq; i0 += br) {
				int64_t nr = f->Sq - i0 < br ? f->Sq - i0 : br;
				bwd_load_rows(c, b, h, i0, nr);
				for (int64_t j0 = 0; j0 < nvis; j0 += kc) {
					int64_t cn = nvis - j0 < kc ? nvis - j0 : kc;
					bwd_load_kv(c, b, kvh, j0, cn);
					bwd_rows(c, nr, j0, cn, true, false);
				}
				bwd_store_dq(c, b, h, i0, nr);
			}
	}
	if (nvis < f->Sk)
		bwd_store_dkdv(c, b, kvh, nvis, f->Sk - nvis, true);
}

/* The shared driver of fa_attn_bwd_ref and fa_attn_bwd_ref64. */
static fa_status bwd_run(const struct fa_attn_bwd_desc *d, const void *q, const void *k,
                         const void *v, const void *dout, const struct bwd_io *io,
                         int64_t bkv_begin, int64_t bkv_end)
{
	struct bwd_ctx c = {.d = d, .q = q, .k = k, .v = v, .dout = dout, .io = io};
	void *mem;
	fa_status st;

	if (d == NULL || q == NULL || k == NULL || v == NULL || dout == NULL)
		return FA_EINVAL;
	if ((st = fa_attn_bwd_check(d, NULL, 0)) != FA_OK)
		return st;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	int64_t nbkv;
	if (__builtin_mul_overflow(f->B, f->Hkv, &nbkv) || bkv_begin < 0 || bkv_end < bkv_begin ||
	    bkv_end > nbkv)
		return FA_EINVAL;
	if (bkv_begin == bkv_end)
		return FA_OK;
	int64_t lo_last;
	/* the last row's keys end last */
	fa_attn_key_range(f, f->Sq, f->Sk, f->Sq - 1, &lo_last, &c.nvis);
	if ((st = bwd_scratch_alloc(&c, &mem)) != FA_OK)
		return st;
	for (int64_t bkv = bkv_begin; bkv < bkv_end; bkv++)
		bwd_pair(&c, bkv / f->Hkv, bkv % f->Hkv);
	free(mem);
	return FA_OK;
}

/* The CPU reference: gradients in dtype for bkv in [bkv_begin, bkv_end). See fa_attn_bwd.h. */
fa_status fa_attn_bwd_ref(const struct fa_attn_bwd_desc *d, const void *q, const void *k,
                          const void *v, const void *o, const void *dout, const float *lse,
                          void *dq, void *dk, void *dv, int64_t bkv_begin, int64_t bkv_end)
{
	struct bwd_io io = {.o = o, .lse = lse, .dq = dq, .dk = dk, .dv = dv};
	if (o == NULL || lse == NULL || dq == NULL || dk == NULL || dv == NULL)
		return FA_EINVAL;
	return bwd_run(d, q, k, v, dout, &io, bkv_begin, bkv_end);
}

/* The float64 oracle: dense O and lse in, dense gradients out, all of B*Hkv. See fa_attn_bwd.h. */
fa_status fa_attn_bwd_ref64(const struct fa_attn_bwd_desc *d, const void *q, const void *k,
                            const void *v, const double *o64, const void *dout,
                            const double *lse64, double *dq64, double *dk64, double *dv64)
{
	struct bwd_io io = {.o64 = o64, .lse64 = lse64, .dq64 = dq64, .dk64 = dk64, .dv64 = dv64};
	fa_status st;
	if (d == NULL || o64 == NULL || lse64 == NULL || dq64 == NULL || dk64 == NULL ||
	    dv64 == NULL)
		return FA_EINVAL;
	if ((st = fa_attn_bwd_check(d, NULL, 0)) != FA_OK)
		return st; /* B*Hkv below cannot overflow once this passed */
	return bwd_run(d, q, k, v, dout, &io, 0, d->fwd.B * d->fwd.Hkv);
}
