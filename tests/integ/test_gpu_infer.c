/* test_gpu_infer.c - the inference calls (fa_attn_kvcache, fa_attn_varlen) end to end on the real
 * fa-daemon's GPU backend, through libfaclient: a paged KV-cache decode (bf16, pages of 16 in a
 * shuffled order, lengths 0..4097 with partly filled last pages), a contiguous cache with packed
 * speculative queries (fp16) and a varlen decode batch (fp32), each in device buffers (the index
 * tensors too, and once in a host buffer beside device tensors) and in host buffers, against
 * fa_attn_infer_ref64 computed here from the same bytes; outputs start poisoned and rows outside
 * the sequences must keep their poison. A page index past the pools is FA_EINVAL with the entry
 * named, and no output byte is written. A sliding window (300, 0) with a causal mask and a
 * softcap over the same paged cache goes through the same path (the GPU kernels take both over
 * the layouts), in device and host buffers.
 *
 * CUDA does not survive fork(): as test_gpu_serving.c, every piece of CUDA work runs in a forked
 * child. Without a GPU every test skips with the reason.
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
#include "fa_cudrv.h"
#include "fa_integ.h"

#define ARENA (64u << 20)

static struct fa_daemon g_daemon;
static bool g_no_gpu;

/* A problem laid out in a host mirror of one buffer (device or host): tensors by offset. */
struct arena {
	fa_buffer *buf;  /* tensors' buffer */
	fa_buffer *ibuf; /* index tensors' buffer (buf, or a host buffer beside device tensors) */
	char *base;      /* the mirror (the host buffer itself for host memory) */
	char *ibase;     /* the index tensors' bytes (the mirror, or ibuf's memory) */
	size_t used, iused;
	uint64_t rng;
};

static uint64_t take(size_t *used, size_t bytes)
{
	uint64_t off = (*used + 255) & ~(uint64_t)255;
	*used = off + bytes;
	return off;
}

static uint64_t fill(struct arena *a, fa_dtype dt, size_t n, double amp)
{
	uint64_t off = take(&a->used, n * fa_dtype_size(dt));
	for (size_t i = 0; i < n; i++)
		fa_store_elem(a->base + off, dt, (int64_t)i, amp * (2.0 * fa_rand_uniform(&a->rng) - 1.0));
	return off;
}

static uint64_t poison(struct arena *a, size_t bytes)
{
	uint64_t off = take(&a->used, bytes);
	memset(a->base + off, 0x7f, bytes);
	return off;
}

static fa_index ivec(struct arena *a, const int32_t *v, int64_t n0, int64_t n1)
{
	uint64_t off = take(a->ibuf == a->buf ? &a->used : &a->iused, (size_t)(n0 * n1) * 4);
	memcpy(a->ibase + off, v, (size_t)(n0 * n1) * 4);
	return (fa_index){a->ibuf, off, {n0, n1}, {n1, 1}};
}

static fa_tensor tens(struct arena *a, uint64_t off, fa_dtype dt, int64_t d0, int64_t d1,
                      int64_t d2, int64_t d3)
{
	return (fa_tensor){a->buf, off, dt, {d0, d1, d2, d3}, {d1 * d2 * d3, d2 * d3, d3, 1}};
}

enum { B = 5, PCOLS = 300 };
static const int32_t key_lens[B] = {129, 0, 4097, 1, 1000};
static const int32_t q_lens[B] = {1, 3, 8, 0, 2};

/* Which call: a paged cache (dense queries), a contiguous cache (packed queries), varlen; the
 * paged one with a window and softcap. */
enum kind { PAGED, CACHE_PACKED, VARLEN, BAD_PAGE, PAGED_WIN };

struct prob {
	struct fa_attn_infer_desc d;
	int32_t cuq[B + 1], cuk[B + 1], lens[B], pt[B * PCOLS];
	uint64_t oq, ok, ov, oo, ol;
	int64_t rows; /* query rows of q and o */
	size_t obytes, lbytes;
	bool in_seq[64];
};

/* Lay out one problem in a (and, for device buffers, upload the mirror to mem), make the call;
 * FA_OK or the call's status. */
