/* test_bad_input.c - the bad-input catalogue (research/reliability.md 4.2) against a real daemon,
 * while a healthy client process keeps getting correct results.
 *
 * Each bad input must get its own specific status (or, for bytes below the messaging layer, the
 * daemon must simply keep serving). Semantic cases go twice: through the public API (the client
 * library may refuse them itself) and as raw requests (so the daemon's own checks are reached).
 * At the end: the healthy client saw only correct results, the daemon exits 0 on SIGTERM and its
 * log holds no sanitizer report.
 */
#include <poll.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>

#include "fa_integ.h"
#include "fa_raw.h"

#define SHM_SIZE (1u << 20)  /* the raw session's region */
#define API_BUF_SIZE 65536   /* the API client's buffer */

static struct fa_daemon g_d;
static pid_t g_healthy = -1;
static int g_stop_w = -1, g_result_r = -1;
static int g_raw = -1;       /* raw REQ socket of the raw session */
static uint64_t g_sid, g_rid, g_seq = 1000;
static struct fa_raw_shm g_shm;
static fa_client *g_c;
static fa_buffer *g_buf;
static int g_idle_fd = -1;   /* a connection that sent half an SP header and then nothing */
static uint64_t g_rng = 0x12345678u;

/* ---- the healthy client ------------------------------------------------------------------- */

struct healthy_result {
	int ok, bad;
};

/* A separate process doing small, checked requests until the parent closes the stop pipe. */
static int healthy_main(int stop_r, int result_w)
{
	struct healthy_result r = {0, 0};
	fa_client *c = NULL;
	fa_buffer *buf = NULL;
	uint64_t rng = 0xbeefu;
	bool announced = false;
	if (fa_client_open(&c, g_d.url) != FA_OK) {
		fprintf(stderr, "healthy: cannot open a client\n");
		return 2;
	}
	fa_client_set_timeout(c, fa_test_ms(30000));
	for (;;) {
		struct pollfd pfd = {stop_r, POLLIN, 0};
		if (poll(&pfd, 1, 0) > 0)
			break;
		struct fa_case cs;
		char why[256], desc[256];
		fa_case_random(&cs, &rng, 48, 1.5e5);
		if (fa_integ_run_case(c, &buf, &cs, &rng, NULL, NULL, why, sizeof why)) {
			r.ok++;
		} else {
			r.bad++;
			fa_case_describe(&cs, desc, sizeof desc);
			fprintf(stderr, "healthy: request %d failed: %s\n    case: %s\n", r.ok + r.bad,
			        why, desc);
		}
		if (!announced && r.ok > 0) {
			char ch = 'R';
			fa_test_write_all(result_w, &ch, 1);
			announced = true;
		}
	}
	fa_buffer_free(buf);
	fa_client_close(c);
	fa_test_write_all(result_w, &r, sizeof r);
	fprintf(stderr, "healthy: %d correct, %d wrong\n", r.ok, r.bad);
	return r.bad == 0 && r.ok > 0 ? 0 : 1;
}

/* ---- shared checks ------------------------------------------------------------------------ */

/* The daemon is alive, answers a PING on the raw session's connection, and still accepts new
 * connections (a listener that stopped accepting would leave old connections working). */
static void assert_serving(void)
{
	struct fa_proto_rep rep;
	assert_true(daemon_alive(&g_d));
	assert_int_equal(fa_raw_simple(g_raw, FA_OP_PING, g_sid, g_seq++, &rep), FA_OK);
	int s = fa_raw_open(g_d.url, fa_test_ms(5000));
	assert_true(s >= 0);
	int st = fa_raw_simple(s, FA_OP_PING, g_sid, g_seq++, &rep);
	nn_close(s);
	if (st != FA_OK)
		fprintf(stderr, "a new connection got %d: the daemon no longer accepts connections\n", st);
	assert_int_equal(st, FA_OK);
}

/* A numeric STATS value through the raw session. */
static uint64_t raw_stat(const char *key)
{
	static struct fa_proto_rep rep;
	uint64_t v = UINT64_MAX;
	if (fa_raw_simple(g_raw, FA_OP_STATS, g_sid, g_seq++, &rep) == FA_OK)
		fa_stats_u64(rep.u.stats.text, key, &v);
	return v;
}

/* Send raw bytes on the raw socket and expect a reply with status want. */
static void expect_bytes(const char *what, const void *msg, size_t len, int want)
{
	struct fa_proto_rep rep;
	int got = fa_raw_call_bytes(g_raw, msg, len, &rep);
	if (got != want)
		fprintf(stderr, "%s: got %d (%s), want %s; detail '%s'\n", what, got,
		        got >= 0 ? fa_status_name((fa_status)got) : "no reply",
		        fa_status_name((fa_status)want), got >= 0 ? rep.detail : "");
	assert_int_equal(got, want);
	if (want != FA_OK)
		assert_true(rep.detail[0] != '\0');
}

/* ---- setup -------------------------------------------------------------------------------- */

