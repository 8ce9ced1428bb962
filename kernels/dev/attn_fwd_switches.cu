/* attn_fwd.cu - FlashAttention-2 style forward kernel, compiled at run time by NVRTC.
 *
 * Self-contained: no #include (NVRTC has no system headers). The host (kernels/gpu_cuda.c) embeds
 * this file as the C string fa_src_attn_fwd and specialises it with -D options:
 *
 *   FA_IN      element type read from Q/K/V: 1 fp16, 2 bf16, 3 fp32
 *   FA_OUT     element type written to O: 1 fp16, 2 bf16, 3 fp32 (fp32 O with bf16 inputs is the
 *              second half of the fp32 "bf16" precision, whose K and V the host converted)
 *   FA_PREC    fp32 inputs only: 1 ieee (FFMA), 2 3xtf32, 3 tf32
 *   FA_D       head dim, a multiple of 8 in [8, 256]
 *   FA_NW      warps per block; FA_RT row tiles of 16 query rows per warp (block rows BR = 16*NW*RT)
 *   FA_BC      keys per step (multiple of 16)
 *   FA_STAGES  K/V pipeline depth: tile j+STAGES-1 is in flight while tile j is computed; 1 =
 *              one buffer each, FlashAttention-2's order (V_j during Q K_j^T, K_j+1 during P V_j;
 *              slower on the H200, so the planner does not offer it: PERF-NOTES.md v4)
 *   FA_MASK    0 none, 1 causal bottom-right (key j visible to query i iff j <= i + Sk - Sq),
 *              2 causal top-left (j <= i)
 *   FA_QIN     element type of Q in global memory, FA_IN by default; 3 (fp32) with FA_IN 2 is
 *              the fp32 "bf16" staging (PERF-NOTES.md, "v6: bf16 staging"): the kernel rounds Q
 *              to bf16 (cvt.rn, as fa_cvt_f32_bf16 does) as it stores it into shared memory, so
 *              the host converts only K and V (FA_QLATE 1: Q converted after the first K/V tiles
 *              are issued, the variant measured in v6; 0, before them, keeps v5's main loop)
 *
 * Structure (FlashAttention-2): a block owns BR query rows of one (batch, head); each warp owns
 * 16*RT rows. S = Q K^T with mma.sync, online softmax on fp32 registers (scores kept in the log2
 * domain), P re-used from registers as the A operand of P V, K/V tiles streamed by cp.async into
 * a STAGES-deep ring. Tails: rows past Sq/Sk are zero-filled by cp.async (src-size 0) and their
 * scores set to -inf; a row that sees no key writes O = 0 and lse = -inf.
 *
 * 16-bit path (FA_IN 1/2): shared rows padded by 16 bytes (conflict-free ldmatrix), head dim
 * padded to a multiple of 16 with zeros, ldmatrix (.trans for V), m16n8k16.
 * fp32 path (FA_IN 3): shared memory fp32, m16n8k8 tf32. The k index of both products is
 * permuted (mma k slot t <-> element 2t, slot t+4 <-> element 2t+1): the sums do not care, and it
 * turns the Q/K fragment loads into 8-byte loads and makes P's accumulator layout the A operand
 * without shuffles. Row strides are padded so these loads are bank-conflict free.
 * A Hopper (sm_90a: wgmma + TMA) variant would be a second source chosen per architecture by
 * the host; the parameter block below is meant to be shared with it.
 */

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

/* Kernel parameters; mirrored by struct fa_kparams in gpu_cuda.c (same order, same types). */
struct fa_kparams {
	const void *q, *k, *v;
	void *o;
	float *lse;
	long long qs[3], ks[3], vs[3], os[3]; /* batch, seq, head strides in elements */
	long long ls[3];                      /* lse: batch, head, seq */
	int B, Sq, Sk, Hq, Hkv, group;        /* group = Hq / Hkv */
	float scale_log2;                     /* |scale| * log2(e) */
	int neg_scale;                        /* scale < 0: Q is negated in shared memory */
};

