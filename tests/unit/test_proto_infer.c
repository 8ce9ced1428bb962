/* test_proto_infer.c - the wire of the inference shapes: ATTN_FWD's and ATTN_BWD's optional
 * window and softcap keys (absent is off, so older messages decode as before), ATTN_VARLEN and ATTN_KVCACHE with
 * their int32 index tensors; round trips, and each malformed form answered with FA_EPROTO (the
 * decoder) or FA_EINVAL (the encoder) and its detail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "fa_proto.h"

static unsigned char enc[FA_PROTO_MAX_MSG], enc2[FA_PROTO_MAX_MSG];
static char err[FA_PROTO_DETAIL_MAX];

static struct fa_proto_tensor tensor(uint64_t r, int64_t B, int64_t S, int64_t H, int64_t D)
{
	struct fa_proto_tensor t = {.region = r, .offset = 64, .dtype = FA_DTYPE_BF16,
	                            .shape = {B, S, H, D}, .stride = {S * H * D, H * D, D, 1}};
	return t;
}

static struct fa_proto_index vec(uint64_t r, uint64_t off, int64_t n)
{
	struct fa_proto_index t = {.region = r, .offset = off, .shape = {n, 1}, .stride = {1, 1}};
	return t;
}

static struct fa_proto_req varlen_req(void)
{
	struct fa_proto_req r;
	memset(&r, 0, sizeof r);
	r.op = FA_OP_ATTN_VARLEN;
	r.session = 0x1234;
	r.seq = 9;
	r.u.infer.q = tensor(5, 1, 300, 8, 128);
	r.u.infer.k = tensor(5, 1, 700, 2, 128);
	r.u.infer.v = tensor(6, 1, 700, 2, 128);
	r.u.infer.o = tensor(7, 1, 300, 8, 128);
	r.u.infer.cu_q = vec(8, 0, 17);
	r.u.infer.cu_k = vec(8, 68, 17);
	r.u.infer.max_q = 129;
	r.u.infer.max_k = 4097;
	r.u.infer.scale = 0.125;
	r.u.infer.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	r.u.infer.win = (struct fa_proto_window){true, 4096, -1, 30.0};
	return r;
}

static struct fa_proto_req kvcache_req(bool paged, bool packed_q)
{
	struct fa_proto_req r;
	memset(&r, 0, sizeof r);
	r.op = FA_OP_ATTN_KVCACHE;
	r.session = 0x1234;
	r.seq = 10;
	r.u.infer.q = tensor(5, 16, 1, 32, 128);
	r.u.infer.k = tensor(5, 512, 16, 8, 128);
	r.u.infer.v = tensor(6, 512, 16, 8, 128);
	r.u.infer.o = tensor(7, 16, 1, 32, 128);
	r.u.infer.lse = tensor(7, 16, 32, 1, 1);
	r.u.infer.lse.dtype = FA_DTYPE_FP32;
	r.u.infer.cache_len = vec(8, 0, 16);
	if (paged) {
		r.u.infer.page_table = vec(8, 64, 16);
		r.u.infer.page_table.shape[1] = 32;
		r.u.infer.page_table.stride[0] = 32;
	}
	if (packed_q) {
		r.u.infer.cu_q = vec(8, 4096, 17);
		r.u.infer.max_q = 4;
	}
	r.u.infer.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	return r;
}

/* Encode, decode, compare the struct field by field that matters, re-encode to the same bytes. */
static void round_trip(const struct fa_proto_req *in)
{
	size_t len = 0, len2 = 0;
	struct fa_proto_req out;
	assert_int_equal(fa_proto_encode_req(in, enc, sizeof enc, &len), FA_OK);
	fa_status st = fa_proto_decode_req(enc, len, &out, err, sizeof err);
	if (st != FA_OK)
		fail_msg("decode: %s: %s", fa_status_name(st), err);
	assert_int_equal(out.op, in->op);
	assert_int_equal(out.seq, in->seq);
	assert_int_equal(fa_proto_encode_req(&out, enc2, sizeof enc2, &len2), FA_OK);
	assert_int_equal(len, len2);
	assert_memory_equal(enc, enc2, len);
	if (in->op == FA_OP_ATTN_FWD) {
		assert_memory_equal(&out.u.fwd.win, &in->u.fwd.win, sizeof in->u.fwd.win);
	} else if (in->op == FA_OP_ATTN_BWD) {
		assert_memory_equal(&out.u.bwd.win, &in->u.bwd.win, sizeof in->u.bwd.win);
		assert_int_equal(out.u.bwd.flags, in->u.bwd.flags);
		assert_memory_equal(&out.u.bwd.dv, &in->u.bwd.dv, sizeof in->u.bwd.dv);
	} else {
		const __typeof__(in->u.infer) *a = &in->u.infer, *b = &out.u.infer;
		assert_memory_equal(&a->q, &b->q, sizeof a->q);
		assert_memory_equal(&a->k, &b->k, sizeof a->k);
		assert_memory_equal(&a->cu_q, &b->cu_q, sizeof a->cu_q);
		assert_memory_equal(&a->cu_k, &b->cu_k, sizeof a->cu_k);
		assert_memory_equal(&a->cache_len, &b->cache_len, sizeof a->cache_len);
		assert_memory_equal(&a->page_table, &b->page_table, sizeof a->page_table);
		assert_int_equal(a->max_q, b->max_q);
		assert_int_equal(a->max_k, b->max_k);
		assert_int_equal(a->lse.region, b->lse.region);
		assert_true(a->scale == b->scale && a->mask == b->mask);
		assert_memory_equal(&a->win, &b->win, sizeof a->win);
	}
}

