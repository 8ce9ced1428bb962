/* test_attn_window_gpu.c - the sliding window and logit softcapping (fa_attn.h: window,
 * window_left/right, softcap) in the GPU kernels (attn_fwd.cu, attn_fwd_sm90.cu, attn_decode.cu:
 * FA_WIN, FA_SOFTCAP) against the CPU float64 reference, which implements both
 * (fa_attn_key_range is the rule).
 *
 * Three paths, each forced and checked by the kernel name that ran: mma.sync (the planner's
 * first non-wgmma tile, launched explicitly), wgmma (its first wgmma tile on a handle with
 * FA_WGMMA16=1; counted as not offered where the planner has none for the shape) and decode
 * (FA_DECODE=1, Sq <= 16). Grid: lengths 1, 17, 127, 129, 1000, 4097 with Sq != Sk x every
 * dtype and fp32 precision x windows (0, 0), (w, w), (w, -1), (-1, w), large left windows (more
 * than the sequence: the left side unbounded), masks combined with windows, softcaps 5..50 with
 * and without a window; then (-1, 0) on no mask against the causal reference, and a window that
 * bounds nothing against the dense reference. O and lse are poisoned (all bits set: NaN) before
 * each launch; tolerances as ARCHITECTURE.md (relative Frobenius error: fp32 ieee/3xtf32 1e-5,
 * tf32 2e-3, bf16 1e-2, fp16 2e-3; NaN never passes) and the logsumexp; rows that see no key
 * must give O = 0 and lse = -inf. Small cases use fa_attn_fwd_ref64; large ones a float64
 * oracle (the same rule) on sampled rows, after checking that no element kept its poison.
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

enum { PATH_MMA, PATH_WG, PATH_DEC };
static const char *path_name[] = {"mma.sync", "wgmma", "decode"};

struct wcase {
	fa_dtype dt;
	fa_precision prec;
	int D, Sq, Sk;
	fa_mask mask;
	int B, Hq, Hkv;
	bool window;
	int64_t wl, wr;
	double cap;
	int path;
	bool as_causal; /* the reference is the causal mask without the window (window (-1, 0)) */
	bool bhsd;
};

static struct fa_gpu *gpu, *gpu_wg, *gpu_dec;
static char gpu_err[512];
static uint64_t seed0 = 0x2545f4914f6cdd1dull;
static _Thread_local uint64_t rng;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int ncases, nfail, nskipped, npath[3];
static double worst[6];

