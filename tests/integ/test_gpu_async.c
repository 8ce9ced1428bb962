/* test_gpu_async.c - the GPU backend's asynchronous mode, its canary and its devices, end to end
 * against the real fa-daemon:
 *   - fa_attn_fwd_async orders the daemon's kernel after the work queued on the caller's stream
 *     and the caller's later work after the kernel: inputs are uploaded on the stream with no
 *     synchronisation, many calls are chained, every output is checked against the reference;
 *   - a client event that does not open (raw requests: zeros, random bytes) gets FA_EINVAL
 *     naming the event, nothing is enqueued and the daemon serves on; host (shared-memory)
 *     buffers in the asynchronous mode get FA_EINVAL naming the tensor, checked before any event
 *     is opened (libfaclient refuses them locally, so these requests are sent raw);
 *   - the canary runs and passes (STATS), so the watchdog is fed;
 *   - with two or more GPUs: a buffer on GPU 1 is served there, a request mixing GPUs gets a
 *     clear FA_EINVAL (skipped, with the reason, on one GPU).
 *   - a client of another user (uid 65534, when run as root) is served in the synchronous mode
 *     on its own device buffers and refused the asynchronous one (FA_EPERM);
 *   - fa_attn_bwd_async (the backward pass) chained after the forward on one stream likewise,
 *     each step's gradients checked against the float64 oracle (skipped, saying so, while the
 *     GPU backend has no backward kernels);
 *   - fa_attn_bwd_async (deterministic dQ), fa_attn_kvcache_async (a paged decode) and
 *     fa_attn_varlen_async give the synchronous calls' bytes, bit for bit, over a chain of
 *     steps whose inputs and index tables (device tables) are uploaded on the caller's stream
 *     with no synchronisation: a table read out of stream order gives other bytes; the same as
 *     uid 65534 (completion words across users); a bad table entry found after the enqueue is
 *     the sticky FA_EINVAL naming it, with nothing launched and the stream not held; an
 *     overlapping output (only the daemon sees it) likewise the sticky FA_EOVERLAP; a client
 *     killed with a decode pending behind a ready word never written is released.
 * The cross-user refusal is also checked without a GPU in test_bad_input.c; the CPU side of the
 * new calls in test_async_cpu.c.
 *
 * CUDA does not survive fork(): the test process never initialises it; each case runs in a
 * forked child that loads the CUDA driver (common/fa_cu.h) and reports through its exit code.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_bwd_case.h"
#include "fa_cudrv.h"
#include "fa_infer_case.h"
#include "fa_integ.h"
#include "fa_raw.h"

#define CHAIN 24 /* asynchronous calls chained on one stream before the first synchronisation */

static struct fa_daemon g_daemon;
static bool g_no_gpu;
static int g_ngpus;

/* ---- the CUDA driver (tests/helpers/fa_cudrv.h), loaded in children ------------------------------ */

/* Load the driver and make GPU `ordinal`'s primary context current. 0, or -1 with a message. */
static int cu_start(int ordinal)
{
	char why[256];
	if (fa_cu_start(ordinal, why, sizeof why) != 0) {
		fprintf(stderr, "cuda: %s\n", why);
		return -1;
	}
	return 0;
}

/* Wait for stream s's work for at most ms: 0 when done, -1 past the deadline (the stream still
 * holds work: a regression that reorders a session's calls deadlocks them), else the CUDA error
 * of cuStreamQuery. */
static int stream_done_within(void *s, int ms)
{
	uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(ms);
	for (;;) {
		int r = (int)cu.StreamQuery(s);
		if (r != 600 /* CUDA_ERROR_NOT_READY */)
			return r;
		if (fa_test_now_ms() >= end)
			return -1;
		usleep(1000);
	}
}

/* A child, fn starting CUDA itself (its GPU, or after changing user). */
static int in_child(int (*fn)(void *), void *arg, int timeout_ms)
{
	return fa_cu_in_child(fn, arg, timeout_ms, -1);
}

/* ---- children ------------------------------------------------------------------------------------- */

static int run_async_vs_sync(int which, const char *url);

/* CHAIN asynchronous calls on one stream with no synchronisation between them: each uploads
 * its own inputs (into the same device buffer every time), poisons O, computes, and downloads
 * the whole buffer into its own pinned copy; one synchronisation at the end, then every copy is
 * checked against the reference computed from the inputs it holds. Without the ordering both
 * ways, a kernel would read the next call's inputs or its O would be read before it is written. */
static int child_async_chain(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 1024, .Sk = 1024, .Hq = 8,
	                     .Hkv = 2, .D = 128, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .lse = true};
	struct fa_case_layout l;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	cu_ptr dmem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 0xa5a5;
	char why[256];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc %zu", l.total);
	CHECK(cu.MemHostAlloc(&pinned, 2 * CHAIN * l.total, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	for (int i = 0; i < CHAIN; i++)
		fa_case_fill(&cs, &l, (char *)pinned + (size_t)(CHAIN + i) * l.total, &rng);
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < CHAIN; i++) {
		char *in = (char *)pinned + (size_t)(CHAIN + i) * l.total;
		char *out = (char *)pinned + (size_t)i * l.total;
		CHECK(cu.MemcpyHtoDAsync(dmem, in, l.total, stream) == 0, "upload");
		CHECK(cu.MemsetD8Async(dmem + l.o_off, 0xff, (size_t)l.o_span * 2, stream) == 0,
		      "poison O");
		fa_status st = fa_attn_fwd_async(c, &a, stream);
		CHECK(st == FA_OK, "fa_attn_fwd_async #%d: %s: %s", i, fa_status_name(st),
		      fa_last_error_detail());
		CHECK(cu.MemcpyDtoHAsync(out, dmem, l.total, stream) == 0, "download");
	}
	CHECK(cu.StreamSynchronize(stream) == 0, "cuStreamSynchronize");
	uint64_t t1 = fa_test_now_us();
	for (int i = 0; i < CHAIN; i++) {
		char *in = (char *)pinned + (size_t)(CHAIN + i) * l.total;
		char *out = (char *)pinned + (size_t)i * l.total;
		double err = 0;
		CHECK(memcmp(out + l.q_off, in + l.q_off, (size_t)l.q_span * 2) == 0,
		      "call %d: its Q was overwritten before its download", i);
		CHECK(fa_case_check(&cs, &l, out, &err, why, sizeof why), "call %d: %s", i, why);
	}
	fprintf(stderr, "async chain: %d calls of bf16 B2 S1024 Hq8 Hkv2 D128 causal, %.1f us "
	        "per call including uploads and downloads, all match the reference\n",
	        CHAIN, (double)(t1 - t0) / CHAIN);
	CHECK(fa_buffer_free(b) == FA_OK, "unregister: %s", fa_last_error_detail());
	fa_client_close(c);
	cu.StreamDestroy(stream);
	cu.MemFree(dmem);
	return 0;
}

#define BWD_CHAIN 8

/* BWD_CHAIN training steps on one stream with no synchronisation: each uploads its inputs and
 * poisoned outputs (the whole buffer), runs the forward (o, lse) and the backward
 * asynchronously, and downloads the whole buffer into its own pinned copy; one synchronisation,
 * then every copy's gradients are checked against the oracle of the inputs it holds. */
