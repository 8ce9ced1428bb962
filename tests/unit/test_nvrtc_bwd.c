/* test_nvrtc_bwd.c - the backward specialisations the planner picks (kernels/planner_bwd.c)
 * compile with NVRTC for sm_80, sm_86, sm_89, sm_90, sm_100 and sm_120 (a few also as the
 * deterministic dQ's specialisation; the sliding window and softcap ones, FA_WIN / FA_SOFTCAP,
 * for every dtype and precision, on sm_90's 16-bit the wgmma kernel's narrow and wide forms),
 * and what ptxas reports
 * (registers against the planner's estimate, spills, stack). No GPU needed; skipped (with the
 * reason) when NVRTC cannot be loaded.
 *
 * Default: a representative sample (CI, 2 cores: sm_80, sm_86, sm_90, sm_120, about 30 s).
 * FA_GPU_GRID=full: every head dim that is a
 * multiple of 8, every dtype and precision, the planner's first two tiles. Spills of more than
 * 64 bytes fail where the estimate was under its cap (a tile offered because nothing lighter
 * fits may spill: it runs, slower); the table goes to stdout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_gpu.h"
#include "fa_test.h"
#include "fa_planner.h"

struct job {
	struct fa_kernel_spec spec;
	int regs_est;
	bool heavy; /* offered over the register cap: spills allowed */
	struct fa_kernel_usage u;
	fa_status st;
	char err[2048];
};

static struct fa_nvrtc *nv;
static char nv_err[512];
static struct job *jobs;
static int njobs;

/* fa_test_parallel_for's job: compile jobs[i] and keep ptxas' report. */
static void compile_one(int i)
{
	jobs[i].st = fa_nvrtc_compile(nv, &jobs[i].spec, NULL, NULL, &jobs[i].u, jobs[i].err,
	                              sizeof jobs[i].err);
}

/* FA_WGMMA16_BWD=1: the wgmma backward's tiles for every head dim it claims (auto offers
 * 64..256), as the GPU test forces them */
static struct fa_kernel_settings plan_ks = FA_KERNEL_SETTINGS_INIT; /* setup(): + that */

/* det: also the deterministic dQ's specialisation of the first tile (gpu_bwd.c asks for it with
 * rt = 2): it must compile; its spills are shown, not failed (only the deterministic mode runs
 * it, and its counters' state lies beside the 16-bit tiles' 255 registers). */
static void add_jobs_sel(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m,
                         int top, bool det, bool no_wg, bool no_wg32);
static void add_jobs_det(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m,
                         int top, bool det)
{
	add_jobs_sel(arch, dt, p, D, m, top, det, false, false);
}

/* no_wg: the planner's tiles without the wgmma backwards' (attn_bwd.cu's first where sm_90
 * offers a wgmma one first); no_wg32: without the fp32 wgmma backward's only
 * (attn_bwd_sm90_tf32.cu has no window, softcap or deterministic dQ: gpu_bwd.c and the planner
 * take the next candidate for those). */
static void add_jobs_sel(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m,
                         int top, bool det, bool no_wg, bool no_wg32)
{
	const struct fa_device_model *dev = fa_device_model_find(arch);
	struct fa_plan_req r;
	memset(&r, 0, sizeof r);
	r.dtype = dt;
	r.precision = p;
	r.D = D;
	r.mask = m;
	r.ks = &plan_ks;
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	char err[512];
	if (fa_plan_bwd(dev, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err) != FA_OK)
		fail_msg("plan %s: %s", arch, err);
	if (no_wg || no_wg32) {
		int k = 0;
		for (int i = 0; i < n; i++)
			if (!fa_kpath_is_bwdwg32(t[i].path) && !(no_wg && t[i].path == FA_KPATH_BWDWG16))
				t[k++] = t[i];
		n = k;
	}
	for (int i = 0; i < n && i < top; i++) {
		struct job *j = &jobs[njobs++];
		memset(j, 0, sizeof *j);
		fa_kernel_spec_make(&j->spec, dev->sm, dt, p, D, m, &t[i]);
		j->regs_est = t[i].regs;
		j->heavy = fa_bwd_tile_regs(&t[i], D, fa_prec_resolve(dt, p)) >= 240;
		if (det && i == 0) {
			struct job *k = &jobs[njobs++];
			*k = *j;
			struct fa_tile td = t[i];
			td.rt = 2;
			fa_kernel_spec_make(&k->spec, dev->sm, dt, p, D, m, &td);
			k->heavy = true;
			/* and the fixed-point one (rt 3, FA_DET 2) where the precision takes it */
			td.rt = 3;
			struct fa_kernel_spec fs;
			fa_kernel_spec_make(&fs, dev->sm, dt, p, D, m, &td);
			if (fs.tile.rt == 3) {
				struct job *x = &jobs[njobs++];
				*x = *j;
				x->spec = fs;
				x->heavy = true;
			}
		}
	}
}

