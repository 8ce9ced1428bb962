/* bench_priority.c - issue 12's scheduling target on a GPU: a small high-priority request while
 * another client saturates the GPU with 16k-token prefills, every figure against its anchor in
 * the same run.
 *
 *   bench_priority [-t SECONDS] [-i INTERVAL_US]   (default 3 s per run, one small request
 *                                                   every 2000 us)
 *
 * Shapes: the prefill is bf16 B1 S16384 Hq32 Hkv8 D128 causal (Llama-style GQA 4:1; one request
 * is several milliseconds of an H200, and the daemon cuts it into pieces, gpu_split.c); the
 * small request is the 1x256x8x64 (bf16 B1 S256 H8 D64), below the daemon's inline
 * bound, so at FA_PRIORITY_HIGH it runs on the stream of the device's greatest priority.
 *
 * Runs, each its own set of forked client processes over one daemon (--backend gpu):
 *   A  prefill alone, synchronous calls back to back: the prefill's anchor (requests/s);
 *   S  small alone, high priority: the small request's unloaded latency (p50, p99);
 *   H  prefill + small at high priority: the target, small p99 <= 3 ms and the prefill's rate
 *      >= 0.95x A;
 *   N  prefill + small at normal priority: what the priority class buys (the small request
 *      then waits behind the prefill's pieces in the session round-robin);
 *   Aa, Ha  as A and H with the prefill client asynchronous (fa_attn_fwd_async, up to 4 in
 *      flight on its stream): the GPU never idles between prefills, the hardest case for the
 *      small request.
 * The small client paces itself (one call every INTERVAL_US, as a latency-bound service does)
 * so it takes little of the GPU; its latency is the wall time of one synchronous fa_attn_fwd.
 * Both results are checked: the small request against the float64 reference after the last
 * call of each run, the prefill's output for being written and finite.
 *
 * CUDA never in this process: each client is a forked child (the fork rule of bench_serving.c).
 * Without a GPU it prints why and exits 0. Figures only; exit 1 only when something fails.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fa_cudrv.h"
#include "fa_integ.h"

#define MAX_SAMPLES 20000
#define PREFILL_DEPTH 4 /* asynchronous prefills in flight */

static const struct fa_case prefill = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 16384,
                                       .Sk = 16384, .Hq = 32, .Hkv = 8, .D = 128,
                                       .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT};
static const struct fa_case small = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 256, .Sk = 256,
                                     .Hq = 8, .Hkv = 8, .D = 64};

enum { RUN_A, RUN_S, RUN_H, RUN_N, RUN_AA, RUN_HA, NRUNS };
static const char *const run_names[NRUNS] = {"A", "S", "H", "N", "Aa", "Ha"};

/* What one run measured, in the MAP_SHARED board. */
struct run_res {
	double rate;              /* prefill requests/s over the timed window */
	uint64_t prefills;
	double p50, p99, max;     /* small request, microseconds */
	int n;                    /* small requests timed */
	double err;               /* the small request's relative error against float64 */
	uint64_t hi_wait_max_us;  /* STATS queue_high_wait_us_max after the run */
	int ok;
};

struct board {
	char why[256];
	atomic_int ready, stop;
	_Atomic uint64_t go_us; /* start of the timed window (fa_test_now_us); 0 until both ready */
	double samples[MAX_SAMPLES];
	struct run_res r[NRUNS];
};

static struct board *B;
static char g_url[FA_TEST_PATH_MAX + 8];
static double g_seconds = 3.0;
static int g_interval_us = 2000;

/* Device memory with cs's inputs (fa_case_fill) uploaded, registered with c. */
static int upload(fa_client *c, const struct fa_case *cs, struct fa_case_layout *l, cu_ptr *mem,
                  fa_buffer **b, void **host)
{
	uint64_t rng = 11;
	fa_case_layout(cs, l);
	void *h = malloc(l->total);
	CHECK(h != NULL, "malloc %zu", l->total);
	fa_case_fill(cs, l, h, &rng);
	CHECK(cu.MemAlloc(mem, l->total) == 0, "cuMemAlloc %zu", l->total);
	CHECK(cu.MemcpyHtoD(*mem, h, l->total) == 0, "upload");
	CHECK(cu.StreamSynchronize(NULL) == 0, "upload sync");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)*mem, l->total, b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	if (host)
		*host = h;
	else
		free(h);
	return 0;
}

