/* test_proto.c - the wire contract: round trips of every message, and every class of bad input
 * answered with its exact status.
 *
 * Malformed messages are built by a hand packer (the "mirror" below) that writes the same keys in
 * the same order as the real encoder but can leave a key out, give it a value of the wrong type,
 * write it twice, add keys, or override a string, a bin length, the version or a dims length. It
 * also records every key path it writes, so the per-key tests cover every key of every op without
 * a hand-kept list. test_proto_hand_packer_matches_encoder proves the mirror writes the encoder's
 * bytes when nothing is overridden.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "fa_proto.h"
#include "fa_proto_memo.h"
#include "fa_proto_rep_fast.h"
#include "../fuzz/proto_equal.h"

static char errbuf[FA_PROTO_DETAIL_MAX];

/* Fail with context when a status differs from the one expected. */
#define EXPECT_STATUS(got, want, ...)                                                          \
	do {                                                                                   \
		fa_status got_ = (got), want_ = (want);                                        \
		if (got_ != want_) {                                                           \
			print_error(__VA_ARGS__);                                              \
			print_error(": got %s, want %s (detail: \"%s\")\n",                    \
			            fa_status_name(got_), fa_status_name(want_), errbuf);      \
			fail();                                                                \
		}                                                                              \
	} while (0)

/* ---- fixtures -------------------------------------------------------------------------------- */

static const uint32_t all_ops[] = {FA_OP_HELLO,    FA_OP_BYE,        FA_OP_PING,
                                   FA_OP_STATS,    FA_OP_REGISTER,   FA_OP_UNREGISTER,
                                   FA_OP_ATTN_FWD, FA_OP_ATTN_BWD};
#define N_OPS (sizeof all_ops / sizeof all_ops[0])

static const fa_status all_statuses[] = {
	FA_OK,       FA_EINVAL,  FA_ENOMEM,  FA_EUNAVAIL, FA_ETIMEDOUT, FA_EPROTO,    FA_EVERSION,
	FA_EBUSY,    FA_ECLOSED, FA_ENOTSUP, FA_EDEVICE,  FA_ESESSION,  FA_EREGION,   FA_ERANGE,
	FA_ESHAPE,   FA_EALIGN,  FA_EOVERLAP, FA_ETOOBIG, FA_ENOFIT,    FA_EPERM,     FA_ENOGPU,
	FA_ELIMIT,   FA_ESYS,    FA_EIPC,    FA_EDTYPE,   FA_EINTERNAL,
};

/* A BSHD tensor [B, S, H, D] at region r. */
static struct fa_proto_tensor tensor_bshd(uint64_t r, uint8_t dtype, int64_t B, int64_t S,
                                          int64_t H, int64_t D)
{
	struct fa_proto_tensor t;
	memset(&t, 0, sizeof t);
	t.region = r;
	t.offset = 4096;
	t.dtype = dtype;
	t.shape[0] = B, t.shape[1] = S, t.shape[2] = H, t.shape[3] = D;
	t.stride[0] = S * H * D, t.stride[1] = H * D, t.stride[2] = D, t.stride[3] = 1;
	return t;
}

/* A typical request of each op. */
static struct fa_proto_req req_fixture(uint32_t op)
{
	struct fa_proto_req r;
	memset(&r, 0, sizeof r);
	r.v = FA_PROTO_VERSION;
	r.op = op;
	r.seq = 7;
	r.session = op == FA_OP_HELLO ? 0 : UINT64_C(0x1234567890abcdef);
	switch (op) {
	case FA_OP_HELLO:
		r.u.hello.pid = 4242;
		strcpy(r.u.hello.name, "test_proto");
		break;
	case FA_OP_REGISTER:
		r.u.reg.kind = FA_REGION_HOST_SHM;
		r.u.reg.size = 1 << 20;
		strcpy(r.u.reg.shm_name, "/fa.1000.4242.0123456789abcdef");
		break;
	case FA_OP_UNREGISTER:
		r.u.unreg.region = UINT64_C(0xdeadbeefcafe);
		break;
	case FA_OP_ATTN_FWD:
		r.u.fwd.q = tensor_bshd(11, FA_DTYPE_FP16, 2, 128, 8, 64);
		r.u.fwd.k = tensor_bshd(12, FA_DTYPE_FP16, 2, 256, 2, 64);
		r.u.fwd.v = tensor_bshd(13, FA_DTYPE_FP16, 2, 256, 2, 64);
		r.u.fwd.o = tensor_bshd(14, FA_DTYPE_FP16, 2, 128, 8, 64);
		r.u.fwd.lse = tensor_bshd(15, FA_DTYPE_FP32, 2, 8, 128, 1);
		r.u.fwd.scale = 0.125;
		r.u.fwd.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
		r.u.fwd.precision = FA_PREC_DEFAULT;
		break;
	case FA_OP_ATTN_BWD:
		r.u.bwd.q = tensor_bshd(21, FA_DTYPE_BF16, 2, 100, 8, 64);
		r.u.bwd.k = tensor_bshd(22, FA_DTYPE_BF16, 2, 300, 2, 64);
		r.u.bwd.v = tensor_bshd(23, FA_DTYPE_BF16, 2, 300, 2, 64);
		r.u.bwd.o = tensor_bshd(24, FA_DTYPE_BF16, 2, 100, 8, 64);
		r.u.bwd.lse = tensor_bshd(25, FA_DTYPE_FP32, 2, 8, 100, 1);
		r.u.bwd.dout = tensor_bshd(26, FA_DTYPE_BF16, 2, 100, 8, 64);
		r.u.bwd.dq = tensor_bshd(27, FA_DTYPE_BF16, 2, 100, 8, 64);
		r.u.bwd.dk = tensor_bshd(28, FA_DTYPE_BF16, 2, 300, 2, 64);
		r.u.bwd.dv = tensor_bshd(29, FA_DTYPE_BF16, 2, 300, 2, 64);
		r.u.bwd.scale = 0.125;
		r.u.bwd.mask = FA_MASK_CAUSAL_TOP_LEFT;
		r.u.bwd.precision = FA_PREC_TF32;
		r.u.bwd.flags = 0;
		break;
	default:
		break;
	}
	return r;
}

/* The CUDA IPC flavour of REGISTER. */
static struct fa_proto_req req_fixture_ipc(void)
{
	struct fa_proto_req r = req_fixture(FA_OP_REGISTER);
	memset(r.u.reg.shm_name, 0, sizeof r.u.reg.shm_name);
	r.u.reg.kind = FA_REGION_CUDA_IPC;
	r.u.reg.size = UINT64_C(1) << 33;
	for (int i = 0; i < FA_PROTO_IPC_HANDLE_LEN; i++)
		r.u.reg.ipc_handle[i] = (uint8_t)i;
	for (int i = 0; i < FA_PROTO_UUID_LEN; i++)
		r.u.reg.gpu_uuid[i] = (uint8_t)(0xf0 + i);
	return r;
}

/* A tensor with every field at its largest value. */
static struct fa_proto_tensor tensor_max(void)
{
	struct fa_proto_tensor t;
	memset(&t, 0, sizeof t);
	t.region = UINT64_MAX;
	t.offset = UINT64_MAX;
	t.dtype = FA_DTYPE_FP32;
	for (int i = 0; i < 4; i++)
		t.shape[i] = t.stride[i] = INT64_MAX;
	return t;
}

/* A request of op with every field at its largest value (kind picks the REGISTER flavour). */
static struct fa_proto_req req_max(uint32_t op, uint8_t kind)
{
	struct fa_proto_req r;
	memset(&r, 0, sizeof r);
	r.v = FA_PROTO_VERSION;
	r.op = op;
	r.seq = UINT64_MAX;
	r.session = op == FA_OP_HELLO ? 0 : UINT64_MAX;
	switch (op) {
	case FA_OP_HELLO:
		r.u.hello.pid = UINT32_MAX;
		memset(r.u.hello.name, 'n', FA_PROTO_NAME_MAX - 1);
		break;
	case FA_OP_REGISTER:
		r.u.reg.kind = kind;
		r.u.reg.size = UINT64_MAX;
		if (kind == FA_REGION_HOST_SHM) {
			memset(r.u.reg.shm_name, 's', FA_PROTO_SHM_NAME_MAX - 1);
			r.u.reg.shm_name[0] = '/';
		} else {
			memset(r.u.reg.ipc_handle, 0xff, sizeof r.u.reg.ipc_handle);
			memset(r.u.reg.gpu_uuid, 0xff, sizeof r.u.reg.gpu_uuid);
		}
		break;
	case FA_OP_UNREGISTER:
		r.u.unreg.region = UINT64_MAX;
		break;
	case FA_OP_ATTN_FWD:
		r.u.fwd.q = r.u.fwd.k = r.u.fwd.v = r.u.fwd.o = r.u.fwd.lse = tensor_max();
		r.u.fwd.scale = DBL_MAX;
		r.u.fwd.mask = FA_MASK_CAUSAL_TOP_LEFT;
		r.u.fwd.precision = FA_PREC_BF16;
		break;
	case FA_OP_ATTN_BWD:
		r.u.bwd.q = r.u.bwd.k = r.u.bwd.v = r.u.bwd.o = r.u.bwd.lse = tensor_max();
		r.u.bwd.dout = r.u.bwd.dq = r.u.bwd.dk = r.u.bwd.dv = tensor_max();
		r.u.bwd.scale = DBL_MAX;
		r.u.bwd.mask = FA_MASK_CAUSAL_TOP_LEFT;
		r.u.bwd.precision = FA_PREC_BF16;
		r.u.bwd.flags = FA_PROTO_BWD_FLAGS;
		r.u.bwd.async = true;
		r.u.bwd.slot = FA_PROTO_MAX_SLOTS - 1;
		r.u.bwd.has_event = true;
		memset(r.u.bwd.event, 0xff, sizeof r.u.bwd.event);
		break;
	default:
		break;
	}
	return r;
}

/* A typical FA_OK reply of each op. */
static void rep_fixture(uint32_t op, struct fa_proto_rep *p)
{
	memset(p, 0, sizeof *p);
	p->v = FA_PROTO_VERSION;
	p->op = op;
	p->status = FA_OK;
	p->seq = 7;
	p->epoch = UINT64_C(0x0123456789abcdef);
	switch (op) {
	case FA_OP_HELLO:
		p->u.hello.session = UINT64_C(0x1234567890abcdef);
		p->u.hello.max_msg = FA_PROTO_MAX_MSG;
		p->u.hello.max_inflight = 64;
		p->u.hello.max_regions = 256;
		p->u.hello.backend = FA_BACKEND_CPU;
		break;
	case FA_OP_REGISTER:
		p->u.reg.region = UINT64_C(0xfeedface);
		break;
	case FA_OP_ATTN_FWD:
	case FA_OP_ATTN_BWD:
		p->u.fwd.compute_ns = 123456;
		break;
	case FA_OP_STATS:
		strcpy(p->u.stats.text, "# server\nversion:0.1.0\nproto:1\n# clients\nsessions:1\n");
		break;
	default:
		break;
	}
}

/* An FA_OK reply of op with every field at its largest value. */
static void rep_max(uint32_t op, struct fa_proto_rep *p)
{
	rep_fixture(op, p);
	p->seq = UINT64_MAX;
	p->epoch = UINT64_MAX;
	memset(p->detail, 'd', FA_PROTO_DETAIL_MAX - 1);
	switch (op) {
	case FA_OP_HELLO:
		p->u.hello.session = UINT64_MAX;
		p->u.hello.max_msg = UINT32_MAX;
		p->u.hello.max_inflight = UINT32_MAX;
		p->u.hello.max_regions = UINT32_MAX;
		p->u.hello.backend = FA_BACKEND_GPU;
		break;
	case FA_OP_REGISTER:
		p->u.reg.region = UINT64_MAX;
		break;
	case FA_OP_ATTN_FWD:
		p->u.fwd.compute_ns = UINT64_MAX;
		break;
	case FA_OP_ATTN_BWD:
		p->u.fwd.compute_ns = UINT64_MAX;
		p->u.fwd.async = true;
		memset(p->u.fwd.event, 0xff, sizeof p->u.fwd.event);
		break;
	case FA_OP_STATS:
		for (int i = 0; i < FA_PROTO_STATS_MAX - 1; i++)
			p->u.stats.text[i] = (i % 40 == 39) ? '\n' : (char)('a' + i % 26);
		p->u.stats.text[FA_PROTO_STATS_MAX - 1] = '\0';
		break;
	default:
		break;
	}
}

/* ---- round-trip helpers ---------------------------------------------------------------------- */

static unsigned char enc[FA_PROTO_MAX_MSG], enc2[FA_PROTO_MAX_MSG];
static struct fa_proto_rep rep_in, rep_out;

/* Encode, decode, compare; encode the result again and require the same bytes. */
static size_t check_req_round_trip(const struct fa_proto_req *in)
{
	struct fa_proto_req out;
	size_t len = 0, len2 = 0;
	EXPECT_STATUS(fa_proto_encode_req(in, enc, sizeof enc, &len), FA_OK, "encode %s",
	              fa_proto_op_name(in->op));
	EXPECT_STATUS(fa_proto_decode_req(enc, len, &out, errbuf, sizeof errbuf), FA_OK,
	              "decode %s", fa_proto_op_name(in->op));
	assert_string_equal(errbuf, "");
	assert_true(proto_req_equal(in, &out));
	EXPECT_STATUS(fa_proto_encode_req(&out, enc2, sizeof enc2, &len2), FA_OK, "re-encode");
	assert_int_equal(len, len2);
	assert_memory_equal(enc, enc2, len);
	return len;
}

/* The same for replies (in: rep_in). */
static size_t check_rep_round_trip(void)
{
	size_t len = 0, len2 = 0;
	EXPECT_STATUS(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_OK,
	              "encode %s reply status %d", fa_proto_op_name(rep_in.op), rep_in.status);
	EXPECT_STATUS(fa_proto_decode_rep(enc, len, &rep_out, errbuf, sizeof errbuf), FA_OK,
	              "decode %s reply", fa_proto_op_name(rep_in.op));
	assert_true(proto_rep_equal(&rep_in, &rep_out));
	EXPECT_STATUS(fa_proto_encode_rep(&rep_out, enc2, sizeof enc2, &len2), FA_OK, "re-encode");
	assert_int_equal(len, len2);
	assert_memory_equal(enc, enc2, len);
	return len;
}

/* ---- the mirror: a hand packer with overrides ------------------------------------------------ */

enum cls { C_UINT, C_STR, C_BIN, C_MAP, C_FLOAT, C_ARRAY };
enum wrong { W_NIL, W_STR, W_UINT, W_NEG, W_FLOAT, W_ARRAY, W_MAP, W_BIN, W_BOOL, W_COUNT };
static const char *const wrong_names[W_COUNT] = {"nil",   "str", "uint", "negative int", "float",
                                                 "array", "map", "bin",  "bool"};

/* What the mirror changes; all zero writes the encoder's bytes. Paths: "seq", "tq.sh". */
struct variant {
	const char *omit;      /* leave this key out */
	const char *retype;    /* give this key a value of type `wrong` */
	enum wrong wrong;
	const char *dup;       /* write this key twice */
	const char *extra;     /* add this key (value 0), e.g. "zz" or "tq.zz" */
	const char *int_key_at; /* add an entry with an integer key in this map ("" top, "tq.") */
	bool has_v;            /* override the version with v */
	uint64_t v;
	const char *strkey;    /* override this string with strval (strval_len bytes, 0: strlen) */
	const char *strval;
	size_t strval_len;
	const char *binkey;    /* write this bin with binlen bytes */
	size_t binlen;
	int dims_len;          /* length of shape/stride arrays (0: 4) */
	bool scale_f32;        /* write scale as float32 */
	bool force_op_keys;    /* write the op-specific keys of a reply even when status != FA_OK */
};

/* Key paths seen by the mirror while recording. */
struct rec {
	char path[16];
	enum cls cls;
	bool optional;
};
#define MAX_RECS 128 /* key paths of the largest message: ATTN_BWD's 9 tensors of 6 each, and 12 */
static struct rec recs[MAX_RECS];
static size_t nrecs;
static bool recording;

struct msg {
	msgpack_sbuffer sb;
	msgpack_packer pk;
	uint32_t n;
	const struct variant *var;
	char prefix[8];
};

static void msg_init(struct msg *m, const struct variant *var, const char *prefix)
{
	msgpack_sbuffer_init(&m->sb);
	msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
	m->n = 0;
	m->var = var;
	snprintf(m->prefix, sizeof m->prefix, "%s", prefix);
}

static void put_key(struct msg *m, const char *key)
{
	msgpack_pack_str_with_body(&m->pk, key, strlen(key));
	m->n++;
}

