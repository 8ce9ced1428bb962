/* fa_settings.h - the kernels' settings: what the planner offers, what NVRTC is given, where it
 * is found and how large the kernel disk cache may grow. Read once, by the program that opens the
 * kernels (the daemon's option table, fa-ctl's flags and environment, the tests' helper), into
 * one struct passed to the planner (fa_plan_req.ks), NVRTC (fa_nvrtc_open), the GPU launcher
 * (fa_gpu_open) and the tuning table's identity (fa_tune_ident_make). Nothing under kernels/
 * reads the environment.
 *
 * Each setting has a name, its environment variable's: programs that read the environment call
 * fa_kernel_settings_set(s, name, getenv(name)) for each of fa_kernel_settings_names(). Plain C,
 * no state: every function is thread-safe on distinct structs.
 */
#ifndef FA_SETTINGS_H
#define FA_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>

#include "fa_types.h"

/* fa_kernel_settings.wgmma16 */
enum fa_wgmma16_mode {
	FA_WGMMA16_MEASURED = 0, /* where it measured faster on the H200 (planner.c, wg16_wins) */
	FA_WGMMA16_OFF = 1,      /* never: the mma.sync kernel serves 16-bit inputs */
	FA_WGMMA16_ALL = 2,      /* wherever a wgmma tile fits (experiments, compile checks) */
};

/* fa_kernel_settings.decode */
enum fa_decode_mode {
	FA_DECODE_AUTO = 0, /* decode shapes (Sq <= FA_DECODE_MAX_SQ, planner_decode.c) */
	FA_DECODE_OFF = 1,  /* never: the prefill kernel serves every shape (the "before") */
	FA_DECODE_ALL = 2,  /* every shape (tests, experiments) */
};

#define FA_KERNEL_SETTINGS_EXTRA_MAX 192
#define FA_KERNEL_SETTINGS_PATH_MAX 512

struct fa_kernel_settings {
	/* FA_WGMMA: offer the sm_90a wgmma paths on sm_90 (false: mma.sync only, the comparison
	 * benchmarks make in one run). Default true. */
	bool wgmma;
	/* FA_WGMMA16: where the 16-bit wgmma kernel is offered ("auto", "0", "1"). Default auto. */
	enum fa_wgmma16_mode wgmma16;
	/* FA_WG_BC, FA_WG_STAGES, FA_WG_NWG: keep only wgmma tiles of this many keys per step,
	 * stages, warpgroups (experiments, kernels/PERF-NOTES.md). 0 (default): all. */
	int wg_bc, wg_stages, wg_nwg;
	/* FA_NVRTC_EXTRA: extra -D options for NVRTC ("-DX=1 -DY=2", at most 4 tokens of 47 bytes),
	 * part of the disk cache's key and of the tuning table's source hash, so experiments never
	 * pick up or leave a wrong cubin. Default "". */
	char nvrtc_extra[FA_KERNEL_SETTINGS_EXTRA_MAX];
	/* FA_KERNEL_CACHE_MAX_MB: the disk cache's bound in MiB; 0 (default): 512. */
	unsigned long long kernel_cache_max_mb;
	/* CUDA_HOME: a toolkit whose lib64/libnvrtc.so.13 is tried after the one the build named
	 * (FA_CUDA_HOME) and before the loader's path. Default "" (none). */
	char cuda_home[FA_KERNEL_SETTINGS_PATH_MAX];
	/* FA_DECODE: where fa_gpu_attn_fwd takes the split-KV decode kernels (attn_decode.cu):
	 * "auto" (default), "0" never, "1" every shape. */
	enum fa_decode_mode decode;
	/* FA_DECODE_SPLITS: key splits of the decode path (0, default: the planner's choice from
	 * the shape and the SM count; else this many, at most one per 16 keys). */
	int decode_splits;
	/* FA_DECODE_STAGES: K/V tiles in each decode warp's ring (0, default: the planner's; else
	 * 2..8). */
	int decode_stages;
	/* FA_BWD_DET_GROUP: consecutive key blocks the deterministic backward runs as one group
	 * (attn_bwd.cu, det_member): 0 (default) or 1 groups of one, as measured on the H200; 2, 4
	 * or 8 share Q, dO and the dQ rows in L2 (built, checked by simulation; the measurement
	 * that decides the default). A group larger than the blocks resident at once runs as
	 * groups of one. */
	int bwd_det_group;
	/* FA_WGMMA16_BWD: where the 16-bit wgmma backward (attn_bwd_sm90.cu, sm_90) is offered:
	 * "auto" (default: where it measured faster, planner_bwd.c), "0" never (attn_bwd.cu serves
	 * every shape), "1" wherever it claims the shape (tests force it with this). */
	enum fa_wgmma16_mode wgmma16_bwd;
	/* FA_WGMMA32_BWD: where the fp32 tf32 / 3xtf32 wgmma backward (attn_bwd_sm90_tf32.cu,
	 * sm_90) is offered: "auto" (default: where it measured faster, planner_bwd.c), "0" never,
	 * "1" wherever it fits the shape (tests force it with this). */
	enum fa_wgmma16_mode wgmma32_bwd;
	/* FA_BWD_DET_ROT: "1" gives the 16-bit wgmma backward's deterministic mode its turn
	 * orders back (an experiment, off): the rotated one where the key blocks fit (on the H200
	 * it gave gradients far from the atomic mode's without a mask, 2026-12-03), the chain
	 * elsewhere, instead of the fixed point (FA_DET 2, +8..14% on the H200 against the turns'
	 * +18..38%: kernels/RESULTS.md); "0" (default) the fixed point. */
	bool bwd_det_rot;
};

