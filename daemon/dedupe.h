/* dedupe.h - at-most-once execution per (session, seq).
 *
 * nanomsg's REQ socket sends a request again after 60 s without a reply and after every
 * reconnect, so the daemon can see one request twice. Each session keeps a small ring of its
 * recent requests: a duplicate of one still running only updates where the reply goes (the newest
 * copy is the one the client waits on); a duplicate of a finished one is answered from the cached
 * reply bytes; the work is never done twice.
 *
 * The ring has room for more entries than a session may have in flight, so a running entry is
 * never evicted; a new request replaces the oldest finished one.
 */
#ifndef FA_DAEMON_DEDUPE_H
#define FA_DAEMON_DEDUPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h"
#include "ipc.h"

#define DEDUPE_REPLY_MAX 1024 /* larger replies (STATS text) are not kept: recomputing is safe */

enum dedupe_state {
	DEDUPE_FREE = 0,
	DEDUPE_RUNNING, /* accepted, reply not sent yet */
	DEDUPE_DONE,    /* reply sent and kept */
};

struct dedupe_entry {
	uint64_t seq;
	uint32_t op;
	uint8_t state;      /* enum dedupe_state */
	uint64_t age;       /* insertion stamp: the smallest DONE is evicted first */
	struct ipc_hdr hdr; /* RUNNING: where the reply goes (the latest copy's header) */
	void *reply;        /* DONE: the encoded reply (the buffer outlives it when small) */
	size_t reply_len, reply_cap;
	int32_t next;       /* the next entry of its hash bucket, -1: none (not FREE only) */
	uint32_t heap_at;   /* DONE: its place in the age heap */
};

/* The entries, found by seq through a chained hash, claimed from a stack of free ones, else
 * from a min-heap of the answered ones by age: O(1) per request (a scan of the ring cost more
 * than the rest of a tiny request's work once decoding was memoised, 2026-12-03). */
struct dedupe {
	struct dedupe_entry *e;
	unsigned cap;
	uint64_t clock;
	int32_t *bucket;    /* first entry of each bucket, -1: none */
	unsigned mask;      /* buckets - 1 (a power of two, at least 2 * cap) */
	uint32_t *free_idx; /* the FREE entries, a stack */
	unsigned nfree;
	uint32_t *heap;     /* the DONE entries, a min-heap on age */
	unsigned nheap;
};

/* What dedupe_check found. */
enum dedupe_result {
	DEDUPE_NEW, /* first time: *entry is RUNNING (or NULL if the ring is full of running ones)
	             */
	DEDUPE_IN_PROGRESS, /* already running: its reply header was updated to hdr; send nothing
	                       now */
	DEDUPE_REPLAY,      /* already answered: send (*entry)->reply again */
	DEDUPE_CONFLICT,    /* the seq was used by another op: a client bug (FA_EPROTO) */
};

/* A ring of `cap` entries. Returns FA_OK or FA_ENOMEM. */
fa_status dedupe_init(struct dedupe *d, unsigned cap);

/* Free the ring and every cached reply. */
void dedupe_fini(struct dedupe *d);

/* Look up seq; see enum dedupe_result. */
enum dedupe_result dedupe_check(struct dedupe *d, uint64_t seq, uint32_t op,
                                const struct ipc_hdr *hdr, struct dedupe_entry **entry);

/* The request of a RUNNING entry was answered with these bytes: keep them (when small enough and
 * memory allows) for replays, else forget the entry. */
void dedupe_finish(struct dedupe *d, struct dedupe_entry *e, const void *reply, size_t len);

/* Forget a RUNNING entry without keeping a reply (a reply that is not worth replaying). */
void dedupe_drop(struct dedupe *d, struct dedupe_entry *e);

/* Entries in each state (for tests and stats). */
unsigned dedupe_count(const struct dedupe *d, enum dedupe_state state);

#endif /* FA_DAEMON_DEDUPE_H */
