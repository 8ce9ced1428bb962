/* fa_async.c - the completion-word path of every asynchronous call: fa_attn_fwd_async,
 * fa_attn_bwd_async, fa_attn_varlen_async and fa_attn_kvcache_async (one protocol, PROTOCOL.md
 * 4.3 and 11). The forward's IPC-event fallback stays in fa_client.c, the backward's in
 * fa_attn_bwd.c.
 *
 * Why: the backward used to travel by the socket with CUDA IPC events (~125 us of host time per
 * call, same-user daemons only) and, to keep the daemon's stream in the order of the caller's,
 * first waited for every ring call still out. Through the ring with completion words it costs
 * what the forward costs (a few microseconds), works with another user's daemon, and needs no
 * flush: the ring keeps the order of the session's calls.
 *
 * Which way a call goes:
 *   1. ring + words when the ring is live and its header says the daemon knows the op's new keys
 *      (FA_RING_FEAT_*); a daemon that predates them leaves the bit 0;
 *   2. socket + words when there is no ring (FA_RING=0, --max-rings reached); a daemon that
 *      answers FA_EPROTO "key 'wrg' not allowed" (or "unknown key") predates them;
 *   3. otherwise the backward falls back to the IPC-event path (its caller's), the inference
 *      calls, which never had one, return FA_ENOTSUP.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fa_client_int.h"
#include "fa_ring.h"

/* The async fields of a request of op ATTN_FWD, ATTN_BWD, ATTN_VARLEN or ATTN_KVCACHE. */
struct async_fields {
	bool *async;
	uint32_t *slot;
	uint64_t *region, *seq;
};

static struct async_fields async_fields(struct fa_proto_req *req)
{
	if (req->op == FA_OP_ATTN_FWD)
		return (struct async_fields){&req->u.fwd.async, &req->u.fwd.slot,
		                             &req->u.fwd.words_region, &req->u.fwd.words_seq};
	if (req->op == FA_OP_ATTN_BWD)
		return (struct async_fields){&req->u.bwd.async, &req->u.bwd.slot,
		                             &req->u.bwd.words_region, &req->u.bwd.words_seq};
	return (struct async_fields){&req->u.infer.async, &req->u.infer.slot,
	                             &req->u.infer.words_region, &req->u.infer.words_seq};
}

/* fa_ring_lost_fn for completion words: a failed ring call's done word, written here. */
static void lost_words(void *arg, int slot, uint64_t seq)
{
	fa_cuda_words_lost(arg, slot, seq);
}

/* The ring path (1): ready word, the stream's wait for the done word, the entry published; the
 * socket slot s is the words slot and goes back when the completion is read. *taken false:
 * nothing was published (s still held, the ready word unused). */
static fa_status ring_path(fa_client *c, struct fa_words *w, struct fa_tslot *s, void *stream,
                           struct fa_proto_req *req, int64_t deadline, bool *taken)
{
	struct async_fields f = async_fields(req);
	int slot = fa_transport_slot_id(s);
	uint64_t seq = 0;
	fa_status st;

	*taken = true;
	if ((st = fa__ring_sticky(c->ring)) != FA_OK) {
		fa_transport_release(c->tr, s);
		return st;
	}
	*f.async = true;
	*f.slot = (uint32_t)slot;
	*f.region = w->buf->region;
	if ((st = fa_cuda_words_ready(w, slot, stream, &seq)) != FA_OK) {
		fa_transport_release(c->tr, s);
		return st;
	}
	*f.seq = seq;
	/* The stream's wait first: once published, the slot may be released (and reused by another
	 * thread) as soon as the kernel is done. */
	if ((st = fa_cuda_words_wait(w, slot, stream, seq)) != FA_OK) {
		fa_cuda_words_lost(w, slot, seq);
		fa_transport_release(c->tr, s);
		return st;
	}
	st = fa__ring_submit_async(c->ring, req, s, lost_words, w, slot, seq, deadline, taken);
	if (!*taken)
		fa_cuda_words_lost(w, slot, seq);
	return st;
}

/* Whether an FA_EPROTO detail is an older daemon's decoder refusing this call's new keys: "key
 * 'wrg' not allowed in a ATTN_BWD request" (it knew the key for the forward), or "unknown key
 * 'slot'" from one older still. */
static bool old_daemon_refusal(const char *detail)
{
	static const char *const keys[3] = {"'wrg'", "'wq'", "'slot'"};
	if (strstr(detail, "not allowed in") == NULL && strstr(detail, "unknown key") == NULL)
		return false;
	for (int i = 0; i < 3; i++)
		if (strstr(detail, keys[i]) != NULL)
			return true;
	return false;
}

