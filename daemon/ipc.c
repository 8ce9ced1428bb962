/* ipc.c - the SP REP role over a Unix socket (nanomsg's ipc:// transport), on the libuv loop.
 *
 * Why not a library: NNG 1.5.2 (Debian 12's only version) stops accepting for good once any
 * process connects and hangs up before the SP handshake (nanomsg/nng#1518), and nanomsg's own
 * server asserts on one bad frame byte. Either lets one local process take the service down.
 *
 * The wire (sp-ipc-mapping-01 as nanomsg and NNG implement it; checked against real nanomsg REQ
 * sockets, tests/daemon/test_ipc.c):
 *   handshake, both sides at once:  0x00 'S' 'P' 0x00, protocol (u16 BE: REQ 48, REP 49), 0, 0
 *   then every message:            0x01, payload length (u64 BE), payload
 *   request payload (sp-request-reply-01): backtrace words (u32 BE; the last, the REQ's request
 *   id, has the top bit set), then the body. A reply carries the same words, then its body.
 *
 * Everything runs on the loop thread. A connection is a small state machine (handshake, frame
 * header, body) fed by whatever the kernel returns, so messages split across reads or packed
 * several to a read come out the same. A body that did not fit one read is read straight into its
 * own buffer (alloc_cb hands that buffer to libuv), so big messages are copied once.
 *
 * Anything a peer sends can only close that peer's connection. Memory a peer can pin is bounded:
 * a body buffer only up to recv_max, and all of them together up to IPC_PARTIAL_MAX; unread
 * replies up to send_max per connection and IPC_UNSENT_MAX together; connections (fds) up to
 * max_conns, and up to max_conns_per_uid for one peer uid. Time a peer can hold a connection for
 * nothing is bounded too (ipc.h, "Deadlines"): one timer per connection serves whichever deadline
 * applies at the moment (handshake, frame, idle without a session).
 */
#include "ipc.h"

#include <errno.h>
#include <libgen.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fa_bytes.h"
#include "idmap.h"
#include "log.h"
#include "util.h"

#define IPC_PROTO_REQ 48
#define IPC_PROTO_REP 49
#define IPC_MSG_NORMAL 1 /* the only message type nanomsg and NNG send (the draft says 0) */
#define IPC_FRAME_HDR 9

#define IPC_DEFAULT_RECV_MAX (1u << 20)
#define IPC_DEFAULT_HANDSHAKE_MS 5000
#define IPC_DEFAULT_MAX_CONNS 4096
#define IPC_DEFAULT_SEND_MAX ((size_t)16 << 20)
#define IPC_DEFAULT_FRAME_MS 10000
#define IPC_DEFAULT_IDLE_MS 30000
#define IPC_DEFAULT_MAX_CONNS_PER_UID 1024
#define IPC_RECV_MAX_LIMIT ((size_t)1 << 30) /* libuv buffers are sized by unsigned int */
#define IPC_PARTIAL_MAX ((size_t)256 << 20)  /* all half-received bodies together */
#define IPC_UNSENT_MAX ((size_t)256 << 20)   /* all unread replies together */
#define IPC_READ_BUF (64 * 1024)
/* Memory given back after bursts (issue 14: after 300 connections each held a 1 MiB - 1 partial
 * body, the daemon stayed at 265 MB resident long after they closed). A body of this size or
 * more gets its own pages (mmap), unmapped when it is delivered or its connection closes: glibc
 * would serve it from the heap once its dynamic mmap threshold rose past it (the first freed
 * 1 MiB message does that) and keep the heap. Smaller ones and the replies are malloc's; when
 * the bytes held for peers fall below IPC_TRIM_LOW after having passed IPC_TRIM_HIGH,
 * malloc_trim gives the heap's free pages back. */
#define IPC_BODY_MMAP_MIN ((size_t)128 << 10)
#define IPC_TRIM_HIGH ((size_t)8 << 20)
#define IPC_TRIM_LOW ((size_t)1 << 20)
#define IPC_WARN_EVERY_MS 10000

/* Connection ids for the whole process, so that a header kept across ipc_close and ipc_open
 * (a dedupe entry, say) can never reach a newer connection. The first ipc_open starts them at a
 * random point: they appear in the logs of several daemons. */
static atomic_uint_least32_t ipc_next_id;
static atomic_flag ipc_ids_seeded = ATOMIC_FLAG_INIT;

/* What we send on every connection: the REP side of the handshake. */
static const uint8_t ipc_hello[8] = {0x00, 'S', 'P', 0x00, 0x00, IPC_PROTO_REP, 0x00, 0x00};

enum ipc_state {
	IPC_HANDSHAKE, /* head[] collects the peer's 8-byte header */
	IPC_FRAME,     /* head[] collects a 9-byte frame header */
	IPC_BODY,      /* msg collects a body that did not arrive in one read */
};

/* The deadline the connection's timer is set for. */
enum ipc_deadline {
	IPC_DL_NONE,      /* a session holds it, between frames: no deadline */
	IPC_DL_HANDSHAKE, /* the peer's 8 bytes, handshake_ms from accept */
	IPC_DL_FRAME,     /* the frame under way, frame_ms from its first byte */
	IPC_DL_IDLE,      /* no session: the next message, idle_ms from the last one */
};

