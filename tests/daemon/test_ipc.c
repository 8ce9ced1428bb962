/* test_ipc.c - the daemon's SP transport in-process, against real nanomsg REQ sockets (the
 * client library's transport) and hand-written SP bytes on plain AF_UNIX sockets.
 *
 * One thread: the test drives the libuv loop itself (pump_until) while nanomsg's own worker
 * thread connects and moves its bytes, so every wait is a loop turn with a deadline and
 * callbacks only ever run inside pump_until.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <uv.h>

#include "fa_test.h"
#include "ipc.h"
#include "log.h"

#define MAX_REQS 256
#define MAX_CLOSED 256
#define WAIT_MS 5000

struct got {
	struct ipc_peer peer;
	struct ipc_hdr hdr;
	uint8_t *body;
	size_t len;
};

/* The transport under test and everything its callbacks saw. */
static struct {
	uv_loop_t loop;
	struct ipc *ipc;
	struct ipc_params p;
	char dir[64];
	char path[FA_TEST_PATH_MAX];
	char url[FA_TEST_PATH_MAX + 8];
	struct got reqs[MAX_REQS];
	unsigned nreqs;
	bool echo;                  /* answer each request at once with its own body */
	struct ipc_peer closed[MAX_CLOSED];
	unsigned nclosed;
	int closes_done;            /* ipc_close's done callbacks */
} g;

/* ---- the server side -------------------------------------------------------------------------- */

static void on_recv(void *arg, const struct ipc_peer *peer, const struct ipc_hdr *hdr,
                    const void *body, size_t len)
{
	(void)arg;
	if (g.echo) {
		assert_int_equal(ipc_reply(g.ipc, hdr, body, len), FA_OK);
		g.nreqs++;
		return;
	}
	assert_true(g.nreqs < MAX_REQS);
	struct got *r = &g.reqs[g.nreqs++];
	r->peer = *peer;
	r->hdr = *hdr;
	r->len = len;
	r->body = malloc(len + 1);
	assert_non_null(r->body);
	memcpy(r->body, body, len);
	r->body[len] = 0;
}

static void on_pipe_closed(void *arg, const struct ipc_peer *peer)
{
	(void)arg;
	assert_true(g.nclosed < MAX_CLOSED);
	g.closed[g.nclosed++] = *peer;
}

static void on_done(void *arg)
{
	(void)arg;
	g.closes_done++;
}

/* Run the loop until cond() holds or ms (scaled) pass; sleeps only in poll on the loop's fd. */
static bool pump_until(bool (*cond)(void), int ms)
{
	uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(ms);

	for (;;) {
		uv_run(&g.loop, UV_RUN_NOWAIT);
		if (cond != NULL && cond())
			return true;
		if (fa_test_now_ms() >= end)
			return cond == NULL;
		struct pollfd pfd = {.fd = uv_backend_fd(&g.loop), .events = POLLIN};
		poll(&pfd, 1, 1);
	}
}

static unsigned want_reqs, want_closed;
static bool have_reqs(void)
{
	return g.nreqs >= want_reqs;
}
static bool have_closed(void)
{
	return g.nclosed >= want_closed;
}
static bool have_done(void)
{
	return g.closes_done > 0;
}

static void wait_reqs(unsigned n)
{
	want_reqs = n;
	if (!pump_until(have_reqs, WAIT_MS))
		fail_msg("waited for %u requests, got %u", n, g.nreqs);
}

static void wait_closed(unsigned n)
{
	want_closed = n;
	if (!pump_until(have_closed, WAIT_MS))
		fail_msg("waited for %u closed connections, got %u", n, g.nclosed);
}

static void forget_reqs(void)
{
	for (unsigned i = 0; i < g.nreqs; i++)
		free(g.reqs[i].body);
	g.nreqs = 0;
}

static fa_status server_open(void)
{
	char err[256];
	fa_status st = ipc_open(&g.ipc, &g.loop, &g.p, err, sizeof err);
	if (st != FA_OK)
		fprintf(stderr, "ipc_open: %s\n", err);
	return st;
}

/* Close the transport and run the loop until it says it is done. */
static void server_close(void)
{
	if (g.ipc == NULL)
		return;
	g.closes_done = 0;
	ipc_close(g.ipc, on_done, NULL);
	g.ipc = NULL;
	assert_true(pump_until(have_done, WAIT_MS));
}

static int setup(void **state)
{
	(void)state;
	memset(&g, 0, sizeof g);
	log_level = getenv("FA_TEST_VERBOSE") ? FA_LOG_DEBUG : FA_LOG_ERR;
	if (uv_loop_init(&g.loop) != 0 || fa_test_mkdir(g.dir, sizeof g.dir) != 0)
		return -1;
	snprintf(g.path, sizeof g.path, "%s/s", g.dir);
	snprintf(g.url, sizeof g.url, "ipc://%s", g.path);
	g.p = (struct ipc_params){.path = g.path, .mode = 0660, .recv_max = 1u << 20,
	                          .on_recv = on_recv, .on_pipe_closed = on_pipe_closed};
	return server_open() == FA_OK ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	server_close();
	forget_reqs();
	pump_until(NULL, 0);
	int rc = uv_loop_close(&g.loop);
	if (rc != 0)
		fprintf(stderr, "uv_loop_close: %s\n", uv_strerror(rc));
	fa_test_rmdir(g.dir);
	return rc == 0 ? 0 : -1;
}