static int child_async_bwd_chain(void *arg)
{
	(void)arg;
	const struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 200, .Sk = 300, .Hq = 8,
	                           .Hkv = 2, .D = 64, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT};
	struct fa_bwd_layout l;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	cu_ptr dmem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 0xb0b0;
	char why[256];
	double err[3];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_bwd_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc %zu", l.total);
	CHECK(cu.MemHostAlloc(&pinned, 2 * BWD_CHAIN * l.total, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	fa_client_set_timeout(c, fa_test_ms(60000));
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_bwd_args(&cs, &l, b, 0, &fa, &ba);
	for (int i = 0; i < BWD_CHAIN; i++)
		fa_bwd_fill(&cs, &l, (char *)pinned + (size_t)(BWD_CHAIN + i) * l.total, &rng);
	for (int i = 0; i < BWD_CHAIN; i++) {
		char *in = (char *)pinned + (size_t)(BWD_CHAIN + i) * l.total;
		char *out = (char *)pinned + (size_t)i * l.total;
		CHECK(cu.MemcpyHtoDAsync(dmem, in, l.total, stream) == 0, "upload");
		fa_status st = fa_attn_fwd_async(c, &fa, stream);
		CHECK(st == FA_OK, "fa_attn_fwd_async #%d: %s: %s", i, fa_status_name(st),
		      fa_last_error_detail());
		st = fa_attn_bwd_async(c, &ba, stream);
		CHECK(st == FA_OK, "fa_attn_bwd_async #%d: %s: %s", i, fa_status_name(st),
		      fa_last_error_detail());
		CHECK(cu.MemcpyDtoHAsync(out, dmem, l.total, stream) == 0, "download");
	}
	CHECK(cu.StreamSynchronize(stream) == 0, "cuStreamSynchronize");
	for (int i = 0; i < BWD_CHAIN; i++) {
		char *out = (char *)pinned + (size_t)i * l.total;
		CHECK(fa_bwd_check(&cs, &l, out, 0, err, why, sizeof why), "step %d: %s", i, why);
	}
	fprintf(stderr, "async backward chain: %d steps, all match the oracle (last: dq %.2e dk "
	        "%.2e dv %.2e)\n", BWD_CHAIN, err[0], err[1], err[2]);
	CHECK(fa_buffer_free(b) == FA_OK, "unregister: %s", fa_last_error_detail());
	fa_client_close(c);
	cu.StreamDestroy(stream);
	cu.MemFree(dmem);
	return 0;
}

/* Back-to-back asynchronous calls with no upload between them, against the same calls in the
 * synchronous mode: the asynchronous ones queue up (the call returns at the enqueue). */
static int child_async_vs_sync(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 512, .Sk = 512, .Hq = 8,
	                     .Hkv = 8, .D = 64};
	struct fa_case_layout l;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	cu_ptr dmem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 7;
	char why[256];
	const int n = 400;

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, l.total, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	fa_case_fill(&cs, &l, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(dmem, pinned, l.total, stream) == 0, "upload");
	CHECK(cu.StreamSynchronize(stream) == 0, "sync");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	for (int i = 0; i < 20; i++) /* warm: kernel compiled, events created and opened */
		CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK && fa_attn_fwd(c, &a) == FA_OK,
		      "warm-up: %s", fa_last_error_detail());
	CHECK(cu.StreamSynchronize(stream) == 0, "sync");
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < n; i++)
		CHECK(fa_attn_fwd(c, &a) == FA_OK, "sync call: %s", fa_last_error_detail());
	uint64_t t1 = fa_test_now_us();
	for (int i = 0; i < n; i++)
		CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK, "async call: %s",
		      fa_last_error_detail());
	uint64_t t2 = fa_test_now_us();
	CHECK(cu.StreamSynchronize(stream) == 0, "sync");
	uint64_t t3 = fa_test_now_us();
	CHECK(cu.MemcpyDtoHAsync(pinned, dmem, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "%s", why);
	/* Where the time goes: the daemon's host time per asynchronous step, and this side's
	 * interprocess event calls alone. */
	static char text[16384];
	if (fa_stats(c, text, sizeof text) == FA_OK) {
		const char *keys[] = {"gpu_async_enqueued", "gpu_async_host_us_wait",
		                      "gpu_async_host_us_launch", "gpu_async_host_us_record",
		                      "gpu_async_host_us_hostfn"};
		for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
			uint64_t v = 0;
			if (fa_stats_u64(text, keys[i], &v))
				fprintf(stderr, "  %s: %llu\n", keys[i], (unsigned long long)v);
		}
	}
	void *ev = NULL;
	CHECK(cu.EventCreate(&ev, 0x6) == 0, "cuEventCreate(INTERPROCESS)");
	uint64_t e0 = fa_test_now_us();
	for (int i = 0; i < n; i++)
		CHECK(cu.EventRecord(ev, stream) == 0 && cu.StreamWaitEvent(stream, ev, 0) == 0,
		      "record/wait");
	uint64_t e1 = fa_test_now_us();
	uint64_t p0 = fa_test_now_us();
	for (int i = 0; i < n; i++)
		CHECK(fa_ping(c) == FA_OK, "ping");
	uint64_t p1 = fa_test_now_us();
	fprintf(stderr, "  client: interprocess event record + wait %.1f us; fa_ping %.1f us\n",
	        (double)(e1 - e0) / n, (double)(p1 - p0) / n);
	fprintf(stderr, "fp16 B1 S512 H8 D64, %d calls: synchronous %.1f us per call; "
	        "asynchronous %.1f us per call to return, %.1f us per call until the stream "
	        "finished\n", n, (double)(t1 - t0) / n, (double)(t2 - t1) / n,
	        (double)(t3 - t1) / n);
	fa_buffer_free(b);
	fa_client_close(c);
	cu.MemFree(dmem);
	return 0;
}

/* A client whose event does not fire (its stream waits on a host flag) stalls only itself:
 * its asynchronous call still gets its reply (the daemon's wait on the event is enqueued, not
 * waited for on the host), a second client's calls on the same GPU go on at their usual speed,
 * and once the flag is set, the first client's kernel runs and is right. */
static int child_stuck_event_stalls_only_its_session(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128, .Sk = 128, .Hq = 4,
	                     .Hkv = 4, .D = 64};
	struct fa_case_layout l;
	fa_client *ca = NULL, *cb = NULL;
	fa_buffer *ba = NULL, *bb = NULL;
	fa_attn_fwd_args aa, ab;
	cu_ptr da = 0, db = 0, flag_dev = 0;
	void *sa = NULL, *pinned = NULL;
	volatile uint32_t *flag = NULL;
	uint64_t rng = 3;
	char why[256];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&da, l.total) == 0 && cu.MemAlloc(&db, l.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, l.total + 64, 0x2 /* DEVICEMAP */) == 0, "cuMemHostAlloc");
	flag = (volatile uint32_t *)((char *)pinned + l.total);
	*flag = 0;
	CHECK(cu.MemHostGetDevicePointer(&flag_dev, (void *)(uintptr_t)flag, 0) == 0,
	      "cuMemHostGetDevicePointer");
	CHECK(cu.StreamCreate(&sa, 1) == 0, "cuStreamCreate");
	fa_case_fill(&cs, &l, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(da, pinned, l.total, sa) == 0 &&
	      cu.MemcpyHtoDAsync(db, pinned, l.total, sa) == 0 && cu.StreamSynchronize(sa) == 0,
	      "upload");
	CHECK(fa_client_open(&ca, g_daemon.url) == FA_OK && fa_client_open(&cb, g_daemon.url) ==
	      FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(ca, (void *)(uintptr_t)da, l.total, &ba) == FA_OK &&
	      fa_buffer_register_device(cb, (void *)(uintptr_t)db, l.total, &bb) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, ba, &aa);
	fa_case_args(&cs, &l, bb, &ab);
	CHECK(fa_attn_fwd_async(ca, &aa, sa) == FA_OK && cu.StreamSynchronize(sa) == 0,
	      "warm-up: %s", fa_last_error_detail());
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < 100; i++)
		CHECK(fa_attn_fwd(cb, &ab) == FA_OK, "B before: %s", fa_last_error_detail());
	double before = (double)(fa_test_now_us() - t0) / 100;
	/* A's stream now waits for the flag; its event is recorded behind that wait. */
	CHECK(cu.StreamWaitValue32(sa, flag_dev, 1, 0 /* GEQ */) == 0, "cuStreamWaitValue32");
	fa_client_set_timeout(ca, 1500);
	fa_status st = fa_attn_fwd_async(ca, &aa, sa);
	fprintf(stderr, "stuck client's call: %s (%s)\n", fa_status_name(st),
	        fa_last_error_detail());
	t0 = fa_test_now_us();
	for (int i = 0; i < 100; i++)
		CHECK(fa_attn_fwd(cb, &ab) == FA_OK, "B while A is stuck: %s",
		      fa_last_error_detail());
	double during = (double)(fa_test_now_us() - t0) / 100;
	fprintf(stderr, "the other client's synchronous calls: %.1f us before, %.1f us while the "
	        "first client's event is stuck\n", before, during);
	CHECK(during < 4 * before + 200, "the other client slowed down: %.1f vs %.1f us", during,
	      before);
	*flag = 1; /* release: A's stream, then the daemon's wait, go on */
	CHECK(cu.StreamSynchronize(sa) == 0, "A's stream");
	CHECK(cu.MemcpyDtoHAsync(pinned, da, l.total, sa) == 0 && cu.StreamSynchronize(sa) == 0,
	      "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "A after the release: %s",
	      why);
	fa_client_set_timeout(ca, 30000);
	CHECK(fa_attn_fwd_async(ca, &aa, sa) == FA_OK && cu.StreamSynchronize(sa) == 0,
	      "A again: %s", fa_last_error_detail());
	fa_buffer_free(ba);
	fa_buffer_free(bb);
	fa_client_close(ca);
	fa_client_close(cb);
	return 0;
}

/* A raw session on device buffers asks for the asynchronous mode with client events that are no
 * events (zeros, then random bytes): the daemon's cuIpcOpenEventHandle fails, and each request
 * gets FA_EINVAL naming the event (not FA_EDEVICE: a client's bytes are no GPU fault), with
 * nothing enqueued (the buffer is byte for byte what was uploaded). The daemon serves on: the
 * same session synchronously, and another client in the asynchronous mode, both right. */
