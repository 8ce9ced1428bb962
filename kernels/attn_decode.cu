/* attn_decode.cu - the decode forward (few queries against many keys): split-KV with the query
 * heads of a GQA group packed into the rows of one tile. Compiled at run time by NVRTC like
 * attn_fwd.cu (the one #include is fa_device.cuh); the host (gpu_cuda.c, launch_decode) embeds it
 * as fa_src_attn_decode and specialises it with -D options:
 *
 *   FA_IN      element type of Q, K, V and O: 1 fp16, 2 bf16, 3 fp32 (every fp32 precision runs
 *              the FFMA path: decode is memory bound, so IEEE products cost nothing)
 *   FA_D       head dim, a multiple of 8 in [8, 256]
 *   FA_NW      warps per block; each warp walks its own share of the block's keys
 *   FA_DR      packed rows per block (rows = query index x group member): 16-bit a multiple of
 *              16 (row tiles of mma.sync m16n8k16), fp32 1, 2, 4, 8 or 16
 *   FA_STAGES  K/V tiles per warp in its cp.async ring (>= 2)
 *   FA_MASK    0 none, 1 causal bottom-right, 2 causal top-left (as attn_fwd.cu)
 *   FA_WIN     1: the sliding window (the mask folded in by the host: key j visible to query i
 *              iff win_lo <= j - i <= win_hi); the splits start at the block's first window
 *              key, so they cover only the window's keys. FA_SOFTCAP 1: logit softcapping
 *              (scores capped after the sign, then in the log2 domain with unit scale)
 *   FA_LAYOUT  1 (with FA_WIN only): a window over an inference layout. The host passes the
 *              window's sides (win_lo = window_left, win_hi = window_right, negative:
 *              unbounded) and each block resolves its sequence's range (fa_seq_window): the
 *              diagonal and which sides bound are per sequence. The last split of a sequence
 *              walks to the end of its window whatever the plan's split_keys. 0 (default):
 *              every other launch, layouts without a window included, compiles as before
 *
 * Structure (flash-decoding): grid (split, kv head x row chunk, batch). A block owns one kv head's
 * packed rows r = i * group + member (query i, query head hk * group + member), so K and V are
 * read once per group, and keys [split * split_keys, ...). Its warps take the block's 16-key
 * tiles round robin, each with its own ring, running state (row max, row sum, O) and no block
 * barrier in the loop; at the end the warps' states are merged through shared memory. With one
 * split the block writes O and lse; with more it writes its normalised partial O (fp32) and its
 * logsumexp to the launcher's scratch, and fa_decode_merge combines the splits (weights
 * exp(lse_s - max)). Rows that see no key: O = 0, lse = -inf, as attn_fwd.cu.
 *
 * 16-bit path: Q's A fragments from shared memory (registers where they fit), K by ldmatrix, V by
 * ldmatrix.trans, m16n8k16 with fp32 accumulation, P reused from registers (as attn_fwd.cu).
 * fp32 path: FFMA; two lanes per key for S (each half the head dim, one shuffle), P through a
 * small per-warp buffer, each lane owning 4-column chunks of O for P V.
 * A negative scale negates the raw scores (exact), so the row max is the max of scaled scores.
 *
 * Inference layouts (fa_attn_infer.h, launched by gpu_infer.c; kv 0 is the dense forward's): each
 * block takes its sequence's own query and key counts (fa_dseq: packed queries through cu_q, keys
 * through cu_k, or a cache's seqlens_k) and exits at once when its row chunk or split lies past
 * them; the merge pass combines only the splits the sequence has. The grid and the partials are
 * planned for the longest sequence. A paged cache: key j is row j % page_size of page
 * page_table[b * pt_cols + j / page_size]; each warp reads a tile's page index one tile ahead
 * (the load's latency hides behind the current tile) and skips the read while its tiles stay in
 * one page; a tile that straddles two pages (page sizes that are not a multiple of 16) loads its
 * rows from both. The index tables are the launcher's own checked copies, never a client's.
 */

#include "fa_device.cuh"

/* Mirrored by struct fa_dparams in gpu_cuda.c (same order, same types). */
struct fa_dparams {
	const void *q, *k, *v;
	void *o;
	float *lse;
	float *po, *pl;                       /* partials: [split][B][Hq][Sq] x D, and their lse */
	long long qs[3], ks[3], vs[3], os[3]; /* batch, seq, head strides in elements */
	long long ls[3];                      /* lse: batch, head, seq */
	int B, Sq, Sk, Hq, Hkv, group;
	float scale_log2;                     /* |scale| * log2(e) */
	int neg_scale;
	int nsplit, split_keys;               /* split_keys: a multiple of 16 */
	int rows, nrc;                        /* rows = Sq * group; nrc = row chunks of FA_DR */
	int win_lo, win_hi;                   /* FA_WIN (attn_fwd.cu's; FA_LAYOUT: the sides) */
	float scale_cap, cap_log2;            /* FA_SOFTCAP: |scale| / cap, cap log2(e) */
	/* inference layouts (fa_attn_infer.h): the device copies of the index tables (NULL: none),
	 * kv 0 dense (fa_gpu_attn_fwd), else enum fa_kv_layout; Sq and Sk above are the longest */
	const int *cu_q, *cu_k, *seqlens_k, *page_table;
	long long pt_cols;
	int kv, page_size;
};