/* Reopen with other limits. */
static void server_reopen(void)
{
	server_close();
	assert_int_equal(server_open(), FA_OK);
}

/* ---- nanomsg REQ clients ---------------------------------------------------------------------- */

static int req_open(void)
{
	int s = nn_socket(AF_SP, NN_REQ);
	int resend = 10 * 60 * 1000; /* no re-sends inside a test */
	assert_true(s >= 0);
	assert_int_equal(nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &resend, sizeof resend), 0);
	assert_true(nn_connect(s, g.url) >= 0);
	return s;
}

static void req_send(int s, const void *buf, size_t len)
{
	/* A REQ socket takes the request at once and sends it when a connection is up. */
	assert_int_equal(nn_send(s, buf, len, NN_DONTWAIT), (int)len);
}

/* The reply on s, pumping the loop meanwhile; its length, or -1 on timeout. */
static int req_recv(int s, void *buf, size_t cap)
{
	uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(WAIT_MS);

	for (;;) {
		uv_run(&g.loop, UV_RUN_NOWAIT);
		int n = nn_recv(s, buf, cap, NN_DONTWAIT);
		if (n >= 0)
			return n;
		assert_int_equal(nn_errno(), EAGAIN);
		if (fa_test_now_ms() >= end)
			return -1;
		struct pollfd pfd = {.fd = uv_backend_fd(&g.loop), .events = POLLIN};
		poll(&pfd, 1, 1);
	}
}

static void reply_str(const struct got *r, const char *s)
{
	assert_int_equal(ipc_reply(g.ipc, &r->hdr, s, strlen(s)), FA_OK);
}

/* One request and its reply through s. */
static void round_trip(int s, const char *req, const char *rep)
{
	char buf[256];
	unsigned n0 = g.nreqs;

	req_send(s, req, strlen(req));
	wait_reqs(n0 + 1);
	assert_memory_equal(g.reqs[n0].body, req, strlen(req));
	reply_str(&g.reqs[n0], rep);
	int n = req_recv(s, buf, sizeof buf);
	assert_int_equal(n, (int)strlen(rep));
	assert_memory_equal(buf, rep, strlen(rep));
}

/* ---- hand-written SP over plain sockets ------------------------------------------------------- */

static const uint8_t sp_req[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
static const uint8_t sp_rep[8] = {0, 'S', 'P', 0, 0, 49, 0, 0};

static int raw_connect(void)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	assert_true(fd >= 0);
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g.path);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
	assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Read exactly n bytes, pumping the loop. Returns n, 0 at EOF (or reset) first, -1 on timeout. */
static ssize_t raw_read(int fd, void *p, size_t n)
{
	uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(WAIT_MS);
	size_t got = 0;

	while (got < n) {
		uv_run(&g.loop, UV_RUN_NOWAIT);
		ssize_t r = recv(fd, (char *)p + got, n - got, MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno == ECONNRESET))
			return 0;
		if (r > 0) {
			got += (size_t)r;
			continue;
		}
		assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
		if (fa_test_now_ms() >= end)
			return -1;
		struct pollfd pfd = {.fd = uv_backend_fd(&g.loop), .events = POLLIN};
		poll(&pfd, 1, 1);
	}
	return (ssize_t)n;
}

/* The server closed fd (after anything it sent first). */
static void raw_expect_eof(int fd)
{
	uint8_t b[4096];
	ssize_t r;

	while ((r = raw_read(fd, b, 1)) == 1)
		;
	assert_int_equal(r, 0);
}

/* Connect and complete the handshake as a REQ peer; checks the server's header byte for byte. */
static int raw_hello(void)
{
	uint8_t h[8];
	int fd = raw_connect();
	raw_send(fd, sp_req, sizeof sp_req);
	assert_int_equal(raw_read(fd, h, sizeof h), 8);
	assert_memory_equal(h, sp_rep, sizeof sp_rep);
	return fd;
}

static size_t put_frame(uint8_t *out, uint64_t len)
{
	out[0] = 1;
	for (int i = 0; i < 8; i++)
		out[1 + i] = (uint8_t)(len >> (56 - 8 * i));
	return 9;
}

