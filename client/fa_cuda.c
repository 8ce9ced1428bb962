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
	CU_ATTR_BUFFER_ID = FA_CU_POINTER_ATTRIBUTE_BUFFER_ID,
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
	return fa__fail(FA_EIPC,
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
		return fa__fail(FA_EINVAL, "0x%llx is not a CUDA device pointer (%s)",
		                (unsigned long long)p, fa_cu_errstr(r));
	if ((r = fa_cu->PointerGetAttribute(&capable, CU_ATTR_IS_LEGACY_IPC_CAPABLE, p)) != 0)
		return fa__fail(FA_EINVAL, "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) on "
		                "0x%llx: %s", (unsigned long long)p, fa_cu_errstr(r));
	if (!capable)
		return dev_not_exportable(p);
	if ((r = fa_cu->PointerGetAttribute(&ordinal, CU_ATTR_DEVICE_ORDINAL, p)) != 0)
		return fa__fail(FA_EINVAL, "cuPointerGetAttribute(DEVICE_ORDINAL) on 0x%llx: %s",
		                (unsigned long long)p, fa_cu_errstr(r));
	if (ctx != NULL && (r = fa_cu->CtxPushCurrent(ctx)) != 0)
		return fa__fail(FA_EINVAL, "cuCtxPushCurrent for 0x%llx: %s", (unsigned long long)p,
		                fa_cu_errstr(r));
	if ((r = fa_cu->MemGetAddressRange(&base, &asize, p)) != 0) {
		st = fa__fail(FA_EINVAL, "cuMemGetAddressRange(0x%llx): %s", (unsigned long long)p,
		              fa_cu_errstr(r));
	} else if (p - base > asize || size > asize - (p - base)) {
		st = fa__fail(FA_EINVAL,
		              "[0x%llx, +%zu) leaves its allocation [0x%llx, +%zu): a buffer must lie "
		              "inside one cudaMalloc allocation",
		              (unsigned long long)p, size, (unsigned long long)base, asize);
	} else if ((r = fa_cu->IpcGetMemHandle(&h, base)) != 0) {
		st = fa__fail(r == 1 ? FA_EIPC : FA_EINVAL,
		              "cuIpcGetMemHandle(0x%llx): CUDA error %d (%s)",
		              (unsigned long long)base, r, fa_cu_errstr(r));
	} else if ((r = fa_cu->DeviceGet(&dev, ordinal)) != 0 ||
	           (r = fa_cu->DeviceGetUuid(uuid, dev)) != 0) {
		st = fa__fail(FA_EINVAL, "the UUID of GPU %d: %s", ordinal, fa_cu_errstr(r));
	}
	if (ctx != NULL)
		fa_cu->CtxPopCurrent(&popped);
	if (st != FA_OK)
		return st;
	/* The id a prepared call compares against (fa_cuda_buffer_current); 0 when the driver does
	 * not say, and such a buffer is never taken by a prepared call. */
	unsigned long long id = 0;
	if (fa_cu->PointerGetAttribute(&id, CU_ATTR_BUFFER_ID, p) != 0)
		id = 0;
	b->u.dev.buffer_id = id;
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

	fa__detail_clear();
	if (out == NULL)
		return fa__fail(FA_EINVAL, "fa_buffer_register_device: out is NULL");
	*out = NULL;
	if (c == NULL)
		return fa__fail(FA_EINVAL, "fa_buffer_register_device: client is NULL");
	if (dptr == NULL)
		return fa__fail(FA_EINVAL, "fa_buffer_register_device: dptr is NULL");
	if (size == 0)
		return fa__fail(FA_EINVAL, "buffer size is 0");
	if ((st = fa_cu_load()) != FA_OK)
		return fa__fail(st, "%s", fa_cu_why());
	if ((b = calloc(1, sizeof *b)) == NULL)
		return fa__fail(FA_ENOMEM, "no memory for a buffer");
	b->client = c;
	b->ops = &dev_ops;
	b->size = size;
	b->data = dptr;
	if ((st = dev_export(b, (cu_ptr)(uintptr_t)dptr, size)) != FA_OK ||
	    (st = fa__buffer_register(c, b)) != FA_OK) {
		free(b);
		return st;
	}
	*out = b;
	fa__debug("fa: device buffer 0x%llx (%zu bytes) registered: offset %" PRIu64
	          " in a %" PRIu64 "-byte allocation, region %016" PRIx64,
	          (unsigned long long)(uintptr_t)dptr, size, b->region_offset, b->u.dev.alloc_size,
	          b->region);
	return FA_OK;
}

