/* backend.h - where attention runs: a table of operations each engine implements.
 *
 * The CPU backend (backend_cpu.c) serves host memory on a worker pool; the GPU backend (gpu/, see
 * gpu/README.md) serves device memory (CUDA IPC regions) and host memory (pinned, staged through
 * device scratch) with one worker thread per GPU. The loop thread submits jobs; a backend runs
 * them on its own threads and hands each finished job back on the loop thread through the done
 * callback (its threads push it on a backend_done_list and wake the loop with a uv_async),
 * exactly once per submitted job, cancelled or not.
 */
#ifndef FA_DAEMON_BACKEND_H
#define FA_DAEMON_BACKEND_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "fa_attn.h"
#include "fa_attn_bwd.h"
#include "fa_proto.h"
#include "fault.h"

/* Tensors of one job: a backward pass has nine (common/fa_check.h's FA_BWD_* order, whose first
 * five are the forward's FA_FWD_*). */
#define BACKEND_MAX_TENSORS 9
#define BACKEND_MAX_RANGES BACKEND_MAX_TENSORS

/* A mapping a job's pointers lie in. A client can shrink its shm object under the daemon: the
 * CPU backend then replaces the vanished pages (SIGBUS handler) and sets *broken, so the job
 * and every later one on that mapping fail with FA_ERANGE instead of the daemon dying. */
struct backend_range {
	char *base;
	uint64_t size;
	atomic_int *broken;
};

/* What a backward job adds to a forward's (backend_job.bwd, when backend_job.is_bwd). */
struct backend_bwd {
	struct fa_attn_bwd_desc desc; /* validated; desc.fwd equals the job's desc */
	const void *dout;             /* input, like o */
	void *dq, *dk, *dv;           /* outputs, written whole */
	unsigned flags;               /* FA_PROTO_BWD_* (the deterministic bit) */
};

/* One forward or backward pass. The caller fills the inputs and keeps the memory they point to
 * mapped until done() is called. A backward job (is_bwd) reads q, k, v, o and lse (required)
 * and bwd.dout, and writes bwd.dq, dk, dv; its on_device[] is by FA_BWD_*. */
