/* test_gpu_serving.c - the real fa-daemon on its GPU backend, end to end: device buffers (CUDA
 * IPC) and host buffers give the float64 reference's results; memory IPC cannot export, bad
 * offsets, short buffers and forged handles get clear statuses and the daemon keeps serving;
 * four client processes at once; register/unregister cycles leak no device memory.
 *
 * CUDA does not survive fork(): the test process itself never initialises it (not even through
 * have_gpu()). Every piece of CUDA work runs in a forked child that loads libcuda.so.1 with
 * dlopen (tiny wrappers below) and reports through its exit code; the parent only starts the
 * daemon and checks statuses. Without a GPU every test skips with the reason.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"
#include "fa_raw.h"

#define NPROC 4
#define LEAD 4096 /* device buffers start this far into their allocation (the offset is sent) */
#define CYCLES 200
#define CYCLE_BYTES (4u << 20)

static struct fa_daemon g_daemon;
static bool g_no_gpu;
static char g_skip_why[256];

/* ---- the CUDA driver, loaded here (never linked) --------------------------------------------- */

typedef int cu_res;
typedef unsigned long long cu_ptr;

static struct {
	void *lib;
	cu_res (*Init)(unsigned);
	cu_res (*DeviceGet)(int *, int);
	cu_res (*DeviceGetUuid)(unsigned char *, int);
	cu_res (*DevicePrimaryCtxRetain)(void **, int);
	cu_res (*CtxSetCurrent)(void *);
	cu_res (*MemAlloc)(cu_ptr *, size_t);
	cu_res (*MemFree)(cu_ptr);
	cu_res (*MemAllocAsync)(cu_ptr *, size_t, void *);
	cu_res (*MemFreeAsync)(cu_ptr, void *);
	cu_res (*StreamSynchronize)(void *);
	cu_res (*MemcpyHtoD)(cu_ptr, const void *, size_t);
	cu_res (*MemcpyDtoH)(void *, cu_ptr, size_t);
	cu_res (*MemGetInfo)(size_t *, size_t *);
} cu;

/* Load the driver, make GPU 0's primary context current (in a child). 0 or -1. */
static int cu_start(void)
{
	typedef cu_res (*getproc_t)(const char *, void **, int, uint64_t, int *);
	int dev = 0;
	void *ctx = NULL;

	if ((cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) == NULL)
		return -1;
	getproc_t gp = (getproc_t)(uintptr_t)dlsym(cu.lib, "cuGetProcAddress_v2");
	if (gp == NULL)
		return -1;
#define SYM(f, n)                                                                       \
	do {                                                                            \
		int st_ = 0;                                                            \
		if (gp(n, (void **)&cu.f, 12000, 0, &st_) != 0 || cu.f == NULL) {       \
			fprintf(stderr, "cuda: no %s\n", n);                            \
			return -1;                                              \
		}                                                                       \
	} while (0)
	SYM(Init, "cuInit");
	SYM(DeviceGet, "cuDeviceGet");
	SYM(DeviceGetUuid, "cuDeviceGetUuid");
	SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
	SYM(CtxSetCurrent, "cuCtxSetCurrent");
	SYM(MemAlloc, "cuMemAlloc");
	SYM(MemFree, "cuMemFree");
	SYM(MemAllocAsync, "cuMemAllocAsync");
	SYM(MemFreeAsync, "cuMemFreeAsync");
	SYM(StreamSynchronize, "cuStreamSynchronize");
	SYM(MemcpyHtoD, "cuMemcpyHtoD");
	SYM(MemcpyDtoH, "cuMemcpyDtoH");
	SYM(MemGetInfo, "cuMemGetInfo");
#undef SYM
	if (cu.Init(0) != 0 || cu.DeviceGet(&dev, 0) != 0 ||
	    cu.DevicePrimaryCtxRetain(&ctx, dev) != 0 || cu.CtxSetCurrent(ctx) != 0)
		return -1;
	return 0;
}

/* ---- children ----------------------------------------------------------------------------------- */

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

