/* test_attn_ref.c - the CPU reference against hand-checked cases, a naive implementation and the
 * invariants attention must keep; and the descriptor checks with their statuses and texts.
 *
 * The naive implementation here is the formula read literally (fa_mask_allows per element, sums in
 * the obvious order); the reference is tiled, chunked and vectorised, so agreement to ~1e-13 says
 * the tiling is right. Sizes stay small so the sanitizer build runs this in well under a second.
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

/* ---- a problem in memory ----------------------------------------------------------------- */

struct prob {
	struct fa_attn_fwd_desc d;
	void *q, *k, *v, *o; /* in d.dtype */
	float *lse;          /* [B, Hq, Sq] */
	double *o64, *lse64; /* dense oracle outputs */
};

/* Strides of [B, S, H, D] data stored BSHD or BHSD. */
static void layout(int64_t S, int64_t H, int64_t D, bool bhsd, int64_t st[3])
{
	if (bhsd) {
		st[0] = H * S * D;
		st[1] = D;
		st[2] = S * D;
	} else {
		st[0] = S * H * D;
		st[1] = H * D;
		st[2] = D;
	}
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n, size);
	assert_non_null(p);
	return p;
}

static void prob_init(struct prob *p, fa_dtype dt, int64_t B, int64_t Sq, int64_t Sk, int64_t Hq,
                      int64_t Hkv, int64_t D, fa_mask mask, bool bhsd)
{
	memset(p, 0, sizeof(*p));
	struct fa_attn_fwd_desc *d = &p->d;
	d->dtype = dt;
	d->precision = FA_PREC_IEEE;
	d->mask = mask;
	d->scale = 1.0 / sqrt((double)D);
	d->B = B;
	d->Sq = Sq;
	d->Sk = Sk;
	d->Hq = Hq;
	d->Hkv = Hkv;
	d->D = D;
	layout(Sq, Hq, D, bhsd, d->q_stride);
	layout(Sk, Hkv, D, bhsd, d->k_stride);
	layout(Sk, Hkv, D, bhsd, d->v_stride);
	layout(Sq, Hq, D, bhsd, d->o_stride);
	d->lse_stride[0] = Hq * Sq;
	d->lse_stride[1] = Sq;
	d->lse_stride[2] = 1;
	size_t es = fa_dtype_size(dt);
	size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Sk * Hkv * D);
	p->q = xcalloc(nq, es);
	p->k = xcalloc(nk, es);
	p->v = xcalloc(nk, es);
	p->o = xcalloc(nq, es);
	p->lse = xcalloc((size_t)(B * Hq * Sq), sizeof(float));
	p->o64 = xcalloc(nq, sizeof(double));
	p->lse64 = xcalloc((size_t)(B * Hq * Sq), sizeof(double));
}

static void prob_free(struct prob *p)
{
	free(p->q);
	free(p->k);
	free(p->v);
	free(p->o);
	free(p->lse);
	free(p->o64);
	free(p->lse64);
}

/* Element offsets of logical [b, s, h, x]. */
static int64_t off_q(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return p->d.q_stride[0] * b + p->d.q_stride[1] * s + p->d.q_stride[2] * h + x;
}
static int64_t off_k(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return p->d.k_stride[0] * b + p->d.k_stride[1] * s + p->d.k_stride[2] * h + x;
}
static int64_t off_v(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return p->d.v_stride[0] * b + p->d.v_stride[1] * s + p->d.v_stride[2] * h + x;
}
static int64_t off_o(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return p->d.o_stride[0] * b + p->d.o_stride[1] * s + p->d.o_stride[2] * h + x;
}
static double q_at(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return fa_load_elem(p->q, p->d.dtype, off_q(p, b, s, h, x));
}
static double k_at(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return fa_load_elem(p->k, p->d.dtype, off_k(p, b, s, h, x));
}
static double v_at(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return fa_load_elem(p->v, p->d.dtype, off_v(p, b, s, h, x));
}
static double o_at(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return fa_load_elem(p->o, p->d.dtype, off_o(p, b, s, h, x));
}
/* The dense oracle outputs. */
static double o64_at(const struct prob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	return p->o64[((b * p->d.Sq + s) * p->d.Hq + h) * p->d.D + x];
}
static double lse64_at(const struct prob *p, int64_t b, int64_t h, int64_t s)
{
	return p->lse64[(b * p->d.Hq + h) * p->d.Sq + s];
}
static float lse_at(const struct prob *p, int64_t b, int64_t h, int64_t s)
{
	return p->lse[(b * p->d.Hq + h) * p->d.Sq + s];
}

/* A small deterministic generator (splitmix64): values in [-lim, lim). */
static double rnd(uint64_t *s, double lim)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return ((double)(z >> 11) * 0x1p-53 * 2.0 - 1.0) * lim;
}

/* Fill Q, K, V with random values (rounded to the dtype as they are stored). */
static void prob_fill(struct prob *p, uint64_t seed)
{
	const struct fa_attn_fwd_desc *d = &p->d;
	for (int64_t b = 0; b < d->B; b++)
		for (int64_t x = 0; x < d->D; x++) {
			for (int64_t s = 0; s < d->Sq; s++)
				for (int64_t h = 0; h < d->Hq; h++)
					fa_store_elem(p->q, d->dtype, off_q(p, b, s, h, x), rnd(&seed, 2.0));
			for (int64_t s = 0; s < d->Sk; s++)
				for (int64_t h = 0; h < d->Hkv; h++) {
					fa_store_elem(p->k, d->dtype, off_k(p, b, s, h, x), rnd(&seed, 2.0));
					fa_store_elem(p->v, d->dtype, off_v(p, b, s, h, x), rnd(&seed, 2.0));
				}
		}
}

/* Run both entry points on the whole problem. */
static void prob_run(struct prob *p)
{
	assert_int_equal(fa_attn_fwd_ref(&p->d, p->q, p->k, p->v, p->o, p->lse, 0, p->d.B * p->d.Hq),
	                 FA_OK);
	assert_int_equal(fa_attn_fwd_ref64(&p->d, p->q, p->k, p->v, p->o64, p->lse64), FA_OK);
}

