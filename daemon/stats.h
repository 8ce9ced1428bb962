/* stats.h - counters and the STATS reply text (redis INFO style: "# section" lines, then
 * "key:value" lines). The integration tests parse these exact keys: add keys freely, never rename
 * one.
 *
 * Accounting: every request read off the socket counts once in requests_total, and ends up in
 * exactly one of requests_ok, requests_failed (any status but FA_OK, including busy and malformed)
 * or requests_deduped (a repeat of an earlier request, answered from the cache or folded into the
 * running one); inflight counts those accepted and not answered yet. Loop thread only.
 */
#ifndef FA_DAEMON_STATS_H
#define FA_DAEMON_STATS_H

#include <stddef.h>
#include <stdint.h>

struct stats {
	uint64_t requests_total;
	uint64_t requests_ok;
	uint64_t requests_failed;
	uint64_t requests_busy;      /* FA_EBUSY: --max-inflight reached (also in failed) */
	uint64_t requests_deduped;
	uint64_t requests_malformed; /* FA_EPROTO or FA_ETOOBIG at decoding (also in failed) */
	uint64_t requests_memo;      /* decoded by a ring's memo (proto/fa_proto_memo.h) */
	uint64_t fwd_total;          /* forward passes computed successfully */
	uint64_t fwd_compute_ns;     /* their backend time */
	uint64_t bwd_total;          /* backward passes computed successfully */
	uint64_t bwd_compute_ns;     /* their backend time */
};

/* What the server knows at the time of the STATS request. */
struct stats_info {
	const char *version;   /* "0.1.0" */
	uint64_t epoch;
	long pid;
	uint64_t uptime_s;
	const char *backend;   /* "cpu" */
	unsigned threads;
	unsigned sessions;
	uint64_t sessions_total;
	unsigned connections;  /* announced (past the handshake) */
	/* The transport's connection counts (ipc.h, struct ipc_counters) and the caps in force. */
	unsigned conns_open, conns_peak, conns_max, conns_max_per_uid;
	unsigned conn_uids, conn_top_uid, conn_top_uid_held, conn_uid_peak;
	uint64_t conns_refused_limit, conns_refused_uid;
	uint64_t conns_closed_handshake, conns_closed_frame, conns_closed_idle;
	uint64_t file_limit;   /* the soft RLIMIT_NOFILE the caps were fitted to */
	uint64_t recv_partial_bytes, send_unsent_bytes, memory_trims; /* ipc.c's buffers */
	unsigned regions;
	uint64_t region_bytes;
	unsigned inflight;
	unsigned running;      /* of inflight, being computed now */
	const char *metrics_text; /* the "# latency" section (metrics_stats_text), or NULL */
	const char *backend_text; /* the backend's own sections ("# gpu ..."), or NULL */
};

/* Write the STATS text into buf (cap bytes incl. NUL; truncated if it does not fit). Returns
 * the length written. */
size_t stats_format(const struct stats *s, const struct stats_info *info, char *buf, size_t cap);

#endif /* FA_DAEMON_STATS_H */
