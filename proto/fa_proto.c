/* fa_proto.c - encode and decode the wire messages (PROTOCOL.md describes every key).
 *
 * Encoding packs with msgpack-c into the caller's buffer through a fixed-capacity writer, so it
 * never allocates and "does not fit" is simply FA_ETOOBIG. Decoding trusts nothing: the bytes pass
 * fa_proto_prescan() before msgpack-c unpacks them, then every key is looked up in one table,
 * duplicates and keys the message may not carry are rejected, and every value's type and range is
 * checked before it is narrowed into the struct. Strings and bins point into the caller's buffer
 * while unpacked; they are copied out before the zone is freed.
 *
 * Invariant (the fuzzer checks it): whatever decodes successfully re-encodes, and decoding that
 * again gives the same struct; whatever the encoder accepts, the decoder accepts.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "fa_err.h"
#include "fa_proto.h"

/* ---- keys ------------------------------------------------------------------------------------ */

/* Every key of a message map, requests and replies together (one namespace keeps the table and
 * its lookup in one place; which keys a message may carry is decided per op below). */
enum key {
	K_V,     /* uint: protocol version (every message) */
	K_OP,    /* uint: enum fa_op (every message) */
	K_SEQ,   /* uint64: sequence number (every message) */
	K_SID,   /* uint64: session (requests but HELLO; HELLO's reply) */
	K_PID,   /* uint32: client pid (HELLO) */
	K_NAME,  /* str < 64: client program name (HELLO) */
	K_KIND,  /* uint: enum fa_region_kind (REGISTER) */
	K_SIZE,  /* uint64: bytes (REGISTER) */
	K_SHM,   /* str < 64: shm object name (REGISTER, HOST_SHM) */
	K_IPC,   /* bin 64: cudaIpcMemHandle_t (REGISTER, CUDA_IPC) */
	K_GPU,   /* bin 16: GPU UUID (REGISTER, CUDA_IPC) */
	K_RID,   /* uint64 != 0: region (UNREGISTER; REGISTER's reply) */
	K_TQ,    /* tensor: q (ATTN_FWD) */
	K_TK,    /* tensor: k */
	K_TV,    /* tensor: v */
	K_TO,    /* tensor: o */
	K_LSE,   /* tensor: lse, optional */
	K_SCALE, /* float: softmax scale, 0 = 1/sqrt(D) */
	K_MASK,  /* uint: enum fa_mask */
	K_PREC,  /* uint: enum fa_precision */
	K_ST,    /* uint: fa_status (every reply) */
	K_EP,    /* uint64: daemon epoch (every reply) */
	K_DET,   /* str < 256: detail text (any reply, optional) */
	K_MM,    /* uint32: max message bytes (HELLO reply) */
	K_MI,    /* uint32: max in-flight calls per session (HELLO reply) */
	K_MR,    /* uint32: max regions per session (HELLO reply) */
	K_BE,    /* uint: enum fa_backend_kind (HELLO reply) */
	K_NS,    /* uint64: backend time in ns (ATTN_FWD reply) */
	K_TXT,   /* str < 16384: statistics text (STATS reply) */
	K_SLOT,  /* uint < FA_PROTO_MAX_SLOTS: asynchronous mode's slot (ATTN_FWD, optional) */
	K_EV,    /* bin 64: CUDA IPC event handle (async ATTN_FWD: the client's; its reply: the
	          * daemon's) */
	K_WDS,   /* uint 0..1: the region holds completion words (REGISTER, CUDA_IPC, optional) */
	K_WR,    /* uint64 != 0: the completion words' region (async ATTN_FWD, optional) */
	K_WQ,    /* uint64 != 0: the call's completion-word value (async ATTN_FWD, with K_WR) */
	K_COUNT
};

static const char *const key_names[K_COUNT] = {
	[K_V] = "v",       [K_OP] = "op",     [K_SEQ] = "seq",    [K_SID] = "sid",
	[K_PID] = "pid",   [K_NAME] = "name", [K_KIND] = "kind",  [K_SIZE] = "size",
	[K_SHM] = "shm",   [K_IPC] = "ipc",   [K_GPU] = "gpu",    [K_RID] = "rid",
	[K_TQ] = "tq",     [K_TK] = "tk",     [K_TV] = "tv",      [K_TO] = "to",
	[K_LSE] = "lse",   [K_SCALE] = "scale", [K_MASK] = "mask", [K_PREC] = "prec",
	[K_ST] = "st",     [K_EP] = "ep",     [K_DET] = "det",    [K_MM] = "mm",
	[K_MI] = "mi",     [K_MR] = "mr",     [K_BE] = "be",      [K_NS] = "ns",
	[K_TXT] = "txt",   [K_SLOT] = "slot", [K_EV] = "ev",     [K_WDS] = "wds",
	[K_WR] = "wr",     [K_WQ] = "wq",
};

/* Keys of a tensor map. */
enum tkey { T_R, T_O, T_T, T_SH, T_ST, T_COUNT };
static const char *const tkey_names[T_COUNT] = {
	[T_R] = "r",   /* uint64 != 0: region */
	[T_O] = "o",   /* uint64: byte offset */
	[T_T] = "t",   /* uint: enum fa_dtype */
	[T_SH] = "sh", /* array of 4 int64 >= 0: shape */
	[T_ST] = "st", /* array of 4 int64 >= 0: strides in elements */
};

