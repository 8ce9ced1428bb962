/* bench_attn_fwd.c - forward kernel TFLOP/s through the launch API (fa_gpu_attn_fwd), timed with
 * CUDA events: 4*B*H*Sq*Sk*D flops, halved when causal (the convention of FlashAttention's and
 * tools/sdpa_anchors.py's benchmarks, whose shapes this follows: B*S = 32k tokens, 16 heads,
 * BHSD layout, random inputs).
 *
 * Prints "no GPU: skipped" and exits 0 without a GPU. Environment:
 *   FA_BENCH_QUICK=1   only the headline shapes (D=128, S=4096; FA_BENCH_D=64 another head dim)
 *   FA_BENCH_SWEEP=1   also time every fitting tile of the headline shapes (tuning data)
 *   FA_BENCH_TSV=path  append one tab-separated line per measurement
 *   FA_BENCH_X3=1      only fp32 3xtf32, D=128/192/256 S=4096, full and causal ("192 256":
 *                      those head dims)
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu.h"
#include "fa_ksettings.h"

static struct fa_gpu *g;
static FILE *tsv;

struct shape {
	fa_dtype dt;
	fa_precision prec;
	int D, S, causal;
};

static const char *label(const struct shape *s)
{
	static char b[32];
	if (s->dt == FA_DTYPE_BF16)
		return "bf16";
	if (s->dt == FA_DTYPE_FP16)
		return "fp16";
	snprintf(b, sizeof b, "fp32-%s", fa_prec_name(fa_prec_resolve(s->dt, s->prec)));
	return b;
}

static void make_desc(const struct shape *s, struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
	int64_t B = 32768 / s->S, H = 16, S = s->S, D = s->D;
	if (B < 1)
		B = 1;
	d->dtype = s->dt;
	d->precision = s->prec;
	d->mask = s->causal ? FA_MASK_CAUSAL_TOP_LEFT : FA_MASK_NONE;
	d->scale = 1.0 / sqrt((double)D);
	d->B = B;
	d->Sq = d->Sk = S;
	d->Hq = d->Hkv = H;
	d->D = D;
	int64_t st[3] = {H * S * D, D, S * D}; /* BHSD, like the anchors */
	memcpy(d->q_stride, st, sizeof st);
	memcpy(d->k_stride, st, sizeof st);
	memcpy(d->v_stride, st, sizeof st);
	memcpy(d->o_stride, st, sizeof st);
	d->lse_stride[0] = H * S;
	d->lse_stride[1] = S;
	d->lse_stride[2] = 1;
}

/* Random bits of a useful range: uniform [-1, 1) for every dtype, uploaded in 16 MiB pieces. */
static int fill(CUdeviceptr p, size_t bytes, fa_dtype dt)
{
	static uint16_t *h16;
	static float *h32;
	const size_t piece = 16u << 20;
	if (!h16) {
		h16 = malloc(piece);
		h32 = malloc(piece);
		uint64_t x = 0x2545F4914F6CDD1Dull;
		for (size_t i = 0; i < piece / 4; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			float f = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
			h32[i] = f;
		}
		for (size_t i = 0; i < piece / 2; i++) {
			float f = h32[i % (piece / 4)] * (i % 3 ? 1.f : -0.5f);
			uint32_t u;
			memcpy(&u, &f, 4);
			h16[i] = dt == FA_DTYPE_FP16 ? 0x3c00 ^ (uint16_t)(u >> 16 & 0x83ff) : (uint16_t)(u >> 16);
		}
	}
	const void *src = dt == FA_DTYPE_FP32 ? (const void *)h32 : (const void *)h16;
	char err[256];
	for (size_t off = 0; off < bytes; off += piece) {
		size_t n = bytes - off < piece ? bytes - off : piece;
		if (fa_gpu_upload(g, p + off, src, n, err, sizeof err) != FA_OK) {
			fprintf(stderr, "upload: %s\n", err);
			return -1;
		}
	}
	return 0;
}

static CUdeviceptr dq, dk, dv, dout, dlse;
static size_t cap_in, cap_lse;