static int open_client(fa_client **c)
{
	char why[256];
	CHECK(fa_cu_start(0, why, sizeof why) == 0, "CUDA: %s", why);
	CHECK(fa_client_open(c, g_url) == FA_OK, "open %s: %s", g_url, fa_last_error_detail());
	fa_client_set_timeout(*c, fa_test_ms(120000));
	return 0;
}

/* Both clients warm (kernels compiled, buffers registered) before the window opens; the window
 * ends after g_seconds or when the other side failed (stop). */
static void wait_go(int parties)
{
	atomic_fetch_add(&B->ready, 1);
	while (atomic_load(&B->ready) < parties && !atomic_load(&B->stop))
		usleep(200);
	uint64_t expect = 0;
	atomic_compare_exchange_strong(&B->go_us, &expect, fa_test_now_us() + 20000);
	while (fa_test_now_us() < atomic_load(&B->go_us))
		;
}

static bool window_open(void)
{
	return !atomic_load(&B->stop) &&
	       fa_test_now_us() < atomic_load(&B->go_us) + (uint64_t)(g_seconds * 1e6);
}

/* The prefill client: synchronous calls back to back, or asynchronous ones PREFILL_DEPTH deep
 * on its own stream, until the window closes. */
static int child_prefill(int run, int parties, bool async)
{
	struct run_res *r = &B->r[run];
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	cu_ptr m = 0;
	void *s = NULL, *ev[PREFILL_DEPTH] = {0};

	if (open_client(&c) != 0 || upload(c, &prefill, &l, &m, &b, NULL) != 0)
		return atomic_store(&B->stop, 1), 1;
	fa_case_args(&prefill, &l, b, &a);
	CHECK(cu.StreamCreate(&s, 1) == 0, "stream");
	for (int i = 0; i < PREFILL_DEPTH; i++)
		CHECK(cu.EventCreate(&ev[i], 2 /* CU_EVENT_DISABLE_TIMING */) == 0, "event");
	CHECK(cu.MemsetD8(m + l.o_off, 0xff, (size_t)l.o_span * 2) == 0, "poison O"); /* NaN */
	for (int i = 0; i < 2; i++) /* compile, then one warm call */
		CHECK(fa_attn_fwd(c, &a) == FA_OK, "prefill warm-up: %s", fa_last_error_detail());
	wait_go(parties);
	uint64_t n = 0, t0 = fa_test_now_us();
	while (window_open()) {
		fa_status st;
		if (async) {
			int k = (int)(n % PREFILL_DEPTH);
			if (n >= PREFILL_DEPTH)
				CHECK(cu.EventSynchronize(ev[k]) == 0, "event sync");
			st = fa_attn_fwd_async(c, &a, s);
			CHECK(st != FA_OK || cu.EventRecord(ev[k], s) == 0, "event record");
		} else {
			st = fa_attn_fwd(c, &a);
		}
		if (st != FA_OK) {
			atomic_store(&B->stop, 1);
			CHECK(0, "prefill %" PRIu64 ": %s (%s)", n, fa_status_name(st),
			      fa_last_error_detail());
		}
		n++;
	}
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	CHECK(fa_client_flush(c) == FA_OK, "flush: %s", fa_last_error_detail());
	double secs = (double)(fa_test_now_us() - t0) / 1e6;
	r->prefills = n;
	r->rate = (double)n / secs;
	/* O written and finite (a NaN poison left would show); a sample of rows, not the reference
	 * (seconds of CPU at this size) */
	uint16_t row[128];
	for (int k = 0; k < 97; k++) {
		const int64_t i = (l.o_span - 128) / 96 * k;
		CHECK(cu.MemcpyDtoH(row, m + l.o_off + (uint64_t)i * 2, sizeof row) == 0, "download");
		for (int e = 0; e < 128; e++)
			CHECK(isfinite(fa_load_elem(row, FA_DTYPE_BF16, e)),
			      "prefill O[%lld] not finite (never written?)", (long long)(i + e));
	}
	fa_buffer_free(b);
	cu.MemFree(m);
	fa_client_close(c);
	r->ok = 1;
	return 0;
}

