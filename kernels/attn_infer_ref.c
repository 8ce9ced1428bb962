/* attn_infer_ref.c - the CPU reference of the inference shapes (fa_attn_infer.h): varlen batches
 * and KV caches, contiguous or paged.
 *
 * Each sequence is exactly the dense problem of its own lengths: a descriptor with B = 1 whose
 * pointers start at the sequence's first row, run by the forward reference's driver (so the
 * arithmetic, and the result, is fa_attn_fwd_ref's bit for bit), with paged keys read through the
 * sequence's row of the page table. The checks come first and cover every index entry that is
 * read: this file is also the daemon's CPU backend, and an offset or page index from a client is
 * how a request would read outside its region.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "attn_ref_int.h"
#include "fa_attn_infer.h"
#include "fa_err.h"

/* Does a product of sizes fit in int64 (element indices are int64)? */
static bool infer_fits(int64_t a, int64_t b, int64_t c, int64_t d)
{
	int64_t r;
	return !__builtin_mul_overflow(a, b, &r) && !__builtin_mul_overflow(r, c, &r) &&
	       !__builtin_mul_overflow(r, d, &r);
}

/* Cumulative offsets cu[0..B] (name: "cu_seqlens_q"): start >= 0, never decrease, end within
 * total, each length <= max ("max_seqlen_q"). */
static fa_status check_offsets(const char *name, const int32_t *cu, int64_t B, int64_t total,
                               int64_t max, const char *max_name, char *err, size_t errlen)
{
	if (cu == NULL)
		return fa_err(err, errlen, FA_EINVAL, "%s: no offsets", name);
	if (cu[0] < 0)
		return fa_err(err, errlen, FA_EINVAL, "%s[0] = %" PRId32 ": offsets must be >= 0",
		              name, cu[0]);
	for (int64_t b = 0; b < B; b++) {
		if (cu[b + 1] < cu[b])
			return fa_err(err, errlen, FA_EINVAL,
			              "%s[%" PRId64 "] = %" PRId32 " is below %s[%" PRId64
			              "] = %" PRId32 ": offsets must not decrease",
			              name, b + 1, cu[b + 1], name, b, cu[b]);
		if ((int64_t)cu[b + 1] - cu[b] > max)
			return fa_err(err, errlen, FA_EINVAL,
			              "%s: sequence %" PRId64 " has %" PRId64 " tokens, more than %s %" PRId64,
			              name, b, (int64_t)cu[b + 1] - cu[b], max_name, max);
	}
	if (cu[B] > total)
		return fa_err(err, errlen, FA_EINVAL,
		              "%s[%" PRId64 "] = %" PRId32 ": past the %" PRId64 " rows of the packed tensor",
		              name, B, cu[B], total);
	return FA_OK;
}

/* Cache lengths and, for a paged cache, every page a sequence uses. */
static fa_status check_cache(const struct fa_attn_infer_desc *d, char *err, size_t errlen)
{
	int64_t B = d->fwd.B, Sk = d->fwd.Sk;
	bool paged = d->kv == FA_KV_PAGED;

	if (d->seqlens_k == NULL)
		return fa_err(err, errlen, FA_EINVAL, "cache_seqlens: no lengths");
	if (paged) {
		if (d->page_table == NULL)
			return fa_err(err, errlen, FA_EINVAL, "page_table: no table");
		if (d->page_size < FA_PAGE_SIZE_MIN || d->page_size > FA_PAGE_SIZE_MAX)
			return fa_err(err, errlen, FA_ESHAPE,
			              "page size %" PRId64 ": pages hold %d to %d tokens", d->page_size,
			              FA_PAGE_SIZE_MIN, FA_PAGE_SIZE_MAX);
		if (d->pages < 1 || d->pt_cols < 1)
			return fa_err(err, errlen, FA_ESHAPE,
			              "paged cache of %" PRId64 " pages, %" PRId64 " per sequence: both "
			              "must be >= 1", d->pages, d->pt_cols);
		if (!infer_fits(d->pages, d->page_size, d->fwd.Hkv, d->fwd.D) ||
		    !infer_fits(B, d->pt_cols, d->page_size, 1))
			return fa_err(err, errlen, FA_ESHAPE, "the paged cache has more than 2^63 elements");
	} else {
		if (d->cache_rows < 1 || !infer_fits(B, d->cache_rows, d->fwd.Hkv, d->fwd.D))
			return fa_err(err, errlen, FA_ESHAPE,
			              "cache of %" PRId64 " rows per sequence: must be >= 1 and its "
			              "elements fewer than 2^63", d->cache_rows);
	}
	int64_t room = paged ? d->pt_cols * d->page_size : d->cache_rows;
	for (int64_t b = 0; b < B; b++) {
		int64_t n = d->seqlens_k[b];
		if (n < 0)
			return fa_err(err, errlen, FA_EINVAL,
			              "cache_seqlens[%" PRId64 "] = %" PRId64 ": lengths must be >= 0", b,
			              n);
		if (n > room) {
			if (paged)
				return fa_err(err, errlen, FA_EINVAL,
				              "cache_seqlens[%" PRId64 "] = %" PRId64 ": page_table holds "
				              "%" PRId64 " pages of %" PRId64 " tokens per sequence (%" PRId64
				              ")", b, n, d->pt_cols, d->page_size, room);
			return fa_err(err, errlen, FA_EINVAL,
			              "cache_seqlens[%" PRId64 "] = %" PRId64 ": the cache holds %" PRId64
			              " rows per sequence", b, n, room);
		}
		if (n > Sk)
			return fa_err(err, errlen, FA_EINVAL,
			              "cache_seqlens[%" PRId64 "] = %" PRId64 ": more than max_seqlen_k %" PRId64,
			              b, n, Sk);
		if (!paged)
			continue;
		/* Only the pages the sequence uses are read: padding entries may hold anything. */
		for (int64_t p = 0; p < (n + d->page_size - 1) / d->page_size; p++) {
			int32_t pg = d->page_table[b * d->pt_cols + p];
			if (pg < 0 || pg >= d->pages)
				return fa_err(err, errlen, FA_EINVAL,
				              "page_table[%" PRId64 "][%" PRId64 "] = %" PRId32
				              ": the pools have %" PRId64 " pages",
				              b, p, pg, d->pages);
		}
	}
	return FA_OK;
}

