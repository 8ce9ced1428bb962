/* dedupe.c - a per-session ring of recent (seq -> reply) entries (dedupe.h). A request's look-up
 * is a hash probe, a new request's slot a free one (a stack) or else the oldest answered one (a
 * min-heap on age), so a request costs the same whatever max-inflight is. */
#include "dedupe.h"

#include <stdlib.h>
#include <string.h>

#define DEDUPE_BUF_KEEP 128 /* a cleared entry keeps a reply buffer this small for its next */

static unsigned bucket_of(const struct dedupe *d, uint64_t seq)
{
	return (unsigned)((seq * 0x9e3779b97f4a7c15ull) >> 32) & d->mask;
}

/* ---- the age heap (DONE entries) ------------------------------------------------------------- */

static void heap_set(struct dedupe *d, unsigned at, uint32_t i)
{
	d->heap[at] = i;
	d->e[i].heap_at = at;
}

static void heap_up(struct dedupe *d, unsigned at)
{
	uint32_t i = d->heap[at];
	while (at > 0) {
		unsigned up = (at - 1) / 2;
		if (d->e[d->heap[up]].age <= d->e[i].age)
			break;
		heap_set(d, at, d->heap[up]);
		at = up;
	}
	heap_set(d, at, i);
}

static void heap_down(struct dedupe *d, unsigned at)
{
	uint32_t i = d->heap[at];
	for (;;) {
		unsigned c = 2 * at + 1;
		if (c >= d->nheap)
			break;
		if (c + 1 < d->nheap && d->e[d->heap[c + 1]].age < d->e[d->heap[c]].age)
			c++;
		if (d->e[i].age <= d->e[d->heap[c]].age)
			break;
		heap_set(d, at, d->heap[c]);
		at = c;
	}
	heap_set(d, at, i);
}

static void heap_remove(struct dedupe *d, unsigned at)
{
	uint32_t last = d->heap[--d->nheap];
	if (at == d->nheap)
		return;
	heap_set(d, at, last);
	heap_up(d, at);
	heap_down(d, d->e[last].heap_at);
}

/* ---- entries ---------------------------------------------------------------------------------- */

fa_status dedupe_init(struct dedupe *d, unsigned cap)
{
	unsigned nb = 2;
	memset(d, 0, sizeof *d);
	while (nb < 2 * cap)
		nb *= 2;
	d->e = calloc(cap ? cap : 1, sizeof *d->e);
	d->bucket = malloc(nb * sizeof *d->bucket);
	d->free_idx = malloc((cap ? cap : 1) * sizeof *d->free_idx);
	d->heap = malloc((cap ? cap : 1) * sizeof *d->heap);
	if (d->e == NULL || d->bucket == NULL || d->free_idx == NULL || d->heap == NULL) {
		dedupe_fini(d);
		return FA_ENOMEM;
	}
	d->cap = cap;
	d->mask = nb - 1;
	for (unsigned b = 0; b < nb; b++)
		d->bucket[b] = -1;
	for (unsigned i = 0; i < cap; i++) /* popped from the top: entry 0 first */
		d->free_idx[i] = cap - 1 - i;
	d->nfree = cap;
	return FA_OK;
}

void dedupe_fini(struct dedupe *d)
{
	for (unsigned i = 0; d->e != NULL && i < d->cap; i++)
		free(d->e[i].reply);
	free(d->e);
	free(d->bucket);
	free(d->free_idx);
	free(d->heap);
	memset(d, 0, sizeof *d);
}

static struct dedupe_entry *dedupe_find(const struct dedupe *d, uint64_t seq)
{
	for (int32_t i = d->bucket[bucket_of(d, seq)]; i >= 0; i = d->e[i].next)
		if (d->e[i].seq == seq)
			return &d->e[i];
	return NULL;
}

/* Forget an entry (out of its bucket and the heap, onto the free stack); a small reply buffer
 * stays for the entry's next use. */
static void dedupe_clear(struct dedupe *d, struct dedupe_entry *e)
{
	uint32_t i = (uint32_t)(e - d->e);
	if (e->state == DEDUPE_FREE)
		return;
	int32_t *link = &d->bucket[bucket_of(d, e->seq)];
	while (*link != (int32_t)i)
		link = &d->e[*link].next;
	*link = e->next;
	if (e->state == DEDUPE_DONE)
		heap_remove(d, e->heap_at);
	void *buf = e->reply;
	size_t bufcap = e->reply_cap;
	if (bufcap > DEDUPE_BUF_KEEP) {
		free(buf);
		buf = NULL;
		bufcap = 0;
	}
	memset(e, 0, sizeof *e);
	e->reply = buf;
	e->reply_cap = bufcap;
	d->free_idx[d->nfree++] = i;
}

/* Look seq up; claim a slot for a new one (a free one, else the oldest answered one). */
enum dedupe_result dedupe_check(struct dedupe *d, uint64_t seq, uint32_t op,
                                const struct ipc_hdr *hdr, struct dedupe_entry **entry)
{
	struct dedupe_entry *e = dedupe_find(d, seq);

	*entry = e;
	if (e != NULL) {
		if (e->op != op) {
			*entry = NULL;
			return DEDUPE_CONFLICT;
		}
		if (e->state == DEDUPE_RUNNING) {
			e->hdr = *hdr;
			return DEDUPE_IN_PROGRESS;
		}
		return DEDUPE_REPLAY;
	}
	if (d->nfree == 0 && d->nheap > 0)
		dedupe_clear(d, &d->e[d->heap[0]]);
	if (d->nfree == 0)
		return DEDUPE_NEW; /* every entry runs: this request is not protected */
	uint32_t i = d->free_idx[--d->nfree];
	unsigned b = bucket_of(d, seq);
	e = &d->e[i];
	e->seq = seq;
	e->op = op;
	e->state = DEDUPE_RUNNING;
	e->age = ++d->clock;
	e->hdr = *hdr;
	e->next = d->bucket[b];
	d->bucket[b] = (int32_t)i;
	*entry = e;
	return DEDUPE_NEW;
}

/* Keep the reply bytes of an answered request for its repeats. */
void dedupe_finish(struct dedupe *d, struct dedupe_entry *e, const void *reply, size_t len)
{
	if (len > DEDUPE_REPLY_MAX) {
		dedupe_clear(d, e);
		return;
	}
	if (len > e->reply_cap || e->reply == NULL) {
		size_t want = len > 64 ? len : 64;
		void *p = realloc(e->reply, want);
		if (p == NULL) {
			dedupe_clear(d, e);
			return;
		}
		e->reply = p;
		e->reply_cap = want;
	}
	memcpy(e->reply, reply, len);
	e->reply_len = len;
	e->state = DEDUPE_DONE;
	d->heap[d->nheap] = (uint32_t)(e - d->e);
	e->heap_at = d->nheap++;
	heap_up(d, e->heap_at);
}

/* Forget a running entry without keeping its reply. */
void dedupe_drop(struct dedupe *d, struct dedupe_entry *e)
{
	dedupe_clear(d, e);
}

/* How many entries are in a state. */
unsigned dedupe_count(const struct dedupe *d, enum dedupe_state state)
{
	unsigned n = 0;

	for (unsigned i = 0; i < d->cap; i++)
		n += d->e[i].state == state;
	return n;
}
