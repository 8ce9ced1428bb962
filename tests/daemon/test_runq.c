/* test_runq.c - the run queue's turn rule (runq.h): strict priority between classes, and inside
 * a class no owner is served twice while another owner's job waits. Checked on the pattern that
 * broke it on the H200 (8 synchronous clients, each one job queued at a time, a few in flight:
 * one client was served once in 2 s while the others were served 176 times) and on random
 * arrivals, rotations and filtered picks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "runq.h"

#define OWNERS 8
#define JOBS_PER_OWNER 8

/* The owners are the addresses of owner_tag[i]. */
static const char owner_tag[OWNERS];

static int owner_index(const void *owner)
{
	return (int)((const char *)owner - owner_tag);
}

static void job_init(struct backend_job *j, int owner, uint8_t priority)
{
	memset(j, 0, sizeof(*j));
	j->owner = &owner_tag[owner];
	j->priority = priority;
}

/* The bookkeeping the rule is checked against: per owner, how many turns every other owner got
 * since this owner's head job began to wait. */
struct model {
	struct runq q;
	struct backend_job jobs[OWNERS][JOBS_PER_OWNER];
	bool used[OWNERS][JOBS_PER_OWNER];
	int queued[OWNERS];
	unsigned since[OWNERS][OWNERS]; /* since[a][b]: turns of b while a's head job waited */
};

static struct backend_job *model_push(struct model *m, int owner)
{
	for (int k = 0; k < JOBS_PER_OWNER; k++) {
		if (m->used[owner][k])
			continue;
		struct backend_job *j = &m->jobs[owner][k];
		job_init(j, owner, FA_PRIORITY_NORMAL);
		assert_int_equal(runq_push(&m->q, j), FA_OK);
		m->used[owner][k] = true;
		if (m->queued[owner]++ == 0)
			memset(m->since[owner], 0, sizeof m->since[owner]);
		return j;
	}
	return NULL;
}

/* Owner o had a turn (its job taken, or rotated): nobody waiting saw o served twice. */
static void model_turn(struct model *m, int o)
{
	for (int a = 0; a < OWNERS; a++) {
		if (a == o || m->queued[a] == 0)
			continue;
		if (++m->since[a][o] > 1)
			fail_msg("owner %d served twice while owner %d waited", o, a);
	}
	memset(m->since[o], 0, sizeof m->since[o]); /* its next job waits from now */
}

static void model_take(struct model *m, struct backend_job *j)
{
	int o = owner_index(j->owner);
	runq_take(&m->q, j);
	m->queued[o]--;
	m->used[o][j - m->jobs[o]] = false;
	model_turn(m, o);
}

static void test_runq_synchronous_clients_take_turns(void **state)
{
	/* Each owner has one job queued at a time and sends the next one DEPTH picks after its
	 * last was taken (the GPU still runs it then): every owner is served once in every
	 * OWNERS picks, for each depth. */
	(void)state;
	for (int depth = 0; depth < OWNERS; depth++) {
		struct model m = {0};
		int pending[OWNERS]; /* owner taken at pick i resubmits at pick i + depth */
		int npending = 0;
		unsigned served[OWNERS] = {0};

		runq_init(&m.q);
		for (int o = 0; o < OWNERS; o++)
			model_push(&m, o);
		for (int pick = 0; pick < 4000; pick++) {
			if (npending > depth || (npending > 0 && runq_len(&m.q) == 0)) {
				model_push(&m, pending[0]);
				memmove(pending, pending + 1, (size_t)--npending * sizeof pending[0]);
			}
			struct backend_job *j = runq_peek(&m.q, NULL, NULL);
			assert_non_null(j);
			int o = owner_index(j->owner);
			model_take(&m, j);
			served[o]++;
			pending[npending++] = o;
		}
		for (int o = 0; o < OWNERS; o++)
			assert_int_equal(served[o], 4000 / OWNERS);
		runq_fini(&m.q);
	}
}

/* The filter of a random pick: owners whose bit is set may not start. */
static bool model_ok(const void *owner, void *arg)
{
	return ((*(const unsigned *)arg >> owner_index(owner)) & 1u) == 0;
}