static fa_status run(fa_client *c, struct arena *a, enum kind k, struct prob *p, cu_ptr mem)
{
	const int Hq = 8, Hkv = 2;
	const int D = k == VARLEN ? 64 : 128;
	const fa_dtype dt = k == VARLEN ? FA_DTYPE_FP32 : k == CACHE_PACKED ? FA_DTYPE_FP16
	                                                                     : FA_DTYPE_BF16;
	const int Sq = 2; /* dense queries */
	memset(p, 0, sizeof *p);
	struct fa_attn_infer_desc *d = &p->d;
	struct fa_attn_fwd_desc *f = &d->fwd;
	f->dtype = dt;
	f->precision = FA_PREC_3XTF32;
	f->mask = k == CACHE_PACKED || k == PAGED_WIN ? FA_MASK_CAUSAL_BOTTOM_RIGHT : FA_MASK_NONE;
	f->scale = 1.0 / sqrt((double)D);
	if (k == PAGED_WIN) {
		f->window = true;
		f->window_left = 300;
		f->window_right = 0;
		f->softcap = 30;
	}
	f->B = B, f->Hq = Hq, f->Hkv = Hkv, f->D = D;
	bool packed_q = k != PAGED && k != BAD_PAGE && k != PAGED_WIN;
	int64_t maxk = 1, maxq = 1;
	p->cuq[0] = 1; /* one row before the first sequence, two after the last */
	p->cuk[0] = 3;
	for (int b = 0; b < B; b++) {
		p->cuq[b + 1] = p->cuq[b] + q_lens[b];
		p->cuk[b + 1] = p->cuk[b] + key_lens[b];
		p->lens[b] = key_lens[b];
		maxk = key_lens[b] > maxk ? key_lens[b] : maxk;
		maxq = q_lens[b] > maxq ? q_lens[b] : maxq;
	}
	p->rows = packed_q ? p->cuq[B] + 2 : (int64_t)B * Sq;
	for (int64_t r = 0; r < p->rows; r++)
		p->in_seq[r] = !packed_q;
	if (packed_q)
		for (int64_t r = p->cuq[0]; r < p->cuq[B]; r++)
			p->in_seq[r] = true;
	a->used = a->iused = 0;
	size_t es = fa_dtype_size(dt);
	p->oq = fill(a, dt, (size_t)(p->rows * Hq * D), 1.5);
	p->obytes = (size_t)(p->rows * Hq * D) * es;
	p->lbytes = (size_t)(p->rows * Hq) * 4;
	int64_t kq0 = packed_q ? 1 : B, kq1 = packed_q ? p->rows : Sq;
	int64_t k0, k1;
	if (k == VARLEN) {
		k0 = 1, k1 = p->cuk[B] + 4;
	} else if (k == CACHE_PACKED) {
		k0 = B, k1 = maxk + 5;
	} else {
		/* pages of 16, handed out in a shuffled order with spares */
		int used = 0;
		for (int b = 0; b < B; b++)
			used += (key_lens[b] + 15) / 16;
		k0 = used + 7, k1 = 16;
		int32_t *perm = malloc(sizeof(int32_t) * (size_t)k0);
		for (int i = 0; i < k0; i++)
			perm[i] = i;
		for (int i = (int)k0 - 1; i > 0; i--) {
			int j = (int)fa_rand_range(&a->rng, 0, i), t = perm[i];
			perm[i] = perm[j], perm[j] = t;
		}
		int next = 0;
		for (int b = 0; b < B; b++)
			for (int col = 0; col < PCOLS; col++)
				p->pt[b * PCOLS + col] = col * 16 < key_lens[b] ? perm[next++] : -99;
		free(perm);
		if (k == BAD_PAGE)
			p->pt[4 * PCOLS + 10] = (int32_t)k0; /* sequence 4's eleventh page */
	}
	p->ok = fill(a, dt, (size_t)(k0 * k1 * Hkv * D), 1.5);
	p->ov = fill(a, dt, (size_t)(k0 * k1 * Hkv * D), 1.0);
	p->oo = poison(a, p->obytes);
	p->ol = poison(a, p->lbytes);
	fa_tensor q = tens(a, p->oq, dt, kq0, kq1, Hq, D), o = tens(a, p->oo, dt, kq0, kq1, Hq, D);
	fa_tensor kt = tens(a, p->ok, dt, k0, k1, Hkv, D), vt = tens(a, p->ov, dt, k0, k1, Hkv, D);
	fa_tensor l = {a->buf, p->ol, FA_DTYPE_FP32, {kq0, Hq, kq1, 1}, {Hq * kq1, kq1, 1, 1}};
	/* the host descriptor the oracle reads */
	int64_t qs[3] = {kq1 * Hq * D, Hq * D, D}, ks[3] = {k1 * Hkv * D, Hkv * D, D};
	int64_t ls[3] = {Hq * kq1, kq1, 1};
	memcpy(f->q_stride, qs, sizeof qs), memcpy(f->o_stride, qs, sizeof qs);
	memcpy(f->k_stride, ks, sizeof ks), memcpy(f->v_stride, ks, sizeof ks);
	memcpy(f->lse_stride, ls, sizeof ls);
	f->Sq = packed_q ? maxq : Sq;
	f->Sk = maxk;
	if (packed_q)
		d->cu_q = p->cuq, d->total_q = p->rows;
	fa_attn_varlen_args va = {.q = q, .k = kt, .v = vt, .o = o, .lse = l, .mask = f->mask,
	                          .precision = f->precision};
	fa_attn_kvcache_args ka = {.q = q, .k = kt, .v = vt, .o = o, .lse = l, .mask = f->mask,
	                           .precision = f->precision, .window = f->window,
	                           .window_left = f->window_left,
	                           .window_right = f->window_right, .softcap = f->softcap};
	if (k == VARLEN) {
		d->kv = FA_KV_PACKED, d->cu_k = p->cuk, d->total_k = k1;
		va.cu_seqlens_q = ivec(a, p->cuq, B + 1, 1);
		va.cu_seqlens_k = ivec(a, p->cuk, B + 1, 1);
	} else {
		d->seqlens_k = p->lens;
		ka.cache_seqlens = ivec(a, p->lens, B, 1);
		if (k == CACHE_PACKED) {
			d->kv = FA_KV_CACHE, d->cache_rows = k1;
			ka.cu_seqlens_q = ivec(a, p->cuq, B + 1, 1);
		} else {
			d->kv = FA_KV_PAGED, d->page_table = p->pt, d->pt_cols = PCOLS, d->pages = k0;
			d->page_size = 16;
			ka.page_table = ivec(a, p->pt, B, PCOLS);
		}
	}
	/* a pageable upload may return before its DMA lands: the API asks inputs finished */
	if (mem && (cu.MemcpyHtoD(mem, a->base, a->used) != 0 || cu.StreamSynchronize(NULL) != 0))
		return FA_EDEVICE;
	return k == VARLEN ? fa_attn_varlen(c, &va) : fa_attn_kvcache(c, &ka);
}

