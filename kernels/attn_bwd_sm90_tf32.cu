/* attn_bwd_sm90_tf32.cu - the Hopper (sm_90a) backward main pass on wgmma for fp32: tf32 and
 * 3xtf32, head dims up to 128.
 *
 * Compiled by NVRTC with -arch=sm_90a and the -D options below (kernels/gpu_nvrtc.c, path
 * FA_KPATH_BWDWG32 of kernels/planner_bwd.c). Two entries: fa_bwd_wgprep (the images below)
 * and fa_bwd_main; attn_bwd.cu's fa_bwd_pre and fa_bwd_dq of the same precision (delta, lse2,
 * the zeroed fp32 dQ accumulator before; dQ converted after) run around them unchanged, as
 * for the 16-bit wgmma kernel (kernels/gpu_bwd.c). Includes only fa_device.cuh.
 *
 *   FA_PREC    2 3xtf32 (hi*hi + hi*lo + lo*hi, as attn_fwd_sm90.cu), 3 tf32
 *   FA_D       head dim, a multiple of 8 in [8, 128] (padded with zeros to 16: the dQ
 *              accumulator's row, attn_bwd.cu's DP)
 *   FA_BQ      query rows per step: 32 or 64 (the N of S^T = K Q^T)
 *   FA_MASK    0 none, 1 causal bottom-right, 2 causal top-left (as attn_bwd.cu)
 *   FA_NWG     warpgroups per block: 2 (default) or 1 (the planner's tile nw: 8 or 4)
 *
 * Why: attn_bwd.cu's fp32 main pass runs mma.sync m16n8k8 (321 tf32 TFLOP/s on the H200, 107
 * for 3xtf32); wgmma tf32 reaches 495. What makes fp32 differ from attn_bwd_sm90.cu's 16-bit
 * kernel: tf32 wgmma reads both shared-memory operands K-major only (no transpose bit), so each
 * product's B operand must have its reduction dimension contiguous:
 *   S^T  = K Q^T,  dP^T = V dO^T    ss: A = K / V [key][d], B = Q / dO [query][d] (K = d)
 *   dV  += P^T dO, dK  += dS^T Q    rs: A = P^T / dS^T from the accumulators, B = dO^T / Q^T
 *                                   [d][query] (K = queries)
 *   dQ^T = K^T dS^T                 ss: A = K^T [d][key], B = dS [query][key] (K = keys), the
 *                                   M = head dim in tiles of 64 (K^T padded to DQP rows), so
 *                                   that 32 query rows a step work too; added to the fp32
 *                                   accumulator element by element (red.global.add.f32)
 * so Q, dO and K are needed in both orientations. fa_bwd_wgprep writes them, rounded to tf32
 * (cvt.rna) and for 3xtf32 with their remainders (x - rna(x)), to scratch in global memory as
 * the exact shared-memory images (attn_fwd_sm90.cu's fa_wg_prep does the same for K and V^T):
 * per (batch, kv head, key block of 64) K, V, K^T; per (batch, query head, query block) Q, dO,
 * Q^T, dO^T; each a contiguous run that the main pass copies by 16-byte cp.async. One pass
 * over Q, dO, K and V, where the main pass reads every Q and dO tile Sk / 64 times.
 *
 * The tf32 A fragment (m64nNk8: a0 (r, k c), a1 (r + 8, c), a2 (r, c + 4), a3 (r + 8, c + 4))
 * is not the accumulator's layout (thread holds columns 2c, 2c + 1 of each 8): as for the
 * forward's P V, the queries of each 8 are permuted in Q^T and dO^T (slot s holds query 2s for
 * s < 4, 2(s - 4) + 1 above), so that P^T and dS^T become A fragments without shuffles.
 *
 * A block owns 64 keys of one (batch, kv head): their K, V, K^T images resident in shared
 * memory, over the query heads of the GQA group and the query blocks the mask lets see its
 * keys; grid (key block, kv head, batch). Its FA_NWG warpgroups (2, the default) take the
 * block's steps in turn, each with its own step buffer and its own dK and dV in fp32 registers
 * (summed through shared memory at the end), so that one warpgroup's exponentials, stores, barriers and dQ
 * adds run while the other's wgmmas do (FA_NWG 1: one warpgroup, its next step prefetched
 * into the second buffer). Per step of a warpgroup: S^T and dP^T (one wgmma group, waited
 * for); P^T = exp2(S^T scale log2e - lse2) (3xtf32: the compensated exponent of attn_bwd.cu,
 * lse2 holding the natural lse), dS^T = P^T (dP^T - delta); dV and dK issued; dS stored to
 * shared memory (into the step's Q image, dead by then: a barrier first); dQ^T issued; all
 * waited for; the next step's images requested; dQ added. Barriers are the warpgroup's own
 * (named barriers), four a step.
 *
 * Shared memory: 4 (1 + 3xtf32) (3 x 64 DP (K, V, K^T; K^T DQP rows) + 2 x 4 BQ DP (Q, dO, Q^T,
 * dO^T, two buffers)) + lse2 and delta: 229,888 bytes for tf32 D=128 BQ=32, under sm_90's
 * 232,448; 3xtf32 fits up to head dim 64 (the planner's formula, planner_bwd.c bwdwg32_smem).
 *
 * Numerics: tf32 rounds every operand and P^T, dS^T to nearest; 3xtf32 keeps fp32's error
 * (ARCHITECTURE.md: 1e-5): the three products per k step chain in the accumulator (as the
 * forward's S), and each step's dK and dV contributions are summed from zero and added to dK,
 * dV with IEEE adds (wgmma's accumulator truncates; chained over thousands of queries it
 * biased the forward's O by 1e-4, kernels/PERF-NOTES.md v7).
 *
 *   FA_DET 2 (tf32 only; gpu_bwd.c's rt = 3): the deterministic dQ in fixed point
 *   (fa_device.cuh): the atomic grid and order, int32 adds, the thread's column multipliers in
 *   registers, the step's row multipliers loaded before the adds (H200 tf32 S=4096: +3..5%).
 *   FA_DET 3 (3xtf32 only; rt = 4): the same in 64 bits (int64 accumulator, red.global.add.u64),
 *   since 3xtf32's error is below 2^-28 of a bound.
 *
 * Not here (the planner keeps them on attn_bwd.cu): the sliding window and softcap, head dims
 * above 128, ieee and the bf16 staging.
 */
