/* test_metrics_file.c - the Prometheus textfile through a real daemon: off by default; with
 * --metrics-file it appears, parses as the text exposition format (checked here line by line:
 * HELP/TYPE once per family before its samples, metric and label names, histogram suffixes,
 * cumulative buckets ending at +Inf = _count, every value a number) and its counters grow with
 * requests; STATS carries p50/p99/max per op and ATTN_FWD's queue and compute time apart.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fa_integ.h"

static struct fa_daemon g_d;
static char g_prom[256];

static int setup(void **state)
{
	(void)state;
	char dir[64];
	if (fa_test_mkdir(dir, sizeof dir) != 0)
		return -1;
	/* The daemon's own directory is made by daemon_start; the file goes in a directory of its
	 * own, like node_exporter's textfile directory. */
	snprintf(g_prom, sizeof g_prom, "%s/fa.prom", dir);
	if (daemon_start(&g_d, "--metrics-file", g_prom, "--metrics-interval-ms", "50", NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	int rc = daemon_finish(&g_d);
	char dir[256];
	snprintf(dir, sizeof dir, "%s", g_prom);
	*strrchr(dir, '/') = '\0';
	fa_test_rmdir(dir);
	return rc;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return NULL;
	size_t cap = 1 << 20, n;
	char *s = calloc(1, cap + 1);
	n = fread(s, 1, cap, f);
	fclose(f);
	s[n] = '\0';
	return s;
}

static bool metric_name(const char *s, size_t n)
{
	if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
			return false;
	return true;
}

struct family {
	char name[96];
	char type[16];
	bool help, samples;
};

/* Check text against the exposition format; why gets the first problem. */
static bool prom_valid(char *text, char *why, size_t cap)
{
	static struct family fam[128];
	size_t nf = 0, lineno = 0;
	char series[256] = "";
	double last_bucket = -1;
	bool in_buckets = false;
	size_t len = strlen(text);
	if (len == 0 || text[len - 1] != '\n')
		return snprintf(why, cap, "empty, or not ended by a newline"), false;
	for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		lineno++;
		if (strncmp(l, "# HELP ", 7) == 0 || strncmp(l, "# TYPE ", 7) == 0) {
			bool help = l[2] == 'H';
			char *name = l + 7, *sp = strchr(name, ' ');
			if (sp == NULL || !metric_name(name, (size_t)(sp - name)))
				return snprintf(why, cap, "line %zu: bad name in %s", lineno, l), false;
			*sp = '\0';
			struct family *f = NULL;
			for (size_t i = 0; i < nf; i++)
				if (strcmp(fam[i].name, name) == 0)
					f = &fam[i];
			if (f == NULL) {
				f = &fam[nf++];
				memset(f, 0, sizeof *f);
				snprintf(f->name, sizeof f->name, "%s", name);
			}
			if (f->samples)
				return snprintf(why, cap, "line %zu: %s after its samples", lineno, name), false;
			if (help) {
				if (f->help)
					return snprintf(why, cap, "line %zu: second HELP", lineno), false;
				f->help = true;
			} else {
				const char *t = sp + 1;
				if (f->type[0])
					return snprintf(why, cap, "line %zu: second TYPE", lineno), false;
				if (strcmp(t, "counter") && strcmp(t, "gauge") && strcmp(t, "histogram") &&
				    strcmp(t, "summary") && strcmp(t, "untyped"))
					return snprintf(why, cap, "line %zu: type %s", lineno, t), false;
				snprintf(f->type, sizeof f->type, "%s", t);
			}
			continue;
		}
		if (l[0] == '#')
			continue; /* a comment */
		/* A sample: name[{labels}] value */
		size_t n = strcspn(l, "{ ");
		if (!metric_name(l, n))
			return snprintf(why, cap, "line %zu: bad metric name: %s", lineno, l), false;
		char name[96];
		snprintf(name, sizeof name, "%.*s", (int)n, l);
		char *p = l + n, le[32] = "";
		char labels[256] = "";
		if (*p == '{') {
			char *end = strchr(p, '}');
			if (end == NULL)
				return snprintf(why, cap, "line %zu: unclosed labels", lineno), false;
			/* name="value" pairs, values with \\ \" \n escapes */
			for (char *q = p + 1; q < end;) {
				size_t ln = strcspn(q, "=");
				if (!metric_name(q, ln) || q[ln + 1] != '"')
					return snprintf(why, cap, "line %zu: bad label", lineno), false;
				bool is_le = ln == 2 && strncmp(q, "le", 2) == 0;
				char *v = q + ln + 2;
				size_t k = 0;
				for (; *v && *v != '"'; v++) {
					if (*v == '\\') {
						v++;
						if (*v != '\\' && *v != '"' && *v != 'n')
							return snprintf(why, cap, "line %zu: bad escape", lineno), false;
					}
					if (is_le && k + 1 < sizeof le)
						le[k++] = *v;
				}
				if (is_le)
					le[k] = '\0';
				else
					snprintf(labels + strlen(labels), sizeof labels - strlen(labels), "%.*s|",
					         (int)(v - q), q);
				if (*v != '"')
					return snprintf(why, cap, "line %zu: unclosed value", lineno), false;
				q = v + 1;
				if (*q == ',')
					q++;
			}
			p = end + 1;
		}
		if (*p != ' ')
			return snprintf(why, cap, "line %zu: no value", lineno), false;
		char *endv;
		double val = strtod(p + 1, &endv);
		if (endv == p + 1 || *endv != '\0')
			return snprintf(why, cap, "line %zu: value not a number: %s", lineno, p), false;
		/* Its family: the name itself, or a histogram's base. */
		struct family *f = NULL;
		const char *suffix = "";
		for (size_t i = 0; i < nf && !f; i++) {
			size_t fl = strlen(fam[i].name);
			if (strcmp(fam[i].name, name) == 0)
				f = &fam[i];
			else if (strcmp(fam[i].type, "histogram") == 0 && strncmp(name, fam[i].name, fl) == 0 &&
			         (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
			          !strcmp(name + fl, "_count")))
				f = &fam[i], suffix = name + fl;
		}
		if (f == NULL || !f->type[0] || !f->help)
			return snprintf(why, cap, "line %zu: %s without HELP and TYPE first", lineno, name),
			       false;
		f->samples = true;
		if (strcmp(f->type, "histogram") == 0) {
			if (suffix[0] == '\0')
				return snprintf(why, cap, "line %zu: histogram sample without suffix", lineno), false;
			if (!strcmp(suffix, "_bucket")) {
				if (le[0] == '\0')
					return snprintf(why, cap, "line %zu: bucket without le", lineno), false;
				if (!in_buckets || strcmp(series, labels) != 0) {
					snprintf(series, sizeof series, "%s", labels);
					last_bucket = -1;
				}
				in_buckets = true;
				if (val < last_bucket)
					return snprintf(why, cap, "line %zu: buckets not cumulative", lineno), false;
				last_bucket = strcmp(le, "+Inf") == 0 ? -2 - val : val;
			} else if (!strcmp(suffix, "_count")) {
				if (last_bucket > -2 || -2 - last_bucket != val)
					return snprintf(why, cap, "line %zu: _count is not the +Inf bucket", lineno),
					       false;
				in_buckets = false;
			}
		}
	}
	return true;
}

