/* fa_time.h - the monotonic clock every part of fa measures durations and deadlines with.
 * Internal: compiled into every program and, hidden, into libfaclient. */
#ifndef FA_TIME_H
#define FA_TIME_H

#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds: durations and deadlines only, never wall time (a wall-clock
 * jump must not stretch or cut a wait). Thread-safe. */
uint64_t fa_now_ns(void);

#endif /* FA_TIME_H */