/* |a - b| <= tol * max(1, |b|), with a message naming where. */
static void check_close(double a, double b, double tol, const char *what, int64_t i0, int64_t i1)
{
	if (isinf(a) && isinf(b) && (a > 0) == (b > 0))
		return;
	double lim = tol * (fabs(b) > 1 ? fabs(b) : 1);
	if (!(fabs(a - b) <= lim)) {
		print_error("%s [%lld, %lld]: %.17g vs %.17g (tol %g)\n", what, (long long)i0,
		            (long long)i1, a, b, tol);
		fail();
	}
}

/* The formula read literally, for one row: O and lse in float64. */
static void naive_row(const struct prob *p, int64_t b, int64_t h, int64_t i, double *o,
                      double *lse)
{
	const struct fa_attn_fwd_desc *d = &p->d;
	int64_t kvh = h / (d->Hq / d->Hkv);
	double m = -INFINITY, l = 0;
	double *s = xcalloc((size_t)d->Sk, sizeof(double));
	for (int64_t j = 0; j < d->Sk; j++) {
		if (!fa_mask_allows(d->mask, d->Sq, d->Sk, i, j))
			continue;
		double dot = 0;
		for (int64_t x = 0; x < d->D; x++)
			dot += q_at(p, b, i, h, x) * k_at(p, b, j, kvh, x);
		s[j] = d->scale * dot;
		m = fmax(m, s[j]);
	}
	for (int64_t x = 0; x < d->D; x++)
		o[x] = 0;
	if (m == -INFINITY) {
		*lse = -INFINITY;
		free(s);
		return;
	}
	for (int64_t j = 0; j < d->Sk; j++) {
		if (!fa_mask_allows(d->mask, d->Sq, d->Sk, i, j))
			continue;
		double e = exp(s[j] - m);
		l += e;
		for (int64_t x = 0; x < d->D; x++)
			o[x] += e * v_at(p, b, j, kvh, x);
	}
	for (int64_t x = 0; x < d->D; x++)
		o[x] /= l;
	*lse = m + log(l);
	free(s);
}

/* Compare the oracle, O in dtype and fp32 lse with the naive formula everywhere. */
static void check_against_naive(const struct prob *p)
{
	const struct fa_attn_fwd_desc *d = &p->d;
	double *o = xcalloc((size_t)d->D, sizeof(double));
	double otol = d->dtype == FA_DTYPE_FP32 ? 1e-6 : d->dtype == FA_DTYPE_FP16 ? 1e-3 : 8e-3;
	for (int64_t b = 0; b < d->B; b++)
		for (int64_t h = 0; h < d->Hq; h++)
			for (int64_t i = 0; i < d->Sq; i++) {
				double lse;
				naive_row(p, b, h, i, o, &lse);
				check_close(lse64_at(p, b, h, i), lse, 1e-12, "lse64", h, i);
				check_close(lse_at(p, b, h, i), lse, 1e-6, "lse", h, i);
				for (int64_t x = 0; x < d->D; x++) {
					check_close(o64_at(p, b, i, h, x), o[x], 1e-12, "o64", i, x);
					check_close(o_at(p, b, i, h, x), o[x], otol, "o", i, x);
				}
			}
	free(o);
}

/* ---- hand-checked cases --------------------------------------------------------------------- */

static void test_ref_single_key_gives_v(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 1, 1, 1, 1, 8, FA_MASK_NONE, false);
	prob_fill(&p, 1);
	prob_run(&p);
	double dot = 0;
	for (int x = 0; x < 8; x++) {
		assert_true(o64_at(&p, 0, 0, 0, x) == v_at(&p, 0, 0, 0, x));
		assert_true(o_at(&p, 0, 0, 0, x) == v_at(&p, 0, 0, 0, x));
		dot += q_at(&p, 0, 0, 0, x) * k_at(&p, 0, 0, 0, x);
	}
	/* one key: lse is its scaled score */
	check_close(lse64_at(&p, 0, 0, 0), dot * p.d.scale, 1e-14, "lse", 0, 0);
	prob_free(&p);
}

static void test_ref_equal_scores_give_mean_of_v(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 1, 2, 1, 1, 8, FA_MASK_NONE, false);
	prob_fill(&p, 2);
	/* both keys equal: equal scores, probabilities 1/2 each */
	for (int x = 0; x < 8; x++)
		fa_store_elem(p.k, FA_DTYPE_FP32, off_k(&p, 0, 1, 0, x), k_at(&p, 0, 0, 0, x));
	prob_run(&p);
	for (int x = 0; x < 8; x++) {
		double mean = (v_at(&p, 0, 0, 0, x) + v_at(&p, 0, 1, 0, x)) / 2;
		check_close(o64_at(&p, 0, 0, 0, x), mean, 1e-15, "o", 0, x);
	}
	double s = 0;
	for (int x = 0; x < 8; x++)
		s += q_at(&p, 0, 0, 0, x) * k_at(&p, 0, 0, 0, x);
	check_close(lse64_at(&p, 0, 0, 0), s * p.d.scale + log(2.0), 1e-14, "lse", 0, 0);
	prob_free(&p);
}

/* q = e0, k0 = e0, k1 = 0, scale 2: scores 2 and 0; p0 = e^2 / (e^2 + 1). */
static void test_ref_hand_computed_case_with_scale(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 1, 2, 1, 1, 8, FA_MASK_NONE, false);
	p.d.scale = 2.0;
	float *q = p.q, *k = p.k, *v = p.v;
	q[0] = 1;
	k[0] = 1; /* key 0 = e0, key 1 = 0 */
	for (int x = 0; x < 8; x++) {
		v[x] = (float)x;        /* V row 0: 0..7 */
		v[8 + x] = (float)-x;   /* V row 1: 0..-7 */
	}
	prob_run(&p);
	double e2 = exp(2.0), p0 = e2 / (e2 + 1), p1 = 1 / (e2 + 1);
	for (int x = 0; x < 8; x++)
		check_close(o64_at(&p, 0, 0, 0, x), p0 * x - p1 * x, 1e-15, "o", 0, x);
	/* 0.7615941559557649 = tanh(1), by hand: (e^2 - 1) / (e^2 + 1) */
	check_close(o64_at(&p, 0, 0, 0, 1), 0.7615941559557649, 1e-15, "o", 0, 1);
	check_close(lse64_at(&p, 0, 0, 0), log(e2 + 1), 1e-15, "lse", 0, 0);
	check_close(lse64_at(&p, 0, 0, 0), 2.1269280110429727, 1e-15, "lse", 0, 0);
	assert_true(p.lse[0] == (float)2.1269280110429727);
	prob_free(&p);
}

