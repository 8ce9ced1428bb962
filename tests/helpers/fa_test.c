/* fa_test.c - shared test helpers: daemon processes, bounded waits, logs, data. libc only. */
#include "fa_test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fa_cu.h"

#define START_TIMEOUT_MS 20000
#define STOP_TIMEOUT_MS 20000
#define MAX_EXTRA_ARGS 32

/* Whether this program was built with AddressSanitizer (gcc and clang spell it differently). */
#if defined(__SANITIZE_ADDRESS__)
#define FA_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_TEST_ASAN 1
#endif
#endif
#ifndef FA_TEST_ASAN
#define FA_TEST_ASAN 0
#endif

/* The build directory the test runner names; the daemon binary lives there. */
const char *fa_test_build_dir(void)
{
	const char *b = getenv("FA_BUILD");
	return b && *b ? b : "build";
}

/* One scale for every bounded wait, so a slow or instrumented machine relaxes them all. */
double fa_test_timeout_scale(void)
{
	double s = 1.0;
	const char *e = getenv("FA_TEST_TIMEOUT_SCALE");
	if (e && *e) {
		double v = strtod(e, NULL);
		if (v > 0 && isfinite(v))
			s = v;
	}
	if (FA_TEST_ASAN)
		s *= 3.0;
	return s;
}

/* A timeout in milliseconds, scaled. */
int fa_test_ms(int ms)
{
	double v = ms * fa_test_timeout_scale();
	return v > 2e9 ? 2000000000 : (int)v;
}

/* Monotonic microseconds: latencies and deadlines must not jump with the wall clock. */
uint64_t fa_test_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Monotonic milliseconds. */
uint64_t fa_test_now_ms(void)
{
	return fa_test_now_us() / 1000u;
}

/* A short sleep for polling loops (each has its own deadline). */
void fa_test_sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* A private directory with a short name, so socket paths stay far below sun_path's limit. */
int fa_test_mkdir(char *out, size_t cap)
{
	if (cap < 32)
		return -1;
	snprintf(out, cap, "/tmp/fa-XXXXXX");
	return mkdtemp(out) ? 0 : -1;
}

/* Remove the directory's entries (one level: that is all the helpers create) and itself. */
void fa_test_rmdir(const char *dir)
{
	if (!dir || !*dir || getenv("FA_TEST_KEEP"))
		return;
	DIR *dp = opendir(dir);
	if (dp) {
		struct dirent *e;
		while ((e = readdir(dp)) != NULL) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			char p[512];
			snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
			unlink(p);
		}
		closedir(dp);
	}
	rmdir(dir);
}

/* Turn a wait status into one number: the exit code, or 128 + the signal, like a shell. */
static int status_code(int ws)
{
	if (WIFEXITED(ws))
		return WEXITSTATUS(ws);
	if (WIFSIGNALED(ws))
		return 128 + WTERMSIG(ws);
	return 255;
}

/* Daemons started and not reaped yet, so a test that fails half-way (cmocka longjmps out of it)
 * leaves no daemon running after the program ends. Only the process that started them acts. */
#define MAX_TRACKED 64
static pid_t tracked[MAX_TRACKED];
static pid_t tracked_owner;

static void track_kill_all(void)
{
	if (getpid() != tracked_owner)
		return;
	for (int i = 0; i < MAX_TRACKED; i++)
		if (tracked[i] > 0) {
			kill(tracked[i], SIGKILL);
			waitpid(tracked[i], NULL, 0);
			tracked[i] = 0;
		}
}

static void track_add(pid_t pid)
{
	if (tracked_owner != getpid()) {
		memset(tracked, 0, sizeof tracked);
		if (tracked_owner == 0)
			atexit(track_kill_all);
		tracked_owner = getpid();
	}
	for (int i = 0; i < MAX_TRACKED; i++)
		if (tracked[i] == 0) {
			tracked[i] = pid;
			return;
		}
}

static void track_remove(pid_t pid)
{
	for (int i = 0; i < MAX_TRACKED; i++)
		if (tracked[i] == pid)
			tracked[i] = 0;
}

/* Reap the daemon if it has exited; remember how. */
static bool daemon_reap(struct fa_daemon *d, bool block)
{
	if (d->exited || d->pid <= 0)
		return d->exited;
	int ws;
	pid_t r;
	do
		r = waitpid(d->pid, &ws, block ? 0 : WNOHANG);
	while (r < 0 && errno == EINTR);
	if (r == d->pid) {
		d->exited = true;
		d->status = status_code(ws);
		track_remove(d->pid);
		return true;
	}
	if (r < 0 && errno == ECHILD) { /* reaped elsewhere: treat as gone, status unknown */
		d->exited = true;
		d->status = 255;
		track_remove(d->pid);
		return true;
	}
	return false;
}