/* The socket path (2) on the held slot s: ready word, the request, and once the daemon enqueued
 * the kernels the stream's wait for the done word. *old: the daemon did not know the keys. */
static fa_status socket_path(fa_client *c, struct fa_words *w, struct fa_tslot *s, void *stream,
                             struct fa_proto_req *req, struct fa_proto_rep *rep,
                             int64_t deadline, bool *old)
{
	struct async_fields f = async_fields(req);
	int slot = fa_transport_slot_id(s);
	uint64_t seq = 0;
	fa_status st;

	*old = false;
	*f.async = true;
	*f.slot = (uint32_t)slot;
	*f.region = w->buf->region;
	if ((st = fa_cuda_words_ready(w, slot, stream, &seq)) != FA_OK)
		return st;
	*f.seq = seq;
	if ((st = fa_transport_roundtrip(c->tr, s, req, rep, deadline)) != FA_OK) {
		fa_cuda_words_lost(w, slot, seq); /* enqueued or not: nobody waits on it for ever */
		return st;
	}
	if (rep->status == FA_EPROTO && old_daemon_refusal(rep->detail)) {
		*old = true; /* nothing enqueued: the ready word is simply never waited for */
		*f.async = false;
		*f.region = *f.seq = 0;
		return FA_EPROTO;
	}
	if ((st = fa__reply_status(c, rep)) != FA_OK)
		return st; /* a refusal enqueued nothing */
	return fa_cuda_words_wait(w, slot, stream, seq);
}

/* See fa_client_int.h. */
fa_status fa__async_device_only(const char *fn, const fa_tensor *const *t,
                                const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (t[i]->buf != NULL && t[i]->buf->ops->kind != FA_REGION_CUDA_IPC)
			return fa__fail(FA_EINVAL, "%s: %s is a host buffer; the asynchronous mode "
			                "takes device buffers (fa_buffer_register_device) only", fn,
			                names[i]);
	return FA_OK;
}

/* See fa_client_int.h. */
fa_status fa__async_words_call(fa_client *c, struct fa_proto_req *req, void *stream,
                               uint32_t feature, bool *use_events)
{
	struct fa_words *w = NULL;
	struct fa_tslot *s = NULL;
	fa_status st;

	*use_events = false;
	if (fa__socket_file_gone(c))
		return fa__fail(FA_EUNAVAIL, "no daemon socket at %s: the daemon stopped", c->path);
	if ((st = fa_cuda_words_get(c, stream, &w)) != FA_OK)
		return st;
	if (w == NULL || w->buf->region == 0) {
		*use_events = true; /* no words in this context (the GPU, FA_ASYNC_EVENTS=1, ...) */
		return FA_OK;
	}
	int64_t deadline = fa__deadline(atomic_load(&c->timeout_ms));
	bool ring = fa__ring_live(c->ring);
	if (ring && !fa__ring_has(c->ring, feature)) {
		*use_events = true; /* an older daemon: it would refuse the keys */
		return FA_OK;
	}
	if (ring && (st = fa__ring_async_room(c->ring, deadline)) != FA_OK)
		return st;
	if ((st = fa_transport_acquire(c->tr, deadline, &s)) != FA_OK)
		return st;
	if (ring && fa__ring_live(c->ring)) {
		bool taken = false;
		st = ring_path(c, w, s, stream, req, deadline, &taken);
		if (taken || st != FA_OK) {
			if (!taken)
				fa_transport_release(c->tr, s);
			return st;
		}
		/* Not published (the ring died meanwhile): the socket must not overtake the calls
		 * still in it, or the daemon's stream could wait for this call's ready word ahead of
		 * the kernel the caller's stream waits for. */
		if ((st = fa__ring_flush(c->ring, deadline)) != FA_OK) {
			fa_transport_release(c->tr, s);
			return st;
		}
	}
	struct fa_proto_rep *rep = fa__rep_alloc();
	if (rep == NULL) {
		fa_transport_release(c->tr, s);
		return FA_ENOMEM;
	}
	bool old = false;
	st = socket_path(c, w, s, stream, req, rep, deadline, &old);
	fa_transport_release(c->tr, s);
	fa__rep_free(rep);
	if (old) {
		fa__detail_clear();
		*use_events = true;
		return FA_OK;
	}
	if (st == FA_ETIMEDOUT && fa__socket_file_gone(c))
		st = fa__fail(FA_EUNAVAIL, "no reply, and no daemon socket at %s: the daemon stopped",
		              c->path);
	return st;
}
