/* planner_decode.c - the decode path's plan (fa_planner.h, "the decode path"): which shapes take
 * it, the tile of attn_decode.cu (warps, packed rows, ring depth) and the split of the keys.
 *
 * Decode is memory bound: the time is K and V read once per kv head. So the tile is the one with
 * the most K/V bytes in flight per SM (capped where more stopped helping: Little's law at ~4 TB/s
 * and ~1 us needs ~32 KB per SM; 128 KB leaves room), and the split makes whole waves of one
 * block per SM, at the fewest splits that keep the SMs within 5% of the best wave fill: every split adds partials to write and read
 * back in the merge pass.
 */
#include "fa_planner.h"
#include "fa_attn.h"
#include "fa_err.h"

#include <stdio.h>
#include <string.h>

enum {
	DEC_BC = 16,               /* keys per warp step (attn_decode.cu BC) */
	DEC_MIN_TILES_PER_WARP = 4, /* a split gives each warp at least this many tiles */
	DEC_MAX_SPLITS = 256,
	DEC_INFLIGHT_CAP = 128 * 1024,
};

bool fa_decode_wanted(const struct fa_device_model *dev, const struct fa_attn_fwd_desc *d,
                      const struct fa_kernel_settings *ks)
{
	(void)dev;
	if (!ks)
		ks = fa_kernel_settings_default();
	if (ks->decode == FA_DECODE_OFF)
		return false;
	return ks->decode == FA_DECODE_ALL || d->Sq <= FA_DECODE_MAX_SQ;
}

static int padded_d(int path, int D)
{
	return path == FA_KPATH_DEC16 ? (D + 15) / 16 * 16 : D;
}

size_t fa_decode_smem(const struct fa_tile *t, int D)
{
	const bool f32 = t->path == FA_KPATH_DEC32;
	const size_t es = f32 ? 4 : 2;
	const size_t dp = (size_t)padded_d(t->path, D);
	const size_t ldq = f32 ? (size_t)D : dp + 8, ldk = f32 ? (size_t)D + 4 : dp + 8;
	const size_t ldv = f32 ? (size_t)D : dp + 8;
	const size_t q = ((size_t)t->br * ldq * es + 15) / 16 * 16;
	size_t ring = (size_t)t->nw * t->stages * DEC_BC * (ldk + ldv) * es;
	if (f32)
		ring += (size_t)t->nw * t->br * DEC_BC * 4; /* P, per warp */
	const size_t merge = (size_t)t->nw * t->br * (dp + 2) * 4;
	return q + (ring > merge ? ring : merge);
}

/* Registers per thread, fitted loosely to ptxas (the compile checks print both). */
static int dec_regs(const struct fa_tile *t, int D)
{
	int dp = padded_d(t->path, D), r;
	if (t->path == FA_KPATH_DEC16) {
		int rt = t->br / 16;
		r = 48 + rt * (dp / 8) * 4 + rt * 12 + (rt * dp <= 128 ? rt * dp / 4 : 0);
	} else {
		int nchl = (D / 4 + 31) / 32;
		r = 48 + t->br * nchl * 4 + t->br * 4 + nchl * 16;
	}
	r = (r + 7) / 8 * 8;
	return r > 255 ? 255 : r;
}

static int dec_blocks_per_sm(const struct fa_device_model *dev, const struct fa_tile *t)
{
	const size_t smem_sm = dev->smem_per_sm ? dev->smem_per_sm : dev->smem_optin;
	int by_smem = (int)(smem_sm / (t->smem + 1024)); /* 1 KiB reserved per block */
	int regs_sm = dev->regs_per_sm ? dev->regs_per_sm : 65536;
	int by_regs = regs_sm / (t->regs * 32 * t->nw);
	int by_thr = 64 / t->nw; /* 2048 threads per SM */
	int n = by_smem < by_regs ? by_smem : by_regs;
	n = n < by_thr ? n : by_thr;
	return n < 32 ? n : 32;
}

/* Rows per block: 16-bit row tiles of 16 (at most 256 / padded D of them: O's fragments stay
 * within 128 registers), fp32 a power of two up to 16 (8 above head dim 64, 4 above 128: the
 * ptxas reports of test_nvrtc_decode). */
static int dec_rows_per_block(int path, int D, int rows)
{
	if (path == FA_KPATH_DEC16) {
		int dp = padded_d(path, D);
		int rtmax = dp <= 64 ? 4 : dp <= 128 ? 2 : 1;
		int rt = (rows + 15) / 16;
		return 16 * (rt < rtmax ? rt : rtmax);
	}
	int drmax = D <= 64 ? 16 : D <= 128 ? 8 : 4, dr = 1;
	while (dr < rows && dr < drmax)
		dr *= 2;
	return dr;
}

