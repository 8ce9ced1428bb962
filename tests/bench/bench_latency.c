/* bench_latency.c - what a round trip through fa-daemon costs, next to the transport alone.
 *
 *   bench_latency [-n N]   (default 5000 iterations of each, after 200 warm-up ones)
 *
 * Measured, one client, one call at a time:
 *   echo/ping   a bare nanomsg REQ -> REP echo server (a forked process, same machine, same
 *               ipc:// transport) with a message the size of a PING request
 *   raw ping    the same REQ socket code sending a real PING to the daemon (no libfaclient)
 *   fa_ping     fa_ping() through libfaclient
 *   echo/attn   the echo with a message the size of the attention request below
 *   fa_attn     fa_attn_fwd() of a tiny problem: B=1, H=1 and 2, S=16, D=64, fp16
 *   ... ring    fa_ping and fa_attn again through the session's submission ring (the default
 *               client; the rows above are FA_RING=0, the socket), each against its socket row
 * Figures only (p50, p99, mean in microseconds, and each against the echo of the same size); it
 * is not a timed test and always exits 0 unless something fails outright.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "fa_integ.h"
#include "fa_proto.h"
#include "fa_raw.h"

#define WARMUP 200

struct series {
	const char *name;
	double *v;
	int n;
	double p50, p99, mean;
};

static void series_finish(struct series *s)
{
	double sum = 0;
	for (int i = 0; i < s->n; i++)
		sum += s->v[i];
	s->mean = s->n ? sum / s->n : 0;
	s->p50 = fa_test_percentile(s->v, (size_t)s->n, 50);
	s->p99 = fa_test_percentile(s->v, (size_t)s->n, 99);
}

/* The echo server: replies every message with its own bytes, until killed. */
static int echo_main(const char *url)
{
	int s = nn_socket(AF_SP, NN_REP);
	if (s < 0 || nn_bind(s, url) < 0)
		return 1;
	for (;;) {
		void *m = NULL;
		int n = nn_recv(s, &m, NN_MSG, 0);
		if (n < 0)
			continue;
		nn_send(s, &m, NN_MSG, 0); /* takes ownership of m */
	}
}

/* N round trips of `len` bytes on REQ socket s. */
static int time_echo(int s, int n, size_t len, double *out)
{
	unsigned char *msg = calloc(1, len);
	if (!msg)
		return -1;
	for (int i = -WARMUP; i < n; i++) {
		void *rep = NULL;
		uint64_t t0 = fa_test_now_us();
		if (nn_send(s, msg, len, 0) != (int)len || nn_recv(s, &rep, NN_MSG, 0) != (int)len) {
			free(msg);
			return -1;
		}
		double us = (double)(fa_test_now_us() - t0);
		nn_freemsg(rep);
		if (i >= 0)
			out[i] = us;
	}
	free(msg);
	return 0;
}

/* Encoded sizes of realistic requests (random 64-bit ids take their full 9 bytes). */
static size_t ping_size(void)
{
	struct fa_proto_req req;
	unsigned char buf[4096];
	size_t len = 0;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_PING;
	req.session = 0x8f1e2d3c4b5a6978ull;
	req.seq = 1000;
	fa_proto_encode_req(&req, buf, sizeof buf, &len);
	return len;
}

static size_t attn_size(const struct fa_case *cs)
{
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	struct fa_proto_req req;
	unsigned char buf[4096];
	size_t len = 0;
	fa_case_layout(cs, &l);
	fa_case_args(cs, &l, FA_RAW_BUF, &a);
	fa_raw_fwd_req(&a, 0x8f1e2d3c4b5a6978ull, 1000, 0xf00dcafe12345678ull, &req);
	fa_proto_encode_req(&req, buf, sizeof buf, &len);
	return len;
}

static void print_row(const struct series *s, const struct series *base, size_t bytes)
{
	printf("  %-16s %6zu B %9.1f %9.1f %9.1f", s->name, bytes, s->p50, s->p99, s->mean);
	if (base && base->p50 > 0)
		printf("   x%.2f p50  x%.2f mean", s->p50 / base->p50, s->mean / base->mean);
	printf("\n");
}

