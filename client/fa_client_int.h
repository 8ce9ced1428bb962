/* fa_client_int.h - libfaclient's private parts, shared by the client sources and never installed.
 *
 * Layers, bottom up (each file calls only the ones above it: no call cycle):
 *   fa_util.c       this thread's detail text, debug lines, deadlines
 *   fa_sockcheck.c  the socket file: missing, stale, forbidden (the group by name), at once
 *   fa_transport.c  nanomsg REQ sockets: a pool, one socket per in-flight call (the only file that
 *                   includes <nanomsg/nn.h>, so the transport can change without touching the rest)
 *   fa_ring.c       the session's submission ring in shared memory: calls without a socket round
 *                   trip (proto/fa_ring.h)
 *   fa_call.c       one call on the session: request header, reply status, buffer registration
 *   fa_shm.c        host buffers in POSIX shared memory (one kind of buffer)
 *   fa_cuda.c       device buffers: the caller's cudaMalloc memory, exported as a CUDA IPC handle
 *                   (libcuda.so.1 loaded with dlopen on first use, never linked)
 *   fa_client.c     the public calls: sessions (HELLO/BYE/reconnect), argument checks, attention
 *   fa_attn_bwd.c   the backward pass's calls (fa_attn_bwd, fa_attn_bwd_async), on fa_client.c's
 *                   tensor check
 *   fa_prepared.c   prepared calls: a block built once, its tensors placed and checked per call
 *                   (fa_prepare, fa_prepared_call), over the calls above and fa_cuda.c's checks
 * Internal helpers are named fa__ (libuv's uv__), which no public name uses. Everything here is
 * hidden: the Makefile compiles client/ with -fvisibility=hidden and only the FA_API declarations
 * of fa/fa_client.h (and fa/fa_types.h) are exported.
 */
#ifndef FA_CLIENT_INT_H
#define FA_CLIENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fa/fa_client.h"
#include "fa_err.h"
#include "fa_proto.h"
#include "fa_time.h"

/* Unix socket paths hold at most 107 bytes and a NUL; nanomsg aborts on 108..127. */
#define FA_SOCK_PATH_MAX 108
#define FA_DEFAULT_TIMEOUT_MS 30000
#define FA_DEFAULT_CONNECT_TIMEOUT_MS 2000
/* At most this many sockets (= calls in flight) per client; a call beyond waits for one. */
#define FA_TRANSPORT_MAX_SOCKETS 64

/* ---- errors and time (fa_util.c) -------------------------------------------------------------- */

/* Clear this thread's detail text (at the start of every public call). */
void fa__detail_clear(void);
/* Set this thread's detail text (printf-style) and return st, so `return fa__fail(...)` reads. */
__attribute__((format(printf, 2, 3))) fa_status fa__fail(fa_status st, const char *fmt, ...);
/* This thread's detail text: FA_PROTO_DETAIL_MAX bytes, thread-local, never NULL; the err buffer
 * for common/ checks, whose texts become the detail as they are. */
char *fa__detail(void);
/* Print a line to stderr when FA_DEBUG is set in the environment; otherwise nothing. */
__attribute__((format(printf, 1, 2))) void fa__debug(const char *fmt, ...);
/* The deadline (CLOCK_MONOTONIC ns, fa_now_ns) for a call of timeout_ms from now; 0 (wait
 * forever) gives 0. */
int64_t fa__deadline(int timeout_ms);

/* ---- the socket file (fa_sockcheck.c) --------------------------------------------------------- */

/* The system daemon's socket: the default when XDG_RUNTIME_DIR is unset. */
#define FA_SYSTEM_SOCKET "/run/fa-daemon/fa.sock"

/* Can this process reach a daemon at path? Checks the file (exists, is a socket, we may write
 * it) and, when probe, that somebody listens on it. user_default: path is the per-user default
 * (from XDG_RUNTIME_DIR), so a missing one names the system socket when that exists.
 * Returns FA_OK, FA_EUNAVAIL (missing, not a socket, stale) or FA_EPERM (the detail names the
 * group that may connect); the detail is set. Any thread. */
fa_status fa__socket_check(const char *path, bool user_default, bool probe);

/* ---- transport (fa_transport.c) ----------------------------------------------------------------- */

struct fa_transport;
struct fa_tslot; /* one REQ socket */

