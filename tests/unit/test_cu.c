/* test_cu.c - the CUDA driver shim (common/fa_cu.h) without a GPU: the sticky set is exactly the
 * daemon's, the error texts work before and without a driver, and the load gives one answer (a
 * reason when it fails, every entry point when it works) however many threads ask.
 *
 * The tests run in this order on purpose: the first ones look at the shim before any load.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "fa_cu.h"

static void test_cu_why_is_empty_before_a_load(void **state)
{
	(void)state;
	assert_string_equal(fa_cu_why(), "");
}

static void test_cu_errstr_works_without_a_driver(void **state)
{
	(void)state;
	/* No driver knows 123456; one that is loaded answers it as the fallback does. */
	assert_string_equal(fa_cu_errstr(123456), "unknown CUDA error");
	assert_non_null(fa_cu_errstr(700));
}

static void test_cu_errname_names_known_codes_without_a_driver(void **state)
{
	(void)state;
	assert_string_equal(fa_cu_errname(0), "CUDA_SUCCESS");
	assert_string_equal(fa_cu_errname(2), "CUDA_ERROR_OUT_OF_MEMORY");
	assert_string_equal(fa_cu_errname(700), "CUDA_ERROR_ILLEGAL_ADDRESS");
	assert_string_equal(fa_cu_errname(719), "CUDA_ERROR_LAUNCH_FAILED");
	assert_string_equal(fa_cu_errname(999), "CUDA_ERROR_UNKNOWN");
	assert_string_equal(fa_cu_errname(123456), "CUDA_ERROR_UNRECOGNISED");
	assert_string_equal(fa_cu_errname(-1), "CUDA_ERROR_UNRECOGNISED");
}

/* The set the GPU backend's gpu_sticky had before the shim: the context is gone after these
 * only. */
static void test_cu_sticky_is_exactly_the_context_poisoning_set(void **state)
{
	static const int sticky[] = {214, 220, 226, 700, 702, 709, 710, 714,
	                             715, 716, 717, 718, 719, 721, 999};
	(void)state;
	for (int r = -1000; r <= 100000; r++) {
		bool want = false;
		for (size_t i = 0; i < sizeof sticky / sizeof sticky[0]; i++)
			want = want || sticky[i] == r;
		if (fa_cu_sticky(r) != want)
			fail_msg("fa_cu_sticky(%d) is %d, want %d", r, fa_cu_sticky(r), want);
	}
}

static void *load_in_thread(void *arg)
{
	*(fa_status *)arg = fa_cu_load();
	return NULL;
}

/* Eight threads at once, then again: one answer; a reason exactly when it failed. */
static void test_cu_load_gives_one_answer_to_every_thread(void **state)
{
	pthread_t t[8];
	fa_status got[8];
	(void)state;
	for (int i = 0; i < 8; i++)
		assert_int_equal(pthread_create(&t[i], NULL, load_in_thread, &got[i]), 0);
	for (int i = 0; i < 8; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	fa_status st = fa_cu_load();
	for (int i = 0; i < 8; i++)
		assert_int_equal(got[i], st);
	assert_true(st == FA_OK || st == FA_ENOGPU);
	if (st == FA_OK) {
		assert_string_equal(fa_cu_why(), "");
		assert_non_null(fa_cu->Init);
		assert_non_null(fa_cu->IpcOpenEventHandle); /* the last of the list */
		assert_string_not_equal(fa_cu_errstr(700), "unknown CUDA error");
	} else {
		print_message("no driver here: %s\n", fa_cu_why());
		assert_true(strlen(fa_cu_why()) > 0);
		assert_null(strchr(fa_cu_why(), '\n'));
		assert_ptr_equal(fa_cu_why(), fa_cu_why());
		assert_int_equal(fa_cu_load(), FA_ENOGPU); /* never retried */
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cu_why_is_empty_before_a_load),
		cmocka_unit_test(test_cu_errstr_works_without_a_driver),
		cmocka_unit_test(test_cu_errname_names_known_codes_without_a_driver),
		cmocka_unit_test(test_cu_sticky_is_exactly_the_context_poisoning_set),
		cmocka_unit_test(test_cu_load_gives_one_answer_to_every_thread),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
