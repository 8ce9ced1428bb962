/* bench_attn_paged.c - decode over the inference layouts (kernels/gpu_infer.c) against the dense
 * decode, through the launch API: on the shapes (bf16, D=128, 32 query heads, 8 kv heads:
 * B=16 x 8k keys, B=64 x 2k, B=1 x 32k) the dense decode (fa_gpu_attn_fwd; BHSD as
 * bench_attn_decode and tools/sdpa_decode_anchors.py, and BSHD, the cache's own layout), a
 * contiguous KV cache (fa_gpu_attn_infer, FA_KV_CACHE, every length Sk) and paged caches of 16
 * and 256 tokens a page (pages in a shuffled order); then a ragged batch (16 sequences of random
 * lengths up to 8k) as a cache and as pages of 16; then a sliding window of 4096 keys over
 * B=4 x 16k (causal, window (4095, 0)) beside the same batch without it and B=4 x 4k (the
 * window's keys): issue 11's target is a time proportional to the window. Time and TB/s of the K
 * and V bytes the sequences hold (each read once; with the window, the keys it sees).
 *
 * Timing as bench_attn_decode.c: CUDA events around 20 back-to-back launches, the median of 5,
 * launches rotated over enough K/V copies that L2 never holds the next one's inputs.
 * FA_BENCH_SWEEP=1 also times forced splits (FA_DECODE_SPLITS 1..64, a device handle each,
 * kernels through a disk cache in $TMPDIR) of the dense and paged-16 layouts on the three shapes
 * and of the cache and paged-16 layouts on the ragged batch: the planner's split rules against
 * the measured best. FA_BENCH_TSV=path appends one
 * tab-separated line per measurement. Prints "no GPU: skipped" and exits 0 without a GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu_infer.h"
#include "fa_infer_route.h"
#include "fa_ksettings.h"

struct shape {
	const char *name;
	int B, Sk;
	bool ragged; /* lengths uniform in [1, Sk] */
	int wl;      /* >= 0: causal with the window (wl, 0) */
};

static const struct shape shapes[] = {
	{"issue-1 B16 8k", 16, 8192, false, -1},
	{"issue-2 B64 2k", 64, 2048, false, -1},
	{"issue-3 B1 32k", 1, 32768, false, -1},
	{"ragged B16 <=8k", 16, 8192, true, -1},
	{"B4 4k", 4, 4096, false, -1},
	{"B4 16k", 4, 16384, false, -1},
	{"B4 16k win 4k", 4, 16384, false, 4095},
};
enum { D = 128, HQ = 32, HKV = 8, MAXSETS = 8, BATCH = 20, BATCHES = 5 };

/* The layouts timed. */
enum lay { DENSE_BHSD, DENSE_BSHD, CACHE, PAGED16, PAGED256, NLAY };
static const char *const lay_name[NLAY] = {"dense BHSD", "dense BSHD", "cache", "paged 16",
                                           "paged 256"};

static struct fa_gpu *g;
static FILE *tsv;

/* One set of inputs of a layout: the descriptor (host tables), device tensors and tables. */
struct set {
	struct fa_attn_infer_desc d;
	int32_t *lens, *pt;
	CUdeviceptr q, k, v, tab;
	struct fa_gpu_infer_index ix;
};

