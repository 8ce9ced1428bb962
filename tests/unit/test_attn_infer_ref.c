/* test_attn_infer_ref.c - the inference shapes of the CPU reference against problems known to be
 * equal: the sliding window against its literal formula and (-1, 0) against causal, softcap
 * against cap * tanh(s / cap) written out, a varlen batch against each sequence as its own dense
 * problem, a paged cache against the same keys gathered into a contiguous cache and into dense
 * problems; and the descriptor checks, which must name the bad index entry.
 *
 * Lengths are the odd ones (1, 17, 127, 129, empty), batches ragged, pages partly filled and out
 * of order. Per sequence the inference reference runs the dense reference's arithmetic, so those
 * comparisons are exact (bit for bit); the literal formulas agree to 1e-12.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_attn.h"
#include "fa_attn_infer.h"

/* ---- data ------------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static double rnd(void)
{
	rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
	return (double)(rng_state >> 11) / (double)(UINT64_C(1) << 53) * 2.0 - 1.0;
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);
	assert_non_null(p);
	return p;
}

/* n fp32 values in [-amp, amp]. */
static float *rnd_f32(size_t n, double amp)
{
	float *p = xcalloc(n, sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(amp * rnd());
	return p;
}

/* A dense fp32 BSHD forward descriptor. */
static struct fa_attn_fwd_desc dense_desc(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq,
                                          int64_t Hkv, int64_t D, fa_mask mask)
{
	struct fa_attn_fwd_desc d = {
		.dtype = FA_DTYPE_FP32,
		.precision = FA_PREC_IEEE,
		.mask = mask,
		.scale = 1.0 / sqrt((double)D),
		.B = B, .Sq = Sq, .Sk = Sk, .Hq = Hq, .Hkv = Hkv, .D = D,
		.q_stride = {Sq * Hq * D, Hq * D, D},
		.k_stride = {Sk * Hkv * D, Hkv * D, D},
		.v_stride = {Sk * Hkv * D, Hkv * D, D},
		.o_stride = {Sq * Hq * D, Hq * D, D},
		.lse_stride = {Hq * Sq, Sq, 1},
	};
	return d;
}

/* The forward written out: long double, per element, the window as FlashAttention documents it
 * (keys [i + Sk - Sq - left, i + Sk - Sq + right], -1 unbounded; top-left shifts by 0), causal
 * as j <= diagonal, softcap as cap * tanh(s / cap) before the mask. o64 dense, lse64 [B,Hq,Sq]. */
static void naive(const struct fa_attn_fwd_desc *d, const float *q, const float *k,
                  const float *v, double *o64, double *lse64)
{
	int64_t G = d->Hq / d->Hkv, D = d->D;
	long double *s = xcalloc((size_t)d->Sk, sizeof(long double));
	for (int64_t b = 0; b < d->B; b++)
		for (int64_t h = 0; h < d->Hq; h++)
			for (int64_t i = 0; i < d->Sq; i++) {
				int64_t diag = i + (d->mask == FA_MASK_CAUSAL_TOP_LEFT ? 0 : d->Sk - d->Sq);
				long double mx = -INFINITY, sum = 0;
				for (int64_t j = 0; j < d->Sk; j++) {
					bool ok = true;
					if (d->mask != FA_MASK_NONE && j > diag)
						ok = false;
					if (d->window && d->window_left >= 0 && j < diag - d->window_left)
						ok = false;
					if (d->window && d->window_right >= 0 && j > diag + d->window_right)
						ok = false;
					if (!ok) {
						s[j] = -INFINITY;
						continue;
					}
					long double dot = 0;
					for (int64_t x = 0; x < D; x++)
						dot += (long double)q[d->q_stride[0] * b + d->q_stride[1] * i +
						                      d->q_stride[2] * h + x] *
						       k[d->k_stride[0] * b + d->k_stride[1] * j +
						         d->k_stride[2] * (h / G) + x];
					dot *= d->scale;
					if (d->softcap > 0)
						dot = d->softcap * tanhl(dot / d->softcap);
					s[j] = dot;
					mx = dot > mx ? dot : mx;
				}
				for (int64_t j = 0; j < d->Sk; j++)
					if (s[j] != -INFINITY)
						sum += expl(s[j] - mx);
				double *orow = o64 + ((b * d->Sq + i) * d->Hq + h) * D;
				for (int64_t x = 0; x < D; x++) {
					long double a = 0;
					for (int64_t j = 0; j < d->Sk; j++)
						if (s[j] != -INFINITY)
							a += expl(s[j] - mx) *
							     v[d->v_stride[0] * b + d->v_stride[1] * j +
							       d->v_stride[2] * (h / G) + x];
					orow[x] = sum > 0 ? (double)(a / sum) : 0.0;
				}
				lse64[(b * d->Hq + h) * d->Sq + i] =
				    sum > 0 ? (double)(mx + logl(sum)) : -INFINITY;
			}
	free(s);
}

static double max_abs_diff(const double *a, const double *b, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++) {
		if (isinf(a[i]) || isinf(b[i])) {
			if (a[i] != b[i])
				return INFINITY;
			continue;
		}
		double e = fabs(a[i] - b[i]);
		m = e > m || isnan(e) ? e : m;
	}
	return m;
}

