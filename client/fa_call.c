/* fa_call.c - one call on a client's session: requests, replies and their statuses, buffer
 * registration. Internal (fa__ names): fa_client.c, fa_shm.c and fa_cuda.c build on it; it builds
 * on fa_transport.c and fa_util.c only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fa_client_int.h"

/* A request for op on this client's session, with the next sequence number. Sequence numbers
 * start at 1: 0 marks a reply to a request the daemon could not decode. */
void fa__req_init(fa_client *c, struct fa_proto_req *req, uint32_t op)
{
	memset(req, 0, sizeof *req);
	req->v = FA_PROTO_VERSION;
	req->op = op;
	req->session = c->session;
	req->seq = atomic_fetch_add(&c->seq, 1) + 1;
}

/* The daemon's status from a reply, its detail kept for fa_last_error_detail(). */
fa_status fa__reply_status(const fa_client *c, const struct fa_proto_rep *rep)
{
	if (rep->status == FA_OK)
		return FA_OK;
	if (rep->detail[0] != '\0')
		return fa__fail((fa_status)rep->status, "%s", rep->detail);
	if (rep->status == FA_ESESSION && rep->epoch != c->epoch)
		return fa__fail(FA_ESESSION,
		                "the daemon restarted (epoch %016" PRIx64 ", was %016" PRIx64
		                "); call fa_client_reconnect",
		                rep->epoch, c->epoch);
	return (fa_status)rep->status;
}

/* Is the daemon's socket file gone? (A daemon that stopped removes it.) */
bool fa__socket_file_gone(const fa_client *c)
{
	struct stat sb;

	return stat(c->path, &sb) != 0 && (errno == ENOENT || errno == ENOTDIR);
}

/* Ops the ring carries (the daemon's dispatch_ring_op): small replies, no connection needed. */
bool fa__ring_op(uint32_t op)
{
	return op == FA_OP_PING || op == FA_OP_ATTN_FWD || op == FA_OP_ATTN_BWD ||
	       op == FA_OP_ATTN_VARLEN || op == FA_OP_ATTN_KVCACHE;
}

/* One call on a pooled socket: returns the daemon's status or a transport status; the reply is in
 * *rep when the status is the daemon's. */
fa_status fa__call(fa_client *c, struct fa_proto_req *req, struct fa_proto_rep *rep,
                             int timeout_ms)
{
	int64_t deadline = fa__deadline(timeout_ms);
	struct fa_tslot *s;
	fa_status st;

	/* A stat costs about a microsecond; without it a call to a daemon that stopped would wait
	 * for its whole timeout (nanomsg just keeps trying to reconnect). */
	if (fa__socket_file_gone(c))
		return fa__fail(FA_EUNAVAIL, "no daemon socket at %s: the daemon stopped", c->path);
	if (fa__ring_live(c->ring) && fa__ring_op(req->op)) {
		bool taken = false;
		st = fa__ring_call(c->ring, req, rep, deadline, &taken);
		if (taken)
			return st != FA_OK ? st : fa__reply_status(c, rep);
	}
	st = fa_transport_acquire(c->tr, deadline, &s);
	if (st != FA_OK)
		return st;
	st = fa_transport_roundtrip(c->tr, s, req, rep, deadline);
	fa_transport_release(c->tr, s);
	if (st == FA_ETIMEDOUT && fa__socket_file_gone(c))
		return fa__fail(FA_EUNAVAIL, "no reply, and no daemon socket at %s: the daemon stopped",
		                c->path);
	if (st != FA_OK)
		return st;
	return fa__reply_status(c, rep);
}

/* A reply buffer: large (the STATS text), so on the heap rather than on a caller's stack. */
struct fa_proto_rep *fa__rep_alloc(void)
{
	struct fa_proto_rep *rep = fa__rep_get();

	if (rep == NULL)
		fa__fail(FA_ENOMEM, "no memory for a reply");
	return rep;
}

/* REGISTER b (already described by its ops) and return the region id in *region. */
fa_status fa__register_region(fa_client *c, fa_buffer *b, uint64_t *region)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	fa_status st;

	*region = 0;
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	fa__req_init(c, &req, FA_OP_REGISTER);
	b->ops->describe(b, &req);
	st = fa__call(c, &req, rep, atomic_load(&c->timeout_ms));
	if (st == FA_OK && rep->u.reg.region == 0)
		st = fa__fail(FA_EPROTO, "the daemon's REGISTER reply has region 0");
	if (st == FA_OK)
		*region = rep->u.reg.region;
	fa__rep_free(rep);
	return st;
}

/* Register and list a new buffer; see fa_client_int.h. */
fa_status fa__buffer_register(fa_client *c, fa_buffer *b)
{
	fa_status st = fa__register_region(c, b, &b->region);

	if (st != FA_OK)
		return st;
	pthread_mutex_lock(&c->lock);
	b->prev = NULL;
	b->next = c->buffers;
	if (c->buffers != NULL)
		c->buffers->prev = b;
	c->buffers = b;
	pthread_mutex_unlock(&c->lock);
	return FA_OK;
}

/* The group owning the socket file; see fa_client_int.h. */
bool fa__socket_gid(const fa_client *c, gid_t *gid)
{
	struct stat sb;

	if (stat(c->path, &sb) != 0)
		return false;
	*gid = sb.st_gid;
	return true;
}
