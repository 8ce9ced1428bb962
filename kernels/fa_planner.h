/* fa_planner.h - tile planning for the forward kernel (kernels/attn_fwd.cu), in plain C.
 *
 * The planner enumerates tile configurations (query rows per block, keys per step, warps,
 * pipeline stages), computes each one's dynamic shared memory exactly as the kernel lays it out
 * and a register estimate, keeps those that fit the device's opt-in shared-memory limit and
 * ranks them by a heuristic. It needs no GPU: a device is a model (struct fa_device_model), either
 * one of the named ones (fa_device_model_find) or read from the real device (fa_gpu.h).
 */
#ifndef FA_PLANNER_H
#define FA_PLANNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_settings.h"
#include "fa_types.h"

/* What the planner needs to know about a device. */
struct fa_device_model {
	const char *name;   /* "sm_89", "h200", ... */
	int sm;             /* compute capability as major*10 + minor: 80, 86, 89, 90, 100, 120 */
	size_t smem_optin;  /* bytes of dynamic shared memory one block may opt in to */
	size_t smem_per_sm; /* bytes of shared memory per multiprocessor */
	int regs_per_sm;    /* 32-bit registers per multiprocessor */
	int sm_count;       /* multiprocessors (for wave quantisation); 0 if unknown */
};

/* The named models (sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_120 and card names). *n gets
 * the count. */
const struct fa_device_model *fa_device_models(int *n);

/* A named model: "sm_80", "80", "a100", "sm_86", "sm_89", "l40s", "sm_90", "h100", "h200",
 * "sm_100", "b200", "sm_120", "rtx5090"... NULL if unknown. */
const struct fa_device_model *fa_device_model_find(const char *name);

/* The kernel's two data paths. */
enum fa_kpath {
	FA_KPATH_16 = 1, /* 16-bit shared memory, m16n8k16 (fp16, bf16, and fp32 staged as bf16) */
	FA_KPATH_32 = 2, /* fp32 shared memory, m16n8k8 tf32 / 3xtf32, or FFMA for ieee */
	/* sm_90 only (attn_fwd_sm90.cu, compiled for sm_90a): fp32 inputs on wgmma tf32, K and V
	 * pre-rounded into tile images; nw = 4 per warpgroup, rt = 1 (64 query rows per group) */
	FA_KPATH_WG32 = 3,   /* tf32: K and V^T per stage */
	FA_KPATH_WG32X3 = 4, /* 3xtf32: K, K_lo, V^T, V^T_lo per stage */
	FA_KPATH_WG16 = 5,   /* fp16, bf16, fp32 staged as bf16: K and V^T per stage, 16-bit */
	/* the decode kernels (attn_decode.cu, planner_decode.c): split-KV, the GQA group packed
	 * into the rows; br = packed rows per block, rt = 1, bc = 16 keys per warp step */
	FA_KPATH_DEC16 = 6, /* fp16, bf16: mma.sync m16n8k16 */
	FA_KPATH_DEC32 = 7, /* fp32, every precision: FFMA */
	/* the backward (attn_bwd.cu, planner_bwd.c): nw warps, bc keys a block owns, br query
	 * rows per step; rt = 1, stages = 1 */
	FA_KPATH_BWD16 = 8, /* 16-bit shared memory, m16n8k16 (fp16, bf16, fp32 staged as bf16) */
	FA_KPATH_BWD32 = 9, /* fp32 shared memory, m16n8k8 tf32 / 3xtf32, FFMA for ieee */
	/* sm_90 only (attn_bwd_sm90.cu, sm_90a): fp16 / bf16 on wgmma; nw = 4 per warpgroup of 64
	 * keys (bc = 16 nw), br = 64 query rows per step, stages = 2; head dims up to 128, and
	 * above (to 256) its wide form: nw = 8, bc = 64 (two warpgroups halve the head dim); the
	 * window and softcap as attn_bwd.cu (FA_WIN, FA_SOFTCAP) */
	FA_KPATH_BWDWG16 = 10,
	/* sm_90 only (attn_bwd_sm90_tf32.cu, sm_90a): fp32 tf32 / 3xtf32 on wgmma; nw = 8 or 4 (two
	 * warpgroups taking the steps of 64 keys in turn, or one; bc = 64), br = 32 or 64 query
	 * rows per step (3xtf32: 32), stages = 2; head dims
	 * up to 128 (3xtf32: as far as its images fit, 64); atomic dQ only (the deterministic
	 * mode, a window and softcap take attn_bwd.cu's tiles: gpu_bwd.c) */
	FA_KPATH_BWDWG32 = 11,   /* tf32 */
	FA_KPATH_BWDWG32X3 = 12, /* 3xtf32: every image with its remainder */
};

/* Whether a path is the fp32 wgmma backward's (either precision). */
static inline bool fa_kpath_is_bwdwg32(int path)
{
	return path == FA_KPATH_BWDWG32 || path == FA_KPATH_BWDWG32X3;
}

