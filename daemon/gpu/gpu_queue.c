/* gpu_queue.c - the GPU backend's queues and their bookkeeping: a device's run queue and what a
 * worker takes from it (the batch rules), cancellation, the done list, and what the fatal path
 * does to every queue. Pure list work under mu, no CUDA: tests/daemon/test_gpu_queue.c checks
 * these rules without a GPU. */
#include "gpu_int.h"

#include <stdio.h>

#include "fault.h"
#include "log.h"
#include "util.h"

/* Queue a job on d's worker (mutex held; the caller wakes it). */
fa_status gpu_queue_locked(struct gpu_dev *d, struct backend_job *job)
{
	if (runq_push(&d->queue, job) != FA_OK)
		return FA_ENOMEM;
	atomic_fetch_add(&d->pushes, 1);
	return FA_OK;
}

/* Take a batch off d's queue (mutex held); see gpu_int.h for the rules. */
unsigned gpu_take_batch_locked(struct gpu_dev *d, struct backend_job **out)
{
	unsigned n = 0;
	double flop = 0.0;
	uint64_t now = fa_now_ns();

	while (n < GPU_PIPE) {
		struct backend_job *job = runq_peek(&d->queue, NULL, NULL);
		if (job == NULL)
			break;
		bool host = gpu_job_stages_host(job), alone = job->async || job->piece_total > 1;
		double f = gpu_job_flop(job);
		if (n > 0 && (alone || flop + f > GPU_PIECE_FLOP))
			break;
		runq_take(&d->queue, job);
		runq_started(&d->queue, job, now);
		out[n++] = job;
		flop += f;
		if (alone || host)
			break;
	}
	for (unsigned i = 0; i < n; i++)
		d->cur[i] = out[i];
	d->ncur = n;
	return n;
}

/* Finish a job that will not run, with status and detail (mutex held). */
void gpu_finish_locked(struct gpu_backend *b, struct backend_job *job, fa_status st,
                       const char *detail)
{
	job->status = st;
	snprintf(job->detail, sizeof job->detail, "%s", detail);
	backend_done_push(&b->done_list, job);
}

/* Answer the jobs of owner (all: NULL) waiting for a compile with st and why (mutex held; the
 * caller wakes the loop). Returns how many. */
unsigned gpu_fail_waiting_locked(struct gpu_backend *b, const void *owner, fa_status st,
                                 const char *why)
{
	unsigned n = 0;
	struct backend_job *job = compile_table_cancel(&b->waiting, owner, &n);

	while (job != NULL) {
		struct backend_job *next = job->next;
		gpu_finish_locked(b, job, st, why);
		job = next;
	}
	return n;
}

/* Hand a finished job back without waking the loop (mutex held). */
void gpu_job_finish_locked(struct gpu_backend *b, struct backend_job *job, bool sticky)
{
	job->t_done = fa_now_ns();
	if (job->status == FA_OK)
		b->fwd_ok++;
	else
		b->fwd_failed++;
	backend_done_push(&b->done_list, job);
	if (sticky)
		gpu_fatal_locked(b, job->detail);
}

/* Hand a finished job back (mutex held). */
void gpu_job_done_locked(struct gpu_backend *b, struct backend_job *job, bool sticky)
{
	gpu_job_finish_locked(b, job, sticky);
	uv_async_send(&b->async);
}

/* The second hand-back of an asynchronous job (mutex held): now if the loop delivered its
 * reply already, else the loop does it right after the reply (gpu_async_cb). */
void gpu_async_finish_locked(struct gpu_backend *b, struct backend_job *job)
{
	job->kernel_done = true;
	if (job->reply_delivered) {
		job->enqueued = false;
		backend_done_push(&b->done_list, job);
	}
}

/* Finish every asynchronous job still in flight with st (mutex held; the caller wakes the
 * loop): the fatal path, and a close that waited long enough. Their host functions, if they
 * ever run, find the ticket abandoned. */
void gpu_abandon_tickets_locked(struct gpu_backend *b, fa_status st, const char *why)
{
	while (b->tickets != NULL) {
		struct gpu_ticket *t = b->tickets;
		b->tickets = t->next;
		t->abandoned = true;
		t->prev = t->next = NULL;
		t->job->status = st;
		snprintf(t->job->detail, sizeof t->job->detail, "%s", why);
		gpu_async_finish_locked(b, t->job);
		t->job = NULL;
	}
	b->ntickets = 0;
}