static void make_desc(const struct wcase *c, struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
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
	d->window = c->window;
	d->window_left = c->wl;
	d->window_right = c->wr;
	d->softcap = c->cap;
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

/* The descriptor the reference runs: the case's, or (as_causal) the causal mask alone. */
static void ref_desc(const struct wcase *c, struct fa_attn_fwd_desc *d)
{
	make_desc(c, d);
	if (c->as_causal) {
		d->window = false;
		d->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	}
}

/* The tile of the case's path: mma.sync's or wgmma's first candidate; NULL for decode (the
 * handle's own choice). false when the planner offers none of the path. */
static bool path_tile(const struct wcase *c, const struct fa_attn_fwd_desc *d, struct fa_tile *t,
                      char *err, size_t errlen)
{
	struct fa_tile cand[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	if (fa_gpu_plan(c->path == PATH_WG ? gpu_wg : gpu, d, cand, FA_PLAN_MAX_CANDIDATES, &n, err,
	                errlen) != FA_OK)
		return false;
	for (int i = 0; i < n; i++)
		if (fa_kpath_is_wg(cand[i].path) == (c->path == PATH_WG)) {
			*t = cand[i];
			return true;
		}
	snprintf(err, errlen, "no %s tile offered", path_name[c->path]);
	return false;
}

static struct fa_gpu *path_gpu(const struct wcase *c)
{
	return c->path == PATH_WG ? gpu_wg : c->path == PATH_DEC ? gpu_dec : gpu;
}

static void run_case(const struct wcase *c, bool verbose)
{
	struct fa_attn_fwd_desc d, rd;
	make_desc(c, &d);
	ref_desc(c, &rd);
	char err[2048] = "";
	struct fa_tile t;
	const struct fa_tile *tp = NULL;
	if (c->path != PATH_DEC) {
		if (!path_tile(c, &d, &t, err, sizeof err)) {
			pthread_mutex_lock(&out_lock);
			nskipped++;
			if (verbose)
				printf("not offered: %s D=%d Sq=%d Sk=%d: %s\n", path_name[c->path], c->D,
				       c->Sq, c->Sk, err);
			pthread_mutex_unlock(&out_lock);
			return;
		}
		tp = &t;
	}
	struct fa_gpu *g = path_gpu(c);
	size_t es = fa_dtype_size(c->dt);
	size_t nq = (size_t)c->B * c->Sq * c->Hq * c->D, nk = (size_t)c->B * c->Sk * c->Hkv * c->D;
	size_t nl = (size_t)c->B * c->Hq * c->Sq;
	void *q = malloc(nq * es), *k = malloc(nk * es), *v = malloc(nk * es), *o = malloc(nq * es);
	float *lse = malloc(nl * sizeof(float));
	assert_non_null(q);
	assert_non_null(k);
	assert_non_null(v);
	assert_non_null(o);
	assert_non_null(lse);
	/* large scores, so that the softcap's tanh saturates for some keys */
	fa_gpu_fill_random(q, c->dt, nq, c->cap > 0 ? 4.0 : 1.5, &rng);
	fa_gpu_fill_random(k, c->dt, nk, c->cap > 0 ? 4.0 : 1.5, &rng);
	fa_gpu_fill_random(v, c->dt, nk, 1.0, &rng);
	CUdeviceptr dq = 0, dk = 0, dv = 0, dov = 0, dl = 0;
	fa_status st;
	if ((st = fa_gpu_alloc(g, nq * es, &dq, err, sizeof err)) ||
	    (st = fa_gpu_alloc(g, nk * es, &dk, err, sizeof err)) ||
	    (st = fa_gpu_alloc(g, nk * es, &dv, err, sizeof err)) ||
	    (st = fa_gpu_alloc(g, nq * es, &dov, err, sizeof err)) ||
	    (st = fa_gpu_alloc(g, nl * 4, &dl, err, sizeof err)) ||
	    (st = fa_gpu_upload(g, dq, q, nq * es, err, sizeof err)) ||
	    (st = fa_gpu_upload(g, dk, k, nk * es, err, sizeof err)) ||
	    (st = fa_gpu_upload(g, dv, v, nk * es, err, sizeof err)) ||
	    (st = fa_gpu_memset8(g, dov, 0xff, nq * es, err, sizeof err)) ||
	    (st = fa_gpu_memset8(g, dl, 0xff, nl * 4, err, sizeof err)))
		fail_msg("setup: %s", err);
	char kname[96] = "";
	bool ready = false;
	if (c->path == PATH_DEC) {
		st = fa_gpu_kernel_lookup(g, &d, &ready, kname, sizeof kname, err, sizeof err);
		if (st == FA_OK && !strstr(kname, " dec ")) {
			snprintf(err, sizeof err, "not the decode kernel: %s", kname);
			st = FA_EINTERNAL;
		}
	} else {
		fa_tile_format(tp, kname, sizeof kname);
	}
	if (st == FA_OK)
		st = fa_gpu_attn_fwd_tile(g, &d, tp, dq, dk, dv, dov, dl, NULL, err, sizeof err);
	if (st == FA_OK)
		st = fa_gpu_sync(g, err, sizeof err);
	if (st == FA_OK && ((st = fa_gpu_download(g, o, dov, nq * es, err, sizeof err)) ||
	                    (st = fa_gpu_download(g, lse, dl, nl * 4, err, sizeof err))))
		fail_msg("download: %s", err);
	fa_gpu_free(g, dq);
	fa_gpu_free(g, dk);
	fa_gpu_free(g, dv);
	fa_gpu_free(g, dov);
	fa_gpu_free(g, dl);
	double rel = INFINITY, lse_err = 0;
	bool finite = st == FA_OK;
	/* every element written (the poison is NaN), nothing NaN or +inf */
	for (int64_t b = 0; b < c->B && finite; b++)
		for (int64_t i = 0; i < c->Sq && finite; i++)
			for (int64_t h = 0; h < c->Hq && finite; h++)
				for (int64_t e = 0; e < c->D && finite; e++)
					finite = isfinite(fa_load_elem(o, c->dt, b * d.o_stride[0] +
					                               i * d.o_stride[1] + h * d.o_stride[2] + e));
	for (size_t i = 0; i < nl && finite; i++)
		finite = !isnan(lse[i]) && !(isinf(lse[i]) && lse[i] > 0);
	double work = (double)c->B * c->Hq * c->Sq * (double)c->Sk * c->D;
	if (finite && work <= 2e7) {
		double *o64 = malloc(sizeof(double) * nq), *l64 = malloc(sizeof(double) * nl);
		if (fa_attn_fwd_ref64(&rd, q, k, v, o64, l64) != FA_OK)
			fail_msg("reference failed");
		rel = fa_attn_fwd_rel_error(&d, o, o64);
		for (int64_t b = 0; b < c->B; b++)
			for (int64_t h = 0; h < c->Hq; h++)
				for (int64_t i = 0; i < c->Sq; i++) {
					double r = l64[(b * c->Hq + h) * c->Sq + i];
					float gl = lse[b * d.lse_stride[0] + h * d.lse_stride[1] + i];
					if (isinf(r)) {
						if (!(isinf(gl) && gl < 0))
							finite = false;
					} else if (!isfinite(gl) || fabs(gl - r) > lse_err) {
						lse_err = isfinite(gl) ? fabs(gl - r) : INFINITY;
					}
				}
		free(o64);
		free(l64);
	} else if (finite) {
		/* rows: the first and last 24, 40 sampled, of every (batch, head) */
		double num = 0, den = 0;
		double *ob = malloc(sizeof(double) * (size_t)c->D), *sc = malloc(sizeof(double) * (size_t)c->Sk);
		for (int64_t b = 0; b < c->B; b++)
			for (int64_t h = 0; h < c->Hq; h++)
				for (int r = 0; r < 88 && r < c->Sq; r++) {
					int64_t i = c->Sq <= 88 ? r : r < 24 ? r : r < 48 ? c->Sq - 1 - (r - 24)
					          : fa_rand_range(&rng, 0, c->Sq - 1);
					double l64;
					fa_gpu_oracle_row(&rd, q, k, v, b, h, i, ob, &l64, sc);
					for (int64_t e = 0; e < c->D; e++) {
						double x = fa_load_elem(o, c->dt, b * d.o_stride[0] + i * d.o_stride[1] + h * d.o_stride[2] + e);
						num += (x - ob[e]) * (x - ob[e]);
						den += ob[e] * ob[e];
					}
					float gl = lse[b * d.lse_stride[0] + h * d.lse_stride[1] + i];
					if (isinf(l64)) {
						if (!(isinf(gl) && gl < 0))
							finite = false;
					} else if (!isfinite(gl) || fabs(gl - l64) > lse_err) {
						lse_err = isfinite(gl) ? fabs(gl - l64) : INFINITY;
					}
				}
		rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
		free(ob);
		free(sc);
	}
	if (!finite)
		rel = INFINITY;
	double tol = fa_gpu_tol(c->dt, c->prec), ltol = fa_gpu_lse_tol(c->dt, c->prec);
	bool ok = rel <= tol && lse_err <= ltol; /* NaN compares false: never passes */
	int s = fa_gpu_kind(c->dt, c->prec);
	pthread_mutex_lock(&out_lock);
	ncases++;
	npath[c->path]++;
	if (ok && (rel > worst[s]))
		worst[s] = rel;
	if (!ok)
		nfail++;
	if (!ok || verbose) {
		char win[48] = "no window";
		if (c->window)
			snprintf(win, sizeof win, "window (%lld, %lld)%s", (long long)c->wl,
			         (long long)c->wr, c->as_causal ? " = causal" : "");
		printf("%s %-8s %-11s D=%3d Sq=%4d Sk=%4d B=%d Hq=%d Hkv=%d %-9s %s cap %g %-18s err "
		       "%.3g (tol %.0e) lse %.3g%s%s%s\n", ok ? "ok  " : "FAIL", path_name[c->path],
		       fa_gpu_kind_name(s), c->D, c->Sq, c->Sk, c->B, c->Hq, c->Hkv, fa_mask_name(c->mask), win,
		       c->cap, kname, rel, tol, lse_err, finite ? "" : " (non-finite output or poison left)",
		       st ? ": " : "", st ? err : "");
	}
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
	free(q);
	free(k);
	free(v);
	free(o);
	free(lse);
}

static int setup(void **state)
{
	(void)state;
	struct fa_kernel_settings ks;
	char e[256];
	fa_test_kernel_settings(&ks);
	fa_kernel_settings_set(&ks, "FA_DECODE", "0", e, sizeof e);
	if (fa_gpu_open(&gpu, 0, &ks, gpu_err, sizeof gpu_err) != FA_OK)
		gpu = NULL;
	fa_kernel_settings_set(&ks, "FA_WGMMA16", "1", e, sizeof e);
	if (gpu && fa_gpu_open(&gpu_wg, 0, &ks, gpu_err, sizeof gpu_err) != FA_OK)
		gpu_wg = NULL;
	fa_test_kernel_settings(&ks);
	fa_kernel_settings_set(&ks, "FA_DECODE", "1", e, sizeof e);
	if (gpu && fa_gpu_open(&gpu_dec, 0, &ks, gpu_err, sizeof gpu_err) != FA_OK)
		gpu_dec = NULL;
	if (!gpu_wg || !gpu_dec) {
		fa_gpu_close(gpu);
		fa_gpu_close(gpu_wg);
		fa_gpu_close(gpu_dec);
		gpu = gpu_wg = gpu_dec = NULL;
	}
	const char *seed = getenv("FA_TEST_SEED");
	const uint64_t seed_in = seed ? strtoull(seed, NULL, 0) : (uint64_t)fa_test_now_us();
	seed0 ^= seed_in; /* the value printed is the one to pass back */
	printf("FA_TEST_SEED=0x%llx repeats this run's inputs\n", (unsigned long long)seed_in);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_gpu_close(gpu);
	fa_gpu_close(gpu_wg);
	fa_gpu_close(gpu_dec);
	return 0;
}

struct pool {
	struct wcase *cases;
	int n, next;
	pthread_mutex_t lock;
	int errors;
};

/* Compile every case's kernel on many threads first (NVRTC dominates otherwise). */
static void *prep_worker(void *arg)
{
	struct pool *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		int i = p->next++;
		pthread_mutex_unlock(&p->lock);
		if (i >= p->n)
			return NULL;
		const struct wcase *c = &p->cases[i];
		struct fa_attn_fwd_desc d;
		struct fa_tile t;
		char err[2048];
		make_desc(c, &d);
		if (c->path != PATH_DEC && !path_tile(c, &d, &t, err, sizeof err))
			continue; /* counted when the case runs */
		if (fa_gpu_prepare(path_gpu(c), &d, c->path == PATH_DEC ? NULL : &t, err, sizeof err) !=
		    FA_OK) {
			printf("prepare: %s\n", err);
			pthread_mutex_lock(&p->lock);
			p->errors++;
			pthread_mutex_unlock(&p->lock);
		}
	}
}

static void *case_worker(void *arg)
{
	struct pool *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		int i = p->next++;
		pthread_mutex_unlock(&p->lock);
		if (i >= p->n)
			return NULL;
		rng = seed0 ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
		run_case(&p->cases[i], i < 4 || getenv("FA_TEST_VERBOSE"));
	}
}

