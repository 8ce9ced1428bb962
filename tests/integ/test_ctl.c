/* test_ctl.c - fa-ctl's conventions as a script sees them: exit status 2 for a usage error in
 * every subcommand, 1 when the daemon is unreachable, 0 on success; -V and --version as the
 * version command; `stats --json`, `clients --json` and `plan --json` are valid JSON; `plan
 * --backward`; and `plan --head-dim 512` offline gives the status and text the daemon gives a
 * request with head dim 512.
 */
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
#include "fa_raw.h"

static struct fa_daemon g_d;
static char g_dir[512];

static int setup(void **state)
{
	(void)state;
	if (fa_test_mkdir(g_dir, sizeof g_dir) != 0)
		return -1;
	if (daemon_start(&g_d, NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_test_rmdir(g_dir);
	return daemon_finish(&g_d);
}

/* A whole (small) file as a string; "" when unreadable. Caller frees. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	size_t n = 0, cap = 1 << 16;
	char *s = calloc(1, cap + 1);
	if (s == NULL)
		abort();
	if (f != NULL) {
		n = fread(s, 1, cap, f);
		fclose(f);
	}
	s[n] = '\0';
	return s;
}

/* Run "$FA_BUILD/fa-ctl <args>" (args: shell words) with stdout and stderr into files of the
 * test's dir; its exit status (-1 when it did not exit). *out and *err (may be NULL) get the
 * texts, to free. */
static int ctl(const char *args, char **out, char **err)
{
	char cmd[4096], o[600], e[600];
	snprintf(o, sizeof o, "%s/out", g_dir);
	snprintf(e, sizeof e, "%s/err", g_dir);
	snprintf(cmd, sizeof cmd, "'%s/fa-ctl' %s >'%s' 2>'%s' </dev/null", fa_test_build_dir(),
	         args, o, e);
	int st = system(cmd);
	int code = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	char *to = slurp(o), *te = slurp(e);
	if (code != 0)
		fprintf(stderr, "  fa-ctl %s: exit %d, stderr: %s", args, code, te);
	if (out != NULL)
		*out = to;
	else
		free(to);
	if (err != NULL)
		*err = te;
	else
		free(te);
	return code;
}

/* A minimal structural check of JSON text (quotes closed, escapes complete, braces and brackets
 * balanced and nested right), for hosts without python3. */
static bool json_balanced(const char *s)
{
	char stack[64];
	int depth = 0;
	bool in_str = false;
	for (; *s != '\0'; s++) {
		if (in_str) {
			if (*s == '\\') {
				if (*++s == '\0')
					return false;
			} else if (*s == '"') {
				in_str = false;
			} else if ((unsigned char)*s < 0x20) {
				return false;
			}
		} else if (*s == '"') {
			in_str = true;
		} else if (*s == '{' || *s == '[') {
			if (depth == (int)sizeof stack)
				return false;
			stack[depth++] = *s == '{' ? '}' : ']';
		} else if (*s == '}' || *s == ']') {
			if (depth == 0 || stack[--depth] != *s)
				return false;
		}
	}
	return !in_str && depth == 0;
}

/* text, the last fa-ctl stdout (g_dir/out), is JSON: the balance check, and python3 -m json.tool where
 * python3 is installed. */
static void assert_json(const char *text)
{
	assert_true(json_balanced(text));
	assert_true(text[0] == '{');
	if (system("command -v python3 >/dev/null 2>&1") == 0) {
		char cmd[1400];
		snprintf(cmd, sizeof cmd, "python3 -m json.tool '%s/out' >/dev/null", g_dir);
		assert_int_equal(system(cmd), 0);
	}
}

static void test_ctl_usage_errors_exit_2(void **state)
{
	(void)state;
	static const char *const cases[] = {
		"", "nope", "--bogus stats", "--timeout x ping", "--socket", "ping -c", "ping -c 0",
		"ping extra", "stats extra", "stats --json --bogus", "version extra", "help extra",
		"plan", "plan --bogus", "plan --arch", "plan --arch sm_89 --dtype fp16 --head-dim x",
		"plan --arch sm_89 --dtype fp99 --head-dim 64", "plan --arch sm_1 --dtype fp16 --head-dim 64",
		"plan --arch sm_89 --dtype fp16 --head-dim 64 extra",
		"plan --arch sm_90 --dtype bf16 --head-dim 64 --window 5",
		"plan --arch sm_90 --dtype bf16 --head-dim 64 --softcap -1", "tune", "tune --runs x",
		"tune --device x --dtype fp16 --head-dim 64 --seq 128", "tune --dtype fp16 --seq 128",
		"tune --dtype fp16 --head-dim 64 --seq 128 --bogus", "clients extra",
		"clients --json --bogus",
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char *err;
		int code = ctl(cases[i], NULL, &err);
		if (code != 2)
			fprintf(stderr, "  'fa-ctl %s': exit %d, want 2\n", cases[i], code);
		assert_int_equal(code, 2);
		/* one prefix for every message */
		assert_true(strncmp(err, "fa-ctl: ", 8) == 0);
		free(err);
	}
}

static void test_ctl_unreachable_daemon_exits_1(void **state)
{
	(void)state;
	char args[1200], *err;
	snprintf(args, sizeof args, "--socket '%s/no.sock' --timeout 2000 stats", g_dir);
	assert_int_equal(ctl(args, NULL, &err), 1);
	assert_true(strncmp(err, "fa-ctl: stats: ", 15) == 0);
	free(err);
	snprintf(args, sizeof args, "--socket '%s/no.sock' --timeout 2000 ping", g_dir);
	assert_int_equal(ctl(args, NULL, &err), 1);
	assert_true(strncmp(err, "fa-ctl: ping: ", 14) == 0);
	free(err);
	snprintf(args, sizeof args, "--socket '%s/no.sock' --timeout 2000 clients", g_dir);
	assert_int_equal(ctl(args, NULL, &err), 1);
	assert_true(strncmp(err, "fa-ctl: clients: ", 17) == 0);
	free(err);
}

static void test_ctl_version_flags_match_the_command(void **state)
{
	(void)state;
	char *v, *v1, *v2;
	assert_int_equal(ctl("version", &v, NULL), 0);
	assert_int_equal(ctl("-V", &v1, NULL), 0);
	assert_int_equal(ctl("--version", &v2, NULL), 0);
	assert_true(strncmp(v, "fa-ctl ", 7) == 0);
	assert_string_equal(v, v1);
	assert_string_equal(v, v2);
	free(v);
	free(v1);
	free(v2);
	char *h;
	assert_int_equal(ctl("--help", &h, NULL), 0);
	assert_non_null(strstr(h, "exit status"));
	free(h);
}

static void test_ctl_stats_and_ping_against_the_daemon(void **state)
{
	(void)state;
	char args[1200], *out;
	snprintf(args, sizeof args, "--socket '%s' ping -c 2", g_d.sock);
	assert_int_equal(ctl(args, NULL, NULL), 0);
	snprintf(args, sizeof args, "--socket '%s' stats --json", g_d.sock);
	assert_int_equal(ctl(args, &out, NULL), 0);
	assert_json(out);
	/* sections of keys, numbers as numbers, text as strings */
	assert_non_null(strstr(out, "\"server\": {"));
	assert_non_null(strstr(out, "\"requests\": {"));
	assert_non_null(strstr(out, "\"threads\": "));
	assert_null(strstr(out, "\"threads\": \""));
	assert_non_null(strstr(out, "\"version\": \""));
	assert_non_null(strstr(out, "\"epoch\": \""));
	free(out);
	/* clients --json: an array with fa-ctl's own session in it */
	snprintf(args, sizeof args, "--socket '%s' clients --json", g_d.sock);
	assert_int_equal(ctl(args, &out, NULL), 0);
	assert_true(out[0] == '[' && json_balanced(out)); /* an array: assert_json wants an object */
	if (system("command -v python3 >/dev/null 2>&1") == 0) {
		char cmd[1400];
		snprintf(cmd, sizeof cmd, "python3 -m json.tool '%s/out' >/dev/null", g_dir);
		assert_int_equal(system(cmd), 0);
	}
	assert_non_null(strstr(out, "\"command\": \"fa-ctl\""));
	free(out);
}

static void test_ctl_plan_json(void **state)
{
	(void)state;
	char *out;
	assert_int_equal(ctl("plan --arch sm_90 --dtype bf16 --head-dim 128 --causal --json", &out,
	                     NULL), 0);
	assert_json(out);
	assert_non_null(strstr(out, "\"status\": \"FA_OK\""));
	assert_non_null(strstr(out, "\"chosen\": {"));
	assert_non_null(strstr(out, "\"smem_optin_bytes\": 232448"));
	assert_non_null(strstr(out, "\"candidates\": ["));
	free(out);
}

/* plan --decode: the decode kernel's tile and split for the shape (one split at B=16 x
 * 8k, as the H200 sweep measured best), and over a ragged paged cache the lengths' own split
 * (more than the longest sequence's one); a bad length list is a usage error. */
static void test_ctl_plan_decode(void **state)
{
	(void)state;
	char *out, *err;
	assert_int_equal(ctl("plan --arch h200 --dtype bf16 --head-dim 128 --decode --batch 16 "
	                     "--heads 32 --kv-heads 8 --seq-k 8192", &out, NULL), 0);
	assert_non_null(strstr(out, "splits:    1 x 8192 keys, grid 1 x 8 x 16"));
	free(out);
	assert_int_equal(ctl("plan --arch h200 --dtype bf16 --head-dim 128 --decode --heads 32 "
	                     "--kv-heads 8 --cache-lens 8192,1,37,74,111,148,185,222,259,296,333,"
	                     "370,407,444,481,518 --page-size 16 --json", &out, NULL), 0);
	assert_json(out);
	assert_non_null(strstr(out, "\"layout\": \"paged\""));
	assert_non_null(strstr(out, "\"longest_sequence_splits\": 1"));
	assert_null(strstr(out, "\"splits\": 1,"));
	free(out);
	assert_int_equal(ctl("plan --arch h200 --dtype bf16 --head-dim 128 --decode --cache-lens 5,x",
	                     NULL, &err), 2);
	assert_non_null(strstr(err, "bad --cache-lens"));
	free(err);
}

/* plan --prefill: the prefill kernel over a paged cache takes a tile that leaves registers for
 * its page lookups (the dense shape's 128x64 w4r2 would spill with them), its shared memory
 * counts the row table, and the same shape unpaged keeps the dense tile; bad page sizes, a
 * missing --seq-q and two kernels at once are usage errors (exit 2). */
static void test_ctl_plan_prefill(void **state)
{
	(void)state;
	char *out, *err;
	const char *base = "plan --arch h200 --dtype bf16 --head-dim 128 --prefill --batch 16 "
	                   "--heads 32 --kv-heads 8 --seq-q 512 --seq-k 4096";
	char cmd[512];
	snprintf(cmd, sizeof cmd, "%s --page-size 16", base);
	assert_int_equal(ctl(cmd, &out, NULL), 0);
	assert_non_null(strstr(out, "prefill over paged cache"));
	assert_non_null(strstr(out, "of them the page row table"));
	assert_non_null(strstr(out, "dense:     the same shape as one dense batch takes 128x64 w4r2"));
	free(out);
	snprintf(cmd, sizeof cmd, "%s --json", base);
	assert_int_equal(ctl(cmd, &out, NULL), 0);
	assert_json(out);
	assert_non_null(strstr(out, "\"layout\": \"varlen\""));
	assert_non_null(strstr(out, "\"tile\": \"128x64 w4r2 s2\""));
	assert_non_null(strstr(out, "\"layout_smem_bytes\": 0"));
	free(out);
	snprintf(cmd, sizeof cmd, "%s --page-size 8", base);
	assert_int_equal(ctl(cmd, NULL, &err), 2);
	assert_non_null(strstr(err, "pages hold 16 to 256 tokens"));
	free(err);
	assert_int_equal(ctl("plan --arch h200 --dtype bf16 --head-dim 128 --prefill --seq-k 40",
	                     NULL, &err), 2);
	assert_non_null(strstr(err, "--prefill needs --seq-q and --seq-k"));
	free(err);
	snprintf(cmd, sizeof cmd, "%s --decode", base);
	assert_int_equal(ctl(cmd, NULL, &err), 2);
	assert_non_null(strstr(err, "plan different kernels"));
	free(err);
}

/* plan --backward: the backward's own planner; fp32 head dim 128 causal fits a 99 KiB card, and
 * a device too small for any backward tile gets FA_ENOFIT with the bytes (exit 1); a window and
 * softcap on sm_90's 16-bit run on the wgmma backward, and a window that bounds nothing is
 * none. */
static void test_ctl_plan_backward(void **state)
{
	(void)state;
	char *out, *err;
	assert_int_equal(ctl("plan --arch sm_89 --dtype fp32 --head-dim 128 --causal --backward --json",
	                     &out, NULL), 0);
	assert_json(out);
	assert_non_null(strstr(out, "\"pass\": \"backward\""));
	assert_non_null(strstr(out, "\"path\": \"backward fp32 mma.sync\""));
	assert_non_null(strstr(out, "\"smem_optin_bytes\": 101376"));
	free(out);
	assert_int_equal(ctl("plan --arch sm_90 --dtype fp32 --head-dim 256 --backward", &out, NULL), 0);
	assert_non_null(strstr(out, "chosen:    bwd kv"));
	free(out);
	assert_int_equal(ctl("plan --arch sm_75 --dtype fp32 --head-dim 256 --backward", NULL, &err), 1);
	assert_non_null(strstr(err, "FA_ENOFIT: no backward tile fits"));
	assert_non_null(strstr(err, "bytes of shared memory, the device (sm_75) allows 65536"));
	free(err);
	assert_int_equal(ctl("plan --arch h200 --dtype bf16 --head-dim 128 --backward --window 1023,0 "
	                     "--softcap 30 --json", &out, NULL), 0);
	assert_json(out);
	assert_non_null(strstr(out, "\"window\": [1023, 0], \"softcap\": 30"));
	assert_non_null(strstr(out, "\"path\": \"backward sm_90a wgmma 16-bit\""));
	assert_non_null(strstr(out, "\"window_softcap_kernel\": \"attn_bwd_sm90.cu"));
	free(out);
	assert_int_equal(ctl("plan --arch h200 --dtype fp16 --head-dim 256 --backward --window 255,-1 "
	                     "--seq-q 4096 --seq-k 4096", &out, NULL), 0);
	assert_non_null(strstr(out, ", window (255, -1)\n"));
	assert_non_null(strstr(out, "served:    window: the FA_WIN specialisation of attn_bwd_sm90.cu"));
	free(out);
	assert_int_equal(ctl("plan --arch h200 --dtype bf16 --head-dim 128 --backward --window "
	                     "5000,-1 --seq-q 1000 --seq-k 1000", &out, NULL), 0);
	assert_null(strstr(out, "window"));
	free(out);
}

/* The daemon's answer to a request with head dim D (a raw request: the client library would
 * refuse it before sending). */
static fa_status daemon_head_dim(int64_t D, char *detail, size_t cap)
{
	struct fa_raw_shm shm;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	uint64_t rng = 7, rid = 0;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 16, .Sk = 16, .Hq = 1, .Hkv = 1,
	                     .D = D, .lse = true};
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_case_layout(&cs, &l);
	fa_case_args(&cs, &l, FA_RAW_BUF, &a);
	int s = fa_raw_open(g_d.url, fa_test_ms(20000));
	assert_true(s >= 0);
	uint64_t sid = fa_raw_hello(s, 1, &rep);
	assert_true(sid != 0);
	assert_int_equal(fa_raw_shm_create(&shm, l.total, &rng), 0);
	assert_int_equal(fa_raw_register(s, sid, 2, shm.name, l.total, &rid, &rep), FA_OK);
	fa_raw_fwd_req(&a, sid, 3, rid, &req);
	fa_status st = (fa_status)fa_raw_call(s, &req, &rep);
	snprintf(detail, cap, "%s", rep.detail);
	fa_raw_simple(s, FA_OP_BYE, sid, 4, &rep);
	nn_close(s);
	fa_raw_shm_destroy(&shm);
	return st;
}

static void test_ctl_plan_head_dim_512_as_the_daemon(void **state)
{
	(void)state;
	char detail[512], want[700], *out, *err;
	fa_status st = daemon_head_dim(512, detail, sizeof detail);
	assert_int_equal(st, FA_ESHAPE);
	assert_int_equal(ctl("plan --arch sm_90 --dtype fp16 --head-dim 512", NULL, &err), 1);
	snprintf(want, sizeof want, "fa-ctl: plan: %s: %s\n", fa_status_name(st), detail);
	assert_string_equal(err, want);
	free(err);
	assert_int_equal(ctl("plan --arch sm_90 --dtype fp16 --head-dim 512 --json", &out, NULL), 1);
	assert_json(out);
	snprintf(want, sizeof want, "\"status\": \"%s\"", fa_status_name(st));
	assert_non_null(strstr(out, want));
	snprintf(want, sizeof want, "\"detail\": \"%s\"", detail);
	assert_non_null(strstr(out, want));
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ctl_usage_errors_exit_2),
		cmocka_unit_test(test_ctl_unreachable_daemon_exits_1),
		cmocka_unit_test(test_ctl_version_flags_match_the_command),
		cmocka_unit_test(test_ctl_stats_and_ping_against_the_daemon),
		cmocka_unit_test(test_ctl_plan_json),
		cmocka_unit_test(test_ctl_plan_backward),
		cmocka_unit_test(test_ctl_plan_decode),
		cmocka_unit_test(test_ctl_plan_prefill),
		cmocka_unit_test(test_ctl_plan_head_dim_512_as_the_daemon),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