static int setup(void **state)
{
	(void)state;
	struct fa_proto_rep rep;
	int pstop[2], pres[2];
	char ready;
	if (daemon_start(&g_d, "--threads", "2", NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	/* Fork the healthy client before this process opens any nanomsg socket. */
	if (pipe(pstop) != 0 || pipe(pres) != 0)
		return -1;
	fflush(stderr);
	g_healthy = fork();
	if (g_healthy < 0)
		return -1;
	if (g_healthy == 0) {
		close(pstop[1]);
		close(pres[0]);
		_exit(healthy_main(pstop[0], pres[1]));
	}
	close(pstop[0]);
	close(pres[1]);
	g_stop_w = pstop[1];
	g_result_r = pres[0];
	if (fa_test_read_full(g_result_r, &ready, 1, fa_test_ms(30000)) != 0 || ready != 'R') {
		fprintf(stderr, "setup: the healthy client never got a correct result\n");
		return -1;
	}

	/* A connection that stalls in the middle of its handshake for the whole run. */
	g_idle_fd = fa_raw_unix_connect(g_d.sock);
	if (g_idle_fd >= 0)
		fa_raw_unix_send(g_idle_fd, "\0SP", 3);

	/* The raw session and its region. */
	g_raw = fa_raw_open(g_d.url, fa_test_ms(20000));
	if (g_raw < 0 || (g_sid = fa_raw_hello(g_raw, g_seq++, &rep)) == 0) {
		fprintf(stderr, "setup: raw HELLO failed\n");
		return -1;
	}
	if (fa_raw_shm_create(&g_shm, SHM_SIZE, &g_rng) != 0 ||
	    fa_raw_register(g_raw, g_sid, g_seq++, g_shm.name, SHM_SIZE, &g_rid, &rep) != FA_OK) {
		fprintf(stderr, "setup: raw REGISTER failed: %s\n", rep.detail);
		return -1;
	}

	/* The API client. */
	if (fa_client_open(&g_c, g_d.url) != FA_OK ||
	    fa_buffer_alloc_host(g_c, API_BUF_SIZE, &g_buf) != FA_OK) {
		fprintf(stderr, "setup: API client failed: %s\n", fa_last_error_detail());
		return -1;
	}
	fa_client_set_timeout(g_c, fa_test_ms(20000));
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	int failed = 0;
	struct healthy_result r = {0, 0};

	if (g_healthy > 0) {
		close(g_stop_w);
		if (fa_test_read_full(g_result_r, &r, sizeof r, fa_test_ms(60000)) != 0)
			failed |= 1;
		int code = fa_test_waitpid(g_healthy, fa_test_ms(60000));
		if (code != 0) {
			fprintf(stderr, "teardown: healthy client ended with %d (%d ok, %d bad)\n", code,
			        r.ok, r.bad);
			if (code < 0)
				kill(g_healthy, SIGKILL);
			failed |= 2;
		} else {
			fprintf(stderr, "teardown: healthy client made %d correct requests\n", r.ok);
		}
	}
	if (g_buf)
		fa_buffer_free(g_buf);
	fa_client_close(g_c);
	if (g_raw >= 0)
		nn_close(g_raw);
	fa_raw_shm_destroy(&g_shm);
	if (g_idle_fd >= 0)
		close(g_idle_fd);
	int st = daemon_stop(&g_d);
	if (st != 0) {
		fprintf(stderr, "teardown: daemon exit status %d, want 0\n", st);
		daemon_log_dump(&g_d, 40);
		failed |= 4;
	}
	if (!daemon_log_clean(&g_d))
		failed |= 8;
	daemon_cleanup(&g_d);
	return failed ? -1 : 0;
}

/* ---- transport-level junk ------------------------------------------------------------------ */

/* Bytes below nanomsg's framing, on plain AF_UNIX connections: the daemon drops them and keeps
 * serving everyone else. */
static void test_bad_input_raw_socket_junk_keeps_daemon_serving(void **state)
{
	(void)state;
	unsigned char sp[8], fr[9], junk[512];
	fa_fill_bytes(junk, sizeof junk, &g_rng);

	/* 1. Random bytes instead of a handshake. */
	int fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, junk, sizeof junk);
	close(fd);
	assert_serving();

	/* 2. A valid REQ handshake, then garbage. */
	fa_raw_sp_header(sp, 0x30);
	fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	fa_raw_unix_send(fd, junk, 100);
	close(fd);
	assert_serving();

	/* 3. A frame announcing 2^62 bytes. */
	fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	fa_raw_frame_header(fr, 1, UINT64_C(1) << 62);
	fa_raw_unix_send(fd, fr, 9);
	fa_raw_unix_send(fd, junk, 64);
	close(fd);
	assert_serving();

	/* 4. A frame just above the daemon's 1 MiB receive limit. */
	fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	fa_raw_frame_header(fr, 1, (1u << 20) + 1);
	fa_raw_unix_send(fd, fr, 9);
	close(fd);
	assert_serving();

	/* 5. A message type byte other than 1 (nanomsg's own server asserts on this). */
	fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	fa_raw_frame_header(fr, 0x55, 16);
	fa_raw_unix_send(fd, fr, 9);
	fa_raw_unix_send(fd, junk, 16);
	close(fd);
	assert_serving();

	/* 6. A frame that claims 1000 bytes, sends 10 and hangs up. */
	fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	fa_raw_frame_header(fr, 1, 1000);
	fa_raw_unix_send(fd, fr, 9);
	fa_raw_unix_send(fd, junk, 10);
	close(fd);
	assert_serving();

	/* 7. A handshake for the wrong protocol (PUB) and one with a bad magic. */
	fa_raw_sp_header(sp, 0x20);
	fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	close(fd);
	fa_raw_sp_header(sp, 0x30);
	sp[1] = 'X';
	fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	close(fd);
	assert_serving();

	/* 8. Fifty connections that say nothing, held open. */
	int idle[50];
	for (int i = 0; i < 50; i++)
		idle[i] = fa_raw_unix_connect(g_d.sock);
	assert_serving();
	for (int i = 0; i < 50; i++)
		if (idle[i] >= 0)
			close(idle[i]);
	assert_serving();
}

/* A well-framed request with a garbage body, sent by hand: the reply comes back on the same
 * connection and says FA_EPROTO. Proves the framing above is the one the daemon speaks. */
static void test_bad_input_hand_framed_garbage_gets_eproto_reply(void **state)
{
	(void)state;
	unsigned char sp[8], fr[9], body[4 + 16], hdr[8];
	fa_raw_sp_header(sp, 0x30);
	int fd = fa_raw_unix_connect(g_d.sock);
	assert_true(fd >= 0);
	fa_raw_unix_send(fd, sp, 8);
	/* Request id with the top bit set (the end of the backtrace), then the body. */
	body[0] = 0x80;
	body[1] = 0x00;
	body[2] = 0x12;
	body[3] = 0x34;
	memset(body + 4, 0xc1, 16); /* 0xc1 is never valid msgpack */
	fa_raw_frame_header(fr, 1, sizeof body);
	fa_raw_unix_send(fd, fr, 9);
	fa_raw_unix_send(fd, body, sizeof body);

	assert_int_equal(fa_test_read_full(fd, hdr, 8, fa_test_ms(10000)), 0);
	assert_int_equal(hdr[1], 'S');
	assert_int_equal(hdr[5], 0x31); /* REP */
	assert_int_equal(fa_test_read_full(fd, fr, 9, fa_test_ms(10000)), 0);
	assert_int_equal(fr[0], 1);
	uint64_t len = 0;
	for (int i = 0; i < 8; i++)
		len = len << 8 | fr[1 + i];
	assert_true(len > 4 && len < 4096);
	unsigned char *rep_bytes = malloc(len);
	assert_non_null(rep_bytes);
	assert_int_equal(fa_test_read_full(fd, rep_bytes, len, fa_test_ms(10000)), 0);
	close(fd);
	assert_memory_equal(rep_bytes, body, 4); /* the request id comes back */
	struct fa_proto_rep rep;
	char err[256];
	assert_int_equal(fa_proto_decode_rep(rep_bytes + 4, len - 4, &rep, err, sizeof err), FA_OK);
	free(rep_bytes);
	assert_int_equal(rep.status, FA_EPROTO);
	assert_serving();
}

/* ---- messages that do not decode ------------------------------------------------------------ */

/* msgpack-c helpers for hand-made maps. */
static void pk_kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
	msgpack_pack_str_with_body(pk, k, strlen(k));
	msgpack_pack_uint64(pk, v);
}