/* ---- agreement with the naive formula ---------------------------------------------------- */

static void test_ref_matches_naive_formula(void **state)
{
	(void)state;
	static const struct {
		fa_dtype dt;
		int64_t B, Sq, Sk, Hq, Hkv, D;
		fa_mask mask;
		bool bhsd;
	} cases[] = {
		{FA_DTYPE_FP32, 2, 5, 7, 4, 2, 8, FA_MASK_NONE, false},
		{FA_DTYPE_FP32, 1, 9, 9, 2, 2, 16, FA_MASK_CAUSAL_TOP_LEFT, true},
		{FA_DTYPE_FP32, 1, 3, 11, 3, 1, 24, FA_MASK_CAUSAL_BOTTOM_RIGHT, false},
		{FA_DTYPE_FP32, 1, 11, 4, 2, 1, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT, true},
		{FA_DTYPE_FP32, 1, 4, 13, 2, 2, 8, FA_MASK_CAUSAL_TOP_LEFT, false},
		{FA_DTYPE_BF16, 2, 33, 37, 4, 4, 64, FA_MASK_CAUSAL_BOTTOM_RIGHT, false},
		{FA_DTYPE_FP16, 1, 1, 50, 8, 2, 128, FA_MASK_NONE, false}, /* decode */
		{FA_DTYPE_FP16, 1, 3, 5, 1, 1, 256, FA_MASK_CAUSAL_TOP_LEFT, true},
		{FA_DTYPE_BF16, 1, 70, 66, 2, 1, 40, FA_MASK_NONE, true},
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct prob p;
		prob_init(&p, cases[c].dt, cases[c].B, cases[c].Sq, cases[c].Sk, cases[c].Hq,
		          cases[c].Hkv, cases[c].D, cases[c].mask, cases[c].bhsd);
		prob_fill(&p, 100 + c);
		prob_run(&p);
		check_against_naive(&p);
		prob_free(&p);
	}
}

static void test_ref_lse_is_log_of_summed_exp_scores(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 6, 9, 2, 1, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT, false);
	prob_fill(&p, 3);
	prob_run(&p);
	for (int64_t h = 0; h < 2; h++)
		for (int64_t i = 0; i < 6; i++) {
			double sum = 0; /* no max subtraction: the scores are small */
			for (int64_t j = 0; j <= i + 3; j++) {
				double dot = 0;
				for (int64_t x = 0; x < 16; x++)
					dot += q_at(&p, 0, i, h, x) * k_at(&p, 0, j, 0, x);
				sum += exp(p.d.scale * dot);
			}
			check_close(lse64_at(&p, 0, h, i), log(sum), 1e-13, "lse", h, i);
			check_close(lse_at(&p, 0, h, i), log(sum), 1e-6, "lse32", h, i);
		}
	prob_free(&p);
}

/* Scores far apart (1600 and 0): exp without the row max would overflow; with it O is V row 0
 * and lse is the large score. */
static void test_ref_large_scores_stay_finite(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 1, 3, 1, 1, 8, FA_MASK_NONE, false);
	p.d.scale = 1.0;
	float *q = p.q, *k = p.k, *v = p.v;
	q[0] = 40;
	k[0] = 40;       /* key 0: score 1600 */
	k[16] = -40;     /* key 2: score -1600; key 1: score 0 */
	for (int n = 0; n < 24; n++)
		v[n] = (float)(n + 1);
	prob_run(&p);
	for (int x = 0; x < 8; x++)
		assert_true(o64_at(&p, 0, 0, 0, x) == v[x]);
	assert_true(lse64_at(&p, 0, 0, 0) == 1600.0);
	assert_true(p.lse[0] == 1600.0f);
	prob_free(&p);
}

/* ---- invariants -------------------------------------------------------------------------------- */

static void test_ref_key_permutation_leaves_o_unchanged(void **state)
{
	(void)state;
	struct prob a, b;
	const int64_t Sk = 10;
	static const int perm[10] = {7, 2, 9, 0, 4, 1, 8, 3, 6, 5};
	prob_init(&a, FA_DTYPE_FP32, 1, 4, Sk, 2, 2, 16, FA_MASK_NONE, false);
	prob_init(&b, FA_DTYPE_FP32, 1, 4, Sk, 2, 2, 16, FA_MASK_NONE, false);
	prob_fill(&a, 4);
	memcpy(b.q, a.q, (size_t)(4 * 2 * 16) * sizeof(float));
	for (int64_t j = 0; j < Sk; j++)
		for (int64_t h = 0; h < 2; h++)
			for (int64_t x = 0; x < 16; x++) {
				fa_store_elem(b.k, FA_DTYPE_FP32, off_k(&b, 0, j, h, x), k_at(&a, 0, perm[j], h, x));
				fa_store_elem(b.v, FA_DTYPE_FP32, off_v(&b, 0, j, h, x), v_at(&a, 0, perm[j], h, x));
			}
	prob_run(&a);
	prob_run(&b);
	for (int64_t n = 0; n < 4 * 2 * 16; n++)
		check_close(b.o64[n], a.o64[n], 1e-14, "o", n, 0);
	for (int64_t n = 0; n < 2 * 4; n++)
		check_close(b.lse64[n], a.lse64[n], 1e-14, "lse", n, 0);
	prob_free(&a);
	prob_free(&b);
}

/* Each O row is a convex combination of the visible V rows: inside their per-column range. */
static void test_ref_o_rows_are_convex_combinations_of_v(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_BF16, 2, 17, 23, 4, 2, 32, FA_MASK_CAUSAL_BOTTOM_RIGHT, false);
	prob_fill(&p, 5);
	prob_run(&p);
	for (int64_t b = 0; b < 2; b++)
		for (int64_t h = 0; h < 4; h++)
			for (int64_t i = 0; i < 17; i++)
				for (int64_t x = 0; x < 32; x++) {
					double lo = INFINITY, hi = -INFINITY;
					for (int64_t j = 0; j < 23; j++)
						if (fa_mask_allows(p.d.mask, 17, 23, i, j)) {
							lo = fmin(lo, v_at(&p, b, j, h / 2, x));
							hi = fmax(hi, v_at(&p, b, j, h / 2, x));
						}
					double o = o64_at(&p, b, i, h, x);
					assert_true(o >= lo - 1e-12 && o <= hi + 1e-12);
					/* rounding to bf16 cannot leave the range: its ends are bf16 values */
					assert_true(o_at(&p, b, i, h, x) >= lo && o_at(&p, b, i, h, x) <= hi);
				}
	prob_free(&p);
}

