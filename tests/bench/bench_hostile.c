/* bench_hostile.c - the daemon under hostile clients (issue 14), figures only.
 *
 *   bench_hostile [--gpu] [-n N]      (FA_BENCH_GPU=1 is --gpu; N healthy calls per phase, 300)
 *
 * Phases, each with the daemon's resident memory (VmRSS) before, during and after:
 *   conns     an attacker process opens connections and sends only the SP handshake: how many
 *             it holds, and a healthy client's p50/p99 of a tiny attention meanwhile (run as
 *             root, the attacker is uid 65534 and tries 4,200; otherwise it holds the per-uid
 *             cap minus 16, since the healthy client shares its uid)
 *   cancel    a hostile request (stride 0, a few bytes of memory, hundreds of GFLOP on the CPU
 *             backend, ~1e5 GFLOP with --gpu) whose client is SIGKILLed once it runs: the time
 *             until the daemon stopped it (STATS inflight 0) and until its shm objects were gone
 *   drain     SIGTERM while such a request runs (--drain-timeout-ms 1000): the time to the
 *             daemon's exit, and its exit status
 *   burst     issue 14's recipe: one 1 MiB message, then 300 connections each holding a
 *             1 MiB - 1 partial body, then all closed: RSS before, at the peak and 1 s after
 * --gpu runs the daemon with --backend gpu (the hostile requests are host buffers of stride 0,
 * staged to the device: no CUDA in this process). Never a timed test: exits 0 unless something
 * fails outright.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fa_integ.h"

static bool g_gpu;
static int g_n = 300;

static void fail(const char *what)
{
	fprintf(stderr, "bench_hostile: %s\n", what);
	exit(1);
}

/* The daemon's resident memory in MiB (VmRSS of /proc/PID/status), -1 when unreadable. */
static double rss_mib(pid_t pid)
{
	char path[64], line[256];
	double kb = -1;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof line, f) != NULL)
		if (sscanf(line, "VmRSS: %lf kB", &kb) == 1)
			break;
	fclose(f);
	return kb < 0 ? -1 : kb / 1024.0;
}

/* A raw connection that has sent the SP REQ handshake; -1 when refused. */
static int raw_connect(const char *sock)
{
	static const unsigned char hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
	struct sockaddr_un a;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	memset(&a, 0, sizeof a);
	a.sun_family = AF_UNIX;
	snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    write(fd, hello, sizeof hello) != (ssize_t)sizeof hello) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Is fd still open at the daemon's end (no EOF or reset waiting)? */
static bool raw_alive(int fd)
{
	char b[16];
	ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
	return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

/* Raise the soft file limit to the hard one (the attacker needs thousands of fds). */
static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* p50 and p99 in microseconds of n tiny attention calls through a fresh client. */
static void healthy_latency(const char *url, int n, double *p50, double *p99, int *failed)
{
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 64, .Sk = 64, .Hq = 2, .Hkv = 2,
	                     .D = 64};
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	double *v = calloc((size_t)n, sizeof *v);

	*failed = 0;
	if (fa_client_open(&c, url) != FA_OK) {
		*p50 = *p99 = -1;
		*failed = n;
		free(v);
		return;
	}
	fa_client_set_timeout(c, 20000);
	fa_case_layout(&cs, &l);
	if (fa_buffer_alloc_host(c, l.total, &buf) != FA_OK)
		fail("healthy client: no buffer");
	memset(fa_buffer_data(buf), 0, l.total);
	fa_case_args(&cs, &l, buf, &a);
	int k = 0;
	for (int i = 0; i < n; i++) {
		uint64_t t0 = fa_test_now_us();
		if (fa_attn_fwd(c, &a) != FA_OK) {
			(*failed)++;
			continue;
		}
		v[k++] = (double)(fa_test_now_us() - t0);
	}
	*p50 = k ? fa_test_percentile(v, (size_t)k, 50) : -1;
	*p99 = k ? fa_test_percentile(v, (size_t)k, 99) : -1;
	fa_buffer_free(buf);
	fa_client_close(c);
	free(v);
}

/* ---- phase: connections ------------------------------------------------------------------ */