static int child_client_event_that_does_not_open(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128, .Sk = 192, .Hq = 4,
	                     .Hkv = 2, .D = 64, .lse = true};
	struct fa_case_layout l;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	fa_attn_fwd_args a;
	unsigned char handle[FA_PROTO_IPC_HANDLE_LEN], uuid[FA_PROTO_UUID_LEN];
	unsigned char ev[FA_PROTO_IPC_HANDLE_LEN];
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	cu_ptr dmem = 0;
	void *stream = NULL;
	uint64_t rng = 0xe7e7, seq = 1, rid = 0;
	int dev = 0, st;
	char why[256];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	char *host = calloc(1, l.total), *back = calloc(1, l.total);
	CHECK(host != NULL && back != NULL, "calloc %zu", l.total);
	fa_case_fill(&cs, &l, host, &rng);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc %zu", l.total);
	CHECK(cu.MemcpyHtoD(dmem, host, l.total) == 0 && cu.StreamSynchronize(NULL) == 0, "upload");
	CHECK(cu.IpcGetMemHandle((struct fa_cu_ipc_handle *)handle, dmem) == 0,
	      "cuIpcGetMemHandle");
	CHECK(cu.DeviceGet(&dev, 0) == 0 && cu.DeviceGetUuid(uuid, dev) == 0, "GPU 0's UUID");

	int s = fa_raw_open(g_daemon.url, fa_test_ms(60000)); /* the first call may compile */
	CHECK(s >= 0, "fa_raw_open(%s)", g_daemon.url);
	uint64_t sid = fa_raw_hello(s, seq++, &rep);
	CHECK(sid != 0, "HELLO: %s", rep.detail);
	st = fa_raw_register_ipc(s, sid, seq++, handle, uuid, l.total, &rid, &rep);
	CHECK(st == FA_OK, "REGISTER the device buffer: %s: %s", fa_status_name((fa_status)st),
	      rep.detail);
	fa_case_args(&cs, &l, FA_RAW_BUF, &a);
	for (int round = 0; round < 2; round++) {
		const char *what = round == 0 ? "zeros" : "random bytes";
		if (round == 0)
			memset(ev, 0, sizeof ev);
		else
			fa_fill_bytes(ev, sizeof ev, &rng);
		fa_raw_fwd_req(&a, sid, seq++, rid, &req);
		fa_raw_fwd_async(&req, round == 0 ? 0 : 5, ev);
		st = fa_raw_call(s, &req, &rep);
		fprintf(stderr, "client event of %s: %s: %s\n", what, fa_status_name((fa_status)st),
		        rep.detail);
		CHECK(st == FA_EINVAL, "client event of %s: got %s (%d), want FA_EINVAL", what,
		      fa_status_name((fa_status)st), st);
		CHECK(strstr(rep.detail, "CUDA IPC event cannot be opened") != NULL,
		      "client event of %s: the reason does not name the event: %s", what,
		      rep.detail);
		CHECK(!rep.u.fwd.async, "client event of %s: a refusal carries the daemon's event",
		      what);
	}
	CHECK(cu.MemcpyDtoH(back, dmem, l.total) == 0, "download");
	CHECK(memcmp(back, host, l.total) == 0, "a refused request wrote to the buffer");

	/* The same session, synchronously, on the same buffer. */
	fa_raw_fwd_req(&a, sid, seq++, rid, &req);
	st = fa_raw_call(s, &req, &rep);
	CHECK(st == FA_OK, "same session, synchronous: %s: %s", fa_status_name((fa_status)st),
	      rep.detail);
	CHECK(cu.MemcpyDtoH(back, dmem, l.total) == 0, "download");
	CHECK(fa_case_check(&cs, &l, back, NULL, why, sizeof why), "same session, synchronous: %s",
	      why);
	CHECK(fa_raw_simple(s, FA_OP_BYE, sid, seq++, &rep) == FA_OK, "BYE: %s", rep.detail);
	nn_close(s);

	/* Another client, asynchronously with a real event, on the same memory (poisoned again). */
	CHECK(cu.MemcpyHtoD(dmem, host, l.total) == 0 && cu.StreamSynchronize(NULL) == 0, "upload");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	fa_client_set_timeout(c, fa_test_ms(60000));
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	fa_status fst = fa_attn_fwd_async(c, &a, stream);
	CHECK(fst == FA_OK, "another client, asynchronous: %s: %s", fa_status_name(fst),
	      fa_last_error_detail());
	CHECK(cu.StreamSynchronize(stream) == 0 && cu.MemcpyDtoH(back, dmem, l.total) == 0,
	      "download");
	CHECK(fa_case_check(&cs, &l, back, NULL, why, sizeof why),
	      "another client, asynchronous: %s", why);
	fprintf(stderr, "after the refusals: the same session (synchronous) and another client "
	        "(asynchronous) served, right\n");
	CHECK(fa_buffer_free(b) == FA_OK, "unregister: %s", fa_last_error_detail());
	fa_client_close(c);
	cu.StreamDestroy(stream);
	cu.MemFree(dmem);
	free(host);
	free(back);
	return 0;
}

/* The asynchronous mode takes device buffers only, and the daemon checks that before anything
 * reaches the GPU: raw asynchronous requests on a host (shared-memory) region get FA_EINVAL
 * naming the first tensor in host memory: all in host memory, without and with a client event
 * (made-up bytes: the host-buffer reason comes back, not the event's, so the event was never
 * opened), and only O in host memory, the rest on the device. Nothing is written; the same
 * session is then served synchronously on the host region, right. */
static int child_async_host_buffers(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 96, .Sk = 160, .Hq = 4,
	                     .Hkv = 1, .D = 128, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .lse = true};
	static const struct {
		const char *what;
		bool ev;      /* send a client event */
		bool only_o;  /* O in the host region, the rest in the device region */
		const char *names; /* what the reason must name */
	} rounds[] = {
		{"host buffers, no event", false, false, "q is in host memory"},
		{"host buffers, a made-up event", true, false, "q is in host memory"},
		{"O in a host buffer, the rest on the device", false, true, "o is in host memory"},
	};
	struct fa_case_layout l;
	struct fa_raw_shm m = {.fd = -1};
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	fa_attn_fwd_args a;
	unsigned char handle[FA_PROTO_IPC_HANDLE_LEN], uuid[FA_PROTO_UUID_LEN];
	unsigned char ev[FA_PROTO_IPC_HANDLE_LEN];
	cu_ptr dmem = 0;
	uint64_t rng = 0x4057, seq = 1, hrid = 0, drid = 0;
	int dev = 0, st;
	char why[256];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(fa_raw_shm_create(&m, l.total, &rng) == 0, "shared memory of %zu bytes: %s", l.total,
	      strerror(errno));
	fa_case_fill(&cs, &l, m.map, &rng);
	char *before = malloc(l.total);
	CHECK(before != NULL, "malloc %zu", l.total);
	memcpy(before, m.map, l.total);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc %zu", l.total);
	CHECK(cu.MemcpyHtoD(dmem, before, l.total) == 0 && cu.StreamSynchronize(NULL) == 0,
	      "upload");
	CHECK(cu.IpcGetMemHandle((struct fa_cu_ipc_handle *)handle, dmem) == 0,
	      "cuIpcGetMemHandle");
	CHECK(cu.DeviceGet(&dev, 0) == 0 && cu.DeviceGetUuid(uuid, dev) == 0, "GPU 0's UUID");

	int s = fa_raw_open(g_daemon.url, fa_test_ms(60000)); /* the first call may compile */
	CHECK(s >= 0, "fa_raw_open(%s)", g_daemon.url);
	uint64_t sid = fa_raw_hello(s, seq++, &rep);
	CHECK(sid != 0, "HELLO: %s", rep.detail);
	st = fa_raw_register(s, sid, seq++, m.name, l.total, &hrid, &rep);
	CHECK(st == FA_OK, "REGISTER the host buffer: %s: %s", fa_status_name((fa_status)st),
	      rep.detail);
	st = fa_raw_register_ipc(s, sid, seq++, handle, uuid, l.total, &drid, &rep);
	CHECK(st == FA_OK, "REGISTER the device buffer: %s: %s", fa_status_name((fa_status)st),
	      rep.detail);
	fa_case_args(&cs, &l, FA_RAW_BUF, &a);
	fa_fill_bytes(ev, sizeof ev, &rng);
	for (size_t i = 0; i < sizeof rounds / sizeof rounds[0]; i++) {
		fa_raw_fwd_req(&a, sid, seq++, rounds[i].only_o ? drid : hrid, &req);
		if (rounds[i].only_o)
			req.u.fwd.o.region = hrid;
		fa_raw_fwd_async(&req, (uint32_t)i, rounds[i].ev ? ev : NULL);
		st = fa_raw_call(s, &req, &rep);
		fprintf(stderr, "asynchronous, %s: %s: %s\n", rounds[i].what,
		        fa_status_name((fa_status)st), rep.detail);
		CHECK(st == FA_EINVAL, "%s: got %s (%d), want FA_EINVAL", rounds[i].what,
		      fa_status_name((fa_status)st), st);
		CHECK(strstr(rep.detail, "device buffers only") != NULL &&
		      strstr(rep.detail, rounds[i].names) != NULL,
		      "%s: the reason does not say \"device buffers only\" and \"%s\": %s",
		      rounds[i].what, rounds[i].names, rep.detail);
	}
	CHECK(memcmp(m.map, before, l.total) == 0, "a refused request wrote to the host buffer");

	/* The same session, synchronously, on the host region. */
	fa_raw_fwd_req(&a, sid, seq++, hrid, &req);
	st = fa_raw_call(s, &req, &rep);
	CHECK(st == FA_OK, "synchronous on the host buffer: %s: %s", fa_status_name((fa_status)st),
	      rep.detail);
	CHECK(fa_case_check(&cs, &l, m.map, NULL, why, sizeof why), "synchronous: %s", why);
	fprintf(stderr, "the same session, synchronous on the host buffer: served, right\n");
	CHECK(fa_raw_simple(s, FA_OP_BYE, sid, seq++, &rep) == FA_OK, "BYE: %s", rep.detail);
	nn_close(s);
	fa_raw_shm_destroy(&m);
	cu.MemFree(dmem);
	free(before);
	return 0;
}

