/* test_config.c - the option table: defaults, flags, environment, config file, precedence, and
 * every kind of bad value refused with a message that names the option. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"

static const char *const env_names[] = {
	"FA_SOCKET",  "FA_SOCKET_MODE", "FA_THREADS",   "FA_MAX_INFLIGHT",     "FA_MAX_REGIONS",
	"FA_MAX_SESSIONS", "FA_MAX_REGION_BYTES", "FA_BACKEND", "FA_CACHE_DIR", "FA_CONFIG",
	"FA_VERBOSE", "FA_WGMMA", "FA_WGMMA16", "FA_WG_BC", "FA_WG_STAGES", "FA_WG_NWG",
	"FA_NVRTC_EXTRA", "FA_KERNEL_CACHE_MAX_MB", "CUDA_HOME", "FA_MAX_CONNECTIONS",
	"FA_MAX_CONNECTIONS_PER_UID", "FA_RESERVED_CONNECTIONS", "FA_FRAME_TIMEOUT_MS",
	"FA_IDLE_TIMEOUT_MS",
};

/* Every test starts from an environment without FA_* settings. */
static int clean_env(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++)
		unsetenv(env_names[i]);
	return 0;
}

static fa_status parse(struct config *c, enum config_action *action, char *err, size_t errlen,
                       ...)
{
	char *argv[32] = {"fa-daemon"};
	int argc = 1;
	va_list ap;

	va_start(ap, errlen);
	for (char *a; argc < 31 && (a = va_arg(ap, char *)) != NULL;)
		argv[argc++] = a;
	va_end(ap);
	return config_load(c, argc, argv, action, err, errlen);
}

static void get(const struct config *c, const char *name, char *buf, size_t cap)
{
	assert_true(config_get(c, name, buf, cap));
}

static void test_config_defaults_are_the_documented_values(void **state)
{
	struct config c;
	enum config_action a;
	char err[256], v[256];
	(void)state;

	assert_int_equal(parse(&c, &a, err, sizeof err, NULL), FA_OK);
	assert_int_equal(a, CONFIG_RUN);
	assert_int_equal(c.socket_mode, 0660);
	assert_int_equal(c.max_inflight, 64);
	assert_int_equal(c.max_regions, 256);
	assert_int_equal(c.max_sessions, 1024);
	assert_true(c.max_region_bytes == (uint64_t)64 << 30);
	assert_string_equal(c.backend, "auto");
	assert_int_equal(c.verbose, 0);
	assert_true(c.threads >= 1); /* 0 resolved to the CPU count */
	assert_int_equal(c.max_connections, 4096);
	assert_int_equal(c.max_connections_per_uid, 1024);
	assert_int_equal(c.reserved_connections, 32);
	assert_int_equal(c.frame_timeout_ms, 10000);
	assert_int_equal(c.idle_timeout_ms, 30000);
	get(&c, "socket-mode", v, sizeof v);
	assert_string_equal(v, "0660");
	get(&c, "max-region-bytes", v, sizeof v);
	assert_string_equal(v, "64G");
}

static void test_config_default_socket_follows_xdg_runtime_dir(void **state)
{
	struct config c;
	(void)state;

	setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
	config_defaults(&c);
	assert_string_equal(c.socket, "/run/user/1234/fa-daemon/fa.sock");
	unsetenv("XDG_RUNTIME_DIR");
	config_defaults(&c);
	assert_string_equal(c.socket, "/run/fa-daemon/fa.sock");
}

static void test_config_flags_take_both_spellings(void **state)
{
	struct config c;
	enum config_action a;
	char err[256];
	(void)state;

	assert_int_equal(parse(&c, &a, err, sizeof err, "--threads", "3", "--max-inflight=7",
	                       "--socket", "ipc:///tmp/fa-t.sock", "--socket-mode", "600",
	                       "--max-region-bytes", "2M", "--backend=cpu", "-vv", NULL),
	                 FA_OK);
	assert_int_equal(c.threads, 3);
	assert_int_equal(c.max_inflight, 7);
	assert_string_equal(c.socket, "/tmp/fa-t.sock"); /* the URL prefix is stripped */
	assert_int_equal(c.socket_mode, 0600);
	assert_true(c.max_region_bytes == 2u << 20);
	assert_string_equal(c.backend, "cpu");
	assert_int_equal(c.verbose, 2);
}

