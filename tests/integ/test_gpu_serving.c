/* test_gpu_serving.c - the real fa-daemon on its GPU backend, end to end: device buffers (CUDA
 * IPC) and host buffers give the float64 reference's results; memory IPC cannot export, bad
 * offsets, short buffers and forged handles get clear statuses and the daemon keeps serving;
 * four client processes at once; 1,000 register/unregister cycles of 256 MiB leak no device
 * memory; a client SIGKILLed while its kernel runs leaves no region, session or device memory
 * behind; stale handles (freed memory, an exited client's) get FA_EINVAL; O through a second
 * registration of one allocation at Q's bytes gets FA_EOVERLAP; another process's live
 * handle registers and its unregistration leaves the owner's mapping alone; the autotuner (the
 * daemon's background tuning and `fa-ctl tune`) fills a table that a restarted daemon loads; the
 * backward pass (ATTN_BWD) in device and host buffers gives the float64 oracle's gradients, and
 * its deterministic mode the same bits twice, with a sliding window and softcap too.
 *
 * CUDA does not survive fork(): the test process itself never initialises it (not even through
 * have_gpu()). Every piece of CUDA work runs in a forked child that loads the CUDA driver
 * (common/fa_cu.h; tiny wrappers below) and reports through its exit code; the parent only
 * starts the daemon and checks statuses. Without a GPU every test skips with the reason.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_bwd_case.h"
#include "fa_cudrv.h"
#include "fa_gpu_oracle.h"
#include "fa_integ.h"
#include "fa_raw.h"
#include "fa_tune.h"

#define NPROC 4
#define LEAD 4096 /* device buffers start this far into their allocation (the offset is sent) */
#define CYCLES 1000
#define CYCLE_BYTES (256u << 20) /* reliability.md 4.4: 1,000 cycles of 256 MiB buffers */
/* Free device memory compared before and after (cuMemGetInfo) may differ by allocator
 * granularity (2 MiB pages) and the driver's page tables; every buffer these checks watch is
 * 256 MiB or more, so one leaked mapping is far beyond it. */
#define FREE_SLACK (8ll << 20)
#define MIB(x) ((double)(x) / (1 << 20))

static struct fa_daemon g_daemon;
static bool g_no_gpu;
static char g_skip_why[256];

/* What children hand back beyond their exit code: a MAP_SHARED page mapped before any fork. */
struct shared {
	size_t free_bytes; /* child_free_now's and child_free_back's last cuMemGetInfo */
	size_t want_free;  /* child_free_back waits until free >= want_free - FREE_SLACK */
	unsigned char handle[FA_PROTO_IPC_HANDLE_LEN]; /* child_owner's allocation, exported */
	unsigned char uuid[FA_PROTO_UUID_LEN];         /* ... and its GPU */
	uint64_t alloc_size;
};
static struct shared *g_sh;

/* ---- the CUDA driver (tests/helpers/fa_cudrv.h), loaded in children ------------------------------ */

/* Load the driver, make GPU 0's primary context current (in a child). 0 or -1. */
static int cu_start(void)
{
	char why[256];
	if (fa_cu_start(0, why, sizeof why) != 0) {
		fprintf(stderr, "cuda: %s\n", why);
		return -1;
	}
	return 0;
}

/* ---- children -------------------------------------------------------------------------------- */

typedef int (*child_fn)(void *arg);

/* Run fn in a child process (CUDA started there); its exit code, or -1 after a timeout. */
static int in_child(child_fn fn, void *arg, int timeout_ms)
{
	return fa_cu_in_child(fn, arg, timeout_ms, 0); /* GPU 0 current in the child */
}

/* A client on the daemon at url, with a generous timeout (the first call of a kernel compiles). */
static fa_client *open_client_at(const char *url)
{
	fa_client *c = NULL;
	fa_status st = fa_client_open(&c, url);
	if (st != FA_OK) {
		fprintf(stderr, "fa_client_open(%s): %s (%s)\n", url, fa_status_name(st),
		        fa_last_error_detail());
		return NULL;
	}
	fa_client_set_timeout(c, fa_test_ms(60000));
	return c;
}

/* A client on the test daemon. */
static fa_client *open_client(void)
{
	return open_client_at(g_daemon.url);
}

/* One case in device buffer b (registered, its memory at fa_buffer_data(b)): random inputs
 * uploaded, run, downloaded, checked. *us gets the fa_attn_fwd call's wall time when not NULL. */
static int dev_run(fa_client *c, const struct fa_case *cs, fa_buffer *b, uint64_t *rng, double *us)
{
	struct fa_case_layout l;
	char why[256], desc[256];
	fa_attn_fwd_args a;
	fa_status st;
	double err = 0;
	cu_ptr mem = (cu_ptr)(uintptr_t)fa_buffer_data(b);

	fa_case_layout(cs, &l);
	fa_case_describe(cs, desc, sizeof desc);
	CHECK(fa_buffer_size(b) >= l.total, "%s: buffer of %zu bytes, case needs %zu", desc,
	      fa_buffer_size(b), l.total);
	char *host = malloc(l.total);
	CHECK(host != NULL, "malloc");
	fa_case_fill(cs, &l, host, rng);
	/* a pageable upload may return before its DMA lands: the API asks Q/K/V finished */
	CHECK(cu.MemcpyHtoD(mem, host, l.total) == 0 && cu.StreamSynchronize(NULL) == 0, "upload");
	fa_case_args(cs, &l, b, &a);
	uint64_t t0 = fa_test_now_us();
	st = fa_attn_fwd(c, &a);
	if (us)
		*us = (double)(fa_test_now_us() - t0);
	CHECK(st == FA_OK, "%s: fa_attn_fwd: %s (%s)", desc, fa_status_name(st),
	      fa_last_error_detail());
	CHECK(cu.MemcpyDtoH(host, mem, l.total) == 0, "download");
	CHECK(fa_case_check(cs, &l, host, &err, why, sizeof why), "%s: %s", desc, why);
	free(host);
	fprintf(stderr, "  device %s: rel error %.3g\n", desc, err);
	return 0;
}

/* One case in fresh device memory: allocate (LEAD bytes in), register, dev_run, unregister,
 * free. */
