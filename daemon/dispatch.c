/* dispatch.c - the op table and its handlers.
 *
 * Synchronous ops (HELLO, BYE, PING, STATS, REGISTER, UNREGISTER) are answered before the
 * handler returns. ATTN_FWD and ATTN_BWD are validated, then handed to the backend with
 * references on their session and regions; dispatch_fwd_done answers them when the backend is
 * finished. Each request
 * with a session passes through the session's dedupe ring first (not STATS, whose reply is large
 * and harmless to recompute, nor BYE, which ends the ring's session).
 */
#include "dispatch.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clients.h"
#include "dedupe.h"
#include "log.h"
#include "metrics_export.h"
#include "region.h"
#include "ring.h"
#include "session.h"
#include "util.h"
#include "validate.h"
#include "worklimit.h"
#include "validate_infer.h"

/* One ATTN_FWD between validation and its reply. The job comes first: the backend hands back
 * the job pointer. */
struct request {
	struct backend_job job;
	struct session *session;          /* referenced */
	struct dedupe_entry *dd; /* its dedupe entry (decides where the reply goes), or NULL */
	struct ipc_hdr hdr;               /* where the reply goes without a dedupe entry */
	struct region *regions[BACKEND_MAX_TENSORS + 1]; /* referenced, distinct: the tensors' and
	                                                * the completion words' */
	unsigned nregions;
	uint64_t seq;
	uint64_t t_recv;
	uint32_t pipe;                    /* the connection it arrived on, for the log */
	bool replied;                     /* asynchronous: answered at the enqueue */
	/* A refused asynchronous call from a ring, its done word released by the backend first
	 * (backend_job.words_release): answered with this status and detail. */
	bool release;
	fa_status refused;
	char refused_detail[FA_PROTO_DETAIL_MAX];
};

struct dispatch_ctx {
	struct server *srv;
	const struct ipc_peer *peer;
	const struct ipc_hdr *hdr;
	const struct fa_proto_req *req;
	struct session *session;  /* NULL for HELLO */
	struct dedupe_entry *dd;
	struct fa_proto_rep *rep; /* op, seq, epoch set; the handler fills u and detail */
	bool async;               /* the handler will answer later */
	uint64_t t_recv;
};

typedef fa_status (*dispatch_fn)(struct dispatch_ctx *c);

struct dispatch_op {
	uint32_t op;
	bool needs_session;
	bool dedupe;
	dispatch_fn fn;
};

/* ---- replying -------------------------------------------------------------------------------- */

/* Statuses that are the client's doing: answered, logged at warning once per session. */
static bool dispatch_client_fault(fa_status st)
{
	switch (st) {
	case FA_ENOMEM:
	case FA_ESYS:
	case FA_EINTERNAL:
	case FA_EDEVICE:
	case FA_EBUSY:
	case FA_ECLOSED:
		return false;
	default:
		return true;
	}
}

/* One log line per reply: info when fine, warning for a session's first client error. */
static void dispatch_log_reply(struct server *srv, struct session *s,
                               const struct fa_proto_rep *rep, uint32_t pipe, uint64_t t_recv)
{
	double us = (double)(fa_now_ns() - t_recv) / 1000.0;
	const char *op = fa_proto_op_name(rep->op);

	if (rep->status == FA_OK) {
		metrics_export_reply(&srv->metrics, rep->op, fa_now_ns() - t_recv);
		log_info("request %s session %016" PRIx64 " seq %" PRIu64 ": ok in %.1f us", op,
		         s ? s->id : 0, rep->seq, us);
		return;
	}
	fa_status st = (fa_status)rep->status;
	if (!dispatch_client_fault(st)) {
		if (st == FA_EBUSY || st == FA_ECLOSED)
			log_info("request %s session %016" PRIx64 " seq %" PRIu64 ": %s: %s", op,
			         s ? s->id : 0, rep->seq, fa_status_name(st), rep->detail);
		else
			log_err("request %s session %016" PRIx64 " seq %" PRIu64 ": %s: %s", op,
			        s ? s->id : 0, rep->seq, fa_status_name(st), rep->detail);
		return;
	}
	if (s != NULL && !s->warned) {
		s->warned = true;
		log_warn("request %s session %016" PRIx64 " seq %" PRIu64
		         " (connection %u): %s: %s "
		         "(further client errors of this session are logged at info)",
		         op, s->id, rep->seq, pipe, fa_status_name(st), rep->detail);
	} else {
		log_info("request %s session %016" PRIx64 " seq %" PRIu64
		         " (connection %u): %s: %s",
		         op, s ? s->id : 0, rep->seq, pipe, fa_status_name(st), rep->detail);
	}
}

/* Send encoded reply bytes where the request came from: its connection, or its ring. */
static void dispatch_route(struct server *srv, const struct ipc_hdr *to, const void *buf,
                           size_t len)
{
	if (ring_hdr_is(to))
		ring_reply(srv->rings, to, buf, len);
	else if (srv->ipc != NULL && ipc_reply(srv->ipc, to, buf, len) != FA_OK)
		log_err("dispatch: out of memory sending a reply");
}

/* Encode rep, count it, remember it for duplicates, send it. */
static void dispatch_send(struct server *srv, struct session *s, struct dedupe_entry *dd,
                          const struct ipc_hdr *hdr, struct fa_proto_rep *rep)
{
	size_t len;
	fa_status st;

	rep->epoch = srv->epoch;
	st = fa_proto_encode_rep(rep, srv->rep_buf, sizeof srv->rep_buf, &len);
	if (st != FA_OK) {
		/* A reply the encoder refuses is a bug here; still answer something. */
		log_err("dispatch: cannot encode the %s reply (status %d): %s; answering "
		        "FA_EINTERNAL", fa_proto_op_name(rep->op), rep->status, fa_status_name(st));
		struct fa_proto_rep r = {.op = rep->op, .seq = rep->seq, .epoch = srv->epoch,
		                         .status = FA_EINTERNAL};
		snprintf(r.detail, sizeof r.detail, "the daemon could not encode its reply");
		if (fa_proto_encode_rep(&r, srv->rep_buf, sizeof srv->rep_buf, &len) != FA_OK)
			return;
		rep->status = FA_EINTERNAL;
	}
	if (rep->status == FA_OK) {
		srv->stats.requests_ok++;
	} else {
		srv->stats.requests_failed++;
		if (rep->status == FA_EBUSY)
			srv->stats.requests_busy++;
	}
	/* With a dedupe entry, the newest copy of the request is the one waiting. */
	struct ipc_hdr to = dd != NULL ? dd->hdr : *hdr;
	if (dd != NULL) {
		/* Transient refusals are not replayed: a resent copy deserves another try. */
		if (rep->status == FA_EBUSY || rep->status == FA_ECLOSED)
			dedupe_drop(&s->dedupe, dd);
		else
			dedupe_finish(&s->dedupe, dd, srv->rep_buf, len);
	}
	dispatch_route(srv, &to, srv->rep_buf, len);
}

