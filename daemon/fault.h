/* fault.h - the one place a lost engine is handled: classification feeds in here, the daemon's
 * fatal path comes out.
 *
 * A backend decides what is fatal (the GPU backend: CUDA's sticky errors, gpu_sticky()) and
 * marks it with fault_mark() from any thread. The server then, on the loop thread
 * (fault_fatal): stops feeding systemd's watchdog, answers every queued request FA_EDEVICE and
 * every running one FA_EDEVICE when it finishes, says STOPPING=1 with a STATUS line naming the
 * fault, refuses new work, and once everything is answered exits with FAULT_EXIT_CODE, so
 * systemd's Restart=on-failure brings the daemon back with a clean context and clients see a
 * new epoch. A daemon that keeps answering errors forever is the failure this avoids.
 *
 * Test-only: FA_TEST_FAULT_AFTER=N (read once at start) fails the Nth forward request as a fatal
 * device fault, as if the GPU had reported an illegal address, on any backend.
 */
#ifndef FA_DAEMON_FAULT_H
#define FA_DAEMON_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#define FAULT_EXIT_CODE 70 /* EX_SOFTWARE: the engine is lost, restart us */
#define FAULT_INJECT_ENV "FA_TEST_FAULT_AFTER"

struct server;

/* Any thread: the engine is lost because of `why` (a line naming the fault, for logs, STATUS and
 * the clients' detail). The first call wins; returns true for it. The backend then wakes the
 * loop (its async), whose fault_check() reports it to the server. */
bool fault_mark(struct backend *b, const char *why);

/* Any thread: has the engine been marked lost? */
bool fault_marked(const struct backend *b);

/* Why it was marked ("" while not, or while the first mark is still being written). */
const char *fault_why(const struct backend *b);

/* Loop thread, at the end of a backend's async callback: report a mark to the server (once). */
void fault_check(struct backend *b);

/* Loop thread: the daemon's fatal path, see above (idempotent). */
void fault_fatal(struct server *srv, const char *why);

/* FA_TEST_FAULT_AFTER: 0 when unset; logs a warning when set (test-only). A bad value is
 * ignored with a warning. Read once, at start (server_open). */
uint64_t fault_inject_after_env(void);

/* The counting is backend_submit's (backend.h): it sets job->fault_injected on the Nth job; the
 * server's done hook turns that job into the fault (fault_mark, then fault_fatal). */

#endif /* FA_DAEMON_FAULT_H */
