/* fa_gpu.h - the forward kernel on a GPU: NVRTC compilation, the CUDA driver, the launch API.
 *
 * Nothing here links CUDA: libcuda.so.1 and libnvrtc are loaded with dlopen on first use, so
 * every program starts on machines without a driver and reports "no GPU" as a status
 * (FA_ENOGPU) with the reason in err.
 *
 * Two layers:
 *   fa_nvrtc_*   compile a kernel specialisation to a cubin and read ptxas' resource report
 *                (registers, spills, stack); needs NVRTC only, no GPU (CI's compile checks).
 *   fa_gpu_*     one device: primary context, kernel cache (specialisation -> CUfunction),
 *                fa_gpu_attn_fwd() (the launch API the daemon calls), and small memory helpers
 *                for tests and benchmarks.
 */
#ifndef FA_GPU_H
#define FA_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_attn.h"
#include "fa_planner.h"

#ifdef FA_HAVE_CUDA_HEADERS
#include <cuda.h>
#else
typedef unsigned long long CUdeviceptr;
typedef struct CUstream_st *CUstream;
#endif

/* ---- compile-time specialisation --------------------------------------------------------- */

/* fa_kernel_spec.layout: how the forward kernel (attn_fwd.cu, mma.sync paths) finds a batch's
 * rows. 0 is the dense batch of fa_gpu_attn_fwd; the others are the inference layouts of
 * fa_gpu_infer.h, launched by fa_gpu_fwd_infer only. */
enum fa_klayout {
	FA_KLAYOUT_DENSE = 0,
	FA_KLAYOUT_SEQ = 1,   /* sequences of their own lengths: packed or dense queries, packed keys
	                       * or a contiguous cache (per-sequence lengths and first rows) */
	FA_KLAYOUT_PAGED = 2, /* the same with the keys in a paged cache (a page lookup per row) */
};

/* Bytes of shared memory a layout adds to a forward tile's (fa_tile_smem): the paged loader's
 * row table with two stages and more (attn_fwd.cu, PTAB: two tiles x K, V x bc rows x 8). */
static inline size_t fa_klayout_smem(const struct fa_tile *t, int layout)
{
	return layout == FA_KLAYOUT_PAGED && t->stages >= 2 ? (size_t)32 * (size_t)t->bc : 0;
}

/* Everything a kernel binary is specialised on. */
struct fa_kernel_spec {
	int sm;                 /* target architecture, e.g. 90 */
	fa_dtype in;            /* element type the kernel reads (bf16 for fp32 staged as bf16) */
	fa_dtype out;           /* element type of O */
	fa_dtype qin;           /* element type of Q in memory: in, or fp32 for the bf16 staging
	                         * (the kernel converts Q itself; 0 reads as in) */
	fa_precision precision; /* fp32 path: IEEE, 3XTF32 or TF32; else FA_PREC_DEFAULT */
	int D;                  /* head dim */
	fa_mask mask;
	struct fa_tile tile;    /* path, nw, rt, bc, stages (smem is recomputed) */
	/* fa_kernel_spec_mask_ext: the sliding window (FA_WIN) and logit softcapping (FA_SOFTCAP)
	 * specialisations; false (fa_kernel_spec_make's zero) compiles today's kernels unchanged */
	bool window, softcap;
	int layout;             /* enum fa_klayout; fa_kernel_spec_make sets FA_KLAYOUT_DENSE */
};

/* The specialisation that serves (dtype, precision, D, mask) with `tile` on architecture sm.
 * fp32 with precision bf16: a bf16 kernel reading fp32 Q and writing fp32 O (qin fp32; the host
 * converts K and V). */
void fa_kernel_spec_make(struct fa_kernel_spec *s, int sm, fa_dtype dt, fa_precision prec, int D,
                         fa_mask mask, const struct fa_tile *tile);

/* Set s's window and softcap flags from d (fa_attn_window_active of fa_attn.h, softcap > 0), after
 * fa_kernel_spec_make: the specialisations that serve them (the forward, wgmma, decode and
 * backward kernels all take both). */
void fa_kernel_spec_mask_ext(struct fa_kernel_spec *s, const struct fa_attn_fwd_desc *d);
#define FA_KERNEL_SPEC_MASK_EXT 1 /* the fields above exist (tools/sass-dump.c builds on older trees) */

/* The CUDA source a specialisation compiles: attn_fwd.cu, or attn_fwd_sm90.cu on the wgmma
 * paths (fa_kpath_is_wg). Static storage. */
void fa_kernel_source(const struct fa_kernel_spec *s, const char **src, size_t *len);