static void test_config_environment_is_read(void **state)
{
	struct config c;
	enum config_action a;
	char err[256];
	(void)state;

	setenv("FA_THREADS", "5", 1);
	setenv("FA_SOCKET", "/tmp/fa-env.sock", 1);
	setenv("FA_MAX_SESSIONS", "9", 1);
	assert_int_equal(parse(&c, &a, err, sizeof err, NULL), FA_OK);
	assert_int_equal(c.threads, 5);
	assert_int_equal(c.max_sessions, 9);
	assert_string_equal(c.socket, "/tmp/fa-env.sock");
}

/* Write a config file into a fresh temporary path. */
static void write_file(char *path, size_t cap, const char *text)
{
	snprintf(path, cap, "/tmp/fa-config-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

static void test_config_file_then_env_then_flags(void **state)
{
	struct config c;
	enum config_action a;
	char err[256], path[64];
	(void)state;

	write_file(path, sizeof path,
	           "# a comment\n"
	           "\n"
	           "threads = 2\n"
	           "max-regions=11   # trailing comment\n"
	           "max-inflight = 3\n"
	           "socket = \"/tmp/fa-file.sock\"\n");
	setenv("FA_MAX_INFLIGHT", "4", 1);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--config", path, "--threads", "6", NULL),
	                 FA_OK);
	assert_int_equal(c.max_regions, 11);       /* file */
	assert_int_equal(c.max_inflight, 4);       /* env beats file */
	assert_int_equal(c.threads, 6);            /* flag beats file */
	assert_string_equal(c.socket, "/tmp/fa-file.sock");
	assert_string_equal(c.config_file, path);

	/* FA_CONFIG names the file when no flag does. */
	setenv("FA_CONFIG", path, 1);
	assert_int_equal(parse(&c, &a, err, sizeof err, NULL), FA_OK);
	assert_int_equal(c.max_regions, 11);
	unlink(path);
}

static void expect_refused(const char *needle, ...)
{
	struct config c;
	enum config_action a;
	char err[512] = "";
	char *argv[16] = {"fa-daemon"};
	int argc = 1;
	va_list ap;

	va_start(ap, needle);
	for (char *x; argc < 15 && (x = va_arg(ap, char *)) != NULL;)
		argv[argc++] = x;
	va_end(ap);
	assert_int_not_equal(config_load(&c, argc, argv, &a, err, sizeof err), FA_OK);
	if (strstr(err, needle) == NULL)
		fail_msg("message '%s' does not mention '%s'", err, needle);
}

static void test_config_rejects_bad_values_with_a_message(void **state)
{
	char longpath[200];
	(void)state;

	expect_refused("--threads: 'abc' is not an integer", "--threads", "abc", NULL);
	expect_refused("--threads: 5000 is out of range 0..1024", "--threads", "5000", NULL);
	expect_refused("--max-inflight: 0 is out of range", "--max-inflight", "0", NULL);
	expect_refused("--threads: '3x' is not an integer", "--threads=3x", NULL);
	expect_refused("--socket-mode: '0999' is not an octal mode", "--socket-mode", "0999", NULL);
	expect_refused("--socket-mode: 01777 is out of range", "--socket-mode", "01777", NULL);
	expect_refused("--max-region-bytes: '12Q' is not a size", "--max-region-bytes", "12Q",
	               NULL);
	expect_refused("--max-region-bytes: '-1' is not a size", "--max-region-bytes", "-1", NULL);
	expect_refused("--backend: 'gpux' is not one of: auto, gpu, cpu", "--backend", "gpux", NULL);
	expect_refused("unknown option '--frobnicate'", "--frobnicate", "1", NULL);
	expect_refused("unknown option '-x'", "-x", NULL);
	expect_refused("--threads needs a value", "--threads", NULL);
	expect_refused("unexpected argument 'stray'", "stray", NULL);
	expect_refused("--socket: the socket path is empty", "--socket", "", NULL);
	memset(longpath, 'a', sizeof longpath);
	longpath[0] = '/';
	longpath[120] = '\0';
	expect_refused("a Unix socket path must be shorter than 108 bytes", "--socket", longpath,
	               NULL);
	expect_refused("--config /nonexistent/fa.conf", "--config", "/nonexistent/fa.conf", NULL);

	setenv("FA_MAX_REGIONS", "many", 1);
	expect_refused("FA_MAX_REGIONS: 'many' is not an integer", NULL);
	unsetenv("FA_MAX_REGIONS");
}

/* The kernels' settings are options like the others (flag, environment, file), parsed and
 * checked by kernels/fa_settings.c, and land in c.kernels for the GPU backend. */
static void test_config_carries_the_kernel_settings(void **state)
{
	(void)state;
	struct config c;
	enum config_action a;
	char err[512], v[256];

	assert_int_equal(parse(&c, &a, err, sizeof err, NULL), FA_OK);
	assert_true(c.kernels.wgmma);
	assert_int_equal(c.kernels.wgmma16, FA_WGMMA16_MEASURED);
	assert_string_equal(c.kernels.nvrtc_extra, "");
	get(&c, "wgmma16", v, sizeof v);
	assert_string_equal(v, "auto");

	setenv("FA_WGMMA", "0", 1);
	setenv("FA_NVRTC_EXTRA", "-DFA_X=1", 1);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--wgmma16", "1", "--wg-bc", "32",
	                       "--kernel-cache-max-mb", "64", NULL),
	                 FA_OK);
	unsetenv("FA_WGMMA");
	unsetenv("FA_NVRTC_EXTRA");
	assert_false(c.kernels.wgmma);
	assert_int_equal(c.kernels.wgmma16, FA_WGMMA16_ALL);
	assert_int_equal(c.kernels.wg_bc, 32);
	assert_int_equal(c.kernels.kernel_cache_max_mb, 64);
	assert_string_equal(c.kernels.nvrtc_extra, "-DFA_X=1");
	get(&c, "nvrtc-extra", v, sizeof v);
	assert_string_equal(v, "-DFA_X=1");

	expect_refused("--wgmma: bad value \"yes\" (0 or 1)", "--wgmma", "yes", NULL);
	expect_refused("--wgmma16: bad value \"2\" (auto, 0 or 1)", "--wgmma16", "2", NULL);
	expect_refused("--wg-stages: bad value \"-1\"", "--wg-stages", "-1", NULL);
	setenv("FA_WGMMA", "2", 1);
	expect_refused("FA_WGMMA: bad value \"2\" (0 or 1)", NULL);
	unsetenv("FA_WGMMA");
}

