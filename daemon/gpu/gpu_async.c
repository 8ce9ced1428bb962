/* gpu_async.c - the asynchronous mode (device buffers): the job runs on a stream and a thread
 * of its session (so a client whose inputs never become ready stalls only itself), and the job
 * is handed back twice: at the enqueue (the reply) and when a host function queued behind the
 * kernel runs (the request's regions are released then). Two ways to order the daemon's stream
 * with the client's:
 *   - completion words (the default, any user): the session's words region, CUDA IPC memory of
 *     the client (FA_PROTO_WORDS_*); the stream waits for ready[slot] >= seq
 *     (cuStreamWaitValue64), runs the kernel and writes done[slot] = seq (cuStreamWriteValue64,
 *     fenced: O is visible first). A few microseconds of host time per call on either side;
 *     memory handles open across users where IPC events do not.
 *   - IPC events (the fallback where a GPU lacks 64-bit stream memory operations, or forced by
 *     the client): a wait on the client's event, the daemon's own event recorded after the
 *     kernel (one per session and slot); ~125 us per cuStreamWaitEvent on an IPC event, and
 *     the client must run as the daemon's user.
 * A ready word nobody writes (a client killed, or stuck) would hold the stream, the session and
 * its regions for ever: the session's thread writes it itself (an atomic max, so a word the
 * client wrote later is never lowered) when the session closes, or when the stream has waited
 * --async-wait-ms on it; that call then fails after its reply (logged) and its O is undefined.
 */
#include "gpu_int.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fault.h"
#include "log.h"
#include "util.h"

/* How often a session's thread looks at its oldest completion-word wait while one is pending. */
#define GPU_WORDS_POLL_NS 20000000ull

/* The release: an atomic max, so a word the client has already written (or writes later with a
 * larger value) is never lowered, and the stream's wait passes. PTX, so that it needs no NVRTC:
 * the driver compiles it once per device. */
static const char gpu_words_ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry fa_words_release(.param .u64 word, .param .u64 value)\n"
    "{\n"
    "	.reg .b64 %rd<4>;\n"
    "	ld.param.u64 %rd1, [word];\n"
    "	ld.param.u64 %rd2, [value];\n"
    "	cvta.to.global.u64 %rd1, %rd1;\n"
    "	atom.global.max.u64 %rd3, [%rd1], %rd2;\n"
    "	membar.sys;\n"
    "	ret;\n"
    "}\n";

/* The release kernel of each device, loaded on first use (one backend per process). */
static struct {
	pthread_mutex_t mu;
	fa_cu_func fn[GPU_MAX_DEVICES];
	fa_cu_res err[GPU_MAX_DEVICES]; /* the load failed: kept, never retried */
} gpu_words_kernel = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Whether every device runs 64-bit stream memory operations. */
bool gpu_async_words_supported(struct gpu_backend *b)
{
	for (unsigned i = 0; i < b->ndevs; i++) {
		int v = 0;
		fa_cu_res r = fa_cu->DeviceGetAttribute(
		    &v, FA_CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, b->devs[i].cudev);
		if (r != 0 || v == 0) {
			log_notice("gpu: GPU %d has no 64-bit stream memory operations (%s): "
			           "asynchronous calls use CUDA IPC events (same user only)",
			           b->devs[i].ordinal, r != 0 ? fa_cu_errstr(r) : "attribute 0");
			return false;
		}
	}
	return true;
}

/* The release kernel of device index dev (its context current), loaded on first use. NULL
 * with *r the CUDA error of the load. */
static fa_cu_func gpu_words_fn(unsigned dev, fa_cu_res *r)
{
	const struct fa_cu_api *cu = fa_cu;

	*r = 0;
	pthread_mutex_lock(&gpu_words_kernel.mu);
	if (gpu_words_kernel.fn[dev] == NULL && gpu_words_kernel.err[dev] == 0) {
		fa_cu_mod mod = NULL;
		fa_cu_func fn = NULL;
		if ((*r = cu->ModuleLoadData(&mod, gpu_words_ptx)) == 0 &&
		    (*r = cu->ModuleGetFunction(&fn, mod, "fa_words_release")) == 0)
			gpu_words_kernel.fn[dev] = fn;
		else
			gpu_words_kernel.err[dev] = *r; /* the module stays loaded: the process' life */
	}
	fa_cu_func fn = gpu_words_kernel.fn[dev];
	if (fn == NULL)
		*r = gpu_words_kernel.err[dev];
	pthread_mutex_unlock(&gpu_words_kernel.mu);
	return fn;
}

