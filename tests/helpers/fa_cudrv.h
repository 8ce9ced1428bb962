/* fa_cudrv.h - the CUDA driver for GPU-host tests and benchmarks, loaded with dlopen (never
 * linked: the programs build and skip on machines without CUDA). Header-only; include it once
 * per program, and call fa_cu_start only in processes that never fork afterwards (CUDA does not
 * survive fork: the tests do their CUDA work in forked children).
 *
 * One table of the entry points every GPU-host test uses (CUDA 12.0 ABI, cuGetProcAddress), so
 * the tests share one loader instead of each keeping its own.
 */
#ifndef FA_TEST_CUDRV_H
#define FA_TEST_CUDRV_H

#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "fa_test.h"

typedef int cu_res;
typedef unsigned long long cu_ptr;

static struct {
	void *lib;
	cu_res (*GetErrorString)(cu_res, const char **);
	cu_res (*Init)(unsigned);
	cu_res (*DeviceGetCount)(int *);
	cu_res (*DeviceGet)(int *, int);
	cu_res (*DeviceGetName)(char *, int, int);
	cu_res (*DeviceGetUuid)(unsigned char *, int);
	cu_res (*DevicePrimaryCtxRetain)(void **, int);
	cu_res (*CtxSetCurrent)(void *);
	cu_res (*MemAlloc)(cu_ptr *, size_t);
	cu_res (*MemFree)(cu_ptr);
	cu_res (*MemAllocAsync)(cu_ptr *, size_t, void *);
	cu_res (*MemFreeAsync)(cu_ptr, void *);
	cu_res (*MemGetInfo)(size_t *, size_t *);
	cu_res (*MemHostAlloc)(void **, size_t, unsigned);
	cu_res (*MemHostGetDevicePointer)(cu_ptr *, void *, unsigned);
	cu_res (*MemcpyHtoD)(cu_ptr, const void *, size_t);
	cu_res (*MemcpyDtoH)(void *, cu_ptr, size_t);
	cu_res (*MemcpyHtoDAsync)(cu_ptr, const void *, size_t, void *);
	cu_res (*MemcpyDtoHAsync)(void *, cu_ptr, size_t, void *);
	cu_res (*MemsetD8)(cu_ptr, unsigned char, size_t);
	cu_res (*MemsetD8Async)(cu_ptr, unsigned char, size_t, void *);
	cu_res (*StreamCreate)(void **, unsigned);
	cu_res (*StreamDestroy)(void *);
	cu_res (*StreamSynchronize)(void *);
	cu_res (*StreamWaitEvent)(void *, void *, unsigned);
	cu_res (*StreamWaitValue32)(void *, cu_ptr, uint32_t, unsigned);
	cu_res (*EventCreate)(void **, unsigned);
	cu_res (*EventRecord)(void *, void *);
	cu_res (*IpcGetMemHandle)(unsigned char *, cu_ptr); /* CUipcMemHandle: 64 bytes */
} cu;

/* The driver's text for an error code. */
static inline const char *fa_cu_text(cu_res r)
{
	const char *s = NULL;
	if (cu.GetErrorString == NULL || cu.GetErrorString(r, &s) != 0 || s == NULL)
		return "no text";
	return s;
}

/* Load the driver (once) and make GPU `ordinal`'s primary context current on this thread (the
 * context the daemon, fa_gpu_open and libfaclient use). 0, or -1 with the reason in why. */
