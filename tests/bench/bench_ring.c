/* bench_ring.c - issue 12's three serving figures, each against its anchor in the same run, on
 * a GPU: the submission ring (the default client) against the socket (FA_RING=0).
 *
 *   bench_ring [-n N] [-l LARGE]   (default 2000 calls per latency series, 30 large requests)
 *
 * (1) Asynchronous enqueue: host time of one fa_attn_fwd_async (fp16 B1 S128 H4 D64, completion
 *     words), p50/p99, ring against socket; target <= 20 us.
 * (2) Tiny request, synchronous (bf16 B1 H16 S128 D64): p50/p99 of fa_attn_fwd against the same
 *     kernel launched in-process + cuStreamSynchronize; target p50 <= 1.5x.
 * (3) Large request (bf16 B8 H16 S4096 D128): TFLOP/s through the daemon, synchronous and
 *     asynchronous, against in-process back-to-back launches; target >= 0.97x. Beside it the
 *     daemon's own GPU time per request (STATS gpu_busy_us / gpu_timed_jobs, synchronous
 *     worker jobs) against the in-process kernel time (events), and the idle gaps the daemon's
 *     stream saw between requests (gpu_gap_short_us / gpu_gaps_short), so a loss splits into
 *     "the kernel ran slower" and "the GPU waited for the host".
 *
 * CUDA never in this process: each part is a forked child (the fork rule of bench_serving.c).
 * Without a GPU it prints why and exits 0. Figures only; exit 1 only when something fails.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fa_cudrv.h"
#include "fa_gpu.h"
#include "fa_integ.h"
#include "fa_ksettings.h"

#define WARMUP 100

static const struct fa_case tiny = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 128, .Sk = 128,
                                    .Hq = 16, .Hkv = 16, .D = 64};
static const struct fa_case small_async = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128,
                                           .Sk = 128, .Hq = 4, .Hkv = 4, .D = 64};
static const struct fa_case large = {.dtype = FA_DTYPE_BF16, .B = 8, .Sq = 4096, .Sk = 4096,
                                     .Hq = 16, .Hkv = 16, .D = 128};

struct mode_res {
	double tiny50, tiny99, enq50, enq99;
	double sync_tflops, async_tflops;
	double gpu_ms;              /* daemon's GPU time per timed job, over the large sync run */
	double gap_us;              /* mean short gap between the large sync requests */
	double gap_max_us;
	uint64_t gaps;
	double pick_us, loop_us;    /* per large sync job: submit -> worker's pick, done -> loop */
	int ok;
};

struct board {
	char why[256];
	double in_tiny50, in_tiny99, in_kernel_ms, in_tflops;
	double in_launch_us;          /* host time of one large fa_gpu_attn_fwd call (the launch) */
	int in_ok;
	struct mode_res m[2]; /* 0 socket, 1 ring */
};

static struct board *B;
static char g_url[FA_TEST_PATH_MAX + 8];
static char g_cache[64];
static int g_n = 2000, g_large = 30;

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void pct(double *v, int n, double *p50, double *p99)
{
	qsort(v, (size_t)n, sizeof *v, cmpd);
	*p50 = v[n / 2];
	*p99 = v[(n * 99) / 100];
}

static double flop(const struct fa_case *c)
{
	return 4.0 * (double)c->B * (double)c->Hq * (double)c->Sq * (double)c->Sk * (double)c->D;
}

/* Device memory with cs's inputs (fa_case_fill) uploaded. */
static int upload(const struct fa_case *cs, struct fa_case_layout *l, cu_ptr *mem)
{
	uint64_t rng = 7;
	fa_case_layout(cs, l);
	void *h = malloc(l->total);
	CHECK(h != NULL, "malloc %zu", l->total);
	fa_case_fill(cs, l, h, &rng);
	CHECK(cu.MemAlloc(mem, l->total) == 0, "cuMemAlloc %zu", l->total);
	CHECK(cu.MemcpyHtoD(*mem, h, l->total) == 0, "upload");
	free(h);
	return 0;
}

static int child_probe(void)
{
	return fa_cu_start(0, B->why, sizeof B->why) == 0 ? 0 : 3;
}

static fa_status launch(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, cu_ptr m,
                        const struct fa_case_layout *l, void *s, char *err, size_t errlen)
{
	return fa_gpu_attn_fwd(g, d, m + l->q_off, m + l->k_off, m + l->v_off, m + l->o_off, 0,
	                       (CUstream)s, err, errlen);
}

