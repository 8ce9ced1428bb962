/* config.c - the one table of options, and everything generated from it.
 *
 * Each option is declared once below: name, type, default (as text, parsed like any other value),
 * range, environment variable, help. The parser for flags, the config file and the environment,
 * the --help text and the startup "config:" log line all walk this table, so they cannot disagree.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

enum config_type {
	CONFIG_STR,    /* text up to the field's size */
	CONFIG_SOCKET, /* a Unix socket path, "ipc://" prefix accepted, < 108 bytes */
	CONFIG_INT,    /* decimal integer in [min, max] */
	CONFIG_SIZE,   /* bytes, with an optional K/M/G/T suffix (powers of 1024) */
	CONFIG_MODE,   /* octal permission bits */
	CONFIG_ENUM,   /* one of choices */
	CONFIG_KERNEL, /* a kernel setting (kernels/fa_settings.h) in c->kernels, named by its env */
};

struct config_option {
	const char *name;  /* the flag without "--", the config file key */
	char short_flag;   /* 'v' for -v, or 0 */
	enum config_type type;
	const char *def;   /* default as text; NULL: computed (def_help says how) */
	int64_t min, max;  /* INT, SIZE, MODE */
	const char *env;   /* environment variable, or NULL */
	const char *metavar;
	const char *help;
	const char *def_help; /* the computed default, in words */
	size_t offset;     /* of the field in struct config */
	size_t size;       /* of the field (strings: capacity incl. NUL) */
	const char *const *choices; /* ENUM, NULL-terminated */
};

static const char *const backend_choices[] = {"auto", "gpu", "cpu", NULL};
static const char *const tune_choices[] = {"idle", "off", NULL};

#define FIELD(f) .offset = offsetof(struct config, f), .size = sizeof(((struct config *)0)->f)

