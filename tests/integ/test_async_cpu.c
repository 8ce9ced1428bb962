/* test_async_cpu.c - the asynchronous backward and inference calls where no GPU is: the wire
 * and the daemon's answers on the CPU backend (which has no asynchronous mode: FA_ENOTSUP with a
 * reason, on the socket and through the submission ring), malformed and unknown requests, the
 * ring's features word, the client's own checks (host buffers and host index tables refused
 * before anything is sent), and a daemon acting as the release before these calls
 * (FA_TEST_OLD_DAEMON=1): no feature bits, the new keys refused with that release's decoder's
 * text ("key 'wrg' not allowed in a ATTN_BWD request"), which is what the client's socket
 * fallback keys on. The GPU side is tests/integ/test_gpu_async.c.
 */
#include <fcntl.h>
#include <linux/futex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"
#include "fa_raw.h"
#include "fa_raw_ring.h"

static struct fa_daemon g_d;

static int setup(void **state)
{
	(void)state;
	if (daemon_start(&g_d, "--threads", "2", NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return daemon_finish(&g_d);
}

static struct fa_proto_tensor wt(uint64_t r, int64_t B, int64_t S, int64_t H, int64_t D)
{
	struct fa_proto_tensor t = {.region = r, .dtype = FA_DTYPE_FP16, .shape = {B, S, H, D},
	                            .stride = {S * H * D, H * D, D, 1}};
	return t;
}

static struct fa_proto_index wi(uint64_t r, int64_t n)
{
	struct fa_proto_index t = {.region = r, .shape = {n, 1}, .stride = {1, 1}};
	return t;
}

/* An asynchronous ATTN_BWD with completion words (region ids need not exist: the CPU backend
 * refuses before looking). */
static struct fa_proto_req bwd_async(uint64_t sid, uint64_t seq)
{
	struct fa_proto_req r;
	memset(&r, 0, sizeof r);
	r.op = FA_OP_ATTN_BWD;
	r.session = sid;
	r.seq = seq;
	r.u.bwd.q = r.u.bwd.o = r.u.bwd.dout = r.u.bwd.dq = wt(5, 1, 16, 2, 64);
	r.u.bwd.k = r.u.bwd.v = r.u.bwd.dk = r.u.bwd.dv = wt(5, 1, 16, 2, 64);
	r.u.bwd.lse = wt(5, 1, 2, 16, 1);
	r.u.bwd.lse.dtype = FA_DTYPE_FP32;
	r.u.bwd.async = true;
	r.u.bwd.slot = 1;
	r.u.bwd.words_region = 9;
	r.u.bwd.words_seq = 1;
	return r;
}

/* An asynchronous ATTN_VARLEN or ATTN_KVCACHE (decode: 1 query per sequence). */
static struct fa_proto_req infer_async(uint32_t op, uint64_t sid, uint64_t seq)
{
	struct fa_proto_req r;
	memset(&r, 0, sizeof r);
	r.op = op;
	r.session = sid;
	r.seq = seq;
	if (op == FA_OP_ATTN_VARLEN) {
		r.u.infer.q = r.u.infer.o = wt(5, 1, 32, 4, 64);
		r.u.infer.k = r.u.infer.v = wt(5, 1, 64, 4, 64);
		r.u.infer.cu_q = r.u.infer.cu_k = wi(6, 3);
	} else {
		r.u.infer.q = r.u.infer.o = wt(5, 2, 1, 4, 64);
		r.u.infer.k = r.u.infer.v = wt(5, 2, 128, 4, 64);
		r.u.infer.cache_len = wi(6, 2);
	}
	r.u.infer.async = true;
	r.u.infer.slot = 2;
	r.u.infer.words_region = 9;
	r.u.infer.words_seq = 1;
	return r;
}

/* The CPU backend has no asynchronous mode: each new asynchronous request gets FA_ENOTSUP
 * saying so (on the socket), the synchronous forms of the same requests get past that point. */
static void test_cpu_daemon_refuses_async_bwd_and_inference_with_enotsup(void **state)
{
	(void)state;
	struct fa_proto_rep rep;
	uint64_t seq = 0;
	int s = fa_raw_open(g_d.url, fa_test_ms(5000));
	assert_true(s >= 0);
	uint64_t sid = fa_raw_hello(s, ++seq, &rep);
	assert_true(sid != 0);

	struct fa_proto_req r = bwd_async(sid, ++seq);
	assert_int_equal(fa_raw_call(s, &r, &rep), FA_ENOTSUP);
	printf("  async ATTN_BWD: %s\n", rep.detail);
	assert_non_null(strstr(rep.detail, "needs the GPU backend"));
	static const uint32_t ops[2] = {FA_OP_ATTN_VARLEN, FA_OP_ATTN_KVCACHE};
	for (int i = 0; i < 2; i++) {
		r = infer_async(ops[i], sid, ++seq);
		assert_int_equal(fa_raw_call(s, &r, &rep), FA_ENOTSUP);
		printf("  async %s: %s\n", fa_proto_op_name(ops[i]), rep.detail);
		assert_non_null(strstr(rep.detail, "needs the GPU backend"));
		/* synchronous: past the mode's check, refused for its unregistered regions */
		r.u.infer.async = false;
		r.u.infer.words_region = r.u.infer.words_seq = 0;
		r.seq = ++seq;
		assert_int_equal(fa_raw_call(s, &r, &rep), FA_EREGION);
	}
	fa_raw_simple(s, FA_OP_BYE, sid, ++seq, &rep);
	nn_close(s);
	assert_true(daemon_alive(&g_d));
}

/* Bytes an older or broken client could send: an unknown op (the reserved 25), another
 * version, a slot without words on an inference op, words without a slot. Each is answered
 * with its status, the session goes on. */
static void test_daemon_answers_malformed_and_unknown_async_requests(void **state)
{
	(void)state;
	struct fa_proto_rep rep;
	unsigned char buf[FA_PROTO_MAX_MSG];
	size_t len;
	uint64_t seq = 0;
	int s = fa_raw_open(g_d.url, fa_test_ms(5000));
	assert_true(s >= 0);
	uint64_t sid = fa_raw_hello(s, ++seq, &rep);
	assert_true(sid != 0);

	/* op 25 (reserved): patch a PING's op */
	struct fa_proto_req p;
	memset(&p, 0, sizeof p);
	p.op = FA_OP_PING;
	p.session = sid;
	p.seq = ++seq;
	assert_int_equal(fa_proto_encode_req(&p, buf, sizeof buf, &len), FA_OK);
	unsigned char *at = memmem(buf, len, "\xa2op\x03", 4);
	assert_non_null(at);
	at[3] = 25;
	assert_int_equal(fa_raw_call_bytes(s, buf, len, &rep), FA_EPROTO);
	assert_non_null(strstr(rep.detail, "unknown op 25"));
	/* another version: "v" 1 -> 2 */
	struct fa_proto_req r = infer_async(FA_OP_ATTN_KVCACHE, sid, ++seq);
	assert_int_equal(fa_proto_encode_req(&r, buf, sizeof buf, &len), FA_OK);
	at = memmem(buf, len, "\xa1v\x01", 3);
	assert_non_null(at);
	at[2] = 2;
	assert_int_equal(fa_raw_call_bytes(s, buf, len, &rep), FA_EVERSION);
	/* a slot without words: the words key renamed away ("wrg" -> "wrX", an unknown key) and
	 * the slot alone, hand-built: both FA_EPROTO */
	r.seq = ++seq;
	assert_int_equal(fa_proto_encode_req(&r, buf, sizeof buf, &len), FA_OK);
	at = memmem(buf, len, "\xa3wrg", 4);
	assert_non_null(at);
	at[3] = 'X';
	assert_int_equal(fa_raw_call_bytes(s, buf, len, &rep), FA_EPROTO);
	assert_non_null(strstr(rep.detail, "wrX"));
	/* a truncated request */
	r.seq = ++seq;
	assert_int_equal(fa_proto_encode_req(&r, buf, sizeof buf, &len), FA_OK);
	assert_int_equal(fa_raw_call_bytes(s, buf, len - 3, &rep), FA_EPROTO);
	/* the session still serves */
	assert_int_equal(fa_raw_simple(s, FA_OP_PING, sid, ++seq, &rep), FA_OK);
	fa_raw_simple(s, FA_OP_BYE, sid, ++seq, &rep);
	nn_close(s);
	assert_true(daemon_alive(&g_d));
}

/* Through a ring: the header says which new requests the daemon knows; each asynchronous
 * backward or inference entry comes back as a completion with FA_ENOTSUP (its tag, its reason),
 * a truncated one FA_EPROTO, an unknown op FA_EPROTO, another version FA_EVERSION, and the
 * ring serves on. */
static void test_ring_says_its_features_and_answers_async_entries(void **state)
{
	(void)state;
	struct fa_raw_ring r;
	struct fa_proto_rep rep;
	uint64_t rng = 0x5eed;
	uint32_t tag;

	fa_raw_ring_open(&r, g_d.url, &rng, FA_OK);
	assert_int_equal(__atomic_load_n(&r.h->features, __ATOMIC_SEQ_CST), FA_RING_FEATURES);
	struct fa_proto_req q = bwd_async(r.sid, ++r.seq);
	fa_raw_ring_push_req(&r, &q, 11);
	q = infer_async(FA_OP_ATTN_VARLEN, r.sid, ++r.seq);
	fa_raw_ring_push_req(&r, &q, 12);
	q = infer_async(FA_OP_ATTN_KVCACHE, r.sid, ++r.seq);
	fa_raw_ring_push_req(&r, &q, 13);
	for (uint32_t want = 11; want <= 13; want++) {
		assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_ENOTSUP);
		assert_int_equal(tag, want);
		assert_non_null(strstr(rep.detail, "needs the GPU backend"));
	}
	/* malformed: the KV-cache entry cut short; an unknown op */
	unsigned char buf[FA_RING_MSG_MAX];
	size_t len;
	assert_int_equal(fa_proto_encode_req(&q, buf, sizeof buf, &len), FA_OK);
	fa_raw_ring_push(&r, buf, (uint32_t)len / 2, 14);
	assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_EPROTO);
	assert_int_equal(tag, 14);
	struct fa_proto_req p;
	memset(&p, 0, sizeof p);
	p.op = FA_OP_PING;
	p.session = r.sid;
	p.seq = ++r.seq;
	assert_int_equal(fa_proto_encode_req(&p, buf, sizeof buf, &len), FA_OK);
	unsigned char *at = memmem(buf, len, "\xa2op\x03", 4);
	assert_non_null(at);
	at[3] = 25;
	fa_raw_ring_push(&r, buf, (uint32_t)len, 15);
	assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_EPROTO);
	assert_int_equal(tag, 15);
	/* another protocol version: an asynchronous decode entry with "v" 2 */
	q.seq = ++r.seq;
	assert_int_equal(fa_proto_encode_req(&q, buf, sizeof buf, &len), FA_OK);
	at = memmem(buf, len, "\xa1v\x01", 3);
	assert_non_null(at);
	at[2] = 2;
	fa_raw_ring_push(&r, buf, (uint32_t)len, 16);
	assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_EVERSION);
	assert_int_equal(tag, 16);
	p.seq = ++r.seq;
	fa_raw_ring_push_req(&r, &p, 17);
	assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_OK);
	assert_int_equal(__atomic_load_n(&r.h->dead, __ATOMIC_SEQ_CST), FA_RING_LIVE);
	fa_raw_ring_close(&r);
	assert_true(daemon_alive(&g_d));
}

