/* dispatch.h - one request in, one reply out: decode, find the session, dedupe, run the op's
 * handler, encode, reply. Errors are answered with a status and a detail text (v, op and seq
 * echoed when the decoder could read them); nothing a client sends makes the daemon stop.
 */
#ifndef FA_DAEMON_DISPATCH_H
#define FA_DAEMON_DISPATCH_H

#include <stddef.h>

#include "backend.h"
#include "ipc.h"
#include "server.h"

/* A request arrived (loop thread). */
void dispatch_request(struct server *srv, const struct ipc_peer *peer, const struct ipc_hdr *hdr,
                      const void *body, size_t len);

/* The backend finished an ATTN_FWD or ATTN_BWD job: answer it and release what it held (loop
 * thread). */
void dispatch_fwd_done(struct server *srv, struct backend_job *job);

/* The backend expects a running job to finish at end_ns (loop thread; backend_soon_fn): a
 * synchronous request from a submission ring has its client and ring thread woken just before
 * (ring_prewake), so the reply and the client's next call meet awake threads. */
void dispatch_fwd_soon(struct server *srv, struct backend_job *job, uint64_t end_ns);

#endif /* FA_DAEMON_DISPATCH_H */
