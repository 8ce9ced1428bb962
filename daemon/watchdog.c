/* watchdog.c - feed systemd's watchdog while the health check passes; see watchdog.h. */
#include "watchdog.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"

/* WATCHDOG_USEC, if it is meant for this process (systemd sets WATCHDOG_PID too when the
 * variable could be inherited by children that must not feed it). */
uint64_t watchdog_interval_us(void)
{
	const char *usec = getenv("WATCHDOG_USEC");
	const char *pid = getenv("WATCHDOG_PID");
	char *end;

	if (usec == NULL || *usec == '\0')
		return 0;
	if (pid != NULL && *pid != '\0' && strtol(pid, NULL, 10) != (long)getpid())
		return 0;
	unsigned long long v = strtoull(usec, &end, 10);
	if (*end != '\0' || v == 0)
		return 0;
	return v;
}

/* One tick: feed when healthy; log the first starved tick of a run (not every one). */
static void watchdog_tick(struct watchdog *wd)
{
	if (wd->check == NULL || wd->check(wd->arg)) {
		if (notify_send("WATCHDOG=1") == FA_OK)
			wd->fed++;
		if (wd->starved > 0)
			log_notice("watchdog: healthy again after %llu missed feeds",
			           (unsigned long long)wd->starved);
		wd->starved = 0;
		return;
	}
	if (wd->starved++ == 0)
		log_warn("watchdog: health check failed; not feeding systemd's watchdog");
}

static void watchdog_timer_cb(uv_timer_t *t)
{
	watchdog_tick(t->data);
}

/* See watchdog.h. */
fa_status watchdog_start(struct watchdog *wd, uv_loop_t *loop, watchdog_check_fn check, void *arg)
{
	memset(wd, 0, sizeof(*wd));
	wd->check = check;
	wd->arg = arg;
	wd->interval_us = watchdog_interval_us();
	if (wd->interval_us == 0)
		return FA_OK;
	if (uv_timer_init(loop, &wd->timer) != 0)
		return FA_ESYS;
	wd->timer.data = wd;
	wd->open = true;
	/* Half the interval, as sd_watchdog_enabled(3) advises; at least 1 ms. */
	uint64_t ms = wd->interval_us / 2000;
	if (ms == 0)
		ms = 1;
	log_info("watchdog: feeding every %llu ms", (unsigned long long)ms);
	watchdog_tick(wd);
	uv_timer_start(&wd->timer, watchdog_timer_cb, ms, ms);
	return FA_OK;
}

static void watchdog_closed_cb(uv_handle_t *h)
{
	struct watchdog *wd = h->data;

	if (wd->closed != NULL)
		wd->closed(wd->closed_arg);
}

/* See watchdog.h. */
void watchdog_stop(struct watchdog *wd, void (*closed)(void *arg), void *arg)
{
	wd->closed = closed;
	wd->closed_arg = arg;
	if (!wd->open) {
		if (closed != NULL)
			closed(arg);
		return;
	}
	wd->open = false;
	uv_timer_stop(&wd->timer);
	uv_close((uv_handle_t *)&wd->timer, watchdog_closed_cb);
}
