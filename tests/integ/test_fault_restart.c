/* test_fault_restart.c - a fatal device fault, end to end, on the CPU backend: the test-only
 * switch FA_TEST_FAULT_AFTER=N makes the daemon's Nth forward request fail as if the GPU had
 * reported an illegal address. The daemon answers everything pending, says STOPPING=1, stops
 * feeding the watchdog and exits 70; a supervisor thread here restarts it on the same socket
 * (systemd's Restart=on-failure), and clients recover with fa_client_reconnect() and a new epoch.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <poll.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"

#define CALL_TIMEOUT_MS 3000 /* the clients' bound on every call */
#define EXIT_BOUND_MS 5000   /* fault answered -> daemon exited */
#define RECOVER_BOUND_MS 15000
#define FAULT_EXIT 70
#define SUP_MAX 4

/* ---- the supervisor: restart on a non-zero exit, like systemd's Restart=on-failure --------- */

struct sup {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t thread;
	bool stop;
	struct fa_daemon d[SUP_MAX]; /* d[n - 1] is the current one; the thread owns them */
	int n;
	int exit_status[SUP_MAX];    /* of d[i], once it exited */
	uint64_t exit_ms[SUP_MAX];
	int nexited;
	int restart_failed;          /* daemon_start_at's result when a restart failed, else 0 */
	char sock[FA_TEST_PATH_MAX];
};

static const char *const sup_args[] = {"--backend", "cpu", "--threads", "2", NULL};

/* Watch the current daemon; when it exits non-zero, start a new one on the same socket. */
static void *sup_main(void *arg)
{
	struct sup *s = arg;

	for (;;) {
		pthread_mutex_lock(&s->mu);
		bool stop = s->stop;
		struct fa_daemon *cur = &s->d[s->n - 1];
		pthread_mutex_unlock(&s->mu);
		if (stop)
			break;
		int st = daemon_wait(cur, 20);
		if (st < 0)
			continue;
		pthread_mutex_lock(&s->mu);
		s->exit_status[s->nexited] = st;
		s->exit_ms[s->nexited] = fa_test_now_ms();
		s->nexited++;
		bool again = st != 0 && s->n < SUP_MAX && !s->stop;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		if (!again)
			break;
		int r = daemon_start_argv(&s->d[s->n], s->sock, sup_args);
		pthread_mutex_lock(&s->mu);
		s->n++;
		if (r != 0)
			s->restart_failed = r;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		if (r != 0)
			break;
	}
	return NULL;
}

/* Start the first daemon with FA_TEST_FAULT_AFTER=fault_after (not inherited by restarts), and
 * the supervisor when `watch` (else the caller forks first and calls sup_watch). */
static void sup_start(struct sup *s, int fault_after, bool watch)
{
	char n[32];

	memset(s, 0, sizeof *s);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	snprintf(n, sizeof n, "%d", fault_after);
	setenv("FA_TEST_FAULT_AFTER", n, 1);
	int r = daemon_start_argv(&s->d[0], NULL, sup_args);
	unsetenv("FA_TEST_FAULT_AFTER");
	if (r != 0)
		daemon_log_dump(&s->d[0], 20);
	assert_int_equal(r, 0);
	s->n = 1;
	snprintf(s->sock, sizeof s->sock, "%s", s->d[0].sock);
	assert_true(daemon_log_contains(&s->d[0], "FA_TEST_FAULT_AFTER"));
	if (watch)
		assert_int_equal(pthread_create(&s->thread, NULL, sup_main, s), 0);
}

static void sup_watch(struct sup *s)
{
	assert_int_equal(pthread_create(&s->thread, NULL, sup_main, s), 0);
}

/* Wait until `restarts` daemons after the first are ready (or a restart failed). */
static bool sup_wait_restarts(struct sup *s, int restarts, int timeout_ms)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)timeout_ms;
	bool ok;

	pthread_mutex_lock(&s->mu);
	while (s->n < restarts + 1 && s->restart_failed == 0 && fa_test_now_ms() < deadline) {
		pthread_mutex_unlock(&s->mu);
		fa_test_sleep_ms(10);
		pthread_mutex_lock(&s->mu);
	}
	ok = s->n >= restarts + 1 && s->restart_failed == 0;
	pthread_mutex_unlock(&s->mu);
	return ok;
}

/* Stop the supervisor, stop the current daemon (it must exit 0), check every log, clean up. */
static void sup_finish(struct sup *s)
{
	pthread_mutex_lock(&s->mu);
	s->stop = true;
	pthread_mutex_unlock(&s->mu);
	pthread_join(s->thread, NULL);
	assert_int_equal(s->restart_failed, 0);
	assert_int_equal(daemon_stop(&s->d[s->n - 1]), 0);
	for (int i = 0; i < s->n; i++) {
		assert_true(daemon_log_clean(&s->d[i]));
		daemon_cleanup(&s->d[i]);
	}
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
}

