/* test_daemon_life.c - the daemon's life cycle as a client and systemd see it: READY=1, STATS,
 * PING, SIGTERM with work in flight, a second daemon on a live socket, socket paths too long,
 * and a client with no daemon to talk to.
 */
#include <ctype.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"
#include "fa_proto.h"

static struct fa_daemon g_d;

static int setup(void **state)
{
	(void)state;
	if (daemon_start(&g_d, NULL) != 0) {
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

/* A path of exactly `len` bytes inside dir: dir + "/" + 'a'... */
static void long_path(char *out, size_t cap, const char *dir, size_t len)
{
	size_t n = (size_t)snprintf(out, cap, "%s/", dir);
	while (n < len && n + 1 < cap)
		out[n++] = 'a';
	out[n] = '\0';
}

/* Lower-case copy, for case-insensitive log checks. */
static bool text_has_ci(const char *text, const char *needle)
{
	size_t tl = strlen(text), nl = strlen(needle);
	for (size_t i = 0; i + nl <= tl; i++) {
		size_t j = 0;
		while (j < nl && tolower((unsigned char)text[i + j]) == tolower((unsigned char)needle[j]))
			j++;
		if (j == nl)
			return true;
	}
	return false;
}

static void test_daemon_life_stats_has_every_key(void **state)
{
	(void)state;
	static const char *const keys[] = {
		"version", "proto", "epoch", "pid", "uptime_s", "backend", "threads", "sessions",
		"sessions_total", "regions", "region_bytes", "requests_total", "requests_ok",
		"requests_failed", "requests_busy", "requests_deduped", "requests_malformed", "inflight",
		"fwd_total", "fwd_compute_us_total"};
	static const char *const sections[] = {"# server", "# clients", "# requests"};
	char text[16384], v[64];
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	assert_int_equal(fa_stats(c, text, sizeof text), FA_OK);
	int missing = 0;
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
		if (!fa_stats_get(text, keys[i], v, sizeof v)) {
			fprintf(stderr, "STATS lacks '%s'\n", keys[i]);
			missing++;
		}
	for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
		if (!strstr(text, sections[i])) {
			fprintf(stderr, "STATS lacks the section '%s'\n", sections[i]);
			missing++;
		}
	if (missing)
		fprintf(stderr, "STATS text:\n%s\n", text);
	assert_int_equal(missing, 0);

	uint64_t pid, sessions, proto;
	assert_true(fa_stats_u64(text, "pid", &pid));
	assert_int_equal(pid, (uint64_t)g_d.pid);
	assert_true(fa_stats_u64(text, "proto", &proto));
	assert_int_equal(proto, FA_PROTO_VERSION);
	assert_true(fa_stats_u64(text, "sessions", &sessions));
	assert_true(sessions >= 1);
	assert_true(fa_stats_get(text, "backend", v, sizeof v));
	assert_true(!strcmp(v, "cpu") || !strcmp(v, "gpu"));
	if (!have_gpu())
		assert_string_equal(v, "cpu");
	/* The epoch: 16 hex digits, the same number the client saw in its replies. */
	assert_true(fa_stats_get(text, "epoch", v, sizeof v));
	assert_int_equal(strlen(v), 16);
	for (int i = 0; i < 16; i++)
		assert_true(isxdigit((unsigned char)v[i]));
	assert_int_equal(strtoull(v, NULL, 16), fa_client_epoch(c));
	fa_client_close(c);
}

static void test_daemon_life_ping_answers(void **state)
{
	(void)state;
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	assert_true(fa_client_epoch(c) != 0);
	for (int i = 0; i < 20; i++)
		assert_int_equal(fa_ping(c), FA_OK);
	/* A plain path works as well as an ipc:// URL. */
	fa_client *c2 = NULL;
	assert_int_equal(fa_client_open(&c2, g_d.sock), FA_OK);
	assert_int_equal(fa_ping(c2), FA_OK);
	assert_int_equal(fa_client_epoch(c2), fa_client_epoch(c));
	fa_client_close(c2);
	fa_client_close(c);
}

/* A second daemon on the socket of a live one refuses to start and leaves the first one serving
 * (its socket file, and new connections: its check must not upset the live daemon). A fresh
 * first daemon each time, as its state before the check matters. */
/* SIGTERM the moment READY=1 arrives: the daemon watches its signals before it says READY, so
 * the stop is graceful (exit 0), never the default action's 143. (Before, the handlers were
 * installed after READY, and a loaded machine hit the gap.) */
static void test_daemon_life_sigterm_right_after_ready_exits_0(void **state)
{
	(void)state;
	for (int round = 0; round < 10; round++) {
		struct fa_daemon d;
		assert_int_equal(daemon_start(&d, NULL), 0);
		int st = daemon_stop(&d);
		if (st != 0) {
			fprintf(stderr, "round %d: exit %d after SIGTERM at READY\n", round, st);
			daemon_log_dump(&d, 20);
		}
		assert_int_equal(st, 0);
		daemon_cleanup(&d);
	}
}

static void test_daemon_life_second_daemon_on_live_socket_refuses(void **state)
{
	(void)state;
	struct fa_daemon d1, d2;
	assert_int_equal(daemon_start(&d1, NULL), 0);
	for (int round = 0; round < 3; round++) {
		int r = daemon_start_at(&d2, d1.sock, NULL);
		if (r != -1) {
			fprintf(stderr, "second daemon: daemon_start_at returned %d, want -1 (it exited)\n",
			        r);
			daemon_log_dump(&d2, 20);
		}
		assert_int_equal(r, -1);
		assert_true(d2.status != 0 && d2.status < 128);
		if (round == 0)
			daemon_log_dump(&d2, 3);
		assert_true(daemon_log_clean(&d2));
		daemon_cleanup(&d2);

		/* The first one still has its socket and takes new connections. */
		struct stat sb;
		assert_int_equal(stat(d1.sock, &sb), 0);
		assert_true(S_ISSOCK(sb.st_mode));
		fa_client *c = NULL;
		fa_status st = fa_client_open(&c, d1.url);
		if (st != FA_OK)
			fprintf(stderr, "round %d: the first daemon no longer takes connections: %s (%s)\n",
			        round, fa_status_name(st), fa_last_error_detail());
		assert_int_equal(st, FA_OK);
		assert_int_equal(fa_ping(c), FA_OK);
		fa_client_close(c);
	}
	assert_int_equal(daemon_stop(&d1), 0);
	assert_true(daemon_log_clean(&d1));
	daemon_cleanup(&d1);
}

static void test_daemon_life_socket_path_of_110_bytes_is_refused(void **state)
{
	(void)state;
	char dir[64], path[200], url[220];
	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);
	long_path(path, sizeof path, dir, 110);
	assert_int_equal(strlen(path), 110);

	/* The daemon: exits non-zero at once, saying why. */
	struct fa_daemon d;
	int r = daemon_start_at(&d, path, NULL);
	assert_int_equal(r, -1);
	assert_true(d.status != 0 && d.status < 128); /* an exit, not an abort */
	char *log = daemon_log_read(&d);
	assert_non_null(log);
	bool says = text_has_ci(log, "long") || strstr(log, "108") || strstr(log, "107");
	if (!says)
		fprintf(stderr, "daemon log does not say the path is too long:\n%s\n", log);
	free(log);
	assert_true(says);
	assert_true(daemon_log_clean(&d));
	daemon_cleanup(&d);

	/* The client: FA_EINVAL with a detail, at once, for a path and for a URL. */
	fa_client *c = NULL;
	uint64_t t0 = fa_test_now_ms();
	assert_int_equal(fa_client_open(&c, path), FA_EINVAL);
	assert_null(c);
	assert_true(fa_last_error_detail()[0] != '\0');
	snprintf(url, sizeof url, "ipc://%s", path);
	assert_int_equal(fa_client_open(&c, url), FA_EINVAL);
	assert_null(c);
	/* 108 bytes: the first length nanomsg would abort on. */
	long_path(path, sizeof path, dir, 108);
	assert_int_equal(fa_client_open(&c, path), FA_EINVAL);
	assert_true(fa_test_now_ms() - t0 < (uint64_t)fa_test_ms(1000));
	fa_test_rmdir(dir);
}

static void test_daemon_life_socket_path_of_107_bytes_works(void **state)
{
	(void)state;
	char dir[64], path[200];
	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);
	long_path(path, sizeof path, dir, 107);
	struct fa_daemon d;
	int r = daemon_start_at(&d, path, NULL);
	if (r != 0)
		daemon_log_dump(&d, 20);
	assert_int_equal(r, 0);
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, path), FA_OK);
	assert_int_equal(fa_ping(c), FA_OK);
	fa_client_close(c);
	assert_int_equal(daemon_stop(&d), 0);
	assert_true(daemon_log_clean(&d));
	daemon_cleanup(&d);
	unlink(path);
	fa_test_rmdir(dir);
}

