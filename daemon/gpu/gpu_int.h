/* gpu_int.h - the GPU backend's internals, shared by the files of daemon/gpu/ and by the tests
 * of its queues (tests/daemon/test_gpu_queue.c). Nothing outside daemon/gpu/ and those tests
 * includes it: the rest of the daemon sees the backend through backend_gpu_ops (backend.h).
 *
 * What the backend is (README.md says more): one worker thread per visible GPU owning a CUDA
 * stream in the device's primary context; synchronous jobs enqueued up to GPU_PIPE back to back;
 * the asynchronous mode on a thread and stream of each session; a canary kernel between jobs;
 * small jobs run on the loop thread itself; compile threads and background tuning; CUDA IPC
 * regions opened once, host regions pinned and staged through device scratch.
 *
 * ---- Locking ------------------------------------------------------------------------------------
 *
 * One mutex, gpu_backend.mu ("mu"), guards every field marked "mu" below, on every thread. Its
 * three condition variables all wait with it: gpu_backend.cv (the device workers sleep on it;
 * gpu_close waits on it for the last asynchronous kernel; the compile threads broadcast it when a
 * tuning class' candidates are compiled), gpu_backend.compile_cv (the compile threads sleep on
 * it), gpu_owner_dev.cv (a session's asynchronous thread sleeps on it).
 *
 * The other fields are, as marked:
 *   "open":    written by gpu_open/gpu_dev_open before any thread starts, read-only afterwards
 *              (the devices' fa_gpu, contexts, streams, UUIDs, the canary's inputs, ndevs,
 *              the tuning table and its mode, the loop and the done callback);
 *   "worker":  touched only by that device's worker thread (the scratch, the pipeline's events,
 *              the canary's buffers; the tuner: device 0's worker);
 *   "loop":    touched only by the loop thread (the spin handle and its count, the round robin,
 *              the inline stream and event);
 *   "owner":   touched only by that session's asynchronous thread (its stream and events);
 *   "atomic":  read and written with <stdatomic.h> by anyone (canary_ok_ns, pushes, and in
 *              struct backend: running and the fault state, fault.h).
 * A job's own fields belong to whoever holds the job (it is on exactly one queue or thread at a
 * time), except an asynchronous job's kernel_done and reply_delivered, which are "mu": the loop
 * (the reply) and the host function (the kernel) hand it back between them.
 *
 * Lock order: mu is the backend's only lock and is never taken twice. Under mu the code calls
 * only CPU-side bookkeeping: the compile table (compile_pool.h: no lock of its own), fault_mark
 * (atomics), uv_async_send (lock-free), logging, and the kernels library's planner and tuning
 * table (fa_gpu_plan, fa_tune_table_next_wanted: whatever they lock inside is taken after mu,
 * and nothing of theirs calls back into this backend). No CUDA driver call, NVRTC compile or
 * tuning step runs with mu held.
 *
 * Naming: a function whose name ends in _locked is called with mu held and returns with it held;
 * the comment says when it releases mu in between (gpu_canary_turn_locked,
 * gpu_tune_turn_locked: around the CUDA work). Every other function here takes mu itself where
 * it needs it and is called without it.
 *
 * ---- Files (one concern each; the arrows are the only calls between them, no cycles) --------
 *
 *   gpu_backend.c  open, close, the ops table  -> dev, tune, loop, worker, compile, queue
 *   gpu_dev.c      one device opened / released -> canary
 *   gpu_loop.c     the loop's side: submit, inline runs, prewakes, the done drain
 *                                               -> exec, estimate, queue
 *   gpu_worker.c   a device's worker thread     -> canary, tune, async, exec, exec_bwd,
 *                                                  exec_infer, estimate, queue
 *   gpu_estimate.c expected GPU times of jobs (the prewake; no CUDA)
 *   gpu_exec.c     one synchronous job          -> stage
 *   gpu_exec_bwd.c one backward job             -> exec, stage
 *   gpu_exec_infer.c one varlen / KV-cache job: index snapshot -> exec, stage
 *   gpu_stage.c    host tensors through the scratch: placement, copies in and out
 *   gpu_async.c    the asynchronous mode        -> exec, exec_bwd, queue
 *   gpu_compile.c  the compile threads          -> queue
 *   gpu_tune.c     background tuning            -> queue
 *   gpu_canary.c   the canary and health        -> queue
 *   gpu_region.c   regions: IPC open, pinning   -> queue, dev
 *   gpu_stats.c    the STATS sections           -> dev
 *   gpu_queue.c    queues, batching, cancel, the fatal path's bookkeeping (no CUDA)
 * Every file but gpu_queue.c calls the CUDA driver through common/fa_cu.h (its one table,
 * loader, error texts and sticky-error classification, fa_cu_sticky: the fatal path's test).
 */
#ifndef FA_DAEMON_GPU_INT_H
#define FA_DAEMON_GPU_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "backend.h"
#include "compile_pool.h"
#include "config.h"
#include "fa_cu.h"
#include "fa_gpu.h"
#include "fa_tune.h"
#include "runq.h"

struct region;

