/* fa_test.h - what every test program shares: a real fa-daemon per test on a private socket,
 * bounded waits, log scanning, GPU detection, random data.
 *
 * libc and common/ only: this file is linked into every test program, with or without nanomsg,
 * NNG or msgpack. Nothing here knows the wire protocol.
 *
 * A daemon started here lives in its own directory under /tmp ("/tmp/fa-XXXXXX"): the socket
 * ("s"), the NOTIFY_SOCKET the helper listens on ("n") and the daemon's stderr ("daemon.log").
 * Paths stay far below the 108 bytes of sun_path.
 */
#ifndef FA_TEST_H
#define FA_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FA_TEST_PATH_MAX 108 /* sun_path, incl. NUL */

/* A daemon process started by the tests. Zero it (or let daemon_start do it) before use. */
struct fa_daemon {
	pid_t pid;                    /* 0 when not running */
	bool exited;                  /* reaped; status is valid */
	int status;                   /* exit code, or 128 + signal */
	char dir[64];                 /* private directory; removed by daemon_cleanup */
	char sock[FA_TEST_PATH_MAX];  /* socket path passed as --socket */
	char url[FA_TEST_PATH_MAX + 8]; /* "ipc://" + sock, for fa_client_open and nn_connect */
	char log[128];                /* the daemon's stdout and stderr */
	char notify[FA_TEST_PATH_MAX]; /* NOTIFY_SOCKET path */
	int notify_fd;                /* bound datagram socket, -1 when closed */
	char status_line[256];        /* the last STATUS= the daemon sent, for messages */
};

/* The build directory: $FA_BUILD (set by tests/run.sh), default "build". */
const char *fa_test_build_dir(void);

/* $FA_TEST_TIMEOUT_SCALE (default 1), times 3 when this program was built with ASan. */
double fa_test_timeout_scale(void);

/* ms scaled by fa_test_timeout_scale(). */
int fa_test_ms(int ms);

/* Monotonic clock, microseconds and milliseconds. */
uint64_t fa_test_now_us(void);
uint64_t fa_test_now_ms(void);

/* Sleep ms milliseconds (for polling loops with a deadline only, never for readiness). */
void fa_test_sleep_ms(int ms);

/* Make a private directory "/tmp/fa-XXXXXX" into out (cap >= 32). Returns 0 or -1. */
int fa_test_mkdir(char *out, size_t cap);

/* Remove a directory made by fa_test_mkdir and the plain files and sockets in it. Keeps it when
 * FA_TEST_KEEP is set in the environment (for post-mortems). */
void fa_test_rmdir(const char *dir);

/* Start $FA_BUILD/fa-daemon --socket <new private path> [extra args...] (NULL-terminated list)
 * and wait for READY=1 on its NOTIFY_SOCKET, bounded by 20 s scaled.
 * Returns 0 when ready; -1 when the daemon exited first (d->exited, d->status set; its log says
 * why); -2 on timeout (the daemon was killed); -3 on a local error (errno). */
int daemon_start(struct fa_daemon *d, ...) __attribute__((sentinel));

/* Every daemon started here is also remembered until reaped: if the test program ends while one
 * still runs (an assertion longjmp'ed out of a test), an atexit handler SIGKILLs it. */

/* Like daemon_start, on the given socket path (NULL: a new private one). The path is used as
 * given, even when too long (tests of the length check). */
int daemon_start_at(struct fa_daemon *d, const char *sock, ...) __attribute__((sentinel));

/* The general form: extra is a NULL-terminated argument vector (may be NULL). */
int daemon_start_argv(struct fa_daemon *d, const char *sock, const char *const *extra);

/* Is the daemon still running (not exited, not a zombie)? Reaps it if it exited. */
bool daemon_alive(struct fa_daemon *d);

/* Wait up to timeout_ms for the daemon to exit by itself. Returns its status (as d->status), or
 * -1 if it is still running. */
int daemon_wait(struct fa_daemon *d, int timeout_ms);

/* SIGTERM, then wait up to 20 s scaled. Returns the exit code (0..255), 128 + signal, or -1 when
 * it had to be SIGKILLed after the wait. Safe to call again (returns the recorded status). */
int daemon_stop(struct fa_daemon *d);

/* SIGKILL and reap. Returns 128 + SIGKILL (or the status it had already). */
int daemon_kill(struct fa_daemon *d);

/* The daemon's log as a NUL-terminated malloc'ed string (caller frees); "" if none. */
char *daemon_log_read(const struct fa_daemon *d);

/* Does the log contain `needle` (case-sensitive)? */
bool daemon_log_contains(const struct fa_daemon *d, const char *needle);