static void pack_wrong(msgpack_packer *pk, enum wrong w)
{
	switch (w) {
	case W_NIL: msgpack_pack_nil(pk); break;
	case W_STR: msgpack_pack_str_with_body(pk, "x", 1); break;
	case W_UINT: msgpack_pack_uint64(pk, 7); break;
	case W_NEG: msgpack_pack_int64(pk, -1); break;
	case W_FLOAT: msgpack_pack_double(pk, 1.5); break;
	case W_ARRAY: msgpack_pack_array(pk, 0); break;
	case W_MAP: msgpack_pack_map(pk, 0); break;
	case W_BIN: msgpack_pack_bin_with_body(pk, "\x01", 1); break;
	default: msgpack_pack_true(pk); break;
	}
}

/* Decide how a key is written: returns how many times the real value goes out (0, 1, 2). */
static int entry(struct msg *m, const char *key, enum cls cls, bool optional, char *path)
{
	snprintf(path, 16, "%s%s", m->prefix, key);
	const struct variant *v = m->var;
	if (recording && nrecs < sizeof recs / sizeof recs[0]) {
		snprintf(recs[nrecs].path, sizeof recs[nrecs].path, "%s", path);
		recs[nrecs].cls = cls;
		recs[nrecs].optional = optional;
		nrecs++;
	}
	if (v->omit && strcmp(path, v->omit) == 0)
		return 0;
	if (v->retype && strcmp(path, v->retype) == 0) {
		put_key(m, key);
		pack_wrong(&m->pk, v->wrong);
		return 0;
	}
	return v->dup && strcmp(path, v->dup) == 0 ? 2 : 1;
}

static void put_uint(struct msg *m, const char *key, uint64_t x)
{
	char path[16];
	for (int i = entry(m, key, C_UINT, false, path); i > 0; i--) {
		put_key(m, key);
		msgpack_pack_uint64(&m->pk, x);
	}
}

static void put_int(struct msg *m, const char *key, int64_t x)
{
	char path[16];
	for (int i = entry(m, key, C_UINT, false, path); i > 0; i--) {
		put_key(m, key);
		msgpack_pack_int64(&m->pk, x);
	}
}

static void put_str(struct msg *m, const char *key, const char *s)
{
	char path[16];
	size_t n = strlen(s);
	int reps = entry(m, key, C_STR, false, path);
	if (m->var->strkey && strcmp(path, m->var->strkey) == 0) {
		s = m->var->strval;
		n = m->var->strval_len ? m->var->strval_len : strlen(s);
	}
	for (; reps > 0; reps--) {
		put_key(m, key);
		msgpack_pack_str_with_body(&m->pk, s, n);
	}
}

static void put_bin(struct msg *m, const char *key, const uint8_t *b, size_t n)
{
	static const uint8_t zeros[256];
	char path[16];
	int reps = entry(m, key, C_BIN, false, path);
	if (m->var->binkey && strcmp(path, m->var->binkey) == 0) {
		b = zeros;
		n = m->var->binlen;
	}
	for (; reps > 0; reps--) {
		put_key(m, key);
		msgpack_pack_bin_with_body(&m->pk, b, n);
	}
}

static void put_double(struct msg *m, const char *key, double d)
{
	char path[16];
	for (int i = entry(m, key, C_FLOAT, false, path); i > 0; i--) {
		put_key(m, key);
		if (m->var->scale_f32)
			msgpack_pack_float(&m->pk, (float)d);
		else
			msgpack_pack_double(&m->pk, d);
	}
}

static void put_dims(struct msg *m, const char *key, const int64_t d[4])
{
	char path[16];
	int len = m->var->dims_len ? m->var->dims_len : 4;
	for (int i = entry(m, key, C_ARRAY, false, path); i > 0; i--) {
		put_key(m, key);
		msgpack_pack_array(&m->pk, (size_t)len);
		for (int j = 0; j < len; j++)
			msgpack_pack_int64(&m->pk, j < 4 ? d[j] : 1);
	}
}

/* Add the variant's extra entries that belong in this map, then append it as a map to `to`
 * (or, when to is NULL, to the sbuffer `out`). Frees m. */
static void msg_finish(struct msg *m, struct msg *to, msgpack_sbuffer *out)
{
	const struct variant *v = m->var;
	size_t pl = strlen(m->prefix);
	if (v->extra && strncmp(v->extra, m->prefix, pl) == 0 && !strchr(v->extra + pl, '.')) {
		put_key(m, v->extra + pl);
		msgpack_pack_uint64(&m->pk, 0);
	}
	if (v->int_key_at && strcmp(v->int_key_at, m->prefix) == 0) {
		msgpack_pack_int64(&m->pk, 1);
		msgpack_pack_int64(&m->pk, 1);
		m->n++;
	}
	msgpack_sbuffer *dst = to ? &to->sb : out;
	msgpack_packer pk;
	msgpack_packer_init(&pk, dst, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, m->n);
	msgpack_sbuffer_write(dst, m->sb.data, m->sb.size);
	msgpack_sbuffer_destroy(&m->sb);
}

static void put_tensor(struct msg *m, const char *key, const struct fa_proto_tensor *t,
                       bool optional)
{
	char path[16], prefix[8];
	snprintf(prefix, sizeof prefix, "%s.", key);
	for (int i = entry(m, key, C_MAP, optional, path); i > 0; i--) {
		struct msg sub;
		msg_init(&sub, m->var, prefix);
		put_uint(&sub, "r", t->region);
		put_uint(&sub, "o", t->offset);
		put_uint(&sub, "t", t->dtype);
		put_dims(&sub, "sh", t->shape);
		put_dims(&sub, "st", t->stride);
		put_key(m, key);
		msg_finish(&sub, m, NULL);
	}
}

/* Write a request the way the encoder does, with the variant's changes, into out. */
static void mirror_req(const struct fa_proto_req *r, const struct variant *var,
                       msgpack_sbuffer *out)
{
	struct msg m;
	msg_init(&m, var, "");
	msgpack_sbuffer_init(out);
	put_uint(&m, "v", var->has_v ? var->v : FA_PROTO_VERSION);
	put_uint(&m, "op", r->op);
	put_uint(&m, "seq", r->seq);
	if (r->op != FA_OP_HELLO)
		put_uint(&m, "sid", r->session);
	switch (r->op) {
	case FA_OP_HELLO:
		put_uint(&m, "pid", r->u.hello.pid);
		put_str(&m, "name", r->u.hello.name);
		break;
	case FA_OP_REGISTER:
		put_uint(&m, "kind", r->u.reg.kind);
		put_uint(&m, "size", r->u.reg.size);
		if (r->u.reg.kind != FA_REGION_CUDA_IPC) {
			put_str(&m, "shm", r->u.reg.shm_name);
		} else {
			put_bin(&m, "ipc", r->u.reg.ipc_handle, FA_PROTO_IPC_HANDLE_LEN);
			put_bin(&m, "gpu", r->u.reg.gpu_uuid, FA_PROTO_UUID_LEN);
		}
		break;
	case FA_OP_UNREGISTER:
		put_uint(&m, "rid", r->u.unreg.region);
		break;
	case FA_OP_ATTN_FWD:
		put_tensor(&m, "tq", &r->u.fwd.q, false);
		put_tensor(&m, "tk", &r->u.fwd.k, false);
		put_tensor(&m, "tv", &r->u.fwd.v, false);
		put_tensor(&m, "to", &r->u.fwd.o, false);
		if (r->u.fwd.lse.region != 0)
			put_tensor(&m, "lse", &r->u.fwd.lse, true);
		put_double(&m, "scale", r->u.fwd.scale);
		put_uint(&m, "mask", r->u.fwd.mask);
		put_uint(&m, "prec", r->u.fwd.precision);
		break;
	case FA_OP_ATTN_BWD:
		put_tensor(&m, "tq", &r->u.bwd.q, false);
		put_tensor(&m, "tk", &r->u.bwd.k, false);
		put_tensor(&m, "tv", &r->u.bwd.v, false);
		put_tensor(&m, "to", &r->u.bwd.o, false);
		put_tensor(&m, "lse", &r->u.bwd.lse, false);
		put_tensor(&m, "tdo", &r->u.bwd.dout, false);
		put_tensor(&m, "tdq", &r->u.bwd.dq, false);
		put_tensor(&m, "tdk", &r->u.bwd.dk, false);
		put_tensor(&m, "tdv", &r->u.bwd.dv, false);
		put_double(&m, "scale", r->u.bwd.scale);
		put_uint(&m, "mask", r->u.bwd.mask);
		put_uint(&m, "prec", r->u.bwd.precision);
		put_uint(&m, "fl", r->u.bwd.flags);
		if (r->u.bwd.async)
			put_uint(&m, "slot", r->u.bwd.slot);
		if (r->u.bwd.has_event)
			put_bin(&m, "ev", r->u.bwd.event, FA_PROTO_IPC_HANDLE_LEN);
		break;
	default:
		break;
	}
	msg_finish(&m, NULL, out);
}

/* Write a reply the way the encoder does, with the variant's changes, into out. */
static void mirror_rep(const struct fa_proto_rep *p, const struct variant *var,
                       msgpack_sbuffer *out)
{
	struct msg m;
	msg_init(&m, var, "");
	msgpack_sbuffer_init(out);
	put_uint(&m, "v", var->has_v ? var->v : FA_PROTO_VERSION);
	put_uint(&m, "op", p->op);
	put_uint(&m, "seq", p->seq);
	put_int(&m, "st", p->status);
	put_uint(&m, "ep", p->epoch);
	if (p->detail[0] != '\0' || (var->strkey && strcmp(var->strkey, "det") == 0))
		put_str(&m, "det", p->detail);
	if (p->status == FA_OK || var->force_op_keys) {
		switch (p->op) {
		case FA_OP_HELLO:
			put_uint(&m, "sid", p->u.hello.session);
			put_uint(&m, "mm", p->u.hello.max_msg);
			put_uint(&m, "mi", p->u.hello.max_inflight);
			put_uint(&m, "mr", p->u.hello.max_regions);
			put_uint(&m, "be", p->u.hello.backend);
			break;
		case FA_OP_REGISTER:
			put_uint(&m, "rid", p->u.reg.region);
			break;
		case FA_OP_ATTN_FWD:
			put_uint(&m, "ns", p->u.fwd.compute_ns);
			break;
		case FA_OP_ATTN_BWD:
			put_uint(&m, "ns", p->u.fwd.compute_ns);
			if (p->u.fwd.async)
				put_bin(&m, "ev", p->u.fwd.event, FA_PROTO_IPC_HANDLE_LEN);
			break;
		case FA_OP_STATS:
			put_str(&m, "txt", p->u.stats.text);
			break;
		default:
			break;
		}
	}
	msg_finish(&m, NULL, out);
}

/* Decode a mirrored request; the status. */
static fa_status decode_mirror_req(const struct fa_proto_req *r, const struct variant *var,
                                   struct fa_proto_req *out)
{
	msgpack_sbuffer sb;
	struct fa_proto_req dummy;
	mirror_req(r, var, &sb);
	fa_status st = fa_proto_decode_req(sb.data, sb.size, out ? out : &dummy, errbuf,
	                                   sizeof errbuf);
	msgpack_sbuffer_destroy(&sb);
	return st;
}

/* Decode a mirrored reply into rep_out; the status. */
static fa_status decode_mirror_rep(const struct fa_proto_rep *p, const struct variant *var)
{
	msgpack_sbuffer sb;
	mirror_rep(p, var, &sb);
	fa_status st = fa_proto_decode_rep(sb.data, sb.size, &rep_out, errbuf, sizeof errbuf);
	msgpack_sbuffer_destroy(&sb);
	return st;
}

/* Every request fixture the per-key tests walk (with lse, and the IPC flavour of REGISTER). */
static size_t req_fixtures(struct fa_proto_req *out)
{
	size_t n = 0;
	for (size_t i = 0; i < N_OPS; i++)
		out[n++] = req_fixture(all_ops[i]);
	out[n++] = req_fixture_ipc();
	return n;
}

/* Record the key paths of a request fixture. */
static void record_req(const struct fa_proto_req *r)
{
	struct variant none = {0};
	msgpack_sbuffer sb;
	nrecs = 0;
	recording = true;
	mirror_req(r, &none, &sb);
	recording = false;
	msgpack_sbuffer_destroy(&sb);
}

static void record_rep(const struct fa_proto_rep *p)
{
	struct variant none = {0};
	msgpack_sbuffer sb;
	nrecs = 0;
	recording = true;
	mirror_rep(p, &none, &sb);
	recording = false;
	msgpack_sbuffer_destroy(&sb);
}

/* Whether a wrong-type value is in fact of the key's own type (then it is not a wrong type). */
static bool same_class(enum cls c, enum wrong w)
{
	return (c == C_UINT && w == W_UINT) || (c == C_STR && w == W_STR) ||
	       (c == C_BIN && w == W_BIN) || (c == C_MAP && w == W_MAP) ||
	       (c == C_FLOAT && w == W_FLOAT) || (c == C_ARRAY && w == W_ARRAY);
}

/* ---- round trips ----------------------------------------------------------------------------- */

static void test_proto_round_trips_every_request_op(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_OPS; i++) {
		struct fa_proto_req r = req_fixture(all_ops[i]);
		check_req_round_trip(&r);
	}
	struct fa_proto_req ipc = req_fixture_ipc();
	check_req_round_trip(&ipc);
}

static void test_proto_round_trips_requests_with_all_fields_max(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_OPS; i++) {
		struct fa_proto_req r = req_max(all_ops[i], FA_REGION_HOST_SHM);
		check_req_round_trip(&r);
	}
	struct fa_proto_req ipc = req_max(FA_OP_REGISTER, FA_REGION_CUDA_IPC);
	check_req_round_trip(&ipc);
}

static void test_proto_round_trips_requests_with_all_fields_min(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_OPS; i++) {
		struct fa_proto_req r;
		memset(&r, 0, sizeof r);
		r.v = FA_PROTO_VERSION;
		r.op = all_ops[i];
		if (r.op == FA_OP_REGISTER)
			r.u.reg.kind = FA_REGION_HOST_SHM; /* empty name: the daemon judges names */
		if (r.op == FA_OP_UNREGISTER)
			r.u.unreg.region = 1;
		if (r.op == FA_OP_ATTN_FWD) {
			struct fa_proto_tensor t = {.region = 1, .dtype = FA_DTYPE_FP16};
			r.u.fwd.q = r.u.fwd.k = r.u.fwd.v = r.u.fwd.o = t;
		}
		if (r.op == FA_OP_ATTN_BWD) {
			struct fa_proto_tensor t = {.region = 1, .dtype = FA_DTYPE_FP16};
			r.u.bwd.q = r.u.bwd.k = r.u.bwd.v = r.u.bwd.o = r.u.bwd.lse = t;
			r.u.bwd.dout = r.u.bwd.dq = r.u.bwd.dk = r.u.bwd.dv = t;
		}
		check_req_round_trip(&r);
	}
}

static void test_proto_round_trips_attn_fwd_with_and_without_lse(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD), out;
	size_t with = check_req_round_trip(&r);
	assert_int_equal(fa_proto_decode_req(enc, with, &out, errbuf, sizeof errbuf), FA_OK);
	assert_int_equal(out.u.fwd.lse.region, 15);
	assert_int_equal(out.u.fwd.lse.shape[3], 1);

	memset(&r.u.fwd.lse, 0, sizeof r.u.fwd.lse);
	size_t without = check_req_round_trip(&r);
	assert_true(without < with);
	assert_int_equal(fa_proto_decode_req(enc, without, &out, errbuf, sizeof errbuf), FA_OK);
	struct fa_proto_tensor zero;
	memset(&zero, 0, sizeof zero);
	assert_true(proto_tensor_equal(&out.u.fwd.lse, &zero));

	/* The encoder ignores the other lse fields when lse.region is 0. */
	r.u.fwd.lse.dtype = 99;
	r.u.fwd.lse.shape[0] = -5;
	size_t len;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(len, without);

	/* Other scales, masks, precisions and dtypes. */
	r = req_fixture(FA_OP_ATTN_FWD);
	const double scales[] = {0.0, -0.0, 1.0, -2.5, 1e-300, DBL_MIN, -DBL_MAX};
	for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
		r.u.fwd.scale = scales[i];
		r.u.fwd.mask = (uint8_t)(i % 3);
		r.u.fwd.precision = (uint8_t)(i % 5);
		r.u.fwd.q.dtype = r.u.fwd.k.dtype = r.u.fwd.v.dtype = r.u.fwd.o.dtype =
			(uint8_t)(1 + i % 3);
		check_req_round_trip(&r);
	}
}

