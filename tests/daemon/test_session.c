/* test_session.c - session bookkeeping: open and find, use from other connections of the same
 * process only, close when the last connection drops, limits, regions and reference counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dtest.h"
#include "log.h"
#include "session.h"

static unsigned closes_seen;

static void count_close(struct session *s, void *arg)
{
	(void)s;
	(void)arg;
	closes_seen++;
}

static void table(struct session_table *t, unsigned max_sessions, unsigned max_regions)
{
	session_table_init(t, max_sessions, max_regions, 8);
	t->on_close = count_close;
	closes_seen = 0;
}

static void test_session_open_gives_a_findable_random_id(void **state)
{
	struct session_table t;
	struct session *a, *b;
	struct ipc_peer p = dtest_peer(10);
	char err[256];
	(void)state;

	table(&t, 4, 4);
	assert_int_equal(session_open(&t, &p, "prog", &a, err, sizeof err), FA_OK);
	assert_int_equal(session_open(&t, &p, "prog", &b, err, sizeof err), FA_OK);
	assert_true(a->id != 0 && b->id != 0 && a->id != b->id);
	assert_ptr_equal(session_find(&t, a->id), a);
	assert_null(session_find(&t, a->id ^ 1));
	assert_int_equal(session_count(&t), 2);
	assert_true(t.opened_total == 2);
	session_table_fini(&t, true);
	assert_int_equal(closes_seen, 2);
}

static void test_session_is_usable_only_by_the_same_process(void **state)
{
	struct session_table t;
	struct session *s;
	struct ipc_peer p = dtest_peer(10), q = dtest_peer(11), other = dtest_peer(12);
	char err[256];
	(void)state;

	table(&t, 4, 4);
	assert_int_equal(session_open(&t, &p, "", &s, err, sizeof err), FA_OK);
	assert_int_equal(session_attach(s, &q), FA_OK); /* another socket of this process */
	assert_true(session_has_pipe(s, 10) && session_has_pipe(s, 11));
	assert_int_equal(s->npipes, 2);
	assert_int_equal(session_attach(s, &q), FA_OK); /* no duplicates */
	assert_int_equal(s->npipes, 2);
	other.pid++;
	assert_int_equal(session_attach(s, &other), FA_ESESSION);
	other = dtest_peer(12);
	other.uid++;
	assert_int_equal(session_attach(s, &other), FA_ESESSION);
	assert_false(session_has_pipe(s, 12));
	session_table_fini(&t, true);
}

static void test_session_closes_when_its_last_connection_drops(void **state)
{
	struct session_table t;
	struct session *s, *keep;
	struct ipc_peer p = dtest_peer(10), q = dtest_peer(11), r = dtest_peer(20);
	char err[256];
	(void)state;

	table(&t, 4, 4);
	assert_int_equal(session_open(&t, &p, "", &s, err, sizeof err), FA_OK);
	assert_int_equal(session_attach(s, &q), FA_OK);
	assert_int_equal(session_open(&t, &r, "", &keep, err, sizeof err), FA_OK);
	uint64_t id = s->id;
	assert_int_equal(session_pipe_closed(&t, 10), 0);
	assert_ptr_equal(session_find(&t, id), s);
	assert_int_equal(session_pipe_closed(&t, 99), 0); /* a connection nobody used */
	assert_int_equal(session_pipe_closed(&t, 11), 1);
	assert_null(session_find(&t, id));
	assert_int_equal(closes_seen, 1);
	assert_ptr_equal(session_find(&t, keep->id), keep);
	session_table_fini(&t, true);
}

static void test_session_limit_is_elimit(void **state)
{
	struct session_table t;
	struct session *s;
	struct ipc_peer p = dtest_peer(10);
	char err[256];
	(void)state;

	table(&t, 2, 4);
	assert_int_equal(session_open(&t, &p, "", &s, err, sizeof err), FA_OK);
	assert_int_equal(session_open(&t, &p, "", &s, err, sizeof err), FA_OK);
	assert_int_equal(session_open(&t, &p, "", &s, err, sizeof err), FA_ELIMIT);
	assert_non_null(strstr(err, "--max-sessions"));
	session_table_fini(&t, true);
}

