/* ipc.c - the REP side of the scalability protocols over a Unix socket, on the libuv loop.
 *
 * The wire (nanomsg's sipc, NNG's ipc transport): after connect each side sends 8 bytes
 * "\0SP\0", its protocol (u16 big-endian: REQ 0x30, REP 0x31) and two zero bytes. Then every
 * message is a frame: type byte 1, u64 big-endian length, payload. A request's payload starts
 * with its backtrace: 4-byte words, the last one (the REQ socket's request id) with its top bit
 * set; earlier ones are hops added by devices. A reply carries the same backtrace in front of
 * its body.
 *
 * Each connection has a small state machine (handshake, frame header, payload) fed by uv_read.
 * The peer's uid and pid come from SO_PEERCRED at accept. Replies are uv_writes of one
 * allocation each; a peer that stops reading its replies is disconnected once 64 MiB are queued
 * for it. A frame above recv_max closes its connection (the client refuses to send one).
 */
#include "ipc.h"

#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "idmap.h"
#include "log.h"
#include "util.h"

#define IPC_BACKLOG 128
#define IPC_HANDSHAKE_MS 10000          /* a peer that does not say "SP" by then is dropped */
#define IPC_MAX_CONNS 4096              /* more are accepted and closed at once */
#define IPC_SEND_QUEUE_MAX (64u << 20)  /* queued reply bytes to one peer that does not read */
#define IPC_MAX_HOPS 15
#define IPC_KEEP_BUF 65536              /* a connection keeps a receive buffer up to this size */
#define SP_PROTO_REQ 0x30
#define SP_PROTO_REP 0x31

enum ipc_conn_state {
	IPC_CONN_HANDSHAKE,
	IPC_CONN_OPEN,
	IPC_CONN_CLOSING,
};

struct ipc_conn {
	struct ipc *ipc;
	uv_pipe_t pipe;
	uv_timer_t timer;            /* the handshake deadline */
	int handles;                 /* of pipe and timer, not closed yet */
	enum ipc_conn_state state;
	struct ipc_peer peer;
	bool announced;              /* carried a request: the upper layer hears of its close */
	uint8_t hs[8];               /* the peer's handshake */
	size_t hs_got;
	uint8_t fh[9];               /* the current frame's header */
	size_t fh_got;
	uint8_t *msg;                /* the current frame's payload */
	size_t msg_len, msg_got, msg_cap;
	size_t queued;               /* reply bytes handed to uv_write, not completed */
};

struct ipc {
	uv_loop_t *loop;
	struct ipc_params p;
	char path[108];
	uv_pipe_t server;
	dev_t dev;                   /* our socket file, so we never remove another daemon's */
	ino_t ino;
	bool bound;
	struct idmap conns;          /* connection id -> struct ipc_conn* (not closing) */
	uint32_t next_id;
	unsigned nopen;              /* handshake done */
	unsigned nconns;             /* all, handshaking included */
	size_t pending;              /* reply bytes queued, all connections */
	bool closing;
	int handles;                 /* the server handle + every connection not yet freed */
	void (*done)(void *arg);
	void *done_arg;
	char rbuf[65536];            /* every read lands here first (the loop is one thread) */
};

struct ipc_write {
	uv_write_t req;
	struct ipc_conn *conn;
	size_t len;
	uint8_t data[];
};

static const uint8_t ipc_handshake[8] = {0, 'S', 'P', 0, 0, SP_PROTO_REP, 0, 0};

/* One handle (the server, or a whole connection) is gone; the last frees the ipc. */
static void ipc_handle_released(struct ipc *ipc)
{
	if (--ipc->handles > 0)
		return;
	if (ipc->done != NULL)
		ipc->done(ipc->done_arg);
	idmap_fini(&ipc->conns);
	free(ipc);
}

/* The listening handle is closed. */
static void ipc_server_closed(uv_handle_t *h)
{
	ipc_handle_released(h->data);
}

/* ---- connections ----------------------------------------------------------------------------- */

static void ipc_conn_handle_closed(uv_handle_t *h)
{
	struct ipc_conn *c = h->data;
	struct ipc *ipc = c->ipc;

	if (--c->handles > 0)
		return;
	/* Reported only now, from a callback of its own: the upper layer may do anything. */
	if (c->announced && !ipc->closing)
		ipc->p.on_pipe_closed(ipc->p.arg, &c->peer);
	free(c->msg);
	free(c);
	ipc_handle_released(ipc);
}

