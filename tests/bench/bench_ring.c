/* bench_ring.c - issue 12's three serving figures, each against its anchor in the same run, on
 * a GPU: the submission ring (the default client) against the socket (FA_RING=0), and the
 * daemon as it was ("legacy": --loop-spin-us 0 --prewake-us 0) against its defaults ("new":
 * the loop and ring thread kept awake after a completion, the worker's prewake), two daemons
 * one after the other in the same run.
 *
 *   bench_ring [-n N] [-l LARGE] [-x]   (default 2000 calls per latency series, 30 large
 *                                        requests; -x: the new daemon only)
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
 * Two more in-process anchors split the "kernel ran slower" part: the same kernel launched one
 * at a time with the daemon's old idle gap (a synchronous client's ~350 us) between launches
 * (clocks and power with gaps), and launched on memory another process exported by CUDA IPC,
 * as the daemon sees a client's buffers. The daemon's launch calls' host time per job (STATS
 * gpu_enqueue_host_us) is printed beside the in-process one's. The rotation anchors: bench_serving's
 * 8-client request (bf16 B1 S4096) launched back to back over 8 tensor sets in turn, on local
 * memory and on memory another process exported, interleaved repeats with medians (8 imported
 * allocations of 64 MiB + 256 B ran 0.91x of local, the same rounded to 2 MiB 1.00x:
 * bench_ipcmem.c, the full study, and daemon/RESULTS.md 2026-12-03 16:53 UTC).
 *
 * (4) The host time of one fa_gpu_attn_fwd call in-process (the call alone, no sync), p50, for
 *     the tiny and the large shape, with the launch memo (kernels/fa_launch_memo.h) against
 *     without (a second fa_gpu with fa_gpu_set_launch_memo off, launches alternating between
 *     the two), and a shape's first launch (kernel loaded, plan not remembered yet) against its
 *     repeat. -a: the in-process anchors only (no daemons, no IPC anchor: a quick run).
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
#include <time.h>
#include <unistd.h>

#include "fa_cudrv.h"
#include "fa_gpu.h"
#include "fa_integ.h"
#include "fa_ksettings.h"

#define WARMUP 100
#define ROT_SETS 8 /* tensor sets of the rotation anchors */
#define ROT_LAUNCHES 200 /* a block of the rotation anchors (about 80 ms) */
#define ROT_REPS 8       /* interleaved repeats of the three blocks */

static const struct fa_case tiny = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 128, .Sk = 128,
                                    .Hq = 16, .Hkv = 16, .D = 64};
static const struct fa_case small_async = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128,
                                           .Sk = 128, .Hq = 4, .Hkv = 4, .D = 64};
/* One client's request of bench_serving's 8-client run (bf16 B1 H16 S4096 D128): the
 * rotation anchors' shape. */
static const struct fa_case rot1 = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 4096, .Sk = 4096,
                                    .Hq = 16, .Hkv = 16, .D = 128};
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
	double enq_us;              /* per large sync job: the worker's launch calls (host) */
	uint64_t prewakes, prewakes_late, ring_thread_wakes, prewake_client_wakes;
	double detect_us;           /* large sync: a job's end to the worker's seeing it */
	double turnaround_us;       /* large sync, ring: a completion to the client's next entry */
	uint64_t reply_wakes;       /* large sync, ring: completions that found the client asleep */
	double tiny_hop_us;         /* tiny run: ring thread's copy -> loop's dispatch, mean */
	double tiny_queue_us;       /* tiny run, mean per call: the daemon's time outside the
	                             * backend (decode, validate, submit, the hand-back; STATS
	                             * fwd_queue_sum_us) */
	double tiny_compute_us;     /* tiny run: the backend's span (fwd_compute_sum_us: the
	                             * inline launch + sync on the loop) */
	double tiny_inline;         /* tiny run: the fraction of calls run inline on the loop */
	double tiny_mean_us;        /* tiny run: the client's mean per call (the split's total) */
	double async_ms, async_gap_us; /* large async run: kernel time and gap on the session's
	                                * stream (events around each kernel) */
	uint64_t async_gaps;
	int ok;
};

#define VARIANTS 2 /* 0 legacy (--loop-spin-us 0 --prewake-us 0), 1 new (the defaults) */
static const char *const variant_name[VARIANTS] = {"legacy", "new"};

struct board {
	char why[256];
	double in_tiny50, in_tiny99, in_kernel_ms, in_tflops;
	double in_tiny_hi50;          /* the same on a stream of the device's greatest priority,
	                               * as the daemon's inline runs use (0: none) */
	double in_sync_tflops; /* the large kernel launched and waited for one at a time, as a
	                        * synchronous caller of fa_gpu_attn_fwd in its own process */
	double in_launch_us;          /* host time of one large fa_gpu_attn_fwd call (the launch) */
	/* (4): launch call host time p50 [0 tiny, 1 large][0 memo on, 1 off]; a new shape's first
	 * launch and its repeats (p50), memo on */
	double lh50[2][2], lh_first_us, lh_repeat_us;
	/* where a launch call's host time goes, per call (mean ns): the planning a memo hit skips
	 * (fa_gpu_plan, the large shape), the context call before (set) and now (get) */
	double plan_ns, ctx_set_ns, ctx_get_ns;
	uint64_t memo_hits, memo_misses;
	int lh_ok;
	double in_gapped_ms;          /* the kernel by events, launched alone after ~350 us idle */
	double in_ipc_ms, in_ipc_tflops; /* on memory another process exported by CUDA IPC */
	int in_ok, ipc_ok;
	/* the rotation anchors (ROT_SETS tensor sets of the B1 shape in turn, as 8 clients'):
	 * local memory, and memory another process exported by CUDA IPC, as the daemon sees it */
	double rot_tflops[3], rot_ms[3]; /* [local, IPC, one IPC set] medians over the repeats */
	double rot_ratio[3], rot_ratio_lo[3], rot_ratio_hi[3]; /* / local in the same repeat */
	int rot_ok;
	/* the IPC anchor's two processes */
	struct fa_cu_ipc_handle ipc_handle;
	struct fa_cu_ipc_handle rot_handle[ROT_SETS];
	volatile int ipc_state;       /* 1: exported, 2: the importer is done (or gave up) */
	struct mode_res m[VARIANTS][2]; /* [variant][0 socket, 1 ring] */
};

