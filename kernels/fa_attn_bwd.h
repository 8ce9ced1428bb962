/* fa_attn_bwd.h - what attention's backward problem is, and its CPU reference.
 *
 * The backward of O = softmax(scale * Q K^T, masked) V given the upstream gradient dO and the
 * forward's O and logsumexp: dQ, dK, dV. The descriptor is the forward's (so every shape, mask and
 * stride rule is the forward's) plus the strides of the four new tensors. Plain C; no CUDA, no I/O.
 *
 * The formulas, FlashAttention-2's, with P recomputed from the forward's lse as the GPU kernels do:
 *   delta_i = sum_x dO_ix O_ix
 *   P_ij    = exp(scale * q_i . k_j - lse_i)          (0 where the mask hides j from i)
 *   dV_j    = sum_i P_ij dO_i
 *   dP_ij   = dO_i . v_j
 *   dS_ij   = P_ij (dP_ij - delta_i)
 *   dQ_i    = scale * sum_j dS_ij k_j
 *   dK_j    = scale * sum_i dS_ij q_i
 * With GQA/MQA, dK and dV of a kv head are summed over every query head of its group. A row that
 * sees no key, or whose lse is -inf (what the forward writes for such a row), contributes nothing:
 * its dQ is 0 and dK, dV do not see it. Keys no row sees get dK = dV = 0.
 *
 * Not checked here, because they are properties of memory, not of the problem: outputs that
 * overlap an input or each other, and lse's shape as a tensor on the wire ([B, Hq, Sq, 1], fp32,
 * required): the client and the daemon check those with common/fa_check.h's rules, as they do for
 * the forward.
 */
#ifndef FA_ATTN_BWD_H
#define FA_ATTN_BWD_H

#include <stddef.h>
#include <stdint.h>

#include "fa_attn.h"

/* A backward problem. fwd describes q, k, v, o and lse exactly as the forward ran (dtype, mask,
 * resolved scale, sizes, strides; precision for the GPU kernels). The new tensors are in fwd.dtype,
 * strides in elements, the head dim contiguous:
 *   dO, dQ: [B, Sq, Hq, D] at (stride[0]*b + stride[1]*s + stride[2]*h + d), like o and q;
 *   dK, dV: [B, Sk, Hkv, D] likewise, like k and v. */
struct fa_attn_bwd_desc {
	struct fa_attn_fwd_desc fwd;
	int64_t do_stride[3];              /* batch, seq, head */
	int64_t dq_stride[3], dk_stride[3], dv_stride[3];
};

/* Check a descriptor's own consistency: fa_attn_fwd_check() on fwd (its statuses and texts), then
 * the strides of do, dq, dk and dv, each >= 0 ("dk head stride is -1: strides must be >= 0").
 * Returns FA_OK, FA_EDTYPE, FA_EINVAL or FA_ESHAPE with the reason in err (may be NULL or errlen
 * 0; truncated, always terminated). Pure; thread-safe. */
fa_status fa_attn_bwd_check(const struct fa_attn_bwd_desc *d, char *err, size_t errlen);

/* The CPU reference (the daemon's CPU backend), with fwd's sliding window and softcap (dS of the
 * capped score times 1 - tanh^2, the derivative of cap tanh(s / cap)): float64 throughout, reading O in fwd.dtype and lse
 * as fp32 [B, Hq, Sq] through fwd.o_stride and fwd.lse_stride, writing dQ, dK, dV in fwd.dtype
 * (rounded once from float64, as fa_store_elem does). Computes the (batch, kv-head) pairs bkv in
 * [bkv_begin, bkv_end) of B*Hkv: the unit that owns a dK/dV slice, so a thread pool can split the
 * work; pass 0 and B*Hkv for all. For each pair, dQ of every query head of its group is written too.
 * Every output is summed in a fixed order (query heads, then rows, then keys, each ascending), so
 * the split and the scratch limit never change a bit. All pointers are borrowed for the call;
 * inputs are only read. Scratch: one allocation per call bounded by
 * fa_attn_fwd_ref_scratch_limit() (shared with the forward; past it keys go in chunks and dQ takes
 * a second pass). Thread-safe: calls on disjoint bkv ranges may run at once.
 * Returns FA_OK; FA_EINVAL (a NULL pointer, lse included: the backward needs the forward's lse; bkv
 * range outside [0, B*Hkv]), the statuses of fa_attn_bwd_check() (it is run first), FA_ENOMEM
 * (scratch allocation failed, or the limit is too small for even one key). On failure the outputs
 * may be partly written. */
fa_status fa_attn_bwd_ref(const struct fa_attn_bwd_desc *d, const void *q, const void *k,
                          const void *v, const void *o, const void *dout, const float *lse,
                          void *dq, void *dk, void *dv, int64_t bkv_begin, int64_t bkv_end);

/* The oracle for tests: like fa_attn_bwd_ref over all of B*Hkv, but O and lse come dense in
 * float64, as fa_attn_fwd_ref64 writes them (o64 [B, Sq, Hq, D], lse64 [B, Hq, Sq]; fwd.o_stride
 * and fwd.lse_stride are not used), and the gradients go out dense in float64: dq64
 * [B, Sq, Hq, D], dk64 and dv64 [B, Sk, Hkv, D]. q, k, v, dout as in the descriptor. The
 * arithmetic is fa_attn_bwd_ref's: fed O and lse converted from theirs, it gives the values that
 * fa_attn_bwd_ref rounds. Returns the statuses of fa_attn_bwd_ref. */
fa_status fa_attn_bwd_ref64(const struct fa_attn_bwd_desc *d, const void *q, const void *k,
                            const void *v, const double *o64, const void *dout,
                            const double *lse64, double *dq64, double *dk64, double *dv64);

#endif /* FA_ATTN_BWD_H */