static int fill(CUdeviceptr p, size_t bytes, uint64_t seed)
{
	const size_t piece = 16u << 20;
	unsigned char *h = malloc(piece);
	if (!h)
		return -1;
	uint64_t x = seed | 1;
	for (size_t i = 0; i < piece / 2; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		fa_store_elem(h, FA_DTYPE_BF16, (int64_t)i,
		              (double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
	}
	char err[256];
	for (size_t off = 0; off < bytes; off += piece) {
		size_t n = bytes - off < piece ? bytes - off : piece;
		if (fa_gpu_upload(g, p + off, h, n, err, sizeof err) != FA_OK) {
			fprintf(stderr, "upload: %s\n", err);
			free(h);
			return -1;
		}
	}
	free(h);
	return 0;
}

/* Build set s of layout l for shape sh (lengths lens[B]); 0 or -1. */
static int make_set(const struct shape *sh, enum lay l, const int32_t *lens, uint64_t seed,
                    struct set *s, char *err, size_t errlen)
{
	memset(s, 0, sizeof *s);
	struct fa_attn_infer_desc *d = &s->d;
	struct fa_attn_fwd_desc *f = &d->fwd;
	const int64_t B = sh->B, Sk = sh->Sk;
	f->dtype = FA_DTYPE_BF16;
	f->scale = 1.0 / sqrt((double)D);
	f->B = B, f->Sq = 1, f->Sk = Sk, f->Hq = HQ, f->Hkv = HKV, f->D = D;
	if (sh->wl >= 0) {
		f->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
		f->window = true;
		f->window_left = sh->wl;
		f->window_right = 0;
	}
	int64_t q[3] = {HQ * D, D, D}; /* Sq = 1: BSHD and BHSD alike */
	memcpy(f->q_stride, q, sizeof q);
	memcpy(f->o_stride, q, sizeof q);
	f->lse_stride[0] = HQ, f->lse_stride[1] = 1, f->lse_stride[2] = 1;
	int64_t rows = B * Sk, ps = l == PAGED16 ? 16 : 256, pages = 0;
	if (l == DENSE_BHSD) {
		int64_t k[3] = {HKV * Sk * D, D, Sk * D};
		memcpy(f->k_stride, k, sizeof k);
	} else if (l == DENSE_BSHD || l == CACHE) {
		int64_t k[3] = {Sk * HKV * D, HKV * D, D};
		memcpy(f->k_stride, k, sizeof k);
	} else {
		int64_t k[3] = {ps * HKV * D, HKV * D, D};
		memcpy(f->k_stride, k, sizeof k);
	}
	memcpy(f->v_stride, f->k_stride, sizeof f->k_stride);
	if (l == CACHE || l == PAGED16 || l == PAGED256) {
		s->lens = malloc(sizeof(int32_t) * (size_t)B);
		memcpy(s->lens, lens, sizeof(int32_t) * (size_t)B);
		d->seqlens_k = s->lens;
		d->kv = l == CACHE ? FA_KV_CACHE : FA_KV_PAGED;
		d->cache_rows = Sk;
	}
	if (l == PAGED16 || l == PAGED256) {
		int64_t cols = (Sk + ps - 1) / ps;
		pages = B * cols;
		rows = pages * ps;
		int32_t *perm = malloc(sizeof(int32_t) * (size_t)pages);
		for (int64_t i = 0; i < pages; i++)
			perm[i] = (int32_t)i;
		uint64_t x = seed * 2654435761u + 1;
		for (int64_t i = pages - 1; i > 0; i--) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			int64_t j = (int64_t)(x % (uint64_t)(i + 1));
			int32_t t = perm[i];
			perm[i] = perm[j], perm[j] = t;
		}
		s->pt = perm; /* [B][cols]: sequence b's pages are perm[b * cols ...] */
		d->page_table = s->pt;
		d->pt_cols = cols;
		d->pages = pages;
		d->page_size = ps;
	}
	size_t kb = (size_t)(rows * HKV * D) * 2;
	size_t tb = (size_t)(B + 1 + (pages > 0 ? pages : 0)) * 4;
	if (fa_gpu_alloc(g, (size_t)(B * HQ * D) * 2, &s->q, err, errlen) ||
	    fa_gpu_alloc(g, kb, &s->k, err, errlen) || fa_gpu_alloc(g, kb, &s->v, err, errlen) ||
	    fa_gpu_alloc(g, tb, &s->tab, err, errlen) || fill(s->q, (size_t)(B * HQ * D) * 2, seed) ||
	    fill(s->k, kb, seed + 1) || fill(s->v, kb, seed + 2))
		return -1;
	if (d->seqlens_k) {
		s->ix.seqlens_k = s->tab;
		if (fa_gpu_upload(g, s->tab, s->lens, (size_t)B * 4, err, errlen))
			return -1;
	}
	if (d->page_table) {
		s->ix.page_table = s->tab + (size_t)(B + 1) * 4;
		if (fa_gpu_upload(g, s->ix.page_table, s->pt, (size_t)pages * 4, err, errlen))
			return -1;
	}
	return 0;
}

static void free_set(struct set *s)
{
	fa_gpu_free(g, s->q);
	fa_gpu_free(g, s->k);
	fa_gpu_free(g, s->v);
	fa_gpu_free(g, s->tab);
	free(s->lens);
	free(s->pt);
}

static fa_status launch(struct fa_gpu *h, enum lay l, const struct set *s, CUdeviceptr o,
                        CUdeviceptr lse, char *err, size_t errlen)
{
	if (l == DENSE_BHSD || l == DENSE_BSHD)
		return fa_gpu_attn_fwd(h, &s->d.fwd, s->q, s->k, s->v, o, lse, NULL, err, errlen);
	return fa_gpu_attn_infer(h, &s->d, &s->ix, s->q, s->k, s->v, o, lse, NULL, err, errlen);
}

/* Median microseconds per launch over the sets. */
static double time_it(struct fa_gpu *h, enum lay l, const struct set *sets, int nsets,
                      CUdeviceptr o, CUdeviceptr lse, char *err, size_t errlen)
{
	double us[BATCHES];
	for (int i = 0; i < 3; i++)
		if (launch(h, l, &sets[i % nsets], o, lse, err, errlen))
			return -1;
	if (fa_gpu_sync(h, err, errlen))
		return -1;
	for (int b = 0; b < BATCHES; b++) {
		struct fa_gpu_timer *tm;
		float ms;
		if (fa_gpu_timer_start(h, NULL, &tm, err, errlen))
			return -1;
		for (int i = 0; i < BATCH; i++)
			if (launch(h, l, &sets[(b * BATCH + i) % nsets], o, lse, err, errlen))
				return -1;
		if (fa_gpu_timer_stop(h, tm, NULL, &ms, err, errlen))
			return -1;
		us[b] = 1e3 * ms / BATCH;
	}
	for (int i = 1; i < BATCHES; i++)
		for (int j = i; j > 0 && us[j - 1] > us[j]; j--) {
			double x = us[j];
			us[j] = us[j - 1];
			us[j - 1] = x;
		}
	return us[BATCHES / 2];
}

/* The plan a layout's launch takes (splits, keys per split). */
static void plan_of(struct fa_gpu *h, enum lay l, const struct set *s, struct fa_decode_plan *p)
{
	char err[256];
	struct fa_attn_fwd_desc pd;
	memset(p, 0, sizeof *p);
	if (l == DENSE_BHSD || l == DENSE_BSHD)
		fa_plan_decode(fa_gpu_model(h), &s->d.fwd, fa_gpu_settings(h), NULL, p, err, sizeof err);
	else
		fa_infer_plan_decode(fa_gpu_model(h), &s->d, fa_gpu_settings(h), &pd, p, err,
		                     sizeof err);
}

/* Every layout of one shape on handle h (only_sweep: dense BHSD and paged 16), a line each. The
 * lengths: Sk each, or ragged; the dense layouts of a ragged shape are skipped (they would read
 * every key). */
static void bench(struct fa_gpu *h, const struct shape *sh, const char *tag, bool only_sweep)
{
	const int64_t B = sh->B;
	int32_t *lens = malloc(sizeof(int32_t) * (size_t)B);
	double held = 0;
	uint64_t x = 0x9e3779b97f4a7c15u;
	for (int64_t b = 0; b < B; b++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		lens[b] = sh->ragged ? 1 + (int32_t)(x % (uint64_t)sh->Sk) : sh->Sk;
		held += sh->wl >= 0 && lens[b] > sh->wl + 1 ? sh->wl + 1 : lens[b];
	}
	const double bytes = 2.0 * held * HKV * D * 2; /* the keys the sequences hold, K and V */
	const double kb_full = (double)B * sh->Sk * HKV * D * 2;
	int nsets = (int)((512u << 20) / (2 * kb_full)) + 1;
	if (nsets > MAXSETS)
		nsets = MAXSETS;
	CUdeviceptr o = 0, lse = 0;
	char err[2048];
	if (fa_gpu_alloc(h, (size_t)(B * HQ * D) * 2, &o, err, sizeof err) ||
	    fa_gpu_alloc(h, (size_t)(B * HQ) * 4, &lse, err, sizeof err)) {
		printf("%-16s setup: %s\n", sh->name, err);
		return;
	}
	double t[NLAY] = {0};
	for (int l = 0; l < NLAY; l++) {
		if (sh->ragged && (l == DENSE_BHSD || l == DENSE_BSHD))
			continue;
		if (only_sweep && l != (sh->ragged ? CACHE : DENSE_BHSD) && l != PAGED16)
			continue;
		struct set sets[MAXSETS];
		int made = 0;
		bool ok = true;
		for (int i = 0; i < nsets && ok; i++, made++)
			ok = make_set(sh, (enum lay)l, lens, 11u * (uint64_t)i + 5, &sets[i], err,
			              sizeof err) == 0;
		if (ok)
			t[l] = time_it(h, (enum lay)l, sets, made, o, lse, err, sizeof err);
		if (!ok || t[l] < 0) {
			printf("%-16s %-10s FAILED: %s\n", sh->name, lay_name[l], err);
			t[l] = 0;
		} else {
			struct fa_decode_plan p;
			plan_of(h, (enum lay)l, &sets[0], &p);
			/* the layout's time against the one it replaces: the cache against the dense
			 * BSHD decode, pages against the contiguous cache */
			double ref = l == CACHE ? t[DENSE_BSHD] : l >= PAGED16 ? t[CACHE] : 0;
			printf("%-16s %s%-10s splits %3d x %5d keys  %8.1f us  %5.2f TB/s", sh->name, tag,
			       lay_name[l], p.nsplit, p.split_keys, t[l], bytes / t[l] / 1e6);
			if (ref > 0)
				printf("  %.3fx the %s's time", t[l] / ref,
				       l == CACHE ? "dense BSHD" : "contiguous cache");
			printf("\n");
			fflush(stdout);
			if (tsv)
				fprintf(tsv, "%s\t%s%s\t%d\t%d\t%.2f\t%.3f\n", sh->name, tag, lay_name[l],
				        p.nsplit, p.split_keys, t[l], bytes / t[l] / 1e6);
		}
		for (int i = 0; i < made; i++)
			free_set(&sets[i]);
	}
	fa_gpu_free(h, o);
	fa_gpu_free(h, lse);
	free(lens);
}

/* FA_BENCH_SWEEP=1: forced splits on the shapes (dense BHSD and paged 16) and the ragged
 * batch (cache and paged 16): the planner's and the ragged rule's picks against the best. */
static void sweep(const struct fa_kernel_settings *base)
{
	static const int splits[] = {1, 2, 4, 8, 16, 32, 64};
	const char *tmp = getenv("TMPDIR");
	char dir[512], err[512];
	snprintf(dir, sizeof dir, "%s/fa-bench-paged-cache", tmp && *tmp ? tmp : "/tmp");
	for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
		struct fa_kernel_settings ks = *base;
		char v[16], tag[24];
		snprintf(v, sizeof v, "%d", splits[si]);
		fa_kernel_settings_set(&ks, "FA_DECODE_SPLITS", v, err, sizeof err);
		struct fa_gpu *h;
		if (fa_gpu_open(&h, 0, &ks, err, sizeof err) != FA_OK) {
			printf("sweep: %s\n", err);
			continue;
		}
		fa_gpu_set_cache_dir(h, dir, err, sizeof err);
		snprintf(tag, sizeof tag, "s%-2d ", splits[si]);
		for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
			bench(h, &shapes[k], tag, true);
		fa_gpu_close(h);
	}
}

int main(void)
{
	char err[512];
	struct fa_kernel_settings ks;
	fa_test_kernel_settings(&ks);
	if (fa_gpu_open(&g, 0, &ks, err, sizeof err) != FA_OK) {
		printf("no GPU: skipped (%s)\n", err);
		return 0;
	}
	printf("GPU: %s, sm_%d, %d SMs\n", fa_gpu_name(g), fa_gpu_sm(g), fa_gpu_model(g)->sm_count);
	const char *tp = getenv("FA_BENCH_TSV");
	if (tp)
		tsv = fopen(tp, "a");
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		bench(g, &shapes[i], "", false);
	const char *sw = getenv("FA_BENCH_SWEEP");
	if (sw && strcmp(sw, "1") == 0)
		sweep(&ks);
	if (tsv)
		fclose(tsv);
	fa_gpu_close(g);
	return 0;
}