/* ---- window and softcap on the dense forward ----------------------------------------------- */

/* Runs d through the reference's float64 oracle and the naive formula; returns the worst gap. */
static double dense_vs_naive(const struct fa_attn_fwd_desc *d)
{
	size_t nq = (size_t)(d->B * d->Sq * d->Hq * d->D), nk = (size_t)(d->B * d->Sk * d->Hkv * d->D);
	size_t nl = (size_t)(d->B * d->Hq * d->Sq);
	float *q = rnd_f32(nq, 2.0), *k = rnd_f32(nk, 2.0), *v = rnd_f32(nk, 1.0);
	double *o = xcalloc(nq, 8), *l = xcalloc(nl, 8), *on = xcalloc(nq, 8), *ln = xcalloc(nl, 8);
	assert_int_equal(fa_attn_fwd_ref64(d, q, k, v, o, l), FA_OK);
	naive(d, q, k, v, on, ln);
	double e = max_abs_diff(o, on, nq), el = max_abs_diff(l, ln, nl);
	free(q), free(k), free(v), free(o), free(l), free(on), free(ln);
	return e > el ? e : el;
}

static void test_window_matches_its_formula_on_odd_shapes(void **state)
{
	static const struct {
		int64_t Sq, Sk, left, right;
		fa_mask mask;
	} cases[] = {
		{17, 129, 3, 5, FA_MASK_NONE},          {129, 17, 3, 5, FA_MASK_NONE},
		{127, 127, 0, 0, FA_MASK_NONE},         {17, 129, 16, -1, FA_MASK_NONE},
		{17, 129, -1, 7, FA_MASK_NONE},         {129, 127, 31, 9, FA_MASK_CAUSAL_BOTTOM_RIGHT},
		{1, 129, 16, 0, FA_MASK_CAUSAL_BOTTOM_RIGHT}, {17, 129, 4, 2, FA_MASK_CAUSAL_TOP_LEFT},
		{129, 17, 4, -1, FA_MASK_CAUSAL_TOP_LEFT}, {1, 1, 0, 0, FA_MASK_NONE},
		{17, 17, 1000, 1000, FA_MASK_NONE},     {40, 7, 2, 1, FA_MASK_NONE}, /* rows past the keys */
	};
	(void)state;
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		struct fa_attn_fwd_desc d = dense_desc(2, cases[c].Sq, cases[c].Sk, 4, 2, 16,
		                                       cases[c].mask);
		d.window = true;
		d.window_left = cases[c].left;
		d.window_right = cases[c].right;
		double e = dense_vs_naive(&d);
		if (!(e < 1e-12))
			fail_msg("case %zu (Sq %lld Sk %lld window %lld,%lld mask %d): %g", c,
			         (long long)cases[c].Sq, (long long)cases[c].Sk,
			         (long long)cases[c].left, (long long)cases[c].right,
			         (int)cases[c].mask, e);
	}
}

static void test_softcap_matches_the_direct_formula(void **state)
{
	static const double caps[] = {0.5, 5.0, 30.0, 1e9};
	(void)state;
	for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++)
		for (int m = 0; m <= 2; m++) {
			struct fa_attn_fwd_desc d = dense_desc(2, 17, 129, 4, 1, 32, (fa_mask)m);
			d.scale = 2.0; /* big scores: the cap matters */
			d.softcap = caps[c];
			double e = dense_vs_naive(&d);
			if (!(e < 1e-12))
				fail_msg("softcap %g mask %d: %g", caps[c], m, e);
		}
	/* with a window too */
	struct fa_attn_fwd_desc d = dense_desc(1, 129, 127, 2, 2, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT);
	d.softcap = 3.0;
	d.window = true;
	d.window_left = 20;
	d.window_right = -1;
	assert_true(dense_vs_naive(&d) < 1e-12);
}

