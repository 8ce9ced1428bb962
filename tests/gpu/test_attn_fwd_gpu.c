/* test_attn_fwd_gpu.c - the forward kernel on the GPU against the CPU float64 reference.
 *
 * Grid: dtypes x fp32 precisions x head dims x (Sq, Sk) x masks x GQA ratios x layouts (BSHD,
 * BHSD). Each case draws fresh random inputs, poisons O and lse (all bits set: NaN) before the
 * launch, and compares with the tolerances of ARCHITECTURE.md (relative Frobenius error: fp32
 * ieee/3xtf32 1e-5, tf32 2e-3, bf16 1e-2, fp16 2e-3; NaN never passes) and the logsumexp.
 * Small cases use fa_attn_fwd_ref64 over every row; large ones a float64 oracle on sampled rows
 * (first, last and random rows of every (batch, head)), after checking that no output element
 * kept its poison. Default: a representative sample; FA_GPU_GRID=full: the whole grid;
 * FA_GPU_GRID_D="192 256": only those head dims; FA_GPU_GRID_DT="fp32-bf16 bf16": only those
 * kinds (the names of the worst-error lines, '-' for the space).
 * Without a GPU it prints why and skips.
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

#include "fa_gpu_oracle.h"
#include "fa_gpu_tol.h"
#include "fa_gpu.h"
#include "fa_test.h"
#include "fa_ksettings.h"

struct gcase {
	fa_dtype dt;
	fa_precision prec;
	int D;
	int Sq, Sk;
	fa_mask mask;
	int B, Hq, Hkv;
	int bhsd; /* layout: 0 BSHD, 1 BHSD */
	int neg;  /* negative scale (-1/sqrt(D)): the kernel negates Q instead */
};

static struct fa_gpu *gpu;
static char gpu_err[512];
static uint64_t seed0 = 0x9e3779b97f4a7c15ull;
static _Thread_local uint64_t rng;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static void make_desc(const struct gcase *c, struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
	d->dtype = c->dt;
	d->precision = c->prec;
	d->mask = c->mask;
	d->scale = (c->neg ? -1.0 : 1.0) / sqrt((double)c->D);
	d->B = c->B;
	d->Sq = c->Sq;
	d->Sk = c->Sk;
	d->Hq = c->Hq;
	d->Hkv = c->Hkv;
	d->D = c->D;
	int64_t D = c->D;
	if (!c->bhsd) {
		int64_t q[3] = {c->Sq * c->Hq * D, c->Hq * D, D}, k[3] = {c->Sk * c->Hkv * D, c->Hkv * D, D};
		memcpy(d->q_stride, q, sizeof q);
		memcpy(d->o_stride, q, sizeof q);
		memcpy(d->k_stride, k, sizeof k);
		memcpy(d->v_stride, k, sizeof k);
	} else {
		int64_t q[3] = {c->Hq * c->Sq * D, D, c->Sq * D}, k[3] = {c->Hkv * c->Sk * D, D, c->Sk * D};
		memcpy(d->q_stride, q, sizeof q);
		memcpy(d->o_stride, q, sizeof q);
		memcpy(d->k_stride, k, sizeof k);
		memcpy(d->v_stride, k, sizeof k);
	}
	d->lse_stride[0] = (int64_t)c->Hq * c->Sq;
	d->lse_stride[1] = c->Sq;
	d->lse_stride[2] = 1;
}

struct result {
	double err, lse_err;
	bool finite;
	char tile[48];
};

static int ncases, nfail;
static double worst[8]; /* by dtype/precision slot */