/* The defaults, as an initialiser: struct fa_kernel_settings s = FA_KERNEL_SETTINGS_INIT; */
#define FA_KERNEL_SETTINGS_INIT                                                                 \
	{ .wgmma = true, .wgmma16 = FA_WGMMA16_MEASURED, .wg_bc = 0, .wg_stages = 0, .wg_nwg = 0,  \
	  .nvrtc_extra = "", .kernel_cache_max_mb = 0, .cuda_home = "", .decode = FA_DECODE_AUTO,  \
	  .decode_splits = 0, .decode_stages = 0, .bwd_det_group = 0,                          \
	  .wgmma16_bwd = FA_WGMMA16_MEASURED, .wgmma32_bwd = FA_WGMMA16_MEASURED,               \
	  .bwd_det_rot = false }

/* The defaults, for a struct that exists already. */
void fa_kernel_settings_init(struct fa_kernel_settings *s);

/* The defaults, for functions given NULL settings. Static storage. */
const struct fa_kernel_settings *fa_kernel_settings_default(void);

/* The settings' names, NULL-terminated ("FA_WGMMA", ..., "CUDA_HOME"). Static storage. */
const char *const *fa_kernel_settings_names(void);

/* Set one setting by name from text: FA_WGMMA and FA_BWD_DET_ROT "0"/"1"; FA_WGMMA16, FA_WGMMA16_BWD, FA_WGMMA32_BWD and FA_DECODE
 * "auto"/"0"/"1";
 * FA_WG_* and FA_DECODE_SPLITS a count in [0, 1024]; FA_DECODE_STAGES 0 or 2..8;
 * FA_BWD_DET_GROUP 0, 1, 2, 4 or 8;
 * FA_KERNEL_CACHE_MAX_MB in [0, 2^40); the strings as they are. value NULL
 * leaves the setting as it is. FA_OK, FA_EINVAL (unknown name, bad value, too long: err says
 * which). */
fa_status fa_kernel_settings_set(struct fa_kernel_settings *s, const char *name,
                                 const char *value, char *err, size_t errlen);

/* One setting as text, as fa_kernel_settings_set reads it. false for an unknown name. */
bool fa_kernel_settings_get(const struct fa_kernel_settings *s, const char *name, char *buf,
                            size_t cap);

#endif /* FA_SETTINGS_H */