/* Close a connection once: out of the table now, handles closed, memory freed later. */
static void ipc_conn_close(struct ipc_conn *c, const char *why)
{
	struct ipc *ipc = c->ipc;

	if (c->state == IPC_CONN_CLOSING)
		return;
	if (c->state == IPC_CONN_OPEN)
		ipc->nopen--;
	c->state = IPC_CONN_CLOSING;
	ipc->nconns--;
	idmap_del(&ipc->conns, c->peer.pipe);
	log_debug("ipc: connection %u (pid %u) closed: %s", c->peer.pipe, c->peer.pid, why);
	uv_read_stop((uv_stream_t *)&c->pipe);
	/* Pending writes complete with UV_ECANCELED before the close callback. */
	uv_close((uv_handle_t *)&c->pipe, ipc_conn_handle_closed);
	uv_close((uv_handle_t *)&c->timer, ipc_conn_handle_closed);
}

/* A write finished (or was cancelled by a close): account and release it. */
static void ipc_write_cb(uv_write_t *req, int status)
{
	struct ipc_write *w = (struct ipc_write *)req;
	struct ipc_conn *c = w->conn;

	c->queued -= w->len;
	c->ipc->pending -= w->len;
	free(w);
	if (status < 0 && status != UV_ECANCELED)
		ipc_conn_close(c, uv_strerror(status));
}

/* Queue bytes on a connection: prefix (not copied if NULL) then body. */
static fa_status ipc_conn_write(struct ipc_conn *c, const void *pre, size_t prelen,
                                const void *body, size_t len)
{
	struct ipc_write *w = malloc(sizeof(*w) + prelen + len);

	if (w == NULL)
		return FA_ENOMEM;
	w->conn = c;
	w->len = prelen + len;
	if (prelen > 0)
		memcpy(w->data, pre, prelen);
	if (len > 0)
		memcpy(w->data + prelen, body, len);
	uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
	int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, ipc_write_cb);
	if (rc != 0) {
		free(w);
		ipc_conn_close(c, uv_strerror(rc));
		return FA_OK; /* the connection is gone; so is the reply */
	}
	c->queued += w->len;
	c->ipc->pending += w->len;
	return FA_OK;
}

/* A peer that never completed the handshake. */
static void ipc_handshake_timeout(uv_timer_t *t)
{
	ipc_conn_close(t->data, "no handshake within 10 s");
}

/* A whole frame arrived: split off the backtrace and hand the body up. */
static void ipc_conn_deliver(struct ipc_conn *c)
{
	struct ipc *ipc = c->ipc;
	struct ipc_hdr hdr;
	size_t off = 0;

	for (int hops = 0;; hops++) {
		if (off + 4 > c->msg_len || hops > IPC_MAX_HOPS) {
			/* No request id: not a REQ peer (or more hops than the SP limit). */
			ipc_conn_close(c, "a message without a request id");
			return;
		}
		off += 4;
		if (c->msg[off - 4] & 0x80)
			break;
	}
	hdr.len = (uint32_t)(4 + off);
	memcpy(hdr.b, &c->peer.pipe, 4);
	memcpy(hdr.b + 4, c->msg, off);
	c->announced = true;
	ipc->p.on_recv(ipc->p.arg, &c->peer, &hdr, c->msg + off, c->msg_len - off);
}

/* Grow the payload buffer to hold need bytes (never past the frame length). */
static bool ipc_conn_grow(struct ipc_conn *c, size_t need)
{
	size_t cap = c->msg_cap ? c->msg_cap : 4096;

	if (need <= c->msg_cap)
		return true;
	while (cap < need)
		cap *= 2;
	if (cap > c->msg_len)
		cap = c->msg_len;
	uint8_t *m = realloc(c->msg, cap);
	if (m == NULL)
		return false;
	c->msg = m;
	c->msg_cap = cap;
	return true;
}

