/* fa_cu.h - the CUDA driver, loaded at run time: one table of entry points, one loader, the
 * sticky-error classification and the error strings. Every part that calls the driver (the
 * daemon's GPU backend, kernels/' launcher, libfaclient's device buffers, fa-ctl, the GPU tests)
 * uses this and nothing else; no other file opens libcuda.so.1.
 *
 * Why at run time: nothing links libcuda, so every program starts on a machine without a driver
 * and reports FA_ENOGPU with the reason instead of failing to start.
 *
 * The entry points come from cuGetProcAddress with the CUDA 12.0 ABI, so the prototypes below are
 * the 12.0 ones whatever the driver's version ("cuStreamWaitValue64" gives the _v2 entry point
 * that cuda.h's macros name since 12.0), and they are written here instead of taken from
 * cuda.h (whose newer prototypes may differ). This header needs no CUDA header; where cuda.h is
 * present at build time (FA_HAVE_CUDA_HEADERS) fa_cu.c checks every constant below against it.
 *
 * Threads: fa_cu_load may be called from any thread, any number of times (pthread_once); the
 * table is written only inside it and never changes after, so once fa_cu_load returned FA_OK in
 * a thread (or in a thread that handed over to this one through a mutex, thread creation and so
 * on) that thread may call through fa_cu without locking. The driver's entry points are
 * thread-safe. fa_cu_errstr, fa_cu_errname and fa_cu_sticky are thread-safe, need no load and
 * never load the driver.
 *
 * fork: CUDA does not survive fork. A process that loaded the driver must not use CUDA in its
 * children (the loaded state is inherited, the driver's state is not usable). A child of a
 * process that never called fa_cu_load loads the driver afresh: the GPU tests rely on this
 * (tests/helpers/fa_cudrv.h does every piece of CUDA work in a forked child).
 *
 * The driver is never unloaded: unloading CUDA is not well supported, and the table stays valid
 * for the process' life.
 */
#ifndef FA_CU_H
#define FA_CU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h" /* fa_status */

/* ---- types: cuda.h's, as the 12.0 ABI passes them ------------------------------------------- */

typedef int fa_cu_res;                /* CUresult: 0 is CUDA_SUCCESS */
typedef int fa_cu_dev;                /* CUdevice */
typedef unsigned long long fa_cu_ptr; /* CUdeviceptr */
typedef void *fa_cu_ctx;              /* CUcontext */
typedef void *fa_cu_stream;           /* CUstream (NULL: the context's default stream) */
typedef void *fa_cu_event;            /* CUevent */
typedef void *fa_cu_mod;              /* CUmodule */
typedef void *fa_cu_func;             /* CUfunction */
typedef void *fa_cu_pool;             /* CUmemoryPool */

#define FA_CU_IPC_HANDLE_LEN 64 /* CU_IPC_HANDLE_SIZE */

/* CUipcMemHandle and CUipcEventHandle (the same 64 opaque bytes; passed by value to the Open
 * calls). */
struct fa_cu_ipc_handle {
	char reserved[FA_CU_IPC_HANDLE_LEN];
};

/* The virtual memory management calls' types (cuMemCreate and its kin; tests/bench/bench_ipcmem.c
 * compares their exported memory with legacy IPC's): CUmemGenericAllocationHandle,
 * CUmemLocation, CUmemAllocationProp and CUmemAccessDesc, field for field (fa_cu.c checks the
 * sizes and offsets against cuda.h). */
typedef unsigned long long fa_cu_mem_handle;

struct fa_cu_mem_location {
	int type; /* FA_CU_MEM_LOCATION_TYPE_DEVICE */
	int id;   /* the device ordinal */
};

struct fa_cu_mem_prop {
	int type;                   /* FA_CU_MEM_ALLOCATION_TYPE_PINNED */
	int requested_handle_types; /* FA_CU_MEM_HANDLE_TYPE_*, or 0: not exportable */
	struct fa_cu_mem_location location;
	void *win32_metadata; /* NULL */
	struct {
		unsigned char compression_type;
		unsigned char gpu_direct_rdma_capable;
		unsigned short usage;
		unsigned char reserved[4];
	} alloc_flags;
};