/* The small client: one synchronous call every g_interval_us at priority pri, each timed. */
static int child_small(int run, int parties, fa_priority pri)
{
	struct run_res *r = &B->r[run];
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	cu_ptr m = 0;
	void *host = NULL;

	if (open_client(&c) != 0 || upload(c, &small, &l, &m, &b, &host) != 0)
		return atomic_store(&B->stop, 1), 1;
	fa_case_args(&small, &l, b, &a);
	a.priority = pri;
	for (int i = 0; i < 20; i++)
		CHECK(fa_attn_fwd(c, &a) == FA_OK, "small warm-up: %s", fa_last_error_detail());
	wait_go(parties);
	int n = 0;
	uint64_t next = fa_test_now_us();
	while (window_open() && n < MAX_SAMPLES) {
		while (fa_test_now_us() < next)
			;
		uint64_t t0 = fa_test_now_us();
		fa_status st = fa_attn_fwd(c, &a);
		uint64_t t1 = fa_test_now_us();
		if (st != FA_OK) {
			atomic_store(&B->stop, 1);
			CHECK(0, "small %d: %s (%s)", n, fa_status_name(st), fa_last_error_detail());
		}
		B->samples[n++] = (double)(t1 - t0);
		next = t0 + (uint64_t)g_interval_us;
	}
	char why[256];
	CHECK(n > 0, "no small request timed");
	CHECK(cu.MemcpyDtoH(host, m, l.total) == 0, "download");
	CHECK(fa_case_check(&small, &l, host, &r->err, why, sizeof why), "small result: %s", why);
	r->n = n;
	r->p50 = fa_test_percentile(B->samples, (size_t)n, 50);
	r->p99 = fa_test_percentile(B->samples, (size_t)n, 99);
	r->max = fa_test_percentile(B->samples, (size_t)n, 100);
	r->hi_wait_max_us = fa_integ_stat(c, "queue_high_wait_us_max");
	fa_buffer_free(b);
	cu.MemFree(m);
	free(host);
	fa_client_close(c);
	r->ok = 1;
	return 0;
}

static pid_t spawn(int run, int role)
{
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p != 0)
		return p;
	bool pre = run != RUN_S, sm = run != RUN_A && run != RUN_AA;
	int parties = (int)pre + (int)sm;
	bool async = run == RUN_AA || run == RUN_HA;
	if (role == 0)
		_exit(child_prefill(run, parties, async));
	_exit(child_small(run, parties, run == RUN_N ? FA_PRIORITY_NORMAL : FA_PRIORITY_HIGH));
}

/* One run: its clients forked together, waited for (bounded). 0 when every one succeeded. */
static int run_once(int run)
{
	pid_t p[2] = {-1, -1};
	atomic_store(&B->ready, 0);
	atomic_store(&B->stop, 0);
	atomic_store(&B->go_us, 0);
	if (run != RUN_S)
		p[0] = spawn(run, 0);
	if (run != RUN_A && run != RUN_AA)
		p[1] = spawn(run, 1);
	int rc = 0;
	for (int i = 0; i < 2; i++)
		if (p[i] > 0 && fa_test_waitpid(p[i], fa_test_ms(300000)) != 0) {
			fprintf(stderr, "bench_priority: run %s: %s client failed\n", run_names[run],
			        i ? "small" : "prefill");
			atomic_store(&B->stop, 1);
			rc = 1;
		}
	return rc;
}

static int child_probe(void)
{
	return fa_cu_start(0, B->why, sizeof B->why) == 0 ? 0 : 3;
}

static const char *verdict(bool met)
{
	return met ? "met" : "NOT met";
}

