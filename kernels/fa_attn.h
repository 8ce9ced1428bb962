/* fa_attn.h - what an attention problem is, independent of where it runs.
 *
 * One descriptor (struct fa_attn_fwd_desc) is shared by the CPU reference (attn_fwd_ref.c), the
 * GPU launcher and the daemon's validation, so the three agree on shapes, strides and masks.
 * Plain C; no CUDA, no I/O.
 */
#ifndef FA_ATTN_H
#define FA_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_check.h" /* fa_dtype_size, fa_tensor_extent, FA_ATTN_MAX_HEAD_DIM: the request rules */
#include "fa_types.h"

/* A forward problem. Strides are in elements; the head dim is contiguous (stride 1).
 * Q, O: [B, Sq, Hq, D] addressed by (q_stride[0]*b + q_stride[1]*s + q_stride[2]*h + d).
 * K, V: [B, Sk, Hkv, D] likewise. LSE: fp32 [B, Hq, Sq] by (lse_stride[0]*b + lse_stride[1]*h +
 * lse_stride[2]*s). */
struct fa_attn_fwd_desc {
	fa_dtype dtype;         /* of Q, K, V and O */
	fa_precision precision; /* fp32 only; FA_PREC_DEFAULT resolved by the consumer */
	fa_mask mask;
	double scale;           /* already resolved: never 0 here */
	int64_t B, Sq, Sk, Hq, Hkv, D;
	int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3]; /* batch, seq, head */
	int64_t lse_stride[3];  /* batch, head, seq */
	/* Sliding window (Mistral; FlashAttention's window_size), off when window is false (the
	 * zero of a designated initializer: today's behaviour). Query row i sees keys j with
	 * i + a - window_left <= j <= i + a + window_right, a the mask's alignment (Sk - Sq, or 0
	 * for FA_MASK_CAUSAL_TOP_LEFT); a negative side is unbounded. A causal mask also caps the
	 * right side at 0, so causal is the window (-1, 0). fa_attn_key_range() is the rule. */
	bool window;
	int64_t window_left, window_right;
	/* Logit softcapping (Gemma 2): > 0 turns each scaled score s into softcap * tanh(s /
	 * softcap) before the mask, and lse is of the capped scores; 0 is off. */
	double softcap;
};

/* Parse "fp16" / "bf16" / "fp32" (also "f16", "half", "float", "float32"...). Returns false if
 * unknown. */
bool fa_dtype_parse(const char *s, fa_dtype *out);

/* fp16 / bf16 conversions, round to nearest even, NaN and infinities preserved. */
float fa_half_to_float(uint16_t h);
uint16_t fa_float_to_half(float f);
float fa_bf16_to_float(uint16_t h);
uint16_t fa_float_to_bf16(float f);

/* Element i (an element index, not bytes) of an array of dtype dt, as double. */
double fa_load_elem(const void *base, fa_dtype dt, int64_t i);
/* Store v (rounded to dt) at element index i. */
void fa_store_elem(void *base, fa_dtype dt, int64_t i, double v);

/* Does query row i (0-based, of Sq) see key j (of Sk) under mask m? */
static inline bool fa_mask_allows(fa_mask m, int64_t Sq, int64_t Sk, int64_t i, int64_t j)
{
	switch (m) {
	case FA_MASK_CAUSAL_BOTTOM_RIGHT: return j <= i + (Sk - Sq);
	case FA_MASK_CAUSAL_TOP_LEFT: return j <= i;
	default: return true;
	}
}

/* The keys [*lo, *hi) of a sequence of Sq queries and Sk keys that query row i sees under d's
 * mask and window (d's own Sq and Sk are not used: variable-length batches pass each sequence's).
 * Masks and windows only cut off a prefix and a suffix, so this is one range; empty (*lo ==
 * *hi) for a row that sees nothing. No overflow for any window values and Sq, Sk < 2^62. */
static inline void fa_attn_key_range(const struct fa_attn_fwd_desc *d, int64_t Sq, int64_t Sk,
                                     int64_t i, int64_t *lo, int64_t *hi)
{
	int64_t diag = i + (d->mask == FA_MASK_CAUSAL_TOP_LEFT ? 0 : Sk - Sq); /* key of the diagonal */
	int64_t l = 0, h = Sk;

	if (d->mask == FA_MASK_CAUSAL_BOTTOM_RIGHT || d->mask == FA_MASK_CAUSAL_TOP_LEFT)
		h = diag + 1 < h ? diag + 1 : h;
	if (d->window && d->window_right >= 0 && d->window_right < Sk)
		h = diag + d->window_right + 1 < h ? diag + d->window_right + 1 : h;
	if (d->window && d->window_left >= 0 && d->window_left < Sk + Sq)
		l = diag - d->window_left > l ? diag - d->window_left : l;
	if (h < 0)
		h = 0;
	if (l > h)
		l = h;
	*lo = l;
	*hi = h;
}

/* Does query row i see key j under d's mask and window (fa_attn_key_range, one key)? */
static inline bool fa_attn_allows(const struct fa_attn_fwd_desc *d, int64_t Sq, int64_t Sk,
                                  int64_t i, int64_t j)
{
	int64_t lo, hi;
	fa_attn_key_range(d, Sq, Sk, i, &lo, &hi);
	return j >= lo && j < hi;
}

