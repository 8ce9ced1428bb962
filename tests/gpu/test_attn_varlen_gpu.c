/* test_attn_varlen_gpu.c - the prefill forward over the inference layouts (fa_gpu_fwd_infer,
 * kernels/gpu_fwd_infer.c: attn_fwd.cu with FA_LAYOUT) on the GPU against the float64 reference
 * of the same layouts (fa_attn_infer_ref64).
 *
 * fa_gpu_fwd_infer is called directly (not through the router fa_gpu_attn_infer), so it must
 * serve decode-sized sequences too. Ragged batches of lengths 1, 17, 127, 129, 1000, 4097 and
 * empty sequences, Sq != Sk per sequence; packed (varlen) and dense queries; packed keys, a
 * contiguous cache with per-sequence lengths, and paged caches (pages of 16, 40, 64, 256 tokens,
 * shuffled page tables whose padding entries hold garbage, partly filled last pages, a pool in
 * [pages, Hkv, page, D] order too) with chunked-prefill query counts (17..1000 queries against
 * longer caches); every mask (causal bottom-right per sequence), GQA 1:1 to 8:1 and MQA, every
 * dtype and fp32 precision, head dims 8..256. O and lse are poisoned (all bits set) before each
 * launch: every row of a sequence must be written and finite (or lse -inf where a row sees no
 * key), and every row outside every sequence (packed rows before the first and after the last)
 * must keep its poison. Tolerances as test_attn_decode_gpu.c (relative Frobenius error: fp32
 * ieee/3xtf32 1e-5, tf32 2e-3, bf16 1e-2, fp16 2e-3; NaN never passes).
 * The sliding window and softcap over every layout (the window aligned per sequence, as
 * fa_attn_key_range says): windows (16, 0), (100, 0), (37, 5), one-sided (-1, 3) and (200, -1),
 * (0, 0), (1, 1), wider than the sequences (5000, 200), alone and with each causal mask, softcaps
 * 5..50 with and without a window, on ragged packed batches (lengths 0, 1 and Sq > Sk included:
 * rows that see no key give O = 0 and lse = -inf), a cache and pages of 16, 48 and 256 with long
 * caches, so that a block's window starts many pages in. The harness also runs those cases with
 * the CPU reference in the kernel's place (no GPU needed), so a failure on the GPU is the
 * kernel's. Without a GPU the GPU tests print why and skip.
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

#include "fa_attn_infer.h"
#include "fa_gpu_infer.h"
#include "fa_ksettings.h"
#include "fa_test.h"

#define MAXB 8

struct vcase {
	int kind; /* 0 fp16, 1 bf16, 2 fp32 ieee, 3 3xtf32, 4 tf32, 5 fp32 staged as bf16 */
	int D;
	fa_mask mask;
	int Hq, Hkv;
	int B;
	int sq[MAXB], sk[MAXB]; /* per sequence (dense queries: sq[0] for all) */
	int packed_q;
	enum fa_kv_layout kv;
	int page;     /* paged: tokens per page */
	int pool_hsd; /* paged: pool laid out [pages, Hkv, page, D] */
	int neg;      /* negative scale */
	int win;      /* a sliding window (wl, wr), fa_attn.h's sides */
	int wl, wr;
	double cap;   /* softcap, 0 off */
};

static struct fa_gpu *gpu;
static char gpu_err[512];
static uint64_t seed0 = 0x51ed270b2b1d3c6full;
static _Thread_local uint64_t rng;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int ncases, nfail;
static double worst[6];

static const fa_dtype K_DT[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
                                FA_DTYPE_FP32, FA_DTYPE_FP32};
