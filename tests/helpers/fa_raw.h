/* fa_raw.h - talking to the daemon without libfaclient's API: raw nanomsg REQ sockets carrying
 * messages encoded by proto/ (or hand-made bytes), POSIX shm objects made by the test itself, and
 * plain AF_UNIX connections for transport-level junk. For tests that must get past the client
 * library's own checks. Header-only: needs nanomsg and proto (the helpers' .c files stay
 * libc-only).
 */
#ifndef FA_RAW_H
#define FA_RAW_H

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "fa/fa_client.h"
#include "fa_proto.h"
#include "fa_test.h"

#define FA_RAW_NO_REPLY (-1) /* the daemon sent nothing back within the timeout */

/* A stand-in buffer pointer for API arguments that only feed fa_raw_fwd_req (never used). */
#define FA_RAW_BUF ((fa_buffer *)(uintptr_t)1)

/* A cooked REQ socket to url with bounded send and receive times. Returns the socket or -1. */
static inline int fa_raw_open(const char *url, int timeout_ms)
{
	int s = nn_socket(AF_SP, NN_REQ);
	if (s < 0)
		return -1;
	int resend = 10 * 60 * 1000; /* never re-send inside a test: duplicates are tested on purpose */
	nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
	nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
	nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &resend, sizeof resend);
	if (nn_connect(s, url) < 0) {
		nn_close(s);
		return -1;
	}
	return s;
}

/* Send bytes; 0 or -1. */
static inline int fa_raw_send(int s, const void *msg, size_t len)
{
	return nn_send(s, msg, len, 0) == (int)len ? 0 : -1;
}

/* Receive one reply into raw (cap bytes; *rawlen its size, may be NULL) and decode it into rep.
 * Returns the reply's status, FA_RAW_NO_REPLY when nothing came, or -2 when the reply itself
 * did not decode (the decoder's reason is printed). */
static inline int fa_raw_recv(int s, struct fa_proto_rep *rep, void *raw, size_t cap,
                              size_t *rawlen)
{
	void *buf = NULL;
	int n = nn_recv(s, &buf, NN_MSG, 0);
	if (n < 0)
		return FA_RAW_NO_REPLY;
	if (raw) {
		size_t k = (size_t)n < cap ? (size_t)n : cap;
		memcpy(raw, buf, k);
		if (rawlen)
			*rawlen = (size_t)n;
	}
	char err[256];
	fa_status st = fa_proto_decode_rep(buf, (size_t)n, rep, err, sizeof err);
	nn_freemsg(buf);
	if (st != FA_OK) {
		fprintf(stderr, "fa_raw: reply does not decode: %s: %s\n", fa_status_name(st), err);
		return -2;
	}
	return rep->status;
}

/* One round trip of raw bytes. */
static inline int fa_raw_call_bytes(int s, const void *msg, size_t len, struct fa_proto_rep *rep)
{
	if (fa_raw_send(s, msg, len) != 0)
		return FA_RAW_NO_REPLY;
	return fa_raw_recv(s, rep, NULL, 0, NULL);
}

/* Encode req with proto/ and make one round trip. */
static inline int fa_raw_call(int s, const struct fa_proto_req *req, struct fa_proto_rep *rep)
{
	unsigned char buf[4096];
	size_t len;
	fa_status st = fa_proto_encode_req(req, buf, sizeof buf, &len);
	if (st != FA_OK) {
		fprintf(stderr, "fa_raw: cannot encode op %u: %s\n", req->op, fa_status_name(st));
		return -3;
	}
	return fa_raw_call_bytes(s, buf, len, rep);
}

/* HELLO on s: the new session's id, or 0. */
static inline uint64_t fa_raw_hello(int s, uint64_t seq, struct fa_proto_rep *rep)
{
	struct fa_proto_req req;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_HELLO;
	req.seq = seq;
	req.u.hello.pid = (uint32_t)getpid();
	snprintf(req.u.hello.name, sizeof req.u.hello.name, "fa-test-raw");
	if (fa_raw_call(s, &req, rep) != FA_OK)
		return 0;
	return rep->u.hello.session;
}

/* A simple request of session sid (PING, STATS, BYE). */
static inline int fa_raw_simple(int s, uint32_t op, uint64_t sid, uint64_t seq,
                                struct fa_proto_rep *rep)
{
	struct fa_proto_req req;
	memset(&req, 0, sizeof req);
	req.op = op;
	req.session = sid;
	req.seq = seq;
	return fa_raw_call(s, &req, rep);
}

/* A shared-memory object made by the test, named as the client library names them. */
struct fa_raw_shm {
	char name[FA_PROTO_SHM_NAME_MAX];
	void *map;
	size_t size;
	int fd;
};

/* Create, size and map "/fa.<uid>.<pid>.<16 hex>" (mode 0660). 0 or -1. */
static inline int fa_raw_shm_create(struct fa_raw_shm *m, size_t size, uint64_t *rng)
{
	memset(m, 0, sizeof *m);
	m->fd = -1;
	snprintf(m->name, sizeof m->name, "/fa.%u.%d.%016llx", (unsigned)getuid(), (int)getpid(),
	         (unsigned long long)fa_rand_next(rng));
	m->fd = shm_open(m->name, O_RDWR | O_CREAT | O_EXCL, 0660);
	if (m->fd < 0)
		return -1;
	if (ftruncate(m->fd, (off_t)size) != 0)
		return -1;
	m->map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	if (m->map == MAP_FAILED) {
		m->map = NULL;
		return -1;
	}
	m->size = size;
	return 0;
}

