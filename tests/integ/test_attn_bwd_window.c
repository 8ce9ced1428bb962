/* test_attn_bwd_window.c - the backward pass with the sliding window and softcap end to end
 * through a real daemon on the CPU backend: the forward and the backward get the same window
 * and softcap, and dQ, dK, dV from several client processes at once match the float64 oracle
 * (kernels/attn_bwd_ref.c) on odd shapes (Sq != Sk, GQA, windows alone and with causal masks,
 * rows whose window holds no key, softcaps 5..50), outputs poisoned first. A bad softcap
 * (negative, NaN) is refused by the client with FA_EINVAL and a detail, nothing written. At the
 * end the daemon exits 0 on SIGTERM with a clean log.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <math.h>

#include <cmocka.h>

#include "fa_bwd_case.h"
#include "fa_integ.h"

#define NPROCS 3 /* client processes computing at once */

static struct fa_daemon g_d;

/* A shape with the window and softcap both calls get. */
struct win_case {
	struct fa_case c;
	int32_t window;
	int64_t left, right;
	double softcap;
};

static const struct win_case win_cases[] = {
	{{.dtype = FA_DTYPE_FP32, .B = 2, .Sq = 17, .Sk = 33, .Hq = 4, .Hkv = 2, .D = 16}, 1, 5, 3,
	 0},
	{{.dtype = FA_DTYPE_BF16, .B = 1, .Sq = 33, .Sk = 17, .Hq = 6, .Hkv = 2, .D = 24,
	  .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .bhsd = true}, 1, 4, -1, 30.0},
	{{.dtype = FA_DTYPE_FP16, .B = 2, .Sq = 9, .Sk = 40, .Hq = 3, .Hkv = 1, .D = 32,
	  .mask = FA_MASK_CAUSAL_TOP_LEFT, .scale = 0.3, .pad = 8}, 1, 2, 0, 5.0},
	/* softcap alone, scores large enough for the cap to bend them */
	{{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 31, .Sk = 29, .Hq = 4, .Hkv = 1, .D = 64,
	  .scale = 1.0, .precision = FA_PREC_IEEE}, 0, 0, 0, 5.0},
	/* Sq > Sk, bottom-right, unbounded left: the first six rows see no key */
	{{.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 20, .Sk = 12, .Hq = 2, .Hkv = 2, .D = 8,
	  .precision = FA_PREC_IEEE}, 1, -3, 2, 50.0},
	/* (-1, 0): causal as a window */
	{{.dtype = FA_DTYPE_BF16, .B = 2, .Sq = 40, .Sk = 64, .Hq = 8, .Hkv = 4, .D = 64,
	  .bhsd = true, .pad = 8}, 1, -1, 0, 0},
};
#define NCASES (sizeof win_cases / sizeof win_cases[0])

/* As test_attn_bwd.c's: the final rounding to the dtype, and no more. */
static double tight_tol(fa_dtype dt)
{
	return dt == FA_DTYPE_FP32 ? 1e-6 : dt == FA_DTYPE_BF16 ? 4e-3 : 1e-3;
}

/* The window and softcap of a case as the oracle's descriptor carries them. */
static struct fa_attn_fwd_desc win_desc(const struct win_case *w)
{
	struct fa_attn_fwd_desc d;
	memset(&d, 0, sizeof d);
	d.window = w->window != 0;
	d.window_left = w->left;
	d.window_right = w->right;
	d.softcap = w->softcap;
	return d;
}

/* Forward (o, lse) then backward through the daemon with w's window and softcap, then the
 * check against the oracle with them. */
static bool run_win_case(fa_client *c, fa_buffer **buf, const struct win_case *w, unsigned flags,
                         uint64_t *rng, double err[3], char *why, size_t whycap)
{
	struct fa_bwd_layout l;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	fa_bwd_layout(&w->c, &l);
	fa_status st = fa_integ_buffer(c, buf, l.total);
	if (st != FA_OK) {
		snprintf(why, whycap, "buffer of %zu: %s", l.total, fa_status_name(st));
		return false;
	}
	fa_bwd_fill(&w->c, &l, fa_buffer_data(*buf), rng);
	fa_bwd_args(&w->c, &l, *buf, flags, &fa, &ba);
	fa.window = ba.window = w->window;
	fa.window_left = ba.window_left = w->left;
	fa.window_right = ba.window_right = w->right;
	fa.softcap = ba.softcap = w->softcap;
	if ((st = fa_attn_fwd(c, &fa)) != FA_OK) {
		snprintf(why, whycap, "fa_attn_fwd: %s (%s)", fa_status_name(st), fa_last_error_detail());
		return false;
	}
	if ((st = fa_attn_bwd(c, &ba)) != FA_OK) {
		snprintf(why, whycap, "fa_attn_bwd: %s (%s)", fa_status_name(st), fa_last_error_detail());
		return false;
	}
	struct fa_attn_fwd_desc wd = win_desc(w);
	return fa_bwd_check_win(&w->c, &l, fa_buffer_data(*buf), &wd, tight_tol(w->c.dtype), err,
	                        why, whycap);
}

