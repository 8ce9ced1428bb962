/* backend_infer.c - the index snapshot of an inference job; see backend_infer.h. */
#include "backend_infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const backend_infer_names[INFER_NINDEX] = {"cu_seqlens_q", "cu_seqlens_k",
                                                       "cache_seqlens", "page_table"};

struct backend_infer *backend_infer_alloc(uint32_t op)
{
	struct backend_infer *bi = calloc(1, sizeof(*bi));
	if (bi == NULL)
		return NULL;
	bi->op = op;
	pthread_mutex_init(&bi->mu, NULL);
	return bi;
}

void backend_infer_free(struct backend_infer *bi)
{
	if (bi == NULL)
		return;
	pthread_mutex_destroy(&bi->mu);
	free(bi->copy);
	free(bi);
}

/* The longest sequence of cumulative offsets, at least 1 (the descriptor's bound). Run before the
 * check: a decreasing pair gives a negative length, which the check then names. */
static int64_t longest(const int32_t *cu, int64_t B)
{
	int64_t m = 1;
	for (int64_t b = 0; b < B; b++)
		if ((int64_t)cu[b + 1] - cu[b] > m)
			m = (int64_t)cu[b + 1] - cu[b];
	return m;
}

/* Copy, find, check: the one-time work of backend_infer_prepare. */
static fa_status prepare(struct backend_infer *bi)
{
	size_t total = 0, at[INFER_NINDEX];
	for (int i = 0; i < INFER_NINDEX; i++) {
		at[i] = total;
		if (bi->src[i].base != NULL)
			total += (size_t)(bi->src[i].n0 * bi->src[i].n1); /* bounded by validation */
	}
	if ((bi->copy = malloc((total > 0 ? total : 1) * sizeof(int32_t))) == NULL) {
		snprintf(bi->detail, sizeof bi->detail,
		         "the daemon ran out of memory copying the index tensors");
		return FA_ENOMEM;
	}
	const int32_t *dst[INFER_NINDEX] = {0};
	for (int i = 0; i < INFER_NINDEX; i++) {
		const struct backend_index_src *s = &bi->src[i];
		if (s->base == NULL)
			continue;
		int32_t *d = bi->copy + at[i];
		/* a volatile read: the client may be writing; each entry is read exactly once */
		for (int64_t r = 0; r < s->n0; r++)
			for (int64_t c = 0; c < s->n1; c++)
				d[r * s->n1 + c] = ((const volatile int32_t *)s->base)[r * s->s0 + c * s->s1];
		dst[i] = d;
	}
	struct fa_attn_infer_desc *d = &bi->desc;
	d->cu_q = dst[INFER_CU_Q];
	d->cu_k = dst[INFER_CU_K];
	d->seqlens_k = dst[INFER_CACHE_LEN];
	d->page_table = dst[INFER_PAGE_TABLE];
	if (bi->find_max_q && d->cu_q != NULL)
		d->fwd.Sq = longest(d->cu_q, d->fwd.B);
	if (bi->find_max_k) {
		if (d->cu_k != NULL) {
			d->fwd.Sk = longest(d->cu_k, d->fwd.B);
		} else {
			int64_t m = 1;
			for (int64_t b = 0; b < d->fwd.B; b++)
				m = d->seqlens_k[b] > m ? d->seqlens_k[b] : m;
			d->fwd.Sk = m;
		}
	}
	return fa_attn_infer_check(d, bi->detail, sizeof bi->detail);
}

fa_status backend_infer_prepare(struct backend_infer *bi)
{
	fa_status st;

	pthread_mutex_lock(&bi->mu);
	if (bi->state == 0) {
		bi->status = prepare(bi);
		bi->state = bi->status == FA_OK ? 1 : 2;
	}
	st = bi->status;
	pthread_mutex_unlock(&bi->mu);
	return st;
}
