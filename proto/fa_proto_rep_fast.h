/* fa_proto_rep_fast.h - the forward family's FA_OK reply written and read without msgpack-c.
 * Internal to proto/ (and its tests).
 *
 * Why: every synchronous attention call ends with this six-key reply (v, op, seq, st, ep, ns),
 * and msgpack-c's general path (prescan, unpack into a zone, the key table, the checks) cost
 * the client ~4,000 instructions to read it and the daemon ~800 to write it: half of the
 * client's own work on a tiny call (daemon/RESULTS.md, 2026-12-03 evening).
 *
 * Safe by construction: the reader accepts exactly the bytes the encoder writes for such a
 * reply (any width of each unsigned integer) and nothing else; everything else, and every
 * failure, goes through the general decoder, so statuses and error texts are its own. The
 * writer writes the encoder's bytes (msgpack's shortest forms, the encoder's key order). The
 * unit tests and the fuzzer compare both with the general paths. */
#ifndef FA_PROTO_REP_FAST_H
#define FA_PROTO_REP_FAST_H

#include <stdbool.h>
#include <stddef.h>

#include "fa_proto.h"

/* The bytes of fa_proto_rep's union that its small members use (hello, reg, fwd; the text's
 * first byte and the table's count among them): what decoding a reply clears. */
#define FA_PROTO_REP_SMALL_U                                                                 \
	(sizeof(((struct fa_proto_rep *)0)->u.hello) > sizeof(((struct fa_proto_rep *)0)->u.fwd) \
	     ? sizeof(((struct fa_proto_rep *)0)->u.hello)                                       \
	     : sizeof(((struct fa_proto_rep *)0)->u.fwd))

/* Whether buf's len bytes are an FA_OK reply of the forward family without an event or a
 * detail, in the encoder's form; if so *out is what fa_proto_decode_rep_general gives. */
bool fa_proto_rep_fast_decode(const void *buf, size_t len, struct fa_proto_rep *out);

/* Whether rep is such a reply and fits cap; if so buf has the encoder's bytes, *len their
 * count. Such a reply is one the general encoder accepts. */
bool fa_proto_rep_fast_encode(const struct fa_proto_rep *rep, void *buf, size_t cap,
                              size_t *len);

/* fa_proto_decode_rep and _encode_rep without this shortcut: msgpack-c and the key table. */
fa_status fa_proto_decode_rep_general(const void *buf, size_t len, struct fa_proto_rep *out,
                                      char *err, size_t errlen);
fa_status fa_proto_encode_rep_general(const struct fa_proto_rep *rep, void *buf, size_t cap,
                                      size_t *len);

#endif /* FA_PROTO_REP_FAST_H */
