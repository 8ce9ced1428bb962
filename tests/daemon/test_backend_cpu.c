/* test_backend_cpu.c - the CPU backend on its own loop: results equal the reference, a big
 * request is split over the workers, a small one queued behind a big one overtakes it
 * (round-robin by chunk), and cancelling finishes exactly the not-started jobs of an owner. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

static struct problem *problem_new(int64_t B, int64_t S, int64_t H, int64_t D, uint64_t seed,
                                   const void *owner)
{
	struct problem *p = calloc(1, sizeof(*p));
	size_t n = (size_t)(B * S * H * D);
	uint64_t st = seed;

	p->q = malloc(n * 4);
	p->k = malloc(n * 4);
	p->v = malloc(n * 4);
	p->o = calloc(n, 4);
	p->lse = calloc((size_t)(B * H * S), 4);
	fa_fill_f32(p->q, n, &st, -1, 1);
	fa_fill_f32(p->k, n, &st, -1, 1);
	fa_fill_f32(p->v, n, &st, -1, 1);
	struct fa_attn_fwd_desc d = {
		.dtype = FA_DTYPE_FP32, .precision = FA_PREC_IEEE, .mask = FA_MASK_NONE,
		.scale = 1.0 / sqrt((double)D), .B = B, .Sq = S, .Sk = S, .Hq = H, .Hkv = H, .D = D,
		.q_stride = {S * H * D, H * D, D}, .k_stride = {S * H * D, H * D, D},
		.v_stride = {S * H * D, H * D, D}, .o_stride = {S * H * D, H * D, D},
		.lse_stride = {H * S, S, 1},
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

static void problem_check(struct problem *p)
{
	const struct fa_attn_fwd_desc *d = &p->job.desc;
	size_t n = (size_t)(d->B * d->Sq * d->Hq * d->D), nl = (size_t)(d->B * d->Hq * d->Sq);
	float *o = calloc(n, 4), *lse = calloc(nl, 4);

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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backend_cpu_big_request_uses_every_worker),
		cmocka_unit_test(test_backend_cpu_small_request_overtakes_a_big_one),
		cmocka_unit_test(test_backend_cpu_cancel_finishes_only_unstarted_jobs_of_the_owner),
		cmocka_unit_test(test_backend_cpu_close_hands_back_every_job),
	};
	log_level = FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
