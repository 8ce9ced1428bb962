/* attn_fwd_sm90.cu - the Hopper (sm_90a) forward kernel on wgmma: fp32 inputs as tf32 and
 * 3xtf32, and 16-bit inputs (fp16, bf16, and fp32 staged as bf16).
 *
 * Like attn_fwd.cu it includes only fa_device.cuh (the helpers both kernels share, handed to
 * NVRTC as a header by the host); compiled with -arch=sm_90a and the -D
 * options below; the host (kernels/gpu_cuda.c) picks it when the planner's best tile is on one
 * of the paths FA_KPATH_WG32, FA_KPATH_WG32X3 (fp32 tf32 / 3xtf32) or FA_KPATH_WG16 (16-bit),
 * on an sm_90 device.
 *
 *   FA_IN      element type the kernel computes in: 1 fp16, 2 bf16, 3 fp32 (tf32 / 3xtf32)
 *   FA_QIN     element type of Q, K and V in memory: FA_IN, or 3 with FA_IN 2 (the bf16 staging
 *              of fp32: Q rounded as it is loaded, K and V by fa_wg_prep)
 *   FA_OUT     element type written to O: 1 fp16, 2 bf16, 3 fp32
 *   FA_PREC    FA_IN 3 only: 2 3xtf32 (hi*hi + hi*lo + lo*hi), 3 tf32
 *   FA_D       head dim, a multiple of 8 in [8, 256] (16-bit: padded with zeros to 16)
 *   FA_NWG     consumer warpgroups per block; each owns 64 query rows (BR = 64 * NWG)
 *   FA_BC      keys per step: 16, 32, 64 or 128 (the N of the S = Q K^T wgmma)
 *   FA_STAGES  K/V pipeline depth (2 or 3; 16-bit with 3 runs FA3's intra-warpgroup overlap:
 *              the softmax of tile j+1 while P_j V_j is on the tensor cores; 3xtf32 above head
 *              dim 128 only 2 with FA_NWG 1 and FA_BC 16: the half-tile ring, see X3S)
 *   FA_MASK    0 none, 1 causal bottom-right, 2 causal top-left (as attn_fwd.cu)
 *   FA_WIN     1: the sliding window, FA_SOFTCAP 1: logit softcapping, as attn_fwd.cu (the
 *              block walks only its window's tiles; 0, the default, changes nothing)
 *
 * Why a second kernel: mma.sync caps tf32 at 321 TFLOP/s on the H200, 3xtf32 at 107 and bf16 at
 * 642; wgmma (warpgroup MMA, operands from shared memory by descriptor) reaches 495 for tf32 and
 * 989 for bf16.
 *
 * Two launches per call:
 *   fa_wg_prep  K and V, any strides, rounded to tf32 (cvt.rna) and, for 3xtf32, their
 *               remainders (x - rna(x)), or converted to / copied as 16-bit, written to scratch
 *               as the exact shared-memory images the attention kernel copies: K as [key][d] in
 *               "core matrices" of 8 rows x 16 bytes (K-major B operand of S = Q K^T), V
 *               transposed as [d][key] (tf32 wgmma reads B only K-major, and for P V the
 *               reduction runs over keys; 16-bit uses the same layout, one code path), keys
 *               zero-filled up to a multiple of FA_BC, head dims up to the padded width. One
 *               pass per (batch, kv head), where the attention kernel reads every tile Sq / BR
 *               times: a few % of the kernel's time at S = 4096.
 *   fa_attn_fwd FlashAttention-2's loop on warpgroups: a block owns BR query rows of one
 *               (batch, head), Q in shared memory (tf32: rounded in place, 3xtf32's remainder
 *               in registers up to D = 128, beside Q in shared memory above: X3S), K/V tiles
 *               streamed by 16-byte cp.async into a STAGES-deep ring (X3S: a ring of three
 *               half tiles), S = Q K^T by wgmma (A and B from shared memory), online softmax
 *               on the fp32 accumulators, P kept in registers as the A operand of O += P V
 *               (B = V^T from shared memory).
 *
 * Stages (as llama.cpp's fattn-mma-f16.cuh; defined above the kernel, in the order a step runs
 * them): load_q, prep_q; per tile load_kv_tile, kv_ready, issue_s (S = Q K^T) + wg_wait_acc,
 * softmax_tile + rescale_o, make_p, pv_tile (O += P V; issue_pv without the wait); epilogue.
 * The overlapped loop (16-bit, three stages) runs the same stages, S of tile j+1 issued before
 * P_j V_j and waited for alone, with carry_p handing P on. Every stage is __forceinline__ and
 * takes the kernel's arrays rather than declaring its own: the split changes no instruction
 * (the PTX of every wgmma specialisation of tools/sass-dump is the inline kernel's).
 *
 * Layouts. Shared tiles use wgmma's no-swizzle K-major layout: 8 rows x 16 bytes (8 x 4 fp32,
 * 8 x 8 16-bit) per 128-byte core matrix, core matrices along K 128 bytes apart (leading byte
 * offset) and 8-row groups SBO bytes apart; one k step (k8 tf32, k16 16-bit) reads 2 core
 * matrices along K. tf32: P's accumulator layout (thread holds keys 2c, 2c+1 of each 8) becomes
 * the A fragment (k slots c and c+4) without shuffles by permuting the keys of each 8 in V^T:
 * slot s holds key 2s (s < 4) or 2(s-4)+1; the sum over keys does not care about the order.
 * 16-bit: the accumulator pairs pack into the m16n8k16 A fragment as they are (FA2's reuse).
 *
 * The experiments that chose this code (FA_X3_TERMS, PV_W, OVL=0: PERF-NOTES.md v7, v8) were
 * retired from this file; kernels/dev/ keeps the source with them.
 *
 * Numerics: tf32 rounds Q, K, V and P to nearest (cvt.rna); 3xtf32 adds the hi*lo and lo*hi
 * products, so the error is fp32's (ARCHITECTURE.md: relative 1e-5); 16-bit rounds P to the
 * input type, fp32 staged as bf16 rounds Q, K, V to nearest even. Scores in the log2 domain,
 * fp32 statistics, rows that see no key give O = 0 and lse = -inf.
 */
#include "fa_device.cuh"

#ifndef FA_IN
#define FA_IN 3
#endif
#ifndef FA_QIN
#define FA_QIN FA_IN
#endif
#ifndef FA_OUT
#define FA_OUT FA_QIN
#endif
#if FA_IN == 1
#define WG16_T "f16"
#elif FA_IN == 2
#define WG16_T "bf16"
#endif
#ifndef FA_PREC
#define FA_PREC 3
#endif
#ifndef FA_D
#define FA_D 128
#endif
#ifndef FA_NWG
#define FA_NWG 2
#endif
#ifndef FA_BC
#define FA_BC 64
#endif
#ifndef FA_STAGES
#define FA_STAGES 2
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