/* Feed received bytes through handshake, frame header and payload. */
static void ipc_conn_feed(struct ipc_conn *c, const uint8_t *p, size_t n)
{
	struct ipc *ipc = c->ipc;

	while (n > 0 && c->state != IPC_CONN_CLOSING) {
		size_t take;
		if (c->state == IPC_CONN_HANDSHAKE) {
			take = sizeof c->hs - c->hs_got < n ? sizeof c->hs - c->hs_got : n;
			memcpy(c->hs + c->hs_got, p, take);
			c->hs_got += take;
			if (c->hs_got == sizeof c->hs) {
				uint16_t proto = (uint16_t)(c->hs[4] << 8 | c->hs[5]);
				if (c->hs[0] != 0 || c->hs[1] != 'S' || c->hs[2] != 'P' ||
				    c->hs[3] != 0 || c->hs[6] != 0 || c->hs[7] != 0 ||
				    proto != SP_PROTO_REQ) {
					ipc_conn_close(c, "not an SP REQ peer");
					return;
				}
				c->state = IPC_CONN_OPEN;
				ipc->nopen++;
				uv_timer_stop(&c->timer);
			}
		} else if (c->fh_got < sizeof c->fh) {
			take = sizeof c->fh - c->fh_got < n ? sizeof c->fh - c->fh_got : n;
			memcpy(c->fh + c->fh_got, p, take);
			c->fh_got += take;
			if (c->fh_got == sizeof c->fh) {
				uint64_t len = 0;
				for (int i = 1; i < 9; i++)
					len = len << 8 | c->fh[i];
				if (c->fh[0] != 1) {
					ipc_conn_close(c, "a frame of unknown type");
					return;
				}
				if (len > ipc->p.recv_max) {
					log_info("ipc: connection %u (pid %u) sent a %llu-byte "
					         "message, above "
					         "the %zu-byte limit; closing it",
					         c->peer.pipe, c->peer.pid, (unsigned long long)len,
					         ipc->p.recv_max);
					ipc_conn_close(c, "message too large");
					return;
				}
				if (len < 4) {
					ipc_conn_close(c, "a message without a request id");
					return;
				}
				c->msg_len = (size_t)len;
				c->msg_got = 0;
			}
		} else {
			take = c->msg_len - c->msg_got < n ? c->msg_len - c->msg_got : n;
			if (!ipc_conn_grow(c, c->msg_got + take)) {
				log_err("ipc: out of memory receiving %zu bytes", c->msg_len);
				ipc_conn_close(c, "out of memory");
				return;
			}
			memcpy(c->msg + c->msg_got, p, take);
			c->msg_got += take;
			if (c->msg_got == c->msg_len) {
				ipc_conn_deliver(c);
				c->fh_got = 0;
				c->msg_got = 0;
				if (c->msg_cap > IPC_KEEP_BUF) {
					free(c->msg);
					c->msg = NULL;
					c->msg_cap = 0;
				}
			}
		}
		p += take;
		n -= take;
	}
}

/* Every read goes to the ipc's one buffer, consumed before the next read. */
static void ipc_alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
	struct ipc_conn *c = h->data;
	(void)hint;

	*buf = uv_buf_init(c->ipc->rbuf, sizeof c->ipc->rbuf);
}

/* Bytes or an error from a connection. */
static void ipc_read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct ipc_conn *c = s->data;

	if (n < 0) {
		ipc_conn_close(c, n == UV_EOF ? "peer closed" : uv_strerror((int)n));
		return;
	}
	ipc_conn_feed(c, (const uint8_t *)buf->base, (size_t)n);
}

