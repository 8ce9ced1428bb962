/* fa_launch_memo.h - what a repeat launch of the same shape reuses (launch_memo.c): the tile or
 * decode plan fa_gpu_attn_fwd chose, the specialisation and its loaded kernel, keyed by the
 * descriptor fields the choice depends on, so a repeat shape does no planning, no tuning-table
 * search and no kernel-cache scan.
 *
 * The key is every field the planners (fa_plan through fa_plan_req_from_desc, fa_plan_decode,
 * fa_decode_wanted), the tuning key (fa_tune_key_make) and the specialisation
 * (fa_kernel_spec_make, fa_kernel_spec_mask_ext) read: dtype, precision, mask, D, B, Sq, Sk, Hq,
 * Hkv, the window and softcap. Strides, scale and pointers are not in it: they change only the
 * parameter block, which every launch fills afresh, and the checks, which every launch runs.
 *
 * An entry is valid for one tuning table in one state: each stores the table it was chosen under
 * and that table's generation (fa_tune_table_generation), and a lookup under another table or a
 * newer generation misses. fa_launch_memo_clear drops everything (the kernel cache's entries the
 * plans point to are gone, or the memo was switched off and on). Thread-safe: a mutex, held for
 * a hash probe of a few slots. Plain C, no CUDA: tests/unit/test_launch_memo.c. */
#ifndef FA_LAUNCH_MEMO_H
#define FA_LAUNCH_MEMO_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "fa_attn.h"
#include "fa_gpu.h"
#include "fa_planner.h"
#include "fa_tune.h"

/* The fields of a descriptor the launch's choices depend on (zero padding: compared whole). */
struct fa_launch_key {
	int32_t dtype, precision, mask, window;
	int64_t D, B, Sq, Sk, Hq, Hkv;
	int64_t window_left, window_right; /* 0 when window is false (then they choose nothing) */
	uint64_t softcap_bits;             /* the double's bits: -0.0 and 0.0 are both "off" */
};

void fa_launch_key_make(const struct fa_attn_fwd_desc *d, struct fa_launch_key *k);
bool fa_launch_key_equal(const struct fa_launch_key *a, const struct fa_launch_key *b);

/* What a launch of the key's shape chose. */
struct fa_launch_plan {
	bool decode;              /* the split-KV decode path: dp is its plan, spec of dp.tile */
	struct fa_decode_plan dp;
	struct fa_kernel_spec spec; /* the specialisation (its tile: choose_tile's, or dp.tile) */
	void *kernel;             /* gpu_cuda.c's kernel-cache entry, loaded, attributes set */
	/* The tuning table's pick, to count again on a hit (fa_tune_table_note) so the table's
	 * hits, misses and wanted list read as they did without the memo; tuned false: no table. */
	bool tuned;
	int tune_src;             /* enum fa_tune_src */
	struct fa_tune_key tune_key;
};

/* The plan fa_gpu_attn_fwd_tile launches d with on a device of `model` with settings ks (kernel
 * not loaded: kernel NULL): the caller's tile (decode paths: fa_plan_decode with it), else the
 * decode plan where fa_decode_wanted, else tt's pick (fa_tune_pick, counted in tt; the tune
 * fields say how) or without a table the planner's first choice. FA_ENOFIT when the tile needs
 * more shared memory than the device allows; the planners' statuses. */
fa_status fa_launch_plan_make(const struct fa_device_model *model,
                              const struct fa_kernel_settings *ks, struct fa_tune_table *tt,
                              const struct fa_attn_fwd_desc *d, const struct fa_tile *tile,
                              struct fa_launch_plan *pl, char *err, size_t errlen);

#define FA_LAUNCH_MEMO_SETS 64 /* x FA_LAUNCH_MEMO_WAYS shapes remembered */
#define FA_LAUNCH_MEMO_WAYS 4

struct fa_launch_memo_slot {
	bool used;
	struct fa_launch_key key;
	const struct fa_tune_table *table; /* the table the plan was chosen under (NULL: none) */
	uint64_t table_gen;
	uint64_t last;                     /* the memo's clock at the last hit or put: LRU */
	struct fa_launch_plan plan;
};

struct fa_launch_memo_stats {
	uint64_t hits, misses, stale; /* stale: a key found but chosen under another table state */
	uint64_t evictions, clears;
};

struct fa_launch_memo {
	pthread_mutex_t lock;
	uint64_t clock;
	struct fa_launch_memo_slot slot[FA_LAUNCH_MEMO_SETS][FA_LAUNCH_MEMO_WAYS];
	struct fa_launch_memo_stats st;
};

void fa_launch_memo_init(struct fa_launch_memo *m);
void fa_launch_memo_destroy(struct fa_launch_memo *m);
/* The plan of k chosen under table (NULL: the planner's heuristic) at generation gen: true and
 * *out filled, else false (a miss; the caller plans and puts). */
bool fa_launch_memo_get(struct fa_launch_memo *m, const struct fa_launch_key *k,
                        const struct fa_tune_table *table, uint64_t gen,
                        struct fa_launch_plan *out);
/* fa_launch_memo_get for a query (fa_gpu_kernel_lookup): the same answer, nothing counted and
 * the LRU order unchanged. */
bool fa_launch_memo_peek(struct fa_launch_memo *m, const struct fa_launch_key *k,
                         const struct fa_tune_table *table, uint64_t gen,
                         struct fa_launch_plan *out);
/* Remember plan for k (replacing k's entry, else the set's least recently used one). */
void fa_launch_memo_put(struct fa_launch_memo *m, const struct fa_launch_key *k,
                        const struct fa_tune_table *table, uint64_t gen,
                        const struct fa_launch_plan *plan);
void fa_launch_memo_clear(struct fa_launch_memo *m);
void fa_launch_memo_stats(struct fa_launch_memo *m, struct fa_launch_memo_stats *out);

#endif
