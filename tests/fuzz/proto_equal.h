/* proto_equal.h - field-wise equality of decoded wire structs, for the proto tests and fuzzer.
 *
 * Field-wise rather than memcmp: padding and the union members an op does not use are not part of
 * a message's meaning. Doubles compare by bits (so -0.0 differs from 0.0, as it does on the wire).
 */
#ifndef PROTO_EQUAL_H
#define PROTO_EQUAL_H

#include <stdbool.h>
#include <string.h>

#include "fa_proto.h"

/* Two tensors with the same region, offset, dtype, shape and strides. */
static inline bool proto_tensor_equal(const struct fa_proto_tensor *a,
                                      const struct fa_proto_tensor *b)
{
	return a->region == b->region && a->offset == b->offset && a->dtype == b->dtype &&
	       memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
	       memcmp(a->stride, b->stride, sizeof a->stride) == 0;
}

/* The window and softcap keys of a forward-type request. */
static inline bool proto_window_equal(const struct fa_proto_window *a, const struct fa_proto_window *b)
{
	return a->window == b->window &&
	       (!a->window || (a->window_left == b->window_left && a->window_right == b->window_right)) &&
	       memcmp(&a->softcap, &b->softcap, sizeof(double)) == 0;
}

/* An int32 index tensor (sequence offsets, cache lengths, a page table). */
static inline bool proto_index_equal(const struct fa_proto_index *a, const struct fa_proto_index *b)
{
	return a->region == b->region && (a->region == 0 || (a->offset == b->offset &&
	       memcmp(a->shape, b->shape, sizeof a->shape) == 0 &&
	       memcmp(a->stride, b->stride, sizeof a->stride) == 0));
}

/* Two requests that mean the same: header, then the op's own part. */
static inline bool proto_req_equal(const struct fa_proto_req *a, const struct fa_proto_req *b)
{
	if (a->v != b->v || a->op != b->op || a->seq != b->seq || a->session != b->session)
		return false;
	switch (a->op) {
	case FA_OP_HELLO:
		return a->u.hello.pid == b->u.hello.pid &&
		       strcmp(a->u.hello.name, b->u.hello.name) == 0;
	case FA_OP_REGISTER:
		if (a->u.reg.kind != b->u.reg.kind || a->u.reg.size != b->u.reg.size)
			return false;
		if (a->u.reg.kind == FA_REGION_HOST_SHM)
			return strcmp(a->u.reg.shm_name, b->u.reg.shm_name) == 0;
		return memcmp(a->u.reg.ipc_handle, b->u.reg.ipc_handle, FA_PROTO_IPC_HANDLE_LEN) == 0 &&
		       memcmp(a->u.reg.gpu_uuid, b->u.reg.gpu_uuid, FA_PROTO_UUID_LEN) == 0 &&
		       a->u.reg.words == b->u.reg.words;
	case FA_OP_UNREGISTER:
		return a->u.unreg.region == b->u.unreg.region;
	case FA_OP_RING_OPEN:
		return a->u.reg.size == b->u.reg.size &&
		       strcmp(a->u.reg.shm_name, b->u.reg.shm_name) == 0;
	case FA_OP_ATTN_FWD:
		if (!proto_tensor_equal(&a->u.fwd.q, &b->u.fwd.q) ||
		    !proto_tensor_equal(&a->u.fwd.k, &b->u.fwd.k) ||
		    !proto_tensor_equal(&a->u.fwd.v, &b->u.fwd.v) ||
		    !proto_tensor_equal(&a->u.fwd.o, &b->u.fwd.o))
			return false;
		if (a->u.fwd.lse.region != b->u.fwd.lse.region)
			return false;
		if (a->u.fwd.lse.region != 0 && !proto_tensor_equal(&a->u.fwd.lse, &b->u.fwd.lse))
			return false;
		return memcmp(&a->u.fwd.scale, &b->u.fwd.scale, sizeof(double)) == 0 &&
		       a->u.fwd.mask == b->u.fwd.mask && a->u.fwd.precision == b->u.fwd.precision &&
		       a->u.fwd.priority == b->u.fwd.priority &&
		       proto_window_equal(&a->u.fwd.win, &b->u.fwd.win) &&
		       a->u.fwd.words_region == b->u.fwd.words_region &&
		       (a->u.fwd.words_region == 0 || a->u.fwd.words_seq == b->u.fwd.words_seq);
	case FA_OP_ATTN_BWD: {
		const struct fa_proto_tensor *ta[] = {&a->u.bwd.q,    &a->u.bwd.k,  &a->u.bwd.v,
		                                      &a->u.bwd.o,    &a->u.bwd.lse, &a->u.bwd.dout,
		                                      &a->u.bwd.dq,   &a->u.bwd.dk, &a->u.bwd.dv};
		const struct fa_proto_tensor *tb[] = {&b->u.bwd.q,    &b->u.bwd.k,  &b->u.bwd.v,
		                                      &b->u.bwd.o,    &b->u.bwd.lse, &b->u.bwd.dout,
		                                      &b->u.bwd.dq,   &b->u.bwd.dk, &b->u.bwd.dv};
		for (size_t i = 0; i < sizeof ta / sizeof ta[0]; i++)
			if (!proto_tensor_equal(ta[i], tb[i]))
				return false;
		if (a->u.bwd.async != b->u.bwd.async || a->u.bwd.has_event != b->u.bwd.has_event ||
		    (a->u.bwd.async && a->u.bwd.slot != b->u.bwd.slot) ||
		    (a->u.bwd.has_event &&
		     memcmp(a->u.bwd.event, b->u.bwd.event, FA_PROTO_IPC_HANDLE_LEN) != 0) ||
		    a->u.bwd.words_region != b->u.bwd.words_region ||
		    (a->u.bwd.words_region != 0 && a->u.bwd.words_seq != b->u.bwd.words_seq))
			return false;
		return memcmp(&a->u.bwd.scale, &b->u.bwd.scale, sizeof(double)) == 0 &&
		       a->u.bwd.mask == b->u.bwd.mask && a->u.bwd.precision == b->u.bwd.precision &&
		       a->u.bwd.flags == b->u.bwd.flags && a->u.bwd.priority == b->u.bwd.priority &&
		       proto_window_equal(&a->u.bwd.win, &b->u.bwd.win);
	}
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE: {
		const __typeof__(a->u.infer) *x = &a->u.infer, *y = &b->u.infer;
		if (!proto_tensor_equal(&x->q, &y->q) || !proto_tensor_equal(&x->k, &y->k) ||
		    !proto_tensor_equal(&x->v, &y->v) || !proto_tensor_equal(&x->o, &y->o) ||
		    x->lse.region != y->lse.region ||
		    (x->lse.region != 0 && !proto_tensor_equal(&x->lse, &y->lse)))
			return false;
		return proto_index_equal(&x->cu_q, &y->cu_q) && proto_index_equal(&x->cu_k, &y->cu_k) &&
		       proto_index_equal(&x->cache_len, &y->cache_len) &&
		       proto_index_equal(&x->page_table, &y->page_table) && x->max_q == y->max_q &&
		       x->max_k == y->max_k && memcmp(&x->scale, &y->scale, sizeof(double)) == 0 &&
		       x->mask == y->mask && x->precision == y->precision &&
		       proto_window_equal(&x->win, &y->win) && x->async == y->async &&
		       (!x->async || (x->slot == y->slot && x->words_region == y->words_region &&
		                      x->words_seq == y->words_seq));
	}
	case FA_OP_CLIENTS:
		return a->u.clients.after == b->u.clients.after;
	default:
		return true;
	}
}