static void test_config_file_errors_name_the_line(void **state)
{
	char path[64], needle[128];
	(void)state;

	write_file(path, sizeof path, "threads = 2\nbogus = 1\n");
	snprintf(needle, sizeof needle, "%s:2: unknown option 'bogus'", path);
	expect_refused(needle, "--config", path, NULL);
	unlink(path);

	write_file(path, sizeof path, "threads 2\n");
	snprintf(needle, sizeof needle, "%s:1: expected name = value", path);
	expect_refused(needle, "--config", path, NULL);
	unlink(path);

	write_file(path, sizeof path, "max-sessions = -4\n");
	snprintf(needle, sizeof needle, "%s:1: -4 is out of range 1..65536", path);
	expect_refused(needle, "--config", path, NULL);
	unlink(path);

	write_file(path, sizeof path, "config = /etc/other\n");
	expect_refused("'config' cannot be set in a file", "--config", path, NULL);
	unlink(path);
}

static void test_config_help_and_version_win_over_errors(void **state)
{
	struct config c;
	enum config_action a;
	char err[256];
	(void)state;

	assert_int_equal(parse(&c, &a, err, sizeof err, "--help", NULL), FA_OK);
	assert_int_equal(a, CONFIG_HELP);
	assert_int_equal(parse(&c, &a, err, sizeof err, "-h", NULL), FA_OK);
	assert_int_equal(a, CONFIG_HELP);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--version", NULL), FA_OK);
	assert_int_equal(a, CONFIG_VERSION);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--threads", "bad", "--help", NULL),
	                 FA_OK);
	assert_int_equal(a, CONFIG_HELP);
}

