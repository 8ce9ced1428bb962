/* test_attn_infer.c - the inference calls end to end on a real daemon (CPU backend): several
 * client processes send varlen batches, paged and contiguous KV-cache decodes (dense and packed
 * queries) and dense forwards with a sliding window and softcap, and every result is checked
 * against the float64 reference computed here from the same bytes; bad index tensors (a page
 * number past the pools, decreasing offsets, a cache longer than its pages) are answered with
 * FA_EINVAL and a detail naming the entry, and no output byte is written.
 */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

#include "fa_attn_infer.h"
#include "fa_integ.h"

#define NPROC 3

static struct fa_daemon g_daemon;

/* ---- a problem laid out in one host buffer ---------------------------------------------------- */

struct arena {
	fa_buffer *buf;
	char *base;
	size_t used, size;
	uint64_t rng;
};

static uint64_t arena_take(struct arena *a, size_t bytes)
{
	uint64_t off = (a->used + 63) & ~(uint64_t)63;
	a->used = off + bytes;
	if (a->used > a->size)
		fail_msg("arena: %zu bytes, buffer has %zu", a->used, a->size);
	return off;
}

static double rnd(struct arena *a)
{
	a->rng = a->rng * 6364136223846793005u + 1442695040888963407u;
	return (double)(a->rng >> 11) / (double)(UINT64_C(1) << 53) * 2.0 - 1.0;
}

/* n fp32 values in [-amp, amp] in the arena; returns the offset. */
static uint64_t arena_f32(struct arena *a, size_t n, double amp)
{
	uint64_t off = arena_take(a, n * 4);
	float *p = (float *)(void *)(a->base + off);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(amp * rnd(a));
	return off;
}

static uint64_t arena_i32(struct arena *a, const int32_t *v, size_t n)
{
	uint64_t off = arena_take(a, n * 4);
	memcpy(a->base + off, v, n * 4);
	return off;
}

/* Poison: outputs start as 0x7f bytes (NaN-like floats), so "nothing written" is checkable. */
static uint64_t arena_out(struct arena *a, size_t bytes)
{
	uint64_t off = arena_take(a, bytes);
	memset(a->base + off, 0x7f, bytes);
	return off;
}

static fa_tensor tensor(struct arena *a, uint64_t off, int64_t d0, int64_t d1, int64_t d2,
                        int64_t d3)
{
	fa_tensor t = {a->buf, off, FA_DTYPE_FP32, {d0, d1, d2, d3},
	               {d1 * d2 * d3, d2 * d3, d3, 1}};
	return t;
}

static fa_index vec(struct arena *a, uint64_t off, int64_t n)
{
	fa_index t = {a->buf, off, {n, 1}, {1, 1}};
	return t;
}

/* ||o - ref|| / ||ref|| over n values; +inf on a non-finite value. */
static double rel_err(const float *o, const double *ref, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(o[i]) || !isfinite(ref[i]))
			return INFINITY;
		num += (o[i] - ref[i]) * (o[i] - ref[i]);
		den += ref[i] * ref[i];
	}
	return den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
}

/* lse against the oracle: -inf exactly where the oracle has it, else within 1e-5. */
static bool lse_ok(const float *l, const double *ref, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (isinf(ref[i])) {
			if (!(isinf(l[i]) && l[i] < 0))
				return false;
		} else if (!(fabs(l[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i])))) {
			return false;
		}
	}
	return true;
}

/* The settings a process uses for its requests. */
struct settings {
	fa_mask mask;
	int32_t window;
	int64_t left, right;
	double softcap;
};

static void desc_settings(struct fa_attn_fwd_desc *d, const struct settings *s, int64_t D)
{
	d->dtype = FA_DTYPE_FP32;
	d->precision = FA_PREC_3XTF32;
	d->mask = s->mask;
	d->scale = 1.0 / sqrt((double)D);
	d->window = s->window != 0;
	d->window_left = s->left;
	d->window_right = s->right;
	d->softcap = s->softcap;
}

