/* test_multi_client.c - several client processes, several threads each, many shapes at once,
 * every result checked against the float64 reference; the daemon's counters add up afterwards
 * and every session and region is gone once the clients closed.
 */
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"

#define NPROC 4
#define NTHREAD 4
#define REQ_PER_THREAD 25 /* 4 processes x 4 threads x 25 = 400 requests */
#define MAX_S 128
#define MAX_WORK 4e6 /* B*Hq*Sq*Sk*D per request: keeps the ASan run on 2 cores short */

static struct fa_daemon g_daemon;

struct worker {
	fa_client *c;
	uint64_t seed;
	int proc, thread;
	int ok, failed;
	int dtypes[4]; /* cases seen per dtype, to prove the mix */
};

/* One thread of a client process: its own buffer, REQ_PER_THREAD random cases. */
static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t rng = w->seed;
	fa_buffer *buf = NULL;
	for (int i = 0; i < REQ_PER_THREAD; i++) {
		struct fa_case cs;
		char why[256], desc[256];
		fa_case_random(&cs, &rng, MAX_S, MAX_WORK);
		w->dtypes[cs.dtype]++;
		if (fa_integ_run_case(w->c, &buf, &cs, &rng, NULL, NULL, why, sizeof why)) {
			w->ok++;
		} else {
			w->failed++;
			fa_case_describe(&cs, desc, sizeof desc);
			fprintf(stderr, "client %d.%d request %d: %s\n    case: %s (seed %llu)\n", w->proc,
			        w->thread, i, why, desc, (unsigned long long)w->seed);
		}
	}
	if (buf && fa_buffer_free(buf) != FA_OK)
		w->failed++;
	return NULL;
}

/* A client process: one client, NTHREAD threads sharing it. Exit 0 when all requests passed. */
static int client_process(int proc)
{
	fa_client *c = NULL;
	fa_status st = fa_client_open(&c, g_daemon.url);
	if (st != FA_OK) {
		fprintf(stderr, "client %d: fa_client_open: %s\n", proc, fa_status_name(st));
		return 2;
	}
	fa_client_set_timeout(c, fa_test_ms(60000));
	struct worker w[NTHREAD];
	pthread_t th[NTHREAD];
	memset(w, 0, sizeof w);
	for (int t = 0; t < NTHREAD; t++) {
		w[t].c = c;
		w[t].proc = proc;
		w[t].thread = t;
		w[t].seed = 0x5eed0000u + (uint64_t)proc * 131u + (uint64_t)t * 7u;
		if (pthread_create(&th[t], NULL, worker_main, &w[t]) != 0)
			return 3;
	}
	int failed = 0, ok = 0;
	for (int t = 0; t < NTHREAD; t++) {
		pthread_join(th[t], NULL);
		failed += w[t].failed;
		ok += w[t].ok;
	}
	fa_client_close(c);
	fprintf(stderr, "client %d: %d ok, %d failed\n", proc, ok, failed);
	return failed ? 1 : 0;
}

static int setup(void **state)
{
	(void)state;
	int r = daemon_start(&g_daemon, "--threads", "2", NULL);
	if (r != 0) {
		fprintf(stderr, "daemon_start: %d (status %d)\n", r, g_daemon.status);
		daemon_log_dump(&g_daemon, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return daemon_finish(&g_daemon);
}

/* The test: 4 processes x 4 threads x 10 requests, all in flight together. */
static void test_multi_client_all_results_match_reference(void **state)
{
	(void)state;
	char before[16384], after[16384];
	uint64_t ok0, fwd0, failed0, ok1, fwd1, failed1, v;
	assert_int_equal(fa_integ_stats(g_daemon.url, before, sizeof before), FA_OK);
	assert_true(fa_stats_u64(before, "requests_ok", &ok0));
	assert_true(fa_stats_u64(before, "fwd_total", &fwd0));
	assert_true(fa_stats_u64(before, "requests_failed", &failed0));

	pid_t pids[NPROC];
	for (int p = 0; p < NPROC; p++) {
		fflush(stderr);
		pids[p] = fork();
		assert_true(pids[p] >= 0);
		if (pids[p] == 0)
			_exit(client_process(p));
	}
	int bad = 0;
	for (int p = 0; p < NPROC; p++) {
		int code = fa_test_waitpid(pids[p], fa_test_ms(150000));
		if (code != 0) {
			fprintf(stderr, "client process %d (pid %d) ended with %d\n", p, (int)pids[p],
			        code);
			if (code < 0)
				kill(pids[p], SIGKILL), fa_test_waitpid(pids[p], 5000);
			bad++;
		}
	}
	if (bad)
		daemon_log_dump(&g_daemon, 30);
	assert_int_equal(bad, 0);

	/* Counters: every request succeeded and was computed once. */
	assert_int_equal(fa_integ_stats(g_daemon.url, after, sizeof after), FA_OK);
	assert_true(fa_stats_u64(after, "requests_ok", &ok1));
	assert_true(fa_stats_u64(after, "fwd_total", &fwd1));
	assert_true(fa_stats_u64(after, "requests_failed", &failed1));
	assert_int_equal(fwd1 - fwd0, NPROC * NTHREAD * REQ_PER_THREAD);
	assert_true(ok1 - ok0 >= (uint64_t)NPROC * NTHREAD * REQ_PER_THREAD);
	assert_int_equal(failed1 - failed0, 0);

	/* Every client closed: only the snapshot's own session is left, with no region. */
	bool gone = fa_integ_wait_stat(NULL, g_daemon.url, "regions", 0, fa_test_ms(10000), &v);
	if (!gone)
		fprintf(stderr, "regions still %llu\n", (unsigned long long)v);
	assert_true(gone);
	gone = fa_integ_wait_stat(NULL, g_daemon.url, "sessions", 1, fa_test_ms(10000), &v);
	if (!gone)
		fprintf(stderr, "sessions still %llu\n", (unsigned long long)v);
	assert_true(gone);
	for (int p = 0; p < NPROC; p++)
		assert_int_equal(fa_test_count_shm(pids[p]), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_multi_client_all_results_match_reference),
	};
	if (getenv("FA_TEST_FILTER")) /* run only the tests matching a pattern */
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