static void test_config_help_and_describe_list_every_option(void **state)
{
	static const char *const names[] = {"socket",       "socket-mode",      "threads",
	                                    "max-inflight", "max-regions",      "max-sessions",
	                                    "max-region-bytes", "backend",      "cache-dir",
	                                    "config",       "verbose",
	                                    "max-connections", "max-connections-per-uid",
	                                    "reserved-connections", "frame-timeout-ms",
	                                    "idle-timeout-ms", "max-request-gflop",
	                                    "session-workers", "drain-timeout-ms"};
	struct config c;
	char desc[8192], *help = NULL, key[64];
	size_t helplen = 0;
	(void)state;

	config_defaults(&c);
	config_finish(&c);
	config_describe(&c, desc, sizeof desc);
	FILE *f = open_memstream(&help, &helplen);
	assert_non_null(f);
	config_print_help(f, "fa-daemon");
	fclose(f);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(key, sizeof key, "%s=", names[i]);
		assert_non_null(strstr(desc, key));
		snprintf(key, sizeof key, "--%s ", names[i]);
		assert_non_null(strstr(help, key));
	}
	assert_non_null(strstr(help, "FA_MAX_INFLIGHT"));
	assert_non_null(strstr(help, "FA_MAX_CONNECTIONS_PER_UID"));
	assert_non_null(strstr(help, "FA_IDLE_TIMEOUT_MS"));
	assert_non_null(strstr(help, "-vv"));
	free(help);
}

/* The connection options: flags, environment and file, their ranges, and the checks between
 * them (a per-uid cap above the global one, a reserve that leaves nothing). */
static void test_config_connection_limits_parse_and_are_checked_together(void **state)
{
	struct config c;
	enum config_action a;
	char err[256], path[] = "/tmp/fa-test-config-conn-XXXXXX";
	(void)state;

	assert_int_equal(parse(&c, &a, err, sizeof err, "--max-connections", "200",
	                       "--max-connections-per-uid=50", "--reserved-connections", "0",
	                       "--frame-timeout-ms", "250", "--idle-timeout-ms=1500", NULL),
	                 FA_OK);
	assert_int_equal(c.max_connections, 200);
	assert_int_equal(c.max_connections_per_uid, 50);
	assert_int_equal(c.reserved_connections, 0);
	assert_int_equal(c.frame_timeout_ms, 250);
	assert_int_equal(c.idle_timeout_ms, 1500);

	setenv("FA_MAX_CONNECTIONS_PER_UID", "7", 1);
	setenv("FA_IDLE_TIMEOUT_MS", "900", 1);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--idle-timeout-ms", "800", NULL), FA_OK);
	assert_int_equal(c.max_connections_per_uid, 7);
	assert_int_equal(c.idle_timeout_ms, 800); /* the flag beats the environment */
	unsetenv("FA_MAX_CONNECTIONS_PER_UID");
	unsetenv("FA_IDLE_TIMEOUT_MS");

	int fd = mkstemp(path);
	assert_true(fd >= 0);
	const char text[] = "max-connections = 100\nreserved-connections = 4\n";
	assert_int_equal(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
	close(fd);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--config", path,
	                       "--max-connections-per-uid", "100", NULL),
	                 FA_OK);
	assert_int_equal(c.max_connections, 100);
	assert_int_equal(c.reserved_connections, 4);
	assert_int_equal(c.max_connections_per_uid, 100);
	unlink(path);

	assert_int_equal(parse(&c, &a, err, sizeof err, "--max-connections", "100", NULL),
	                 FA_EINVAL); /* the default per-uid cap, 1024, is above it */
	assert_non_null(strstr(err, "max-connections-per-uid 1024 is above max-connections 100"));
	assert_int_equal(parse(&c, &a, err, sizeof err, "--max-connections", "100",
	                       "--max-connections-per-uid", "10", "--reserved-connections", "100",
	                       NULL),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "reserved-connections 100"));
	assert_int_equal(parse(&c, &a, err, sizeof err, "--max-connections", "8", NULL), FA_EINVAL);
	assert_non_null(strstr(err, "--max-connections: 8 is out of range 16..1048576"));
	assert_int_equal(parse(&c, &a, err, sizeof err, "--frame-timeout-ms", "5", NULL),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "--frame-timeout-ms"));
	setenv("FA_IDLE_TIMEOUT_MS", "soon", 1);
	assert_int_equal(parse(&c, &a, err, sizeof err, NULL), FA_EINVAL);
	assert_non_null(strstr(err, "FA_IDLE_TIMEOUT_MS: 'soon' is not an integer"));
	unsetenv("FA_IDLE_TIMEOUT_MS");
}

