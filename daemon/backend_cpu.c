/* backend_cpu.c - attention on a pool of worker threads with the CPU reference (the backward
 * pass's part: backend_cpu_bwd.c).
 *
 * ---- Jobs and pieces (the interface a new job kind plugs into) ---------------------------------
 * Every job is cut into pieces, and a worker computes one piece at a time with no lock held. A
 * job kind is two functions in a struct cpu_kind (cpu_kind_of picks it from the job):
 *   plan(b, job): sets job->piece_total (>= 1) and whatever run() needs (the forward uses
 *                 piece_bh, piece_rows, piece_row_blocks), on the loop thread at submit. Each
 *                 piece should be at most CPU_PIECE_FLOP of work (about 50 ms of one worker):
 *                 that is how long a stopped or cancelled job may still run, and how long
 *                 another session waits for a worker at most;
 *   run(job, k):  computes piece k in [0, piece_total) on a worker; pieces of one job run at
 *                 the same time on several workers and must write disjoint bytes. Returns
 *                 FA_OK or the job's failure (the rest of the job is then skipped).
 * The forward (cpu_fwd_kind): pieces are ranges of (batch, head) pairs; a pair bigger than a
 * piece is cut into blocks of query rows, each computed through a sub-descriptor (one batch,
 * one head, the rows' slice of Q, O and lse; a causal mask re-aligned by trimming the keys), so
 * the reference needs no change and the result is the same bytes.
 *
 * ---- Scheduling ---------------------------------------------------------------------------------
 * Jobs with pieces not yet started wait in a struct runq (runq.h): priority classes, sessions
 * in turn within a class, and a job rotated to the tail of its session's queue after each piece
 * (many small requests run side by side; none waits for a big one to finish). A session may
 * occupy at most `share` workers at once (--session-workers, default threads - 1), so one
 * client cannot hold every worker while others wait; a worker that finds only sessions at their
 * share sleeps until a piece ends.
 * Stopping: ops.cancel hands back the jobs that have not started; ops.stop (a client gone, the
 * drain deadline) marks started jobs so that no further piece starts; the last running piece
 * hands the job back. So a dead client's request stops within one piece's time.
 * Completion: the worker that finishes a job's last piece puts it on the done list and wakes
 * the loop with uv_async_send; the loop hands it to the server (backend_done_fn).
 *
 * ---- Faults -------------------------------------------------------------------------------------
 * A client can shrink its shm object after registering it; touching the missing pages raises
 * SIGBUS. While a worker computes, the SIGBUS handler knows the job's mappings: a fault inside
 * one replaces the rest of that mapping with anonymous zero pages (so the access is retried and
 * the computation runs to its end harmlessly), marks the mapping broken, and the job fails with
 * FA_ERANGE. This is how Wayland compositors survive clients that shrink wl_shm pools; unlike a
 * longjmp out of the reference it leaks nothing. Jobs on the same mapping that finish after the
 * fault fail too (they may have read zeros), and validation refuses the region from then on.
 */
#include "backend.h"
#include "backend_cpu_infer.h"
#include "backend_cpu_bwd.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "runq.h"
#include "util.h"
#include "worklimit.h"

/* Multiply-adds per piece below which splitting a request costs more than it saves. */
#define CPU_MIN_CHUNK_WORK (INT64_C(1) << 20)
#define CPU_CHUNKS_PER_WORKER 4
/* The most work of one piece: about 50 ms of one worker (the reference runs 5-6 GFLOP/s per
 * thread on the build machine). A stopped job runs on for at most this long. */
#define CPU_PIECE_FLOP 2.5e8

struct cpu_backend;

/* A job kind: see "Jobs and pieces" at the top. */
struct cpu_kind {
	void (*plan)(struct cpu_backend *b, struct backend_job *job);
	fa_status (*run)(const struct backend_job *job, int64_t k);
};

/* One worker thread and the job whose piece it is computing (NULL: none). */
struct cpu_worker {
	struct cpu_backend *b;
	pthread_t thread;
	struct backend_job *job; /* mu */
};

