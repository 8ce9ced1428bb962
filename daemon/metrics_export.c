/* metrics_export.c - the server's numbers in the Prometheus text format; see metrics_export.h. */
#include "metrics_export.h"

#include "fa_proto.h"
#include "metrics.h"
#include "region.h"
#include "server.h"
#include "util.h"

/* metrics_memo slots: the per-op reply latency at the op's number, then the forward's two */
#define MEMO_OPS 64
#define MEMO_FWD_QUEUE (MEMO_OPS + 0)
#define MEMO_FWD_COMPUTE (MEMO_OPS + 1)
_Static_assert(MEMO_FWD_COMPUTE < METRICS_MEMO, "the slots fit metrics' memo");

void metrics_export_reply(struct metrics *m, uint32_t op, uint64_t ns)
{
	unsigned slot = op < MEMO_OPS ? op : METRICS_MEMO; /* a larger op: no slot */
	struct metrics_hist *h = metrics_memo_get(m, slot);
	if (h == NULL) {
		const char *name = fa_proto_op_name(op);
		char key[METRICS_NAME_MAX];
		int n = snprintf(key, sizeof key, "latency_%s", name);
		for (int i = 8; i < n && i < (int)sizeof key; i++)
			if (key[i] >= 'A' && key[i] <= 'Z')
				key[i] = (char)(key[i] - 'A' + 'a');
		h = metrics_series_memo(m, slot, key, "fa_request_duration_seconds", "op", name,
		                        "time from a request's arrival to its reply, by op (FA_OK "
		                        "replies)");
	}
	if (h != NULL)
		metrics_hist_record(h, ns);
}

void metrics_export_fwd(struct metrics *m, uint64_t total_ns, uint64_t compute_ns)
{
	struct metrics_hist *q = metrics_memo_get(m, MEMO_FWD_QUEUE);
	struct metrics_hist *c = metrics_memo_get(m, MEMO_FWD_COMPUTE);
	if (q == NULL)
		q = metrics_series_memo(
		    m, MEMO_FWD_QUEUE, "fwd_queue", "fa_fwd_queue_seconds", "", "",
		    "time an attention request spent outside the backend's computation: validation, "
		    "the queue, the reply");
	if (c == NULL)
		c = metrics_series_memo(
		    m, MEMO_FWD_COMPUTE, "fwd_compute", "fa_fwd_compute_seconds", "", "",
		    "time the backend computed an attention request (first chunk started to last done)");
	if (q != NULL)
		metrics_hist_record(q, total_ns > compute_ns ? total_ns - compute_ns : 0);
	if (c != NULL)
		metrics_hist_record(c, compute_ns);
}

size_t metrics_export_text(char *buf, size_t cap, void *arg)
{
	struct server *srv = arg;
	struct ipc_counters n = {0};
	if (srv->ipc != NULL)
		ipc_counters(srv->ipc, &n);
	double uptime = 1e-9 * (double)(fa_now_ns() - srv->start_ns);
	const struct stats *s = &srv->stats;
	const struct metrics_value v[] = {
		{"fa_up", "gauge", "1 while the daemon serves (the file stays after it stopped)",
		 srv->state == SERVER_RUNNING},
		{"fa_start_time_seconds", "gauge", "when the daemon started, Unix time",
		 1e-3 * (double)util_unix_ms() - uptime},
		{"fa_sessions", "gauge", "open sessions (client processes)",
		 session_count(&srv->sessions)},
		{"fa_sessions_opened_total", "counter", "sessions opened since start",
		 (double)srv->sessions.opened_total},
		{"fa_connections", "gauge", "open client connections", n.conns},
		{"fa_connections_refused_total", "counter",
		 "connections closed at accept by a connection cap (global or per uid)",
		 (double)(n.refused_limit + n.refused_uid)},
		{"fa_regions", "gauge", "registered buffers, all sessions", region_count()},
		{"fa_region_bytes", "gauge", "bytes of the registered buffers", (double)region_bytes()},
		{"fa_inflight", "gauge", "attention requests accepted and not answered yet",
		 srv->inflight},
		{"fa_requests_total", "counter", "requests read off the socket",
		 (double)s->requests_total},
		{"fa_requests_ok_total", "counter", "requests answered FA_OK", (double)s->requests_ok},
		{"fa_requests_failed_total", "counter", "requests answered with another status",
		 (double)s->requests_failed},
		{"fa_requests_busy_total", "counter", "requests answered FA_EBUSY (--max-inflight)",
		 (double)s->requests_busy},
		{"fa_requests_deduped_total", "counter", "repeated requests answered from the cache",
		 (double)s->requests_deduped},
		{"fa_requests_malformed_total", "counter", "requests that did not decode",
		 (double)s->requests_malformed},
		{"fa_fwd_total", "counter", "forward passes computed", (double)s->fwd_total},
		{"fa_fwd_compute_seconds_total", "counter", "backend time of the forward passes",
		 1e-9 * (double)s->fwd_compute_ns},
	};
	return metrics_prometheus(&srv->metrics, v, sizeof v / sizeof v[0], buf, cap);
}