enum { KV_DENSE = 0, KV_PACKED = 1, KV_CACHE = 2, KV_PAGED = 3 }; /* fa_attn_infer.h's values */

/* the mask, window and layout first: the sequences' lengths below resolve a layout's window */
#ifndef FA_MASK
#define FA_MASK 0
#endif
#ifndef FA_WIN
#define FA_WIN 0
#endif
#ifndef FA_LAYOUT
#define FA_LAYOUT 0
#endif
#if FA_LAYOUT && !FA_WIN
#error "FA_LAYOUT: only the window over a layout needs its own specialisation"
#endif

/* One sequence's lengths and where its rows start (element offsets). */
struct fa_dseq {
	int sq, sk, rows;             /* queries, keys, packed rows (sq * group) */
	long long qb, ob, lb, kb, vb; /* q, o, lse, k, v of its first row (paged: k, v 0) */
#if FA_LAYOUT
	int win_lo, win_hi;           /* this sequence's range of j - i (fa_seq_window) */
#endif
};

__device__ __forceinline__ fa_dseq seq_of(const fa_dparams &p, int b)
{
	fa_dseq s;
	s.sq = p.Sq;
	s.sk = p.Sk;
	s.qb = b * p.qs[0];
	s.ob = b * p.os[0];
	s.lb = b * p.ls[0];
	s.kb = b * p.ks[0];
	s.vb = b * p.vs[0];
	if (p.cu_q) {
		const int c0 = p.cu_q[b];
		s.sq = p.cu_q[b + 1] - c0;
		s.qb = c0 * p.qs[1];
		s.ob = c0 * p.os[1];
		s.lb = c0 * p.ls[2];
	}
	if (p.kv == KV_PACKED) {
		const int c0 = p.cu_k[b];
		s.sk = p.cu_k[b + 1] - c0;
		s.kb = c0 * p.ks[1];
		s.vb = c0 * p.vs[1];
	} else if (p.kv == KV_CACHE || p.kv == KV_PAGED) {
		s.sk = p.seqlens_k[b];
		if (p.kv == KV_PAGED)
			s.kb = s.vb = 0;
	}
	s.rows = s.sq * p.group;
#if FA_LAYOUT
	fa_seq_window(s.sq, s.sk, p.win_lo, p.win_hi, FA_MASK, &s.win_lo, &s.win_hi);
#endif
	return s;
}

/* The splits sequence s has: those that start inside its keys (at least one, which writes the
 * rows that see no key). */
__device__ __forceinline__ int seq_splits(const fa_dparams &p, const fa_dseq &s)
{
	const int n = (s.sk + p.split_keys - 1) / p.split_keys;
	return max(1, min(p.nsplit, n));
}

#ifndef FA_IN
#define FA_IN 2
#endif
#ifndef FA_D
#define FA_D 128
#endif
#ifndef FA_NW
#define FA_NW 4
#endif
#ifndef FA_DR
#define FA_DR 16
#endif
#ifndef FA_STAGES
#define FA_STAGES 3
#endif
#ifndef FA_SOFTCAP
#define FA_SOFTCAP 0
#endif
/* the softmax's scale: FA_SOFTCAP's scores are already in the log2 domain */
#if FA_SOFTCAP
#define SCALE_LOG2(p) 1.f
#else
#define SCALE_LOG2(p) (p).scale_log2
#endif

#define NT (FA_NW * 32)
#define BC 16 /* keys per tile */

#if FA_IN == 3
typedef float in_t;
#define ES 4
#define DP FA_D
#define LDQ FA_D
#define LDK (FA_D + 4) /* one key per lane pair: 16-byte reads of 8 rows hit 8 bank groups */
#define LDV FA_D       /* a whole row per warp: contiguous */
#define NCHL ((FA_D / 4 + 31) / 32) /* 4-column chunks of O per lane */
#else
typedef u16 in_t;
#define ES 2
#define DP ((FA_D + 15) / 16 * 16)
#define LDQ (DP + 8) /* 16-byte pad: conflict-free ldmatrix */
#define LDK LDQ
#define LDV LDQ
#define RT (FA_DR / 16)
#define ND (DP / 8)
#define QREG (RT * DP <= 128)
#if FA_DR % 16
#error "FA_DR: a multiple of 16 on the 16-bit path"
#endif
#endif
#if FA_STAGES < 2
#error "FA_STAGES: at least 2"
#endif

#define CPE (16 / ES)  /* elements per 16-byte chunk */
#define CPR (DP / CPE) /* chunks per tile row (16-bit: incl. the zero padding) */
#define SMEM_Q ((FA_DR * LDQ * ES + 15) / 16 * 16) /* bytes */
#define SMEM_K (BC * LDK)                          /* elements */
#define SMEM_V (BC * LDV)
/* The merge area (after the loop, over the rings): each warp's O, then its (max, sum) per row.
 * Mirrored by fa_decode_smem in planner_decode.c. */
#define SMEM_MO (FA_NW * FA_DR * DP)

