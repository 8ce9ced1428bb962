/* gpu_driver.c - the CUDA driver entry points the GPU backend calls beyond fa_gpu's, loaded at
 * run time (dlopen: the daemon starts on machines without a driver), and what a result means:
 * its text, and whether it lost the context (gpu_sticky, the one classification the fatal path
 * uses; README.md "Faults"). */
#include "gpu_int.h"

#include <dlfcn.h>
#include <stdio.h>

#include "util.h"

/* The driver's name for a result. */
const char *gpu_errstr(const struct gpu_backend *b, gpu_res r)
{
	const char *s = NULL;

	if (b->cu.GetErrorString != NULL && b->cu.GetErrorString(r, &s) == 0 && s != NULL)
		return s;
	return "unknown CUDA error";
}

/* Errors after which the context is unusable (every later call returns them): cuda.h's
 * CUresult list. Everything else concerns one call only. */
bool gpu_sticky(gpu_res r)
{
	switch (r) {
	case 214: /* ECC_UNCORRECTABLE */
	case 220: /* NVLINK_UNCORRECTABLE */
	case 226: /* CONTAINED */
	case 700: /* ILLEGAL_ADDRESS */
	case 702: /* LAUNCH_TIMEOUT */
	case 709: /* CONTEXT_IS_DESTROYED */
	case 710: /* ASSERT */
	case 714: /* HARDWARE_STACK_ERROR */
	case 715: /* ILLEGAL_INSTRUCTION */
	case 716: /* MISALIGNED_ADDRESS */
	case 717: /* INVALID_ADDRESS_SPACE */
	case 718: /* INVALID_PC */
	case 719: /* LAUNCH_FAILED */
	case 721: /* TENSOR_MEMORY_LEAK */
	case 999: /* UNKNOWN */
		return true;
	default:
		return false;
	}
}

/* dlopen the driver and fetch the entry points (fa_gpu_open succeeded, so it is there). */
fa_status gpu_load_driver(struct gpu_cu *cu, char *err, size_t errlen)
{
	typedef gpu_res (*getproc_t)(const char *, void **, int, uint64_t, int *);
	getproc_t getproc;

	cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (cu->lib == NULL)
		return util_fail(err, errlen, FA_ENOGPU, "libcuda.so.1 cannot be loaded (%s)",
		                 dlerror());
	getproc = (getproc_t)(uintptr_t)dlsym(cu->lib, "cuGetProcAddress_v2");
	if (getproc == NULL)
		return util_fail(err, errlen, FA_ENOGPU, "CUDA driver too old: no cuGetProcAddress_v2");
#define GPU_SYM(field, name)                                                                   \
	do {                                                                                   \
		int st_ = 0;                                                                   \
		if (getproc(name, (void **)&cu->field, 12000, 0, &st_) != 0 ||                 \
		    cu->field == NULL)                                                         \
			return util_fail(err, errlen, FA_ENOGPU, "CUDA driver lacks %s", name); \
	} while (0)
	GPU_SYM(GetErrorString, "cuGetErrorString");
	GPU_SYM(DeviceGetCount, "cuDeviceGetCount");
	GPU_SYM(DeviceGet, "cuDeviceGet");
	GPU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	GPU_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
	GPU_SYM(CtxSetCurrent, "cuCtxSetCurrent");
	GPU_SYM(CtxSynchronize, "cuCtxSynchronize");
	GPU_SYM(StreamCreate, "cuStreamCreate");
	GPU_SYM(StreamDestroy, "cuStreamDestroy");
	GPU_SYM(StreamSynchronize, "cuStreamSynchronize");
	GPU_SYM(MemAlloc, "cuMemAlloc");
	GPU_SYM(MemFree, "cuMemFree");
	GPU_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
	GPU_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
	GPU_SYM(MemHostRegister, "cuMemHostRegister");
	GPU_SYM(MemHostUnregister, "cuMemHostUnregister");
	GPU_SYM(MemGetAddressRange, "cuMemGetAddressRange");
	GPU_SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle");
	GPU_SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle");
	GPU_SYM(MemsetD8Async, "cuMemsetD8Async");
	GPU_SYM(EventCreate, "cuEventCreate");
	GPU_SYM(EventDestroy, "cuEventDestroy");
	GPU_SYM(EventRecord, "cuEventRecord");
	GPU_SYM(EventSynchronize, "cuEventSynchronize");
	GPU_SYM(StreamWaitEvent, "cuStreamWaitEvent");
	GPU_SYM(IpcGetEventHandle, "cuIpcGetEventHandle");
	GPU_SYM(IpcOpenEventHandle, "cuIpcOpenEventHandle");
	GPU_SYM(LaunchHostFunc, "cuLaunchHostFunc");
#undef GPU_SYM
	return FA_OK;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it. */
void gpu_uuid_text(const uint8_t u[16], char out[48])
{
	static const char hex[] = "0123456789abcdef";
	char *p = out;

	p += sprintf(p, "GPU-");
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*p++ = '-';
		*p++ = hex[u[i] >> 4];
		*p++ = hex[u[i] & 15];
	}
	*p = '\0';
}
