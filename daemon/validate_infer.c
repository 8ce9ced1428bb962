/* validate_infer.c - ATTN_VARLEN / ATTN_KVCACHE request -> inference job; see validate_infer.h. */
#include "validate_infer.h"

#include "backend.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "fa_check.h"
#include "fa_check_infer.h"
#include "util.h"

_Static_assert(VALIDATE_INFER_N <= BACKEND_MAX_TENSORS, "a job holds every tensor's region");

/* "q" ... "lse", then the index tensors' names. */
static const char *infer_name(int i)
{
	return i < FA_FWD_NTENSORS ? fa_fwd_names[i] : backend_infer_names[i - FA_FWD_NTENSORS];
}

/* The descriptor's forward part: types, settings, sizes and strides (bounds for the lengths). */
static void fill_fwd(const struct fa_proto_req *req, const struct fa_proto_tensor *const *t,
                     bool has_lse, struct fa_attn_fwd_desc *d)
{
	const __typeof__(req->u.infer) *r = &req->u.infer;
	d->dtype = (fa_dtype)r->q.dtype;
	d->precision = r->precision == FA_PREC_DEFAULT ? FA_PREC_3XTF32 : (fa_precision)r->precision;
	d->mask = (fa_mask)r->mask;
	d->scale = r->scale != 0 ? r->scale : 1.0 / sqrt((double)r->q.shape[3]);
	d->Hq = r->q.shape[2];
	d->Hkv = r->k.shape[2];
	d->D = r->q.shape[3];
	int64_t *ds[4] = {d->q_stride, d->k_stride, d->v_stride, d->o_stride};
	for (int i = 0; i < 4; i++)
		memcpy(ds[i], t[i]->stride, 3 * sizeof(int64_t));
	if (has_lse)
		memcpy(d->lse_stride, t[FA_FWD_LSE]->stride, 3 * sizeof(int64_t));
	d->window = r->win.window;
	d->window_left = r->win.window_left;
	d->window_right = r->win.window_right;
	d->softcap = r->win.softcap;
}

/* The layout part of the descriptor and the index sources; lengths of 0 are found later. */
static void fill_layout(const struct fa_proto_req *req, struct backend_infer *bi)
{
	const __typeof__(req->u.infer) *r = &req->u.infer;
	struct fa_attn_infer_desc *d = &bi->desc;
	bool varlen = req->op == FA_OP_ATTN_VARLEN;

	if (r->cu_q.region != 0) {
		d->total_q = r->q.shape[1];
		d->fwd.B = r->cu_q.shape[0] - 1;
		d->fwd.Sq = r->max_q != 0 ? (int64_t)r->max_q : d->total_q;
		bi->find_max_q = r->max_q == 0;
	} else {
		d->fwd.Sq = r->q.shape[1];
	}
	if (varlen) {
		d->kv = FA_KV_PACKED;
		d->total_k = r->k.shape[1];
		d->fwd.Sk = r->max_k != 0 ? (int64_t)r->max_k : d->total_k;
		bi->find_max_k = r->max_k == 0;
		return;
	}
	d->fwd.B = r->cache_len.shape[0];
	bi->find_max_k = true; /* no max_seqlen_k on the wire: the longest cache */
	if (r->page_table.region != 0) {
		d->kv = FA_KV_PAGED;
		d->pages = r->k.shape[0];
		d->page_size = r->k.shape[1];
		d->pt_cols = r->page_table.shape[1];
		d->fwd.Sk = d->pt_cols * d->page_size; /* a bound until the lengths are read */
	} else {
		d->kv = FA_KV_CACHE;
		d->cache_rows = r->k.shape[1];
		d->fwd.Sk = d->cache_rows;
	}
}

