/* test_nvrtc_compile.c - every specialisation the planner picks compiles with NVRTC for sm_80,
 * sm_86, sm_89, sm_90, sm_100 and sm_120, without local-memory spills, within the register file
 * the plan assumed. No GPU needed; skipped (with the reason) when NVRTC cannot be loaded.
 *
 * Default: a representative sample (CI, 2 cores, well under 3 minutes). FA_GPU_GRID=full: every
 * head dim that is a multiple of 8, every dtype and precision, the planner's first three tiles.
 * The table of (spec, registers, estimate, spills, stack, shared memory) goes to stdout.
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

struct job {
	struct fa_kernel_spec spec;
	int regs_est;
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

/* The settings the planner is asked with (FA_WGMMA16=1 for the 16-bit wgmma kernel's jobs). */
static struct fa_kernel_settings plan_ks = FA_KERNEL_SETTINGS_INIT;

static void add_jobs(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m, int top)
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
	if (fa_plan(dev, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err) != FA_OK)
		fail_msg("plan %s: %s", arch, err);
	for (int i = 0; i < n && i < top; i++) {
		struct job *j = &jobs[njobs++];
		memset(j, 0, sizeof *j);
		fa_kernel_spec_make(&j->spec, dev->sm, dt, p, D, m, &t[i]);
		j->regs_est = t[i].regs;
	}
}

static int setup(void **state)
{
	(void)state;
	/* NVRTC 12.9+ caches compiled programs where a driver is installed (measured on the GPU
	 * host: a specialisation the daemon compiled earlier came back in 0.02 s with no ptxas
	 * report). The check needs ptxas to run: switch the cache off for this process. */
	setenv("CUDA_CACHE_DISABLE", "1", 1);
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

static void test_nvrtc_compiles_the_planned_specialisations_without_spills(void **state)
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
					add_jobs(archs[a], dts[d], precs[d], D, masks[(D / 8) % 3], 3);
	} else {
		/* Each (arch, dtype/precision) once, head dims and masks rotating so that the sample
		 * covers 8 (padding), 40, 64, 128, 256 and every mask. */
		const int Ds[] = {128, 64, 256, 40, 8, 160};
		int k = 0;
		for (int a = 0; a < 6; a++)
			for (int d = 0; d < 6; d++, k++)
				add_jobs(archs[a], dts[d], precs[d], Ds[k % 6], masks[k % 3], 1);
		/* and the headline shapes on sm_90 */
		add_jobs("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_NONE, 1);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_DEFAULT, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1);
		add_jobs("sm_89", FA_DTYPE_FP32, FA_PREC_DEFAULT, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1);
		/* the bf16 staging (Q converted in the kernel, FA_QIN): the headline shape, and a
		 * head dim padded to 16 (the rotation above gives it d160 only) */
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_BF16, 128, FA_MASK_NONE, 1);
		add_jobs("sm_80", FA_DTYPE_FP32, FA_PREC_BF16, 40, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1);
		/* the wgmma kernel (attn_fwd_sm90.cu, sm_90a): its first three tiles at the headline
		 * shape for tf32 and 3xtf32, and odd head dims (slices of the P V wgmma: 8..128) */
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_NONE, 3);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 128, FA_MASK_NONE, 3);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_TF32, 248, FA_MASK_CAUSAL_TOP_LEFT, 1);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 40, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1);
		/* 3xtf32 above head dim 128 (X3S: Q_lo in shared memory, the half-tile ring, P V in
		 * 64-column parts; by default above 192, with FA_WG_BC=16 above 128): 254 of 255
		 * registers at d256, so both ends and one between */
		plan_ks.wg_bc = 16;
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 256, FA_MASK_NONE, 1);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 256, FA_MASK_CAUSAL_TOP_LEFT, 1);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 200, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 136, FA_MASK_NONE, 1);
		plan_ks.wg_bc = 0;
		/* the 16-bit wgmma kernel, offered everywhere (FA_WGMMA16=1): its first two tiles
		 * (two stages, and the overlapped three-stage loop) at d64/256/72 */
		plan_ks.wgmma16 = FA_WGMMA16_ALL;
		add_jobs("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, FA_MASK_NONE, 2);
		add_jobs("sm_90", FA_DTYPE_FP16, FA_PREC_DEFAULT, 256, FA_MASK_CAUSAL_TOP_LEFT, 2);
		add_jobs("sm_90", FA_DTYPE_FP32, FA_PREC_BF16, 72, FA_MASK_CAUSAL_BOTTOM_RIGHT, 2);
		plan_ks.wgmma16 = FA_WGMMA16_MEASURED;
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
		/* wgmma kernels: ptxas must not have serialized the asynchronous MMAs */
		bool ok = j->u.regs > 0 && j->u.regs <= 255 && j->u.spill_stores == 0 &&
		          j->u.spill_loads == 0 && j->u.stack == 0 && !j->u.serialized;
		printf("%-52s %5d %5d %6d %6d %6d %8zu %6.2f%s\n", name, j->u.regs, j->regs_est,
		       j->u.spill_stores, j->u.spill_loads, j->u.stack, j->spec.tile.smem,
		       j->u.compile_s,
		       ok ? "" : j->u.serialized ? "   <-- wgmma serialized" : "   <-- spills or bad report");
		if (!ok)
			bad++;
	}
	if (bad)
		fail_msg("%d of %d specialisations failed to compile cleanly", bad, njobs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nvrtc_compiles_the_planned_specialisations_without_spills),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
