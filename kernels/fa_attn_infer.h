/* fa_attn_infer.h - the inference shapes of forward attention: variable-length batches (packed
 * sequences with cumulative offsets, FlashAttention's flash_attn_varlen_func) and a KV cache,
 * contiguous or paged (flash_attn_with_kvcache, vLLM's block tables), with every mask, the
 * sliding window and softcap of struct fa_attn_fwd_desc applied per sequence.
 *
 * One descriptor, struct fa_attn_infer_desc, shared by the CPU reference (attn_infer_ref.c), the
 * daemon's validation (daemon/validate_infer.c) and its CPU backend, so all agree on what a
 * sequence is. The index tensors (offsets, cache lengths, page table) are plain dense int32
 * arrays here, owned by the caller: the daemon copies them out of the client's region once,
 * checks the copy, and computes from the copy (a client could rewrite its shared memory between
 * a check and a read). Plain C; no CUDA, no I/O.
 */
#ifndef FA_ATTN_INFER_H
#define FA_ATTN_INFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_attn.h"

/* The page sizes a paged cache may have, in tokens (FlashAttention 2 wants multiples of 256;
 * vLLM uses 16 and up): any size in [16, 256]. */
#define FA_PAGE_SIZE_MIN 16
#define FA_PAGE_SIZE_MAX 256

/* How the keys of a batch are laid out. */
enum fa_kv_layout {
	FA_KV_PACKED = 1, /* varlen: K, V [1, total_k, Hkv, D]; sequence b's keys are rows
	                   * [cu_k[b], cu_k[b + 1]) */
	FA_KV_CACHE = 2,  /* K, V [B, Sk, Hkv, D]; sequence b's keys are its first seqlens_k[b] rows */
	FA_KV_PAGED = 3,  /* K, V pools [pages, page_size, Hkv, D]; key j of sequence b is row
	                   * j % page_size of page page_table[b * pt_cols + j / page_size] */
};

/* A batch of B sequences. fwd gives dtype, precision, mask, scale (resolved), window, softcap, Hq,
 * Hkv, D and the strides of q, k, v, o and lse; fwd.B is the number of sequences, fwd.Sq and
 * fwd.Sk the largest query and key lengths (bounds that every sequence is checked against;
 * fwd.Sq is every sequence's query count when queries are dense). For a paged cache k_stride[0]
 * and v_stride[0] step from page to page and [1] from row to row inside a page. Masks and the
 * window apply to each sequence with its own lengths: causal aligns a sequence's last query with
 * its last key (bottom-right, as FlashAttention aligns it to the cache length) unless the mask is
 * top-left.
 * Queries: cu_q NULL: dense, q and o [B, Sq, Hq, D], lse [B, Hq, Sq]; else packed, q and o
 * [1, total_q, Hq, D] with sequence b's queries rows [cu_q[b], cu_q[b + 1]), lse [1, Hq, total_q]
 * (batch stride unused). Rows outside every sequence are neither read nor written. */
struct fa_attn_infer_desc {
	struct fa_attn_fwd_desc fwd;
	const int32_t *cu_q;        /* [B + 1] or NULL (dense queries); borrowed */
	int64_t total_q;            /* packed: rows of q and o */
	enum fa_kv_layout kv;
	const int32_t *cu_k;        /* FA_KV_PACKED: [B + 1]; borrowed */
	int64_t total_k;            /* FA_KV_PACKED: rows of k and v */
	const int32_t *seqlens_k;   /* FA_KV_CACHE, FA_KV_PAGED: [B] keys of each sequence */
	int64_t cache_rows;         /* FA_KV_CACHE: rows of k and v per sequence (shape[1]) */
	const int32_t *page_table;  /* FA_KV_PAGED: [B][pt_cols]; only the entries of pages a
	                             * sequence uses are read, so padding may hold anything */
	int64_t pt_cols;            /* FA_KV_PAGED: pages per sequence at most */
	int64_t pages, page_size;   /* FA_KV_PAGED: the pools' shape[0] and shape[1] */
};

/* Check a descriptor: fwd's own rules (fa_attn_fwd_check), the layout fields, then every index
 * entry before anything reads K or V through it: offsets start at >= 0, never decrease, end
 * within total_q / total_k, each sequence within fwd.Sq / fwd.Sk; cache lengths in [0, fwd.Sk]
 * and within what the cache holds (cache_rows, or pt_cols pages of page_size); each used page
 * index in [0, pages). The detail names the entry ("page_table[3][7] = 912: the pools have 512
 * pages"). Returns FA_OK, the statuses of fa_attn_fwd_check(), FA_EINVAL (an index entry, a
 * NULL array) or FA_ESHAPE (a layout size). */
fa_status fa_attn_infer_check(const struct fa_attn_infer_desc *d, char *err, size_t errlen);

/* Query and key counts of sequence b (d checked already). */
void fa_attn_infer_lengths(const struct fa_attn_infer_desc *d, int64_t b, int64_t *sq,
                           int64_t *sk);

/* The CPU reference over the (sequence, query-head) pairs [unit_begin, unit_end) of B*Hq: each
 * sequence is the dense problem of its own lengths (fa_attn_fwd_ref's float64 arithmetic), its
 * keys read through the layout. O in the dtype, lse (NULL: not wanted) in fp32. A row that sees
 * no key (a sequence without keys, masked rows) gets O = 0 and lse = -inf. Scratch as
 * fa_attn_fwd_ref's, per sequence. Thread-safe on disjoint unit ranges.
 * Returns FA_OK, FA_EINVAL (NULL pointer, range outside [0, B*Hq]), the statuses of
 * fa_attn_infer_check() (run first), FA_ENOMEM. On failure O and lse may be partly written. */
fa_status fa_attn_infer_ref(const struct fa_attn_infer_desc *d, const void *q, const void *k,
                            const void *v, void *o, float *lse, int64_t unit_begin,
                            int64_t unit_end);

/* The float64 oracle: o64 dense [rows, Hq, D] and lse64 (NULL: not wanted) dense [Hq, rows] for
 * packed queries (rows = total_q) or [B, Hq, Sq] for dense ones (then rows = B * Sq). Rows of no
 * sequence are left as they are. Returns the statuses of fa_attn_infer_ref(). */
fa_status fa_attn_infer_ref64(const struct fa_attn_infer_desc *d, const void *q, const void *k,
                              const void *v, double *o64, double *lse64);

#endif /* FA_ATTN_INFER_H */
