/* test_gpu_queue.c - the GPU backend's queues without a GPU (daemon/gpu/gpu_queue.c, through
 * gpu_int.h): which jobs a worker takes as one batch and in what order, what cancellation takes
 * (only the owner's jobs not started, queued or waiting for a compile) and with which status,
 * what the fatal path does to every queue, and the done list's drain (backend.c) that hands them
 * back. A backend is built by hand: devices without contexts, a real uv_async on its own loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fault.h"
#include "backend_infer.h"
#include "gpu/gpu_int.h"

#define FATAL_QUEUED "the GPU faulted while serving an earlier request; the daemon restarts " \
                     "with a clean context"
#define FATAL_ASYNC "the GPU faulted while this asynchronous request ran or waited; its " \
                    "output is undefined"

static int owner_a, owner_b;

struct fixture {
	uv_loop_t loop;
	struct gpu_backend *b;
};

static void async_cb_unused(uv_async_t *h)
{
	(void)h;
}

/* Two devices, no CUDA: only what the queue code touches. */
static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof *f);
	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	f->b = calloc(1, sizeof *f->b);
	assert_non_null(f->b);
	pthread_mutex_init(&f->b->mu, NULL);
	compile_table_init(&f->b->waiting);
	assert_int_equal(uv_async_init(&f->loop, &f->b->async, async_cb_unused), 0);
	f->b->ndevs = 2;
	for (unsigned i = 0; i < f->b->ndevs; i++) {
		f->b->devs[i].b = f->b;
		f->b->devs[i].ordinal = (int)i;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	uv_close((uv_handle_t *)&f->b->async, NULL);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	compile_table_fini(&f->b->waiting);
	for (unsigned i = 0; i < f->b->ndevs; i++)
		runq_fini(&f->b->devs[i].queue); /* jobs a test left queued: their queue nodes */
	pthread_mutex_destroy(&f->b->mu);
	free(f->b);
	free(f);
	return 0;
}

/* A synchronous job of owner whose q, k, v, o are device memory (no lse). */
static void job_device(struct backend_job *j, const void *owner)
{
	memset(j, 0, sizeof *j);
	j->owner = owner;
	for (int i = 0; i < 4; i++)
		j->on_device[i] = true;
}

/* A synchronous job of owner whose tensors are host memory (staged through the scratch). */
static void job_host(struct backend_job *j, const void *owner)
{
	memset(j, 0, sizeof *j);
	j->owner = owner;
}

/* An asynchronous job of owner on device memory. */
static void job_async(struct backend_job *j, const void *owner)
{
	job_device(j, owner);
	j->async = true;
}

static void queue(struct gpu_backend *b, unsigned dev, struct backend_job *j)
{
	pthread_mutex_lock(&b->mu);
	gpu_queue_locked(&b->devs[dev], j);
	pthread_mutex_unlock(&b->mu);
}

static unsigned take(struct gpu_backend *b, unsigned dev, struct backend_job **out)
{
	pthread_mutex_lock(&b->mu);
	unsigned n = gpu_take_batch_locked(&b->devs[dev], out);
	pthread_mutex_unlock(&b->mu);
	return n;
}

/* The done list as an array, in order; returns its length. */
static unsigned done_list(const struct gpu_backend *b, struct backend_job **out, unsigned cap)
{
	unsigned n = 0;
	for (struct backend_job *j = b->done_list.head; j != NULL && n < cap; j = j->next)
		out[n++] = j;
	return n;
}

static void test_gpu_queue_takes_at_most_eight_device_jobs_in_queue_order(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[10], *batch[GPU_PIPE];

	for (int i = 0; i < 10; i++) {
		job_device(&j[i], &owner_a);
		queue(f->b, 0, &j[i]);
	}
	assert_int_equal(atomic_load(&f->b->devs[0].pushes), 10);
	assert_int_equal(take(f->b, 0, batch), 8);
	for (int i = 0; i < 8; i++) {
		assert_ptr_equal(batch[i], &j[i]);
		assert_null(batch[i]->next);
	}
	assert_int_equal(take(f->b, 0, batch), 2);
	assert_ptr_equal(batch[0], &j[8]);
	assert_ptr_equal(batch[1], &j[9]);
	assert_int_equal(take(f->b, 0, batch), 0);
	assert_int_equal(runq_len(&f->b->devs[0].queue), 0);
	assert_int_equal(runq_len(&f->b->devs[0].queue), 0);
}