static int dev_case(fa_client *c, const struct fa_case *cs, uint64_t *rng, double *us)
{
	struct fa_case_layout l;
	cu_ptr mem = 0;
	fa_buffer *b = NULL;
	fa_status st;

	fa_case_layout(cs, &l);
	CHECK(cu.MemAlloc(&mem, LEAD + l.total) == 0, "cuMemAlloc %zu", l.total);
	st = fa_buffer_register_device(c, (void *)(uintptr_t)(mem + LEAD), l.total, &b);
	CHECK(st == FA_OK, "register_device: %s (%s)", fa_status_name(st), fa_last_error_detail());
	CHECK(fa_buffer_data(b) == (void *)(uintptr_t)(mem + LEAD), "fa_buffer_data");
	if (dev_run(c, cs, b, rng, us) != 0)
		return 1;
	st = fa_buffer_free(b);
	CHECK(st == FA_OK, "fa_buffer_free: %s (%s)", fa_status_name(st), fa_last_error_detail());
	CHECK(cu.MemFree(mem) == 0, "cuMemFree");
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

/* ---- the backward pass ------------------------------------------------------------------------ */


/* The backward's shapes: the seed's case (fp32 D=128 causal), fp32 D=256, GQA and MQA, Sq != Sk,
 * odd lengths, both layouts, padding, each dtype. */
static const struct fa_case bwd_cases[] = {
	{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 129, .Sk = 129, .Hq = 2, .Hkv = 2, .D = 128,
	 .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT},
	{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 65, .Sk = 33, .Hq = 2, .Hkv = 1, .D = 256},
	{.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 127, .Sk = 200, .Hq = 8, .Hkv = 2, .D = 64,
	 .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT},
	{.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 77, .Sk = 129, .Hq = 4, .Hkv = 4, .D = 128,
	 .bhsd = true, .pad = 8, .mask = FA_MASK_CAUSAL_TOP_LEFT},
	{.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 1, .Sk = 512, .Hq = 8, .Hkv = 2, .D = 128},
	{.dtype = FA_DTYPE_FP16, .B = 2, .Sq = 17, .Sk = 1000, .Hq = 4, .Hkv = 1, .D = 40},
};
#define NBWD (sizeof bwd_cases / sizeof bwd_cases[0])

/* Poison dq, dk and dv in host (the case's layout). */
static void bwd_poison(const struct fa_case *cs, const struct fa_bwd_layout *l, char *host)
{
	fa_case_poison_dt(host + l->dq_off, cs->dtype, (size_t)l->f.q_span);
	fa_case_poison_dt(host + l->dk_off, cs->dtype, (size_t)l->f.kv_span);
	fa_case_poison_dt(host + l->dv_off, cs->dtype, (size_t)l->f.kv_span);
}

/* Forward then backward in buffer b (mem: its device memory; 0: a host buffer), checked against
 * the oracle; with `twice`, in the deterministic mode, and again on re-poisoned gradients, which
 * must come back the same bits. win (NULL: none): the sliding window and softcap both calls get
 * (its window and softcap fields), and the oracle with them. */
static int bwd_run_win(fa_client *c, const struct fa_case *cs, fa_buffer *b, cu_ptr mem,
                       bool twice, const struct fa_attn_fwd_desc *win, uint64_t *rng)
{
	struct fa_bwd_layout l;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	char why[256], desc[256];
	double err[3] = {0};
	fa_status st;

	fa_bwd_layout(cs, &l);
	fa_case_describe(cs, desc, sizeof desc);
	CHECK(fa_buffer_size(b) >= l.total, "buffer of %zu, case needs %zu", fa_buffer_size(b),
	      l.total);
	size_t gbytes = l.total - l.dq_off; /* dq, dk, dv and their padding */
	char *host = mem ? malloc(l.total) : fa_buffer_data(b);
	unsigned char *first = malloc(gbytes);
	CHECK(host != NULL && first != NULL, "malloc");
	fa_bwd_fill(cs, &l, host, rng);
	if (mem)
		CHECK(cu.MemcpyHtoD(mem, host, l.total) == 0 && cu.StreamSynchronize(NULL) == 0,
		      "upload");
	fa_bwd_args(cs, &l, b, twice ? FA_BWD_DETERMINISTIC : 0, &fa, &ba);
	if (win) {
		fa.window = ba.window = win->window;
		fa.window_left = ba.window_left = win->window_left;
		fa.window_right = ba.window_right = win->window_right;
		fa.softcap = ba.softcap = win->softcap;
		char *end = desc + strlen(desc);
		snprintf(end, sizeof desc - (size_t)(end - desc), " window %d (%lld, %lld) softcap %g",
		         (int)win->window, (long long)win->window_left, (long long)win->window_right,
		         win->softcap);
	}
	st = fa_attn_fwd(c, &fa);
	CHECK(st == FA_OK, "%s: fa_attn_fwd: %s (%s)", desc, fa_status_name(st),
	      fa_last_error_detail());
	for (int run = 0; run < (twice ? 2 : 1); run++) {
		if (run == 1) {
			bwd_poison(cs, &l, host);
			if (mem)
				CHECK(cu.MemcpyHtoD(mem + l.dq_off, host + l.dq_off, gbytes) == 0 &&
				          cu.StreamSynchronize(NULL) == 0,
				      "upload");
		}
		st = fa_attn_bwd(c, &ba);
		CHECK(st == FA_OK, "%s: fa_attn_bwd: %s (%s)", desc, fa_status_name(st),
		      fa_last_error_detail());
		if (mem)
			CHECK(cu.MemcpyDtoH(host, mem, l.total) == 0, "download");
		if (run == 0) {
			CHECK(fa_bwd_check_win(cs, &l, host, win, 0, err, why, sizeof why), "%s: %s", desc,
			      why);
			fprintf(stderr, "  backward %s %s%s: dq %.2e dk %.2e dv %.2e\n",
			        mem ? "device" : "host", desc, twice ? " deterministic" : "", err[0],
			        err[1], err[2]);
			memcpy(first, host + l.dq_off, gbytes);
		} else {
			CHECK(memcmp(first, host + l.dq_off, gbytes) == 0,
			      "%s: the deterministic mode gave other bits the second time", desc);
		}
	}
	free(first);
	if (mem)
		free(host);
	return 0;
}

static int bwd_run(fa_client *c, const struct fa_case *cs, fa_buffer *b, cu_ptr mem, bool twice,
                   uint64_t *rng)
{
	return bwd_run_win(c, cs, b, mem, twice, NULL, rng);
}

/* Every backward case in device buffers (LEAD bytes into their allocation) and in a host buffer,
 * both modes. */
static int child_bwd_cases(void *arg)
{
	(void)arg;
	uint64_t rng = 0xb4c4a3dull;
	fa_buffer *hb = NULL;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open: %s", fa_last_error_detail());
	for (size_t i = 0; i < NBWD; i++) {
		struct fa_bwd_layout l;
		cu_ptr mem = 0;
		fa_buffer *b = NULL;
		fa_bwd_layout(&bwd_cases[i], &l);
		CHECK(cu.MemAlloc(&mem, LEAD + l.total) == 0, "cuMemAlloc %zu", l.total);
		fa_status st = fa_buffer_register_device(c, (void *)(uintptr_t)(mem + LEAD), l.total, &b);
		CHECK(st == FA_OK, "register_device: %s (%s)", fa_status_name(st),
		      fa_last_error_detail());
		for (int det = 0; det < 2; det++) {
			int r = bwd_run(c, &bwd_cases[i], b, mem + LEAD, det == 1, &rng);
			if (r != 0)
				return r;
		}
		CHECK(fa_buffer_free(b) == FA_OK, "fa_buffer_free");
		CHECK(cu.MemFree(mem) == 0, "cuMemFree");
		CHECK(fa_integ_buffer(c, &hb, l.total) == FA_OK, "host buffer of %zu", l.total);
		int r = bwd_run(c, &bwd_cases[i], hb, 0, i % 2 == 1, &rng);
		if (r != 0)
			return r;
	}
	fa_buffer_free(hb);
	fa_client_close(c);
	return 0;
}

/* The backward with a sliding window and softcap (attn_bwd.cu's FA_WIN, FA_SOFTCAP): the GPU
 * backend serves it (FA_OK, not FA_ENOTSUP) in device and host buffers, both modes, and the
 * gradients are the oracle's with the same window and softcap. */
static const struct {
	struct fa_case c;
	struct fa_attn_fwd_desc win; /* its window and softcap fields */
} bwd_win_cases[] = {
	{{.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 300, .Sk = 300, .Hq = 8, .Hkv = 2, .D = 64},
	 {.window = true, .window_left = 64, .window_right = 0}},
	{{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 129, .Sk = 200, .Hq = 4, .Hkv = 2, .D = 128,
	  .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT},
	 {.window = true, .window_left = 32, .window_right = -1, .softcap = 5.0}},
	/* Sq > Sk: the first rows' windows hold no key */
	{{.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 200, .Sk = 77, .Hq = 2, .Hkv = 1, .D = 40,
	  .bhsd = true, .pad = 8},
	 {.window = true, .window_left = 10, .window_right = 10}},
	{{.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 256, .Sk = 256, .Hq = 4, .Hkv = 4, .D = 128,
	  .mask = FA_MASK_CAUSAL_TOP_LEFT},
	 {.softcap = 20.0}},
};
#define NBWD_WIN (sizeof bwd_win_cases / sizeof bwd_win_cases[0])

static int child_bwd_window_cases(void *arg)
{
	(void)arg;
	uint64_t rng = 0xb4c4a3eull;
	fa_buffer *hb = NULL;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open: %s", fa_last_error_detail());
	for (size_t i = 0; i < NBWD_WIN; i++) {
		const struct fa_case *cs = &bwd_win_cases[i].c;
		const struct fa_attn_fwd_desc *w = &bwd_win_cases[i].win;
		struct fa_bwd_layout l;
		cu_ptr mem = 0;
		fa_buffer *b = NULL;
		fa_bwd_layout(cs, &l);
		CHECK(cu.MemAlloc(&mem, LEAD + l.total) == 0, "cuMemAlloc %zu", l.total);
		fa_status st = fa_buffer_register_device(c, (void *)(uintptr_t)(mem + LEAD), l.total, &b);
		CHECK(st == FA_OK, "register_device: %s (%s)", fa_status_name(st),
		      fa_last_error_detail());
		for (int det = 0; det < 2; det++) {
			int r = bwd_run_win(c, cs, b, mem + LEAD, det == 1, w, &rng);
			if (r != 0)
				return r;
		}
		CHECK(fa_buffer_free(b) == FA_OK, "fa_buffer_free");
		CHECK(cu.MemFree(mem) == 0, "cuMemFree");
		CHECK(fa_integ_buffer(c, &hb, l.total) == FA_OK, "host buffer of %zu", l.total);
		int r = bwd_run_win(c, cs, hb, 0, i % 2 == 1, w, &rng);
		if (r != 0)
			return r;
	}
	fa_buffer_free(hb);
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
	/* a pageable upload may return before its DMA lands: the API asks Q/K/V finished */
	CHECK(cu.MemcpyHtoD(mem, host, l.total) == 0 && cu.StreamSynchronize(NULL) == 0, "upload");
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

/* CYCLES x (cuMemAlloc 256 MiB, register, unregister, cuMemFree): the daemon closes each
 * mapping, so free device memory comes back (watched for a moment: the driver may hand freed pages
 * back a little later). Prints what each step costs. */
static int child_cycles(void *arg)
{
	(void)arg;
	size_t free0 = 0, free1 = 0, total = 0;
	uint64_t start = 0, t, t_alloc = 0, t_reg = 0, t_unreg = 0, t_free = 0;
	long long drop;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	for (int i = -1; i < CYCLES; i++) { /* cycle -1 warms up (driver, daemon, allocator) */
		cu_ptr p = 0;
		fa_buffer *b = NULL;
		fa_status st;
		cu_res r;
		if (i == 0) {
			CHECK((r = cu.MemGetInfo(&free0, &total)) == 0, "cuMemGetInfo: CUDA error %d", r);
			start = fa_test_now_us();
			t_alloc = t_reg = t_unreg = t_free = 0;
		}
		t = fa_test_now_us();
		r = cu.MemAlloc(&p, CYCLE_BYTES);
		CHECK(r == 0, "cycle %d: cuMemAlloc(%u MiB): CUDA error %d", i, CYCLE_BYTES >> 20, r);
		t_alloc += fa_test_now_us() - t;
		t = fa_test_now_us();
		st = fa_buffer_register_device(c, (void *)(uintptr_t)p, CYCLE_BYTES, &b);
		CHECK(st == FA_OK, "cycle %d: fa_buffer_register_device: %s (%s)", i,
		      fa_status_name(st), fa_last_error_detail());
		t_reg += fa_test_now_us() - t;
		t = fa_test_now_us();
		st = fa_buffer_free(b);
		CHECK(st == FA_OK, "cycle %d: fa_buffer_free: %s (%s)", i, fa_status_name(st),
		      fa_last_error_detail());
		t_unreg += fa_test_now_us() - t;
		t = fa_test_now_us();
		r = cu.MemFree(p);
		CHECK(r == 0, "cycle %d: cuMemFree: CUDA error %d", i, r);
		t_free += fa_test_now_us() - t;
	}
	double secs = (double)(fa_test_now_us() - start) / 1e6;
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(5000);
	for (;;) {
		cu_res r = cu.MemGetInfo(&free1, &total);
		CHECK(r == 0, "cuMemGetInfo: CUDA error %d", r);
		drop = (long long)free0 - (long long)free1;
		if (drop <= FREE_SLACK || fa_test_now_ms() >= deadline)
			break;
		fa_test_sleep_ms(20);
	}
	fprintf(stderr,
	        "  %d register/unregister cycles of %u MiB in %.2f s; per cycle: cuMemAlloc %.0f us, "
	        "register %.0f us, unregister %.0f us, cuMemFree %.0f us; free device memory "
	        "%+.1f MiB (%.0f MiB free of %.0f)\n",
	        CYCLES, CYCLE_BYTES >> 20, secs, (double)t_alloc / CYCLES, (double)t_reg / CYCLES,
	        (double)t_unreg / CYCLES, (double)t_free / CYCLES, -MIB(drop), MIB(free1),
	        MIB(total));
	CHECK(drop <= FREE_SLACK,
	      "free device memory dropped by %.1f MiB over %d cycles: mappings left open?",
	      MIB(drop), CYCLES);
	fa_client_close(c);
	return 0;
}

/* ---- device memory seen from a fresh process ------------------------------------------------- */

/* cuMemGetInfo's free bytes into g_sh->free_bytes. This child's own context is included; every
 * child's is the same size, so two children's figures compare. */
static int child_free_now(void *arg)
{
	size_t total = 0;
	(void)arg;
	cu_res r = cu.MemGetInfo(&g_sh->free_bytes, &total);
	CHECK(r == 0, "cuMemGetInfo: CUDA error %d", r);
	return 0;
}

/* Wait (bounded) until free device memory is back to g_sh->want_free within FREE_SLACK: a dead
 * process's memory and the daemon's closed mappings come back shortly after, not at once. */
static int child_free_back(void *arg)
{
	size_t total = 0;
	long long drop;
	(void)arg;
	uint64_t t0 = fa_test_now_ms(), deadline = t0 + (uint64_t)fa_test_ms(5000);
	for (;;) {
		cu_res r = cu.MemGetInfo(&g_sh->free_bytes, &total);
		CHECK(r == 0, "cuMemGetInfo: CUDA error %d", r);
		drop = (long long)g_sh->want_free - (long long)g_sh->free_bytes;
		if (drop <= FREE_SLACK || fa_test_now_ms() >= deadline)
			break;
		fa_test_sleep_ms(20);
	}
	fprintf(stderr, "  free device memory: %.1f MiB before, %.1f MiB now (%+.1f MiB; %llu ms)\n",
	        MIB(g_sh->want_free), MIB(g_sh->free_bytes), -MIB(drop),
	        (unsigned long long)(fa_test_now_ms() - t0));
	CHECK(drop <= FREE_SLACK, "free device memory stays %.1f MiB below where it started",
	      MIB(drop));
	return 0;
}

/* After something bad happened to another client: a fresh client gets right results. */
static int child_serves(void *arg)
{
	(void)arg;
	uint64_t rng = 0x600d;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	CHECK(dev_case(c, &cases[0], &rng, NULL) == 0, "serving: %s", "case 0");
	CHECK(dev_case(c, &cases[3], &rng, NULL) == 0, "serving: %s", "case 3");
	fa_client_close(c);
	return 0;
}

/* ---- a client killed while its kernel runs --------------------------------------------------- */

/* bf16 B=4 S=16384 H=16 D=128: 8.8 TFLOP, some 20-50 ms a request on an H200; 1 GiB of Q, K,
 * V, O (256 MiB each). No reference check (the CPU would take hours): only the daemon's handling
 * of a death under it matters here. */
static const struct fa_case big = {.dtype = FA_DTYPE_BF16, .B = 4, .Sq = 16384, .Sk = 16384,
                                   .Hq = 16, .Hkv = 16, .D = 128};

/* The big case's device buffer, every byte 0x3c (bf16 0.0115: finite inputs), registered. */
static int big_buffer(fa_client *c, cu_ptr *mem, fa_buffer **b, fa_attn_fwd_args *a)
{
	struct fa_case_layout l;
	fa_status st;
	cu_res r;

	fa_case_layout(&big, &l);
	r = cu.MemAlloc(mem, l.total);
	CHECK(r == 0, "cuMemAlloc(%zu): CUDA error %d", l.total, r);
	r = cu.MemsetD8(*mem, 0x3c, l.total);
	CHECK(r == 0, "cuMemsetD8: CUDA error %d", r);
	st = fa_buffer_register_device(c, (void *)(uintptr_t)*mem, l.total, b);
	CHECK(st == FA_OK, "fa_buffer_register_device(%zu bytes): %s (%s)", l.total,
	      fa_status_name(st), fa_last_error_detail());
	fa_case_args(&big, &l, *b, a);
	return 0;
}

/* The big case twice (its kernel compiled and loaded before any memory is measured), timed. */
static int child_big_once(void *arg)
{
	(void)arg;
	cu_ptr mem = 0;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	fa_status st;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	if (big_buffer(c, &mem, &b, &a) != 0)
		return 1;
	for (int i = 0; i < 2; i++) {
		uint64_t t0 = fa_test_now_us();
		st = fa_attn_fwd(c, &a);
		CHECK(st == FA_OK, "big case, run %d: fa_attn_fwd: %s (%s)", i, fa_status_name(st),
		      fa_last_error_detail());
		fprintf(stderr, "  bf16 B=4 S=16384 H=16 D=128: request %d took %.1f ms%s\n", i,
		        (double)(fa_test_now_us() - t0) / 1e3, i == 0 ? " (the compile included)" : "");
	}
	st = fa_buffer_free(b);
	CHECK(st == FA_OK, "fa_buffer_free: %s (%s)", fa_status_name(st), fa_last_error_detail());
	CHECK(cu.MemFree(mem) == 0, "cuMemFree");
	fa_client_close(c);
	return 0;
}

/* The victim: the big case in a loop, so a request is always in flight, after one byte on w.
 * SIGKILLed by the parent while a kernel runs; returns only on an error. */
static int victim(int w)
{
	cu_ptr mem = 0;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	char ch = 'G';
	fa_client *c = open_client();
	CHECK(c != NULL, "victim: fa_client_open");
	fa_client_set_timeout(c, 0);
	if (big_buffer(c, &mem, &b, &a) != 0)
		return 1;
	CHECK(fa_test_write_all(w, &ch, 1) == 0, "victim: write");
	for (unsigned long n = 0;; n++) {
		fa_status st = fa_attn_fwd(c, &a);
		CHECK(st == FA_OK, "victim: request %lu: %s (%s)", n, fa_status_name(st),
		      fa_last_error_detail());
	}
}

/* ---- handles of other processes, stale handles ----------------------------------------------- */

/* UNREGISTER on a raw session; the reply's status. */
static int raw_unregister(int s, uint64_t sid, uint64_t seq, uint64_t region,
                          struct fa_proto_rep *rep)
{
	struct fa_proto_req req;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_UNREGISTER;
	req.session = sid;
	req.seq = seq;
	req.u.unreg.region = region;
	return fa_raw_call(s, &req, rep);
}

/* A raw session registers handle (uuid, size) and, should that work, unregisters it again; the
 * REGISTER's status, its detail into why. Says BYE and closes the socket either way. */
static int raw_try_register(const unsigned char *handle, const unsigned char *uuid,
                            uint64_t size, char *why, size_t whycap)
{
	struct fa_proto_rep rep;
	int s = fa_raw_open(g_daemon.url, fa_test_ms(20000));
	if (s < 0) {
		snprintf(why, whycap, "fa_raw_open(%s) failed", g_daemon.url);
		return FA_RAW_NO_REPLY;
	}
	uint64_t sid = fa_raw_hello(s, 1, &rep);
	if (sid == 0) {
		snprintf(why, whycap, "HELLO failed: %.200s", rep.detail);
		nn_close(s);
		return FA_RAW_NO_REPLY;
	}
	int st = fa_raw_register_ipc(s, sid, 2, handle, uuid, size, NULL, &rep);
	snprintf(why, whycap, "%s", rep.detail);
	if (st == FA_OK)
		raw_unregister(s, sid, 3, rep.u.reg.region, &rep);
	fa_raw_simple(s, FA_OP_BYE, sid, 4, &rep);
	nn_close(s);
	return st;
}

/* Memory freed before it is registered: the library refuses the freed pointer before anything
 * is sent (cuPointerGetAttribute fails: FA_EINVAL), and the daemon refuses the handle taken
 * before the free when it is sent raw (cuIpcOpenMemHandle fails: FA_EINVAL with the driver's
 * error). The same client is served right afterwards. */
static int child_stale(void *arg)
{
	enum { SIZE = 4 << 20 };
	unsigned char h[FA_PROTO_IPC_HANDLE_LEN], uuid[FA_PROTO_UUID_LEN];
	char why[FA_PROTO_DETAIL_MAX];
	uint64_t rng = 0x5151;
	fa_buffer *b = NULL;
	cu_ptr p = 0;
	int dev = 0;
	cu_res r;
	(void)arg;

	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	CHECK((r = cu.MemAlloc(&p, SIZE)) == 0, "cuMemAlloc: CUDA error %d", r);
	CHECK((r = cu.IpcGetMemHandle((struct fa_cu_ipc_handle *)h, p)) == 0,
	      "cuIpcGetMemHandle: CUDA error %d", r);
	CHECK(cu.DeviceGet(&dev, 0) == 0 && cu.DeviceGetUuid(uuid, dev) == 0, "uuid");
	CHECK((r = cu.MemFree(p)) == 0, "cuMemFree: CUDA error %d", r);

	fa_status st = fa_buffer_register_device(c, (void *)(uintptr_t)p, SIZE, &b);
	fprintf(stderr, "  freed pointer: %s: %s\n", fa_status_name(st), fa_last_error_detail());
	CHECK(st == FA_EINVAL, "freed pointer: got %s (%s), want FA_EINVAL", fa_status_name(st),
	      fa_last_error_detail());
	CHECK(b == NULL, "out set on failure");

	int rst = raw_try_register(h, uuid, SIZE, why, sizeof why);
	fprintf(stderr, "  handle of freed memory, sent raw: %s (%d): %s\n",
	        fa_status_name((fa_status)rst), rst, why);
	CHECK(rst == FA_EINVAL, "handle of freed memory: got %s (%d: %s), want FA_EINVAL",
	      fa_status_name((fa_status)rst), rst, why);
	CHECK(dev_case(c, &cases[0], &rng, NULL) == 0, "serving after the stale handle");
	fa_client_close(c);
	return 0;
}

/* One allocation registered twice in one session (the whole of it, and a part LEAD bytes in):
 * the daemon opens the same handle twice, and the driver counts the opens, so unregistering the
 * first leaves the second mapped: a case on it computes right. */
static int child_same_allocation_twice(void *arg)
{
	struct fa_case_layout l;
	fa_buffer *whole = NULL, *part = NULL;
	uint64_t rng = 0x2222;
	cu_ptr mem = 0;
	fa_status st;
	cu_res r;
	(void)arg;

	fa_case_layout(&cases[0], &l);
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	CHECK((r = cu.MemAlloc(&mem, LEAD + l.total)) == 0, "cuMemAlloc: CUDA error %d", r);
	st = fa_buffer_register_device(c, (void *)(uintptr_t)mem, LEAD + l.total, &whole);
	CHECK(st == FA_OK, "register the whole: %s (%s)", fa_status_name(st),
	      fa_last_error_detail());
	st = fa_buffer_register_device(c, (void *)(uintptr_t)(mem + LEAD), l.total, &part);
	CHECK(st == FA_OK, "register a part: %s (%s)", fa_status_name(st), fa_last_error_detail());
	st = fa_buffer_free(whole);
	CHECK(st == FA_OK, "unregister the whole: %s (%s)", fa_status_name(st),
	      fa_last_error_detail());
	CHECK(dev_run(c, &cases[0], part, &rng, NULL) == 0, "%s",
	      "a case on the part after the whole was unregistered");
	st = fa_buffer_free(part);
	CHECK(st == FA_OK, "unregister the part: %s (%s)", fa_status_name(st),
	      fa_last_error_detail());
	CHECK((r = cu.MemFree(mem)) == 0, "cuMemFree: CUDA error %d", r);
	fa_client_close(c);
	return 0;
}

/* One allocation registered twice (a part LEAD bytes in, and the whole): both registrations map
 * the same memory, so O in the whole at Q's bytes in the part is refused with FA_EOVERLAP and
 * nothing is written; O at its own bytes through the whole computes right. */
static int child_same_allocation_output_over_input(void *arg)
{
	struct fa_case_layout l;
	fa_buffer *part = NULL, *whole = NULL;
	fa_attn_fwd_args a;
	uint64_t rng = 0x3333;
	cu_ptr mem = 0;
	fa_status st;
	cu_res r;
	char why[256];
	double err = 0;
	(void)arg;

	fa_case_layout(&cases[0], &l);
	size_t n = LEAD + l.total;
	unsigned char *host = malloc(n), *after = malloc(n);
	CHECK(host != NULL && after != NULL, "malloc");
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	CHECK((r = cu.MemAlloc(&mem, n)) == 0, "cuMemAlloc: CUDA error %d", r);
	st = fa_buffer_register_device(c, (void *)(uintptr_t)(mem + LEAD), l.total, &part);
	CHECK(st == FA_OK, "register a part: %s (%s)", fa_status_name(st), fa_last_error_detail());
	st = fa_buffer_register_device(c, (void *)(uintptr_t)mem, n, &whole);
	CHECK(st == FA_OK, "register the whole: %s (%s)", fa_status_name(st),
	      fa_last_error_detail());
	memset(host, 0, LEAD);
	fa_case_fill(&cases[0], &l, host + LEAD, &rng);
	CHECK(cu.MemcpyHtoD(mem, host, n) == 0 && cu.StreamSynchronize(NULL) == 0, "upload");

	fa_case_args(&cases[0], &l, part, &a);
	a.o.buf = whole;
	a.o.offset = LEAD + l.q_off; /* q's first byte, through the other registration */
	st = fa_attn_fwd(c, &a);
	CHECK(st == FA_EOVERLAP, "O at Q's bytes through a second registration: %s (%s)",
	      fa_status_name(st), fa_last_error_detail());
	CHECK(strstr(fa_last_error_detail(), "o overlaps q: regions") != NULL &&
	          strstr(fa_last_error_detail(), "map the same memory") != NULL,
	      "detail: %s", fa_last_error_detail());
	CHECK(cu.MemcpyDtoH(after, mem, n) == 0, "download");
	CHECK(memcmp(host, after, n) == 0, "%s", "the refused request wrote the allocation");

	a.o.offset = LEAD + l.o_off; /* o's own bytes */
	st = fa_attn_fwd(c, &a);
	CHECK(st == FA_OK, "O at its own bytes through the second registration: %s (%s)",
	      fa_status_name(st), fa_last_error_detail());
	CHECK(cu.MemcpyDtoH(after, mem, n) == 0, "download");
	CHECK(fa_case_check(&cases[0], &l, after + LEAD, &err, why, sizeof why), "%s", why);

	CHECK(fa_buffer_free(whole) == FA_OK && fa_buffer_free(part) == FA_OK, "unregister: %s",
	      fa_last_error_detail());
	CHECK((r = cu.MemFree(mem)) == 0, "cuMemFree: CUDA error %d", r);
	fa_client_close(c);
	free(host);
	free(after);
	return 0;
}

#define OWNER_BYTES (256u << 20)

/* A child's pipes to the parent: bytes up, and the parent's word (a byte, or EOF) down. */
struct owner_arg {
	int up, down;
	bool share; /* after 'R', wait for 'C', compute on the buffer, answer 'K' or 'F' */
};

/* An owner: registers a 256 MiB device buffer, exports its handle into g_sh, says 'R'; (share:
 * waits for 'C' -- another process registered and unregistered the handle meanwhile -- then
 * computes a checked case on the buffer and says 'K' or 'F'); waits for EOF and ends with
 * _exit(0), never unregistering, closing the client or freeing the memory. */
static int owner(const struct owner_arg *o)
{
	cu_ptr mem = 0;
	fa_buffer *b = NULL;
	fa_status st;
	int dev = 0;
	cu_res r;
	char ch = 'R';

	fa_client *c = open_client();
	CHECK(c != NULL, "owner: fa_client_open");
	CHECK((r = cu.MemAlloc(&mem, OWNER_BYTES)) == 0, "owner: cuMemAlloc: CUDA error %d", r);
	st = fa_buffer_register_device(c, (void *)(uintptr_t)mem, OWNER_BYTES, &b);
	CHECK(st == FA_OK, "owner: fa_buffer_register_device: %s (%s)", fa_status_name(st),
	      fa_last_error_detail());
	/* the bytes the library sent: a legacy handle of the same allocation is the same handle */
	CHECK((r = cu.IpcGetMemHandle((struct fa_cu_ipc_handle *)g_sh->handle, mem)) == 0,
	      "owner: cuIpcGetMemHandle: CUDA error %d", r);
	CHECK(cu.DeviceGet(&dev, 0) == 0 && cu.DeviceGetUuid(g_sh->uuid, dev) == 0, "owner: uuid");
	g_sh->alloc_size = OWNER_BYTES;
	CHECK(fa_test_write_all(o->up, &ch, 1) == 0, "owner: write");
	if (o->share) {
		uint64_t rng = 0x0a0a;
		CHECK(fa_test_read_full(o->down, &ch, 1, fa_test_ms(60000)) == 0 && ch == 'C',
		      "owner: no word from the parent");
		ch = dev_run(c, &cases[0], b, &rng, NULL) == 0 ? 'K' : 'F';
		CHECK(fa_test_write_all(o->up, &ch, 1) == 0, "owner: write");
	}
	while (fa_test_read_full(o->down, &ch, 1, fa_test_ms(120000)) == 0)
		;
	_exit(0);
}

/* Fork an owner (CUDA started in it); *up reads its bytes, closing *down tells it to end. */
static pid_t start_owner(bool share, int *up, int *down)
{
	int u[2], d[2];
	if (pipe(u) != 0)
		return -1;
	if (pipe(d) != 0) {
		close(u[0]);
		close(u[1]);
		return -1;
	}
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		close(u[0]);
		close(d[1]);
		if (cu_start() != 0) {
			fprintf(stderr, "owner: cannot start CUDA\n");
			_exit(90);
		}
		struct owner_arg o = {.up = u[1], .down = d[0], .share = share};
		_exit(owner(&o));
	}
	close(u[1]);
	close(d[0]);
	if (pid < 0) {
		close(u[0]);
		close(d[1]);
		return -1;
	}
	*up = u[0];
	*down = d[1];
	return pid;
}

/* Tell an owner to end (close its pipes) and reap it; its exit code (killed after a timeout). */
static int end_owner(pid_t pid, int up, int down)
{
	close(down);
	close(up);
	int code = fa_test_waitpid(pid, fa_test_ms(20000));
	if (code < 0) {
		fprintf(stderr, "owner %d did not end: killed\n", (int)pid);
		kill(pid, SIGKILL);
		fa_test_waitpid(pid, 5000);
	}
	return code;
}

/* ---- the autotuner --------------------------------------------------------------------------- */

/* Class X: a request meets it and the daemon (--tune idle) tunes it in the background. Class Y
 * (fp16 d128 causal, S in (512, 1024]): `fa-ctl tune --seq 1024` tunes it. */
static const struct fa_case tune_x = {.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 200, .Sk = 200,
                                      .Hq = 8, .Hkv = 2, .D = 64, .lse = true};
static const struct fa_case tune_y = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 700, .Sk = 700,
                                      .Hq = 4, .Hkv = 4, .D = 128,
                                      .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT};