static const struct config_option config_options[] = {
	{.name = "socket", .type = CONFIG_SOCKET, .env = "FA_SOCKET", .metavar = "PATH",
	 .help = "Unix socket to listen on (an ipc:// URL is accepted)",
	 .def_help = "$XDG_RUNTIME_DIR/fa-daemon/fa.sock, else /run/fa-daemon/fa.sock",
	 FIELD(socket)},
	{.name = "socket-mode", .type = CONFIG_MODE, .def = "0660", .min = 0, .max = 0777,
	 .env = "FA_SOCKET_MODE", .metavar = "MODE",
	 .help = "permission bits of the socket file (octal): who may connect", FIELD(socket_mode)},
	{.name = "threads", .type = CONFIG_INT, .def = "0", .min = 0, .max = 1024,
	 .env = "FA_THREADS", .metavar = "N",
	 .help = "CPU backend worker threads; 0 = one per CPU this process may use",
	 FIELD(threads)},
	{.name = "max-inflight", .type = CONFIG_INT, .def = "64", .min = 1, .max = 65536,
	 .env = "FA_MAX_INFLIGHT", .metavar = "N",
	 .help = "attention requests per session queued or running; more get FA_EBUSY",
	 FIELD(max_inflight)},
	{.name = "max-regions", .type = CONFIG_INT, .def = "256", .min = 1, .max = 65536,
	 .env = "FA_MAX_REGIONS", .metavar = "N",
	 .help = "registered buffers per session; more get FA_ELIMIT", FIELD(max_regions)},
	{.name = "max-sessions", .type = CONFIG_INT, .def = "1024", .min = 1, .max = 65536,
	 .env = "FA_MAX_SESSIONS", .metavar = "N",
	 .help = "open sessions (client processes); more get FA_ELIMIT", FIELD(max_sessions)},
	/* Connections: see daemon/README.md ("Robustness and limits") and systemd/README.md for
	 * the file-descriptor arithmetic behind LimitNOFILE=. */
	{.name = "max-connections", .type = CONFIG_INT, .def = "4096", .min = 16, .max = 1048576,
	 .env = "FA_MAX_CONNECTIONS", .metavar = "N",
	 .help = "open client connections, all users together (each is a file descriptor; the "
	         "soft file limit is raised to fit); more are closed at accept",
	 FIELD(max_connections)},
	{.name = "max-connections-per-uid", .type = CONFIG_INT, .def = "1024", .min = 1,
	 .max = 1048576, .env = "FA_MAX_CONNECTIONS_PER_UID", .metavar = "N",
	 .help = "open connections of one user (root too), so that one user cannot lock the "
	         "others out; at most --max-connections",
	 FIELD(max_connections_per_uid)},
	{.name = "reserved-connections", .type = CONFIG_INT, .def = "32", .min = 0, .max = 65536,
	 .env = "FA_RESERVED_CONNECTIONS", .metavar = "N",
	 .help = "of --max-connections, the last N only for root and the daemon's own user (the "
	         "operator's fa-ctl)",
	 FIELD(reserved_connections)},
	{.name = "frame-timeout-ms", .type = CONFIG_INT, .def = "10000", .min = 10,
	 .max = 3600000, .env = "FA_FRAME_TIMEOUT_MS", .metavar = "MS",
	 .help = "a message whose first byte arrived must be whole within this, or its "
	         "connection is closed",
	 FIELD(frame_timeout_ms)},
	{.name = "idle-timeout-ms", .type = CONFIG_INT, .def = "30000", .min = 10,
	 .max = 86400000, .env = "FA_IDLE_TIMEOUT_MS", .metavar = "MS",
	 .help = "a connection no session uses (no HELLO yet, or after BYE) is closed after this "
	         "long without a message; connections of open sessions are never timed out",
	 FIELD(idle_timeout_ms)},
	{.name = "max-region-bytes", .type = CONFIG_SIZE, .def = "64G", .min = 1, .max = INT64_MAX,
	 .env = "FA_MAX_REGION_BYTES", .metavar = "BYTES",
	 .help = "largest buffer a client may register (suffix K, M, G or T)",
	 FIELD(max_region_bytes)},
	/* Bounded work (daemon/README.md, "Bounded work"): worklimit.h says why these defaults. */
	{.name = "max-request-gflop", .type = CONFIG_INT, .def = "0", .min = 0,
	 .max = INT64_C(1) << 40, .env = "FA_MAX_REQUEST_GFLOP", .metavar = "GFLOP",
	 .help = "most work one attention request may ask for, in GFLOP (4*B*Hq*D per visible "
	         "query-key pair); more get FA_ETOOBIG before anything runs; 0 = the backend's "
	         "default: 1000000 on the gpu backend (about 3 s of an H200), 1000 on the cpu "
	         "backend",
	 FIELD(max_request_gflop)},
	{.name = "session-workers", .type = CONFIG_INT, .def = "0", .min = 0, .max = 1024,
	 .env = "FA_SESSION_WORKERS", .metavar = "N",
	 .help = "cpu backend: most worker threads one session's requests may occupy at once, so "
	         "one client cannot hold every worker while others wait; 0 = threads - 1 (at "
	         "least 1)",
	 FIELD(session_workers)},
	{.name = "drain-timeout-ms", .type = CONFIG_INT, .def = "30000", .min = 0,
	 .max = 3600000, .env = "FA_DRAIN_TIMEOUT_MS", .metavar = "MS",
	 .help = "on SIGTERM, running requests may finish for this long; then what is left is "
	         "stopped (answered FA_ECLOSED) and the daemon exits; keep it below systemd's "
	         "TimeoutStopSec",
	 FIELD(drain_timeout_ms)},
	{.name = "backend", .type = CONFIG_ENUM, .def = "auto", .env = "FA_BACKEND",
	 .metavar = "NAME", .help = "compute backend: auto (gpu when a GPU opens, else cpu), gpu or cpu",
	 FIELD(backend), .choices = backend_choices},
	{.name = "cache-dir", .type = CONFIG_STR, .env = "FA_CACHE_DIR", .metavar = "DIR",
	 .help = "compiled kernels and tuning results (gpu backend)",
	 .def_help = "$CACHE_DIRECTORY, $XDG_CACHE_HOME/fa-daemon, else /var/cache/fa-daemon",
	 FIELD(cache_dir)},
	{.name = "metrics-file", .type = CONFIG_STR, .def = "", .env = "FA_METRICS_FILE",
	 .metavar = "PATH",
	 .help = "write the counters and latency histograms in the Prometheus text format to PATH "
	         "(atomically: a temporary file renamed), for node_exporter's textfile collector "
	         "(a *.prom file in its directory); \"\" = off",
	 FIELD(metrics_file)},
	{.name = "metrics-interval-ms", .type = CONFIG_INT, .def = "10000", .min = 10,
	 .max = 3600000, .env = "FA_METRICS_INTERVAL_MS", .metavar = "MS",
	 .help = "how often --metrics-file is written", FIELD(metrics_interval_ms)},
	{.name = "config", .type = CONFIG_STR, .def = "", .env = "FA_CONFIG", .metavar = "FILE",
	 .help = "read NAME = VALUE lines (the long option names) before the environment and flags",
	 FIELD(config_file)},
	{.name = "compile-threads", .type = CONFIG_INT, .def = "2", .min = 0, .max = 16,
	 .env = "FA_COMPILE_THREADS", .metavar = "N",
	 .help = "gpu backend: threads compiling new kernels off the GPU worker; 0 = on the worker",
	 FIELD(compile_threads)},
	/* off by default: on the H200 the GPU demo (400 random shapes, each a first compile) took
	 * 98 s with the compile pool and background tuning against 63 s before either existed;
	 * the two were not measured apart, and tuning's 16 candidate compiles per class compete
	 * with the clients' own. Pre-tune with `fa-ctl tune`, or opt in. */
	{.name = "tune", .type = CONFIG_ENUM, .def = "off", .env = "FA_TUNE", .metavar = "MODE",
	 .help = "gpu backend: off (use the tuning table as it is) or idle (time kernel "
	         "candidates while the GPU is idle)",
	 FIELD(tune), .choices = tune_choices},
	/* A client whose stream never writes its "ready" completion word (stuck, or killed with
	 * the session still open) must not hold the daemon's stream, its regions and its session
	 * for ever; a dead client's words are released at once when its session closes. */
	{.name = "async-wait-ms", .type = CONFIG_INT, .def = "60000", .min = 10, .max = 86400000,
	 .env = "FA_ASYNC_WAIT_MS", .metavar = "MS",
	 .help = "gpu backend: an asynchronous call whose inputs are not ready (its completion "
	         "word unwritten) this long after the daemon's stream reached it fails and its "
	         "stream is released",
	 FIELD(async_wait_ms)},
	/* Submission rings (ring.h): a thread each, so they are counted apart from sessions. */
	{.name = "max-rings", .type = CONFIG_INT, .def = "256", .min = 0, .max = 1024,
	 .env = "FA_MAX_RINGS", .metavar = "N",
	 .help = "submission rings (one per session at most; a thread each); more sessions call "
	         "through the socket; 0: no rings",
	 FIELD(max_rings)},
	{.name = "ring-spin-us", .type = CONFIG_INT, .def = "-1", .min = -1, .max = 100000,
	 .env = "FA_RING_SPIN_US", .metavar = "US",
	 .help = "a ring's thread polls this long after its last entry before it sleeps (a "
	         "client then pays a FUTEX_WAKE per call); -1: 200 on 4 or more CPUs, else 0 "
	         "(polling on 2 busy cores costs more than the wake)",
	 FIELD(ring_spin_us)},
	/* Issue 12: a synchronous client's next call comes tens of microseconds after its reply;
	 * a sleeping loop or ring thread costs a wake-up (10-50 us each on the H200 host) on that
	 * path, twice or three times per request. */
	{.name = "loop-spin-us", .type = CONFIG_INT, .def = "-1", .min = -1, .max = 100000,
	 .env = "FA_LOOP_SPIN_US", .metavar = "US",
	 .help = "after a ring's completion the loop polls this long, and a sleeping ring thread "
	         "is woken to poll, so the client's next call meets awake threads; -1: 200 on 4 "
	         "or more CPUs, else 0 (off)",
	 FIELD(loop_spin_us)},
	{.name = "prewake-us", .type = CONFIG_INT, .def = "-1", .min = -1, .max = 100000,
	 .env = "FA_PREWAKE_US", .metavar = "US",
	 .help = "gpu backend: this long before a synchronous job's expected end (its shape's "
	         "last GPU time) the loop starts polling and a ring client sleeping on it is "
	         "woken to poll; -1: 150 on 4 or more CPUs, else 0 (off)",
	 FIELD(prewake_us)},
	/* The kernels' settings (kernels/fa_settings.h parses and checks them; fa-ctl and the tests
	 * read the same environment variables). */
	{.name = "wgmma", .type = CONFIG_KERNEL, .def = "1", .env = "FA_WGMMA", .metavar = "0|1",
	 .help = "gpu backend: offer the sm_90a wgmma kernels on sm_90 (0: mma.sync only)",
	 FIELD(kernels)},
	{.name = "wgmma16", .type = CONFIG_KERNEL, .def = "auto", .env = "FA_WGMMA16",
	 .metavar = "auto|0|1",
	 .help = "gpu backend: the 16-bit wgmma kernel where it measured faster (auto), never (0) "
	         "or wherever it fits (1)",
	 FIELD(kernels)},
	{.name = "wg-bc", .type = CONFIG_KERNEL, .def = "0", .env = "FA_WG_BC", .metavar = "N",
	 .help = "experiments: offer only wgmma tiles of N keys per step; 0 = all", FIELD(kernels)},
	{.name = "wg-stages", .type = CONFIG_KERNEL, .def = "0", .env = "FA_WG_STAGES",
	 .metavar = "N", .help = "experiments: offer only wgmma tiles of N stages; 0 = all",
	 FIELD(kernels)},
	{.name = "wg-nwg", .type = CONFIG_KERNEL, .def = "0", .env = "FA_WG_NWG", .metavar = "N",
	 .help = "experiments: offer only wgmma tiles of N warpgroups; 0 = all", FIELD(kernels)},
	{.name = "nvrtc-extra", .type = CONFIG_KERNEL, .def = "", .env = "FA_NVRTC_EXTRA",
	 .metavar = "OPTS",
	 .help = "experiments: extra -D options for NVRTC (kernels/PERF-NOTES.md); part of the "
	         "kernel cache's key and the tuning table's source hash",
	 FIELD(kernels)},
	{.name = "kernel-cache-max-mb", .type = CONFIG_KERNEL, .def = "0",
	 .env = "FA_KERNEL_CACHE_MAX_MB", .metavar = "MB",
	 .help = "bound of the kernel disk cache in MiB; 0 = 512", FIELD(kernels)},
	{.name = "bwd-det-group", .type = CONFIG_KERNEL, .def = "0", .env = "FA_BWD_DET_GROUP",
	 .metavar = "N",
	 .help = "gpu backend: key blocks the deterministic backward runs as one group (1, 2, 4 "
	         "or 8; 0 = 1, as measured)",
	 FIELD(kernels)},
	{.name = "wgmma16-bwd", .type = CONFIG_KERNEL, .def = "auto", .env = "FA_WGMMA16_BWD",
	 .metavar = "auto|0|1",
	 .help = "gpu backend: the 16-bit wgmma backward (sm_90) where it measured faster (auto), "
	         "never (0) or wherever it claims the shape (1)",
	 FIELD(kernels)},
	{.name = "wgmma32-bwd", .type = CONFIG_KERNEL, .def = "auto", .env = "FA_WGMMA32_BWD",
	 .metavar = "auto|0|1",
	 .help = "gpu backend: the fp32 tf32 / 3xtf32 wgmma backward (sm_90) where it measured "
	         "faster (auto), never (0) or wherever it fits the shape (1)",
	 FIELD(kernels)},
	{.name = "bwd-det-rot", .type = CONFIG_KERNEL, .def = "0", .env = "FA_BWD_DET_ROT",
	 .metavar = "0|1",
	 .help = "gpu backend: an experiment, off: the 16-bit wgmma backward's deterministic mode "
	         "by turns (the rotated order, wrong without a mask on the H200, or the chain) "
	         "instead of in fixed point",
	 FIELD(kernels)},
	{.name = "cuda-home", .type = CONFIG_KERNEL, .def = "", .env = "CUDA_HOME", .metavar = "DIR",
	 .help = "a CUDA toolkit whose lib64/libnvrtc.so.13 is tried after the one built in",
	 FIELD(kernels)},
	{.name = "verbose", .short_flag = 'v', .type = CONFIG_INT, .def = "0", .min = 0, .max = 2,
	 .env = "FA_VERBOSE", .metavar = "N",
	 .help = "log level: 0 notice, 1 info (a line per request), 2 debug", FIELD(verbose)},
};

