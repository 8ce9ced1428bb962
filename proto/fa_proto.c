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
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <msgpack.h>

#include "fa_err.h"
#include "fa_proto.h"
#include "fa_proto_rep_fast.h"

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
	K_WL,    /* int64: sliding window, keys left of the diagonal, < 0 unbounded (optional; with
	          * K_WR: the window is on) */
	K_WR,    /* int64: sliding window, keys right of the diagonal, < 0 unbounded */
	K_CAP,   /* float >= 0: logit softcap, 0 off (optional) */
	K_CUQ,   /* index tensor: cu_seqlens_q (ATTN_VARLEN; ATTN_KVCACHE optional) */
	K_CUK,   /* index tensor: cu_seqlens_k (ATTN_VARLEN) */
	K_MQ,    /* uint: max_seqlen_q, 0 = the daemon finds it (ATTN_VARLEN, ATTN_KVCACHE) */
	K_MK,    /* uint: max_seqlen_k, 0 = the daemon finds it (ATTN_VARLEN) */
	K_CSL,   /* index tensor: cache_seqlens (ATTN_KVCACHE) */
	K_PT,    /* index tensor: page_table (ATTN_KVCACHE, optional: a paged cache) */
	K_ST,    /* uint: fa_status (every reply) */
	K_EP,    /* uint64: daemon epoch (every reply) */
	K_DET,   /* str < 256: detail text (any reply, optional) */
	K_MM,    /* uint32: max message bytes (HELLO reply) */
	K_MI,    /* uint32: max in-flight calls per session (HELLO reply) */
	K_MR,    /* uint32: max regions per session (HELLO reply) */
	K_BE,    /* uint: enum fa_backend_kind (HELLO reply) */
	K_NS,    /* uint64: backend time in ns (ATTN_FWD reply) */
	K_TXT,   /* str < 16384: statistics text (STATS reply) */
	K_SLOT,  /* uint < FA_PROTO_MAX_SLOTS: asynchronous mode's slot (attention ops, optional) */
	K_EV,    /* bin 64: CUDA IPC event handle (async ATTN_FWD/ATTN_BWD: the client's; its
	          * reply: the daemon's) */
	K_TDO,   /* tensor: dout, the upstream gradient (ATTN_BWD) */
	K_TDQ,   /* tensor: dq (ATTN_BWD) */
	K_TDK,   /* tensor: dk (ATTN_BWD) */
	K_TDV,   /* tensor: dv (ATTN_BWD) */
	K_FL,    /* uint: FA_PROTO_BWD_* flags (ATTN_BWD) */
	K_AFTER, /* uint64: list sessions with a larger id (CLIENTS, optional) */
	K_CL,    /* array <= FA_PROTO_CLIENTS_MAX of client maps (CLIENTS reply) */
	K_PRI,   /* uint: enum fa_priority (ATTN_FWD, ATTN_BWD, optional; absent: normal) */
	K_WDS,   /* uint 0..1: the region holds completion words (REGISTER, CUDA_IPC, optional) */
	K_WRG,   /* uint64 != 0: the completion words' region (async attention ops, optional) */
	K_WQ,    /* uint64 != 0: the call's completion-word value (async, with K_WRG) */
	K_COUNT
};

static const char *const key_names[K_COUNT] = {
	[K_V] = "v",       [K_OP] = "op",     [K_SEQ] = "seq",    [K_SID] = "sid",
	[K_PID] = "pid",   [K_NAME] = "name", [K_KIND] = "kind",  [K_SIZE] = "size",
	[K_SHM] = "shm",   [K_IPC] = "ipc",   [K_GPU] = "gpu",    [K_RID] = "rid",
	[K_TQ] = "tq",     [K_TK] = "tk",     [K_TV] = "tv",      [K_TO] = "to",
	[K_LSE] = "lse",   [K_SCALE] = "scale", [K_MASK] = "mask", [K_PREC] = "prec",
	[K_WL] = "wl",     [K_WR] = "wr",     [K_CAP] = "cap",    [K_CUQ] = "cuq",
	[K_CUK] = "cuk",   [K_MQ] = "mq",     [K_MK] = "mk",      [K_CSL] = "csl",
	[K_PT] = "pt",
	[K_ST] = "st",     [K_EP] = "ep",     [K_DET] = "det",    [K_MM] = "mm",
	[K_MI] = "mi",     [K_MR] = "mr",     [K_BE] = "be",      [K_NS] = "ns",
	[K_TXT] = "txt",   [K_SLOT] = "slot", [K_EV] = "ev",
	[K_TDO] = "tdo",   [K_TDQ] = "tdq",   [K_TDK] = "tdk",    [K_TDV] = "tdv",
	[K_FL] = "fl",
	[K_AFTER] = "after", [K_CL] = "cl",   [K_PRI] = "pri",
	[K_WDS] = "wds",   [K_WRG] = "wrg",   [K_WQ] = "wq",
};

