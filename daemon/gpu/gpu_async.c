/* gpu_async.c - the asynchronous mode (device buffers, a client of the daemon's uid): the job
 * runs on a stream and a thread of its session (so a client whose event never fires stalls only
 * itself), behind a wait on the client's CUDA IPC event; the daemon records its own IPC event
 * (one per session and slot) after the kernel, and the job is handed back twice: at the enqueue
 * (the reply carries the event) and when a host function queued behind the kernel runs (the
 * request's regions are released then). */
#include "gpu_int.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "log.h"
#include "util.h"

/* The host function queued behind an asynchronous job's kernel (a driver thread: no CUDA calls
 * here): the kernel finished, its regions can go. */
static void gpu_async_done(void *arg)
{
	struct gpu_ticket *t = arg;
	struct gpu_backend *b = t->b;

	pthread_mutex_lock(&b->mu);
	if (!t->abandoned) {
		if (t->prev != NULL)
			t->prev->next = t->next;
		else
			b->tickets = t->next;
		if (t->next != NULL)
			t->next->prev = t->prev;
		b->ntickets--;
		t->job->compute_ns = fa_now_ns() - t->t0;
		b->fwd_ok++;
		gpu_async_finish_locked(b, t->job);
		uv_async_send(&b->async);
		pthread_cond_broadcast(&b->cv); /* gpu_close may wait for the last ticket */
	}
	pthread_mutex_unlock(&b->mu);
	free(t);
}

/* Run an asynchronous job: wait for the client's event on the session's stream, launch, record
 * the daemon's event, queue the host function. FA_OK: enqueued (the caller hands it back for the
 * reply); else the job failed before its kernel was enqueued (handed back once). */
static fa_status gpu_run_async(struct gpu_owner_dev *od, struct backend_job *job, bool *sticky)
{
	struct gpu_dev *d = od->d;
	struct gpu_backend *b = d->b;
	const struct fa_cu_api *cu = fa_cu;
	const struct fa_attn_fwd_desc *ds = &job->desc;
	uint64_t prof[3] = {0};
	fa_cu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	__typeof__(od->slot[0]) *sl = &od->slot[job->slot];
	if (job->has_wait_event) {
		/* Opened once per (session, slot, handle): the client keeps one event per slot. */
		if (sl->wait != NULL && memcmp(sl->wait_handle, job->wait_event, 64) != 0) {
			cu->EventDestroy(sl->wait);
			sl->wait = NULL;
		}
		if (sl->wait == NULL) {
			struct fa_cu_ipc_handle h;
			memcpy(h.reserved, job->wait_event, sizeof h.reserved);
			if ((r = cu->IpcOpenEventHandle(&sl->wait, h)) != 0) {
				sl->wait = NULL;
				*sticky = fa_cu_sticky(r);
				snprintf(job->detail, sizeof job->detail,
				         "the client's CUDA IPC event cannot be opened on GPU %d: CUDA "
				         "error %d (%s); it must come from cuIpcGetEventHandle of an "
				         "event created with CU_EVENT_INTERPROCESS | "
				         "CU_EVENT_DISABLE_TIMING on that GPU",
				         d->ordinal, r, fa_cu_errstr(r));
				return job->status = *sticky ? FA_EDEVICE : FA_EINVAL;
			}
			memcpy(sl->wait_handle, job->wait_event, 64);
		}
		uint64_t tw = fa_now_ns();
		if ((r = cu->StreamWaitEvent(od->stream, sl->wait, 0)) != 0)
			return job->status = gpu_job_cuerr(d, job, r, "waiting for the client's event",
			                                   sticky);
		prof[0] = fa_now_ns() - tw;
	}
	if (sl->done == NULL) {
		struct fa_cu_ipc_handle h;
		r = cu->EventCreate(&sl->done, FA_CU_EVENT_DISABLE_TIMING | FA_CU_EVENT_INTERPROCESS);
		if (r == 0 && (r = cu->IpcGetEventHandle(&h, sl->done)) != 0) {
			cu->EventDestroy(sl->done);
		}
		if (r != 0) {
			sl->done = NULL;
			return job->status = gpu_job_cuerr(d, job, r, "creating the completion event",
			                                   sticky);
		}
		memcpy(sl->done_handle, h.reserved, 64);
	}
	struct gpu_ticket *t = calloc(1, sizeof *t);
	if (t == NULL) {
		snprintf(job->detail, sizeof job->detail, "out of memory");
		return job->status = FA_ENOMEM;
	}
	t->b = b;
	t->job = job;
	t->t0 = fa_now_ns();
	uint64_t tl = t->t0;
	if (job->is_bwd)
		st = gpu_launch_bwd(d, job, od->stream);
	else
		st = fa_gpu_attn_fwd(d->g, ds, (CUdeviceptr)(uintptr_t)job->q,
		                     (CUdeviceptr)(uintptr_t)job->k, (CUdeviceptr)(uintptr_t)job->v,
		                     (CUdeviceptr)(uintptr_t)job->o, (CUdeviceptr)(uintptr_t)job->lse,
		                     (CUstream)od->stream, job->detail, sizeof job->detail);
	if (st != FA_OK) {
		free(t);
		if (st == FA_EDEVICE && (r = cu->CtxSynchronize()) != 0 && fa_cu_sticky(r))
			*sticky = true;
		return job->status = st;
	}
	uint64_t tr = fa_now_ns();
	prof[1] = tr - tl;
	if ((r = cu->EventRecord(sl->done, od->stream)) != 0) {
		free(t);
		return job->status = gpu_job_cuerr(d, job, r, "recording the completion event",
		                                   sticky);
	}
	memcpy(job->done_event, sl->done_handle, 64);
	prof[2] = fa_now_ns() - tr;
	/* Ticket first: the host function may run before LaunchHostFunc returns. */
	pthread_mutex_lock(&b->mu);
	for (int i = 0; i < 3; i++)
		b->async_ns[i] += prof[i];
	t->next = b->tickets;
	if (b->tickets != NULL)
		b->tickets->prev = t;
	b->tickets = t;
	b->ntickets++;
	b->async_enqueued++;
	job->enqueued = true;
	job->kernel_done = job->reply_delivered = false;
	backend_done_push(&b->done_list, job); /* the reply */
	pthread_mutex_unlock(&b->mu);
	uint64_t th = fa_now_ns();
	r = cu->LaunchHostFunc(od->stream, gpu_async_done, t);
	th = fa_now_ns() - th;
	pthread_mutex_lock(&b->mu);
	b->async_ns[3] += th;
	pthread_mutex_unlock(&b->mu);
	if (r != 0) {
		/* Rare: finish it here, after the kernel, on this thread. */
		fa_cu_res r2 = cu->StreamSynchronize(od->stream);
		log_warn("gpu: cuLaunchHostFunc: CUDA error %d (%s); waited instead", r,
		         fa_cu_errstr(r));
		if (r2 != 0 && fa_cu_sticky(r2))
			*sticky = true;
		gpu_async_done(t);
	}
	uv_async_send(&b->async);
	return FA_OK;
}

