/* util.h - small helpers every part of the daemon uses: random ids; and, from common/, the
 * monotonic clock (fa_now_ns) and the error-text helper (fa_err). */
#ifndef FA_DAEMON_UTIL_H
#define FA_DAEMON_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "fa_err.h"
#include "fa_time.h"
#include "fa_types.h"

/* A random 64-bit number from the kernel (getrandom), never 0: session ids, region ids and the
 * epoch are capabilities or fingerprints, so they must not be guessable or sequential.
 * Returns FA_OK or FA_ESYS (the kernel could not give randomness: errno set). */
fa_status util_random_u64(uint64_t *out);

/* The wall clock, Unix time in milliseconds: for timestamps people read (a session's start in
 * CLIENTS), never for durations. Thread-safe. */
uint64_t util_unix_ms(void);

#endif /* FA_DAEMON_UTIL_H */
