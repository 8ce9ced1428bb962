/* fa_device.cuh - device helpers the kernels share (attn_fwd.cu, attn_fwd_sm90.cu, attn_bwd.cu,
 * attn_bwd_sm90.cu).
 *
 * NVRTC has no file system here: the host hands this text to nvrtcCreateProgram as the header
 * "fa_device.cuh" (gpu_nvrtc.c; embedded like the .cu files by tools/embed.sh), and the disk
 * cache's key and the tuning table's source hash cover it (gpu_diskcache.c, tune_cache.c).
 * Everything is __forceinline__: moving a helper here must not change the code generated.
 */
#ifndef FA_DEVICE_CUH
#define FA_DEVICE_CUH

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define NEG_INF (__int_as_float(0xff800000))
#define FA_NAN (__int_as_float(0x7fc00000))

/* The shared-memory address of a generic pointer into shared memory. */
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
/* Wait until at most N of this thread's commit groups are in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* The MUFU exponential and logarithm (scores live in the log2 domain). */
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

/* Pack two floats as 16-bit, rounded to nearest even: lo goes to the low half (the lower k
 * index). */
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


/* ---- tensor-core fragments and small helpers of the backward kernel (attn_bwd.cu) ----------
 * The forward kernels keep their own copies of the first ones (their SASS was measured with
 * them); new kernels use these. Names carry fa_ so that both can include this header. */

/* Four 8x8 16-bit matrices from shared memory (.trans: each transposed); lanes 8q..8q+7 give
 * the row addresses of matrix q. */
__device__ __forceinline__ void fa_ldsm_x4(u32 (&r)[4], u32 addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(addr));
}
__device__ __forceinline__ void fa_ldsm_x4_t(u32 (&r)[4], u32 addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(addr));
}

