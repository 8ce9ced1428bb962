/* fa_proto_rep_fast.c - the forward family's FA_OK reply without msgpack-c (fa_proto_rep_fast.h). */
#include "fa_proto_rep_fast.h"

#include <string.h>

#include "fa_mp.h"

#define REP_FAST_KEYS 6   /* v, op, seq, st, ep, ns: a fixmap's count */
#define REP_FAST_MAX 73   /* the map's byte, six keys (18 bytes), six values of at most 9 */

/* The keys in the encoder's order, each as msgpack writes it (a fixstr): fa_mp.h's three,
 * then the reply's own. */
#define KEY_ST "\xa2" "st"
#define KEY_EP "\xa2" "ep"
#define KEY_NS "\xa2" "ns"

static bool fwd_family(uint64_t op)
{
	return op == FA_OP_ATTN_FWD || op == FA_OP_ATTN_VARLEN || op == FA_OP_ATTN_KVCACHE ||
	       op == FA_OP_ATTN_BWD;
}

bool fa_proto_rep_fast_decode(const void *buf, size_t len, struct fa_proto_rep *out)
{
	const uint8_t *p = buf;
	uint64_t v, op, seq, st, ep, ns;
	size_t at = 1;

	if (len < 1 || p[0] != (0x80 | REP_FAST_KEYS) ||
	    !fa_mp_key_uint(p, len, &at, FA_MP_K(FA_MP_KEY_V), &v) || v != FA_PROTO_VERSION ||
	    !fa_mp_key_uint(p, len, &at, FA_MP_K(FA_MP_KEY_OP), &op) || !fwd_family(op) ||
	    !fa_mp_key_uint(p, len, &at, FA_MP_K(FA_MP_KEY_SEQ), &seq) ||
	    !fa_mp_key_uint(p, len, &at, FA_MP_K(KEY_ST), &st) || st != FA_OK ||
	    !fa_mp_key_uint(p, len, &at, FA_MP_K(KEY_EP), &ep) ||
	    !fa_mp_key_uint(p, len, &at, FA_MP_K(KEY_NS), &ns) || at != len)
		return false;
	memset(out, 0, offsetof(struct fa_proto_rep, u) + FA_PROTO_REP_SMALL_U);
	out->v = FA_PROTO_VERSION;
	out->op = (uint32_t)op;
	out->seq = seq;
	out->status = FA_OK;
	out->epoch = ep;
	out->u.fwd.compute_ns = ns;
	return true;
}

/* key, then v in its shortest form, at q; the bytes written. */
static size_t write_kv(uint8_t *q, const char *key, size_t klen, uint64_t v)
{
	memcpy(q, key, klen);
	return klen + fa_mp_write_uint(q + klen, v);
}

bool fa_proto_rep_fast_encode(const struct fa_proto_rep *rep, void *buf, size_t cap,
                              size_t *len)
{
	uint8_t *q = buf;

	if (rep->status != FA_OK || !fwd_family(rep->op) || rep->u.fwd.async ||
	    rep->detail[0] != '\0' || cap < REP_FAST_MAX)
		return false;
	size_t n = 0;
	q[n++] = 0x80 | REP_FAST_KEYS;
	n += write_kv(q + n, FA_MP_K(FA_MP_KEY_V), FA_PROTO_VERSION);
	n += write_kv(q + n, FA_MP_K(FA_MP_KEY_OP), rep->op);
	n += write_kv(q + n, FA_MP_K(FA_MP_KEY_SEQ), rep->seq);
	n += write_kv(q + n, FA_MP_K(KEY_ST), FA_OK);
	n += write_kv(q + n, FA_MP_K(KEY_EP), rep->epoch);
	n += write_kv(q + n, FA_MP_K(KEY_NS), rep->u.fwd.compute_ns);
	*len = n;
	return true;
}
