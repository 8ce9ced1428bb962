/* test_attn_bwd_ref.c - the backward CPU reference against finite differences of the forward
 * reference, the invariants of masked rows and keys, its rounding, its splits, and the descriptor
 * check with its statuses and texts.
 *
 * The finite differences are the independent oracle: L = sum(G * O(q, k, v)) in float64 through
 * fa_attn_fwd_ref64, so dL/dq = dQ with dO = G. The inputs are fp32 multiples of 2^-12 in [-2, 2),
 * so x +- 2^-13 and x +- 2^-12 are exact in fp32: the steps are the steps taken. A step of ~1e-6
 * would be lost in the forward's own rounding (L carries ~1e-14 of noise: 1e-8 over the step), so
 * the steps are larger and Richardson's extrapolation (4 D(h) - D(2h)) / 3 cancels the h^2 term:
 * what is left is ~1e-10, well inside the 1e-6 asked.
 * Shapes stay tiny so the sanitizer build runs this in well under a second.
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
#include "fa_attn_bwd.h"

/* ---- a problem in memory ----------------------------------------------------------------- */

struct bprob {
	struct fa_attn_bwd_desc d;
	void *q, *k, *v, *o, *dout;         /* in dtype */
	float *lse;                         /* [B, Hq, Sq] */
	double *o64, *lse64;                /* the forward's float64 oracle, dense */
	void *dq, *dk, *dv;                 /* fa_attn_bwd_ref's, in dtype */
	double *dq64, *dk64, *dv64;         /* fa_attn_bwd_ref64's, dense */
	size_t nq, nk;                      /* elements of q-shaped and k-shaped tensors */
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

/* A problem of inputs in layout `bhsd` and gradients in `grad_bhsd`; scale 0: 1/sqrt(D). */
static void bprob_init(struct bprob *p, fa_dtype dt, int64_t B, int64_t Sq, int64_t Sk,
                       int64_t Hq, int64_t Hkv, int64_t D, fa_mask mask, bool bhsd,
                       bool grad_bhsd, double scale)
{
	memset(p, 0, sizeof(*p));
	struct fa_attn_fwd_desc *f = &p->d.fwd;
	f->dtype = dt;
	f->precision = FA_PREC_IEEE;
	f->mask = mask;
	f->scale = scale != 0 ? scale : 1.0 / sqrt((double)D);
	f->B = B;
	f->Sq = Sq;
	f->Sk = Sk;
	f->Hq = Hq;
	f->Hkv = Hkv;
	f->D = D;
	layout(Sq, Hq, D, bhsd, f->q_stride);
	layout(Sk, Hkv, D, bhsd, f->k_stride);
	layout(Sk, Hkv, D, bhsd, f->v_stride);
	layout(Sq, Hq, D, bhsd, f->o_stride);
	f->lse_stride[0] = Hq * Sq;
	f->lse_stride[1] = Sq;
	f->lse_stride[2] = 1;
	layout(Sq, Hq, D, bhsd, p->d.do_stride);
	layout(Sq, Hq, D, grad_bhsd, p->d.dq_stride);
	layout(Sk, Hkv, D, grad_bhsd, p->d.dk_stride);
	layout(Sk, Hkv, D, grad_bhsd, p->d.dv_stride);
	size_t es = fa_dtype_size(dt);
	p->nq = (size_t)(B * Sq * Hq * D);
	p->nk = (size_t)(B * Sk * Hkv * D);
	p->q = xcalloc(p->nq, es);
	p->k = xcalloc(p->nk, es);
	p->v = xcalloc(p->nk, es);
	p->o = xcalloc(p->nq, es);
	p->dout = xcalloc(p->nq, es);
	p->lse = xcalloc((size_t)(B * Hq * Sq), sizeof(float));
	p->o64 = xcalloc(p->nq, sizeof(double));
	p->lse64 = xcalloc((size_t)(B * Hq * Sq), sizeof(double));
	p->dq = xcalloc(p->nq, es);
	p->dk = xcalloc(p->nk, es);
	p->dv = xcalloc(p->nk, es);
	p->dq64 = xcalloc(p->nq, sizeof(double));
	p->dk64 = xcalloc(p->nk, sizeof(double));
	p->dv64 = xcalloc(p->nk, sizeof(double));
}

static void bprob_free(struct bprob *p)
{
	void *all[] = {p->q,   p->k,     p->v,  p->o,  p->dout, p->lse,  p->o64,
	               p->lse64, p->dq, p->dk, p->dv, p->dq64, p->dk64, p->dv64};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(all[i]);
}

/* Element offsets of logical [b, s, h, x] through a stride triple. */
static int64_t off3(const int64_t st[3], int64_t b, int64_t s, int64_t h, int64_t x)
{
	return st[0] * b + st[1] * s + st[2] * h + x;
}

/* Dense indices of [b, s, h, x]: q-shaped and k-shaped. */
static size_t idx_q(const struct bprob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	const struct fa_attn_fwd_desc *f = &p->d.fwd;
	return (size_t)(((b * f->Sq + s) * f->Hq + h) * f->D + x);
}
static size_t idx_k(const struct bprob *p, int64_t b, int64_t s, int64_t h, int64_t x)
{
	const struct fa_attn_fwd_desc *f = &p->d.fwd;
	return (size_t)(((b * f->Sk + s) * f->Hkv + h) * f->D + x);
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

/* A multiple of 2^-12 in [-2, 2): exact in fp32, and x +- 2^-20 stays exact. */
static double rnd_grid(uint64_t *s)
{
	return floor(rnd(s, 2.0) * 4096.0) / 4096.0;
}

/* Fill Q, K, V and dO (= G) with random grid values, rounded to the dtype as they are stored. */
static void bprob_fill(struct bprob *p, uint64_t seed)
{
	const struct fa_attn_fwd_desc *f = &p->d.fwd;
	for (int64_t b = 0; b < f->B; b++)
		for (int64_t x = 0; x < f->D; x++) {
			for (int64_t s = 0; s < f->Sq; s++)
				for (int64_t h = 0; h < f->Hq; h++) {
					fa_store_elem(p->q, f->dtype, off3(f->q_stride, b, s, h, x),
					              rnd_grid(&seed));
					fa_store_elem(p->dout, f->dtype, off3(p->d.do_stride, b, s, h, x),
					              rnd_grid(&seed));
				}
			for (int64_t s = 0; s < f->Sk; s++)
				for (int64_t h = 0; h < f->Hkv; h++) {
					fa_store_elem(p->k, f->dtype, off3(f->k_stride, b, s, h, x),
					              rnd_grid(&seed));
					fa_store_elem(p->v, f->dtype, off3(f->v_stride, b, s, h, x),
					              rnd_grid(&seed));
				}
		}
}

/* Fill a buffer of n elements of dtype dt with NaN: outputs poisoned before a call. */
static void poison(void *buf, fa_dtype dt, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fa_store_elem(buf, dt, (int64_t)i, NAN);
}

/* The forward (both entry points), then both backward entry points: the dtype one on the
 * forward's O and fp32 lse, the oracle on its float64 ones. Outputs are poisoned first. */
static void bprob_run(struct bprob *p)
{
	const struct fa_attn_fwd_desc *f = &p->d.fwd;
	assert_int_equal(fa_attn_fwd_ref(f, p->q, p->k, p->v, p->o, p->lse, 0, f->B * f->Hq), FA_OK);
	assert_int_equal(fa_attn_fwd_ref64(f, p->q, p->k, p->v, p->o64, p->lse64), FA_OK);
	poison(p->dq, f->dtype, p->nq);
	poison(p->dk, f->dtype, p->nk);
	poison(p->dv, f->dtype, p->nk);
	for (size_t i = 0; i < p->nq; i++)
		p->dq64[i] = NAN;
	for (size_t i = 0; i < p->nk; i++)
		p->dk64[i] = p->dv64[i] = NAN;
	assert_int_equal(fa_attn_bwd_ref(&p->d, p->q, p->k, p->v, p->o, p->dout, p->lse, p->dq,
	                                 p->dk, p->dv, 0, f->B * f->Hkv),
	                 FA_OK);
	assert_int_equal(fa_attn_bwd_ref64(&p->d, p->q, p->k, p->v, p->o64, p->dout, p->lse64,
	                                   p->dq64, p->dk64, p->dv64),
	                 FA_OK);
}

/* ---- finite differences ------------------------------------------------------------------ */

/* L = sum(G * O) with O from the float64 forward oracle and G = dO as stored. */
static double loss(const struct bprob *p, double *o64)
{
	const struct fa_attn_fwd_desc *f = &p->d.fwd;
	assert_int_equal(fa_attn_fwd_ref64(f, p->q, p->k, p->v, o64, NULL), FA_OK);
	double L = 0;
	for (int64_t b = 0; b < f->B; b++)
		for (int64_t s = 0; s < f->Sq; s++)
			for (int64_t h = 0; h < f->Hq; h++)
				for (int64_t x = 0; x < f->D; x++)
					L += fa_load_elem(p->dout, f->dtype, off3(p->d.do_stride, b, s, h, x)) *
					     o64[idx_q(p, b, s, h, x)];
	return L;
}

/* Compare the oracle's gradient of one input (t: 0 q, 1 k, 2 v) with the extrapolated central
 * differences of L:
 * elementwise within 1e-6 of max(|g|, 1e-3 * max|g|) (plus 1e-10 for exact zeros), and the
 * relative Frobenius error of the whole tensor within 1e-6. */
static void check_fd(struct bprob *p, int t, double *o64)
{
	const struct fa_attn_fwd_desc *f = &p->d.fwd;
	static const char *const names[3] = {"dq", "dk", "dv"};
	const double h = 0x1p-13;
	void *in = t == 0 ? p->q : t == 1 ? p->k : p->v;
	const int64_t *st = t == 0 ? f->q_stride : t == 1 ? f->k_stride : f->v_stride;
	const double *g = t == 0 ? p->dq64 : t == 1 ? p->dk64 : p->dv64;
	int64_t S = t == 0 ? f->Sq : f->Sk, H = t == 0 ? f->Hq : f->Hkv;
	size_t n = t == 0 ? p->nq : p->nk;
	double gmax = 0, num = 0, den = 0;

	for (size_t i = 0; i < n; i++)
		gmax = fmax(gmax, fabs(g[i]));
	for (int64_t b = 0; b < f->B; b++)
		for (int64_t s = 0; s < S; s++)
			for (int64_t hh = 0; hh < H; hh++)
				for (int64_t x = 0; x < f->D; x++) {
					int64_t e = off3(st, b, s, hh, x);
					double x0 = fa_load_elem(in, f->dtype, e), cd[2];
					for (int w = 0; w < 2; w++) {
						double step = h * (w + 1);
						fa_store_elem(in, f->dtype, e, x0 + step);
						double lp = loss(p, o64);
						fa_store_elem(in, f->dtype, e, x0 - step);
						double lm = loss(p, o64);
						cd[w] = (lp - lm) / (2 * step);
					}
					fa_store_elem(in, f->dtype, e, x0);
					double fd = (4 * cd[0] - cd[1]) / 3;
					double gi = g[t == 0 ? idx_q(p, b, s, hh, x) : idx_k(p, b, s, hh, x)];
					double tol = 1e-6 * fmax(fabs(gi), 1e-3 * gmax) + 1e-10;
					if (!(fabs(fd - gi) <= tol)) {
						print_error("%s [b %lld, s %lld, h %lld, x %lld]: reference %.17g, "
						            "finite difference %.17g (tol %g)\n",
						            names[t], (long long)b, (long long)s, (long long)hh,
						            (long long)x, gi, fd, tol);
						fail();
					}
					num += (fd - gi) * (fd - gi);
					den += gi * gi;
				}
	if (den > 0 && !(sqrt(num / den) <= 1e-6)) {
		print_error("%s: relative error %g against finite differences\n", names[t],
		            sqrt(num / den));
		fail();
	}
}

/* One finite-difference case: fp32 inputs, every gradient of the oracle checked. */
struct fd_case {
	int64_t B, Sq, Sk, Hq, Hkv, D;
	bool bhsd, grad_bhsd;
	double scale; /* 0: the default */
};

static void run_fd_cases(fa_mask mask)
{
	static const struct fd_case cases[] = {
		{1, 3, 5, 4, 2, 8, false, false, 0},    /* GQA 2, Sq < Sk */
		{2, 5, 3, 2, 2, 16, true, false, 0.7},  /* MHA, Sq > Sk, BHSD in, BSHD out */
		{1, 1, 5, 4, 1, 8, true, true, -0.4},   /* MQA, one query row */
		{2, 5, 1, 4, 2, 8, false, true, 0},     /* one key */
		{1, 3, 3, 2, 1, 16, false, false, 1.3}, /* Sq == Sk */
	};
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		const struct fd_case *k = &cases[c];
		struct bprob p;
		bprob_init(&p, FA_DTYPE_FP32, k->B, k->Sq, k->Sk, k->Hq, k->Hkv, k->D, mask, k->bhsd,
		           k->grad_bhsd, k->scale);
		bprob_fill(&p, 100 + c);
		bprob_run(&p);
		double *o64 = xcalloc(p.nq, sizeof(double));
		for (int t = 0; t < 3; t++)
			check_fd(&p, t, o64);
		free(o64);
		bprob_free(&p);
	}
}

static void test_bwd_ref_matches_finite_differences_without_mask(void **state)
{
	(void)state;
	run_fd_cases(FA_MASK_NONE);
}

static void test_bwd_ref_matches_finite_differences_with_causal_bottom_right(void **state)
{
	(void)state;
	run_fd_cases(FA_MASK_CAUSAL_BOTTOM_RIGHT);
}

static void test_bwd_ref_matches_finite_differences_with_causal_top_left(void **state)
{
	(void)state;
	run_fd_cases(FA_MASK_CAUSAL_TOP_LEFT);
}

/* The sliding window (masks combined, (0, 0), one side unbounded) and the softcap (alone and
 * with a window), against finite differences of the forward reference, which applies both. */
static void test_bwd_ref_matches_finite_differences_with_windows_and_softcap(void **state)
{
	(void)state;
	static const struct {
		fa_mask mask;
		bool window;
		int64_t wl, wr;
		double cap;
	} w[] = {
		{FA_MASK_NONE, true, 0, 0, 0},
		{FA_MASK_NONE, true, 1, 1, 0},
		{FA_MASK_CAUSAL_BOTTOM_RIGHT, true, 2, -1, 0},
		{FA_MASK_CAUSAL_TOP_LEFT, true, -1, 1, 0},
		{FA_MASK_NONE, false, 0, 0, 2.5},
		{FA_MASK_CAUSAL_BOTTOM_RIGHT, true, 1, 0, 0.8},
	};
	static const struct fd_case cases[] = {
		{1, 3, 5, 4, 2, 8, false, false, 0},
		{2, 5, 3, 2, 2, 16, true, false, 0.7},
		{1, 4, 4, 2, 1, 8, false, true, -0.9},
	};
	for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
		for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
			const struct fd_case *k = &cases[c];
			struct bprob p;
			bprob_init(&p, FA_DTYPE_FP32, k->B, k->Sq, k->Sk, k->Hq, k->Hkv, k->D, w[i].mask,
			           k->bhsd, k->grad_bhsd, k->scale);
			p.d.fwd.window = w[i].window;
			p.d.fwd.window_left = w[i].wl;
			p.d.fwd.window_right = w[i].wr;
			p.d.fwd.softcap = w[i].cap;
			bprob_fill(&p, 300 + 10 * i + c);
			bprob_run(&p);
			double *o64 = xcalloc(p.nq, sizeof(double));
			for (int t = 0; t < 3; t++)
				check_fd(&p, t, o64);
			free(o64);
			bprob_free(&p);
		}
}

