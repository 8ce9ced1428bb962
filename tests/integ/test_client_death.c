/* test_client_death.c - a client SIGKILLed in the middle of a long request leaves nothing behind:
 * its session and regions go, its /dev/shm objects are unlinked, and other clients carry on.
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

static struct fa_daemon g_d;

static int setup(void **state)
{
	(void)state;
	if (daemon_start(&g_d, "--threads", "2", NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return daemon_finish(&g_d);
}

/* The victim: two extra buffers, then a request long on the CPU backend; it tells the parent
 * (one byte on `w`) just before sending it, and never gets to the end. */
static int victim(int w)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL, *extra[2] = {0};
	uint64_t rng = 5;
	char why[256];
	if (fa_client_open(&c, g_d.url) != FA_OK)
		return 2;
	fa_client_set_timeout(c, 0);
	for (int i = 0; i < 2; i++)
		if (fa_buffer_alloc_host(c, 1 << 16, &extra[i]) != FA_OK)
			return 3;
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 1024, .Sk = 1024, .Hq = 8,
	                     .Hkv = 8, .D = 64, .precision = FA_PREC_IEEE};
	struct fa_case_layout l;
	fa_case_layout(&cs, &l);
	if (fa_buffer_alloc_host(c, l.total, &buf) != FA_OK)
		return 4;
	char ch = 'G';
	fa_test_write_all(w, &ch, 1);
	fa_integ_run_case(c, &buf, &cs, &rng, NULL, NULL, why, sizeof why);
	return 5; /* should have been killed long before */
}

static void test_client_death_mid_request_frees_session_regions_and_shm(void **state)
{
	(void)state;
	int p[2];
	char ch;
	char text[16384];
	uint64_t sessions0, v;
	assert_int_equal(fa_integ_stats(g_d.url, text, sizeof text), FA_OK);
	assert_true(fa_stats_u64(text, "sessions", &sessions0)); /* the snapshot's own: 1 */

	assert_int_equal(pipe(p), 0);
	fflush(stderr);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		_exit(victim(p[1]));
	}
	close(p[1]);
	assert_int_equal(fa_test_read_full(p[0], &ch, 1, fa_test_ms(20000)), 0);
	close(p[0]);

	/* Kill it once the daemon is working on its request. */
	bool running = fa_integ_wait_stat(NULL, g_d.url, "inflight", 1, fa_test_ms(20000), &v);
	if (!running)
		fprintf(stderr, "the victim's request never showed as in flight (last %llu)\n",
		        (unsigned long long)v);
	assert_true(running);
	assert_true(fa_test_count_shm(pid) == 3);
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(fa_test_waitpid(pid, fa_test_ms(10000)), 128 + SIGKILL);
	uint64_t t0 = fa_test_now_ms();

	/* Within a bound: no session (but the snapshot's), no region, no shm object of the victim.
	 * The bound covers the request still computing: the daemon may not unmap under it. */
	bool gone = fa_integ_wait_stat(NULL, g_d.url, "regions", 0, fa_test_ms(60000), &v);
	if (!gone)
		fprintf(stderr, "regions still %llu\n", (unsigned long long)v);
	assert_true(gone);
	gone = fa_integ_wait_stat(NULL, g_d.url, "sessions", sessions0, fa_test_ms(10000), &v);
	if (!gone)
		fprintf(stderr, "sessions still %llu\n", (unsigned long long)v);
	assert_true(gone);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (fa_test_count_shm(pid) > 0 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(20);
	assert_int_equal(fa_test_count_shm(pid), 0);
	fprintf(stderr, "cleaned up %llu ms after the kill\n",
	        (unsigned long long)(fa_test_now_ms() - t0));
	assert_int_equal(fa_integ_stats(g_d.url, text, sizeof text), FA_OK);
	assert_true(fa_stats_u64(text, "region_bytes", &v));
	assert_int_equal(v, 0);

	/* Another client works. */
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 11;
	char why[256];
	struct fa_case cs = {.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 33, .Sk = 70, .Hq = 4, .Hkv = 2,
	                     .D = 128, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .lse = true};
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	bool ok = fa_integ_run_case(c, &buf, &cs, &rng, NULL, NULL, why, sizeof why);
	if (!ok)
		fprintf(stderr, "after the death: %s\n", why);
	assert_true(ok);
	fa_buffer_free(buf);
	fa_client_close(c);
}

/* A client killed while idle (no request) holding buffers: same cleanup, promptly. */
static void test_client_death_while_idle_frees_everything(void **state)
{
	(void)state;
	int p[2];
	char ch;
	uint64_t v;
	assert_int_equal(pipe(p), 0);
	fflush(stderr);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		fa_client *c = NULL;
		fa_buffer *b[3];
		if (fa_client_open(&c, g_d.url) != FA_OK)
			_exit(2);
		for (int i = 0; i < 3; i++)
			if (fa_buffer_alloc_host(c, 4096, &b[i]) != FA_OK)
				_exit(3);
		ch = 'G';
		fa_test_write_all(p[1], &ch, 1);
		pause();
		_exit(4);
	}
	close(p[1]);
	assert_int_equal(fa_test_read_full(p[0], &ch, 1, fa_test_ms(20000)), 0);
	close(p[0]);
	assert_int_equal(fa_test_count_shm(pid), 3);
	kill(pid, SIGKILL);
	assert_int_equal(fa_test_waitpid(pid, fa_test_ms(10000)), 128 + SIGKILL);
	assert_true(fa_integ_wait_stat(NULL, g_d.url, "regions", 0, fa_test_ms(5000), &v));
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(5000);
	while (fa_test_count_shm(pid) > 0 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(20);
	assert_int_equal(fa_test_count_shm(pid), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_client_death_mid_request_frees_session_regions_and_shm),
		cmocka_unit_test(test_client_death_while_idle_frees_everything),
	};
	if (getenv("FA_TEST_FILTER")) /* run only the tests matching a pattern */
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