static void test_ref_causal_top_left_row0_is_v_row0(void **state)
{
	(void)state;
	static const int64_t shapes[][2] = {{5, 5}, {3, 8}, {8, 3}};
	for (size_t c = 0; c < 3; c++) {
		struct prob p;
		prob_init(&p, FA_DTYPE_FP32, 1, shapes[c][0], shapes[c][1], 2, 1, 8,
		          FA_MASK_CAUSAL_TOP_LEFT, false);
		prob_fill(&p, 6 + c);
		prob_run(&p);
		for (int64_t h = 0; h < 2; h++)
			for (int64_t x = 0; x < 8; x++) {
				assert_true(o64_at(&p, 0, 0, h, x) == v_at(&p, 0, 0, 0, x));
				assert_true(o_at(&p, 0, 0, h, x) == v_at(&p, 0, 0, 0, x));
			}
		check_against_naive(&p);
		prob_free(&p);
	}
}

/* Sq < Sk, bottom-right: the last query sees every key (like no mask); row i sees i + Sk - Sq + 1. */
static void test_ref_causal_bottom_right_with_fewer_queries(void **state)
{
	(void)state;
	struct prob p, full;
	prob_init(&p, FA_DTYPE_FP32, 1, 3, 7, 1, 1, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT, false);
	prob_init(&full, FA_DTYPE_FP32, 1, 3, 7, 1, 1, 8, FA_MASK_NONE, false);
	prob_fill(&p, 9);
	memcpy(full.q, p.q, 3 * 8 * sizeof(float));
	memcpy(full.k, p.k, 7 * 8 * sizeof(float));
	memcpy(full.v, p.v, 7 * 8 * sizeof(float));
	prob_run(&p);
	prob_run(&full);
	for (int64_t x = 0; x < 8; x++)
		assert_true(o64_at(&p, 0, 2, 0, x) == o64_at(&full, 0, 2, 0, x));
	assert_true(lse64_at(&p, 0, 0, 2) == lse64_at(&full, 0, 0, 2));
	/* row 0 sees keys 0..4 only: differs from the unmasked row */
	assert_true(lse64_at(&p, 0, 0, 0) < lse64_at(&full, 0, 0, 0));
	check_against_naive(&p);
	prob_free(&p);
	prob_free(&full);
}

/* Sq > Sk, bottom-right: rows 0 .. Sq-Sk-1 see no key: O = 0 and lse = -inf; the next row sees
 * key 0 only, so its O is V row 0. */
static void test_ref_fully_masked_rows_give_zero_and_minus_inf(void **state)
{
	(void)state;
	fa_dtype dts[3] = {FA_DTYPE_FP32, FA_DTYPE_FP16, FA_DTYPE_BF16};
	for (int t = 0; t < 3; t++) {
		struct prob p;
		prob_init(&p, dts[t], 2, 6, 2, 2, 1, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT, t == 1);
		prob_fill(&p, 10);
		/* poison O and lse: the reference must write every element */
		memset(p.o, 0x7f, (size_t)(2 * 6 * 2 * 8) * fa_dtype_size(dts[t]));
		for (int n = 0; n < 2 * 2 * 6; n++)
			p.lse[n] = 12345.0f;
		prob_run(&p);
		for (int64_t b = 0; b < 2; b++)
			for (int64_t h = 0; h < 2; h++) {
				for (int64_t i = 0; i < 4; i++) {
					assert_true(isinf(lse_at(&p, b, h, i)) && lse_at(&p, b, h, i) < 0);
					assert_true(isinf(lse64_at(&p, b, h, i)) && lse64_at(&p, b, h, i) < 0);
					for (int64_t x = 0; x < 8; x++) {
						assert_true(o_at(&p, b, i, h, x) == 0);
						assert_true(o64_at(&p, b, i, h, x) == 0);
					}
				}
				for (int64_t x = 0; x < 8; x++)
					assert_true(o_at(&p, b, 4, h, x) == v_at(&p, b, 0, 0, x));
				assert_true(isfinite(lse_at(&p, b, h, 5)));
			}
		check_against_naive(&p);
		prob_free(&p);
	}
}

/* Keys a row cannot see have no influence, even NaN ones. */
static void test_ref_masked_keys_do_not_leak(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 9, 9, 1, 1, 16, FA_MASK_CAUSAL_TOP_LEFT, false);
	prob_fill(&p, 11);
	for (int64_t x = 0; x < 16; x++) {
		fa_store_elem(p.k, FA_DTYPE_FP32, off_k(&p, 0, 8, 0, x), NAN);
		fa_store_elem(p.v, FA_DTYPE_FP32, off_v(&p, 0, 8, 0, x), NAN);
	}
	prob_run(&p);
	for (int64_t i = 0; i < 8; i++) {
		assert_true(isfinite(lse64_at(&p, 0, 0, i)));
		for (int64_t x = 0; x < 16; x++)
			assert_true(isfinite(o64_at(&p, 0, i, 0, x)));
	}
	assert_true(isnan(o64_at(&p, 0, 8, 0, 0))); /* the row that sees it */
	prob_free(&p);
}