/* ---- masked rows and keys ---------------------------------------------------------------- */

/* Only bottom-right alignment with Sq > Sk hides every key from a row (rows i < Sq - Sk); top-left
 * row i always sees key 0. Those rows get dQ = 0, and what they hold changes no other gradient. */
static void test_bwd_ref_fully_masked_rows_get_zero_and_give_nothing(void **state)
{
	(void)state;
	struct bprob p, top;
	bprob_init(&top, FA_DTYPE_FP32, 1, 5, 3, 2, 1, 8, FA_MASK_CAUSAL_TOP_LEFT, false, false, 0);
	bprob_fill(&top, 7);
	bprob_run(&top);
	for (size_t i = 0; i < 10; i++)
		assert_true(isfinite(top.lse64[i]));
	bprob_free(&top);

	bprob_init(&p, FA_DTYPE_BF16, 1, 5, 3, 2, 1, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT, false, false, 0);
	bprob_fill(&p, 7);
	bprob_run(&p);
	double *dk64 = xcalloc(p.nk, sizeof(double)), *dv64 = xcalloc(p.nk, sizeof(double));
	double *dq64 = xcalloc(p.nq, sizeof(double));
	memcpy(dk64, p.dk64, p.nk * sizeof(double));
	memcpy(dv64, p.dv64, p.nk * sizeof(double));
	memcpy(dq64, p.dq64, p.nq * sizeof(double));
	uint64_t seed = 99;
	for (int64_t h = 0; h < 2; h++)
		for (int64_t i = 0; i < 2; i++) {
			assert_true(p.lse64[h * 5 + i] == -INFINITY);
			assert_true(p.lse[h * 5 + i] == -INFINITY);
			for (int64_t x = 0; x < 8; x++) {
				assert_true(p.dq64[idx_q(&p, 0, i, h, x)] == 0);
				assert_true(fa_load_elem(p.dq, FA_DTYPE_BF16,
				                         off3(p.d.dq_stride, 0, i, h, x)) == 0);
				/* new Q and dO in the masked rows */
				fa_store_elem(p.q, FA_DTYPE_BF16, off3(p.d.fwd.q_stride, 0, i, h, x),
				              rnd(&seed, 2.0));
				fa_store_elem(p.dout, FA_DTYPE_BF16, off3(p.d.do_stride, 0, i, h, x),
				              rnd(&seed, 2.0));
			}
		}
	bprob_run(&p);
	assert_memory_equal(dk64, p.dk64, p.nk * sizeof(double));
	assert_memory_equal(dv64, p.dv64, p.nk * sizeof(double));
	assert_memory_equal(dq64, p.dq64, p.nq * sizeof(double));
	free(dk64);
	free(dv64);
	free(dq64);
	bprob_free(&p);
}