#define GPU_SCRATCH_ALIGN 256
#define GPU_SCRATCH_MIN (8u << 20) /* first scratch allocation; grows to the largest request */
#define GPU_MAX_DEVICES 16         /* one worker per device */
#define GPU_PIPE 8                 /* synchronous jobs enqueued before the first is waited for */
#define GPU_CANARY_EVERY_NS 1000000000ull  /* a canary between jobs (or idle) this often */
#define GPU_CANARY_STALE_NS 20000000000ull /* no pass for this long: unhealthy (watchdog) */
#define GPU_CANARY_TOL 5e-3                /* fp16 canary, relative Frobenius error */
#define GPU_CLOSE_WAIT_NS 10000000000ull   /* close: wait this long for async kernels */
/* After a job, the idle worker spins this long before sleeping: a synchronous client's next
 * request arrives tens of microseconds after its reply, and a futex wake-up costs about as
 * much as the whole daemon's own work on a small request. */
#define GPU_SPIN_NS 200000ull
/* A small synchronous job on an idle GPU runs on the loop thread itself (gpu_loop.c): two
 * thread hand-offs cost more than such a kernel. The loop is blocked for the kernel's time, so
 * only below this many FLOPs (about 5 us of an H200). */
#define GPU_INLINE_MAX_FLOP 1.0e9
/* While a job below this many FLOPs (about 200 us of an H200) is on a worker, the loop polls
 * without sleeping (a uv_idle handle): waking a sleeping loop thread costs 10-20 us, a large
 * share of such a request's time; longer kernels hide it, and need no spinning core. */
#define GPU_LOOP_SPIN_MAX_FLOP 6.4e10
#define GPU_MAX_COMPILE_THREADS 16 /* --compile-threads' bound */
/* A synchronous request above this many FLOPs runs as several launches (gpu_split.c), and a
 * batch of small ones stops growing past it: about 6 ms of an H200 at 350 TFLOP/s, the longest
 * a stopped job (a dead client, the drain deadline) runs on, and about the longest a queued
 * job waits for the batch in progress. */
#define GPU_PIECE_FLOP 2.0e12
#define GPU_TUNE_SLICE_US 2000     /* background tuning: one step of the tuner between jobs */
#define GPU_GAP_SHORT_NS 2000000ull /* gpu_timing.c: a longer gap is an idle device (or
                                     * session stream), not a slow hand-off */
#define GPU_EST_ENTRIES 16         /* shapes whose last GPU time a device remembers */
#define GPU_CU_NOT_READY 600       /* CUDA_ERROR_NOT_READY: cuStreamQuery, cuEventElapsedTime */
#define GPU_ATIMING_SLOTS 16       /* asynchronous jobs timed in flight per session stream */

/* ---- the state ------------------------------------------------------------------------------ */

struct gpu_backend;

/* gpu_estimate.c: a shape's last GPU time (its key fields, the time, when last used) and a
 * device's estimator (worker). */
struct gpu_est_entry {
	int dtype, precision, mask;
	bool window, bwd, host;
	int64_t dims[8];               /* B, Hq, Hkv, Sq, Sk, D, window left and right */
	double softcap;
	uint64_t ns;                   /* 0: free */
	uint64_t used;
};
struct gpu_estimator {
	struct gpu_est_entry e[GPU_EST_ENTRIES];
	uint64_t clock;
	double ns_per_flop;            /* over jobs of GPU_LOOP_SPIN_MAX_FLOP or more; 0: none yet */
};

/* Timing of a session stream's asynchronous kernels (gpu_timing.c): events around each kernel
 * (after its wait for the client's ready word passed), read once complete, so the stream's busy
 * time and its gaps (the wait for the client's next call's ready word) are known apart.
 * Events: the session thread's; counters: the device's (mu). */
struct gpu_atiming {
	int state;                     /* 0 not made yet, 1 on, -1 off (no events) */
	fa_cu_event a[GPU_ATIMING_SLOTS], b[GPU_ATIMING_SLOTS];
	uint64_t seq_of[GPU_ATIMING_SLOTS]; /* the stream job a slot's pair timed; 0: free */
	uint64_t jobs;                 /* kernels enqueued on the stream so far */
	uint64_t rec, rd;              /* pairs recorded, pairs read (slot = index % slots) */
	uint64_t last_seq;             /* the stream job of the pair read last (0: none) */
	int pend;                      /* the slot between start and end, -1: none */
};

/* One session's asynchronous-mode resources on one device: its stream, its thread, and per slot
 * the daemon's completion event and the client's opened event (the thread's only).
 * Why a thread per session: cuStreamWaitEvent on another process's IPC event costs ~125 us of
 * host time per call on the H200 (it does not wait for the event: a client whose event never
 * fires still gets its reply; tests/integ/test_gpu_async.c), and that cost must not delay the
 * device worker's synchronous jobs of other clients. */
