/* test_server.c - the whole daemon in this process, its loop on a thread, spoken to over real
 * ipc:// sockets by nanomsg REQ clients (the client library's transport): sessions, regions,
 * attention against the CPU reference, dedupe, malformed input, limits, a client shrinking its
 * memory, connection drops and the graceful shutdown. (tests/integ does the same with real
 * client processes and libfaclient.) */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "dtest.h"
#include "fa_attn.h"
#include "fa_proto.h"
#include "fa_test.h"
#include "log.h"
#include "server.h"

#define CLIENT_TIMEOUT_MS 20000

/* ---- the daemon on a thread ---------------------------------------------------------------- */

struct harness {
	char dir[64];
	struct config cfg;
	uv_loop_t loop;
	struct server srv;
	uv_async_t stop;
	pthread_t thread;
	bool running;
	int loop_close_rc;
};

static void *harness_run(void *arg)
{
	struct harness *h = arg;
	uv_run(&h->loop, UV_RUN_DEFAULT);
	return NULL;
}

static void harness_stop_closed(uv_handle_t *hd)
{
	(void)hd;
}

static void harness_server_closed(void *arg)
{
	struct harness *h = arg;
	uv_close((uv_handle_t *)&h->stop, harness_stop_closed);
}

/* On the loop: what SIGTERM does in fa-daemon. */
static void harness_stop_cb(uv_async_t *a)
{
	struct harness *h = a->data;
	server_shutdown(&h->srv, harness_server_closed, h);
}

/* Start a daemon with the given overrides (NULL-terminated name, value pairs). */
static struct harness *harness_start(const char *first, ...)
{
	struct harness *h = calloc(1, sizeof(*h));
	char err[512], path[128];
	va_list ap;

	assert_non_null(h);
	assert_int_equal(fa_test_mkdir(h->dir, sizeof h->dir), 0);
	config_defaults(&h->cfg);
	snprintf(path, sizeof path, "%s/s", h->dir);
	assert_int_equal(config_set(&h->cfg, "socket", path, "test", err, sizeof err), FA_OK);
	assert_int_equal(config_set(&h->cfg, "threads", "2", "test", err, sizeof err), FA_OK);
	va_start(ap, first);
	for (const char *name = first; name != NULL; name = va_arg(ap, const char *)) {
		const char *value = va_arg(ap, const char *);
		if (config_set(&h->cfg, name, value, "test", err, sizeof err) != FA_OK)
			fail_msg("%s", err);
	}
	va_end(ap);
	config_finish(&h->cfg);
	assert_int_equal(uv_loop_init(&h->loop), 0);
	if (server_open(&h->srv, &h->loop, &h->cfg, err, sizeof err) != FA_OK)
		fail_msg("server_open: %s", err);
	assert_int_equal(uv_async_init(&h->loop, &h->stop, harness_stop_cb), 0);
	h->stop.data = h;
	assert_int_equal(pthread_create(&h->thread, NULL, harness_run, h), 0);
	h->running = true;
	return h;
}

/* Graceful stop; returns when the loop has ended. */
static void harness_stop(struct harness *h)
{
	if (h->running) {
		uv_async_send(&h->stop);
		pthread_join(h->thread, NULL);
		h->running = false;
		h->loop_close_rc = uv_loop_close(&h->loop);
	}
}

static void harness_free(struct harness *h)
{
	harness_stop(h);
	assert_int_equal(h->loop_close_rc, 0); /* every handle closed */
	fa_test_rmdir(h->dir);
	free(h);
}

/* ---- clients ------------------------------------------------------------------------------- */

static int client_open(struct harness *h)
{
	int s, ms = fa_test_ms(CLIENT_TIMEOUT_MS);
	char url[160];

	snprintf(url, sizeof url, "ipc://%s", h->cfg.socket);
	assert_true((s = nn_socket(AF_SP, NN_REQ)) >= 0);
	assert_int_equal(nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &ms, sizeof ms), 0);
	assert_int_equal(nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &ms, sizeof ms), 0);
	assert_true(nn_connect(s, url) >= 0);
	return s;
}

static void client_send_raw(int s, const void *buf, size_t len)
{
	if (nn_send(s, buf, len, 0) != (int)len)
		fail_msg("nn_send: %s", nn_strerror(nn_errno()));
}

static void client_send(int s, const struct fa_proto_req *req)
{
	uint8_t buf[FA_PROTO_MAX_MSG];
	size_t len;

	assert_int_equal(fa_proto_encode_req(req, buf, sizeof buf, &len), FA_OK);
	client_send_raw(s, buf, len);
}

/* Receive and decode a reply (decoded into heap memory: the struct is 16 KiB). */
static struct fa_proto_rep *client_recv(int s)
{
	struct fa_proto_rep *rep = calloc(1, sizeof(*rep));
	char err[256];
	void *buf = NULL;