static void test_session_regions_limit_and_scope(void **state)
{
	struct session_table t;
	struct session *a, *b;
	struct ipc_peer p = dtest_peer(10);
	char name[FA_PROTO_SHM_NAME_MAX], err[256];
	struct region *r1, *r2, *r3;
	(void)state;

	table(&t, 4, 2);
	assert_int_equal(session_open(&t, &p, "", &a, err, sizeof err), FA_OK);
	assert_int_equal(session_open(&t, &p, "", &b, err, sizeof err), FA_OK);
	assert_non_null(r1 = dtest_region(a, 4096));
	assert_non_null(r2 = dtest_region(a, 4096));
	assert_true(r1->id != 0 && r1->id != r2->id);
	assert_ptr_equal(session_region_find(a, r1->id), r1);
	assert_null(session_region_find(b, r1->id)); /* another session's id is unknown */

	assert_int_equal(dtest_shm_create(name, 4096), 0);
	assert_int_equal(region_open_shm(&r3, name, 4096, getuid(), UINT64_MAX, err, sizeof err),
	                 FA_OK);
	assert_int_equal(session_region_add(a, r3, err, sizeof err), FA_ELIMIT);
	assert_non_null(strstr(err, "--max-regions"));
	r3->unlink = true;
	region_unref(r3);

	uint64_t id1 = r1->id;
	snprintf(name, sizeof name, "%s", r1->name);
	assert_int_equal(session_region_remove(b, id1), FA_EREGION);
	assert_int_equal(session_region_remove(a, id1), FA_OK); /* r1 is gone */
	assert_int_equal(session_region_remove(a, id1), FA_EREGION);
	assert_true(dtest_shm_exists(name)); /* unregistering leaves the object to the client */
	shm_unlink(name);
	session_table_fini(&t, true);
}

static void test_session_close_waits_for_requests_and_unlinks_on_drop(void **state)
{
	struct session_table t;
	struct session *s;
	struct ipc_peer p = dtest_peer(10);
	char err[256], name[FA_PROTO_SHM_NAME_MAX];
	struct region *r;
	unsigned n0 = region_count();
	(void)state;

	table(&t, 4, 4);
	assert_int_equal(session_open(&t, &p, "", &s, err, sizeof err), FA_OK);
	assert_non_null(r = dtest_region(s, 4096));
	snprintf(name, sizeof name, "%s", r->name);
	/* A request in flight holds the session and the region. */
	session_ref(s);
	region_ref(r);
	assert_int_equal(session_pipe_closed(&t, 10), 1);
	assert_false(s->open);
	assert_int_equal(region_count(), n0 + 1); /* still mapped under the request */
	assert_true(dtest_shm_exists(name));
	((char *)r->base)[0] = 1; /* and usable */
	region_unref(r);
	session_unref(s);
	assert_int_equal(region_count(), n0);
	assert_false(dtest_shm_exists(name)); /* a dead client leaks nothing */
	session_table_fini(&t, true);
}

static void test_session_clean_shutdown_keeps_the_clients_objects(void **state)
{
	struct session_table t;
	struct session *s;
	struct ipc_peer p = dtest_peer(10);
	char err[256], name[FA_PROTO_SHM_NAME_MAX];
	struct region *r;
	(void)state;

	table(&t, 4, 4);
	assert_int_equal(session_open(&t, &p, "", &s, err, sizeof err), FA_OK);
	assert_non_null(r = dtest_region(s, 4096));
	snprintf(name, sizeof name, "%s", r->name);
	session_table_fini(&t, false);
	assert_true(dtest_shm_exists(name));
	shm_unlink(name);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_session_open_gives_a_findable_random_id),
		cmocka_unit_test(test_session_is_usable_only_by_the_same_process),
		cmocka_unit_test(test_session_closes_when_its_last_connection_drops),
		cmocka_unit_test(test_session_limit_is_elimit),
		cmocka_unit_test(test_session_regions_limit_and_scope),
		cmocka_unit_test(test_session_close_waits_for_requests_and_unlinks_on_drop),
		cmocka_unit_test(test_session_clean_shutdown_keeps_the_clients_objects),
	};
	log_level = FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
