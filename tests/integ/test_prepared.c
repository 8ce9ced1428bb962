/* test_prepared.c - prepared calls (fa_prepare, fa_prepared_call) on a real daemon, CPU backend,
 * host buffers: wherever the tensors are placed (other offsets, another buffer, mixed), the
 * forward, backward, varlen and KV-cache calls write the same bytes as the direct call on a
 * block built for those places; a place outside its buffer is refused with its index before
 * anything is sent (no request reaches the daemon, no output byte is written); bad arguments
 * of both functions get FA_EINVAL (a buffer of another client FA_EREGION); the asynchronous mode
 * refuses host buffers as fa_attn_fwd_async does; the stream wait without a driver is FA_ENOGPU
 * with nothing sent; four threads share one prepared call. The device-buffer check (a freed and
 * reused allocation refused) runs on the GPU host: python/tests/gpu_torch_check.py.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_integ.h"

static struct fa_daemon g_daemon;

static int setup(void **state)
{
	(void)state;
	int r = daemon_start(&g_daemon, "--threads", "2", "--backend", "cpu", NULL);
	if (r != 0) {
		fprintf(stderr, "daemon_start: %d (status %d)\n", r, g_daemon.status);
		daemon_log_dump(&g_daemon, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	return daemon_finish(&g_daemon);
}

static fa_client *open_client(void)
{
	fa_client *c = NULL;
	assert_int_equal(fa_client_open(&c, g_daemon.url), FA_OK);
	fa_client_set_timeout(c, fa_test_ms(30000));
	return c;
}

enum { BUF_BYTES = 1 << 20, POISON = 0x7f };

static fa_buffer *host_buffer(fa_client *c)
{
	fa_buffer *b = NULL;
	assert_int_equal(fa_buffer_alloc_host(c, BUF_BYTES, &b), FA_OK);
	return b;
}

static uint64_t addr_of(fa_buffer *b, uint64_t off)
{
	return (uint64_t)(uintptr_t)fa_buffer_data(b) + off;
}

/* A contiguous fp32 tensor [s0, s1, s2, s3] at off in b. */
static fa_tensor f32(fa_buffer *b, uint64_t off, int64_t s0, int64_t s1, int64_t s2, int64_t s3)
{
	fa_tensor t = {b, off, FA_DTYPE_FP32, {s0, s1, s2, s3}, {s1 * s2 * s3, s2 * s3, s3, 1}};
	return t;
}

static uint64_t t_bytes(const fa_tensor *t)
{
	return 4u * (uint64_t)(t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3]);
}

/* An int32 vector of n entries at off in b. */
static fa_index i32(fa_buffer *b, uint64_t off, int64_t n)
{
	fa_index x = {b, off, {n, 1}, {1, 1}};
	return x;
}

static void fill(fa_buffer *b, uint64_t off, uint64_t bytes, uint64_t seed)
{
	float *p = (float *)(void *)((char *)fa_buffer_data(b) + off);
	for (uint64_t i = 0; i < bytes / 4; i++)
		p[i] = (float)((double)(fa_rand_next(&seed) >> 11) / (double)(UINT64_C(1) << 53) - 0.5);
}

static void copy_between(fa_buffer *to, uint64_t to_off, fa_buffer *from, uint64_t from_off,
                         uint64_t bytes)
{
	memmove((char *)fa_buffer_data(to) + to_off, (char *)fa_buffer_data(from) + from_off, bytes);
}

static bool all_poison(fa_buffer *b, uint64_t off, uint64_t bytes)
{
	const unsigned char *p = (const unsigned char *)fa_buffer_data(b) + off;
	for (uint64_t i = 0; i < bytes; i++)
		if (p[i] != POISON)
			return false;
	return true;
}

/* The daemon's count of requests served, through c. */
static uint64_t requests(fa_client *c)
{
	uint64_t n = fa_integ_stat(c, "requests_total");
	assert_true(n != UINT64_MAX);
	return n;
}

/* ---- one forward problem, placeable ---------------------------------------------------------- */

enum { B = 2, SQ = 9, SK = 11, HQ = 4, HKV = 2, D = 16 };

