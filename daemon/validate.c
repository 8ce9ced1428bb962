/* validate.c - ATTN_FWD request -> struct fa_attn_fwd_desc + pointers, in the order a client would
 * fix its mistakes: which memory, which types, which shapes, then where the bytes are. */
#include "validate.h"

#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fa_check.h"
#include "fa_proto_memo.h"
#include "util.h"

/* Each output against every input and every output before it (each pair once, outputs in
 * order, so "lse overlaps o" and not "o overlaps lse"), where both map one memory. Any request's
 * tensors: is_output says which of the n are written (validate_bwd.c uses it too). */
fa_status validate_overlaps(int n, const bool *is_output, struct region *const *region,
                                   const struct fa_check_span *span, char *err, size_t errlen)
{
	fa_status st;

	for (int i = 0; i < n; i++) {
		if (!is_output[i])
			continue;
		for (int j = 0; j < n; j++) {
			if (j == i || (is_output[j] && j > i) ||
			    !region_same_mem(region[i], region[j]))
				continue;
			if ((st = fa_check_overlap(&span[i], &span[j], err, errlen)) != FA_OK)
				return st;
		}
	}
	return FA_OK;
}

/* Validate an ATTN_FWD against the session; see validate.h. */
fa_status validate_attn_fwd(const struct session *s, const struct fa_proto_req *req, size_t align,
                            struct validate_result *out, char *err, size_t errlen)
{
	const struct fa_proto_tensor *t[VALIDATE_NTENSORS] = {&req->u.fwd.q, &req->u.fwd.k,
	                                                      &req->u.fwd.v, &req->u.fwd.o,
	                                                      &req->u.fwd.lse};
	uint64_t lo[VALIDATE_NTENSORS] = {0}, hi[VALIDATE_NTENSORS] = {0}; /* byte ranges */
	bool has_lse = req->u.fwd.lse.region != 0;
	int n = has_lse ? VALIDATE_NTENSORS : VALIDATE_LSE;

	memset(out, 0, sizeof(*out));
	if (err != NULL && errlen > 0)
		err[0] = '\0';

	/* Which memory: a region of this session (another session's id is as unknown as a
	 * made-up one). */
	for (int i = 0; i < n; i++) {
		out->region[i] = session_region_find(s, t[i]->region);
		if (out->region[i] == NULL)
			return fa_err(err, errlen, FA_EREGION,
			              "%s: region %016" PRIx64
			              " is not registered in this session",
			              fa_fwd_names[i], t[i]->region);
		if (atomic_load(&out->region[i]->broken))
			return fa_err(err, errlen, FA_ERANGE,
			              "%s: region %016" PRIx64
			              " lost pages while in use (its shm "
			              "object shrank); unregister it",
			              fa_fwd_names[i], t[i]->region);
	}

	/* Types: q, k, v, o share one; lse is fp32. */
	int dts[VALIDATE_NTENSORS];
	for (int i = 0; i < VALIDATE_NTENSORS; i++)
		dts[i] = t[i]->dtype;
	fa_status st = fa_check_fwd_dtypes(dts, has_lse, err, errlen);
	if (st != FA_OK)
		return st;
	fa_dtype dt = (fa_dtype)t[VALIDATE_Q]->dtype;
	size_t esz = fa_dtype_size(dt);

	/* Shapes. */
	for (int i = 0; i < n; i++)
		if ((st = fa_check_tensor_dims(fa_fwd_names[i], t[i]->shape, t[i]->stride,
		                               i != VALIDATE_LSE, err, errlen)) != FA_OK)
			return st;
	const int64_t *qs = t[VALIDATE_Q]->shape, *ks = t[VALIDATE_K]->shape;
	int64_t B = qs[0], Sq = qs[1], Hq = qs[2], D = qs[3], Sk = ks[1], Hkv = ks[2];
	if ((st = fa_check_fwd_shapes(qs, ks, t[VALIDATE_V]->shape, t[VALIDATE_O]->shape,
	                              has_lse ? t[VALIDATE_LSE]->shape : NULL, err, errlen)) != FA_OK)
		return st;

