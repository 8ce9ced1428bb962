/* planner.c - tile configurations for the forward kernel: shared memory, registers, fit, rank.
 *
 * The shared-memory formulas mirror the layout in attn_fwd.cu exactly (the compile checks in
 * tests/unit/test_nvrtc_compile.c hold the two together); the register figure is an estimate
 * (accumulators + scores + fragments + a fixed overhead), checked against ptxas there too.
 */
#include "fa_planner.h"
#include "fa_err.h"
#include "fa_attn.h" /* FA_ATTN_MAX_HEAD_DIM */
#include "fa_settings.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Opt-in per-block limits and per-SM shared memory from the CUDA programming guide's table of
 * compute capabilities (docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/
 * compute-capabilities.html, "maximum amount of shared memory per thread block" with the opt-in,
 * and "per SM"): 7.5 64 KiB / 64 KiB, 8.0 163 / 164, 8.6 and 8.9 99 / 100, 9.0 227 / 228, 10.0
 * 227 / 228 (B200; also the Blackwell tuning guide, "Unified Shared Memory/L1/Texture Cache"),
 * 12.0 99 / 100 (RTX 50xx). sm_count is the largest common part of that architecture: 148 for
 * the B200, 170 for the RTX 5090. */
static const struct fa_device_model models[] = {
	{"sm_75", 75, 65536, 65536, 65536, 40},
	{"sm_80", 80, 166912, 167936, 65536, 108},
	{"sm_86", 86, 101376, 102400, 65536, 84},
	{"sm_89", 89, 101376, 102400, 65536, 128},
	{"sm_90", 90, 232448, 233472, 65536, 132},
	{"sm_100", 100, 232448, 233472, 65536, 148},
	{"sm_120", 120, 101376, 102400, 65536, 170},
	{"t4", 75, 65536, 65536, 65536, 40},
	{"a100", 80, 166912, 167936, 65536, 108},
	{"a10", 86, 101376, 102400, 65536, 72},
	{"rtx3090", 86, 101376, 102400, 65536, 82},
	{"a6000", 86, 101376, 102400, 65536, 84},
	{"l4", 89, 101376, 102400, 65536, 58},
	{"l40s", 89, 101376, 102400, 65536, 142},
	{"rtx4090", 89, 101376, 102400, 65536, 128},
	{"h100", 90, 232448, 233472, 65536, 132},
	{"h200", 90, 232448, 233472, 65536, 132},
	{"b200", 100, 232448, 233472, 65536, 148},
	{"rtx5090", 120, 101376, 102400, 65536, 170},
};

/* dtype names without depending on the CPU reference's fa_dtype.c. */
static const char *dt_name(fa_dtype dt)
{
	switch (dt) {
	case FA_DTYPE_FP16: return "fp16";
	case FA_DTYPE_BF16: return "bf16";
	case FA_DTYPE_FP32: return "fp32";
	}
	return "?";
}

/* The table of named models. */
const struct fa_device_model *fa_device_models(int *n)
{
	if (n)
		*n = (int)(sizeof models / sizeof models[0]);
	return models;
}

/* Look a model up by name; "80" and "sm80" mean "sm_80", "100" "sm_100". */
const struct fa_device_model *fa_device_model_find(const char *name)
{
	char buf[32];
	if (!name)
		return NULL;
	if (strlen(name) < 4 && strspn(name, "0123456789") == strlen(name)) {
		snprintf(buf, sizeof buf, "sm_%s", name);
		name = buf;
	} else if (strncasecmp(name, "sm", 2) == 0 && name[2] != '_') {
		snprintf(buf, sizeof buf, "sm_%s", name + 2);
		name = buf;
	}
	for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
		if (strcasecmp(models[i].name, name) == 0)
			return &models[i];
	return NULL;
}

/* The default fp32 precision is 3xtf32 (fp32-level error on tensor cores). */
fa_precision fa_prec_resolve(fa_dtype dt, fa_precision p)
{
	if (dt != FA_DTYPE_FP32)
		return FA_PREC_DEFAULT;
	return p == FA_PREC_DEFAULT ? FA_PREC_3XTF32 : p;
}