#define CONFIG_NOPTIONS (sizeof(config_options) / sizeof(config_options[0]))

/* The option called name (len bytes), or NULL. */
static const struct config_option *config_find(const char *name, size_t len)
{
	for (size_t i = 0; i < CONFIG_NOPTIONS; i++)
		if (strlen(config_options[i].name) == len &&
		    strncmp(config_options[i].name, name, len) == 0)
			return &config_options[i];
	return NULL;
}

/* Parse a whole string as a signed decimal integer. */
static bool config_parse_i64(const char *s, int base, int64_t *out)
{
	char *end;

	if (*s == '\0' || isspace((unsigned char)*s))
		return false;
	errno = 0;
	long long v = strtoll(s, &end, base);
	if (errno != 0 || *end != '\0')
		return false;
	*out = v;
	return true;
}

/* "123", "4K", "64G", "1TiB", "2m": a size in bytes; suffixes are powers of 1024. */
static bool config_parse_size(const char *s, int64_t *out)
{
	static const char units[] = "KMGT";
	char *end;
	int shift = 0;

	if (!isdigit((unsigned char)*s))
		return false;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0)
		return false;
	if (*end != '\0') {
		const char *u = strchr(units, toupper((unsigned char)*end));
		if (u == NULL)
			return false;
		shift = 10 * (int)(u - units + 1);
		end++;
		if (strcmp(end, "") != 0 && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0)
			return false;
	} else if (end == s) {
		return false;
	}
	if (v > ((unsigned long long)INT64_MAX >> shift))
		return false;
	*out = (int64_t)(v << shift);
	return true;
}

