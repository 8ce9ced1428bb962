/* attn_bwd.cu - FlashAttention-2 style backward kernels, compiled at run time by NVRTC.
 *
 * Embedded as fa_src_attn_bwd (tools/embed.sh) and specialised with -D options like attn_fwd.cu
 * (kernels/gpu_nvrtc.c builds them from the planner's backward tile, kernels/planner_bwd.c):
 *
 *   FA_IN      element type in shared memory and on the tensor cores: 1 fp16, 2 bf16, 3 fp32
 *   FA_GIN     element type of Q, K, V, O, dO, dQ, dK, dV in global memory: FA_IN, or 3 (fp32)
 *              with FA_IN 2: the fp32 "bf16" precision (inputs rounded to bf16 to nearest even
 *              as they are staged into shared memory; gradients written as fp32)
 *   FA_PREC    fp32 only: 1 ieee (FFMA), 2 3xtf32, 3 tf32
 *   FA_D       head dim, a multiple of 8 in [8, 256]
 *   FA_NW      warps per block
 *   FA_BKV     keys a block owns (multiple of 16)
 *   FA_BQ      query rows per step (multiple of 16)
 *   FA_MASK    0 none, 1 causal bottom-right (key j visible to query i iff j <= i + Sk - Sq),
 *              2 causal top-left (j <= i)
 *   FA_STAGES  1: Q, dO of the next step loaded after this one; 2: into a second buffer while
 *              this one computes
 *   FA_WIN     1: a sliding window (fa_attn.h) with the mask folded in by the host, as the
 *              forward's: key j is visible to query i iff win_lo <= j - i <= win_hi (runtime
 *              parameters; FA_MASK is then ignored). A key block walks only the query blocks
 *              whose rows see one of its keys (qblock_range), so its time follows the window;
 *              element-wise masks only in the steps an edge crosses. 0 (default): FA_MASK alone,
 *              the code (and PTX) as before
 *   FA_SOFTCAP 1: logit softcapping, s' = cap tanh(s scale / cap) (the forward's lse is of s'):
 *              P = exp(s' - lse) and dS = P (dP - delta) (1 - tanh^2), the gradient of the raw
 *              score, so that dK = scale dS^T Q and dQ = scale dS K stay as they are. tanhf for
 *              fp32 ieee / 3xtf32 (the exponent then compensated as without it), the forward's
 *              MUFU form elsewhere (fa_softcap2). 0 (default): unchanged
 *
 * Four kernels, one module (fa_bwd_kvscale only for FA_DET 2, below):
 *   fa_bwd_pre   per query row (warp per row): delta = rowsum(dO * O) in fp32, lse2 = lse *
 *                log2(e) (+inf where lse is -inf or past Sq: such rows give P = 0, so they
 *                contribute nothing; FA_XEXP: the natural lse, a large finite sentinel), the
 *                row of the fp32 dQ accumulator zeroed, the deterministic mode's counters
 *                zeroed.
 *   fa_bwd_main  a block owns BKV keys of one (batch, kv head), K and V resident in shared
 *                memory, dK and dV accumulated in fp32 registers over the query heads of its
 *                GQA group and the query blocks the mask lets see its keys. Per step (BQ rows):
 *                S^T = K Q^T and dP^T = V dO^T (the block's warps tile the BKV x BQ product),
 *                P^T = exp2(S^T scale log2e - lse2), dS^T = P^T (dP^T - delta), both to shared
 *                memory; dV += P^T dO, dK += dS^T Q (warps tile BKV x D), dQ_step = dS K
 *                (warps tile BQ x D) added to the fp32 accumulator with red.global.add. The
 *                deterministic specialisation (FA_DET) adds in a fixed order: each warp's part
 *                of a query block's rows has a counter of the adds done; a warp waits until it
 *                reads the number of adds that come before its own (det_turn: every lower key
 *                block, by groups), adds with the same reductions, and counts its add one step
 *                later (a fence then finds the reductions performed: nothing waits on their
 *                latency). The key blocks that see a query block are a range (a prefix under the
 *                masks, which hide keys above a diagonal; FA_WIN also hides those below one), a
 *                turn counts from the range's first block, and a block waits only on blocks
 *                launched before it or with it in its group: no deadlock (a key block that sees
 *                no query block waits for nothing and is waited for by none).
 *   fa_bwd_dq    dQ = scale * accumulator, converted to its dtype and strides (FA_DET 2: from
 *                the fixed point, a marked row NaN).
 *   fa_bwd_kvscale  FA_DET 2: the maxima of |K_jd| per column and of |V_j| per (batch, kv
 *                head) that fa_bwd_pre turns into the fixed point's multipliers.
 *
 * Operands are read from shared memory by one warp-GEMM (wgemm): 16-bit by ldmatrix (.trans for
 * the transposed operands), rows padded by 16 bytes; fp32 by scalar loads in the m16n8k8
 * layout, rows padded by 4 words. Above 128 the head dim is padded with zero columns to a
 * multiple of 32 (below, to 16 in both paths), so that two warps can split dK, dV and dQ's columns
 * (with one, their accumulators take more registers than there are). 3xtf32 adds every k
 * step's big x big product, started from zero, with an IEEE add (FA_X3SPLIT: the tensor cores'
 * truncating accumulation, chained over the three products of every k step, biased S, dP and
 * dQ); ieee sums a step's dK and dV from zero and adds them (the FFMA chain is a step long).
 */

#include "fa_device.cuh"

#ifndef FA_IN
#define FA_IN 2
#endif
#ifndef FA_GIN
#define FA_GIN FA_IN
#endif
#ifndef FA_PREC
#define FA_PREC 2
#endif
#ifndef FA_D
#define FA_D 128
#endif
#ifndef FA_NW
#define FA_NW 8
#endif
#ifndef FA_BKV
#define FA_BKV 64
#endif
#ifndef FA_BQ
#define FA_BQ 64
#endif
#ifndef FA_MASK
#define FA_MASK 0
#endif

#if FA_GIN != FA_IN && !(FA_GIN == 3 && FA_IN == 2)
#error "FA_GIN: FA_IN, or 3 (fp32 in global memory) with FA_IN 2"
#endif

#define NT (FA_NW * 32)
#if FA_IN == 3
typedef float in_t;
#define ES 4
#define DP (FA_D <= 128 ? (FA_D + 15) / 16 * 16 : (FA_D + 31) / 32 * 32) /* fa_bwd_padded_d */
#define LDS (DP + 4)
#define LDP (FA_BQ + 4)
#define KK 8
#else
typedef u16 in_t;
#define ES 2
#define DP (FA_D <= 128 ? (FA_D + 15) / 16 * 16 : (FA_D + 31) / 32 * 32)
#define LDS (DP + 8)
#define LDP (FA_BQ + 8)
#define KK 16
#endif
#define DQC (DP + 4) /* FA_DET 2: a (batch, kv head)'s column multipliers, then |V|'s bound */
/* fp32 ieee and 3xtf32: P = exp(s scale - lse) with the exponent's roundings compensated
 * (fa_p_exp_comp, fa_device.cuh): the plain exp2(s scale log2e - lse2) loses |lse2| ~ 10 ulps
 * of fp32 in the exponent, measured as most of these precisions' gradient error (PERF-NOTES.md, backward).
 * lse2 then holds the natural lse (a large finite sentinel, not +inf, for rows that give
 * P = 0). tf32 and the 16-bit kernels keep the plain exponent (their operands' rounding is
 * larger than its error). */
#ifndef FA_XEXP /* -DFA_XEXP=0: the plain exponent everywhere (the comparison of PERF-NOTES.md) */
#if FA_IN == 3 && FA_PREC != 3
#define FA_XEXP 1
#else
#define FA_XEXP 0
#endif
#endif
/* 3xtf32: every k step's big*big product starts from zero and is added with an IEEE add, the
 * two small cross products go to their own accumulator (FA_X3SPLIT 1, measured 3.3x less error
 * at D=128; 2: both from zero every k step); the tensor cores truncate as they accumulate, so
 * chaining the three products of every k step into one accumulator (0, before) biased S, dP
 * and the dQ step toward zero by about 48 truncations. With it the k loop is not unrolled
 * (unrolled 2 or 4 times, the extra accumulators spilled at kv128 q32 and D=256). */