/* c += a b, m16n8k16 with fp32 accumulation; IN 1 fp16, 2 bf16. */
template <int IN> __device__ __forceinline__ void fa_mma16(float *c, const u32 *a, u32 b0, u32 b1)
{
	if (IN == 1)
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
		             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
	else
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <int IN> __device__ __forceinline__ u32 fa_pack16(float lo, float hi)
{
	return IN == 1 ? pack_f16(lo, hi) : pack_bf16(lo, hi);
}

/* fp32 on tensor cores, m16n8k8 (A: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0
 * (k t, n g), b1 (k t+4, n g); lane = 4g + t). PREC 1 ieee (FFMA through shuffles), 2 3xtf32
 * (big*big + big*small + small*big), 3 tf32. The operand keeps the parts its precision uses;
 * the compiler drops the others. */
struct fa_op32 {
	u32 big, small;
	float f;
};
template <int PREC> __device__ __forceinline__ fa_op32 fa_make_op(float x)
{
	fa_op32 o;
	o.f = x;
	o.big = 0;
	o.small = 0;
	if (PREC == 3) {
		/* half a tf32 ulp added: the tensor cores drop the low 13 bits (round to nearest) */
		o.big = __float_as_uint(x) + 0x1000u;
	} else if (PREC == 2) {
		o.big = __float_as_uint(x) & 0xffffe000u;
		o.small = __float_as_uint(x - __uint_as_float(o.big)) + 0x1000u;
	}
	return o;
}
__device__ __forceinline__ void fa_mma_tf32(float *c, const u32 *a, u32 b0, u32 b1)
{
	asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
	             "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <int PREC>
__device__ __forceinline__ void fa_mma32(float *c, const fa_op32 *a, fa_op32 b0, fa_op32 b1)
{
	if (PREC == 1) {
		const int lane = threadIdx.x & 31, t = lane & 3, qb = lane & ~3;
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
		return;
	}
	u32 ab[4] = {a[0].big, a[1].big, a[2].big, a[3].big};
	if (PREC == 2) {
		u32 as[4] = {a[0].small, a[1].small, a[2].small, a[3].small};
		fa_mma_tf32(c, as, b0.big, b1.big);
		fa_mma_tf32(c, ab, b0.small, b1.small);
	}
	fa_mma_tf32(c, ab, b0.big, b1.big);
}

/* 16-bit bit patterns to float (exact). */
__device__ __forceinline__ float fa_bf16_to_f32(u16 x)
{
	return __uint_as_float((u32)x << 16);
}
__device__ __forceinline__ float fa_f16_to_f32(u16 x)
{
	float y;
	asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(y) : "h"(x));
	return y;
}

/* The backward's P for fp32 ieee and 3xtf32 (attn_bwd.cu's FA_XEXP, attn_bwd_sm90_tf32.cu):
 * exp(s sc - L) for fp32 s, sc + sc_lo the scale, L the row's natural lse: the product's and
 * the difference's rounding errors (Dekker's product residual, Knuth's two-sum) and that of the
 * change to base 2 are added back as a first-order factor (1 + err); the exponent is then exact
 * to a few units of 2^-24 relative, and P to ex2.approx's own error. The _rn intrinsics keep the
 * compiler from contracting the terms whose roundings are being measured. */
__device__ __forceinline__ float fa_p_exp_comp(float s, float sc, float sc_lo, float L)
{
	const float L2E = 1.44269502162933349609375f, L2E_LO = 1.925963033500011e-8f;
	const float hi = __fmul_rn(s, sc);
	const float lo = fmaf(s, sc_lo, fmaf(s, sc, -hi));  /* s sc = hi + lo */
	const float d = __fadd_rn(hi, -L);                   /* two-sum: hi - L = d + e */
	const float bb = __fadd_rn(d, -hi);
	const float e = __fadd_rn(__fadd_rn(hi, -__fadd_rn(d, -bb)), __fadd_rn(-L, -bb));
	const float x = __fmul_rn(d, L2E);
	const float r = fmaf(d, L2E_LO, fmaf(d, L2E, -x)); /* d log2(e) = x + r */
	const float corr = fmaf(r, 0.693147182464599609375f, __fadd_rn(e, lo));
	const float p = fast_exp2(x);
	return fmaf(p, corr, p);
}

/* A flag in global memory read with acquire / written with release at GPU scope (the
 * deterministic dQ's turn counter). */
__device__ __forceinline__ int fa_ld_acquire(const int *p)
{
	int v;
	asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}
__device__ __forceinline__ void fa_st_release(int *p, int v)
{
	asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* ---- the deterministic dQ in fixed point (FA_DET 2: fp16, bf16, tf32 and the bf16 staging) ----
 * Integer addition is associative, so a dQ accumulator of int32 gets the same bits whatever the
 * order the key blocks add in: the atomic mode's grid and reductions, no turns and no waits.
 * Element (i, d) of dQ / scale is the sum over keys of dS_ij K_jd with |dS_ij| <= P_ij (|dP_ij| +
 * |delta_i|), |dP_ij| <= |dO_i| |V_j| and sum_j P_ij = 1, so every partial sum (one key block's,
 * or all of them) is at most r_i c_d, r_i = |dO_i| max_j |V_j| + |delta_i| (fa_bwd_pre) and c_d =
 * max_j |K_jd| (fa_bwd_kvscale). Rounded up to powers of two, 2^-e(r_i) 2^(27 - e(c_d)) maps
 * that bound into 2^27: each block's part is rounded to an integer there (its error 2^-28 of the
 * bound, against the 16-bit types' 2^-9 .. 2^-12 and tf32's 2^-11), the sum stays below 2^30
 * even where P sums to 8 (an lse that is not the forward's), and a part that does not fit below
 * 2^30 (NaN, or such an lse) marks its row NaN (fa_bwd_dq writes NaN there) instead of wrapping.
 * The multipliers are powers of two kept in float: their products and inverses are exact.
 * Packed pairs (attn_bwd.cu, attn_bwd_sm90.cu's narrow form: fa_dqi_red2): two adjacent columns' parts,
 * each biased by 2^30 (so non-negative), added as one u64, the high word taking the low one's
 * carries; with the number n of adds (a counter per query block) fa_bwd_dq undoes both: the
 * low word less n 2^30 is the first sum (below 2^30 in size), the carries follow from it. */
#define FA_DQI_LIM 0x1p30f
/* 2^(top - e) with x <= 2^e (x >= 0, e clamped to [lo, 120]); NaN for a NaN or infinite x */
__device__ __forceinline__ float fa_dqi_pow2(float x, int top, int lo)
{
	if (!(x <= 0x1p127f))
		return FA_NAN;
	int e = (int)((__float_as_uint(x) >> 23) & 255) - 126; /* x < 2^e */
	e = e < lo ? lo : e > 120 ? 120 : e;
	return __int_as_float((127 + top - e) << 23);
}
/* a row's multiplier 2^-e(r_i); a column's 2^(27 - e(c_d)) */
__device__ __forceinline__ float fa_dqi_row_mul(float x)
{
	return fa_dqi_pow2(x, 0, -120);
}
__device__ __forceinline__ float fa_dqi_col_mul(float x)
{
	return fa_dqi_pow2(x, 27, -90);
}
/* 1 / m for a multiplier above (a normal power of two), exactly; NaN stays NaN */
__device__ __forceinline__ float fa_dqi_inv(float m)
{
	return m != m ? m : __int_as_float(0x7f000000 - (int)__float_as_uint(m));
}
/* One key block's part v of dQ element (i, d) in the fixed point of row multiplier mr and
 * column multiplier mc, rounded to nearest; bad is set when it does not fit (see above).
 * FA_DQI_CVT 1 (default): by fp32 adds, not cvt.rni.s32.f32 (F2I, a conversion unit's rate, not
 * the FMA pipes'): t = y + 1.5 2^31 rounds y to a multiple of 256 (t's ulp) whose count is t's
 * bits less 1.5 2^31's; y less that multiple is exact (|.| <= 128) and rounds to an integer the
 * same way under 1.5 2^23; their sum is y rounded to nearest, for |y| < 2^30. 0: cvt. */
#ifndef FA_DQI_CVT
#define FA_DQI_CVT 1
#endif
__device__ __forceinline__ int fa_dqi_fix(float v, float mr, float mc, bool &bad)
{
#if FA_DQI_DIAG == 2 /* timing only: no multipliers */
	mr = mc = 1.f;
#endif
	const float y = (v * mr) * mc; /* v mr <= c_d: no overflow in between */
	bad |= !(fabsf(y) < FA_DQI_LIM);
#if FA_DQI_CVT
	const float c1 = 0x1.8p31f, c2 = 0x1.8p23f;
	const float t = __fadd_rn(y, c1);
	const int hi = __float_as_int(t) - __float_as_int(c1);
	const float lo = __fadd_rn(y, -__fadd_rn(t, -c1));
	/* unsigned: a part that does not fit (its row marked) wraps instead of overflowing */
	return (int)((unsigned)hi * 256u +
	             (unsigned)(__float_as_int(__fadd_rn(lo, c2)) - __float_as_int(c2)));
#else
	return __float2int_rn(y);
#endif
}
/* The add, without a "memory" clobber: nothing in the main pass reads the accumulator, and a
 * clobber would pin every multiplier's load behind the reduction before it (a load's latency per
 * element, measured +30-40% on the H200 with it). */
#ifndef FA_DQI_DIAG /* timing only (wrong results): 1 the adds as fp32 reductions of the bits, 2
                     * no multipliers, 3 no adds */
#define FA_DQI_DIAG 0
#endif
__device__ __forceinline__ void fa_dqi_red(int *p, int x)
{
#if FA_DQI_DIAG == 1
	asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(__int_as_float(x & 0x3fffffff)));
#elif FA_DQI_DIAG == 3 /* no adds at all */
	(void)p;
	(void)x;
#else
	asm volatile("red.global.add.s32 [%0], %1;" ::"l"(p), "r"(x));
#endif
}
/* A packed pair (above): parts x0, x1 of adjacent columns at p (8-byte aligned) */
__device__ __forceinline__ void fa_dqi_red2(int *p, int x0, int x1)
{
	const unsigned long long v = (unsigned long long)(unsigned)(x0 + (1 << 30)) |
	                             (unsigned long long)(unsigned)(x1 + (1 << 30)) << 32;
#if FA_DQI_DIAG == 3
	(void)p;
	(void)v;
#else
	asm volatile("red.global.add.u64 [%0], %1;" ::"l"(p), "l"(v));
#endif
}
/* FA_DET 3, the same in 64 bits (fp32 3xtf32 on attn_bwd_sm90_tf32.cu, whose error is below
 * 2^-28 of a bound): the bound into 2^59 (2^(59 - e) columns, the rows' as above), a part's
 * rounding 2^-60 of it, the sum below 2^62 where P sums to 8; a part at or above 2^62 marks its
 * row. One red.global.add.u64 per element. */
__device__ __forceinline__ float fa_dqi_col_mul64(float x)
{
	return fa_dqi_pow2(x, 59, -60);
}
__device__ __forceinline__ long long fa_dqi_fix64(float v, float mr, float mc, bool &bad)
{
	const float y = (v * mr) * mc;
	bad |= !(fabsf(y) < 0x1p62f);
	return __float2ll_rn(y);
}
__device__ __forceinline__ void fa_dqi_red64(long long *p, long long x)
{
	asm volatile("red.global.add.u64 [%0], %1;" ::"l"(p), "l"(x));
}
/* The two sums of a packed pair after n adds (n 2^30 and the carries taken out) */
__device__ __forceinline__ int2 fa_dqi_unpack2(int2 a, unsigned n)
{
	const unsigned lo = (unsigned)a.x, hi = (unsigned)a.y, bias = n << 30;
	const int s0 = (int)(lo - bias);
	const unsigned long long full = (unsigned long long)n * (1u << 30) + (long long)s0;
	const unsigned carries = (unsigned)((full - lo) >> 32);
	return make_int2(s0, (int)(hi - carries - bias));
}

/* ---- sliding window and logit softcapping (fa_attn.h), shared by every kernel -------------- */

/* A raw score x (Q already negated for a negative scale) softcapped and in the log2 domain:
 * cap log2(e) tanh(x |scale| / cap), so the softmax runs on it with unit scale. Not
 * tanh.approx.f32: its 2^-11 relative error is a score error of up to 0.025 at cap 50 (2.5% on
 * P). ACCURATE (the fp32 ieee / 3xtf32 kernels, 1e-5): tanhf, about 2 ulp. Otherwise 1 - 2 / (e^2|x|
 * + 1) on the MUFU ex2 and rcp: an absolute error near 1e-7, a score error under 1e-5 at cap 50,
 * far below what the 16-bit P and tf32 tolerate, and fewer instructions than tanhf's
 * polynomial and branch. */
template <bool ACCURATE>
__device__ __forceinline__ float fa_softcap2(float x, float scale_cap, float cap_log2)
{
	const float y = x * scale_cap;
	if (ACCURATE)
		return cap_log2 * tanhf(y);
	const float e = fast_exp2(fabsf(y) * 2.8853900817779268f); /* e^(2|y|); inf -> tanh 1 */
	float r;
	asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.f));
	return cap_log2 * copysignf(fmaf(-2.f, r, 1.f), y);
}

