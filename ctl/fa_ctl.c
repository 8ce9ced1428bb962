/* fa_ctl.c - fa-ctl, the command-line tool: main() and the table of subcommands.
 *
 * Each subcommand is one row of `commands` (name, handler, usage, help); --help is generated from
 * it. Subcommands that talk to the daemon use only the public API of libfaclient, like any
 * client. `plan` lives in fa_ctl_plan.c and `tune` in fa_ctl_tune.c (they need kernels/, not the
 * daemon).
 *
 * Exit status: 0 on success, 1 on any failure, with "fa-ctl: <what>: <fa_strerror text>
 * (<detail>)" on stderr.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fa/fa_client.h"
#include "fa_ctl.h"
#include "fa_time.h"
#include "fa_proto.h" /* FA_PROTO_VERSION, FA_PROTO_STATS_MAX */

/* Global options, parsed before the subcommand. */
struct ctl_opts {
	const char *socket; /* NULL: the library's default (FA_SOCKET, XDG_RUNTIME_DIR, /run) */
	int timeout_ms;     /* -1: the library's default (FA_TIMEOUT_MS or 30 s) */
};

struct ctl_cmd {
	const char *name;
	int (*run)(const struct ctl_opts *o, int argc, char **argv); /* argv[0] is the name */
	const char *usage;
	const char *help;
};

static int cmd_ping(const struct ctl_opts *o, int argc, char **argv);
static int cmd_stats(const struct ctl_opts *o, int argc, char **argv);
static int cmd_plan(const struct ctl_opts *o, int argc, char **argv);
static int cmd_tune(const struct ctl_opts *o, int argc, char **argv);
static int cmd_version(const struct ctl_opts *o, int argc, char **argv);
static int cmd_help(const struct ctl_opts *o, int argc, char **argv);

static const struct ctl_cmd commands[] = {
	{"ping", cmd_ping, "ping [-c COUNT]", "round trips to the daemon, with their times"},
	{"stats", cmd_stats, "stats", "print the daemon's statistics (INFO-style key:value lines)"},
	{"plan", cmd_plan, "plan ...", "the tile planner's choice for a shape (`fa-ctl plan --help`)"},
	{"tune", cmd_tune, "tune ...", "tune shapes on the local GPU into the daemon's tuning table "
	 "(`fa-ctl tune --help`)"},
	{"version", cmd_version, "version", "print the versions of fa-ctl, libfaclient and the protocol"},
	{"help", cmd_help, "help", "this text"},
};

/* Print a failure of `what` with the status text and the library's detail; returns 1. */
static int fail(const char *what, fa_status st)
{
	const char *detail = fa_last_error_detail();

	if (detail[0] != '\0')
		fprintf(stderr, "fa-ctl: %s: %s (%s)\n", what, fa_strerror(st), detail);
	else
		fprintf(stderr, "fa-ctl: %s: %s\n", what, fa_strerror(st));
	return 1;
}

/* Print the usage text to f. */
static void usage(FILE *f)
{
	fprintf(f, "usage: fa-ctl [--socket PATH] [--timeout MS] COMMAND [ARGS]\n\n"
	           "options:\n"
	           "  --socket PATH   the daemon's socket (a path or ipc://PATH); default $FA_SOCKET,\n"
	           "                  else $XDG_RUNTIME_DIR/fa-daemon/fa.sock, else "
	           "/run/fa-daemon/fa.sock\n"
	           "  --timeout MS    timeout of each call in milliseconds (0: forever); default\n"
	           "                  $FA_TIMEOUT_MS, else 30000\n"
	           "  -h, --help      this text\n\n"
	           "commands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(f, "  %-16s %s\n", commands[i].usage, commands[i].help);
}

/* A non-negative int from text, or false. */
static bool parse_int(const char *s, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < 0 || v > INT_MAX)
		return false;
	*out = (int)v;
	return true;
}

/* Open a client with the global options; prints the failure and returns NULL on error. */
static fa_client *open_client(const struct ctl_opts *o, const char *what)
{
	fa_client *c = NULL;
	fa_status st = fa_client_open(&c, o->socket);

	if (st != FA_OK) {
		fail(what, st);
		return NULL;
	}
	if (o->timeout_ms >= 0 && (st = fa_client_set_timeout(c, o->timeout_ms)) != FA_OK) {
		fail(what, st);
		fa_client_close(c);
		return NULL;
	}
	return c;
}