struct backend_job {
	/* inputs */
	struct fa_attn_fwd_desc desc; /* validated */
	const void *q, *k, *v;
	void *o;
	float *lse;                   /* NULL: not wanted */
	const void *owner;            /* whose job (the session), for backend_cancel */
	struct backend_range ranges[BACKEND_MAX_RANGES]; /* the mappings of the job's tensors */
	unsigned nranges;
	bool on_device[BACKEND_MAX_TENSORS]; /* q, k, v, o, lse (and the backward's dout, dq, dk,
	                                      * dv): a device pointer (CUDA IPC region) */
	bool is_bwd;                  /* a backward pass: bwd below is filled */
	struct backend_bwd bwd;
	int dev;                      /* the backend's GPU index of its device regions; -1: host
	                               * memory only (the backend picks a device) */
	/* Asynchronous mode (GPU backend, device buffers, same uid): the daemon's stream waits on
	 * the client's CUDA IPC event, and the job is handed back twice: once when the kernel is
	 * enqueued (enqueued = true: dispatch replies with done_event), and once when it finished
	 * (enqueued = false: dispatch frees it). A job that fails before its enqueue is handed back
	 * once, with its status, like a synchronous one. */
	bool async;
	/* Asynchronous, completion words, nothing to compute: write done[slot] = words_seq on the
	 * session's stream after its earlier work, so a refused call from a submission ring (whose
	 * client's stream already waits for that word) holds nobody (dispatch.c, ring.h). */
	bool words_release;
	uint32_t slot;                /* the client's socket slot: one daemon event per slot */
	bool has_wait_event;
	uint8_t wait_event[FA_PROTO_IPC_HANDLE_LEN]; /* the client's cuIpcGetEventHandle */
	uint8_t done_event[FA_PROTO_IPC_HANDLE_LEN]; /* out: the daemon's, recorded after O */
	/* Or completion words (the default; works across users): words is the device address of
	 * the session's words region on the job's GPU (FA_PROTO_WORDS_*), held by the request;
	 * the stream waits for ready[slot] >= words_seq and writes done[slot] = words_seq. */
	void *words;                  /* NULL: the event path (or synchronous) */
	uint64_t words_seq;
	bool enqueued;                /* out: see above */
	bool done_written;            /* out: failed before its enqueue, and its done word was
	                               * written all the same, in the order of the session's
	                               * stream (so dispatch needs no words release) */
	void **owner_state;           /* the session's slot for backend state (streams, events),
	                               * freed by ops.owner_free when the session is freed */
	/* ATTN_VARLEN / ATTN_KVCACHE (backend_infer.h): the index tensors and the per-sequence
	 * descriptor; owned by the request; NULL for ATTN_FWD. desc above is its desc.fwd. */
	struct backend_infer *infer;
	/* outputs, valid in done() */
	fa_status status;
	uint64_t compute_ns;          /* first chunk started .. last chunk finished */
	uint64_t gpu_ns;              /* GPU backend, worker jobs: the device's time on it (0:
	                               * not timed) */
	char detail[FA_PROTO_DETAIL_MAX];
	/* test-only (FA_TEST_FAULT_AFTER): fail this job as a fatal device fault when it is done;
	 * set by backend_submit, read on the loop thread */
	bool fault_injected;
	uint8_t priority;             /* enum fa_priority: its class in the run queue (runq.h) */
	/* set by ops.stop (any thread): the rest of a started job is not wanted; the backend
	 * starts no further piece or launch of it and hands it back with stop_status */
	atomic_bool stop;
	fa_status stop_status;
	/* the backend's own bookkeeping */
	struct backend_job *next;
	struct runq_owner *runq_node; /* its owner's queue while queued (runq.c) */
	/* Pieces (backend_cpu.c's plan; the GPU's launches): next to start, all, running. */
	int64_t piece_next, piece_total;
	unsigned pieces_running;
	int64_t piece_bh, piece_rows, piece_row_blocks; /* CPU forward: a piece's extent */
	uint64_t t_start;
	uint64_t bytes_in, bytes_out;  /* GPU: staging copies of host tensors */
	uint64_t t_submit, t_pick, t_done; /* GPU: submitted, taken by the worker, handed back */
	bool loop_spin;                /* GPU: the loop polls without sleeping until it is back */
	bool kernel_done, reply_delivered; /* GPU asynchronous mode: the two hand-backs */
};

/* Append job to the list head..tail (job->next links it): the backends' run and done queues. */
static inline void backend_job_append(struct backend_job **head, struct backend_job **tail,
                                      struct backend_job *job)
{
	job->next = NULL;
	if (*tail != NULL)
		(*tail)->next = job;
	else
		*head = job;
	*tail = job;
}

/* Called on the loop thread when a job is finished (computed, failed or cancelled). */
typedef void (*backend_done_fn)(struct backend_job *job, void *arg);

/* Called on the loop thread when a running job is expected to finish at end_ns (fa_now_ns's
 * clock; the GPU backend's --prewake-us): a hint, before done(), that the job is still alive
 * and its reply is near. Never after its done(); maybe never. */
typedef void (*backend_soon_fn)(struct backend_job *job, uint64_t end_ns, void *arg);

/* Finished jobs on their way to the loop thread. A backend's threads append to it under the
 * backend's mutex (backend_done_push) and then wake the loop (uv_async_send); the loop's async
 * callback empties it with backend_done_drain. */
struct backend_done_list {
	struct backend_job *head, *tail;
};

/* Append job to the done list (the caller holds the mutex that guards l). */
static inline void backend_done_push(struct backend_done_list *l, struct backend_job *job)
{
	backend_job_append(&l->head, &l->tail, job);
}