static bool run_case(const struct gcase *c, int verbose)
{
	struct fa_attn_fwd_desc d;
	make_desc(c, &d);
	size_t es = fa_dtype_size(c->dt);
	size_t nq = (size_t)c->B * c->Sq * c->Hq * c->D, nk = (size_t)c->B * c->Sk * c->Hkv * c->D;
	size_t nl = (size_t)c->B * c->Hq * c->Sq;
	void *q = malloc(nq * es), *k = malloc(nk * es), *v = malloc(nk * es), *o = malloc(nq * es);
	float *lse = malloc(nl * sizeof(float));
	assert_non_null(q);
	assert_non_null(o);
	fa_gpu_fill_random(q, c->dt, nq, 1.5, &rng);
	fa_gpu_fill_random(k, c->dt, nk, 1.5, &rng);
	fa_gpu_fill_random(v, c->dt, nk, 1.0, &rng);
	CUdeviceptr dq = 0, dk = 0, dv = 0, dov = 0, dl = 0;
	char err[2048];
	fa_status st;
	if ((st = fa_gpu_alloc(gpu, nq * es, &dq, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &dk, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &dv, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nq * es, &dov, err, sizeof err)) ||
	    (st = fa_gpu_alloc(gpu, nl * 4, &dl, err, sizeof err)) ||
	    (st = fa_gpu_upload(gpu, dq, q, nq * es, err, sizeof err)) ||
	    (st = fa_gpu_upload(gpu, dk, k, nk * es, err, sizeof err)) ||
	    (st = fa_gpu_upload(gpu, dv, v, nk * es, err, sizeof err)) ||
	    (st = fa_gpu_memset8(gpu, dov, 0xff, nq * es, err, sizeof err)) ||
	    (st = fa_gpu_memset8(gpu, dl, 0xff, nl * 4, err, sizeof err)))
		fail_msg("setup: %s", err);
	struct fa_tile tile;
	int ntile = 0;
	st = fa_gpu_plan(gpu, &d, &tile, 1, &ntile, err, sizeof err);
	if (st == FA_OK)
		st = fa_gpu_attn_fwd(gpu, &d, dq, dk, dv, dov, dl, NULL, err, sizeof err);
	if (st == FA_OK)
		st = fa_gpu_sync(gpu, err, sizeof err);
	if (st != FA_OK) {
		pthread_mutex_lock(&out_lock);
		printf("FAIL launch D=%d Sq=%d Sk=%d: %s: %s\n", c->D, c->Sq, c->Sk, fa_status_name(st), err);
		ncases++;
		nfail++;
		pthread_mutex_unlock(&out_lock);
		fa_gpu_free(gpu, dq);
		fa_gpu_free(gpu, dk);
		fa_gpu_free(gpu, dv);
		fa_gpu_free(gpu, dov);
		fa_gpu_free(gpu, dl);
		free(q);
		free(k);
		free(v);
		free(o);
		free(lse);
		return false;
	}
	if ((st = fa_gpu_download(gpu, o, dov, nq * es, err, sizeof err)) ||
	    (st = fa_gpu_download(gpu, lse, dl, nl * 4, err, sizeof err)))
		fail_msg("download: %s", err);
	fa_gpu_free(gpu, dq);
	fa_gpu_free(gpu, dk);
	fa_gpu_free(gpu, dv);
	fa_gpu_free(gpu, dov);
	fa_gpu_free(gpu, dl);

	/* Poison check over everything first: every element written, nothing NaN. */
	bool finite = true;
	for (size_t i = 0; i < nq && finite; i++)
		finite = isfinite(fa_load_elem(o, c->dt, (int64_t)i));
	for (size_t i = 0; i < nl && finite; i++)
		finite = !isnan(lse[i]) && !(isinf(lse[i]) && lse[i] > 0);

	double rel, lse_err = 0;
	double work = (double)c->B * c->Hq * c->Sq * (double)c->Sk * c->D;
	if (work <= 1e7) {
		double *o64 = malloc(sizeof(double) * nq), *l64 = malloc(sizeof(double) * nl);
		st = fa_attn_fwd_ref64(&d, q, k, v, o64, l64);
		if (st != FA_OK)
			fail_msg("reference: %s", fa_status_name(st));
		rel = fa_attn_fwd_rel_error(&d, o, o64);
		for (int64_t b = 0; b < c->B; b++)
			for (int64_t h = 0; h < c->Hq; h++)
				for (int64_t i = 0; i < c->Sq; i++) {
					size_t x = (size_t)((b * c->Hq + h) * c->Sq + i);
					double r = l64[x];
					float gl = lse[b * d.lse_stride[0] + h * d.lse_stride[1] + i];
					if (isinf(r)) {
						if (!(isinf(gl) && gl < 0))
							finite = false;
					} else if (fabs(gl - r) > lse_err || !isfinite(gl)) {
						lse_err = isfinite(gl) ? fabs(gl - r) : INFINITY;
					}
				}
		free(o64);
		free(l64);
	} else {
		int per = c->Sq <= 64 ? c->Sq : 48;
		int nrows = 0;
		int64_t *rows = malloc(sizeof(int64_t) * 3 * (size_t)(c->B * c->Hq * per));
		for (int b = 0; b < c->B; b++)
			for (int h = 0; h < c->Hq; h++)
				for (int r = 0; r < per; r++) {
					int64_t i = per == c->Sq ? r : r < 8 ? r : r < 16 ? c->Sq - 1 - (r - 8)
					          : fa_rand_range(&rng, 0, c->Sq - 1);
					rows[3 * nrows] = b;
					rows[3 * nrows + 1] = h;
					rows[3 * nrows + 2] = i;
					nrows++;
				}
		enum { NT = 4 };
		struct fa_gpu_sample_job jobs[NT];
		pthread_t th[NT];
		for (int t = 0; t < NT; t++) {
			jobs[t] = (struct fa_gpu_sample_job){.d = &d, .q = q, .k = k, .v = v, .o = o, .lse = lse,
			                              .rows = rows, .nrows = nrows, .first = t, .step = NT};
			pthread_create(&th[t], NULL, fa_gpu_sample_worker, &jobs[t]);
		}
		double num = 0, den = 0;
		for (int t = 0; t < NT; t++) {
			pthread_join(th[t], NULL);
			num += jobs[t].num;
			den += jobs[t].den;
			if (jobs[t].bad)
				finite = false;
			if (jobs[t].lse_err > lse_err)
				lse_err = jobs[t].lse_err;
		}
		rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
		free(rows);
	}
	if (!finite)
		rel = INFINITY;
	double tol = fa_gpu_tol(c->dt, c->prec), ltol = fa_gpu_lse_tol(c->dt, c->prec);
	bool ok = rel <= tol && lse_err <= ltol; /* NaN compares false: never passes */
	int s = fa_gpu_kind(c->dt, c->prec);
	pthread_mutex_lock(&out_lock);
	if (rel > worst[s] || isnan(rel))
		worst[s] = rel;
	char tb[48];
	fa_tile_format(&tile, tb, sizeof tb);
	ncases++;
	if (!ok)
		nfail++;
	if (!ok || verbose)
		printf("%s %-11s D=%3d Sq=%4d Sk=%4d B=%d Hq=%d Hkv=%d %s %-19s tile %-16s err %.3g "
		       "(tol %.0e) lse %.3g%s\n", ok ? "ok  " : "FAIL", fa_gpu_kind_name(s), c->D, c->Sq,
		       c->Sk, c->B, c->Hq, c->Hkv, c->bhsd ? "BHSD" : "BSHD", fa_mask_name(c->mask), tb,
		       rel, tol, lse_err, finite ? "" : " (non-finite output or poison left)");
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
	free(q);
	free(k);
	free(v);
	free(o);
	free(lse);
	return ok;
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

/* Compile every case's kernel on many threads before running them in order. */
struct prep {
	struct gcase *cases;
	int n, next;
	pthread_mutex_t lock;
	int errors;
};
static void *prep_worker(void *arg)
{
	struct prep *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		int i = p->next++;
		pthread_mutex_unlock(&p->lock);
		if (i >= p->n)
			return NULL;
		struct fa_attn_fwd_desc d;
		char err[2048];
		make_desc(&p->cases[i], &d);
		if (fa_gpu_prepare(gpu, &d, NULL, err, sizeof err) != FA_OK) {
			printf("prepare: %s\n", err);
			pthread_mutex_lock(&p->lock);
			p->errors++;
			pthread_mutex_unlock(&p->lock);
		}
	}
}