/* See gpu_int.h. */
void gpu_async_words_load(struct gpu_backend *b)
{
	for (unsigned i = 0; i < b->ndevs; i++) {
		fa_cu_res r = 0;
		fa_cu->CtxSetCurrent(b->devs[i].ctx);
		if (gpu_words_fn(i, &r) == NULL)
			log_warn("gpu: GPU %d: loading the completion-word release kernel: CUDA error "
			         "%d (%s); a stuck asynchronous call's stream cannot be released",
			         b->devs[i].ordinal, r, fa_cu_errstr(r));
	}
}

/* Write max(*word, value) into a ready word on od's release stream (od's thread, context
 * current, no lock). 0 or the CUDA error. */
static fa_cu_res gpu_words_release(struct gpu_owner_dev *od, fa_cu_ptr word, uint64_t value)
{
	const struct fa_cu_api *cu = fa_cu;
	fa_cu_res r = 0;
	fa_cu_func fn = gpu_words_fn((unsigned)(od->d - od->d->b->devs), &r);

	if (fn == NULL)
		return r;
	if (od->release_stream == NULL &&
	    (r = cu->StreamCreate(&od->release_stream, FA_CU_STREAM_NON_BLOCKING)) != 0) {
		od->release_stream = NULL;
		return r;
	}
	void *params[2] = {&word, &value};
	return cu->LaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, od->release_stream, params, NULL);
}

/* Release what must be (od's thread, mu held; released around the CUDA calls): with
 * release_all (the session closed) every pending wait, else the head ticket's when the stream
 * has waited async_wait_ns on it. Only the head can be stuck on its word: the stream is in
 * order, and a later ticket's wait is reached only after the head's kernel. Returns when the
 * thread should look again (0: nothing pending). */
static uint64_t gpu_words_watch_locked(struct gpu_owner_dev *od)
{
	struct gpu_backend *b = od->d->b;

	for (;;) {
		struct gpu_ticket *t = od->wq_head;
		uint64_t now = fa_now_ns();
		while (t != NULL && (t->released != FA_OK || t->abandoned))
			t = t->wnext;
		if (t == NULL)
			return od->wq_head != NULL ? now + GPU_WORDS_POLL_NS : 0;
		uint64_t passed = __atomic_load_n(od->passed, __ATOMIC_ACQUIRE);
		if (od->release_all) {
			/* every ticket not released yet whose wait has not passed */
			while (t != NULL && (t->released != FA_OK || t->abandoned || passed >= t->n))
				t = t->wnext;
			if (t == NULL)
				return now + GPU_WORDS_POLL_NS;
			t->released = FA_ECLOSED;
		} else {
			if (t != od->wq_head || passed >= t->n)
				return now + GPU_WORDS_POLL_NS; /* a kernel runs: not the client's fault */
			if (now - od->wq_since < b->async_wait_ns)
				return od->wq_since + b->async_wait_ns;
			t->released = FA_ETIMEDOUT;
			b->async_timeouts++;
		}
		b->async_released++;
		fa_cu_ptr word = t->ready;
		uint64_t seq = t->seq, n = t->n;
		bool closing = od->release_all;
		pthread_mutex_unlock(&b->mu);
		fa_cu_res r = gpu_words_release(od, word, seq);
		if (r != 0)
			log_warn("gpu: releasing an asynchronous call's ready word on GPU %d: CUDA "
			         "error %d (%s); its session's stream stays blocked",
			         od->d->ordinal, r, fa_cu_errstr(r));
		else
			log_notice("gpu: asynchronous call %" PRIu64 " of a session on GPU %d: its "
			           "inputs were never marked ready (%s); released",
			           n, od->d->ordinal,
			           closing ? "the session closed" : "--async-wait-ms passed");
		pthread_mutex_lock(&b->mu);
	}
}