/* Clear the reply scratch for a new reply (the STATS text is written whole by its handler). */
static void dispatch_rep_reset(struct fa_proto_rep *rep, uint32_t op, uint64_t seq)
{
	memset(rep, 0, offsetof(struct fa_proto_rep, u));
	memset(&rep->u, 0, sizeof(rep->u.hello));
	rep->u.stats.text[0] = '\0';
	rep->op = op;
	rep->seq = seq;
}

/* An error reply to a request that may not even have decoded; logged unless peer is NULL. */
static void dispatch_fail(struct server *srv, struct session *s, struct dedupe_entry *dd,
                          const struct ipc_peer *peer, const struct ipc_hdr *hdr, uint32_t op,
                          uint64_t seq, fa_status st, const char *detail)
{
	struct fa_proto_rep *rep = &srv->rep;

	dispatch_rep_reset(rep, op, seq);
	rep->status = st;
	snprintf(rep->detail, sizeof rep->detail, "%s", detail);
	if (peer != NULL)
		dispatch_log_reply(srv, s, rep, peer->pipe, fa_now_ns());
	dispatch_send(srv, s, dd, hdr, rep);
}

/* ---- handlers -------------------------------------------------------------------------------- */

static fa_status dispatch_hello(struct dispatch_ctx *c)
{
	struct server *srv = c->srv;
	struct session *s;
	fa_status st;

	st = session_open(&srv->sessions, c->peer, c->req->u.hello.name, &s, c->rep->detail,
	                  sizeof c->rep->detail);
	if (st != FA_OK)
		return st;
	if (c->req->u.hello.pid != c->peer->pid)
		log_debug("session %016" PRIx64 ": client says pid %u, the socket says %u", s->id,
		          c->req->u.hello.pid, c->peer->pid);
	c->session = s;
	s->pid_claimed = c->req->u.hello.pid;
	session_ref(s); /* dispatch_request drops it with the others */
	s->requests++;
	c->rep->u.hello.session = s->id;
	c->rep->u.hello.max_msg = FA_PROTO_MAX_MSG;
	c->rep->u.hello.max_inflight = (uint32_t)srv->cfg->max_inflight;
	c->rep->u.hello.max_regions = (uint32_t)srv->cfg->max_regions;
	c->rep->u.hello.backend = (uint8_t)srv->backend->ops->kind;
	return FA_OK;
}

/* BYE: close the session; its regions are unmapped and unlinked. */
static fa_status dispatch_bye(struct dispatch_ctx *c)
{
	session_close(&c->srv->sessions, c->session, true, "bye");
	return FA_OK;
}

/* PING: nothing to do but answer. */
static fa_status dispatch_ping(struct dispatch_ctx *c)
{
	(void)c;
	return FA_OK;
}

/* STATS: the INFO-style text. */
static fa_status dispatch_stats(struct dispatch_ctx *c)
{
	struct server *srv = c->srv;
	struct stats_info in = {
		.version = fa_version_string(),
		.epoch = srv->epoch,
		.pid = (long)getpid(),
		.uptime_s = (fa_now_ns() - srv->start_ns) / 1000000000u,
		.backend = srv->backend ? backend_name(srv->backend) : "none",
		.threads = srv->backend ? srv->backend->threads : 0,
		.sessions = session_count(&srv->sessions),
		.sessions_total = srv->sessions.opened_total,
		.connections = srv->ipc ? ipc_pipe_count(srv->ipc) : 0,
		.regions = region_count(),
		.region_bytes = region_bytes(),
		.inflight = srv->inflight,
		.running = srv->backend ? atomic_load(&srv->backend->running) : 0,
	};

	/* The backend's sections (the GPU's: devices, async, canary, tuning, kernels: ~2 KiB); a
	 * backend that runs out of room drops whole sections, so give it plenty. */
	struct ipc_counters n = {0};
	if (srv->ipc != NULL)
		ipc_counters(srv->ipc, &n);
	in.conns_open = n.conns;
	in.conns_peak = n.conns_peak;
	in.conns_max = srv->max_conns;
	in.conns_max_per_uid = srv->max_conns_per_uid;
	in.conn_uids = n.uids;
	in.conn_top_uid = n.uid_top;
	in.conn_top_uid_held = n.uid_top_conns;
	in.conn_uid_peak = n.uid_peak;
	in.conns_refused_limit = n.refused_limit;
	in.conns_refused_uid = n.refused_uid;
	in.conns_closed_handshake = n.closed_handshake;
	in.conns_closed_frame = n.closed_frame;
	in.conns_closed_idle = n.closed_idle;
	in.file_limit = srv->nofile;
	in.recv_partial_bytes = n.partial_bytes;
	in.send_unsent_bytes = n.unsent_bytes;
	in.memory_trims = n.memory_trims;

	static char latency[4096];
	metrics_stats_text(&srv->metrics, latency, sizeof latency);
	in.metrics_text = latency;
	static char extra[12288]; /* the backend's sections: 8 GPUs' lines fit */
	extra[0] = '\0';
	if (srv->backend != NULL && srv->backend->ops->stats != NULL)
		srv->backend->ops->stats(srv->backend, extra, sizeof extra);
	if (srv->rings != NULL) {
		struct ring_counters rc;
		size_t el = strlen(extra);
		ring_counters(srv->rings, &rc);
		snprintf(extra + el, sizeof extra - el,
		         "# ring\nring_open:%u\nring_opened:%" PRIu64 "\nring_entries:%" PRIu64
		         "\nring_completions:%" PRIu64 "\nring_dropped:%" PRIu64
		         "\nring_sleeps:%" PRIu64 "\nring_client_wakes:%" PRIu64
		         "\nring_broken:%" PRIu64 "\nring_hop_us_mean:%.2f\nring_thread_wakes:%" PRIu64
		         "\nring_prewakes:%" PRIu64 "\nring_prewake_client_wakes:%" PRIu64
		         "\nring_hop_us_total:%" PRIu64 "\nring_turnaround_us_total:%" PRIu64
		         "\nring_turnarounds:%" PRIu64 "\nring_polled:%" PRIu64 "\n",
		         rc.open, rc.opened, rc.entries, rc.completions, rc.dropped, rc.sleeps,
		         rc.client_wakes, rc.broken,
		         rc.entries ? (double)rc.hop_ns / 1e3 / (double)rc.entries : 0.0,
		         rc.thread_wakes, rc.prewakes, rc.prewake_client_wakes, rc.hop_ns / 1000,
		         rc.turnaround_ns / 1000, rc.turnarounds, rc.polled);
	}
	in.backend_text = extra;
	stats_format(&srv->stats, &in, c->rep->u.stats.text, sizeof c->rep->u.stats.text);
	return FA_OK;
}

