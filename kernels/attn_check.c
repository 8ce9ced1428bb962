/* attn_check.c - is a forward (or backward) descriptor self-consistent.
 *
 * Every size here comes from a client, so every product is overflow-checked. The detail texts go
 * back to the client verbatim ("head dim 12 is not a multiple of 8"), so they name the field and
 * its value; the rules a request shares with the client and the daemon (mask, precision, head
 * dim, extents) are common/fa_check.c's.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "fa_attn.h"
#include "fa_attn_bwd.h"
#include "fa_check_infer.h"
#include "fa_err.h"

/* Strides of one tensor: each >= 0. */
static fa_status check_strides(const char *tensor, const int64_t s[3], const char *const names[3],
                               char *err, size_t errlen)
{
	for (int i = 0; i < 3; i++)
		if (s[i] < 0)
			return fa_err(err, errlen, FA_EINVAL,
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
		return fa_err(err, errlen, FA_EINVAL, "no descriptor");
	if (fa_dtype_size(d->dtype) == 0)
		return fa_err(err, errlen, FA_EDTYPE, "dtype %d is unknown (fp16, bf16 or fp32)",
		              (int)d->dtype);
	if ((st = fa_check_mask((int)d->mask, err, errlen)) != FA_OK ||
	    (st = fa_check_precision((int)d->precision, err, errlen)) != FA_OK ||
	    (st = fa_check_scale(d->scale, err, errlen)) != FA_OK)
		return st;
	if (d->scale == 0)
		return fa_err(err, errlen, FA_EINVAL, "scale is 0 (resolve the default first)");
	if ((st = fa_check_softcap(d->softcap, err, errlen)) != FA_OK)
		return st;

	const struct {
		const char *name;
		int64_t v;
	} sizes[] = {{"B", d->B}, {"Sq", d->Sq}, {"Sk", d->Sk}, {"Hq", d->Hq}, {"Hkv", d->Hkv},
	             {"head dim", d->D}};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		if (sizes[i].v < 1)
			return fa_err(err, errlen, FA_ESHAPE, "%s %" PRId64 " must be >= 1",
			              sizes[i].name, sizes[i].v);
	if ((st = fa_check_head_dim(d->D, err, errlen)) != FA_OK)
		return st;
	if (d->Hq % d->Hkv != 0)
		return fa_err(err, errlen, FA_ESHAPE,
		              "Hq %" PRId64 " is not a multiple of Hkv %" PRId64, d->Hq, d->Hkv);
	if (!elems_fit(d->B, d->Sq, d->Hq, d->D))
		return fa_err(err, errlen, FA_ESHAPE,
		              "q has more than 2^63 elements (B %" PRId64 ", Sq %" PRId64
		              ", Hq %" PRId64 ", D %" PRId64 ")",
		              d->B, d->Sq, d->Hq, d->D);
	if (!elems_fit(d->B, d->Sk, d->Hkv, d->D))
		return fa_err(err, errlen, FA_ESHAPE,
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

/* The forward's rules, then the gradients' strides; see fa_attn_bwd.h. */
fa_status fa_attn_bwd_check(const struct fa_attn_bwd_desc *d, char *err, size_t errlen)
{
	static const char *const seq_names[3] = {"batch", "seq", "head"};
	fa_status st;

	if (d == NULL)
		return fa_err(err, errlen, FA_EINVAL, "no descriptor");
	if ((st = fa_attn_fwd_check(&d->fwd, err, errlen)) != FA_OK)
		return st;
	if ((st = check_strides("do", d->do_stride, seq_names, err, errlen)) != FA_OK ||
	    (st = check_strides("dq", d->dq_stride, seq_names, err, errlen)) != FA_OK ||
	    (st = check_strides("dk", d->dk_stride, seq_names, err, errlen)) != FA_OK ||
	    (st = check_strides("dv", d->dv_stride, seq_names, err, errlen)) != FA_OK)
		return st;
	return FA_OK;
}