static void test_bad_input_garbage_msgpack_gets_eproto(void **state)
{
	(void)state;
	static const unsigned char c1[] = {0xc1};
	static const unsigned char arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
	static const unsigned char map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
	static const unsigned char str32[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'};
	static const unsigned char bin32[] = {0xc6, 0x7f, 0xff, 0xff, 0xff, 0};
	static const unsigned char ext[] = {0xd4, 0x01, 0x00};
	static const unsigned char nil[] = {0xc0};
	expect_bytes("0xc1", c1, sizeof c1, FA_EPROTO);
	expect_bytes("text", "not msgpack at all", 18, FA_EPROTO);
	expect_bytes("array32 of 2^32-1", arr32, sizeof arr32, FA_EPROTO);
	expect_bytes("map32 of 2^32-1", map32, sizeof map32, FA_EPROTO);
	expect_bytes("str32 of 4 GiB", str32, sizeof str32, FA_EPROTO);
	expect_bytes("bin32 of 2 GiB", bin32, sizeof bin32, FA_EPROTO);
	expect_bytes("ext", ext, sizeof ext, FA_EPROTO);
	expect_bytes("nil", nil, sizeof nil, FA_EPROTO);
	expect_bytes("empty message", "", 0, FA_EPROTO);

	unsigned char deep[101];
	memset(deep, 0x91, 100); /* [[[[...]]]] 100 deep */
	deep[100] = 0x00;
	expect_bytes("nesting 100 deep", deep, sizeof deep, FA_EPROTO);

	/* A valid PING with one trailing byte, and truncated by one byte. */
	struct fa_proto_req req;
	unsigned char buf[512];
	size_t len;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_PING;
	req.session = g_sid;
	req.seq = g_seq++;
	assert_int_equal(fa_proto_encode_req(&req, buf, sizeof buf, &len), FA_OK);
	buf[len] = 0x00;
	expect_bytes("trailing byte", buf, len + 1, FA_EPROTO);
	expect_bytes("truncated", buf, len - 1, FA_EPROTO);

	/* Maps with the right keys but wrong contents. */
	msgpack_sbuffer sb;
	msgpack_packer pk;
	struct {
		const char *what;
		int variant;
	} maps[] = {{"sid declared as a 4G array", 0}, {"unknown key", 1}, {"missing sid", 2},
	            {"seq as a string", 3},           {"duplicate key", 4}, {"negative seq", 5}};
	for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
		msgpack_sbuffer_init(&sb);
		msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
		int v = maps[i].variant;
		msgpack_pack_map(&pk, v == 2 ? 3 : v == 1 || v == 4 ? 5 : 4);
		pk_kv_u64(&pk, "v", FA_PROTO_VERSION);
		pk_kv_u64(&pk, "op", FA_OP_PING);
		if (v == 3) {
			msgpack_pack_str_with_body(&pk, "seq", 3);
			msgpack_pack_str_with_body(&pk, "12", 2);
		} else if (v == 5) {
			msgpack_pack_str_with_body(&pk, "seq", 3);
			msgpack_pack_int64(&pk, -5);
		} else {
			pk_kv_u64(&pk, "seq", g_seq++);
		}
		if (v == 0) {
			msgpack_pack_str_with_body(&pk, "sid", 3);
			msgpack_sbuffer_write(&sb, (const char *)arr32, sizeof arr32);
		} else if (v != 2) {
			pk_kv_u64(&pk, "sid", g_sid);
		}
		if (v == 1)
			pk_kv_u64(&pk, "zz", 1);
		if (v == 4)
			pk_kv_u64(&pk, "sid", g_sid);
		expect_bytes(maps[i].what, sb.data, sb.size, FA_EPROTO);
		msgpack_sbuffer_destroy(&sb);
	}
	assert_serving();
}

/* Find the bytes of key k followed by a positive fixint in an encoded map; its index or -1. */
static long find_fixint_key(const unsigned char *b, size_t len, const char *k)
{
	size_t kl = strlen(k);
	for (size_t i = 0; i + kl + 2 <= len; i++)
		if (b[i] == (0xa0 | kl) && !memcmp(b + i + 1, k, kl) && b[i + 1 + kl] < 0x80)
			return (long)(i + 1 + kl);
	return -1;
}

static void test_bad_input_wrong_version_gets_eversion(void **state)
{
	(void)state;
	struct fa_proto_req req;
	unsigned char buf[512];
	size_t len;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_PING;
	req.session = g_sid;
	req.seq = g_seq++;
	assert_int_equal(fa_proto_encode_req(&req, buf, sizeof buf, &len), FA_OK);
	long at = find_fixint_key(buf, len, "v");
	assert_true(at > 0);
	buf[at] = FA_PROTO_VERSION + 1;
	expect_bytes("v = version + 1", buf, len, FA_EVERSION);
	buf[at] = 0;
	expect_bytes("v = 0", buf, len, FA_EVERSION);

	/* Also a HELLO from the future. */
	memset(&req, 0, sizeof req);
	req.op = FA_OP_HELLO;
	req.seq = g_seq++;
	snprintf(req.u.hello.name, sizeof req.u.hello.name, "future");
	assert_int_equal(fa_proto_encode_req(&req, buf, sizeof buf, &len), FA_OK);
	at = find_fixint_key(buf, len, "v");
	buf[at] = 99;
	expect_bytes("HELLO v = 99", buf, len, FA_EVERSION);
}

static void test_bad_input_unknown_op_gets_eproto(void **state)
{
	(void)state;
	struct fa_proto_req req;
	unsigned char buf[512];
	size_t len;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_PING;
	req.session = g_sid;
	req.seq = g_seq++;
	assert_int_equal(fa_proto_encode_req(&req, buf, sizeof buf, &len), FA_OK);
	long at = find_fixint_key(buf, len, "op");
	assert_true(at > 0);
	buf[at] = 99;
	expect_bytes("op 99", buf, len, FA_EPROTO);
	buf[at] = 21; /* reserved for the backward pass: not an op of this version */
	expect_bytes("op 21", buf, len, FA_EPROTO);
	buf[at] = 0;
	expect_bytes("op 0", buf, len, FA_EPROTO);
}

static void test_bad_input_unknown_session_gets_esession(void **state)
{
	(void)state;
	struct fa_proto_rep rep;
	uint64_t bogus = fa_rand_next(&g_rng) | 1;
	assert_int_equal(fa_raw_simple(g_raw, FA_OP_PING, bogus, g_seq++, &rep), FA_ESESSION);
	assert_int_equal(fa_raw_simple(g_raw, FA_OP_PING, 0, g_seq++, &rep), FA_ESESSION);
	uint64_t rid;
	assert_int_equal(fa_raw_register(g_raw, bogus, g_seq++, g_shm.name, 4096, &rid, &rep),
	                 FA_ESESSION);

	/* An attention request of an unknown session: refused before any region lookup. */
	struct fa_case cs = {.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 8, .Sk = 8, .Hq = 1, .Hkv = 1,
	                     .D = 64};
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	struct fa_proto_req req;
	fa_case_layout(&cs, &l);
	fa_case_args(&cs, &l, FA_RAW_BUF, &a);
	fa_raw_fwd_req(&a, bogus, g_seq++, g_rid, &req);
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_ESESSION);
	assert_true(rep.epoch != 0);
}

/* ---- regions ------------------------------------------------------------------------------ */

/* A small good problem in the raw region: args (buffer FA_RAW_BUF) and layout. */
static void small_case(struct fa_case *cs, struct fa_case_layout *l, fa_attn_fwd_args *a)
{
	*cs = (struct fa_case){.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 16, .Sk = 16, .Hq = 2,
	                       .Hkv = 1, .D = 64, .lse = true};
	fa_case_layout(cs, l);
	fa_case_args(cs, l, FA_RAW_BUF, a);
}

