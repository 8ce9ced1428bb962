/* test_messages.c - the client's answers a user can act on: a socket of a group the user is not
 * in gives FA_EPERM naming the group by name (the socket file, and a directory on the way); a
 * stale socket (file there, nobody listening) fails at once, not after the connect timeout; a
 * missing per-user default with the system socket present says FA_SOCKET; dtype details name the
 * dtypes; the exported fp16/bf16 converters agree with the CPU reference's on every value.
 */
#include <errno.h>
#include <grp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fa_attn.h"
#include "fa_integ.h"

#define OTHER_UID 65534

static char g_dir[64];

static int setup(void **state)
{
	(void)state;
	return fa_test_mkdir(g_dir, sizeof g_dir);
}

static int teardown(void **state)
{
	(void)state;
	fa_test_rmdir(g_dir);
	return 0;
}

/* A socket bound at path; listening when listen_too. Returns the descriptor. */
static int bound_socket(const char *path, bool listen_too)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	unlink(path);
	assert_int_equal(bind(fd, (const struct sockaddr *)&sa, sizeof sa), 0);
	if (listen_too)
		assert_int_equal(listen(fd, 4), 0);
	return fd;
}

static void test_stale_socket_fails_at_once(void **state)
{
	(void)state;
	char path[128];
	snprintf(path, sizeof path, "%s/stale.sock", g_dir);
	close(bound_socket(path, false)); /* the file stays, nobody listens: a killed daemon's */
	char url[160];
	snprintf(url, sizeof url, "ipc://%s", path);
	setenv("FA_CONNECT_TIMEOUT_MS", "20000", 1);
	fa_client *c = NULL;
	uint64_t t0 = fa_test_now_ms();
	fa_status st = fa_client_open(&c, url);
	uint64_t ms = fa_test_now_ms() - t0;
	unsetenv("FA_CONNECT_TIMEOUT_MS");
	printf("  stale socket: %s in %llu ms: %s\n", fa_status_name(st), (unsigned long long)ms,
	       fa_last_error_detail());
	assert_int_equal(st, FA_EUNAVAIL);
	assert_null(c);
	assert_true(ms < 1000);
	assert_non_null(strstr(fa_last_error_detail(), "no daemon is listening"));
	unlink(path);
}

/* In a child as OTHER_UID (no supplementary groups): fa_client_open(url); exit 0 when the status
 * is FA_EPERM and the detail contains want (and, with want2, that too). */
static int open_as_other_user(const char *url, const char *want, const char *want2)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgroups(0, NULL) != 0 || setgid(OTHER_UID) != 0 || setuid(OTHER_UID) != 0)
			_exit(3);
		fa_client *c = NULL;
		fa_status st = fa_client_open(&c, url);
		const char *det = fa_last_error_detail();
		printf("  uid %d: %s: %s\n", OTHER_UID, fa_status_name(st), det);
		fflush(stdout);
		_exit(st == FA_EPERM && strstr(det, want) != NULL &&
		              (want2 == NULL || strstr(det, want2) != NULL)
		          ? 0
		          : 1);
	}
	return fa_test_waitpid(pid, fa_test_ms(10000));
}

/* The name of group gid, as the library should print it. */
static void gid_name(gid_t gid, char *out, size_t cap)
{
	struct group *g = getgrgid(gid);
	snprintf(out, cap, "group %s only; add yourself to group %s", g ? g->gr_name : "?",
	         g ? g->gr_name : "?");
}

static void test_socket_of_another_group_names_the_group(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		print_message("  skipped: needs root to act as another user\n");
		skip();
	}
	/* The directory open to all, the socket to its group (gid 0) only, like --socket-mode 0660
	 * under a group the user is not in. */
	char path[128], url[160], want[160];
	assert_int_equal(chmod(g_dir, 0755), 0);
	snprintf(path, sizeof path, "%s/grp.sock", g_dir);
	int fd = bound_socket(path, true);
	assert_int_equal(chown(path, 0, 0), 0);
	assert_int_equal(chmod(path, 0660), 0);
	snprintf(url, sizeof url, "ipc://%s", path);
	gid_name(0, want, sizeof want);
	assert_int_equal(open_as_other_user(url, want, "the socket"), 0);

	/* Now the directory is the barrier (/run/fa-daemon is 0750 root:fa): its group is named. */
	assert_int_equal(chmod(path, 0666), 0);
	assert_int_equal(chown(g_dir, 0, 0), 0);
	assert_int_equal(chmod(g_dir, 0750), 0);
	assert_int_equal(open_as_other_user(url, want, "its directory"), 0);
	assert_int_equal(chmod(g_dir, 0700), 0);
	close(fd);
	unlink(path);
}