/* See fa_client_int.h. One driver query (about a microsecond): what makes a registration
 * trusted only while it is still that allocation's, since CUDA gives the freed address to the
 * next allocation and the registered handle would then map other memory. */
bool fa_cuda_buffer_current(const fa_buffer *b, uint64_t addr)
{
	unsigned long long id = 0;

	if (b->u.dev.buffer_id == 0)
		return false;
	if (fa_cu->PointerGetAttribute(&id, CU_ATTR_BUFFER_ID, (cu_ptr)addr) != 0)
		return false;
	return id == b->u.dev.buffer_id;
}

/* See fa_client_int.h. */
fa_status fa_cuda_stream_sync(void *stream)
{
	fa_status st;
	cu_res r;

	if ((st = fa_cu_load()) != FA_OK)
		return fa__fail(st, "%s", fa_cu_why());
	if ((r = fa_cu->StreamSynchronize(stream)) != 0)
		return fa__fail(FA_EDEVICE, "cuStreamSynchronize on the producer's stream: CUDA error "
		                "%d (%s)", r, fa_cu_errstr(r));
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
		return fa__fail(st, "%s", fa_cu_why());
	if ((r = fa_cu->StreamGetCtx(stream, ctx)) != 0)
		return fa__fail(FA_EINVAL, "the stream's context (cuStreamGetCtx): CUDA error %d (%s); "
		                "pass a CUstream / cudaStream_t of a live context, or NULL for the "
		                "current context's default stream", r, fa_cu_errstr(r));
	if ((r = fa_cu->CtxPushCurrent(*ctx)) != 0)
		return fa__fail(FA_EINVAL, "cuCtxPushCurrent: CUDA error %d (%s)", r,
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
			st = fa__fail(r == 2 ? FA_ENOMEM : FA_EINVAL,
			              "cuEventCreate(INTERPROCESS): CUDA error %d (%s)", r,
			              fa_cu_errstr(r));
		} else if ((r = fa_cu->IpcGetEventHandle(&h, sl->ev)) != 0) {
			fa_cu->EventDestroy(sl->ev);
			sl->ev = NULL;
			st = fa__fail(FA_EINVAL, "cuIpcGetEventHandle: CUDA error %d (%s)", r,
			              fa_cu_errstr(r));
		} else {
			memcpy(sl->ev_handle, h.reserved, sizeof sl->ev_handle);
			sl->ctx = ctx;
		}
	}
	if (st == FA_OK && (r = fa_cu->EventRecord(sl->ev, stream)) != 0)
		st = fa__fail(FA_EINVAL, "cuEventRecord on the caller's stream: CUDA error %d (%s)", r,
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
			st = fa__fail(FA_EDEVICE,
			              "the daemon's completion event cannot be opened "
			              "(cuIpcOpenEventHandle): CUDA error %d (%s); the kernel is "
			              "enqueued: synchronise the whole device before reading O",
			              r, fa_cu_errstr(r));
		} else {
			memcpy(sl->daemon_handle, handle, sizeof sl->daemon_handle);
		}
	}
	if (st == FA_OK && (r = fa_cu->StreamWaitEvent(stream, sl->daemon_ev, 0)) != 0)
		st = fa__fail(FA_EDEVICE, "cuStreamWaitEvent on the daemon's event: CUDA error %d (%s)",
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

/* ---- asynchronous mode: completion words (the default) --------------------------------------- */

/* REGISTER's fields for the words: a device buffer flagged as completion words. */
static void words_describe(const fa_buffer *b, struct fa_proto_req *req)
{
	dev_describe(b, req);
	req->u.reg.words = true;
}

/* A daemon restart (fa_client_reconnect): the old daemon will write no done word again, so every
 * wait on one is released (the calls it had not finished have undefined outputs, as the
 * contract says), and the slots start afresh on the new session. */
static fa_status words_revive(fa_buffer *b, bool force)
{
	(void)force;
	fa_client *c = b->client;
	struct fa_words *w = NULL;
	cu_ctx popped;

	for (int i = 0; i < FA_WORDS_MAX_CTX; i++)
		if (c->words[i].buf == b)
			w = &c->words[i];
	if (w == NULL || fa_cu->CtxPushCurrent(w->ctx) != 0)
		return FA_OK;
	uint64_t top = atomic_load(&w->next);
	for (int k = 0; k < FA_TRANSPORT_MAX_SOCKETS; k++) {
		fa_cu->StreamWriteValue64(w->stream, w->dptr + FA_PROTO_WORDS_DONE(k), top,
		                          FA_CU_STREAM_WRITE_VALUE_DEFAULT);
		w->slot_seq[k] = 0;
	}
	fa_cu->StreamSynchronize(w->stream);
	fa_cu->CtxPopCurrent(&popped);
	return FA_OK;
}

static const struct fa_buffer_ops words_ops = {
	.kind = FA_REGION_CUDA_IPC,
	.name = "completion words",
	.describe = words_describe,
	.revive = words_revive,
	.release = dev_release, /* the memory is fa_cuda_words_fini's */
};

/* Statuses after which this context uses the IPC-event path for good: the daemon (or its GPUs)
 * cannot serve words, or is older than them. */
static bool words_refused(fa_status st)
{
	return st == FA_ENOTSUP || st == FA_EPROTO || st == FA_EINVAL || st == FA_ERANGE ||
	       st == FA_EALIGN;
}

/* Make w's words in the current context (ctx) and register them. FA_OK with w->state set (1, or
 * -1: not here), or a status to return (w is then freed for a later try). */
static fa_status words_make(fa_client *c, struct fa_words *w)
{
	cu_ptr p = 0;
	int ordinal = -1, dev = 0, ok64 = 0;
	fa_buffer *b = NULL;
	fa_status st = FA_OK;
	cu_res r;

	if ((r = fa_cu->MemAlloc(&p, 4096)) != 0)
		return fa__fail(r == 2 ? FA_ENOMEM : FA_EINVAL,
		                "cuMemAlloc of the completion words: CUDA error %d (%s)", r,
		                fa_cu_errstr(r));
	if (fa_cu->PointerGetAttribute(&ordinal, CU_ATTR_DEVICE_ORDINAL, p) != 0 ||
	    fa_cu->DeviceGet(&dev, ordinal) != 0 ||
	    fa_cu->DeviceGetAttribute(&ok64, FA_CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
	                              dev) != 0 || ok64 == 0) {
		fa__debug("fa: GPU %d has no 64-bit stream memory operations: asynchronous calls "
		          "use CUDA IPC events", ordinal);
		fa_cu->MemFree(p);
		w->state = -1;
		return FA_OK;
	}
	if ((r = fa_cu->StreamCreate(&w->stream, FA_CU_STREAM_NON_BLOCKING)) != 0 ||
	    (r = fa_cu->MemsetD8Async(p, 0, 4096, w->stream)) != 0 ||
	    (r = fa_cu->StreamSynchronize(w->stream)) != 0) {
		st = fa__fail(FA_EINVAL, "zeroing the completion words: CUDA error %d (%s)", r,
		              fa_cu_errstr(r));
	} else if ((b = calloc(1, sizeof *b)) == NULL) {
		st = fa__fail(FA_ENOMEM, "no memory for the completion words");
	} else {
		b->client = c;
		b->ops = &words_ops;
		b->size = 4096;
		b->data = (void *)(uintptr_t)p;
		if ((st = dev_export(b, p, 4096)) == FA_OK)
			st = fa__buffer_register(c, b);
	}
	if (st == FA_OK) {
		w->buf = b;
		w->dptr = p;
		w->state = 1;
		fa__debug("fa: completion words at 0x%llx on GPU %d, region %016" PRIx64,
		          (unsigned long long)p, ordinal, b->region);
		return FA_OK;
	}
	free(b);
	if (w->stream != NULL)
		fa_cu->StreamDestroy(w->stream);
	w->stream = NULL;
	fa_cu->MemFree(p);
	if (words_refused(st)) {
		fa__debug("fa: the daemon refused completion words (%s): asynchronous calls use "
		          "CUDA IPC events", fa_status_name(st));
		fa__detail_clear();
		w->state = -1;
		return FA_OK;
	}
	return st;
}

/* See fa_client_int.h. */
fa_status fa_cuda_words_get(fa_client *c, void *stream, struct fa_words **out)
{
	struct fa_words *w = NULL;
	cu_ctx ctx = NULL, popped;
	fa_status st;

	*out = NULL;
	if (c->force_events)
		return FA_OK;
	if ((st = async_push(stream, &ctx)) != FA_OK)
		return st;
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < FA_WORDS_MAX_CTX && w == NULL; i++)
		if (c->words[i].ctx == ctx)
			w = &c->words[i];
	if (w != NULL) {
		if (w->state == 1)
			*out = w;
		pthread_mutex_unlock(&c->lock);
		fa_cu->CtxPopCurrent(&popped);
		return FA_OK; /* made (or being made: this call takes the event path) */
	}
	for (int i = 0; i < FA_WORDS_MAX_CTX && w == NULL; i++)
		if (c->words[i].ctx == NULL)
			w = &c->words[i];
	if (w == NULL) { /* more contexts than entries: the others use events */
		pthread_mutex_unlock(&c->lock);
		fa_cu->CtxPopCurrent(&popped);
		return FA_OK;
	}
	w->ctx = ctx;
	w->state = 0;
	pthread_mutex_unlock(&c->lock);
	struct fa_words made = {.ctx = ctx};
	st = words_make(c, &made); /* registers: takes c->lock itself */
	pthread_mutex_lock(&c->lock);
	if (st == FA_OK) {
		w->buf = made.buf;
		w->dptr = made.dptr;
		w->stream = made.stream;
		atomic_store(&w->next, 0);
		w->state = made.state;
		if (w->state == 1)
			*out = w;
	} else {
		w->ctx = NULL; /* a later call tries again */
	}
	pthread_mutex_unlock(&c->lock);
	fa_cu->CtxPopCurrent(&popped);
	return st;
}

