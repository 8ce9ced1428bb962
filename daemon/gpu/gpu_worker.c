/* gpu_worker.c - a device's worker thread: take a batch off its queue, enqueue it back to back
 * on the device's stream (so the GPU does not idle for a launch between two clients' kernels),
 * hand each job back as its event completes (asynchronous jobs never come here: gpu_submit
 * hands them to their session's thread, in the order of the session's calls). Between
 * batches and when idle: the canary, and (device 0) tuning steps; after a batch it spins a
 * little before sleeping.
 *
 * The prewake (--prewake-us, issue 12): a synchronous client's GPU idles while the finished
 * job goes back (worker -> loop), the reply goes out (loop -> client) and the next call comes
 * in (client -> ring thread -> loop -> worker). Each hop to a sleeping thread is a wake-up of
 * 10-50 us, and during a long kernel every thread but this one sleeps. So shortly before the
 * batch's expected end (gpu_estimate.c: its shapes' last GPU times) the worker tells the loop,
 * which polls from then on and has the job's ring client and ring thread woken to poll too
 * (backend_soon_fn, ring_prewake): the whole round then meets awake threads. */
#include "gpu_int.h"

#include <time.h>

#include "fault.h"
#include "util.h"

/* The batch on d's stream is expected to end at `end` (fa_now_ns): wait, polling the stream
 * (the CPU a cuEventSynchronize of the primary context spends anyway: it spins), until
 * prewake_ns before then and tell the loop that `job`, the batch's last, is about to end;
 * nothing when the stream finished first (or failed: gpu_complete classifies it). */
static void gpu_prewake(struct gpu_dev *d, struct backend_job *job, uint64_t end)
{
	struct gpu_backend *b = d->b;
	uint64_t at = end > b->prewake_ns ? end - b->prewake_ns : 0;
	uint64_t now;

	while ((now = fa_now_ns()) < at) {
		fa_cu_res r = fa_cu->StreamQuery(d->stream);
		if (r != GPU_CU_NOT_READY) {
			if (r == 0) {
				pthread_mutex_lock(&b->mu);
				d->prewakes_late++;
				pthread_mutex_unlock(&b->mu);
			}
			return;
		}
		for (int k = 0; k < 32; k++)
			gpu_relax();
	}
	if (now >= end + b->prewake_ns) /* far past the estimate: nothing to gain */
		return;
	pthread_mutex_lock(&b->mu);
	d->soon = job;
	d->soon_end = end;
	d->prewakes++;
	uv_async_send(&b->async);
	pthread_mutex_unlock(&b->mu);
	/* The loop and the client now poll for the end: see it at once here too (whatever the
	 * context's scheduling flags make cuEventSynchronize do), up to a while past the
	 * estimate; gpu_complete then returns at once. */
	uint64_t until = end + 2 * b->prewake_ns;
	while (fa_cu->StreamQuery(d->stream) == GPU_CU_NOT_READY && fa_now_ns() < until)
		for (int k = 0; k < 8; k++)
			gpu_relax();
}

/* A device's worker: take jobs, enqueue them back to back, hand each back as its event
 * completes; between batches and when idle, the canary and (device 0) tuning steps. */