/* Whether a path is one of the backward's. */
static inline bool fa_kpath_is_bwd(int path)
{
	return path == FA_KPATH_BWD16 || path == FA_KPATH_BWD32 || path == FA_KPATH_BWDWG16 ||
	       fa_kpath_is_bwdwg32(path);
}

/* Whether a path is one of the wgmma paths. */
static inline bool fa_kpath_is_wg(int path)
{
	return path == FA_KPATH_WG32 || path == FA_KPATH_WG32X3 || path == FA_KPATH_WG16;
}

/* Whether a path is one of the decode paths. */
static inline bool fa_kpath_is_decode(int path)
{
	return path == FA_KPATH_DEC16 || path == FA_KPATH_DEC32;
}

/* One tile configuration and what it costs. */
struct fa_tile {
	int path;         /* enum fa_kpath */
	int nw;           /* warps per block */
	int rt;           /* row tiles of 16 query rows per warp */
	int br;           /* query rows per block = 16 * nw * rt */
	int bc;           /* keys per step */
	int stages;       /* K/V pipeline depth */
	size_t smem;      /* dynamic shared memory in bytes */
	int regs;         /* estimated registers per thread */
	int blocks_per_sm;/* resident blocks per multiprocessor by shared memory and registers */
	double score;     /* heuristic rank, higher is better */
};

/* The problem as the planner sees it. B, H, Sq, Sk may be 0 when unknown (offline planning). */
struct fa_plan_req {
	fa_dtype dtype;
	fa_precision precision; /* fp32 only; FA_PREC_DEFAULT resolved here */
	int D;
	fa_mask mask;
	int64_t B, H, Sq, Sk;
	/* the sliding window and logit softcap (fa_attn.h): window when it bounds a side
	 * (fa_attn_window_active; window_left, window_right as the descriptor's, negative
	 * unbounded), softcap > 0 on. Every backward kernel but the fp32 wgmma one serves both
	 * (their FA_WIN / FA_SOFTCAP specialisations), so they change no other candidate; they are
	 * here so that what the planner is asked is what a call runs (fa-ctl plan --window /
	 * --softcap shows it). */
	bool window;
	int64_t window_left, window_right;
	double softcap;
	/* what the planner may offer (wgmma, experiments' tile filters); borrowed for the call;
	 * NULL: fa_kernel_settings_default() */
	const struct fa_kernel_settings *ks;
};

struct fa_attn_fwd_desc;

/* The planner's view of a forward problem (its query heads, not its kv heads). */
void fa_plan_req_from_desc(const struct fa_attn_fwd_desc *d, struct fa_plan_req *r);

/* FA_PREC_DEFAULT -> FA_PREC_3XTF32 for fp32; fp16/bf16 give FA_PREC_DEFAULT. */
fa_precision fa_prec_resolve(fa_dtype dt, fa_precision p);
/* "ieee", "3xtf32", "tf32", "bf16", "default". Static storage. */
const char *fa_prec_name(fa_precision p);
bool fa_prec_parse(const char *s, fa_precision *out);
/* "none", "causal-bottom-right", "causal-top-left". */
const char *fa_mask_name(fa_mask m);

/* The data path a (dtype, precision) runs on before sm_90 (mma.sync; fa_plan adds the wgmma
 * paths on sm_90 for fp32 tf32 and 3xtf32). */
int fa_plan_path(fa_dtype dt, fa_precision p);

/* Whether fa_plan offers the wgmma paths: an sm_90 device (wgmma is sm_90a's: sm_100 and sm_120
 * run mma.sync) and ks->wgmma (FA_WGMMA, the switch that lets benchmarks compare with the
 * mma.sync kernel in one run). The 16-bit one also needs ks->wgmma16 not FA_WGMMA16_OFF. ks
 * NULL: the defaults. */
bool fa_plan_wgmma_enabled(const struct fa_device_model *dev, const struct fa_kernel_settings *ks);
bool fa_plan_wgmma16_enabled(const struct fa_device_model *dev, const struct fa_kernel_settings *ks);

/* Head dim as the kernel pads it (16-bit path: next multiple of 16). */
int fa_tile_padded_d(int path, int D);

/* Bytes of dynamic shared memory of a forward configuration (path, nw, rt, bc, stages must be
 * set; the backward's: fa_bwd_tile_smem). */
size_t fa_tile_smem(const struct fa_tile *t, int D);

/* Estimated registers per thread of a configuration. */
int fa_tile_regs(const struct fa_tile *t, int D, fa_precision p);

/* Plan: write up to `max` configurations that fit `dev`, best first, into out[] and their number
 * into *n (all of them if max is large enough; FA_PLAN_MAX_CANDIDATES is). Returns FA_OK, FA_EINVAL
 * (bad request: dtype, D not a multiple of 8 in [8, 256]...) or FA_ENOFIT, with err naming the
 * shape, the smallest configuration's need in bytes and the device's limit. */