static struct board *B;
static char g_url[FA_TEST_PATH_MAX + 8];
static char g_cache[64];
static int g_n = 2000, g_large = 30, g_variant;
static bool g_anchors_only;

/* Nanoseconds (the launch call's host time is a few microseconds). */
static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median of n values (sorted in place), with the min and max. */
static double med(double *v, int n, double *lo, double *hi)
{
	qsort(v, (size_t)n, sizeof *v, cmpd);
	*lo = v[0];
	*hi = v[n - 1];
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
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
	CHECK(cu.MemAlloc(mem, fa_test_client_alloc_bytes(l->total)) == 0, "cuMemAlloc %zu",
	      l->total);
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

/* The kernel's mean time by events over n launches one at a time, each after gap_us of idle
 * (0: none). 0, or -1 with err (a launch's text, or the event that failed). */
static int kernel_ms(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, cu_ptr m,
                     const struct fa_case_layout *l, void *s, void *ev[2], int n,
                     unsigned gap_us, double *out, char *err, size_t errlen)
{
	double sum = 0;
	for (int i = 0; i < n; i++) {
		float ms = 0;
		if (gap_us > 0)
			usleep(gap_us);
		cu.EventRecord(ev[0], s);
		if (launch(g, d, m, l, s, err, errlen) != FA_OK)
			return -1;
		cu.EventRecord(ev[1], s);
		if (cu.EventSynchronize(ev[1]) != 0 || cu.EventElapsedTime(&ms, ev[0], ev[1]) != 0) {
			snprintf(err, errlen, "the timing events failed");
			return -1;
		}
		sum += ms;
	}
	*out = sum / n;
	return 0;
}

/* g_large launches back to back, synchronised at the end: TFLOP/s. 0, or -1 with err. */
static int back_to_back_tflops(struct fa_gpu *g, const struct fa_attn_fwd_desc *d, cu_ptr m,
                               const struct fa_case_layout *l, void *s, double *out, char *err,
                               size_t errlen)
{
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < g_large; i++)
		if (launch(g, d, m, l, s, err, errlen) != FA_OK)
			return -1;
	if (cu.StreamSynchronize(s) != 0) {
		snprintf(err, errlen, "cuStreamSynchronize failed");
		return -1;
	}
	*out = flop(&large) * g_large / ((double)(fa_test_now_us() - t0) / 1e6) / 1e12;
	return 0;
}