/* The notify socket the daemon reports READY=1 to (systemd's protocol, a datagram per message). */
static int notify_open(struct fa_daemon *d)
{
	snprintf(d->notify, sizeof d->notify, "%s/n", d->dir);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_un sa;
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", d->notify);
	unlink(d->notify);
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		close(fd);
		return -1;
	}
	d->notify_fd = fd;
	return 0;
}

/* Read every pending notify datagram; true once one of them had a READY=1 line. */
static bool notify_drain(struct fa_daemon *d)
{
	bool ready = false;
	char buf[4096];
	for (;;) {
		ssize_t n = recv(d->notify_fd, buf, sizeof buf - 1, 0);
		if (n < 0)
			break;
		buf[n] = '\0';
		char *save = NULL;
		for (char *line = strtok_r(buf, "\n", &save); line;
		     line = strtok_r(NULL, "\n", &save)) {
			if (!strcmp(line, "READY=1"))
				ready = true;
			else if (!strncmp(line, "STATUS=", 7))
				snprintf(d->status_line, sizeof d->status_line, "%s", line + 7);
		}
	}
	return ready;
}

/* fork + exec the daemon with stdout and stderr in the log and NOTIFY_SOCKET set, then wait for
 * READY=1 (or its exit, or the deadline). */
int daemon_start_argv(struct fa_daemon *d, const char *sock, const char *const *extra)
{
	memset(d, 0, sizeof *d);
	d->notify_fd = -1;
	if (fa_test_mkdir(d->dir, sizeof d->dir) != 0)
		return -3;
	if (sock)
		snprintf(d->sock, sizeof d->sock, "%s", sock);
	else
		snprintf(d->sock, sizeof d->sock, "%s/s", d->dir);
	snprintf(d->url, sizeof d->url, "ipc://%s", d->sock);
	snprintf(d->log, sizeof d->log, "%s/daemon.log", d->dir);
	if (notify_open(d) != 0)
		return -3;

	/* The socket path is used as given even when it does not fit d->sock (tests of the length
	 * check pass one), so the argument vector takes the caller's string. */
	const char *argv[MAX_EXTRA_ARGS + 8];
	char bin[512];
	snprintf(bin, sizeof bin, "%s/fa-daemon", fa_test_build_dir());
	int n = 0;
	argv[n++] = bin;
	argv[n++] = "--socket";
	argv[n++] = sock ? sock : d->sock;
	for (int i = 0; extra && extra[i] && n < MAX_EXTRA_ARGS + 6; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	int logfd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (logfd < 0)
		return -3;
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0) {
		close(logfd);
		return -3;
	}
	if (pid == 0) {
		int nul = open("/dev/null", O_RDONLY);
		if (nul >= 0)
			dup2(nul, 0);
		dup2(logfd, 1);
		dup2(logfd, 2);
		setenv("NOTIFY_SOCKET", d->notify, 1);
		unsetenv("FA_SOCKET");
		/* Sanitizer reports go to the log; keep them readable there. */
		execv(bin, (char *const *)argv);
		fprintf(stderr, "fa_test: exec %s: %s\n", bin, strerror(errno));
		_exit(127);
	}
	close(logfd);
	d->pid = pid;
	track_add(pid);

	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(START_TIMEOUT_MS);
	for (;;) {
		if (notify_drain(d))
			return 0;
		if (daemon_reap(d, false))
			return -1;
		uint64_t now = fa_test_now_ms();
		if (now >= deadline)
			break;
		struct pollfd pfd = {d->notify_fd, POLLIN, 0};
		int wait = (int)(deadline - now);
		poll(&pfd, 1, wait < 50 ? wait : 50); /* short, to notice an early exit */
	}
	fprintf(stderr, "fa_test: daemon pid %d not ready after %d ms (last status: %s)\n", (int)pid,
	        fa_test_ms(START_TIMEOUT_MS), d->status_line);
	daemon_kill(d);
	return -2;
}

/* Collect a NULL-terminated variadic list into a vector. */
static void collect_args(const char **out, va_list ap)
{
	int n = 0;
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL && n < MAX_EXTRA_ARGS)
		out[n++] = a;
	out[n] = NULL;
}