static size_t put32(uint8_t *out, uint32_t v)
{
	out[0] = (uint8_t)(v >> 24);
	out[1] = (uint8_t)(v >> 16);
	out[2] = (uint8_t)(v >> 8);
	out[3] = (uint8_t)v;
	return 4;
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A whole request frame: backtrace words, then the body. Returns its size. */
static size_t build_req(uint8_t *out, const uint32_t *bt, int nbt, const void *body, size_t len)
{
	size_t n = put_frame(out, 4 * (size_t)nbt + len);
	for (int i = 0; i < nbt; i++)
		n += put32(out + n, bt[i]);
	memcpy(out + n, body, len);
	return n + len;
}

/* Read one reply frame into body (cap); returns the payload length (backtrace included). */
static size_t raw_read_reply(int fd, uint8_t *payload, size_t cap)
{
	uint8_t fh[9];
	assert_int_equal(raw_read(fd, fh, 9), 9);
	assert_int_equal(fh[0], 1);
	uint64_t len = 0;
	for (int i = 0; i < 8; i++)
		len = len << 8 | fh[1 + i];
	assert_true(len <= cap);
	assert_int_equal(raw_read(fd, payload, (size_t)len), (ssize_t)len);
	return (size_t)len;
}

/* ---- round trips ------------------------------------------------------------------------------ */

static void test_ipc_round_trips_requests_from_a_nanomsg_req_socket(void **state)
{
	(void)state;
	int s = req_open();

	round_trip(s, "hello", "world");
	const struct got *r = &g.reqs[0];
	assert_int_equal(r->hdr.len, 8); /* connection id + the REQ's one request id */
	assert_true(r->hdr.b[4] & 0x80);
	assert_int_equal(r->peer.uid, (uint32_t)getuid());
	assert_int_equal(r->peer.pid, (uint32_t)getpid());
	assert_int_equal(get32(r->hdr.b), r->peer.pipe);
	assert_int_equal(ipc_pipe_count(g.ipc), 1);
	for (int i = 0; i < 200; i++) {
		char q[32], a[32];
		snprintf(q, sizeof q, "q%d", i);
		snprintf(a, sizeof a, "a%d", i);
		round_trip(s, q, a);
		assert_int_equal(g.reqs[g.nreqs - 1].peer.pipe, r->peer.pipe);
	}
	assert_int_equal(ipc_sends_pending(g.ipc), 0);
	nn_close(s);
	wait_closed(1);
	assert_int_equal(g.closed[0].pipe, r->peer.pipe);
	assert_int_equal(ipc_pipe_count(g.ipc), 0);
}

/* Requests of every size up to the limit arrive whole, however the kernel splits them. */
static void test_ipc_carries_messages_up_to_the_receive_limit(void **state)
{
	(void)state;
	int s = req_open();
	size_t sizes[] = {0, 1, 4096, 65536 + 3, 300000, (1u << 20) - 4 /* + request id = limit */};
	uint64_t rng = 7;

	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		size_t n = sizes[k];
		uint8_t *buf = malloc(n + 1);
		assert_non_null(buf);
		fa_fill_bytes(buf, n, &rng);
		req_send(s, buf, n);
		wait_reqs((unsigned)k + 1);
		assert_int_equal(g.reqs[k].len, n);
		assert_memory_equal(g.reqs[k].body, buf, n);
		/* Echo it: a reply bigger than the socket buffer goes out from the queue. */
		assert_int_equal(ipc_reply(g.ipc, &g.reqs[k].hdr, buf, n), FA_OK);
		void *rep = NULL;
		uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(WAIT_MS);
		int got;
		while ((got = nn_recv(s, &rep, NN_MSG, NN_DONTWAIT)) < 0 && fa_test_now_ms() < end)
			pump_until(NULL, 1);
		assert_int_equal(got, (int)n);
		assert_memory_equal(rep, buf, n);
		nn_freemsg(rep);
		free(buf);
	}
	assert_int_equal(ipc_sends_pending(g.ipc), 0);
	nn_close(s);
}

static void test_ipc_answers_50_concurrent_req_sockets_out_of_order(void **state)
{
	(void)state;
	enum { N = 50 };
	int s[N];
	char buf[64];

	for (int i = 0; i < N; i++) {
		s[i] = req_open();
		snprintf(buf, sizeof buf, "request %d", i);
		req_send(s[i], buf, strlen(buf));
	}
	wait_reqs(N);
	assert_int_equal(ipc_pipe_count(g.ipc), N);
	/* Answer in a scrambled order; each reply names the request it answers. */
	for (int k = 0; k < N; k++) {
		const struct got *r = &g.reqs[(k * 17 + 5) % N];
		int i;
		assert_int_equal(sscanf((const char *)r->body, "request %d", &i), 1);
		snprintf(buf, sizeof buf, "reply %d", i);
		reply_str(r, buf);
	}
	for (int i = 0; i < N; i++) {
		char want[64];
		int n = req_recv(s[i], buf, sizeof buf - 1);
		assert_true(n > 0);
		buf[n] = 0;
		snprintf(want, sizeof want, "reply %d", i);
		assert_string_equal(buf, want);
	}
	/* Connection ids are distinct. */
	for (int a = 0; a < N; a++)
		for (int b = a + 1; b < N; b++)
			assert_int_not_equal(g.reqs[a].peer.pipe, g.reqs[b].peer.pipe);
	for (int i = 0; i < N; i++)
		nn_close(s[i]);
	wait_closed(N);
}

/* ---- robustness ------------------------------------------------------------------------------- */

/* nanomsg/nng#1518: with NNG 1.5.2 one connect+close before the handshake stopped the listener
 * for good. Here it only ends that connection, which is never announced. */
