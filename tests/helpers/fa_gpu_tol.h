/* fa_gpu_tol.h - the forward GPU tests' tolerances against the float64 reference and their
 * per-kind error table (test_attn_fwd_gpu, test_attn_decode_gpu, test_attn_window_gpu; the
 * backward's test takes the kinds and has its own, looser tolerances).
 *
 * One place for the numbers ARCHITECTURE.md's tolerance table gives, so that the forward's three
 * kernel tests cannot drift apart. Header-only: static inline, no state.
 */
#ifndef FA_GPU_TOL_H
#define FA_GPU_TOL_H

#include "fa_attn.h"
#include "fa_planner.h" /* fa_prec_resolve */

/* The kinds an error is reported by: fp16, bf16, then fp32 by its resolved precision. */
enum { FA_GPU_NKIND = 6 };

/* Worst relative error of O allowed for dtype dt computed with precision p. */
static inline double fa_gpu_tol(fa_dtype dt, fa_precision p)
{
	if (dt == FA_DTYPE_FP16)
		return 2e-3;
	if (dt == FA_DTYPE_BF16)
		return 1e-2;
	switch (fa_prec_resolve(dt, p)) {
	case FA_PREC_TF32: return 2e-3;
	case FA_PREC_BF16: return 1e-2;
	default: return 1e-5;
	}
}

/* Worst absolute error of the logsumexp allowed (it is fp32 for every dtype). */
static inline double fa_gpu_lse_tol(fa_dtype dt, fa_precision p)
{
	if (dt != FA_DTYPE_FP32)
		return 2e-4;
	switch (fa_prec_resolve(dt, p)) {
	case FA_PREC_TF32: return 1e-2;
	case FA_PREC_BF16: return 8e-2;
	default: return 2e-4;
	}
}

/* The kind of (dt, p): 0 fp16, 1 bf16, 2 fp32 ieee, 3 3xtf32, 4 tf32, 5 bf16 staging. */
static inline int fa_gpu_kind(fa_dtype dt, fa_precision p)
{
	if (dt == FA_DTYPE_FP16)
		return 0;
	if (dt == FA_DTYPE_BF16)
		return 1;
	return 1 + (int)fa_prec_resolve(dt, p);
}

/* The kind's name in the tests' "worst relative error" lines. */
static inline const char *fa_gpu_kind_name(int kind)
{
	static const char *const names[FA_GPU_NKIND] = {"fp16",        "bf16",      "fp32 ieee",
	                                                "fp32 3xtf32", "fp32 tf32", "fp32 bf16"};
	return kind >= 0 && kind < FA_GPU_NKIND ? names[kind] : "?";
}

#endif /* FA_GPU_TOL_H */