/* CLIENTS: the sessions this peer may see (clients.h: root and the daemon's uid see all). */
static fa_status dispatch_clients(struct dispatch_ctx *c)
{
	return clients_list(&c->srv->sessions, c->peer->uid, c->req->u.clients.after, c->rep,
	                    c->rep->detail, sizeof c->rep->detail);
}

/* REGISTER with "wds": completion words, before anything is opened. */
static fa_status dispatch_words_check(const struct dispatch_ctx *c)
{
	struct server *srv = c->srv;
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;

	if (c->req->u.reg.kind != FA_REGION_CUDA_IPC)
		return fa_err(err, errlen, FA_EINVAL,
		              "completion words are CUDA IPC memory (a cuMemAlloc allocation)");
	if (!srv->backend->async_words)
		return fa_err(err, errlen, FA_ENOTSUP,
		              "completion words need GPUs with 64-bit stream memory operations; "
		              "this daemon's %s backend has none: use CUDA IPC events",
		              backend_name(srv->backend));
	if (c->req->u.reg.size < FA_PROTO_WORDS_BYTES)
		return fa_err(err, errlen, FA_ERANGE,
		              "completion words need %d bytes (a ready and a done word for each of "
		              "%d slots); the registration declares %" PRIu64,
		              FA_PROTO_WORDS_BYTES, FA_PROTO_MAX_SLOTS, c->req->u.reg.size);
	return FA_OK;
}

/* REGISTER: map a host shm object, or open a CUDA IPC handle (gpu backend), under a new region
 * id of this session. */
static fa_status dispatch_register(struct dispatch_ctx *c)
{
	struct server *srv = c->srv;
	struct session *s = c->session;
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;
	struct region *r;
	fa_status st;

	switch (c->req->u.reg.kind) {
	case FA_REGION_HOST_SHM:
		if (!srv->backend->host_memory)
			return fa_err(err, errlen, FA_ENOTSUP,
			              "the %s backend does not serve host shared memory",
			              backend_name(srv->backend));
		break;
	case FA_REGION_CUDA_IPC:
		if (!srv->backend->device_memory)
			return fa_err(
			    err, errlen, FA_ENOTSUP,
			    "CUDA IPC regions need the gpu backend; this daemon has no GPU "
			    "backend: it runs the %s backend (host shared memory only, "
			    "fa_buffer_alloc_host)",
			    backend_name(srv->backend));
		break;
	default:
		return fa_err(err, errlen, FA_EINVAL, "unknown region kind %u",
		              c->req->u.reg.kind);
	}
	/* The limit before the mapping, so a flood of REGISTERs maps nothing. */
	if (idmap_len(&s->regions) >= srv->sessions.max_regions)
		return fa_err(err, errlen, FA_ELIMIT,
		              "the session has %zu regions, its limit (--max-regions)",
		              idmap_len(&s->regions));
	bool ipc = c->req->u.reg.kind == FA_REGION_CUDA_IPC;
	if (c->req->u.reg.words && (st = dispatch_words_check(c)) != FA_OK)
		return st;
	if (ipc)
		st = region_open_ipc(&r, c->req->u.reg.size, srv->cfg->max_region_bytes, err,
		                     errlen);
	else
		st = region_open_shm(&r, c->req->u.reg.shm_name, c->req->u.reg.size, s->uid,
		                     srv->cfg->max_region_bytes, err, errlen);
	if (st != FA_OK)
		return st;
	/* The backend pins host memory or opens the IPC handle: once per registration. */
	if (srv->backend->ops->region_open != NULL &&
	    (st = srv->backend->ops->region_open(srv->backend, r,
	                                         ipc ? c->req->u.reg.ipc_handle : NULL,
	                                         ipc ? c->req->u.reg.gpu_uuid : NULL, err,
	                                         errlen)) != FA_OK) {
		region_unref(r);
		return st;
	}
	if (c->req->u.reg.words && ((uintptr_t)r->base % 16 != 0 || r->mem_at != 0)) {
		region_unref(r);
		return fa_err(err, errlen, FA_EALIGN,
		              "completion words: the handle maps at an offset of %" PRIu64 " bytes "
		              "into its allocation; export a cuMemAlloc allocation of its own",
		              r->mem_at);
	}
	r->words = c->req->u.reg.words;
	if ((st = session_region_add(s, r, err, errlen)) != FA_OK) {
		region_unref(r);
		return st;
	}
	log_info("session %016" PRIx64 ": region %016" PRIx64 " is %s, %" PRIu64 " bytes", s->id,
	         r->id, r->name, r->size);
	c->rep->u.reg.region = r->id;
	return FA_OK;
}

/* UNREGISTER: forget the id; the mapping goes when no request uses it. */
static fa_status dispatch_unregister(struct dispatch_ctx *c)
{
	uint64_t id = c->req->u.unreg.region;

	if (session_region_remove(c->session, id) != FA_OK)
		return fa_err(c->rep->detail, sizeof c->rep->detail, FA_EREGION,
		              "region %016" PRIx64 " is not registered in this session", id);
	log_info("session %016" PRIx64 ": region %016" PRIx64 " unregistered", c->session->id, id);
	return FA_OK;
}

/* Release what a finished ATTN_FWD held: its regions and its session. */
static void dispatch_request_free(struct request *r)
{
	for (unsigned i = 0; i < r->nregions; i++)
		region_unref(r->regions[i]);
	session_unref(r->session);
	backend_infer_free(r->job.infer);
	free(r);
}

/* ---- what every attention request shares (ATTN_FWD, ATTN_BWD, ATTN_VARLEN, ATTN_KVCACHE) -- */

/* The session's in-flight limit, checked before anything else: FA_OK or FA_EBUSY. */
static fa_status dispatch_inflight_ok(const struct dispatch_ctx *c)
{
	const struct session *s = c->session;

	if (s->inflight < (unsigned)c->srv->cfg->max_inflight)
		return FA_OK;
	return fa_err(c->rep->detail, sizeof c->rep->detail, FA_EBUSY,
	              "the session has %u requests in flight, its limit (--max-inflight); "
	              "retry when one has finished",
	              s->inflight);
}

/* The per-request work limit in GFLOP: --max-request-gflop, else the backend's default (0:
 * none). Stride 0 lets a few bytes ask for any amount of work: it is bounded before anything
 * runs. */
static uint64_t dispatch_max_gflop(const struct server *srv)
{
	return srv->cfg->max_request_gflop != 0 ? srv->cfg->max_request_gflop
	                                        : srv->backend->default_max_gflop;
}