/* (4): the launch call's host time, memo on (g) against off (a second fa_gpu), alternating. */
static int launch_host_times(struct fa_gpu *g, const struct fa_kernel_settings *ks, void *s)
{
	char err[1024];
	struct fa_gpu *off = NULL;
	const struct fa_case *cs[2] = {&tiny, &large};
	const int n[2] = {g_n, g_large * 4};
	CHECK(fa_gpu_open(&off, 0, ks, err, sizeof err) == FA_OK, "fa_gpu_open: %s", err);
	fa_gpu_set_cache_dir(off, g_cache, err, sizeof err);
	fa_gpu_set_launch_memo(off, false);
	for (int c = 0; c < 2; c++) {
		struct fa_case_layout l;
		struct fa_attn_fwd_desc d;
		cu_ptr m = 0;
		double *v[2] = {calloc((size_t)n[c], sizeof(double)), calloc((size_t)n[c],
		                                                              sizeof(double))};
		CHECK(v[0] && v[1], "calloc");
		CHECK(upload(cs[c], &l, &m) == 0, "upload");
		fa_case_desc(cs[c], &l, &d);
		for (int i = -10; i < n[c]; i++)
			for (int k = 0; k < 2; k++) {
				uint64_t t0 = now_ns();
				CHECK(launch(k ? off : g, &d, m, &l, s, err, sizeof err) == FA_OK,
				      "launch: %s", err);
				uint64_t t1 = now_ns();
				if (i >= 0)
					v[k][i] = (double)(t1 - t0) / 1e3;
				/* the tiny one as a synchronous client runs it; the large one's queue
				 * stays a few launches deep so the call never waits for the GPU */
				if (c == 0 || i % 4 == 3)
					CHECK(cu.StreamSynchronize(s) == 0, "sync");
			}
		CHECK(cu.StreamSynchronize(s) == 0, "sync");
		double p99;
		pct(v[0], n[c], &B->lh50[c][0], &p99);
		pct(v[1], n[c], &B->lh50[c][1], &p99);
		if (c == 1) {
			/* a new shape whose kernel is loaded (fa_gpu_prepare) but whose plan is not
			 * remembered: the first launch plans, the repeats do not */
			d.B = 7;
			CHECK(fa_gpu_prepare(g, &d, NULL, err, sizeof err) == FA_OK, "prepare: %s", err);
			uint64_t t0 = now_ns();
			CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "launch: %s", err);
			B->lh_first_us = (double)(now_ns() - t0) / 1e3;
			for (int i = 0; i < 9; i++) {
				t0 = now_ns();
				CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "launch: %s",
				      err);
				v[0][i] = (double)(now_ns() - t0) / 1e3;
			}
			pct(v[0], 9, &B->lh_repeat_us, &p99);
			CHECK(cu.StreamSynchronize(s) == 0, "sync");
		}
		cu.MemFree(m);
		free(v[0]);
		free(v[1]);
	}
	{
		struct fa_case_layout l;
		struct fa_attn_fwd_desc d;
		struct fa_tile t;
		fa_case_layout(&large, &l);
		fa_case_desc(&large, &l, &d);
		const int reps = 20000;
		int nt = 0;
		uint64_t t0 = now_ns();
		for (int i = 0; i < reps; i++)
			CHECK(fa_gpu_plan(g, &d, &t, 1, &nt, err, sizeof err) == FA_OK, "plan: %s", err);
		B->plan_ns = (double)(now_ns() - t0) / reps;
		fa_cu_ctx ctx = NULL;
		CHECK(cu.CtxGetCurrent(&ctx) == 0 && ctx != NULL, "cuCtxGetCurrent");
		t0 = now_ns();
		for (int i = 0; i < reps; i++)
			cu.CtxSetCurrent(ctx);
		B->ctx_set_ns = (double)(now_ns() - t0) / reps;
		t0 = now_ns();
		for (int i = 0; i < reps; i++)
			cu.CtxGetCurrent(&ctx);
		B->ctx_get_ns = (double)(now_ns() - t0) / reps;
	}
	struct fa_gpu_memo_stats ms;
	fa_gpu_launch_memo_stats(g, &ms);
	B->memo_hits = ms.hits;
	B->memo_misses = ms.misses;
	B->lh_ok = 1;
	fa_gpu_close(off);
	return 0;
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
		uint64_t t0 = now_ns(); /* ns: p50s of 13-22 us in microsecond ticks moved ratios */
		CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "tiny: %s", err);
		CHECK(cu.StreamSynchronize(s) == 0, "sync");
		if (i >= 0)
			v[i] = (double)(now_ns() - t0) / 1e3;
	}
	pct(v, g_n, &B->in_tiny50, &B->in_tiny99);
	{ /* the daemon's inline stream has the greatest priority: what that costs alone */
		int least = 0, greatest = 0;
		void *hs = NULL;
		if (cu.CtxGetStreamPriorityRange(&least, &greatest) == 0 && greatest < least &&
		    cu.StreamCreateWithPriority(&hs, 1, greatest) == 0) {
			double p99;
			for (int i = -WARMUP; i < g_n; i++) {
				uint64_t t0 = now_ns();
				CHECK(launch(g, &d, m, &l, hs, err, sizeof err) == FA_OK, "tiny: %s", err);
				CHECK(cu.StreamSynchronize(hs) == 0, "sync");
				if (i >= 0)
					v[i] = (double)(now_ns() - t0) / 1e3;
			}
			pct(v, g_n, &B->in_tiny_hi50, &p99);
			cu.StreamDestroy(hs);
		}
	}
	cu.MemFree(m);
	CHECK(upload(&large, &l, &m) == 0, "upload");
	fa_case_desc(&large, &l, &d);
	CHECK(cu.EventCreate(&ev[0], 0) == 0 && cu.EventCreate(&ev[1], 0) == 0, "events");
	for (int i = 0; i < 3; i++)
		CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "large: %s", err);
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	/* the kernel alone, one at a time */
	CHECK(kernel_ms(g, &d, m, &l, s, ev, 5, 0, &B->in_kernel_ms, err, sizeof err) == 0,
	      "large: %s", err);
	uint64_t tl = fa_test_now_us();
	CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "large: %s", err);
	B->in_launch_us = (double)(fa_test_now_us() - tl);
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	CHECK(back_to_back_tflops(g, &d, m, &l, s, &B->in_tflops, err, sizeof err) == 0,
	      "large: %s", err);
	{ /* a synchronous caller in-process: launch, cuStreamSynchronize, the next launch */
		uint64_t ts = fa_test_now_us();
		for (int i = 0; i < g_large; i++) {
			CHECK(launch(g, &d, m, &l, s, err, sizeof err) == FA_OK, "large: %s", err);
			CHECK(cu.StreamSynchronize(s) == 0, "sync");
		}
		B->in_sync_tflops = flop(&large) * g_large /
		                    ((double)(fa_test_now_us() - ts) / 1e6) / 1e12;
	}
	/* one at a time after an idle gap like the daemon's old one: clocks, power */
	CHECK(kernel_ms(g, &d, m, &l, s, ev, 10, 350, &B->in_gapped_ms, err, sizeof err) == 0,
	      "large: %s", err);
	B->in_ok = 1;
	cu.MemFree(m);
	if (launch_host_times(g, &ks, s) != 0)
		fprintf(stderr, "bench_ring: the launch host times failed (a figure only)\n");
	fa_gpu_close(g);
	free(v);
	return 0;
}