/* One element of O (element index). */
__device__ __forceinline__ void store_o1(void *o, long long i, float x)
{
#if FA_IN == 3
	((float *)o)[i] = x;
#elif FA_IN == 2
	((u16 *)o)[i] = (u16)(pack_bf16(x, 0.f) & 0xffffu);
#else
	((u16 *)o)[i] = (u16)(pack_f16(x, 0.f) & 0xffffu);
#endif
}

/* BC rows of K or V (row stride rs elements) into a warp's buffer; rows >= valid and the head-dim
 * padding zero-filled (a key past Sk must not put garbage, maybe NaN, into 0 * V). Rows from na
 * on come from gb (the next page of a paged cache; na >= BC: one source). */
template <int LD>
__device__ __forceinline__ void warp_load_tile(in_t *s, const in_t *g, long long rs, int valid,
                                               int lane, const in_t *gb = 0, int na = BC)
{
	if (na < BC) {
		const int TOTAL = BC * CPR;
#pragma unroll 1
		for (int i = lane; i < TOTAL; i += 32) {
			const int r = i / CPR, c = i - r * CPR;
			const bool ok = r < valid && c * CPE < FA_D;
			const in_t *src = !ok ? g : r < na ? g + r * rs + c * CPE : gb + (r - na) * rs + c * CPE;
			cp_async16(smem_u32(s + r * LD + c * CPE), src, ok ? 16 : 0);
		}
	} else if (CPR <= 32 && 32 % CPR == 0) {
		/* a fixed column per lane, rows 32 / CPR apart: one pointer, advanced by a stride (the
		 * general loop's per-chunk offsets were hoisted out of the key loop by ptxas: 40+
		 * registers at d128, spills at d160) */
		const int RPI = 32 / CPR, c = lane % CPR, r0 = lane / CPR;
		const bool colok = c * CPE < FA_D;
		const in_t *src = g + r0 * rs + (colok ? c * CPE : 0);
		const u32 dst = smem_u32(s + r0 * LD + c * CPE);
		const long long step = RPI * rs;
#pragma unroll
		for (int it = 0; it < BC / RPI; it++) {
			const bool ok = colok && r0 + it * RPI < valid;
			cp_async16(dst + it * RPI * LD * ES, ok ? src : g, ok ? 16 : 0);
			src += step;
		}
	} else {
		const int TOTAL = BC * CPR;
#pragma unroll 1
		for (int i = lane; i < TOTAL; i += 32) {
			const int r = i / CPR, c = i - r * CPR;
			const bool ok = r < valid && c * CPE < FA_D;
			const in_t *src = ok ? g + r * rs + c * CPE : g;
			cp_async16(smem_u32(s + r * LD + c * CPE), src, ok ? 16 : 0);
		}
	}
}