/* The anchors: in-process launch + sync (tiny), back-to-back launches timed by events (large). */
static int child_inproc(void)
{
	char why[256], err[1024];
	struct fa_gpu *g = NULL;
	struct fa_kernel_settings ks;
	struct fa_case_layout l;
	struct fa_attn_fwd_desc d;
	cu_ptr m = 0;
	void *s = NULL, *ev[2] = {0};
	double *v = calloc((size_t)g_n, sizeof *v);

	CHECK(v != NULL && fa_cu_start(0, why, sizeof why) == 0, "CUDA: %s", why);
	fa_test_kernel_settings(&ks);
	CHECK(fa_gpu_open(&g, 0, &ks, err, sizeof err) == FA_OK, "fa_gpu_open: %s", err);
	fa_gpu_set_cache_dir(g, g_cache, err, sizeof err);
	CHECK(cu.StreamCreate(&s, 1) == 0, "stream");
	CHECK(upload(&tiny, &l, &m) == 0, "upload");
	fa_case_desc(&tiny, &l, &d);
	for (int i = -WARMUP; i < g_n; i++) {
		uint64_t t0 = fa_test_now_us();
		CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "tiny: %s", err);
		CHECK(cu.StreamSynchronize(s) == 0, "sync");
		if (i >= 0)
			v[i] = (double)(fa_test_now_us() - t0);
	}
	pct(v, g_n, &B->in_tiny50, &B->in_tiny99);
	cu.MemFree(m);
	CHECK(upload(&large, &l, &m) == 0, "upload");
	fa_case_desc(&large, &l, &d);
	CHECK(cu.EventCreate(&ev[0], 0) == 0 && cu.EventCreate(&ev[1], 0) == 0, "events");
	for (int i = 0; i < 3; i++)
		CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "large: %s", err);
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	double kms = 0;
	for (int i = 0; i < 5; i++) { /* the kernel alone, one at a time */
		float ms = 0;
		cu.EventRecord(ev[0], s);
		CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "large: %s", err);
		cu.EventRecord(ev[1], s);
		CHECK(cu.EventSynchronize(ev[1]) == 0 && cu.EventElapsedTime(&ms, ev[0], ev[1]) == 0,
		      "elapsed");
		kms += ms / 5.0;
	}
	B->in_kernel_ms = kms;
	uint64_t tl = fa_test_now_us();
	CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "large: %s", err);
	B->in_launch_us = (double)(fa_test_now_us() - tl);
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < g_large; i++)
		CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "large: %s", err);
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	double secs = (double)(fa_test_now_us() - t0) / 1e6;
	B->in_tflops = flop(&large) * g_large / secs / 1e12;
	B->in_ok = 1;
	cu.MemFree(m);
	fa_gpu_close(g);
	free(v);
	return 0;
}

static uint64_t stat_get(fa_client *c, const char *key)
{
	uint64_t v = fa_integ_stat(c, key);
	return v == UINT64_MAX ? 0 : v;
}