static void test_bad_input_unknown_and_foreign_regions_get_eregion(void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	small_case(&cs, &l, &a);

	/* Unknown id in our own session. */
	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	req.u.fwd.k.region = fa_rand_next(&g_rng) | 1;
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_EREGION);
	assert_true(rep.detail[0] != '\0');

	/* Another session (another connection of this process) uses our region: refused. */
	int s2 = fa_raw_open(g_d.url, fa_test_ms(20000));
	assert_true(s2 >= 0);
	uint64_t sid2 = fa_raw_hello(s2, 1, &rep);
	assert_true(sid2 != 0 && sid2 != g_sid);
	fa_raw_fwd_req(&a, sid2, 2, g_rid, &req);
	assert_int_equal(fa_raw_call(s2, &req, &rep), FA_EREGION);
	memset(&req, 0, sizeof req);
	req.op = FA_OP_UNREGISTER;
	req.session = sid2;
	req.seq = 3;
	req.u.unreg.region = g_rid;
	assert_int_equal(fa_raw_call(s2, &req, &rep), FA_EREGION);
	assert_int_equal(fa_raw_simple(s2, FA_OP_BYE, sid2, 4, &rep), FA_OK);
	nn_close(s2);

	/* The owner still computes with it, correctly. */
	fa_case_fill(&cs, &l, g_shm.map, &g_rng);
	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_OK);
	char why[256];
	assert_true(fa_case_check(&cs, &l, g_shm.map, NULL, why, sizeof why));

	/* Through the API: a second client's buffer in the first client's call. */
	fa_client *c2 = NULL;
	fa_buffer *b2 = NULL;
	assert_int_equal(fa_client_open(&c2, g_d.url), FA_OK);
	assert_int_equal(fa_buffer_alloc_host(c2, API_BUF_SIZE, &b2), FA_OK);
	fa_case_args(&cs, &l, g_buf, &a);
	a.k.buf = b2;
	fa_status st = fa_attn_fwd(g_c, &a);
	if (st != FA_EREGION)
		fprintf(stderr, "foreign buffer through the API: %s\n", fa_status_name(st));
	assert_int_equal(st, FA_EREGION);
	assert_int_equal(fa_buffer_free(b2), FA_OK);
	fa_client_close(c2);
}

/* UNREGISTER region rid of the raw session; its status. */
static int raw_unregister(uint64_t rid, struct fa_proto_rep *rep)
{
	struct fa_proto_req req;
	memset(&req, 0, sizeof req);
	req.op = FA_OP_UNREGISTER;
	req.session = g_sid;
	req.seq = g_seq++;
	req.u.unreg.region = rid;
	return fa_raw_call(g_raw, &req, rep);
}

/* One ATTN_FWD of the raw session that must be refused with want, the detail holding both
 * needles and the region left unwritten. */
static void expect_refused_unwritten(const struct fa_proto_req *req, int want, const char *needle,
                                     const char *needle2)
{
	struct fa_proto_rep rep;
	unsigned char *before = malloc(SHM_SIZE);
	assert_non_null(before);
	memcpy(before, g_shm.map, SHM_SIZE);
	int st = fa_raw_call(g_raw, req, &rep);
	bool same = !memcmp(before, g_shm.map, SHM_SIZE);
	free(before);
	if (st != want || strstr(rep.detail, needle) == NULL || strstr(rep.detail, needle2) == NULL ||
	    !same)
		fprintf(stderr, "got %d %s, want %s with '%s' and '%s'; detail '%s'%s\n", st,
		        st >= 0 ? fa_status_name((fa_status)st) : "", fa_status_name((fa_status)want),
		        needle, needle2, st >= 0 ? rep.detail : "", same ? "" : "; THE REGION WAS WRITTEN");
	assert_int_equal(st, want);
	assert_non_null(strstr(rep.detail, needle));
	assert_non_null(strstr(rep.detail, needle2));
	assert_true(same);
}

/* The same shm object registered twice (allowed up to --max-regions): O in the second
 * registration at Q's bytes in the first, or lse there on V, is one memory: FA_EOVERLAP, nothing
 * written. Disjoint bytes through the two registrations compute right, and unregistering the
 * second leaves the first serving. */
static void test_bad_input_output_over_an_input_through_a_second_registration_gets_eoverlap(
    void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	uint64_t rid2 = 0;
	char why[256], needle[64];
	small_case(&cs, &l, &a);

	assert_int_equal(fa_raw_register(g_raw, g_sid, g_seq++, g_shm.name, SHM_SIZE, &rid2, &rep),
	                 FA_OK);
	assert_true(rid2 != 0 && rid2 != g_rid);
	fa_case_fill(&cs, &l, g_shm.map, &g_rng);

	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	req.u.fwd.o.region = rid2;
	req.u.fwd.o.offset = req.u.fwd.q.offset;
	snprintf(needle, sizeof needle, "o overlaps q: regions %016llx and %016llx",
	         (unsigned long long)rid2, (unsigned long long)g_rid);
	expect_refused_unwritten(&req, FA_EOVERLAP, needle, "map the same memory");

	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	req.u.fwd.lse.region = rid2;
	req.u.fwd.lse.offset = req.u.fwd.v.offset;
	expect_refused_unwritten(&req, FA_EOVERLAP, "lse overlaps v: regions", "map the same memory");

	/* O and lse through the second registration at their own bytes: legal, and right. */
	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	req.u.fwd.o.region = rid2;
	req.u.fwd.lse.region = rid2;
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_OK);
	assert_true(fa_case_check(&cs, &l, g_shm.map, NULL, why, sizeof why));

	/* The second registration goes; the object and the first stay. */
	assert_int_equal(raw_unregister(rid2, &rep), FA_OK);
	fa_case_fill(&cs, &l, g_shm.map, &g_rng);
	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_OK);
	assert_true(fa_case_check(&cs, &l, g_shm.map, NULL, why, sizeof why));
	assert_serving();
}

/* ---- semantic checks of an attention request ----------------------------------------- */

struct sem_case {
	const char *name;
	fa_status want;
	bool raw; /* also as a raw request (false: the encoder cannot even express it) */
	void (*mutate)(fa_attn_fwd_args *a, const struct fa_case_layout *l, size_t region_size);
};

#define MUT(fn) static void fn(fa_attn_fwd_args *a, const struct fa_case_layout *l, size_t n)
#define UNUSED_MUT ((void)a, (void)l, (void)n)

MUT(mut_o_one_past_end) { (void)l; a->o.offset = n - (uint64_t)l->o_span * 2 + 2; }
MUT(mut_q_offset_past_region) { (void)l; a->q.offset = n + 64; }
MUT(mut_q_offset_near_max) { UNUSED_MUT; a->q.offset = UINT64_MAX - 63; }
MUT(mut_q_stride_overflows) { UNUSED_MUT; a->q.stride[1] = INT64_MAX / 4; }
MUT(mut_k_stride_bytes_overflow) { UNUSED_MUT; a->k.stride[1] = INT64_MAX / 16; }
MUT(mut_v_stride_huge) { UNUSED_MUT; a->v.stride[1] = INT64_C(1) << 40; }
MUT(mut_lse_past_end) { (void)l; a->lse.offset = n - 16; }
MUT(mut_q_offset_odd) { UNUSED_MUT; a->q.offset += 1; }
MUT(mut_o_offset_odd) { UNUSED_MUT; a->o.offset += 1; }
MUT(mut_o_is_q) { (void)n; a->o.offset = l->q_off; }
MUT(mut_o_inside_k) { (void)n; a->o.offset = l->k_off + 128; }
MUT(mut_lse_on_v) { (void)n; a->lse.offset = l->v_off; }
MUT(mut_k_fp32) { UNUSED_MUT; a->k.dtype = FA_DTYPE_FP32; }
MUT(mut_o_bf16) { UNUSED_MUT; a->o.dtype = FA_DTYPE_BF16; }
MUT(mut_lse_fp16) { UNUSED_MUT; a->lse.dtype = FA_DTYPE_FP16; }
MUT(mut_d12)
{
	UNUSED_MUT;
	a->q.shape[3] = a->k.shape[3] = a->v.shape[3] = a->o.shape[3] = 12;
}
MUT(mut_d264)
{
	UNUSED_MUT;
	a->q.shape[3] = a->k.shape[3] = a->v.shape[3] = a->o.shape[3] = 264;
}
MUT(mut_hq_not_multiple)
{
	UNUSED_MUT;
	a->q.shape[2] = a->o.shape[2] = 3;
	a->k.shape[2] = a->v.shape[2] = 2;
	a->lse.shape[1] = 3;
}
MUT(mut_batch_mismatch) { UNUSED_MUT; a->k.shape[0] = 2; }
MUT(mut_head_dim_strided) { UNUSED_MUT; a->q.stride[3] = 2; }
MUT(mut_kv_len_differ) { UNUSED_MUT; a->v.shape[1] = 8; }
MUT(mut_zero_seq) { UNUSED_MUT; a->q.shape[1] = a->o.shape[1] = a->lse.shape[2] = 0; }
MUT(mut_lse_shape) { UNUSED_MUT; a->lse.shape[2] = 8; }
MUT(mut_o_shape) { UNUSED_MUT; a->o.shape[1] = 8; }
MUT(mut_mask_bad) { UNUSED_MUT; a->mask = (fa_mask)7; }
MUT(mut_scale_nan) { UNUSED_MUT; a->scale = NAN; }
MUT(mut_prec_bad) { UNUSED_MUT; a->precision = (fa_precision)9; }

