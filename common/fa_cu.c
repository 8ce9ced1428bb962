/* fa_cu.c - the CUDA driver shim: the one loader of libcuda.so.1 (see fa_cu.h). */
#include "fa_cu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#ifdef FA_HAVE_CUDA_HEADERS
#include <cuda.h>
#endif

/* X(code, name, sticky): the codes this file can name without the driver, and which of them
 * poison the context. The sticky set is the one the GPU backend classified before this shim: the faults of
 * ARCHITECTURE.md (700, 710, 714-719) and the rest of cuda.h's "the context cannot be used
 * any more" list. */
#define FA_CU_ERROR_MAP(X) FA_CU_ERROR_MAP_12_0(X) FA_CU_ERROR_MAP_NEWER(X)

#define FA_CU_ERROR_MAP_12_0(X)                         \
	X(0, CUDA_SUCCESS, 0)                           \
	X(1, CUDA_ERROR_INVALID_VALUE, 0)               \
	X(2, CUDA_ERROR_OUT_OF_MEMORY, 0)               \
	X(3, CUDA_ERROR_NOT_INITIALIZED, 0)             \
	X(4, CUDA_ERROR_DEINITIALIZED, 0)               \
	X(100, CUDA_ERROR_NO_DEVICE, 0)                 \
	X(101, CUDA_ERROR_INVALID_DEVICE, 0)            \
	X(200, CUDA_ERROR_INVALID_IMAGE, 0)             \
	X(201, CUDA_ERROR_INVALID_CONTEXT, 0)           \
	X(209, CUDA_ERROR_NO_BINARY_FOR_GPU, 0)         \
	X(214, CUDA_ERROR_ECC_UNCORRECTABLE, 1)         \
	X(218, CUDA_ERROR_INVALID_PTX, 0)               \
	X(220, CUDA_ERROR_NVLINK_UNCORRECTABLE, 1)      \
	X(222, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 0)   \
	X(300, CUDA_ERROR_INVALID_SOURCE, 0)            \
	X(304, CUDA_ERROR_OPERATING_SYSTEM, 0)          \
	X(400, CUDA_ERROR_INVALID_HANDLE, 0)            \
	X(500, CUDA_ERROR_NOT_FOUND, 0)                 \
	X(600, CUDA_ERROR_NOT_READY, 0)                 \
	X(700, CUDA_ERROR_ILLEGAL_ADDRESS, 1)           \
	X(701, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 0)   \
	X(702, CUDA_ERROR_LAUNCH_TIMEOUT, 1)            \
	X(709, CUDA_ERROR_CONTEXT_IS_DESTROYED, 1)      \
	X(710, CUDA_ERROR_ASSERT, 1)                    \
	X(714, CUDA_ERROR_HARDWARE_STACK_ERROR, 1)      \
	X(715, CUDA_ERROR_ILLEGAL_INSTRUCTION, 1)       \
	X(716, CUDA_ERROR_MISALIGNED_ADDRESS, 1)        \
	X(717, CUDA_ERROR_INVALID_ADDRESS_SPACE, 1)     \
	X(718, CUDA_ERROR_INVALID_PC, 1)                \
	X(719, CUDA_ERROR_LAUNCH_FAILED, 1)             \
	X(800, CUDA_ERROR_NOT_PERMITTED, 0)             \
	X(801, CUDA_ERROR_NOT_SUPPORTED, 0)             \
	X(999, CUDA_ERROR_UNKNOWN, 1)

/* The codes newer than CUDA 12.0's cuda.h (CONTAINED: 12.4, TENSOR_MEMORY_LEAK: 12.8). */
#define FA_CU_ERROR_MAP_NEWER(X)                        \
	X(226, CUDA_ERROR_CONTAINED, 1)                 \
	X(721, CUDA_ERROR_TENSOR_MEMORY_LEAK, 1)

