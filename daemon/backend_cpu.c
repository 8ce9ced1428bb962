/* backend_cpu.c - attention on a pool of worker threads with the CPU reference (the backward
 * pass's part: backend_cpu_bwd.c).
 *
 * Scheduling: a request is cut into chunks of (batch, head) pairs, fewer for small problems (a
 * chunk is worth a wake-up) and up to 4 per worker for big ones, so one large request keeps every
 * worker busy. The run queue is round-robin over requests: a worker takes one chunk of the head
 * request and moves it to the tail, so many small requests run side by side and none waits for a
 * large one to finish.
 * Completion: the worker that finishes a request's last chunk puts it on the done list and wakes
 * the loop with uv_async_send; the loop hands it to the server (backend_done_fn).
 * Faults: a client can shrink its shm object after registering it; touching the missing pages
 * raises SIGBUS. While a worker computes, the SIGBUS handler knows the job's mappings: a fault
 * inside one replaces the rest of that mapping with anonymous zero pages (so the access is
 * retried and the computation runs to its end harmlessly), marks the mapping broken, and the job
 * fails with FA_ERANGE. This is how Wayland compositors survive clients that shrink wl_shm
 * pools; unlike a longjmp out of the reference it leaks nothing. Jobs on the same mapping that
 * finish after the fault fail too (they may have read zeros), and validation refuses the region
 * from then on.
 */
#include "backend.h"
#include "backend_cpu_infer.h"
#include "backend_cpu_bwd.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "util.h"

/* Multiply-adds per chunk below which splitting a request costs more than it saves. */
#define CPU_MIN_CHUNK_WORK (INT64_C(1) << 20)
#define CPU_CHUNKS_PER_WORKER 4

