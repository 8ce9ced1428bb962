/* compile_pool.c - the "waiting for a compile" table of the GPU backend (compile_pool.h). */
#include "compile_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Unlink w from the table (prev: the entry before it, or NULL) and free it. */
static void compile_unlink(struct compile_table *t, struct compile_wait *prev,
                           struct compile_wait *w)
{
	if (prev != NULL)
		prev->next = w->next;
	else
		t->head = w->next;
	if (t->tail == w)
		t->tail = prev;
	t->entries--;
	free(w);
}

/* An empty table. */
void compile_table_init(struct compile_table *t)
{
	memset(t, 0, sizeof(*t));
}

/* Free every entry (no jobs may be left: see the header). */
void compile_table_fini(struct compile_table *t)
{
	struct compile_wait *w = t->head;

	while (w != NULL) {
		struct compile_wait *next = w->next;
		free(w);
		w = next;
	}
	compile_table_init(t);
}

/* Queue job behind key's compile, creating the entry when it is the first. */
fa_status compile_table_add(struct compile_table *t, const char *key, struct backend_job *job,
                            bool *is_new)
{
	struct compile_wait *w;

	*is_new = false;
	for (w = t->head; w != NULL; w = w->next)
		if (strcmp(w->key, key) == 0)
			break;
	if (w == NULL) {
		if ((w = calloc(1, sizeof(*w))) == NULL)
			return FA_ENOMEM;
		snprintf(w->key, sizeof w->key, "%s", key);
		w->desc = job->desc;
		w->dev = job->dev;
		if (t->tail != NULL)
			t->tail->next = w;
		else
			t->head = w;
		t->tail = w;
		t->entries++;
		*is_new = true;
	}
	backend_job_append(&w->head, &w->tail, job);
	w->njobs++;
	t->jobs++;
	return FA_OK;
}

/* The oldest entry not started, marked started. */
struct compile_wait *compile_table_take(struct compile_table *t)
{
	for (struct compile_wait *w = t->head; w != NULL; w = w->next)
		if (!w->started) {
			w->started = true;
			return w;
		}
	return NULL;
}

/* Remove w, hand its jobs back. */
struct backend_job *compile_table_finish(struct compile_table *t, struct compile_wait *w)
{
	struct compile_wait *prev = NULL, *p;
	struct backend_job *jobs = w->head;

	for (p = t->head; p != NULL && p != w; p = p->next)
		prev = p;
	if (p == NULL)
		return NULL; /* not ours: nothing to hand back (a caller bug; never frees twice) */
	t->jobs -= w->njobs;
	compile_unlink(t, prev, w);
	return jobs;
}

/* Take the owner's waiting jobs out of every entry. */
struct backend_job *compile_table_cancel(struct compile_table *t, const void *owner,
                                         unsigned *n)
{
	struct backend_job *out_head = NULL, *out_tail = NULL;
	struct compile_wait *w = t->head, *prev = NULL;

	*n = 0;
	while (w != NULL) {
		struct backend_job **pp = &w->head, *last = NULL;
		while (*pp != NULL) {
			struct backend_job *job = *pp;
			if (owner == NULL || job->owner == owner) {
				*pp = job->next;
				w->njobs--;
				t->jobs--;
				backend_job_append(&out_head, &out_tail, job);
				(*n)++;
				continue;
			}
			last = job;
			pp = &job->next;
		}
		w->tail = last;
		struct compile_wait *next = w->next;
		if (w->head == NULL && !w->started)
			compile_unlink(t, prev, w); /* nobody waits and no thread has it */
		else
			prev = w;
		w = next;
	}
	return out_head;
}
