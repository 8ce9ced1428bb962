/* gpu_fwd_infer.c - fa_gpu_fwd_infer (fa_gpu_infer.h): the prefill forward over the inference
 * layouts (packed varlen queries and keys, a contiguous KV cache with per-sequence lengths, a
 * paged KV cache; dense or packed queries), on the mma.sync kernel of attn_fwd.cu specialised
 * with FA_LAYOUT.
 *
 * The host copies of the index tables in the descriptor plan the launch: the longest sequence's
 * query and key counts choose the tile (the planner's first mma.sync candidate for that shape)
 * and the grid (query tiles of the longest sequence x Hq x B: blocks past their own sequence's
 * end exit at once). The kernel reads only the device copies (struct fa_gpu_infer_index). A
 * sliding window goes to the kernel as its two sides, each block resolving its own sequence's
 * range (FlashAttention's rule per sequence: fa_attn_key_range); softcap as the dense one. The
 * wgmma kernel (attn_fwd_sm90.cu) has no layout mode: its K/V images are prepared per dense
 * (batch, head), so every inference shape runs on mma.sync, whatever FA_WGMMA says.
 */
#include "fa_gpu_infer.h"
#include "fa_check.h"
#include "fa_err.h"
#include "gpu_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* attn_fwd.cu's struct fa_lparams (same order, same types). */
struct fa_lparams {
	uint64_t cu_q, cu_k, seqlens_k, page_table;
	long long pt_cols;
	int page_size;
	unsigned page_magic;
};
_Static_assert(sizeof(struct fa_lparams) == 48, "layout parameter block");

static fa_status check_align(const char *name, CUdeviceptr p, const int64_t *stride,
                             const int64_t *shape, size_t es, char *err, size_t errlen)
{
	if (p % FA_KERNEL_ALIGN)
		return fa_err(err, errlen, FA_EALIGN, "%s: device pointer 0x%llx is not %d-byte aligned",
		              name, (unsigned long long)p, FA_KERNEL_ALIGN);
	return fa_check_stride_align(name, shape, stride, es, FA_KERNEL_ALIGN, err, errlen);
}

/* The longest sequence's query and key counts, from the host copies (d checked). */
static void longest(const struct fa_attn_infer_desc *d, int64_t *sq, int64_t *sk)
{
	*sq = 0;
	*sk = 0;
	for (int64_t b = 0; b < d->fwd.B; b++) {
		int64_t q, k;
		fa_attn_infer_lengths(d, b, &q, &k);
		*sq = q > *sq ? q : *sq;
		*sk = k > *sk ? k : *sk;
	}
}

/* Every device table the layout reads must be there (a host copy without its device copy is the
 * caller's mistake, not something to launch on). */
static fa_status check_index(const struct fa_attn_infer_desc *d, const struct fa_gpu_infer_index *ix,
                             char *err, size_t errlen)
{
	const char *miss = !ix                                           ? "the device index tables"
	                   : d->cu_q && !ix->cu_q                        ? "cu_seqlens_q"
	                   : d->kv == FA_KV_PACKED && !ix->cu_k          ? "cu_seqlens_k"
	                   : d->kv != FA_KV_PACKED && !ix->seqlens_k     ? "cache_seqlens"
	                   : d->kv == FA_KV_PAGED && !ix->page_table     ? "page_table"
	                                                                 : NULL;
	if (miss)
		return fa_err(err, errlen, FA_EINVAL, "inference forward: no device copy of %s", miss);
	return FA_OK;
}

fa_status fa_plan_fwd_infer(const struct fa_device_model *dev, const struct fa_kernel_settings *ks,
                            const struct fa_attn_fwd_desc *d, int64_t Sq, int64_t Sk, int layout,
                            struct fa_kernel_spec *spec, char *err, size_t errlen)
{
	struct fa_attn_fwd_desc pd = *d;
	pd.Sq = Sq > 0 ? Sq : 1;
	pd.Sk = Sk > 0 ? Sk : 1;
	struct fa_kernel_settings k = ks ? *ks : *fa_kernel_settings_default();
	k.wgmma = false;
	struct fa_plan_req req;
	fa_plan_req_from_desc(&pd, &req);
	req.ks = &k;
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	fa_status st = fa_plan(dev, &req, t, FA_PLAN_MAX_CANDIDATES, &n, err, errlen);
	if (st != FA_OK)
		return st;
	int pick = 0;
	if (layout == FA_KLAYOUT_PAGED)
		for (int i = 0; i < n; i++)
			if (t[i].regs < 250 && !(t[i].path == FA_KPATH_32 && t[i].bc == 128) &&
			    t[i].smem + fa_klayout_smem(&t[i], layout) <= dev->smem_optin) {
				pick = i;
				break;
			}
	fa_kernel_spec_make(spec, dev->sm, d->dtype, d->precision, (int)d->D, d->mask, &t[pick]);
	/* the window and softcap: a window that bounds nothing at the longest lengths bounds no
	 * sequence (fa_attn_window_active), so that batch runs the kernel without FA_WIN */
	fa_kernel_spec_mask_ext(spec, &pd);
	spec->layout = layout;
	spec->tile.smem += fa_klayout_smem(&spec->tile, layout);
	return FA_OK;
}