/* The output in the mirror against the oracle: sequence rows within tolerance, the others (and
 * their lse) still poisoned. */
static int check(struct arena *a, const struct prob *p, const char *what)
{
	const struct fa_attn_infer_desc *d = &p->d;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	const int64_t Hq = f->Hq, D = f->D;
	size_t es = fa_dtype_size(f->dtype);
	double *o64 = malloc(sizeof(double) * (size_t)(p->rows * Hq * D));
	double *l64 = malloc(sizeof(double) * (size_t)(p->rows * Hq));
	CHECK(fa_attn_infer_ref64(d, a->base + p->oq, a->base + p->ok, a->base + p->ov, o64, l64) ==
	          FA_OK, "%s: reference", what);
	double num = 0, den = 0;
	const char *o = a->base + p->oo;
	const float *l = (const float *)(const void *)(a->base + p->ol);
	for (int64_t r = 0; r < p->rows; r++)
		for (int64_t h = 0; h < Hq; h++) {
			int64_t at = (r * Hq + h) * D; /* q, o are [rows][Hq][D] either way */
			int64_t la = d->cu_q ? h * p->rows + r : ((r / f->Sq) * Hq + h) * f->Sq + r % f->Sq;
			if (!p->in_seq[r]) {
				for (size_t e = 0; e < (size_t)D * es; e++)
					CHECK((unsigned char)o[at * (int64_t)es + (int64_t)e] == 0x7f,
					      "%s: row %lld outside the sequences was written", what,
					      (long long)r);
				uint32_t lb;
				memcpy(&lb, &l[la], 4);
				CHECK(lb == 0x7f7f7f7fu, "%s: lse of row %lld was written", what, (long long)r);
				continue;
			}
			for (int64_t e = 0; e < D; e++) {
				double x = fa_load_elem(o, f->dtype, at + e), y = o64[at + e];
				CHECK(isfinite(x), "%s: row %lld head %lld: %g", what, (long long)r,
				      (long long)h, x);
				num += (x - y) * (x - y);
				den += y * y;
			}
			double rl = l64[la];
			if (isinf(rl))
				CHECK(isinf(l[la]) && l[la] < 0, "%s: lse %g, want -inf", what, l[la]);
			else
				CHECK(fabs(l[la] - rl) <= 2e-4, "%s: lse %g, want %g", what, l[la], rl);
		}
	double rel = den > 0 ? sqrt(num / den) : 0;
	double tol = f->dtype == FA_DTYPE_BF16 ? 1e-2 : f->dtype == FA_DTYPE_FP16 ? 2e-3 : 1e-5;
	fprintf(stderr, "  %s: relative error %.3g (tol %.0e)\n", what, rel, tol);
	CHECK(rel <= tol, "%s: relative error %g over %g", what, rel, tol);
	free(o64);
	free(l64);
	return 0;
}