static void test_gpu_queue_ends_a_batch_with_its_one_host_staging_job(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[5], *batch[GPU_PIPE];

	job_device(&j[0], &owner_a);
	job_device(&j[1], &owner_a);
	job_host(&j[2], &owner_a);
	job_device(&j[3], &owner_a);
	job_host(&j[4], &owner_a);
	for (int i = 0; i < 5; i++)
		queue(f->b, 0, &j[i]);
	assert_int_equal(take(f->b, 0, batch), 3);
	assert_ptr_equal(batch[0], &j[0]);
	assert_ptr_equal(batch[1], &j[1]);
	assert_ptr_equal(batch[2], &j[2]);
	assert_int_equal(take(f->b, 0, batch), 2);
	assert_ptr_equal(batch[0], &j[3]);
	assert_ptr_equal(batch[1], &j[4]);
	assert_int_equal(take(f->b, 0, batch), 0);
}

static void test_gpu_queue_takes_a_host_staging_job_at_the_head_alone(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[3], *batch[GPU_PIPE];

	job_host(&j[0], &owner_a);
	job_host(&j[1], &owner_b);
	job_device(&j[2], &owner_a);
	for (int i = 0; i < 3; i++)
		queue(f->b, 1, &j[i]);
	assert_int_equal(take(f->b, 1, batch), 1);
	assert_ptr_equal(batch[0], &j[0]);
	assert_int_equal(take(f->b, 1, batch), 1);
	assert_ptr_equal(batch[0], &j[1]);
	assert_int_equal(take(f->b, 1, batch), 1);
	assert_ptr_equal(batch[0], &j[2]);
}

static void test_gpu_queue_takes_an_asynchronous_job_alone_and_stops_before_one(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[4], *batch[GPU_PIPE];

	job_device(&j[0], &owner_a);
	job_async(&j[1], &owner_b);
	job_async(&j[2], &owner_b);
	job_device(&j[3], &owner_a);
	for (int i = 0; i < 4; i++)
		queue(f->b, 0, &j[i]);
	assert_int_equal(take(f->b, 0, batch), 1); /* the synchronous job, not the async behind */
	assert_ptr_equal(batch[0], &j[0]);
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[1]);
	/* the owners take turns (runq.h): a's j[3] before b's second asynchronous job */
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[3]);
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[2]);
}

static void test_gpu_queue_counts_a_host_lse_as_staging_and_no_lse_as_none(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[4], *batch[GPU_PIPE];
	float lse;

	job_device(&j[0], &owner_a); /* lse NULL: on_device[4] does not matter */
	job_device(&j[1], &owner_a);
	job_device(&j[2], &owner_a);
	j[2].lse = &lse;             /* wanted, in host memory: staged */
	job_device(&j[3], &owner_a);
	for (int i = 0; i < 4; i++)
		queue(f->b, 0, &j[i]);
	assert_false(gpu_job_stages_host(&j[0]));
	assert_true(gpu_job_stages_host(&j[2]));
	assert_int_equal(take(f->b, 0, batch), 3);
	assert_ptr_equal(batch[2], &j[2]);
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[3]);
}

static void test_gpu_cancel_takes_only_the_owners_queued_jobs_on_every_device(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[6], *done[8], *batch[GPU_PIPE];

	job_device(&j[0], &owner_a);
	job_device(&j[1], &owner_b);
	job_host(&j[2], &owner_a);
	queue(f->b, 0, &j[0]);
	queue(f->b, 0, &j[1]);
	queue(f->b, 0, &j[2]);
	job_device(&j[3], &owner_b);
	job_async(&j[4], &owner_a);
	queue(f->b, 1, &j[3]);
	queue(f->b, 1, &j[4]);

	assert_int_equal(gpu_cancel(&f->b->base, &owner_a, FA_ECLOSED, "the session ended"), 3);
	assert_int_equal(done_list(f->b, done, 8), 3);
	assert_ptr_equal(done[0], &j[0]); /* device 0's, in order, then device 1's */
	assert_ptr_equal(done[1], &j[2]);
	assert_ptr_equal(done[2], &j[4]);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(done[i]->status, FA_ECLOSED);
		assert_string_equal(done[i]->detail, "the session ended");
	}
	assert_int_equal(j[1].status, FA_OK);
	assert_string_equal(j[1].detail, "");
	/* the other owner's jobs stay queued, and the tails are right: a new job goes behind */
	assert_int_equal(runq_len(&f->b->devs[0].queue), 1);
	assert_ptr_equal(runq_peek(&f->b->devs[0].queue, NULL, NULL), &j[1]);
	assert_int_equal(runq_len(&f->b->devs[1].queue), 1);
	assert_ptr_equal(runq_peek(&f->b->devs[1].queue, NULL, NULL), &j[3]);
	job_device(&j[5], &owner_b);
	queue(f->b, 0, &j[5]);
	assert_int_equal(take(f->b, 0, batch), 2);
	assert_ptr_equal(batch[0], &j[1]);
	assert_ptr_equal(batch[1], &j[5]);
	assert_int_equal(gpu_cancel(&f->b->base, &owner_a, FA_ECLOSED, "again"), 0);
}

