/* fa_client.c - sessions with the daemon and the calls of the public API.
 *
 * A client holds one session: HELLO opens it on the "anchor" socket, which is kept open and idle
 * until BYE. The daemon ends a session when every connection it used is closed; without an anchor
 * a single call that timed out (whose socket is then closed) could end the session under the
 * client. Every other call takes a socket of the transport's pool, so calls from several threads
 * are in flight at once; nothing is held locked while a request is on the wire.
 *
 * Arguments are checked here before anything is sent (NULL pointers, enum values, shapes, each
 * tensor inside its buffer) by the daemon's own rules (common/fa_check.h), so a bad call costs no
 * round trip and gets the status and detail the daemon would give; the daemon checks everything
 * again, since it cannot trust any client.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fa_check.h"
#include "fa_check_infer.h"
#include "fa_client_int.h"
#include "fa_infer_int.h"
#include "fa_ring.h"

/* The detail text of the last failed call on this thread; see fa_client.h. */
FA_API const char *fa_last_error_detail(void)
{
	return fa__detail();
}

/* ---- configuration --------------------------------------------------------------------------------- */

/* A millisecond count from the environment: a decimal integer in [0, INT_MAX]; anything else is
 * ignored (with a debug note) and def is used. */
static int env_ms(const char *name, int def)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (s == NULL || s[0] == '\0')
		return def;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < 0 || v > INT_MAX) {
		fa__debug("fa: ignoring %s=%s (want milliseconds, 0 or more)", name, s);
		return def;
	}
	return (int)v;
}

/* The socket path for addr: "ipc://PATH" or PATH; NULL means FA_SOCKET, else
 * $XDG_RUNTIME_DIR/fa-daemon/fa.sock, else /run/fa-daemon/fa.sock. Refuses other transports,
 * empty paths and paths a Unix socket cannot hold (nanomsg would abort on 108..127 bytes). */
static fa_status resolve_path(const char *addr, char path[FA_SOCK_PATH_MAX],
                              bool *user_default)
{
	char buf[4096];
	const char *from = "address";

	if (addr == NULL) {
		const char *env = getenv("FA_SOCKET");
		const char *xdg = getenv("XDG_RUNTIME_DIR");
		if (env != NULL && env[0] != '\0') {
			addr = env;
			from = "FA_SOCKET";
		} else if (xdg != NULL && xdg[0] != '\0') {
			snprintf(buf, sizeof buf, "%s/fa-daemon/fa.sock", xdg);
			addr = buf;
			from = "default address (from XDG_RUNTIME_DIR)";
			*user_default = true;
		} else {
			addr = FA_SYSTEM_SOCKET;
		}
	}
	if (strncmp(addr, "ipc://", 6) == 0)
		addr += 6;
	else if (strstr(addr, "://") != NULL)
		return fa__fail(FA_EINVAL, "%s \"%.64s\": only ipc:// addresses are supported", from,
		                addr);
	if (addr[0] == '\0')
		return fa__fail(FA_EINVAL, "%s: empty socket path", from);
	if (strlen(addr) >= FA_SOCK_PATH_MAX)
		return fa__fail(FA_EINVAL, "%s: socket path is %zu bytes; Unix sockets take at most %d",
		                from, strlen(addr), FA_SOCK_PATH_MAX - 1);
	memcpy(path, addr, strlen(addr) + 1);
	return FA_OK;
}

/* This program's name for HELLO (logs and stats on the daemon's side). */
static void program_name(char name[FA_PROTO_NAME_MAX])
{
	FILE *f = fopen("/proc/self/comm", "re");
	size_t n = 0;

	name[0] = '\0';
	if (f != NULL) {
		n = fread(name, 1, FA_PROTO_NAME_MAX - 1, f);
		fclose(f);
	}
	name[n] = '\0';
	name[strcspn(name, "\n")] = '\0';
	if (name[0] == '\0')
		snprintf(name, FA_PROTO_NAME_MAX, "%s", program_invocation_short_name);
}