static fa_status pick_tile(const struct fa_device_model *dev, const struct fa_attn_fwd_desc *d,
                           const struct fa_kernel_settings *ks, int path, int br,
                           struct fa_tile *out, char *err, size_t errlen)
{
	static const int nws[] = {4, 2};
	bool found = false;
	struct fa_tile best;
	long best_key = -1;
	size_t min_smem = 0;
	memset(&best, 0, sizeof best);
	for (size_t i = 0; i < sizeof nws / sizeof nws[0]; i++)
		for (int st = 2; st <= 4; st++) {
			if (ks->decode_stages && st != ks->decode_stages)
				continue;
			struct fa_tile t;
			memset(&t, 0, sizeof t);
			t.path = path;
			t.nw = nws[i];
			t.rt = 1;
			t.br = br;
			t.bc = DEC_BC;
			t.stages = st;
			t.smem = fa_decode_smem(&t, (int)d->D);
			t.regs = dec_regs(&t, (int)d->D);
			if (!min_smem || t.smem < min_smem)
				min_smem = t.smem;
			if (t.smem > dev->smem_optin)
				continue;
			t.blocks_per_sm = dec_blocks_per_sm(dev, &t);
			if (t.blocks_per_sm < 1)
				continue;
			size_t tile_bytes = (size_t)DEC_BC * (size_t)d->D * 2 * fa_dtype_size(d->dtype);
			size_t inflight = (size_t)t.blocks_per_sm * t.nw * (st - 1) * tile_bytes;
			if (inflight > DEC_INFLIGHT_CAP)
				inflight = DEC_INFLIGHT_CAP;
			/* then more warps per SM (latency hiding), then fewer stages (smem) */
			long key = (long)(inflight / 1024) * 1000 + t.blocks_per_sm * t.nw * 10 + (4 - st);
			t.score = (double)key;
			if (key > best_key) {
				best_key = key;
				best = t;
				found = true;
			}
		}
	if (!found) {
		return fa_err(err, errlen, FA_ENOFIT,
		              "no decode tile fits: head dim %lld, %d rows per block: the smallest needs "
		              "%zu bytes of shared memory, the device (%s) allows %zu per block",
		              (long long)d->D, br, min_smem, dev->name, dev->smem_optin);
	}
	*out = best;
	return FA_OK;
}

fa_status fa_plan_decode(const struct fa_device_model *dev, const struct fa_attn_fwd_desc *d,
                         const struct fa_kernel_settings *ks, const struct fa_tile *tile,
                         struct fa_decode_plan *out, char *err, size_t errlen)
{
	if (!ks)
		ks = fa_kernel_settings_default();
	memset(out, 0, sizeof *out);
	if (d->D < 8 || d->D > FA_ATTN_MAX_HEAD_DIM || d->D % 8 || d->Hkv < 1 || d->Hq % d->Hkv) {
		return fa_err(err, errlen, FA_EINVAL,
		              "decode: head dim %lld (a multiple of 8 in [8, %d]) or heads %lld/%lld",
		              (long long)d->D, FA_ATTN_MAX_HEAD_DIM, (long long)d->Hq,
		              (long long)d->Hkv);
	}
	const int path = d->dtype == FA_DTYPE_FP32 ? FA_KPATH_DEC32 : FA_KPATH_DEC16;
	const int64_t group = d->Hq / d->Hkv;
	const int64_t rows = d->Sq * group;
	if (rows > (1 << 30)) {
		return fa_err(err, errlen, FA_ESHAPE, "decode: %lld packed rows (Sq x group)",
		              (long long)rows);
	}
	out->rows = (int)rows;
	fa_status st;
	if (tile) {
		if (tile->path != path || tile->nw < 1 || tile->nw > 8 || tile->stages < 2 ||
		    tile->stages > 8 || tile->br < 1 || tile->bc != DEC_BC ||
		    (path == FA_KPATH_DEC16 ? tile->br % 16 || tile->br > 64
		                            : (tile->br & (tile->br - 1)) || tile->br > 16)) {
			return fa_err(err, errlen, FA_EINVAL,
			              "decode: tile (path %d, %d warps, %d rows, %d keys, %d stages) is "
			              "not a decode tile for %s", tile->path, tile->nw, tile->br,
			              tile->bc, tile->stages, d->dtype == FA_DTYPE_FP32 ? "fp32" : "16-bit");
		}
		out->tile = *tile;
		out->tile.rt = 1;
		out->tile.smem = fa_decode_smem(&out->tile, (int)d->D);
		out->tile.regs = dec_regs(&out->tile, (int)d->D);
		if (out->tile.smem > dev->smem_optin) {
			return fa_err(err, errlen, FA_ENOFIT,
			              "decode tile needs %zu bytes of shared memory, %s allows %zu",
			              out->tile.smem, dev->name, dev->smem_optin);
		}
		out->tile.blocks_per_sm = dec_blocks_per_sm(dev, &out->tile);
		if (out->tile.blocks_per_sm < 1)
			out->tile.blocks_per_sm = 1;
	} else if ((st = pick_tile(dev, d, ks, path, dec_rows_per_block(path, (int)d->D, (int)rows),
	                           &out->tile, err, errlen)) != FA_OK) {
		return st;
	}
	const int br = out->tile.br;
	out->row_chunks = (int)((rows + br - 1) / br);
	if ((int64_t)out->row_chunks * d->Hkv > 65535) {
		return fa_err(err, errlen, FA_ESHAPE,
		              "decode: %lld kv heads x %d row chunks is over the grid's 65535",
		              (long long)d->Hkv, out->row_chunks);
	}