static void test_gpu_cancel_leaves_a_batch_a_worker_took_alone(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[3], *batch[GPU_PIPE];

	for (int i = 0; i < 3; i++) {
		job_device(&j[i], &owner_a);
		queue(f->b, 0, &j[i]);
	}
	assert_int_equal(take(f->b, 0, batch), 3);
	assert_int_equal(gpu_cancel(&f->b->base, &owner_a, FA_ECLOSED, "the session ended"), 0);
	assert_null(f->b->done_list.head);
	for (int i = 0; i < 3; i++)
		assert_int_equal(j[i].status, FA_OK);
}

static void test_gpu_cancel_answers_the_owners_compile_waiting_jobs_and_keeps_the_others(
    void **state)
{
	struct fixture *f = *state;
	struct backend_job j[3], *done[4];
	bool is_new;

	job_device(&j[0], &owner_a);
	job_device(&j[1], &owner_b);
	job_device(&j[2], &owner_a);
	assert_int_equal(compile_table_add(&f->b->waiting, "g0/d64", &j[0], &is_new), FA_OK);
	assert_int_equal(compile_table_add(&f->b->waiting, "g0/d64", &j[1], &is_new), FA_OK);
	assert_int_equal(compile_table_add(&f->b->waiting, "g0/d128", &j[2], &is_new), FA_OK);

	pthread_mutex_lock(&f->b->mu);
	unsigned n = gpu_fail_waiting_locked(f->b, &owner_a, FA_ECLOSED, "the session ended");
	pthread_mutex_unlock(&f->b->mu);
	assert_int_equal(n, 2);
	assert_int_equal(done_list(f->b, done, 4), 2);
	assert_ptr_equal(done[0], &j[0]);
	assert_ptr_equal(done[1], &j[2]);
	assert_int_equal(j[0].status, FA_ECLOSED);
	assert_string_equal(j[2].detail, "the session ended");
	assert_int_equal(f->b->waiting.jobs, 1);
	assert_int_equal(f->b->waiting.entries, 1);
	assert_int_equal(j[1].status, FA_OK);

	/* the owner's cancel through the ops takes the other owner's waiting job as well */
	assert_int_equal(gpu_cancel(&f->b->base, &owner_b, FA_ECLOSED, "bye"), 1);
	assert_int_equal(done_list(f->b, done, 4), 3);
	assert_ptr_equal(done[2], &j[1]);
	assert_int_equal(f->b->waiting.jobs, 0);
	assert_int_equal(f->b->waiting.entries, 0);
}

static void test_gpu_cancel_of_nobody_takes_queued_then_compile_waiting_jobs(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[4], *done[5];
	bool is_new;

	job_device(&j[0], &owner_a);
	job_device(&j[1], &owner_b);
	queue(f->b, 1, &j[0]);
	queue(f->b, 0, &j[1]);
	job_device(&j[2], &owner_b);
	job_device(&j[3], &owner_a);
	assert_int_equal(compile_table_add(&f->b->waiting, "g1/d64", &j[2], &is_new), FA_OK);
	assert_int_equal(compile_table_add(&f->b->waiting, "g1/d64", &j[3], &is_new), FA_OK);

	assert_int_equal(gpu_cancel(&f->b->base, NULL, FA_EDEVICE, "lost"), 4);
	assert_int_equal(done_list(f->b, done, 5), 4);
	assert_ptr_equal(done[0], &j[1]); /* device 0, device 1, then the compile table */
	assert_ptr_equal(done[1], &j[0]);
	assert_ptr_equal(done[2], &j[2]);
	assert_ptr_equal(done[3], &j[3]);
	for (int i = 0; i < 4; i++)
		assert_int_equal(done[i]->status, FA_EDEVICE);
	assert_int_equal(runq_len(&f->b->devs[0].queue), 0);
	assert_int_equal(runq_len(&f->b->devs[1].queue), 0);
	assert_int_equal(f->b->waiting.jobs, 0);
}