/* Start on a new private socket. */
int daemon_start(struct fa_daemon *d, ...)
{
	const char *extra[MAX_EXTRA_ARGS + 1];
	va_list ap;
	va_start(ap, d);
	collect_args(extra, ap);
	va_end(ap);
	return daemon_start_argv(d, NULL, extra);
}

/* Start on a given socket (a restart, a second daemon, a bad path). */
int daemon_start_at(struct fa_daemon *d, const char *sock, ...)
{
	const char *extra[MAX_EXTRA_ARGS + 1];
	va_list ap;
	va_start(ap, sock);
	collect_args(extra, ap);
	va_end(ap);
	return daemon_start_argv(d, sock, extra);
}

/* Running, and not a zombie. */
bool daemon_alive(struct fa_daemon *d)
{
	return d->pid > 0 && !daemon_reap(d, false);
}

/* Poll for the exit with a deadline (waitpid has no timeout). */
int daemon_wait(struct fa_daemon *d, int timeout_ms)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)timeout_ms;
	while (!daemon_reap(d, false)) {
		if (fa_test_now_ms() >= deadline)
			return -1;
		fa_test_sleep_ms(5);
	}
	return d->status;
}

/* SIGTERM: the daemon answers what it holds and exits 0; give it a bounded time to do so. */
int daemon_stop(struct fa_daemon *d)
{
	if (d->pid <= 0)
		return -1;
	if (daemon_reap(d, false))
		return d->status;
	kill(d->pid, SIGTERM);
	int st = daemon_wait(d, fa_test_ms(STOP_TIMEOUT_MS));
	if (st >= 0)
		return st;
	fprintf(stderr, "fa_test: daemon pid %d ignored SIGTERM for %d ms; killing it\n", (int)d->pid,
	        fa_test_ms(STOP_TIMEOUT_MS));
	daemon_kill(d);
	return -1;
}

/* SIGKILL: a crash, as the daemon sees it. */
int daemon_kill(struct fa_daemon *d)
{
	if (d->pid <= 0)
		return -1;
	if (daemon_reap(d, false))
		return d->status;
	kill(d->pid, SIGKILL);
	daemon_reap(d, true);
	return d->status;
}

/* Whole file into memory. */
char *daemon_log_read(const struct fa_daemon *d)
{
	FILE *f = fopen(d->log, "rb");
	if (!f)
		return strdup("");
	size_t cap = 4096, len = 0;
	char *s = malloc(cap);
	if (!s) {
		fclose(f);
		return NULL;
	}
	size_t n;
	while ((n = fread(s + len, 1, cap - len - 1, f)) > 0) {
		len += n;
		if (cap - len - 1 == 0) {
			char *t = realloc(s, cap * 2);
			if (!t)
				break;
			s = t;
			cap *= 2;
		}
	}
	s[len] = '\0';
	fclose(f);
	return s;
}

/* Substring test on the log. */
bool daemon_log_contains(const struct fa_daemon *d, const char *needle)
{
	char *s = daemon_log_read(d);
	bool found = s && strstr(s, needle) != NULL;
	free(s);
	return found;
}

/* redis's habit: after stopping the server, grep its output for sanitizer reports. */
bool daemon_log_clean(const struct fa_daemon *d)
{
	static const char *const bad[] = {"AddressSanitizer", "LeakSanitizer", "runtime error",
	                                  "ThreadSanitizer", "MemorySanitizer"};
	char *s = daemon_log_read(d);
	bool clean = true;
	for (size_t i = 0; s && i < sizeof bad / sizeof bad[0]; i++)
		if (strstr(s, bad[i]))
			clean = false;
	if (!clean)
		fprintf(stderr, "fa_test: sanitizer report in %s:\n%s\n", d->log, s);
	free(s);
	return clean;
}