#ifdef FA_HAVE_CUDA_HEADERS
/* The values above and in fa_cu.h are cuda.h's (the newer codes where the header has them). */
#define FA_CU_CHECK_(code, name, sticky) \
	_Static_assert((code) == name, #name);
FA_CU_ERROR_MAP_12_0(FA_CU_CHECK_)
#if CUDA_VERSION >= 12080
FA_CU_ERROR_MAP_NEWER(FA_CU_CHECK_)
#endif
#undef FA_CU_CHECK_
#define FA_CU_SAME_(ours, theirs) _Static_assert((int)(ours) == (int)(theirs), #theirs);
FA_CU_SAME_(FA_CU_IPC_HANDLE_LEN, CU_IPC_HANDLE_SIZE)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_CONTEXT)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_IS_MANAGED)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_RANGE_SIZE)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
            CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_MAPPING_SIZE, CU_POINTER_ATTRIBUTE_MAPPING_SIZE)
FA_CU_SAME_(FA_CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR)
FA_CU_SAME_(FA_CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED)
FA_CU_SAME_(FA_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
FA_CU_SAME_(FA_CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE)
FA_CU_SAME_(FA_CU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
FA_CU_SAME_(FA_CU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
FA_CU_SAME_(FA_CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
FA_CU_SAME_(FA_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
FA_CU_SAME_(FA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
FA_CU_SAME_(FA_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
FA_CU_SAME_(FA_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
FA_CU_SAME_(FA_CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
            CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
FA_CU_SAME_(FA_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
FA_CU_SAME_(FA_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
FA_CU_SAME_(FA_CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
FA_CU_SAME_(FA_CU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING)
FA_CU_SAME_(FA_CU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING)
FA_CU_SAME_(FA_CU_EVENT_INTERPROCESS, CU_EVENT_INTERPROCESS)
FA_CU_SAME_(FA_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
FA_CU_SAME_(FA_CU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE)
FA_CU_SAME_(FA_CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTALLOC_PORTABLE)
FA_CU_SAME_(FA_CU_MEMHOSTALLOC_DEVICEMAP, CU_MEMHOSTALLOC_DEVICEMAP)
FA_CU_SAME_(FA_CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
            CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)
FA_CU_SAME_(FA_CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_GEQ)
FA_CU_SAME_(FA_CU_STREAM_WRITE_VALUE_DEFAULT, CU_STREAM_WRITE_VALUE_DEFAULT)
FA_CU_SAME_(FA_CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
FA_CU_SAME_(FA_CU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE)
FA_CU_SAME_(FA_CU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY)
#undef FA_CU_SAME_
_Static_assert(sizeof(struct fa_cu_ipc_handle) == sizeof(CUipcMemHandle) &&
               sizeof(struct fa_cu_ipc_handle) == sizeof(CUipcEventHandle) &&
               sizeof(CUuuid) == 16 && sizeof(fa_cu_ptr) == sizeof(CUdeviceptr) &&
               sizeof(fa_cu_dev) == sizeof(CUdevice) && sizeof(fa_cu_res) == sizeof(CUresult),
               "the driver's types as the 12.0 ABI passes them");
_Static_assert(sizeof(fa_cu_mem_handle) == sizeof(CUmemGenericAllocationHandle) &&
               sizeof(struct fa_cu_mem_location) == sizeof(CUmemLocation) &&
               sizeof(struct fa_cu_mem_prop) == sizeof(CUmemAllocationProp) &&
               offsetof(struct fa_cu_mem_prop, location) ==
                   offsetof(CUmemAllocationProp, location) &&
               offsetof(struct fa_cu_mem_prop, win32_metadata) ==
                   offsetof(CUmemAllocationProp, win32HandleMetaData) &&
               offsetof(struct fa_cu_mem_prop, alloc_flags) ==
                   offsetof(CUmemAllocationProp, allocFlags) &&
               sizeof(struct fa_cu_mem_access) == sizeof(CUmemAccessDesc) &&
               offsetof(struct fa_cu_mem_access, flags) == offsetof(CUmemAccessDesc, flags),
               "the virtual memory calls' structs are cuda.h's");
#endif

static struct fa_cu_api table;
const struct fa_cu_api *const fa_cu = &table;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static fa_status load_status = FA_ENOGPU; /* written in the once, read after it */
static char load_why[256];
/* GetErrorString and GetErrorName are set: the error texts read them from any thread, loaded
 * or not, so this is the one flag read outside the once's ordering. */
static atomic_bool have_texts;

/* The driver's cuGetProcAddress_v2 (12.0 ABI). */
typedef fa_cu_res (*getproc_fn)(const char *name, void **fn, int version, uint64_t flags,
                                int *status);

/* Fetch every entry point; false with load_why set when one is missing. */
static bool load_entry_points(getproc_fn getproc)
{
	int found;

#define FA_CU_GET_(name, params)                                                          \
	found = 0;                                                                        \
	if (getproc("cu" #name, (void **)&table.name, 12000, 0, &found) != 0 ||           \
	    table.name == NULL) {                                                         \
		snprintf(load_why, sizeof load_why, "the CUDA driver lacks cu" #name);    \
		return false;                                                             \
	}
	FA_CU_ENTRY_POINTS(FA_CU_GET_)
#undef FA_CU_GET_
	return true;
}

static void load(void)
{
	void *lib;
	getproc_fn getproc;
	const char *e;
	fa_cu_res r;

	if ((lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) == NULL) {
		e = dlerror();
		snprintf(load_why, sizeof load_why,
		         "no CUDA driver: libcuda.so.1 cannot be loaded (%s)", e ? e : "?");
		return;
	}
	getproc = (getproc_fn)(uintptr_t)dlsym(lib, "cuGetProcAddress_v2");
	if (getproc == NULL) {
		snprintf(load_why, sizeof load_why,
		         "CUDA driver too old: no cuGetProcAddress_v2 (CUDA 12 or newer needed)");
		dlclose(lib);
		return;
	}
	if (!load_entry_points(getproc)) {
		table = (struct fa_cu_api){0}; /* all or nothing: the contract says NULL */
		dlclose(lib);
		return;
	}
	atomic_store_explicit(&have_texts, true, memory_order_release);
	if ((r = table.Init(0)) != 0) {
		snprintf(load_why, sizeof load_why,
		         "no usable GPU: cuInit failed: CUDA error %d (%s)", r, fa_cu_errstr(r));
		return; /* the texts stay usable; the library stays loaded for them */
	}
	load_status = FA_OK;
}

fa_status fa_cu_load(void)
{
	pthread_once(&load_once, load);
	return load_status;
}

const char *fa_cu_why(void)
{
	return load_status == FA_OK ? "" : load_why;
}

const char *fa_cu_errstr(fa_cu_res r)
{
	const char *s = NULL;

	if (atomic_load_explicit(&have_texts, memory_order_acquire) &&
	    table.GetErrorString(r, &s) == 0 && s != NULL)
		return s;
	return "unknown CUDA error";
}

const char *fa_cu_errname(fa_cu_res r)
{
	const char *s = NULL;

	if (atomic_load_explicit(&have_texts, memory_order_acquire) &&
	    table.GetErrorName(r, &s) == 0 && s != NULL)
		return s;
	switch (r) {
#define FA_CU_NAME_(code, name, sticky) \
	case code:                      \
		return #name;
		FA_CU_ERROR_MAP(FA_CU_NAME_)
#undef FA_CU_NAME_
	default:
		return "CUDA_ERROR_UNRECOGNISED";
	}
}

bool fa_cu_sticky(fa_cu_res r)
{
	switch (r) {
#define FA_CU_STICKY_(code, name, sticky) \
	case code:                        \
		return sticky;
		FA_CU_ERROR_MAP(FA_CU_STICKY_)
#undef FA_CU_STICKY_
	default:
		return false;
	}
}
