/* gpu_bwd.c - the backward launch API (fa_gpu_bwd.h): checks, the backward tile (planner_bwd.c),
 * the fp32 scratch, and the kernels of attn_bwd.cu (with a wgmma main pass where planned)
 * enqueued on the caller's stream.
 *
 * The sliding window and softcap (fa_attn.h) select the FA_WIN / FA_SOFTCAP specialisations
 * (fa_kernel_spec_mask_ext) of whichever main pass the plan chose, attn_bwd.cu's or the wgmma
 * one's (attn_bwd_sm90.cu), the window passed as the range of j - i with the mask folded in
 * (fa_attn_window_diffs).
 *
 * Scratch (one stream-ordered allocation per call, freed in stream order: the device's memory
 * pool keeps it, gpu_cuda.c sets its release threshold to the maximum, so repeated calls reuse
 * the same memory without a synchronisation and calls on different streams never share it):
 * lse2 and delta (fp32 [B*Hq][sqp]), the fp32 dQ accumulator ([B*Hq][sqp][padded D]; int32 in
 * fixed point), the deterministic mode's turn counters ([B*Hq][sqp / BQ][warps] ints; the fixed
 * point's packed pairs count their adds in them), the images of the fp32 wgmma backward, and
 * the fixed point's multipliers (a float per accumulator row, DP + 4 per batch and kv head),
 * sqp = Sq rounded up to the tile's query rows.
 *
 * The deterministic mode (FA_GPU_BWD_DETERMINISTIC): in fixed point (FA_DET 2, kernels/
 * fa_device.cuh) for fp16, bf16, tf32 and the bf16 staging, on every kernel: memset and
 * fa_bwd_kvscale, then the passes as atomic; by turns (FA_DET 1) for fp32 ieee and 3xtf32 on
 * attn_bwd.cu (and, under FA_BWD_DET_ROT=1, for the 16-bit wgmma backward).
 */
#include "fa_gpu_bwd.h"
#include "fa_check.h"
#include "fa_cu.h"
#include "fa_err.h"
#include "gpu_int.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* The consecutive key blocks the deterministic mode runs as one group (attn_bwd.cu) come from
 * the kernel settings (FA_BWD_DET_GROUP, fa_settings.h). Groups of one (the default): the
 * protocol measured on the H200 (kernels/PERF-NOTES.md, backward: +41% bf16, +7% fp32 against
 * the atomic mode). Groups of 2..8 (each member rotated) are built and checked by simulation
 * (order, no deadlock with the group resident: tests/unit/test_bwd_det_turns.c), predicted to
 * cut the bf16 cost by sharing Q, dO and the dQ rows in L2; the setting measures them. */
static int det_group_lg(const struct fa_kernel_settings *ks)
{
	int lg = 0;
	while (ks && (1 << (lg + 1)) <= ks->bwd_det_group && lg < 3)
		lg++;
	return lg;
}

/* attn_bwd.cu's fa_bwd_params, fa_bwd_pre_params, fa_bwd_dq_params (same order, same types). */
struct bwd_params {
	uint64_t q, k, v, dout, dk, dv, dqacc, lse2, delta, turn;
	long long qs[3], ks[3], vs[3], dos[3], dks[3], dvs[3];
	int B, Sq, Sk, Hq, Hkv, group;
	int sqp, nq;
	float sl, scale;
	int dgrp_lg;
	float scale_lo;
	uint64_t dqrow, dqcol; /* the fixed-point deterministic dQ's multipliers (FA_DET 2) */
	/* the FA_WIN / FA_SOFTCAP tail: only those specialisations declare it (the others read the
	 * 288 bytes before it) */
	int win_lo, win_hi;
	float cap_scale, cap, cap_lo, cap_log2;
};
_Static_assert(offsetof(struct bwd_params, B) == 224 &&
                   offsetof(struct bwd_params, win_lo) == 288 && sizeof(struct bwd_params) == 312,
               "backward parameter block layout");