/* The encode memo (fa_proto_memo.h): a repeated request, the same but for its seq, is written
 * as exactly fa_proto_encode_req's bytes through every width of seq (a width change encodes in
 * full); any other change encodes in full; a buffer too small fails as the encoder does. */
static void test_proto_encode_memo_equals_the_encoder(void **state)
{
	(void)state;
	static struct fa_proto_req_memo m;
	static unsigned char b[4096], want[4096];
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD);
	size_t len, wlen;

	memset(&m, 0, sizeof m);
	const uint64_t seqs[] = {1, 5, 127, 128, 255, 256, 300, 70000, 70001, 1ull << 33,
	                         UINT64_MAX, 2, 3};
	for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
		r.seq = seqs[i];
		assert_int_equal(fa_proto_encode_req_memo(&m, &r, b, sizeof b, &len), FA_OK);
		assert_int_equal(fa_proto_encode_req(&r, want, sizeof want, &wlen), FA_OK);
		assert_int_equal(len, wlen);
		assert_memory_equal(b, want, len);
	}
	/* hits where the width stayed: 5, 127, 255, 300, 70001, UINT64_MAX, 3 */
	assert_int_equal(m.hits, 7);
	assert_int_equal(m.misses, 6);
	r.u.fwd.k.offset += 128; /* another request: in full */
	assert_int_equal(fa_proto_encode_req_memo(&m, &r, b, sizeof b, &len), FA_OK);
	assert_int_equal(fa_proto_encode_req(&r, want, sizeof want, &wlen), FA_OK);
	assert_int_equal(len, wlen);
	assert_memory_equal(b, want, len);
	assert_int_equal(m.misses, 7);
	assert_int_equal(fa_proto_encode_req_memo(&m, &r, b, len - 1, &len), FA_ETOOBIG);
	r.u.fwd.scale = NAN; /* what the encoder refuses, refused */
	assert_int_equal(fa_proto_encode_req_memo(&m, &r, b, sizeof b, &len), FA_EINVAL);
}

/* The decode memo (fa_proto_memo.h): a ring's repeated request, the same but for its seq,
 * decodes to exactly what fa_proto_decode_req gives, through every width of seq's encoding;
 * any other change, a seq the full decoder would refuse and bytes after it all go through the
 * full decoder, with its status and text. */
/* The forward family's FA_OK reply by the shortcut (fa_proto_rep_fast.c) and by msgpack-c:
 * the same bytes written, the same struct read, and for every changed byte the same status and
 * text as the general decoder. */
static void rep_fast_same(const unsigned char *b, size_t len)
{
	static struct fa_proto_rep a, g;
	char e1[FA_PROTO_DETAIL_MAX], e2[FA_PROTO_DETAIL_MAX];

	memset(&a, 0x5a, sizeof a);
	memset(&g, 0x5a, sizeof g);
	fa_status s1 = fa_proto_decode_rep(b, len, &a, e1, sizeof e1);
	fa_status s2 = fa_proto_decode_rep_general(b, len, &g, e2, sizeof e2);
	assert_int_equal(s1, s2);
	assert_string_equal(e1, e2);
	if (s1 == FA_OK) {
		assert_true(proto_rep_equal(&a, &g));
		assert_memory_equal(&a, &g, offsetof(struct fa_proto_rep, u) + FA_PROTO_REP_SMALL_U);
	}
}

static void test_proto_fast_reply_equals_the_general_paths(void **state)
{
	(void)state;
	static struct fa_proto_rep r, d;
	unsigned char b1[256], b2[256], m[256];
	const uint32_t ops[] = {FA_OP_ATTN_FWD, FA_OP_ATTN_VARLEN, FA_OP_ATTN_KVCACHE, FA_OP_ATTN_BWD};
	const uint64_t vals[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 1ull << 32, UINT64_MAX};
	size_t l1, l2;
	unsigned fast = 0;

	for (size_t o = 0; o < 4; o++)
		for (size_t i = 0; i < 10; i++)
			for (size_t j = 0; j < 10; j++) {
				memset(&r, 0, sizeof r);
				r.op = ops[o];
				r.seq = vals[i];
				r.epoch = vals[j];
				r.u.fwd.compute_ns = vals[(i + j) % 10];
				assert_int_equal(fa_proto_encode_rep(&r, b1, sizeof b1, &l1), FA_OK);
				assert_int_equal(fa_proto_encode_rep_general(&r, b2, sizeof b2, &l2),
				                 FA_OK);
				assert_int_equal(l1, l2);
				assert_memory_equal(b1, b2, l1);
				assert_true(fa_proto_rep_fast_decode(b1, l1, &d));
				fast++;
				rep_fast_same(b1, l1);
			}
	assert_int_equal(fast, 400);

	/* every byte of one reply changed to a few values, and every shorter length: what the
	 * shortcut takes it reads as the general decoder, what it leaves gets the decoder's own
	 * status and text */
	memset(&r, 0, sizeof r);
	r.op = FA_OP_ATTN_FWD;
	r.seq = 300;
	r.epoch = 1ull << 40;
	r.u.fwd.compute_ns = 5000;
	assert_int_equal(fa_proto_encode_rep(&r, b1, sizeof b1, &l1), FA_OK);
	const unsigned char subst[] = {0x00, 0x01, 0x02, 0x7f, 0x80, 0x86, 0x87, 0xa2, 0xc0,
	                               0xcc, 0xcf, 0xd0, 0xff, 's', 'n'};
	for (size_t i = 0; i < l1; i++)
		for (size_t k = 0; k < sizeof subst; k++) {
			memcpy(m, b1, l1);
			m[i] = subst[k];
			rep_fast_same(m, l1);
		}
	for (size_t n = 0; n <= l1; n++)
		rep_fast_same(b1, n);
	memcpy(m, b1, l1);
	m[l1] = 0xc0; /* a byte after the map */
	rep_fast_same(m, l1 + 1);
	assert_false(fa_proto_rep_fast_decode(m, l1 + 1, &d));

	/* unsigned integers in longer forms than the encoder's (v as 0xcc 0x01): still a reply
	 * the general decoder takes, and the shortcut reads it the same */
	static const unsigned char wide[] = {0x86, 0xa1, 'v', 0xcc, 0x01, 0xa2, 'o', 'p', 0xcd, 0x00,
	                                     FA_OP_ATTN_FWD, 0xa3, 's', 'e', 'q', 0xcf, 0, 0, 0, 0,
	                                     0, 0, 0, 7, 0xa2, 's', 't', 0xce, 0, 0, 0, 0, 0xa2,
	                                     'e', 'p', 0x09, 0xa2, 'n', 's', 0xcc, 0xff};
	assert_true(fa_proto_rep_fast_decode(wide, sizeof wide, &d));
	assert_int_equal(d.seq, 7);
	assert_int_equal(d.u.fwd.compute_ns, 255);
	rep_fast_same(wide, sizeof wide);

	/* what the shortcut leaves to the general path: an event, a detail, a failure, another
	 * op, a short buffer */
	r.u.fwd.async = true;
	memset(r.u.fwd.event, 7, sizeof r.u.fwd.event);
	assert_false(fa_proto_rep_fast_encode(&r, b1, sizeof b1, &l1));
	assert_int_equal(fa_proto_encode_rep(&r, b1, sizeof b1, &l1), FA_OK);
	assert_false(fa_proto_rep_fast_decode(b1, l1, &d));
	rep_fast_same(b1, l1);
	r.u.fwd.async = false;
	snprintf(r.detail, sizeof r.detail, "a note");
	assert_false(fa_proto_rep_fast_encode(&r, b1, sizeof b1, &l1));
	r.detail[0] = '\0';
	r.status = FA_EBUSY;
	assert_false(fa_proto_rep_fast_encode(&r, b1, sizeof b1, &l1));
	assert_int_equal(fa_proto_encode_rep(&r, b1, sizeof b1, &l1), FA_OK);
	rep_fast_same(b1, l1);
	r.status = FA_OK;
	r.op = FA_OP_PING;
	assert_false(fa_proto_rep_fast_encode(&r, b1, sizeof b1, &l1));
	r.op = FA_OP_ATTN_FWD;
	assert_false(fa_proto_rep_fast_encode(&r, b1, 16, &l1));
	assert_int_equal(fa_proto_encode_rep(&r, b1, 16, &l1), FA_ETOOBIG);
}

static void test_proto_decode_memo_equals_the_decoder(void **state)
{
	(void)state;
	static struct fa_proto_req_memo m;
	static unsigned char b[4096], b2[4096];
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD), a, want;
	char e1[FA_PROTO_DETAIL_MAX], e2[FA_PROTO_DETAIL_MAX];
	size_t len;

	memset(&m, 0, sizeof m);
	const uint64_t seqs[] = {1, 5, 127, 128, 255, 256, 70000, 1ull << 33, UINT64_MAX, 2};
	for (size_t i = 0; i < sizeof seqs / sizeof seqs[0]; i++) {
		r.seq = seqs[i];
		assert_int_equal(fa_proto_encode_req(&r, b, sizeof b, &len), FA_OK);
		assert_int_equal(fa_proto_decode_req_memo(&m, b, len, &a, e1, sizeof e1), FA_OK);
		assert_int_equal(fa_proto_decode_req(b, len, &want, e2, sizeof e2), FA_OK);
		assert_true(proto_req_equal(&a, &want));
		assert_int_equal(a.seq, seqs[i]);
	}
	assert_int_equal(m.misses, 1);
	assert_int_equal(m.hits, 9);

	/* another tensor offset: decoded in full, then remembered */
	r.u.fwd.q.offset += 64;
	assert_int_equal(fa_proto_encode_req(&r, b, sizeof b, &len), FA_OK);
	assert_int_equal(fa_proto_decode_req_memo(&m, b, len, &a, e1, sizeof e1), FA_OK);
	assert_int_equal(a.u.fwd.q.offset, r.u.fwd.q.offset);
	assert_int_equal(m.misses, 2);

	/* seq as a negative integer (0xd0 0xff = -1), then with a byte after the map: the full
	 * decoder's refusal, word for word */
	size_t off = 0;
	for (size_t i = 0; i + 4 <= len; i++)
		if (memcmp(b + i, "\xa3seq", 4) == 0) {
			off = i + 4;
			break;
		}
	assert_true(off > 0);
	size_t w = b[off] < 0x80 ? 1 : b[off] == 0xcc ? 2 : b[off] == 0xcd ? 3 : b[off] == 0xce ? 5 : 9;
	memcpy(b2, b, off);
	b2[off] = 0xd0;
	b2[off + 1] = 0xff;
	memcpy(b2 + off + 2, b + off + w, len - off - w);
	size_t len2 = len - w + 2;
	fa_status s1 = fa_proto_decode_req_memo(&m, b2, len2, &a, e1, sizeof e1);
	fa_status s2 = fa_proto_decode_req(b2, len2, &want, e2, sizeof e2);
	assert_int_equal(s1, s2);
	assert_int_not_equal(s1, FA_OK);
	assert_string_equal(e1, e2);
	memcpy(b2, b, len);
	b2[len] = 0xc0;
	s1 = fa_proto_decode_req_memo(&m, b2, len + 1, &a, e1, sizeof e1);
	s2 = fa_proto_decode_req(b2, len + 1, &want, e2, sizeof e2);
	assert_int_equal(s1, FA_EPROTO);
	assert_int_equal(s2, FA_EPROTO);
	assert_string_equal(e1, e2);
	/* the memo still answers the real request */
	uint64_t hits = m.hits;
	assert_int_equal(fa_proto_decode_req_memo(&m, b, len, &a, e1, sizeof e1), FA_OK);
	assert_int_equal(m.hits, hits + 1);

	/* a request whose keys come in another order is never remembered, and still decodes */
	static struct fa_proto_req_memo m2;
	memset(&m2, 0, sizeof m2);
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 3);
	msgpack_pack_str_with_body(&pk, "op", 2);
	msgpack_pack_uint64(&pk, FA_OP_PING);
	msgpack_pack_str_with_body(&pk, "v", 1);
	msgpack_pack_uint64(&pk, FA_PROTO_VERSION);
	msgpack_pack_str_with_body(&pk, "seq", 3);
	msgpack_pack_uint64(&pk, 7);
	for (int i = 0; i < 2; i++) {
		s1 = fa_proto_decode_req_memo(&m2, sb.data, sb.size, &a, e1, sizeof e1);
		s2 = fa_proto_decode_req(sb.data, sb.size, &want, e2, sizeof e2);
		assert_int_equal(s1, s2);
		if (s1 == FA_OK)
			assert_true(proto_req_equal(&a, &want));
		else
			assert_string_equal(e1, e2);
	}
	assert_false(m2.valid);
	assert_int_equal(m2.hits, 0);
	msgpack_sbuffer_destroy(&sb);
}

/* Asynchronous mode: a slot and the client's event in the request, the daemon's event in the
 * reply; an event without a slot, or a slot past the last, is refused both ways. */
static void test_proto_round_trips_async_attn_fwd_and_refuses_bad_slots(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD), out;
	size_t len, plain = check_req_round_trip(&r);

	r.u.fwd.async = true;
	r.u.fwd.slot = FA_PROTO_MAX_SLOTS - 1;
	r.u.fwd.has_event = true;
	for (int i = 0; i < FA_PROTO_IPC_HANDLE_LEN; i++)
		r.u.fwd.event[i] = (uint8_t)(0xa0 ^ i);
	size_t with = check_req_round_trip(&r);
	assert_true(with > plain);
	assert_int_equal(fa_proto_decode_req(enc, with, &out, errbuf, sizeof errbuf), FA_OK);
	assert_true(out.u.fwd.async && out.u.fwd.has_event);
	assert_int_equal(out.u.fwd.slot, FA_PROTO_MAX_SLOTS - 1);
	assert_memory_equal(out.u.fwd.event, r.u.fwd.event, FA_PROTO_IPC_HANDLE_LEN);

	/* The same bytes without the 6-byte "slot": 63 entry (fixstr key, fixint value) and one
	 * entry less in the map header: an event without a slot. */
	unsigned char cut[FA_PROTO_MAX_MSG];
	const unsigned char key[] = {0xa4, 's', 'l', 'o', 't', 0x3f};
	unsigned char *at = memmem(enc, with, key, sizeof key);
	assert_non_null(at);
	size_t pos = (size_t)(at - enc);
	assert_true(enc[0] >= 0x81 && enc[0] <= 0x8f); /* a fixmap */
	memcpy(cut, enc, pos);
	memcpy(cut + pos, enc + pos + sizeof key, with - pos - sizeof key);
	cut[0]--;
	assert_int_equal(fa_proto_decode_req(cut, with - sizeof key, &out, errbuf, sizeof errbuf),
	                 FA_EPROTO);
	assert_non_null(strstr(errbuf, "'ev' without 'slot'"));
	/* Slot 64 (patched in place: positive fixint 0x40). */
	memcpy(cut, enc, with);
	cut[pos + 5] = FA_PROTO_MAX_SLOTS;
	assert_int_equal(fa_proto_decode_req(cut, with, &out, errbuf, sizeof errbuf), FA_EPROTO);
	assert_non_null(strstr(errbuf, "'slot'"));

	/* The encoder refuses what the decoder would. */
	r.u.fwd.slot = FA_PROTO_MAX_SLOTS;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r.u.fwd.slot = 0;
	r.u.fwd.async = false;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	/* A slot alone (no event to wait on) is fine. */
	r.u.fwd.async = true;
	r.u.fwd.has_event = false;
	check_req_round_trip(&r);

	/* The reply: the daemon's event. */
	struct fa_proto_rep p, q;
	rep_fixture(FA_OP_ATTN_FWD, &p);
	p.u.fwd.async = true;
	memset(p.u.fwd.event, 0x5c, sizeof p.u.fwd.event);
	assert_int_equal(fa_proto_encode_rep(&p, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_rep(enc, len, &q, errbuf, sizeof errbuf), FA_OK);
	assert_true(q.u.fwd.async);
	assert_memory_equal(q.u.fwd.event, p.u.fwd.event, FA_PROTO_IPC_HANDLE_LEN);
	assert_int_equal(q.u.fwd.compute_ns, p.u.fwd.compute_ns);
	/* A synchronous reply has none. */
	rep_fixture(FA_OP_ATTN_FWD, &p);
	assert_int_equal(fa_proto_encode_rep(&p, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_rep(enc, len, &q, errbuf, sizeof errbuf), FA_OK);
	assert_false(q.u.fwd.async);
}

/* The backward request: every tensor by its own key, lse required, the flags, the asynchronous
 * fields as the forward's; the reply is the forward's. */
static void test_proto_round_trips_attn_bwd_with_flags_and_async(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_BWD), out;
	size_t len, plain = check_req_round_trip(&r);
	assert_int_equal(fa_proto_decode_req(enc, plain, &out, errbuf, sizeof errbuf), FA_OK);
	assert_int_equal(out.u.bwd.lse.region, 25);
	assert_int_equal(out.u.bwd.dout.region, 26);
	assert_int_equal(out.u.bwd.dv.shape[1], 300);
	assert_int_equal(out.u.bwd.flags, 0);
	assert_false(out.u.bwd.async);
	print_message("typical ATTN_BWD: %zu bytes\n", plain);
	assert_true(plain < 800);

	r.u.bwd.flags = FA_PROTO_BWD_DETERMINISTIC;
	check_req_round_trip(&r);
	/* a priority class travels as "pri" (absent: normal, so the typical size above stays) */
	r.u.bwd.priority = FA_PRIORITY_LOW;
	size_t pri = check_req_round_trip(&r);
	assert_int_equal(fa_proto_decode_req(enc, pri, &out, errbuf, sizeof errbuf), FA_OK);
	assert_int_equal(out.u.bwd.priority, FA_PRIORITY_LOW);
	r.u.bwd.priority = 3;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL);
	r.u.bwd.priority = FA_PRIORITY_NORMAL;
	r.u.bwd.async = true;
	r.u.bwd.slot = 5;
	check_req_round_trip(&r);
	r.u.bwd.has_event = true;
	memset(r.u.bwd.event, 0x3c, sizeof r.u.bwd.event);
	size_t with = check_req_round_trip(&r);
	assert_int_equal(fa_proto_decode_req(enc, with, &out, errbuf, sizeof errbuf), FA_OK);
	assert_true(out.u.bwd.async && out.u.bwd.has_event);
	assert_int_equal(out.u.bwd.slot, 5);
	assert_int_equal(out.u.bwd.flags, FA_PROTO_BWD_DETERMINISTIC);
	assert_memory_equal(out.u.bwd.event, r.u.bwd.event, FA_PROTO_IPC_HANDLE_LEN);

	struct fa_proto_req mx = req_max(FA_OP_ATTN_BWD, 0);
	len = check_req_round_trip(&mx);
	print_message("ATTN_BWD with 9 tensors, every field max: %zu bytes\n", len);
	assert_true(len < 2048);

	/* Masks, precisions, dtypes, scales. */
	r = req_fixture(FA_OP_ATTN_BWD);
	const double scales[] = {0.0, -0.0, 1.0, -2.5, 1e-300};
	for (size_t i = 0; i < sizeof scales / sizeof scales[0]; i++) {
		r.u.bwd.scale = scales[i];
		r.u.bwd.mask = (uint8_t)(i % 3);
		r.u.bwd.precision = (uint8_t)(i % 5);
		r.u.bwd.dq.dtype = (uint8_t)(1 + i % 3);
		check_req_round_trip(&r);
	}

	/* The reply: "ns", and the daemon's event when asynchronous. */
	struct fa_proto_rep p, q;
	rep_fixture(FA_OP_ATTN_BWD, &p);
	assert_int_equal(fa_proto_encode_rep(&p, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_rep(enc, len, &q, errbuf, sizeof errbuf), FA_OK);
	assert_int_equal(q.op, FA_OP_ATTN_BWD);
	assert_int_equal(q.u.fwd.compute_ns, 123456);
	assert_false(q.u.fwd.async);
	p.u.fwd.async = true;
	memset(p.u.fwd.event, 0x77, sizeof p.u.fwd.event);
	assert_int_equal(fa_proto_encode_rep(&p, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_rep(enc, len, &q, errbuf, sizeof errbuf), FA_OK);
	assert_true(q.u.fwd.async);
	assert_memory_equal(q.u.fwd.event, p.u.fwd.event, FA_PROTO_IPC_HANDLE_LEN);
}

static void test_proto_round_trips_every_reply_op(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_OPS; i++) {
		rep_fixture(all_ops[i], &rep_in);
		check_rep_round_trip();
		strcpy(rep_in.detail, "an FA_OK reply may carry a detail");
		check_rep_round_trip();
	}
}