static const fa_precision K_PR[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
                                    FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
static const char *K_NAME[] = {"fp16", "bf16", "fp32 ieee", "fp32 3xtf32", "fp32 tf32",
                               "fp32 bf16"};
static const double K_TOL[] = {2e-3, 1e-2, 1e-5, 1e-5, 2e-3, 1e-2};
static const double K_LTOL[] = {2e-4, 2e-4, 2e-4, 2e-4, 1e-2, 8e-2};

/* The host side of a case: descriptor, tensors, index tables. */
struct vdata {
	struct fa_attn_infer_desc d;
	int32_t cu_q[MAXB + 1], cu_k[MAXB + 1], seqlens[MAXB];
	int32_t *pt;
	size_t nq, nk, nl; /* elements of q (= o), of k (= v), of lse */
	void *q, *k, *v, *o;
	float *lse;
};

static void fill_random(void *buf, fa_dtype dt, size_t n, double amp)
{
	for (size_t i = 0; i < n; i++)
		fa_store_elem(buf, dt, (int64_t)i, amp * (2.0 * fa_rand_uniform(&rng) - 1.0));
}

static void build(const struct vcase *c, struct vdata *v)
{
	memset(v, 0, sizeof *v);
	struct fa_attn_infer_desc *d = &v->d;
	struct fa_attn_fwd_desc *f = &d->fwd;
	const fa_dtype dt = K_DT[c->kind];
	const int64_t D = c->D, Hq = c->Hq, Hkv = c->Hkv, B = c->B;
	f->dtype = dt;
	f->precision = K_PR[c->kind];
	f->mask = c->mask;
	f->scale = (c->neg ? -1.0 : 1.0) / sqrt((double)D);
	f->window = c->win != 0;
	f->window_left = c->wl;
	f->window_right = c->wr;
	f->softcap = c->cap;
	f->B = B;
	f->Hq = Hq;
	f->Hkv = Hkv;
	f->D = D;
	int64_t maxq = 1, maxk = 1;
	for (int b = 0; b < B; b++) {
		maxq = c->sq[b] > maxq ? c->sq[b] : maxq;
		maxk = c->sk[b] > maxk ? c->sk[b] : maxk;
	}
	f->Sk = maxk;
	int64_t rows;
	if (c->packed_q) {
		v->cu_q[0] = 3; /* rows before the first sequence: outside every sequence */
		for (int b = 0; b < B; b++)
			v->cu_q[b + 1] = v->cu_q[b] + c->sq[b];
		d->cu_q = v->cu_q;
		d->total_q = v->cu_q[B] + 5; /* and after the last */
		f->Sq = maxq;
		rows = d->total_q;
		int64_t qs[3] = {rows * Hq * D, Hq * D, D};
		memcpy(f->q_stride, qs, sizeof qs);
		memcpy(f->o_stride, qs, sizeof qs);
		f->lse_stride[0] = Hq * rows;
		f->lse_stride[1] = rows;
		f->lse_stride[2] = 1;
	} else {
		f->Sq = c->sq[0];
		rows = B * f->Sq;
		int64_t qs[3] = {f->Sq * Hq * D, Hq * D, D};
		memcpy(f->q_stride, qs, sizeof qs);
		memcpy(f->o_stride, qs, sizeof qs);
		f->lse_stride[0] = Hq * f->Sq;
		f->lse_stride[1] = f->Sq;
		f->lse_stride[2] = 1;
	}
	v->nq = (size_t)(rows * Hq * D);
	v->nl = (size_t)(rows * Hq);
	d->kv = c->kv;
	for (int b = 0; b < B; b++)
		v->seqlens[b] = c->sk[b];
	if (c->kv == FA_KV_PACKED) {
		v->cu_k[0] = 2;
		for (int b = 0; b < B; b++)
			v->cu_k[b + 1] = v->cu_k[b] + c->sk[b];
		d->cu_k = v->cu_k;
		d->total_k = v->cu_k[B] + 3;
		int64_t ks[3] = {d->total_k * Hkv * D, Hkv * D, D};
		memcpy(f->k_stride, ks, sizeof ks);
		v->nk = (size_t)(d->total_k * Hkv * D);
	} else if (c->kv == FA_KV_CACHE) {
		d->seqlens_k = v->seqlens;
		d->cache_rows = maxk + 7;
		int64_t ks[3] = {d->cache_rows * Hkv * D, Hkv * D, D};
		memcpy(f->k_stride, ks, sizeof ks);
		v->nk = (size_t)(B * d->cache_rows * Hkv * D);
	} else {
		const int64_t ps = c->page;
		d->seqlens_k = v->seqlens;
		d->page_size = ps;
		d->pt_cols = (maxk + ps - 1) / ps + 1;
		int64_t used = 0;
		for (int b = 0; b < B; b++)
			used += (c->sk[b] + ps - 1) / ps;
		d->pages = used + 5;
		/* a shuffled pool: sequence pages scattered, some pages nobody uses */
		int32_t *perm = malloc(sizeof(int32_t) * (size_t)d->pages);
		for (int64_t i = 0; i < d->pages; i++)
			perm[i] = (int32_t)i;
		for (int64_t i = d->pages - 1; i > 0; i--) {
			int64_t j = fa_rand_range(&rng, 0, i);
			int32_t t = perm[i];
			perm[i] = perm[j];
			perm[j] = t;
		}
		v->pt = malloc(sizeof(int32_t) * (size_t)(B * d->pt_cols));
		int64_t next = 0;
		for (int b = 0; b < B; b++)
			for (int64_t p = 0; p < d->pt_cols; p++)
				v->pt[b * d->pt_cols + p] = p < (c->sk[b] + ps - 1) / ps ? perm[next++]
				                            : (int32_t)0x7fffffff; /* padding: garbage */
		free(perm);
		d->page_table = v->pt;
		if (c->pool_hsd) {
			int64_t ks[3] = {Hkv * ps * D, D, ps * D};
			memcpy(f->k_stride, ks, sizeof ks);
		} else {
			int64_t ks[3] = {ps * Hkv * D, Hkv * D, D};
			memcpy(f->k_stride, ks, sizeof ks);
		}
		v->nk = (size_t)(d->pages * ps * Hkv * D);
	}
	memcpy(f->v_stride, f->k_stride, sizeof f->k_stride);
	size_t es = fa_dtype_size(dt);
	v->q = malloc(v->nq * es);
	v->o = malloc(v->nq * es);
	v->k = malloc(v->nk * es);
	v->v = malloc(v->nk * es);
	v->lse = malloc(v->nl * sizeof(float));
	assert_non_null(v->q);
	assert_non_null(v->k);
	fill_random(v->q, dt, v->nq, 1.5);
	fill_random(v->k, dt, v->nk, 1.5);
	fill_random(v->v, dt, v->nk, 1.0);
}

static void release(struct vdata *v)
{
	free(v->q);
	free(v->k);
	free(v->v);
	free(v->o);
	free(v->lse);
	free(v->pt);
}

/* Upload, poison, launch, download. FA_OK or the failing status with err. */
static fa_status run_gpu(struct vdata *v, char *err, size_t errlen)
{
	const struct fa_attn_infer_desc *d = &v->d;
	size_t es = fa_dtype_size(d->fwd.dtype);
	int64_t B = d->fwd.B;
	CUdeviceptr dq = 0, dk = 0, dv = 0, dout = 0, dl = 0, dix = 0;
	size_t ptn = d->page_table ? (size_t)(B * d->pt_cols) : 0;
	size_t ixb = sizeof(int32_t) * (size_t)(3 * (B + 1) + ptn) + 64;
	fa_status st;
	if ((st = fa_gpu_alloc(gpu, v->nq * es, &dq, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, v->nk * es, &dk, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, v->nk * es, &dv, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, v->nq * es, &dout, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, v->nl * 4, &dl, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, ixb, &dix, err, errlen)))
		goto out;
	struct fa_gpu_infer_index ix = {0};
	CUdeviceptr at = dix;
	size_t n1 = sizeof(int32_t) * (size_t)(B + 1);
	if ((st = fa_gpu_upload(gpu, dq, v->q, v->nq * es, err, errlen)) ||
	    (st = fa_gpu_upload(gpu, dk, v->k, v->nk * es, err, errlen)) ||
	    (st = fa_gpu_upload(gpu, dv, v->v, v->nk * es, err, errlen)) ||
	    (st = fa_gpu_memset8(gpu, dout, 0xff, v->nq * es, err, errlen)) ||
	    (st = fa_gpu_memset8(gpu, dl, 0xff, v->nl * 4, err, errlen)))
		goto out;
	if (d->cu_q) {
		ix.cu_q = at;
		if ((st = fa_gpu_upload(gpu, at, d->cu_q, n1, err, errlen)))
			goto out;
		at += (n1 + 15) / 16 * 16;
	}
	if (d->cu_k) {
		ix.cu_k = at;
		if ((st = fa_gpu_upload(gpu, at, d->cu_k, n1, err, errlen)))
			goto out;
		at += (n1 + 15) / 16 * 16;
	}
	if (d->seqlens_k) {
		ix.seqlens_k = at;
		if ((st = fa_gpu_upload(gpu, at, d->seqlens_k, n1 - 4, err, errlen)))
			goto out;
		at += (n1 + 15) / 16 * 16;
	}
	if (d->page_table) {
		ix.page_table = at;
		if ((st = fa_gpu_upload(gpu, at, d->page_table, ptn * 4, err, errlen)))
			goto out;
	}
	if ((st = fa_gpu_fwd_infer(gpu, d, &ix, dq, dk, dv, dout, dl, NULL, err, errlen)) ||
	    (st = fa_gpu_sync(gpu, err, errlen)) ||
	    (st = fa_gpu_download(gpu, v->o, dout, v->nq * es, err, errlen)) ||
	    (st = fa_gpu_download(gpu, v->lse, dl, v->nl * 4, err, errlen)))
		goto out;
out:
	fa_gpu_free(gpu, dq);
	fa_gpu_free(gpu, dk);
	fa_gpu_free(gpu, dv);
	fa_gpu_free(gpu, dout);
	fa_gpu_free(gpu, dl);
	fa_gpu_free(gpu, dix);
	return st;
}

static bool all_ones(const void *p, size_t bytes)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < bytes; i++)
		if (c[i] != 0xff)
			return false;
	return true;
}