/* The IPC anchor's exporter: the large case's memory, its handle on the board, kept until the
 * importer is done (at most two minutes). */
static int child_ipc_export(void)
{
	char why[256];
	struct fa_case_layout l;
	cu_ptr m = 0;

	cu_ptr rm[ROT_SETS] = {0};
	if (fa_cu_start(0, why, sizeof why) != 0 || upload(&large, &l, &m) != 0 ||
	    cu.IpcGetMemHandle(&B->ipc_handle, m) != 0) {
		B->ipc_state = 2;
		return 1;
	}
	for (int i = 0; i < ROT_SETS; i++)
		if (upload(&rot1, &l, &rm[i]) != 0 || cu.IpcGetMemHandle(&B->rot_handle[i], rm[i]) != 0) {
			B->ipc_state = 2;
			return 1;
		}
	__atomic_store_n(&B->ipc_state, 1, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 120000 && __atomic_load_n(&B->ipc_state, __ATOMIC_SEQ_CST) != 2; i++)
		usleep(1000);
	cu.MemFree(m);
	for (int i = 0; i < ROT_SETS; i++)
		cu.MemFree(rm[i]);
	return 0;
}

/* The rotation anchors: ROT_LAUNCHES launches back to back over ROT_SETS sets in turn (8
 * clients' requests as the daemon's worker launches them) on this process's own memory, on the
 * exporter's, and on one exported set again and again. Interleaved: ROT_REPS repeats of the
 * three, the order rotated and reversed every other repeat, so drifting clocks and heat fall on
 * all three alike; medians with min..max, the ratios paired within a repeat (tests/bench/
 * bench_ipcmem.c is the full study). A kernel's time: the block's span by events over its
 * launches. */
static int rot_anchors(struct fa_gpu *g, void *s)
{
	char err[1024] = "";
	struct fa_case_layout rl;
	struct fa_attn_fwd_desc rd;
	cu_ptr loc[ROT_SETS] = {0}, imp[ROT_SETS] = {0};
	void *ev[2] = {0};
	double tf[3][ROT_REPS], ms[3][ROT_REPS];
	int rc = 1;

	fa_case_layout(&rot1, &rl);
	fa_case_desc(&rot1, &rl, &rd);
	if (cu.EventCreate(&ev[0], 0) != 0 || cu.EventCreate(&ev[1], 0) != 0)
		goto out;
	for (int i = 0; i < ROT_SETS; i++)
		if (upload(&rot1, &rl, &loc[i]) != 0 ||
		    cu.IpcOpenMemHandle(&imp[i], B->rot_handle[i], 1) != 0)
			goto out;
	for (int i = 0; i < ROT_SETS; i++) /* warm: each set once */
		if (launch(g, &rd, loc[i], &rl, s, err, sizeof err) != FA_OK ||
		    launch(g, &rd, imp[i], &rl, s, err, sizeof err) != FA_OK)
			goto out;
	if (cu.StreamSynchronize(s) != 0)
		goto out;
	for (int r = 0; r < ROT_REPS; r++)
		for (int j = 0; j < 3; j++) {
			int k = (r + j) % 3;
			k = r % 2 ? 2 - k : k;
			const cu_ptr *set = k == 0 ? loc : imp;
			float span = 0;
			cu.EventRecord(ev[0], s);
			for (int i = 0; i < ROT_LAUNCHES; i++)
				if (launch(g, &rd, set[k == 2 ? 0 : i % ROT_SETS], &rl, s, err,
				           sizeof err) != FA_OK)
					goto out;
			cu.EventRecord(ev[1], s);
			if (cu.EventSynchronize(ev[1]) != 0 ||
			    cu.EventElapsedTime(&span, ev[0], ev[1]) != 0)
				goto out;
			ms[k][r] = span / ROT_LAUNCHES;
			tf[k][r] = flop(&rot1) * ROT_LAUNCHES / (span / 1e3) / 1e12;
		}
	for (int k = 0; k < 3; k++) {
		double ratio[ROT_REPS], lo, hi;
		for (int r = 0; r < ROT_REPS; r++)
			ratio[r] = tf[k][r] / tf[0][r];
		B->rot_ratio[k] = med(ratio, ROT_REPS, &lo, &hi);
		B->rot_ratio_lo[k] = lo;
		B->rot_ratio_hi[k] = hi;
		B->rot_tflops[k] = med(tf[k], ROT_REPS, &lo, &hi);
		B->rot_ms[k] = med(ms[k], ROT_REPS, &lo, &hi);
	}
	B->rot_ok = 1;
	rc = 0;
out:
	if (rc != 0)
		fprintf(stderr, "bench_ring: the rotation anchors failed (%s)\n", err);
	for (int i = 0; i < ROT_SETS; i++) {
		if (loc[i] != 0)
			cu.MemFree(loc[i]);
		if (imp[i] != 0)
			cu.IpcCloseMemHandle(imp[i]);
	}
	for (int i = 0; i < 2; i++)
		if (ev[i] != NULL)
			cu.EventDestroy(ev[i]);
	return rc;
}

