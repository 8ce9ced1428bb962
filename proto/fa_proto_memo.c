/* fa_proto_memo.c - the decode and encode memos (fa_proto_memo.h). */
#include "fa_proto_memo.h"

#include <string.h>

#include "fa_mp.h"

/* Where seq's value starts in a message that begins as fa_proto_encode_req writes it (a map,
 * then "v", "op", "seq"), or 0. */
static size_t seq_offset(const uint8_t *p, size_t n)
{
	uint64_t x;
	size_t at;

	if (n == 0)
		return 0;
	if ((p[0] & 0xf0) == 0x80)
		at = 1;
	else if (p[0] == 0xde)
		at = 3;
	else
		return 0;
	if (at > n || !fa_mp_key_uint(p, n, &at, FA_MP_K(FA_MP_KEY_V), &x) ||
	    !fa_mp_key_uint(p, n, &at, FA_MP_K(FA_MP_KEY_OP), &x) ||
	    !fa_mp_key_uint(p, n, &at, FA_MP_K(FA_MP_KEY_SEQ), NULL))
		return 0;
	return at;
}

/* Remember p's len bytes (a request beginning as fa_proto_encode_req writes it) and req, their
 * struct, when the memo can hold them (short enough, seq where seq_offset finds it, with req's
 * value); otherwise the memo keeps what it held. */
static void memo_keep(struct fa_proto_req_memo *m, const uint8_t *p, size_t len,
                      const struct fa_proto_req *req)
{
	size_t off = len <= FA_PROTO_MEMO_MAX ? seq_offset(p, len) : 0;
	uint64_t seq;
	size_t w = off != 0 ? fa_mp_read_uint(p + off, len - off, &seq) : 0;
	if (w == 0 || seq != req->seq)
		return;
	memcpy(m->bytes, p, len);
	m->len = len;
	m->seq_off = off;
	m->seq_len = w;
	memcpy(&m->req, req, sizeof m->req); /* padding too: the encoder's memo compares bytes */
	m->valid = true;
}

fa_status fa_proto_decode_req_memo(struct fa_proto_req_memo *m, const void *buf, size_t len,
                                   struct fa_proto_req *out, char *err, size_t errlen)
{
	const uint8_t *p = buf;

	if (m != NULL && out != NULL && buf != NULL && m->valid && len <= FA_PROTO_MEMO_MAX &&
	    len >= m->seq_off && memcmp(p, m->bytes, m->seq_off) == 0) {
		uint64_t seq;
		size_t w = fa_mp_read_uint(p + m->seq_off, len - m->seq_off, &seq);
		size_t tail = m->len - m->seq_off - m->seq_len;
		if (w != 0 && len - m->seq_off - w == tail &&
		    memcmp(p + m->seq_off + w, m->bytes + m->seq_off + m->seq_len, tail) == 0) {
			*out = m->req;
			out->seq = seq;
			if (err != NULL && errlen > 0)
				err[0] = '\0';
			m->hits++;
			return FA_OK;
		}
	}
	fa_status st = fa_proto_decode_req(buf, len, out, err, errlen);
	if (m == NULL || st != FA_OK)
		return st;
	m->misses++;
	memo_keep(m, p, len, out);
	return st;
}

bool fa_proto_req_same_but_seq(const struct fa_proto_req *a, const struct fa_proto_req *b)
{
	const size_t o = offsetof(struct fa_proto_req, seq), e = o + sizeof a->seq;
	return memcmp(a, b, o) == 0 &&
	       memcmp((const uint8_t *)a + e, (const uint8_t *)b + e, sizeof *a - e) == 0;
}

fa_status fa_proto_encode_req_memo(struct fa_proto_req_memo *m, const struct fa_proto_req *req,
                                   void *buf, size_t cap, size_t *len)
{
	if (m != NULL && req != NULL && buf != NULL && len != NULL && m->valid &&
	    m->len <= cap && fa_proto_req_same_but_seq(req, &m->req)) {
		uint8_t sq[9];
		if (fa_mp_write_uint(sq, req->seq) == m->seq_len) {
			memcpy(buf, m->bytes, m->len);
			memcpy((uint8_t *)buf + m->seq_off, sq, m->seq_len);
			*len = m->len;
			m->hits++;
			return FA_OK;
		}
	}
	fa_status st = fa_proto_encode_req(req, buf, cap, len);
	if (m == NULL || st != FA_OK)
		return st;
	m->misses++;
	/* (the encoder writes seq in its shortest form, as fa_mp_write_uint: a hit's patch of
	 * the same width is its bytes) */
	memo_keep(m, buf, *len, req);
	return st;
}
