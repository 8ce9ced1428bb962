/* fa_attn_bwd.c - the backward pass's public calls: fa_attn_bwd and fa_attn_bwd_async.
 *
 * The arguments are checked here first, with the daemon's rules and texts (common/fa_check.h)
 * in the daemon's order (buffers, types, each tensor's sizes and strides, shapes, values,
 * extents), as fa_client.c does for the forward, so a bad call costs no round trip. Overlaps and
 * alignment are the daemon's alone, as for the forward: two buffers may be one memory, which
 * only the daemon sees, and the alignment is its backend's.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fa_check.h"
#include "fa_client_int.h"
#include "fa_ring.h"
#include "fa_infer_int.h"

/* The arguments in FA_BWD_* order. */
static void bwd_tensors(const fa_attn_bwd_args *a, const fa_tensor *t[FA_BWD_NTENSORS])
{
	t[FA_BWD_Q] = &a->q;
	t[FA_BWD_K] = &a->k;
	t[FA_BWD_V] = &a->v;
	t[FA_BWD_O] = &a->o;
	t[FA_BWD_LSE] = &a->lse;
	t[FA_BWD_DO] = &a->dout;
	t[FA_BWD_DQ] = &a->dq;
	t[FA_BWD_DK] = &a->dk;
	t[FA_BWD_DV] = &a->dv;
}

/* Check the arguments locally and fill the request's tensors and settings. */
static fa_status bwd_request(fa_client *c, const fa_attn_bwd_args *a, struct fa_proto_req *req)
{
	const fa_tensor *t[FA_BWD_NTENSORS];
	struct fa_proto_tensor *w[FA_BWD_NTENSORS] = {
		[FA_BWD_Q] = &req->u.bwd.q,     [FA_BWD_K] = &req->u.bwd.k,
		[FA_BWD_V] = &req->u.bwd.v,     [FA_BWD_O] = &req->u.bwd.o,
		[FA_BWD_LSE] = &req->u.bwd.lse, [FA_BWD_DO] = &req->u.bwd.dout,
		[FA_BWD_DQ] = &req->u.bwd.dq,   [FA_BWD_DK] = &req->u.bwd.dk,
		[FA_BWD_DV] = &req->u.bwd.dv,
	};
	const int64_t *shapes[FA_BWD_NTENSORS];
	char *err = fa__detail();
	size_t errlen = FA_PROTO_DETAIL_MAX;
	int dts[FA_BWD_NTENSORS];
	fa_status st;

	bwd_tensors(a, t);
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		if (i == FA_BWD_LSE && t[i]->buf == NULL)
			return fa__fail(FA_EINVAL, "lse: no buffer; the backward pass needs the "
			                "forward's logsumexp (run fa_attn_fwd with lse)");
		if ((st = fa__tensor_buffer(c, fa_bwd_names[i], t[i], false, w[i])) != FA_OK)
			return st;
	}
	for (int i = 0; i < FA_BWD_NTENSORS; i++)
		dts[i] = (int)t[i]->dtype;
	if ((st = fa_check_bwd_dtypes(dts, err, errlen)) != FA_OK)
		return st;
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		if ((st = fa_check_tensor_dims(fa_bwd_names[i], t[i]->shape, t[i]->stride,
		                               i != FA_BWD_LSE, err, errlen)) != FA_OK)
			return st;
		shapes[i] = t[i]->shape;
	}
	if ((st = fa_check_bwd_shapes(shapes, err, errlen)) != FA_OK ||
	    (st = fa_check_head_dim(a->q.shape[3], err, errlen)) != FA_OK ||
	    (st = fa_check_mask((int)a->mask, err, errlen)) != FA_OK ||
	    (st = fa_check_precision((int)a->precision, err, errlen)) != FA_OK ||
	    (st = fa_check_scale(a->scale, err, errlen)) != FA_OK)
		return st;
	if ((a->flags & ~(unsigned)FA_BWD_DETERMINISTIC) != 0)
		return fa__fail(FA_EINVAL, "flags 0x%x: unknown bits (FA_BWD_DETERMINISTIC is 0x%x)",
		                a->flags, (unsigned)FA_BWD_DETERMINISTIC);
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		size_t el = i == FA_BWD_LSE ? sizeof(float) : fa_dtype_size(a->q.dtype);
		if ((st = fa_check_extent(fa_bwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride,
		                          el, t[i]->buf->size, NULL, err, errlen)) != FA_OK)
			return st;
	}
	req->u.bwd.scale = a->scale;
	req->u.bwd.mask = (uint8_t)a->mask;
	req->u.bwd.precision = (uint8_t)a->precision;
	req->u.bwd.flags = (a->flags & FA_BWD_DETERMINISTIC) ? FA_PROTO_BWD_DETERMINISTIC : 0;
	if ((unsigned)a->priority > FA_PRIORITY_LOW)
		return fa__fail(FA_EINVAL, "priority %d is not a priority class (0 normal, 1 high, 2 low)",
		                (int)a->priority);
	req->u.bwd.priority = (uint8_t)a->priority;
	return fa__window(a->window, a->window_left, a->window_right, a->softcap, &req->u.bwd.win);
}

