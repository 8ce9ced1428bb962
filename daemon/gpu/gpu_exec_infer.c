/* gpu_exec_infer.c - one ATTN_VARLEN or ATTN_KVCACHE job on a stream: the index snapshot, then
 * fa_gpu_attn_infer (kernels/fa_gpu_infer.h) on the job's device pointers, or for host memory
 * on slices of the worker's scratch with the copies around it, as gpu_exec.c does for the
 * forward.
 *
 * The snapshot (backend_infer.h says why): each index tensor's extent is copied into memory the
 * daemon owns (device tables by cuMemcpyDtoH on the job's stream; host tables by DMA through a
 * device buffer, so no thread of the daemon touches the client's shared memory, which can fault
 * when the client shrinks it), checked there by backend_infer_prepare (fa_attn_infer_check: a
 * bad entry fails the job with the entry named before anything is written or launched), and
 * the checked dense copy is uploaded to a stream-ordered buffer of the daemon's that the kernel
 * reads, freed in stream order after it. The kernel never reads the client's tables.
 *
 * Outputs in host memory are copied in before the kernel (whole extents, not only when strided
 * as the forward's): the kernel writes only the rows of sequences, and the copy back must leave
 * the other rows as the client had them.
 */
#include "gpu_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_infer.h"
#include "fa_check.h"
#include "fa_gpu_infer.h"

/* The most bytes the index tensors' extents may span together (their strides can spread a few
 * entries far apart; the entries themselves are bounded by validation). */
#define GPU_INFER_MAX_INDEX_BYTES (256u << 20)

/* The shapes of q (and o), k (and v) and lse of an inference job (fa_attn_infer.h's layouts). */
static void infer_shapes(const struct fa_attn_infer_desc *d, int64_t shape[5][4])
{
	const struct fa_attn_fwd_desc *f = &d->fwd;
	int64_t q0 = d->cu_q ? 1 : f->B, q1 = d->cu_q ? d->total_q : f->Sq, k0, k1;
	switch (d->kv) {
	case FA_KV_PACKED:
		k0 = 1, k1 = d->total_k;
		break;
	case FA_KV_PAGED:
		k0 = d->pages, k1 = d->page_size;
		break;
	default:
		k0 = f->B, k1 = d->cache_rows;
		break;
	}
	const int64_t s[5][4] = {{q0, q1, f->Hq, f->D},
	                         {k0, k1, f->Hkv, f->D},
	                         {k0, k1, f->Hkv, f->D},
	                         {q0, q1, f->Hq, f->D},
	                         {q0, f->Hq, q1, 1}};
	memcpy(shape, s, sizeof s);
}

/* Elements an index tensor spans from its first entry (strides >= 0: validation). */
static int64_t index_span(const struct backend_index_src *s)
{
	return (s->n0 - 1) * s->s0 + (s->n1 - 1) * s->s1 + 1;
}

/* Grow *pinned to hold `total` bytes, in 64 KiB steps (a cuMemHostAlloc costs far more than
 * the copy). FA_OK, or the job's status. */
static fa_status snap_grow(struct gpu_dev *d, struct backend_job *job,
                          struct gpu_snap_host *pinned, uint64_t total, bool *sticky)
{
	size_t want = ((size_t)(total > 0 ? total : 4) + 65535) & ~(size_t)65535;
	if (pinned->cap >= want)
		return FA_OK;
	void *p = NULL;
	fa_cu_res r = fa_cu->MemHostAlloc(&p, want, 0);
	if (r != 0)
		return gpu_job_cuerr(d, job, r, "allocating pinned memory for the index tensors",
		                     sticky);
	if (pinned->p != NULL)
		fa_cu->MemFreeHost(pinned->p);
	pinned->p = p;
	pinned->cap = want;
	return FA_OK;
}

/* The bytes job's index tables span (their strides included), with each one's offset in the
 * snapshot when at is not NULL and the part in host memory in *host_bytes. */
static uint64_t snap_bytes(const struct backend_job *job, uint64_t *at, uint64_t *host_bytes)
{
	const struct backend_infer *bi = job->infer;
	uint64_t total = 0, hb = 0;

	for (int i = 0; i < INFER_NINDEX; i++) {
		if (bi->src[i].base == NULL)
			continue;
		if (at != NULL)
			at[i] = total;
		total += (uint64_t)index_span(&bi->src[i]) * 4;
		if (!job->on_device[FA_FWD_NTENSORS + i])
			hb += (uint64_t)index_span(&bi->src[i]) * 4;
	}
	if (host_bytes != NULL)
		*host_bytes = hb;
	return total;
}

/* See gpu_int.h. */
fa_status gpu_snap_reserve(struct gpu_dev *d, struct backend_job *job,
                           struct gpu_snap_host *pinned, bool *sticky)
{
	uint64_t total = snap_bytes(job, NULL, NULL);
	if (total > GPU_INFER_MAX_INDEX_BYTES)
		return FA_OK; /* infer_snapshot refuses it with its text */
	return snap_grow(d, job, pinned, total, sticky);
}

