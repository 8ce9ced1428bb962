/* ring.h - the daemon's side of the per-session submission rings (proto/fa_ring.h has the
 * layout and why they exist).
 *
 * A session asks for one with RING_OPEN: the client's shm object is opened with a host
 * region's checks (name pattern, owner = the session's uid, size), mapped, and given a thread
 * of its own that sleeps on the ring's sq_tail futex (or polls for --ring-spin-us after work).
 * The thread copies each published entry out of the shared memory and hands the copies to the
 * loop (uv_async): the loop feeds them to `on_recv`, the same entry point the socket uses, with
 * a routing header that ring_hdr_is() recognises; the reply goes back by ring_reply (a
 * completion entry, and a FUTEX_WAKE when the client sleeps).
 *
 * Hostile clients: every index is bounded (more than FA_RING_ENTRIES unanswered entries, or a
 * tail behind the head, closes the ring: `dead` = FA_RING_DEAD_PROTOCOL), each entry's bytes
 * are copied once before anyone decodes them, an entry longer than FA_RING_MSG_MAX is handed on
 * empty (answered FA_EPROTO), and a ring whose object shrinks under the daemon (SIGBUS) gets
 * anonymous pages in its place and is closed. Rings per session: 1; in all: max_rings.
 *
 * Threads: every function here runs on the loop thread; the ring threads only copy, count and
 * wake the loop.
 */
#ifndef FA_DAEMON_RING_H
#define FA_DAEMON_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "fa_types.h"
#include "fa_proto_memo.h"
#include "ipc.h"

struct rings;

/* How long before a request's expected end ring_prewake wakes its sleeping client: as soon as
 * the backend's prewake comes (--prewake-us, 150 us by default), since waking a sleeping client
 * took 100-400 us on the H200 host (daemon/RESULTS.md 2026-12-03: with a 50 us lead a large
 * synchronous client's next call came 131 us after its completion, mean); the client polls
 * up to 1 ms after such a wake (client/fa_ring.c), longer than the estimate's usual error
 * (1-2% of a kernel's time, the same shape measured before). */
#define RING_PREWAKE_LEAD_NS 150000ull

struct ring_params {
	uv_loop_t *loop;
	ipc_recv_fn on_recv;  /* an entry arrived (loop thread); peer->pipe is 0 */
	void *arg;
	unsigned max_rings;   /* open rings in all; more: FA_ELIMIT */
	unsigned spin_us;     /* a ring thread polls this long after its last entry before it
	                       * sleeps (0: sleeps at once) */
	unsigned loop_spin_us; /* after a completion the loop polls this long (a uv_idle) and a
	                       * sleeping ring thread is woken to poll spin_us, so a synchronous
	                       * client's next entry meets awake threads (0: off) */
	uint64_t max_bytes;   /* --max-region-bytes: the shm object's size is checked against it */
};

/* Counters since rings_open, for STATS ("# ring"). */
struct ring_counters {
	unsigned open;          /* rings open now */
	uint64_t opened;        /* RING_OPENs served */
	uint64_t entries;       /* submissions taken */
	uint64_t completions;   /* completions posted */
	uint64_t dropped;       /* replies for a ring already closed */
	uint64_t sleeps;        /* ring threads that went to sleep on the futex */
	uint64_t client_wakes;  /* FUTEX_WAKEs of a sleeping client */
	uint64_t broken;        /* rings closed for impossible counters or a shrunk object */
	uint64_t hop_ns;        /* thread's copy to the loop's dispatch, summed over entries */
	uint64_t thread_wakes;  /* sleeping ring threads woken by a completion or a prewake */
	uint64_t prewakes;      /* ring_prewake calls for a live ring */
	uint64_t prewake_client_wakes; /* ... that found the client asleep and woke it */
	uint64_t turnaround_ns; /* a completion to the same ring's next entry, under 10 ms */
	uint64_t turnarounds;
	uint64_t polled;        /* hand-offs to a polling loop, no uv_async sent */
};

/* The ring table and its uv_async. Installs the SIGBUS handler that repairs a ring whose
 * object shrank (chained to the handler in force, which keeps its job). Returns FA_OK,
 * FA_ENOMEM or FA_ESYS. */
fa_status rings_open(struct rings **out, const struct ring_params *p, char *err, size_t errlen);

/* Close every ring, then the uv_async; `done` (may be NULL) runs from the loop when the handle
 * is closed and the memory freed. Safe on NULL (done is then not called). */
void rings_close(struct rings *t, void (*done)(void *arg), void *arg);

/* Map the shm object `name` of `size` bytes (exactly FA_RING_BYTES) as session `session`'s
 * ring and start its thread; *id gets its random nonzero id. Returns FA_OK; FA_ELIMIT (the
 * session has one, or max_rings are open); FA_EINVAL, FA_EPERM, FA_ERANGE (the object, as for
 * a host region; or its header is not this layout); FA_ENOMEM, FA_ESYS; err says why. */
fa_status ring_open(struct rings *t, uint64_t session, uint32_t uid, uint32_t pid,
                    const char *name, uint64_t size, uint64_t *id, char *err, size_t errlen);

/* The session is closing: stop and join its ring's thread, mark the ring dead, unmap it and
 * unlink the object (the client's name; a killed client leaks nothing). Replies still on their
 * way for it are dropped. No ring: nothing. */
void ring_close_session(struct rings *t, uint64_t session);

/* Did this routing header come from a ring (and not from the socket)? */
bool ring_hdr_is(const struct ipc_hdr *h);

/* The decode memo (proto/fa_proto_memo.h) of the ring a ring header's entry came through, or
 * NULL (not a ring's, or its ring is gone): the loop's, for fa_proto_decode_req_memo. */
struct fa_proto_req_memo *ring_req_memo(struct rings *t, const struct ipc_hdr *h);

/* The session a ring header's ring belongs to. */
uint64_t ring_hdr_session(const struct ipc_hdr *h);

/* Post `len` bytes (an encoded reply) as the completion of the entry that carried h, and wake
 * the client if it sleeps. Dropped (counted) when the ring is gone or dead. */
void ring_reply(struct rings *t, const struct ipc_hdr *h, const void *buf, size_t len);

/* A request that came through the ring of h is expected to finish at `end_ns` (fa_now_ns's
 * clock; the backend's prewake, backend.h). RING_PREWAKE_LEAD_NS before then the client, if it
 * sleeps on its completion, and the ring thread, if it sleeps, are woken (each then polls for
 * its spin time, so the completion and the client's next entry meet awake threads); the loop
 * polls until loop_spin_us after end_ns to do that on time. No ring, a dead one, or
 * loop_spin_us 0: nothing. */
void ring_prewake(struct rings *t, const struct ipc_hdr *h, uint64_t end_ns);

/* The counters, now. */
void ring_counters(const struct rings *t, struct ring_counters *out);

/* Test-only (FA_TEST_OLD_DAEMON=1, read once): behave as the daemon before asynchronous
 * backward and inference calls existed, as a new client sees it: no FA_RING_FEAT_* bits in a
 * ring's header, and the dispatcher refuses their new keys as that release's decoder did
 * (FA_EPROTO "key 'wrg' not allowed in a ATTN_BWD request"). So the client's fallbacks are
 * tested without an old binary. */
bool ring_old_daemon(void);

#endif /* FA_DAEMON_RING_H */