static const fa_dtype G_DT[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
                                FA_DTYPE_FP32, FA_DTYPE_FP32};
static const fa_precision G_PR[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
                                    FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
static const fa_mask G_MASK[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT, FA_MASK_CAUSAL_TOP_LEFT};
static const int G_LEN[][2] = {{1, 1}, {17, 17}, {127, 129}, {129, 127}, {1000, 1000},
                               {4097, 4097}, {17, 1000}, {1000, 17}, {129, 4097}};
static const double G_CAP[] = {5, 10, 30, 50};

/* Window kind w of length pair (Sq, Sk): (0, 0), (w, w), (w, -1), (-1, w), a left window
 * larger than the sequence with a right one, (w, 0) (sliding causal). */
static void set_window(struct wcase *c, int w)
{
	int64_t span = c->Sk < 64 ? 3 : c->Sk / 7;
	c->window = true;
	switch (w % 6) {
	case 0: c->wl = 0; c->wr = 0; break;
	case 1: c->wl = span; c->wr = span; break;
	case 2: c->wl = span; c->wr = -1; break;
	case 3: c->wl = -1; c->wr = span / 2; break;
	case 4: c->wl = c->Sk + c->Sq + 100; c->wr = 5; break;
	default: c->wl = span * 2; c->wr = 0; break;
	}
}

static void test_attn_window_gpu_matches_the_float64_reference(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	printf("GPU: %s, sm_%d\n", fa_gpu_name(gpu), fa_gpu_sm(gpu));
	struct wcase *cases = calloc(4096, sizeof *cases);
	int n = 0, k = 0;
	/* lengths x kinds x the two prefill paths: a window (kind rotating, masks combined), a
	 * softcap (with a window every other case) */
	for (size_t li = 0; li < sizeof G_LEN / sizeof G_LEN[0]; li++)
		for (int a = 0; a < 6; a++)
			for (int path = PATH_MMA; path <= PATH_WG; path++)
				for (int v = 0; v < 2; v++, k++) {
					struct wcase c = {0};
					c.dt = G_DT[a];
					c.prec = G_PR[a];
					c.D = (k % 7 == 6) ? 40 : (k % 3 == 0) ? 128 : 64;
					c.Sq = G_LEN[li][0];
					c.Sk = G_LEN[li][1];
					c.mask = G_MASK[(k / 2) % 3];
					c.B = c.Sk >= 4000 ? 1 : 2;
					c.Hq = k % 2 ? 4 : 2;
					c.Hkv = k % 4 == 1 ? 1 : 2;
					if (c.Hq % c.Hkv)
						c.Hkv = 1;
					c.path = path;
					c.bhsd = k % 3 == 1;
					if (v == 0) {
						set_window(&c, k / 2 + a);
					} else {
						c.cap = G_CAP[k % 4];
						if (k % 4 < 2)
							set_window(&c, k + li);
					}
					cases[n++] = c;
				}
	/* decode: Sq 1, 2, 5, 16 x long caches x kinds, windows and softcaps */
	static const int dsq[] = {1, 2, 5, 16}, dsk[] = {17, 1000, 4097, 9000};
	for (int qi = 0; qi < 4; qi++)
		for (int si = 0; si < 4; si++)
			for (int a = 0; a < 6; a += 1 + (qi + si) % 2, k++) {
				struct wcase c = {G_DT[a], G_PR[a], qi % 2 ? 128 : 64, dsq[qi], dsk[si],
				                  G_MASK[k % 3], 2, 8, 2, false, 0, 0, 0, PATH_DEC, false,
				                  k % 2 == 1};
				if (k % 3 != 2)
					set_window(&c, k);
				if (k % 3 != 0)
					c.cap = G_CAP[k % 4];
				if (k % 5 == 0) { /* the serving engines' long sliding window */
					c.window = true;
					c.wl = dsk[si] / 3;
					c.wr = 0;
				}
				cases[n++] = c;
			}
	/* (-1, 0) on no mask is the causal mask; a window that bounds nothing is none; both on
	 * every path */
	for (int path = PATH_MMA; path <= PATH_DEC; path++)
		for (int a = 0; a < 6; a += 2) {
			int sq = path == PATH_DEC ? 3 : 300, sk = 1000;
			struct wcase c = {G_DT[a + 1], G_PR[a + 1], 64, sq, sk, FA_MASK_NONE, 1, 4, 2, true,
			                  -1, 0, 0, path, true, false};
			cases[n++] = c;
			c.as_causal = false;
			c.wl = c.wr = -1;
			c.cap = a == 2 ? 20 : 0;
			cases[n++] = c;
			c.wl = 0; /* the diagonal alone */
			c.wr = 0;
			cases[n++] = c;
		}
	const char *only = getenv("FA_GPU_WINDOW_PATH"); /* "decode": one path (a re-run) */
	if (only && *only) {
		int m = 0;
		for (int i = 0; i < n; i++)
			if (strcmp(path_name[cases[i].path], only) == 0)
				cases[m++] = cases[i];
		n = m;
	}
	uint64_t t0 = fa_test_now_ms();
	struct pool p = {.cases = cases, .n = n};
	pthread_mutex_init(&p.lock, NULL);
	pthread_t th[16];
	for (int i = 0; i < 16; i++)
		pthread_create(&th[i], NULL, prep_worker, &p);
	for (int i = 0; i < 16; i++)
		pthread_join(th[i], NULL);
	printf("compiled the kernels of %d cases in %.1f s\n", n, (fa_test_now_ms() - t0) / 1e3);
	assert_int_equal(p.errors, 0);
	t0 = fa_test_now_ms();
	struct pool r = {.cases = cases, .n = n};
	pthread_mutex_init(&r.lock, NULL);
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, case_worker, &r);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	printf("%d cases (mma.sync %d, wgmma %d, decode %d), %d failed, %d not offered on their "
	       "path, %.1f s\n", ncases, npath[PATH_MMA], npath[PATH_WG], npath[PATH_DEC], nfail,
	       nskipped, (fa_test_now_ms() - t0) / 1e3);
	for (int s = 0; s < 6; s++)
		printf("  worst relative error %-12s %.3g\n", fa_gpu_kind_name(s), worst[s]);
	free(cases);
	assert_int_equal(nfail, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attn_window_gpu_matches_the_float64_reference),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