struct gpu_owner_dev {
	struct gpu_dev *d;
	pthread_t thread;
	pthread_cond_t cv;                       /* with mu */
	struct backend_job *head, *tail;         /* mu: jobs for the thread */
	bool stop;                               /* mu */
	char init_detail[FA_PROTO_DETAIL_MAX];   /* owner: why its CUDA resources failed */
	fa_cu_stream stream;                       /* owner (made by the thread; NULL: failed) */
	/* The gate (why: a client that dies before its event fires would hold the kernel, the
	 * request and its regions for good). wait_stream waits on the client's event and then
	 * writes the job's number into gate[slot]; stream waits for gate[slot] >= that number
	 * before the kernel. When the session closes, gpu_stop writes UINT32_MAX into the gates of
	 * its tickets from the loop, so their kernels run on memory still mapped and the tickets
	 * finish. 0 / NULL: no gate (allocation failed): the stream waits on the event itself. */
	fa_cu_stream wait_stream;                  /* owner */
	fa_cu_ptr gate;                            /* owner: FA_PROTO_MAX_SLOTS words */
	uint32_t gate_seq[FA_PROTO_MAX_SLOTS];   /* owner */
	struct {
		fa_cu_event done;
		uint8_t done_handle[FA_PROTO_IPC_HANDLE_LEN];
		fa_cu_event wait;
		uint8_t wait_handle[FA_PROTO_IPC_HANDLE_LEN];
	} slot[FA_PROTO_MAX_SLOTS];              /* owner */
	/* Completion words (gpu_async.c): the stream writes the ordinal of each words ticket into
	 * *passed (pinned host memory the owner thread reads) once its wait on the client's ready
	 * word passed, so the thread can tell a client that never wrote its word (the head ticket
	 * not passed: the watchdog releases it after async_wait_ns) from a long kernel. */
	const void *owner;                       /* the session, for gpu_async_cancel */
	struct gpu_owner_dev *onext;             /* mu: b->owners */
	volatile uint64_t *passed;               /* owner (the GPU writes it) */
	fa_cu_ptr passed_dev;                    /* owner */
	fa_cu_stream release_stream;             /* owner: the releases (the stream may wait) */
	/* The host functions, on a stream of their own behind an event of the kernel's stream: a
	 * host function blocks its stream until the driver's thread has run it, and on the
	 * kernel's stream that GPU -> host -> GPU trip stood between two calls' kernels. NULL:
	 * on the kernel's stream (creation failed). */
	fa_cu_stream hostfn_stream;              /* owner */
	fa_cu_event hostfn_ev;                   /* owner */
	bool hostfn_tried;                       /* owner */
	struct gpu_atiming tm;                   /* owner: its kernels' GPU time and gaps */
	uint64_t nwords;                         /* owner: words tickets so far */
	struct gpu_ticket *wq_head, *wq_tail;    /* mu: words tickets not finished, in order */
	uint64_t wq_since;                       /* mu: when wq_head became the head */
	bool release_all;                        /* mu: the session closed: release every wait */
	/* Pinned host memory for the asynchronous inference calls' index snapshot (owner; grown
	 * as needed): a copy to pageable memory returns only once done, and this copy waits for
	 * the client's ready word, which would hold the thread that watches that word. */
	struct gpu_snap_host {
		void *p;
		size_t cap;
	} snap;
};

/* A session's backend state (*job->owner_state): created under mu, freed on the loop by
 * gpu_owner_free when the session is freed (every job of it was handed back for good). A
 * device's entry is written by the loop thread only (gpu_submit, gpu_async_handoff). */
struct gpu_owner {
	struct gpu_owner_dev *dev[GPU_MAX_DEVICES];
};

/* An asynchronous job whose kernel is enqueued: the host function's argument. On the fatal
 * path the job is finished without it (abandoned); the host function, if it ever runs, then
 * only frees the ticket. */
struct gpu_ticket {
	struct gpu_backend *b;
	struct backend_job *job;
	uint64_t t0;
	struct gpu_dev *d;              /* the device it runs on */
	fa_cu_ptr gate_word;            /* its gate (gpu_owner_dev), 0: none */
	bool abandoned;                 /* mu */
	struct gpu_ticket *prev, *next; /* b->tickets, mu */
	/* completion words only: */
	struct gpu_owner_dev *od;       /* mu: NULL once off od's list (or never on it) */
	struct gpu_ticket *wnext;       /* mu: od->wq */
	uint64_t n;                     /* the ordinal the stream writes into *od->passed */
	fa_cu_ptr ready;                /* the client's ready word */
	uint64_t seq;                   /* the value waited for */
	fa_status released;             /* mu: FA_OK, or why the daemon wrote the ready word */
};

/* One device and its worker. */
/* A device's timing of its worker's jobs (gpu_timing.c). Events: the worker's; counters: mu. */
struct gpu_timing {
	int state;                     /* worker: 0 not made yet, 1 on, -1 off (no events) */
	fa_cu_event start[GPU_PIPE], end[GPU_PIPE], tail[2];
	bool ok[GPU_PIPE];             /* worker: job i's two events were recorded */
	unsigned cur, prev;            /* worker: the tail of the batch now / the one before */
	bool cur_valid, prev_valid;
	uint64_t busy_ns, jobs;        /* mu: GPU time of the timed jobs */
	uint64_t gap_short_ns, gaps_short, gap_short_max_ns; /* mu: gaps under 2 ms */
	uint64_t gap_long_ns, gaps_long;                     /* mu: longer (an idle device) */
	uint64_t enq_ns, enq_jobs;     /* mu: host time of each timed job's enqueue (the launch
	                                * calls; inside its GPU time when the stream was idle) */
	uint64_t async_busy_ns, async_jobs; /* mu: the sessions' asynchronous kernels */
	uint64_t async_gap_ns, async_gaps, async_gap_max_ns; /* mu: under GPU_GAP_SHORT_NS
	                                * between two kernels of one session stream */
	uint64_t detect_ns, detects;   /* mu: a lone job's end (its start plus its GPU time) to
	                                * the worker's seeing it (host clock) */
};

