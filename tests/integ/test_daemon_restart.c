/* test_daemon_restart.c - the daemon dies (SIGKILL) and a new one takes the same socket: a
 * client's next call fails within a bound with a status that says so (never hangs), and
 * fa_client_reconnect() brings it back with its buffers and their contents.
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

#define CALL_TIMEOUT_MS 3000

static void test_daemon_restart_client_sees_new_epoch_and_reconnects(void **state)
{
	(void)state;
	struct fa_daemon d1, d2;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 99;
	char why[256];
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 2, .Sq = 17, .Sk = 64, .Hq = 4, .Hkv = 1,
	                     .D = 64, .mask = FA_MASK_CAUSAL_TOP_LEFT, .lse = true, .bhsd = true};
	struct fa_case_layout l;
	fa_attn_fwd_args a;

	assert_int_equal(daemon_start(&d1, NULL), 0);
	assert_int_equal(fa_client_open(&c, d1.url), FA_OK);
	assert_int_equal(fa_client_set_timeout(c, fa_test_ms(CALL_TIMEOUT_MS)), FA_OK);
	uint64_t epoch1 = fa_client_epoch(c);
	assert_true(epoch1 != 0);
	assert_true(fa_integ_run_case(c, &buf, &cs, &rng, NULL, NULL, why, sizeof why));
	void *data = fa_buffer_data(buf);

	/* A crash, and a new daemon on the same (now stale) socket path. */
	assert_int_equal(daemon_kill(&d1), 128 + SIGKILL);
	int r = daemon_start_at(&d2, d1.sock, NULL);
	if (r != 0)
		daemon_log_dump(&d2, 20);
	assert_int_equal(r, 0);

	/* The next call: an error, within the bound, never a hang and never FA_OK. */
	fa_case_layout(&cs, &l);
	fa_case_fill(&cs, &l, data, &rng);
	fa_case_args(&cs, &l, buf, &a);
	uint64_t t0 = fa_test_now_ms();
	fa_status st = fa_attn_fwd(c, &a);
	uint64_t took = fa_test_now_ms() - t0;
	fprintf(stderr, "first call after the restart: %s after %llu ms (%s)\n", fa_status_name(st),
	        (unsigned long long)took, fa_last_error_detail());
	assert_true(st == FA_ESESSION || st == FA_ETIMEDOUT || st == FA_EUNAVAIL);
	assert_true(took <= (uint64_t)fa_test_ms(CALL_TIMEOUT_MS) + 2000);
	/* O still poisoned: nothing computed. */
	assert_true(fa_case_is_poison((char *)data + l.o_off, cs.dtype, 0));

	/* Reconnect: a new session on the new daemon, the same buffer (address and contents). */
	assert_int_equal(fa_client_reconnect(c), FA_OK);
	assert_true(fa_client_epoch(c) != 0);
	assert_true(fa_client_epoch(c) != epoch1);
	assert_ptr_equal(fa_buffer_data(buf), data);
	st = fa_attn_fwd(c, &a);
	if (st != FA_OK)
		fprintf(stderr, "retry: %s (%s)\n", fa_status_name(st), fa_last_error_detail());
	assert_int_equal(st, FA_OK);
	bool ok = fa_case_check(&cs, &l, data, NULL, why, sizeof why);
	if (!ok)
		fprintf(stderr, "retry result: %s\n", why);
	assert_true(ok);
	assert_int_equal(fa_ping(c), FA_OK);

	/* The new daemon holds exactly this client's session and region. */
	char text[16384];
	uint64_t v;
	assert_int_equal(fa_stats(c, text, sizeof text), FA_OK);
	assert_true(fa_stats_u64(text, "regions", &v));
	assert_int_equal(v, 1);

	assert_int_equal(fa_buffer_free(buf), FA_OK);
	fa_client_close(c);
	assert_int_equal(daemon_stop(&d2), 0);
	assert_true(daemon_log_clean(&d2));
	daemon_cleanup(&d2);
	daemon_cleanup(&d1);
}

/* The daemon dies and nothing takes its place: calls fail within the bound, and a reconnect
 * attempt reports FA_EUNAVAIL instead of hanging. */
static void test_daemon_restart_dead_daemon_fails_calls_within_bound(void **state)
{
	(void)state;
	struct fa_daemon d;
	fa_client *c = NULL;
	assert_int_equal(daemon_start(&d, NULL), 0);
	assert_int_equal(fa_client_open(&c, d.url), FA_OK);
	assert_int_equal(fa_client_set_timeout(c, fa_test_ms(CALL_TIMEOUT_MS)), FA_OK);
	daemon_kill(&d);
	uint64_t t0 = fa_test_now_ms();
	fa_status st = fa_ping(c);
	uint64_t took = fa_test_now_ms() - t0;
	fprintf(stderr, "ping to a dead daemon: %s after %llu ms\n", fa_status_name(st),
	        (unsigned long long)took);
	assert_true(st == FA_ETIMEDOUT || st == FA_EUNAVAIL);
	assert_true(took <= (uint64_t)fa_test_ms(CALL_TIMEOUT_MS) + 2000);
	t0 = fa_test_now_ms();
	st = fa_client_reconnect(c);
	took = fa_test_now_ms() - t0;
	fprintf(stderr, "reconnect to nothing: %s after %llu ms\n", fa_status_name(st),
	        (unsigned long long)took);
	assert_int_equal(st, FA_EUNAVAIL);
	assert_true(took <= (uint64_t)fa_test_ms(10000));
	fa_client_close(c);
	daemon_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_daemon_restart_client_sees_new_epoch_and_reconnects),
		cmocka_unit_test(test_daemon_restart_dead_daemon_fails_calls_within_bound),
	};
	if (getenv("FA_TEST_FILTER")) /* run only the tests matching a pattern */
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