static void test_gpu_job_done_counts_ok_and_failed_jobs_and_marks_no_fault(
    void **state)
{
	struct fixture *f = *state;
	struct backend_job j[2], *done[3];

	job_device(&j[0], &owner_a);
	job_device(&j[1], &owner_a);
	j[1].status = FA_EINVAL;
	pthread_mutex_lock(&f->b->mu);
	gpu_job_done_locked(f->b, &j[0], false);
	gpu_job_done_locked(f->b, &j[1], false);
	pthread_mutex_unlock(&f->b->mu);
	assert_int_equal(f->b->fwd_ok, 1);
	assert_int_equal(f->b->fwd_failed, 1);
	assert_int_equal(done_list(f->b, done, 3), 2);
	assert_ptr_equal(done[0], &j[0]);
	assert_ptr_equal(done[1], &j[1]);
	assert_true(j[0].t_done != 0);
	assert_false(fault_marked(&f->b->base));
}

static void test_gpu_fatal_fails_every_queue_with_edevice_and_marks_the_fault(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[6], *done[8];
	struct gpu_ticket t[2];
	bool is_new;

	job_device(&j[0], &owner_a);
	job_host(&j[1], &owner_b);
	queue(f->b, 0, &j[0]);
	queue(f->b, 1, &j[1]);
	job_device(&j[2], &owner_a);
	assert_int_equal(compile_table_add(&f->b->waiting, "g0/d64", &j[2], &is_new), FA_OK);
	/* two asynchronous kernels in flight: one reply delivered already, one not yet */
	job_async(&j[3], &owner_a);
	job_async(&j[4], &owner_b);
	j[3].enqueued = j[4].enqueued = true;
	j[3].reply_delivered = true;
	memset(t, 0, sizeof t);
	t[0].b = t[1].b = f->b;
	t[0].job = &j[3];
	t[1].job = &j[4];
	t[0].next = &t[1];
	t[1].prev = &t[0];
	f->b->tickets = &t[0];
	f->b->ntickets = 2;
	/* the faulting job itself, handed back sticky */
	job_device(&j[5], &owner_b);
	j[5].status = FA_EDEVICE;
	snprintf(j[5].detail, sizeof j[5].detail, "running attention on GPU 0: CUDA error 700");

	pthread_mutex_lock(&f->b->mu);
	gpu_job_done_locked(f->b, &j[5], true);
	pthread_mutex_unlock(&f->b->mu);

	assert_true(fault_marked(&f->b->base));
	assert_string_equal(fault_why(&f->b->base), "running attention on GPU 0: CUDA error 700");
	assert_int_equal(f->b->fwd_failed, 1);
	assert_int_equal(done_list(f->b, done, 8), 5);
	assert_ptr_equal(done[0], &j[5]);
	assert_ptr_equal(done[1], &j[0]);
	assert_ptr_equal(done[2], &j[1]);
	assert_ptr_equal(done[3], &j[2]);
	assert_ptr_equal(done[4], &j[3]);
	for (int i = 1; i < 4; i++) {
		assert_int_equal(done[i]->status, FA_EDEVICE);
		assert_string_equal(done[i]->detail, FATAL_QUEUED);
	}
	/* the delivered one's second hand-back is now; the other's follows its reply */
	assert_int_equal(j[3].status, FA_EDEVICE);
	assert_string_equal(j[3].detail, FATAL_ASYNC);
	assert_false(j[3].enqueued);
	assert_true(j[3].kernel_done);
	assert_int_equal(j[4].status, FA_EDEVICE);
	assert_string_equal(j[4].detail, FATAL_ASYNC);
	assert_true(j[4].enqueued);
	assert_true(j[4].kernel_done);
	assert_true(t[0].abandoned);
	assert_true(t[1].abandoned);
	assert_null(t[0].job);
	assert_null(t[1].job);
	assert_null(f->b->tickets);
	assert_int_equal(f->b->ntickets, 0);
	assert_int_equal(runq_len(&f->b->devs[0].queue), 0);
	assert_int_equal(runq_len(&f->b->devs[0].queue), 0);
	assert_int_equal(runq_len(&f->b->devs[1].queue), 0);
	assert_int_equal(f->b->waiting.jobs, 0);

	/* a second fault keeps the first why */
	pthread_mutex_lock(&f->b->mu);
	gpu_fatal_locked(f->b, "another");
	pthread_mutex_unlock(&f->b->mu);
	assert_string_equal(fault_why(&f->b->base), "running attention on GPU 0: CUDA error 700");
}