/* Run two descriptors on the same data; the float64 results must be the same bits. */
static void assert_same_bits(const struct fa_attn_fwd_desc *a, const struct fa_attn_fwd_desc *b)
{
	size_t nq = (size_t)(a->B * a->Sq * a->Hq * a->D), nk = (size_t)(a->B * a->Sk * a->Hkv * a->D);
	size_t nl = (size_t)(a->B * a->Hq * a->Sq);
	float *q = rnd_f32(nq, 2.0), *k = rnd_f32(nk, 2.0), *v = rnd_f32(nk, 1.0);
	double *o1 = xcalloc(nq, 8), *l1 = xcalloc(nl, 8), *o2 = xcalloc(nq, 8), *l2 = xcalloc(nl, 8);
	assert_int_equal(fa_attn_fwd_ref64(a, q, k, v, o1, l1), FA_OK);
	assert_int_equal(fa_attn_fwd_ref64(b, q, k, v, o2, l2), FA_OK);
	assert_memory_equal(o1, o2, nq * 8);
	assert_memory_equal(l1, l2, nl * 8);
	free(q), free(k), free(v), free(o1), free(l1), free(o2), free(l2);
}

static void test_window_unbounded_left_and_zero_right_is_causal(void **state)
{
	static const int64_t shapes[][2] = {{17, 17}, {17, 129}, {129, 17}, {1, 127}, {127, 1}};
	(void)state;
	for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
		struct fa_attn_fwd_desc causal =
		    dense_desc(2, shapes[c][0], shapes[c][1], 4, 2, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT);
		struct fa_attn_fwd_desc win = causal;
		win.mask = FA_MASK_NONE;
		win.window = true;
		win.window_left = -1;
		win.window_right = 0;
		assert_same_bits(&causal, &win);
		/* and a causal mask with the window (-1, -1) is the causal mask, either alignment */
		struct fa_attn_fwd_desc both = causal;
		both.window = true;
		both.window_left = both.window_right = -1;
		assert_same_bits(&causal, &both);
		struct fa_attn_fwd_desc tl = causal, tlw;
		tl.mask = FA_MASK_CAUSAL_TOP_LEFT;
		tlw = tl;
		tlw.window = true;
		tlw.window_left = -1;
		tlw.window_right = 5; /* causal caps the right side at 0 */
		assert_same_bits(&tl, &tlw);
	}
}

static void test_key_range_is_one_range_and_agrees_with_allows(void **state)
{
	struct fa_attn_fwd_desc d = dense_desc(1, 1, 1, 1, 1, 8, FA_MASK_NONE);
	(void)state;
	for (int m = 0; m <= 2; m++)
		for (int64_t left = -1; left <= 5; left += 3)
			for (int64_t right = -1; right <= 5; right += 3) {
				d.mask = (fa_mask)m;
				d.window = true;
				d.window_left = left;
				d.window_right = right;
				for (int64_t Sq = 1; Sq <= 9; Sq += 4)
					for (int64_t Sk = 1; Sk <= 9; Sk += 4)
						for (int64_t i = 0; i < Sq; i++) {
							int64_t lo, hi;
							fa_attn_key_range(&d, Sq, Sk, i, &lo, &hi);
							assert_true(0 <= lo && lo <= hi && hi <= Sk);
							for (int64_t j = 0; j < Sk; j++)
								assert_int_equal(fa_attn_allows(&d, Sq, Sk, i, j),
								                 j >= lo && j < hi);
						}
			}
	/* huge windows do not overflow */
	d.mask = FA_MASK_NONE;
	d.window_left = INT64_MAX;
	d.window_right = INT64_MAX;
	int64_t lo, hi;
	fa_attn_key_range(&d, 5, 7, 4, &lo, &hi);
	assert_int_equal(lo, 0);
	assert_int_equal(hi, 7);
}

/* ---- varlen, cache and paged against dense problems ---------------------------------------- */

/* A batch: ragged query and key lengths, fp32 data packed BSHD; page-size for the paged copy. */
struct batch {
	int64_t B, Hq, Hkv, D;
	int64_t sq[8], sk[8];
	int32_t cu_q[9], cu_k[9];
	int64_t total_q, total_k, max_q, max_k;
	float *q, *k, *v; /* packed [total, H, D] */
};