static void add_jobs(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m, int top)
{
	add_jobs_det(arch, dt, p, D, m, top, false);
}

/* The sliding window (FA_WIN) and softcap (FA_SOFTCAP) specialisations of the planner's first
 * tile, as gpu_bwd.c asks for them (fa_kernel_spec_mask_ext of a descriptor with the window
 * and softcap), atomic and, with det, deterministic; no_wg: the first attn_bwd.cu tile (on
 * sm_90's 16-bit the planner's first is attn_bwd_sm90.cu's). */
static void add_jobs_ext_sel(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m,
                             bool window, bool softcap, bool det, bool no_wg)
{
	const int first = njobs;
	add_jobs_sel(arch, dt, p, D, m, 1, det, no_wg, window || softcap);
	struct fa_attn_fwd_desc d;
	memset(&d, 0, sizeof d);
	d.Sq = d.Sk = 4096;
	d.window = window;
	d.window_left = window ? 256 : 0;
	d.window_right = 0;
	d.softcap = softcap ? 30.0 : 0.0;
	for (int i = first; i < njobs; i++) {
		fa_kernel_spec_mask_ext(&jobs[i].spec, &d);
		assert_true(jobs[i].spec.window == window && jobs[i].spec.softcap == softcap);
	}
}

static void add_jobs_ext(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m,
                         bool window, bool softcap, bool det)
{
	add_jobs_ext_sel(arch, dt, p, D, m, window, softcap, det, false);
}

static int setup(void **state)
{
	(void)state;
	/* NVRTC 12.9+ caches compiled programs where a driver is installed (measured on the GPU
	 * host: a specialisation the daemon compiled earlier came back in 0.02 s with no ptxas
	 * report). The check needs ptxas to run: switch the cache off for this process. */
	setenv("CUDA_CACHE_DISABLE", "1", 1);
	plan_ks.wgmma16_bwd = FA_WGMMA16_ALL;
	if (fa_nvrtc_open(&nv, NULL, nv_err, sizeof nv_err) != FA_OK)
		nv = NULL;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_nvrtc_close(nv);
	free(jobs);
	return 0;
}