static void print_results(void)
{
	const struct run_res *r = B->r;
	printf("\n== bench_priority: a small high-priority request beside a saturating prefill "
	       "client, one run, %.1f s per run, a small request every %d us\n", g_seconds,
	       g_interval_us);
	printf("prefill bf16 B1 S16384 Hq32 Hkv8 D128 causal; small bf16 B1 S256 H8 D64\n");
	printf("  %-4s %-44s %12s %9s %9s %9s %6s\n", "run", "what", "prefill/s", "p50 us",
	       "p99 us", "max us", "small");
	static const char *const what[NRUNS] = {
		"prefill alone, sync (anchor)", "small alone, high (anchor)",
		"prefill sync + small high", "prefill sync + small normal",
		"prefill async x4 alone (anchor)", "prefill async x4 + small high"};
	for (int k = 0; k < NRUNS; k++) {
		if (!r[k].ok) {
			printf("  %-4s %-44s %12s\n", run_names[k], what[k], "- (failed)");
			continue;
		}
		printf("  %-4s %-44s ", run_names[k], what[k]);
		if (k == RUN_S)
			printf("%12s", "-");
		else
			printf("%12.2f", r[k].rate);
		if (k == RUN_A || k == RUN_AA)
			printf("\n");
		else
			printf(" %9.1f %9.1f %9.1f %6d\n", r[k].p50, r[k].p99, r[k].max, r[k].n);
	}
	for (int k = RUN_H; k < NRUNS; k += 3) { /* H against A, Ha against Aa */
		int a = k == RUN_H ? RUN_A : RUN_AA;
		if (!r[k].ok || !r[a].ok || r[a].rate <= 0)
			continue;
		double ratio = r[k].rate / r[a].rate;
		printf("  %s: small p99 %.2f ms (target <= 3 ms: %s); prefill %.3fx of %s (target "
		       ">= 0.95x: %s); queue_high_wait_us_max %" PRIu64 "\n", run_names[k],
		       r[k].p99 / 1e3, verdict(r[k].p99 <= 3000), ratio, run_names[a],
		       verdict(ratio >= 0.95), r[k].hi_wait_max_us);
	}
	if (r[RUN_N].ok && r[RUN_H].ok)
		printf("  what the class buys: small p99 %.2f ms at normal priority vs %.2f ms at "
		       "high\n", r[RUN_N].p99 / 1e3, r[RUN_H].p99 / 1e3);
	printf("  small results against float64: worst relative error %.2g\n",
	       fmax(fmax(r[RUN_S].err, r[RUN_H].err), fmax(r[RUN_N].err, r[RUN_HA].err)));
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-t") && i + 1 < argc)
			g_seconds = atof(argv[++i]);
		else if (!strcmp(argv[i], "-i") && i + 1 < argc)
			g_interval_us = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [-t SECONDS] [-i INTERVAL_US]\n", argv[0]);
			return 2;
		}
	}
	if (!(g_seconds >= 0.2))
		g_seconds = 0.2;
	if (g_interval_us < 0)
		g_interval_us = 0;
	B = mmap(NULL, sizeof *B, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (B == MAP_FAILED)
		return 1;
	memset(B, 0, sizeof *B);
	fflush(stdout);
	pid_t p = fork();
	if (p == 0)
		_exit(child_probe());
	if (p < 0 || fa_test_waitpid(p, fa_test_ms(60000)) != 0) {
		printf("bench_priority: skipped: no GPU (%s)\n", B->why[0] ? B->why : "probe failed");
		return 0;
	}
	struct fa_daemon d;
	char cache[64], cmd[96];
	snprintf(cache, sizeof cache, "/tmp/fa-bench-priority.%d", (int)getpid());
	if (daemon_start(&d, "--backend", "gpu", "--cache-dir", cache, NULL) != 0) {
		fprintf(stderr, "bench_priority: the daemon did not start\n");
		daemon_log_dump(&d, 30);
		daemon_cleanup(&d);
		return 1;
	}
	snprintf(g_url, sizeof g_url, "%s", d.url);
	int rc = 0;
	for (int k = 0; k < NRUNS; k++) {
		if (!daemon_alive(&d)) {
			fprintf(stderr, "bench_priority: the daemon is gone (exit status %d)\n",
			        d.status);
			rc = 1;
			break;
		}
		fprintf(stderr, "bench_priority: run %s\n", run_names[k]);
		rc |= run_once(k);
	}
	if (daemon_stop(&d) != 0 || !daemon_log_clean(&d)) {
		fprintf(stderr, "bench_priority: the daemon's exit was not clean\n");
		daemon_log_dump(&d, 30);
		rc = 1;
	}
	daemon_cleanup(&d);
	snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_priority: %s failed\n", cmd);
	print_results();
	return rc;
}