/* Open connections of one peer uid. */
struct ipc_uid {
	uint32_t uid;
	unsigned conns;
};

struct ipc_conn {
	uv_pipe_t pipe;    /* data = this */
	uv_timer_t timer;  /* the deadline that applies now (deadline) */
	uv_write_t hello;  /* our header */
	struct ipc *ipc;
	struct ipc_peer peer;
	enum ipc_state state;
	bool announced;    /* handshake done: counted, may deliver, gets on_pipe_closed */
	bool closing;      /* uv_close called: no more reads, replies dropped */
	int handles;       /* pipe and timer not yet closed */
	uint8_t head[IPC_FRAME_HDR];
	size_t head_got;
	uint8_t *msg;      /* IPC_BODY: the body being assembled */
	size_t msg_len, msg_got;
	size_t unsent;     /* reply bytes queued in libuv, not yet in the kernel */
	enum ipc_deadline deadline;
	bool framed;       /* a frame ended since the timer was last set */
	unsigned holds;    /* sessions using this connection (ipc_pipe_hold) */
	struct ipc_uid *who; /* the peer uid's count, once known */
};

/* A reply (or its tail) that the kernel did not take at once. */
struct ipc_write {
	uv_write_t req;
	size_t len;
	uint8_t data[];
};

struct ipc {
	uv_loop_t *loop;
	struct ipc_params p;
	char path[108];
	uv_pipe_t server;     /* data = this */
	bool bound;           /* the socket file is ours: dev and ino say which file that is */
	dev_t dev;
	ino_t ino;
	uv_pipe_t refuse;     /* accepts a connection only to close it (limit reached) */
	bool refuse_busy;     /* refuse is closing */
	bool refuse_stalled;  /* a connection is waiting to be refused: the listener is paused */
	bool closing;
	int handles;          /* server, refuse while busy, and each connection: not yet closed */
	void (*done)(void *arg);
	void *done_arg;

	struct idmap conns;   /* id -> struct ipc_conn *, every connection not closing */
	unsigned nconns;      /* connections whose handles are not closed (they hold an fd) */
	unsigned announced;
	size_t unsent;        /* bytes of the struct ipc_write in flight */
	size_t partial;       /* bytes of body buffers being assembled */
	bool trim_due;        /* partial + unsent passed IPC_TRIM_HIGH since the last trim */
	uint64_t trims;       /* malloc_trim calls, for STATS */
	uint64_t refused, warn_ms; /* connections refused; when that was last logged */
	uint64_t warn_uid_ms;      /* when a per-uid refusal was last logged */
	uint32_t self_uid;         /* ours: with uid 0, may use the reserved connections */
	struct idmap uids;         /* uid + 1 -> struct ipc_uid *, uids with open connections */
	struct ipc_counters n;     /* the counters kept as they happen (ipc_counters fills the rest) */
	uint8_t rbuf[IPC_READ_BUF]; /* every read that is not into a body buffer (loop thread) */
};

/* ---- body buffers and memory given back ------------------------------------------------------ */