static bool fault_status_expected_later(fa_status st)
{
	return st == FA_ESESSION || st == FA_EUNAVAIL || st == FA_ETIMEDOUT || st == FA_ECLOSED;
}

/* ---- (a) one client: the faulting request, the exit, the restart, the recovery ---------------- */

static void test_fault_restart_client_sees_edevice_then_recovers_on_new_epoch(void **state)
{
	(void)state;
	struct sup s;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 4242;
	char why[256];
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 2, .Sq = 33, .Sk = 80, .Hq = 4, .Hkv = 2,
	                     .D = 64, .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .lse = true};
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_status st = FA_OK;

	sup_start(&s, 3, true);
	assert_int_equal(fa_client_open(&c, s.d[0].url), FA_OK);
	assert_int_equal(fa_client_set_timeout(c, fa_test_ms(CALL_TIMEOUT_MS)), FA_OK);
	uint64_t epoch1 = fa_client_epoch(c);

	/* Requests 1 and 2 are fine; request 3 is the injected fault. */
	int i;
	for (i = 1; i <= 5; i++) {
		if (!fa_integ_run_case(c, &buf, &cs, &rng, &st, NULL, why, sizeof why))
			break;
	}
	fprintf(stderr, "request %d: %s (%s)\n", i, fa_status_name(st), fa_last_error_detail());
	assert_int_equal(i, 3);
	assert_int_equal(st, FA_EDEVICE);
	assert_non_null(strstr(fa_last_error_detail(), "injected fault"));
	assert_non_null(strstr(fa_last_error_detail(), "CUDA error 700"));
	uint64_t fault_ms = fa_test_now_ms();
	void *data = fa_buffer_data(buf);

	/* The daemon exits 70 within the bound; the supervisor brings a new one up. */
	bool restarted = sup_wait_restarts(&s, 1, fa_test_ms(EXIT_BOUND_MS + 20000));
	if (!restarted)
		daemon_log_dump(&s.d[0], 30);
	assert_true(restarted);
	pthread_mutex_lock(&s.mu);
	int exit0 = s.exit_status[0];
	uint64_t exit_after = s.exit_ms[0] - fault_ms;
	pthread_mutex_unlock(&s.mu);
	fprintf(stderr, "daemon exited %d, %llu ms after the fault was answered\n", exit0,
	        (unsigned long long)exit_after);
	assert_int_equal(exit0, FAULT_EXIT);
	assert_true(exit_after <= (uint64_t)fa_test_ms(EXIT_BOUND_MS));
	assert_true(daemon_log_contains(&s.d[0], "the device is lost"));
	assert_true(daemon_log_contains(&s.d[0], "exit 70"));

	/* The next call: an error that says so, within the bound; nothing computed. */
	fa_case_layout(&cs, &l);
	fa_case_fill(&cs, &l, data, &rng);
	fa_case_args(&cs, &l, buf, &a);
	uint64_t t0 = fa_test_now_ms();
	st = fa_attn_fwd(c, &a);
	uint64_t took = fa_test_now_ms() - t0;
	fprintf(stderr, "first call after the restart: %s after %llu ms (%s)\n",
	        fa_status_name(st), (unsigned long long)took, fa_last_error_detail());
	assert_true(st == FA_ESESSION || st == FA_EUNAVAIL || st == FA_ETIMEDOUT);
	assert_true(took <= (uint64_t)fa_test_ms(CALL_TIMEOUT_MS) + 2000);
	assert_true(fa_case_is_poison((char *)data + l.o_off, cs.dtype, 0));

	/* Reconnect: a new epoch, the same buffer, correct results. */
	assert_int_equal(fa_client_reconnect(c), FA_OK);
	assert_true(fa_client_epoch(c) != 0);
	assert_true(fa_client_epoch(c) != epoch1);
	assert_ptr_equal(fa_buffer_data(buf), data);
	for (int k = 0; k < 3; k++) {
		bool ok = fa_integ_run_case(c, &buf, &cs, &rng, &st, NULL, why, sizeof why);
		if (!ok)
			fprintf(stderr, "after the restart, request %d: %s\n", k, why);
		assert_true(ok);
		assert_ptr_equal(fa_buffer_data(buf), data);
	}
	assert_int_equal(fa_buffer_free(buf), FA_OK);
	fa_client_close(c);
	sup_finish(&s);
}