static void batch_init(struct batch *bt, int64_t B, const int64_t *sq, const int64_t *sk,
                       int64_t Hq, int64_t Hkv, int64_t D)
{
	memset(bt, 0, sizeof(*bt));
	bt->B = B, bt->Hq = Hq, bt->Hkv = Hkv, bt->D = D;
	for (int64_t b = 0; b < B; b++) {
		bt->sq[b] = sq[b];
		bt->sk[b] = sk[b];
		bt->cu_q[b + 1] = bt->cu_q[b] + (int32_t)sq[b];
		bt->cu_k[b + 1] = bt->cu_k[b] + (int32_t)sk[b];
		bt->max_q = sq[b] > bt->max_q ? sq[b] : bt->max_q;
		bt->max_k = sk[b] > bt->max_k ? sk[b] : bt->max_k;
	}
	bt->total_q = bt->cu_q[B] > 0 ? bt->cu_q[B] : 1;
	bt->total_k = bt->cu_k[B] > 0 ? bt->cu_k[B] : 1;
	if (bt->max_q == 0)
		bt->max_q = 1;
	if (bt->max_k == 0)
		bt->max_k = 1;
	bt->q = rnd_f32((size_t)(bt->total_q * Hq * D), 2.0);
	bt->k = rnd_f32((size_t)(bt->total_k * Hkv * D), 2.0);
	bt->v = rnd_f32((size_t)(bt->total_k * Hkv * D), 1.0);
}

static void batch_free(struct batch *bt)
{
	free(bt->q), free(bt->k), free(bt->v);
}

/* The settings every comparison shares. */
struct settings {
	fa_mask mask;
	bool window;
	int64_t left, right;
	double softcap;
};

static void apply(struct fa_attn_fwd_desc *d, const struct settings *s)
{
	d->mask = s->mask;
	d->window = s->window;
	d->window_left = s->left;
	d->window_right = s->right;
	d->softcap = s->softcap;
}

/* The varlen descriptor of a batch: packed queries and keys. */
static struct fa_attn_infer_desc varlen_desc(const struct batch *bt, const struct settings *s)
{
	int64_t Hq = bt->Hq, Hkv = bt->Hkv, D = bt->D;
	struct fa_attn_infer_desc d = {
		.fwd = dense_desc(bt->B, bt->max_q, bt->max_k, Hq, Hkv, D, s->mask),
		.cu_q = bt->cu_q, .total_q = bt->total_q,
		.kv = FA_KV_PACKED, .cu_k = bt->cu_k, .total_k = bt->total_k,
	};
	int64_t qs[3] = {0, Hq * D, D}, ks[3] = {0, Hkv * D, D};
	memcpy(d.fwd.q_stride, qs, sizeof qs);
	memcpy(d.fwd.o_stride, qs, sizeof qs);
	memcpy(d.fwd.k_stride, ks, sizeof ks);
	memcpy(d.fwd.v_stride, ks, sizeof ks);
	d.fwd.lse_stride[0] = 0;
	d.fwd.lse_stride[1] = bt->total_q;
	d.fwd.lse_stride[2] = 1;
	apply(&d.fwd, s);
	return d;
}

/* Sequence b of the batch (its queries at rows cu_q[b] of the packed q) as its own dense problem
 * through fa_attn_fwd_ref64 and fa_attn_fwd_ref (fp32 out), compared bit for bit with the batch's
 * outputs: o64 and o32 point at the sequence's first row ([rows, Hq, D]), lse64 and lse32 at its
 * (head 0, row 0), head h's rows lse_hstride further. */
static void assert_seq_is_dense(const struct batch *bt, const struct settings *s, int64_t b,
                                const double *o64, const double *lse64, const float *o32,
                                const float *lse32, int64_t lse_hstride)
{
	int64_t Hq = bt->Hq, Hkv = bt->Hkv, D = bt->D, sq = bt->sq[b], sk = bt->sk[b];
	if (sq == 0)
		return;
	int64_t q0 = bt->cu_q[b];
	if (sk == 0) {
		for (int64_t i = 0; i < sq; i++)
			for (int64_t h = 0; h < Hq; h++) {
				for (int64_t x = 0; x < D; x++) {
					assert_true(o64[(i * Hq + h) * D + x] == 0.0);
					assert_true(o32[(i * Hq + h) * D + x] == 0.0f);
				}
				assert_true(isinf(lse64[h * lse_hstride + i]) &&
				            lse64[h * lse_hstride + i] < 0);
				assert_true(isinf(lse32[h * lse_hstride + i]) &&
				            lse32[h * lse_hstride + i] < 0);
			}
		return;
	}
	struct fa_attn_fwd_desc d = dense_desc(1, sq, sk, Hq, Hkv, D, s->mask);
	apply(&d, s);
	/* copies, so the dense problem owns its memory */
	float *q = xcalloc((size_t)(sq * Hq * D), 4), *k = xcalloc((size_t)(sk * Hkv * D), 4);
	float *v = xcalloc((size_t)(sk * Hkv * D), 4), *o = xcalloc((size_t)(sq * Hq * D), 4);
	float *l = xcalloc((size_t)(Hq * sq), 4);
	double *od = xcalloc((size_t)(sq * Hq * D), 8), *ld = xcalloc((size_t)(Hq * sq), 8);
	memcpy(q, bt->q + q0 * Hq * D, (size_t)(sq * Hq * D) * 4);
	memcpy(k, bt->k + bt->cu_k[b] * Hkv * D, (size_t)(sk * Hkv * D) * 4);
	memcpy(v, bt->v + bt->cu_k[b] * Hkv * D, (size_t)(sk * Hkv * D) * 4);
	assert_int_equal(fa_attn_fwd_ref64(&d, q, k, v, od, ld), FA_OK);
	assert_int_equal(fa_attn_fwd_ref(&d, q, k, v, o, l, 0, Hq), FA_OK);
	assert_memory_equal(od, o64, (size_t)(sq * Hq * D) * 8);
	assert_memory_equal(o, o32, (size_t)(sq * Hq * D) * 4);
	for (int64_t h = 0; h < Hq; h++) {
		assert_memory_equal(ld + h * sq, lse64 + h * lse_hstride, (size_t)sq * 8);
		assert_memory_equal(l + h * sq, lse32 + h * lse_hstride, (size_t)sq * 4);
	}
	free(q), free(k), free(v), free(o), free(l), free(od), free(ld);
}

