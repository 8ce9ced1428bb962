/* attn_bwd_sm90.cu - the Hopper (sm_90a) backward main pass on wgmma, 16-bit inputs (fp16, bf16).
 *
 * Compiled by NVRTC with -arch=sm_90a and the -D options below (kernels/gpu_nvrtc.c, path
 * FA_KPATH_BWDWG16 of kernels/planner_bwd.c); attn_bwd.cu's fa_bwd_pre and fa_bwd_dq (delta,
 * lse2, the zeroed fp32 dQ accumulator before; dQ converted after) run around it unchanged,
 * from that kernel's module of the same shape (kernels/gpu_bwd.c). Includes only fa_device.cuh,
 * whose wgmma helpers (fences, waits, descriptors) attn_fwd_sm90.cu shares.
 *
 *   FA_IN      1 fp16, 2 bf16 (Q, K, V, dO and the gradients in memory and on the tensor cores)
 *   FA_D       head dim, a multiple of 8 in [8, 256] (padded with zeros to 16 in shared memory,
 *              above 128 to 32: the wide form, at the end of this file)
 *   FA_NWG     warpgroups per block (1 or 2); each owns 64 keys: BKV = 64 NWG (the wide form:
 *              2, sharing 64 keys)
 *   FA_BQ      query rows per step: 64 or 128 (the N of S^T = K Q^T; the wide form: 64)
 *   FA_MASK    0 none, 1 causal bottom-right, 2 causal top-left (as attn_bwd.cu)
 *   FA_WIN     1: the sliding window, as attn_bwd.cu's: the host folds the mask into the range
 *              [win_lo, win_hi] of j - i that query i sees (fa_attn_window_diffs; FA_MASK is
 *              then ignored); a key block walks only the query blocks whose rows see one of its
 *              keys (qblock_range), element-wise masks only where an edge crosses a warpgroup's
 *              tile
 *   FA_SOFTCAP 1: logit softcapping, as attn_bwd.cu's 16-bit kernel: P = exp(cap tanh(s scale /
 *              cap) - lse) (the forward's MUFU tanh, fa_softcap2), dS = P (dP - delta)
 *              (1 - tanh^2), the gradient of the raw score, so dK and dQ keep their scale.
 *              Both off (default): the code and PTX as before them; on, the parameter block's
 *              tail (win_lo .. cap_log2) is declared
 *   FA_DET     2 (the deterministic dQ gpu_bwd.c asks for, rt = 3): in fixed point
 *              (fa_device.cuh, "the deterministic dQ in fixed point"): the atomic mode's grid,
 *              order and reductions, each part converted with its row's multiplier (loaded with
 *              the step, beside lse2 and delta) and its column's (shared memory, once): the
 *              narrow form adds packed pairs (one red.global.add.u64 per two columns, its adds
 *              counted per query block), the wide form converts in dQ's registers while dK and
 *              dV multiply and stages int32 for its bulk reduction (.u32). H200, bf16 S=4096:
 *              +8..14% over the atomic mode (kernels/RESULTS.md).
 *              1 (FA_BWD_DET_ROT=1 only, an experiment): the deterministic dQ by turns (the
 *              tile's rt = 2): a block adds a query block's dQ rows only when the counter of
 *              that (query head, query block) reads the number of adds that come before its
 *              own in a fixed order (under no mask and both causal ones the key blocks that see
 *              a query block are a prefix 0 .. M; under FA_WIN a range a .. M, and the chain
 *              counts from a: det_win_turn). Two orders, chosen per call by tstride's bit 8
 *              (gpu_bwd.c; under FA_WIN the chain only):
 *              rotated (det_rot, an experiment: off unless FA_BWD_DET_ROT=1, since without a
 *              mask it gave gradients far from the atomic mode's on the H200, 2026-12-03;
 *              not yet understood): the atomic mode's grid (key block fastest: the
 *              blocks of one head run side by side and share Q, dO and the dQ rows in L2); no
 *              mask: key block n starts at query block n nq / nk and wraps; causal: each starts
 *              at its diagonal; the order at a query block is the one the blocks reach it in
 *              (det_rank), so block n waits for n + 1, which got there nq / nk steps earlier.
 *              A block may wait on blocks launched after it (of its own batch and kv head), so
 *              gpu_bwd.c takes this order only when nk blocks fill at most a quarter of the
 *              GPU's resident blocks.
 *              chain (the default): the grid is (kv head, batch, key block), the key
 *              block slowest; every block starts at its first query block and the order is the
 *              key block index n (attn_bwd.cu's det_turn with groups of one): a block waits
 *              only on the block of its head one key block lower, launched before it.
 *              Either way each warp waits for itself (lane 0 spins, no block barrier); the
 *              count is handed on at the top of the next step, whose barrier follows every
 *              thread's fence, so the reductions have had a step to land.
 *
 * Why a second kernel (kernels/PERF-NOTES.md, backward): attn_bwd.cu runs five products per
 * step through one mma.sync warp-GEMM that reads both operands from shared memory, with P^T and
 * dS^T going through shared memory for the next products; wgmma (989 bf16 TFLOP/s on the H200
 * against mma.sync's 642) takes its A operand from registers, so P^T and dS^T stay where they
 * were computed for dV and dK, and only dS^T goes to shared memory, for dQ.
 *
 * A block owns BKV keys of one (batch, kv head): K and V resident in shared memory, dK and dV in
 * fp32 registers (each warpgroup its 64 keys' rows), over the query heads of the GQA group and
 * the query blocks the mask lets see its keys (FlashAttention-3's backward, without its producer
 * warp: cp.async by every thread). Per step, warpgroup w (keys 64w .. 64w + 63 of the block):
 *   S^T  = K_w Q^T,  dP^T = V_w dO^T      wgmma ss, A = K_w / V_w, B = Q / dO, both K-major (d)
 *   P^T  = exp2(S^T scale log2e - lse2),  dS^T = P^T (dP^T - delta)   in the accumulators
 *   dV  += P^T dO,   dK  += dS^T Q        wgmma rs: A = the accumulators packed to 16-bit (the
 *                                         m64k16 A fragment is the accumulator's own layout),
 *                                         B = dO / Q transposed (N-major: the same tile)
 *   dS^T to shared memory, a barrier, then warpgroup w's head-dim columns of
 *   dQ_step = dS K                        wgmma ss, A = dS (M-major), B = K (N-major), over all
 *                                         BKV keys, added to the fp32 accumulator with
 *                                         red.global.add.v2.f32
 * Q, dO, lse2 and delta of the next step load by cp.async into a second buffer while this one
 * computes. Two barriers per step (the step's tiles in; dS^T stored).
 *
 * Shared layouts: wgmma's no-swizzle core matrices (8 rows x 16 bytes), as attn_fwd_sm90.cu.
 * K, V, Q, dO are [row][d] (core_idx(row, d, DP)): K-major for S^T and dP^T (K = d), and, read
 * with the transpose bit, N-major for dV, dK (N = d, K = queries) and for dQ (N = d, K = keys):
 * a core matrix's 16-byte rows are 8 consecutive d of one row either way. dS^T is [key][query]
 * (core_idx(key, q, BQ)): M-major A of dQ (M = queries, K = keys), stored by each thread as the
 * 32-bit pairs of its accumulator.
 *
 * Head dims above 128 (dK and dV of 64 keys x 256 in fp32 would take every register of a
 * warpgroup): the wide form below splits the head dim over two warpgroups instead; the kernel
 * above is compiled only up to 128, so its code is the same as before the wide form existed.
 *
 * Not here (the planner keeps them on attn_bwd.cu): fp32 and its bf16 staging.
 *
 * Numerics as attn_bwd.cu's 16-bit kernel: P^T and dS^T rounded to the input type for the
 * products, fp32 accumulation, the plain exponent.
 */
#include "fa_device.cuh"

#ifndef FA_IN
#define FA_IN 2
#endif
#ifndef FA_D
#define FA_D 128
#endif
#ifndef FA_NWG
#define FA_NWG 2
#endif
#ifndef FA_BQ
#define FA_BQ 64
#endif
#ifndef FA_MASK
#define FA_MASK 0
#endif
#if FA_IN == 1
#define WG16_T "f16"
#elif FA_IN == 2
#define WG16_T "bf16"
#else
#error "attn_bwd_sm90.cu: 16-bit inputs only (FA_IN 1 or 2)"
#endif
#if FA_D % 8 || FA_D < 8 || FA_D > 256
#error "FA_D must be a multiple of 8 in [8, 256]"
#endif
#ifndef FA_DET
#define FA_DET 0
#endif
#if FA_DET != 0 && FA_DET != 1 && FA_DET != 2
#error "FA_DET: 0 atomic, 1 the chain, 2 fixed point"
#endif
#define DET_CHAIN (FA_DET == 1) /* the deterministic dQ by turns */
#define DQI (FA_DET == 2)       /* the deterministic dQ in fixed point (fa_device.cuh) */
/* the narrow form's packed pairs (fa_dqi_red2) are counted per query block of fa_bwd_pre's 64
 * rows (gpu_bwd.c's spec always has 64; fa_bwd_dq reads the counts per 64 rows) */
