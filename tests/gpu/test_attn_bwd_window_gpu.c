/* test_attn_bwd_window_gpu.c - the backward kernels' sliding window and softcap (attn_bwd.cu's
 * FA_WIN, FA_SOFTCAP) on the GPU against the float64 backward reference.
 *
 * Each case draws Q, K, V, dO, runs the GPU forward with the window and softcap for O and lse,
 * poisons dQ, dK, dV (all bits set: NaN) and runs the backward; fa_attn_bwd_ref64, fed exactly
 * the O and lse the GPU wrote, gives the gradients (only the backward is measured). Grid: odd
 * lengths (1, 17, 127, 129, 1000, Sq != Sk both ways), every dtype and fp32 precision, windows
 * alone, one-sided and with both causal masks, (-1, 0) as causal, rows and keys that see
 * nothing (their gradients must be exactly 0), softcaps 5..50, GQA; some cases also in the
 * deterministic mode three times, bit for bit (the key blocks that see a query block are a range
 * there, not a prefix). Error: relative Frobenius error per gradient, test_attn_bwd_gpu's
 * tolerances. The kernels are still behind FA_GPU_BWD_WINDOW_UNVERIFIED (fa_gpu_bwd.h): the test
 * passes it, and checks that without it the window is refused with FA_ENOTSUP. Without a GPU it
 * prints why and skips.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_attn_bwd.h"
#include "fa_gpu.h"
#include "fa_gpu_bwd.h"
#include "fa_ksettings.h"
#include "fa_test.h"

struct wcase {
	fa_dtype dt;
	fa_precision prec;
	int D, Sq, Sk;
	fa_mask mask;
	int B, Hq, Hkv;
	int window;
	int64_t left, right;
	double cap;
	int det; /* also deterministic, three runs, bit for bit */
};