/* The forward's tensors q, k, v, o, lse at place (b[i], off[i]). */
static fa_attn_fwd_args fwd_at(fa_buffer *const b[5], const uint64_t off[5])
{
	fa_attn_fwd_args a = {0};
	a.q = f32(b[0], off[0], B, SQ, HQ, D);
	a.k = f32(b[1], off[1], B, SK, HKV, D);
	a.v = f32(b[2], off[2], B, SK, HKV, D);
	a.o = f32(b[3], off[3], B, SQ, HQ, D);
	a.lse = f32(b[4], off[4], B, HQ, SQ, 1);
	a.scale = 0.3;
	a.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	return a;
}

static const uint32_t FWD_FIELDS[5] = {
	offsetof(fa_attn_fwd_args, q), offsetof(fa_attn_fwd_args, k), offsetof(fa_attn_fwd_args, v),
	offsetof(fa_attn_fwd_args, o), offsetof(fa_attn_fwd_args, lse)};

static fa_prepared *prepare_fwd(fa_client *c, const fa_attn_fwd_args *a)
{
	const fa_tensor *t[5] = {&a->q, &a->k, &a->v, &a->o, &a->lse};
	uint64_t span[5];
	for (int i = 0; i < 5; i++)
		span[i] = t_bytes(t[i]);
	fa_prepared *p = NULL;
	fa_status st = fa_prepare(c, FA_PREPARED_FWD, a, 5, FWD_FIELDS, span, &p);
	if (st != FA_OK)
		fail_msg("fa_prepare: %s (%s)", fa_status_name(st), fa_last_error_detail());
	return p;
}

static void place_all(fa_placement *pl, fa_buffer *const b[], const uint64_t off[], int n)
{
	memset(pl, 0, sizeof *pl);
	for (int i = 0; i < n; i++) {
		pl->buf[i] = b[i];
		pl->addr[i] = addr_of(b[i], off[i]);
	}
}

static void test_a_prepared_forward_writes_the_direct_calls_bytes_wherever_it_is_placed(void **s)
{
	(void)s;
	fa_client *c = open_client();
	fa_buffer *x = host_buffer(c), *y = host_buffer(c);
	fa_buffer *home[5] = {x, x, x, x, x};
	uint64_t home_off[5] = {64, 16384, 32768, 49152, 65536};
	fa_attn_fwd_args a = fwd_at(home, home_off);
	for (int i = 0; i < 3; i++)
		fill(x, home_off[i], t_bytes(i == 0 ? &a.q : &a.k), 11 + i);
	fa_prepared *p = prepare_fwd(c, &a);
	/* places: the prepared ones, other offsets in x, all in y, and mixed */
	struct {
		fa_buffer *b[5];
		uint64_t off[5];
	} places[] = {
		{{x, x, x, x, x}, {64, 16384, 32768, 49152, 65536}},
		{{x, x, x, x, x}, {131072, 147456, 163840, 180224, 196608 + 4}},
		{{y, y, y, y, y}, {0, 8192, 16384, 24576, 40960}},
		{{y, x, y, x, y}, {500032, 600064, 700096, 800128, 900160}},
	};
	for (size_t k = 0; k < sizeof places / sizeof places[0]; k++) {
		fa_attn_fwd_args d = fwd_at(places[k].b, places[k].off);
		const fa_tensor *t[5] = {&d.q, &d.k, &d.v, &d.o, &d.lse};
		for (int i = 0; i < 3; i++)
			copy_between(t[i]->buf, t[i]->offset, home[i], home_off[i], t_bytes(t[i]));
		/* the direct call on a block built for these places */
		for (int i = 3; i < 5; i++)
			memset((char *)fa_buffer_data(t[i]->buf) + t[i]->offset, POISON, t_bytes(t[i]));
		assert_int_equal(fa_attn_fwd(c, &d), FA_OK);
		unsigned char want_o[B * SQ * HQ * D * 4], want_lse[B * HQ * SQ * 4];
		memcpy(want_o, (char *)fa_buffer_data(d.o.buf) + d.o.offset, sizeof want_o);
		memcpy(want_lse, (char *)fa_buffer_data(d.lse.buf) + d.lse.offset, sizeof want_lse);
		/* the prepared call placed there */
		for (int i = 3; i < 5; i++)
			memset((char *)fa_buffer_data(t[i]->buf) + t[i]->offset, POISON, t_bytes(t[i]));
		fa_placement pl;
		place_all(&pl, places[k].b, places[k].off, 5);
		pl.moved = 77;
		fa_status st = fa_prepared_call(p, &pl);
		if (st != FA_OK)
			fail_msg("place %zu: %s (%s)", k, fa_status_name(st), fa_last_error_detail());
		assert_int_equal(pl.moved, -1);
		assert_false(all_poison(d.o.buf, d.o.offset, 4));
		assert_memory_equal((char *)fa_buffer_data(d.o.buf) + d.o.offset, want_o,
		                    sizeof want_o);
		assert_memory_equal((char *)fa_buffer_data(d.lse.buf) + d.lse.offset, want_lse,
		                    sizeof want_lse);
	}
	fa_prepared_free(p);
	fa_buffer_free(x);
	fa_buffer_free(y);
	fa_client_close(c);
}