#include "fa_device.cuh"

#ifndef FA_PREC
#define FA_PREC 3
#endif
#ifndef FA_D
#define FA_D 128
#endif
#ifndef FA_BQ
#define FA_BQ 32
#endif
#ifndef FA_MASK
#define FA_MASK 0
#endif
#ifndef FA_NWG
#define FA_NWG 2
#endif
#if FA_NWG != 1 && FA_NWG != 2
#error "FA_NWG: 1 or 2"
#endif
#if FA_PREC != 2 && FA_PREC != 3
#error "attn_bwd_sm90_tf32.cu: FA_PREC 2 (3xtf32) or 3 (tf32)"
#endif
#if FA_D % 8 || FA_D < 8 || FA_D > 128
#error "FA_D must be a multiple of 8 in [8, 128]"
#endif
#if FA_BQ != 32 && FA_BQ != 64
#error "FA_BQ: 32 or 64"
#endif
#if FA_PREC == 2 && FA_BQ != 32
#error "3xtf32: FA_BQ 32 (the step's remainders and sums beside dK and dV)"
#endif
#ifndef FA_DET
#define FA_DET 0
#endif
/* FA_DET 2 (tf32 only): the deterministic dQ in fixed point (fa_device.cuh), the atomic mode's
 * grid and order; FA_DET 3 (3xtf32 only, whose error is below 2^-28 of a bound): the same in
 * 64 bits (fa_dqi_fix64: one red.global.add.u64 per element into an int64 accumulator) */
#if (FA_DET && !(FA_DET == 2 && FA_PREC == 3) && !(FA_DET == 3 && FA_PREC == 2)) || \
    (defined(FA_WIN) && FA_WIN) || (defined(FA_SOFTCAP) && FA_SOFTCAP)
#error "attn_bwd_sm90_tf32.cu: no window, softcap or chained deterministic dQ (attn_bwd.cu serves them); the fixed point in 32 bits for tf32, 64 for 3xtf32"
#endif
#define DQI64 (FA_DET == 3)
#define DQI (FA_DET == 2 || DQI64)

#define X3 (FA_PREC == 2)
/* 3xtf32: S^T's and dP^T's remainder terms (hi lo + lo hi) over the whole k range first, then
 * the hi hi terms (1: wgmma's accumulator truncates each add at the running sum's size, so the
 * remainders sum at their own; H200, D=64 S=1000: dQ 0.93x SDPA mem-efficient's error), or the
 * three per k step (0: dQ 1.79x; kernels/RESULTS.md). dK's and dV's step sums (from zero, a
 * step long) keep the per-step order; dQ^T's follow FA_X3_SMALL_FIRST_DQ (dQ 0.59x and the
 * backward 6% faster, measured; off in the 64-bit deterministic form, which it spills 4
 * bytes). */
#ifndef FA_X3_SMALL_FIRST
#define FA_X3_SMALL_FIRST 1
#endif
#define X3_SMALL_FIRST (X3 && FA_X3_SMALL_FIRST)
#ifndef FA_X3_SMALL_FIRST_DQ /* the same for dQ^T (0: S^T and dP^T only, above): on but in the
                              * 64-bit deterministic form (FA_DET 3), which it spills */
