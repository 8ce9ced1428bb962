/* test_hostile.c - bounded work with a real daemon (CPU backend) and real client processes:
 * the 237-byte stride-0 request of issue 14 (Sq = Sk = 2^20) is refused before anything runs
 * with a detail naming the limit; a client killed in the middle of a long request has the rest
 * of it dropped within a bounded time (while another client is served) and its shm objects
 * unlinked; SIGTERM with a request running ends within the drain deadline plus a margin, the
 * request answered FA_ECLOSED, and the live client's shm objects left where they are.
 * The bounds are generous (seconds against a ~50 ms piece): nothing here is a timing benchmark
 * (tests/bench/bench_hostile.c measures).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"

/* A request of minutes on one CPU worker (4*4*8192^2*64 = 69 GFLOP, under the CPU default
 * limit of 1000): long enough to be killed or stopped in the middle. */
static const struct fa_case long_case = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 8192, .Sk = 8192,
                                         .Hq = 4, .Hkv = 4, .D = 64,
                                         .precision = FA_PREC_IEEE};

/* The client of a long request (a child process): tells the parent (one byte on w) just before
 * sending it, writes its status and whether the detail named the drain deadline on w, then
 * waits for one byte on r before freeing its buffer and exiting. */
static int long_client(const char *url, int w, int r)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	char ch = 'G';

	if (fa_client_open(&c, url) != FA_OK)
		return 2;
	fa_client_set_timeout(c, 0);
	fa_case_layout(&long_case, &l);
	if (fa_buffer_alloc_host(c, l.total, &buf) != FA_OK)
		return 3;
	memset(fa_buffer_data(buf), 0, l.total);
	fa_case_args(&long_case, &l, buf, &a);
	fa_test_write_all(w, &ch, 1);
	int st = fa_attn_fwd(c, &a);
	char res[2] = {(char)st, strstr(fa_last_error_detail(), "drain deadline") != NULL};
	fa_test_write_all(w, res, 2);
	fa_test_read_full(r, &ch, 1, fa_test_ms(60000));
	fa_buffer_free(buf);
	fa_client_close(c);
	return 0;
}

/* Fork long_client; *w_parent is where the parent writes its "go on" byte. */
static pid_t start_long_client(const char *url, int *from_child, int *to_child)
{
	int up[2], down[2];
	char ch;

	assert_int_equal(pipe(up), 0);
	assert_int_equal(pipe(down), 0);
	fflush(stderr);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		_exit(long_client(url, up[1], down[0]));
	}
	close(up[1]);
	close(down[0]);
	assert_int_equal(fa_test_read_full(up[0], &ch, 1, fa_test_ms(20000)), 0);
	*from_child = up[0];
	*to_child = down[1];
	return pid;
}

/* Wait until the daemon computes something (fwd_running 1). */
static void wait_running(const char *url)
{
	uint64_t v;
	bool running = fa_integ_wait_stat(NULL, url, "fwd_running", 1, fa_test_ms(20000), &v);
	if (!running)
		fprintf(stderr, "the long request never ran (fwd_running %llu)\n",
		        (unsigned long long)v);
	assert_true(running);
}

/* Issue 14's request: tensors of stride 0, Sq = Sk = 2^20, each 32 bytes of memory. */
static void test_hostile_stride0_request_of_2p20_tokens_is_refused_with_the_limit(void **state)
{
	struct fa_daemon d;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	const int64_t S = INT64_C(1) << 20, st0[4] = {0, 0, 0, 1};
	(void)state;

	assert_int_equal(daemon_start(&d, "--backend", "cpu", "--threads", "2", NULL), 0);
	assert_int_equal(fa_client_open(&c, d.url), FA_OK);
	fa_client_set_timeout(c, fa_test_ms(10000));
	assert_int_equal(fa_buffer_alloc_host(c, 4096, &buf), FA_OK);
	fa_attn_fwd_args a;
	memset(&a, 0, sizeof a);
	a.q = fa_case_tensor(buf, 0, FA_DTYPE_FP16, 1, S, 1, 16, st0);
	a.k = fa_case_tensor(buf, 256, FA_DTYPE_FP16, 1, S, 1, 16, st0);
	a.v = fa_case_tensor(buf, 512, FA_DTYPE_FP16, 1, S, 1, 16, st0);
	a.o = fa_case_tensor(buf, 1024, FA_DTYPE_FP16, 1, S, 1, 16, st0);
	memset(fa_buffer_data(buf), 0x55, 4096);
	uint64_t t0 = fa_test_now_ms();
	assert_int_equal(fa_attn_fwd(c, &a), FA_ETOOBIG);
	const char *det = fa_last_error_detail();
	fprintf(stderr, "refused in %llu ms: %s\n", (unsigned long long)(fa_test_now_ms() - t0),
	        det);
	assert_non_null(strstr(det, "GFLOP"));
	assert_non_null(strstr(det, "limit of 1000 GFLOP"));
	assert_non_null(strstr(det, "--max-request-gflop"));
	assert_non_null(strstr(det, "Sq 1048576 Sk 1048576"));
	/* nothing was written */
	const unsigned char *o = (const unsigned char *)fa_buffer_data(buf) + 1024;
	for (int i = 0; i < 32; i++)
		assert_int_equal(o[i], 0x55);
	/* the option moves the limit: a causal version of the same request is half */
	a.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	assert_int_equal(fa_attn_fwd(c, &a), FA_ETOOBIG);
	assert_non_null(strstr(fa_last_error_detail(), "causal"));
	/* and the daemon still serves */
	uint64_t rng = 3;
	char why[256];
	fa_buffer *b2 = NULL;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 16, .Sk = 24, .Hq = 2,
	                     .Hkv = 1, .D = 32, .lse = true};
	assert_true(fa_integ_run_case(c, &b2, &cs, &rng, NULL, NULL, why, sizeof why));
	fa_buffer_free(b2);
	fa_buffer_free(buf);
	fa_client_close(c);
	assert_int_equal(daemon_finish(&d), 0);
}