/* ---- (b) three client processes at once -------------------------------------------------------- */

#define NCHILD 3

struct child_report {
	int fault_status;  /* the first non-OK status, -1 none */
	int fwd_before;    /* OK (and checked) before the fault */
	int fwd_after;     /* OK (and checked) after recovery */
	int bad_result;    /* an OK whose result was wrong */
	int reconnected;
	int max_call_ms;
	uint64_t epoch1, epoch2;
	char detail[256];
};

/* One client process: requests until the fault reaches it, then reconnect and 3 more. */
static int child_main(struct child_report *rep, const char *url, uint64_t seed)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = seed;
	char why[256];
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 48, .Sk = 96, .Hq = 4, .Hkv = 4,
	                     .D = 32, .mask = FA_MASK_NONE, .lse = false};
	fa_status st = FA_OK;

	rep->fault_status = -1;
	if (fa_client_open(&c, url) != FA_OK)
		return 10;
	fa_client_set_timeout(c, fa_test_ms(CALL_TIMEOUT_MS));
	rep->epoch1 = fa_client_epoch(c);
	for (int i = 0; i < 2000; i++) {
		uint64_t t0 = fa_test_now_ms();
		bool ok = fa_integ_run_case(c, &buf, &cs, &rng, &st, NULL, why, sizeof why);
		int ms = (int)(fa_test_now_ms() - t0);
		if (ms > rep->max_call_ms)
			rep->max_call_ms = ms;
		if (ok) {
			rep->fwd_before++;
			continue;
		}
		if (st == FA_OK) {
			rep->bad_result++;
			snprintf(rep->detail, sizeof rep->detail, "%s", why);
			return 11;
		}
		rep->fault_status = st;
		snprintf(rep->detail, sizeof rep->detail, "%s", fa_last_error_detail());
		break;
	}
	if (rep->fault_status < 0)
		return 12;
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(RECOVER_BOUND_MS);
	while (fa_test_now_ms() < deadline) {
		st = fa_client_reconnect(c);
		if (st == FA_OK && fa_client_epoch(c) != rep->epoch1)
			break;
		fa_test_sleep_ms(20);
	}
	rep->epoch2 = fa_client_epoch(c);
	if (st != FA_OK || rep->epoch2 == rep->epoch1)
		return 13;
	rep->reconnected = 1;
	void *data = fa_buffer_data(buf);
	for (int k = 0; k < 3; k++) {
		if (!fa_integ_run_case(c, &buf, &cs, &rng, &st, NULL, why, sizeof why)) {
			snprintf(rep->detail, sizeof rep->detail, "after recovery: %.200s", why);
			return 14;
		}
		if (fa_buffer_data(buf) != data)
			return 15;
		rep->fwd_after++;
	}
	fa_buffer_free(buf);
	fa_client_close(c);
	return 0;
}