struct tune_arg {
	const char *url;
	bool with_y;
};

/* Checked device cases of class X (and Y) on the daemon at arg->url. */
static int child_tune_cases(void *arg)
{
	const struct tune_arg *t = arg;
	uint64_t rng = 0x7e57;
	fa_client *c = open_client_at(t->url);
	CHECK(c != NULL, "fa_client_open(%s)", t->url);
	CHECK(dev_case(c, &tune_x, &rng, NULL) == 0, "%s", "class X");
	if (t->with_y)
		CHECK(dev_case(c, &tune_y, &rng, NULL) == 0, "%s", "class Y");
	fa_client_close(c);
	return 0;
}

/* Run $FA_BUILD/fa-ctl with args (NULL-terminated, without argv[0]), its stdout and stderr into
 * the file out; its exit code, or -1 when it ran past timeout_ms (killed). */
static int run_fa_ctl(const char *out, int timeout_ms, const char *const *args)
{
	char prog[512];
	const char *argv[40];
	int n = 0;
	snprintf(prog, sizeof prog, "%s/fa-ctl", fa_test_build_dir());
	if (access(prog, X_OK) != 0) {
		fprintf(stderr, "%s: not found or not executable\n", prog);
		return -2;
	}
	argv[n++] = prog;
	for (int i = 0; args[i] != NULL && n < 39; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		return -2;
	if (pid == 0) {
		int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd < 0)
			_exit(126);
		dup2(fd, 1);
		dup2(fd, 2);
		close(fd);
		execv(prog, (char *const *)argv);
		_exit(127);
	}
	int code = fa_test_waitpid(pid, fa_test_ms(timeout_ms));
	if (code < 0) {
		kill(pid, SIGKILL);
		fa_test_waitpid(pid, 5000);
	}
	return code;
}

