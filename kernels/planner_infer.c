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

/* The keys the decode blocks of a sequence of q queries and k keys walk: all k, or with a window
 * the tiles from the one of the first key its first row sees to the last key its last row sees
 * (attn_decode.cu: a block's splits start at its first window tile; the window is the
 * sequence's own, fa_attn_key_range with its lengths). */
static int64_t walk_keys(const struct fa_attn_infer_desc *d, int64_t q, int64_t k)
{
	if (!fa_attn_window_active(&d->fwd) || q < 1 || k < 1)
		return k;
	int64_t lo0, hi0, lo1, hi1;
	fa_attn_key_range(&d->fwd, q, k, 0, &lo0, &hi0);
	fa_attn_key_range(&d->fwd, q, k, q - 1, &lo1, &hi1);
	const int64_t w = hi1 - lo0 / 16 * 16;
	return w > 0 ? w : 0;
}

/* The split of a ragged batch. The dense plan of the longest sequence gives each (sequence, kv
 * head, row chunk) the longest one's split: with one split and a wave of blocks, the longest
 * sequences' blocks are the critical path while the SMs that ran short ones idle (H200,
 * kernels/RESULTS.md: 16 sequences of 1..8k keys took 89-95 us with 1 split, 69-70 us with 4 or
 * 8). So for a ragged batch a cost model over the real lengths picks the split: time ~
 * max(the longest block, every block's keys / the SMs) + a quarter of the longest block (the
 * packing's tail) + the merge pass when split, in keys of one kv head, with a block's fixed cost
 * ~1 us and the merge pass ~10 us at ~30 GB/s per SM (the H200's, from bench_attn_paged's split
 * sweeps; on that ragged batch the model picks 8 splits, measured 1.4% from the best). With a
 * window a sequence's keys are those its window walks (walk_keys), its blocks still one per
 * split of its keys (the kernel's seq_splits; those past the window cost their fixed part).
 * Uniform batches, forced splits (FA_DECODE_SPLITS), top-left masks and batches of
 * many waves keep the dense plan. Returns the number of splits. */
enum {
	RAGGED_BLOCK_BYTES = 30000,  /* a block's fixed cost, in bytes of K/V at one SM's rate */
	RAGGED_MERGE_BYTES = 300000, /* the merge pass's */
	RAGGED_MAX_SPLITS = 64,
	RAGGED_MAX_WAVES = 16,       /* more (sequence, kv head) pairs: throughput-bound */
};
#define RAGGED_TAIL 0.25
static int ragged_splits(const struct fa_device_model *dev, const struct fa_attn_infer_desc *d,
                         const struct fa_kernel_settings *ks, const struct fa_decode_plan *dp)
{
	if (!ks)
		ks = fa_kernel_settings_default();
	const int64_t B = d->fwd.B, resident = dev->sm_count > 0 ? dev->sm_count : 132;
	if (ks->decode_splits > 0 || d->fwd.mask == FA_MASK_CAUSAL_TOP_LEFT || B < 2 ||
	    B * d->fwd.Hkv > RAGGED_MAX_WAVES * resident)
		return dp->nsplit;
	int64_t lo = INT64_MAX, hi = 0;
	for (int64_t b = 0; b < B; b++) {
		int64_t q, k;
		fa_attn_infer_lengths(d, b, &q, &k);
		const int64_t w = walk_keys(d, q, k);
		lo = w < lo ? w : lo;
		hi = w > hi ? w : hi;
	}
	if (lo == hi)
		return dp->nsplit;
	const double bpk = 2.0 * (double)d->fwd.D * (double)fa_dtype_size(d->fwd.dtype);
	const double cblock = RAGGED_BLOCK_BYTES / bpk, cmerge = RAGGED_MERGE_BYTES / bpk;
	const int64_t group = d->fwd.Hq / d->fwd.Hkv, br = dp->tile.br;
	const int64_t tiles = (hi + 15) / 16; /* the longest walk */
	int64_t maxn = tiles / ((int64_t)dp->tile.nw * 4); /* planner_decode.c's floor per warp */
	maxn = maxn < 1 ? 1 : maxn > RAGGED_MAX_SPLITS ? RAGGED_MAX_SPLITS : maxn;
	double best = 0, cost[RAGGED_MAX_SPLITS + 1];
	int nn[RAGGED_MAX_SPLITS + 1];
	for (int64_t n = 1; n <= maxn; n++) {
		const int64_t tps = (tiles + n - 1) / n, keys = tps * 16;
		nn[n] = (int)((tiles + tps - 1) / tps); /* as fa_plan_decode rounds it */
		double work = 0;
		for (int64_t b = 0; b < B; b++) {
			int64_t q, k;
			fa_attn_infer_lengths(d, b, &q, &k);
			int64_t ns = k > 0 ? (k + keys - 1) / keys : 1;
			ns = ns < nn[n] ? ns : nn[n];
			const int64_t rc = (q * group + br - 1) / br;
			work += (double)(rc * d->fwd.Hkv) * ((double)walk_keys(d, q, k) + (double)ns * cblock);
		}
		/* the longest block, or every block's keys spread over the SMs; plus the tail of the
		 * block scheduler's packing (the last blocks to start end after the others by about a
		 * quarter of the longest: fitted to the ragged sweep) and the merge pass */
		const double path = (double)keys + cblock, spread = work / (double)resident;
		cost[n] = (path > spread ? path : spread) + RAGGED_TAIL * path +
		          (nn[n] > 1 ? cmerge : 0);
		if (n == 1 || cost[n] < best)
			best = cost[n];
	}
	for (int64_t n = 1; n <= maxn; n++) /* the fewest splits within 2% of the best */
		if (cost[n] <= 1.02 * best)
			return nn[n];
	return dp->nsplit;
}

/* With a window the plan's splits cover the longest sequence's window (fa_plan_decode over *pd);
 * another sequence's window may start at another offset in its first tile and need one tile
 * more. The split keys grow until every sequence's walk fits its splits (the kernel's last split
 * would take the rest anyway, unevenly); the split count, hence the partials, stays. */
static void cover_windows(const struct fa_attn_infer_desc *d, struct fa_decode_plan *dp)
{
	if (!fa_attn_window_active(&d->fwd))
		return;
	int64_t tiles = 0;
	for (int64_t b = 0; b < d->fwd.B; b++) {
		int64_t q, k;
		fa_attn_infer_lengths(d, b, &q, &k);
		const int64_t t = (walk_keys(d, q, k) + 15) / 16;
		tiles = t > tiles ? t : tiles;
	}
	const int64_t tps = (tiles + dp->nsplit - 1) / dp->nsplit;
	if (tps * 16 > dp->split_keys)
		dp->split_keys = (int)(tps * 16);
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
	fa_status st = fa_plan_decode(dev, pd, ks, NULL, out, err, errlen);
	if (st != FA_OK)
		return st;
	int n = ragged_splits(dev, d, ks, out);
	if (n != out->nsplit) {
		struct fa_kernel_settings forced = ks ? *ks : *fa_kernel_settings_default();
		forced.decode_splits = n;
		if ((st = fa_plan_decode(dev, pd, &forced, NULL, out, err, errlen)) != FA_OK)
			return st;
	}
	cover_windows(d, out);
	return FA_OK;
}
