/* server.c - start, glue and stop: wires ipc, sessions, dispatch and the backend together. The
 * one file that stops the server: SIGTERM (server_shutdown, from main) and a lost device
 * (server_fault, the handler the backend's fault mark reaches) both end in server_stop. */
#include "server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "dispatch.h"
#include "fault.h"
#include "log.h"
#include "metrics_export.h"
#include "notify.h"
#include "region.h"
#include "util.h"

#define SERVER_RECV_MAX (1u << 20)     /* a larger message closes its connection */
#define SERVER_LINGER_POLL_MS 5
#define SERVER_LINGER_MAX_NS (1000 * 1000000ull)  /* however busy the socket is */
#define SERVER_DEDUPE_EXTRA 32   /* ring entries beyond --max-inflight: recent finished requests */
#define SERVER_DEDUPE_MAX 1024   /* past this, scans cost more than rare unprotected repeats */

static void server_stop(struct server *srv, const char *notify_text);
static void server_check_drained(struct server *srv);
static void server_fault(struct server *srv, const char *why);

/* ---- glue ------------------------------------------------------------------------------------ */

static void server_on_recv(void *arg, const struct ipc_peer *peer, const struct ipc_hdr *hdr,
                           const void *body, size_t len)
{
	struct server *srv = arg;

	dispatch_request(srv, peer, hdr, body, len);
	/* an inline run's reply now, not after the loop's next poll (~2 us of a tiny request's
	 * ~3 us in the daemon, H200 host 2026-12-03) */
	if (srv->backend != NULL && srv->backend->ops->flush != NULL)
		srv->backend->ops->flush(srv->backend);
}

/* A connection closed: sessions that used only it close too. */
static void server_on_pipe_closed(void *arg, const struct ipc_peer *peer)
{
	struct server *srv = arg;

	session_pipe_closed(&srv->sessions, peer->pipe);
}

/* The backend expects a running job to finish at end_ns (on the loop): a ring's client is woken
 * just before (dispatch_fwd_soon). */
static void server_on_job_soon(struct backend_job *job, uint64_t end_ns, void *arg)
{
	dispatch_fwd_soon(arg, job, end_ns);
}

/* The backend finished a job (on the loop). The fatal path's hook: the test-only injected fault
 * becomes a device fault here, a fault marked by the backend starts server_fault before its job
 * is answered, and a job that finishes after the fault is answered FA_EDEVICE whatever it
 * computed (the device it ran on is not trusted any more). Once answered, a stop in progress may
 * be able to proceed. */
static void server_on_job_done(struct backend_job *job, void *arg)
{
	struct server *srv = arg;

	if (job->fault_injected && !srv->faulted && srv->backend != NULL) {
		job->status = FA_EDEVICE;
		snprintf(job->detail, sizeof job->detail,
		         "injected fault (%s=%" PRIu64 ", test only): as if the GPU reported CUDA "
		         "error 700 (an illegal memory access was encountered); the context is lost, "
		         "the daemon restarts",
		         FAULT_INJECT_ENV, srv->backend->fault_inject_after);
		fault_mark(srv->backend, job->detail);
	}
	if (!srv->faulted && srv->backend != NULL && fault_why(srv->backend)[0] != '\0')
		server_fault(srv, fault_why(srv->backend));
	else if (srv->faulted && job->status == FA_OK) {
		job->status = FA_EDEVICE;
		snprintf(job->detail, sizeof job->detail,
		         "device fault (%.140s) while this request ran; the daemon restarts: "
		         "reconnect and retry",
		         srv->fault_why);
	}
	dispatch_fwd_done(srv, job);
	server_check_drained(srv);
}

/* The backend marked a fault and woke the loop (fault_check): the fatal path. */
static void server_on_fault(struct backend *b, const char *why, void *arg)
{
	(void)b;
	server_fault(arg, why);
}

/* A session took up or let go of a connection: the transport's idle deadline follows it. */
static void server_on_session_pipe(uint32_t pipe, bool used, void *arg)
{
	struct server *srv = arg;

	if (srv->ipc == NULL)
		return;
	if (used)
		ipc_pipe_hold(srv->ipc, pipe);
	else
		ipc_pipe_release(srv->ipc, pipe);
}

