/* fa_integ.h - end-to-end helpers on top of libfaclient: statistics snapshots, bounded waits on
 * them, one checked attention call. Header-only for the same reason as fa_case.h (needs
 * libfaclient; the helpers' .c files must stay libc-only).
 *
 * Fork rule for test programs: nanomsg keeps worker threads while any of its sockets is open, and
 * a child forked then inherits a library whose threads are gone. So a test process forks client
 * processes only while it holds no open fa_client and no nn socket; fa_integ_stats() opens and
 * closes its own client so it can be called between forks.
 */
#ifndef FA_INTEG_H
#define FA_INTEG_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fa/fa_client.h"
#include "fa_case.h"
#include "fa_test.h"

/* One STATS snapshot through a short-lived client (its own session shows in the counts). */
static inline fa_status fa_integ_stats(const char *url, char *buf, size_t cap)
{
	fa_client *c = NULL;
	fa_status st = fa_client_open(&c, url);
	if (st != FA_OK)
		return st;
	fa_client_set_timeout(c, fa_test_ms(10000));
	st = fa_stats(c, buf, cap);
	fa_client_close(c);
	return st;
}

/* A numeric STATS key through an open client; UINT64_MAX when missing. */
static inline uint64_t fa_integ_stat(fa_client *c, const char *key)
{
	static _Thread_local char text[16384];
	uint64_t v;
	if (fa_stats(c, text, sizeof text) != FA_OK || !fa_stats_u64(text, key, &v))
		return UINT64_MAX;
	return v;
}

/* Poll STATS until key == want, or timeout_ms passes. With c == NULL a short-lived client is used
 * for each look (and counts as one session). Returns true when reached; *last gets the last value
 * seen (UINT64_MAX if never read). */
static inline bool fa_integ_wait_stat(fa_client *c, const char *url, const char *key,
                                      uint64_t want, int timeout_ms, uint64_t *last)
{
	static _Thread_local char text[16384];
	uint64_t deadline = fa_test_now_ms() + (uint64_t)timeout_ms, v = UINT64_MAX;
	for (;;) {
		fa_status st = c ? fa_stats(c, text, sizeof text) : fa_integ_stats(url, text, sizeof text);
		if (st == FA_OK && fa_stats_u64(text, key, &v) && v == want)
			break;
		if (fa_test_now_ms() >= deadline) {
			if (last)
				*last = v;
			return false;
		}
		fa_test_sleep_ms(20);
	}
	if (last)
		*last = v;
	return true;
}

/* Make *buf at least `size` bytes (free and allocate again when smaller). */
static inline fa_status fa_integ_buffer(fa_client *c, fa_buffer **buf, size_t size)
{
	if (*buf && fa_buffer_size(*buf) >= size)
		return FA_OK;
	if (*buf)
		fa_buffer_free(*buf);
	*buf = NULL;
	return fa_buffer_alloc_host(c, size, buf);
}

/* One case end to end: buffer, random inputs, poisoned outputs, fa_attn_fwd, the check.
 * Returns true when the call returned FA_OK and the result passed; why says otherwise.
 * *st_out gets the call's status, *err_out the relative error (both may be NULL). */
static inline bool fa_integ_run_case(fa_client *c, fa_buffer **buf, const struct fa_case *cs,
                                     uint64_t *rng, fa_status *st_out, double *err_out,
                                     char *why, size_t whycap)
{
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	fa_case_layout(cs, &l);
	fa_status st = fa_integ_buffer(c, buf, l.total);
	if (st_out)
		*st_out = st;
	if (st != FA_OK) {
		snprintf(why, whycap, "fa_buffer_alloc_host(%zu): %s (%s)", l.total,
		         fa_status_name(st), fa_last_error_detail());
		return false;
	}
	void *data = fa_buffer_data(*buf);
	fa_case_fill(cs, &l, data, rng);
	fa_case_args(cs, &l, *buf, &a);
	st = fa_attn_fwd(c, &a);
	if (st_out)
		*st_out = st;
	if (st != FA_OK) {
		snprintf(why, whycap, "fa_attn_fwd: %s (%s)", fa_status_name(st), fa_last_error_detail());
		return false;
	}
	return fa_case_check(cs, &l, data, err_out, why, whycap);
}

#endif /* FA_INTEG_H */
