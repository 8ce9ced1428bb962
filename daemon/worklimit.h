/* worklimit.h - how much work a forward (or backward) request is, and the per-request limit on it.
 *
 * A request's work is counted as the kernels do it: 4 * B * Hq * D FLOPs per (query, key) pair
 * the mask leaves visible (a causal mask counts only the pairs computed, about half). Strides
 * may be 0, so a request of a few bytes can ask for any amount of work (issue 14: Sq = Sk = 2^20
 * in 237 bytes); the limit is what stops it, before anything runs. Pure arithmetic: any thread.
 */
#ifndef FA_DAEMON_WORKLIMIT_H
#define FA_DAEMON_WORKLIMIT_H

#include <stddef.h>
#include <stdint.h>

#include "fa_attn.h"

/* Default --max-request-gflop of each backend when the option is 0. GPU: about 3 s of an H200
 * at 350 TFLOP/s (a 64k-token prefill, B=8 Hq=32 D=128, needs 5.6e5). CPU: the reference runs
 * 5-6 GFLOP/s per worker on the build machine, so about 3 minutes of one worker or 12 s of 16;
 * a 4096-token prefill of 32 heads at D=128 (275 GFLOP) fits, the stride-0 2^20 request of
 * issue 14 (3.5e4 GFLOP at D=8) does not. */
#define WORKLIMIT_GPU_DEFAULT_GFLOP 1000000u
#define WORKLIMIT_CPU_DEFAULT_GFLOP 1000u

/* The (query, key) pairs of one (batch, head) that the mask leaves visible, over the query
 * rows [s0, s1) (0 and d->Sq for all). Exact up to double rounding; never negative. */
double worklimit_pairs(const struct fa_attn_fwd_desc *d, int64_t s0, int64_t s1);

/* The request's FLOPs: 4 * B * Hq * D * worklimit_pairs(d, 0, Sq). */
double worklimit_flop(const struct fa_attn_fwd_desc *d);

/* FA_OK when the request's work is at most max_gflop GFLOP; else FA_ETOOBIG with a detail in
 * err naming the request's figure, its shape and the limit (and the option that sets it). */
fa_status worklimit_check(const struct fa_attn_fwd_desc *d, uint64_t max_gflop, char *err,
                          size_t errlen);

/* The backward pass counts as this many forward passes (FlashAttention's convention: dV, dP, dQ
 * and dK are four matrix products against the forward's two, plus the recomputed scores). */
#define WORKLIMIT_BWD_FACTOR 2.5

/* worklimit_check for a backward request described by its forward d: its work is
 * WORKLIMIT_BWD_FACTOR times the forward's. Same statuses. */
fa_status worklimit_check_bwd(const struct fa_attn_fwd_desc *d, uint64_t max_gflop, char *err,
                              size_t errlen);

#endif /* FA_DAEMON_WORKLIMIT_H */
