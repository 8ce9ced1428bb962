/* fa_attn_infer.c - the inference calls: fa_attn_varlen (packed sequences) and fa_attn_kvcache
 * (a contiguous or paged KV cache), and the window/softcap fields every forward-type call has.
 *
 * Arguments are checked here with the daemon's rules and texts (common/fa_check.h,
 * fa_check_infer.h) so a mistake costs no round trip; the index tensors' values (offsets, lengths,
 * page numbers) are the daemon's to check, on its own copy, since only that copy is what it
 * computes from.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fa_check.h"
#include "fa_check_infer.h"
#include "fa_client_int.h"
#include "fa_infer_int.h"
#include "fa_ring.h"

/* Check an index tensor's buffer and layout and write it for the wire (absent and optional:
 * region 0). */
static fa_status index_buffer(fa_client *c, const char *name, const fa_index *t, bool optional,
                              struct fa_proto_index *w)
{
	memset(w, 0, sizeof *w);
	if (t->buf == NULL)
		return optional ? FA_OK : fa__fail(FA_EINVAL, "%s: no buffer", name);
	if (t->buf->client != c)
		return fa__fail(FA_EREGION, "%s: the buffer belongs to another fa_client", name);
	if (t->buf->region == 0)
		return fa__fail(FA_EREGION,
		                "%s: the buffer is not registered (fa_client_reconnect failed for it)",
		                name);
	fa_status st = fa_check_index(name, t->offset, t->shape, t->stride, t->buf->size,
	                              fa__detail(), FA_PROTO_DETAIL_MAX);
	if (st != FA_OK)
		return st;
	w->region = t->buf->region;
	if (__builtin_add_overflow(t->offset, t->buf->region_offset, &w->offset))
		return fa__fail(FA_ERANGE, "%s: offset %" PRIu64 " overflows", name, t->offset);
	memcpy(w->shape, t->shape, sizeof w->shape);
	memcpy(w->stride, t->stride, sizeof w->stride);
	return FA_OK;
}

/* The four tensors and lse of an inference call: buffers, dtypes, each one's sizes, extents. */
static fa_status tensors(fa_client *c, const fa_tensor *const t[FA_FWD_NTENSORS],
                         struct fa_proto_tensor *const w[FA_FWD_NTENSORS])
{
	char *err = fa__detail();
	size_t errlen = FA_PROTO_DETAIL_MAX;
	bool has_lse = t[FA_FWD_LSE]->buf != NULL;
	int n = has_lse ? FA_FWD_NTENSORS : FA_FWD_LSE, dts[FA_FWD_NTENSORS];
	fa_status st;

	for (int i = 0; i < FA_FWD_NTENSORS; i++)
		if ((st = fa__tensor_buffer(c, fa_fwd_names[i], t[i], i == FA_FWD_LSE, w[i])) != FA_OK)
			return st;
	for (int i = 0; i < FA_FWD_NTENSORS; i++)
		dts[i] = (int)t[i]->dtype;
	if ((st = fa_check_fwd_dtypes(dts, has_lse, err, errlen)) != FA_OK)
		return st;
	for (int i = 0; i < n; i++)
		if ((st = fa_check_tensor_dims(fa_fwd_names[i], t[i]->shape, t[i]->stride,
		                               i != FA_FWD_LSE, err, errlen)) != FA_OK)
			return st;
	if ((st = fa_check_head_dim(t[FA_FWD_Q]->shape[3], err, errlen)) != FA_OK)
		return st;
	for (int i = 0; i < n; i++) {
		size_t el = i == FA_FWD_LSE ? sizeof(float) : fa_dtype_size(t[FA_FWD_Q]->dtype);
		if ((st = fa_check_extent(fa_fwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                          t[i]->buf->size, NULL, err, errlen)) != FA_OK)
			return st;
	}
	return FA_OK;
}

/* Scale, mask, precision and the window, as fa_attn_fwd takes them. */
static fa_status settings(double scale, fa_mask mask, fa_precision precision,
                          struct fa_proto_req *req)
{
	char *err = fa__detail();
	fa_status st;

	if ((st = fa_check_mask((int)mask, err, FA_PROTO_DETAIL_MAX)) != FA_OK ||
	    (st = fa_check_precision((int)precision, err, FA_PROTO_DETAIL_MAX)) != FA_OK ||
	    (st = fa_check_scale(scale, err, FA_PROTO_DETAIL_MAX)) != FA_OK)
		return st;
	req->u.infer.scale = scale;
	req->u.infer.mask = (uint8_t)mask;
	req->u.infer.precision = (uint8_t)precision;
	return FA_OK;
}

