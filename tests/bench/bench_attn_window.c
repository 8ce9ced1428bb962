/* bench_attn_window.c - the sliding window and softcap (FA_WIN, FA_SOFTCAP) through the launch
 * API, on issue 11's target: a window of 4,096 keys on a 16k sequence takes time proportional
 * to the window, not the sequence. bf16, D=128, BSHD, random inputs; per shape (B=1 x 32 heads,
 * B=2 x 16 heads):
 *   full causal 16k                      (the sequence's cost)
 *   window (4095, 0) 16k                 (each query sees its last 4,096 keys: causal + window)
 *   dense 4k, no mask                    (each query sees 4,096 keys: the window's cost per
 *                                        query; x4 for the 16k queries)
 *   causal 16k with softcap 30, and the window with softcap 30 (the softcap's cost)
 * and the ratios: window / full causal (visible pairs give 0.47), window / (4 x dense 4k)
 * (1.0 is the target: proportional to the window). TFLOP/s count 4 D per visible pair. Then the
 * decode path: B=16, 1 query, 32k keys, 32/8 heads, full against window 4,096.
 *
 * Timing: CUDA events around back-to-back launches (host enqueue time out), the median of 5
 * batches, after 2 warm-up launches (compiles included there). No window anchor: PyTorch SDPA
 * has no sliding window and flash_attn is not on the GPU host.
 * Prints "no GPU: skipped" and exits 0 without a GPU.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu.h"
#include "fa_ksettings.h"

static struct fa_gpu *g;

struct run {
	const char *name;
	int B, H, Hkv, Sq, Sk;
	fa_mask mask;
	bool window;
	int64_t wl, wr;
	double cap;
};

static void make_desc(const struct run *r, struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
	d->dtype = FA_DTYPE_BF16;
	d->mask = r->mask;
	d->scale = 1.0 / sqrt(128.0);
	d->B = r->B;
	d->Sq = r->Sq;
	d->Sk = r->Sk;
	d->Hq = r->H;
	d->Hkv = r->Hkv;
	d->D = 128;
	int64_t q[3] = {(int64_t)r->Sq * r->H * 128, (int64_t)r->H * 128, 128};
	int64_t k[3] = {(int64_t)r->Sk * r->Hkv * 128, (int64_t)r->Hkv * 128, 128};
	memcpy(d->q_stride, q, sizeof q);
	memcpy(d->o_stride, q, sizeof q);
	memcpy(d->k_stride, k, sizeof k);
	memcpy(d->v_stride, k, sizeof k);
	d->lse_stride[0] = (int64_t)r->H * r->Sq;
	d->lse_stride[1] = r->Sq;
	d->lse_stride[2] = 1;
	d->window = r->window;
	d->window_left = r->wl;
	d->window_right = r->wr;
	d->softcap = r->cap;
}

/* Visible (query, key) pairs of one (batch, head): fa_attn_key_range per row. */
static double pairs(const struct fa_attn_fwd_desc *d)
{
	double n = 0;
	for (int64_t i = 0; i < d->Sq; i++) {
		int64_t lo, hi;
		fa_attn_key_range(d, d->Sq, d->Sk, i, &lo, &hi);
		n += (double)(hi - lo);
	}
	return n;
}

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

enum { BATCHES = 5 };

/* Median microseconds per launch, -1 on failure (err says why). */
static double time_it(const struct fa_attn_fwd_desc *d, int per_batch, CUdeviceptr q,
                      CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, char *err,
                      size_t errlen)
{
	double us[BATCHES];
	for (int i = 0; i < 2; i++)
		if (fa_gpu_attn_fwd(g, d, q, k, v, o, lse, NULL, err, errlen))
			return -1;
	if (fa_gpu_sync(g, err, errlen))
		return -1;
	for (int b = 0; b < BATCHES; b++) {
		struct fa_gpu_timer *tm;
		float ms;
		if (fa_gpu_timer_start(g, NULL, &tm, err, errlen))
			return -1;
		for (int i = 0; i < per_batch; i++)
			if (fa_gpu_attn_fwd(g, d, q, k, v, o, lse, NULL, err, errlen))
				return -1;
		if (fa_gpu_timer_stop(g, tm, NULL, &ms, err, errlen))
			return -1;
		us[b] = 1e3 * ms / per_batch;
	}
	for (int i = 1; i < BATCHES; i++)
		for (int j = i; j > 0 && us[j - 1] > us[j]; j--) {
			double x = us[j];
			us[j] = us[j - 1];
			us[j - 1] = x;
		}
	return us[BATCHES / 2];
}