	int len = nn_recv(s, &buf, NN_MSG, 0);
	if (len < 0)
		fail_msg("nn_recv: %s", nn_strerror(nn_errno()));
	if (fa_proto_decode_rep(buf, (size_t)len, rep, err, sizeof err) != FA_OK)
		fail_msg("bad reply: %s", err);
	nn_freemsg(buf);
	return rep;
}

static struct fa_proto_rep *call(int s, const struct fa_proto_req *req)
{
	client_send(s, req);
	struct fa_proto_rep *rep = client_recv(s);
	assert_int_equal(rep->op, req->op);
	assert_true(rep->seq == req->seq);
	return rep;
}

static void expect_status(struct fa_proto_rep *rep, fa_status want, const char *needle)
{
	if (rep->status != (int32_t)want)
		fail_msg("status %s, want %s (detail: %s)", fa_status_name((fa_status)rep->status),
		         fa_status_name(want), rep->detail);
	if (needle != NULL && strstr(rep->detail, needle) == NULL)
		fail_msg("detail '%s' does not mention '%s'", rep->detail, needle);
}

static uint64_t seq_next = 1;

static uint64_t hello(int s)
{
	struct fa_proto_req req = {.op = FA_OP_HELLO, .seq = seq_next++};
	req.u.hello.pid = (uint32_t)getpid();
	snprintf(req.u.hello.name, sizeof req.u.hello.name, "test_server");
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, FA_OK, NULL);
	uint64_t sid = rep->u.hello.session;
	assert_true(sid != 0);
	free(rep);
	return sid;
}

static struct fa_proto_req simple(uint32_t op, uint64_t sid)
{
	struct fa_proto_req req = {.op = op, .seq = seq_next++, .session = sid};
	return req;
}

static uint64_t stat_u64(int s, uint64_t sid, const char *key)
{
	struct fa_proto_req req = simple(FA_OP_STATS, sid);
	struct fa_proto_rep *rep = call(s, &req);
	uint64_t v = 0;

	expect_status(rep, FA_OK, NULL);
	if (!fa_stats_u64(rep->u.stats.text, key, &v))
		fail_msg("STATS has no '%s':\n%s", key, rep->u.stats.text);
	free(rep);
	return v;
}

static uint64_t register_shm(int s, uint64_t sid, const char *name, uint64_t size,
                             fa_status want)
{
	struct fa_proto_req req = simple(FA_OP_REGISTER, sid);
	req.u.reg.kind = FA_REGION_HOST_SHM;
	req.u.reg.size = size;
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "%s", name);
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, want, NULL);
	uint64_t id = rep->u.reg.region;
	free(rep);
	return id;
}

/* A client buffer: a shm object mapped here too. */
struct buf {
	char name[FA_PROTO_SHM_NAME_MAX];
	void *p;
	size_t size;
	uint64_t rid;
};

static void buf_alloc(struct buf *b, int s, uint64_t sid, size_t size)
{
	b->size = size;
	assert_int_equal(dtest_shm_create(b->name, size), 0);
	int fd = shm_open(b->name, O_RDWR, 0);
	assert_true(fd >= 0);
	b->p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	assert_true(b->p != MAP_FAILED);
	b->rid = register_shm(s, sid, b->name, size, FA_OK);
}

static void buf_free(struct buf *b)
{
	munmap(b->p, b->size);
	shm_unlink(b->name);
}

static void tensor(struct fa_proto_tensor *t, const struct buf *b, uint64_t off, fa_dtype dt,
                   int64_t B, int64_t S, int64_t H, int64_t D)
{
	t->region = b->rid;
	t->offset = off;
	t->dtype = (uint8_t)dt;
	int64_t sh[4] = {B, S, H, D}, st[4] = {S * H * D, H * D, D, 1};
	memcpy(t->shape, sh, sizeof sh);
	memcpy(t->stride, st, sizeof st);
}

/* An ATTN_FWD over one buffer: q, k, v, o (and lse) packed one after another, bf16 or fp32. */
struct fwd_case {
	int64_t B, Sq, Sk, Hq, Hkv, D;
	fa_dtype dt;
	fa_mask mask;
	uint64_t q, k, v, o, lse, end;
};

static struct fwd_case fwd_layout(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv,
                                  int64_t D, fa_dtype dt, fa_mask mask)
{
	struct fwd_case c = {B, Sq, Sk, Hq, Hkv, D, dt, mask, 0, 0, 0, 0, 0, 0};
	size_t e = fa_dtype_size(dt);
	uint64_t qb = (uint64_t)(B * Sq * Hq * D) * e, kb = (uint64_t)(B * Sk * Hkv * D) * e;
	c.q = 0;
	c.k = c.q + qb;
	c.v = c.k + kb;
	c.o = c.v + kb;
	c.lse = c.o + qb;
	c.end = c.lse + (uint64_t)(B * Hq * Sq) * 4;
	return c;
}

