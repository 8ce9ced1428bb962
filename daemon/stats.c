/* stats.c - the STATS text. */
#include "stats.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "fa_proto.h"

struct stats_buf {
	char *p;
	size_t cap, len;
};

__attribute__((format(printf, 2, 3))) static void stats_put(struct stats_buf *b, const char *fmt,
                                                            ...)
{
	va_list ap;

	if (b->len + 1 >= b->cap)
		return;
	va_start(ap, fmt);
	int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	b->len += (size_t)n;
	if (b->len >= b->cap)
		b->len = b->cap - 1; /* truncated */
}

/* The STATS text; see stats.h for what each key counts. */
size_t stats_format(const struct stats *s, const struct stats_info *in, char *buf, size_t cap)
{
	struct stats_buf b = {buf, cap, 0};

	if (cap == 0)
		return 0;
	buf[0] = '\0';
	stats_put(&b, "# server\n");
	stats_put(&b, "version:%s\n", in->version);
	stats_put(&b, "proto:%d\n", FA_PROTO_VERSION);
	stats_put(&b, "epoch:%016" PRIx64 "\n", in->epoch);
	stats_put(&b, "pid:%ld\n", in->pid);
	stats_put(&b, "uptime_s:%" PRIu64 "\n", in->uptime_s);
	stats_put(&b, "backend:%s\n", in->backend);
	stats_put(&b, "threads:%u\n", in->threads);
	stats_put(&b, "# clients\n");
	stats_put(&b, "sessions:%u\n", in->sessions);
	stats_put(&b, "sessions_total:%" PRIu64 "\n", in->sessions_total);
	stats_put(&b, "connections:%u\n", in->connections);
	stats_put(&b, "connections_open:%u\n", in->conns_open);
	stats_put(&b, "connections_peak:%u\n", in->conns_peak);
	stats_put(&b, "connections_max:%u\n", in->conns_max);
	stats_put(&b, "connections_max_per_uid:%u\n", in->conns_max_per_uid);
	stats_put(&b, "connections_uids:%u\n", in->conn_uids);
	stats_put(&b, "connections_top_uid:%u\n", in->conn_top_uid);
	stats_put(&b, "connections_top_uid_held:%u\n", in->conn_top_uid_held);
	stats_put(&b, "connections_uid_peak:%u\n", in->conn_uid_peak);
	stats_put(&b, "connections_refused_limit:%" PRIu64 "\n", in->conns_refused_limit);
	stats_put(&b, "connections_refused_uid:%" PRIu64 "\n", in->conns_refused_uid);
	stats_put(&b, "connections_closed_handshake:%" PRIu64 "\n", in->conns_closed_handshake);
	stats_put(&b, "connections_closed_frame:%" PRIu64 "\n", in->conns_closed_frame);
	stats_put(&b, "connections_closed_idle:%" PRIu64 "\n", in->conns_closed_idle);
	stats_put(&b, "file_limit:%" PRIu64 "\n", in->file_limit);
	stats_put(&b, "recv_partial_bytes:%" PRIu64 "\n", in->recv_partial_bytes);
	stats_put(&b, "send_unsent_bytes:%" PRIu64 "\n", in->send_unsent_bytes);
	stats_put(&b, "memory_trims:%" PRIu64 "\n", in->memory_trims);
	stats_put(&b, "regions:%u\n", in->regions);
	stats_put(&b, "region_bytes:%" PRIu64 "\n", in->region_bytes);
	stats_put(&b, "# requests\n");
	stats_put(&b, "requests_total:%" PRIu64 "\n", s->requests_total);
	stats_put(&b, "requests_ok:%" PRIu64 "\n", s->requests_ok);
	stats_put(&b, "requests_failed:%" PRIu64 "\n", s->requests_failed);
	stats_put(&b, "requests_busy:%" PRIu64 "\n", s->requests_busy);
	stats_put(&b, "requests_deduped:%" PRIu64 "\n", s->requests_deduped);
	stats_put(&b, "requests_malformed:%" PRIu64 "\n", s->requests_malformed);
	stats_put(&b, "requests_memo:%" PRIu64 "\n", s->requests_memo);
	stats_put(&b, "inflight:%u\n", in->inflight);
	stats_put(&b, "fwd_running:%u\n", in->running);
	stats_put(&b, "fwd_total:%" PRIu64 "\n", s->fwd_total);
	stats_put(&b, "fwd_compute_us_total:%" PRIu64 "\n", s->fwd_compute_ns / 1000);
	stats_put(&b, "bwd_total:%" PRIu64 "\n", s->bwd_total);
	stats_put(&b, "bwd_compute_us_total:%" PRIu64 "\n", s->bwd_compute_ns / 1000);
	if (in->metrics_text != NULL && in->metrics_text[0] != '\0')
		stats_put(&b, "%s", in->metrics_text);
	if (in->backend_text != NULL && in->backend_text[0] != '\0')
		stats_put(&b, "%s", in->backend_text);
	return b.len;
}