/* Take t off its session's list of words tickets (mu held). */
static void gpu_words_unlink_locked(struct gpu_ticket *t)
{
	struct gpu_owner_dev *od = t->od;
	struct gpu_ticket **pp = &od->wq_head, *prev = NULL;

	while (*pp != NULL && *pp != t) {
		prev = *pp;
		pp = &(*pp)->wnext;
	}
	if (*pp == NULL)
		return;
	*pp = t->wnext;
	if (od->wq_tail == t)
		od->wq_tail = prev;
	if (prev == NULL)
		od->wq_since = fa_now_ns(); /* the next one is the head from now on */
	t->od = NULL;
	t->wnext = NULL;
	pthread_cond_signal(&od->cv); /* its thread sleeps less while the list is empty */
}

/* The host function queued behind an asynchronous job's kernel (a driver thread: no CUDA calls
 * here): the kernel finished, its regions can go. */
static void gpu_async_done(void *arg)
{
	struct gpu_ticket *t = arg;
	struct gpu_backend *b = t->b;

	pthread_mutex_lock(&b->mu);
	if (t->od != NULL)
		gpu_words_unlink_locked(t);
	if (!t->abandoned) {
		if (t->prev != NULL)
			t->prev->next = t->next;
		else
			b->tickets = t->next;
		if (t->next != NULL)
			t->next->prev = t->prev;
		b->ntickets--;
		t->job->compute_ns = fa_now_ns() - t->t0;
		if (t->released != FA_OK) {
			/* its reply went at the enqueue: the failure is logged by dispatch */
			t->job->status = t->released;
			snprintf(t->job->detail, sizeof t->job->detail,
			         t->released == FA_ETIMEDOUT
			             ? "the call's inputs were not marked ready (its completion word "
			               "unwritten) within --async-wait-ms; the daemon released its "
			               "stream, O is undefined"
			             : "the session closed before the call's inputs were marked "
			               "ready; the daemon released its stream, O is undefined");
			b->fwd_failed++;
		} else {
			b->fwd_ok++;
		}
		gpu_async_finish_locked(b, t->job);
		uv_async_send(&b->async);
		pthread_cond_broadcast(&b->cv); /* gpu_close may wait for the last ticket */
	}
	pthread_mutex_unlock(&b->mu);
	free(t);
}

/* The words path's first half (od's thread): the stream waits for the client's ready word,
 * then marks the wait passed. FA_OK with *ready set, or the job's status (nothing left on the
 * stream that could block it). */
static fa_status gpu_words_wait(struct gpu_owner_dev *od, struct backend_job *job,
                                fa_cu_ptr *ready, uint64_t *n, bool *sticky)
{
	struct gpu_dev *d = od->d;
	const struct fa_cu_api *cu = fa_cu;
	fa_cu_ptr w = (fa_cu_ptr)(uintptr_t)job->words;
	fa_cu_res r;

	if (od->passed == NULL) {
		void *h = NULL;
		fa_cu_ptr hd = 0;
		r = cu->MemHostAlloc(&h, 64, FA_CU_MEMHOSTALLOC_PORTABLE | FA_CU_MEMHOSTALLOC_DEVICEMAP);
		if (r == 0) {
			memset(h, 0, 64);
			if ((r = cu->MemHostGetDevicePointer(&hd, h, 0)) != 0)
				cu->MemFreeHost(h);
		}
		if (r != 0)
			return job->status = gpu_job_cuerr(d, job, r, "allocating the session's "
			                                   "completion-word marker", sticky);
		od->passed = h;
		od->passed_dev = hd;
	}
	*ready = w + FA_PROTO_WORDS_READY(job->slot);
	if ((r = cu->StreamWaitValue64(od->stream, *ready, job->words_seq,
	                               FA_CU_STREAM_WAIT_VALUE_GEQ)) != 0)
		return job->status = gpu_job_cuerr(d, job, r, "waiting for the client's ready word "
		                                   "(cuStreamWaitValue64)", sticky);
	*n = ++od->nwords;
	/* The default (fenced) write: the entry points cuGetProcAddress gives for the 12.0 ABI are
	 * the _v2 ones, which refuse NO_MEMORY_BARRIER with CUDA_ERROR_INVALID_VALUE (measured on
	 * the H200); the fence costs nothing here, nothing was written before the wait. */
	if ((r = cu->StreamWriteValue64(od->stream, od->passed_dev, *n,
	                                FA_CU_STREAM_WRITE_VALUE_DEFAULT)) != 0) {
		gpu_words_release(od, *ready, job->words_seq); /* the wait must not stay */
		return job->status = gpu_job_cuerr(d, job, r, "marking the wait passed", sticky);
	}
	return FA_OK;
}