/* A varlen batch: ragged lengths, fp32, packed BSHD; checked against fa_attn_infer_ref64. */
static bool run_varlen(fa_client *c, struct arena *a, const struct settings *s, char *why,
                       size_t whylen)
{
	static const int32_t sq[] = {1, 17, 127, 129, 0, 5}, sk[] = {129, 17, 1, 127, 9, 0};
	enum { B = 6, Hq = 4, Hkv = 2, D = 32 };
	int32_t cuq[B + 1] = {0}, cuk[B + 1] = {0};
	for (int b = 0; b < B; b++)
		cuq[b + 1] = cuq[b] + sq[b], cuk[b + 1] = cuk[b] + sk[b];
	int64_t tq = cuq[B], tk = cuk[B];
	a->used = 0;
	uint64_t oq = arena_f32(a, (size_t)(tq * Hq * D), 2), ok = arena_f32(a, (size_t)(tk * Hkv * D), 2);
	uint64_t ov = arena_f32(a, (size_t)(tk * Hkv * D), 1), oo = arena_out(a, (size_t)(tq * Hq * D) * 4);
	uint64_t ol = arena_out(a, (size_t)(Hq * tq) * 4);
	uint64_t ocq = arena_i32(a, cuq, B + 1), ock = arena_i32(a, cuk, B + 1);
	fa_attn_varlen_args args = {
		.q = tensor(a, oq, 1, tq, Hq, D), .k = tensor(a, ok, 1, tk, Hkv, D),
		.v = tensor(a, ov, 1, tk, Hkv, D), .o = tensor(a, oo, 1, tq, Hq, D),
		.lse = {a->buf, ol, FA_DTYPE_FP32, {1, Hq, tq, 1}, {Hq * tq, tq, 1, 1}},
		.cu_seqlens_q = vec(a, ocq, B + 1), .cu_seqlens_k = vec(a, ock, B + 1),
		.max_seqlen_q = s->window ? 0 : 129, /* 0: the daemon finds it */
		.mask = s->mask, .window = s->window, .window_left = s->left,
		.window_right = s->right, .softcap = s->softcap,
	};
	fa_status st = fa_attn_varlen(c, &args);
	if (st != FA_OK) {
		snprintf(why, whylen, "fa_attn_varlen: %s: %s", fa_status_name(st),
		         fa_last_error_detail());
		return false;
	}
	struct fa_attn_infer_desc d = {.cu_q = cuq, .total_q = tq, .kv = FA_KV_PACKED, .cu_k = cuk,
	                               .total_k = tk};
	desc_settings(&d.fwd, s, D);
	d.fwd.B = B, d.fwd.Sq = 129, d.fwd.Sk = 129, d.fwd.Hq = Hq, d.fwd.Hkv = Hkv, d.fwd.D = D;
	int64_t qs[3] = {0, Hq * D, D}, ks[3] = {0, Hkv * D, D};
	memcpy(d.fwd.q_stride, qs, sizeof qs), memcpy(d.fwd.o_stride, qs, sizeof qs);
	memcpy(d.fwd.k_stride, ks, sizeof ks), memcpy(d.fwd.v_stride, ks, sizeof ks);
	double *o64 = calloc((size_t)(tq * Hq * D), 8), *l64 = calloc((size_t)(Hq * tq), 8);
	assert_int_equal(fa_attn_infer_ref64(&d, a->base + oq, a->base + ok, a->base + ov, o64, l64),
	                 FA_OK);
	double e = rel_err((float *)(void *)(a->base + oo), o64, (size_t)(tq * Hq * D));
	bool lok = lse_ok((float *)(void *)(a->base + ol), l64, (size_t)(Hq * tq));
	free(o64), free(l64);
	if (!(e <= 1e-6) || !lok) {
		snprintf(why, whylen, "varlen: relative error %g, lse %s", e, lok ? "ok" : "wrong");
		return false;
	}
	return true;
}

/* A paged KV-cache decode: Sq queries per sequence (dense) or packed, pages of page_size handed
 * out backwards with spares between, lengths with partly filled last pages and an empty cache. */