static void test_ipc_keeps_accepting_after_a_peer_hangs_up_before_the_handshake(void **state)
{
	(void)state;
	for (int i = 0; i < 20; i++) {
		int fd = raw_connect();
		if (i % 2)
			raw_send(fd, sp_req, 3); /* half a header */
		close(fd);
		pump_until(NULL, 2);
	}
	int s = req_open();
	round_trip(s, "still there?", "yes");
	assert_int_equal(g.nclosed, 0);
	nn_close(s);
	wait_closed(1);
	assert_int_equal(g.closed[0].pipe, g.reqs[0].peer.pipe);
}

static void test_ipc_closes_a_connection_with_a_bad_handshake(void **state)
{
	(void)state;
	static const uint8_t bad[][8] = {
		{'G', 'E', 'T', ' ', '/', ' ', 'H', 'T'}, /* not SP at all */
		{0, 'S', 'P', 1, 0, 48, 0, 0},            /* another wire version */
		{0, 'S', 'P', 0, 0, 49, 0, 0},            /* a REP peer */
		{0, 'S', 'P', 0, 0, 16, 0, 0},            /* PAIR */
		{0, 'S', 'P', 0, 0, 48, 0, 1},            /* reserved bytes set */
	};
	int s = req_open();

	round_trip(s, "before", "ok");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		uint8_t h[8];
		int fd = raw_connect();
		raw_send(fd, bad[i], 8);
		/* Our header goes out first (both sides send at once), then the close. */
		assert_int_equal(raw_read(fd, h, 8), 8);
		assert_memory_equal(h, sp_rep, 8);
		raw_expect_eof(fd);
		close(fd);
	}
	round_trip(s, "after", "ok");
	assert_int_equal(g.nclosed, 0); /* none of them was announced */
	nn_close(s);
}

static void test_ipc_closes_only_the_connection_declaring_an_oversized_message(void **state)
{
	(void)state;
	uint64_t lens[] = {(1u << 20) + 1, UINT64_C(1) << 62, UINT64_MAX};
	int s = req_open();

	round_trip(s, "first", "ok");
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		uint8_t fh[9];
		int fd = raw_hello();
		put_frame(fh, lens[i]);
		raw_send(fd, fh, sizeof fh);
		raw_send(fd, "0123456789", 10);
		raw_expect_eof(fd);
		close(fd);
		wait_closed((unsigned)i + 1); /* it was announced: reported once */
	}
	round_trip(s, "second", "ok");
	assert_int_equal(g.nreqs, 2);
	nn_close(s);
}

static void test_ipc_closes_a_connection_sending_an_unknown_message_type(void **state)
{
	(void)state;
	uint8_t fr[9 + 8];
	int fd = raw_hello();

	put_frame(fr, 8);
	fr[0] = 2; /* nanomsg's never-finished shared-memory type; nanomsg's server asserts on it */
	put32(fr + 9, 0x80000001u);
	memcpy(fr + 13, "abcd", 4);
	raw_send(fd, fr, sizeof fr);
	raw_expect_eof(fd);
	close(fd);
	wait_closed(1);
	assert_int_equal(g.nreqs, 0);
}

/* Backtraces: more hops than allowed drop the message only; a message that ends inside its
 * backtrace, or an empty one, is not from a REQ socket and closes the connection. */
static void test_ipc_checks_the_backtrace(void **state)
{
	(void)state;
	uint8_t buf[512], rep[512];
	uint32_t bt[IPC_HOPS_MAX + 1];
	int fd = raw_hello();

	/* Three hops (two devices in between): the reply carries all three words back. */
	uint32_t three[3] = {0x00000007u, 0x00000009u, 0x80000123u};
	raw_send(fd, buf, build_req(buf, three, 3, "via devices", 11));
	wait_reqs(1);
	assert_int_equal(g.reqs[0].hdr.len, 4 + 12);
	assert_string_equal((const char *)g.reqs[0].body, "via devices");
	reply_str(&g.reqs[0], "back");
	size_t n = raw_read_reply(fd, rep, sizeof rep);
	assert_int_equal(n, 12 + 4);
	for (int i = 0; i < 3; i++)
		assert_int_equal(get32(rep + 4 * i), three[i]);
	assert_memory_equal(rep + 12, "back", 4);

	/* Fifteen hops: fine. Sixteen: dropped, the connection stays. */
	for (int i = 0; i < IPC_HOPS_MAX + 1; i++)
		bt[i] = (uint32_t)i + 1;
	bt[IPC_HOPS_MAX - 1] |= 0x80000000u;
	raw_send(fd, buf, build_req(buf, bt, IPC_HOPS_MAX, "15", 2));
	wait_reqs(2);
	assert_int_equal(g.reqs[1].hdr.len, 4 + 4 * IPC_HOPS_MAX);
	bt[IPC_HOPS_MAX - 1] &= 0x7fffffffu;
	bt[IPC_HOPS_MAX] |= 0x80000000u;
	raw_send(fd, buf, build_req(buf, bt, IPC_HOPS_MAX + 1, "16", 2));
	uint32_t one = 0x80000042u;
	raw_send(fd, buf, build_req(buf, &one, 1, "next", 4));
	wait_reqs(3);
	assert_string_equal((const char *)g.reqs[2].body, "next");
	close(fd);

	/* No terminating word. */
	fd = raw_hello();
	uint32_t open_ended[2] = {1, 2};
	raw_send(fd, buf, build_req(buf, open_ended, 2, "", 0));
	raw_expect_eof(fd);
	close(fd);
	/* An empty message. */
	fd = raw_hello();
	raw_send(fd, buf, put_frame(buf, 0));
	raw_expect_eof(fd);
	close(fd);
	wait_closed(3);
	assert_int_equal(g.nreqs, 3);
}