#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ u32 smem_u32(const void *p)
{
	return (u32)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared; src_bytes 0 zero-fills (tails, head-dim padding). */
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
	             "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float fast_exp2(float x)
{
	float y;
	asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}
__device__ __forceinline__ float fast_log2(float x)
{
	float y;
	asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
	return y;
}

/* Pack two floats as 16-bit: lo goes to the low half (the lower k index). */
__device__ __forceinline__ u32 pack_bf16(float lo, float hi)
{
	u32 r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}
__device__ __forceinline__ u32 pack_f16(float lo, float hi)
{
	u32 r;
	asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}

#ifndef FA_IN
#define FA_IN 2
#endif
#ifndef FA_OUT
#define FA_OUT FA_IN
#endif
#ifndef FA_PREC
#define FA_PREC 2
#endif
#ifndef FA_D
#define FA_D 128
#endif
#ifndef FA_NW
#define FA_NW 4
#endif
#ifndef FA_RT
#define FA_RT 1
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

#ifndef FA_SKIP_RESCALE /* skip O's rescale in steps where no row max of the warp grew */
/* measured (PERF-NOTES.md v2): +2% at d128 128x64 w4r2, -7% at d64 w4r2 and d256 w8r1; fp32: the
 * FMULs are cheap next to 3 MMAs and the registers are not */
#define FA_SKIP_RESCALE (RTHR > 0 || (FA_IN != 3 && FA_RT == 2 && DP == 128))
#endif
#ifndef FA_FOLD /* fold the scale into the FFMA that feeds ex2 (0: multiply the scores first) */
#define FA_FOLD 1
#endif
#ifndef FA_NEGQ
#define FA_NEGQ 1
#endif
#ifndef FA_KUNROLL
#define FA_KUNROLL 4 /* fp32 path: k steps of Q K^T unrolled together */
#endif
/* v4 switches (kernels/PERF-NOTES.md v4, all measured on the H200; each keeps the kernel exact;
 * they act on the 16-bit path only, the fp32 kernels are the v3 code):
 *   FA_LDFAST  1: whole K/V tiles by per-thread pointers fixed before the loop (one 64-bit add
 *              per 16-byte copy, no predicates), the general loader for tails (+10% d64, +4-6%
 *              d128, +2% d256)
 *   FA_QREG    1: Q's A fragments loaded once into registers where they take at most 32
 *              registers (padded D * row tiles <= 128; +3.8% d64)
 *   FA_ONEBAR  0: one barrier per key step (K_j and V_j awaited together at its top): -2..+1%
 *   FA_SADDR   0: ldmatrix addresses as a per-thread byte base plus constants: neutral
 *   FA_MMAVOL  1: mma asm volatile (0 gave the same SASS)
 *   FA_RTHR    0: keep a row's max until a score exceeds it by RTHR in the log2 domain (P <=
 *              2^RTHR), with the rescale skip: O is almost never rescaled, but -6..-9% at d64 and
 *              d256 (the skip branch keeps the exponentials out of the P V block)
 *   FA_EARLYRS 0: O's rescale before the exponentials (with FA_RTHR): -4% d64, +-0 d256
 * v5 (PERF-NOTES.md v5): FA_PAIR, warp pairs sharing K/V fragments across 32 rows (below):
 *   2 on d256 128x64 w8r1 (+2.7%), 0 elsewhere unless asked; 1 measured -3% */
#ifndef FA_LDFAST
#define FA_LDFAST 1
#endif
#ifndef FA_QREG
#define FA_QREG 1
#endif
#ifndef FA_ONEBAR
#define FA_ONEBAR 0
#endif
#ifndef FA_SADDR
#define FA_SADDR 0
#endif
#ifndef FA_MMAVOL
#define FA_MMAVOL 1
#endif
#ifndef FA_RTHR
#define FA_RTHR 0
#endif
#ifndef FA_EARLYRS
#define FA_EARLYRS 0
#endif

#define NT (FA_NW * 32)
#define BR (FA_NW * 16 * FA_RT)
#define NJ (FA_BC / 8) /* n8 tiles of S per row tile */

#if FA_IN == 3
typedef float in_t;
#define ES 4
#define DP FA_D                              /* k steps of 8: no head-dim padding */
#define LDQ (FA_D + ((FA_D % 16) == 0 ? 8 : 0)) /* row stride = 8 or 24 words mod 32 */
#define LDK LDQ
#define LDV (FA_D + 4)                       /* row stride = 4 words mod 8 */
#else
typedef u16 in_t;
#define ES 2
#define DP ((FA_D + 15) / 16 * 16)
#define LDQ (DP + 8) /* 16-byte pad: the 8 rows of an ldmatrix hit 8 different bank groups */
#define LDK LDQ
#define LDV LDQ
#endif
#define ND (DP / 8) /* n8 tiles of O per row tile */
#define CPE (16 / ES) /* elements per 16-byte chunk */

#define SMEM_Q (BR * LDQ)
#define SMEM_K (FA_BC * LDK)
#define SMEM_V (FA_BC * LDV)

/* The fast K/V loader: thread tid copies chunk column tid % CPR of rows tid / CPR + i * RSTEP. */
#define LD_CPR ((DP + CPE - 1) / CPE)
#define LD_RSTEP (NT / LD_CPR)
/* Where the switches act: the 16-bit path only (the fp32 kernels stay as measured in v3); the fast
 * loader where the threads tile the chunks of a row evenly (padded D 16, 32, 64, 128, 256); Q in
 * registers where its fragments take at most 32 registers (padded D x row tiles <= 128) */
#define LD_FAST (FA_LDFAST && FA_IN != 3 && NT % LD_CPR == 0 && (FA_BC * LD_CPR) % NT == 0)
#define ONEBAR (FA_ONEBAR && FA_IN != 3)
#define SADDR ((FA_SADDR || PAIR) && FA_IN != 3) /* the pairs need it: they spill without */
#define QREG (FA_QREG && FA_IN != 3 && FA_RT * DP <= 128)
#define RTHR (FA_IN != 3 ? FA_RTHR : 0)
#define EARLYRS (FA_EARLYRS && FA_IN != 3 && (FA_RT == 1 || DP <= 64)) /* d128 r2 spills */

/* Warp pairs (FA_PAIR, kernels/PERF-NOTES.md v5): with one row tile per warp, every K and V
 * fragment read from shared memory feeds one row tile only (144 ldmatrix per 256 MMA at d256).
 * The two warps of a pair share their 32 rows: each computes O for both row tiles and half the
 * head dim, so each V fragment feeds two row tiles; P goes to the partner through shared memory
 * (16 bytes per lane and k16 slice, written before the mid-step barrier the V tile needs anyway).
 *   FA_PAIR 1: each warp computes S for its own 16 rows and all keys (K fragments as before);
 *              the rescale factors of its rows go with P.        ldmatrix/256 MMA 144 -> 112 (+8)
 *   FA_PAIR 2: each warp computes S for both row tiles and half the keys (each K fragment also
 *              feeds two row tiles); the row maxima are exchanged first (a 64-thread barrier),
 *              the row sums are per-warp partial sums added at the end.  144 -> 96 (+8)
 * Where it applies (the planner reserves the exchange buffer, fa_tile_smem, for exactly these
 * tiles): the 16-bit path, one row tile per warp, >= 2 stages with the mid-step barrier (not
 * FA_ONEBAR), padded D > 128 and a multiple of 32 (halves of whole ldmatrix.x4). The planner
 * reads the switch from FA_NVRTC_EXTRA too (planner.c: pair_mode), so its default is in both:
 * FA_PAIR 2 on the tiles measured (padded D 256, 64 keys, 8 warps), off elsewhere unless asked.
 * Measured (PERF-NOTES.md v5): PAIR 2 +2.7% at d256 (294.5 vs 286.8), PAIR 1 -3% (it spills). */
#ifndef FA_PAIR /* on by default where measured (v5, H200): d256 128x64 w8r1 s2 +2.7% / +2.0% causal */
/* D == 256 exactly: d248 pads to the same tile but was never run paired on a GPU */
#define FA_PAIR (FA_D == 256 && FA_BC == 64 && FA_NW == 8 ? 2 : 0)
#endif
#define PAIR_OK (FA_IN != 3 && FA_RT == 1 && FA_STAGES >= 2 && DP % 32 == 0 && DP > 128)
#define PAIR (PAIR_OK && !ONEBAR ? (FA_PAIR == 2 && FA_BC % 32 != 0 ? 1 : FA_PAIR) : 0)
#if PAIR
#define SRT (PAIR == 2 ? 2 : 1)     /* row tiles of S per warp */
#define SNJ (PAIR == 2 ? NJ / 2 : NJ) /* n8 key tiles of S per warp */
#define ORT 2                       /* row tiles of O per warp */
#define ONDW (ND / 2)               /* n8 tiles of O per warp */
#else
#define SRT FA_RT
#define SNJ NJ
#define ORT FA_RT
#define ONDW ND
#endif
/* Exchange buffer after the K/V ring (bytes): P in A-fragment order (16 B per lane, row tile
 * and k16 slice: NW * BC * 32; the epilogue's row sums reuse it), per-lane rescale factors or
 * row maxima (NW * 512). Mirrored by fa_tile_smem in planner.c. */
#define SMEM_XP (FA_NW * FA_BC * 32)
#define SMEM_XR (FA_NW * 512)

/* Q read as fp32 and converted in the prologue (FA_QIN 3, 16-bit path): Q is read once per
 * block, so the conversion costs the block a few hundred instructions, against a pass of 6 bytes
 * per element over the whole tensor on the host's side. */
#ifndef FA_QIN
#define FA_QIN FA_IN
#endif
#ifndef FA_QLATE /* 1: Q converted after the first K/V tiles are issued (see the prologue) */
#define FA_QLATE 0
#endif
#if FA_QIN != FA_IN && !(FA_QIN == 3 && FA_IN != 3)
#error "FA_QIN: FA_IN, or 3 (fp32 Q) with a 16-bit FA_IN"
#endif
#define QCVT (FA_QIN != FA_IN)
#if QCVT
typedef float qin_t;
#else
typedef in_t qin_t;
#endif

/* Load `NROWS` rows of a tile (row stride `rs` elements in global memory) into shared memory with
 * row stride `LD`; rows >= valid and chunks past the head dim are zero-filled. */
template <int NROWS, int LD>
__device__ __forceinline__ void load_tile(in_t *s, const in_t *g, long long rs, int valid)
{
	const int CPR = (DP + CPE - 1) / CPE; /* chunks per shared row (incl. zero padding) */
	const int TOTAL = NROWS * CPR;
#pragma unroll
	for (int it = 0; it < (TOTAL + NT - 1) / NT; it++) {
		int i = it * NT + (int)threadIdx.x;
		if (TOTAL % NT == 0 || i < TOTAL) {
			int r = i / CPR, c = i - r * CPR;
			bool ok = r < valid && c * CPE < FA_D;
			const in_t *src = ok ? g + r * rs + c * CPE : g;
			cp_async16(smem_u32(s + r * LD + c * CPE), src, ok ? 16 : 0);
		}
	}
}

/* A whole tile (every row valid) by the fast loader: `gp` points at this thread's first chunk
 * (row tid / CPR, column (tid % CPR) * CPE; bytes 0 zero-fills a padding column, gp then points
 * at column 0), `rstep` bytes between its rows; `sb` = the shared address of that chunk. */
template <int NROWS, int LD>
__device__ __forceinline__ void load_tile_fast(u32 sb, const char *gp, long long rstep, int bytes)
{
#pragma unroll
	for (int it = 0; it < NROWS * LD_CPR / NT; it++) {
		cp_async16(sb + it * LD_RSTEP * LD * ES, gp, bytes);
		gp += rstep;
	}
}

/* ---------------------------------------------------------------------------------------------
 * Tensor-core primitives */
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
#if FA_MMAVOL
#define MMA_ASM asm volatile
#else
#define MMA_ASM asm /* no side effects: only its operands order it */
#endif
__device__ __forceinline__ void mma16(float *c, const u32 *a, u32 b0, u32 b1)
{
#if FA_IN == 1
	MMA_ASM("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
#else
	MMA_ASM("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
#endif
	             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* The 64 threads of warps 2i and 2i+1 (FA_PAIR): named barrier 1 + i. */
__device__ __forceinline__ void pair_sync(int warp)
{
	asm volatile("bar.sync %0, 64;\n" ::"r"(1 + (warp >> 1)) : "memory");
}
__device__ __forceinline__ u32 pack_in(float lo, float hi)
{
#if FA_IN == 1
	return pack_f16(lo, hi);
#else
	return pack_bf16(lo, hi);
#endif
}
#else
__device__ __forceinline__ void mma_tf32(float *c, const u32 *a, u32 b0, u32 b1)
{
	asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
	             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* An fp32 operand in the form its precision multiplies: tf32 (one part) or big + small. */
struct op32 {
	u32 big;
#if FA_PREC == 2
	u32 small;
#endif
#if FA_PREC == 1
	float f;
#endif
};
__device__ __forceinline__ op32 make_op(float x)
{
	op32 o;
#if FA_PREC == 1
	o.f = x;
	o.big = 0;
#elif FA_PREC == 3
	/* The tensor cores read the top 19 bits of a tf32 operand and drop the other 13
	 * (CUTLASS's round_half_ulp_truncate relies on the same): adding half a tf32 ulp rounds
	 * to nearest (ties away) in one integer add, where cvt.rna.tf32.f32 costs about five
	 * instructions on sm_90. Non-finite inputs may come out as NaN. */
	o.big = __float_as_uint(x) + 0x1000u;
#elif defined(FA_OLDSPLIT)
	asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(o.big) : "f"(x));
	asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(o.small) : "f"(x - __uint_as_float(o.big)));
#else
	/* 3xtf32: big = x truncated to tf32 (exact), small = x - big (exact in fp32, |small| <
	 * 2^-10 |x|) rounded to tf32 as above: three instructions instead of about twelve. */
	o.big = __float_as_uint(x) & 0xffffe000u;
	o.small = __float_as_uint(x - __uint_as_float(o.big)) + 0x1000u;
#endif
	return o;
}
/* c += a b for the m16n8k8 fragment layout, in the chosen precision. */
__device__ __forceinline__ void mma32(float *c, const op32 *a, op32 b0, op32 b1)
{
#if FA_PREC == 1
	/* IEEE: exact fp32 products with FFMA, gathering the fragments with shuffles.
	 * A[row][k] for row g lives in lanes 4g+u (a0: k=u, a2: k=u+4; a1/a3 for row g+8);
	 * B[k][n] in lane 4n+u (b0: k=u, b1: k=u+4). */
	const int lane = threadIdx.x & 31, t = lane & 3;
	const int qb = lane & ~3;
#pragma unroll
	for (int u = 0; u < 4; u++) {
		float ag = __shfl_sync(0xffffffffu, a[0].f, qb | u);
		float ag4 = __shfl_sync(0xffffffffu, a[2].f, qb | u);
		float ah = __shfl_sync(0xffffffffu, a[1].f, qb | u);
		float ah4 = __shfl_sync(0xffffffffu, a[3].f, qb | u);
		float b0n0 = __shfl_sync(0xffffffffu, b0.f, 8 * t + u);
		float b1n0 = __shfl_sync(0xffffffffu, b1.f, 8 * t + u);
		float b0n1 = __shfl_sync(0xffffffffu, b0.f, 8 * t + 4 + u);
		float b1n1 = __shfl_sync(0xffffffffu, b1.f, 8 * t + 4 + u);
		c[0] = fmaf(ag, b0n0, c[0]);
		c[0] = fmaf(ag4, b1n0, c[0]);
		c[1] = fmaf(ag, b0n1, c[1]);
		c[1] = fmaf(ag4, b1n1, c[1]);
		c[2] = fmaf(ah, b0n0, c[2]);
		c[2] = fmaf(ah4, b1n0, c[2]);
		c[3] = fmaf(ah, b0n1, c[3]);
		c[3] = fmaf(ah4, b1n1, c[3]);
	}
#else
	u32 ab[4] = {a[0].big, a[1].big, a[2].big, a[3].big};
#if FA_PREC == 2
	u32 as[4] = {a[0].small, a[1].small, a[2].small, a[3].small};
	mma_tf32(c, as, b0.big, b1.big);
	mma_tf32(c, ab, b0.small, b1.small);
#endif
	mma_tf32(c, ab, b0.big, b1.big);
#endif
}
#endif

#if QCVT
/* Q's BR rows from fp32 global memory (row stride rs elements) into the 16-bit tile, rounded to
 * nearest even: per chunk of 8 elements two 16-byte loads (the host's fp32 alignment rules: a
 * 16-byte aligned pointer and strides of whole 16 bytes) and one 16-byte store. Rows >= valid
 * and the head-dim padding get zeros, as load_tile's zero-fill gives. Plain stores: the barriers
 * that publish the cp.async version of the tile publish these too. */
__device__ __forceinline__ void load_q_f32(in_t *s, const float *g, long long rs, int valid)
{
	const int CPR = DP / 8, TOTAL = BR * CPR; /* TOTAL % NT == 0: BR*CPR/NT = RT*DP/16 */
#pragma unroll
	for (int it = 0; it < TOTAL / NT; it++) {
		const int i = it * NT + (int)threadIdx.x;
		const int r = i / CPR, c = i - r * CPR;
		float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
		if (r < valid && c * 8 < FA_D) {
			const float4 *src = (const float4 *)(g + r * rs + c * 8);
			x0 = src[0];
			x1 = src[1];
		}
		*(uint4 *)(s + r * LDQ + c * 8) =
			make_uint4(pack_in(x0.x, x0.y), pack_in(x0.z, x0.w), pack_in(x1.x, x1.y),
			           pack_in(x1.z, x1.w));
	}
}
#endif

/* ---------------------------------------------------------------------------------------------
 * The forward kernel */
extern "C" __global__ void __launch_bounds__(NT, 1) fa_attn_fwd(const fa_kparams p)
{
	extern __shared__ __align__(16) unsigned char smem_raw[];
	in_t *sQ = (in_t *)smem_raw;
	in_t *sK = sQ + SMEM_Q;
	in_t *sV = sK + FA_STAGES * SMEM_K;

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3;
	const int mb = FA_MASK ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
	const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
	const int q0 = mb * BR;
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */

	const qin_t *Qg = (const qin_t *)p.q + b * p.qs[0] + h * p.qs[2] + (long long)q0 * p.qs[1];
	const in_t *Kg = (const in_t *)p.k + b * p.ks[0] + hk * p.ks[2];
	const in_t *Vg = (const in_t *)p.v + b * p.vs[0] + hk * p.vs[2];

	int ntiles = (p.Sk + FA_BC - 1) / FA_BC;
	if (FA_MASK) {
		int lim = min(q0 + BR, p.Sq) - 1 + off; /* the last key any row of this block sees */
		ntiles = lim < 0 ? 0 : min(ntiles, lim / FA_BC + 1);
	}

	/* Prologue: Q, then tiles 0 .. STAGES-2 (one commit group each for K and V). */
#if QCVT
	/* Here, before the K/V tiles are issued (FA_QLATE 1: after them, while they fly, as
	 * measured on the H200; ptxas then spends 10-15 more instructions per key step of the
	 * main loop, SASS sm_90, PERF-NOTES.md "v6: bf16 staging"; here the loop is v5's,
	 * instruction for instruction, at d128 and d256) */
	if (!FA_QLATE)
		load_q_f32(sQ, Qg, p.qs[1], p.Sq - q0);
#else
	load_tile<BR, LDQ>(sQ, Qg, p.qs[1], p.Sq - q0);
#endif
	cp_async_commit(); /* QCVT: an empty group, so that every wait below counts the same */
#pragma unroll
	for (int s = 0; s < FA_STAGES - 1; s++) {
		if (s < ntiles)
			load_tile<FA_BC, LDK>(sK + s * SMEM_K, Kg + (long long)s * FA_BC * p.ks[1], p.ks[1],
			                      p.Sk - s * FA_BC);
		cp_async_commit();
		if (s < ntiles)
			load_tile<FA_BC, LDV>(sV + s * SMEM_V, Vg + (long long)s * FA_BC * p.vs[1], p.vs[1],
			                      p.Sk - s * FA_BC);
		cp_async_commit();
	}
	if (FA_STAGES == 1) { /* one buffer each: K_0 now, V_j at the top of step j */
		if (ntiles > 0)
			load_tile<FA_BC, LDK>(sK, Kg, p.ks[1], p.Sk);
		cp_async_commit();
	}
#if QCVT
	if (FA_QLATE)
		load_q_f32(sQ, Qg, p.qs[1], p.Sq - q0);
#endif

	/* A negative scale: negate Q in shared memory (exact), so that the row max of the raw
	 * scores is the max of the scaled ones. The barrier at the top of the first step
	 * publishes the flipped words. */
#if FA_FOLD
	const float sl = p.scale_log2;
#else
	const float sl_in = p.scale_log2, sl = 1.f;
#endif
#if RTHR > 0
	const float rthr = (float)RTHR / sl; /* the threshold in raw-score units (sl > 0) */
#endif
	if (FA_NEGQ && !QREG && p.neg_scale) {
		cp_async_wait<2 * (FA_STAGES - 1)>(); /* Q has landed (this thread's part) */
		__syncthreads();                      /* ... everyone's */
		u32 *w = (u32 *)sQ;
#pragma unroll 1
		for (int i = tid; i < SMEM_Q * ES / 4; i += NT)
			w[i] ^= ES == 2 ? 0x80008000u : 0x80000000u;
	}

	float acc[ORT][ONDW][4];
	float mrow[SRT][2], lrow[SRT][2];
#pragma unroll
	for (int r = 0; r < ORT; r++)
#pragma unroll
		for (int n = 0; n < ONDW; n++)
			acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.f;
#pragma unroll
	for (int r = 0; r < SRT; r++) {
		mrow[r][0] = mrow[r][1] = NEG_INF;
		lrow[r][0] = lrow[r][1] = 0.f;
	}
	const int wrow = warp * 16 * FA_RT; /* first row of this warp inside the block */
#if PAIR
	/* The pair: warps 2i and 2i+1 own rows 32i .. 32i+31; this warp is half ph of it. S rows
	 * from srow (PAIR 1: its own tile; PAIR 2: both tiles), S keys from kbase (PAIR 2: its half
	 * of the step's keys), O columns from ocol (its half of the head dim). acc[0] is row tile 0
	 * of S (PAIR 1: this warp's rows, acc[1] the partner's; PAIR 2: the pair's tiles 0 and 1). */
	const int ph = warp & 1;
	const int srow = PAIR == 2 ? wrow - ph * 16 : wrow;
	const int kbase = PAIR == 2 ? ph * (FA_BC / 2) : 0;
	const int ocol = ph * (DP / 2);
	uint4 *const xp = (uint4 *)(smem_raw + (SMEM_Q + FA_STAGES * (SMEM_K + SMEM_V)) * ES);
	float4 *const xr = (float4 *)((unsigned char *)xp + SMEM_XP);
	float4 *const xl = (float4 *)xp; /* the epilogue's, after a barrier */
	uint4 *const xp_own = xp + warp * (SRT * SNJ / 2) * 32 + lane;
	const uint4 *const xp_par = xp + (warp ^ 1) * (SRT * SNJ / 2) * 32 + lane;
	{
		/* the launch must have reserved the exchange buffer (planner.c mirrors FA_PAIR) */
		u32 dyn;
		asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
		if (dyn < (SMEM_Q + FA_STAGES * (SMEM_K + SMEM_V)) * ES + SMEM_XP + SMEM_XR)
			__trap();
	}
#else
	const int srow = wrow, kbase = 0, ocol = 0;
#endif

#if QREG
	/* Q's A fragments for the whole row block of this warp, loaded once (a negative scale
	 * flips their sign bits here instead of in shared memory). */
	u32 qf[FA_RT][DP / 16][4];
	cp_async_wait<2 * (FA_STAGES - 1)>(); /* Q has landed (this thread's part) */
	__syncthreads();                      /* ... everyone's */
#pragma unroll
	for (int r = 0; r < FA_RT; r++)
#pragma unroll
		for (int kk = 0; kk < DP / 16; kk++) {
			ldsm_x4(qf[r][kk][0], qf[r][kk][1], qf[r][kk][2], qf[r][kk][3],
			        smem_u32(sQ + (wrow + r * 16 + (lane & 15)) * LDQ + kk * 16 + (lane >> 4) * 8));
			if (FA_NEGQ && p.neg_scale)
#pragma unroll
				for (int e = 0; e < 4; e++)
					qf[r][kk][e] ^= 0x80008000u;
		}
#endif
#if SADDR
	/* ldmatrix row addresses of this lane (bytes); each use adds a constant */
	const u32 qa0 = smem_u32(sQ + (srow + (lane & 15)) * LDQ + (lane >> 4) * 8);
	const u32 ka0 = smem_u32(sK + (kbase + (lane >> 4) * 8 + (lane & 7)) * LDK + ((lane >> 3) & 1) * 8);
	const u32 va0 = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * LDV + ocol + (lane >> 4) * 8);
#endif
#if LD_FAST
	/* This thread's chunk of every K/V tile: row lr0 (+ RSTEP i), column lcc; a padding column
	 * (lcc >= D) zero-fills from column 0's address. Pointers to tile STAGES-1, advanced one
	 * tile per step. */
	const int lr0 = tid / LD_CPR, lcc = (tid % LD_CPR) * CPE;
	const int lbytes = lcc < FA_D ? 16 : 0, lcol = lcc < FA_D ? lcc : 0;
	const u32 sK0 = smem_u32(sK + lr0 * LDK + lcc), sV0 = smem_u32(sV + lr0 * LDV + lcc);
	const long long krs = (long long)LD_RSTEP * p.ks[1] * ES, vrs = (long long)LD_RSTEP * p.vs[1] * ES;
	const long long kts = (long long)FA_BC * p.ks[1] * ES, vts = (long long)FA_BC * p.vs[1] * ES;
	const char *kgp = (const char *)(Kg + lr0 * p.ks[1] + lcol) + (FA_STAGES == 1 ? 1 : FA_STAGES - 1) * kts;
	const char *vgp = (const char *)(Vg + lr0 * p.vs[1] + lcol) + (FA_STAGES - 1) * vts;
#endif

	/* Tile jn of K or V into ring buffer `buf` (the fast loader when the tile is whole: its
	 * pointer, kgp or vgp, must point at tile jn) */
#if LD_FAST
#define LOAD_K(jn, buf)                                                                           \
	do {                                                                                      \
		if (p.Sk - (jn) * FA_BC >= FA_BC)                                                 \
			load_tile_fast<FA_BC, LDK>(sK0 + (buf) * (SMEM_K * ES), kgp, krs, lbytes); \
		else                                                                              \
			load_tile<FA_BC, LDK>(sK + (buf) * SMEM_K,                                \
			                      Kg + (long long)(jn) * FA_BC * p.ks[1], p.ks[1],    \
			                      p.Sk - (jn) * FA_BC);                               \
	} while (0)
#define LOAD_V(jn, buf)                                                                           \
	do {                                                                                      \
		if (p.Sk - (jn) * FA_BC >= FA_BC)                                                 \
			load_tile_fast<FA_BC, LDV>(sV0 + (buf) * (SMEM_V * ES), vgp, vrs, lbytes); \
		else                                                                              \
			load_tile<FA_BC, LDV>(sV + (buf) * SMEM_V,                                \
			                      Vg + (long long)(jn) * FA_BC * p.vs[1], p.vs[1],    \
			                      p.Sk - (jn) * FA_BC);                               \
	} while (0)
#define LOAD_NEXT(ptr, ts) ((ptr) += (ts))
#else
#define LOAD_K(jn, buf)                                                                           \
	load_tile<FA_BC, LDK>(sK + (buf) * SMEM_K, Kg + (long long)(jn) * FA_BC * p.ks[1], p.ks[1], \
	                      p.Sk - (jn) * FA_BC)
#define LOAD_V(jn, buf)                                                                           \
	load_tile<FA_BC, LDV>(sV + (buf) * SMEM_V, Vg + (long long)(jn) * FA_BC * p.vs[1], p.vs[1], \
	                      p.Sk - (jn) * FA_BC)
#define LOAD_NEXT(ptr, ts) ((void)0)
#endif

	for (int j = 0; j < ntiles; j++) {
#if FA_STAGES == 1
		/* FlashAttention-2's single buffers: V_j is loaded while Q K_j^T and the softmax
		 * run, K_{j+1} while P V_j runs */
		cp_async_wait<0>(); /* Q and K_j have landed (this thread's part) */
		__syncthreads();    /* ... everyone's; V's buffer is free (P V_{j-1} is done) */
		LOAD_V(j, 0);
		cp_async_commit();
		LOAD_NEXT(vgp, vts);
#else
#if ONEBAR
		cp_async_wait<2 * FA_STAGES - 4>(); /* Q, K_j and V_j have landed (this thread's part) */
#else
		cp_async_wait<2 * FA_STAGES - 3>(); /* Q and K_j have landed (this thread's part) */
#endif
		__syncthreads(); /* ... everyone's; buffer (j-1) is free */
		{
			const int jn = j + FA_STAGES - 1, bn = jn % FA_STAGES;
			if (jn < ntiles)
				LOAD_K(jn, bn);
			cp_async_commit();
			if (jn < ntiles)
				LOAD_V(jn, bn);
			cp_async_commit();
			LOAD_NEXT(kgp, kts);
			LOAD_NEXT(vgp, vts);
		}
#endif
		const in_t *cK = sK + (j % FA_STAGES) * SMEM_K;
		const in_t *cV = sV + (j % FA_STAGES) * SMEM_V;
#if SADDR
		const u32 ka = ka0 + (j % FA_STAGES) * (SMEM_K * ES);
		const u32 va = va0 + (j % FA_STAGES) * (SMEM_V * ES);
		(void)cK;
		(void)cV;
#endif

		/* S = Q K^T */
		float s[SRT][SNJ][4];
#pragma unroll
		for (int r = 0; r < SRT; r++)
#pragma unroll
			for (int n = 0; n < SNJ; n++)
				s[r][n][0] = s[r][n][1] = s[r][n][2] = s[r][n][3] = 0.f;
#if FA_IN != 3
#pragma unroll
		for (int kk = 0; kk < DP / 16; kk++) {
#if QREG
#define QFRAG(r) qf[r][kk]
#else
			u32 a[SRT][4];
#define QFRAG(r) a[r]
#pragma unroll
			for (int r = 0; r < SRT; r++)
#if SADDR
				ldsm_x4(a[r][0], a[r][1], a[r][2], a[r][3],
				        qa0 + (r * 16 * LDQ + kk * 16) * ES);
#else
				ldsm_x4(a[r][0], a[r][1], a[r][2], a[r][3],
				        smem_u32(sQ + (srow + r * 16 + (lane & 15)) * LDQ + kk * 16 +
				                 (lane >> 4) * 8));
#endif
#endif
#pragma unroll
			for (int n = 0; n < SNJ; n += 2) {
				u32 b0, b1, b2, b3;
#if SADDR
				ldsm_x4(b0, b1, b2, b3, ka + (n * 8 * LDK + kk * 16) * ES);
#else
				ldsm_x4(b0, b1, b2, b3,
				        smem_u32(cK + (kbase + n * 8 + (lane >> 4) * 8 + (lane & 7)) * LDK +
				                 kk * 16 + ((lane >> 3) & 1) * 8));
#endif
#pragma unroll
				for (int r = 0; r < SRT; r++) {
					mma16(s[r][n], QFRAG(r), b0, b1);
					mma16(s[r][n + 1], QFRAG(r), b2, b3);
				}
			}
#undef QFRAG
		}
#else
#pragma unroll FA_KUNROLL
		for (int kk = 0; kk < FA_D / 8; kk++) {
			op32 a[FA_RT][4];
#pragma unroll
			for (int r = 0; r < FA_RT; r++) {
				float2 x = *(const float2 *)(sQ + (wrow + r * 16 + g) * LDQ + kk * 8 + 2 * t);
				float2 y = *(const float2 *)(sQ + (wrow + r * 16 + g + 8) * LDQ + kk * 8 + 2 * t);
				a[r][0] = make_op(x.x);
				a[r][2] = make_op(x.y);
				a[r][1] = make_op(y.x);
				a[r][3] = make_op(y.y);
			}
#pragma unroll
			for (int n = 0; n < NJ; n++) {
				float2 x = *(const float2 *)(cK + (n * 8 + g) * LDK + kk * 8 + 2 * t);
				op32 b0 = make_op(x.x), b1 = make_op(x.y);
#pragma unroll
				for (int r = 0; r < FA_RT; r++)
					mma32(s[r][n], a[r], b0, b1);
			}
		}
#endif

#if !FA_FOLD
#pragma unroll
		for (int r = 0; r < SRT; r++)
#pragma unroll
			for (int n = 0; n < SNJ; n++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					s[r][n][e] *= sl_in;
#endif
		/* Mask tails and the causal edge on the raw scores (only where needed). */
		const int kv0 = j * FA_BC;
		const bool need_mask = kv0 + FA_BC > p.Sk || (FA_MASK && kv0 + FA_BC - 1 > q0 + off);
		if (need_mask) {
#pragma unroll
			for (int r = 0; r < SRT; r++)
#pragma unroll
				for (int n = 0; n < SNJ; n++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						int row = q0 + srow + r * 16 + g + (e >> 1) * 8;
						int col = kv0 + kbase + n * 8 + 2 * t + (e & 1);
						bool vis = col < p.Sk && (!FA_MASK || col <= row + off);
						if (!vis)
							s[r][n][e] = NEG_INF;
					}
		}

#if PAIR == 2
		/* Each warp of the pair saw half the keys: the maxima of its half, then of both. */
		float mxp[SRT][2];
#pragma unroll
		for (int r = 0; r < SRT; r++)
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				float mx = NEG_INF;
#pragma unroll
				for (int n = 0; n < SNJ; n++)
					mx = fmaxf(mx, fmaxf(s[r][n][2 * hh], s[r][n][2 * hh + 1]));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
				mxp[r][hh] = mx;
			}
		xr[warp * 32 + lane] = make_float4(mxp[0][0], mxp[0][1], mxp[1][0], mxp[1][1]);
		pair_sync(warp);
		{
			const float4 o = xr[(warp ^ 1) * 32 + lane];
			mxp[0][0] = fmaxf(mxp[0][0], o.x);
			mxp[0][1] = fmaxf(mxp[0][1], o.y);
			mxp[1][0] = fmaxf(mxp[1][0], o.z);
			mxp[1][1] = fmaxf(mxp[1][1], o.w);
		}
#endif
		/* Online softmax on raw scores (sl > 0: a negative scale negated Q): new row max,
		 * P = exp2(s sl - m sl) with one FFMA per score, the running sum rescaled. O is
		 * rescaled only when some row max of the warp grew (alpha is exactly 1 otherwise:
		 * m sl - m sl with the product rounded once, not contracted into an FFMA). */
#if EARLYRS
		/* The same, ordered max -> O's rescale -> exponentials: the exponentials and P V then
		 * share one basic block even when the rescale is a (rarely taken) branch, so the
		 * scheduler can overlap this warp's MUFU work with its first P V products. */
		float alpha[SRT][2], msc[SRT][2];
		bool grew = false;
		(void)grew;
#pragma unroll
		for (int r = 0; r < SRT; r++) {
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
#if PAIR == 2
				float mx = fmaxf(mrow[r][hh], mxp[r][hh]);
#else
				float mx = mrow[r][hh];
#pragma unroll
				for (int n = 0; n < SNJ; n++)
					mx = fmaxf(mx, fmaxf(s[r][n][2 * hh], s[r][n][2 * hh + 1]));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#endif
				const float mo = mrow[r][hh];
#if RTHR > 0
				if (mx <= mo + rthr)
					mx = mo;
#endif
				grew |= mx != mo;
				msc[r][hh] = mx == NEG_INF ? 0.f : __fmul_rn(mx, sl);
				alpha[r][hh] = fast_exp2(__fmul_rn(mo, sl) - msc[r][hh]);
				mrow[r][hh] = mx;
			}
		}
#if FA_SKIP_RESCALE
		if (__any_sync(0xffffffffu, grew))
#endif
		{
#pragma unroll
			for (int r = 0; r < SRT; r++)
#pragma unroll
				for (int n = 0; n < ONDW; n++) {
					acc[r][n][0] *= alpha[r][0];
					acc[r][n][1] *= alpha[r][0];
					acc[r][n][2] *= alpha[r][1];
					acc[r][n][3] *= alpha[r][1];
				}
		}
#pragma unroll
		for (int r = 0; r < SRT; r++) {
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				float sum = 0.f;
#pragma unroll
				for (int n = 0; n < SNJ; n++) {
					s[r][n][2 * hh] = fast_exp2(fmaf(s[r][n][2 * hh], sl, -msc[r][hh]));
					s[r][n][2 * hh + 1] = fast_exp2(fmaf(s[r][n][2 * hh + 1], sl, -msc[r][hh]));
					sum += s[r][n][2 * hh] + s[r][n][2 * hh + 1];
				}
				lrow[r][hh] = lrow[r][hh] * alpha[r][hh] + sum;
			}
		}
#else
		float alpha[SRT][2];
		bool grew = false;
		(void)grew;
#pragma unroll
		for (int r = 0; r < SRT; r++) {
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
#if PAIR == 2
				float mx = fmaxf(mrow[r][hh], mxp[r][hh]);
#else
				float mx = mrow[r][hh];
#pragma unroll
				for (int n = 0; n < SNJ; n++)
					mx = fmaxf(mx, fmaxf(s[r][n][2 * hh], s[r][n][2 * hh + 1]));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
				mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
#endif
				const float mo = mrow[r][hh];
#if RTHR > 0
				/* P = 2^(s sl - m sl) <= 2^RTHR with the kept max: exact in fp32 and bf16
				 * alike, and O's rescale is skipped in most steps */
				if (mx <= mo + rthr)
					mx = mo;
#endif
				grew |= mx != mo;
				const float ms = mx == NEG_INF ? 0.f : __fmul_rn(mx, sl);
				alpha[r][hh] = fast_exp2(__fmul_rn(mo, sl) - ms);
				mrow[r][hh] = mx;
				float sum = 0.f;
#pragma unroll
				for (int n = 0; n < SNJ; n++) {
					s[r][n][2 * hh] = fast_exp2(fmaf(s[r][n][2 * hh], sl, -ms));
					s[r][n][2 * hh + 1] = fast_exp2(fmaf(s[r][n][2 * hh + 1], sl, -ms));
					sum += s[r][n][2 * hh] + s[r][n][2 * hh + 1];
				}
				lrow[r][hh] = lrow[r][hh] * alpha[r][hh] + sum;
#if !FA_SKIP_RESCALE
#pragma unroll
				for (int n = 0; n < ONDW; n++) {
					acc[r][n][2 * hh] *= alpha[r][hh];
					acc[r][n][2 * hh + 1] *= alpha[r][hh];
				}
#endif
			}
		}
#if FA_SKIP_RESCALE
		if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
			for (int r = 0; r < SRT; r++)
#pragma unroll
				for (int n = 0; n < ONDW; n++) {
					acc[r][n][0] *= alpha[r][0];
					acc[r][n][1] *= alpha[r][0];
					acc[r][n][2] *= alpha[r][1];
					acc[r][n][3] *= alpha[r][1];
				}
		}
