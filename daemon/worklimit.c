/* worklimit.c - a forward request's work and the per-request limit (worklimit.h). */
#include "worklimit.h"

#include <inttypes.h>

#include "util.h"

/* Sum of the integers a..b (0 when b < a), in double: the counts reach 2^80 and more. */
static double worklimit_sum(double a, double b)
{
	return b < a ? 0.0 : (b - a + 1.0) * (a + b) / 2.0;
}

/* Visible pairs over rows [s0, s1); see worklimit.h. */
double worklimit_pairs(const struct fa_attn_fwd_desc *d, int64_t s0, int64_t s1)
{
	double sk = (double)d->Sk;

	if (s1 <= s0)
		return 0.0;
	switch (d->mask) {
	case FA_MASK_CAUSAL_BOTTOM_RIGHT: {
		/* row i sees min(Sk, max(0, i + Sk - Sq + 1)) keys; at most Sk since i < Sq */
		double off = (double)d->Sk - (double)d->Sq;
		double lo = (double)s0 + off + 1.0, hi = (double)(s1 - 1) + off + 1.0;
		return worklimit_sum(lo < 1.0 ? 1.0 : lo, hi);
	}
	case FA_MASK_CAUSAL_TOP_LEFT: {
		/* row i sees min(Sk, i + 1) keys */
		int64_t split = s1 < d->Sk ? s1 : d->Sk; /* rows below it see fewer than Sk */
		double part = split > s0 ? worklimit_sum((double)s0 + 1.0, (double)split) : 0.0;
		int64_t full0 = s0 > d->Sk ? s0 : d->Sk;
		return part + (s1 > full0 ? (double)(s1 - full0) * sk : 0.0);
	}
	default:
		return (double)(s1 - s0) * sk;
	}
}

/* See worklimit.h. */
double worklimit_flop(const struct fa_attn_fwd_desc *d)
{
	return 4.0 * (double)d->B * (double)d->Hq * (double)d->D * worklimit_pairs(d, 0, d->Sq);
}

/* See worklimit.h. */
/* The check of a pass that costs factor forward passes; what names it in the detail. */
static fa_status worklimit_check_pass(const struct fa_attn_fwd_desc *d, double factor,
                                      const char *what, uint64_t max_gflop, char *err,
                                      size_t errlen)
{
	double gflop = factor * worklimit_flop(d) / 1e9;

	if (gflop <= (double)max_gflop)
		return FA_OK;
	return fa_err(err, errlen, FA_ETOOBIG,
	              "the request is %.4g GFLOP of work (%s per visible query-key pair: B "
	              "%" PRId64 " Hq %" PRId64 " Sq %" PRId64 " Sk %" PRId64 " D %" PRId64 "%s), "
	              "above this daemon's limit of %" PRIu64 " GFLOP per request "
	              "(--max-request-gflop): split it into smaller requests",
	              gflop, what, d->B, d->Hq, d->Sq, d->Sk, d->D,
	              d->mask == FA_MASK_NONE ? "" : ", causal", max_gflop);
}

fa_status worklimit_check(const struct fa_attn_fwd_desc *d, uint64_t max_gflop, char *err,
                          size_t errlen)
{
	return worklimit_check_pass(d, 1.0, "4*B*Hq*D", max_gflop, err, errlen);
}

fa_status worklimit_check_bwd(const struct fa_attn_fwd_desc *d, uint64_t max_gflop, char *err,
                              size_t errlen)
{
	return worklimit_check_pass(d, WORKLIMIT_BWD_FACTOR, "backward: 2.5 * 4*B*Hq*D",
	                            max_gflop, err, errlen);
}
