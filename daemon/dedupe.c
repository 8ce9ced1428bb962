/* dedupe.c - a per-session ring of recent (seq -> reply) entries. Linear scans: the ring holds
 * max-inflight + a few entries, and a scan over a contiguous array of that size costs less than
 * decoding the request. */
#include "dedupe.h"

#include <stdlib.h>
#include <string.h>

/* Allocate a ring of cap free entries. */
fa_status dedupe_init(struct dedupe *d, unsigned cap)
{
	d->clock = 0;
	d->e = calloc(cap ? cap : 1, sizeof(*d->e));
	d->cap = d->e != NULL ? cap : 0;
	return d->e != NULL ? FA_OK : FA_ENOMEM;
}

/* Free the ring and every kept reply. */
void dedupe_fini(struct dedupe *d)
{
	for (unsigned i = 0; i < d->cap; i++)
		free(d->e[i].reply);
	free(d->e);
	d->e = NULL;
	d->cap = 0;
}

/* Forget an entry and its kept reply. */
static void dedupe_clear(struct dedupe_entry *e)
{
	free(e->reply);
	memset(e, 0, sizeof(*e));
}

/* Look seq up; claim a slot for a new one (a free one, else the oldest answered one). */
enum dedupe_result dedupe_check(struct dedupe *d, uint64_t seq, uint32_t op,
                                const struct ipc_hdr *hdr, struct dedupe_entry **entry)
{
	struct dedupe_entry *victim = NULL;

	*entry = NULL;
	for (unsigned i = 0; i < d->cap; i++) {
		struct dedupe_entry *e = &d->e[i];
		if (e->state != DEDUPE_FREE && e->seq == seq) {
			if (e->op != op)
				return DEDUPE_CONFLICT;
			*entry = e;
			if (e->state == DEDUPE_RUNNING) {
				e->hdr = *hdr;
				return DEDUPE_IN_PROGRESS;
			}
			return DEDUPE_REPLAY;
		}
		/* Prefer a free slot, else the oldest finished one. */
		if (e->state == DEDUPE_FREE) {
			if (victim == NULL || victim->state != DEDUPE_FREE)
				victim = e;
		} else if (e->state == DEDUPE_DONE &&
		           (victim == NULL ||
		            (victim->state == DEDUPE_DONE && e->age < victim->age))) {
			victim = e;
		}
	}
	if (victim != NULL) {
		dedupe_clear(victim);
		victim->seq = seq;
		victim->op = op;
		victim->state = DEDUPE_RUNNING;
		victim->age = ++d->clock;
		victim->hdr = *hdr;
		*entry = victim;
	}
	return DEDUPE_NEW;
}

/* Keep the reply bytes of an answered request for its repeats. */
void dedupe_finish(struct dedupe *d, struct dedupe_entry *e, const void *reply, size_t len)
{
	(void)d;
	if (len > DEDUPE_REPLY_MAX || (e->reply = malloc(len ? len : 1)) == NULL) {
		dedupe_clear(e);
		return;
	}
	memcpy(e->reply, reply, len);
	e->reply_len = len;
	e->state = DEDUPE_DONE;
}

/* Forget a running entry without keeping its reply. */
void dedupe_drop(struct dedupe *d, struct dedupe_entry *e)
{
	(void)d;
	dedupe_clear(e);
}

/* How many entries are in a state. */
unsigned dedupe_count(const struct dedupe *d, enum dedupe_state state)
{
	unsigned n = 0;

	for (unsigned i = 0; i < d->cap; i++)
		n += d->e[i].state == state;
	return n;
}