/* Write a byte count with the largest exact K/M/G/T suffix. */
static void config_format_size(uint64_t v, char *buf, size_t cap)
{
	static const char units[] = "KMGT";
	int u = -1;

	while (u < 3 && v != 0 && (v & 1023) == 0) {
		v >>= 10;
		u++;
	}
	if (u < 0)
		snprintf(buf, cap, "%" PRIu64, v);
	else
		snprintf(buf, cap, "%" PRIu64 "%c", v, units[u]);
}

/* Where an option's value lives in a struct config. */
static void *config_field(struct config *c, const struct config_option *o)
{
	return (char *)c + o->offset;
}

/* Where an option's value lives in a const struct config. */
static const void *config_cfield(const struct config *c, const struct config_option *o)
{
	return (const char *)c + o->offset;
}

/* Store an integer in a field of the option's size (int, unsigned or uint64_t). */
static void config_store_int(struct config *c, const struct config_option *o, int64_t v)
{
	void *f = config_field(c, o);

	if (o->size == sizeof(uint64_t))
		*(uint64_t *)f = (uint64_t)v;
	else if (o->type == CONFIG_MODE)
		*(unsigned *)f = (unsigned)v;
	else
		*(int *)f = (int)v;
}

/* Read an integer field of the option's size. */
static int64_t config_load_int(const struct config *c, const struct config_option *o)
{
	const void *f = config_cfield(c, o);

	if (o->size == sizeof(uint64_t))
		return (int64_t) * (const uint64_t *)f;
	if (o->type == CONFIG_MODE)
		return *(const unsigned *)f;
	return *(const int *)f;
}