static const struct settings some_settings[] = {
	{FA_MASK_NONE, false, 0, 0, 0},
	{FA_MASK_CAUSAL_BOTTOM_RIGHT, false, 0, 0, 0},
	{FA_MASK_CAUSAL_TOP_LEFT, false, 0, 0, 0},
	{FA_MASK_NONE, true, 7, 3, 0},
	{FA_MASK_CAUSAL_BOTTOM_RIGHT, true, 16, -1, 4.0},
	{FA_MASK_NONE, false, 0, 0, 2.5},
};
#define NSETTINGS (sizeof some_settings / sizeof some_settings[0])

static void test_varlen_equals_each_sequence_as_a_dense_problem(void **state)
{
	static const int64_t sq[] = {1, 17, 127, 129, 0, 3, 5};
	static const int64_t sk[] = {129, 17, 1, 127, 9, 0, 5};
	(void)state;
	for (size_t c = 0; c < NSETTINGS; c++) {
		struct batch bt;
		batch_init(&bt, 7, sq, sk, 4, 2, 16);
		struct fa_attn_infer_desc d = varlen_desc(&bt, &some_settings[c]);
		char err[256];
		assert_int_equal(fa_attn_infer_check(&d, err, sizeof err), FA_OK);
		size_t no = (size_t)(bt.total_q * bt.Hq * bt.D), nl = (size_t)(bt.Hq * bt.total_q);
		double *o64 = xcalloc(no, 8), *l64 = xcalloc(nl, 8);
		float *o32 = xcalloc(no, 4), *l32 = xcalloc(nl, 4);
		assert_int_equal(fa_attn_infer_ref64(&d, bt.q, bt.k, bt.v, o64, l64), FA_OK);
		/* in three pieces of (sequence, head) units: the split changes nothing */
		int64_t nu = bt.B * bt.Hq;
		assert_int_equal(fa_attn_infer_ref(&d, bt.q, bt.k, bt.v, o32, l32, 0, 5), FA_OK);
		assert_int_equal(fa_attn_infer_ref(&d, bt.q, bt.k, bt.v, o32, l32, 5, 13), FA_OK);
		assert_int_equal(fa_attn_infer_ref(&d, bt.q, bt.k, bt.v, o32, l32, 13, nu), FA_OK);
		for (int64_t b = 0; b < bt.B; b++) {
			int64_t r = bt.cu_q[b];
			assert_seq_is_dense(&bt, &some_settings[c], b, o64 + r * bt.Hq * bt.D, l64 + r,
			                    o32 + r * bt.Hq * bt.D, l32 + r, bt.total_q);
		}
		free(o64), free(l64), free(o32), free(l32);
		batch_free(&bt);
	}
}

/* The batch's keys in a paged pool: pages of page_size, handed out in a shuffled order with
 * spare pages between, the last page of a sequence partly filled. */
struct paged {
	int64_t page_size, pages, cols;
	int32_t *table; /* [B][cols], padding entries -7 (never read) */
	int32_t seqlens[8];
	float *k, *v;   /* [pages, page_size, Hkv, D] */
};