struct cpu_backend {
	struct backend base;
	uv_loop_t *loop;
	uv_async_t async;
	backend_done_fn done;
	void *done_arg;
	void (*closed)(void *arg);
	void *closed_arg;
	struct cpu_worker *workers;
	unsigned nworkers;
	unsigned share;                            /* workers one owner may occupy */

	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct runq queue;                        /* mu: jobs with pieces not yet started */
	struct backend_done_list done_list;        /* mu: finished, for the loop */
	uint64_t pieces_run, jobs_stopped;         /* mu: for STATS */
	bool stopping;                             /* mu */
};

/* The job this worker is computing, NULL outside one: what the SIGBUS handler may repair. */
static _Thread_local const struct backend_job *cpu_current_job;
static uintptr_t cpu_page_size;

/* Async-signal-safe: reads the thread's job, calls mmap, stores an atomic. */
static void cpu_sigbus_handler(int sig, siginfo_t *si, void *ctx)
{
	const struct backend_job *job = cpu_current_job;
	uintptr_t a = (uintptr_t)si->si_addr;
	(void)ctx;

	for (unsigned i = 0; job != NULL && i < job->nranges; i++) {
		const struct backend_range *r = &job->ranges[i];
		uintptr_t base = (uintptr_t)r->base;
		if (a < base || a - base >= r->size)
			continue;
		uintptr_t page = a & ~(cpu_page_size - 1);
		uintptr_t end = (base + r->size + cpu_page_size - 1) & ~(cpu_page_size - 1);
		if (mmap((void *)page, end - page, PROT_READ | PROT_WRITE,
		         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
			break;
		atomic_store(r->broken, 1);
		return; /* the access is retried on the new pages */
	}
	/* Not a region of the running job: fault as if nobody had handled it. */
	signal(sig, SIG_DFL);
}

/* Installed at every open (not once per process): a test harness may have replaced it. */
static fa_status cpu_install_sigbus(void)
{
	struct sigaction sa;

	cpu_page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = cpu_sigbus_handler;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, NULL) != 0)
		return FA_ESYS;
	return FA_OK;
}

/* Did any mapping of the job lose pages (during this job or before)? */
static bool cpu_job_broken(const struct backend_job *job)
{
	for (unsigned i = 0; i < job->nranges; i++)
		if (atomic_load(job->ranges[i].broken))
			return true;
	return false;
}

/* ---- the forward kind ------------------------------------------------------------------------ */

/* Rows [s0, s1) of pair bh through a sub-descriptor: one batch, one head, the rows' slice of Q,
 * O and lse. A causal mask is re-aligned by trimming the keys: with Sk' keys, bottom-right
 * makes row r see keys j <= r + Sk' - Sq', which is the full problem's rule for these rows
 * when Sk' = s1 + Sk - Sq (bottom-right) or Sk' = s1 (top-left, rows below Sk). */
static fa_status cpu_fwd_rows(const struct backend_job *job, int64_t bh, int64_t s0, int64_t s1)
{
	const struct fa_attn_fwd_desc *d = &job->desc;
	size_t es = fa_dtype_size(d->dtype);
	int64_t b = bh / d->Hq, h = bh % d->Hq, hk = h / (d->Hq / d->Hkv);
	struct fa_attn_fwd_desc sub = *d;
	const char *q = (const char *)job->q +
	                (b * d->q_stride[0] + s0 * d->q_stride[1] + h * d->q_stride[2]) * (int64_t)es;
	const char *k = (const char *)job->k + (b * d->k_stride[0] + hk * d->k_stride[2]) * (int64_t)es;
	const char *v = (const char *)job->v + (b * d->v_stride[0] + hk * d->v_stride[2]) * (int64_t)es;
	char *o = (char *)job->o +
	          (b * d->o_stride[0] + s0 * d->o_stride[1] + h * d->o_stride[2]) * (int64_t)es;
	float *lse = job->lse != NULL ? job->lse + b * d->lse_stride[0] + h * d->lse_stride[1] +
	                                    s0 * d->lse_stride[2]
	                              : NULL;

	sub.B = sub.Hq = sub.Hkv = 1;
	sub.Sq = s1 - s0;
	switch (d->mask) {
	case FA_MASK_CAUSAL_BOTTOM_RIGHT:
		sub.Sk = s1 + d->Sk - d->Sq;
		if (sub.Sk <= 0) {
			/* no row of the block sees a key: O = 0, lse = -inf, as the reference does */
			for (int64_t r = 0; r < sub.Sq; r++) {
				for (int64_t i = 0; i < d->D; i++)
					fa_store_elem(o, d->dtype, r * d->o_stride[1] + i, 0.0);
				if (lse != NULL)
					lse[r * d->lse_stride[2]] = -INFINITY;
			}
			return FA_OK;
		}
		break;
	case FA_MASK_CAUSAL_TOP_LEFT:
		if (s0 >= d->Sk) {
			sub.mask = FA_MASK_NONE; /* these rows see every key */
		} else if (s1 > d->Sk) {
			fa_status st = cpu_fwd_rows(job, bh, s0, d->Sk);
			return st != FA_OK ? st : cpu_fwd_rows(job, bh, d->Sk, s1);
		} else {
			sub.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
			sub.Sk = s1;
		}
		break;
	default:
		break;
	}
	return fa_attn_fwd_ref(&sub, q, k, v, o, lse, 0, 1);
}

