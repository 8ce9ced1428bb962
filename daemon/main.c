/* main.c - fa-daemon: read the configuration, start the server, run the loop, stop on a signal.
 *
 * Exit status: 0 after a clean shutdown (SIGTERM or SIGINT: everything queued answered), 1 when
 * the daemon could not start, 2 for bad options or config, 70 (EX_SOFTWARE) after a device fault
 * (fault.h: everything answered FA_EDEVICE first; the supervisor restarts us), 128 + signal when
 * a second signal cut the graceful shutdown short.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "config.h"
#include "fa_proto.h"
#include "log.h"
#include "notify.h"
#include "server.h"
#include "util.h"

enum { MAIN_EXIT_OK = 0, MAIN_EXIT_FAILED = 1, MAIN_EXIT_USAGE = 2 };

static struct server *main_server;
static uv_signal_t main_signals[3];
static const int main_signums[3] = {SIGTERM, SIGINT, SIGHUP};
static bool main_stopping;

/* Nothing to free: the signal handles are static. */
static void main_signal_closed(uv_handle_t *h)
{
	(void)h;
}

/* The server closed every handle of its own: close ours and the loop ends. */
static void main_server_closed(void *arg)
{
	(void)arg;
	for (int i = 0; i < 3; i++)
		uv_close((uv_handle_t *)&main_signals[i], main_signal_closed);
}

/* SIGTERM/SIGINT: a graceful stop, and a second one exits at once; SIGHUP is ignored. */
static void main_signal_cb(uv_signal_t *h, int signum)
{
	(void)h;
	if (signum == SIGHUP) {
		log_notice("main: SIGHUP ignored (no reload; restart to change the configuration)");
		return;
	}
	if (main_stopping) {
		log_warn("main: second %s: exiting now, without waiting for running requests",
		         strsignal(signum));
		_exit(128 + signum);
	}
	main_stopping = true;
	log_notice("main: %s: stopping (a second one exits at once)", strsignal(signum));
	server_shutdown(main_server, main_server_closed, NULL);
}

/* Parse the configuration, run the server until it stops, report how it ended. */
int main(int argc, char **argv)
{
	static struct config cfg;
	enum config_action action;
	char err[1024];
	uv_loop_t loop;
	int rv, code;

	if (config_load(&cfg, argc, argv, &action, err, sizeof err) != FA_OK) {
		fprintf(stderr, "fa-daemon: %s\n", err);
		return MAIN_EXIT_USAGE;
	}
	if (action == CONFIG_HELP) {
		config_print_help(stdout, "fa-daemon");
		return MAIN_EXIT_OK;
	}
	if (action == CONFIG_VERSION) {
		printf("fa-daemon %s (protocol %d)\n", fa_version_string(), FA_PROTO_VERSION);
		return MAIN_EXIT_OK;
	}
	log_init(cfg.verbose);
	signal(SIGPIPE, SIG_IGN); /* a vanished peer is an error return, not a death */

	if ((rv = uv_loop_init(&loop)) != 0) {
		log_err("main: uv_loop_init: %s", uv_strerror(rv));
		return MAIN_EXIT_FAILED;
	}
	if ((main_server = calloc(1, sizeof(*main_server))) == NULL) {
		log_err("main: out of memory");
		return MAIN_EXIT_FAILED;
	}
	/* Watched before server_open, which tells systemd READY=1: a SIGTERM right after READY
	 * must find its handler (it used to kill the daemon with 143). The callbacks run only
	 * inside uv_run, so never before the server is open. */
	for (int i = 0; i < 3; i++) {
		uv_signal_init(&loop, &main_signals[i]);
		if ((rv = uv_signal_start(&main_signals[i], main_signal_cb, main_signums[i])) != 0)
			log_err("main: cannot watch %s: %s", strsignal(main_signums[i]),
			        uv_strerror(rv));
	}
	if (server_open(main_server, &loop, &cfg, err, sizeof err) != FA_OK) {
		log_err("main: cannot start: %s", err);
		notify_sendf("STATUS=failed to start: %s", err);
		for (int i = 0; i < 3; i++)
			uv_close((uv_handle_t *)&main_signals[i], main_signal_closed);
		code = MAIN_EXIT_FAILED;
		goto out_loop; /* what did start is closing: let the loop finish it */
	}
	/* A device fault stops the server by itself (fault.c), through the same callback. */
	server_set_closed(main_server, main_server_closed, NULL);
	code = MAIN_EXIT_OK;

out_loop:
	uv_run(&loop, UV_RUN_DEFAULT);
	if ((rv = uv_loop_close(&loop)) != 0) {
		log_err("main: handles still open at exit: %s", uv_strerror(rv));
		code = MAIN_EXIT_FAILED;
	}
	if (code == MAIN_EXIT_OK)
		code = main_server->exit_code;
	free(main_server);
	log_notice("main: exit %d", code);
	return code;
}