/* The context is lost (mutex held): mark the fault (fault.c; the first why wins), fail everything
 * queued on every device, wake the loop, which reports it to the server. */
void gpu_fatal_locked(struct gpu_backend *b, const char *why)
{
	fault_mark(&b->base, why);
	for (unsigned i = 0; i < b->ndevs; i++) {
		struct backend_job *job = runq_remove(&b->devs[i].queue, NULL, NULL, NULL);
		while (job != NULL) {
			struct backend_job *next = job->next;
			gpu_finish_locked(b, job, FA_EDEVICE, "the GPU faulted while serving an "
			                  "earlier request; the daemon restarts with a clean context");
			job = next;
		}
	}
	gpu_fail_waiting_locked(b, NULL, FA_EDEVICE, "the GPU faulted while serving an earlier "
	                        "request; the daemon restarts with a clean context");
	gpu_abandon_tickets_locked(b, FA_EDEVICE, "the GPU faulted while this asynchronous "
	                           "request ran or waited; its output is undefined");
	uv_async_send(&b->async);
}

/* Hand back, with status st, the queued jobs of owner (all when NULL) not started yet. */
unsigned gpu_cancel(struct backend *base, const void *owner, fa_status st,
                    const char *why)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	unsigned n = 0;

	pthread_mutex_lock(&b->mu);
	for (unsigned i = 0; i < b->ndevs; i++) {
		struct backend_job *job = runq_remove(&b->devs[i].queue, owner, NULL, NULL);
		while (job != NULL) {
			struct backend_job *next = job->next;
			gpu_finish_locked(b, job, st, why);
			n++;
			job = next;
		}
	}
	n += gpu_fail_waiting_locked(b, owner, st, why);
	if (n > 0)
		uv_async_send(&b->async);
	pthread_mutex_unlock(&b->mu);
	return n;
}

/* Tell the owner's jobs on a worker to stop (takes mu); see gpu_int.h. */
unsigned gpu_stop(struct backend *base, const void *owner, fa_status st, const char *why)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	unsigned n = 0;

	(void)why; /* the worker writes the detail: the job's fields are its own while it runs */
	struct {
		struct gpu_dev *d;
		fa_cu_ptr word;
	} gates[64];
	unsigned ngates = 0;
	pthread_mutex_lock(&b->mu);
	/* A closed session's asynchronous kernels waiting for its event: their gates, opened
	 * below without mu (a CUDA call). The gate memory lives until the session is freed, which
	 * happens on this (the loop) thread, after this. */
	for (struct gpu_ticket *t = b->tickets; owner != NULL && t != NULL && ngates < 64;
	     t = t->next)
		if (t->job != NULL && t->job->owner == owner && t->gate_word != 0) {
			gates[ngates].d = t->d;
			gates[ngates++].word = t->gate_word;
			t->gate_word = 0;
			n++;
		}
	for (unsigned i = 0; i < b->ndevs; i++) {
		struct gpu_dev *d = &b->devs[i];
		for (unsigned k = 0; k < d->ncur; k++) {
			struct backend_job *job = d->cur[k];
			if ((owner != NULL && job->owner != owner) || atomic_load(&job->stop))
				continue;
			job->stop_status = st;
			atomic_store(&job->stop, true);
			n++;
		}
	}
	pthread_mutex_unlock(&b->mu);
	for (unsigned i = 0; i < ngates; i++) {
		struct gpu_dev *d = gates[i].d;
		fa_cu->CtxSetCurrent(d->ctx);
		fa_cu_stream s = d->inline_stream != NULL ? d->inline_stream : d->stream;
		fa_cu_res r = fa_cu->StreamWriteValue32(s, gates[i].word, UINT32_MAX, 0);
		if (r != 0)
			log_warn("gpu: opening a closed session's gate on GPU %d: CUDA error %d (%s)",
			         d->ordinal, r, fa_cu_errstr(r));
		else
			b->gates_released++;
	}
	return n;
}