/* Check an inference descriptor; see fa_attn_infer.h. */
fa_status fa_attn_infer_check(const struct fa_attn_infer_desc *d, char *err, size_t errlen)
{
	fa_status st;

	if (d == NULL)
		return fa_err(err, errlen, FA_EINVAL, "no descriptor");
	if ((st = fa_attn_fwd_check(&d->fwd, err, errlen)) != FA_OK)
		return st;
	int64_t B = d->fwd.B;
	if (B >= INT32_MAX)
		return fa_err(err, errlen, FA_ESHAPE, "%" PRId64 " sequences: at most 2^31 - 2", B);
	if (d->cu_q != NULL) {
		if (d->total_q < 1 || !infer_fits(d->total_q, d->fwd.Hq, d->fwd.D, 1))
			return fa_err(err, errlen, FA_ESHAPE,
			              "packed queries: %" PRId64 " rows (must be >= 1, elements < 2^63)",
			              d->total_q);
		if ((st = check_offsets("cu_seqlens_q", d->cu_q, B, d->total_q, d->fwd.Sq,
		                        "max_seqlen_q", err, errlen)) != FA_OK)
			return st;
	}
	switch (d->kv) {
	case FA_KV_PACKED:
		if (d->total_k < 1 || !infer_fits(d->total_k, d->fwd.Hkv, d->fwd.D, 1))
			return fa_err(err, errlen, FA_ESHAPE,
			              "packed keys: %" PRId64 " rows (must be >= 1, elements < 2^63)",
			              d->total_k);
		return check_offsets("cu_seqlens_k", d->cu_k, B, d->total_k, d->fwd.Sk,
		                     "max_seqlen_k", err, errlen);
	case FA_KV_CACHE:
	case FA_KV_PAGED:
		return check_cache(d, err, errlen);
	}
	return fa_err(err, errlen, FA_EINVAL, "key layout %d is unknown", (int)d->kv);
}

/* Query and key counts of sequence b. */
void fa_attn_infer_lengths(const struct fa_attn_infer_desc *d, int64_t b, int64_t *sq,
                           int64_t *sk)
{
	*sq = d->cu_q != NULL ? (int64_t)d->cu_q[b + 1] - d->cu_q[b] : d->fwd.Sq;
	*sk = d->kv == FA_KV_PACKED ? (int64_t)d->cu_k[b + 1] - d->cu_k[b] : d->seqlens_k[b];
}

/* Where sequence b starts, in elements of each tensor, and its page-table row. */
struct infer_seq {
	int64_t sq, sk;
	int64_t q, k, v, o, lse; /* element offsets of the first row */
	int64_t row;             /* dense-oracle row of the first query (o64) */
	struct ref_pages pages;  /* .table NULL: not paged */
};

static void infer_seq_at(const struct fa_attn_infer_desc *d, int64_t b, struct infer_seq *s)
{
	const struct fa_attn_fwd_desc *f = &d->fwd;

	memset(s, 0, sizeof(*s));
	fa_attn_infer_lengths(d, b, &s->sq, &s->sk);
	if (d->cu_q != NULL) {
		s->q = f->q_stride[1] * d->cu_q[b];
		s->o = f->o_stride[1] * d->cu_q[b];
		s->lse = f->lse_stride[2] * d->cu_q[b];
		s->row = d->cu_q[b];
	} else {
		s->q = f->q_stride[0] * b;
		s->o = f->o_stride[0] * b;
		s->lse = f->lse_stride[0] * b;
		s->row = b * f->Sq;
	}
	switch (d->kv) {
	case FA_KV_PACKED:
		s->k = f->k_stride[1] * d->cu_k[b];
		s->v = f->v_stride[1] * d->cu_k[b];
		break;
	case FA_KV_CACHE:
		s->k = f->k_stride[0] * b;
		s->v = f->v_stride[0] * b;
		break;
	case FA_KV_PAGED:
		s->pages.table = d->page_table + b * d->pt_cols;
		s->pages.page_size = d->page_size;
		break;
	}
}

