/* util.h - small helpers every part of the daemon uses: random ids, clocks, bounded formatting. */
#ifndef FA_DAEMON_UTIL_H
#define FA_DAEMON_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "fa/fa_client.h"

/* A random 64-bit number from the kernel (getrandom), never 0: session ids, region ids and the
 * epoch are capabilities or fingerprints, so they must not be guessable or sequential.
 * Returns FA_OK or FA_ESYS (the kernel could not give randomness: errno set). */
fa_status util_random_u64(uint64_t *out);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t util_now_ns(void);

/* The daemon's version, "MAJOR.MINOR.PATCH" from the public header's FA_VERSION_* macros
 * (static; for the startup line, --version and STATS). */
const char *util_version(void);

/* snprintf into a fixed buffer that may be NULL or 0 bytes; never overflows, always terminates.
 * Returns st, so error paths read `return util_fail(err, errlen, FA_EINVAL, "...")`. */
fa_status util_fail(char *err, size_t errlen, fa_status st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif /* FA_DAEMON_UTIL_H */