static void test_proto_round_trips_replies_with_all_fields_max(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_OPS; i++) {
		rep_max(all_ops[i], &rep_in);
		size_t len = check_rep_round_trip();
		assert_true(len < FA_PROTO_MAX_MSG);
	}
}

static void test_proto_round_trips_failure_reply_of_every_status(void **state)
{
	(void)state;
	for (size_t s = 0; s < sizeof all_statuses / sizeof all_statuses[0]; s++) {
		if (all_statuses[s] == FA_OK)
			continue;
		for (size_t i = 0; i <= N_OPS; i++) {
			rep_fixture(i < N_OPS ? all_ops[i] : 0, &rep_in);
			rep_in.status = all_statuses[s];
			snprintf(rep_in.detail, sizeof rep_in.detail, "why: %s",
			         fa_strerror(all_statuses[s]));
			check_rep_round_trip();
			/* A failure reply carries nothing op-specific: those fields decode as zero. */
			assert_int_equal(rep_out.u.hello.session, 0);
			assert_int_equal(rep_out.u.stats.text[0], '\0');
		}
	}
	/* The longest detail, and none at all. */
	rep_fixture(0, &rep_in);
	rep_in.status = FA_EPROTO;
	memset(rep_in.detail, 'x', FA_PROTO_DETAIL_MAX - 1);
	check_rep_round_trip();
	rep_in.detail[0] = '\0';
	check_rep_round_trip();
}

static void test_proto_encodes_a_five_tensor_request_compactly(void **state)
{
	(void)state;
	struct fa_proto_req r = req_max(FA_OP_ATTN_FWD, 0);
	size_t len = check_req_round_trip(&r);
	print_message("ATTN_FWD with 5 tensors, every field max: %zu bytes\n", len);
	assert_true(len < 1024);
	r = req_fixture(FA_OP_ATTN_FWD);
	len = check_req_round_trip(&r);
	print_message("typical ATTN_FWD with lse: %zu bytes\n", len);
	assert_true(len < 400);
}

static void test_proto_hand_packer_matches_encoder(void **state)
{
	(void)state;
	struct variant none = {0};
	struct fa_proto_req reqs[N_OPS + 1];
	size_t n = req_fixtures(reqs);
	for (size_t i = 0; i < n; i++) {
		msgpack_sbuffer sb;
		size_t len;
		mirror_req(&reqs[i], &none, &sb);
		assert_int_equal(fa_proto_encode_req(&reqs[i], enc, sizeof enc, &len), FA_OK);
		assert_int_equal(sb.size, len);
		assert_memory_equal(sb.data, enc, len);
		msgpack_sbuffer_destroy(&sb);
	}
	for (size_t i = 0; i < N_OPS; i++) {
		msgpack_sbuffer sb;
		size_t len;
		rep_max(all_ops[i], &rep_in);
		mirror_rep(&rep_in, &none, &sb);
		assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_OK);
		assert_int_equal(sb.size, len);
		assert_memory_equal(sb.data, enc, len);
		msgpack_sbuffer_destroy(&sb);
	}
}

/* ---- malformed bytes ------------------------------------------------------------------------- */

static void test_proto_rejects_every_truncation_of_a_request(void **state)
{
	(void)state;
	struct fa_proto_req reqs[N_OPS + 1], out;
	size_t n = req_fixtures(reqs);
	for (size_t i = 0; i < n; i++) {
		size_t len;
		assert_int_equal(fa_proto_encode_req(&reqs[i], enc, sizeof enc, &len), FA_OK);
		for (size_t cut = 0; cut < len; cut++) {
			/* A copy of exactly `cut` bytes so ASan sees any read past the end. */
			unsigned char *p = malloc(cut ? cut : 1);
			assert_non_null(p);
			memcpy(p, enc, cut);
			EXPECT_STATUS(fa_proto_decode_req(p, cut, &out, errbuf, sizeof errbuf),
			              FA_EPROTO, "%s cut at %zu of %zu", fa_proto_op_name(reqs[i].op),
			              cut, len);
			EXPECT_STATUS(fa_proto_prescan(p, cut, errbuf, sizeof errbuf), FA_EPROTO,
			              "prescan cut at %zu", cut);
			assert_true(errbuf[0] != '\0');
			free(p);
		}
	}
}

static void test_proto_rejects_every_truncation_of_a_reply(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_OPS; i++) {
		size_t len;
		rep_max(all_ops[i], &rep_in);
		assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_OK);
		for (size_t cut = 0; cut < len; cut++) {
			unsigned char *p = malloc(cut ? cut : 1);
			assert_non_null(p);
			memcpy(p, enc, cut);
			EXPECT_STATUS(fa_proto_decode_rep(p, cut, &rep_out, errbuf, sizeof errbuf),
			              FA_EPROTO, "%s reply cut at %zu of %zu",
			              fa_proto_op_name(all_ops[i]), cut, len);
			free(p);
		}
	}
}

static void test_proto_rejects_garbage_bytes(void **state)
{
	(void)state;
	struct fa_proto_req out;
	static const struct {
		const char *bytes;
		size_t len;
	} cases[] = {
		{"\xc1", 1},                       /* the one invalid format byte */
		{"\x81\xa1v\xc1", 4},              /* ... inside a map */
		{"hello world", 11},               /* a fixint then trailing text */
		{"\xff\xff\xff\xff", 4},           /* negative fixints */
		{"\x00", 1},                       /* a valid integer, not a map */
		{"\xc0", 1},                       /* nil */
		{"\x80", 1},                       /* an empty map: no version */
		{"\x90", 1},                       /* an empty array */
		{"\xa1v", 2},                      /* a string */
		{"\xd4\x01\x02", 3},               /* a fixext */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		EXPECT_STATUS(fa_proto_decode_req(cases[i].bytes, cases[i].len, &out, errbuf,
		                                  sizeof errbuf),
		              FA_EPROTO, "garbage case %zu", i);
		EXPECT_STATUS(fa_proto_decode_rep(cases[i].bytes, cases[i].len, &rep_out, errbuf,
		                                  sizeof errbuf),
		              FA_EPROTO, "garbage reply case %zu", i);
	}
	/* Pseudo-random bytes (fixed seed, so any failure reproduces). */
	uint64_t x = 0x9e3779b97f4a7c15u;
	unsigned char buf[512];
	for (int round = 0; round < 2000; round++) {
		size_t len = 1 + (size_t)(x % sizeof buf);
		for (size_t i = 0; i < len; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			buf[i] = (unsigned char)x;
		}
		EXPECT_STATUS(fa_proto_decode_req(buf, len, &out, errbuf, sizeof errbuf), FA_EPROTO,
		              "random round %d", round);
		EXPECT_STATUS(fa_proto_decode_rep(buf, len, &rep_out, errbuf, sizeof errbuf),
		              FA_EPROTO, "random reply round %d", round);
	}
}

static void test_proto_rejects_array_header_declaring_4g_elements(void **state)
{
	(void)state;
	struct fa_proto_req out;
	const unsigned char bytes[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
	EXPECT_STATUS(fa_proto_prescan(bytes, sizeof bytes, errbuf, sizeof errbuf), FA_EPROTO,
	              "prescan");
	assert_non_null(strstr(errbuf, "4294967295"));
	EXPECT_STATUS(fa_proto_decode_req(bytes, sizeof bytes, &out, errbuf, sizeof errbuf),
	              FA_EPROTO, "decode_req");
	EXPECT_STATUS(fa_proto_decode_rep(bytes, sizeof bytes, &rep_out, errbuf, sizeof errbuf),
	              FA_EPROTO, "decode_rep");
}

static void test_proto_rejects_declared_lengths_beyond_the_bytes_left(void **state)
{
	(void)state;
	static const struct {
		const char *bytes;
		size_t len;
	} cases[] = {
		{"\xdf\xff\xff\xff\xff", 5},             /* map32 of 2^32-1 pairs */
		{"\xdf\x00\x00\x00\x02\xa1v\x01\xa1x", 10}, /* map32 of 2 pairs, 3 objects left */
		{"\xde\x00\x02\xa1v\x01\xa1x", 8},       /* map16 likewise */
		{"\x82\xa1v\x01\xa1x", 6},               /* fixmap likewise */
		{"\xdc\x00\x03\x01\x02", 5},             /* array16 of 3, 2 bytes left */
		{"\x93\x01\x02", 3},                     /* fixarray of 3 */
		{"\xdb\xff\xff\xff\xff", 5},             /* str32 of 4 GiB */
		{"\xda\x00\x05" "abcd", 7},                 /* str16 of 5, 4 left */
		{"\xd9\x05" "abcd", 6},                     /* str8 */
		{"\xa5" "abcd", 5},                         /* fixstr */
		{"\xc6\xff\xff\xff\xff", 5},             /* bin32 */
		{"\xc5\x00\x05\x01", 4},                 /* bin16 */
		{"\xc4\x05\x01", 3},                     /* bin8 */
		{"\xc9\xff\xff\xff\xff\x01", 6},         /* ext32 */
		{"\xc8\x00\x05\x01\x01", 5},             /* ext16 */
		{"\xc7\x05\x01\x01", 4},                 /* ext8 */
		{"\xd8\x01\x01\x02", 4},                 /* fixext16 with 2 bytes */
		{"\x81\xa1v\xdd\x00\x01\x00\x00", 8},    /* nested array32 of 65536 */
	};
	struct fa_proto_req out;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		EXPECT_STATUS(fa_proto_prescan(cases[i].bytes, cases[i].len, errbuf, sizeof errbuf),
		              FA_EPROTO, "prescan case %zu", i);
		EXPECT_STATUS(fa_proto_decode_req(cases[i].bytes, cases[i].len, &out, errbuf,
		                                  sizeof errbuf),
		              FA_EPROTO, "decode case %zu", i);
	}
}

/* A map {"v": 1, "x": <depth-1 nested arrays around 1>}: `depth` containers in all. */
static size_t nested(unsigned char *b, int depth)
{
	size_t n = 0;
	b[n++] = 0x82;
	b[n++] = 0xa1, b[n++] = 'v', b[n++] = 0x01;
	b[n++] = 0xa1, b[n++] = 'x';
	for (int i = 1; i < depth; i++)
		b[n++] = 0x91;
	b[n++] = 0x01;
	return n;
}

static void test_proto_rejects_nesting_deeper_than_8(void **state)
{
	(void)state;
	unsigned char b[64];
	struct fa_proto_req out;
	size_t n = nested(b, FA_PROTO_MAX_DEPTH + 1);
	EXPECT_STATUS(fa_proto_prescan(b, n, errbuf, sizeof errbuf), FA_EPROTO, "9 levels");
	assert_non_null(strstr(errbuf, "nested"));
	EXPECT_STATUS(fa_proto_decode_req(b, n, &out, errbuf, sizeof errbuf), FA_EPROTO, "9 levels");
	/* Eight levels are structurally fine (the decoder then rejects key 'x'). */
	n = nested(b, FA_PROTO_MAX_DEPTH);
	EXPECT_STATUS(fa_proto_prescan(b, n, errbuf, sizeof errbuf), FA_OK, "8 levels");
	EXPECT_STATUS(fa_proto_decode_req(b, n, &out, errbuf, sizeof errbuf), FA_EPROTO, "8 levels");
	assert_non_null(strstr(errbuf, "unknown key 'x'"));
	/* An empty container counts as a level too. */
	n = nested(b, FA_PROTO_MAX_DEPTH);
	b[n - 1] = 0x90;
	EXPECT_STATUS(fa_proto_prescan(b, n, errbuf, sizeof errbuf), FA_EPROTO, "empty 9th level");
	/* 40 nested array16s (msgpack-c's own stack limit is 32). */
	unsigned char deep[120];
	for (int i = 0; i < 40; i++)
		deep[3 * i] = 0xdc, deep[3 * i + 1] = 0xff, deep[3 * i + 2] = 0xff;
	EXPECT_STATUS(fa_proto_prescan(deep, sizeof deep, errbuf, sizeof errbuf), FA_EPROTO,
	              "40 levels");
}

static void test_proto_rejects_trailing_bytes(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_PING), out;
	size_t len;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	enc[len] = 0x00;
	EXPECT_STATUS(fa_proto_decode_req(enc, len + 1, &out, errbuf, sizeof errbuf), FA_EPROTO,
	              "one trailing byte");
	assert_non_null(strstr(errbuf, "after the message"));
	rep_fixture(FA_OP_PING, &rep_in);
	assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_OK);
	enc[len] = 0xc0;
	EXPECT_STATUS(fa_proto_decode_rep(enc, len + 1, &rep_out, errbuf, sizeof errbuf),
	              FA_EPROTO, "reply with a trailing nil");
}