/* The harness's own check: the CPU reference in the kernel's place, same poison. */
static fa_status run_cpu(struct vdata *v, char *err, size_t errlen)
{
	const struct fa_attn_infer_desc *d = &v->d;
	memset(v->o, 0xff, v->nq * fa_dtype_size(d->fwd.dtype));
	memset(v->lse, 0xff, v->nl * 4);
	fa_status st = fa_attn_infer_ref(d, v->q, v->k, v->v, v->o, v->lse, 0, d->fwd.B * d->fwd.Hq);
	if (st != FA_OK)
		snprintf(err, errlen, "fa_attn_infer_ref");
	return st;
}

static bool run_case(const struct vcase *c, int verbose, bool on_cpu)
{
	struct vdata v;
	build(c, &v);
	const struct fa_attn_infer_desc *d = &v.d;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	const size_t es = fa_dtype_size(f->dtype);
	char err[2048] = "";
	fa_status st = on_cpu ? run_cpu(&v, err, sizeof err) : run_gpu(&v, err, sizeof err);
	const char *what = "";
	double rel = INFINITY, lse_err = 0;
	bool ok = false, clean = true;
	if (st != FA_OK) {
		what = fa_status_name(st);
	} else {
		double *o64 = malloc(sizeof(double) * v.nq), *l64 = malloc(sizeof(double) * v.nl);
		assert_non_null(o64);
		st = fa_attn_infer_ref64(d, v.q, v.k, v.v, o64, l64);
		if (st != FA_OK)
			fail_msg("reference: %s", fa_status_name(st));
		double num = 0, den = 0;
		bool finite = true;
		const int64_t Hq = f->Hq, D = f->D, B = f->B;
		for (int64_t b = 0; b < B; b++) {
			int64_t sq, sk;
			fa_attn_infer_lengths(d, b, &sq, &sk);
			for (int64_t i = 0; i < sq; i++) {
				const int64_t row = d->cu_q ? d->cu_q[b] + i : b * f->Sq + i;
				for (int64_t h = 0; h < Hq; h++) {
					for (int64_t e = 0; e < D; e++) {
						double x = fa_load_elem(v.o, f->dtype,
						                        row * f->o_stride[1] + h * f->o_stride[2] + e);
						double r = o64[(row * Hq + h) * D + e];
						if (!isfinite(x))
							finite = false;
						num += (x - r) * (x - r);
						den += r * r;
					}
					const int64_t li = d->cu_q ? h * d->total_q + row
					                           : (b * Hq + h) * f->Sq + i;
					float gl = v.lse[li];
					double rl = l64[li];
					if (isinf(rl)) {
						if (!(isinf(gl) && gl < 0))
							finite = false;
					} else if (!isfinite(gl)) {
						finite = false;
					} else if (fabs(gl - rl) > lse_err) {
						lse_err = fabs(gl - rl);
					}
				}
			}
		}
		/* packed rows outside every sequence: the poison stays */
		if (d->cu_q) {
			const size_t rb = (size_t)(Hq * D) * es;
			for (int64_t row = 0; row < d->total_q; row++) {
				if (row >= d->cu_q[0] && row < d->cu_q[B])
					continue;
				if (!all_ones((char *)v.o + (size_t)row * rb, rb))
					clean = false;
				for (int64_t h = 0; h < Hq; h++)
					if (!all_ones(&v.lse[h * d->total_q + row], 4))
						clean = false;
			}
		}
		rel = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
		if (!finite)
			rel = INFINITY;
		ok = rel <= K_TOL[c->kind] && lse_err <= K_LTOL[c->kind] && clean;
		what = !finite ? " (non-finite output or poison left)" : !clean ? " (wrote outside)" : "";
		free(o64);
		free(l64);
	}
	pthread_mutex_lock(&out_lock);
	ncases++;
	if (!ok)
		nfail++;
	if (st == FA_OK && (rel > worst[c->kind] || isnan(rel)))
		worst[c->kind] = rel;
	if (!ok || verbose) {
		char lens[160] = "";
		size_t at = 0;
		for (int b = 0; b < c->B && at < sizeof lens - 16; b++)
			at += (size_t)snprintf(lens + at, sizeof lens - at, "%s%dx%d", b ? "," : "",
			                       c->packed_q ? c->sq[b] : c->sq[0], c->sk[b]);
		char ext[64] = "";
		if (c->win || c->cap > 0)
			snprintf(ext, sizeof ext, " win %s(%d, %d) cap %g", c->win ? "" : "off ", c->wl,
			         c->wr, c->cap);
		printf("%s%s %-11s D=%3d Hq=%d Hkv=%d %s %s%s%s %-19s%s [%s] err %.3g (tol %.0e) lse %.3g%s%s%s\n",
		       on_cpu ? "cpu " : "", ok ? "ok  " : "FAIL", K_NAME[c->kind], c->D, c->Hq, c->Hkv,
		       c->packed_q ? "varlen-q" : "dense-q",
		       c->kv == FA_KV_PACKED ? "varlen-k" : c->kv == FA_KV_CACHE ? "cache" : "paged",
		       c->kv == FA_KV_PAGED ? (c->pool_hsd ? "/hsd" : "") : "", c->neg ? " neg" : "",
		       fa_mask_name(c->mask), ext, lens, rel, K_TOL[c->kind], lse_err, what,
		       st != FA_OK ? ": " : "", st != FA_OK ? err : "");
		if (c->kv == FA_KV_PAGED && (!ok || verbose))
			printf("     page size %d\n", c->page);
	}
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
	release(&v);
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
	const uint64_t seed_in = seed ? strtoull(seed, NULL, 0) : (uint64_t)fa_test_now_us();
	seed0 ^= seed_in; /* the value printed is the one to pass back */
	printf("FA_TEST_SEED=0x%llx repeats this run's inputs\n", (unsigned long long)seed_in);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_gpu_close(gpu);
	return 0;
}