struct cpu_backend {
	struct backend base;
	uv_loop_t *loop;
	uv_async_t async;
	backend_done_fn done;
	void *done_arg;
	void (*closed)(void *arg);
	void *closed_arg;
	pthread_t *workers;
	unsigned nworkers;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct backend_job *run_head, *run_tail;   /* jobs with chunks not yet started */
	struct backend_done_list done_list;        /* finished, for the loop */
	bool stopping;
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

/* Compute pairs [bh0, bh1) of a job. */
static fa_status cpu_run_chunk(const struct backend_job *job, int64_t bh0, int64_t bh1)
{
	fa_status st;

	cpu_current_job = job;
	if (job->infer != NULL)
		st = cpu_infer_run(job, bh0, bh1); /* (sequence, head) units */
	else if (job->is_bwd)
		st = cpu_bwd_run(job, bh0, bh1); /* bh: (batch, kv-head) pairs */
	else
		st = fa_attn_fwd_ref(&job->desc, job->q, job->k, job->v, job->o, job->lse, bh0, bh1);
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

/* A worker: take one chunk of the head job, rotate the job to the tail, compute, repeat. */
static void *cpu_worker(void *arg)
{
	struct cpu_backend *b = arg;

	pthread_mutex_lock(&b->mu);
	for (;;) {
		while (b->run_head == NULL && !b->stopping)
			pthread_cond_wait(&b->cv, &b->mu);
		struct backend_job *job = b->run_head;
		if (job == NULL)
			break; /* stopping, and nothing left */
		b->run_head = job->next;
		if (b->run_head == NULL)
			b->run_tail = NULL;

		int64_t bh0 = job->bh_next;
		int64_t bh1 =
		    bh0 + job->bh_chunk < job->bh_total ? bh0 + job->bh_chunk : job->bh_total;
		if (job->status != FA_OK)
			bh1 = job->bh_total; /* an earlier chunk failed: skip the rest */
		job->bh_next = bh1;
		if (bh1 < job->bh_total)
			backend_job_append(&b->run_head, &b->run_tail, job); /* round-robin: its next chunk waits its turn */
		if (job->status == FA_OK) {
			if (bh0 == 0) {
				job->t_start = fa_now_ns();
				atomic_fetch_add(&b->base.running, 1);
			}
			job->chunks_running++;
			pthread_mutex_unlock(&b->mu);
			fa_status st = cpu_run_chunk(job, bh0, bh1);
			pthread_mutex_lock(&b->mu);
			job->chunks_running--;
			if (st != FA_OK && job->status == FA_OK) {
				job->status = st;
				cpu_fail_detail(job, st);
			}
		}
		if (job->chunks_running == 0 && job->bh_next == job->bh_total) {
			/* A fault in another job on the same mapping may have fed this one zeros.
			 */
			if (job->status == FA_OK && cpu_job_broken(job)) {
				job->status = FA_ERANGE;
				cpu_fail_detail(job, FA_ERANGE);
			}
			job->compute_ns = fa_now_ns() - job->t_start;
			atomic_fetch_sub(&b->base.running, 1);
			backend_done_push(&b->done_list, job);
			uv_async_send(&b->async);
		}
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

/* Size the chunks for this job and queue it. */
static fa_status cpu_submit(struct backend *base, struct backend_job *job)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	const struct fa_attn_fwd_desc *d = &job->desc;
	int64_t total = d->B * d->Hq; /* fits: fa_attn_fwd_check bounded B*Sq*Hq*D */
	int64_t per_bh, work, nchunks;

	/* Work per (batch, head) pair ~ Sq * Sk * D; saturate instead of overflowing. */
	if (__builtin_mul_overflow(d->Sq, d->Sk, &per_bh) ||
	    __builtin_mul_overflow(per_bh, d->D, &per_bh))
		per_bh = INT64_MAX;
	if (job->is_bwd)
		cpu_bwd_units(job, &total, &per_bh); /* its unit: a (batch, kv-head) pair */
	if (__builtin_mul_overflow(per_bh, total, &work))
		work = INT64_MAX;
	nchunks = work / CPU_MIN_CHUNK_WORK;
	if (nchunks > (int64_t)b->nworkers * CPU_CHUNKS_PER_WORKER)
		nchunks = (int64_t)b->nworkers * CPU_CHUNKS_PER_WORKER;
	if (nchunks > total)
		nchunks = total;
	if (nchunks < 1)
		nchunks = 1;

	job->status = FA_OK;
	job->compute_ns = 0;
	job->detail[0] = '\0';
	job->bh_next = 0;
	job->bh_total = total;
	job->bh_chunk = (total + nchunks - 1) / nchunks;
	job->chunks_running = 0;
	job->t_start = 0;

	pthread_mutex_lock(&b->mu);
	if (b->stopping) {
		pthread_mutex_unlock(&b->mu);
		return FA_ECLOSED;
	}
	backend_job_append(&b->run_head, &b->run_tail, job);
	if (nchunks > 1)
		pthread_cond_broadcast(&b->cv);
	else
		pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
	return FA_OK;
}

/* Hand back, with status st, the queued jobs of owner that no worker has started. */
static unsigned cpu_cancel(struct backend *base, const void *owner, fa_status st, const char *why)
{
	struct cpu_backend *b = (struct cpu_backend *)base;
	struct backend_job **pp, *prev = NULL;
	unsigned n = 0;

	pthread_mutex_lock(&b->mu);
	for (pp = &b->run_head; *pp != NULL;) {
		struct backend_job *job = *pp;
		if ((owner == NULL || job->owner == owner) && job->bh_next == 0) {
			*pp = job->next;
			if (b->run_tail == job)
				b->run_tail = prev;
			job->status = st;
			snprintf(job->detail, sizeof job->detail, "%s", why);
			backend_done_push(&b->done_list, job);
			n++;
			continue;
		}
		prev = job;
		pp = &job->next;
	}
	if (n > 0)
		uv_async_send(&b->async);
	pthread_mutex_unlock(&b->mu);
	return n;
}

/* The async handle is closed: release the backend. */
static void cpu_handle_closed(uv_handle_t *h)
{
	struct cpu_backend *b = h->data;
	void (*closed)(void *) = b->closed;
	void *arg = b->closed_arg;

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
		pthread_join(b->workers[i], NULL);
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
	b->loop = loop;
	b->done = done;
	b->done_arg = arg;
	b->nworkers = cfg->threads > 0 ? (unsigned)cfg->threads : 1;
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
		if ((rv = pthread_create(&b->workers[i], NULL, cpu_worker, b)) != 0) {
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
	log_info("backend: cpu with %u worker threads", b->nworkers);
	*out = &b->base;
	return FA_OK;
}

const struct backend_ops backend_cpu_ops = {
	.name = "cpu",
	.kind = FA_BACKEND_CPU,
	.open = cpu_open,
	.submit = cpu_submit,
	.cancel = cpu_cancel,
	.close = cpu_close,
};