/* Parse value for option o, check its range, store it; origin names the source. */
static fa_status config_apply(struct config *c, const struct config_option *o, const char *value,
                              const char *origin, char *err, size_t errlen)
{
	int64_t v;

	switch (o->type) {
	case CONFIG_SOCKET: {
		const char *path = value;
		if (strncmp(path, "ipc://", 6) == 0)
			path += 6;
		if (*path == '\0')
			return fa_err(err, errlen, FA_EINVAL, "%s: the socket path is empty",
			              origin);
		if (strlen(path) >= CONFIG_SOCKET_MAX)
			return fa_err(err, errlen, FA_EINVAL,
			              "%s: socket path is %zu bytes; a Unix socket path must be "
			              "shorter than %d bytes",
			              origin, strlen(path), CONFIG_SOCKET_MAX);
		snprintf(config_field(c, o), o->size, "%s", path);
		return FA_OK;
	}
	case CONFIG_STR:
		if (strlen(value) >= o->size)
			return fa_err(err, errlen, FA_EINVAL,
			              "%s: value is %zu bytes, at most %zu", origin,
			              strlen(value), o->size - 1);
		snprintf(config_field(c, o), o->size, "%s", value);
		return FA_OK;
	case CONFIG_ENUM:
		for (const char *const *ch = o->choices; *ch != NULL; ch++) {
			if (strcmp(*ch, value) == 0) {
				snprintf(config_field(c, o), o->size, "%s", value);
				return FA_OK;
			}
		}
		{
			char list[128] = "";
			for (const char *const *ch = o->choices; *ch != NULL; ch++)
				snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
				         ch == o->choices ? "" : ", ", *ch);
			return fa_err(err, errlen, FA_EINVAL, "%s: '%s' is not one of: %s",
			              origin, value, list);
		}
	case CONFIG_INT:
		if (!config_parse_i64(value, 10, &v))
			return fa_err(err, errlen, FA_EINVAL, "%s: '%s' is not an integer",
			              origin, value);
		break;
	case CONFIG_MODE:
		if (!config_parse_i64(value, 8, &v))
			return fa_err(err, errlen, FA_EINVAL, "%s: '%s' is not an octal mode",
			              origin, value);
		break;
	case CONFIG_SIZE:
		if (!config_parse_size(value, &v))
			return fa_err(
			    err, errlen, FA_EINVAL,
			    "%s: '%s' is not a size (bytes, or a number with K, M, G or T)", origin,
			    value);
		break;
	case CONFIG_KERNEL: {
		char why[256];
		if (fa_kernel_settings_set(&c->kernels, o->env, value, why, sizeof why) == FA_OK)
			return FA_OK;
		/* the kernels' text starts with the setting's name; origin names it already */
		const char *w = why;
		size_t n = strlen(o->env);
		if (strncmp(w, o->env, n) == 0 && w[n] == ':')
			w += n + 2;
		return fa_err(err, errlen, FA_EINVAL, "%s: %s", origin, w);
	}
	default:
		return fa_err(err, errlen, FA_EINVAL, "%s: unsupported option type", origin);
	}
	if (v < o->min || v > o->max) {
		if (o->type == CONFIG_MODE)
			return fa_err(err, errlen, FA_EINVAL, "%s: %s is out of range %04" PRIo64
			              "..%04" PRIo64, origin, value, (uint64_t)o->min,
			              (uint64_t)o->max);
		return fa_err(err, errlen, FA_EINVAL,
		              "%s: %s is out of range %" PRId64 "..%" PRId64, origin, value,
		              o->min, o->max);
	}
	config_store_int(c, o, v);
	return FA_OK;
}

