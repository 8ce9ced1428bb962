/* fa_gpu_bwd.h - the backward pass on a GPU: the launch API the daemon's GPU backend calls.
 *
 * The problem is fa_attn_bwd.h's (the forward's descriptor plus the gradients' strides); the
 * device, its kernel cache and its settings are fa_gpu.h's. The kernels are NVRTC-compiled like
 * the forward's: a preprocess delta = rowsum(dO * O), the main pass parallel over K/V blocks
 * (P recomputed from Q, K and the forward's lse; dK, dV on chip; dQ accumulated in fp32), and a
 * pass converting dQ to its dtype.
 */
#ifndef FA_GPU_BWD_H
#define FA_GPU_BWD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_attn_bwd.h"
#include "fa_gpu.h"

/* The device pointers of one backward problem, each laid out as the descriptor says. lse is the
 * forward's fp32 [B, Hq, Sq] by d->fwd.lse_stride (required). */
struct fa_gpu_bwd_ptrs {
	CUdeviceptr q, k, v, o, dout, lse; /* inputs, only read */
	CUdeviceptr dq, dk, dv;            /* outputs, fully written */
};

/* Flags of fa_gpu_attn_bwd. */
enum {
	/* dQ summed in a fixed order (no atomics): the same bits on every run, for the same inputs,
	 * device and kernel settings. Without it dQ is accumulated with fp32 atomics. */
	FA_GPU_BWD_DETERMINISTIC = 1u << 0,
	/* Compile and load the kernels the call would launch (every pass), enqueue nothing: for a
	 * caller that must not load a module later, once its stream may wait on another process
	 * (loading a module can need the whole context idle: the daemon's asynchronous mode). The
	 * pointers are checked as for a launch; s is not used. */
	FA_GPU_BWD_PREPARE = 1u << 1,
};

/* Backward attention on the device, enqueued on stream s (0: the legacy default stream).
 * Every mask, sliding window and softcap of the descriptor (the forward's, whose lse it reads).
 * Requirements beyond fa_attn_bwd_check(): those of fa_gpu_attn_fwd (16-byte alignment of every
 * pointer and of every batch/seq/head stride in bytes: FA_EALIGN; dimensions below 2^31:
 * FA_ESHAPE) and a backward tile that fits the device (FA_ENOFIT with the backward planner's text:
 * the shape, the smallest configuration's bytes and the device's limit). The fp32 scratch it needs
 * (lse2, delta, the dQ accumulator) comes from the device's stream-ordered memory pool, which
 * keeps and reuses it across calls (FA_ENOMEM with the bytes when it cannot be had); calls on
 * different streams never share it.
 * Compiles its specialisations on first use (cached in memory and on disk like the forward's).
 * Returns after enqueueing: synchronise s before reading dQ, dK, dV. FA_EDEVICE with the driver's
 * text on a launch failure. */
fa_status fa_gpu_attn_bwd(struct fa_gpu *g, const struct fa_attn_bwd_desc *d,
                          const struct fa_gpu_bwd_ptrs *p, unsigned flags, CUstream s, char *err,
                          size_t errlen);

/* The same with an explicit backward tile (one of fa_gpu_plan_bwd's candidates; FA_EINVAL for a
 * tile that is not a backward one or whose warp layout does not divide the head dim): for
 * benchmarks and tests. tile NULL: fa_gpu_attn_bwd. */
fa_status fa_gpu_attn_bwd_tile(struct fa_gpu *g, const struct fa_attn_bwd_desc *d,
                               const struct fa_tile *tile, const struct fa_gpu_bwd_ptrs *p,
                               unsigned flags, CUstream s, char *err, size_t errlen);

/* The backward planner's ranked candidates for d on this device (fa_plan_bwd with the device's
 * model and settings); the first is fa_gpu_attn_bwd's choice. */
fa_status fa_gpu_plan_bwd(struct fa_gpu *g, const struct fa_attn_bwd_desc *d, struct fa_tile *out,
                          int max, int *n, char *err, size_t errlen);

#endif /* FA_GPU_BWD_H */