static void test_a_place_outside_its_buffer_is_refused_with_its_index_and_nothing_sent(void **s)
{
	(void)s;
	fa_client *c = open_client();
	fa_buffer *x = host_buffer(c), *y = host_buffer(c);
	fa_buffer *b[5] = {x, x, x, x, x};
	uint64_t off[5] = {64, 16384, 32768, 49152, 65536};
	fa_attn_fwd_args a = fwd_at(b, off);
	fa_prepared *p = prepare_fwd(c, &a);
	memset((char *)fa_buffer_data(x) + off[3], POISON, t_bytes(&a.o));
	/* what two STATS calls in a row count: the four refusals between must add nothing */
	uint64_t r0 = requests(c), before = requests(c), stats_only = before - r0;
	fa_placement pl;
	/* o's last byte one past the buffer */
	place_all(&pl, b, off, 5);
	pl.addr[3] = addr_of(x, BUF_BYTES - t_bytes(&a.o) + 4);
	assert_int_equal(fa_prepared_call(p, &pl), FA_ERANGE);
	assert_int_equal(pl.moved, 3);
	assert_non_null(strstr(fa_last_error_detail(), "place 3"));
	/* k before its buffer's start */
	place_all(&pl, b, off, 5);
	pl.addr[1] = addr_of(x, 0) - 64;
	assert_int_equal(fa_prepared_call(p, &pl), FA_ERANGE);
	assert_int_equal(pl.moved, 1);
	/* v in y's memory, given as x's: outside x */
	place_all(&pl, b, off, 5);
	pl.addr[2] = addr_of(y, 0);
	fa_status st = fa_prepared_call(p, &pl);
	assert_int_equal(st, FA_ERANGE);
	assert_int_equal(pl.moved, 2);
	/* an address that wraps around */
	place_all(&pl, b, off, 5);
	pl.addr[0] = UINT64_MAX - 8;
	assert_int_equal(fa_prepared_call(p, &pl), FA_ERANGE);
	assert_int_equal(pl.moved, 0);
	assert_int_equal(requests(c), before + stats_only); /* no attention request went */
	assert_true(all_poison(x, off[3], t_bytes(&a.o)));
	fa_prepared_free(p);
	fa_buffer_free(x);
	fa_buffer_free(y);
	fa_client_close(c);
}