struct recorder {
	struct backend_job *seen[8];
	bool next_cleared[8];
	unsigned n;
};

static void record(struct backend_job *job, void *arg)
{
	struct recorder *r = arg;
	r->next_cleared[r->n] = job->next == NULL;
	r->seen[r->n++] = job;
}

static void test_backend_done_drain_hands_jobs_back_in_order_with_next_cleared(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[3];
	struct recorder r = {0};

	for (int i = 0; i < 3; i++) {
		job_device(&j[i], &owner_a);
		queue(f->b, 0, &j[i]);
	}
	assert_int_equal(gpu_cancel(&f->b->base, NULL, FA_ECLOSED, "shutting down"), 3);
	backend_done_drain(&f->b->done_list, &f->b->mu, record, &r);
	assert_int_equal(r.n, 3);
	for (unsigned i = 0; i < 3; i++) {
		assert_ptr_equal(r.seen[i], &j[i]);
		assert_true(r.next_cleared[i]);
	}
	assert_null(f->b->done_list.head);
	assert_null(f->b->done_list.tail);
	backend_done_drain(&f->b->done_list, &f->b->mu, record, &r); /* empty: nothing */
	assert_int_equal(r.n, 3);
}

/* A descriptor of a dense BSHD problem. */
static void desc_dense(struct fa_attn_fwd_desc *d, int64_t B, int64_t S, int64_t Hq, int64_t Hkv,
                       int64_t D)
{
	memset(d, 0, sizeof *d);
	d->dtype = FA_DTYPE_BF16;
	d->scale = 0.125;
	d->B = B;
	d->Sq = d->Sk = S;
	d->Hq = Hq;
	d->Hkv = Hkv;
	d->D = D;
	int64_t qs[3] = {S * Hq * D, Hq * D, D}, ks[3] = {S * Hkv * D, Hkv * D, D};
	memcpy(d->q_stride, qs, sizeof qs);
	memcpy(d->o_stride, qs, sizeof qs);
	memcpy(d->k_stride, ks, sizeof ks);
	memcpy(d->v_stride, ks, sizeof ks);
	int64_t ls[3] = {Hq * S, S, 1};
	memcpy(d->lse_stride, ls, sizeof ls);
}

/* Every (batch, query head) pair of a split job is in exactly one launch, a launch's K/V heads
 * are its query heads' groups, and each launch is at most GPU_PIECE_FLOP where a group fits. */
static void test_gpu_split_covers_every_pair_once_in_whole_groups(void **state)
{
	static const int64_t shapes[][5] = {
		{1, 128, 16, 16, 128},    /* small: one launch */
		{16, 8192, 32, 8, 128},   /* batches per launch */
		{1, 65536, 32, 8, 128},   /* groups of one batch per launch */
		{2, 131072, 8, 1, 128},   /* MQA: one group above a piece runs whole */
	};
	(void)state;
	for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
		struct backend_job j;
		struct fa_attn_fwd_desc sub;
		uint64_t off[5];
		const int64_t *sh = shapes[c];
		memset(&j, 0, sizeof j);
		desc_dense(&j.desc, sh[0], sh[1], sh[2], sh[3], sh[4]);
		gpu_split_plan(&j);
		assert_true(j.piece_total >= 1);
		if (c == 0)
			assert_int_equal(j.piece_total, 1);
		else
			assert_true(j.piece_total > 1);
		int64_t B = j.desc.B, Hq = j.desc.Hq, g = Hq / j.desc.Hkv;
		unsigned char *seen = calloc((size_t)(B * Hq), 1);
		for (int64_t k = 0; k < j.piece_total; k++) {
			gpu_split_piece(&j, k, &sub, off);
			assert_int_equal(sub.Hq % sub.Hkv, 0);
			assert_int_equal(sub.Hq / sub.Hkv, g);
			int64_t es = 2;
			int64_t b0 = (int64_t)off[0] / es / j.desc.q_stride[0];
			int64_t h0 = ((int64_t)off[0] / es % j.desc.q_stride[0]) / j.desc.q_stride[2];
			assert_int_equal(off[1], (uint64_t)((b0 * j.desc.k_stride[0] +
			                                     h0 / g * j.desc.k_stride[2]) * es));
			assert_int_equal(off[4], (uint64_t)((b0 * j.desc.lse_stride[0] +
			                                     h0 * j.desc.lse_stride[1]) * 4));
			for (int64_t b = b0; b < b0 + sub.B; b++)
				for (int64_t h = h0; h < h0 + sub.Hq; h++) {
					assert_int_equal(seen[b * Hq + h], 0);
					seen[b * Hq + h] = 1;
				}
			double f = 4.0 * (double)sub.B * (double)sub.Hq * (double)sub.Sq *
			           (double)sub.Sk * (double)sub.D;
			if (sub.Hq > g || sub.B > 1)
				assert_true(f <= GPU_PIECE_FLOP);
		}
		for (int64_t i = 0; i < B * Hq; i++)
			assert_int_equal(seen[i], 1);
		free(seen);
	}
}