/* A client process: every case, with and without the deterministic flag; the failures. */
static int client_main(int id)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 0x2000u + (uint64_t)id * 7919u;
	int bad = 0;
	if (fa_client_open(&c, g_d.url) != FA_OK) {
		fprintf(stderr, "client %d: cannot open: %s\n", id, fa_last_error_detail());
		return 100;
	}
	fa_client_set_timeout(c, fa_test_ms(60000));
	for (int round = 0; round < 2; round++)
		for (size_t i = 0; i < NCASES; i++) {
			char why[256], desc[256];
			double err[3] = {0};
			const struct win_case *w = &win_cases[(i + (size_t)id) % NCASES];
			fa_case_describe(&w->c, desc, sizeof desc);
			if (!run_win_case(c, &buf, w, round ? FA_BWD_DETERMINISTIC : 0, &rng, err, why,
			                  sizeof why)) {
				fprintf(stderr, "client %d: %s\n    case: %s window %d (%lld, %lld) cap %g\n",
				        id, why, desc, w->window, (long long)w->left, (long long)w->right,
				        w->softcap);
				bad++;
			} else if (id == 0 && round == 0) {
				fprintf(stderr, "  %-48.48s w(%lld,%lld) cap %-4g dq %.2e dk %.2e dv %.2e\n",
				        desc, w->window ? (long long)w->left : 0LL,
				        w->window ? (long long)w->right : 0LL, w->softcap, err[0], err[1],
				        err[2]);
			}
		}
	fa_buffer_free(buf);
	fa_client_close(c);
	return bad;
}

static int setup(void **state)
{
	(void)state;
	if (daemon_start(&g_d, "--threads", "3", NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	int failed = 0;
	int st = daemon_stop(&g_d);
	if (st != 0) {
		fprintf(stderr, "teardown: daemon exit status %d, want 0\n", st);
		daemon_log_dump(&g_d, 40);
		failed |= 1;
	}
	if (!daemon_log_clean(&g_d))
		failed |= 2;
	daemon_cleanup(&g_d);
	return failed ? -1 : 0;
}

/* NPROCS processes at once, each every case twice. Runs first: no client open while forking. */
static void test_bwd_window_softcap_gradients_match_the_reference_from_several_processes(
    void **state)
{
	(void)state;
	pid_t pid[NPROCS];
	fflush(stderr);
	for (int i = 0; i < NPROCS; i++) {
		pid[i] = fork();
		assert_true(pid[i] >= 0);
		if (pid[i] == 0)
			_exit(client_main(i));
	}
	int bad = 0;
	for (int i = 0; i < NPROCS; i++) {
		int code = fa_test_waitpid(pid[i], fa_test_ms(240000));
		if (code != 0) {
			fprintf(stderr, "client %d ended with %d\n", i, code);
			if (code < 0)
				kill(pid[i], SIGKILL);
			bad++;
		}
	}
	assert_int_equal(bad, 0);
}

/* The window and softcap change the gradients (the wire carried them): the same inputs without
 * them give other dQ. */
static void test_bwd_window_reaches_the_daemon(void **state)
{
	(void)state;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 77;
	char why[256];
	double err[3];
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	struct win_case w = win_cases[0];
	assert_true(run_win_case(c, &buf, &w, 0, &rng, err, why, sizeof why));
	/* the same buffer checked against the oracle without the window must fail */
	struct fa_bwd_layout l;
	fa_bwd_layout(&w.c, &l);
	assert_false(fa_bwd_check(&w.c, &l, fa_buffer_data(buf), tight_tol(w.c.dtype), err, why,
	                          sizeof why));
	w.window = 0;
	w.softcap = 20.0;
	assert_true(run_win_case(c, &buf, &w, 0, &rng, err, why, sizeof why));
	assert_false(fa_bwd_check(&w.c, &l, fa_buffer_data(buf), tight_tol(w.c.dtype), err, why,
	                          sizeof why));
	fa_buffer_free(buf);
	fa_client_close(c);
}

/* Bad softcaps: FA_EINVAL with the softcap's detail, before any round trip; dq untouched. */
static void test_bwd_bad_softcap_is_refused_with_a_detail(void **state)
{
	(void)state;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 78;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	const struct fa_case *cs = &win_cases[0].c;
	struct fa_bwd_layout l;
	fa_attn_fwd_args fa;
	fa_attn_bwd_args ba;
	fa_bwd_layout(cs, &l);
	assert_int_equal(fa_integ_buffer(c, &buf, l.total), FA_OK);
	fa_bwd_fill(cs, &l, fa_buffer_data(buf), &rng);
	fa_bwd_args(cs, &l, buf, 0, &fa, &ba);
	assert_int_equal(fa_attn_fwd(c, &fa), FA_OK);
	static const double bad[] = {-1.0, NAN, INFINITY};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ba.softcap = bad[i];
		assert_int_equal(fa_attn_bwd(c, &ba), FA_EINVAL);
		if (strstr(fa_last_error_detail(), "softcap is") == NULL)
			fail_msg("softcap %g: detail '%s'", bad[i], fa_last_error_detail());
	}
	const char *dq = (const char *)fa_buffer_data(buf) + l.dq_off;
	for (int64_t i = 0; i < l.f.q_span; i++)
		assert_true(fa_case_is_poison(dq, cs->dtype, i));
	fa_buffer_free(buf);
	fa_client_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(
		    test_bwd_window_softcap_gradients_match_the_reference_from_several_processes),
		cmocka_unit_test(test_bwd_window_reaches_the_daemon),
		cmocka_unit_test(test_bwd_bad_softcap_is_refused_with_a_detail),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