static struct fa_proto_req fwd_req(uint64_t sid, const struct buf *b, const struct fwd_case *c)
{
	struct fa_proto_req req = simple(FA_OP_ATTN_FWD, sid);
	tensor(&req.u.fwd.q, b, c->q, c->dt, c->B, c->Sq, c->Hq, c->D);
	tensor(&req.u.fwd.k, b, c->k, c->dt, c->B, c->Sk, c->Hkv, c->D);
	tensor(&req.u.fwd.v, b, c->v, c->dt, c->B, c->Sk, c->Hkv, c->D);
	tensor(&req.u.fwd.o, b, c->o, c->dt, c->B, c->Sq, c->Hq, c->D);
	tensor(&req.u.fwd.lse, b, c->lse, FA_DTYPE_FP32, c->B, c->Hq, c->Sq, 1);
	req.u.fwd.mask = (uint8_t)c->mask;
	return req;
}

static void fill_inputs(const struct buf *b, const struct fwd_case *c, uint64_t seed)
{
	uint64_t st = seed;
	size_t n = (size_t)(c->o - c->q) / fa_dtype_size(c->dt);
	if (c->dt == FA_DTYPE_FP32)
		fa_fill_f32((float *)((char *)b->p + c->q), n, &st, -1, 1);
	else
		fa_fill_bf16((uint16_t *)((char *)b->p + c->q), n, &st, -1, 1);
}

/* A request big enough to keep one worker busy for a while (one (batch, head) pair, so one
 * chunk). */
static struct fwd_case slow_case(void)
{
	return fwd_layout(1, 2048, 2048, 1, 1, 128, FA_DTYPE_FP32, FA_MASK_NONE);
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_server_hello_ping_stats(void **state)
{
	struct harness *h = harness_start(NULL);
	int s = client_open(h);
	(void)state;

	struct fa_proto_req req = {.op = FA_OP_HELLO, .seq = seq_next++};
	req.u.hello.pid = (uint32_t)getpid();
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, FA_OK, NULL);
	uint64_t sid = rep->u.hello.session, epoch = rep->epoch;
	assert_int_equal(rep->u.hello.backend, FA_BACKEND_CPU);
	assert_int_equal(rep->u.hello.max_inflight, 64);
	assert_int_equal(rep->u.hello.max_regions, 256);
	assert_int_equal(rep->u.hello.max_msg, FA_PROTO_MAX_MSG);
	assert_true(epoch != 0);
	free(rep);

	req = simple(FA_OP_PING, sid);
	rep = call(s, &req);
	expect_status(rep, FA_OK, NULL);
	assert_true(rep->epoch == epoch); /* in every reply */
	free(rep);

	req = simple(FA_OP_STATS, sid);
	rep = call(s, &req);
	expect_status(rep, FA_OK, NULL);
	static const char *const keys[] = {
		"version", "proto", "epoch", "pid", "uptime_s", "backend", "threads", "sessions",
		"sessions_total", "regions", "region_bytes", "requests_total", "requests_ok",
		"requests_failed", "requests_busy", "requests_deduped", "requests_malformed",
		"inflight", "fwd_total", "fwd_compute_us_total"};
	char v[64], ep[32];
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!fa_stats_get(rep->u.stats.text, keys[i], v, sizeof v))
			fail_msg("STATS lacks '%s':\n%s", keys[i], rep->u.stats.text);
	assert_non_null(strstr(rep->u.stats.text, "# server\n"));
	assert_non_null(strstr(rep->u.stats.text, "# clients\n"));
	assert_non_null(strstr(rep->u.stats.text, "# requests\n"));
	fa_stats_get(rep->u.stats.text, "backend", v, sizeof v);
	assert_string_equal(v, "cpu");
	fa_stats_get(rep->u.stats.text, "epoch", v, sizeof v);
	snprintf(ep, sizeof ep, "%016" PRIx64, epoch);
	assert_string_equal(v, ep);
	free(rep);
	assert_true(stat_u64(s, sid, "sessions") == 1);
	assert_true(stat_u64(s, sid, "requests_ok") == 4); /* HELLO, PING, STATS, STATS */
	assert_true(stat_u64(s, sid, "threads") == 2);

	nn_close(s);
	harness_free(h);
}

