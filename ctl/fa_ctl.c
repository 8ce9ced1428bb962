/* fa_ctl.c - fa-ctl, the command-line tool: main() and the table of subcommands.
 *
 * Each subcommand is one row of `commands` (name, handler, usage, help); --help is generated from
 * it. Subcommands that talk to the daemon use only the public API of libfaclient, like any
 * client. `plan` lives in fa_ctl_plan.c and `tune` in fa_ctl_tune.c (they need kernels/, not the
 * daemon).
 *
 * Exit status (fa_ctl.h, FA_CTL_EXIT_*): 0 on success, 1 for a failure at run time with
 * "fa-ctl: <what>: <fa_strerror text> (<detail>)" on stderr, 2 for a usage error with
 * "fa-ctl: [<command>: ]<what is wrong>". Scripts tell a typo from a down daemon by the status.
 */
#include <errno.h>
#include <stdarg.h>
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
static int cmd_clients(const struct ctl_opts *o, int argc, char **argv);
static int cmd_plan(const struct ctl_opts *o, int argc, char **argv);
static int cmd_tune(const struct ctl_opts *o, int argc, char **argv);
static int cmd_version(const struct ctl_opts *o, int argc, char **argv);
static int cmd_help(const struct ctl_opts *o, int argc, char **argv);

static const struct ctl_cmd commands[] = {
	{"ping", cmd_ping, "ping [-c COUNT]", "round trips to the daemon, with their times"},
	{"stats", cmd_stats, "stats [--json]", "print the daemon's statistics (INFO-style key:value "
	 "lines; --json: an object of sections of keys)"},
	{"clients", cmd_clients, "clients [--json]", "the daemon's sessions: pid, uid, command, "
	 "regions, bytes, requests in flight and done (root and the daemon's user see all)"},
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
		return fa_ctl_failure(what, "%s (%s)", fa_strerror(st), detail);
	return fa_ctl_failure(what, "%s", fa_strerror(st));
}