/* A short unique name of a specialisation ("sm90 bf16>bf16 d128 none 128x64 w4r2 s2"). */
void fa_kernel_spec_name(const struct fa_kernel_spec *s, char *buf, size_t len);

/* What ptxas reported for the kernel fa_attn_fwd. -1 where the log said nothing. */
struct fa_kernel_usage {
	int regs;
	int stack;        /* bytes of stack frame */
	int spill_stores; /* bytes */
	int spill_loads;  /* bytes */
	bool serialized;  /* ptxas serialized the wgmmas (C7513/C7514: the overlap is lost) */
	double compile_s; /* wall time of the NVRTC call */
};

struct fa_nvrtc;

/* Load NVRTC (FA_CUDA_HOME/lib64/libnvrtc.so.13 as built, then ks->cuda_home's, then the loader
 * path). ks (borrowed for the call; NULL: the defaults) also gives the experiments' extra -D
 * options (FA_NVRTC_EXTRA), copied into the handle. FA_ENOGPU with the reason when NVRTC cannot
 * be loaded. */
fa_status fa_nvrtc_open(struct fa_nvrtc **out, const struct fa_kernel_settings *ks, char *err,
                        size_t errlen);
void fa_nvrtc_close(struct fa_nvrtc *n);
/* NVRTC's version, e.g. 13.0. */
void fa_nvrtc_version(const struct fa_nvrtc *n, int *major, int *minor);

/* Compile a specialisation to a cubin (malloc'd, caller frees; cubin may be NULL to only check),
 * with ptxas' resource report in *usage (may be NULL). FA_EINTERNAL with the compiler's log in
 * err on a compile error. Thread-safe. */
fa_status fa_nvrtc_compile(struct fa_nvrtc *n, const struct fa_kernel_spec *s, void **cubin,
                           size_t *cubin_size, struct fa_kernel_usage *usage, char *err,
                           size_t errlen);

/* The NVRTC option list of a specialisation as n compiles it, in the order the compile passes
 * it: -arch, the -D specialisation macros, and the tokens of n's FA_NVRTC_EXTRA (experiments;
 * none when n is NULL). The disk cache hashes exactly this list (fa_diskcache.h). */
#define FA_NVRTC_MAX_OPTS 20
struct fa_nvrtc_opts {
	int n;
	char v[FA_NVRTC_MAX_OPTS][48];
};
void fa_nvrtc_options(const struct fa_nvrtc *n, const struct fa_kernel_spec *s,
                      struct fa_nvrtc_opts *o);

/* fa_nvrtc_compile with a given option list (from fa_nvrtc_options): what the disk cache uses,
 * so that the options it hashed are the ones compiled. Same statuses. Thread-safe. */
fa_status fa_nvrtc_compile_opts(struct fa_nvrtc *n, const struct fa_kernel_spec *s,
                                const struct fa_nvrtc_opts *o, void **cubin, size_t *cubin_size,
                                struct fa_kernel_usage *usage, char *err, size_t errlen);

/* ---- a device ------------------------------------------------------------------------------ */

struct fa_gpu;

/* Open device `ordinal` (CUDA's numbering): load the driver and NVRTC, retain the primary
 * context, read the device's limits. ks: the kernel settings (fa_settings.h; copied; NULL: the
 * defaults) for the planner, NVRTC, the disk cache's bound and the tuning identity
 * (fa_tune_gpu_ident). FA_ENOGPU with the reason when there is no usable GPU (no driver, no
 * device, older than sm_80). */
fa_status fa_gpu_open(struct fa_gpu **out, int ordinal, const struct fa_kernel_settings *ks,
                      char *err, size_t errlen);
/* The settings fa_gpu_open was given (the defaults for NULL). */
const struct fa_kernel_settings *fa_gpu_settings(const struct fa_gpu *g);
/* Unload every cached module, release the context. Safe on NULL. */
void fa_gpu_close(struct fa_gpu *g);

/* The device as the planner sees it (opt-in shared memory read from the device). */
const struct fa_device_model *fa_gpu_model(const struct fa_gpu *g);
int fa_gpu_sm(const struct fa_gpu *g);
size_t fa_gpu_smem_optin(const struct fa_gpu *g);
const char *fa_gpu_name(const struct fa_gpu *g);
/* The device's 16-byte UUID (stable across CUDA_VISIBLE_DEVICES orderings). */
void fa_gpu_uuid(const struct fa_gpu *g, uint8_t uuid[16]);
/* The driver's version (cuDriverGetVersion: 1000 * major + 10 * minor, e.g. 13000). */
int fa_gpu_driver_version(const struct fa_gpu *g);
/* Make the device's context current on the calling thread (fa_gpu_* do it themselves). */
fa_status fa_gpu_make_current(struct fa_gpu *g, char *err, size_t errlen);

