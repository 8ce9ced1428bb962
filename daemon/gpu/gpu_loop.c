/* gpu_loop.c - the loop thread's side of the GPU backend: submit (the device, the compile
 * table, or an inline run: a small job on an idle GPU runs on the loop thread itself, cheaper
 * than two thread hand-offs), the spin handle that keeps the loop polling while a small job is
 * on a worker or a prewake announced a job's end, the check handle that hands an inline job
 * back in the same loop turn, and the done drain that hands finished jobs back. */
#include "gpu_int.h"

#include <stdio.h>

#include "fault.h"
#include "util.h"

static void gpu_spin_cb(uv_idle_t *h);

/* Keep the loop polling (no sleep in epoll) while something is about to come back. */
static void gpu_spin_start(struct gpu_backend *b)
{
	if (b->spin_open)
		uv_idle_start(&b->spin, gpu_spin_cb); /* a no-op when it is active */
}

/* Stop polling once nothing is expected: no small job on a worker, no prewake's time left, no
 * inline job waiting for the check handle. */
static void gpu_spin_check(struct gpu_backend *b)
{
	if (b->spin_open && b->spin_jobs == 0 && !b->inline_pending &&
	    (b->spin_until == 0 || fa_now_ns() >= b->spin_until)) {
		b->spin_until = 0;
		uv_idle_stop(&b->spin);
	}
}

/* Hand one finished job back (backend_done_drain's callback): an asynchronous job's first
 * hand-back is its reply; its second follows at once when the kernel already finished. */
static void gpu_deliver(struct backend_job *job, void *arg)
{
	struct gpu_backend *b = arg;

	if (job->enqueued) {
		b->done(job, b->done_arg); /* the reply; the job stays */
		pthread_mutex_lock(&b->mu);
		job->reply_delivered = true;
		bool fin = job->kernel_done;
		pthread_mutex_unlock(&b->mu);
		if (fin) {
			job->enqueued = false;
			b->done(job, b->done_arg);
		}
	} else {
		if (job->loop_spin) {
			job->loop_spin = false;
			if (--b->spin_jobs == 0)
				gpu_spin_check(b);
		}
		if (job->t_pick != 0 && job->t_done != 0) {
			uint64_t now = fa_now_ns();
			pthread_mutex_lock(&b->mu);
			b->lat_ns[0] += job->t_pick - job->t_submit;
			b->lat_ns[1] += job->t_done - job->t_pick;
			b->lat_ns[2] += now - job->t_done;
			b->lat_n++;
			pthread_mutex_unlock(&b->mu);
		}
		b->done(job, b->done_arg);
	}
}

/* On the loop: the prewakes (jobs the workers expect to end soon: the loop polls until shortly
 * after, the server wakes their clients), then hand finished jobs back; then report a fault to
 * the server (fault.c). The prewakes and the done list are taken together under mu: a job's
 * prewake is pushed before its hand-back, so its job is alive while the prewake is told. */
void gpu_async_cb(uv_async_t *h)
{
	struct gpu_backend *b = h->data;
	struct backend_job *soon[GPU_MAX_DEVICES];
	uint64_t soon_end[GPU_MAX_DEVICES];
	unsigned nsoon = 0;

	pthread_mutex_lock(&b->mu);
	for (unsigned i = 0; i < b->ndevs; i++)
		if (b->devs[i].soon != NULL) {
			soon[nsoon] = b->devs[i].soon;
			soon_end[nsoon++] = b->devs[i].soon_end;
			b->devs[i].soon = NULL;
		}
	struct backend_job *job = b->done_list.head;
	b->done_list.head = b->done_list.tail = NULL;
	pthread_mutex_unlock(&b->mu);
	for (unsigned i = 0; i < nsoon; i++) {
		uint64_t until = soon_end[i] + 2 * b->prewake_ns; /* a late estimate: then sleep */
		if (until > b->spin_until)
			b->spin_until = until;
		gpu_spin_start(b);
		if (b->base.soon != NULL)
			b->base.soon(soon[i], soon_end[i], b->base.soon_arg);
	}
	while (job != NULL) { /* backend_done_drain's order and contract */
		struct backend_job *next = job->next;
		job->next = NULL;
		gpu_deliver(job, b);
		job = next;
	}
	fault_check(&b->base);
}