/* See fa_client_int.h. */
fa_status fa_cuda_words_ready(struct fa_words *w, int slot, void *stream, uint64_t *seq)
{
	cu_ctx popped;
	cu_res r;

	if ((r = fa_cu->CtxPushCurrent(w->ctx)) != 0)
		return fa__fail(FA_EINVAL, "cuCtxPushCurrent: CUDA error %d (%s)", r, fa_cu_errstr(r));
	*seq = atomic_fetch_add(&w->next, 1) + 1;
	uint64_t prev = w->slot_seq[slot];
	r = 0;
	if (prev != 0)
		r = fa_cu->StreamWaitValue64(stream, w->dptr + FA_PROTO_WORDS_DONE(slot), prev,
		                             FA_CU_STREAM_WAIT_VALUE_GEQ);
	/* Fenced (the default): what the stream wrote before (Q, K, V) is visible first. */
	if (r == 0)
		r = fa_cu->StreamWriteValue64(stream, w->dptr + FA_PROTO_WORDS_READY(slot), *seq,
		                              FA_CU_STREAM_WRITE_VALUE_DEFAULT);
	fa_cu->CtxPopCurrent(&popped);
	if (r != 0)
		return fa__fail(FA_EINVAL, "marking the inputs ready on the caller's stream "
		                "(cuStreamWaitValue64 / cuStreamWriteValue64): CUDA error %d (%s)",
		                r, fa_cu_errstr(r));
	return FA_OK;
}