/* A max_seqlen value: 0 (the daemon finds it) or a length < 2^31. */
static fa_status max_len(const char *name, int64_t v, uint64_t *out)
{
	if (v < 0 || v > INT32_MAX)
		return fa__fail(FA_EINVAL, "%s is %" PRId64 ": 0 (found by the daemon) or a length "
		                "below 2^31", name, v);
	*out = (uint64_t)v;
	return FA_OK;
}

/* Send a checked request and wait for its reply. */
static fa_status infer_call(fa_client *c, struct fa_proto_req *req)
{
	struct fa_proto_rep *rep = fa__rep_alloc();
	if (rep == NULL)
		return FA_ENOMEM;
	fa_status st = fa__call(c, req, rep, atomic_load(&c->timeout_ms));
	fa__rep_free(rep);
	return st;
}

/* The checked request of a variable-length forward (fn: the call's name for the texts). */
static fa_status varlen_request(fa_client *c, const fa_attn_varlen_args *a, const char *fn,
                                struct fa_proto_req *r)
{
	fa_status st;

	fa__detail_clear();
	if (c == NULL || a == NULL)
		return fa__fail(FA_EINVAL, "%s: %s is NULL", fn, c == NULL ? "client" : "args");
	fa__req_init(c, r, FA_OP_ATTN_VARLEN);
	const fa_tensor *t[FA_FWD_NTENSORS] = {&a->q, &a->k, &a->v, &a->o, &a->lse};
	struct fa_proto_tensor *w[FA_FWD_NTENSORS] = {&r->u.infer.q, &r->u.infer.k,
	                                              &r->u.infer.v, &r->u.infer.o,
	                                              &r->u.infer.lse};
	if ((st = tensors(c, t, w)) != FA_OK ||
	    (st = index_buffer(c, "cu_seqlens_q", &a->cu_seqlens_q, false, &r->u.infer.cu_q)) !=
	        FA_OK ||
	    (st = index_buffer(c, "cu_seqlens_k", &a->cu_seqlens_k, false, &r->u.infer.cu_k)) !=
	        FA_OK ||
	    (st = fa_check_varlen_shapes(a->q.shape, a->k.shape, a->v.shape, a->o.shape,
	                                 a->lse.buf != NULL ? a->lse.shape : NULL,
	                                 a->cu_seqlens_q.shape, a->cu_seqlens_k.shape, fa__detail(),
	                                 FA_PROTO_DETAIL_MAX)) != FA_OK ||
	    (st = max_len("max_seqlen_q", a->max_seqlen_q, &r->u.infer.max_q)) != FA_OK ||
	    (st = max_len("max_seqlen_k", a->max_seqlen_k, &r->u.infer.max_k)) != FA_OK ||
	    (st = settings(a->scale, a->mask, a->precision, r)) != FA_OK ||
	    (st = fa__window(a->window, a->window_left, a->window_right, a->softcap,
	                     &r->u.infer.win)) != FA_OK)
		return st;
	return FA_OK;
}

/* The checked request of a forward against a KV cache. */
static fa_status kvcache_request(fa_client *c, const fa_attn_kvcache_args *a, const char *fn,
                                 struct fa_proto_req *r)
{
	fa_status st;

	fa__detail_clear();
	if (c == NULL || a == NULL)
		return fa__fail(FA_EINVAL, "%s: %s is NULL", fn, c == NULL ? "client" : "args");
	fa__req_init(c, r, FA_OP_ATTN_KVCACHE);
	const fa_tensor *t[FA_FWD_NTENSORS] = {&a->q, &a->k, &a->v, &a->o, &a->lse};
	struct fa_proto_tensor *w[FA_FWD_NTENSORS] = {&r->u.infer.q, &r->u.infer.k,
	                                              &r->u.infer.v, &r->u.infer.o,
	                                              &r->u.infer.lse};
	bool paged = a->page_table.buf != NULL, packed = a->cu_seqlens_q.buf != NULL;
	if ((st = tensors(c, t, w)) != FA_OK ||
	    (st = index_buffer(c, "cache_seqlens", &a->cache_seqlens, false,
	                       &r->u.infer.cache_len)) != FA_OK ||
	    (st = index_buffer(c, "page_table", &a->page_table, true, &r->u.infer.page_table)) !=
	        FA_OK ||
	    (st = index_buffer(c, "cu_seqlens_q", &a->cu_seqlens_q, true, &r->u.infer.cu_q)) !=
	        FA_OK ||
	    (st = fa_check_kvcache_shapes(a->q.shape, a->k.shape, a->v.shape, a->o.shape,
	                                  a->lse.buf != NULL ? a->lse.shape : NULL,
	                                  a->cache_seqlens.shape, paged ? a->page_table.shape : NULL,
	                                  packed ? a->cu_seqlens_q.shape : NULL, fa__detail(),
	                                  FA_PROTO_DETAIL_MAX)) != FA_OK)
		return st;
	if (!packed && a->max_seqlen_q != 0)
		return fa__fail(FA_EINVAL, "max_seqlen_q is %" PRId64 " without cu_seqlens_q: dense "
		                "queries have q's length", a->max_seqlen_q);
	if ((st = max_len("max_seqlen_q", a->max_seqlen_q, &r->u.infer.max_q)) != FA_OK ||
	    (st = settings(a->scale, a->mask, a->precision, r)) != FA_OK ||
	    (st = fa__window(a->window, a->window_left, a->window_right, a->softcap,
	                     &r->u.infer.win)) != FA_OK)
		return st;
	return FA_OK;
}