static const struct sem_case sem_cases[] = {
	{"O's extent ends one element past the region", FA_ERANGE, true, mut_o_one_past_end},
	{"q's offset is past the region", FA_ERANGE, true, mut_q_offset_past_region},
	{"q's offset is near 2^64", FA_ERANGE, true, mut_q_offset_near_max},
	{"q's stride times its size overflows", FA_ERANGE, true, mut_q_stride_overflows},
	{"k's extent in bytes overflows", FA_ERANGE, true, mut_k_stride_bytes_overflow},
	{"v's stride reaches 2^40 elements", FA_ERANGE, true, mut_v_stride_huge},
	{"lse's extent ends past the region", FA_ERANGE, true, mut_lse_past_end},
	{"q's offset is odd for fp16", FA_EALIGN, true, mut_q_offset_odd},
	{"o's offset is odd for fp16", FA_EALIGN, true, mut_o_offset_odd},
	{"O is Q", FA_EOVERLAP, true, mut_o_is_q},
	{"O starts inside K", FA_EOVERLAP, true, mut_o_inside_k},
	{"lse lies on V", FA_EOVERLAP, true, mut_lse_on_v},
	{"K is fp32 while Q is fp16", FA_EDTYPE, true, mut_k_fp32},
	{"O is bf16 while Q is fp16", FA_EDTYPE, true, mut_o_bf16},
	{"lse is fp16", FA_EDTYPE, true, mut_lse_fp16},
	{"head dim 12", FA_ESHAPE, true, mut_d12},
	{"head dim 264", FA_ESHAPE, true, mut_d264},
	{"Hq 3 with Hkv 2", FA_ESHAPE, true, mut_hq_not_multiple},
	{"batch of K differs", FA_ESHAPE, true, mut_batch_mismatch},
	{"head dim not contiguous", FA_ESHAPE, true, mut_head_dim_strided},
	{"V shorter than K", FA_ESHAPE, true, mut_kv_len_differ},
	{"zero query length", FA_ESHAPE, true, mut_zero_seq},
	{"lse's length differs from Sq", FA_ESHAPE, true, mut_lse_shape},
	{"O's length differs from Q's", FA_ESHAPE, true, mut_o_shape},
	{"mask 7", FA_EINVAL, false, mut_mask_bad},
	{"scale NaN", FA_EINVAL, false, mut_scale_nan},
	{"precision 9", FA_EINVAL, false, mut_prec_bad},
};

/* Every semantic case through the API: its status, a detail text, and not a byte written. */
static void test_bad_input_semantic_errors_through_api(void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	int wrong = 0;
	unsigned char *before = malloc(API_BUF_SIZE);
	assert_non_null(before);
	small_case(&cs, &l, &a);
	for (size_t i = 0; i < sizeof sem_cases / sizeof sem_cases[0]; i++) {
		fa_case_fill(&cs, &l, fa_buffer_data(g_buf), &g_rng);
		memcpy(before, fa_buffer_data(g_buf), API_BUF_SIZE);
		fa_case_args(&cs, &l, g_buf, &a);
		sem_cases[i].mutate(&a, &l, API_BUF_SIZE);
		fa_status st = fa_attn_fwd(g_c, &a);
		const char *det = fa_last_error_detail();
		bool same = !memcmp(before, fa_buffer_data(g_buf), API_BUF_SIZE);
		if (st != sem_cases[i].want || !det[0] || !same) {
			fprintf(stderr, "api: %s: got %s, want %s; detail '%s'%s\n", sem_cases[i].name,
			        fa_status_name(st), fa_status_name(sem_cases[i].want), det,
			        same ? "" : "; THE BUFFER WAS WRITTEN");
			wrong++;
		}
	}
	free(before);
	assert_int_equal(wrong, 0);
	/* And the client still works. */
	char why[256];
	fa_case_fill(&cs, &l, fa_buffer_data(g_buf), &g_rng);
	fa_case_args(&cs, &l, g_buf, &a);
	assert_int_equal(fa_attn_fwd(g_c, &a), FA_OK);
	assert_true(fa_case_check(&cs, &l, fa_buffer_data(g_buf), NULL, why, sizeof why));
}

/* The same cases as raw requests, past any check the client library makes. */
static void test_bad_input_semantic_errors_reach_daemon_checks(void **state)
{
	(void)state;
	struct fa_case cs;
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	int wrong = 0;
	unsigned char *before = malloc(SHM_SIZE);
	assert_non_null(before);
	small_case(&cs, &l, &a);
	for (size_t i = 0; i < sizeof sem_cases / sizeof sem_cases[0]; i++) {
		if (!sem_cases[i].raw)
			continue;
		fa_case_fill(&cs, &l, g_shm.map, &g_rng);
		memcpy(before, g_shm.map, SHM_SIZE);
		fa_case_args(&cs, &l, FA_RAW_BUF, &a);
		sem_cases[i].mutate(&a, &l, SHM_SIZE);
		fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
		int st = fa_raw_call(g_raw, &req, &rep);
		bool same = !memcmp(before, g_shm.map, SHM_SIZE);
		if (st != (int)sem_cases[i].want || !rep.detail[0] || !same) {
			fprintf(stderr, "raw: %s: got %d %s, want %s; detail '%s'%s\n", sem_cases[i].name,
			        st, st >= 0 ? fa_status_name((fa_status)st) : "",
			        fa_status_name(sem_cases[i].want), st >= 0 ? rep.detail : "",
			        same ? "" : "; THE REGION WAS WRITTEN");
			wrong++;
		}
	}
	free(before);
	assert_int_equal(wrong, 0);
	assert_serving();
}

/* ---- sizes ---------------------------------------------------------------------------------- */

/* A valid-looking PING padded with a long name string to exactly `total` bytes. */
static size_t padded_ping(unsigned char *out, size_t total)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 5);
	pk_kv_u64(&pk, "v", FA_PROTO_VERSION);
	pk_kv_u64(&pk, "op", FA_OP_PING);
	pk_kv_u64(&pk, "seq", g_seq++);
	pk_kv_u64(&pk, "sid", g_sid);
	msgpack_pack_str_with_body(&pk, "name", 4);
	/* The string's own header is 3 bytes (str16) below 64 KiB of body and 5 (str32) above. */
	size_t body = total - sb.size - 3;
	if (body > 0xffff)
		body = total - sb.size - 5;
	msgpack_pack_str(&pk, (uint32_t)body);
	memcpy(out, sb.data, sb.size);
	memset(out + sb.size, 'x', body);
	size_t n = sb.size + body;
	msgpack_sbuffer_destroy(&sb);
	return n;
}

