/* fault.c - a lost engine, from the mark (any thread) to the daemon's exit 70; see fault.h. */
#include "fault.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "notify.h"
#include "server.h"

enum { FAULT_NONE = 0, FAULT_MARKING = 1, FAULT_MARKED = 2 };

/* See fault.h. The why is written between the two states, so a reader that sees MARKED sees it
 * whole. */
bool fault_mark(struct backend *b, const char *why)
{
	int expected = FAULT_NONE;

	if (!atomic_compare_exchange_strong(&b->fault_state, &expected, FAULT_MARKING))
		return false;
	snprintf(b->fault_why, sizeof b->fault_why, "%s", why != NULL ? why : "device fault");
	atomic_store(&b->fault_state, FAULT_MARKED);
	return true;
}

/* See fault.h. */
bool fault_marked(const struct backend *b)
{
	return atomic_load(&((struct backend *)b)->fault_state) != FAULT_NONE;
}

/* See fault.h. */
const char *fault_why(const struct backend *b)
{
	if (atomic_load(&((struct backend *)b)->fault_state) != FAULT_MARKED)
		return "";
	return b->fault_why;
}

/* See fault.h. A mark still being written is reported by the async its writer sends after. */
void fault_check(struct backend *b)
{
	if (b->fault_reported || atomic_load(&b->fault_state) != FAULT_MARKED)
		return;
	b->fault_reported = true;
	if (b->on_fault != NULL)
		b->on_fault(b, b->fault_why, b->on_fault_arg);
}

/* See fault.h. Queued jobs are failed here; running ones are failed as they finish
 * (server.c's done hook, once srv->faulted is set); server_stop does the rest. */
void fault_fatal(struct server *srv, const char *why)
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

/* See fault.h. */
uint64_t fault_inject_after_env(void)
{
	const char *v = getenv(FAULT_INJECT_ENV);
	char *end;

	if (v == NULL || *v == '\0')
		return 0;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (errno != 0 || *end != '\0' || n == 0 || v[0] == '-') {
		log_warn("server: %s='%s' ignored: not a positive integer (test-only switch)",
		         FAULT_INJECT_ENV, v);
		return 0;
	}
	log_warn("server: %s=%llu: TEST ONLY: forward request %llu will fail as a fatal device "
	         "fault and the daemon will exit %d; never set this in production",
	         FAULT_INJECT_ENV, n, n, FAULT_EXIT_CODE);
	return (uint64_t)n;
}
