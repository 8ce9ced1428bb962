/* test_metrics.c - daemon/metrics.c: bucket edges, quantiles within the histogram's 1/16 of the
 * exact ones, max exact, series names and limits, the STATS lines, the Prometheus text (one
 * HELP and TYPE per family, cumulative buckets ending at +Inf = _count, exact counts at the
 * power-of-two edges), and the atomic file write.
 */
#include <errno.h>
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

#include "fa_test.h"
#include "metrics.h"

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static void test_metrics_buckets_tile_the_values(void **state)
{
	(void)state;
	/* Every value falls in the bucket whose range holds it; ranges are contiguous. */
	for (unsigned i = 0; i + 1 < METRICS_BUCKETS; i++)
		assert_true(metrics_bucket_low(i) < metrics_bucket_low(i + 1));
	uint64_t rng = 7;
	for (int i = 0; i < 200000; i++) {
		uint64_t v = fa_rand_next(&rng) >> (fa_rand_next(&rng) % 64);
		unsigned b = metrics_bucket_of(v);
		assert_true(b < METRICS_BUCKETS);
		assert_true(metrics_bucket_low(b) <= v);
		if (b + 1 < METRICS_BUCKETS)
			assert_true(v < metrics_bucket_low(b + 1));
	}
	for (uint64_t v = 0; v < 16; v++)
		assert_int_equal(metrics_bucket_of(v), v); /* small values exactly */
	for (unsigned k = 4; k < 64; k++) /* powers of two start buckets (the Prometheus edges) */
		assert_int_equal(metrics_bucket_low(metrics_bucket_of(UINT64_C(1) << k)),
		                 UINT64_C(1) << k);
	assert_int_equal(metrics_bucket_of(UINT64_MAX), METRICS_BUCKETS - 1);
}

static void test_metrics_quantiles_are_within_a_sixteenth(void **state)
{
	(void)state;
	enum { N = 20000 };
	static uint64_t v[N];
	struct metrics_hist h;
	metrics_hist_init(&h);
	assert_int_equal(metrics_hist_quantile(&h, 0.5), 0);
	uint64_t rng = 99;
	for (int i = 0; i < N; i++) {
		/* log-uniform from 1 us to 1 s, like request latencies */
		v[i] = (uint64_t)(1e3 * pow(10.0, 6.0 * fa_rand_uniform(&rng)));
		metrics_hist_record(&h, v[i]);
	}
	qsort(v, N, sizeof v[0], cmp_u64);
	static const double qs[] = {0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 0.999};
	for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
		size_t rank = (size_t)ceil(qs[i] * N);
		uint64_t exact = v[rank == 0 ? 0 : rank - 1];
		uint64_t got = metrics_hist_quantile(&h, qs[i]);
		double rel = fabs((double)got - (double)exact) / (double)exact;
		if (rel > 1.0 / 16)
			fail_msg("q %.3f: %llu against %llu (%.3f)", qs[i], (unsigned long long)got,
			         (unsigned long long)exact, rel);
	}
	assert_int_equal(metrics_hist_quantile(&h, 1.0), v[N - 1]); /* max exact */
	assert_int_equal(h.max_ns, v[N - 1]);
	assert_int_equal(h.min_ns, v[0]);
	assert_int_equal(h.count, N);
	/* One value: every quantile is that value (clamped to min and max). */
	metrics_hist_init(&h);
	metrics_hist_record(&h, 123456);
	assert_int_equal(metrics_hist_quantile(&h, 0.5), 123456);
	assert_int_equal(metrics_hist_quantile(&h, 0.99), 123456);
}

static void test_metrics_series_are_found_added_and_bounded(void **state)
{
	(void)state;
	static struct metrics m;
	metrics_init(&m);
	struct metrics_hist *a = metrics_series(&m, "latency_ping", "fa_request_duration_seconds",
	                                        "op", "PING", "help");
	assert_non_null(a);
	assert_ptr_equal(metrics_series(&m, "latency_ping", "x", "", "", "h"), a);
	/* Names the exposition format would not take. */
	assert_null(metrics_series(&m, "Bad-Key", "fa_x", "", "", "h"));
	assert_null(metrics_series(&m, "k1", "9fa", "", "", "h"));
	assert_null(metrics_series(&m, "k2", "fa_x", "Op", "v", "h"));
	assert_int_equal(m.n, 1);
	char key[32];
	for (unsigned i = 1; i < METRICS_MAX_SERIES; i++) {
		snprintf(key, sizeof key, "k%u", i);
		assert_non_null(metrics_series(&m, key, "fa_x_seconds", "class", key, "h"));
	}
	assert_null(metrics_series(&m, "one_more", "fa_x_seconds", "", "", "h")); /* full */
}

static void test_metrics_stats_text_has_count_p50_p99_max(void **state)
{
	(void)state;
	static struct metrics m;
	metrics_init(&m);
	struct metrics_hist *h = metrics_series(&m, "fwd_queue", "fa_fwd_queue_seconds", "", "", "");
	metrics_series(&m, "unused", "fa_unused_seconds", "", "", ""); /* empty: not shown */
	for (int i = 1; i <= 100; i++)
		metrics_hist_record(h, (uint64_t)i * 1000);
	char buf[1024];
	metrics_stats_text(&m, buf, sizeof buf);
	assert_non_null(strstr(buf, "# latency\n"));
	assert_non_null(strstr(buf, "fwd_queue_count:100\n"));
	assert_non_null(strstr(buf, "fwd_queue_max_us:100.0\n"));
	assert_non_null(strstr(buf, "fwd_queue_sum_us:5050\n")); /* 1 + 2 + ... + 100 us */
	assert_null(strstr(buf, "unused"));
	double p50 = atof(strstr(buf, "fwd_queue_p50_us:") + 17);
	double p99 = atof(strstr(buf, "fwd_queue_p99_us:") + 17);
	assert_true(fabs(p50 - 50.0) <= 50.0 / 16);
	assert_true(fabs(p99 - 99.0) <= 99.0 / 16);
	/* Cut at a whole line when it does not fit. */
	size_t n = metrics_stats_text(&m, buf, 40);
	assert_true(n < 40);
	assert_true(n == 0 || buf[n - 1] == '\n');
}