#if DQI && FA_D <= 128 && FA_BQ != 64
#error "FA_DET 2: the narrow form's fixed point takes 64-row query blocks"
#endif
#ifndef FA_WIN
#define FA_WIN 0
#endif
#ifndef FA_SOFTCAP
#define FA_SOFTCAP 0
#endif
#if FA_WIN /* the host folds the causal mask into the window's range (fa_attn_window_diffs) */
#undef FA_MASK
#define FA_MASK 0
#endif
#if FA_NWG != 1 && FA_NWG != 2
#error "FA_NWG: 1 or 2"
#endif
#if FA_BQ != 64 && FA_BQ != 128
#error "FA_BQ: 64 or 128"
#endif

#define NT (128 * FA_NWG)
#if FA_D <= 128
#define BKV (64 * FA_NWG)
#define DP ((FA_D + 15) / 16 * 16) /* attn_bwd.cu's padded head dim below 128 (the accumulator's) */
#define DQW (DP / FA_NWG)          /* head-dim columns of dQ per warpgroup */
#define SBO_D (DP / 8 * 128)       /* bytes between 8-row groups of a [row][d] tile */
#define SBO_B (FA_BQ / 8 * 128)    /* bytes between 8-key groups of dS^T */
#define NS (FA_BQ / 2)             /* S^T / dP^T accumulator floats per thread */
#define NKV (DP / 2)               /* dK / dV accumulator floats per thread */
#define NQ (DQW / 2)               /* dQ accumulator floats per thread and 64 query rows */
#define MQ (FA_BQ / 64)            /* 64-row tiles of dQ */
#if DQW % 8
#error "the head dim's split over the warpgroups must be a multiple of 8"
#endif
#else /* the wide form: two warpgroups on one block of 64 keys, the head dim halved */
#if FA_NWG != 2 || FA_BQ != 64
#error "head dims above 128: FA_NWG 2 and FA_BQ 64 only"
#endif
#define BKV 64
#define DP ((FA_D + 31) / 32 * 32) /* attn_bwd.cu's padded head dim above 128 (the accumulator's) */
#define DH (DP / 2)                /* head-dim columns of dK, dV and dQ per warpgroup */
#define QH 32 /* FA_BQ / 2: query columns of S^T and dP^T per warpgroup (a literal: WGB_NAME) */
#define SBO_D (DP / 8 * 128)
#define SBO_B (FA_BQ / 8 * 128)    /* bytes between 8-key groups of P^T and dS^T */
#define NS (QH / 2)
#define NKV (DH / 2)
#define NQ (DH / 2)
/* Experiments (FA_NVRTC_EXTRA, kernels/PERF-NOTES.md): FA_WIDE_DQ how dQ reaches the fp32
 * accumulator (default 3, the atomic mode's fastest; the deterministic dQ takes 0 then): 0
 * red.global.add.v2 from the accumulators, 1 red.global.add.v4 (pairs of lanes
 * swap halves), 2 staged in shared memory and added by one bulk reduction per row
 * (cp.reduce.async.bulk; the deterministic dQ takes 1 then), 3 staged as 2 but issued at the
 * next step's first barrier and waited for only before that step's prefetch, so the reduction
 * drains while S^T / dP^T multiply (four rows in a region of their own; the deterministic dQ
 * takes 0), 4 as 3 but issued at once (a barrier more); FA_WIDE_PF 1: the next step's
 * loads issued after S^T / dP^T, not before; FA_WIDE_ROT 1: key block n starts at its n-th
 * step (atomic dQ only), so that the key blocks of a head running together add into
 * different dQ rows; FA_WIDE_DIAG (timing only, wrong results): bit 1 no dQ adds, bit 2 no loads
 * after the first step's. */
#ifndef FA_WIDE_DQ
#define FA_WIDE_DQ 3 /* H200 2026-12-04, bf16 S=4096: D=256 25.8 ms (0: 27.0), D=192 20.4 (21.8) */
#endif
#ifndef FA_WIDE_PF
#define FA_WIDE_PF 0
#endif
#ifndef FA_WIDE_DIAG
#define FA_WIDE_DIAG 0
#endif
#ifndef FA_WIDE_ROT
#define FA_WIDE_ROT 0
#endif
/* FA_WIDE_CL: the key blocks run in clusters of two (key blocks 2m, 2m + 1 of one kv head,
 * __cluster_dims__) that walk the same steps: 1 each loads half of a step's Q and dO tiles and
 * copies the other half from its partner's shared memory (distributed shared memory), so that
 * the pair reads each tile from L2 once; 2 also sums the pair's staged dQ rows, each block adding
 * its partner's half of the rows into its own before its bulk reductions, so that the pair adds
 * each dQ row to the accumulator once. Needs the late bulk reduction (FA_WIDE_DQ 3) and the
 * full walk (no window, no rotation); the causal mask's pair starts at its first block's first
 * query block (the second block's extra step is fully masked: zeros). */
#ifndef FA_WIDE_CL
#define FA_WIDE_CL 0
#endif
#define WIDE_BULK (FA_WIDE_DQ >= 2 && !DET_CHAIN)
#define WIDE_LATE (FA_WIDE_DQ >= 3 && !DET_CHAIN) /* the bulk reduction waited for a step late */
#define WIDE_NOW (FA_WIDE_DQ == 4)             /* ... but issued at once */
#define WIDE_V4 (FA_WIDE_DQ == 1 || FA_WIDE_DQ == 2) /* red.global.add.v4 when not bulk */
#define WIDE_CL (FA_WIDE_CL && WIDE_LATE && !WIDE_NOW && !FA_WIN && !FA_WIDE_ROT && !(FA_WIDE_DIAG & 2))
#define WIDE_PAIR (WIDE_CL && FA_WIDE_CL == 2) /* the pair's dQ rows summed before the adds */
#define WIDE_RSTR (DP * 4 + 32) /* bytes between staged dQ rows (2 wavefronts per store) */
#if FA_DET == 2
#define WIDE_RED_T "u32" /* the staged rows' type: int32 in fixed point (two's complement) */
#else
#define WIDE_RED_T "f32"
#endif
#endif

#define DQC (DP + 4) /* FA_DET 2: attn_bwd.cu's stride of the column multipliers */

/* attn_bwd.cu's fa_bwd_params, field for field (gpu_bwd.c fills one block for both kernels;
 * this kernel reads the fields up to scale). */
struct fa_bwd_params {
	const void *q, *k, *v, *dout;
	void *dk, *dv;
	float *dqacc;       /* [B*Hq][sqp][DP] */
	const float *lse2;  /* [B*Hq][sqp] */
	const float *delta; /* [B*Hq][sqp] */
	int *turn;
	long long qs[3], ks[3], vs[3], dos[3], dks[3], dvs[3]; /* batch, seq, head */
	int B, Sq, Sk, Hq, Hkv, group;
	int sqp, nq; /* Sq rounded up to BQ, and its query blocks */
	float sl;    /* scale * log2(e), signed */
	float scale;
	int tstride; /* attn_bwd.cu's dgrp_lg: here the turn counters per query block (FA_DET 1) */
	float scale_lo;
	float *dqrow;       /* FA_DET 2: [B*Hq][sqp] the fixed point's row multipliers (NaN: bad) */
	const float *dqcol; /* FA_DET 2: [B*Hkv][DQC] its column multipliers */
#if FA_WIN || FA_SOFTCAP
	/* attn_bwd.cu's tail, declared by these specialisations only (the others' parameter
	 * block, hence PTX, stays as it was); the host always passes it. FA_WIN: key j visible to
	 * query i iff win_lo <= j - i <= win_hi; FA_SOFTCAP: scale / cap (signed), cap, its
	 * remainder (unused: the plain exponent), cap log2(e). */
	int win_lo, win_hi;
	float cap_scale, cap, cap_lo, cap_log2;
#endif
};
/* gpu_bwd.c's struct bwd_params: 288 bytes before the tail (8-aligned), whose six 4-byte
 * fields then start at 288 */
static_assert(sizeof(fa_bwd_params) == (FA_WIN || FA_SOFTCAP ? 312 : 288),
              "the parameter block's layout (gpu_bwd.c's struct bwd_params)");

#if FA_WIN
/* The query blocks [f, l) whose rows see some key of the block's [kv0, kv0 + BKV)
 * (attn_bwd.cu's qblock_range): the rows [max(0, kv0 - win_hi), min(Sq, ke - win_lo)), ke one
 * past the block's last key, rounded out to whole blocks; empty (0, 0) when no row sees one.
 * In 64 bits: kv0 - win_hi reaches 2^31. */
__device__ __forceinline__ void qblock_range(const fa_bwd_params &p, int kv0, int &f, int &l)
{
	const long long k0 = kv0, ke = kv0 + BKV < p.Sk ? kv0 + BKV : (long long)p.Sk;
	const long long ilo = k0 - p.win_hi > 0 ? k0 - p.win_hi : 0LL;
	const long long ihi = ke - p.win_lo < p.Sq ? ke - p.win_lo : (long long)p.Sq;
	f = ilo < ihi ? (int)(ilo / FA_BQ) : 0;
	l = ilo < ihi ? (int)((ihi + FA_BQ - 1) / FA_BQ) : 0;
}

