/* attn_ref_int.h - what the forward and backward CPU references share: which keys a row sees and
 * how a head row is read. Internal to kernels/ (attn_fwd_ref.c, attn_bwd_ref.c); static inline,
 * so each reference keeps its loops in one file.
 */
#ifndef FA_ATTN_REF_INT_H
#define FA_ATTN_REF_INT_H

#include <stdint.h>

#include "fa_attn.h"

/* Number of keys query row i sees: masks are prefixes, [0, n). Agrees with fa_mask_allows(). */
static inline int64_t ref_visible(fa_mask m, int64_t Sq, int64_t Sk, int64_t i)
{
	int64_t n;
	switch (m) {
	case FA_MASK_CAUSAL_BOTTOM_RIGHT: n = i + (Sk - Sq) + 1; break;
	case FA_MASK_CAUSAL_TOP_LEFT: n = i + 1; break;
	default: n = Sk; break;
	}
	if (n < 0)
		return 0;
	return n < Sk ? n : Sk;
}

/* Convert one head row of D elements at element offset off to float64: one switch per row. */
static inline void ref_load_row(const void *base, fa_dtype dt, int64_t off, int64_t D,
                                double *dst)
{
	switch (dt) {
	case FA_DTYPE_FP16: {
		const uint16_t *p = (const uint16_t *)base + off;
		for (int64_t x = 0; x < D; x++)
			dst[x] = fa_half_to_float(p[x]);
		break;
	}
	case FA_DTYPE_BF16: {
		const uint16_t *p = (const uint16_t *)base + off;
		for (int64_t x = 0; x < D; x++)
			dst[x] = fa_bf16_to_float(p[x]);
		break;
	}
	case FA_DTYPE_FP32: {
		const float *p = (const float *)base + off;
		for (int64_t x = 0; x < D; x++)
			dst[x] = p[x];
		break;
	}
	}
}

#endif /* FA_ATTN_REF_INT_H */