/* Set an option by name; see config.h. */
fa_status config_set(struct config *c, const char *name, const char *value, const char *origin,
                     char *err, size_t errlen)
{
	const struct config_option *o = config_find(name, strlen(name));

	if (o == NULL)
		return fa_err(err, errlen, FA_EINVAL, "%s: unknown option '%s'", origin, name);
	return config_apply(c, o, value, origin, err, errlen);
}

/* The computed defaults: paths that depend on the environment. */
static void config_default_paths(struct config *c)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	const char *cache = getenv("CACHE_DIRECTORY"); /* systemd's CacheDirectory= */
	const char *xdg_cache = getenv("XDG_CACHE_HOME");
	const char *home = getenv("HOME");

	if (xdg != NULL && *xdg == '/' &&
	    strlen(xdg) + sizeof("/fa-daemon/fa.sock") <= sizeof(c->socket))
		snprintf(c->socket, sizeof c->socket, "%s/fa-daemon/fa.sock", xdg);
	else
		snprintf(c->socket, sizeof c->socket, "/run/fa-daemon/fa.sock");

	if (cache != NULL && *cache == '/' && strchr(cache, ':') == NULL)
		snprintf(c->cache_dir, sizeof c->cache_dir, "%s", cache);
	else if (xdg_cache != NULL && *xdg_cache == '/')
		snprintf(c->cache_dir, sizeof c->cache_dir, "%.4000s/fa-daemon", xdg_cache);
	else if (home != NULL && *home == '/' && getuid() != 0)
		snprintf(c->cache_dir, sizeof c->cache_dir, "%.4000s/.cache/fa-daemon", home);
	else
		snprintf(c->cache_dir, sizeof c->cache_dir, "/var/cache/fa-daemon");
}

/* Every option at its default; see config.h. */
void config_defaults(struct config *c)
{
	char err[256];

	memset(c, 0, sizeof(*c));
	fa_kernel_settings_init(&c->kernels);
	for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
		const struct config_option *o = &config_options[i];
		/* The table's defaults are checked by the tests (test_config_defaults_parse). */
		if (o->def != NULL)
			(void)config_apply(c, o, o->def, "default", err, sizeof err);
	}
	config_default_paths(c);
}

/* Trim spaces at both ends, in place. */
static char *config_trim(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

/* Apply a config file; see config.h. */
fa_status config_load_file(struct config *c, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	char line[CONFIG_PATH_MAX + 256];
	char origin[CONFIG_PATH_MAX + 64];
	unsigned lineno = 0;
	fa_status st = FA_OK;

	if (f == NULL)
		return fa_err(err, errlen, FA_ESYS, "--config %s: %s", path, strerror(errno));
	while (fgets(line, sizeof line, f) != NULL) {
		lineno++;
		snprintf(origin, sizeof origin, "%s:%u", path, lineno);
		if (strchr(line, '\n') == NULL && !feof(f)) {
			st = fa_err(err, errlen, FA_EINVAL, "%s: line too long", origin);
			break;
		}
		char *hash = strchr(line, '#');
		if (hash != NULL)
			*hash = '\0';
		char *s = config_trim(line);
		if (*s == '\0')
			continue;
		char *eq = strchr(s, '=');
		if (eq == NULL) {
			st = fa_err(err, errlen, FA_EINVAL, "%s: expected name = value", origin);
			break;
		}
		*eq = '\0';
		char *name = config_trim(s);
		char *value = config_trim(eq + 1);
		size_t vlen = strlen(value);
		if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"') {
			value[vlen - 1] = '\0';
			value++;
		}
		if (strcmp(name, "config") == 0) {
			st = fa_err(err, errlen, FA_EINVAL,
			            "%s: 'config' cannot be set in a file", origin);
			break;
		}
		if ((st = config_set(c, name, value, origin, err, errlen)) != FA_OK)
			break;
	}
	if (st == FA_OK && ferror(f))
		st = fa_err(err, errlen, FA_ESYS, "--config %s: read error", path);
	fclose(f);
	return st;
}

/* Apply the environment; see config.h. */
fa_status config_load_env(struct config *c, char *err, size_t errlen)
{
	for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
		const struct config_option *o = &config_options[i];
		const char *v;
		if (o->env == NULL || strcmp(o->name, "config") == 0 ||
		    (v = getenv(o->env)) == NULL)
			continue;
		fa_status st = config_apply(c, o, v, o->env, err, errlen);
		if (st != FA_OK)
			return st;
	}
	return FA_OK;
}

/* -v, -vv, -vvv (capped): each v adds one level. */
static fa_status config_short_flags(struct config *c, const char *arg, enum config_action *action,
                                    char *err, size_t errlen)
{
	int v = 0;

	if (strcmp(arg, "-h") == 0) {
		*action = CONFIG_HELP;
		return FA_OK;
	}
	if (strcmp(arg, "-V") == 0) {
		*action = CONFIG_VERSION;
		return FA_OK;
	}
	for (const char *p = arg + 1; *p != '\0'; p++) {
		if (*p != 'v')
			return fa_err(err, errlen, FA_EINVAL, "unknown option '%s' (see --help)",
			              arg);
		v++;
	}
	if (v == 0)
		return fa_err(err, errlen, FA_EINVAL, "unknown option '%s' (see --help)", arg);
	c->verbose = v > 2 ? 2 : v;
	return FA_OK;
}

