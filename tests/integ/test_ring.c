/* test_ring.c - the submission ring (proto/fa_ring.h) on the CPU backend: calls through it give
 * the socket's results; a ring is the client's memory, so garbage entries are answered, an
 * impossible tail or a shrunk object closes the ring (the daemon and the session serve on over
 * the socket), another session's id is refused, ops with large replies are refused; one ring
 * per session and --max-rings in all (the next client falls back to the socket); a ring goes
 * with its session (BYE, or a SIGKILLed client: its object unlinked).
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <linux/futex.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_integ.h"
#include "fa_raw.h"
#include "fa_raw_ring.h"

static struct fa_daemon g_d;

static int setup(void **state)
{
	(void)state;
	if (daemon_start(&g_d, "--threads", "2", "--max-rings", "4", NULL) != 0) {
		daemon_log_dump(&g_d, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return daemon_finish(&g_d);
}

static void test_ring_serves_calls_with_the_sockets_results(void **state)
{
	(void)state;
	fa_client *c = NULL, *plain = NULL;
	fa_buffer *buf = NULL, *buf2 = NULL;
	uint64_t rng = 11;
	char why[256];

	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	uint64_t before = fa_integ_stat(c, "ring_entries");
	assert_true(before != UINT64_MAX);
	assert_true(fa_integ_stat(c, "ring_open") >= 1);
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 2, .Sq = 33, .Sk = 47, .Hq = 4,
	                     .Hkv = 2, .D = 64, .precision = FA_PREC_IEEE,
	                     .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT};
	for (int i = 0; i < 20; i++) {
		bool ok = fa_integ_run_case(c, &buf, &cs, &rng, NULL, NULL, why, sizeof why);
		if (!ok)
			printf("  %s\n", why);
		assert_true(ok);
	}
	for (int i = 0; i < 200; i++)
		assert_int_equal(fa_ping(c), FA_OK);
	uint64_t after = fa_integ_stat(c, "ring_entries");
	printf("  ring entries %llu -> %llu\n", (unsigned long long)before,
	       (unsigned long long)after);
	assert_true(after >= before + 220);
	assert_int_equal(fa_client_flush(c), FA_OK);

	/* FA_RING=0: the same calls by the socket, the ring counters still. */
	setenv("FA_RING", "0", 1);
	assert_int_equal(fa_client_open(&plain, g_d.url), FA_OK);
	unsetenv("FA_RING");
	before = fa_integ_stat(c, "ring_entries");
	for (int i = 0; i < 5; i++)
		assert_true(fa_integ_run_case(plain, &buf2, &cs, &rng, NULL, NULL, why, sizeof why));
	assert_int_equal(fa_integ_stat(c, "ring_entries"), before); /* STATS is the socket's */
	fa_buffer_free(buf);
	fa_buffer_free(buf2);
	fa_client_close(plain);
	fa_client_close(c);
}

/* Threads of one client share its ring: each its own buffer and cases, every result right. */
struct mt_arg {
	fa_client *c;
	int idx, bad;
};

static void *mt_thread(void *p)
{
	struct mt_arg *a = p;
	fa_buffer *buf = NULL;
	uint64_t rng = 100 + (uint64_t)a->idx;
	char why[256];
	struct fa_case cs = {.dtype = FA_DTYPE_FP32, .B = 1, .Sq = 17 + a->idx, .Sk = 29, .Hq = 2,
	                     .Hkv = 1, .D = 32, .precision = FA_PREC_IEEE};
	for (int i = 0; i < 150; i++) {
		if (fa_ping(a->c) != FA_OK)
			a->bad++;
		if (i % 10 == 0 && !fa_integ_run_case(a->c, &buf, &cs, &rng, NULL, NULL, why,
		                                      sizeof why)) {
			printf("  thread %d: %s\n", a->idx, why);
			a->bad++;
		}
	}
	fa_buffer_free(buf);
	return NULL;
}

static void test_ring_serves_threads_of_one_client_at_once(void **state)
{
	(void)state;
	fa_client *c = NULL;
	pthread_t th[8];
	struct mt_arg args[8];

	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	uint64_t before = fa_integ_stat(c, "ring_entries");
	for (int i = 0; i < 8; i++) {
		args[i] = (struct mt_arg){c, i, 0};
		assert_int_equal(pthread_create(&th[i], NULL, mt_thread, &args[i]), 0);
	}
	int bad = 0;
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		bad += args[i].bad;
	}
	uint64_t after = fa_integ_stat(c, "ring_entries");
	printf("  8 threads: %d failures, ring entries +%llu\n", bad,
	       (unsigned long long)(after - before));
	assert_int_equal(bad, 0);
	assert_true(after - before >= 8 * 165);
	fa_client_close(c);
}