static void test_fault_restart_three_clients_all_answered_and_all_recover(void **state)
{
	(void)state;
	struct sup s;
	pid_t pids[NCHILD];
	struct child_report *reps = mmap(NULL, sizeof(*reps) * NCHILD, PROT_READ | PROT_WRITE,
	                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(reps != MAP_FAILED);
	memset(reps, 0, sizeof(*reps) * NCHILD);
	/* Enough requests before the fault that all three clients are busy when it hits. */
	sup_start(&s, 12, false);
	for (int p = 0; p < NCHILD; p++) {
		pids[p] = fork();
		assert_true(pids[p] >= 0);
		if (pids[p] == 0)
			_exit(child_main(&reps[p], s.d[0].url, 1000 + (uint64_t)p));
	}
	sup_watch(&s);
	int fails = 0, edevice = 0;
	for (int p = 0; p < NCHILD; p++) {
		int code = fa_test_waitpid(pids[p], fa_test_ms(RECOVER_BOUND_MS + 10000));
		if (code < 0) {
			kill(pids[p], SIGKILL);
			fa_test_waitpid(pids[p], 5000);
		}
		struct child_report *r = &reps[p];
		fprintf(stderr,
		        "client %d: exit %d, %d ok before, fault %s (%s), longest call %d ms, "
		        "reconnected %d, %d ok after\n",
		        p, code, r->fwd_before,
		        r->fault_status >= 0 ? fa_status_name((fa_status)r->fault_status) : "none",
		        r->detail, r->max_call_ms, r->reconnected, r->fwd_after);
		if (code != 0)
			fails++;
		if (r->fault_status == FA_EDEVICE)
			edevice++;
		else if (r->fault_status >= 0)
			assert_true(fault_status_expected_later((fa_status)r->fault_status));
		assert_true(r->max_call_ms <= fa_test_ms(CALL_TIMEOUT_MS) + 2000);
		assert_int_equal(r->bad_result, 0);
	}
	if (fails > 0)
		for (int i = 0; i < s.n; i++)
			daemon_log_dump(&s.d[i], 30);
	assert_int_equal(fails, 0);
	assert_true(edevice >= 1); /* at least the faulting request's client */
	pthread_mutex_lock(&s.mu);
	int restarts = s.n - 1, exit0 = s.exit_status[0];
	pthread_mutex_unlock(&s.mu);
	assert_int_equal(restarts, 1);
	assert_int_equal(exit0, FAULT_EXIT);
	munmap(reps, sizeof(*reps) * NCHILD);
	sup_finish(&s);
}

/* ---- (c) the watchdog starves after the fault, STOPPING=1 arrives ------------------------------ */

struct bg_call {
	fa_client *c;
	fa_attn_fwd_args a;
	fa_status st;
	uint64_t took_ms;
	char detail[256];
};

static void *bg_call_main(void *arg)
{
	struct bg_call *b = arg;
	uint64_t t0 = fa_test_now_ms();
	b->st = fa_attn_fwd(b->c, &b->a);
	b->took_ms = fa_test_now_ms() - t0;
	snprintf(b->detail, sizeof b->detail, "%s", fa_last_error_detail());
	return NULL;
}

/* Reads the daemon's notify datagrams all the time, as systemd does: the daemon's sd_notify is a
 * blocking send, so a reader that pauses lets the queue fill and stalls the daemon's loop. */
struct notes {
	pthread_mutex_t mu;
	pthread_t thread;
	int fd;
	bool stop;
	size_t len;
	char text[65536];
};

static void *notes_main(void *arg)
{
	struct notes *n = arg;
	char buf[4096];

	for (;;) {
		pthread_mutex_lock(&n->mu);
		bool stop = n->stop;
		pthread_mutex_unlock(&n->mu);
		if (stop)
			return NULL;
		struct pollfd pfd = {n->fd, POLLIN, 0};
		if (poll(&pfd, 1, 20) <= 0)
			continue;
		ssize_t r;
		while ((r = recv(n->fd, buf, sizeof buf - 1, MSG_DONTWAIT)) > 0) {
			buf[r] = '\0';
			pthread_mutex_lock(&n->mu);
			if (n->len < sizeof n->text)
				n->len += (size_t)snprintf(n->text + n->len, sizeof n->text - n->len,
				                           "%s\n", buf);
			if (n->len > sizeof n->text)
				n->len = sizeof n->text;
			pthread_mutex_unlock(&n->mu);
		}
	}
}

/* A copy of what arrived so far into out (cap bytes); returns its length. */
static size_t notes_copy(struct notes *n, char *out, size_t cap)
{
	pthread_mutex_lock(&n->mu);
	size_t len = n->len < cap - 1 ? n->len : cap - 1;
	memcpy(out, n->text, len);
	out[len] = '\0';
	pthread_mutex_unlock(&n->mu);
	return len;
}

/* Wait until `needle` arrived, bounded. */
static bool notes_wait(struct notes *n, const char *needle, int timeout_ms, char *out, size_t cap)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		notes_copy(n, out, cap);
		if (strstr(out, needle) != NULL)
			return true;
		if (fa_test_now_ms() >= deadline)
			return false;
		fa_test_sleep_ms(10);
	}
}