/* The check handle (after the loop's I/O callbacks, the same turn): an inline job's hand-back,
 * without a uv_async write and an extra turn of the loop. */
static void gpu_check_cb(uv_check_t *h)
{
	struct gpu_backend *b = h->data;

	b->inline_pending = false;
	uv_check_stop(&b->check);
	gpu_async_cb(&b->async);
	gpu_spin_check(b);
}

void gpu_flush(struct backend *base)
{
	struct gpu_backend *b = (struct gpu_backend *)base;

	if (b->inline_pending) /* the check handle's work, at once; it is stopped there */
		gpu_check_cb(&b->check);
}

/* Run a small synchronous device-memory job on the loop thread when d's worker is idle and the
 * kernel is loaded: no hand-off to the worker and back (tens of microseconds of a tiny request's
 * latency). Returns whether it ran (then it is on the done list, answered this loop turn). */
static bool gpu_try_inline(struct gpu_backend *b, struct gpu_dev *d, struct backend_job *job)
{
	if (job->async || job->is_bwd || job->infer || d->inline_stream == NULL ||
	    gpu_job_flop(job) > GPU_INLINE_MAX_FLOP ||
	    job->fault_injected || fault_marked(&b->base) || gpu_job_stages_host(job))
		return false;
	pthread_mutex_lock(&b->mu);
	/* A high-priority job runs beside a busy worker when the inline stream has the device's
	 * greatest priority: its blocks are scheduled ahead of the long kernel's waiting ones. */
	bool idle = !b->stopping && ((!d->busy && runq_len(&d->queue) == 0) ||
	                             (job->priority == FA_PRIORITY_HIGH && d->inline_high));
	if (idle)
		atomic_fetch_add(&b->base.running, 1);
	pthread_mutex_unlock(&b->mu);
	if (!idle)
		return false;
	bool sticky = false, s2 = false;
	uint64_t t0 = fa_now_ns();
	/* the loop serves every device: set the context only when another one is current
	 * (cuCtxGetCurrent reads the thread's state; the launch inside checks the same way) */
	fa_cu_ctx cur = NULL;
	if (fa_cu->CtxGetCurrent(&cur) != 0 || cur != d->ctx)
		fa_cu->CtxSetCurrent(d->ctx);
	/* the inline stream carries this job alone: its synchronisation is the job's, without an
	 * event recorded after it (a driver call of the tiny request's path) */
	gpu_enqueue(d, job, d->inline_stream, NULL, &sticky);
	gpu_complete(d, job, NULL, d->inline_stream, &s2);
	job->compute_ns = fa_now_ns() - t0;
	pthread_mutex_lock(&b->mu);
	b->lat_ns[3] += job->compute_ns;
	atomic_fetch_sub(&b->base.running, 1);
	d->inline_jobs++;
	/* This is the loop thread: the check handle drains the done list after this turn's I/O
	 * callbacks (the idle handle keeps the poll from sleeping before it); no uv_async. */
	bool quiet = b->check_open && b->spin_open;
	if (quiet)
		gpu_job_finish_locked(b, job, sticky || s2);
	else
		gpu_job_done_locked(b, job, sticky || s2);
	pthread_mutex_unlock(&b->mu);
	if (quiet) {
		b->inline_pending = true;
		uv_check_start(&b->check, gpu_check_cb);
		gpu_spin_start(b);
	}
	return true;
}

/* The idle handle's callback: while it is started the loop polls without sleeping; it stops
 * itself once nothing is expected any more. */
