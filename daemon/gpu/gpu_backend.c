/* gpu_backend.c - forward attention on the GPU: the backend's open, close and operations table
 * (backend.h). The rest of daemon/gpu/ is the machinery behind it; gpu_int.h lists the files and
 * writes down the locking rules, README.md says how the backend works.
 *
 * Open: every visible device (gpu_dev.c; one that fails is left out with a warning), the tuning
 * table, the loop's handles, one worker per device and the compile threads, all with the
 * asynchronous signals blocked. Close: stop the workers after their queues drain, wait a bounded
 * time for asynchronous kernels, deliver what finished, close the handles; the last handle's
 * close frees everything.
 *
 * Faults: fa_cu_sticky (common/fa_cu.h) classifies CUDA errors. One that poisons the context
 * (illegal address, assert, launch failure...) is marked with fault_mark and makes every queued
 * and later job fail with FA_EDEVICE (gpu_fatal_locked); the rest of the fatal path (STOPPING=1,
 * the drain, exit status 70 for systemd's Restart=on-failure) is the server's, in fault.c. Other
 * errors fail their job only. */
#include "gpu_int.h"

#include "worklimit.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

/* Free everything (workers stopped, async closed or never opened). */
static void gpu_free(struct gpu_backend *b)
{
	/* the tuner's scratch buffers need the device; the table outlives its last user */
	if (b->tune_ops_ok)
		fa_tune_gpu_ops_fini(&b->tune_ops);
	if (b->tune != NULL) {
		if (b->devs[0].g != NULL)
			fa_gpu_set_tune_table(b->devs[0].g, NULL);
		fa_tune_table_close(b->tune);
	}
	compile_table_fini(&b->waiting);
	pthread_cond_destroy(&b->compile_cv);
	for (unsigned i = 0; i < b->ndevs; i++)
		gpu_dev_fini(&b->devs[i]);
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
	free(b);
}

/* A loop handle is closed: the last one releases the backend. */
static void gpu_handle_closed(uv_handle_t *h)
{
	struct gpu_backend *b = h->data;
	void (*closed)(void *) = b->closed;
	void *arg = b->closed_arg;

	if (--b->handles_open > 0)
		return;
	gpu_free(b);
	if (closed != NULL)
		closed(arg);
}

/* Stop the workers after their queues drain, deliver what finished, close the handle. */
static void gpu_close(struct backend *base, void (*closed)(void *arg), void *arg)
{
	struct gpu_backend *b = (struct gpu_backend *)base;

	pthread_mutex_lock(&b->mu);
	b->stopping = true;
	/* jobs still waiting for a compile are answered now; a compile in progress runs to its end
	 * (the join below waits for it, at most one compile) and finds no jobs */
	if (gpu_fail_waiting_locked(b, NULL, FA_ECLOSED, "the daemon is shutting down") > 0)
		uv_async_send(&b->async);
	pthread_cond_broadcast(&b->cv);
	pthread_cond_broadcast(&b->compile_cv);
	pthread_mutex_unlock(&b->mu);
	for (unsigned i = 0; i < b->ncompile; i++)
		pthread_join(b->compile_thr[i], NULL);
	for (unsigned i = 0; i < b->ndevs; i++)
		if (b->devs[i].thread_started)
			pthread_join(b->devs[i].thread, NULL);
	/* Asynchronous kernels still running (the server drained, so normally none): wait a
	 * bounded time for their host functions, then finish them as abandoned. */
	pthread_mutex_lock(&b->mu);
	uint64_t until = fa_now_ns() + GPU_CLOSE_WAIT_NS;
	while (b->tickets != NULL && fa_now_ns() < until) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&b->cv, &b->mu, &ts);
	}
	if (b->tickets != NULL) {
		log_warn("gpu: %u asynchronous kernels did not finish within %llu s of the close; "
		         "answering them FA_ECLOSED", b->ntickets,
		         (unsigned long long)(GPU_CLOSE_WAIT_NS / 1000000000ull));
		gpu_abandon_tickets_locked(b, FA_ECLOSED, "the daemon closed before the kernel "
		                           "finished");
	}
	pthread_mutex_unlock(&b->mu);
	gpu_async_cb(&b->async); /* every job is handed back exactly once */
	b->closed = closed;
	b->closed_arg = arg;
	if (b->spin_open) {
		uv_idle_stop(&b->spin);
		uv_close((uv_handle_t *)&b->spin, gpu_handle_closed);
	}
	if (b->check_open) {
		uv_check_stop(&b->check);
		uv_close((uv_handle_t *)&b->check, gpu_handle_closed);
	}
	uv_close((uv_handle_t *)&b->async, gpu_handle_closed);
}

