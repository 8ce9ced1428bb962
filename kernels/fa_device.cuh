/* fa_device.cuh - device helpers both forward kernels use (attn_fwd.cu, attn_fwd_sm90.cu).
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

#endif /* FA_DEVICE_CUH */