struct gpu_dev {
	struct gpu_backend *b;                   /* open */
	struct fa_gpu *g;                        /* open */
	int ordinal;                             /* open */
	int cudev;                               /* open */
	fa_cu_ctx ctx;                             /* open */
	fa_cu_stream stream;                       /* open; the worker's */
	uint8_t uuid[16];                        /* open */
	pthread_t thread;                        /* open */
	bool thread_started;                     /* open */
	struct runq queue;                       /* mu: the worker's queue (classes, sessions in
	                                          * turn: runq.h) */
	struct backend_job *cur[GPU_PIPE];       /* mu: the batch the worker runs now */
	unsigned ncur;                           /* mu */
	fa_cu_event piece_ev[2];                 /* worker: a split job's launches in flight */
	fa_cu_ptr scratch;                         /* worker (inline runs never stage) */
	size_t scratch_size;                     /* worker */
	fa_cu_event pipe_ev[GPU_PIPE];             /* worker: one per job in flight */
	struct gpu_timing tm;                    /* GPU busy time and gaps (gpu_timing.c) */
	struct gpu_estimator est;                /* worker: expected GPU times (gpu_estimate.c) */
	struct backend_job *soon;                /* mu: the job the worker expects to end at
	                                          * soon_end; the loop takes it (prewake) */
	uint64_t soon_end;                       /* mu */
	uint64_t prewakes, prewakes_late;        /* mu: prewakes sent; jobs that ended before
	                                          * their prewake was due */
	atomic_uint pushes;                      /* atomic: jobs queued so far, the idle worker
	                                          * spins on it */
	bool busy;                               /* mu: the worker runs a batch */
	fa_cu_stream inline_stream;                /* loop: gpu_loop.c's inline runs */
	bool inline_high;                        /* open: inline_stream has the device's greatest
	                                          * priority, so a high-priority job may run
	                                          * inline beside a busy worker */
	uint64_t inline_jobs;                    /* mu */
	uint64_t batches;                        /* mu: batches the worker took (STATS gpu_batches) */
	/* The canary (gpu_canary.c) */
	struct fa_attn_fwd_desc canary_desc;     /* open */
	struct fa_tile canary_tile;              /* open: the planner's first, never the tuning
	                                          * table's */
	fa_cu_ptr canary_mem;                      /* open: q, k, v, o */
	size_t canary_bytes;                     /* open: of one tensor */
	double *canary_ref;                      /* open: float64 reference output */
	uint16_t *canary_out;                    /* worker: the result, copied back */
	uint64_t canary_last_ns;                 /* worker: last run started */
	_Atomic uint64_t canary_ok_ns;           /* atomic: last pass (or the start) */
	uint64_t canary_runs, canary_failed;     /* mu */
	double canary_err;                       /* mu: last relative error */
};

struct gpu_backend {
	struct backend base;
	uv_loop_t *loop;                 /* open */
	uv_async_t async;                /* any thread sends; the loop owns it */
	bool async_open;                 /* open */
	uv_idle_t spin;                  /* loop: started while spin_jobs > 0, until spin_until,
	                                  * or while an inline job waits for the check handle */
	bool spin_open;                  /* open */
	unsigned spin_jobs;              /* loop */
	uint64_t spin_until;             /* loop: a prewake's poll lasts until then */
	uv_check_t check;                /* loop: hands an inline job back in the same loop turn */
	bool check_open;                 /* open */
	bool inline_pending;             /* loop: an inline job is on the done list, unannounced */
	uint64_t prewake_ns;             /* open: --prewake-us (0: off) */
	unsigned handles_open;           /* loop: async, spin and check, freed when all are closed */
	backend_done_fn done;            /* open */
	void *done_arg;                  /* open */
	void (*closed)(void *arg);       /* loop */
	void *closed_arg;                /* loop */
	struct gpu_dev devs[GPU_MAX_DEVICES];
	unsigned ndevs;                  /* open */
	unsigned rr;                     /* loop: round robin for host-only jobs */

	pthread_mutex_t mu;
	pthread_cond_t cv;               /* with mu: see "Locking" above */
	struct backend_done_list done_list; /* mu: finished, for the loop */
	bool stopping;                   /* mu */
	uint64_t fwd_ok, fwd_failed;     /* mu */
	uint64_t h2d_bytes, d2h_bytes;   /* mu: staging traffic of host regions */
	uint64_t async_enqueued;         /* mu: asynchronous jobs enqueued */
	uint64_t lat_ns[4], lat_n;       /* mu: sync jobs' submit->pick, pick->done, done->loop,
	                                  * and inline runs' time (where a request's time goes) */
	uint64_t async_ns[4];            /* mu: host time in the client-event wait, the launch,
	                                  * the event record, cuLaunchHostFunc (where async time goes) */
	struct gpu_ticket *tickets;      /* mu: asynchronous kernels not finished */
	unsigned ntickets;               /* mu */
	uint64_t gates_released;         /* loop: gates opened for a closed session's tickets */
	uint64_t gates_kept;             /* loop: gates of a freed session whose client event never
	                                  * fired, kept (256 bytes and a stream) until exit */
	uint64_t async_wait_ns;          /* open: --async-wait-ms */
	struct gpu_owner_dev *owners;    /* mu: every session's asynchronous state, all devices */
	uint64_t async_words, async_released, async_timeouts; /* mu: completion-word calls,
	                                  * waits the daemon released, of them for the timeout */