/* Key sets are 64-bit masks: more than 32 keys exist. */
#define KB(k) (UINT64_C(1) << (k))
_Static_assert(K_COUNT <= 64, "a key set is a uint64_t");

/* Keys every request carries; every reply carries; and the optional reply detail. */
#define REQ_COMMON (KB(K_V) | KB(K_OP) | KB(K_SEQ))
#define REP_COMMON (KB(K_V) | KB(K_OP) | KB(K_SEQ) | KB(K_ST) | KB(K_EP))

/* Per op: its name, the request keys it requires beyond REQ_COMMON, the optional ones, the
 * keys its FA_OK reply requires beyond REP_COMMON, and the reply's optional ones. */
static const struct op_info {
	uint32_t op;
	const char *name;
	uint64_t req_need;
	uint64_t req_opt;
	uint64_t rep_need;
	uint64_t rep_opt;
} op_table[] = {
	{FA_OP_HELLO, "HELLO", KB(K_PID) | KB(K_NAME), 0,
	 KB(K_SID) | KB(K_MM) | KB(K_MI) | KB(K_MR) | KB(K_BE)},
	{FA_OP_BYE, "BYE", KB(K_SID), 0, 0},
	{FA_OP_PING, "PING", KB(K_SID), 0, 0},
	{FA_OP_STATS, "STATS", KB(K_SID), 0, KB(K_TXT)},
	{FA_OP_REGISTER, "REGISTER", KB(K_SID) | KB(K_KIND) | KB(K_SIZE),
	 KB(K_SHM) | KB(K_IPC) | KB(K_GPU) | KB(K_WDS), KB(K_RID)},
	{FA_OP_UNREGISTER, "UNREGISTER", KB(K_SID) | KB(K_RID), 0, 0},
	{FA_OP_ATTN_FWD, "ATTN_FWD",
	 KB(K_SID) | KB(K_TQ) | KB(K_TK) | KB(K_TV) | KB(K_TO) | KB(K_SCALE) | KB(K_MASK) |
		 KB(K_PREC),
	 KB(K_LSE) | KB(K_SLOT) | KB(K_EV) | KB(K_WR) | KB(K_WQ), KB(K_NS), KB(K_EV)},
};

/* The table entry of an op, or NULL when the number is not an op of this version. */
static const struct op_info *op_find(uint64_t op)
{
	for (size_t i = 0; i < sizeof op_table / sizeof op_table[0]; i++)
		if (op_table[i].op == op)
			return &op_table[i];
	return NULL;
}

/* Name of an op for logs. */
const char *fa_proto_op_name(uint32_t op)
{
	const struct op_info *oi = op_find(op);
	return oi ? oi->name : "UNKNOWN";
}

/* ---- errors ---------------------------------------------------------------------------------- */

/* A key from the wire made safe for a detail text: printable ASCII only, at most 16 bytes. */
static void key_printable(const msgpack_object_str *s, char out[24])
{
	size_t n = s->size < 16 ? s->size : 16;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s->ptr[i];
		out[i] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
	}
	strcpy(out + n, s->size > 16 ? "..." : "");
}

/* ---- decoding helpers ------------------------------------------------------------------------ */

/* Sort a map's values by key through `names` (count <= 32): val[k] gets the value of key k.
 * Returns false with a reason in bad on a non-string key, an unknown key or a duplicate; the
 * known keys seen before the problem are still filled in (the version is read from them). */
static bool map_collect(const msgpack_object_map *m, const char *const *names, int count,
                        const msgpack_object **val, char *bad, size_t badlen)
{
	bool ok = true;
	for (uint32_t i = 0; i < m->size; i++) {
		const msgpack_object *ko = &m->ptr[i].key;
		if (ko->type != MSGPACK_OBJECT_STR) {
			if (ok)
				snprintf(bad, badlen, "a map key is not a string");
			ok = false;
			continue;
		}
		int k;
		for (k = 0; k < count; k++)
			if (strlen(names[k]) == ko->via.str.size &&
			    memcmp(names[k], ko->via.str.ptr, ko->via.str.size) == 0)
				break;
		if (k == count) {
			if (ok) {
				char pk[24];
				key_printable(&ko->via.str, pk);
				snprintf(bad, badlen, "unknown key '%s'", pk);
			}
			ok = false;
		} else if (val[k]) {
			if (ok)
				snprintf(bad, badlen, "duplicate key '%s'", names[k]);
			ok = false;
		} else {
			val[k] = &m->ptr[i].val;
		}
	}
	return ok;
}

/* An unsigned integer <= max. */
static bool get_uint(const msgpack_object *o, uint64_t max, uint64_t *out)
{
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max)
		return false;
	*out = o->via.u64;
	return true;
}

/* A string that fits in cap bytes with its NUL and contains no NUL, copied into dst. */
static fa_status get_str(const msgpack_object *o, const char *key, char *dst, size_t cap,
                         char *err, size_t errlen)
{
	if (o->type != MSGPACK_OBJECT_STR)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': want a string", key);
	if (o->via.str.size >= cap)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': string of %u bytes, at most %zu", key,
		              o->via.str.size, cap - 1);
	if (o->via.str.size > 0 && memchr(o->via.str.ptr, '\0', o->via.str.size))
		return fa_err(err, errlen, FA_EPROTO, "key '%s': string contains a NUL byte", key);
	if (o->via.str.size > 0)
		memcpy(dst, o->via.str.ptr, o->via.str.size);
	dst[o->via.str.size] = '\0';
	return FA_OK;
}