/* A row whose lse is -inf contributes nothing even where keys are visible: dQ = 0, and dK, dV are
 * those of the same problem with that row's dO zeroed (which contributes exactly 0). */
static void test_bwd_ref_rows_with_minus_inf_lse_contribute_nothing(void **state)
{
	(void)state;
	struct bprob p;
	bprob_init(&p, FA_DTYPE_FP32, 1, 3, 4, 2, 1, 8, FA_MASK_NONE, false, false, 0);
	bprob_fill(&p, 11);
	bprob_run(&p);
	const int64_t h = 1, i = 2; /* lse index h * Sq + i */
	for (int64_t x = 0; x < 8; x++)
		fa_store_elem(p.dout, FA_DTYPE_FP32, off3(p.d.do_stride, 0, i, h, x), 0.0);
	assert_int_equal(fa_attn_bwd_ref64(&p.d, p.q, p.k, p.v, p.o64, p.dout, p.lse64, p.dq64,
	                                   p.dk64, p.dv64),
	                 FA_OK);
	double *dk64 = xcalloc(p.nk, sizeof(double)), *dv64 = xcalloc(p.nk, sizeof(double));
	memcpy(dk64, p.dk64, p.nk * sizeof(double));
	memcpy(dv64, p.dv64, p.nk * sizeof(double));

	bprob_fill(&p, 11); /* dO back as it was */
	p.lse64[h * 3 + i] = -INFINITY;
	p.lse[h * 3 + i] = -INFINITY;
	poison(p.dq, FA_DTYPE_FP32, p.nq);
	assert_int_equal(fa_attn_bwd_ref64(&p.d, p.q, p.k, p.v, p.o64, p.dout, p.lse64, p.dq64,
	                                   p.dk64, p.dv64),
	                 FA_OK);
	assert_int_equal(fa_attn_bwd_ref(&p.d, p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv, 0,
	                                 1),
	                 FA_OK);
	for (int64_t x = 0; x < 8; x++) {
		assert_true(p.dq64[idx_q(&p, 0, i, h, x)] == 0);
		assert_true(fa_load_elem(p.dq, FA_DTYPE_FP32, off3(p.d.dq_stride, 0, i, h, x)) == 0);
	}
	for (size_t e = 0; e < p.nk; e++) {
		assert_true(p.dk64[e] == dk64[e]);
		assert_true(p.dv64[e] == dv64[e]);
	}
	free(dk64);
	free(dv64);
	bprob_free(&p);
}