struct fa_cu_mem_access {
	struct fa_cu_mem_location location;
	int flags; /* FA_CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
};

/* ---- constants the callers pass (cuda.h's values; fa_cu.c checks them against cuda.h) -------- */

enum {
	/* CUpointer_attribute */
	FA_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	FA_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7, /* unique per allocation in the process's life */
	FA_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	FA_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	FA_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	FA_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	FA_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	FA_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
	FA_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17,
	FA_CU_POINTER_ATTRIBUTE_MAPPING_SIZE = 18,
	FA_CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR = 19,
	/* CUdevice_attribute */
	FA_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	FA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
	FA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
	FA_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
	FA_CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
	FA_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
	/* cuStreamWaitValue64 / cuStreamWriteValue64 (the asynchronous mode's completion words);
	 * CUDA 12's name, the _V1 attribute (93) is the retired API's */
	FA_CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS = 122,
	/* CUfunction_attribute */
	FA_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
	/* CUmemPool_attribute */
	FA_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
	/* flags */
	FA_CU_STREAM_NON_BLOCKING = 0x1,
	FA_CU_EVENT_DISABLE_TIMING = 0x2,
	FA_CU_EVENT_INTERPROCESS = 0x4,
	FA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1,
	FA_CU_MEMHOSTREGISTER_PORTABLE = 0x1,
	FA_CU_MEMHOSTALLOC_PORTABLE = 0x1,
	FA_CU_MEMHOSTALLOC_DEVICEMAP = 0x2,
	/* CUstreamWaitValue_flags: GEQ is (int64_t)(*addr - value) >= 0 */
	FA_CU_STREAM_WAIT_VALUE_GEQ = 0x0,
	/* CUstreamWriteValue_flags: DEFAULT fences the stream's earlier writes before the word;
	 * NO_MEMORY_BARRIER does not (and the _v2 entry points this table holds refuse it) */
	FA_CU_STREAM_WRITE_VALUE_DEFAULT = 0x0,
	FA_CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER = 0x1,
	/* virtual memory management: CUmemAllocationType, CUmemAllocationHandleType,
	 * CUmemLocationType, CUmemAccess_flags, CUmemAllocationGranularity_flags */
	FA_CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
	FA_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
	FA_CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
	FA_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
	FA_CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
	FA_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1,
	/* CUresult values the callers test for */
	FA_CU_ERROR_INVALID_VALUE = 1,
	FA_CU_ERROR_OUT_OF_MEMORY = 2,
};

/* ---- the entry points ----------------------------------------------------------------------- */

/* X(name, parameters): the driver's cu<name>, with its CUDA 12.0 prototype (every one returns a
 * CUresult). The union of what the daemon, kernels/, libfaclient and the tests call. */
#define FA_CU_ENTRY_POINTS(X)                                                                     \
	X(Init, (unsigned flags))                                                                 \
	X(DriverGetVersion, (int *version))                                                       \
	X(GetErrorString, (fa_cu_res r, const char **text))                                       \
	X(GetErrorName, (fa_cu_res r, const char **name))                                         \
	X(DeviceGetCount, (int *count))                                                           \
	X(DeviceGet, (fa_cu_dev *dev, int ordinal))                                               \
	X(DeviceGetAttribute, (int *value, int attribute, fa_cu_dev dev))                         \
	X(DeviceGetName, (char *name, int len, fa_cu_dev dev))                                    \
	X(DeviceGetUuid, (uint8_t uuid[16], fa_cu_dev dev)) /* CUuuid: 16 bytes */                \
	X(DevicePrimaryCtxRetain, (fa_cu_ctx *ctx, fa_cu_dev dev))                                \
	X(DevicePrimaryCtxRelease, (fa_cu_dev dev))                                               \
	X(DeviceGetDefaultMemPool, (fa_cu_pool *pool, fa_cu_dev dev))                             \
	X(CtxSetCurrent, (fa_cu_ctx ctx))                                                         \
	X(CtxGetCurrent, (fa_cu_ctx *ctx))                                                        \
	X(CtxPushCurrent, (fa_cu_ctx ctx))                                                        \
	X(CtxPopCurrent, (fa_cu_ctx *ctx))                                                        \
	X(CtxSynchronize, (void))                                                                 \
	X(ModuleLoadData, (fa_cu_mod *mod, const void *image))                                    \
	X(ModuleUnload, (fa_cu_mod mod))                                                          \
	X(ModuleGetFunction, (fa_cu_func *func, fa_cu_mod mod, const char *name))                 \
	X(FuncSetAttribute, (fa_cu_func func, int attribute, int value))                          \
	X(LaunchKernel, (fa_cu_func func, unsigned gx, unsigned gy, unsigned gz, unsigned bx,     \
	                 unsigned by, unsigned bz, unsigned smem, fa_cu_stream stream,            \
	                 void **params, void **extra))                                            \
	X(LaunchHostFunc, (fa_cu_stream stream, void (*fn)(void *), void *arg))                   \
	X(PointerGetAttribute, (void *data, int attribute, fa_cu_ptr p))                          \
	X(MemGetAddressRange, (fa_cu_ptr *base, size_t *size, fa_cu_ptr p))                       \
	X(MemGetInfo, (size_t *free_bytes, size_t *total_bytes))                                  \
	X(MemAlloc, (fa_cu_ptr *p, size_t bytes))                                                 \
	X(MemFree, (fa_cu_ptr p))                                                                 \
	X(MemAllocAsync, (fa_cu_ptr *p, size_t bytes, fa_cu_stream stream))                       \
	X(MemFreeAsync, (fa_cu_ptr p, fa_cu_stream stream))                                       \
	X(MemPoolSetAttribute, (fa_cu_pool pool, int attribute, void *value))                     \
	X(MemHostAlloc, (void **p, size_t bytes, unsigned flags))                                 \
	X(MemHostGetDevicePointer, (fa_cu_ptr *p, void *host, unsigned flags))                    \
	X(MemFreeHost, (void *p))                                                                 \
	X(MemHostRegister, (void *p, size_t bytes, unsigned flags))                               \
	X(MemHostUnregister, (void *p))                                                           \
	X(MemcpyHtoD, (fa_cu_ptr dst, const void *src, size_t bytes))                             \
	X(MemcpyDtoH, (void *dst, fa_cu_ptr src, size_t bytes))                                   \
	X(MemcpyHtoDAsync, (fa_cu_ptr dst, const void *src, size_t bytes, fa_cu_stream stream))   \
	X(MemcpyDtoHAsync, (void *dst, fa_cu_ptr src, size_t bytes, fa_cu_stream stream))         \
	X(MemsetD8, (fa_cu_ptr dst, unsigned char value, size_t bytes))                           \
	X(MemsetD8Async, (fa_cu_ptr dst, unsigned char value, size_t bytes, fa_cu_stream stream)) \
	X(IpcGetMemHandle, (struct fa_cu_ipc_handle *handle, fa_cu_ptr p))                        \
	X(IpcOpenMemHandle, (fa_cu_ptr *p, struct fa_cu_ipc_handle handle, unsigned flags))       \
	X(IpcCloseMemHandle, (fa_cu_ptr p))                                                       \
	X(MemGetAllocationGranularity, (size_t *granularity, const struct fa_cu_mem_prop *prop,   \
	                                int option))                                              \
	X(MemCreate, (fa_cu_mem_handle *h, size_t bytes, const struct fa_cu_mem_prop *prop,       \
	              unsigned long long flags))                                                  \
	X(MemRelease, (fa_cu_mem_handle h))                                                       \
	X(MemAddressReserve, (fa_cu_ptr *p, size_t bytes, size_t alignment, fa_cu_ptr addr,       \
	                      unsigned long long flags))                                          \
	X(MemAddressFree, (fa_cu_ptr p, size_t bytes))                                            \
	X(MemMap, (fa_cu_ptr p, size_t bytes, size_t offset, fa_cu_mem_handle h,                  \
	           unsigned long long flags))                                                     \
	X(MemUnmap, (fa_cu_ptr p, size_t bytes))                                                  \
	X(MemSetAccess, (fa_cu_ptr p, size_t bytes, const struct fa_cu_mem_access *desc,          \
	                 size_t count))                                                           \
	X(MemExportToShareableHandle, (void *shareable, fa_cu_mem_handle h, int type,             \
	                               unsigned long long flags))                                 \
	X(MemImportFromShareableHandle, (fa_cu_mem_handle *h, void *os_handle, int type))         \
	X(StreamCreate, (fa_cu_stream *stream, unsigned flags))                                   \
	X(StreamCreateWithPriority, (fa_cu_stream *stream, unsigned flags, int priority))         \
	X(CtxGetStreamPriorityRange, (int *least, int *greatest))                                 \
	X(StreamDestroy, (fa_cu_stream stream))                                                   \
	X(StreamSynchronize, (fa_cu_stream stream))                                               \
	X(StreamGetCtx, (fa_cu_stream stream, fa_cu_ctx *ctx))                                    \
	X(StreamWaitEvent, (fa_cu_stream stream, fa_cu_event event, unsigned flags))              \
	X(StreamWaitValue32, (fa_cu_stream stream, fa_cu_ptr addr, uint32_t value,                \
	                      unsigned flags))                                                    \
	X(StreamWriteValue32, (fa_cu_stream stream, fa_cu_ptr addr, uint32_t value,               \
	                       unsigned flags))                                                   \
	X(StreamQuery, (fa_cu_stream stream))                                                     \
	X(StreamWaitValue64, (fa_cu_stream stream, fa_cu_ptr addr, uint64_t value,                \
	                      unsigned flags))                                                    \
	X(StreamWriteValue64, (fa_cu_stream stream, fa_cu_ptr addr, uint64_t value,               \
	                       unsigned flags))                                                   \
	X(EventCreate, (fa_cu_event *event, unsigned flags))                                      \
	X(EventDestroy, (fa_cu_event event))                                                      \
	X(EventRecord, (fa_cu_event event, fa_cu_stream stream))                                  \
	X(EventSynchronize, (fa_cu_event event))                                                  \
	X(EventElapsedTime, (float *ms, fa_cu_event start, fa_cu_event end))                     \
	X(IpcGetEventHandle, (struct fa_cu_ipc_handle *handle, fa_cu_event event))                \
	X(IpcOpenEventHandle, (fa_cu_event *event, struct fa_cu_ipc_handle handle))

/* The table: field X is the driver's cuX. Every field is set once fa_cu_load returned FA_OK. */
struct fa_cu_api {
#define FA_CU_FIELD_(name, params) fa_cu_res(*name) params;
	FA_CU_ENTRY_POINTS(FA_CU_FIELD_)
#undef FA_CU_FIELD_
};

/* The one table (static storage, read-only to callers). Call through it only after fa_cu_load
 * returned FA_OK: before, its fields are NULL, and after a failed load they may be. */
extern const struct fa_cu_api *const fa_cu;

/* Load the driver, once per process: dlopen libcuda.so.1, every entry point of struct fa_cu_api
 * through cuGetProcAddress_v2 (CUDA 12.0 ABI), then cuInit(0). The answer is kept: later calls
 * return it at once and a failed load is never retried. Thread-safe. Returns FA_OK, or
 * FA_ENOGPU (no driver, a driver older than CUDA 12, an entry point missing, cuInit failed: no
 * device, or a broken installation) with the reason in fa_cu_why(). Never crashes without a
 * driver. */
fa_status fa_cu_load(void);

/* Why the load failed, one line without a newline ("no CUDA driver: libcuda.so.1 cannot be
 * loaded (...)"); "" when it succeeded or was not tried. Static storage; valid after fa_cu_load
 * returned. */
const char *fa_cu_why(void);

/* The driver's description of r (cuGetErrorString), or "unknown CUDA error" when the driver is
 * not loaded or does not know r. Static storage, never NULL. */
const char *fa_cu_errstr(fa_cu_res r);

/* The name of r ("CUDA_ERROR_ILLEGAL_ADDRESS"): the driver's (cuGetErrorName), else this
 * file's own for the codes fa_cu.c lists, else "CUDA_ERROR_UNRECOGNISED". Static storage, never
 * NULL. */
const char *fa_cu_errname(fa_cu_res r);

/* Does r poison the context for good (every later call in it fails the same way)? The faults of
 * ARCHITECTURE.md "GPU context and faults" (illegal address 700, assert 710, 714-719) and the
 * other errors cuda.h documents as leaving the context unusable: ECC_UNCORRECTABLE 214,
 * NVLINK_UNCORRECTABLE 220, CONTAINED 226, LAUNCH_TIMEOUT 702, CONTEXT_IS_DESTROYED 709,
 * TENSOR_MEMORY_LEAK 721, UNKNOWN 999. Every other error concerns one call only. */
bool fa_cu_sticky(fa_cu_res r);

#endif /* FA_CU_H */