#ifndef FA_X3SPLIT
#define FA_X3SPLIT 1
#endif
/* FA_DET 1: the deterministic dQ's kernel (PERF-NOTES.md, backward; its own specialisation,
 * gpu_bwd.c asks for it with the tile's rt = 2, so that the atomic kernel carries none of its
 * registers: near the 16-bit tiles' 255, they spilled). Consecutive key blocks of a (batch, kv
 * head) run as groups of 2^dgrp_lg (gpu_bwd.c's det_group_lg, from the setting
 * FA_BWD_DET_GROUP; at most the blocks that can be resident at once), each member starting its query blocks 2 x its rank further on, so that
 * the members add to different dQ rows at any time while sharing Q, dO and the accumulator in
 * L2. With groups of one (the default) a key block's adds follow key block n - 1's.
 * FA_DET 2 (gpu_bwd.c's rt = 3, for every precision whose error is above fp32's: fp16, bf16,
 * tf32, the bf16 staging): the same bits on every run by adding in fixed point instead
 * (fa_device.cuh, "the deterministic dQ in fixed point"): the accumulator holds int32, the
 * atomic mode's grid and order, each part converted with its row's and column's multipliers
 * and added as packed pairs (fa_dqi_red2, the step's adds counted); fa_bwd_kvscale and
 * fa_bwd_pre make the multipliers, fa_bwd_dq converts back. ieee and 3xtf32 keep FA_DET 1:
 * 2^-28 of the bound is not fp32's error. */
#ifndef FA_DET
#define FA_DET 0
#endif
#if FA_DET == 2 && FA_IN == 3 && FA_PREC != 3
#error "FA_DET 2 (fixed point): not for fp32 ieee / 3xtf32, whose error is below its rounding"
#endif
#if FA_DET == 3 && FA_IN != 3
#error "FA_DET 3 (64-bit fixed point): fp32 only"
#endif
/* FA_DET 3 (rt = 4): the fixed point in 64 bits (fa_device.cuh), the pre, kvscale and dq
 * passes of attn_bwd_sm90_tf32.cu's deterministic 3xtf32 (this kernel's own main pass adds
 * one red.global.add.u64 per element; gpu_bwd.c keeps its ieee / 3xtf32 on FA_DET 1) */
#define DET_CHAIN (FA_DET == 1)
#define DQI64 (FA_DET == 3)
#define DQI (FA_DET == 2 || DQI64)
#define DQW64 (DQI64 ? 2 : 1) /* the accumulator's words per element */
#ifndef FA_WIN
#define FA_WIN 0
#endif
#ifndef FA_SOFTCAP
#define FA_SOFTCAP 0
#endif
/* FA_SOFTCAP's tanh: tanhf where the tolerance is fp32's (ieee, 3xtf32), the forward's MUFU
 * form elsewhere (fa_softcap2 in fa_device.cuh, as attn_fwd.cu's softcap_scores) */
#define CAP_ACCURATE (FA_IN == 3 && FA_PREC != 3)

#if FA_GIN == 3
typedef float gin_t;
#else
typedef u16 gin_t;
#endif
#define CONV (FA_GIN != FA_IN)

/* Warp layouts (mirrored by fa_bwd_layout_ok in planner_bwd.c): S^T, dP^T and dK, dV split the
 * keys over WM_S warps and the columns over WN_S; dQ splits the rows over WM_Q. */
#define WM_S (FA_NW < FA_BKV / 16 ? FA_NW : FA_BKV / 16)
#define WN_S (FA_NW / WM_S)
#define MT_S (FA_BKV / 16 / WM_S)
#define NT_S (FA_BQ / 8 / WN_S)
#define NT_KV (DP / 8 / WN_S)
#define WM_Q (FA_NW < FA_BQ / 16 ? FA_NW : FA_BQ / 16)
#define WN_Q (FA_NW / WM_Q)
#define MT_Q (FA_BQ / 16 / WM_Q)
#define NT_Q (DP / 8 / WN_Q)
static_assert(WM_S * WN_S == FA_NW && WM_Q * WN_Q == FA_NW, "warp layout");
static_assert(FA_BQ % (8 * WN_S) == 0 && DP % (8 * WN_S) == 0 && DP % (8 * WN_Q) == 0 &&
              FA_BKV % (16 * WM_S) == 0 && FA_BQ % (16 * WM_Q) == 0, "warp tiles");
#if FA_IN != 3
static_assert(NT_S % 2 == 0 && NT_KV % 2 == 0 && NT_Q % 2 == 0, "16-bit: n8 tiles in pairs");
#endif

/* Shared memory (elements of in_t, then fp32): K, V, STAGES x (Q, dO), P^T, dS^T, STAGES x
 * (lse2, delta). Mirrored by fa_bwd_tile_smem in planner_bwd.c. */
#define SM_KV (FA_BKV * LDS)
#define SM_Q (FA_BQ * LDS)
#define SM_P (FA_BKV * LDP)

/* Parameters; mirrored in kernels/gpu_bwd.c (same order, same types). */
struct fa_bwd_params {
	const void *q, *k, *v, *dout;
	void *dk, *dv;
	float *dqacc;       /* [B*Hq][sqp][DP] */
	const float *lse2;  /* [B*Hq][sqp] */
	const float *delta; /* [B*Hq][sqp] */
	int *turn;          /* [B*Hq][nq][NW]: deterministic mode, adds done per warp's part */
	long long qs[3], ks[3], vs[3], dos[3], dks[3], dvs[3]; /* batch, seq, head */
	int B, Sq, Sk, Hq, Hkv, group;
	int sqp, nq; /* Sq rounded up to BQ, and its query blocks */
	float sl;    /* scale * log2(e), signed */
	float scale;
	int dgrp_lg;    /* fa_bwd_main_det: log2 of the key blocks per group (resident at once) */
	float scale_lo; /* scale - (float)scale: the compensated exponent (FA_XEXP) */
	float *dqrow;       /* FA_DET 2: [B*Hq][sqp] the fixed point's row multipliers (NaN: bad) */
	const float *dqcol; /* FA_DET 2: [B*Hkv][DQC] its column multipliers */
#if FA_WIN || FA_SOFTCAP
	/* Only these specialisations declare the tail (the others' parameter block, hence PTX,
	 * stays as it was); the host always passes it. FA_WIN: key j visible to query i iff
	 * win_lo <= j - i <= win_hi (clamped by the host to [-Sq - 1, Sk + 1]). FA_SOFTCAP: scale /
	 * cap (signed), cap and its remainder cap - (float)cap (FA_XEXP), cap log2(e). */
	int win_lo, win_hi;
	float cap_scale, cap, cap_lo, cap_log2;
#endif
};

struct fa_bwd_pre_params {
	const void *o, *dout;
	const float *lse;
	float *lse2, *delta, *dqacc;
	int *turn;
	long long os[3], dos[3], ls[3]; /* ls: batch, head, seq */
	int B, Sq, Hq, sqp, nq, group;
	float *dqrow, *dqcol; /* FA_DET 2: written here (dqcol: fa_bwd_kvscale's maxima converted) */
};

struct fa_bwd_dq_params {
	const float *dqacc; /* FA_DET 2: int32 */
	void *dq;
	long long dqs[3];
	int B, Sq, Hq, sqp;
	float scale;
	int group;
	const float *dqrow, *dqcol; /* FA_DET 2 */
	const int *turn;            /* FA_DET 2, packed: the adds per query block of FA_BQ rows */
	int tstride, packed;        /* its counters per block; 1: attn_bwd_sm90.cu's packed pairs */
};

/* fa_bwd_kvscale's (FA_DET 2): per (batch, kv head) the bits of max_j |K_jd| (d < DP) and of
 * max_j |V_j|^2 (at DP), by atomicMax into dqcol, zeroed before */
struct fa_bwd_kvs_params {
	const void *k, *v;
	unsigned *dqcol;
	long long ks[3], vs[3];
	int B, Sk, Hkv, pad_;
};