void *gpu_worker(void *arg)
{
	struct gpu_dev *d = arg;
	struct gpu_backend *b = d->b;
	struct backend_job *batch[GPU_PIPE];
	uint64_t t0[GPU_PIPE];

	bool spin = false;

	fa_cu->CtxSetCurrent(d->ctx);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		gpu_canary_turn_locked(d);
		while (runq_len(&d->queue) == 0 && !b->stopping) {
			if (gpu_canary_turn_locked(d) || gpu_tune_turn_locked(d))
				continue;
			if (spin) {
				unsigned seen = atomic_load(&d->pushes);
				uint64_t until = fa_now_ns() + GPU_SPIN_NS;
				spin = false;
				pthread_mutex_unlock(&b->mu);
				while (atomic_load(&d->pushes) == seen && fa_now_ns() < until)
					gpu_relax();
				pthread_mutex_lock(&b->mu);
				continue;
			}
			/* idle: wake for the next canary at the latest */
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += 1;
			pthread_cond_timedwait(&b->cv, &b->mu, &ts);
		}
		if (runq_len(&d->queue) == 0)
			break; /* stopping, and nothing left */
		unsigned n = gpu_take_batch_locked(d, batch);
		d->batches++;
		spin = true;
		d->busy = true;
		if (fault_marked(&b->base)) {
			for (unsigned i = 0; i < n; i++)
				gpu_finish_locked(b, batch[i], FA_EDEVICE, fault_why(&b->base));
			d->busy = false;
			d->ncur = 0;
			uv_async_send(&b->async);
			continue;
		}
		atomic_fetch_add(&b->base.running, n);
		pthread_mutex_unlock(&b->mu);

		bool sticky = false;
		if (batch[0]->async) {
			/* (gpu_submit hands these to their session's thread itself; kept so that no
			 * path that queues one here can lose it) */
			gpu_async_handoff(d, batch[0]);
			pthread_mutex_lock(&b->mu);
			d->busy = false;
			d->ncur = 0;
			atomic_fetch_sub(&b->base.running, 1);
			continue;
		}
		for (unsigned i = 0; i < n; i++) {
			bool s1 = false;
			t0[i] = fa_now_ns();
			batch[i]->t_pick = t0[i];
			gpu_timing_start(d, i, d->stream);
			if (batch[i]->is_bwd)
				gpu_enqueue_bwd(d, batch[i], d->stream, d->pipe_ev[i], &s1);
			else if (batch[i]->infer)
				gpu_enqueue_infer(d, batch[i], d->stream, d->pipe_ev[i], &s1);
			else
				gpu_enqueue(d, batch[i], d->stream, d->pipe_ev[i], &s1);
			gpu_timing_end(d, i, d->stream);
			gpu_timing_enqueued(d, fa_now_ns() - t0[i]);
			sticky |= s1;
		}
		gpu_timing_batch_end(d, n, d->stream);
		/* The batch's expected end: its jobs back to back from the first one's start. */
		uint64_t end = 0;
		if (b->prewake_ns > 0 && !sticky) {
			uint64_t sum = 0;
			for (unsigned i = 0; i < n && sum != UINT64_MAX; i++) {
				uint64_t e = gpu_estimate_ns(&d->est, batch[i]);
				sum = e == 0 ? UINT64_MAX : sum + e;
			}
			if (sum != UINT64_MAX)
				end = t0[0] + sum;
		}
		for (unsigned i = 0; i < n; i++) {
			bool s1 = false;
			if (i + 1 == n && end != 0)
				gpu_prewake(d, batch[i], end);
			gpu_complete(d, batch[i], d->pipe_ev[i], d->stream, &s1);
			uint64_t seen = fa_now_ns();
			if (!s1) {
				gpu_timing_read(d, i, batch[i]);
				if (batch[i]->status == FA_OK)
					gpu_estimate_note(&d->est, batch[i], batch[i]->gpu_ns);
				/* a lone job's end on the host clock: its start (the idle stream ran
				 * the start event at once) plus its GPU time */
				if (n == 1 && batch[i]->gpu_ns > 0 && seen > t0[0] + batch[i]->gpu_ns)
					gpu_timing_detected(d, seen - t0[0] - batch[i]->gpu_ns);
			}
			if (i + 1 == n) {
				pthread_mutex_lock(&b->mu);
				d->busy = false;
				d->ncur = 0; /* gpu_stop tells nobody of this batch any more */
				pthread_mutex_unlock(&b->mu);
			}
			batch[i]->compute_ns = fa_now_ns() - t0[i];
			pthread_mutex_lock(&b->mu);
			atomic_fetch_sub(&b->base.running, 1);
			gpu_job_done_locked(b, batch[i], s1 || (sticky && i + 1 == n));
			pthread_mutex_unlock(&b->mu);
		}
		pthread_mutex_lock(&b->mu);
	}
	pthread_mutex_unlock(&b->mu);
	if (b->tuner != NULL && d == &b->devs[0]) { /* stopping mid-class: nothing stored */
		fa_tuner_free(b->tuner);
		b->tuner = NULL;
	}
	return NULL;
}
