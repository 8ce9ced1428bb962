/* metrics_export.h - the daemon's series (what dispatch.c records into srv->metrics), and the
 * server's numbers as Prometheus text (for metrics_file.c): counters and gauges from struct
 * server and its parts, then the latency histograms. Names:
 * fa_*, counters ending in _total, durations in seconds (daemon/README.md lists them). Loop
 * thread only. */
#ifndef FA_DAEMON_METRICS_EXPORT_H
#define FA_DAEMON_METRICS_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "metrics.h"

/* Count an FA_OK reply of op, ns from the request's arrival to the reply: the series
 * "latency_<op>" (STATS) / fa_request_duration_seconds{op="<OP>"}, added on first use. */
void metrics_export_reply(struct metrics *m, uint32_t op, uint64_t ns);

/* Count a computed ATTN_FWD: total_ns from arrival to the result, compute_ns the backend's; the
 * rest is queue time (validation, the queue, the reply): "fwd_queue" / fa_fwd_queue_seconds and
 * "fwd_compute" / fa_fwd_compute_seconds. Other splits (per priority class, say) add their own
 * series to m with metrics_series(), in a family of their own ("fa_fwd_class_queue_seconds",
 * label "class"). */
void metrics_export_fwd(struct metrics *m, uint64_t total_ns, uint64_t compute_ns);

/* A metrics_text_fn: arg is the struct server. Returns the length, 0 when cap is too small. */
size_t metrics_export_text(char *buf, size_t cap, void *arg);

#endif /* FA_DAEMON_METRICS_EXPORT_H */