static void test_fwd_window_and_softcap_round_trip_and_stay_off_when_absent(void **state)
{
	struct fa_proto_req r;
	(void)state;
	memset(&r, 0, sizeof r);
	r.op = FA_OP_ATTN_FWD;
	r.session = 1;
	r.seq = 2;
	r.u.fwd.q = r.u.fwd.o = tensor(3, 2, 17, 4, 64);
	r.u.fwd.k = r.u.fwd.v = tensor(4, 2, 129, 4, 64);
	r.u.fwd.o.region = 5;
	round_trip(&r); /* off: no new key on the wire */
	size_t len0 = 0;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len0), FA_OK);
	assert_null(memmem(enc, len0, "\xa2wl", 3));
	assert_null(memmem(enc, len0, "\xa3" "cap", 4));
	r.u.fwd.win = (struct fa_proto_window){true, -1, 0, 0};
	round_trip(&r);
	r.u.fwd.win = (struct fa_proto_window){false, 0, 0, 50.0};
	round_trip(&r);
	r.u.fwd.win = (struct fa_proto_window){true, INT64_MAX, INT64_MIN, 1e-30};
	round_trip(&r);
	size_t len = 0;
	r.u.fwd.win.softcap = -1;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r.u.fwd.win.softcap = NAN;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
}

/* "cap": -0.0 on the wire is off, read as +0.0, so the message reads the same after a
 * re-encoding (which writes no "cap"); found by fuzz_proto (corpus req-varlen-negzero-cap). */
static void test_negative_zero_softcap_reads_as_off(void **state)
{
	struct fa_proto_req r, out;
	(void)state;
	memset(&r, 0, sizeof r);
	r.op = FA_OP_ATTN_FWD;
	r.session = 1;
	r.seq = 2;
	r.u.fwd.q = r.u.fwd.o = r.u.fwd.k = r.u.fwd.v = tensor(3, 2, 17, 4, 64);
	r.u.fwd.o.region = 5;
	r.u.fwd.win.softcap = 50.0;
	size_t len = 0;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	/* 50.0 as msgpack float 64: 0xcb, then 0x4049000000000000 big-endian */
	static const unsigned char fifty[9] = {0xcb, 0x40, 0x49, 0, 0, 0, 0, 0, 0};
	unsigned char *at = memmem(enc, len, fifty, sizeof fifty);
	assert_non_null(at);
	at[1] = 0x80; /* -0.0 */
	at[2] = 0;
	char why[FA_PROTO_DETAIL_MAX];
	assert_int_equal(fa_proto_decode_req(enc, len, &out, why, sizeof why), FA_OK);
	assert_true(out.u.fwd.win.softcap == 0 && !signbit(out.u.fwd.win.softcap));
	size_t len2 = 0;
	assert_int_equal(fa_proto_encode_req(&out, enc, sizeof enc, &len2), FA_OK);
	assert_null(memmem(enc, len2, "\xa3" "cap", 4));
}

