/* validate_bwd.c - ATTN_BWD request -> struct fa_attn_bwd_desc + pointers, with the forward's
 * rules in the forward's order (validate.c): which memory, which types, which shapes, then where
 * the bytes are, and no output sharing a byte with anything else the request names. */
#include "validate.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "util.h"

/* Validate an ATTN_BWD against the session; see validate.h. */
fa_status validate_attn_bwd(const struct session *s, const struct fa_proto_req *req, size_t align,
                            struct validate_bwd_result *out, char *err, size_t errlen)
{
	const struct fa_proto_tensor *t[FA_BWD_NTENSORS] = {
		[FA_BWD_Q] = &req->u.bwd.q,     [FA_BWD_K] = &req->u.bwd.k,
		[FA_BWD_V] = &req->u.bwd.v,     [FA_BWD_O] = &req->u.bwd.o,
		[FA_BWD_LSE] = &req->u.bwd.lse, [FA_BWD_DO] = &req->u.bwd.dout,
		[FA_BWD_DQ] = &req->u.bwd.dq,   [FA_BWD_DK] = &req->u.bwd.dk,
		[FA_BWD_DV] = &req->u.bwd.dv,
	};
	uint64_t hi[FA_BWD_NTENSORS] = {0};
	fa_status st;

	memset(out, 0, sizeof(*out));
	if (err != NULL && errlen > 0)
		err[0] = '\0';

	/* Which memory: a region of this session, not broken. */
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		out->region[i] = session_region_find(s, t[i]->region);
		if (out->region[i] == NULL)
			return fa_err(err, errlen, FA_EREGION,
			              "%s: region %016" PRIx64 " is not registered in this session",
			              fa_bwd_names[i], t[i]->region);
		if (atomic_load(&out->region[i]->broken))
			return fa_err(err, errlen, FA_ERANGE,
			              "%s: region %016" PRIx64 " lost pages while in use (its shm "
			              "object shrank); unregister it",
			              fa_bwd_names[i], t[i]->region);
	}

	/* Types: one for all but lse, which is fp32. */
	int dts[FA_BWD_NTENSORS];
	for (int i = 0; i < FA_BWD_NTENSORS; i++)
		dts[i] = t[i]->dtype;
	if ((st = fa_check_bwd_dtypes(dts, err, errlen)) != FA_OK)
		return st;
	fa_dtype dt = (fa_dtype)t[FA_BWD_Q]->dtype;
	size_t esz = fa_dtype_size(dt);

	/* Shapes. */
	const int64_t *shapes[FA_BWD_NTENSORS];
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		if ((st = fa_check_tensor_dims(fa_bwd_names[i], t[i]->shape, t[i]->stride,
		                               i != FA_BWD_LSE, err, errlen)) != FA_OK)
			return st;
		shapes[i] = t[i]->shape;
	}
	if ((st = fa_check_bwd_shapes(shapes, err, errlen)) != FA_OK)
		return st;

	/* The descriptor, and its own checks (head dim, mask, precision, sizes, strides). */
	const int64_t *qs = t[FA_BWD_Q]->shape, *ks = t[FA_BWD_K]->shape;
	struct fa_attn_fwd_desc *d = &out->desc.fwd;
	d->dtype = dt;
	d->precision = (fa_precision)req->u.bwd.precision;
	if (d->precision == FA_PREC_DEFAULT)
		d->precision = FA_PREC_3XTF32;
	d->mask = (fa_mask)req->u.bwd.mask;
	d->scale = req->u.bwd.scale != 0 ? req->u.bwd.scale : 1.0 / sqrt((double)qs[3]);
	d->B = qs[0];
	d->Sq = qs[1];
	d->Sk = ks[1];
	d->Hq = qs[2];
	d->Hkv = ks[2];
	d->D = qs[3];
	d->window = req->u.bwd.win.window;
	d->window_left = req->u.bwd.win.window_left;
	d->window_right = req->u.bwd.win.window_right;
	d->softcap = req->u.bwd.win.softcap;
	int64_t *ds[FA_BWD_NTENSORS] = {
		[FA_BWD_Q] = d->q_stride,          [FA_BWD_K] = d->k_stride,
		[FA_BWD_V] = d->v_stride,          [FA_BWD_O] = d->o_stride,
		[FA_BWD_LSE] = d->lse_stride,      [FA_BWD_DO] = out->desc.do_stride,
		[FA_BWD_DQ] = out->desc.dq_stride, [FA_BWD_DK] = out->desc.dk_stride,
		[FA_BWD_DV] = out->desc.dv_stride,
	};
	for (int i = 0; i < FA_BWD_NTENSORS; i++)
		memcpy(ds[i], t[i]->stride, 3 * sizeof(int64_t));
	if ((st = fa_attn_bwd_check(&out->desc, err, errlen)) != FA_OK)
		return st;

	/* Where the bytes are: inside the region, aligned (lse: its element size). */
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		size_t el = i == FA_BWD_LSE ? sizeof(float) : esz;
		if ((st = fa_check_extent(fa_bwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                          out->region[i]->size, &hi[i], err, errlen)) != FA_OK ||
		    (st = fa_check_align(fa_bwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                         i == FA_BWD_LSE ? 0 : align, err, errlen)) != FA_OK)
			return st;
	}

	/* Outputs overlap nothing else, in the memory itself. */
	bool is_output[FA_BWD_NTENSORS];
	struct fa_check_span span[FA_BWD_NTENSORS];
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		is_output[i] = fa_bwd_is_output(i);
		span[i] = (struct fa_check_span){fa_bwd_names[i], t[i]->region,
		                                 out->region[i]->mem_at, t[i]->offset, hi[i]};
	}
	if ((st = validate_overlaps(FA_BWD_NTENSORS, is_output, out->region, span, err, errlen)) !=
	    FA_OK)
		return st;

	/* A device region's base is a device address: the sum is only ever handed to the GPU. */
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		out->ptr[i] = (char *)((uintptr_t)out->region[i]->base + t[i]->offset);
		out->on_device[i] = out->region[i]->kind == FA_REGION_CUDA_IPC;
	}
	return FA_OK;
}
