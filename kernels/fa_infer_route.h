/* fa_infer_route.h - which kernel serves an inference descriptor (fa_attn_infer.h) on a GPU, and
 * the decode kernel's plan for it: plain C over the host copies of the index tables, no CUDA, so
 * the routing runs (and is tested) without a GPU. planner_infer.c implements it; gpu_infer.c's
 * fa_gpu_attn_infer (fa_gpu_infer.h) launches what it decides.
 */
#ifndef FA_INFER_ROUTE_H
#define FA_INFER_ROUTE_H

#include <stdbool.h>
#include <stdint.h>

#include "fa_attn_infer.h"
#include "fa_planner.h"
#include "fa_settings.h"

/* The longest query count and the longest key count of d's sequences, read from its host tables
 * (d checked: fa_attn_infer_check); dense queries count fwd.Sq each, a contiguous cache its
 * seqlens_k. Either may be 0 (every sequence empty). */
void fa_infer_longest(const struct fa_attn_infer_desc *d, int64_t *sq, int64_t *sk);

/* Whether d takes the split-KV decode kernel: every sequence has at most FA_DECODE_MAX_SQ
 * queries (ks->decode FA_DECODE_AUTO), or ks->decode is FA_DECODE_ALL; never with
 * FA_DECODE_OFF. ks NULL: the defaults. The rest goes to the prefill kernel (fa_gpu_fwd_infer). */
bool fa_infer_decode_wanted(const struct fa_device_model *dev, const struct fa_attn_infer_desc *d,
                            const struct fa_kernel_settings *ks);

/* The decode plan for d on dev: fa_plan_decode over the dense descriptor of the longest sequence
 * (*pd: d->fwd with Sq and Sk the longest, each at least 1), so the grid and the split cover
 * every sequence and the blocks of shorter ones exit early. A ragged batch (key lengths not all
 * equal) gets its split from a cost model over the real lengths instead (planner_infer.c: the
 * longest block against every block's keys over the SMs, plus the merge pass), unless
 * ks->decode_splits forces one. Returns fa_plan_decode's statuses,
 * plus FA_ESHAPE for a batch, head count or length over the kernel's grid (the text says which).
 * Pure, thread-safe. */
fa_status fa_infer_plan_decode(const struct fa_device_model *dev,
                               const struct fa_attn_infer_desc *d,
                               const struct fa_kernel_settings *ks, struct fa_attn_fwd_desc *pd,
                               struct fa_decode_plan *out, char *err, size_t errlen);

#endif /* FA_INFER_ROUTE_H */