/* The client dies in the middle of a long request: its remaining pieces are dropped within a
 * bounded time, its objects unlinked; meanwhile another client was served. */
static void test_hostile_killed_clients_request_is_dropped_while_another_is_served(void **state)
{
	struct fa_daemon d;
	int from, to;
	uint64_t v;
	char text[16384];
	(void)state;

	assert_int_equal(daemon_start(&d, "--backend", "cpu", "--threads", "2", NULL), 0);
	pid_t pid = start_long_client(d.url, &from, &to);
	wait_running(d.url);

	/* Another client: one worker is left to it (--session-workers 1 of 2). */
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 9, t0 = fa_test_now_ms();
	char why[256];
	struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 64, .Sk = 64, .Hq = 4, .Hkv = 4,
	                     .D = 64, .mask = FA_MASK_CAUSAL_TOP_LEFT, .lse = true};
	assert_int_equal(fa_client_open(&c, d.url), FA_OK);
	fa_client_set_timeout(c, fa_test_ms(20000));
	bool ok = fa_integ_run_case(c, &buf, &cs, &rng, NULL, NULL, why, sizeof why);
	if (!ok)
		fprintf(stderr, "the other client: %s\n", why);
	assert_true(ok);
	fprintf(stderr, "another client served in %llu ms beside the long request\n",
	        (unsigned long long)(fa_test_now_ms() - t0));
	fa_buffer_free(buf);
	fa_client_close(c);
	assert_true(fa_integ_wait_stat(NULL, d.url, "fwd_running", 1, 1000, &v)); /* still on */

	assert_int_equal(fa_test_count_shm(pid), 1);
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(fa_test_waitpid(pid, fa_test_ms(10000)), 128 + SIGKILL);
	close(from);
	close(to);
	t0 = fa_test_now_ms();
	bool dropped = fa_integ_wait_stat(NULL, d.url, "inflight", 0, fa_test_ms(10000), &v);
	uint64_t ms = fa_test_now_ms() - t0;
	fprintf(stderr, "the dead client's request was dropped %llu ms after the kill\n",
	        (unsigned long long)ms);
	assert_true(dropped);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(5000);
	while (fa_test_count_shm(pid) > 0 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(20);
	assert_int_equal(fa_test_count_shm(pid), 0);
	assert_int_equal(fa_integ_stats(d.url, text, sizeof text), FA_OK);
	assert_true(fa_stats_u64(text, "cpu_jobs_stopped", &v));
	assert_int_equal(v, 1);
	assert_true(fa_stats_u64(text, "regions", &v));
	assert_int_equal(v, 0);
	assert_int_equal(daemon_finish(&d), 0);
}

/* SIGTERM while a long request runs: the daemon exits 0 within the drain deadline plus a
 * margin; the request is answered FA_ECLOSED naming the deadline; the client, alive, still has
 * its shm object (the daemon unmaps it, never unlinks a live client's memory). */
static void test_hostile_sigterm_ends_within_the_drain_deadline(void **state)
{
	struct fa_daemon d;
	int from, to;
	char res[2], ch = 'x';
	(void)state;

	assert_int_equal(daemon_start(&d, "--backend", "cpu", "--threads", "2",
	                              "--drain-timeout-ms", "300", NULL),
	                 0);
	pid_t pid = start_long_client(d.url, &from, &to);
	wait_running(d.url);
	uint64_t t0 = fa_test_now_ms();
	int code = daemon_stop(&d);
	uint64_t ms = fa_test_now_ms() - t0;
	fprintf(stderr, "SIGTERM to exit: %llu ms (drain deadline 300 ms)\n",
	        (unsigned long long)ms);
	assert_int_equal(code, 0);
	assert_true(ms < 300 + (uint64_t)fa_test_ms(5000));
	assert_int_equal(fa_test_read_full(from, res, 2, fa_test_ms(10000)), 0);
	assert_int_equal(res[0], FA_ECLOSED);
	assert_int_equal(res[1], 1);
	assert_int_equal(fa_test_count_shm(pid), 1); /* the client's own, untouched */
	assert_true(daemon_log_contains(&d, "drain deadline of 300 ms passed"));
	fa_test_write_all(to, &ch, 1);
	assert_int_equal(fa_test_waitpid(pid, fa_test_ms(10000)), 0);
	assert_int_equal(fa_test_count_shm(pid), 0);
	close(from);
	close(to);
	assert_true(daemon_log_clean(&d));
	daemon_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hostile_stride0_request_of_2p20_tokens_is_refused_with_the_limit),
		cmocka_unit_test(test_hostile_killed_clients_request_is_dropped_while_another_is_served),
		cmocka_unit_test(test_hostile_sigterm_ends_within_the_drain_deadline),
	};
	if (getenv("FA_TEST_FILTER"))
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
