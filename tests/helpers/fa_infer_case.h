/* fa_infer_case.h - one inference problem in one client buffer, for the asynchronous tests and
 * the bench (tests/integ/test_gpu_async.c, tests/bench/bench_async.c): a paged KV-cache decode
 * (one query per sequence; the cache lengths and the block table are int32 tables in the same
 * buffer, so a device buffer makes them device tables) or a variable-length batch (cu_seqlens
 * in the buffer). Each step's image differs in its inputs and in its tables, so a kernel that
 * read a table or an input out of stream order shows up as a different result.
 *
 * Header-only, like fa_case.h.
 */
#ifndef FA_INFER_CASE_H
#define FA_INFER_CASE_H

#include "fa_case.h"

/* kvcache: B sequences, one query each, against pools of `pages` pages of `page` rows, block
 * table B x pt_cols. varlen: B sequences packed (total_q query rows, total_k key rows). */
struct fa_infer_case {
	bool varlen;
	fa_dtype dtype;
	int64_t B, Hq, Hkv, D;
	int64_t page, pages, pt_cols; /* kvcache */
	int64_t total_q, total_k;     /* varlen */
};

struct fa_infer_layout {
	uint64_t q, k, v, o, lse, t0, t1; /* t0: cache lengths or cu_q; t1: block table or cu_k */
	int64_t q_rows, k_rows, k_n0;     /* q/o rows per sequence view; k rows; k dim 0 */
	size_t q_bytes, k_bytes, o_bytes, lse_bytes, total;
};

static inline void fa_infer_layout(const struct fa_infer_case *c, struct fa_infer_layout *l)
{
	size_t es = fa_dtype_size(c->dtype);
	int64_t qn = c->varlen ? c->total_q : c->B;
	int64_t kn = c->varlen ? c->total_k : c->pages * c->page;
	uint64_t off = FA_CASE_BASE;
	memset(l, 0, sizeof *l);
	l->q_bytes = (size_t)(qn * c->Hq * c->D) * es;
	l->k_bytes = (size_t)(kn * c->Hkv * c->D) * es;
	l->o_bytes = l->q_bytes;
	l->lse_bytes = (size_t)(qn * c->Hq) * 4;
#define FA_IC_TAKE(field, n) (l->field = off, off = fa_case_round_up(off + (n), FA_CASE_ALIGN))
	FA_IC_TAKE(q, l->q_bytes);
	FA_IC_TAKE(k, l->k_bytes);
	FA_IC_TAKE(v, l->k_bytes);
	FA_IC_TAKE(o, l->o_bytes);
	FA_IC_TAKE(lse, l->lse_bytes);
	FA_IC_TAKE(t0, (size_t)(c->B + 1) * 4);
	FA_IC_TAKE(t1, c->varlen ? (size_t)(c->B + 1) * 4 : (size_t)(c->B * c->pt_cols) * 4);
#undef FA_IC_TAKE
	l->total = (size_t)off;
}

/* Random inputs and tables for `step`, outputs poisoned (0xff bytes). Lengths: 1 .. capacity
 * for the cache; for varlen, random cuts of total_q and total_k (empty sequences included). */
