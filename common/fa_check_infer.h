/* fa_check_infer.h - the request rules of the inference calls (ATTN_VARLEN, ATTN_KVCACHE), written
 * once for the client library (before anything is sent) and the daemon (daemon/validate_infer.c):
 * the shapes of the tensors and of the int32 index tensors agree. The index tensors' values are
 * the daemon's to check (kernels/fa_attn_infer.h's fa_attn_infer_check, on its own copy). Texts go
 * back to clients verbatim, as fa_check.h's. Pure functions, thread-safe, no allocation.
 */
#ifndef FA_CHECK_INFER_H
#define FA_CHECK_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "fa_types.h"

/* One index tensor's sizes (each >= 1: FA_ESHAPE), strides (>= 0: FA_EINVAL), its byte offset
 * a multiple of 4 (FA_EALIGN) and [offset, offset + extent) inside region_size bytes (FA_ERANGE;
 * region_size 0 skips that check). */
fa_status fa_check_index(const char *name, uint64_t offset, const int64_t shape[2],
                         const int64_t stride[2], uint64_t region_size, char *err, size_t errlen);

/* ATTN_VARLEN: q [1, total_q, Hq, D], k [1, total_k, Hkv, D], v as k, o as q, Hq a multiple of
 * Hkv, lse (NULL: none) [1, Hq, total_q, 1]; cu_q and cu_k [B + 1, 1] with one B >= 1. Each
 * tensor's own sizes are checked already. FA_OK or FA_ESHAPE. */
fa_status fa_check_varlen_shapes(const int64_t q[4], const int64_t k[4], const int64_t v[4],
                                 const int64_t o[4], const int64_t *lse, const int64_t cu_q[2],
                                 const int64_t cu_k[2], char *err, size_t errlen);

/* ATTN_KVCACHE: cache_len [B, 1]; k a cache [B, rows, Hkv, D], or with page_table (NULL: none)
 * [B, pages per sequence] pools [pages, page_size, Hkv, D] with page_size in [16, 256]; v as k;
 * queries dense q [B, Sq, Hq, D] (lse [B, Hq, Sq, 1]) or, with cu_q (NULL: none) [B + 1, 1],
 * packed q [1, total_q, Hq, D] (lse [1, Hq, total_q, 1]); o as q, D as q's, Hq a multiple of
 * Hkv. FA_OK or FA_ESHAPE. */
fa_status fa_check_kvcache_shapes(const int64_t q[4], const int64_t k[4], const int64_t v[4],
                                  const int64_t o[4], const int64_t *lse,
                                  const int64_t cache_len[2], const int64_t *page_table,
                                  const int64_t *cu_q, char *err, size_t errlen);

/* The window and softcap of any forward-type call: softcap finite and >= 0 (window values are
 * all valid). FA_OK or FA_EINVAL. */
fa_status fa_check_softcap(double softcap, char *err, size_t errlen);

#endif /* FA_CHECK_INFER_H */