/* What an asynchronous inference snapshot waits for (gpu_snapshot_wait_fn's arg). */
struct gpu_snap_wait {
	struct gpu_owner_dev *od;
	fa_cu_ptr ready;   /* the call's ready word */
	uint64_t seq, n;   /* its value; its words ticket's ordinal (the *passed marker) */
};

/* gpu_snapshot_wait_fn of the asynchronous inference calls (od's thread): poll the stream
 * instead of synchronizing, because this thread also watches the session's ready words
 * (gpu_words_watch_locked) and would otherwise wait for ever on a client that never writes its
 * word. The call's own wait counts from when no earlier ticket is left (the stream is then at
 * its wait) and is released, as a ticket's, after --async-wait-ms or when the session closes. */
static fa_cu_res gpu_snap_wait(void *arg, fa_cu_stream s, fa_status *why)
{
	struct gpu_snap_wait *w = arg;
	struct gpu_owner_dev *od = w->od;
	struct gpu_backend *b = od->d->b;
	uint64_t since = 0, pause_ns = 5000;

	for (;;) {
		fa_cu_res r = fa_cu->StreamQuery(s);
		if (r != 600 /* CUDA_ERROR_NOT_READY */)
			return r;
		pthread_mutex_lock(&b->mu);
		gpu_words_watch_locked(od); /* earlier tickets: the head may be stuck on its word */
		uint64_t passed = __atomic_load_n(od->passed, __ATOMIC_ACQUIRE), now = fa_now_ns();
		bool release = false;
		if (*why == FA_OK && passed < w->n) {
			if (od->wq_head == NULL && since == 0)
				since = now;
			if (od->release_all)
				*why = FA_ECLOSED, release = true;
			else if (since != 0 && now - since >= b->async_wait_ns)
				*why = FA_ETIMEDOUT, release = true;
			if (release) {
				b->async_released++;
				if (*why == FA_ETIMEDOUT)
					b->async_timeouts++;
			}
		}
		pthread_mutex_unlock(&b->mu);
		if (release && (r = gpu_words_release(od, w->ready, w->seq)) != 0)
			return r;
		struct timespec ts = {0, (long)pause_ns};
		nanosleep(&ts, NULL);
		pause_ns = pause_ns < 200000 ? pause_ns * 2 : pause_ns; /* 5 us .. 320 us */
	}
}

/* Where the host function of the job just enqueued on od->stream goes (od's thread): the side
 * stream, made to wait for everything enqueued so far (the kernel, its done word), so the
 * kernel's stream goes on to the next call while the driver runs the function; od->stream
 * itself when the side stream is missing or the wait cannot be enqueued. */
static fa_cu_stream gpu_hostfn_stream(struct gpu_owner_dev *od)
{
	const struct fa_cu_api *cu = fa_cu;

	if (!od->hostfn_tried) {
		od->hostfn_tried = true;
		if (cu->StreamCreate(&od->hostfn_stream, FA_CU_STREAM_NON_BLOCKING) != 0)
			od->hostfn_stream = NULL;
		else if (cu->EventCreate(&od->hostfn_ev, FA_CU_EVENT_DISABLE_TIMING) != 0) {
			cu->StreamDestroy(od->hostfn_stream);
			od->hostfn_stream = NULL;
			od->hostfn_ev = NULL;
		}
	}
	if (od->hostfn_stream == NULL || cu->EventRecord(od->hostfn_ev, od->stream) != 0 ||
	    cu->StreamWaitEvent(od->hostfn_stream, od->hostfn_ev, 0) != 0)
		return od->stream;
	return od->hostfn_stream;
}