/* Reference each distinct region of a request's tensors (NULL: an absent tensor) and hand the
 * job their byte ranges (the CPU backend's SIGBUS repair needs them). */
static void dispatch_hold_regions(struct request *r, struct region *const *regions, int n)
{
	for (int i = 0; i < n; i++) {
		bool seen = regions[i] == NULL;
		for (unsigned j = 0; j < r->nregions && !seen; j++)
			seen = r->regions[j] == regions[i];
		if (!seen) {
			struct region *rg = regions[i];
			region_ref(rg);
			r->regions[r->nregions++] = rg;
			r->job.ranges[r->job.nranges++] = (struct backend_range){
			    .base = rg->base, .size = rg->size, .broken = &rg->broken};
		}
	}
}

/* Hand a prepared request (job, session reference, regions) to the backend; its reply goes when
 * the backend hands it back (dispatch_fwd_done). On a refusal the request is freed. */
static fa_status dispatch_submit(struct dispatch_ctx *c, struct request *r)
{
	fa_status st;

	r->dd = c->dd;
	r->hdr = *c->hdr;
	r->seq = c->req->seq;
	r->t_recv = c->t_recv;
	r->pipe = c->peer->pipe;
	if ((st = backend_submit(c->srv->backend, &r->job)) != FA_OK) {
		dispatch_request_free(r);
		return fa_err(c->rep->detail, sizeof c->rep->detail, st,
		              "the backend did not take the request");
	}
	c->session->inflight++;
	c->srv->inflight++;
	c->async = true;
	return FA_OK;
}

/* Make r (a request holding its session and regions) a words release for status st and its
 * detail, and hand it to the backend: a ring's client already made its stream wait for the done
 * word, so a refusal must still write it (backend.h, words_release). False: the backend did not
 * take it (answer the refusal as it is). */
static bool dispatch_release_submit(struct server *srv, struct request *r, fa_status st,
                                    const char *detail)
{
	r->release = true;
	r->refused = st;
	snprintf(r->refused_detail, sizeof r->refused_detail, "%s", detail);
	r->job.words_release = true;
	r->job.async = true;
	r->job.is_bwd = false;
	r->job.infer = NULL;
	/* Harmless figures for the backend's bookkeeping (nothing is launched). */
	memset(&r->job.desc, 0, sizeof r->job.desc);
	r->job.desc.B = r->job.desc.Sq = r->job.desc.Sk = r->job.desc.Hq = r->job.desc.Hkv = 1;
	r->job.desc.D = 64;
	r->job.desc.dtype = FA_DTYPE_FP16;
	return backend_submit(srv->backend, &r->job) == FA_OK;
}

/* The completion-word fields of an asynchronous attention request (ATTN_FWD, ATTN_BWD,
 * ATTN_VARLEN, ATTN_KVCACHE): true with them, false for any other op or a synchronous call. */
static bool dispatch_req_words(const struct fa_proto_req *q, uint64_t *region, uint64_t *seq,
                               uint32_t *slot)
{
	switch (q->op) {
	case FA_OP_ATTN_FWD:
		*region = q->u.fwd.words_region, *seq = q->u.fwd.words_seq, *slot = q->u.fwd.slot;
		return q->u.fwd.async;
	case FA_OP_ATTN_BWD:
		*region = q->u.bwd.words_region, *seq = q->u.bwd.words_seq, *slot = q->u.bwd.slot;
		return q->u.bwd.async;
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE:
		*region = q->u.infer.words_region, *seq = q->u.infer.words_seq;
		*slot = q->u.infer.slot;
		return q->u.infer.async;
	default:
		return false;
	}
}

/* A refused asynchronous attention call from a ring, with completion words: release its done
 * word (the session's words region, if it really is one) and answer once that is enqueued.
 * True when handed to the backend (the reply then comes from dispatch_fwd_done). */
static bool dispatch_words_refused(struct dispatch_ctx *c, fa_status st)
{
	struct server *srv = c->srv;
	const struct fa_proto_req *q = c->req;
	struct session *s = c->session;
	uint64_t wrg = 0, wq = 0;
	uint32_t slot = 0;

	if (!ring_hdr_is(c->hdr) || !dispatch_req_words(q, &wrg, &wq, &slot) || s == NULL ||
	    wrg == 0 || wq == 0 || slot >= FA_PROTO_MAX_SLOTS || !srv->backend->async_words ||
	    st == FA_ESESSION || (q->op != FA_OP_ATTN_FWD && ring_old_daemon()))
		return false;
	struct region *wr = session_region_find(s, wrg);
	if (wr == NULL || !wr->words || wr->dev < 0)
		return false;
	struct request *r = calloc(1, sizeof *r);
	if (r == NULL)
		return false;
	r->job.words = wr->base;
	r->job.words_seq = wq;
	r->job.slot = slot;
	r->job.dev = wr->dev;
	r->job.owner = s;
	r->job.owner_state = &s->backend_state;
	r->session = s;
	session_ref(s);
	region_ref(wr);
	r->regions[r->nregions++] = wr;
	r->dd = c->dd;
	r->hdr = *c->hdr;
	r->seq = q->seq;
	r->t_recv = c->t_recv;
	r->pipe = c->peer->pipe;
	if (!dispatch_release_submit(srv, r, st, c->rep->detail)) {
		dispatch_request_free(r);
		return false;
	}
	s->inflight++;
	srv->inflight++;
	c->async = true;
	return true;
}

/* An asynchronous call's completion words (region id): a words region of the session, on the
 * GPU backend that serves them. FA_OK with *out, or the client's status with the detail. */
static fa_status dispatch_words_region(struct dispatch_ctx *c, uint64_t id, struct region **out)
{
	struct server *srv = c->srv;
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;

	if (!srv->backend->async_words)
		return fa_err(err, errlen, FA_ENOTSUP,
		              "completion words need the GPU backend on GPUs with 64-bit stream "
		              "memory operations; this daemon runs the %s backend%s",
		              backend_name(srv->backend),
		              srv->backend->async_events ? " without them: use CUDA IPC events" : "");
	struct region *r = session_region_find(c->session, id);
	if (r == NULL)
		return fa_err(err, errlen, FA_EREGION,
		              "completion words: region %016" PRIx64 " is not registered in this "
		              "session", id);
	if (!r->words)
		return fa_err(err, errlen, FA_EINVAL,
		              "completion words: region %016" PRIx64 " was not registered as "
		              "completion words (REGISTER with \"wds\")", id);
	*out = r;
	return FA_OK;
}

/* The refusal an older daemon's decoder gives a request with `key`, a key it knew for another
 * op (fa_proto.c, check_keys; a daemon older still said "unknown key 'KEY'"). */
static fa_status dispatch_old_refusal(struct dispatch_ctx *c, const char *key)
{
	return fa_err(c->rep->detail, sizeof c->rep->detail, FA_EPROTO,
	              "key '%s' not allowed in a %s request", key, fa_proto_op_name(c->req->op));
}

