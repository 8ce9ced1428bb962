/* test_watchdog.c - the watchdog feeds systemd only when enabled for this process and only while
 * the health check passes. A datagram socket stands in for systemd's NOTIFY_SOCKET. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "watchdog.h"

struct fixture {
	char path[108];
	int fd;
	uv_loop_t loop;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	assert_non_null(f);
	snprintf(f->path, sizeof f->path, "/tmp/fa-wd-%d.sock", (int)getpid());
	unlink(f->path);
	f->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(f->fd >= 0);
	strcpy(sa.sun_path, f->path);
	assert_int_equal(bind(f->fd, (struct sockaddr *)&sa, sizeof sa), 0);
	setenv("NOTIFY_SOCKET", f->path, 1);
	unsetenv("WATCHDOG_PID");
	assert_int_equal(uv_loop_init(&f->loop), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	close(f->fd);
	unlink(f->path);
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	free(f);
	return 0;
}

/* Count "WATCHDOG=1" datagrams already queued on the socket. */
static int drain_feeds(int fd)
{
	char buf[256];
	int n = 0;

	for (;;) {
		ssize_t r = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
		if (r < 0)
			return n;
		buf[r] = '\0';
		if (strcmp(buf, "WATCHDOG=1") == 0)
			n++;
	}
}

static bool always(void *arg)
{
	(void)arg;
	return true;
}

static bool never(void *arg)
{
	(void)arg;
	return false;
}

static void stop_loop_cb(uv_timer_t *t)
{
	uv_stop(t->loop);
}

/* Run the loop until `ms` of loop time passed (a timer bounds it). */
static void run_for(uv_loop_t *loop, uint64_t ms)
{
	uv_timer_t t;

	uv_timer_init(loop, &t);
	uv_timer_start(&t, stop_loop_cb, ms, 0);
	uv_run(loop, UV_RUN_DEFAULT);
	uv_close((uv_handle_t *)&t, NULL);
	uv_run(loop, UV_RUN_NOWAIT);
}

static void stopped(void *arg)
{
	*(int *)arg = 1;
}

static void test_watchdog_is_off_without_watchdog_usec(void **state)
{
	struct fixture *f = *state;
	struct watchdog wd;
	int closed = 0;

	unsetenv("WATCHDOG_USEC");
	assert_int_equal(watchdog_interval_us(), 0);
	assert_int_equal(watchdog_start(&wd, &f->loop, always, NULL), FA_OK);
	assert_false(wd.open);
	watchdog_stop(&wd, stopped, &closed);
	assert_int_equal(closed, 1);
	assert_int_equal(drain_feeds(f->fd), 0);
}

static void test_watchdog_ignores_another_process_pid(void **state)
{
	(void)state;
	setenv("WATCHDOG_USEC", "20000", 1);
	setenv("WATCHDOG_PID", "1", 1);
	assert_int_equal(watchdog_interval_us(), getpid() == 1 ? 20000 : 0);
	char pid[32];
	snprintf(pid, sizeof pid, "%d", (int)getpid());
	setenv("WATCHDOG_PID", pid, 1);
	assert_int_equal(watchdog_interval_us(), 20000);
	setenv("WATCHDOG_USEC", "20ms", 1);
	assert_int_equal(watchdog_interval_us(), 0);
}

static void test_watchdog_feeds_every_half_interval_while_healthy(void **state)
{
	struct fixture *f = *state;
	struct watchdog wd;
	int closed = 0;

	setenv("WATCHDOG_USEC", "20000", 1); /* 20 ms: fed every 10 ms */
	assert_int_equal(watchdog_start(&wd, &f->loop, always, NULL), FA_OK);
	assert_true(wd.open);
	run_for(&f->loop, 100);
	watchdog_stop(&wd, stopped, &closed);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(closed, 1);
	int n = drain_feeds(f->fd);
	/* At least the immediate feed and a few ticks; a loaded machine may fire fewer. */
	assert_true(n >= 3);
	assert_int_equal((uint64_t)n, wd.fed);
}

static void test_watchdog_starves_while_unhealthy(void **state)
{
	struct fixture *f = *state;
	struct watchdog wd;
	int closed = 0;

	setenv("WATCHDOG_USEC", "20000", 1);
	assert_int_equal(watchdog_start(&wd, &f->loop, never, NULL), FA_OK);
	run_for(&f->loop, 60);
	watchdog_stop(&wd, stopped, &closed);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(closed, 1);
	assert_int_equal(drain_feeds(f->fd), 0);
	assert_true(wd.starved >= 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_watchdog_is_off_without_watchdog_usec, setup, teardown),
		cmocka_unit_test_setup_teardown(test_watchdog_ignores_another_process_pid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_watchdog_feeds_every_half_interval_while_healthy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_watchdog_starves_while_unhealthy, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