/* Piece k: a range of (batch, head) pairs, or one pair's block of query rows. */
static fa_status cpu_fwd_run(const struct backend_job *job, int64_t k)
{
	const struct fa_attn_fwd_desc *d = &job->desc;
	int64_t total = d->B * d->Hq;

	if (job->piece_row_blocks <= 1) {
		int64_t bh0 = k * job->piece_bh;
		int64_t bh1 = bh0 + job->piece_bh < total ? bh0 + job->piece_bh : total;
		return fa_attn_fwd_ref(d, job->q, job->k, job->v, job->o, job->lse, bh0, bh1);
	}
	int64_t bh = k / job->piece_row_blocks, s0 = (k % job->piece_row_blocks) * job->piece_rows;
	int64_t s1 = s0 + job->piece_rows < d->Sq ? s0 + job->piece_rows : d->Sq;
	return cpu_fwd_rows(job, bh, s0, s1);
}

/* Pieces of (batch, head) pairs: fewer for small problems (a piece is worth a wake-up), up to
 * CPU_CHUNKS_PER_WORKER per worker for big ones (one large request keeps every worker busy), and
 * never more than CPU_PIECE_FLOP each: a pair above that is cut into blocks of query rows. */
static void cpu_fwd_plan(struct cpu_backend *b, struct backend_job *job)
{
	const struct fa_attn_fwd_desc *d = &job->desc;
	int64_t total = d->B * d->Hq; /* fits: fa_attn_fwd_check bounded B*Sq*Hq*D */
	double per_bh = 4.0 * (double)d->D * worklimit_pairs(d, 0, d->Sq); /* FLOPs */
	double macs = per_bh / 4.0 * (double)total;
	int64_t nchunks = macs / (double)CPU_MIN_CHUNK_WORK >= (double)INT64_MAX
	                      ? INT64_MAX : (int64_t)(macs / (double)CPU_MIN_CHUNK_WORK);

	if (nchunks > (int64_t)b->nworkers * CPU_CHUNKS_PER_WORKER)
		nchunks = (int64_t)b->nworkers * CPU_CHUNKS_PER_WORKER;
	if (nchunks > total)
		nchunks = total;
	if (nchunks < 1)
		nchunks = 1;
	job->piece_bh = (total + nchunks - 1) / nchunks;
	job->piece_rows = d->Sq;
	job->piece_row_blocks = 1;
	if (per_bh > CPU_PIECE_FLOP) {
		/* a row sees at most Sk keys: rows per block from that bound */
		double per_row = 4.0 * (double)d->D * (double)d->Sk;
		double rows = floor(CPU_PIECE_FLOP / per_row);
		job->piece_bh = 1;
		job->piece_rows = rows < 1.0 ? 1 : rows >= (double)d->Sq ? d->Sq : (int64_t)rows;
		job->piece_row_blocks = (d->Sq + job->piece_rows - 1) / job->piece_rows;
	} else if ((double)job->piece_bh * per_bh > CPU_PIECE_FLOP) {
		job->piece_bh = (int64_t)floor(CPU_PIECE_FLOP / per_bh);
		if (job->piece_bh < 1)
			job->piece_bh = 1;
	}
	/* B*Hq*Sq fits in int64 (checked), and so does this product */
	job->piece_total = (total + job->piece_bh - 1) / job->piece_bh * job->piece_row_blocks;
}