fa_status validate_attn_infer(const struct session *s, const struct fa_proto_req *req,
                              size_t align, struct validate_infer_result *out, char *err,
                              size_t errlen)
{
	const __typeof__(req->u.infer) *r = &req->u.infer;
	const struct fa_proto_tensor *t[FA_FWD_NTENSORS] = {&r->q, &r->k, &r->v, &r->o, &r->lse};
	const struct fa_proto_index *ix[INFER_NINDEX] = {&r->cu_q, &r->cu_k, &r->cache_len,
	                                                 &r->page_table};
	bool varlen = req->op == FA_OP_ATTN_VARLEN, has_lse = r->lse.region != 0;
	int nt = has_lse ? FA_FWD_NTENSORS : FA_FWD_LSE;
	uint64_t lo[VALIDATE_INFER_N] = {0}, hi[VALIDATE_INFER_N] = {0};
	fa_status st;

	memset(out, 0, sizeof(*out));
	if (err != NULL && errlen > 0)
		err[0] = '\0';

	/* Which memory: regions of this session, intact; index tensors in host memory. */
	for (int i = 0; i < VALIDATE_INFER_N; i++) {
		uint64_t id = i < FA_FWD_NTENSORS ? t[i]->region : ix[i - FA_FWD_NTENSORS]->region;
		if (id == 0 || (i == FA_FWD_LSE && !has_lse))
			continue;
		if ((out->region[i] = session_region_find(s, id)) == NULL)
			return fa_err(err, errlen, FA_EREGION,
			              "%s: region %016" PRIx64 " is not registered in this session",
			              infer_name(i), id);
		if (atomic_load(&out->region[i]->broken))
			return fa_err(err, errlen, FA_ERANGE,
			              "%s: region %016" PRIx64 " lost pages while in use (its shm object "
			              "shrank); unregister it", infer_name(i), id);
		/* device index tensors: only a backend with device memory has such regions, and it
		 * copies them out before checking (backend_infer.h) */
		out->on_device[i] = out->region[i]->kind == FA_REGION_CUDA_IPC;
	}

	/* Types and each tensor's own sizes and strides. */
	int dts[FA_FWD_NTENSORS];
	for (int i = 0; i < FA_FWD_NTENSORS; i++)
		dts[i] = t[i]->dtype;
	if ((st = fa_check_fwd_dtypes(dts, has_lse, err, errlen)) != FA_OK)
		return st;
	for (int i = 0; i < nt; i++)
		if ((st = fa_check_tensor_dims(fa_fwd_names[i], t[i]->shape, t[i]->stride,
		                               i != FA_FWD_LSE, err, errlen)) != FA_OK)
			return st;
	int64_t entries = 0;
	for (int i = 0; i < INFER_NINDEX; i++) {
		struct region *rg = out->region[FA_FWD_NTENSORS + i];
		if (rg == NULL)
			continue;
		if ((st = fa_check_index(backend_infer_names[i], ix[i]->offset, ix[i]->shape,
		                         ix[i]->stride, rg->size, err, errlen)) != FA_OK)
			return st;
		entries += ix[i]->shape[0] > VALIDATE_INFER_MAX_ENTRIES ||
		                   ix[i]->shape[1] > VALIDATE_INFER_MAX_ENTRIES
		               ? VALIDATE_INFER_MAX_ENTRIES + 1
		               : ix[i]->shape[0] * ix[i]->shape[1];
		lo[FA_FWD_NTENSORS + i] = ix[i]->offset;
		const int64_t sh4[4] = {ix[i]->shape[0], ix[i]->shape[1], 1, 1};
		const int64_t st4[4] = {ix[i]->stride[0], ix[i]->stride[1], 0, 0};
		uint64_t ext;
		fa_tensor_extent(4, sh4, st4, 4, NULL, &ext); /* fits: fa_check_index passed */
		hi[FA_FWD_NTENSORS + i] = ix[i]->offset + ext;
	}
	if (entries > VALIDATE_INFER_MAX_ENTRIES)
		return fa_err(err, errlen, FA_ESHAPE,
		              "the index tensors have more than %" PRId64 " entries together",
		              VALIDATE_INFER_MAX_ENTRIES);

	/* Shapes. */
	const int64_t *lse_shape = has_lse ? r->lse.shape : NULL;
	if (varlen)
		st = fa_check_varlen_shapes(r->q.shape, r->k.shape, r->v.shape, r->o.shape, lse_shape,
		                            r->cu_q.shape, r->cu_k.shape, err, errlen);
	else
		st = fa_check_kvcache_shapes(r->q.shape, r->k.shape, r->v.shape, r->o.shape, lse_shape,
		                             r->cache_len.shape,
		                             r->page_table.region ? r->page_table.shape : NULL,
		                             r->cu_q.region ? r->cu_q.shape : NULL, err, errlen);
	if (st != FA_OK)
		return st;

	/* The descriptor and its own checks (head dim, mask, precision, softcap, sizes). */
	struct backend_infer *bi = backend_infer_alloc(req->op);
	if (bi == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	fill_fwd(req, t, has_lse, &bi->desc.fwd);
	fill_layout(req, bi);
	if ((st = fa_attn_fwd_check(&bi->desc.fwd, err, errlen)) != FA_OK)
		goto fail;

	/* Where the bytes are: inside the region, aligned. */
	size_t esz = fa_dtype_size((fa_dtype)r->q.dtype);
	for (int i = 0; i < nt; i++) {
		size_t el = i == FA_FWD_LSE ? sizeof(float) : esz;
		if ((st = fa_check_extent(fa_fwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                          out->region[i]->size, &hi[i], err, errlen)) != FA_OK ||
		    (st = fa_check_align(fa_fwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                         i == FA_FWD_LSE ? 0 : align, err, errlen)) != FA_OK)
			goto fail;
		lo[i] = t[i]->offset;
	}

	/* Outputs overlap nothing else: not the inputs, not the index tensors. */
	bool is_output[VALIDATE_INFER_N] = {[FA_FWD_O] = true, [FA_FWD_LSE] = true};
	struct region *rg[VALIDATE_INFER_N];
	struct fa_check_span span[VALIDATE_INFER_N];
	int n = 0;
	for (int i = 0; i < VALIDATE_INFER_N; i++) {
		if (out->region[i] == NULL)
			continue;
		uint64_t id = i < FA_FWD_NTENSORS ? t[i]->region : ix[i - FA_FWD_NTENSORS]->region;
		is_output[n] = i == FA_FWD_O || i == FA_FWD_LSE;
		rg[n] = out->region[i];
		span[n++] = (struct fa_check_span){infer_name(i), id, out->region[i]->mem_at, lo[i],
		                                   hi[i]};
	}
	if ((st = validate_overlaps(n, is_output, rg, span, err, errlen)) != FA_OK)
		goto fail;

	for (int i = 0; i < INFER_NINDEX; i++) {
		struct region *ir = out->region[FA_FWD_NTENSORS + i];
		if (ir == NULL)
			continue;
		bi->src[i] = (struct backend_index_src){
			.base = (const int32_t *)(const void *)((const char *)ir->base + ix[i]->offset),
			.n0 = ix[i]->shape[0], .n1 = ix[i]->shape[1],
			.s0 = ix[i]->stride[0], .s1 = ix[i]->stride[1]};
	}
	char *b[FA_FWD_NTENSORS] = {0};
	for (int i = 0; i < nt; i++)
		b[i] = (char *)((uintptr_t)out->region[i]->base + t[i]->offset);
	out->q = b[FA_FWD_Q];
	out->k = b[FA_FWD_K];
	out->v = b[FA_FWD_V];
	out->o = b[FA_FWD_O];
	out->lse = has_lse ? (float *)(void *)b[FA_FWD_LSE] : NULL;
	out->bi = bi;
	return FA_OK;
fail:
	backend_infer_free(bi);
	return st;
}
