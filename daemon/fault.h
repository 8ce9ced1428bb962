/* fault.h - a lost engine's state: the backend that sees the fault marks it here, the server
 * learns of it here, and nothing in between needs to know who stops the daemon.
 *
 * A backend decides what is fatal (the GPU backend: CUDA's sticky errors, common/fa_cu.h's
 * fa_cu_sticky()) and marks it with fault_mark() from any thread, then wakes the loop (its
 * async), whose callback ends with fault_check(): that calls the handler the server installed
 * (fault_set_handler) once.
 * The server's handler is the daemon's fatal path (server.c, server_fault): it stops feeding
 * systemd's watchdog, answers every queued request FA_EDEVICE and every running one FA_EDEVICE
 * when it finishes, says STOPPING=1 with a STATUS line naming the fault, refuses new work, and
 * once everything is answered exits with FAULT_EXIT_CODE, so systemd's Restart=on-failure
 * brings the daemon back with a clean context and clients see a new epoch. A daemon that keeps
 * answering errors forever is the failure this avoids.
 *
 * This file sits below the backends and above log.c only: it never calls into the server, the
 * dispatcher or a backend (daemon/README.md, "Who calls whom").
 *
 * Test-only: FA_TEST_FAULT_AFTER=N (read once at start) fails the Nth forward request as a fatal
 * device fault, as if the GPU had reported an illegal address, on any backend.
 */
#ifndef FA_DAEMON_FAULT_H
#define FA_DAEMON_FAULT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fa_proto.h"

#define FAULT_EXIT_CODE 70 /* EX_SOFTWARE: the engine is lost, restart us */
#define FAULT_INJECT_ENV "FA_TEST_FAULT_AFTER"

struct backend;

/* Called on the loop thread by fault_check, once, with the first mark's why (borrowed: it lives
 * as long as the backend). */
typedef void (*fault_handler_fn)(struct backend *b, const char *why, void *arg);

/* One engine's fault state, embedded in struct backend (`fault`). Only fault.c reads or writes
 * it; everyone else goes through the functions below. */
struct fault {
	atomic_int state;              /* 0 healthy, 1 being marked, 2 lost (why is set) */
	char why[FA_PROTO_DETAIL_MAX];
	bool reported;                 /* loop: the handler was called */
	fault_handler_fn handler;      /* set by the server at start; NULL: nobody listens */
	void *handler_arg;
};

/* Any thread: the engine is lost because of `why` (a line naming the fault, for logs, STATUS and
 * the clients' detail; copied). The first call wins; returns true for it. The backend then
 * wakes the loop (its async), whose fault_check() reports it. */
bool fault_mark(struct backend *b, const char *why);

/* Any thread: has the engine been marked lost? */
bool fault_marked(const struct backend *b);

/* Why it was marked ("" while not, or while the first mark is still being written). The text
 * belongs to the backend and does not change once set. */
const char *fault_why(const struct backend *b);

/* Loop thread, at the end of a backend's async callback: call the handler for a mark (once). */
void fault_check(struct backend *b);

/* Loop thread, before the backend's first job: who hears of a mark (the server's fatal path;
 * NULL: nobody). */
void fault_set_handler(struct backend *b, fault_handler_fn handler, void *arg);

/* FA_TEST_FAULT_AFTER: 0 when unset; logs a warning when set (test-only). A bad value is
 * ignored with a warning. Read once, at start (server_open). */
uint64_t fault_inject_after_env(void);

/* The counting is backend_submit's (backend.h): it sets job->fault_injected on the Nth job; the
 * server's done hook turns that job into the fault (fault_mark, then the fatal path). */

#endif /* FA_DAEMON_FAULT_H */