#endif

#endif
#if PAIR
		/* This warp's P, packed, to the partner (A-fragment order: one 16-byte store per lane
		 * and k16 slice); PAIR 1 also sends its rows' rescale factors. The mid-step barrier
		 * below publishes them; the barrier at the top of the next step frees the buffer. */
		u32 pw[SRT][SNJ / 2][4];
#pragma unroll
		for (int r = 0; r < SRT; r++)
#pragma unroll
			for (int kk = 0; kk < SNJ / 2; kk++) {
				pw[r][kk][0] = pack_in(s[r][2 * kk][0], s[r][2 * kk][1]);
				pw[r][kk][1] = pack_in(s[r][2 * kk][2], s[r][2 * kk][3]);
				pw[r][kk][2] = pack_in(s[r][2 * kk + 1][0], s[r][2 * kk + 1][1]);
				pw[r][kk][3] = pack_in(s[r][2 * kk + 1][2], s[r][2 * kk + 1][3]);
				xp_own[(r * (SNJ / 2) + kk) * 32] =
				    make_uint4(pw[r][kk][0], pw[r][kk][1], pw[r][kk][2], pw[r][kk][3]);
			}
#if PAIR == 1
		xr[warp * 32 + lane] = make_float4(alpha[0][0], alpha[0][1], 0.f, 0.f);