/* Names as fa-ctl spells them. */
const char *fa_prec_name(fa_precision p)
{
	switch (p) {
	case FA_PREC_DEFAULT: return "default";
	case FA_PREC_IEEE: return "ieee";
	case FA_PREC_3XTF32: return "3xtf32";
	case FA_PREC_TF32: return "tf32";
	case FA_PREC_BF16: return "bf16";
	}
	return "?";
}

/* Parse a precision name. */
bool fa_prec_parse(const char *s, fa_precision *out)
{
	static const fa_precision all[] = {FA_PREC_DEFAULT, FA_PREC_IEEE, FA_PREC_3XTF32,
	                                   FA_PREC_TF32, FA_PREC_BF16};
	if (!s)
		return false;
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (strcasecmp(s, fa_prec_name(all[i])) == 0) {
			*out = all[i];
			return true;
		}
	if (strcasecmp(s, "fp32") == 0) {
		*out = FA_PREC_IEEE;
		return true;
	}
	return false;
}

/* Mask names. */
const char *fa_mask_name(fa_mask m)
{
	switch (m) {
	case FA_MASK_NONE: return "none";
	case FA_MASK_CAUSAL_BOTTOM_RIGHT: return "causal-bottom-right";
	case FA_MASK_CAUSAL_TOP_LEFT: return "causal-top-left";
	}
	return "?";
}

/* fp32 staged as bf16 runs on the 16-bit path (after a conversion pass). */
int fa_plan_path(fa_dtype dt, fa_precision p)
{
	if (dt != FA_DTYPE_FP32)
		return FA_KPATH_16;
	return fa_prec_resolve(dt, p) == FA_PREC_BF16 ? FA_KPATH_16 : FA_KPATH_32;
}

/* 16-bit path: head dim padded to 16 (the k step of m16n8k16); fp32: none needed (k8). */
int fa_tile_padded_d(int path, int D)
{
	return path == FA_KPATH_16 ? (D + 15) / 16 * 16 : D;
}

/* Whether attn_fwd.cu pairs the warps of a tile (its PAIR): at head dim 256 exactly with 64 keys
 * and 8 warps, the tile where it was measured faster and tested on a GPU (PERF-NOTES.md v5). */
static bool pair_on(const struct fa_tile *t, int D)
{
	return D == 256 && t->bc == 64 && t->nw == 8;
}

/* Mirrors SMEM_Q/K/V in attn_fwd.cu, plus the warp pairs' exchange buffer (SMEM_XP + SMEM_XR)
 * on the tiles where the pairs are on and apply (PAIR_OK there: one row tile per warp, >= 2
 * stages, padded D > 128 and a multiple of 32). */
size_t fa_tile_smem(const struct fa_tile *t, int D)
{
	size_t br = (size_t)16 * t->nw * t->rt;
	if (t->path == FA_KPATH_WG16) { /* attn_fwd_sm90.cu: Q, K, V^T; head dim padded to 16 */
		size_t dp = (size_t)(D + 15) / 16 * 16;
		return 2 * (br * dp + (size_t)t->stages * t->bc * dp * 2);
	}
	/* attn_fwd_sm90.cu's 3xtf32 above head dim 128 (X3S): Q and its remainder, a ring of three
	 * half tiles (K or V^T, hi and lo) */
	if (t->path == FA_KPATH_WG32X3 && D > 128)
		return 4 * (2 * br * (size_t)D + 3 * 2 * (size_t)t->bc * D);
	if (fa_kpath_is_wg(t->path)) /* attn_fwd_sm90.cu: Q, then per stage 2 or 4 tile images */
		return 4 * (br * (size_t)D +
		            (size_t)t->stages * t->bc * D * (t->path == FA_KPATH_WG32X3 ? 4 : 2));
	if (t->path == FA_KPATH_16) {
		int dp = fa_tile_padded_d(t->path, D);
		size_t ld = (size_t)dp + 8;
		size_t x = 0;
		if (t->rt == 1 && t->stages >= 2 && dp % 32 == 0 && dp > 128 && pair_on(t, D))
			x = (size_t)t->nw * t->bc * 32 + (size_t)t->nw * 512;
		return 2 * (br * ld + (size_t)t->stages * t->bc * 2 * ld) + x;
	}
	size_t ldq = (size_t)D + (D % 16 == 0 ? 8 : 0), ldv = (size_t)D + 4;
	return 4 * (br * ldq + (size_t)t->stages * t->bc * (ldq + ldv));
}

