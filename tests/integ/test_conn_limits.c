/* test_conn_limits.c - one local user cannot lock the others out with connections (issue 14,
 * item 1), on the real daemon with real processes: a connection without a session is closed when
 * idle and one with a session is not; a half-sent message is closed after its deadline while a
 * healthy client is served; a uid at its cap does not stop another user's client; the soft file
 * limit is raised to fit the caps, and a hard limit too low for them lowers the caps.
 * Each test starts its own daemon with short deadlines; every wait is bounded.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"
#include "fa_raw.h"

#define OTHER_UID 65534
#define MAX_FDS 512

static struct fa_daemon g_d;
static int g_fds[MAX_FDS];
static int g_nfds;

static int teardown(void **state)
{
	(void)state;
	for (int i = 0; i < g_nfds; i++)
		close(g_fds[i]);
	g_nfds = 0;
	if (g_d.pid == 0 && !g_d.exited)
		return 0; /* skipped before its daemon started */
	int rc = daemon_finish(&g_d);
	memset(&g_d, 0, sizeof g_d);
	return rc;
}

static void start(const char *const *args)
{
	memset(&g_d, 0, sizeof g_d);
	if (daemon_start_argv(&g_d, NULL, args) != 0) {
		daemon_log_dump(&g_d, 40);
		fail_msg("the daemon did not start");
	}
}

/* A raw connection through the SP handshake: the daemon's 8 bytes came back. -1 when the daemon
 * closed it instead (refused) or nothing came within timeout_ms. */
static int sp_connect(int timeout_ms)
{
	unsigned char sp[8], got[8];
	int fd = fa_raw_unix_connect(g_d.sock);
	if (fd < 0)
		return -1;
	fa_raw_sp_header(sp, 0x30);
	fa_raw_unix_send(fd, sp, 8);
	if (fa_test_read_full(fd, got, 8, timeout_ms) != 0 || got[1] != 'S') {
		close(fd);
		return -1;
	}
	return fd;
}

/* Wait until the daemon closes fd (EOF or reset), bounded. Returns the ms it took, -1 when fd
 * was still open at the deadline. Bytes that arrive meanwhile are discarded. */
static int wait_closed(int fd, int timeout_ms)
{
	uint64_t t0 = fa_test_now_ms(), end = t0 + (uint64_t)timeout_ms;
	char buf[256];

	for (uint64_t now = t0; now < end; now = fa_test_now_ms()) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, (int)(end - now)) <= 0)
			continue;
		ssize_t n = read(fd, buf, sizeof buf);
		if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
			return (int)(fa_test_now_ms() - t0);
	}
	return -1;
}

/* A session on a cooked REQ socket, and STATS values through it. */
struct sess {
	int s;
	uint64_t sid, seq;
};

static void sess_open(struct sess *x)
{
	struct fa_proto_rep rep;
	x->seq = 1;
	x->s = fa_raw_open(g_d.url, fa_test_ms(10000));
	assert_true(x->s >= 0);
	x->sid = fa_raw_hello(x->s, x->seq++, &rep);
	assert_true(x->sid != 0);
}

static uint64_t sess_stat(struct sess *x, const char *key)
{
	static struct fa_proto_rep rep;
	uint64_t v = UINT64_MAX;
	assert_int_equal(fa_raw_simple(x->s, FA_OP_STATS, x->sid, x->seq++, &rep), FA_OK);
	if (!fa_stats_u64(rep.u.stats.text, key, &v))
		fail_msg("STATS has no %s", key);
	return v;
}

static void sess_ping(struct sess *x)
{
	struct fa_proto_rep rep;
	assert_int_equal(fa_raw_simple(x->s, FA_OP_PING, x->sid, x->seq++, &rep), FA_OK);
}

static void test_conn_idle_connection_without_a_session_is_closed_and_a_session_is_not(
    void **state)
{
	(void)state;
	static const char *const args[] = {"--threads", "1", "--idle-timeout-ms", "300", "-v",
	                                   NULL};
	struct sess x, y;
	struct fa_proto_rep rep;

	start(args);
	sess_open(&x);
	int fd = sp_connect(fa_test_ms(5000));
	assert_true(fd >= 0);
	int ms = wait_closed(fd, fa_test_ms(5000));
	close(fd);
	assert_true(ms >= 250); /* the deadline, not at once */
	assert_int_equal(sess_stat(&x, "connections_closed_idle"), 1);

	/* The session's connection stays however long it is silent: three deadlines' worth is the
	 * bounded wait for something that must not happen. */
	fa_test_sleep_ms(900);
	assert_int_equal(sess_stat(&x, "connections_closed_idle"), 1);
	sess_ping(&x);

	/* After BYE no session holds the connection: it is timed out again (nanomsg reconnects in
	 * the background; the count only grows). */
	sess_open(&y);
	assert_int_equal(fa_raw_simple(x.s, FA_OP_BYE, x.sid, x.seq++, &rep), FA_OK);
	uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(5000);
	while (sess_stat(&y, "connections_closed_idle") < 2 && fa_test_now_ms() < end)
		fa_test_sleep_ms(20);
	assert_true(sess_stat(&y, "connections_closed_idle") >= 2);
	assert_true(daemon_log_contains(&g_d, "no session and no message for 300 ms"));
	nn_close(x.s);
	nn_close(y.s);
}