/* A whole (small) file as a string; "" when unreadable. Caller frees. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	size_t n = 0, cap = 4096;
	char *s = malloc(cap);
	if (s == NULL)
		abort();
	if (f != NULL) {
		size_t k;
		while ((k = fread(s + n, 1, cap - 1 - n, f)) > 0) {
			n += k;
			if (n + 1 == cap && (s = realloc(s, cap *= 2)) == NULL)
				abort();
		}
		fclose(f);
	}
	s[n] = '\0';
	return s;
}

/* Print text's lines (those containing `only`, all when NULL) to stderr behind prefix. */
static void print_lines(const char *text, const char *prefix, const char *only)
{
	for (const char *p = text; *p != '\0';) {
		const char *e = strchr(p, '\n');
		int len = e ? (int)(e - p) : (int)strlen(p);
		char line[1024];
		snprintf(line, sizeof line, "%.*s", len, p);
		if (only == NULL || strstr(line, only) != NULL)
			fprintf(stderr, "%s%s\n", prefix, line);
		p += len + (e ? 1 : 0);
	}
}

/* The tuning table's line prefix for cs's class, as tune_cache.c writes an entry ("bf16 bf16 d64
 * none sq8 sk8 gqa2 best="), and the class's name for messages. */
static void tune_class(const struct fa_case *cs, char *prefix, size_t pcap, char *name,
                       size_t ncap)
{
	struct fa_case_layout l;
	struct fa_attn_fwd_desc d;
	struct fa_tune_key k;
	fa_case_layout(cs, &l);
	fa_case_desc(cs, &l, &d);
	fa_tune_key_make(&d, &k);
	snprintf(prefix, pcap, "%s %s d%d %s sq%d sk%d gqa%d best=", fa_dtype_name(k.dtype),
	         fa_prec_name(k.precision), k.D, fa_mask_name(k.mask), k.sq_log2, k.sk_log2,
	         k.gqa_log2);
	fa_tune_key_format(&k, name, ncap);
}

