/* gpu_fwd_infer.c - fa_gpu_fwd_infer (fa_gpu_infer.h), the prefill kernel over the inference
 * layouts: not in this build (a placeholder; the prefill kernel comes with its own change). */
#include "fa_gpu_infer.h"

#include "fa_err.h"

fa_status fa_gpu_fwd_infer(struct fa_gpu *g, const struct fa_attn_infer_desc *d,
                           const struct fa_gpu_infer_index *ix, CUdeviceptr q, CUdeviceptr k,
                           CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                           char *err, size_t errlen)
{
	(void)g, (void)d, (void)ix, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)s;
	return fa_err(err, errlen, FA_ENOTSUP,
	              "prefill (more than FA_DECODE_MAX_SQ queries per sequence) over a varlen/paged "
	              "layout is not in this build");
}