/* A split job is taken alone; a batch of small jobs stops at GPU_PIECE_FLOP; gpu_stop tells
 * only the owner's jobs of the batch on the worker, once. */
static void test_gpu_queue_takes_a_split_job_alone_and_stop_tells_the_running_batch(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[4], *batch[GPU_PIPE];

	for (int i = 0; i < 4; i++)
		job_device(&j[i], i == 1 ? &owner_b : &owner_a);
	desc_dense(&j[0].desc, 1, 16384, 32, 8, 128); /* 4.4 TFLOP: over a piece alone */
	desc_dense(&j[1].desc, 1, 16384, 8, 8, 128);  /* 1.1 TFLOP each */
	desc_dense(&j[2].desc, 1, 16384, 8, 8, 128);
	desc_dense(&j[3].desc, 1, 16384, 8, 8, 128);
	for (int i = 0; i < 4; i++) {
		gpu_split_plan(&j[i]);
		queue(f->b, 0, &j[i]);
	}
	assert_true(j[0].piece_total > 1);
	assert_int_equal(j[1].piece_total, 1);
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[0]);
	assert_int_equal(gpu_stop(&f->b->base, &owner_b, FA_ECLOSED, "gone"), 0);
	assert_int_equal(gpu_stop(&f->b->base, &owner_a, FA_ECLOSED, "gone"), 1);
	assert_true(atomic_load(&j[0].stop));
	assert_int_equal(j[0].stop_status, FA_ECLOSED);
	assert_int_equal(gpu_stop(&f->b->base, NULL, FA_ECLOSED, "gone"), 0); /* told already */
	/* two of 1.1 TFLOP exceed a piece: one per batch */
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[1]);
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[2]);
	assert_int_equal(take(f->b, 0, batch), 1);
	assert_ptr_equal(batch[0], &j[3]);
	f->b->devs[0].ncur = 0;
}

/* High-priority jobs are taken before normal ones queued earlier, low ones last. */
static void test_gpu_queue_takes_high_priority_jobs_first(void **state)
{
	struct fixture *f = *state;
	struct backend_job j[4], *batch[GPU_PIPE];

	for (int i = 0; i < 4; i++)
		job_host(&j[i], &owner_a); /* one per batch */
	j[0].priority = FA_PRIORITY_LOW;
	j[3].priority = FA_PRIORITY_HIGH;
	for (int i = 0; i < 4; i++)
		queue(f->b, 0, &j[i]);
	static const int order[4] = {3, 1, 2, 0};
	for (int i = 0; i < 4; i++) {
		assert_int_equal(take(f->b, 0, batch), 1);
		assert_ptr_equal(batch[0], &j[order[i]]);
	}
	f->b->devs[0].ncur = 0;
}

/* The prewake's estimates (gpu_estimate.c): a shape's last GPU time, exactly; the device's rate
 * for a large shape never seen; nothing for a small one never seen, nor for inference jobs;
 * the least recently used shape makes room for a new one. */
