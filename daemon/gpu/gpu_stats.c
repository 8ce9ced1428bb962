/* gpu_stats.c - the GPU backend's STATS text: "# gpu" (devices, counters, where time goes, the
 * compile pool, the canary), "# tuning" and "# kernels". Tests parse these keys: add keys,
 * never rename one. */
#include "gpu_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "fault.h"
#include "util.h"

/* "# gpu" section of STATS. */
void gpu_stats(struct backend *base, char *buf, size_t cap)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	struct gpu_dev *d = &b->devs[0];
	char uuid[48];
	uint64_t ok, failed, h2d, d2h, compiles, compiles_failed, compile_jobs, tuned, tune_failed;
	unsigned waiting_jobs, waiting_kernels;
	bool tuning;

	pthread_mutex_lock(&b->mu);
	compiles = b->compiles;
	compiles_failed = b->compiles_failed;
	compile_jobs = b->compile_jobs;
	waiting_jobs = b->waiting.jobs;
	waiting_kernels = b->waiting.entries;
	tuned = b->tuned;
	tune_failed = b->tune_failed;
	tuning = b->tune_prepping || b->tuner != NULL; /* tuner: read racily, for STATS only */
	ok = b->fwd_ok;
	failed = b->fwd_failed;
	h2d = b->h2d_bytes;
	d2h = b->d2h_bytes;
	uint64_t async_enq = b->async_enqueued, canary_runs = 0, canary_failed = 0, inl = 0;
	uint64_t batches = 0;
	for (unsigned i = 0; i < b->ndevs; i++) {
		inl += b->devs[i].inline_jobs;
		batches += b->devs[i].batches;
	}
	uint64_t ans[4], lat[4], latn = b->lat_n;
	memcpy(ans, b->async_ns, sizeof ans);
	memcpy(lat, b->lat_ns, sizeof lat);
	unsigned async_running = b->ntickets;
	struct runq rq; /* every device's queue counts, summed (no node of it is used) */
	runq_init(&rq);
	for (unsigned i = 0; i < b->ndevs; i++)
		for (int c = 0; c < RUNQ_NCLASSES; c++) {
			const struct runq *q = &b->devs[i].queue;
			rq.queued[c] += q->queued[c];
			rq.started[c] += q->started[c];
			rq.wait_ns[c] += q->wait_ns[c];
			if (q->wait_max_ns[c] > rq.wait_max_ns[c])
				rq.wait_max_ns[c] = q->wait_max_ns[c];
		}
	uint64_t async_words = b->async_words, async_released = b->async_released,
	         async_timeouts = b->async_timeouts;
	bool words_ok = b->base.async_words;
	double canary_err = 0;
	for (unsigned i = 0; i < b->ndevs; i++) {
		canary_runs += b->devs[i].canary_runs;
		canary_failed += b->devs[i].canary_failed;
		if (b->devs[i].canary_err > canary_err)
			canary_err = b->devs[i].canary_err;
	}
	pthread_mutex_unlock(&b->mu);
	uint64_t now = fa_now_ns(), canary_age = 0;
	for (unsigned i = 0; i < b->ndevs; i++) {
		uint64_t t = atomic_load(&b->devs[i].canary_ok_ns);
		if (now > t && now - t > canary_age)
			canary_age = now - t;
	}
	gpu_uuid_text(d->uuid, uuid);
	struct fa_gpu_cache_stats cs;
	fa_gpu_cache_stats(d->g, &cs);
	int n = snprintf(buf, cap,
	         "# gpu\ngpu_devices:%u\ngpu_name:%s\ngpu_uuid:%s\ngpu_sm:%d\ngpu_smem_optin:%zu\n"
	         "gpu_faulted:%d\ngpu_fwd_ok:%" PRIu64 "\ngpu_fwd_failed:%" PRIu64
	         "\ngpu_host_h2d_bytes:%" PRIu64 "\ngpu_host_d2h_bytes:%" PRIu64 "\n",
	         b->ndevs, fa_gpu_name(d->g), uuid, fa_gpu_sm(d->g), fa_gpu_smem_optin(d->g),
	         fault_marked(&b->base) ? 1 : 0, ok, failed, h2d, d2h);
	if (n < 0 || (size_t)n >= cap)
		return;
	int m = snprintf(buf + n, cap - (size_t)n,
	         "gpu_compile_threads:%u\ngpu_compile_waiting_jobs:%u\ngpu_compile_waiting_kernels:%u"
	         "\ngpu_compiles:%" PRIu64 "\ngpu_compiles_failed:%" PRIu64
	         "\ngpu_compile_jobs_waited:%" PRIu64 "\n",
	         b->ncompile, waiting_jobs, waiting_kernels, compiles, compiles_failed, compile_jobs);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	m = snprintf(buf + n, cap - (size_t)n,
	             "gpu_inline_jobs:%" PRIu64 "\ngpu_inline_us_total:%" PRIu64
	             "\ngpu_worker_jobs:%" PRIu64 "\ngpu_batches:%" PRIu64
	             "\ngpu_worker_us_to_pick:%" PRIu64
	             "\ngpu_worker_us_to_done:%" PRIu64 "\ngpu_worker_us_to_loop:%" PRIu64
	             "\ngpu_async_enqueued:%" PRIu64 "\ngpu_async_running:%u\ngpu_async_host_us_wait:%"
	             PRIu64 "\ngpu_async_host_us_launch:%" PRIu64 "\ngpu_async_host_us_record:%" PRIu64
	             "\ngpu_async_host_us_hostfn:%" PRIu64 "\ngpu_canary_runs:%" PRIu64
	             "\ngpu_canary_failed:%" PRIu64 "\ngpu_canary_age_ms:%" PRIu64
	             "\ngpu_canary_worst_err:%.3g\n",
	             inl, lat[3] / 1000, latn, batches, lat[0] / 1000, lat[1] / 1000, lat[2] / 1000,
	             async_enq, async_running, ans[0] / 1000, ans[1] / 1000, ans[2] / 1000,
	             ans[3] / 1000, canary_runs, canary_failed, canary_age / 1000000,
	             canary_err);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	/* The asynchronous mode's completion words (gpu_async.c). */
	m = snprintf(buf + n, cap - (size_t)n,
	             "gpu_async_words:%d\ngpu_async_words_calls:%" PRIu64
	             "\ngpu_async_words_released:%" PRIu64 "\ngpu_async_words_timeouts:%" PRIu64
	             "\n",
	             words_ok ? 1 : 0, async_words, async_released, async_timeouts);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	/* Each device's GPU time and idle gaps (gpu_timing.c); GPU 0 without a number. */
	for (unsigned i = 0; i < b->ndevs; i++) {
		char pre[16];
		snprintf(pre, sizeof pre, i == 0 ? "gpu_" : "gpu%u_", i);
		pthread_mutex_lock(&b->mu);
		struct gpu_timing tm = b->devs[i].tm;
		pthread_mutex_unlock(&b->mu);
		m = snprintf(buf + n, cap - (size_t)n,
		             "%sbusy_us:%" PRIu64 "\n%stimed_jobs:%" PRIu64 "\n%sgap_short_us:%" PRIu64
		             "\n%sgaps_short:%" PRIu64 "\n%sgap_short_max_us:%" PRIu64
		             "\n%sgap_long_us:%" PRIu64 "\n%sgaps_long:%" PRIu64 "\n",
		             pre, tm.busy_ns / 1000, pre, tm.jobs, pre, tm.gap_short_ns / 1000, pre,
		             tm.gaps_short, pre, tm.gap_short_max_ns / 1000, pre,
		             tm.gap_long_ns / 1000, pre, tm.gaps_long);
		if (m < 0 || (size_t)m >= cap - (size_t)n)
			return;
		n += m;
		/* issue 12: the launch calls' host time, the prewakes, the asynchronous streams */
		pthread_mutex_lock(&b->mu);
		uint64_t pw = b->devs[i].prewakes, pwl = b->devs[i].prewakes_late;
		pthread_mutex_unlock(&b->mu);
		m = snprintf(buf + n, cap - (size_t)n,
		             "%senqueue_host_us:%" PRIu64 "\n%senqueues:%" PRIu64
		             "\n%sprewakes:%" PRIu64 "\n%sprewakes_late:%" PRIu64
		             "\n%sasync_busy_us:%" PRIu64 "\n%sasync_timed_jobs:%" PRIu64
		             "\n%sasync_gap_us:%" PRIu64 "\n%sasync_gaps:%" PRIu64
		             "\n%sasync_gap_max_us:%" PRIu64 "\n%sdetect_us:%" PRIu64
		             "\n%sdetects:%" PRIu64 "\n",
		             pre, tm.enq_ns / 1000, pre, tm.enq_jobs, pre, pw, pre, pwl, pre,
		             tm.async_busy_ns / 1000, pre, tm.async_jobs, pre, tm.async_gap_ns / 1000,
		             pre, tm.async_gaps, pre, tm.async_gap_max_ns / 1000, pre,
		             tm.detect_ns / 1000, pre, tm.detects);
		if (m < 0 || (size_t)m >= cap - (size_t)n)
			return;
		n += m;
	}
	m = snprintf(buf + n, cap - (size_t)n, "gpu_prewake_us:%" PRIu64 "\n",
	             b->prewake_ns / 1000);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	for (unsigned i = 1; i < b->ndevs; i++) { /* GPU 0 is described above */
		char u[48];
		gpu_uuid_text(b->devs[i].uuid, u);
		m = snprintf(buf + n, cap - (size_t)n, "gpu%u_name:%s\ngpu%u_uuid:%s\n", i,
		             fa_gpu_name(b->devs[i].g), i, u);
		if (m < 0 || (size_t)m >= cap - (size_t)n)
			return;
		n += m;
	}
	struct fa_tune_stats ts;
	memset(&ts, 0, sizeof ts);
	if (b->tune != NULL)
		fa_tune_table_stats(b->tune, &ts);
	m = snprintf(buf + n, cap - (size_t)n,
	             "# tuning\ntune_mode:%s\ntune_table:%s\ntune_entries:%d\ntune_loaded:%d"
	             "\ntune_corrupt:%d\ntune_stale:%d\ntune_hits:%" PRIu64 "\ntune_misses:%" PRIu64
	             "\ntune_unfit:%" PRIu64 "\ntune_tuned:%" PRIu64 "\ntune_failed:%" PRIu64
	             "\ntune_active:%d\n",
	             b->tune_idle ? "idle" : "off",
	             b->tune == NULL ? "none" : fa_tune_table_path(b->tune)[0] ? fa_tune_table_path(b->tune) : "memory",
	             ts.entries, ts.loaded, ts.corrupt, ts.stale ? 1 : 0, ts.hits, ts.misses,
	             ts.unfit, tuned, tune_failed, tuning ? 1 : 0);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	m = snprintf(buf + n, cap - (size_t)n,
	         "# kernels\nkernels_loaded:%" PRIu64 "\nkernels_mem_hits:%" PRIu64
	         "\nkernels_disk_loads:%" PRIu64 "\nkernels_compiled:%" PRIu64
	         "\nkernels_disk_stores:%" PRIu64 "\nkernels_disk_errors:%" PRIu64
	         "\nkernels_compile_ms_total:%.1f\nkernels_compile_ms_last:%.1f\nkernels_compile_last:%s"
	         "\nkernels_disk_cache:%s\n",
	         cs.kernels, cs.mem_hits, cs.disk_loads, cs.compiled, cs.disk_stores, cs.disk_errors,
	         cs.compile_ms_total, cs.compile_ms_last, cs.compile_last,
	         cs.disk_enabled ? cs.disk_dir : "off");
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	n += m;
	/* queue time per priority class, submit to the worker's pick (inline runs never queue) */
	m = snprintf(buf + n, cap - (size_t)n,
	             "gpu_async_gates_released:%" PRIu64 "\ngpu_async_gates_kept:%" PRIu64
	             "\n# scheduler\n", b->gates_released, b->gates_kept);
	if (m < 0 || (size_t)m >= cap - (size_t)n)
		return;
	runq_stats(&rq, buf, cap);
}