static fa_client *open_client(void)
{
	fa_client *c = NULL;
	if (fa_client_open(&c, g_daemon.url) != FA_OK)
		return NULL;
	fa_client_set_timeout(c, fa_test_ms(120000));
	return c;
}

/* Device buffers: the mirror uploaded before the call and downloaded after. idx_host: the index
 * tensors in a host buffer beside the device tensors. */
static int device_round(fa_client *c, cu_ptr mem, fa_buffer *db, fa_buffer *hb, char *mirror,
                        enum kind k, bool idx_host, const char *what)
{
	struct arena a = {.buf = db, .ibuf = idx_host ? hb : db, .base = mirror,
	                  .ibase = idx_host ? fa_buffer_data(hb) : mirror, .rng = 0x1234u + k};
	struct prob *p = malloc(sizeof *p);
	CHECK(p != NULL, "malloc");
	fa_status st = run(c, &a, k, p, mem);
	if (k == BAD_PAGE) {
		CHECK(st == FA_EINVAL, "%s: %s (%s), want FA_EINVAL", what, fa_status_name(st),
		      fa_last_error_detail());
		CHECK(strstr(fa_last_error_detail(), "page_table[4][10]") != NULL, "%s: detail %s",
		      what, fa_last_error_detail());
		fprintf(stderr, "  %s: %s\n", what, fa_last_error_detail());
	} else {
		CHECK(st == FA_OK, "%s: %s (%s)", what, fa_status_name(st), fa_last_error_detail());
	}
	/* the outputs back into the mirror: the poison (0x7f) survives outside the sequences, and
	 * everywhere for the refused call */
	CHECK(cu.MemcpyDtoH(mirror + p->oo, mem + p->oo, p->obytes) == 0 &&
	          cu.MemcpyDtoH(mirror + p->ol, mem + p->ol, p->lbytes) == 0, "download");
	if (k == BAD_PAGE) {
		for (size_t i = 0; i < p->obytes; i++)
			CHECK((unsigned char)mirror[p->oo + i] == 0x7f, "%s: O written", what);
	} else if (check(&a, p, what) != 0) {
		return 1;
	}
	free(p);
	return 0;
}

static int child_device(void *arg)
{
	(void)arg;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open: %s", fa_last_error_detail());
	cu_ptr mem = 0;
	fa_buffer *db = NULL, *hb = NULL;
	CHECK(cu.MemAlloc(&mem, ARENA) == 0, "cuMemAlloc");
	CHECK(fa_buffer_register_device(c, (void *)(uintptr_t)mem, ARENA, &db) == FA_OK,
	      "register_device: %s", fa_last_error_detail());
	CHECK(fa_buffer_alloc_host(c, 1 << 20, &hb) == FA_OK, "alloc_host: %s",
	      fa_last_error_detail());
	char *mirror = calloc(1, ARENA);
	CHECK(mirror != NULL, "malloc");
	static const struct {
		enum kind k;
		bool idx_host;
		const char *what;
	} rounds[] = {
		{PAGED, false, "device paged bf16 (tables on the device)"},
		{CACHE_PACKED, false, "device cache fp16 packed queries causal"},
		{VARLEN, false, "device varlen fp32"},
		{PAGED, true, "device paged bf16 (tables in a host buffer)"},
		{BAD_PAGE, false, "device paged, a page past the pools"},
		{PAGED, false, "device paged bf16 again (the daemon serves on)"},
		{PAGED_WIN, false, "device paged bf16, window (300, 0) causal, softcap 30"},
	};
	for (size_t i = 0; i < sizeof rounds / sizeof rounds[0]; i++)
		if (device_round(c, mem, db, hb, mirror, rounds[i].k, rounds[i].idx_host,
		                 rounds[i].what) != 0)
			return 1;
	free(mirror);
	fa_buffer_free(db);
	fa_buffer_free(hb);
	cu.MemFree(mem);
	fa_client_close(c);
	return 0;
}