	/* keys any row sees: causal top-left stops at Sq; bottom-right sees them all */
	int64_t keys = d->Sk;
	if (d->mask == FA_MASK_CAUSAL_TOP_LEFT && d->Sq < keys)
		keys = d->Sq;
	if (fa_attn_window_active(d)) {
		/* a window: from the tile of the first key row 0 sees to the last key the last row
		 * sees (attn_decode.cu starts a block's splits at its first window tile) */
		int64_t lo0, hi0, lo1, hi1;
		fa_attn_key_range(d, d->Sq, d->Sk, 0, &lo0, &hi0);
		fa_attn_key_range(d, d->Sq, d->Sk, d->Sq - 1, &lo1, &hi1);
		keys = hi1 - lo0 / DEC_BC * DEC_BC;
		if (keys < 1)
			keys = 1;
	}
	const int64_t tiles = (keys + DEC_BC - 1) / DEC_BC;
	const int64_t pairs = d->B * d->Hkv * out->row_chunks;
	/* Waves of one block per SM: one block keeps enough K/V in flight for its SM's share of the
	 * bandwidth, and fewer, longer splits waste less on the prologue and the merge (H200 sweep,
	 * kernels/RESULTS.md: B=16 x 8k 139 us with 1 split against 147 us with the 2 that filling
	 * both resident slots gave; B=1 x 32k 47.5 us with 16 splits against 50.2 with 32). */
	const int64_t resident = dev->sm_count > 0 ? dev->sm_count : 132;
	int64_t maxn = tiles / ((int64_t)out->tile.nw * DEC_MIN_TILES_PER_WARP);
	if (maxn < 1)
		maxn = 1;
	if (maxn > DEC_MAX_SPLITS)
		maxn = DEC_MAX_SPLITS;
	int64_t n = 1;
	if (ks->decode_splits > 0) {
		n = ks->decode_splits < tiles ? ks->decode_splits : tiles;
		if (n > DEC_MAX_SPLITS)
			n = DEC_MAX_SPLITS;
	} else {
		double best = 0;
		for (int64_t k = 1; k <= maxn; k++) {
			int64_t blocks = pairs * k, waves = (blocks + resident - 1) / resident;
			double eff = (double)blocks / (double)(waves * resident);
			if (eff > best)
				best = eff;
		}
		for (n = 1; n < maxn; n++) {
			int64_t blocks = pairs * n, waves = (blocks + resident - 1) / resident;
			if ((double)blocks / (double)(waves * resident) >= 0.95 * best)
				break;
		}
	}
	if (n < 1)
		n = 1;
	const int64_t tps = (tiles + n - 1) / n; /* tiles per split */
	n = (tiles + tps - 1) / tps;             /* no empty split */
	out->nsplit = (int)n;
	out->split_keys = (int)(tps * DEC_BC);
	if (n > 1) {
		const size_t prow = (size_t)(n * d->B * d->Hq * d->Sq);
		out->scratch_lse = (prow * (size_t)d->D * 4 + 255) / 256 * 256;
		out->scratch = out->scratch_lse + (prow * 4 + 255) / 256 * 256;
	}
	return FA_OK;
}