static void phase_conns(struct fa_daemon *d)
{
	int up[2], down[2];
	double p50, p99, q50, q99;
	int failed, failed2;
	bool root = geteuid() == 0;
	int want = root ? 4200 : 1024 - 16;

	healthy_latency(d->url, g_n, &p50, &p99, &failed);
	double rss0 = rss_mib(d->pid);
	if (pipe(up) != 0 || pipe(down) != 0)
		fail("pipe");
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork");
	if (pid == 0) {
		close(up[0]);
		close(down[1]);
		raise_nofile();
		if (root && setuid(65534) != 0)
			_exit(2);
		int *fds = calloc((size_t)want, sizeof *fds), held = 0;
		for (int i = 0; i < want; i++)
			if ((fds[held] = raw_connect(d->sock)) >= 0)
				held++;
		fa_test_sleep_ms(300); /* the daemon closes what is over a cap: count what stays */
		int alive = 0;
		for (int i = 0; i < held; i++)
			alive += raw_alive(fds[i]);
		fa_test_write_all(up[1], &alive, sizeof alive);
		char ch;
		fa_test_read_full(down[0], &ch, 1, 600000);
		_exit(0);
	}
	close(up[1]);
	close(down[0]);
	int alive = -1;
	if (fa_test_read_full(up[0], &alive, sizeof alive, 120000) != 0)
		fail("the attacker did not report");
	double rss1 = rss_mib(d->pid);
	healthy_latency(d->url, g_n, &q50, &q99, &failed2);
	char ch = 'x';
	fa_test_write_all(down[1], &ch, 1);
	fa_test_waitpid(pid, 30000);
	close(up[0]);
	close(down[1]);
	fa_test_sleep_ms(1000);
	double rss2 = rss_mib(d->pid);
	printf("conns: alone, healthy p50 %.0f us p99 %.0f us (%d failed)\n", p50, p99, failed);
	printf("conns: attacker%s held %d of %d connections; healthy p50 %.0f us p99 %.0f us "
	       "(%d of %d failed); rss %.1f -> %.1f -> %.1f MiB\n",
	       root ? " (uid 65534)" : " (same uid, per-uid cap)", alive, want, q50, q99, failed2,
	       g_n, rss0, rss1, rss2);
}

/* ---- phase: a hostile request -------------------------------------------------------------- */

/* The hostile request: stride 0 on the sequence, so a few KiB of memory ask for a lot of work
 * (CPU: 4*8*16384^2*64 = 550 GFLOP, under the CPU default of 1000; GPU: 4*64*65536^2*128 =
 * 1.4e5 GFLOP, under the GPU default of 1e6: 64 launches of one head, ~6 ms each on an H200). */
#define HOSTILE_SLOT 16384 /* bytes between the tensors; 4 of them in the buffer */
static void hostile_args(fa_buffer *buf, fa_attn_fwd_args *a, double *gflop)
{
	int64_t S = g_gpu ? 65536 : 16384, H = g_gpu ? 64 : 8, D = g_gpu ? 128 : 64;
	int64_t st[4] = {0, 0, D, 1};
	memset(a, 0, sizeof *a);
	a->q = fa_case_tensor(buf, 0, FA_DTYPE_BF16, 1, S, H, D, st);
	a->k = fa_case_tensor(buf, HOSTILE_SLOT, FA_DTYPE_BF16, 1, S, H, D, st);
	a->v = fa_case_tensor(buf, 2 * HOSTILE_SLOT, FA_DTYPE_BF16, 1, S, H, D, st);
	a->o = fa_case_tensor(buf, 3 * HOSTILE_SLOT, FA_DTYPE_BF16, 1, S, H, D, st);
	*gflop = 4.0 * (double)H * (double)S * (double)S * (double)D / 1e9;
}

/* A child that sends the hostile request (one byte on w first) and waits for its answer. */
static pid_t hostile_child(const char *url, double *gflop)
{
	int p[2];
	char ch = 'G';
	fa_attn_fwd_args a;
	hostile_args(NULL, &a, gflop);
	if (pipe(p) != 0)
		fail("pipe");
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		fail("fork");
	if (pid == 0) {
		fa_client *c = NULL;
		fa_buffer *buf = NULL;
		close(p[0]);
		if (fa_client_open(&c, url) != FA_OK ||
		    fa_buffer_alloc_host(c, 4 * HOSTILE_SLOT, &buf) != FA_OK)
			_exit(2);
		fa_client_set_timeout(c, 0);
		memset(fa_buffer_data(buf), 0, 4 * HOSTILE_SLOT);
		hostile_args(buf, &a, gflop);
		fa_test_write_all(p[1], &ch, 1);
		int st = fa_attn_fwd(c, &a);
		_exit(st == FA_OK ? 0 : 3);
	}
	close(p[1]);
	if (fa_test_read_full(p[0], &ch, 1, 60000) != 0)
		fail("the hostile client did not start");
	close(p[0]);
	uint64_t v;
	if (!fa_integ_wait_stat(NULL, url, "fwd_running", 1, 60000, &v))
		fail("the hostile request never ran");
	fa_test_sleep_ms(300);
	return pid;
}

