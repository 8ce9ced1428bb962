/* attn_ref_int.h - what the forward and backward CPU references share: which keys a row sees and
 * how a head row is read. Internal to kernels/ (attn_fwd_ref.c, attn_bwd_ref.c,
 * attn_infer_ref.c); static inline, so each reference keeps its loops in one file, but for the
 * forward's driver, which the inference reference runs per sequence.
 */
#ifndef FA_ATTN_REF_INT_H
#define FA_ATTN_REF_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "fa_attn.h"

/* Number of keys query row i sees: masks are prefixes, [0, n). Agrees with fa_mask_allows(). */
static inline int64_t ref_visible(fa_mask m, int64_t Sq, int64_t Sk, int64_t i)
{
	int64_t n;
	switch (m) {
	case FA_MASK_CAUSAL_BOTTOM_RIGHT: n = i + (Sk - Sq) + 1; break;
	case FA_MASK_CAUSAL_TOP_LEFT: n = i + 1; break;
	default: n = Sk; break;
	}
	if (n < 0)
		return 0;
	return n < Sk ? n : Sk;
}

/* Convert one head row of D elements at element offset off to float64: one switch per row. */
static inline void ref_load_row(const void *base, fa_dtype dt, int64_t off, int64_t D,
                                double *dst)
{
	switch (dt) {
	case FA_DTYPE_FP16: {
		const uint16_t *p = (const uint16_t *)base + off;
		for (int64_t x = 0; x < D; x++)
			dst[x] = fa_half_to_float(p[x]);
		break;
	}
	case FA_DTYPE_BF16: {
		const uint16_t *p = (const uint16_t *)base + off;
		for (int64_t x = 0; x < D; x++)
			dst[x] = fa_bf16_to_float(p[x]);
		break;
	}
	case FA_DTYPE_FP32: {
		const float *p = (const float *)base + off;
		for (int64_t x = 0; x < D; x++)
			dst[x] = p[x];
		break;
	}
	}
}

/* Rows of Q per block: about 2048 / D (an L1's worth of Q, its accumulators or gradients), 4 to
 * 32, at most Sq. */
static inline size_t ref_block_rows(size_t D, int64_t Sq)
{
	size_t br = 2048 / D;
	if (br < 4)
		br = 4;
	if (br > 32)
		br = 32;
	if ((int64_t)br > Sq)
		br = (size_t)Sq;
	return br;
}

/* Scratch of `fixed` words plus `per_key` words for each key of a chunk, within the references'
 * scratch limit: every visible key (nvis, at least 1) in one chunk when they fit, else as many
 * as fit. *mem is malloc'd (the caller frees it), *kc the keys per chunk. FA_ENOMEM when not
 * even one key fits or malloc fails (*mem NULL). */
static inline fa_status ref_chunk_alloc(size_t fixed, size_t per_key, size_t nvis, double **mem,
                                        size_t *kc, bool *one_chunk)
{
	size_t limit_words = fa_attn_fwd_ref_scratch_limit(0) / 8, total;

	*mem = NULL;
	if (nvis == 0)
		nvis = 1; /* every row masked: still run the epilogue */
	if (!__builtin_mul_overflow(per_key, nvis, &total) &&
	    !__builtin_add_overflow(total, fixed, &total) && total <= limit_words) {
		*kc = nvis;
		*one_chunk = true;
	} else {
		if (limit_words <= fixed || (limit_words - fixed) / per_key < 1)
			return FA_ENOMEM;
		*kc = (limit_words - fixed) / per_key;
		*one_chunk = false;
		total = fixed + per_key * *kc;
	}
	if ((*mem = malloc(total * 8)) == NULL)
		return FA_ENOMEM;
	return FA_OK;
}

/* Where a forward's results go: O in dtype with the descriptor's strides plus fp32 lse, or
 * float64 o64 [B, Sq, Hq, D] (dense) and lse64 at lse64_stride (batch, head, seq). */
struct ref_out {
	void *o;
	float *lse;
	double *o64;
	double *lse64;
	int64_t lse64_stride[3];
};

/* Keys read through a page table (attn_infer_ref.c's paged cache): key j of the batch is row
 * j % page_size of page table[j / page_size], the page taking K's batch stride. Every entry
 * read is checked already. */
struct ref_pages {
	const int32_t *table;
	int64_t page_size;
};

/* The forward reference's driver (attn_fwd_ref.c): the (batch, query-head) pairs [bh_begin,
 * bh_end) of d into out, keys by d's strides (pg NULL) or through pg (then d->B must be 1: one
 * sequence's table). Returns the statuses of fa_attn_fwd_ref(). */
fa_status ref_fwd_run(const struct fa_attn_fwd_desc *d, const void *q, const void *k,
                      const void *v, const struct ref_out *out, const struct ref_pages *pg,
                      int64_t bh_begin, int64_t bh_end);

#endif /* FA_ATTN_REF_INT_H */