typedef int (*child_fn)(void *arg);

/* Run fn in a child process (CUDA started there); its exit code, or -1 after a timeout. */
static int in_child(child_fn fn, void *arg, int timeout_ms)
{
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p < 0)
		return -1;
	if (p == 0) {
		if (cu_start() != 0) {
			fprintf(stderr, "child: cannot start CUDA\n");
			_exit(90);
		}
		_exit(fn(arg));
	}
	int code = fa_test_waitpid(p, fa_test_ms(timeout_ms));
	if (code < 0) {
		kill(p, SIGKILL);
		fa_test_waitpid(p, 5000);
	}
	return code;
}

/* A client on the test daemon, with a generous timeout (the first call of a kernel compiles). */
static fa_client *open_client(void)
{
	fa_client *c = NULL;
	if (fa_client_open(&c, g_daemon.url) != FA_OK)
		return NULL;
	fa_client_set_timeout(c, fa_test_ms(60000));
	return c;
}

/* One case in device memory: allocate (LEAD bytes in), upload, register, run, download, check.
 * *us gets the fa_attn_fwd call's wall time when not NULL. */
static int dev_case(fa_client *c, const struct fa_case *cs, uint64_t *rng, double *us)
{
	struct fa_case_layout l;
	char why[256], desc[256];
	cu_ptr mem = 0;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	fa_status st;
	double err = 0;

	fa_case_layout(cs, &l);
	fa_case_describe(cs, desc, sizeof desc);
	char *host = malloc(l.total);
	CHECK(host != NULL, "malloc");
	CHECK(cu.MemAlloc(&mem, LEAD + l.total) == 0, "cuMemAlloc %zu", l.total);
	fa_case_fill(cs, &l, host, rng);
	CHECK(cu.MemcpyHtoD(mem + LEAD, host, l.total) == 0, "upload");
	st = fa_buffer_register_device(c, (void *)(uintptr_t)(mem + LEAD), l.total, &b);
	CHECK(st == FA_OK, "register_device: %s (%s)", fa_status_name(st), fa_last_error_detail());
	CHECK(fa_buffer_data(b) == (void *)(uintptr_t)(mem + LEAD), "fa_buffer_data");
	fa_case_args(cs, &l, b, &a);
	uint64_t t0 = fa_test_now_us();
	st = fa_attn_fwd(c, &a);
	if (us)
		*us = (double)(fa_test_now_us() - t0);
	CHECK(st == FA_OK, "%s: fa_attn_fwd: %s (%s)", desc, fa_status_name(st),
	      fa_last_error_detail());
	CHECK(cu.MemcpyDtoH(host, mem + LEAD, l.total) == 0, "download");
	CHECK(fa_case_check(cs, &l, host, &err, why, sizeof why), "%s: %s", desc, why);
	CHECK(fa_buffer_free(b) == FA_OK, "fa_buffer_free: %s", fa_last_error_detail());
	CHECK(cu.MemFree(mem) == 0, "cuMemFree");
	free(host);
	fprintf(stderr, "  device %s: rel error %.3g\n", desc, err);
	return 0;
}

/* The shapes and dtypes every correctness test runs. */
static const struct fa_case cases[] = {
	{.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 128, .Sk = 128, .Hq = 8, .Hkv = 2, .D = 64,
	 .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .lse = true},
	{.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 77, .Sk = 200, .Hq = 4, .Hkv = 4, .D = 128,
	 .bhsd = true, .pad = 8},
	{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 64, .Sk = 96, .Hq = 2, .Hkv = 1, .D = 32,
	 .lse = true},
	{.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 1, .Sk = 512, .Hq = 8, .Hkv = 2, .D = 128,
	 .lse = true},
	{.dtype = FA_DTYPE_FP16, .B = 3, .Sq = 33, .Sk = 65, .Hq = 6, .Hkv = 3, .D = 256,
	 .mask = FA_MASK_CAUSAL_TOP_LEFT},
};
#define NCASES (sizeof cases / sizeof cases[0])