#define BR (64 * FA_NWG)
#define NT (128 * FA_NWG)
#define W16 (FA_IN != 3)        /* 16-bit kernel */
#define X3 (FA_IN == 3 && FA_PREC == 2)
#if W16
typedef u16 elem_t;
#else
typedef float elem_t;
#endif
#define EPC (W16 ? 8 : 4)             /* elements per 16-byte core-matrix row */
#define KS (2 * EPC)                   /* k of one wgmma: 8 (tf32) or 16 */
#define DP ((FA_D + KS - 1) / KS * KS) /* head dim padded to the k step (16-bit: to 16) */
#define TILE (FA_BC * DP)            /* elements in one K or V tile */
#define NSTEP_S (DP / KS)            /* k steps of S = Q K^T */
#define NSTEP_P (FA_BC / KS)         /* k steps of O += P V */
#define NBLK (FA_BC / 8)             /* n8 blocks of the S accumulator */
#define OVL (W16 && FA_STAGES >= 3) /* the overlapped loop (16-bit, three stages; see the kernel) */
#if OVL && FA_STAGES != 3
#error "the overlapped loop keeps three tiles in shared memory"
#endif
#define NSACC (FA_BC / 2)            /* S accumulator floats per thread */
#define NOACC (DP / 2)               /* O accumulator floats per thread */
#define SBO_Q (DP / EPC * 128)       /* bytes between 8-row groups of Q and K */
#define SBO_V (FA_BC / EPC * 128)    /* bytes between 8-row (d) groups of V^T */
/* 3xtf32 above head dim 128 (X3S): O alone is DP / 2 registers, so Q's remainder cannot stay in
 * registers (another DP / 2) and moves to shared memory beside Q; Q hi and lo (2 x 64 KiB at
 * D = 256) leave room for 16 keys a step only, in a ring of three half tiles (K_j hi + lo, V_j
 * hi + lo, 32 KiB each at D = 256) instead of two whole stages: K_{j+1} loads while tile j
 * runs, V_{j+1} once S_j is done with K_j's slot. One warpgroup (64 rows). S = Q K^T reads
 * [K hi; K lo] as one B operand of 2 x 16 keys (the lo image follows the hi one in the slot at
 * the same row stride), so Q hi is read from shared memory once per k step for both of its
 * products, and the two land in separate accumulators (added with IEEE adds). */
#define X3S (X3 && DP > 128)
#define X3R (X3 && !X3S) /* 3xtf32 with Q's remainder in registers */
#if X3S && (FA_NWG != 1 || FA_BC != 16 || FA_STAGES != 2)
#error "3xtf32 above head dim 128: one warpgroup, 16 keys, FA_STAGES 2 (the half-tile ring)"
#endif
/* 3xtf32: head-dim columns of one P V partial sum: all of them up to D = 128 (one wgmma wait per
 * step; ptxas fits it in 253 registers there), 128 at a time above (X3S: O takes DP / 2) */
#ifndef PV_W
#define PV_W (X3S ? 64 : DP)
#endif

#if FA_D % 8 || FA_D < 8 || FA_D > 256
#error "FA_D must be a multiple of 8 in [8, 256]"
#endif
#if FA_BC != 16 && FA_BC != 32 && FA_BC != 64 && FA_BC != 128
#error "FA_BC must be 16, 32, 64 or 128"
#endif
#if FA_IN == 3 && FA_QIN != 3
#error "fp32 kernels read fp32"
#endif

/* Kernel parameters; mirrored by struct fa_wgparams in gpu_cuda.c (same order, same types). */
struct fa_wgparams {
	const void *q;                  /* FA_QIN elements */
	void *o;                        /* FA_OUT elements */
	float *lse;
	const elem_t *kh, *kl, *vh, *vl; /* fa_wg_prep's images (kl, vl: 3xtf32 only) */
	long long qs[3], os[3];         /* batch, seq, head strides in elements */
	long long ls[3];                /* lse: batch, head, seq */
	int B, Sq, Sk, Hq, Hkv, group;  /* group = Hq / Hkv */
	int skp;                        /* keys of one (batch, kv head) image: Sk rounded up to FA_BC */
	float scale_log2;               /* |scale| * log2(e) */
	int neg_scale;                  /* scale < 0: Q is negated */
	int win_lo, win_hi;             /* FA_WIN: key j visible to query i iff win_lo <= j - i <= win_hi */
	float scale_cap, cap_log2;      /* FA_SOFTCAP: |scale| / cap, cap log2(e) */
};

/* The window's and softcap's parameters handed to softmax_tile in their specialisations only. */
#if FA_WIN || FA_SOFTCAP
#define MX_ARG , p
#define MX_PARAM , const fa_wgparams &p
#else
#define MX_ARG
#define MX_PARAM
#endif

/* fa_wg_prep's parameters; mirrored by struct fa_wgprep in gpu_cuda.c. */
struct fa_wgprep {
	const void *k, *v;              /* FA_QIN elements */
	elem_t *kh, *kl, *vh, *vl;
	long long ks[3], vs[3];
	int B, Sk, Hkv, skp;
};

/* fence_proxy_async, wg_fence, wg_commit, wg_wait, wg_touch and wg_desc: fa_device.cuh
 * (attn_bwd_sm90.cu uses them too). */
/* fp32 -> tf32, round to nearest (ties away), as a float with the low 13 bits clear. */
__device__ __forceinline__ float tf32_rna(float x)
{
	u32 r;
	asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
	return __uint_as_float(r);
}

/* Index (in elements) of element (row, col) of a K-major tile of `cols` columns in core
 * matrices: 8-row group, then EPC-column group, then row in group, then column in group. */
__device__ __forceinline__ int core_idx(int row, int col, int cols)
{
	return ((row >> 3) * (cols / EPC) + col / EPC) * (8 * EPC) + (row & 7) * EPC + col % EPC;
}
/* The slot of key w (0..7) of a group of 8 in V^T: keys 2c -> c, 2c+1 -> c+4. */
__device__ __forceinline__ int key_slot(int w)
{
	return (w >> 1) + ((w & 1) << 2);
}

/* Pack two floats as 16-bit of the kernel's type: lo goes to the low half (the lower k). */
__device__ __forceinline__ u32 pack16(float lo, float hi)
{
#if FA_IN == 1
	return pack_f16(lo, hi);
#else
	return pack_bf16(lo, hi);
#endif
}

/* ---- wgmma wrappers (generated by tools/gen-wgmma.py): m64nNk8 tf32 and m64nNk16 16-bit,
 * fp32 accumulate, ss: A and B by descriptor, rs: A from registers (mma.sync's m16n8k8 /
 * m16n8k16 A fragment per warp). */
