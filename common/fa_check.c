/* fa_check.c - the request rules; see fa_check.h. The detail texts are the daemon's, which tests
 * match: change one only together with its test. */
#include "fa_check.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "fa_err.h"

const char *const fa_fwd_names[FA_FWD_NTENSORS] = {"q", "k", "v", "o", "lse"};
const char *const fa_bwd_names[FA_BWD_NTENSORS] = {"q",    "k",  "v",  "o", "lse",
                                                   "dout", "dq", "dk", "dv"};

/* Bytes per element of a dtype; 0 for an unknown one. */
size_t fa_dtype_size(fa_dtype dt)
{
	switch (dt) {
	case FA_DTYPE_FP16: return 2;
	case FA_DTYPE_BF16: return 2;
	case FA_DTYPE_FP32: return 4;
	}
	return 0;
}

/* Name of a dtype; "?" for an unknown one. */
const char *fa_dtype_name(fa_dtype dt)
{
	switch (dt) {
	case FA_DTYPE_FP16: return "fp16";
	case FA_DTYPE_BF16: return "bf16";
	case FA_DTYPE_FP32: return "fp32";
	}
	return "?";
}

/* With strides >= 0 the lowest element is the base, so lo is 0 and hi is one element past the
 * element of largest offset, (sum_i (shape[i]-1)*stride[i] + 1) * elem_size, every step checked
 * against INT64_MAX. */
bool fa_tensor_extent(int ndim, const int64_t *shape, const int64_t *stride, size_t elem_size,
                      uint64_t *lo, uint64_t *hi)
{
	int64_t last = 0; /* element offset of the last element */
	int64_t bytes;

	if (lo != NULL)
		*lo = 0;
	if (hi != NULL)
		*hi = 0;
	if (ndim < 0 || (ndim > 0 && (shape == NULL || stride == NULL)) || elem_size == 0 ||
	    elem_size > (size_t)INT64_MAX)
		return false;
	for (int i = 0; i < ndim; i++) {
		int64_t step;
		if (shape[i] < 1 || stride[i] < 0)
			return false;
		if (__builtin_mul_overflow(shape[i] - 1, stride[i], &step) ||
		    __builtin_add_overflow(last, step, &last))
			return false;
	}
	if (__builtin_add_overflow(last, (int64_t)1, &last) ||
	    __builtin_mul_overflow(last, (int64_t)elem_size, &bytes))
		return false;
	if (hi != NULL)
		*hi = (uint64_t)bytes;
	return true;
}

/* q's dtype first (the reference the others are compared with), then agreement, then lse. */
fa_status fa_check_fwd_dtypes(const int dt[FA_FWD_NTENSORS], bool has_lse, char *err,
                              size_t errlen)
{
	fa_dtype q = (fa_dtype)dt[FA_FWD_Q];

	if (fa_dtype_size(q) == 0)
		return fa_err(err, errlen, FA_EDTYPE, "q: dtype %d is unknown (fp16, bf16 or fp32)",
		              dt[FA_FWD_Q]);
	for (int i = FA_FWD_K; i <= FA_FWD_O; i++)
		if (dt[i] != dt[FA_FWD_Q])
			return fa_err(err, errlen, FA_EDTYPE,
			              "%s: dtype %s differs from q's %s (q, k, v and o share one dtype)",
			              fa_fwd_names[i], fa_dtype_name((fa_dtype)dt[i]), fa_dtype_name(q));
	if (has_lse && dt[FA_FWD_LSE] != FA_DTYPE_FP32)
		return fa_err(err, errlen, FA_EDTYPE, "lse: dtype must be fp32, not %s",
		              fa_dtype_name((fa_dtype)dt[FA_FWD_LSE]));
	return FA_OK;
}

/* As the forward's: q's dtype first, then agreement in index order, then lse. */
fa_status fa_check_bwd_dtypes(const int dt[FA_BWD_NTENSORS], char *err, size_t errlen)
{
	fa_dtype q = (fa_dtype)dt[FA_BWD_Q];

	if (fa_dtype_size(q) == 0)
		return fa_err(err, errlen, FA_EDTYPE, "q: dtype %d is unknown (fp16, bf16 or fp32)",
		              dt[FA_BWD_Q]);
	for (int i = FA_BWD_K; i < FA_BWD_NTENSORS; i++)
		if (i != FA_BWD_LSE && dt[i] != dt[FA_BWD_Q])
			return fa_err(err, errlen, FA_EDTYPE,
			              "%s: dtype %s differs from q's %s (q, k, v, o, dout, dq, dk and dv "
			              "share one dtype)",
			              fa_bwd_names[i], fa_dtype_name((fa_dtype)dt[i]), fa_dtype_name(q));
	if (dt[FA_BWD_LSE] != FA_DTYPE_FP32)
		return fa_err(err, errlen, FA_EDTYPE, "lse: dtype must be fp32, not %s",
		              fa_dtype_name((fa_dtype)dt[FA_BWD_LSE]));
	return FA_OK;
}