struct pool {
	struct vcase *cases;
	int n, next;
	bool on_cpu;
	pthread_mutex_t lock;
};

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
		run_case(&p->cases[i], i < 3, p->on_cpu);
	}
}

static const fa_mask K_MASK[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT,
                                 FA_MASK_CAUSAL_TOP_LEFT};
static const int K_D[] = {64, 128, 8, 40, 72, 160, 256, 96};
static const int K_HEADS[][2] = {{2, 2}, {4, 1}, {8, 2}, {8, 1}}; /* 1:1, 4:1, 4:1, MQA 8:1 */

static void set_lens(struct vcase *c, int B, const int *sq, const int *sk)
{
	c->B = B;
	for (int b = 0; b < B; b++) {
		c->sq[b] = sq[b];
		c->sk[b] = sk[b];
	}
}

/* The sliding window and softcap over every layout: windows of several shapes (one-sided,
 * wider than the sequences, the diagonal alone), each mask in turn, softcaps with and without a
 * window; ragged packed batches with empty sequences and Sq > Sk, a cache of per-sequence
 * lengths, pages of 16, 48 and 256 over caches of 2000 keys (a window starts pages in). */
static int window_cases(struct vcase *cases, int k)
{
	static const int WIN[][2] = {{16, 0}, {100, 0}, {37, 5}, {-1, 3}, {200, -1}, {0, 0},
	                             {5000, 200}, {1, 1}};
	static const double CAP[] = {0, 20, 0, 5, 0, 50, 0, 30};
	static const int RQ[][MAXB] = {{1, 17, 127, 129, 300, 0, 33, 5},
	                               {129, 0, 1, 127, 17, 500, 64, 2}};
	static const int RK[][MAXB] = {{1, 40, 127, 300, 1000, 17, 0, 3},
	                               {127, 5, 1, 1000, 17, 129, 64, 1500}};
	static const int PS[] = {16, 48, 256};
	int n = 0;
	for (int w = 0; w < 8; w++)
		for (int lay = 0; lay < 5; lay++, k++) {
			struct vcase c = {0};
			c.kind = k % 6;
			c.D = K_D[k % 8];
			c.mask = K_MASK[(w + lay) % 3];
			c.Hq = K_HEADS[k % 4][0];
			c.Hkv = K_HEADS[k % 4][1];
			if (c.D >= 160)
				c.Hq = c.Hkv = 2;
			c.win = 1;
			c.wl = WIN[w][0];
			c.wr = WIN[w][1];
			c.cap = CAP[(w + lay) % 8];
			c.neg = k % 9 == 4;
			if (lay == 0) { /* ragged packed queries and keys */
				c.packed_q = 1;
				c.kv = FA_KV_PACKED;
				set_lens(&c, MAXB, RQ[w % 2], RK[w % 2]);
			} else if (lay == 1) { /* dense queries, a cache (an empty sequence) */
				const int sq = (int[]){1, 17, 100, 5}[w % 4];
				int q[5] = {sq, sq, sq, sq, sq}, kk[5] = {0, 17, 1000, 129, 1};
				c.kv = FA_KV_CACHE;
				set_lens(&c, 5, q, kk);
			} else { /* pages of 16, 48, 256: chunked prefill over long caches */
				static const int pq[] = {17, 500, 129, 1, 0, 64};
				static const int pk[] = {2000, 2000, 700, 17, 33, 64};
				c.kv = FA_KV_PAGED;
				c.page = PS[lay - 2];
				c.packed_q = lay != 3;
				if (c.packed_q) {
					set_lens(&c, 6, pq, pk);
				} else {
					int q[3] = {64, 64, 64}, kk[3] = {2000, 64, 0};
					set_lens(&c, 3, q, kk);
				}
			}
			cases[n++] = c;
		}
	/* softcap alone, each layout */
	for (int lay = 0; lay < 3; lay++, k++) {
		struct vcase c = {0};
		c.kind = k % 6;
		c.D = 64;
		c.mask = K_MASK[lay];
		c.Hq = 4;
		c.Hkv = 2;
		c.cap = lay == 0 ? 10 : 30;
		if (lay == 0) {
			c.packed_q = 1;
			c.kv = FA_KV_PACKED;
			set_lens(&c, MAXB, RQ[0], RK[0]);
		} else {
			int q[3] = {300, 1, 17}, kk[3] = {1000, 129, 0};
			c.packed_q = 1;
			c.kv = lay == 1 ? FA_KV_CACHE : FA_KV_PAGED;
			c.page = 48;
			set_lens(&c, 3, q, kk);
		}
		cases[n++] = c;
	}
	return n;
}