/* A session is closing: its queued work will never be wanted. */
static void server_on_session_close(struct session *s, void *arg)
{
	struct server *srv = arg;

	ring_close_session(srv->rings, s->id); /* its thread stops; late replies are dropped */
	/* The client is gone (or said BYE): nothing it asked for is wanted any more. Started
	 * requests stop after the piece they are running (backend.h, ops.stop). */
	if (srv->backend != NULL && s->inflight > 0)
		backend_drop(srv->backend, s, "the session closed before this request finished");
}

/* A session's last reference went: the backend's state for it (async streams, events) goes. */
static void server_on_session_free(struct session *s, void *arg)
{
	struct server *srv = arg;

	if (s->backend_state != NULL && srv->backend != NULL &&
	    srv->backend->ops->owner_free != NULL)
		srv->backend->ops->owner_free(srv->backend, s->backend_state);
	s->backend_state = NULL;
}

/* ---- start ----------------------------------------------------------------------------------- */

static void server_part_closed(void *arg);

/* The watchdog's check: the backend can still compute (also while draining: a graceful stop
 * is bounded by systemd's TimeoutStopSec, not by the watchdog). */
static bool server_is_healthy(void *arg)
{
	struct server *srv = arg;

	if (srv->backend == NULL || srv->faulted || fault_marked(srv->backend))
		return false; /* a lost device: systemd must not think we are fine */
	return srv->backend->ops->healthy == NULL || srv->backend->ops->healthy(srv->backend);
}

/* Fit the connection caps and the soft file limit to each other; see server.h. The soft limit
 * is raised only as far as needed (never lowered), as redis does for maxclients: other code in
 * the process (the CUDA driver, select() users) is not asked to live with a huge one. */
static fa_status server_fd_limit(struct server *srv, char *err, size_t errlen)
{
	const struct config *cfg = srv->cfg;
	struct rlimit rl;
	uint64_t need = (uint64_t)cfg->max_connections + SERVER_FD_HEADROOM;

	srv->max_conns = (unsigned)cfg->max_connections;
	srv->max_conns_per_uid = (unsigned)cfg->max_connections_per_uid;
	srv->reserved_conns = (unsigned)cfg->reserved_connections;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return fa_err(err, errlen, FA_ESYS, "getrlimit(RLIMIT_NOFILE): %s",
		              strerror(errno));
	uint64_t old = rl.rlim_cur;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
		struct rlimit want = rl;
		want.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need
		                    ? (rlim_t)need : rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			rl = want;
		else
			log_warn("server: cannot raise the soft file limit from %" PRIu64
			         " to %" PRIu64 ": %s", old, (uint64_t)want.rlim_cur,
			         strerror(errno));
	}
	srv->nofile = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
	if (srv->nofile < need) {
		uint64_t fit = srv->nofile > SERVER_FD_HEADROOM ? srv->nofile - SERVER_FD_HEADROOM : 0;
		if (fit < SERVER_MIN_CONNS)
			return fa_err(err, errlen, FA_ESYS,
			              "the file limit (%" PRIu64 ", hard %" PRIu64 ") leaves room "
			              "for %" PRIu64 " connections, fewer than %d: raise "
			              "LimitNOFILE= (or ulimit -Hn) to at least %" PRIu64,
			              srv->nofile, (uint64_t)rl.rlim_max, fit, SERVER_MIN_CONNS,
			              need);
		srv->max_conns = (unsigned)fit;
		if (srv->max_conns_per_uid > srv->max_conns)
			srv->max_conns_per_uid = srv->max_conns;
		if (srv->reserved_conns >= srv->max_conns / 2)
			srv->reserved_conns = srv->max_conns / 8;
		log_warn("server: the file limit is %" PRIu64 " (hard %" PRIu64 "), below the %" PRIu64
		         " that max-connections %d needs: serving at most %u connections (%u per "
		         "uid, %u reserved); raise LimitNOFILE= or ulimit -Hn",
		         srv->nofile, (uint64_t)rl.rlim_max, need, cfg->max_connections,
		         srv->max_conns, srv->max_conns_per_uid, srv->reserved_conns);
	} else if (old != srv->nofile) {
		log_notice("server: raised the soft file limit from %" PRIu64 " to %" PRIu64
		           " (max-connections %u + %d other descriptors)",
		           old, srv->nofile, srv->max_conns, SERVER_FD_HEADROOM);
	}
	return FA_OK;
}