/* Prepare a pool of REQ sockets for the daemon at `path` (a filesystem path, checked < 108 bytes
 * by the caller). No socket is created yet. Returns FA_OK, FA_ENOMEM, FA_ESYS. */
fa_status fa_transport_open(struct fa_transport **out, const char *path);
/* Close every socket; no slot may be held. Safe on NULL. */
void fa_transport_close(struct fa_transport *t);
/* Close the idle sockets (reconnect: connections of an old session go, so the daemon ends it). */
void fa_transport_drop_idle(struct fa_transport *t);
/* Take a socket: an idle one, a new one while fewer than the cap are open, else wait for one until
 * deadline_ns (0: forever). Returns FA_OK, FA_ETIMEDOUT, FA_ESYS, FA_ENOMEM. */
fa_status fa_transport_acquire(struct fa_transport *t, int64_t deadline_ns, struct fa_tslot **out);
/* The socket's id, 0..FA_TRANSPORT_MAX_SOCKETS-1, unique among the client's open sockets (the
 * asynchronous mode keeps one pair of CUDA events per id). */
int fa_transport_slot_id(const struct fa_tslot *s);
/* Give a socket back: kept for reuse when its last round trip completed, closed otherwise (after a
 * timeout a stale reply could still arrive on it). Safe on NULL. */
void fa_transport_release(struct fa_transport *t, struct fa_tslot *s);
/* One request and its reply on socket s, until deadline_ns (0: forever). Encodes req (the size is
 * checked before nanomsg sees it), sends, receives, decodes into rep and checks that the reply
 * answers this request (op and seq). Returns FA_OK when rep holds the daemon's reply (its own
 * status is rep->status), else a transport status with this thread's detail set: FA_ETIMEDOUT,
 * FA_ETOOBIG, FA_EPROTO, FA_EVERSION, FA_ECLOSED, FA_ESYS, FA_EINVAL. */
fa_status fa_transport_roundtrip(struct fa_transport *t, struct fa_tslot *s,
                                 const struct fa_proto_req *req, struct fa_proto_rep *rep,
                                 int64_t deadline_ns);

/* ---- the submission ring (fa_ring.c) ---------------------------------------------------------- */

struct fa_ring;
/* An asynchronous call's completion said it failed: write its done word (fa_cuda_words_lost),
 * so no stream waits for it for ever. A pointer, so that fa_ring.c calls nothing above it. */
typedef void (*fa_ring_lost_fn)(void *arg, int slot, uint64_t seq);

/* Create and map a new ring object (a host buffer's rules under its own name:
 * "/faring.<uid>.<pid>.<hex>", mode 0660, group gid when set_gid), its header filled. `path` is the daemon's socket (a vanished
 * socket ends waits), tr the pool the asynchronous calls' slots go back to. FA_OK, FA_ENOMEM,
 * FA_ESYS. Any thread; the ring is then shared by every thread of the client. */
fa_status fa__ring_create(struct fa_ring **out, const char *path, struct fa_transport *tr,
                          bool set_gid, gid_t gid);
/* The object's name, for RING_OPEN; and the id the daemon gave it. */
const char *fa__ring_name(const struct fa_ring *r);
void fa__ring_set_id(struct fa_ring *r, uint64_t id);
/* Is the ring served (not NULL, not dead on either side)? */
bool fa__ring_live(struct fa_ring *r);
/* Does the daemon serving the ring set every bit of `features` (FA_RING_FEAT_*) in its header?
 * False for a dead ring, and for a daemon that predates them. */
bool fa__ring_has(struct fa_ring *r, uint32_t features);
/* One call through the ring until deadline_ns (0: forever). *taken false: the request did not
 * go (too large for an entry, or the ring is dead): send it on the socket. Otherwise as
 * fa_transport_roundtrip: FA_OK when rep holds the reply, or FA_ETIMEDOUT, FA_ECLOSED (the
 * daemon closed the ring under the call), FA_EUNAVAIL (the daemon is gone), FA_EPROTO,
 * FA_EVERSION, with the detail set. Thread-safe. */
fa_status fa__ring_call(struct fa_ring *r, const struct fa_proto_req *req,
                        struct fa_proto_rep *rep, int64_t deadline, bool *taken);
/* Publish an asynchronous call and return; slot (held by the caller until now) is released,
 * and lost(lost_arg, lost_slot, lost_seq) called on a failure, when its completion is read.
 * *taken as in fa__ring_call (on false the caller still holds slot). */