/* The bounded-work options: defaults (0: the backend's limit; the share resolved from the
 * threads), flags and environment, ranges. */
static void test_config_bounded_work_options_parse_and_resolve(void **state)
{
	struct config c;
	enum config_action a;
	char err[256];
	(void)state;

	assert_int_equal(parse(&c, &a, err, sizeof err, "--threads", "6", NULL), FA_OK);
	assert_int_equal(c.max_request_gflop, 0);
	assert_int_equal(c.session_workers, 5); /* threads - 1 */
	assert_int_equal(c.drain_timeout_ms, 30000);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--threads", "1", NULL), FA_OK);
	assert_int_equal(c.session_workers, 1);
	setenv("FA_MAX_REQUEST_GFLOP", "2000000", 1);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--session-workers", "3",
	                       "--drain-timeout-ms=0", NULL),
	                 FA_OK);
	unsetenv("FA_MAX_REQUEST_GFLOP");
	assert_int_equal(c.max_request_gflop, 2000000);
	assert_int_equal(c.session_workers, 3);
	assert_int_equal(c.drain_timeout_ms, 0);
	assert_int_equal(parse(&c, &a, err, sizeof err, "--max-request-gflop", "-1", NULL),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "--max-request-gflop: -1 is out of range"));
	assert_int_equal(parse(&c, &a, err, sizeof err, "--drain-timeout-ms", "soon", NULL),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "--drain-timeout-ms: 'soon' is not an integer"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_config_defaults_are_the_documented_values, clean_env),
		cmocka_unit_test_setup(test_config_bounded_work_options_parse_and_resolve, clean_env),
		cmocka_unit_test_setup(test_config_default_socket_follows_xdg_runtime_dir, clean_env),
		cmocka_unit_test_setup(test_config_flags_take_both_spellings, clean_env),
		cmocka_unit_test_setup(test_config_environment_is_read, clean_env),
		cmocka_unit_test_setup(test_config_file_then_env_then_flags, clean_env),
		cmocka_unit_test_setup(test_config_rejects_bad_values_with_a_message, clean_env),
		cmocka_unit_test_setup(test_config_carries_the_kernel_settings, clean_env),
		cmocka_unit_test_setup(test_config_file_errors_name_the_line, clean_env),
		cmocka_unit_test_setup(test_config_help_and_version_win_over_errors, clean_env),
		cmocka_unit_test_setup(test_config_help_and_describe_list_every_option, clean_env),
		cmocka_unit_test_setup(test_config_connection_limits_parse_and_are_checked_together,
		                       clean_env),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
