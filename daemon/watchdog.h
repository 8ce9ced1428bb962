/* watchdog.h - feeding systemd's watchdog (WatchdogSec=): "WATCHDOG=1" every half interval, but
 * only while a health check passes.
 *
 * A daemon that keeps answering errors forever is the known failure of other GPU servers; systemd
 * restarts a service whose watchdog starves. The check is the backend's: today the loop itself
 * (a stuck loop never fires the timer); the GPU backend adds a canary kernel that must pass.
 */
#ifndef FA_DAEMON_WATCHDOG_H
#define FA_DAEMON_WATCHDOG_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "fa_types.h"

/* Returns whether the service is healthy now; called on the loop thread. */
typedef bool (*watchdog_check_fn)(void *arg);

struct watchdog {
	uv_timer_t timer;
	uint64_t interval_us;      /* systemd's WATCHDOG_USEC; 0 = not enabled */
	watchdog_check_fn check;
	void *arg;
	uint64_t fed;              /* WATCHDOG=1 sent */
	uint64_t starved;          /* ticks where the check failed */
	bool open;
	void (*closed)(void *arg);
	void *closed_arg;
};

/* The interval systemd asked for: WATCHDOG_USEC when set and WATCHDOG_PID is unset or names this
 * process; else 0. */
uint64_t watchdog_interval_us(void);

/* Start feeding every interval/2 when the watchdog is enabled (else a no-op: wd->open stays
 * false). Feeds once at once when healthy. Returns FA_OK or FA_ESYS (timer). */
fa_status watchdog_start(struct watchdog *wd, uv_loop_t *loop, watchdog_check_fn check, void *arg);

/* Stop and close the timer; `closed` runs from the loop once it is closed (at once, synchronously,
 * when the watchdog was never started). */
void watchdog_stop(struct watchdog *wd, void (*closed)(void *arg), void *arg);

#endif /* FA_DAEMON_WATCHDOG_H */
