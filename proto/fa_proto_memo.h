/* fa_proto_memo.h - a request decoded once and recognised again: the decode memo.
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

#endif /* FA_PROTO_MEMO_H */