/* Accumulators (O and S, fp32) + exp'd scores and packed P + fragments and addressing. The
 * constants were fitted to ptxas' reports for sm_90 (tests/unit/test_nvrtc_compile.c prints
 * estimate against actual): configurations estimated above FA_PLAN_MAX_REGS spilled. */
#define FA_PLAN_MAX_REGS 248
/* One measured exception (ptxas, CUDA 13.0, sm_80 to sm_90): on the 16-bit path two row tiles
 * of 16 by 64 keys (FlashAttention-2's 128x64 w4 tile) compile to at most 255 registers without
 * spills at padded head dims up to 96 and at 128, although the estimate says up to 304 (d128:
 * 255, d96: 255, d64: 224); padded 112 spills (d104, d112), as does d160 128x32 w4r2. tests/unit/test_nvrtc_compile.c checks it. */
static bool regs_exception(const struct fa_tile *t, int D)
{
	int dp = fa_tile_padded_d(t->path, D);
	return t->path == FA_KPATH_16 && t->rt == 2 && t->bc == 64 && (dp <= 96 || dp == 128);
}

/* ptxas for sm_100 (CUDA 13.0) spends more registers on the 16-bit two-row-tile tiles than for
 * sm_80 to sm_90: 128x64 w4r2 spilled at d128 (255 + 8 bytes) and at d64 (254 + 24, estimate
 * 240) in test_nvrtc_compile. Until a B200 measures them, sm_100 keeps those tiles only well
 * under the cap, without the exception above. */
static bool regs_fit(const struct fa_device_model *dev, const struct fa_tile *t, int D, int raw)
{
	if (dev->sm == 100 && t->path == FA_KPATH_16 && t->rt == 2)
		return raw <= 208;
	return raw <= FA_PLAN_MAX_REGS || regs_exception(t, D);
}
static int tile_regs_raw(const struct fa_tile *t, int D, fa_precision p)
{
	int dp = fa_tile_padded_d(t->path, D);
	int acc = t->rt * dp / 2, s = t->rt * t->bc / 2;
	/* wgmma: O and S accumulators, 3xtf32 keeps Q's remainder as register A fragments */
	if (t->path == FA_KPATH_WG16) /* O, S, packed P */
		return 40 + (D + 15) / 16 * 8 + s + s / 2;
	/* 3xtf32 above 128 (X3S): O, a 64-column P V partial sum, S's three accumulators; ptxas
	 * (CUDA 13.0) gave d136 185, d200 238, d256 252-254 registers, no spills */
	if (t->path == FA_KPATH_WG32X3 && D > 128)
		return 124 + D / 2;
	if (fa_kpath_is_wg(t->path))
		return t->path == FA_KPATH_WG32X3 ? 24 + 3 * D / 2 + s /* + Q_lo, P V partial */
		                                  : 40 + acc + s + 4;
	if (t->path == FA_KPATH_16)
		return 48 + acc + 2 * s;
	/* 3xtf32 keeps P split (big + small) for a whole step: one more register per score */
	return (p == FA_PREC_3XTF32 ? 72 + s : 64) + acc + 2 * s;
}

/* Registers per thread: the estimate, capped at the 255 that __launch_bounds__(NT, 1) lets
 * ptxas use (estimates above the cap that passed the planner's cut compiled without spills). */
int fa_tile_regs(const struct fa_tile *t, int D, fa_precision p)
{
	int r = tile_regs_raw(t, D, p);
	return r > 255 ? 255 : r;
}

/* Threads one SM can hold: 1536 on sm_86/sm_89/sm_120, 1024 on sm_75, 2048 otherwise. */
static int max_threads_per_sm(int sm)
{
	if (sm == 86 || sm == 89 || sm == 120) /* the consumer parts: 48 warps per SM */
		return 1536;
	if (sm == 75)
		return 1024;
	return 2048;
}

/* How well t's blocks fill the device: *f_wave the share of the slots (SMs x blocks per SM) busy
 * over the waves they take, *f_tail the share of real rows in the query tiles. False (both
 * left alone) when the shape is not known (offline planning). */