static bool run_kvcache(fa_client *c, struct arena *a, const struct settings *s, int Sq,
                        int page_size, bool packed, char *why, size_t whylen)
{
	static const int32_t lens[] = {17, 1, 129, 0, 300, 64};
	enum { B = 6, Hq = 8, Hkv = 2, D = 16, COLS = 24 };
	int32_t table[B * COLS], cuq[B + 1] = {0};
	int pages = 0;
	for (int b = 0; b < B; b++)
		pages += (lens[b] + page_size - 1) / page_size;
	pages = 2 * pages + 1;
	int next = 0;
	for (int b = 0; b < B; b++)
		for (int p = 0; p < COLS; p++)
			table[b * COLS + p] =
			    p * page_size < lens[b] ? pages - 1 - 2 * next++ : 123456; /* padding */
	for (int b = 0; b < B; b++)
		cuq[b + 1] = cuq[b] + Sq;
	int64_t rows = (int64_t)B * Sq;
	a->used = 0;
	uint64_t oq = arena_f32(a, (size_t)(rows * Hq * D), 2);
	uint64_t ok = arena_f32(a, (size_t)pages * page_size * Hkv * D, 2);
	uint64_t ov = arena_f32(a, (size_t)pages * page_size * Hkv * D, 1);
	uint64_t oo = arena_out(a, (size_t)(rows * Hq * D) * 4);
	uint64_t ol = arena_out(a, (size_t)(rows * Hq) * 4);
	uint64_t ocl = arena_i32(a, lens, B), opt = arena_i32(a, table, B * COLS);
	uint64_t ocq = arena_i32(a, cuq, B + 1);
	fa_attn_kvcache_args args = {
		.k = tensor(a, ok, pages, page_size, Hkv, D), .v = tensor(a, ov, pages, page_size, Hkv, D),
		.cache_seqlens = vec(a, ocl, B),
		.page_table = {a->buf, opt, {B, COLS}, {COLS, 1}},
		.mask = s->mask, .window = s->window, .window_left = s->left,
		.window_right = s->right, .softcap = s->softcap,
	};
	if (packed) {
		args.q = tensor(a, oq, 1, rows, Hq, D);
		args.o = tensor(a, oo, 1, rows, Hq, D);
		args.lse = (fa_tensor){a->buf, ol, FA_DTYPE_FP32, {1, Hq, rows, 1}, {Hq * rows, rows, 1, 1}};
		args.cu_seqlens_q = vec(a, ocq, B + 1);
	} else {
		args.q = tensor(a, oq, B, Sq, Hq, D);
		args.o = tensor(a, oo, B, Sq, Hq, D);
		args.lse = (fa_tensor){a->buf, ol, FA_DTYPE_FP32, {B, Hq, Sq, 1}, {Hq * Sq, Sq, 1, 1}};
	}
	fa_status st = fa_attn_kvcache(c, &args);
	if (st != FA_OK) {
		snprintf(why, whylen, "fa_attn_kvcache: %s: %s", fa_status_name(st),
		         fa_last_error_detail());
		return false;
	}
	struct fa_attn_infer_desc d = {.kv = FA_KV_PAGED, .seqlens_k = lens, .page_table = table,
	                               .pt_cols = COLS, .pages = pages, .page_size = page_size};
	desc_settings(&d.fwd, s, D);
	d.fwd.B = B, d.fwd.Sq = Sq, d.fwd.Sk = 300, d.fwd.Hq = Hq, d.fwd.Hkv = Hkv, d.fwd.D = D;
	int64_t qs[3] = {Sq * Hq * D, Hq * D, D}, ks[3] = {page_size * Hkv * D, Hkv * D, D};
	int64_t ls[3] = {Hq * Sq, Sq, 1};
	if (packed) {
		d.cu_q = cuq, d.total_q = rows;
		qs[0] = 0, ls[0] = 0, ls[1] = rows;
	}
	memcpy(d.fwd.q_stride, qs, sizeof qs), memcpy(d.fwd.o_stride, qs, sizeof qs);
	memcpy(d.fwd.k_stride, ks, sizeof ks), memcpy(d.fwd.v_stride, ks, sizeof ks);
	memcpy(d.fwd.lse_stride, ls, sizeof ls);
	double *o64 = calloc((size_t)(rows * Hq * D), 8), *l64 = calloc((size_t)(rows * Hq), 8);
	assert_int_equal(fa_attn_infer_ref64(&d, a->base + oq, a->base + ok, a->base + ov, o64, l64),
	                 FA_OK);
	double e = rel_err((float *)(void *)(a->base + oo), o64, (size_t)(rows * Hq * D));
	bool lok = lse_ok((float *)(void *)(a->base + ol), l64, (size_t)(rows * Hq));
	free(o64), free(l64);
	if (!(e <= 1e-6) || !lok) {
		snprintf(why, whylen, "kvcache (Sq %d, page %d, %s): relative error %g, lse %s", Sq,
		         page_size, packed ? "packed" : "dense", e, lok ? "ok" : "wrong");
		return false;
	}
	return true;
}