static struct fa_proto_req bwd_req(void)
{
	struct fa_proto_req r;
	memset(&r, 0, sizeof r);
	r.op = FA_OP_ATTN_BWD;
	r.session = 1;
	r.seq = 3;
	r.u.bwd.q = r.u.bwd.o = r.u.bwd.dout = r.u.bwd.dq = tensor(3, 2, 17, 4, 64);
	r.u.bwd.k = r.u.bwd.v = r.u.bwd.dk = r.u.bwd.dv = tensor(4, 2, 129, 4, 64);
	r.u.bwd.lse = tensor(5, 2, 4, 17, 1);
	r.u.bwd.lse.dtype = FA_DTYPE_FP32;
	r.u.bwd.flags = FA_PROTO_BWD_DETERMINISTIC;
	r.u.bwd.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	return r;
}

static void test_bwd_window_and_softcap_round_trip_and_stay_off_when_absent(void **state)
{
	(void)state;
	struct fa_proto_req r = bwd_req();
	round_trip(&r); /* off: no new key on the wire, as an older client sends it */
	size_t len = 0;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	assert_null(memmem(enc, len, "\xa2wl", 3));
	assert_null(memmem(enc, len, "\xa3" "cap", 4));
	struct fa_proto_req out;
	assert_int_equal(fa_proto_decode_req(enc, len, &out, err, sizeof err), FA_OK);
	assert_false(out.u.bwd.win.window);
	assert_true(out.u.bwd.win.softcap == 0);
	r.u.bwd.win = (struct fa_proto_window){true, 4096, 0, 0};
	round_trip(&r);
	r.u.bwd.win = (struct fa_proto_window){false, 0, 0, 30.0};
	round_trip(&r);
	r.u.bwd.win = (struct fa_proto_window){true, INT64_MAX, INT64_MIN, 1e-30};
	r.u.bwd.async = true;
	r.u.bwd.slot = 5;
	round_trip(&r);
	/* the encoder refuses what the decoder would */
	r.u.bwd.win.softcap = -1;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r.u.bwd.win.softcap = NAN;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
}