static bool tile_fill(const struct fa_device_model *dev, const struct fa_plan_req *r,
                      const struct fa_tile *t, double *f_wave, double *f_tail)
{
	if (!(r->Sq > 0 && r->B > 0 && r->H > 0 && dev->sm_count > 0))
		return false;
	double nq = ceil((double)r->Sq / t->br);
	double nblk = nq * (double)r->B * (double)r->H;
	double slots = (double)dev->sm_count * t->blocks_per_sm;
	double waves = ceil(nblk / slots);
	*f_wave = nblk / (waves * slots);
	*f_tail = (double)r->Sq / (nq * t->br);
	return true;
}

/* Blocks of t one SM holds, by shared memory, registers and threads (at least 1). */
static int tile_blocks_per_sm(const struct fa_device_model *dev, const struct fa_tile *t)
{
	int nt = 32 * t->nw;
	int by_smem = (int)(dev->smem_per_sm / (t->smem + 1024));
	int by_regs = dev->regs_per_sm / (((t->regs + 7) / 8 * 8) * nt);
	int by_thr = max_threads_per_sm(dev->sm) / nt;
	int bps = by_smem < by_regs ? by_smem : by_regs;
	bps = bps < by_thr ? bps : by_thr;
	return bps < 1 ? 1 : bps;
}

/* The heuristic: tensor-core operand reuse (row tiles per warp), per-step overhead (keys per
 * step), latency hiding (resident warps), register risk, and, when the shape is known, how well
 * the blocks fill the waves of the device and the last query tile. */
static double tile_score(const struct fa_device_model *dev, const struct fa_plan_req *r,
                         const struct fa_tile *t)
{
	double f_rt = t->rt == 2 ? 1.0 : (t->path == FA_KPATH_16 ? 0.78 : 0.88);
	double f_bc = (double)t->bc / (t->bc + 20.0);
	double warps = (double)t->blocks_per_sm * t->nw;
	double f_occ = sqrt(warps >= 8 ? 1.0 : warps / 8.0);
	/* measured on the H200 (kernels/RESULTS.md, tile sweep): estimates above FA_PLAN_MAX_REGS are
	 * already gone; two stages were as fast as three, so the tie goes to less shared memory */
	double f_reg = 1.0;
	double f_st = 1.0;
	/* very wide key steps inflate the score registers for long head dims */
	double f_wide = (t->bc >= 128 && r->D > 64) ? 0.85 : 1.0;
	double f_wave = 1.0, f_tail = 1.0;
	if (tile_fill(dev, r, t, &f_wave, &f_tail) && f_wave < 0.05)
		f_wave = 0.05;
	return f_rt * f_bc * f_occ * f_reg * f_st * f_wide * (0.5 + 0.5 * f_wave) * (0.2 + 0.8 * f_tail);
}

/* Sort best first; ties go to the smaller shared memory. */
static int cmp_tile(const void *a, const void *b)
{
	const struct fa_tile *x = a, *y = b;
	if (x->score != y->score)
		return x->score < y->score ? 1 : -1;
	if (x->smem != y->smem)
		return x->smem < y->smem ? -1 : 1;
	return 0;
}

/* wgmma is sm_90a's alone: sm_100 and sm_120 have no wgmma (their tensor-core instructions
 * are tcgen05 and the mma.sync family), so they run the mma.sync kernel. */
bool fa_plan_wgmma_enabled(const struct fa_device_model *dev, const struct fa_kernel_settings *ks)
{
	if (!ks)
		ks = fa_kernel_settings_default();
	return dev->sm == 90 && ks->wgmma;
}

bool fa_plan_wgmma16_enabled(const struct fa_device_model *dev, const struct fa_kernel_settings *ks)
{
	if (!ks)
		ks = fa_kernel_settings_default();
	return fa_plan_wgmma_enabled(dev, ks) && ks->wgmma16 != FA_WGMMA16_OFF;
}

/* The wgmma candidates (sm_90): 1 or 2 warpgroups, 16-64 keys (fp32) or 32-128 (16-bit), 2-3
 * stages. They rank above every mma.sync tile (whose scores are below 1): where the planner
 * offers them they measured faster (kernels/PERF-NOTES.md v7, v8). Within them: two warpgroups (one block's
 * softmax overlaps the other's MMAs), wider key steps, the waves. */