/* Where a request's tensors are (n of them, region[i] NULL: absent), checked as every attention
 * op checks them: none in the session's completion-words region, device memory only in the
 * asynchronous mode (tensors from `tables` on are index tables, read in stream order: the detail
 * says so), and one GPU per request, the completion words' (wr, if any) included; host buffers
 * go anywhere. FA_OK with *dev (-1: no device tensor), or FA_EINVAL with the detail. */
static fa_status dispatch_place_tensors(struct dispatch_ctx *c, bool async,
                                        struct region *const *region, const bool *on_device,
                                        const char *const *names, int n, int tables,
                                        const struct region *wr, int *dev)
{
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;

	*dev = -1;
	for (int i = 0; i < n; i++) {
		if (region[i] == NULL)
			continue;
		if (region[i]->words)
			return fa_err(err, errlen, FA_EINVAL,
			              "%s is in region %016" PRIx64 ", which holds the session's "
			              "completion words: register the tensor's buffer itself",
			              names[i], region[i]->id);
		if (async && !on_device[i])
			return fa_err(err, errlen, FA_EINVAL,
			              "asynchronous mode takes device buffers only; %s is in host "
			              "memory%s", names[i],
			              i >= tables ? " (an index table is read in stream order, after "
			                            "the caller's earlier work: copy it to the device on "
			                            "the caller's stream)"
			                          : "");
		if (!on_device[i])
			continue;
		if (*dev >= 0 && region[i]->dev != *dev)
			return fa_err(err, errlen, FA_EINVAL,
			              "%s is on the daemon's GPU %d, an earlier tensor on GPU %d: "
			              "one request's buffers must be on one GPU",
			              names[i], region[i]->dev, *dev);
		*dev = region[i]->dev;
	}
	if (wr != NULL && wr->dev != *dev)
		return fa_err(err, errlen, FA_EINVAL,
		              "the completion words (region %016" PRIx64 ") are on the daemon's GPU "
		              "%d, the tensors on GPU %d: register words on the tensors' GPU",
		              wr->id, wr->dev, *dev);
	return FA_OK;
}

/* The checks every asynchronous attention call (ATTN_FWD, ATTN_BWD, ATTN_VARLEN, ATTN_KVCACHE)
 * passes before its validation: IPC events only between processes of one user, a backend with
 * an asynchronous mode, and the completion words' region (words_region != 0; *wr NULL for the
 * IPC-event form). FA_OK, or the client's status with the detail. */
static fa_status dispatch_async_open(struct dispatch_ctx *c, uint64_t words_region,
                                     struct region **wr)
{
	struct server *srv = c->srv;
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;

	*wr = NULL;
	/* The driver keeps IPC events in /dev/shm/cuda.shm.* files of mode 0600: an event of
	 * another uid cannot be opened (measured: "mapping of buffer object failed"). Completion
	 * words are IPC memory, which opens across users. */
	if (words_region == 0 && c->session->uid != (uint32_t)geteuid())
		return fa_err(err, errlen, FA_EPERM,
		              "asynchronous mode needs CUDA IPC events, which the driver shares "
		              "only between processes of one user (this client is uid %u, the "
		              "daemon uid %u): use synchronous mode",
		              c->session->uid, (unsigned)geteuid());
	if (!srv->backend->async_events)
		return fa_err(err, errlen, FA_ENOTSUP,
		              "asynchronous mode needs the GPU backend; this daemon runs the %s "
		              "backend: use synchronous mode",
		              backend_name(srv->backend));
	return words_region != 0 ? dispatch_words_region(c, words_region, wr) : FA_OK;
}

/* ATTN_FWD: check the in-flight limit, validate, take references, hand to the backend. */
static fa_status dispatch_attn_fwd(struct dispatch_ctx *c)
{
	struct server *srv = c->srv;
	struct session *s = c->session;
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;
	struct validate_result vr;
	struct request *r;
	fa_status st;

	if ((st = dispatch_inflight_ok(c)) != FA_OK)
		return st;
	bool async = c->req->u.fwd.async;
	struct region *wr = NULL;
	if (async && (st = dispatch_async_open(c, c->req->u.fwd.words_region, &wr)) != FA_OK)
		return st;
	st = validate_attn_fwd_memo(s, c->req, srv->backend->align, &vr, err, errlen);
	if (st != FA_OK)
		return st;
	uint64_t max_gflop = dispatch_max_gflop(srv);
	if (max_gflop != 0 && (st = worklimit_check(&vr.desc, max_gflop, err, errlen)) != FA_OK)
		return st;
	if ((vr.desc.window || vr.desc.softcap != 0) && !srv->backend->mask_ext)
		return fa_err(err, errlen, FA_ENOTSUP,
		              "the sliding window and softcap are not yet on the %s backend",
		              backend_name(srv->backend));
	int dev;
	if ((st = dispatch_place_tensors(c, async, vr.region, vr.on_device, fa_fwd_names,
	                                 VALIDATE_NTENSORS, VALIDATE_NTENSORS, wr, &dev)) != FA_OK)
		return st;
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	r->job.desc = vr.desc;
	r->job.q = vr.q;
	r->job.k = vr.k;
	r->job.v = vr.v;
	r->job.o = vr.o;
	r->job.lse = vr.lse;
	memcpy(r->job.on_device, vr.on_device, sizeof vr.on_device);
	r->job.owner = s;
	r->job.dev = dev;
	r->job.async = async;
	r->job.priority = c->req->u.fwd.priority;
	r->job.slot = c->req->u.fwd.slot;
	r->job.has_wait_event = c->req->u.fwd.has_event;
	memcpy(r->job.wait_event, c->req->u.fwd.event, sizeof r->job.wait_event);
	r->job.owner_state = &s->backend_state;
	if (wr != NULL) {
		r->job.words = wr->base;
		r->job.words_seq = c->req->u.fwd.words_seq;
	}
	r->session = s;
	session_ref(s);
	dispatch_hold_regions(r, vr.region, VALIDATE_NTENSORS);
	if (wr != NULL) {
		region_ref(wr); /* the stream writes the done word after the kernel */
		r->regions[r->nregions++] = wr;
	}
	return dispatch_submit(c, r);
}

/* ATTN_BWD: as ATTN_FWD (the in-flight limit, the asynchronous mode's rules, validation, one GPU
 * per request, references), with the backward's nine tensors. */