#if FA_IN != 3
__device__ __forceinline__ void ldsm_x4(u32 &r0, u32 &r1, u32 &r2, u32 &r3, u32 addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
	             : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 &r0, u32 &r1, u32 &r2, u32 &r3, u32 addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
	             : "r"(addr));
}
__device__ __forceinline__ void mma16(float *c, const u32 *a, u32 b0, u32 b1)
{
#if FA_IN == 1
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
	             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ u32 pack_in(float lo, float hi)
{
#if FA_IN == 1
	return pack_f16(lo, hi);
#else
	return pack_bf16(lo, hi);
#endif
}
#endif

#if FA_WIN
/* The window's range of j - i for sequence sd: the host's for a dense batch, the sequence's own
 * over a layout (FA_LAYOUT). */
__device__ __forceinline__ int win_lo_of(const fa_dparams &p, const fa_dseq &sd)
{
#if FA_LAYOUT
	(void)p;
	return sd.win_lo;
#else
	(void)sd;
	return p.win_lo;
#endif
}
__device__ __forceinline__ int win_hi_of(const fa_dparams &p, const fa_dseq &sd)
{
#if FA_LAYOUT
	(void)p;
	return sd.win_hi;
#else
	(void)sd;
	return p.win_hi;
#endif
}
#endif

/* The last key packed row R of sequence sd sees (its last key without a mask), -1 for a padding
 * row. */
__device__ __forceinline__ int row_limit(const fa_dparams &p, const fa_dseq &sd, int R, int off)
{
	if (R >= sd.rows)
		return -1;
#if FA_WIN
	(void)off;
	return (int)min((long long)sd.sk - 1, (long long)(R / p.group) + win_hi_of(p, sd));
#else
	if (!FA_MASK)
		return sd.sk - 1;
	return min(sd.sk - 1, R / p.group + off);
#endif
}

/* Where a paged cache's tile of keys kv0.. lies: page pa from row pw on (na rows of it), then
 * page pb (only when the tile's keys reach it). *last holds the page number read before, so a
 * warp whose tiles stay in one page reads its index once. */
__device__ __forceinline__ void tile_pages(const fa_dparams &p, const int *ptrow, int kv0, int sk,
                                           int *last, int *pa, int *pb, int *pw, int *na)
{
	const int pg = kv0 / p.page_size;
	*pw = kv0 - pg * p.page_size;
	*na = p.page_size - *pw;
	if (pg != *last) {
		*pa = ptrow[pg];
		*last = pg;
	}
	if (*na < BC && kv0 + *na < sk)
		*pb = ptrow[pg + 1];
}

#if FA_WIN
/* The first key packed row R of sequence sd sees (the window's left edge). */
__device__ __forceinline__ int row_first(const fa_dparams &p, const fa_dseq &sd, int R)
{
#if FA_LAYOUT
	const int rows = sd.rows;
#else
	const int rows = p.rows;
#endif
	return (int)max(0LL, (long long)(min(R, rows - 1) / p.group) + win_lo_of(p, sd));
}
#define WIN_SEES(col, first) ((col) >= (first))
#else
#define WIN_SEES(col, first) true
#endif

/* The warps' states (in the merge area) combined per row, then O and lse (one split) or the
 * block's partial O and lse (several). */
__device__ __forceinline__ void block_merge(const fa_dparams &p, const fa_dseq &sd, const float *sM,
                                            const float *sML, int r0, int hk, int b, int split)
{
	const float sl = SCALE_LOG2(p);
	for (int i = threadIdx.x; i < FA_DR * FA_D; i += NT) {
		const int rl = i / FA_D, col = i - rl * FA_D;
		const int R = r0 + rl;
		if (R >= sd.rows)
			continue;
		float M = NEG_INF;
#pragma unroll
		for (int w = 0; w < FA_NW; w++)
			M = fmaxf(M, sML[(w * FA_DR + rl) * 2]);
		float L = 0.f, x = 0.f;
		if (M != NEG_INF) {
			const float ms = __fmul_rn(M, sl);
#pragma unroll
			for (int w = 0; w < FA_NW; w++) {
				const float mw = sML[(w * FA_DR + rl) * 2], lw = sML[(w * FA_DR + rl) * 2 + 1];
				const float wt = mw == NEG_INF ? 0.f : fast_exp2(__fmul_rn(mw, sl) - ms);
				L += lw * wt;
				x += sM[(w * FA_DR + rl) * DP + col] * wt;
			}
		}
		const int qi = R / p.group, h = hk * p.group + (R - qi * p.group);
		const float lse = L > 0.f ? (__fmul_rn(M, sl) + fast_log2(L)) * 0.69314718055994531f
		                          : NEG_INF;
		const float o = L > 0.f ? x / L : 0.f;
		if (p.nsplit == 1) {
			store_o1(p.o, sd.ob + qi * p.os[1] + h * p.os[2] + col, o);
			if (col == 0 && p.lse)
				p.lse[sd.lb + h * p.ls[1] + qi * p.ls[2]] = lse;
		} else {
			const long long pr = (((long long)split * p.B + b) * p.Hq + h) * p.Sq + qi;
			p.po[pr * FA_D + col] = o;
			if (col == 0)
				p.pl[pr] = lse;
		}
	}
}

/* One tile of K and V, keys kv0.. of a sequence of sk keys: from the sequence's contiguous rows
 * (Kg, Vg: its first row of this kv head), or from its pages (pa from row pw, na rows, then pb). */
__device__ __forceinline__ void load_kv_tile(const fa_dparams &p, in_t *sk_, in_t *sv_,
                                             const in_t *Kg, const in_t *Vg, int kv0, int sk,
                                             bool paged, int pa, int pb, int pw, int na, int lane)
{
	if (!paged) {
		warp_load_tile<LDK>(sk_, Kg + kv0 * p.ks[1], p.ks[1], sk - kv0, lane);
		warp_load_tile<LDV>(sv_, Vg + kv0 * p.vs[1], p.vs[1], sk - kv0, lane);
		return;
	}
	warp_load_tile<LDK>(sk_, Kg + pa * p.ks[0] + pw * p.ks[1], p.ks[1], sk - kv0, lane,
	                    Kg + pb * p.ks[0], na);
	warp_load_tile<LDV>(sv_, Vg + pa * p.vs[0] + pw * p.vs[1], p.vs[1], sk - kv0, lane,
	                    Vg + pb * p.vs[0], na);
}

extern "C" __global__ void __launch_bounds__(NT) fa_attn_decode(const fa_dparams p)
{
	extern __shared__ __align__(16) unsigned char smem_raw[];
	in_t *sQ = (in_t *)smem_raw;
	unsigned char *ring = smem_raw + SMEM_Q;

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int split = blockIdx.x, rc = blockIdx.y % p.nrc, hk = blockIdx.y / p.nrc;
	const int b = blockIdx.z;
	const int r0 = rc * FA_DR;
	const fa_dseq sd = seq_of(p, b);
	if (r0 >= sd.rows || split >= seq_splits(p, sd))
		return; /* past this sequence's rows or keys (planned for the longest) */
	const int off = FA_MASK == 1 ? sd.sk - sd.sq : 0; /* query i sees keys j <= i + off */
	const float sl = SCALE_LOG2(p);

	/* keys this block walks: its split, cut at the last key any of its rows sees */
	int kend = sd.sk;
#if FA_WIN
	/* the splits start at the tile of the first key any of its rows sees (over a layout, of
	 * its sequence's window) */
	const int rlast = min(r0 + FA_DR, sd.rows) - 1;
	kend = row_limit(p, sd, rlast, off) + 1;
	const int kbase = row_first(p, sd, r0) / BC * BC;
	const int k0 = kbase + split * p.split_keys;
#else
	if (FA_MASK) {
		const int rlast = min(r0 + FA_DR, sd.rows) - 1;
		kend = min(kend, rlast / p.group + off + 1);
	}
	const int k0 = split * p.split_keys;
#endif
#if FA_LAYOUT
	/* the plan's split_keys covers the longest sequence's window; a sequence whose window
	 * starts at another tile offset may need one tile more: its last split takes the rest */
	const int k1 = split == seq_splits(p, sd) - 1 ? kend : min(k0 + p.split_keys, kend);
#else
	const int k1 = min(k0 + p.split_keys, kend);
#endif
	const int ntb = k1 > k0 ? (k1 - k0 + BC - 1) / BC : 0;
	const int nt = ntb > warp ? (ntb - warp + FA_NW - 1) / FA_NW : 0; /* this warp's tiles */
	const int tw0 = k0 / BC + warp; /* its first tile; then every FA_NW-th */

	const in_t *Kg = (const in_t *)p.k + sd.kb + hk * p.ks[2];
	const in_t *Vg = (const in_t *)p.v + sd.vb + hk * p.vs[2];
	/* paged: the sequence's row of the page table, and the pages of the next tile to load */
	const bool paged = p.kv == KV_PAGED;
	const int *ptrow = paged ? p.page_table + b * p.pt_cols : 0;
	int pg_last = -1, pa = 0, pb = 0, pw = 0, na = BC;
	if (paged && nt > 0)
		tile_pages(p, ptrow, tw0 * BC, sd.sk, &pg_last, &pa, &pb, &pw, &na);
	in_t *wK = (in_t *)ring + warp * FA_STAGES * (SMEM_K + SMEM_V);
	in_t *wV = wK + FA_STAGES * SMEM_K;

	/* Q's packed rows (zeros for padding rows and columns) */
	for (int i = tid; i < FA_DR * CPR; i += NT) {
		const int r = i / CPR, c = i - r * CPR;
		const int R = r0 + r;
		const bool ok = R < sd.rows && c * CPE < FA_D;
		const in_t *src = (const in_t *)p.q;
		if (ok) {
			const int qi = R / p.group, h = hk * p.group + (R - qi * p.group);
			src += sd.qb + qi * p.qs[1] + h * p.qs[2] + c * CPE;
		}
		cp_async16(smem_u32(sQ + r * LDQ + c * CPE), src, ok ? 16 : 0);
	}
	cp_async_commit();
#pragma unroll
	for (int s = 0; s < FA_STAGES - 1; s++) {
		if (s < nt) {
			const int kv0 = (tw0 + FA_NW * s) * BC;
			load_kv_tile(p, wK + s * SMEM_K, wV + s * SMEM_V, Kg, Vg, kv0, sd.sk, paged, pa, pb,
			             pw, na, lane);
			if (paged && s + 1 < nt)
				tile_pages(p, ptrow, kv0 + FA_NW * BC, sd.sk, &pg_last, &pa, &pb, &pw, &na);
		}
		cp_async_commit();
	}
	cp_async_wait<FA_STAGES - 1>(); /* Q has landed (this thread's part) */
	__syncthreads();                /* ... everyone's */

#if FA_IN != 3
	const int g = lane >> 2, t = lane & 3;
	int lim[RT][2];
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int hh = 0; hh < 2; hh++)
			lim[r][hh] = row_limit(p, sd, r0 + r * 16 + g + hh * 8, off);
#if FA_WIN
	int first[RT][2];
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int hh = 0; hh < 2; hh++)
			first[r][hh] = row_first(p, sd, r0 + r * 16 + g + hh * 8);