#endif
#endif

#if FA_STAGES == 1
		cp_async_wait<0>(); /* V_j has landed (this thread's part) */
		__syncthreads();    /* ... everyone's; K's buffer is free (Q K_j^T is done) */
		if (j + 1 < ntiles)
			LOAD_K(j + 1, 0);
		cp_async_commit();
		LOAD_NEXT(kgp, kts);
#elif !ONEBAR
		cp_async_wait<2 * FA_STAGES - 2>(); /* V_j has landed */
		__syncthreads();
#endif

		/* O += P V */
#if PAIR
		/* For the pair's two row tiles and this warp's half of the head dim: each V fragment
		 * feeds both. PAIR 1: k slices in order, this warp's P from registers and the
		 * partner's from shared memory (the partner's rows rescaled by its factors first).
		 * PAIR 2: this warp's half of the keys from registers, then the partner's half. */
#if PAIR == 1
		{
			const float4 al = xr[(warp ^ 1) * 32 + lane];
#pragma unroll
			for (int n = 0; n < ONDW; n++) {
				acc[1][n][0] *= al.x;
				acc[1][n][1] *= al.x;
				acc[1][n][2] *= al.y;
				acc[1][n][3] *= al.y;
			}
		}
#endif
#pragma unroll
		for (int half = 0; half < (PAIR == 2 ? 2 : 1); half++)