/* A body buffer of len bytes (> 0): its own pages from IPC_BODY_MMAP_MIN, else malloc's. */
static uint8_t *ipc_body_alloc(size_t len)
{
	if (len < IPC_BODY_MMAP_MIN)
		return malloc(len);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void ipc_body_free(uint8_t *p, size_t len)
{
	if (p == NULL)
		return;
	if (len < IPC_BODY_MMAP_MIN)
		free(p);
	else
		munmap(p, len);
}

/* The bytes held for peers changed: note a high water, give the heap back after it. */
static void ipc_memory_check(struct ipc *ipc)
{
	size_t held = ipc->partial + ipc->unsent;

	if (held >= IPC_TRIM_HIGH) {
		ipc->trim_due = true;
	} else if (ipc->trim_due && held < IPC_TRIM_LOW) {
		ipc->trim_due = false;
		ipc->trims++;
		malloc_trim(0);
	}
}

/* ---- closing ------------------------------------------------------------------------------------ */

/* One of the things ipc_close waits for has closed; the last one ends the ipc. */
static void ipc_release(struct ipc *ipc)
{
	if (--ipc->handles > 0 || !ipc->closing)
		return;
	idmap_fini(&ipc->uids); /* empty: every connection is closed */
	if (ipc->done != NULL)
		ipc->done(ipc->done_arg);
	free(ipc);
}

static void ipc_handle_closed(uv_handle_t *h)
{
	ipc_release(h->data);
}

/* Both handles are closed and every write callback has run (libuv calls those first): report
 * the connection and free it. Reporting here, never inside conn_close, keeps on_pipe_closed out
 * of whatever ipc_* call decided to close (ipc_reply runs inside the daemon's dispatch). */
static void conn_handle_closed(uv_handle_t *h)
{
	struct ipc_conn *c = h->data;
	struct ipc *ipc = c->ipc;

	if (--c->handles > 0)
		return;
	if (c->announced && !ipc->closing)
		ipc->p.on_pipe_closed(ipc->p.arg, &c->peer);
	if (c->msg != NULL) {
		ipc->partial -= c->msg_len;
		ipc_body_free(c->msg, c->msg_len);
		c->msg = NULL;
		ipc_memory_check(ipc);
	}
	if (c->who != NULL && --c->who->conns == 0) {
		idmap_del(&ipc->uids, (uint64_t)c->who->uid + 1);
		free(c->who);
	}
	ipc->nconns--;
	free(c);
	ipc_release(ipc);
}

/* Stop reading and writing on c at once, release it on a later turn. level/why: the log line
 * (why NULL: not logged). */
static void conn_close(struct ipc_conn *c, int level, const char *why)
{
	struct ipc *ipc = c->ipc;

	if (c->closing)
		return;
	c->closing = true;
	if (why != NULL)
		LOG_AT(level, "ipc: closing connection %u (pid %u): %s", c->peer.pipe, c->peer.pid,
		       why);
	idmap_del(&ipc->conns, c->peer.pipe);
	if (c->announced)
		ipc->announced--;
	uv_close((uv_handle_t *)&c->pipe, conn_handle_closed);
	uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
}

/* ---- receiving ---------------------------------------------------------------------------------- */

/* A whole message arrived: split off the backtrace the way NNG's REP does (nanomsg's too) and
 * hand the body over. A message that ends inside its backtrace is not from a REQ socket: close.
 * One with more than IPC_HOPS_MAX words went through too many devices: drop it, keep the peer. */
static void conn_deliver(struct ipc_conn *c, const uint8_t *p, size_t len)
{
	struct ipc *ipc = c->ipc;
	struct ipc_hdr hdr;
	size_t bt = 0;

	c->framed = true;
	for (;;) {
		if (bt / 4 == IPC_HOPS_MAX) {
			log_debug("ipc: dropped a %zu-byte message from connection %u: more than %d "
			          "hops", len, c->peer.pipe, IPC_HOPS_MAX);
			return;
		}
		if (len - bt < 4) {
			conn_close(c, FA_LOG_INFO, "a message without a request id (not a REQ peer)");
			return;
		}
		bt += 4;
		if (p[bt - 4] & 0x80)
			break;
	}
	hdr.len = (uint32_t)(4 + bt);
	fa_put_be32(hdr.b, c->peer.pipe);
	memcpy(hdr.b + 4, p, bt);
	ipc->p.on_recv(ipc->p.arg, &c->peer, &hdr, p + bt, len - bt);
}

/* The body buffer is full. Detached before delivering: on_recv may close anything. */
static void conn_body_done(struct ipc_conn *c)
{
	uint8_t *m = c->msg;
	size_t len = c->msg_len;

	c->msg = NULL;
	c->state = IPC_FRAME;
	c->head_got = 0;
	conn_deliver(c, m, len);
	c->ipc->partial -= len;
	ipc_body_free(m, len);
	ipc_memory_check(c->ipc);
}

/* The peer's 8 bytes are in: only a REQ peer speaking this wire version gets further. */
static void conn_handshake(struct ipc_conn *c)
{
	const uint8_t *h = c->head;
	unsigned proto = (unsigned)h[4] << 8 | h[5];

	if (memcmp(h, "\0SP\0", 4) != 0 || h[6] != 0 || h[7] != 0) {
		conn_close(c, FA_LOG_DEBUG, "not an SP handshake");
		return;
	}
	if (proto != IPC_PROTO_REQ) {
		char why[64];
		snprintf(why, sizeof why, "SP protocol %u, not REQ (%d)", proto, IPC_PROTO_REQ);
		conn_close(c, FA_LOG_DEBUG, why);
		return;
	}
	uv_timer_stop(&c->timer);
	c->deadline = IPC_DL_NONE;
	c->framed = true; /* the idle deadline starts now */
	c->state = IPC_FRAME;
	c->head_got = 0;
	c->announced = true;
	c->ipc->announced++;
	log_debug("ipc: connection %u from uid %u pid %u", c->peer.pipe, c->peer.uid, c->peer.pid);
}

/* A frame header is in. Returns true when the body may follow. */
static bool conn_frame(struct ipc_conn *c, uint64_t *len)
{
	struct ipc *ipc = c->ipc;
	char why[128];

	*len = fa_get_be64(c->head + 1);
	c->head_got = 0;
	if (c->head[0] != IPC_MSG_NORMAL) {
		snprintf(why, sizeof why, "message type %u (only %d exists)", c->head[0],
		         IPC_MSG_NORMAL);
		conn_close(c, FA_LOG_INFO, why);
		return false;
	}
	if (*len > ipc->p.recv_max) {
		snprintf(why, sizeof why, "a %llu-byte message, above the %zu-byte limit",
		         (unsigned long long)*len, ipc->p.recv_max);
		conn_close(c, FA_LOG_INFO, why);
		return false;
	}
	return true;
}

static void conn_timer_cb(uv_timer_t *t);

/* After bytes were taken: set the timer for the deadline that applies now. A frame's deadline
 * runs from its first byte and the idle one from the last message, so the timer is set again
 * only when the kind changes or a frame ended. */
static void conn_rearm(struct ipc_conn *c)
{
	struct ipc *ipc = c->ipc;
	enum ipc_deadline want;
	unsigned ms = 0;

	if (c->closing || c->state == IPC_HANDSHAKE)
		return;
	if (c->state == IPC_BODY || c->head_got > 0) {
		want = IPC_DL_FRAME;
		ms = ipc->p.frame_ms;
	} else if (c->holds == 0) {
		want = IPC_DL_IDLE;
		ms = ipc->p.idle_ms;
	} else {
		want = IPC_DL_NONE;
	}
	if (want != c->deadline || (c->framed && want != IPC_DL_NONE)) {
		c->deadline = want;
		if (want == IPC_DL_NONE)
			uv_timer_stop(&c->timer);
		else if (uv_timer_start(&c->timer, conn_timer_cb, ms, 0) != 0)
			conn_close(c, FA_LOG_ERR, "cannot set the connection's deadline");
	}
	c->framed = false;
}

/* Bytes from the shared read buffer: run them through the state machine. Stops as soon as the
 * connection closes (a callback may close it, or ipc_close may run inside on_recv). */
static void conn_feed(struct ipc_conn *c, const uint8_t *p, size_t n)
{
	struct ipc *ipc = c->ipc;

	while (n > 0 && !c->closing) {
		if (c->state == IPC_BODY) {
			size_t k = c->msg_len - c->msg_got < n ? c->msg_len - c->msg_got : n;
			memcpy(c->msg + c->msg_got, p, k);
			c->msg_got += k;
			p += k;
			n -= k;
			if (c->msg_got == c->msg_len)
				conn_body_done(c);
			continue;
		}
		size_t want = c->state == IPC_HANDSHAKE ? sizeof ipc_hello : IPC_FRAME_HDR;
		size_t k = want - c->head_got < n ? want - c->head_got : n;
		memcpy(c->head + c->head_got, p, k);
		c->head_got += k;
		p += k;
		n -= k;
		if (c->head_got < want)
			return;
		if (c->state == IPC_HANDSHAKE) {
			conn_handshake(c);
			continue;
		}
		uint64_t len;
		if (!conn_frame(c, &len))
			return;
		if (len <= n) { /* the common case: the whole body is here, no copy */
			conn_deliver(c, p, (size_t)len);
			p += len;
			n -= (size_t)len;
			continue;
		}
		if (ipc->partial + len > IPC_PARTIAL_MAX) {
			conn_close(c, FA_LOG_WARNING, "too many large messages arriving at once");
			return;
		}
		if ((c->msg = ipc_body_alloc((size_t)len)) == NULL) {
			conn_close(c, FA_LOG_ERR, "out of memory for a message");
			return;
		}
		ipc->partial += len;
		ipc_memory_check(ipc);
		c->msg_len = (size_t)len;
		c->msg_got = 0;
		c->state = IPC_BODY;
	}
}

/* A body under way is read straight into its own buffer, never past its end; everything else
 * into the shared buffer, which conn_feed empties before libuv asks again. */
static void conn_alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct ipc_conn *c = h->data;
	(void)suggested;

	if (c->msg != NULL)
		*buf = uv_buf_init((char *)c->msg + c->msg_got, (unsigned)(c->msg_len - c->msg_got));
	else
		*buf = uv_buf_init((char *)c->ipc->rbuf, sizeof c->ipc->rbuf);
}