/* The IPC anchor's importer: the kernel by events and back to back on the exported memory. */
static int child_ipc_import(void)
{
	char why[256] = "", err[1024] = "no exporter";
	struct fa_gpu *g = NULL;
	struct fa_kernel_settings ks;
	struct fa_case_layout l;
	struct fa_attn_fwd_desc d;
	cu_ptr m = 0;
	void *s = NULL, *ev[2] = {0};
	int rc = 1;

	for (int i = 0; i < 60000 && __atomic_load_n(&B->ipc_state, __ATOMIC_SEQ_CST) == 0; i++)
		usleep(1000);
	if (B->ipc_state != 1 || fa_cu_start(0, why, sizeof why) != 0)
		goto out;
	fa_test_kernel_settings(&ks);
	if (fa_gpu_open(&g, 0, &ks, err, sizeof err) != FA_OK)
		goto out;
	fa_gpu_set_cache_dir(g, g_cache, err, sizeof err);
	if (cu.IpcOpenMemHandle(&m, B->ipc_handle, 1 /* lazy peer access */) != 0 ||
	    cu.StreamCreate(&s, 1) != 0 || cu.EventCreate(&ev[0], 0) != 0 ||
	    cu.EventCreate(&ev[1], 0) != 0)
		goto out;
	fa_case_layout(&large, &l);
	fa_case_desc(&large, &l, &d);
	for (int i = 0; i < 3; i++)
		if (launch(g, &d, m, &l, s, err, sizeof err) != FA_OK)
			goto out;
	cu.StreamSynchronize(s);
	if (kernel_ms(g, &d, m, &l, s, ev, 5, 0, &B->in_ipc_ms, err, sizeof err) != 0 ||
	    back_to_back_tflops(g, &d, m, &l, s, &B->in_ipc_tflops, err, sizeof err) != 0)
		goto out;
	B->ipc_ok = 1;
	rc = 0;
	rot_anchors(g, s); /* a figure only: its failure is said on stderr */
out:
	if (rc != 0)
		fprintf(stderr, "bench_ring: the IPC anchor failed (%s)\n", err);
	if (m != 0)
		cu.IpcCloseMemHandle(m);
	if (g != NULL)
		fa_gpu_close(g);
	__atomic_store_n(&B->ipc_state, 2, __ATOMIC_SEQ_CST);
	return rc;
}

static uint64_t stat_get(fa_client *c, const char *key)
{
	uint64_t v = fa_integ_stat(c, key);
	return v == UINT64_MAX ? 0 : v;
}

/* One client mode (0: FA_RING=0, the socket; 1: the ring) against the daemon of g_variant:
 * the three figures. */