/* Backward attention in the daemon; see fa_client.h. */
FA_API fa_status fa_attn_bwd(fa_client *c, const fa_attn_bwd_args *args)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	fa_status st;

	fa__detail_clear();
	if (c == NULL || args == NULL)
		return fa__fail(FA_EINVAL, "fa_attn_bwd: %s is NULL", c == NULL ? "client" : "args");
	fa__req_init(c, &req, FA_OP_ATTN_BWD);
	if ((st = bwd_request(c, args, &req)) != FA_OK)
		return st;
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	st = fa__call(c, &req, rep, atomic_load(&c->timeout_ms));
	fa__rep_free(rep);
	return st;
}

/* Backward attention ordered on the caller's CUDA stream; see fa_client.h. Completion words
 * first (fa_async.c: the ring, or the socket), as the forward's; the IPC-event path below only
 * where the forward's falls back too (no words in stream's context) or the daemon predates the
 * backward's words. The event pair per slot is fa_attn_fwd_async's (fa_client.c says why one
 * daemon event per slot is enough). */
FA_API fa_status fa_attn_bwd_async(fa_client *c, const fa_attn_bwd_args *args, void *stream)
{
	const fa_tensor *t[FA_BWD_NTENSORS];
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	struct fa_tslot *s;
	fa_status st;

	fa__detail_clear();
	if (c == NULL || args == NULL)
		return fa__fail(FA_EINVAL, "fa_attn_bwd_async: %s is NULL",
		                c == NULL ? "client" : "args");
	fa__req_init(c, &req, FA_OP_ATTN_BWD);
	if ((st = bwd_request(c, args, &req)) != FA_OK)
		return st;
	bwd_tensors(args, t);
	if ((st = fa__async_device_only("fa_attn_bwd_async", t, fa_bwd_names, FA_BWD_NTENSORS)) !=
	    FA_OK)
		return st;
	bool use_events = false;
	st = fa__async_words_call(c, &req, stream, FA_RING_FEAT_ASYNC_BWD, &use_events);
	if (st != FA_OK || !use_events)
		return st;
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	int64_t deadline = fa__deadline(atomic_load(&c->timeout_ms));
	/* The event path goes by the socket: the daemon must see every earlier ring call of this
	 * session first, or its stream would wait for this call's event ahead of the forward
	 * kernel that event waits for (a GPU deadlock). So the ring's asynchronous calls finish
	 * first; that costs one wait for the forward kernel. */
	if (fa__ring_live(c->ring) && (st = fa__ring_flush(c->ring, deadline)) != FA_OK) {
		fa__rep_free(rep);
		return st;
	}
	if ((st = fa_transport_acquire(c->tr, deadline, &s)) != FA_OK) {
		fa__rep_free(rep);
		return st;
	}
	struct fa_async_slot *sl = &c->async[fa_transport_slot_id(s)];
	req.u.bwd.async = true;
	req.u.bwd.slot = (uint32_t)fa_transport_slot_id(s);
	req.u.bwd.has_event = true;
	st = fa_cuda_async_record(sl, stream, req.u.bwd.event);
	if (st == FA_OK)
		st = fa_transport_roundtrip(c->tr, s, &req, rep, deadline);
	if (st == FA_OK && (st = fa__reply_status(c, rep)) == FA_OK) {
		if (!rep->u.fwd.async)
			st = fa__fail(FA_EPROTO, "the daemon answered an asynchronous request "
			              "without its completion event");
		else
			st = fa_cuda_async_wait(sl, stream, rep->u.fwd.event);
	}
	fa_transport_release(c->tr, s);
	if (st == FA_ETIMEDOUT && fa__socket_file_gone(c))
		st = fa__fail(FA_EUNAVAIL, "no reply, and no daemon socket at %s: the daemon stopped",
		              c->path);
	fa__rep_free(rep);
	return st;
}
