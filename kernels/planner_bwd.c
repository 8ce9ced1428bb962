/* planner_bwd.c - tiles for the backward kernel (attn_bwd.cu): shared memory, registers, fit,
 * rank.
 *
 * The backward keeps more on chip than the forward: K, V (resident for the block's keys), Q, dO
 * (per step), P^T and dS^T (per step) in shared memory, dK and dV accumulators in registers. Its
 * own formula decides its tile, so the forward's tile is never limited by it (the training
 * library this project replaced sized both passes by the backward's need, and fp32 head dim 256
 * could not run). Plans against the device's opt-in limit. The sliding window and softcap
 * (fa_plan_req) choose no tile: every backward kernel serves both.
 */
#include "fa_planner.h"
#include "fa_err.h"
#include "fa_attn.h" /* FA_ATTN_MAX_HEAD_DIM */
#include "fa_settings.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fa_plan_bwd_path(fa_dtype dt, fa_precision p)
{
	if (dt != FA_DTYPE_FP32)
		return FA_KPATH_BWD16;
	return fa_prec_resolve(dt, p) == FA_PREC_BF16 ? FA_KPATH_BWD16 : FA_KPATH_BWD32;
}

int fa_bwd_padded_d(int path, int D)
{
	(void)path; /* every path: the same warp splits (the wgmma one's wide form halves the 32s) */
	return D <= 128 ? (D + 15) / 16 * 16 : (D + 31) / 32 * 32;
}

/* attn_bwd_sm90.cu: K, V (bc rows), two buffers of Q and dO (64 rows), dS^T (bc x 64), all
 * 16-bit with the padded head dim, and two buffers of lse2 and delta; the wide form (D > 128)
 * keeps P^T (64 x 64) beside dS^T and four staged fp32 rows of dQ (its bulk reduction's
 * rows that do not fit the step's Q and dO buffers): 218,112 bytes at D = 256; the fixed-point
 * deterministic dQ (rt 3) one fp32 multiplier per padded column and two buffers of one per row
 * more. */
static size_t bwdwg_smem(const struct fa_tile *t, int D)
{
	const size_t dp = (size_t)fa_bwd_padded_d(t->path, D), bq = 64;
	const size_t pt = D > 128 ? 2 : 1;           /* P^T and dS^T, or dS^T alone */
	const size_t dqx = D > 128 ? 4 * 4 * dp : 0; /* the staged dQ rows */
	/* the fixed-point dQ's column multipliers and two buffers of its row ones */
	const size_t mc = t->rt == 3 ? 4 * dp + 4 * 2 * bq : 0;
	return 2 * (2 * (size_t)t->bc * dp + 4 * bq * dp + pt * (size_t)t->bc * bq) + 4 * 4 * bq + dqx +
	       mc;
}

/* attn_bwd_sm90.cu's static checks: up to head dim 128, 1 or 2 warpgroups of 64 keys, 64 query
 * rows, the padded width split over the warpgroups in multiples of 8; above (the wide form, to
 * 256), two warpgroups on one block of 64 keys. */
static bool bwdwg_layout_ok(const struct fa_tile *t, int D)
{
	const int nwg = t->nw / 4, dp = fa_bwd_padded_d(t->path, D);
	if (D < 8 || D % 8 || D > 256 || t->br != 64)
		return false;
	if (D > 128)
		return t->nw == 8 && t->bc == 64;
	return (t->nw == 4 || t->nw == 8) && t->bc == 64 * nwg && (dp / nwg) % 8 == 0;
}

/* attn_bwd_sm90_tf32.cu: fp32 images (3xtf32: each with its remainder) of K, V (64 x DP),
 * K^T (DQP x 64, DQP the head dim rounded up to 64) and two buffers of Q, dO, Q^T, dO^T
 * (br x DP each: one per warpgroup, or both the one warpgroup's), two of lse2 and delta; dS
 * (br x 64) lies in the step's Q image from DP 64 up, one per warpgroup beside the rest below:
 * 229,888 bytes for tf32 D=128 q32, 3xtf32 D=64 q32. */