static const struct cpu_kind cpu_fwd_kind = {cpu_fwd_plan, cpu_fwd_run};

/* Pieces of whole units (a job kind whose run() takes a range of units): up to
 * CPU_CHUNKS_PER_WORKER per worker and at most CPU_PIECE_FLOP each, but never less than one
 * unit: a single unit bigger than a piece runs whole (bounded by the request's work limit).
 * per_unit: multiply-adds of one unit (saturated). */
static void cpu_units_plan(struct cpu_backend *b, struct backend_job *job, int64_t units,
                           int64_t per_unit)
{
	int64_t nchunks, work;

	if (__builtin_mul_overflow(per_unit, units, &work))
		work = INT64_MAX;
	nchunks = work / CPU_MIN_CHUNK_WORK;
	if (nchunks > (int64_t)b->nworkers * CPU_CHUNKS_PER_WORKER)
		nchunks = (int64_t)b->nworkers * CPU_CHUNKS_PER_WORKER;
	if (nchunks > units)
		nchunks = units;
	if (nchunks < 1)
		nchunks = 1;
	job->piece_bh = (units + nchunks - 1) / nchunks;
	double per_unit_flop = 2.0 * (double)per_unit;
	if ((double)job->piece_bh * per_unit_flop > CPU_PIECE_FLOP) {
		job->piece_bh = (int64_t)floor(CPU_PIECE_FLOP / per_unit_flop);
		if (job->piece_bh < 1)
			job->piece_bh = 1;
	}
	job->piece_rows = 0;
	job->piece_row_blocks = 1;
	job->piece_total = (units + job->piece_bh - 1) / job->piece_bh;
}

/* The units [u0, u1) of piece k of a job planned by cpu_units_plan. */
static void cpu_units_of_piece(const struct backend_job *job, int64_t units, int64_t k,
                               int64_t *u0, int64_t *u1)
{
	*u0 = k * job->piece_bh;
	*u1 = *u0 + job->piece_bh < units ? *u0 + job->piece_bh : units;
}

/* The backward (backend_cpu_bwd.c): units are (batch, kv-head) pairs, the unit that owns a
 * dK/dV slice, so pieces never write the same byte. */
static void cpu_bwd_plan(struct cpu_backend *b, struct backend_job *job)
{
	int64_t units, per_unit;

	cpu_bwd_units(job, &units, &per_unit);
	cpu_units_plan(b, job, units, per_unit);
}

static fa_status cpu_bwd_piece(const struct backend_job *job, int64_t k)
{
	int64_t u0, u1;

	cpu_units_of_piece(job, job->bwd.desc.fwd.B * job->bwd.desc.fwd.Hkv, k, &u0, &u1);
	return cpu_bwd_run(job, u0, u1);
}

static const struct cpu_kind cpu_bwd_kind = {cpu_bwd_plan, cpu_bwd_piece};

/* ATTN_VARLEN / ATTN_KVCACHE (backend_cpu_infer.c): units are (sequence, query head) pairs;
 * desc.B counts the sequences and desc.Sq, desc.Sk bound their lengths, so a unit's work is at
 * most a dense pair's. */
static void cpu_infer_plan(struct cpu_backend *b, struct backend_job *job)
{
	const struct fa_attn_fwd_desc *d = &job->desc;
	int64_t per_unit;

	if (__builtin_mul_overflow(d->Sq, d->Sk, &per_unit) ||
	    __builtin_mul_overflow(per_unit, 2 * d->D, &per_unit))
		per_unit = INT64_MAX;
	cpu_units_plan(b, job, d->B * d->Hq, per_unit);
}

static fa_status cpu_infer_piece(const struct backend_job *job, int64_t k)
{
	int64_t u0, u1;

	cpu_units_of_piece(job, job->desc.B * job->desc.Hq, k, &u0, &u1);
	return cpu_infer_run(job, u0, u1);
}

static const struct cpu_kind cpu_infer_kind = {cpu_infer_plan, cpu_infer_piece};

/* The kind of a job. */
static const struct cpu_kind *cpu_kind_of(const struct backend_job *job)
{
	return job->infer != NULL ? &cpu_infer_kind : job->is_bwd ? &cpu_bwd_kind : &cpu_fwd_kind;
}

/* ---- running pieces -------------------------------------------------------------------------- */