/* One run: its time, TFLOP/s of its visible pairs and kernel; the time, or -1. */
static double bench(const struct run *r)
{
	struct fa_attn_fwd_desc d;
	make_desc(r, &d);
	size_t qb = (size_t)d.B * d.Sq * d.Hq * 128 * 2, kb = (size_t)d.B * d.Sk * d.Hkv * 128 * 2;
	CUdeviceptr q = 0, k = 0, v = 0, o = 0, lse = 0;
	char err[2048] = "";
	double us = -1;
	if (fa_gpu_alloc(g, qb, &q, err, sizeof err) || fa_gpu_alloc(g, kb, &k, err, sizeof err) ||
	    fa_gpu_alloc(g, kb, &v, err, sizeof err) || fa_gpu_alloc(g, qb, &o, err, sizeof err) ||
	    fa_gpu_alloc(g, (size_t)d.B * d.Hq * d.Sq * 4, &lse, err, sizeof err) || fill(q, qb, 1) ||
	    fill(k, kb, 2) || fill(v, kb, 3)) {
		printf("%-34s setup failed: %s\n", r->name, err);
		goto out;
	}
	char kname[96] = "";
	bool ready;
	fa_gpu_kernel_lookup(g, &d, &ready, kname, sizeof kname, err, sizeof err);
	double flop = 4.0 * 128 * pairs(&d) * d.B * d.Hq;
	int per = flop > 1e12 ? 3 : flop > 1e11 ? 10 : 30;
	us = time_it(&d, per, q, k, v, o, lse, err, sizeof err);
	if (us < 0) {
		printf("%-34s FAILED: %s\n", r->name, err);
		goto out;
	}
	printf("%-34s B=%d H=%2d/%2d Sq=%5d Sk=%5d %9.1f us %6.1f TFLOP/s  %s\n", r->name, r->B,
	       r->H, r->Hkv, r->Sq, r->Sk, us, flop / us / 1e6, kname);
	fflush(stdout);
out:
	fa_gpu_free(g, q);
	fa_gpu_free(g, k);
	fa_gpu_free(g, v);
	fa_gpu_free(g, o);
	fa_gpu_free(g, lse);
	return us;
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
	printf("GPU: %s, sm_%d; bf16 D=128 BSHD; no window anchor (SDPA has no sliding window, "
	       "flash_attn is not installed)\n", fa_gpu_name(g), fa_gpu_sm(g));
	static const int shapes[][2] = {{1, 32}, {2, 16}};
	for (int s = 0; s < 2; s++) {
		int B = shapes[s][0], H = shapes[s][1];
		struct run full = {"full causal 16k", B, H, H, 16384, 16384, FA_MASK_CAUSAL_BOTTOM_RIGHT,
		                   false, 0, 0, 0};
		struct run win = {"window (4095, 0) 16k", B, H, H, 16384, 16384, FA_MASK_NONE, true,
		                  4095, 0, 0};
		struct run dense = {"dense 4k no mask", B, H, H, 4096, 4096, FA_MASK_NONE, false, 0, 0, 0};
		struct run fullcap = full, wincap = win;
		fullcap.name = "full causal 16k softcap 30";
		fullcap.cap = 30;
		wincap.name = "window (4095, 0) 16k softcap 30";
		wincap.cap = 30;
		double tf = bench(&full), tw = bench(&win), td = bench(&dense), tfc = bench(&fullcap),
		       twc = bench(&wincap);
		if (tf > 0 && tw > 0 && td > 0)
			printf("  B=%d H=%d: window / full causal %.3f (visible pairs 0.469), window / "
			       "(4 x dense 4k) %.3f (1.0 = proportional to the window)\n", B, H, tw / tf,
			       tw / (4 * td));
		if (tfc > 0 && twc > 0 && tf > 0 && tw > 0)
			printf("  B=%d H=%d: softcap 30 costs x%.3f (full causal), x%.3f (window)\n", B,
			       H, tfc / tf, twc / tw);
	}
	/* decode: one query against a long cache, full against the last 4,096 keys */
	struct run dfull = {"decode 32k", 16, 32, 8, 1, 32768, FA_MASK_NONE, false, 0, 0, 0};
	struct run dwin = {"decode 32k window (4095, 0)", 16, 32, 8, 1, 32768, FA_MASK_NONE, true,
	                   4095, 0, 0};
	struct run dcap = {"decode 32k softcap 30", 16, 32, 8, 1, 32768, FA_MASK_NONE, false, 0, 0,
	                   30};
	double a = bench(&dfull), b = bench(&dwin), c = bench(&dcap);
	if (a > 0 && b > 0)
		printf("  decode: window / full %.3f (keys 0.125), softcap x%.3f\n", b / a,
		       c > 0 ? c / a : 0);
	fa_gpu_close(g);
	return 0;
}
