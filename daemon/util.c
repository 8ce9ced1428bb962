/* util.c - random ids, the monotonic clock, the version, error text into fixed buffers. */
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>

/* Random, nonzero: 0 means "none" on the wire (region 0 = absent lse, session 0 = HELLO). */
fa_status util_random_u64(uint64_t *out)
{
	uint64_t v = 0;

	while (v == 0) {
		ssize_t n = getrandom(&v, sizeof v, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof v)
			return FA_ESYS;
	}
	*out = v;
	return FA_OK;
}

/* Nanoseconds on the monotonic clock (durations only, never wall time). */
uint64_t util_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define UTIL_STR_(x) #x
#define UTIL_STR(x) UTIL_STR_(x)

/* Below the server, so the dispatcher's STATS and main's --version need nothing above them. */
const char *util_version(void)
{
	return UTIL_STR(FA_VERSION_MAJOR) "." UTIL_STR(FA_VERSION_MINOR) "." UTIL_STR(
	    FA_VERSION_PATCH);
}

/* Format the reason into err (when there is room) and hand back the status. */
fa_status util_fail(char *err, size_t errlen, fa_status st, const char *fmt, ...)
{
	if (err != NULL && errlen > 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return st;
}