/* Compute piece k of a job, with the SIGBUS repair armed. */
static fa_status cpu_run_piece(const struct backend_job *job, int64_t k)
{
	fa_status st;

	cpu_current_job = job;
	st = cpu_kind_of(job)->run(job, k);
	cpu_current_job = NULL;
	if (st == FA_OK && cpu_job_broken(job))
		st = FA_ERANGE;
	return st;
}

/* The detail text a failed job carries back to its client. */
static void cpu_fail_detail(struct backend_job *job, fa_status st)
{
	if (st != FA_ERANGE && cpu_infer_detail(job))
		return; /* a bad index entry, named */
	switch (st) {
	case FA_ERANGE:
		snprintf(job->detail, sizeof job->detail,
		         "a region's shared memory object shrank below its registered size while "
		         "in use; the result is not valid and the region must be unregistered");
		break;
	case FA_ENOMEM:
		snprintf(job->detail, sizeof job->detail,
		         "the daemon ran out of memory for the CPU reference's scratch buffers");
		break;
	default:
		snprintf(job->detail, sizeof job->detail, "the CPU reference failed: %s",
		         fa_status_name(st));
		break;
	}
}

/* May another piece of owner start (mu held)? Under its share of the workers. */
static bool cpu_owner_ok(const void *owner, void *arg)
{
	struct cpu_backend *b = arg;
	unsigned n = 0;

	for (unsigned i = 0; i < b->nworkers; i++)
		if (b->workers[i].job != NULL && b->workers[i].job->owner == owner)
			n++;
	return n < b->share;
}

/* A started job with nothing left to start and nothing running: hand it back (mu held). */
static void cpu_job_finish_locked(struct cpu_backend *b, struct backend_job *job)
{
	/* A fault in another job on the same mapping may have fed this one zeros. */
	if (job->status == FA_OK && cpu_job_broken(job)) {
		job->status = FA_ERANGE;
		cpu_fail_detail(job, FA_ERANGE);
	}
	job->compute_ns = fa_now_ns() - job->t_start;
	atomic_fetch_sub(&b->base.running, 1);
	backend_done_push(&b->done_list, job);
	uv_async_send(&b->async);
}

/* Skip what is left of a queued job (mu held): it leaves the queue. */
static void cpu_skip_rest_locked(struct cpu_backend *b, struct backend_job *job)
{
	if (job->piece_next < job->piece_total) {
		runq_take(&b->queue, job);
		job->piece_next = job->piece_total;
	}
}

