/* compile_pool.h - the GPU backend's "waiting for a compile" table: jobs whose kernel
 * specialisation is not loaded yet wait here, grouped by specialisation, while one compile per
 * specialisation runs on a compile thread (gpu/gpu_compile.c), so the GPU worker never compiles
 * while other clients' jobs wait behind it.
 *
 * Pure bookkeeping (no threads, no locks, no CUDA): the backend calls it under its mutex, and
 * tests/daemon/test_compile_table.c tests it without a GPU. Each job is in at most one place:
 * a waiting list here, or handed back to the caller by compile_table_finish/_cancel (which the
 * caller then queues on the worker or answers). Entries are few (distinct new specialisations
 * at one moment) so lists are scanned linearly.
 */
#ifndef FA_DAEMON_COMPILE_POOL_H
#define FA_DAEMON_COMPILE_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

#define COMPILE_KEY_MAX 104 /* a device prefix ("g15/") and fa_kernel_spec_name */

/* One specialisation being compiled, and the jobs waiting for it. */
struct compile_wait {
	char key[COMPILE_KEY_MAX];
	struct fa_attn_fwd_desc desc; /* the first job's: what the compile thread prepares */
	int dev;                      /* the first job's device (the key names it) */
	struct backend_job *head, *tail;
	unsigned njobs;
	bool started; /* a compile thread took it */
	struct compile_wait *next;
};

struct compile_table {
	struct compile_wait *head, *tail; /* in arrival order: compiles start oldest first */
	unsigned entries;                 /* specialisations waiting or compiling */
	unsigned jobs;                    /* jobs waiting */
};

void compile_table_init(struct compile_table *t);
/* Frees the entries; the table must hold no jobs (they would be lost: the caller cancels
 * first). */
void compile_table_fini(struct compile_table *t);

/* Put job behind the compile of `key`. *is_new is true when no compile of key was waiting or
 * running (the caller wakes a compile thread). FA_OK, or FA_ENOMEM with job untouched (the
 * caller queues it on the worker as before: it compiles there). */
fa_status compile_table_add(struct compile_table *t, const char *key, struct backend_job *job,
                            bool *is_new);

/* The oldest specialisation no compile thread took yet (marked started), or NULL. */
struct compile_wait *compile_table_take(struct compile_table *t);

/* The compile of w (taken) is over: remove and free w; return its jobs as a list (job->next,
 * in arrival order), possibly empty when they were all cancelled meanwhile. */
struct backend_job *compile_table_finish(struct compile_table *t, struct compile_wait *w);

/* Remove the waiting jobs of owner (all when NULL) and return them as a list (job->next) for
 * the caller to answer; *n gets their number. Entries left without jobs stay while a compile
 * thread has them (its finish frees them) and are dropped otherwise. */
struct backend_job *compile_table_cancel(struct compile_table *t, const void *owner,
                                         unsigned *n);

#endif /* FA_DAEMON_COMPILE_POOL_H */