/* ---- calls ----------------------------------------------------------------------------------------- */

/* Can this process reach a daemon at the socket path at all? Fails fast, before nanomsg (which
 * connects asynchronously and would only show a timeout); probe: also that somebody listens. */
static fa_status check_socket_file(const fa_client *c, bool probe)
{
	return fa__socket_check(c->path, c->path_user_default, probe);
}

/* Open a session: HELLO on a new socket that becomes the anchor. Stores session, epoch, limits. */
static fa_status hello(fa_client *c)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	struct fa_tslot *s = NULL;
	int64_t deadline;
	fa_status st;

	if ((st = check_socket_file(c, true)) != FA_OK)
		return st;
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	/* A short timeout: a socket file without a listener (a dead daemon's) looks like a slow
	 * daemon to nanomsg, and nobody wants to wait 30 s to learn that. */
	deadline = fa__deadline(c->connect_timeout_ms);
	st = fa_transport_acquire(c->tr, deadline, &s);
	if (st == FA_OK) {
		fa__req_init(c, &req, FA_OP_HELLO);
		req.session = 0;
		req.u.hello.pid = (uint32_t)getpid();
		memcpy(req.u.hello.name, c->name, sizeof req.u.hello.name);
		st = fa_transport_roundtrip(c->tr, s, &req, rep, deadline);
		if (st == FA_ETIMEDOUT)
			st = fa__fail(FA_EUNAVAIL, "no daemon answered at %s within %d ms", c->path,
			              c->connect_timeout_ms);
		else if (st == FA_OK)
			st = fa__reply_status(c, rep);
	}
	if (st == FA_OK && rep->u.hello.session == 0)
		st = fa__fail(FA_EPROTO, "the daemon's HELLO reply has session 0");
	if (st == FA_OK) {
		c->session = rep->u.hello.session;
		c->epoch = rep->epoch;
		c->max_msg = rep->u.hello.max_msg;
		c->max_inflight = rep->u.hello.max_inflight;
		c->max_regions = rep->u.hello.max_regions;
		c->backend = rep->u.hello.backend;
		c->anchor = s;
		fa__debug("fa: session %016" PRIx64 " on %s (epoch %016" PRIx64 ", backend %u)",
		          c->session, c->path, c->epoch, (unsigned)c->backend);
	} else {
		fa_transport_release(c->tr, s);
	}
	fa__rep_free(rep);
	return st;
}

/* The session's submission ring: made and handed over with RING_OPEN (on the socket), or none
 * (FA_RING=0; a daemon without rings answers FA_EPROTO or FA_ENOTSUP): the calls then go by the
 * socket, as before. Never fails the session. */
static void ring_start(fa_client *c)
{
	const char *e = getenv("FA_RING");
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	struct fa_ring *r = NULL;
	gid_t gid = 0;
	fa_status st;

	if (e != NULL && strcmp(e, "0") == 0)
		return;
	bool set_gid = fa__socket_gid(c, &gid) && gid != getegid();
	if (fa__ring_create(&r, c->path, c->tr, set_gid, gid) != FA_OK)
		return;
	if ((rep = fa__rep_alloc()) == NULL) {
		fa__ring_free(r);
		return;
	}
	fa__req_init(c, &req, FA_OP_RING_OPEN);
	req.u.reg.kind = FA_REGION_HOST_SHM;
	req.u.reg.size = FA_RING_BYTES;
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "%s", fa__ring_name(r));
	st = fa__call(c, &req, rep, c->connect_timeout_ms);
	if (st == FA_OK && rep->u.reg.region != 0) {
		fa__ring_set_id(r, rep->u.reg.region);
		c->ring = r;
		fa__debug("fa: session %016" PRIx64 ": ring %016" PRIx64, c->session,
		          rep->u.reg.region);
	} else {
		fa__debug("fa: no submission ring (%s: %s); calls go by the socket",
		          fa_status_name(st), fa_last_error_detail());
		fa__ring_free(r);
	}
	fa__rep_free(rep);
	fa__detail_clear();
}

