/* gpu_estimate.c - how long a synchronous job will keep its GPU busy, from what the device
 * measured before (gpu_timing.c's GPU time of each worker job): the last time of the same shape,
 * else the device's time per FLOP over large jobs. The worker uses it for the prewake
 * (gpu_worker.c, --prewake-us): shortly before a job's expected end the loop starts polling and
 * the job's ring client is woken, so the hand-back, the reply and the client's next call meet
 * awake threads instead of three sleeping ones.
 *
 * Why the same shape first: a serving daemon sees the same shapes again and again (a model's
 * layers, a benchmark's requests), and a kernel's time for one shape varies by 1-2% between
 * runs, while its time per FLOP varies several-fold between shapes (decode is memory-bound, a
 * prefill compute-bound). The rate serves shapes never seen; below GPU_LOOP_SPIN_MAX_FLOP it
 * is not used (the loop polls during such jobs anyway). Inference jobs are never estimated:
 * their work depends on their index tables, not on the descriptor.
 *
 * Pure arithmetic, no CUDA, no lock: one estimator per device, its worker's own.
 * tests/daemon/test_gpu_queue.c checks it without a GPU. */
#include "gpu_int.h"

#include <string.h>

/* A job's shape: the descriptor's fields a kernel's time (and its tile) depends on, and whether
 * host memory is staged (ns and used zero). */
static void gpu_shape_key(const struct backend_job *job, struct gpu_est_entry *k)
{
	const struct fa_attn_fwd_desc *d = &job->desc;

	memset(k, 0, sizeof *k);
	k->dtype = (int)d->dtype;
	k->precision = (int)d->precision;
	k->mask = (int)d->mask;
	k->window = d->window;
	k->bwd = job->is_bwd;
	k->host = gpu_job_stages_host(job);
	k->dims[0] = d->B;
	k->dims[1] = d->Hq;
	k->dims[2] = d->Hkv;
	k->dims[3] = d->Sq;
	k->dims[4] = d->Sk;
	k->dims[5] = d->D;
	k->dims[6] = d->window ? d->window_left : 0;
	k->dims[7] = d->window ? d->window_right : 0;
	k->softcap = d->softcap;
}

static bool gpu_shape_same(const struct gpu_est_entry *a, const struct gpu_est_entry *b)
{
	return a->dtype == b->dtype && a->precision == b->precision && a->mask == b->mask &&
	       a->window == b->window && a->bwd == b->bwd && a->host == b->host &&
	       memcmp(a->dims, b->dims, sizeof a->dims) == 0 && a->softcap == b->softcap;
}

void gpu_estimate_note(struct gpu_estimator *e, const struct backend_job *job, uint64_t gpu_ns)
{
	struct gpu_est_entry k;
	int slot = -1;

	if (job->infer != NULL || gpu_ns == 0)
		return;
	gpu_shape_key(job, &k);
	for (int i = 0; i < GPU_EST_ENTRIES && slot < 0; i++)
		if (e->e[i].ns != 0 && gpu_shape_same(&e->e[i], &k))
			slot = i;
	if (slot < 0) { /* a free entry, else the least recently used */
		slot = 0;
		for (int i = 1; i < GPU_EST_ENTRIES; i++)
			if (e->e[i].used < e->e[slot].used)
				slot = i;
	}
	k.ns = gpu_ns;
	k.used = ++e->clock;
	e->e[slot] = k;
	double flop = gpu_job_flop(job);
	if (flop >= GPU_LOOP_SPIN_MAX_FLOP) {
		double r = (double)gpu_ns / flop;
		/* an average that follows the device's clocks within a few jobs */
		e->ns_per_flop = e->ns_per_flop > 0 ? 0.75 * e->ns_per_flop + 0.25 * r : r;
	}
}

uint64_t gpu_estimate_ns(struct gpu_estimator *e, const struct backend_job *job)
{
	struct gpu_est_entry k;

	if (job->infer != NULL)
		return 0;
	gpu_shape_key(job, &k);
	for (int i = 0; i < GPU_EST_ENTRIES; i++)
		if (e->e[i].ns != 0 && gpu_shape_same(&e->e[i], &k)) {
			e->e[i].used = ++e->clock;
			return e->e[i].ns;
		}
	double flop = gpu_job_flop(job);
	if (e->ns_per_flop > 0 && flop >= GPU_LOOP_SPIN_MAX_FLOP)
		return (uint64_t)(e->ns_per_flop * flop);
	return 0;
}
