/* test_backend_cpu.c - the CPU backend on its own loop: results equal the reference (also when
 * a (batch, head) pair is cut into blocks of query rows, under every mask), a big request is
 * split over the workers, a small one queued behind a big one overtakes it (round-robin by
 * piece), cancelling finishes exactly the not-started jobs of an owner, stopping drops a started
 * job's remaining pieces, one owner holds at most its share of the workers, sessions take turns
 * and a high-priority job overtakes queued normal ones. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "fa_test.h"
#include "log.h"

struct rig {
	uv_loop_t loop;
	struct config cfg;
	struct backend *b;
	struct backend_job *done[16];
	unsigned ndone;
	bool closed;
};

static void on_done(struct backend_job *job, void *arg)
{
	struct rig *r = arg;
	assert_true(r->ndone < 16);
	r->done[r->ndone++] = job;
}

static void on_closed(void *arg)
{
	((struct rig *)arg)->closed = true;
}

static struct rig *rig_open(int threads)
{
	struct rig *r = calloc(1, sizeof(*r));
	char err[256], t[16];

	config_defaults(&r->cfg);
	snprintf(t, sizeof t, "%d", threads);
	assert_int_equal(config_set(&r->cfg, "threads", t, "test", err, sizeof err), FA_OK);
	assert_int_equal(uv_loop_init(&r->loop), 0);
	assert_int_equal(backend_open("cpu", &r->b, &r->loop, &r->cfg, on_done, r, err, sizeof err),
	                 FA_OK);
	assert_int_equal(r->b->threads, (unsigned)threads);
	return r;
}

/* Run the loop until n jobs came back, bounded. */
static void rig_wait(struct rig *r, unsigned n)
{
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(60000);
	while (r->ndone < n && fa_test_now_ms() < deadline)
		uv_run(&r->loop, UV_RUN_ONCE);
	assert_int_equal(r->ndone, n);
}

static void rig_close(struct rig *r)
{
	backend_close(r->b, on_closed, r);
	uv_run(&r->loop, UV_RUN_DEFAULT);
	assert_true(r->closed);
	assert_int_equal(uv_loop_close(&r->loop), 0);
	free(r);
}

/* A dense fp32 problem with its own buffers. */
struct problem {
	struct backend_job job;
	float *q, *k, *v, *o, *lse;
	atomic_int broken;
};

/* A dense fp32 problem with its own buffers: Q [B, Sq, Hq, D], K and V [B, Sk, Hkv, D]. */
static struct problem *problem_new_ex(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv,
                                      int64_t D, fa_mask mask, uint64_t seed, const void *owner)
{
	struct problem *p = calloc(1, sizeof(*p));
	size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Sk * Hkv * D);
	uint64_t st = seed;

	p->q = malloc(nq * 4);
	p->k = malloc(nk * 4);
	p->v = malloc(nk * 4);
	p->o = calloc(nq, 4);
	p->lse = calloc((size_t)(B * Hq * Sq), 4);
	fa_fill_f32(p->q, nq, &st, -1, 1);
	fa_fill_f32(p->k, nk, &st, -1, 1);
	fa_fill_f32(p->v, nk, &st, -1, 1);
	struct fa_attn_fwd_desc d = {
		.dtype = FA_DTYPE_FP32, .precision = FA_PREC_IEEE, .mask = mask,
		.scale = 1.0 / sqrt((double)D), .B = B, .Sq = Sq, .Sk = Sk, .Hq = Hq, .Hkv = Hkv,
		.D = D, .q_stride = {Sq * Hq * D, Hq * D, D}, .k_stride = {Sk * Hkv * D, Hkv * D, D},
		.v_stride = {Sk * Hkv * D, Hkv * D, D}, .o_stride = {Sq * Hq * D, Hq * D, D},
		.lse_stride = {Hq * Sq, Sq, 1},
	};
	p->job.desc = d;
	p->job.q = p->q;
	p->job.k = p->k;
	p->job.v = p->v;
	p->job.o = p->o;
	p->job.lse = p->lse;
	p->job.owner = owner;
	/* The real mappings are regions; here one "range" that covers nothing is enough. */
	p->job.ranges[0] = (struct backend_range){(char *)p->o, 0, &p->broken};
	p->job.nranges = 1;
	return p;
}

static struct problem *problem_new(int64_t B, int64_t S, int64_t H, int64_t D, uint64_t seed,
                                   const void *owner)
{
	return problem_new_ex(B, S, S, H, H, D, FA_MASK_NONE, seed, owner);
}