static void test_bad_input_oversize_message_gets_etoobig(void **state)
{
	(void)state;
	size_t cap = 80 * 1024;
	unsigned char *m = malloc(cap);
	assert_non_null(m);
	size_t n = padded_ping(m, 70 * 1024);
	assert_int_equal(n, 70 * 1024);
	expect_bytes("70 KiB", m, n, FA_ETOOBIG);
	n = padded_ping(m, FA_PROTO_MAX_MSG + 1);
	assert_int_equal(n, FA_PROTO_MAX_MSG + 1);
	expect_bytes("64 KiB + 1", m, n, FA_ETOOBIG);
	/* At the limit the size is fine and the message is refused for what it is (a key too many). */
	n = padded_ping(m, FA_PROTO_MAX_MSG);
	assert_int_equal(n, FA_PROTO_MAX_MSG);
	expect_bytes("64 KiB", m, n, FA_EPROTO);
	free(m);
	assert_serving();
}

/* ---- shared memory names and owners -------------------------------------------------- */

static void test_bad_input_shm_name_outside_pattern_is_refused(void **state)
{
	(void)state;
	struct fa_proto_rep rep;
	uint64_t rid;
	char name[FA_PROTO_SHM_NAME_MAX];
	struct {
		const char *name;
	} bad[] = {{"/bogus"}, {"fa.0.1.0123456789abcdef"}, {"/fa.x.y.z"},
	           {"/fa.0.1.0123456789abcdef/../../etc"}, {"/fa.0.1.0123456789ABCDEG"}, {""}};
	int wrong = 0;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int st = fa_raw_register(g_raw, g_sid, g_seq++, bad[i].name, 4096, &rid, &rep);
		if (st != FA_EINVAL || !rep.detail[0]) {
			fprintf(stderr, "shm name '%s': got %d %s\n", bad[i].name, st,
			        st >= 0 ? fa_status_name((fa_status)st) : "");
			wrong++;
		}
	}
	/* A name of the right pattern whose object does not exist. */
	snprintf(name, sizeof name, "/fa.%u.%d.%016llx", (unsigned)getuid(), (int)getpid(),
	         (unsigned long long)fa_rand_next(&g_rng));
	int st = fa_raw_register(g_raw, g_sid, g_seq++, name, 4096, &rid, &rep);
	if (st != FA_EINVAL) {
		fprintf(stderr, "shm name of no object: got %d (%s)\n", st, rep.detail);
		wrong++;
	}
	/* A real object smaller than the declared size. */
	struct fa_raw_shm m;
	assert_int_equal(fa_raw_shm_create(&m, 4096, &g_rng), 0);
	st = fa_raw_register(g_raw, g_sid, g_seq++, m.name, 8192, &rid, &rep);
	if (st != FA_ERANGE) {
		fprintf(stderr, "shm smaller than declared: got %d %s\n", st,
		        st >= 0 ? fa_status_name((fa_status)st) : "");
		wrong++;
	}
	/* Size 0. */
	st = fa_raw_register(g_raw, g_sid, g_seq++, m.name, 0, &rid, &rep);
	if (st != FA_EINVAL) {
		fprintf(stderr, "size 0: got %d (%s)\n", st, rep.detail);
		wrong++;
	}
	fa_raw_shm_destroy(&m);

	/* A symbolic link planted in /dev/shm under a valid name: never followed. */
	char link_path[128];
	snprintf(name, sizeof name, "/fa.%u.%d.%016llx", (unsigned)getuid(), (int)getpid(),
	         (unsigned long long)fa_rand_next(&g_rng));
	snprintf(link_path, sizeof link_path, "/dev/shm%s", name);
	if (symlink("/etc/passwd", link_path) == 0) {
		st = fa_raw_register(g_raw, g_sid, g_seq++, name, 16, &rid, &rep);
		unlink(link_path);
		if (st == FA_OK) {
			fprintf(stderr, "a symlink in /dev/shm was followed\n");
			wrong++;
		}
	}
	assert_int_equal(wrong, 0);
	assert_serving();
}

static void test_bad_input_foreign_owned_shm_gets_eperm(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		fprintf(stderr, "skip: not root: cannot make a shm object owned by another uid\n");
		skip();
	}
	struct fa_raw_shm m;
	struct fa_proto_rep rep;
	uint64_t rid;
	assert_int_equal(fa_raw_shm_create(&m, 4096, &g_rng), 0);
	assert_int_equal(fchown(m.fd, 65534, 65534), 0);
	int st = fa_raw_register(g_raw, g_sid, g_seq++, m.name, 4096, &rid, &rep);
	fa_raw_shm_destroy(&m);
	if (st != FA_EPERM)
		fprintf(stderr, "foreign-owned shm: got %d (%s)\n", st, rep.detail);
	assert_int_equal(st, FA_EPERM);
}

/* ---- limits --------------------------------------------------------------------------------- */

static void test_bad_input_regions_beyond_max_get_elimit(void **state)
{
	(void)state;
	struct fa_daemon d;
	int shm0 = fa_test_count_shm(getpid());
	assert_int_equal(daemon_start(&d, "--max-regions", "3", NULL), 0);
	fa_client *c = NULL;
	fa_buffer *b[4] = {0};
	assert_int_equal(fa_client_open(&c, d.url), FA_OK);
	for (int i = 0; i < 3; i++)
		assert_int_equal(fa_buffer_alloc_host(c, 4096, &b[i]), FA_OK);
	assert_int_equal(fa_buffer_alloc_host(c, 4096, &b[3]), FA_ELIMIT);
	assert_null(b[3]);
	assert_true(fa_last_error_detail()[0] != '\0');
	/* Freeing one makes room again. */
	assert_int_equal(fa_buffer_free(b[0]), FA_OK);
	assert_int_equal(fa_buffer_alloc_host(c, 4096, &b[0]), FA_OK);
	for (int i = 0; i < 3; i++)
		fa_buffer_free(b[i]);
	/* The refused allocation left no shm object behind. */
	assert_int_equal(fa_test_count_shm(getpid()), shm0);
	fa_client_close(c);
	assert_int_equal(daemon_stop(&d), 0);
	assert_true(daemon_log_clean(&d));
	daemon_cleanup(&d);
}

#define NBUSY 6