static void test_daemon_life_client_without_daemon_gets_eunavail(void **state)
{
	(void)state;
	char dir[64], path[96];
	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);

	/* No socket file at all. */
	snprintf(path, sizeof path, "%s/none", dir);
	fa_client *c = NULL;
	uint64_t t0 = fa_test_now_ms();
	fa_status st = fa_client_open(&c, path);
	uint64_t took = fa_test_now_ms() - t0;
	fprintf(stderr, "no socket: %s after %llu ms (%s)\n", fa_status_name(st),
	        (unsigned long long)took, fa_last_error_detail());
	assert_int_equal(st, FA_EUNAVAIL);
	assert_null(c);
	assert_true(took < (uint64_t)fa_test_ms(5000));

	/* A stale socket file: bound once, nobody listening (a daemon that was SIGKILLed). */
	snprintf(path, sizeof path, "%s/stale", dir);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);
	t0 = fa_test_now_ms();
	st = fa_client_open(&c, path);
	took = fa_test_now_ms() - t0;
	fprintf(stderr, "stale socket: %s after %llu ms (%s)\n", fa_status_name(st),
	        (unsigned long long)took, fa_last_error_detail());
	assert_int_equal(st, FA_EUNAVAIL);
	assert_true(took < (uint64_t)fa_test_ms(5000));
	unlink(path);
	fa_test_rmdir(dir);
}

