/* test_dedupe.c - the per-session ring: new, repeated while running (reply re-addressed),
 * repeated after the answer (replayed), reused seq with another op, eviction order, and the
 * hashed ring against the plain scan it replaced (a model), over random sequences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* The ring as it was (dedupe.c before 2026-12-03: one scan per request), as the model of what
 * the hashed one must answer: the first entry with the seq, else a free slot, else the oldest
 * answered one. */
#define MODEL_CAP 8
struct model {
	struct {
		uint64_t seq, age;
		uint32_t op;
		int state;
		char reply[8];
	} e[MODEL_CAP];
	uint64_t clock;
};

static enum dedupe_result model_check(struct model *m, uint64_t seq, uint32_t op, int *slot)
{
	int victim = -1;
	*slot = -1;
	for (int i = 0; i < MODEL_CAP; i++) {
		if (m->e[i].state != DEDUPE_FREE && m->e[i].seq == seq) {
			if (m->e[i].op != op)
				return DEDUPE_CONFLICT;
			*slot = i;
			return m->e[i].state == DEDUPE_RUNNING ? DEDUPE_IN_PROGRESS : DEDUPE_REPLAY;
		}
		if (m->e[i].state == DEDUPE_FREE) {
			if (victim < 0 || m->e[victim].state != DEDUPE_FREE)
				victim = i;
		} else if (m->e[i].state == DEDUPE_DONE &&
		           (victim < 0 ||
		            (m->e[victim].state == DEDUPE_DONE && m->e[i].age < m->e[victim].age))) {
			victim = i;
		}
	}
	if (victim >= 0) {
		memset(&m->e[victim], 0, sizeof m->e[victim]);
		m->e[victim].seq = seq;
		m->e[victim].op = op;
		m->e[victim].state = DEDUPE_RUNNING;
		m->e[victim].age = ++m->clock;
		*slot = victim;
	}
	return DEDUPE_NEW;
}

static void test_dedupe_hashed_ring_answers_as_the_scan(void **state)
{
	static struct model m;
	struct dedupe d;
	struct dedupe_entry *running[MODEL_CAP] = {0}, *e;
	int running_slot[MODEL_CAP];
	unsigned nrun = 0;
	uint64_t rng = 12345;
	(void)state;

	memset(&m, 0, sizeof m);
	assert_int_equal(dedupe_init(&d, MODEL_CAP), FA_OK);
	for (int step = 0; step < 200000; step++) {
		rng = rng * 6364136223846793005ull + 1442695040888963407ull;
		unsigned r = (unsigned)(rng >> 33);
		if (nrun > 0 && (r % 3 == 0 || nrun == MODEL_CAP)) {
			/* answer (or drop) one running request, as dispatch_send does */
			unsigned k = (r >> 4) % nrun;
			char reply[8];
			int n = snprintf(reply, sizeof reply, "%u", (r >> 8) % 1000);
			if ((r >> 20) % 5 == 0) {
				dedupe_drop(&d, running[k]);
				m.e[running_slot[k]].state = DEDUPE_FREE;
			} else {
				dedupe_finish(&d, running[k], reply, (size_t)n + 1);
				m.e[running_slot[k]].state = DEDUPE_DONE;
				memcpy(m.e[running_slot[k]].reply, reply, (size_t)n + 1);
			}
			running[k] = running[--nrun];
			running_slot[k] = running_slot[nrun];
			continue;
		}
		uint64_t seq = (r >> 4) % 40; /* repeats, replays and evictions all happen */
		uint32_t op = (r >> 12) % 7 == 0 ? 21 : 20;
		struct ipc_hdr h = hdr_of(1, r);
		int slot;
		enum dedupe_result want = model_check(&m, seq, op, &slot);
		enum dedupe_result got = dedupe_check(&d, seq, op, &h, &e);
		assert_int_equal(got, want);
		assert_int_equal(e == NULL, slot < 0);
		if (got == DEDUPE_REPLAY)
			assert_string_equal((const char *)e->reply, m.e[slot].reply);
		if (got == DEDUPE_NEW && e != NULL) {
			running[nrun] = e;
			running_slot[nrun++] = slot;
		}
		for (int s = DEDUPE_FREE; s <= DEDUPE_DONE; s++) {
			unsigned n = 0;
			for (int i = 0; i < MODEL_CAP; i++)
				n += m.e[i].state == s;
			assert_int_equal(dedupe_count(&d, (enum dedupe_state)s), n);
		}
	}
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
		cmocka_unit_test(test_dedupe_hashed_ring_answers_as_the_scan),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
