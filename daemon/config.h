/* config.h - the daemon's settings: one table drives flag parsing, the config file, the
 * environment, --help and the startup log line (config.c, config_options[]).
 *
 * Precedence, lowest first: built-in defaults, the --config FILE (or $FA_CONFIG), the environment
 * (FA_SOCKET, FA_THREADS...), the command line.
 */
#ifndef FA_DAEMON_CONFIG_H
#define FA_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fa_settings.h"
#include "fa_types.h"

#define CONFIG_SOCKET_MAX 108 /* sun_path, incl. NUL: a path of >= 108 bytes cannot be bound */
#define CONFIG_PATH_MAX 4096

struct config {
	char socket[CONFIG_SOCKET_MAX];   /* filesystem path (an "ipc://" prefix is stripped) */
	unsigned socket_mode;             /* permission bits of the socket file */
	int threads; /* CPU backend workers; resolved from 0 to the CPU count */
	int max_inflight;                 /* ATTN_FWD requests per session queued or running */
	int max_regions;                  /* registered regions per session */
	int max_sessions;                 /* open sessions */
	int max_connections;              /* open connections (each an fd), all peers together */
	int max_connections_per_uid;      /* open connections of one peer uid (<= max_connections) */
	int reserved_connections;         /* of max_connections, for root and the daemon's uid */
	int frame_timeout_ms;             /* a message begun must be whole within this */
	int idle_timeout_ms;              /* a connection without a session: closed when silent */
	uint64_t max_region_bytes;        /* largest region a client may register */
	uint64_t max_request_gflop;       /* one request's work; 0 = the backend's default */
	int session_workers;              /* CPU workers one session may hold; 0 = threads - 1 */
	int drain_timeout_ms;             /* SIGTERM: running work is stopped after this */
	char backend[16];                 /* "auto" or a backend's name ("cpu") */
	char cache_dir[CONFIG_PATH_MAX];  /* compiled kernels and tuning results (gpu backend) */
	char config_file[CONFIG_PATH_MAX]; /* the file read, "" for none */
	int verbose;                      /* 0 notice, 1 info (-v), 2 debug (-vv) */
	int compile_threads;              /* gpu backend: kernel compile threads; 0 = on the worker */
	char tune[8];                     /* gpu backend: "idle" (background tuning) or "off" */
	char metrics_file[CONFIG_PATH_MAX]; /* Prometheus textfile, "" for none */
	int metrics_interval_ms;          /* how often it is written */
	int async_wait_ms;                /* gpu backend: an asynchronous call's inputs not ready
	                                   * after this long: its stream is released, it fails */
	int max_rings;                    /* submission rings open at once (ring.h) */
	int ring_spin_us;                 /* a ring thread's poll before it sleeps */
	int loop_spin_us;                 /* the loop's poll after a ring completion; -1: auto */
	int prewake_us;                   /* gpu backend: notice before a job's expected end */
	struct fa_kernel_settings kernels; /* gpu backend: planner, NVRTC, kernel cache (wgmma...) */
};

/* What main() should do after config_load. */
enum config_action {
	CONFIG_RUN,
	CONFIG_HELP,
	CONFIG_VERSION,
};

/* The defaults (some read the environment: $XDG_RUNTIME_DIR for the socket, $CACHE_DIRECTORY or
 * $XDG_CACHE_HOME for the cache). */
void config_defaults(struct config *c);

/* Set one option by its name ("max-inflight") from text, checking type and range. `origin` names
 * where the value came from for the message ("--threads", "FA_THREADS", "fa.conf:3").
 * Returns FA_OK or FA_EINVAL with the reason in err. */
fa_status config_set(struct config *c, const char *name, const char *value, const char *origin,
                     char *err, size_t errlen);

/* Apply a file of "name = value" lines ('#' starts a comment; blank lines are skipped).
 * Returns FA_OK, FA_EINVAL (unknown name, bad value: err says file:line) or FA_ESYS (unreadable).
 */
fa_status config_load_file(struct config *c, const char *path, char *err, size_t errlen);

/* Apply every option's environment variable that is set. Returns FA_OK or FA_EINVAL. */
fa_status config_load_env(struct config *c, char *err, size_t errlen);

/* Apply command-line arguments (argv[0] is skipped). --help and --version set *action and stop.
 * Returns FA_OK or FA_EINVAL (unknown flag, missing or bad value, stray argument). */
fa_status config_parse_args(struct config *c, int argc, char **argv, enum config_action *action,
                            char *err, size_t errlen);

/* Everything in order: defaults, file, environment, arguments, then resolve derived values
 * (threads 0 -> CPU count). Returns FA_OK or the first failure (err says why). */
fa_status config_load(struct config *c, int argc, char **argv, enum config_action *action,
                      char *err, size_t errlen);

/* Resolve derived values: threads 0 -> the number of CPUs this process may run on;
 * session-workers 0 -> threads - 1 (at least 1). */
void config_finish(struct config *c);

/* The checks between options (each option's own range is checked as it is set):
 * max-connections-per-uid <= max-connections, reserved-connections < max-connections.
 * Returns FA_OK or FA_EINVAL with the reason in err. config_load runs it. */
fa_status config_check(const struct config *c, char *err, size_t errlen);

/* The --help text, generated from the table. */
void config_print_help(FILE *f, const char *argv0);

/* One line "name=value name=value ..." of the effective settings, for the startup log. */
void config_describe(const struct config *c, char *buf, size_t cap);

/* The value of one option as text (as config_describe writes it); false for an unknown name. */
bool config_get(const struct config *c, const char *name, char *buf, size_t cap);

#endif /* FA_DAEMON_CONFIG_H */