__device__ __forceinline__ float ld_gin(const gin_t *p)
{
#if FA_GIN == 3
	return *p;
#elif FA_GIN == 2
	return fa_bf16_to_f32(*p);
#else
	return fa_f16_to_f32(*p);
#endif
}

/* Two adjacent elements of a gradient, in its global type. */
__device__ __forceinline__ void st_gin2(gin_t *p, float x0, float x1)
{
#if FA_GIN == 3
	*(float2 *)p = make_float2(x0, x1);
#else
	*(u32 *)p = fa_pack16<FA_GIN>(x0, x1);
#endif
}

/* NROWS rows from global memory (row stride rs elements) into shared memory (row stride LDS);
 * rows >= valid and the head-dim padding zero-filled. Same types: cp.async (the caller commits
 * and waits); fp32 -> bf16: plain loads, rounded to nearest even, plain stores (published by the
 * barrier that follows the wait). */
template <int NROWS>
__device__ __forceinline__ void load_rows(in_t *s, const gin_t *g, long long rs, int valid)
{
#if !CONV
	const int CPE = 16 / ES, CPR = DP / CPE, TOTAL = NROWS * CPR;
#pragma unroll 4
	for (int it = 0; it < (TOTAL + NT - 1) / NT; it++) {
		const int i = it * NT + (int)threadIdx.x;
		if (TOTAL % NT == 0 || i < TOTAL) {
			const int r = i / CPR, c = i - r * CPR;
			const bool ok = r < valid && c * CPE < FA_D;
			const gin_t *src = ok ? g + r * rs + c * CPE : g;
			cp_async16(smem_u32(s + r * LDS + c * CPE), src, ok ? 16 : 0);
		}
	}
#else
	const int CPR = DP / 8, TOTAL = NROWS * CPR;
#pragma unroll 2
	for (int it = 0; it < (TOTAL + NT - 1) / NT; it++) {
		const int i = it * NT + (int)threadIdx.x;
		if (TOTAL % NT == 0 || i < TOTAL) {
			const int r = i / CPR, c = i - r * CPR;
			float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
			if (r < valid && c * 8 < FA_D) {
				const float4 *src = (const float4 *)(g + r * rs + c * 8);
				x0 = src[0];
				x1 = src[1];
			}
			*(uint4 *)(s + r * LDS + c * 8) =
			    make_uint4(pack_bf16(x0.x, x0.y), pack_bf16(x0.z, x0.w), pack_bf16(x1.x, x1.y),
			               pack_bf16(x1.z, x1.w));
		}
	}
#endif
}

/* acc[MT][NTN] += A B for this warp's tile: rows m0 + [0, 16 MT), columns n0 + [0, 8 NTN), the
 * contraction over KS steps of KK. A is [m][k] in shared memory (AT: stored [k][m]), B is [n][k]
 * (BT: stored [k][n]); LDA, LDB their row strides in elements. */
#if FA_IN != 3
template <int MT, int NTN, int KS, bool AT, bool BT, int LDA, int LDB>
__device__ __forceinline__ void wgemm(float (&acc)[MT][NTN][4], const in_t *A, const in_t *B,
                                      int m0, int n0)
{
	const int lane = (int)threadIdx.x & 31;
#pragma unroll
	for (int kk = 0; kk < KS; kk++) {
		u32 a[MT][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			if (!AT)
				fa_ldsm_x4(a[mt], smem_u32(A + (m0 + mt * 16 + (lane & 15)) * LDA + kk * 16 +
				                           (lane >> 4) * 8));
			else
				fa_ldsm_x4_t(a[mt], smem_u32(A + (kk * 16 + (lane >> 4) * 8 + (lane & 7)) * LDA +
				                             m0 + mt * 16 + ((lane >> 3) & 1) * 8));
		}
#pragma unroll
		for (int nt = 0; nt < NTN; nt += 2) {
			u32 b[4];
			if (!BT)
				fa_ldsm_x4(b, smem_u32(B + (n0 + nt * 8 + (lane >> 4) * 8 + (lane & 7)) * LDB +
				                       kk * 16 + ((lane >> 3) & 1) * 8));
			else
				fa_ldsm_x4_t(b, smem_u32(B + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDB +
				                         n0 + nt * 8 + (lane >> 4) * 8));
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				fa_mma16<FA_IN>(acc[mt][nt], a[mt], b[0], b[1]);
				fa_mma16<FA_IN>(acc[mt][nt + 1], a[mt], b[2], b[3]);
			}
		}
	}
}
#else
/* fp32 tf32 / 3xtf32 (FA_LDSM32, default 1): the operands stored as the product reads them
 * ([m][k], [n][k]) are loaded by ldmatrix (b16 x4: four 8 x 4 fp32 matrices; lane 4g + t gets
 * row g, word t, which is the m16n8k8 tf32 fragment): one instruction for an A fragment or two
 * B fragments instead of four scalar loads (the same values: the results do not change). The
 * transposed ones stay scalar (ldmatrix.trans swaps 16-bit halves, not words). ieee keeps its
 * scalar loads. Measured +2.6% (3xtf32 D=128) to +3.7% (D=256) backward alone on the H200
 * (kernels/PERF-NOTES.md, fp32 backward). */
#ifndef FA_LDSM32
#define FA_LDSM32 1
#endif
#define LDSM32 (FA_LDSM32 && FA_PREC != 1)
__device__ __forceinline__ void fa_ldsm_x2(u32 (&r)[2], u32 addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
	             : "=r"(r[0]), "=r"(r[1])
	             : "r"(addr));
}
/* fp32: acc[mt][noff + nt] for nt in [0, NTN) (noff a constant once unrolled: the dK, dV chunks
 * of wgemm_acc). */
template <int MT, int NTN, int KS, bool AT, bool BT, int LDA, int LDB, int NACC>
__device__ __forceinline__ void wgemm32(float (&acc)[MT][NACC][4], const in_t *A, const in_t *B,
                                        int m0, int n0, int noff)
{
	const int lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	/* ieee: each product is 32 shuffles and 32 FFMA already; unrolled its compile took 90 s
	 * (a constant: nvcc does not macro-expand pragma arguments, NVRTC does) */
#ifdef FA_KUNROLL32
	constexpr int KUNROLL = FA_KUNROLL32;
#else
	constexpr int KUNROLL = FA_PREC == 1 || (FA_PREC == 2 && FA_X3SPLIT) ? 1 : 4;
#endif
#if FA_PREC == 2 && FA_X3SPLIT == 1
	float cs[MT][NTN][4]; /* the small cross products, over all k */
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int nt = 0; nt < NTN; nt++)
			cs[mt][nt][0] = cs[mt][nt][1] = cs[mt][nt][2] = cs[mt][nt][3] = 0.f;