static void test_bad_arguments_are_refused_with_einval_and_another_clients_buffer_eregion(void **s)
{
	(void)s;
	fa_client *c = open_client(), *other = open_client();
	fa_buffer *x = host_buffer(c), *z = host_buffer(other);
	fa_buffer *b[5] = {x, x, x, x, x};
	uint64_t off[5] = {64, 16384, 32768, 49152, 65536};
	fa_attn_fwd_args a = fwd_at(b, off);
	uint64_t span[FA_PREPARED_MAX_TENSORS + 1];
	uint32_t field[FA_PREPARED_MAX_TENSORS + 1];
	for (int i = 0; i < FA_PREPARED_MAX_TENSORS + 1; i++)
		span[i] = 64, field[i] = FWD_FIELDS[i % 5];
	fa_prepared *p = (fa_prepared *)&a; /* set to NULL by every call */
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 5, field, span, NULL), FA_EINVAL);
	assert_int_equal(fa_prepare(NULL, FA_PREPARED_FWD, &a, 5, field, span, &p), FA_EINVAL);
	assert_null(p);
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, NULL, 5, field, span, &p), FA_EINVAL);
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 5, NULL, span, &p), FA_EINVAL);
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 5, field, NULL, &p), FA_EINVAL);
	assert_int_equal(fa_prepare(c, (fa_prepared_op)9, &a, 5, field, span, &p), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "op 9"));
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 0, field, span, &p), FA_EINVAL);
	assert_int_equal(fa_prepare(c, FA_PREPARED_BWD, &a, FA_PREPARED_MAX_TENSORS + 1, field,
	                            span, &p), FA_EINVAL);
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 6, field, span, &p), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "each tensor at most once"));
	uint32_t not_a_tensor[1] = {offsetof(fa_attn_fwd_args, scale)};
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 1, not_a_tensor, span, &p), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "not the offset of a tensor"));
	uint32_t dq[1] = {offsetof(fa_attn_bwd_args, dq)}; /* a backward member, past the forward */
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 1, dq, span, &p), FA_EINVAL);
	uint64_t zero[1] = {0};
	assert_int_equal(fa_prepare(c, FA_PREPARED_FWD, &a, 1, field, zero, &p), FA_EINVAL);
	assert_null(p);
	p = prepare_fwd(c, &a);
	fa_placement pl;
	place_all(&pl, b, off, 5);
	assert_int_equal(fa_prepared_call(NULL, &pl), FA_EINVAL);
	assert_int_equal(fa_prepared_call(p, NULL), FA_EINVAL);
	pl.flags = 4;
	assert_int_equal(fa_prepared_call(p, &pl), FA_EINVAL);
	pl.flags = FA_PLACE_SYNC_STREAM | FA_PLACE_ASYNC;
	assert_int_equal(fa_prepared_call(p, &pl), FA_EINVAL);
	pl.flags = 0;
	pl.buf[4] = NULL;
	assert_int_equal(fa_prepared_call(p, &pl), FA_EINVAL);
	assert_int_equal(pl.moved, -1);
	place_all(&pl, b, off, 5);
	pl.buf[2] = z;
	pl.addr[2] = addr_of(z, 0);
	assert_int_equal(fa_prepared_call(p, &pl), FA_EREGION);
	assert_int_equal(pl.moved, -1);
	assert_non_null(strstr(fa_last_error_detail(), "another fa_client"));
	/* the asynchronous mode: host buffers refused as fa_attn_fwd_async refuses them */
	place_all(&pl, b, off, 5);
	pl.flags = FA_PLACE_ASYNC;
	assert_int_equal(fa_prepared_call(p, &pl), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "host buffer"));
	/* the stream wait: without a driver FA_ENOGPU, on a GPU host without a current context
	 * FA_EDEVICE (the CUDA error in the detail); either way nothing was sent */
	memset((char *)fa_buffer_data(x) + off[3], POISON, t_bytes(&a.o));
	pl.flags = FA_PLACE_SYNC_STREAM;
	fa_status st = fa_prepared_call(p, &pl);
	if (st == FA_ENOGPU || st == FA_EDEVICE)
		assert_true(all_poison(x, off[3], t_bytes(&a.o)));
	else if (st != FA_OK)
		fail_msg("the stream wait: %s (%s)", fa_status_name(st), fa_last_error_detail());
	fa_prepared_free(p);
	fa_prepared_free(NULL);
	fa_buffer_free(x);
	fa_buffer_free(z);
	fa_client_close(other);
	fa_client_close(c);
}

/* ---- the other ops ----------------------------------------------------------------------------- */

/* fa_prepared_call with every tensor in y at y_off[i] (inputs copied there from their block
 * places in x), outputs poisoned, against the direct call at those places: same bytes. */