struct bwd_pre_params {
	uint64_t o, dout, lse, lse2, delta, dqacc, turn;
	long long os[3], dos[3], ls[3];
	int B, Sq, Hq, sqp, nq, group;
	uint64_t dqrow, dqcol;
};
_Static_assert(sizeof(struct bwd_pre_params) == 168, "backward pre parameter block layout");
struct bwd_dq_params {
	uint64_t dqacc, dq;
	long long dqs[3];
	int B, Sq, Hq, sqp;
	float scale;
	int group;
	uint64_t dqrow, dqcol;
	uint64_t turn;
	int tstride, packed;
};
_Static_assert(sizeof(struct bwd_dq_params) == 96, "backward dq parameter block layout");
/* attn_bwd.cu's fa_bwd_kvs_params (same order, same types). */
struct bwd_kvs_params {
	uint64_t k, v, dqcol;
	long long ks[3], vs[3];
	int B, Sk, Hkv, pad_;
};
_Static_assert(sizeof(struct bwd_kvs_params) == 88, "backward kvscale parameter block layout");
/* attn_bwd_sm90_tf32.cu's fa_bwd_wgprep_params (same order, same types). */
struct bwd_wgprep_params {
	uint64_t q, k, v, dout, qimg, kimg;
	long long qs[3], ks[3], vs[3], dos[3];
	int B, Sq, Sk, Hq, Hkv, nq, nk, pad_;
};
_Static_assert(sizeof(struct bwd_wgprep_params) == 176, "backward images parameter block layout");

/* attn_bwd_sm90_tf32.cu's images, in floats: one step's (Q, dO, Q^T, dO^T of bq rows) and one
 * key block's (K, V of 64 keys, K^T of the head dim rounded up to 64 rows), 3xtf32 with their
 * remainders (its STBLK and KVBLK). */
static int64_t wg32_step_floats(const struct fa_tile *t, int D)
{
	const int64_t ni = t->path == FA_KPATH_BWDWG32X3 ? 2 : 1;
	return ni * 4 * t->br * fa_bwd_padded_d(t->path, D);
}
static int64_t wg32_kblk_floats(const struct fa_tile *t, int D)
{
	const int64_t ni = t->path == FA_KPATH_BWDWG32X3 ? 2 : 1;
	return ni * (2 * 64 * fa_bwd_padded_d(t->path, D) + (D + 63) / 64 * 64 * 64);
}

static fa_status cu_fail(fa_cu_res r, const char *what, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s: CUDA error %d (%s)", what, r, fa_cu_errstr(r));
	return r == FA_CU_ERROR_OUT_OF_MEMORY ? FA_ENOMEM : FA_EDEVICE;
}

static fa_status check_align(const char *name, CUdeviceptr p, const int64_t *stride,
                             const int64_t *shape, size_t es, char *err, size_t errlen)
{
	if (p % FA_KERNEL_ALIGN)
		return fa_err(err, errlen, FA_EALIGN, "%s: device pointer 0x%llx is not %d-byte aligned",
		              name, (unsigned long long)p, FA_KERNEL_ALIGN);
	return fa_check_stride_align(name, shape, stride, es, FA_KERNEL_ALIGN, err, errlen);
}

fa_status fa_gpu_plan_bwd(struct fa_gpu *g, const struct fa_attn_bwd_desc *d, struct fa_tile *out,
                          int max, int *n, char *err, size_t errlen)
{
	struct fa_plan_req r;
	fa_plan_req_from_desc(&d->fwd, &r);
	r.ks = fa_gpu_settings(g);
	return fa_plan_bwd(fa_gpu_model(g), &r, out, max, n, err, errlen);
}