static size_t bwdwg32_smem(const struct fa_tile *t, int D)
{
	const size_t ni = t->path == FA_KPATH_BWDWG32X3 ? 2 : 1;
	const size_t dp = (size_t)fa_bwd_padded_d(t->path, D), dqp = ((size_t)D + 63) / 64 * 64;
	const size_t bq = (size_t)t->br, bkv = 64;
	const size_t ds = dp >= bkv ? 0 : bq * bkv * (size_t)(t->nw / 4);
	return 4 * ni * (2 * bkv * dp + dqp * bkv + 2 * 4 * bq * dp + ds) + 4 * 2 * 2 * bq;
}

/* attn_bwd_sm90_tf32.cu's static checks: one or two warpgroups on 64 keys, 32 or 64 query rows
 * (3xtf32: 32), head dims up to 128. */
static bool bwdwg32_layout_ok(const struct fa_tile *t, int D)
{
	return D >= 8 && D % 8 == 0 && D <= 128 && (t->nw == 4 || t->nw == 8) && t->bc == 64 &&
	       (t->br == 32 || (t->br == 64 && t->path == FA_KPATH_BWDWG32));
}

/* attn_bwd.cu: LDS = padded D + 8 (16-bit) or D + 4 (fp32), LDP = BQ + 8 or BQ + 4. */
size_t fa_bwd_tile_smem(const struct fa_tile *t, int D)
{
	if (t->path == FA_KPATH_BWDWG16)
		return bwdwg_smem(t, D);
	if (fa_kpath_is_bwdwg32(t->path))
		return bwdwg32_smem(t, D);
	const bool w16 = t->path == FA_KPATH_BWD16;
	const size_t es = w16 ? 2 : 4;
	const size_t dp = (size_t)fa_bwd_padded_d(t->path, D);
	const size_t lds = dp + (w16 ? 8 : 4), ldp = (size_t)t->br + (w16 ? 8 : 4);
	const size_t st = t->stages == 2 ? 2 : 1; /* Q, dO, lse2, delta per stage */
	return es * ((2 * (size_t)t->bc + 2 * st * (size_t)t->br) * lds + 2 * (size_t)t->bc * ldp) +
	       2 * 4 * st * (size_t)t->br;
}

/* The warp layouts of attn_bwd.cu (WM_S, WN_S, WM_Q, WN_Q and their static_asserts). */
bool fa_bwd_tile_layout_ok(const struct fa_tile *t, int D)
{
	if (t->path == FA_KPATH_BWDWG16)
		return bwdwg_layout_ok(t, D);
	if (fa_kpath_is_bwdwg32(t->path))
		return bwdwg32_layout_ok(t, D);
	const bool w16 = t->path == FA_KPATH_BWD16;
	const int dp = fa_bwd_padded_d(t->path, D);
	const int nw = t->nw, bkv = t->bc, bq = t->br;
	if (nw <= 0 || bkv < 16 || bq < 16 || bkv % 16 || bq % 16)
		return false;
	const int wm_s = nw < bkv / 16 ? nw : bkv / 16, wn_s = nw / wm_s;
	const int wm_q = nw < bq / 16 ? nw : bq / 16, wn_q = nw / wm_q;
	if (wm_s * wn_s != nw || wm_q * wn_q != nw)
		return false;
	const int nmul = w16 ? 16 : 8; /* 16-bit: n8 tiles in pairs (ldmatrix x4) */
	return bq % (nmul * wn_s) == 0 && dp % (nmul * wn_s) == 0 && dp % (nmul * wn_q) == 0 &&
	       bkv % (16 * wm_s) == 0 && bq % (16 * wm_q) == 0;
}

/* Live fp32 values per thread: dK and dV (all steps), S^T and dP^T or the step's dQ, the
 * fragments; 3xtf32 adds a chunk of a step's partial dK/dV and operands in two parts. Constants fitted to ptxas (tests/unit/test_nvrtc_bwd.c prints estimate against
 * actual). */