static void test_conn_half_sent_message_is_closed_while_a_healthy_client_is_served(void **state)
{
	(void)state;
	static const char *const args[] = {"--threads", "1", "--frame-timeout-ms", "400", "-v",
	                                   NULL};
	unsigned char fr[9], part[10] = {0x80};
	struct sess x;

	start(args);
	sess_open(&x);
	int fd = sp_connect(fa_test_ms(5000));
	assert_true(fd >= 0);
	fa_raw_frame_header(fr, 1, 100);
	fa_raw_unix_send(fd, fr, sizeof fr);
	fa_raw_unix_send(fd, part, sizeof part);
	uint64_t t0 = fa_test_now_ms();
	unsigned pings = 0;
	int ms = -1;
	while (ms < 0 && fa_test_now_ms() - t0 < (uint64_t)fa_test_ms(5000)) {
		sess_ping(&x); /* served all along */
		pings++;
		ms = wait_closed(fd, 20);
	}
	close(fd);
	assert_true(ms >= 0);
	assert_true(fa_test_now_ms() - t0 >= 350);
	assert_true(pings >= 2);
	assert_int_equal(sess_stat(&x, "connections_closed_frame"), 1);
	assert_true(daemon_log_contains(&g_d, "a message not whole 400 ms after it began"));
	nn_close(x.s);
}

/* The other user's client (exec'd fresh by the test below): a session and a PING. */
static int other_user_main(const char *url)
{
	struct fa_proto_rep rep;
	if (setgid(OTHER_UID) != 0 || setuid(OTHER_UID) != 0) {
		perror("other user: setuid");
		return 10;
	}
	int s = fa_raw_open(url, fa_test_ms(10000));
	uint64_t sid = s >= 0 ? fa_raw_hello(s, 1, &rep) : 0;
	if (sid == 0) {
		fprintf(stderr, "other user: no session as uid %d\n", OTHER_UID);
		return 11;
	}
	int st = fa_raw_simple(s, FA_OP_PING, sid, 2, &rep);
	fprintf(stderr, "other user: PING %s\n", st >= 0 ? fa_status_name(st) : "no reply");
	nn_close(s);
	return st == FA_OK ? 0 : 12;
}

static void test_conn_one_uid_at_its_cap_does_not_lock_out_another_user(void **state)
{
	(void)state;
	static const char *const args[] = {"--threads", "1", "--max-connections", "100",
	                                   "--max-connections-per-uid", "20",
	                                   "--reserved-connections", "4", NULL};
	struct sess x;

	start(args);
	sess_open(&x);
	uint64_t held = sess_stat(&x, "connections_top_uid_held");
	assert_true(held >= 1 && held < 20);
	for (uint64_t i = held; i < 20; i++) {
		int fd = sp_connect(fa_test_ms(5000));
		assert_true(fd >= 0);
		g_fds[g_nfds++] = fd;
	}
	/* One more of this uid is closed at accept, before any handshake. */
	int fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	assert_true(wait_closed(fd, fa_test_ms(5000)) >= 0);
	close(fd);
	assert_int_equal(sess_stat(&x, "connections_top_uid_held"), 20);
	assert_int_equal(sess_stat(&x, "connections_top_uid"), geteuid());
	assert_true(sess_stat(&x, "connections_refused_uid") >= 1);
	assert_int_equal(sess_stat(&x, "connections_max_per_uid"), 20);
	assert_true(daemon_log_contains(&g_d, "the per-uid limit"));
	sess_ping(&x); /* the connections this uid already has keep working */

	if (geteuid() != 0) {
		fprintf(stderr, "the other user's client needs root (to become uid %d): skipped\n",
		        OTHER_UID);
		nn_close(x.s);
		skip();
	}
	assert_int_equal(daemon_run_self_for_another_user(&g_d, "test_conn_limits", "--other-user",
	                                                  20000), 0);
	assert_int_equal(sess_stat(&x, "connections_top_uid_held"), 20);
	nn_close(x.s);
}

/* The daemon raises a lowered soft limit to what --max-connections needs, and serves more
 * connections than the old soft limit allowed. */
static void test_conn_soft_file_limit_is_raised_to_fit_the_caps(void **state)
{
	(void)state;
	static const char *const args[] = {"--threads", "1", "--max-connections", "400",
	                                   "--max-connections-per-uid", "400", NULL};
	struct rlimit saved, low;
	struct sess x;

	assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
	if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 1000) {
		fprintf(stderr, "the hard file limit is %llu: skipped\n",
		        (unsigned long long)saved.rlim_max);
		skip();
	}
	low = saved;
	low.rlim_cur = 128; /* the daemon inherits it */
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
	memset(&g_d, 0, sizeof g_d);
	int rc = daemon_start_argv(&g_d, NULL, args);
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
	if (rc != 0) {
		daemon_log_dump(&g_d, 40);
		fail_msg("the daemon did not start");
	}
	assert_true(daemon_log_contains(&g_d, "raised the soft file limit from 128 to 912"));
	sess_open(&x);
	assert_int_equal(sess_stat(&x, "file_limit"), 912);
	for (int i = 0; i < 200; i++) {
		int fd = sp_connect(fa_test_ms(5000));
		if (fd < 0)
			fail_msg("connection %d was refused under the raised limit", i);
		g_fds[g_nfds++] = fd;
	}
	sess_ping(&x);
	assert_true(sess_stat(&x, "connections_open") >= 201);
	nn_close(x.s);
}