/* Device buffers on GPU 1 are served there; a request mixing GPU 0 and GPU 1 is refused. */
static int child_second_gpu(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 256, .Sk = 300, .Hq = 4,
	                     .Hkv = 2, .D = 64, .lse = true};
	struct fa_case_layout l;
	fa_client *c = NULL;
	fa_buffer *b1 = NULL, *b0 = NULL;
	fa_attn_fwd_args a;
	cu_ptr d1 = 0, d0 = 0;
	void *s1 = NULL, *pinned = NULL, *ctx0 = NULL, *ctx1 = NULL;
	int dev = 0;
	uint64_t rng = 11;
	char why[256];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&d0, l.total) == 0, "cuMemAlloc on GPU 0");
	CHECK(cu.DevicePrimaryCtxRetain(&ctx0, 0) == 0, "ctx 0");
	CHECK(cu.DeviceGet(&dev, 1) == 0 && cu.DevicePrimaryCtxRetain(&ctx1, dev) == 0 &&
	      cu.CtxSetCurrent(ctx1) == 0, "GPU 1");
	CHECK(cu.MemAlloc(&d1, l.total) == 0, "cuMemAlloc on GPU 1");
	CHECK(cu.MemHostAlloc(&pinned, l.total, 1 /* portable */) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&s1, 1) == 0, "stream on GPU 1");
	fa_case_fill(&cs, &l, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(d1, pinned, l.total, s1) == 0 && cu.StreamSynchronize(s1) == 0,
	      "upload");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)d1, l.total, &b1) == FA_OK,
	      "register on GPU 1: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)d0, l.total, &b0) == FA_OK,
	      "register on GPU 0: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b1, &a);
	fa_status st = fa_attn_fwd(c, &a);
	CHECK(st == FA_OK, "GPU 1 synchronous: %s: %s", fa_status_name(st), fa_last_error_detail());
	CHECK(cu.MemcpyDtoHAsync(pinned, d1, l.total, s1) == 0 && cu.StreamSynchronize(s1) == 0,
	      "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "GPU 1: %s", why);
	CHECK(fa_attn_fwd_async(c, &a, s1) == FA_OK, "GPU 1 asynchronous: %s",
	      fa_last_error_detail());
	CHECK(cu.StreamSynchronize(s1) == 0, "sync");
	a.k.buf = b0; /* K on GPU 0, the rest on GPU 1 */
	st = fa_attn_fwd(c, &a);
	CHECK(st == FA_EINVAL && strstr(fa_last_error_detail(), "one GPU") != NULL,
	      "mixed GPUs: %s: %s", fa_status_name(st), fa_last_error_detail());
	fprintf(stderr, "GPU 1 served; mixed request refused: %s\n", fa_last_error_detail());
	fa_buffer_free(b0);
	fa_buffer_free(b1);
	fa_client_close(c);
	cu.MemFree(d1);
	cu.CtxSetCurrent(ctx0);
	cu.MemFree(d0);
	return 0;
}

/* Run as uid 65534 (exec'd fresh by test_gpu_other_user_..., argv: --other-user URL): device
 * buffers of another user register and compute in the synchronous mode (CUDA IPC memory handles
 * open across users); the asynchronous mode gets FA_EPERM with the reason. */