static int bwd_regs_raw(const struct fa_tile *t, int D, fa_precision p)
{
	const int nt = 32 * t->nw;
	const int dp = fa_bwd_padded_d(t->path, D);
	const int kv = 2 * t->bc * dp / nt;
	const int s = 2 * t->bc * t->br / nt;
	const int dq = t->br * dp / nt;
	const int step = s > dq ? s : dq;
	if (t->path == FA_KPATH_BWDWG16 && D > 128) /* dK, dV, dQ of DP / 2 columns each (ptxas:
	                                                d256 218, d200 195, d192 170, d136 154) */
		return 48 + 2 * dp / 3;
	if (t->path == FA_KPATH_BWDWG16) /* dK, dV, S^T, dP^T (ptxas: d128 250, d64 229, d16 119) */
		return 120 + dp;
	if (t->path == FA_KPATH_BWDWG32) /* dK, dV, the step's S^T, dP^T, dQ^T and fragments
	                                    (ptxas: d128 q32 218, d64 q64 221) */
		return 24 + dp + 2 * t->br;
	if (t->path == FA_KPATH_BWDWG32X3) /* + the step's sums, remainders (ptxas, q32: d64
	                                      246..252, d8 155..161) */
		return 150 + 3 * dp / 2;
	if (t->path == FA_KPATH_BWD16)
		return 56 + kv + step;
	if (p == FA_PREC_3XTF32) /* + a chunk of partial sums (4 n8 tiles per row tile) */
		return 56 + kv + 16 * (t->bc / 16 / (t->nw < t->bc / 16 ? t->nw : t->bc / 16)) + step;
	return 48 + kv + step;
}

int fa_bwd_tile_regs(const struct fa_tile *t, int D, fa_precision p)
{
	int r = bwd_regs_raw(t, D, p);
	return r > 255 ? 255 : r;
}

/* Estimates above which a tile spilled (ptxas' 255 under __launch_bounds__(NT, 1); CUDA 13.0,
 * sm_86 and sm_90): 16-bit bf16 d256 kv64 q64 w8 (estimate 248) spilled 8 bytes, kv64 q32 w8
 * (216) did not; fp32 3xtf32 d256 kv16 q16 w2 (estimate 264) compiled to 255 without spills. */
#define FA_BWD_MAX_REGS16 240
#define FA_BWD_MAX_REGS32 264

/* The heuristic: work per byte moved (keys per block: Q and dO are reloaded once per key block,
 * dQ added once per key block; rows per step: fewer barriers and turns), latency hiding (8
 * warps), and when the shape is known how well the key blocks fill the waves. */
static double bwd_score(const struct fa_device_model *dev, const struct fa_plan_req *r,
                        const struct fa_tile *t, int bps)
{
	/* measured on the H200 (kernels/RESULTS.md, backward tile sweeps): keys per block weigh
	 * more than rows per step, and 16 rows per step is too few (bf16 d128: kv128 q32 186,
	 * kv64 q128 178, kv64 q64 158, kv128 q16 140, kv32 q128 113; fp32 3xtf32 d128: kv64 q64
	 * 48.8, kv128 q32 48.6, kv64 q32 42.9, kv128 q16 40.1 TFLOP/s) */
	/* the 83 fitted to those five bf16 points (within 2% each); with 64, kv128 q32 and kv64 q128
	 * tied exactly and the wave fill of a known shape picked kv64 q128, measured 178 against 186
	 * TFLOP/s (bf16 D=128 S=4096, kernels/PERF-NOTES.md, backward, 2026-12-02) */
	double f_kv = (double)t->bc / (t->bc + 83.0);
	double f_q = (double)t->br / (t->br + 16.0);
	/* the second Q/dO buffer measured no faster (bf16 d128 184 vs 186, causal 174 vs 179, d64
	 * 172 vs 173, d256 142 vs 141 TFLOP/s: the loads were already hidden by the other blocks'
	 * warps and L2), and costs shared memory: offered, ranked just below */
	double f_st = t->stages == 2 ? 0.98 : 1.0;
	/* two warps only where nothing larger fits (16-bit head dims of an odd number of 16s on
	 * 99 KiB cards, fp32 head dim 256 on small ones) */
	double f_w = t->nw == 8 ? 1.0 : t->nw == 4 ? 0.85 : 0.5;
	double f_fill = 1.0;
	if (r->Sk > 0 && r->B > 0 && r->H > 0 && dev->sm_count > 0) {
		/* kv heads are unknown here: the query heads bound the grid from above */
		double nblk = ceil((double)r->Sk / t->bc) * (double)r->B * (double)r->H;
		double slots = (double)dev->sm_count * bps;
		double waves = ceil(nblk / slots);
		f_fill = 0.5 + 0.5 * nblk / (waves * slots);
		f_fill *= 0.2 + 0.8 * (double)r->Sk / (ceil((double)r->Sk / t->bc) * t->bc);
	}
	return f_kv * f_q * f_w * f_st * f_fill;
}