/* Start the GPU backend on GPU 0. FA_ENOGPU (with the reason) when there is none. */
static fa_status gpu_open(struct backend **out, uv_loop_t *loop, const struct config *cfg,
                          backend_done_fn done, void *arg, char *err, size_t errlen)
{
	struct gpu_backend *b;
	sigset_t all, old;
	fa_status st;
	int rv;

	*out = NULL;
	if ((b = calloc(1, sizeof(*b))) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	pthread_cond_init(&b->compile_cv, NULL);
	compile_table_init(&b->waiting);
	b->base.ops = &backend_gpu_ops;
	b->base.align = 16; /* fa_gpu.h: 16-byte pointers and batch/seq/head strides */
	b->base.host_memory = true;
	b->base.device_memory = true;
	b->base.mask_ext = true; /* the forward, wgmma and decode kernels' FA_WIN / FA_SOFTCAP */
	b->base.infer = true; /* ATTN_VARLEN, ATTN_KVCACHE: gpu_exec_infer.c */
	b->loop = loop;
	b->done = done;
	b->done_arg = arg;
	/* fa_gpu_open first (in gpu_dev_open): its "no driver" text is the one worth showing. */
	b->base.async_events = true;
	b->ndevs = 1;
	st = gpu_dev_open(b, &b->devs[0], 0, cfg, err, errlen);
	if (st != FA_OK) {
		gpu_free(b);
		return st;
	}
	/* Every other visible device (CUDA_VISIBLE_DEVICES chooses): one that cannot be opened
	 * is left out with a warning, the others serve. */
	int count = 1;
	if (fa_cu->DeviceGetCount(&count) != 0)
		count = 1;
	if (count > GPU_MAX_DEVICES) {
		log_warn("gpu: %d devices visible; serving the first %d", count, GPU_MAX_DEVICES);
		count = GPU_MAX_DEVICES;
	}
	for (int i = 1; i < count; i++) {
		char why[FA_PROTO_DETAIL_MAX];
		st = gpu_dev_open(b, &b->devs[b->ndevs], i, cfg, why, sizeof why);
		b->ndevs++; /* so gpu_free releases what it opened, also on failure */
		if (st != FA_OK) {
			log_warn("gpu: GPU %d left out: %s", i, why);
			gpu_dev_fini(&b->devs[--b->ndevs]);
		}
	}
	b->base.async_words = gpu_async_words_supported(b);
	if (b->base.async_words)
		gpu_async_words_load(b); /* now, while no stream waits on a client (gpu_async.c) */
	b->async_wait_ns = (uint64_t)(cfg->async_wait_ms > 0 ? cfg->async_wait_ms : 60000) *
	                   1000000ull;
	gpu_tune_open(b, cfg);
	if ((rv = uv_async_init(loop, &b->async, gpu_async_cb)) != 0) {
		gpu_free(b);
		return fa_err(err, errlen, FA_ESYS, "uv_async_init: %s", uv_strerror(rv));
	}
	b->async.data = b;
	b->async_open = true;
	b->handles_open = 1;
	if (uv_idle_init(loop, &b->spin) == 0) { /* only latency: carry on without it */
		b->spin.data = b;
		b->spin_open = true;
		b->handles_open++;
	}
	if (uv_check_init(loop, &b->check) == 0) { /* the same */
		b->check.data = b;
		b->check_open = true;
		b->handles_open++;
	}
	/* The prewake (gpu_worker.c) needs a core for the loop's poll and the client's: off on
	 * small machines, like the rings' polling. */
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	b->prewake_ns = (uint64_t)(cfg->prewake_us >= 0 ? cfg->prewake_us : ncpu >= 4 ? 150 : 0) *
	                1000u;

	sigfillset(&all);
	sigdelset(&all, SIGBUS);
	sigdelset(&all, SIGSEGV);
	sigdelset(&all, SIGFPE);
	sigdelset(&all, SIGILL);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < b->ndevs; i++) {
		if ((rv = pthread_create(&b->devs[i].thread, NULL, gpu_worker, &b->devs[i])) != 0) {
			pthread_sigmask(SIG_SETMASK, &old, NULL);
			fa_err(err, errlen, FA_ESYS, "starting the GPU %u worker: %s", i,
			       strerror(rv));
			gpu_close(&b->base, NULL, NULL);
			return FA_ESYS;
		}
		b->devs[i].thread_started = true;
	}
	unsigned want = cfg->compile_threads < 0 ? 0 : (unsigned)cfg->compile_threads;
	if (want > GPU_MAX_COMPILE_THREADS)
		want = GPU_MAX_COMPILE_THREADS;
	for (unsigned i = 0; i < want; i++) {
		/* fewer threads than asked only costs latency: carry on with what started */
		if ((rv = pthread_create(&b->compile_thr[i], NULL, gpu_compiler, b)) != 0) {
			log_warn("gpu: starting compile thread %u: %s", i, strerror(rv));
			break;
		}
		pthread_mutex_lock(&b->mu); /* gpu_submit reads it on the loop: same thread, but */
		b->ncompile = i + 1;        /* the compile threads read it under mu */
		pthread_mutex_unlock(&b->mu);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	b->base.threads = b->ndevs;
	b->base.default_max_gflop = WORKLIMIT_GPU_DEFAULT_GFLOP;
	for (unsigned i = 0; i < b->ndevs; i++)
		log_notice("backend: gpu on GPU %d (%s, sm_%d, %zu bytes of opt-in shared memory)",
		           b->devs[i].ordinal, fa_gpu_name(b->devs[i].g), fa_gpu_sm(b->devs[i].g),
		           fa_gpu_smem_optin(b->devs[i].g));
	*out = &b->base;
	return FA_OK;
}

const struct backend_ops backend_gpu_ops = {
	.name = "gpu",
	.kind = FA_BACKEND_GPU,
	.open = gpu_open,
	.submit = gpu_submit,
	.cancel = gpu_async_cancel, /* gpu_cancel, and the session's completion words */
	.stop = gpu_stop,
	.close = gpu_close,
	.healthy = gpu_healthy,
	.region_open = gpu_region_open,
	.stats = gpu_stats,
	.owner_free = gpu_owner_free,
	.flush = gpu_flush,
};