static int other_user_main(const char *url)
{
	struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 200, .Sk = 300, .Hq = 4,
	                     .Hkv = 1, .D = 128, .lse = true};
	struct fa_case_layout l;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	cu_ptr dmem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 99;
	char why[256];

	CHECK(setgid(65534) == 0 && setuid(65534) == 0, "setuid 65534");
	CHECK(cu_start(0) == 0, "no CUDA as uid 65534 (/dev/nvidia* permissions?)");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, l.total, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	fa_case_fill(&cs, &l, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(dmem, pinned, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "upload");
	CHECK(fa_client_open(&c, url) == FA_OK, "open as uid 65534: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register as uid 65534: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	fa_status st = fa_attn_fwd(c, &a);
	CHECK(st == FA_OK, "synchronous as uid 65534: %s: %s", fa_status_name(st),
	      fa_last_error_detail());
	CHECK(cu.MemcpyDtoHAsync(pinned, dmem, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "%s", why);
	/* Completion words: IPC memory, which opens across users. */
	CHECK(cu.MemsetD8Async(dmem + l.o_off, 0xff, (size_t)l.o_span * 2, stream) == 0, "poison");
	st = fa_attn_fwd_async(c, &a, stream);
	fprintf(stderr, "uid 65534: synchronous FA_OK and correct; asynchronous (completion "
	        "words) %s: %s\n", fa_status_name(st), fa_last_error_detail());
	CHECK(st == FA_OK, "asynchronous across users with completion words: %s: %s",
	      fa_status_name(st), fa_last_error_detail());
	CHECK(cu.MemcpyDtoHAsync(pinned, dmem, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "async as uid 65534: %s", why);
	fa_buffer_free(b);
	fa_client_close(c);
	/* The IPC-event path (forced) is still refused across users. */
	setenv("FA_ASYNC_EVENTS", "1", 1);
	CHECK(fa_client_open(&c, url) == FA_OK, "open: %s", fa_last_error_detail());
	unsetenv("FA_ASYNC_EVENTS");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	st = fa_attn_fwd_async(c, &a, stream);
	fprintf(stderr, "uid 65534, IPC events forced: %s: %s\n", fa_status_name(st),
	        fa_last_error_detail());
	CHECK(st == FA_EPERM, "asynchronous with IPC events across users: %s", fa_status_name(st));
	fa_buffer_free(b);
	fa_client_close(c);
	cu.MemFree(dmem);
	/* The backward and the inference calls, asynchronous with completion words, across users:
	 * the synchronous calls' bytes. */
	for (int which = 0; which < 3; which++)
		CHECK(run_async_vs_sync(which, url) == 0, "uid 65534, case %d", which);
	return 0;
}

/* For qsort: ascending doubles. */
static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* n asynchronous calls of one small case on one stream through c, each timed on the host (the
 * call itself: enqueue and reply); p50 and p99 in us, and the result checked at the end. */
static int time_enqueues(fa_client *c, void *stream, int n, double *p50, double *p99)
{
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128, .Sk = 128, .Hq = 4,
	                     .Hkv = 4, .D = 64};
	struct fa_case_layout l;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	cu_ptr dmem = 0;
	void *pinned = NULL;
	uint64_t rng = 0xbe;
	char why[256];
	double *us = calloc((size_t)n, sizeof *us);

	CHECK(us != NULL, "calloc");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, l.total, 0) == 0, "cuMemHostAlloc");
	fa_case_fill(&cs, &l, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(dmem, pinned, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	for (int i = 0; i < 20; i++) /* warm: kernel compiled, words or events made */
		CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK, "warm-up: %s",
		      fa_last_error_detail());
	CHECK(cu.StreamSynchronize(stream) == 0, "sync");
	int busy = 0;
	for (int i = 0; i < n; i++) {
		uint64_t t0 = fa_test_now_us();
		fa_status st = fa_attn_fwd_async(c, &a, stream);
		us[i] = (double)(fa_test_now_us() - t0);
		/* FA_EBUSY is the daemon's backpressure, not a fault: it counts a call in flight
		 * until it has seen the kernel finish, which can lag this stream's synchronisation
		 * by a host hop; a refused call leaves the stream released, so it is timed again */
		if (st == FA_EBUSY && busy < 100) {
			busy++;
			CHECK(cu.StreamSynchronize(stream) == 0, "sync");
			usleep(1000);
			i--;
			continue;
		}
		CHECK(st == FA_OK, "call %d: %s: %s", i, fa_status_name(st), fa_last_error_detail());
		if (i % 64 == 63) /* keep the daemon's stream short: host time is measured */
			CHECK(cu.StreamSynchronize(stream) == 0, "sync");
	}
	CHECK(cu.StreamSynchronize(stream) == 0, "sync");
	CHECK(cu.MemsetD8Async(dmem + l.o_off, 0xff, (size_t)l.o_span * 2, stream) == 0, "poison");
	CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK, "last: %s", fa_last_error_detail());
	CHECK(cu.MemcpyDtoHAsync(pinned, dmem, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "%s", why);
	if (busy)
		fprintf(stderr, "enqueue timing: %d calls answered FA_EBUSY (the session's in-flight "
		        "limit) and were retried after a synchronisation\n", busy);
	qsort(us, (size_t)n, sizeof *us, cmp_double);
	*p50 = us[n / 2];
	*p99 = us[(n * 99) / 100];
	fa_buffer_free(b);
	cu.MemFree(dmem);
	cu.MemFreeHost(pinned);
	free(us);
	return 0;
}

/* The figure of issue 12 item 3: host time per asynchronous call, completion words against
 * IPC events (FA_ASYNC_EVENTS=1), the same case, one run. Greppable: "async enqueue:". */
static int child_enqueue_cost(void *arg)
{
	(void)arg;
	const int n = 1000;
	fa_client *cw = NULL, *ce = NULL;
	void *stream = NULL;
	double w50 = 0, w99 = 0, e50 = 0, e99 = 0, s50 = 0, s99 = 0;
	fa_client *cs = NULL;

	CHECK(cu_start(0) == 0, "no CUDA");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	CHECK(fa_client_open(&cw, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	setenv("FA_RING", "0", 1); /* completion words on the socket: the round trip per call */
	CHECK(fa_client_open(&cs, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	unsetenv("FA_RING");
	setenv("FA_ASYNC_EVENTS", "1", 1);
	CHECK(fa_client_open(&ce, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	unsetenv("FA_ASYNC_EVENTS");
	CHECK(time_enqueues(cw, stream, n, &w50, &w99) == 0, "completion words");
	CHECK(time_enqueues(ce, stream, n, &e50, &e99) == 0, "IPC events");
	CHECK(time_enqueues(cs, stream, n, &s50, &s99) == 0, "completion words, socket");
	CHECK(fa_client_flush(cw) == FA_OK, "flush: %s", fa_last_error_detail());
	static char text[16384];
	uint64_t calls = 0, on = 0;
	CHECK(fa_stats(cw, text, sizeof text) == FA_OK, "stats");
	fa_stats_u64(text, "gpu_async_words", &on);
	fa_stats_u64(text, "gpu_async_words_calls", &calls);
	uint64_t ring_entries = 0;
	fa_stats_u64(text, "ring_entries", &ring_entries);
	fprintf(stderr, "async enqueue: fp16 B1 S128 H4 D64, %d calls each: completion words "
	        "through the ring p50 %.1f us p99 %.1f us; completion words by the socket p50 "
	        "%.1f us p99 %.1f us; IPC events p50 %.1f us p99 %.1f us (%.1fx); daemon: "
	        "gpu_async_words %llu, %llu words calls, ring_entries %llu\n", n, w50, w99, s50,
	        s99, e50, e99, w50 > 0 ? e50 / w50 : 0.0, (unsigned long long)on,
	        (unsigned long long)calls, (unsigned long long)ring_entries);
	CHECK(on == 1 && calls >= (uint64_t)n, "the words path was not taken");
	fa_client_close(cw);
	fa_client_close(ce);
	fa_client_close(cs);
	cu.StreamDestroy(stream);
	return 0;
}

/* A call the daemon refuses after the client's ring call returned (O over Q: only the daemon
 * sees overlaps): the stream is not held (the daemon writes the done word of the refused call),
 * the refusal comes back once, from fa_client_flush, and the next call is served. */
static int child_ring_refusal_is_sticky(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128, .Sk = 128, .Hq = 4,
	                     .Hkv = 4, .D = 64};
	struct fa_case_layout l;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a, bad;
	cu_ptr dmem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 9;
	char why[256];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, l.total, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	fa_case_fill(&cs, &l, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(dmem, pinned, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "upload");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK && cu.StreamSynchronize(stream) == 0 &&
	      fa_client_flush(c) == FA_OK, "warm-up: %s", fa_last_error_detail());
	bad = a;
	bad.o = a.q; /* O over Q */
	fa_status st = fa_attn_fwd_async(c, &bad, stream);
	uint64_t t0 = fa_test_now_ms();
	CHECK(cu.StreamSynchronize(stream) == 0, "the stream after the refused call");
	uint64_t held = fa_test_now_ms() - t0;
	fa_status fl = st == FA_OK ? fa_client_flush(c) : st;
	fprintf(stderr, "ring refusal: the call %s, the stream held %llu ms, then %s (%s)\n",
	        fa_status_name(st), (unsigned long long)held, fa_status_name(fl),
	        fa_last_error_detail());
	CHECK(fl == FA_EOVERLAP, "the refusal: %s", fa_status_name(fl));
	CHECK(fa_client_flush(c) == FA_OK, "reported once");
	CHECK(cu.MemsetD8Async(dmem + l.o_off, 0xff, (size_t)l.o_span * 2, stream) == 0, "poison");
	CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK, "after: %s", fa_last_error_detail());
	CHECK(cu.MemcpyDtoHAsync(pinned, dmem, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "after the refusal: %s", why);
	fa_buffer_free(b);
	fa_client_close(c);
	cu.MemFree(dmem);
	cu.MemFreeHost(pinned);
	return 0;
}


/* ---- asynchronous backward and inference calls against the synchronous ones ---------------- */

#define VS_STEPS 6

/* VS_STEPS images of one problem (inputs, tables, poisoned outputs) uploaded, called
 * asynchronously and downloaded on one stream with no synchronisation; then each image again
 * through the synchronous call; the outputs' bytes must be equal. which: 0 backward
 * (deterministic), 1 paged decode (fa_attn_kvcache_async), 2 varlen. url: the daemon's. CUDA
 * started by the caller. */
static int run_async_vs_sync(int which, const char *url)
{
	static const char *const names[3] = {"backward", "paged decode", "varlen"};
	const struct fa_case bc = {.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 256, .Sk = 384, .Hq = 8,
	                           .Hkv = 2, .D = 64, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT};
	const struct fa_infer_case ic =
	    which == 1 ? (struct fa_infer_case){.dtype = FA_DTYPE_BF16, .B = 8, .Hq = 16, .Hkv = 4,
	                                        .D = 128, .page = 16, .pages = 256, .pt_cols = 32}
	               : (struct fa_infer_case){.varlen = true, .dtype = FA_DTYPE_FP16, .B = 5,
	                                        .Hq = 8, .Hkv = 2, .D = 64, .total_q = 40,
	                                        .total_k = 900};
	struct fa_bwd_layout bl;
	struct fa_infer_layout il;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	fa_attn_kvcache_args ka;
	fa_attn_varlen_args va;
	cu_ptr dmem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 0xc0ffee + (uint64_t)which;
	size_t total;
	/* the outputs compared: (offset, bytes) */
	uint64_t out_off[3];
	size_t out_len[3];
	int nout;

	if (which == 0) {
		fa_bwd_layout(&bc, &bl);
		total = bl.total;
		size_t es = fa_dtype_size(bc.dtype);
		out_off[0] = bl.dq_off, out_len[0] = (size_t)bl.f.q_span * es;
		out_off[1] = bl.dk_off, out_len[1] = (size_t)bl.f.kv_span * es;
		out_off[2] = bl.dv_off, out_len[2] = (size_t)bl.f.kv_span * es;
		nout = 3;
	} else {
		fa_infer_layout(&ic, &il);
		total = il.total;
		out_off[0] = il.o, out_len[0] = il.o_bytes;
		out_off[1] = il.lse, out_len[1] = il.lse_bytes;
		nout = 2;
	}
	CHECK(cu.MemAlloc(&dmem, total) == 0, "cuMemAlloc %zu", total);
	CHECK(cu.MemHostAlloc(&pinned, (2 * VS_STEPS + 1) * total, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	CHECK(fa_client_open(&c, url) == FA_OK, "open: %s", fa_last_error_detail());
	fa_client_set_timeout(c, fa_test_ms(60000));
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	char *in = (char *)pinned + VS_STEPS * total, *ref = (char *)pinned + 2 * VS_STEPS * total;
	for (int i = 0; i < VS_STEPS; i++) {
		if (which == 0)
			fa_bwd_fill(&bc, &bl, in + (size_t)i * total, &rng);
		else
			fa_infer_fill(&ic, &il, in + (size_t)i * total, &rng);
	}
	if (which == 0)
		fa_bwd_args(&bc, &bl, b, FA_BWD_DETERMINISTIC, &fa, &ba);
	else if (which == 1)
		fa_infer_kvcache_args(&ic, &il, b, &ka);
	else
		fa_infer_varlen_args(&ic, &il, b, &va);
#define VS_SYNC()                                                                        \
	(which == 0   ? (fa_attn_fwd(c, &fa) == FA_OK ? fa_attn_bwd(c, &ba) : FA_EINVAL)   \
	 : which == 1 ? fa_attn_kvcache(c, &ka)                                             \
	              : fa_attn_varlen(c, &va))
	/* warm-up (kernels compiled, words made), synchronous and asynchronous */
	CHECK(cu.MemcpyHtoDAsync(dmem, in, total, stream) == 0 && cu.StreamSynchronize(stream) == 0,
	      "upload");
	fa_status st = VS_SYNC();
	CHECK(st == FA_OK, "%s warm-up: %s: %s", names[which], fa_status_name(st),
	      fa_last_error_detail());
	uint64_t t0 = fa_test_now_us();
	for (int i = 0; i < VS_STEPS; i++) {
		CHECK(cu.MemcpyHtoDAsync(dmem, in + (size_t)i * total, total, stream) == 0, "upload");
		if (which == 0) {
			st = fa_attn_fwd_async(c, &fa, stream);
			if (st == FA_OK)
				st = fa_attn_bwd_async(c, &ba, stream);
		} else {
			st = which == 1 ? fa_attn_kvcache_async(c, &ka, stream)
			                : fa_attn_varlen_async(c, &va, stream);
		}
		CHECK(st == FA_OK, "%s async #%d: %s: %s", names[which], i, fa_status_name(st),
		      fa_last_error_detail());
		CHECK(cu.MemcpyDtoHAsync((char *)pinned + (size_t)i * total, dmem, total, stream) == 0,
		      "download");
	}
	CHECK(cu.StreamSynchronize(stream) == 0, "cuStreamSynchronize");
	uint64_t t1 = fa_test_now_us();
	st = fa_client_flush(c);
	CHECK(st == FA_OK, "%s: flush: %s: %s", names[which], fa_status_name(st),
	      fa_last_error_detail());
	for (int i = 0; i < VS_STEPS; i++) {
		const char *got = (const char *)pinned + (size_t)i * total;
		CHECK(cu.MemcpyHtoDAsync(dmem, in + (size_t)i * total, total, stream) == 0 &&
		      cu.StreamSynchronize(stream) == 0, "upload");
		st = VS_SYNC();
		CHECK(st == FA_OK, "%s sync #%d: %s: %s", names[which], i, fa_status_name(st),
		      fa_last_error_detail());
		CHECK(cu.MemcpyDtoHAsync(ref, dmem, total, stream) == 0 &&
		      cu.StreamSynchronize(stream) == 0, "download");
		for (int k = 0; k < nout; k++) {
			CHECK(memcmp(ref + out_off[k], in + (size_t)i * total + out_off[k], out_len[k]) != 0,
			      "%s step %d: output %d still poison after the synchronous call", names[which],
			      i, k);
			CHECK(memcmp(got + out_off[k], ref + out_off[k], out_len[k]) == 0,
			      "%s step %d: output %d differs from the synchronous call's bytes",
			      names[which], i, k);
		}
	}
	if (which == 0) { /* the synchronous call itself against the oracle, on the last image */
		double err[3];
		char why[256];
		CHECK(fa_bwd_check(&bc, &bl, ref, 0, err, why, sizeof why), "oracle: %s", why);
	}
#undef VS_SYNC
	fprintf(stderr, "async %s (uid %u): %d steps on one stream, %.1f us per step including the "
	        "uploads and downloads; every output equals the synchronous call's, bit for bit\n",
	        names[which], (unsigned)getuid(), VS_STEPS, (double)(t1 - t0) / VS_STEPS);
	fa_buffer_free(b);
	fa_client_close(c);
	cu.StreamDestroy(stream);
	cu.MemFreeHost(pinned);
	cu.MemFree(dmem);
	return 0;
}

static int child_async_vs_sync_of(void *arg)
{
	CHECK(cu_start(0) == 0, "no CUDA");
	return run_async_vs_sync((int)(intptr_t)arg, g_daemon.url);
}

/* A bad table entry (a cache length past the capacity), written on the stream before an
 * asynchronous decode: the call returns FA_OK (the ring), the stream is not held, the failure
 * comes back once from fa_client_flush naming the entry, nothing was launched (o and lse keep
 * their poison), and the next call is served. */
static int child_async_decode_bad_entry(void *arg)
{
	(void)arg;
	const struct fa_infer_case ic = {.dtype = FA_DTYPE_BF16, .B = 4, .Hq = 8, .Hkv = 2,
	                                 .D = 128, .page = 16, .pages = 64, .pt_cols = 8};
	struct fa_infer_layout il;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_kvcache_args ka;
	cu_ptr dmem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 31;

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_infer_layout(&ic, &il);
	CHECK(cu.MemAlloc(&dmem, il.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, 2 * il.total, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, il.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_infer_kvcache_args(&ic, &il, b, &ka);
	char *img = pinned, *back = (char *)pinned + il.total;
	fa_infer_fill(&ic, &il, img, &rng);
	CHECK(cu.MemcpyHtoDAsync(dmem, img, il.total, stream) == 0, "upload");
	CHECK(fa_attn_kvcache_async(c, &ka, stream) == FA_OK, "warm-up: %s",
	      fa_last_error_detail());
	CHECK(cu.StreamSynchronize(stream) == 0 && fa_client_flush(c) == FA_OK, "warm-up: %s",
	      fa_last_error_detail());
	((int32_t *)(void *)(img + il.t0))[3] = (int32_t)(ic.page * ic.pt_cols + 1);
	CHECK(cu.MemcpyHtoDAsync(dmem, img, il.total, stream) == 0, "upload the bad table");
	fa_status st = fa_attn_kvcache_async(c, &ka, stream);
	CHECK(cu.MemcpyDtoHAsync(back, dmem, il.total, stream) == 0, "download");
	uint64_t t0 = fa_test_now_ms();
	CHECK(cu.StreamSynchronize(stream) == 0, "the stream after the bad call");
	uint64_t held = fa_test_now_ms() - t0;
	fa_status fl = st == FA_OK ? fa_client_flush(c) : st;
	fprintf(stderr, "async decode, bad cache length: the call %s, the stream held %llu ms, "
	        "then %s (%s)\n", fa_status_name(st), (unsigned long long)held,
	        fa_status_name(fl), fa_last_error_detail());
	CHECK(fl == FA_EINVAL && strstr(fa_last_error_detail(), "cache_seqlens[3]") != NULL,
	      "the refusal: %s", fa_status_name(fl));
	CHECK(fa_client_flush(c) == FA_OK, "reported once");
	CHECK(memcmp(back + il.o, img + il.o, il.o_bytes) == 0 &&
	      memcmp(back + il.lse, img + il.lse, il.lse_bytes) == 0,
	      "o or lse written although the call was refused");
	((int32_t *)(void *)(img + il.t0))[3] = 5;
	CHECK(cu.MemcpyHtoDAsync(dmem, img, il.total, stream) == 0, "upload");
	CHECK(fa_attn_kvcache_async(c, &ka, stream) == FA_OK, "after: %s", fa_last_error_detail());
	CHECK(cu.MemcpyDtoHAsync(back, dmem, il.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0 && fa_client_flush(c) == FA_OK, "after: %s",
	      fa_last_error_detail());
	CHECK(memcmp(back + il.o, img + il.o, il.o_bytes) != 0, "the good call wrote nothing");
	fa_buffer_free(b);
	fa_client_close(c);
	cu.MemFreeHost(pinned);
	cu.MemFree(dmem);
	return 0;
}

/* Overlapping outputs (only the daemon sees them: dq over q for the backward, o over q for a
 * decode), sent through the ring: each call returns FA_OK, its stream is not held (the daemon
 * writes the refused call's done word), the refusal comes back once from fa_client_flush as
 * FA_EOVERLAP, and the next good call is served. */
static int child_async_overlap_refusals(void *arg)
{
	(void)arg;
	const struct fa_case bc = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 128, .Sk = 128, .Hq = 4,
	                           .Hkv = 4, .D = 64};
	const struct fa_infer_case ic = {.dtype = FA_DTYPE_BF16, .B = 4, .Hq = 8, .Hkv = 2,
	                                 .D = 128, .page = 16, .pages = 64, .pt_cols = 8};
	struct fa_bwd_layout bl;
	struct fa_infer_layout il;
	fa_client *c = NULL;
	fa_buffer *bb = NULL, *ib = NULL;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba, bad_b;
	fa_attn_kvcache_args ka, bad_k;
	cu_ptr bmem = 0, imem = 0;
	void *stream = NULL, *pinned = NULL;
	uint64_t rng = 77;

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_bwd_layout(&bc, &bl);
	fa_infer_layout(&ic, &il);
	size_t host = bl.total > il.total ? bl.total : il.total;
	CHECK(cu.MemAlloc(&bmem, bl.total) == 0 && cu.MemAlloc(&imem, il.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, host, 0) == 0, "cuMemHostAlloc");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	fa_bwd_fill(&bc, &bl, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(bmem, pinned, bl.total, stream) == 0, "upload");
	fa_infer_fill(&ic, &il, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(imem, pinned, il.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "upload");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	fa_client_set_timeout(c, fa_test_ms(30000));
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)bmem, bl.total, &bb) == FA_OK &&
	      fa_buffer_register_device(c, (void *)(uintptr_t)imem, il.total, &ib) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_bwd_args(&bc, &bl, bb, 0, &fa, &ba);
	fa_infer_kvcache_args(&ic, &il, ib, &ka);
	/* The warm-up: a new session's first calls of three ops back to back, each compiling or
	 * loading its kernels in this daemon. They must reach the daemon's stream in this order:
	 * the client's stream writes the backward's ready word only after the forward's done
	 * word, so a backward enqueued ahead of the forward (whose kernel waited in the compile
	 * table) held both streams (fixed 2026-12-03: gpu_submit hands asynchronous jobs to their
	 * session's thread, which loads kernels before its stream waits). */
	uint64_t w0 = fa_test_now_ms();
	CHECK(fa_attn_fwd_async(c, &fa, stream) == FA_OK && fa_attn_bwd_async(c, &ba, stream) == FA_OK &&
	      fa_attn_kvcache_async(c, &ka, stream) == FA_OK, "warm-up: %s", fa_last_error_detail());
	uint64_t w1 = fa_test_now_ms();
	int sr = stream_done_within(stream, 20000);
	fprintf(stderr, "async warm-up: three first calls made in %llu ms, the stream done %llu ms "
	        "later (%d)\n", (unsigned long long)(w1 - w0),
	        (unsigned long long)(fa_test_now_ms() - w1), sr);
	CHECK(sr == 0, "warm-up: the stream %s", sr == -1 ? "still waits after 20 s: the session's "
	      "first calls were reordered" : "failed");
	CHECK(fa_client_flush(c) == FA_OK, "warm-up: %s", fa_last_error_detail());
	bad_b = ba;
	bad_b.dq = ba.q;
	bad_k = ka;
	bad_k.o = ka.q;
	for (int k = 0; k < 2; k++) {
		fa_status st = k == 0 ? fa_attn_bwd_async(c, &bad_b, stream)
		                      : fa_attn_kvcache_async(c, &bad_k, stream);
		fprintf(stderr, "async %s with an overlapping output: the call %s (%s)\n",
		        k == 0 ? "backward" : "decode", fa_status_name(st), fa_last_error_detail());
		uint64_t t0 = fa_test_now_ms();
		CHECK(cu.StreamSynchronize(stream) == 0, "the stream after the refused call");
		uint64_t held = fa_test_now_ms() - t0;
		fa_status fl = st == FA_OK ? fa_client_flush(c) : st;
		fprintf(stderr, "async %s with an overlapping output: the call %s, the stream held "
		        "%llu ms, then %s (%s)\n", k == 0 ? "backward" : "decode", fa_status_name(st),
		        (unsigned long long)held, fa_status_name(fl), fa_last_error_detail());
		CHECK(fl == FA_EOVERLAP, "the refusal: %s", fa_status_name(fl));
		CHECK(fa_client_flush(c) == FA_OK, "reported once");
	}
	CHECK(fa_attn_bwd_async(c, &ba, stream) == FA_OK &&
	      fa_attn_kvcache_async(c, &ka, stream) == FA_OK && cu.StreamSynchronize(stream) == 0,
	      "after: %s", fa_last_error_detail());
	CHECK(fa_client_flush(c) == FA_OK, "after: %s", fa_last_error_detail());
	fa_buffer_free(bb);
	fa_buffer_free(ib);
	fa_client_close(c);
	cu.MemFreeHost(pinned);
	cu.MemFree(bmem);
	cu.MemFree(imem);
	return 0;
}

/* The victim of the killed-client case (a fork of the test process, never a CUDA child's): its
 * stream waits on a host flag nobody sets, so its ready word is never written; its call is
 * enqueued (FA_OK), and it dies with SIGKILL, the session open and the daemon's stream
 * waiting. */
static int victim_main(void)
{
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128, .Sk = 128, .Hq = 4,
	                     .Hkv = 4, .D = 64};
	struct fa_case_layout l;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	cu_ptr dmem = 0, flag_dev = 0;
	void *stream = NULL, *pinned = NULL;

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, 64, 0x2 /* DEVICEMAP */) == 0, "cuMemHostAlloc");
	*(volatile uint32_t *)pinned = 0;
	CHECK(cu.MemHostGetDevicePointer(&flag_dev, pinned, 0) == 0, "device pointer");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK && cu.StreamSynchronize(stream) == 0,
	      "warm-up: %s", fa_last_error_detail());
	/* and a decode (its tables on the device), to leave one pending behind the forwards */
	const struct fa_infer_case ic = {.dtype = FA_DTYPE_BF16, .B = 2, .Hq = 8, .Hkv = 2,
	                                 .D = 128, .page = 16, .pages = 16, .pt_cols = 4};
	struct fa_infer_layout il;
	fa_infer_layout(&ic, &il);
	cu_ptr imem = 0;
	void *img = NULL;
	fa_buffer *ib = NULL;
	fa_attn_kvcache_args ka;
	uint64_t rng = 3;
	CHECK(cu.MemAlloc(&imem, il.total) == 0 && cu.MemHostAlloc(&img, il.total, 0) == 0,
	      "decode memory");
	fa_infer_fill(&ic, &il, img, &rng);
	CHECK(cu.MemcpyHtoDAsync(imem, img, il.total, stream) == 0, "upload");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)imem, il.total, &ib) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_infer_kvcache_args(&ic, &il, ib, &ka);
	CHECK(fa_attn_kvcache_async(c, &ka, stream) == FA_OK && cu.StreamSynchronize(stream) == 0,
	      "decode warm-up: %s", fa_last_error_detail());
	CHECK(cu.StreamWaitValue32(stream, flag_dev, 1, 0 /* GEQ */) == 0, "cuStreamWaitValue32");
	for (int i = 0; i < 3; i++)
		CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK, "pending call %d: %s", i,
		      fa_last_error_detail());
	CHECK(fa_attn_kvcache_async(c, &ka, stream) == FA_OK, "pending decode: %s",
	      fa_last_error_detail());
	fprintf(stderr, "victim: 3 forwards and a decode enqueued behind a ready word never "
	        "written; SIGKILL\n");
	fflush(stderr);
	raise(SIGKILL);
	return 2;
}

/* A stuck client (its stream waits on a host flag for longer than the daemon's
 * --async-wait-ms): the daemon releases the wait and counts a timeout; once the flag is set the
 * client's stream goes on (the done word was written), and the same client is served right. */
static int child_stuck_words_time_out(void *arg)
{
	(void)arg;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 128, .Sk = 128, .Hq = 4,
	                     .Hkv = 4, .D = 64};
	struct fa_case_layout l;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	fa_attn_fwd_args a;
	cu_ptr dmem = 0, flag_dev = 0;
	void *stream = NULL, *pinned = NULL;
	volatile uint32_t *flag;
	uint64_t rng = 5, before = 0, after = 0;
	static char text[16384];
	char why[256];

	CHECK(cu_start(0) == 0, "no CUDA");
	fa_case_layout(&cs, &l);
	CHECK(cu.MemAlloc(&dmem, l.total) == 0, "cuMemAlloc");
	CHECK(cu.MemHostAlloc(&pinned, l.total + 64, 0x2 /* DEVICEMAP */) == 0, "cuMemHostAlloc");
	flag = (volatile uint32_t *)((char *)pinned + l.total);
	*flag = 0;
	CHECK(cu.MemHostGetDevicePointer(&flag_dev, (void *)(uintptr_t)flag, 0) == 0, "devptr");
	CHECK(cu.StreamCreate(&stream, 1) == 0, "cuStreamCreate");
	fa_case_fill(&cs, &l, pinned, &rng);
	CHECK(cu.MemcpyHtoDAsync(dmem, pinned, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "upload");
	CHECK(fa_client_open(&c, g_daemon.url) == FA_OK, "open: %s", fa_last_error_detail());
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)dmem, l.total, &b) == FA_OK,
	      "register: %s", fa_last_error_detail());
	fa_case_args(&cs, &l, b, &a);
	CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK && cu.StreamSynchronize(stream) == 0,
	      "warm-up: %s", fa_last_error_detail());
	CHECK(fa_stats(c, text, sizeof text) == FA_OK, "stats");
	fa_stats_u64(text, "gpu_async_words_timeouts", &before);
	CHECK(cu.StreamWaitValue32(stream, flag_dev, 1, 0 /* GEQ */) == 0, "cuStreamWaitValue32");
	CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK, "stuck call: %s", fa_last_error_detail());
	uint64_t t0 = fa_test_now_ms();
	bool seen = false;
	while (!seen && fa_test_now_ms() - t0 < (uint64_t)fa_test_ms(20000)) {
		fa_test_sleep_ms(100);
		if (fa_stats(c, text, sizeof text) == FA_OK &&
		    fa_stats_u64(text, "gpu_async_words_timeouts", &after) && after > before)
			seen = true;
	}
	fprintf(stderr, "stuck client: the daemon released its wait after %llu ms (timeouts %llu "
	        "-> %llu)\n", (unsigned long long)(fa_test_now_ms() - t0),
	        (unsigned long long)before, (unsigned long long)after);
	CHECK(seen, "no timeout counted within 20 s");
	*flag = 1;
	CHECK(cu.StreamSynchronize(stream) == 0, "the client's stream after the release");
	/* Through the submission ring the released call's failure is the client's sticky error,
	 * reported once (fa_client.h); by the socket it was logged by the daemon only. */
	fa_status fl = fa_client_flush(c);
	fprintf(stderr, "stuck client: fa_client_flush: %s (%s)\n", fa_status_name(fl),
	        fa_last_error_detail());
	CHECK(fl == FA_ETIMEDOUT || fl == FA_OK, "flush: %s", fa_status_name(fl));
	CHECK(fa_client_flush(c) == FA_OK, "the sticky error is reported once");
	CHECK(cu.MemsetD8Async(dmem + l.o_off, 0xff, (size_t)l.o_span * 2, stream) == 0, "poison");
	CHECK(fa_attn_fwd_async(c, &a, stream) == FA_OK, "again: %s", fa_last_error_detail());
	CHECK(cu.MemcpyDtoHAsync(pinned, dmem, l.total, stream) == 0 &&
	      cu.StreamSynchronize(stream) == 0, "download");
	CHECK(fa_case_check(&cs, &l, pinned, NULL, why, sizeof why), "after the timeout: %s", why);
	fa_buffer_free(b);
	fa_client_close(c);
	cu.MemFree(dmem);
	return 0;
}