/* Whether key col is visible to query row under a window resolved by the host: col - row in
 * [win_lo, win_hi] (the mask and the window folded together, fa_attn_key_range), col < Sk.
 * The difference of two ints below 2^30 cannot overflow. */
__device__ __forceinline__ bool fa_win_sees(int row, int col, int Sk, int win_lo, int win_hi)
{
	const int d = col - row;
	return col < Sk && d >= win_lo && d <= win_hi;
}

/* A window over an inference layout resolved for one sequence of sq queries and sk keys: the
 * host cannot fold one range of j - i for a batch, since fa_attn_key_range aligns the diagonal
 * per sequence (a = sk - sq, 0 top-left) and lets a side bound only below that sequence's sk (sk
 * + sq for the left). wl, wr: the descriptor's window_left / window_right, negative for an
 * unbounded side (the host clamps them to int); mask: FA_MASK (1, 2 causal: the right side also
 * at most a). The result is what the host's kmaskx_of (gpu_cuda.c) gives a dense problem of these
 * lengths, clamped to [-sq - 1, sk + 1] so that it stays an int. */
__device__ __forceinline__ void fa_seq_window(int sq, int sk, int wl, int wr, int mask, int *lo,
                                              int *hi)
{
	const long long q = sq, k = sk, a = mask == 2 ? 0 : k - q;
	long long l = -q - 1, h = k + 1;
	if (mask)
		h = a;
	if (wr >= 0 && wr < k && a + wr < h)
		h = a + wr;
	if (wl >= 0 && wl < k + q)
		l = a - wl;
	*lo = (int)min(max(l, -q - 1), k + 1);
	*hi = (int)min(max(h, -q - 1), k + 1);
}