/* Write job's done word, done[slot] = words_seq, on od's stream (od's thread), fenced (the
 * default): after everything earlier on the stream, the kernel's O and lse included. 0 or the
 * CUDA error. */
static fa_cu_res gpu_words_done(struct gpu_owner_dev *od, const struct backend_job *job)
{
	return fa_cu->StreamWriteValue64(
	    od->stream, (fa_cu_ptr)(uintptr_t)job->words + FA_PROTO_WORDS_DONE(job->slot),
	    job->words_seq, FA_CU_STREAM_WRITE_VALUE_DEFAULT);
}

/* Before an asynchronous job's stream waits on the client: compile and load its kernels, and
 * grow the pinned block its index tables are copied into. Loading a module may need the whole
 * context idle (lazy loading; freeing pinned memory likewise), and a stream waiting on a
 * client's word is not idle until the client's own stream gets there: a load after the wait
 * could block this thread until then (for ever for a client that died), and with it the
 * release of that very wait (gpu_words_watch_locked runs here). The inference ops' kernels
 * depend on the tables' contents and load after the snapshot, whose wait has passed by then.
 * FA_OK, or the job's status with its detail (nothing enqueued). */
static fa_status gpu_async_prepare(struct gpu_owner_dev *od, struct backend_job *job,
                                   bool *sticky)
{
	struct gpu_dev *d = od->d;

	if (job->infer != NULL)
		return gpu_snap_reserve(d, job, &od->snap, sticky);
	if (job->is_bwd)
		return gpu_prepare_bwd(d, job);
	bool ready = false;
	char name[8];
	if (fa_gpu_kernel_lookup(d->g, &job->desc, &ready, name, sizeof name, job->detail,
	                         sizeof job->detail) == FA_OK && ready)
		return FA_OK; /* the common case: a launch-memo hit */
	job->detail[0] = '\0';
	return fa_gpu_prepare(d->g, &job->desc, NULL, job->detail, sizeof job->detail);
}

/* Run an asynchronous job: wait for the client's ready word (or event) on the session's stream,
 * launch, write the done word (or record the daemon's event), queue the host function. FA_OK:
 * enqueued (the caller hands it back for the reply); else the job failed before its kernel was
 * enqueued (handed back once). */
