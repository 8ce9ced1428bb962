/* metrics.h - latency histograms of fixed memory, and their two texts: the STATS "# latency"
 * section (p50, p99, max per series) and the Prometheus text exposition format (written for
 * node_exporter's textfile collector by metrics_file.c).
 *
 * A histogram is HdrHistogram-like, log-linear: values (nanoseconds) below 16 have a bucket
 * each, above that every power of two is split into 16 equal buckets, so a quantile read from it
 * is within 1/16 (6.25%) of the true value, max is exact, and the memory is fixed (976 counters,
 * 7.8 KiB) whatever is recorded. Powers of two are bucket edges, which is what the Prometheus
 * buckets use (le = 2^k ns), so those counts are exact.
 *
 * Series: a histogram with a name for STATS ("fwd_queue") and a Prometheus family and label
 * ("fa_fwd_queue_seconds", class="batch"); up to METRICS_MAX_SERIES per struct metrics, found or
 * added by metrics_series(). The daemon records per-op request latency, and ATTN_FWD's queue
 * and compute time apart (dispatch.c); other parts add their own series the same way (per
 * priority class queue time, say).
 *
 * Threads: no locks. Record and read on one thread (the loop thread), or own the struct. */
#ifndef FA_DAEMON_METRICS_H
#define FA_DAEMON_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_SUB_BITS 4
#define METRICS_SUB (1u << METRICS_SUB_BITS)                 /* buckets per power of two */
#define METRICS_BUCKETS ((64 - METRICS_SUB_BITS + 1) * METRICS_SUB) /* 976 */
#define METRICS_MAX_SERIES 32
#define METRICS_NAME_MAX 48

struct metrics_hist {
	uint64_t count;
	uint64_t sum_ns;  /* wraps after 584 years of recorded time */
	uint64_t min_ns, max_ns;
	uint64_t bucket[METRICS_BUCKETS];
};

struct metrics_series {
	char key[METRICS_NAME_MAX];      /* STATS key prefix: "latency_attn_fwd" */
	char family[METRICS_NAME_MAX];   /* Prometheus metric family: "fa_request_duration_seconds" */
	char label[METRICS_NAME_MAX];    /* label name ("op"), "" for none */
	char value[METRICS_NAME_MAX];    /* label value ("ATTN_FWD") */
	const char *help;                /* static text for # HELP */
	struct metrics_hist h;
};

#define METRICS_MEMO 72 /* caller-numbered slots of metrics_series_memo */

struct metrics {
	unsigned n;
	struct metrics_series s[METRICS_MAX_SERIES];
	struct metrics_hist *memo[METRICS_MEMO]; /* metrics_series_memo's, NULL: not looked up */
};

/* An empty histogram. */
void metrics_hist_init(struct metrics_hist *h);

/* Count one value (ns). */
void metrics_hist_record(struct metrics_hist *h, uint64_t ns);

/* The value at quantile q (0..1) of what was recorded: the middle of its bucket, within the
 * recorded min and max (q = 1 gives max exactly). 0 when empty. */
uint64_t metrics_hist_quantile(const struct metrics_hist *h, double q);

/* Bucket index of a value, and the lowest value of a bucket (exposed for the tests). */
unsigned metrics_bucket_of(uint64_t ns);
uint64_t metrics_bucket_low(unsigned idx);

/* No series. */
void metrics_init(struct metrics *m);

/* The series with this STATS key, added (empty) when new. key and family must be metric-name
 * characters ([a-z0-9_], family starting with a letter), label a label name or "" (value then
 * ignored), all shorter than METRICS_NAME_MAX; help is static. Returns the series' histogram,
 * or NULL when m is full or a name is invalid (nothing added). */
struct metrics_hist *metrics_series(struct metrics *m, const char *key, const char *family,
                                    const char *label, const char *value, const char *help);

/* The per-request recorders' shortcut past metrics_series' name compares (about a thousand
 * instructions a request, 2026-12-03): a series' histogram looked up once and kept in a slot
 * `id` < METRICS_MEMO that the caller numbers. metrics_memo_get: the kept one, NULL when none
 * yet or id is out of range; metrics_series_memo: metrics_series, its result kept in slot id. */
static inline struct metrics_hist *metrics_memo_get(const struct metrics *m, unsigned id)
{
	return id < METRICS_MEMO ? m->memo[id] : NULL;
}

struct metrics_hist *metrics_series_memo(struct metrics *m, unsigned id, const char *key,
                                         const char *family, const char *label,
                                         const char *value, const char *help);

/* The STATS lines of every series with a count: "<key>_count:N", "<key>_p50_us:X",
 * "<key>_p99_us:X", "<key>_max_us:X" (microseconds, one decimal), under "# latency". Returns the
 * length written into buf (cap incl. NUL; truncated at a line). */
size_t metrics_stats_text(const struct metrics *m, char *buf, size_t cap);

/* A counter or gauge for the Prometheus text. */
struct metrics_value {
	const char *name;  /* metric name; counters end in _total */
	const char *type;  /* "counter" or "gauge" */
	const char *help;
	double value;
};

/* The Prometheus text exposition format (version 0.0.4): the values, then every series as a
 * histogram (one # HELP and # TYPE per family; buckets le = 2^k ns from 1.024 us to 68.7 s in
 * seconds, cumulative, then +Inf; _sum in seconds; _count). Returns the length written, or 0
 * when it does not fit in cap (nothing partial is ever meant to be written to a file). */
size_t metrics_prometheus(const struct metrics *m, const struct metrics_value *v, size_t nv,
                          char *buf, size_t cap);

/* Write len bytes to path atomically: a temporary file beside it ("<path>.tmp.<pid>", mode
 * 0644; node_exporter reads only *.prom), renamed over path, so a reader (node_exporter) sees the old file or the new
 * one, never half of one. Returns 0, or -1 with errno set (the temporary file removed). */
int metrics_write_file(const char *path, const char *buf, size_t len);

#endif /* FA_DAEMON_METRICS_H */