static void paged_init(struct paged *pg, const struct batch *bt, int64_t page_size)
{
	int64_t Hkv = bt->Hkv, D = bt->D, used = 0;
	memset(pg, 0, sizeof(*pg));
	pg->page_size = page_size;
	for (int64_t b = 0; b < bt->B; b++) {
		int64_t n = (bt->sk[b] + page_size - 1) / page_size;
		pg->cols = n > pg->cols ? n : pg->cols;
		used += n;
		pg->seqlens[b] = (int32_t)bt->sk[b];
	}
	pg->cols += 1; /* a padding column */
	pg->pages = 2 * used + 3;
	pg->table = xcalloc((size_t)(bt->B * pg->cols), 4);
	for (int64_t i = 0; i < bt->B * pg->cols; i++)
		pg->table[i] = -7;
	size_t pe = (size_t)(page_size * Hkv * D);
	pg->k = rnd_f32((size_t)pg->pages * pe, 100.0); /* spare pages: garbage */
	pg->v = rnd_f32((size_t)pg->pages * pe, 100.0);
	int64_t next = 0;
	for (int64_t b = 0; b < bt->B; b++)
		for (int64_t p = 0; p * page_size < bt->sk[b]; p++) {
			int32_t at = (int32_t)(pg->pages - 1 - 2 * next); /* backwards, spares between */
			next++;
			pg->table[b * pg->cols + p] = at;
			for (int64_t r = 0; r < page_size && p * page_size + r < bt->sk[b]; r++) {
				int64_t src = (bt->cu_k[b] + p * page_size + r) * Hkv * D;
				memcpy(pg->k + (size_t)at * pe + (size_t)(r * Hkv * D), bt->k + src,
				       (size_t)(Hkv * D) * 4);
				memcpy(pg->v + (size_t)at * pe + (size_t)(r * Hkv * D), bt->v + src,
				       (size_t)(Hkv * D) * 4);
			}
		}
}

static void paged_free(struct paged *pg)
{
	free(pg->table), free(pg->k), free(pg->v);
}

/* Paged keys, packed (varlen) or dense queries. */
static struct fa_attn_infer_desc paged_desc(const struct batch *bt, const struct paged *pg,
                                            const struct settings *s)
{
	struct fa_attn_infer_desc d = varlen_desc(bt, s);
	int64_t Hkv = bt->Hkv, D = bt->D;
	int64_t ks[3] = {pg->page_size * Hkv * D, Hkv * D, D};
	d.kv = FA_KV_PAGED;
	d.cu_k = NULL;
	d.total_k = 0;
	d.seqlens_k = pg->seqlens;
	d.page_table = pg->table;
	d.pt_cols = pg->cols;
	d.pages = pg->pages;
	d.page_size = pg->page_size;
	memcpy(d.fwd.k_stride, ks, sizeof ks);
	memcpy(d.fwd.v_stride, ks, sizeof ks);
	return d;
}

static void test_paged_equals_the_keys_gathered_into_dense_problems(void **state)
{
	static const int64_t sq[] = {1, 17, 4, 129, 2};
	static const int64_t sk[] = {129, 17, 127, 1, 0};
	static const int64_t page_sizes[] = {16, 32, 256};
	(void)state;
	for (size_t p = 0; p < sizeof page_sizes / sizeof page_sizes[0]; p++)
		for (size_t c = 0; c < NSETTINGS; c++) {
			struct batch bt;
			struct paged pg;
			batch_init(&bt, 5, sq, sk, 6, 2, 8);
			paged_init(&pg, &bt, page_sizes[p]);
			struct fa_attn_infer_desc d = paged_desc(&bt, &pg, &some_settings[c]);
			char err[256];
			if (fa_attn_infer_check(&d, err, sizeof err) != FA_OK)
				fail_msg("%s", err);
			size_t no = (size_t)(bt.total_q * bt.Hq * bt.D), nl = (size_t)(bt.Hq * bt.total_q);
			double *o64 = xcalloc(no, 8), *l64 = xcalloc(nl, 8);
			float *o32 = xcalloc(no, 4), *l32 = xcalloc(nl, 4);
			assert_int_equal(fa_attn_infer_ref64(&d, bt.q, pg.k, pg.v, o64, l64), FA_OK);
			assert_int_equal(
			    fa_attn_infer_ref(&d, bt.q, pg.k, pg.v, o32, l32, 0, bt.B * bt.Hq), FA_OK);
			for (int64_t b = 0; b < bt.B; b++) {
				int64_t r = bt.cu_q[b];
				assert_seq_is_dense(&bt, &some_settings[c], b, o64 + r * bt.Hq * bt.D,
				                    l64 + r, o32 + r * bt.Hq * bt.D, l32 + r, bt.total_q);
			}
			free(o64), free(l64), free(o32), free(l32);
			paged_free(&pg);
			batch_free(&bt);
		}
}

/* Dense queries [B, Sq, Hq, D] against a contiguous cache [B, rows, Hkv, D] of per-sequence
 * lengths, and the same cache paged: equal bit for bit; a decode row (Sq = 1) and speculative
 * rows (Sq = 4) with causal aligned to each cache length (query i sees keys <= i + len - Sq). */