fa_status fa__ring_submit_async(struct fa_ring *r, const struct fa_proto_req *req,
                                struct fa_tslot *slot, fa_ring_lost_fn lost, void *lost_arg,
                                int lost_slot, uint64_t lost_seq, int64_t deadline, bool *taken);
/* Asynchronous ring calls out at once, at most: each holds a socket slot (its words slot) until
 * its completion is read, and the pool must keep some for synchronous calls. */
#define FA_RING_ASYNC_MAX (FA_TRANSPORT_MAX_SOCKETS - 8)
/* Wait (reading completions) until fewer than FA_RING_ASYNC_MAX asynchronous calls are out, so
 * that the next one finds a socket slot. FA_OK (also when the ring died), FA_ETIMEDOUT. */
fa_status fa__ring_async_room(struct fa_ring *r, int64_t deadline);
/* The sticky error: the first failed asynchronous call's status since the last time it was
 * returned (with its detail), then cleared; FA_OK when none. */
fa_status fa__ring_sticky(struct fa_ring *r);
/* Wait until every asynchronous call's completion is read, then as fa__ring_sticky. */
fa_status fa__ring_flush(struct fa_ring *r, int64_t deadline);
/* Fail what is still out (asynchronous calls: their done words written), unmap, unlink, free.
 * No call may be using it. Safe on NULL. */
void fa__ring_free(struct fa_ring *r);

/* ---- client and buffers ------------------------------------------------------------ */

/* What differs between kinds of buffers (host shared memory now, CUDA IPC device memory later).
 * The client core only registers, re-registers and releases through this table. */
struct fa_buffer_ops {
	uint8_t kind;     /* enum fa_region_kind */
	const char *name; /* "host", for messages */
	/* Fill the REGISTER request's u.reg (kind, size and the kind's own fields). */
	void (*describe)(const fa_buffer *b, struct fa_proto_req *req);
	/* Before a re-registration (fa_client_reconnect): make sure the daemon can open the buffer
	 * again, keeping its address and contents. A host buffer whose shm name is gone (the old
	 * daemon unlinked it when the old session ended), or every one when `force`, is moved to a
	 * new object. Returns FA_OK or the failure. May be NULL. */
	fa_status (*revive)(fa_buffer *b, bool force);
	/* Release the local resources (unmap, unlink) and free the kind's state; not b itself. */
	void (*release)(fa_buffer *b);
};

struct fa_buffer {
	fa_client *client;
	const struct fa_buffer_ops *ops;
	uint64_t region;         /* the daemon's id; 0 while not registered */
	void *data;              /* mapped here (a device address for device buffers) */
	size_t size;             /* bytes, as asked */
	uint64_t region_offset;  /* where data sits in the registered region: added to every tensor
	                          * offset sent (device buffers: data - allocation base) */
	fa_buffer *prev, *next;  /* the client's list of live buffers, under client->lock */
	union {
		struct {
			char name[FA_PROTO_SHM_NAME_MAX];
			uint64_t dev, ino; /* identity of the object, to notice a replaced name */
		} shm;
		struct {
			uint8_t handle[FA_PROTO_IPC_HANDLE_LEN]; /* of the allocation's base */
			uint8_t uuid[FA_PROTO_UUID_LEN];         /* the allocation's GPU */
			uint64_t alloc_size;                     /* the whole allocation */
			uint64_t buffer_id;                      /* the driver's id of it (0: unknown) */
		} dev;
	} u;
};

/* The asynchronous mode's CUDA events of one socket slot (fa_cuda.c), used only by the thread
 * that holds the slot's socket. */
struct fa_async_slot {
	void *ctx;                                     /* the context the events belong to */
	void *ev;                                      /* ours: recorded on the caller's stream */
	uint8_t ev_handle[FA_PROTO_IPC_HANDLE_LEN];
	void *daemon_ev;                               /* the daemon's, opened here */
	uint8_t daemon_handle[FA_PROTO_IPC_HANDLE_LEN];
};

/* Record this slot's event on stream (created in the stream's context on first use) and give
 * its IPC handle. FA_OK, FA_ENOGPU (no driver), FA_EINVAL (not a stream). (fa_cuda.c) */
fa_status fa_cuda_async_record(struct fa_async_slot *sl, void *stream,
                               uint8_t handle[FA_PROTO_IPC_HANDLE_LEN]);
