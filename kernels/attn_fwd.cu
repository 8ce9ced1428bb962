/* attn_fwd.cu - FlashAttention-2 style forward kernel, compiled at run time by NVRTC.
 *
 * No system headers (NVRTC has none here): the one #include is fa_device.cuh, the device helpers
 * both kernels share, which the host hands to NVRTC as a header. The host (kernels/gpu_cuda.c)
 * embeds this file as the C string fa_src_attn_fwd and specialises it with -D options:
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
 *              the host converts only K and V (before the first K/V tiles are issued: v5's main
 *              loop, instruction for instruction)
 *   FA_WIN     1: a sliding window (fa_attn.h), the mask folded into it by the host: key j is
 *              visible to query i iff win_lo <= j - i <= win_hi (runtime parameters); a block
 *              walks only the key tiles its rows see and masks element-wise only on the
 *              tiles its window's edges cross. 0 (default): FA_MASK alone, the code unchanged.
 *              With FA_LAYOUT the host passes the window's sides instead (win_lo = window_left,
 *              win_hi = window_right, negative: unbounded) and each block resolves its own
 *              sequence's range (fa_seq_window: the diagonal and the sides' bounds are per
 *              sequence); a paged block's ring then starts at its first window tile too
 *   FA_SOFTCAP 1: logit softcapping, s -> cap tanh(s / cap) on the scaled score before the
 *              mask (cap a runtime parameter); the scores then live in the log2 domain with
 *              unit scale, so the P = ex2(fma(s, scale log2 e, -m)) fold becomes ex2(s - m)
 *              in this specialisation only. 0 (default): unchanged
 *   FA_LAYOUT  0 (default) one dense batch; 1 sequences of their own lengths (the inference
 *              layouts of fa_attn_infer.h: packed queries or dense ones, packed keys or a
 *              contiguous cache with per-sequence lengths), 2 the same with the keys in a paged
 *              cache. With a layout the kernel takes a second parameter, struct fa_lparams
 *              (the device copies of the index tables); the grid's x covers the longest
 *              sequence and blocks past their own sequence's queries exit. Layout 0 compiles to
 *              the code it always did (no fa_lparams, no lookups).
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
 *
 * Stages (as llama.cpp's fattn-mma-f16.cuh): the kernel at the bottom is the loop; each step
 * calls load_kv_step (the next K/V tiles into the ring), qk_* (S = Q K^T), mask_scores,
 * online_softmax (row max, P, row sum, O's rescale), pv_* (O += P V), and epilogue_* writes O
 * and the logsumexp. Every stage is __forceinline__: the split changes no instruction (SASS
 * compared per specialisation, tools/sass-dump.c). The speed experiments that chose what is
 * here (FA_ONEBAR, FA_SADDR, FA_RTHR, ...: PERF-NOTES.md v1-v6) were retired from this file;
 * kernels/dev/ keeps the source with every switch.
 * The Hopper kernel (sm_90a, wgmma) is attn_fwd_sm90.cu, chosen per tile by the host.
 */

#include "fa_device.cuh"

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
	/* FA_WIN: key j visible to query i iff win_lo <= j - i <= win_hi (clamped by the host to
	 * [-Sq - 1, Sk + 1]; with FA_LAYOUT the window's left and right sides, resolved per
	 * sequence by the kernel); FA_SOFTCAP: |scale| / cap and cap log2(e). Unused otherwise. */
	int win_lo, win_hi;
	float scale_cap, cap_log2;
};

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
#ifndef FA_WIN
#define FA_WIN 0
#endif
#ifndef FA_SOFTCAP
#define FA_SOFTCAP 0
#endif
#ifndef FA_LAYOUT
#define FA_LAYOUT 0
#endif
#define PAGED (FA_LAYOUT == 2)
#if PAGED && FA_STAGES < 2
#error "FA_LAYOUT 2 (paged) needs FA_STAGES >= 2: its row table is written a step ahead"
#endif

#if FA_LAYOUT
/* The second kernel parameter of the inference layouts; mirrored by struct fa_lparams in
 * gpu_fwd_infer.c (same order, same types). Device copies of checked index tables: every
 * offset and page index is within its tensor (fa_attn_infer_check ran on the host copy). */
struct fa_lparams {
	const int *cu_q;       /* [B + 1]: sequence b's queries are rows [cu_q[b], cu_q[b+1]) of a
	                        * packed Q, O and lse; NULL: dense queries, Sq each */
	const int *cu_k;       /* [B + 1]: packed keys, rows [cu_k[b], cu_k[b+1]); NULL: a cache */
	const int *seqlens_k;  /* [B]: keys of each sequence in the cache (cu_k NULL) */
	const int *page_table; /* [B][pt_cols] (FA_LAYOUT 2): key j of sequence b is row
	                        * j % page_size of page page_table[b][j / page_size] */
	long long pt_cols;
	int page_size;         /* 16 .. 256 tokens, any size */
	unsigned page_magic;   /* floor((2^32 - 1) / page_size): j / page_size by one multiply */
};
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
/* Where the measured choices apply (PERF-NOTES.md v2, v4, v5; the fp32 kernels stay as measured
 * in v3):
 *   LD_FAST       whole K/V tiles by per-thread pointers fixed before the loop (one 64-bit add
 *                 per 16-byte copy, no predicates), the general loader for tails, where the
 *                 threads tile the chunks of a row evenly (padded D 16, 32, 64, 128, 256; +10%
 *                 d64, +4-6% d128, +2% d256); never for a paged cache, whose rows are not
 *                 evenly spaced (load_tile_paged looks each one up)
 *   QREG          Q's A fragments loaded once into registers where they take at most 32
 *                 registers (padded D x row tiles <= 128; +3.8% d64)
 *   SKIP_RESCALE  O's rescale skipped in steps where no row max of the warp grew: +2% at d128
 *                 128x64 w4r2, -7% at d64 w4r2 and d256 w8r1; fp32: the FMULs are cheap next to
 *                 3 MMAs and the registers are not */
#define LD_FAST (FA_IN != 3 && NT % LD_CPR == 0 && (FA_BC * LD_CPR) % NT == 0 && !PAGED)
#define QREG (FA_IN != 3 && FA_RT * DP <= 128)
#define SKIP_RESCALE (FA_IN != 3 && FA_RT == 2 && DP == 128)

