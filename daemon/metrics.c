/* metrics.c - fixed-memory latency histograms and their texts; see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Prometheus buckets: le = 2^k ns for k in this range (1.024 us .. 68.7 s), then +Inf. */
#define PROM_LE_FIRST 10
#define PROM_LE_LAST 36

void metrics_hist_init(struct metrics_hist *h)
{
	memset(h, 0, sizeof *h);
}

unsigned metrics_bucket_of(uint64_t ns)
{
	if (ns < METRICS_SUB)
		return (unsigned)ns;
	unsigned e = 63u - (unsigned)__builtin_clzll(ns); /* >= METRICS_SUB_BITS */
	unsigned shift = e - METRICS_SUB_BITS;
	unsigned m = (unsigned)(ns >> shift); /* in [SUB, 2 SUB) */
	return (shift + 1u) * METRICS_SUB + (m - METRICS_SUB);
}

uint64_t metrics_bucket_low(unsigned idx)
{
	if (idx < METRICS_SUB)
		return idx;
	unsigned shift = idx / METRICS_SUB - 1u;
	uint64_t m = METRICS_SUB + idx % METRICS_SUB;
	return m << shift;
}

/* One past the highest value of a bucket (saturating at the top). */
static uint64_t bucket_end(unsigned idx)
{
	if (idx + 1 >= METRICS_BUCKETS)
		return UINT64_MAX;
	return metrics_bucket_low(idx + 1);
}

void metrics_hist_record(struct metrics_hist *h, uint64_t ns)
{
	if (h->count == 0 || ns < h->min_ns)
		h->min_ns = ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
	h->count++;
	h->sum_ns += ns;
	h->bucket[metrics_bucket_of(ns)]++;
}

uint64_t metrics_hist_quantile(const struct metrics_hist *h, double q)
{
	if (h->count == 0)
		return 0;
	if (q >= 1.0)
		return h->max_ns;
	if (q < 0)
		q = 0;
	/* The rank of the value at q, 1-based: the smallest r with r >= q * count. */
	uint64_t rank = (uint64_t)(q * (double)h->count);
	if ((double)rank < q * (double)h->count)
		rank++;
	if (rank == 0)
		rank = 1;
	uint64_t seen = 0;
	for (unsigned i = 0; i < METRICS_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= rank) {
			uint64_t lo = metrics_bucket_low(i), hi = bucket_end(i) - 1;
			uint64_t mid = lo + (hi - lo) / 2;
			if (mid < h->min_ns)
				mid = h->min_ns;
			if (mid > h->max_ns)
				mid = h->max_ns;
			return mid;
		}
	}
	return h->max_ns;
}

void metrics_init(struct metrics *m)
{
	m->n = 0;
	memset(m->memo, 0, sizeof m->memo);
}

/* [a-z0-9_]+, shorter than METRICS_NAME_MAX; a letter first when `letter`. */
static bool name_ok(const char *s, bool letter)
{
	size_t n = strlen(s);
	if (n == 0 || n >= METRICS_NAME_MAX || (letter && !(s[0] >= 'a' && s[0] <= 'z')))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return false;
	return true;
}

struct metrics_hist *metrics_series(struct metrics *m, const char *key, const char *family,
                                    const char *label, const char *value, const char *help)
{
	for (unsigned i = 0; i < m->n; i++)
		if (strcmp(m->s[i].key, key) == 0)
			return &m->s[i].h;
	if (m->n >= METRICS_MAX_SERIES || !name_ok(key, false) || !name_ok(family, true) ||
	    (label[0] != '\0' && (!name_ok(label, true) || value == NULL ||
	                          strlen(value) >= METRICS_NAME_MAX)))
		return NULL;
	struct metrics_series *s = &m->s[m->n++];
	snprintf(s->key, sizeof s->key, "%s", key);
	snprintf(s->family, sizeof s->family, "%s", family);
	snprintf(s->label, sizeof s->label, "%s", label);
	snprintf(s->value, sizeof s->value, "%s", label[0] ? value : "");
	s->help = help ? help : "";
	metrics_hist_init(&s->h);
	return &s->h;
}

struct metrics_hist *metrics_series_memo(struct metrics *m, unsigned id, const char *key,
                                         const char *family, const char *label,
                                         const char *value, const char *help)
{
	struct metrics_hist *h = metrics_series(m, key, family, label, value, help);
	if (id < METRICS_MEMO)
		m->memo[id] = h;
	return h;
}

struct out {
	char *p;
	size_t cap, len;
	bool full;
};

__attribute__((format(printf, 2, 3))) static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	if (o->full)
		return;
	va_start(ap, fmt);
	int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= o->cap - o->len) {
		o->full = true;
		o->p[o->len] = '\0'; /* cut at the last whole line */
		return;
	}
	o->len += (size_t)n;
}