/* After the daemon stopped: true when its log has no sanitizer report ("AddressSanitizer",
 * "LeakSanitizer", "runtime error", "ThreadSanitizer"). Prints the log to stderr otherwise. */
bool daemon_log_clean(const struct fa_daemon *d);

/* Print the log's last `max_lines` lines to stderr, prefixed "daemon| ". */
void daemon_log_dump(const struct fa_daemon *d, int max_lines);

/* Stop if running (daemon_kill), close the notify socket and remove the directory. */
void daemon_cleanup(struct fa_daemon *d);

/* The end of a test group's daemon: stop it (SIGTERM), check its log for sanitizer reports, dump
 * the log's tail when something is wrong (or FA_TEST_VERBOSE is set), clean up. Returns 0 when
 * it exited 0 with a clean log, -1 otherwise (a CMocka teardown's answer). */
int daemon_finish(struct fa_daemon *d);

/* Is a CUDA driver loadable (fa_cu_load) with at least one device? Cached. It initialises CUDA
 * in this process, which CUDA work in children forked afterwards cannot survive. */
bool have_gpu(void);

/* A small deterministic generator (xorshift64*). Seed 0 is replaced by a constant. */
uint64_t fa_rand_next(uint64_t *state);
double fa_rand_uniform(uint64_t *state); /* in [0, 1) */

/* Run one(i) for every i in [0, n), spread over FA_COMPILE_THREADS threads (default 2, at most
 * 64), each taking the next index as it finishes one: the NVRTC compile tests' pool (a compile
 * takes 0.1-5 s, so the next index is handed out under a lock). Returns when all are done. */
void fa_test_parallel_for(int n, void (*one)(int i));
int64_t fa_rand_range(uint64_t *state, int64_t lo, int64_t hi); /* in [lo, hi] */

/* Fill n values uniformly in [lo, hi): fp32, or 16-bit patterns of fp16 / bf16 (round to
 * nearest even). */
void fa_fill_f32(float *p, size_t n, uint64_t *state, float lo, float hi);
void fa_fill_f16(uint16_t *p, size_t n, uint64_t *state, float lo, float hi);
void fa_fill_bf16(uint16_t *p, size_t n, uint64_t *state, float lo, float hi);
void fa_fill_bytes(void *p, size_t n, uint64_t *state);

/* float to fp16 / bf16 bit patterns, round to nearest even (libc-only copies for the helpers). */
uint16_t fa_test_f32_to_f16(float f);
uint16_t fa_test_f32_to_bf16(float f);

/* Fill n elements with a quiet NaN of the type (fp16 0x7e00, bf16 0x7fc0, fp32 NaN), so an
 * output the daemon did not write never passes a check. */
void fa_poison_f16(uint16_t *p, size_t n);
void fa_poison_bf16(uint16_t *p, size_t n);
void fa_poison_f32(float *p, size_t n);

/* STATS text ("# section" lines and "key:value" lines): copy key's value into out (truncated to
 * cap). Returns true when the key is present. */
bool fa_stats_get(const char *text, const char *key, char *out, size_t cap);
/* The key's value as an unsigned number; returns false when absent or not a number. */
bool fa_stats_u64(const char *text, const char *key, uint64_t *out);

/* How many /dev/shm objects are named "fa.<uid>.<pid>.*" (pid 0: any pid of this uid). */
int fa_test_count_shm(pid_t pid);

/* Percentile p (0..100) of n values, sorting them in place. 0 when n is 0. */
double fa_test_percentile(double *v, size_t n, double p);

/* Write all bytes / read exactly n bytes on a file descriptor, retrying on EINTR, with a bounded
 * wait for reads (timeout_ms, -1 forever). Return 0 or -1. */
int fa_test_write_all(int fd, const void *p, size_t n);
int fa_test_read_full(int fd, void *p, size_t n, int timeout_ms);

/* Run this test program again, as `prog flag URL` (URL: d's), in a child, with d's directory
 * (0711) and socket (0666) opened to other users while it runs: for cases where a client of
 * another uid talks to d. The child is exec'd fresh (nanomsg and CUDA do not survive fork) and
 * drops to the other uid itself, first thing. Returns its exit code, or -1 when it could not start
 * or ran past timeout_ms (then it is killed). The modes go back to 0700/0600. */
int daemon_run_self_for_another_user(const struct fa_daemon *d, const char *prog, const char *flag,
                                     int timeout_ms);

/* Wait for a forked child with a bound. Returns its exit code (0..255), 128 + signal, or -1 on
 * timeout (the child is left running: kill it). */
int fa_test_waitpid(pid_t pid, int timeout_ms);

#endif /* FA_TEST_H */