/* Apply command-line flags; see config.h. */
fa_status config_parse_args(struct config *c, int argc, char **argv, enum config_action *action,
                            char *err, size_t errlen)
{
	*action = CONFIG_RUN;
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		fa_status st;

		if (strcmp(arg, "--help") == 0) {
			*action = CONFIG_HELP;
			return FA_OK;
		}
		if (strcmp(arg, "--version") == 0) {
			*action = CONFIG_VERSION;
			return FA_OK;
		}
		if (arg[0] == '-' && arg[1] != '-' && arg[1] != '\0') {
			if ((st = config_short_flags(c, arg, action, err, errlen)) != FA_OK)
				return st;
			if (*action != CONFIG_RUN)
				return FA_OK;
			continue;
		}
		if (strncmp(arg, "--", 2) != 0)
			return fa_err(err, errlen, FA_EINVAL,
			              "unexpected argument '%s' (options start with --)", arg);
		const char *name = arg + 2;
		const char *eq = strchr(name, '=');
		size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
		const struct config_option *o = config_find(name, nlen);
		if (o == NULL)
			return fa_err(err, errlen, FA_EINVAL,
			              "unknown option '--%.*s' (see --help)", (int)nlen, name);
		const char *value;
		if (eq != NULL) {
			value = eq + 1;
		} else if (i + 1 < argc) {
			value = argv[++i];
		} else {
			return fa_err(err, errlen, FA_EINVAL, "--%s needs a value (%s)", o->name,
			              o->metavar);
		}
		char origin[64];
		snprintf(origin, sizeof origin, "--%s", o->name);
		if ((st = config_apply(c, o, value, origin, err, errlen)) != FA_OK)
			return st;
	}
	return FA_OK;
}

/* Resolve threads 0 to the CPUs this process may run on (cgroup cpusets, taskset). */
void config_finish(struct config *c)
{
	if (c->threads == 0) {
		cpu_set_t set;
		int n = 0;
		if (sched_getaffinity(0, sizeof set, &set) == 0)
			n = CPU_COUNT(&set);
		if (n <= 0)
			n = (int)sysconf(_SC_NPROCESSORS_ONLN);
		c->threads = n > 0 ? (n > 1024 ? 1024 : n) : 1;
	}
	if (c->session_workers == 0)
		c->session_workers = c->threads > 1 ? c->threads - 1 : 1;
}

/* The checks between options; see config.h. */
fa_status config_check(const struct config *c, char *err, size_t errlen)
{
	if (c->max_connections_per_uid > c->max_connections)
		return fa_err(err, errlen, FA_EINVAL,
		              "max-connections-per-uid %d is above max-connections %d",
		              c->max_connections_per_uid, c->max_connections);
	if (c->reserved_connections >= c->max_connections)
		return fa_err(err, errlen, FA_EINVAL,
		              "reserved-connections %d leaves none of max-connections %d for other "
		              "users",
		              c->reserved_connections, c->max_connections);
	return FA_OK;
}

/* Defaults, file, environment, flags, in that order; see config.h. */
fa_status config_load(struct config *c, int argc, char **argv, enum config_action *action,
                      char *err, size_t errlen)
{
	struct config scratch;
	fa_status st;

	/* --help and --version win over any error elsewhere on the line. */
	*action = CONFIG_RUN;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
			*action = CONFIG_HELP;
		else if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0)
			*action = CONFIG_VERSION;
		if (*action != CONFIG_RUN)
			return FA_OK;
	}
	/* A first pass on a scratch copy: the --config flag must be known before the file is
	 * read, and the file comes before the other flags. */
	config_defaults(&scratch);
	const char *env_file = getenv("FA_CONFIG");
	if (env_file != NULL)
		snprintf(scratch.config_file, sizeof scratch.config_file, "%s", env_file);
	st = config_parse_args(&scratch, argc, argv, action, err, errlen);
	if (*action != CONFIG_RUN)
		return FA_OK;
	if (st != FA_OK)
		return st;

	config_defaults(c);
	snprintf(c->config_file, sizeof c->config_file, "%s", scratch.config_file);
	if (c->config_file[0] != '\0' &&
	    (st = config_load_file(c, c->config_file, err, errlen)) != FA_OK)
		return st;
	if ((st = config_load_env(c, err, errlen)) != FA_OK)
		return st;
	if ((st = config_parse_args(c, argc, argv, action, err, errlen)) != FA_OK)
		return st;
	config_finish(c);
	return config_check(c, err, errlen);
}