static void test_ref_gqa_equals_mha_with_repeated_kv_heads(void **state)
{
	(void)state;
	struct prob g, m;
	const int64_t Hq = 6, Hkv = 2, S = 7, D = 16, G = Hq / Hkv;
	prob_init(&g, FA_DTYPE_BF16, 2, S, S, Hq, Hkv, D, FA_MASK_CAUSAL_BOTTOM_RIGHT, false);
	prob_init(&m, FA_DTYPE_BF16, 2, S, S, Hq, Hq, D, FA_MASK_CAUSAL_BOTTOM_RIGHT, false);
	prob_fill(&g, 12);
	memcpy(m.q, g.q, (size_t)(2 * S * Hq * D) * 2);
	for (int64_t b = 0; b < 2; b++)
		for (int64_t j = 0; j < S; j++)
			for (int64_t h = 0; h < Hq; h++)
				for (int64_t x = 0; x < D; x++) {
					fa_store_elem(m.k, m.d.dtype, off_k(&m, b, j, h, x), k_at(&g, b, j, h / G, x));
					fa_store_elem(m.v, m.d.dtype, off_v(&m, b, j, h, x), v_at(&g, b, j, h / G, x));
				}
	prob_run(&g);
	prob_run(&m);
	assert_memory_equal(g.o, m.o, (size_t)(2 * S * Hq * D) * 2);
	assert_memory_equal(g.o64, m.o64, (size_t)(2 * S * Hq * D) * sizeof(double));
	assert_memory_equal(g.lse, m.lse, (size_t)(2 * Hq * S) * sizeof(float));
	prob_free(&g);
	prob_free(&m);
}

static void test_ref_bshd_and_bhsd_layouts_give_identical_o(void **state)
{
	(void)state;
	struct prob a, b;
	prob_init(&a, FA_DTYPE_FP16, 2, 5, 9, 4, 2, 24, FA_MASK_CAUSAL_TOP_LEFT, false);
	prob_init(&b, FA_DTYPE_FP16, 2, 5, 9, 4, 2, 24, FA_MASK_CAUSAL_TOP_LEFT, true);
	prob_fill(&a, 13);
	for (int64_t bb = 0; bb < 2; bb++)
		for (int64_t x = 0; x < 24; x++) {
			for (int64_t s = 0; s < 5; s++)
				for (int64_t h = 0; h < 4; h++)
					fa_store_elem(b.q, b.d.dtype, off_q(&b, bb, s, h, x), q_at(&a, bb, s, h, x));
			for (int64_t s = 0; s < 9; s++)
				for (int64_t h = 0; h < 2; h++) {
					fa_store_elem(b.k, b.d.dtype, off_k(&b, bb, s, h, x), k_at(&a, bb, s, h, x));
					fa_store_elem(b.v, b.d.dtype, off_v(&b, bb, s, h, x), v_at(&a, bb, s, h, x));
				}
		}
	prob_run(&a);
	prob_run(&b);
	for (int64_t bb = 0; bb < 2; bb++)
		for (int64_t s = 0; s < 5; s++)
			for (int64_t h = 0; h < 4; h++)
				for (int64_t x = 0; x < 24; x++)
					assert_true(o_at(&a, bb, s, h, x) == o_at(&b, bb, s, h, x));
	assert_memory_equal(a.o64, b.o64, (size_t)(2 * 5 * 4 * 24) * sizeof(double));
	assert_memory_equal(a.lse, b.lse, (size_t)(2 * 4 * 5) * sizeof(float));
	prob_free(&a);
	prob_free(&b);
}

/* 16-bit outputs are the float64 result rounded once: exactly fa_store_elem of the oracle. */
static void test_ref_half_outputs_are_rounded_oracle(void **state)
{
	(void)state;
	fa_dtype dts[2] = {FA_DTYPE_FP16, FA_DTYPE_BF16};
	for (int t = 0; t < 2; t++) {
		struct prob p;
		prob_init(&p, dts[t], 1, 19, 21, 2, 2, 32, FA_MASK_NONE, false);
		prob_fill(&p, 14);
		prob_run(&p);
		for (int64_t n = 0; n < 19 * 2 * 32; n++) {
			uint16_t want;
			fa_store_elem(&want, dts[t], 0, p.o64[n]);
			assert_int_equal(((uint16_t *)p.o)[n], want);
		}
		double err = fa_attn_fwd_rel_error(&p.d, p.o, p.o64);
		assert_true(err > 0 && err <= (dts[t] == FA_DTYPE_FP16 ? 1e-3 : 8e-3));
		prob_free(&p);
	}
}

/* The same problem split over bh ranges (as the daemon's thread pool does) gives the same bytes. */
static void test_ref_bh_split_matches_one_call(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_BF16, 3, 6, 8, 4, 2, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT, false);
	prob_fill(&p, 15);
	prob_run(&p);
	size_t ob = (size_t)(3 * 6 * 4 * 16) * 2, lb = (size_t)(3 * 4 * 6) * sizeof(float);
	void *o = xcalloc(ob, 1);
	float *lse = xcalloc(lb, 1);
	static const int64_t cuts[] = {0, 1, 5, 6, 11, 12};
	for (size_t c = 0; c + 1 < sizeof(cuts) / sizeof(cuts[0]); c++)
		assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, o, lse, cuts[c], cuts[c + 1]),
		                 FA_OK);
	assert_memory_equal(o, p.o, ob);
	assert_memory_equal(lse, p.lse, lb);
	/* a range writes only its own (batch, head) pairs: bh 5..6 is batch 1, heads 1..2 */
	memset(o, 0x55, ob);
	memset(lse, 0x55, lb);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, o, lse, 5, 7), FA_OK);
	for (int64_t b = 0; b < 3; b++)
		for (int64_t h = 0; h < 4; h++) {
			bool in = b * 4 + h >= 5 && b * 4 + h < 7;
			for (int64_t i = 0; i < 6; i++) {
				const unsigned char *ob8 = (const unsigned char *)o + off_o(&p, b, i, h, 0) * 2;
				const unsigned char *pb8 = (const unsigned char *)p.o + off_o(&p, b, i, h, 0) * 2;
				for (int64_t x = 0; x < 32; x++)
					assert_int_equal(ob8[x], in ? pb8[x] : 0x55);
				float want = in ? lse_at(&p, b, h, i) : 0;
				if (!in)
					memset(&want, 0x55, sizeof(want));
				assert_memory_equal(&lse[(b * 4 + h) * 6 + i], &want, sizeof(float));
			}
		}
	/* an empty range writes nothing */
	memset(o, 0x55, ob);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, o, lse, 7, 7), FA_OK);
	assert_int_equal(((unsigned char *)o)[0], 0x55);
	free(o);
	free(lse);
	prob_free(&p);
}