static void test_server_attention_matches_the_reference(void **state)
{
	struct harness *h = harness_start(NULL);
	int s = client_open(h);
	uint64_t sid = hello(s);
	struct buf b;
	(void)state;

	static const struct {
		int64_t B, Sq, Sk, Hq, Hkv, D;
		fa_dtype dt;
		fa_mask mask;
	} cases[] = {
		{1, 16, 16, 2, 2, 64, FA_DTYPE_FP32, FA_MASK_NONE},
		{2, 33, 70, 8, 2, 32, FA_DTYPE_BF16, FA_MASK_CAUSAL_BOTTOM_RIGHT},
		{1, 50, 20, 4, 1, 128, FA_DTYPE_FP32, FA_MASK_CAUSAL_TOP_LEFT},
	};
	buf_alloc(&b, s, sid, 4 << 20);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct fwd_case c = fwd_layout(cases[i].B, cases[i].Sq, cases[i].Sk, cases[i].Hq,
		                               cases[i].Hkv, cases[i].D, cases[i].dt, cases[i].mask);
		assert_true(c.end <= b.size);
		fill_inputs(&b, &c, 1234 + i);
		struct fa_proto_req req = fwd_req(sid, &b, &c);
		struct fa_proto_rep *rep = call(s, &req);
		expect_status(rep, FA_OK, NULL);
		assert_true(rep->u.fwd.compute_ns > 0);
		free(rep);

		/* The same reference in this process must give the same bits (the daemon only
		 * splits the (batch, head) pairs across threads). */
		struct fa_attn_fwd_desc d = {
			.dtype = c.dt, .precision = FA_PREC_3XTF32, .mask = c.mask,
			.scale = 1.0 / sqrt((double)c.D), .B = c.B, .Sq = c.Sq, .Sk = c.Sk,
			.Hq = c.Hq, .Hkv = c.Hkv, .D = c.D,
			.q_stride = {c.Sq * c.Hq * c.D, c.Hq * c.D, c.D},
			.k_stride = {c.Sk * c.Hkv * c.D, c.Hkv * c.D, c.D},
			.v_stride = {c.Sk * c.Hkv * c.D, c.Hkv * c.D, c.D},
			.o_stride = {c.Sq * c.Hq * c.D, c.Hq * c.D, c.D},
			.lse_stride = {c.Hq * c.Sq, c.Sq, 1},
		};
		size_t ob = (size_t)(c.lse - c.o), lb = (size_t)(c.end - c.lse);
		void *o = malloc(ob);
		float *lse = malloc(lb);
		char *base = b.p;
		assert_int_equal(fa_attn_fwd_ref(&d, base + c.q, base + c.k, base + c.v, o, lse, 0,
		                                 c.B * c.Hq),
		                 FA_OK);
		assert_memory_equal(o, base + c.o, ob);
		assert_memory_equal(lse, base + c.lse, lb);
		free(o);
		free(lse);
	}
	assert_true(stat_u64(s, sid, "fwd_total") == 3);
	assert_true(stat_u64(s, sid, "regions") == 1);
	assert_true(stat_u64(s, sid, "region_bytes") == 4 << 20);

	struct fa_proto_req req = simple(FA_OP_UNREGISTER, sid);
	req.u.unreg.region = b.rid;
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, FA_OK, NULL);
	free(rep);
	assert_true(stat_u64(s, sid, "regions") == 0);
	assert_true(dtest_shm_exists(b.name)); /* unregistering leaves the object to its owner */
	buf_free(&b);
	nn_close(s);
	harness_free(h);
}

static void test_server_validation_errors_come_back_with_detail(void **state)
{
	struct harness *h = harness_start(NULL);
	int s = client_open(h);
	uint64_t sid = hello(s);
	struct buf b;
	(void)state;

	buf_alloc(&b, s, sid, 65536);
	struct fwd_case c = fwd_layout(1, 8, 8, 2, 2, 16, FA_DTYPE_BF16, FA_MASK_NONE);
	struct fa_proto_req req = fwd_req(sid, &b, &c);
	req.u.fwd.o.offset = 65536 - 16;
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, FA_ERANGE, "o: extent ends at byte");
	free(rep);
	req = fwd_req(sid, &b, &c);
	req.u.fwd.o.offset = c.q;
	rep = call(s, &req);
	expect_status(rep, FA_EOVERLAP, "o overlaps q");
	free(rep);
	req = fwd_req(sid, &b, &c);
	req.u.fwd.v.region ^= 1;
	rep = call(s, &req);
	expect_status(rep, FA_EREGION, "v: region");
	free(rep);
	assert_true(stat_u64(s, sid, "requests_failed") == 3);
	assert_true(stat_u64(s, sid, "fwd_total") == 0);

	/* CUDA IPC memory needs the GPU backend. */
	req = simple(FA_OP_REGISTER, sid);
	req.u.reg.kind = FA_REGION_CUDA_IPC;
	req.u.reg.size = 4096;
	rep = call(s, &req);
	expect_status(rep, FA_ENOTSUP, "CUDA IPC regions need the gpu backend");
	free(rep);
	/* Registration checks reach the client too. */
	register_shm(s, sid, "/fa.1.1.zzzzzzzzzzzzzzzz", 4096, FA_EINVAL);
	register_shm(s, sid, b.name, 1 << 20, FA_ERANGE);
	buf_free(&b);
	nn_close(s);
	harness_free(h);
}