static fa_status dispatch_attn_bwd(struct dispatch_ctx *c)
{
	struct server *srv = c->srv;
	struct session *s = c->session;
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;
	struct validate_bwd_result vr;
	struct request *r;
	fa_status st;

	if ((st = dispatch_inflight_ok(c)) != FA_OK)
		return st;
	bool async = c->req->u.bwd.async;
	bool words = async && c->req->u.bwd.words_region != 0;
	if (words && ring_old_daemon())
		return dispatch_old_refusal(c, "wrg");
	struct region *wr = NULL;
	if (async && (st = dispatch_async_open(c, c->req->u.bwd.words_region, &wr)) != FA_OK)
		return st;
	st = validate_attn_bwd(s, c->req, srv->backend->align, &vr, err, errlen);
	if (st != FA_OK)
		return st;
	uint64_t max_gflop = dispatch_max_gflop(srv);
	if (max_gflop != 0 &&
	    (st = worklimit_check_bwd(&vr.desc.fwd, max_gflop, err, errlen)) != FA_OK)
		return st;
	int dev;
	if ((st = dispatch_place_tensors(c, async, vr.region, vr.on_device, fa_bwd_names,
	                                 FA_BWD_NTENSORS, FA_BWD_NTENSORS, wr, &dev)) != FA_OK)
		return st;
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	r->job.is_bwd = true;
	r->job.desc = vr.desc.fwd;
	r->job.bwd.desc = vr.desc;
	r->job.q = vr.ptr[FA_BWD_Q];
	r->job.k = vr.ptr[FA_BWD_K];
	r->job.v = vr.ptr[FA_BWD_V];
	r->job.o = vr.ptr[FA_BWD_O];
	r->job.lse = vr.ptr[FA_BWD_LSE];
	r->job.bwd.dout = vr.ptr[FA_BWD_DO];
	r->job.bwd.dq = vr.ptr[FA_BWD_DQ];
	r->job.bwd.dk = vr.ptr[FA_BWD_DK];
	r->job.bwd.dv = vr.ptr[FA_BWD_DV];
	r->job.bwd.flags = c->req->u.bwd.flags;
	r->job.priority = c->req->u.bwd.priority;
	memcpy(r->job.on_device, vr.on_device, sizeof vr.on_device);
	r->job.owner = s;
	r->job.dev = dev;
	r->job.async = async;
	r->job.slot = c->req->u.bwd.slot;
	r->job.has_wait_event = c->req->u.bwd.has_event;
	memcpy(r->job.wait_event, c->req->u.bwd.event, sizeof r->job.wait_event);
	r->job.owner_state = &s->backend_state;
	if (wr != NULL) {
		r->job.words = wr->base;
		r->job.words_seq = c->req->u.bwd.words_seq;
	}
	r->session = s;
	session_ref(s);
	dispatch_hold_regions(r, vr.region, FA_BWD_NTENSORS);
	if (wr != NULL) {
		region_ref(wr); /* the stream writes the done word after the kernels */
		r->regions[r->nregions++] = wr;
	}
	return dispatch_submit(c, r);
}

/* ATTN_VARLEN, ATTN_KVCACHE: the in-flight limit, validation (the index tensors' values are
 * checked on the backend's copy, backend_infer.h), references, the backend. Asynchronous with
 * completion words only, every tensor and index tensor in device memory (PROTOCOL.md 4.3). */
static fa_status dispatch_attn_infer(struct dispatch_ctx *c)
{
	struct server *srv = c->srv;
	struct session *s = c->session;
	char *err = c->rep->detail;
	size_t errlen = sizeof c->rep->detail;
	struct validate_infer_result vr;
	struct request *r;
	fa_status st;

	if ((st = dispatch_inflight_ok(c)) != FA_OK)
		return st;
	bool async = c->req->u.infer.async;
	if (async && ring_old_daemon())
		return dispatch_old_refusal(c, "slot");
	if (!srv->backend->infer)
		return fa_err(err, errlen, FA_ENOTSUP, "%s is not yet on the %s backend",
		              fa_proto_op_name(c->req->op), backend_name(srv->backend));
	struct region *wr = NULL;
	/* (words only: the parser refuses an inference call's IPC-event form) */
	if (async && (st = dispatch_async_open(c, c->req->u.infer.words_region, &wr)) != FA_OK)
		return st;
	if ((st = validate_attn_infer(s, c->req, srv->backend->align, &vr, err, errlen)) != FA_OK)
		return st;
	/* The work limit on a bound that needs no index value (those are read on a worker): every
	 * query row against the most keys a sequence can have. */
	{
		const struct fa_attn_infer_desc *id = &vr.bi->desc;
		struct fa_attn_fwd_desc wd = id->fwd;
		wd.Sq = id->total_q != 0 ? id->total_q : id->fwd.B * id->fwd.Sq; /* packed or dense */
		wd.Sk = id->fwd.Sk; /* a bound until the lengths are read (validate_infer.c) */
		wd.B = 1;
		wd.mask = FA_MASK_NONE;
		uint64_t max_gflop = dispatch_max_gflop(srv);
		if (max_gflop != 0 && wd.Sq > 0 && wd.Sk > 0 &&
		    (st = worklimit_check(&wd, max_gflop, err, errlen)) != FA_OK) {
			backend_infer_free(vr.bi);
			return st;
		}
	}
	if ((r = calloc(1, sizeof(*r))) == NULL) {
		backend_infer_free(vr.bi);
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	}
	/* The tensors' places, as ATTN_FWD's (the index tensors included). */
	const char *names[VALIDATE_INFER_N]; /* the forward's tensors, then the index tables */
	for (int i = 0; i < VALIDATE_INFER_N; i++)
		names[i] = i < FA_FWD_NTENSORS ? fa_fwd_names[i]
		                               : backend_infer_names[i - FA_FWD_NTENSORS];
	int dev;
	if ((st = dispatch_place_tensors(c, async, vr.region, vr.on_device, names,
	                                 VALIDATE_INFER_N, FA_FWD_NTENSORS, wr, &dev)) != FA_OK) {
		backend_infer_free(vr.bi);
		free(r);
		return st;
	}
	memcpy(r->job.on_device, vr.on_device, sizeof vr.on_device);
	r->job.infer = vr.bi;
	r->job.desc = vr.bi->desc.fwd;
	r->job.q = vr.q;
	r->job.k = vr.k;
	r->job.v = vr.v;
	r->job.o = vr.o;
	r->job.lse = vr.lse;
	r->job.owner = s;
	r->job.dev = dev;
	r->job.owner_state = &s->backend_state;
	if (wr != NULL) {
		r->job.async = true;
		r->job.slot = c->req->u.infer.slot;
		r->job.words = wr->base;
		r->job.words_seq = c->req->u.infer.words_seq;
	}
	r->session = s;
	session_ref(s);
	dispatch_hold_regions(r, vr.region, VALIDATE_INFER_N);
	if (wr != NULL) {
		region_ref(wr); /* the stream writes the done word after the kernel */
		r->regions[r->nregions++] = wr;
	}
	return dispatch_submit(c, r);
}

