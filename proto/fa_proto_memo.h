/* fa_proto_memo.h - a request decoded (or encoded) once and recognised again: the memos.
 *
 * Why: a client repeats the same call (the same op, tensors, settings) with only its sequence
 * number changed, and decoding the ~240 bytes of a forward request through msgpack-c took
 * 3.5-7 us on this project's machines: most of the daemon's own work on a tiny request
 * (daemon/RESULTS.md, 2026-12-03). A memo remembers the last request's bytes and its decoded
 * struct; a request whose bytes are the same but for the value of "seq" is answered from it.
 *
 * Safe by construction: decoding is a function of the bytes alone, so equal bytes give the
 * equal struct, and the one value that differs is parsed here with the full decoder's rule
 * (an unsigned integer). Only messages that begin as fa_proto_encode_req writes them (the map,
 * then "v", "op" and "seq" with unsigned integers) are remembered; anything else, and every
 * failure, goes through fa_proto_decode_req each time. The caller owns the memo and the bytes
 * (the daemon: one per submission ring, its private copy of the entry). */
#ifndef FA_PROTO_MEMO_H
#define FA_PROTO_MEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_proto.h"

#define FA_PROTO_MEMO_MAX 2048 /* longer requests are decoded each time */

/* A request remembered as its bytes and its struct; one kind for both directions (each side
 * has its own: the daemon's decodes, the client's encodes). */
struct fa_proto_req_memo {
	bool valid;
	size_t len;     /* of bytes */
	size_t seq_off; /* where seq's value starts */
	size_t seq_len; /* its encoded bytes */
	uint8_t bytes[FA_PROTO_MEMO_MAX];
	struct fa_proto_req req;
	uint64_t hits, misses; /* for STATS */
};

/* fa_proto_decode_req through the memo m (zeroed before the first use): the same results,
 * statuses and error texts. A success of a request this memo can hold replaces what it held. */
fa_status fa_proto_decode_req_memo(struct fa_proto_req_memo *m, const void *buf, size_t len,
                                   struct fa_proto_req *out, char *err, size_t errlen);

/* The encoding side, the client's (one per submission ring): a request equal to the last one
 * encoded but for its seq is written as the remembered bytes with the new seq's, when its
 * encoding is as long as the old one's (else, and for anything else, fa_proto_encode_req).
 * The bytes are exactly fa_proto_encode_req's (its encoding is canonical); requests are
 * compared as structs, so they must be built from zeroed memory (fa__req_init does). m:
 * zeroed before the first use, never also used for decoding. */
fa_status fa_proto_encode_req_memo(struct fa_proto_req_memo *m, const struct fa_proto_req *req,
                                   void *buf, size_t cap, size_t *len);

/* Whether a and b are the same request but (perhaps) for seq: their bytes around it, padding
 * too (structs built from zeroed memory, as the decoder's and fa__req_init's are; anything else
 * only compares unequal). */
bool fa_proto_req_same_but_seq(const struct fa_proto_req *a, const struct fa_proto_req *b);

#endif /* FA_PROTO_MEMO_H */
