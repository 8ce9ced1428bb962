/* fa_check_infer.c - the inference calls' shape rules; see fa_check_infer.h. The detail texts are
 * the daemon's and the client's alike, which tests match. */
#include "fa_check_infer.h"

#include <inttypes.h>
#include <math.h>

#include "fa_check.h"
#include "fa_err.h"

/* Sizes, strides, alignment, extent: the order a caller would fix them in. */
fa_status fa_check_index(const char *name, uint64_t offset, const int64_t shape[2],
                         const int64_t stride[2], uint64_t region_size, char *err, size_t errlen)
{
	for (int d = 0; d < 2; d++)
		if (shape[d] < 1)
			return fa_err(err, errlen, FA_ESHAPE,
			              "%s: shape[%d] is %" PRId64 "; every size must be >= 1", name, d,
			              shape[d]);
	for (int d = 0; d < 2; d++)
		if (stride[d] < 0)
			return fa_err(err, errlen, FA_EINVAL,
			              "%s: stride[%d] is %" PRId64 "; strides must be >= 0", name, d,
			              stride[d]);
	if (offset % 4 != 0)
		return fa_err(err, errlen, FA_EALIGN,
		              "%s: offset %" PRIu64 " is not a multiple of 4 (int32 entries)", name,
		              offset);
	if (region_size == 0)
		return FA_OK;
	const int64_t sh4[4] = {shape[0], shape[1], 1, 1}, st4[4] = {stride[0], stride[1], 0, 0};
	return fa_check_extent(name, offset, sh4, st4, 4, region_size, NULL, err, errlen);
}

/* Whether a shape is [a, b, c, d]. */
static bool is_shape(const int64_t s[4], int64_t a, int64_t b, int64_t c, int64_t d)
{
	return s[0] == a && s[1] == b && s[2] == c && s[3] == d;
}

/* FA_ESHAPE naming the tensor, its shape and the one wanted. */
static fa_status want(const char *name, const int64_t *got, int n, const int64_t *w, char *err,
                      size_t errlen)
{
	if (n == 2)
		return fa_err(err, errlen, FA_ESHAPE,
		              "%s: shape [%" PRId64 ", %" PRId64 "], want [%" PRId64 ", %" PRId64 "]",
		              name, got[0], got[1], w[0], w[1]);
	return fa_err(err, errlen, FA_ESHAPE,
	              "%s: shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "], want [%" PRId64
	              ", %" PRId64 ", %" PRId64 ", %" PRId64 "]",
	              name, got[0], got[1], got[2], got[3], w[0], w[1], w[2], w[3]);
}

/* Queries (packed: batch 1) and what depends on them: o, D, GQA, lse. */
static fa_status check_queries(const int64_t q[4], const int64_t k[4], const int64_t v[4],
                               const int64_t o[4], const int64_t *lse, bool packed, char *err,
                               size_t errlen)
{
	if (packed && q[0] != 1)
		return fa_err(err, errlen, FA_ESHAPE,
		              "q: batch %" PRId64 ": packed queries are [1, total_q, Hq, D]", q[0]);
	if (k[3] != q[3])
		return fa_err(err, errlen, FA_ESHAPE,
		              "k: head dim %" PRId64 " differs from q's %" PRId64, k[3], q[3]);
	if (!is_shape(v, k[0], k[1], k[2], k[3]))
		return want("v", v, 4, k, err, errlen);
	if (!is_shape(o, q[0], q[1], q[2], q[3]))
		return want("o", o, 4, q, err, errlen);
	if (q[2] % k[2] != 0)
		return fa_err(err, errlen, FA_ESHAPE,
		              "GQA: q has %" PRId64 " heads, not a multiple of k/v's %" PRId64, q[2],
		              k[2]);
	if (lse != NULL) {
		const int64_t w[4] = {q[0], q[2], q[1], 1};
		if (!is_shape(lse, w[0], w[1], w[2], w[3]))
			return want("lse", lse, 4, w, err, errlen);
	}
	return FA_OK;
}

fa_status fa_check_varlen_shapes(const int64_t q[4], const int64_t k[4], const int64_t v[4],
                                 const int64_t o[4], const int64_t *lse, const int64_t cu_q[2],
                                 const int64_t cu_k[2], char *err, size_t errlen)
{
	fa_status st;

	if (k[0] != 1)
		return fa_err(err, errlen, FA_ESHAPE,
		              "k: batch %" PRId64 ": packed keys are [1, total_k, Hkv, D]", k[0]);
	if ((st = check_queries(q, k, v, o, lse, true, err, errlen)) != FA_OK)
		return st;
	if (cu_q[1] != 1 || cu_q[0] < 2)
		return fa_err(err, errlen, FA_ESHAPE,
		              "cu_seqlens_q: shape [%" PRId64 ", %" PRId64 "], want [B + 1, 1] with B >= 1",
		              cu_q[0], cu_q[1]);
	if (cu_k[0] != cu_q[0] || cu_k[1] != 1)
		return want("cu_seqlens_k", cu_k, 2, (const int64_t[2]){cu_q[0], 1}, err, errlen);
	return FA_OK;
}

fa_status fa_check_kvcache_shapes(const int64_t q[4], const int64_t k[4], const int64_t v[4],
                                  const int64_t o[4], const int64_t *lse,
                                  const int64_t cache_len[2], const int64_t *page_table,
                                  const int64_t *cu_q, char *err, size_t errlen)
{
	fa_status st;
	int64_t B = cache_len[0];

	if (cache_len[1] != 1)
		return fa_err(err, errlen, FA_ESHAPE,
		              "cache_seqlens: shape [%" PRId64 ", %" PRId64 "], want [B, 1]", cache_len[0],
		              cache_len[1]);
	if (cu_q != NULL && (cu_q[0] != B + 1 || cu_q[1] != 1))
		return want("cu_seqlens_q", cu_q, 2, (const int64_t[2]){B + 1, 1}, err, errlen);
	if (cu_q == NULL && q[0] != B)
		return fa_err(err, errlen, FA_ESHAPE,
		              "q: batch %" PRId64 " differs from cache_seqlens' %" PRId64 " sequences",
		              q[0], B);
	if (page_table != NULL) {
		if (page_table[0] != B)
			return fa_err(err, errlen, FA_ESHAPE,
			              "page_table: %" PRId64 " rows for %" PRId64 " sequences",
			              page_table[0], B);
		if (k[1] < 16 || k[1] > 256)
			return fa_err(err, errlen, FA_ESHAPE,
			              "k: page size %" PRId64 " (shape[1] of the pool): pages hold 16 to 256 "
			              "tokens", k[1]);
	} else if (k[0] != B) {
		return fa_err(err, errlen, FA_ESHAPE,
		              "k: batch %" PRId64 " differs from cache_seqlens' %" PRId64
		              " sequences (a contiguous cache is [B, rows, Hkv, D])", k[0], B);
	}
	if ((st = check_queries(q, k, v, o, lse, cu_q != NULL, err, errlen)) != FA_OK)
		return st;
	return FA_OK;
}

fa_status fa_check_softcap(double softcap, char *err, size_t errlen)
{
	if (!isfinite(softcap) || softcap < 0)
		return fa_err(err, errlen, FA_EINVAL,
		              "softcap is %g: it must be finite and >= 0 (0 is off)", softcap);
	return FA_OK;
}
