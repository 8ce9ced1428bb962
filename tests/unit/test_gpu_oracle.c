/* test_gpu_oracle.c - the GPU tests' row oracle and sampler (tests/helpers/fa_gpu_oracle.h)
 * against the float64 CPU reference (fa_attn_fwd_ref64), here, without a GPU: the forward,
 * decode and window kernel tests judge large cases by this oracle alone, so it must be the
 * reference's arithmetic for every mask, window and softcap, and the sampler must flag a poisoned
 * output or a wrong -inf. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_attn.h"
#include "fa_gpu_oracle.h"

struct ocase {
	int64_t B, Sq, Sk, Hq, Hkv, D;
	fa_mask mask;
	bool window;
	int64_t wl, wr;
	double cap;
};

static void desc_of(const struct ocase *c, struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
	d->dtype = FA_DTYPE_FP32;
	d->precision = FA_PREC_IEEE;
	d->mask = c->mask;
	d->scale = 1.0 / sqrt((double)c->D);
	d->B = c->B, d->Sq = c->Sq, d->Sk = c->Sk, d->Hq = c->Hq, d->Hkv = c->Hkv, d->D = c->D;
	d->window = c->window, d->window_left = c->wl, d->window_right = c->wr;
	d->softcap = c->cap;
	int64_t q[3] = {c->Sq * c->Hq * c->D, c->Hq * c->D, c->D};
	int64_t k[3] = {c->Sk * c->Hkv * c->D, c->Hkv * c->D, c->D};
	memcpy(d->q_stride, q, sizeof q);
	memcpy(d->o_stride, q, sizeof q);
	memcpy(d->k_stride, k, sizeof k);
	memcpy(d->v_stride, k, sizeof k);
	d->lse_stride[0] = c->Hq * c->Sq, d->lse_stride[1] = c->Sq, d->lse_stride[2] = 1;
}

static const struct ocase cases[] = {
	{2, 17, 17, 4, 2, 32, FA_MASK_NONE, false, 0, 0, 0},
	{1, 5, 40, 4, 1, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT, false, 0, 0, 0},
	{1, 40, 5, 2, 2, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT, false, 0, 0, 0}, /* rows see nothing */
	{1, 33, 29, 2, 1, 24, FA_MASK_CAUSAL_TOP_LEFT, false, 0, 0, 0},
	{2, 31, 31, 2, 2, 8, FA_MASK_NONE, true, 4, 2, 0},
	{1, 20, 50, 4, 2, 16, FA_MASK_CAUSAL_BOTTOM_RIGHT, true, 7, -1, 5.0},
	{1, 9, 9, 2, 1, 40, FA_MASK_NONE, true, -1, 0, 30.0},
	{1, 12, 12, 2, 2, 16, FA_MASK_NONE, true, 0, 0, 0}, /* one key each */
};

/* Every row of every case: the oracle's O and lse equal the reference's to rounding. */
static void test_oracle_rows_match_the_reference(void **state)
{
	(void)state;
	uint64_t rng = 12345;
	for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
		const struct ocase *c = &cases[ci];
		struct fa_attn_fwd_desc d;
		desc_of(c, &d);
		size_t nq = (size_t)(c->B * c->Sq * c->Hq * c->D), nk = (size_t)(c->B * c->Sk * c->Hkv * c->D);
		float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk);
		double *o64 = malloc(8 * nq), *l64 = malloc(8 * (size_t)(c->B * c->Hq * c->Sq));
		double *o = malloc(8 * (size_t)c->D), *sc = malloc(8 * (size_t)c->Sk);
		fa_gpu_fill_random(q, FA_DTYPE_FP32, nq, 2.0, &rng);
		fa_gpu_fill_random(k, FA_DTYPE_FP32, nk, 2.0, &rng);
		fa_gpu_fill_random(v, FA_DTYPE_FP32, nk, 1.0, &rng);
		assert_int_equal(fa_attn_fwd_ref64(&d, q, k, v, o64, l64), FA_OK);
		for (int64_t b = 0; b < c->B; b++)
			for (int64_t h = 0; h < c->Hq; h++)
				for (int64_t i = 0; i < c->Sq; i++) {
					double lse;
					fa_gpu_oracle_row(&d, q, k, v, b, h, i, o, &lse, sc);
					double want = l64[(b * c->Hq + h) * c->Sq + i];
					if (isinf(want))
						assert_true(isinf(lse) && lse < 0);
					else
						assert_true(fabs(lse - want) <= 1e-12 * (1 + fabs(want)));
					for (int64_t e = 0; e < c->D; e++) {
						double w = o64[((b * c->Sq + i) * c->Hq + h) * c->D + e];
						assert_true(fabs(o[e] - w) <= 1e-12 * (1 + fabs(w)));
					}
				}
		free(q), free(k), free(v), free(o64), free(l64), free(o), free(sc);
	}
}

