/* gpu_loop.c - the loop thread's side of the GPU backend: submit (the device, the compile
 * table, or an inline run: a small job on an idle GPU runs on the loop thread itself, cheaper
 * than two thread hand-offs), the spin handle that keeps the loop polling while a small job is
 * on a worker, and the done drain that hands finished jobs back. */
#include "gpu_int.h"

#include <stdio.h>

#include "fault.h"
#include "util.h"

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
				uv_idle_stop(&b->spin);
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

/* On the loop: hand finished jobs back; then report a fault to the server (fault.c). */
void gpu_async_cb(uv_async_t *h)
{
	struct gpu_backend *b = h->data;

	backend_done_drain(&b->done_list, &b->mu, gpu_deliver, b);
	fault_check(&b->base);
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
	fa_cu->CtxSetCurrent(d->ctx);
	gpu_enqueue(d, job, d->inline_stream, d->inline_ev, &sticky);
	gpu_complete(d, job, d->inline_ev, &s2);
	job->compute_ns = fa_now_ns() - t0;
	pthread_mutex_lock(&b->mu);
	b->lat_ns[3] += job->compute_ns;
	atomic_fetch_sub(&b->base.running, 1);
	d->inline_jobs++;
	gpu_job_done_locked(b, job, sticky || s2);
	pthread_mutex_unlock(&b->mu);
	return true;
}

/* The idle handle's callback: nothing; while it is started the loop polls without sleeping. */
static void gpu_spin_cb(uv_idle_t *h)
{
	(void)h;
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
	job->enqueued = job->kernel_done = job->reply_delivered = false;
	job->t_submit = fa_now_ns();
	job->t_pick = job->t_done = 0;
	job->loop_spin = false;
	atomic_store(&job->stop, false);
	gpu_split_plan(job);
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
		uv_idle_start(&b->spin, gpu_spin_cb);
	return FA_OK;
}