/* Sizes, then strides, then the head dim's stride. */
fa_status fa_check_tensor_dims(const char *name, const int64_t shape[4], const int64_t stride[4],
                               bool head_dim_contiguous, char *err, size_t errlen)
{
	for (int d = 0; d < 4; d++)
		if (shape[d] < 1)
			return fa_err(err, errlen, FA_ESHAPE,
			              "%s: shape[%d] is %" PRId64 "; every size must be >= 1", name, d,
			              shape[d]);
	for (int d = 0; d < 4; d++)
		if (stride[d] < 0)
			return fa_err(err, errlen, FA_EINVAL,
			              "%s: stride[%d] is %" PRId64 "; strides must be >= 0", name, d,
			              stride[d]);
	if (head_dim_contiguous && stride[3] != 1)
		return fa_err(err, errlen, FA_ESHAPE,
		              "%s: stride[3] is %" PRId64 "; the head dim must be contiguous (stride 1)",
		              name, stride[3]);
	return FA_OK;
}

/* Whether two shapes are equal. */
static bool same_shape(const int64_t a[4], const int64_t b[4])
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* FA_ESHAPE with both shapes in the detail. */
static fa_status shape_mismatch(const char *what, const int64_t got[4], const char *ref,
                                const int64_t want[4], char *err, size_t errlen)
{
	return fa_err(err, errlen, FA_ESHAPE,
	              "%s: shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
	              "] differs from %s [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]",
	              what, got[0], got[1], got[2], got[3], ref, want[0], want[1], want[2], want[3]);
}

/* In the order a caller would fix them: k against q, v against k, o against q, GQA, lse. */
fa_status fa_check_fwd_shapes(const int64_t q[4], const int64_t k[4], const int64_t v[4],
                              const int64_t o[4], const int64_t *lse, char *err, size_t errlen)
{
	int64_t B = q[0], Sq = q[1], Hq = q[2], D = q[3], Hkv = k[2];

	if (k[0] != B)
		return fa_err(err, errlen, FA_ESHAPE,
		              "k: batch %" PRId64 " differs from q's %" PRId64, k[0], B);
	if (k[3] != D)
		return fa_err(err, errlen, FA_ESHAPE,
		              "k: head dim %" PRId64 " differs from q's %" PRId64, k[3], D);
	if (!same_shape(v, k))
		return shape_mismatch("v", v, "k's", k, err, errlen);
	if (!same_shape(o, q))
		return shape_mismatch("o", o, "q's", q, err, errlen);
	if (Hq % Hkv != 0)
		return fa_err(err, errlen, FA_ESHAPE,
		              "GQA: q has %" PRId64 " heads, not a multiple of k/v's %" PRId64, Hq, Hkv);
	if (lse != NULL) {
		const int64_t want[4] = {B, Hq, Sq, 1};
		if (!same_shape(lse, want))
			return shape_mismatch("lse", lse, "[B, Hq, Sq, 1] =", want, err, errlen);
	}
	return FA_OK;
}

/* The forward's rules first (the gradients are judged against a consistent forward), then each
 * gradient against the tensor it is the gradient of. */
fa_status fa_check_bwd_shapes(const int64_t *const shape[FA_BWD_NTENSORS], char *err,
                              size_t errlen)
{
	static const struct {
		int t, like;
		const char *ref;
	} grads[] = {
		{FA_BWD_DO, FA_BWD_Q, "q's"},
		{FA_BWD_DQ, FA_BWD_Q, "q's"},
		{FA_BWD_DK, FA_BWD_K, "k's"},
		{FA_BWD_DV, FA_BWD_V, "v's"},
	};
	fa_status st = fa_check_fwd_shapes(shape[FA_BWD_Q], shape[FA_BWD_K], shape[FA_BWD_V],
	                                   shape[FA_BWD_O], shape[FA_BWD_LSE], err, errlen);
	if (st != FA_OK)
		return st;
	for (size_t i = 0; i < sizeof grads / sizeof grads[0]; i++)
		if (!same_shape(shape[grads[i].t], shape[grads[i].like]))
			return shape_mismatch(fa_bwd_names[grads[i].t], shape[grads[i].t], grads[i].ref,
			                      shape[grads[i].like], err, errlen);
	return FA_OK;
}

/* The kernels' tiles step the head dim by 8 (16-byte rows of 16-bit elements). */
fa_status fa_check_head_dim(int64_t D, char *err, size_t errlen)
{
	if (D % 8 != 0)
		return fa_err(err, errlen, FA_ESHAPE, "head dim %" PRId64 " is not a multiple of 8", D);
	if (D > FA_ATTN_MAX_HEAD_DIM)
		return fa_err(err, errlen, FA_ESHAPE, "head dim %" PRId64 " is above %d", D,
		              FA_ATTN_MAX_HEAD_DIM);
	return FA_OK;
}