/* Accept a connection: peer credentials, our handshake, start reading. */
static void ipc_on_connection(uv_stream_t *server, int status)
{
	struct ipc *ipc = server->data;
	struct ipc_conn *c;
	struct ucred cred;
	socklen_t clen = sizeof cred;
	uv_os_fd_t fd;

	if (status < 0) {
		log_err("ipc: accept failed: %s", uv_strerror(status));
		return;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL) {
		log_err("ipc: out of memory accepting a connection");
		return; /* it stays in the backlog; the next accept tries again */
	}
	c->ipc = ipc;
	c->state = IPC_CONN_HANDSHAKE;
	uv_pipe_init(ipc->loop, &c->pipe, 0);
	uv_timer_init(ipc->loop, &c->timer);
	c->pipe.data = c;
	c->timer.data = c;
	c->handles = 2;
	ipc->handles++;
	ipc->nconns++;
	/* Registered before any failure path: ipc_conn_close removes it again. */
	do {
		c->peer.pipe = ipc->next_id++;
	} while (c->peer.pipe == 0 || idmap_get(&ipc->conns, c->peer.pipe) != NULL);
	if (idmap_put(&ipc->conns, c->peer.pipe, c) != FA_OK) {
		ipc_conn_close(c, "out of memory");
		return;
	}
	if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0) {
		ipc_conn_close(c, "accept failed");
		return;
	}
	if (ipc->nconns > IPC_MAX_CONNS) {
		log_warn("ipc: %u connections open, the limit; refusing one", IPC_MAX_CONNS);
		ipc_conn_close(c, "too many connections");
		return;
	}
	if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
		log_err("ipc: no peer credentials (SO_PEERCRED): %s", strerror(errno));
		ipc_conn_close(c, "no peer credentials");
		return;
	}
	c->peer.uid = (uint32_t)cred.uid;
	c->peer.pid = (uint32_t)cred.pid;
	log_debug("ipc: connection %u from uid %u pid %u", c->peer.pipe, c->peer.uid, c->peer.pid);
	uv_timer_start(&c->timer, ipc_handshake_timeout, IPC_HANDSHAKE_MS, 0);
	if (ipc_conn_write(c, ipc_handshake, sizeof ipc_handshake, NULL, 0) != FA_OK) {
		ipc_conn_close(c, "out of memory");
		return;
	}
	if (c->state != IPC_CONN_CLOSING)
		uv_read_start((uv_stream_t *)&c->pipe, ipc_alloc_cb, ipc_read_cb);
}

/* ---- replying -------------------------------------------------------------------------------- */

fa_status ipc_reply(struct ipc *ipc, const struct ipc_hdr *hdr, const void *buf, size_t len)
{
	uint8_t pre[9 + IPC_HDR_MAX];
	struct ipc_conn *c;
	uint32_t id;

	if (ipc->closing)
		return FA_ECLOSED;
	if (hdr->len < 8 || hdr->len > IPC_HDR_MAX)
		return FA_EINVAL;
	memcpy(&id, hdr->b, 4);
	c = idmap_get(&ipc->conns, id);
	if (c == NULL || c->state != IPC_CONN_OPEN) {
		log_debug("ipc: a reply to closed connection %u dropped", id);
		return FA_OK;
	}
	size_t bt = hdr->len - 4;
	if (c->queued + 9 + bt + len > IPC_SEND_QUEUE_MAX) {
		log_warn(
		    "ipc: connection %u (pid %u) does not read its replies (%zu bytes queued); "
		    "closing it",
		    c->peer.pipe, c->peer.pid, c->queued);
		ipc_conn_close(c, "replies not read");
		return FA_OK;
	}
	uint64_t flen = bt + len;
	pre[0] = 1;
	for (int i = 0; i < 8; i++)
		pre[1 + i] = (uint8_t)(flen >> (56 - 8 * i));
	memcpy(pre + 9, hdr->b + 4, bt);
	return ipc_conn_write(c, pre, 9 + bt, buf, len);
}

/* Connections past the handshake. */
unsigned ipc_pipe_count(const struct ipc *ipc)
{
	return ipc->nopen;
}

/* Reply bytes not yet written to the kernel. */
size_t ipc_sends_pending(const struct ipc *ipc)
{
	return ipc->pending;
}

/* ---- binding --------------------------------------------------------------------------------- */

