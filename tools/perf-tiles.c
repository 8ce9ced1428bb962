/* perf-tiles.c - time given tiles of the forward kernel (bf16, S=4096, B*S = 32k tokens, H=16,
 * BHSD, random inputs; the shapes of tests/bench/bench_attn_fwd.c), for kernels/PERF-NOTES.md.
 * Built and run by tools/perf-variants.sh (FA_PV_TILES); not part of the build.
 *
 *   perf-tiles "D BR BC NW RT STAGES" ...   one line per tile and mask: D tile TFLOP/s
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu.h"
#include "fa_planner.h"

/* Median milliseconds of 7 launches after 2 warm-up launches; -1 on failure. */
static double time_tile(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, const struct fa_tile *t,
                        CUdeviceptr q, CUdeviceptr k, CUdeviceptr v, CUdeviceptr o,
                        CUdeviceptr lse, char *err, size_t errlen)
{
	float ms[7];
	for (int i = 0; i < 2; i++)
		if (fa_gpu_attn_fwd_tile(g, d, t, q, k, v, o, lse, NULL, err, errlen))
			return -1;
	if (fa_gpu_sync(g, err, errlen))
		return -1;
	for (int i = 0; i < 7; i++) {
		struct fa_gpu_timer *tm;
		if (fa_gpu_timer_start(g, NULL, &tm, err, errlen) ||
		    fa_gpu_attn_fwd_tile(g, d, t, q, k, v, o, lse, NULL, err, errlen) ||
		    fa_gpu_timer_stop(g, tm, NULL, &ms[i], err, errlen))
			return -1;
	}
	for (int i = 1; i < 7; i++)
		for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
			float x = ms[j];
			ms[j] = ms[j - 1];
			ms[j - 1] = x;
		}
	return ms[3];
}

int main(int argc, char **argv)
{
	char err[2048];
	struct fa_gpu *g;
	/* the kernel settings from the environment (FA_NVRTC_EXTRA: the variant timed) */
	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
	for (const char *const *nm = fa_kernel_settings_names(); *nm; nm++)
		if (fa_kernel_settings_set(&ks, *nm, getenv(*nm), err, sizeof err) != FA_OK) {
			printf("%s\n", err);
			return 1;
		}
	if (fa_gpu_open(&g, 0, &ks, err, sizeof err) != FA_OK) {
		printf("no GPU: skipped (%s)\n", err);
		return 0;
	}
	const int64_t S = 4096, B = 32768 / S, H = 16, Dmax = 256;
	size_t bytes = (size_t)(B * H * S * Dmax) * 2;
	CUdeviceptr q, k, v, o, lse;
	if (fa_gpu_alloc(g, bytes, &q, err, sizeof err) || fa_gpu_alloc(g, bytes, &k, err, sizeof err) ||
	    fa_gpu_alloc(g, bytes, &v, err, sizeof err) || fa_gpu_alloc(g, bytes, &o, err, sizeof err) ||
	    fa_gpu_alloc(g, (size_t)(B * H * S) * 4, &lse, err, sizeof err)) {
		printf("alloc: %s\n", err);
		return 1;
	}
	uint16_t *h = malloc(bytes);
	uint64_t x = 0x2545F4914F6CDD1Dull;
	for (size_t i = 0; i < bytes / 2; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		float f = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
		uint32_t u;
		memcpy(&u, &f, 4);
		h[i] = (uint16_t)(u >> 16);
	}
	if (fa_gpu_upload(g, q, h, bytes, err, sizeof err) || fa_gpu_upload(g, k, h, bytes, err, sizeof err) ||
	    fa_gpu_upload(g, v, h + 7, bytes - 16, err, sizeof err)) {
		printf("upload: %s\n", err);
		return 1;
	}
	free(h);
	for (int a = 1; a < argc; a++) {
		int D, br, bc, nw, rt, st;
		if (sscanf(argv[a], "%d %d %d %d %d %d", &D, &br, &bc, &nw, &rt, &st) != 6)
			continue;
		for (int causal = 0; causal < 2; causal++) {
			struct fa_attn_fwd_desc d;
			memset(&d, 0, sizeof d);
			d.dtype = FA_DTYPE_BF16;
			d.mask = causal ? FA_MASK_CAUSAL_TOP_LEFT : FA_MASK_NONE;
			d.scale = 1.0 / sqrt((double)D);
			d.B = B;
			d.Sq = d.Sk = S;
			d.Hq = d.Hkv = H;
			d.D = D;
			int64_t stv[3] = {H * S * D, D, S * D};
			memcpy(d.q_stride, stv, sizeof stv);
			memcpy(d.k_stride, stv, sizeof stv);
			memcpy(d.v_stride, stv, sizeof stv);
			memcpy(d.o_stride, stv, sizeof stv);
			d.lse_stride[0] = H * S;
			d.lse_stride[1] = S;
			d.lse_stride[2] = 1;
			struct fa_tile t = {0};
			t.path = FA_KPATH_16;
			t.br = br;
			t.bc = bc;
			t.nw = nw;
			t.rt = rt;
			t.stages = st;
			t.smem = fa_tile_smem(&t, D);
			t.regs = fa_tile_regs(&t, D, FA_PREC_DEFAULT);
			char tb[48];
			fa_tile_format(&t, tb, sizeof tb);
			double ms = time_tile(g, &d, &t, q, k, v, o, lse, err, sizeof err);
			double fl = 4.0 * B * H * (double)S * S * D / (causal ? 2 : 1);
			if (ms < 0)
				printf("tile D=%d %s %s FAILED: %s\n", D, tb, causal ? "causal" : "-", err);
			else
				printf("tile D=%d %s %s %.3f ms %.1f TFLOP/s\n", D, tb, causal ? "causal" : "-",
				       ms, fl / ms / 1e9);
			fflush(stdout);
		}
	}
	fa_gpu_close(g);
	return 0;
}
