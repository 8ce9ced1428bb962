/* fa_cuda.c - device buffers: the caller's CUDA memory, registered as a CUDA IPC handle.
 *
 * The CUDA driver is loaded (common/fa_cu.h) on the first fa_buffer_register_device() and never
 * linked, so host-only programs never load it and run on machines without a driver.
 *
 * A legacy IPC handle always maps the *whole* allocation, whatever pointer it was taken of: the
 * library finds the allocation's base and size (cuMemGetAddressRange), exports the base, registers
 * the allocation's size, and adds (dptr - base) to every tensor offset it sends (region_offset).
 * Memory that legacy IPC cannot export (stream-ordered pools, managed memory, VMM allocations) is
 * refused with FA_EIPC before anything is sent: its capability attribute says 0.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_client_int.h"
#include "fa_cu.h"

typedef fa_cu_res cu_res;
typedef fa_cu_ptr cu_ptr;
typedef fa_cu_ctx cu_ctx;

enum {
	CU_ATTR_CONTEXT = FA_CU_POINTER_ATTRIBUTE_CONTEXT,
	CU_ATTR_IS_MANAGED = FA_CU_POINTER_ATTRIBUTE_IS_MANAGED,
	CU_ATTR_DEVICE_ORDINAL = FA_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	CU_ATTR_IS_LEGACY_IPC_CAPABLE = FA_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	CU_ATTR_MEMPOOL_HANDLE = FA_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
};

/* REGISTER's fields for a device buffer: the handle of the whole allocation. */
static void dev_describe(const fa_buffer *b, struct fa_proto_req *req)
{
	req->u.reg.kind = FA_REGION_CUDA_IPC;
	req->u.reg.size = b->u.dev.alloc_size;
	memcpy(req->u.reg.ipc_handle, b->u.dev.handle, sizeof req->u.reg.ipc_handle);
	memcpy(req->u.reg.gpu_uuid, b->u.dev.uuid, sizeof req->u.reg.gpu_uuid);
}

/* Nothing to release: the memory is the caller's, and the handle needs no closing. */
static void dev_release(fa_buffer *b)
{
	b->data = NULL;
}

static const struct fa_buffer_ops dev_ops = {
	.kind = FA_REGION_CUDA_IPC,
	.name = "device",
	.describe = dev_describe,
	.revive = NULL, /* the same handle registers again with a new daemon */
	.release = dev_release,
};

/* FA_EIPC with the kind of memory named when it can be told. */
static fa_status dev_not_exportable(cu_ptr p)
{
	unsigned managed = 0;
	void *pool = NULL;
	const char *what = "memory that legacy CUDA IPC cannot export";

	if (fa_cu->PointerGetAttribute(&managed, CU_ATTR_IS_MANAGED, p) == 0 && managed)
		what = "managed memory (cudaMallocManaged)";
	else if (fa_cu->PointerGetAttribute(&pool, CU_ATTR_MEMPOOL_HANDLE, p) == 0 && pool != NULL)
		what = "memory from a stream-ordered pool (cudaMallocAsync)";
	else
		what = "a VMM allocation (cuMemCreate, e.g. PyTorch's expandable_segments) or other "
		       "non-exportable memory";
	return fa_fail(FA_EIPC,
	               "device pointer 0x%llx is %s: CUDA IPC exports only plain cudaMalloc/"
	               "cuMemAlloc allocations (pools, managed and VMM memory cannot be shared; "
	               "copy into a cudaMalloc buffer, or unset PYTORCH_CUDA_ALLOC_CONF="
	               "expandable_segments)",
	               (unsigned long long)p, what);
}