/* Warp pairs (kernels/PERF-NOTES.md v5): with one row tile per warp, every K and V fragment read
 * from shared memory feeds one row tile only (144 ldmatrix per 256 MMA at d256). The two warps of
 * a pair share their 32 rows: each computes S for both row tiles and half the keys (each K
 * fragment feeds two row tiles), the row maxima exchanged first (a 64-thread barrier), and O for
 * both row tiles and half the head dim (each V fragment feeds two row tiles); P goes to the
 * partner through shared memory (16 bytes per lane and k16 slice, written before the mid-step
 * barrier the V tile needs anyway); the row sums are per-warp partial sums added at the end.
 * ldmatrix per 256 MMA 144 -> 96 (+8). On where it was measured faster and tested on a GPU:
 * head dim 256 exactly, 64 keys, 8 warps (+2.7%, 294.5 vs 286.8 TFLOP/s; d248 pads to the same
 * tile but never ran paired). The planner reserves the exchange buffer for exactly these tiles
 * (fa_tile_smem, planner.c: pair_on); its ldmatrix addresses are a per-thread byte base plus
 * constants (with the general addressing the pairs spill). */
#define PAIR_OK (FA_IN != 3 && FA_RT == 1 && FA_STAGES >= 2 && DP % 32 == 0 && DP > 128)
#define PAIR (PAIR_OK && FA_D == 256 && FA_BC == 64 && FA_NW == 8)
#if PAIR
#define SRT 2         /* row tiles of S per warp */
#define SNJ (NJ / 2)  /* n8 key tiles of S per warp */
#define ORT 2         /* row tiles of O per warp */
#define ONDW (ND / 2) /* n8 tiles of O per warp */
#else
#define SRT FA_RT
#define SNJ NJ
#define ORT FA_RT
#define ONDW ND
#endif
/* Exchange buffer after the K/V ring (bytes): P in A-fragment order (16 B per lane, row tile
 * and k16 slice: NW * BC * 32; the epilogue's row sums reuse it), per-lane row maxima (NW *
 * 512). Mirrored by fa_tile_smem in planner.c. */
#define SMEM_XP (FA_NW * FA_BC * 32)
#define SMEM_XR (FA_NW * 512)

/* Q read as fp32 and converted in the prologue (FA_QIN 3, 16-bit path): Q is read once per
 * block, so the conversion costs the block a few hundred instructions, against a pass of 6 bytes
 * per element over the whole tensor on the host's side. */
#ifndef FA_QIN
#define FA_QIN FA_IN
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

#if PAGED
/* The index tables reach the stages as the kernel's parameter itself (a reference to it reads
 * the parameter space where used, as p does): copies in registers cost the tight tiles spills. */
#define PAGES_ARG , const fa_lparams &L
#define PAGES_PASS , L

/* Key j's page slot and row inside the page: slot = j / page_size by one multiply-high (magic
 * = floor((2^32 - 1) / size) is at most one short for j < 2^32) and one correction. */
__device__ __forceinline__ unsigned page_slot(const fa_lparams &L, unsigned j, unsigned &row)
{
	const unsigned size = (unsigned)L.page_size;
	unsigned slot = __umulhi(j, L.page_magic);
	row = j - slot * size;
	if (row >= size) {
		slot++;
		row -= size;
	}
	return slot;
}

/* This block's sequence's row of the page table. */
__device__ __forceinline__ const int *page_row(const fa_lparams &L)
{
	return L.page_table + (long long)blockIdx.z * L.pt_cols;
}

/* Keys kv0 .. kv0 + NROWS - 1 of a paged K or V (g: this head's element 0 of page 0; ps and rs
 * the page and row strides in elements) into shared memory with row stride LD, rows >= valid
 * and the head-dim padding zero-filled; each row looked up (a tile of 64-128 keys spans several
 * pages of 16). The prologue's tiles; the loop's read the row table (load_tile_ptab). Only rows
 * below valid read the page table: the host checked exactly those entries. */
template <int NROWS, int LD>
__device__ __forceinline__ void load_tile_paged(in_t *s, const in_t *g, long long ps, long long rs,
                                                const fa_lparams &L, int kv0, int valid)
{
	const int CPR = (DP + CPE - 1) / CPE;
	const int TOTAL = NROWS * CPR;
	const int *pt = page_row(L);
#pragma unroll
	for (int it = 0; it < (TOTAL + NT - 1) / NT; it++) {
		int i = it * NT + (int)threadIdx.x;
		if (TOTAL % NT == 0 || i < TOTAL) {
			int r = i / CPR, c = i - r * CPR;
			bool ok = r < valid && c * CPE < FA_D;
			const in_t *src = g;
			if (ok) {
				unsigned row;
				const unsigned slot = page_slot(L, (unsigned)(kv0 + r), row);
				src = g + (long long)__ldg(pt + slot) * ps + (long long)row * rs + c * CPE;
			}
			cp_async16(smem_u32(s + r * LD + c * CPE), src, ok ? 16 : 0);
		}
	}
}

/* The row table: the element offsets of each key's row in K and V for two tiles ([tile & 1][K,
 * V][FA_BC]), written a step before the tile is issued. Bytes after the ring and the pairs'
 * exchange buffer; mirrored by fa_klayout_smem in fa_gpu.h. */
#define PTAB_AT ((SMEM_Q + FA_STAGES * (SMEM_K + SMEM_V)) * ES + (PAIR ? SMEM_XP + SMEM_XR : 0))
#define PTAB_BYTES (2 * 2 * FA_BC * 8)
__device__ __forceinline__ long long *ptab_base(void)
{
	extern __shared__ __align__(16) unsigned char smem_raw[];
	return (long long *)(smem_raw + PTAB_AT);
}
#else
#define PAGES_ARG
#define PAGES_PASS
#endif

#if PAGED
/* A whole or tail tile of a paged K or V whose rows' element offsets (from g) the row table
 * holds: the general loader with one shared-memory read per row instead of a stride. */
template <int NROWS, int LD>
__device__ __forceinline__ void load_tile_ptab(in_t *s, const in_t *g, const long long *rows,
                                               int valid)
{
	const int CPR = (DP + CPE - 1) / CPE;
	const int TOTAL = NROWS * CPR;
#pragma unroll
	for (int it = 0; it < (TOTAL + NT - 1) / NT; it++) {
		int i = it * NT + (int)threadIdx.x;
		if (TOTAL % NT == 0 || i < TOTAL) {
			int r = i / CPR, c = i - r * CPR;
			bool ok = r < valid && c * CPE < FA_D;
			const in_t *src = ok ? g + rows[r] + c * CPE : g;
			cp_async16(smem_u32(s + r * LD + c * CPE), src, ok ? 16 : 0);
		}
	}
}
#endif

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
/* volatile: a plain asm gave the same SASS (PERF-NOTES.md v4) */
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
/* The 64 threads of warps 2i and 2i+1 (the pairs): named barrier 1 + i. */
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
#else
	/* 3xtf32: big = x truncated to tf32 (exact), small = x - big (exact in fp32, |small| <
	 * 2^-10 |x|) rounded to tf32 as above: three instructions instead of about twelve (two
	 * cvt.rna, PERF-NOTES.md v1). */
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