/* How many GPUs (a child: the parent never initialises CUDA); -1 without any. */
static int child_count(void *arg)
{
	(void)arg;
	int n = 0;
	if (cu_start(0) != 0 || cu.DeviceGetCount(&n) != 0)
		return 255;
	return n > 100 ? 100 : n;
}

/* ---- tests ------------------------------------------------------------------------------------- */

#define SKIP_WITHOUT_GPU()                                                                 \
	do {                                                                               \
		if (g_no_gpu) {                                                            \
			fprintf(stderr, "skipped: no GPU (no CUDA driver, or it sees no "      \
			        "device)\n");                                               \
			skip();                                                            \
		}                                                                          \
	} while (0)

static void test_gpu_async_chain_is_ordered_both_ways(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_chain, NULL, 120000), 0);
	uint64_t v = 0;
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "gpu_async_running", 0,
	                               fa_test_ms(10000), &v));
}

static void test_gpu_async_backward_chain_is_ordered_both_ways(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	int r = in_child(child_async_bwd_chain, NULL, 180000);
	assert_int_equal(r, 0);
}

static void test_gpu_async_returns_before_the_kernel_finishes(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_vs_sync, NULL, 120000), 0);
}

/* A numeric STATS key now (UINT64_MAX when missing). */
static uint64_t stat_now(const char *key)
{
	static char text[16384];
	uint64_t v;
	if (fa_integ_stats(g_daemon.url, text, sizeof text) != FA_OK ||
	    !fa_stats_u64(text, key, &v))
		return UINT64_MAX;
	return v;
}