#endif
#pragma unroll KUNROLL
	for (int kk = 0; kk < KS; kk++) {
		const int k0 = kk * 8 + t, k1 = k0 + 4;
		fa_op32 a[MT][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			const int r0 = m0 + mt * 16 + g, r1 = r0 + 8;
#if LDSM32
			if (!AT) {
				u32 x[4]; /* matrices: rows 0-7 / 8-15 of the tile, words k 0-3 / 4-7 */
				fa_ldsm_x4(x, smem_u32(A + (m0 + mt * 16 + (lane & 15)) * LDA + kk * 8 +
				                       (lane >> 4) * 4));
#pragma unroll
				for (int e = 0; e < 4; e++)
					a[mt][e] = fa_make_op<FA_PREC>(__uint_as_float(x[e]));
				continue;
			}
#endif
			a[mt][0] = fa_make_op<FA_PREC>(AT ? A[k0 * LDA + r0] : A[r0 * LDA + k0]);
			a[mt][1] = fa_make_op<FA_PREC>(AT ? A[k0 * LDA + r1] : A[r1 * LDA + k0]);
			a[mt][2] = fa_make_op<FA_PREC>(AT ? A[k1 * LDA + r0] : A[r0 * LDA + k1]);
			a[mt][3] = fa_make_op<FA_PREC>(AT ? A[k1 * LDA + r1] : A[r1 * LDA + k1]);
		}
#if LDSM32
		/* B stored [n][k]: two n8 tiles per ldmatrix.x4 (matrices: tile nt words 0-3, 4-7,
		 * tile nt + 1 words 0-3, 4-7), x2 for an odd last one */
		u32 bx[NTN][2];
		if (!BT) {
#pragma unroll
			for (int nt = 0; nt < NTN; nt += 2) {
				if (nt + 1 < NTN) {
					u32 x[4];
					fa_ldsm_x4(x, smem_u32(B + (n0 + nt * 8 + (lane >> 4) * 8 + (lane & 7)) * LDB +
					                       kk * 8 + ((lane >> 3) & 1) * 4));
					bx[nt][0] = x[0];
					bx[nt][1] = x[1];
					bx[nt + 1][0] = x[2];
					bx[nt + 1][1] = x[3];
				} else {
					fa_ldsm_x2(bx[nt], smem_u32(B + (n0 + nt * 8 + (lane & 7)) * LDB + kk * 8 +
					                            ((lane >> 3) & 1) * 4));
				}
			}
		}
#endif
#pragma unroll
		for (int nt = 0; nt < NTN; nt++) {
			const int n = n0 + nt * 8 + g;
#if LDSM32
			const fa_op32 b0 = fa_make_op<FA_PREC>(BT ? B[k0 * LDB + n] : __uint_as_float(bx[nt][0]));
			const fa_op32 b1 = fa_make_op<FA_PREC>(BT ? B[k1 * LDB + n] : __uint_as_float(bx[nt][1]));
#else
			const fa_op32 b0 = fa_make_op<FA_PREC>(BT ? B[k0 * LDB + n] : B[n * LDB + k0]);
			const fa_op32 b1 = fa_make_op<FA_PREC>(BT ? B[k1 * LDB + n] : B[n * LDB + k1]);
#endif
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
#if FA_PREC == 2 && FA_X3SPLIT
				const u32 ab[4] = {a[mt][0].big, a[mt][1].big, a[mt][2].big, a[mt][3].big};
				const u32 as[4] = {a[mt][0].small, a[mt][1].small, a[mt][2].small,
				                   a[mt][3].small};
				float tb[4] = {0.f, 0.f, 0.f, 0.f};
				fa_mma_tf32(tb, ab, b0.big, b1.big);
#if FA_X3SPLIT == 1
				fa_mma_tf32(cs[mt][nt], as, b0.big, b1.big);
				fa_mma_tf32(cs[mt][nt], ab, b0.small, b1.small);
#pragma unroll
				for (int e = 0; e < 4; e++)
					acc[mt][noff + nt][e] += tb[e];
#else
				float ts[4] = {0.f, 0.f, 0.f, 0.f};
				fa_mma_tf32(ts, as, b0.big, b1.big);
				fa_mma_tf32(ts, ab, b0.small, b1.small);
#pragma unroll
				for (int e = 0; e < 4; e++)
					acc[mt][noff + nt][e] += tb[e] + ts[e];
#endif
#else
				fa_mma32<FA_PREC>(acc[mt][noff + nt], a[mt], b0, b1);
#endif
			}
		}
	}
#if FA_PREC == 2 && FA_X3SPLIT == 1
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int nt = 0; nt < NTN; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[mt][noff + nt][e] += cs[mt][nt][e];
#endif
}
template <int MT, int NTN, int KS, bool AT, bool BT, int LDA, int LDB>
__device__ __forceinline__ void wgemm(float (&acc)[MT][NTN][4], const in_t *A, const in_t *B,
                                      int m0, int n0)
{
	wgemm32<MT, NTN, KS, AT, BT, LDA, LDB, NTN>(acc, A, B, m0, n0, 0);
}
#endif

/* acc += A B into an accumulator that lives across steps (dK, dV): 3xtf32 sums the step from
 * zero and adds it with IEEE adds. */
template <int MT, int NTN, int KS, bool AT, bool BT, int LDA, int LDB>
__device__ __forceinline__ void wgemm_acc(float (&acc)[MT][NTN][4], const in_t *A,
                                          const in_t *B, int m0, int n0)
{
#if FA_IN == 3 && FA_PREC == 2 && FA_X3SPLIT
	/* every k step is added with IEEE adds already; in chunks of up to FA_X3NCH n8 tiles, so
	 * that the small products' accumulator takes 4 x FA_X3NCH registers per row tile (A's
	 * fragments are loaded once per chunk). 8 (default; 4 before): A loaded half as often,
	 * measured +4.6% backward alone with FA_LDSM32 on the H200, the same sums */
#ifndef FA_X3NCH
#define FA_X3NCH 8
#endif
	constexpr int NCH = NTN % FA_X3NCH == 0 ? FA_X3NCH : NTN % 4 == 0 ? 4 : NTN % 2 == 0 ? 2 : 1;
#pragma unroll
	for (int c = 0; c < NTN / NCH; c++)
		wgemm32<MT, NCH, KS, AT, BT, LDA, LDB, NTN>(acc, A, B, m0, n0 + c * NCH * 8, c * NCH);
#elif FA_IN == 3 && (FA_PREC == 2 || FA_PREC == 1)
	/* the step's sum from zero, added with IEEE adds: for 3xtf32 (without FA_X3SPLIT) against
	 * the tensor cores' truncation; for ieee, so that the FFMA chain into dK, dV is a step's
	 * rows long, not Sq (measured 1.5-2x SDPA's error at S=4096 before). In chunks of up to 4
	 * n8 tiles: the partial sums take 16 registers per row tile, not a second copy of the
	 * accumulator (A's fragments are loaded once per chunk) */
	constexpr int NCH = NTN % 4 == 0 ? 4 : NTN % 2 == 0 ? 2 : 1;
#pragma unroll
	for (int c = 0; c < NTN / NCH; c++) {
		float part[MT][NCH][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int nt = 0; nt < NCH; nt++)
				part[mt][nt][0] = part[mt][nt][1] = part[mt][nt][2] = part[mt][nt][3] = 0.f;
		wgemm<MT, NCH, KS, AT, BT, LDA, LDB>(part, A, B, m0, n0 + c * NCH * 8);
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int nt = 0; nt < NCH; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					acc[mt][c * NCH + nt][e] += part[mt][nt][e];
	}
#else
	wgemm<MT, NTN, KS, AT, BT, LDA, LDB>(acc, A, B, m0, n0);
#endif
}

template <int MT, int NTN> __device__ __forceinline__ void zero_acc(float (&acc)[MT][NTN][4])
{
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int nt = 0; nt < NTN; nt++)
			acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
}


/* Two adjacent fp32 values added to the dQ accumulator (no return value: a reduction). */
__device__ __forceinline__ void red_add2(float *p, float x0, float x1)
{
#if __CUDA_ARCH__ >= 900
	asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(x0), "f"(x1) : "memory");
#else
	atomicAdd(p, x0);
	atomicAdd(p + 1, x1);
#endif
}

/* ---------------------------------------------------------------------------------------------
 * delta, lse2, the accumulator's zeroing; one warp per query row (rows up to sqp). */