#pragma unroll
			for (int kk = 0; kk < (PAIR == 2 ? FA_BC / 32 : FA_BC / 16); kk++) {
				u32 a[ORT][4];
				int vrow;
				if (PAIR == 1) {
					const uint4 x = xp_par[kk * 32];
					a[0][0] = pw[0][kk][0];
					a[0][1] = pw[0][kk][1];
					a[0][2] = pw[0][kk][2];
					a[0][3] = pw[0][kk][3];
					a[1][0] = x.x;
					a[1][1] = x.y;
					a[1][2] = x.z;
					a[1][3] = x.w;
					vrow = kk * 16;
				} else {
#pragma unroll
					for (int r = 0; r < ORT; r++) {
						if (half == 0) {
							a[r][0] = pw[r % SRT][kk % (SNJ / 2)][0];
							a[r][1] = pw[r % SRT][kk % (SNJ / 2)][1];
							a[r][2] = pw[r % SRT][kk % (SNJ / 2)][2];
							a[r][3] = pw[r % SRT][kk % (SNJ / 2)][3];
						} else {
							const uint4 x = xp_par[(r * (SNJ / 2) + kk) * 32];
							a[r][0] = x.x;
							a[r][1] = x.y;
							a[r][2] = x.z;
							a[r][3] = x.w;
						}
					}
					vrow = (half == 0 ? kbase : kbase ^ (FA_BC / 2)) + kk * 16;
				}
#pragma unroll
				for (int n = 0; n < ONDW; n += 2) {
					u32 b0, b1, b2, b3;
#if SADDR
					ldsm_x4_t(b0, b1, b2, b3, va + (vrow * LDV + n * 8) * ES);
#else
					ldsm_x4_t(b0, b1, b2, b3,
					          smem_u32(cV + (vrow + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDV +
					                   ocol + n * 8 + (lane >> 4) * 8));
#endif
#pragma unroll
					for (int r = 0; r < ORT; r++) {
						mma16(acc[r][n], a[r], b0, b1);
						mma16(acc[r][n + 1], a[r], b2, b3);
					}
				}
			}
#elif FA_IN != 3
#pragma unroll
		for (int kk = 0; kk < FA_BC / 16; kk++) {
			u32 a[FA_RT][4];
#pragma unroll
			for (int r = 0; r < FA_RT; r++) {
				a[r][0] = pack_in(s[r][2 * kk][0], s[r][2 * kk][1]);
				a[r][1] = pack_in(s[r][2 * kk][2], s[r][2 * kk][3]);
				a[r][2] = pack_in(s[r][2 * kk + 1][0], s[r][2 * kk + 1][1]);
				a[r][3] = pack_in(s[r][2 * kk + 1][2], s[r][2 * kk + 1][3]);
			}
#pragma unroll
			for (int n = 0; n < ND; n += 2) {
				u32 b0, b1, b2, b3;
#if SADDR
				ldsm_x4_t(b0, b1, b2, b3, va + (kk * 16 * LDV + n * 8) * ES);
#else
				ldsm_x4_t(b0, b1, b2, b3,
				          smem_u32(cV + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDV +
				                   n * 8 + (lane >> 4) * 8));
#endif
#pragma unroll
				for (int r = 0; r < FA_RT; r++) {
					mma16(acc[r][n], a[r], b0, b1);
					mma16(acc[r][n + 1], a[r], b2, b3);
				}
			}
		}
#elif FA_PREC != 2
		/* ieee, and tf32 (whose 2e-3 tolerance does not notice the tensor cores' truncating
		 * accumulation): P V chained straight into O. */
#pragma unroll
		for (int kk = 0; kk < NJ; kk++) {
			op32 a[FA_RT][4];
#pragma unroll
			for (int r = 0; r < FA_RT; r++) {
				a[r][0] = make_op(s[r][kk][0]);
				a[r][1] = make_op(s[r][kk][2]);
				a[r][2] = make_op(s[r][kk][1]);
				a[r][3] = make_op(s[r][kk][3]);
			}
#pragma unroll
			for (int n = 0; n < ND; n++) {
				op32 b0 = make_op(cV[(kk * 8 + 2 * t) * LDV + n * 8 + g]);
				op32 b1 = make_op(cV[(kk * 8 + 2 * t + 1) * LDV + n * 8 + g]);
#pragma unroll
				for (int r = 0; r < FA_RT; r++)
					mma32(acc[r][n], a[r], b0, b1);
			}
		}
#else
		/* Tensor cores add fp32 partial sums with truncation: chained over thousands of keys
		 * that bias reaches 3e-5 relative (seen at Sk = 4097). So each step's P V is summed on
		 * the tensor cores from zero (BC/8 chained mma) and added to O with an IEEE add. */
		{
			op32 a[FA_RT][NJ][4];
#pragma unroll
			for (int r = 0; r < FA_RT; r++)
#pragma unroll
				for (int kk = 0; kk < NJ; kk++) {
					a[r][kk][0] = make_op(s[r][kk][0]);
					a[r][kk][1] = make_op(s[r][kk][2]);
					a[r][kk][2] = make_op(s[r][kk][1]);
					a[r][kk][3] = make_op(s[r][kk][3]);
				}
#pragma unroll
			for (int n = 0; n < ND; n++) {
				float part[FA_RT][4];
#pragma unroll
				for (int r = 0; r < FA_RT; r++)
					part[r][0] = part[r][1] = part[r][2] = part[r][3] = 0.f;
#pragma unroll
				for (int kk = 0; kk < NJ; kk++) {
					op32 b0 = make_op(cV[(kk * 8 + 2 * t) * LDV + n * 8 + g]);
					op32 b1 = make_op(cV[(kk * 8 + 2 * t + 1) * LDV + n * 8 + g]);
#pragma unroll
					for (int r = 0; r < FA_RT; r++)
						mma32(part[r], a[r][kk], b0, b1);
				}
#pragma unroll
				for (int r = 0; r < FA_RT; r++)
#pragma unroll
					for (int e = 0; e < 4; e++)
						acc[r][n][e] += part[r][e];
			}
		}
#endif
	}
	cp_async_wait<0>();