static void conn_read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct ipc_conn *c = s->data;

	if (n < 0) {
		conn_close(c, FA_LOG_DEBUG, n == UV_EOF ? "closed by the peer" : uv_strerror((int)n));
		return;
	}
	if (n == 0 || c->closing)
		return;
	if (c->msg != NULL && buf->base == (char *)c->msg + c->msg_got) {
		c->msg_got += (size_t)n;
		if (c->msg_got == c->msg_len)
			conn_body_done(c);
	} else {
		conn_feed(c, (const uint8_t *)buf->base, (size_t)n);
	}
	conn_rearm(c);
}

/* A deadline passed: the peer's fault, so logged at debug (handshake) or info, not louder. */
static void conn_timer_cb(uv_timer_t *t)
{
	struct ipc_conn *c = t->data;
	struct ipc *ipc = c->ipc;
	char why[128];

	switch (c->deadline) {
	case IPC_DL_HANDSHAKE:
		ipc->n.closed_handshake++;
		conn_close(c, FA_LOG_DEBUG, "no SP handshake in time");
		break;
	case IPC_DL_FRAME:
		ipc->n.closed_frame++;
		snprintf(why, sizeof why, "a message not whole %u ms after it began (uid %u)",
		         ipc->p.frame_ms, c->peer.uid);
		conn_close(c, FA_LOG_INFO, why);
		break;
	case IPC_DL_IDLE:
		ipc->n.closed_idle++;
		snprintf(why, sizeof why, "no session and no message for %u ms (uid %u)",
		         ipc->p.idle_ms, c->peer.uid);
		conn_close(c, FA_LOG_INFO, why);
		break;
	case IPC_DL_NONE:
		break;
	}
}

static void conn_hello_cb(uv_write_t *req, int status)
{
	if (status < 0 && status != UV_ECANCELED)
		conn_close(req->handle->data, FA_LOG_DEBUG, uv_strerror(status));
}