/* Make stream wait for the daemon's event (opened once per handle). (fa_cuda.c) */
fa_status fa_cuda_async_wait(struct fa_async_slot *sl, void *stream,
                             const uint8_t handle[FA_PROTO_IPC_HANDLE_LEN]);
/* Destroy the slot's events (fa_client_close). (fa_cuda.c) */
void fa_cuda_async_fini(struct fa_async_slot *sl);

/* Is device buffer b's allocation still the one registered? The driver's buffer id of addr (an
 * address inside b) equals the id read at registration; false also when the query fails or the
 * id was not known (prepared calls, fa_prepared.c). (fa_cuda.c) */
bool fa_cuda_buffer_current(const fa_buffer *b, uint64_t addr);
/* cuStreamSynchronize(stream), the driver loaded first: FA_OK, FA_ENOGPU, FA_EDEVICE with the
 * CUDA error in the detail. (fa_cuda.c) */
fa_status fa_cuda_stream_sync(void *stream);

/* The asynchronous mode's completion words in one CUDA context (fa_cuda.c; the wire's
 * FA_PROTO_WORDS_*): a cuMemAlloc buffer of this process, registered as a words region, in
 * which the caller's stream writes each call's value into the slot's ready word and the
 * daemon's stream writes it into the done word. The values come from one counter that never
 * goes back, so every word only grows. A call on slot k first makes its stream wait for the
 * done word of the slot's previous call (when that was on another stream, its ready write may
 * still be queued: it must land first, or the word would go down under the daemon's wait). */
#define FA_WORDS_MAX_CTX 8
struct fa_words {
	void *ctx;          /* c->lock: the context; NULL: a free entry */
	int state;          /* c->lock: 0 being made (calls meanwhile use events), 1 usable,
	                     * -1 not here (events for good: no 64-bit stream memory operations,
	                     * or the daemon refused the words) */
	fa_buffer *buf;     /* registered (on the client's list, so reconnect registers it) */
	uint64_t dptr;      /* the words */
	void *stream;       /* non-blocking, ours: zeroing, and releases after a lost reply */
	_Atomic uint64_t next;                       /* the last value handed out */
	uint64_t slot_seq[FA_TRANSPORT_MAX_SOCKETS]; /* the slot's holder: its last value the daemon
	                                              * enqueued (0: none) */
};

/* The completion words of stream's context, made and registered on first use. FA_OK with *out
 * (NULL: use the IPC-event path), or a failure (FA_ENOGPU, FA_EINVAL: not a stream, or a
 * transport status of the registration). (fa_cuda.c) */
fa_status fa_cuda_words_get(fa_client *c, void *stream, struct fa_words **out);
/* Enqueue on stream, for the holder of socket slot `slot`: the wait for the slot's previous
 * done word, then ready[slot] = the next value (*seq). FA_OK or FA_EINVAL. (fa_cuda.c) */
fa_status fa_cuda_words_ready(struct fa_words *w, int slot, void *stream, uint64_t *seq);
/* The daemon enqueued call seq: stream waits for done[slot] >= seq. FA_OK or FA_EDEVICE. */
fa_status fa_cuda_words_wait(struct fa_words *w, int slot, void *stream, uint64_t seq);
/* No reply for call seq (it may or may not be enqueued): write done[slot] = seq ourselves so no
 * later wait hangs on it. (fa_cuda.c) */
void fa_cuda_words_lost(struct fa_words *w, int slot, uint64_t seq);
/* Free the words' memory and stream (fa_client_close, after BYE). (fa_cuda.c) */
void fa_cuda_words_fini(struct fa_words *w);

struct fa_client {
	struct fa_transport *tr;
	struct fa_tslot *anchor;  /* the HELLO socket, kept open (and idle) so the session lives */
	char path[FA_SOCK_PATH_MAX];
	bool path_user_default;   /* path came from XDG_RUNTIME_DIR, not from the caller */
	char name[FA_PROTO_NAME_MAX];
	uint64_t session;
	uint64_t epoch;
	uint32_t max_msg, max_inflight, max_regions;
	uint8_t backend;
	int connect_timeout_ms;
	atomic_int timeout_ms;
	atomic_uint_fast64_t seq;
	pthread_mutex_t lock;     /* guards the buffer list */
	fa_buffer *buffers;
	struct fa_async_slot async[FA_TRANSPORT_MAX_SOCKETS]; /* per socket slot (fa_cuda.c) */
	struct fa_words words[FA_WORDS_MAX_CTX]; /* per CUDA context (fa_cuda.c) */
	bool force_events;       /* FA_ASYNC_EVENTS=1 at open: the IPC-event path only */
	struct fa_ring *ring;    /* the session's submission ring, or NULL (FA_RING=0, an old
	                          * daemon, or none to spare): calls then go by the socket */
};