/* One client mode (0: FA_RING=0, the socket; 1: the ring): the three figures. */
static int child_daemon(int mode)
{
	struct mode_res *r = &B->m[mode];
	char why[256];
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	cu_ptr m = 0;
	void *s = NULL;
	double *v = calloc((size_t)g_n, sizeof *v);

	CHECK(v != NULL && fa_cu_start(0, why, sizeof why) == 0, "CUDA: %s", why);
	CHECK(cu.StreamCreate(&s, 1) == 0, "stream");
	if (mode == 0)
		setenv("FA_RING", "0", 1);
	CHECK(fa_client_open(&c, g_url) == FA_OK, "open: %s", fa_last_error_detail());
	unsetenv("FA_RING");
	fa_client_set_timeout(c, fa_test_ms(120000));
	CHECK(mode == 0 || stat_get(c, "ring_open") >= 1, "no ring");

	/* (2) tiny, synchronous */
	CHECK(upload(&tiny, &l, &m) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)m, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&tiny, &l, b, &a);
	for (int i = -WARMUP; i < g_n; i++) {
		uint64_t t0 = fa_test_now_us();
		fa_status st = fa_attn_fwd(c, &a);
		CHECK(st == FA_OK, "tiny: %s (%s)", fa_status_name(st), fa_last_error_detail());
		if (i >= 0)
			v[i] = (double)(fa_test_now_us() - t0);
	}
	pct(v, g_n, &r->tiny50, &r->tiny99);
	fa_buffer_free(b);
	cu.MemFree(m);

	/* (1) asynchronous enqueue, the case */
	CHECK(upload(&small_async, &l, &m) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)m, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&small_async, &l, b, &a);
	for (int i = -WARMUP; i < g_n; i++) {
		uint64_t t0 = fa_test_now_us();
		fa_status st = fa_attn_fwd_async(c, &a, s);
		double us = (double)(fa_test_now_us() - t0);
		CHECK(st == FA_OK, "async: %s (%s)", fa_status_name(st), fa_last_error_detail());
		if (i >= 0)
			v[i] = us;
		if ((i & 31) == 31)
			CHECK(cu.StreamSynchronize(s) == 0, "sync"); /* host time is measured */
	}
	CHECK(cu.StreamSynchronize(s) == 0 && fa_client_flush(c) == FA_OK, "flush: %s",
	      fa_last_error_detail());
	pct(v, g_n, &r->enq50, &r->enq99);
	fa_buffer_free(b);
	cu.MemFree(m);

	/* (3) large: synchronous, then asynchronous, back to back */
	CHECK(upload(&large, &l, &m) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)m, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&large, &l, b, &a);
	for (int i = 0; i < 3; i++)
		CHECK(fa_attn_fwd(c, &a) == FA_OK, "large warm-up: %s", fa_last_error_detail());
	uint64_t busy0 = stat_get(c, "gpu_busy_us"), jobs0 = stat_get(c, "gpu_timed_jobs");
	uint64_t gap0 = stat_get(c, "gpu_gap_short_us"), gaps0 = stat_get(c, "gpu_gaps_short");
	uint64_t wj0 = stat_get(c, "gpu_worker_jobs"), pick0 = stat_get(c, "gpu_worker_us_to_pick");
	uint64_t loop0 = stat_get(c, "gpu_worker_us_to_loop");
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < g_large; i++)
		CHECK(fa_attn_fwd(c, &a) == FA_OK, "large: %s", fa_last_error_detail());
	double secs = (double)(fa_test_now_us() - t0) / 1e6;
	r->sync_tflops = flop(&large) * g_large / secs / 1e12;
	uint64_t busy1 = stat_get(c, "gpu_busy_us"), jobs1 = stat_get(c, "gpu_timed_jobs");
	uint64_t gap1 = stat_get(c, "gpu_gap_short_us"), gaps1 = stat_get(c, "gpu_gaps_short");
	uint64_t wj1 = stat_get(c, "gpu_worker_jobs"), pick1 = stat_get(c, "gpu_worker_us_to_pick");
	uint64_t loop1 = stat_get(c, "gpu_worker_us_to_loop");
	if (wj1 > wj0) {
		r->pick_us = (double)(pick1 - pick0) / (double)(wj1 - wj0);
		r->loop_us = (double)(loop1 - loop0) / (double)(wj1 - wj0);
	}
	r->gpu_ms = jobs1 > jobs0 ? (double)(busy1 - busy0) / 1e3 / (double)(jobs1 - jobs0) : 0;
	r->gaps = gaps1 - gaps0;
	r->gap_us = r->gaps ? (double)(gap1 - gap0) / (double)r->gaps : 0;
	r->gap_max_us = (double)stat_get(c, "gpu_gap_short_max_us");
	for (int i = 0; i < 3; i++)
		CHECK(fa_attn_fwd_async(c, &a, s) == FA_OK, "large async warm-up: %s",
		      fa_last_error_detail());
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	t0 = fa_test_now_us();
	for (int i = 0; i < g_large; i++)
		CHECK(fa_attn_fwd_async(c, &a, s) == FA_OK, "large async: %s",
		      fa_last_error_detail());
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	secs = (double)(fa_test_now_us() - t0) / 1e6;
	CHECK(fa_client_flush(c) == FA_OK, "flush: %s", fa_last_error_detail());
	r->async_tflops = flop(&large) * g_large / secs / 1e12;
	fa_buffer_free(b);
	cu.MemFree(m);
	fa_client_close(c);
	r->ok = 1;
	free(v);
	return 0;
}