/* Whether the wgmma backward is offered for req: sm_90 with the wgmma paths on
 * (fa_plan_wgmma_enabled), FA_WGMMA16_BWD not 0, fp16 / bf16 (fp32 in every precision stays
 * on attn_bwd.cu), head dims up to 256 (above 128 its wide form); under "auto" only where it
 * measured faster (H200, S = 4096): head dims 64 to 128 (kernels/RESULTS.md "the wgmma
 * backward": the backward alone 1.61x attn_bwd.cu's best tile at bf16 D=128, 1.46x causal,
 * 1.48x at D=64) and 192 to 256 ("the wide form": 1.32x at bf16 and fp16 D=256, 1.24x causal,
 * 1.12x at bf16 D=192). Below 64 and from 136 to 184 it is correct (FA_WGMMA16_BWD=1, the GPU
 * test's grid) but not timed, so the measured kernel keeps them. The window and softcap
 * (req->window, req->softcap) change nothing here: attn_bwd_sm90.cu has both (FA_WIN,
 * FA_SOFTCAP, attn_bwd.cu's numerics) in both forms, and its deterministic dQ's chain takes a
 * window (a query block's key blocks are a range, the turn counts from its first,
 * det_chain_turn); only the rotated order (an experiment, FA_BWD_DET_ROT=1) is not offered
 * with a window, gpu_bwd.c runs the chain then. */
static bool bwdwg_offered(const struct fa_device_model *dev, const struct fa_plan_req *req)
{
	const struct fa_kernel_settings *ks = req->ks ? req->ks : fa_kernel_settings_default();
	if (!fa_plan_wgmma_enabled(dev, ks) || ks->wgmma16_bwd == FA_WGMMA16_OFF)
		return false;
	if (req->dtype != FA_DTYPE_FP16 && req->dtype != FA_DTYPE_BF16)
		return false;
	if (req->D > 256)
		return false;
	return ks->wgmma16_bwd == FA_WGMMA16_ALL || (req->D >= 64 && req->D <= 128) ||
	       req->D >= 192;
}

/* Whether the fp32 wgmma backward (attn_bwd_sm90_tf32.cu) is offered for req: sm_90 with the
 * wgmma paths on, FA_WGMMA32_BWD not 0, fp32 tf32 or 3xtf32, head dims up to 128 (its tiles
 * fit 3xtf32 up to 64 only). Under "auto" where it measured faster (H200, S = 4096,
 * kernels/RESULTS.md "the fp32 wgmma backward"): tf32 head dims 64 to 128 (the backward
 * alone 1.77x attn_bwd.cu's tile at D=128, 1.69x causal, 1.74x at D=64) and 3xtf32 at 64
 * (1.43x). Below and between (3xtf32 under 64) it is correct (FA_WGMMA32_BWD=1, the GPU
 * test's cases) but not timed, so the measured kernel keeps them. The deterministic dQ stays
 * on attn_bwd.cu (gpu_bwd.c takes the next candidate). */
static bool bwdwg32_offered(const struct fa_device_model *dev, const struct fa_plan_req *req,
                            fa_precision prec)
{
	const struct fa_kernel_settings *ks = req->ks ? req->ks : fa_kernel_settings_default();
	if (!fa_plan_wgmma_enabled(dev, ks) || ks->wgmma32_bwd == FA_WGMMA16_OFF)
		return false;
	if (req->dtype != FA_DTYPE_FP32 || (prec != FA_PREC_TF32 && prec != FA_PREC_3XTF32))
		return false;
	if (req->D > 128)
		return false;
	/* no window or softcap in attn_bwd_sm90_tf32.cu: attn_bwd.cu's tiles come first then, so
	 * what fa-ctl plan shows is what runs (its deterministic dQ is gpu_bwd.c's to skip: the
	 * request does not say) */
	if (req->window || req->softcap > 0)
		return false;
	return ks->wgmma32_bwd == FA_WGMMA16_ALL ||
	       (prec == FA_PREC_TF32 ? req->D >= 64 : req->D == 64);
}