/* Random bytes, after a valid handshake or not, in random pieces: only those connections end,
 * and a REQ client is served before, during and after. */
static void test_ipc_survives_random_bytes_on_many_connections(void **state)
{
	(void)state;
	uint64_t rng = 12345;
	uint8_t junk[2048];
	int s = req_open();

	round_trip(s, "before", "ok");
	for (int i = 0; i < 200; i++) {
		int fd = raw_connect();
		size_t n = (size_t)fa_rand_range(&rng, 0, sizeof junk);
		fa_fill_bytes(junk, n, &rng);
		if (i % 2 && n >= 8)
			memcpy(junk, sp_req, 8); /* past the handshake, into the framing */
		if (i % 4 == 1 && n >= 9)
			junk[8] = 1; /* a plausible frame type too */
		for (size_t off = 0; off < n;) {
			size_t m = (size_t)fa_rand_range(&rng, 1, 300);
			m = m < n - off ? m : n - off;
			send(fd, junk + off, m, MSG_NOSIGNAL);
			off += m;
			pump_until(NULL, 0);
		}
		close(fd);
		if (i % 50 == 0)
			round_trip(s, "during", "ok");
	}
	pump_until(NULL, 20);
	round_trip(s, "after", "ok");
	int s2 = req_open();
	round_trip(s2, "new", "ok");
	nn_close(s);
	nn_close(s2);
}

/* The stream is a byte stream: one byte per write must work as well as everything at once. */
static void test_ipc_reassembles_a_request_written_byte_by_byte(void **state)
{
	(void)state;
	uint8_t buf[256], rep[256];
	uint32_t id = 0x80abcdefu;
	int fd = raw_connect();

	memcpy(buf, sp_req, 8);
	size_t n = 8 + build_req(buf + 8, &id, 1, "byte by byte", 12);
	for (size_t i = 0; i < n; i++) {
		raw_send(fd, buf + i, 1);
		pump_until(NULL, 1); /* let the server read each byte on its own */
	}
	wait_reqs(1);
	assert_int_equal(g.reqs[0].len, 12);
	assert_string_equal((const char *)g.reqs[0].body, "byte by byte");
	assert_int_equal(get32(g.reqs[0].hdr.b + 4), id);
	reply_str(&g.reqs[0], "got it");
	assert_int_equal(raw_read(fd, rep, 8), 8);
	assert_memory_equal(rep, sp_rep, 8);
	assert_int_equal(raw_read_reply(fd, rep, sizeof rep), 4 + 6);
	assert_int_equal(get32(rep), id);
	assert_memory_equal(rep + 4, "got it", 6);
	close(fd);
}

/* A large body in uneven pieces, the frame header split too. */
static void test_ipc_reassembles_a_large_request_in_uneven_pieces(void **state)
{
	(void)state;
	size_t body = 700001, total = 9 + 4 + body;
	uint8_t *buf = malloc(total);
	uint32_t id = 0x80000005u;
	uint64_t rng = 3;
	int fd = raw_hello();

	assert_non_null(buf);
	put_frame(buf, 4 + body);
	put32(buf + 9, id);
	fa_fill_bytes(buf + 13, body, &rng);
	size_t off = 0, piece[] = {5, 7, 3, 1000, 65536, 77777, 1};
	for (int k = 0; off < total; k++) {
		size_t m = piece[k % 7] < total - off ? piece[k % 7] : total - off;
		raw_send(fd, buf + off, m);
		off += m;
		pump_until(NULL, 1);
	}
	wait_reqs(1);
	assert_int_equal(g.reqs[0].len, body);
	assert_memory_equal(g.reqs[0].body, buf + 13, body);
	free(buf);
	close(fd);
}

static void test_ipc_delivers_every_message_of_one_write(void **state)
{
	(void)state;
	uint8_t buf[256], rep[64];
	uint32_t a = 0x80000001u, b = 0x80000002u;
	int fd = raw_connect();

	/* The handshake and two requests in one write. */
	memcpy(buf, sp_req, 8);
	size_t n = 8;
	n += build_req(buf + n, &a, 1, "one", 3);
	n += build_req(buf + n, &b, 1, "two", 3);
	raw_send(fd, buf, n);
	wait_reqs(2);
	assert_string_equal((const char *)g.reqs[0].body, "one");
	assert_string_equal((const char *)g.reqs[1].body, "two");
	assert_int_equal(g.reqs[0].peer.pipe, g.reqs[1].peer.pipe);
	reply_str(&g.reqs[1], "2");
	reply_str(&g.reqs[0], "1");
	assert_int_equal(raw_read(fd, rep, 8), 8);
	assert_int_equal(raw_read_reply(fd, rep, sizeof rep), 5);
	assert_int_equal(get32(rep), b);
	assert_int_equal(rep[4], '2');
	assert_int_equal(raw_read_reply(fd, rep, sizeof rep), 5);
	assert_int_equal(get32(rep), a);
	assert_int_equal(rep[4], '1');
	close(fd);
}