/* FA_DET (the chain) under a window: the adds to query block iq (rows from q0) that come
 * before key block n's. The key blocks that see a query block are a range [a, b), not the
 * masks' prefix 0 .. M: its rows see the keys from max(0, q0 + win_lo) to min(Sk - 1, last
 * row + win_hi), one interval (each row's is win_hi - win_lo + 1 >= 1 long and the next row's
 * starts one further), and qblock_range is the same relation seen from the keys, so exactly
 * the blocks a .. b - 1 visit iq, each for every query head of the group. Block n waits for
 * n - a adds, all from lower key blocks, launched before it on the chain's grid (key block
 * slowest): no deadlock. Counting from 0 would wait for adds that never come. */
__device__ __forceinline__ int det_win_turn(const fa_bwd_params &p, int n, int q0)
{
	const long long k0 = (long long)q0 + p.win_lo; /* the first key iq's rows see */
	return n - (k0 > 0 ? (int)(k0 / BKV) : 0);
}
#endif

#if FA_SOFTCAP
/* tanh(s scale / cap) of a raw score: P = exp(cap tc - lse) (attn_bwd.cu's 16-bit kernel: the
 * forward's MUFU tanh, fa_softcap2, and the plain exponent), and dS takes 1 - tc^2, the
 * derivative of cap tanh(x / cap), so that dK = scale dS^T Q and dQ = scale dS K stay. */
__device__ __forceinline__ float cap_tanh(const fa_bwd_params &p, float s)
{
	return fa_softcap2<false>(s, p.cap_scale, 1.f);
}
#endif

/* The query blocks a key block walks: [iq0, iq1) under FA_WIN; to p.nq otherwise, read where it
 * always was, so that the other specialisations' PTX stays as it was. */
#if FA_WIN
#define IQ_END iq1
#else
#define IQ_END p.nq
#endif

/* FA_DET: the hand-over of a step's dQ adds, attn_bwd.cu's release_turn for the block: every
 * thread fences its reductions (issued a step ago), the caller's barrier follows, then one thread
 * counts one more add. */
__device__ __forceinline__ void det_fence(void)
{
	asm volatile("fence.acq_rel.gpu;" ::: "memory");
}
__device__ __forceinline__ void det_count(int *turn)
{
	asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(turn) : "memory");
}

/* FA_DET rotated: the query block of a step's position j (from the block's first query block)
 * when the block starts rot0 further on and wraps at nq (rot0 = 0: j itself). */
__device__ __forceinline__ int det_iq(int j, int rot0, int nq)
{
	if (DET_CHAIN && !FA_MASK) {
		j += rot0;
		if (j >= nq)
			j -= nq;
	}
	return j;
}

/* FA_DET rotated: the adds to query block iq (of every query head) that come before key block
 * n's, in the order the key blocks reach iq: with no mask block m starts at query block
 * m nq / nk, so m = M, M - 1, .., 0, nk - 1, .., M + 1 with M the last block started at or before
 * iq; under a causal mask every block starts at its diagonal and the blocks that see iq are
 * 0 .. M, so M, M - 1, .., 0. Each block n waits for n + 1 (mod nk), which reached iq
 * nq / nk steps earlier (causal: 2 BKV / BQ), so a block rarely waits; the waits follow
 * (step, -key block), so they make no cycle, and a block waits on later launched ones only
 * within its (batch, kv head): gpu_bwd.c takes this order only when nk blocks fit a
 * quarter of the GPU at once. q0: iq's first row; off: the causal offset. */
__device__ __forceinline__ int det_rank(const fa_bwd_params &p, int n, int iq, int q0, int off)
{
	const int nk = (int)gridDim.x;
	int M;
	if (FA_MASK) { /* iq's last row sees keys up to ql (>= 0: block n sees iq) */
		const int ql = min(q0 + FA_BQ, p.Sq) - 1 + off;
		M = min(nk - 1, ql / BKV);
	} else {
		M = (int)(((long long)(iq + 1) * nk - 1) / p.nq);
	}
	const int r = M - n;
	return r < 0 ? r + nk : r;
}

/* Index (in elements) of element (row, col) of a tile of `cols` 16-bit columns in core
 * matrices (attn_fwd_sm90.cu's core_idx with 8 elements per 16-byte row). */
__device__ __forceinline__ int cidx(int row, int col, int cols)
{
	return ((row >> 3) * (cols / 8) + (col >> 3)) * 64 + (row & 7) * 8 + (col & 7);
}

__device__ __forceinline__ u32 pack16(float lo, float hi)
{
	return fa_pack16<FA_IN>(lo, hi);
}

/* ---- wgmma wrappers (tools/gen-wgmma.py --bwd): m64nNk16, fp32 accumulate; ss: A and B by
 * descriptor with their transpose bits TA, TB; rs: A from registers, B's transpose bit TB. */