/* A scratch limit too small for whole K/V switches to key chunks: the same bytes come out. */
static void test_ref_key_chunks_give_the_same_result(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 13, 29, 2, 1, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT, false);
	prob_fill(&p, 16);
	prob_run(&p);
	size_t ob = (size_t)(13 * 2 * 16) * sizeof(float), lb = (size_t)(2 * 13) * sizeof(float);
	float *o = xcalloc(ob, 1), *lse = xcalloc(lb, 1);
	double *o64 = xcalloc((size_t)(13 * 2 * 16), sizeof(double));
	/* Br = 13 rows: fixed part 2*13*16 + 3*13 words, 32 + 13 words per key; 3 and 7 keys */
	static const size_t words[] = {2 * 13 * 16 + 3 * 13 + 45 * 3, 2 * 13 * 16 + 3 * 13 + 45 * 7};
	for (int t = 0; t < 2; t++) {
		size_t old = fa_attn_fwd_ref_scratch_limit(words[t] * 8);
		assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, o, lse, 0, 2), FA_OK);
		assert_int_equal(fa_attn_fwd_ref64(&p.d, p.q, p.k, p.v, o64, NULL), FA_OK);
		fa_attn_fwd_ref_scratch_limit(old);
		assert_memory_equal(o, p.o, ob);
		assert_memory_equal(lse, p.lse, lb);
		assert_memory_equal(o64, p.o64, (size_t)(13 * 2 * 16) * sizeof(double));
	}
	free(o);
	free(lse);
	free(o64);
	prob_free(&p);
}

static void test_ref_scratch_limit_below_one_key_is_enomem(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 4, 4, 1, 1, 8, FA_MASK_NONE, false);
	prob_fill(&p, 17);
	size_t old = fa_attn_fwd_ref_scratch_limit(64);
	assert_int_equal(fa_attn_fwd_ref_scratch_limit(0), 64);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, p.lse, 0, 1), FA_ENOMEM);
	assert_int_equal(fa_attn_fwd_ref64(&p.d, p.q, p.k, p.v, p.o64, p.lse64), FA_ENOMEM);
	assert_int_equal(fa_attn_fwd_ref_scratch_limit(old), 64);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, p.lse, 0, 1), FA_OK);
	prob_free(&p);
}

static void test_ref_rejects_bad_arguments(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 2, 4, 4, 2, 1, 8, FA_MASK_NONE, false);
	assert_int_equal(fa_attn_fwd_ref(NULL, p.q, p.k, p.v, p.o, NULL, 0, 4), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, NULL, p.k, p.v, p.o, NULL, 0, 4), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, NULL, p.v, p.o, NULL, 0, 4), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, NULL, p.o, NULL, 0, 4), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, NULL, NULL, 0, 4), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, NULL, -1, 4), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, NULL, 0, 5), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, NULL, 3, 2), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, NULL, 0, 4), FA_OK); /* no lse */
	assert_int_equal(fa_attn_fwd_ref64(&p.d, p.q, p.k, p.v, NULL, NULL), FA_EINVAL);
	assert_int_equal(fa_attn_fwd_ref64(NULL, p.q, p.k, p.v, p.o64, NULL), FA_EINVAL);
	/* the descriptor is checked first: its own status comes back */
	p.d.D = 12;
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, NULL, 0, 4), FA_ESHAPE);
	assert_int_equal(fa_attn_fwd_ref64(&p.d, p.q, p.k, p.v, p.o64, NULL), FA_ESHAPE);
	p.d.D = 8;
	p.d.dtype = (fa_dtype)0;
	assert_int_equal(fa_attn_fwd_ref(&p.d, p.q, p.k, p.v, p.o, NULL, 0, 4), FA_EDTYPE);
	prob_free(&p);
}

/* ---- relative error ---------------------------------------------------------------------------- */

static void test_rel_error_measures_and_rejects_non_finite(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_FP32, 1, 2, 3, 1, 1, 8, FA_MASK_NONE, true);
	prob_fill(&p, 18);
	prob_run(&p);
	float *o = p.o;
	/* fp32 output against its own oracle: tiny but not necessarily 0 */
	assert_true(fa_attn_fwd_rel_error(&p.d, p.o, p.o64) < 1e-7);
	/* exact values give 0 */
	for (int n = 0; n < 16; n++)
		p.o64[n] = o[n];
	assert_true(fa_attn_fwd_rel_error(&p.d, p.o, p.o64) == 0.0);
	/* a known error: ref = (3, 4, 0...), x = (3, 4 + 0.5, 0...) -> 0.5 / 5 */
	for (int n = 0; n < 16; n++)
		o[n] = 0, p.o64[n] = 0;
	p.o64[0] = 3;
	p.o64[1] = 4;
	o[0] = 3; /* BHSD with one head: logical and memory order agree */
	o[1] = 4.5f;
	check_close(fa_attn_fwd_rel_error(&p.d, p.o, p.o64), 0.1, 1e-15, "err", 0, 0);
	o[5] = NAN;
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, p.o, p.o64)));
	o[5] = -INFINITY;
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, p.o, p.o64)));
	o[5] = 0;
	p.o64[7] = NAN;
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, p.o, p.o64)));
	/* all-zero reference: 0 if x is zero too, +inf otherwise */
	memset(p.o64, 0, 16 * sizeof(double));
	memset(p.o, 0, 16 * sizeof(float));
	assert_true(fa_attn_fwd_rel_error(&p.d, p.o, p.o64) == 0.0);
	o[3] = 1e-30f;
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, p.o, p.o64)));
	assert_true(isinf(fa_attn_fwd_rel_error(NULL, p.o, p.o64)));
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, NULL, p.o64)));
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, p.o, NULL)));
	prob_free(&p);
}

static void test_rel_error_sees_nan_in_half_outputs(void **state)
{
	(void)state;
	struct prob p;
	prob_init(&p, FA_DTYPE_BF16, 1, 2, 2, 2, 1, 8, FA_MASK_NONE, false);
	prob_fill(&p, 19);
	prob_run(&p);
	assert_true(fa_attn_fwd_rel_error(&p.d, p.o, p.o64) < 8e-3);
	((uint16_t *)p.o)[31] = 0x7fc0; /* the last element */
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, p.o, p.o64)));
	((uint16_t *)p.o)[31] = 0xff80; /* -inf */
	assert_true(isinf(fa_attn_fwd_rel_error(&p.d, p.o, p.o64)));
	prob_free(&p);
}

