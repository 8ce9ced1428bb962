/* test_clients.c - CLIENTS through a real daemon: several client processes with different
 * numbers of buffers are listed once each, with the kernel's pid, the command, regions, bytes,
 * requests done; `fa-ctl clients --json` prints the same as JSON (parsed by python3 where
 * installed); a client of another uid sees only its own session, root sees every one; more
 * sessions than one reply holds (128) come back whole through the paging.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fa_integ.h"
#include "fa_proto.h"
#include "fa_raw.h"

#define NCHILD 3
#define BUF_BYTES 65536
#define OTHER_UID 65534

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

/* A child: open a client, register i + 1 host buffers, ping twice, say ready, wait for the
 * parent to close `go`, close. */
static void child_main(int i, int ready, int go)
{
	fa_client *c = NULL;
	fa_buffer *b[NCHILD];
	char x = 'r';
	if (fa_client_open(&c, g_d.url) != FA_OK)
		_exit(2);
	for (int k = 0; k <= i; k++)
		if (fa_buffer_alloc_host(c, BUF_BYTES, &b[k]) != FA_OK)
			_exit(3);
	if (fa_ping(c) != FA_OK || fa_ping(c) != FA_OK)
		_exit(4);
	if (write(ready, &x, 1) != 1)
		_exit(5);
	(void)!read(go, &x, 1); /* EOF when the parent is done looking */
	for (int k = 0; k <= i; k++)
		fa_buffer_free(b[k]);
	fa_client_close(c);
	_exit(0);
}

/* The entry of pid in v, or NULL. */
static const fa_client_info *find_pid(const fa_client_info *v, size_t n, pid_t pid)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].pid == (uint32_t)pid)
			return &v[i];
	return NULL;
}

static void test_clients_lists_each_process_once_with_its_buffers(void **state)
{
	(void)state;
	int ready[2], go[2];
	pid_t kids[NCHILD];
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	for (int i = 0; i < NCHILD; i++) {
		kids[i] = fork();
		assert_true(kids[i] >= 0);
		if (kids[i] == 0) {
			close(ready[0]);
			close(go[1]);
			child_main(i, ready[1], go[0]);
		}
	}
	close(ready[1]);
	close(go[0]);
	for (int i = 0; i < NCHILD; i++) {
		char x;
		assert_int_equal(fa_test_read_full(ready[0], &x, 1, fa_test_ms(20000)), 0);
	}

	/* The children hold their sessions: list them through the API. */
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	fa_client_info v[16];
	size_t n = 0;
	assert_int_equal(fa_clients(c, v, 16, &n), FA_OK);
	assert_int_equal(n, NCHILD + 1); /* and this one */
	for (size_t i = 1; i < n; i++)
		assert_true(v[i - 1].session < v[i].session);
	for (int i = 0; i < NCHILD; i++) {
		const fa_client_info *e = find_pid(v, n, kids[i]);
		assert_non_null(e);
		assert_int_equal(e->pid_claimed, e->pid);
		assert_int_equal(e->uid, getuid());
		assert_string_equal(e->command, "test_clients");
		assert_int_equal(e->regions, i + 1);
		assert_int_equal(e->bytes, (uint64_t)(i + 1) * BUF_BYTES);
		assert_int_equal(e->inflight, 0);
		assert_true(e->done >= (uint64_t)(1 + (i + 1) + 2)); /* HELLO, REGISTERs, PINGs */
		assert_true(e->since_ms > UINT64_C(1600000000000));
	}
	/* A buffer too small for one entry: the count still says how many there are. */
	assert_int_equal(fa_clients(c, v, 1, &n), FA_OK);
	assert_int_equal(n, NCHILD + 1);
	assert_int_equal(fa_clients(c, NULL, 0, &n), FA_OK);
	assert_int_equal(n, NCHILD + 1);
	assert_int_equal(fa_clients(c, NULL, 1, &n), FA_EINVAL);
	fa_client_close(c);

	/* fa-ctl clients --json: the same sessions as JSON. */
	char out[256], cmd[1024];
	snprintf(out, sizeof out, "%s/clients.json", g_d.dir);
	snprintf(cmd, sizeof cmd, "'%s/fa-ctl' --socket '%s' clients --json > '%s'",
	         fa_test_build_dir(), g_d.sock, out);
	assert_int_equal(system(cmd), 0);
	if (system("python3 -c 'import json' 2>/dev/null") == 0) {
		snprintf(cmd, sizeof cmd,
		         "python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); "
		         "p={e[\"pid\"]:e for e in v}; "
		         "ok=len(v)==%d and all(p[int(a)][\"regions\"]==i+1 and "
		         "p[int(a)][\"bytes\"]==(i+1)*%d and p[int(a)][\"command\"]==\"test_clients\" "
		         "and len(p[int(a)][\"session\"])==16 for i,a in enumerate(sys.argv[2:])); "
		         "sys.exit(0 if ok else 1)' '%s' %d %d %d",
		         NCHILD + 1, BUF_BYTES, out, (int)kids[0], (int)kids[1], (int)kids[2]);
		assert_int_equal(system(cmd), 0);
	} else {
		print_message("  python3 is not installed: the JSON is checked by substring only\n");
	}
	snprintf(cmd, sizeof cmd, "grep -q '\"pid\": %d,' '%s'", (int)kids[2], out);
	assert_int_equal(system(cmd), 0);
	/* The text form: a header and one line per session. */
	snprintf(cmd, sizeof cmd, "'%s/fa-ctl' --socket '%s' clients | grep -c test_clients | grep -qx %d",
	         fa_test_build_dir(), g_d.sock, NCHILD);
	assert_int_equal(system(cmd), 0);

	close(go[1]);
	for (int i = 0; i < NCHILD; i++)
		assert_int_equal(fa_test_waitpid(kids[i], fa_test_ms(20000)), 0);
	close(ready[0]);
}