static int child_daemon(int mode)
{
	struct mode_res *r = &B->m[g_variant][mode];
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
	uint64_t ent0 = 0, hop0 = 0, q0 = 0, qn0 = 0, c0 = 0, inl0 = 0;
	for (int i = -WARMUP; i < g_n; i++) {
		if (i == 0) {
			ent0 = stat_get(c, "ring_entries");
			hop0 = stat_get(c, "ring_hop_us_total");
			q0 = stat_get(c, "fwd_queue_sum_us");
			qn0 = stat_get(c, "fwd_queue_count");
			c0 = stat_get(c, "fwd_compute_sum_us");
			inl0 = stat_get(c, "gpu_inline_jobs");
		}
		uint64_t t0 = now_ns();
		fa_status st = fa_attn_fwd(c, &a);
		CHECK(st == FA_OK, "tiny: %s (%s)", fa_status_name(st), fa_last_error_detail());
		if (i >= 0)
			v[i] = (double)(now_ns() - t0) / 1e3;
	}
	double sum = 0;
	for (int i = 0; i < g_n; i++)
		sum += v[i];
	r->tiny_mean_us = g_n > 0 ? sum / g_n : 0;
	pct(v, g_n, &r->tiny50, &r->tiny99);
	{ /* where a tiny call's time goes, means over the series (the STATS calls are not
	   * forwards: they leave these sums alone) */
		uint64_t qn = stat_get(c, "fwd_queue_count") - qn0;
		if (qn > 0) {
			r->tiny_queue_us = (double)(stat_get(c, "fwd_queue_sum_us") - q0) / (double)qn;
			r->tiny_compute_us =
			    (double)(stat_get(c, "fwd_compute_sum_us") - c0) / (double)qn;
			r->tiny_inline = (double)(stat_get(c, "gpu_inline_jobs") - inl0) / (double)qn;
		}
	}
	if (mode == 1) { /* the ring thread -> loop hop over the tiny run (the STATS calls'
	                  * own entries go by the socket) */
		uint64_t e1 = stat_get(c, "ring_entries"), h1 = stat_get(c, "ring_hop_us_total");
		if (e1 > ent0)
			r->tiny_hop_us = (double)(h1 - hop0) / (double)(e1 - ent0);
	}
	fa_buffer_free(b);
	cu.MemFree(m);

	/* (1) asynchronous enqueue, the case */
	CHECK(upload(&small_async, &l, &m) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)m, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&small_async, &l, b, &a);
	for (int i = -WARMUP; i < g_n; i++) {
		uint64_t t0 = now_ns();
		fa_status st = fa_attn_fwd_async(c, &a, s);
		double us = (double)(now_ns() - t0) / 1e3;
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
	uint64_t enq0 = stat_get(c, "gpu_enqueue_host_us"), enqn0 = stat_get(c, "gpu_enqueues");
	uint64_t pw0 = stat_get(c, "gpu_prewakes"), pwl0 = stat_get(c, "gpu_prewakes_late");
	uint64_t tw0 = stat_get(c, "ring_thread_wakes");
	uint64_t pcw0 = stat_get(c, "ring_prewake_client_wakes");
	uint64_t det0 = stat_get(c, "gpu_detect_us"), detn0 = stat_get(c, "gpu_detects");
	uint64_t ta0 = stat_get(c, "ring_turnaround_us_total"), tan0 = stat_get(c, "ring_turnarounds");
	uint64_t rw0 = stat_get(c, "ring_client_wakes");
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < g_large; i++)
		CHECK(fa_attn_fwd(c, &a) == FA_OK, "large: %s", fa_last_error_detail());
	double secs = (double)(fa_test_now_us() - t0) / 1e6;
	r->sync_tflops = flop(&large) * g_large / secs / 1e12;
	uint64_t busy1 = stat_get(c, "gpu_busy_us"), jobs1 = stat_get(c, "gpu_timed_jobs");
	uint64_t gap1 = stat_get(c, "gpu_gap_short_us"), gaps1 = stat_get(c, "gpu_gaps_short");
	uint64_t wj1 = stat_get(c, "gpu_worker_jobs"), pick1 = stat_get(c, "gpu_worker_us_to_pick");
	uint64_t loop1 = stat_get(c, "gpu_worker_us_to_loop");
	uint64_t enq1 = stat_get(c, "gpu_enqueue_host_us"), enqn1 = stat_get(c, "gpu_enqueues");
	if (enqn1 > enqn0)
		r->enq_us = (double)(enq1 - enq0) / (double)(enqn1 - enqn0);
	r->prewakes = stat_get(c, "gpu_prewakes") - pw0;
	r->prewakes_late = stat_get(c, "gpu_prewakes_late") - pwl0;
	r->ring_thread_wakes = stat_get(c, "ring_thread_wakes") - tw0;
	r->prewake_client_wakes = stat_get(c, "ring_prewake_client_wakes") - pcw0;
	uint64_t det1 = stat_get(c, "gpu_detect_us"), detn1 = stat_get(c, "gpu_detects");
	if (detn1 > detn0)
		r->detect_us = (double)(det1 - det0) / (double)(detn1 - detn0);
	uint64_t ta1 = stat_get(c, "ring_turnaround_us_total"), tan1 = stat_get(c, "ring_turnarounds");
	if (tan1 > tan0)
		r->turnaround_us = (double)(ta1 - ta0) / (double)(tan1 - tan0);
	r->reply_wakes = stat_get(c, "ring_client_wakes") - rw0;
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
	CHECK(cu.StreamSynchronize(s) == 0 && fa_client_flush(c) == FA_OK, "sync: %s",
	      fa_last_error_detail());
	usleep(50000); /* the session thread reads the warm-up's timing events */
	uint64_t ab0 = stat_get(c, "gpu_async_busy_us"), aj0 = stat_get(c, "gpu_async_timed_jobs");
	uint64_t ag0 = stat_get(c, "gpu_async_gap_us"), agn0 = stat_get(c, "gpu_async_gaps");
	t0 = fa_test_now_us();
	for (int i = 0; i < g_large; i++)
		CHECK(fa_attn_fwd_async(c, &a, s) == FA_OK, "large async: %s",
		      fa_last_error_detail());
	CHECK(cu.StreamSynchronize(s) == 0, "sync");
	secs = (double)(fa_test_now_us() - t0) / 1e6;
	CHECK(fa_client_flush(c) == FA_OK, "flush: %s", fa_last_error_detail());
	r->async_tflops = flop(&large) * g_large / secs / 1e12;
	usleep(50000);
	uint64_t ab1 = stat_get(c, "gpu_async_busy_us"), aj1 = stat_get(c, "gpu_async_timed_jobs");
	uint64_t ag1 = stat_get(c, "gpu_async_gap_us"), agn1 = stat_get(c, "gpu_async_gaps");
	if (aj1 > aj0)
		r->async_ms = (double)(ab1 - ab0) / 1e3 / (double)(aj1 - aj0);
	r->async_gaps = agn1 - agn0;
	if (agn1 > agn0)
		r->async_gap_us = (double)(ag1 - ag0) / (double)(agn1 - agn0);
	fa_buffer_free(b);
	cu.MemFree(m);
	fa_client_close(c);
	r->ok = 1;
	free(v);
	return 0;
}

/* which: -1 probe, 0/1 a daemon mode, 2 in-process, 3 IPC importer, 4 IPC exporter. */
static pid_t spawn_child(int which)
{
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p == 0)
		_exit(which < 0    ? child_probe()
		      : which == 2 ? child_inproc()
		      : which == 3 ? child_ipc_import()
		      : which == 4 ? child_ipc_export()
		                   : child_daemon(which));
	return p;
}

static int run_child(int which)
{
	pid_t p = spawn_child(which);
	return p < 0 ? -1 : fa_test_waitpid(p, fa_test_ms(300000));
}

/* One daemon (the variant's options), both client modes against it. */
static int run_variant(int variant)
{
	struct fa_daemon d;
	const char *spin = variant == 0 ? "0" : "-1", *pre = variant == 0 ? "0" : "-1";

	g_variant = variant;
	if (daemon_start(&d, "--backend", "gpu", "--cache-dir", g_cache, "--loop-spin-us", spin,
	                 "--prewake-us", pre, NULL) != 0) {
		fprintf(stderr, "bench_ring: the %s daemon did not start\n", variant_name[variant]);
		daemon_log_dump(&d, 30);
		daemon_cleanup(&d);
		return 1;
	}
	snprintf(g_url, sizeof g_url, "%s", d.url);
	int rc = 0;
	for (int k = 0; k < 2; k++) /* socket before ring */
		if (run_child(k) != 0) {
			fprintf(stderr, "bench_ring: %s daemon, %s client failed\n",
			        variant_name[variant], k ? "ring" : "socket");
			rc = 1;
		}
	daemon_stop(&d);
	daemon_cleanup(&d);
	return rc;
}

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