/* See fa_client_int.h. */
fa_status fa_cuda_words_wait(struct fa_words *w, int slot, void *stream, uint64_t seq)
{
	cu_ctx popped;
	cu_res r;

	w->slot_seq[slot] = seq; /* enqueued: the daemon writes its done word */
	if ((r = fa_cu->CtxPushCurrent(w->ctx)) != 0)
		return fa__fail(FA_EDEVICE, "cuCtxPushCurrent: CUDA error %d (%s); the kernel is "
		                "enqueued: synchronise the whole device before reading O", r,
		                fa_cu_errstr(r));
	r = fa_cu->StreamWaitValue64(stream, w->dptr + FA_PROTO_WORDS_DONE(slot), seq,
	                             FA_CU_STREAM_WAIT_VALUE_GEQ);
	fa_cu->CtxPopCurrent(&popped);
	if (r != 0)
		return fa__fail(FA_EDEVICE, "cuStreamWaitValue64 on the daemon's done word: CUDA "
		                "error %d (%s); the kernel is enqueued: synchronise the whole device "
		                "before reading O", r, fa_cu_errstr(r));
	return FA_OK;
}

/* See fa_client_int.h. */
void fa_cuda_words_lost(struct fa_words *w, int slot, uint64_t seq)
{
	cu_ctx popped;

	w->slot_seq[slot] = seq;
	if (fa_cu->CtxPushCurrent(w->ctx) != 0)
		return;
	fa_cu->StreamWriteValue64(w->stream, w->dptr + FA_PROTO_WORDS_DONE(slot), seq,
	                          FA_CU_STREAM_WRITE_VALUE_DEFAULT);
	fa_cu->CtxPopCurrent(&popped);
}

/* See fa_client_int.h. */
void fa_cuda_words_fini(struct fa_words *w)
{
	cu_ctx popped;

	if (w->ctx == NULL || w->state != 1)
		return;
	if (fa_cu->CtxPushCurrent(w->ctx) == 0) { /* the context may be gone: errors ignored */
		fa_cu->StreamSynchronize(w->stream);
		fa_cu->StreamDestroy(w->stream);
		fa_cu->MemFree(w->dptr);
		fa_cu->CtxPopCurrent(&popped);
	}
	memset(w, 0, sizeof *w);
}