/* The client's own checks, before anything is sent: host tensors, and host index tables, are
 * refused for the asynchronous calls with the reason (these are the buffers a machine without
 * a GPU has); the synchronous calls on the same arguments run. */
static void test_client_refuses_host_buffers_for_async_calls_before_sending(void **state)
{
	(void)state;
	fa_client *c = NULL;
	fa_buffer *b = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	fa_client_set_timeout(c, fa_test_ms(10000));
	assert_int_equal(fa_integ_buffer(c, &b, 1 << 20), FA_OK);
	/* decode: B=2, one query each, 8 cached keys of 64, fp16, H=2 */
	fa_tensor q = {b, 0, FA_DTYPE_FP16, {2, 1, 2, 64}, {128, 128, 64, 1}};
	fa_tensor k = {b, 4096, FA_DTYPE_FP16, {2, 8, 2, 64}, {1024, 128, 64, 1}};
	fa_tensor v = {b, 12288, FA_DTYPE_FP16, {2, 8, 2, 64}, {1024, 128, 64, 1}};
	fa_tensor o = {b, 20480, FA_DTYPE_FP16, {2, 1, 2, 64}, {128, 128, 64, 1}};
	memset((char *)fa_buffer_data(b), 0, 1 << 20);
	int32_t *lens = (int32_t *)((char *)fa_buffer_data(b) + 65536);
	lens[0] = 8;
	lens[1] = 5;
	fa_attn_kvcache_args a = {.q = q, .k = k, .v = v, .o = o,
	                          .cache_seqlens = {b, 65536, {2, 1}, {1, 1}}};
	assert_int_equal(fa_attn_kvcache(c, &a), FA_OK);
	fa_status st = fa_attn_kvcache_async(c, &a, NULL);
	printf("  fa_attn_kvcache_async on host memory: %s: %s\n", fa_status_name(st),
	       fa_last_error_detail());
	assert_int_equal(st, FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "host buffer"));
	fa_attn_varlen_args va = {.q = {b, 0, FA_DTYPE_FP16, {1, 2, 2, 64}, {256, 128, 64, 1}},
	                          .k = {b, 4096, FA_DTYPE_FP16, {1, 8, 2, 64}, {1024, 128, 64, 1}},
	                          .v = {b, 12288, FA_DTYPE_FP16, {1, 8, 2, 64}, {1024, 128, 64, 1}},
	                          .o = {b, 20480, FA_DTYPE_FP16, {1, 2, 2, 64}, {256, 128, 64, 1}},
	                          .cu_seqlens_q = {b, 65536 + 64, {3, 1}, {1, 1}},
	                          .cu_seqlens_k = {b, 65536 + 128, {3, 1}, {1, 1}}};
	int32_t *cq = (int32_t *)((char *)fa_buffer_data(b) + 65536 + 64);
	int32_t *ck = (int32_t *)((char *)fa_buffer_data(b) + 65536 + 128);
	cq[0] = 0, cq[1] = 1, cq[2] = 2;
	ck[0] = 0, ck[1] = 3, ck[2] = 8;
	assert_int_equal(fa_attn_varlen(c, &va), FA_OK);
	assert_int_equal(fa_attn_varlen_async(c, &va, NULL), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "host buffer"));
	/* NULL arguments */
	assert_int_equal(fa_attn_varlen_async(c, NULL, NULL), FA_EINVAL);
	assert_int_equal(fa_attn_kvcache_async(NULL, &a, NULL), FA_EINVAL);
	fa_buffer_free(b);
	fa_client_close(c);
}