extern "C" __global__ void __launch_bounds__(256) fa_bwd_pre(const fa_bwd_pre_params p)
{
	const int lane = (int)threadIdx.x & 31;
	const long long row = (long long)blockIdx.x * 8 + ((int)threadIdx.x >> 5);
	if (row >= (long long)p.B * p.Hq * p.sqp)
		return;
	const long long bh = row / p.sqp;
	const int i = (int)(row - bh * p.sqp);
	const int b = (int)(bh / p.Hq), h = (int)(bh - (long long)b * p.Hq);
	float sum = 0.f, l2 = __int_as_float(0x7f800000), nrm = 0.f;
	if (i < p.Sq) {
		const gin_t *o = (const gin_t *)p.o + b * p.os[0] + i * p.os[1] + h * p.os[2];
		const gin_t *d = (const gin_t *)p.dout + b * p.dos[0] + i * p.dos[1] + h * p.dos[2];
		for (int x = lane; x < FA_D; x += 32) {
			const float dv = ld_gin(d + x);
			sum = fmaf(ld_gin(o + x), dv, sum);
			if (DQI)
				nrm = fmaf(dv, dv, nrm);
		}
#pragma unroll
		for (int s = 16; s > 0; s >>= 1) {
			sum += __shfl_xor_sync(0xffffffffu, sum, s);
			if (DQI)
				nrm += __shfl_xor_sync(0xffffffffu, nrm, s);
		}
		const float l = p.lse[b * p.ls[0] + h * p.ls[1] + i * p.ls[2]];
#if FA_XEXP
		l2 = l != NEG_INF ? l : 0x1p100f; /* natural; P = exp(-2^100) = 0, no inf - inf */
#else
		if (l != NEG_INF)
			l2 = l * 1.4426950408889634f;
#endif
	}
#if FA_XEXP
	else
		l2 = 0x1p100f;
#endif
	if (lane == 0) {
		p.delta[row] = sum;
		p.lse2[row] = l2;
		if ((DET_CHAIN || DQI) && i % FA_BQ == 0) /* FA_DET 2: the packed pairs' add counts */
#pragma unroll
			for (int w = 0; w < FA_NW; w++) /* a counter per warp of the main pass */
				p.turn[(bh * p.nq + i / FA_BQ) * FA_NW + w] = 0;
	}
	if (DQI) {
		/* the row's bound |dO_i| max_j |V_j| + |delta_i| (fa_device.cuh); the first row of a
		 * kv head's first query head turns that head's maxima of |K_jd| into multipliers (the
		 * other rows read only |V|'s, at DQC - 4 + ... = DP) */
		float *col = p.dqcol + ((long long)b * (p.Hq / p.group) + h / p.group) * DQC;
		if (lane == 0)
			p.dqrow[row] = fa_dqi_row_mul(fmaf(sqrtf(nrm), sqrtf(col[DP]), fabsf(sum)));
		if (i == 0 && h % p.group == 0)
			for (int x = lane; x < DP; x += 32)
				col[x] = DQI64 ? fa_dqi_col_mul64(col[x]) : fa_dqi_col_mul(col[x]);
	}
	float *acc = p.dqacc + row * DP * DQW64; /* fixed point: integer zeros, the same bits */
	for (int x = lane; x < DP * DQW64; x += 32)
		acc[x] = 0.f;
}

/* FA_DET 2: max_j |K_jd| per head-dim column and max_j |V_j|^2 of each (batch, kv head), as
 * float bits (non-negative floats order as their bits; NaN above inf) by atomicMax into the
 * zeroed dqcol; grid (key blocks of 64, Hkv, B), a warp per key at a time. */
extern "C" __global__ void __launch_bounds__(256) fa_bwd_kvscale(const fa_bwd_kvs_params p)
{
	__shared__ unsigned cmax[8][DP + 1]; /* per warp: DP columns' maxima, then |V|^2's */
	const int lane = (int)threadIdx.x & 31, w = (int)threadIdx.x >> 5;
	const int hk = (int)blockIdx.y, b = (int)blockIdx.z;
	const long long bh = (long long)b * p.Hkv + hk;
	unsigned cm[(DP + 31) / 32], vm = 0;
#pragma unroll
	for (int t = 0; t < (DP + 31) / 32; t++)
		cm[t] = 0;
	const int j1 = min(p.Sk, (int)blockIdx.x * 64 + 64);
	for (int j = (int)blockIdx.x * 64 + w; j < j1; j += 8) {
		const gin_t *k = (const gin_t *)p.k + b * p.ks[0] + (long long)j * p.ks[1] + hk * p.ks[2];
		const gin_t *v = (const gin_t *)p.v + b * p.vs[0] + (long long)j * p.vs[1] + hk * p.vs[2];
		float v2 = 0.f;
#pragma unroll
		for (int t = 0; t < (DP + 31) / 32; t++) {
			const int x = lane + 32 * t;
			if (x < FA_D) {
				cm[t] = max(cm[t], __float_as_uint(fabsf(ld_gin(k + x))));
				const float vx = ld_gin(v + x);
				v2 = fmaf(vx, vx, v2);
			}
		}
#pragma unroll
		for (int s = 16; s > 0; s >>= 1)
			v2 += __shfl_xor_sync(0xffffffffu, v2, s);
		vm = max(vm, __float_as_uint(fabsf(v2)));
	}
#pragma unroll
	for (int t = 0; t < (DP + 31) / 32; t++)
		if (lane + 32 * t < DP)
			cmax[w][lane + 32 * t] = cm[t];
	if (lane == 0)
		cmax[w][DP] = vm;
	__syncthreads();
	unsigned *out = p.dqcol + bh * DQC;
	for (int x = (int)threadIdx.x; x <= DP; x += 256) {
		unsigned m = 0;
#pragma unroll
		for (int ww = 0; ww < 8; ww++)
			m = max(m, cmax[ww][x]);
		if (m)
			atomicMax(out + x, m);
	}
}

#ifndef FA_STAGES
#define FA_STAGES 1
#endif
#if FA_STAGES != 1 && FA_STAGES != 2
#error "FA_STAGES: 1 or 2"
#endif

/* Step it's Q and dO rows (one commit group), lse2 and delta (plain loads and stores, published
 * by the barrier after the wait). */
__device__ __forceinline__ void load_step(const fa_bwd_params &p, in_t *sQ, in_t *sdO, float *sL,
                                          float *sDl, int b, int hk, int iq, int hh)
{
	const int h = hk * p.group + hh, q0 = iq * FA_BQ;
	const long long bh = (long long)b * p.Hq + h;
	const gin_t *Qg = (const gin_t *)p.q + b * p.qs[0] + h * p.qs[2] + (long long)q0 * p.qs[1];
	const gin_t *dOg =
	    (const gin_t *)p.dout + b * p.dos[0] + h * p.dos[2] + (long long)q0 * p.dos[1];
	load_rows<FA_BQ>(sQ, Qg, p.qs[1], p.Sq - q0);
	load_rows<FA_BQ>(sdO, dOg, p.dos[1], p.Sq - q0);
	cp_async_commit();
	const int tid = (int)threadIdx.x;
	if (tid < FA_BQ) {
		sL[tid] = p.lse2[bh * p.sqp + q0 + tid];
		sDl[tid] = p.delta[bh * p.sqp + q0 + tid];
	}
}

/* The deterministic mode's hand-over: this warp's reductions of its last step are made visible
 * at GPU scope, then that part's counter counts one more add. */
__device__ __forceinline__ void release_turn(int *turn)
{
	asm volatile("fence.acq_rel.gpu;" ::: "memory");
	__syncwarp();
	if (((int)threadIdx.x & 31) == 0)
		asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(turn) : "memory");
}

/* The first query block whose rows see key block n (masks hide keys above the diagonal). */
__device__ __forceinline__ int first_qblock(const fa_bwd_params &p, int n)
{
	if (!FA_MASK)
		return 0;
	const int r = n * FA_BKV - (FA_MASK == 1 ? p.Sk - p.Sq : 0);
	return r >= p.Sq ? p.nq : r > 0 ? r / FA_BQ : 0;
}

/* The query blocks [f, l) whose rows see some key of key block n: under a mask those from
 * first_qblock to the end; under FA_WIN the rows [max(0, kv0 - win_hi), min(Sq, ke - win_lo))
 * (ke: one past the block's last key), those a key of [kv0, ke) is visible to, rounded out to
 * whole blocks; empty (f = l = 0) when no row sees one. In 64 bits: kv0 - win_hi reaches 2^31. */
__device__ __forceinline__ void qblock_range(const fa_bwd_params &p, int n, int &f, int &l)
{
#if FA_WIN
	const long long kv0 = (long long)n * FA_BKV;
	const long long ke = kv0 + FA_BKV < p.Sk ? kv0 + FA_BKV : (long long)p.Sk;
	const long long ilo = kv0 - p.win_hi > 0 ? kv0 - p.win_hi : 0LL;
	const long long ihi = ke - p.win_lo < p.Sq ? ke - p.win_lo : (long long)p.Sq;
	f = ilo < ihi ? (int)(ilo / FA_BQ) : 0;
	l = ilo < ihi ? (int)((ihi + FA_BQ - 1) / FA_BQ) : 0;
#else
	f = first_qblock(p, n);
	l = p.nq;
#endif
}