/* A client process sending one slow request; exit 0 = correct result, 10 = FA_ECLOSED. */
static int slow_client(const char *url, int id)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 77u + (uint64_t)id;
	char why[256];
	fa_status st;
	if (fa_client_open(&c, url) != FA_OK)
		return 2;
	fa_client_set_timeout(c, fa_test_ms(60000));
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 640, .Sk = 640, .Hq = 4,
	                     .Hkv = 2, .D = 64, .precision = FA_PREC_IEEE};
	bool ok = fa_integ_run_case(c, &buf, &cs, &rng, &st, NULL, why, sizeof why);
	fprintf(stderr, "slow client %d: %s%s%s\n", id, fa_status_name(st), ok ? "" : ": ",
	        ok ? "" : why);
	/* The daemon is gone or going: free and close must not hang either. */
	fa_buffer_free(buf);
	fa_client_close(c);
	return ok ? 0 : st == FA_ECLOSED ? 10 : 1;
}

static void test_daemon_life_sigterm_answers_requests_in_flight(void **state)
{
	(void)state;
	struct fa_daemon d;
	enum { N = 3 };
	assert_int_equal(daemon_start(&d, "--threads", "1", NULL), 0);
	pid_t pids[N];
	for (int i = 0; i < N; i++) {
		fflush(stderr);
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0)
			_exit(slow_client(d.url, i));
	}
	/* Wait until the daemon holds all of them (the snapshot's own session asks nothing). */
	uint64_t v = 0;
	bool held = fa_integ_wait_stat(NULL, d.url, "inflight", N, fa_test_ms(20000), &v);
	if (!held)
		fprintf(stderr, "inflight reached only %llu\n", (unsigned long long)v);
	assert_true(held);
	assert_int_equal(kill(d.pid, SIGTERM), 0);
	int st = daemon_wait(&d, fa_test_ms(30000));
	int ok = 0, closed = 0, bad = 0;
	for (int i = 0; i < N; i++) {
		int code = fa_test_waitpid(pids[i], fa_test_ms(30000));
		if (code == 0)
			ok++;
		else if (code == 10)
			closed++;
		else {
			fprintf(stderr, "slow client %d ended with %d\n", i, code);
			if (code < 0)
				kill(pids[i], SIGKILL), fa_test_waitpid(pids[i], 5000);
			bad++;
		}
	}
	fprintf(stderr, "SIGTERM with %d in flight: %d answered with results, %d with FA_ECLOSED\n",
	        N, ok, closed);
	if (st != 0)
		daemon_log_dump(&d, 30);
	assert_int_equal(st, 0);
	assert_int_equal(bad, 0);
	assert_true(ok >= 1); /* the one already running finishes */
	assert_true(daemon_log_clean(&d));
	daemon_cleanup(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_daemon_life_stats_has_every_key),
		cmocka_unit_test(test_daemon_life_ping_answers),
		cmocka_unit_test(test_daemon_life_sigterm_right_after_ready_exits_0),
		cmocka_unit_test(test_daemon_life_second_daemon_on_live_socket_refuses),
		cmocka_unit_test(test_daemon_life_socket_path_of_110_bytes_is_refused),
		cmocka_unit_test(test_daemon_life_socket_path_of_107_bytes_works),
		cmocka_unit_test(test_daemon_life_client_without_daemon_gets_eunavail),
		cmocka_unit_test(test_daemon_life_sigterm_answers_requests_in_flight),
	};
	if (getenv("FA_TEST_FILTER")) /* run only the tests matching a pattern */
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