/* Blocks of tile t resident on one SM: its shared memory (and the 1 KiB the driver reserves per
 * block) and its registers (allocated per warp in units of 8 per thread); at least one. */
static int bwd_blocks_per_sm(const struct fa_device_model *dev, const struct fa_tile *t)
{
	int by_smem = (int)(dev->smem_per_sm / (t->smem + 1024));
	int by_regs = dev->regs_per_sm / (((t->regs + 7) / 8 * 8) * 32 * t->nw);
	int bps = by_smem < by_regs ? by_smem : by_regs;
	return bps < 1 ? 1 : bps;
}

/* A wgmma tile (either kernel) whose layout fits, its smem set: its registers, blocks per SM
 * and score (ranked above every mma.sync tile), onto all when within the device's limit and
 * the list has room. */
static void wg_tile_add(const struct fa_device_model *dev, const struct fa_plan_req *req,
                        fa_precision prec, struct fa_tile *t, struct fa_tile *all, int *nall)
{
	t->regs = fa_bwd_tile_regs(t, req->D, prec);
	if (t->smem > dev->smem_optin || *nall >= FA_PLAN_MAX_CANDIDATES)
		return;
	t->blocks_per_sm = bwd_blocks_per_sm(dev, t);
	t->score = 1.0 + bwd_score(dev, req, t, t->blocks_per_sm);
	all[(*nall)++] = *t;
}

static int cmp_tile(const void *a, const void *b)
{
	const struct fa_tile *x = a, *y = b;
	if (x->score != y->score)
		return x->score < y->score ? 1 : -1;
	if (x->smem != y->smem)
		return x->smem < y->smem ? -1 : 1;
	return 0;
}

static const char *dt_name(fa_dtype dt)
{
	return dt == FA_DTYPE_FP16 ? "fp16" : dt == FA_DTYPE_BF16 ? "bf16" : "fp32";
}

fa_status fa_plan_bwd(const struct fa_device_model *dev, const struct fa_plan_req *req,
                      struct fa_tile *out, int max, int *n, char *err, size_t errlen)
{
	static const int nws[] = {2, 4, 8}, bkvs[] = {16, 32, 64, 128}, bqs[] = {16, 32, 64, 128},
	                 stgs[] = {1, 2};
	struct fa_tile all[FA_PLAN_MAX_CANDIDATES], heavies[FA_PLAN_MAX_CANDIDATES];
	int nall = 0, nheavy = 0;
	size_t min_smem = (size_t)-1;
	struct fa_tile smallest = {0};