	/* Compile pool: jobs whose kernel is not loaded wait in `waiting` while a compile thread
	 * prepares it (fa_gpu_prepare, without mu); then they go to the worker. */
	struct compile_table waiting;     /* mu */
	pthread_cond_t compile_cv;        /* with mu: compile threads wait here */
	pthread_t compile_thr[GPU_MAX_COMPILE_THREADS]; /* open */
	unsigned ncompile;                /* written under mu while they start; the loop reads it */
	uint64_t compiles, compiles_failed, compile_jobs; /* mu */

	/* Background tuning (fa_tune.h): device 0's worker steps a tuner while its queue is
	 * empty; the candidates' kernels are compiled by the compile threads first (lowest
	 * priority) so a step only runs kernels. */
	struct fa_tune_table *tune;       /* open; NULL: none (heuristic tiles only) */
	bool tune_idle;                   /* open: --tune idle and the GPU ops could be made */
	struct fa_tune_ops tune_ops;      /* open: fa_tune_gpu_ops_init's */
	bool tune_ops_ok;                 /* open */
	struct fa_tuner *tuner;           /* worker (device 0's); STATS reads it racily */
	bool tune_prepping;               /* mu: the candidates are being compiled */
	struct fa_attn_fwd_desc tune_desc; /* mu: the class' tuning shape */
	struct fa_tile tune_tiles[FA_TUNE_DEFAULT_CANDIDATES]; /* mu */
	int tune_ntiles, tune_next, tune_left; /* mu: candidates, next to compile, not done */
	bool tune_save;                   /* mu: a compile thread saves the table */
	uint64_t tuned, tune_failed;      /* mu */
};

/* ---- small predicates (any thread, no lock) ------------------------------------------------- */

/* A polite busy-wait step. */
static inline void gpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Whether the job stages a tensor through the device scratch (a host-memory region). A
 * backward job has nine tensors, lse always among them. */
static inline bool gpu_job_stages_host(const struct backend_job *job)
{
	int n = job->is_bwd ? BACKEND_MAX_TENSORS : 5;
	for (int i = 0; i < n; i++)
		if (!job->on_device[i] && (job->is_bwd || i < 4 || job->lse != NULL))
			return true;
	return false;
}

/* The job's FLOPs, 4*B*Hq*Sq*Sk*D (the masked half counted too: a bound, for the latency
 * policies of gpu_loop.c); a backward pass counts 2.5 times that (FlashAttention's convention). */
static inline double gpu_job_flop(const struct backend_job *job)
{
	const struct fa_attn_fwd_desc *ds = &job->desc;
	return (job->is_bwd ? 10.0 : 4.0) * (double)ds->B * (double)ds->Hq * (double)ds->Sq *
	       (double)ds->Sk * (double)ds->D;
}

/* ---- gpu_queue.c: queues and their bookkeeping (mu held; no CUDA) --------------------------- */

/* Queue a job on d's worker (the caller wakes it: b->cv). FA_OK or FA_ENOMEM (job untouched). */
fa_status gpu_queue_locked(struct gpu_dev *d, struct backend_job *job);

/* Take up to GPU_PIPE synchronous jobs off d's queue into out, in the queue's order (runq.h:
 * high class first, sessions in turn): device-memory jobs, and at most one that stages host
 * memory (the scratch is one), which ends the batch; the batch also ends once its jobs sum to
 * GPU_PIECE_FLOP. An asynchronous job or a split one (piece_total > 1) is taken alone (returns
 * 1, the job in out[0]); one behind synchronous jobs ends the batch before it. Counts each
 * job's queue time (runq_started) and records the batch in d->cur. Returns how many (0: the
 * queue is empty). */
unsigned gpu_take_batch_locked(struct gpu_dev *d, struct backend_job **out);

/* Finish a job that will not run: status st, detail copied, onto the done list (the caller
 * wakes the loop). Counts nothing. */
void gpu_finish_locked(struct gpu_backend *b, struct backend_job *job, fa_status st,
                       const char *detail);

/* Answer the jobs of owner (all: NULL) waiting for a compile with st and why, in arrival
 * order, onto the done list (the caller wakes the loop). Returns how many. */
unsigned gpu_fail_waiting_locked(struct gpu_backend *b, const void *owner, fa_status st,
                                 const char *why);

/* Hand a finished job back: t_done, fwd_ok or fwd_failed by its status, the done list, the fatal
 * path when sticky (the job's detail is the why), and wakes the loop. */
void gpu_job_done_locked(struct gpu_backend *b, struct backend_job *job, bool sticky);

/* gpu_job_done_locked without the wake: for the loop thread itself (an inline run), which
 * drains the done list in the same loop turn (gpu_loop.c's check handle). */
void gpu_job_finish_locked(struct gpu_backend *b, struct backend_job *job, bool sticky);

/* The second hand-back of an asynchronous job (its kernel finished): now when the loop
 * delivered its reply already, else the loop does it right after the reply (gpu_loop.c). */
void gpu_async_finish_locked(struct gpu_backend *b, struct backend_job *job);

/* Finish every asynchronous job still in flight with st and why (the caller wakes the loop):
 * the fatal path, and a close that waited long enough. Their host functions, if they ever
 * run, find the ticket abandoned. */
void gpu_abandon_tickets_locked(struct gpu_backend *b, fa_status st, const char *why);

/* The context is lost: mark the fault (fault_mark; the first why wins), fail everything queued
 * on every device, waiting for a compile or in flight asynchronously with FA_EDEVICE, and wake
 * the loop, which reports it to the server (fault_check). */
void gpu_fatal_locked(struct gpu_backend *b, const char *why);

