/* server.h - the daemon's state and lifecycle: one struct, owned by the loop thread.
 *
 * server_open starts the backend, binds the socket and says READY=1; requests flow
 * ipc -> dispatch -> (backend ->) dispatch -> ipc. server_shutdown stops: queued requests are
 * answered FA_ECLOSED, running ones finish and are answered, new ones get FA_ECLOSED, then the
 * socket closes, regions are unmapped (not unlinked: clients own their shm names and register
 * them with the next daemon), the backend's threads stop, and `closed` runs.
 * A lost device (fault.h) stops the server the same way by itself, answering FA_EDEVICE, and
 * sets exit_code to FAULT_EXIT_CODE: the backend's fault mark reaches the server through the
 * handler it installs (fault_set_handler), and only server.c ever stops the server.
 */
#ifndef FA_DAEMON_SERVER_H
#define FA_DAEMON_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "backend.h"
#include "config.h"
#include "fa_proto.h"
#include "ipc.h"
#include "metrics.h"
#include "ring.h"
#include "metrics_file.h"
#include "session.h"
#include "stats.h"
#include "watchdog.h"

enum server_state {
	SERVER_RUNNING,
	SERVER_DRAINING, /* shutting down: waiting for running requests */
	SERVER_LINGER,   /* all answered: waiting for the last replies to be written */
	SERVER_CLOSING,  /* handles closing */
	SERVER_CLOSED,
};

struct server {
	const struct config *cfg;
	uv_loop_t *loop;
	struct ipc *ipc;          /* NULL once closed */
	struct rings *rings;      /* the submission rings (ring.h); NULL once closed or none */
	struct backend *backend;  /* NULL once closed */
	struct session_table sessions;
	struct stats stats;
	uint64_t epoch;           /* random per start; in every reply */
	uint64_t start_ns;
	unsigned inflight;        /* ATTN_FWD requests accepted and not answered, all sessions */
	enum server_state state;
	uv_timer_t timer;         /* the linger poll */
	uv_timer_t drain_timer;   /* the drain deadline (--drain-timeout-ms) */
	bool drain_timer_open;
	uint64_t drain_start_ns;  /* the stop began */
	struct watchdog watchdog; /* systemd's WatchdogSec, fed while the backend is healthy */
	struct metrics metrics;   /* latency histograms (dispatch.c records, STATS and the file read) */
	struct metrics_file metrics_file; /* --metrics-file: the Prometheus textfile, when set */
	bool timer_open;
	uint64_t linger_start_ns;
	/* The connection caps in force: the configuration's, lowered when the hard file limit
	 * cannot hold them (server_open), and the soft file limit they were fitted to. */
	unsigned max_conns, max_conns_per_uid, reserved_conns;
	uint64_t nofile;
	int closing;              /* handles / parts still closing */
	void (*closed)(void *arg);
	void *closed_arg;
	int exit_code;            /* for main: 0, or FAULT_EXIT_CODE after a device fault */
	bool faulted;             /* the fatal path ran: everything left is answered FA_EDEVICE */
	char fault_why[FA_PROTO_DETAIL_MAX];

	/* Scratch for the loop thread: one reply is built and encoded at a time. */
	struct fa_proto_rep rep;
	uint8_t rep_buf[FA_PROTO_MAX_MSG];
};

/* File descriptors the daemon needs beyond one per connection: the listener, the loop's own,
 * the log, the CUDA driver's device files (a few per GPU and per context), NVRTC while it
 * compiles, a shm object while it is being mapped (closed once mapped). systemd/README.md
 * derives LimitNOFILE= from it. */
#define SERVER_FD_HEADROOM 512
#define SERVER_MIN_CONNS 64 /* fewer fit under the hard file limit: refuse to start */

/* Start everything on `loop`: first the file limit (the soft RLIMIT_NOFILE raised to
 * max-connections + SERVER_FD_HEADROOM within the hard limit; if the hard limit is lower, the
 * caps are lowered to fit, with a warning, and below SERVER_MIN_CONNS the start fails with
 * FA_ESYS), then backend, socket, READY=1. cfg must outlive the server. On failure
 * whatever was started is being closed: run the loop until it returns, then stop. Returns FA_OK
 * or the failing part's status, with err saying why. */
fa_status server_open(struct server *srv, uv_loop_t *loop, const struct config *cfg, char *err,
                      size_t errlen);

/* Begin the graceful stop (idempotent). Queued requests are answered FA_ECLOSED at once;
 * running ones may finish for --drain-timeout-ms, then they are stopped (backend ops.stop: within
 * one piece of work) and answered FA_ECLOSED. `closed` is called from the loop once every handle
 * of the server is closed and its memory released (NULL: keep the one set before). */
void server_shutdown(struct server *srv, void (*closed)(void *arg), void *arg);

/* The `closed` callback for a stop the server starts by itself (a device fault): the owner of
 * the loop sets it once the server is open. */
void server_set_closed(struct server *srv, void (*closed)(void *arg), void *arg);

#endif /* FA_DAEMON_SERVER_H */
