/* ipc.h - the daemon's side of the wire: the scalability-protocols REP role over a Unix socket
 * ("ipc://PATH"), spoken by nanomsg and NNG REQ clients, served on the libuv loop.
 *
 * Requests arrive through on_recv with the connection they came on, its peer uid and pid
 * (SO_PEERCRED, taken at connect) and an opaque routing header; a reply goes back by handing that
 * header to ipc_reply, at any later time. A connection that carried at least one request is
 * reported through on_pipe_closed when it closes. Everything, callbacks included, runs on the
 * loop thread.
 *
 * Why not NNG's listener (the first design): NNG 1.5.2, the Debian package, stops accepting for
 * good when a peer disconnects during the SP handshake (nanomsg/nng#1518, fixed upstream after
 * 1.5.2): one `connect(); close();` from any local process made the daemon deaf. The wire is
 * small (an 8-byte handshake, then frames of a type byte, a 64-bit big-endian length, the
 * request's backtrace and the body), so ipc.c speaks it itself.
 */
#ifndef FA_DAEMON_IPC_H
#define FA_DAEMON_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "fa/fa_client.h"

#define IPC_HDR_MAX 64 /* connection id + a backtrace of at most 15 hops of 4 bytes */

/* The routing header of a request: where its reply must go (our connection id, then the
 * request's backtrace as it arrived: the REQ's request id, after any devices' hops). */
struct ipc_hdr {
	uint32_t len;
	uint8_t b[IPC_HDR_MAX];
};

/* Who sent a request. */
struct ipc_peer {
	uint32_t pipe; /* connection id, unique while the daemon runs */
	uint32_t uid;  /* peer's uid when it connected */
	uint32_t pid;  /* peer's pid when it connected */
};

typedef void (*ipc_recv_fn)(void *arg, const struct ipc_peer *peer, const struct ipc_hdr *hdr,
                            const void *body, size_t len);
typedef void (*ipc_pipe_fn)(void *arg, const struct ipc_peer *peer);

struct ipc;

struct ipc_params {
	const char *path;           /* filesystem path of the socket */
	unsigned mode;              /* permission bits of the socket file */
	size_t recv_max;            /* a larger message closes its connection */
	ipc_recv_fn on_recv;        /* a request arrived */
	ipc_pipe_fn
	    on_pipe_closed; /* a connection that carried requests closed (not at ipc_close) */
	void *arg;
};

/* Bind and start accepting. Refuses a path of >= 108 bytes, a path that exists and is not a
 * socket, and a socket another live process answers on; removes a stale socket file (a connect
 * is refused) first. Creates the parent directory (one level, mode 0750) if missing.
 * Returns FA_OK, FA_EINVAL (path), FA_EUNAVAIL (another daemon is live there), FA_ESYS or
 * FA_ENOMEM, with the reason in err. */
fa_status ipc_open(struct ipc **out, uv_loop_t *loop, const struct ipc_params *p, char *err,
                   size_t errlen);

/* Queue `len` bytes as the reply to the request that carried hdr; returns at once. A reply to a
 * closed connection is dropped (FA_OK). Returns FA_OK, FA_ECLOSED (ipc closing) or FA_ENOMEM. */
fa_status ipc_reply(struct ipc *ipc, const struct ipc_hdr *hdr, const void *buf, size_t len);

/* Connections open right now (handshake done). */
unsigned ipc_pipe_count(const struct ipc *ipc);

/* Reply bytes queued and not yet written to the kernel. */
size_t ipc_sends_pending(const struct ipc *ipc);

/* Stop accepting, close every connection (queued replies not yet written are dropped: wait for
 * ipc_sends_pending() == 0 first), remove the socket file; `done` runs from the loop once every
 * handle is closed, then the memory is freed. */
void ipc_close(struct ipc *ipc, void (*done)(void *arg), void *arg);

#endif /* FA_DAEMON_IPC_H */
