/* runq.c - priority classes and round-robin across owners (runq.h). */
#include "runq.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

/* One owner's queued jobs in one class, and its place in the class' ring of turns. */
struct runq_owner {
	const void *owner;
	int cls;
	struct backend_job *head, *tail; /* linked through job->next */
	struct runq_owner *prev, *next; /* the ring: next is the owner after this one */
};

int runq_class(uint8_t priority)
{
	switch (priority) {
	case FA_PRIORITY_HIGH: return 0;
	case FA_PRIORITY_LOW: return 2;
	default: return 1;
	}
}

const char *runq_class_name(int cls)
{
	static const char *const names[RUNQ_NCLASSES] = {"high", "normal", "low"};
	return cls >= 0 && cls < RUNQ_NCLASSES ? names[cls] : "normal";
}

void runq_init(struct runq *s)
{
	memset(s, 0, sizeof(*s));
}

void runq_fini(struct runq *s)
{
	/* The backend handed every job back first; the nodes are freed without touching a job
	 * (one left queued may be gone by now). */
	for (int c = 0; c < RUNQ_NCLASSES; c++) {
		struct runq_owner *n = s->next[c];
		if (n == NULL)
			continue;
		n->prev->next = NULL;
		while (n != NULL) {
			struct runq_owner *next = n->next;
			free(n);
			n = next;
		}
		s->next[c] = s->last[c] = NULL;
		s->queued[c] = 0;
	}
}

/* Put node last in its class' turn order: after everyone already waiting, and before the next
 * turn of the owner served last when that owner still has jobs queued (it was just served; the
 * newcomer was not). */
static void runq_ring_insert(struct runq *s, struct runq_owner *n)
{
	struct runq_owner *next = s->last[n->cls] != NULL ? s->last[n->cls] : s->next[n->cls];

	if (next == NULL) {
		n->prev = n->next = n;
		s->next[n->cls] = n;
		return;
	}
	n->next = next;
	n->prev = next->prev;
	n->prev->next = n;
	next->prev = n;
}

/* Take node out of the ring and free it (its queue is empty). Were it the next to serve, the
 * owner after it is. */
static void runq_ring_drop(struct runq *s, struct runq_owner *n)
{
	struct runq_owner **next = &s->next[n->cls];

	if (s->last[n->cls] == n)
		s->last[n->cls] = NULL;
	if (n->next == n) {
		*next = NULL;
	} else {
		n->prev->next = n->next;
		n->next->prev = n->prev;
		if (*next == n)
			*next = n->next;
	}
	free(n);
}

fa_status runq_push(struct runq *s, struct backend_job *job)
{
	int cls = runq_class(job->priority);
	struct runq_owner *n = s->next[cls];

	if (n != NULL) {
		struct runq_owner *first = n;
		do {
			if (n->owner == job->owner)
				break;
			n = n->next;
		} while (n != first);
		if (n->owner != job->owner)
			n = NULL;
	}
	if (n == NULL) {
		if ((n = calloc(1, sizeof(*n))) == NULL)
			return FA_ENOMEM;
		n->owner = job->owner;
		n->cls = cls;
		runq_ring_insert(s, n);
	}
	job->runq_node = n;
	backend_job_append(&n->head, &n->tail, job);
	s->queued[cls]++;
	return FA_OK;
}

struct backend_job *runq_peek(struct runq *s, runq_ok_fn ok, void *arg)
{
	for (int c = 0; c < RUNQ_NCLASSES; c++) {
		if (s->next[c] == NULL)
			continue;
		struct runq_owner *first = s->next[c], *n = first;
		do {
			if (ok == NULL || ok(n->owner, arg))
				return n->head;
			n = n->next;
		} while (n != first);
	}
	return NULL;
}

/* Unlink job from its owner's queue (it is there). */
static void runq_unlink(struct runq_owner *n, struct backend_job *job)
{
	struct backend_job **pp = &n->head, *prev = NULL;

	while (*pp != job) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	*pp = job->next;
	if (n->tail == job)
		n->tail = prev;
	job->next = NULL;
}

void runq_take(struct runq *s, struct backend_job *job)
{
	struct runq_owner *n = job->runq_node;

	runq_unlink(n, job);
	job->runq_node = NULL;
	s->queued[n->cls]--;
	s->next[n->cls] = n->next; /* its turn is used: the owner after it is next */
	s->last[n->cls] = n;
	if (n->head == NULL)
		runq_ring_drop(s, n);
}

void runq_rotate(struct runq *s, struct backend_job *job)
{
	struct runq_owner *n = job->runq_node;

	if (n->head != n->tail) {
		runq_unlink(n, job);
		backend_job_append(&n->head, &n->tail, job);
	}
	s->next[n->cls] = n->next;
	s->last[n->cls] = n;
}

struct backend_job *runq_remove(struct runq *s, const void *owner, runq_match_fn match,
                                 void *arg)
{
	struct backend_job *out = NULL, *out_tail = NULL;

	for (int c = 0; c < RUNQ_NCLASSES; c++) {
		struct runq_owner *n = s->next[c];
		unsigned owners = 0;
		if (n == NULL)
			continue;
		for (struct runq_owner *m = n->next; m != n; m = m->next)
			owners++;
		owners++;
		/* Walk each node once; a node may be freed on the way. */
		struct runq_owner *cur = s->next[c];
		for (unsigned i = 0; i < owners; i++) {
			struct runq_owner *next = cur->next;
			if (owner == NULL || cur->owner == owner) {
				struct backend_job **pp = &cur->head, *prev = NULL;
				while (*pp != NULL) {
					struct backend_job *job = *pp;
					if (match != NULL && !match(job, arg)) {
						prev = job;
						pp = &job->next;
						continue;
					}
					*pp = job->next;
					if (cur->tail == job)
						cur->tail = prev;
					job->runq_node = NULL;
					s->queued[c]--;
					backend_job_append(&out, &out_tail, job);
				}
				if (cur->head == NULL)
					runq_ring_drop(s, cur);
			}
			cur = next;
		}
	}
	return out;
}

void runq_started(struct runq *s, const struct backend_job *job, uint64_t now)
{
	int c = runq_class(job->priority);
	uint64_t w = now > job->t_submit ? now - job->t_submit : 0;

	s->started[c]++;
	s->wait_ns[c] += w;
	if (w > s->wait_max_ns[c])
		s->wait_max_ns[c] = w;
}

unsigned runq_len(const struct runq *s)
{
	return s->queued[0] + s->queued[1] + s->queued[2];
}

void runq_stats(const struct runq *s, char *buf, size_t cap)
{
	size_t n = strlen(buf);

	for (int c = 0; c < RUNQ_NCLASSES && n < cap; c++) {
		const char *k = runq_class_name(c);
		int m = snprintf(buf + n, cap - n,
		                 "queue_%s_jobs:%u\nqueue_%s_started:%" PRIu64
		                 "\nqueue_%s_wait_us_total:%" PRIu64
		                 "\nqueue_%s_wait_us_max:%" PRIu64 "\n",
		                 k, s->queued[c], k, s->started[c], k, s->wait_ns[c] / 1000, k,
		                 s->wait_max_ns[c] / 1000);
		if (m < 0 || (size_t)m >= cap - n) {
			buf[n] = '\0';
			break;
		}
		n += (size_t)m;
	}
}
