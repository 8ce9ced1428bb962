/* gpu_stage.c - host tensors through the device scratch, for every synchronous job kind (the
 * forward, the backward, the inference layouts): where each tensor lives on the device (its own
 * address when registered device memory, else a slice of the worker's scratch), the copies in
 * before the launch and the copies back after it.
 *
 * Host shm regions are pinned at registration (gpu_region.c), so the copies run at PCIe speed
 * and stay asynchronous on the job's stream. An output is copied in too when its extent has
 * holes (strided), so the copy back leaves the bytes between its elements as they were, or
 * always (GPU_STAGE_OUT_KEEP) when the kernel leaves some of its rows alone (the inference
 * layouts: rows outside the sequences stay the client's). */
#include "gpu_int.h"

#include <string.h>

#include "fa_check.h" /* fa_tensor_extent */

void gpu_stage_add(struct gpu_stage *s, const void *ptr, bool on_device,
                   enum gpu_stage_role role, const int64_t shape[4], const int64_t stride3[3],
                   size_t elem)
{
	struct gpu_stage_tensor *t = &s->t[s->n++];
	t->ptr = ptr;
	t->on_device = on_device;
	t->role = role;
	memcpy(t->shape, shape, sizeof t->shape);
	memcpy(t->stride, stride3, 3 * sizeof(int64_t));
	t->stride[3] = 1; /* the head dim is contiguous (validated) */
	t->elem = elem;
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

fa_cu_res gpu_stage_in(struct gpu_dev *d, struct gpu_stage *s, fa_cu_stream stream,
                       const char **what)
{
	const struct fa_cu_api *cu = fa_cu;
	uint64_t off[GPU_STAGE_MAX] = {0}, total = 0;
	fa_cu_res r;

	/* Where each tensor is on the device: its own address, or a slice of the scratch. */
	for (int i = 0; i < s->n; i++) {
		const struct gpu_stage_tensor *t = &s->t[i];
		if (t->on_device) {
			s->dp[i] = (fa_cu_ptr)(uintptr_t)t->ptr;
			continue;
		}
		fa_tensor_extent(4, t->shape, t->stride, t->elem, NULL,
		                 &s->ext[i]); /* validated: cannot overflow */
		off[i] = total;
		total += (s->ext[i] + GPU_SCRATCH_ALIGN - 1) / GPU_SCRATCH_ALIGN * GPU_SCRATCH_ALIGN;
	}
	if (total > 0) {
		if ((r = gpu_scratch_reserve(d, (size_t)total)) != 0) {
			*what = "allocating device scratch for host buffers";
			return r;
		}
		for (int i = 0; i < s->n; i++)
			if (!s->t[i].on_device)
				s->dp[i] = d->scratch + off[i];
	}
	/* The inputs in; the outputs too where the copy back must keep bytes it does not write. */
	for (int i = 0; i < s->n; i++) {
		const struct gpu_stage_tensor *t = &s->t[i];
		if (t->on_device)
			continue;
		const uint64_t dense = (uint64_t)(t->shape[0] * t->shape[1] * t->shape[2] *
		                                  t->shape[3]) * t->elem;
		if (t->role == GPU_STAGE_OUT && s->ext[i] == dense)
			continue;
		if ((r = cu->MemcpyHtoDAsync(s->dp[i], t->ptr, s->ext[i], stream)) != 0) {
			*what = "copying a host tensor to the GPU";
			return r;
		}
		s->bytes_in += s->ext[i];
	}
	return 0;
}

fa_cu_res gpu_stage_out(struct gpu_stage *s, fa_cu_stream stream, const char **what)
{
	const struct fa_cu_api *cu = fa_cu;
	fa_cu_res r;

	for (int i = 0; i < s->n; i++) {
		const struct gpu_stage_tensor *t = &s->t[i];
		if (t->on_device || t->role == GPU_STAGE_IN)
			continue;
		if ((r = cu->MemcpyDtoHAsync((void *)(uintptr_t)t->ptr, s->dp[i], s->ext[i],
		                             stream)) != 0) {
			*what = "copying a result to host memory";
			return r;
		}
		s->bytes_out += s->ext[i];
	}
	return 0;
}