static int child_device_cases(void *arg)
{
	(void)arg;
	uint64_t rng = 0x9e3779b97f4a7c15u;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open: %s", fa_last_error_detail());
	for (size_t i = 0; i < NCASES; i++)
		if (dev_case(c, &cases[i], &rng, NULL) != 0)
			return 1;
	fa_client_close(c);
	return 0;
}

static int child_host_cases(void *arg)
{
	(void)arg;
	uint64_t rng = 0x1234567u;
	fa_buffer *buf = NULL;
	char why[256], desc[256];
	double err;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	for (size_t i = 0; i < NCASES; i++) {
		fa_case_describe(&cases[i], desc, sizeof desc);
		CHECK(fa_integ_run_case(c, &buf, &cases[i], &rng, NULL, &err, why, sizeof why),
		      "host %s: %s", desc, why);
		fprintf(stderr, "  host %s: rel error %.3g\n", desc, err);
	}
	fa_buffer_free(buf);
	fa_client_close(c);
	return 0;
}

/* Median per-request latency of one mid-size shape, device buffers vs host buffers. */
static int child_latency(void *arg)
{
	(void)arg;
	const struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 1024, .Sk = 1024,
	                           .Hq = 16, .Hkv = 16, .D = 128};
	enum { N = 30 };
	struct fa_case_layout l;
	double tdev[N], thost[N];
	uint64_t rng = 7;
	cu_ptr mem = 0;
	fa_buffer *db = NULL, *hb = NULL;
	fa_attn_fwd_args a;
	fa_status st;

	fa_case_layout(&cs, &l);
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	char *host = malloc(l.total);
	CHECK(host != NULL && cu.MemAlloc(&mem, l.total) == 0, "alloc");
	fa_case_fill(&cs, &l, host, &rng);
	CHECK(cu.MemcpyHtoD(mem, host, l.total) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)mem, l.total, &db) == FA_OK, "%s",
	      fa_last_error_detail());
	CHECK(fa_buffer_alloc_host(c, l.total, &hb) == FA_OK, "%s", fa_last_error_detail());
	memcpy(fa_buffer_data(hb), host, l.total);
	for (int round = 0; round < 2; round++) {
		fa_buffer *b = round == 0 ? db : hb;
		double *t = round == 0 ? tdev : thost;
		fa_case_args(&cs, &l, b, &a);
		CHECK((st = fa_attn_fwd(c, &a)) == FA_OK, "warm-up: %s (%s)", fa_status_name(st),
		      fa_last_error_detail());
		for (int i = 0; i < N; i++) {
			uint64_t t0 = fa_test_now_us();
			CHECK((st = fa_attn_fwd(c, &a)) == FA_OK, "%s", fa_last_error_detail());
			t[i] = (double)(fa_test_now_us() - t0);
		}
	}
	double flops = fa_case_flops(&cs);
	double md = fa_test_percentile(tdev, N, 50), mh = fa_test_percentile(thost, N, 50);
	fprintf(stderr,
	        "latency bf16 B=1 S=1024 H=16 D=128 (%.1f MB of Q/K/V/O): device buffers p50 %.0f us "
	        "(%.1f TFLOP/s end to end), p90 %.0f us; host buffers p50 %.0f us (%.1f TFLOP/s), "
	        "p90 %.0f us\n",
	        (double)l.total / 1e6, md, flops / md * 1e-6, fa_test_percentile(tdev, N, 90), mh,
	        flops / mh * 1e-6, fa_test_percentile(thost, N, 90));
	/* The result is right as well (once, on the device copy). */
	char why[256];
	CHECK(cu.MemcpyDtoH(host, mem, l.total) == 0, "download");
	CHECK(fa_case_check(&cs, &l, host, NULL, why, sizeof why), "%s", why);
	fa_buffer_free(db);
	fa_buffer_free(hb);
	cu.MemFree(mem);
	free(host);
	fa_client_close(c);
	return 0;
}