#if PAIR
	/* Epilogue of a pair: the row sums quad-reduced, then PAIR 1 takes the sums of the partner's
	 * rows and PAIR 2 adds the partner's partial sums (its half of the keys); O /= l on this
	 * warp's half of the head dim for both row tiles, lse by the warp that owns the row. */
	{
		float lq[SRT][2];
#pragma unroll
		for (int r = 0; r < SRT; r++)
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				float l = lrow[r][hh];
				l += __shfl_xor_sync(0xffffffffu, l, 1);
				l += __shfl_xor_sync(0xffffffffu, l, 2);
				lq[r][hh] = l;
			}
		__syncthreads(); /* the partner has read the last step's P */
		xl[warp * 32 + lane] = make_float4(lq[0][0], lq[0][1], lq[SRT - 1][0], lq[SRT - 1][1]);
		__syncthreads();
		const float4 o = xl[(warp ^ 1) * 32 + lane];
		float lt[ORT][2], mt[ORT][2];
		if (PAIR == 1) {
			lt[0][0] = lq[0][0];
			lt[0][1] = lq[0][1];
			lt[1][0] = o.x;
			lt[1][1] = o.y;
		} else {
			lt[0][0] = lq[0][0] + o.x;
			lt[0][1] = lq[0][1] + o.y;
			lt[1][0] = lq[SRT - 1][0] + o.z;
			lt[1][1] = lq[SRT - 1][1] + o.w;
		}
