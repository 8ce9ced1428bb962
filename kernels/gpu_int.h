/* gpu_int.h - what the backward launcher (gpu_bwd.c), the inference router (gpu_infer.c) and
 * the inference forward (gpu_fwd_infer.c) use of gpu_cuda.c's device: kernels through the same
 * in-memory and disk caches as the forward's, and the decode launch over an inference layout.
 * Internal to kernels/.
 */
#ifndef FA_GPU_INT_H
#define FA_GPU_INT_H

#include "fa_cu.h"
#include "fa_gpu.h"
#include "fa_planner.h"

/* The functions of one backward module (attn_bwd.cu: pre, main, dq and the fixed-point
 * deterministic dQ's kvs, fa_bwd_kvscale; the wgmma ones: main, and attn_bwd_sm90_tf32.cu's
 * images pass prep), owned by the device's cache (valid until fa_gpu_close); the ones a module
 * lacks are 0. */
struct fa_gpu_bwd_funcs {
	fa_cu_func pre, main, dq, prep, kvs;
};

/* Compile (or load from disk) and load the backward specialisation s (a backward tile path:
 * fa_kpath_is_bwd), with main's dynamic shared-memory attribute raised to s->tile.smem. The
 * device's context must be current. Statuses of the forward's kernel load (FA_EINTERNAL with
 * NVRTC's log, FA_EDEVICE, FA_ENOMEM). Thread-safe. */
fa_status fa_gpu_bwd_kernels(struct fa_gpu *g, const struct fa_kernel_spec *s,
                             struct fa_gpu_bwd_funcs *f, char *err, size_t errlen);

/* One launch of the forward kernel over an inference layout (attn_fwd.cu with FA_LAYOUT): the
 * dense fields of its parameter block from d (strides, head counts, scale; d->Sq and d->Sk the
 * longest sequence's lengths, d->B the sequences), its second parameter (struct fa_lparams:
 * the index tables on the device) as the caller laid it out, and the grid (grid_x query tiles
 * of the longest sequence, Hq, B). */
struct fa_gpu_seq_launch {
	const struct fa_kernel_spec *spec; /* a forward mma.sync spec, layout != FA_KLAYOUT_DENSE */
	const struct fa_attn_fwd_desc *d;
	int64_t kv_shape[3];  /* K's and V's tensor shape before the head dim (packed [1, total_k,
	                       * Hkv], a cache [B, rows, Hkv], pools [pages, page_size, Hkv]): the
	                       * extent the fp32 "bf16" staging converts */
	CUdeviceptr q, k, v, o, lse;
	const void *lparams;  /* struct fa_lparams; borrowed for the call */
	unsigned grid_x;
};

/* Compile or load l->spec, then enqueue it on s: for fp32 with precision bf16 K and V are
 * first staged as bf16 into stream-ordered scratch over l->kv_shape (freed in stream order, as
 * fa_gpu_attn_fwd stages them), keeping their strides where they fill that extent. The
 * device's context must be current. Statuses of fa_gpu_attn_fwd's launch (FA_EINTERNAL with
 * NVRTC's log, FA_EDEVICE, FA_ENOMEM). Thread-safe. */
fa_status fa_gpu_fwd_seq(struct fa_gpu *g, const struct fa_gpu_seq_launch *l, CUstream s,
                         char *err, size_t errlen);

/* The inference layout of a decode launch (attn_decode.cu's fa_dparams tail): the device copies
 * of the index tables (0: none; the caller's, checked, alive until the launch finished), the page
 * table's row length and the pages' size. kv: enum fa_kv_layout, 0 for dense queries and keys. */
struct fa_gpu_decode_layout {
	CUdeviceptr cu_q, cu_k, seqlens_k, page_table;
	int64_t pt_cols;
	int kv, page_size;
};

/* Launch the decode kernels of plan dp (fa_plan_decode for d, whose Sq and Sk are the longest
 * sequence's) over layout lay (NULL: dense, as fa_gpu_attn_fwd), enqueued on s. d is checked by
 * the caller (shapes, alignment); the partials' scratch comes from the device's pool in stream
 * order. Statuses of fa_gpu_attn_fwd's launch (FA_EDEVICE, FA_ENOMEM, FA_EINTERNAL with NVRTC's
 * log). Thread-safe. */
fa_status fa_gpu_decode_launch(struct fa_gpu *g, const struct fa_attn_fwd_desc *d,
                               const struct fa_decode_plan *dp,
                               const struct fa_gpu_decode_layout *lay, CUdeviceptr q,
                               CUdeviceptr k, CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse,
                               CUstream s, char *err, size_t errlen);

#endif /* FA_GPU_INT_H */