/* A dense forward with the window and softcap through fa_attn_fwd. */
static bool run_fwd(fa_client *c, struct arena *a, const struct settings *s, char *why,
                    size_t whylen)
{
	enum { B = 2, Sq = 129, Sk = 127, Hq = 4, Hkv = 1, D = 24 };
	a->used = 0;
	uint64_t oq = arena_f32(a, B * Sq * Hq * D, 2), ok = arena_f32(a, B * Sk * Hkv * D, 2);
	uint64_t ov = arena_f32(a, B * Sk * Hkv * D, 1), oo = arena_out(a, B * Sq * Hq * D * 4);
	fa_attn_fwd_args args = {
		.q = tensor(a, oq, B, Sq, Hq, D), .k = tensor(a, ok, B, Sk, Hkv, D),
		.v = tensor(a, ov, B, Sk, Hkv, D), .o = tensor(a, oo, B, Sq, Hq, D),
		.mask = s->mask, .window = s->window, .window_left = s->left,
		.window_right = s->right, .softcap = s->softcap,
	};
	fa_status st = fa_attn_fwd(c, &args);
	if (st != FA_OK) {
		snprintf(why, whylen, "fa_attn_fwd: %s: %s", fa_status_name(st), fa_last_error_detail());
		return false;
	}
	struct fa_attn_fwd_desc d = {.B = B, .Sq = Sq, .Sk = Sk, .Hq = Hq, .Hkv = Hkv, .D = D,
	                             .q_stride = {Sq * Hq * D, Hq * D, D},
	                             .k_stride = {Sk * Hkv * D, Hkv * D, D},
	                             .v_stride = {Sk * Hkv * D, Hkv * D, D},
	                             .o_stride = {Sq * Hq * D, Hq * D, D}};
	desc_settings(&d, s, D);
	double *o64 = calloc(B * Sq * Hq * D, 8);
	assert_int_equal(fa_attn_fwd_ref64(&d, a->base + oq, a->base + ok, a->base + ov, o64, NULL),
	                 FA_OK);
	double e = rel_err((float *)(void *)(a->base + oo), o64, B * Sq * Hq * D);
	free(o64);
	if (!(e <= 1e-6)) {
		snprintf(why, whylen, "fwd with window/softcap: relative error %g", e);
		return false;
	}
	return true;
}

static const struct settings proc_settings[NPROC] = {
	{FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 31, 0, 0},
	{FA_MASK_NONE, 1, 8, 3, 20.0},
	{FA_MASK_CAUSAL_TOP_LEFT, 0, 0, 0, 5.0},
};

