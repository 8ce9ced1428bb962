/* test_fairness.c - round-robin across sessions, end to end on the CPU backend: 8 client
 * processes, each one synchronous request at a time (the pattern that starved one client on the
 * H200: served once in 2 s while the seven others were served 176 times each), all start
 * together and loop for a fixed window. Every client must get a fair share: the least served
 * at least a quarter of the most served (a fair queue gives them equal turns; the bound leaves
 * room for the OS scheduling 8 processes on 2 cores). Every result is checked too.
 */
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"

#define NPROC 8
#define WINDOW_MS 1500

static struct fa_daemon g_daemon;

/* What the clients report, in a MAP_SHARED mapping made before the forks. */
struct board {
	atomic_int ready;
	_Atomic uint64_t go_ms; /* fa_test_now_ms() of the common start; 0: not yet */
	uint64_t count[NPROC];
};

static struct board *g_board;

static const struct fa_case g_case = {
	/* under CPU_MIN_CHUNK_WORK multiply-adds: one piece, so a job leaves the queue whole, as a
	 * GPU job does (a job in pieces is rotated, which kept the old turn order right) */
	.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 96, .Sk = 96, .Hq = 1, .Hkv = 1, .D = 96,
};

/* One client: a checked warm-up, wait for the start, then one request after the other on the
 * same inputs until the window ends (none checked, so the client sends its next request at
 * once), and the last result checked. Exit 0, or 1 after a failure (its line says why). */
static int client_process(int idx)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 0xfa1e0000u + (uint64_t)idx;
	char why[256];

	fa_status st = fa_client_open(&c, g_daemon.url);
	if (st != FA_OK) {
		fprintf(stderr, "client %d: fa_client_open: %s\n", idx, fa_status_name(st));
		return 1;
	}
	fa_client_set_timeout(c, fa_test_ms(60000));
	if (!fa_integ_run_case(c, &buf, &g_case, &rng, NULL, NULL, why, sizeof why)) {
		fprintf(stderr, "client %d, warm-up: %s\n", idx, why);
		return 1;
	}
	atomic_fetch_add(&g_board->ready, 1);
	uint64_t go, deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(60000);
	while ((go = atomic_load(&g_board->go_ms)) == 0 || fa_test_now_ms() < go) {
		if (fa_test_now_ms() > deadline) {
			fprintf(stderr, "client %d: no start\n", idx);
			return 1;
		}
		fa_test_sleep_ms(1);
	}
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_case_layout(&g_case, &l);
	fa_case_args(&g_case, &l, buf, &a);
	uint64_t end = go + WINDOW_MS, n = 0;
	while (fa_test_now_ms() < end) {
		if ((st = fa_attn_fwd(c, &a)) != FA_OK) {
			fprintf(stderr, "client %d, request %llu: %s (%s)\n", idx,
			        (unsigned long long)n, fa_status_name(st), fa_last_error_detail());
			return 1;
		}
		n++;
	}
	if (!fa_case_check(&g_case, &l, fa_buffer_data(buf), NULL, why, sizeof why)) {
		fprintf(stderr, "client %d, the last of %llu requests: %s\n", idx,
		        (unsigned long long)n, why);
		return 1;
	}
	g_board->count[idx] = n;
	fa_buffer_free(buf);
	fa_client_close(c);
	return 0;
}

static int setup(void **state)
{
	(void)state;
	g_board = mmap(NULL, sizeof *g_board, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	               -1, 0);
	if (g_board == MAP_FAILED)
		return -1;
	/* one worker: one request runs while the seven others wait their turn, and each client
	 * sends its next one long before the running one ends */
	int r = daemon_start(&g_daemon, "--threads", "1", NULL);
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
	int r = daemon_finish(&g_daemon);
	munmap(g_board, sizeof *g_board);
	return r;
}

static void test_fairness_synchronous_clients_share_the_workers(void **state)
{
	(void)state;
	pid_t pids[NPROC];

	memset(g_board, 0, sizeof *g_board);
	for (int p = 0; p < NPROC; p++) {
		fflush(stderr);
		pids[p] = fork();
		assert_true(pids[p] >= 0);
		if (pids[p] == 0)
			_exit(client_process(p));
	}
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(60000);
	while (atomic_load(&g_board->ready) < NPROC && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(5);
	bool all_ready = atomic_load(&g_board->ready) == NPROC;
	atomic_store(&g_board->go_ms, fa_test_now_ms() + 50);
	int bad = 0;
	for (int p = 0; p < NPROC; p++) {
		int code = fa_test_waitpid(pids[p], fa_test_ms(120000));
		if (code != 0) {
			fprintf(stderr, "client %d (pid %d) ended with %d\n", p, (int)pids[p], code);
			if (code < 0)
				kill(pids[p], SIGKILL), fa_test_waitpid(pids[p], 5000);
			bad++;
		}
	}
	assert_true(all_ready);
	assert_int_equal(bad, 0);
	uint64_t lo = UINT64_MAX, hi = 0;
	for (int p = 0; p < NPROC; p++) {
		lo = g_board->count[p] < lo ? g_board->count[p] : lo;
		hi = g_board->count[p] > hi ? g_board->count[p] : hi;
	}
	fprintf(stderr, "requests per client in %d ms: %llu..%llu\n", WINDOW_MS,
	        (unsigned long long)lo, (unsigned long long)hi);
	assert_true(hi >= 8); /* enough turns for the bound to mean something */
	if (lo * 4 < hi)
		fail_msg("unfair: one client served %llu times while another was served %llu",
		         (unsigned long long)lo, (unsigned long long)hi);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fairness_synchronous_clients_share_the_workers),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