/* ---- one call on the session (fa_call.c) ----------------------------------------------------- */

/* A request for op on c's session, with the next sequence number (they start at 1: 0 marks a
 * reply to a request the daemon could not decode). */
void fa__req_init(fa_client *c, struct fa_proto_req *req, uint32_t op);
/* The daemon's status from a reply, its detail kept as this thread's detail. */
fa_status fa__reply_status(const fa_client *c, const struct fa_proto_rep *rep);
/* Is the daemon's socket file gone? (A daemon that stopped removes it.) */
bool fa__socket_file_gone(const fa_client *c);
/* Does this op go through the submission ring when the client has one? */
bool fa__ring_op(uint32_t op);
/* One call within timeout_ms, through the ring when the client has one and the op goes there,
 * else on a pooled socket: returns the daemon's status or a transport
 * status (FA_EUNAVAIL when the socket file is gone); the reply is in *rep when the status is the
 * daemon's. */
fa_status fa__call(fa_client *c, struct fa_proto_req *req, struct fa_proto_rep *rep,
                   int timeout_ms);
/* A reply buffer on the heap (the STATS text makes it large); NULL with the detail set when out
 * of memory. Given back with fa__rep_free. */
struct fa_proto_rep *fa__rep_alloc(void);
/* fa__rep_alloc without the failure's detail (NULL on no memory); and the way back for both. */
struct fa_proto_rep *fa__rep_get(void);
void fa__rep_free(struct fa_proto_rep *rep);
/* REGISTER b (already described by its ops) and return the region id in *region (0 on failure).
 * Returns the daemon's status or a transport status. */
fa_status fa__register_region(fa_client *c, fa_buffer *b, uint64_t *region);
/* Register b (its ops and fields filled, region 0) with the daemon and add it to the client's list.
 * Returns the daemon's status or a transport status; on failure b is not in the list. */
fa_status fa__buffer_register(fa_client *c, fa_buffer *b);
/* The group id owning the daemon's socket file, or false if it cannot be read. */
bool fa__socket_gid(const fa_client *c, gid_t *gid);

/* ---- attention calls (fa_client.c; fa_attn_bwd.c is above it) ------------------------------- */

/* Check t's buffer (absent: FA_OK when optional, else FA_EINVAL "NAME: no buffer"; another
 * client's or an unregistered buffer: FA_EREGION) and write its region, offset (plus the device
 * buffer's offset in its allocation), dtype, shape and strides into *w (zeroed first). */
fa_status fa__tensor_buffer(fa_client *c, const char *name, const fa_tensor *t, bool optional,
                            struct fa_proto_tensor *w);

/* ---- the completion-word path of every asynchronous call (fa_async.c) ------------------------ */

/* The asynchronous mode's rule for an op's n tensors t (names for the detail; buf NULL: absent):
 * FA_OK when every one is device memory, else FA_EINVAL "fn: <name> is a host buffer ...". */
fa_status fa__async_device_only(const char *fn, const fa_tensor *const *t,
                                const char *const *names, int n);

/* Send req (ATTN_FWD, ATTN_BWD, ATTN_VARLEN or ATTN_KVCACHE, checked, synchronous fields)
 * asynchronously with completion words, ordered on stream: through the ring when the daemon
 * serving it sets `feature` (FA_RING_FEAT_*; 0 for the forward, whose keys every daemon with
 * rings knows), else on a pooled socket. *use_events true (FA_OK returned, nothing
 * sent): the words path is not open to this call (no words in stream's context, or the daemon
 * predates the op's async keys); the caller falls back or refuses. Otherwise the statuses of
 * fa_client.h's for fa_attn_fwd_async (a ring call's failure is sticky: reported later). */
fa_status fa__async_words_call(fa_client *c, struct fa_proto_req *req, void *stream,
                               uint32_t feature, bool *use_events);

#endif /* FA_CLIENT_INT_H */