/* Copy the index tensors into host memory of the daemon's (*host, the caller frees), check them
 * there (backend_infer_prepare: the checked dense copy is bi->copy), and upload that copy to a
 * stream-ordered device buffer (*dev; ix points into it). FA_OK, or the job's status with its
 * detail (a bad entry: backend_infer_prepare's text). */
static fa_status infer_snapshot(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream,
                                int32_t **host, fa_cu_ptr *dev, struct fa_gpu_infer_index *ix,
                                bool *sticky, gpu_snapshot_wait_fn wait, void *wait_arg,
                                struct gpu_snap_host *pinned)
{
	const struct fa_cu_api *cu = fa_cu;
	struct backend_infer *bi = job->infer;
	uint64_t at[INFER_NINDEX] = {0}, total = 0, host_bytes = 0;
	fa_cu_ptr stage = 0;
	fa_cu_res r;
	fa_status st;

	*host = NULL;
	*dev = 0;
	total = snap_bytes(job, at, &host_bytes);
	if (total > GPU_INFER_MAX_INDEX_BYTES) {
		snprintf(job->detail, sizeof job->detail,
		         "the index tensors span %" PRIu64 " bytes with their strides (at most %u on "
		         "the GPU backend): pass them dense", total, GPU_INFER_MAX_INDEX_BYTES);
		return FA_ENOTSUP;
	}
	int32_t *snap = NULL;
	if (pinned != NULL) {
		if ((st = snap_grow(d, job, pinned, total, sticky)) != FA_OK)
			return st;
		snap = pinned->p;
	} else if ((snap = *host = malloc(total > 0 ? total : 4)) == NULL) {
		snprintf(job->detail, sizeof job->detail,
		         "the daemon ran out of memory copying the index tensors");
		return FA_ENOMEM;
	}
	if (host_bytes > 0 && (r = cu->MemAllocAsync(&stage, host_bytes, stream)) != 0)
		return gpu_job_cuerr(d, job, r, "allocating device memory for the index tensors",
		                     sticky);
	uint64_t soff = 0;
	for (int i = 0; i < INFER_NINDEX; i++) {
		struct backend_index_src *s = &bi->src[i];
		if (s->base == NULL)
			continue;
		uint64_t bytes = (uint64_t)index_span(s) * 4;
		char *dst = (char *)snap + at[i];
		if (job->on_device[FA_FWD_NTENSORS + i]) {
			r = cu->MemcpyDtoHAsync(dst, (fa_cu_ptr)(uintptr_t)s->base, bytes, stream);
		} else {
			/* pinned at registration: the DMA engine reads it, not a CPU thread */
			r = cu->MemcpyHtoDAsync(stage + soff, s->base, bytes, stream);
			if (r == 0)
				r = cu->MemcpyDtoHAsync(dst, stage + soff, bytes, stream);
			soff += bytes;
		}
		if (r != 0) {
			if (stage)
				cu->MemFreeAsync(stage, stream);
			return gpu_job_cuerr(d, job, r, "copying an index tensor", sticky);
		}
	}
	if (stage)
		cu->MemFreeAsync(stage, stream);
	fa_status why = FA_OK;
	if ((r = wait != NULL ? wait(wait_arg, stream, &why) : cu->StreamSynchronize(stream)) != 0)
		return gpu_job_cuerr(d, job, r, "copying the index tensors", sticky);
	if (why != FA_OK) {
		snprintf(job->detail, sizeof job->detail,
		         why == FA_ETIMEDOUT
		             ? "the call's inputs were not marked ready (its completion word "
		               "unwritten) within --async-wait-ms; nothing was launched"
		             : "the session closed before the call's inputs were marked ready; "
		               "nothing was launched");
		return why;
	}
	/* from here on the tables are the daemon's own bytes */
	for (int i = 0; i < INFER_NINDEX; i++)
		if (bi->src[i].base != NULL)
			bi->src[i].base = (const int32_t *)(const void *)((char *)snap + at[i]);
	if ((st = backend_infer_prepare(bi)) != FA_OK) {
		snprintf(job->detail, sizeof job->detail, "%s", bi->detail);
		return st;
	}
	/* the checked copies are one dense allocation: upload it whole */
	size_t dense = 0;
	for (int i = 0; i < INFER_NINDEX; i++)
		if (bi->src[i].base != NULL)
			dense += (size_t)(bi->src[i].n0 * bi->src[i].n1) * 4;
	if ((r = cu->MemAllocAsync(dev, dense > 0 ? dense : 4, stream)) != 0) {
		*dev = 0;
		return gpu_job_cuerr(d, job, r, "allocating device memory for the index tensors",
		                     sticky);
	}
	if (dense > 0 && (r = cu->MemcpyHtoDAsync(*dev, bi->copy, dense, stream)) != 0)
		return gpu_job_cuerr(d, job, r, "uploading the checked index tensors", sticky);
	const struct fa_attn_infer_desc *id = &bi->desc;
#define AT(p) ((p) ? *dev + (fa_cu_ptr)((const int32_t *)(p) - bi->copy) * 4 : 0)
	ix->cu_q = AT(id->cu_q);
	ix->cu_k = AT(id->cu_k);
	ix->seqlens_k = AT(id->seqlens_k);
	ix->page_table = AT(id->page_table);
#undef AT
	return FA_OK;
}

