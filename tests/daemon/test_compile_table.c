/* test_compile_table.c - the GPU backend's "waiting for a compile" table (compile_pool.h):
 * one compile per specialisation, jobs handed back in order, each job exactly once whether the
 * compile finishes or the jobs are cancelled (by owner, all at shutdown), before or during the
 * compile. No GPU needed: the table is pure bookkeeping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "compile_pool.h"

static int owner_a, owner_b;

/* A job of owner with a recognisable head dim. */
static void job_make(struct backend_job *j, const void *owner, int64_t D)
{
	memset(j, 0, sizeof(*j));
	j->owner = owner;
	j->desc.D = D;
}

/* The number of jobs in a list. */
static unsigned list_len(const struct backend_job *j)
{
	unsigned n = 0;
	for (; j != NULL; j = j->next)
		n++;
	return n;
}

static void test_compile_table_compiles_each_specialisation_once(void **state)
{
	struct compile_table t;
	struct backend_job j[3];
	bool is_new;
	(void)state;

	compile_table_init(&t);
	job_make(&j[0], &owner_a, 64);
	job_make(&j[1], &owner_b, 64);
	job_make(&j[2], &owner_a, 128);
	assert_int_equal(compile_table_add(&t, "d64", &j[0], &is_new), FA_OK);
	assert_true(is_new);
	assert_int_equal(compile_table_add(&t, "d64", &j[1], &is_new), FA_OK);
	assert_false(is_new);
	assert_int_equal(compile_table_add(&t, "d128", &j[2], &is_new), FA_OK);
	assert_true(is_new);
	assert_int_equal(t.entries, 2);
	assert_int_equal(t.jobs, 3);

	struct compile_wait *w1 = compile_table_take(&t), *w2 = compile_table_take(&t);
	assert_non_null(w1);
	assert_non_null(w2);
	assert_null(compile_table_take(&t)); /* both taken: nothing to start twice */
	assert_string_equal(w1->key, "d64");
	assert_int_equal(w1->desc.D, 64); /* the first job's problem is compiled */

	struct backend_job *done = compile_table_finish(&t, w1);
	assert_ptr_equal(done, &j[0]);
	assert_ptr_equal(done->next, &j[1]); /* arrival order */
	assert_null(j[1].next);
	assert_int_equal(t.entries, 1);
	assert_int_equal(t.jobs, 1);
	done = compile_table_finish(&t, w2);
	assert_ptr_equal(done, &j[2]);
	assert_int_equal(t.entries, 0);
	assert_int_equal(t.jobs, 0);
	compile_table_fini(&t);
}

static void test_compile_table_cancel_takes_only_the_owners_jobs(void **state)
{
	struct compile_table t;
	struct backend_job j[4];
	bool is_new;
	unsigned n;
	(void)state;

	compile_table_init(&t);
	job_make(&j[0], &owner_a, 64);
	job_make(&j[1], &owner_b, 64);
	job_make(&j[2], &owner_a, 64);
	job_make(&j[3], &owner_a, 128);
	for (int i = 0; i < 3; i++)
		assert_int_equal(compile_table_add(&t, "d64", &j[i], &is_new), FA_OK);
	assert_int_equal(compile_table_add(&t, "d128", &j[3], &is_new), FA_OK);

	struct backend_job *gone = compile_table_cancel(&t, &owner_a, &n);
	assert_int_equal(n, 3);
	assert_int_equal(list_len(gone), 3);
	/* d128 had only a's job and no thread: dropped; d64 keeps b's */
	assert_int_equal(t.entries, 1);
	assert_int_equal(t.jobs, 1);
	struct compile_wait *w = compile_table_take(&t);
	assert_non_null(w);
	assert_string_equal(w->key, "d64");
	assert_ptr_equal(w->tail, &j[1]); /* the tail was fixed: adding still works */
	struct backend_job j5;
	job_make(&j5, &owner_b, 64);
	assert_int_equal(compile_table_add(&t, "d64", &j5, &is_new), FA_OK);
	assert_false(is_new); /* joins the compile in progress */
	struct backend_job *done = compile_table_finish(&t, w);
	assert_ptr_equal(done, &j[1]);
	assert_ptr_equal(done->next, &j5);
	assert_null(j5.next);
	compile_table_fini(&t);
}

static void test_compile_table_cancel_during_a_compile_leaves_no_jobs_to_run(void **state)
{
	struct compile_table t;
	struct backend_job j[2];
	bool is_new;
	unsigned n;
	(void)state;

	compile_table_init(&t);
	job_make(&j[0], &owner_a, 64);
	job_make(&j[1], &owner_b, 64);
	assert_int_equal(compile_table_add(&t, "d64", &j[0], &is_new), FA_OK);
	assert_int_equal(compile_table_add(&t, "d64", &j[1], &is_new), FA_OK);
	struct compile_wait *w = compile_table_take(&t);
	/* shutdown: every waiting job, whoever owns it */
	struct backend_job *gone = compile_table_cancel(&t, NULL, &n);
	assert_int_equal(n, 2);
	assert_int_equal(list_len(gone), 2);
	assert_int_equal(t.jobs, 0);
	assert_int_equal(t.entries, 1); /* the compiling thread still owns its entry */
	assert_null(compile_table_finish(&t, w)); /* nothing answered twice */
	assert_int_equal(t.entries, 0);
	assert_null(compile_table_cancel(&t, NULL, &n));
	assert_int_equal(n, 0);
	compile_table_fini(&t);
}

static void test_compile_table_starts_compiles_oldest_first(void **state)
{
	struct compile_table t;
	struct backend_job j[3];
	bool is_new;
	const char *keys[3] = {"c", "a", "b"};
	(void)state;

	compile_table_init(&t);
	for (int i = 0; i < 3; i++) {
		job_make(&j[i], &owner_a, 32 * (i + 1));
		assert_int_equal(compile_table_add(&t, keys[i], &j[i], &is_new), FA_OK);
	}
	for (int i = 0; i < 3; i++) {
		struct compile_wait *w = compile_table_take(&t);
		assert_non_null(w);
		assert_string_equal(w->key, keys[i]);
		assert_ptr_equal(compile_table_finish(&t, w), &j[i]);
	}
	assert_int_equal(t.entries, 0);
	compile_table_fini(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_compile_table_compiles_each_specialisation_once),
		cmocka_unit_test(test_compile_table_cancel_takes_only_the_owners_jobs),
		cmocka_unit_test(test_compile_table_cancel_during_a_compile_leaves_no_jobs_to_run),
		cmocka_unit_test(test_compile_table_starts_compiles_oldest_first),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