/* ---- accepting ---------------------------------------------------------------------------------- */

static void ipc_refuse(struct ipc *ipc);
static void ipc_connection_cb(uv_stream_t *server, int status);

static void ipc_refuse_closed(uv_handle_t *h)
{
	struct ipc *ipc = h->data;

	ipc->refuse_busy = false;
	if (ipc->refuse_stalled && !ipc->closing)
		ipc_refuse(ipc);
	ipc_release(ipc);
}

/* Take the pending connection off the listener and close it. libuv pauses the listener until
 * each accepted connection is taken, so this must happen even without memory: one spare handle,
 * one connection per loop turn when refusing many, which also paces a flood. */
static void ipc_refuse(struct ipc *ipc)
{
	if (ipc->refuse_busy) {
		ipc->refuse_stalled = true;
		return;
	}
	ipc->refuse_stalled = false;
	if (uv_pipe_init(ipc->loop, &ipc->refuse, 0) != 0)
		return;
	ipc->refuse.data = ipc;
	ipc->refuse_busy = true;
	ipc->handles++;
	/* A failed accept outside the connection callback leaves libuv's listener paused; listening
	 * again re-arms it. */
	if (uv_accept((uv_stream_t *)&ipc->server, (uv_stream_t *)&ipc->refuse) != 0)
		uv_listen((uv_stream_t *)&ipc->server, SOMAXCONN, ipc_connection_cb);
	uv_close((uv_handle_t *)&ipc->refuse, ipc_refuse_closed);
	ipc->refused++;
}

/* Log refusals at most every IPC_WARN_EVERY_MS, with how many there were. */
static void ipc_warn_refused(struct ipc *ipc, const char *why)
{
	uint64_t now = uv_now(ipc->loop);

	if (ipc->warn_ms != 0 && now - ipc->warn_ms < IPC_WARN_EVERY_MS)
		return;
	log_warn("ipc: refusing connections: %s (%llu refused so far)", why,
	         (unsigned long long)ipc->refused);
	ipc->warn_ms = now;
}

/* The caps that need the peer's uid: the reserve (root and our own uid only) and the per-uid
 * cap. Counts c under its uid, or closes it (false). */
static bool conn_count_uid(struct ipc_conn *c)
{
	struct ipc *ipc = c->ipc;
	uint64_t key = (uint64_t)c->peer.uid + 1;
	struct ipc_uid *u = idmap_get(&ipc->uids, key);
	bool admin = c->peer.uid == 0 || c->peer.uid == ipc->self_uid;
	uint64_t now = uv_now(ipc->loop);

	if (!admin && ipc->nconns > ipc->p.max_conns - ipc->p.reserved_conns) {
		conn_close(c, FA_LOG_DEBUG, NULL);
		ipc->refused++;
		ipc_warn_refused(ipc, "the connection limit for users other than root and the "
		                      "daemon's own is reached");
		return false;
	}
	if (u != NULL && u->conns >= ipc->p.max_conns_per_uid) {
		conn_close(c, FA_LOG_DEBUG, NULL);
		ipc->refused++;
		ipc->n.refused_uid++;
		if (ipc->warn_uid_ms == 0 || now - ipc->warn_uid_ms >= IPC_WARN_EVERY_MS) {
			log_warn("ipc: refusing connections of uid %u (pid %u): it holds %u, the "
			         "per-uid limit (%llu refused for this so far)",
			         c->peer.uid, c->peer.pid, u->conns,
			         (unsigned long long)ipc->n.refused_uid);
			ipc->warn_uid_ms = now;
		}
		return false;
	}
	if (u == NULL) {
		if ((u = calloc(1, sizeof(*u))) == NULL ||
		    idmap_put(&ipc->uids, key, u) != FA_OK) {
			free(u);
			conn_close(c, FA_LOG_ERR, "out of memory tracking the connection");
			return false;
		}
		u->uid = c->peer.uid;
	}
	u->conns++;
	c->who = u;
	if (u->conns > ipc->n.uid_peak)
		ipc->n.uid_peak = u->conns;
	return true;
}

/* Who is on the other end, as the kernel recorded it at connect. */
static bool conn_peercred(struct ipc_conn *c)
{
	struct ucred cred;
	socklen_t len = sizeof cred;
	uv_os_fd_t fd;

	if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred)
		return false;
	c->peer.uid = (uint32_t)cred.uid;
	c->peer.pid = (uint32_t)cred.pid;
	return true;
}

/* A new connection: give it an id, learn its peer, say our header at once (nanomsg gives the
 * handshake 1 s) and wait for the peer's, bounded by handshake_ms. */