void gpu_enqueue_infer(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream,
                       fa_cu_event ev, bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	struct backend_infer *bi = job->infer;
	const void *ptr[5] = {job->q, job->k, job->v, job->o, job->lse};
	const int n = job->lse != NULL ? 5 : 4;
	int64_t shape[5][4];
	struct gpu_stage sg = {0};
	const char *what = NULL;
	fa_cu_ptr dix = 0;
	struct fa_gpu_infer_index ix = {0};
	int32_t *host = NULL;
	fa_cu_res r;
	fa_status st;

	*sticky = false;
	job->status = FA_OK;
	job->detail[0] = '\0';
	if ((st = infer_snapshot(d, job, stream, &host, &dix, &ix, sticky, NULL, NULL, NULL)) !=
	    FA_OK) {
		job->status = st;
		goto sync;
	}
	/* the descriptor now has the lengths found and the checked tables */
	const struct fa_attn_infer_desc *id = &bi->desc;
	const struct fa_attn_fwd_desc *ds = &id->fwd;
	const size_t es = fa_dtype_size(ds->dtype);
	const int64_t *st3[5] = {ds->q_stride, ds->k_stride, ds->v_stride, ds->o_stride,
	                         ds->lse_stride};
	infer_shapes(id, shape);
	/* every host tensor in, the outputs too (rows outside the sequences stay the client's) */
	for (int i = 0; i < n; i++)
		gpu_stage_add(&sg, ptr[i], job->on_device[i],
		              i < 3 ? GPU_STAGE_IN : GPU_STAGE_OUT_KEEP, shape[i], st3[i],
		              i == 4 ? sizeof(float) : es);
	if ((r = gpu_stage_in(d, &sg, stream, &what)) != 0) {
		job->status = gpu_job_cuerr(d, job, r, what, sticky);
		goto sync;
	}
	st = fa_gpu_attn_infer(d->g, id, &ix, (CUdeviceptr)sg.dp[0], (CUdeviceptr)sg.dp[1],
	                       (CUdeviceptr)sg.dp[2], (CUdeviceptr)sg.dp[3],
	                       n == 5 ? (CUdeviceptr)sg.dp[4] : 0, (CUstream)stream, job->detail,
	                       sizeof job->detail);
	if (st != FA_OK) {
		job->status = st;
		goto sync;
	}
	if ((r = gpu_stage_out(&sg, stream, &what)) != 0)
		job->status = gpu_job_cuerr(d, job, r, what, sticky);
sync:
	if (dix)
		cu->MemFreeAsync(dix, stream); /* after the kernel, in stream order */
	free(host);
	if ((r = cu->EventRecord(ev, stream)) != 0 && job->status == FA_OK)
		job->status = gpu_job_cuerr(d, job, r, "recording the job's event", sticky);
	job->bytes_in = sg.bytes_in;
	job->bytes_out = sg.bytes_out;
}

/* The asynchronous mode's launch (gpu_async.c, the session's thread; every tensor and table in
 * device memory, the stream already behind the client's ready word): the snapshot as the
 * synchronous path's, read in stream order (so a table the caller's stream wrote before the
 * call is what is read), waited for by `wait`, then the kernel. The stream idles between the
 * snapshot's copies and the kernel (one host check: daemon/RESULTS.md measures it); the
 * caller's host does not wait for any of it. */
fa_status gpu_launch_infer_async(struct gpu_dev *d, struct backend_job *job, fa_cu_stream stream,
                                 gpu_snapshot_wait_fn wait, void *wait_arg,
                                 struct gpu_snap_host *pinned, bool *sticky)
{
	const struct fa_cu_api *cu = fa_cu;
	fa_cu_ptr dix = 0;
	struct fa_gpu_infer_index ix = {0};
	int32_t *host = NULL;
	fa_status st;

	*sticky = false;
	st = infer_snapshot(d, job, stream, &host, &dix, &ix, sticky, wait, wait_arg, pinned);
	if (st == FA_OK)
		st = fa_gpu_attn_infer(d->g, &job->infer->desc, &ix, (CUdeviceptr)(uintptr_t)job->q,
		                       (CUdeviceptr)(uintptr_t)job->k, (CUdeviceptr)(uintptr_t)job->v,
		                       (CUdeviceptr)(uintptr_t)job->o,
		                       (CUdeviceptr)(uintptr_t)job->lse, (CUstream)stream, job->detail,
		                       sizeof job->detail);
	if (dix)
		cu->MemFreeAsync(dix, stream); /* after the kernel, in stream order */
	free(host);
	return st;
}