/* RING_OPEN: map the session's submission ring (ring.h). */
static fa_status dispatch_ring_open(struct dispatch_ctx *c)
{
	struct server *srv = c->srv;

	if (srv->rings == NULL)
		return fa_err(c->rep->detail, sizeof c->rep->detail, FA_ENOTSUP,
		              "this daemon serves no submission rings (--max-rings 0): use the "
		              "socket");
	return ring_open(srv->rings, c->session->id, c->session->uid, c->session->pid,
	                 c->req->u.reg.shm_name, c->req->u.reg.size, &c->rep->u.reg.region,
	                 c->rep->detail, sizeof c->rep->detail);
}

static const struct dispatch_op dispatch_ops[] = {
	{FA_OP_HELLO, false, false, dispatch_hello},
	{FA_OP_BYE, true, false, dispatch_bye},
	{FA_OP_PING, true, true, dispatch_ping},
	{FA_OP_STATS, true, false, dispatch_stats},
	{FA_OP_REGISTER, true, true, dispatch_register},
	{FA_OP_UNREGISTER, true, true, dispatch_unregister},
	{FA_OP_ATTN_FWD, true, true, dispatch_attn_fwd},
	{FA_OP_ATTN_BWD, true, true, dispatch_attn_bwd},
	{FA_OP_CLIENTS, true, false, dispatch_clients},
	{FA_OP_ATTN_VARLEN, true, true, dispatch_attn_infer},
	{FA_OP_ATTN_KVCACHE, true, true, dispatch_attn_infer},
	{FA_OP_RING_OPEN, true, false, dispatch_ring_open},
};

/* Ops a ring carries: the calls whose replies are small (a completion entry holds them) and
 * that need no connection of their own. */
static bool dispatch_ring_op(uint32_t op)
{
	switch (op) {
	case FA_OP_PING:
	case FA_OP_ATTN_FWD:
	case FA_OP_ATTN_BWD:
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE:
		return true;
	default:
		return false;
	}
}

/* The table entry of an op, or NULL. */
static const struct dispatch_op *dispatch_find(uint32_t op)
{
	for (size_t i = 0; i < sizeof(dispatch_ops) / sizeof(dispatch_ops[0]); i++)
		if (dispatch_ops[i].op == op)
			return &dispatch_ops[i];
	return NULL;
}

/* ---- entry points ---------------------------------------------------------------------------- */

void dispatch_request(struct server *srv, const struct ipc_peer *peer, const struct ipc_hdr *hdr,
                      const void *body, size_t len)
{
	struct fa_proto_req req;
	char err[FA_PROTO_DETAIL_MAX];
	const struct dispatch_op *op;
	uint64_t t_recv = fa_now_ns();
	fa_status st;

	srv->stats.requests_total++;
	/* fa_proto_decode_req pre-scans the bytes (size, depth, declared lengths) before msgpack-c
	 * sees them; oversize comes back as FA_ETOOBIG. */
	/* (a ring's repeated request: its memo answers without msgpack, the same struct) */
	struct fa_proto_req_memo *memo = ring_req_memo(srv->rings, hdr);
	uint64_t hits = memo != NULL ? memo->hits : 0;
	st = fa_proto_decode_req_memo(memo, body, len, &req, err, sizeof err);
	if (memo != NULL && memo->hits != hits)
		srv->stats.requests_memo++;
	if (st != FA_OK) {
		if (st == FA_EPROTO || st == FA_ETOOBIG)
			srv->stats.requests_malformed++;
		log_info("dispatch: connection %u (pid %u): %zu-byte request refused: %s: %s",
		         peer->pipe, peer->pid, len, fa_status_name(st), err);
		dispatch_fail(srv, NULL, NULL, NULL, hdr, req.op, req.seq, st, err);
		return;
	}
	if ((op = dispatch_find(req.op)) == NULL) {
		snprintf(err, sizeof err, "op %s is not served by this daemon",
		         fa_proto_op_name(req.op));
		dispatch_fail(srv, NULL, NULL, peer, hdr, req.op, req.seq, FA_ENOTSUP, err);
		return;
	}
	if (ring_hdr_is(hdr) && !dispatch_ring_op(req.op)) {
		snprintf(err, sizeof err, "op %s is not served through the submission ring: send "
		         "it on the socket", fa_proto_op_name(req.op));
		dispatch_fail(srv, NULL, NULL, peer, hdr, req.op, req.seq, FA_ENOTSUP, err);
		return;
	}

	struct session *s = NULL;
	struct dedupe_entry *dd = NULL;
	if (op->needs_session) {
		s = session_find(&srv->sessions, req.session);
		/* A ring is bound to its session: its entries name no other (ring.h). */
		bool ring = ring_hdr_is(hdr);
		if (s == NULL || (ring ? ring_hdr_session(hdr) != s->id
		                       : session_attach(s, peer) != FA_OK)) {
			snprintf(err, sizeof err,
			         "session %016" PRIx64
			         " is not open on this daemon (epoch %016" PRIx64
			         "); open a new session",
			         req.session, srv->epoch);
			dispatch_fail(srv, NULL, NULL, peer, hdr, req.op, req.seq, FA_ESESSION,
			              err);
			return;
		}
		session_ref(s); /* BYE closes it under our feet */
		s->requests++;
		if (op->dedupe) {
			switch (dedupe_check(&s->dedupe, req.seq, req.op, hdr, &dd)) {
			case DEDUPE_IN_PROGRESS:
				srv->stats.requests_deduped++;
				log_info(
				    "request %s session %016" PRIx64 " seq %" PRIu64
				    ": repeated while running; the reply goes to the newest copy",
				    fa_proto_op_name(req.op), s->id, req.seq);
				session_unref(s);
				return;
			case DEDUPE_REPLAY:
				srv->stats.requests_deduped++;
				log_info("request %s session %016" PRIx64 " seq %" PRIu64
				         ": repeated; answered from the cache",
				         fa_proto_op_name(req.op), s->id, req.seq);
				dispatch_route(srv, hdr, dd->reply, dd->reply_len);
				session_unref(s);
				return;
			case DEDUPE_CONFLICT:
				snprintf(err, sizeof err,
				         "seq %" PRIu64
				         " was already used by another op in this session",
				         req.seq);
				dispatch_fail(srv, s, NULL, peer, hdr, req.op, req.seq, FA_EPROTO,
				              err);
				session_unref(s);
				return;
			case DEDUPE_NEW:
				break;
			}
		}
	}
	if (srv->state != SERVER_RUNNING) {
		dispatch_fail(srv, s, dd, peer, hdr, req.op, req.seq, FA_ECLOSED,
		              "the daemon is shutting down");
		if (s != NULL)
			session_unref(s);
		return;
	}

	struct fa_proto_rep *rep = &srv->rep;
	dispatch_rep_reset(rep, req.op, req.seq);
	struct dispatch_ctx c = {
		.srv = srv,
		.peer = peer,
		.hdr = hdr,
		.req = &req,
		.session = s,
		.dd = dd,
		.rep = rep,
		.t_recv = t_recv,
	};
	st = op->fn(&c);
	if (!c.async && st != FA_OK)
		dispatch_words_refused(&c, st);
	if (!c.async) {
		rep->status = st;
		if (st == FA_OK)
			rep->detail[0] = '\0';
		dispatch_log_reply(srv, c.session, rep, peer->pipe, t_recv);
		dispatch_send(srv, c.session, dd, hdr, rep);
	}
	if (c.session != NULL)
		session_unref(c.session);
}