/* Keys of a client map (CLIENTS reply), all required. */
enum ckey { C_ID, C_PID, C_CPID, C_UID, C_CMD, C_RG, C_BY, C_INF, C_DONE, C_SINCE, C_COUNT };
static const char *const ckey_names[C_COUNT] = {
	[C_ID] = "id",     /* uint64 != 0: session */
	[C_PID] = "pid",   /* uint32: pid from SO_PEERCRED */
	[C_CPID] = "cpid", /* uint32: pid as HELLO claimed */
	[C_UID] = "uid",   /* uint32 */
	[C_CMD] = "cmd",   /* str < 64 */
	[C_RG] = "rg",     /* uint32: regions */
	[C_BY] = "by",     /* uint64: bytes registered */
	[C_INF] = "inf",   /* uint32: requests in flight */
	[C_DONE] = "done", /* uint64: requests served */
	[C_SINCE] = "since", /* uint64: opened, Unix ms */
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

/* Key sets are bit masks over enum key (K_COUNT <= 64). */
#define KB(k) (UINT64_C(1) << (k))
_Static_assert(K_COUNT <= 64, "key sets are 64-bit masks");

/* Keys every request carries; every reply carries; and the optional reply detail. */
#define REQ_COMMON (KB(K_V) | KB(K_OP) | KB(K_SEQ))
#define REP_COMMON (KB(K_V) | KB(K_OP) | KB(K_SEQ) | KB(K_ST) | KB(K_EP))
/* The sliding window and softcap: optional in every forward-type request. */
#define INFER_OPT (KB(K_WL) | KB(K_WR) | KB(K_CAP))

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
	{FA_OP_ATTN_VARLEN, "ATTN_VARLEN",
	 KB(K_SID) | KB(K_TQ) | KB(K_TK) | KB(K_TV) | KB(K_TO) | KB(K_CUQ) | KB(K_CUK) | KB(K_MQ) |
		 KB(K_MK) | KB(K_SCALE) | KB(K_MASK) | KB(K_PREC),
	 KB(K_LSE) | INFER_OPT | KB(K_SLOT) | KB(K_WRG) | KB(K_WQ), KB(K_NS), 0},
	{FA_OP_ATTN_KVCACHE, "ATTN_KVCACHE",
	 KB(K_SID) | KB(K_TQ) | KB(K_TK) | KB(K_TV) | KB(K_TO) | KB(K_CSL) | KB(K_SCALE) |
		 KB(K_MASK) | KB(K_PREC),
	 KB(K_LSE) | KB(K_CUQ) | KB(K_MQ) | KB(K_PT) | INFER_OPT | KB(K_SLOT) | KB(K_WRG) |
		 KB(K_WQ), KB(K_NS), 0},
	{FA_OP_ATTN_FWD, "ATTN_FWD",
	 KB(K_SID) | KB(K_TQ) | KB(K_TK) | KB(K_TV) | KB(K_TO) | KB(K_SCALE) | KB(K_MASK) |
		 KB(K_PREC),
	 KB(K_LSE) | KB(K_SLOT) | KB(K_EV) | KB(K_PRI) | INFER_OPT |
		 KB(K_WRG) | KB(K_WQ), KB(K_NS), KB(K_EV)},
	{FA_OP_ATTN_BWD, "ATTN_BWD",
	 KB(K_SID) | KB(K_TQ) | KB(K_TK) | KB(K_TV) | KB(K_TO) | KB(K_LSE) | KB(K_TDO) |
		 KB(K_TDQ) | KB(K_TDK) | KB(K_TDV) | KB(K_SCALE) | KB(K_MASK) | KB(K_PREC) |
		 KB(K_FL),
	 KB(K_SLOT) | KB(K_EV) | KB(K_PRI) | INFER_OPT | KB(K_WRG) | KB(K_WQ), KB(K_NS),
	 KB(K_EV)},
	{FA_OP_CLIENTS, "CLIENTS", KB(K_SID), KB(K_AFTER), KB(K_CL), 0},
	{FA_OP_RING_OPEN, "RING_OPEN", KB(K_SID) | KB(K_SHM) | KB(K_SIZE), 0, KB(K_RID), 0},
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

/* Whether the NUL-terminated name is the n bytes (n > 0) at p. */
static inline bool key_is(const char *name, const char *p, uint32_t n)
{
	return name[0] == p[0] && strnlen(name, n + 1) == n && memcmp(name, p, n) == 0;
}

/* Sort a map's values by key through `names` (count <= 64): val[k] gets the value of key k.
 * Returns false with a reason in bad on a non-string key, an unknown key or a duplicate; the
 * known keys seen before the problem are still filled in (the version is read from them). */
static bool map_collect(const msgpack_object_map *m, const char *const *names, int count,
                        const msgpack_object **val, char *bad, size_t badlen)
{
	bool ok = true;
	int guess = 0;
	for (uint32_t i = 0; i < m->size; i++) {
		const msgpack_object *ko = &m->ptr[i].key;
		if (ko->type != MSGPACK_OBJECT_STR) {
			if (ok)
				snprintf(bad, badlen, "a map key is not a string");
			ok = false;
			continue;
		}
		/* The first byte first: a tiny request's ~30 keys against ~60 names each was most
		 * of its decoding time with a strlen per name (2026-12-03). An empty key matches
		 * nothing (no name is empty). */
		const char *kp = ko->via.str.ptr;
		const uint32_t ks = ko->via.str.size;
		int k = count;
		/* The name after the last one matched first: the encoder writes its keys in one
		 * order, so a message of ours matches there; anything else takes the scan. */
		if (ks > 0 && key_is(names[guess], kp, ks))
			k = guess;
		else if (ks > 0)
			for (k = 0; k < count; k++)
				if (key_is(names[k], kp, ks))
					break;
		guess = k + 1 < count ? k + 1 : 0;
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
		return fa_err(err, errlen, FA_EPROTO,
		              "key '%s': 't' must be a dtype: 1 (fp16), 2 (bf16) or 3 (fp32)", key);
	t->dtype = (uint8_t)u;
	if ((st = get_dims(val[T_SH], key, "sh", t->shape, err, errlen)) != FA_OK)
		return st;
	return get_dims(val[T_ST], key, "st", t->stride, err, errlen);
}

/* Check that exactly the keys in `need` and some of `opt` are present. The message names
 * the message as the format `what` (one %s, for `name`) says, formatted only on a failure. */
static fa_status check_keys(const msgpack_object *const *val, uint64_t need, uint64_t opt,
                            const char *what, const char *name, char *err, size_t errlen)
{
	for (int k = 0; k < K_COUNT; k++) {
		bool extra = val[k] && !((need | opt) & KB(k));
		if (!extra && (val[k] || !(need & KB(k))))
			continue;
		char msg[64];
		snprintf(msg, sizeof msg, what, name);
		return fa_err(err, errlen, FA_EPROTO, extra ? "key '%s' not allowed in %s"
		                                            : "missing key '%s' in %s",
		              key_names[k], msg);
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
	if ((st = check_keys(val, need, shm ? 0 : KB(K_WDS), "%s", what, err, errlen)) != FA_OK)
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

/* The settings every attention request carries: scale, mask, precision. */
static fa_status decode_settings(const msgpack_object *const *val, double *scale, uint8_t *mask,
                                 uint8_t *precision, char *err, size_t errlen)
{
	uint64_t u;

	const msgpack_object *s = val[K_SCALE];
	if (s->type != MSGPACK_OBJECT_FLOAT64 && s->type != MSGPACK_OBJECT_FLOAT32)
		return fa_err(err, errlen, FA_EPROTO, "key 'scale': want a float");
	if (!isfinite(s->via.f64))
		return fa_err(err, errlen, FA_EPROTO, "key 'scale': not finite");
	*scale = s->via.f64;
	if (!get_uint(val[K_MASK], FA_MASK_CAUSAL_TOP_LEFT, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'mask': must be a mask 0..2");
	*mask = (uint8_t)u;
	if (!get_uint(val[K_PREC], FA_PREC_BF16, &u))
		return fa_err(err, errlen, FA_EPROTO, "key 'prec': must be a precision 0..4");
	*precision = (uint8_t)u;
	return FA_OK;
}

/* The optional priority class ("pri", absent: normal) of ATTN_FWD and ATTN_BWD. */
static fa_status decode_priority(const msgpack_object *const *val, uint8_t *priority, char *err,
                                 size_t errlen)
{
	uint64_t u;

	if (val[K_PRI] == NULL)
		return FA_OK;
	if (!get_uint(val[K_PRI], FA_PRIORITY_LOW, &u))
		return fa_err(err, errlen, FA_EPROTO,
		              "key 'pri': must be a priority 0..2 (normal, high, low)");
	*priority = (uint8_t)u;
	return FA_OK;
}

/* Completion words instead of events (ATTN_FWD, ATTN_BWD, the inference ops): both keys, a
 * slot, no event. */
static fa_status decode_words(const msgpack_object *const *val, uint64_t *region, uint64_t *seq,
                              char *err, size_t errlen)
{
	uint64_t u;

	if (val[K_WRG] || val[K_WQ]) {
		if (!val[K_WRG] || !val[K_WQ])
			return fa_err(err, errlen, FA_EPROTO, "key '%s' without '%s' (completion words "
			              "take both)", val[K_WRG] ? "wrg" : "wq", val[K_WRG] ? "wq" : "wrg");
		if (!val[K_SLOT])
			return fa_err(err, errlen, FA_EPROTO, "keys 'wrg' and 'wq' without 'slot' "
			              "(completion words are async mode's)");
		if (val[K_EV])
			return fa_err(err, errlen, FA_EPROTO, "keys 'wrg' and 'ev' together: a call "
			              "waits on completion words or on an event, not both");
		if (!get_uint(val[K_WRG], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'wrg': must be a region id > 0");
		*region = u;
		if (!get_uint(val[K_WQ], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'wq': must be an unsigned integer > 0");
		*seq = u;
	}
	return FA_OK;
}

/* Asynchronous mode: a slot, and optionally the client's event to wait on. */
static fa_status decode_async(const msgpack_object *const *val, bool *async, uint32_t *slot,
                              bool *has_event, uint8_t *event, char *err, size_t errlen)
{
	uint64_t u;
	fa_status st;

	if (val[K_EV] && !val[K_SLOT])
		return fa_err(err, errlen, FA_EPROTO, "key 'ev' without 'slot' (events are async mode's)");
	if (val[K_SLOT]) {
		if (!get_uint(val[K_SLOT], FA_PROTO_MAX_SLOTS - 1, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'slot': must be 0..%d",
			              FA_PROTO_MAX_SLOTS - 1);
		*async = true;
		*slot = (uint32_t)u;
	}
	if (val[K_EV]) {
		if ((st = get_bin(val[K_EV], "ev", event, FA_PROTO_IPC_HANDLE_LEN, err, errlen)) !=
		    FA_OK)
			return st;
		*has_event = true;
	}
	return FA_OK;
}

/* The tensors of an attention request, by key, into the request struct at their offsets; an
 * absent key is skipped (check_keys decided which may be absent). */
struct tensor_key {
	enum key k;
	size_t off;
};

static fa_status decode_tensors(const msgpack_object *const *val, const struct tensor_key *tk,
                                size_t n, struct fa_proto_req *out, char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++) {
		if (!val[tk[i].k])
			continue;
		struct fa_proto_tensor *t = (struct fa_proto_tensor *)((char *)out + tk[i].off);
		fa_status st = get_tensor(val[tk[i].k], key_names[tk[i].k], t, err, errlen);
		if (st != FA_OK)
			return st;
	}
	return FA_OK;
}

/* ---- the inference keys: window, softcap, index tensors --------------------------------------- */

/* An integer in int64's range, either sign. */
static bool get_int(const msgpack_object *o, int64_t *out)
{
	if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		*out = o->via.i64;
		return true;
	}
	if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > INT64_MAX)
		return false;
	*out = (int64_t)o->via.u64;
	return true;
}

/* "wl" and "wr" (both or neither) and "cap", all optional. */
static fa_status decode_window(const msgpack_object *const *val, struct fa_proto_window *w,
                               char *err, size_t errlen)
{
	if ((val[K_WL] == NULL) != (val[K_WR] == NULL))
		return fa_err(err, errlen, FA_EPROTO,
		              "key '%s' without '%s' (a window has both sides; < 0 is unbounded)",
		              val[K_WL] ? "wl" : "wr", val[K_WL] ? "wr" : "wl");
	if (val[K_WL] != NULL) {
		if (!get_int(val[K_WL], &w->window_left))
			return fa_err(err, errlen, FA_EPROTO, "key 'wl': want an integer");
		if (!get_int(val[K_WR], &w->window_right))
			return fa_err(err, errlen, FA_EPROTO, "key 'wr': want an integer");
		w->window = true;
	}
	if (val[K_CAP] != NULL) {
		const msgpack_object *c = val[K_CAP];
		if (c->type != MSGPACK_OBJECT_FLOAT64 && c->type != MSGPACK_OBJECT_FLOAT32)
			return fa_err(err, errlen, FA_EPROTO, "key 'cap': want a float");
		if (!isfinite(c->via.f64) || c->via.f64 < 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'cap': must be finite and >= 0");
		/* -0.0 is off like 0 (the encoder writes no "cap" for either): stored as +0.0 so that a
		 * message reads the same after a re-encoding */
		w->softcap = c->via.f64 == 0 ? 0.0 : c->via.f64;
	}
	return FA_OK;
}

/* An array of exactly 2 integers in [0, INT64_MAX]. */
static fa_status get_dims2(const msgpack_object *o, const char *key, const char *what,
                           int64_t dst[2], char *err, size_t errlen)
{
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 2)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': '%s' must be an array of 2 integers",
		              key, what);
	for (int i = 0; i < 2; i++) {
		uint64_t u;
		if (!get_uint(&o->via.array.ptr[i], INT64_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO,
			              "key '%s': %s[%d] must be an integer in [0, 2^63)", key, what, i);
		dst[i] = (int64_t)u;
	}
	return FA_OK;
}

/* An index tensor map {r, o, sh, st}: a tensor map without 't' (the type is int32). */
static fa_status get_index(const msgpack_object *o, const char *key, struct fa_proto_index *t,
                           char *err, size_t errlen)
{
	const msgpack_object *val[T_COUNT] = {0};
	char bad[64];
	uint64_t u;
	fa_status st;

	if (o->type != MSGPACK_OBJECT_MAP)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': want an index tensor map", key);
	if (!map_collect(&o->via.map, tkey_names, T_COUNT, val, bad, sizeof bad))
		return fa_err(err, errlen, FA_EPROTO, "key '%s': %s", key, bad);
	if (val[T_T])
		return fa_err(err, errlen, FA_EPROTO, "key '%s': 't' not allowed (index tensors are int32)",
		              key);
	static const int need[] = {T_R, T_O, T_SH, T_ST};
	for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
		if (!val[need[k]])
			return fa_err(err, errlen, FA_EPROTO, "key '%s': missing '%s'", key,
			              tkey_names[need[k]]);
	if (!get_uint(val[T_R], UINT64_MAX, &u) || u == 0)
		return fa_err(err, errlen, FA_EPROTO, "key '%s': 'r' must be a region id > 0", key);
	t->region = u;
	if (!get_uint(val[T_O], UINT64_MAX, &u))
		return fa_err(err, errlen, FA_EPROTO, "key '%s': 'o' must be an unsigned integer", key);
	t->offset = u;
	if ((st = get_dims2(val[T_SH], key, "sh", t->shape, err, errlen)) != FA_OK)
		return st;
	return get_dims2(val[T_ST], key, "st", t->stride, err, errlen);
}

/* The ATTN_VARLEN and ATTN_KVCACHE part (check_keys decided which keys are there). */
static fa_status decode_infer(const msgpack_object *const *val, struct fa_proto_req *out,
                              char *err, size_t errlen)
{
	static const struct {
		enum key k;
		size_t off;
	} tensors[] = {
		{K_TQ, offsetof(struct fa_proto_req, u.infer.q)},
		{K_TK, offsetof(struct fa_proto_req, u.infer.k)},
		{K_TV, offsetof(struct fa_proto_req, u.infer.v)},
		{K_TO, offsetof(struct fa_proto_req, u.infer.o)},
		{K_LSE, offsetof(struct fa_proto_req, u.infer.lse)},
	}, indexes[] = {
		{K_CUQ, offsetof(struct fa_proto_req, u.infer.cu_q)},
		{K_CUK, offsetof(struct fa_proto_req, u.infer.cu_k)},
		{K_CSL, offsetof(struct fa_proto_req, u.infer.cache_len)},
		{K_PT, offsetof(struct fa_proto_req, u.infer.page_table)},
	};
	fa_status st;

	for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
		if (!val[tensors[i].k])
			continue;
		struct fa_proto_tensor *t = (struct fa_proto_tensor *)((char *)out + tensors[i].off);
		if ((st = get_tensor(val[tensors[i].k], key_names[tensors[i].k], t, err, errlen)) !=
		    FA_OK)
			return st;
	}
	for (size_t i = 0; i < sizeof indexes / sizeof indexes[0]; i++) {
		if (!val[indexes[i].k])
			continue;
		struct fa_proto_index *t = (struct fa_proto_index *)((char *)out + indexes[i].off);
		if ((st = get_index(val[indexes[i].k], key_names[indexes[i].k], t, err, errlen)) !=
		    FA_OK)
			return st;
	}
	if (val[K_MQ] && !val[K_CUQ])
		return fa_err(err, errlen, FA_EPROTO, "key 'mq' without 'cuq' (dense queries have one length)");
	if (val[K_MQ] && !get_uint(val[K_MQ], INT32_MAX, &out->u.infer.max_q))
		return fa_err(err, errlen, FA_EPROTO, "key 'mq': want an integer in [0, 2^31)");
	if (val[K_MK] && !get_uint(val[K_MK], INT32_MAX, &out->u.infer.max_k))
		return fa_err(err, errlen, FA_EPROTO, "key 'mk': want an integer in [0, 2^31)");
	if ((st = decode_settings(val, &out->u.infer.scale, &out->u.infer.mask,
	                          &out->u.infer.precision, err, errlen)) != FA_OK)
		return st;
	/* Asynchronous mode: completion words only ('ev' is not a key of these ops). */
	bool no_event = false;
	uint8_t no_handle[FA_PROTO_IPC_HANDLE_LEN];
	if ((st = decode_async(val, &out->u.infer.async, &out->u.infer.slot, &no_event, no_handle,
	                       err, errlen)) != FA_OK ||
	    (st = decode_words(val, &out->u.infer.words_region, &out->u.infer.words_seq, err,
	                       errlen)) != FA_OK)
		return st;
	if (out->u.infer.async && out->u.infer.words_region == 0)
		return fa_err(err, errlen, FA_EPROTO, "key 'slot' without 'wrg' and 'wq': the "
		              "inference ops' asynchronous mode takes completion words only");
	return decode_window(val, &out->u.infer.win, err, errlen);
}

/* The ATTN_FWD part. */
static fa_status decode_fwd(const msgpack_object *const *val, struct fa_proto_req *out, char *err,
                            size_t errlen)
{
	static const struct tensor_key tensors[] = {
		{K_TQ, offsetof(struct fa_proto_req, u.fwd.q)},
		{K_TK, offsetof(struct fa_proto_req, u.fwd.k)},
		{K_TV, offsetof(struct fa_proto_req, u.fwd.v)},
		{K_TO, offsetof(struct fa_proto_req, u.fwd.o)},
		{K_LSE, offsetof(struct fa_proto_req, u.fwd.lse)}, /* the optional one */
	};
	fa_status st;

	if ((st = decode_tensors(val, tensors, sizeof tensors / sizeof tensors[0], out, err,
	                         errlen)) != FA_OK ||
	    (st = decode_settings(val, &out->u.fwd.scale, &out->u.fwd.mask, &out->u.fwd.precision,
	                          err, errlen)) != FA_OK)
		return st;
	if ((st = decode_priority(val, &out->u.fwd.priority, err, errlen)) != FA_OK)
		return st;
	if ((st = decode_async(val, &out->u.fwd.async, &out->u.fwd.slot, &out->u.fwd.has_event,
	                       out->u.fwd.event, err, errlen)) != FA_OK)
		return st;
	if ((st = decode_words(val, &out->u.fwd.words_region, &out->u.fwd.words_seq, err,
	                       errlen)) != FA_OK)
		return st;
	return decode_window(val, &out->u.fwd.win, err, errlen);
}

/* The ATTN_BWD part: every tensor required (lse too: the backward needs the forward's). */
static fa_status decode_bwd(const msgpack_object *const *val, struct fa_proto_req *out, char *err,
                            size_t errlen)
{
	static const struct tensor_key tensors[] = {
		{K_TQ, offsetof(struct fa_proto_req, u.bwd.q)},
		{K_TK, offsetof(struct fa_proto_req, u.bwd.k)},
		{K_TV, offsetof(struct fa_proto_req, u.bwd.v)},
		{K_TO, offsetof(struct fa_proto_req, u.bwd.o)},
		{K_LSE, offsetof(struct fa_proto_req, u.bwd.lse)},
		{K_TDO, offsetof(struct fa_proto_req, u.bwd.dout)},
		{K_TDQ, offsetof(struct fa_proto_req, u.bwd.dq)},
		{K_TDK, offsetof(struct fa_proto_req, u.bwd.dk)},
		{K_TDV, offsetof(struct fa_proto_req, u.bwd.dv)},
	};
	uint64_t u;
	fa_status st;

	if ((st = decode_tensors(val, tensors, sizeof tensors / sizeof tensors[0], out, err,
	                         errlen)) != FA_OK ||
	    (st = decode_settings(val, &out->u.bwd.scale, &out->u.bwd.mask, &out->u.bwd.precision,
	                          err, errlen)) != FA_OK)
		return st;
	if (!get_uint(val[K_FL], UINT32_MAX, &u) || (u & ~(uint64_t)FA_PROTO_BWD_FLAGS) != 0)
		return fa_err(err, errlen, FA_EPROTO,
		              "key 'fl': must be flag bits of %u (1 = deterministic)",
		              FA_PROTO_BWD_FLAGS);
	out->u.bwd.flags = (uint32_t)u;
	if ((st = decode_priority(val, &out->u.bwd.priority, err, errlen)) != FA_OK)
		return st;
	if ((st = decode_async(val, &out->u.bwd.async, &out->u.bwd.slot, &out->u.bwd.has_event,
	                       out->u.bwd.event, err, errlen)) != FA_OK)
		return st;
	if ((st = decode_words(val, &out->u.bwd.words_region, &out->u.bwd.words_seq, err,
	                       errlen)) != FA_OK)
		return st;
	return decode_window(val, &out->u.bwd.win, err, errlen);
}

/* Decode the request map into out (zeroed by the caller). */
static fa_status decode_req_map(const msgpack_object_map *m, struct fa_proto_req *out, char *err,
                                size_t errlen)
{
	const msgpack_object *val[K_COUNT] = {0};
	char bad[64];
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
	if ((st = check_keys(val, REQ_COMMON | oi->req_need, oi->req_opt, "a %s request", oi->name,
	                     err, errlen)) != FA_OK)
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
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE:
		return decode_infer(val, out, err, errlen);
	case FA_OP_ATTN_BWD:
		return decode_bwd(val, out, err, errlen);
	case FA_OP_CLIENTS:
		if (val[K_AFTER] && !get_uint(val[K_AFTER], UINT64_MAX, &out->u.clients.after))
			return fa_err(err, errlen, FA_EPROTO, "key 'after': want an unsigned integer");
		return FA_OK;
	case FA_OP_RING_OPEN:
		if (!get_uint(val[K_SIZE], UINT64_MAX, &u))
			return fa_err(err, errlen, FA_EPROTO, "key 'size': want an unsigned integer");
		out->u.reg.kind = FA_REGION_HOST_SHM;
		out->u.reg.size = u;
		return get_str(val[K_SHM], "shm", out->u.reg.shm_name, FA_PROTO_SHM_NAME_MAX, err,
		               errlen);
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

/* The CLIENTS reply's array of client maps, each with every key of ckey_names. */
static fa_status decode_clients(const msgpack_object *o, struct fa_proto_rep *out, char *err,
                                size_t errlen)
{
	static const uint64_t max[C_COUNT] = {
		[C_ID] = UINT64_MAX,    [C_PID] = UINT32_MAX, [C_CPID] = UINT32_MAX,
		[C_UID] = UINT32_MAX,   [C_RG] = UINT32_MAX,  [C_BY] = UINT64_MAX,
		[C_INF] = UINT32_MAX,   [C_DONE] = UINT64_MAX, [C_SINCE] = UINT64_MAX,
	};
	if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > FA_PROTO_CLIENTS_MAX)
		return fa_err(err, errlen, FA_EPROTO, "key 'cl': want an array of at most %d clients",
		              FA_PROTO_CLIENTS_MAX);
	for (uint32_t i = 0; i < o->via.array.size; i++) {
		const msgpack_object *e = &o->via.array.ptr[i];
		const msgpack_object *val[C_COUNT] = {0};
		struct fa_proto_client *c = &out->u.clients.c[i];
		uint64_t u[C_COUNT] = {0};
		char bad[64];
		fa_status st;

		if (e->type != MSGPACK_OBJECT_MAP)
			return fa_err(err, errlen, FA_EPROTO, "key 'cl': client %u is not a map", i);
		if (!map_collect(&e->via.map, ckey_names, C_COUNT, val, bad, sizeof bad))
			return fa_err(err, errlen, FA_EPROTO, "key 'cl': client %u: %s", i, bad);
		for (int k = 0; k < C_COUNT; k++) {
			if (!val[k])
				return fa_err(err, errlen, FA_EPROTO, "key 'cl': client %u: missing '%s'",
				              i, ckey_names[k]);
			if (k != C_CMD && (!get_uint(val[k], max[k], &u[k]) || (k == C_ID && u[k] == 0)))
				return fa_err(err, errlen, FA_EPROTO,
				              "key 'cl': client %u: '%s' out of range", i, ckey_names[k]);
		}
		if ((st = get_str(val[C_CMD], "cmd", c->cmd, FA_PROTO_NAME_MAX, err, errlen)) != FA_OK)
			return st;
		c->session = u[C_ID];
		c->pid = (uint32_t)u[C_PID];
		c->pid_claimed = (uint32_t)u[C_CPID];
		c->uid = (uint32_t)u[C_UID];
		c->regions = (uint32_t)u[C_RG];
		c->bytes = u[C_BY];
		c->inflight = (uint32_t)u[C_INF];
		c->done = u[C_DONE];
		c->since_ms = u[C_SINCE];
	}
	out->u.clients.n = o->via.array.size;
	return FA_OK;
}

/* Decode the reply map into out (zeroed by the caller). */
static fa_status decode_rep_map(const msgpack_object_map *m, struct fa_proto_rep *out, char *err,
                                size_t errlen)
{
	const msgpack_object *val[K_COUNT] = {0};
	char bad[64];
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
	uint64_t need = REP_COMMON | (out->status == FA_OK ? oi->rep_need : 0);
	uint64_t opt = KB(K_DET) | (out->status == FA_OK ? oi->rep_opt : 0);
	if ((st = check_keys(val, need, opt, out->status == FA_OK ? "an FA_OK %s reply"
	                                                          : "a failure reply%s",
	                     out->status == FA_OK ? oi->name : "", err, errlen)) != FA_OK)
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
	case FA_OP_RING_OPEN:
		if (!get_uint(val[K_RID], UINT64_MAX, &u) || u == 0)
			return fa_err(err, errlen, FA_EPROTO, "key 'rid': must be a region id > 0");
		out->u.reg.region = u;
		return FA_OK;
	case FA_OP_ATTN_FWD:
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE:
	case FA_OP_ATTN_BWD:
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
	case FA_OP_CLIENTS:
		return decode_clients(val[K_CL], out, err, errlen);
	default:
		return FA_OK;
	}
}

_Static_assert(sizeof(((struct fa_proto_rep *)0)->u.reg) <= FA_PROTO_REP_SMALL_U &&
                   offsetof(struct fa_proto_rep, u.clients.n) + sizeof(uint32_t) <=
                       offsetof(struct fa_proto_rep, u) + FA_PROTO_REP_SMALL_U,
               "fa_proto_decode_rep clears the small members, the text's first byte and n");

/* Decode a reply from untrusted bytes: the forward family's plain FA_OK reply by its shortcut,
 * everything else by msgpack-c. */
fa_status fa_proto_decode_rep(const void *buf, size_t len, struct fa_proto_rep *out, char *err,
                              size_t errlen)
{
	if (buf != NULL && out != NULL && fa_proto_rep_fast_decode(buf, len, out)) {
		if (err && errlen > 0)
			err[0] = '\0';
		return FA_OK;
	}
	return fa_proto_decode_rep_general(buf, len, out, err, errlen);
}

fa_status fa_proto_decode_rep_general(const void *buf, size_t len, struct fa_proto_rep *out,
                                      char *err, size_t errlen)
{
	msgpack_unpacked up;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!out)
		return fa_err(err, errlen, FA_EINVAL, "no output struct");
	/* Everything but the STATS text and the CLIENTS table (16 KiB that every call would
	 * clear: a third of a tiny call's reply decoding, 2026-12-03): the small members of u
	 * are zero, the text an empty string and the table empty; decode_rep_map writes the
	 * text with its NUL and the table's entries up to n. The failure path clears it all. */
	memset(out, 0, offsetof(struct fa_proto_rep, u) + FA_PROTO_REP_SMALL_U);
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

/* A key of a client map, then its unsigned value. */
static int pk_cu64(msgpack_packer *pk, enum ckey k, uint64_t v)
{
	return msgpack_pack_str_with_body(pk, ckey_names[k], strlen(ckey_names[k])) |
	       msgpack_pack_uint64(pk, v);
}

/* The CLIENTS reply's array (checked by the caller: n and the strings). */
static int pk_clients(msgpack_packer *pk, const struct fa_proto_rep *rep)
{
	int rc = pk_key(pk, K_CL) | msgpack_pack_array(pk, rep->u.clients.n);
	for (uint32_t i = 0; i < rep->u.clients.n; i++) {
		const struct fa_proto_client *c = &rep->u.clients.c[i];
		rc |= msgpack_pack_map(pk, C_COUNT);
		rc |= pk_cu64(pk, C_ID, c->session) | pk_cu64(pk, C_PID, c->pid);
		rc |= pk_cu64(pk, C_CPID, c->pid_claimed) | pk_cu64(pk, C_UID, c->uid);
		rc |= msgpack_pack_str_with_body(pk, ckey_names[C_CMD], strlen(ckey_names[C_CMD]));
		rc |= msgpack_pack_str_with_body(pk, c->cmd, strlen(c->cmd));
		rc |= pk_cu64(pk, C_RG, c->regions) | pk_cu64(pk, C_BY, c->bytes);
		rc |= pk_cu64(pk, C_INF, c->inflight) | pk_cu64(pk, C_DONE, c->done);
		rc |= pk_cu64(pk, C_SINCE, c->since_ms);
	}
	return rc;
}

/* An index tensor map: a tensor map without 't'. */
static int pk_index(msgpack_packer *pk, enum key k, const struct fa_proto_index *t)
{
	int rc = pk_key(pk, k) | msgpack_pack_map(pk, 4);
	rc |= msgpack_pack_str_with_body(pk, tkey_names[T_R], 1) | msgpack_pack_uint64(pk, t->region);
	rc |= msgpack_pack_str_with_body(pk, tkey_names[T_O], 1) | msgpack_pack_uint64(pk, t->offset);
	for (int d = 0; d < 2; d++) {
		const int64_t *v = d == 0 ? t->shape : t->stride;
		enum tkey tk = d == 0 ? T_SH : T_ST;
		rc |= msgpack_pack_str_with_body(pk, tkey_names[tk], strlen(tkey_names[tk]));
		rc |= msgpack_pack_array(pk, 2) | msgpack_pack_int64(pk, v[0]) |
		      msgpack_pack_int64(pk, v[1]);
	}
	return rc;
}

/* The window and softcap keys, when on. */
static int pk_window(msgpack_packer *pk, const struct fa_proto_window *w)
{
	int rc = 0;
	if (w->window) {
		rc |= pk_key(pk, K_WL) | msgpack_pack_int64(pk, w->window_left);
		rc |= pk_key(pk, K_WR) | msgpack_pack_int64(pk, w->window_right);
	}
	if (w->softcap != 0)
		rc |= pk_key(pk, K_CAP) | msgpack_pack_double(pk, w->softcap);
	return rc;
}

/* Map entries the window keys take; false when the decoder would refuse them. */
static bool window_ok(const struct fa_proto_window *w, uint32_t *n)
{
	if (!isfinite(w->softcap) || w->softcap < 0)
		return false;
	*n += 2 * w->window + (w->softcap != 0);
	return true;
}

/* Whether an index tensor can be encoded (region > 0, dims >= 0). */
static bool index_ok(const struct fa_proto_index *t)
{
	return t->region != 0 && t->shape[0] >= 0 && t->shape[1] >= 0 && t->stride[0] >= 0 &&
	       t->stride[1] >= 0;
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
	case FA_OP_RING_OPEN:
		if (!str_fits(req->u.reg.shm_name, FA_PROTO_SHM_NAME_MAX))
			return FA_EINVAL;
		*n += 2;
		return FA_OK;
	case FA_OP_CLIENTS:
		*n += req->u.clients.after != 0; /* 0 is the default: not written */
		return FA_OK;
	case FA_OP_ATTN_FWD:
		if (!tensor_ok(&req->u.fwd.q) || !tensor_ok(&req->u.fwd.k) ||
		    !tensor_ok(&req->u.fwd.v) || !tensor_ok(&req->u.fwd.o) ||
		    (req->u.fwd.lse.region != 0 && !tensor_ok(&req->u.fwd.lse)) ||
		    !isfinite(req->u.fwd.scale) || req->u.fwd.mask > FA_MASK_CAUSAL_TOP_LEFT ||
		    req->u.fwd.precision > FA_PREC_BF16 ||
		    (req->u.fwd.async && req->u.fwd.slot >= FA_PROTO_MAX_SLOTS) ||
		    (req->u.fwd.has_event && !req->u.fwd.async) ||
		    req->u.fwd.priority > FA_PRIORITY_LOW ||
		    (req->u.fwd.words_region != 0 &&
		     (!req->u.fwd.async || req->u.fwd.has_event || req->u.fwd.words_seq == 0)))
			return FA_EINVAL;
		*n += 7 + (req->u.fwd.lse.region != 0) + req->u.fwd.async + req->u.fwd.has_event +
		      (req->u.fwd.priority != FA_PRIORITY_NORMAL) + 2 * (req->u.fwd.words_region != 0);
		return window_ok(&req->u.fwd.win, n) ? FA_OK : FA_EINVAL;
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE: {
		const __typeof__(req->u.infer) *r = &req->u.infer;
		bool varlen = oi->op == FA_OP_ATTN_VARLEN;
		if (!tensor_ok(&r->q) || !tensor_ok(&r->k) || !tensor_ok(&r->v) || !tensor_ok(&r->o) ||
		    (r->lse.region != 0 && !tensor_ok(&r->lse)) || !isfinite(r->scale) ||
		    r->mask > FA_MASK_CAUSAL_TOP_LEFT || r->precision > FA_PREC_BF16 ||
		    r->max_q > INT32_MAX || r->max_k > INT32_MAX ||
		    (r->async && (r->slot >= FA_PROTO_MAX_SLOTS || r->words_region == 0 ||
		                  r->words_seq == 0)) ||
		    (!r->async && r->words_region != 0))
			return FA_EINVAL;
		if (varlen ? !index_ok(&r->cu_q) || !index_ok(&r->cu_k) || r->cache_len.region ||
		                 r->page_table.region
		           : !index_ok(&r->cache_len) || r->cu_k.region || r->max_k ||
		                 (r->cu_q.region && !index_ok(&r->cu_q)) ||
		                 (r->page_table.region && !index_ok(&r->page_table)) ||
		                 (!r->cu_q.region && r->max_q))
			return FA_EINVAL;
		/* v op seq sid + q k v o scale mask prec + the op's own */
		*n += 7 + (r->lse.region != 0) +
		      (varlen ? 4 : 1 + 2 * (r->cu_q.region != 0) + (r->page_table.region != 0)) +
		      3 * r->async; /* slot wrg wq */
		return window_ok(&r->win, n) ? FA_OK : FA_EINVAL;
	}
	case FA_OP_ATTN_BWD: {
		const struct fa_proto_tensor *t[] = {&req->u.bwd.q,  &req->u.bwd.k,    &req->u.bwd.v,
		                                     &req->u.bwd.o,  &req->u.bwd.lse,  &req->u.bwd.dout,
		                                     &req->u.bwd.dq, &req->u.bwd.dk,   &req->u.bwd.dv};
		for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
			if (!tensor_ok(t[i]))
				return FA_EINVAL;
		if (!isfinite(req->u.bwd.scale) || req->u.bwd.mask > FA_MASK_CAUSAL_TOP_LEFT ||
		    req->u.bwd.precision > FA_PREC_BF16 || (req->u.bwd.flags & ~FA_PROTO_BWD_FLAGS) ||
		    (req->u.bwd.async && req->u.bwd.slot >= FA_PROTO_MAX_SLOTS) ||
		    (req->u.bwd.has_event && !req->u.bwd.async) ||
		    req->u.bwd.priority > FA_PRIORITY_LOW ||
		    (req->u.bwd.words_region != 0 &&
		     (!req->u.bwd.async || req->u.bwd.has_event || req->u.bwd.words_seq == 0)))
			return FA_EINVAL;
		*n += 13 + req->u.bwd.async + req->u.bwd.has_event +
		      (req->u.bwd.priority != FA_PRIORITY_NORMAL) + 2 * (req->u.bwd.words_region != 0);
		return window_ok(&req->u.bwd.win, n) ? FA_OK : FA_EINVAL;
	}
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
	case FA_OP_RING_OPEN:
		rc |= pk_u64(&pk, K_SIZE, req->u.reg.size);
		rc |= pk_str(&pk, K_SHM, req->u.reg.shm_name);
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
		if (req->u.fwd.priority != FA_PRIORITY_NORMAL)
			rc |= pk_u64(&pk, K_PRI, req->u.fwd.priority); /* absent: normal, as before */
		rc |= pk_window(&pk, &req->u.fwd.win);
		if (req->u.fwd.words_region != 0) {
			rc |= pk_u64(&pk, K_WRG, req->u.fwd.words_region);
			rc |= pk_u64(&pk, K_WQ, req->u.fwd.words_seq);
		}
		break;
	case FA_OP_ATTN_VARLEN:
	case FA_OP_ATTN_KVCACHE: {
		const __typeof__(req->u.infer) *r = &req->u.infer;
		rc |= pk_tensor(&pk, K_TQ, &r->q);
		rc |= pk_tensor(&pk, K_TK, &r->k);
		rc |= pk_tensor(&pk, K_TV, &r->v);
		rc |= pk_tensor(&pk, K_TO, &r->o);
		if (r->lse.region != 0)
			rc |= pk_tensor(&pk, K_LSE, &r->lse);
		if (r->cu_q.region != 0) {
			rc |= pk_index(&pk, K_CUQ, &r->cu_q);
			rc |= pk_u64(&pk, K_MQ, r->max_q);
		}
		if (oi->op == FA_OP_ATTN_VARLEN) {
			rc |= pk_index(&pk, K_CUK, &r->cu_k);
			rc |= pk_u64(&pk, K_MK, r->max_k);
		} else {
			rc |= pk_index(&pk, K_CSL, &r->cache_len);
			if (r->page_table.region != 0)
				rc |= pk_index(&pk, K_PT, &r->page_table);
		}
		rc |= pk_key(&pk, K_SCALE) | msgpack_pack_double(&pk, r->scale);
		rc |= pk_u64(&pk, K_MASK, r->mask);
		rc |= pk_u64(&pk, K_PREC, r->precision);
		rc |= pk_window(&pk, &r->win);
		if (r->async) {
			rc |= pk_u64(&pk, K_SLOT, r->slot);
			rc |= pk_u64(&pk, K_WRG, r->words_region);
			rc |= pk_u64(&pk, K_WQ, r->words_seq);
		}
		break;
	}
	case FA_OP_ATTN_BWD:
		rc |= pk_tensor(&pk, K_TQ, &req->u.bwd.q);
		rc |= pk_tensor(&pk, K_TK, &req->u.bwd.k);
		rc |= pk_tensor(&pk, K_TV, &req->u.bwd.v);
		rc |= pk_tensor(&pk, K_TO, &req->u.bwd.o);
		rc |= pk_tensor(&pk, K_LSE, &req->u.bwd.lse);
		rc |= pk_tensor(&pk, K_TDO, &req->u.bwd.dout);
		rc |= pk_tensor(&pk, K_TDQ, &req->u.bwd.dq);
		rc |= pk_tensor(&pk, K_TDK, &req->u.bwd.dk);
		rc |= pk_tensor(&pk, K_TDV, &req->u.bwd.dv);
		rc |= pk_key(&pk, K_SCALE) | msgpack_pack_double(&pk, req->u.bwd.scale);
		rc |= pk_u64(&pk, K_MASK, req->u.bwd.mask);
		rc |= pk_u64(&pk, K_PREC, req->u.bwd.precision);
		rc |= pk_u64(&pk, K_FL, req->u.bwd.flags);
		if (req->u.bwd.async)
			rc |= pk_u64(&pk, K_SLOT, req->u.bwd.slot);
		if (req->u.bwd.has_event)
			rc |= pk_bin(&pk, K_EV, req->u.bwd.event, FA_PROTO_IPC_HANDLE_LEN);
		if (req->u.bwd.priority != FA_PRIORITY_NORMAL)
			rc |= pk_u64(&pk, K_PRI, req->u.bwd.priority); /* absent: normal */
		rc |= pk_window(&pk, &req->u.bwd.win);
		if (req->u.bwd.words_region != 0) {
			rc |= pk_u64(&pk, K_WRG, req->u.bwd.words_region);
			rc |= pk_u64(&pk, K_WQ, req->u.bwd.words_seq);
		}
		break;
	case FA_OP_CLIENTS:
		if (req->u.clients.after != 0)
			rc |= pk_u64(&pk, K_AFTER, req->u.clients.after);
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
	/* (the shortcut takes only replies the general path accepts: FA_OK, no detail) */
	if (rep != NULL && buf != NULL && len != NULL && fa_proto_rep_fast_encode(rep, buf, cap, len))
		return FA_OK;
	return fa_proto_encode_rep_general(rep, buf, cap, len);
}

fa_status fa_proto_encode_rep_general(const struct fa_proto_rep *rep, void *buf, size_t cap,
                                      size_t *len)
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
		case FA_OP_RING_OPEN:
			if (rep->u.reg.region == 0)
				return FA_EINVAL;
			n += 1;
			break;
		case FA_OP_ATTN_FWD:
		case FA_OP_ATTN_VARLEN:
		case FA_OP_ATTN_KVCACHE:
		case FA_OP_ATTN_BWD:
			n += 1 + rep->u.fwd.async;
			break;
		case FA_OP_STATS:
			if (!str_fits(rep->u.stats.text, FA_PROTO_STATS_MAX))
				return FA_EINVAL;
			n += 1;
			break;
		case FA_OP_CLIENTS:
			if (rep->u.clients.n > FA_PROTO_CLIENTS_MAX)
				return FA_EINVAL;
			for (uint32_t i = 0; i < rep->u.clients.n; i++)
				if (rep->u.clients.c[i].session == 0 ||
				    !str_fits(rep->u.clients.c[i].cmd, FA_PROTO_NAME_MAX))
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
		case FA_OP_RING_OPEN:
			rc |= pk_u64(&pk, K_RID, rep->u.reg.region);
			break;
		case FA_OP_ATTN_FWD:
		case FA_OP_ATTN_VARLEN:
		case FA_OP_ATTN_KVCACHE:
		case FA_OP_ATTN_BWD:
			rc |= pk_u64(&pk, K_NS, rep->u.fwd.compute_ns);
			if (rep->u.fwd.async)
				rc |= pk_bin(&pk, K_EV, rep->u.fwd.event, FA_PROTO_IPC_HANDLE_LEN);
			break;
		case FA_OP_STATS:
			rc |= pk_str(&pk, K_TXT, rep->u.stats.text);
			break;
		case FA_OP_CLIENTS:
			rc |= pk_clients(&pk, rep);
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