__device__ __forceinline__ void wg_ss_n8(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg_rs_n8(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg_ss_n16(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg_rs_n16(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg_ss_n32(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg_rs_n32(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg_ss_n64(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg_rs_n64(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg_ss_n128(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg_rs_n128(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
#if FA_IN != 3
__device__ __forceinline__ void wg16_ss_n8(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg16_rs_n8(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n8k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg16_ss_n16(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg16_rs_n16(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg16_ss_n32(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg16_rs_n32(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg16_ss_n64(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg16_rs_n64(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n64k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
__device__ __forceinline__ void wg16_ss_n128(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg16_rs_n128(float *d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG16_T "." WG16_T " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
	             : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}
#endif

/* The wrappers of the kernel's type: WG_SS(N) / WG_RS(N), N a literal or a macro of one. */
#if W16
#define WG_PFX wg16
#else
#define WG_PFX wg
#endif
#define WG_NAME_(pfx, form, n) pfx##_##form##_n##n
#define WG_NAME(pfx, form, n) WG_NAME_(pfx, form, n)
#define WG_SS(n) WG_NAME(WG_PFX, ss, n)
#define WG_RS(n) WG_NAME(WG_PFX, rs, n)

/* O += A V over the head dim: the N of one wgmma is at most 128, so D is split into slices of
 * 128, 64, 32, 16 and 8 columns (D0: the first column of the rest). */
template <int D0, int REM>
__device__ __forceinline__ void pv_rs(float *acc, u32 a0, u32 a1, u32 a2, u32 a3, u32 vaddr)
{
	if constexpr (REM >= 128) {
		WG_RS(128)(acc + D0 / 2, a0, a1, a2, a3, wg_desc(vaddr + (D0 / 8) * SBO_V, SBO_V));
		pv_rs<D0 + 128, REM - 128>(acc, a0, a1, a2, a3, vaddr);
	} else if constexpr (REM >= 64) {
		WG_RS(64)(acc + D0 / 2, a0, a1, a2, a3, wg_desc(vaddr + (D0 / 8) * SBO_V, SBO_V));
		pv_rs<D0 + 64, REM - 64>(acc, a0, a1, a2, a3, vaddr);
	} else if constexpr (REM >= 32) {
		WG_RS(32)(acc + D0 / 2, a0, a1, a2, a3, wg_desc(vaddr + (D0 / 8) * SBO_V, SBO_V));
		pv_rs<D0 + 32, REM - 32>(acc, a0, a1, a2, a3, vaddr);
	} else if constexpr (REM >= 16) {
		WG_RS(16)(acc + D0 / 2, a0, a1, a2, a3, wg_desc(vaddr + (D0 / 8) * SBO_V, SBO_V));
		pv_rs<D0 + 16, REM - 16>(acc, a0, a1, a2, a3, vaddr);
	} else if constexpr (REM >= 8) {
		WG_RS(8)(acc + D0 / 2, a0, a1, a2, a3, wg_desc(vaddr + (D0 / 8) * SBO_V, SBO_V));
	}
}

/* S += Q K^T for one k step (N = FA_BC keys). */
__device__ __forceinline__ void s_ss(float *s, u64 dq, u64 dk)
{
	WG_SS(FA_BC)(s, dq, dk);
}
__device__ __forceinline__ void s_rs(float *s, const u32 *a, u64 dk)
{
	WG_RS(FA_BC)(s, a[0], a[1], a[2], a[3], dk);
}

/* Load 8 elements of type FA_QIN at p (16-byte aligned for 16-bit, 32 for fp32... 16 each half)
 * as 8 elements of the kernel's 16-bit type (fp32: rounded to nearest even). */
__device__ __forceinline__ uint4 load8_16(const void *p)
{
#if FA_QIN == 3
	const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
	return make_uint4(pack16(a.x, a.y), pack16(a.z, a.w), pack16(b.x, b.y), pack16(b.z, b.w));
#else
	return *(const uint4 *)p;
#endif
}

/* fp32 (tf32, 3xtf32) images: x rounded to tf32 as 16 bytes of hi at element at, and for
 * 3xtf32 its remainder x - hi at the same place of lo. */
__device__ __forceinline__ void store_tf32(elem_t *hi, elem_t *lo, long long at, float4 x)
{
	const float4 h = make_float4(tf32_rna(x.x), tf32_rna(x.y), tf32_rna(x.z), tf32_rna(x.w));
	*(float4 *)(hi + at) = h;
	if (X3)
		*(float4 *)(lo + at) = make_float4(x.x - h.x, x.y - h.y, x.z - h.z, x.w - h.w);
}

/* ---------------------------------------------------------------------------------------------
 * K and V -> the tile images (see the head comment). One thread per 8 keys x one 16-byte chunk
 * of the head dim (8 16-bit or 4 fp32 elements): it reads the chunk of each of the 8 keys
 * (consecutive threads read consecutive chunks of a row) and writes whole core matrices: K's
 * 8 rows x 16 bytes as one 128-byte run, V^T's 8 (16-bit) or 2 x 4 (fp32) head-dim rows of the
 * 8 keys, transposed in registers. Keys past Sk and head dims past D (16-bit padding) are
 * zeros. (One thread per key and chunk, storing V^T element by element, cost 2.6 ms of the
 * bf16 D = 256 forward's 7.0 on the H100: kernels/PERF-NOTES.md.) */
extern "C" __global__ void fa_wg_prep(const fa_wgprep p)
{
	const int dq = DP / EPC, kgs = p.skp / 8;
	const long long n = (long long)p.B * p.Hkv * kgs * dq;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
	     i += (long long)gridDim.x * blockDim.x) {
		const int dc = (int)(i % dq);
		const long long rest = i / dq;
		const int grp = (int)(rest % kgs);
		const long long bh = rest / kgs;
		const int hk = (int)(bh % p.Hkv), b = (int)(bh / p.Hkv);
		const long long base = bh * (long long)p.skp * DP;
		const int key0 = grp * 8, j = key0 / FA_BC, kl0 = key0 % FA_BC;
		const bool dok = dc * EPC < FA_D;
		/* the 8 keys' rows of K's image, one core matrix; V^T's tile j */
		const long long kb = base + core_idx(key0, dc * EPC, DP), vb = base + (long long)j * TILE;
#if W16
		const int es = FA_QIN == 3 ? 4 : 2; /* bytes per element in memory */
		uint4 k[8], v[8];
#pragma unroll
		for (int r = 0; r < 8; r++) {
			k[r] = v[r] = make_uint4(0, 0, 0, 0);
			const int key = key0 + r;
			if (dok && key < p.Sk) {
				k[r] = load8_16((const char *)p.k +
				                es * (b * p.ks[0] + key * p.ks[1] + hk * p.ks[2] + dc * 8));
				v[r] = load8_16((const char *)p.v +
				                es * (b * p.vs[0] + key * p.vs[1] + hk * p.vs[2] + dc * 8));
			}
		}
		uint4 *kd = (uint4 *)(p.kh + kb);
#pragma unroll
		for (int r = 0; r < 8; r++)
			kd[r] = k[r];
		/* V^T: head-dim row dc * 8 + e holds element e of the 8 keys, keys 2w and 2w + 1 in
		 * word w (low half first) */
		uint4 *vd = (uint4 *)(p.vh + vb + core_idx(dc * 8, kl0, FA_BC));
#pragma unroll
		for (int e = 0; e < 8; e++) {
			const u32 sel = (e & 1) ? 0x7632u : 0x5410u;
			u32 w[4];
#pragma unroll
			for (int m = 0; m < 4; m++) {
				const u32 x = (&v[2 * m].x)[e >> 1], y = (&v[2 * m + 1].x)[e >> 1];
				w[m] = __byte_perm(x, y, sel);
			}
			vd[e] = make_uint4(w[0], w[1], w[2], w[3]);
		}
#else
		float4 k[8], v[8];
#pragma unroll
		for (int r = 0; r < 8; r++) {
			k[r] = v[r] = make_float4(0.f, 0.f, 0.f, 0.f);
			const int key = key0 + r;
			if (dok && key < p.Sk) {
				const float *kg = (const float *)p.k, *vg = (const float *)p.v;
				k[r] = *(const float4 *)(kg + b * p.ks[0] + key * p.ks[1] + hk * p.ks[2] + dc * 4);
				v[r] = *(const float4 *)(vg + b * p.vs[0] + key * p.vs[1] + hk * p.vs[2] + dc * 4);
			}
		}
#pragma unroll
		for (int r = 0; r < 8; r++)
			store_tf32(p.kh, p.kl, kb + 4 * r, k[r]);
		/* V^T: head-dim rows dc * 4 + e; slot group h (slots 4h .. 4h + 3, key_slot) holds keys
		 * h, h + 2, h + 4, h + 6 of the 8, in one core matrix (4 of its rows: 64 bytes) */
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const long long vi = vb + core_idx(dc * 4, kl0 + 4 * h, FA_BC);
#pragma unroll
			for (int e = 0; e < 4; e++)
				store_tf32(p.vh, p.vl, vi + 4 * e,
				           make_float4((&v[h].x)[e], (&v[h + 2].x)[e], (&v[h + 4].x)[e],
				                       (&v[h + 6].x)[e]));
		}
#endif
	}
}

/* Tile j's scores s (rows wrow0 + r0 and + 8 of the warpgroup): key tails and the causal edge
 * masked, then the online softmax: row maxima mrow and sums lrow updated, s turned into P in
 * place, alpha the factor O is to be rescaled by. Scores in raw units (sl > 0; FA_SOFTCAP:
 * capped first, then in the log2 domain with sl = 1). FA_WIN: j is the absolute tile, the
 * window's edges masked where they cross the warpgroup's rows. */
__device__ __forceinline__ void softmax_tile(float (&s)[NSACC], int j, int wrow0, int r0, int c,
                                             int Sk, int off, float sl, float (&mrow)[2],
                                             float (&lrow)[2], float (&alpha)[2] MX_PARAM)
{
	const int kv0 = j * FA_BC;
	const int rowb = wrow0 + r0;
#if FA_SOFTCAP
#pragma unroll
	for (int i = 0; i < NSACC; i++)
		s[i] = fa_softcap2<(FA_IN == 3 && FA_PREC == 2)>(s[i], p.scale_cap, p.cap_log2);
#endif
#if FA_WIN
	(void)off;
	if (kv0 + FA_BC > Sk || kv0 - (wrow0 + 63) < p.win_lo || kv0 + FA_BC - 1 - wrow0 > p.win_hi) {
#pragma unroll
		for (int n = 0; n < NBLK; n++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int row = rowb + (e >> 1) * 8, col = kv0 + n * 8 + 2 * c + (e & 1);
				if (!fa_win_sees(row, col, Sk, p.win_lo, p.win_hi))
					s[4 * n + e] = NEG_INF;
			}
	}
#else
	if (kv0 + FA_BC > Sk || (FA_MASK && kv0 + FA_BC - 1 > wrow0 + off)) {
#pragma unroll
		for (int n = 0; n < NBLK; n++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int row = rowb + (e >> 1) * 8, col = kv0 + n * 8 + 2 * c + (e & 1);
				if (col >= Sk || (FA_MASK && col > row + off))
					s[4 * n + e] = NEG_INF;
			}
	}
#endif
#pragma unroll
	for (int hh = 0; hh < 2; hh++) {
		float mx = mrow[hh];
#pragma unroll
		for (int n = 0; n < NBLK; n++)
			mx = fmaxf(mx, fmaxf(s[4 * n + 2 * hh], s[4 * n + 2 * hh + 1]));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
		/* m sl rounded once (__fmul_rn: never contracted into an FFMA), the same value in P's
		 * exponent, in alpha and in the lse: alpha is then exactly 1 while the max holds.
		 * Contracted, alpha was 2^(m sl - rn(m sl)), the product's rounding error, applied to
		 * l and O at every tile: O / l kept it, the lse drifted by ~(tiles) x 2^-25 (4.8e-6
		 * rms at 4096 keys of 16, 5.8x SDPA's gradient error; PERF-NOTES.md, "the 3xtf32
		 * forward's lse"). */
		const float msc = mx == NEG_INF ? 0.f : __fmul_rn(mx, sl);
		alpha[hh] = mrow[hh] == NEG_INF ? 0.f : fast_exp2(__fmul_rn(mrow[hh], sl) - msc);
		mrow[hh] = mx;
		float sum = 0.f;
#pragma unroll
		for (int n = 0; n < NBLK; n++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				const float pv = fast_exp2(fmaf(s[4 * n + 2 * hh + e], sl, -msc));
				s[4 * n + 2 * hh + e] = pv;
				sum += pv;
			}
		lrow[hh] = lrow[hh] * alpha[hh] + sum;
	}
}

/* ---------------------------------------------------------------------------------------------
 * Stages of the kernel, in the order a step runs them: load_q and prep_q once, then per key
 * tile load_kv_tile (into the ring), kv_ready, issue_s (S = Q K^T) and wg_wait_acc,
 * softmax_tile (above: masks, online softmax) and rescale_o, make_p (P as A fragments),
 * pv_tile / issue_pv (O += P V), and epilogue. The overlapped loop runs the same stages in
 * another order, with carry_p between steps. Each is __forceinline__: the split changes no
 * instruction (SASS_DUMP_PTX=1 tools/sass-dump: the PTX of every wgmma specialisation is
 * byte for byte the one of the kernel written inline).
 *
 * Rules the split keeps (as attn_fwd.cu's): the arrays a stage fills are declared by the kernel,
 * in the order it always declared them, and passed in (the order of the locals steers the
 * code generated); kernel parameters are read through p where the kernel read them, never
 * copied into a struct of their own. */

#define NT_KV (X3 ? 4 : 2) /* tiles per ring stage: K hi, [K lo], V^T hi, [V^T lo] */

/* 3xtf32 keeps the remainders (x - tf32(x)) of Q (up to D = 128) and P as register A
 * fragments; the other kinds keep none, and pass an empty struct in their place. */
struct no_frags {
};
#if X3R
typedef u32 qlo_frags[NSTEP_S][4];
#else
typedef no_frags qlo_frags; /* X3S: Q's remainder is in shared memory */
#endif
#if X3
typedef u32 plo_frags[NSTEP_P][4];
#else
typedef no_frags plo_frags;
#endif
#if X3R
typedef float s_small[NSACC]; /* S's two small cross products (issue_s) */
#else
typedef no_frags s_small;
#endif

/* Q: BR rows (zeros past Sq and, 16-bit, past D) into core matrices; one commit group (fp32
 * staged as bf16: loaded, rounded and stored by the threads). */
__device__ __forceinline__ void load_q(const fa_wgparams &p, elem_t *sQ, int tid, int q0, int b,
                                       int h)
{
	const int qes = FA_QIN == 3 ? 4 : 2;
	const char *Qg = (const char *)p.q + qes * (b * p.qs[0] + h * p.qs[2]);
	for (int i = tid; i < BR * (DP / EPC); i += NT) {
		const int row = i / (DP / EPC), dc = i % (DP / EPC);
		const bool in = q0 + row < p.Sq && dc * EPC < FA_D;
		const char *src = in ? Qg + qes * ((long long)(q0 + row) * p.qs[1] + dc * EPC) : Qg;
		elem_t *dst = sQ + core_idx(row, dc * EPC, DP);
#if W16 && FA_QIN == 3
		*(uint4 *)dst = in ? load8_16(src) : make_uint4(0, 0, 0, 0);
#else
		cp_async16(smem_u32(dst), src, in ? 16 : 0);
#endif
	}
	cp_async_commit();
}

/* Tile jt of the prep's images (img: this (batch, kv head)'s first element) into ring stage
 * st: K hi, [K lo], V^T hi, [V^T lo], each a contiguous copy by 16-byte cp.async, as the
 * images are already the shared-memory layout. The caller commits the group (one per step,
 * loaded or not, so that cp.async.wait_group counts steps). */
__device__ __forceinline__ void load_kv_tile(const fa_wgparams &p, elem_t *sKV, long long img,
                                             int tid, int st, int jt)
{
	elem_t *dst = sKV + st * NT_KV * TILE;
	const long long src = img + (long long)jt * TILE;
	const elem_t *from[4] = {p.kh, X3 ? p.kl : p.vh, p.vh, p.vl}; /* stage order */
	for (int m = 0; m < NT_KV; m++) {
		const elem_t *s_ = from[m] + src;
		for (int i = tid; i < TILE / EPC; i += NT)
			cp_async16(smem_u32(dst + m * TILE + EPC * i), s_ + EPC * i, 16);
	}
}

/* A K/V tile landed and may be read by wgmma: this thread's copies but the newest N groups
 * are in (cp.async.wait_group), the fence hands its shared-memory writes (cp.async and
 * st.shared: prep_q's rounded Q too, before the first tile) from the generic to the async
 * proxy wgmma reads through, and the barrier publishes every thread's, and says that every
 * warpgroup is done with the step before (so its buffer may be loaded again). */
template <int N> __device__ __forceinline__ void kv_ready(void)
{
	cp_async_wait<N>();
	fence_proxy_async();
	__syncthreads();
}

/* Q landed (the caller waited and synchronized): tf32: each thread rounds the elements of its
 * own A fragments in place (negated for a negative scale) and, for 3xtf32, keeps their
 * remainders as register A fragments in qlo (X3S: stores them at the same place of sQl, the
 * remainder's image); 16-bit: a negative scale flips the sign bits of the warpgroup's rows sQw. */
__device__ __forceinline__ void prep_q(const fa_wgparams &p, elem_t *sQw, elem_t *sQl, int tid,
                                       int r0, int c, qlo_frags &qlo)
{
#if !X3S
	(void)sQl;
#endif
#if W16
	(void)r0;
	(void)c;
	(void)qlo;
	if (p.neg_scale)
		for (int i = tid & 127; i < 64 * DP / 2; i += 128)
			((u32 *)sQw)[i] ^= 0x80008000u;
#else
	(void)tid;
#if !X3R
	(void)qlo;
#endif
#pragma unroll
	for (int ks = 0; ks < NSTEP_S; ks++) {
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int row = r0 + (e & 1) * 8, col = ks * 8 + c + (e >> 1) * 4;
			const int qi = core_idx(row, col, DP);
			float *q = sQw + qi;
			float x = p.neg_scale ? -*q : *q;
			const float hi = tf32_rna(x);
			*q = hi;
#if X3S
			sQl[qi] = x - hi;
#elif X3
			qlo[ks][e] = __float_as_uint(x - hi);
#endif
		}
	}
#endif
}

/* S = Q K^T of one tile (3xtf32: + Q K_lo^T + Q_lo K^T) as one wgmma group, issued and
 * committed, not waited for: s zeroed, wgmma.fence (s and Q_lo's registers are written before
 * the first wgmma reads them), the k steps, commit. qaddr, kaddr, kladdr: shared addresses of
 * Q, K hi, K lo (3xtf32 only); j: the step (3xtf32: see qa). 3xtf32 (X3R) chains the two
 * small cross products in their own accumulator sb, added by add_small once waited for: the
 * tensor cores truncate as they accumulate, and all three in s biased S toward zero by ~48
 * truncations at D = 128 (the lse by -8e-7; 16 with sb: -5e-7, PERF-NOTES.md). */
__device__ __forceinline__ void issue_s(float (&s)[NSACC], s_small &sb, const qlo_frags &qlo,
                                        int j, u32 qaddr, u32 kaddr, u32 kladdr)
{
#pragma unroll
	for (int i = 0; i < NSACC; i++)
		s[i] = 0.f;
#if X3R
#pragma unroll
	for (int i = 0; i < NSACC; i++)
		sb[i] = 0.f;
#else
	(void)sb;
#endif
#if X3R
	/* Fresh copies of Q's remainder for this step's wgmmas: with the loop-invariant
	 * registers themselves as A operands, ptxas (CUDA 13.0) handed three of them to other
	 * values inside the loop (seen in the SASS at d64 with 64 keys: 1e-4 error from the
	 * second step on; kernels/PERF-NOTES.md v7). z is 0, but not to the compiler, and it
	 * changes with j, so the XORs are neither folded nor hoisted. */
	const u32 z = (u32)j >> 30;
	u32 qa[NSTEP_S][4];
#pragma unroll
	for (int ks = 0; ks < NSTEP_S; ks++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			qa[ks][e] = qlo[ks][e] ^ z;
#else
	(void)qlo;
	(void)j;
	(void)kladdr;
#endif
	wg_fence();
#pragma unroll
	for (int ks = 0; ks < NSTEP_S; ks++) {
		const u64 dq = wg_desc(qaddr + ks * 256, SBO_Q);
		const u64 dk = wg_desc(kaddr + ks * 256, SBO_Q);
		s_ss(s, dq, dk);
#if X3R
		s_ss(sb, dq, wg_desc(kladdr + ks * 256, SBO_Q)); /* Q K_lo^T */
		s_rs(sb, qa[ks], dk);                            /* Q_lo K^T */
#endif
	}
	wg_commit();
}

/* S's small products (issue_s, X3R) into S, after the wait. */
__device__ __forceinline__ void add_small(float (&s)[NSACC], s_small &sb)
{
#if X3R
#pragma unroll
	for (int i = 0; i < NSACC; i++) {
		wg_touch(sb[i]);
		s[i] += sb[i];
	}
#else
	(void)s;
	(void)sb;
#endif
}

#if X3S
/* X3S: S = Q K^T's k steps in parts of FA_X3S_KP (default: all of them, one part). Each part's
 * Q [K; K_lo]^T starts from zero (wgmma's scale-d 0) and is added to the score with IEEE adds;
 * the parts alternate between two accumulators, so part c + 1 runs while part c is added; Q_lo
 * K^T (2^-11 smaller) is chained over all of them. Against the tensor cores' truncating adds
 * over 32 k steps (a bias of S and the lse toward zero): before softmax_tile's rescale fix they
 * were hidden by its larger error (parts of 1, 4, 8: no change); after it, parts of 4 measured
 * the lse's bias -4.0e-7 against one part's -6.6e-7, D = 256 S = 4096 dV 1.06x / 1.38x SDPA's
 * (full / causal) against 1.21x / 1.48x (PERF-NOTES.md, "the 3xtf32 forward's lse"). One part
 * stays the default: the GPU grids ran it, parts of 4 only the D = 256 error cases. */
#ifndef FA_X3S_KP
#define FA_X3S_KP NSTEP_S
#endif
#define X3S_NPART ((NSTEP_S + FA_X3S_KP - 1) / FA_X3S_KP) /* the last one may be shorter */

/* m64n32k8 with scale-d 0: d = a b, the accumulator's old value ignored */
__device__ __forceinline__ void wg_ss_n32_z(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
	             : "l"(da), "l"(db));
}
__device__ __forceinline__ void wg_ss_n16_z(float *d, u64 da, u64 db)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
	             "wgmma.mma_async.sync.aligned.m64n16k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
	             : "l"(da), "l"(db));
}

/* Part c of X3S's S (see above) as one wgmma group, issued and committed, not waited for: Q [K;
 * K_lo]^T of its k steps into sa (keys 0-15 K, 16-31 K_lo: the slot holds K_lo right after K
 * at the same 8-row stride), Q_lo K^T into sb (from zero in part 0). qladdr: Q_lo's shared
 * address; kaddr: the slot's. */
__device__ __forceinline__ void issue_s_part(float (&sa)[2 * NSACC], float (&sb)[NSACC], int c,
                                             u32 qaddr, u32 qladdr, u32 kaddr)
{
	wg_fence();
#pragma unroll
	for (int k = 0; k < FA_X3S_KP; k++) {
		const int ks = c * FA_X3S_KP + k;
		if (ks >= NSTEP_S)
			break;
		const u64 dk = wg_desc(kaddr + ks * 256, SBO_Q);
		const u64 dq = wg_desc(qaddr + ks * 256, SBO_Q), dl = wg_desc(qladdr + ks * 256, SBO_Q);
		if (k == 0)
			wg_ss_n32_z(sa, dq, dk); /* Q [K; K_lo]^T */
		else
			wg_ss_n32(sa, dq, dk);
		if (ks == 0)
			wg_ss_n16_z(sb, dl, dk); /* Q_lo K^T */
		else
			wg_ss_n16(sb, dl, dk);
	}
	wg_commit();
}

/* X3S's S of one tile into s, waited for: the parts issued one ahead, each added once in. j:
 * the step (Q's addresses made to change with it, z being 0 but not to the compiler: else
 * ptxas keeps the loop-invariant descriptors of Q and Q_lo in 64-bit registers across the loop
 * and spills at D = 256). */
__device__ __forceinline__ void s_tile_x3s(float (&s)[NSACC], float (&sa)[2][2 * NSACC],
                                           float (&sb)[NSACC], float (&hl)[NSACC], u32 qaddr,
                                           u32 qladdr, u32 kaddr, int j)
{
	const u32 z = (u32)j >> 30;
	qaddr ^= z;
	qladdr ^= z;
	issue_s_part(sa[0], sb, 0, qaddr, qladdr, kaddr);
#pragma unroll
	for (int c = 0; c < X3S_NPART; c++) {
		if (c + 1 < X3S_NPART) {
			issue_s_part(sa[(c + 1) & 1], sb, c + 1, qaddr, qladdr, kaddr);
			wg_wait<1>();
		} else {
			wg_wait<0>();
		}
		float (&a)[2 * NSACC] = sa[c & 1];
#pragma unroll
		for (int i = 0; i < 2 * NSACC; i++)
			wg_touch(a[i]);
#pragma unroll
		for (int i = 0; i < NSACC; i++) {
			s[i] = c == 0 ? a[i] : s[i] + a[i];
			hl[i] = c == 0 ? a[NSACC + i] : hl[i] + a[NSACC + i];
		}
	}
#pragma unroll
	for (int i = 0; i < NSACC; i++) {
		wg_touch(sb[i]);
		s[i] = s[i] + (hl[i] + sb[i]);
	}
}

/* X3S: half tile n of the sequence K_0, V_0, K_1, V_1, ... (the hi and lo images of tile n / 2
 * of this block's images img) into ring slot n % 3 as [hi][lo]; the caller commits the group. */
__device__ __forceinline__ void load_half(const fa_wgparams &p, elem_t *sKV, long long img,
                                          int tid, int n)
{
	elem_t *dst = sKV + (n % 3) * 2 * TILE;
	const long long src = img + (long long)(n >> 1) * TILE;
	const elem_t *hi = (n & 1) ? p.vh : p.kh, *lo = (n & 1) ? p.vl : p.kl;
	for (int i = tid; i < TILE / EPC; i += NT) {
		cp_async16(smem_u32(dst + EPC * i), hi + src + EPC * i, 16);
		cp_async16(smem_u32(dst + TILE + EPC * i), lo + src + EPC * i, 16);
	}
}
#endif

/* Wait until at most N wgmma groups are still running (the newest ones), then tell the
 * compiler that the accumulators x of the groups now done may have changed here (wg_touch):
 * before it, no instruction may read or write them. */
template <int N, int L> __device__ __forceinline__ void wg_wait_acc(float (&x)[L])
{
	wg_wait<N>();
#pragma unroll
	for (int i = 0; i < L; i++)
		wg_touch(x[i]);
}

/* O *= alpha per row (softmax_tile's factor), once no P V that adds into O is running. */
__device__ __forceinline__ void rescale_o(float (&acc)[NOACC], const float (&alpha)[2])
{
#pragma unroll
	for (int n = 0; n < DP / 8; n++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			acc[4 * n + e] *= alpha[e >> 1];
}

/* P (softmax_tile's s) as the A fragments of O += P V, all of them converted before the first
 * wgmma (registers written between wgmmas make ptxas insert a fence before each). 16-bit, per
 * k16 step (key blocks 2n, 2n+1 of 8): a0 (r, 2c..), a1 (r+8, 2c..), a2 (r, 8+2c..), a3 (r+8,
 * 8+2c..), pairs packed. tf32: a0 (r, 2c), a1 (r+8, 2c), a2 (r, 2c+1), a3 (r+8, 2c+1), see the
 * key slots of V^T (x: the kernel's scratch for one k step's 4 values); 3xtf32 also the
 * remainders pl. */
__device__ __forceinline__ void make_p(const float (&s)[NSACC], u32 (&ph)[NSTEP_P][4],
                                       plo_frags &pl, float (&x)[4])
{
#if W16
	(void)pl;
	(void)x;
#pragma unroll
	for (int n = 0; n < NSTEP_P; n++) {
		ph[n][0] = pack16(s[8 * n], s[8 * n + 1]);
		ph[n][1] = pack16(s[8 * n + 2], s[8 * n + 3]);
		ph[n][2] = pack16(s[8 * n + 4], s[8 * n + 5]);
		ph[n][3] = pack16(s[8 * n + 6], s[8 * n + 7]);
	}
#else
#if !X3
	(void)pl;
#endif
#pragma unroll
	for (int n = 0; n < NSTEP_P; n++) {
		x[0] = s[4 * n];
		x[1] = s[4 * n + 2];
		x[2] = s[4 * n + 1];
		x[3] = s[4 * n + 3];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const float hf = tf32_rna(x[e]);
			ph[n][e] = __float_as_uint(hf);
#if X3
			pl[n][e] = __float_as_uint(x[e] - hf);
#endif
		}
	}
#endif
}

/* O += P V of one tile as one wgmma group, issued and committed, not waited for: wgmma.fence
 * (acc and P's registers were written since the last wgmma), the k steps over keys, commit.
 * vaddr: the shared address of the tile's V^T. */
__device__ __forceinline__ void issue_pv(float (&acc)[NOACC], const u32 (&ph)[NSTEP_P][4],
                                         u32 vaddr)
{
	wg_fence();
#pragma unroll
	for (int n = 0; n < NSTEP_P; n++)
		pv_rs<0, DP>(acc, ph[n][0], ph[n][1], ph[n][2], ph[n][3], vaddr + n * 256);
	wg_commit();
}

#if X3
/* 3xtf32's P V over head-dim columns D0 .. DP - 1 (see pv_tile), PV_W (W: the last part, fewer)
 * at a time: the three products into the zeroed partial sum t, waited for, added to O. */
template <int D0, int REM>
__device__ __forceinline__ void pv_x3_cols(float (&acc)[NOACC], float (&t)[PV_W / 2],
                                           const u32 (&ph)[NSTEP_P][4], const plo_frags &pl,
                                           u32 vaddr, u32 vladdr)
{
	constexpr int W = REM < PV_W ? REM : PV_W;
#pragma unroll
	for (int i = 0; i < W / 2; i++)
		t[i] = 0.f;
	wg_fence();
#pragma unroll
	for (int n = 0; n < NSTEP_P; n++) {
		const u32 vo = (D0 / 8) * SBO_V + n * 256;
		pv_rs<0, W>(t, ph[n][0], ph[n][1], ph[n][2], ph[n][3], vaddr + vo);
		pv_rs<0, W>(t, ph[n][0], ph[n][1], ph[n][2], ph[n][3], vladdr + vo); /* P V_lo */
		pv_rs<0, W>(t, pl[n][0], pl[n][1], pl[n][2], pl[n][3], vaddr + vo);  /* P_lo V */
	}
	wg_commit();
	wg_wait<0>();
#pragma unroll
	for (int i = 0; i < W / 2; i++) {
		wg_touch(t[i]);
		acc[D0 / 2 + i] += t[i];
	}
	if constexpr (REM > W)
		pv_x3_cols<D0 + W, REM - W>(acc, t, ph, pl, vaddr, vladdr);
}
#endif

/* O += P V of one tile, waited for (the loop without overlap). 3xtf32: P V + P V_lo + P_lo V
 * into a zeroed partial sum t (the kernel's), added to O with IEEE adds: wgmma adds into its
 * fp32 accumulator with a truncating (biased) rounding, and summing 3 products per 8 keys
 * straight into O over 4097 keys measured 1e-4 relative error on the H200, ten times fp32's
 * bound (kernels/PERF-NOTES.md v7). PV_W columns of the partial sum at a time; the wait
 * before the adds, as they read t. vladdr: V^T lo (3xtf32 only). */
__device__ __forceinline__ void pv_tile(float (&acc)[NOACC], float (&t)[PV_W / 2],
                                        const u32 (&ph)[NSTEP_P][4], const plo_frags &pl,
                                        u32 vaddr, u32 vladdr)
{
#if X3
	pv_x3_cols<0, DP>(acc, t, ph, pl, vaddr, vladdr);
#else
	(void)t;
	(void)pl;
	(void)vladdr;
	issue_pv(acc, ph, vaddr);
	wg_wait_acc<0>(acc);
#endif
}

/* The overlapped loop: P_{j+1} (pn) becomes the current P (pc). pc is read once more (ANDed
 * with z, a 0 the compiler cannot see, that changes with j) so that its registers stay P_j's
 * until here: coalesced with pn, the packing of P_{j+1} would write the A operand of the
 * running P_j V_j, and ptxas then serializes every wgmma (C7513; PERF-NOTES.md v8). */
__device__ __forceinline__ void carry_p(u32 (&pc)[NSTEP_P][4], const u32 (&pn)[NSTEP_P][4], int j)
{
	const u32 z = (u32)j >> 30;
#pragma unroll
	for (int n = 0; n < NSTEP_P; n++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			pc[n][e] = pn[n][e] ^ (pc[n][e] & z);
}

/* Epilogue: O /= l, logsumexp = (m + log2 l) ln 2, rows wrow0 + r0 (+ 8) of the warpgroup. */
__device__ __forceinline__ void epilogue(const fa_wgparams &p, const float (&acc)[NOACC],
                                         const float (&mrow)[2], const float (&lrow)[2], float sl,
                                         int wrow0, int r0, int c, int b, int h)
{
#pragma unroll
	for (int hh = 0; hh < 2; hh++) {
		float l = lrow[hh];
		l += __shfl_xor_sync(0xffffffffu, l, 1);
		l += __shfl_xor_sync(0xffffffffu, l, 2);
		const float inv = l > 0.f ? 1.f / l : 0.f;
		const int row = wrow0 + r0 + hh * 8;
		if (row >= p.Sq)
			continue;
		if (p.lse && c == 0)
			p.lse[b * p.ls[0] + h * p.ls[1] + row * p.ls[2]] =
			    l > 0.f ? (__fmul_rn(mrow[hh], sl) + fast_log2(l)) * 0.69314718055994531f
			            : NEG_INF;
		const long long ob = b * p.os[0] + h * p.os[2] + (long long)row * p.os[1];
#pragma unroll
		for (int n = 0; n < FA_D / 8; n++) {
			const float x0 = acc[4 * n + 2 * hh] * inv, x1 = acc[4 * n + 2 * hh + 1] * inv;
#if FA_OUT == 3
			*(float2 *)((float *)p.o + ob + n * 8 + 2 * c) = make_float2(x0, x1);
#elif FA_OUT == 2
			*(u32 *)((u16 *)p.o + ob + n * 8 + 2 * c) = pack_bf16(x0, x1);
#else
			*(u32 *)((u16 *)p.o + ob + n * 8 + 2 * c) = pack_f16(x0, x1);
#endif
		}
	}
}

/* ---------------------------------------------------------------------------------------------
 * The forward kernel: the loop over key tiles, in stages. */
extern "C" __global__ void __launch_bounds__(NT, 1) fa_attn_fwd(const fa_wgparams p)
{
	extern __shared__ __align__(128) elem_t smem[];
	elem_t *sQ = smem;                /* BR x DP, core matrices */
	elem_t *sQl = smem + BR * DP;     /* X3S: Q's remainder, the same layout */
	/* per stage: K hi, [K lo], V^T hi, [V^T lo]; X3S: three slots of [hi][lo] */
	elem_t *sKV = smem + (X3S ? 2 : 1) * BR * DP;

	const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, wi = (tid >> 5) & 3;
	const int g = lane >> 2, c = lane & 3;
	const int mb = FA_MASK ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
	const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
	const int q0 = mb * BR;
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */
#if FA_WIN
	/* The tiles jt0 .. jt0 + ntiles - 1 hold the keys [klo, khi) some row of the block sees:
	 * the images are read from tile jt0 on (img), so the time is the window's. */
	const long long klo = max(0LL, (long long)q0 + p.win_lo);
	const long long khi = min((long long)p.Sk, (long long)min(q0 + BR, p.Sq) - 1 + p.win_hi + 1);
	const int jt0 = khi > klo ? (int)(klo / FA_BC) : 0;
	int ntiles = khi > klo ? (int)((khi + FA_BC - 1) / FA_BC) - jt0 : 0;
	const long long img = ((long long)b * p.Hkv + hk) * p.skp * DP + (long long)jt0 * TILE;
#else
	const int jt0 = 0;
	const long long img = ((long long)b * p.Hkv + hk) * p.skp * DP;

	int ntiles = (p.Sk + FA_BC - 1) / FA_BC;
	if (FA_MASK) {
		int lim = min(q0 + BR, p.Sq) - 1 + off; /* the last key any row of this block sees */
		ntiles = lim < 0 ? 0 : min(ntiles, lim / FA_BC + 1);
	}
#endif

	load_q(p, sQ, tid, q0, b, h);
	/* The K/V load stage bound to this block's ring. Called through this lambda, as the kernel
	 * always called its loads: called directly, the inliner's order changes and with it the
	 * PTX of every loop without overlap (the same instructions, other registers). */
	auto load_kv = [&](int st, int jt) { load_kv_tile(p, sKV, img, tid, st, jt); };
#if X3S
	(void)load_kv;
	/* K_0 and V_0 (half tiles 0 and 1), one group each */
	for (int n = 0; n < 2; n++) {
		if (ntiles > 0)
			load_half(p, sKV, img, tid, n);
		cp_async_commit();
	}
	constexpr int QWAIT = 2;
#else
#pragma unroll
	for (int st = 0; st < FA_STAGES - 1; st++) {
		if (st < ntiles)
			load_kv(st, st);
		cp_async_commit();
	}
	constexpr int QWAIT = FA_STAGES - 1;
#endif

	/* Q is in (its group is older than the tiles'); the barrier publishes every thread's
	 * copies before prep_q rewrites the elements of its fragments. */
	cp_async_wait<QWAIT>();
	__syncthreads();
	elem_t *sQw = sQ + wg * 64 * DP;
	const int r0 = 16 * wi + g;
	qlo_frags qlo;
	prep_q(p, sQw, sQl, tid, r0, c, qlo);

#if FA_SOFTCAP
	const float sl = 1.f; /* softmax_tile caps the scores into the log2 domain */
#else
	const float sl = p.scale_log2;
#endif
	float acc[NOACC];
#pragma unroll
	for (int i = 0; i < NOACC; i++)
		acc[i] = 0.f;
	float mrow[2] = {NEG_INF, NEG_INF}, lrow[2] = {0.f, 0.f};
	const u32 qaddr = smem_u32(sQw);

#if OVL
	/* 16-bit, FA3's intra-warpgroup overlap: step j issues S_{j+1} = Q K_{j+1}^T and then
	 * O += P_j V_j, waits for S_{j+1} only, and runs the softmax of tile j+1 while P_j V_j is
	 * still on the tensor cores; O is rescaled once P_j V_j is in. Tiles j and j+1 are in use
	 * during step j, so tile j+2 loads into the third buffer (FA_STAGES 3; the barrier at the
	 * top of step j says every warpgroup is done with step j - 1, hence with tile j - 1). */
	float sc[NSACC];
	u32 pc[NSTEP_P][4];
	plo_frags pl; /* none: 16-bit */
	float x[4];   /* unused: 16-bit */
	if (ntiles > 0) {
		kv_ready<FA_STAGES - 2>(); /* tile 0 */
		s_small sb; /* none: 16-bit */
		issue_s(sc, sb, qlo, 0, qaddr, smem_u32(sKV), 0);
		wg_wait_acc<0>(sc);
		float alpha[2];
		softmax_tile(sc, jt0 + 0, q0 + wg * 64, r0, c, p.Sk, off, sl, mrow, lrow, alpha MX_ARG);
		make_p(sc, pc, pl, x);
	}
	/* Steps 0 .. ntiles - 2 (the S of the next tile issued unconditionally: with a branch
	 * around it ptxas cannot tell which wgmma group wait_group 1 leaves running and
	 * serializes them all), then the last tile's P V. */
	for (int j = 0; j + 1 < ntiles; j++) {
		float sn[NSACC];
		kv_ready<0>(); /* tile j + 1 */
		if (j + 2 < ntiles)
			load_kv((j + 2) % FA_STAGES, j + 2);
		cp_async_commit();
		s_small sb; /* none: 16-bit */
		issue_s(sn, sb, qlo, j + 1, qaddr, smem_u32(sKV + ((j + 1) % FA_STAGES) * NT_KV * TILE), 0);
		issue_pv(acc, pc, smem_u32(sKV + (j % FA_STAGES) * NT_KV * TILE + TILE));
		wg_wait_acc<1>(sn); /* S_{j+1}; P_j V_j may still run */
		float alpha[2];
		softmax_tile(sn, jt0 + j + 1, q0 + wg * 64, r0, c, p.Sk, off, sl, mrow, lrow, alpha MX_ARG);
		u32 pn[NSTEP_P][4];
		make_p(sn, pn, pl, x);
		wg_wait_acc<0>(acc); /* P_j V_j */
		rescale_o(acc, alpha);
		carry_p(pc, pn, j);
	}
	if (ntiles > 0) {
		issue_pv(acc, pc, smem_u32(sKV + ((ntiles - 1) % FA_STAGES) * NT_KV * TILE + TILE));
		wg_wait_acc<0>(acc);
	}
#elif X3S
	/* The half-tile ring: at the top of step j K_j and V_j are in flight or in, K_{j+1} is
	 * loaded into V_{j-1}'s slot once every thread is past step j - 1 (the first barrier), and
	 * V_{j+1} into K_j's once every thread has S_j (the second); each half tile has a step to
	 * land. */
	const u32 qladdr = smem_u32(sQl);
	for (int j = 0; j < ntiles; j++) {
		kv_ready<1>(); /* K_j; V_j may be in flight */
		if (j + 1 < ntiles)
			load_half(p, sKV, img, tid, 2 * j + 2);
		cp_async_commit();
		float sa[2][2 * NSACC], sb[NSACC], hl[NSACC], s[NSACC];
		s_tile_x3s(s, sa, sb, hl, qaddr, qladdr, smem_u32(sKV + (2 * j) % 3 * 2 * TILE), j);
		float alpha[2];
		softmax_tile(s, jt0 + j, q0, r0, c, p.Sk, off, sl, mrow, lrow, alpha MX_ARG);
		rescale_o(acc, alpha);
		u32 ph[NSTEP_P][4];
		plo_frags pl;
		float x[4];
		make_p(s, ph, pl, x);
		kv_ready<1>(); /* V_j; K_{j+1} may be in flight */
		if (j + 1 < ntiles)
			load_half(p, sKV, img, tid, 2 * j + 3);
		cp_async_commit();
		const u32 vaddr = smem_u32(sKV + (2 * j + 1) % 3 * 2 * TILE);
		float t[PV_W / 2];
		pv_tile(acc, t, ph, pl, vaddr, vaddr + 4 * TILE);
	}
#else
	for (int j = 0; j < ntiles; j++) {
		kv_ready<FA_STAGES - 2>(); /* tile j */
		{
			const int jn = j + FA_STAGES - 1;
			if (jn < ntiles)
				load_kv(jn % FA_STAGES, jn);
			cp_async_commit();
		}
		const elem_t *kv = sKV + (j % FA_STAGES) * NT_KV * TILE;
		const u32 kaddr = smem_u32(kv), kladdr = smem_u32(kv + TILE);
		const u32 vaddr = smem_u32(kv + (X3 ? 2 : 1) * TILE), vladdr = smem_u32(kv + 3 * TILE);

		float s[NSACC];
		s_small sb;
		issue_s(s, sb, qlo, j, qaddr, kaddr, kladdr);
		wg_wait_acc<0>(s);
		add_small(s, sb);
		float alpha[2];
		softmax_tile(s, jt0 + j, q0 + wg * 64, r0, c, p.Sk, off, sl, mrow, lrow, alpha MX_ARG);
		rescale_o(acc, alpha);
		u32 ph[NSTEP_P][4];
		plo_frags pl;
		float x[4];
		make_p(s, ph, pl, x);
		float t[PV_W / 2];
		pv_tile(acc, t, ph, pl, vaddr, vladdr);
	}
#endif
	cp_async_wait<0>();

	epilogue(p, acc, mrow, lrow, sl, q0 + wg * 64, r0, c, b, h);
}
