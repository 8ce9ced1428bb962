/* test_dedupe.c - the per-session ring: new, repeated while running (reply re-addressed),
 * repeated after the answer (replayed), reused seq with another op, eviction order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dedupe.h"

static struct ipc_hdr hdr_of(uint32_t pipe, uint32_t reqid)
{
	struct ipc_hdr h = {.len = 8};
	memcpy(h.b, &pipe, 4);
	memcpy(h.b + 4, &reqid, 4);
	return h;
}

static void test_dedupe_first_sight_is_new_and_running(void **state)
{
	struct dedupe d;
	struct dedupe_entry *e;
	struct ipc_hdr h = hdr_of(1, 0x80000001);
	(void)state;

	assert_int_equal(dedupe_init(&d, 4), FA_OK);
	assert_int_equal(dedupe_check(&d, 7, 20, &h, &e), DEDUPE_NEW);
	assert_non_null(e);
	assert_int_equal(e->state, DEDUPE_RUNNING);
	assert_int_equal(dedupe_count(&d, DEDUPE_RUNNING), 1);
	dedupe_fini(&d);
}

static void test_dedupe_repeat_while_running_readdresses_the_reply(void **state)
{
	struct dedupe d;
	struct dedupe_entry *e, *e2;
	struct ipc_hdr h1 = hdr_of(1, 0x80000001), h2 = hdr_of(2, 0x80000005);
	(void)state;

	assert_int_equal(dedupe_init(&d, 4), FA_OK);
	assert_int_equal(dedupe_check(&d, 7, 20, &h1, &e), DEDUPE_NEW);
	assert_int_equal(dedupe_check(&d, 7, 20, &h2, &e2), DEDUPE_IN_PROGRESS);
	assert_ptr_equal(e, e2);
	/* The copy on the new connection is the one the client waits on. */
	assert_int_equal(e->hdr.len, 8);
	assert_memory_equal(e->hdr.b, h2.b, 8);
	dedupe_fini(&d);
}

static void test_dedupe_repeat_after_answer_replays_the_bytes(void **state)
{
	struct dedupe d;
	struct dedupe_entry *e;
	struct ipc_hdr h = hdr_of(1, 0x80000001);
	const char reply[] = "\x85reply-bytes";
	(void)state;

	assert_int_equal(dedupe_init(&d, 4), FA_OK);
	assert_int_equal(dedupe_check(&d, 9, 10, &h, &e), DEDUPE_NEW);
	dedupe_finish(&d, e, reply, sizeof reply);
	assert_int_equal(dedupe_check(&d, 9, 10, &h, &e), DEDUPE_REPLAY);
	assert_int_equal(e->reply_len, sizeof reply);
	assert_memory_equal(e->reply, reply, sizeof reply);
	assert_int_equal(dedupe_check(&d, 9, 10, &h, &e), DEDUPE_REPLAY); /* and again */
	dedupe_fini(&d);
}

static void test_dedupe_seq_reused_by_another_op_is_a_conflict(void **state)
{
	struct dedupe d;
	struct dedupe_entry *e;
	struct ipc_hdr h = hdr_of(1, 0x80000001);
	(void)state;

	assert_int_equal(dedupe_init(&d, 4), FA_OK);
	assert_int_equal(dedupe_check(&d, 3, 10, &h, &e), DEDUPE_NEW);
	dedupe_finish(&d, e, "x", 1);
	assert_int_equal(dedupe_check(&d, 3, 20, &h, &e), DEDUPE_CONFLICT);
	dedupe_fini(&d);
}

static void test_dedupe_evicts_the_oldest_answer_never_a_running_one(void **state)
{
	struct dedupe d;
	struct dedupe_entry *e, *running;
	struct ipc_hdr h = hdr_of(1, 0x80000001);
	(void)state;

	assert_int_equal(dedupe_init(&d, 3), FA_OK);
	assert_int_equal(dedupe_check(&d, 1, 20, &h, &running), DEDUPE_NEW); /* stays running */
	assert_int_equal(dedupe_check(&d, 2, 3, &h, &e), DEDUPE_NEW);
	dedupe_finish(&d, e, "2", 1);
	assert_int_equal(dedupe_check(&d, 3, 3, &h, &e), DEDUPE_NEW);
	dedupe_finish(&d, e, "3", 1);
	/* Full: seq 4 replaces seq 2, the oldest answered one. */
	assert_int_equal(dedupe_check(&d, 4, 3, &h, &e), DEDUPE_NEW);
	dedupe_finish(&d, e, "4", 1);
	assert_int_equal(dedupe_check(&d, 1, 20, &h, &e), DEDUPE_IN_PROGRESS);
	assert_int_equal(dedupe_check(&d, 3, 3, &h, &e), DEDUPE_REPLAY);
	assert_int_equal(dedupe_check(&d, 4, 3, &h, &e), DEDUPE_REPLAY);
	/* seq 2 was forgotten: seen as new (and evicts seq 3 now). */
	assert_int_equal(dedupe_check(&d, 2, 3, &h, &e), DEDUPE_NEW);
	dedupe_drop(&d, e);

	/* A ring full of running requests has no slot: the request runs unprotected. */
	assert_int_equal(dedupe_check(&d, 10, 20, &h, &e), DEDUPE_NEW);
	assert_int_equal(dedupe_check(&d, 11, 20, &h, &e), DEDUPE_NEW);
	assert_int_equal(dedupe_check(&d, 12, 20, &h, &e), DEDUPE_NEW);
	assert_null(e);
	assert_int_equal(dedupe_count(&d, DEDUPE_RUNNING), 3);
	dedupe_fini(&d);
}

static void test_dedupe_large_replies_are_not_kept(void **state)
{
	struct dedupe d;
	struct dedupe_entry *e;
	struct ipc_hdr h = hdr_of(1, 0x80000001);
	static char big[DEDUPE_REPLY_MAX + 1];
	(void)state;

	assert_int_equal(dedupe_init(&d, 2), FA_OK);
	assert_int_equal(dedupe_check(&d, 5, 4, &h, &e), DEDUPE_NEW);
	dedupe_finish(&d, e, big, sizeof big);
	assert_int_equal(dedupe_count(&d, DEDUPE_DONE), 0);
	assert_int_equal(dedupe_check(&d, 5, 4, &h, &e), DEDUPE_NEW); /* recomputed */
	dedupe_fini(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dedupe_first_sight_is_new_and_running),
		cmocka_unit_test(test_dedupe_repeat_while_running_readdresses_the_reply),
		cmocka_unit_test(test_dedupe_repeat_after_answer_replays_the_bytes),
		cmocka_unit_test(test_dedupe_seq_reused_by_another_op_is_a_conflict),
		cmocka_unit_test(test_dedupe_evicts_the_oldest_answer_never_a_running_one),
		cmocka_unit_test(test_dedupe_large_replies_are_not_kept),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