#pragma unroll
		for (int r = 0; r < ORT; r++) {
			mt[r][0] = mrow[r % SRT][0];
			mt[r][1] = mrow[r % SRT][1];
		}
#pragma unroll
		for (int r = 0; r < ORT; r++) {
#pragma unroll
			for (int hh = 0; hh < 2; hh++) {
				const float l = lt[r][hh];
				const float inv = l > 0.f ? 1.f / l : 0.f;
				const int rbase = PAIR == 1 ? (r == 0 ? wrow : wrow ^ 16) : srow + r * 16;
				const int row = q0 + rbase + g + hh * 8;
				if (row >= p.Sq)
					continue;
				const bool own = PAIR == 1 ? r == 0 : r == ph;
				if (p.lse && t == 0 && own)
					p.lse[b * p.ls[0] + h * p.ls[1] + row * p.ls[2]] =
					    l > 0.f ? (mt[r][hh] * sl + fast_log2(l)) * 0.69314718055994531f : NEG_INF;
				const long long ob = b * p.os[0] + h * p.os[2] + (long long)row * p.os[1];
#pragma unroll
				for (int n = 0; n < ONDW; n++) {
					const int col = ocol + n * 8 + 2 * t;
					if (col >= FA_D)
						continue;
					const float x0 = acc[r][n][2 * hh] * inv, x1 = acc[r][n][2 * hh + 1] * inv;
#if FA_OUT == 3
					*(float2 *)((float *)p.o + ob + col) = make_float2(x0, x1);
#elif FA_OUT == 2
					*(u32 *)((u16 *)p.o + ob + col) = pack_bf16(x0, x1);
#else
					*(u32 *)((u16 *)p.o + ob + col) = pack_f16(x0, x1);
#endif
				}
			}
		}
	}