static void ipc_connection_cb(uv_stream_t *server, int status)
{
	struct ipc *ipc = server->data;
	struct ipc_conn *c;
	int rv;

	if (status < 0) {
		/* libuv already dropped the connection (EMFILE: it accepted and closed it). */
		ipc->refused++;
		ipc_warn_refused(ipc, uv_strerror(status));
		return;
	}
	if (ipc->nconns >= ipc->p.max_conns) {
		ipc_refuse(ipc);
		ipc_warn_refused(ipc, "the connection limit is reached");
		return;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		ipc_refuse(ipc);
		ipc_warn_refused(ipc, "out of memory");
		return;
	}
	c->ipc = ipc;
	uv_pipe_init(ipc->loop, &c->pipe, 0);
	uv_timer_init(ipc->loop, &c->timer);
	c->pipe.data = c;
	c->timer.data = c;
	c->handles = 2;
	ipc->nconns++;
	ipc->handles++;
	if (ipc->nconns > ipc->n.conns_peak)
		ipc->n.conns_peak = ipc->nconns;
	do /* 0 is "none" for idmap; after 2^32 connections ids wrap past 0 and live ones */
		c->peer.pipe = (uint32_t)(atomic_fetch_add(&ipc_next_id, 1) + 1);
	while (c->peer.pipe == 0 || idmap_get(&ipc->conns, c->peer.pipe) != NULL);

	if ((rv = uv_accept(server, (uv_stream_t *)&c->pipe)) != 0) {
		conn_close(c, FA_LOG_WARNING, uv_strerror(rv));
		return;
	}
	if (!conn_peercred(c)) {
		conn_close(c, FA_LOG_WARNING, "no peer credentials (SO_PEERCRED)");
		return;
	}
	if (!conn_count_uid(c))
		return;
	if (idmap_put(&ipc->conns, c->peer.pipe, c) != FA_OK) {
		conn_close(c, FA_LOG_ERR, "out of memory tracking the connection");
		return;
	}
	uv_buf_t hello = uv_buf_init((char *)ipc_hello, sizeof ipc_hello);
	if ((rv = uv_write(&c->hello, (uv_stream_t *)&c->pipe, &hello, 1, conn_hello_cb)) != 0 ||
	    (c->deadline = IPC_DL_HANDSHAKE,
	     rv = uv_timer_start(&c->timer, conn_timer_cb, ipc->p.handshake_ms, 0)) != 0 ||
	    (rv = uv_read_start((uv_stream_t *)&c->pipe, conn_alloc_cb, conn_read_cb)) != 0) {
		conn_close(c, FA_LOG_WARNING, uv_strerror(rv));
		return;
	}
}

/* ---- replying ----------------------------------------------------------------------------------- */

static void ipc_write_cb(uv_write_t *req, int status)
{
	struct ipc_write *w = (struct ipc_write *)req;
	struct ipc_conn *c = req->handle->data;
	struct ipc *ipc = c->ipc;

	c->unsent -= w->len;
	ipc->unsent -= w->len;
	free(w);
	ipc_memory_check(ipc);
	if (status < 0 && status != UV_ECANCELED)
		conn_close(c, FA_LOG_DEBUG, uv_strerror(status));
}

/* Write what the kernel takes now; queue a copy of the rest, within the peer's allowance. */
fa_status ipc_reply(struct ipc *ipc, const struct ipc_hdr *hdr, const void *buf, size_t len)
{
	struct ipc_conn *c;
	struct ipc_write *w;
	uint8_t fh[IPC_FRAME_HDR];
	size_t bt, total, done = 0;
	int rv;

	if (ipc->closing)
		return FA_ECLOSED;
	if (hdr->len < 8 || hdr->len > IPC_HDR_MAX || hdr->len % 4 != 0)
		return FA_EINVAL;
	if ((c = idmap_get(&ipc->conns, fa_get_be32(hdr->b))) == NULL)
		return FA_OK; /* gone: nobody would read it */
	bt = hdr->len - 4;
	total = sizeof fh + bt + len;
	fh[0] = IPC_MSG_NORMAL;
	fa_put_be64(fh + 1, bt + len);
	uv_buf_t v[3] = {uv_buf_init((char *)fh, sizeof fh),
	                 uv_buf_init((char *)hdr->b + 4, (unsigned)bt),
	                 uv_buf_init((char *)buf, (unsigned)len)};
	rv = uv_try_write((uv_stream_t *)&c->pipe, v, len > 0 ? 3 : 2);
	if (rv >= 0)
		done = (size_t)rv;
	else if (rv != UV_EAGAIN) {
		conn_close(c, FA_LOG_DEBUG, uv_strerror(rv));
		return FA_OK;
	}
	if (done == total)
		return FA_OK;

	size_t rest = total - done;
	if (c->unsent + rest > ipc->p.send_max ||
	    (c->unsent > 0 && ipc->unsent + rest > IPC_UNSENT_MAX)) {
		char why[96];
		snprintf(why, sizeof why, "it does not read its replies (%zu bytes queued)",
		         c->unsent);
		conn_close(c, FA_LOG_WARNING, why);
		return FA_OK;
	}
	if ((w = malloc(sizeof(*w) + rest)) == NULL) {
		if (done > 0) /* half a frame is out: the stream cannot be resumed */
			conn_close(c, FA_LOG_ERR, "out of memory for a reply");
		return FA_ENOMEM;
	}
	w->len = rest;
	/* Copy the part of the frame the kernel did not take. */
	uint8_t *d = w->data;
	for (int i = 0; i < 3; i++) {
		size_t l = v[i].len, skip = done < l ? done : l;
		memcpy(d, v[i].base + skip, l - skip);
		d += l - skip;
		done -= skip;
	}
	uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)rest);
	if ((rv = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, ipc_write_cb)) != 0) {
		free(w);
		conn_close(c, FA_LOG_WARNING, uv_strerror(rv));
		return FA_OK;
	}
	c->unsent += rest;
	ipc->unsent += rest;
	ipc_memory_check(ipc);
	return FA_OK;
}