	if (n)
		*n = 0;
	if (!dev || !req || (!out && max > 0) || !n)
		return fa_err(err, errlen, FA_EINVAL, "planner: NULL argument");
	if (req->dtype != FA_DTYPE_FP16 && req->dtype != FA_DTYPE_BF16 &&
	    req->dtype != FA_DTYPE_FP32)
		return fa_err(err, errlen, FA_EDTYPE, "planner: unknown dtype %d", (int)req->dtype);
	if (req->D < 8 || req->D % 8 != 0)
		return fa_err(err, errlen, FA_ESHAPE,
		              "head dim %d: must be a multiple of 8 from 8 to 256", req->D);
	const fa_precision prec = fa_prec_resolve(req->dtype, req->precision);
	const int path = fa_plan_bwd_path(req->dtype, prec);
	for (size_t a = 0; a < sizeof nws / sizeof nws[0]; a++)
		for (size_t c = 0; c < sizeof bkvs / sizeof bkvs[0]; c++)
			for (size_t d = 0; d < sizeof bqs / sizeof bqs[0] * 2; d++) {
				struct fa_tile t = {0};
				t.path = path;
				t.nw = nws[a];
				t.rt = 1;
				t.bc = bkvs[c];
				t.br = bqs[d / 2];
				t.stages = stgs[d % 2];
				if (!fa_bwd_tile_layout_ok(&t, req->D))
					continue;
				t.smem = fa_bwd_tile_smem(&t, req->D);
				t.regs = fa_bwd_tile_regs(&t, req->D, prec);
				if (t.smem < min_smem) {
					min_smem = t.smem;
					smallest = t;
				}
				if (t.smem > dev->smem_optin || req->D > FA_ATTN_MAX_HEAD_DIM)
					continue;
				/* over the register estimate's cap: kept apart, offered only where nothing
				 * else fits (they run, with some spills) */
				const bool heavy = bwd_regs_raw(&t, req->D, prec) >
				    (path == FA_KPATH_BWD16 ? FA_BWD_MAX_REGS16 : FA_BWD_MAX_REGS32);
				t.blocks_per_sm = bwd_blocks_per_sm(dev, &t);
				t.score = bwd_score(dev, req, &t, t.blocks_per_sm);
				if (heavy && nheavy < FA_PLAN_MAX_CANDIDATES)
					heavies[nheavy++] = t;
				else if (!heavy && nall < FA_PLAN_MAX_CANDIDATES)
					all[nall++] = t;
			}
	/* the wgmma backward's tiles (two warpgroups, then one), ranked above every mma.sync tile
	 * (whose scores are below 1) */
	if (bwdwg_offered(dev, req)) {
		for (int nw = 8; nw >= 4; nw -= 4) {
			struct fa_tile t = {0};
			t.path = FA_KPATH_BWDWG16;
			t.nw = nw;
			t.rt = 1;
			t.bc = req->D > 128 ? 64 : 16 * nw; /* the wide form: two warpgroups, 64 keys */
			t.br = 64;
			t.stages = 2;
			if (!bwdwg_layout_ok(&t, req->D))
				continue;
			t.smem = bwdwg_smem(&t, req->D);
			wg_tile_add(dev, req, prec, &t, all, &nall);
		}
	}
	/* the fp32 wgmma backward's tiles (64 query rows a step, then 32; two warpgroups taking
	 * the steps in turn, then one), ranked above every mma.sync tile */
	if (bwdwg32_offered(dev, req, prec)) {
		for (int v = 0; v < 4; v++) {
			const int br = v < 2 ? 64 : 32;
			struct fa_tile t = {0};
			t.path = prec == FA_PREC_3XTF32 ? FA_KPATH_BWDWG32X3 : FA_KPATH_BWDWG32;
			t.nw = v % 2 ? 4 : 8;
			t.rt = 1;
			t.bc = 64;
			t.br = br;
			t.stages = 2;
			if (!bwdwg32_layout_ok(&t, req->D))
				continue;
			t.smem = bwdwg32_smem(&t, req->D);
			wg_tile_add(dev, req, prec, &t, all, &nall);
		}
	}
	if (nall == 0 && nheavy > 0) {
		memcpy(all, heavies, (size_t)nheavy * sizeof all[0]);
		nall = nheavy;
	}
	if (nall == 0) {
		char tb[48];
		fa_tile_format(&smallest, tb, sizeof tb);
		if (req->D > FA_ATTN_MAX_HEAD_DIM)
			snprintf(err, errlen,
			         "no backward tile fits: %s head dim %d (precision %s) is above the "
			         "kernels' maximum of %d; the smallest configuration (%s) would need %zu "
			         "bytes of shared memory, the device (%s) allows %zu",
			         dt_name(req->dtype), req->D, fa_prec_name(prec), FA_ATTN_MAX_HEAD_DIM,
			         tb, min_smem, dev->name, dev->smem_optin);
		else
			snprintf(err, errlen,
			         "no backward tile fits: %s head dim %d (precision %s): the smallest "
			         "configuration (%s) needs %zu bytes of shared memory, the device (%s) "
			         "allows %zu per block",
			         dt_name(req->dtype), req->D, fa_prec_name(prec), tb, min_smem, dev->name,
			         dev->smem_optin);
		return FA_ENOFIT;
	}
	qsort(all, (size_t)nall, sizeof all[0], cmp_tile);
	int k = nall < max ? nall : max;
	if (k > 0)
		memcpy(out, all, (size_t)k * sizeof all[0]);
	*n = k;
	return FA_OK;
}