static void test_varlen_and_kvcache_round_trip(void **state)
{
	(void)state;
	struct fa_proto_req r = varlen_req();
	round_trip(&r);
	r.u.infer.lse = tensor(9, 1, 8, 300, 1);
	r.u.infer.lse.dtype = FA_DTYPE_FP32;
	r.u.infer.win = (struct fa_proto_window){0};
	r.u.infer.max_q = r.u.infer.max_k = 0;
	round_trip(&r);
	for (int paged = 0; paged <= 1; paged++)
		for (int packed = 0; packed <= 1; packed++) {
			r = kvcache_req(paged, packed);
			round_trip(&r);
		}
	/* the replies carry the forward's keys */
	struct fa_proto_rep rep, out;
	memset(&rep, 0, sizeof rep);
	rep.op = FA_OP_ATTN_KVCACHE;
	rep.seq = 3;
	rep.epoch = 4;
	rep.u.fwd.compute_ns = 12345;
	size_t len = 0;
	assert_int_equal(fa_proto_encode_rep(&rep, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_rep(enc, len, &out, err, sizeof err), FA_OK);
	assert_int_equal(out.u.fwd.compute_ns, 12345);
	assert_string_equal(fa_proto_op_name(FA_OP_ATTN_VARLEN), "ATTN_VARLEN");
	assert_string_equal(fa_proto_op_name(FA_OP_ATTN_KVCACHE), "ATTN_KVCACHE");
}

static void test_encoder_refuses_what_the_decoder_would(void **state)
{
	size_t len = 0;
	(void)state;
	struct fa_proto_req r = varlen_req();
	r.u.infer.cu_k.region = 0;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r = varlen_req();
	r.u.infer.cache_len = vec(3, 0, 2); /* not a varlen key */
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r = varlen_req();
	r.u.infer.max_k = (uint64_t)INT32_MAX + 1;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r = kvcache_req(true, false);
	r.u.infer.max_q = 3; /* dense queries: no max_seqlen_q */
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r = kvcache_req(true, false);
	r.u.infer.cache_len.region = 0;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r = kvcache_req(true, false);
	r.u.infer.page_table.shape[0] = -1;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
}

/* Encode r, then patch the bytes: replace the first occurrence of `from` with `to` (same length). */
static size_t encode_patched(const struct fa_proto_req *r, const char *from, const char *to,
                             size_t n)
{
	size_t len = 0;
	assert_int_equal(fa_proto_encode_req(r, enc, sizeof enc, &len), FA_OK);
	unsigned char *p = memmem(enc, len, from, n);
	assert_non_null(p);
	memcpy(p, to, n);
	return len;
}

static void expect_proto(const void *buf, size_t len, const char *text)
{
	struct fa_proto_req out;
	fa_status st = fa_proto_decode_req(buf, len, &out, err, sizeof err);
	if (st != FA_EPROTO || strstr(err, text) == NULL)
		fail_msg("got %s '%s', want FA_EPROTO '%s'", fa_status_name(st), err, text);
}

static void test_decoder_rejects_malformed_inference_keys(void **state)
{
	(void)state;
	struct fa_proto_req r = varlen_req();
	/* "wl" renamed to an unknown key: "wr" alone */
	size_t len = encode_patched(&r, "\xa2wl", "\xa2wx", 3);
	expect_proto(enc, len, "unknown key 'wx'");
	/* a window side given as a float */
	r = varlen_req();
	r.u.infer.win.window_left = 7; /* positive fixint 0x07, right after "wl" */
	len = encode_patched(&r, "\xa2wl\x07", "\xa2wl\xc0", 4);
	expect_proto(enc, len, "key 'wl': want an integer");
	/* a negative softcap */
	r = varlen_req();
	r.u.infer.win.softcap = 2.0;
	len = encode_patched(&r, "\xa3" "cap\xcb\x40", "\xa3" "cap\xcb\xc0", 6);
	expect_proto(enc, len, "key 'cap': must be finite and >= 0");
	/* cu_seqlens_k in ATTN_KVCACHE, cache_seqlens in ATTN_VARLEN */
	r = kvcache_req(false, false);
	len = encode_patched(&r, "\xa3" "csl", "\xa3" "cuk", 4);
	expect_proto(enc, len, "key 'cuk' not allowed in a ATTN_KVCACHE request");
	r = varlen_req();
	len = encode_patched(&r, "\xa3" "cuk", "\xa3" "csl", 4);
	expect_proto(enc, len, "missing key 'cuk' in a ATTN_VARLEN request");
	/* an index tensor with a dtype */
	r = kvcache_req(true, false);
	len = encode_patched(&r, "\xa2pt\x84\xa1r", "\xa2pt\x84\xa1t", 6);
	expect_proto(enc, len, "key 'pt': 't' not allowed (index tensors are int32)");
	/* max_seqlen_q without packed queries */
	r = kvcache_req(false, true);
	len = encode_patched(&r, "\xa3" "cuq", "\xa3" "cuX", 4);
	expect_proto(enc, len, "unknown key 'cuX'");
	/* a missing required key */
	r = varlen_req();
	len = encode_patched(&r, "\xa2mk", "\xa2mX", 3);
	expect_proto(enc, len, "unknown key 'mX'");
}

/* Whether a map key is the string name (NULL: no name matches). */
static bool key_is(const msgpack_object *key, const char *name)
{
	return name != NULL && key->via.str.size == strlen(name) &&
	       memcmp(key->via.str.ptr, name, key->via.str.size) == 0;
}

/* Encode r and re-pack its map into sb (the caller destroys it): the key `drop` left out (NULL:
 * none; it must be there), then one more key `add` = the unsigned `value` (NULL: none). */
static void encode_repacked(const struct fa_proto_req *r, const char *drop, const char *add,
                            uint64_t value, msgpack_sbuffer *sb)
{
	size_t len = 0, off = 0;
	msgpack_packer pk;
	msgpack_unpacked up;
	assert_int_equal(fa_proto_encode_req(r, enc, sizeof enc, &len), FA_OK);
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_unpacked_init(&up);
	assert_int_equal(msgpack_unpack_next(&up, (const char *)enc, len, &off),
	                 MSGPACK_UNPACK_SUCCESS);
	msgpack_object_map *m = &up.data.via.map;
	msgpack_pack_map(&pk, m->size - (drop != NULL) + (add != NULL));
	for (uint32_t i = 0; i < m->size; i++) {
		if (key_is(&m->ptr[i].key, drop))
			continue;
		msgpack_pack_object(&pk, m->ptr[i].key);
		msgpack_pack_object(&pk, m->ptr[i].val);
	}
	if (add != NULL) {
		msgpack_pack_str(&pk, strlen(add));
		msgpack_pack_str_body(&pk, add, strlen(add));
		msgpack_pack_uint64(&pk, value);
	}
	msgpack_unpacked_destroy(&up);
}

/* r encoded without the key `drop`. */
static void encode_without(const struct fa_proto_req *r, const char *drop, msgpack_sbuffer *sb)
{
	encode_repacked(r, drop, NULL, 0, sb);
}

static void test_decoder_rejects_malformed_bwd_window_keys(void **state)
{
	(void)state;
	struct fa_proto_req r = bwd_req();
	r.u.bwd.win = (struct fa_proto_window){true, 7, 0, 2.0};
	/* half windows: "wl" without "wr" and the other way round */
	msgpack_sbuffer sb;
	encode_without(&r, "wr", &sb);
	expect_proto(sb.data, sb.size, "key 'wl' without 'wr'");
	msgpack_sbuffer_destroy(&sb);
	encode_without(&r, "wl", &sb);
	expect_proto(sb.data, sb.size, "key 'wr' without 'wl'");
	msgpack_sbuffer_destroy(&sb);
	size_t len = encode_patched(&r, "\xa2wl\x07", "\xa2wl\xc0", 4);
	expect_proto(enc, len, "key 'wl': want an integer");
	/* negative and NaN softcaps */
	len = encode_patched(&r, "\xa3" "cap\xcb\x40", "\xa3" "cap\xcb\xc0", 6);
	expect_proto(enc, len, "key 'cap': must be finite and >= 0");
	len = encode_patched(&r, "\xa3" "cap\xcb\x40\x00", "\xa3" "cap\xcb\x7f\xf8", 7);
	expect_proto(enc, len, "key 'cap': must be finite and >= 0");
}

static void test_decoder_rejects_mq_without_cuq(void **state)
{
	(void)state;
	/* hand-built: a KVCACHE request with dense queries and an "mq" key */
	struct fa_proto_req r = kvcache_req(false, true);
	size_t len = 0;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	/* the encoder never writes "mq" without "cuq": re-pack its map with "cuq" left out */
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	struct fa_proto_req out;
	fa_status st = fa_proto_decode_req(enc, len, &out, err, sizeof err);
	assert_int_equal(st, FA_OK);
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	size_t off = 0;
	assert_int_equal(msgpack_unpack_next(&up, (const char *)enc, len, &off),
	                 MSGPACK_UNPACK_SUCCESS);
	msgpack_object_map *m = &up.data.via.map;
	msgpack_pack_map(&pk, m->size - 1);
	for (uint32_t i = 0; i < m->size; i++) {
		if (m->ptr[i].key.via.str.size == 3 && memcmp(m->ptr[i].key.via.str.ptr, "cuq", 3) == 0)
			continue;
		msgpack_pack_object(&pk, m->ptr[i].key);
		msgpack_pack_object(&pk, m->ptr[i].val);
	}
	msgpack_unpacked_destroy(&up);
	expect_proto(sb.data, sb.size, "key 'mq' without 'cuq'");
	msgpack_sbuffer_destroy(&sb);
}

/* r encoded with one more key: `key` = the unsigned `value`. */
static void encode_with(const struct fa_proto_req *r, const char *key, uint64_t value,
                        msgpack_sbuffer *sb)
{
	encode_repacked(r, NULL, key, value, sb);
}

/* Asynchronous ATTN_BWD with completion words, and asynchronous ATTN_VARLEN / ATTN_KVCACHE
 * (words only): the keys there and back; a synchronous request carries none of them, so an
 * older daemon still decodes it byte for byte as before. */
static void test_async_bwd_and_inference_round_trip_with_completion_words(void **state)
{
	(void)state;
	struct fa_proto_req r = bwd_req(), out;
	size_t sync_len = 0, len = 0;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &sync_len), FA_OK);
	assert_null(memmem(enc, sync_len, "\xa3wrg", 4));
	r.u.bwd.async = true;
	r.u.bwd.slot = 63;
	r.u.bwd.words_region = UINT64_MAX;
	r.u.bwd.words_seq = 1;
	round_trip(&r);
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_req(enc, len, &out, err, sizeof err), FA_OK);
	assert_true(out.u.bwd.async && !out.u.bwd.has_event && out.u.bwd.slot == 63);
	assert_true(out.u.bwd.words_region == UINT64_MAX && out.u.bwd.words_seq == 1);
	assert_true(len < FA_PROTO_MAX_MSG && len > sync_len);

	struct fa_proto_req v[3] = {varlen_req(), kvcache_req(false, false), kvcache_req(true, true)};
	for (int i = 0; i < 3; i++) {
		assert_int_equal(fa_proto_encode_req(&v[i], enc, sizeof enc, &sync_len), FA_OK);
		assert_null(memmem(enc, sync_len, "\xa4slot", 5));
		v[i].u.infer.async = true;
		v[i].u.infer.slot = (uint32_t)(i * 20);
		v[i].u.infer.words_region = 77;
		v[i].u.infer.words_seq = UINT64_MAX;
		round_trip(&v[i]);
		assert_int_equal(fa_proto_encode_req(&v[i], enc, sizeof enc, &len), FA_OK);
		assert_int_equal(fa_proto_decode_req(enc, len, &out, err, sizeof err), FA_OK);
		assert_true(out.u.infer.async && out.u.infer.slot == (uint32_t)(i * 20));
		assert_true(out.u.infer.words_region == 77 && out.u.infer.words_seq == UINT64_MAX);
		/* the whole entry fits a ring entry with room to spare */
		assert_true(len + 16 <= 2048);
	}
}