static void test_nvrtc_compiles_the_planned_backward_specialisations(void **state)
{
	(void)state;
	if (!nv) {
		printf("skipped: NVRTC not available: %s\n", nv_err);
		skip();
	}
	const char *grid = getenv("FA_GPU_GRID");
	bool full = grid && strcmp(grid, "full") == 0;
	/* sm_100 (B200) and sm_120 (RTX 50xx): mma.sync only (no wgmma there), NVRTC 13 targets */
	const char *archs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"};
	const fa_dtype dts[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
	                        FA_DTYPE_FP32, FA_DTYPE_FP32};
	const fa_precision precs[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
	                              FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
	const fa_mask masks[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT, FA_MASK_CAUSAL_TOP_LEFT};
	jobs = calloc(8192, sizeof *jobs);
	assert_non_null(jobs);
	if (full) {
		for (int a = 0; a < 6; a++)
			for (int d = 0; d < 6; d++)
				for (int D = 8; D <= 256; D += 8)
					add_jobs(archs[a], dts[d], precs[d], D, masks[(D / 8) % 3], 2);
		for (int a = 0; a < 6; a++) /* the window and softcap, atomic and deterministic */
			for (int d = 0; d < 6; d++)
				add_jobs_ext(archs[a], dts[d], precs[d], 128, masks[d % 3], true, true, true);
	} else {
		/* each (arch, dtype/precision) once, head dims and masks rotating: 8 (padding), 40,
		 * 64, 128, 256, 136 (padded to 160 above 128) and every mask */
		const int Ds[] = {128, 64, 256, 40, 8, 136};
		static const int sample_arch[] = {0, 1, 3, 5}; /* sm_80, sm_86, sm_90, sm_120 */
		int k = 0;
		for (int ai = 0; ai < 4; ai++) {
			const int a = sample_arch[ai];
			for (int d = 0; d < 6; d++, k++)
				add_jobs(archs[a], dts[d], precs[d], Ds[k % 6], masks[k % 3], 1);
		}
		/* the cases: fp32 head dim 256 on the H200, fp32 head dim 128 causal on
		 * 99 KiB cards, and the headline 16-bit shapes' first three tiles */
		add_jobs_det("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 256, FA_MASK_NONE, 2, true);
		add_jobs("sm_86", FA_DTYPE_FP32, FA_PREC_3XTF32, 128, FA_MASK_CAUSAL_TOP_LEFT, 1);
		add_jobs("sm_89", FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1);
		add_jobs_det("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_NONE, 3, true);
		add_jobs_det("sm_86", FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, FA_MASK_CAUSAL_TOP_LEFT, 1,
		             true);
		add_jobs("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, FA_MASK_NONE, 2);
		/* the wgmma backward (attn_bwd_sm90.cu, offered first on sm_90 for 16-bit up to head
		 * dim 128): both of its tiles (two warpgroups, one) over the head-dim splits (8: one
		 * n8 block per warpgroup's dQ; 24, 40: n16 + n8 and n16 + n8 slices; 96, 120) */
		const int wgD[] = {8, 24, 40, 96, 120};
		for (int i = 0; i < 5; i++) /* and its deterministic dQ (FA_DET) for three of them */
			add_jobs_det("sm_90", i % 2 ? FA_DTYPE_FP16 : FA_DTYPE_BF16, FA_PREC_DEFAULT,
			             wgD[i], masks[i % 3], 2, i % 2 == 0);
		/* its wide form above head dim 128 (two warpgroups on 64 keys, the head dim halved:
		 * n80 = n64 + n16, n96 = n64 + n32, n128 slices), every mask, fp16 and bf16, and its
		 * deterministic dQ; with the attn_bwd.cu tile after it */
		const int wideD[] = {136, 192, 256};
		for (int i = 0; i < 3; i++) {
			add_jobs_det("sm_90", FA_DTYPE_FP16, FA_PREC_DEFAULT, wideD[i], masks[i % 3], 2,
			             true);
			add_jobs_det("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, wideD[i], masks[(i + 1) % 3],
			             1, i == 2);
		}
		/* the window and softcap: every dtype and precision on sm_90 (window, softcap, both
		 * in turn; the deterministic dQ with a window for half of them), and on sm_80, sm_86
		 * and sm_120 */
		for (int d = 0; d < 6; d++)
			add_jobs_ext("sm_90", dts[d], precs[d], d % 2 ? 64 : 128, masks[d % 3], d % 3 != 1,
			             d % 3 != 0, d % 2 == 0);
		add_jobs_ext("sm_80", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT,
		             true, true, true);
		add_jobs_ext("sm_86", FA_DTYPE_FP32, FA_PREC_3XTF32, 128, FA_MASK_NONE, true, false,
		             false);
		add_jobs_ext("sm_120", FA_DTYPE_FP16, FA_PREC_DEFAULT, 256, FA_MASK_CAUSAL_TOP_LEFT, true,
		             true, false);
		/* the wgmma backward (attn_bwd_sm90.cu) with the window, softcap and both: its
		 * narrow form (one and two warpgroups: D 64 and 128 are its first tiles, 40 and 96
		 * under FA_WGMMA16_BWD=1) and its wide form (136, 192, 256), atomic and deterministic
		 * in turn; sm_90's attn_bwd.cu tile with both beside it */
		const int wsD[] = {128, 64, 40, 96, 136, 192, 256, 128, 256};
		for (int i = 0; i < 9; i++)
			add_jobs_ext("sm_90", i % 2 ? FA_DTYPE_FP16 : FA_DTYPE_BF16, FA_PREC_DEFAULT, wsD[i],
			             masks[i % 3], i % 3 != 1, i % 3 != 0, i % 2 == 0);
		add_jobs_ext("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT,
		             true, true, true);
		add_jobs_ext_sel("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_NONE, true, true,
		                 false, true);
	}
	fa_test_parallel_for(njobs, compile_one);

	int bad = 0;
	int major, minor;
	fa_nvrtc_version(nv, &major, &minor);
	printf("NVRTC %d.%d, %d specialisations\n", major, minor, njobs);
	printf("%-52s %5s %5s %6s %6s %6s %8s %6s\n", "specialisation", "regs", "est", "spillS",
	       "spillL", "stack", "smem", "sec");
	for (int i = 0; i < njobs; i++) {
		struct job *j = &jobs[i];
		char name[128];
		fa_kernel_spec_name(&j->spec, name, sizeof name);
		if (j->st != FA_OK) {
			printf("%-52s COMPILE ERROR: %s\n", name, j->err);
			bad++;
			continue;
		}
		bool clean = j->u.spill_stores == 0 && j->u.spill_loads == 0 && j->u.stack == 0;
		/* the backward runs at ptxas' 255 registers nearly everywhere; a few words spilled
		 * (outside the inner products: loop state) are tolerated and shown */
		bool small = j->u.spill_stores <= 64 && j->u.spill_loads <= 64;
		bool ok = j->u.regs > 0 && j->u.regs <= 255 && (clean || small || j->heavy);
		printf("%-52s %5d %5d %6d %6d %6d %8zu %6.2f%s\n", name, j->u.regs, j->regs_est,
		       j->u.spill_stores, j->u.spill_loads, j->u.stack, j->spec.tile.smem,
		       j->u.compile_s,
		       !ok ? "   <-- spills or bad report" : clean ? ""
		       : j->heavy ? "   (spills: over the register cap)" : "   (small spill)");
		if (!ok)
			bad++;
	}
	if (bad)
		fail_msg("%d of %d specialisations failed to compile cleanly", bad, njobs);
}

/* The fp32 wgmma backward (attn_bwd_sm90_tf32.cu, FA_WGMMA32_BWD=1): its tiles (two warpgroups;
 * one too at 64 and 128) for tf32 and 3xtf32 over head dims 8 (padding to 16, dS beside the images), 40, 64, 96 (K^T padded to 128
 * rows), 128 and every mask compile for sm_90a with no spill, no stack and no serialized
 * wgmma; 3xtf32 above head dim 64 has no tile (its images do not fit 227 KiB), so the planner
 * keeps attn_bwd.cu there. */
static void test_nvrtc_compiles_the_fp32_wgmma_backward_without_spills(void **state)
{
	(void)state;
	if (!nv) {
		printf("skipped: NVRTC not available: %s\n", nv_err);
		skip();
	}
	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
	ks.wgmma32_bwd = FA_WGMMA16_ALL;
	const struct fa_device_model *dev = fa_device_model_find("sm_90");
	const fa_mask masks[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT, FA_MASK_CAUSAL_TOP_LEFT};
	const int Ds[] = {8, 40, 64, 96, 128};
	struct job *wj = calloc(64, sizeof *wj);
	assert_non_null(wj);
	int nw = 0, k = 0;
	for (int pi = 0; pi < 2; pi++)
		for (int di = 0; di < 5; di++) {
			const fa_precision p = pi ? FA_PREC_3XTF32 : FA_PREC_TF32;
			/* D 64 and 128: every mask; the others one each */
			const int nm = Ds[di] == 64 || Ds[di] == 128 ? 3 : 1;
			for (int mi = 0; mi < nm; mi++, k++) {
				struct fa_plan_req r;
				memset(&r, 0, sizeof r);
				r.dtype = FA_DTYPE_FP32;
				r.precision = p;
				r.D = Ds[di];
				r.mask = nm == 3 ? masks[mi] : masks[k % 3];
				r.ks = &ks;
				struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
				int n = 0;
				char err[512];
				assert_int_equal(fa_plan_bwd(dev, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err,
				                             sizeof err), FA_OK);
				const bool want = !pi || Ds[di] <= 64;
				assert_int_equal(fa_kpath_is_bwdwg32(t[0].path), want);
				if (!want)
					continue;
				assert_int_equal(t[0].path, pi ? FA_KPATH_BWDWG32X3 : FA_KPATH_BWDWG32);
				assert_true(t[0].smem <= dev->smem_optin);
				/* two warpgroups (the first tile) and, at 64 and 128, one (the second) */
				for (int ti = 0; ti < (nm == 3 && mi == 0 ? 2 : 1); ti++) {
					assert_true(fa_kpath_is_bwdwg32(t[ti].path));
					assert_int_equal(t[ti].nw, ti ? 4 : 8);
					struct job *j = &wj[nw++];
					fa_kernel_spec_make(&j->spec, 90, FA_DTYPE_FP32, p, Ds[di], r.mask, &t[ti]);
					assert_int_equal(j->spec.tile.path, t[ti].path);
					assert_int_equal(j->spec.tile.nw, t[ti].nw);
					assert_int_equal(j->spec.tile.smem, t[ti].smem);
					j->regs_est = t[ti].regs;
					if (ti == 0) { /* the fixed-point deterministic dQ: rt 3 tf32, 4 3xtf32 */
						struct fa_tile td = t[ti];
						td.rt = pi ? 4 : 3;
						struct job *x = &wj[nw++];
						fa_kernel_spec_make(&x->spec, 90, FA_DTYPE_FP32, p, Ds[di], r.mask, &td);
						assert_int_equal(x->spec.tile.rt, td.rt);
						x->regs_est = t[ti].regs;
					}
				}
			}
		}
	for (int i = 0; i < nw; i++)
		wj[i].st = fa_nvrtc_compile(nv, &wj[i].spec, NULL, NULL, &wj[i].u, wj[i].err,
		                            sizeof wj[i].err);
	int bad = 0;
	for (int i = 0; i < nw; i++) {
		struct job *j = &wj[i];
		char name[128];
		fa_kernel_spec_name(&j->spec, name, sizeof name);
		const bool ok = j->st == FA_OK && j->u.regs > 0 && j->u.regs <= 255 &&
		                j->u.spill_stores == 0 && j->u.spill_loads == 0 && j->u.stack == 0 &&
		                !j->u.serialized;
		printf("%-56s regs %3d (est %3d) spill %d/%d stack %d smem %zu%s%s\n", name, j->u.regs,
		       j->regs_est, j->u.spill_stores, j->u.spill_loads, j->u.stack, j->spec.tile.smem,
		       j->u.serialized ? " SERIALIZED" : "", ok ? "" : "   <-- not clean");
		if (j->st != FA_OK)
			printf("  %s\n", j->err);
		bad += !ok;
	}
	free(wj);
	if (bad)
		fail_msg("%d of %d fp32 wgmma backward specialisations not clean", bad, nw);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nvrtc_compiles_the_planned_backward_specialisations),
		cmocka_unit_test(test_nvrtc_compiles_the_fp32_wgmma_backward_without_spills),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