static void test_server_duplicate_seq_is_answered_from_the_cache(void **state)
{
	struct harness *h = harness_start(NULL);
	int s = client_open(h);
	uint64_t sid = hello(s);
	struct buf b;
	(void)state;

	buf_alloc(&b, s, sid, 1 << 20);
	struct fwd_case c = fwd_layout(1, 32, 32, 2, 1, 64, FA_DTYPE_BF16, FA_MASK_NONE);
	fill_inputs(&b, &c, 7);
	struct fa_proto_req req = fwd_req(sid, &b, &c);
	struct fa_proto_rep *a = call(s, &req);
	expect_status(a, FA_OK, NULL);
	/* The REQ socket resent it (reconnect or 60 s timer): same session, same seq. */
	struct fa_proto_rep *r2 = call(s, &req);
	expect_status(r2, FA_OK, NULL);
	assert_true(a->u.fwd.compute_ns == r2->u.fwd.compute_ns); /* the very same reply */
	free(a);
	free(r2);
	assert_true(stat_u64(s, sid, "fwd_total") == 1); /* computed once */
	assert_true(stat_u64(s, sid, "requests_deduped") == 1);

	/* A seq reused for another op is a client bug. */
	struct fa_proto_req ping = simple(FA_OP_PING, sid);
	ping.seq = req.seq;
	struct fa_proto_rep *rep = call(s, &ping);
	expect_status(rep, FA_EPROTO, "already used by another op");
	free(rep);
	buf_free(&b);
	nn_close(s);
	harness_free(h);
}

static void test_server_repeat_while_running_is_answered_on_the_newest_connection(void **state)
{
	struct harness *h = harness_start("threads", "1", NULL);
	int first = client_open(h), again = client_open(h), w = client_open(h);
	uint64_t sid = hello(first);
	struct buf b;
	(void)state;

	struct fwd_case c = slow_case();
	buf_alloc(&b, first, sid, (size_t)c.end);
	fill_inputs(&b, &c, 11);
	struct fa_proto_req req = fwd_req(sid, &b, &c);
	client_send(first, &req);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (stat_u64(w, sid, "fwd_running") != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	/* What nanomsg's REQ does after a reconnect: the same request on a new connection. */
	client_send(again, &req);
	struct fa_proto_rep *rep = client_recv(again);
	expect_status(rep, FA_OK, NULL);
	assert_true(stat_u64(w, sid, "requests_deduped") == 1);
	assert_true(stat_u64(w, sid, "fwd_total") == 1); /* computed once */
	/* The first copy's connection got nothing (its client gave up on it) -- unless the
	 * computation was over before the copy arrived (a very slow machine), when both carry
	 * the same cached reply. */
	void *buf = NULL;
	int ms = 100;
	assert_int_equal(nn_setsockopt(first, NN_SOL_SOCKET, NN_RCVTIMEO, &ms, sizeof ms), 0);
	int len = nn_recv(first, &buf, NN_MSG, 0);
	if (len >= 0) {
		struct fa_proto_rep *r1 = calloc(1, sizeof(*r1));
		char err[256];
		assert_int_equal(fa_proto_decode_rep(buf, (size_t)len, r1, err, sizeof err), FA_OK);
		assert_true(r1->u.fwd.compute_ns == rep->u.fwd.compute_ns);
		print_message("note: the repeat arrived after the computation ended\n");
		nn_freemsg(buf);
		free(r1);
	} else {
		assert_int_equal(nn_errno(), ETIMEDOUT);
	}
	free(rep);
	buf_free(&b);
	nn_close(first);
	nn_close(again);
	nn_close(w);
	harness_free(h);
}

static void test_server_session_and_region_limits_are_elimit(void **state)
{
	struct harness *h = harness_start("max-sessions", "1", "max-regions", "1", NULL);
	int s = client_open(h);
	uint64_t sid = hello(s);
	struct buf b;
	char name[FA_PROTO_SHM_NAME_MAX];
	(void)state;

	struct fa_proto_req req = {.op = FA_OP_HELLO, .seq = seq_next++};
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, FA_ELIMIT, "--max-sessions");
	free(rep);
	buf_alloc(&b, s, sid, 4096);
	assert_int_equal(dtest_shm_create(name, 4096), 0);
	register_shm(s, sid, name, 4096, FA_ELIMIT);
	shm_unlink(name);
	buf_free(&b);
	nn_close(s);
	harness_free(h);
}