/* This thread's lane, derived here rather than passed: the stages see what the kernel knows of
 * it (below 32), so their address arithmetic folds as it did when it was written inline. */
__device__ __forceinline__ int lane_id(void)
{
	return (int)threadIdx.x & 31;
}

/* ---------------------------------------------------------------------------------------------
 * Stage: loads. The K/V ring and where this thread's copies go. */
struct kv_ring {
	in_t *sK, *sV;              /* FA_STAGES buffers each */
	const in_t *Kg, *Vg;        /* this (batch, kv head): key 0 (FA_WIN: key kvs; paged: page 0) */
#if FA_WIN
	int kvs; /* the first key of the block's window tiles (a multiple of FA_BC) */
#endif
#if PAGED
	/* this thread's page of the row-table entry it writes next: looked up at the top of a
	 * step and stored in the middle (ptab_fetch, ptab_store), so the load's latency hides
	 * behind Q K^T */
	int tpage;
#endif
#if LD_FAST
	/* This thread's chunk of every K/V tile: row lr0 (+ RSTEP i), column lcc; a padding
	 * column (lcc >= D) zero-fills from column 0's address. Pointers to tile STAGES-1,
	 * advanced one tile per step. */
	int lbytes;
	u32 sK0, sV0;
	long long krs, vrs, kts, vts;
	const char *kgp, *vgp;
#endif
};

#if PAGED
/* The first key of the ring's tile 0 (FA_WIN: the block's first window tile), to which the
 * ring's tile numbers are relative; page lookups take absolute keys. */
__device__ __forceinline__ int ring_key0(const kv_ring &r)
{
#if FA_WIN
	return r.kvs;
#else
	(void)r;
	return 0;
#endif
}
/* Thread tid < FA_BC looks up the page of its key of tile jt (keys past Sk read nothing). */
__device__ __forceinline__ void ptab_fetch(kv_ring &r, const fa_kparams &p, const fa_lparams &L,
                                           int jt)
{
	const int tid = (int)threadIdx.x, key = ring_key0(r) + jt * FA_BC + tid;
	if (tid < FA_BC && key < p.Sk) {
		unsigned row;
		r.tpage = __ldg(page_row(L) + page_slot(L, (unsigned)key, row));
	}
}
/* ... and stores its row's offsets into tile jt's slot; a barrier before the loaders read it. */
__device__ __forceinline__ void ptab_store(const kv_ring &r, const fa_kparams &p,
                                           const fa_lparams &L, int jt)
{
	const int tid = (int)threadIdx.x, key = ring_key0(r) + jt * FA_BC + tid;
	if (tid < FA_BC && key < p.Sk) {
		unsigned row;
		page_slot(L, (unsigned)key, row);
		long long *t = ptab_base() + (jt & 1) * 2 * FA_BC;
		t[tid] = (long long)r.tpage * p.ks[0] + (long long)row * p.ks[1];
		t[FA_BC + tid] = (long long)r.tpage * p.vs[0] + (long long)row * p.vs[1];
	}
}
#endif

/* After the prologue (the fast loader's first tile is STAGES-1). The parameters (lengths,
 * strides) are read where they are used: copies of them in the ring would move the parameter
 * loads, and with them the code generated. */
__device__ __forceinline__ void kv_ring_init(kv_ring &r, in_t *sK, in_t *sV, const in_t *Kg,
                                             const in_t *Vg, const fa_kparams &p,
                                             int tid PAGES_ARG)
{
	r.sK = sK;
	r.sV = sV;
	r.Kg = Kg;
	r.Vg = Vg;
#if PAGED
	/* tile STAGES-1's rows, the first the loop issues: the barrier at the top of step 0
	 * publishes them */
	r.tpage = 0;
	ptab_fetch(r, p, L, FA_STAGES - 1);
	ptab_store(r, p, L, FA_STAGES - 1);
#endif
#if LD_FAST
	const int lr0 = tid / LD_CPR, lcc = (tid % LD_CPR) * CPE;
	const int lcol = lcc < FA_D ? lcc : 0;
	r.lbytes = lcc < FA_D ? 16 : 0;
	r.sK0 = smem_u32(sK + lr0 * LDK + lcc);
	r.sV0 = smem_u32(sV + lr0 * LDV + lcc);
	r.krs = (long long)LD_RSTEP * p.ks[1] * ES;
	r.vrs = (long long)LD_RSTEP * p.vs[1] * ES;
	r.kts = (long long)FA_BC * p.ks[1] * ES;
	r.vts = (long long)FA_BC * p.vs[1] * ES;
	r.kgp = (const char *)(Kg + lr0 * p.ks[1] + lcol) + (FA_STAGES == 1 ? 1 : FA_STAGES - 1) * r.kts;
	r.vgp = (const char *)(Vg + lr0 * p.vs[1] + lcol) + (FA_STAGES - 1) * r.vts;
#else
	(void)p;
	(void)tid;
#endif
}

/* The keys from the ring's key 0 to the end of the sequence (FA_WIN: the ring starts at the
 * block's first window tile). */
__device__ __forceinline__ int ring_keys(const kv_ring &r, const fa_kparams &p)
{
#if FA_WIN
	return p.Sk - r.kvs;
#else
	(void)r;
	return p.Sk;
#endif
}

/* Tile jn of K or V into ring buffer `buf` (the fast loader when the tile is whole: its
 * pointer, kgp or vgp, must point at tile jn). */
__device__ __forceinline__ void load_k(const kv_ring &r, const fa_kparams &p, int jn, int buf)
{
#if PAGED
	load_tile_ptab<FA_BC, LDK>(r.sK + buf * SMEM_K, r.Kg,
	                           ptab_base() + (jn & 1) * 2 * FA_BC, ring_keys(r, p) - jn * FA_BC);
#else
#if LD_FAST
	if (ring_keys(r, p) - jn * FA_BC >= FA_BC)
		load_tile_fast<FA_BC, LDK>(r.sK0 + buf * (SMEM_K * ES), r.kgp, r.krs, r.lbytes);
	else
#endif
		load_tile<FA_BC, LDK>(r.sK + buf * SMEM_K, r.Kg + (long long)jn * FA_BC * p.ks[1],
		                      p.ks[1], ring_keys(r, p) - jn * FA_BC);
#endif
}
__device__ __forceinline__ void load_v(const kv_ring &r, const fa_kparams &p, int jn, int buf)
{
#if PAGED
	load_tile_ptab<FA_BC, LDV>(r.sV + buf * SMEM_V, r.Vg,
	                           ptab_base() + (jn & 1) * 2 * FA_BC + FA_BC,
	                           ring_keys(r, p) - jn * FA_BC);
#else
#if LD_FAST
	if (ring_keys(r, p) - jn * FA_BC >= FA_BC)
		load_tile_fast<FA_BC, LDV>(r.sV0 + buf * (SMEM_V * ES), r.vgp, r.vrs, r.lbytes);
	else
#endif
		load_tile<FA_BC, LDV>(r.sV + buf * SMEM_V, r.Vg + (long long)jn * FA_BC * p.vs[1],
		                      p.vs[1], ring_keys(r, p) - jn * FA_BC);
#endif
}
/* The fast loader's pointers to the next tile. */
__device__ __forceinline__ void next_k(kv_ring &r)
{
#if LD_FAST
	r.kgp += r.kts;
#else
	(void)r;
#endif
}
__device__ __forceinline__ void next_v(kv_ring &r)
{
#if LD_FAST
	r.vgp += r.vts;
#else
	(void)r;
#endif
}

