/* fa_gpu_infer.h - the inference shapes of fa_attn_infer.h on a GPU: variable-length batches,
 * a contiguous KV cache with per-sequence lengths, and a paged KV cache.
 *
 * The index tensors reach the kernels as device copies the caller owns (struct
 * fa_gpu_infer_index): the daemon copies the client's tables to the host, checks that copy with
 * fa_attn_infer_check(), and uploads the checked copy to a buffer of its own, so the kernels
 * never read memory a client can still rewrite. d's own index pointers are the host copies:
 * the launch code reads them for planning (lengths, splits) and never dereferences ix on the
 * host.
 *
 * Two layers:
 *   fa_gpu_attn_infer  the entry the daemon and tests call (kernels/gpu_infer.c): decode shapes
 *                      (every sequence's query count <= FA_DECODE_MAX_SQ) to the split-KV decode
 *                      kernel, everything else to fa_gpu_fwd_infer;
 *   fa_gpu_fwd_infer   the prefill kernel over the same layouts (kernels/gpu_fwd_infer.c),
 *                      planned by fa_plan_fwd_infer (also `fa-ctl plan --prefill`).
 */
#ifndef FA_GPU_INFER_H
#define FA_GPU_INFER_H

#include "fa_attn_infer.h"
#include "fa_gpu.h"

/* Device copies of d's index arrays, dense int32 in the same layout as the host copies
 * (cu_q [B + 1], cu_k [B + 1], seqlens_k [B], page_table [B][pt_cols]); 0 where d has none. */
struct fa_gpu_infer_index {
	CUdeviceptr cu_q, cu_k, seqlens_k, page_table;
};

/* Inference attention on the device, enqueued on stream s. d: checked (fa_attn_infer_check)
 * with its index pointers on the host; ix: the same tables on the device. q, k, v, o, lse as
 * fa_gpu_attn_fwd's, laid out as fa_attn_infer.h says (lse 0: not wanted). Rows of q and o
 * outside every sequence are neither read nor written. Same requirements and statuses as
 * fa_gpu_attn_fwd (FA_EALIGN, FA_ESHAPE, FA_ENOFIT with the planner's text, FA_EDEVICE); every
 * mask, the sliding window and softcap of d->fwd are served, applied per sequence
 * (fa_attn_key_range with each sequence's lengths) on both kernels. Returns after enqueueing. */
fa_status fa_gpu_attn_infer(struct fa_gpu *g, const struct fa_attn_infer_desc *d,
                            const struct fa_gpu_infer_index *ix, CUdeviceptr q, CUdeviceptr k,
                            CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                            char *err, size_t errlen);

/* The prefill path of fa_gpu_attn_infer (any query counts), same contract. */
fa_status fa_gpu_fwd_infer(struct fa_gpu *g, const struct fa_attn_infer_desc *d,
                           const struct fa_gpu_infer_index *ix, CUdeviceptr q, CUdeviceptr k,
                           CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                           char *err, size_t errlen);

/* The tile and specialisation fa_gpu_fwd_infer launches for the longest sequence (Sq x Sk) of
 * a batch described by d (its B, heads, dtype, precision, mask, head dim) on dev with layout
 * (FA_KLAYOUT_SEQ or FA_KLAYOUT_PAGED): the planner's first mma.sync candidate (ks with the
 * wgmma paths off); for a paged cache the first whose estimate leaves registers for the page
 * lookups (the 255-register tiles and fp32's 128-key tiles spill with them: test_nvrtc_infer).
 * spec->tile.smem includes the layout's shared memory; spec->window and spec->softcap as d asks
 * (fa_kernel_spec_mask_ext at Sq x Sk: a window that bounds nothing there bounds no sequence).
 * ks borrowed (NULL: defaults).
 * FA_OK, the planner's statuses and text (FA_EINVAL, FA_ENOFIT). Pure, thread-safe. */
fa_status fa_plan_fwd_infer(const struct fa_device_model *dev, const struct fa_kernel_settings *ks,
                            const struct fa_attn_fwd_desc *d, int64_t Sq, int64_t Sk, int layout,
                            struct fa_kernel_spec *spec, char *err, size_t errlen);

#endif /* FA_GPU_INFER_H */
