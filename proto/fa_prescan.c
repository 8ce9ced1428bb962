/* fa_prescan.c - structural check of untrusted msgpack bytes before msgpack-c sees them.
 *
 * msgpack-c 4's C unpacker trusts declared sizes: on an array or map header it allocates
 * n * sizeof(msgpack_object) before reading any element, so the 5 bytes `dd ff ff ff ff` ask for
 * ~96 GiB. This walker reads every format byte itself and proves, with no allocation and no
 * recursion, that the bytes are exactly one well-formed object no larger than FA_PROTO_MAX_MSG,
 * nested at most FA_PROTO_MAX_DEPTH containers deep, where every declared count and length fits in
 * the bytes that follow it. After that msgpack-c allocates at most ~48 bytes per input byte.
 */

#include "fa_err.h"
#include "fa_proto.h"

/* What one format byte introduces. */
enum item_kind {
	ITEM_SCALAR,    /* no payload beyond the fixed bytes */
	ITEM_BYTES,     /* str, bin or ext: `n` payload bytes follow the header */
	ITEM_ARRAY,     /* `n` objects follow */
	ITEM_MAP,       /* `n` key/value pairs follow */
	ITEM_INVALID,   /* 0xc1, never used by msgpack */
};

/* A parsed header: its kind, how many bytes the header itself takes, and n. */
struct item {
	enum item_kind kind;
	size_t hdr;   /* bytes of the format byte + its fixed fields (length, ext type, value) */
	size_t nlen;  /* bytes of the big-endian length/count field inside hdr (0: none) */
	uint64_t n;   /* payload length (ITEM_BYTES) or element/pair count (ITEM_ARRAY/ITEM_MAP) */
};

/* Classify format byte b: the fixed header size (format byte included) and where n comes from.
 * For fixext types the payload size is fixed and counted as ITEM_BYTES with n preset. */
static struct item classify(uint8_t b)
{
	struct item it = {ITEM_SCALAR, 1, 0, 0};
	if (b <= 0x7f || b >= 0xe0)               /* positive / negative fixint */
		return it;
	if (b <= 0x8f) {                          /* fixmap */
		it.kind = ITEM_MAP;
		it.n = b & 0x0f;
		return it;
	}
	if (b <= 0x9f) {                          /* fixarray */
		it.kind = ITEM_ARRAY;
		it.n = b & 0x0f;
		return it;
	}
	if (b <= 0xbf) {                          /* fixstr */
		it.kind = ITEM_BYTES;
		it.n = b & 0x1f;
		return it;
	}
	switch (b) {
	case 0xc0: case 0xc2: case 0xc3:          /* nil, false, true */
		return it;
	case 0xc1:
		it.kind = ITEM_INVALID;
		return it;
	case 0xc4: case 0xd9:                     /* bin8, str8 */
		it.kind = ITEM_BYTES; it.hdr = 2; it.nlen = 1;
		return it;
	case 0xc5: case 0xda:                     /* bin16, str16 */
		it.kind = ITEM_BYTES; it.hdr = 3; it.nlen = 2;
		return it;
	case 0xc6: case 0xdb:                     /* bin32, str32 */
		it.kind = ITEM_BYTES; it.hdr = 5; it.nlen = 4;
		return it;
	case 0xc7:                                /* ext8: len8, type8 */
		it.kind = ITEM_BYTES; it.hdr = 3; it.nlen = 1;
		return it;
	case 0xc8:                                /* ext16: len16, type8 */
		it.kind = ITEM_BYTES; it.hdr = 4; it.nlen = 2;
		return it;
	case 0xc9:                                /* ext32: len32, type8 */
		it.kind = ITEM_BYTES; it.hdr = 6; it.nlen = 4;
		return it;
	case 0xca: it.hdr = 5; return it;         /* float32 */
	case 0xcb: it.hdr = 9; return it;         /* float64 */
	case 0xcc: case 0xd0: it.hdr = 2; return it; /* uint8, int8 */
	case 0xcd: case 0xd1: it.hdr = 3; return it; /* uint16, int16 */
	case 0xce: case 0xd2: it.hdr = 5; return it; /* uint32, int32 */
	case 0xcf: case 0xd3: it.hdr = 9; return it; /* uint64, int64 */
	case 0xd4: it.kind = ITEM_BYTES; it.hdr = 2; it.n = 1; return it;  /* fixext1: type + 1 */
	case 0xd5: it.kind = ITEM_BYTES; it.hdr = 2; it.n = 2; return it;  /* fixext2 */
	case 0xd6: it.kind = ITEM_BYTES; it.hdr = 2; it.n = 4; return it;  /* fixext4 */
	case 0xd7: it.kind = ITEM_BYTES; it.hdr = 2; it.n = 8; return it;  /* fixext8 */
	case 0xd8: it.kind = ITEM_BYTES; it.hdr = 2; it.n = 16; return it; /* fixext16 */
	case 0xdc: it.kind = ITEM_ARRAY; it.hdr = 3; it.nlen = 2; return it; /* array16 */
	case 0xdd: it.kind = ITEM_ARRAY; it.hdr = 5; it.nlen = 4; return it; /* array32 */
	case 0xde: it.kind = ITEM_MAP; it.hdr = 3; it.nlen = 2; return it;   /* map16 */
	default:   it.kind = ITEM_MAP; it.hdr = 5; it.nlen = 4; return it;   /* 0xdf map32 */
	}
}

