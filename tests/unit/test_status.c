/* test_status.c - the status map (FA_STATUS_MAP in fa_types.h): every code named as in the enum,
 * with its own text and its fixed number; unknown codes get the fixed strings; the version string
 * follows the header's macros.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fa_err.h"

/* Every entry of the one map with its identifier, spelled by the preprocessor (so a name that
 * differs from the enum identifier fails), and the number and text the map gives it. */
#define S(name, number, text) {name, #name, number, text},
static const struct {
	fa_status st;
	const char *ident;
	long long number;
	const char *text;
} statuses[] = {FA_STATUS_MAP(S)};
#undef S
#define N_STATUS (sizeof statuses / sizeof statuses[0])

static void test_status_names_match_the_enum_identifiers(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_STATUS; i++) {
		assert_string_equal(fa_status_name(statuses[i].st), statuses[i].ident);
		assert_string_equal(fa_strerror(statuses[i].st), statuses[i].text);
		assert_int_equal((long long)statuses[i].st, statuses[i].number);
		assert_true(fa_status_known(statuses[i].number));
	}
}

static void test_status_every_value_has_a_distinct_name_and_text(void **state)
{
	(void)state;
	for (size_t i = 0; i < N_STATUS; i++) {
		const char *text = fa_strerror(statuses[i].st);
		assert_non_null(text);
		assert_true(strlen(text) > 0);
		assert_string_not_equal(text, fa_strerror((fa_status)12345));
		for (size_t j = 0; j < i; j++) {
			assert_int_not_equal(statuses[i].st, statuses[j].st);
			assert_string_not_equal(fa_status_name(statuses[i].st),
			                        fa_status_name(statuses[j].st));
			assert_string_not_equal(text, fa_strerror(statuses[j].st));
		}
	}
}

static void test_status_numbers_are_fixed(void **state)
{
	(void)state;
	/* The numbers travel on the wire: spot-check that none moved, and that none was dropped. */
	assert_int_equal(N_STATUS, 26);
	assert_int_equal(FA_OK, 0);
	assert_int_equal(FA_EPROTO, 5);
	assert_int_equal(FA_EVERSION, 6);
	assert_int_equal(FA_ETOOBIG, 17);
	assert_int_equal(FA_EDTYPE, 24);
	assert_int_equal(FA_EINTERNAL, 99);
}

static void test_status_unknown_values_give_fixed_strings(void **state)
{
	(void)state;
	static const int unknown[] = {-1, 25, 26, 50, 98, 100, 1000, INT32_MAX, INT32_MIN};
	for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
		fa_status st = (fa_status)unknown[i];
		assert_string_equal(fa_status_name(st), "FA_UNKNOWN");
		assert_string_equal(fa_strerror(st), "unknown status");
		assert_false(fa_status_known(unknown[i]));
	}
	/* The same pointer each time: static storage. */
	assert_ptr_equal(fa_strerror((fa_status)77), fa_strerror((fa_status)78));
	assert_ptr_equal(fa_strerror(FA_EPROTO), fa_strerror(FA_EPROTO));
	assert_false(fa_status_known((int64_t)1 << 40));
}

static void test_status_version_string_follows_the_header(void **state)
{
	(void)state;
	char want[32];
	snprintf(want, sizeof want, "%d.%d.%d", FA_VERSION_MAJOR, FA_VERSION_MINOR,
	         FA_VERSION_PATCH);
	assert_string_equal(fa_version_string(), want);
	assert_ptr_equal(fa_version_string(), fa_version_string());
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_status_names_match_the_enum_identifiers),
		cmocka_unit_test(test_status_every_value_has_a_distinct_name_and_text),
		cmocka_unit_test(test_status_numbers_are_fixed),
		cmocka_unit_test(test_status_unknown_values_give_fixed_strings),
		cmocka_unit_test(test_status_version_string_follows_the_header),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