/* The value of the sample line that starts with `prefix` and a space; NAN when absent. */
static double prom_value(const char *text, const char *prefix)
{
	size_t n = strlen(prefix);
	for (const char *p = text; p; p = strchr(p, '\n'), p = p ? p + 1 : p)
		if (strncmp(p, prefix, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return NAN;
}

/* Wait until the file's sample `prefix` is at least want; returns the file's text (free it). */
static char *wait_value(const char *prefix, double want)
{
	uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	for (;;) {
		char *t = slurp(g_prom);
		if (t != NULL && prom_value(t, prefix) >= want)
			return t;
		free(t);
		if (fa_test_now_ms() > end)
			return NULL;
		fa_test_sleep_ms(20);
	}
}

static void test_metrics_file_is_off_by_default(void **state)
{
	(void)state;
	struct fa_daemon d = {0};
	assert_int_equal(daemon_start(&d, NULL), 0);
	/* One round trip first: main.c sends READY=1 (in server_open) before it watches SIGTERM,
	 * so a SIGTERM right after READY kills it (exit 143). Answering means the loop runs, and
	 * the signals are watched by then. */
	static char st[16384];
	assert_int_equal(fa_integ_stats(d.url, st, sizeof st), FA_OK);
	assert_true(daemon_log_contains(&d, "metrics-file=\"\""));
	assert_false(daemon_log_contains(&d, "metrics: writing"));
	assert_int_equal(daemon_finish(&d), 0);
}

static void test_metrics_file_parses_and_grows_with_requests(void **state)
{
	(void)state;
	char why[256];
	char *t = wait_value("fa_up", 1);
	assert_non_null(t);
	char *copy = strdup(t);
	if (!prom_valid(copy, why, sizeof why))
		fail_msg("the first file: %s", why);
	free(copy);
	double before = prom_value(t, "fa_requests_total");
	free(t);

	/* 20 forward passes and 20 pings through a client. */
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 64, .Sk = 64, .Hq = 2, .Hkv = 2,
	                     .D = 32, .mask = FA_MASK_NONE};
	fa_buffer *buf = NULL;
	uint64_t rng = 5;
	for (int i = 0; i < 20; i++) {
		assert_true(fa_integ_run_case(c, &buf, &cs, &rng, NULL, NULL, why, sizeof why));
		assert_int_equal(fa_ping(c), FA_OK);
	}
	/* STATS: per op p50 <= p99 <= max, ATTN_FWD's queue and compute apart. */
	static char st[16384];
	assert_int_equal(fa_stats(c, st, sizeof st), FA_OK);
	static const char *const keys[] = {"latency_attn_fwd", "latency_ping", "fwd_queue",
	                                   "fwd_compute"};
	for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
		char k[64], v[32];
		uint64_t count;
		snprintf(k, sizeof k, "%s_count", keys[i]);
		assert_true(fa_stats_u64(st, k, &count));
		assert_true(count >= 20);
		double q[3];
		static const char *const sfx[] = {"p50_us", "p99_us", "max_us"};
		for (int j = 0; j < 3; j++) {
			snprintf(k, sizeof k, "%s_%s", keys[i], sfx[j]);
			assert_true(fa_stats_get(st, k, v, sizeof v));
			q[j] = atof(v);
		}
		printf("  %s: p50 %.1f us, p99 %.1f us, max %.1f us\n", keys[i], q[0], q[1], q[2]);
		assert_true(q[0] <= q[1] && q[1] <= q[2] && q[2] > 0);
	}
	fa_buffer_free(buf);
	fa_client_close(c);

	t = wait_value("fa_fwd_total", 20);
	assert_non_null(t);
	copy = strdup(t);
	if (!prom_valid(copy, why, sizeof why))
		fail_msg("after requests: %s", why);
	free(copy);
	assert_true(prom_value(t, "fa_requests_total") >= before + 40);
	assert_true(prom_value(t, "fa_request_duration_seconds_count{op=\"ATTN_FWD\"}") >= 20);
	assert_true(prom_value(t, "fa_request_duration_seconds_bucket{op=\"ATTN_FWD\",le=\"+Inf\"}") >= 20);
	assert_true(prom_value(t, "fa_fwd_queue_seconds_count") >= 20);
	assert_true(prom_value(t, "fa_fwd_compute_seconds_sum") > 0);
	assert_true(prom_value(t, "fa_fwd_compute_seconds_total") > 0);
	free(t);
	/* No temporary file is left beside it. */
	char tmp[300];
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", g_prom, (int)g_d.pid);
	struct stat sb;
	assert_int_not_equal(stat(tmp, &sb), 0);
}

/* The checker itself refuses what the format forbids (so a pass above means something). */
static void test_metrics_file_checker_refuses_bad_text(void **state)
{
	(void)state;
	static const char *const bad[] = {
		"fa_x 1\n",                                              /* no HELP/TYPE */
		"# HELP fa_x h\n# TYPE fa_x gauge\nfa_x one\n",          /* not a number */
		"# HELP fa_x h\n# TYPE fa_x gauge\nfa-x 1\n",            /* bad name */
		"# HELP fa_x h\n# TYPE fa_x gauge\nfa_x 1\n# TYPE fa_x gauge\n",
		"# HELP h h\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
		"h_sum 1\nh_count 1\n",                                  /* not cumulative */
		"# HELP h h\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n",
		"# HELP fa_x h\n# TYPE fa_x gauge\nfa_x 1",              /* no final newline */
	};
	char why[256];
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *c = strdup(bad[i]);
		if (prom_valid(c, why, sizeof why))
			fail_msg("case %zu passed", i);
		free(c);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_metrics_file_checker_refuses_bad_text),
		cmocka_unit_test(test_metrics_file_is_off_by_default),
		cmocka_unit_test(test_metrics_file_parses_and_grows_with_requests),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