fa_status fa_gpu_attn_bwd_tile(struct fa_gpu *g, const struct fa_attn_bwd_desc *d,
                               const struct fa_tile *tile, const struct fa_gpu_bwd_ptrs *p,
                               unsigned flags, CUstream s, char *err, size_t errlen)
{
	const struct fa_attn_fwd_desc *f = &d->fwd;
	fa_status st = fa_attn_bwd_check(d, err, errlen);
	if (st != FA_OK)
		return st;
	if (!p || !p->q || !p->k || !p->v || !p->o || !p->dout || !p->lse || !p->dq || !p->dk ||
	    !p->dv)
		return fa_err(err, errlen, FA_EINVAL,
		              "backward: a NULL device pointer (q, k, v, o, dO, lse, dQ, dK, dV are all "
		              "required; lse is the forward's)");
	if (flags & ~(unsigned)(FA_GPU_BWD_DETERMINISTIC | FA_GPU_BWD_PREPARE))
		return fa_err(err, errlen, FA_EINVAL, "backward: unknown flags 0x%x", flags);
	if (f->B > 65535 || f->Hkv > 65535 || f->Sq > INT32_MAX / 2 || f->Sk > INT32_MAX / 2)
		return fa_err(err, errlen, FA_ESHAPE,
		              "shape too large for the kernel's grid: B=%lld (max 65535), Hkv=%lld "
		              "(max 65535), Sq=%lld, Sk=%lld (max 2^30)", (long long)f->B,
		              (long long)f->Hkv, (long long)f->Sq, (long long)f->Sk);
	const size_t es = fa_dtype_size(f->dtype);
	const int64_t qsh[3] = {f->B, f->Sq, f->Hq}, ksh[3] = {f->B, f->Sk, f->Hkv};
	if ((st = check_align("q", p->q, f->q_stride, qsh, es, err, errlen)) ||
	    (st = check_align("k", p->k, f->k_stride, ksh, es, err, errlen)) ||
	    (st = check_align("v", p->v, f->v_stride, ksh, es, err, errlen)) ||
	    (st = check_align("o", p->o, f->o_stride, qsh, es, err, errlen)) ||
	    (st = check_align("dO", p->dout, d->do_stride, qsh, es, err, errlen)) ||
	    (st = check_align("dQ", p->dq, d->dq_stride, qsh, es, err, errlen)) ||
	    (st = check_align("dK", p->dk, d->dk_stride, ksh, es, err, errlen)) ||
	    (st = check_align("dV", p->dv, d->dv_stride, ksh, es, err, errlen)))
		return st;
	if (p->lse % 4)
		return fa_err(err, errlen, FA_EALIGN, "lse: device pointer is not 4-byte aligned");

	struct fa_tile t;
	const bool det = (flags & FA_GPU_BWD_DETERMINISTIC) != 0;
	const fa_precision prec = fa_prec_resolve(f->dtype, f->precision);
	/* The deterministic dQ: in fixed point (FA_DET 2, rt 3: int32 adds in the atomic mode's
	 * grid and order, fa_device.cuh) wherever the precision's own error is above fp32's: fp16,
	 * bf16, tf32, the bf16 staging; fp32 ieee and 3xtf32 by turns (FA_DET 1, rt 2). */
	const bool dqint_prec = det && !(f->dtype == FA_DTYPE_FP32 &&
	                                 (prec == FA_PREC_IEEE || prec == FA_PREC_3XTF32));
	const struct fa_kernel_settings *kset = fa_gpu_settings(g);
	/* FA_BWD_DET_ROT: the 16-bit wgmma backward's turns (the rotated order where it fits) */
	const bool turns16 = kset != NULL && kset->bwd_det_rot;
	/* the fp32 wgmma backward (attn_bwd_sm90_tf32.cu) has no window or softcap (its
	 * deterministic dQ is the fixed point's: 32-bit in tf32, 64-bit in 3xtf32): the planner's
	 * next candidate (an attn_bwd.cu tile) serves those; the 16-bit wgmma backward has both */
	const bool wg32_ok = !fa_attn_window_active(f) && !(f->softcap > 0) &&
	                     (!det || prec == FA_PREC_TF32 || prec == FA_PREC_3XTF32);
	if (tile) {
		t = *tile;
		if (!fa_kpath_is_bwd(t.path) || !fa_bwd_tile_layout_ok(&t, (int)f->D))
			return fa_err(err, errlen, FA_EINVAL, "backward: not a backward tile for head dim %d",
			              (int)f->D);
		if (t.path == FA_KPATH_BWDWG16 && (f->dtype == FA_DTYPE_FP32 || fa_gpu_sm(g) != 90))
			return fa_err(err, errlen, FA_EINVAL,
			              "backward: the wgmma tile takes fp16 / bf16 on sm_90 (this is %s on "
			              "sm_%d)", f->dtype == FA_DTYPE_FP32 ? "fp32" : "16-bit", fa_gpu_sm(g));
		if (fa_kpath_is_bwdwg32(t.path) &&
		    (!wg32_ok || f->dtype != FA_DTYPE_FP32 || fa_gpu_sm(g) != 90 ||
		     prec != (t.path == FA_KPATH_BWDWG32X3 ? FA_PREC_3XTF32 : FA_PREC_TF32)))
			return fa_err(err, errlen, FA_EINVAL,
			              "backward: the fp32 wgmma tile takes fp32 in its precision (%s) on "
			              "sm_90, without a window or softcap (this is %s %s on sm_%d%s%s%s)",
			              t.path == FA_KPATH_BWDWG32X3 ? "3xtf32" : "tf32",
			              f->dtype == FA_DTYPE_FP32 ? "fp32" : "16-bit", fa_prec_name(prec),
			              fa_gpu_sm(g), det ? ", deterministic" : "",
			              fa_attn_window_active(f) ? ", a window" : "",
			              f->softcap > 0 ? ", softcap" : "");
	} else {
		/* the planner's first, but past an fp32 wgmma tile when the call needs what that
		 * kernel lacks (above); the window and softcap run on every other backward kernel */
		struct fa_tile cand[FA_PLAN_MAX_CANDIDATES];
		int n = 0, i = 0;
		if ((st = fa_gpu_plan_bwd(g, d, cand, FA_PLAN_MAX_CANDIDATES, &n, err, errlen)))
			return st;
		while (i + 1 < n && fa_kpath_is_bwdwg32(cand[i].path) && !wg32_ok)
			i++;
		t = cand[i];
	}
	const bool wg32 = fa_kpath_is_bwdwg32(t.path);
	const bool wgp = t.path == FA_KPATH_BWDWG16 || wg32;
	const bool dqint = dqint_prec && !(turns16 && t.path == FA_KPATH_BWDWG16);
	/* attn_bwd_sm90_tf32.cu's 3xtf32: the fixed point in 64 bits (FA_DET 3, rt 4: an int64
	 * accumulator); fixed: either, for the plumbing they share */
	const bool dqint64 = det && t.path == FA_KPATH_BWDWG32X3;
	const bool fixed = dqint || dqint64;
	struct fa_kernel_spec spec;
	/* the deterministic dQ is its own specialisation (FA_DET, every kernel): 3 fixed point, 2
	 * turns */
	t.rt = dqint64 ? 4 : dqint ? 3 : det ? 2 : 1;
	fa_kernel_spec_make(&spec, fa_gpu_sm(g), f->dtype, f->precision, (int)f->D, f->mask, &t);
	fa_kernel_spec_mask_ext(&spec, f); /* FA_WIN (the mask folded in), FA_SOFTCAP */
	if (spec.tile.smem > fa_gpu_smem_optin(g)) {
		char tb[48];
		fa_tile_format(&spec.tile, tb, sizeof tb);
		return fa_err(err, errlen, FA_ENOFIT,
		              "backward tile %s needs %zu bytes of shared memory, %s allows %zu", tb,
		              spec.tile.smem, fa_gpu_name(g), fa_gpu_smem_optin(g));
	}
	if ((st = fa_gpu_make_current(g, err, errlen)))
		return st;
	struct fa_gpu_bwd_funcs fn;
	if ((st = fa_gpu_bwd_kernels(g, &spec, &fn, err, errlen)))
		return st;
	/* the wgmma main pass runs between attn_bwd.cu's pre and dq passes of the same query rows
	 * per step (64: the accumulator's and lse2's rows) and padded head dim, from an attn_bwd.cu
	 * tile whose warp layout takes the head dim (compiled and cached like any other) */
	int pre_nw = spec.tile.nw;
	if (wgp) {
		struct fa_tile ct = {0};
		ct.path = wg32 ? FA_KPATH_BWD32 : FA_KPATH_BWD16; /* fp32: the same precision's lse2 */
		ct.rt = dqint64 ? 4 : dqint ? 3 : 1; /* fixed point: its pre, kvscale and dq passes */
		ct.bc = 64;
		ct.br = 64;
		ct.stages = 1;
		for (ct.nw = 8; ct.nw >= 2 && !fa_bwd_tile_layout_ok(&ct, (int)f->D); ct.nw /= 2)
			;
		if (ct.nw < 2)
			return fa_err(err, errlen, FA_EINTERNAL, "backward: no pre/dq pass for head dim %d",
			              (int)f->D);
		struct fa_kernel_spec cs;
		fa_kernel_spec_make(&cs, fa_gpu_sm(g), f->dtype, f->precision, (int)f->D, f->mask, &ct);
		struct fa_gpu_bwd_funcs cf;
		if ((st = fa_gpu_bwd_kernels(g, &cs, &cf, err, errlen)))
			return st;
		fn.pre = cf.pre;
		fn.dq = cf.dq;
		fn.kvs = cf.kvs;
		if (wg32 && !fn.prep)
			return fa_err(err, errlen, FA_EINTERNAL, "backward: fa_bwd_wgprep not loaded");
		pre_nw = cs.tile.nw;
	}
	if (flags & FA_GPU_BWD_PREPARE)
		return FA_OK; /* every pass is loaded: nothing to enqueue */

	const int bq = spec.tile.br, bkv = spec.tile.bc;
	/* deterministic: groups of FA_BWD_DET_GROUP consecutive key blocks run together
	 * (attn_bwd.cu, det_member); a group's members wait on each other, so a group may not be
	 * larger than the blocks that can be resident at once (else groups of one) */
	int dgrp_lg = wgp ? 0 : det_group_lg(kset); /* attn_bwd_sm90.cu: groups of one */
	const int64_t nkv64 = (f->Sk + bkv - 1) / bkv;
	/* attn_bwd_sm90.cu's rotated order (det_rot) on the atomic grid: a key block may wait on
	 * later ones of its (batch, kv head), so all nk of them must be resident together; with
	 * nk at most a quarter of the resident blocks, even four such backwards side by side on
	 * one GPU (other streams, other processes) cannot fill it with partly launched heads.
	 * Longer key sequences take the chain (key block slowest, waits only on earlier blocks). */
	bool det_rot = false;
	{
		const struct fa_device_model *m = fa_gpu_model(g);
		const int bps = spec.tile.blocks_per_sm > 0 ? spec.tile.blocks_per_sm : 1;
		if ((int64_t)m->sm_count * bps < (1 << dgrp_lg))
			dgrp_lg = 0;
		/* (the wide form, head dims above 128, has the chain only, and so has the window:
		 * the rotated order's ranks, det_rank, assume that a query block's key blocks are a
		 * prefix, and a window's start past 0). OFF unless
		 * FA_BWD_DET_ROT=1, an experiment: on the H200 (2026-12-03) its dQ/dK/dV differed from
		 * the atomic mode's beyond the tolerance in every case without a mask (the causal
		 * ones passed, all gave the same bits five times), and it measured +16..37% against
		 * the atomic mode where the chain measures +18..38%: kernels/RESULTS.md. */
		det_rot = turns16 && det && !fixed && wgp && f->D <= 128 && !spec.window &&
		          4 * nkv64 <= (int64_t)m->sm_count * bps;
	}
	const int64_t ngroups = (nkv64 + (1 << dgrp_lg) - 1) >> dgrp_lg;
	const bool chain = det && !fixed && !det_rot; /* the grid with the key block slowest */
	if (chain && ngroups > 65535)
		return fa_err(err, errlen, FA_ESHAPE,
		              "deterministic backward: Sk=%lld makes %lld groups of %d key blocks of %d, "
		              "the grid's third dimension takes 65535", (long long)f->Sk,
		              (long long)ngroups, 1 << dgrp_lg, bkv);
	const int64_t dp = fa_bwd_padded_d(spec.tile.path, (int)f->D);
	const int64_t nq = (f->Sq + bq - 1) / bq, sqp = nq * bq;
	const int64_t rows = f->B * f->Hq * sqp;
	const size_t b_row = (size_t)rows * 4, b_acc = (size_t)(rows * dp) * (dqint64 ? 8 : 4);
	const size_t b_turn = (size_t)(f->B * f->Hq * nq * pre_nw) * 4; /* one per warp */
	const size_t a_row = (b_row + 255) / 256 * 256, a_acc = (b_acc + 255) / 256 * 256;
	const size_t a_turn = (b_turn + 255) / 256 * 256;
	/* attn_bwd_sm90_tf32.cu: its images of Q, dO (per query head and block) and K, V (per kv
	 * head and key block of 64), after the rest */
	const size_t b_qimg = wg32 ? (size_t)(f->B * f->Hq * nq * wg32_step_floats(&spec.tile,
	                                                                             (int)f->D)) * 4
	                           : 0;
	const size_t b_kimg = wg32 ? (size_t)(f->B * f->Hkv * nkv64 *
	                                      wg32_kblk_floats(&spec.tile, (int)f->D)) * 4
	                           : 0;
	const size_t a_qimg = (b_qimg + 255) / 256 * 256;
	/* the fixed point's row multipliers (one per accumulator row) and, per (batch, kv head),
	 * its column multipliers and |V|'s bound (attn_bwd.cu's DQC = DP + 4 floats) */
	const size_t b_dqcol = fixed ? (size_t)(f->B * f->Hkv * (dp + 4)) * 4 : 0;
	const size_t a_dqrow = fixed ? a_row : 0, a_dqcol = (b_dqcol + 255) / 256 * 256;
	const size_t total = 2 * a_row + a_acc + a_turn + a_qimg + b_kimg + a_dqrow + a_dqcol;
	CUdeviceptr scratch = 0;
	fa_cu_res r = fa_cu->MemAllocAsync(&scratch, total, (fa_cu_stream)s);
	if (r) {
		snprintf(err, errlen, "backward scratch: %zu bytes of device memory (lse2, delta, the "
		         "fp32 dQ accumulator) could not be allocated: CUDA error %d (%s)", total, r,
		         fa_cu_errstr(r));
		return r == FA_CU_ERROR_OUT_OF_MEMORY ? FA_ENOMEM : FA_EDEVICE;
	}
	const CUdeviceptr lse2 = scratch, delta = scratch + a_row, acc = scratch + 2 * a_row;
	const CUdeviceptr turn = acc + a_acc;
	const CUdeviceptr qimg = turn + a_turn, kimg = qimg + a_qimg;
	const CUdeviceptr dqrow = kimg + (b_kimg + 255) / 256 * 256, dqcol = dqrow + a_dqrow;
	const char *what = "launching fa_bwd_pre";
	if (fixed) { /* the maxima of |K_jd| and |V_j|^2 per (batch, kv head), atomicMax from 0 */
		what = "zeroing the fixed point's maxima";
		r = fa_cu->MemsetD8Async(dqcol, 0, b_dqcol, (fa_cu_stream)s);
		struct bwd_kvs_params kp;
		memset(&kp, 0, sizeof kp);
		kp.k = p->k;
		kp.v = p->v;
		kp.dqcol = dqcol;
		for (int i = 0; i < 3; i++) {
			kp.ks[i] = f->k_stride[i];
			kp.vs[i] = f->v_stride[i];
		}
		kp.B = (int)f->B;
		kp.Sk = (int)f->Sk;
		kp.Hkv = (int)f->Hkv;
		void *a0[] = {&kp};
		if (r == 0 && f->Sk > 0) {
			what = "launching fa_bwd_kvscale";
			r = fa_cu->LaunchKernel(fn.kvs, (unsigned)((f->Sk + 63) / 64), (unsigned)f->Hkv,
			                        (unsigned)f->B, 256, 1, 1, 0, (fa_cu_stream)s, a0, NULL);
		}
		if (r == 0)
			what = "launching fa_bwd_pre";
	}

	struct bwd_pre_params pp;
	memset(&pp, 0, sizeof pp);
	pp.o = p->o;
	pp.dout = p->dout;
	pp.lse = p->lse;
	pp.lse2 = lse2;
	pp.delta = delta;
	pp.dqacc = acc;
	pp.turn = turn;
	for (int i = 0; i < 3; i++) {
		pp.os[i] = f->o_stride[i];
		pp.dos[i] = d->do_stride[i];
		pp.ls[i] = f->lse_stride[i];
	}
	pp.B = (int)f->B;
	pp.Sq = (int)f->Sq;
	pp.Hq = (int)f->Hq;
	pp.sqp = (int)sqp;
	pp.nq = (int)nq;
	pp.group = (int)(f->Hq / f->Hkv);
	pp.dqrow = dqrow;
	pp.dqcol = dqcol;
	void *a1[] = {&pp};
	if (r == 0)
		r = fa_cu->LaunchKernel(fn.pre, (unsigned)((rows + 7) / 8), 1, 1, 256, 1, 1, 0,
		                        (fa_cu_stream)s, a1, NULL);
	if (r == 0 && wg32) {
		struct bwd_wgprep_params ip;
		memset(&ip, 0, sizeof ip);
		ip.q = p->q;
		ip.k = p->k;
		ip.v = p->v;
		ip.dout = p->dout;
		ip.qimg = qimg;
		ip.kimg = kimg;
		for (int i = 0; i < 3; i++) {
			ip.qs[i] = f->q_stride[i];
			ip.ks[i] = f->k_stride[i];
			ip.vs[i] = f->v_stride[i];
			ip.dos[i] = d->do_stride[i];
		}
		ip.B = (int)f->B;
		ip.Sq = (int)f->Sq;
		ip.Sk = (int)f->Sk;
		ip.Hq = (int)f->Hq;
		ip.Hkv = (int)f->Hkv;
		ip.nq = (int)nq;
		ip.nk = (int)nkv64;
		/* one thread per 16 bytes of the hi images, grid-strided */
		const int64_t chunks = (int64_t)(b_qimg + b_kimg) / 16 /
		                       (spec.tile.path == FA_KPATH_BWDWG32X3 ? 2 : 1);
		int64_t blocks = (chunks + 255) / 256;
		if (blocks > 132 * 16)
			blocks = 132 * 16;
		void *a4[] = {&ip};
		r = fa_cu->LaunchKernel(fn.prep, (unsigned)(blocks > 0 ? blocks : 1), 1, 1, 256, 1, 1,
		                        0, (fa_cu_stream)s, a4, NULL);
		what = "launching fa_bwd_wgprep";
	}
	if (r == 0) {
		struct bwd_params mp;
		memset(&mp, 0, sizeof mp);
		mp.q = wg32 ? qimg : p->q; /* attn_bwd_sm90_tf32.cu reads its images */
		mp.k = wg32 ? kimg : p->k;
		mp.v = p->v;
		mp.dout = p->dout;
		mp.dk = p->dk;
		mp.dv = p->dv;
		mp.dqacc = acc;
		mp.lse2 = lse2;
		mp.delta = delta;
		mp.turn = turn;
		for (int i = 0; i < 3; i++) {
			mp.qs[i] = f->q_stride[i];
			mp.ks[i] = f->k_stride[i];
			mp.vs[i] = f->v_stride[i];
			mp.dos[i] = d->do_stride[i];
			mp.dks[i] = d->dk_stride[i];
			mp.dvs[i] = d->dv_stride[i];
		}
		mp.B = (int)f->B;
		mp.Sq = (int)f->Sq;
		mp.Sk = (int)f->Sk;
		mp.Hq = (int)f->Hq;
		mp.Hkv = (int)f->Hkv;
		mp.group = (int)(f->Hq / f->Hkv);
		mp.sqp = (int)sqp;
		mp.nq = (int)nq;
		mp.sl = (float)(f->scale * 1.4426950408889634);
		mp.scale = (float)f->scale;
		mp.scale_lo = (float)(f->scale - (double)mp.scale);
		mp.dqrow = dqrow;
		mp.dqcol = dqcol;
		/* attn_bwd_sm90.cu reads this field as the turn counters' stride per query block (the
		 * pre pass zeroes pre_nw of them, at most 8) and, in bit 8, the rotated order */
		mp.dgrp_lg = wgp ? pre_nw | (det_rot ? 1 << 8 : 0) : dgrp_lg;
		if (spec.window) {
			int64_t lo, hi;
			fa_attn_window_diffs(f, &lo, &hi);
			mp.win_lo = (int)lo;
			mp.win_hi = (int)hi;
		}
		if (spec.softcap) {
			mp.cap_scale = (float)(f->scale / f->softcap);
			mp.cap = (float)f->softcap;
			mp.cap_lo = (float)(f->softcap - (double)mp.cap);
			mp.cap_log2 = (float)(f->softcap * 1.4426950408889634);
		}
		void *a2[] = {&mp};
		/* atomic, fixed point and the rotated order: (key block, kv head, batch); the chain:
		 * (group member + kv head x group size, batch, group), the members fastest (those
		 * past the last key block return) */
		/* attn_bwd_sm90.cu's wide form (16-bit, head dims above 128) may run in clusters of
		 * two key blocks (FA_WIDE_CL): its grid is rounded up to pairs, and without clusters
		 * the extra block returns at once */
		const bool pairs = t.path == FA_KPATH_BWDWG16 && f->D > 128 && !chain;
		const unsigned nkv = (unsigned)(pairs ? (nkv64 + 1) & ~(int64_t)1 : nkv64);
		const unsigned hkv = (unsigned)f->Hkv, nb = (unsigned)f->B;
		r = fa_cu->LaunchKernel(fn.main, chain ? hkv << dgrp_lg : nkv,
		                        chain ? nb : hkv, chain ? (unsigned)ngroups : nb,
		                        (unsigned)(32 * spec.tile.nw), 1, 1, (unsigned)spec.tile.smem,
		                        (fa_cu_stream)s, a2, NULL);
		what = "launching fa_bwd_main";
	}
	if (r == 0) {
		struct bwd_dq_params qp;
		memset(&qp, 0, sizeof qp);
		qp.dqacc = acc;
		qp.dq = p->dq;
		for (int i = 0; i < 3; i++)
			qp.dqs[i] = d->dq_stride[i];
		qp.B = (int)f->B;
		qp.Sq = (int)f->Sq;
		qp.Hq = (int)f->Hq;
		qp.sqp = (int)sqp;
		qp.scale = (float)f->scale;
		qp.group = (int)(f->Hq / f->Hkv);
		qp.dqrow = dqrow;
		qp.dqcol = dqcol;
		/* attn_bwd.cu and attn_bwd_sm90.cu's narrow form (64-row query blocks, as the dq
		 * pass's module) add packed pairs, counted per query block in the first turn counter
		 * of each */
		qp.turn = turn;
		qp.tstride = pre_nw;
		qp.packed = dqint && (!wgp || (spec.tile.path == FA_KPATH_BWDWG16 && f->D <= 128));
		int64_t pairs = f->B * f->Hq * f->Sq * (f->D / 2);
		int64_t blocks = (pairs + 255) / 256;
		if (blocks > 132 * 32)
			blocks = 132 * 32;
		void *a3[] = {&qp};
		r = fa_cu->LaunchKernel(fn.dq, (unsigned)blocks, 1, 1, 256, 1, 1, 0, (fa_cu_stream)s,
		                        a3, NULL);
		what = "launching fa_bwd_dq";
	}
	fa_cu->MemFreeAsync(scratch, (fa_cu_stream)s);
	if (r)
		return cu_fail(r, what, err, errlen);
	return FA_OK;
}

fa_status fa_gpu_attn_bwd(struct fa_gpu *g, const struct fa_attn_bwd_desc *d,
                          const struct fa_gpu_bwd_ptrs *p, unsigned flags, CUstream s, char *err,
                          size_t errlen)
{
	return fa_gpu_attn_bwd_tile(g, d, NULL, p, flags, s, err, errlen);
}
