/* gpu_bwd_stub.c - TEMPORARY: fa_gpu_attn_bwd without backward kernels, so the daemon's GPU
 * backend links while the kernels are built on another branch ("bwdkern"). It answers every
 * backward request on the GPU with FA_ENOTSUP. Delete this file when the real fa_gpu_attn_bwd
 * (kernels/fa_gpu_bwd.h) is merged: the two cannot link together. */
#include "fa_err.h"
#include "fa_gpu_bwd.h"

fa_status fa_gpu_attn_bwd(struct fa_gpu *g, const struct fa_attn_bwd_desc *d,
                          const struct fa_gpu_bwd_ptrs *p, unsigned flags, CUstream s, char *err,
                          size_t errlen)
{
	(void)g, (void)d, (void)p, (void)flags, (void)s;
	return fa_err(err, errlen, FA_ENOTSUP, "backward GPU kernels not built");
}
