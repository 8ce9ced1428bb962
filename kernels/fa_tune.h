/* fa_tune.h - the autotuner: the planner's candidates timed on the real GPU, the winner per
 * specialisation class kept in a persistent tuning table, the heuristic serving until then.
 *
 * Three parts (kernels/README.md, "Tuning", says more):
 *   tune_cache.c  the table: class key -> winning tile, its time, the runner-up; loaded from and
 *                 saved to "<dir>/tuning/<uuid>.tune" (text, one entry a line, a checksum per
 *                 line); the header names the GPU UUID, the driver version and the SHA-256 of
 *                 the kernel source: any mismatch and the table starts empty.
 *   tuner.c       the tuning of one class in small steps (fa_tuner_step) through a timing
 *                 callback (tests pass a fake one), and fa_tune_pick: the tile to launch.
 *   tune_gpu.c    the real timing callback (CUDA events, scratch buffers of random data).
 *
 * Plain C; nothing here needs a GPU except the callbacks of tune_gpu.c.
 */
#ifndef FA_TUNE_H
#define FA_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_attn.h"
#include "fa_planner.h"

#define FA_TUNE_FORMAT 1               /* bump when the file layout or the key changes */
#define FA_TUNE_DEFAULT_MAX_ENTRIES 4096
#define FA_TUNE_DEFAULT_CANDIDATES 16   /* the planner's best N are timed */
#define FA_TUNE_DEFAULT_RUNS 5          /* timed runs per candidate (median), after 1 warm-up */

/* Whose results a table holds: a table is only valid for this GPU, this driver and this kernel
 * source (the SHA-256 of the kernel sources, their shared header and FA_NVRTC_EXTRA). ks: the
 * kernel settings the table's planner calls use (fa_tune_pick, fa_tuner_start); of them only
 * FA_NVRTC_EXTRA changes the kernels, so only it enters src_hash. */
struct fa_tune_ident {
	uint8_t uuid[16];
	int driver;          /* cuDriverGetVersion, e.g. 13000 */
	uint8_t src_hash[32];
	struct fa_kernel_settings ks;
};

/* The hash of the kernel source as ks compiles it (attn_fwd.cu, attn_fwd_sm90.cu, fa_device.cuh
 * and ks->nvrtc_extra; ks NULL: the defaults). */
void fa_tune_src_hash(const struct fa_kernel_settings *ks, uint8_t out[32]);
/* An identity from a UUID, a driver version and the settings (copied; NULL: the defaults), with
 * fa_tune_src_hash. */
void fa_tune_ident_make(struct fa_tune_ident *id, const uint8_t uuid[16], int driver,
                        const struct fa_kernel_settings *ks);

/* The specialisation class a problem belongs to. Sequence lengths go in log2 buckets: bucket b
 * holds lengths in (2^(b-1), 2^b] (b = 0 holds 1); the GQA ratio Hq/Hkv likewise (floor). */
struct fa_tune_key {
	fa_dtype dtype;
	fa_precision precision; /* resolved (fa_prec_resolve) */
	int D;
	fa_mask mask;
	int sq_log2, sk_log2, gqa_log2;
};
void fa_tune_key_make(const struct fa_attn_fwd_desc *d, struct fa_tune_key *k);
bool fa_tune_key_equal(const struct fa_tune_key *a, const struct fa_tune_key *b);
/* "bf16 d128 none sq2^12 sk2^12 gqa1" into buf. */
void fa_tune_key_format(const struct fa_tune_key *k, char *buf, size_t len);

/* A representative problem of a class, to tune on: Sq = 2^sq_log2, Sk = 2^sk_log2, Hkv = 8 /
 * (GQA ratio) rounded up to 1 with Hq = Hkv * ratio, B so that B * Sq is about 16384 (at least
 * 1, at most 64), dense BSHD strides, scale 1/sqrt(D). */
void fa_tune_key_desc(const struct fa_tune_key *k, struct fa_attn_fwd_desc *d);

/* One tuned class. */
struct fa_tune_entry {
	struct fa_tune_key key;
	struct fa_tile best;     /* path, nw, rt, br, bc, stages (the rest is recomputed on use) */
	double best_us;          /* median of the timed runs */
	struct fa_tile second;   /* the runner-up; second_us 0 when there was only one candidate */
	double second_us;
	struct fa_tile heur;     /* the planner's first choice for the tuning shape, and its time */
	double heur_us;
	int candidates, runs;
	int64_t when;            /* time(NULL) when it was tuned */
};