/* One of fa_mask. */
fa_status fa_check_mask(int mask, char *err, size_t errlen)
{
	switch (mask) {
	case FA_MASK_NONE:
	case FA_MASK_CAUSAL_BOTTOM_RIGHT:
	case FA_MASK_CAUSAL_TOP_LEFT:
		return FA_OK;
	}
	return fa_err(err, errlen, FA_EINVAL,
	              "mask %d is unknown (0 none, 1 causal bottom-right, 2 causal top-left)", mask);
}

/* One of fa_precision. */
fa_status fa_check_precision(int precision, char *err, size_t errlen)
{
	switch (precision) {
	case FA_PREC_DEFAULT:
	case FA_PREC_IEEE:
	case FA_PREC_3XTF32:
	case FA_PREC_TF32:
	case FA_PREC_BF16:
		return FA_OK;
	}
	return fa_err(err, errlen, FA_EINVAL, "precision %d is unknown", precision);
}

/* Finite. */
fa_status fa_check_scale(double scale, char *err, size_t errlen)
{
	if (!isfinite(scale))
		return fa_err(err, errlen, FA_EINVAL, "scale %g is not finite", scale);
	return FA_OK;
}

/* The extent first (can it be computed at all), then offset + extent, then the region's end. */
fa_status fa_check_extent(const char *name, uint64_t offset, const int64_t shape[4],
                          const int64_t stride[4], size_t elem, uint64_t region_size,
                          uint64_t *end, char *err, size_t errlen)
{
	uint64_t ext, e;

	if (end != NULL)
		*end = 0;
	if (!fa_tensor_extent(4, shape, stride, elem, NULL, &ext))
		return fa_err(err, errlen, FA_ERANGE, "%s: shape and strides reach past 2^63 bytes",
		              name);
	if (__builtin_add_overflow(offset, ext, &e))
		return fa_err(err, errlen, FA_ERANGE,
		              "%s: offset %" PRIu64 " + extent %" PRIu64 " overflows", name, offset, ext);
	if (e > region_size)
		return fa_err(err, errlen, FA_ERANGE,
		              "%s: extent ends at byte %" PRIu64 " (offset %" PRIu64 " + %" PRIu64
		              "), region has %" PRIu64,
		              name, e, offset, ext, region_size);
	if (end != NULL)
		*end = e;
	return FA_OK;
}

/* Strides in bytes of the dimensions that are used. */
fa_status fa_check_stride_align(const char *name, const int64_t shape[3], const int64_t stride[3],
                                size_t elem, size_t align, char *err, size_t errlen)
{
	for (int k = 0; align > 0 && k < 3; k++)
		if (shape[k] > 1 && ((uint64_t)stride[k] * elem) % align != 0)
			return fa_err(err, errlen, FA_EALIGN,
			              "%s: stride[%d] of %" PRId64 " elements is not a multiple of %zu bytes",
			              name, k, stride[k], align);
	return FA_OK;
}

/* The offset, then (only when the backend asks for more than the element size) the strides. */
fa_status fa_check_align(const char *name, uint64_t offset, const int64_t shape[3],
                         const int64_t stride[3], size_t elem, size_t align, char *err,
                         size_t errlen)
{
	size_t need = align > elem ? align : elem;

	if (need == 0)
		return FA_OK;
	if (offset % need != 0)
		return fa_err(err, errlen, FA_EALIGN, "%s: offset %" PRIu64 " is not a multiple of %zu (%s)",
		              name, offset, need,
		              need == elem ? "the element size" : "the backend's alignment");
	if (need > elem)
		return fa_check_stride_align(name, shape, stride, elem, need, err, errlen);
	return FA_OK;
}

/* Half-open ranges share a byte unless one ends before the other starts; compared where both lie,
 * in the memory the regions map. */
fa_status fa_check_overlap(const struct fa_check_span *a, const struct fa_check_span *b,
                           char *err, size_t errlen)
{
	if (a->at + a->hi <= b->at + b->lo || b->at + b->hi <= a->at + a->lo)
		return FA_OK;
	if (a->region == b->region)
		return fa_err(err, errlen, FA_EOVERLAP,
		              "%s overlaps %s in region %016" PRIx64 ": bytes [%" PRIu64 ", %" PRIu64
		              ") and [%" PRIu64 ", %" PRIu64 ")",
		              a->name, b->name, a->region, a->lo, a->hi, b->lo, b->hi);
	return fa_err(err, errlen, FA_EOVERLAP,
	              "%s overlaps %s: regions %016" PRIx64 " and %016" PRIx64
	              " map the same memory (%s: bytes [%" PRIu64 ", %" PRIu64
	              ") of the first, %s: [%" PRIu64 ", %" PRIu64 ") of the second)",
	              a->name, b->name, a->region, b->region, a->name, a->lo, a->hi, b->name, b->lo,
	              b->hi);
}