/* Forward attention on the device, enqueued on stream s (0: the legacy default stream).
 * Decode shapes (fa_decode_wanted: Sq <= FA_DECODE_MAX_SQ unless the settings' FA_DECODE says
 * otherwise) run the split-KV decode kernels (attn_decode.cu, planned by fa_plan_decode): the
 * query heads of a GQA group packed into one tile's rows, the keys split over blocks. With more
 * than one split the partial O (fp32) and logsumexps live in a workspace of
 * fa_decode_plan.scratch bytes taken from the device's default memory pool in stream order
 * (cuMemAllocAsync on s before the kernels, cuMemFreeAsync after the merge pass): fa_gpu_open
 * raises the pool's release threshold, so the pool grows to the largest decode's need once and
 * reuses that memory for every later launch on any stream, with no host synchronisation, and
 * concurrent launches on different streams never share bytes. The prefill path's fp32 staging
 * and wgmma images use the same pool.
 * Everything else below applies to both paths. 
 * q, k, v, o: device pointers to the tensors as the descriptor describes them; lse: device
 * pointer to fp32 [B, Hq, Sq] by d->lse_stride, or 0 for none. Requirements beyond
 * fa_attn_fwd_check(): every pointer 16-byte aligned and every batch/seq/head stride a multiple
 * of 16 bytes (FA_EALIGN), dimensions below 2^31 (FA_ESHAPE), a tile that fits (FA_ENOFIT, the
 * planner's text). Compiles the specialisation on first use (cached in memory). Returns after
 * enqueueing: synchronise the stream before reading O. FA_EDEVICE with the driver's text on a
 * launch failure. */
fa_status fa_gpu_attn_fwd(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, CUdeviceptr q,
                          CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                          char *err, size_t errlen);

/* The same with an explicit tile (one of fa_plan's candidates, or a decode tile of
 * fa_plan_decode: its split is planned for the shape): for the tuner and benchmarks. */
fa_status fa_gpu_attn_fwd_tile(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                               const struct fa_tile *tile, CUdeviceptr q, CUdeviceptr k,
                               CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                               char *err, size_t errlen);

/* Compile and load the kernel fa_gpu_attn_fwd(_tile) would use for d (tile NULL: the planner's
 * choice) without launching: warms the cache; safe to call from several threads at once. */
fa_status fa_gpu_prepare(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                         const struct fa_tile *tile, char *err, size_t errlen);

/* A query for callers that compile off their launch thread (the daemon's compile pool): is the
 * kernel fa_gpu_attn_fwd(d) would launch now (the tile it would choose now) loaded in memory?
 * *ready says so; name gets that specialisation's fa_kernel_spec_name (the key to compile each
 * one once; may be truncated to namelen). Counts nothing: no cache hit, no tuning-table pick,
 * no wanted class, no launch-memo hit. Cheap (a shape launched before: the launch memo's entry;
 * else the planner, a table lookup, a scan of the loaded kernels) and thread-safe. FA_OK, or the planner's status with err (the launch will report the same). */
fa_status fa_gpu_kernel_lookup(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, bool *ready,
                               char *name, size_t namelen, char *err, size_t errlen);

/* Use a tuning table (fa_tune.h) to choose tiles: fa_gpu_attn_fwd (and fa_gpu_prepare with tile
 * NULL) then launch the table's tuned tile for d's class when it is one of the planner's fitting
 * candidates on this device, else the planner's first choice. NULL (the default): the planner's
 * first choice always. The table stays the caller's (close it after fa_gpu_close or after
 * setting NULL); it may be tuned further while set (it is locked inside). */
struct fa_tune_table;
void fa_gpu_set_tune_table(struct fa_gpu *g, struct fa_tune_table *t);

/* The planner's ranked candidates for d on this device (the first is fa_gpu_attn_fwd's choice
 * when no tuning table is set). */
fa_status fa_gpu_plan(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, struct fa_tile *out,
                      int max, int *n, char *err, size_t errlen);

/* ---- the kernel caches (memory and disk) and their counters ---------------------------- */

/* Keep compiled kernels on disk under `dir` ("<dir>/kernels/<32 hex>.cubin", fa_diskcache.h,
 * kernels/README.md "Kernel cache"), so a restarted daemon loads instead of compiling. The
 * directories are created (0750) if missing. dir NULL or "": no disk cache (the default after
 * fa_gpu_open). The cache is bounded at 512 MiB (oldest entries pruned), or at the settings'
 * FA_KERNEL_CACHE_MAX_MB MiB. Returns FA_OK; FA_ESYS or FA_EPERM with the reason in err when
 * the directory is unusable: the disk cache is then disabled and everything else works as
 * before (the caller logs err and carries on). Call it before other threads use g (not
 * concurrently with fa_gpu_attn_fwd / fa_gpu_prepare). */