static inline void fa_infer_fill(const struct fa_infer_case *c, const struct fa_infer_layout *l,
                                 void *data, uint64_t *rng)
{
	char *b = data;
	size_t es = fa_dtype_size(c->dtype);
	fa_case_fill_dt(b + l->q, c->dtype, l->q_bytes / es, rng);
	fa_case_fill_dt(b + l->k, c->dtype, l->k_bytes / es, rng);
	fa_case_fill_dt(b + l->v, c->dtype, l->k_bytes / es, rng);
	memset(b + l->o, 0xff, l->o_bytes);
	memset(b + l->lse, 0xff, l->lse_bytes);
	int32_t *t0 = (int32_t *)(void *)(b + l->t0), *t1 = (int32_t *)(void *)(b + l->t1);
	if (c->varlen) {
		int64_t nq = c->total_q, nk = c->total_k;
		t0[0] = t1[0] = 0;
		for (int64_t i = 1; i < c->B; i++) {
			t0[i] = (int32_t)(fa_rand_next(rng) % (uint64_t)(nq + 1));
			t1[i] = (int32_t)(fa_rand_next(rng) % (uint64_t)(nk + 1));
		}
		/* sort each (insertion: B is small) so the offsets never decrease */
		for (int64_t i = 1; i < c->B; i++)
			for (int64_t j = i; j > 1 && t0[j] < t0[j - 1]; j--) {
				int32_t x = t0[j];
				t0[j] = t0[j - 1], t0[j - 1] = x;
			}
		for (int64_t i = 1; i < c->B; i++)
			for (int64_t j = i; j > 1 && t1[j] < t1[j - 1]; j--) {
				int32_t x = t1[j];
				t1[j] = t1[j - 1], t1[j - 1] = x;
			}
		t0[c->B] = (int32_t)nq;
		t1[c->B] = (int32_t)nk;
		return;
	}
	int64_t cap = c->page * c->pt_cols;
	for (int64_t i = 0; i < c->B; i++)
		t0[i] = (int32_t)(1 + fa_rand_next(rng) % (uint64_t)cap);
	for (int64_t i = 0; i < c->B * c->pt_cols; i++)
		t1[i] = (int32_t)(fa_rand_next(rng) % (uint64_t)c->pages);
}

static inline fa_tensor fa_infer_t(fa_buffer *b, uint64_t off, fa_dtype dt, int64_t n0,
                                   int64_t n1, int64_t h, int64_t d)
{
	fa_tensor t = {b, off, dt, {n0, n1, h, d}, {n1 * h * d, h * d, d, 1}};
	return t;
}

/* The kvcache call's arguments in buffer b (every tensor and table in it). */
static inline void fa_infer_kvcache_args(const struct fa_infer_case *c,
                                         const struct fa_infer_layout *l, fa_buffer *b,
                                         fa_attn_kvcache_args *a)
{
	memset(a, 0, sizeof *a);
	a->q = fa_infer_t(b, l->q, c->dtype, c->B, 1, c->Hq, c->D);
	a->o = fa_infer_t(b, l->o, c->dtype, c->B, 1, c->Hq, c->D);
	a->k = fa_infer_t(b, l->k, c->dtype, c->pages, c->page, c->Hkv, c->D);
	a->v = fa_infer_t(b, l->v, c->dtype, c->pages, c->page, c->Hkv, c->D);
	a->lse = (fa_tensor){b, l->lse, FA_DTYPE_FP32, {c->B, c->Hq, 1, 1}, {c->Hq, 1, 1, 1}};
	a->cache_seqlens = (fa_index){b, l->t0, {c->B, 1}, {1, 1}};
	a->page_table = (fa_index){b, l->t1, {c->B, c->pt_cols}, {c->pt_cols, 1}};
	a->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
}

/* The varlen call's arguments in buffer b. */
static inline void fa_infer_varlen_args(const struct fa_infer_case *c,
                                        const struct fa_infer_layout *l, fa_buffer *b,
                                        fa_attn_varlen_args *a)
{
	memset(a, 0, sizeof *a);
	a->q = fa_infer_t(b, l->q, c->dtype, 1, c->total_q, c->Hq, c->D);
	a->o = fa_infer_t(b, l->o, c->dtype, 1, c->total_q, c->Hq, c->D);
	a->k = fa_infer_t(b, l->k, c->dtype, 1, c->total_k, c->Hkv, c->D);
	a->v = fa_infer_t(b, l->v, c->dtype, 1, c->total_k, c->Hkv, c->D);
	a->lse = (fa_tensor){b, l->lse, FA_DTYPE_FP32, {1, c->Hq, c->total_q, 1},
	                     {c->Hq * c->total_q, c->total_q, 1, 1}};
	a->cu_seqlens_q = (fa_index){b, l->t0, {c->B + 1, 1}, {1, 1}};
	a->cu_seqlens_k = (fa_index){b, l->t1, {c->B + 1, 1}, {1, 1}};
	a->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
}

#endif /* FA_INFER_CASE_H */