static void test_proto_rejects_two_top_level_objects(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_STATS), out;
	size_t len;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	memcpy(enc + len, enc, len);
	EXPECT_STATUS(fa_proto_decode_req(enc, 2 * len, &out, errbuf, sizeof errbuf), FA_EPROTO,
	              "two requests");
	EXPECT_STATUS(fa_proto_prescan(enc, 2 * len, errbuf, sizeof errbuf), FA_EPROTO,
	              "prescan two requests");
	/* And the first one alone is fine. */
	EXPECT_STATUS(fa_proto_decode_req(enc, len, &out, errbuf, sizeof errbuf), FA_OK, "one");
}

static void test_proto_rejects_oversize_message_with_etoobig(void **state)
{
	(void)state;
	struct fa_proto_req out;
	size_t big = (size_t)1 << 20;
	unsigned char *b = calloc(1, big);
	assert_non_null(b);
	b[0] = 0x80;
	EXPECT_STATUS(fa_proto_decode_req(b, FA_PROTO_MAX_MSG + 1, &out, errbuf, sizeof errbuf),
	              FA_ETOOBIG, "64 KiB + 1");
	EXPECT_STATUS(fa_proto_decode_req(b, big, &out, errbuf, sizeof errbuf), FA_ETOOBIG,
	              "1 MiB");
	EXPECT_STATUS(fa_proto_decode_rep(b, big, &rep_out, errbuf, sizeof errbuf), FA_ETOOBIG,
	              "1 MiB reply");
	EXPECT_STATUS(fa_proto_prescan(b, FA_PROTO_MAX_MSG + 1, errbuf, sizeof errbuf), FA_ETOOBIG,
	              "prescan");
	/* Exactly the limit is judged on its structure instead. */
	EXPECT_STATUS(fa_proto_decode_req(b, FA_PROTO_MAX_MSG, &out, errbuf, sizeof errbuf),
	              FA_EPROTO, "64 KiB of an empty map and zeros");
	/* A 64 KiB str16 wrapped in nothing: one object, exactly the limit, passes the prescan. */
	b[0] = 0xda, b[1] = 0xff, b[2] = 0xfc;
	EXPECT_STATUS(fa_proto_prescan(b, FA_PROTO_MAX_MSG - 1, errbuf, sizeof errbuf), FA_OK,
	              "str16 of 65532");
	free(b);
}

static void test_proto_encoder_reports_etoobig_when_the_buffer_is_small(void **state)
{
	(void)state;
	struct fa_proto_req r = req_max(FA_OP_ATTN_FWD, 0);
	size_t len, l2;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	for (size_t cap = 0; cap < len; cap++) {
		EXPECT_STATUS(fa_proto_encode_req(&r, enc2, cap, &l2), FA_ETOOBIG, "cap %zu", cap);
		assert_int_equal(l2, 0);
	}
	assert_int_equal(fa_proto_encode_req(&r, enc2, len, &l2), FA_OK);
	assert_int_equal(l2, len);

	rep_max(FA_OP_STATS, &rep_in);
	assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_OK);
	for (size_t cap = 0; cap < len; cap += 97)
		EXPECT_STATUS(fa_proto_encode_rep(&rep_in, enc2, cap, &l2), FA_ETOOBIG, "cap %zu", cap);
	EXPECT_STATUS(fa_proto_encode_rep(&rep_in, enc2, len - 1, &l2), FA_ETOOBIG, "cap len-1");
}

/* ---- schema: every key of every op ----------------------------------------------------------- */

static void test_proto_rejects_wrong_type_for_every_request_key(void **state)
{
	(void)state;
	struct fa_proto_req reqs[N_OPS + 1];
	size_t n = req_fixtures(reqs), checked = 0;
	for (size_t i = 0; i < n; i++) {
		record_req(&reqs[i]);
		struct rec keys[MAX_RECS];
		size_t nk = nrecs;
		memcpy(keys, recs, sizeof keys);
		for (size_t k = 0; k < nk; k++) {
			for (int w = 0; w < W_COUNT; w++) {
				if (same_class(keys[k].cls, (enum wrong)w))
					continue;
				struct variant var = {.retype = keys[k].path, .wrong = (enum wrong)w};
				EXPECT_STATUS(decode_mirror_req(&reqs[i], &var, NULL), FA_EPROTO,
				              "%s key '%s' as %s", fa_proto_op_name(reqs[i].op),
				              keys[k].path, wrong_names[w]);
				checked++;
			}
		}
	}
	print_message("%zu wrong-type cases\n", checked);
}

static void test_proto_rejects_wrong_type_for_every_reply_key(void **state)
{
	(void)state;
	for (size_t i = 0; i <= N_OPS; i++) {
		if (i < N_OPS) {
			rep_max(all_ops[i], &rep_in);
		} else {
			rep_fixture(FA_OP_ATTN_FWD, &rep_in);
			rep_in.status = FA_ERANGE;
			strcpy(rep_in.detail, "q: extent ends at byte 4160, region has 4096");
		}
		record_rep(&rep_in);
		struct rec keys[MAX_RECS];
		size_t nk = nrecs;
		memcpy(keys, recs, sizeof keys);
		for (size_t k = 0; k < nk; k++) {
			for (int w = 0; w < W_COUNT; w++) {
				if (same_class(keys[k].cls, (enum wrong)w))
					continue;
				struct variant var = {.retype = keys[k].path, .wrong = (enum wrong)w};
				EXPECT_STATUS(decode_mirror_rep(&rep_in, &var), FA_EPROTO,
				              "%s reply key '%s' as %s", fa_proto_op_name(rep_in.op),
				              keys[k].path, wrong_names[w]);
			}
		}
	}
}

static void test_proto_rejects_missing_required_keys(void **state)
{
	(void)state;
	struct fa_proto_req reqs[N_OPS + 1], out;
	size_t n = req_fixtures(reqs);
	for (size_t i = 0; i < n; i++) {
		record_req(&reqs[i]);
		struct rec keys[MAX_RECS];
		size_t nk = nrecs;
		memcpy(keys, recs, sizeof keys);
		for (size_t k = 0; k < nk; k++) {
			struct variant var = {.omit = keys[k].path};
			fa_status st = decode_mirror_req(&reqs[i], &var, &out);
			EXPECT_STATUS(st, keys[k].optional ? FA_OK : FA_EPROTO, "%s without '%s'",
			              fa_proto_op_name(reqs[i].op), keys[k].path);
			if (!keys[k].optional && strcmp(keys[k].path, "v") != 0 &&
			    strchr(keys[k].path, '.') == NULL)
				assert_non_null(strstr(errbuf, "missing"));
		}
	}
	for (size_t i = 0; i < N_OPS; i++) {
		rep_max(all_ops[i], &rep_in);
		record_rep(&rep_in);
		struct rec keys[MAX_RECS];
		size_t nk = nrecs;
		memcpy(keys, recs, sizeof keys);
		for (size_t k = 0; k < nk; k++) {
			struct variant var = {.omit = keys[k].path};
			/* det in any reply, ev in an asynchronous one */
			bool optional = strcmp(keys[k].path, "det") == 0 ||
			                strcmp(keys[k].path, "ev") == 0;
			EXPECT_STATUS(decode_mirror_rep(&rep_in, &var), optional ? FA_OK : FA_EPROTO,
			              "%s reply without '%s'", fa_proto_op_name(rep_in.op),
			              keys[k].path);
		}
	}
}

static void test_proto_rejects_duplicate_keys(void **state)
{
	(void)state;
	struct fa_proto_req reqs[N_OPS + 1];
	size_t n = req_fixtures(reqs);
	for (size_t i = 0; i < n; i++) {
		record_req(&reqs[i]);
		struct rec keys[MAX_RECS];
		size_t nk = nrecs;
		memcpy(keys, recs, sizeof keys);
		for (size_t k = 0; k < nk; k++) {
			struct variant var = {.dup = keys[k].path};
			EXPECT_STATUS(decode_mirror_req(&reqs[i], &var, NULL), FA_EPROTO,
			              "%s with '%s' twice", fa_proto_op_name(reqs[i].op), keys[k].path);
			assert_non_null(strstr(errbuf, "duplicate"));
		}
	}
	for (size_t i = 0; i < N_OPS; i++) {
		rep_max(all_ops[i], &rep_in);
		record_rep(&rep_in);
		struct rec keys[MAX_RECS];
		size_t nk = nrecs;
		memcpy(keys, recs, sizeof keys);
		for (size_t k = 0; k < nk; k++) {
			struct variant var = {.dup = keys[k].path};
			EXPECT_STATUS(decode_mirror_rep(&rep_in, &var), FA_EPROTO, "%s reply with '%s' twice",
			              fa_proto_op_name(rep_in.op), keys[k].path);
		}
	}
}

static void test_proto_rejects_unknown_keys(void **state)
{
	(void)state;
	struct fa_proto_req reqs[N_OPS + 1];
	size_t n = req_fixtures(reqs);
	/* Unknown everywhere, and keys that are valid only in another op or in replies. */
	static const char *const extras[] = {"zz", "V", "", "lse", "st", "txt", "pid", "rid",
	                                     "shm", "ipc", "sid", "tdo", "fl"};
	for (size_t i = 0; i < n; i++) {
		for (size_t e = 0; e < sizeof extras / sizeof extras[0]; e++) {
			struct variant var = {.extra = extras[e]};
			fa_status st = decode_mirror_req(&reqs[i], &var, NULL);
			/* sid is a duplicate (not HELLO) or not allowed (HELLO); the others are one of:
			 * unknown, not allowed for this op, or duplicated (lse in ATTN_FWD ...). */
			EXPECT_STATUS(st, FA_EPROTO, "%s with extra key '%s'", fa_proto_op_name(reqs[i].op),
			              extras[e]);
		}
	}
	/* Unknown keys inside a tensor. */
	struct fa_proto_req fwd = req_fixture(FA_OP_ATTN_FWD);
	struct variant in_tensor = {.extra = "tk.zz"};
	EXPECT_STATUS(decode_mirror_req(&fwd, &in_tensor, NULL), FA_EPROTO, "tk.zz");
	assert_non_null(strstr(errbuf, "unknown key 'zz'"));
	/* An unprintable, long key is named safely in the detail. */
	struct variant odd = {.extra = "\x01\x02zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"};
	EXPECT_STATUS(decode_mirror_req(&fwd, &odd, NULL), FA_EPROTO, "odd key");
	assert_non_null(strstr(errbuf, "??zz"));
	assert_null(strchr(errbuf, '\x01'));
	/* Replies. */
	for (size_t i = 0; i < N_OPS; i++) {
		rep_fixture(all_ops[i], &rep_in);
		for (size_t e = 0; e < sizeof extras / sizeof extras[0]; e++) {
			if (strcmp(extras[e], "st") == 0)
				continue; /* a duplicate there; covered elsewhere */
			struct variant var = {.extra = extras[e]};
			EXPECT_STATUS(decode_mirror_rep(&rep_in, &var), FA_EPROTO, "%s reply with '%s'",
			              fa_proto_op_name(rep_in.op), extras[e]);
		}
	}
}

static void test_proto_rejects_non_string_map_keys(void **state)
{
	(void)state;
	struct fa_proto_req fwd = req_fixture(FA_OP_ATTN_FWD);
	struct variant top = {.int_key_at = ""};
	EXPECT_STATUS(decode_mirror_req(&fwd, &top, NULL), FA_EPROTO, "integer key at the top");
	assert_non_null(strstr(errbuf, "not a string"));
	struct variant tensor = {.int_key_at = "tv."};
	EXPECT_STATUS(decode_mirror_req(&fwd, &tensor, NULL), FA_EPROTO, "integer key in tv");
	rep_fixture(FA_OP_HELLO, &rep_in);
	EXPECT_STATUS(decode_mirror_rep(&rep_in, &top), FA_EPROTO, "integer key in a reply");
	/* A map key that is itself a map or an array. */
	const unsigned char map_key[] = {0x82, 0xa1, 'v', 0x01, 0x80, 0x01};
	EXPECT_STATUS(fa_proto_decode_rep(map_key, sizeof map_key, &rep_out, errbuf, sizeof errbuf),
	              FA_EPROTO, "map as key");
	const unsigned char arr_key[] = {0x82, 0x90, 0x01, 0xa1, 'v', 0x01};
	EXPECT_STATUS(fa_proto_decode_rep(arr_key, sizeof arr_key, &rep_out, errbuf, sizeof errbuf),
	              FA_EPROTO, "array as key");
}

/* ---- ranges ---------------------------------------------------------------------------------- */

/* The mirror's bytes decode to st, and the encoder refuses the same struct with FA_EINVAL. */
static void expect_req_range(const struct fa_proto_req *r, const char *what)
{
	struct variant none = {0};
	size_t len;
	EXPECT_STATUS(decode_mirror_req(r, &none, NULL), FA_EPROTO, "decode %s", what);
	EXPECT_STATUS(fa_proto_encode_req(r, enc, sizeof enc, &len), FA_EINVAL, "encode %s", what);
}

static void expect_rep_range(const struct fa_proto_rep *p, const char *what)
{
	struct variant none = {0};
	size_t len;
	EXPECT_STATUS(decode_mirror_rep(p, &none), FA_EPROTO, "decode %s", what);
	EXPECT_STATUS(fa_proto_encode_rep(p, enc, sizeof enc, &len), FA_EINVAL, "encode %s", what);
}

static void test_proto_rejects_out_of_range_enums(void **state)
{
	(void)state;
	struct fa_proto_req r;
	static const uint8_t bad_dtypes[] = {0, 4, 255};
	for (size_t i = 0; i < sizeof bad_dtypes; i++) {
		r = req_fixture(FA_OP_ATTN_FWD);
		r.u.fwd.k.dtype = bad_dtypes[i];
		expect_req_range(&r, "dtype of k");
		r = req_fixture(FA_OP_ATTN_FWD);
		r.u.fwd.lse.dtype = bad_dtypes[i];
		expect_req_range(&r, "dtype of lse");
	}
	r = req_fixture(FA_OP_ATTN_FWD);
	r.u.fwd.mask = 3;
	expect_req_range(&r, "mask 3");
	r = req_fixture(FA_OP_ATTN_FWD);
	r.u.fwd.precision = 5;
	expect_req_range(&r, "precision 5");
	r = req_fixture(FA_OP_REGISTER);
	r.u.reg.kind = 0;
	expect_req_range(&r, "region kind 0");
	r.u.reg.kind = 3;
	expect_req_range(&r, "region kind 3");

	/* Ops that do not exist: 0, the reserved 22 and 25, others. */
	static const uint32_t bad_ops[] = {0, 5, 9, 12, 19, 22, 25, 26, 1000, UINT32_MAX};
	for (size_t i = 0; i < sizeof bad_ops / sizeof bad_ops[0]; i++) {
		r = req_fixture(FA_OP_PING);
		r.op = bad_ops[i];
		expect_req_range(&r, "op");
		assert_string_equal(fa_proto_op_name(bad_ops[i]), "UNKNOWN");
	}
	/* An op number beyond 32 bits. */
	const unsigned char op64[] = {0x84, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0xcf, 0, 0, 0, 1, 0, 0,
	                              0, 3, 0xa3, 's', 'e', 'q', 0x01, 0xa3, 's', 'i', 'd', 0x01};
	struct fa_proto_req out;
	EXPECT_STATUS(fa_proto_decode_req(op64, sizeof op64, &out, errbuf, sizeof errbuf),
	              FA_EPROTO, "64-bit op");
	assert_int_equal(out.op, 0);
	assert_int_equal(out.seq, 1);

	/* Replies: backend, status. */
	rep_fixture(FA_OP_HELLO, &rep_in);
	rep_in.u.hello.backend = 0;
	expect_rep_range(&rep_in, "backend 0");
	rep_in.u.hello.backend = 3;
	expect_rep_range(&rep_in, "backend 3");
	static const int32_t bad_status[] = {-1, 25, 26, 50, 98, 100, INT32_MAX, INT32_MIN};
	for (size_t i = 0; i < sizeof bad_status / sizeof bad_status[0]; i++) {
		rep_fixture(FA_OP_PING, &rep_in);
		rep_in.status = bad_status[i];
		expect_rep_range(&rep_in, "status");
	}
	rep_fixture(FA_OP_PING, &rep_in);
	rep_in.op = 22;
	expect_rep_range(&rep_in, "reply op 22");
	rep_in.status = FA_EINVAL;
	expect_rep_range(&rep_in, "failure reply op 22");
}