static void test_gpu_estimate_uses_the_shapes_last_time_then_the_rate(void **state)
{
	(void)state;
	struct gpu_estimator e;
	struct backend_job big, big2, small, other, inf;
	struct backend_infer infer;

	memset(&e, 0, sizeof e);
	memset(&infer, 0, sizeof infer);
	job_device(&big, &owner_a);
	desc_dense(&big.desc, 8, 4096, 16, 16, 128); /* 1.1 TFLOP */
	job_device(&big2, &owner_a);
	desc_dense(&big2.desc, 4, 4096, 16, 16, 128); /* half of it, never seen */
	job_device(&small, &owner_a);
	desc_dense(&small.desc, 1, 128, 16, 16, 64);
	assert_int_equal(gpu_estimate_ns(&e, &big), 0); /* nothing measured yet */
	gpu_estimate_note(&e, &small, 9000);
	assert_int_equal(gpu_estimate_ns(&e, &small), 9000);
	assert_int_equal(gpu_estimate_ns(&e, &big2), 0); /* no rate from a small job */
	gpu_estimate_note(&e, &big, 3200000);
	assert_int_equal(gpu_estimate_ns(&e, &big), 3200000);
	uint64_t half = gpu_estimate_ns(&e, &big2);
	assert_true(half > 1590000 && half < 1610000); /* the rate: half the FLOPs, half the time */
	gpu_estimate_note(&e, &big, 3300000);        /* the same shape again: its latest time */
	assert_int_equal(gpu_estimate_ns(&e, &big), 3300000);
	/* staging host memory is another shape: its copies take time too */
	job_host(&other, &owner_a);
	other.desc = small.desc;
	assert_int_equal(gpu_estimate_ns(&e, &other), 0);
	inf = big;
	inf.infer = &infer;
	gpu_estimate_note(&e, &inf, 1);
	assert_int_equal(gpu_estimate_ns(&e, &inf), 0);
	assert_int_equal(gpu_estimate_ns(&e, &big), 3300000);
	/* GPU_EST_ENTRIES more small shapes, big used in between: small (the oldest) goes */
	for (int i = 0; i < GPU_EST_ENTRIES; i++) {
		struct backend_job j;
		job_device(&j, &owner_a);
		desc_dense(&j.desc, 1, 256 + 16 * i, 4, 4, 64);
		gpu_estimate_note(&e, &j, 1000 + (uint64_t)i);
		if (i == 0)
			assert_int_equal(gpu_estimate_ns(&e, &big), 3300000);
	}
	assert_int_equal(gpu_estimate_ns(&e, &small), 0);
	assert_int_equal(gpu_estimate_ns(&e, &big), 3300000);
	struct backend_job last;
	job_device(&last, &owner_a);
	desc_dense(&last.desc, 1, 256 + 16 * (GPU_EST_ENTRIES - 1), 4, 4, 64);
	assert_int_equal(gpu_estimate_ns(&e, &last), 1000 + GPU_EST_ENTRIES - 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
		T(test_gpu_queue_takes_at_most_eight_device_jobs_in_queue_order),
		T(test_gpu_queue_ends_a_batch_with_its_one_host_staging_job),
		T(test_gpu_queue_takes_a_host_staging_job_at_the_head_alone),
		T(test_gpu_queue_takes_an_asynchronous_job_alone_and_stops_before_one),
		T(test_gpu_queue_counts_a_host_lse_as_staging_and_no_lse_as_none),
		T(test_gpu_cancel_takes_only_the_owners_queued_jobs_on_every_device),
		T(test_gpu_cancel_leaves_a_batch_a_worker_took_alone),
		T(test_gpu_cancel_answers_the_owners_compile_waiting_jobs_and_keeps_the_others),
		T(test_gpu_cancel_of_nobody_takes_queued_then_compile_waiting_jobs),
		T(test_gpu_job_done_counts_ok_and_failed_jobs_and_marks_no_fault),
		T(test_gpu_fatal_fails_every_queue_with_edevice_and_marks_the_fault),
		T(test_backend_done_drain_hands_jobs_back_in_order_with_next_cleared),
		T(test_gpu_split_covers_every_pair_once_in_whole_groups),
		T(test_gpu_queue_takes_a_split_job_alone_and_stop_tells_the_running_batch),
		T(test_gpu_queue_takes_high_priority_jobs_first),
		T(test_gpu_estimate_uses_the_shapes_last_time_then_the_rate),
#undef T
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