static void test_ring_answers_garbage_and_other_sessions(void **state)
{
	(void)state;
	struct fa_raw_ring r;
	struct fa_proto_rep rep;
	struct fa_proto_req req;
	uint64_t rng = 21;
	uint32_t tag;

	fa_raw_ring_open(&r, g_d.url, &rng, FA_OK);
	/* Random bytes, an empty entry, a length beyond the entry: each answered FA_EPROTO. */
	unsigned char junk[FA_RING_MSG_MAX];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (unsigned char)fa_rand_next(&rng);
	fa_raw_ring_push(&r, junk, 100, 1);
	fa_raw_ring_push(&r, junk, 0, 2);
	fa_raw_ring_push(&r, junk, 0xffffffffu, 3);
	for (uint32_t want = 1; want <= 3; want++) {
		assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_EPROTO);
		assert_int_equal(tag, want);
	}
	/* A PING of this session: fine. Of another session (or none): FA_ESESSION. */
	memset(&req, 0, sizeof req);
	req.op = FA_OP_PING;
	req.session = r.sid;
	req.seq = ++r.seq;
	fa_raw_ring_push_req(&r, &req, 7);
	assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_OK);
	assert_int_equal(tag, 7);
	req.session = r.sid ^ 1;
	req.seq = ++r.seq;
	fa_raw_ring_push_req(&r, &req, 8);
	assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_ESESSION);
	/* STATS (a reply too large for an entry) and RING_OPEN are the socket's. */
	req.op = FA_OP_STATS;
	req.session = r.sid;
	req.seq = ++r.seq;
	fa_raw_ring_push_req(&r, &req, 9);
	assert_int_equal(fa_raw_ring_pop(&r, &tag, &rep), FA_ENOTSUP);
	printf("  STATS through the ring: %s\n", rep.detail);
	/* A second ring for the session: FA_ELIMIT. */
	memset(&req, 0, sizeof req);
	req.op = FA_OP_RING_OPEN;
	req.session = r.sid;
	req.seq = ++r.seq;
	req.u.reg.size = FA_RING_BYTES;
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "%s", r.m.name);
	assert_int_equal(fa_raw_call(r.s, &req, &rep), FA_ELIMIT);
	/* A wrong size, a wrong header: refused with what this daemon serves. */
	fa_raw_ring_close(&r);
	assert_true(daemon_alive(&g_d));
}

static void test_ring_refuses_a_wrong_layout(void **state)
{
	(void)state;
	struct fa_proto_rep rep;
	struct fa_proto_req req;
	struct fa_raw_shm m;
	uint64_t rng = 31;
	int s = fa_raw_open(g_d.url, fa_test_ms(5000));
	uint64_t sid = fa_raw_hello(s, 1, &rep);

	assert_true(sid != 0);
	assert_int_equal(fa_raw_ring_shm_create(&m, &rng), 0);
	memset(&req, 0, sizeof req);
	req.op = FA_OP_RING_OPEN;
	req.session = sid;
	req.seq = 2;
	req.u.reg.size = FA_RING_BYTES;
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "%s", m.name);
	assert_int_equal(fa_raw_call(s, &req, &rep), FA_EINVAL); /* magic 0 */
	printf("  %s\n", rep.detail);
	req.seq = 3;
	req.u.reg.size = FA_RING_BYTES / 2;
	assert_int_equal(fa_raw_call(s, &req, &rep), FA_ERANGE);
	req.seq = 4;
	req.u.reg.size = FA_RING_BYTES;
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "/not-ours");
	assert_int_equal(fa_raw_call(s, &req, &rep), FA_EINVAL);
	req.seq = 5; /* a buffer's name is not a ring's */
	snprintf(req.u.reg.shm_name, sizeof req.u.reg.shm_name, "/fa.%u.%d.0123456789abcdef",
	         (unsigned)getuid(), (int)getpid());
	assert_int_equal(fa_raw_call(s, &req, &rep), FA_EINVAL);
	printf("  %s\n", rep.detail);
	fa_raw_simple(s, FA_OP_BYE, sid, 6, &rep);
	nn_close(s);
	fa_raw_shm_destroy(&m);
}