static int child_host(void *arg)
{
	(void)arg;
	fa_client *c = open_client();
	CHECK(c != NULL, "fa_client_open: %s", fa_last_error_detail());
	fa_buffer *hb = NULL;
	CHECK(fa_buffer_alloc_host(c, ARENA, &hb) == FA_OK, "alloc_host: %s",
	      fa_last_error_detail());
	static const enum kind kinds[] = {PAGED, CACHE_PACKED, VARLEN, BAD_PAGE, PAGED_WIN};
	static const char *const names[] = {"host paged bf16", "host cache fp16 packed causal",
	                                    "host varlen fp32", "host paged, a page past the pools",
	                                    "host paged bf16, window (300, 0) causal, softcap 30"};
	for (int i = 0; i < 5; i++) {
		struct arena a = {.buf = hb, .ibuf = hb, .base = fa_buffer_data(hb),
		                  .ibase = fa_buffer_data(hb), .rng = 0x777u + (uint64_t)i};
		struct prob *p = malloc(sizeof *p);
		fa_status st = run(c, &a, kinds[i], p, 0);
		if (kinds[i] == BAD_PAGE) {
			CHECK(st == FA_EINVAL && strstr(fa_last_error_detail(), "page_table[4][10]"),
			      "%s: %s (%s)", names[i], fa_status_name(st), fa_last_error_detail());
			for (size_t j = 0; j < p->obytes; j++)
				CHECK((unsigned char)a.base[p->oo + j] == 0x7f, "%s: O written", names[i]);
		} else {
			CHECK(st == FA_OK, "%s: %s (%s)", names[i], fa_status_name(st),
			      fa_last_error_detail());
			if (check(&a, p, names[i]) != 0)
				return 1;
		}
		free(p);
	}
	fa_buffer_free(hb);
	fa_client_close(c);
	return 0;
}

static void test_gpu_infer_device_buffers_match_reference(void **state)
{
	(void)state;
	if (g_no_gpu) {
		printf("skipped: no GPU (no CUDA driver, or it sees no device)\n");
		skip();
	}
	assert_int_equal(fa_cu_in_child(child_device, NULL, 300000, 0), 0);
}

static void test_gpu_infer_host_buffers_match_reference(void **state)
{
	(void)state;
	if (g_no_gpu) {
		printf("skipped: no GPU (no CUDA driver, or it sees no device)\n");
		skip();
	}
	assert_int_equal(fa_cu_in_child(child_host, NULL, 300000, -1), 0);
}

/* have_gpu() initialises CUDA: ask in a child so this process stays fork-safe. */
static int child_have_gpu(void)
{
	fflush(stderr);
	pid_t p = fork();
	if (p < 0)
		return 0;
	if (p == 0)
		_exit(have_gpu() ? 0 : 1);
	return fa_test_waitpid(p, fa_test_ms(60000)) == 0;
}

static int setup(void **state)
{
	(void)state;
	if (!child_have_gpu()) {
		g_no_gpu = true;
		fprintf(stderr, "test_gpu_infer: every test skips: no GPU\n");
		return 0;
	}
	int r = daemon_start(&g_daemon, "--backend", "gpu", NULL);
	if (r != 0) {
		fprintf(stderr, "daemon_start --backend gpu: %d (status %d)\n", r, g_daemon.status);
		daemon_log_dump(&g_daemon, 40);
		return -1;
	}
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	if (g_no_gpu)
		return 0;
	return daemon_finish(&g_daemon);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gpu_infer_device_buffers_match_reference),
		cmocka_unit_test(test_gpu_infer_host_buffers_match_reference),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