/* Find the allocation, export it, read its GPU's UUID (the pointer's context pushed). */
static fa_status dev_export(fa_buffer *b, cu_ptr p, size_t size)
{
	unsigned capable = 0;
	int ordinal = -1, dev = 0;
	cu_ctx ctx = NULL, popped;
	cu_ptr base = 0;
	size_t asize = 0;
	struct fa_cu_ipc_handle h;
	uint8_t uuid[16]; /* CUuuid */
	fa_status st = FA_OK;
	cu_res r;

	r = fa_cu->PointerGetAttribute(&ctx, CU_ATTR_CONTEXT, p);
	if (r != 0)
		return fa_fail(FA_EINVAL, "0x%llx is not a CUDA device pointer (%s)",
		               (unsigned long long)p, fa_cu_errstr(r));
	if ((r = fa_cu->PointerGetAttribute(&capable, CU_ATTR_IS_LEGACY_IPC_CAPABLE, p)) != 0)
		return fa_fail(FA_EINVAL, "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) on "
		               "0x%llx: %s", (unsigned long long)p, fa_cu_errstr(r));
	if (!capable)
		return dev_not_exportable(p);
	if ((r = fa_cu->PointerGetAttribute(&ordinal, CU_ATTR_DEVICE_ORDINAL, p)) != 0)
		return fa_fail(FA_EINVAL, "cuPointerGetAttribute(DEVICE_ORDINAL) on 0x%llx: %s",
		               (unsigned long long)p, fa_cu_errstr(r));
	if (ctx != NULL && (r = fa_cu->CtxPushCurrent(ctx)) != 0)
		return fa_fail(FA_EINVAL, "cuCtxPushCurrent for 0x%llx: %s", (unsigned long long)p,
		               fa_cu_errstr(r));
	if ((r = fa_cu->MemGetAddressRange(&base, &asize, p)) != 0) {
		st = fa_fail(FA_EINVAL, "cuMemGetAddressRange(0x%llx): %s", (unsigned long long)p,
		             fa_cu_errstr(r));
	} else if (p - base > asize || size > asize - (p - base)) {
		st = fa_fail(FA_EINVAL,
		             "[0x%llx, +%zu) leaves its allocation [0x%llx, +%zu): a buffer must lie "
		             "inside one cudaMalloc allocation",
		             (unsigned long long)p, size, (unsigned long long)base, asize);
	} else if ((r = fa_cu->IpcGetMemHandle(&h, base)) != 0) {
		st = fa_fail(r == 1 ? FA_EIPC : FA_EINVAL,
		             "cuIpcGetMemHandle(0x%llx): CUDA error %d (%s)",
		             (unsigned long long)base, r, fa_cu_errstr(r));
	} else if ((r = fa_cu->DeviceGet(&dev, ordinal)) != 0 ||
	           (r = fa_cu->DeviceGetUuid(uuid, dev)) != 0) {
		st = fa_fail(FA_EINVAL, "the UUID of GPU %d: %s", ordinal, fa_cu_errstr(r));
	}
	if (ctx != NULL)
		fa_cu->CtxPopCurrent(&popped);
	if (st != FA_OK)
		return st;
	memcpy(b->u.dev.handle, h.reserved, sizeof b->u.dev.handle);
	memcpy(b->u.dev.uuid, uuid, sizeof b->u.dev.uuid);
	b->u.dev.alloc_size = (uint64_t)asize;
	b->region_offset = (uint64_t)(p - base);
	return FA_OK;
}

/* The caller's device memory, exported and registered; see fa_client.h. */
FA_API fa_status fa_buffer_register_device(fa_client *c, void *dptr, size_t size,
                                           fa_buffer **out)
{
	fa_buffer *b;
	fa_status st;

	fa_detail_clear();
	if (out == NULL)
		return fa_fail(FA_EINVAL, "fa_buffer_register_device: out is NULL");
	*out = NULL;
	if (c == NULL)
		return fa_fail(FA_EINVAL, "fa_buffer_register_device: client is NULL");
	if (dptr == NULL)
		return fa_fail(FA_EINVAL, "fa_buffer_register_device: dptr is NULL");
	if (size == 0)
		return fa_fail(FA_EINVAL, "buffer size is 0");
	if ((st = fa_cu_load()) != FA_OK)
		return fa_fail(st, "%s", fa_cu_why());
	if ((b = calloc(1, sizeof *b)) == NULL)
		return fa_fail(FA_ENOMEM, "no memory for a buffer");
	b->client = c;
	b->ops = &dev_ops;
	b->size = size;
	b->data = dptr;
	if ((st = dev_export(b, (cu_ptr)(uintptr_t)dptr, size)) != FA_OK ||
	    (st = fa_buffer_register(c, b)) != FA_OK) {
		free(b);
		return st;
	}
	*out = b;
	fa_debug("fa: device buffer 0x%llx (%zu bytes) registered: offset %" PRIu64
	         " in a %" PRIu64 "-byte allocation, region %016" PRIx64,
	         (unsigned long long)(uintptr_t)dptr, size, b->region_offset, b->u.dev.alloc_size,
	         b->region);
	return FA_OK;
}

/* ---- asynchronous mode: CUDA IPC events ------------------------------------------------------ */

/* Interprocess events must not record timing. */
#define FA_EVENT_FLAGS (FA_CU_EVENT_DISABLE_TIMING | FA_CU_EVENT_INTERPROCESS)