/* ---- fa_tensor_extent ---------------------------------------------------------------------- */

static void test_extent_of_contiguous_and_strided_tensors(void **state)
{
	(void)state;
	uint64_t lo = 1, hi = 1;
	const int64_t shape[4] = {2, 3, 4, 8}, bshd[4] = {96, 32, 8, 1};
	assert_true(fa_tensor_extent(4, shape, bshd, 2, &lo, &hi));
	assert_int_equal(lo, 0);
	assert_int_equal(hi, 2 * 3 * 4 * 8 * 2);
	/* padded rows: the last element is at 1*200 + 2*40 + 3*10 + 7 */
	const int64_t padded[4] = {200, 40, 10, 1};
	assert_true(fa_tensor_extent(4, shape, padded, 4, &lo, &hi));
	assert_int_equal(hi, (200 + 80 + 30 + 7 + 1) * 4);
	/* stride 0 (broadcast) is allowed: one element */
	const int64_t zero[4] = {0, 0, 0, 0};
	assert_true(fa_tensor_extent(4, shape, zero, 4, &lo, &hi));
	assert_int_equal(hi, 4);
	/* no dimensions: one element */
	assert_true(fa_tensor_extent(0, NULL, NULL, 2, &lo, &hi));
	assert_int_equal(hi, 2);
	/* the largest extent that fits */
	const int64_t big[1] = {INT64_MAX / 4}, one[1] = {1};
	assert_true(fa_tensor_extent(1, big, one, 4, &lo, &hi));
	assert_int_equal(hi, (uint64_t)(INT64_MAX / 4) * 4);
}

static void test_extent_rejects_overflow_and_bad_sizes(void **state)
{
	(void)state;
	uint64_t lo = 7, hi = 7;
	const int64_t one[1] = {1};
	/* (shape - 1) * stride overflows */
	const int64_t s1[2] = {INT64_C(1) << 32, 2}, st1[2] = {INT64_C(1) << 32, 1};
	assert_false(fa_tensor_extent(2, s1, st1, 2, &lo, &hi));
	assert_int_equal(lo, 0);
	assert_int_equal(hi, 0);
	/* each product fits, their sum does not */
	const int64_t s2[2] = {2, 2}, st2[2] = {INT64_MAX, INT64_MAX};
	assert_false(fa_tensor_extent(2, s2, st2, 1, &lo, &hi));
	/* + 1 element overflows */
	const int64_t s3[1] = {2}, st3[1] = {INT64_MAX};
	assert_false(fa_tensor_extent(1, s3, st3, 1, &lo, &hi));
	/* elements fit, bytes do not */
	const int64_t s4[1] = {INT64_MAX / 2};
	assert_false(fa_tensor_extent(1, s4, one, 4, &lo, &hi));
	/* sizes < 1, negative strides, elem_size 0, bad ndim */
	const int64_t s5[2] = {2, 0}, st5[2] = {8, 1};
	assert_false(fa_tensor_extent(2, s5, st5, 2, &lo, &hi));
	const int64_t s6[2] = {2, -3};
	assert_false(fa_tensor_extent(2, s6, st5, 2, &lo, &hi));
	const int64_t s7[2] = {2, 2}, st7[2] = {-8, 1};
	assert_false(fa_tensor_extent(2, s7, st7, 2, &lo, &hi));
	assert_false(fa_tensor_extent(1, one, one, 0, &lo, &hi));
	assert_false(fa_tensor_extent(-1, one, one, 2, &lo, &hi));
	assert_false(fa_tensor_extent(1, NULL, one, 2, &lo, &hi));
	assert_false(fa_tensor_extent(1, one, NULL, 2, &lo, &hi));
}

/* ---- fa_attn_fwd_check ------------------------------------------------------------------- */

static struct fa_attn_fwd_desc good_desc(void)
{
	struct prob p;
	memset(&p, 0, sizeof(p));
	p.d.dtype = FA_DTYPE_BF16;
	p.d.precision = FA_PREC_DEFAULT;
	p.d.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	p.d.scale = 0.125;
	p.d.B = 2;
	p.d.Sq = 16;
	p.d.Sk = 32;
	p.d.Hq = 8;
	p.d.Hkv = 2;
	p.d.D = 64;
	layout(16, 8, 64, false, p.d.q_stride);
	layout(32, 2, 64, false, p.d.k_stride);
	layout(32, 2, 64, false, p.d.v_stride);
	layout(16, 8, 64, false, p.d.o_stride);
	p.d.lse_stride[0] = 8 * 16;
	p.d.lse_stride[1] = 16;
	p.d.lse_stride[2] = 1;
	return p.d;
}

/* Check d, expect status st and the exact detail text. */
static void check_desc_says(const struct fa_attn_fwd_desc *d, fa_status st, const char *text)
{
	char err[160];
	memset(err, 'x', sizeof(err));
	fa_status got = fa_attn_fwd_check(d, err, sizeof(err));
	if (got != st || strcmp(err, text) != 0) {
		print_error("got %s \"%s\", want %s \"%s\"\n", fa_status_name(got), err,
		            fa_status_name(st), text);
		fail();
	}
}

static void test_check_accepts_a_valid_descriptor(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc d = good_desc();
	check_desc_says(&d, FA_OK, "");
	d.D = 8;
	check_desc_says(&d, FA_OK, "");
	d.D = 256;
	d.Hkv = 8; /* MHA */
	d.precision = FA_PREC_BF16;
	d.mask = FA_MASK_NONE;
	d.scale = -3.0; /* negative scales are allowed */
	d.q_stride[0] = 0; /* broadcast over batch */
	check_desc_says(&d, FA_OK, "");
	assert_int_equal(fa_attn_fwd_check(&d, NULL, 0), FA_OK);
}