/* End the session: BYE on the anchor (briefly: closing the anchor ends the session anyway once
 * no other socket is open) and give the anchor back. */
static void bye(fa_client *c)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	fa_status st;

	if (c->anchor == NULL)
		return;
	rep = malloc(sizeof *rep);
	if (rep != NULL && check_socket_file(c, false) == FA_OK) {
		fa__req_init(c, &req, FA_OP_BYE);
		st = fa_transport_roundtrip(c->tr, c->anchor, &req, rep,
		                            fa__deadline(c->connect_timeout_ms));
		if (st == FA_OK)
			st = (fa_status)rep->status;
		if (st != FA_OK)
			fa__debug("fa: BYE for session %016" PRIx64 ": %s", c->session,
			          fa_status_name(st));
	}
	fa__rep_free(rep);
	fa_transport_release(c->tr, c->anchor);
	c->anchor = NULL;
}

/* Connect and open a session; see fa_client.h. */
FA_API fa_status fa_client_open(fa_client **out, const char *addr)
{
	fa_client *c;
	fa_status st;

	fa__detail_clear();
	if (out == NULL)
		return fa__fail(FA_EINVAL, "fa_client_open: out is NULL");
	*out = NULL;
	c = calloc(1, sizeof *c);
	if (c == NULL)
		return fa__fail(FA_ENOMEM, "no memory for a client");
	if ((st = resolve_path(addr, c->path, &c->path_user_default)) != FA_OK) {
		free(c);
		return st;
	}
	atomic_init(&c->timeout_ms, env_ms("FA_TIMEOUT_MS", FA_DEFAULT_TIMEOUT_MS));
	atomic_init(&c->seq, 0);
	{
		const char *e = getenv("FA_ASYNC_EVENTS"); /* the old path, for comparisons */
		c->force_events = e != NULL && strcmp(e, "1") == 0;
	}
	{
		int t = atomic_load(&c->timeout_ms);
		int def = (t == 0 || t > FA_DEFAULT_CONNECT_TIMEOUT_MS) ? FA_DEFAULT_CONNECT_TIMEOUT_MS
		                                                        : t;
		c->connect_timeout_ms = env_ms("FA_CONNECT_TIMEOUT_MS", def);
	}
	program_name(c->name);
	if (pthread_mutex_init(&c->lock, NULL) != 0) {
		free(c);
		return fa__fail(FA_ESYS, "pthread_mutex_init failed");
	}
	st = fa_transport_open(&c->tr, c->path);
	if (st == FA_OK)
		st = hello(c);
	if (st != FA_OK) {
		fa_transport_close(c->tr);
		pthread_mutex_destroy(&c->lock);
		free(c);
		return st;
	}
	ring_start(c);
	*out = c;
	return FA_OK;
}

/* Free a buffer's local resources and the object; the daemon side is the caller's business. */
static void buffer_destroy(fa_buffer *b)
{
	if (b->ops != NULL && b->ops->release != NULL)
		b->ops->release(b);
	free(b);
}