#define FIRST16(r, hh) first[r][hh]
#else
#define FIRST16(r, hh) 0
#endif
#if QREG
	u32 qf[RT][DP / 16][4];
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int kk = 0; kk < DP / 16; kk++)
			ldsm_x4(qf[r][kk][0], qf[r][kk][1], qf[r][kk][2], qf[r][kk][3],
			        smem_u32(sQ + (r * 16 + (lane & 15)) * LDQ + kk * 16 + (lane >> 4) * 8));
#endif
	float acc[RT][ND][4];
	float mrow[RT][2], lrow[RT][2];
#pragma unroll
	for (int r = 0; r < RT; r++) {
#pragma unroll
		for (int n = 0; n < ND; n++)
			acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.f;
		mrow[r][0] = mrow[r][1] = NEG_INF;
		lrow[r][0] = lrow[r][1] = 0.f;
	}
#else
	const int key = lane & 15, half = lane >> 4;
	int lim[FA_DR];
#if FA_WIN
	int first[FA_DR];
#pragma unroll
	for (int r = 0; r < FA_DR; r++)
		first[r] = row_first(p, sd, r0 + r);
#define FIRST32(r) first[r]
#else
#define FIRST32(r) 0
#endif
	float acc[FA_DR][NCHL][4];
	float mrow[FA_DR], lrow[FA_DR];