fa_status fa_gpu_fwd_infer(struct fa_gpu *g, const struct fa_attn_infer_desc *d,
                           const struct fa_gpu_infer_index *ix, CUdeviceptr q, CUdeviceptr k,
                           CUdeviceptr v, CUdeviceptr o, CUdeviceptr lse, CUstream s,
                           char *err, size_t errlen)
{
	fa_status st = fa_attn_infer_check(d, err, errlen);
	if (st != FA_OK)
		return st;
	const struct fa_attn_fwd_desc *f = &d->fwd;
	if ((st = check_index(d, ix, err, errlen)))
		return st;
	int64_t sq, sk;
	longest(d, &sq, &sk);
	if (f->B > 65535 || f->Hq > 65535 || f->Sq > INT32_MAX / 2 || f->Sk > INT32_MAX / 2)
		return fa_err(err, errlen, FA_ESHAPE,
		              "shape too large for the kernel's grid: B=%lld sequences (max 65535), "
		              "Hq=%lld (max 65535), max_seqlen_q=%lld, max_seqlen_k=%lld (max 2^30)",
		              (long long)f->B, (long long)f->Hq, (long long)f->Sq, (long long)f->Sk);
	const bool packed_q = d->cu_q != NULL;
	const size_t es = fa_dtype_size(f->dtype);
	const int64_t qshape[3] = {packed_q ? 1 : f->B, packed_q ? d->total_q : f->Sq, f->Hq};
	int64_t kshape[3] = {1, d->total_k, f->Hkv};
	if (d->kv == FA_KV_CACHE) {
		kshape[0] = f->B;
		kshape[1] = d->cache_rows;
	} else if (d->kv == FA_KV_PAGED) {
		kshape[0] = d->pages;
		kshape[1] = d->page_size;
	}
	if ((st = check_align("q", q, f->q_stride, qshape, es, err, errlen)) ||
	    (st = check_align("k", k, f->k_stride, kshape, es, err, errlen)) ||
	    (st = check_align("v", v, f->v_stride, kshape, es, err, errlen)) ||
	    (st = check_align("o", o, f->o_stride, qshape, es, err, errlen)))
		return st;
	if (lse % 4)
		return fa_err(err, errlen, FA_EALIGN, "lse: device pointer is not 4-byte aligned");
	if (sq == 0)
		return FA_OK; /* no sequence has a query: nothing to write */

	struct fa_kernel_spec spec;
	if ((st = fa_plan_fwd_infer(fa_gpu_model(g), fa_gpu_settings(g), f, sq, sk,
	                            d->kv == FA_KV_PAGED ? FA_KLAYOUT_PAGED : FA_KLAYOUT_SEQ, &spec,
	                            err, errlen)))
		return st;
	if (spec.tile.smem > fa_gpu_smem_optin(g)) {
		char tb[48];
		fa_tile_format(&spec.tile, tb, sizeof tb);
		return fa_err(err, errlen, FA_ENOFIT,
		              "tile %s needs %zu bytes of shared memory, %s allows %zu", tb,
		              spec.tile.smem, fa_gpu_name(g), fa_gpu_smem_optin(g));
	}
	if ((st = fa_gpu_make_current(g, err, errlen)))
		return st;

	struct fa_lparams lp;
	memset(&lp, 0, sizeof lp);
	lp.cu_q = packed_q ? ix->cu_q : 0;
	lp.cu_k = d->kv == FA_KV_PACKED ? ix->cu_k : 0;
	lp.seqlens_k = d->kv == FA_KV_PACKED ? 0 : ix->seqlens_k;
	if (d->kv == FA_KV_PAGED) {
		lp.page_table = ix->page_table;
		lp.pt_cols = d->pt_cols;
		lp.page_size = (int)d->page_size;
		lp.page_magic = 0xffffffffu / (unsigned)d->page_size;
	}
	struct fa_gpu_seq_launch l = {
		.spec = &spec,
		.d = f,
		.kv_shape = {kshape[0], kshape[1], kshape[2]},
		.q = q,
		.k = k,
		.v = v,
		.o = o,
		.lse = lse,
		.lparams = &lp,
		.grid_x = (unsigned)((sq + spec.tile.br - 1) / spec.tile.br),
	};
	return fa_gpu_fwd_seq(g, &l, s, err, errlen);
}