/* Unmap, close and unlink (the daemon may have unlinked it already: ignored). */
static inline void fa_raw_shm_destroy(struct fa_raw_shm *m)
{
	if (m->map)
		munmap(m->map, m->size);
	if (m->fd >= 0)
		close(m->fd);
	if (m->name[0])
		shm_unlink(m->name);
	memset(m, 0, sizeof *m);
	m->fd = -1;
}

/* REGISTER a host shm name of `size` bytes in session sid. Returns the status; *rid the id. */
static inline int fa_raw_register(int s, uint64_t sid, uint64_t seq, const char *name,
                                  uint64_t size, uint64_t *rid, struct fa_proto_rep *rep)
{
	struct fa_proto_req req;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_REGISTER;
	req.session = sid;
	req.seq = seq;
	req.u.reg.kind = FA_REGION_HOST_SHM;
	req.u.reg.size = size;
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "%s", name);
	int st = fa_raw_call(s, &req, rep);
	if (rid)
		*rid = st == FA_OK ? rep->u.reg.region : 0;
	return st;
}

/* REGISTER a CUDA IPC memory handle (cuIpcGetMemHandle's 64 bytes) of the GPU whose 16-byte UUID
 * is uuid, `size` bytes, in session sid. Returns the status; *rid the id. */
static inline int fa_raw_register_ipc(int s, uint64_t sid, uint64_t seq, const void *handle,
                                      const void *uuid, uint64_t size, uint64_t *rid,
                                      struct fa_proto_rep *rep)
{
	struct fa_proto_req req;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_REGISTER;
	req.session = sid;
	req.seq = seq;
	req.u.reg.kind = FA_REGION_CUDA_IPC;
	req.u.reg.size = size;
	memcpy(req.u.reg.ipc_handle, handle, sizeof req.u.reg.ipc_handle);
	memcpy(req.u.reg.gpu_uuid, uuid, sizeof req.u.reg.gpu_uuid);
	int st = fa_raw_call(s, &req, rep);
	if (rid)
		*rid = st == FA_OK ? rep->u.reg.region : 0;
	return st;
}

/* Make an ATTN_FWD request asynchronous (PROTOCOL.md 4.3) on slot; ev, when not NULL, is the
 * client's event handle (FA_PROTO_IPC_HANDLE_LEN bytes) sent as `ev`. */
static inline void fa_raw_fwd_async(struct fa_proto_req *req, uint32_t slot, const void *ev)
{
	req->u.fwd.async = true;
	req->u.fwd.slot = slot;
	req->u.fwd.has_event = ev != NULL;
	if (ev != NULL)
		memcpy(req->u.fwd.event, ev, sizeof req->u.fwd.event);
}

/* A wire tensor from an API tensor, in region rid (0 for an absent one). */
static inline void fa_raw_tensor(const fa_tensor *t, uint64_t rid, struct fa_proto_tensor *w)
{
	memset(w, 0, sizeof *w);
	if (!t->buf)
		return; /* absent: region 0 */
	w->region = rid;
	w->offset = t->offset;
	w->dtype = (uint8_t)t->dtype;
	memcpy(w->shape, t->shape, sizeof w->shape);
	memcpy(w->stride, t->stride, sizeof w->stride);
}

/* An ATTN_FWD request of session sid from API arguments, every present tensor in region rid. */
static inline void fa_raw_fwd_req(const fa_attn_fwd_args *a, uint64_t sid, uint64_t seq,
                                  uint64_t rid, struct fa_proto_req *req)
{
	memset(req, 0, sizeof *req);
	req->op = FA_OP_ATTN_FWD;
	req->session = sid;
	req->seq = seq;
	fa_raw_tensor(&a->q, rid, &req->u.fwd.q);
	fa_raw_tensor(&a->k, rid, &req->u.fwd.k);
	fa_raw_tensor(&a->v, rid, &req->u.fwd.v);
	fa_raw_tensor(&a->o, rid, &req->u.fwd.o);
	fa_raw_tensor(&a->lse, rid, &req->u.fwd.lse);
	req->u.fwd.scale = a->scale;
	req->u.fwd.mask = (uint8_t)a->mask;
	req->u.fwd.precision = (uint8_t)a->precision;
}

/* A plain stream connection to the daemon's Unix socket (no nanomsg): -1 on failure. */
static inline int fa_raw_unix_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Send on a stream socket without SIGPIPE (the daemon may have dropped us: that is fine). */
static inline void fa_raw_unix_send(int fd, const void *p, size_t n)
{
	const char *b = p;
	while (n > 0) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w <= 0)
			return;
		b += w;
		n -= (size_t)w;
	}
}

/* The SP handshake header for protocol proto (REQ = 0x30, REP = 0x31). */
static inline void fa_raw_sp_header(unsigned char h[8], unsigned proto)
{
	h[0] = 0;
	h[1] = 'S';
	h[2] = 'P';
	h[3] = 0;
	h[4] = (unsigned char)(proto >> 8);
	h[5] = (unsigned char)proto;
	h[6] = 0;
	h[7] = 0;
}

/* An ipc frame header: message type, then a 64-bit big-endian length. */
static inline void fa_raw_frame_header(unsigned char h[9], unsigned type, uint64_t len)
{
	h[0] = (unsigned char)type;
	for (int i = 0; i < 8; i++)
		h[1 + i] = (unsigned char)(len >> (56 - 8 * i));
}

#endif /* FA_RAW_H */