#pragma unroll
	for (int r = 0; r < FA_DR; r++) {
		lim[r] = row_limit(p, sd, r0 + r, off);
#pragma unroll
		for (int c = 0; c < NCHL; c++)
			acc[r][c][0] = acc[r][c][1] = acc[r][c][2] = acc[r][c][3] = 0.f;
		mrow[r] = NEG_INF;
		lrow[r] = 0.f;
	}
	float *sP = (float *)(ring + FA_NW * FA_STAGES * (SMEM_K + SMEM_V) * ES) + warp * FA_DR * BC;
#endif

	for (int j = 0; j < nt; j++) {
		cp_async_wait<FA_STAGES - 2>(); /* tile j has landed (this lane's part) */
		__syncwarp();                   /* ... the warp's; buffer (j-1) is free */
		{
			const int jn = j + FA_STAGES - 1, bn = jn % FA_STAGES;
			if (jn < nt) {
				const int kvn = (tw0 + FA_NW * jn) * BC;
				load_kv_tile(p, wK + bn * SMEM_K, wV + bn * SMEM_V, Kg, Vg, kvn, sd.sk, paged, pa,
				             pb, pw, na, lane);
				if (paged && jn + 1 < nt) /* the next tile's pages, read a tile ahead */
					tile_pages(p, ptrow, kvn + FA_NW * BC, sd.sk, &pg_last, &pa, &pb, &pw, &na);
			}
			cp_async_commit();
		}
		const in_t *cK = wK + (j % FA_STAGES) * SMEM_K;
		const in_t *cV = wV + (j % FA_STAGES) * SMEM_V;
		const int kv0 = (tw0 + FA_NW * j) * BC;
#if FA_IN != 3
		/* S = Q K^T */
		float s[RT][2][4];
#pragma unroll
		for (int r = 0; r < RT; r++)
#pragma unroll
			for (int n = 0; n < 2; n++)
				s[r][n][0] = s[r][n][1] = s[r][n][2] = s[r][n][3] = 0.f;
#pragma unroll
		for (int kk = 0; kk < DP / 16; kk++) {
			u32 b0, b1, b2, b3;
			ldsm_x4(b0, b1, b2, b3,
			        smem_u32(cK + ((lane >> 4) * 8 + (lane & 7)) * LDK + kk * 16 +
			                 ((lane >> 3) & 1) * 8));
#pragma unroll
			for (int r = 0; r < RT; r++) {
#if QREG
				const u32 *a = qf[r][kk];
#else
				u32 a[4];
				ldsm_x4(a[0], a[1], a[2], a[3],
				        smem_u32(sQ + (r * 16 + (lane & 15)) * LDQ + kk * 16 + (lane >> 4) * 8));
#endif
				mma16(s[r][0], a, b0, b1);
				mma16(s[r][1], a, b2, b3);
			}
		}
		/* sign, tails and the causal edge */
#pragma unroll
		for (int r = 0; r < RT; r++)
#pragma unroll
			for (int n = 0; n < 2; n++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int col = kv0 + n * 8 + 2 * t + (e & 1);
#if FA_SOFTCAP
					const float x = fa_softcap2<(FA_IN == 3)>(p.neg_scale ? -s[r][n][e] : s[r][n][e],
					                            p.scale_cap, p.cap_log2);
#else
					const float x = p.neg_scale ? -s[r][n][e] : s[r][n][e];
#endif
					s[r][n][e] = col <= lim[r][e >> 1] &&
					             WIN_SEES(col, FIRST16(r, e >> 1)) ? x : NEG_INF;
				}
		/* online softmax */
#pragma unroll
		for (int r = 0; r < RT; r++)
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				float mx = fmaxf(mrow[r][hh], fmaxf(fmaxf(s[r][0][2 * hh], s[r][0][2 * hh + 1]),
				                                    fmaxf(s[r][1][2 * hh], s[r][1][2 * hh + 1])));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
				const float mo = mrow[r][hh];
				const float ms = mx == NEG_INF ? 0.f : __fmul_rn(mx, sl);
				const float alpha = fast_exp2(__fmul_rn(mo, sl) - ms);
				mrow[r][hh] = mx;
				float sum = 0.f;
#pragma unroll
				for (int n = 0; n < 2; n++) {
					s[r][n][2 * hh] = fast_exp2(fmaf(s[r][n][2 * hh], sl, -ms));
					s[r][n][2 * hh + 1] = fast_exp2(fmaf(s[r][n][2 * hh + 1], sl, -ms));
					sum += s[r][n][2 * hh] + s[r][n][2 * hh + 1];
				}
				lrow[r][hh] = lrow[r][hh] * alpha + sum;
#pragma unroll
				for (int n = 0; n < ND; n++) {
					acc[r][n][2 * hh] *= alpha;
					acc[r][n][2 * hh + 1] *= alpha;
				}
			}
		/* O += P V */
		u32 pa[RT][4];
#pragma unroll
		for (int r = 0; r < RT; r++) {
			pa[r][0] = pack_in(s[r][0][0], s[r][0][1]);
			pa[r][1] = pack_in(s[r][0][2], s[r][0][3]);
			pa[r][2] = pack_in(s[r][1][0], s[r][1][1]);
			pa[r][3] = pack_in(s[r][1][2], s[r][1][3]);
		}