/* The other user's side (exec'd fresh as `test_clients --other URL`): it sees only its own
 * session, though root's are open. */
static int other_main(const char *url)
{
	if (setgid(OTHER_UID) != 0 || setuid(OTHER_UID) != 0)
		return 10;
	fa_client *c = NULL;
	if (fa_client_open(&c, url) != FA_OK) {
		fprintf(stderr, "other: open: %s\n", fa_last_error_detail());
		return 11;
	}
	fa_client_info v[8];
	size_t n = 0;
	fa_status st = fa_clients(c, v, 8, &n);
	fa_client_close(c);
	fprintf(stderr, "other: %s, %zu sessions\n", fa_status_name(st), n);
	if (st != FA_OK || n != 1)
		return 12;
	return v[0].uid == OTHER_UID && v[0].pid == (uint32_t)getpid() ? 0 : 13;
}

static void test_clients_another_user_sees_only_their_own(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		print_message("  skipped: needs root to act as another user\n");
		skip();
	}
	fa_client *c = NULL, *c2 = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	assert_int_equal(fa_client_open(&c2, g_d.url), FA_OK);
	assert_int_equal(daemon_run_self_for_another_user(&g_d, "test_clients", "--other",
	                                                  fa_test_ms(20000)),
	                 0);
	size_t n = 0;
	assert_int_equal(fa_clients(c, NULL, 0, &n), FA_OK);
	assert_int_equal(n, 2); /* root sees both of its own; the other user's has closed */
	fa_client_close(c2);
	fa_client_close(c);
}

/* More sessions than one CLIENTS reply carries: the library pages with "after". */
static void test_clients_pages_past_one_reply(void **state)
{
	(void)state;
	enum { N = FA_PROTO_CLIENTS_MAX + 20 };
	int socks[N];
	struct fa_proto_rep rep;
	for (int i = 0; i < N; i++) {
		socks[i] = fa_raw_open(g_d.url, fa_test_ms(10000));
		assert_true(socks[i] >= 0);
		assert_true(fa_raw_hello(socks[i], 1, &rep) != 0);
	}
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	static fa_client_info v[N + 8];
	size_t n = 0;
	assert_int_equal(fa_clients(c, v, N + 8, &n), FA_OK);
	assert_int_equal(n, N + 1);
	for (size_t i = 1; i < n; i++)
		assert_true(v[i - 1].session < v[i].session); /* none twice, none skipped */
	fa_client_close(c);
	for (int i = 0; i < N; i++)
		nn_close(socks[i]);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--other") == 0)
		return other_main(argv[2]);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_clients_lists_each_process_once_with_its_buffers),
		cmocka_unit_test(test_clients_another_user_sees_only_their_own),
		cmocka_unit_test(test_clients_pages_past_one_reply),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