/* Prologue: Q (converted from fp32 here, before the K/V tiles are issued, when QCVT), then
 * tiles 0 .. STAGES-2 (one commit group each for K and V). FA_WIN: Kg and Vg point at key kvs,
 * the block's first window tile (paged: at page 0, and the tiles' keys start at kvs). */
__device__ __forceinline__ int keys_from(const fa_kparams &p, int kvs)
{
#if FA_WIN
	return p.Sk - kvs;
#else
	(void)kvs;
	return p.Sk;
#endif
}
__device__ __forceinline__ void load_prologue(const fa_kparams &p, in_t *sQ, in_t *sK, in_t *sV,
                                              const qin_t *Qg, const in_t *Kg, const in_t *Vg,
                                              int q0, int ntiles, int kvs PAGES_ARG)
{
#if QCVT
	load_q_f32(sQ, Qg, p.qs[1], p.Sq - q0);
#else
	load_tile<BR, LDQ>(sQ, Qg, p.qs[1], p.Sq - q0);
#endif
	cp_async_commit(); /* QCVT: an empty group, so that every wait below counts the same */
#pragma unroll
	for (int s = 0; s < FA_STAGES - 1; s++) {
#if PAGED
		if (s < ntiles)
			load_tile_paged<FA_BC, LDK>(sK + s * SMEM_K, Kg, p.ks[0], p.ks[1], L,
			                            kvs + s * FA_BC, keys_from(p, kvs) - s * FA_BC);
		cp_async_commit();
		if (s < ntiles)
			load_tile_paged<FA_BC, LDV>(sV + s * SMEM_V, Vg, p.vs[0], p.vs[1], L,
			                            kvs + s * FA_BC, keys_from(p, kvs) - s * FA_BC);
		cp_async_commit();
#else
		if (s < ntiles)
			load_tile<FA_BC, LDK>(sK + s * SMEM_K, Kg + (long long)s * FA_BC * p.ks[1],
			                      p.ks[1], keys_from(p, kvs) - s * FA_BC);
		cp_async_commit();
		if (s < ntiles)
			load_tile<FA_BC, LDV>(sV + s * SMEM_V, Vg + (long long)s * FA_BC * p.vs[1],
			                      p.vs[1], keys_from(p, kvs) - s * FA_BC);
		cp_async_commit();
#endif
	}
	if (FA_STAGES == 1) { /* one buffer each: K_0 now, V_j at the top of step j */
#if PAGED
		if (ntiles > 0)
			load_tile_paged<FA_BC, LDK>(sK, Kg, p.ks[0], p.ks[1], L, kvs, keys_from(p, kvs));
#else
		if (ntiles > 0)
			load_tile<FA_BC, LDK>(sK, Kg, p.ks[1], keys_from(p, kvs));
#endif
		cp_async_commit();
	}
}

/* The top of step j: wait for this step's tiles, then issue the next ones. */
__device__ __forceinline__ void load_kv_step(kv_ring &r, const fa_kparams &p, int j,
                                             int ntiles PAGES_ARG)
{
#if FA_STAGES == 1
	/* FlashAttention-2's single buffers: V_j is loaded while Q K_j^T and the softmax run,
	 * K_{j+1} while P V_j runs (load_k_mid) */
	cp_async_wait<0>(); /* Q and K_j have landed (this thread's part) */
	__syncthreads();    /* ... everyone's; V's buffer is free (P V_{j-1} is done) */
	load_v(r, p, j, 0);
	cp_async_commit();
	next_v(r);
#else
	cp_async_wait<2 * FA_STAGES - 3>(); /* Q and K_j have landed (this thread's part) */
	__syncthreads(); /* ... everyone's; buffer (j-1) is free */
	{
		const int jn = j + FA_STAGES - 1, bn = jn % FA_STAGES;
		if (jn < ntiles)
			load_k(r, p, jn, bn);
		cp_async_commit();
		if (jn < ntiles)
			load_v(r, p, jn, bn);
		cp_async_commit();
		next_k(r);
		next_v(r);
#if PAGED
		if (jn + 1 < ntiles)
			ptab_fetch(r, p, L, jn + 1);
#endif
	}
#endif
}