static void expect_same_as_direct(fa_client *c, fa_prepared_op op, void *args, size_t size,
                                  unsigned n, const uint32_t *field, const uint64_t *span,
                                  const bool *is_out, fa_buffer *y, const uint64_t *y_off)
{
	fa_prepared *p = NULL;
	fa_status st = fa_prepare(c, op, args, n, field, span, &p);
	if (st != FA_OK)
		fail_msg("fa_prepare: %s (%s)", fa_status_name(st), fa_last_error_detail());
	unsigned char direct[1024];
	assert_true(size <= sizeof direct);
	memcpy(direct, args, size);
	for (unsigned i = 0; i < n; i++) {
		fa_tensor *t = (fa_tensor *)(void *)((char *)args + field[i]);
		fa_tensor *d = (fa_tensor *)(void *)(direct + field[i]);
		if (!is_out[i])
			copy_between(y, y_off[i], t->buf, t->offset, span[i]);
		d->buf = y;
		d->offset = y_off[i];
	}
	static unsigned char want[BUF_BYTES];
	for (unsigned i = 0; i < n; i++)
		if (is_out[i])
			memset((char *)fa_buffer_data(y) + y_off[i], POISON, span[i]);
	switch (op) {
	case FA_PREPARED_BWD: st = fa_attn_bwd(c, (fa_attn_bwd_args *)(void *)direct); break;
	case FA_PREPARED_VARLEN: st = fa_attn_varlen(c, (fa_attn_varlen_args *)(void *)direct); break;
	case FA_PREPARED_KVCACHE:
		st = fa_attn_kvcache(c, (fa_attn_kvcache_args *)(void *)direct);
		break;
	default: st = fa_attn_fwd(c, (fa_attn_fwd_args *)(void *)direct); break;
	}
	if (st != FA_OK)
		fail_msg("direct op %d: %s (%s)", (int)op, fa_status_name(st), fa_last_error_detail());
	memcpy(want, fa_buffer_data(y), BUF_BYTES);
	for (unsigned i = 0; i < n; i++)
		if (is_out[i]) {
			assert_false(all_poison(y, y_off[i], 4));
			memset((char *)fa_buffer_data(y) + y_off[i], POISON, span[i]);
		}
	fa_placement pl = {0};
	for (unsigned i = 0; i < n; i++) {
		pl.buf[i] = y;
		pl.addr[i] = addr_of(y, y_off[i]);
	}
	st = fa_prepared_call(p, &pl);
	if (st != FA_OK)
		fail_msg("prepared op %d: %s (%s)", (int)op, fa_status_name(st), fa_last_error_detail());
	assert_memory_equal(fa_buffer_data(y), want, BUF_BYTES);
	fa_prepared_free(p);
}

