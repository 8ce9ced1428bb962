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
 *
 * Deadlines (one local process must not be able to hold connections, and so file descriptors,
 * for nothing): the handshake within handshake_ms; a frame, once its first byte arrived, whole
 * within frame_ms; and a connection no session holds (ipc_pipe_hold) closed after idle_ms
 * without a message. A connection a session holds may stay silent for ever (a long-lived client
 * between calls), but not in the middle of a frame.
 * Caps, checked at accept, before the handshake: max_conns in all; max_conns_per_uid for one
 * peer uid (root counted like any other); and the last reserved_conns of max_conns only for
 * peers of uid 0 or of the daemon's own uid (an operator's fa-ctl gets in when other users have
 * filled the rest). A refused connection is closed at once, with a rate-limited warning.
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
	unsigned frame_ms;     /* a frame begun and not whole by then closes its connection; 10000 */
	unsigned idle_ms;      /* a connection no session holds, silent for so long, is closed;
	                        * 30000 */
	unsigned max_conns_per_uid; /* open connections of one peer uid; more are closed; 1024
	                             * (at most max_conns) */
	unsigned reserved_conns; /* of max_conns, only for uid 0 and the daemon's uid; 0: none
	                          * (the exception to "zero means the default"); < max_conns */
};

/* Connection counts and why connections were refused or closed, since ipc_open. */
struct ipc_counters {
	unsigned conns;         /* open connections, handshaking or not (each holds an fd) */
	unsigned conns_peak;    /* the most open at once */
	unsigned uids;          /* distinct peer uids among the open connections */
	uint32_t uid_top;       /* the uid holding the most open connections now (0 when none) */
	unsigned uid_top_conns; /* and how many it holds */
	unsigned uid_peak;      /* the most any one uid held at once */
	uint64_t refused_limit; /* refused at accept: max_conns (or the reserve) reached, or EMFILE */
	uint64_t refused_uid;   /* refused at accept: the peer's uid at max_conns_per_uid */
	uint64_t closed_handshake; /* closed: no handshake within handshake_ms */
	uint64_t closed_frame;  /* closed: a frame not whole within frame_ms */
	uint64_t closed_idle;   /* closed: no session and no message within idle_ms */
	uint64_t partial_bytes; /* half-received bodies held now (at most 256 MiB) */
	uint64_t unsent_bytes;  /* unread replies held now */
	uint64_t memory_trims;  /* malloc_trim calls after a burst (ipc.c, "Memory given back") */
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

/* A session uses connection `pipe` (hold) or stopped using it (release, once per hold): while
 * a connection has holds, the idle deadline does not apply to it; at the last release it starts
 * again. A pipe that is closed or unknown is ignored. */
void ipc_pipe_hold(struct ipc *ipc, uint32_t pipe);
void ipc_pipe_release(struct ipc *ipc, uint32_t pipe);

/* The counters of this transport, now (walks the peer uids: one entry per distinct uid). */
void ipc_counters(const struct ipc *ipc, struct ipc_counters *out);

/* Reply bytes queued in the daemon, not yet written to the kernel. */
size_t ipc_sends_pending(const struct ipc *ipc);

/* Close every connection and the listener (no more callbacks after this returns; queued replies
 * are dropped: wait for ipc_sends_pending() == 0 first) and remove the socket file if it is still
 * ours; `done` (may be NULL) runs from the loop once every handle is closed, then the memory is
 * freed. */
void ipc_close(struct ipc *ipc, void (*done)(void *arg), void *arg);

#endif /* FA_DAEMON_IPC_H */