static void test_ipc_drops_a_reply_to_a_connection_that_closed(void **state)
{
	(void)state;
	int s = req_open();
	req_send(s, "wait for me", 11);
	wait_reqs(1);
	nn_close(s);
	wait_closed(1);
	assert_int_equal(ipc_reply(g.ipc, &g.reqs[0].hdr, "too late", 8), FA_OK);
	assert_int_equal(ipc_sends_pending(g.ipc), 0);

	/* A header naming a connection that never existed, and ones ipc never makes. */
	struct ipc_hdr h = g.reqs[0].hdr;
	put32(h.b, 0x7fffffffu);
	assert_int_equal(ipc_reply(g.ipc, &h, "x", 1), FA_OK);
	h.len = 4;
	assert_int_equal(ipc_reply(g.ipc, &h, "x", 1), FA_EINVAL);
	h.len = IPC_HDR_MAX + 4;
	assert_int_equal(ipc_reply(g.ipc, &h, "x", 1), FA_EINVAL);
	pump_until(NULL, 20);
	assert_int_equal(g.nclosed, 1);
}

static void test_ipc_reports_the_uid_and_pid_of_another_process(void **state)
{
	(void)state;
	uint8_t buf[128];
	uint32_t id = 0x80000077u;
	size_t n = build_req(buf, &id, 1, "from the child", 14);
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		/* libc only: this process has nanomsg's threads, the child must not use them. */
		uint8_t h[8 + 9 + 4 + 2];
		int fd = socket(AF_UNIX, SOCK_STREAM, 0);
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g.path);
		if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
		    fa_test_write_all(fd, sp_req, 8) != 0 || fa_test_write_all(fd, buf, n) != 0 ||
		    fa_test_read_full(fd, h, sizeof h, 10000) != 0)
			_exit(1);
		_exit(memcmp(h, sp_rep, 8) == 0 && get32(h + 17) == id && memcmp(h + 21, "ok", 2) == 0
		              ? 0
		              : 2);
	}
	wait_reqs(1);
	assert_int_equal(g.reqs[0].peer.pid, (uint32_t)pid);
	assert_int_equal(g.reqs[0].peer.uid, (uint32_t)getuid());
	reply_str(&g.reqs[0], "ok");
	int rc = -1;
	uint64_t end = fa_test_now_ms() + (uint64_t)fa_test_ms(WAIT_MS);
	while (fa_test_now_ms() < end) {
		pump_until(NULL, 2);
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
			break;
		}
	}
	if (rc < 0)
		kill(pid, SIGKILL), waitpid(pid, NULL, 0);
	assert_int_equal(rc, 0);
	wait_closed(1);
	assert_int_equal(g.closed[0].pid, (uint32_t)pid);
}

static void test_ipc_reports_each_announced_connection_closed_once(void **state)
{
	(void)state;
	enum { N = 8 };
	int s[N], quiet[3];

	for (int i = 0; i < 3; i++)
		quiet[i] = raw_connect(); /* never complete the handshake */
	for (int i = 0; i < N; i++) {
		s[i] = req_open();
		req_send(s[i], "hi", 2);
	}
	wait_reqs(N);
	for (int i = 0; i < N; i++)
		reply_str(&g.reqs[i], "bye");
	for (int i = 0; i < N; i++) {
		char b[8];
		assert_int_equal(req_recv(s[i], b, sizeof b), 3);
		nn_close(s[i]);
	}
	for (int i = 0; i < 3; i++)
		close(quiet[i]);
	wait_closed(N);
	pump_until(NULL, 100); /* nothing more may come */
	assert_int_equal(g.nclosed, N);
	for (int i = 0; i < N; i++) {
		int seen = 0;
		for (unsigned k = 0; k < g.nclosed; k++)
			seen += g.closed[k].pipe == g.reqs[i].peer.pipe;
		assert_int_equal(seen, 1);
	}
	assert_int_equal(ipc_pipe_count(g.ipc), 0);
}

static void test_ipc_closes_a_connection_silent_past_the_handshake_deadline(void **state)
{
	(void)state;
	g.p.handshake_ms = 100;
	server_reopen();
	int silent = raw_connect();
	int partial = raw_connect();
	raw_send(partial, sp_req, 5);
	int good = raw_hello();
	uint64_t t0 = fa_test_now_ms();
	raw_expect_eof(silent);
	raw_expect_eof(partial);
	assert_true(fa_test_now_ms() - t0 < (uint64_t)fa_test_ms(2000));
	/* The one that finished its handshake stays. */
	uint8_t buf[64];
	uint32_t id = 0x80000001u;
	raw_send(good, buf, build_req(buf, &id, 1, "late", 4));
	wait_reqs(1);
	close(silent);
	close(partial);
	close(good);
	wait_closed(1);
}

/* A connection a session holds is not timed out when idle, but is for a half-sent frame; one
 * no session holds is closed after idle_ms without a message; a release starts it again. */