static void test_bad_input_inflight_beyond_max_gets_ebusy(void **state)
{
	(void)state;
	struct fa_daemon d;
	struct fa_proto_rep rep;
	assert_int_equal(daemon_start(&d, "--max-inflight", "2", "--threads", "1", NULL), 0);
	int s0 = fa_raw_open(d.url, fa_test_ms(60000));
	assert_true(s0 >= 0);
	uint64_t sid = fa_raw_hello(s0, 1, &rep);
	assert_true(sid != 0);

	/* A problem that takes a while on the CPU backend; each request its own O. */
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 512, .Sk = 512, .Hq = 2,
	                     .Hkv = 2, .D = 64, .precision = FA_PREC_IEEE};
	struct fa_case_layout l;
	fa_case_layout(&cs, &l);
	size_t obytes = fa_case_round_up((uint64_t)l.o_span * 4, FA_CASE_ALIGN);
	size_t size = l.total + NBUSY * obytes;
	struct fa_raw_shm m;
	uint64_t rid;
	assert_int_equal(fa_raw_shm_create(&m, size, &g_rng), 0);
	assert_int_equal(fa_raw_register(s0, sid, 2, m.name, size, &rid, &rep), FA_OK);
	fa_case_fill(&cs, &l, m.map, &g_rng);

	int s[NBUSY];
	for (int i = 0; i < NBUSY; i++) {
		s[i] = fa_raw_open(d.url, fa_test_ms(60000));
		assert_true(s[i] >= 0);
	}
	/* Connect every socket first (a PING each), so the requests then arrive together. */
	for (int i = 0; i < NBUSY; i++)
		assert_int_equal(fa_raw_simple(s[i], FA_OP_PING, sid, 10 + (uint64_t)i, &rep), FA_OK);
	unsigned char msg[NBUSY][4096];
	size_t len[NBUSY];
	for (int i = 0; i < NBUSY; i++) {
		fa_attn_fwd_args a;
		struct fa_proto_req req;
		fa_case_args(&cs, &l, FA_RAW_BUF, &a);
		a.o.offset = l.total + (uint64_t)i * obytes;
		fa_raw_fwd_req(&a, sid, 100 + (uint64_t)i, rid, &req);
		assert_int_equal(fa_proto_encode_req(&req, msg[i], sizeof msg[i], &len[i]), FA_OK);
	}
	for (int i = 0; i < NBUSY; i++)
		assert_int_equal(fa_raw_send(s[i], msg[i], len[i]), 0);
	int ok = 0, busy = 0, other = 0;
	for (int i = 0; i < NBUSY; i++) {
		int st = fa_raw_recv(s[i], &rep, NULL, 0, NULL);
		if (st == FA_OK) {
			struct fa_case_layout li = l;
			char why[256];
			li.o_off = l.total + (uint64_t)i * obytes;
			ok++;
			if (!fa_case_check(&cs, &li, m.map, NULL, why, sizeof why)) {
				fprintf(stderr, "request %d: %s\n", i, why);
				other++;
			}
		} else if (st == FA_EBUSY) {
			busy++;
		} else {
			fprintf(stderr, "request %d: got %d\n", i, st);
			other++;
		}
	}
	fprintf(stderr, "max-inflight 2: %d ok, %d busy\n", ok, busy);
	assert_int_equal(other, 0);
	assert_true(ok >= 1);
	assert_true(busy >= 1);
	assert_int_equal(fa_raw_simple(s0, FA_OP_STATS, sid, 3, &rep), FA_OK);
	uint64_t nbusy = 0;
	assert_true(fa_stats_u64(rep.u.stats.text, "requests_busy", &nbusy));
	assert_int_equal(nbusy, (uint64_t)busy);
	for (int i = 0; i < NBUSY; i++)
		nn_close(s[i]);
	nn_close(s0);
	fa_raw_shm_destroy(&m);
	assert_int_equal(daemon_stop(&d), 0);
	assert_true(daemon_log_clean(&d));
	daemon_cleanup(&d);
}

/* ---- duplicates ------------------------------------------------------------------------------ */

/* The same (session, seq) twice from two sockets, one after the other: computed once, and both
 * get the same reply bytes. */
static void test_bad_input_duplicate_request_is_computed_once(void **state)
{
	(void)state;
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 192, .Sk = 192, .Hq = 2,
	                     .Hkv = 1, .D = 64, .precision = FA_PREC_IEEE, .lse = true};
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	struct fa_proto_req req;
	struct fa_proto_rep rep1, rep2;
	unsigned char msg[4096], r1[1024], r2[1024];
	size_t len, n1 = 0, n2 = 0;
	char why[256];
	fa_case_layout(&cs, &l);
	assert_true(l.total <= SHM_SIZE);
	int sb = fa_raw_open(g_d.url, fa_test_ms(30000));
	assert_true(sb >= 0);
	uint64_t dedup0 = raw_stat("requests_deduped");
	assert_true(dedup0 != UINT64_MAX);

	fa_case_fill(&cs, &l, g_shm.map, &g_rng);
	fa_case_args(&cs, &l, FA_RAW_BUF, &a);
	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	assert_int_equal(fa_proto_encode_req(&req, msg, sizeof msg, &len), FA_OK);
	assert_int_equal(fa_raw_send(g_raw, msg, len), 0);
	int st1 = fa_raw_recv(g_raw, &rep1, r1, sizeof r1, &n1);
	assert_int_equal(st1, FA_OK);
	assert_true(fa_case_check(&cs, &l, g_shm.map, NULL, why, sizeof why));
	/* Poison O again: a second computation would be caught writing it. */
	fa_case_poison_dt((char *)g_shm.map + l.o_off, cs.dtype, (size_t)l.o_span);
	assert_int_equal(fa_raw_send(sb, msg, len), 0);
	int st2 = fa_raw_recv(sb, &rep2, r2, sizeof r2, &n2);
	assert_int_equal(st2, FA_OK);
	assert_int_equal(n1, n2);
	assert_memory_equal(r1, r2, n1);
	assert_true(fa_case_is_poison((char *)g_shm.map + l.o_off, cs.dtype, 0));
	assert_int_equal(raw_stat("requests_deduped") - dedup0, 1);
	nn_close(sb);
}

/* Both copies in flight at once (what a REQ resend after a reconnect looks like): computed once;
 * the daemon answers the copy that arrived last (dedupe.h: the newest copy is the one a client
 * waits on), and an answer to the other copy, if any, carries the same bytes. */
static void test_bad_input_duplicate_in_flight_is_computed_once(void **state)
{
	(void)state;
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 256, .Sk = 256, .Hq = 2,
	                     .Hkv = 1, .D = 64, .precision = FA_PREC_IEEE};
	struct fa_case_layout l;
	fa_attn_fwd_args a;
	struct fa_proto_req req;
	struct fa_proto_rep rep;
	unsigned char msg[4096], r[2][1024];
	size_t len, n[2] = {0, 0};
	char why[256];
	fa_case_layout(&cs, &l);
	assert_true(l.total <= SHM_SIZE);
	int s[2] = {fa_raw_open(g_d.url, fa_test_ms(30000)), fa_raw_open(g_d.url, fa_test_ms(30000))};
	assert_true(s[0] >= 0 && s[1] >= 0);
	for (int i = 0; i < 2; i++) /* connect both before the race */
		assert_int_equal(fa_raw_simple(s[i], FA_OP_PING, g_sid, g_seq++, &rep), FA_OK);
	uint64_t dedup0 = raw_stat("requests_deduped");

	fa_case_fill(&cs, &l, g_shm.map, &g_rng);
	fa_case_args(&cs, &l, FA_RAW_BUF, &a);
	fa_raw_fwd_req(&a, g_sid, g_seq++, g_rid, &req);
	assert_int_equal(fa_proto_encode_req(&req, msg, sizeof msg, &len), FA_OK);
	assert_int_equal(fa_raw_send(s[0], msg, len), 0);
	assert_int_equal(fa_raw_send(s[1], msg, len), 0);

	/* The first answer, within the bound; then a short grace for a second one. */
	struct nn_pollfd pfd[2] = {{s[0], NN_POLLIN, 0}, {s[1], NN_POLLIN, 0}};
	int got = nn_poll(pfd, 2, fa_test_ms(30000));
	assert_true(got >= 1);
	if (got < 2) {
		pfd[0].revents = pfd[1].revents = 0;
		nn_poll(pfd, 2, fa_test_ms(1000));
	}
	int answered = 0, first = -1;
	for (int i = 0; i < 2; i++) {
		if (!(pfd[i].revents & NN_POLLIN))
			continue;
		assert_int_equal(fa_raw_recv(s[i], &rep, r[i], sizeof r[i], &n[i]), FA_OK);
		answered++;
		if (first < 0)
			first = i;
		else
			assert_memory_equal(r[first], r[i], n[i] < n[first] ? n[i] : n[first]);
	}
	fprintf(stderr, "duplicate in flight: %d of 2 copies answered\n", answered);
	assert_true(answered >= 1);
	assert_true(fa_case_check(&cs, &l, g_shm.map, NULL, why, sizeof why));
	assert_int_equal(raw_stat("requests_deduped") - dedup0, 1);
	nn_close(s[0]);
	nn_close(s[1]);
}