/* Every ATTN_BWD field out of its range: the decoder says FA_EPROTO, the encoder FA_EINVAL. */
static void test_proto_rejects_every_attn_bwd_field_out_of_range(void **state)
{
	(void)state;
	struct fa_proto_req r;
	static const char *const names[9] = {"q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv"};
	static const uint8_t bad_dtypes[] = {0, 4, 255};
	for (int i = 0; i < 9; i++) {
		char what[64];
#define BWD_TENSOR(rq, i)                                                                      \
	((struct fa_proto_tensor *[]){&(rq).u.bwd.q, &(rq).u.bwd.k, &(rq).u.bwd.v, &(rq).u.bwd.o, \
	                              &(rq).u.bwd.lse, &(rq).u.bwd.dout, &(rq).u.bwd.dq,        \
	                              &(rq).u.bwd.dk, &(rq).u.bwd.dv})[i]
		for (size_t d = 0; d < sizeof bad_dtypes; d++) {
			r = req_fixture(FA_OP_ATTN_BWD);
			BWD_TENSOR(r, i)->dtype = bad_dtypes[d];
			snprintf(what, sizeof what, "dtype %u of %s", bad_dtypes[d], names[i]);
			expect_req_range(&r, what);
		}
		r = req_fixture(FA_OP_ATTN_BWD);
		BWD_TENSOR(r, i)->region = 0;
		snprintf(what, sizeof what, "%s in region 0", names[i]);
		expect_req_range(&r, what);
		for (int k = 0; k < 4; k++) {
			r = req_fixture(FA_OP_ATTN_BWD);
			BWD_TENSOR(r, i)->shape[k] = -1;
			snprintf(what, sizeof what, "%s shape[%d] -1", names[i], k);
			expect_req_range(&r, what);
			r = req_fixture(FA_OP_ATTN_BWD);
			BWD_TENSOR(r, i)->stride[k] = INT64_MIN;
			snprintf(what, sizeof what, "%s stride[%d] INT64_MIN", names[i], k);
			expect_req_range(&r, what);
		}
#undef BWD_TENSOR
	}
	r = req_fixture(FA_OP_ATTN_BWD);
	r.u.bwd.mask = 3;
	expect_req_range(&r, "mask 3");
	r = req_fixture(FA_OP_ATTN_BWD);
	r.u.bwd.precision = 5;
	expect_req_range(&r, "precision 5");
	static const uint32_t bad_flags[] = {2, 3, 4, 0x80000000u, UINT32_MAX};
	for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++) {
		r = req_fixture(FA_OP_ATTN_BWD);
		r.u.bwd.flags = bad_flags[i];
		expect_req_range(&r, "unknown flag bits");
		assert_non_null(strstr(errbuf, "'fl'"));
	}
	const double bad_scale[] = {NAN, INFINITY, -INFINITY};
	for (size_t i = 0; i < 3; i++) {
		r = req_fixture(FA_OP_ATTN_BWD);
		r.u.bwd.scale = bad_scale[i];
		expect_req_range(&r, "non-finite scale");
	}
	/* Slot 64; an event without a slot. */
	r = req_fixture(FA_OP_ATTN_BWD);
	r.u.bwd.async = true;
	r.u.bwd.slot = FA_PROTO_MAX_SLOTS;
	expect_req_range(&r, "slot 64");
	assert_non_null(strstr(errbuf, "'slot'"));
	r = req_fixture(FA_OP_ATTN_BWD);
	r.u.bwd.has_event = true;
	size_t len;
	EXPECT_STATUS(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL, "ev without slot");
	struct variant ev = {.extra = "ev"};
	EXPECT_STATUS(decode_mirror_req(&r, &ev, NULL), FA_EPROTO, "ev without slot");
	/* A missing lse is a missing key: the backward needs the forward's logsumexp. */
	r = req_fixture(FA_OP_ATTN_BWD);
	struct variant no_lse = {.omit = "lse"};
	EXPECT_STATUS(decode_mirror_req(&r, &no_lse, NULL), FA_EPROTO, "ATTN_BWD without lse");
	assert_non_null(strstr(errbuf, "missing key 'lse' in a ATTN_BWD request"));
	/* fl is ATTN_BWD's alone; the forward's keys are its, the backward's are not the forward's. */
	struct fa_proto_req fwd = req_fixture(FA_OP_ATTN_FWD);
	static const char *const bwd_only[] = {"fl", "tdo", "tdq", "tdk", "tdv"};
	for (size_t i = 0; i < sizeof bwd_only / sizeof bwd_only[0]; i++) {
		struct variant var = {.extra = bwd_only[i]};
		EXPECT_STATUS(decode_mirror_req(&fwd, &var, NULL), FA_EPROTO, "ATTN_FWD with %s",
		              bwd_only[i]);
		assert_non_null(strstr(errbuf, "not allowed in a ATTN_FWD request"));
	}
}

static void test_proto_rejects_negative_shape_and_stride(void **state)
{
	(void)state;
	struct fa_proto_req r, out;
	for (int i = 0; i < 4; i++) {
		r = req_fixture(FA_OP_ATTN_FWD);
		r.u.fwd.q.shape[i] = -1;
		expect_req_range(&r, "negative q shape");
		assert_non_null(strstr(errbuf, "negative"));
		r = req_fixture(FA_OP_ATTN_FWD);
		r.u.fwd.o.stride[i] = INT64_MIN;
		expect_req_range(&r, "negative o stride");
		r = req_fixture(FA_OP_ATTN_FWD);
		r.u.fwd.lse.shape[i] = -7;
		expect_req_range(&r, "negative lse shape");
	}
	/* Zero is structurally fine (validation rejects a zero size later). */
	r = req_fixture(FA_OP_ATTN_FWD);
	r.u.fwd.v.shape[1] = 0;
	r.u.fwd.v.stride[0] = 0;
	check_req_round_trip(&r);
	/* A uint64 above INT64_MAX does not fit a dimension: splice 2^63 over the first dimension
	 * of tq.sh (a fixint) in otherwise valid bytes. */
	struct variant none = {0};
	r = req_fixture(FA_OP_ATTN_FWD);
	msgpack_sbuffer sb;
	mirror_req(&r, &none, &sb);
	unsigned char *p = (unsigned char *)sb.data;
	size_t at = 0;
	for (size_t i = 0; i + 3 < sb.size; i++)
		if (p[i] == 0xa2 && p[i + 1] == 's' && p[i + 2] == 'h' && p[i + 3] == 0x94) {
			at = i + 4;
			break;
		}
	assert_true(at > 0);
	unsigned char spliced[1024];
	memcpy(spliced, p, at);
	const unsigned char u63[] = {0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0};
	memcpy(spliced + at, u63, sizeof u63);
	memcpy(spliced + at + sizeof u63, p + at + 1, sb.size - at - 1);
	size_t slen = sb.size - 1 + sizeof u63;
	msgpack_sbuffer_destroy(&sb);
	EXPECT_STATUS(fa_proto_decode_req(spliced, slen, &out, errbuf, sizeof errbuf), FA_EPROTO,
	              "shape 2^63");
	assert_non_null(strstr(errbuf, "tq"));
}

static void test_proto_rejects_dims_arrays_not_of_length_4(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD);
	static const int lens[] = {1, 2, 3, 5, 8};
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		struct variant var = {.dims_len = lens[i]};
		EXPECT_STATUS(decode_mirror_req(&r, &var, NULL), FA_EPROTO, "dims of length %d",
		              lens[i]);
	}
}

static void test_proto_rejects_wrong_bin_lengths(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture_ipc(), out;
	static const size_t ipc_lens[] = {0, 1, 16, 63, 65, 128};
	for (size_t i = 0; i < sizeof ipc_lens / sizeof ipc_lens[0]; i++) {
		struct variant var = {.binkey = "ipc", .binlen = ipc_lens[i]};
		EXPECT_STATUS(decode_mirror_req(&r, &var, NULL), FA_EPROTO, "ipc of %zu bytes",
		              ipc_lens[i]);
	}
	static const size_t uuid_lens[] = {0, 15, 17, 64};
	for (size_t i = 0; i < sizeof uuid_lens / sizeof uuid_lens[0]; i++) {
		struct variant var = {.binkey = "gpu", .binlen = uuid_lens[i]};
		EXPECT_STATUS(decode_mirror_req(&r, &var, NULL), FA_EPROTO, "gpu of %zu bytes",
		              uuid_lens[i]);
	}
	struct variant exact = {.binkey = "ipc", .binlen = 64};
	EXPECT_STATUS(decode_mirror_req(&r, &exact, &out), FA_OK, "ipc of 64 zero bytes");
	assert_int_equal(out.u.reg.ipc_handle[5], 0);
}

static void test_proto_rejects_too_long_strings_and_nul_bytes(void **state)
{
	(void)state;
	static char longstr[60001]; /* up to 60000 bytes plus the NUL */
	memset(longstr, 'a', sizeof longstr - 1);
	struct fa_proto_req out;
	struct fa_proto_req hello = req_fixture(FA_OP_HELLO), reg = req_fixture(FA_OP_REGISTER);

	struct variant name64 = {.strkey = "name", .strval = longstr, .strval_len = FA_PROTO_NAME_MAX};
	EXPECT_STATUS(decode_mirror_req(&hello, &name64, NULL), FA_EPROTO, "name of 64");
	struct variant name63 = {.strkey = "name", .strval = longstr,
	                         .strval_len = FA_PROTO_NAME_MAX - 1};
	EXPECT_STATUS(decode_mirror_req(&hello, &name63, &out), FA_OK, "name of 63");
	assert_int_equal(strlen(out.u.hello.name), FA_PROTO_NAME_MAX - 1);
	struct variant name_nul = {.strkey = "name", .strval = "ab\0cd", .strval_len = 5};
	EXPECT_STATUS(decode_mirror_req(&hello, &name_nul, NULL), FA_EPROTO, "name with NUL");
	assert_non_null(strstr(errbuf, "NUL"));
	struct variant name_empty = {.strkey = "name", .strval = ""};
	EXPECT_STATUS(decode_mirror_req(&hello, &name_empty, &out), FA_OK, "empty name");

	struct variant shm64 = {.strkey = "shm", .strval = longstr,
	                        .strval_len = FA_PROTO_SHM_NAME_MAX};
	EXPECT_STATUS(decode_mirror_req(&reg, &shm64, NULL), FA_EPROTO, "shm name of 64");
	struct variant shm_nul = {.strkey = "shm", .strval = "/fa.\0x", .strval_len = 6};
	EXPECT_STATUS(decode_mirror_req(&reg, &shm_nul, NULL), FA_EPROTO, "shm name with NUL");
	struct variant shm_huge = {.strkey = "shm", .strval = longstr, .strval_len = 60000};
	EXPECT_STATUS(decode_mirror_req(&reg, &shm_huge, NULL), FA_EPROTO, "shm name of 60000");

	rep_fixture(FA_OP_PING, &rep_in);
	rep_in.status = FA_EINVAL;
	struct variant det256 = {.strkey = "det", .strval = longstr,
	                         .strval_len = FA_PROTO_DETAIL_MAX};
	EXPECT_STATUS(decode_mirror_rep(&rep_in, &det256), FA_EPROTO, "detail of 256");
	struct variant det_nul = {.strkey = "det", .strval = "x\0", .strval_len = 2};
	EXPECT_STATUS(decode_mirror_rep(&rep_in, &det_nul), FA_EPROTO, "detail with NUL");

	rep_fixture(FA_OP_STATS, &rep_in);
	struct variant txt_max = {.strkey = "txt", .strval = longstr,
	                          .strval_len = FA_PROTO_STATS_MAX};
	EXPECT_STATUS(decode_mirror_rep(&rep_in, &txt_max), FA_EPROTO, "stats text of 16384");
	txt_max.strval_len = FA_PROTO_STATS_MAX - 1;
	EXPECT_STATUS(decode_mirror_rep(&rep_in, &txt_max), FA_OK, "stats text of 16383");

	/* The encoder refuses strings that are not terminated inside their buffers. */
	size_t len;
	memset(hello.u.hello.name, 'x', sizeof hello.u.hello.name);
	EXPECT_STATUS(fa_proto_encode_req(&hello, enc, sizeof enc, &len), FA_EINVAL, "name");
	memset(reg.u.reg.shm_name, 'x', sizeof reg.u.reg.shm_name);
	EXPECT_STATUS(fa_proto_encode_req(&reg, enc, sizeof enc, &len), FA_EINVAL, "shm");
	rep_fixture(FA_OP_STATS, &rep_in);
	memset(rep_in.detail, 'x', sizeof rep_in.detail);
	EXPECT_STATUS(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_EINVAL, "detail");
	rep_fixture(FA_OP_STATS, &rep_in);
	memset(rep_in.u.stats.text, 'x', sizeof rep_in.u.stats.text);
	EXPECT_STATUS(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_EINVAL, "text");
}

static void test_proto_rejects_region_and_session_zero(void **state)
{
	(void)state;
	struct fa_proto_req r;
	r = req_fixture(FA_OP_ATTN_FWD);
	r.u.fwd.k.region = 0;
	expect_req_range(&r, "k in region 0");
	r = req_fixture(FA_OP_UNREGISTER);
	r.u.unreg.region = 0;
	expect_req_range(&r, "UNREGISTER of region 0");
	/* A HELLO has no session yet. */
	r = req_fixture(FA_OP_HELLO);
	r.session = 5;
	size_t len;
	EXPECT_STATUS(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_EINVAL, "HELLO with sid");
	struct variant sid = {.extra = "sid"};
	r.session = 0;
	EXPECT_STATUS(decode_mirror_req(&r, &sid, NULL), FA_EPROTO, "HELLO carrying sid");
	/* Session 0 elsewhere is well-formed: the daemon answers FA_ESESSION. */
	r = req_fixture(FA_OP_PING);
	r.session = 0;
	check_req_round_trip(&r);

	rep_fixture(FA_OP_HELLO, &rep_in);
	rep_in.u.hello.session = 0;
	expect_rep_range(&rep_in, "HELLO reply with session 0");
	rep_fixture(FA_OP_REGISTER, &rep_in);
	rep_in.u.reg.region = 0;
	expect_rep_range(&rep_in, "REGISTER reply with region 0");
}

static void test_proto_rejects_register_with_keys_of_the_other_kind(void **state)
{
	(void)state;
	struct fa_proto_req shm = req_fixture(FA_OP_REGISTER), ipc = req_fixture_ipc();
	static const char *const shm_extra[] = {"ipc", "gpu"};
	for (size_t i = 0; i < 2; i++) {
		struct variant var = {.extra = shm_extra[i]};
		EXPECT_STATUS(decode_mirror_req(&shm, &var, NULL), FA_EPROTO, "HOST_SHM with %s",
		              shm_extra[i]);
	}
	struct variant with_shm = {.extra = "shm"};
	EXPECT_STATUS(decode_mirror_req(&ipc, &with_shm, NULL), FA_EPROTO, "CUDA_IPC with shm");
	/* The kind says CUDA_IPC but the key is HOST_SHM's (built by hand: the mirror follows the
	 * kind), then the same bytes with kind 1. */
	struct fa_proto_req out;
	{
		/* kind 2 carrying only shm */
		const unsigned char b[] = {0x87, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x0a, 0xa3, 's', 'e', 'q',
		                           0x01, 0xa3, 's', 'i', 'd', 0x01, 0xa4, 'k', 'i', 'n', 'd', 0x02,
		                           0xa4, 's', 'i', 'z', 'e', 0x10, 0xa3, 's', 'h', 'm', 0xa2, '/',
		                           'x'};
		EXPECT_STATUS(fa_proto_decode_req(b, sizeof b, &out, errbuf, sizeof errbuf), FA_EPROTO,
		              "kind 2 with shm");
		/* and the same bytes with kind 1 decode */
		unsigned char c[sizeof b];
		memcpy(c, b, sizeof b);
		c[23] = 0x01;
		EXPECT_STATUS(fa_proto_decode_req(c, sizeof c, &out, errbuf, sizeof errbuf), FA_OK,
		              "kind 1 with shm");
		assert_string_equal(out.u.reg.shm_name, "/x");
		assert_int_equal(out.u.reg.size, 16);
	}
	struct variant no_gpu = {.omit = "gpu"};
	EXPECT_STATUS(decode_mirror_req(&ipc, &no_gpu, NULL), FA_EPROTO, "CUDA_IPC without gpu");
	struct variant no_ipc = {.omit = "ipc"};
	EXPECT_STATUS(decode_mirror_req(&ipc, &no_ipc, NULL), FA_EPROTO, "CUDA_IPC without ipc");
}

