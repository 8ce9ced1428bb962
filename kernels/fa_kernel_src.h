/* fa_kernel_src.h - the CUDA sources NVRTC compiles, embedded into libfakernels.a as C strings
 * by tools/embed.sh (the Makefile's KERNELS_GEN rule), so the installed binaries need no source
 * tree. Static storage, NUL-terminated; *_len excludes the NUL. Internal to kernels/.
 */
#ifndef FA_KERNEL_SRC_H
#define FA_KERNEL_SRC_H

/* kernels/attn_fwd.cu: the mma.sync kernel (sm_80 and newer) and the fp32 -> bf16 staging */
extern const char fa_src_attn_fwd[];
extern const unsigned long fa_src_attn_fwd_len;
/* kernels/attn_fwd_sm90.cu: the wgmma kernel (sm_90a) and its K/V prep */
extern const char fa_src_attn_fwd_sm90[];
extern const unsigned long fa_src_attn_fwd_sm90_len;
/* kernels/attn_decode.cu: the split-KV decode kernel and its merge pass */
extern const char fa_src_attn_decode[];
extern const unsigned long fa_src_attn_decode_len;
/* kernels/attn_bwd.cu: the backward's three kernels (pre, main, dq) */
extern const char fa_src_attn_bwd[];
extern const unsigned long fa_src_attn_bwd_len;
/* kernels/attn_bwd_sm90.cu: the backward's main pass on wgmma (sm_90a, 16-bit) */
extern const char fa_src_attn_bwd_sm90[];
extern const unsigned long fa_src_attn_bwd_sm90_len;
/* kernels/attn_bwd_sm90_tf32.cu: the backward's main pass on wgmma for fp32 (tf32, 3xtf32) */
extern const char fa_src_attn_bwd_sm90_tf32[];
extern const unsigned long fa_src_attn_bwd_sm90_tf32_len;
/* kernels/fa_device.cuh: the device helpers both include, handed to NVRTC as a header */
extern const char fa_src_fa_device[];
extern const unsigned long fa_src_fa_device_len;
#define FA_DEVICE_HEADER_NAME "fa_device.cuh"

#endif /* FA_KERNEL_SRC_H */