#define BR FA_MASK_CAUSAL_BOTTOM_RIGHT
#define TL FA_MASK_CAUSAL_TOP_LEFT
static const struct wcase cases[] = {
	/* dt, prec, D, Sq, Sk, mask, B, Hq, Hkv, window, left, right, cap, det */
	{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 1000, 1000, FA_MASK_NONE, 1, 4, 2, 1, 256, 0, 0, 1},
	{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 1000, 1000, BR, 1, 2, 2, 1, 128, 0, 50, 0},
	{FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, 127, 129, BR, 2, 4, 2, 1, 16, 16, 30, 1},
	{FA_DTYPE_FP16, FA_PREC_DEFAULT, 40, 17, 17, FA_MASK_NONE, 1, 3, 1, 1, -1, 3, 0, 0},
	{FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 1000, 17, BR, 1, 2, 1, 1, 4, 2, 20, 1}, /* 983 rows see nothing */
	{FA_DTYPE_FP32, FA_PREC_3XTF32, 128, 129, 127, FA_MASK_NONE, 1, 2, 2, 0, 0, 0, 50, 1},
	{FA_DTYPE_FP32, FA_PREC_3XTF32, 64, 1000, 1000, FA_MASK_NONE, 1, 2, 1, 1, 64, 64, 0, 1},
	{FA_DTYPE_FP32, FA_PREC_IEEE, 64, 17, 1000, FA_MASK_NONE, 1, 2, 2, 1, 100, 100, 5, 0},
	{FA_DTYPE_FP32, FA_PREC_TF32, 64, 1, 129, BR, 1, 4, 4, 1, 32, -1, 10, 0},
	{FA_DTYPE_FP32, FA_PREC_TF32, 128, 129, 1000, TL, 1, 2, 2, 1, 50, 7, 15, 1}, /* keys past 136 unseen */
	{FA_DTYPE_FP32, FA_PREC_BF16, 256, 129, 129, TL, 1, 2, 2, 1, -1, 0, 0, 0},   /* causal as a window */
	{FA_DTYPE_FP16, FA_PREC_DEFAULT, 128, 127, 127, FA_MASK_NONE, 1, 2, 2, 0, 0, 0, 5, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static struct fa_gpu *gpu;
static char gpu_err[512];
static uint64_t seed0 = 0x51d1e5eedull;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int nfail, next_case;

/* test_attn_bwd_gpu's tolerances (its comment says why each). */
static double tol_of(fa_dtype dt, fa_precision p)
{
	if (dt == FA_DTYPE_FP16)
		return 5e-3;
	if (dt == FA_DTYPE_BF16)
		return 4e-2;
	switch (fa_prec_resolve(dt, p)) {
	case FA_PREC_TF32: return 5e-3;
	case FA_PREC_BF16: return 4e-2;
	default: return 2e-5;
	}
}

static void make_desc(const struct wcase *c, struct fa_attn_bwd_desc *bd)
{
	memset(bd, 0, sizeof *bd);
	struct fa_attn_fwd_desc *d = &bd->fwd;
	d->dtype = c->dt;
	d->precision = c->prec;
	d->mask = c->mask;
	d->scale = 1.0 / sqrt((double)c->D);
	d->B = c->B;
	d->Sq = c->Sq;
	d->Sk = c->Sk;
	d->Hq = c->Hq;
	d->Hkv = c->Hkv;
	d->D = c->D;
	d->window = c->window != 0;
	d->window_left = c->left;
	d->window_right = c->right;
	d->softcap = c->cap;
	const int64_t D = c->D;
	const int64_t q[3] = {c->Sq * c->Hq * D, c->Hq * D, D}, k[3] = {c->Sk * c->Hkv * D, c->Hkv * D, D};
	memcpy(d->q_stride, q, sizeof q);
	memcpy(d->o_stride, q, sizeof q);
	memcpy(d->k_stride, k, sizeof k);
	memcpy(d->v_stride, k, sizeof k);
	memcpy(bd->do_stride, q, sizeof q);
	memcpy(bd->dq_stride, q, sizeof q);
	memcpy(bd->dk_stride, k, sizeof k);
	memcpy(bd->dv_stride, k, sizeof k);
	d->lse_stride[0] = (int64_t)c->Hq * c->Sq;
	d->lse_stride[1] = c->Sq;
	d->lse_stride[2] = 1;
}

static void fill_random(void *buf, fa_dtype dt, size_t n, double amp, uint64_t *rng)
{
	for (size_t i = 0; i < n; i++)
		fa_store_elem(buf, dt, (int64_t)i, amp * (2.0 * fa_rand_uniform(rng) - 1.0));
}

struct devbufs {
	CUdeviceptr q, k, v, o, dout, lse, dq, dk, dv;
};

/* Poison, backward, download. */
static fa_status run_bwd(const struct fa_attn_bwd_desc *d, const struct devbufs *db, size_t nq,
                         size_t nk, size_t es, unsigned flags, void *dq, void *dk, void *dv,
                         char *err, size_t errlen)
{
	fa_status st;
	struct fa_gpu_bwd_ptrs p = {db->q, db->k, db->v, db->o, db->dout, db->lse, db->dq, db->dk,
	                            db->dv};
	if ((st = fa_gpu_memset8(gpu, db->dq, 0xff, nq * es, err, errlen)) ||
	    (st = fa_gpu_memset8(gpu, db->dk, 0xff, nk * es, err, errlen)) ||
	    (st = fa_gpu_memset8(gpu, db->dv, 0xff, nk * es, err, errlen)) ||
	    (st = fa_gpu_attn_bwd(gpu, d, &p, flags, NULL, err, errlen)) ||
	    (st = fa_gpu_sync(gpu, err, errlen)) ||
	    (st = fa_gpu_download(gpu, dq, db->dq, nq * es, err, errlen)) ||
	    (st = fa_gpu_download(gpu, dk, db->dk, nk * es, err, errlen)) ||
	    (st = fa_gpu_download(gpu, dv, db->dv, nk * es, err, errlen)))
		return st;
	return FA_OK;
}

/* Relative Frobenius error of a dense-layout gradient (the test's layouts are dense) against
 * g64; +inf when an element is not finite (a poisoned one was not written). */
static double rel_err(const void *got, fa_dtype dt, const double *g64, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double x = fa_load_elem(got, dt, (int64_t)i);
		if (!isfinite(x))
			return INFINITY;
		num += (x - g64[i]) * (x - g64[i]);
		den += g64[i] * g64[i];
	}
	return den > 0 ? sqrt(num / den) : num > 0 ? INFINITY : 0;
}

/* Rows that see no key must have dQ exactly 0; keys no row sees, dK = dV = 0 exactly. The
 * count of those rows and keys in *rows, *keys; false at the first nonzero. */
static bool unseen_are_zero(const struct wcase *c, const struct fa_attn_fwd_desc *d,
                            const void *dq, const void *dk, const void *dv, int *rows, int *keys)
{
	char *seen = calloc((size_t)c->Sk, 1);
	bool ok = seen != NULL;
	*rows = *keys = 0;
	for (int64_t i = 0; ok && i < c->Sq; i++) {
		int64_t lo, hi;
		fa_attn_key_range(d, c->Sq, c->Sk, i, &lo, &hi);
		for (int64_t j = lo; j < hi; j++)
			seen[j] = 1;
		if (lo < hi)
			continue;
		(*rows)++;
		for (int64_t b = 0; b < c->B; b++)
			for (int64_t h = 0; h < c->Hq; h++)
				for (int64_t e = 0; e < c->D; e++)
					if (fa_load_elem(dq, c->dt, ((b * c->Sq + i) * c->Hq + h) * c->D + e) != 0)
						ok = false;
	}
	for (int64_t j = 0; ok && j < c->Sk; j++) {
		if (seen[j])
			continue;
		(*keys)++;
		for (int64_t b = 0; b < c->B; b++)
			for (int64_t h = 0; h < c->Hkv; h++)
				for (int64_t e = 0; e < c->D; e++) {
					int64_t at = ((b * c->Sk + j) * c->Hkv + h) * c->D + e;
					if (fa_load_elem(dk, c->dt, at) != 0 || fa_load_elem(dv, c->dt, at) != 0)
						ok = false;
				}
	}
	free(seen);
	return ok;
}

static bool run_case(const struct wcase *c, int idx)
{
	struct fa_attn_bwd_desc bd;
	make_desc(c, &bd);
	const struct fa_attn_fwd_desc *d = &bd.fwd;
	uint64_t rng = seed0 ^ (0x9e3779b97f4a7c15ull * (uint64_t)(idx + 1));
	const size_t es = fa_dtype_size(c->dt);
	const size_t nq = (size_t)c->B * c->Sq * c->Hq * c->D, nk = (size_t)c->B * c->Sk * c->Hkv * c->D;
	const size_t nl = (size_t)c->B * c->Hq * c->Sq;
	void *q = malloc(nq * es), *k = malloc(nk * es), *v = malloc(nk * es), *o = malloc(nq * es);
	void *dout = malloc(nq * es), *dq = malloc(nq * es), *dk = malloc(nk * es);
	void *dv = malloc(nk * es);
	float *lse = malloc(nl * sizeof(float));
	double *o64 = malloc(nq * sizeof(double)), *l64 = malloc(nl * sizeof(double));
	double *g64[3] = {malloc(nq * sizeof(double)), malloc(nk * sizeof(double)),
	                  malloc(nk * sizeof(double))};
	assert_true(q && k && v && o && dout && dq && dk && dv && lse && o64 && l64 && g64[0] &&
	            g64[1] && g64[2]);
	/* scores of a few units, so that softcaps of 5 bend them */
	fill_random(q, c->dt, nq, 2.0, &rng);
	fill_random(k, c->dt, nk, 2.0, &rng);
	fill_random(v, c->dt, nk, 1.0, &rng);
	fill_random(dout, c->dt, nq, 1.0, &rng);
	struct devbufs db = {0};
	char err[2048] = "";
	fa_status st;
	if ((st = fa_gpu_alloc(gpu, nq * es, &db.q, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db.k, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db.v, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nq * es, &db.o, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nq * es, &db.dout, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nl * 4, &db.lse, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nq * es, &db.dq, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db.dk, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db.dv, err, sizeof err)) ||
	    (st = fa_gpu_upload(gpu, db.q, q, nq * es, err, sizeof err)) ||
	    (st = fa_gpu_upload(gpu, db.k, k, nk * es, err, sizeof err)) ||
	    (st = fa_gpu_upload(gpu, db.v, v, nk * es, err, sizeof err)) ||
	    (st = fa_gpu_upload(gpu, db.dout, dout, nq * es, err, sizeof err)))
		fail_msg("setup: %s", err);
	st = fa_gpu_attn_fwd(gpu, d, db.q, db.k, db.v, db.o, db.lse, NULL, err, sizeof err);
	if (st == FA_OK)
		st = fa_gpu_sync(gpu, err, sizeof err);
	if (st == FA_OK && (st = fa_gpu_download(gpu, o, db.o, nq * es, err, sizeof err)) == FA_OK)
		st = fa_gpu_download(gpu, lse, db.lse, nl * 4, err, sizeof err);
	/* behind the flag: refused without it, nothing written */
	bool refused_ok = true;
	if (st == FA_OK && (c->window || c->cap > 0)) {
		char e2[512];
		fa_status r = run_bwd(&bd, &db, nq, nk, es, 0, dq, dk, dv, e2, sizeof e2);
		refused_ok = r == FA_ENOTSUP && strstr(e2, "sliding window") != NULL;
	}
	bool det_ok = true;
	const unsigned on = FA_GPU_BWD_WINDOW_UNVERIFIED;
	if (st == FA_OK && c->det) {
		void *ref[3] = {malloc(nq * es), malloc(nk * es), malloc(nk * es)};
		for (int run = 0; run < 3 && st == FA_OK; run++) {
			st = run_bwd(&bd, &db, nq, nk, es, on | FA_GPU_BWD_DETERMINISTIC, dq, dk, dv, err,
			             sizeof err);
			if (st != FA_OK)
				break;
			if (run == 0) {
				memcpy(ref[0], dq, nq * es);
				memcpy(ref[1], dk, nk * es);
				memcpy(ref[2], dv, nk * es);
			} else if (memcmp(ref[0], dq, nq * es) || memcmp(ref[1], dk, nk * es) ||
			           memcmp(ref[2], dv, nk * es)) {
				det_ok = false;
			}
		}
		for (int i = 0; i < 3; i++)
			free(ref[i]);
	}
	/* the deterministic result (when run) is checked against the oracle too */
	double rel_det[3] = {0, 0, 0};
	for (int pass = c->det ? 0 : 1; pass < 2 && st == FA_OK; pass++) {
		if (pass == 1)
			st = run_bwd(&bd, &db, nq, nk, es, on, dq, dk, dv, err, sizeof err);
		if (st != FA_OK)
			break;
		if (pass == 0 || !c->det) {
			for (int64_t b = 0; b < c->B; b++)
				for (int64_t i = 0; i < c->Sq; i++)
					for (int64_t h = 0; h < c->Hq; h++) {
						for (int64_t e = 0; e < c->D; e++) {
							int64_t at = ((b * c->Sq + i) * c->Hq + h) * c->D + e;
							o64[at] = fa_load_elem(o, c->dt, at);
						}
						l64[(b * c->Hq + h) * c->Sq + i] =
						    lse[b * d->lse_stride[0] + h * d->lse_stride[1] + i];
					}
			st = fa_attn_bwd_ref64(&bd, q, k, v, o64, dout, l64, g64[0], g64[1], g64[2]);
			if (st != FA_OK)
				fail_msg("reference: %s", fa_status_name(st));
		}
		if (pass == 0) {
			rel_det[0] = rel_err(dq, c->dt, g64[0], nq);
			rel_det[1] = rel_err(dk, c->dt, g64[1], nk);
			rel_det[2] = rel_err(dv, c->dt, g64[2], nk);
		}
	}
	for (int i = 0; i < 9; i++)
		fa_gpu_free(gpu, (&db.q)[i]);
	bool ok = false;
	double rel[3] = {INFINITY, INFINITY, INFINITY};
	int rows = 0, keys = 0;
	bool zeros = false;
	if (st == FA_OK) {
		rel[0] = rel_err(dq, c->dt, g64[0], nq);
		rel[1] = rel_err(dk, c->dt, g64[1], nk);
		rel[2] = rel_err(dv, c->dt, g64[2], nk);
		zeros = unseen_are_zero(c, d, dq, dk, dv, &rows, &keys);
		const double tol = tol_of(c->dt, c->prec);
		ok = rel[0] <= tol && rel[1] <= tol && rel[2] <= tol && rel_det[0] <= tol &&
		     rel_det[1] <= tol && rel_det[2] <= tol && det_ok && zeros && refused_ok;
	}
	pthread_mutex_lock(&out_lock);
	printf("%-4s %s %-7s D=%-3d Sq=%-4d Sk=%-4d %-9s H=%d/%d w=%d(%lld,%lld) cap=%-2g | dq %.2e "
	       "dk %.2e dv %.2e%s | unseen rows %d keys %d%s%s%s%s%s\n",
	       ok ? "ok" : "FAIL", fa_dtype_name(c->dt),
	       c->dt == FA_DTYPE_FP32 ? fa_prec_name(fa_prec_resolve(c->dt, c->prec)) : "",
	       c->D, c->Sq, c->Sk,
	       c->mask == FA_MASK_NONE ? "nomask" : c->mask == TL ? "causal-tl" : "causal-br", c->Hq,
	       c->Hkv, c->window, (long long)c->left, (long long)c->right, c->cap, rel[0], rel[1],
	       rel[2], c->det ? (det_ok ? " det bitwise" : " det DIFFERS") : "", rows, keys,
	       zeros || st != FA_OK ? "" : " NONZERO", refused_ok ? "" : " (not refused without the flag)",
	       st != FA_OK ? " " : "", st != FA_OK ? fa_status_name(st) : "",
	       st != FA_OK ? err : "");
	if (!ok)
		nfail++;
	pthread_mutex_unlock(&out_lock);
	free(q), free(k), free(v), free(o), free(dout), free(dq), free(dk), free(dv), free(lse);
	free(o64), free(l64);
	for (int i = 0; i < 3; i++)
		free(g64[i]);
	return ok;
}

static void *worker(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&out_lock);
		int i = next_case++;
		pthread_mutex_unlock(&out_lock);
		if (i >= NCASES)
			return NULL;
		run_case(&cases[i], i);
	}
}