/* ops.cancel (loop thread, takes mu): hand back, with st and why, the queued and
 * compile-waiting jobs of owner (all when NULL) that no worker took yet; wakes the loop when
 * there were any. Returns how many. */
unsigned gpu_cancel(struct backend *base, const void *owner, fa_status st, const char *why);

/* ops.stop (loop thread, takes mu): tell the jobs of owner (all: NULL) on a worker now to stop;
 * a split job launches nothing more (gpu_exec.c checks between launches) and comes back with
 * st; a single launch runs to its end. Asynchronous kernels already enqueued cannot be
 * stopped, but for a closed session (owner not NULL) their gates are opened (gpu_owner_dev):
 * a kernel still waiting for its dead client's event runs at once on memory still mapped, so
 * its ticket finishes and its regions go. Not for owner NULL (the drain deadline): a live
 * client's kernel must not run before its inputs are ready. Returns how many were told. */
unsigned gpu_stop(struct backend *base, const void *owner, fa_status st, const char *why);

/* ---- gpu_split.c: large requests as several launches (no CUDA) ------------------------------ */

/* Plan a synchronous job's launches (at submit): piece_total 1 up to GPU_PIECE_FLOP (and for
 * asynchronous jobs), else ranges of batches (piece_rows 0, piece_bh batches each), else ranges
 * of whole GQA groups of one batch (piece_rows 1, piece_bh heads each, piece_row_blocks pieces
 * per batch). */
void gpu_split_plan(struct backend_job *job);

/* Launch k of a planned job: its descriptor, and the byte offsets of q, k, v, o and lse from
 * the job's pointers (all 0 for a job of one launch). */
void gpu_split_piece(const struct backend_job *job, int64_t k, struct fa_attn_fwd_desc *sub,
                     uint64_t off[5]);

/* ---- gpu_estimate.c: expected GPU times (no CUDA, the worker's) -------------------------- */

/* Remember a finished job's GPU time (its shape's entry, and the device's rate for large
 * jobs). Inference jobs and gpu_ns 0 are ignored. */
void gpu_estimate_note(struct gpu_estimator *e, const struct backend_job *job, uint64_t gpu_ns);

/* A job's expected GPU time in ns: its shape's last, else the rate's for a job of
 * GPU_LOOP_SPIN_MAX_FLOP or more, else 0 (unknown). */
uint64_t gpu_estimate_ns(struct gpu_estimator *e, const struct backend_job *job);

/* ---- gpu_exec.c: one synchronous job (the worker, or the loop for inline runs) -------------- */

/* A failed driver call inside a job: its detail names what, the GPU and the driver's text;
 * *sticky when the context is lost. Returns FA_ENOMEM for out of device memory, else
 * FA_EDEVICE. */
fa_status gpu_job_cuerr(struct gpu_dev *d, struct backend_job *job, fa_cu_res r, const char *what,
                        bool *sticky);

/* Enqueue one synchronous job on `stream` (host tensors: copies into the scratch, the kernel,
 * copies out) and record ev after it (ev NULL: none, the caller waits for the whole stream),
 * also after a failure (copies may be queued). Sets
 * job->status, detail and *sticky on a failure to enqueue; gpu_complete waits. Without mu. A job
 * that stages host memory uses d's scratch: only d's worker runs those (inline runs never). */
void gpu_enqueue(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream, fa_cu_event ev,
                 bool *sticky);

/* Wait for a job gpu_enqueue enqueued (its event; ev NULL: all of `stream`), classify what the
 * device says (*sticky), and count its staging bytes (takes mu). Backward jobs too
 * (gpu_enqueue_bwd). */
void gpu_complete(struct gpu_dev *d, struct backend_job *job, fa_cu_event ev, fa_cu_stream stream,
                  bool *sticky);

/* ---- gpu_stage.c: host tensors through d's scratch (every synchronous job kind) ------------- */

#define GPU_STAGE_MAX 9 /* the backward's tensors, the most of any job */

/* What a tensor is to the kernel: read, written, or written where it sees rows (the copy in
 * keeps the rest). */
enum gpu_stage_role {
	GPU_STAGE_IN,       /* copied in */
	GPU_STAGE_OUT,      /* copied out; in too only when its extent has holes (strided) */
	GPU_STAGE_OUT_KEEP, /* copied in and out: the kernel leaves some of its rows alone */
};

struct gpu_stage_tensor {
	const void *ptr; /* the job's address: device memory, or host memory to stage */
	bool on_device;
	enum gpu_stage_role role;
	int64_t shape[4], stride[4]; /* elements; stride[3] == 1 */
	size_t elem;                 /* bytes per element */
};

/* A job's tensors, in the order the launch takes them; zero it, gpu_stage_add each. */
struct gpu_stage {
	int n;
	struct gpu_stage_tensor t[GPU_STAGE_MAX];
	fa_cu_ptr dp[GPU_STAGE_MAX];  /* after gpu_stage_in: each tensor's device address */
	uint64_t ext[GPU_STAGE_MAX];  /* bytes each staged tensor spans */
	size_t bytes_in, bytes_out;   /* copied so far (the job's staging counters) */
};

/* Append a tensor: its shape [4] and outer strides [3] in elements (the last dim contiguous). */
void gpu_stage_add(struct gpu_stage *s, const void *ptr, bool on_device,
                   enum gpu_stage_role role, const int64_t shape[4], const int64_t stride3[3],
                   size_t elem);