/* Count a finished job's computation: forward or backward. */
static void dispatch_count_done(struct server *srv, const struct backend_job *job,
                                uint64_t t_recv)
{
	if (job->is_bwd) {
		srv->stats.bwd_total++;
		srv->stats.bwd_compute_ns += job->compute_ns;
	} else {
		srv->stats.fwd_total++;
		srv->stats.fwd_compute_ns += job->compute_ns;
		metrics_export_fwd(&srv->metrics, fa_now_ns() - t_recv, job->compute_ns);
	}
}

/* See dispatch.h. The job is alive (soon comes before done), so its request is too. */
void dispatch_fwd_soon(struct server *srv, struct backend_job *job, uint64_t end_ns)
{
	struct request *r = (struct request *)job; /* job is the first member */

	/* with a dedupe entry, the newest copy of the request is the one waiting */
	const struct ipc_hdr *to = r->dd != NULL ? &r->dd->hdr : &r->hdr;

	if (!r->release && !job->async && ring_hdr_is(to))
		ring_prewake(srv->rings, to, end_ns);
}

/* The backend finished a job (ATTN_FWD or ATTN_BWD): answer it; see dispatch.h. */
void dispatch_fwd_done(struct server *srv, struct backend_job *job)
{
	struct request *r = (struct request *)job; /* job is the first member */
	struct session *s = r->session;
	struct fa_proto_rep *rep = &srv->rep;
	uint32_t op = job->infer != NULL ? job->infer->op
	              : job->is_bwd    ? FA_OP_ATTN_BWD
	                               : FA_OP_ATTN_FWD;

	if (r->release) {
		/* A refused ring call whose done word is now released: its refusal. */
		dispatch_rep_reset(rep, op, r->seq);
		rep->status = r->refused;
		snprintf(rep->detail, sizeof rep->detail, "%s", r->refused_detail);
		s->inflight--;
		srv->inflight--;
		dispatch_log_reply(srv, s, rep, r->pipe, r->t_recv);
		dispatch_send(srv, s, r->dd, &r->hdr, rep);
		dispatch_request_free(r);
		return;
	}
	if (!r->replied && !job->enqueued && job->status != FA_OK && job->async &&
	    job->words != NULL && !job->done_written && ring_hdr_is(&r->hdr) &&
	    srv->state == SERVER_RUNNING) {
		/* Failed before its kernel was enqueued: its client's stream waits for the done
		 * word all the same. The regions stay held until the release is answered. */
		char detail[FA_PROTO_DETAIL_MAX];
		snprintf(detail, sizeof detail, "%s", job->detail);
		if (dispatch_release_submit(srv, r, job->status, detail))
			return;
		r->release = false;
		job->status = r->refused;
		snprintf(job->detail, sizeof job->detail, "%s", detail);
	}
	if (r->replied && ring_hdr_is(&r->hdr) && job->words != NULL) {
		/* An asynchronous call from a ring: its completion is posted now, with the kernel's
		 * status (the client's sticky error), so a words slot is reused only after its done
		 * word was written. */
		dispatch_rep_reset(rep, op, r->seq);
		rep->status = job->status;
		if (job->status == FA_OK)
			dispatch_count_done(srv, job, r->t_recv);
		else
			snprintf(rep->detail, sizeof rep->detail, "%s", job->detail);
		s->inflight--;
		srv->inflight--;
		dispatch_log_reply(srv, s, rep, r->pipe, r->t_recv);
		dispatch_send(srv, s, r->dd, &r->hdr, rep);
		dispatch_request_free(r);
		return;
	}
	if (r->replied) {
		/* An asynchronous job's kernel finished; its reply went at the enqueue. */
		if (job->status == FA_OK) {
			dispatch_count_done(srv, job, r->t_recv);
		} else {
			log_warn("request %s session %016" PRIx64 " seq %" PRIu64
			         " (asynchronous) failed after its reply: %s: %s",
			         fa_proto_op_name(op), s->id, r->seq, fa_status_name(job->status),
			         job->detail);
		}
		s->inflight--;
		srv->inflight--;
		dispatch_request_free(r);
		return;
	}
	dispatch_rep_reset(rep, op, r->seq);
	rep->status = job->status;
	if (job->enqueued) {
		/* Asynchronous: the kernel is enqueued behind the client's event; answer now with
		 * the event recorded after it. The request (and its regions) live until the
		 * backend hands the job back again, finished. */
		r->replied = true;
		if (ring_hdr_is(&r->hdr) && job->words != NULL)
			return; /* a ring's call is answered when its kernel finished (above); one
			         * with IPC events needs the daemon's event now, as by the socket */
		rep->u.fwd.async = job->words == NULL; /* the event; words need nothing back */
		memcpy(rep->u.fwd.event, job->done_event, sizeof rep->u.fwd.event);
		dispatch_log_reply(srv, s, rep, r->pipe, r->t_recv);
		dispatch_send(srv, s, r->dd, &r->hdr, rep);
		return;
	}
	if (job->status == FA_OK) {
		rep->u.fwd.compute_ns = job->compute_ns;
		dispatch_count_done(srv, job, r->t_recv);
	} else {
		snprintf(rep->detail, sizeof rep->detail, "%s", job->detail);
	}
	s->inflight--;
	srv->inflight--;
	dispatch_log_reply(srv, s, rep, r->pipe, r->t_recv);
	if (job->status == FA_OK)
		log_debug(
		    "request %s seq %" PRIu64 ": B %" PRId64 " Sq %" PRId64 " Sk %" PRId64
		    " Hq %" PRId64 " Hkv %" PRId64 " D %" PRId64 " %s, compute %.1f us",
		    fa_proto_op_name(op), r->seq, job->desc.B, job->desc.Sq, job->desc.Sk, job->desc.Hq, job->desc.Hkv,
		    job->desc.D, fa_dtype_name(job->desc.dtype), (double)job->compute_ns / 1000.0);
	dispatch_send(srv, s, r->dd, &r->hdr, rep);
	dispatch_request_free(r);
}
