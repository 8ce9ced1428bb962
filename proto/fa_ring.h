/* fa_ring.h - the per-session submission ring: its shared-memory layout, the one contract between
 * libfaclient (client/fa_ring.c) and fa-daemon (daemon/ring.c). PROTOCOL.md section 11 says the
 * same in words.
 *
 * Why: a call through the socket costs a nanomsg round trip (44-95 us measured on the H200, most
 * of an asynchronous call's host time and of a tiny request's latency). A ring is a POSIX shm
 * object the client creates ("/faring.<uid>.<pid>.<16 hex>", mode 0660, the socket's group:
 * the rules of a host buffer, under a name of its own) and hands to the daemon once with RING_OPEN; after that a request is
 * the same msgpack bytes the socket carries, written into a submission entry, published by one
 * release store, and woken with FUTEX_WAKE only when the daemon's ring thread sleeps (io_uring's
 * need_wakeup). Replies come back as completion entries holding the encoded reply, and the
 * daemon wakes a client only when it says it sleeps.
 *
 * Layout (all integers little endian, the machine's own: one host): one page of header, then
 * FA_RING_ENTRIES submission entries, then FA_RING_ENTRIES completion entries, each
 * FA_RING_ENTRY_BYTES. Indices are free-running 32-bit counters (entry = index % entries).
 * Each word the two sides both touch sits on its own cache line.
 *
 * Trust: the ring is the client's memory. The daemon reads each word once, bounds it, copies an
 * entry's bytes before decoding them (the client may change them meanwhile), never reads what
 * the client wrote into a completion entry, and never lets a client's counter make it read or
 * write outside the mapping. A ring whose counters are impossible is closed (its `dead` word set)
 * and the session goes on over the socket.
 */
#ifndef FA_RING_H
#define FA_RING_H

#include <stddef.h>
#include <stdint.h>

#define FA_RING_NAME_PREFIX "/faring." /* then "<uid>.<pid>.<16 hex>", as a host buffer's */
#define FA_RING_MAGIC 0x474e4952u /* "RING" */
#define FA_RING_LAYOUT 1          /* this layout; a different one is refused at RING_OPEN */
#define FA_RING_ENTRIES 64        /* a power of two, <= FA_PROTO_MAX_SLOTS */
#define FA_RING_ENTRY_BYTES 2048  /* an entry: its 16-byte head, then the message */
#define FA_RING_MSG_MAX (FA_RING_ENTRY_BYTES - 16) /* a longer request goes by the socket */
#define FA_RING_HDR_BYTES 4096
#define FA_RING_SQ_OFF FA_RING_HDR_BYTES
#define FA_RING_CQ_OFF (FA_RING_SQ_OFF + FA_RING_ENTRIES * FA_RING_ENTRY_BYTES)
#define FA_RING_BYTES (FA_RING_CQ_OFF + FA_RING_ENTRIES * FA_RING_ENTRY_BYTES)

/* Why the daemon stopped serving a ring (the `dead` word; 0: serving). */
enum fa_ring_dead {
	FA_RING_LIVE = 0,
	FA_RING_DEAD_CLOSED = 1,   /* the session closed, or the daemon is stopping */
	FA_RING_DEAD_PROTOCOL = 2, /* the client's counters were impossible */
};

/* The header page. The client fills magic, layout, entries and entry_bytes before RING_OPEN;
 * the daemon checks them once, on its own copy, and never reads them again. */
struct fa_ring_hdr {
	uint32_t magic, layout, entries, entry_bytes;
	uint8_t pad0[48];
	/* client -> daemon: submissions published (the futex word the ring thread sleeps on) */
	uint32_t sq_tail;
	uint8_t pad1[60];
	/* daemon: submissions taken (copied); for the client's information only */
	uint32_t sq_head;
	uint8_t pad2[60];
	/* daemon: 1 while its ring thread sleeps (or is about to): the client must FUTEX_WAKE
	 * sq_tail after publishing; 0: it polls, no syscall needed */
	uint32_t daemon_sleeping;
	uint8_t pad3[60];
	/* daemon -> client: completions posted (the futex word client waiters sleep on) */
	uint32_t cq_tail;
	uint8_t pad4[60];
	/* client: 1 while one of its threads sleeps on cq_tail: the daemon wakes it after posting */
	uint32_t client_sleeping;
	uint8_t pad5[60];
	/* daemon: enum fa_ring_dead; nonzero for good (the client falls back to the socket) */
	uint32_t dead;
	uint8_t pad6[60];
	/* daemon: FA_RING_FEAT_* bits, written once before RING_OPEN's reply. Added inside layout
	 * 1's header page (bytes the client zeroes and an older daemon never writes), so a daemon
	 * that predates a feature reads as "without it" and nothing else changes. */
	uint32_t features;
	uint8_t pad7[60];
};

/* What the daemon serving a ring understands beyond layout 1's first release (the `features`
 * word). A client sends a request that needs a feature only to a daemon that sets its bit: an
 * older daemon would refuse the new keys (FA_EPROTO, "key 'wrg' not allowed in a ATTN_BWD
 * request"). */
#define FA_RING_FEAT_ASYNC_BWD 1u   /* ATTN_BWD with completion words ("wrg", "wq") */
#define FA_RING_FEAT_ASYNC_INFER 2u /* ATTN_VARLEN, ATTN_KVCACHE with "slot", "wrg", "wq" */
#define FA_RING_FEATURES (FA_RING_FEAT_ASYNC_BWD | FA_RING_FEAT_ASYNC_INFER) /* this side's */

/* A submission entry: `len` bytes of an encoded request (fa_proto_encode_req) at msg; `tag` is
 * the client's, echoed in the completion. */
struct fa_ring_sqe {
	uint32_t len;
	uint32_t tag;
	uint64_t reserved;
	uint8_t msg[FA_RING_MSG_MAX];
};

/* A completion entry: the encoded reply (fa_proto_encode_rep) of the submission with this tag;
 * len 0: a reply that did not fit (never for the ops the ring serves). */
struct fa_ring_cqe {
	uint32_t len;
	uint32_t tag;
	uint64_t reserved;
	uint8_t msg[FA_RING_MSG_MAX];
};

_Static_assert(sizeof(struct fa_ring_hdr) <= FA_RING_HDR_BYTES, "ring header fits its page");
_Static_assert(offsetof(struct fa_ring_hdr, features) == 448, "PROTOCOL.md 11 names its byte");
_Static_assert(sizeof(struct fa_ring_sqe) == FA_RING_ENTRY_BYTES, "submission entry size");
_Static_assert(sizeof(struct fa_ring_cqe) == FA_RING_ENTRY_BYTES, "completion entry size");
_Static_assert((FA_RING_ENTRIES & (FA_RING_ENTRIES - 1)) == 0, "entries: a power of two");

static inline struct fa_ring_sqe *fa_ring_sqe_at(void *base, uint32_t index)
{
	return (struct fa_ring_sqe *)((uint8_t *)base + FA_RING_SQ_OFF +
	                              (size_t)(index % FA_RING_ENTRIES) * FA_RING_ENTRY_BYTES);
}

static inline struct fa_ring_cqe *fa_ring_cqe_at(void *base, uint32_t index)
{
	return (struct fa_ring_cqe *)((uint8_t *)base + FA_RING_CQ_OFF +
	                              (size_t)(index % FA_RING_ENTRIES) * FA_RING_ENTRY_BYTES);
}

#endif /* FA_RING_H */