/* fa-daemon in a child whose file limits (soft and hard) are `nofile`, on dir/s, its log in
 * dir/log. The test process cannot lower its own hard limit and raise it back (that needs
 * CAP_SYS_RESOURCE), so the child lowers its own before the exec. */
static pid_t spawn_limited(const char *dir, rlim_t nofile)
{
	char sock[128], log[128];
	snprintf(sock, sizeof sock, "%s/s", dir);
	snprintf(log, sizeof log, "%s/log", dir);
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	struct rlimit rl = {nofile, nofile};
	int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || dup2(fd, 2) < 0 || dup2(fd, 1) < 0 || setrlimit(RLIMIT_NOFILE, &rl) != 0)
		_exit(120);
	char bin[256];
	snprintf(bin, sizeof bin, "%s/fa-daemon", fa_test_build_dir());
	execl(bin, bin, "--socket", sock, "--backend", "cpu", "--threads", "1", (char *)NULL);
	_exit(121);
}

/* The child's log contains needle, within timeout_ms (false also when the child exited first
 * without writing it; *status is then its exit code). */
static bool log_wait(const char *dir, pid_t pid, const char *needle, int timeout_ms, int *status)
{
	char path[128], buf[8192];
	uint64_t end = fa_test_now_ms() + (uint64_t)timeout_ms;
	bool exited = false;
	snprintf(path, sizeof path, "%s/log", dir);
	for (;;) {
		FILE *f = fopen(path, "r");
		size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
		if (f)
			fclose(f);
		buf[n] = '\0';
		if (strstr(buf, needle) != NULL)
			return true;
		if (exited || fa_test_now_ms() >= end)
			return false;
		int st = fa_test_waitpid(pid, 10);
		if (st >= 0) {
			*status = st;
			exited = true; /* one more look at the log */
		}
	}
}

/* A hard limit below what the caps need: the daemon lowers them to fit and says so; one that
 * leaves fewer than 64 connections stops it from starting. */
static void test_conn_low_hard_file_limit_lowers_the_caps(void **state)
{
	(void)state;
	char dir[64], url[160];
	struct sess x;
	int status = -1;

	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);
	pid_t pid = spawn_limited(dir, 600);
	assert_true(pid > 0);
	bool ready = log_wait(dir, pid, "server: ready on", fa_test_ms(20000), &status);
	if (!ready) {
		kill(pid, SIGKILL);
		fa_test_waitpid(pid, 5000);
		fail_msg("the daemon under a hard limit of 600 did not start (status %d)", status);
	}
	assert_true(log_wait(dir, pid, "serving at most 88 connections (88 per uid, 32 reserved)",
	                     0, &status));
	snprintf(url, sizeof url, "ipc://%s/s", dir);
	x.seq = 1;
	x.s = fa_raw_open(url, fa_test_ms(10000));
	assert_true(x.s >= 0);
	struct fa_proto_rep rep;
	x.sid = fa_raw_hello(x.s, x.seq++, &rep);
	assert_true(x.sid != 0);
	assert_int_equal(sess_stat(&x, "connections_max"), 88);
	assert_int_equal(sess_stat(&x, "file_limit"), 600);
	nn_close(x.s);
	kill(pid, SIGTERM);
	assert_int_equal(fa_test_waitpid(pid, fa_test_ms(20000)), 0);

	pid = spawn_limited(dir, 300);
	assert_true(pid > 0);
	assert_true(log_wait(dir, pid, "fewer than 64", fa_test_ms(20000), &status));
	if (status < 0)
		status = fa_test_waitpid(pid, fa_test_ms(20000));
	assert_int_equal(status, 1);
	fa_test_rmdir(dir);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--other-user") == 0)
		return other_user_main(argv[2]);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(
		    test_conn_idle_connection_without_a_session_is_closed_and_a_session_is_not,
		    teardown),
		cmocka_unit_test_teardown(
		    test_conn_half_sent_message_is_closed_while_a_healthy_client_is_served, teardown),
		cmocka_unit_test_teardown(test_conn_one_uid_at_its_cap_does_not_lock_out_another_user,
		                          teardown),
		cmocka_unit_test_teardown(test_conn_soft_file_limit_is_raised_to_fit_the_caps,
		                          teardown),
		cmocka_unit_test_teardown(test_conn_low_hard_file_limit_lowers_the_caps, teardown),
	};
	if (getenv("FA_TEST_FILTER"))
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