static void print_variant(int v)
{
	const struct mode_res *so = &B->m[v][0], *ri = &B->m[v][1];
	double in = B->in_tflops > 0 ? B->in_tflops : 1;

	printf("-- %s daemon (%s)\n", variant_name[v],
	       v == 0 ? "--loop-spin-us 0 --prewake-us 0: as before" : "defaults");
	printf("(1) async enqueue host time, fp16 B1 S128 H4 D64, %d calls: ring p50 %.1f us p99 "
	       "%.1f us; socket p50 %.1f us p99 %.1f us; target <= 20 us: %s\n", g_n, ri->enq50,
	       ri->enq99, so->enq50, so->enq99, ri->enq50 <= 20 ? "met" : "NOT met");
	printf("(2) tiny bf16 B1 H16 S128 D64 sync, %d calls: in-process launch+sync p50 %.1f us "
	       "p99 %.1f us; ring p50 %.1f us p99 %.1f us (%.2fx); socket p50 %.1f us p99 %.1f us "
	       "(%.2fx); target <= 1.5x: %s; ring thread -> loop hop %.1f us mean\n", g_n,
	       B->in_tiny50, B->in_tiny99, ri->tiny50, ri->tiny99, ratio(ri->tiny50, B->in_tiny50),
	       so->tiny50, so->tiny99, ratio(so->tiny50, B->in_tiny50),
	       B->in_tiny50 > 0 && ri->tiny50 <= 1.5 * B->in_tiny50 ? "met" : "NOT met",
	       ri->tiny_hop_us);
	for (int k = 1; k >= 0; k--) {
		const struct mode_res *r = &B->m[v][k];
		double mean = r->tiny_mean_us; /* the split's parts are means too */
		printf("    %s tiny, mean per call %.1f us: the daemon's kernel call (launch + sync, "
		       "%.0f%% inline on the loop) %.1f us, the daemon's own work around it (decode, "
		       "validate, submit, hand-back) %.1f us,%s%.1f us%s; the rest %.1f us (the "
		       "client's encode and decode, its wait, the reply's encode and post)\n",
		       k ? "ring" : "socket", mean, 100 * r->tiny_inline, r->tiny_compute_us,
		       r->tiny_queue_us, k ? " ring thread -> loop " : " ",
		       k ? r->tiny_hop_us : 0.0, k ? "" : " (no ring)",
		       mean - r->tiny_compute_us - r->tiny_queue_us - (k ? r->tiny_hop_us : 0));
	}
	printf("(3) large bf16 B8 H16 S4096 D128, %d requests: in-process %.1f TFLOP/s (kernel "
	       "%.3f ms); ring sync %.1f (%.3fx) async %.1f (%.3fx); socket sync %.1f (%.3fx) "
	       "async %.1f (%.3fx); target >= 0.97x: sync %s, async %s\n", g_large, B->in_tflops,
	       B->in_kernel_ms, ri->sync_tflops, ri->sync_tflops / in, ri->async_tflops,
	       ri->async_tflops / in, so->sync_tflops, so->sync_tflops / in, so->async_tflops,
	       so->async_tflops / in, ri->sync_tflops >= 0.97 * in ? "met" : "NOT met",
	       ri->async_tflops >= 0.97 * in ? "met" : "NOT met");
	printf("    large sync against an in-process synchronous caller (launch + sync each, "
	       "%.1f TFLOP/s): ring %.3fx, socket %.3fx\n", B->in_sync_tflops,
	       ratio(ri->sync_tflops, B->in_sync_tflops), ratio(so->sync_tflops, B->in_sync_tflops));
	for (int k = 1; k >= 0; k--) {
		const struct mode_res *r = &B->m[v][k];
		printf("    %s sync: daemon GPU time %.3f ms per request (%.3fx the in-process "
		       "kernel), %" PRIu64 " gaps of %.1f us mean (max %.1f us since start); per job "
		       "submit->worker pick %.1f us, done->loop %.1f us, launch calls %.1f us (in-"
		       "process %.1f us); prewakes %" PRIu64 " (%" PRIu64 " late), ring thread wakes "
		       "%" PRIu64 ", clients woken early %" PRIu64 "\n",
		       k ? "ring" : "socket", r->gpu_ms, ratio(r->gpu_ms, B->in_kernel_ms), r->gaps,
		       r->gap_us, r->gap_max_us, r->pick_us, r->loop_us, r->enq_us, B->in_launch_us,
		       r->prewakes, r->prewakes_late, r->ring_thread_wakes, r->prewake_client_wakes);
		printf("    %s sync hops: the worker saw a job's end %.1f us late; a completion to the "
		       "client's next entry %.1f us (ring); completions that had to wake the client "
		       "%" PRIu64 "\n",
		       k ? "ring" : "socket", r->detect_us, r->turnaround_us, r->reply_wakes);
		printf("    %s async: the session stream's kernel %.3f ms per request (%.3fx), %" PRIu64
		       " gaps of %.1f us mean between two kernels\n",
		       k ? "ring" : "socket", r->async_ms, ratio(r->async_ms, B->in_kernel_ms),
		       r->async_gaps, r->async_gap_us);
	}
}