/* Memory of a stream-ordered pool cannot be exported: FA_EIPC, naming the pool. */
static int child_pool(void *arg)
{
	(void)arg;
	cu_ptr p = 0;
	fa_buffer *b = NULL;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	CHECK(cu.MemAllocAsync(&p, 1 << 20, NULL) == 0 && cu.StreamSynchronize(NULL) == 0,
	      "cuMemAllocAsync");
	fa_status st = fa_buffer_register_device(c, (void *)(uintptr_t)p, 1 << 20, &b);
	CHECK(st == FA_EIPC, "got %s (%s)", fa_status_name(st), fa_last_error_detail());
	CHECK(b == NULL, "out set on failure");
	CHECK(strstr(fa_last_error_detail(), "cudaMallocAsync") != NULL, "detail: %s",
	      fa_last_error_detail());
	fprintf(stderr, "  pool memory: %s\n", fa_last_error_detail());
	cu.MemFreeAsync(p, NULL);
	cu.StreamSynchronize(NULL);
	/* A host pointer is no device pointer. */
	char local[64];
	st = fa_buffer_register_device(c, local, sizeof local, &b);
	CHECK(st == FA_EINVAL, "host pointer: %s", fa_status_name(st));
	fa_client_close(c);
	return 0;
}

/* Misaligned offset -> FA_EALIGN; tensor past the buffer -> FA_ERANGE; a range leaving its
 * allocation -> FA_EINVAL at registration. */
static int child_bad_layouts(void *arg)
{
	(void)arg;
	const struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 64, .Sk = 64, .Hq = 2,
	                           .Hkv = 2, .D = 64};
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_buffer *b = NULL;
	cu_ptr mem = 0;
	fa_status st;

	fa_case_layout(&cs, &l);
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	CHECK(cu.MemAlloc(&mem, l.total + 4096) == 0, "cuMemAlloc");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)mem, l.total + 4096, &b) == FA_OK,
	      "%s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	a.q.offset += 8; /* element-aligned, not 16-byte aligned */
	st = fa_attn_fwd(c, &a);
	CHECK(st == FA_EALIGN, "misaligned: %s (%s)", fa_status_name(st), fa_last_error_detail());
	fprintf(stderr, "  misaligned: %s\n", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	a.o.offset = l.total + 4096 - 64; /* o runs past the end */
	st = fa_attn_fwd(c, &a);
	CHECK(st == FA_ERANGE, "too small: %s (%s)", fa_status_name(st), fa_last_error_detail());
	fa_buffer_free(b);
	b = NULL;
	/* A buffer declared larger than its allocation is refused before anything is sent. */
	st = fa_buffer_register_device(c, (void *)(uintptr_t)(mem + 4096), l.total + 4096, &b);
	CHECK(st == FA_EINVAL, "past the allocation: %s", fa_status_name(st));
	fprintf(stderr, "  past the allocation: %s\n", fa_last_error_detail());
	/* The daemon still serves this session. */
	uint64_t rng = 3;
	CHECK(dev_case(c, &cs, &rng, NULL) == 0, "after the errors");
	cu.MemFree(mem);
	fa_client_close(c);
	return 0;
}