static void run_pool(struct vcase *cases, int n, bool on_cpu, int threads)
{
	struct pool p = {.cases = cases, .n = n, .on_cpu = on_cpu};
	pthread_mutex_init(&p.lock, NULL);
	pthread_t th[8];
	for (int i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, case_worker, &p);
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
}

static void test_attn_varlen_gpu_matches_the_float64_reference(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	printf("GPU: %s, sm_%d, opt-in shared memory %zu bytes\n", fa_gpu_name(gpu), fa_gpu_sm(gpu),
	       fa_gpu_smem_optin(gpu));
	struct vcase *cases = calloc(512, sizeof *cases);
	int n = 0, k = 0;
	/* ragged varlen batches, Sq != Sk per sequence, empty sequences (queries or keys) */
	static const int RQ[][MAXB] = {{1, 17, 127, 129, 1000, 0, 33, 5},
	                               {129, 0, 1, 127, 17, 1000, 64, 2},
	                               {4097, 1, 17, 0, 0, 0, 0, 0}};
	static const int RK[][MAXB] = {{1, 40, 127, 300, 1000, 17, 0, 129},
	                               {127, 5, 1, 1000, 17, 129, 64, 4097},
	                               {4097, 129, 1, 17, 0, 0, 0, 0}};
	static const int RB[] = {8, 8, 4};
	for (int r = 0; r < 3; r++)
		for (int a = 0; a < 6; a++)
			for (int m = 0; m < 3; m++, k++) {
				if (r == 2 && (a % 2 || m == 2))
					continue; /* the 4097-key batch: fewer kinds (CPU oracle time) */
				struct vcase c = {0};
				c.kind = a;
				c.D = r == 2 ? 64 : K_D[k % 8];
				c.mask = K_MASK[m];
				c.Hq = K_HEADS[k % 4][0];
				c.Hkv = K_HEADS[k % 4][1];
				if (r == 2 || c.D >= 160) {
					c.Hq = 2;
					c.Hkv = k % 2 ? 1 : 2;
				}
				c.packed_q = 1;
				c.kv = FA_KV_PACKED;
				c.neg = k % 7 == 3;
				set_lens(&c, RB[r], RQ[r], RK[r]);
				cases[n++] = c;
			}
	/* dense queries against a contiguous cache of per-sequence lengths (some empty) */
	for (int a = 0; a < 6; a++)
		for (int m = 0; m < 3; m++, k++) {
			static const int sk[] = {0, 17, 1000, 129, 1, 300};
			const int sq = (int[]){1, 17, 5, 100}[k % 4];
			int q[6] = {sq, sq, sq, sq, sq, sq};
			struct vcase c = {a, K_D[k % 8], K_MASK[m], K_HEADS[k % 4][0], K_HEADS[k % 4][1]};
			c.kv = FA_KV_CACHE;
			set_lens(&c, 6, q, sk);
			cases[n++] = c;
		}
	/* paged caches: chunked prefill (17..1000 new queries against longer caches), page sizes
	 * 16, 40 (not a power of two), 64, 256; packed and dense queries; one pool [pages, Hkv,
	 * page, D] */
	static const int PS[] = {16, 64, 256, 40};
	for (int a = 0; a < 6; a++)
		for (int pi = 0; pi < 4; pi++, k++) {
			static const int pq[] = {17, 1000, 129, 1, 0};
			static const int pk[] = {500, 1000, 2000, 17, 33};
			struct vcase c = {a, K_D[k % 8], K_MASK[k % 3], K_HEADS[k % 4][0], K_HEADS[k % 4][1]};
			if (c.D >= 160)
				c.Hq = c.Hkv = 2;
			c.kv = FA_KV_PAGED;
			c.page = PS[pi];
			c.pool_hsd = pi == 3;
			c.packed_q = pi != 2;
			if (c.packed_q) {
				set_lens(&c, 5, pq, pk);
			} else {
				int q[4] = {64, 64, 64, 64}, kk[4] = {64, 700, 1001, 0};
				set_lens(&c, 4, q, kk);
			}
			cases[n++] = c;
		}
	/* a long chunked prefill: 1000 queries after 3097 cached keys, bf16 D=128 GQA 4:1 */
	{
		struct vcase c = {1, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 4, 1};
		int q[1] = {1000}, kk[1] = {4097};
		c.kv = FA_KV_PAGED;
		c.page = 16;
		c.packed_q = 1;
		set_lens(&c, 1, q, kk);
		cases[n++] = c;
	}
	n += window_cases(cases + n, k);
	uint64_t t0 = fa_test_now_ms();
	run_pool(cases, n, false, 8);
	printf("%d cases, %d failed, %.1f s\n", ncases, nfail, (fa_test_now_ms() - t0) / 1e3);
	for (int s = 0; s < 6; s++)
		printf("  worst relative error %-12s %.3g\n", K_NAME[s], worst[s]);
	free(cases);
	assert_int_equal(nfail, 0);
}