/* Top-left with Sq 2 < Sk 5: keys 2..4 are seen by no row; their gradients are written as zeros
 * (over poisoned outputs), and the keys themselves are never read into a result. */
static void test_bwd_ref_keys_no_row_sees_get_zero_gradients(void **state)
{
	(void)state;
	struct bprob p;
	bprob_init(&p, FA_DTYPE_FP16, 2, 2, 5, 2, 2, 8, FA_MASK_CAUSAL_TOP_LEFT, true, false, 0);
	bprob_fill(&p, 5);
	bprob_run(&p);
	for (int64_t b = 0; b < 2; b++)
		for (int64_t j = 2; j < 5; j++)
			for (int64_t h = 0; h < 2; h++)
				for (int64_t x = 0; x < 8; x++) {
					assert_true(p.dk64[idx_k(&p, b, j, h, x)] == 0);
					assert_true(p.dv64[idx_k(&p, b, j, h, x)] == 0);
					assert_true(fa_load_elem(p.dk, FA_DTYPE_FP16,
					                         off3(p.d.dk_stride, b, j, h, x)) == 0);
					assert_true(fa_load_elem(p.dv, FA_DTYPE_FP16,
					                         off3(p.d.dv_stride, b, j, h, x)) == 0);
				}
	double *dq64 = xcalloc(p.nq, sizeof(double));
	memcpy(dq64, p.dq64, p.nq * sizeof(double));
	for (int64_t x = 0; x < 8; x++)
		fa_store_elem(p.k, FA_DTYPE_FP16, off3(p.d.fwd.k_stride, 1, 4, 1, x), NAN);
	bprob_run(&p);
	assert_memory_equal(dq64, p.dq64, p.nq * sizeof(double));
	free(dq64);
	bprob_free(&p);
}