static void *case_worker(void *arg)
{
	struct prep *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		int i = p->next++;
		pthread_mutex_unlock(&p->lock);
		if (i >= p->n)
			return NULL;
		rng = seed0 ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
		run_case(&p->cases[i], i < 2);
	}
}

static const fa_dtype G_DT[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
                                FA_DTYPE_FP32, FA_DTYPE_FP32};
static const fa_precision G_PR[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
                                    FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
static const int G_D[] = {8, 40, 64, 80, 96, 128, 160, 192, 256};
static const int G_LEN[][2] = {{1, 1}, {17, 17}, {127, 127}, {128, 128}, {129, 129},
                               {1000, 1000}, {4097, 4097}, {17, 1000}, {1000, 17},
                               {1, 4097}, {129, 4097}, {4097, 129}};
static const int G_NLEN = (int)(sizeof G_LEN / sizeof G_LEN[0]);
static const int G_HEADS[][2] = {{2, 2}, {4, 2}, {4, 1}, {8, 2}}; /* Hq, Hkv: 1:1, GQA, MQA */
static const fa_mask G_MASK[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT, FA_MASK_CAUSAL_TOP_LEFT};

static void set_heads(struct gcase *c, int k)
{
	c->Hq = G_HEADS[k % 4][0];
	c->Hkv = G_HEADS[k % 4][1];
	c->B = (c->Sq >= 1000 || c->Sk >= 1000) ? 1 : 2;
	if (c->Sq >= 4000 && c->Sk >= 4000) { /* keep the CPU oracle's time down */
		c->Hq = c->Hq / c->Hkv;
		c->Hkv = 1;
	}
}

static void test_attn_fwd_gpu_matches_the_float64_reference(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	uint8_t u[16];
	fa_gpu_uuid(gpu, u);
	printf("GPU: %s, sm_%d, opt-in shared memory %zu bytes, uuid %02x%02x%02x%02x...\n",
	       fa_gpu_name(gpu), fa_gpu_sm(gpu), fa_gpu_smem_optin(gpu), u[0], u[1], u[2], u[3]);
	const char *grid = getenv("FA_GPU_GRID");
	bool full = grid && strcmp(grid, "full") == 0;
	struct gcase *cases = calloc(20000, sizeof *cases);
	int n = 0, k = 0;
	/* The seed's exact case first: fp32 head dim 128 causal (B=4 H=4 S=4096 in NNop's report). */
	cases[n++] = (struct gcase){FA_DTYPE_FP32, FA_PREC_DEFAULT, 128, 4096, 4096,
	                            FA_MASK_CAUSAL_TOP_LEFT, 1, 4, 4, 0};
	cases[n++] = (struct gcase){FA_DTYPE_FP32, FA_PREC_DEFAULT, 128, 1000, 1000,
	                            FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 4, 1};
	for (int a = 0; a < 6; a++)
		for (int di = 0; di < 9; di++)
			for (int m = 0; m < 3; m++) {
				/* full: every length pair; sample: two rotating pairs per (dtype, D, mask) for
				 * the main head dims, one elsewhere */
				int nl = full ? G_NLEN : (G_D[di] == 64 || G_D[di] == 128 ? 2 : 1);
				for (int li = 0; li < nl; li++, k++) {
					struct gcase c = {0};
					c.dt = G_DT[a];
					c.prec = G_PR[a];
					c.D = G_D[di];
					c.mask = G_MASK[m];
					int l = full ? li : (k * 5 + li * 7) % G_NLEN;
					c.Sq = G_LEN[l][0];
					c.Sk = G_LEN[l][1];
					set_heads(&c, k);
					c.bhsd = k % 2;
					cases[n++] = c;
				}
			}
	/* A negative scale (the kernel negates Q in shared memory), every dtype and precision,
	 * ragged lengths, both causal alignments. */
	for (int a = 0; a < 6; a++)
		for (int i = 0; i < 2; i++) {
			struct gcase c = {G_DT[a], G_PR[a], i ? 128 : 72, i ? 4097 : 129, i ? 4097 : 300,
			                  i ? FA_MASK_CAUSAL_TOP_LEFT : FA_MASK_CAUSAL_BOTTOM_RIGHT,
			                  1, 4, 2, i, 1};
			cases[n++] = c;
		}
	/* 3xtf32 above head dim 128, the shapes of sm_90's wgmma X3S tile (64 rows x 16 keys, the
	 * half-tile ring; the planner offers it with FA_WG_BC=16, from 2048 keys and 128 queries):
	 * every mask, both layouts, GQA, a negative scale, key counts off the 16-key step, a P V
	 * in 64-column parts and a narrower last one (d136, d200). By default (and off sm_90)
	 * these run the mma.sync kernel; run with FA_WG_BC=16 for X3S. */
	{
		static const int xd[] = {256, 256, 256, 136, 200, 256};
		static const int xl[][2] = {{4097, 4097}, {129, 4097}, {2100, 2049},
		                            {300, 4097}, {4097, 2048}, {1000, 3000}};
		for (int i = 0; i < 6; i++) {
			struct gcase c = {FA_DTYPE_FP32, FA_PREC_3XTF32, xd[i], xl[i][0], xl[i][1],
			                  G_MASK[i % 3], 1, 2, i == 2 ? 1 : 2, i % 2, i == 3};
			cases[n++] = c;
		}
	}
	/* FA_GPU_GRID_D="160 256": only these head dims (kernel work on some dims, one device call) */
	const char *only = getenv("FA_GPU_GRID_D");
	if (only && *only) {
		int m = 0;
		for (int i = 0; i < n; i++) {
			char want[16];
			snprintf(want, sizeof want, " %d ", cases[i].D);
			char have[128];
			snprintf(have, sizeof have, " %.120s ", only);
			if (strstr(have, want))
				cases[m++] = cases[i];
		}
		printf("FA_GPU_GRID_D=%s: %d of %d cases\n", only, m, n);
		n = m;
	}
	/* FA_GPU_GRID_DT="fp32-bf16": only these kinds (work on one path, one device call) */
	const char *kinds = getenv("FA_GPU_GRID_DT");
	if (kinds && *kinds) {
		int m = 0;
		char have[128];
		snprintf(have, sizeof have, " %.120s ", kinds);
		for (int i = 0; i < n; i++) {
			char want[24];
			int sl = fa_gpu_kind(cases[i].dt, cases[i].prec);
			snprintf(want, sizeof want, " %s ", fa_gpu_kind_name(sl));
			for (char *c = want + 1; c[1]; c++) /* "fp32 bf16" -> "fp32-bf16" */
				if (*c == ' ')
					*c = '-';
			if (strstr(have, want))
				cases[m++] = cases[i];
		}
		printf("FA_GPU_GRID_DT=%s: %d of %d cases\n", kinds, m, n);
		n = m;
	}
	uint64_t t0 = fa_test_now_ms();
	struct prep p = {.cases = cases, .n = n};
	pthread_mutex_init(&p.lock, NULL);
	pthread_t th[16];
	for (int i = 0; i < 16; i++)
		pthread_create(&th[i], NULL, prep_worker, &p);
	for (int i = 0; i < 16; i++)
		pthread_join(th[i], NULL);
	printf("compiled the kernels of %d cases in %.1f s\n", n, (fa_test_now_ms() - t0) / 1e3);
	assert_int_equal(p.errors, 0);
	t0 = fa_test_now_ms();
	/* Cases run on 8 threads (host data and the oracle dominate); launches share the device. */
	struct prep r = {.cases = cases, .n = n};
	pthread_mutex_init(&r.lock, NULL);
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, case_worker, &r);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	printf("%d cases, %d failed, %.1f s\n", ncases, nfail, (fa_test_now_ms() - t0) / 1e3);
	for (int s = 0; s < 6; s++)
		printf("  worst relative error %-12s %.3g\n", fa_gpu_kind_name(s), worst[s]);
	free(cases);
	assert_int_equal(nfail, 0);
}

/* Misaligned strides and pointers are refused before anything runs. */
static void test_attn_fwd_gpu_rejects_misaligned_strides(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	struct gcase c = {FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 16, 16, FA_MASK_NONE, 1, 1, 1, 0};
	struct fa_attn_fwd_desc d;
	make_desc(&c, &d);
	d.q_stride[1] = 68; /* 136 bytes */
	char err[512];
	CUdeviceptr p = 0;
	assert_int_equal(fa_gpu_alloc(gpu, 1 << 20, &p, err, sizeof err), FA_OK);
	assert_int_equal(fa_gpu_attn_fwd(gpu, &d, p, p, p, p + 65536, 0, NULL, err, sizeof err),
	                 FA_EALIGN);
	make_desc(&c, &d);
	assert_int_equal(fa_gpu_attn_fwd(gpu, &d, p + 8, p, p, p + 65536, 0, NULL, err, sizeof err),
	                 FA_EALIGN);
	fa_gpu_free(gpu, p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attn_fwd_gpu_matches_the_float64_reference),
		cmocka_unit_test(test_attn_fwd_gpu_rejects_misaligned_strides),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