/* A client process: every call with its settings, twice. Exit 0 when all passed. */
static int client_process(int proc)
{
	fa_client *c = NULL;
	struct arena a = {.rng = 0xabcdef12u + (uint64_t)proc * 977u, .size = 4 << 20};
	char why[512];
	int failed = 0;

	if (fa_client_open(&c, g_daemon.url) != FA_OK)
		return 2;
	fa_client_set_timeout(c, fa_test_ms(60000));
	if (fa_buffer_alloc_host(c, a.size, &a.buf) != FA_OK)
		return 3;
	a.base = fa_buffer_data(a.buf);
	const struct settings *s = &proc_settings[proc];
	for (int round = 0; round < 2; round++) {
		bool ok = run_varlen(c, &a, s, why, sizeof why);
		if (ok)
			ok = run_kvcache(c, &a, s, 1, 16, false, why, sizeof why);
		if (ok)
			ok = run_kvcache(c, &a, s, 4, 256, false, why, sizeof why);
		if (ok)
			ok = run_kvcache(c, &a, s, 2, 32, true, why, sizeof why);
		if (ok)
			ok = run_fwd(c, &a, s, why, sizeof why);
		if (!ok) {
			fprintf(stderr, "client %d round %d: %s\n", proc, round, why);
			failed++;
		}
	}
	fa_buffer_free(a.buf);
	fa_client_close(c);
	return failed ? 1 : 0;
}