/* Wait for the ring's dead word. */
static bool wait_dead(struct fa_raw_ring *r, uint32_t want)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(5000);
	while (__atomic_load_n(&r->h->dead, __ATOMIC_SEQ_CST) != want) {
		if (fa_test_now_ms() >= deadline)
			return false;
		fa_test_sleep_ms(2);
	}
	return true;
}

static void test_ring_impossible_tail_closes_the_ring_not_the_session(void **state)
{
	(void)state;
	struct fa_raw_ring r;
	struct fa_proto_rep rep;
	uint64_t rng = 41;

	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	uint64_t broken = fa_integ_stat(c, "ring_broken");
	fa_raw_ring_open(&r, g_d.url, &rng, FA_OK);
	__atomic_store_n(&r.h->sq_tail, r.tail + 1000, __ATOMIC_SEQ_CST);
	syscall(SYS_futex, &r.h->sq_tail, FUTEX_WAKE, 1, NULL, NULL, 0);
	assert_true(wait_dead(&r, FA_RING_DEAD_PROTOCOL));
	/* The session serves on over the socket. */
	assert_int_equal(fa_raw_simple(r.s, FA_OP_PING, r.sid, ++r.seq, &rep), FA_OK);
	assert_true(fa_integ_wait_stat(c, NULL, "ring_broken", broken + 1, fa_test_ms(5000), NULL));
	fa_client_close(c);
	fa_raw_ring_close(&r);
	assert_true(daemon_alive(&g_d));
}

static void test_ring_shrunk_object_does_not_kill_the_daemon(void **state)
{
	(void)state;
	struct fa_raw_ring r;
	struct fa_proto_rep rep;
	uint64_t rng = 51;
	fa_client *c = NULL;

	fa_raw_ring_open(&r, g_d.url, &rng, FA_OK);
	assert_int_equal(fa_client_open(&c, g_d.url), FA_OK);
	uint64_t broken = fa_integ_stat(c, "ring_broken");
	/* The daemon's thread reads the vanished pages within its sleep (200 ms). */
	assert_int_equal(ftruncate(r.m.fd, 0), 0);
	bool seen = fa_integ_wait_stat(c, NULL, "ring_broken", broken + 1, fa_test_ms(5000), NULL);
	assert_true(seen);
	assert_int_equal(fa_raw_simple(r.s, FA_OP_PING, r.sid, ++r.seq, &rep), FA_OK);
	assert_int_equal(fa_ping(c), FA_OK);
	fa_client_close(c);
	munmap(r.m.map, r.m.size); /* our own mapping faults too now: never touched again */
	r.m.map = NULL;
	fa_raw_ring_close(&r);
	assert_true(daemon_alive(&g_d));
}

static void test_ring_limit_falls_back_to_the_socket(void **state)
{
	(void)state;
	fa_client *c[6] = {0};
	struct fa_raw_ring extra;
	uint64_t rng = 61;

	/* --max-rings 4: the fifth and sixth clients call by the socket and do not notice. */
	for (int i = 0; i < 6; i++)
		assert_int_equal(fa_client_open(&c[i], g_d.url), FA_OK);
	assert_int_equal(fa_integ_stat(c[0], "ring_open"), 4);
	for (int i = 0; i < 6; i++)
		assert_int_equal(fa_ping(c[i]), FA_OK);
	fa_raw_ring_open(&extra, g_d.url, &rng, FA_ELIMIT);
	fa_raw_ring_close(&extra);
	for (int i = 1; i < 6; i++)
		fa_client_close(c[i]);
	assert_true(fa_integ_wait_stat(c[0], NULL, "ring_open", 1, fa_test_ms(5000), NULL));
	fa_client_close(c[0]);
}

/* No ring object of pid left in /dev/shm. */
static bool no_objects_of(pid_t pid)
{
	char pat[96];
	glob_t g;
	snprintf(pat, sizeof pat, "/dev/shm/faring.%u.%d.*", (unsigned)getuid(), (int)pid);
	int rc = glob(pat, 0, NULL, &g);
	size_t n = rc == 0 ? g.gl_pathc : 0;
	globfree(&g);
	return n == 0;
}