/* Counters of a table since it was opened. */
struct fa_tune_stats {
	int entries;
	int loaded;         /* entries read from the file at open */
	int corrupt;        /* lines skipped at open (bad checksum, syntax, values) */
	bool stale;         /* the file was for another GPU / driver / source / format: ignored */
	uint64_t hits;      /* fa_tune_pick served a tuned tile */
	uint64_t misses;    /* ... the heuristic (class not tuned) */
	uint64_t unfit;     /* ... the heuristic because the tuned tile does not fit the device */
	uint64_t evicted;   /* entries dropped to stay within the bound */
	char why[160];      /* why the file was ignored or not read, "" when it was fine or absent */
};

struct fa_tune_table;

/* Open a table for device `model` (copied) and identity `id`. dir: the daemon's cache dir (the
 * file is "<dir>/tuning/<32 hex of the UUID>.tune"; directories are created 0750), or NULL for
 * a table in memory only. The file is read when present: entries of another identity are never
 * used (stats.stale, stats.why), bad lines are skipped and counted (stats.corrupt). max_entries
 * 0: FA_TUNE_DEFAULT_MAX_ENTRIES. Returns FA_OK (an unreadable or stale file is not an error:
 * the table starts empty), FA_EINVAL, FA_ENOMEM, FA_ESYS / FA_EPERM (the directory cannot be
 * created or is world-writable; err says which; *out is NULL). Thread-safe afterwards. */
fa_status fa_tune_table_open(struct fa_tune_table **out, const char *dir,
                             const struct fa_tune_ident *id, const struct fa_device_model *model,
                             int max_entries, char *err, size_t errlen);
void fa_tune_table_close(struct fa_tune_table *t);
/* The file's path ("" for a table in memory). */
const char *fa_tune_table_path(const struct fa_tune_table *t);
const struct fa_device_model *fa_tune_table_model(const struct fa_tune_table *t);
/* The settings of the table's identity (what its planner calls use). */
const struct fa_kernel_settings *fa_tune_table_settings(const struct fa_tune_table *t);

/* The entry of a class: true and *e filled when tuned. */
bool fa_tune_table_get(struct fa_tune_table *t, const struct fa_tune_key *k,
                       struct fa_tune_entry *e);
/* Insert or replace the entry of e->key (in memory; fa_tune_table_save writes). When the table
 * is full the entry tuned longest ago is evicted. */
fa_status fa_tune_table_put(struct fa_tune_table *t, const struct fa_tune_entry *e);

/* Write the table atomically (temporary file, fsync, rename, directory fsync) under an flock of
 * "<dir>/tuning/.lock": entries another writer (another daemon, fa-ctl tune) saved meanwhile for
 * the same identity are merged in first (the newer of two entries of a class wins), so writers
 * never lose each other's results and readers only see whole files. FA_OK (also for a table in
 * memory), FA_ESYS with err. */
fa_status fa_tune_table_save(struct fa_tune_table *t, char *err, size_t errlen);

void fa_tune_table_stats(struct fa_tune_table *t, struct fa_tune_stats *out);

/* Untuned classes that fa_tune_pick met (at most 64 remembered, each once): the daemon tunes
 * them when the GPU is idle. true and *k filled with the oldest one, which is removed. */
bool fa_tune_table_next_wanted(struct fa_tune_table *t, struct fa_tune_key *k);

/* Where a picked tile came from. */
enum fa_tune_src {
	FA_TUNE_SRC_TUNED = 1,     /* the table's winner for this class */
	FA_TUNE_SRC_HEURISTIC = 2, /* the class is not tuned: the planner's first choice */
	FA_TUNE_SRC_UNFIT = 3,     /* tuned, but that tile does not fit this device/shape: heuristic */
};
const char *fa_tune_src_name(enum fa_tune_src s);

/* A pick of class k counted as fa_tune_pick counts it (src an enum fa_tune_src: hits, unfit,
 * misses; a miss remembers k for fa_tune_table_next_wanted): the launch memo's hits count as the
 * picks they replace. */
void fa_tune_table_note(struct fa_tune_table *t, const struct fa_tune_key *k, int src);
/* A number that grows whenever an entry is added or replaced (put, open, a save's merge): plans
 * chosen under the table remember it and are stale once it moved (fa_launch_memo.h). */
uint64_t fa_tune_table_generation(const struct fa_tune_table *t);

/* The tile to launch for d: the tuned one when the class is tuned and the tile is still one of
 * the planner's fitting candidates on the table's device, else the planner's first choice.
 * t NULL: the heuristic with the default settings (model must then be given; with a table, model
 * may be NULL, and the table's settings are used). The tile's
 * smem, regs and score are the planner's. *src (may be NULL) says which. A class not tuned is
 * remembered for fa_tune_table_next_wanted. Returns fa_plan's statuses. */