/* Deterministic mode: the grid is (group member + 2^dgrp_lg x kv head, batch, group), the
 * member fastest: a group's members are launched together, the groups one after another. */
__device__ __forceinline__ int det_member(const fa_bwd_params &p)
{
	return (int)blockIdx.x & ((1 << p.dgrp_lg) - 1);
}

/* Where member x of a group starts its query blocks: 2x further on, wrapped. (Under the masks
 * written without qblock_range: the default specialisations' PTX stays as it was.) */
__device__ __forceinline__ int det_rot(const fa_bwd_params &p, int n, int x)
{
#if FA_WIN
	int f, l;
	qblock_range(p, n, f, l);
	const int span = l - f;
#else
	const int span = p.nq - first_qblock(p, n);
#endif
	return span > 0 ? 2 * x % span : 0;
}

/* The query block of step k of key block n (member x), its query blocks [iq0, iq1) rotated by
 * det_rot (the atomic mode: in order). */
template <bool DET>
__device__ __forceinline__ int step_qblock(const fa_bwd_params &p, int n, int iq0, int iq1, int k)
{
	if (!DET)
		return iq0 + k;
	const int iq = iq0 + k + det_rot(p, n, det_member(p));
#if FA_WIN
	return iq >= iq1 ? iq - (iq1 - iq0) : iq;
#else
	(void)iq1; /* p.nq, read here as it always was (the default specialisations' PTX) */
	return iq >= p.nq ? iq - (p.nq - iq0) : iq;
#endif
}

/* The number of adds to query block iq's rows that come before this block's: those of every
 * earlier group's members that see iq (the key blocks that see a query block are a range
 * [a, b) holding this one: under a mask a = 0, so all of them; under FA_WIN a is the block of
 * the first key iq's first row sees, and the members from a on), then those of the members of
 * this group that see iq at an earlier step of their own loop (ties: the lower member). A block
 * waits only on members ahead of it in their loops (no cycle), and a group is launched whole
 * before the next one: with every member resident at once (dgrp), no deadlock. The host's
 * restatement, tests/unit/test_bwd_det_turns.c, checks that these counts are a permutation of
 * 0 .. (blocks that see iq) - 1 for every query block, and that the schedule completes. */
__device__ __forceinline__ int det_turn(const fa_bwd_params &p, int iq)
{
	const int c = 1 << p.dgrp_lg, r = det_member(p), G = (int)blockIdx.z;
	const int nkv = (p.Sk + FA_BKV - 1) / FA_BKV;
#if FA_WIN
	const long long k0 = (long long)iq * FA_BQ + p.win_lo; /* the first key iq's rows see */
	const int a = k0 > 0 ? (int)(k0 / FA_BKV) : 0;
	int w = G * c > a ? G * c - a : 0, mine = 0;
#else
	int w = G * c, mine = 0;
#endif
	for (int pass = 0; pass < 2; pass++) /* this member's step first, then the others' */
		for (int x = 0; x < c; x++) {
			const int n = G * c + x;
			if (pass == 0 && x != r)
				continue;
			if (n >= nkv)
				break;
#if FA_WIN
			int f, l;
			qblock_range(p, n, f, l);
			const int span = l - f;
			if (iq < f || iq >= l)
				continue;
#else
			const int f = first_qblock(p, n), span = p.nq - f;
			if (iq < f)
				continue;
#endif
			const int k = (iq - f - det_rot(p, n, x) + span) % span;
			if (pass == 0)
				mine = k;
			else if (x != r && (k < mine || (k == mine && x < r)))
				w++;
		}
	return w;
}

/* The end of a key block's query blocks where it is used: iq1 (qblock_range) under FA_WIN; p.nq
 * otherwise, read where it always was, so that the other specialisations' PTX stays as it was. */
#if FA_WIN
#define IQ_END iq1
#else
#define IQ_END p.nq
#endif

/* One step: S^T, dP^T, P^T and dS^T to shared memory, dV and dK accumulated, the step's dQ
 * added (reduction, or in key-block order in the deterministic mode). sQ, sdO, sL, sDl: this
 * step's buffers. */
template <bool DET>
__device__ __forceinline__ void bwd_step(const fa_bwd_params &p, const in_t *sK, const in_t *sV,
                                         const in_t *sQ, const in_t *sdO, in_t *sP, in_t *sdS,
                                         const float *sL, const float *sDl,
                                         float (&dk)[MT_S][NT_KV][4], float (&dv)[MT_S][NT_KV][4],
                                         int kv0, int off, int n, int iq, long long bh, int ms0,
                                         int ns0, int nkv0, int mq0, int nq0, int iq0, int iq1,
                                         int k, int hh)
{
	const int tid = (int)threadIdx.x, lane = tid & 31;
	const int g = lane >> 2, t = lane & 3;
	const int q0 = iq * FA_BQ;
#if DQI
	/* the fixed point's row multipliers, loaded first: their latency hides under the step */
	float mrs[MT_Q][2];
#pragma unroll
	for (int mt = 0; mt < MT_Q; mt++)
#pragma unroll
		for (int hf = 0; hf < 2; hf++) /* rows up to sqp exist */
			mrs[mt][hf] = p.dqrow[bh * p.sqp + q0 + mq0 + mt * 16 + g + hf * 8];
#endif
	/* S^T = K Q^T, dP^T = V dO^T */
	float s[MT_S][NT_S][4], dpv[MT_S][NT_S][4];
	zero_acc(s);
	zero_acc(dpv);
	wgemm<MT_S, NT_S, DP / KK, false, false, LDS, LDS>(s, sK, sQ, ms0, ns0);
	wgemm<MT_S, NT_S, DP / KK, false, false, LDS, LDS>(dpv, sV, sdO, ms0, ns0);

	/* P^T and dS^T; the key tail and the causal edge (FA_WIN: the window's edges) masked where
	 * the tile has them */
#if FA_WIN
	(void)off;
	const bool need_mask = kv0 + FA_BKV > p.Sk || kv0 - (q0 + FA_BQ - 1) < p.win_lo ||
	                       kv0 + FA_BKV - 1 - q0 > p.win_hi;
#else
	const bool need_mask =
	    kv0 + FA_BKV > p.Sk || (FA_MASK && kv0 + FA_BKV - 1 > q0 + off);
#endif
#pragma unroll
	for (int mt = 0; mt < MT_S; mt++)
#pragma unroll
		for (int nt = 0; nt < NT_S; nt++) {
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int jl = ms0 + mt * 16 + g + (e >> 1) * 8;
				const int il = ns0 + nt * 8 + 2 * t + (e & 1);
#if FA_SOFTCAP
				/* tc = tanh(s scale / cap): P = exp(cap tc - lse), its product with cap
				 * compensated like the scale's (FA_XEXP) */
				const float tc = fa_softcap2<CAP_ACCURATE>(s[mt][nt][e], p.cap_scale, 1.f);
#if FA_XEXP
				float pv = fa_p_exp_comp(tc, p.cap, p.cap_lo, sL[il]);
#else
				float pv = fast_exp2(fmaf(tc, p.cap_log2, -sL[il]));
#endif
#elif FA_XEXP
				float pv = fa_p_exp_comp(s[mt][nt][e], p.scale, p.scale_lo, sL[il]);
#else
				float pv = fast_exp2(fmaf(s[mt][nt][e], p.sl, -sL[il]));
#endif
				if (need_mask) {
					const int j = kv0 + jl;
#if FA_WIN
					if (!fa_win_sees(q0 + il, j, p.Sk, p.win_lo, p.win_hi))
						pv = 0.f;
#else
					if (!(j < p.Sk && (!FA_MASK || j <= q0 + il + off)))
						pv = 0.f;
#endif
				}
				s[mt][nt][e] = pv;
				dpv[mt][nt][e] = pv * (dpv[mt][nt][e] - sDl[il]);
#if FA_SOFTCAP
				dpv[mt][nt][e] *= fmaf(-tc, tc, 1.f); /* d(cap tanh(x / cap)) / dx */
#endif
			}
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int jl = ms0 + mt * 16 + g + hf * 8;
				const int il = ns0 + nt * 8 + 2 * t;
#if FA_IN == 3
				*(float2 *)(sP + jl * LDP + il) =
				    make_float2(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]);
				*(float2 *)(sdS + jl * LDP + il) =
				    make_float2(dpv[mt][nt][2 * hf], dpv[mt][nt][2 * hf + 1]);