static void test_ipc_deadlines_follow_the_frame_and_the_sessions_holds(void **state)
{
	(void)state;
	uint8_t buf[64], fh[9];
	uint32_t id = 0x80000001u;
	struct ipc_counters n;

	g.p.idle_ms = 100;
	g.p.frame_ms = 150;
	server_reopen();
	int held = raw_hello(), idle = raw_hello();
	raw_send(held, buf, build_req(buf, &id, 1, "hi", 2));
	wait_reqs(1);
	ipc_pipe_hold(g.ipc, g.reqs[0].peer.pipe);
	uint64_t t0 = fa_test_now_ms();
	raw_expect_eof(idle);
	assert_true(fa_test_now_ms() - t0 >= 80);
	pump_until(NULL, 300); /* three idle deadlines: the held one must stay */
	ipc_counters(g.ipc, &n);
	assert_int_equal(n.closed_idle, 1);
	assert_int_equal(n.conns, 1);
	memset(buf, 0, sizeof buf);
	raw_send(held, fh, put_frame(fh, 40));
	raw_send(held, buf, 10);
	t0 = fa_test_now_ms();
	raw_expect_eof(held);
	assert_true(fa_test_now_ms() - t0 >= 120);
	ipc_counters(g.ipc, &n);
	assert_int_equal(n.closed_frame, 1);
	close(held);
	close(idle);
	wait_closed(2);

	/* Released: idle again, closed. */
	forget_reqs();
	int c = raw_hello();
	raw_send(c, buf, build_req(buf, &id, 1, "hi", 2));
	wait_reqs(1);
	ipc_pipe_hold(g.ipc, g.reqs[0].peer.pipe);
	pump_until(NULL, 200);
	ipc_pipe_release(g.ipc, g.reqs[0].peer.pipe);
	raw_expect_eof(c);
	ipc_counters(g.ipc, &n);
	assert_int_equal(n.closed_idle, 2);
	close(c);
	wait_closed(3);
}

/* One uid at max_conns_per_uid is refused at accept. The test's uid is the transport's own, so
 * the reserve (max_conns - reserved_conns = 2 for others) does not stop it. */
static void test_ipc_caps_connections_per_uid(void **state)
{
	(void)state;
	int fd[3];
	struct ipc_counters n;

	g.p.max_conns = 8;
	g.p.max_conns_per_uid = 3;
	g.p.reserved_conns = 6;
	server_reopen();
	for (int i = 0; i < 3; i++)
		fd[i] = raw_hello();
	int extra = raw_connect();
	raw_expect_eof(extra);
	close(extra);
	ipc_counters(g.ipc, &n);
	assert_int_equal(n.refused_uid, 1);
	assert_int_equal(n.uid_top_conns, 3);
	assert_int_equal(n.uid_top, geteuid());
	assert_int_equal(n.uids, 1);
	for (int i = 0; i < 3; i++)
		close(fd[i]);
	wait_closed(3);
}

static void test_ipc_refuses_connections_beyond_the_limit(void **state)
{
	(void)state;
	int fd[4];
	uint8_t h[8];

	g.p.max_conns = 4;
	server_reopen();
	for (int i = 0; i < 4; i++)
		fd[i] = raw_hello();
	int extra = raw_connect();
	raw_expect_eof(extra); /* closed without a word */
	close(extra);
	close(fd[0]);
	wait_closed(1);
	int again = raw_connect();
	raw_send(again, sp_req, 8);
	assert_int_equal(raw_read(again, h, 8), 8);
	assert_memory_equal(h, sp_rep, 8);
	close(again);
	for (int i = 1; i < 4; i++)
		close(fd[i]);
	wait_closed(5);
}

/* A peer that sends requests and never reads: its replies pile up to send_max, then it is
 * closed; the daemon keeps nothing of it. */
static void test_ipc_closes_a_peer_that_does_not_read_its_replies(void **state)
{
	(void)state;
	static uint8_t big[64 * 1024];
	uint8_t buf[64];
	uint32_t id = 0x80000001u;

	g.p.send_max = 256 * 1024;
	server_reopen();
	int fd = raw_hello();
	int rcv = 4096;
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
	raw_send(fd, buf, build_req(buf, &id, 1, "flood me", 8));
	wait_reqs(1);
	int i;
	for (i = 0; i < 4000 && g.nclosed == 0; i++) {
		assert_int_equal(ipc_reply(g.ipc, &g.reqs[0].hdr, big, sizeof big), FA_OK);
		pump_until(NULL, 0);
	}
	wait_closed(1);
	pump_until(NULL, 10);
	assert_int_equal(ipc_sends_pending(g.ipc), 0);
	fprintf(stderr, "closed after %d replies of %zu bytes\n", i, sizeof big);
	close(fd);
}

/* nanomsg behaviour the daemon relies on: a REQ socket whose connection drops reconnects and
 * sends the same request again (same request id), here to a new transport on the same path. */