static int ensure(size_t in_bytes, size_t lse_bytes, fa_dtype dt)
{
	static fa_dtype filled_dt = 0;
	char err[256];
	if (in_bytes > cap_in) {
		fa_gpu_free(g, dq);
		fa_gpu_free(g, dk);
		fa_gpu_free(g, dv);
		fa_gpu_free(g, dout);
		if (fa_gpu_alloc(g, in_bytes, &dq, err, sizeof err) || fa_gpu_alloc(g, in_bytes, &dk, err, sizeof err) ||
		    fa_gpu_alloc(g, in_bytes, &dv, err, sizeof err) || fa_gpu_alloc(g, in_bytes, &dout, err, sizeof err)) {
			fprintf(stderr, "alloc: %s\n", err);
			return -1;
		}
		cap_in = in_bytes;
		filled_dt = 0;
	}
	if (lse_bytes > cap_lse) {
		fa_gpu_free(g, dlse);
		if (fa_gpu_alloc(g, lse_bytes, &dlse, err, sizeof err))
			return -1;
		cap_lse = lse_bytes;
	}
	if (filled_dt != dt) {
		if (fill(dq, cap_in, dt) || fill(dk, cap_in, dt) || fill(dv, cap_in, dt))
			return -1;
		filled_dt = dt;
	}
	return 0;
}

/* Median milliseconds of `reps` timed launches after `warm` untimed ones; -1 on failure. */
static double time_it(const struct fa_attn_fwd_desc *d, const struct fa_tile *t, int warm, int reps,
                      char *err, size_t errlen)
{
	float ms[64];
	for (int i = 0; i < warm; i++)
		if (fa_gpu_attn_fwd_tile(g, d, t, dq, dk, dv, dout, dlse, NULL, err, errlen))
			return -1;
	if (fa_gpu_sync(g, err, errlen))
		return -1;
	for (int i = 0; i < reps; i++) {
		struct fa_gpu_timer *tm;
		if (fa_gpu_timer_start(g, NULL, &tm, err, errlen))
			return -1;
		if (fa_gpu_attn_fwd_tile(g, d, t, dq, dk, dv, dout, dlse, NULL, err, errlen))
			return -1;
		if (fa_gpu_timer_stop(g, tm, NULL, &ms[i], err, errlen))
			return -1;
	}
	for (int i = 1; i < reps; i++)
		for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
			float x = ms[j];
			ms[j] = ms[j - 1];
			ms[j - 1] = x;
		}
	return ms[reps / 2];
}