/* Loop thread: take every job off l (under mu, which guards l) and, with mu released, hand each
 * one to deliver(job, arg) in the order they were pushed, job->next cleared first. Jobs pushed
 * meanwhile stay for the next call (their writer woke the loop again). Each backend's async
 * callback and its close call this; the backend then calls fault_check (fault.h). */
static inline void backend_done_drain(struct backend_done_list *l, pthread_mutex_t *mu,
                                      backend_done_fn deliver, void *arg)
{
	struct backend_job *job;

	pthread_mutex_lock(mu);
	job = l->head;
	l->head = l->tail = NULL;
	pthread_mutex_unlock(mu);
	while (job != NULL) {
		struct backend_job *next = job->next;
		job->next = NULL;
		deliver(job, arg);
		job = next;
	}
}

struct backend;
struct region;

struct backend_ops {
	const char *name;              /* "cpu": the --backend value and the STATS "backend" */
	enum fa_backend_kind kind;     /* for HELLO's reply */
	/* Start the engine. FA_ENOGPU and the like mean "not here": auto tries the next one. */
	fa_status (*open)(struct backend **out, uv_loop_t *loop, const struct config *cfg,
	                  backend_done_fn done, void *arg, char *err, size_t errlen);
	/* Queue a job. FA_OK, or a status with job untouched (no done() call). */
	fa_status (*submit)(struct backend *b, struct backend_job *job);
	/* Finish every queued job of `owner` (all jobs when NULL) that has not started, with
	 * status `st` (FA_ECLOSED; FA_EDEVICE on the fatal path) and `why` as detail, through
	 * done() later. Started jobs run to the end. Returns how many were cancelled. */
	unsigned (*cancel)(struct backend *b, const void *owner, fa_status st, const char *why);
	/* Stop the started jobs of `owner` (all when NULL): no further piece (CPU) or launch (GPU)
	 * of them starts; what is running finishes (one piece: bounded, see each backend), then
	 * each is handed back with `st` and `why` through done(). Jobs not started are cancel's.
	 * Any thread but a worker's. Returns how many jobs were told. NULL: jobs run whole. */
	unsigned (*stop)(struct backend *b, const void *owner, fa_status st, const char *why);
	/* Stop the threads (after every job was handed back), close the loop handles; `closed`
	 * runs from the loop when the memory is gone. */
	void (*close)(struct backend *b, void (*closed)(void *arg), void *arg);
	/* Whether the engine can still compute (the watchdog feeds systemd only while it can).
	 * NULL: always (the CPU backend: a stuck loop already starves the watchdog). The GPU
	 * backend answers from its canary kernel. Called on the loop thread; must not block. */
	bool (*healthy)(struct backend *b);
	/* Make a new region usable by this engine, on the loop thread, before its id is handed
	 * out: the GPU backend pins host memory, and opens a CUDA IPC region's handle once
	 * (ipc_handle and gpu_uuid are NULL for host memory). It may set r->release, which the
	 * region's last reference calls (after every job using it finished). NULL: nothing to do.
	 * Returns FA_OK or the client-facing status with err. */
	fa_status (*region_open)(struct backend *b, struct region *r, const uint8_t *ipc_handle,
	                         const uint8_t *gpu_uuid, char *err, size_t errlen);
	/* Extra STATS lines (whole "# section" blocks) into buf; NULL: none. Loop thread. */
	void (*stats)(struct backend *b, char *buf, size_t cap);
	/* Hand back now the jobs that finished on the loop thread inside the request just
	 * dispatched (the GPU backend's inline runs), rather than in the loop's check phase after
	 * this turn's poll: the server calls it after each request. Loop thread, outside every
	 * other backend call. NULL: nothing of the kind. */
	void (*flush)(struct backend *b);
	/* A session's backend state (*job->owner_state, set by the backend's threads) is no
	 * longer needed: the session is freed, every job of it was handed back for good. Loop
	 * thread. NULL: the backend keeps no such state. */
	void (*owner_free)(struct backend *b, void *state);
};