void ipc_pipe_hold(struct ipc *ipc, uint32_t pipe)
{
	struct ipc_conn *c = idmap_get(&ipc->conns, pipe);

	if (c != NULL && c->holds++ == 0)
		conn_rearm(c);
}

void ipc_pipe_release(struct ipc *ipc, uint32_t pipe)
{
	struct ipc_conn *c = idmap_get(&ipc->conns, pipe);

	if (c == NULL || c->holds == 0 || --c->holds > 0)
		return;
	c->framed = true; /* the idle deadline runs from now */
	conn_rearm(c);
}

void ipc_counters(const struct ipc *ipc, struct ipc_counters *out)
{
	size_t pos = 0;
	void *val;

	*out = ipc->n;
	out->conns = ipc->nconns;
	out->uids = (unsigned)idmap_len(&ipc->uids);
	out->refused_limit = ipc->refused - ipc->n.refused_uid;
	out->uid_top = 0;
	out->uid_top_conns = 0;
	out->partial_bytes = ipc->partial;
	out->unsent_bytes = ipc->unsent;
	out->memory_trims = ipc->trims;
	while (idmap_next(&ipc->uids, &pos, NULL, &val)) {
		const struct ipc_uid *u = val;
		if (u->conns > out->uid_top_conns) {
			out->uid_top = u->uid;
			out->uid_top_conns = u->conns;
		}
	}
}

unsigned ipc_pipe_count(const struct ipc *ipc)
{
	return ipc->announced;
}

size_t ipc_sends_pending(const struct ipc *ipc)
{
	return ipc->unsent;
}

/* ---- binding ------------------------------------------------------------------------------------ */

/* Make the path usable: parent directory present, no stale socket file, and no live daemon. */
static fa_status ipc_prepare_path(const char *path, char *err, size_t errlen)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct sockaddr_un sa;
	struct stat st;

	if (strlen(path) >= sizeof(sa.sun_path))
		return fa_err(err, errlen, FA_EINVAL,
		              "socket path %s is %zu bytes; a Unix socket path must be shorter "
		              "than %zu bytes",
		              path, strlen(path), sizeof(sa.sun_path));
	snprintf(dir, sizeof dir, "%s", path);
	char *d = dirname(dir);
	if (stat(d, &st) != 0) {
		if (errno != ENOENT || mkdir(d, 0750) != 0)
			return fa_err(err, errlen, FA_ESYS, "socket directory %s: %s", d,
			              strerror(errno));
		log_notice("ipc: created socket directory %s", d);
	} else if (!S_ISDIR(st.st_mode)) {
		return fa_err(err, errlen, FA_EINVAL, "%s is not a directory", d);
	}

	if (lstat(path, &st) != 0) {
		if (errno == ENOENT)
			return FA_OK;
		return fa_err(err, errlen, FA_ESYS, "socket %s: %s", path, strerror(errno));
	}
	if (!S_ISSOCK(st.st_mode))
		return fa_err(err, errlen, FA_EINVAL, "%s exists and is not a socket; refusing to "
		              "replace it", path);
	/* A socket file: is a daemon behind it? Only a refused connect proves it is stale. The
	 * probe connects and hangs up at once, which a daemon of ours shrugs off. */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fa_err(err, errlen, FA_ESYS, "socket(): %s", strerror(errno));
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path));
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
	int e = errno;
	close(fd);
	if (rc == 0)
		return fa_err(err, errlen, FA_EUNAVAIL,
		              "another daemon is live on %s (it accepted a connection); stop it "
		              "or choose another --socket",
		              path);
	if (e != ECONNREFUSED)
		return fa_err(err, errlen, FA_ESYS, "socket %s: connect test failed: %s", path,
		              strerror(e));
	if (unlink(path) != 0)
		return fa_err(err, errlen, FA_ESYS, "removing the stale socket %s: %s", path,
		              strerror(errno));
	log_notice("ipc: removed stale socket %s (nothing answered on it)", path);
	return FA_OK;
}

/* bind, chmod, then (in ipc_open) listen: nobody can connect before the file has its mode. The
 * socket is made here, not by uv_pipe_bind, because libuv removes the file of a pipe it bound by
 * name when closing it, even when it is another daemon's by then. */