fa_status fa_gpu_set_cache_dir(struct fa_gpu *g, const char *dir, char *err, size_t errlen);

/* Where the kernels library reports what it does not return: a bad disk-cache entry that was
 * removed (and recompiled), a cubin that could not be stored. level is syslog's (4 warning,
 * 6 info); msg is one line without a newline, valid during the call only. Called from whatever
 * thread compiled. Default (fn NULL): warnings as "kernels: <msg>" on stderr, info dropped.
 * Set before other threads use g. */
typedef void (*fa_gpu_log_fn)(void *ctx, int level, const char *msg);
void fa_gpu_set_log(struct fa_gpu *g, fa_gpu_log_fn fn, void *ctx);

/* Counters since fa_gpu_open, for the daemon's STATS. */
struct fa_gpu_cache_stats {
	uint64_t mem_hits;         /* kernel requests served by an already loaded kernel */
	uint64_t disk_loads;       /* kernels loaded from a cubin in the disk cache */
	uint64_t compiled;         /* kernels compiled by NVRTC (disk miss or no disk cache) */
	uint64_t disk_stores;      /* cubins written to the disk cache */
	uint64_t disk_errors;      /* bad entries removed, failed reads and writes (logged) */
	uint64_t kernels;          /* kernels loaded in memory now */
	double compile_ms_total;   /* wall time in NVRTC, all compiles */
	double compile_ms_last;    /* the last compile's */
	char compile_last[96];     /* the last compile's specialisation (fa_kernel_spec_name), or "" */
	bool disk_enabled;         /* a disk cache is in use */
	char disk_dir[256];        /* its "<dir>/kernels" (truncated), or "" */
};

/* A consistent snapshot of the counters. Thread-safe. */
void fa_gpu_cache_stats(const struct fa_gpu *g, struct fa_gpu_cache_stats *out);

/* The launch memo (fa_launch_memo.h): a launch without a caller's tile remembers, per shape
 * (dtype, precision, mask, D, B, Sq, Sk, Hq, Hkv, window, softcap), the tile or decode plan it
 * chose and the loaded kernel, so a repeat shape skips the planner, the tuning table's search
 * and the kernel cache's scan (the checks and the parameter block are every launch's). On by
 * default; FA_LAUNCH_MEMO=0 in the environment at fa_gpu_open, or fa_gpu_set_launch_memo(g,
 * false), plans every launch. The choice is the same either way (tests/unit/test_launch_memo.c);
 * a tuning table's new results or another table make the remembered plans stale. Setting it
 * clears the memo. Thread-safe. */
void fa_gpu_set_launch_memo(struct fa_gpu *g, bool on);
struct fa_gpu_memo_stats {
	bool on;
	uint64_t hits, misses, stale, evictions;
};
void fa_gpu_launch_memo_stats(struct fa_gpu *g, struct fa_gpu_memo_stats *out);

/* ---- helpers for tests and benchmarks (synchronous, on the device's context) ------------- */
fa_status fa_gpu_alloc(struct fa_gpu *g, size_t bytes, CUdeviceptr *p, char *err, size_t errlen);
void fa_gpu_free(struct fa_gpu *g, CUdeviceptr p);
fa_status fa_gpu_upload(struct fa_gpu *g, CUdeviceptr dst, const void *src, size_t bytes,
                        char *err, size_t errlen);
fa_status fa_gpu_download(struct fa_gpu *g, void *dst, CUdeviceptr src, size_t bytes, char *err,
                          size_t errlen);
fa_status fa_gpu_memset8(struct fa_gpu *g, CUdeviceptr dst, uint8_t value, size_t bytes,
                         char *err, size_t errlen);
/* Wait for every queued kernel; reports an asynchronous fault as FA_EDEVICE. */
fa_status fa_gpu_sync(struct fa_gpu *g, char *err, size_t errlen);

/* Device-side timing with CUDA events on stream s. */
struct fa_gpu_timer;
fa_status fa_gpu_timer_start(struct fa_gpu *g, CUstream s, struct fa_gpu_timer **out, char *err,
                             size_t errlen);
/* Record the end, wait for it, and return the elapsed milliseconds; frees the timer. */
fa_status fa_gpu_timer_stop(struct fa_gpu *g, struct fa_gpu_timer *t, CUstream s, float *ms,
                            char *err, size_t errlen);

#endif /* FA_GPU_H */