static void test_runq_random_arrivals_never_serve_an_owner_twice_while_another_waits(void **state)
{
	(void)state;
	struct model m = {0};
	uint64_t x = 0x9e3779b97f4a7c15u;

	runq_init(&m.q);
	for (int step = 0; step < 200000; step++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		unsigned r = (unsigned)(x >> 32);
		if (r % 3 != 0 || runq_len(&m.q) == 0) {
			model_push(&m, (int)(r / 3 % OWNERS)); /* NULL when the owner is full: fine */
			continue;
		}
		/* a pick; one in 8 rotates (a piece of a job ran) instead of taking */
		struct backend_job *j = runq_peek(&m.q, NULL, NULL);
		assert_non_null(j);
		if (r / 3 % 8 == 0) {
			runq_rotate(&m.q, j);
			model_turn(&m, owner_index(j->owner));
		} else {
			model_take(&m, j);
		}
	}
	/* a filtered pick returns an allowed owner's head job, NULL when no owner is allowed */
	unsigned blocked = 0xffu;
	assert_null(runq_peek(&m.q, model_ok, &blocked));
	for (int o = 0; o < OWNERS; o++) {
		if (m.queued[o] == 0)
			continue;
		blocked = 0xffu & ~(1u << o);
		struct backend_job *j = runq_peek(&m.q, model_ok, &blocked);
		assert_non_null(j);
		assert_int_equal(owner_index(j->owner), o);
	}
	/* cancel: every job of owner 0 comes back in queue order, the rest stay */
	unsigned before = runq_len(&m.q), n0 = 0;
	for (struct backend_job *j = runq_remove(&m.q, &owner_tag[0], NULL, NULL), *nx; j; j = nx) {
		nx = j->next;
		assert_int_equal(owner_index(j->owner), 0);
		n0++;
	}
	assert_int_equal(n0, (unsigned)m.queued[0]);
	assert_int_equal(runq_len(&m.q), before - n0);
	runq_fini(&m.q);
}

static void test_runq_higher_class_first_and_a_newcomer_waits_its_turn(void **state)
{
	(void)state;
	struct runq q;
	struct backend_job a1, a2, b1, c1, h1, l1;

	runq_init(&q);
	job_init(&a1, 0, FA_PRIORITY_NORMAL);
	job_init(&a2, 0, FA_PRIORITY_NORMAL);
	job_init(&b1, 1, FA_PRIORITY_NORMAL);
	job_init(&c1, 2, FA_PRIORITY_NORMAL);
	job_init(&h1, 3, FA_PRIORITY_HIGH);
	job_init(&l1, 4, FA_PRIORITY_LOW);
	assert_int_equal(runq_push(&q, &l1), FA_OK);
	assert_int_equal(runq_push(&q, &a1), FA_OK);
	assert_int_equal(runq_push(&q, &a2), FA_OK);
	assert_int_equal(runq_push(&q, &b1), FA_OK);
	assert_int_equal(runq_push(&q, &h1), FA_OK);
	assert_ptr_equal(runq_peek(&q, NULL, NULL), &h1); /* strict priority */
	runq_take(&q, &h1);
	assert_ptr_equal(runq_peek(&q, NULL, NULL), &a1);
	runq_take(&q, &a1);
	/* c arrives after a was served: it comes after b, and before a's second job */
	assert_int_equal(runq_push(&q, &c1), FA_OK);
	assert_ptr_equal(runq_peek(&q, NULL, NULL), &b1);
	runq_take(&q, &b1);
	assert_ptr_equal(runq_peek(&q, NULL, NULL), &c1);
	runq_take(&q, &c1);
	assert_ptr_equal(runq_peek(&q, NULL, NULL), &a2);
	runq_take(&q, &a2);
	assert_ptr_equal(runq_peek(&q, NULL, NULL), &l1);
	runq_take(&q, &l1);
	assert_null(runq_peek(&q, NULL, NULL));
	assert_int_equal(runq_len(&q), 0);
	runq_fini(&q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_runq_synchronous_clients_take_turns),
		cmocka_unit_test(test_runq_random_arrivals_never_serve_an_owner_twice_while_another_waits),
		cmocka_unit_test(test_runq_higher_class_first_and_a_newcomer_waits_its_turn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