/* ---- outputs in dtype -------------------------------------------------------------------- */

/* Relative Frobenius error of a gradient in dtype (strided) against a dense float64 one. */
static double grad_rel_error(const struct bprob *p, const void *x, const int64_t st[3],
                             const double *ref, bool kshape)
{
	const struct fa_attn_fwd_desc *f = &p->d.fwd;
	int64_t S = kshape ? f->Sk : f->Sq, H = kshape ? f->Hkv : f->Hq;
	double num = 0, den = 0;
	for (int64_t b = 0; b < f->B; b++)
		for (int64_t s = 0; s < S; s++)
			for (int64_t h = 0; h < H; h++)
				for (int64_t e = 0; e < f->D; e++) {
					double xv = fa_load_elem(x, f->dtype, off3(st, b, s, h, e));
					double r = ref[kshape ? idx_k(p, b, s, h, e) : idx_q(p, b, s, h, e)];
					num += (xv - r) * (xv - r);
					den += r * r;
				}
	return den > 0 ? sqrt(num / den) : (num == 0 ? 0 : INFINITY);
}

/* fp32 gradients from fp32 O and lse: fp32-level agreement with the exact oracle. */
static void test_bwd_ref_fp32_outputs_agree_with_the_float64_oracle(void **state)
{
	(void)state;
	struct bprob p;
	bprob_init(&p, FA_DTYPE_FP32, 2, 5, 7, 4, 2, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT, false, true, 0);
	bprob_fill(&p, 3);
	bprob_run(&p);
	assert_true(grad_rel_error(&p, p.dq, p.d.dq_stride, p.dq64, false) < 1e-5);
	assert_true(grad_rel_error(&p, p.dk, p.d.dk_stride, p.dk64, true) < 1e-5);
	assert_true(grad_rel_error(&p, p.dv, p.d.dv_stride, p.dv64, true) < 1e-5);
	bprob_free(&p);
}

/* Fed the O and lse that fa_attn_bwd_ref reads (converted to float64), the oracle computes the
 * same values; the dtype outputs are exactly those rounded once by fa_store_elem. */
static void check_rounded_oracle(fa_dtype dt)
{
	struct bprob p;
	bprob_init(&p, dt, 2, 3, 5, 4, 2, 16, FA_MASK_NONE, true, false, 0.5);
	bprob_fill(&p, 21);
	bprob_run(&p);
	const struct fa_attn_fwd_desc *f = &p.d.fwd;
	for (int64_t b = 0; b < 2; b++)
		for (int64_t s = 0; s < 3; s++)
			for (int64_t h = 0; h < 4; h++) {
				for (int64_t x = 0; x < 16; x++)
					p.o64[idx_q(&p, b, s, h, x)] =
						fa_load_elem(p.o, dt, off3(f->o_stride, b, s, h, x));
				p.lse64[(b * 4 + h) * 3 + s] = p.lse[(b * 4 + h) * 3 + s];
			}
	assert_int_equal(fa_attn_bwd_ref64(&p.d, p.q, p.k, p.v, p.o64, p.dout, p.lse64, p.dq64,
	                                   p.dk64, p.dv64),
	                 FA_OK);
	size_t es = fa_dtype_size(dt);
	unsigned char want[4], got[4];
	for (int t = 0; t < 3; t++) {
		bool ks = t > 0;
		const void *out = t == 0 ? p.dq : t == 1 ? p.dk : p.dv;
		const double *ref = t == 0 ? p.dq64 : t == 1 ? p.dk64 : p.dv64;
		const int64_t *st = t == 0 ? p.d.dq_stride : t == 1 ? p.d.dk_stride : p.d.dv_stride;
		int64_t S = ks ? 5 : 3, H = ks ? 2 : 4;
		double nonzero = 0;
		for (int64_t b = 0; b < 2; b++)
			for (int64_t s = 0; s < S; s++)
				for (int64_t h = 0; h < H; h++)
					for (int64_t x = 0; x < 16; x++) {
						double r = ref[ks ? idx_k(&p, b, s, h, x) : idx_q(&p, b, s, h, x)];
						fa_store_elem(want, dt, 0, r);
						memcpy(got, (const unsigned char *)out +
						                    (size_t)off3(st, b, s, h, x) * es,
						       es);
						assert_memory_equal(want, got, es);
						nonzero += fabs(r);
					}
		assert_true(nonzero > 0);
	}
	bprob_free(&p);
}