/* The tail of the log, for a failing test's output. */
void daemon_log_dump(const struct fa_daemon *d, int max_lines)
{
	char *s = daemon_log_read(d);
	if (!s)
		return;
	int lines = 0;
	char *p = s + strlen(s);
	while (p > s && lines <= max_lines) {
		p--;
		if (*p == '\n')
			lines++;
	}
	if (*p == '\n')
		p++;
	fprintf(stderr, "---- %s (last %d lines) ----\n", d->log, max_lines);
	char *save = NULL;
	for (char *line = strtok_r(p, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		fprintf(stderr, "daemon| %s\n", line);
	free(s);
}

/* Leave nothing behind: the process, the notify socket, the directory. */
void daemon_cleanup(struct fa_daemon *d)
{
	if (d->pid > 0 && !d->exited)
		daemon_kill(d);
	if (d->notify_fd >= 0)
		close(d->notify_fd);
	d->notify_fd = -1;
	if (d->dir[0])
		fa_test_rmdir(d->dir);
	d->dir[0] = '\0';
}

/* GPU tests skip without a driver; the driver is only ever loaded at run time (common/fa_cu.h),
 * and stays loaded. */
bool have_gpu(void)
{
	static int cached = -1;
	int count = 0;

	if (cached < 0)
		cached = fa_cu_load() == FA_OK && fa_cu->DeviceGetCount(&count) == 0 && count > 0;
	return cached;
}

/* xorshift64*: fast, reproducible from a printed seed. */
uint64_t fa_rand_next(uint64_t *state)
{
	uint64_t x = *state ? *state : 0x9e3779b97f4a7c15ull;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545f4914f6cdd1dull;
}

double fa_rand_uniform(uint64_t *state)
{
	return (double)(fa_rand_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

int64_t fa_rand_range(uint64_t *state, int64_t lo, int64_t hi)
{
	if (hi <= lo)
		return lo;
	return lo + (int64_t)(fa_rand_next(state) % (uint64_t)(hi - lo + 1));
}

/* IEEE half from float, round to nearest even; NaN stays NaN, overflow goes to infinity. */
uint16_t fa_test_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
	if (exp == 0xff)
		return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
	int e = (int)exp - 127 + 15;
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00u);
	if (e <= 0) { /* subnormal half or zero */
		if (e < -10)
			return sign;
		man |= 0x800000u;
		int shift = 14 - e;
		uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++; /* may carry into the exponent, up to infinity: correct */
	return (uint16_t)(sign | h);
}

/* bfloat16 from float, round to nearest even. */
uint16_t fa_test_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

void fa_fill_f32(float *p, size_t n, uint64_t *state, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		p[i] = lo + (hi - lo) * (float)fa_rand_uniform(state);
}

void fa_fill_f16(uint16_t *p, size_t n, uint64_t *state, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		p[i] = fa_test_f32_to_f16(lo + (hi - lo) * (float)fa_rand_uniform(state));
}

void fa_fill_bf16(uint16_t *p, size_t n, uint64_t *state, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		p[i] = fa_test_f32_to_bf16(lo + (hi - lo) * (float)fa_rand_uniform(state));
}

void fa_fill_bytes(void *p, size_t n, uint64_t *state)
{
	unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(fa_rand_next(state) >> 56);
}

void fa_poison_f16(uint16_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = 0x7e00u;
}

void fa_poison_bf16(uint16_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = 0x7fc0u;
}

void fa_poison_f32(float *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = NAN;
}

/* Find "key:" at the start of a line. */
bool fa_stats_get(const char *text, const char *key, char *out, size_t cap)
{
	size_t kl = strlen(key);
	for (const char *p = text; p && *p;) {
		if (!strncmp(p, key, kl) && p[kl] == ':') {
			const char *v = p + kl + 1, *e = strchr(v, '\n');
			size_t n = e ? (size_t)(e - v) : strlen(v);
			if (n > 0 && v[n - 1] == '\r')
				n--;
			if (cap) {
				if (n >= cap)
					n = cap - 1;
				memcpy(out, v, n);
				out[n] = '\0';
			}
			return true;
		}
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return false;
}

bool fa_stats_u64(const char *text, const char *key, uint64_t *out)
{
	char v[64], *end;
	if (!fa_stats_get(text, key, v, sizeof v) || !v[0])
		return false;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || *end != '\0')
		return false;
	*out = x;
	return true;
}

/* The client's shm objects are "/fa.<uid>.<pid>.<hex>": /dev/shm/fa.<uid>.<pid>.* on Linux. */
int fa_test_count_shm(pid_t pid)
{
	char prefix[64];
	if (pid > 0)
		snprintf(prefix, sizeof prefix, "fa.%u.%d.", (unsigned)getuid(), (int)pid);
	else
		snprintf(prefix, sizeof prefix, "fa.%u.", (unsigned)getuid());
	DIR *dp = opendir("/dev/shm");
	if (!dp)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dp)) != NULL)
		if (!strncmp(e->d_name, prefix, strlen(prefix)))
			n++;
	closedir(dp);
	return n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Nearest-rank percentile. */
double fa_test_percentile(double *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof *v, cmp_double);
	double r = p / 100.0 * (double)n;
	size_t i = r <= 1 ? 0 : (size_t)ceil(r) - 1;
	if (i >= n)
		i = n - 1;
	return v[i];
}