/* BYE, free what is left, close the sockets; see fa_client.h. */
FA_API void fa_client_close(fa_client *c)
{
	fa_buffer *b;

	if (c == NULL)
		return;
	bye(c); /* the daemon drops the session's regions (and its ring): no UNREGISTER per buffer */
	fa__ring_free(c->ring); /* before the words: a failed call's done word is written */
	c->ring = NULL;
	pthread_mutex_lock(&c->lock);
	b = c->buffers;
	c->buffers = NULL;
	pthread_mutex_unlock(&c->lock);
	while (b != NULL) {
		fa_buffer *next = b->next;
		buffer_destroy(b);
		b = next;
	}
	for (int i = 0; i < FA_TRANSPORT_MAX_SOCKETS; i++)
		fa_cuda_async_fini(&c->async[i]);
	for (int i = 0; i < FA_WORDS_MAX_CTX; i++)
		fa_cuda_words_fini(&c->words[i]);
	fa_transport_close(c->tr);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Wait for every asynchronous call's completion; see fa_client.h. */
FA_API fa_status fa_client_flush(fa_client *c)
{
	fa__detail_clear();
	if (c == NULL)
		return fa__fail(FA_EINVAL, "fa_client_flush: client is NULL");
	if (c->ring == NULL)
		return FA_OK;
	return fa__ring_flush(c->ring, fa__deadline(atomic_load(&c->timeout_ms)));
}

/* Set the timeout of later calls; see fa_client.h. */
FA_API fa_status fa_client_set_timeout(fa_client *c, int timeout_ms)
{
	fa__detail_clear();
	if (c == NULL)
		return fa__fail(FA_EINVAL, "fa_client_set_timeout: client is NULL");
	if (timeout_ms < 0)
		return fa__fail(FA_EINVAL, "timeout %d ms is negative (0 waits forever)", timeout_ms);
	atomic_store(&c->timeout_ms, timeout_ms);
	return FA_OK;
}

/* The daemon's epoch as of the last HELLO; see fa_client.h. */
FA_API uint64_t fa_client_epoch(const fa_client *c)
{
	return c == NULL ? 0 : c->epoch;
}

/* Statuses after which registering the next buffer is pointless: the daemon is gone, or the new
 * session cannot take more regions. */
static bool status_is_fatal_for_session(fa_status st)
{
	switch (st) {
	case FA_ETIMEDOUT:
	case FA_EUNAVAIL:
	case FA_ECLOSED:
	case FA_ESESSION:
	case FA_EVERSION:
	case FA_ELIMIT:
		return true;
	default:
		return false;
	}
}

/* Register b again on the new session. When the daemon refuses (e.g. the old daemon unlinked the
 * shm name while ending the old session), the buffer is moved to a fresh object and tried once
 * more. */
static fa_status reregister(fa_client *c, fa_buffer *b)
{
	fa_status st = FA_OK;

	b->region = 0;
	if (b->ops->revive != NULL)
		st = b->ops->revive(b, false);
	if (st == FA_OK)
		st = fa__register_region(c, b, &b->region);
	if (st != FA_OK && !status_is_fatal_for_session(st) && b->ops->revive != NULL) {
		fa__debug("fa: re-registering a %s buffer failed (%s: %s); moving it to a new object",
		          b->ops->name, fa_status_name(st), fa_last_error_detail());
		st = b->ops->revive(b, true);
		if (st == FA_OK)
			st = fa__register_region(c, b, &b->region);
	}
	return st;
}

/* A new session and every buffer registered again; see fa_client.h. */
FA_API fa_status fa_client_reconnect(fa_client *c)
{
	fa_status st, first = FA_OK;
	char detail[FA_PROTO_DETAIL_MAX] = "";
	unsigned failed = 0;

	fa__detail_clear();
	if (c == NULL)
		return fa__fail(FA_EINVAL, "fa_client_reconnect: client is NULL");
	/* End the old session if the same daemon still has it (after a restart BYE gets
	 * FA_ESESSION), and close its connections: nothing is in flight, by the contract. */
	bye(c);
	fa__ring_free(c->ring); /* the old session's: the daemon closed it with the session */
	c->ring = NULL;
	fa_transport_drop_idle(c->tr);
	if ((st = hello(c)) != FA_OK)
		return st;
	ring_start(c);
	fa__detail_clear();
	pthread_mutex_lock(&c->lock);
	for (fa_buffer *b = c->buffers; b != NULL; b = b->next) {
		if (first != FA_OK && status_is_fatal_for_session(first)) {
			b->region = 0;
			failed++;
			continue;
		}
		st = reregister(c, b);
		if (st != FA_OK) {
			failed++;
			if (first == FA_OK) {
				first = st;
				snprintf(detail, sizeof detail, "%s", fa_last_error_detail());
			}
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (first != FA_OK)
		return fa__fail(first, "%u buffer(s) could not be registered again; first: %s", failed,
		                detail);
	fa__detail_clear();
	return FA_OK;
}

/* PING; see fa_client.h. */
FA_API fa_status fa_ping(fa_client *c)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	fa_status st;

	fa__detail_clear();
	if (c == NULL)
		return fa__fail(FA_EINVAL, "fa_ping: client is NULL");
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	fa__req_init(c, &req, FA_OP_PING);
	st = fa__call(c, &req, rep, atomic_load(&c->timeout_ms));
	fa__rep_free(rep);
	return st;
}

/* STATS; see fa_client.h. */
FA_API fa_status fa_stats(fa_client *c, char *buf, size_t len)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	fa_status st;

	fa__detail_clear();
	if (c == NULL || buf == NULL || len == 0)
		return fa__fail(FA_EINVAL, "fa_stats: %s", c == NULL     ? "client is NULL"
		                                        : buf == NULL ? "buf is NULL"
		                                                      : "len is 0");
	buf[0] = '\0';
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	fa__req_init(c, &req, FA_OP_STATS);
	st = fa__call(c, &req, rep, atomic_load(&c->timeout_ms));
	if (st == FA_OK) {
		size_t n = strnlen(rep->u.stats.text, sizeof rep->u.stats.text);
		if (n >= len)
			n = len - 1;
		memcpy(buf, rep->u.stats.text, n);
		buf[n] = '\0';
	}
	fa__rep_free(rep);
	return st;
}

/* The daemon's sessions, page by page (FA_PROTO_CLIENTS_MAX a reply); see fa_client.h. */
FA_API fa_status fa_clients(fa_client *c, fa_client_info *out, size_t cap, size_t *n)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	uint64_t after = 0;
	fa_status st;

	fa__detail_clear();
	if (c == NULL || n == NULL || (out == NULL && cap > 0))
		return fa__fail(FA_EINVAL, "fa_clients: %s", c == NULL   ? "client is NULL"
		                                          : n == NULL ? "n is NULL"
		                                                      : "out is NULL with cap > 0");
	*n = 0;
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	for (;;) {
		fa__req_init(c, &req, FA_OP_CLIENTS);
		req.u.clients.after = after;
		if ((st = fa__call(c, &req, rep, atomic_load(&c->timeout_ms))) != FA_OK)
			break;
		for (uint32_t i = 0; i < rep->u.clients.n; i++, (*n)++) {
			const struct fa_proto_client *e = &rep->u.clients.c[i];
			if (*n < cap) {
				fa_client_info *o = &out[*n];
				o->session = e->session;
				o->pid = e->pid;
				o->pid_claimed = e->pid_claimed;
				o->uid = e->uid;
				snprintf(o->command, sizeof o->command, "%s", e->cmd);
				o->regions = e->regions;
				o->bytes = e->bytes;
				o->inflight = e->inflight;
				o->done = e->done;
				o->since_ms = e->since_ms;
			}
			after = e->session;
		}
		if (rep->u.clients.n < FA_PROTO_CLIENTS_MAX)
			break;
	}
	fa__rep_free(rep);
	return st;
}

