/* gpu_exec.c - one synchronous job on a stream: its tensors staged (gpu_stage.c: host memory
 * through the worker's scratch, Q, K, V in and O, lse back, two PCIe transfers per request at
 * about 50 GB/s pinned on top of the kernel), the kernel or a split job's launches, and what the
 * device said when its event completed. */
#include "gpu_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* A failed driver call inside a job: FA_EDEVICE with the driver's text; *sticky when the context
 * is lost. Out of device memory is FA_ENOMEM. */
fa_status gpu_job_cuerr(struct gpu_dev *d, struct backend_job *job, fa_cu_res r,
                        const char *what, bool *sticky)
{
	*sticky = fa_cu_sticky(r);
	snprintf(job->detail, sizeof job->detail, "%s on GPU %d: CUDA error %d (%s)%s", what,
	         d->ordinal, r, fa_cu_errstr(r),
	         *sticky ? "; the context is lost, the daemon restarts" : "");
	return r == 2 ? FA_ENOMEM : FA_EDEVICE;
}

/* The kernel(s) of a job: one launch, or the launches gpu_split.c planned, at most two in
 * flight, with a look at job->stop before each one after the first (the stream is the
 * worker's: waiting for a launch here delays nobody else's batch). FA_OK, or the job's status
 * (the stop's status when it was stopped; its detail says how far it got). */
static fa_status gpu_launch(struct gpu_dev *d, struct backend_job *job, const fa_cu_ptr dp[5],
                            bool has_lse, fa_cu_stream stream, bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	struct fa_attn_fwd_desc sub;
	uint64_t off[5];
	fa_cu_res r;

	if (job->piece_total <= 1)
		return fa_gpu_attn_fwd(d->g, &job->desc, dp[0], dp[1], dp[2], dp[3],
		                       has_lse ? dp[4] : 0, (CUstream)stream, job->detail,
		                       sizeof job->detail);
	for (int i = 0; i < 2; i++)
		if (d->piece_ev[i] == NULL &&
		    (r = cu->EventCreate(&d->piece_ev[i], FA_CU_EVENT_DISABLE_TIMING)) != 0) {
			d->piece_ev[i] = NULL;
			return gpu_job_cuerr(d, job, r, "creating an event for a split request",
			                     sticky);
		}
	for (int64_t k = 0; k < job->piece_total; k++) {
		if (k >= 2 && (r = cu->EventSynchronize(d->piece_ev[k % 2])) != 0)
			return gpu_job_cuerr(d, job, r, "running attention", sticky);
		if (k >= 1 && atomic_load(&job->stop)) {
			snprintf(job->detail, sizeof job->detail,
			         "stopped after %" PRId64 " of its %" PRId64 " launches: its session "
			         "closed, or the daemon's drain deadline passed",
			         k, job->piece_total);
			return job->stop_status;
		}
		gpu_split_piece(job, k, &sub, off);
		fa_status st = fa_gpu_attn_fwd(d->g, &sub, dp[0] + off[0], dp[1] + off[1],
		                               dp[2] + off[2], dp[3] + off[3],
		                               has_lse ? dp[4] + off[4] : 0, (CUstream)stream,
		                               job->detail, sizeof job->detail);
		if (st != FA_OK)
			return st;
		if ((r = cu->EventRecord(d->piece_ev[k % 2], stream)) != 0)
			return gpu_job_cuerr(d, job, r, "recording a split request's event", sticky);
	}
	return FA_OK;
}

/* Enqueue one synchronous job on `stream` (host tensors: copies in, the kernel, copies out) and
 * record ev after it, also after a failure (copies may be queued). Sets job->status, detail and
 * *sticky on a failure to enqueue; gpu_complete waits. */
void gpu_enqueue(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream, fa_cu_event ev,
                 bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	const struct fa_attn_fwd_desc *ds = &job->desc;
	const size_t es = fa_dtype_size(ds->dtype);
	const int64_t qshape[4] = {ds->B, ds->Sq, ds->Hq, ds->D};
	const int64_t kshape[4] = {ds->B, ds->Sk, ds->Hkv, ds->D};
	const int64_t lshape[4] = {ds->B, ds->Hq, ds->Sq, 1};
	const bool has_lse = job->lse != NULL;
	struct gpu_stage sg = {0};
	const char *what = NULL;
	fa_cu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	gpu_stage_add(&sg, job->q, job->on_device[0], GPU_STAGE_IN, qshape, ds->q_stride, es);
	gpu_stage_add(&sg, job->k, job->on_device[1], GPU_STAGE_IN, kshape, ds->k_stride, es);
	gpu_stage_add(&sg, job->v, job->on_device[2], GPU_STAGE_IN, kshape, ds->v_stride, es);
	gpu_stage_add(&sg, job->o, job->on_device[3], GPU_STAGE_OUT, qshape, ds->o_stride, es);
	if (has_lse)
		gpu_stage_add(&sg, job->lse, job->on_device[4], GPU_STAGE_OUT, lshape,
		              ds->lse_stride, sizeof(float));
	if ((r = gpu_stage_in(d, &sg, stream, &what)) != 0) {
		job->status = gpu_job_cuerr(d, job, r, what, sticky);
		goto sync;
	}
	if ((st = gpu_launch(d, job, sg.dp, has_lse, stream, sticky)) != FA_OK) {
		job->status = st;
		goto sync;
	}
	if ((r = gpu_stage_out(&sg, stream, &what)) != 0)
		job->status = gpu_job_cuerr(d, job, r, what, sticky);
sync:
	if (ev != NULL && (r = cu->EventRecord(ev, stream)) != 0 && job->status == FA_OK)
		job->status = gpu_job_cuerr(d, job, r, "recording the job's event", sticky);
	job->bytes_in = sg.bytes_in;
	job->bytes_out = sg.bytes_out;
}

/* Wait for a job gpu_enqueue enqueued (its event) and classify what the device says. */
void gpu_complete(struct gpu_dev *d, struct backend_job *job, fa_cu_event ev, fa_cu_stream stream,
                  bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	fa_cu_res r;

	/* A fault of the kernel shows here (errors of earlier asynchronous work come back from
	 * the next synchronising call). */
	r = ev != NULL ? cu->EventSynchronize(ev) : cu->StreamSynchronize(stream);
	if (r != 0 && job->status == FA_OK)
		job->status = gpu_job_cuerr(d, job, r, "running attention", sticky);
	else if (r != 0 && fa_cu_sticky(r))
		*sticky = true;
	/* A launch failure reported by fa_gpu as FA_EDEVICE: ask the context whether it is
	 * lost (sticky errors come back from every call). */
	if (job->status == FA_EDEVICE && !*sticky && (r = cu->CtxSynchronize()) != 0 &&
	    fa_cu_sticky(r))
		*sticky = true;
	pthread_mutex_lock(&d->b->mu);
	d->b->h2d_bytes += job->bytes_in;
	if (job->status == FA_OK)
		d->b->d2h_bytes += job->bytes_out;
	pthread_mutex_unlock(&d->b->mu);
}