static void test_prepared_backward_varlen_and_kvcache_write_their_direct_calls_bytes(void **s)
{
	(void)s;
	fa_client *c = open_client();
	fa_buffer *x = host_buffer(c), *y = host_buffer(c);
	/* backward: the forward's o and lse first */
	fa_attn_bwd_args g = {0};
	enum { S = 6, H = 2, DD = 8 };
	uint64_t o = 0;
	fa_tensor *gt[9] = {&g.q, &g.k, &g.v, &g.o, &g.dout, &g.lse, &g.dq, &g.dk, &g.dv};
	for (int i = 0; i < 9; i++, o += 4096)
		*gt[i] = i == 5 ? f32(x, o, 1, H, S, 1) : f32(x, o, 1, S, H, DD);
	for (int i = 0; i < 5; i++)
		fill(x, gt[i]->offset, t_bytes(gt[i]), 100 + i);
	fa_attn_fwd_args f = {.q = g.q, .k = g.k, .v = g.v, .o = g.o, .lse = g.lse,
	                      .mask = FA_MASK_CAUSAL_TOP_LEFT};
	assert_int_equal(fa_attn_fwd(c, &f), FA_OK);
	g.mask = FA_MASK_CAUSAL_TOP_LEFT;
	g.flags = FA_BWD_DETERMINISTIC;
	uint32_t bf[9] = {
		offsetof(fa_attn_bwd_args, q), offsetof(fa_attn_bwd_args, k),
		offsetof(fa_attn_bwd_args, v), offsetof(fa_attn_bwd_args, o),
		offsetof(fa_attn_bwd_args, dout), offsetof(fa_attn_bwd_args, lse),
		offsetof(fa_attn_bwd_args, dq), offsetof(fa_attn_bwd_args, dk),
		offsetof(fa_attn_bwd_args, dv)};
	uint64_t bspan[9], boff[9];
	bool bout[9] = {false, false, false, false, false, false, true, true, true};
	for (int i = 0; i < 9; i++)
		bspan[i] = t_bytes(gt[i]), boff[i] = 200000 + 8192 * (uint64_t)(8 - i);
	expect_same_as_direct(c, FA_PREPARED_BWD, &g, sizeof g, 9, bf, bspan, bout, y, boff);

	/* varlen: two sequences, 3 and 5 queries over 4 and 6 keys; the offsets placed too */
	int32_t cuq[3] = {0, 3, 8}, cuk[3] = {0, 4, 10};
	memcpy((char *)fa_buffer_data(x) + 300000, cuq, sizeof cuq);
	memcpy((char *)fa_buffer_data(x) + 300064, cuk, sizeof cuk);
	fa_attn_varlen_args vl = {0};
	vl.q = f32(x, 309952, 1, 8, HQ, D);
	vl.k = f32(x, 320000, 1, 10, HKV, D);
	vl.v = f32(x, 330048, 1, 10, HKV, D);
	vl.o = f32(x, 340032, 1, 8, HQ, D);
	vl.lse = f32(x, 350016, 1, HQ, 8, 1);
	vl.cu_seqlens_q = i32(x, 300000, 3);
	vl.cu_seqlens_k = i32(x, 300064, 3);
	vl.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	const fa_tensor *vin[3] = {&vl.q, &vl.k, &vl.v};
	for (int i = 0; i < 3; i++)
		fill(x, vin[i]->offset, t_bytes(vin[i]), 300 + i);
	uint32_t vf[7] = {
		offsetof(fa_attn_varlen_args, q), offsetof(fa_attn_varlen_args, k),
		offsetof(fa_attn_varlen_args, v), offsetof(fa_attn_varlen_args, o),
		offsetof(fa_attn_varlen_args, lse), offsetof(fa_attn_varlen_args, cu_seqlens_q),
		offsetof(fa_attn_varlen_args, cu_seqlens_k)};
	uint64_t vspan[7] = {t_bytes(&vl.q), t_bytes(&vl.k), t_bytes(&vl.v), t_bytes(&vl.o),
	                     t_bytes(&vl.lse), sizeof cuq, sizeof cuk};
	uint64_t voff[7] = {500032, 520000, 540032, 560000, 580032, 600000, 600064};
	bool vout[7] = {false, false, false, true, true, false, false};
	expect_same_as_direct(c, FA_PREPARED_VARLEN, &vl, sizeof vl, 7, vf, vspan, vout, y, voff);

	/* KV cache: contiguous [B, 12, Hkv, D], lengths 5 and 12, one query each */
	int32_t lens[2] = {5, 12};
	memcpy((char *)fa_buffer_data(x) + 400000, lens, sizeof lens);
	fa_attn_kvcache_args kv = {0};
	kv.q = f32(x, 410048, 2, 1, HQ, D);
	kv.k = f32(x, 420032, 2, 12, HKV, D);
	kv.v = f32(x, 440000, 2, 12, HKV, D);
	kv.o = f32(x, 460032, 2, 1, HQ, D);
	kv.cache_seqlens = i32(x, 400000, 2);
	const fa_tensor *kin[3] = {&kv.q, &kv.k, &kv.v};
	for (int i = 0; i < 3; i++)
		fill(x, kin[i]->offset, t_bytes(kin[i]), 400 + i);
	uint32_t kf[4] = {offsetof(fa_attn_kvcache_args, q), offsetof(fa_attn_kvcache_args, k),
	                  offsetof(fa_attn_kvcache_args, o),
	                  offsetof(fa_attn_kvcache_args, cache_seqlens)};
	uint64_t kspan[4] = {t_bytes(&kv.q), t_bytes(&kv.k), t_bytes(&kv.o), sizeof lens};
	uint64_t koff[4] = {700032, 720000, 760000, 780032}; /* v stays where it is, in x */
	bool kout[4] = {false, false, true, false};
	expect_same_as_direct(c, FA_PREPARED_KVCACHE, &kv, sizeof kv, 4, kf, kspan, kout, y, koff);
	/* and asynchronously: fa_attn_kvcache_async, which takes device buffers only (these are
	 * host buffers: refused before anything is sent) */
	fa_prepared *p = NULL;
	assert_int_equal(fa_prepare(c, FA_PREPARED_KVCACHE, &kv, 4, kf, kspan, &p), FA_OK);
	fa_placement pl = {.flags = FA_PLACE_ASYNC};
	for (int i = 0; i < 4; i++)
		pl.buf[i] = x, pl.addr[i] = addr_of(x, 0);
	assert_int_equal(fa_prepared_call(p, &pl), FA_EINVAL);
	assert_non_null(strstr(fa_last_error_detail(), "fa_attn_kvcache_async"));
	assert_non_null(strstr(fa_last_error_detail(), "host buffer"));
	fa_prepared_free(p);
	fa_buffer_free(x);
	fa_buffer_free(y);
	fa_client_close(c);
}

