/* fa_mp.h - msgpack's unsigned integers read and written by hand, for the shortcuts beside the
 * msgpack-c encoder and decoder (fa_proto_memo.c, fa_proto_rep_fast.c). Internal to proto/. */
#ifndef FA_PROTO_MP_H
#define FA_PROTO_MP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* An unsigned integer in one of msgpack's unsigned forms at p (n bytes left): its encoded
 * length, 0 when it is not one. (msgpack-c also reads a signed form with a non-negative value
 * as unsigned; those are left to the full decoder.) */
static inline size_t fa_mp_read_uint(const uint8_t *p, size_t n, uint64_t *v)
{
	size_t w;
	if (n == 0)
		return 0;
	if (p[0] < 0x80) {
		*v = p[0];
		return 1;
	}
	switch (p[0]) {
	case 0xcc: w = 1; break;
	case 0xcd: w = 2; break;
	case 0xce: w = 4; break;
	case 0xcf: w = 8; break;
	default: return 0;
	}
	if (n < 1 + w)
		return 0;
	uint64_t x = 0;
	for (size_t i = 0; i < w; i++)
		x = x << 8 | p[1 + i];
	*v = x;
	return 1 + w;
}

/* msgpack's shortest form of an unsigned integer at p (9 bytes of room), which is what
 * msgpack_pack_uint64 writes and so fa_proto_encode_req's and _rep's: its length. */
static inline size_t fa_mp_write_uint(uint8_t *p, uint64_t v)
{
	size_t w;
	if (v < 0x80) {
		p[0] = (uint8_t)v;
		return 1;
	}
	if (v <= 0xff) {
		p[0] = 0xcc;
		w = 1;
	} else if (v <= 0xffff) {
		p[0] = 0xcd;
		w = 2;
	} else if (v <= 0xffffffffu) {
		p[0] = 0xce;
		w = 4;
	} else {
		p[0] = 0xcf;
		w = 8;
	}
	for (size_t i = 0; i < w; i++)
		p[1 + i] = (uint8_t)(v >> (8 * (w - 1 - i)));
	return 1 + w;
}

/* The keys every message begins with, as msgpack writes them (a fixstr): "v", "op", "seq";
 * FA_MP_K(key) is a key's bytes and length, fa_mp_key_uint's arguments. (The fixstr byte is its
 * own literal: "\xa2" "ep" is not "\xa2ep", a hex escape that swallows the e.) */
#define FA_MP_KEY_V "\xa1" "v"
#define FA_MP_KEY_OP "\xa2" "op"
#define FA_MP_KEY_SEQ "\xa3" "seq"
#define FA_MP_K(key) key, sizeof key - 1

/* At p + *at (n bytes in all): the key `key` (its klen encoded bytes), then, unless v is NULL,
 * an unsigned integer after it (into *v); *at moves past them. Whether they are there. */
static inline bool fa_mp_key_uint(const uint8_t *p, size_t n, size_t *at, const char *key,
                                  size_t klen, uint64_t *v)
{
	size_t w = 0;
	if (n - *at < klen || memcmp(p + *at, key, klen) != 0)
		return false;
	if (v != NULL && (w = fa_mp_read_uint(p + *at + klen, n - *at - klen, v)) == 0)
		return false;
	*at += klen + w;
	return true;
}

#endif /* FA_PROTO_MP_H */