static void bench(const struct shape *s, const struct fa_tile *tile, const char *tag)
{
	struct fa_attn_fwd_desc d;
	make_desc(s, &d);
	size_t es = fa_dtype_size(s->dt);
	if (ensure((size_t)(d.B * d.Sq * d.Hq * d.D) * es, (size_t)(d.B * d.Hq * d.Sq) * 4, s->dt))
		return;
	char err[2048];
	struct fa_tile t;
	int n = 0;
	if (tile)
		t = *tile;
	else if (fa_gpu_plan(g, &d, &t, 1, &n, err, sizeof err) != FA_OK) {
		printf("%-12s D=%3d S=%5d %-6s  plan: %s\n", label(s), s->D, s->S, s->causal ? "causal" : "", err);
		return;
	}
	double flops = 4.0 * d.B * d.Hq * (double)d.Sq * d.Sk * d.D / (s->causal ? 2 : 1);
	int reps = flops > 4e12 ? 5 : 15;
	double ms = time_it(&d, &t, 2, reps, err, sizeof err);
	char tb[48];
	fa_tile_format(&t, tb, sizeof tb);
	if (ms < 0) {
		printf("%-12s D=%3d S=%5d %-6s %-16s FAILED: %s\n", label(s), s->D, s->S,
		       s->causal ? "causal" : "", tb, err);
		return;
	}
	double tf = flops / ms / 1e9;
	printf("%-12s D=%3d S=%5d B=%2lld H=16 %-6s %-16s %9.3f ms %7.1f TFLOP/s%s\n", label(s), s->D,
	       s->S, (long long)d.B, s->causal ? "causal" : "", tb, ms, tf, tag);
	fflush(stdout);
	if (tsv)
		fprintf(tsv, "%s\t%d\t%d\t%d\t%s\t%s\t%.4f\t%.2f\n", label(s), s->D, s->S, s->causal, tb,
		        tag[0] ? "sweep" : "chosen", ms, tf);
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
	const char *tp = getenv("FA_BENCH_TSV");
	if (tp)
		tsv = fopen(tp, "a");
	printf("GPU %s sm_%d, opt-in shared memory %zu bytes\n", fa_gpu_name(g), fa_gpu_sm(g),
	       fa_gpu_smem_optin(g));
	bool quick = getenv("FA_BENCH_QUICK") != NULL, sweep = getenv("FA_BENCH_SWEEP") != NULL;
	/* FA_BENCH_D=64: the quick set at another head dim */
	const int qd = getenv("FA_BENCH_D") ? atoi(getenv("FA_BENCH_D")) : 128;
	struct shape list[256];
	int n = 0;
	const struct {
		fa_dtype dt;
		fa_precision p;
	} kinds[] = {{FA_DTYPE_BF16, FA_PREC_DEFAULT}, {FA_DTYPE_FP32, FA_PREC_3XTF32},
	             {FA_DTYPE_FP32, FA_PREC_TF32}, {FA_DTYPE_FP32, FA_PREC_BF16}};
	const int Ds[] = {64, 128, 256}, Ss[] = {1024, 4096, 16384};
	/* FA_BENCH_BF16=1: bf16 shapes only (variant timing) */
	const int nk = getenv("FA_BENCH_BF16") ? 1 : 4;
	for (int k = 0; k < nk; k++)
		for (int a = 0; a < 3; a++)
			for (int b = 0; b < 3; b++)
				for (int c = 0; c < 2; c++) {
					if (quick && (Ds[a] != qd || Ss[b] != 4096))
						continue;
					list[n++] = (struct shape){kinds[k].dt, kinds[k].p, Ds[a], Ss[b], c};
				}
	/* FA_BENCH_X3=1: fp32 3xtf32 only, D = 128, 192, 256 at S = 4096 (the 3xtf32 forward's
	 * variants, PERF-NOTES.md "fp32 3xtf32 forward accuracy") */
	const char *x3 = getenv("FA_BENCH_X3");
	if (x3) {
		n = 0;
		for (int d = 128; d <= 256; d += 64) {
			char ds[8];
			snprintf(ds, sizeof ds, "%d", d);
			if (strcmp(x3, "1") != 0 && !strstr(x3, ds))
				continue;
			for (int c = 0; c < 2; c++)
				list[n++] = (struct shape){FA_DTYPE_FP32, FA_PREC_3XTF32, d, 4096, c};
		}
	} else if (nk == 4) {
		list[n++] = (struct shape){FA_DTYPE_FP16, FA_PREC_DEFAULT, 128, 4096, 0};
		list[n++] = (struct shape){FA_DTYPE_FP32, FA_PREC_IEEE, 128, 4096, 0};
	}
	/* compile everything first (NVRTC, one thread per kernel would be faster; keep it simple) */
	for (int i = 0; i < n; i++) {
		struct fa_attn_fwd_desc d;
		make_desc(&list[i], &d);
		if (fa_gpu_prepare(g, &d, NULL, err, sizeof err) != FA_OK)
			printf("prepare %s D=%d: %s\n", label(&list[i]), list[i].D, err);
	}
	for (int i = 0; i < n; i++)
		bench(&list[i], NULL, "");
	if (sweep) {
		printf("-- sweep: every fitting tile at D=128 S=4096 (and D=64, D=256 for bf16)\n");
		const struct shape hs[] = {{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 0},
		                           {FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 1},
		                           {FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 4096, 0},
		                           {FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 4096, 0},
		                           {FA_DTYPE_FP32, FA_PREC_3XTF32, 128, 4096, 0},
		                           {FA_DTYPE_FP32, FA_PREC_TF32, 128, 4096, 0}};
		for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
			struct fa_attn_fwd_desc d;
			make_desc(&hs[i], &d);
			struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
			int nt = 0;
			if (fa_gpu_plan(g, &d, t, FA_PLAN_MAX_CANDIDATES, &nt, err, sizeof err) != FA_OK)
				continue;
			for (int j = 0; j < nt && j < 14; j++)
				bench(&hs[i], &t[j], "  (sweep)");
		}
	}
	if (tsv)
		fclose(tsv);
	fa_gpu_free(g, dq);
	fa_gpu_free(g, dk);
	fa_gpu_free(g, dv);
	fa_gpu_free(g, dout);
	fa_gpu_free(g, dlse);
	fa_gpu_close(g);
	return 0;
}