/* ---- buffers ---------------------------------------------------------------------------------------- */

/* UNREGISTER, release, free; see fa_client.h. */
FA_API fa_status fa_buffer_free(fa_buffer *b)
{
	fa_client *c;
	fa_status st = FA_OK;

	fa__detail_clear();
	if (b == NULL)
		return FA_OK;
	c = b->client;
	pthread_mutex_lock(&c->lock);
	if (b->prev != NULL)
		b->prev->next = b->next;
	else
		c->buffers = b->next;
	if (b->next != NULL)
		b->next->prev = b->prev;
	pthread_mutex_unlock(&c->lock);
	if (b->region != 0) {
		struct fa_proto_req req;
		struct fa_proto_rep *rep = fa__rep_alloc();
		if (rep != NULL) {
			fa__req_init(c, &req, FA_OP_UNREGISTER);
			req.u.unreg.region = b->region;
			st = fa__call(c, &req, rep, atomic_load(&c->timeout_ms));
			fa__rep_free(rep);
		} else {
			st = FA_ENOMEM;
		}
	}
	buffer_destroy(b);
	return st;
}

/* The mapping; see fa_client.h. */
FA_API void *fa_buffer_data(const fa_buffer *b)
{
	return b == NULL ? NULL : b->data;
}

/* The size; see fa_client.h. */
FA_API size_t fa_buffer_size(const fa_buffer *b)
{
	return b == NULL ? 0 : b->size;
}