/* Place every tensor (reserving d's scratch for the host ones) and queue the copies in on
 * stream. 0, or the driver's result with *what naming the step (the caller makes the job's
 * status of it: gpu_job_cuerr). d's worker only. */
fa_cu_res gpu_stage_in(struct gpu_dev *d, struct gpu_stage *s, fa_cu_stream stream,
                       const char **what);

/* Queue the copies back of the staged outputs, after the launch. Same contract. */
fa_cu_res gpu_stage_out(struct gpu_stage *s, fa_cu_stream stream, const char **what);

/* Make d's scratch at least `need` bytes (d's worker, its stream idle between jobs). Returns the
 * driver's result (0: fine). */
fa_cu_res gpu_scratch_reserve(struct gpu_dev *d, size_t need);

/* ---- gpu_exec_bwd.c: one backward job (d's worker; never inline: its first use compiles) ---- */

/* gpu_enqueue for a backward job (job->is_bwd): host tensors staged through d's scratch (the
 * inputs copied in, the gradients copied in only when strided with holes, and out after),
 * fa_gpu_attn_bwd, ev recorded after, also after a failure. Same contract as gpu_enqueue. */
void gpu_enqueue_bwd(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream,
                     fa_cu_event ev, bool *sticky);

/* Launch a backward job whose every tensor is on the device on `stream` (the asynchronous mode).
 * Returns fa_gpu_attn_bwd's status with job->detail. */
fa_status gpu_launch_bwd(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream);

/* Compile and load the kernels gpu_launch_bwd would launch for job, enqueue nothing (the
 * asynchronous mode, before the stream waits on the client: gpu_async.c says why). Returns
 * fa_gpu_attn_bwd's status with job->detail. */
fa_status gpu_prepare_bwd(struct gpu_dev *d, struct backend_job *job);

/* ---- gpu_exec_infer.c: one ATTN_VARLEN / ATTN_KVCACHE job (d's worker; never inline) ------- */

/* gpu_enqueue for an inference job (job->infer): the index snapshot (the client's tables copied
 * to the daemon, checked there by backend_infer_prepare, the checked copy uploaded to a device
 * buffer of the daemon's for the kernel; a bad entry fails the job with the entry named and
 * nothing written), host tensors staged through d's scratch (outputs copied in too: rows outside
 * the sequences stay as they were), fa_gpu_attn_infer, ev recorded after, also after a failure.
 * Synchronises the stream once for the snapshot. Same contract as gpu_enqueue. */
void gpu_enqueue_infer(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream,
                       fa_cu_event ev, bool *sticky);

/* How an asynchronous snapshot waits for its copies on stream s: 0 once they are done, or a
 * CUDA error; *why set (not FA_OK) when it gave up on the client (its ready word released:
 * FA_ETIMEDOUT, FA_ECLOSED), the job then fails with nothing launched. */
typedef fa_cu_res (*gpu_snapshot_wait_fn)(void *arg, fa_cu_stream s, fa_status *why);

/* Grow *pinned to the bytes job's index tables take (the asynchronous mode, before the stream
 * waits on the client: freeing the old pinned block may synchronize the context). FA_OK, or
 * the job's status with its detail. */
fa_status gpu_snap_reserve(struct gpu_dev *d, struct backend_job *job,
                           struct gpu_snap_host *pinned, bool *sticky);

/* An asynchronous inference job (every tensor and table on the device) on `stream`, behind the
 * client's ready word: the snapshot as gpu_enqueue_infer's (copied into *pinned, grown as
 * needed), waited for by wait(wait_arg), then fa_gpu_attn_infer. Returns its status with job->detail (a bad entry: nothing launched). */
fa_status gpu_launch_infer_async(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream,
                                 gpu_snapshot_wait_fn wait, void *wait_arg,
                                 struct gpu_snap_host *pinned, bool *sticky);

/* ---- gpu_worker.c --------------------------------------------------------------------------- */

/* A device's worker thread (arg: its struct gpu_dev), started by gpu_open, joined by
 * gpu_close: runs until stopping and its queue is empty. */
void *gpu_worker(void *arg);

/* ---- gpu_async.c: the asynchronous mode ----------------------------------------------------- */

/* This session's resources on d, created on first use (d's worker, without mu): the stream and
 * the session's thread. NULL with job's status and detail set. */
struct gpu_owner_dev *gpu_owner_dev(struct gpu_dev *d, struct backend_job *job);

/* ops.owner_free (loop thread): stop the session's threads, release its streams and events. */
void gpu_owner_free(struct backend *base, void *state);

/* ops.cancel: gpu_cancel (the owner's queued jobs, all when owner is NULL), and the enqueued
 * asynchronous calls of the owner (all) whose completion word the client never wrote are
 * released by their session's thread (the session closed: nothing of it may outlive it).
 * Returns gpu_cancel's count. */
unsigned gpu_async_cancel(struct backend *base, const void *owner, fa_status st,
                          const char *why);

/* Whether every device runs 64-bit stream memory operations (gpu_open, after the devices):
 * the completion words; without them only the IPC-event path is offered. */
bool gpu_async_words_supported(struct gpu_backend *b);
/* Hand an asynchronous job to its session's thread on d (created on first use, d's context
 * current; mutex not held): appended to the session's jobs, which run in order. When the
 * session's state cannot be made, the job is handed back with that status. */