static fa_status gpu_run_async(struct gpu_owner_dev *od, struct backend_job *job, bool *sticky)
{
	struct gpu_dev *d = od->d;
	struct gpu_backend *b = d->b;
	const struct fa_cu_api *cu = fa_cu;
	const struct fa_attn_fwd_desc *ds = &job->desc;
	uint64_t prof[3] = {0};
	fa_cu_ptr gate_word = 0;
	fa_cu_ptr ready = 0;
	uint64_t n = 0;
	fa_cu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	if (job->words_release) {
		if ((r = gpu_words_done(od, job)) != 0)
			gpu_job_cuerr(d, job, r, "releasing a refused call's done word", sticky);
		return FA_ECLOSED; /* handed back once: nothing else was enqueued */
	}
	__typeof__(od->slot[0]) *sl = &od->slot[job->slot];
	bool words = job->words != NULL;
	if ((st = gpu_async_prepare(od, job, sticky)) != FA_OK)
		return job->status = st;
	if (words) {
		uint64_t tw = fa_now_ns();
		if ((st = gpu_words_wait(od, job, &ready, &n, sticky)) != FA_OK)
			return st;
		prof[0] = fa_now_ns() - tw;
	} else if (job->has_wait_event) {
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
		if (od->gate != 0) {
			/* through the gate (gpu_int.h): wrapping after 2^32 requests of one slot
			 * would let one wait pass early; not a concern at any real rate */
			uint32_t seq = ++od->gate_seq[job->slot];
			gate_word = od->gate + 4u * job->slot;
			if ((r = cu->StreamWaitEvent(od->wait_stream, sl->wait, 0)) != 0 ||
			    (r = cu->StreamWriteValue32(od->wait_stream, gate_word, seq, 0)) != 0 ||
			    (r = cu->StreamWaitValue32(od->stream, gate_word, seq,
			                               FA_CU_STREAM_WAIT_VALUE_GEQ)) != 0)
				return job->status = gpu_job_cuerr(
				           d, job, r, "waiting for the client's event", sticky);
		} else if ((r = cu->StreamWaitEvent(od->stream, sl->wait, 0)) != 0) {
			return job->status = gpu_job_cuerr(d, job, r, "waiting for the client's event",
			                                   sticky);
		}
		prof[0] = fa_now_ns() - tw;
	}
	if (!words && sl->done == NULL) {
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
		if (words)
			gpu_words_release(od, ready, job->words_seq);
		snprintf(job->detail, sizeof job->detail, "out of memory");
		return job->status = FA_ENOMEM;
	}
	t->b = b;
	t->job = job;
	t->d = d;
	t->gate_word = gate_word;
	t->t0 = fa_now_ns();
	uint64_t tl = t->t0;
	gpu_atiming_read(&od->tm, d); /* the pairs that completed meanwhile free their slots */
	gpu_atiming_start(&od->tm, od->stream);
	struct gpu_snap_wait sw = {.od = od, .ready = ready, .seq = job->words_seq, .n = n};
	if (job->infer != NULL)
		st = words ? gpu_launch_infer_async(d, job, od->stream, gpu_snap_wait, &sw, &od->snap,
		                                    sticky)
		           : FA_EPROTO; /* dispatch: inference calls are asynchronous with words */
	else if (job->is_bwd)
		st = gpu_launch_bwd(d, job, od->stream);
	else
		st = fa_gpu_attn_fwd(d->g, ds, (CUdeviceptr)(uintptr_t)job->q,
		                     (CUdeviceptr)(uintptr_t)job->k, (CUdeviceptr)(uintptr_t)job->v,
		                     (CUdeviceptr)(uintptr_t)job->o, (CUdeviceptr)(uintptr_t)job->lse,
		                     (CUstream)od->stream, job->detail, sizeof job->detail);
	if (st == FA_OK)
		gpu_atiming_end(&od->tm, od->stream);
	else
		od->tm.pend = -1; /* nothing launched: no pair */
	if (st != FA_OK) {
		free(t);
		if (words)
			gpu_words_release(od, ready, job->words_seq); /* the wait must not stay */
		if (st == FA_EDEVICE && (r = cu->CtxSynchronize()) != 0 && fa_cu_sticky(r))
			*sticky = true;
		return job->status = st;
	}
	uint64_t tr = fa_now_ns();
	prof[1] = tr - tl;
	if (words) {
		r = gpu_words_done(od, job); /* fenced: O and lse are visible first */
	} else {
		r = cu->EventRecord(sl->done, od->stream);
	}
	if (r != 0) {
		free(t);
		return job->status = gpu_job_cuerr(d, job, r, words ? "writing the done word "
		                                   "(cuStreamWriteValue64)" : "recording the "
		                                   "completion event", sticky);
	}
	if (!words)
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
	if (words) {
		t->od = od;
		t->n = n;
		t->ready = ready;
		t->seq = job->words_seq;
		if (od->wq_tail != NULL) {
			od->wq_tail->wnext = t;
		} else {
			od->wq_head = t;
			od->wq_since = fa_now_ns();
		}
		od->wq_tail = t;
		b->async_words++;
	}
	job->enqueued = true;
	job->kernel_done = job->reply_delivered = false;
	backend_done_push(&b->done_list, job); /* the reply */
	pthread_mutex_unlock(&b->mu);
	uint64_t th = fa_now_ns();
	r = cu->LaunchHostFunc(gpu_hostfn_stream(od), gpu_async_done, t);
	th = fa_now_ns() - th;
	pthread_mutex_lock(&b->mu);
	b->async_ns[3] += th;
	pthread_mutex_unlock(&b->mu);
	if (r != 0) {
		/* Rare: finish it here, after the kernel, on this thread (a words wait the client
		 * never satisfies is released after --async-wait-ms: this thread cannot watch while
		 * it waits, so release it now, the call fails). */
		if (words) {
			pthread_mutex_lock(&b->mu);
			t->released = FA_ETIMEDOUT;
			pthread_mutex_unlock(&b->mu);
			gpu_words_release(od, ready, job->words_seq);
		}
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

/* The session thread's CUDA resources on its device (od's thread, context current, at its
 * start: the loop thread that creates od makes no CUDA call, since creating streams and
 * allocating may wait for the whole context, which a stream waiting on a client may hold).
 * FA_OK, or the status every job of the session then gets, with od->init_detail. */
static fa_status gpu_owner_cuda_init(struct gpu_owner_dev *od)
{
	struct gpu_dev *d = od->d;
	fa_cu_res r;

	if ((r = fa_cu->StreamCreate(&od->stream, FA_CU_STREAM_NON_BLOCKING)) != 0) {
		od->stream = NULL;
		snprintf(od->init_detail, sizeof od->init_detail, "creating the session's stream on "
		         "GPU %d: CUDA error %d (%s)", d->ordinal, r, fa_cu_errstr(r));
		return r == FA_CU_ERROR_OUT_OF_MEMORY ? FA_ENOMEM : FA_EDEVICE;
	}
	/* The gate: optional; without it a dead client's wait holds its request until exit. */
	if (fa_cu->StreamCreate(&od->wait_stream, FA_CU_STREAM_NON_BLOCKING) != 0) {
		od->wait_stream = NULL;
	} else if (fa_cu->MemAlloc(&od->gate, 4u * FA_PROTO_MAX_SLOTS) != 0 ||
	           fa_cu->MemsetD8(od->gate, 0, 4u * FA_PROTO_MAX_SLOTS) != 0) {
		if (od->gate != 0)
			fa_cu->MemFree(od->gate);
		od->gate = 0;
		fa_cu->StreamDestroy(od->wait_stream);
		od->wait_stream = NULL;
	}
	if (od->gate == 0)
		log_warn("gpu: GPU %d: no gate for a session's asynchronous calls: a client that dies "
		         "before its event fires holds its request until the daemon exits",
		         d->ordinal);
	return FA_OK;
}

/* A session's asynchronous thread on one device: its jobs, in order (see gpu_owner_dev). */
static void *gpu_owner_thread(void *arg)
{
	struct gpu_owner_dev *od = arg;
	struct gpu_backend *b = od->d->b;

	fa_cu->CtxSetCurrent(od->d->ctx);
	fa_status init = gpu_owner_cuda_init(od);
	pthread_mutex_lock(&b->mu);
	for (;;) {
		if (od->tm.rd < od->tm.rec) { /* kernels timed and not read: their host function
		                               * woke this thread, or a job came */
			pthread_mutex_unlock(&b->mu);
			gpu_atiming_read(&od->tm, od->d);
			pthread_mutex_lock(&b->mu);
		}
		uint64_t next = gpu_words_watch_locked(od);
		if (od->head == NULL && !od->stop) {
			if (next == 0) {
				pthread_cond_wait(&od->cv, &b->mu);
			} else {
				struct timespec ts = {.tv_sec = (time_t)(next / 1000000000ull),
				                      .tv_nsec = (long)(next % 1000000000ull)};
				pthread_cond_timedwait(&od->cv, &b->mu, &ts); /* CLOCK_MONOTONIC */
			}
			continue;
		}
		struct backend_job *job = od->head;
		if (job == NULL)
			break;
		od->head = job->next;
		if (od->head == NULL)
			od->tail = NULL;
		job->next = NULL;
		if (fault_marked(&b->base) || init != FA_OK) {
			gpu_finish_locked(b, job, init != FA_OK ? init : FA_EDEVICE,
			                  init != FA_OK ? od->init_detail : fault_why(&b->base));
			uv_async_send(&b->async);
			continue;
		}
		pthread_mutex_unlock(&b->mu);
		bool sticky = false;
		uint64_t t0 = fa_now_ns();
		fa_status st = gpu_run_async(od, job, &sticky);
		/* A words call that failed before its kernel was enqueued: its done word now, in
		 * the order of the session's stream (the client's stream may already wait for it:
		 * the ring). A words release from dispatch would come after the session's later
		 * calls, whose ready words the client's stream writes only after this done word:
		 * their waits would hold the stream until --async-wait-ms. */
		if (st != FA_OK && job->words != NULL && !job->words_release && !sticky &&
		    gpu_words_done(od, job) == 0)
			job->done_written = true; /* else dispatch's words release tries again */
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

/* See gpu_int.h. */
void gpu_async_handoff(struct gpu_dev *d, struct backend_job *job)
{
	struct gpu_backend *b = d->b;
	struct gpu_owner_dev *od = gpu_owner_dev(d, job);

	pthread_mutex_lock(&b->mu);
	if (od == NULL) {
		gpu_job_done_locked(b, job, false);
	} else {
		backend_job_append(&od->head, &od->tail, job);
		pthread_cond_signal(&od->cv);
	}
	pthread_mutex_unlock(&b->mu);
}

/* This session's state on d, created on first use (its first asynchronous job, on the loop
 * thread: host memory and the thread only; the thread makes its CUDA resources). NULL with
 * job's status set. */
struct gpu_owner_dev *gpu_owner_dev(struct gpu_dev *d, struct backend_job *job)
{
	struct gpu_backend *b = d->b;
	struct gpu_owner *o;
	unsigned i = (unsigned)(d - b->devs);

	pthread_mutex_lock(&b->mu);
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
	od->owner = job->owner;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* fa_now_ns's clock: the watchdog */
	pthread_cond_init(&od->cv, &ca);
	pthread_condattr_destroy(&ca);
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
		free(od);
		return NULL;
	}
	o->dev[i] = od;
	pthread_mutex_lock(&b->mu);
	od->onext = b->owners;
	b->owners = od;
	pthread_mutex_unlock(&b->mu);
	return od;
}

/* See gpu_int.h. */
unsigned gpu_async_cancel(struct backend *base, const void *owner, fa_status st,
                          const char *why)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	unsigned n = gpu_cancel(base, owner, st, why);

	pthread_mutex_lock(&b->mu);
	for (struct gpu_owner_dev *od = b->owners; od != NULL; od = od->onext) {
		if (owner != NULL && od->owner != owner)
			continue;
		od->release_all = true;
		pthread_cond_signal(&od->cv);
	}
	pthread_mutex_unlock(&b->mu);
	return n;
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
		for (struct gpu_owner_dev **pp = &b->owners; *pp != NULL; pp = &(*pp)->onext)
			if (*pp == od) {
				*pp = od->onext;
				break;
			}
		/* Abandoned tickets (the fatal path) may still see their host function run. */
		while (od->wq_head != NULL)
			gpu_words_unlink_locked(od->wq_head);
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
		if (od->stream != NULL)
			fa_cu->StreamDestroy(od->stream);
		if (od->wait_stream != NULL && fa_cu->StreamQuery(od->wait_stream) != 0) {
			/* still waiting on a client event that never fired: its pending write would
			 * land in freed memory (an illegal address loses the context), so the gate and
			 * its stream stay until the process exits */
			b->gates_kept++;
			log_warn("gpu: a closed session's client event never fired on GPU %u; keeping "
			         "its gate (%u bytes) and wait stream until exit", i,
			         4u * FA_PROTO_MAX_SLOTS);
		} else {
			if (od->gate != 0)
				fa_cu->MemFree(od->gate);
			if (od->wait_stream != NULL)
				fa_cu->StreamDestroy(od->wait_stream);
		}
		if (od->release_stream != NULL)
			fa_cu->StreamDestroy(od->release_stream);
		if (od->hostfn_stream != NULL)
			fa_cu->StreamDestroy(od->hostfn_stream);
		if (od->hostfn_ev != NULL)
			fa_cu->EventDestroy(od->hostfn_ev);
		gpu_atiming_fini(&od->tm);
		if (od->passed != NULL)
			fa_cu->MemFreeHost((void *)(uintptr_t)od->passed);
		if (od->snap.p != NULL)
			fa_cu->MemFreeHost(od->snap.p);
		free(od);
	}
	free(o);
}