#define FA_X3_SMALL_FIRST_DQ (FA_DET != 3)
#endif
#define NI (X3 ? 2 : 1)            /* images per operand: hi [, lo] */
#define NT (128 * FA_NWG)
#define NBUF (2 / FA_NWG)          /* step buffers per warpgroup */
#define BKV 64
#define DP ((FA_D + 15) / 16 * 16) /* attn_bwd.cu's padded head dim (the dQ accumulator's row) */
#define DQP ((FA_D + 63) / 64 * 64) /* K^T's rows: the M of dQ^T in tiles of 64 */
#define DQC (DP + 4) /* FA_DET 2: attn_bwd.cu's stride of the column multipliers */
#define MQT (DQP / 64)
#define T_KV (BKV * DP)            /* floats of a K or V image */
#define T_KT (DQP * BKV)           /* of a K^T image */
#define T_Q (FA_BQ * DP)           /* of a Q, dO, Q^T or dO^T image */
#define KVBLK (NI * (2 * T_KV + T_KT)) /* one key block's images: K [, K lo], V [..], K^T [..] */
#define STBLK (NI * 4 * T_Q)       /* one step's: Q [, lo], dO [..], Q^T [..], dO^T [..] */
#define DS_ALIAS (DP >= BKV)       /* dS fits in the step's Q image (else its own) */
#define SBO_D (DP / 4 * 128)       /* bytes between 8-row groups of a [row][d] image */
#define SBO_K (BKV / 4 * 128)      /* of a [row][key] one (K^T, dS) */
#define SBO_T (FA_BQ / 4 * 128)    /* of a [d][query] one (Q^T, dO^T) */
#define NS (FA_BQ / 2)             /* S^T / dP^T (and dQ^T per 64 head dims) floats per thread */
#define NKV (DP / 2)               /* dK / dV floats per thread */
#define NKS (FA_BQ / 8)            /* k8 steps over a step's queries */

/* attn_bwd.cu's fa_bwd_params, field for field (gpu_bwd.c fills one block for every kernel);
 * here q and k are fa_bwd_wgprep's images (step blocks, key blocks), v and dout unused. */
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
	int tstride;
	float scale_lo;
	float *dqrow;       /* FA_DET 2: [B*Hq][sqp] the fixed point's row multipliers (NaN: bad) */
	const float *dqcol; /* FA_DET 2: [B*Hkv][DQC] its column multipliers */
};
static_assert(sizeof(fa_bwd_params) == 288, "gpu_bwd.c's struct bwd_params before its tail");

/* fa_bwd_wgprep's parameters; mirrored by struct bwd_wgprep_params in gpu_bwd.c. */
struct fa_bwd_wgprep_params {
	const float *q, *k, *v, *dout;
	float *qimg, *kimg;
	long long qs[3], ks[3], vs[3], dos[3];
	int B, Sq, Sk, Hq, Hkv, nq, nk, pad_;
};

/* fp32 -> tf32, round to nearest (ties away), as a float with the low 13 bits clear. */
__device__ __forceinline__ float tf32_rna(float x)
{
	u32 r;
	asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
	return __uint_as_float(r);
}

/* Index (in floats) of element (row, col) of an image of `cols` columns in core matrices
 * (8 rows x 4 floats; attn_fwd_sm90.cu's core_idx). */
__device__ __forceinline__ int cidx(int row, int col, int cols)
{
	return ((row >> 3) * (cols / 4) + (col >> 2)) * 32 + (row & 7) * 4 + (col & 3);
}

/* ---- wgmma wrappers (tools/gen-wgmma.py --bwd32): m64nNk8 tf32, fp32 accumulate; ss: A and
 * B by descriptor (K-major both), rs: A from registers. */