static void test_bwd_ref_half_and_fp32_outputs_are_the_rounded_oracle(void **state)
{
	(void)state;
	check_rounded_oracle(FA_DTYPE_FP16);
	check_rounded_oracle(FA_DTYPE_BF16);
	check_rounded_oracle(FA_DTYPE_FP32);
}

/* ---- GQA, splits, chunks ----------------------------------------------------------------- */

/* GQA's dK, dV are the sums over each group of MHA's with the kv heads repeated; dQ is MHA's. */
static void test_bwd_ref_gqa_sums_the_gradients_of_repeated_kv_heads(void **state)
{
	(void)state;
	struct bprob g, m;
	bprob_init(&g, FA_DTYPE_FP32, 1, 4, 6, 6, 2, 8, FA_MASK_CAUSAL_TOP_LEFT, false, false, 0);
	bprob_init(&m, FA_DTYPE_FP32, 1, 4, 6, 6, 6, 8, FA_MASK_CAUSAL_TOP_LEFT, false, false, 0);
	bprob_fill(&g, 31);
	memcpy(m.q, g.q, g.nq * sizeof(float));
	memcpy(m.dout, g.dout, g.nq * sizeof(float));
	for (int64_t s = 0; s < 6; s++)
		for (int64_t h = 0; h < 6; h++)
			for (int64_t x = 0; x < 8; x++) {
				int64_t src = off3(g.d.fwd.k_stride, 0, s, h / 3, x);
				((float *)m.k)[off3(m.d.fwd.k_stride, 0, s, h, x)] = ((float *)g.k)[src];
				((float *)m.v)[off3(m.d.fwd.v_stride, 0, s, h, x)] = ((float *)g.v)[src];
			}
	bprob_run(&g);
	bprob_run(&m);
	for (size_t i = 0; i < g.nq; i++)
		assert_true(fabs(g.dq64[i] - m.dq64[i]) <= 1e-12 * fmax(1, fabs(m.dq64[i])));
	for (int64_t s = 0; s < 6; s++)
		for (int64_t kvh = 0; kvh < 2; kvh++)
			for (int64_t x = 0; x < 8; x++) {
				double sk = 0, sv = 0;
				for (int64_t h = kvh * 3; h < kvh * 3 + 3; h++) {
					sk += m.dk64[idx_k(&m, 0, s, h, x)];
					sv += m.dv64[idx_k(&m, 0, s, h, x)];
				}
				double gk = g.dk64[idx_k(&g, 0, s, kvh, x)], gv = g.dv64[idx_k(&g, 0, s, kvh, x)];
				assert_true(fabs(gk - sk) <= 1e-12 * fmax(1, fabs(sk)));
				assert_true(fabs(gv - sv) <= 1e-12 * fmax(1, fabs(sv)));
			}
	bprob_free(&g);
	bprob_free(&m);
}

/* The (batch, kv head) split, in any order, gives the bits of one call. */
static void test_bwd_ref_bkv_split_matches_one_call(void **state)
{
	(void)state;
	struct bprob p;
	bprob_init(&p, FA_DTYPE_BF16, 2, 5, 3, 4, 2, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT, false, false, 0);
	bprob_fill(&p, 41);
	bprob_run(&p);
	size_t nq = p.nq * 2, nk = p.nk * 2;
	void *dq = xcalloc(nq, 1), *dk = xcalloc(nk, 1), *dv = xcalloc(nk, 1);
	poison(dq, FA_DTYPE_BF16, p.nq);
	poison(dk, FA_DTYPE_BF16, p.nk);
	poison(dv, FA_DTYPE_BF16, p.nk);
	static const int64_t order[4] = {3, 0, 2, 1};
	for (int r = 0; r < 4; r++)
		assert_int_equal(fa_attn_bwd_ref(&p.d, p.q, p.k, p.v, p.o, p.dout, p.lse, dq, dk, dv,
		                                 order[r], order[r] + 1),
		                 FA_OK);
	assert_memory_equal(dq, p.dq, nq);
	assert_memory_equal(dk, p.dk, nk);
	assert_memory_equal(dv, p.dv, nk);
	assert_int_equal(fa_attn_bwd_ref(&p.d, p.q, p.k, p.v, p.o, p.dout, p.lse, dq, dk, dv, 2, 2),
	                 FA_OK); /* an empty range */
	free(dq);
	free(dk);
	free(dv);
	bprob_free(&p);
}