/* Entry lines in a tuning table file (those with "best="), 0 when unreadable. */
static int table_entries(const char *path)
{
	char *text = slurp(path);
	int n = 0;
	for (const char *p = text; (p = strstr(p, " best=")) != NULL; p++)
		n++;
	free(text);
	return n;
}

/* Wait (bounded) until the table file at path holds an entry starting with prefix (the
 * daemon's background tuner saves it when it is done with the class). */
static bool wait_table_entry(const char *path, const char *prefix, int timeout_ms)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(timeout_ms);
	for (;;) {
		char *text = slurp(path);
		bool there = strstr(text, prefix) != NULL;
		free(text);
		if (there)
			return true;
		if (fa_test_now_ms() >= deadline)
			return false;
		fa_test_sleep_ms(100);
	}
}

/* A numeric STATS key from a snapshot, UINT64_MAX when absent (for messages). */
static uint64_t stat_in(const char *text, const char *key)
{
	uint64_t v;
	return fa_stats_u64(text, key, &v) ? v : UINT64_MAX;
}

/* nftw callback of rm_tree. */
static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

/* Remove a scratch tree (kept when FA_TEST_KEEP is set, like the daemons' directories). */
static void rm_tree(const char *dir)
{
	if (getenv("FA_TEST_KEEP") == NULL)
		nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- tests ----------------------------------------------------------------------------------- */

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

/* The backward pass: dQ, dK, dV against the float64 oracle in device and host buffers, outputs
 * poisoned first; the deterministic mode bit for bit. Skips, saying why, while the daemon's GPU
 * backend has no backward kernels. */
static void test_gpu_backward_matches_reference_and_is_deterministic(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	int r = in_child(child_bwd_cases, NULL, 300000);
	assert_int_equal(r, 0);
}

/* The backward with a sliding window and softcap is served by the GPU backend (it refused
 * them before attn_bwd.cu had FA_WIN / FA_SOFTCAP) and matches the oracle with them. */
static void test_gpu_backward_with_window_and_softcap_is_served(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_bwd_window_cases, NULL, 300000), 0);
}