#else
	/* Epilogue: O /= l, logsumexp = (m + log2 l) ln 2. */
#pragma unroll
	for (int r = 0; r < FA_RT; r++) {
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
			float l = lrow[r][hh];
			l += __shfl_xor_sync(0xffffffffu, l, 1);
			l += __shfl_xor_sync(0xffffffffu, l, 2);
			const float inv = l > 0.f ? 1.f / l : 0.f;
			const int row = q0 + wrow + r * 16 + g + hh * 8;
			if (row >= p.Sq)
				continue;
			if (p.lse && t == 0)
				p.lse[b * p.ls[0] + h * p.ls[1] + row * p.ls[2]] =
				    l > 0.f ? (mrow[r][hh] * sl + fast_log2(l)) * 0.69314718055994531f : NEG_INF;
			const long long ob = b * p.os[0] + h * p.os[2] + (long long)row * p.os[1];
#pragma unroll
			for (int n = 0; n < ND; n++) {
				const int col = n * 8 + 2 * t;
				if (col >= FA_D)
					continue;
				const float x0 = acc[r][n][2 * hh] * inv, x1 = acc[r][n][2 * hh + 1] * inv;
#if FA_OUT == 3
				*(float2 *)((float *)p.o + ob + col) = make_float2(x0, x1);
#elif FA_OUT == 2
				*(u32 *)((u16 *)p.o + ob + col) = pack_bf16(x0, x1);
#else
				*(u32 *)((u16 *)p.o + ob + col) = pack_f16(x0, x1);
#endif
			}
		}
	}
#endif
}

/* fp32 [B, S, H, D] (strided, head dim contiguous) -> dense bf16 [B, S, H, D]: the staging step
 * of the fp32 "bf16" precision for K and V with gaps between their rows (and for all three
 * under FA_BF16_STAGE=v5, gpu_cuda.c). Four elements per thread. */
extern "C" __global__ void fa_cvt_f32_bf16(const float *src, long long sb, long long ss,
                                           long long sh, int S, int H, int D, u16 *dst,
                                           long long nquads)
{
	const int qpr = D / 4;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nquads;
	     i += (long long)gridDim.x * blockDim.x) {
		long long row = i / qpr;
		int c = (int)(i - row * qpr) * 4;
		int hh = (int)(row % H);
		long long bs = row / H;
		int ss_ = (int)(bs % S);
		long long bb = bs / S;
		float4 x = *(const float4 *)(src + bb * sb + ss_ * ss + hh * sh + c);
		uint2 y;
		y.x = pack_bf16(x.x, x.y);
		y.y = pack_bf16(x.z, x.w);
		*(uint2 *)(dst + row * D + c) = y;
	}
}

/* The staging of K and V (blockIdx.y 0 and 1) that fill their ranges (BSHD, BHSD, any order
 * without gaps): one flat pass each, so the bf16 copy keeps the source's strides. Eight
 * elements per thread and step, two 16-byte loads (evict-first: read once) and one 16-byte
 * store; no index arithmetic: 98% of a device copy's bandwidth on the H200 (PERF-NOTES.md, "v6:
 * bf16 staging"). n8 = elements / 8. */
extern "C" __global__ void fa_cvt_f32_bf16_flat(const float4 *k, uint4 *kd, const float4 *v,
                                                uint4 *vd, long long n8)
{
	const float4 *src = blockIdx.y ? v : k;
	uint4 *dst = blockIdx.y ? vd : kd;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8;
	     i += (long long)gridDim.x * blockDim.x) {
		float4 a, b;
		asm("ld.global.cs.v4.f32 {%0,%1,%2,%3}, [%4];"
		    : "=f"(a.x), "=f"(a.y), "=f"(a.z), "=f"(a.w) : "l"(src + 2 * i));
		asm("ld.global.cs.v4.f32 {%0,%1,%2,%3}, [%4];"
		    : "=f"(b.x), "=f"(b.y), "=f"(b.z), "=f"(b.w) : "l"(src + 2 * i + 1));
		dst[i] = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y),
		                    pack_bf16(b.z, b.w));
	}
}