/* A made-up handle, and a real-looking one of another GPU: clear statuses, daemon unharmed. */
static int child_forged(void *arg)
{
	(void)arg;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	uint64_t rng = 0xf0f0f0f0u;
	int dev = 0;
	unsigned char uuid[16];

	CHECK(cu.DeviceGet(&dev, 0) == 0 && cu.DeviceGetUuid(uuid, dev) == 0, "uuid");
	int s = fa_raw_open(g_daemon.url, fa_test_ms(20000));
	CHECK(s >= 0, "fa_raw_open");
	uint64_t sid = fa_raw_hello(s, 1, &rep);
	CHECK(sid != 0, "hello");
	for (int round = 0; round < 2; round++) {
		memset(&req, 0, sizeof req);
		req.op = FA_OP_REGISTER;
		req.session = sid;
		req.seq = 2 + (uint64_t)round;
		req.u.reg.kind = FA_REGION_CUDA_IPC;
		req.u.reg.size = 1 << 20;
		fa_fill_bytes(req.u.reg.ipc_handle, sizeof req.u.reg.ipc_handle, &rng);
		if (round == 0)
			memcpy(req.u.reg.gpu_uuid, uuid, 16);
		else
			fa_fill_bytes(req.u.reg.gpu_uuid, 16, &rng);
		int st = fa_raw_call(s, &req, &rep);
		CHECK(st != FA_OK && st != FA_RAW_NO_REPLY && st > 0, "forged handle %d: status %d",
		      round, st);
		CHECK(rep.detail[0] != '\0', "no detail");
		CHECK(round == 0 || st == FA_ENOTSUP, "wrong GPU: %s", fa_status_name(st));
		fprintf(stderr, "  forged handle (%s): %s: %s\n", round ? "other GPU" : "this GPU",
		        fa_status_name(st), rep.detail);
	}
	fa_raw_simple(s, FA_OP_BYE, sid, 10, &rep);
	nn_close(s);
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open after the forged handles");
	CHECK(dev_case(c, &cases[0], &rng, NULL) == 0, "serving after the forged handles");
	fa_client_close(c);
	return 0;
}

/* One of NPROC processes: a few device cases. */
static int child_multi(void *arg)
{
	int proc = *(int *)arg;
	uint64_t rng = 0xabcdefu + (uint64_t)proc;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	for (size_t i = 0; i < NCASES; i++)
		if (dev_case(c, &cases[(i + (size_t)proc) % NCASES], &rng, NULL) != 0)
			return 1;
	fa_client_close(c);
	return 0;
}

/* CYCLES x (cuMemAlloc, register, run nothing, unregister, cuMemFree): the daemon's mappings
 * are closed, so the client's free device memory comes back. */
static int child_cycles(void *arg)
{
	(void)arg;
	size_t free0 = 0, free1 = 0, total = 0;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	for (int i = -1; i < CYCLES; i++) {
		cu_ptr p = 0;
		fa_buffer *b = NULL;
		if (i == 0)
			CHECK(cu.MemGetInfo(&free0, &total) == 0, "cuMemGetInfo");
		CHECK(cu.MemAlloc(&p, CYCLE_BYTES) == 0, "cuMemAlloc (cycle %d)", i);
		fa_status st = fa_buffer_register_device(c, (void *)(uintptr_t)p, CYCLE_BYTES, &b);
		CHECK(st == FA_OK, "cycle %d: %s (%s)", i, fa_status_name(st),
		      fa_last_error_detail());
		CHECK(fa_buffer_free(b) == FA_OK, "cycle %d: free: %s", i, fa_last_error_detail());
		CHECK(cu.MemFree(p) == 0, "cuMemFree (cycle %d)", i);
	}
	CHECK(cu.MemGetInfo(&free1, &total) == 0, "cuMemGetInfo");
	long long diff = (long long)free0 - (long long)free1;
	fprintf(stderr, "  %d register/unregister cycles of %u MiB: free device memory %+lld bytes\n",
	        CYCLES, CYCLE_BYTES >> 20, -diff);
	CHECK(diff <= 2ll << 20, "free device memory dropped by %lld bytes", diff);
	fa_client_close(c);
	return 0;
}

/* ---- tests ---------------------------------------------------------------------------------------- */

#define SKIP_WITHOUT_GPU()                                                                  \
	do {                                                                                \
		if (g_no_gpu) {                                                             \
			fprintf(stderr, "skipped: %s\n", g_skip_why);                       \
			skip();                                                             \
		}                                                                           \
	} while (0)

static void test_gpu_stats_say_backend_gpu(void **state)
{
	(void)state;
	char text[16384], v[128];
	SKIP_WITHOUT_GPU();
	assert_int_equal(fa_integ_stats(g_daemon.url, text, sizeof text), FA_OK);
	assert_true(fa_stats_get(text, "backend", v, sizeof v));
	assert_string_equal(v, "gpu");
	assert_true(strstr(text, "# gpu\n") != NULL);
	assert_true(fa_stats_get(text, "gpu_name", v, sizeof v));
	fprintf(stderr, "  gpu_name:%s\n", v);
	assert_true(fa_stats_get(text, "gpu_sm", v, sizeof v) && atoi(v) >= 80);
	assert_true(fa_stats_get(text, "gpu_smem_optin", v, sizeof v) && atoi(v) > 0);
}