/* Issue 12's prewake: synchronous requests of a few milliseconds through the ring, one after the
 * other, so the worker knows their shape's time and wakes the loop and the client just before
 * each ends. Every result stays right (sampled rows against the float64 oracle, bf16 1e-2; the
 * last call's O bit for bit the first's) and the prewakes happened. */
static int child_prewake(void *arg)
{
	(void)arg;
	static const struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 4, .Sq = 4096, .Sk = 4096,
	                                  .Hq = 16, .Hkv = 16, .D = 128};
	struct fa_case_layout l;
	struct fa_attn_fwd_desc d;
	fa_attn_fwd_args a;
	fa_buffer *b = NULL;
	cu_ptr mem = 0;
	uint64_t rng = 77;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open");
	uint64_t pw0 = fa_integ_stat(c, "gpu_prewakes");
	CHECK(pw0 != UINT64_MAX, "no gpu_prewakes in STATS");
	fa_case_layout(&cs, &l);
	fa_case_desc(&cs, &l, &d);
	char *host = malloc(l.total), *first = malloc((size_t)l.o_span * 2);
	CHECK(host != NULL && first != NULL, "malloc");
	fa_case_fill(&cs, &l, host, &rng);
	CHECK(cu.MemAlloc(&mem, l.total) == 0 && cu.MemcpyHtoD(mem, host, l.total) == 0 &&
	      cu.StreamSynchronize(NULL) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)mem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	for (int i = 0; i < 8; i++) {
		fa_status st = fa_attn_fwd(c, &a);
		CHECK(st == FA_OK, "call %d: %s (%s)", i, fa_status_name(st), fa_last_error_detail());
		if (i == 0)
			CHECK(cu.MemcpyDtoH(first, mem + l.o_off, (size_t)l.o_span * 2) == 0, "o");
	}
	CHECK(cu.MemcpyDtoH(host + l.o_off, mem + l.o_off, (size_t)l.o_span * 2) == 0, "o");
	CHECK(memcmp(first, host + l.o_off, (size_t)l.o_span * 2) == 0,
	      "the eighth call's O differs from the first's");
	double num = 0, den = 0, ref[128], lse, *sc = malloc(sizeof(double) * (size_t)cs.Sk);
	CHECK(sc != NULL, "malloc");
	for (int r = 0; r < 24; r++) {
		int64_t bb = r % cs.B, h = (r * 5) % cs.Hq, i = (r * 977) % cs.Sq;
		fa_gpu_oracle_row(&d, host + l.q_off, host + l.k_off, host + l.v_off, bb, h, i, ref,
		                  &lse, sc);
		for (int64_t e = 0; e < cs.D; e++) {
			double got = fa_load_elem(host + l.o_off, cs.dtype,
			                          bb * d.o_stride[0] + i * d.o_stride[1] +
			                              h * d.o_stride[2] + e);
			num += (got - ref[e]) * (got - ref[e]);
			den += ref[e] * ref[e];
		}
	}
	double err = sqrt(num / den);
	uint64_t pw = fa_integ_stat(c, "gpu_prewakes") - pw0;
	uint64_t rpw = fa_integ_stat(c, "ring_prewakes");
	fprintf(stderr, "  prewake: 8 calls, sampled rel error %.3g, gpu_prewakes +%llu, "
	        "ring_prewakes %llu, gpu_prewake_us %llu\n", err, (unsigned long long)pw,
	        (unsigned long long)rpw, (unsigned long long)fa_integ_stat(c, "gpu_prewake_us"));
	CHECK(err <= 1e-2, "sampled rows: relative error %.3g above bf16's 1e-2", err);
	if (fa_integ_stat(c, "gpu_prewake_us") > 0)
		CHECK(pw >= 4, "only %llu prewakes over 8 calls of one shape", (unsigned long long)pw);
	fa_buffer_free(b);
	cu.MemFree(mem);
	free(sc);
	free(first);
	free(host);
	fa_client_close(c);
	return 0;
}

static void test_gpu_prewake_keeps_results_right(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_prewake, NULL, 120000), 0);
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

/* A numeric STATS key of the daemon at url (asserted present). */
static uint64_t stat_of(const char *url, const char *key)
{
	static char text[16384];
	uint64_t v = 0;
	fa_status st = fa_integ_stats(url, text, sizeof text);
	if (st != FA_OK)
		fprintf(stderr, "STATS of %s: %s (%s)\n", url, fa_status_name(st),
		        fa_last_error_detail());
	assert_int_equal(st, FA_OK);
	if (!fa_stats_u64(text, key, &v))
		fprintf(stderr, "STATS has no numeric key %s\n", key);
	assert_true(fa_stats_u64(text, key, &v));
	return v;
}

/* Wait (bounded by ms, scaled) until the daemon's key == want; says what it was otherwise.
 * Returns the milliseconds it took. */
static uint64_t assert_stat_reaches(const char *url, const char *key, uint64_t want, int ms)
{
	uint64_t v = UINT64_MAX, t0 = fa_test_now_ms();
	bool ok = fa_integ_wait_stat(NULL, url, key, want, fa_test_ms(ms), &v);
	if (!ok)
		fprintf(stderr, "STATS %s stayed %llu for %d ms (want %llu)\n", key,
		        (unsigned long long)v, fa_test_ms(ms), (unsigned long long)want);
	assert_true(ok);
	return fa_test_now_ms() - t0;
}

/* Wait (bounded) until the daemon at url computes a request (STATS fwd_running 1); says what
 * it saw otherwise. */
static bool wait_running(const char *url, int ms)
{
	static char text[16384];
	uint64_t running = UINT64_MAX, inflight = UINT64_MAX;
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(ms);
	for (;;) {
		if (fa_integ_stats(url, text, sizeof text) == FA_OK &&
		    fa_stats_u64(text, "fwd_running", &running) && running == 1)
			return true;
		if (fa_test_now_ms() >= deadline) {
			fa_stats_u64(text, "inflight", &inflight);
			fprintf(stderr, "no request ever showed as running for %d ms: fwd_running %llu, "
			        "inflight %llu at the end\n", fa_test_ms(ms),
			        (unsigned long long)running, (unsigned long long)inflight);
			return false;
		}
		fa_test_sleep_ms(5);
	}
}

/* Free device memory as a fresh child process sees it. */
static size_t device_free_now(void)
{
	assert_int_equal(in_child(child_free_now, NULL, 60000), 0);
	return g_sh->free_bytes;
}

/* Free device memory comes back to `before` (seen by a fresh child, bounded). */
static void assert_device_free_back(size_t before)
{
	g_sh->want_free = before;
	assert_int_equal(in_child(child_free_back, NULL, 60000), 0);
}

static void test_gpu_register_cycles_leave_device_memory_unchanged(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	uint64_t regions0 = stat_of(g_daemon.url, "regions");
	assert_int_equal(in_child(child_cycles, NULL, 300000), 0);
	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);
}

