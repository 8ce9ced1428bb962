/* util.c - random ids, the wall clock in ms. */
#include "util.h"

#include <errno.h>
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

uint64_t util_unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