static inline int fa_cu_start(int ordinal, char *why, size_t cap)
{
	typedef cu_res (*getproc_t)(const char *, void **, int, uint64_t, int *);
	int dev = 0, count = 0;
	void *ctx = NULL;
	cu_res r;

	if (cu.lib == NULL) {
		if ((cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) == NULL) {
			snprintf(why, cap, "libcuda.so.1 cannot be loaded: %s", dlerror());
			return -1;
		}
		getproc_t gp = (getproc_t)(uintptr_t)dlsym(cu.lib, "cuGetProcAddress_v2");
		if (gp == NULL) {
			snprintf(why, cap, "CUDA driver too old: no cuGetProcAddress_v2 (need CUDA 12+)");
			cu.lib = NULL;
			return -1;
		}
#define FA_CU_SYM(f, n)                                                                     \
	do {                                                                                \
		int st_ = 0;                                                                \
		if (gp(n, (void **)&cu.f, 12000, 0, &st_) != 0 || cu.f == NULL) {           \
			snprintf(why, cap, "the CUDA driver has no %s", n);                 \
			cu.lib = NULL;                                                      \
			return -1;                                                          \
		}                                                                           \
	} while (0)
		FA_CU_SYM(GetErrorString, "cuGetErrorString");
		FA_CU_SYM(Init, "cuInit");
		FA_CU_SYM(DeviceGetCount, "cuDeviceGetCount");
		FA_CU_SYM(DeviceGet, "cuDeviceGet");
		FA_CU_SYM(DeviceGetName, "cuDeviceGetName");
		FA_CU_SYM(DeviceGetUuid, "cuDeviceGetUuid");
		FA_CU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
		FA_CU_SYM(CtxSetCurrent, "cuCtxSetCurrent");
		FA_CU_SYM(MemAlloc, "cuMemAlloc");
		FA_CU_SYM(MemFree, "cuMemFree");
		FA_CU_SYM(MemAllocAsync, "cuMemAllocAsync");
		FA_CU_SYM(MemFreeAsync, "cuMemFreeAsync");
		FA_CU_SYM(MemGetInfo, "cuMemGetInfo");
		FA_CU_SYM(MemHostAlloc, "cuMemHostAlloc");
		FA_CU_SYM(MemHostGetDevicePointer, "cuMemHostGetDevicePointer");
		FA_CU_SYM(MemcpyHtoD, "cuMemcpyHtoD");
		FA_CU_SYM(MemcpyDtoH, "cuMemcpyDtoH");
		FA_CU_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
		FA_CU_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
		FA_CU_SYM(MemsetD8, "cuMemsetD8");
		FA_CU_SYM(MemsetD8Async, "cuMemsetD8Async");
		FA_CU_SYM(StreamCreate, "cuStreamCreate");
		FA_CU_SYM(StreamDestroy, "cuStreamDestroy");
		FA_CU_SYM(StreamSynchronize, "cuStreamSynchronize");
		FA_CU_SYM(StreamWaitEvent, "cuStreamWaitEvent");
		FA_CU_SYM(StreamWaitValue32, "cuStreamWaitValue32");
		FA_CU_SYM(EventCreate, "cuEventCreate");
		FA_CU_SYM(EventRecord, "cuEventRecord");
		FA_CU_SYM(IpcGetMemHandle, "cuIpcGetMemHandle");
#undef FA_CU_SYM
	}
	if ((r = cu.Init(0)) != 0) {
		snprintf(why, cap, "cuInit: CUDA error %d (%s)", r, fa_cu_text(r));
		return -1;
	}
	if ((r = cu.DeviceGetCount(&count)) != 0 || count <= ordinal) {
		snprintf(why, cap, "no CUDA device %d (cuDeviceGetCount: %d devices, error %d)",
		         ordinal, count, r);
		return -1;
	}
	if ((r = cu.DeviceGet(&dev, ordinal)) != 0 ||
	    (r = cu.DevicePrimaryCtxRetain(&ctx, dev)) != 0 || (r = cu.CtxSetCurrent(ctx)) != 0) {
		snprintf(why, cap, "GPU %d's primary context: CUDA error %d (%s)", ordinal, r,
		         fa_cu_text(r));
		return -1;
	}
	return 0;
}

/* In a child's function: fail it (return 1) with the place, the condition and a message. */
#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__,   \
			        #cond);                                                    \
			fprintf(stderr, __VA_ARGS__);                                      \
			fputc('\n', stderr);                                               \
			return 1;                                                          \
		}                                                                          \
	} while (0)

/* Run fn(arg) in a forked child, with GPU `ordinal`'s context made current first (ordinal < 0:
 * fn starts CUDA itself). Returns its exit code (0 = pass; 90: CUDA would not start), or -1
 * when it ran past timeout_ms (it is killed). Says so on stderr when it did not pass. */
static inline int fa_cu_in_child(int (*fn)(void *), void *arg, int timeout_ms, int ordinal)
{
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p < 0)
		return -1;
	if (p == 0) {
		char why[256];
		if (ordinal >= 0 && fa_cu_start(ordinal, why, sizeof why) != 0) {
			fprintf(stderr, "child: cannot start CUDA: %s\n", why);
			_exit(90);
		}
		_exit(fn(arg));
	}
	int code = fa_test_waitpid(p, fa_test_ms(timeout_ms));
	if (code < 0) {
		fprintf(stderr, "child %d ran past %d ms: killed\n", (int)p, fa_test_ms(timeout_ms));
		kill(p, SIGKILL);
		fa_test_waitpid(p, 5000);
	} else if (code != 0) {
		fprintf(stderr, "child %d ended with %d\n", (int)p, code);
	}
	return code;
}

#endif /* FA_TEST_CUDRV_H */