static void gpu_spin_cb(uv_idle_t *h)
{
	gpu_spin_check(h->data);
}

/* Queue a job on its device: the one of its device buffers, else round robin. */
fa_status gpu_submit(struct backend *base, struct backend_job *job)
{
	struct gpu_backend *b = (struct gpu_backend *)base;

	if (job->dev < 0 || (unsigned)job->dev >= b->ndevs)
		job->dev = (int)(b->rr++ % b->ndevs);
	struct gpu_dev *d = &b->devs[job->dev];

	job->status = FA_OK;
	job->compute_ns = 0;
	job->detail[0] = '\0';
	job->enqueued = job->kernel_done = job->reply_delivered = job->done_written = false;
	job->t_submit = fa_now_ns();
	job->t_pick = job->t_done = 0;
	job->loop_spin = false;
	atomic_store(&job->stop, false);
	gpu_split_plan(job);
	if (job->async) {
		/* Straight to the session's own thread, in the order of its calls: through the run
		 * queue, a call whose kernel waits in the compile table (or one of a higher class)
		 * could reach the session's stream after a later call, whose wait for its ready word
		 * would then hold the stream, since the client's stream writes that word only after
		 * the earlier call's done word (a deadlock until --async-wait-ms). The session's
		 * thread compiles what it needs before its stream waits (gpu_async.c). */
		pthread_mutex_lock(&b->mu);
		bool stopping = b->stopping;
		pthread_mutex_unlock(&b->mu);
		if (stopping)
			return FA_ECLOSED;
		gpu_async_handoff(d, job); /* no CUDA call here: the session's thread makes its own */
		return FA_OK;
	}
	/* A kernel not loaded yet is compiled by a compile thread while the worker serves other
	 * jobs. The query is cheap and CPU-only; when it fails (the planner refuses the shape)
	 * the worker's launch reports the same error. */
	bool ready = true, known = false;
	char key[COMPILE_KEY_MAX], why[FA_PROTO_DETAIL_MAX];
	int kl = snprintf(key, sizeof key, "g%d/", job->dev);
	/* (The backward's and the inference ops' kernels compile on the worker, at their first
	 * use: no lookup here.) */
	if (b->ncompile > 0 && !fault_marked(&b->base) && !job->is_bwd && !job->infer &&
	    !job->words_release) {
		/* (a shape launched before: the launch memo answers without a planner run) */
		known = fa_gpu_kernel_lookup(d->g, &job->desc, &ready, key + kl,
		                             sizeof key - (size_t)kl, why, sizeof why) == FA_OK;
		if (!known)
			ready = true;
	}
	/* the loop never compiles: only a kernel known to be loaded runs inline */
	if (known && ready && gpu_try_inline(b, d, job))
		return FA_OK;
	bool spin = b->spin_open && !job->async && gpu_job_flop(job) <= GPU_LOOP_SPIN_MAX_FLOP;
	pthread_mutex_lock(&b->mu);
	if (b->stopping) {
		pthread_mutex_unlock(&b->mu);
		return FA_ECLOSED;
	}
	bool is_new = false;
	if (ready || compile_table_add(&b->waiting, key, job, &is_new) != FA_OK) {
		/* ENOMEM of the compile table too: it compiles there */
		if (gpu_queue_locked(d, job) != FA_OK) {
			pthread_mutex_unlock(&b->mu);
			return FA_ENOMEM;
		}
		pthread_cond_broadcast(&b->cv);
	} else {
		b->compile_jobs++;
		spin = false; /* a compile takes milliseconds to seconds: no point spinning */
		if (is_new)
			pthread_cond_signal(&b->compile_cv);
	}
	job->loop_spin = spin; /* before the unlock: the job may come back at once */
	pthread_mutex_unlock(&b->mu);
	if (spin && b->spin_jobs++ == 0)
		gpu_spin_start(b);
	return FA_OK;
}
