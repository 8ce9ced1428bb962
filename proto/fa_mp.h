/* fa_mp.h - msgpack's unsigned integers read and written by hand, for the shortcuts beside the
 * msgpack-c encoder and decoder (fa_proto_memo.c, fa_proto_rep_fast.c). Internal to proto/. */
#ifndef FA_PROTO_MP_H
#define FA_PROTO_MP_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* FA_PROTO_MP_H */