__device__ __forceinline__ void wgt_ss_n8(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgt_rs_n8(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgt_ss_n16(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgt_rs_n16(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgt_ss_n32(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgt_rs_n32(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgt_ss_n64(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgt_rs_n64(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgt_ss_n128(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgt_rs_n128(float *d, const u32 (&a)[4], u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

#define WGT_NAME_(form, n) wgt_##form##_n##n
#define WGT_NAME(form, n) WGT_NAME_(form, n)
#define WGT_SS(n) WGT_NAME(ss, n)

/* acc[D0 / 2 ..] += A B over REM columns (N) from column D0 of a B image at baddr whose rows
 * are the N index (8-row groups SBO_T apart: Q^T, dO^T), split into the wgmma widths 128, 64,
 * 32, 16, 8; A the register fragment a (one k8 step). */
template <int D0, int REM>
__device__ __forceinline__ void mm_rs(float *acc, const u32 (&a)[4], u32 baddr)
{
	if constexpr (REM >= 128) {
		wgt_rs_n128(acc + D0 / 2, a, wg_desc(baddr + D0 / 8 * SBO_T, SBO_T));
		mm_rs<D0 + 128, REM - 128>(acc, a, baddr);
	} else if constexpr (REM >= 64) {
		wgt_rs_n64(acc + D0 / 2, a, wg_desc(baddr + D0 / 8 * SBO_T, SBO_T));
		mm_rs<D0 + 64, REM - 64>(acc, a, baddr);
	} else if constexpr (REM >= 32) {
		wgt_rs_n32(acc + D0 / 2, a, wg_desc(baddr + D0 / 8 * SBO_T, SBO_T));
		mm_rs<D0 + 32, REM - 32>(acc, a, baddr);
	} else if constexpr (REM >= 16) {
		wgt_rs_n16(acc + D0 / 2, a, wg_desc(baddr + D0 / 8 * SBO_T, SBO_T));
		mm_rs<D0 + 16, REM - 16>(acc, a, baddr);
	} else if constexpr (REM >= 8) {
		wgt_rs_n8(acc + D0 / 2, a, wg_desc(baddr + D0 / 8 * SBO_T, SBO_T));
	}
}

/* acc (NS floats) += A B^T contracting over the head dim (k steps of 8), S^T's and dP^T's
 * product: A a [key][d] image at aaddr (its remainder T_KV floats on), B a [query][d] one at
 * baddr (its remainder T_Q floats on); 3xtf32 adds hi lo + lo hi, the remainders first under
 * X3_SMALL_FIRST (above). */
__device__ __forceinline__ void mm_kd(float *acc, u32 aaddr, u32 baddr)
{
	if (X3_SMALL_FIRST)
#pragma unroll
		for (int ks = 0; ks < DP / 8; ks++) {
			WGT_SS(FA_BQ)(acc, wg_desc(aaddr + ks * 256, SBO_D),
			              wg_desc(baddr + T_Q * 4 + ks * 256, SBO_D));
			WGT_SS(FA_BQ)(acc, wg_desc(aaddr + T_KV * 4 + ks * 256, SBO_D),
			              wg_desc(baddr + ks * 256, SBO_D));
		}
#pragma unroll
	for (int ks = 0; ks < DP / 8; ks++) {
		const u64 da = wg_desc(aaddr + ks * 256, SBO_D), db = wg_desc(baddr + ks * 256, SBO_D);
		WGT_SS(FA_BQ)(acc, da, db);
		if (X3 && !X3_SMALL_FIRST) {
			WGT_SS(FA_BQ)(acc, da, wg_desc(baddr + T_Q * 4 + ks * 256, SBO_D));
			WGT_SS(FA_BQ)(acc, wg_desc(aaddr + T_KV * 4 + ks * 256, SBO_D), db);
		}
	}
}

/* ---------------------------------------------------------------------------------------------
 * The images (see the head comment): one thread per 16 bytes of a hi image (4 floats), its
 * remainder (3xtf32) written at the same place of the lo image; rows past Sq / Sk and head
 * dims past D are zeros. Step blocks first (B * Hq * nq of them: Q, dO as [query][d], Q^T,
 * dO^T as [d][query slot]), then key blocks (B * Hkv * nk: K, V as [key][d], K^T as [d][key],
 * DQP rows). */
extern "C" __global__ void __launch_bounds__(256) fa_bwd_wgprep(const fa_bwd_wgprep_params p)
{
	const long long nqc = (long long)p.B * p.Hq * p.nq * T_Q; /* 4 images of T_Q / 4 each */
	const long long per = (2 * T_KV + T_KT) / 4;
	const long long nkc = (long long)p.B * p.Hkv * p.nk * per;
	for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < nqc + nkc;
	     i += (long long)gridDim.x * 256) {
		float x[4] = {0.f, 0.f, 0.f, 0.f};
		float *dst;
		int lo_off;
		if (i < nqc) {
			const long long blk = i / T_Q;
			const int w = (int)(i - blk * T_Q), img = w / (T_Q / 4), ci = w - img * (T_Q / 4);
			const long long bh = blk / p.nq;
			const int iq = (int)(blk - bh * p.nq), b = (int)(bh / p.Hq);
			const int h = (int)(bh - (long long)b * p.Hq);
			const long long *st = (img & 1) ? p.dos : p.qs;
			const float *src = ((img & 1) ? p.dout : p.q) + b * st[0] + h * st[2];
			const int cols = img >= 2 ? FA_BQ : DP, cm = ci >> 3;
			const int row = cm / (cols / 4) * 8 + (ci & 7), c4 = cm % (cols / 4);
			const int q0 = iq * FA_BQ;
			if (img < 2) {
				const int q = q0 + row, d = 4 * c4;
				if (q < p.Sq && d < FA_D) {
					const float4 v = *(const float4 *)(src + q * st[1] + d);
					x[0] = v.x;
					x[1] = v.y;
					x[2] = v.z;
					x[3] = v.w;
				}
			} else if (row < FA_D) { /* slots 4 c4 .. 4 c4 + 3 of the 8: queries 2e (+1) */
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int q = q0 + 8 * (c4 >> 1) + 2 * e + (c4 & 1);
					if (q < p.Sq)
						x[e] = src[q * st[1] + row];
				}
			}
			dst = p.qimg + blk * STBLK + img * NI * T_Q + 4 * ci;
			lo_off = T_Q;
		} else {
			const long long j = i - nqc, blk = j / per;
			const int w = (int)(j - blk * per);
			const long long bh = blk / p.nk;
			const int n = (int)(blk - bh * p.nk), b = (int)(bh / p.Hkv);
			const int h = (int)(bh - (long long)b * p.Hkv);
			const int img = w < T_KV / 4 ? 0 : w < T_KV / 2 ? 1 : 2, ci = w - img * (T_KV / 4);
			const long long *st = img == 1 ? p.vs : p.ks;
			const float *src = (img == 1 ? p.v : p.k) + b * st[0] + h * st[2];
			const int cols = img == 2 ? BKV : DP, cm = ci >> 3;
			const int row = cm / (cols / 4) * 8 + (ci & 7), c4 = cm % (cols / 4);
			const int k0 = n * BKV;
			if (img < 2) {
				const int key = k0 + row, d = 4 * c4;
				if (key < p.Sk && d < FA_D) {
					const float4 v = *(const float4 *)(src + key * st[1] + d);
					x[0] = v.x;
					x[1] = v.y;
					x[2] = v.z;
					x[3] = v.w;
				}
			} else if (row < FA_D) {
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int key = k0 + 4 * c4 + e;
					if (key < p.Sk)
						x[e] = src[key * st[1] + row];
				}
			}
			dst = p.kimg + blk * KVBLK + img * NI * T_KV + 4 * ci;
			lo_off = img == 2 ? T_KT : T_KV;
		}
		float hi[4], lo[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			hi[e] = tf32_rna(x[e]);
			lo[e] = x[e] - hi[e];
		}
		*(float4 *)dst = make_float4(hi[0], hi[1], hi[2], hi[3]);
		if (X3)
			*(float4 *)(dst + lo_off) = make_float4(lo[0], lo[1], lo[2], lo[3]);
		else
			(void)lo_off;
	}
}

/* nfl floats (a multiple of 4) global -> shared by 16-byte cp.async, threads t0, t0 + nth, ..;
 * the caller commits. */
__device__ __forceinline__ void load_run(float *s, const float *g, int nfl, int t0, int nth)
{
	for (int i = t0; i < nfl / 4; i += nth)
		cp_async16(smem_u32(s + 4 * i), g + 4 * i, 16);
}

/* Step (query head h, query block iq): its images, lse2 and delta (the rows of sqp exist), by
 * the 128 threads of one warpgroup (lt: the thread's index in it). */
__device__ __forceinline__ void load_step(const fa_bwd_params &p, float *sSt, float *sL,
                                          float *sDl, int b, int h, int iq, int lt)
{
	const long long bh = (long long)b * p.Hq + h;
	load_run(sSt, (const float *)p.q + (bh * p.nq + iq) * STBLK, STBLK, lt, 128);
	load_run(sL, p.lse2 + bh * p.sqp + iq * FA_BQ, FA_BQ, lt, 128);
	load_run(sDl, p.delta + bh * p.sqp + iq * FA_BQ, FA_BQ, lt, 128);
}

/* A barrier of warpgroup wg's 128 threads alone (named barrier wg + 1; 0 is __syncthreads). */
__device__ __forceinline__ void wg_bar(int wg)
{
	asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory");
}

/* The A fragment's element e of k8 step m from accumulator index 4 m + (0, 2, 1, 3)[e] (the
 * query slots of Q^T / dO^T, see the head comment). */
__device__ __forceinline__ int frag_src(int m, int e)
{
	return 4 * m + (e == 1 ? 2 : e == 2 ? 1 : e);
}

/* Step it of the block (it = hh nsteps + (iq - iq0)): its query head of the group, query block. */
__device__ __forceinline__ void step_of(int it, int nsteps, int iq0, int &hh, int &iq)
{
	hh = it / nsteps;
	iq = iq0 + (it - hh * nsteps);
}

/* ---------------------------------------------------------------------------------------------
 * The main pass; grid (key block, kv head, batch). FA_NWG 2 (the default): two warpgroups on
 * the block's 64 keys take its steps in turn (warpgroup w steps w, w + 2, ..), each with its
 * own step buffer, dK and dV, so that one's softmax, stores, barriers and dQ adds run while
 * the other's wgmmas do; a warpgroup loads its next step once its wgmmas are done with the
 * buffer (under its dQ adds); dK and dV are summed through shared memory at the end. FA_NWG 1:
 * one warpgroup, its next step prefetched into a second buffer. */
extern "C" __global__ void __launch_bounds__(NT, 1) fa_bwd_main(const fa_bwd_params p)
{
	extern __shared__ __align__(128) unsigned char smem_raw[];
	float *sKV = (float *)smem_raw;     /* KVBLK: K [, lo], V [, lo], K^T [, lo] */
	float *sSt0 = sKV + KVBLK;          /* 2 x STBLK: Q [, lo], dO [..], Q^T [..], dO^T [..] */
	float *sL0 = sSt0 + 2 * STBLK;      /* 2 x BQ */
	float *sDl0 = sL0 + 2 * FA_BQ;      /* 2 x BQ */
	float *sDSx = sDl0 + 2 * FA_BQ;     /* !DS_ALIAS: per warpgroup dS [, lo] (BQ x 64 each) */
	(void)sDSx;

	const int tid = (int)threadIdx.x, lane = tid & 31, wi = (tid >> 5) & 3;
	/* the warpgroup as a warp-uniform value (CUTLASS's canonical_warp_group_idx): from
	 * tid >> 7 alone ptxas takes the loop below for divergent and serializes every wgmma
	 * (C7520) */
	const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), lt = tid & 127;
	const int g = lane >> 2, c = lane & 3, r0 = 16 * wi + g;
	const int n = (int)blockIdx.x, hk = (int)blockIdx.y, b = (int)blockIdx.z;
	const int kv0 = n * BKV;
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */
	int iq0 = 0; /* the first query block whose rows see key kv0 */
	if (FA_MASK) {
		const int r = kv0 - off;
		iq0 = r >= p.Sq ? p.nq : r > 0 ? r / FA_BQ : 0;
	}

	load_run(sKV, (const float *)p.k + ((long long)(b * p.Hkv + hk) * gridDim.x + n) * KVBLK,
	         KVBLK, tid, NT);
	const int nsteps = p.nq - iq0, total = nsteps * p.group;
#if DQI
	/* the fixed point's column multipliers of this thread's dQ^T rows (head dims) */
	float mcs[MQT][2];
#pragma unroll
	for (int mt = 0; mt < MQT; mt++)
#pragma unroll
		for (int e2 = 0; e2 < 2; e2++)
			mcs[mt][e2] = p.dqcol[((long long)b * p.Hkv + hk) * DQC + 64 * mt + r0 + e2 * 8];
#endif
	float *const sStw = sSt0 + wg * NBUF * STBLK; /* the warpgroup's buffers */
	float *const sLw = sL0 + wg * NBUF * FA_BQ, *const sDlw = sDl0 + wg * NBUF * FA_BQ;
	if (wg < total) {
		int hh, iq;
		step_of(wg, nsteps, iq0, hh, iq);
		load_step(p, sStw, sLw, sDlw, b, hk * p.group + hh, iq, lt);
	}
	cp_async_commit();

	float dk[NKV], dv[NKV];
#pragma unroll
	for (int i = 0; i < NKV; i++)
		dk[i] = dv[i] = 0.f;
	const u32 kaddr = smem_u32(sKV), vaddr = kaddr + NI * T_KV * 4;
	const u32 ktaddr = kaddr + 2 * NI * T_KV * 4;
	constexpr int DSLO = DS_ALIAS ? T_Q : FA_BQ * BKV; /* dS lo after dS hi (floats) */
	/* K, V (every thread's copies) and each warpgroup's first step landed */
	cp_async_wait<0>();
	fence_proxy_async();
	__syncthreads();

	for (int it = wg, jw = 0; it < total; it += FA_NWG, jw++) {
		int hh, iq;
		step_of(it, nsteps, iq0, hh, iq);
		const int h = hk * p.group + hh, q0 = iq * FA_BQ, buf = NBUF == 2 ? jw & 1 : 0;
		const long long bh = (long long)b * p.Hq + h;
		float *sSt = sStw + buf * STBLK;
		const float *sL = sLw + buf * FA_BQ, *sDl = sDlw + buf * FA_BQ;
		if (jw > 0) {
			/* this step's images landed (the warpgroup's copies: its barrier); FA_NWG 1:
			 * and the step before is done (its wgmmas waited for), so the other buffer is
			 * free */
			cp_async_wait<0>();
			fence_proxy_async();
			wg_bar(wg);
		}
#if NBUF == 2
		if (it + 1 < total) {
			int hn, iqn;
			step_of(it + 1, nsteps, iq0, hn, iqn);
			load_step(p, sStw + (buf ^ 1) * STBLK, sLw + (buf ^ 1) * FA_BQ,
			          sDlw + (buf ^ 1) * FA_BQ, b, hk * p.group + hn, iqn, lt);
		}
		cp_async_commit();
#endif

		/* S^T = K Q^T, dP^T = V dO^T (k over d); 3xtf32 + K Q_lo^T + K_lo Q^T, likewise */
		const u32 qaddr = smem_u32(sSt), doaddr = qaddr + NI * T_Q * 4;
		const u32 qtaddr = qaddr + 2 * NI * T_Q * 4, dotaddr = qaddr + 3 * NI * T_Q * 4;
		float s[NS], dp[NS];
#pragma unroll
		for (int i = 0; i < NS; i++)
			s[i] = dp[i] = 0.f;
		wg_fence();
		mm_kd(s, kaddr, qaddr);
		mm_kd(dp, vaddr, doaddr);
		wg_commit();
		wg_wait<0>();
#pragma unroll
		for (int i = 0; i < NS; i++) {
			wg_touch(s[i]);
			wg_touch(dp[i]);
		}

		/* P^T, dS^T; the key tail and the causal edge masked where the tile has them */
		const bool need_mask = kv0 + BKV > p.Sk || (FA_MASK && kv0 + BKV - 1 > q0 + off);
#pragma unroll
		for (int nb = 0; nb < NKS; nb++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int il = nb * 8 + 2 * c + (e & 1);
#if X3
				float pv = fa_p_exp_comp(s[4 * nb + e], p.scale, p.scale_lo, sL[il]);
#else
				float pv = fast_exp2(fmaf(s[4 * nb + e], p.sl, -sL[il]));
#endif
				if (need_mask) {
					const int j = kv0 + r0 + (e >> 1) * 8;
					if (!(j < p.Sk && (!FA_MASK || j <= q0 + il + off)))
						pv = 0.f;
				}
				s[4 * nb + e] = pv;
				dp[4 * nb + e] = pv * (dp[4 * nb + e] - sDl[il]);
			}
		/* as tf32 A fragments, rounded to nearest (3xtf32: and their remainders) */
		u32 ph[NKS][4], dh[NKS][4];
#if X3
		u32 pl[NKS][4], dl[NKS][4];
#endif
#pragma unroll
		for (int m = 0; m < NKS; m++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int x = frag_src(m, e);
				const float a = tf32_rna(s[x]), d = tf32_rna(dp[x]);
				ph[m][e] = __float_as_uint(a);
				dh[m][e] = __float_as_uint(d);
#if X3
				pl[m][e] = __float_as_uint(s[x] - a);
				dl[m][e] = __float_as_uint(dp[x] - d);
#endif
			}

		/* dV += P^T dO, dK += dS^T Q (B = dO^T / Q^T: K = query slots). tf32: both into dV,
		 * dK, one group. 3xtf32: each step's sums from zero in t, added with IEEE adds; dV's
		 * now (its group waited for after dS is stored), dK's with dQ^T's group (one t, so
		 * that the step's remainders and sums fit beside dK and dV: 255 registers at d64) */
#if X3
		float t[NKV];
#pragma unroll
		for (int i = 0; i < NKV; i++)
			t[i] = 0.f;
		wg_fence();
#pragma unroll
		for (int m = 0; m < NKS; m++) {
			mm_rs<0, DP>(t, ph[m], dotaddr + m * 256);
			mm_rs<0, DP>(t, ph[m], dotaddr + T_Q * 4 + m * 256);
			mm_rs<0, DP>(t, pl[m], dotaddr + m * 256);
		}
		wg_commit();
#else
		wg_fence();
#pragma unroll
		for (int m = 0; m < NKS; m++)
			mm_rs<0, DP>(dv, ph[m], dotaddr + m * 256);
#pragma unroll
		for (int m = 0; m < NKS; m++)
			mm_rs<0, DP>(dk, dh[m], qtaddr + m * 256);
		wg_commit();
#endif

		/* dS to shared memory as [query][key] (the K-major B of dQ^T); in the step's Q image
		 * when it fits: every warp's S^T has read Q first (the barrier) */
		float *sdS = DS_ALIAS ? sSt : sDSx + wg * NI * FA_BQ * BKV;
		if (DS_ALIAS)
			wg_bar(wg);
#pragma unroll
		for (int m = 0; m < NKS; m++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int ep = frag_src(0, e);
				const int at = cidx(8 * m + 2 * c + (ep & 1), r0 + (ep >> 1) * 8, BKV);
				sdS[at] = __uint_as_float(dh[m][e]);
#if X3
				sdS[DSLO + at] = __uint_as_float(dl[m][e]);
#endif
			}
		fence_proxy_async();
		wg_bar(wg);
#if X3
		wg_wait<0>(); /* dV's sum */
#pragma unroll
		for (int i = 0; i < NKV; i++) {
			wg_touch(t[i]);
			dv[i] += t[i];
			t[i] = 0.f;
		}
		wg_fence();
#pragma unroll
		for (int m = 0; m < NKS; m++) {
			mm_rs<0, DP>(t, dh[m], qtaddr + m * 256);
			mm_rs<0, DP>(t, dh[m], qtaddr + T_Q * 4 + m * 256);
			mm_rs<0, DP>(t, dl[m], qtaddr + m * 256);
		}
		wg_commit();
#endif

		/* dQ^T = K^T dS^T over the block's 64 keys, 64 head dims per wgmma (A = K^T, B = dS) */
		float dq[MQT][NS];
#pragma unroll
		for (int mt = 0; mt < MQT; mt++)
#pragma unroll
			for (int i = 0; i < NS; i++)
				dq[mt][i] = 0.f;
		const u32 dsaddr = smem_u32(sdS);
		wg_fence();
#pragma unroll
		for (int mt = 0; mt < MQT; mt++) {
			if (X3_SMALL_FIRST && FA_X3_SMALL_FIRST_DQ)
#pragma unroll
				for (int ks = 0; ks < BKV / 8; ks++) {
					WGT_SS(FA_BQ)(dq[mt], wg_desc(ktaddr + mt * 8 * SBO_K + ks * 256, SBO_K),
					              wg_desc(dsaddr + DSLO * 4 + ks * 256, SBO_K));
					WGT_SS(FA_BQ)(dq[mt],
					              wg_desc(ktaddr + T_KT * 4 + mt * 8 * SBO_K + ks * 256, SBO_K),
					              wg_desc(dsaddr + ks * 256, SBO_K));
				}
#pragma unroll
			for (int ks = 0; ks < BKV / 8; ks++) {
				const u64 da = wg_desc(ktaddr + mt * 8 * SBO_K + ks * 256, SBO_K);
				const u64 db = wg_desc(dsaddr + ks * 256, SBO_K);
				WGT_SS(FA_BQ)(dq[mt], da, db);
				if (X3 && !(X3_SMALL_FIRST && FA_X3_SMALL_FIRST_DQ)) {
					WGT_SS(FA_BQ)(dq[mt], da, wg_desc(dsaddr + DSLO * 4 + ks * 256, SBO_K));
					WGT_SS(FA_BQ)(dq[mt],
					              wg_desc(ktaddr + T_KT * 4 + mt * 8 * SBO_K + ks * 256, SBO_K),
					              db);
				}
			}
		}
		wg_commit();
#if X3
		wg_wait<1>(); /* dK's sum */
#pragma unroll
		for (int i = 0; i < NKV; i++) {
			wg_touch(t[i]);
			dk[i] += t[i];
		}
#endif
		wg_wait<0>();
#pragma unroll
		for (int i = 0; i < NKV; i++) {
			wg_touch(dk[i]);
			wg_touch(dv[i]);
		}
#pragma unroll
		for (int mt = 0; mt < MQT; mt++)
#pragma unroll
			for (int i = 0; i < NS; i++)
				wg_touch(dq[mt][i]);

#if NBUF == 1
		/* every warp's wgmmas of the step are done: the buffer takes the warpgroup's next
		 * step, whose loads run under the dQ adds */
		wg_bar(wg);
		if (it + FA_NWG < total) {
			int hn, iqn;
			step_of(it + FA_NWG, nsteps, iq0, hn, iqn);
			load_step(p, sStw, sLw, sDlw, b, hk * p.group + hn, iqn, lt);
		}
		cp_async_commit();
#endif
		/* dQ^T's elements into the fp32 accumulator ([query][DP]) */
		float *acc = p.dqacc + (bh * p.sqp + q0) * DP;
#if DQI
		/* fixed point (fa_device.cuh): per query (a column of dQ^T) its row multiplier, per
		 * head-dim row its column one; a row whose part does not fit marked NaN */
		/* every multiplier loaded before the first add (a load between adds waits for its
		 * latency: kernels/PERF-NOTES.md); the columns' are the block's, loaded once */
		float *const rm0 = p.dqrow + bh * p.sqp + q0;
		float mrs[NKS][2];
#pragma unroll
		for (int nb = 0; nb < NKS; nb++)
#pragma unroll
			for (int e1 = 0; e1 < 2; e1++)
				mrs[nb][e1] = rm0[nb * 8 + 2 * c + e1]; /* rows up to sqp exist */
#pragma unroll
		for (int nb = 0; nb < NKS; nb++)
#pragma unroll
			for (int e1 = 0; e1 < 2; e1++) {
				const int q = nb * 8 + 2 * c + e1;
				if (q0 + q >= p.Sq)
					continue;
				bool bad = false;
#pragma unroll
				for (int mt = 0; mt < MQT; mt++)
#pragma unroll
					for (int e2 = 0; e2 < 2; e2++) {
						const int d = 64 * mt + r0 + e2 * 8;
						if (d < FA_D) {
#if DQI64
							fa_dqi_red64((long long *)p.dqacc + (bh * p.sqp + q0 + q) * DP + d,
							             fa_dqi_fix64(dq[mt][4 * nb + 2 * e2 + e1], mrs[nb][e1],
							                          mcs[mt][e2], bad));
#else
							fa_dqi_red((int *)acc + q * DP + d,
							           fa_dqi_fix(dq[mt][4 * nb + 2 * e2 + e1], mrs[nb][e1],
							                      mcs[mt][e2], bad));
#endif
						}
					}
				if (bad)
					rm0[q] = FA_NAN;
			}
#else
#pragma unroll
		for (int mt = 0; mt < MQT; mt++)
#pragma unroll
			for (int nb = 0; nb < NKS; nb++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const int d = 64 * mt + r0 + (e >> 1) * 8, q = nb * 8 + 2 * c + (e & 1);
					if (d < FA_D && q0 + q < p.Sq)
						asm volatile("red.global.add.f32 [%0], %1;" ::"l"(acc + q * DP + d),
						             "f"(dq[mt][4 * nb + e])
						             : "memory");
				}
#endif
	}
	cp_async_wait<0>();
#if FA_NWG == 2
	/* warpgroup 1's dK, dV into warpgroup 0's through the step buffers (both are done with
	 * them: the barrier), element i of thread t at i 128 + t */
	__syncthreads();
	if (wg == 1) {
#pragma unroll
		for (int i = 0; i < NKV; i++) {
			sSt0[i * 128 + lt] = dk[i];
			sSt0[(NKV + i) * 128 + lt] = dv[i];
		}
	}
	__syncthreads();
	if (wg == 1)
		return;
#pragma unroll
	for (int i = 0; i < NKV; i++) {
		dk[i] += sSt0[i * 128 + lt];
		dv[i] += sSt0[(NKV + i) * 128 + lt];
	}
#endif

	/* dK = scale dS^T Q, dV, fp32; keys past Sk and head dims past D not written */
	float *dKg = (float *)p.dk + b * p.dks[0] + hk * p.dks[2];
	float *dVg = (float *)p.dv + b * p.dvs[0] + hk * p.dvs[2];
#pragma unroll
	for (int hf = 0; hf < 2; hf++) {
		const int j = kv0 + r0 + 8 * hf;
		if (j >= p.Sk)
			continue;
#pragma unroll
		for (int nb = 0; nb < DP / 8; nb++) {
			const int col = nb * 8 + 2 * c;
			if (col >= FA_D)
				continue;
			*(float2 *)(dKg + (long long)j * p.dks[1] + col) =
			    make_float2(p.scale * dk[4 * nb + 2 * hf], p.scale * dk[4 * nb + 2 * hf + 1]);
			*(float2 *)(dVg + (long long)j * p.dvs[1] + col) =
			    make_float2(dv[4 * nb + 2 * hf], dv[4 * nb + 2 * hf + 1]);
		}
	}
}