/* The sampler: the reference's own output (rounded to fp32) passes with a tiny error; one
 * poisoned element, or a finite lse where the row sees nothing, is flagged. */
static void test_sampler_accepts_the_reference_and_flags_poison(void **state)
{
	(void)state;
	const struct ocase *c = &cases[2]; /* causal with Sq > Sk: rows without keys */
	struct fa_attn_fwd_desc d;
	desc_of(c, &d);
	uint64_t rng = 777;
	size_t nq = (size_t)(c->B * c->Sq * c->Hq * c->D), nk = (size_t)(c->B * c->Sk * c->Hkv * c->D);
	size_t nl = (size_t)(c->B * c->Hq * c->Sq);
	float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *o = malloc(4 * nq);
	float *lse = malloc(4 * nl);
	double *o64 = malloc(8 * nq), *l64 = malloc(8 * nl);
	fa_gpu_fill_random(q, FA_DTYPE_FP32, nq, 1.5, &rng);
	fa_gpu_fill_random(k, FA_DTYPE_FP32, nk, 1.5, &rng);
	fa_gpu_fill_random(v, FA_DTYPE_FP32, nk, 1.0, &rng);
	assert_int_equal(fa_attn_fwd_ref64(&d, q, k, v, o64, l64), FA_OK);
	for (size_t i = 0; i < nq; i++)
		o[i] = (float)o64[i];
	for (size_t i = 0; i < nl; i++)
		lse[i] = (float)l64[i];
	int64_t rows[3 * 80];
	int n = 0;
	for (int64_t h = 0; h < c->Hq; h++)
		for (int64_t i = 0; i < c->Sq; i++, n++)
			rows[3 * n] = 0, rows[3 * n + 1] = h, rows[3 * n + 2] = i;
	struct fa_gpu_sample_job j = {.d = &d, .q = q, .k = k, .v = v, .o = o, .lse = lse,
	                              .rows = rows, .nrows = n, .first = 0, .step = 1};
	fa_gpu_sample_worker(&j);
	assert_false(j.bad);
	assert_true(j.den > 0 && sqrt(j.num / j.den) < 1e-6 && j.lse_err < 1e-5);

	o[3] = NAN;
	struct fa_gpu_sample_job j2 = j;
	j2.num = j2.den = j2.lse_err = 0;
	j2.bad = false;
	fa_gpu_sample_worker(&j2);
	assert_true(j2.bad);
	o[3] = (float)o64[3];

	lse[0] = 0.0f; /* row 0 of head 0 sees no key (Sq 40 > Sk 5, bottom-right) */
	assert_true(isinf(l64[0]));
	j2 = j;
	j2.num = j2.den = j2.lse_err = 0;
	j2.bad = false;
	fa_gpu_sample_worker(&j2);
	assert_true(j2.bad);
	free(q), free(k), free(v), free(o), free(lse), free(o64), free(l64);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_oracle_rows_match_the_reference),
		cmocka_unit_test(test_sampler_accepts_the_reference_and_flags_poison),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