/* Push the stream's context; *ctx gets it. */
static fa_status async_push(void *stream, cu_ctx *ctx)
{
	fa_status st;
	cu_res r;

	if ((st = fa_cu_load()) != FA_OK)
		return fa_fail(st, "%s", fa_cu_why());
	if ((r = fa_cu->StreamGetCtx(stream, ctx)) != 0)
		return fa_fail(FA_EINVAL, "the stream's context (cuStreamGetCtx): CUDA error %d (%s); "
		               "pass a CUstream / cudaStream_t of a live context, or NULL for the "
		               "current context's default stream", r, fa_cu_errstr(r));
	if ((r = fa_cu->CtxPushCurrent(*ctx)) != 0)
		return fa_fail(FA_EINVAL, "cuCtxPushCurrent: CUDA error %d (%s)", r,
		               fa_cu_errstr(r));
	return FA_OK;
}

/* Drop the slot's events (their context may be gone: errors are ignored). */
static void async_drop(struct fa_async_slot *sl)
{
	if (sl->ev != NULL)
		fa_cu->EventDestroy(sl->ev);
	if (sl->daemon_ev != NULL)
		fa_cu->EventDestroy(sl->daemon_ev);
	memset(sl, 0, sizeof *sl);
}

/* See fa_client_int.h. */
fa_status fa_cuda_async_record(struct fa_async_slot *sl, void *stream,
                               uint8_t handle[FA_PROTO_IPC_HANDLE_LEN])
{
	cu_ctx ctx = NULL, popped;
	struct fa_cu_ipc_handle h;
	fa_status st = FA_OK;
	cu_res r;

	if ((st = async_push(stream, &ctx)) != FA_OK)
		return st;
	if (sl->ctx != ctx)
		async_drop(sl); /* another device or context: new events */
	if (sl->ev == NULL) {
		if ((r = fa_cu->EventCreate(&sl->ev, FA_EVENT_FLAGS)) != 0) {
			sl->ev = NULL;
			st = fa_fail(r == 2 ? FA_ENOMEM : FA_EINVAL,
			             "cuEventCreate(INTERPROCESS): CUDA error %d (%s)", r,
			             fa_cu_errstr(r));
		} else if ((r = fa_cu->IpcGetEventHandle(&h, sl->ev)) != 0) {
			fa_cu->EventDestroy(sl->ev);
			sl->ev = NULL;
			st = fa_fail(FA_EINVAL, "cuIpcGetEventHandle: CUDA error %d (%s)", r,
			             fa_cu_errstr(r));
		} else {
			memcpy(sl->ev_handle, h.reserved, sizeof sl->ev_handle);
			sl->ctx = ctx;
		}
	}
	if (st == FA_OK && (r = fa_cu->EventRecord(sl->ev, stream)) != 0)
		st = fa_fail(FA_EINVAL, "cuEventRecord on the caller's stream: CUDA error %d (%s)", r,
		             fa_cu_errstr(r));
	if (st == FA_OK)
		memcpy(handle, sl->ev_handle, FA_PROTO_IPC_HANDLE_LEN);
	fa_cu->CtxPopCurrent(&popped);
	return st;
}

/* See fa_client_int.h. */
fa_status fa_cuda_async_wait(struct fa_async_slot *sl, void *stream,
                             const uint8_t handle[FA_PROTO_IPC_HANDLE_LEN])
{
	cu_ctx ctx = NULL, popped;
	struct fa_cu_ipc_handle h;
	fa_status st = FA_OK;
	cu_res r;

	if ((st = async_push(stream, &ctx)) != FA_OK)
		return st;
	if (sl->daemon_ev != NULL && memcmp(sl->daemon_handle, handle, FA_PROTO_IPC_HANDLE_LEN)) {
		fa_cu->EventDestroy(sl->daemon_ev); /* a new daemon, or a new session */
		sl->daemon_ev = NULL;
	}
	if (sl->daemon_ev == NULL) {
		memcpy(h.reserved, handle, sizeof h.reserved);
		if ((r = fa_cu->IpcOpenEventHandle(&sl->daemon_ev, h)) != 0) {
			sl->daemon_ev = NULL;
			st = fa_fail(FA_EDEVICE,
			             "the daemon's completion event cannot be opened "
			             "(cuIpcOpenEventHandle): CUDA error %d (%s); the kernel is "
			             "enqueued: synchronise the whole device before reading O",
			             r, fa_cu_errstr(r));
		} else {
			memcpy(sl->daemon_handle, handle, sizeof sl->daemon_handle);
		}
	}
	if (st == FA_OK && (r = fa_cu->StreamWaitEvent(stream, sl->daemon_ev, 0)) != 0)
		st = fa_fail(FA_EDEVICE, "cuStreamWaitEvent on the daemon's event: CUDA error %d (%s)",
		             r, fa_cu_errstr(r));
	fa_cu->CtxPopCurrent(&popped);
	return st;
}

/* See fa_client_int.h. */
void fa_cuda_async_fini(struct fa_async_slot *sl)
{
	if (sl->ev == NULL && sl->daemon_ev == NULL)
		return;
	async_drop(sl);
}