/* Malformed asynchronous keys on ATTN_BWD and the inference ops: each refused by the decoder
 * with the key named, and by the encoder (FA_EINVAL) where it could write them. */
static void test_decoder_and_encoder_refuse_malformed_async_keys(void **state)
{
	(void)state;
	msgpack_sbuffer sb;
	size_t len = 0;
	struct fa_proto_req b = bwd_req();
	b.u.bwd.async = true;
	b.u.bwd.slot = 3;
	b.u.bwd.words_region = 9;
	b.u.bwd.words_seq = 5;
	/* half a pair, no slot, zero values, an event beside the words */
	encode_without(&b, "wq", &sb);
	expect_proto(sb.data, sb.size, "'wrg' without 'wq'");
	msgpack_sbuffer_destroy(&sb);
	encode_without(&b, "slot", &sb);
	expect_proto(sb.data, sb.size, "without 'slot'");
	msgpack_sbuffer_destroy(&sb);
	len = encode_patched(&b, "\xa2wq\x05", "\xa2wq\x00", 4);
	expect_proto(enc, len, "key 'wq'");
	len = encode_patched(&b, "\xa3wrg\x09", "\xa3wrg\x00", 5);
	expect_proto(enc, len, "key 'wrg'");
	len = encode_patched(&b, "\xa4slot\x03", "\xa4slot\x40", 6);
	expect_proto(enc, len, "key 'slot': must be 0..63");
	b.u.bwd.has_event = true;
	assert_int_equal(fa_proto_encode_req(&b, enc, sizeof enc, &len), FA_EINVAL);
	b.u.bwd.has_event = false;
	b.u.bwd.async = false;
	assert_int_equal(fa_proto_encode_req(&b, enc, sizeof enc, &len), FA_EINVAL);

	struct fa_proto_req v = varlen_req();
	v.u.infer.async = true;
	v.u.infer.slot = 2;
	v.u.infer.words_region = 9;
	v.u.infer.words_seq = 5;
	/* a slot without words: the inference ops have no event path */
	msgpack_sbuffer sb2;
	encode_without(&v, "wrg", &sb);
	expect_proto(sb.data, sb.size, "'wq' without 'wrg'");
	msgpack_sbuffer_destroy(&sb);
	struct fa_proto_req s = varlen_req();
	encode_with(&s, "slot", 4, &sb2);
	expect_proto(sb2.data, sb2.size, "completion words only");
	msgpack_sbuffer_destroy(&sb2);
	/* "ev" is no key of theirs (an IPC event handle would be a bin 64; any value is refused) */
	encode_with(&v, "ev", 1, &sb);
	expect_proto(sb.data, sb.size, "'ev'");
	msgpack_sbuffer_destroy(&sb);
	/* words without a slot */
	encode_without(&v, "slot", &sb);
	expect_proto(sb.data, sb.size, "without 'slot'");
	msgpack_sbuffer_destroy(&sb);
	/* the encoder: slot out of range, async without words, words without async */
	v.u.infer.slot = 64;
	assert_int_equal(fa_proto_encode_req(&v, enc, sizeof enc, &len), FA_EINVAL);
	v.u.infer.slot = 2;
	v.u.infer.words_seq = 0;
	assert_int_equal(fa_proto_encode_req(&v, enc, sizeof enc, &len), FA_EINVAL);
	v.u.infer.words_seq = 5;
	v.u.infer.async = false;
	assert_int_equal(fa_proto_encode_req(&v, enc, sizeof enc, &len), FA_EINVAL);
	/* a key on an op that does not take it: the text an older daemon gives these requests
	 * (its table lacked them for the op; test_async_cpu.c's FA_TEST_OLD_DAEMON copies it) */
	struct fa_proto_req p;
	memset(&p, 0, sizeof p);
	p.op = FA_OP_PING;
	p.session = 1;
	p.seq = 2;
	encode_with(&p, "wrg", 9, &sb);
	expect_proto(sb.data, sb.size, "key 'wrg' not allowed in a PING request");
	msgpack_sbuffer_destroy(&sb);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fwd_window_and_softcap_round_trip_and_stay_off_when_absent),
		cmocka_unit_test(test_negative_zero_softcap_reads_as_off),
		cmocka_unit_test(test_bwd_window_and_softcap_round_trip_and_stay_off_when_absent),
		cmocka_unit_test(test_varlen_and_kvcache_round_trip),
		cmocka_unit_test(test_encoder_refuses_what_the_decoder_would),
		cmocka_unit_test(test_decoder_rejects_malformed_inference_keys),
		cmocka_unit_test(test_decoder_rejects_malformed_bwd_window_keys),
		cmocka_unit_test(test_decoder_rejects_mq_without_cuq),
		cmocka_unit_test(test_async_bwd_and_inference_round_trip_with_completion_words),
		cmocka_unit_test(test_decoder_and_encoder_refuse_malformed_async_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