static void test_ipc_req_resends_its_request_after_the_server_reopens(void **state)
{
	(void)state;
	char buf[32];
	int s = req_open();

	req_send(s, "survive", 7);
	wait_reqs(1);
	server_reopen();
	wait_reqs(2);
	assert_string_equal((const char *)g.reqs[1].body, "survive");
	assert_memory_equal(g.reqs[1].hdr.b + 4, g.reqs[0].hdr.b + 4, 4);
	assert_int_not_equal(g.reqs[1].peer.pipe, g.reqs[0].peer.pipe);
	assert_int_equal(g.nclosed, 0); /* ipc_close reports nothing */
	/* The old header leads nowhere; the new one reaches the client. */
	reply_str(&g.reqs[1], "made it");
	assert_int_equal(ipc_reply(g.ipc, &g.reqs[0].hdr, "stale", 5), FA_OK);
	int n = req_recv(s, buf, sizeof buf);
	assert_int_equal(n, 7);
	assert_memory_equal(buf, "made it", 7);
	nn_close(s);
}

/* ---- the socket file -------------------------------------------------------------------------- */

static void test_ipc_open_sets_the_mode_and_close_removes_only_its_own_file(void **state)
{
	(void)state;
	struct stat st;

	assert_int_equal(lstat(g.path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0660);
	server_close();
	assert_int_equal(lstat(g.path, &st), -1);
	assert_int_equal(errno, ENOENT);

	/* A file put in our socket's place is someone else's: closing leaves it. */
	assert_int_equal(server_open(), FA_OK);
	assert_int_equal(unlink(g.path), 0);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g.path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	server_close();
	assert_int_equal(lstat(g.path, &st), 0);
	close(fd);
	unlink(g.path);
}

static void test_ipc_open_refuses_a_live_socket_and_the_probe_harms_nothing(void **state)
{
	(void)state;
	struct ipc *other;
	char err[256];
	int s = req_open();

	round_trip(s, "one", "1");
	assert_int_equal(ipc_open(&other, &g.loop, &g.p, err, sizeof err), FA_EUNAVAIL);
	assert_non_null(strstr(err, "live"));
	/* The probe connected and hung up: the live one still accepts. */
	int s2 = req_open();
	round_trip(s2, "two", "2");
	round_trip(s, "three", "3");
	nn_close(s);
	nn_close(s2);
}

static void test_ipc_open_replaces_a_stale_socket_and_refuses_other_files(void **state)
{
	(void)state;
	struct ipc *x;
	char err[256], p[FA_TEST_PATH_MAX + 16];
	struct ipc_params q = g.p;

	server_close();
	/* A socket file nobody listens on: bound, never listening. */
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", g.path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);
	assert_int_equal(server_open(), FA_OK);
	int s = req_open();
	round_trip(s, "fresh", "yes");
	nn_close(s);

	/* A regular file is never replaced. */
	snprintf(p, sizeof p, "%s/file", g.dir);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fclose(f);
	q.path = p;
	assert_int_equal(ipc_open(&x, &g.loop, &q, err, sizeof err), FA_EINVAL);
	unlink(p);

	/* 108 bytes and more: refused before anything is touched. */
	memset(p, 'a', sizeof p);
	p[0] = '/';
	p[108] = 0;
	assert_int_equal(ipc_open(&x, &g.loop, &q, err, sizeof err), FA_EINVAL);

	/* A missing parent directory is made. */
	snprintf(p, sizeof p, "%s/sub/s", g.dir);
	assert_int_equal(ipc_open(&x, &g.loop, &q, err, sizeof err), FA_OK);
	g.closes_done = 0;
	ipc_close(x, on_done, NULL);
	assert_true(pump_until(have_done, WAIT_MS));
	snprintf(p, sizeof p, "%s/sub", g.dir);
	rmdir(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
		T(test_ipc_round_trips_requests_from_a_nanomsg_req_socket),
		T(test_ipc_carries_messages_up_to_the_receive_limit),
		T(test_ipc_answers_50_concurrent_req_sockets_out_of_order),
		T(test_ipc_keeps_accepting_after_a_peer_hangs_up_before_the_handshake),
		T(test_ipc_closes_a_connection_with_a_bad_handshake),
		T(test_ipc_closes_only_the_connection_declaring_an_oversized_message),
		T(test_ipc_closes_a_connection_sending_an_unknown_message_type),
		T(test_ipc_checks_the_backtrace),
		T(test_ipc_survives_random_bytes_on_many_connections),
		T(test_ipc_reassembles_a_request_written_byte_by_byte),
		T(test_ipc_reassembles_a_large_request_in_uneven_pieces),
		T(test_ipc_delivers_every_message_of_one_write),
		T(test_ipc_drops_a_reply_to_a_connection_that_closed),
		T(test_ipc_reports_the_uid_and_pid_of_another_process),
		T(test_ipc_reports_each_announced_connection_closed_once),
		T(test_ipc_closes_a_connection_silent_past_the_handshake_deadline),
		T(test_ipc_refuses_connections_beyond_the_limit),
		T(test_ipc_deadlines_follow_the_frame_and_the_sessions_holds),
		T(test_ipc_caps_connections_per_uid),
		T(test_ipc_closes_a_peer_that_does_not_read_its_replies),
		T(test_ipc_req_resends_its_request_after_the_server_reopens),
		T(test_ipc_open_sets_the_mode_and_close_removes_only_its_own_file),
		T(test_ipc_open_refuses_a_live_socket_and_the_probe_harms_nothing),
		T(test_ipc_open_replaces_a_stale_socket_and_refuses_other_files),
#undef T
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
