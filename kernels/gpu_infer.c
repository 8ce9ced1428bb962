/* gpu_infer.c - fa_gpu_attn_infer (fa_gpu_infer.h): the inference shapes on a GPU. Decode shapes
 * (planner_infer.c decides: every sequence at most FA_DECODE_MAX_SQ queries) run the split-KV
 * decode kernel over the layout (attn_decode.cu reads the device copies of the tables; the grid
 * and split are planned for the longest sequence, from the host copies); the rest goes to the
 * prefill kernel, fa_gpu_fwd_infer (gpu_fwd_infer.c).
 *
 * The checks are fa_gpu_attn_fwd's, on the layout's shapes: the descriptor and every index entry
 * (fa_attn_infer_check on the host copies, again: cheap, and a caller that skipped it must not
 * reach a kernel), 16-byte pointers and strides for q, k, v, o (pools and packed tensors alike),
 * 4-byte lse, and the device copies present for the tables the layout has. The sliding window and
 * softcap go to either kernel, the window as its two sides (each block aligns it to its own
 * sequence: attn_fwd.cu, attn_decode.cu FA_LAYOUT), so no combination is refused here.
 */
#include "fa_gpu_infer.h"

#include <inttypes.h>
#include <stdio.h>

#include "fa_check.h"
#include "fa_err.h"
#include "fa_infer_route.h"
#include "gpu_int.h"

/* A tensor's pointer and strides as the kernels need them (gpu_cuda.c's check_align). */
static fa_status infer_align(const char *name, CUdeviceptr p, const int64_t *stride,
                             const int64_t *shape, size_t es, char *err, size_t errlen)
{
	if (p % FA_KERNEL_ALIGN)
		return fa_err(err, errlen, FA_EALIGN, "%s: device pointer 0x%llx is not %d-byte aligned",
		              name, (unsigned long long)p, FA_KERNEL_ALIGN);
	return fa_check_stride_align(name, shape, stride, es, FA_KERNEL_ALIGN, err, errlen);
}

/* The shapes [n0, n1, heads] of q/o and of k/v in d's layout. */
static void infer_shapes(const struct fa_attn_infer_desc *d, int64_t qshape[3], int64_t kshape[3])
{
	const struct fa_attn_fwd_desc *f = &d->fwd;
	qshape[0] = d->cu_q ? 1 : f->B;
	qshape[1] = d->cu_q ? d->total_q : f->Sq;
	qshape[2] = f->Hq;
	kshape[2] = f->Hkv;
	switch (d->kv) {
	case FA_KV_PACKED:
		kshape[0] = 1;
		kshape[1] = d->total_k;
		break;
	case FA_KV_PAGED:
		kshape[0] = d->pages;
		kshape[1] = d->page_size;
		break;
	default:
		kshape[0] = f->B;
		kshape[1] = d->cache_rows;
		break;
	}
}

/* The device copies the layout needs are there. */
static fa_status infer_index_present(const struct fa_attn_infer_desc *d,
                                     const struct fa_gpu_infer_index *ix, char *err,
                                     size_t errlen)
{
	const char *missing = NULL;
	if (d->cu_q && !ix->cu_q)
		missing = "cu_seqlens_q";
	else if (d->kv == FA_KV_PACKED && !ix->cu_k)
		missing = "cu_seqlens_k";
	else if ((d->kv == FA_KV_CACHE || d->kv == FA_KV_PAGED) && !ix->seqlens_k)
		missing = "cache_seqlens";
	else if (d->kv == FA_KV_PAGED && !ix->page_table)
		missing = "page_table";
	if (missing)
		return fa_err(err, errlen, FA_EINVAL, "%s: no device copy of the table", missing);
	return FA_OK;
}

fa_status fa_gpu_attn_infer(struct fa_gpu *g, const struct fa_attn_infer_desc *d,
                            const struct fa_gpu_infer_index *ix, CUdeviceptr q, CUdeviceptr k,
                            CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                            char *err, size_t errlen)
{
	fa_status st;
	if (!d || !ix)
		return fa_err(err, errlen, FA_EINVAL, "fa_gpu_attn_infer: no descriptor or index");
	if ((st = fa_attn_infer_check(d, err, errlen)) != FA_OK)
		return st;
	if ((st = infer_index_present(d, ix, err, errlen)) != FA_OK)
		return st;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	const size_t es = fa_dtype_size(f->dtype);
	int64_t qshape[3], kshape[3];
	infer_shapes(d, qshape, kshape);
	if ((st = infer_align("q", q, f->q_stride, qshape, es, err, errlen)) ||
	    (st = infer_align("k", k, f->k_stride, kshape, es, err, errlen)) ||
	    (st = infer_align("v", v, f->v_stride, kshape, es, err, errlen)) ||
	    (st = infer_align("o", o, f->o_stride, qshape, es, err, errlen)))
		return st;
	if (lse % 4)
		return fa_err(err, errlen, FA_EALIGN, "lse: device pointer is not 4-byte aligned");
	const struct fa_device_model *dev = fa_gpu_model(g);
	const struct fa_kernel_settings *ks = fa_gpu_settings(g);
	if (!fa_infer_decode_wanted(dev, d, ks))
		return fa_gpu_fwd_infer(g, d, ix, q, k, v, o, lse, s, err, errlen);

	struct fa_attn_fwd_desc pd;
	struct fa_decode_plan dp;
	if ((st = fa_infer_plan_decode(dev, d, ks, &pd, &dp, err, errlen)) != FA_OK)
		return st;
	struct fa_gpu_decode_layout lay = {
		.cu_q = d->cu_q ? ix->cu_q : 0,
		.cu_k = d->kv == FA_KV_PACKED ? ix->cu_k : 0,
		.seqlens_k = d->kv == FA_KV_PACKED ? 0 : ix->seqlens_k,
		.page_table = d->kv == FA_KV_PAGED ? ix->page_table : 0,
		.pt_cols = d->kv == FA_KV_PAGED ? d->pt_cols : 0,
		.kv = (int)d->kv,
		.page_size = d->kv == FA_KV_PAGED ? (int)d->page_size : 0,
	};
	return fa_gpu_decode_launch(g, &pd, &dp, &lay, q, k, v, o, lse, s, err, errlen);
}