/* d's mask and window as the range [*lo, *hi] of j - i that a query row i sees, for kernels that
 * take it as two ints (attn_bwd.cu's FA_WIN; the forward's host folds it the same way): key j of
 * row i is visible iff j < Sk and *lo <= j - i <= *hi, which is fa_attn_key_range's rule (the
 * diagonal at j - i = a, a = 0 top-left, else Sk - Sq; a side bounds only when >= 0 and below Sk,
 * or Sk + Sq for the left; causal caps the right at a). Clamped to [-Sq - 1, Sk + 1], where
 * j - i of a real pair lies in [1 - Sq, Sk - 1]: an unbounded side gets the clamp, and both fit
 * an int for Sq, Sk < 2^30. Always *lo <= a <= *hi. */
static inline void fa_attn_window_diffs(const struct fa_attn_fwd_desc *d, int64_t *lo,
                                        int64_t *hi)
{
	const int64_t a = d->mask == FA_MASK_CAUSAL_TOP_LEFT ? 0 : d->Sk - d->Sq;
	int64_t l = -d->Sq - 1, h = d->Sk + 1;
	if (d->mask == FA_MASK_CAUSAL_BOTTOM_RIGHT || d->mask == FA_MASK_CAUSAL_TOP_LEFT)
		h = a;
	if (d->window && d->window_right >= 0 && d->window_right < d->Sk && a + d->window_right < h)
		h = a + d->window_right;
	if (d->window && d->window_left >= 0 && d->window_left < d->Sk + d->Sq)
		l = a - d->window_left;
	if (l < -d->Sq - 1)
		l = -d->Sq - 1;
	if (h > d->Sk + 1)
		h = d->Sk + 1;
	*lo = l;
	*hi = h;
}

/* Whether d's window bounds either side under fa_attn_key_range's rule (left >= 0 and below
 * Sk + Sq, right >= 0 and below Sk): the GPU kernels run a window that bounds nothing (say (-1,
 * -1)) as none. */
static inline bool fa_attn_window_active(const struct fa_attn_fwd_desc *d)
{
	return d->window && ((d->window_left >= 0 && d->window_left < d->Sk + d->Sq) ||
	                     (d->window_right >= 0 && d->window_right < d->Sk));
}

/* Check a descriptor's own consistency (not memory): dtype, mask and precision values; sizes >= 1;
 * D a multiple of 8 in [8, 256]; Hq a multiple of Hkv; strides >= 0; scale finite and nonzero;
 * softcap finite and >= 0 (any window values are valid).
 * Returns FA_OK, FA_EDTYPE, FA_EINVAL or FA_ESHAPE with the reason in err. */
fa_status fa_attn_fwd_check(const struct fa_attn_fwd_desc *d, char *err, size_t errlen);

/* The CPU reference: float64 accumulation, two passes over each row (max, then sum), exact
 * softmax; the window and softcap as the descriptor says. Computes the (batch, query-head) pairs bh in [bh_begin, bh_end) of B*Hq, so a thread
 * pool can split the work; pass 0 and B*Hq for all. Writes O in the descriptor's dtype and, when
 * lse != NULL, the fp32 logsumexp. A fully masked row gets O = 0 and lse = -inf.
 * Scratch memory is bounded by fa_attn_fwd_ref_scratch_limit(); nothing else is allocated.
 * Thread-safe: calls on disjoint bh ranges may run at once.
 * Returns FA_OK; FA_EINVAL (NULL pointer, bh range outside [0, B*Hq]), the statuses of
 * fa_attn_fwd_check() (it is run first), FA_ENOMEM (scratch allocation failed, or the limit is
 * too small for even one key). On failure O and lse may be partly written. */
fa_status fa_attn_fwd_ref(const struct fa_attn_fwd_desc *d, const void *q, const void *k,
                          const void *v, void *o, float *lse, int64_t bh_begin, int64_t bh_end);

/* The oracle for the GPU tests: like fa_attn_fwd_ref but writes float64 results, densely:
 * o64 [B, Sq, Hq, D] and lse64 [B, Hq, Sq] (lse64 may be NULL). Inputs as in the descriptor.
 * Returns the statuses of fa_attn_fwd_ref. */
fa_status fa_attn_fwd_ref64(const struct fa_attn_fwd_desc *d, const void *q, const void *k,
                            const void *v, double *o64, double *lse64);

/* The most scratch memory, in bytes, that one call of fa_attn_fwd_ref / _ref64 allocates (default
 * 64 MiB). Within it, each (batch, kv-head) block's K and V are converted to float64 once; past
 * it, keys are processed in chunks converted once per block of query rows (slower, same result).
 * bytes == 0 leaves the limit as it is. Returns the previous limit. Process-wide, thread-safe. */
size_t fa_attn_fwd_ref_scratch_limit(size_t bytes);

/* Relative Frobenius error ||x - ref|| / ||ref|| of the values of x (dtype and element strides as
 * the descriptor gives for o) against the dense float64 reference o64 [B, Sq, Hq, D]. Returns
 * +inf if any value of x (or of ref) is NaN or infinite, if ref is all zeros while x is not, or
 * on a NULL argument; 0 when both are all zeros. */
double fa_attn_fwd_rel_error(const struct fa_attn_fwd_desc *d, const void *o, const double *o64);

#endif /* FA_ATTN_H */