/* `ping [-c COUNT]`: connect, then COUNT round trips (default 1), each with its time. */
static int cmd_ping(const struct ctl_opts *o, int argc, char **argv)
{
	uint64_t t0;
	double min = 0, max = 0, sum = 0;
	int count = 1;
	fa_client *c;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-c") == 0 && i + 1 < argc && parse_int(argv[i + 1], &count) &&
		    count > 0) {
			i++;
		} else {
			fprintf(stderr, "fa-ctl: ping: bad argument \"%s\" (usage: fa-ctl ping [-c COUNT])\n",
			        argv[i]);
			return 1;
		}
	}
	t0 = fa_now_ns();
	if ((c = open_client(o, "ping")) == NULL)
		return 1;
	printf("connected to the daemon (epoch %016llx) in %.3f ms\n",
	       (unsigned long long)fa_client_epoch(c), 1e-6 * (double)(fa_now_ns() - t0));
	for (int i = 0; i < count; i++) {
		uint64_t t = fa_now_ns();
		fa_status st = fa_ping(c);
		double dt = 1e-6 * (double)(fa_now_ns() - t);
		if (st != FA_OK) {
			fail("ping", st);
			fa_client_close(c);
			return 1;
		}
		printf("pong %d: %.3f ms\n", i + 1, dt);
		min = i == 0 || dt < min ? dt : min;
		max = dt > max ? dt : max;
		sum += dt;
	}
	if (count > 1)
		printf("%d round trips: min %.3f ms, avg %.3f ms, max %.3f ms\n", count, min,
		       sum / count, max);
	fa_client_close(c);
	return 0;
}

/* `stats`: the daemon's STATS text, as it sent it. */
static int cmd_stats(const struct ctl_opts *o, int argc, char **argv)
{
	static char text[FA_PROTO_STATS_MAX];
	fa_client *c;
	fa_status st;
	size_t n;

	(void)argv;
	if (argc > 1) {
		fprintf(stderr, "fa-ctl: stats takes no arguments\n");
		return 1;
	}
	if ((c = open_client(o, "stats")) == NULL)
		return 1;
	st = fa_stats(c, text, sizeof text);
	fa_client_close(c);
	if (st != FA_OK)
		return fail("stats", st);
	n = strlen(text);
	fputs(text, stdout);
	if (n > 0 && text[n - 1] != '\n')
		putchar('\n');
	return 0;
}

/* `plan ...`: fa_ctl_plan.c's entry point (no daemon needed). */
static int cmd_plan(const struct ctl_opts *o, int argc, char **argv)
{
	(void)o;
	return fa_ctl_plan_main(argc, argv);
}

/* `tune ...`: fa_ctl_tune.c's entry point (the local GPU, no daemon needed). */
static int cmd_tune(const struct ctl_opts *o, int argc, char **argv)
{
	(void)o;
	return fa_ctl_tune_main(argc, argv);
}

/* `version`: this tool's, the library's and the protocol's versions (no daemon needed). */
static int cmd_version(const struct ctl_opts *o, int argc, char **argv)
{
	(void)o;
	(void)argv;
	if (argc > 1) {
		fprintf(stderr, "fa-ctl: version takes no arguments\n");
		return 1;
	}
	printf("fa-ctl %d.%d.%d, libfaclient %s, protocol %d\n", FA_VERSION_MAJOR, FA_VERSION_MINOR,
	       FA_VERSION_PATCH, fa_version_string(), FA_PROTO_VERSION);
	return 0;
}

/* `help`: the usage text on stdout. */
static int cmd_help(const struct ctl_opts *o, int argc, char **argv)
{
	(void)o;
	(void)argc;
	(void)argv;
	usage(stdout);
	return 0;
}

/* Parse the global options, find the subcommand, run it. */
int main(int argc, char **argv)
{
	struct ctl_opts o = {.socket = NULL, .timeout_ms = -1};
	int i = 1;

	for (; i < argc && argv[i][0] == '-'; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(a, "--socket") == 0 && i + 1 < argc) {
			o.socket = argv[++i];
		} else if (strncmp(a, "--socket=", 9) == 0) {
			o.socket = a + 9;
		} else if (strcmp(a, "--timeout") == 0 || strncmp(a, "--timeout=", 10) == 0) {
			const char *v = a[9] == '=' ? a + 10 : i + 1 < argc ? argv[++i] : "";
			if (!parse_int(v, &o.timeout_ms)) {
				fprintf(stderr, "fa-ctl: --timeout \"%s\": want milliseconds, 0 or more\n", v);
				return 1;
			}
		} else {
			fprintf(stderr, "fa-ctl: unknown or incomplete option \"%s\"\n\n", a);
			usage(stderr);
			return 1;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 1;
	}
	for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
		if (strcmp(argv[i], commands[k].name) == 0)
			return commands[k].run(&o, argc - i, argv + i);
	fprintf(stderr, "fa-ctl: unknown command \"%s\" (fa-ctl --help lists them)\n", argv[i]);
	return 1;
}
