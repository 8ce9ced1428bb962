/* planner_infer.c - the routing of an inference descriptor between the decode and the prefill
 * kernels, and the decode plan over the longest sequence; see fa_infer_route.h. */
#include "fa_infer_route.h"

#include <inttypes.h>

#include "fa_err.h"

void fa_infer_longest(const struct fa_attn_infer_desc *d, int64_t *sq, int64_t *sk)
{
	int64_t mq = 0, mk = 0;
	for (int64_t b = 0; b < d->fwd.B; b++) {
		int64_t q, k;
		fa_attn_infer_lengths(d, b, &q, &k);
		mq = q > mq ? q : mq;
		mk = k > mk ? k : mk;
	}
	*sq = mq;
	*sk = mk;
}

bool fa_infer_decode_wanted(const struct fa_device_model *dev, const struct fa_attn_infer_desc *d,
                            const struct fa_kernel_settings *ks)
{
	int64_t sq, sk;
	fa_infer_longest(d, &sq, &sk);
	struct fa_attn_fwd_desc f = d->fwd;
	f.Sq = sq > 0 ? sq : 1;
	return fa_decode_wanted(dev, &f, ks);
}

fa_status fa_infer_plan_decode(const struct fa_device_model *dev,
                               const struct fa_attn_infer_desc *d,
                               const struct fa_kernel_settings *ks, struct fa_attn_fwd_desc *pd,
                               struct fa_decode_plan *out, char *err, size_t errlen)
{
	int64_t sq, sk;
	fa_infer_longest(d, &sq, &sk);
	*pd = d->fwd;
	pd->Sq = sq > 0 ? sq : 1; /* an empty batch still plans (its blocks all exit) */
	pd->Sk = sk > 0 ? sk : 1;
	/* grid z is the sequence, y kv heads x row chunks (fa_plan_decode checks that one); the
	 * kernel's lengths and row offsets are int32 */
	if (pd->B > 65535 || pd->Hq > 65535 || pd->Sq > INT32_MAX / 2 || pd->Sk > INT32_MAX / 2 ||
	    (d->cu_q && d->total_q > INT32_MAX / 2) || (d->cu_k && d->total_k > INT32_MAX / 2))
		return fa_err(err, errlen, FA_ESHAPE,
		              "shape too large for the decode kernel's grid: %" PRId64 " sequences "
		              "(max 65535), %" PRId64 " query heads (max 65535), longest %" PRId64
		              " queries and %" PRId64 " keys, %" PRId64 " packed query rows and %"
		              PRId64 " packed keys (max 2^30 each)",
		              pd->B, pd->Hq, pd->Sq, pd->Sk, d->total_q, d->total_k);
	return fa_plan_decode(dev, pd, ks, NULL, out, err, errlen);
}
