/* runq.h - the run queue both backends share: priority classes, and round-robin across
 * sessions within a class.
 *
 * Jobs are queued per (owner, class): an owner is a session (struct backend_job.owner). A pick
 * looks at the highest class with queued work (high, then normal, then low: strict priority)
 * and in it at the owners in turn, starting after the owner served last, so an owner with 64
 * queued jobs gets one turn like an owner with one. Inside an owner's queue jobs are FIFO, but
 * a backend that runs a job in pieces (the CPU backend) rotates the job to the tail of its
 * owner's queue after each piece, so an owner's small request is not stuck behind its own big
 * one either.
 *
 * No lock of its own: the backend's mutex guards it (every function here is called with it
 * held). Allocates one small node per (owner, class) with queued jobs; nothing else.
 */
#ifndef FA_DAEMON_RUNQ_H
#define FA_DAEMON_RUNQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h"

struct backend_job;

#define RUNQ_NCLASSES 3 /* high, normal, low: the index order is the pick order */

struct runq_owner; /* runq.c's: one owner's queue in one class */

struct runq {
	/* Per class, the ring of owners with queued jobs, by the one whose turn is next. Only ever
	 * a real next turn: a marker such as "the owner served last" left on an owner still
	 * waiting, after the served one's node was dropped, put every newcomer ahead of that
	 * owner for as long as others kept arriving (8 synchronous clients on the H200: one
	 * served once in 2 s while the others were served 176 times). */
	struct runq_owner *next[RUNQ_NCLASSES];
	/* The owner served last, while it has jobs queued (NULL once its node is dropped): a
	 * newcomer is put before its next turn. */
	struct runq_owner *last[RUNQ_NCLASSES];
	unsigned queued[RUNQ_NCLASSES];           /* jobs queued per class */
	/* Queue time per class, submit to start (runq_started): for STATS. */
	uint64_t started[RUNQ_NCLASSES], wait_ns[RUNQ_NCLASSES], wait_max_ns[RUNQ_NCLASSES];
};

/* May a job of this owner start now? The CPU backend's per-session share of its workers. */
typedef bool (*runq_ok_fn)(const void *owner, void *arg);
/* Does this queued job match (cancel's filter)? */
typedef bool (*runq_match_fn)(const struct backend_job *job, void *arg);

/* The class index of a wire priority (an unknown value counts as normal). */
int runq_class(uint8_t priority);
/* "high", "normal", "low": the STATS names of the classes. */
const char *runq_class_name(int cls);

/* An empty queue. */
void runq_init(struct runq *s);
/* Free the queue's nodes (the backend handed every job back first; a job still queued is
 * forgotten, never touched). */
void runq_fini(struct runq *s);

/* Queue job (its priority and owner set; job->t_submit is its queue start) at the tail of its
 * owner's queue in its class. Returns FA_OK or FA_ENOMEM (job untouched). */
fa_status runq_push(struct runq *s, struct backend_job *job);

/* The job to serve next: the highest class with a queued job whose owner ok() allows (ok NULL:
 * any), owners in turn, the head of that owner's queue. NULL when none. The job stays queued:
 * the caller then calls runq_take or runq_rotate. */
struct backend_job *runq_peek(struct runq *s, runq_ok_fn ok, void *arg);

/* Take a queued job off the queue; its owner's turn is used (the next peek starts after it). */
void runq_take(struct runq *s, struct backend_job *job);

/* The job stays queued but goes to the tail of its owner's queue; its owner's turn is used. */
void runq_rotate(struct runq *s, struct backend_job *job);

/* Take every queued job of owner (all: NULL) that match() accepts (NULL: every one) off the
 * queue, linked through job->next in queue order (class by class). Turns are kept. */
struct backend_job *runq_remove(struct runq *s, const void *owner, runq_match_fn match,
                                 void *arg);

/* A job of class cls started (its first piece, or the launch) at now: count its queue time. */
void runq_started(struct runq *s, const struct backend_job *job, uint64_t now);

/* Jobs queued, all classes. */
unsigned runq_len(const struct runq *s);

/* The "# scheduler" STATS lines: per class queued, started, queue time total and max
 * (queue_<class>_jobs, queue_<class>_started, queue_<class>_wait_us_total,
 * queue_<class>_wait_us_max). Appends to buf (NUL-terminated, cap bytes in all). */
void runq_stats(const struct runq *s, char *buf, size_t cap);

#endif /* FA_DAEMON_RUNQ_H */