static int setup(void **state)
{
	(void)state;
	int r = daemon_start(&g_daemon, "--threads", "2", NULL);
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

static void test_inference_calls_from_several_processes_match_the_reference(void **state)
{
	(void)state;
	pid_t pids[NPROC];
	for (int p = 0; p < NPROC; p++) {
		fflush(stderr);
		pids[p] = fork();
		assert_true(pids[p] >= 0);
		if (pids[p] == 0)
			_exit(client_process(p));
	}
	int bad = 0;
	for (int p = 0; p < NPROC; p++) {
		int code = fa_test_waitpid(pids[p], fa_test_ms(150000));
		if (code != 0) {
			fprintf(stderr, "client process %d ended with %d\n", p, code);
			if (code < 0)
				kill(pids[p], SIGKILL), fa_test_waitpid(pids[p], 5000);
			bad++;
		}
	}
	if (bad)
		daemon_log_dump(&g_daemon, 30);
	assert_int_equal(bad, 0);
}

/* One bad index tensor: the status, the detail, and O and lse still all poison. */
static void expect_refused(fa_client *c, struct arena *a, const fa_attn_kvcache_args *args,
                           uint64_t oo, size_t obytes, const char *text)
{
	fa_status st = fa_attn_kvcache(c, args);
	if (st != FA_EINVAL || strstr(fa_last_error_detail(), text) == NULL)
		fail_msg("got %s '%s', want FA_EINVAL '%s'", fa_status_name(st),
		         fa_last_error_detail(), text);
	for (size_t i = 0; i < obytes; i++)
		if ((unsigned char)a->base[oo + i] != 0x7f)
			fail_msg("output byte %zu written after '%s'", i, text);
}

static void test_bad_index_tensors_answered_with_the_entry_and_nothing_written(void **state)
{
	enum { B = 4, Hq = 2, Hkv = 1, D = 8, PS = 16, COLS = 8, PAGES = 512 };
	fa_client *c = NULL;
	struct arena a = {.rng = 77, .size = 2 << 20};
	(void)state;
	assert_int_equal(fa_client_open(&c, g_daemon.url), FA_OK);
	assert_int_equal(fa_buffer_alloc_host(c, a.size, &a.buf), FA_OK);
	a.base = fa_buffer_data(a.buf);
	int32_t lens[B] = {20, 16, 100, 3}, table[B * COLS], cuq[B + 1] = {0, 1, 2, 3, 4};
	for (int i = 0; i < B * COLS; i++)
		table[i] = i;
	uint64_t oq = arena_f32(&a, B * Hq * D, 1), ok = arena_f32(&a, PAGES * PS * Hkv * D, 1);
	uint64_t ov = arena_f32(&a, PAGES * PS * Hkv * D, 1);
	size_t obytes = B * Hq * D * 4 + B * Hq * 4;
	uint64_t oo = arena_out(&a, obytes); /* o, then lse right after it */
	uint64_t ocl = arena_i32(&a, lens, B), opt = arena_i32(&a, table, B * COLS);
	uint64_t ocq = arena_i32(&a, cuq, B + 1);
	fa_attn_kvcache_args args = {
		.q = tensor(&a, oq, B, 1, Hq, D), .o = tensor(&a, oo, B, 1, Hq, D),
		.lse = {a.buf, oo + B * Hq * D * 4, FA_DTYPE_FP32, {B, Hq, 1, 1}, {Hq, 1, 1, 1}},
		.k = tensor(&a, ok, PAGES, PS, Hkv, D), .v = tensor(&a, ov, PAGES, PS, Hkv, D),
		.cache_seqlens = vec(&a, ocl, B),
		.page_table = {a.buf, opt, {B, COLS}, {COLS, 1}},
		.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT,
	};
	int32_t *pt = (int32_t *)(void *)(a.base + opt), *cl = (int32_t *)(void *)(a.base + ocl);
	int32_t *cq = (int32_t *)(void *)(a.base + ocq);

	pt[2 * COLS + 6] = 912; /* sequence 2 (100 keys) uses pages 0..6 */
	expect_refused(c, &a, &args, oo, obytes, "page_table[2][6] = 912: the pools have 512 pages");
	pt[2 * COLS + 6] = -1;
	expect_refused(c, &a, &args, oo, obytes, "page_table[2][6] = -1");
	pt[2 * COLS + 6] = 22;
	pt[3 * COLS + 1] = 99999; /* sequence 3 uses page 0 only: never read, never refused */
	cl[1] = 16 * COLS + 1;
	expect_refused(c, &a, &args, oo, obytes,
	               "cache_seqlens[1] = 129: page_table holds 8 pages of 16 tokens");
	cl[1] = -5;
	expect_refused(c, &a, &args, oo, obytes, "cache_seqlens[1] = -5: lengths must be >= 0");
	cl[1] = 16;
	/* packed queries with decreasing offsets */
	fa_attn_kvcache_args packed = args;
	packed.q = tensor(&a, oq, 1, B, Hq, D);
	packed.o = tensor(&a, oo, 1, B, Hq, D);
	packed.lse = (fa_tensor){a.buf, oo + B * Hq * D * 4, FA_DTYPE_FP32, {1, Hq, B, 1},
	                         {Hq * B, B, 1, 1}};
	packed.cu_seqlens_q = vec(&a, ocq, B + 1);
	cq[2] = 0;
	expect_refused(c, &a, &packed, oo, obytes,
	               "cu_seqlens_q[2] = 0 is below cu_seqlens_q[1] = 1: offsets must not decrease");
	cq[2] = 2;
	/* an index tensor out of its region, misaligned: refused before anything is read */
	fa_attn_kvcache_args far = args;
	far.page_table.offset = a.size - 8;
	assert_int_equal(fa_attn_kvcache(c, &far), FA_ERANGE);
	far.page_table.offset = opt + 2;
	assert_int_equal(fa_attn_kvcache(c, &far), FA_EALIGN);
	/* o over the page table: an overlap */
	fa_attn_kvcache_args over = args;
	over.o.offset = opt;
	assert_int_equal(fa_attn_kvcache(c, &over), FA_EOVERLAP);
	/* a page size the pools may not have */
	fa_attn_kvcache_args small = args;
	small.k = tensor(&a, ok, PAGES * 2, 8, Hkv, D);
	small.v = tensor(&a, ov, PAGES * 2, 8, Hkv, D);
	assert_int_equal(fa_attn_kvcache(c, &small), FA_ESHAPE);
	assert_non_null(strstr(fa_last_error_detail(), "page size 8"));
	/* and with every entry good the same request computes */
	assert_int_equal(fa_attn_kvcache(c, &args), FA_OK);
	const unsigned char poison[4] = {0x7f, 0x7f, 0x7f, 0x7f};
	assert_true(memcmp(a.base + oo, poison, 4) != 0); /* o[0] written this time */
	fa_buffer_free(a.buf);
	fa_client_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_inference_calls_from_several_processes_match_the_reference),
		cmocka_unit_test(test_bad_index_tensors_answered_with_the_entry_and_nothing_written),
	};
	if (getenv("FA_TEST_FILTER"))
		cmocka_set_test_filter(getenv("FA_TEST_FILTER"));
	return cmocka_run_group_tests(tests, setup, teardown);
}