/* ---- wgmma (sm_90a: attn_fwd_sm90.cu, attn_bwd_sm90.cu; the other kernels never call them, so
 * nothing of them reaches their PTX) ---- */

/* Shared memory written by the generic proxy (st.shared, cp.async) is read by wgmma through
 * the async proxy: each writer fences before the barrier that publishes its writes. */
__device__ __forceinline__ void fence_proxy_async(void)
{
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wg_fence(void)
{
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit(void)
{
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait(void)
{
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* The accumulators an asynchronous wgmma writes must not be touched before its wait: this
 * tells the compiler each one may change there. */
__device__ __forceinline__ void wg_touch(float &x)
{
	asm volatile("" : "+f"(x)::"memory");
}

/* A shared-memory matrix descriptor: no swizzle, leading (K) byte offset 128, stride byte
 * offset sbo between 8-row groups. Addresses and offsets in units of 16 bytes. */
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 sbo)
{
	return (u64)((addr & 0x3ffff) >> 4) | ((u64)(128 >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

/* The same with both offsets given: MN-major (transposed, 16-bit only) operands take the
 * stride between 8-groups along K as the leading byte offset and the one along M / N as the
 * stride byte offset (the no-swizzle canonical layouts of the PTX ISA's matrix descriptor). */
__device__ __forceinline__ u64 wg_desc2(u32 addr, u32 lbo, u32 sbo)
{
	return (u64)((addr & 0x3ffff) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32);
}

#endif /* FA_DEVICE_CUH */