int main(int argc, char **argv)
{
	int n = 5000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n") && i + 1 < argc)
			n = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: %s [-n N]\n", argv[0]);
			return 2;
		}
	}
	if (n < 10)
		n = 10;

	struct fa_daemon d;
	if (daemon_start(&d, NULL) != 0) {
		fprintf(stderr, "bench_latency: the daemon did not start\n");
		daemon_log_dump(&d, 30);
		daemon_cleanup(&d);
		return 1;
	}
	/* The echo server, forked before this process opens any nanomsg socket. */
	char echo_url[FA_TEST_PATH_MAX + 8];
	snprintf(echo_url, sizeof echo_url, "ipc://%s/echo", d.dir);
	fflush(stdout);
	pid_t echo = fork();
	if (echo < 0)
		return 1;
	if (echo == 0)
		_exit(echo_main(echo_url));

	struct fa_case tiny[2] = {
		{.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 16, .Sk = 16, .Hq = 1, .Hkv = 1, .D = 64},
		{.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 16, .Sk = 16, .Hq = 2, .Hkv = 2, .D = 64},
	};
	size_t psize = ping_size(), asize = attn_size(&tiny[0]);
	struct series echo_ping = {"echo/ping", calloc((size_t)n, sizeof(double)), n, 0, 0, 0};
	struct series raw_ping = {"raw ping", calloc((size_t)n, sizeof(double)), n, 0, 0, 0};
	struct series fa_ping_s = {"fa_ping", calloc((size_t)n, sizeof(double)), n, 0, 0, 0};
	struct series ring_ping = {"fa_ping ring", calloc((size_t)n, sizeof(double)), n, 0, 0, 0};
	struct series echo_attn = {"echo/attn", calloc((size_t)n, sizeof(double)), n, 0, 0, 0};
	struct series attn[2] = {{"fa_attn H=1", calloc((size_t)n, sizeof(double)), n, 0, 0, 0},
	                         {"fa_attn H=2", calloc((size_t)n, sizeof(double)), n, 0, 0, 0}};
	struct series ring_attn[2] = {
	    {"fa_attn ring H=1", calloc((size_t)n, sizeof(double)), n, 0, 0, 0},
	    {"fa_attn ring H=2", calloc((size_t)n, sizeof(double)), n, 0, 0, 0}};
	int rc = 0;

	/* The echo, at both sizes. */
	int es = fa_raw_open(echo_url, 10000);
	if (es < 0 || time_echo(es, n, psize, echo_ping.v) != 0 ||
	    time_echo(es, n, asize, echo_attn.v) != 0) {
		fprintf(stderr, "bench_latency: the echo server did not answer\n");
		rc = 1;
		goto out;
	}
	nn_close(es);

	/* A raw PING to the daemon: its session from a raw HELLO on the same socket. */
	struct fa_proto_rep rep;
	int rs = fa_raw_open(d.url, 10000);
	uint64_t sid = rs >= 0 ? fa_raw_hello(rs, 1, &rep) : 0;
	if (!sid) {
		fprintf(stderr, "bench_latency: raw HELLO failed\n");
		rc = 1;
		goto out;
	}
	for (int i = -WARMUP; i < n; i++) {
		uint64_t t0 = fa_test_now_us();
		if (fa_raw_simple(rs, FA_OP_PING, sid, 10 + (uint64_t)(i + WARMUP), &rep) != FA_OK) {
			rc = 1;
			goto out;
		}
		if (i >= 0)
			raw_ping.v[i] = (double)(fa_test_now_us() - t0);
	}
	fa_raw_simple(rs, FA_OP_BYE, sid, 5, &rep);
	nn_close(rs);

	/* Through libfaclient: by the socket (FA_RING=0), then through the submission ring. */
	char text[16384], backend[32] = "?";
	for (int mode = 0; mode < 2 && rc == 0; mode++) {
	struct series *ps = mode ? &ring_ping : &fa_ping_s;
	struct series *as = mode ? ring_attn : attn;
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	if (mode == 0)
		setenv("FA_RING", "0", 1);
	fa_status ost = fa_client_open(&c, d.url);
	unsetenv("FA_RING");
	if (ost != FA_OK) {
		rc = 1;
		goto out;
	}
	for (int i = -WARMUP; i < n; i++) {
		uint64_t t0 = fa_test_now_us();
		if (fa_ping(c) != FA_OK) {
			rc = 1;
			break;
		}
		if (i >= 0)
			ps->v[i] = (double)(fa_test_now_us() - t0);
	}
	uint64_t rng = 3;
	for (int k = 0; k < 2 && rc == 0; k++) {
		struct fa_case_layout l;
		fa_attn_fwd_args a;
		char why[256];
		fa_case_layout(&tiny[k], &l);
		if (fa_integ_buffer(c, &buf, l.total) != FA_OK) {
			rc = 1;
			break;
		}
		fa_case_fill(&tiny[k], &l, fa_buffer_data(buf), &rng);
		fa_case_args(&tiny[k], &l, buf, &a);
		for (int i = -WARMUP; i < n; i++) {
			uint64_t t0 = fa_test_now_us();
			fa_status st = fa_attn_fwd(c, &a);
			double us = (double)(fa_test_now_us() - t0);
			if (st != FA_OK) {
				fprintf(stderr, "fa_attn_fwd: %s\n", fa_status_name(st));
				rc = 1;
				break;
			}
			if (i >= 0)
				as[k].v[i] = us;
		}
		if (rc == 0 && !fa_case_check(&tiny[k], &l, fa_buffer_data(buf), NULL, why, sizeof why)) {
			fprintf(stderr, "fa_attn_fwd result wrong: %s\n", why);
			rc = 1;
		}
	}
	if (fa_stats(c, text, sizeof text) == FA_OK)
		fa_stats_get(text, "backend", backend, sizeof backend);
	fa_buffer_free(buf);
	fa_client_close(c);
	}
	if (rc != 0)
		goto out;

	series_finish(&echo_ping);
	series_finish(&raw_ping);
	series_finish(&fa_ping_s);
	series_finish(&ring_ping);
	series_finish(&ring_attn[0]);
	series_finish(&ring_attn[1]);
	series_finish(&echo_attn);
	series_finish(&attn[0]);
	series_finish(&attn[1]);
	printf("round trips, one client, %d iterations each (after %d warm-up), microseconds; "
	       "backend %s\n",
	       n, WARMUP, backend);
	printf("  %-16s %8s %9s %9s %9s   vs the echo of the same size\n", "", "request", "p50",
	       "p99", "mean");
	print_row(&echo_ping, NULL, psize);
	print_row(&raw_ping, &echo_ping, psize);
	print_row(&fa_ping_s, &echo_ping, psize);
	print_row(&echo_attn, NULL, asize);
	print_row(&attn[0], &echo_attn, asize);
	print_row(&attn[1], &echo_attn, asize);
	printf("  the submission ring (each against the socket's call above):\n");
	print_row(&ring_ping, &fa_ping_s, psize);
	print_row(&ring_attn[0], &attn[0], asize);
	print_row(&ring_attn[1], &attn[1], asize);
	printf("ring: fa_ping p50 %.1f us vs socket %.1f us (x%.2f); tiny fa_attn_fwd p50 %.1f us vs "
	       "%.1f us (x%.2f), p99 %.1f vs %.1f us\n", ring_ping.p50, fa_ping_s.p50,
	       fa_ping_s.p50 > 0 ? ring_ping.p50 / fa_ping_s.p50 : 0, ring_attn[0].p50, attn[0].p50,
	       attn[0].p50 > 0 ? ring_attn[0].p50 / attn[0].p50 : 0, ring_attn[0].p99, attn[0].p99);
	printf("(the echo server is nanomsg REP; the daemon answers through its own SP transport on\n"
	       " its libuv loop: the ratio is its decode, dispatch and reply work, and that transport\n"
	       " against nanomsg's)\n");

out:
	if (echo > 0) {
		kill(echo, SIGKILL);
		fa_test_waitpid(echo, 5000);
	}
	int st = daemon_stop(&d);
	if (st != 0 || !daemon_log_clean(&d)) {
		fprintf(stderr, "bench_latency: daemon exit status %d\n", st);
		daemon_log_dump(&d, 20);
		rc = 1;
	}
	daemon_cleanup(&d);
	free(echo_ping.v);
	free(raw_ping.v);
	free(fa_ping_s.v);
	free(ring_ping.v);
	free(ring_attn[0].v);
	free(ring_attn[1].v);
	free(echo_attn.v);
	free(attn[0].v);
	free(attn[1].v);
	return rc;
}