size_t metrics_stats_text(const struct metrics *m, char *buf, size_t cap)
{
	struct out o = {buf, cap, 0, cap == 0};
	if (cap == 0)
		return 0;
	buf[0] = '\0';
	put(&o, "# latency\n");
	for (unsigned i = 0; i < m->n; i++) {
		const struct metrics_series *s = &m->s[i];
		if (s->h.count == 0)
			continue;
		put(&o, "%s_count:%" PRIu64 "\n", s->key, s->h.count);
		put(&o, "%s_p50_us:%.1f\n", s->key, 1e-3 * (double)metrics_hist_quantile(&s->h, 0.5));
		put(&o, "%s_p99_us:%.1f\n", s->key, 1e-3 * (double)metrics_hist_quantile(&s->h, 0.99));
		put(&o, "%s_max_us:%.1f\n", s->key, 1e-3 * (double)s->h.max_ns);
		/* the total, for means over a window (two readings' difference) */
		put(&o, "%s_sum_us:%" PRIu64 "\n", s->key, s->h.sum_ns / 1000u);
	}
	return o.len;
}

/* A label value in the exposition format: backslash, double quote and newline escaped. */
static void put_label_value(struct out *o, const char *v)
{
	for (; *v != '\0'; v++) {
		if (*v == '\\' || *v == '"')
			put(o, "\\%c", *v);
		else if (*v == '\n')
			put(o, "\\n");
		else
			put(o, "%c", *v);
	}
}

/* HELP text: backslash and newline escaped. */
static void put_help(struct out *o, const char *name, const char *help)
{
	put(o, "# HELP %s ", name);
	for (; *help != '\0'; help++) {
		if (*help == '\\')
			put(o, "\\\\");
		else if (*help == '\n')
			put(o, "\\n");
		else
			put(o, "%c", *help);
	}
	put(o, "\n");
}

/* '{label="value",' or '{' (for a le to follow), or "" with no label and no le. */
static void put_labels(struct out *o, const struct metrics_series *s, const char *le)
{
	if (s->label[0] == '\0' && le == NULL)
		return;
	put(o, "{");
	if (s->label[0] != '\0') {
		put(o, "%s=\"", s->label);
		put_label_value(o, s->value);
		put(o, "\"%s", le ? "," : "");
	}
	if (le != NULL)
		put(o, "le=\"%s\"", le);
	put(o, "}");
}

size_t metrics_prometheus(const struct metrics *m, const struct metrics_value *v, size_t nv,
                          char *buf, size_t cap)
{
	struct out o = {buf, cap, 0, cap == 0};
	if (cap == 0)
		return 0;
	for (size_t i = 0; i < nv; i++) {
		put_help(&o, v[i].name, v[i].help);
		put(&o, "# TYPE %s %s\n", v[i].name, v[i].type);
		put(&o, "%s %.17g\n", v[i].name, v[i].value);
	}
	for (unsigned i = 0; i < m->n; i++) {
		const struct metrics_series *s = &m->s[i];
		bool first = true;
		for (unsigned j = 0; j < i; j++)
			if (strcmp(m->s[j].family, s->family) == 0)
				first = false;
		if (!first)
			continue;
		/* Every series of the family together, under one HELP and TYPE. */
		put_help(&o, s->family, s->help);
		put(&o, "# TYPE %s histogram\n", s->family);
		for (unsigned j = i; j < m->n; j++) {
			const struct metrics_series *t = &m->s[j];
			if (strcmp(t->family, s->family) != 0)
				continue;
			uint64_t cum = 0;
			unsigned b = 0;
			for (unsigned k = PROM_LE_FIRST; k <= PROM_LE_LAST; k++) {
				uint64_t edge = UINT64_C(1) << k;
				for (; b < METRICS_BUCKETS && metrics_bucket_low(b) < edge; b++)
					cum += t->h.bucket[b];
				char le[32];
				snprintf(le, sizeof le, "%.9g", (double)edge * 1e-9);
				put(&o, "%s_bucket", t->family);
				put_labels(&o, t, le);
				put(&o, " %" PRIu64 "\n", cum);
			}
			put(&o, "%s_bucket", t->family);
			put_labels(&o, t, "+Inf");
			put(&o, " %" PRIu64 "\n", t->h.count);
			put(&o, "%s_sum", t->family);
			put_labels(&o, t, NULL);
			/* Exact: whole seconds and nanoseconds, not a rounded double. */
			put(&o, " %" PRIu64 ".%09" PRIu64 "\n", t->h.sum_ns / 1000000000u,
			    t->h.sum_ns % 1000000000u);
			put(&o, "%s_count", t->family);
			put_labels(&o, t, NULL);
			put(&o, " %" PRIu64 "\n", t->h.count);
		}
	}
	return o.full ? 0 : o.len;
}

int metrics_write_file(const char *path, const char *buf, size_t len)
{
	char tmp[4200];
	if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
		errno = ENAMETOOLONG;
		return -1;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	size_t off = 0;
	while (off < len) {
		ssize_t n = write(fd, buf + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			goto fail;
		off += (size_t)n;
	}
	/* No fsync: the rename alone makes the swap atomic for readers, and an fsync on the loop
	 * thread could stall every client for a disk's flush; after a crash the file is rewritten
	 * within one interval anyway. */
	if (close(fd) != 0) {
		fd = -1;
		goto fail;
	}
	fd = -1;
	if (rename(tmp, path) != 0)
		goto fail;
	return 0;
fail: {
	int e = errno;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	errno = e;
	return -1;
}
}
