/* fault.c - a lost engine's mark, from any thread to the server's handler; see fault.h. */
#include "fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "log.h"

enum { FAULT_NONE = 0, FAULT_MARKING = 1, FAULT_MARKED = 2 };

/* See fault.h. The why is written between the two states, so a reader that sees MARKED sees it
 * whole. */
bool fault_mark(struct backend *b, const char *why)
{
	struct fault *f = &b->fault;
	int expected = FAULT_NONE;

	if (!atomic_compare_exchange_strong(&f->state, &expected, FAULT_MARKING))
		return false;
	snprintf(f->why, sizeof f->why, "%s", why != NULL ? why : "device fault");
	atomic_store(&f->state, FAULT_MARKED);
	return true;
}

/* See fault.h. */
bool fault_marked(const struct backend *b)
{
	return atomic_load(&((struct backend *)b)->fault.state) != FAULT_NONE;
}

/* See fault.h. */
const char *fault_why(const struct backend *b)
{
	if (atomic_load(&((struct backend *)b)->fault.state) != FAULT_MARKED)
		return "";
	return b->fault.why;
}

/* See fault.h. A mark still being written is reported by the async its writer sends after. */
void fault_check(struct backend *b)
{
	struct fault *f = &b->fault;

	if (f->reported || atomic_load(&f->state) != FAULT_MARKED)
		return;
	f->reported = true;
	if (f->handler != NULL)
		f->handler(b, f->why, f->handler_arg);
}

/* See fault.h. */
void fault_set_handler(struct backend *b, fault_handler_fn handler, void *arg)
{
	b->fault.handler = handler;
	b->fault.handler_arg = arg;
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