static void test_missing_user_default_names_the_system_socket(void **state)
{
	(void)state;
	char xdg[128], sys[128];
	snprintf(xdg, sizeof xdg, "%s/xdg", g_dir);
	assert_int_equal(mkdir(xdg, 0700), 0);
	snprintf(sys, sizeof sys, "%s/sys.sock", g_dir);
	int fd = bound_socket(sys, true);
	unsetenv("FA_SOCKET");
	setenv("XDG_RUNTIME_DIR", xdg, 1);
	setenv("FA_TEST_SYSTEM_SOCKET", sys, 1);
	fa_client *c = NULL;
	fa_status st = fa_client_open(&c, NULL);
	printf("  per-user default missing: %s: %s\n", fa_status_name(st), fa_last_error_detail());
	assert_int_equal(st, FA_EUNAVAIL);
	char want[200];
	snprintf(want, sizeof want, "set FA_SOCKET=%s", sys);
	assert_non_null(strstr(fa_last_error_detail(), want));
	assert_non_null(strstr(fa_last_error_detail(), "XDG_RUNTIME_DIR"));

	/* Without a system socket: the plain answer. */
	close(fd);
	unlink(sys);
	st = fa_client_open(&c, NULL);
	assert_int_equal(st, FA_EUNAVAIL);
	assert_null(strstr(fa_last_error_detail(), "FA_SOCKET"));
	assert_non_null(strstr(fa_last_error_detail(), "is fa-daemon running?"));
	unsetenv("XDG_RUNTIME_DIR");
	unsetenv("FA_TEST_SYSTEM_SOCKET");
	rmdir(xdg);
}

/* A detail about dtypes names them: a mismatch and an unknown value, through a live daemon. */
static void test_dtype_details_name_the_dtypes(void **state)
{
	(void)state;
	struct fa_daemon d = {0};
	if (daemon_start(&d, NULL) != 0) {
		daemon_log_dump(&d, 40);
		fail();
	}
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, d.url), FA_OK);
	fa_buffer *b = NULL;
	assert_int_equal(fa_buffer_alloc_host(c, 1 << 16, &b), FA_OK);
	fa_attn_fwd_args a = {0};
	fa_tensor *ts[4] = {&a.q, &a.k, &a.v, &a.o};
	for (int i = 0; i < 4; i++) {
		*ts[i] = (fa_tensor){.buf = b, .offset = (uint64_t)i * 8192, .dtype = FA_DTYPE_FP16,
		                     .shape = {1, 16, 1, 64}, .stride = {1024, 64, 64, 1}};
	}
	a.k.dtype = FA_DTYPE_BF16;
	assert_int_equal(fa_attn_fwd(c, &a), FA_EDTYPE);
	printf("  mismatch: %s\n", fa_last_error_detail());
	assert_non_null(strstr(fa_last_error_detail(), "bf16"));
	assert_non_null(strstr(fa_last_error_detail(), "fp16"));
	a.k.dtype = FA_DTYPE_FP16;
	a.q.dtype = (fa_dtype)7;
	assert_int_equal(fa_attn_fwd(c, &a), FA_EDTYPE);
	printf("  unknown: %s\n", fa_last_error_detail());
	assert_non_null(strstr(fa_last_error_detail(), "fp16, bf16 or fp32"));
	fa_buffer_free(b);
	fa_client_close(c);
	assert_int_equal(daemon_finish(&d), 0);
}

/* Every 16-bit pattern to float, and a sweep of floats (with ties, subnormals, inf and NaN) to
 * 16 bits: the exported converters give the CPU reference's results. */
static void test_converters_agree_with_the_reference(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 65536; h++) {
		float a = fa_float_from_fp16((uint16_t)h), r = fa_half_to_float((uint16_t)h);
		float b = fa_float_from_bf16((uint16_t)h), rb = fa_bf16_to_float((uint16_t)h);
		assert_memory_equal(&a, &r, sizeof a);
		assert_memory_equal(&b, &rb, sizeof b);
	}
	uint64_t rng = 42;
	for (int i = 0; i < 1 << 20; i++) {
		uint32_t bits = (uint32_t)fa_rand_next(&rng);
		if (i < 65536) /* exactly the halfway points of both types, and their neighbours */
			bits = ((uint32_t)i << 13) ^ ((i & 3) == 0 ? 0x1000u : (i & 3) == 1 ? 0x8000u : 0u);
		float f;
		memcpy(&f, &bits, sizeof f);
		assert_int_equal(fa_fp16_from_float(f), fa_float_to_half(f));
		assert_int_equal(fa_bf16_from_float(f), fa_float_to_bf16(f));
	}
	assert_int_equal(fa_bf16_from_float(1.0f), 0x3f80);
	assert_int_equal(fa_fp16_from_float(1.0f), 0x3c00);
	assert_int_equal(fa_fp16_from_float(65520.0f), 0x7c00); /* the tie above 65504 goes to inf */
	assert_true(isnan(fa_float_from_bf16(fa_bf16_from_float(NAN))));
	assert_true(isnan(fa_float_from_fp16(fa_fp16_from_float(NAN))));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stale_socket_fails_at_once),
		cmocka_unit_test(test_socket_of_another_group_names_the_group),
		cmocka_unit_test(test_missing_user_default_names_the_system_socket),
		cmocka_unit_test(test_converters_agree_with_the_reference),
		cmocka_unit_test(test_dtype_details_name_the_dtypes),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