/* Start the backend, then the socket, then tell systemd; see server.h. */
fa_status server_open(struct server *srv, uv_loop_t *loop, const struct config *cfg, char *err,
                      size_t errlen)
{
	char desc[8192];
	fa_status st;

	memset(srv, 0, sizeof(*srv));
	srv->cfg = cfg;
	srv->loop = loop;
	srv->start_ns = fa_now_ns();
	srv->state = SERVER_RUNNING;
	if ((st = util_random_u64(&srv->epoch)) != FA_OK)
		return fa_err(err, errlen, st, "no randomness for the epoch");
	unsigned ring = (unsigned)cfg->max_inflight + SERVER_DEDUPE_EXTRA;
	session_table_init(&srv->sessions, (unsigned)cfg->max_sessions, (unsigned)cfg->max_regions,
	                   ring < SERVER_DEDUPE_MAX ? ring : SERVER_DEDUPE_MAX);
	srv->sessions.on_close = server_on_session_close;
	srv->sessions.on_close_arg = srv;
	srv->sessions.on_free = server_on_session_free;
	srv->sessions.on_free_arg = srv;
	srv->sessions.on_pipe = server_on_session_pipe;
	srv->sessions.on_pipe_arg = srv;

	config_describe(cfg, desc, sizeof desc);
	log_notice("fa-daemon %s (protocol %d) pid %ld starting", fa_version_string(),
	           FA_PROTO_VERSION, (long)getpid());
	log_notice("config: %s", desc);
	if ((st = server_fd_limit(srv, err, errlen)) != FA_OK) {
		srv->state = SERVER_CLOSED;
		return st;
	}

	/* The backend before the socket: a daemon that cannot compute should not accept. */
	st = backend_open(cfg->backend, &srv->backend, loop, cfg, server_on_job_done, srv, err,
	                  errlen);
	if (st != FA_OK) {
		srv->backend = NULL;
		return st;
	}
	fault_set_handler(srv->backend, server_on_fault, srv);
	srv->backend->soon = server_on_job_soon;
	srv->backend->soon_arg = srv;
	srv->backend->fault_inject_after = fault_inject_after_env();
	struct ipc_params p = {
		.path = cfg->socket,
		.mode = cfg->socket_mode,
		.recv_max = SERVER_RECV_MAX,
		.on_recv = server_on_recv,
		.on_pipe_closed = server_on_pipe_closed,
		.arg = srv,
		.max_conns = srv->max_conns,
		.max_conns_per_uid = srv->max_conns_per_uid,
		.reserved_conns = srv->reserved_conns,
		.frame_ms = (unsigned)cfg->frame_timeout_ms,
		.idle_ms = (unsigned)cfg->idle_timeout_ms,
	};
	if ((st = ipc_open(&srv->ipc, loop, &p, err, errlen)) != FA_OK) {
		srv->ipc = NULL;
		srv->state = SERVER_CLOSING;
		srv->closing = 1;
		backend_close(srv->backend, server_part_closed, srv);
		srv->backend = NULL;
		return st;
	}
	struct ring_params rp = {
		.loop = loop,
		.on_recv = server_on_recv,
		.arg = srv,
		.max_rings = (unsigned)cfg->max_rings,
		.spin_us = cfg->ring_spin_us >= 0 ? (unsigned)cfg->ring_spin_us
		           : sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? 200u : 0u,
		.loop_spin_us = cfg->loop_spin_us >= 0 ? (unsigned)cfg->loop_spin_us
		                : sysconf(_SC_NPROCESSORS_ONLN) >= 4 ? 200u : 0u,
		.max_bytes = cfg->max_region_bytes,
	};
	if (cfg->max_rings > 0 && rings_open(&srv->rings, &rp, desc, sizeof desc) != FA_OK) {
		log_warn("server: no submission rings (calls go by the socket): %s", desc);
		srv->rings = NULL;
	}
	log_notice("server: ready on %s (mode %04o), backend %s with %u threads, epoch %016" PRIx64,
	           cfg->socket, cfg->socket_mode, backend_name(srv->backend), srv->backend->threads,
	           srv->epoch);
	notify_sendf("READY=1\nSTATUS=serving on %s, backend %s, %u threads", cfg->socket,
	             backend_name(srv->backend), srv->backend->threads);
	if (watchdog_start(&srv->watchdog, loop, server_is_healthy, srv) != FA_OK)
		log_warn("server: cannot start the watchdog timer: systemd will restart us");
	if (cfg->metrics_file[0] != '\0' &&
	    metrics_file_start(&srv->metrics_file, loop, cfg->metrics_file,
	                       (unsigned)cfg->metrics_interval_ms, metrics_export_text, srv, desc,
	                       sizeof desc) != FA_OK)
		log_warn("server: no metrics file: %s", desc);
	return FA_OK;
}