#else
				*(u32 *)(sP + jl * LDP + il) =
				    fa_pack16<FA_IN>(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]);
				*(u32 *)(sdS + jl * LDP + il) =
				    fa_pack16<FA_IN>(dpv[mt][nt][2 * hf], dpv[mt][nt][2 * hf + 1]);
#endif
			}
		}
	__syncthreads();

	/* dV += P^T dO, dK += dS^T Q */
	wgemm_acc<MT_S, NT_KV, FA_BQ / KK, false, true, LDP, LDS>(dv, sP, sdO, ms0, nkv0);
	wgemm_acc<MT_S, NT_KV, FA_BQ / KK, false, true, LDP, LDS>(dk, sdS, sQ, ms0, nkv0);

	/* dQ of this step = dS K, into the fp32 accumulator */
	float dq[MT_Q][NT_Q][4];
	zero_acc(dq);
	wgemm<MT_Q, NT_Q, FA_BKV / KK, true, true, LDP, LDS>(dq, sdS, sK, mq0, nq0);
	float *acc = p.dqacc + (bh * p.sqp + q0) * DP;
	if (DET) {
		/* release the previous step's part (its reductions were issued a whole step ago: the
		 * fence finds them performed): step k - 1 of this query head, or the last step of the
		 * one before; then wait until the adds that come before this one's are done */
		const int w = (int)threadIdx.x >> 5;
		if (k > 0)
			release_turn(p.turn + (bh * p.nq + step_qblock<DET>(p, n, iq0, IQ_END, k - 1)) *
			                          FA_NW + w);
		else if (hh > 0)
			release_turn(p.turn +
			             ((bh - 1) * p.nq + step_qblock<DET>(p, n, iq0, IQ_END, IQ_END - iq0 - 1)) *
			                 FA_NW + w);
		int *mine = p.turn + (bh * p.nq + iq) * FA_NW + w;
		const int want = det_turn(p, iq);
		if (lane == 0)
			while (fa_ld_acquire(mine) != want)
				__nanosleep(32);
		__syncwarp();
	}
#if DQI
	/* fixed point (fa_device.cuh): packed pairs (fa_dqi_red2: the v2 reduction's sectors; the
	 * step's adds counted for fa_bwd_dq in the query block's first turn counter), the rows'
	 * multipliers loaded at the step's start and the columns' before any add, a row whose part
	 * does not fit marked NaN after them (a store between the adds would pin the loads) */
	const long long bq = bh / p.Hq;
	const float *col = p.dqcol + (bq * (p.Hq / p.group) + (bh - bq * p.Hq) / p.group) * DQC + nq0;
	float *const rm0 = p.dqrow + bh * p.sqp + q0;
	bool bad[MT_Q][2];
#pragma unroll
	for (int mt = 0; mt < MT_Q; mt++)
#pragma unroll
		for (int hf = 0; hf < 2; hf++)
			bad[mt][hf] = false;
	float2 mcs[NT_Q]; /* the warp's columns' multipliers: the same for both row halves */
#pragma unroll
	for (int nt = 0; nt < NT_Q; nt++)
		mcs[nt] = *(const float2 *)(col + nt * 8 + 2 * t);
	if (!DQI64 && threadIdx.x == 0) /* the packed pairs' count (fa_bwd_dq) */
		fa_dqi_red(p.turn + (bh * p.nq + iq) * FA_NW, 1);
#pragma unroll
	for (int mt = 0; mt < MT_Q; mt++)
#pragma unroll
		for (int hf = 0; hf < 2; hf++) {
			const int il = mq0 + mt * 16 + g + hf * 8;
			if (q0 + il >= p.Sq)
				continue;
#pragma unroll
			for (int nt = 0; nt < NT_Q; nt++) {
				const float2 mc = mcs[nt];
#if DQI64
				long long *a = (long long *)p.dqacc + (bh * p.sqp + q0 + il) * DP + nq0 + nt * 8 +
				               2 * t;
				fa_dqi_red64(a, fa_dqi_fix64(dq[mt][nt][2 * hf], mrs[mt][hf], mc.x, bad[mt][hf]));
				fa_dqi_red64(a + 1,
				             fa_dqi_fix64(dq[mt][nt][2 * hf + 1], mrs[mt][hf], mc.y, bad[mt][hf]));
#else
				fa_dqi_red2((int *)acc + il * DP + nq0 + nt * 8 + 2 * t,
				            fa_dqi_fix(dq[mt][nt][2 * hf], mrs[mt][hf], mc.x, bad[mt][hf]),
				            fa_dqi_fix(dq[mt][nt][2 * hf + 1], mrs[mt][hf], mc.y, bad[mt][hf]));
#endif
			}
		}
#pragma unroll
	for (int mt = 0; mt < MT_Q; mt++)
#pragma unroll
		for (int hf = 0; hf < 2; hf++)
			if (bad[mt][hf] && q0 + mq0 + mt * 16 + g + hf * 8 < p.Sq)
				rm0[mq0 + mt * 16 + g + hf * 8] = FA_NAN;
#else
#pragma unroll
	for (int mt = 0; mt < MT_Q; mt++)
#pragma unroll
		for (int nt = 0; nt < NT_Q; nt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				const int il = mq0 + mt * 16 + g + hf * 8;
				if (q0 + il < p.Sq)
					red_add2(acc + il * DP + nq0 + nt * 8 + 2 * t, dq[mt][nt][2 * hf],
					         dq[mt][nt][2 * hf + 1]);
			}
#endif
}

/* ---------------------------------------------------------------------------------------------
 * The main pass. */