static void wg_candidates(const struct fa_device_model *dev, const struct fa_plan_req *req,
                          const struct fa_kernel_settings *ks, fa_precision prec,
                          struct fa_tile *all, int *nall, size_t *min_smem, struct fa_tile *smallest)
{
	static const int nwgs[] = {1, 2}, bcs[] = {16, 32, 64, 128}, stgs[] = {2, 3};
	const bool w16 = req->dtype != FA_DTYPE_FP32 || prec == FA_PREC_BF16;
	/* experiments (kernels/PERF-NOTES.md): FA_WG_BC, FA_WG_STAGES, FA_WG_NWG keep one value */
	const int only_bc = ks->wg_bc, only_st = ks->wg_stages, only_nwg = ks->wg_nwg;
	for (size_t a = 0; a < 2; a++)
		for (size_t c = 0; c < 4; c++)
			for (size_t d = 0; d < 2; d++) {
				if (bcs[c] == (w16 ? 16 : 128)) /* 16-bit: k16 steps; fp32: N <= 64 measured */
					continue;
				if ((only_bc && only_bc != bcs[c]) || (only_st && only_st != stgs[d]) ||
				    (only_nwg && only_nwg != nwgs[a]))
					continue;
				struct fa_tile t = {0};
				t.path = w16 ? FA_KPATH_WG16
				             : prec == FA_PREC_3XTF32 ? FA_KPATH_WG32X3 : FA_KPATH_WG32;
				t.nw = 4 * nwgs[a];
				t.rt = 1;
				t.br = 16 * t.nw;
				t.bc = bcs[c];
				t.stages = stgs[d];
				t.smem = fa_tile_smem(&t, req->D);
				t.regs = fa_tile_regs(&t, req->D, prec);
				if (t.smem < *min_smem) {
					*min_smem = t.smem;
					*smallest = t;
				}
				/* 3xtf32 keeps Q's remainder in registers up to D = 128; above (X3S) in
				 * shared memory, one tile only: one warpgroup, 16 keys, the half-tile ring
				 * (its register count checked by test_nvrtc_compile, not the estimate).
				 * Offered above head dim 192, where it measured faster than the mma.sync
				 * kernel (D = 256: 52.7 / 45.1 TFLOP/s against 42.5 / 41.4, causal; D =
				 * 192: 48.8 against 48.8, causal 42.2 against 46.4), and with FA_WG_BC=16
				 * above 128. Its gradient error at S = 4096 (5.8x SDPA's before) was the
				 * softmax's rescale factor, fixed: 1.2x (PERF-NOTES.md, "the 3xtf32
				 * forward's lse") */
				const bool x3s = t.path == FA_KPATH_WG32X3 && req->D > 128;
				if (x3s && (nwgs[a] != 1 || t.bc != 16 || t.stages != 2 ||
				            (req->D <= 192 && only_bc != 16)))
					continue;
				if ((!x3s && tile_regs_raw(&t, req->D, prec) > 250) ||
				    t.smem > dev->smem_optin || req->D > FA_ATTN_MAX_HEAD_DIM)
					continue;
				t.blocks_per_sm = tile_blocks_per_sm(dev, &t);
				double f_bc = (double)t.bc / (t.bc + 20.0), f_fill = 1.0, f_wave, f_tail;
				/* rows past Sq cost a warpgroup's whole MMA: the tail weighs more */
				if (tile_fill(dev, req, &t, &f_wave, &f_tail))
					f_fill = (0.5 + 0.5 * f_wave) * (0.1 + 0.9 * f_tail);
				/* 16-bit: three stages run the overlapped loop (softmax under P V), measured
				 * no faster than two with wider key steps (PERF-NOTES.md v8) */
				double f_ovl = w16 && t.stages == 3 ? 0.9 : 1.0;
				t.score = 2.0 * (nwgs[a] == 2 ? 1.0 : 0.7) * f_bc * f_fill * f_ovl;
				/* X3S scores 0.62 x fill by the formula, under mma.sync's best: it is
				 * ranked above it as the other wgmma tiles are (measured faster) */
				if (x3s)
					t.score += 1.0;
				if (*nall < FA_PLAN_MAX_CANDIDATES)
					all[(*nall)++] = t;
			}
}

