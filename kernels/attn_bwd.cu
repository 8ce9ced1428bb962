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
 *   FA_WIN     1: a sliding window, the mask folded into it by the host as in attn_fwd.cu: key
 *              j is visible to query i iff win_lo <= j - i <= win_hi (FA_MASK is then not
 *              read); a key block walks only the query blocks whose rows its keys' window
 *              reaches, masks element-wise only on the steps an edge crosses, and, in the
 *              deterministic mode, takes its turn by its rank among the key blocks that see
 *              the query block (those are a range, not a prefix). 0 (default): unchanged
 *   FA_SOFTCAP 1: logit softcapping as the forward's: P = exp2(cap log2e tanh(s scale / cap) -
 *              lse2), dS = P (dP - delta) (1 - tanh^2), the cap's derivative (dK and dQ keep
 *              their factor scale). 0 (default): unchanged
 *
 * Three kernels, one module:
 *   fa_bwd_pre   per query row (warp per row): delta = rowsum(dO * O) in fp32, lse2 = lse *
 *                log2(e) (+inf where lse is -inf or past Sq: such rows give P = 0, so they
 *                contribute nothing), the row of the fp32 dQ accumulator zeroed, the
 *                deterministic mode's turn counters zeroed.
 *   fa_bwd_main  a block owns BKV keys of one (batch, kv head), K and V resident in shared
 *                memory, dK and dV accumulated in fp32 registers over the query heads of its
 *                GQA group and the query blocks the mask lets see its keys. Per step (BQ rows):
 *                S^T = K Q^T and dP^T = V dO^T (the block's warps tile the BKV x BQ product),
 *                P^T = exp2(S^T scale log2e - lse2), dS^T = P^T (dP^T - delta), both to shared
 *                memory; dV += P^T dO, dK += dS^T Q (warps tile BKV x D), dQ_step = dS K
 *                (warps tile BQ x D) added to the fp32 accumulator: red.global.add (default),
 *                or, deterministic, in key-block order: block n waits until the step's counter
 *                reads n (every key block below n that sees these rows has added), adds with
 *                plain loads and stores, fences, and sets it to n + 1. The key blocks that see
 *                a query block are a prefix (masks hide keys above a diagonal), and a block
 *                only waits on lower-numbered ones, dispatched before it: no deadlock.
 *   fa_bwd_dq    dQ = scale * accumulator, converted to its dtype and strides.
 *
 * Operands are read from shared memory by one warp-GEMM (wgemm): 16-bit by ldmatrix (.trans for
 * the transposed operands), rows padded by 16 bytes; fp32 by scalar loads in the m16n8k8
 * layout, rows padded by 4 words. Above 128 the head dim is padded with zero columns to a
 * multiple of 32 (below, to 16 in both paths), so that two warps can split dK, dV and dQ's columns
 * (with one, their accumulators take more registers than there are). 3xtf32 accumulates dK and dV per step from zero and adds with
 * IEEE adds (the tensor cores' truncating accumulation, chained over thousands of rows, biases
 * the sum: attn_fwd.cu's P V does the same).
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
#ifndef FA_WIN
#define FA_WIN 0
#endif
#ifndef FA_SOFTCAP
#define FA_SOFTCAP 0
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
	int *turn;          /* [B*Hq][nq]: deterministic mode */
	long long qs[3], ks[3], vs[3], dos[3], dks[3], dvs[3]; /* batch, seq, head */
	int B, Sq, Sk, Hq, Hkv, group;
	int sqp, nq; /* Sq rounded up to BQ, and its query blocks */
	float sl;    /* scale * log2(e), signed */
	float scale;
	int det;
	int pad_;
	/* FA_WIN: key j visible to query i iff win_lo <= j - i <= win_hi (clamped by the host to
	 * [-Sq - 1, Sk + 1]); FA_SOFTCAP: scale / cap (signed) and cap log2(e). Unused otherwise. */
	int win_lo, win_hi;
	float scale_cap, cap_log2;
};

struct fa_bwd_pre_params {
	const void *o, *dout;
	const float *lse;
	float *lse2, *delta, *dqacc;
	int *turn;
	long long os[3], dos[3], ls[3]; /* ls: batch, head, seq */
	int B, Sq, Hq, sqp, nq, pad_;
};

struct fa_bwd_dq_params {
	const float *dqacc;
	void *dq;
	long long dqs[3];
	int B, Sq, Hq, sqp;
	float scale;
	int pad_;
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
template <int MT, int NTN, int KS, bool AT, bool BT, int LDA, int LDB>
__device__ __forceinline__ void wgemm(float (&acc)[MT][NTN][4], const in_t *A, const in_t *B,
                                      int m0, int n0)
{
	const int lane = (int)threadIdx.x & 31, g = lane >> 2, t = lane & 3;
	/* ieee: each product is 32 shuffles and 32 FFMA already; unrolled its compile took 90 s
	 * (a constant: nvcc does not macro-expand pragma arguments, NVRTC does) */
	constexpr int KUNROLL = FA_PREC == 1 ? 1 : 4;
#pragma unroll KUNROLL
	for (int kk = 0; kk < KS; kk++) {
		const int k0 = kk * 8 + t, k1 = k0 + 4;
		fa_op32 a[MT][4];
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			const int r0 = m0 + mt * 16 + g, r1 = r0 + 8;
			a[mt][0] = fa_make_op<FA_PREC>(AT ? A[k0 * LDA + r0] : A[r0 * LDA + k0]);
			a[mt][1] = fa_make_op<FA_PREC>(AT ? A[k0 * LDA + r1] : A[r1 * LDA + k0]);
			a[mt][2] = fa_make_op<FA_PREC>(AT ? A[k1 * LDA + r0] : A[r0 * LDA + k1]);
			a[mt][3] = fa_make_op<FA_PREC>(AT ? A[k1 * LDA + r1] : A[r1 * LDA + k1]);
		}
#pragma unroll
		for (int nt = 0; nt < NTN; nt++) {
			const int n = n0 + nt * 8 + g;
			const fa_op32 b0 = fa_make_op<FA_PREC>(BT ? B[k0 * LDB + n] : B[n * LDB + k0]);
			const fa_op32 b1 = fa_make_op<FA_PREC>(BT ? B[k1 * LDB + n] : B[n * LDB + k1]);
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
				fa_mma32<FA_PREC>(acc[mt][nt], a[mt], b0, b1);
		}
	}
}
#endif

/* acc += A B into an accumulator that lives across steps (dK, dV): 3xtf32 sums the step from
 * zero and adds it with IEEE adds. */
template <int MT, int NTN, int KS, bool AT, bool BT, int LDA, int LDB>
__device__ __forceinline__ void wgemm_acc(float (&acc)[MT][NTN][4], const in_t *A,
                                          const in_t *B, int m0, int n0)
{
#if FA_IN == 3 && FA_PREC == 2
	/* in chunks of up to 4 n8 tiles: the partial sums take 16 registers per row tile, not a
	 * second copy of the accumulator (A's fragments are loaded once per chunk) */
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
	float sum = 0.f, l2 = __int_as_float(0x7f800000);
	if (i < p.Sq) {
		const gin_t *o = (const gin_t *)p.o + b * p.os[0] + i * p.os[1] + h * p.os[2];
		const gin_t *d = (const gin_t *)p.dout + b * p.dos[0] + i * p.dos[1] + h * p.dos[2];
		for (int x = lane; x < FA_D; x += 32)
			sum = fmaf(ld_gin(o + x), ld_gin(d + x), sum);
#pragma unroll
		for (int s = 16; s > 0; s >>= 1)
			sum += __shfl_xor_sync(0xffffffffu, sum, s);
		const float l = p.lse[b * p.ls[0] + h * p.ls[1] + i * p.ls[2]];
		if (l != NEG_INF)
			l2 = l * 1.4426950408889634f;
	}
	if (lane == 0) {
		p.delta[row] = sum;
		p.lse2[row] = l2;
		if (i % FA_BQ == 0)
			p.turn[bh * p.nq + i / FA_BQ] = 0;
	}
	float *acc = p.dqacc + row * DP;
	for (int x = lane; x < DP; x += 32)
		acc[x] = 0.f;
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
                                          float *sDl, int b, int hk, int iq0, int it, int nsteps)
{
	const int hh = it / nsteps, iq = iq0 + (it - hh * nsteps);
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

#if FA_SOFTCAP
/* tanhf where the tolerance is fp32's (ieee, 3xtf32), the MUFU form elsewhere (attn_fwd.cu's) */
#define CAP_ACCURATE (FA_IN == 3 && FA_PREC != 3)
#endif
#if FA_WIN
/* floor(a / b), b > 0, for either sign of a */
__device__ __forceinline__ int floor_div(int a, int b)
{
	return a >= 0 ? a / b : -((b - 1 - a) / b);
}
#endif

/* One step: S^T, dP^T, P^T and dS^T to shared memory, dV and dK accumulated, the step's dQ
 * added (reduction, or in key-block order in the deterministic mode). sQ, sdO, sL, sDl: this
 * step's buffers. */
__device__ __forceinline__ void bwd_step(const fa_bwd_params &p, const in_t *sK, const in_t *sV,
                                         const in_t *sQ, const in_t *sdO, in_t *sP, in_t *sdS,
                                         const float *sL, const float *sDl,
                                         float (&dk)[MT_S][NT_KV][4], float (&dv)[MT_S][NT_KV][4],
                                         int kv0, int off, int n, int iq, long long bh, int ms0,
                                         int ns0, int nkv0, int mq0, int nq0)
{
	const int tid = (int)threadIdx.x, lane = tid & 31;
	const int g = lane >> 2, t = lane & 3;
	const int q0 = iq * FA_BQ;
	/* S^T = K Q^T, dP^T = V dO^T */
	float s[MT_S][NT_S][4], dpv[MT_S][NT_S][4];
	zero_acc(s);
	zero_acc(dpv);
	wgemm<MT_S, NT_S, DP / KK, false, false, LDS, LDS>(s, sK, sQ, ms0, ns0);
	wgemm<MT_S, NT_S, DP / KK, false, false, LDS, LDS>(dpv, sV, sdO, ms0, ns0);

	/* P^T and dS^T; the key tail and the causal edge (FA_WIN: the window's edges) masked where
	 * the tile has them */
#if FA_WIN
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
				const float th = fa_softcap2<CAP_ACCURATE>(s[mt][nt][e], p.scale_cap, 1.f);
				float pv = fast_exp2(fmaf(th, p.cap_log2, -sL[il]));
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
#if FA_SOFTCAP
				dpv[mt][nt][e] = pv * (dpv[mt][nt][e] - sDl[il]) * fmaf(-th, th, 1.f);
#else
				dpv[mt][nt][e] = pv * (dpv[mt][nt][e] - sDl[il]);
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
	if (!p.det) {
#pragma unroll
		for (int mt = 0; mt < MT_Q; mt++)
#pragma unroll
			for (int nt = 0; nt < NT_Q; nt++)
#pragma unroll
				for (int hf = 0; hf < 2; hf++) {
					const int il = mq0 + mt * 16 + g + hf * 8;
					if (q0 + il < p.Sq)
						red_add2(acc + il * DP + nq0 + nt * 8 + 2 * t,
						         dq[mt][nt][2 * hf], dq[mt][nt][2 * hf + 1]);
				}
	} else {
		int *turn = p.turn + bh * p.nq + iq;
		if (tid == 0)
			while (fa_ld_acquire(turn) != n)
				__nanosleep(64);
		__syncthreads();
#pragma unroll
		for (int mt = 0; mt < MT_Q; mt++)
#pragma unroll
			for (int nt = 0; nt < NT_Q; nt++)
#pragma unroll
				for (int hf = 0; hf < 2; hf++) {
					const int il = mq0 + mt * 16 + g + hf * 8;
					float2 *a2 = (float2 *)(acc + il * DP + nq0 + nt * 8 + 2 * t);
					float2 x = __ldcg(a2);
					x.x += dq[mt][nt][2 * hf];
					x.y += dq[mt][nt][2 * hf + 1];
					__stcg(a2, x);
				}
		__threadfence();
		__syncthreads();
		if (tid == 0)
			fa_st_release(turn, n + 1);
	}
}

/* ---------------------------------------------------------------------------------------------
 * The main pass. */
extern "C" __global__ void __launch_bounds__(NT, 1) fa_bwd_main(const fa_bwd_params p)
{
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
	/* The deterministic mode launches the grid as (kv head, batch, key block): the key block
	 * slowest, so the blocks that run at once are of different (batch, kv head) and a block's
	 * turn at a query block comes after the block before it (dispatched a wave earlier) has
	 * passed it; with the key block fastest, the blocks of one head ran together and advanced in
	 * a wavefront, one step behind each other. (Selects of the block index, not values kept
	 * live: the compiler re-reads them where it needs them.) */
	const int n = p.det ? (int)blockIdx.z : (int)blockIdx.x;
	const int hk = p.det ? (int)blockIdx.x : (int)blockIdx.y;
	const int b = p.det ? (int)blockIdx.y : (int)blockIdx.z;
	const int kv0 = n * FA_BKV;
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */

#if FA_WIN
	/* the query blocks [iq0, iq1) with a row whose window reaches one of this block's keys */
	const int iq0 = max(0, floor_div(kv0 - p.win_hi, FA_BQ));
	/* an expression, not a variable: one register fewer across the loop (fp32 3xtf32 spilled
	 * 8 bytes with it); below iq0 when no query block sees these keys */
#define IQ1 min(p.nq, floor_div(min(kv0 + FA_BKV, p.Sk) - 1 - p.win_lo, FA_BQ) + 1)
	/* the deterministic mode's turn at query block iq: the rank of this block among those that
	 * see it, which start at the block of key iq BQ + win_lo */
#define TURN(iq) (n - max(0, floor_div((iq) * FA_BQ + p.win_lo, FA_BKV)))
#else
	/* the first query block whose rows see key kv0 (the mask hides keys above the diagonal) */
	int iq0 = 0;
	if (FA_MASK) {
		const int r = kv0 - off;
		iq0 = r >= p.Sq ? p.nq : r > 0 ? r / FA_BQ : 0;
	}
#define IQ1 p.nq /* a macro, not a copy: the default's code stays as it was */
#define TURN(iq) n
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
		for (int iq = iq0; iq < IQ1; iq++) {
			load_step(p, sQ0, sdO0, sL0, sDl0, b, hk, iq, hh, 1);
			cp_async_wait<0>();
			__syncthreads();
			bwd_step(p, sK, sV, sQ0, sdO0, sP, sdS, sL0, sDl0, dk, dv, kv0, off, TURN(iq), iq,
			         bh, ms0, ns0, nkv0, mq0, nq0);
			__syncthreads(); /* Q, dO, P, dS, lse2, delta are free for the next step */
		}
	}
#else
	/* The steps: every (query head of the group, query block from iq0), flattened, so that the
	 * next step's Q and dO are loaded into the other buffers while this one computes. */
	const int nsteps = IQ1 - iq0, total = nsteps * p.group;
	if (total > 0)
		load_step(p, sQ0, sdO0, sL0, sDl0, b, hk, iq0, 0, nsteps);
	for (int it = 0; it < total; it++) {
		const int hh = it / nsteps, iq = iq0 + (it - hh * nsteps);
		const long long bh = (long long)b * p.Hq + hk * p.group + hh;
		const int buf = it & 1;
		/* the next step into the other buffers (freed by the previous step's last barrier) */
		if (it + 1 < total)
			load_step(p, sQ0 + (buf ^ 1) * SM_Q, sdO0 + (buf ^ 1) * SM_Q, sL0 + (buf ^ 1) * FA_BQ,
			          sDl0 + (buf ^ 1) * FA_BQ, b, hk, iq0, it + 1, nsteps);
		else
			cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();
		bwd_step(p, sK, sV, sQ0 + buf * SM_Q, sdO0 + buf * SM_Q, sP, sdS, sL0 + buf * FA_BQ,
		         sDl0 + buf * FA_BQ, dk, dv, kv0, off, TURN(iq), iq, bh, ms0, ns0, nkv0, mq0,
		         nq0);
		__syncthreads(); /* Q, dO, P, dS, lse2, delta are free for the step after next */
	}
#endif
#undef TURN
#undef IQ1
	cp_async_wait<0>(); /* K and V landed even when no step ran */

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
		const float2 v = *(const float2 *)(p.dqacc + (bh * p.sqp + i) * DP + c);
		st_gin2((gin_t *)p.dq + b * p.dqs[0] + (long long)i * p.dqs[1] + h * p.dqs[2] + c,
		        p.scale * v.x, p.scale * v.y);
	}
}
