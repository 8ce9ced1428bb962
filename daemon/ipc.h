/* ipc.h - the daemon's side of the wire: the scalability protocols' REP role over a Unix socket
 * (nanomsg's ipc:// transport), implemented here on libuv. No NNG and no nanomsg in the daemon:
 * README.md ("Transport") says why.
 *
 * Requests arrive through on_recv with the connection ("pipe") they came on, its peer uid and pid
 * (SO_PEERCRED at accept) and an opaque routing header; a reply goes back by handing that header
 * to ipc_reply, at any later time. Everything runs on the loop thread; no callback is ever called
 * from inside an ipc_* function (closing a connection reports it on a later loop turn).
 *
 * Connections: a connection is announced (counted by ipc_pipe_count, may deliver requests) once
 * it completed the SP handshake as a REQ peer. on_pipe_closed runs exactly once for every
 * announced connection, after its last on_recv, on a later loop turn than the decision to close
 * it; never for one that did not finish the handshake, and not for those ipc_close closes.
 * Connection ids count up, process-wide, from a random start (so that the logs of several daemons
 * do not share them) and are not reused within the process, so a header kept for a long time
 * can never reach a newer connection: a reply to a closed connection is dropped.
 * The process must ignore SIGPIPE (main.c does): libuv writes with write(2).
 */
#ifndef FA_DAEMON_IPC_H
#define FA_DAEMON_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "fa_types.h"

#define IPC_HOPS_MAX 15 /* SP backtrace words accepted (devices in between); more: dropped */
#define IPC_HDR_MAX 64  /* the connection id, then the backtrace: 4 bytes per hop */

/* The routing header of a request: where its reply must go. b[0..3] is the connection id (big
 * endian), the rest the request's SP backtrace, sent back in front of the reply. */
struct ipc_hdr {
	uint32_t len;
	uint8_t b[IPC_HDR_MAX];
};

/* Who sent a request. */
struct ipc_peer {
	uint32_t pipe; /* connection id: one client connection, never reused */
	uint32_t uid;  /* peer's uid when it connected */
	uint32_t pid;  /* peer's pid when it connected */
};

typedef void (*ipc_recv_fn)(void *arg, const struct ipc_peer *peer, const struct ipc_hdr *hdr,
                            const void *body, size_t len);
typedef void (*ipc_pipe_fn)(void *arg, const struct ipc_peer *peer);

struct ipc;

/* Zero means the default for every limit. */
struct ipc_params {
	const char *path;      /* filesystem path of the socket */
	unsigned mode;         /* permission bits of the socket file */
	size_t recv_max;       /* a message declaring more closes its connection; 0: 1 MiB */
	ipc_recv_fn on_recv;   /* a request arrived */
	ipc_pipe_fn on_pipe_closed; /* an announced connection closed (not called by ipc_close) */
	void *arg;
	unsigned handshake_ms; /* a connection not through the handshake by then is closed; 5000 */
	unsigned max_conns;    /* open connections, handshaking or not; more are closed; 4096 */
	size_t send_max;       /* reply bytes a connection may leave unread before it is closed;
	                        * 16 MiB */
};

/* Bind and start accepting. Refuses a path of >= 108 bytes, a path that exists and is not a
 * socket, and a socket another live process answers on; removes a stale socket file (a connect
 * is refused) first. Creates the parent directory (one level, mode 0750) if missing. The socket
 * file gets p->mode before the first connection can be accepted.
 * Returns FA_OK, FA_EINVAL (path), FA_EUNAVAIL (another daemon is live there), FA_ESYS or
 * FA_ENOMEM, with the reason in err. On failure the loop must still run to release handles. */
fa_status ipc_open(struct ipc **out, uv_loop_t *loop, const struct ipc_params *p, char *err,
                   size_t errlen);

/* Send `len` bytes (copied when they cannot be written at once) as the reply to the request that
 * carried hdr. Asynchronous: returns at once. A reply to a connection that is gone is dropped
 * (FA_OK); a connection whose unread replies would pass send_max is closed (FA_OK). Returns FA_OK,
 * FA_EINVAL (a header ipc never made), FA_ECLOSED (ipc_close ran) or FA_ENOMEM. */
fa_status ipc_reply(struct ipc *ipc, const struct ipc_hdr *hdr, const void *buf, size_t len);

/* Announced connections open right now. */
unsigned ipc_pipe_count(const struct ipc *ipc);

/* Reply bytes queued in the daemon, not yet written to the kernel. */
size_t ipc_sends_pending(const struct ipc *ipc);

/* Close every connection and the listener (no more callbacks after this returns; queued replies
 * are dropped: wait for ipc_sends_pending() == 0 first) and remove the socket file if it is still
 * ours; `done` (may be NULL) runs from the loop once every handle is closed, then the memory is
 * freed. */
void ipc_close(struct ipc *ipc, void (*done)(void *arg), void *arg);

#endif /* FA_DAEMON_IPC_H */