template <int TA, int TB>
__device__ __forceinline__ void wgb_ss_n8(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3}, %4, %5, p, 1, 1, %6, %7;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgb_rs_n8(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, %9;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}
template <int TA, int TB>
__device__ __forceinline__ void wgb_ss_n16(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %10, %11;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgb_rs_n16(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, %13;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}
template <int TA, int TB>
__device__ __forceinline__ void wgb_ss_n32(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %18, %19;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgb_rs_n32(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %21;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}
template <int TA, int TB>
__device__ __forceinline__ void wgb_ss_n64(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %34, %35;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgb_rs_n64(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}
template <int TA, int TB>
__device__ __forceinline__ void wgb_ss_n128(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %66, %67;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "l"(da), "l"(db), "n"(TA), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgb_rs_n128(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB));
}

#define WGB_NAME_(form, n) wgb_##form##_n##n
#define WGB_NAME(form, n) WGB_NAME_(form, n)

/* acc[0 .. REM/2) += A B over REM head-dim columns from column D0 of a B tile, split into the
 * wgmma widths 128, 64, 32, 16, 8 (one k16 step). ss: A by descriptor da (transpose bit TA);
 * rs: A the register fragment a. B: N-major [row][d] tile at baddr (lbo: bytes between its
 * 8-row groups along K), column D0 at baddr + D0 / 8 * 128. */
template <int TA, int D0, int REM>
__device__ __forceinline__ void mm_ss(float *acc, u64 da, u32 baddr, u32 lbo)
{
	if constexpr (REM >= 128) {
		WGB_NAME(ss, 128)<TA, 1>(acc + D0 / 2, da, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_ss<TA, D0 + 128, REM - 128>(acc, da, baddr, lbo);
	} else if constexpr (REM >= 64) {
		WGB_NAME(ss, 64)<TA, 1>(acc + D0 / 2, da, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_ss<TA, D0 + 64, REM - 64>(acc, da, baddr, lbo);
	} else if constexpr (REM >= 32) {
		WGB_NAME(ss, 32)<TA, 1>(acc + D0 / 2, da, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_ss<TA, D0 + 32, REM - 32>(acc, da, baddr, lbo);
	} else if constexpr (REM >= 16) {
		WGB_NAME(ss, 16)<TA, 1>(acc + D0 / 2, da, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_ss<TA, D0 + 16, REM - 16>(acc, da, baddr, lbo);
	} else if constexpr (REM >= 8) {
		WGB_NAME(ss, 8)<TA, 1>(acc + D0 / 2, da, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
	}
}
template <int D0, int REM>
__device__ __forceinline__ void mm_rs(float *acc, const u32 (&a)[4], u32 baddr, u32 lbo)
{
	if constexpr (REM >= 128) {
		WGB_NAME(rs, 128)<1>(acc + D0 / 2, a, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_rs<D0 + 128, REM - 128>(acc, a, baddr, lbo);
	} else if constexpr (REM >= 64) {
		WGB_NAME(rs, 64)<1>(acc + D0 / 2, a, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_rs<D0 + 64, REM - 64>(acc, a, baddr, lbo);
	} else if constexpr (REM >= 32) {
		WGB_NAME(rs, 32)<1>(acc + D0 / 2, a, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_rs<D0 + 32, REM - 32>(acc, a, baddr, lbo);
	} else if constexpr (REM >= 16) {
		WGB_NAME(rs, 16)<1>(acc + D0 / 2, a, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
		mm_rs<D0 + 16, REM - 16>(acc, a, baddr, lbo);
	} else if constexpr (REM >= 8) {
		WGB_NAME(rs, 8)<1>(acc + D0 / 2, a, wg_desc2(baddr + D0 / 8 * 128, lbo, 128));
	}
}

/* NROWS rows of a [row][d] tensor (row stride rs elements) into core matrices by 16-byte
 * cp.async; rows >= valid and head dims past D zero-filled. The caller commits. */
template <int NROWS>
__device__ __forceinline__ void load_tile(u16 *s, const u16 *g, long long rs, int valid)
{
	constexpr int CPR = DP / 8, TOTAL = NROWS * CPR;
#pragma unroll 4
	for (int i = (int)threadIdx.x; i < TOTAL; i += NT) {
		const int r = i / CPR, c = i - r * CPR;
		const bool ok = r < valid && c * 8 < FA_D;
		cp_async16(smem_u32(s + cidx(r, c * 8, DP)), ok ? g + r * rs + c * 8 : g, ok ? 16 : 0);
	}
}

/* Step (query head h of the group, query block iq): Q and dO tiles (one commit group, with
 * the caller's commit), lse2 and delta by cp.async too (4 bytes each: the rows of sqp exist). */
template <int QROWS = FA_BQ> /* of Q and dO: rows qr .. qr + QROWS - 1 only (the wide form's pairs) */
__device__ __forceinline__ void load_step(const fa_bwd_params &p, u16 *sQ, u16 *sdO, float *sL,
                                          float *sDl, int b, int h, int iq, int qr = 0)
{
	const int q0 = iq * FA_BQ, t0 = q0 + qr;
	const long long bh = (long long)b * p.Hq + h;
	load_tile<QROWS>(sQ + qr * DP,
	                 (const u16 *)p.q + b * p.qs[0] + h * p.qs[2] + (long long)t0 * p.qs[1],
	                 p.qs[1], p.Sq - t0);
	load_tile<QROWS>(sdO + qr * DP,
	                 (const u16 *)p.dout + b * p.dos[0] + h * p.dos[2] + (long long)t0 * p.dos[1],
	                 p.dos[1], p.Sq - t0);
	const int tid = (int)threadIdx.x;
	for (int i = tid; i < 2 * FA_BQ / 4; i += NT) { /* 16 bytes = 4 rows per copy */
		const bool dl = i >= FA_BQ / 4;
		const int r = (dl ? i - FA_BQ / 4 : i) * 4;
		cp_async16(smem_u32((dl ? sDl : sL) + r), (dl ? p.delta : p.lse2) + bh * p.sqp + q0 + r,
		           16);
	}
	/* FA_DET 2: the rows' fixed-point multipliers, two buffers after delta's (sMR0) */
	for (int i = tid; DQI && i < FA_BQ / 4; i += NT)
		cp_async16(smem_u32(sDl + 2 * FA_BQ + 4 * i), p.dqrow + bh * p.sqp + q0 + 4 * i, 16);
}

/* FA_DET 2: the (batch, kv head)'s column multipliers (fa_bwd_pre's) into shared memory, read
 * after the first step's barrier. */
__device__ __forceinline__ void load_col_mul(const fa_bwd_params &p, float *sMC, int b, int hk)
{
	for (int x = (int)threadIdx.x; x < DP; x += NT)
		sMC[x] = p.dqcol[((long long)b * p.Hkv + hk) * DQC + x];
}

#if FA_D <= 128
/* ---------------------------------------------------------------------------------------------
 * The main pass; grid (key block, kv head, batch), block NT threads. */
extern "C" __global__ void __launch_bounds__(NT, 1) fa_bwd_main(const fa_bwd_params p)
{
	extern __shared__ __align__(128) unsigned char smem_raw[];
	u16 *sK = (u16 *)smem_raw;              /* BKV x DP */
	u16 *sV = sK + BKV * DP;                /* BKV x DP */
	u16 *sQ0 = sV + BKV * DP;               /* 2 buffers of BQ x DP */
	u16 *sdO0 = sQ0 + 2 * FA_BQ * DP;       /* 2 buffers of BQ x DP */
	u16 *sdS = sdO0 + 2 * FA_BQ * DP;       /* BKV x BQ, [key][query] */
	float *sL0 = (float *)(sdS + BKV * FA_BQ); /* 2 x BQ */
	float *sDl0 = sL0 + 2 * FA_BQ;          /* 2 x BQ */
	float *sMR0 = sDl0 + 2 * FA_BQ;         /* FA_DET 2: 2 x BQ row multipliers (load_step) */
	float *sMC = sMR0 + 2 * FA_BQ;          /* FA_DET 2: DP column multipliers */

	const int tid = (int)threadIdx.x, lane = tid & 31, wg = tid >> 7, wi = (tid >> 5) & 3;
	const int g = lane >> 2, c = lane & 3, r0 = 16 * wi + g;
	/* FA_DET: tstride's bit 8 (det_rot) picks the rotated order on the atomic mode's grid, else
	 * the chain on the grid with the key block slowest (gpu_bwd.c) */
	const bool rot = DET_CHAIN && !FA_WIN && (p.tstride >> 8) != 0; /* a window: the chain */
	const int n = DET_CHAIN && !rot ? (int)blockIdx.z : (int)blockIdx.x;
	const int hk = DET_CHAIN && !rot ? (int)blockIdx.x : (int)blockIdx.y;
	const int b = DET_CHAIN && !rot ? (int)blockIdx.y : (int)blockIdx.z;
	const int kv0 = n * BKV, kw0 = kv0 + 64 * wg; /* the block's, the warpgroup's first key */
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */
#if FA_WIN
	int iq0, iq1; /* the query blocks whose rows see the block's keys: steps follow the window */
	qblock_range(p, kv0, iq0, iq1);
	(void)off;
#else
	int iq0 = 0; /* the first query block whose rows see key kv0 */
	if (FA_MASK) {
		const int r = kv0 - off;
		iq0 = r >= p.Sq ? p.nq : r > 0 ? r / FA_BQ : 0;
	}
#endif

	load_tile<BKV>(sK, (const u16 *)p.k + b * p.ks[0] + hk * p.ks[2] + (long long)kv0 * p.ks[1],
	               p.ks[1], p.Sk - kv0);
	load_tile<BKV>(sV, (const u16 *)p.v + b * p.vs[0] + hk * p.vs[2] + (long long)kv0 * p.vs[1],
	               p.vs[1], p.Sk - kv0);
	if (DQI)
		load_col_mul(p, sMC, b, hk);
	const int nsteps = IQ_END - iq0, total = nsteps * p.group;
	/* FA_DET rotated, no mask: key block n starts at query block n nq / nk and wraps */
	const int rot0 = DET_CHAIN && !FA_MASK && rot ? n * p.nq / (int)gridDim.x : 0;
	if (total > 0)
		load_step(p, sQ0, sdO0, sL0, sDl0, b, hk * p.group, iq0);
	cp_async_commit();

	float dk[NKV], dv[NKV];
#pragma unroll
	for (int i = 0; i < NKV; i++)
		dk[i] = dv[i] = 0.f;
	const u32 kaddr = smem_u32(sK + 64 * wg * DP), vaddr = smem_u32(sV + 64 * wg * DP);

	int *prev_turn = nullptr; /* the chain: the counter of the last step's adds, not yet counted */
	for (int it = 0; it < total; it++) {
		const int hh = it / nsteps, iq = det_iq(iq0 + (it - hh * nsteps), rot0, p.nq);
		const int h = hk * p.group + hh, q0 = iq * FA_BQ, buf = it & 1;
		const long long bh = (long long)b * p.Hq + h;
		const u16 *sQ = sQ0 + buf * FA_BQ * DP, *sdO = sdO0 + buf * FA_BQ * DP;
		const float *sL = sL0 + buf * FA_BQ, *sDl = sDl0 + buf * FA_BQ;
		/* this step's tiles landed (every thread's copies: the barrier), and every warpgroup is
		 * done with the step before (its wgmmas waited for): the other buffers and dS^T are
		 * free */
		cp_async_wait<0>();
		fence_proxy_async();
		if (DET_CHAIN && prev_turn)
			det_fence();
		__syncthreads();
		if (DET_CHAIN && prev_turn && tid == 0)
			det_count(prev_turn);
		if (it + 1 < total) {
			const int hn = (it + 1) / nsteps;
			const int iqn = det_iq(iq0 + (it + 1 - hn * nsteps), rot0, p.nq);
			load_step(p, sQ0 + (buf ^ 1) * FA_BQ * DP, sdO0 + (buf ^ 1) * FA_BQ * DP,
			          sL0 + (buf ^ 1) * FA_BQ, sDl0 + (buf ^ 1) * FA_BQ, b, hk * p.group + hn,
			          iqn);
		}
		cp_async_commit();

		/* S^T = K_w Q^T, dP^T = V_w dO^T (K-major both, k over d) */
		float s[NS], dp[NS];
#pragma unroll
		for (int i = 0; i < NS; i++)
			s[i] = dp[i] = 0.f;
		const u32 qaddr = smem_u32(sQ), doaddr = smem_u32(sdO);
		wg_fence();
#pragma unroll
		for (int ks = 0; ks < DP / 16; ks++)
			WGB_NAME(ss, FA_BQ)<0, 0>(s, wg_desc(kaddr + ks * 256, SBO_D),
			                            wg_desc(qaddr + ks * 256, SBO_D));
#pragma unroll
		for (int ks = 0; ks < DP / 16; ks++)
			WGB_NAME(ss, FA_BQ)<0, 0>(dp, wg_desc(vaddr + ks * 256, SBO_D),
			                            wg_desc(doaddr + ks * 256, SBO_D));
		wg_commit();
		wg_wait<0>();
#pragma unroll
		for (int i = 0; i < NS; i++) {
			wg_touch(s[i]);
			wg_touch(dp[i]);
		}

		/* P^T, dS^T; the key tail and the causal edge (FA_WIN: the window's edges) masked
		 * where the tile has them */
#if FA_WIN
		const bool need_mask = kw0 + 64 > p.Sk || kw0 - (q0 + FA_BQ - 1) < p.win_lo ||
		                       kw0 + 63 - q0 > p.win_hi;
#else
		const bool need_mask = kw0 + 64 > p.Sk || (FA_MASK && kw0 + 63 > q0 + off);
#endif
#pragma unroll
		for (int nb = 0; nb < FA_BQ / 8; nb++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int il = nb * 8 + 2 * c + (e & 1);
#if FA_SOFTCAP
				const float tc = cap_tanh(p, s[4 * nb + e]);
				float pv = fast_exp2(fmaf(tc, p.cap_log2, -sL[il]));
#else
				float pv = fast_exp2(fmaf(s[4 * nb + e], p.sl, -sL[il]));
#endif
				if (need_mask) {
					const int j = kw0 + r0 + (e >> 1) * 8;
#if FA_WIN
					if (!fa_win_sees(q0 + il, j, p.Sk, p.win_lo, p.win_hi))
#else
					if (!(j < p.Sk && (!FA_MASK || j <= q0 + il + off)))
#endif
						pv = 0.f;
				}
				s[4 * nb + e] = pv;
				dp[4 * nb + e] = pv * (dp[4 * nb + e] - sDl[il]);
#if FA_SOFTCAP
				dp[4 * nb + e] *= fmaf(-tc, tc, 1.f);
#endif
			}
		/* as A fragments (k16 step m: queries 16m .. 16m + 15): a0 (r0, 2c..), a1 (r0 + 8, 2c..),
		 * a2 (r0, 8 + 2c..), a3 (r0 + 8, 8 + 2c..) */
		u32 pa[FA_BQ / 16][4], da[FA_BQ / 16][4];
#pragma unroll
		for (int m = 0; m < FA_BQ / 16; m++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int x = 8 * m + ((e & 1) ? 2 : 0) + ((e & 2) ? 4 : 0);
				pa[m][e] = pack16(s[x], s[x + 1]);
				da[m][e] = pack16(dp[x], dp[x + 1]);
			}
		/* dV += P^T dO, dK += dS^T Q (B N-major: K = queries, 8-row groups SBO_D apart) */
		wg_fence();
#pragma unroll
		for (int m = 0; m < FA_BQ / 16; m++)
			mm_rs<0, DP>(dv, pa[m], doaddr + m * 2 * SBO_D, SBO_D);
#pragma unroll
		for (int m = 0; m < FA_BQ / 16; m++)
			mm_rs<0, DP>(dk, da[m], qaddr + m * 2 * SBO_D, SBO_D);
		wg_commit();

		/* dS^T to shared memory for dQ: [key][query] core matrices, a thread's pairs of
		 * queries are 32-bit words */
#pragma unroll
		for (int m = 0; m < FA_BQ / 16; m++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int key = 64 * wg + r0 + ((e & 1) ? 8 : 0);
				const int q = 16 * m + ((e & 2) ? 8 : 0) + 2 * c;
				*(u32 *)(sdS + cidx(key, q, FA_BQ)) = da[m][e];
			}
		fence_proxy_async();
		__syncthreads();

		/* dQ_step[:, w DQW ..] = dS K over the block's keys: A = dS (M-major: 8-query groups 128
		 * bytes apart, 8-key groups SBO_B), B = K (N-major) */
		float dq[MQ][NQ];
#pragma unroll
		for (int mt = 0; mt < MQ; mt++)
#pragma unroll
			for (int i = 0; i < NQ; i++)
				dq[mt][i] = 0.f;
		const u32 dsaddr = smem_u32(sdS), kall = smem_u32(sK) + wg * DQW / 8 * 128;
		wg_fence();
#pragma unroll
		for (int mt = 0; mt < MQ; mt++)
#pragma unroll
			for (int ks = 0; ks < BKV / 16; ks++)
				mm_ss<1, 0, DQW>(dq[mt], wg_desc2(dsaddr + mt * 1024 + ks * 2 * SBO_B, SBO_B, 128),
				                 kall + ks * 2 * SBO_D, SBO_D);
		wg_commit();
		wg_wait<0>();
#pragma unroll
		for (int i = 0; i < NKV; i++) {
			wg_touch(dk[i]);
			wg_touch(dv[i]);
		}
		if (DET_CHAIN) { /* this block's turn: the adds that come before its own have landed */
			int *t = p.turn + (bh * p.nq + iq) * (p.tstride & 255);
#if FA_WIN
			const int my = det_win_turn(p, n, q0);
#else
			const int my = rot ? det_rank(p, n, iq, q0, off) : n;
#endif
			if (lane == 0)
				while (fa_ld_acquire(t) != my)
					__nanosleep(32);
			__syncwarp();
			prev_turn = t;
		}
		float *acc = p.dqacc + (bh * p.sqp + q0) * DP + wg * DQW;
#if DQI
		/* fixed point (fa_device.cuh): the multipliers from shared memory (the rows' came with
		 * the step), packed pairs (the step's adds counted in the query block's turn counter,
		 * zeroed by fa_bwd_pre); a row whose part does not fit marked NaN */
		const float *col = sMC + wg * DQW;
		const float *sMR = sMR0 + buf * FA_BQ;
		float *const rm0 = p.dqrow + bh * p.sqp + q0;
		if (tid == 0)
			fa_dqi_red(p.turn + (bh * p.nq + iq) * (p.tstride & 255), 1);
#endif
#pragma unroll
		for (int mt = 0; mt < MQ; mt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int il = 64 * mt + r0 + 8 * hf;
				if (q0 + il < p.Sq) {
#if DQI
					float *rm = rm0 + il;
					const float mr = sMR[il];
					bool bad = false;
#endif
#pragma unroll
					for (int nb = 0; nb < DQW / 8; nb++) {
						wg_touch(dq[mt][4 * nb + 2 * hf]);
						wg_touch(dq[mt][4 * nb + 2 * hf + 1]);
						float *a = acc + il * DP + nb * 8 + 2 * c;
#if DQI
						const float2 mc = *(const float2 *)(col + nb * 8 + 2 * c);
						fa_dqi_red2((int *)a, fa_dqi_fix(dq[mt][4 * nb + 2 * hf], mr, mc.x, bad),
						            fa_dqi_fix(dq[mt][4 * nb + 2 * hf + 1], mr, mc.y, bad));
#else
						asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a),
						             "f"(dq[mt][4 * nb + 2 * hf]), "f"(dq[mt][4 * nb + 2 * hf + 1])
						             : "memory");
#endif
					}
#if DQI
					if (bad)
						*rm = FA_NAN;
#endif
				}
			}
	}
	cp_async_wait<0>(); /* K and V landed even when no step ran */
	if (DET_CHAIN && prev_turn) { /* the last step's adds */
		det_fence();
		__syncthreads();
		if (tid == 0)
			det_count(prev_turn);
	}

	/* dK = scale dS^T Q, dV, in their dtype; keys past Sk and head dims past D not written */
	u16 *dKg = (u16 *)p.dk + b * p.dks[0] + hk * p.dks[2];
	u16 *dVg = (u16 *)p.dv + b * p.dvs[0] + hk * p.dvs[2];
#pragma unroll
	for (int hf = 0; hf < 2; hf++) {
		const int j = kw0 + r0 + 8 * hf;
		if (j >= p.Sk)
			continue;
#pragma unroll
		for (int nb = 0; nb < DP / 8; nb++) {
			const int col = nb * 8 + 2 * c;
			if (col >= FA_D)
				continue;
			*(u32 *)(dKg + (long long)j * p.dks[1] + col) =
			    pack16(p.scale * dk[4 * nb + 2 * hf], p.scale * dk[4 * nb + 2 * hf + 1]);
			*(u32 *)(dVg + (long long)j * p.dvs[1] + col) =
			    pack16(dv[4 * nb + 2 * hf], dv[4 * nb + 2 * hf + 1]);
		}
	}
}
#else /* FA_D > 128 */
/* ---------------------------------------------------------------------------------------------
 * The wide form (head dims 136..256): dK and dV of 64 keys x DP in fp32 take 2 DP registers per
 * thread of one warpgroup (512 at D = 256), so two warpgroups share the block's 64 keys and
 * split the head dim: warpgroup w holds dK, dV of the 64 keys x head-dim columns w DH .. w DH +
 * DH - 1 (FlashAttention-3's hdim-256 backward splits the same way). S^T and dP^T are computed
 * once, split over the query columns (w takes queries w QH .. w QH + QH - 1, contracting over
 * the whole head dim), and go through shared memory as P^T and dS^T in the input type, so that
 * each warpgroup multiplies every key's row by its own half of dO and Q:
 *   S^T_w = K Q_w^T,  dP^T_w = V dO_w^T        wgmma ss, N = QH queries, K-major both (K = d)
 *   P^T, dS^T as in the narrow form, stored [key][query] (core_idx(key, q, BQ)); a barrier
 *   dQ_step[:, w] = dS K[:, w]                 wgmma ss, A = dS (M-major), B = K (N-major)
 *   dV[:, w] += P^T dO[:, w],  dK[:, w] += dS^T Q[:, w]
 *                                              wgmma ss, A = P^T / dS^T (K-major: K = queries),
 *                                              B = dO / Q (N-major: N = d)
 * dQ is its own commit group, issued first. Atomic mode (FA_WIDE_DQ 3): when every wgmma of
 * the step is done (a barrier), dQ is staged in fp32 in the step's Q / dO buffers (and four rows
 * in their own region), and at the next step's first barrier 64 threads add it to the
 * accumulator, one cp.reduce.async.bulk per row; the reduction drains while that step's S^T /
 * dP^T multiply and is waited for only before its prefetch overwrites the buffers. The
 * deterministic dQ adds in turn with red.global.add while dK and dV multiply. The next step's
 * barrier frees P^T, dS^T and the buffers the next prefetch overwrites. Grid, masks, the
 * deterministic dQ and the epilogue as the narrow form; the head dim is padded to 32
 * (attn_bwd.cu's DP above 128: the dQ accumulator's row, shared with its pre and dq passes). Shared memory: K, V (64 x DP), two
 * buffers of Q and dO (64 x DP), P^T and dS^T (64 x 64), lse2 and delta, four staged dQ rows
 * (FA_WIDE_DQ 3): 218,112 bytes at D = 256, under sm_90's 232,448.
 */
/* Clusters (WIDE_CL): this block's rank, a shared address of the partner's, 16-byte loads and
 * stores, and the cluster's barrier (every thread of both blocks; release / acquire, so the
 * shared-memory writes before it, cp.async's waited for included, are seen after it). */
__device__ __forceinline__ u32 cluster_rank(void)
{
	u32 r;
	asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
	return r;
}
__device__ __forceinline__ u32 cluster_map(u32 addr, u32 rank)
{
	u32 r;
	asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
	return r;
}
__device__ __forceinline__ uint4 ld_cluster16(u32 a)
{
	uint4 v;
	asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
	             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	             : "r"(a)
	             : "memory");
	return v;
}
__device__ __forceinline__ uint4 ld_shared16(u32 a)
{
	uint4 v;
	asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
	             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
	             : "r"(a)
	             : "memory");
	return v;
}
__device__ __forceinline__ void st_shared16(u32 a, uint4 v)
{
	asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(v.x), "r"(v.y),
	             "r"(v.z), "r"(v.w)
	             : "memory");
}
__device__ __forceinline__ void cluster_sync(void)
{
	asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
	             "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/* Step it of key block n: its query head hh of the group and query block iq (FA_WIDE_ROT: the
 * steps rotated by n). */
__device__ __forceinline__ void wide_step(int it, int n, int total, int nsteps, int iq0, int &hh,
                                          int &iq)
{
	if (FA_WIDE_ROT && !DET_CHAIN) {
		it += n % total;
		it -= it >= total ? total : 0;
	}
	hh = it / nsteps;
	iq = iq0 + (it - hh * nsteps);
}

/* The next step's Q, dO, lse2 and delta into the other buffer (one commit group, empty on the
 * last step). */
__device__ __forceinline__ void wide_prefetch(const fa_bwd_params &p, u16 *sQ0, u16 *sdO0,
                                              float *sL0, float *sDl0, int b, int hk, int it,
                                              int total, int nsteps, int iq0, int buf, int n)
{
	if (it + 1 < total && !((FA_WIDE_DIAG & 2) && it > 0)) {
		int hn, iqn;
		wide_step(it + 1, n, total, nsteps, iq0, hn, iqn);
		load_step<WIDE_CL ? 32 : FA_BQ>(p, sQ0 + (buf ^ 1) * FA_BQ * DP,
		                                sdO0 + (buf ^ 1) * FA_BQ * DP, sL0 + (buf ^ 1) * FA_BQ,
		                                sDl0 + (buf ^ 1) * FA_BQ, b, hk * p.group + hn, iqn,
		                                WIDE_CL ? 32 * (int)cluster_rank() : 0);
	}
	cp_async_commit();
}

/* FA_WIDE_DQ 2: where staged dQ row r (fp32, DP wide) lies: rows 0..29 in Q's buffer and 32..61
 * in dO's, WIDE_RSTR apart (30 of them fit from DP 120 up), the other four in P^T's. */
__device__ __forceinline__ u32 wide_stage_row(const u16 *sQ, const u16 *sdO, const u16 *sP, int r)
{
	const int h = r >> 5, i = r & 31;
	if (i < 30)
		return smem_u32(h ? sdO : sQ) + (u32)(i * WIDE_RSTR);
	return smem_u32(sP) + (u32)((2 * h + i - 30) * DP * 4);
}
/* WIDE_BULK: staged rows 0 .. rows - 1 added to the accumulator's rows at acc, one bulk
 * reduction per row by threads 0..63 (each its own bulk group; the rows' stores fenced for the
 * async proxy and behind a barrier). */
__device__ __forceinline__ void wide_bulk_add(float *acc, int rows, const u16 *sQ, const u16 *sdO,
                                              const u16 *sP, int tid)
{
#if WIDE_PAIR /* this block's half of the rows (wide_pair_sum added the partner's into them) */
	const int lo = 32 * (int)cluster_rank(), nr = 32;
#else
	const int lo = 0, nr = 64;
#endif
	tid += lo;
	if (tid < rows && tid < lo + nr && !(FA_WIDE_DIAG & 1)) {
		/* FA_DET 2: the rows hold int32 (two's complement: the unsigned add is the same) */
		asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add." WIDE_RED_T " [%0], "
		             "[%1], %2;" ::"l"(acc + (long long)tid * DP),
		             "r"(wide_stage_row(sQ, sdO, sP, tid)), "r"(DP * 4)
		             : "memory");
		asm volatile("cp.async.bulk.commit_group;" ::: "memory");
	}
}
__device__ __forceinline__ void bulk_wait_read(void)
{
	asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

/* WIDE_CL: the partner's half of this step's Q and dO tiles (rows 32 pr .. 32 pr + 31: four
 * 8-row groups, contiguous in the core-matrix layout, 16 KB each at D = 256) copied from its
 * shared memory to the same place in this block's. */
__device__ __forceinline__ void wide_copy_half(const u16 *sQ, const u16 *sdO, u32 pr, int tid)
{
	constexpr int CH = 32 * DP * 2 / 16, N = 2 * CH / NT; /* 16-byte chunks: half a tile, each thread's */
	static_assert(N * NT == 2 * CH, "the halves' chunks split evenly over the threads");
	const u32 q = smem_u32(sQ) + pr * (32 * DP * 2), o = smem_u32(sdO) + pr * (32 * DP * 2);
	uint4 v[N];
#pragma unroll
	for (int k = 0; k < N; k++) {
		const int i = tid + k * NT;
		v[k] = ld_cluster16(cluster_map(i < CH ? q + i * 16 : o + (i - CH) * 16, pr));
	}
#pragma unroll
	for (int k = 0; k < N; k++) {
		const int i = tid + k * NT;
		st_shared16(i < CH ? q + i * 16 : o + (i - CH) * 16, v[k]);
	}
}

/* WIDE_PAIR: rows 32 r .. 32 r + 31 of the last step's staged dQ (this block's half of them):
 * the partner's added into this block's (fp32, or the fixed point's int32). */
__device__ __forceinline__ void wide_pair_sum(const u16 *sQ, const u16 *sdO, const u16 *sX, u32 r,
                                              int tid)
{
	constexpr int CPR = DP / 4, N = 32 * CPR / NT; /* 16-byte chunks per row, each thread's */
	static_assert(N * NT == 32 * CPR, "the rows' chunks split evenly over the threads");
	u32 a[N];
	uint4 v[N];
#pragma unroll
	for (int k = 0; k < N; k++) {
		const int i = tid + k * NT;
		a[k] = wide_stage_row(sQ, sdO, sX, 32 * (int)r + i / CPR) + (u32)(i % CPR) * 16;
		v[k] = ld_cluster16(cluster_map(a[k], r ^ 1));
	}
#pragma unroll
	for (int k = 0; k < N; k++) {
		uint4 m = ld_shared16(a[k]);
#if FA_DET == 2
		m.x += v[k].x, m.y += v[k].y, m.z += v[k].z, m.w += v[k].w;
#else
		m.x = __float_as_uint(__uint_as_float(m.x) + __uint_as_float(v[k].x));
		m.y = __float_as_uint(__uint_as_float(m.y) + __uint_as_float(v[k].y));
		m.z = __float_as_uint(__uint_as_float(m.z) + __uint_as_float(v[k].z));
		m.w = __float_as_uint(__uint_as_float(m.w) + __uint_as_float(v[k].w));
#endif
		st_shared16(a[k], m);
	}
}

#if WIDE_CL
#define WIDE_CLUSTER __cluster_dims__(2, 1, 1)
#else
#define WIDE_CLUSTER
#endif
extern "C" __global__ void __launch_bounds__(NT, 1) WIDE_CLUSTER fa_bwd_main(const fa_bwd_params p)
{
	extern __shared__ __align__(128) unsigned char smem_raw[];
	u16 *sK = (u16 *)smem_raw;                 /* 64 x DP */
	u16 *sV = sK + BKV * DP;                   /* 64 x DP */
	u16 *sQ0 = sV + BKV * DP;                  /* 2 buffers of BQ x DP */
	u16 *sdO0 = sQ0 + 2 * FA_BQ * DP;          /* 2 buffers of BQ x DP */
	u16 *sP = sdO0 + 2 * FA_BQ * DP;           /* 64 x BQ, [key][query] */
	u16 *sdS = sP + BKV * FA_BQ;               /* 64 x BQ, [key][query] */
	float *sL0 = (float *)(sdS + BKV * FA_BQ); /* 2 x BQ */
	float *sDl0 = sL0 + 2 * FA_BQ;             /* 2 x BQ */
	/* WIDE_LATE: staged dQ rows 30, 31, 62, 63 (4 x DP fp32; P^T is rewritten before the
	 * reduction that reads them is waited for) */
	float *sMR0 = sDl0 + 2 * FA_BQ; /* FA_DET 2: 2 x BQ row multipliers (load_step), then sX */
	u16 *sX = (u16 *)(sDl0 + 2 * FA_BQ + (DQI ? 2 * FA_BQ : 0));
	u16 *const sXP = WIDE_LATE ? sX : sP;
	float *sMC = (float *)sX + 4 * DP; /* FA_DET 2: DP column multipliers, after sX */

	const int tid = (int)threadIdx.x, lane = tid & 31, wg = tid >> 7, wi = (tid >> 5) & 3;
	const int g = lane >> 2, c = lane & 3, r0 = 16 * wi + g;
	const int n = DET_CHAIN ? (int)blockIdx.z : (int)blockIdx.x;
	const int hk = DET_CHAIN ? (int)blockIdx.x : (int)blockIdx.y;
	const int b = DET_CHAIN ? (int)blockIdx.y : (int)blockIdx.z;
	const int kv0 = n * BKV, wq = QH * wg; /* the block's first key, the warpgroup's first query */
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */
	/* the host rounds the key blocks up to pairs: without clusters the extra one has nothing */
	if (!WIDE_CL && kv0 >= p.Sk)
		return;
#if FA_WIN
	int iq0, iq1; /* the query blocks whose rows see the block's keys: steps follow the window */
	qblock_range(p, kv0, iq0, iq1);
	(void)off;
#else
	int iq0 = 0; /* the first query block whose rows see key kv0 (WIDE_CL: the pair's first) */
	if (FA_MASK) {
		const int r = (WIDE_CL ? kv0 & ~(2 * BKV - 1) : kv0) - off;
		iq0 = r >= p.Sq ? p.nq : r > 0 ? r / FA_BQ : 0;
	}
#endif
	const u32 crank = WIDE_CL ? cluster_rank() : 0; /* the pair's rows of Q, dO and dQ: 32 crank .. */

	load_tile<BKV>(sK, (const u16 *)p.k + b * p.ks[0] + hk * p.ks[2] + (long long)kv0 * p.ks[1],
	               p.ks[1], p.Sk - kv0);
	load_tile<BKV>(sV, (const u16 *)p.v + b * p.vs[0] + hk * p.vs[2] + (long long)kv0 * p.vs[1],
	               p.vs[1], p.Sk - kv0);
	if (DQI)
		load_col_mul(p, sMC, b, hk);
	const int nsteps = IQ_END - iq0, total = nsteps * p.group;
	if (total > 0) {
		int h0, i0;
		wide_step(0, n, total, nsteps, iq0, h0, i0);
		load_step<WIDE_CL ? 32 : FA_BQ>(p, sQ0, sdO0, sL0, sDl0, b, hk * p.group + h0, i0,
		                                32 * (int)crank);
	}
	cp_async_commit();

	float dk[NKV], dv[NKV];
#pragma unroll
	for (int i = 0; i < NKV; i++)
		dk[i] = dv[i] = 0.f;
	/* byte offset of the warpgroup's head-dim columns in a [row][d] tile (DH / 8 core matrices) */
	const u32 dcol = (u32)(wg * DH / 8 * 128);
	const u32 kaddr = smem_u32(sK), vaddr = smem_u32(sV);
	const u32 paddr = smem_u32(sP), dsaddr = smem_u32(sdS);

	int *prev_turn = nullptr; /* the chain: the counter of the last step's adds, not yet counted */
	float *prev_acc = nullptr; /* WIDE_LATE: the last step's dQ rows, staged, not yet added */
	int prev_rows = 0;
	for (int it = 0; it < total; it++) {
		int hh, iq;
		wide_step(it, n, total, nsteps, iq0, hh, iq);
		const int h = hk * p.group + hh, q0 = iq * FA_BQ, buf = it & 1;
		const long long bh = (long long)b * p.Hq + h;
		const u16 *sQ = sQ0 + buf * FA_BQ * DP, *sdO = sdO0 + buf * FA_BQ * DP;
		const float *sL = sL0 + buf * FA_BQ, *sDl = sDl0 + buf * FA_BQ;
		/* this step's tiles landed (every thread's copies: the barrier), and both warpgroups
		 * are done with the step before (their wgmmas waited for): the other buffers, P^T and
		 * dS^T are free */
		cp_async_wait<0>();
		fence_proxy_async();
		if (DET_CHAIN && prev_turn)
			det_fence();
		if (WIDE_BULK && !WIDE_LATE && tid < 64)
			bulk_wait_read(); /* the last step's staged dQ row read: its buffer is reused */
#if WIDE_CL
		/* both blocks' halves landed and the partner's last step staged its dQ rows: copy its
		 * half of the tiles (and add its half of this block's dQ rows), then the block's
		 * barrier before wgmma reads them */
		cluster_sync();
		wide_copy_half(sQ, sdO, crank ^ 1, tid);
		if (WIDE_PAIR && it > 0)
			wide_pair_sum(sQ0 + (buf ^ 1) * FA_BQ * DP, sdO0 + (buf ^ 1) * FA_BQ * DP, sX, crank,
			              tid);
		fence_proxy_async();
#endif
		__syncthreads();
		if (DET_CHAIN && prev_turn && tid == 0)
			det_count(prev_turn);
		if (WIDE_LATE && !WIDE_NOW && it > 0) /* the last step's rows, in the other buffer and sX */
			wide_bulk_add(prev_acc, prev_rows, sQ0 + (buf ^ 1) * FA_BQ * DP,
			              sdO0 + (buf ^ 1) * FA_BQ * DP, sX, tid);
		if (!FA_WIDE_PF && !WIDE_LATE)
			wide_prefetch(p, sQ0, sdO0, sL0, sDl0, b, hk, it, total, nsteps, iq0, buf, n);

		/* S^T = K Q_w^T, dP^T = V dO_w^T over the warpgroup's QH queries (K-major, k over d) */
		float s[NS], dp[NS];
#pragma unroll
		for (int i = 0; i < NS; i++)
			s[i] = dp[i] = 0.f;
		const u32 qaddr = smem_u32(sQ), doaddr = smem_u32(sdO);
		const u32 qw = qaddr + wq / 8 * SBO_D, dow = doaddr + wq / 8 * SBO_D;
		wg_fence();
#pragma unroll
		for (int ks = 0; ks < DP / 16; ks++)
			WGB_NAME(ss, QH)<0, 0>(s, wg_desc(kaddr + ks * 256, SBO_D), wg_desc(qw + ks * 256, SBO_D));
#pragma unroll
		for (int ks = 0; ks < DP / 16; ks++)
			WGB_NAME(ss, QH)<0, 0>(dp, wg_desc(vaddr + ks * 256, SBO_D),
			                         wg_desc(dow + ks * 256, SBO_D));
		wg_commit();
		if (FA_WIDE_PF && !WIDE_LATE)
			wide_prefetch(p, sQ0, sdO0, sL0, sDl0, b, hk, it, total, nsteps, iq0, buf, n);
		wg_wait<0>();
#pragma unroll
		for (int i = 0; i < NS; i++) {
			wg_touch(s[i]);
			wg_touch(dp[i]);
		}

		/* P^T, dS^T; the key tail and the causal edge (FA_WIN: the window's edges) masked
		 * where the tile has them; both to shared memory, a thread's pairs of queries as
		 * 32-bit words */
#if FA_WIN
		const bool need_mask = kv0 + 64 > p.Sk || kv0 - (q0 + wq + QH - 1) < p.win_lo ||
		                       kv0 + 63 - (q0 + wq) > p.win_hi;
#else
		const bool need_mask = kv0 + 64 > p.Sk || (FA_MASK && kv0 + 63 > q0 + wq + off);
#endif
#pragma unroll
		for (int nb = 0; nb < QH / 8; nb++) {
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int il = wq + nb * 8 + 2 * c + (e & 1);
#if FA_SOFTCAP
				const float tc = cap_tanh(p, s[4 * nb + e]);
				float pv = fast_exp2(fmaf(tc, p.cap_log2, -sL[il]));
#else
				float pv = fast_exp2(fmaf(s[4 * nb + e], p.sl, -sL[il]));
#endif
				if (need_mask) {
					const int j = kv0 + r0 + (e >> 1) * 8;
#if FA_WIN
					if (!fa_win_sees(q0 + il, j, p.Sk, p.win_lo, p.win_hi))
#else
					if (!(j < p.Sk && (!FA_MASK || j <= q0 + il + off)))
#endif
						pv = 0.f;
				}
				s[4 * nb + e] = pv;
				dp[4 * nb + e] = pv * (dp[4 * nb + e] - sDl[il]);
#if FA_SOFTCAP
				dp[4 * nb + e] *= fmaf(-tc, tc, 1.f);
#endif
			}
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int at = cidx(r0 + 8 * hf, wq + nb * 8 + 2 * c, FA_BQ);
				*(u32 *)(sP + at) = pack16(s[4 * nb + 2 * hf], s[4 * nb + 2 * hf + 1]);
				*(u32 *)(sdS + at) = pack16(dp[4 * nb + 2 * hf], dp[4 * nb + 2 * hf + 1]);
			}
		}
		if (WIDE_LATE && tid < 64)
			bulk_wait_read(); /* the last step's rows read: the other buffer is reused */
		fence_proxy_async();
		/* WIDE_CL: the partner's copies from this step's buffers and its sum of the last
		 * step's rows are done too: the prefetch and this step's staging may overwrite them */
		if (WIDE_CL)
			cluster_sync();
		else
			__syncthreads();
		if (WIDE_LATE)
			wide_prefetch(p, sQ0, sdO0, sL0, sDl0, b, hk, it, total, nsteps, iq0, buf, n);

		/* dQ_step[:, w] = dS K[:, w] over the 64 keys: A = dS (M-major: 8-query groups 128
		 * bytes apart, 8-key groups SBO_B), B = K (N-major); then dV[:, w] += P^T dO[:, w],
		 * dK[:, w] += dS^T Q[:, w]: A = P^T / dS^T (K-major: 8-query groups 128 bytes apart,
		 * 8-key groups SBO_B), B = dO / Q (N-major, K = queries) */
		float dq[NQ];
#pragma unroll
		for (int i = 0; i < NQ; i++)
			dq[i] = 0.f;
		wg_fence();
#pragma unroll
		for (int ks = 0; ks < BKV / 16; ks++)
			mm_ss<1, 0, DH>(dq, wg_desc2(dsaddr + ks * 2 * SBO_B, SBO_B, 128),
			                kaddr + dcol + ks * 2 * SBO_D, SBO_D);
		wg_commit();
#pragma unroll
		for (int ks = 0; ks < FA_BQ / 16; ks++)
			mm_ss<0, 0, DH>(dv, wg_desc(paddr + ks * 256, SBO_B), doaddr + dcol + ks * 2 * SBO_D,
			                SBO_D);
#pragma unroll
		for (int ks = 0; ks < FA_BQ / 16; ks++)
			mm_ss<0, 0, DH>(dk, wg_desc(dsaddr + ks * 256, SBO_B), qaddr + dcol + ks * 2 * SBO_D,
			                SBO_D);
		wg_commit();
		wg_wait<1>(); /* dQ's group */
#pragma unroll
		for (int i = 0; i < NQ; i++)
			wg_touch(dq[i]);
#if DQI
		/* fixed point (fa_device.cuh), while dK and dV multiply: dq's registers take the
		 * int32 parts (staged below); a row whose part does not fit is marked there */
		bool dq_bad[2] = {false, false};
#pragma unroll
		for (int hf = 0; hf < 2; hf++) {
			const float mr = q0 + r0 + 8 * hf < p.Sq ? sMR0[buf * FA_BQ + r0 + 8 * hf] : 0.f;
#pragma unroll
			for (int nb = 0; nb < DH / 8; nb++) {
				const float2 mc = *(const float2 *)(sMC + wg * DH + 2 * c + nb * 8);
				dq[4 * nb + 2 * hf] =
				    __int_as_float(fa_dqi_fix(dq[4 * nb + 2 * hf], mr, mc.x, dq_bad[hf]));
				dq[4 * nb + 2 * hf + 1] =
				    __int_as_float(fa_dqi_fix(dq[4 * nb + 2 * hf + 1], mr, mc.y, dq_bad[hf]));
			}
		}
#endif
		if (DET_CHAIN) { /* this block's turn: the lower key blocks that see iq have added */
			int *t = p.turn + (bh * p.nq + iq) * p.tstride;
#if FA_WIN
			const int my = det_win_turn(p, n, q0);
#else
			const int my = n;
#endif
			if (lane == 0)
				while (fa_ld_acquire(t) != my)
					__nanosleep(32);
			__syncwarp();
			prev_turn = t;
		}
		float *acc = p.dqacc + (bh * p.sqp + q0) * DP + wg * DH;
		if ((FA_WIDE_DIAG & 1) || WIDE_BULK) {
		} else if (WIDE_V4) {
			/* lanes c and c ^ 1 swap a pair: the even one adds 4 columns of row r0, the odd
			 * one 4 of row r0 + 8 */
			const int odd = c & 1, il = r0 + 8 * odd;
#pragma unroll
			for (int nb = 0; nb < DH / 8; nb++) {
				const float *d4 = dq + 4 * nb; /* row r0: d4[0], d4[1]; row r0 + 8: d4[2], d4[3] */
				const float s0 = odd ? d4[0] : d4[2], s1 = odd ? d4[1] : d4[3];
				const float r0v = __shfl_xor_sync(0xffffffffu, s0, 1);
				const float r1v = __shfl_xor_sync(0xffffffffu, s1, 1);
				const float m0 = odd ? d4[2] : d4[0], m1 = odd ? d4[3] : d4[1];
				float *a = acc + il * DP + nb * 8 + 2 * (c & 2);
				if (q0 + il < p.Sq)
					asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(a),
					             "f"(odd ? r0v : m0), "f"(odd ? r1v : m1), "f"(odd ? m0 : r0v),
					             "f"(odd ? m1 : r1v)
					             : "memory");
			}
		} else {
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int il = r0 + 8 * hf;
				if (q0 + il < p.Sq)
#pragma unroll
					for (int nb = 0; nb < DH / 8; nb++) {
						float *a = acc + il * DP + nb * 8 + 2 * c;
						asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(a),
						             "f"(dq[4 * nb + 2 * hf]), "f"(dq[4 * nb + 2 * hf + 1])
						             : "memory");
					}
			}
		}
		wg_wait<0>();
#pragma unroll
		for (int i = 0; i < NKV; i++) {
			wg_touch(dk[i]);
			wg_touch(dv[i]);
		}
		if (WIDE_BULK) {
			/* every wgmma of the step is done (both warpgroups: the barrier): this step's Q,
			 * dO and P^T hold the dQ rows (30 + 30 in Q and dO, 2 + 2 in P^T), each added to
			 * the accumulator by one bulk reduction */
			__syncthreads();
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const u32 row = wide_stage_row(sQ, sdO, sXP, r0 + 8 * hf) + wg * DH * 4 + 8 * c;
				/* fp32, or (FA_DET 2) the int32 parts converted above, as the same bits */
#pragma unroll
				for (int nb = 0; nb < DH / 8; nb++)
					asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(row + nb * 32),
					             "f"(dq[4 * nb + 2 * hf]), "f"(dq[4 * nb + 2 * hf + 1])
					             : "memory");
#if DQI
				if (dq_bad[hf] && q0 + r0 + 8 * hf < p.Sq) /* a part that did not fit */
					p.dqrow[bh * p.sqp + q0 + r0 + 8 * hf] = FA_NAN;
#endif
			}
			fence_proxy_async();
			if (WIDE_LATE && !WIDE_NOW) { /* added at the next step's first barrier */
				prev_acc = p.dqacc + (bh * p.sqp + q0) * DP;
				prev_rows = min(FA_BQ, p.Sq - q0);
			} else {
				__syncthreads();
				wide_bulk_add(p.dqacc + (bh * p.sqp + q0) * DP, min(FA_BQ, p.Sq - q0), sQ,
				              sdO, sXP, tid);
			}
		}
	}
	if (WIDE_LATE && !WIDE_NOW && total > 0) {
		const int lb = (total - 1) & 1;
#if WIDE_PAIR
		cluster_sync();
		wide_pair_sum(sQ0 + lb * FA_BQ * DP, sdO0 + lb * FA_BQ * DP, sX, crank, tid);
		fence_proxy_async();
#endif
		__syncthreads();
		wide_bulk_add(prev_acc, prev_rows, sQ0 + lb * FA_BQ * DP, sdO0 + lb * FA_BQ * DP, sX,
		              tid);
	}
	if (WIDE_BULK && tid < 64)
		bulk_wait_read(); /* the last rows read before the block's shared memory goes */
	if (WIDE_CL) /* the partner's last reads of this block's shared memory are done */
		cluster_sync();
	cp_async_wait<0>(); /* K and V landed even when no step ran */
	if (DET_CHAIN && prev_turn) { /* the last step's adds */
		det_fence();
		__syncthreads();
		if (tid == 0)
			det_count(prev_turn);
	}

	/* dK = scale dS^T Q, dV, in their dtype: the warpgroup's head-dim columns; keys past Sk and
	 * head dims past D not written */
	u16 *dKg = (u16 *)p.dk + b * p.dks[0] + hk * p.dks[2];
	u16 *dVg = (u16 *)p.dv + b * p.dvs[0] + hk * p.dvs[2];
#pragma unroll
	for (int hf = 0; hf < 2; hf++) {
		const int j = kv0 + r0 + 8 * hf;
		if (j >= p.Sk)
			continue;
#pragma unroll
		for (int nb = 0; nb < DH / 8; nb++) {
			const int col = wg * DH + nb * 8 + 2 * c;
			if (col >= FA_D)
				continue;
			*(u32 *)(dKg + (long long)j * p.dks[1] + col) =
			    pack16(p.scale * dk[4 * nb + 2 * hf], p.scale * dk[4 * nb + 2 * hf + 1]);
			*(u32 *)(dVg + (long long)j * p.dvs[1] + col) =
			    pack16(dv[4 * nb + 2 * hf], dv[4 * nb + 2 * hf + 1]);
		}
	}
}
#endif