/* The wgmma kernel runs one block per SM with a heavier start (Q's rounding, the K/V prep): on
 * the H200 it lost at S = 1024 (tf32 d128 114 vs 125 TFLOP/s, causal 69 vs 107; bf16 d256 155
 * vs 265) and won from S = 4096 on (PERF-NOTES.md v8). Offered from 2048 keys and 128 query
 * rows, or when the lengths are unknown (offline plans). */
static bool wg_long_enough(const struct fa_plan_req *req)
{
	return (req->Sk == 0 || req->Sk >= 2048) && (req->Sq == 0 || req->Sq >= 128);
}

/* Where the 16-bit wgmma kernel beat the mma.sync one on the H200 (PERF-NOTES.md v8, same run,
 * S=4096): no mask, and fp32 staged as bf16 from head dim 128 (349 vs 329 TFLOP/s; the staging
 * is then as fast as the bf16 kernel), fp16/bf16 above 192 (d256 325 vs 295). Elsewhere it was
 * slower (d64 273 vs 336; every causal shape) and mma.sync stays. FA_WGMMA16=1 offers it
 * everywhere (experiments). */
static bool wg16_wins(const struct fa_plan_req *req, const struct fa_kernel_settings *ks,
                      fa_precision prec)
{
	if (ks->wgmma16 == FA_WGMMA16_ALL)
		return true;
	if (req->mask != FA_MASK_NONE)
		return false;
	return req->dtype == FA_DTYPE_FP32 && prec == FA_PREC_BF16 ? req->D >= 128 : req->D > 192;
}

fa_status fa_plan(const struct fa_device_model *dev, const struct fa_plan_req *req,
                  struct fa_tile *out, int max, int *n, char *err, size_t errlen)
{
	/* One stage (single K and V buffers, FlashAttention-2's order; attn_fwd.cu has it) is not
	 * offered: on the H200 it was 7-10% slower than two at d64, d128 and d256, also where it
	 * lets two blocks share an SM (d256 64x64 w4r1; kernels/PERF-NOTES.md v4). */
	static const int nws[] = {2, 4, 8}, rts[] = {1, 2}, bcs[] = {16, 32, 64, 128},
	                 stgs[] = {2, 3};
	struct fa_tile all[FA_PLAN_MAX_CANDIDATES];
	int nall = 0;
	size_t min_smem = (size_t)-1;
	struct fa_tile smallest = {0};