/* The middle of step j, between the softmax and P V: V_j must have landed. */
__device__ __forceinline__ void load_kv_mid(kv_ring &r, const fa_kparams &p, int j,
                                            int ntiles PAGES_ARG)
{
#if FA_STAGES == 1
	cp_async_wait<0>(); /* V_j has landed (this thread's part) */
	__syncthreads();    /* ... everyone's; K's buffer is free (Q K_j^T is done) */
	if (j + 1 < ntiles)
		load_k(r, p, j + 1, 0);
	cp_async_commit();
	next_k(r);
#else
	(void)r;
	(void)p;
	(void)j;
	(void)ntiles;
	cp_async_wait<2 * FA_STAGES - 2>(); /* V_j has landed */
	__syncthreads();
#if PAGED
	/* tile j + STAGES's rows into the slot of tile j + STAGES - 2, whose loads were issued
	 * before this barrier */
	if (j + FA_STAGES < ntiles)
		ptab_store(r, p, L, j + FA_STAGES);
#endif
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Stage: S = Q K^T for one key step. */
#if FA_IN != 3
/* 16-bit: k16 steps; Q's fragments from registers (QREG: qf) or shared memory, K's by ldmatrix
 * (the pairs: from per-thread byte bases qa0, ka plus constants). */
/* a: Q's fragments of one k step (without QREG). The arrays of a stage are the caller's, in the
 * order the kernel always declared them: the order of the locals steers the code generated. */
template <typename QF> /* QREG: u32[FA_RT][DP / 16][4]; else unused */
__device__ __forceinline__ void qk_16(float (&s)[SRT][SNJ][4], const QF &qf, u32 (&a)[SRT][4], const in_t *sQ, const in_t *cK, u32 qa0,
                                      u32 ka, int srow, int kbase)
{
	const int lane = lane_id();
#pragma unroll
	for (int kk = 0; kk < DP / 16; kk++) {
#if QREG
#define QFRAG(r) qf[r][kk]
		(void)a;
#else
#define QFRAG(r) a[r]
		(void)qf;
#pragma unroll
		for (int r = 0; r < SRT; r++)
#if PAIR
			ldsm_x4(a[r][0], a[r][1], a[r][2], a[r][3], qa0 + (r * 16 * LDQ + kk * 16) * ES);
#else
			ldsm_x4(a[r][0], a[r][1], a[r][2], a[r][3],
			        smem_u32(sQ + (srow + r * 16 + (lane & 15)) * LDQ + kk * 16 +
			                 (lane >> 4) * 8));
#endif
#endif
#pragma unroll
		for (int n = 0; n < SNJ; n += 2) {
			u32 b0, b1, b2, b3;
#if PAIR
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
}
#else
/* fp32: k8 steps (the k permutation of the head comment: 8-byte loads), operands in the
 * precision's form (make_op). */
__device__ __forceinline__ void qk_32(float (&s)[SRT][SNJ][4], op32 (&a)[FA_RT][4], const in_t *sQ,
                                      const in_t *cK, int wrow, int g, int t)
{
#if FA_PREC == 2
	/* 3xtf32: the two small cross products chained in their own accumulator cs, added at the
	 * end: the tensor cores truncate as they accumulate, and the three products of every k
	 * step chained in s biased S toward zero by 3 D / 8 truncations (the lse by -1.35e-6 at D
	 * = 256: 2.0x SDPA's dV error); with cs the big products' chain is a third as long
	 * (-7e-7, 1.23x). Starting each k step's big product from zero as well (attn_bwd.cu's
	 * FA_X3SPLIT 1) measured -4e-7 but 8.6% slower at D = 192 (PERF-NOTES.md, "the 3xtf32
	 * forward's lse"). */
	float cs[FA_RT][NJ][4];
#pragma unroll
	for (int r = 0; r < FA_RT; r++)
#pragma unroll
		for (int n = 0; n < NJ; n++)
			cs[r][n][0] = cs[r][n][1] = cs[r][n][2] = cs[r][n][3] = 0.f;
#endif
#pragma unroll 4 /* k steps unrolled together (PERF-NOTES.md v1) */
	for (int kk = 0; kk < FA_D / 8; kk++) {
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
			for (int r = 0; r < FA_RT; r++) {
#if FA_PREC == 2
				const u32 ab[4] = {a[r][0].big, a[r][1].big, a[r][2].big, a[r][3].big};
				const u32 as[4] = {a[r][0].small, a[r][1].small, a[r][2].small, a[r][3].small};
				mma_tf32(cs[r][n], as, b0.big, b1.big);
				mma_tf32(cs[r][n], ab, b0.small, b1.small);
				mma_tf32(s[r][n], ab, b0.big, b1.big);
#else
				mma32(s[r][n], a[r], b0, b1);
#endif
			}
		}
	}
#if FA_PREC == 2
#pragma unroll
	for (int r = 0; r < FA_RT; r++)
#pragma unroll
		for (int n = 0; n < NJ; n++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				s[r][n][e] += cs[r][n][e];
#endif
}
#endif

/* ---------------------------------------------------------------------------------------------
 * Stage: the tails and the causal edge masked on the raw scores (only in the steps that need
 * it). */
__device__ __forceinline__ void mask_scores(float (&s)[SRT][SNJ][4], const fa_kparams &p, int kv0,
                                            int q0, int off, int srow, int kbase, int g, int t)
{
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
}

#if FA_WIN
/* FA_WIN: the window's edges (the mask folded in) and the key tail masked, only in the steps
 * whose tile an edge crosses for some row of the block. kv0: the tile's first key (absolute). */
__device__ __forceinline__ void mask_scores_win(float (&s)[SRT][SNJ][4], const fa_kparams &p,
                                                int kv0, int q0, int srow, int kbase, int g,
                                                int t)
{
	const bool need_mask = kv0 + FA_BC > p.Sk || kv0 - (q0 + BR - 1) < p.win_lo ||
	                       kv0 + FA_BC - 1 - q0 > p.win_hi;
	if (need_mask) {
#pragma unroll
		for (int r = 0; r < SRT; r++)
#pragma unroll
			for (int n = 0; n < SNJ; n++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					int row = q0 + srow + r * 16 + g + (e >> 1) * 8;
					int col = kv0 + kbase + n * 8 + 2 * t + (e & 1);
					if (!fa_win_sees(row, col, p.Sk, p.win_lo, p.win_hi))
						s[r][n][e] = NEG_INF;
				}
	}
}
#endif

#if FA_SOFTCAP
/* FA_SOFTCAP: the raw scores capped (before the mask) and taken to the log2 domain; tanhf where
 * the tolerance is fp32's (ieee, 3xtf32), the MUFU form elsewhere (fa_device.cuh). */
#define CAP_ACCURATE (FA_IN == 3 && FA_PREC != 3)
__device__ __forceinline__ void softcap_scores(float (&s)[SRT][SNJ][4], const fa_kparams &p)
{
#pragma unroll
	for (int r = 0; r < SRT; r++)
#pragma unroll
		for (int n = 0; n < SNJ; n++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				s[r][n][e] = fa_softcap2<CAP_ACCURATE>(s[r][n][e], p.scale_cap,
				                                        p.cap_log2);
}
#endif

/* ---------------------------------------------------------------------------------------------
 * Stage: the online softmax on raw scores (sl > 0: a negative scale negated Q): new row max,
 * P = exp2(s sl - m sl) with one FFMA per score, the running sum and O rescaled. With
 * SKIP_RESCALE O is rescaled only when some row max of the warp grew (alpha is exactly 1
 * otherwise: m sl - m sl with the product rounded once, not contracted into an FFMA). The
 * pairs: each warp saw half the keys, so the maxima of both halves are exchanged first (mxp). */
#if PAIR
__device__ __forceinline__ void pair_row_max(const float (&s)[SRT][SNJ][4], float (&mxp)[SRT][2],
                                             float4 *xr, int warp, int lane)
{
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
}
#endif

__device__ __forceinline__ void online_softmax(float (&s)[SRT][SNJ][4], float (&mrow)[SRT][2],
                                               float (&lrow)[SRT][2],
                                               float (&acc)[ORT][ONDW][4],
                                               const float (&mxp)[SRT][2], float (&alpha)[SRT][2],
                                               float sl)
{
	bool grew = false;
	(void)grew;
	(void)mxp;
#pragma unroll
	for (int r = 0; r < SRT; r++) {
#pragma unroll
		for (int hh = 0; hh < 2; hh++) {
#if PAIR
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
#if !SKIP_RESCALE
#pragma unroll
			for (int n = 0; n < ONDW; n++) {
				acc[r][n][2 * hh] *= alpha[r][hh];
				acc[r][n][2 * hh + 1] *= alpha[r][hh];
			}
#endif
		}
	}
#if SKIP_RESCALE
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
}

/* ---------------------------------------------------------------------------------------------
 * Stage: O += P V for one key step. */
#if PAIR
/* This warp's P, packed, to the partner (A-fragment order: one 16-byte store per lane and k16
 * slice). The mid-step barrier publishes it; the barrier at the top of the next step frees the
 * buffer. */
__device__ __forceinline__ void pair_send_p(const float (&s)[SRT][SNJ][4],
                                            u32 (&pw)[SRT][SNJ / 2][4], uint4 *xp_own)
{
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
}

/* The pair's two row tiles and this warp's half of the head dim, each V fragment feeding both:
 * this warp's half of the keys from registers, then the partner's half from shared memory. */
__device__ __forceinline__ void pv_pair(float (&acc)[ORT][ONDW][4], const u32 (&pw)[SRT][SNJ / 2][4],
                                        u32 (&a)[ORT][4], const uint4 *xp_par, u32 va, int kbase)
{
#pragma unroll
	for (int half = 0; half < 2; half++)
#pragma unroll
		for (int kk = 0; kk < FA_BC / 32; kk++) {
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
			const int vrow = (half == 0 ? kbase : kbase ^ (FA_BC / 2)) + kk * 16;
#pragma unroll
			for (int n = 0; n < ONDW; n += 2) {
				u32 b0, b1, b2, b3;
				ldsm_x4_t(b0, b1, b2, b3, va + (vrow * LDV + n * 8) * ES);
#pragma unroll
				for (int r = 0; r < ORT; r++) {
					mma16(acc[r][n], a[r], b0, b1);
					mma16(acc[r][n + 1], a[r], b2, b3);
				}
			}
		}
}
#elif FA_IN != 3
/* 16-bit: P packed from the accumulators as the m16n8k16 A fragment, V by ldmatrix.trans. */
__device__ __forceinline__ void pv_16(float (&acc)[ORT][ONDW][4], const float (&s)[SRT][SNJ][4],
                                      u32 (&a)[FA_RT][4], const in_t *cV)
{
	const int lane = lane_id();
#pragma unroll
	for (int kk = 0; kk < FA_BC / 16; kk++) {
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
			ldsm_x4_t(b0, b1, b2, b3,
			          smem_u32(cV + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDV +
			                   n * 8 + (lane >> 4) * 8));
#pragma unroll
			for (int r = 0; r < FA_RT; r++) {
				mma16(acc[r][n], a[r], b0, b1);
				mma16(acc[r][n + 1], a[r], b2, b3);
			}
		}
	}
}
#elif FA_PREC != 2
/* ieee, and tf32 (whose 2e-3 tolerance does not notice the tensor cores' truncating
 * accumulation): P V chained straight into O. */
__device__ __forceinline__ void pv_32(float (&acc)[ORT][ONDW][4], const float (&s)[SRT][SNJ][4],
                                      op32 (&a)[FA_RT][4], const in_t *cV, int g, int t)
{
#pragma unroll
	for (int kk = 0; kk < NJ; kk++) {
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
}
#else
/* 3xtf32: tensor cores add fp32 partial sums with truncation: chained over thousands of keys
 * that bias reaches 3e-5 relative (seen at Sk = 4097). So each step's P V is summed on the
 * tensor cores from zero (BC/8 chained mma) and added to O with an IEEE add. */
__device__ __forceinline__ void pv_32(float (&acc)[ORT][ONDW][4], const float (&s)[SRT][SNJ][4],
                                      op32 (&a)[FA_RT][NJ][4], float (&part)[FA_RT][4],
                                      const in_t *cV, int g, int t)
{
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

/* ---------------------------------------------------------------------------------------------
 * Stage: the epilogue. O /= l, logsumexp = (m + log2 l) ln 2. */
/* Two adjacent elements of O's row ob (element offset) at column col. p.o is read in the store
 * itself, after the conversion (C++17 sequences an assignment's right side first), where the
 * kernel always read it. */
__device__ __forceinline__ void store_o2(const fa_kparams &p, long long ob, int col, float x0,
                                         float x1)
{
#if FA_OUT == 3
	*(float2 *)((float *)p.o + ob + col) = make_float2(x0, x1);
#elif FA_OUT == 2
	*(u32 *)((u16 *)p.o + ob + col) = pack_bf16(x0, x1);
#else
	*(u32 *)((u16 *)p.o + ob + col) = pack_f16(x0, x1);
#endif
}

#if PAIR
/* The row sums quad-reduced, the partner's partial sums (its half of the keys) added; O /= l on
 * this warp's half of the head dim for both row tiles, lse by the warp that owns the row. */
__device__ __forceinline__ void epilogue_pair(const fa_kparams &p, const float (&acc)[ORT][ONDW][4],
                                              const float (&mrow)[SRT][2],
                                              const float (&lrow)[SRT][2], float (&lq)[SRT][2],
                                              float (&lt)[ORT][2], float (&mt)[ORT][2], float4 *xl,
                                              float sl, int q0, int srow, int ocol, int ph,
                                              int warp, int lane, int g, int t, int b, int h)
{
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
	lt[0][0] = lq[0][0] + o.x;
	lt[0][1] = lq[0][1] + o.y;
	lt[1][0] = lq[SRT - 1][0] + o.z;
	lt[1][1] = lq[SRT - 1][1] + o.w;
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
			const int rbase = srow + r * 16;
			const int row = q0 + rbase + g + hh * 8;
			if (row >= p.Sq)
				continue;
			const bool own = r == ph;
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
				store_o2(p, ob, col, x0, x1);
			}
		}
	}
}
#else
__device__ __forceinline__ void epilogue(const fa_kparams &p, const float (&acc)[ORT][ONDW][4],
                                         const float (&mrow)[SRT][2], const float (&lrow)[SRT][2],
                                         float sl, int q0, int wrow, int g, int t, int b, int h)
{
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
				store_o2(p, ob, col, x0, x1);
			}
		}
	}
}
#endif