#pragma unroll
		for (int n = 0; n < ND; n += 2) {
			u32 b0, b1, b2, b3;
			ldsm_x4_t(b0, b1, b2, b3,
			          smem_u32(cV + (((lane >> 3) & 1) * 8 + (lane & 7)) * LDV + n * 8 +
			                   (lane >> 4) * 8));
#pragma unroll
			for (int r = 0; r < RT; r++) {
				mma16(acc[r][n], pa[r], b0, b1);
				mma16(acc[r][n + 1], pa[r], b2, b3);
			}
		}
#else
		/* S = Q K^T: lanes key and key + 16 each sum half the head dim */
		float s[FA_DR];
#pragma unroll
		for (int r = 0; r < FA_DR; r++)
			s[r] = 0.f;
		const float *kr = cK + key * LDK + half * (FA_D / 2);
		const float *qr = sQ + half * (FA_D / 2);
#pragma unroll 1
		for (int c = 0; c < FA_D / 8; c++) {
			const float4 k4 = *(const float4 *)(kr + 4 * c);
#pragma unroll
			for (int r = 0; r < FA_DR; r++) {
				const float4 q4 = *(const float4 *)(qr + r * LDQ + 4 * c);
				s[r] = fmaf(q4.x, k4.x, s[r]);
				s[r] = fmaf(q4.y, k4.y, s[r]);
				s[r] = fmaf(q4.z, k4.z, s[r]);
				s[r] = fmaf(q4.w, k4.w, s[r]);
			}
		}
		const int col = kv0 + key;
#pragma unroll
		for (int r = 0; r < FA_DR; r++) {
			float x = s[r] + __shfl_xor_sync(0xffffffffu, s[r], 16);
			x = p.neg_scale ? -x : x;
#if FA_SOFTCAP
			x = fa_softcap2<(FA_IN == 3)>(x, p.scale_cap, p.cap_log2);
#endif
			x = col <= lim[r] && WIN_SEES(col, FIRST32(r)) ? x : NEG_INF;
			float mx = x;
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
			mx = fmaxf(mx, mrow[r]);
			const float ms = mx == NEG_INF ? 0.f : __fmul_rn(mx, sl);
			const float alpha = fast_exp2(__fmul_rn(mrow[r], sl) - ms);
			mrow[r] = mx;
			const float pr = fast_exp2(fmaf(x, sl, -ms));
			lrow[r] = lrow[r] * alpha + pr; /* this lane's key; summed over the keys at the end */
#pragma unroll
			for (int c = 0; c < NCHL; c++) {
				acc[r][c][0] *= alpha;
				acc[r][c][1] *= alpha;
				acc[r][c][2] *= alpha;
				acc[r][c][3] *= alpha;
			}
			if (half == 0)
				sP[r * BC + key] = pr;
		}
		__syncwarp();
		/* O += P V: lane owns columns 4 (lane + 32 c) .. +3 */
#pragma unroll
		for (int jj = 0; jj < BC; jj += 4) {
			float4 v4[4][NCHL];
#pragma unroll
			for (int u = 0; u < 4; u++)
#pragma unroll
				for (int c = 0; c < NCHL; c++) {
					const int cc = 4 * (lane + 32 * c);
					v4[u][c] = cc < FA_D ? *(const float4 *)(cV + (jj + u) * LDV + cc)
					                     : make_float4(0.f, 0.f, 0.f, 0.f);
				}
#pragma unroll
			for (int r = 0; r < FA_DR; r++) {
				const float4 p4 = *(const float4 *)(sP + r * BC + jj);
#pragma unroll
				for (int c = 0; c < NCHL; c++) {
					acc[r][c][0] = fmaf(p4.x, v4[0][c].x, acc[r][c][0]);
					acc[r][c][1] = fmaf(p4.x, v4[0][c].y, acc[r][c][1]);
					acc[r][c][2] = fmaf(p4.x, v4[0][c].z, acc[r][c][2]);
					acc[r][c][3] = fmaf(p4.x, v4[0][c].w, acc[r][c][3]);
					acc[r][c][0] = fmaf(p4.y, v4[1][c].x, acc[r][c][0]);
					acc[r][c][1] = fmaf(p4.y, v4[1][c].y, acc[r][c][1]);
					acc[r][c][2] = fmaf(p4.y, v4[1][c].z, acc[r][c][2]);
					acc[r][c][3] = fmaf(p4.y, v4[1][c].w, acc[r][c][3]);
					acc[r][c][0] = fmaf(p4.z, v4[2][c].x, acc[r][c][0]);
					acc[r][c][1] = fmaf(p4.z, v4[2][c].y, acc[r][c][1]);
					acc[r][c][2] = fmaf(p4.z, v4[2][c].z, acc[r][c][2]);
					acc[r][c][3] = fmaf(p4.z, v4[2][c].w, acc[r][c][3]);
					acc[r][c][0] = fmaf(p4.w, v4[3][c].x, acc[r][c][0]);
					acc[r][c][1] = fmaf(p4.w, v4[3][c].y, acc[r][c][1]);
					acc[r][c][2] = fmaf(p4.w, v4[3][c].z, acc[r][c][2]);
					acc[r][c][3] = fmaf(p4.w, v4[3][c].w, acc[r][c][3]);
				}
			}
		}
		__syncwarp(); /* sP is rewritten by the next tile */