/* Walk the bytes once, keeping for each open container the number of objects it still needs.
 * Every object is at least one byte, so a count larger than the bytes left is a lie. */
fa_status fa_proto_prescan(const void *buf, size_t len, char *err, size_t errlen)
{
	const uint8_t *p = buf;
	uint64_t left[FA_PROTO_MAX_DEPTH]; /* objects still expected by each open container */
	int depth = 0;
	size_t pos = 0;

	if (err && errlen > 0)
		err[0] = '\0';
	if (len > FA_PROTO_MAX_MSG)
		return fa_err(err, errlen, FA_ETOOBIG, "message of %zu bytes, limit %d", len,
		              FA_PROTO_MAX_MSG);
	if (!p || len == 0)
		return fa_err(err, errlen, FA_EPROTO, "empty message");

	do {
		if (pos >= len)
			return fa_err(err, errlen, FA_EPROTO, "truncated: object expected at byte %zu",
			              pos);
		uint8_t b = p[pos];
		struct item it = classify(b);
		if (it.kind == ITEM_INVALID)
			return fa_err(err, errlen, FA_EPROTO, "invalid format byte 0x%02x at byte %zu", b,
			              pos);
		if (it.hdr > len - pos)
			return fa_err(err, errlen, FA_EPROTO, "truncated header 0x%02x at byte %zu", b,
			              pos);
		for (size_t i = 0; i < it.nlen; i++) /* big-endian length right after the format byte */
			it.n = (it.n << 8) | p[pos + 1 + i];
		size_t start = pos;
		pos += it.hdr;
		size_t rest = len - pos;

		if (depth > 0)
			left[depth - 1]--; /* this object is one of the enclosing container's */

		switch (it.kind) {
		case ITEM_BYTES:
			if (it.n > rest)
				return fa_err(err, errlen, FA_EPROTO,
				              "byte %zu declares %llu bytes, %zu left", start,
				              (unsigned long long)it.n, rest);
			pos += (size_t)it.n;
			break;
		case ITEM_ARRAY:
		case ITEM_MAP: {
			if (depth >= FA_PROTO_MAX_DEPTH)
				return fa_err(err, errlen, FA_EPROTO,
				              "nested deeper than %d at byte %zu", FA_PROTO_MAX_DEPTH,
				              start);
			uint64_t objs = it.kind == ITEM_MAP ? 2 * it.n : it.n; /* n <= 2^32-1: no overflow */
			if (objs > rest)
				return fa_err(err, errlen, FA_EPROTO,
				              "byte %zu declares %llu %s, %zu bytes left", start,
				              (unsigned long long)it.n,
				              it.kind == ITEM_MAP ? "pairs" : "elements", rest);
			if (objs > 0)
				left[depth++] = objs;
			break;
		}
		default:
			break;
		}
		while (depth > 0 && left[depth - 1] == 0)
			depth--; /* containers completed by this object */
	} while (depth > 0);

	if (pos != len)
		return fa_err(err, errlen, FA_EPROTO, "%zu bytes after the message", len - pos);
	return FA_OK;
}
