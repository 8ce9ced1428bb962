/* attn_check.c - is a forward descriptor self-consistent, and what bytes does a tensor touch.
 *
 * Every size here comes from a client, so every product and sum is overflow-checked: a wrapped
 * extent is how a request reads or writes outside its region. The detail texts go back to the
 * client verbatim ("head dim 12 is not a multiple of 8"), so they name the field and its value.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "fa_attn.h"

/* The byte range [*lo, *hi) a strided tensor touches. With strides >= 0 the lowest element is the
 * base, so lo is 0 and hi is one element past the element of largest offset,
 * (sum_i (shape[i]-1)*stride[i] + 1) * elem_size, every step checked against INT64_MAX. */
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

/* Write the reason into err (truncating) and return st. */
__attribute__((format(printf, 4, 5))) static fa_status check_fail(char *err, size_t errlen,
                                                                  fa_status st, const char *fmt,
                                                                  ...)
{
	if (err != NULL && errlen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return st;
}

/* Strides of one tensor: each >= 0. */
static fa_status check_strides(const char *tensor, const int64_t s[3], const char *const names[3],
                               char *err, size_t errlen)
{
	for (int i = 0; i < 3; i++)
		if (s[i] < 0)
			return check_fail(err, errlen, FA_EINVAL,
			                  "%s %s stride is %" PRId64 ": strides must be >= 0", tensor,
			                  names[i], s[i]);
	return FA_OK;
}

/* Does a product of four sizes fit in int64 (the reference and the kernels index with int64)? */
static bool elems_fit(int64_t a, int64_t b, int64_t c, int64_t d)
{
	int64_t r;
	return !__builtin_mul_overflow(a, b, &r) && !__builtin_mul_overflow(r, c, &r) &&
	       !__builtin_mul_overflow(r, d, &r);
}

/* Check a descriptor's own consistency; see fa_attn.h. The order is the order a client would fix
 * things in: types first, then sizes, then strides. */
fa_status fa_attn_fwd_check(const struct fa_attn_fwd_desc *d, char *err, size_t errlen)
{
	static const char *const seq_names[3] = {"batch", "seq", "head"};
	static const char *const lse_names[3] = {"batch", "head", "seq"};
	fa_status st;

	if (err != NULL && errlen > 0)
		err[0] = '\0';
	if (d == NULL)
		return check_fail(err, errlen, FA_EINVAL, "no descriptor");
	if (fa_dtype_size(d->dtype) == 0)
		return check_fail(err, errlen, FA_EDTYPE, "dtype %d is unknown (fp16, bf16 or fp32)",
		                  (int)d->dtype);
	switch (d->mask) {
	case FA_MASK_NONE:
	case FA_MASK_CAUSAL_BOTTOM_RIGHT:
	case FA_MASK_CAUSAL_TOP_LEFT:
		break;
	default:
		return check_fail(err, errlen, FA_EINVAL,
		                  "mask %d is unknown (0 none, 1 causal bottom-right, 2 causal top-left)",
		                  (int)d->mask);
	}
	switch (d->precision) {
	case FA_PREC_DEFAULT:
	case FA_PREC_IEEE:
	case FA_PREC_3XTF32:
	case FA_PREC_TF32:
	case FA_PREC_BF16:
		break;
	default:
		return check_fail(err, errlen, FA_EINVAL, "precision %d is unknown", (int)d->precision);
	}
	if (!isfinite(d->scale))
		return check_fail(err, errlen, FA_EINVAL, "scale %g is not finite", d->scale);
	if (d->scale == 0)
		return check_fail(err, errlen, FA_EINVAL, "scale is 0 (resolve the default first)");

	const struct {
		const char *name;
		int64_t v;
	} sizes[] = {{"B", d->B}, {"Sq", d->Sq}, {"Sk", d->Sk}, {"Hq", d->Hq}, {"Hkv", d->Hkv},
	             {"head dim", d->D}};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (sizes[i].v < 1)
			return check_fail(err, errlen, FA_ESHAPE, "%s %" PRId64 " must be >= 1",
			                  sizes[i].name, sizes[i].v);
	if (d->D % 8 != 0)
		return check_fail(err, errlen, FA_ESHAPE, "head dim %" PRId64 " is not a multiple of 8",
		                  d->D);
	if (d->D > FA_ATTN_MAX_HEAD_DIM)
		return check_fail(err, errlen, FA_ESHAPE, "head dim %" PRId64 " is above %d", d->D,
		                  FA_ATTN_MAX_HEAD_DIM);
	if (d->Hq % d->Hkv != 0)
		return check_fail(err, errlen, FA_ESHAPE,
		                  "Hq %" PRId64 " is not a multiple of Hkv %" PRId64, d->Hq, d->Hkv);
	if (!elems_fit(d->B, d->Sq, d->Hq, d->D))
		return check_fail(err, errlen, FA_ESHAPE,
		                  "q has more than 2^63 elements (B %" PRId64 ", Sq %" PRId64
		                  ", Hq %" PRId64 ", D %" PRId64 ")",
		                  d->B, d->Sq, d->Hq, d->D);
	if (!elems_fit(d->B, d->Sk, d->Hkv, d->D))
		return check_fail(err, errlen, FA_ESHAPE,
		                  "k has more than 2^63 elements (B %" PRId64 ", Sk %" PRId64
		                  ", Hkv %" PRId64 ", D %" PRId64 ")",
		                  d->B, d->Sk, d->Hkv, d->D);

	if ((st = check_strides("q", d->q_stride, seq_names, err, errlen)) != FA_OK ||
	    (st = check_strides("k", d->k_stride, seq_names, err, errlen)) != FA_OK ||
	    (st = check_strides("v", d->v_stride, seq_names, err, errlen)) != FA_OK ||
	    (st = check_strides("o", d->o_stride, seq_names, err, errlen)) != FA_OK ||
	    (st = check_strides("lse", d->lse_stride, lse_names, err, errlen)) != FA_OK)
		return st;
	return FA_OK;
}