/* ---- asynchronous mode ----------------------------------------------------------------------- */

/* An asynchronous ATTN_FWD of the small case in session sid (slot 3, a made-up client event). */
static void async_req(uint64_t sid, uint64_t seq, uint64_t rid, struct fa_proto_req *req)
{
	struct fa_case cs;
	struct fa_case_layout l;
	fa_attn_fwd_args a;

	small_case(&cs, &l, &a);
	fa_raw_fwd_req(&a, sid, seq, rid, req);
	req->u.fwd.async = true;
	req->u.fwd.slot = 3;
	req->u.fwd.has_event = true;
	memset(req->u.fwd.event, 0x42, sizeof req->u.fwd.event);
}

/* The child of the cross-user case, exec'd fresh (nanomsg does not survive a fork): as uid
 * 65534, open a session and ask for the asynchronous mode. Exit 0 when the daemon says
 * FA_EPERM with the reason. */
static int foreign_async_main(const char *url)
{
	struct fa_proto_req req;
	struct fa_proto_rep rep;

	if (setgid(65534) != 0 || setuid(65534) != 0) {
		perror("foreign async child: setuid 65534");
		return 10;
	}
	int s = fa_raw_open(url, fa_test_ms(10000));
	uint64_t sid = s >= 0 ? fa_raw_hello(s, 1, &rep) : 0;
	if (sid == 0) {
		fprintf(stderr, "foreign async child: no session as uid 65534 at %s\n", url);
		return 11;
	}
	async_req(sid, 2, 12345, &req);
	int st = fa_raw_call(s, &req, &rep);
	fprintf(stderr, "foreign async child: %s: %s\n", fa_status_name(st), rep.detail);
	if (st != FA_EPERM || strstr(rep.detail, "one user") == NULL)
		return 12;
	/* Completion words are IPC memory, which opens across users: no uid refusal (the CPU
	 * backend then says it serves no asynchronous mode). */
	req.seq = 4;
	req.u.fwd.has_event = false;
	req.u.fwd.words_region = 777;
	req.u.fwd.words_seq = 1;
	st = fa_raw_call(s, &req, &rep);
	fprintf(stderr, "foreign async child, completion words: %s: %s\n", fa_status_name(st),
	        rep.detail);
	if (st != FA_ENOTSUP)
		return 14;
	req.u.fwd.words_region = 0;
	/* The synchronous mode is still offered: the same request without the slot gets past
	 * the uid check (to the region check: 12345 is nobody's region). */
	req.seq = 3;
	req.u.fwd.async = req.u.fwd.has_event = false;
	st = fa_raw_call(s, &req, &rep);
	fprintf(stderr, "foreign async child, synchronous: %s: %s\n", fa_status_name(st),
	        rep.detail);
	return st == FA_EREGION ? 0 : 13;
}

static void test_bad_input_async_mode_needs_the_gpu_backend_and_the_daemons_user(void **state)
{
	(void)state;
	struct fa_proto_req req;
	struct fa_proto_rep rep;

	/* Same user, CPU backend: a clear FA_ENOTSUP naming the backend. */
	async_req(g_sid, g_seq++, g_rid, &req);
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_ENOTSUP);
	assert_non_null(strstr(rep.detail, "GPU backend"));
	/* The same with completion words instead of the event. */
	async_req(g_sid, g_seq++, g_rid, &req);
	req.u.fwd.has_event = false;
	req.u.fwd.words_region = g_rid;
	req.u.fwd.words_seq = 1;
	assert_int_equal(fa_raw_call(g_raw, &req, &rep), FA_ENOTSUP);
	assert_non_null(strstr(rep.detail, "GPU backend"));
	/* The API refuses host buffers before anything is sent. */
	fa_attn_fwd_args a;
	struct fa_case cs;
	struct fa_case_layout l;
	cs = (struct fa_case){.dtype = FA_DTYPE_FP16, .B = 1, .Sq = 16, .Sk = 16, .Hq = 2,
	                      .Hkv = 1, .D = 64};
	fa_case_layout(&cs, &l);
	fa_case_args(&cs, &l, g_buf, &a);
	assert_int_equal(fa_attn_fwd_async(g_c, &a, NULL), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "host buffer"));
	assert_serving();

	/* Another user: FA_EPERM before anything else (the driver's IPC event files are 0600). */
	if (geteuid() != 0) {
		fprintf(stderr, "the cross-user case needs root (to become uid 65534): skipped\n");
		skip();
	}
	assert_int_equal(daemon_run_self_for_another_user(&g_d, "test_bad_input", "--foreign-async",
	                                                  20000), 0);
	assert_serving();
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--foreign-async") == 0)
		return foreign_async_main(argv[2]);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_input_async_mode_needs_the_gpu_backend_and_the_daemons_user),
		cmocka_unit_test(test_bad_input_garbage_msgpack_gets_eproto),
		cmocka_unit_test(test_bad_input_wrong_version_gets_eversion),
		cmocka_unit_test(test_bad_input_unknown_op_gets_eproto),
		cmocka_unit_test(test_bad_input_unknown_session_gets_esession),
		cmocka_unit_test(test_bad_input_unknown_and_foreign_regions_get_eregion),
		cmocka_unit_test(
		    test_bad_input_output_over_an_input_through_a_second_registration_gets_eoverlap),
		cmocka_unit_test(test_bad_input_semantic_errors_through_api),
		cmocka_unit_test(test_bad_input_semantic_errors_reach_daemon_checks),
		cmocka_unit_test(test_bad_input_oversize_message_gets_etoobig),
		cmocka_unit_test(test_bad_input_shm_name_outside_pattern_is_refused),
		cmocka_unit_test(test_bad_input_foreign_owned_shm_gets_eperm),
		cmocka_unit_test(test_bad_input_regions_beyond_max_get_elimit),
		cmocka_unit_test(test_bad_input_inflight_beyond_max_gets_ebusy),
		cmocka_unit_test(test_bad_input_duplicate_request_is_computed_once),
		cmocka_unit_test(test_bad_input_duplicate_in_flight_is_computed_once),
		/* Last: bytes below the messaging layer (a daemon broken by them fails only these). */
		cmocka_unit_test(test_bad_input_hand_framed_garbage_gets_eproto_reply),
		cmocka_unit_test(test_bad_input_raw_socket_junk_keeps_daemon_serving),
	};
	if (getenv("FA_TEST_FILTER")) /* run only the tests matching a pattern */
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