/* ---- stop ------------------------------------------------------------------------------------ */

static void server_part_closed(void *arg)
{
	struct server *srv = arg;

	if (--srv->closing > 0)
		return;
	srv->state = SERVER_CLOSED;
	log_notice("server: stopped");
	if (srv->closed != NULL)
		srv->closed(srv->closed_arg);
}

/* The linger timer or the drain timer is closed. */
static void server_timer_closed(uv_handle_t *h)
{
	server_part_closed(h->data);
}

/* Everything answered: close the socket, unmap every region, stop the backend. */
static void server_teardown(struct server *srv)
{
	srv->state = SERVER_CLOSING;
	srv->closing = 1; /* this function's own reference, dropped at the end */
	srv->closing++;
	watchdog_stop(&srv->watchdog, server_part_closed, srv);
	srv->closing++;
	metrics_file_stop(&srv->metrics_file, server_part_closed, srv);
	if (srv->timer_open) {
		srv->closing++;
		srv->timer_open = false;
		uv_close((uv_handle_t *)&srv->timer, server_timer_closed);
	}
	if (srv->drain_timer_open) {
		srv->closing++;
		srv->drain_timer_open = false;
		uv_close((uv_handle_t *)&srv->drain_timer, server_timer_closed);
	}
	if (srv->ipc != NULL) {
		srv->closing++;
		ipc_close(srv->ipc, server_part_closed, srv);
		srv->ipc = NULL;
	}
	if (srv->rings != NULL) {
		srv->closing++;
		rings_close(srv->rings, server_part_closed, srv);
		srv->rings = NULL;
	}
	/* Unmap only: a clean restart keeps the clients' shm objects for the next daemon. */
	session_table_fini(&srv->sessions, false);
	/* A lost device set exit_code (server_fault): systemd's Restart=on-failure then brings
	 * back a clean context. */
	if (srv->backend != NULL) {
		srv->closing++;
		backend_close(srv->backend, server_part_closed, srv);
		srv->backend = NULL;
	}
	server_part_closed(srv);
}

/* Linger until every reply is written to its socket (then the peer reads it even after we
 * close), bounded: a client that does not read cannot hold the shutdown. */
static void server_linger_cb(uv_timer_t *t)
{
	struct server *srv = t->data;
	uint64_t now = fa_now_ns();
	bool quiet = srv->ipc == NULL || ipc_sends_pending(srv->ipc) == 0;

	if (quiet || now - srv->linger_start_ns >= SERVER_LINGER_MAX_NS) {
		uv_timer_stop(t);
		server_teardown(srv);
	}
}

/* When shutting down and nothing is in flight, start the linger. Called after every answered
 * forward request and when the stop begins. */
static void server_check_drained(struct server *srv)
{
	if (srv->state != SERVER_DRAINING || srv->inflight > 0)
		return;
	srv->state = SERVER_LINGER;
	srv->linger_start_ns = fa_now_ns();
	if (srv->drain_timer_open)
		uv_timer_stop(&srv->drain_timer);
	log_notice("server: every request answered %.1f ms after the stop began; closing the socket",
	           (double)(srv->linger_start_ns - srv->drain_start_ns) / 1e6);
	if (uv_timer_init(srv->loop, &srv->timer) != 0) {
		server_teardown(srv);
		return;
	}
	srv->timer.data = srv;
	srv->timer_open = true;
	uv_timer_start(&srv->timer, server_linger_cb, 0, SERVER_LINGER_POLL_MS);
}

/* See server.h. */
void server_set_closed(struct server *srv, void (*closed)(void *arg), void *arg)
{
	srv->closed = closed;
	srv->closed_arg = arg;
}

/* Stop taking work, cancel what has not started, wait for the rest; see server.h. */
void server_shutdown(struct server *srv, void (*closed)(void *arg), void *arg)
{
	if (closed != NULL)
		server_set_closed(srv, closed, arg);
	server_stop(srv, "STOPPING=1\nSTATUS=stopping");
}