/* ---- attention --------------------------------------------------------------------------------------- */

/* Check a tensor's buffer (cheap checks, first) and write its region id, offset and layout; see
 * fa_client_int.h (the backward's calls use it too). */
fa_status fa__tensor_buffer(fa_client *c, const char *name, const fa_tensor *t, bool optional,
                            struct fa_proto_tensor *w)
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
	w->region = t->buf->region;
	/* A device buffer starts inside its registered allocation. */
	if (__builtin_add_overflow(t->offset, t->buf->region_offset, &w->offset))
		return fa__fail(FA_ERANGE, "%s: offset %" PRIu64 " overflows", name, t->offset);
	w->dtype = (uint8_t)t->dtype;
	memcpy(w->shape, t->shape, sizeof w->shape);
	memcpy(w->stride, t->stride, sizeof w->stride);
	return FA_OK;
}

/* The window and softcap of every forward-type call; see fa_infer_int.h. Here, not in
 * fa_attn_infer.c, so the calls between the two files go one way. */
fa_status fa__window(int32_t window, int64_t left, int64_t right, double softcap,
                     struct fa_proto_window *w)
{
	fa_status st = fa_check_softcap(softcap, fa__detail(), FA_PROTO_DETAIL_MAX);
	if (st != FA_OK)
		return st;
	w->window = window != 0;
	w->window_left = w->window ? left : 0;
	w->window_right = w->window ? right : 0;
	w->softcap = softcap;
	return FA_OK;
}

/* Check the arguments locally, with the daemon's rules and texts (common/fa_check.h) in the
 * daemon's order (types, each tensor's sizes and strides, shapes, values, extents), and fill the
 * request. The daemon alone checks overlaps and alignment: they depend on its regions (two
 * buffers may be one memory, which only the daemon sees) and its backend. */
static fa_status fwd_request(fa_client *c, const fa_attn_fwd_args *a, struct fa_proto_req *req)
{
	const fa_tensor *t[FA_FWD_NTENSORS] = {&a->q, &a->k, &a->v, &a->o, &a->lse};
	struct fa_proto_tensor *w[FA_FWD_NTENSORS] = {&req->u.fwd.q, &req->u.fwd.k, &req->u.fwd.v,
	                                              &req->u.fwd.o, &req->u.fwd.lse};
	bool has_lse = a->lse.buf != NULL;
	int n = has_lse ? FA_FWD_NTENSORS : FA_FWD_LSE;
	char *err = fa__detail();
	size_t errlen = FA_PROTO_DETAIL_MAX;
	int dts[FA_FWD_NTENSORS];
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
	if ((st = fa_check_fwd_shapes(a->q.shape, a->k.shape, a->v.shape, a->o.shape,
	                              has_lse ? a->lse.shape : NULL, err, errlen)) != FA_OK ||
	    (st = fa_check_head_dim(a->q.shape[3], err, errlen)) != FA_OK ||
	    (st = fa_check_mask((int)a->mask, err, errlen)) != FA_OK ||
	    (st = fa_check_precision((int)a->precision, err, errlen)) != FA_OK ||
	    (st = fa_check_scale(a->scale, err, errlen)) != FA_OK)
		return st;
	for (int i = 0; i < n; i++) {
		size_t el = i == FA_FWD_LSE ? sizeof(float) : fa_dtype_size(a->q.dtype);
		if ((st = fa_check_extent(fa_fwd_names[i], t[i]->offset, t[i]->shape, t[i]->stride, el,
		                          t[i]->buf->size, NULL, err, errlen)) != FA_OK)
			return st;
	}
	req->u.fwd.scale = a->scale;
	req->u.fwd.mask = (uint8_t)a->mask;
	req->u.fwd.precision = (uint8_t)a->precision;
	if ((unsigned)a->priority > FA_PRIORITY_LOW)
		return fa_err(err, errlen, FA_EINVAL,
		              "priority %d is not a priority class (0 normal, 1 high, 2 low)",
		              (int)a->priority);
	req->u.fwd.priority = (uint8_t)a->priority;
	return fa__window(a->window, a->window_left, a->window_right, a->softcap, &req->u.fwd.win);
}