/* An option's current value as text, formatted as its parser reads it. */
bool config_get(const struct config *c, const char *name, char *buf, size_t cap)
{
	const struct config_option *o = config_find(name, strlen(name));

	if (o == NULL)
		return false;
	switch (o->type) {
	case CONFIG_STR:
	case CONFIG_SOCKET:
	case CONFIG_ENUM:
		snprintf(buf, cap, "%s", (const char *)config_cfield(c, o));
		break;
	case CONFIG_MODE:
		snprintf(buf, cap, "%04" PRIo64, (uint64_t)config_load_int(c, o));
		break;
	case CONFIG_SIZE:
		config_format_size((uint64_t)config_load_int(c, o), buf, cap);
		break;
	case CONFIG_KERNEL:
		fa_kernel_settings_get(&c->kernels, o->env, buf, cap);
		break;
	default:
		snprintf(buf, cap, "%" PRId64, config_load_int(c, o));
		break;
	}
	return true;
}

/* The one-line "name=value ..." dump for the startup log. */
void config_describe(const struct config *c, char *buf, size_t cap)
{
	size_t n = 0;

	if (cap == 0)
		return;
	buf[0] = '\0';
	for (size_t i = 0; i < CONFIG_NOPTIONS && n < cap; i++) {
		char v[CONFIG_PATH_MAX];
		config_get(c, config_options[i].name, v, sizeof v);
		int m = snprintf(buf + n, cap - n, "%s%s=%s", i ? " " : "", config_options[i].name,
		                 v[0] ? v : "\"\"");
		if (m < 0)
			break;
		n += (size_t)m;
	}
}

#define HELP_WIDTH 96
/* Print text wrapped at HELP_WIDTH columns, continuation lines indented to `indent`. */
static void config_wrap(FILE *f, const char *text, int col, int indent)
{
	const char *p = text;

	while (*p != '\0') {
		const char *w = p;
		while (*w == ' ')
			w++;
		const char *e = w;
		while (*e != '\0' && *e != ' ')
			e++;
		int len = (int)(e - w);
		if (col > indent && col + 1 + len > HELP_WIDTH) {
			fprintf(f, "\n%*s", indent, "");
			col = indent;
		} else if (col > indent) {
			fputc(' ', f);
			col++;
		}
		fprintf(f, "%.*s", len, w);
		col += len;
		p = e;
	}
	fputc('\n', f);
}

/* The --help text, generated from the table. */
void config_print_help(FILE *f, const char *argv0)
{
	fprintf(
	    f,
	    "Usage: %s [OPTIONS]\n"
	    "Serve FlashAttention to local processes over a Unix socket (libfaclient).\n"
	    "\n"
	    "Options. Each also works as NAME = VALUE in the --config file and as the environment\n"
	    "variable shown; flags beat the environment, which beats the file.\n",
	    argv0);
	for (size_t i = 0; i < CONFIG_NOPTIONS; i++) {
		const struct config_option *o = &config_options[i];
		char flag[64], more[256];
		if (o->short_flag != 0)
			snprintf(flag, sizeof flag, "-%c, --%s %s", o->short_flag, o->name,
			         o->metavar);
		else
			snprintf(flag, sizeof flag, "    --%s %s", o->name, o->metavar);
		int col = fprintf(f, "  %-26s", flag);
		if (col > 28) {
			fprintf(f, "\n%28s", "");
			col = 28;
		}
		if (o->def_help != NULL)
			snprintf(more, sizeof more, "%s. Default %s; env %s.", o->help, o->def_help,
			         o->env);
		else if (o->def != NULL && o->def[0] != '\0' && o->type == CONFIG_INT)
			snprintf(more, sizeof more, "%s. Default %s, range %" PRId64 "..%" PRId64
			         "; env %s.", o->help, o->def, o->min, o->max, o->env);
		else if (o->def != NULL && o->def[0] != '\0')
			snprintf(more, sizeof more, "%s. Default %s; env %s.", o->help, o->def,
			         o->env);
		else
			snprintf(more, sizeof more, "%s. Env %s.", o->help, o->env);
		config_wrap(f, more, col, 28);
	}
	fprintf(f, "  %-26s%s\n", "-v, -vv", "more log lines (--verbose 1, 2)");
	fprintf(f, "  %-26s%s\n", "-h, --help", "this text");
	fprintf(f, "  %-26s%s\n", "-V, --version", "print the version and exit");
	fprintf(
	    f,
	    "\n"
	    "Exit status: 0 after a clean shutdown (SIGTERM, SIGINT), 1 when the daemon could not\n"
	    "start, 2 for a bad option or config file, 128+N when a second signal N cut the\n"
	    "shutdown short.\n");
}