static void problem_check(struct problem *p)
{
	const struct fa_attn_fwd_desc *d = &p->job.desc;
	size_t n = (size_t)(d->B * d->Sq * d->Hq * d->D), nl = (size_t)(d->B * d->Hq * d->Sq);
	float *o = calloc(n, 4), *lse = calloc(nl, 4);

	if (p->job.status != FA_OK)
		fprintf(stderr, "job failed: %s: %s\n", fa_status_name(p->job.status), p->job.detail);
	assert_int_equal(p->job.status, FA_OK);
	assert_int_equal(fa_attn_fwd_ref(d, p->q, p->k, p->v, o, lse, 0, d->B * d->Hq), FA_OK);
	assert_memory_equal(o, p->o, n * 4);
	assert_memory_equal(lse, p->lse, nl * 4);
	free(o);
	free(lse);
}

static void problem_free(struct problem *p)
{
	free(p->q);
	free(p->k);
	free(p->v);
	free(p->o);
	free(p->lse);
	free(p);
}

static void test_backend_cpu_big_request_uses_every_worker(void **state)
{
	struct rig *r = rig_open(4);
	struct problem *big = problem_new(2, 128, 8, 64, 1, NULL);  /* 16 pairs, 1M MACs each */
	struct problem *small = problem_new(1, 4, 2, 8, 2, NULL);
	(void)state;

	assert_int_equal(backend_submit(r->b, &big->job), FA_OK);
	assert_int_equal(backend_submit(r->b, &small->job), FA_OK);
	/* Set before the job is queued and never changed after: safe to read here. */
	assert_true(big->job.piece_total >= 4 && big->job.piece_total <= 16);
	assert_true(small->job.piece_total == 1); /* not worth splitting */
	rig_wait(r, 2);
	problem_check(big);
	problem_check(small);
	assert_true(big->job.compute_ns > 0);
	problem_free(big);
	problem_free(small);
	rig_close(r);
}

static void test_backend_cpu_small_request_overtakes_a_big_one(void **state)
{
	struct rig *r = rig_open(1);
	struct problem *big = problem_new(1, 256, 8, 64, 3, NULL); /* 8 chunks on one worker */
	struct problem *small = problem_new(1, 8, 1, 8, 4, NULL);
	(void)state;

	assert_int_equal(backend_submit(r->b, &big->job), FA_OK);
	assert_int_equal(backend_submit(r->b, &small->job), FA_OK);
	assert_true(big->job.piece_total >= 2);
	rig_wait(r, 2);
	/* Round-robin by chunk: the small one ran after the big one's first chunk. */
	assert_ptr_equal(r->done[0], &small->job);
	assert_ptr_equal(r->done[1], &big->job);
	problem_check(big);
	problem_check(small);
	problem_free(big);
	problem_free(small);
	rig_close(r);
}

