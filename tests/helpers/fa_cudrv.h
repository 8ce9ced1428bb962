/* fa_cudrv.h - the CUDA driver for GPU-host tests and benchmarks: common/fa_cu.h's table, and
 * GPU `ordinal`'s primary context made current. Header-only; include it once per program, and
 * call fa_cu_start only in processes that never fork afterwards (CUDA does not survive fork: the
 * tests do their CUDA work in forked children, which load the driver afresh since their parent
 * never did).
 */
#ifndef FA_TEST_CUDRV_H
#define FA_TEST_CUDRV_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "fa_cu.h"
#include "fa_test.h"

typedef fa_cu_res cu_res;
typedef fa_cu_ptr cu_ptr;

/* The shim's table, copied by fa_cu_start (it never changes once loaded): the tests call cu.X. */
static struct fa_cu_api cu;

/* Load the driver (once) and make GPU `ordinal`'s primary context current on this thread (the
 * context the daemon, fa_gpu_open and libfaclient use). 0, or -1 with the reason in why. */
static inline int fa_cu_start(int ordinal, char *why, size_t cap)
{
	int dev = 0, count = 0;
	void *ctx = NULL;
	cu_res r;

	if (fa_cu_load() != FA_OK) {
		snprintf(why, cap, "%s", fa_cu_why());
		return -1;
	}
	cu = *fa_cu;
	if ((r = cu.DeviceGetCount(&count)) != 0 || count <= ordinal) {
		snprintf(why, cap, "no CUDA device %d (cuDeviceGetCount: %d devices, error %d)",
		         ordinal, count, r);
		return -1;
	}
	if ((r = cu.DeviceGet(&dev, ordinal)) != 0 ||
	    (r = cu.DevicePrimaryCtxRetain(&ctx, dev)) != 0 || (r = cu.CtxSetCurrent(ctx)) != 0) {
		snprintf(why, cap, "GPU %d's primary context: CUDA error %d (%s)", ordinal, r,
		         fa_cu_errstr(r));
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

/* Bytes to cuMemAlloc for a client's n: n rounded up to 2 MiB, as PyTorch's caching allocator
 * sizes its large segments. Another process's import of an odd-sized allocation ran the
 * kernel at 0.905-0.914x of local memory over 8 rotating sets, a rounded one at 0.999x
 * (bench_ipcmem, daemon/RESULTS.md 2026-12-03 16:53): a benchmark's clients allocate as real
 * ones do. */
static inline size_t fa_test_client_alloc_bytes(size_t n)
{
	const size_t two_mib = (size_t)2 << 20;
	return (n + two_mib - 1) / two_mib * two_mib;
}

#endif /* FA_TEST_CUDRV_H */