static void test_metrics_prometheus_text_follows_the_format(void **state)
{
	(void)state;
	static struct metrics m;
	static char buf[1 << 16];
	metrics_init(&m);
	struct metrics_hist *a = metrics_series(&m, "latency_ping", "fa_request_duration_seconds",
	                                        "op", "PING", "by op");
	metrics_series(&m, "fwd_compute", "fa_fwd_compute_seconds", "", "", "compute\\time");
	struct metrics_hist *b = metrics_series(&m, "latency_stats", "fa_request_duration_seconds",
	                                        "op", "ST\"A\\TS", "by op");
	metrics_hist_record(a, 1000);        /* below the first edge (1.024 us) */
	metrics_hist_record(a, 2048);        /* exactly an edge: counted above it (le is < here) */
	metrics_hist_record(a, 3000000000u); /* 3 s */
	metrics_hist_record(b, 5000);
	struct metrics_value v[] = {{"fa_up", "gauge", "up", 1},
	                            {"fa_requests_total", "counter", "all", 42}};
	size_t n = metrics_prometheus(&m, v, 2, buf, sizeof buf);
	assert_true(n > 0 && n == strlen(buf) && buf[n - 1] == '\n');
	/* One HELP and one TYPE per family, before its samples. */
	const char *t = strstr(buf, "# TYPE fa_request_duration_seconds histogram\n");
	assert_non_null(t);
	assert_null(strstr(t + 1, "# TYPE fa_request_duration_seconds"));
	assert_true(strstr(buf, "fa_request_duration_seconds_bucket") > t);
	assert_non_null(strstr(buf, "# HELP fa_fwd_compute_seconds compute\\\\time\n"));
	assert_non_null(strstr(buf, "fa_up 1\n"));
	assert_non_null(strstr(buf, "# TYPE fa_requests_total counter\nfa_requests_total 42\n"));
	assert_non_null(strstr(buf, "fa_request_duration_seconds_bucket{op=\"PING\",le=\"1.024e-06\"} 1\n"));
	assert_non_null(strstr(buf, "fa_request_duration_seconds_bucket{op=\"PING\",le=\"2.048e-06\"} 1\n"));
	assert_non_null(strstr(buf, "fa_request_duration_seconds_bucket{op=\"PING\",le=\"4.096e-06\"} 2\n"));
	assert_non_null(strstr(buf, "fa_request_duration_seconds_bucket{op=\"PING\",le=\"+Inf\"} 3\n"));
	assert_non_null(strstr(buf, "fa_request_duration_seconds_count{op=\"PING\"} 3\n"));
	assert_non_null(strstr(buf, "fa_request_duration_seconds_sum{op=\"PING\"} 3.000003048\n"));
	assert_non_null(strstr(buf, "{op=\"ST\\\"A\\\\TS\",le=\"+Inf\"} 1\n")); /* escaped */
	assert_non_null(strstr(buf, "fa_fwd_compute_seconds_bucket{le=\"+Inf\"} 0\n"));
	assert_non_null(strstr(buf, "fa_fwd_compute_seconds_count 0\n"));
	/* Buckets are cumulative: never decreasing within a series. */
	unsigned long long last = 0;
	const char *want = "fa_request_duration_seconds_bucket{op=\"PING\",";
	for (const char *p = buf; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p ? p + 1 : p) {
		if (strncmp(p, want, strlen(want)) != 0)
			continue;
		unsigned long long c = strtoull(strchr(p, ' ') + 1, NULL, 10);
		assert_true(c >= last);
		last = c;
	}
	assert_int_equal(last, 3);
	/* Too small a buffer: 0, never a partial text. */
	assert_int_equal(metrics_prometheus(&m, v, 2, buf, 100), 0);
}

static void test_metrics_file_is_replaced_whole(void **state)
{
	(void)state;
	char dir[64], path[128], tmp[160];
	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);
	snprintf(path, sizeof path, "%s/fa.prom", dir);
	assert_int_equal(metrics_write_file(path, "a 1\n", 4), 0);
	assert_int_equal(metrics_write_file(path, "b 2\n", 4), 0);
	FILE *f = fopen(path, "r");
	char got[16] = {0};
	assert_non_null(f);
	assert_int_equal(fread(got, 1, sizeof got - 1, f), 4);
	fclose(f);
	assert_string_equal(got, "b 2\n");
	struct stat sb;
	assert_int_equal(stat(path, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0644);
	snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
	assert_int_not_equal(stat(tmp, &sb), 0); /* no temporary left */
	/* A directory that does not exist: -1 with errno, nothing created. */
	snprintf(path, sizeof path, "%s/no/such/fa.prom", dir);
	errno = 0;
	assert_int_equal(metrics_write_file(path, "x\n", 2), -1);
	assert_int_equal(errno, ENOENT);
	fa_test_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_metrics_buckets_tile_the_values),
		cmocka_unit_test(test_metrics_quantiles_are_within_a_sixteenth),
		cmocka_unit_test(test_metrics_series_are_found_added_and_bounded),
		cmocka_unit_test(test_metrics_stats_text_has_count_p50_p99_max),
		cmocka_unit_test(test_metrics_prometheus_text_follows_the_format),
		cmocka_unit_test(test_metrics_file_is_replaced_whole),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