static void test_gpu_canary_runs_and_passes(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	uint64_t runs = 0, failed, age, deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	/* the canary runs once a second, idle or busy */
	while ((runs = stat_now("gpu_canary_runs")) < 2 || runs == UINT64_MAX) {
		assert_true(fa_test_now_ms() < deadline);
		fa_test_sleep_ms(100);
	}
	failed = stat_now("gpu_canary_failed");
	age = stat_now("gpu_canary_age_ms");
	fprintf(stderr, "canary: %llu runs, %llu failed, last pass %llu ms ago\n",
	        (unsigned long long)runs, (unsigned long long)failed, (unsigned long long)age);
	assert_int_equal(failed, 0);
	assert_true(age < 5000);
	/* every section of the GPU backend's STATS made it into the reply (a 1 KiB buffer once
	 * dropped the tuning and kernel-cache sections without a word) */
	assert_true(stat_now("tune_entries") != UINT64_MAX);
	assert_true(stat_now("kernels_loaded") != UINT64_MAX && stat_now("kernels_loaded") > 0);
}

static void test_gpu_async_client_with_a_stuck_event_stalls_only_itself(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_stuck_event_stalls_only_its_session, NULL, 120000), 0);
}

static void test_gpu_other_user_is_served_synchronously_and_refused_async(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	if (geteuid() != 0) {
		fprintf(stderr, "skipped: becoming another user (uid 65534) needs root\n");
		skip();
	}
	assert_int_equal(daemon_run_self_for_another_user(&g_daemon, "test_gpu_async",
	                                                  "--other-user", 60000), 0);
}