/* Make the path usable: parent directory present, no stale socket file, and no live daemon. */
static fa_status ipc_prepare_path(const char *path, char *err, size_t errlen)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct sockaddr_un sa;
	struct stat st;

	if (strlen(path) >= sizeof(sa.sun_path))
		return util_fail(err, errlen, FA_EINVAL,
		                 "socket path %s is %zu bytes; a Unix socket path must be shorter "
		                 "than %zu bytes",
		                 path, strlen(path), sizeof(sa.sun_path));
	snprintf(dir, sizeof dir, "%s", path);
	char *d = dirname(dir);
	if (stat(d, &st) != 0) {
		if (errno != ENOENT || mkdir(d, 0750) != 0)
			return util_fail(err, errlen, FA_ESYS, "socket directory %s: %s", d,
			                 strerror(errno));
		log_notice("ipc: created socket directory %s", d);
	} else if (!S_ISDIR(st.st_mode)) {
		return util_fail(err, errlen, FA_EINVAL, "%s is not a directory", d);
	}

	if (lstat(path, &st) != 0) {
		if (errno == ENOENT)
			return FA_OK;
		return util_fail(err, errlen, FA_ESYS, "socket %s: %s", path, strerror(errno));
	}
	if (!S_ISSOCK(st.st_mode))
		return util_fail(err, errlen, FA_EINVAL,
		                 "%s exists and is not a socket; refusing to replace it", path);
	/* A socket file: is a daemon behind it? Only a refused connect proves it is stale. */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return util_fail(err, errlen, FA_ESYS, "socket(): %s", strerror(errno));
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, path, strlen(path));
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
	int e = errno;
	close(fd);
	if (rc == 0)
		return util_fail(err, errlen, FA_EUNAVAIL,
		                 "another daemon is live on %s (it accepted a connection); stop it "
		                 "or choose another --socket",
		                 path);
	if (e != ECONNREFUSED)
		return util_fail(err, errlen, FA_ESYS, "socket %s: connect test failed: %s", path,
		                 strerror(e));
	if (unlink(path) != 0)
		return util_fail(err, errlen, FA_ESYS, "removing the stale socket %s: %s", path,
		                 strerror(errno));
	log_notice("ipc: removed stale socket %s (nothing answered on it)", path);
	return FA_OK;
}

/* Bind, set the mode before listening, listen; see ipc.h. */
fa_status ipc_open(struct ipc **out, uv_loop_t *loop, const struct ipc_params *p, char *err,
                   size_t errlen)
{
	struct ipc *ipc;
	struct stat st;
	uint64_t r;
	fa_status st_;
	int rc;

	*out = NULL;
	if ((st_ = ipc_prepare_path(p->path, err, errlen)) != FA_OK)
		return st_;
	if ((ipc = calloc(1, sizeof(*ipc))) == NULL)
		return util_fail(err, errlen, FA_ENOMEM, "out of memory");
	ipc->loop = loop;
	ipc->p = *p;
	snprintf(ipc->path, sizeof ipc->path, "%s", p->path);
	ipc->p.path = ipc->path;
	idmap_init(&ipc->conns);
	/* Connection ids start at a random point: they appear in logs of several daemons. */
	ipc->next_id = util_random_u64(&r) == FA_OK ? (uint32_t)r : 1;
	uv_pipe_init(loop, &ipc->server, 0);
	ipc->server.data = ipc;
	ipc->handles = 1;

	if ((rc = uv_pipe_bind(&ipc->server, ipc->path)) != 0) {
		st_ = util_fail(err, errlen, rc == UV_EADDRINUSE ? FA_EUNAVAIL : FA_ESYS,
		                "binding %s: %s", ipc->path, uv_strerror(rc));
		goto out_close;
	}
	ipc->bound = true;
	/* Before listen(): until then a connect is refused, so the umask's mode is never seen. */
	if (chmod(ipc->path, p->mode) != 0 || stat(ipc->path, &st) != 0) {
		st_ = util_fail(err, errlen, FA_ESYS, "chmod %04o %s: %s", p->mode, ipc->path,
		                strerror(errno));
		goto out_close;
	}
	ipc->dev = st.st_dev;
	ipc->ino = st.st_ino;
	if ((rc = uv_listen((uv_stream_t *)&ipc->server, IPC_BACKLOG, ipc_on_connection)) != 0) {
		st_ = util_fail(err, errlen, FA_ESYS, "listening on %s: %s", ipc->path,
		                uv_strerror(rc));
		goto out_close;
	}
	*out = ipc;
	return FA_OK;

out_close:
	ipc_close(ipc, NULL, NULL); /* the caller runs the loop to finish closing */
	return st_;
}

/* ---- closing --------------------------------------------------------------------------------- */

void ipc_close(struct ipc *ipc, void (*done)(void *arg), void *arg)
{
	struct stat st;
	void *val;

	ipc->done = done;
	ipc->done_arg = arg;
	ipc->closing = true;
	uv_close((uv_handle_t *)&ipc->server, ipc_server_closed);
	while (idmap_first(&ipc->conns, NULL, &val))
		ipc_conn_close(val, "the daemon is stopping");
	/* Remove the socket file, unless another daemon has replaced it since. */
	if (ipc->bound && stat(ipc->path, &st) == 0 && st.st_dev == ipc->dev &&
	    st.st_ino == ipc->ino && unlink(ipc->path) != 0)
		log_err("ipc: removing %s: %s", ipc->path, strerror(errno));
}