static void test_kvcache_dense_queries_contiguous_equals_paged(void **state)
{
	static const int64_t lens[] = {17, 1, 129, 127, 0, 40};
	(void)state;
	for (int64_t Sq = 1; Sq <= 4; Sq += 3)
		for (size_t c = 0; c < NSETTINGS; c++) {
			int64_t B = 6, Hq = 4, Hkv = 1, D = 16, rows = 130;
			int64_t sq[6], sk[6];
			for (int64_t b = 0; b < B; b++)
				sq[b] = Sq, sk[b] = lens[b];
			struct batch bt; /* its packed keys are the source of both caches */
			batch_init(&bt, B, sq, sk, Hq, Hkv, D);
			struct paged pg;
			paged_init(&pg, &bt, 16);
			float *kc = rnd_f32((size_t)(B * rows * Hkv * D), 50.0); /* rows past a length: garbage */
			float *vc = rnd_f32((size_t)(B * rows * Hkv * D), 50.0);
			int32_t seqlens[6];
			for (int64_t b = 0; b < B; b++) {
				seqlens[b] = (int32_t)lens[b];
				memcpy(kc + b * rows * Hkv * D, bt.k + bt.cu_k[b] * Hkv * D,
				       (size_t)(lens[b] * Hkv * D) * 4);
				memcpy(vc + b * rows * Hkv * D, bt.v + bt.cu_k[b] * Hkv * D,
				       (size_t)(lens[b] * Hkv * D) * 4);
			}
			struct fa_attn_infer_desc dc = {
				.fwd = dense_desc(B, Sq, rows, Hq, Hkv, D, some_settings[c].mask),
				.kv = FA_KV_CACHE, .seqlens_k = seqlens, .cache_rows = rows,
			};
			dc.fwd.k_stride[0] = dc.fwd.v_stride[0] = rows * Hkv * D;
			apply(&dc.fwd, &some_settings[c]);
			struct fa_attn_infer_desc dp = dc;
			dp.kv = FA_KV_PAGED;
			dp.seqlens_k = pg.seqlens;
			dp.page_table = pg.table;
			dp.pt_cols = pg.cols;
			dp.pages = pg.pages;
			dp.page_size = pg.page_size;
			dp.fwd.k_stride[0] = dp.fwd.v_stride[0] = pg.page_size * Hkv * D;
			assert_int_equal(fa_attn_infer_check(&dc, NULL, 0), FA_OK);
			assert_int_equal(fa_attn_infer_check(&dp, NULL, 0), FA_OK);
			size_t no = (size_t)(B * Sq * Hq * D), nl = (size_t)(B * Hq * Sq);
			double *oc = xcalloc(no, 8), *lc = xcalloc(nl, 8);
			double *op = xcalloc(no, 8), *lp = xcalloc(nl, 8);
			assert_int_equal(fa_attn_infer_ref64(&dc, bt.q, kc, vc, oc, lc), FA_OK);
			assert_int_equal(fa_attn_infer_ref64(&dp, bt.q, pg.k, pg.v, op, lp), FA_OK);
			assert_memory_equal(oc, op, no * 8);
			assert_memory_equal(lc, lp, nl * 8);
			/* and each sequence is its dense problem: dense queries are packed ones of
			 * equal lengths, lse [B, Hq, Sq] is [Hq, Sq] per sequence */
			float *o32 = xcalloc(no, 4), *l32 = xcalloc(nl, 4);
			assert_int_equal(fa_attn_infer_ref(&dp, bt.q, pg.k, pg.v, o32, l32, 0, B * Hq),
			                 FA_OK);
			for (int64_t b = 0; b < B; b++) /* sequence b's queries: rows b * Sq of bt.q */
				assert_seq_is_dense(&bt, &some_settings[c], b, oc + b * Sq * Hq * D,
				                    lc + b * Hq * Sq, o32 + b * Sq * Hq * D,
				                    l32 + b * Hq * Sq, Sq);
			free(o32), free(l32);
			free(oc), free(lc), free(op), free(lp), free(kc), free(vc);
			paged_free(&pg);
			batch_free(&bt);
		}
}

/* ---- the checks name the bad entry ----------------------------------------------------------- */

static void expect(const struct fa_attn_infer_desc *d, fa_status want, const char *text)
{
	char err[256];
	fa_status st = fa_attn_infer_check(d, err, sizeof err);
	if (st != want || strstr(err, text) == NULL)
		fail_msg("got %s '%s', want %s '%s'", fa_status_name(st), err, fa_status_name(want),
		         text);
}