/* Print the usage text to f. */
static void usage(FILE *f)
{
	fprintf(f, "usage: fa-ctl [--socket PATH] [--timeout MS] COMMAND [ARGS]\n"
	           "       fa-ctl --version | -V | --help | -h\n\n"
	           "options:\n"
	           "  --socket PATH   the daemon's socket (a path or ipc://PATH); default $FA_SOCKET,\n"
	           "                  else $XDG_RUNTIME_DIR/fa-daemon/fa.sock, else "
	           "/run/fa-daemon/fa.sock\n"
	           "  --timeout MS    timeout of each call in milliseconds (0: forever); default\n"
	           "                  $FA_TIMEOUT_MS, else 30000\n"
	           "  -V, --version   as the version command\n"
	           "  -h, --help      this text\n\n"
	           "commands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(f, "  %-16s %s\n", commands[i].usage, commands[i].help);
	fprintf(f, "\nexit status: 0 success; 1 a failure at run time (no daemon, a status from it, no\n"
	           "GPU); 2 a usage error (unknown command or option, a missing or bad value).\n");
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
			return fa_ctl_usage_error("ping", "bad argument \"%s\" (usage: fa-ctl ping "
			                          "[-c COUNT])", argv[i]);
		}
	}
	t0 = fa_now_ns();
	if ((c = open_client(o, "ping")) == NULL)
		return FA_CTL_EXIT_FAILURE;
	printf("connected to the daemon (epoch %016llx) in %.3f ms\n",
	       (unsigned long long)fa_client_epoch(c), 1e-6 * (double)(fa_now_ns() - t0));
	for (int i = 0; i < count; i++) {
		uint64_t t = fa_now_ns();
		fa_status st = fa_ping(c);
		double dt = 1e-6 * (double)(fa_now_ns() - t);
		if (st != FA_OK) {
			fail("ping", st);
			fa_client_close(c);
			return FA_CTL_EXIT_FAILURE;
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

/* A value that JSON can carry as a number: a plain decimal integer or float in JSON's own grammar
 * (no leading zeros, so a hex epoch like "00ab..." or "0012" stays a string). */
static bool json_number(const char *v)
{
	const char *p = v;

	if (*p == '-')
		p++;
	if (*p == '0')
		p++;
	else if (*p >= '1' && *p <= '9')
		while (*p >= '0' && *p <= '9')
			p++;
	else
		return false;
	if (*p == '.') {
		if (!(*++p >= '0' && *p <= '9'))
			return false;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	if (*p == 'e' || *p == 'E') {
		p++;
		if (*p == '+' || *p == '-')
			p++;
		if (!(*p >= '0' && *p <= '9'))
			return false;
		while (*p >= '0' && *p <= '9')
			p++;
	}
	return *p == '\0';
}

/* The STATS text as one JSON object: "# name" lines open a section (keys before the first go into
 * a section named ""), "key:value" lines are its members (value after the first ':'; a line with
 * no ':' is a key with the value ""), numbers as numbers where json_number says so. Modifies text
 * (splits it into lines). */
static void stats_json(char *text)
{
	bool open_section = false, first_key = true;

	fputs("{", stdout);
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		size_t n = strlen(line);
		if (n > 0 && line[n - 1] == '\r')
			line[--n] = '\0';
		if (n == 0)
			continue;
		if (line[0] == '#') {
			const char *name = line + 1;
			while (*name == ' ')
				name++;
			fputs(open_section ? "},\n  " : "\n  ", stdout);
			fa_ctl_json_string(stdout, name);
			fputs(": {", stdout);
			open_section = true;
			first_key = true;
			continue;
		}
		if (!open_section) {
			fputs("\n  \"\": {", stdout);
			open_section = true;
			first_key = true;
		}
		char *colon = strchr(line, ':');
		const char *value = "";
		if (colon != NULL) {
			*colon = '\0';
			value = colon + 1;
		}
		fputs(first_key ? "\n    " : ",\n    ", stdout);
		first_key = false;
		fa_ctl_json_string(stdout, line);
		fputs(": ", stdout);
		if (json_number(value))
			fputs(value, stdout);
		else
			fa_ctl_json_string(stdout, value);
	}
	fputs(open_section ? "}\n}\n" : "}\n", stdout);
}

/* `stats [--json]`: the daemon's STATS text, as it sent it, or as JSON. */
static int cmd_stats(const struct ctl_opts *o, int argc, char **argv)
{
	static char text[FA_PROTO_STATS_MAX];
	bool json = false;
	fa_client *c;
	fa_status st;
	size_t n;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = true;
		else
			return fa_ctl_usage_error("stats", "bad argument \"%s\" (usage: fa-ctl stats "
			                          "[--json])", argv[i]);
	}
	if ((c = open_client(o, "stats")) == NULL)
		return FA_CTL_EXIT_FAILURE;
	st = fa_stats(c, text, sizeof text);
	fa_client_close(c);
	if (st != FA_OK)
		return fail("stats", st);
	if (json) {
		stats_json(text);
		return FA_CTL_EXIT_OK;
	}
	n = strlen(text);
	fputs(text, stdout);
	if (n > 0 && text[n - 1] != '\n')
		putchar('\n');
	return FA_CTL_EXIT_OK;
}

/* `plan ...`: fa_ctl_plan.c's entry point (no daemon needed). */
/* `clients [--json]`: fa_ctl_clients.c's entry point. */
static int cmd_clients(const struct ctl_opts *o, int argc, char **argv)
{
	return fa_ctl_clients_main(o->socket, o->timeout_ms, argc, argv);
}

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
	if (argc > 1)
		return fa_ctl_usage_error("version", "takes no arguments");
	printf("fa-ctl %d.%d.%d, libfaclient %s, protocol %d\n", FA_VERSION_MAJOR, FA_VERSION_MINOR,
	       FA_VERSION_PATCH, fa_version_string(), FA_PROTO_VERSION);
	return 0;
}

/* `help`: the usage text on stdout. */
static int cmd_help(const struct ctl_opts *o, int argc, char **argv)
{
	(void)o;
	(void)argv;
	if (argc > 1)
		return fa_ctl_usage_error("help", "takes no arguments");
	usage(stdout);
	return FA_CTL_EXIT_OK;
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
			return FA_CTL_EXIT_OK;
		} else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
			char *v[] = {"version", NULL};
			return cmd_version(&o, 1, v);
		} else if (strcmp(a, "--socket") == 0 && i + 1 < argc) {
			o.socket = argv[++i];
		} else if (strncmp(a, "--socket=", 9) == 0) {
			o.socket = a + 9;
		} else if (strcmp(a, "--timeout") == 0 || strncmp(a, "--timeout=", 10) == 0) {
			const char *v = a[9] == '=' ? a + 10 : i + 1 < argc ? argv[++i] : "";
			if (!parse_int(v, &o.timeout_ms))
				return fa_ctl_usage_error(NULL, "--timeout \"%s\": want milliseconds, 0 or "
				                          "more", v);
		} else {
			fa_ctl_usage_error(NULL, "unknown or incomplete option \"%s\"\n", a);
			usage(stderr);
			return FA_CTL_EXIT_USAGE;
		}
	}
	if (i >= argc) {
		fa_ctl_usage_error(NULL, "no command\n");
		usage(stderr);
		return FA_CTL_EXIT_USAGE;
	}
	for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
		if (strcmp(argv[i], commands[k].name) == 0)
			return commands[k].run(&o, argc - i, argv + i);
	return fa_ctl_usage_error(NULL, "unknown command \"%s\" (fa-ctl --help lists them)",
	                          argv[i]);
}
