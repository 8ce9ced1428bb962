/* fa_time.c - the monotonic clock. */
#include "fa_time.h"

#include <time.h>

/* Nanoseconds on the monotonic clock. */
uint64_t fa_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