static void test_proto_failure_replies_carry_detail_only(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_OPS; i++) {
		rep_fixture(all_ops[i], &rep_in);
		rep_in.status = FA_EBUSY;
		struct variant force = {.force_op_keys = true};
		fa_status want = (all_ops[i] == FA_OP_HELLO || all_ops[i] == FA_OP_REGISTER ||
		                  all_ops[i] == FA_OP_ATTN_FWD || all_ops[i] == FA_OP_ATTN_BWD ||
		                  all_ops[i] == FA_OP_STATS)
		                         ? FA_EPROTO
		                         : FA_OK; /* nothing op-specific to force */
		EXPECT_STATUS(decode_mirror_rep(&rep_in, &force), want, "failure %s reply with op keys",
		              fa_proto_op_name(all_ops[i]));
	}
	/* An FA_OK reply must name a real op; a failure reply may say op 0. */
	rep_fixture(FA_OP_PING, &rep_in);
	rep_in.op = 0;
	expect_rep_range(&rep_in, "FA_OK reply with op 0");
	rep_in.status = FA_EPROTO;
	struct variant none = {0};
	EXPECT_STATUS(decode_mirror_rep(&rep_in, &none), FA_OK, "failure reply with op 0");
	assert_int_equal(rep_out.op, 0);
	assert_int_equal(rep_out.status, FA_EPROTO);
}

static void test_proto_scale_must_be_a_finite_float(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD), out;
	const double bad[] = {NAN, INFINITY, -INFINITY};
	for (size_t i = 0; i < 3; i++) {
		r.u.fwd.scale = bad[i];
		expect_req_range(&r, "non-finite scale");
	}
	/* float32 is accepted (other languages' packers may use it). */
	r.u.fwd.scale = 0.125;
	struct variant f32 = {.scale_f32 = true};
	EXPECT_STATUS(decode_mirror_req(&r, &f32, &out), FA_OK, "float32 scale");
	assert_true(out.u.fwd.scale == 0.125);
	r.u.fwd.scale = (double)INFINITY;
	EXPECT_STATUS(decode_mirror_req(&r, &f32, &out), FA_EPROTO, "float32 infinity");
	/* An integer is not a float. */
	struct variant as_int = {.retype = "scale", .wrong = W_UINT};
	r.u.fwd.scale = 0.125;
	EXPECT_STATUS(decode_mirror_req(&r, &as_int, &out), FA_EPROTO, "integer scale");
}

static void test_proto_reports_wrong_version_with_peer_version(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD), out;
	static const uint64_t versions[] = {0, FA_PROTO_VERSION + 1, 77, UINT32_MAX};
	for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
		struct variant var = {.has_v = true, .v = versions[i]};
		EXPECT_STATUS(decode_mirror_req(&r, &var, &out), FA_EVERSION, "v=%llu",
		              (unsigned long long)versions[i]);
		assert_int_equal(out.v, versions[i]);
		assert_int_equal(out.op, FA_OP_ATTN_FWD);
		assert_int_equal(out.seq, 7);
		assert_int_equal(out.session, r.session);
		assert_int_equal(out.u.fwd.q.region, 0);
		/* Even when the rest is from another world (unknown keys). */
		struct variant odd = {.has_v = true, .v = versions[i], .extra = "newkey"};
		EXPECT_STATUS(decode_mirror_req(&r, &odd, &out), FA_EVERSION, "v with new key");
		assert_int_equal(out.v, versions[i]);

		rep_fixture(FA_OP_HELLO, &rep_in);
		EXPECT_STATUS(decode_mirror_rep(&rep_in, &var), FA_EVERSION, "reply v");
		assert_int_equal(rep_out.v, versions[i]);
		assert_int_equal(rep_out.op, FA_OP_HELLO);
		assert_int_equal(rep_out.seq, 7);
		assert_int_equal(rep_out.u.hello.session, 0);
	}
	/* A version that does not fit 32 bits, a negative one: unreadable, so FA_EPROTO. */
	struct variant v33 = {.has_v = true, .v = UINT64_C(1) << 32};
	EXPECT_STATUS(decode_mirror_req(&r, &v33, &out), FA_EPROTO, "v=2^32");
	assert_int_equal(out.v, 0);
	struct variant vneg = {.retype = "v", .wrong = W_NEG};
	EXPECT_STATUS(decode_mirror_req(&r, &vneg, &out), FA_EPROTO, "v=-1");
	/* The encoders write their own version whatever the struct says. */
	size_t len;
	r.v = 99;
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_req(enc, len, &out, errbuf, sizeof errbuf), FA_OK);
	assert_int_equal(out.v, FA_PROTO_VERSION);
}

static void test_proto_fills_address_fields_on_failure(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_ATTN_FWD), out;
	r.seq = 99;
	struct variant bad = {.retype = "tv.sh", .wrong = W_STR};
	EXPECT_STATUS(decode_mirror_req(&r, &bad, &out), FA_EPROTO, "bad tv.sh");
	assert_non_null(strstr(errbuf, "tv"));
	assert_int_equal(out.v, FA_PROTO_VERSION);
	assert_int_equal(out.op, FA_OP_ATTN_FWD);
	assert_int_equal(out.seq, 99);
	assert_int_equal(out.session, r.session);
	assert_int_equal(out.u.fwd.q.region, 0); /* decoded before tv, then zeroed */
	assert_true(out.u.fwd.scale == 0.0);

	/* Unknown key: still addressed. */
	struct variant unk = {.extra = "zz"};
	EXPECT_STATUS(decode_mirror_req(&r, &unk, &out), FA_EPROTO, "unknown key");
	assert_int_equal(out.seq, 99);
	assert_int_equal(out.op, FA_OP_ATTN_FWD);
	/* seq unreadable: 0, op still there. */
	struct variant badseq = {.retype = "seq", .wrong = W_NEG};
	EXPECT_STATUS(decode_mirror_req(&r, &badseq, &out), FA_EPROTO, "bad seq");
	assert_int_equal(out.seq, 0);
	assert_int_equal(out.op, FA_OP_ATTN_FWD);
	/* Bytes that are not a message: nothing to address. */
	EXPECT_STATUS(fa_proto_decode_req("\xc1", 1, &out, errbuf, sizeof errbuf), FA_EPROTO, "c1");
	assert_int_equal(out.v, 0);
	assert_int_equal(out.seq, 0);

	/* Replies. */
	rep_fixture(FA_OP_STATS, &rep_in);
	rep_in.seq = 1234;
	struct variant badtxt = {.retype = "txt", .wrong = W_BIN};
	EXPECT_STATUS(decode_mirror_rep(&rep_in, &badtxt), FA_EPROTO, "bad txt");
	assert_int_equal(rep_out.seq, 1234);
	assert_int_equal(rep_out.op, FA_OP_STATS);
	assert_int_equal(rep_out.v, FA_PROTO_VERSION);
	assert_int_equal(rep_out.status, 0);
	assert_int_equal(rep_out.epoch, 0);
}

/* ---- pre-scan of every format ---------------------------------------------------------------- */

static void test_proto_prescan_accepts_every_msgpack_format(void **state)
{
	(void)state;
	static const struct {
		const char *bytes;
		size_t len;
	} ok[] = {
		{"\x00", 1}, {"\x7f", 1}, {"\xe0", 1}, {"\xff", 1},          /* fixints */
		{"\x80", 1}, {"\x81\x01\x02", 3},                              /* fixmap */
		{"\x90", 1}, {"\x9f\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 16},
		{"\xa0", 1}, {"\xbf" "0123456789012345678901234567890", 32}, /* fixstr */
		{"\xc0", 1}, {"\xc2", 1}, {"\xc3", 1},                        /* nil, bools */
		{"\xc4\x00", 2}, {"\xc4\x01\x00", 3},                         /* bin8 */
		{"\xc5\x00\x02\x00\x00", 5}, {"\xc6\x00\x00\x00\x01\x00", 6}, /* bin16, bin32 */
		{"\xc7\x00\x05", 3}, {"\xc7\x01\x05\x00", 4},                 /* ext8 */
		{"\xc8\x00\x01\x05\x00", 5}, {"\xc9\x00\x00\x00\x01\x05\x00", 7}, /* ext16, ext32 */
		{"\xca\x00\x00\x00\x00", 5}, {"\xcb\x00\x00\x00\x00\x00\x00\x00\x00", 9}, /* floats */
		{"\xcc\xff", 2}, {"\xcd\xff\xff", 3}, {"\xce\xff\xff\xff\xff", 5},
		{"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 9},                  /* uints */
		{"\xd0\x80", 2}, {"\xd1\x80\x00", 3}, {"\xd2\x80\x00\x00\x00", 5},
		{"\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 9},                  /* ints */
		{"\xd4\x01\x00", 3}, {"\xd5\x01\x00\x00", 4}, {"\xd6\x01\x00\x00\x00\x00", 6},
		{"\xd7\x01\x00\x00\x00\x00\x00\x00\x00\x00", 10},
		{"\xd8\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", 18},
		{"\xd9\x00", 2}, {"\xd9\x02hi", 4}, {"\xda\x00\x02hi", 5},
		{"\xdb\x00\x00\x00\x02hi", 7},                                /* str8/16/32 */
		{"\xdc\x00\x00", 3}, {"\xdc\x00\x02\xc0\xc0", 5},
		{"\xdd\x00\x00\x00\x01\xc0", 6},                              /* array16/32 */
		{"\xde\x00\x00", 3}, {"\xde\x00\x01\xc0\xc0", 5},
		{"\xdf\x00\x00\x00\x01\xa1k\x91\x80", 9},                     /* map16/32, nested */
	};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		EXPECT_STATUS(fa_proto_prescan(ok[i].bytes, ok[i].len, errbuf, sizeof errbuf), FA_OK,
		              "format case %zu (0x%02x)", i, (unsigned char)ok[i].bytes[0]);
		assert_string_equal(errbuf, "");
		/* Every strict prefix is truncated. */
		for (size_t cut = 0; cut < ok[i].len; cut++)
			EXPECT_STATUS(fa_proto_prescan(ok[i].bytes, cut, errbuf, sizeof errbuf), FA_EPROTO,
			              "format case %zu cut at %zu", i, cut);
	}
	/* Every format byte alone: a complete object only for the one-byte formats. */
	for (int b = 0; b < 256; b++) {
		unsigned char one = (unsigned char)b;
		bool complete = b <= 0x80 || b == 0x90 || b == 0xa0 || b == 0xc0 || b == 0xc2 ||
		                b == 0xc3 || b >= 0xe0;
		EXPECT_STATUS(fa_proto_prescan(&one, 1, errbuf, sizeof errbuf),
		              complete ? FA_OK : FA_EPROTO, "byte 0x%02x alone", b);
	}
	EXPECT_STATUS(fa_proto_prescan("\xc1", 1, errbuf, sizeof errbuf), FA_EPROTO, "0xc1");
	assert_non_null(strstr(errbuf, "0xc1"));
	EXPECT_STATUS(fa_proto_prescan(NULL, 0, errbuf, sizeof errbuf), FA_EPROTO, "NULL");
	EXPECT_STATUS(fa_proto_prescan("\x80", 1, NULL, 0), FA_OK, "no err buffer");
	EXPECT_STATUS(fa_proto_prescan("\xc1", 1, NULL, 0), FA_EPROTO, "no err buffer");
	char tiny[4];
	EXPECT_STATUS(fa_proto_prescan("\xc1", 1, tiny, sizeof tiny), FA_EPROTO, "tiny err");
	assert_int_equal(strlen(tiny), 3);
}

static void test_proto_names_every_op(void **state)
{
	(void)state;
	static const char *const names[] = {"HELLO",    "BYE",        "PING",     "STATS",
	                                    "REGISTER", "UNREGISTER", "ATTN_FWD", "ATTN_BWD"};
	for (size_t i = 0; i < N_OPS; i++)
		assert_string_equal(fa_proto_op_name(all_ops[i]), names[i]);
	assert_string_equal(fa_proto_op_name(0), "UNKNOWN");
	assert_string_equal(fa_proto_op_name(22), "UNKNOWN");
}

static void test_proto_rejects_null_arguments(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_PING), out;
	size_t len = 123;
	assert_int_equal(fa_proto_encode_req(NULL, enc, sizeof enc, &len), FA_EINVAL);
	assert_int_equal(len, 0);
	assert_int_equal(fa_proto_encode_req(&r, NULL, sizeof enc, &len), FA_EINVAL);
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, NULL), FA_EINVAL);
	rep_fixture(FA_OP_PING, &rep_in);
	assert_int_equal(fa_proto_encode_rep(NULL, enc, sizeof enc, &len), FA_EINVAL);
	assert_int_equal(fa_proto_encode_rep(&rep_in, NULL, sizeof enc, &len), FA_EINVAL);
	assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, NULL), FA_EINVAL);
	assert_int_equal(fa_proto_encode_req(&r, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_req(enc, len, NULL, errbuf, sizeof errbuf), FA_EINVAL);
	assert_int_equal(fa_proto_decode_rep(enc, len, NULL, errbuf, sizeof errbuf), FA_EINVAL);
	assert_int_equal(fa_proto_decode_req(NULL, 0, &out, errbuf, sizeof errbuf), FA_EPROTO);
	assert_int_equal(fa_proto_decode_req(NULL, 5, &out, errbuf, sizeof errbuf), FA_EPROTO);
	assert_int_equal(fa_proto_decode_req(enc, len, &out, NULL, 0), FA_OK);
	assert_int_equal(fa_proto_decode_req("\xc1", 1, &out, NULL, 0), FA_EPROTO);
}

/* ---- CLIENTS (op 30) ------------------------------------------------------------------------- */

/* A CLIENTS reply of n entries, every field at its largest value when max. */
static void rep_clients(struct fa_proto_rep *p, uint32_t n, bool max)
{
	rep_fixture(FA_OP_CLIENTS, p);
	p->u.clients.n = n;
	for (uint32_t i = 0; i < n; i++) {
		struct fa_proto_client *c = &p->u.clients.c[i];
		memset(c, 0, sizeof *c);
		c->session = max ? UINT64_MAX - i : 1000 + i;
		c->pid = max ? UINT32_MAX : 4000 + i;
		c->pid_claimed = max ? UINT32_MAX : 4000 + i;
		c->uid = max ? UINT32_MAX : 1000;
		if (max)
			memset(c->cmd, 'c', FA_PROTO_NAME_MAX - 1);
		else
			snprintf(c->cmd, sizeof c->cmd, "trainer-%u", i);
		c->regions = max ? UINT32_MAX : 3;
		c->bytes = max ? UINT64_MAX : UINT64_C(3) << 20;
		c->inflight = max ? UINT32_MAX : 1;
		c->done = max ? UINT64_MAX : 77;
		c->since_ms = max ? UINT64_MAX : UINT64_C(1764633600000);
	}
}

static void test_proto_clients_request_round_trips_and_after_is_optional(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture(FA_OP_CLIENTS);
	size_t plain = check_req_round_trip(&r);
	r.u.clients.after = UINT64_MAX;
	assert_true(check_req_round_trip(&r) > plain);
	/* A request without "after" is what an older fa-ctl would send: it decodes to after = 0. */
	struct fa_proto_req ping = req_fixture(FA_OP_STATS);
	ping.op = FA_OP_CLIENTS;
	size_t len;
	struct fa_proto_req out;
	assert_int_equal(fa_proto_encode_req(&ping, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(len, plain);
	assert_int_equal(fa_proto_decode_req(enc, len, &out, errbuf, sizeof errbuf), FA_OK);
	assert_int_equal(out.u.clients.after, 0);
	assert_string_equal(fa_proto_op_name(FA_OP_CLIENTS), "CLIENTS");
}

static void test_proto_clients_reply_round_trips_empty_one_and_full(void **state)
{
	(void)state;
	rep_clients(&rep_in, 0, false);
	check_rep_round_trip();
	rep_clients(&rep_in, 1, false);
	check_rep_round_trip();
	/* A full reply with every field at its largest still fits one message. */
	rep_clients(&rep_in, FA_PROTO_CLIENTS_MAX, true);
	size_t len = check_rep_round_trip();
	assert_true(len < FA_PROTO_MAX_MSG);
	assert_int_equal(fa_proto_prescan(enc, len, errbuf, sizeof errbuf), FA_OK);
	print_message("  a full CLIENTS reply at the largest values: %zu bytes\n", len);
}

static void test_proto_clients_encoder_refuses_what_the_decoder_would(void **state)
{
	(void)state;
	size_t len;
	rep_clients(&rep_in, 2, false);
	rep_in.u.clients.c[1].session = 0;
	assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_EINVAL);
	rep_clients(&rep_in, 2, false);
	memset(rep_in.u.clients.c[0].cmd, 'x', sizeof rep_in.u.clients.c[0].cmd);
	assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_EINVAL);
	rep_clients(&rep_in, 2, false);
	rep_in.u.clients.n = FA_PROTO_CLIENTS_MAX + 1;
	assert_int_equal(fa_proto_encode_rep(&rep_in, enc, sizeof enc, &len), FA_EINVAL);
}

/* A CLIENTS reply packed by hand: n entries, entry `bad` changed by how. */
enum clients_bad { CB_NONE, CB_OMIT_UID, CB_EXTRA_KEY, CB_PID_TOO_BIG, CB_ID_ZERO, CB_CMD_LONG,
                   CB_NOT_MAP, CB_NOT_ARRAY };