/* Scratch words of a call, as attn_bwd_ref.c counts them: a block of br = min(Sq, 32) rows at
 * D <= 64 (3 br D + 4 br: Q, dO, dQ, delta, lse and each row's key range) plus 4 D per key. */
static size_t bwd_words(int64_t Sq, int64_t D, int64_t keys)
{
	size_t br = (size_t)(Sq < 32 ? Sq : 32);
	return 3 * br * (size_t)D + 4 * br + 4 * (size_t)D * (size_t)keys;
}

/* Key chunks of 1, 2 and 3 keys (two passes) give the bits of one chunk (one pass). */
static void test_bwd_ref_key_chunks_give_the_same_result(void **state)
{
	(void)state;
	struct bprob p;
	bprob_init(&p, FA_DTYPE_FP32, 1, 6, 7, 4, 2, 8, FA_MASK_CAUSAL_TOP_LEFT, false, false, 0);
	bprob_fill(&p, 51);
	bprob_run(&p);
	double *dq = xcalloc(p.nq, sizeof(double)), *dk = xcalloc(p.nk, sizeof(double)),
	       *dv = xcalloc(p.nk, sizeof(double));
	for (int64_t kc = 1; kc <= 3; kc++) {
		size_t old = fa_attn_fwd_ref_scratch_limit(bwd_words(6, 8, kc) * 8);
		fa_status st = fa_attn_bwd_ref64(&p.d, p.q, p.k, p.v, p.o64, p.dout, p.lse64, dq, dk,
		                                 dv);
		fa_attn_fwd_ref_scratch_limit(old);
		assert_int_equal(st, FA_OK);
		assert_memory_equal(dq, p.dq64, p.nq * sizeof(double));
		assert_memory_equal(dk, p.dk64, p.nk * sizeof(double));
		assert_memory_equal(dv, p.dv64, p.nk * sizeof(double));
	}
	size_t old = fa_attn_fwd_ref_scratch_limit(bwd_words(6, 8, 1) * 8 - 8);
	fa_status st = fa_attn_bwd_ref64(&p.d, p.q, p.k, p.v, p.o64, p.dout, p.lse64, dq, dk, dv);
	fa_attn_fwd_ref_scratch_limit(old);
	assert_int_equal(st, FA_ENOMEM);
	free(dq);
	free(dk);
	free(dv);
	bprob_free(&p);
}

/* ---- arguments and the descriptor check -------------------------------------------------- */

static void test_bwd_ref_rejects_bad_arguments(void **state)
{
	(void)state;
	struct bprob p;
	bprob_init(&p, FA_DTYPE_FP32, 1, 2, 3, 2, 1, 8, FA_MASK_NONE, false, false, 0);
	bprob_fill(&p, 1);
	bprob_run(&p);
	const struct fa_attn_bwd_desc *d = &p.d;
	void *a[9] = {p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv};
	for (int n = 0; n < 9; n++) {
		void *b[9];
		memcpy(b, a, sizeof(b));
		b[n] = NULL; /* lse (n == 5) included: the backward needs it */
		assert_int_equal(fa_attn_bwd_ref(d, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8],
		                                 0, 1),
		                 FA_EINVAL);
	}
	assert_int_equal(fa_attn_bwd_ref(NULL, p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv, 0,
	                                 1),
	                 FA_EINVAL);
	assert_int_equal(fa_attn_bwd_ref(d, p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv, 0, 2),
	                 FA_EINVAL); /* B * Hkv is 1 */
	assert_int_equal(fa_attn_bwd_ref(d, p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv, -1,
	                                 1),
	                 FA_EINVAL);
	assert_int_equal(fa_attn_bwd_ref(d, p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv, 1, 0),
	                 FA_EINVAL);
	assert_int_equal(fa_attn_bwd_ref64(d, p.q, p.k, p.v, p.o64, p.dout, NULL, p.dq64, p.dk64,
	                                   p.dv64),
	                 FA_EINVAL);
	assert_int_equal(fa_attn_bwd_ref64(d, p.q, p.k, p.v, p.o64, NULL, p.lse64, p.dq64, p.dk64,
	                                   p.dv64),
	                 FA_EINVAL);
	struct fa_attn_bwd_desc bad = p.d;
	bad.fwd.D = 12;
	assert_int_equal(fa_attn_bwd_ref(&bad, p.q, p.k, p.v, p.o, p.dout, p.lse, p.dq, p.dk, p.dv, 0,
	                                 1),
	                 FA_ESHAPE);
	bad = p.d;
	bad.dv_stride[1] = -1;
	assert_int_equal(fa_attn_bwd_ref64(&bad, p.q, p.k, p.v, p.o64, p.dout, p.lse64, p.dq64,
	                                   p.dk64, p.dv64),
	                 FA_EINVAL);
	bprob_free(&p);
}

