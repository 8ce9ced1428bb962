/* gpu_exec_bwd.c - one backward job on a stream: fa_gpu_attn_bwd (kernels/fa_gpu_bwd.h) on the
 * job's device pointers, or, for host memory, on slices of the worker's scratch with the copies
 * in and out around it, as gpu_exec.c does for the forward. The asynchronous mode (gpu_async.c)
 * launches through gpu_launch_bwd on device pointers only. */
#include "gpu_int.h"

#include <stdio.h>
#include <string.h>

#include "fa_check.h"
#include "fa_gpu_bwd.h"

/* The kernels' flags for the wire's. */
static unsigned gpu_bwd_flags(const struct backend_job *job)
{
	return (job->bwd.flags & FA_PROTO_BWD_DETERMINISTIC) ? FA_GPU_BWD_DETERMINISTIC : 0;
}

/* Launch the backward on `stream` with the pointers given (FA_BWD_* order); extra: more of
 * fa_gpu_attn_bwd's flags (FA_GPU_BWD_PREPARE). */
static fa_status gpu_bwd_launch_at(struct gpu_dev *d, struct backend_job *job,
                                   const fa_cu_ptr dp[FA_BWD_NTENSORS], fa_cu_stream stream,
                                   unsigned extra)
{
	struct fa_gpu_bwd_ptrs p = {
		.q = (CUdeviceptr)dp[FA_BWD_Q],    .k = (CUdeviceptr)dp[FA_BWD_K],
		.v = (CUdeviceptr)dp[FA_BWD_V],    .o = (CUdeviceptr)dp[FA_BWD_O],
		.dout = (CUdeviceptr)dp[FA_BWD_DO], .lse = (CUdeviceptr)dp[FA_BWD_LSE],
		.dq = (CUdeviceptr)dp[FA_BWD_DQ],  .dk = (CUdeviceptr)dp[FA_BWD_DK],
		.dv = (CUdeviceptr)dp[FA_BWD_DV],
	};
	return fa_gpu_attn_bwd(d->g, &job->bwd.desc, &p, gpu_bwd_flags(job) | extra,
	                       (CUstream)stream, job->detail, sizeof job->detail);
}

/* The job's pointers by FA_BWD_*. */
static void gpu_bwd_ptrs(const struct backend_job *job, const void *ptr[FA_BWD_NTENSORS])
{
	ptr[FA_BWD_Q] = job->q;
	ptr[FA_BWD_K] = job->k;
	ptr[FA_BWD_V] = job->v;
	ptr[FA_BWD_O] = job->o;
	ptr[FA_BWD_LSE] = job->lse;
	ptr[FA_BWD_DO] = job->bwd.dout;
	ptr[FA_BWD_DQ] = job->bwd.dq;
	ptr[FA_BWD_DK] = job->bwd.dk;
	ptr[FA_BWD_DV] = job->bwd.dv;
}

/* An asynchronous backward job's device pointers (every tensor on the device). */
static void gpu_bwd_device_ptrs(const struct backend_job *job, fa_cu_ptr dp[FA_BWD_NTENSORS])
{
	const void *ptr[FA_BWD_NTENSORS];

	gpu_bwd_ptrs(job, ptr);
	for (int i = 0; i < FA_BWD_NTENSORS; i++)
		dp[i] = (fa_cu_ptr)(uintptr_t)ptr[i];
}

/* Launch an asynchronous backward job (every tensor on the device); see gpu_int.h. */
fa_status gpu_launch_bwd(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream)
{
	fa_cu_ptr dp[FA_BWD_NTENSORS];

	gpu_bwd_device_ptrs(job, dp);
	return gpu_bwd_launch_at(d, job, dp, stream, 0);
}

/* See gpu_int.h. */
fa_status gpu_prepare_bwd(struct gpu_dev *d, struct backend_job *job)
{
	fa_cu_ptr dp[FA_BWD_NTENSORS];

	gpu_bwd_device_ptrs(job, dp);
	return gpu_bwd_launch_at(d, job, dp, NULL, FA_GPU_BWD_PREPARE);
}

/* Enqueue one synchronous backward job; see gpu_int.h. */
void gpu_enqueue_bwd(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream,
                     fa_cu_event ev, bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	const struct fa_attn_bwd_desc *bd = &job->bwd.desc;
	const struct fa_attn_fwd_desc *ds = &bd->fwd;
	size_t es = fa_dtype_size(ds->dtype);
	const void *ptr[FA_BWD_NTENSORS];
	const int64_t qshape[4] = {ds->B, ds->Sq, ds->Hq, ds->D};
	const int64_t kshape[4] = {ds->B, ds->Sk, ds->Hkv, ds->D};
	const int64_t lshape[4] = {ds->B, ds->Hq, ds->Sq, 1};
	const int64_t *shape[FA_BWD_NTENSORS] = {
		[FA_BWD_Q] = qshape,  [FA_BWD_K] = kshape,  [FA_BWD_V] = kshape,
		[FA_BWD_O] = qshape,  [FA_BWD_LSE] = lshape, [FA_BWD_DO] = qshape,
		[FA_BWD_DQ] = qshape, [FA_BWD_DK] = kshape, [FA_BWD_DV] = kshape,
	};
	const int64_t *st3[FA_BWD_NTENSORS] = {
		[FA_BWD_Q] = ds->q_stride,   [FA_BWD_K] = ds->k_stride,   [FA_BWD_V] = ds->v_stride,
		[FA_BWD_O] = ds->o_stride,   [FA_BWD_LSE] = ds->lse_stride, [FA_BWD_DO] = bd->do_stride,
		[FA_BWD_DQ] = bd->dq_stride, [FA_BWD_DK] = bd->dk_stride, [FA_BWD_DV] = bd->dv_stride,
	};
	struct gpu_stage sg = {0};
	const char *what = NULL;
	fa_cu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	gpu_bwd_ptrs(job, ptr);
	/* the gradients are copied in only when strided with holes, and out after */
	for (int i = 0; i < FA_BWD_NTENSORS; i++)
		gpu_stage_add(&sg, ptr[i], job->on_device[i],
		              fa_bwd_is_output(i) ? GPU_STAGE_OUT : GPU_STAGE_IN, shape[i], st3[i],
		              i == FA_BWD_LSE ? sizeof(float) : es);
	if ((r = gpu_stage_in(d, &sg, stream, &what)) != 0) {
		job->status = gpu_job_cuerr(d, job, r, what, sticky);
		goto sync;
	}
	if ((st = gpu_bwd_launch_at(d, job, sg.dp, stream, 0)) != FA_OK) {
		job->status = st;
		goto sync;
	}
	if ((r = gpu_stage_out(&sg, stream, &what)) != 0)
		job->status = gpu_job_cuerr(d, job, r, what, sticky);
sync:
	if ((r = cu->EventRecord(ev, stream)) != 0 && job->status == FA_OK)
		job->status = gpu_job_cuerr(d, job, r, "recording the job's event", sticky);
	job->bytes_in = sg.bytes_in;
	job->bytes_out = sg.bytes_out;
}