/* Variable-length forward; see fa_client.h. */
FA_API fa_status fa_attn_varlen(fa_client *c, const fa_attn_varlen_args *a)
{
	struct fa_proto_req req;
	fa_status st = varlen_request(c, a, "fa_attn_varlen", &req);
	return st != FA_OK ? st : infer_call(c, &req);
}

/* Forward against a KV cache; see fa_client.h. */
FA_API fa_status fa_attn_kvcache(fa_client *c, const fa_attn_kvcache_args *a)
{
	struct fa_proto_req req;
	fa_status st = kvcache_request(c, a, "fa_attn_kvcache", &req);
	return st != FA_OK ? st : infer_call(c, &req);
}

/* An asynchronous inference call's buffers: every tensor and index table in device memory
 * (the daemon reads the tables in the caller's stream order: a host table would need a rule of
 * its own, PROTOCOL.md 4.3), then the completion-word path (fa_async.c); these calls have no
 * IPC-event fallback. */
static fa_status infer_async(fa_client *c, struct fa_proto_req *req, const char *fn,
                             const fa_tensor *const t[FA_FWD_NTENSORS],
                             const fa_index *const ix[3], const char *const ixn[3], void *stream)
{
	fa_status st = fa__async_device_only(fn, t, fa_fwd_names, FA_FWD_NTENSORS);
	if (st != FA_OK)
		return st;
	for (int i = 0; i < 3; i++)
		if (ix[i] != NULL && ix[i]->buf != NULL &&
		    ix[i]->buf->ops->kind != FA_REGION_CUDA_IPC)
			return fa__fail(FA_EINVAL, "%s: %s is a host buffer; the asynchronous mode reads "
			                "index tables in stream order from device buffers only: copy it "
			                "to the device on the stream", fn, ixn[i]);
	bool no_words = false;
	st = fa__async_words_call(c, req, stream, FA_RING_FEAT_ASYNC_INFER, &no_words);
	if (st == FA_OK && no_words)
		return fa__fail(FA_ENOTSUP, "%s: needs completion words (a GPU with 64-bit stream "
		                "memory operations, FA_ASYNC_EVENTS unset, and a daemon that serves "
		                "asynchronous inference calls): use the synchronous call", fn);
	return st;
}

/* Variable-length forward ordered on the caller's stream; see fa_client.h. */
FA_API fa_status fa_attn_varlen_async(fa_client *c, const fa_attn_varlen_args *a, void *stream)
{
	static const char fn[] = "fa_attn_varlen_async";
	static const char *const ixn[3] = {"cu_seqlens_q", "cu_seqlens_k", ""};
	struct fa_proto_req req;
	fa_status st = varlen_request(c, a, fn, &req);
	if (st != FA_OK)
		return st;
	const fa_tensor *t[FA_FWD_NTENSORS] = {&a->q, &a->k, &a->v, &a->o, &a->lse};
	const fa_index *ix[3] = {&a->cu_seqlens_q, &a->cu_seqlens_k, NULL};
	return infer_async(c, &req, fn, t, ix, ixn, stream);
}

/* Forward against a KV cache ordered on the caller's stream; see fa_client.h. */
FA_API fa_status fa_attn_kvcache_async(fa_client *c, const fa_attn_kvcache_args *a,
                                       void *stream)
{
	static const char fn[] = "fa_attn_kvcache_async";
	static const char *const ixn[3] = {"cache_seqlens", "page_table", "cu_seqlens_q"};
	struct fa_proto_req req;
	fa_status st = kvcache_request(c, a, fn, &req);
	if (st != FA_OK)
		return st;
	const fa_tensor *t[FA_FWD_NTENSORS] = {&a->q, &a->k, &a->v, &a->o, &a->lse};
	const fa_index *ix[3] = {&a->cache_seqlens, &a->page_table, &a->cu_seqlens_q};
	return infer_async(c, &req, fn, t, ix, ixn, stream);
}