static fa_status ipc_bind(struct ipc *ipc, char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, rv;

	memcpy(sa.sun_path, ipc->path, strlen(ipc->path));
	if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
		return fa_err(err, errlen, FA_ESYS, "socket(): %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		int e = errno;
		close(fd);
		return fa_err(err, errlen, e == EADDRINUSE ? FA_EUNAVAIL : FA_ESYS,
		              "binding %s: %s", ipc->path, strerror(e));
	}
	if (stat(ipc->path, &st) == 0) {
		ipc->bound = true;
		ipc->dev = st.st_dev;
		ipc->ino = st.st_ino;
	}
	if (chmod(ipc->path, ipc->p.mode & 07777) != 0) {
		int e = errno;
		close(fd);
		return fa_err(err, errlen, FA_ESYS, "setting the mode of %s to %04o: %s",
		              ipc->path, ipc->p.mode, strerror(e));
	}
	if ((rv = uv_pipe_open(&ipc->server, fd)) != 0) {
		close(fd);
		return fa_err(err, errlen, FA_ESYS, "uv_pipe_open: %s", uv_strerror(rv));
	}
	return FA_OK;
}

/* Remove the socket file if it is still the one we bound (someone may have replaced it). */
static void ipc_unlink(struct ipc *ipc)
{
	struct stat st;

	if (!ipc->bound || lstat(ipc->path, &st) != 0)
		return;
	if (st.st_dev == ipc->dev && st.st_ino == ipc->ino)
		unlink(ipc->path);
	else
		log_notice("ipc: %s is another socket now; leaving it", ipc->path);
	ipc->bound = false;
}

fa_status ipc_open(struct ipc **out, uv_loop_t *loop, const struct ipc_params *p, char *err,
                   size_t errlen)
{
	struct ipc *ipc;
	uint64_t seed;
	fa_status st;
	int rv;

	*out = NULL;
	if (p->recv_max > IPC_RECV_MAX_LIMIT)
		return fa_err(err, errlen, FA_EINVAL, "receive limit %zu is above %zu bytes",
		              p->recv_max, IPC_RECV_MAX_LIMIT);
	if ((st = ipc_prepare_path(p->path, err, errlen)) != FA_OK)
		return st;
	if ((ipc = calloc(1, sizeof(*ipc))) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	ipc->loop = loop;
	ipc->p = *p;
	snprintf(ipc->path, sizeof ipc->path, "%s", p->path);
	ipc->p.path = ipc->path;
	if (ipc->p.recv_max == 0)
		ipc->p.recv_max = IPC_DEFAULT_RECV_MAX;
	if (ipc->p.handshake_ms == 0)
		ipc->p.handshake_ms = IPC_DEFAULT_HANDSHAKE_MS;
	if (ipc->p.max_conns == 0)
		ipc->p.max_conns = IPC_DEFAULT_MAX_CONNS;
	if (ipc->p.send_max == 0)
		ipc->p.send_max = IPC_DEFAULT_SEND_MAX;
	if (ipc->p.frame_ms == 0)
		ipc->p.frame_ms = IPC_DEFAULT_FRAME_MS;
	if (ipc->p.idle_ms == 0)
		ipc->p.idle_ms = IPC_DEFAULT_IDLE_MS;
	if (ipc->p.max_conns_per_uid == 0)
		ipc->p.max_conns_per_uid = IPC_DEFAULT_MAX_CONNS_PER_UID;
	if (ipc->p.max_conns_per_uid > ipc->p.max_conns)
		ipc->p.max_conns_per_uid = ipc->p.max_conns;
	if (ipc->p.reserved_conns >= ipc->p.max_conns) {
		unsigned max = ipc->p.max_conns;
		free(ipc);
		return fa_err(err, errlen, FA_EINVAL,
		              "%u reserved connections leave none of the %u for other users",
		              p->reserved_conns, max);
	}
	ipc->self_uid = (uint32_t)geteuid();
	idmap_init(&ipc->conns);
	idmap_init(&ipc->uids);
	if (!atomic_flag_test_and_set(&ipc_ids_seeded) && util_random_u64(&seed) == FA_OK)
		atomic_store(&ipc_next_id, (uint32_t)seed);
	if ((rv = uv_pipe_init(loop, &ipc->server, 0)) != 0) {
		free(ipc);
		return fa_err(err, errlen, FA_ESYS, "uv_pipe_init: %s", uv_strerror(rv));
	}
	ipc->server.data = ipc;
	ipc->handles = 1;

	if ((st = ipc_bind(ipc, err, errlen)) != FA_OK)
		goto fail;
	if ((rv = uv_listen((uv_stream_t *)&ipc->server, SOMAXCONN, ipc_connection_cb)) != 0) {
		st = fa_err(err, errlen, FA_ESYS, "listening on %s: %s", ipc->path,
		            uv_strerror(rv));
		goto fail;
	}
	*out = ipc;
	return FA_OK;

fail:
	ipc_close(ipc, NULL, NULL); /* the caller runs the loop to finish it */
	return st;
}

/* ---- closing ------------------------------------------------------------------------------------ */

void ipc_close(struct ipc *ipc, void (*done)(void *arg), void *arg)
{
	uint64_t key;
	void *val;

	ipc->done = done;
	ipc->done_arg = arg;
	ipc->closing = true;
	ipc->refuse_stalled = false;
	while (idmap_first(&ipc->conns, &key, &val))
		conn_close(val, FA_LOG_DEBUG, NULL);
	idmap_fini(&ipc->conns);
	uv_close((uv_handle_t *)&ipc->server, ipc_handle_closed);
	ipc_unlink(ipc);
}