/* A client SIGKILLed while the daemon runs its kernel (on its device memory): the daemon lives
 * and serves; the client's region and session go within 2 s; free device memory comes back. */
static void test_gpu_client_killed_mid_kernel_leaves_no_region_session_or_memory(void **state)
{
	(void)state;
	int p[2];
	char ch;
	SKIP_WITHOUT_GPU();
	/* the kernel is compiled and loaded first: the module is the daemon's for good */
	assert_int_equal(in_child(child_big_once, NULL, 180000), 0);
	uint64_t regions0 = stat_of(g_daemon.url, "regions");
	uint64_t bytes0 = stat_of(g_daemon.url, "region_bytes");
	uint64_t sessions0 = stat_of(g_daemon.url, "sessions"); /* the snapshot's own: 1 */
	size_t free0 = device_free_now();

	assert_int_equal(pipe(p), 0);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		if (cu_start() != 0) {
			fprintf(stderr, "victim: cannot start CUDA\n");
			_exit(90);
		}
		_exit(victim(p[1]));
	}
	close(p[1]);
	int rd = fa_test_read_full(p[0], &ch, 1, fa_test_ms(60000));
	close(p[0]);
	if (rd != 0) {
		kill(pid, SIGKILL);
		fprintf(stderr, "the victim never registered its buffer (it ended with %d)\n",
		        fa_test_waitpid(pid, 5000));
	}
	assert_int_equal(rd, 0);

	/* Kill it once its kernel runs (it sends request after request: one is nearly always
	 * running, each tens of ms). */
	bool running = wait_running(g_daemon.url, 30000);
	uint64_t regions_held = stat_of(g_daemon.url, "regions");
	kill(pid, SIGKILL);
	int code = fa_test_waitpid(pid, fa_test_ms(10000));
	uint64_t t0 = fa_test_now_ms();
	if (code != 128 + SIGKILL)
		fprintf(stderr, "the victim ended with %d before the kill\n", code);
	assert_true(running);
	assert_int_equal(code, 128 + SIGKILL);
	assert_int_equal(regions_held, regions0 + 1);

	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);
	assert_stat_reaches(g_daemon.url, "sessions", sessions0, 2000);
	fprintf(stderr, "  the victim's region and session were gone %llu ms after the kill\n",
	        (unsigned long long)(fa_test_now_ms() - t0));
	assert_int_equal(stat_of(g_daemon.url, "region_bytes"), bytes0);
	assert_true(daemon_alive(&g_daemon));
	assert_device_free_back(free0);
	assert_int_equal(in_child(child_serves, NULL, 120000), 0);
	assert_true(daemon_alive(&g_daemon));
}

/* A client registers a device buffer and exits without unregistering or closing: the region
 * goes with its session, and the device memory comes back. */
static void test_gpu_region_of_a_client_that_exits_goes_with_its_session(void **state)
{
	(void)state;
	int up = -1, down = -1;
	char ch;
	SKIP_WITHOUT_GPU();
	uint64_t regions0 = stat_of(g_daemon.url, "regions");
	uint64_t sessions0 = stat_of(g_daemon.url, "sessions");
	size_t free0 = device_free_now();
	pid_t pid = start_owner(false, &up, &down);
	assert_true(pid > 0);
	int rd = fa_test_read_full(up, &ch, 1, fa_test_ms(60000));
	uint64_t regions_held = rd == 0 ? stat_of(g_daemon.url, "regions") : 0;
	int code = end_owner(pid, up, down); /* it exits holding the registration */
	uint64_t t0 = fa_test_now_ms();
	if (rd != 0 || code != 0)
		fprintf(stderr, "the owner failed (read %d, exit %d)\n", rd, code);
	assert_int_equal(rd, 0);
	assert_int_equal(code, 0);
	assert_int_equal(regions_held, regions0 + 1);
	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);
	assert_stat_reaches(g_daemon.url, "sessions", sessions0, 2000);
	fprintf(stderr, "  the exited client's region was gone %llu ms after its exit\n",
	        (unsigned long long)(fa_test_now_ms() - t0));
	assert_device_free_back(free0);
	assert_true(daemon_alive(&g_daemon));
}

static void test_gpu_stale_handle_of_freed_memory_gets_einval(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	uint64_t regions0 = stat_of(g_daemon.url, "regions");
	assert_int_equal(in_child(child_stale, NULL, 60000), 0);
	assert_true(daemon_alive(&g_daemon));
	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);
}

static void test_gpu_same_allocation_registered_twice_survives_one_unregister(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	uint64_t regions0 = stat_of(g_daemon.url, "regions");
	assert_int_equal(in_child(child_same_allocation_twice, NULL, 60000), 0);
	assert_true(daemon_alive(&g_daemon));
	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);
}

static void test_gpu_output_over_an_input_through_a_second_registration_gets_eoverlap(
    void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	uint64_t regions0 = stat_of(g_daemon.url, "regions");
	assert_int_equal(in_child(child_same_allocation_output_over_input, NULL, 60000), 0);
	assert_true(daemon_alive(&g_daemon));
	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);
}

/* Process B (this one, raw protocol) registers the 64 bytes of process A's live handle: the
 * daemon cannot tell who exported a handle (it is a capability: B could open it with
 * cuIpcOpenMemHandle itself), so it registers (FA_OK), as a region of B's session. B
 * unregistering it must not unmap A's own registration (the driver counts opens of one handle
 * per context): A's next request computes right. Once A has exited, the same bytes name freed
 * memory: FA_EINVAL. */
static void test_gpu_handle_of_another_process_live_registers_dead_gets_einval(void **state)
{
	(void)state;
	struct fa_proto_rep rep;
	char why[FA_PROTO_DETAIL_MAX], ch = 0, res = 0;
	int up = -1, down = -1, st = FA_RAW_NO_REPLY, ust = FA_RAW_NO_REPLY;
	uint64_t regions_both = 0;
	SKIP_WITHOUT_GPU();
	uint64_t regions0 = stat_of(g_daemon.url, "regions");
	pid_t pid = start_owner(true, &up, &down);
	assert_true(pid > 0);
	int rd = fa_test_read_full(up, &ch, 1, fa_test_ms(60000));
	if (rd == 0) {
		int s = fa_raw_open(g_daemon.url, fa_test_ms(20000));
		uint64_t sid = s >= 0 ? fa_raw_hello(s, 1, &rep) : 0;
		if (sid != 0) {
			st = fa_raw_register_ipc(s, sid, 2, g_sh->handle, g_sh->uuid, g_sh->alloc_size, NULL,
			                      &rep);
			fprintf(stderr, "  another process's live handle: %s (%d)%s%s\n",
			        fa_status_name((fa_status)st), st, rep.detail[0] ? ": " : "",
			        rep.detail);
			if (st == FA_OK) {
				regions_both = stat_of(g_daemon.url, "regions");
				ust = raw_unregister(s, sid, 3, rep.u.reg.region, &rep);
				if (ust != FA_OK)
					fprintf(stderr, "  its UNREGISTER: %s (%d): %s\n",
					        fa_status_name((fa_status)ust), ust, rep.detail);
			}
			fa_raw_simple(s, FA_OP_BYE, sid, 4, &rep);
		} else {
			fprintf(stderr, "raw session on %s failed\n", g_daemon.url);
		}
		if (s >= 0)
			nn_close(s);
		/* A computes on its buffer now */
		ch = 'C';
		if (fa_test_write_all(down, &ch, 1) == 0 &&
		    fa_test_read_full(up, &res, 1, fa_test_ms(60000)) != 0)
			res = 0;
	}
	int code = end_owner(pid, up, down);
	if (rd != 0 || code != 0 || res != 'K')
		fprintf(stderr, "the owner failed (read %d, result '%c', exit %d)\n", rd,
		        res ? res : '-', code);
	assert_int_equal(rd, 0);
	assert_int_equal(st, FA_OK);
	assert_int_equal(regions_both, regions0 + 2);
	assert_int_equal(ust, FA_OK);
	assert_int_equal(res, 'K');
	assert_int_equal(code, 0);
	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);

	st = raw_try_register(g_sh->handle, g_sh->uuid, g_sh->alloc_size, why, sizeof why);
	fprintf(stderr, "  an exited process's handle: %s (%d): %s\n",
	        fa_status_name((fa_status)st), st, why);
	assert_int_equal(st, FA_EINVAL);
	assert_true(daemon_alive(&g_daemon));
	assert_stat_reaches(g_daemon.url, "regions", regions0, 2000);
	assert_int_equal(in_child(child_serves, NULL, 120000), 0);
}