static int run_child(int which)
{
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p < 0)
		return -1;
	if (p == 0)
		_exit(which < 0 ? child_probe() : which == 2 ? child_inproc() : child_daemon(which));
	return fa_test_waitpid(p, fa_test_ms(300000));
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			g_n = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-l") && i + 1 < argc)
			g_large = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [-n N] [-l LARGE]\n", argv[0]);
			return 2;
		}
	}
	if (g_n < 20)
		g_n = 20;
	if (g_large < 3)
		g_large = 3;
	B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (B == MAP_FAILED)
		return 1;
	memset(B, 0, sizeof *B);
	if (run_child(-1) != 0) {
		printf("bench_ring: skipped: no GPU (%s)\n", B->why);
		return 0;
	}
	struct fa_daemon d;
	snprintf(g_cache, sizeof g_cache, "/tmp/fa-bench-ring.%d", (int)getpid());
	if (daemon_start(&d, "--backend", "gpu", "--cache-dir", g_cache, NULL) != 0) {
		fprintf(stderr, "bench_ring: the daemon did not start\n");
		daemon_log_dump(&d, 30);
		daemon_cleanup(&d);
		return 1;
	}
	snprintf(g_url, sizeof g_url, "%s", d.url);
	int rc = 0;
	/* The daemon's runs first (they compile the kernels into the cache the in-process child
	 * then loads), socket before ring. */
	for (int k = 0; k < 3; k++)
		if (run_child(k) != 0) {
			fprintf(stderr, "bench_ring: part %d failed\n", k);
			rc = 1;
		}
	daemon_stop(&d);
	daemon_cleanup(&d);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", g_cache);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_ring: %s failed\n", cmd);

	const struct mode_res *so = &B->m[0], *ri = &B->m[1];
	printf("\n== bench_ring: issue 12's figures, one run, ring (default client) vs socket "
	       "(FA_RING=0)\n");
	printf("(1) async enqueue host time, fp16 B1 S128 H4 D64, %d calls: ring p50 %.1f us p99 "
	       "%.1f us; socket p50 %.1f us p99 %.1f us; target <= 20 us: %s\n", g_n, ri->enq50,
	       ri->enq99, so->enq50, so->enq99, ri->enq50 <= 20 ? "met" : "NOT met");
	printf("(2) tiny bf16 B1 H16 S128 D64 sync, %d calls: in-process launch+sync p50 %.1f us "
	       "p99 %.1f us; ring p50 %.1f us p99 %.1f us (%.2fx); socket p50 %.1f us p99 %.1f us "
	       "(%.2fx); target <= 1.5x: %s\n", g_n, B->in_tiny50, B->in_tiny99, ri->tiny50,
	       ri->tiny99, B->in_tiny50 > 0 ? ri->tiny50 / B->in_tiny50 : 0, so->tiny50,
	       so->tiny99, B->in_tiny50 > 0 ? so->tiny50 / B->in_tiny50 : 0,
	       B->in_tiny50 > 0 && ri->tiny50 <= 1.5 * B->in_tiny50 ? "met" : "NOT met");
	double in = B->in_tflops > 0 ? B->in_tflops : 1;
	printf("(3) large bf16 B8 H16 S4096 D128, %d requests: in-process %.1f TFLOP/s (kernel "
	       "%.3f ms); ring sync %.1f (%.3fx) async %.1f (%.3fx); socket sync %.1f (%.3fx) "
	       "async %.1f (%.3fx); target >= 0.97x\n", g_large, B->in_tflops, B->in_kernel_ms,
	       ri->sync_tflops, ri->sync_tflops / in, ri->async_tflops, ri->async_tflops / in,
	       so->sync_tflops, so->sync_tflops / in, so->async_tflops, so->async_tflops / in);
	for (int k = 1; k >= 0; k--)
		printf("    %s sync: daemon GPU time %.3f ms per request (%.3fx the in-process "
		       "kernel), %" PRIu64 " gaps of %.1f us mean (max %.1f us since start); per job "
		       "submit->worker pick %.1f us, done->loop %.1f us; in-process launch call "
		       "%.1f us\n",
		       k ? "ring" : "socket", B->m[k].gpu_ms,
		       B->in_kernel_ms > 0 ? B->m[k].gpu_ms / B->in_kernel_ms : 0, B->m[k].gaps,
		       B->m[k].gap_us, B->m[k].gap_max_us, B->m[k].pick_us, B->m[k].loop_us,
		       B->in_launch_us);
	return rc || !B->in_ok || !so->ok || !ri->ok;
}