static void test_server_malformed_oversize_and_version_are_answered(void **state)
{
	struct harness *h = harness_start(NULL);
	int s = client_open(h);
	uint64_t sid = hello(s);
	struct fa_proto_rep *rep;
	(void)state;

	client_send_raw(s, "garbage", 7);
	rep = client_recv(s);
	expect_status(rep, FA_EPROTO, NULL);
	assert_int_equal(rep->op, 0);
	free(rep);

	/* Between FA_PROTO_MAX_MSG and the transport's 1 MiB: a clear FA_ETOOBIG, the connection
	 * kept. */
	size_t big = 100 * 1024;
	uint8_t *p = calloc(1, big);
	p[0] = 0xc6; /* bin32 */
	uint32_t n = (uint32_t)(big - 5);
	p[1] = (uint8_t)(n >> 24);
	p[2] = (uint8_t)(n >> 16);
	p[3] = (uint8_t)(n >> 8);
	p[4] = (uint8_t)n;
	client_send_raw(s, p, big);
	free(p);
	rep = client_recv(s);
	expect_status(rep, FA_ETOOBIG, NULL);
	free(rep);

	/* {"v": 2, "op": 3, "seq": 9, "sid": 1}: another protocol version. */
	static const uint8_t v2[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0x03, 0xa3, 's', 'e',
	                             'q', 0x09, 0xa3, 's', 'i', 'd', 0x01};
	client_send_raw(s, v2, sizeof v2);
	rep = client_recv(s);
	expect_status(rep, FA_EVERSION, "protocol version 2");
	assert_int_equal(rep->op, FA_OP_PING);
	assert_true(rep->seq == 9);
	free(rep);

	/* An unknown session: a daemon restart, as the client sees it. */
	struct fa_proto_req req = simple(FA_OP_PING, sid ^ 0x1234);
	rep = call(s, &req);
	expect_status(rep, FA_ESESSION, "is not open on this daemon");
	free(rep);

	assert_true(stat_u64(s, sid, "requests_malformed") == 2);
	assert_true(stat_u64(s, sid, "requests_failed") == 4);
	nn_close(s);
	harness_free(h);
}

