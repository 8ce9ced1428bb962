/* gpu_region.c - regions served by the GPU backend, opened on the loop thread with the primary
 * context current (the driver is thread-safe and the context is the worker's too):
 *   - CUDA IPC regions: the handle is opened once per registration and closed by the region's
 *     last reference, i.e. after every job using it finished. Opening costs ~0.5 ms, closing
 *     ~0.2 ms on the H200.
 *   - Host shm regions: pinned with cuMemHostRegister at registration, unpinned before the
 *     unmap (gpu_exec.c stages them). */
#include "gpu_int.h"

#include <inttypes.h>
#include <string.h>

#include "fault.h"
#include "log.h"
#include "region.h"
#include "util.h"

/* The last reference of a region served here: close the IPC mapping or unpin the host pages. */
static void gpu_region_release(struct region *r)
{
	struct gpu_backend *b = r->backend;
	fa_cu_res res;

	fa_cu->CtxSetCurrent(b->devs[r->dev >= 0 ? r->dev : 0].ctx);
	if (r->kind == FA_REGION_CUDA_IPC) {
		if (r->base != NULL &&
		    (res = fa_cu->IpcCloseMemHandle((fa_cu_ptr)(uintptr_t)r->base)) != 0)
			log_info("region %016" PRIx64 ": cuIpcCloseMemHandle: CUDA error %d (%s)",
			         r->id, res, fa_cu_errstr(res));
	} else if ((res = fa_cu->MemHostUnregister(r->base)) != 0) {
		log_info("region %016" PRIx64 ": cuMemHostUnregister: CUDA error %d (%s)", r->id,
		         res, fa_cu_errstr(res));
	}
	r->release = NULL;
}

/* A new region: pin host memory, or open a CUDA IPC handle (once) after checking its GPU. */
fa_status gpu_region_open(struct backend *base, struct region *r,
                          const uint8_t *ipc_handle, const uint8_t *gpu_uuid, char *err,
                          size_t errlen)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	struct gpu_dev *d = &b->devs[0];
	fa_cu_res res;

	if (fault_marked(&b->base))
		return fa_err(err, errlen, FA_EDEVICE, "the GPU faulted; the daemon restarts");
	/* Device memory: the device whose UUID the client named. */
	for (unsigned i = 0; gpu_uuid != NULL && i < b->ndevs; i++)
		if (memcmp(gpu_uuid, b->devs[i].uuid, 16) == 0)
			d = &b->devs[i];
	fa_cu->CtxSetCurrent(d->ctx);
	if (r->kind == FA_REGION_HOST_SHM) {
		/* Portable: any context may copy from it (several devices later). */
		if ((res = fa_cu->MemHostRegister(r->base, (size_t)r->size,
		                                  FA_CU_MEMHOSTREGISTER_PORTABLE)) != 0)
			return fa_err(err, errlen, res == 2 ? FA_ENOMEM : FA_ESYS,
			              "pinning the %" PRIu64 "-byte host buffer %s for the GPU "
			              "(cuMemHostRegister): CUDA error %d (%s)",
			              r->size, r->name, res, fa_cu_errstr(res));
		r->backend = b;
		r->release = gpu_region_release;
		return FA_OK;
	}
	if (memcmp(gpu_uuid, d->uuid, 16) != 0) {
		char want[48], got[48];
		gpu_uuid_text(d->uuid, want);
		gpu_uuid_text(gpu_uuid, got);
		if (b->ndevs == 1)
			return fa_err(err, errlen, FA_ENOTSUP,
			              "the buffer is on GPU %s; this daemon serves GPU %s (%s) only",
			              got, want, fa_gpu_name(d->g));
		return fa_err(err, errlen, FA_ENOTSUP,
		              "the buffer is on GPU %s, which is not one of this daemon's %u GPUs "
		              "(GPU 0 is %s; CUDA_VISIBLE_DEVICES decides which it sees)",
		              got, b->ndevs, want);
	}
	struct fa_cu_ipc_handle h;
	fa_cu_ptr p = 0, abase = 0;
	size_t asize = 0;
	memcpy(h.reserved, ipc_handle, sizeof h.reserved);
	res = fa_cu->IpcOpenMemHandle(&p, h, FA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (res != 0) {
		if (fa_cu_sticky(res)) {
			pthread_mutex_lock(&b->mu);
			gpu_fatal_locked(b, "cuIpcOpenMemHandle lost the context");
			pthread_mutex_unlock(&b->mu);
			return fa_err(err, errlen, FA_EDEVICE,
			              "cuIpcOpenMemHandle: CUDA error %d (%s)", res,
			              fa_cu_errstr(res));
		}
		return fa_err(err, errlen, res == 2 ? FA_ENOMEM : FA_EINVAL,
		              "the CUDA IPC handle cannot be opened: CUDA error %d (%s); it must "
		              "come from cuIpcGetMemHandle of a live cudaMalloc allocation of "
		              "another process on %s",
		              res, fa_cu_errstr(res), fa_gpu_name(d->g));
	}
	/* The handle maps the whole allocation: it must hold what the client declared. */
	res = fa_cu->MemGetAddressRange(&abase, &asize, p);
	if (res != 0 || (uint64_t)asize < r->size) {
		fa_cu->IpcCloseMemHandle(p);
		if (res != 0)
			return fa_err(err, errlen, FA_EINVAL,
			              "cuMemGetAddressRange on the opened handle: CUDA error %d (%s)",
			              res, fa_cu_errstr(res));
		return fa_err(err, errlen, FA_ERANGE,
		              "the CUDA allocation behind the handle has %zu bytes, the "
		              "registration declares %" PRIu64,
		              asize, r->size);
	}
	r->base = (void *)(uintptr_t)p;
	/* One address space for every GPU of the daemon (UVA): an allocation is known by its base,
	 * and a second registration of it opens at the same pointer. */
	r->mem = (struct region_mem){FA_REGION_CUDA_IPC, 0, (uint64_t)abase};
	r->mem_at = (uint64_t)(p - abase);
	r->backend = b;
	r->release = gpu_region_release;
	r->dev = (int)(d - b->devs);
	return FA_OK;
}