static void test_check_names_each_bad_index_entry(void **state)
{
	static const int64_t sq[] = {3, 5, 2, 4};
	static const int64_t sk[] = {40, 17, 33, 1};
	struct settings s = {FA_MASK_CAUSAL_BOTTOM_RIGHT, false, 0, 0, 0};
	struct batch bt;
	(void)state;
	batch_init(&bt, 4, sq, sk, 2, 1, 8);

	struct fa_attn_infer_desc d = varlen_desc(&bt, &s);
	bt.cu_q[2] = 2; /* below cu_seqlens_q[1] = 3 */
	expect(&d, FA_EINVAL, "cu_seqlens_q[2] = 2 is below cu_seqlens_q[1] = 3");
	bt.cu_q[2] = 8;
	d.fwd.Sk = 2000;
	bt.cu_k[4] = 1000;
	expect(&d, FA_EINVAL, "cu_seqlens_k[4] = 1000: past the 91 rows of the packed tensor");
	bt.cu_k[4] = 91;
	d.fwd.Sk = 40;
	bt.cu_q[0] = -1;
	expect(&d, FA_EINVAL, "cu_seqlens_q[0] = -1: offsets must be >= 0");
	bt.cu_q[0] = 0;
	d.fwd.Sk = 30;
	expect(&d, FA_EINVAL, "cu_seqlens_k: sequence 0 has 40 tokens, more than max_seqlen_k 30");
	d.fwd.Sk = 40;
	assert_int_equal(fa_attn_infer_check(&d, NULL, 0), FA_OK);

	struct paged pg;
	paged_init(&pg, &bt, 16);
	d = paged_desc(&bt, &pg, &s);
	pg.table[1 * pg.cols + 1] = 912; /* sequence 1 uses pages 0 and 1 */
	char want[128];
	snprintf(want, sizeof want, "page_table[1][1] = 912: the pools have %lld pages",
	         (long long)pg.pages);
	expect(&d, FA_EINVAL, want);
	pg.table[1 * pg.cols + 1] = -2;
	expect(&d, FA_EINVAL, "page_table[1][1] = -2");
	pg.table[1 * pg.cols + 1] = 0;
	pg.table[1 * pg.cols + 2] = 99999; /* past what sequence 1 uses: never read */
	assert_int_equal(fa_attn_infer_check(&d, NULL, 0), FA_OK);
	pg.seqlens[3] = -1;
	expect(&d, FA_EINVAL, "cache_seqlens[3] = -1: lengths must be >= 0");
	pg.seqlens[3] = (int32_t)(pg.cols * 16 + 1);
	snprintf(want, sizeof want, "cache_seqlens[3] = %lld: page_table holds %lld pages of 16",
	         (long long)(pg.cols * 16 + 1), (long long)pg.cols);
	expect(&d, FA_EINVAL, want);
	pg.seqlens[3] = 1;
	d.page_size = 8;
	expect(&d, FA_ESHAPE, "page size 8: pages hold 16 to 256 tokens");
	d.page_size = 16;
	d.fwd.softcap = -1;
	expect(&d, FA_EINVAL, "softcap is -1");
	d.fwd.softcap = NAN;
	expect(&d, FA_EINVAL, "softcap is nan");
	d.fwd.softcap = 0;
	d.kv = (enum fa_kv_layout)9;
	expect(&d, FA_EINVAL, "key layout 9 is unknown");

	/* a contiguous cache shorter than a length */
	struct fa_attn_infer_desc dc = {
		.fwd = dense_desc(4, 2, 64, 2, 1, 8, FA_MASK_NONE),
		.kv = FA_KV_CACHE, .seqlens_k = pg.seqlens, .cache_rows = 20,
	};
	pg.seqlens[0] = 21;
	expect(&dc, FA_EINVAL, "cache_seqlens[0] = 21: the cache holds 20 rows per sequence");
	pg.seqlens[0] = 20;
	dc.fwd.Sk = 19;
	expect(&dc, FA_EINVAL, "cache_seqlens[0] = 20: more than max_seqlen_k 19");
	paged_free(&pg);
	batch_free(&bt);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_window_matches_its_formula_on_odd_shapes),
		cmocka_unit_test(test_softcap_matches_the_direct_formula),
		cmocka_unit_test(test_window_unbounded_left_and_zero_right_is_causal),
		cmocka_unit_test(test_key_range_is_one_range_and_agrees_with_allows),
		cmocka_unit_test(test_varlen_equals_each_sequence_as_a_dense_problem),
		cmocka_unit_test(test_paged_equals_the_keys_gathered_into_dense_problems),
		cmocka_unit_test(test_kvcache_dense_queries_contiguous_equals_paged),
		cmocka_unit_test(test_check_names_each_bad_index_entry),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