/* A worker: take one piece of the job whose turn it is, compute it, repeat. */
static void *cpu_worker(void *arg)
{
	struct cpu_worker *w = arg;
	struct cpu_backend *b = w->b;

	pthread_mutex_lock(&b->mu);
	for (;;) {
		struct backend_job *job;
		while ((job = runq_peek(&b->queue, cpu_owner_ok, b)) == NULL &&
		       !(b->stopping && runq_len(&b->queue) == 0))
			pthread_cond_wait(&b->cv, &b->mu);
		if (job == NULL)
			break; /* stopping, and nothing left */
		int64_t k = job->piece_next++;
		if (job->piece_next == job->piece_total)
			runq_take(&b->queue, job);
		else
			runq_rotate(&b->queue, job); /* its next piece waits its turn */
		if (k == 0) {
			job->t_start = fa_now_ns();
			runq_started(&b->queue, job, job->t_start);
			atomic_fetch_add(&b->base.running, 1);
		}
		job->pieces_running++;
		w->job = job;
		b->pieces_run++;
		pthread_mutex_unlock(&b->mu);
		fa_status st = cpu_run_piece(job, k);
		pthread_mutex_lock(&b->mu);
		w->job = NULL;
		job->pieces_running--;
		if (st != FA_OK && job->status == FA_OK) {
			job->status = st;
			cpu_fail_detail(job, st);
			cpu_skip_rest_locked(b, job); /* a piece failed: the rest is not worth it */
		}
		if (job->pieces_running == 0 && job->piece_next == job->piece_total)
			cpu_job_finish_locked(b, job);
		if (runq_len(&b->queue) > 0)
			pthread_cond_broadcast(&b->cv); /* a worker held back by a share may go */
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* On the loop: hand finished jobs to the server. */
static void cpu_async_cb(uv_async_t *h)
{
	struct cpu_backend *b = h->data;

	backend_done_drain(&b->done_list, &b->mu, b->done, b->done_arg);
	fault_check(&b->base);
}

/* Plan the job's pieces and queue it. */
static fa_status cpu_submit(struct backend *base, struct backend_job *job)
{
	struct cpu_backend *b = (struct cpu_backend *)base;

	job->status = FA_OK;
	job->compute_ns = 0;
	job->detail[0] = '\0';
	job->piece_next = 0;
	job->pieces_running = 0;
	job->t_start = 0;
	job->t_submit = fa_now_ns();
	atomic_store(&job->stop, false);
	cpu_kind_of(job)->plan(b, job);

	pthread_mutex_lock(&b->mu);
	if (b->stopping) {
		pthread_mutex_unlock(&b->mu);
		return FA_ECLOSED;
	}
	if (runq_push(&b->queue, job) != FA_OK) {
		pthread_mutex_unlock(&b->mu);
		return FA_ENOMEM;
	}
	if (job->piece_total > 1)
		pthread_cond_broadcast(&b->cv);
	else
		pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
	return FA_OK;
}

/* runq_remove's filters: jobs no worker has started, and started ones. */
static bool cpu_unstarted(const struct backend_job *job, void *arg)
{
	(void)arg;
	return job->piece_next == 0;
}

static bool cpu_started(const struct backend_job *job, void *arg)
{
	(void)arg;
	return job->piece_next > 0;
}

/* Hand back, with status st, the queued jobs of owner that no worker has started. */
static unsigned cpu_cancel(struct backend *base, const void *owner, fa_status st, const char *why)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	unsigned n = 0;

	pthread_mutex_lock(&b->mu);
	struct backend_job *job = runq_remove(&b->queue, owner, cpu_unstarted, NULL);
	while (job != NULL) {
		struct backend_job *next = job->next;
		job->status = st;
		snprintf(job->detail, sizeof job->detail, "%s", why);
		backend_done_push(&b->done_list, job);
		n++;
		job = next;
	}
	if (n > 0)
		uv_async_send(&b->async);
	pthread_mutex_unlock(&b->mu);
	return n;
}

/* Mark a started job stopped (mu held): its status and detail, counted once. */
static bool cpu_tell_stop_locked(struct cpu_backend *b, struct backend_job *job, fa_status st,
                                 const char *why)
{
	if (atomic_load(&job->stop))
		return false;
	atomic_store(&job->stop, true);
	job->stop_status = st;
	if (job->status == FA_OK) {
		job->status = st;
		snprintf(job->detail, sizeof job->detail, "%s", why);
	}
	b->jobs_stopped++;
	return true;
}

/* ops.stop: no further piece of owner's started jobs; see backend.h. */
static unsigned cpu_stop(struct backend *base, const void *owner, fa_status st, const char *why)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	unsigned n = 0;

	pthread_mutex_lock(&b->mu);
	/* Started jobs with pieces left: out of the queue; handed back now if none runs. */
	struct backend_job *job = runq_remove(&b->queue, owner, cpu_started, NULL);
	while (job != NULL) {
		struct backend_job *next = job->next;
		job->next = NULL;
		job->piece_next = job->piece_total;
		n += cpu_tell_stop_locked(b, job, st, why);
		if (job->pieces_running == 0)
			cpu_job_finish_locked(b, job);
		job = next;
	}
	/* Jobs whose last pieces are running: their result is not wanted either. */
	for (unsigned i = 0; i < b->nworkers; i++) {
		struct backend_job *r = b->workers[i].job;
		if (r != NULL && (owner == NULL || r->owner == owner))
			n += cpu_tell_stop_locked(b, r, st, why);
	}
	pthread_mutex_unlock(&b->mu);
	return n;
}

/* ops.stats: the "# scheduler" section. */
static void cpu_stats(struct backend *base, char *buf, size_t cap)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	size_t n = strlen(buf);

	pthread_mutex_lock(&b->mu);
	snprintf(buf + n, cap - n,
	         "# scheduler\nsession_workers:%u\ncpu_pieces_run:%" PRIu64
	         "\ncpu_jobs_stopped:%" PRIu64 "\n",
	         b->share, b->pieces_run, b->jobs_stopped);
	runq_stats(&b->queue, buf, cap);
	pthread_mutex_unlock(&b->mu);
}