void gpu_async_handoff(struct gpu_dev *d, struct backend_job *job);

/* Load every device's completion-word release kernel (at open, before any stream can wait on
 * a client: loading a module may need the whole context idle, and the release exists to unblock
 * a stream that waits). Logs a device whose load failed; its releases then fail, logged. */
void gpu_async_words_load(struct gpu_backend *b);

/* ---- gpu_compile.c -------------------------------------------------------------------------- */

/* A compile thread (arg: the backend), started by gpu_open, joined by gpu_close. */
void *gpu_compiler(void *arg);

/* ---- gpu_tune.c ----------------------------------------------------------------------------- */

/* Open the tuning table and, with --tune idle, the tuner's GPU ops (gpu_open, after device 0
 * is open and before any thread starts). Failures only cost the tuning: logged. */
void gpu_tune_open(struct gpu_backend *b, const struct config *cfg);

/* One idle turn of d's worker (mu held, d's queue empty, not stopping): one tuning step, or
 * starting the next class; mu is released around the CUDA work. Returns true when it did
 * something (the caller re-checks its queue: a client job waits at most one step), false when
 * there is nothing to do (the caller sleeps; the compile threads wake it). */
bool gpu_tune_turn_locked(struct gpu_dev *d);

/* ---- gpu_canary.c --------------------------------------------------------------------------- */

/* Prepare d's canary (gpu_dev_open): inputs, the float64 reference, device buffers, the
 * kernel. FA_OK, or the status with err. */
fa_status gpu_canary_init(struct gpu_dev *d, char *err, size_t errlen);

/* The canary's turn on d's worker (mu held; released while it runs): run it when it is due. A
 * wrong result or a lost context is the fatal path. Returns whether it ran. */
bool gpu_canary_turn_locked(struct gpu_dev *d);

/* ops.healthy (loop thread, no lock): no fault and every canary passed recently. */
bool gpu_healthy(struct backend *base);

/* ---- gpu_region.c --------------------------------------------------------------------------- */

/* ops.region_open (loop thread): pin host memory, or open a CUDA IPC handle once. */
fa_status gpu_region_open(struct backend *base, struct region *r, const uint8_t *ipc_handle,
                          const uint8_t *gpu_uuid, char *err, size_t errlen);

/* ---- gpu_stats.c ---------------------------------------------------------------------------- */

/* ops.stats (loop thread, takes mu): the "# gpu", "# tuning" and "# kernels" sections. */
void gpu_stats(struct backend *base, char *buf, size_t cap);

/* ---- gpu_loop.c: the loop thread's side ------------------------------------------------------ */

/* ops.submit: queue a job on its device, or put it behind a compile, or run it inline. */
fa_status gpu_submit(struct backend *base, struct backend_job *job);
/* backend_ops.flush: an inline run's hand-back at once (gpu_loop.c). */
void gpu_flush(struct backend *base);

/* The async handle's callback: hand finished jobs back (an asynchronous job's first hand-back
 * is its reply), then fault_check. Also called by gpu_close. */
void gpu_async_cb(uv_async_t *h);

/* ---- gpu_dev.c ------------------------------------------------------------------------------ */

/* Open one device (ordinal): fa_gpu, the driver (fa_cu_load), the primary context,
 * the worker's and the inline streams, the pipeline's events, the canary. FA_OK, or the status
 * with err; gpu_dev_fini releases what was opened either way. */
fa_status gpu_dev_open(struct gpu_backend *b, struct gpu_dev *d, int ordinal,
                       const struct config *cfg, char *err, size_t errlen);

/* Release a device's resources (its worker has stopped) and zero it. */
void gpu_dev_fini(struct gpu_dev *d);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints a device's UUID. */
void gpu_uuid_text(const uint8_t u[16], char out[48]);

/* gpu_timing.c: job i of the worker's batch starts / ends on stream s (worker thread); the
 * batch of n jobs is enqueued; job i completed (its event waited for): its GPU time into
 * job->gpu_ns and the device's counters, with the gap before it. fini: the events (the worker
 * has stopped). */
void gpu_timing_start(struct gpu_dev *d, unsigned i, fa_cu_stream s);
void gpu_timing_end(struct gpu_dev *d, unsigned i, fa_cu_stream s);
void gpu_timing_batch_end(struct gpu_dev *d, unsigned n, fa_cu_stream s);
void gpu_timing_read(struct gpu_dev *d, unsigned i, struct backend_job *job);
void gpu_timing_fini(struct gpu_dev *d);
/* The host time a timed job's enqueue took (the worker, after gpu_enqueue). */
void gpu_timing_enqueued(struct gpu_dev *d, uint64_t host_ns);
/* How late the worker saw a lone job's end (host clock: its start plus its GPU time, to the
 * return of its wait). */
void gpu_timing_detected(struct gpu_dev *d, uint64_t late_ns);
/* The asynchronous side (a session's thread, its context current): the kernel of the stream's
 * next job starts (an event when a slot is free) / ended on stream s; read: every completed
 * pair so far into d's counters (never waits); fini: the events. */
void gpu_atiming_start(struct gpu_atiming *t, fa_cu_stream s);
void gpu_atiming_end(struct gpu_atiming *t, fa_cu_stream s);
void gpu_atiming_read(struct gpu_atiming *t, struct gpu_dev *d);
void gpu_atiming_fini(struct gpu_atiming *t);

#endif /* FA_DAEMON_GPU_INT_H */