/* A daemon acting as the release before these calls: its ring header has no feature bits (so
 * a client sends it none of them through the ring), and the new keys on the socket are refused
 * with its decoder's text (FA_EPROTO "key 'wrg' not allowed in a ATTN_BWD request", what the
 * client's socket fallback keys on); the old requests still work. That the text is the
 * decoder's own is test_proto_infer.c's (a key on an op that does not take it). */
static void test_old_daemon_shows_no_features_and_refuses_the_new_keys(void **state)
{
	(void)state;
	struct fa_daemon old;
	setenv("FA_TEST_OLD_DAEMON", "1", 1);
	int rc = daemon_start(&old, "--threads", "1", NULL);
	unsetenv("FA_TEST_OLD_DAEMON");
	if (rc != 0)
		daemon_log_dump(&old, 40);
	assert_int_equal(rc, 0);
	struct fa_raw_ring r;
	struct fa_proto_rep rep;
	uint64_t rng = 77;
	fa_raw_ring_open(&r, old.url, &rng, FA_OK);
	assert_int_equal(__atomic_load_n(&r.h->features, __ATOMIC_SEQ_CST), 0);
	struct fa_proto_req q = bwd_async(r.sid, ++r.seq);
	assert_int_equal(fa_raw_call(r.s, &q, &rep), FA_EPROTO);
	assert_non_null(strstr(rep.detail, "key 'wrg' not allowed in a ATTN_BWD request"));
	q = infer_async(FA_OP_ATTN_KVCACHE, r.sid, ++r.seq);
	assert_int_equal(fa_raw_call(r.s, &q, &rep), FA_EPROTO);
	assert_non_null(strstr(rep.detail, "key 'slot' not allowed in a ATTN_KVCACHE request"));
	/* the synchronous requests and the forward's words (which it knew) are unchanged */
	q.u.infer.async = false;
	q.u.infer.words_region = q.u.infer.words_seq = 0;
	q.seq = ++r.seq;
	assert_int_equal(fa_raw_call(r.s, &q, &rep), FA_EREGION);
	assert_int_equal(fa_raw_simple(r.s, FA_OP_PING, r.sid, ++r.seq, &rep), FA_OK);
	fa_raw_ring_close(&r);
	assert_true(daemon_log_contains(&old, "FA_TEST_OLD_DAEMON"));
	assert_int_equal(daemon_finish(&old), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cpu_daemon_refuses_async_bwd_and_inference_with_enotsup),
		cmocka_unit_test(test_daemon_answers_malformed_and_unknown_async_requests),
		cmocka_unit_test(test_ring_says_its_features_and_answers_async_entries),
		cmocka_unit_test(test_client_refuses_host_buffers_for_async_calls_before_sending),
		cmocka_unit_test(test_old_daemon_shows_no_features_and_refuses_the_new_keys),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