/* Forward attention in the daemon; see fa_client.h. */
FA_API fa_status fa_attn_fwd(fa_client *c, const fa_attn_fwd_args *args)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	fa_status st;

	fa__detail_clear();
	if (c == NULL || args == NULL)
		return fa__fail(FA_EINVAL, "fa_attn_fwd: %s is NULL", c == NULL ? "client" : "args");
	fa__req_init(c, &req, FA_OP_ATTN_FWD);
	if ((st = fwd_request(c, args, &req)) != FA_OK)
		return st;
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	st = fa__call(c, &req, rep, atomic_load(&c->timeout_ms));
	fa__rep_free(rep);
	return st;
}

/* Forward attention ordered on the caller's CUDA stream; see fa_client.h. The socket's slot id
 * names the pair of events: ours, recorded on the stream before the request (the daemon's stream
 * waits on it), and the daemon's, recorded after the kernel (the stream waits on it before the
 * call returns). A slot is reused only after that wait is enqueued, which is what makes one
 * daemon event per (session, slot) enough. */
FA_API fa_status fa_attn_fwd_async(fa_client *c, const fa_attn_fwd_args *args, void *stream)
{
	struct fa_proto_req req;
	struct fa_proto_rep *rep;
	struct fa_tslot *s;
	fa_status st;

	fa__detail_clear();
	if (c == NULL || args == NULL)
		return fa__fail(FA_EINVAL, "fa_attn_fwd_async: %s is NULL",
		                c == NULL ? "client" : "args");
	fa__req_init(c, &req, FA_OP_ATTN_FWD);
	if ((st = fwd_request(c, args, &req)) != FA_OK)
		return st;
	const fa_tensor *t[FA_FWD_NTENSORS] = {&args->q, &args->k, &args->v, &args->o, &args->lse};
	if ((st = fa__async_device_only("fa_attn_fwd_async", t, fa_fwd_names, FA_FWD_NTENSORS)) !=
	    FA_OK)
		return st;
	/* Completion words (fa_async.c) wherever the stream's context has them. */
	bool use_events = false;
	if ((st = fa__async_words_call(c, &req, stream, 0, &use_events)) != FA_OK || !use_events)
		return st;
	/* The IPC-event path: no words in this context (FA_ASYNC_EVENTS=1, no 64-bit stream
	 * memory operations). */
	if ((rep = fa__rep_alloc()) == NULL)
		return FA_ENOMEM;
	int64_t deadline = fa__deadline(atomic_load(&c->timeout_ms));
	if ((st = fa_transport_acquire(c->tr, deadline, &s)) != FA_OK) {
		fa__rep_free(rep);
		return st;
	}
	struct fa_async_slot *sl = &c->async[fa_transport_slot_id(s)];
	req.u.fwd.async = true;
	req.u.fwd.slot = (uint32_t)fa_transport_slot_id(s);
	req.u.fwd.has_event = true;
	st = fa_cuda_async_record(sl, stream, req.u.fwd.event);
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