/* The autotuner on the GPU, into a fresh cache dir: a daemon with --tune idle tunes the class a
 * request met (STATS tune_tuned, the entry saved in its table file), `fa-ctl tune` tunes another
 * class into the same table, a restarted daemon loads every entry, and requests of both classes
 * (on the tuned tiles) match the reference. The daemon may tune other classes as well (its
 * canary's), so the checks look for these two classes' entries, not for a total. */
static void test_gpu_autotuner_tunes_and_a_restarted_daemon_loads_the_table(void **state)
{
	(void)state;
	static char text[16384];
	char dir[64], cache[128], out[160], v[512], table[512];
	char x_line[128], x_name[96], y_line[128], y_name[96];
	struct fa_daemon t, r;
	uint64_t n = 0;
	struct stat sb;
	SKIP_WITHOUT_GPU();
	tune_class(&tune_x, x_line, sizeof x_line, x_name, sizeof x_name);
	tune_class(&tune_y, y_line, sizeof y_line, y_name, sizeof y_name);
	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);
	snprintf(cache, sizeof cache, "%s/cache", dir);
	snprintf(out, sizeof out, "%s/fa-ctl-tune.out", dir);

	/* 1. background tuning on, a fresh cache dir: nothing loaded */
	int rc = daemon_start(&t, "--backend", "gpu", "--cache-dir", cache, "--tune", "idle", NULL);
	if (rc != 0) {
		fprintf(stderr, "daemon_start --tune idle: %d (status %d)\n", rc, t.status);
		daemon_log_dump(&t, 40);
	}
	assert_int_equal(rc, 0);
	assert_int_equal(fa_integ_stats(t.url, text, sizeof text), FA_OK);
	print_lines(text, "  tuning daemon| ", "tune_");
	assert_true(fa_stats_get(text, "tune_mode", v, sizeof v));
	assert_string_equal(v, "idle");
	assert_true(fa_stats_get(text, "tune_table", table, sizeof table));
	assert_true(strncmp(table, cache, strlen(cache)) == 0);
	assert_true(fa_stats_u64(text, "tune_loaded", &n));
	assert_int_equal(n, 0);

	/* 2. a request meets class X; the daemon tunes it while idle and saves the table */
	struct tune_arg ta = {.url = t.url, .with_y = false};
	assert_int_equal(in_child(child_tune_cases, &ta, 180000), 0);
	uint64_t t0 = fa_test_now_ms();
	bool saved_x = wait_table_entry(table, x_line, 180000);
	assert_int_equal(fa_integ_stats(t.url, text, sizeof text), FA_OK);
	fprintf(stderr, "  background tuning of %s: %s after %llu ms; tune_tuned %llu, "
	        "tune_failed %llu, tune_active %llu\n", x_name, saved_x ? "saved" : "NOT saved",
	        (unsigned long long)(fa_test_now_ms() - t0),
	        (unsigned long long)stat_in(text, "tune_tuned"),
	        (unsigned long long)stat_in(text, "tune_failed"),
	        (unsigned long long)stat_in(text, "tune_active"));
	char *log = daemon_log_read(&t);
	print_lines(log, "  tuning daemon| ", "gpu: tun");
	free(log);
	if (!saved_x) {
		char *tt = slurp(table);
		fprintf(stderr, "no \"%s...\" line in %s; it holds:\n", x_line, table);
		print_lines(tt, "  table| ", NULL);
		free(tt);
		daemon_log_dump(&t, 30);
	}
	assert_true(saved_x);
	assert_true(stat_in(text, "tune_tuned") >= 1);

	/* 3. fa-ctl tune (in-process on the GPU, next to the running daemon) tunes class Y */
	const char *args[] = {"tune", "--cache-dir", cache, "--candidates", "4", "--runs", "3",
	                      "--dtype", "fp16", "--head-dim", "128", "--seq", "1024", "--causal",
	                      NULL};
	t0 = fa_test_now_ms();
	int code = run_fa_ctl(out, 300000, args);
	char *o = slurp(out);
	fprintf(stderr, "  fa-ctl tune %s: exit %d after %llu ms:\n", y_name, code,
	        (unsigned long long)(fa_test_now_ms() - t0));
	print_lines(o, "  fa-ctl| ", NULL);
	bool saved = strstr(o, "saved ") != NULL, row = strstr(o, "fp16 d128") != NULL;
	free(o);
	assert_int_equal(code, 0);
	assert_true(saved);
	assert_true(row);

	/* 4. the table file holds both; a restarted daemon (tuning off) loads every entry */
	assert_int_equal(daemon_finish(&t), 0);
	assert_int_equal(stat(table, &sb), 0);
	char *tt = slurp(table);
	bool has_x = strstr(tt, x_line) != NULL, has_y = strstr(tt, y_line) != NULL;
	int entries = table_entries(table);
	fprintf(stderr, "  tuning table %s: %lld bytes, %d entries%s\n", table,
	        (long long)sb.st_size, entries, has_x && has_y ? "" : "; X or Y missing:");
	print_lines(tt, "  table| ", has_x && has_y ? " best=" : NULL);
	free(tt);
	assert_true(has_x);
	assert_true(has_y);
	rc = daemon_start(&r, "--backend", "gpu", "--cache-dir", cache, NULL);
	if (rc != 0) {
		fprintf(stderr, "daemon_start (restart): %d (status %d)\n", rc, r.status);
		daemon_log_dump(&r, 40);
	}
	assert_int_equal(rc, 0);
	assert_int_equal(fa_integ_stats(r.url, text, sizeof text), FA_OK);
	print_lines(text, "  restarted daemon| ", "tune_");
	assert_true(fa_stats_get(text, "tune_table", v, sizeof v));
	assert_string_equal(v, table);
	assert_true(fa_stats_u64(text, "tune_loaded", &n));
	assert_true(n >= 2);
	assert_int_equal(n, (uint64_t)entries);
	assert_int_equal(stat_in(text, "tune_corrupt"), 0);
	assert_int_equal(stat_in(text, "tune_stale"), 0);
	uint64_t hits0 = stat_in(text, "tune_hits"), unfit0 = stat_in(text, "tune_unfit");

	/* 5. both classes served (on their tuned tiles) and right */
	ta.url = r.url;
	ta.with_y = true;
	assert_int_equal(in_child(child_tune_cases, &ta, 180000), 0);
	assert_int_equal(fa_integ_stats(r.url, text, sizeof text), FA_OK);
	print_lines(text, "  restarted daemon| ", "tune_");
	/* each request found its class tuned: a hit, or "unfit" when the planner does not list the
	 * tuned tile for this exact shape (the heuristic serves then, by design) */
	uint64_t found = stat_in(text, "tune_hits") - hits0 + stat_in(text, "tune_unfit") - unfit0;
	assert_true(found >= 2);
	assert_int_equal(daemon_finish(&r), 0);
	rm_tree(dir);
}

/* ---- setup ----------------------------------------------------------------------------------- */

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
	g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (g_sh == MAP_FAILED) {
		perror("mmap");
		return -1;
	}
	if (!child_have_gpu()) {
		g_no_gpu = true;
		snprintf(g_skip_why, sizeof g_skip_why,
		         "no GPU (no CUDA driver, or it sees no device)");
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
		cmocka_unit_test(test_gpu_backward_matches_reference_and_is_deterministic),
		cmocka_unit_test(test_gpu_backward_with_window_and_softcap_is_served),
		cmocka_unit_test(test_gpu_latency_device_vs_host_buffers),
		cmocka_unit_test(test_gpu_prewake_keeps_results_right),
		cmocka_unit_test(test_gpu_pool_memory_is_refused_with_eipc),
		cmocka_unit_test(test_gpu_bad_offsets_and_sizes_get_ealign_erange),
		cmocka_unit_test(test_gpu_forged_handle_gets_an_error_and_daemon_serves_on),
		cmocka_unit_test(test_gpu_four_processes_with_device_buffers),
		cmocka_unit_test(test_gpu_register_cycles_leave_device_memory_unchanged),
		cmocka_unit_test(test_gpu_client_killed_mid_kernel_leaves_no_region_session_or_memory),
		cmocka_unit_test(test_gpu_region_of_a_client_that_exits_goes_with_its_session),
		cmocka_unit_test(test_gpu_stale_handle_of_freed_memory_gets_einval),
		cmocka_unit_test(test_gpu_same_allocation_registered_twice_survives_one_unregister),
		cmocka_unit_test(
		    test_gpu_output_over_an_input_through_a_second_registration_gets_eoverlap),
		cmocka_unit_test(test_gpu_handle_of_another_process_live_registers_dead_gets_einval),
		cmocka_unit_test(test_gpu_autotuner_tunes_and_a_restarted_daemon_loads_the_table),
	};
	if (getenv("FA_TEST_FILTER"))
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