/* ---------------------------------------------------------------------------------------------
 * The forward kernel: the prologue, then per key step load -> Q K^T -> mask -> softmax -> P V,
 * then the epilogue. */
#if FA_LAYOUT
/* O and lse of the block's sequence (blockIdx.z): packed rows from cu_q, or its dense batch.
 * LATE_O: set just before the epilogue rather than at the top, so that no pointer of theirs is
 * live through the loop (the softcap and window tiles at 255 registers spilled with two more
 * pointers: test_nvrtc_infer); not for the warp pairs, whose epilogue is the heavier point and
 * which compile without spills as they were, nor without a window or softcap (the code as it
 * was measured). */
#define LATE_O (!PAIR && (FA_WIN || FA_SOFTCAP))
__device__ __forceinline__ void seq_out(fa_kparams &p, const fa_kparams &pb, const fa_lparams &L)
{
	const int bs = blockIdx.z;
	if (L.cu_q) {
		const int q0r = __ldg(L.cu_q + bs);
		p.o = (char *)pb.o + (long long)q0r * pb.os[1] * (FA_OUT == 3 ? 4 : 2);
		if (pb.lse)
			p.lse = pb.lse + (long long)q0r * pb.ls[2];
	} else {
		p.o = (char *)pb.o + bs * pb.os[0] * (FA_OUT == 3 ? 4 : 2);
		if (pb.lse)
			p.lse = pb.lse + bs * pb.ls[0];
	}
}
#else
#define LATE_O 0
#endif
#if FA_LAYOUT
/* The inference layouts: the block's sequence (blockIdx.z) as a dense problem of its own
 * lengths, B = 1, whose pointers start at its first rows; everything below reads p, so the
 * masks, tails and epilogue apply per sequence exactly as to a dense batch. */