static void test_fault_restart_watchdog_starves_after_fault_and_stopping_is_sent(void **state)
{
	(void)state;
	struct fa_daemon d;
	static char notes[65536];
	static struct notes nt;
	fa_client *c1 = NULL, *c2 = NULL;
	fa_buffer *big = NULL, *small = NULL;
	uint64_t rng = 77;
	struct fa_case bigc = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 2048, .Sk = 2048, .Hq = 8,
	                       .Hkv = 8, .D = 64, .mask = FA_MASK_NONE};
	struct fa_case smallc = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 8, .Sk = 8, .Hq = 1,
	                         .Hkv = 1, .D = 8, .mask = FA_MASK_NONE};
	struct fa_case_layout bl, sl;
	struct bg_call bg;
	fa_attn_fwd_args sa;

	/* Feed every 50 ms; request 2 (the small one, while the big one runs) faults. */
	setenv("WATCHDOG_USEC", "100000", 1);
	unsetenv("WATCHDOG_PID");
	setenv("FA_TEST_FAULT_AFTER", "2", 1);
	int r = daemon_start(&d, "--backend", "cpu", "--threads", "2", NULL);
	unsetenv("FA_TEST_FAULT_AFTER");
	unsetenv("WATCHDOG_USEC");
	assert_int_equal(r, 0);
	memset(&nt, 0, sizeof nt);
	pthread_mutex_init(&nt.mu, NULL);
	nt.fd = d.notify_fd;
	assert_int_equal(pthread_create(&nt.thread, NULL, notes_main, &nt), 0);
	/* fed while healthy */
	assert_true(notes_wait(&nt, "WATCHDOG=1", fa_test_ms(2000), notes, sizeof notes));

	assert_int_equal(fa_client_open(&c1, d.url), FA_OK);
	assert_int_equal(fa_client_open(&c2, d.url), FA_OK);
	fa_client_set_timeout(c1, fa_test_ms(30000));
	fa_client_set_timeout(c2, fa_test_ms(CALL_TIMEOUT_MS));
	fa_case_layout(&bigc, &bl);
	fa_case_layout(&smallc, &sl);
	assert_int_equal(fa_buffer_alloc_host(c1, bl.total, &big), FA_OK);
	assert_int_equal(fa_buffer_alloc_host(c2, sl.total, &small), FA_OK);
	fa_case_fill(&bigc, &bl, fa_buffer_data(big), &rng);
	fa_case_fill(&smallc, &sl, fa_buffer_data(small), &rng);
	memset(&bg, 0, sizeof bg);
	bg.c = c1;
	fa_case_args(&bigc, &bl, big, &bg.a);
	fa_case_args(&smallc, &sl, small, &sa);

	/* Request 1, long, running; then request 2 faults. */
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, bg_call_main, &bg), 0);
	uint64_t last = 0;
	bool running = fa_integ_wait_stat(c2, NULL, "fwd_running", 1, fa_test_ms(5000), &last);
	fa_status st = fa_attn_fwd(c2, &sa);
	fprintf(stderr, "faulting request: %s (%s); big one was running: %d\n", fa_status_name(st),
	        fa_last_error_detail(), running);
	assert_int_equal(st, FA_EDEVICE);
	assert_non_null(strstr(fa_last_error_detail(), "injected fault"));
	size_t mark = notes_copy(&nt, notes, sizeof notes); /* before we saw the fault answered */

	/* The running one is answered FA_EDEVICE when it finishes; then the daemon exits 70. */
	pthread_join(t, NULL);
	fprintf(stderr, "running request: %s after %llu ms (%s)\n", fa_status_name(bg.st),
	        (unsigned long long)bg.took_ms, bg.detail);
	if (running)
		assert_int_equal(bg.st, FA_EDEVICE);
	else
		assert_true(bg.st == FA_EDEVICE || bg.st == FA_OK);
	int code = daemon_wait(&d, fa_test_ms(EXIT_BOUND_MS));
	if (code != FAULT_EXIT)
		daemon_log_dump(&d, 30);
	assert_int_equal(code, FAULT_EXIT);
	fa_test_sleep_ms(50); /* the reader's last poll: the daemon is gone, nothing more comes */
	pthread_mutex_lock(&nt.mu);
	nt.stop = true;
	pthread_mutex_unlock(&nt.mu);
	pthread_join(nt.thread, NULL);
	pthread_mutex_destroy(&nt.mu);
	notes_copy(&nt, notes, sizeof notes);

	/* STOPPING=1 names the fault, and no WATCHDOG=1 follows it. */
	char *stopping = strstr(notes, "STOPPING=1");
	assert_non_null(stopping);
	assert_non_null(strstr(stopping, "STATUS=device fault: injected fault"));
	assert_null(strstr(stopping, "WATCHDOG=1"));
	assert_true((size_t)(stopping - notes) <= mark); /* sent before the faulting reply */
	if (running) /* it stayed up a while after the fault: the watchdog ticked and starved */
		assert_true(daemon_log_contains(&d, "not feeding systemd's watchdog"));
	assert_true(daemon_log_contains(&d, "exit 70"));

	/* Nobody listens any more: keep the goodbyes short. */
	fa_client_set_timeout(c1, 200);
	fa_client_set_timeout(c2, 200);
	fa_buffer_free(big);
	fa_buffer_free(small);
	fa_client_close(c1);
	fa_client_close(c2);
	assert_true(daemon_log_clean(&d));
	daemon_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fault_restart_client_sees_edevice_then_recovers_on_new_epoch),
		cmocka_unit_test(test_fault_restart_three_clients_all_answered_and_all_recover),
		cmocka_unit_test(test_fault_restart_watchdog_starves_after_fault_and_stopping_is_sent),
	};
	if (getenv("FA_TEST_FILTER")) /* run only the tests matching a pattern */
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
