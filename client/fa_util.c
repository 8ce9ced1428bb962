/* fa_util.c - the bottom of libfaclient: this thread's detail text, debug lines, deadlines.
 *
 * Internal (fa__ names, hidden like everything in client/ but the FA_API functions); every other
 * client file builds on it and it calls none of them, so the client's files form no call cycle.
 * Also the spare reply buffer (fa__rep_get / fa__rep_free), which fa_call.c and fa_ring.c share.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_client_int.h"

/* The detail of the last failed call on this thread (fa_last_error_detail). */
static _Thread_local char tls_detail[FA_PROTO_DETAIL_MAX];

/* Clear this thread's detail; see fa_client_int.h. */
void fa__detail_clear(void)
{
	tls_detail[0] = '\0';
}

/* Set this thread's detail and return st; see fa_client_int.h. */
fa_status fa__fail(fa_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fa_verr(tls_detail, sizeof tls_detail, st, fmt, ap);
	va_end(ap);
	return st;
}

/* This thread's detail buffer; see fa_client_int.h. */
char *fa__detail(void)
{
	return tls_detail;
}

/* A debug line on stderr when FA_DEBUG is set; see fa_client_int.h. */
void fa__debug(const char *fmt, ...)
{
	const char *env = getenv("FA_DEBUG");
	va_list ap;

	if (env == NULL || env[0] == '\0' || strcmp(env, "0") == 0)
		return;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* The deadline of a call; see fa_client_int.h. */
int64_t fa__deadline(int timeout_ms)
{
	return timeout_ms <= 0 ? 0 : (int64_t)fa_now_ns() + (int64_t)timeout_ms * 1000000;
}

/* One reply buffer kept between calls: a 16 KiB malloc and free on every call were ~300
 * instructions of a tiny call's ~4,000 in the client (2026-12-03). A second caller at the same
 * time allocates its own; the spare stays reachable until the process ends. */
static _Atomic(struct fa_proto_rep *) rep_spare;

struct fa_proto_rep *fa__rep_get(void)
{
	struct fa_proto_rep *rep = atomic_exchange(&rep_spare, NULL);

	return rep != NULL ? rep : malloc(sizeof *rep);
}

void fa__rep_free(struct fa_proto_rep *rep)
{
	struct fa_proto_rep *none = NULL;

	if (rep != NULL && !atomic_compare_exchange_strong(&rep_spare, &none, rep))
		free(rep);
}