static struct fa_attn_bwd_desc good_desc(void)
{
	struct bprob p;
	memset(&p, 0, sizeof(p));
	struct fa_attn_fwd_desc *f = &p.d.fwd;
	f->dtype = FA_DTYPE_BF16;
	f->precision = FA_PREC_DEFAULT;
	f->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	f->scale = 0.125;
	f->B = 2;
	f->Sq = 16;
	f->Sk = 32;
	f->Hq = 8;
	f->Hkv = 2;
	f->D = 64;
	layout(16, 8, 64, false, f->q_stride);
	layout(32, 2, 64, false, f->k_stride);
	layout(32, 2, 64, false, f->v_stride);
	layout(16, 8, 64, false, f->o_stride);
	f->lse_stride[0] = 8 * 16;
	f->lse_stride[1] = 16;
	f->lse_stride[2] = 1;
	layout(16, 8, 64, true, p.d.do_stride);
	layout(16, 8, 64, false, p.d.dq_stride);
	layout(32, 2, 64, true, p.d.dk_stride);
	layout(32, 2, 64, false, p.d.dv_stride);
	return p.d;
}

/* Check d, expect status st and the exact detail text. */
static void check_desc_says(const struct fa_attn_bwd_desc *d, fa_status st, const char *text)
{
	char err[160];
	memset(err, 'x', sizeof(err));
	fa_status got = fa_attn_bwd_check(d, err, sizeof(err));
	if (got != st || strcmp(err, text) != 0) {
		print_error("got %s \"%s\", want %s \"%s\"\n", fa_status_name(got), err,
		            fa_status_name(st), text);
		fail();
	}
}

static void test_bwd_check_accepts_a_valid_descriptor(void **state)
{
	(void)state;
	struct fa_attn_bwd_desc d = good_desc();
	check_desc_says(&d, FA_OK, "");
	d.dq_stride[0] = 0; /* every batch's dQ in one place: memory, not the problem */
	d.fwd.Hkv = 8;
	check_desc_says(&d, FA_OK, "");
	assert_int_equal(fa_attn_bwd_check(&d, NULL, 0), FA_OK);
}

static void test_bwd_check_rejects_each_bad_field_with_its_status(void **state)
{
	(void)state;
	struct fa_attn_bwd_desc d;
#define CASE(field, value, st, text)                                                           \
	do {                                                                                   \
		d = good_desc();                                                               \
		d.field = value;                                                               \
		check_desc_says(&d, st, text);                                                 \
	} while (0)
	/* the forward's rules, with its texts */
	CASE(fwd.dtype, (fa_dtype)4, FA_EDTYPE, "dtype 4 is unknown (fp16, bf16 or fp32)");
	CASE(fwd.scale, 0.0, FA_EINVAL, "scale is 0 (resolve the default first)");
	CASE(fwd.D, 12, FA_ESHAPE, "head dim 12 is not a multiple of 8");
	CASE(fwd.Hkv, 3, FA_ESHAPE, "Hq 8 is not a multiple of Hkv 3");
	CASE(fwd.lse_stride[1], -1, FA_EINVAL, "lse head stride is -1: strides must be >= 0");
	/* the gradients' strides */
	CASE(do_stride[0], -1, FA_EINVAL, "do batch stride is -1: strides must be >= 0");
	CASE(dq_stride[1], -64, FA_EINVAL, "dq seq stride is -64: strides must be >= 0");
	CASE(dk_stride[2], -2, FA_EINVAL, "dk head stride is -2: strides must be >= 0");
	CASE(dv_stride[1], -128, FA_EINVAL, "dv seq stride is -128: strides must be >= 0");
#undef CASE
	char err[8];
	assert_int_equal(fa_attn_bwd_check(NULL, err, sizeof(err)), FA_EINVAL);
	assert_string_equal(err, "no desc"); /* truncated to the buffer, still terminated */
	d = good_desc();
	d.dk_stride[0] = -1;
	assert_int_equal(fa_attn_bwd_check(&d, NULL, 0), FA_EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bwd_ref_matches_finite_differences_without_mask),
		cmocka_unit_test(test_bwd_ref_matches_finite_differences_with_causal_bottom_right),
		cmocka_unit_test(test_bwd_ref_matches_finite_differences_with_causal_top_left),
		cmocka_unit_test(test_bwd_ref_matches_finite_differences_with_windows_and_softcap),
		cmocka_unit_test(test_bwd_ref_fully_masked_rows_get_zero_and_give_nothing),
		cmocka_unit_test(test_bwd_ref_rows_with_minus_inf_lse_contribute_nothing),
		cmocka_unit_test(test_bwd_ref_keys_no_row_sees_get_zero_gradients),
		cmocka_unit_test(test_bwd_ref_fp32_outputs_agree_with_the_float64_oracle),
		cmocka_unit_test(test_bwd_ref_half_and_fp32_outputs_are_the_rounded_oracle),
		cmocka_unit_test(test_bwd_ref_gqa_sums_the_gradients_of_repeated_kv_heads),
		cmocka_unit_test(test_bwd_ref_bkv_split_matches_one_call),
		cmocka_unit_test(test_bwd_ref_key_chunks_give_the_same_result),
		cmocka_unit_test(test_bwd_ref_rejects_bad_arguments),
		cmocka_unit_test(test_bwd_check_accepts_a_valid_descriptor),
		cmocka_unit_test(test_bwd_check_rejects_each_bad_field_with_its_status),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