extern "C" __global__ void __launch_bounds__(NT, 1) fa_attn_fwd(const fa_kparams pb,
                                                                 const fa_lparams L)
#else
extern "C" __global__ void __launch_bounds__(NT, 1) fa_attn_fwd(const fa_kparams p)
#endif
{
	extern __shared__ __align__(16) unsigned char smem_raw[];
	in_t *sQ = (in_t *)smem_raw;
	in_t *sK = sQ + SMEM_Q;
	in_t *sV = sK + FA_STAGES * SMEM_K;

	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int g = lane >> 2, t = lane & 3;
	const int mb = FA_MASK ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
#if FA_LAYOUT
	fa_kparams p = pb;
	const int bs = blockIdx.z; /* the sequence */
	{
		if (L.cu_q) { /* packed: rows cu_q[bs] .. of Q, O and lse */
			const int q0r = L.cu_q[bs];
			p.Sq = L.cu_q[bs + 1] - q0r;
			p.q = (const qin_t *)pb.q + (long long)q0r * pb.qs[1];
#if !LATE_O
			p.o = (char *)pb.o + (long long)q0r * pb.os[1] * (FA_OUT == 3 ? 4 : 2);
			if (pb.lse)
				p.lse = pb.lse + (long long)q0r * pb.ls[2];
#endif
		} else { /* dense: Sq queries each */
			p.q = (const qin_t *)pb.q + bs * pb.qs[0];
#if !LATE_O
			p.o = (char *)pb.o + bs * pb.os[0] * (FA_OUT == 3 ? 4 : 2);
			if (pb.lse)
				p.lse = pb.lse + bs * pb.ls[0];
#endif
		}
		if (mb * BR >= p.Sq)
			return; /* past this sequence's queries (the grid covers the longest) */
#if PAGED
		p.Sk = L.seqlens_k[bs];
#else
		if (L.cu_k) {
			const int k0 = L.cu_k[bs];
			p.Sk = L.cu_k[bs + 1] - k0;
			p.k = (const in_t *)pb.k + (long long)k0 * pb.ks[1];
			p.v = (const in_t *)pb.v + (long long)k0 * pb.vs[1];
		} else {
			p.Sk = L.seqlens_k[bs];
			p.k = (const in_t *)pb.k + bs * pb.ks[0];
			p.v = (const in_t *)pb.v + bs * pb.vs[0];
		}
#endif
#if FA_WIN
		/* the window's sides (pb.win_lo, pb.win_hi) as this sequence's range of j - i */
		fa_seq_window(p.Sq, p.Sk, pb.win_lo, pb.win_hi, FA_MASK, &p.win_lo, &p.win_hi);
#endif
	}
	const int h = blockIdx.y, b = 0, hk = h / p.group; /* b: the pointers are the sequence's */
#else
	const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
#endif
	const int q0 = mb * BR;
	const int off = FA_MASK == 1 ? p.Sk - p.Sq : 0; /* query i sees keys j <= i + off */

	const qin_t *Qg = (const qin_t *)p.q + b * p.qs[0] + h * p.qs[2] + (long long)q0 * p.qs[1];
	const in_t *Kg = (const in_t *)p.k + b * p.ks[0] + hk * p.ks[2];
	const in_t *Vg = (const in_t *)p.v + b * p.vs[0] + hk * p.vs[2];

#if FA_WIN
	/* The keys [klo, khi) some row of the block sees: the loop walks the tiles from the one of
	 * klo (kvs) to the one of khi - 1, so its time is the window's, not the sequence's. */
	(void)off;
	const long long klo = max(0LL, (long long)q0 + p.win_lo);
	const long long khi = min((long long)p.Sk, (long long)min(q0 + BR, p.Sq) - 1 + p.win_hi + 1);
	const int kvs = khi > klo ? (int)(klo / FA_BC) * FA_BC : 0;
	int ntiles = khi > klo ? (int)((khi - kvs + FA_BC - 1) / FA_BC) : 0;
#if !PAGED /* a paged ring keeps page 0's base: its rows are looked up from key kvs on */
	Kg += (long long)kvs * p.ks[1];
	Vg += (long long)kvs * p.vs[1];
#endif
#else
	const int kvs = 0;
	int ntiles = (p.Sk + FA_BC - 1) / FA_BC;
	if (FA_MASK) {
		int lim = min(q0 + BR, p.Sq) - 1 + off; /* the last key any row of this block sees */
		ntiles = lim < 0 ? 0 : min(ntiles, lim / FA_BC + 1);
	}
#endif

	load_prologue(p, sQ, sK, sV, Qg, Kg, Vg, q0, ntiles, kvs PAGES_PASS);

	/* A negative scale: negate Q in shared memory (exact), so that the row max of the raw
	 * scores is the max of the scaled ones (QREG: in its registers, below). The barrier at the
	 * top of the first step publishes the flipped words. */
#if FA_SOFTCAP
	const float sl = 1.f; /* softcap_scores left the scores in the log2 domain */
#else
	const float sl = p.scale_log2;
#endif
	if (!QREG && p.neg_scale) {
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
	 * from srow (both tiles), S keys from kbase (its half of the step's keys), O columns from
	 * ocol (its half of the head dim). acc[0] and acc[1] are the pair's row tiles 0 and 1. */
	const int ph = warp & 1;
	const int srow = wrow - ph * 16;
	const int kbase = ph * (FA_BC / 2);
	const int ocol = ph * (DP / 2);
	uint4 *const xp = (uint4 *)(smem_raw + (SMEM_Q + FA_STAGES * (SMEM_K + SMEM_V)) * ES);
	float4 *const xr = (float4 *)((unsigned char *)xp + SMEM_XP);
	float4 *const xl = (float4 *)xp; /* the epilogue's, after a barrier */
	uint4 *const xp_own = xp + warp * (SRT * SNJ / 2) * 32 + lane;
	const uint4 *const xp_par = xp + (warp ^ 1) * (SRT * SNJ / 2) * 32 + lane;
	{
		/* the launch must have reserved the exchange buffer (planner.c mirrors PAIR) */
		u32 dyn;
		asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
		if (dyn < (SMEM_Q + FA_STAGES * (SMEM_K + SMEM_V)) * ES + SMEM_XP + SMEM_XR)
			__trap();
	}
#else
	const int srow = wrow, kbase = 0, ocol = 0;
	(void)ocol;
#endif

#if QREG
	u32 qf[FA_RT][DP / 16][4];
	/* Q's A fragments for the whole row block of this warp, loaded once (a negative scale
	 * flips their sign bits here instead of in shared memory). */
	cp_async_wait<2 * (FA_STAGES - 1)>(); /* Q has landed (this thread's part) */
	__syncthreads();                      /* ... everyone's */
#pragma unroll
	for (int r = 0; r < FA_RT; r++)
#pragma unroll
		for (int kk = 0; kk < DP / 16; kk++) {
			ldsm_x4(qf[r][kk][0], qf[r][kk][1], qf[r][kk][2], qf[r][kk][3],
			        smem_u32(sQ + (wrow + r * 16 + (lane & 15)) * LDQ + kk * 16 + (lane >> 4) * 8));
			if (p.neg_scale)
#pragma unroll
				for (int e = 0; e < 4; e++)
					qf[r][kk][e] ^= 0x80008000u;
		}
#endif
#if PAIR
	/* ldmatrix row addresses of this lane (bytes); each use adds a constant */
	const u32 qa0 = smem_u32(sQ + (srow + (lane & 15)) * LDQ + (lane >> 4) * 8);
	const u32 ka0 = smem_u32(sK + (kbase + (lane >> 4) * 8 + (lane & 7)) * LDK + ((lane >> 3) & 1) * 8);
	const u32 va0 = smem_u32(sV + (((lane >> 3) & 1) * 8 + (lane & 7)) * LDV + ocol + (lane >> 4) * 8);
#else
	const u32 qa0 = 0;
#endif
	kv_ring ring;
#if FA_WIN
	ring.kvs = kvs; /* before kv_ring_init: a paged ring's first row table starts at kvs */
#endif
#if PAGED
	{
		/* the launch must have reserved the row table (fa_klayout_smem) */
		u32 dyn;
		asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
		if (dyn < PTAB_AT + PTAB_BYTES)
			__trap();
	}
#endif
	kv_ring_init(ring, sK, sV, Kg, Vg, p, tid PAGES_PASS);

	for (int j = 0; j < ntiles; j++) {
		load_kv_step(ring, p, j, ntiles PAGES_PASS);
		const in_t *cK = sK + (j % FA_STAGES) * SMEM_K;
		const in_t *cV = sV + (j % FA_STAGES) * SMEM_V;
#if PAIR
		const u32 ka = ka0 + (j % FA_STAGES) * (SMEM_K * ES);
		const u32 va = va0 + (j % FA_STAGES) * (SMEM_V * ES);
		(void)cK;
		(void)cV;
#else
		const u32 ka = 0;
#endif

		/* S = Q K^T */
		float s[SRT][SNJ][4];
#pragma unroll
		for (int r = 0; r < SRT; r++)
#pragma unroll
			for (int n = 0; n < SNJ; n++)
				s[r][n][0] = s[r][n][1] = s[r][n][2] = s[r][n][3] = 0.f;
#if FA_IN != 3
		u32 qa[SRT][4];
#if QREG
		qk_16(s, qf, qa, sQ, cK, qa0, ka, srow, kbase);
#else
		qk_16(s, 0, qa, sQ, cK, qa0, ka, srow, kbase);
#endif
#else
		(void)qa0;
		(void)ka;
		op32 qa[FA_RT][4];
		qk_32(s, qa, sQ, cK, wrow, g, t);
#endif
#if FA_SOFTCAP
		softcap_scores(s, p);
#endif
#if FA_WIN
		mask_scores_win(s, p, kvs + j * FA_BC, q0, srow, kbase, g, t);
#else
		mask_scores(s, p, j * FA_BC, q0, off, srow, kbase, g, t);
#endif

		float mxp[SRT][2];
#if PAIR
		pair_row_max(s, mxp, xr, warp, lane);
#endif
		float alpha[SRT][2];
		online_softmax(s, mrow, lrow, acc, mxp, alpha, sl);
#if PAIR
		u32 pw[SRT][SNJ / 2][4];
		pair_send_p(s, pw, xp_own);
#endif

		load_kv_mid(ring, p, j, ntiles PAGES_PASS);

		/* O += P V */
#if PAIR
		u32 pa[ORT][4];
		pv_pair(acc, pw, pa, xp_par, va, kbase);
#elif FA_IN != 3
		u32 pa[FA_RT][4];
		pv_16(acc, s, pa, cV);
#elif FA_PREC != 2
		op32 pa[FA_RT][4];
		pv_32(acc, s, pa, cV, g, t);
#else
		op32 pa[FA_RT][NJ][4];
		float part[FA_RT][4];
		pv_32(acc, s, pa, part, cV, g, t);
#endif
	}
	cp_async_wait<0>();
#if LATE_O
	seq_out(p, pb, L);
#endif

#if PAIR
	/* the row sums (quad-reduced, then the pair's), the maxima of both row tiles */
	float lq[SRT][2], lt[ORT][2], mt[ORT][2];
	epilogue_pair(p, acc, mrow, lrow, lq, lt, mt, xl, sl, q0, srow, ocol, ph, warp, lane, g, t, b,
	              h);
#else
	epilogue(p, acc, mrow, lrow, sl, q0, wrow, g, t, b, h);
#endif
}

/* fp32 [B, S, H, D] (strided, head dim contiguous) -> dense bf16 [B, S, H, D]: the staging step
 * of the fp32 "bf16" precision for K and V with gaps between their rows (gpu_cuda.c). Four
 * elements per thread. */
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