static void test_backend_cpu_cancel_finishes_only_unstarted_jobs_of_the_owner(void **state)
{
	struct rig *r = rig_open(1);
	int x, y;
	struct problem *a = problem_new(1, 1536, 1, 128, 5, &x); /* one chunk, long */
	struct problem *b = problem_new(1, 16, 1, 8, 6, &y);
	struct problem *c = problem_new(1, 16, 1, 8, 7, &x);
	struct problem *d = problem_new(1, 16, 1, 8, 8, &y);
	(void)state;

	assert_int_equal(backend_submit(r->b, &a->job), FA_OK);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (atomic_load(&r->b->running) != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	assert_int_equal(atomic_load(&r->b->running), 1);
	assert_int_equal(backend_submit(r->b, &b->job), FA_OK);
	assert_int_equal(backend_submit(r->b, &c->job), FA_OK);
	assert_int_equal(backend_submit(r->b, &d->job), FA_OK);
	assert_int_equal(backend_cancel(r->b, &x, "owner x went away"), 1); /* c, not running a */
	rig_wait(r, 1);
	assert_ptr_equal(r->done[0], &c->job);
	assert_int_equal(c->job.status, FA_ECLOSED);
	assert_string_equal(c->job.detail, "owner x went away");
	rig_wait(r, 4);
	problem_check(a);
	problem_check(b);
	problem_check(d);
	/* Everything else, at shutdown. */
	assert_int_equal(backend_cancel(r->b, NULL, "stopping"), 0);
	problem_free(a);
	problem_free(b);
	problem_free(c);
	problem_free(d);
	rig_close(r);
}

static void test_backend_cpu_close_hands_back_every_job(void **state)
{
	struct rig *r = rig_open(2);
	struct problem *p[4];
	(void)state;

	for (int i = 0; i < 4; i++) {
		p[i] = problem_new(1, 32, 2, 16, 10 + (uint64_t)i, NULL);
		assert_int_equal(backend_submit(r->b, &p[i]->job), FA_OK);
	}
	/* Closing right away: the queue is finished first, each job comes back once. */
	backend_close(r->b, on_closed, r);
	uv_run(&r->loop, UV_RUN_DEFAULT);
	assert_int_equal(r->ndone, 4);
	for (int i = 0; i < 4; i++) {
		problem_check(p[i]);
		problem_free(p[i]);
	}
	assert_true(r->closed);
	assert_int_equal(uv_loop_close(&r->loop), 0);
	free(r);
}

/* A pair bigger than a piece is cut into query-row blocks: the same bytes as one call of the
 * reference, for no mask, both causal alignments with Sq != Sk (a block straddling Sk under
 * top-left, blocks that see no key under bottom-right), and GQA. */
static void test_backend_cpu_row_blocks_equal_the_reference_under_every_mask(void **state)
{
	struct rig *r = rig_open(2);
	struct problem *p[4] = {
		problem_new_ex(1, 1024, 1024, 2, 1, 64, FA_MASK_NONE, 21, NULL),
		problem_new_ex(1, 1024, 1536, 1, 1, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 22, NULL),
		problem_new_ex(1, 1536, 700, 2, 2, 128, FA_MASK_CAUSAL_TOP_LEFT, 23, NULL),
		problem_new_ex(1, 4096, 1024, 1, 1, 256, FA_MASK_CAUSAL_BOTTOM_RIGHT, 24, NULL),
	};
	(void)state;

	for (int i = 0; i < 4; i++) {
		assert_int_equal(backend_submit(r->b, &p[i]->job), FA_OK);
		assert_true(p[i]->job.piece_row_blocks > 1); /* set at submit, never changed */
	}
	rig_wait(r, 4);
	for (int i = 0; i < 4; i++) {
		problem_check(p[i]);
		problem_free(p[i]);
	}
	rig_close(r);
}

/* ops.stop on a started job: no further piece starts, it comes back with the status and the
 * detail given, long before its work could have finished. */
static void test_backend_cpu_stop_drops_the_rest_of_a_started_job(void **state)
{
	struct rig *r = rig_open(1);
	int x;
	/* 4*4096*4096*128 FLOPs per head: about 34 pieces, seconds of one worker */
	struct problem *a = problem_new_ex(1, 4096, 4096, 1, 1, 128, FA_MASK_NONE, 31, &x);
	(void)state;

	assert_int_equal(backend_submit(r->b, &a->job), FA_OK);
	assert_true(a->job.piece_total >= 16);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (atomic_load(&r->b->running) != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	assert_int_equal(atomic_load(&r->b->running), 1);
	assert_int_equal(r->b->ops->stop(r->b, &x, FA_ECLOSED, "owner x is gone"), 1);
	rig_wait(r, 1);
	assert_int_equal(a->job.status, FA_ECLOSED);
	assert_string_equal(a->job.detail, "owner x is gone");
	assert_int_equal(atomic_load(&r->b->running), 0);
	/* stopping again finds nothing; a stopped job is handed back once */
	assert_int_equal(r->b->ops->stop(r->b, &x, FA_ECLOSED, "again"), 0);
	char text[1024] = "";
	r->b->ops->stats(r->b, text, sizeof text);
	uint64_t run = 0;
	const char *k = strstr(text, "cpu_pieces_run:");
	assert_non_null(k);
	run = strtoull(k + strlen("cpu_pieces_run:"), NULL, 10);
	assert_true(run < (uint64_t)a->job.piece_total); /* the rest never ran */
	problem_free(a);
	rig_close(r);
}

/* Two workers, a share of one: owner x's big job holds one worker, owner y's small job gets the
 * other and is back first. */
static void test_backend_cpu_an_owner_holds_at_most_its_share_of_the_workers(void **state)
{
	struct rig *r = rig_open(2);
	int x, y;
	struct problem *big = problem_new_ex(1, 2048, 2048, 2, 2, 128, FA_MASK_NONE, 41, &x);
	struct problem *small = problem_new(1, 256, 2, 64, 42, &y);
	(void)state;

	assert_int_equal(backend_submit(r->b, &big->job), FA_OK);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (atomic_load(&r->b->running) != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	assert_int_equal(backend_submit(r->b, &small->job), FA_OK);
	rig_wait(r, 2);
	assert_ptr_equal(r->done[0], &small->job);
	problem_check(big);
	problem_check(small);
	char text[1024] = "";
	r->b->ops->stats(r->b, text, sizeof text);
	assert_non_null(strstr(text, "session_workers:1\n"));
	problem_free(big);
	problem_free(small);
	rig_close(r);
}

/* One worker, busy with owner z's long job: owner x queues 8 jobs, then owner y one: y's runs
 * after at most one of x's (owners take turns), not after all eight. */
static void test_backend_cpu_a_flooding_owner_does_not_starve_another(void **state)
{
	struct rig *r = rig_open(1);
	int x, y, z;
	struct problem *flood[8], *other;
	struct problem *gate = problem_new_ex(1, 2048, 2048, 1, 1, 128, FA_MASK_NONE, 49, &z);
	(void)state;

	assert_int_equal(backend_submit(r->b, &gate->job), FA_OK);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (atomic_load(&r->b->running) != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	for (int i = 0; i < 8; i++) {
		flood[i] = problem_new(1, 512, 1, 64, 50 + (uint64_t)i, &x); /* ~10 ms each */
		assert_int_equal(backend_submit(r->b, &flood[i]->job), FA_OK);
	}
	other = problem_new(1, 512, 1, 64, 60, &y);
	assert_int_equal(backend_submit(r->b, &other->job), FA_OK);
	rig_wait(r, 10);
	unsigned at = 99, first_x = 99;
	for (unsigned i = 0; i < 10; i++) {
		if (r->done[i] == &other->job)
			at = i;
		if (first_x == 99 && r->done[i] != &gate->job && r->done[i] != &other->job)
			first_x = i;
	}
	if (at > first_x + 1)
		fprintf(stderr, "the other owner's job came back at position %u, x's first at %u\n",
		        at, first_x);
	assert_true(at <= first_x + 1);
	problem_check(gate);
	problem_free(gate);
	for (int i = 0; i < 8; i++) {
		problem_check(flood[i]);
		problem_free(flood[i]);
	}
	problem_check(other);
	problem_free(other);
	rig_close(r);
}

/* One worker busy with a big job; three normal jobs queued, then a high one: the high one is
 * back first, the queue time per class shows in the stats. */
static void test_backend_cpu_a_high_priority_job_overtakes_queued_normal_ones(void **state)
{
	struct rig *r = rig_open(1);
	int x, y, z;
	struct problem *big = problem_new_ex(1, 2048, 2048, 1, 1, 128, FA_MASK_NONE, 71, &x);
	struct problem *n[3], *hi;
	(void)state;

	assert_int_equal(backend_submit(r->b, &big->job), FA_OK);
	uint64_t deadline = fa_test_now_ms() + (uint64_t)fa_test_ms(10000);
	while (atomic_load(&r->b->running) != 1 && fa_test_now_ms() < deadline)
		fa_test_sleep_ms(1);
	for (int i = 0; i < 3; i++) {
		n[i] = problem_new(1, 256, 1, 64, 72 + (uint64_t)i, &y);
		assert_int_equal(backend_submit(r->b, &n[i]->job), FA_OK);
	}
	hi = problem_new(1, 256, 1, 64, 76, &z);
	hi->job.priority = FA_PRIORITY_HIGH;
	assert_int_equal(backend_submit(r->b, &hi->job), FA_OK);
	rig_wait(r, 5);
	assert_ptr_equal(r->done[0], &hi->job);
	assert_ptr_equal(r->done[4], &big->job);
	char text[2048] = "";
	r->b->ops->stats(r->b, text, sizeof text);
	assert_non_null(strstr(text, "queue_high_started:1\n"));
	assert_non_null(strstr(text, "queue_normal_started:4\n"));
	assert_non_null(strstr(text, "queue_high_wait_us_total:"));
	problem_check(big);
	problem_check(hi);
	problem_free(big);
	problem_free(hi);
	for (int i = 0; i < 3; i++) {
		problem_check(n[i]);
		problem_free(n[i]);
	}
	rig_close(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backend_cpu_big_request_uses_every_worker),
		cmocka_unit_test(test_backend_cpu_small_request_overtakes_a_big_one),
		cmocka_unit_test(test_backend_cpu_cancel_finishes_only_unstarted_jobs_of_the_owner),
		cmocka_unit_test(test_backend_cpu_close_hands_back_every_job),
		cmocka_unit_test(test_backend_cpu_row_blocks_equal_the_reference_under_every_mask),
		cmocka_unit_test(test_backend_cpu_stop_drops_the_rest_of_a_started_job),
		cmocka_unit_test(test_backend_cpu_an_owner_holds_at_most_its_share_of_the_workers),
		cmocka_unit_test(test_backend_cpu_a_flooding_owner_does_not_starve_another),
		cmocka_unit_test(test_backend_cpu_a_high_priority_job_overtakes_queued_normal_ones),
	};
	log_level = FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