static void test_check_rejects_each_bad_field_with_its_status(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc d;
#define CASE(field, value, st, text)                                                           \
	do {                                                                                   \
		d = good_desc();                                                               \
		d.field = value;                                                               \
		check_desc_says(&d, st, text);                                                    \
	} while (0)
	CASE(dtype, (fa_dtype)0, FA_EDTYPE, "dtype 0 is unknown (fp16, bf16 or fp32)");
	CASE(dtype, (fa_dtype)4, FA_EDTYPE, "dtype 4 is unknown (fp16, bf16 or fp32)");
	CASE(mask, (fa_mask)3, FA_EINVAL,
	     "mask 3 is unknown (0 none, 1 causal bottom-right, 2 causal top-left)");
	CASE(precision, (fa_precision)5, FA_EINVAL, "precision 5 is unknown");
	CASE(scale, 0.0, FA_EINVAL, "scale is 0 (resolve the default first)");
	CASE(scale, NAN, FA_EINVAL, "scale nan is not finite");
	CASE(scale, INFINITY, FA_EINVAL, "scale inf is not finite");
	CASE(B, 0, FA_ESHAPE, "B 0 must be >= 1");
	CASE(Sq, -1, FA_ESHAPE, "Sq -1 must be >= 1");
	CASE(Sk, 0, FA_ESHAPE, "Sk 0 must be >= 1");
	CASE(Hq, 0, FA_ESHAPE, "Hq 0 must be >= 1");
	CASE(Hkv, 0, FA_ESHAPE, "Hkv 0 must be >= 1");
	CASE(D, 0, FA_ESHAPE, "head dim 0 must be >= 1");
	CASE(D, 12, FA_ESHAPE, "head dim 12 is not a multiple of 8");
	CASE(D, 7, FA_ESHAPE, "head dim 7 is not a multiple of 8");
	CASE(D, 264, FA_ESHAPE, "head dim 264 is above 256");
	CASE(Hkv, 3, FA_ESHAPE, "Hq 8 is not a multiple of Hkv 3");
	CASE(Hkv, 16, FA_ESHAPE, "Hq 8 is not a multiple of Hkv 16");
	CASE(q_stride[1], -512, FA_EINVAL, "q seq stride is -512: strides must be >= 0");
	CASE(k_stride[2], -1, FA_EINVAL, "k head stride is -1: strides must be >= 0");
	CASE(v_stride[0], -4, FA_EINVAL, "v batch stride is -4: strides must be >= 0");
	CASE(o_stride[1], -8, FA_EINVAL, "o seq stride is -8: strides must be >= 0");
	CASE(lse_stride[2], -1, FA_EINVAL, "lse seq stride is -1: strides must be >= 0");
	CASE(Sq, INT64_C(1) << 60, FA_ESHAPE,
	     "q has more than 2^63 elements (B 2, Sq 1152921504606846976, Hq 8, D 64)");
	CASE(Sk, INT64_C(1) << 60, FA_ESHAPE,
	     "k has more than 2^63 elements (B 2, Sk 1152921504606846976, Hkv 2, D 64)");
#undef CASE
	/* the required message of the design: Hq 6 with Hkv 4 */
	d = good_desc();
	d.Hq = 6;
	d.Hkv = 4;
	check_desc_says(&d, FA_ESHAPE, "Hq 6 is not a multiple of Hkv 4");
	char err[8];
	assert_int_equal(fa_attn_fwd_check(NULL, err, sizeof(err)), FA_EINVAL);
	assert_string_equal(err, "no desc"); /* truncated to the buffer, still terminated */
	assert_int_equal(fa_attn_fwd_check(&d, NULL, 0), FA_ESHAPE);
}

static void test_mask_allows_matches_both_alignments(void **state)
{
	(void)state;
	/* Sq 2, Sk 4: bottom-right row 0 sees keys 0..2, top-left row 0 sees key 0 only */
	assert_true(fa_mask_allows(FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 0, 2));
	assert_false(fa_mask_allows(FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 0, 3));
	assert_true(fa_mask_allows(FA_MASK_CAUSAL_TOP_LEFT, 2, 4, 0, 0));
	assert_false(fa_mask_allows(FA_MASK_CAUSAL_TOP_LEFT, 2, 4, 0, 1));
	/* Sq 4, Sk 2: bottom-right row 1 sees nothing, row 2 sees key 0 */
	assert_false(fa_mask_allows(FA_MASK_CAUSAL_BOTTOM_RIGHT, 4, 2, 1, 0));
	assert_true(fa_mask_allows(FA_MASK_CAUSAL_BOTTOM_RIGHT, 4, 2, 2, 0));
	assert_true(fa_mask_allows(FA_MASK_NONE, 4, 2, 0, 1));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ref_single_key_gives_v),
		cmocka_unit_test(test_ref_equal_scores_give_mean_of_v),
		cmocka_unit_test(test_ref_hand_computed_case_with_scale),
		cmocka_unit_test(test_ref_matches_naive_formula),
		cmocka_unit_test(test_ref_lse_is_log_of_summed_exp_scores),
		cmocka_unit_test(test_ref_large_scores_stay_finite),
		cmocka_unit_test(test_ref_key_permutation_leaves_o_unchanged),
		cmocka_unit_test(test_ref_o_rows_are_convex_combinations_of_v),
		cmocka_unit_test(test_ref_causal_top_left_row0_is_v_row0),
		cmocka_unit_test(test_ref_causal_bottom_right_with_fewer_queries),
		cmocka_unit_test(test_ref_fully_masked_rows_give_zero_and_minus_inf),
		cmocka_unit_test(test_ref_masked_keys_do_not_leak),
		cmocka_unit_test(test_ref_gqa_equals_mha_with_repeated_kv_heads),
		cmocka_unit_test(test_ref_bshd_and_bhsd_layouts_give_identical_o),
		cmocka_unit_test(test_ref_half_outputs_are_rounded_oracle),
		cmocka_unit_test(test_ref_bh_split_matches_one_call),
		cmocka_unit_test(test_ref_key_chunks_give_the_same_result),
		cmocka_unit_test(test_ref_scratch_limit_below_one_key_is_enomem),
		cmocka_unit_test(test_ref_rejects_bad_arguments),
		cmocka_unit_test(test_rel_error_measures_and_rejects_non_finite),
		cmocka_unit_test(test_rel_error_sees_nan_in_half_outputs),
		cmocka_unit_test(test_extent_of_contiguous_and_strided_tensors),
		cmocka_unit_test(test_extent_rejects_overflow_and_bad_sizes),
		cmocka_unit_test(test_check_accepts_a_valid_descriptor),
		cmocka_unit_test(test_check_rejects_each_bad_field_with_its_status),
		cmocka_unit_test(test_mask_allows_matches_both_alignments),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
