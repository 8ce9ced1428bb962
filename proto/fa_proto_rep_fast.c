/* fa_proto_rep_fast.c - the forward family's FA_OK reply without msgpack-c (fa_proto_rep_fast.h). */
#include "fa_proto_rep_fast.h"

#include <string.h>

#include "fa_mp.h"

#define REP_FAST_KEYS 6   /* v, op, seq, st, ep, ns: a fixmap's count */
#define REP_FAST_MAX 73   /* the map's byte, six keys (18 bytes), six values of at most 9 */

/* The keys in the encoder's order, each as msgpack writes it (a fixstr). */
static const uint8_t k_v[] = {0xa1, 'v'}, k_op[] = {0xa2, 'o', 'p'},
                     k_seq[] = {0xa3, 's', 'e', 'q'}, k_st[] = {0xa2, 's', 't'},
                     k_ep[] = {0xa2, 'e', 'p'}, k_ns[] = {0xa2, 'n', 's'};

static bool fwd_family(uint64_t op)
{
	return op == FA_OP_ATTN_FWD || op == FA_OP_ATTN_VARLEN || op == FA_OP_ATTN_KVCACHE ||
	       op == FA_OP_ATTN_BWD;
}

/* The key at p + *at, then an unsigned integer: *v, and *at past both. */
static bool read_kv(const uint8_t *p, size_t n, size_t *at, const uint8_t *key, size_t klen,
                    uint64_t *v)
{
	if (n - *at < klen || memcmp(p + *at, key, klen) != 0)
		return false;
	size_t w = fa_mp_read_uint(p + *at + klen, n - *at - klen, v);
	*at += klen + w;
	return w != 0;
}

bool fa_proto_rep_fast_decode(const void *buf, size_t len, struct fa_proto_rep *out)
{
	const uint8_t *p = buf;
	uint64_t v, op, seq, st, ep, ns;
	size_t at = 1;

	if (len < 1 || p[0] != (0x80 | REP_FAST_KEYS) ||
	    !read_kv(p, len, &at, k_v, sizeof k_v, &v) || v != FA_PROTO_VERSION ||
	    !read_kv(p, len, &at, k_op, sizeof k_op, &op) || !fwd_family(op) ||
	    !read_kv(p, len, &at, k_seq, sizeof k_seq, &seq) ||
	    !read_kv(p, len, &at, k_st, sizeof k_st, &st) || st != FA_OK ||
	    !read_kv(p, len, &at, k_ep, sizeof k_ep, &ep) ||
	    !read_kv(p, len, &at, k_ns, sizeof k_ns, &ns) || at != len)
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
static size_t write_kv(uint8_t *q, const uint8_t *key, size_t klen, uint64_t v)
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
	n += write_kv(q + n, k_v, sizeof k_v, FA_PROTO_VERSION);
	n += write_kv(q + n, k_op, sizeof k_op, rep->op);
	n += write_kv(q + n, k_seq, sizeof k_seq, rep->seq);
	n += write_kv(q + n, k_st, sizeof k_st, FA_OK);
	n += write_kv(q + n, k_ep, sizeof k_ep, rep->epoch);
	n += write_kv(q + n, k_ns, sizeof k_ns, rep->u.fwd.compute_ns);
	*len = n;
	return true;
}