static void test_gpu_async_words_enqueue_costs_against_ipc_events(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_enqueue_cost, NULL, 120000), 0);
}

static void test_gpu_async_ring_refusal_is_sticky_and_holds_no_stream(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_ring_refusal_is_sticky, NULL, 120000), 0);
}

static void test_gpu_async_killed_client_is_released_and_others_served(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	uint64_t rel0 = stat_now("gpu_async_words_released");
	fflush(stderr);
	pid_t p = fork();
	assert_true(p >= 0);
	if (p == 0)
		_exit(victim_main());
	int code = fa_test_waitpid(p, fa_test_ms(60000));
	fprintf(stderr, "victim ended: %d\n", code);
	uint64_t t0 = fa_test_now_ms(), v = 0;
	/* The session closes with the connection; its three waits are released at once. */
	bool idle = fa_integ_wait_stat(NULL, g_daemon.url, "gpu_async_running", 0,
	                               fa_test_ms(15000), &v);
	uint64_t rel1 = stat_now("gpu_async_words_released");
	fprintf(stderr, "killed client: gpu_async_running 0 %s after %llu ms; released %llu -> "
	        "%llu\n", idle ? "reached" : "NOT reached", (unsigned long long)(fa_test_now_ms() - t0),
	        (unsigned long long)rel0, (unsigned long long)rel1);
	assert_true(idle);
	assert_true(rel1 != UINT64_MAX && rel1 >= rel0 + 1);
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "inflight", 0, fa_test_ms(10000), &v));
	/* Another client is served, both modes. */
	assert_int_equal(in_child(child_async_vs_sync, NULL, 120000), 0);
}

static void test_gpu_async_stuck_client_times_out_and_is_served_after(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_stuck_words_time_out, NULL, 120000), 0);
}

static void test_gpu_second_device_serves_and_mixed_requests_are_refused(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	if (g_ngpus < 2) {
		fprintf(stderr, "skipped: %d GPU visible; the case needs two\n", g_ngpus);
		skip();
	}
	assert_int_equal(stat_now("gpu_devices"), (uint64_t)g_ngpus);
	assert_int_equal(in_child(child_second_gpu, NULL, 120000), 0);
}

static void test_gpu_async_bad_client_event_gets_einval_and_daemon_serves_on(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_client_event_that_does_not_open, NULL, 120000), 0);
	/* each refused job was handed back once: nothing stays in flight or enqueued */
	uint64_t v = 0;
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "inflight", 0, fa_test_ms(10000), &v));
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "gpu_async_running", 0,
	                               fa_test_ms(10000), &v));
}

static void test_gpu_async_host_buffers_get_einval(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_host_buffers, NULL, 120000), 0);
	uint64_t v = 0;
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "inflight", 0, fa_test_ms(10000), &v));
}

static void test_gpu_async_backward_equals_the_synchronous_call(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_vs_sync_of, (void *)(intptr_t)0, 180000), 0);
}

static void test_gpu_async_paged_decode_equals_the_synchronous_call(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_vs_sync_of, (void *)(intptr_t)1, 120000), 0);
}

static void test_gpu_async_varlen_equals_the_synchronous_call(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_vs_sync_of, (void *)(intptr_t)2, 120000), 0);
}

static void test_gpu_async_decode_bad_entry_is_sticky_and_launches_nothing(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_decode_bad_entry, NULL, 120000), 0);
	uint64_t v = 0;
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "inflight", 0, fa_test_ms(10000), &v));
}

static void test_gpu_async_overlapping_outputs_are_sticky_and_hold_no_stream(void **state)
{
	(void)state;
	SKIP_WITHOUT_GPU();
	assert_int_equal(in_child(child_async_overlap_refusals, NULL, 90000), 0);
	uint64_t v = 0;
	assert_true(fa_integ_wait_stat(NULL, g_daemon.url, "inflight", 0, fa_test_ms(10000), &v));
}

/* ---- setup ---------------------------------------------------------------------------------------- */

static int setup(void **state)
{
	(void)state;
	int n = in_child(child_count, NULL, 60000);
	if (n <= 0 || n == 255) {
		g_no_gpu = true;
		fprintf(stderr, "test_gpu_async: every test skips: no GPU (no CUDA driver, or it "
		        "sees no device)\n");
		return 0;
	}
	g_ngpus = n;
	/* a short --async-wait-ms: the stuck-client case waits for it */
	if (daemon_start(&g_daemon, "--backend", "gpu", "--async-wait-ms", "3000", NULL) != 0) {
		fprintf(stderr, "daemon_start --backend gpu failed (status %d)\n", g_daemon.status);
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

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--other-user") == 0)
		return other_user_main(argv[2]);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gpu_other_user_is_served_synchronously_and_refused_async),
		cmocka_unit_test(test_gpu_canary_runs_and_passes),
		cmocka_unit_test(test_gpu_async_chain_is_ordered_both_ways),
		cmocka_unit_test(test_gpu_async_backward_chain_is_ordered_both_ways),
		cmocka_unit_test(test_gpu_async_backward_equals_the_synchronous_call),
		cmocka_unit_test(test_gpu_async_paged_decode_equals_the_synchronous_call),
		cmocka_unit_test(test_gpu_async_varlen_equals_the_synchronous_call),
		cmocka_unit_test(test_gpu_async_decode_bad_entry_is_sticky_and_launches_nothing),
		cmocka_unit_test(test_gpu_async_overlapping_outputs_are_sticky_and_hold_no_stream),
		cmocka_unit_test(test_gpu_async_returns_before_the_kernel_finishes),
		cmocka_unit_test(test_gpu_async_client_with_a_stuck_event_stalls_only_itself),
		cmocka_unit_test(test_gpu_async_words_enqueue_costs_against_ipc_events),
		cmocka_unit_test(test_gpu_async_ring_refusal_is_sticky_and_holds_no_stream),
		cmocka_unit_test(test_gpu_async_stuck_client_times_out_and_is_served_after),
		cmocka_unit_test(test_gpu_async_killed_client_is_released_and_others_served),
		cmocka_unit_test(test_gpu_second_device_serves_and_mixed_requests_are_refused),
		/* Last: refusals that, should the daemon regress, could take it down */
		cmocka_unit_test(test_gpu_async_host_buffers_get_einval),
		cmocka_unit_test(test_gpu_async_bad_client_event_gets_einval_and_daemon_serves_on),
	};
	if (getenv("FA_TEST_FILTER") != NULL)
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