#define FA_PLAN_MAX_CANDIDATES 128
fa_status fa_plan(const struct fa_device_model *dev, const struct fa_plan_req *req,
                  struct fa_tile *out, int max, int *n, char *err, size_t errlen);

/* A short text for a configuration: "128x64 w4r2 s2" (rows x keys, warps, row tiles, stages). */
void fa_tile_format(const struct fa_tile *t, char *buf, size_t len);

/* ---- the decode path (planner_decode.c, attn_decode.cu) ---------------------------------- */

/* Decode when the query rows are at most this many (speculative decoding sends 2-8); above, the
 * prefill kernel's 64-128-row tiles are full and it is faster. */
#define FA_DECODE_MAX_SQ 16

/* What one decode launch runs. */
struct fa_decode_plan {
	struct fa_tile tile; /* path FA_KPATH_DEC16 / DEC32, nw warps, br packed rows per block, bc
	                      * 16, stages, smem, regs (estimate), blocks_per_sm */
	int rows;            /* packed rows of a kv head: Sq * (Hq / Hkv) */
	int row_chunks;      /* blocks per kv head over those rows: ceil(rows / br) */
	int nsplit;          /* key splits (1: the kernel writes O itself, no merge pass) */
	int split_keys;      /* keys per split, a multiple of 16 */
	size_t scratch;      /* device bytes of the partials (nsplit > 1), else 0 */
	size_t scratch_lse;  /* offset of the partial logsumexps in that scratch */
};

/* Whether fa_gpu_attn_fwd takes the decode path for d on dev: ks->decode FA_DECODE_ALL, or
 * FA_DECODE_AUTO and d->Sq <= FA_DECODE_MAX_SQ. ks NULL: the defaults. */
bool fa_decode_wanted(const struct fa_device_model *dev, const struct fa_attn_fwd_desc *d,
                      const struct fa_kernel_settings *ks);

/* Plan a decode launch for d (a descriptor fa_attn_fwd_check accepts) on dev: the tile (tile
 * NULL: the planner's, the most K/V bytes in flight per SM that fit, ks->decode_stages
 * respected; else that tile, a decode path, checked to fit) and the split: enough blocks
 * (batch x kv heads x row chunks x splits) for whole waves of one block per SM (the fewest
 * splits within 5% of the best wave fill; at most 256), at least 64 keys per warp and split, ks->decode_splits
 * when set. FA_OK; FA_EINVAL (not a decode tile, a bad head dim); FA_ENOFIT (nothing fits the
 * shared memory, err says the need and the limit); FA_ESHAPE (kv heads x row chunks over
 * 65535). Pure, thread-safe. */
fa_status fa_plan_decode(const struct fa_device_model *dev, const struct fa_attn_fwd_desc *d,
                         const struct fa_kernel_settings *ks, const struct fa_tile *tile,
                         struct fa_decode_plan *out, char *err, size_t errlen);

/* Bytes of dynamic shared memory of a decode tile (path, nw, br, stages set) at head dim D:
 * mirrors SMEM_Q, the rings, fp32's P buffer and the merge area of attn_decode.cu. */
size_t fa_decode_smem(const struct fa_tile *t, int D);
/* ---- the backward (planner_bwd.c) ------------------------------------------------------------
 * A backward tile: path FA_KPATH_BWD16 or FA_KPATH_BWD32, nw warps, bc keys owned by a block
 * (K, V, dK, dV resident), br query rows per step (Q, dO, P^T, dS^T staged), rt = 1 (2 in a
 * kernel spec: the deterministic dQ's kernel, set by gpu_bwd.c), stages = 1 or 2.
 * fa_plan_req describes the problem as for the forward (H = query heads; Sq, Sk may be 0). */

/* The backward's data path for (dtype, precision): fp32 staged as bf16 runs the 16-bit one. */
int fa_plan_bwd_path(fa_dtype dt, fa_precision p);

/* Head dim as the backward pads it (attn_bwd.cu's DP): to 16, above 128 to 32 (so that two or
 * four warps can split the columns of dK, dV and dQ). */
int fa_bwd_padded_d(int path, int D);

/* Bytes of dynamic shared memory of a backward tile (attn_bwd.cu's layout: K, V, Q, dO rows
 * padded, P^T and dS^T, lse2 and delta). */
size_t fa_bwd_tile_smem(const struct fa_tile *t, int D);

/* Estimated registers per thread of a backward tile (fitted to ptxas, capped at 255). */
int fa_bwd_tile_regs(const struct fa_tile *t, int D, fa_precision p);

/* Whether attn_bwd.cu's warp layout divides the tile (its static_asserts). */
bool fa_bwd_tile_layout_ok(const struct fa_tile *t, int D);

/* Plan the backward: like fa_plan (same statuses and texts, "no backward tile fits: ..." with
 * the smallest configuration's bytes and the device's limit), against dev->smem_optin. */
fa_status fa_plan_bwd(const struct fa_device_model *dev, const struct fa_plan_req *req,
                      struct fa_tile *out, int max, int *n, char *err, size_t errlen);

#endif /* FA_PLANNER_H */