static void phase_cancel(struct fa_daemon *d)
{
	double gflop, rss0 = rss_mib(d->pid);
	pid_t pid = hostile_child(d->url, &gflop);
	double rss1 = rss_mib(d->pid);
	kill(pid, SIGKILL);
	fa_test_waitpid(pid, 10000);
	uint64_t t0 = fa_test_now_us(), v;
	bool ok = fa_integ_wait_stat(NULL, d->url, "inflight", 0, 120000, &v);
	double ms = (double)(fa_test_now_us() - t0) / 1000.0;
	while (fa_test_count_shm(pid) > 0 && fa_test_now_us() - t0 < 120000000ull)
		fa_test_sleep_ms(1);
	double ms_shm = (double)(fa_test_now_us() - t0) / 1000.0;
	printf("cancel: a %.3g GFLOP stride-0 request, its client SIGKILLed: %s after %.1f ms, its "
	       "shm objects gone after %.1f ms; rss %.1f -> %.1f -> %.1f MiB\n",
	       gflop, ok ? "dropped" : "NOT dropped", ms, ms_shm, rss0, rss1, rss_mib(d->pid));
}

static void phase_drain(struct fa_daemon *d)
{
	double gflop, rss0 = rss_mib(d->pid);
	pid_t pid = hostile_child(d->url, &gflop);
	uint64_t t0 = fa_test_now_us();
	int code = daemon_stop(d);
	double ms = (double)(fa_test_now_us() - t0) / 1000.0;
	int st = fa_test_waitpid(pid, 10000);
	printf("drain: SIGTERM with a %.3g GFLOP request running: exit %d after %.1f ms (drain "
	       "deadline 1000 ms); its client ended %d; rss before %.1f MiB\n",
	       gflop, code, ms, st, rss0);
}

/* ---- phase: receive buffers ---------------------------------------------------------------- */

/* One frame header: type 1, then the length as u64 big endian. */
static void frame_header(unsigned char h[9], uint64_t len)
{
	h[0] = 1;
	for (int i = 0; i < 8; i++)
		h[1 + i] = (unsigned char)(len >> (56 - 8 * i));
}

static void phase_burst(struct fa_daemon *d)
{
	const size_t mib = (size_t)1 << 20;
	unsigned char h[9];
	unsigned char *body = calloc(1, mib);
	int fds[300], n = 0;

	raise_nofile();
	double rss0 = rss_mib(d->pid);
	/* one whole 1 MiB message (answered FA_ETOOBIG, its connection kept) */
	int fd = raw_connect(d->sock);
	if (fd < 0)
		fail("burst: connect");
	body[0] = 0x80; /* a request id with the top bit: a one-word backtrace */
	frame_header(h, mib);
	if (write(fd, h, 9) != 9 || fa_test_write_all(fd, body, mib) != 0)
		fail("burst: the 1 MiB message");
	fa_test_sleep_ms(200);
	close(fd);
	/* 300 connections, each 1 MiB - 1 of a 1 MiB body, held */
	for (int i = 0; i < 300; i++) {
		if ((fds[n] = raw_connect(d->sock)) < 0)
			continue;
		if (write(fds[n], h, 9) == 9 && fa_test_write_all(fds[n], body, mib - 1) == 0)
			n++;
		else
			close(fds[n]);
	}
	fa_test_sleep_ms(300);
	double rss1 = rss_mib(d->pid);
	char text[16384];
	uint64_t partial = 0, trims = 0;
	if (fa_integ_stats(d->url, text, sizeof text) == FA_OK)
		fa_stats_u64(text, "recv_partial_bytes", &partial);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	fa_test_sleep_ms(1000);
	double rss2 = rss_mib(d->pid);
	if (fa_integ_stats(d->url, text, sizeof text) == FA_OK)
		fa_stats_u64(text, "memory_trims", &trims);
	printf("burst: one 1 MiB message + %d connections x (1 MiB - 1) partial (%.0f MiB held, "
	       "cap 256): rss %.1f -> %.1f (peak) -> %.1f MiB 1 s after they closed "
	       "(memory_trims %llu)\n",
	       n, (double)partial / (double)mib, rss0, rss1, rss2, (unsigned long long)trims);
	free(body);
}

int main(int argc, char **argv)
{
	struct fa_daemon d;
	const char *e = getenv("FA_BENCH_GPU");

	g_gpu = e != NULL && strcmp(e, "1") == 0;
	signal(SIGPIPE, SIG_IGN); /* the daemon closes attackers' connections under their writes */
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--gpu") == 0)
			g_gpu = true;
		else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc)
			g_n = atoi(argv[++i]);
	}
	if (g_n < 10)
		g_n = 10;
	const char *backend = g_gpu ? "gpu" : "cpu";
	/* mode 0666 and a searchable directory: the attacker may be uid 65534 (run as root) */
	if (daemon_start(&d, "--backend", backend, "--drain-timeout-ms", "1000", "--socket-mode",
	                 "0666", NULL) != 0) {
		daemon_log_dump(&d, 20);
		fail("the daemon did not start");
	}
	chmod(d.dir, 0755);
	printf("bench_hostile: backend %s, daemon pid %d, %d healthy calls per phase\n", backend,
	       (int)d.pid, g_n);
	phase_conns(&d);
	phase_burst(&d);
	phase_cancel(&d);
	phase_drain(&d);
	daemon_cleanup(&d);
	return 0;
}