static size_t pack_clients(unsigned char *out, size_t cap, uint32_t n, uint32_t bad,
                           enum clients_bad how)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
#define KEY(k) msgpack_pack_str_with_body(&pk, k, strlen(k))
	msgpack_pack_map(&pk, 6);
	KEY("v"), msgpack_pack_uint64(&pk, FA_PROTO_VERSION);
	KEY("op"), msgpack_pack_uint64(&pk, FA_OP_CLIENTS);
	KEY("seq"), msgpack_pack_uint64(&pk, 9);
	KEY("st"), msgpack_pack_uint64(&pk, FA_OK);
	KEY("ep"), msgpack_pack_uint64(&pk, 1);
	KEY("cl");
	if (how == CB_NOT_ARRAY) {
		msgpack_pack_uint64(&pk, 1);
		n = 0;
	} else {
		msgpack_pack_array(&pk, n);
	}
	for (uint32_t i = 0; i < n; i++) {
		bool b = i == bad;
		if (b && how == CB_NOT_MAP) {
			msgpack_pack_uint64(&pk, 5);
			continue;
		}
		msgpack_pack_map(&pk, 10 - (b && how == CB_OMIT_UID) + (b && how == CB_EXTRA_KEY));
		KEY("id"), msgpack_pack_uint64(&pk, b && how == CB_ID_ZERO ? 0 : 100 + i);
		KEY("pid"), msgpack_pack_uint64(&pk, b && how == CB_PID_TOO_BIG ? UINT64_C(1) << 32 : 7);
		KEY("cpid"), msgpack_pack_uint64(&pk, 7);
		if (!(b && how == CB_OMIT_UID))
			KEY("uid"), msgpack_pack_uint64(&pk, 1000);
		KEY("cmd");
		if (b && how == CB_CMD_LONG) {
			char longname[FA_PROTO_NAME_MAX];
			memset(longname, 'l', sizeof longname);
			msgpack_pack_str_with_body(&pk, longname, sizeof longname);
		} else {
			msgpack_pack_str_with_body(&pk, "python3", 7);
		}
		KEY("rg"), msgpack_pack_uint64(&pk, 1);
		KEY("by"), msgpack_pack_uint64(&pk, 4096);
		KEY("inf"), msgpack_pack_uint64(&pk, 0);
		KEY("done"), msgpack_pack_uint64(&pk, 3);
		KEY("since"), msgpack_pack_uint64(&pk, 1);
		if (b && how == CB_EXTRA_KEY)
			KEY("zz"), msgpack_pack_uint64(&pk, 0);
	}
#undef KEY
	assert_true(sb.size <= cap);
	memcpy(out, sb.data, sb.size);
	size_t len = sb.size;
	msgpack_sbuffer_destroy(&sb);
	return len;
}

static void test_proto_clients_decoder_rejects_bad_entries(void **state)
{
	(void)state;
	static const struct {
		enum clients_bad how;
		const char *want;
	} cases[] = {
		{CB_OMIT_UID, "client 1: missing 'uid'"},
		{CB_EXTRA_KEY, "client 1: unknown key 'zz'"},
		{CB_PID_TOO_BIG, "client 1: 'pid' out of range"},
		{CB_ID_ZERO, "client 1: 'id' out of range"},
		{CB_CMD_LONG, "key 'cmd': string of 64 bytes"},
		{CB_NOT_MAP, "client 1 is not a map"},
		{CB_NOT_ARRAY, "key 'cl': want an array"},
	};
	size_t len = pack_clients(enc, sizeof enc, 3, 9, CB_NONE);
	assert_int_equal(fa_proto_decode_rep(enc, len, &rep_out, errbuf, sizeof errbuf), FA_OK);
	assert_int_equal(rep_out.u.clients.n, 3);
	assert_string_equal(rep_out.u.clients.c[2].cmd, "python3");
	assert_int_equal(rep_out.u.clients.c[2].session, 102);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		len = pack_clients(enc, sizeof enc, 3, 1, cases[i].how);
		EXPECT_STATUS(fa_proto_decode_rep(enc, len, &rep_out, errbuf, sizeof errbuf), FA_EPROTO,
		              "case %zu", i);
		if (strstr(errbuf, cases[i].want) == NULL)
			fail_msg("case %zu: detail \"%s\" lacks \"%s\"", i, errbuf, cases[i].want);
		assert_int_equal(rep_out.op, FA_OP_CLIENTS); /* the address survives */
	}
	/* One entry more than a reply may hold. */
	len = pack_clients(enc, sizeof enc, FA_PROTO_CLIENTS_MAX + 1, UINT32_MAX, CB_NONE);
	EXPECT_STATUS(fa_proto_decode_rep(enc, len, &rep_out, errbuf, sizeof errbuf), FA_EPROTO,
	              "129 clients");
	assert_non_null(strstr(errbuf, "at most 128"));
}

/* Completion words: REGISTER's "wds" on a CUDA IPC region; ATTN_FWD's "wrg" and "wq" with a
 * slot and without an event. A missing partner, a missing slot or a zero value is refused by
 * the decoder naming the key; the encoder refuses those and an event beside the words, and
 * leaves "wds" out on host memory. */
static void test_proto_round_trips_completion_words_and_refuses_bad_combinations(void **state)
{
	(void)state;
	struct fa_proto_req r = req_fixture_ipc(), out;
	size_t len, plain = check_req_round_trip(&r);
	r.u.reg.words = true;
	size_t with = check_req_round_trip(&r);
	assert_true(with > plain);
	assert_int_equal(fa_proto_decode_req(enc, with, &out, errbuf, sizeof errbuf), FA_OK);
	assert_true(out.u.reg.words);
	/* "wds" 2 (patched in place: positive fixint) */
	const unsigned char wkey[] = {0xa3, 'w', 'd', 's', 0x01};
	unsigned char *at = memmem(enc, with, wkey, sizeof wkey);
	assert_non_null(at);
	at[4] = 2;
	assert_int_equal(fa_proto_decode_req(enc, with, &out, errbuf, sizeof errbuf), FA_EPROTO);
	assert_non_null(strstr(errbuf, "'wds'"));
	/* "wds" on a host region: the encoder leaves it out, a hand-made one is refused. */
	struct fa_proto_req h = req_fixture(FA_OP_REGISTER);
	assert_int_equal(h.u.reg.kind, FA_REGION_HOST_SHM);
	size_t hl = check_req_round_trip(&h);
	h.u.reg.words = true;
	assert_int_equal(fa_proto_encode_req(&h, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(len, hl);

	struct fa_proto_req f = req_fixture(FA_OP_ATTN_FWD);
	f.u.fwd.async = true;
	f.u.fwd.slot = 7;
	f.u.fwd.words_region = UINT64_MAX;
	f.u.fwd.words_seq = UINT64_MAX - 1;
	size_t fl = check_req_round_trip(&f);
	assert_int_equal(fa_proto_decode_req(enc, fl, &out, errbuf, sizeof errbuf), FA_OK);
	assert_true(out.u.fwd.async && !out.u.fwd.has_event);
	assert_int_equal(out.u.fwd.slot, 7);
	assert_true(out.u.fwd.words_region == UINT64_MAX && out.u.fwd.words_seq == UINT64_MAX - 1);
	/* Small values, then each key cut out in turn (fixstr key of 2 + positive fixint). */
	f.u.fwd.words_region = 9;
	f.u.fwd.words_seq = 5;
	fl = check_req_round_trip(&f);
	static const struct {
		unsigned char key[4];
		const char *want;
	} cuts[] = {
		{{0xa3, 'w', 'r', 'g'}, "'wq' without 'wrg'"},
		{{0xa2, 'w', 'q', 0x05}, "'wrg' without 'wq'"},
		{{0xa4, 's', 'l', 'o'}, "without 'slot'"},
	};
	unsigned char cut[FA_PROTO_MAX_MSG];
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		size_t klen = i == 0 ? 5 : i == 2 ? 6 : 4; /* "wrg" 5 bytes with its value, "slot" 6 */
		at = memmem(enc, fl, cuts[i].key, 4);
		assert_non_null(at);
		size_t pos = (size_t)(at - enc);
		assert_true(enc[0] >= 0x81 && enc[0] <= 0x8f);
		memcpy(cut, enc, pos);
		memcpy(cut + pos, enc + pos + klen, fl - pos - klen);
		cut[0]--;
		assert_int_equal(fa_proto_decode_req(cut, fl - klen, &out, errbuf, sizeof errbuf),
		                 FA_EPROTO);
		assert_non_null(strstr(errbuf, cuts[i].want));
	}
	/* Zero values (patched in place). */
	for (int k = 0; k < 2; k++) {
		const unsigned char wrg[4] = {0xa3, 'w', 'r', 'g'}, wq[3] = {0xa2, 'w', 'q'};
		memcpy(cut, enc, fl);
		at = k == 0 ? memmem(cut, fl, wrg, 4) : memmem(cut, fl, wq, 3);
		assert_non_null(at);
		at[k == 0 ? 4 : 3] = 0;
		assert_int_equal(fa_proto_decode_req(cut, fl, &out, errbuf, sizeof errbuf), FA_EPROTO);
		assert_non_null(strstr(errbuf, k == 0 ? "'wrg'" : "'wq'"));
	}
	/* The encoder refuses what the decoder would: an event beside the words, no slot, wq 0. */
	f.u.fwd.has_event = true;
	assert_int_equal(fa_proto_encode_req(&f, enc, sizeof enc, &len), FA_EINVAL);
	f.u.fwd.has_event = false;
	f.u.fwd.async = false;
	assert_int_equal(fa_proto_encode_req(&f, enc, sizeof enc, &len), FA_EINVAL);
	f.u.fwd.async = true;
	f.u.fwd.words_seq = 0;
	assert_int_equal(fa_proto_encode_req(&f, enc, sizeof enc, &len), FA_EINVAL);
	/* A words call's reply carries no event. */
	struct fa_proto_rep p, q;
	rep_fixture(FA_OP_ATTN_FWD, &p);
	assert_int_equal(fa_proto_encode_rep(&p, enc, sizeof enc, &len), FA_OK);
	assert_int_equal(fa_proto_decode_rep(enc, len, &q, errbuf, sizeof errbuf), FA_OK);
	assert_false(q.u.fwd.async);
}

/* RING_OPEN (op 50): the shm name and size there and back, the ring id in the reply; a request
 * without its name, or a reply without its id, does not decode. */
static void test_proto_ring_open_round_trips_and_needs_its_keys(void **state)
{
	(void)state;
	struct fa_proto_req q, d;
	struct fa_proto_rep r, rd;
	unsigned char buf[1024];
	char err[256];
	size_t len;

	memset(&q, 0, sizeof q);
	q.op = FA_OP_RING_OPEN;
	q.session = 5;
	q.seq = 9;
	q.u.reg.size = 266240;
	strcpy(q.u.reg.shm_name, "/faring.1000.42.0123456789abcdef");
	assert_int_equal(fa_proto_encode_req(&q, buf, sizeof buf, &len), FA_OK);
	assert_int_equal(fa_proto_decode_req(buf, len, &d, err, sizeof err), FA_OK);
	assert_int_equal(d.op, FA_OP_RING_OPEN);
	assert_int_equal(d.u.reg.size, 266240);
	assert_string_equal(d.u.reg.shm_name, q.u.reg.shm_name);
	assert_string_equal(fa_proto_op_name(FA_OP_RING_OPEN), "RING_OPEN");
	q.u.reg.shm_name[0] = '\0'; /* encoded, but the daemon judges names */
	assert_int_equal(fa_proto_encode_req(&q, buf, sizeof buf, &len), FA_OK);
	/* no "shm": a map of v, op, seq, sid, size only */
	unsigned char nos[] = {0x85, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0x32, 0xa3, 's', 'e', 'q',
	                       0x01, 0xa3, 's', 'i', 'd', 0x05, 0xa4, 's', 'i', 'z', 'e', 0x01};
	assert_int_equal(fa_proto_decode_req(nos, sizeof nos, &d, err, sizeof err), FA_EPROTO);
	memset(&r, 0, sizeof r);
	r.op = FA_OP_RING_OPEN;
	r.seq = 9;
	r.u.reg.region = 77;
	assert_int_equal(fa_proto_encode_rep(&r, buf, sizeof buf, &len), FA_OK);
	assert_int_equal(fa_proto_decode_rep(buf, len, &rd, err, sizeof err), FA_OK);
	assert_int_equal(rd.u.reg.region, 77);
	r.u.reg.region = 0;
	assert_int_equal(fa_proto_encode_rep(&r, buf, sizeof buf, &len), FA_EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_proto_round_trips_every_request_op),
		cmocka_unit_test(test_proto_round_trips_requests_with_all_fields_max),
		cmocka_unit_test(test_proto_round_trips_requests_with_all_fields_min),
		cmocka_unit_test(test_proto_ring_open_round_trips_and_needs_its_keys),
		cmocka_unit_test(test_proto_round_trips_attn_fwd_with_and_without_lse),
		cmocka_unit_test(test_proto_fast_reply_equals_the_general_paths),
		cmocka_unit_test(test_proto_decode_memo_equals_the_decoder),
		cmocka_unit_test(test_proto_encode_memo_equals_the_encoder),
		cmocka_unit_test(test_proto_round_trips_async_attn_fwd_and_refuses_bad_slots),
		cmocka_unit_test(test_proto_round_trips_attn_bwd_with_flags_and_async),
		cmocka_unit_test(test_proto_rejects_every_attn_bwd_field_out_of_range),
		cmocka_unit_test(test_proto_round_trips_completion_words_and_refuses_bad_combinations),
		cmocka_unit_test(test_proto_round_trips_every_reply_op),
		cmocka_unit_test(test_proto_round_trips_replies_with_all_fields_max),
		cmocka_unit_test(test_proto_round_trips_failure_reply_of_every_status),
		cmocka_unit_test(test_proto_encodes_a_five_tensor_request_compactly),
		cmocka_unit_test(test_proto_hand_packer_matches_encoder),
		cmocka_unit_test(test_proto_rejects_every_truncation_of_a_request),
		cmocka_unit_test(test_proto_rejects_every_truncation_of_a_reply),
		cmocka_unit_test(test_proto_rejects_garbage_bytes),
		cmocka_unit_test(test_proto_rejects_array_header_declaring_4g_elements),
		cmocka_unit_test(test_proto_rejects_declared_lengths_beyond_the_bytes_left),
		cmocka_unit_test(test_proto_rejects_nesting_deeper_than_8),
		cmocka_unit_test(test_proto_rejects_trailing_bytes),
		cmocka_unit_test(test_proto_rejects_two_top_level_objects),
		cmocka_unit_test(test_proto_rejects_oversize_message_with_etoobig),
		cmocka_unit_test(test_proto_encoder_reports_etoobig_when_the_buffer_is_small),
		cmocka_unit_test(test_proto_rejects_wrong_type_for_every_request_key),
		cmocka_unit_test(test_proto_rejects_wrong_type_for_every_reply_key),
		cmocka_unit_test(test_proto_rejects_missing_required_keys),
		cmocka_unit_test(test_proto_rejects_duplicate_keys),
		cmocka_unit_test(test_proto_rejects_unknown_keys),
		cmocka_unit_test(test_proto_rejects_non_string_map_keys),
		cmocka_unit_test(test_proto_rejects_out_of_range_enums),
		cmocka_unit_test(test_proto_rejects_negative_shape_and_stride),
		cmocka_unit_test(test_proto_rejects_dims_arrays_not_of_length_4),
		cmocka_unit_test(test_proto_rejects_wrong_bin_lengths),
		cmocka_unit_test(test_proto_rejects_too_long_strings_and_nul_bytes),
		cmocka_unit_test(test_proto_rejects_region_and_session_zero),
		cmocka_unit_test(test_proto_rejects_register_with_keys_of_the_other_kind),
		cmocka_unit_test(test_proto_failure_replies_carry_detail_only),
		cmocka_unit_test(test_proto_scale_must_be_a_finite_float),
		cmocka_unit_test(test_proto_reports_wrong_version_with_peer_version),
		cmocka_unit_test(test_proto_fills_address_fields_on_failure),
		cmocka_unit_test(test_proto_prescan_accepts_every_msgpack_format),
		cmocka_unit_test(test_proto_names_every_op),
		cmocka_unit_test(test_proto_rejects_null_arguments),
		cmocka_unit_test(test_proto_clients_request_round_trips_and_after_is_optional),
		cmocka_unit_test(test_proto_clients_reply_round_trips_empty_one_and_full),
		cmocka_unit_test(test_proto_clients_encoder_refuses_what_the_decoder_would),
		cmocka_unit_test(test_proto_clients_decoder_rejects_bad_entries),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