	/* The descriptor, and its own checks (head dim, mask, precision, sizes). */
	struct fa_attn_fwd_desc *d = &out->desc;
	d->dtype = dt;
	d->precision = (fa_precision)req->u.fwd.precision;
	if (d->precision == FA_PREC_DEFAULT)
		d->precision = FA_PREC_3XTF32;
	d->mask = (fa_mask)req->u.fwd.mask;
	d->scale = req->u.fwd.scale != 0 ? req->u.fwd.scale : 1.0 / sqrt((double)D);
	d->B = B;
	d->Sq = Sq;
	d->Sk = Sk;
	d->Hq = Hq;
	d->Hkv = Hkv;
	d->D = D;
	int64_t *ds[4] = {d->q_stride, d->k_stride, d->v_stride, d->o_stride};
	for (int i = 0; i < 4; i++)
		memcpy(ds[i], t[i]->stride, 3 * sizeof(int64_t));
	if (has_lse)
		memcpy(d->lse_stride, t[VALIDATE_LSE]->stride, 3 * sizeof(int64_t));
	d->window = req->u.fwd.win.window;
	d->window_left = req->u.fwd.win.window_left;
	d->window_right = req->u.fwd.win.window_right;
	d->softcap = req->u.fwd.win.softcap;
	if ((st = fa_attn_fwd_check(d, err, errlen)) != FA_OK)
		return st;

	/* Where the bytes are: inside the region, aligned. lse is read and written element by
	 * element: its element size is enough. */
	for (int i = 0; i < n; i++) {
		size_t el = i == VALIDATE_LSE ? sizeof(float) : esz;
		if ((st = fa_check_extent(fa_fwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                          out->region[i]->size, &hi[i], err, errlen)) != FA_OK ||
		    (st = fa_check_align(fa_fwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                         i == VALIDATE_LSE ? 0 : align, err, errlen)) != FA_OK)
			return st;
		lo[i] = t[i]->offset;
	}

	/* Outputs overlap nothing else, in the memory itself: two registrations of one shm object
	 * or one CUDA allocation are one memory. */
	static const bool is_output[VALIDATE_NTENSORS] = {[VALIDATE_O] = true,
	                                                  [VALIDATE_LSE] = true};
	struct fa_check_span span[VALIDATE_NTENSORS];
	for (int i = 0; i < n; i++)
		span[i] = (struct fa_check_span){fa_fwd_names[i], t[i]->region,
		                                 out->region[i]->mem_at, lo[i], hi[i]};
	if ((st = validate_overlaps(n, is_output, out->region, span, err, errlen)) != FA_OK)
		return st;

	/* A device region's base is a device address: the sum is only ever handed to the GPU. */
	char *b[VALIDATE_NTENSORS];
	for (int i = 0; i < n; i++) {
		b[i] = (char *)((uintptr_t)out->region[i]->base + t[i]->offset);
		out->on_device[i] = out->region[i]->kind == FA_REGION_CUDA_IPC;
	}
	out->q = b[VALIDATE_Q];
	out->k = b[VALIDATE_K];
	out->v = b[VALIDATE_V];
	out->o = b[VALIDATE_O];
	out->lse = has_lse ? (float *)(void *)b[VALIDATE_LSE] : NULL;
	return FA_OK;
}

/* The last request validate_attn_fwd_memo passed, and its result. */
struct validate_memo {
	uint64_t gen;
	size_t align;
	struct fa_proto_req req;
	struct validate_result vr;
};

fa_status validate_attn_fwd_memo(struct session *s, const struct fa_proto_req *req, size_t align,
                                 struct validate_result *out, char *err, size_t errlen)
{
	struct validate_memo *m = s->validate_memo;

	if (m != NULL && m->gen == s->regions_gen && m->align == align &&
	    fa_proto_req_same_but_seq(req, &m->req)) {
		bool broken = false;
		for (int i = 0; i < VALIDATE_NTENSORS; i++)
			broken |= m->vr.region[i] != NULL && atomic_load(&m->vr.region[i]->broken);
		if (!broken) { /* (a broken one gets its error from the full checks) */
			*out = m->vr;
			if (err != NULL && errlen > 0)
				err[0] = '\0';
			return FA_OK;
		}
	}
	fa_status st = validate_attn_fwd(s, req, align, out, err, errlen);
	if (st != FA_OK)
		return st;
	if (m == NULL && (m = s->validate_memo = malloc(sizeof *m)) == NULL)
		return st; /* no memo: every request is validated in full */
	m->gen = s->regions_gen;
	m->align = align;
	memcpy(&m->req, req, sizeof m->req);
	m->vr = *out;
	return st;
}