#endif
	}
	cp_async_wait<0>();
	__syncthreads(); /* every warp is done with its ring: the merge area reuses it */

	float *sM = (float *)ring;
	float *sML = sM + SMEM_MO;
#if FA_IN != 3
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
			float l = lrow[r][hh];
			l += __shfl_xor_sync(0xffffffffu, l, 1);
			l += __shfl_xor_sync(0xffffffffu, l, 2);
			const int rl = r * 16 + g + hh * 8;
			float *dst = sM + (warp * FA_DR + rl) * DP;
#pragma unroll
			for (int n = 0; n < ND; n++)
				*(float2 *)(dst + n * 8 + 2 * t) =
				    make_float2(acc[r][n][2 * hh], acc[r][n][2 * hh + 1]);
			if (t == 0)
				*(float2 *)(sML + (warp * FA_DR + rl) * 2) = make_float2(mrow[r][hh], l);
		}
#else
#pragma unroll
	for (int r = 0; r < FA_DR; r++) {
		float l = lrow[r];
		l += __shfl_xor_sync(0xffffffffu, l, 1);
		l += __shfl_xor_sync(0xffffffffu, l, 2);
		l += __shfl_xor_sync(0xffffffffu, l, 4);
		l += __shfl_xor_sync(0xffffffffu, l, 8);
		float *dst = sM + (warp * FA_DR + r) * DP;
#pragma unroll
		for (int c = 0; c < NCHL; c++) {
			const int cc = 4 * (lane + 32 * c);
			if (cc < FA_D)
				*(float4 *)(dst + cc) =
				    make_float4(acc[r][c][0], acc[r][c][1], acc[r][c][2], acc[r][c][3]);
		}
		if (lane == 0)
			*(float2 *)(sML + (warp * FA_DR + r) * 2) = make_float2(mrow[r], l);
	}
#endif
	__syncthreads();
	block_merge(p, sd, sM, sML, r0, hk, b, split);
}

/* The splits of each row combined: weights exp(lse_s - max), O = sum w_s O_s / sum w_s, lse =
 * max + log(sum w_s); a row no split saw: O = 0, lse = -inf. One warp per (b, h, i) row, rows in
 * the partials' order; the weights (IEEE exp and log: a few per row) go through shared memory,
 * then each lane sums its columns over the splits, four splits' loads in flight at a time (the
 * first version, split-inner per column, waited out one L2 latency per split and column: 25 us
 * of the 78 us of the B=1 x 32k shape). */
#define MERGE_WARPS 4
#define MERGE_MAX_SPLITS 256 /* planner_decode.c DEC_MAX_SPLITS */
#define MERGE_CPL ((FA_D + 31) / 32) /* columns per lane */
extern "C" __global__ void __launch_bounds__(32 * MERGE_WARPS) fa_decode_merge(const fa_dparams p)
{
	__shared__ float sw[MERGE_WARPS][MERGE_MAX_SPLITS];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const long long nrows = (long long)p.B * p.Hq * p.Sq;
	const long long row = (long long)blockIdx.x * MERGE_WARPS + warp;
	if (row >= nrows)
		return;
	const int qi = (int)(row % p.Sq);
	const long long bh = row / p.Sq;
	const int h = (int)(bh % p.Hq), b = (int)(bh / p.Hq);
	const fa_dseq sd = seq_of(p, b);
	if (qi >= sd.sq)
		return; /* a query row this sequence does not have */
	const int ns = min(seq_splits(p, sd), MERGE_MAX_SPLITS);
	float M = NEG_INF;
	for (int s = lane; s < ns; s += 32)
		M = fmaxf(M, p.pl[s * nrows + row]);
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
	float L = 0.f;
	for (int s = lane; s < ns; s += 32) {
		const float ls = p.pl[s * nrows + row];
		const float w = M == NEG_INF || ls == NEG_INF ? 0.f : expf(ls - M);
		sw[warp][s] = w;
		L += w;
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		L += __shfl_xor_sync(0xffffffffu, L, o);
	__syncwarp();
	float x[MERGE_CPL];
#pragma unroll
	for (int c = 0; c < MERGE_CPL; c++)
		x[c] = 0.f;
	const float *po = p.po + row * FA_D + lane;
	const long long sstride = nrows * FA_D;
#pragma unroll 4
	for (int s = 0; s < ns; s++) {
		const float w = sw[warp][s];
#pragma unroll
		for (int c = 0; c < MERGE_CPL; c++)
			if (lane + 32 * c < FA_D)
				x[c] += w * po[s * sstride + 32 * c];
	}
	const long long ob = sd.ob + qi * p.os[1] + h * p.os[2];
	const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
	for (int c = 0; c < MERGE_CPL; c++)
		if (lane + 32 * c < FA_D)
			store_o1(p.o, ob + lane + 32 * c, x[c] * inv);
	if (lane == 0 && p.lse)
		p.lse[sd.lb + h * p.ls[1] + qi * p.ls[2]] = L > 0.f ? M + logf(L) : NEG_INF;
}
