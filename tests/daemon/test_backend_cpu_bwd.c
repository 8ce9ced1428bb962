/* test_backend_cpu_bwd.c - the backward pass on the CPU backend (backend_cpu_bwd.c): a job is
 * cut into (batch, kv-head) pairs, spread over the workers, and gives exactly the bits of one
 * fa_attn_bwd_ref call over everything, whatever the number of workers; a forward and a backward
 * job share the queue. */
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
	struct backend_job *done[8];
	unsigned ndone;
	bool closed;
};

static void on_done(struct backend_job *job, void *arg)
{
	struct rig *r = arg;
	assert_true(r->ndone < 8);
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
	return r;
}

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

/* A dense fp32 backward problem (BSHD, GQA Hq/Hkv, causal bottom-right, Sq != Sk) with its own
 * buffers: q, k, v, dout random, o and lse from the forward reference, dq, dk, dv zeroed. */
struct problem {
	struct backend_job job;
	float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
	size_t nq, nk;
	atomic_int broken;
};

static struct problem *problem_new(int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv,
                                   int64_t D, uint64_t seed)
{
	struct problem *p = calloc(1, sizeof(*p));
	uint64_t st = seed;
	p->nq = (size_t)(B * Sq * Hq * D);
	p->nk = (size_t)(B * Sk * Hkv * D);
	p->q = malloc(p->nq * 4);
	p->o = malloc(p->nq * 4);
	p->dout = malloc(p->nq * 4);
	p->dq = calloc(p->nq, 4);
	p->k = malloc(p->nk * 4);
	p->v = malloc(p->nk * 4);
	p->dk = calloc(p->nk, 4);
	p->dv = calloc(p->nk, 4);
	p->lse = malloc((size_t)(B * Hq * Sq) * 4);
	fa_fill_f32(p->q, p->nq, &st, -1, 1);
	fa_fill_f32(p->k, p->nk, &st, -1, 1);
	fa_fill_f32(p->v, p->nk, &st, -1, 1);
	fa_fill_f32(p->dout, p->nq, &st, -1, 1);
	struct fa_attn_bwd_desc d = {
		.fwd = {.dtype = FA_DTYPE_FP32, .precision = FA_PREC_IEEE,
		        .mask = FA_MASK_CAUSAL_BOTTOM_RIGHT, .scale = 1.0 / sqrt((double)D), .B = B,
		        .Sq = Sq, .Sk = Sk, .Hq = Hq, .Hkv = Hkv, .D = D,
		        .q_stride = {Sq * Hq * D, Hq * D, D}, .k_stride = {Sk * Hkv * D, Hkv * D, D},
		        .v_stride = {Sk * Hkv * D, Hkv * D, D}, .o_stride = {Sq * Hq * D, Hq * D, D},
		        .lse_stride = {Hq * Sq, Sq, 1}},
		.do_stride = {Sq * Hq * D, Hq * D, D},
		.dq_stride = {Sq * Hq * D, Hq * D, D},
		.dk_stride = {Sk * Hkv * D, Hkv * D, D},
		.dv_stride = {Sk * Hkv * D, Hkv * D, D},
	};
	assert_int_equal(fa_attn_fwd_ref(&d.fwd, p->q, p->k, p->v, p->o, p->lse, 0, B * Hq), FA_OK);
	p->job.is_bwd = true;
	p->job.desc = d.fwd;
	p->job.bwd.desc = d;
	p->job.q = p->q;
	p->job.k = p->k;
	p->job.v = p->v;
	p->job.o = p->o;
	p->job.lse = p->lse;
	p->job.bwd.dout = p->dout;
	p->job.bwd.dq = p->dq;
	p->job.bwd.dk = p->dk;
	p->job.bwd.dv = p->dv;
	p->job.ranges[0] = (struct backend_range){(char *)p->dq, 0, &p->broken};
	p->job.nranges = 1;
	return p;
}

/* The backend's gradients are one reference call's, bit for bit. */
static void problem_check(struct problem *p)
{
	const struct fa_attn_bwd_desc *d = &p->job.bwd.desc;
	float *dq = calloc(p->nq, 4), *dk = calloc(p->nk, 4), *dv = calloc(p->nk, 4);

	assert_int_equal(p->job.status, FA_OK);
	assert_int_equal(fa_attn_bwd_ref(d, p->q, p->k, p->v, p->o, p->dout, p->lse, dq, dk, dv, 0,
	                                 d->fwd.B * d->fwd.Hkv),
	                 FA_OK);
	assert_memory_equal(dq, p->dq, p->nq * 4);
	assert_memory_equal(dk, p->dk, p->nk * 4);
	assert_memory_equal(dv, p->dv, p->nk * 4);
	free(dq);
	free(dk);
	free(dv);
}

static void problem_free(struct problem *p)
{
	free(p->q);
	free(p->k);
	free(p->v);
	free(p->o);
	free(p->lse);
	free(p->dout);
	free(p->dq);
	free(p->dk);
	free(p->dv);
	free(p);
}

/* B=2, Hkv=4: 8 (batch, kv-head) pairs of ~2.5M multiply-adds each, cut over 4 workers. */
static void test_backend_cpu_bwd_splits_by_kv_head_and_matches_one_reference_call(void **state)
{
	(void)state;
	for (int threads = 1; threads <= 4; threads += 3) {
		struct rig *r = rig_open(threads);
		struct problem *p = problem_new(2, 96, 80, 8, 4, 64, 11);
		assert_int_equal(backend_submit(r->b, &p->job), FA_OK);
		assert_true(p->job.bh_total == 8);
		if (threads == 4)
			assert_true((p->job.bh_total + p->job.bh_chunk - 1) / p->job.bh_chunk >= 4);
		rig_wait(r, 1);
		problem_check(p);
		assert_true(p->job.compute_ns > 0);
		problem_free(p);
		rig_close(r);
	}
}

/* A small MQA backward (one pair: not split) and a forward job on one queue. */
static void test_backend_cpu_bwd_and_fwd_jobs_share_the_queue(void **state)
{
	(void)state;
	struct rig *r = rig_open(2);
	struct problem *b = problem_new(1, 7, 13, 3, 1, 16, 12);
	struct problem *f = problem_new(1, 5, 5, 2, 2, 8, 13);
	size_t no = f->nq;
	float *o_want = malloc(no * 4);
	memcpy(o_want, f->o, no * 4);
	/* f as a forward job: it writes o again (into dq's buffer), which must equal the reference */
	f->job.is_bwd = false;
	f->job.o = f->dq;
	f->job.lse = calloc((size_t)(1 * 2 * 5), 4);
	assert_int_equal(backend_submit(r->b, &b->job), FA_OK);
	assert_int_equal(backend_submit(r->b, &f->job), FA_OK);
	assert_true(b->job.bh_total == 1);
	rig_wait(r, 2);
	problem_check(b);
	assert_int_equal(f->job.status, FA_OK);
	assert_memory_equal(o_want, f->dq, no * 4);
	free(f->job.lse);
	free(o_want);
	problem_free(b);
	problem_free(f);
	rig_close(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_backend_cpu_bwd_splits_by_kv_head_and_matches_one_reference_call),
		cmocka_unit_test(test_backend_cpu_bwd_and_fwd_jobs_share_the_queue),
	};
	log_level = FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
