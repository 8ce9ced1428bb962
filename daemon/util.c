/* util.c - random ids. */
#include "util.h"

#include <errno.h>
#include <sys/random.h>

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