static void test_gpu_device_buffers_match_reference(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_device_cases, NULL, 180000), 0);
}

static void test_gpu_host_buffers_match_reference(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_host_cases, NULL, 180000), 0);
}

static void test_gpu_latency_device_vs_host_buffers(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_latency, NULL, 180000), 0);
}

static void test_gpu_pool_memory_is_refused_with_eipc(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_pool, NULL, 60000), 0);
}

static void test_gpu_bad_offsets_and_sizes_get_ealign_erange(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_bad_layouts, NULL, 60000), 0);
}

static void test_gpu_forged_handle_gets_an_error_and_daemon_serves_on(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_forged, NULL, 60000), 0);
	assert_true(daemon_alive(&g_daemon));
}

static void test_gpu_four_processes_with_device_buffers(void **state)
{
	(void)state;
	pid_t pids[NPROC];
	int bad = 0;
	SKIP_WITHOUT_GPU();
	fflush(stderr);
	for (int p = 0; p < NPROC; p++) {
		pids[p] = fork();
		assert_true(pids[p] >= 0);
		if (pids[p] == 0) {
			if (cu_start() != 0)
				_exit(90);
			_exit(child_multi(&p));
		}
	}
	for (int p = 0; p < NPROC; p++) {
		int code = fa_test_waitpid(pids[p], fa_test_ms(180000));
		if (code != 0) {
			fprintf(stderr, "client process %d ended with %d\n", p, code);
			if (code < 0)
				kill(pids[p], SIGKILL), fa_test_waitpid(pids[p], 5000);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
	uint64_t v;
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "regions", 0, fa_test_ms(10000), &v));
}

static void test_gpu_register_cycles_leave_device_memory_unchanged(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_cycles, NULL, 180000), 0);
}

/* ---- setup ---------------------------------------------------------------------------------------- */

/* have_gpu() initialises CUDA: ask in a child so this process stays fork-safe. */
static int child_have_gpu(void)
{
	fflush(stderr);
	pid_t p = fork();
	if (p < 0)
		return 0;
	if (p == 0)
		_exit(have_gpu() ? 0 : 1);
	return fa_test_waitpid(p, fa_test_ms(60000)) == 0;
}

static int setup(void **state)
{
	(void)state;
	if (!child_have_gpu()) {
		g_no_gpu = true;
		snprintf(g_skip_why, sizeof g_skip_why,
		         "no GPU (libcuda.so.1 cannot be loaded or sees no device)");
		fprintf(stderr, "test_gpu_serving: every test skips: %s\n", g_skip_why);
		return 0;
	}
	int r = daemon_start(&g_daemon, "--backend", "gpu", NULL);
	if (r != 0) {
		fprintf(stderr, "daemon_start --backend gpu: %d (status %d)\n", r, g_daemon.status);
		daemon_log_dump(&g_daemon, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (g_no_gpu)
		return 0;
	return daemon_finish(&g_daemon);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gpu_stats_say_backend_gpu),
		cmocka_unit_test(test_gpu_device_buffers_match_reference),
		cmocka_unit_test(test_gpu_host_buffers_match_reference),
		cmocka_unit_test(test_gpu_latency_device_vs_host_buffers),
		cmocka_unit_test(test_gpu_pool_memory_is_refused_with_eipc),
		cmocka_unit_test(test_gpu_bad_offsets_and_sizes_get_ealign_erange),
		cmocka_unit_test(test_gpu_forged_handle_gets_an_error_and_daemon_serves_on),
		cmocka_unit_test(test_gpu_four_processes_with_device_buffers),
		cmocka_unit_test(test_gpu_register_cycles_leave_device_memory_unchanged),
	};
	if (getenv("FA_TEST_FILTER"))
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
