/* gpu_int.h - what the backward launcher (gpu_bwd.c) uses of gpu_cuda.c's device: its kernels
 * through the same in-memory and disk caches as the forward's. Internal to kernels/.
 */
#ifndef FA_GPU_INT_H
#define FA_GPU_INT_H

#include "fa_cu.h"
#include "fa_gpu.h"

/* The three functions of one backward module (attn_bwd.cu), owned by the device's cache (valid
 * until fa_gpu_close). */
struct fa_gpu_bwd_funcs {
	fa_cu_func pre, main, dq;
};

/* The sliding window of d as the kernels take it (FA_WIN): key j is visible to query i iff
 * *lo <= j - i <= *hi, the mask folded in, clamped to [-Sq - 1, Sk + 1] (gpu_cuda.c's rule for
 * the forward, so both passes see the same keys). Pure: any thread. */
void fa_gpu_window_range(const struct fa_attn_fwd_desc *d, int *lo, int *hi);

/* Compile (or load from disk) and load the backward specialisation s (a backward tile path:
 * fa_kpath_is_bwd), with main's dynamic shared-memory attribute raised to s->tile.smem. The
 * device's context must be current. Statuses of the forward's kernel load (FA_EINTERNAL with
 * NVRTC's log, FA_EDEVICE, FA_ENOMEM). Thread-safe. */
fa_status fa_gpu_bwd_kernels(struct fa_gpu *g, const struct fa_kernel_spec *s,
                             struct fa_gpu_bwd_funcs *f, char *err, size_t errlen);

#endif /* FA_GPU_INT_H */