static void test_ring_goes_with_a_killed_clients_session(void **state)
{
	(void)state;
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		fa_client *c = NULL;
		close(p[0]);
		if (fa_client_open(&c, g_d.url) != FA_OK || fa_ping(c) != FA_OK)
			_exit(2);
		char ch = 'R';
		fa_test_write_all(p[1], &ch, 1);
		pause();
		_exit(3);
	}
	close(p[1]);
	char ch = 0;
	assert_int_equal(read(p[0], &ch, 1), 1);
	close(p[0]);
	assert_false(no_objects_of(pid)); /* its ring is there */
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(5000);
	while (!no_objects_of(pid) && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(10);
	assert_true(no_objects_of(pid));
	assert_true(fa_integ_wait_stat(NULL, g_d.url, "ring_open", 1, fa_test_ms(5000), NULL));
}

/* Synchronous calls through a ring, N ms apart (the daemon's ring thread falls asleep between
 * them): every one answered; the ring thread wakes returned. */
static uint64_t paced_pings(const char *url, int n)
{
	fa_client *c = NULL;

	assert_int_equal(fa_client_open(&c, url), FA_OK);
	assert_true(fa_integ_stat(c, "ring_open") >= 1);
	uint64_t before = fa_integ_stat(c, "ring_thread_wakes");
	assert_true(before != UINT64_MAX);
	for (int i = 0; i < n; i++) {
		fa_test_sleep_ms(5);
		assert_int_equal(fa_ping(c), FA_OK);
	}
	uint64_t after = fa_integ_stat(c, "ring_thread_wakes");
	fa_client_close(c);
	return after - before;
}

/* --loop-spin-us (issue 12): a completion wakes the ring thread that fell asleep, so the
 * client's next entry finds it polling; with 0 nothing is woken (the old behaviour). */
static void test_ring_completion_wakes_a_sleeping_ring_thread(void **state)
{
	(void)state;
	struct fa_daemon on, off;

	memset(&on, 0, sizeof on);
	memset(&off, 0, sizeof off);
	/* the ring thread sleeps 1 us after an entry: asleep by the time the reply goes */
	if (daemon_start(&on, "--threads", "1", "--ring-spin-us", "1", "--loop-spin-us", "300",
	                 NULL) != 0) {
		daemon_log_dump(&on, 40);
		fail();
	}
	uint64_t woke = paced_pings(on.url, 30);
	printf("  --loop-spin-us 300: %llu ring thread wakes over 30 paced calls\n",
	       (unsigned long long)woke);
	assert_true(woke >= 10); /* a loaded machine may let a few wakes be missed: harmless */
	/* back to back: each entry comes while the loop polls after the last completion, so the
	 * ring thread queues it without a uv_async; none may be lost (5 s per call) */
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, on.url), FA_OK);
	fa_client_set_timeout(c, fa_test_ms(5000));
	uint64_t t0 = fa_test_now_ms(), polled0 = fa_integ_stat(c, "ring_polled");
	for (int i = 0; i < 2000; i++)
		assert_int_equal(fa_ping(c), FA_OK);
	uint64_t polled = fa_integ_stat(c, "ring_polled") - polled0;
	printf("  2000 back-to-back ring PINGs in %llu ms, %llu handed to the polling loop\n",
	       (unsigned long long)(fa_test_now_ms() - t0), (unsigned long long)polled);
	assert_true(polled > 0);
	fa_client_close(c);
	assert_int_equal(daemon_finish(&on), 0);
	if (daemon_start(&off, "--threads", "1", "--ring-spin-us", "1", "--loop-spin-us", "0",
	                 NULL) != 0) {
		daemon_log_dump(&off, 40);
		fail();
	}
	assert_int_equal(paced_pings(off.url, 10), 0);
	assert_int_equal(daemon_finish(&off), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ring_serves_calls_with_the_sockets_results),
		cmocka_unit_test(test_ring_serves_threads_of_one_client_at_once),
		cmocka_unit_test(test_ring_answers_garbage_and_other_sessions),
		cmocka_unit_test(test_ring_refuses_a_wrong_layout),
		cmocka_unit_test(test_ring_impossible_tail_closes_the_ring_not_the_session),
		cmocka_unit_test(test_ring_shrunk_object_does_not_kill_the_daemon),
		cmocka_unit_test(test_ring_limit_falls_back_to_the_socket),
		cmocka_unit_test(test_ring_goes_with_a_killed_clients_session),
		cmocka_unit_test(test_ring_completion_wakes_a_sleeping_ring_thread),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