static int setup(void **state)
{
	(void)state;
	struct fa_kernel_settings ks;
	fa_test_kernel_settings(&ks);
	if (fa_gpu_open(&gpu, 0, &ks, gpu_err, sizeof gpu_err) != FA_OK)
		gpu = NULL;
	const char *seed = getenv("FA_TEST_SEED");
	seed0 ^= seed ? strtoull(seed, NULL, 0) : (uint64_t)fa_test_now_us();
	printf("seed 0x%llx (FA_TEST_SEED to repeat)\n", (unsigned long long)seed0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_gpu_close(gpu);
	return 0;
}

static void test_bwd_window_and_softcap_match_the_reference_on_the_gpu(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	int64_t t0 = fa_test_now_ms();
	enum { NTH = 4 }; /* compiles overlap; the kernels share the device */
	pthread_t th[NTH];
	for (int i = 0; i < NTH; i++)
		pthread_create(&th[i], NULL, worker, NULL);
	for (int i = 0; i < NTH; i++)
		pthread_join(th[i], NULL);
	printf("%d cases, %d failed, %.1f s\n", NCASES, nfail, (fa_test_now_ms() - t0) / 1e3);
	if (nfail)
		fail_msg("%d of %d cases failed", nfail, NCASES);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bwd_window_and_softcap_match_the_reference_on_the_gpu),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
