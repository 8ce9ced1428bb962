/* fa_ctl_clients.c - `fa-ctl clients [--json]`: the daemon's sessions, one line (or JSON object)
 * each, as redis's CLIENT LIST and MPS's get_client_list. Root and the daemon's own user see
 * every session; another user sees their own (daemon/clients.h says why).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fa/fa_client.h"
#include "fa_ctl.h"

/* Print a failure with the status text and the library's detail; returns the exit status. */
static int clients_fail(fa_status st)
{
	const char *detail = fa_last_error_detail();
	if (detail[0] != '\0')
		return fa_ctl_failure("clients", "%s (%s)", fa_strerror(st), detail);
	return fa_ctl_failure("clients", "%s", fa_strerror(st));
}

/* Seconds since a Unix time in ms, 0 when in the future (a clock step). */
static uint64_t age_s(uint64_t since_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t now = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
	return now > since_ms ? (now - since_ms) / 1000u : 0;
}

/* since_ms as "2026-12-01T23:10:05Z". */
static void iso_utc(uint64_t since_ms, char out[32])
{
	time_t t = (time_t)(since_ms / 1000u);
	struct tm tm;
	if (gmtime_r(&t, &tm) == NULL || strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
		snprintf(out, 32, "?");
}

static void print_table(const fa_client_info *v, size_t n)
{
	printf("%-16s %8s %8s %6s %7s %14s %8s %10s %8s  %s\n", "SESSION", "PID", "CPID", "UID",
	       "REGIONS", "BYTES", "INFLIGHT", "DONE", "AGE_S", "COMMAND");
	for (size_t i = 0; i < n; i++)
		printf("%016" PRIx64 " %8u %8u %6u %7u %14" PRIu64 " %8u %10" PRIu64 " %8" PRIu64
		       "  %s\n",
		       v[i].session, v[i].pid, v[i].pid_claimed, v[i].uid, v[i].regions, v[i].bytes,
		       v[i].inflight, v[i].done, age_s(v[i].since_ms),
		       v[i].command[0] ? v[i].command : "-");
}

/* Session ids are 64-bit: a string in JSON (a double holds 53 bits). */
static void print_json(const fa_client_info *v, size_t n)
{
	fputs("[", stdout);
	for (size_t i = 0; i < n; i++) {
		char id[17], since[32];
		snprintf(id, sizeof id, "%016" PRIx64, v[i].session);
		iso_utc(v[i].since_ms, since);
		printf("%s\n  {\"session\": \"%s\", \"pid\": %u, \"pid_claimed\": %u, \"uid\": %u, "
		       "\"command\": ",
		       i ? "," : "", id, v[i].pid, v[i].pid_claimed, v[i].uid);
		fa_ctl_json_string(stdout, v[i].command);
		printf(", \"regions\": %u, \"bytes\": %" PRIu64 ", \"inflight\": %u, \"done\": %" PRIu64
		       ", \"since_ms\": %" PRIu64 ", \"since\": \"%s\", \"age_s\": %" PRIu64 "}",
		       v[i].regions, v[i].bytes, v[i].inflight, v[i].done, v[i].since_ms, since,
		       age_s(v[i].since_ms));
	}
	fputs(n ? "\n]\n" : "]\n", stdout);
}

int fa_ctl_clients_main(const char *socket, int timeout_ms, int argc, char **argv)
{
	bool json = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = true;
		else
			return fa_ctl_usage_error("clients", "bad argument \"%s\" (usage: fa-ctl clients "
			                          "[--json])", argv[i]);
	}
	fa_client *c = NULL;
	fa_status st = fa_client_open(&c, socket);
	if (st != FA_OK)
		return clients_fail(st);
	if (timeout_ms >= 0 && (st = fa_client_set_timeout(c, timeout_ms)) != FA_OK) {
		fa_client_close(c);
		return clients_fail(st);
	}
	/* Sessions come and go between two calls: grow until the listing fits. */
	fa_client_info *v = NULL;
	size_t cap = 64, n = 0;
	for (;;) {
		fa_client_info *nv = realloc(v, cap * sizeof *v);
		if (nv == NULL) {
			free(v);
			fa_client_close(c);
			return fa_ctl_failure("clients", "out of memory for %zu entries", cap);
		}
		v = nv;
		if ((st = fa_clients(c, v, cap, &n)) != FA_OK || n <= cap)
			break;
		cap = n + 64;
	}
	fa_client_close(c);
	if (st != FA_OK) {
		free(v);
		return clients_fail(st);
	}
	if (json)
		print_json(v, n);
	else
		print_table(v, n);
	free(v);
	return FA_CTL_EXIT_OK;
}