/* What every backend exposes; implementations embed it first. */
struct backend {
	const struct backend_ops *ops;
	unsigned threads;     /* workers (CPU) or streams (GPU), for STATS */
	size_t align;         /* offset and stride alignment in bytes beyond the element size */
	bool host_memory;     /* serves FA_REGION_HOST_SHM regions */
	bool device_memory;   /* serves FA_REGION_CUDA_IPC regions */
	bool async_events;    /* serves the asynchronous mode (CUDA IPC events) */
	bool infer;           /* serves ATTN_VARLEN and ATTN_KVCACHE */
	bool mask_ext;        /* serves ATTN_FWD's sliding window and softcap */
	bool async_words;     /* ... and its completion words (64-bit stream memory operations on
	                       * every device) */
	atomic_uint running;  /* jobs started and not finished (set by the backend's threads) */
	backend_soon_fn soon; /* set by the server after open (NULL: nobody listens); a backend
	                       * that estimates its jobs' ends calls it on the loop thread */
	void *soon_arg;
	uint64_t default_max_gflop; /* --max-request-gflop 0 means this (worklimit.h) */
	struct fault fault;   /* fault.c's: backends use fault_mark/fault_marked/fault_check */
	uint64_t fault_inject_after;         /* test-only: the Nth job submitted faults; 0 never */
	uint64_t fwd_submitted;              /* loop: jobs taken by submit */
};

extern const struct backend_ops backend_cpu_ops;
extern const struct backend_ops backend_gpu_ops;

/* Open the backend named `which` ("auto": the first of the table that opens). Returns FA_OK, or
 * FA_EINVAL (unknown name) or the backend's failure, with err saying why. */
fa_status backend_open(const char *which, struct backend **out, uv_loop_t *loop,
                       const struct config *cfg, backend_done_fn done, void *arg, char *err,
                       size_t errlen);

/* Queue a job (loop thread). Counts it for the test-only fault injection (fault.h). */
static inline fa_status backend_submit(struct backend *b, struct backend_job *job)
{
	job->fault_injected =
	    b->fault_inject_after != 0 && b->fwd_submitted + 1 == b->fault_inject_after;
	fa_status st = b->ops->submit(b, job);
	if (st == FA_OK)
		b->fwd_submitted++;
	else
		job->fault_injected = false; /* untouched by the backend: still ours */
	return st;
}

/* Finish the owner's (NULL: every) queued jobs with FA_ECLOSED; see backend_ops.cancel. */
static inline unsigned backend_cancel(struct backend *b, const void *owner, const char *why)
{
	return b->ops->cancel(b, owner, FA_ECLOSED, why);
}

/* Drop everything of `owner` (NULL: everyone): its queued jobs are answered FA_ECLOSED with
 * `why` at once, its started ones after the piece they are running (ops.stop). For a client
 * that is gone, and for the drain deadline. Returns how many jobs were cancelled or told. */
static inline unsigned backend_drop(struct backend *b, const void *owner, const char *why)
{
	unsigned n = b->ops->cancel(b, owner, FA_ECLOSED, why);
	if (b->ops->stop != NULL)
		n += b->ops->stop(b, owner, FA_ECLOSED, why);
	return n;
}

/* The fatal path: finish every queued job with FA_EDEVICE and `why`. */
static inline unsigned backend_fail_queued(struct backend *b, const char *why)
{
	return b->ops->cancel(b, NULL, FA_EDEVICE, why);
}

static inline void backend_close(struct backend *b, void (*closed)(void *arg), void *arg)
{
	b->ops->close(b, closed, arg);
}

static inline const char *backend_name(const struct backend *b)
{
	return b->ops->name;
}

#endif /* FA_DAEMON_BACKEND_H */