int fa_test_write_all(int fd, const void *p, size_t n)
{
	const char *b = p;
	while (n > 0) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

int fa_test_read_full(int fd, void *p, size_t n, int timeout_ms)
{
	char *b = p;
	uint64_t deadline = timeout_ms < 0 ? 0 : fa_test_now_ms() + (uint64_t)timeout_ms;
	while (n > 0) {
		int wait = -1;
		if (timeout_ms >= 0) {
			uint64_t now = fa_test_now_ms();
			if (now >= deadline)
				return -1;
			wait = (int)(deadline - now);
		}
		struct pollfd pfd = {fd, POLLIN, 0};
		int r = poll(&pfd, 1, wait);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		ssize_t got = read(fd, b, n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return -1;
		b += got;
		n -= (size_t)got;
	}
	return 0;
}

int fa_test_waitpid(pid_t pid, int timeout_ms)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)timeout_ms;
	for (;;) {
		int ws;
		pid_t r = waitpid(pid, &ws, WNOHANG);
		if (r == pid)
			return status_code(ws);
		if (r < 0 && errno != EINTR)
			return 255;
		if (fa_test_now_ms() >= deadline)
			return -1;
		fa_test_sleep_ms(5);
	}
}

/* See fa_test.h. */
int daemon_run_self_for_another_user(const struct fa_daemon *d, const char *prog, const char *flag,
                                     int timeout_ms)
{
	char dir[sizeof d->sock];
	snprintf(dir, sizeof dir, "%s", d->sock);
	char *slash = strrchr(dir, '/');
	if (slash == NULL)
		return -1;
	*slash = '\0';
	if (chmod(dir, 0711) != 0 || chmod(d->sock, 0666) != 0) {
		fprintf(stderr, "opening %s to other users: %s\n", d->sock, strerror(errno));
		return -1;
	}
	fflush(stdout);
	fflush(stderr);
	pid_t p = fork();
	if (p == 0) {
		execl("/proc/self/exe", prog, flag, d->url, (char *)NULL);
		_exit(127);
	}
	int rc = p < 0 ? -1 : fa_test_waitpid(p, fa_test_ms(timeout_ms));
	if (p > 0 && rc < 0) {
		fprintf(stderr, "%s %s ran past %d ms: killed\n", prog, flag, fa_test_ms(timeout_ms));
		kill(p, SIGKILL);
		fa_test_waitpid(p, 5000);
	}
	chmod(d->sock, 0600);
	chmod(dir, 0700);
	return rc;
}

/* See fa_test.h. */
int daemon_finish(struct fa_daemon *d)
{
	int st = daemon_stop(d);
	bool clean = daemon_log_clean(d);

	if (st != 0)
		fprintf(stderr, "daemon exit status %d, want 0\n", st);
	if (!clean)
		fprintf(stderr, "daemon log has a sanitizer report\n");
	if (st != 0 || !clean || getenv("FA_TEST_VERBOSE") != NULL)
		daemon_log_dump(d, 40);
	daemon_cleanup(d);
	return st == 0 && clean ? 0 : -1;
}

struct parallel_for {
	pthread_mutex_t mu;
	int next, n;
	void (*one)(int i);
};

static void *parallel_for_worker(void *arg)
{
	struct parallel_for *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->mu);
		int i = p->next++;
		pthread_mutex_unlock(&p->mu);
		if (i >= p->n)
			return NULL;
		p->one(i);
	}
}

void fa_test_parallel_for(int n, void (*one)(int i))
{
	struct parallel_for p = {PTHREAD_MUTEX_INITIALIZER, 0, n, one};
	int nth = 2;
	const char *e = getenv("FA_COMPILE_THREADS");
	if (e && atoi(e) > 0)
		nth = atoi(e) > 64 ? 64 : atoi(e);
	pthread_t th[64];
	int started = 0;
	for (int i = 0; i < nth; i++)
		if (pthread_create(&th[started], NULL, parallel_for_worker, &p) == 0)
			started++;
	if (started == 0)
		parallel_for_worker(&p); /* no thread to be had: this one does it all */
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
}