fa_status fa_tune_pick(struct fa_tune_table *t, const struct fa_device_model *model,
                       const struct fa_attn_fwd_desc *d, struct fa_tile *tile,
                       enum fa_tune_src *src, char *err, size_t errlen);

/* ---- tuning ------------------------------------------------------------------------------- */

/* What the tuner needs from the device. ctx is the callbacks' own. */
struct fa_tune_ops {
	void *ctx;
	/* Optional: compile / load the kernel of (d, tile) (fa_gpu_prepare). Runs as a step unit of
	 * its own; may take seconds (NVRTC) unless the disk cache has it. */
	fa_status (*prepare)(void *ctx, const struct fa_attn_fwd_desc *d, const struct fa_tile *tile,
	                     char *err, size_t errlen);
	/* Run (d, tile) once on representative data and return its device time in *us. */
	fa_status (*time)(void *ctx, const struct fa_attn_fwd_desc *d, const struct fa_tile *tile,
	                  double *us, char *err, size_t errlen);
	/* Optional: the tuner is done (or freed): release scratch buffers. */
	void (*finish)(void *ctx);
	/* Optional: a monotonic clock in microseconds for the step budget (default CLOCK_MONOTONIC;
	 * tests pass the fake timer's clock). */
	uint64_t (*now_us)(void *ctx);
};

struct fa_tune_opts {
	int candidates; /* 0: FA_TUNE_DEFAULT_CANDIDATES */
	int runs;       /* 0: FA_TUNE_DEFAULT_RUNS; the median is kept */
	/* a candidate whose warm-up run is slower than prune x the best median so far is not run
	 * again (it cannot win); 0: 1.5; < 1: never prune */
	double prune;
};

struct fa_tuner;

/* Prepare to tune d's class on table t's device with the planner's best candidates (the
 * heuristic pick is always one of them). Nothing is run yet. FA_ENOFIT / FA_EINVAL from the
 * planner, FA_ENOMEM. */
fa_status fa_tuner_start(struct fa_tuner **out, struct fa_tune_table *t,
                         const struct fa_attn_fwd_desc *d, const struct fa_tune_ops *ops,
                         const struct fa_tune_opts *opts, char *err, size_t errlen);

/* Do tuning work for about budget_us microseconds: units of work (one prepare, or one run of
 * one candidate) are started while less than budget_us has passed since the call began, and at
 * least one unit is done per call. So a step takes less than budget_us + the longest unit: the
 * GPU worker that interleaves steps with client jobs delays a client by at most that (one run
 * of the slowest candidate kept: the pruning above bounds a candidate to one run once it is
 * known to be slow). When the last unit is done the winner is put into the table (not saved:
 * call fa_tune_table_save) and *done is true. A unit that fails drops that candidate (the error
 * is kept, fa_tuner_result's fails); if every candidate failed, the step returns the last
 * error with *done true and nothing is stored. */
fa_status fa_tuner_step(struct fa_tuner *tu, uint64_t budget_us, bool *done, char *err,
                        size_t errlen);

/* The outcome (valid once done): the entry stored. false if nothing was stored. */
bool fa_tuner_result(const struct fa_tuner *tu, struct fa_tune_entry *e, int *fails);
/* Progress: units done and the total (an upper bound; pruning skips some). */
void fa_tuner_progress(const struct fa_tuner *tu, int *units_done, int *units_total);
void fa_tuner_free(struct fa_tuner *tu);

/* Tune one class to the end (steps without a budget); the entry in *e (may be NULL). */
fa_status fa_tune_key(struct fa_tune_table *t, const struct fa_attn_fwd_desc *d,
                      const struct fa_tune_ops *ops, const struct fa_tune_opts *opts,
                      struct fa_tune_entry *e, char *err, size_t errlen);

/* ---- the real GPU (tune_gpu.c) ------------------------------------------------------------ */
struct fa_gpu;
/* Fill ops with callbacks that time fa_gpu_attn_fwd_tile on g (stream 0, CUDA events) on
 * scratch buffers of the tuning shape filled with random values in [-1, 1) (allocated on first
 * use, freed by ops->finish / fa_tune_gpu_ops_fini). */
fa_status fa_tune_gpu_ops_init(struct fa_tune_ops *ops, struct fa_gpu *g, char *err,
                               size_t errlen);
void fa_tune_gpu_ops_fini(struct fa_tune_ops *ops);
/* The identity of g now (UUID, driver version, source hash, the settings g was opened with). */
void fa_tune_gpu_ident(struct fa_gpu *g, struct fa_tune_ident *id);

#endif /* FA_TUNE_H */
