/* gpu_exec.c - one synchronous job on a stream: where each tensor lives on the device (its own
 * address, or a slice of the worker's scratch for host memory), the copies in, the kernel, the
 * copies out, and what the device said when its event completed.
 *
 * Host shm regions are pinned at registration (gpu_region.c); each job copies Q, K, V (and O,
 * lse when strided, to keep the bytes between their elements) into device scratch, runs, and
 * copies O and lse back. Simple and correct; costs two PCIe transfers per request (about
 * 50 GB/s pinned) on top of the kernel. */
#include "gpu_int.h"

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

/* Make the scratch at least `need` bytes (the stream is idle between jobs); see gpu_int.h. */
fa_cu_res gpu_scratch_reserve(struct gpu_dev *d, size_t need)
{
	const struct fa_cu_api *cu = fa_cu;
	size_t size = d->scratch_size > 0 ? d->scratch_size : GPU_SCRATCH_MIN;
	fa_cu_res r;

	if (need <= d->scratch_size)
		return 0;
	while (size < need)
		size += size / 2;
	if (d->scratch != 0)
		cu->MemFree(d->scratch);
	d->scratch = 0;
	d->scratch_size = 0;
	if ((r = cu->MemAlloc(&d->scratch, size)) != 0) {
		d->scratch = 0;
		return r;
	}
	d->scratch_size = size;
	return 0;
}

/* Enqueue one synchronous job on `stream` (host tensors: copies in, the kernel, copies out) and
 * record ev after it, also after a failure (copies may be queued). Sets job->status, detail and
 * *sticky on a failure to enqueue; gpu_complete waits. */
void gpu_enqueue(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream, fa_cu_event ev,
                 bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	const struct fa_attn_fwd_desc *ds = &job->desc;
	size_t es = fa_dtype_size(ds->dtype);
	const void *ptr[5] = {job->q, job->k, job->v, job->o, job->lse};
	int n = job->lse != NULL ? 5 : 4;
	int64_t shape[5][4] = {{ds->B, ds->Sq, ds->Hq, ds->D},
	                       {ds->B, ds->Sk, ds->Hkv, ds->D},
	                       {ds->B, ds->Sk, ds->Hkv, ds->D},
	                       {ds->B, ds->Sq, ds->Hq, ds->D},
	                       {ds->B, ds->Hq, ds->Sq, 1}};
	int64_t stride[5][4];
	const int64_t *st3[5] = {ds->q_stride, ds->k_stride, ds->v_stride, ds->o_stride,
	                         ds->lse_stride};
	uint64_t ext[5] = {0}, off[5] = {0}, total = 0;
	fa_cu_ptr dp[5] = {0};
	size_t bytes_in = 0, bytes_out = 0;
	fa_cu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	/* Where each tensor is on the device: its own address, or a slice of the scratch. */
	for (int i = 0; i < n; i++) {
		memcpy(stride[i], st3[i], 3 * sizeof(int64_t));
		stride[i][3] = 1;
		if (job->on_device[i]) {
			dp[i] = (fa_cu_ptr)(uintptr_t)ptr[i];
			continue;
		}
		fa_tensor_extent(4, shape[i], stride[i], i == 4 ? sizeof(float) : es, NULL,
		                 &ext[i]); /* validated: cannot overflow */
		off[i] = total;
		total += (ext[i] + GPU_SCRATCH_ALIGN - 1) / GPU_SCRATCH_ALIGN * GPU_SCRATCH_ALIGN;
	}
	if (total > 0) {
		if ((r = gpu_scratch_reserve(d, (size_t)total)) != 0) {
			job->status = gpu_job_cuerr(d, job, r, "allocating device scratch for host "
			                            "buffers", sticky);
			return;
		}
		for (int i = 0; i < n; i++)
			if (!job->on_device[i])
				dp[i] = d->scratch + off[i];
	}
	/* Inputs in; outputs too when their extent has holes (strided), so the copy back leaves
	 * the bytes between their elements as they were. */
	for (int i = 0; i < n; i++) {
		if (job->on_device[i])
			continue;
		bool output = i >= 3;
		uint64_t dense = i == 4 ? (uint64_t)(ds->B * ds->Hq * ds->Sq) * sizeof(float)
		                        : (uint64_t)(shape[i][0] * shape[i][1] * shape[i][2] *
		                                     shape[i][3]) * es;
		if (output && ext[i] == dense)
			continue;
		if ((r = cu->MemcpyHtoDAsync(dp[i], ptr[i], ext[i], stream)) != 0) {
			job->status = gpu_job_cuerr(d, job, r, "copying a host tensor to the GPU",
			                            sticky);
			goto sync;
		}
		bytes_in += ext[i];
	}
	st = fa_gpu_attn_fwd(d->g, ds, dp[0], dp[1], dp[2], dp[3], n == 5 ? dp[4] : 0,
	                     (CUstream)stream, job->detail, sizeof job->detail);
	if (st != FA_OK) {
		job->status = st;
		goto sync;
	}
	for (int i = 3; i < n; i++) {
		if (job->on_device[i])
			continue;
		if ((r = cu->MemcpyDtoHAsync((void *)(uintptr_t)ptr[i], dp[i], ext[i],
		                             stream)) != 0) {
			job->status = gpu_job_cuerr(d, job, r, "copying a result to host memory",
			                            sticky);
			goto sync;
		}
		bytes_out += ext[i];
	}
sync:
	if ((r = cu->EventRecord(ev, stream)) != 0 && job->status == FA_OK)
		job->status = gpu_job_cuerr(d, job, r, "recording the job's event", sticky);
	job->bytes_in = bytes_in;
	job->bytes_out = bytes_out;
}

/* Wait for a job gpu_enqueue enqueued (its event) and classify what the device says. */
void gpu_complete(struct gpu_dev *d, struct backend_job *job, fa_cu_event ev, bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	fa_cu_res r;

	/* A fault of the kernel shows here (errors of earlier asynchronous work come back from
	 * the next synchronising call). */
	r = cu->EventSynchronize(ev);
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