	if (n)
		*n = 0;
	if (!dev || !req || (!out && max > 0) || !n) {
		return fa_err(err, errlen, FA_EINVAL, "planner: NULL argument");
	}
	if (req->dtype != FA_DTYPE_FP16 && req->dtype != FA_DTYPE_BF16 &&
	    req->dtype != FA_DTYPE_FP32) {
		return fa_err(err, errlen, FA_EDTYPE, "planner: unknown dtype %d", (int)req->dtype);
	}
	if (req->D < 8 || req->D % 8 != 0) {
		return fa_err(err, errlen, FA_ESHAPE,
		              "head dim %d: must be a multiple of 8 from 8 to 256", req->D);
	}
	const struct fa_kernel_settings *ks = req->ks ? req->ks : fa_kernel_settings_default();
	fa_precision prec = fa_prec_resolve(req->dtype, req->precision);
	int path = fa_plan_path(req->dtype, prec);
	for (size_t a = 0; a < sizeof nws / sizeof nws[0]; a++)
		for (size_t b = 0; b < sizeof rts / sizeof rts[0]; b++)
			for (size_t c = 0; c < sizeof bcs / sizeof bcs[0]; c++)
				for (size_t d = 0; d < sizeof stgs / sizeof stgs[0]; d++) {
					struct fa_tile t = {0};
					t.path = path;
					t.nw = nws[a];
					t.rt = rts[b];
					t.br = 16 * t.nw * t.rt;
					t.bc = bcs[c];
					t.stages = stgs[d];
					/* 2-warp blocks only where fp32 needs them to fit at all */
					if (t.nw == 2 && path == FA_KPATH_16)
						continue;
					if (t.br > 128)
						continue;
					t.smem = fa_tile_smem(&t, req->D);
					t.regs = fa_tile_regs(&t, req->D, prec);
					int raw = tile_regs_raw(&t, req->D, prec);
					if (t.smem < min_smem) {
						min_smem = t.smem;
						smallest = t;
					}
					if (!regs_fit(dev, &t, req->D, raw) || t.smem > dev->smem_optin)
						continue;
					if (req->D > FA_ATTN_MAX_HEAD_DIM)
						continue;
					t.blocks_per_sm = tile_blocks_per_sm(dev, &t);
					t.score = tile_score(dev, req, &t);
					if (nall < FA_PLAN_MAX_CANDIDATES)
						all[nall++] = t;
				}
	if (req->dtype == FA_DTYPE_FP32 && (prec == FA_PREC_TF32 || prec == FA_PREC_3XTF32) &&
	    fa_plan_wgmma_enabled(dev, ks) && wg_long_enough(req))
		wg_candidates(dev, req, ks, prec, all, &nall, &min_smem, &smallest);
	else if ((req->dtype != FA_DTYPE_FP32 || prec == FA_PREC_BF16) &&
	         fa_plan_wgmma16_enabled(dev, ks) && wg_long_enough(req) && wg16_wins(req, ks, prec))
		wg_candidates(dev, req, ks, prec, all, &nall, &min_smem, &smallest);
	if (nall == 0) {
		char tb[48];
		fa_tile_format(&smallest, tb, sizeof tb);
		if (req->D > FA_ATTN_MAX_HEAD_DIM)
			snprintf(err, errlen,
			         "no tile fits: %s head dim %d (precision %s) is above the kernels' maximum "
			         "of %d; the smallest configuration (%s) would need %zu bytes of shared "
			         "memory, the device (%s) allows %zu",
			         dt_name(req->dtype), req->D, fa_prec_name(prec),
			         FA_ATTN_MAX_HEAD_DIM, tb, min_smem, dev->name, dev->smem_optin);
		else
			snprintf(err, errlen,
			         "no tile fits: %s head dim %d (precision %s): the smallest configuration "
			         "(%s) needs %zu bytes of shared memory, the device (%s) allows %zu per block",
			         dt_name(req->dtype), req->D, fa_prec_name(prec), tb, min_smem,
			         dev->name, dev->smem_optin);
		return FA_ENOFIT;
	}
	qsort(all, (size_t)nall, sizeof all[0], cmp_tile);
	int k = nall < max ? nall : max;
	if (k > 0)
		memcpy(out, all, (size_t)k * sizeof all[0]);
	*n = k;
	return FA_OK;
}

/* "128x64 w4r2 s2". */
void fa_tile_format(const struct fa_tile *t, char *buf, size_t len)
{
	if (t->path == FA_KPATH_BWDWG16 || fa_kpath_is_bwdwg32(t->path)) /* "bwd wg kv128 q64 wg2":
	                                                                       the wgmma backward */
		snprintf(buf, len, "bwd wg kv%d q%d wg%d", t->bc, t->br, t->nw / 4);
	else if (fa_kpath_is_bwd(t->path)) /* "bwd kv64 q64 w8": keys per block, rows per step */
		snprintf(buf, len, "bwd kv%d q%d w%d%s", t->bc, t->br, t->nw, t->stages == 2 ? " s2" : "");
	else if (fa_kpath_is_wg(t->path)) /* "128x64 wg2 s2": warpgroups */
		snprintf(buf, len, "%dx%d wg%d s%d", t->br, t->bc, t->nw / 4, t->stages);
	else if (fa_kpath_is_decode(t->path)) /* "dec 16x16 w4 s3": packed rows x keys per warp */
		snprintf(buf, len, "dec %dx%d w%d s%d", t->br, t->bc, t->nw, t->stages);
	else
		snprintf(buf, len, "%dx%d w%dr%d s%d", t->br, t->bc, t->nw, t->rt, t->stages);
}

/* See fa_planner.h. */
void fa_plan_req_from_desc(const struct fa_attn_fwd_desc *d, struct fa_plan_req *r)
{
	memset(r, 0, sizeof *r);
	r->dtype = d->dtype;
	r->precision = d->precision;
	r->D = (int)d->D;
	r->mask = d->mask;
	r->B = d->B;
	r->H = d->Hq;
	r->Sq = d->Sq;
	r->Sk = d->Sk;
	r->window = fa_attn_window_active(d);
	r->window_left = r->window ? d->window_left : 0;
	r->window_right = r->window ? d->window_right : 0;
	r->softcap = d->softcap > 0 ? d->softcap : 0;
}