/* The drain deadline passed with requests still running: stop them. Each is answered
 * FA_ECLOSED after the piece it is computing (the CPU backend's pieces are ~50 ms; the GPU
 * backend's launches), then the drain ends as usual. Past this only systemd's TimeoutStopSec
 * (a kernel that never returns) is left. */
static void server_drain_deadline_cb(uv_timer_t *t)
{
	struct server *srv = t->data;
	char why[FA_PROTO_DETAIL_MAX];

	if (srv->state != SERVER_DRAINING || srv->inflight == 0 || srv->backend == NULL)
		return;
	snprintf(why, sizeof why,
	         "the daemon is stopping and its drain deadline (--drain-timeout-ms %d) passed "
	         "before this request finished; retry on the restarted daemon",
	         srv->cfg->drain_timeout_ms);
	unsigned n = backend_drop(srv->backend, NULL, why);
	log_notice("server: drain deadline of %d ms passed with %u requests in flight: stopped %u "
	           "of them (answered FA_ECLOSED)",
	           srv->cfg->drain_timeout_ms, srv->inflight, n);
}

/* Arm the drain deadline (the stop began with requests in flight). */
static void server_drain_start(struct server *srv)
{
	if (srv->inflight == 0 || srv->drain_timer_open)
		return;
	if (uv_timer_init(srv->loop, &srv->drain_timer) != 0) {
		log_warn("server: cannot arm the drain deadline: running requests finish whole");
		return;
	}
	srv->drain_timer.data = srv;
	srv->drain_timer_open = true;
	uv_timer_start(&srv->drain_timer, server_drain_deadline_cb,
	               (uint64_t)srv->cfg->drain_timeout_ms, 0);
}

/* The stop itself (server_shutdown and server_fault): STOPPING=1 with `notify_text` (the whole
 * datagram, "STOPPING=1\nSTATUS=..."), cancel the queued, give the running until the drain
 * deadline. Idempotent. */
static void server_stop(struct server *srv, const char *notify_text)
{
	if (srv->state != SERVER_RUNNING)
		return;
	srv->state = SERVER_DRAINING;
	srv->drain_start_ns = fa_now_ns();
	log_notice("server: shutting down: %u requests in flight, %u sessions; running requests "
	           "may finish for %d ms", srv->inflight, session_count(&srv->sessions),
	           srv->cfg->drain_timeout_ms);
	notify_send(notify_text);
	if (srv->backend != NULL) {
		unsigned n = backend_cancel(srv->backend, NULL, "the daemon is shutting down");
		if (n > 0)
			log_info("server: %u queued requests will be answered FA_ECLOSED", n);
	}
	server_drain_start(srv);
	server_check_drained(srv);
}

/* ---- a lost device --------------------------------------------------------------------------- */

/* The daemon's fatal path (fault.h), on the loop thread; idempotent. Queued jobs are failed
 * here; running ones are failed as they finish (server_on_job_done, once srv->faulted is set);
 * server_stop does the rest. */
static void server_fault(struct server *srv, const char *why)
{
	char status[FA_PROTO_DETAIL_MAX + 64];

	if (srv->faulted)
		return;
	srv->faulted = true;
	snprintf(srv->fault_why, sizeof srv->fault_why, "%s", why);
	srv->exit_code = FAULT_EXIT_CODE; /* also when a graceful stop was already under way */
	if (srv->backend != NULL)
		fault_mark(srv->backend, why); /* the injected fault was marked by nobody yet */
	log_err("server: the device is lost: %s; answering every pending request FA_EDEVICE and "
	        "exiting with status %d for a restart with a clean context (new epoch)",
	        why, FAULT_EXIT_CODE);
	if (srv->backend != NULL) {
		char detail[FA_PROTO_DETAIL_MAX];
		snprintf(detail, sizeof detail,
		         "device fault (%.140s) before this request ran; the daemon restarts: "
		         "reconnect and retry",
		         why);
		unsigned n = backend_fail_queued(srv->backend, detail);
		if (n > 0)
			log_info("server: %u queued requests will be answered FA_EDEVICE", n);
	}
	if (srv->state >= SERVER_CLOSING)
		return; /* everything answered and closing: only the exit code changes */
	snprintf(status, sizeof status,
	         "STOPPING=1\nSTATUS=device fault: %s; exiting %d for a restart", why,
	         FAULT_EXIT_CODE);
	if (srv->state == SERVER_RUNNING)
		server_stop(srv, status);
	else
		notify_send(status); /* a graceful stop was already under way: say why it ends so */
}