/* ---- threads ----------------------------------------------------------------------------------- */

enum { THREADS = 4, CALLS = 25 };

struct worker {
	const fa_prepared *p;
	fa_buffer *x;
	const uint64_t *off;
	uint64_t out_off, lse_off;
	const unsigned char *want_o;
	int bad;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	for (int k = 0; k < CALLS && !w->bad; k++) {
		fa_placement pl = {0};
		for (int i = 0; i < 5; i++) {
			pl.buf[i] = w->x;
			pl.addr[i] = addr_of(w->x, i == 3 ? w->out_off : i == 4 ? w->lse_off
			                                                             : w->off[i]);
		}
		memset((char *)fa_buffer_data(w->x) + w->out_off, POISON, B * SQ * HQ * D * 4);
		if (fa_prepared_call(w->p, &pl) != FA_OK ||
		    memcmp((char *)fa_buffer_data(w->x) + w->out_off, w->want_o,
		           B * SQ * HQ * D * 4) != 0)
			w->bad = 1;
	}
	return NULL;
}

static void test_threads_share_one_prepared_call(void **s)
{
	(void)s;
	fa_client *c = open_client();
	fa_buffer *x = host_buffer(c);
	fa_buffer *b[5] = {x, x, x, x, x};
	uint64_t off[5] = {64, 16384, 32768, 49152, 65536};
	fa_attn_fwd_args a = fwd_at(b, off);
	for (int i = 0; i < 3; i++)
		fill(x, off[i], t_bytes(i == 0 ? &a.q : &a.k), 21 + i);
	assert_int_equal(fa_attn_fwd(c, &a), FA_OK);
	static unsigned char want[B * SQ * HQ * D * 4];
	memcpy(want, (char *)fa_buffer_data(x) + off[3], sizeof want);
	fa_prepared *p = prepare_fwd(c, &a);
	pthread_t th[THREADS];
	struct worker w[THREADS];
	for (int t = 0; t < THREADS; t++) {
		w[t] = (struct worker){p, x, off, 131072 + 65536 * (uint64_t)t,
		                       131072 + 65536 * (uint64_t)t + 32768, want, 0};
		assert_int_equal(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
	}
	int bad = 0;
	for (int t = 0; t < THREADS; t++) {
		pthread_join(th[t], NULL);
		bad += w[t].bad;
	}
	assert_int_equal(bad, 0);
	fa_prepared_free(p);
	fa_buffer_free(x);
	fa_client_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_a_prepared_forward_writes_the_direct_calls_bytes_wherever_it_is_placed),
		cmocka_unit_test(test_a_place_outside_its_buffer_is_refused_with_its_index_and_nothing_sent),
		cmocka_unit_test(test_bad_arguments_are_refused_with_einval_and_another_clients_buffer_eregion),
		cmocka_unit_test(test_prepared_backward_varlen_and_kvcache_write_their_direct_calls_bytes),
		cmocka_unit_test(test_threads_share_one_prepared_call),
	};
	if (getenv("FA_TEST_FILTER"))
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