int main(int argc, char **argv)
{
	bool only_new = false;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			g_n = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-l") && i + 1 < argc)
			g_large = atoi(argv[++i]);
		else if (!strcmp(argv[i], "-x"))
			only_new = true;
		else if (!strcmp(argv[i], "-a"))
			g_anchors_only = true;
		else {
			fprintf(stderr, "usage: %s [-n N] [-l LARGE] [-x] [-a]\n", argv[0]);
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
	snprintf(g_cache, sizeof g_cache, "/tmp/fa-bench-ring.%d", (int)getpid());
	int rc = 0;
	/* The daemons' runs first (they compile the kernels into the cache the in-process
	 * children then load), the legacy daemon before the new one. */
	for (int v = only_new ? 1 : 0; v < VARIANTS && !g_anchors_only; v++)
		rc |= run_variant(v);
	if (run_child(2) != 0) {
		fprintf(stderr, "bench_ring: the in-process part failed\n");
		rc = 1;
	}
	pid_t exporter = g_anchors_only ? -1 : spawn_child(4);
	if (!g_anchors_only && (exporter < 0 || run_child(3) != 0))
		fprintf(stderr, "bench_ring: the IPC anchor failed (a figure only)\n");
	__atomic_store_n(&B->ipc_state, 2, __ATOMIC_SEQ_CST);
	if (exporter > 0)
		fa_test_waitpid(exporter, fa_test_ms(30000));
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", g_cache);
	if (system(cmd) != 0)
		fprintf(stderr, "bench_ring: %s failed\n", cmd);

	printf("\n== bench_ring: issue 12's figures, one run, ring (default client) vs socket "
	       "(FA_RING=0), legacy daemon vs new\n");
	printf("in-process anchors for the large kernel: back to back %.1f TFLOP/s, by events %.3f "
	       "ms alone, %.3f ms after ~350 us idle (%.3fx), %.3f ms on CUDA IPC memory of "
	       "another process (%.3fx; back to back %.1f TFLOP/s)%s\n", B->in_tflops,
	       B->in_kernel_ms, B->in_gapped_ms, ratio(B->in_gapped_ms, B->in_kernel_ms),
	       B->in_ipc_ms, ratio(B->in_ipc_ms, B->in_kernel_ms), B->in_ipc_tflops,
	       B->ipc_ok         ? ""
	       : g_anchors_only ? " (IPC anchor not run: -a)"
	                        : " (IPC anchor failed)");
	if (B->rot_ok)
		printf("rotation anchors, bf16 B1 H16 S4096 D128, %d launches back to back over %d "
		       "tensor sets in turn (as 8 clients' requests), %d interleaved repeats, medians "
		       "[min..max of the ratio within a repeat]: this process's memory %.1f TFLOP/s "
		       "(%.4f ms a kernel); CUDA IPC memory of another process %.1f (%.4f ms, %.3fx "
		       "[%.3f..%.3f]); one IPC set again and again %.1f (%.4f ms, %.3fx [%.3f..%.3f])\n",
		       ROT_LAUNCHES, ROT_SETS, ROT_REPS, B->rot_tflops[0], B->rot_ms[0],
		       B->rot_tflops[1], B->rot_ms[1], B->rot_ratio[1], B->rot_ratio_lo[1],
		       B->rot_ratio_hi[1], B->rot_tflops[2], B->rot_ms[2], B->rot_ratio[2],
		       B->rot_ratio_lo[2], B->rot_ratio_hi[2]);
	printf("(4) in-process launch call host time (fa_gpu_attn_fwd alone, p50), launch memo on "
	       "vs off: tiny %.1f vs %.1f us, large %.1f vs %.1f us; a new shape (large, B=7, "
	       "kernel loaded): first launch %.1f us, repeats %.1f us; memo hits %" PRIu64
	       " misses %" PRIu64 "%s\n", B->lh50[0][0], B->lh50[0][1], B->lh50[1][0],
	       B->lh50[1][1], B->lh_first_us, B->lh_repeat_us, B->memo_hits, B->memo_misses,
	       B->lh_ok ? "" : " (failed)");
	printf("    tiny in-process launch+sync on a stream of the greatest priority (the daemon's "
	       "inline runs'): p50 %.1f us (plain stream %.1f us)\n", B->in_tiny_hi50, B->in_tiny50);
	printf("    per call: the planning a hit skips (fa_gpu_plan, large) %.0f ns; cuCtxSetCurrent "
	       "(every launch before) %.0f ns, cuCtxGetCurrent (now) %.0f ns\n", B->plan_ns,
	       B->ctx_set_ns, B->ctx_get_ns);
	if (g_anchors_only) {
		printf("    tiny in-process launch+sync p50 %.1f us p99 %.1f us; large launch call "
		       "(once, after a sync) %.1f us\n", B->in_tiny50, B->in_tiny99,
		       B->in_launch_us);
		return rc || !B->in_ok || !B->lh_ok;
	}
	for (int v = only_new ? 1 : 0; v < VARIANTS; v++)
		print_variant(v);
	for (int v = only_new ? 1 : 0; v < VARIANTS; v++)
		rc |= !B->m[v][0].ok || !B->m[v][1].ok;
	return rc || !B->in_ok;
}