/* The shared driver: every sequence with a head in [u0, u1); out's pointers are those of the
 * whole batch (o, lse in dtype, or the dense oracle when o64 is set). */
static fa_status infer_run(const struct fa_attn_infer_desc *d, const void *q, const void *k,
                           const void *v, const struct ref_out *out, int64_t u0, int64_t u1)
{
	const struct fa_attn_fwd_desc *f = &d->fwd;
	size_t es = fa_dtype_size(f->dtype);
	fa_status st;

	if (q == NULL || k == NULL || v == NULL)
		return FA_EINVAL;
	if ((st = fa_attn_infer_check(d, NULL, 0)) != FA_OK)
		return st;
	int64_t Hq = f->Hq, nu = f->B * Hq; /* fits: fa_attn_fwd_check bounded B*Sq*Hq*D */
	if (u0 < 0 || u1 < u0 || u1 > nu)
		return FA_EINVAL;
	for (int64_t b = u0 / Hq; u1 > u0 && b <= (u1 - 1) / Hq; b++) {
		int64_t h0 = u0 - b * Hq > 0 ? u0 - b * Hq : 0;
		int64_t h1 = u1 - b * Hq < Hq ? u1 - b * Hq : Hq;
		struct infer_seq s;
		infer_seq_at(d, b, &s);
		if (s.sq == 0)
			continue;
		struct ref_out so = *out;
		if (out->o64 != NULL) {
			so.o64 = out->o64 + s.row * Hq * f->D;
			if (out->lse64 != NULL) {
				/* packed: [Hq, total_q]; dense: [B, Hq, Sq] */
				int64_t hs = d->cu_q != NULL ? d->total_q : f->Sq;
				so.lse64 = out->lse64 + (d->cu_q != NULL ? s.row : b * Hq * f->Sq);
				so.lse64_stride[0] = 0;
				so.lse64_stride[1] = hs;
				so.lse64_stride[2] = 1;
			}
		} else {
			so.o = (char *)out->o + es * (size_t)s.o;
			if (out->lse != NULL)
				so.lse = out->lse + s.lse;
		}
		if (s.sk == 0) {
			/* No key at all (an empty cache): every row sees nothing. */
			for (int64_t h = h0; h < h1; h++)
				for (int64_t i = 0; i < s.sq; i++) {
					if (so.o64 != NULL) {
						memset(so.o64 + (i * Hq + h) * f->D, 0,
						       (size_t)f->D * sizeof(double));
						if (so.lse64 != NULL)
							so.lse64[so.lse64_stride[1] * h + i] = -INFINITY;
						continue;
					}
					int64_t oo = f->o_stride[1] * i + f->o_stride[2] * h;
					for (int64_t x = 0; x < f->D; x++)
						fa_store_elem(so.o, f->dtype, oo + x, 0.0);
					if (so.lse != NULL)
						so.lse[f->lse_stride[1] * h + f->lse_stride[2] * i] = -INFINITY;
				}
			continue;
		}
		struct fa_attn_fwd_desc sd = *f;
		sd.B = 1;
		sd.Sq = s.sq;
		sd.Sk = s.sk;
		st = ref_fwd_run(&sd, (const char *)q + es * (size_t)s.q,
		                 (const char *)k + es * (size_t)s.k, (const char *)v + es * (size_t)s.v,
		                 &so, s.pages.table != NULL ? &s.pages : NULL, h0, h1);
		if (st != FA_OK)
			return st;
	}
	return FA_OK;
}

/* The CPU reference, O in dtype; see fa_attn_infer.h. */
fa_status fa_attn_infer_ref(const struct fa_attn_infer_desc *d, const void *q, const void *k,
                            const void *v, void *o, float *lse, int64_t unit_begin,
                            int64_t unit_end)
{
	struct ref_out out = {.o = o, .lse = lse};

	if (d == NULL || o == NULL)
		return FA_EINVAL;
	return infer_run(d, q, k, v, &out, unit_begin, unit_end);
}

/* The float64 oracle, dense outputs; see fa_attn_infer.h. */
fa_status fa_attn_infer_ref64(const struct fa_attn_infer_desc *d, const void *q, const void *k,
                              const void *v, double *o64, double *lse64)
{
	struct ref_out out = {.o64 = o64, .lse64 = lse64};
	fa_status st;

	if (d == NULL || o64 == NULL)
		return FA_EINVAL;
	if ((st = fa_attn_infer_check(d, NULL, 0)) != FA_OK)
		return st;
	return infer_run(d, q, k, v, &out, 0, d->fwd.B * d->fwd.Hq);
}