extern "C" __global__ void __launch_bounds__(NT, 1) fa_bwd_main(const fa_bwd_params p)
{
	constexpr bool DET = DET_CHAIN; /* FA_DET 2 adds in fixed point on the atomic grid */
	extern __shared__ __align__(16) unsigned char smem_raw[];
	in_t *sK = (in_t *)smem_raw;
	in_t *sV = sK + SM_KV;
	in_t *sQ0 = sV + SM_KV;                  /* FA_STAGES buffers */
	in_t *sdO0 = sQ0 + FA_STAGES * SM_Q;     /* FA_STAGES buffers */
	in_t *sP = sdO0 + FA_STAGES * SM_Q;
	in_t *sdS = sP + SM_P;
	float *sL0 = (float *)(sdS + SM_P);      /* FA_STAGES x BQ */
	float *sDl0 = sL0 + FA_STAGES * FA_BQ;   /* FA_STAGES x BQ */

	const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3;
	/* The atomic mode's grid is (key block, kv head, batch), the key block fastest: the blocks
	 * that run at once share Q, dO and the dQ rows in L2. The deterministic one runs groups of
	 * consecutive key blocks (det_member), each member starting its query blocks further on
	 * (det_rot), so that the members add to different rows at any time while still sharing
	 * them in L2. (Selects of the block index, not values kept live: the compiler re-reads them
	 * where it needs them.) */
	const int n = DET ? ((int)blockIdx.z << p.dgrp_lg) + det_member(p) : (int)blockIdx.x;
	const int hk = DET ? (int)blockIdx.x >> p.dgrp_lg : (int)blockIdx.y;
	const int b = DET ? (int)blockIdx.y : (int)blockIdx.z;
	if (DET && n * FA_BKV >= p.Sk) /* the last group's missing members */
		return;
	const int kv0 = n * FA_BKV;
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */

#if FA_WIN
	/* the query blocks [iq0, iq1) whose rows see this block's keys: the steps follow the
	 * window, not the sequence */
	int iq0, iq1;
	qblock_range(p, n, iq0, iq1);
#else
	/* the first query block whose rows see key kv0 (the mask hides keys above the diagonal) */
	int iq0 = 0;
	if (FA_MASK) {
		const int r = kv0 - off;
		iq0 = r >= p.Sq ? p.nq : r > 0 ? r / FA_BQ : 0;
	}
#endif

	const gin_t *Kg = (const gin_t *)p.k + b * p.ks[0] + hk * p.ks[2] + (long long)kv0 * p.ks[1];
	const gin_t *Vg = (const gin_t *)p.v + b * p.vs[0] + hk * p.vs[2] + (long long)kv0 * p.vs[1];
	load_rows<FA_BKV>(sK, Kg, p.ks[1], p.Sk - kv0);
	load_rows<FA_BKV>(sV, Vg, p.vs[1], p.Sk - kv0);
	cp_async_commit();

	const int ms0 = (warp % WM_S) * (FA_BKV / WM_S); /* this warp's keys in S^T, dK, dV */
	const int ns0 = (warp / WM_S) * (FA_BQ / WN_S);  /* its query columns in S^T */
	const int nkv0 = (warp / WM_S) * (DP / WN_S);    /* its head-dim columns in dK, dV */
	const int mq0 = (warp % WM_Q) * (FA_BQ / WM_Q);  /* its rows in dQ */
	const int nq0 = (warp / WM_Q) * (DP / WN_Q);     /* its head-dim columns in dQ */

	float dk[MT_S][NT_KV][4], dv[MT_S][NT_KV][4];
	zero_acc(dk);
	zero_acc(dv);

#if FA_STAGES == 1
	/* the loop the first H200 run measured fastest (PERF-NOTES.md, backward): Q and dO of a
	 * step loaded at its top */
	for (int hh = 0; hh < p.group; hh++) {
		const int h = hk * p.group + hh;
		const long long bh = (long long)b * p.Hq + h;
		for (int i = iq0; i < IQ_END; i++) {
			const int k = i - iq0, iq = step_qblock<DET>(p, n, iq0, IQ_END, k); /* atomic: iq = i */
			load_step(p, sQ0, sdO0, sL0, sDl0, b, hk, iq, hh);
			cp_async_wait<0>();
			__syncthreads();
			bwd_step<DET>(p, sK, sV, sQ0, sdO0, sP, sdS, sL0, sDl0, dk, dv, kv0, off, n, iq, bh, ms0,
			         ns0, nkv0, mq0, nq0, iq0, IQ_END, k, hh);
			__syncthreads(); /* Q, dO, P, dS, lse2, delta are free for the next step */
		}
	}
#else
	/* The steps: every (query head of the group, query block from iq0), flattened, so that the
	 * next step's Q and dO are loaded into the other buffers while this one computes. */
	const int nsteps = IQ_END - iq0, total = nsteps * p.group;
	if (total > 0)
		load_step(p, sQ0, sdO0, sL0, sDl0, b, hk, step_qblock<DET>(p, n, iq0, IQ_END, 0), 0);
	for (int it = 0; it < total; it++) {
		const int hh = it / nsteps, k = it - hh * nsteps;
		const int iq = step_qblock<DET>(p, n, iq0, IQ_END, k);
		const long long bh = (long long)b * p.Hq + hk * p.group + hh;
		const int buf = it & 1;
		/* the next step into the other buffers (freed by the previous step's last barrier) */
		if (it + 1 < total)
			load_step(p, sQ0 + (buf ^ 1) * SM_Q, sdO0 + (buf ^ 1) * SM_Q, sL0 + (buf ^ 1) * FA_BQ,
			          sDl0 + (buf ^ 1) * FA_BQ, b, hk,
			          step_qblock<DET>(p, n, iq0, IQ_END, (it + 1) % nsteps), (it + 1) / nsteps);
		else
			cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();
		bwd_step<DET>(p, sK, sV, sQ0 + buf * SM_Q, sdO0 + buf * SM_Q, sP, sdS, sL0 + buf * FA_BQ,
		         sDl0 + buf * FA_BQ, dk, dv, kv0, off, n, iq, bh, ms0, ns0, nkv0, mq0, nq0, iq0,
		         IQ_END, k, hh);
		__syncthreads(); /* Q, dO, P, dS, lse2, delta are free for the step after next */
	}
#endif
	cp_async_wait<0>(); /* K and V landed even when no step ran */
	if (DET && iq0 < IQ_END) /* the last step's part: the group's last query head */
		release_turn(p.turn + (((long long)b * p.Hq + hk * p.group + p.group - 1) * p.nq +
		                       step_qblock<DET>(p, n, iq0, IQ_END, IQ_END - iq0 - 1)) * FA_NW +
		             warp);

	/* dK = scale dS^T Q, dV, in their dtype; keys past Sk are not written */
	gin_t *dKg = (gin_t *)p.dk + b * p.dks[0] + hk * p.dks[2];
	gin_t *dVg = (gin_t *)p.dv + b * p.dvs[0] + hk * p.dvs[2];
#pragma unroll
	for (int mt = 0; mt < MT_S; mt++)
#pragma unroll
		for (int hf = 0; hf < 2; hf++) {
			const int j = kv0 + ms0 + mt * 16 + g + hf * 8;
			if (j >= p.Sk)
				continue;
#pragma unroll
			for (int nt = 0; nt < NT_KV; nt++) {
				const int col = nkv0 + nt * 8 + 2 * t;
				if (col >= FA_D)
					continue;
				st_gin2(dKg + (long long)j * p.dks[1] + col, p.scale * dk[mt][nt][2 * hf],
				        p.scale * dk[mt][nt][2 * hf + 1]);
				st_gin2(dVg + (long long)j * p.dvs[1] + col, dv[mt][nt][2 * hf],
				        dv[mt][nt][2 * hf + 1]);
			}
		}
}

/* ---------------------------------------------------------------------------------------------
 * dQ = scale * accumulator in its dtype; two elements per thread and step. */
extern "C" __global__ void __launch_bounds__(256) fa_bwd_dq(const fa_bwd_dq_params p)
{
	const long long npairs = (long long)p.B * p.Hq * p.Sq * (FA_D / 2);
	for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < npairs;
	     x += (long long)gridDim.x * blockDim.x) {
		const int c = (int)(x % (FA_D / 2)) * 2;
		const long long r = x / (FA_D / 2);
		const long long bh = r / p.Sq;
		const int i = (int)(r - bh * p.Sq);
		const int b = (int)(bh / p.Hq), h = (int)(bh - (long long)b * p.Hq);
#if DQI
		/* fixed point back to float: the sums (64-bit, or int32 / packed pairs), then exact
		 * powers of two; a marked row NaN */
#if DQI64
		const longlong2 a = *(const longlong2 *)((const long long *)p.dqacc + (bh * p.sqp + i) * DP + c);
#else
		int2 a = *(const int2 *)((const int *)p.dqacc + (bh * p.sqp + i) * DP + c);
		if (p.packed)
			a = fa_dqi_unpack2(a, (unsigned)p.turn[(bh * (p.sqp / FA_BQ) + i / FA_BQ) *
			                                       p.tstride]);
#endif
		const float *col = p.dqcol + ((long long)b * (p.Hq / p.group) + h / p.group) * DQC + c;
		const float ir = fa_dqi_inv(p.dqrow[bh * p.sqp + i]) * p.scale;
		st_gin2((gin_t *)p.dq + b * p.dqs[0] + (long long)i * p.dqs[1] + h * p.dqs[2] + c,
		        (float)a.x * fa_dqi_inv(col[0]) * ir, (float)a.y * fa_dqi_inv(col[1]) * ir);
#else
		const float2 v = *(const float2 *)(p.dqacc + (bh * p.sqp + i) * DP + c);
		st_gin2((gin_t *)p.dq + b * p.dqs[0] + (long long)i * p.dqs[1] + h * p.dqs[2] + c,
		        p.scale * v.x, p.scale * v.y);
#endif
	}
}