/* The harness on the CPU (no GPU needed: CI runs it): the window and softcap cases with the CPU
 * reference in the kernel's place pass the same comparison (poison, -inf rows, tolerances). */
static void test_attn_varlen_harness_passes_with_the_cpu_reference(void **state)
{
	(void)state;
	struct vcase *cases = calloc(64, sizeof *cases);
	int n = window_cases(cases, 0);
	int before = nfail;
	run_pool(cases, n, true, 2);
	printf("%d window and softcap cases on the CPU reference, %d failed\n", n, nfail - before);
	free(cases);
	assert_int_equal(nfail, before);
}

/* Refusals before anything runs: misaligned pointers and strides, a negative softcap, a missing
 * device table, a bad index entry (the host copy is checked). */
static void test_attn_varlen_gpu_refuses_bad_input(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	rng = seed0;
	struct vcase c = {1, 64, FA_MASK_NONE, 2, 2};
	int q[2] = {17, 5}, kk[2] = {40, 3};
	c.packed_q = 1;
	c.kv = FA_KV_PAGED;
	c.page = 16;
	set_lens(&c, 2, q, kk);
	struct vdata v;
	build(&c, &v);
	char err[512];
	CUdeviceptr p = 0;
	assert_int_equal(fa_gpu_alloc(gpu, 1 << 22, &p, err, sizeof err), FA_OK);
	struct fa_gpu_infer_index ix = {p, p, p, p};
	assert_int_equal(fa_gpu_fwd_infer(gpu, &v.d, &ix, p + 8, p, p, p, 0, NULL, err, sizeof err),
	                 FA_EALIGN);
	struct fa_attn_infer_desc d = v.d;
	d.fwd.q_stride[1] = 68; /* 136 bytes */
	assert_int_equal(fa_gpu_fwd_infer(gpu, &d, &ix, p, p, p, p, 0, NULL, err, sizeof err),
	                 FA_EALIGN);
	d = v.d;
	d.fwd.window = true;
	d.fwd.window_left = 8;
	d.fwd.window_right = 0;
	d.fwd.softcap = -1;
	assert_int_equal(fa_gpu_fwd_infer(gpu, &d, &ix, p, p, p, p, 0, NULL, err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "softcap"));
	struct fa_gpu_infer_index none = {p, 0, p, 0};
	assert_int_equal(fa_gpu_fwd_infer(gpu, &v.d, &none, p, p, p, p, 0, NULL, err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "page_table"));
	v.pt[1] = (int32_t)v.d.pages; /* sequence 0's second page: past the pool */
	assert_int_equal(fa_gpu_fwd_infer(gpu, &v.d, &ix, p, p, p, p, 0, NULL, err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "page_table[0][1]"));
	fa_gpu_free(gpu, p);
	release(&v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attn_varlen_harness_passes_with_the_cpu_reference),
		cmocka_unit_test(test_attn_varlen_gpu_matches_the_float64_reference),
		cmocka_unit_test(test_attn_varlen_gpu_refuses_bad_input),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