static void test_server_busy_past_max_inflight(void **state)
{
	struct harness *h = harness_start("max-inflight", "1", "threads", "1", NULL);
	int a = client_open(h), b2 = client_open(h);
	uint64_t sid = hello(a);
	struct buf b;
	(void)state;

	struct fwd_case c = slow_case();
	buf_alloc(&b, a, sid, (size_t)c.end);
	fill_inputs(&b, &c, 3);
	struct fa_proto_req slow = fwd_req(sid, &b, &c);
	client_send(a, &slow);
	/* The same session from another connection of this process, once the first is in. */
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (stat_u64(b2, sid, "inflight") != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	struct fa_proto_req second = fwd_req(sid, &b, &c);
	struct fa_proto_rep *rep = call(b2, &second);
	expect_status(rep, FA_EBUSY, "--max-inflight");
	free(rep);
	rep = client_recv(a);
	expect_status(rep, FA_OK, NULL);
	free(rep);
	assert_true(stat_u64(b2, sid, "requests_busy") == 1);
	/* Not cached: the same seq is tried again once there is room. */
	rep = call(b2, &second);
	expect_status(rep, FA_OK, NULL);
	free(rep);
	buf_free(&b);
	nn_close(a);
	nn_close(b2);
	harness_free(h);
}

static void test_server_dropped_connection_closes_the_session_and_unlinks(void **state)
{
	struct harness *h = harness_start(NULL);
	int a = client_open(h), other = client_open(h);
	uint64_t sid = hello(a), watcher = hello(other);
	struct buf b;
	(void)state;

	buf_alloc(&b, a, sid, 4096);
	assert_true(stat_u64(other, watcher, "sessions") == 2);
	nn_close(a); /* the client died */
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (stat_u64(other, watcher, "sessions") != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(5);
	assert_true(stat_u64(other, watcher, "sessions") == 1);
	assert_true(stat_u64(other, watcher, "regions") == 0);
	assert_false(dtest_shm_exists(b.name)); /* a dead client leaks no shared memory */
	/* Its id is gone. */
	struct fa_proto_req req = simple(FA_OP_PING, sid);
	struct fa_proto_rep *rep = call(other, &req);
	expect_status(rep, FA_ESESSION, NULL);
	free(rep);
	munmap(b.p, b.size);
	nn_close(other);
	harness_free(h);
}

static void test_server_bye_closes_the_session(void **state)
{
	struct harness *h = harness_start(NULL);
	int a = client_open(h);
	uint64_t sid = hello(a);
	struct buf b;
	(void)state;

	buf_alloc(&b, a, sid, 4096);
	struct fa_proto_req req = simple(FA_OP_BYE, sid);
	struct fa_proto_rep *rep = call(a, &req);
	expect_status(rep, FA_OK, NULL);
	free(rep);
	req = simple(FA_OP_PING, sid);
	rep = call(a, &req);
	expect_status(rep, FA_ESESSION, NULL);
	free(rep);
	assert_false(dtest_shm_exists(b.name));
	munmap(b.p, b.size);
	nn_close(a);
	harness_free(h);
}

/* Under valgrind, returning from the SIGBUS handler to retry the access needs precise registers
 * (valgrind --vex-iropt-register-updates=allregs-at-mem-access); say so by setting
 * FA_TEST_VALGRIND_PRECISE=1, or this test is skipped there. */
static bool under_valgrind(void)
{
	const char *pre = getenv("LD_PRELOAD");
	return pre != NULL && strstr(pre, "vgpreload") != NULL;
}

static void test_server_survives_a_client_shrinking_its_memory(void **state)
{
	(void)state;
	if (under_valgrind() && getenv("FA_TEST_VALGRIND_PRECISE") == NULL) {
		print_message("skipped: valgrind needs --vex-iropt-register-updates="
		              "allregs-at-mem-access and FA_TEST_VALGRIND_PRECISE=1 for this test\n");
		skip();
	}
	struct harness *h = harness_start(NULL);
	int s = client_open(h);
	uint64_t sid = hello(s);
	struct buf b;

	struct fwd_case c = fwd_layout(1, 64, 64, 4, 4, 64, FA_DTYPE_FP32, FA_MASK_NONE);
	buf_alloc(&b, s, sid, (size_t)c.end);
	munmap(b.p, b.size);
	int fd = shm_open(b.name, O_RDWR, 0);
	assert_int_equal(ftruncate(fd, 0), 0); /* every page the daemon maps is gone */
	close(fd);
	struct fa_proto_req req = fwd_req(sid, &b, &c);
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, FA_ERANGE, "shrank");
	free(rep);
	req = simple(FA_OP_PING, sid);
	rep = call(s, &req);
	expect_status(rep, FA_OK, NULL); /* alive */
	free(rep);
	req = fwd_req(sid, &b, &c);
	rep = call(s, &req);
	expect_status(rep, FA_ERANGE, "lost pages");
	free(rep);
	shm_unlink(b.name);
	nn_close(s);
	harness_free(h);
}

static void test_server_shutdown_answers_running_and_rejects_queued(void **state)
{
	struct harness *h = harness_start("threads", "1", NULL);
	int a = client_open(h), q = client_open(h), w = client_open(h);
	uint64_t sid = hello(a);
	struct buf b;
	(void)state;

	struct fwd_case c = slow_case();
	buf_alloc(&b, a, sid, (size_t)c.end * 2);
	fill_inputs(&b, &c, 5);
	struct fa_proto_req running = fwd_req(sid, &b, &c);
	struct fa_proto_req queued = fwd_req(sid, &b, &c);
	/* Its own output, so the two do not race on o. */
	queued.u.fwd.o.offset += c.end;
	queued.u.fwd.lse.offset += c.end;
	client_send(a, &running);
	client_send(q, &queued);
	/* Both accepted, and the single worker computing the first, before the stop. */
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while ((stat_u64(w, sid, "inflight") != 2 || stat_u64(w, sid, "fwd_running") != 1) &&
	       fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	uv_async_send(&h->stop);
	struct fa_proto_rep *rq = client_recv(q);
	expect_status(rq, FA_ECLOSED, "shutting down");
	free(rq);
	struct fa_proto_rep *ra = client_recv(a);
	expect_status(ra, FA_OK, NULL);
	assert_true(ra->u.fwd.compute_ns > 0);
	free(ra);
	pthread_join(h->thread, NULL);
	h->running = false;
	h->loop_close_rc = uv_loop_close(&h->loop);
	assert_int_equal(h->loop_close_rc, 0);
	/* Clean shutdown: the client keeps its object for the next daemon; the socket is gone. */
	assert_true(dtest_shm_exists(b.name));
	assert_int_equal(access(h->cfg.socket, F_OK), -1);
	buf_free(&b);
	nn_close(a);
	nn_close(q);
	nn_close(w);
	harness_free(h);
}

/* A raw Unix-socket peer: connect, write some bytes, close. */
static void raw_peer(const char *path, const void *bytes, size_t n)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	if (n > 0)
		assert_int_equal(write(fd, bytes, n), (ssize_t)n);
	close(fd);
}

static void test_server_bad_peers_do_not_stop_it_accepting(void **state)
{
	struct harness *h = harness_start(NULL);
	static const uint8_t rep_hs[8] = {0, 'S', 'P', 0, 0, 0x31, 0, 0}; /* a REP, not a REQ */
	static const uint8_t req_hs[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
	uint8_t huge[8 + 9] = {0, 'S', 'P', 0, 0, 0x30, 0, 0, 1, 0, 0, 0, 0, 0x7f, 0, 0, 0};
	uint8_t bad_type[8 + 9 + 8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 8};
	(void)state;

	/* What stopped NNG 1.5.2's listener for good (nanomsg/nng#1518), and other junk. */
	for (int i = 0; i < 3; i++) {
		raw_peer(h->cfg.socket, NULL, 0);
		raw_peer(h->cfg.socket, "junkjunkjunkjunk", 16);
		raw_peer(h->cfg.socket, req_hs, 5);
		raw_peer(h->cfg.socket, rep_hs, sizeof rep_hs);
		raw_peer(h->cfg.socket, huge, sizeof huge);
		raw_peer(h->cfg.socket, bad_type, sizeof bad_type);
	}
	int s = client_open(h);
	uint64_t sid = hello(s);
	struct fa_proto_req req = simple(FA_OP_PING, sid);
	struct fa_proto_rep *rep = call(s, &req);
	expect_status(rep, FA_OK, NULL);
	free(rep);
	/* Every bad peer's connection is closed again (closing is asynchronous: poll). */
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (stat_u64(s, sid, "connections") != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(2);
	assert_true(stat_u64(s, sid, "connections") == 1);
	nn_close(s);
	harness_free(h);
}

static void test_server_refuses_a_live_socket_and_replaces_a_stale_one(void **state)
{
	struct harness *h = harness_start(NULL);
	struct config cfg = h->cfg;
	struct server *srv2 = calloc(1, sizeof(*srv2));
	uv_loop_t loop2;
	char err[512];
	(void)state;

	assert_int_equal(uv_loop_init(&loop2), 0);
	assert_int_equal(server_open(srv2, &loop2, &cfg, err, sizeof err), FA_EUNAVAIL);
	assert_non_null(strstr(err, "another daemon is live on"));
	uv_run(&loop2, UV_RUN_DEFAULT); /* what had started closes */
	assert_int_equal(uv_loop_close(&loop2), 0);
	harness_free(h);

	/* A socket file nobody listens on (a daemon that was SIGKILLed). */
	char dir[64], path[100];
	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);
	snprintf(path, sizeof path, "%s/s", dir);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	close(fd);
	h = harness_start("socket", path, NULL);
	int s = client_open(h);
	hello(s);
	nn_close(s);
	harness_free(h);
	fa_test_rmdir(dir);

	/* Not a socket at all: refused, never deleted. */
	assert_int_equal(fa_test_mkdir(dir, sizeof dir), 0);
	snprintf(path, sizeof path, "%s/s", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	close(fd);
	config_set(&cfg, "socket", path, "test", err, sizeof err);
	assert_int_equal(uv_loop_init(&loop2), 0);
	assert_int_equal(server_open(srv2, &loop2, &cfg, err, sizeof err), FA_EINVAL);
	assert_non_null(strstr(err, "is not a socket"));
	uv_run(&loop2, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&loop2), 0);
	assert_int_equal(access(path, F_OK), 0);
	fa_test_rmdir(dir);
	free(srv2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_server_hello_ping_stats),
		cmocka_unit_test(test_server_attention_matches_the_reference),
		cmocka_unit_test(test_server_validation_errors_come_back_with_detail),
		cmocka_unit_test(test_server_duplicate_seq_is_answered_from_the_cache),
		cmocka_unit_test(test_server_repeat_while_running_is_answered_on_the_newest_connection),
		cmocka_unit_test(test_server_session_and_region_limits_are_elimit),
		cmocka_unit_test(test_server_malformed_oversize_and_version_are_answered),
		cmocka_unit_test(test_server_busy_past_max_inflight),
		cmocka_unit_test(test_server_dropped_connection_closes_the_session_and_unlinks),
		cmocka_unit_test(test_server_bye_closes_the_session),
		cmocka_unit_test(test_server_survives_a_client_shrinking_its_memory),
		cmocka_unit_test(test_server_shutdown_answers_running_and_rejects_queued),
		cmocka_unit_test(test_server_bad_peers_do_not_stop_it_accepting),
		cmocka_unit_test(test_server_refuses_a_live_socket_and_replaces_a_stale_one),
	};
	signal(SIGPIPE, SIG_IGN);
	log_level = getenv("FA_TEST_VERBOSE") ? FA_LOG_DEBUG : FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