/* A bin of exactly n bytes, copied into dst. */
static fa_status get_bin(const msgpack_object *o, const char *key, uint8_t *dst, size_t n,
                         char *err, size_t errlen)
{
	if (o->type != MSGPACK_OBJECT_BIN)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': want a bin", key);
	if (o->via.bin.size != n)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': bin of %u bytes, want %zu", key,
		              o->via.bin.size, n);
	memcpy(dst, o->via.bin.ptr, n);
	return FA_OK;
}

/* An array of exactly 4 integers in [0, INT64_MAX]. */
static fa_status get_dims(const msgpack_object *o, const char *key, const char *what,
                          int64_t dst[4], char *err, size_t errlen)
{
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 4)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': '%s' must be an array of 4 integers",
		              key, what);
	for (int i = 0; i < 4; i++) {
		const msgpack_object *e = &o->via.array.ptr[i];
		if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
			return fa_err(err, errlen, FA_EPROTO, "key '%s': %s[%d] is negative", key, what, i);
		uint64_t u;
		if (!get_uint(e, INT64_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO, "key '%s': %s[%d] must be an integer < 2^63",
			              key, what, i);
		dst[i] = (int64_t)u;
	}
	return FA_OK;
}

/* A tensor map {r, o, t, sh, st}, every key required. */
static fa_status get_tensor(const msgpack_object *o, const char *key, struct fa_proto_tensor *t,
                            char *err, size_t errlen)
{
	const msgpack_object *val[T_COUNT] = {0};
	char bad[64];
	uint64_t u;
	fa_status st;

	if (o->type != MSGPACK_OBJECT_MAP)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': want a tensor map", key);
	if (!map_collect(&o->via.map, tkey_names, T_COUNT, val, bad, sizeof bad))
		return fa_err(err, errlen, FA_EPROTO, "key '%s': %s", key, bad);
	for (int k = 0; k < T_COUNT; k++)
		if (!val[k])
			return fa_err(err, errlen, FA_EPROTO, "key '%s': missing '%s'", key, tkey_names[k]);
	if (!get_uint(val[T_R], UINT64_MAX, &u) || u == 0)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': 'r' must be a region id > 0", key);
	t->region = u;
	if (!get_uint(val[T_O], UINT64_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key '%s': 'o' must be an unsigned integer", key);
	t->offset = u;
	if (!get_uint(val[T_T], FA_DTYPE_FP32, &u) || u < FA_DTYPE_FP16)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': 't' must be a dtype 1..3", key);
	t->dtype = (uint8_t)u;
	if ((st = get_dims(val[T_SH], key, "sh", t->shape, err, errlen)) != FA_OK)
		return st;
	return get_dims(val[T_ST], key, "st", t->stride, err, errlen);
}

/* Check that exactly the keys in `need` and some of `opt` are present. */
static fa_status check_keys(const msgpack_object *const *val, uint64_t need, uint64_t opt,
                            const char *what, char *err, size_t errlen)
{
	for (int k = 0; k < K_COUNT; k++) {
		if (val[k] && !((need | opt) & KB(k)))
			return fa_err(err, errlen, FA_EPROTO, "key '%s' not allowed in %s", key_names[k],
			              what);
		if (!val[k] && (need & KB(k)))
			return fa_err(err, errlen, FA_EPROTO, "missing key '%s' in %s", key_names[k], what);
	}
	return FA_OK;
}

/* Pre-scan, unpack, require one map consuming the whole buffer. On FA_OK the caller destroys up. */
static fa_status unpack_map(const void *buf, size_t len, msgpack_unpacked *up, char *err,
                            size_t errlen)
{
	fa_status st = fa_proto_prescan(buf, len, err, errlen);
	if (st != FA_OK)
		return st;
	msgpack_unpacked_init(up);
	size_t off = 0;
	msgpack_unpack_return r = msgpack_unpack_next(up, buf, len, &off);
	if (r == MSGPACK_UNPACK_NOMEM_ERROR)
		st = fa_err(err, errlen, FA_ENOMEM, "out of memory unpacking %zu bytes", len);
	else if (r != MSGPACK_UNPACK_SUCCESS || off != len)
		st = fa_err(err, errlen, FA_EPROTO, "msgpack-c rejected the message (%d at byte %zu)",
		            (int)r, off);
	else if (up->data.type != MSGPACK_OBJECT_MAP)
		st = fa_err(err, errlen, FA_EPROTO, "message is not a map");
	if (st != FA_OK)
		msgpack_unpacked_destroy(up);
	return st;
}

/* ---- request decoding ------------------------------------------------------------------------ */

/* The REGISTER part: kind decides which of shm / ipc+gpu must be there. */
static fa_status decode_register(const msgpack_object *const *val, struct fa_proto_req *out,
                                 char *err, size_t errlen)
{
	uint64_t u;
	fa_status st;

	if (!get_uint(val[K_KIND], FA_REGION_CUDA_IPC, &u) || u < FA_REGION_HOST_SHM)
		return fa_err(err, errlen, FA_EPROTO, "key 'kind': must be a region kind 1..2");
	out->u.reg.kind = (uint8_t)u;
	if (!get_uint(val[K_SIZE], UINT64_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'size': want an unsigned integer");
	out->u.reg.size = u;
	/* The kind decides which keys the registration carries. */
	bool shm = out->u.reg.kind == FA_REGION_HOST_SHM;
	const char *what = shm ? "a HOST_SHM REGISTER request" : "a CUDA_IPC REGISTER request";
	uint64_t need = REQ_COMMON | KB(K_SID) | KB(K_KIND) | KB(K_SIZE) |
	                (shm ? KB(K_SHM) : KB(K_IPC) | KB(K_GPU));
	if ((st = check_keys(val, need, shm ? 0 : KB(K_WDS), what, err, errlen)) != FA_OK)
		return st;
	if (val[K_WDS]) {
		if (!get_uint(val[K_WDS], 1, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'wds': must be 0 or 1");
		out->u.reg.words = u == 1;
	}
	if (shm)
		return get_str(val[K_SHM], "shm", out->u.reg.shm_name, FA_PROTO_SHM_NAME_MAX, err,
		               errlen);
	if ((st = get_bin(val[K_IPC], "ipc", out->u.reg.ipc_handle, FA_PROTO_IPC_HANDLE_LEN, err,
	                  errlen)) != FA_OK)
		return st;
	return get_bin(val[K_GPU], "gpu", out->u.reg.gpu_uuid, FA_PROTO_UUID_LEN, err, errlen);
}

/* The ATTN_FWD part. */
static fa_status decode_fwd(const msgpack_object *const *val, struct fa_proto_req *out, char *err,
                            size_t errlen)
{
	static const struct {
		enum key k;
		size_t off;
	} tensors[] = {
		{K_TQ, offsetof(struct fa_proto_req, u.fwd.q)},
		{K_TK, offsetof(struct fa_proto_req, u.fwd.k)},
		{K_TV, offsetof(struct fa_proto_req, u.fwd.v)},
		{K_TO, offsetof(struct fa_proto_req, u.fwd.o)},
		{K_LSE, offsetof(struct fa_proto_req, u.fwd.lse)},
	};
	uint64_t u;
	fa_status st;

	for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
		if (!val[tensors[i].k])
			continue; /* only lse is optional; check_keys made sure of the others */
		struct fa_proto_tensor *t = (struct fa_proto_tensor *)((char *)out + tensors[i].off);
		st = get_tensor(val[tensors[i].k], key_names[tensors[i].k], t, err, errlen);
		if (st != FA_OK)
			return st;
	}
	const msgpack_object *s = val[K_SCALE];
	if (s->type != MSGPACK_OBJECT_FLOAT64 && s->type != MSGPACK_OBJECT_FLOAT32)
		return fa_err(err, errlen, FA_EPROTO, "key 'scale': want a float");
	if (!isfinite(s->via.f64))
		return fa_err(err, errlen, FA_EPROTO, "key 'scale': not finite");
	out->u.fwd.scale = s->via.f64;
	if (!get_uint(val[K_MASK], FA_MASK_CAUSAL_TOP_LEFT, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'mask': must be a mask 0..2");
	out->u.fwd.mask = (uint8_t)u;
	if (!get_uint(val[K_PREC], FA_PREC_BF16, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'prec': must be a precision 0..4");
	out->u.fwd.precision = (uint8_t)u;
	/* Asynchronous mode: a slot, and optionally the client's event to wait on. */
	if (val[K_EV] && !val[K_SLOT])
		return fa_err(err, errlen, FA_EPROTO, "key 'ev' without 'slot' (events are async mode's)");
	if (val[K_SLOT]) {
		if (!get_uint(val[K_SLOT], FA_PROTO_MAX_SLOTS - 1, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'slot': must be 0..%d",
			              FA_PROTO_MAX_SLOTS - 1);
		out->u.fwd.async = true;
		out->u.fwd.slot = (uint32_t)u;
	}
	if (val[K_EV]) {
		if ((st = get_bin(val[K_EV], "ev", out->u.fwd.event, FA_PROTO_IPC_HANDLE_LEN, err,
		                  errlen)) != FA_OK)
			return st;
		out->u.fwd.has_event = true;
	}
	/* Completion words instead of events: both keys, a slot, no event. */
	if (val[K_WR] || val[K_WQ]) {
		if (!val[K_WR] || !val[K_WQ])
			return fa_err(err, errlen, FA_EPROTO, "key '%s' without '%s' (completion words "
			              "take both)", val[K_WR] ? "wr" : "wq", val[K_WR] ? "wq" : "wr");
		if (!val[K_SLOT])
			return fa_err(err, errlen, FA_EPROTO, "keys 'wr' and 'wq' without 'slot' "
			              "(completion words are async mode's)");
		if (val[K_EV])
			return fa_err(err, errlen, FA_EPROTO, "keys 'wr' and 'ev' together: a call "
			              "waits on completion words or on an event, not both");
		if (!get_uint(val[K_WR], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'wr': must be a region id > 0");
		out->u.fwd.words_region = u;
		if (!get_uint(val[K_WQ], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'wq': must be an unsigned integer > 0");
		out->u.fwd.words_seq = u;
	}
	return FA_OK;
}

/* Decode the request map into out (zeroed by the caller). */
static fa_status decode_req_map(const msgpack_object_map *m, struct fa_proto_req *out, char *err,
                                size_t errlen)
{
	const msgpack_object *val[K_COUNT] = {0};
	char bad[64];
	char what[32];
	uint64_t u;
	fa_status st;

	bool keys_ok = map_collect(m, key_names, K_COUNT, val, bad, sizeof bad);

	/* The version first: a peer of another version may use keys we do not know. */
	if (!val[K_V])
		return fa_err(err, errlen, FA_EPROTO, "missing key 'v'");
	if (!get_uint(val[K_V], UINT32_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'v': want an unsigned integer < 2^32");
	out->v = (uint32_t)u;
	/* Then what the daemon needs to address an error reply, whatever else is wrong. */
	if (val[K_OP] && get_uint(val[K_OP], UINT32_MAX, &u) && op_find(u))
		out->op = (uint32_t)u;
	if (val[K_SEQ] && get_uint(val[K_SEQ], UINT64_MAX, &u))
		out->seq = u;
	if (val[K_SID] && get_uint(val[K_SID], UINT64_MAX, &u))
		out->session = u;
	if (out->v != FA_PROTO_VERSION)
		return fa_err(err, errlen, FA_EVERSION, "protocol version %u, this side speaks %d",
		              out->v, FA_PROTO_VERSION);
	if (!keys_ok)
		return fa_err(err, errlen, FA_EPROTO, "%s", bad);

	if (!val[K_OP])
		return fa_err(err, errlen, FA_EPROTO, "missing key 'op'");
	if (!get_uint(val[K_OP], UINT32_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'op': want an unsigned integer < 2^32");
	const struct op_info *oi = op_find(u);
	if (!oi)
		return fa_err(err, errlen, FA_EPROTO, "unknown op %llu", (unsigned long long)u);
	snprintf(what, sizeof what, "a %s request", oi->name);
	if ((st = check_keys(val, REQ_COMMON | oi->req_need, oi->req_opt, what, err, errlen)) != FA_OK)
		return st;
	if (!get_uint(val[K_SEQ], UINT64_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'seq': want an unsigned integer");
	if (val[K_SID] && !get_uint(val[K_SID], UINT64_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'sid': want an unsigned integer");

	switch (oi->op) {
	case FA_OP_HELLO:
		if (!get_uint(val[K_PID], UINT32_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'pid': want an unsigned integer < 2^32");
		out->u.hello.pid = (uint32_t)u;
		return get_str(val[K_NAME], "name", out->u.hello.name, FA_PROTO_NAME_MAX, err, errlen);
	case FA_OP_REGISTER:
		return decode_register(val, out, err, errlen);
	case FA_OP_UNREGISTER:
		if (!get_uint(val[K_RID], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'rid': must be a region id > 0");
		out->u.unreg.region = u;
		return FA_OK;
	case FA_OP_ATTN_FWD:
		return decode_fwd(val, out, err, errlen);
	default:
		return FA_OK; /* BYE, PING, STATS: nothing more */
	}
}

/* Decode a request from untrusted bytes. */
fa_status fa_proto_decode_req(const void *buf, size_t len, struct fa_proto_req *out, char *err,
                              size_t errlen)
{
	msgpack_unpacked up;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!out)
		return fa_err(err, errlen, FA_EINVAL, "no output struct");
	memset(out, 0, sizeof *out);
	fa_status st = unpack_map(buf, len, &up, err, errlen);
	if (st != FA_OK)
		return st;
	st = decode_req_map(&up.data.via.map, out, err, errlen);
	msgpack_unpacked_destroy(&up);
	if (st != FA_OK) {
		struct fa_proto_req keep = {.v = out->v, .op = out->op, .seq = out->seq,
		                            .session = out->session};
		*out = keep; /* the rest zeroed, as promised */
	}
	return st;
}

/* ---- reply decoding -------------------------------------------------------------------------- */

/* Decode the reply map into out (zeroed by the caller). */
static fa_status decode_rep_map(const msgpack_object_map *m, struct fa_proto_rep *out, char *err,
                                size_t errlen)
{
	const msgpack_object *val[K_COUNT] = {0};
	char bad[64];
	char what[48];
	uint64_t u;
	fa_status st;

	bool keys_ok = map_collect(m, key_names, K_COUNT, val, bad, sizeof bad);

	if (!val[K_V])
		return fa_err(err, errlen, FA_EPROTO, "missing key 'v'");
	if (!get_uint(val[K_V], UINT32_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'v': want an unsigned integer < 2^32");
	out->v = (uint32_t)u;
	if (val[K_OP] && get_uint(val[K_OP], UINT32_MAX, &u) && (u == 0 || op_find(u)))
		out->op = (uint32_t)u;
	if (val[K_SEQ] && get_uint(val[K_SEQ], UINT64_MAX, &u))
		out->seq = u;
	if (out->v != FA_PROTO_VERSION)
		return fa_err(err, errlen, FA_EVERSION, "protocol version %u, this side speaks %d",
		              out->v, FA_PROTO_VERSION);
	if (!keys_ok)
		return fa_err(err, errlen, FA_EPROTO, "%s", bad);

	/* Status and op decide which keys the reply may carry. */
	if (!val[K_ST])
		return fa_err(err, errlen, FA_EPROTO, "missing key 'st'");
	if (!get_uint(val[K_ST], INT32_MAX, &u) || !fa_status_known((int64_t)u))
		return fa_err(err, errlen, FA_EPROTO, "key 'st': not a status of protocol %d",
		              FA_PROTO_VERSION);
	out->status = (int32_t)u;
	if (!val[K_OP])
		return fa_err(err, errlen, FA_EPROTO, "missing key 'op'");
	if (!get_uint(val[K_OP], UINT32_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'op': want an unsigned integer < 2^32");
	const struct op_info *oi = op_find(u);
	if (!oi && !(u == 0 && out->status != FA_OK))
		return fa_err(err, errlen, FA_EPROTO, "unknown op %llu in a %s reply",
		              (unsigned long long)u, out->status == FA_OK ? "FA_OK" : "failure");
	if (out->status == FA_OK)
		snprintf(what, sizeof what, "an FA_OK %s reply", oi->name);
	else
		snprintf(what, sizeof what, "a failure reply");
	uint64_t need = REP_COMMON | (out->status == FA_OK ? oi->rep_need : 0);
	uint64_t opt = KB(K_DET) | (out->status == FA_OK ? oi->rep_opt : 0);
	if ((st = check_keys(val, need, opt, what, err, errlen)) != FA_OK)
		return st;
	if (!get_uint(val[K_SEQ], UINT64_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'seq': want an unsigned integer");
	if (!get_uint(val[K_EP], UINT64_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'ep': want an unsigned integer");
	out->epoch = u;
	if (val[K_DET] &&
	    (st = get_str(val[K_DET], "det", out->detail, FA_PROTO_DETAIL_MAX, err, errlen)) != FA_OK)
		return st;
	if (out->status != FA_OK)
		return FA_OK;

	switch (oi->op) {
	case FA_OP_HELLO:
		if (!get_uint(val[K_SID], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'sid': must be a session id > 0");
		out->u.hello.session = u;
		if (!get_uint(val[K_MM], UINT32_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'mm': want an unsigned integer < 2^32");
		out->u.hello.max_msg = (uint32_t)u;
		if (!get_uint(val[K_MI], UINT32_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'mi': want an unsigned integer < 2^32");
		out->u.hello.max_inflight = (uint32_t)u;
		if (!get_uint(val[K_MR], UINT32_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'mr': want an unsigned integer < 2^32");
		out->u.hello.max_regions = (uint32_t)u;
		if (!get_uint(val[K_BE], FA_BACKEND_GPU, &u) || u < FA_BACKEND_CPU)
			return fa_err(err, errlen, FA_EPROTO, "key 'be': must be a backend 1..2");
		out->u.hello.backend = (uint8_t)u;
		return FA_OK;
	case FA_OP_REGISTER:
		if (!get_uint(val[K_RID], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'rid': must be a region id > 0");
		out->u.reg.region = u;
		return FA_OK;
	case FA_OP_ATTN_FWD:
		if (!get_uint(val[K_NS], UINT64_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'ns': want an unsigned integer");
		out->u.fwd.compute_ns = u;
		if (val[K_EV]) {
			out->u.fwd.async = true;
			return get_bin(val[K_EV], "ev", out->u.fwd.event, FA_PROTO_IPC_HANDLE_LEN,
			               err, errlen);
		}
		return FA_OK;
	case FA_OP_STATS:
		return get_str(val[K_TXT], "txt", out->u.stats.text, FA_PROTO_STATS_MAX, err, errlen);
	default:
		return FA_OK;
	}
}

/* Decode a reply from untrusted bytes. */
fa_status fa_proto_decode_rep(const void *buf, size_t len, struct fa_proto_rep *out, char *err,
                              size_t errlen)
{
	msgpack_unpacked up;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!out)
		return fa_err(err, errlen, FA_EINVAL, "no output struct");
	memset(out, 0, sizeof *out);
	fa_status st = unpack_map(buf, len, &up, err, errlen);
	if (st != FA_OK)
		return st;
	st = decode_rep_map(&up.data.via.map, out, err, errlen);
	msgpack_unpacked_destroy(&up);
	if (st != FA_OK) {
		uint32_t v = out->v, op = out->op;
		uint64_t seq = out->seq;
		memset(out, 0, sizeof *out); /* 16 KiB, only on failure */
		out->v = v;
		out->op = op;
		out->seq = seq;
	}
	return st;
}

/* ---- encoding -------------------------------------------------------------------------------- */

/* A fixed-capacity msgpack-c writer into the caller's buffer: no allocation; overflow fails. */
struct wbuf {
	unsigned char *p;
	size_t cap;
	size_t len;
};

/* msgpack-c's write callback: 0 on success, -1 when the bytes do not fit. */
static int wbuf_write(void *data, const char *b, size_t n)
{
	struct wbuf *w = data;
	if (n > w->cap - w->len)
		return -1;
	memcpy(w->p + w->len, b, n);
	w->len += n;
	return 0;
}

/* Packers return the callback's result; these OR results so one check at the end suffices. */
static int pk_key(msgpack_packer *pk, enum key k)
{
	return msgpack_pack_str_with_body(pk, key_names[k], strlen(key_names[k]));
}

static int pk_u64(msgpack_packer *pk, enum key k, uint64_t v)
{
	return pk_key(pk, k) | msgpack_pack_uint64(pk, v);
}

static int pk_str(msgpack_packer *pk, enum key k, const char *s)
{
	return pk_key(pk, k) | msgpack_pack_str_with_body(pk, s, strlen(s));
}

static int pk_bin(msgpack_packer *pk, enum key k, const uint8_t *b, size_t n)
{
	return pk_key(pk, k) | msgpack_pack_bin_with_body(pk, b, n);
}

static int pk_dims(msgpack_packer *pk, enum tkey k, const int64_t d[4])
{
	int rc = msgpack_pack_str_with_body(pk, tkey_names[k], strlen(tkey_names[k]));
	rc |= msgpack_pack_array(pk, 4);
	for (int i = 0; i < 4; i++)
		rc |= msgpack_pack_int64(pk, d[i]);
	return rc;
}

static int pk_tensor(msgpack_packer *pk, enum key k, const struct fa_proto_tensor *t)
{
	int rc = pk_key(pk, k) | msgpack_pack_map(pk, T_COUNT);
	rc |= msgpack_pack_str_with_body(pk, tkey_names[T_R], 1) | msgpack_pack_uint64(pk, t->region);
	rc |= msgpack_pack_str_with_body(pk, tkey_names[T_O], 1) | msgpack_pack_uint64(pk, t->offset);
	rc |= msgpack_pack_str_with_body(pk, tkey_names[T_T], 1) | msgpack_pack_uint64(pk, t->dtype);
	rc |= pk_dims(pk, T_SH, t->shape);
	rc |= pk_dims(pk, T_ST, t->stride);
	return rc;
}

/* Whether a tensor can be encoded (the decoder's rules: region > 0, dtype 1..3, dims >= 0). */
static bool tensor_ok(const struct fa_proto_tensor *t)
{
	if (t->region == 0 || t->dtype < FA_DTYPE_FP16 || t->dtype > FA_DTYPE_FP32)
		return false;
	for (int i = 0; i < 4; i++)
		if (t->shape[i] < 0 || t->stride[i] < 0)
			return false;
	return true;
}

/* Whether s is NUL-terminated within cap bytes. */
static bool str_fits(const char *s, size_t cap)
{
	return memchr(s, '\0', cap) != NULL;
}

/* Check a request against the decoder's rules; the number of map entries it will take. */
static fa_status req_check(const struct fa_proto_req *req, const struct op_info *oi, uint32_t *n)
{
	*n = 3 + (oi->op != FA_OP_HELLO); /* v, op, seq, sid */
	switch (oi->op) {
	case FA_OP_HELLO:
		if (req->session != 0 || !str_fits(req->u.hello.name, FA_PROTO_NAME_MAX))
			return FA_EINVAL;
		*n += 2;
		return FA_OK;
	case FA_OP_REGISTER:
		if (req->u.reg.kind == FA_REGION_HOST_SHM) {
			if (!str_fits(req->u.reg.shm_name, FA_PROTO_SHM_NAME_MAX))
				return FA_EINVAL;
			*n += 3;
		} else if (req->u.reg.kind == FA_REGION_CUDA_IPC) {
			*n += 4 + req->u.reg.words;
		} else {
			return FA_EINVAL;
		}
		return FA_OK;
	case FA_OP_UNREGISTER:
		*n += 1;
		return req->u.unreg.region != 0 ? FA_OK : FA_EINVAL;
	case FA_OP_ATTN_FWD:
		if (!tensor_ok(&req->u.fwd.q) || !tensor_ok(&req->u.fwd.k) ||
		    !tensor_ok(&req->u.fwd.v) || !tensor_ok(&req->u.fwd.o) ||
		    (req->u.fwd.lse.region != 0 && !tensor_ok(&req->u.fwd.lse)) ||
		    !isfinite(req->u.fwd.scale) || req->u.fwd.mask > FA_MASK_CAUSAL_TOP_LEFT ||
		    req->u.fwd.precision > FA_PREC_BF16 ||
		    (req->u.fwd.async && req->u.fwd.slot >= FA_PROTO_MAX_SLOTS) ||
		    (req->u.fwd.has_event && !req->u.fwd.async) ||
		    (req->u.fwd.words_region != 0 &&
		     (!req->u.fwd.async || req->u.fwd.has_event || req->u.fwd.words_seq == 0)))
			return FA_EINVAL;
		*n += 7 + (req->u.fwd.lse.region != 0) + req->u.fwd.async + req->u.fwd.has_event +
		      2 * (req->u.fwd.words_region != 0);
		return FA_OK;
	default:
		return FA_OK;
	}
}

/* Encode a request; req->v is ignored (this side's FA_PROTO_VERSION is written). */
fa_status fa_proto_encode_req(const struct fa_proto_req *req, void *buf, size_t cap, size_t *len)
{
	const struct op_info *oi;
	uint32_t n;

	if (len)
		*len = 0;
	if (!req || !buf || !len || !(oi = op_find(req->op)))
		return FA_EINVAL;
	fa_status st = req_check(req, oi, &n);
	if (st != FA_OK)
		return st;

	struct wbuf w = {buf, cap < FA_PROTO_MAX_MSG ? cap : FA_PROTO_MAX_MSG, 0};
	msgpack_packer pk;
	msgpack_packer_init(&pk, &w, wbuf_write);
	int rc = msgpack_pack_map(&pk, n);
	rc |= pk_u64(&pk, K_V, FA_PROTO_VERSION);
	rc |= pk_u64(&pk, K_OP, req->op);
	rc |= pk_u64(&pk, K_SEQ, req->seq);
	if (oi->op != FA_OP_HELLO)
		rc |= pk_u64(&pk, K_SID, req->session);
	switch (oi->op) {
	case FA_OP_HELLO:
		rc |= pk_u64(&pk, K_PID, req->u.hello.pid);
		rc |= pk_str(&pk, K_NAME, req->u.hello.name);
		break;
	case FA_OP_REGISTER:
		rc |= pk_u64(&pk, K_KIND, req->u.reg.kind);
		rc |= pk_u64(&pk, K_SIZE, req->u.reg.size);
		if (req->u.reg.kind == FA_REGION_HOST_SHM) {
			rc |= pk_str(&pk, K_SHM, req->u.reg.shm_name);
		} else {
			rc |= pk_bin(&pk, K_IPC, req->u.reg.ipc_handle, FA_PROTO_IPC_HANDLE_LEN);
			rc |= pk_bin(&pk, K_GPU, req->u.reg.gpu_uuid, FA_PROTO_UUID_LEN);
			if (req->u.reg.words)
				rc |= pk_u64(&pk, K_WDS, 1);
		}
		break;
	case FA_OP_UNREGISTER:
		rc |= pk_u64(&pk, K_RID, req->u.unreg.region);
		break;
	case FA_OP_ATTN_FWD:
		rc |= pk_tensor(&pk, K_TQ, &req->u.fwd.q);
		rc |= pk_tensor(&pk, K_TK, &req->u.fwd.k);
		rc |= pk_tensor(&pk, K_TV, &req->u.fwd.v);
		rc |= pk_tensor(&pk, K_TO, &req->u.fwd.o);
		if (req->u.fwd.lse.region != 0)
			rc |= pk_tensor(&pk, K_LSE, &req->u.fwd.lse);
		rc |= pk_key(&pk, K_SCALE) | msgpack_pack_double(&pk, req->u.fwd.scale);
		rc |= pk_u64(&pk, K_MASK, req->u.fwd.mask);
		rc |= pk_u64(&pk, K_PREC, req->u.fwd.precision);
		if (req->u.fwd.async)
			rc |= pk_u64(&pk, K_SLOT, req->u.fwd.slot);
		if (req->u.fwd.has_event)
			rc |= pk_bin(&pk, K_EV, req->u.fwd.event, FA_PROTO_IPC_HANDLE_LEN);
		if (req->u.fwd.words_region != 0) {
			rc |= pk_u64(&pk, K_WR, req->u.fwd.words_region);
			rc |= pk_u64(&pk, K_WQ, req->u.fwd.words_seq);
		}
		break;
	default:
		break;
	}
	if (rc != 0)
		return FA_ETOOBIG;
	*len = w.len;
	return FA_OK;
}

/* Encode a reply; rep->v is ignored (this side's FA_PROTO_VERSION is written). A failure reply
 * (status != FA_OK) carries the detail and no op-specific keys; op 0 is allowed there. */
fa_status fa_proto_encode_rep(const struct fa_proto_rep *rep, void *buf, size_t cap, size_t *len)
{
	const struct op_info *oi = NULL;

	if (len)
		*len = 0;
	if (!rep || !buf || !len || rep->status < 0 || !fa_status_known(rep->status) ||
	    !str_fits(rep->detail, FA_PROTO_DETAIL_MAX))
		return FA_EINVAL;
	oi = op_find(rep->op);
	if (!oi && !(rep->op == 0 && rep->status != FA_OK))
		return FA_EINVAL;
	bool ok = rep->status == FA_OK;
	uint32_t n = 5 + (rep->detail[0] != '\0');
	if (ok) {
		switch (oi->op) {
		case FA_OP_HELLO:
			if (rep->u.hello.session == 0 || rep->u.hello.backend < FA_BACKEND_CPU ||
			    rep->u.hello.backend > FA_BACKEND_GPU)
				return FA_EINVAL;
			n += 5;
			break;
		case FA_OP_REGISTER:
			if (rep->u.reg.region == 0)
				return FA_EINVAL;
			n += 1;
			break;
		case FA_OP_ATTN_FWD:
			n += 1 + rep->u.fwd.async;
			break;
		case FA_OP_STATS:
			if (!str_fits(rep->u.stats.text, FA_PROTO_STATS_MAX))
				return FA_EINVAL;
			n += 1;
			break;
		default:
			break;
		}
	}

	struct wbuf w = {buf, cap < FA_PROTO_MAX_MSG ? cap : FA_PROTO_MAX_MSG, 0};
	msgpack_packer pk;
	msgpack_packer_init(&pk, &w, wbuf_write);
	int rc = msgpack_pack_map(&pk, n);
	rc |= pk_u64(&pk, K_V, FA_PROTO_VERSION);
	rc |= pk_u64(&pk, K_OP, rep->op);
	rc |= pk_u64(&pk, K_SEQ, rep->seq);
	rc |= pk_u64(&pk, K_ST, (uint64_t)rep->status);
	rc |= pk_u64(&pk, K_EP, rep->epoch);
	if (rep->detail[0] != '\0')
		rc |= pk_str(&pk, K_DET, rep->detail);
	if (ok) {
		switch (oi->op) {
		case FA_OP_HELLO:
			rc |= pk_u64(&pk, K_SID, rep->u.hello.session);
			rc |= pk_u64(&pk, K_MM, rep->u.hello.max_msg);
			rc |= pk_u64(&pk, K_MI, rep->u.hello.max_inflight);
			rc |= pk_u64(&pk, K_MR, rep->u.hello.max_regions);
			rc |= pk_u64(&pk, K_BE, rep->u.hello.backend);
			break;
		case FA_OP_REGISTER:
			rc |= pk_u64(&pk, K_RID, rep->u.reg.region);
			break;
		case FA_OP_ATTN_FWD:
			rc |= pk_u64(&pk, K_NS, rep->u.fwd.compute_ns);
			if (rep->u.fwd.async)
				rc |= pk_bin(&pk, K_EV, rep->u.fwd.event, FA_PROTO_IPC_HANDLE_LEN);
			break;
		case FA_OP_STATS:
			rc |= pk_str(&pk, K_TXT, rep->u.stats.text);
			break;
		default:
			break;
		}
	}
	if (rc != 0)
		return FA_ETOOBIG;
	*len = w.len;
	return FA_OK;
}