/* The async handle is closed: release the backend. */
static void cpu_handle_closed(uv_handle_t *h)
{
	struct cpu_backend *b = h->data;
	void (*closed)(void *) = b->closed;
	void *arg = b->closed_arg;

	runq_fini(&b->queue);
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
	free(b->workers);
	free(b);
	if (closed != NULL)
		closed(arg);
}

/* Stop the workers after the queue drains, deliver what finished, close the handle. */
static void cpu_close(struct backend *base, void (*closed)(void *arg), void *arg)
{
	struct cpu_backend *b = (struct cpu_backend *)base;

	pthread_mutex_lock(&b->mu);
	b->stopping = true;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	/* Workers finish what is queued, then exit. */
	for (unsigned i = 0; i < b->nworkers; i++)
		pthread_join(b->workers[i].thread, NULL);
	cpu_async_cb(&b->async); /* every job is handed back exactly once */
	b->closed = closed;
	b->closed_arg = arg;
	uv_close((uv_handle_t *)&b->async, cpu_handle_closed);
}

/* Start the worker threads with every asynchronous signal blocked. */
static fa_status cpu_open(struct backend **out, uv_loop_t *loop, const struct config *cfg,
                          backend_done_fn done, void *arg, char *err, size_t errlen)
{
	struct cpu_backend *b;
	sigset_t all, old;
	int rv;

	*out = NULL;
	if (cpu_install_sigbus() != FA_OK)
		return fa_err(err, errlen, FA_ESYS, "installing the SIGBUS handler: %s",
		              strerror(errno));
	if ((b = calloc(1, sizeof(*b))) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	b->base.ops = &backend_cpu_ops;
	b->base.align = 0;
	b->base.host_memory = true;
	b->base.device_memory = false;
	b->base.infer = true;
	b->base.mask_ext = true;
	b->loop = loop;
	b->done = done;
	b->done_arg = arg;
	b->nworkers = cfg->threads > 0 ? (unsigned)cfg->threads : 1;
	b->share = cfg->session_workers > 0 ? (unsigned)cfg->session_workers
	           : b->nworkers > 1 ? b->nworkers - 1 : 1;
	if (b->share > b->nworkers)
		b->share = b->nworkers;
	b->base.default_max_gflop = WORKLIMIT_CPU_DEFAULT_GFLOP;
	runq_init(&b->queue);
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	if ((b->workers = calloc(b->nworkers, sizeof(*b->workers))) == NULL) {
		pthread_cond_destroy(&b->cv);
		pthread_mutex_destroy(&b->mu);
		free(b);
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	}
	if ((rv = uv_async_init(loop, &b->async, cpu_async_cb)) != 0) {
		free(b->workers);
		pthread_cond_destroy(&b->cv);
		pthread_mutex_destroy(&b->mu);
		free(b);
		return fa_err(err, errlen, FA_ESYS, "uv_async_init: %s", uv_strerror(rv));
	}
	b->async.data = b;

	/* Workers take no asynchronous signals (SIGTERM belongs to the loop's uv_signal);
	 * SIGBUS and the other faults are synchronous and still reach the faulting thread. */
	sigfillset(&all);
	sigdelset(&all, SIGBUS); /* a blocked synchronous fault kills the process outright */
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < b->nworkers; i++) {
		b->workers[i].b = b;
		if ((rv = pthread_create(&b->workers[i].thread, NULL, cpu_worker,
		                         &b->workers[i])) != 0) {
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			b->nworkers = i;
			fa_err(err, errlen, FA_ESYS, "starting worker thread %u: %s", i,
			       strerror(rv));
			cpu_close(&b->base, NULL, NULL);
			return FA_ESYS;
		}
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	b->base.threads = b->nworkers;
	log_info("backend: cpu with %u worker threads, at most %u per session", b->nworkers,
	         b->share);
	*out = &b->base;
	return FA_OK;
}

const struct backend_ops backend_cpu_ops = {
	.name = "cpu",
	.kind = FA_BACKEND_CPU,
	.open = cpu_open,
	.submit = cpu_submit,
	.cancel = cpu_cancel,
	.stop = cpu_stop,
	.close = cpu_close,
	.stats = cpu_stats,
};