/* A session's asynchronous thread on one device: its jobs, in order (see gpu_owner_dev). */
static void *gpu_owner_thread(void *arg)
{
	struct gpu_owner_dev *od = arg;
	struct gpu_backend *b = od->d->b;

	fa_cu->CtxSetCurrent(od->d->ctx);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		while (od->head == NULL && !od->stop)
			pthread_cond_wait(&od->cv, &b->mu);
		struct backend_job *job = od->head;
		if (job == NULL)
			break;
		od->head = job->next;
		if (od->head == NULL)
			od->tail = NULL;
		job->next = NULL;
		if (fault_marked(&b->base)) {
			gpu_finish_locked(b, job, FA_EDEVICE, fault_why(&b->base));
			uv_async_send(&b->async);
			continue;
		}
		pthread_mutex_unlock(&b->mu);
		bool sticky = false;
		uint64_t t0 = fa_now_ns();
		fa_status st = gpu_run_async(od, job, &sticky);
		pthread_mutex_lock(&b->mu);
		if (st != FA_OK) {
			job->compute_ns = fa_now_ns() - t0;
			gpu_job_done_locked(b, job, sticky);
		} else if (sticky) {
			gpu_fatal_locked(b, "the GPU faulted while enqueuing an asynchronous job");
		}
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

/* This session's resources on d, created on first use (worker). NULL with job's status set. */
struct gpu_owner_dev *gpu_owner_dev(struct gpu_dev *d, struct backend_job *job)
{
	struct gpu_backend *b = d->b;
	struct gpu_owner *o;
	unsigned i = (unsigned)(d - b->devs);
	fa_cu_res r;

	pthread_mutex_lock(&b->mu); /* two devices' workers may both create the session's state */
	o = *job->owner_state;
	if (o == NULL && (o = calloc(1, sizeof *o)) != NULL)
		*job->owner_state = o;
	pthread_mutex_unlock(&b->mu);
	if (o == NULL) {
		job->status = FA_ENOMEM;
		snprintf(job->detail, sizeof job->detail, "out of memory");
		return NULL;
	}
	if (o->dev[i] != NULL)
		return o->dev[i];
	struct gpu_owner_dev *od = calloc(1, sizeof *od);
	if (od == NULL) {
		job->status = FA_ENOMEM;
		snprintf(job->detail, sizeof job->detail, "out of memory");
		return NULL;
	}
	od->d = d;
	if ((r = fa_cu->StreamCreate(&od->stream, FA_CU_STREAM_NON_BLOCKING)) != 0) {
		bool sticky;
		job->status = gpu_job_cuerr(d, job, r, "creating the session's stream", &sticky);
		free(od);
		return NULL;
	}
	pthread_cond_init(&od->cv, NULL);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rv = pthread_create(&od->thread, NULL, gpu_owner_thread, od);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rv != 0) {
		job->status = FA_ESYS;
		snprintf(job->detail, sizeof job->detail, "starting the session's GPU thread: %s",
		         strerror(rv));
		pthread_cond_destroy(&od->cv);
		fa_cu->StreamDestroy(od->stream);
		free(od);
		return NULL;
	}
	o->dev[i] = od;
	return od;
}

/* The loop frees a session: release its streams and events on every device. Every job of it
 * was handed back for good, so nothing of it is queued; destroying a stream or an event with
 * work pending is allowed (the driver releases them when the work completes). */
void gpu_owner_free(struct backend *base, void *state)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	struct gpu_owner *o = state;

	for (unsigned i = 0; i < b->ndevs && o != NULL; i++) {
		struct gpu_owner_dev *od = o->dev[i];
		if (od == NULL)
			continue;
		pthread_mutex_lock(&b->mu);
		od->stop = true; /* idle: every job of the session was handed back */
		pthread_cond_signal(&od->cv);
		pthread_mutex_unlock(&b->mu);
		pthread_join(od->thread, NULL);
		pthread_cond_destroy(&od->cv);
		fa_cu->CtxSetCurrent(b->devs[i].ctx);
		for (int k = 0; k < FA_PROTO_MAX_SLOTS; k++) {
			if (od->slot[k].done != NULL)
				fa_cu->EventDestroy(od->slot[k].done);
			if (od->slot[k].wait != NULL)
				fa_cu->EventDestroy(od->slot[k].wait);
		}
		fa_cu->StreamDestroy(od->stream);
		free(od);
	}
	free(o);
}