/* Two replies that mean the same: header and detail, then (FA_OK only) the op's own part. */
static inline bool proto_rep_equal(const struct fa_proto_rep *a, const struct fa_proto_rep *b)
{
	if (a->v != b->v || a->op != b->op || a->status != b->status || a->seq != b->seq ||
	    a->epoch != b->epoch || strcmp(a->detail, b->detail) != 0)
		return false;
	if (a->status != FA_OK)
		return true;
	switch (a->op) {
	case FA_OP_HELLO:
		return a->u.hello.session == b->u.hello.session &&
		       a->u.hello.max_msg == b->u.hello.max_msg &&
		       a->u.hello.max_inflight == b->u.hello.max_inflight &&
		       a->u.hello.max_regions == b->u.hello.max_regions &&
		       a->u.hello.backend == b->u.hello.backend;
	case FA_OP_REGISTER:
	case FA_OP_RING_OPEN:
		return a->u.reg.region == b->u.reg.region;
	case FA_OP_ATTN_FWD:
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE:
		return a->u.fwd.compute_ns == b->u.fwd.compute_ns;
	case FA_OP_ATTN_BWD:
		return a->u.fwd.compute_ns == b->u.fwd.compute_ns && a->u.fwd.async == b->u.fwd.async &&
		       (!a->u.fwd.async ||
		        memcmp(a->u.fwd.event, b->u.fwd.event, FA_PROTO_IPC_HANDLE_LEN) == 0);
	case FA_OP_STATS:
		return strcmp(a->u.stats.text, b->u.stats.text) == 0;
	case FA_OP_CLIENTS:
		if (a->u.clients.n != b->u.clients.n)
			return false;
		for (uint32_t i = 0; i < a->u.clients.n; i++) {
			const struct fa_proto_client *x = &a->u.clients.c[i], *y = &b->u.clients.c[i];
			if (x->session != y->session || x->pid != y->pid ||
			    x->pid_claimed != y->pid_claimed || x->uid != y->uid ||
			    strcmp(x->cmd, y->cmd) != 0 || x->regions != y->regions ||
			    x->bytes != y->bytes || x->inflight != y->inflight || x->done != y->done ||
			    x->since_ms != y->since_ms)
				return false;
		}
		return true;
	default:
		return true;
	}
}

#endif /* PROTO_EQUAL_H */
