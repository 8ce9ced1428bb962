/* test_nvrtc_bwd_window.c - the backward's window and softcap specialisations (attn_bwd.cu's
 * FA_WIN, FA_SOFTCAP) compile with NVRTC for the planner's first tile of a sample of shapes
 * (every dtype and fp32 precision, 16-bit and fp32 head dims up to 256, sm_80 to sm_120), and
 * spill no more than the same tile without them (ptxas' report; the table goes to stdout; a tile
 * whose default already spills may move by 64 bytes). No
 * GPU needed; skipped (with the reason) when NVRTC cannot be loaded. FA_GPU_GRID=full: every
 * architecture, dtype and precision over head dims 8, 40, 64, 128, 136, 256 (window + softcap).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_gpu.h"
#include "fa_planner.h"

struct job {
	struct fa_kernel_spec spec;
	int base; /* the job without window and softcap (itself for those) */
	struct fa_kernel_usage u;
	fa_status st;
	char err[2048];
};

static struct fa_nvrtc *nv;
static char nv_err[512];
static struct job jobs[512];
static int njobs, next_job;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fa_kernel_settings plan_ks = FA_KERNEL_SETTINGS_INIT;

static void *worker(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_mutex_lock(&job_lock);
		int i = next_job++;
		pthread_mutex_unlock(&job_lock);
		if (i >= njobs)
			return NULL;
		jobs[i].st = fa_nvrtc_compile(nv, &jobs[i].spec, NULL, NULL, &jobs[i].u, jobs[i].err,
		                              sizeof jobs[i].err);
	}
}

/* The planner's first backward tile for the shape, without and with each (window, softcap) of
 * `variants` (bit 0 window, bit 1 softcap). */
static void add(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m, unsigned variants)
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
	if (fa_plan_bwd(dev, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err) != FA_OK || n < 1)
		fail_msg("plan %s: %s", arch, err);
	const int base = njobs;
	for (unsigned v = 0; v < 4; v++) {
		if (v != 0 && !(variants & (1u << (v - 1))))
			continue;
		struct job *j = &jobs[njobs++];
		memset(j, 0, sizeof *j);
		fa_kernel_spec_make(&j->spec, dev->sm, dt, p, D, m, &t[0]);
		j->spec.window = (v & 1) != 0;
		j->spec.softcap = (v & 2) != 0;
		j->base = base;
	}
}

static int setup(void **state)
{
	(void)state;
	setenv("CUDA_CACHE_DISABLE", "1", 1); /* ptxas must run for its report (test_nvrtc_bwd.c) */
	if (fa_nvrtc_open(&nv, NULL, nv_err, sizeof nv_err) != FA_OK)
		nv = NULL;
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_nvrtc_close(nv);
	return 0;
}

static void test_nvrtc_compiles_the_backward_window_and_softcap_without_new_spills(void **state)
{
	(void)state;
	if (!nv) {
		printf("skipped: NVRTC not available: %s\n", nv_err);
		skip();
	}
	/* variants: 4 = window + softcap only; 7 = window, softcap, both */
	const char *grid = getenv("FA_GPU_GRID");
	if (grid && strcmp(grid, "full") == 0) {
		const char *archs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"};
		const fa_dtype dts[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
		                        FA_DTYPE_FP32, FA_DTYPE_FP32};
		const fa_precision precs[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
		                              FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
		const int Ds[] = {8, 40, 64, 128, 136, 256};
		for (int a = 0; a < 6; a++)
			for (int d = 0; d < 6; d++)
				for (int k = 0; k < 6; k++)
					add(archs[a], dts[d], precs[d], Ds[k], (fa_mask)((a + d + k) % 3), 4);
	} else {
	add("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 7);
	add("sm_80", FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, FA_MASK_NONE, 4);
	add("sm_90", FA_DTYPE_FP32, FA_PREC_3XTF32, 128, FA_MASK_NONE, 4);
	add("sm_86", FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_CAUSAL_TOP_LEFT, 4);
	add("sm_90", FA_DTYPE_FP32, FA_PREC_BF16, 256, FA_MASK_NONE, 4);
	add("sm_120", FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, FA_MASK_CAUSAL_TOP_LEFT, 4);
	}
	int nthreads = 2;
	const char *e = getenv("FA_COMPILE_THREADS");
	if (e && atoi(e) > 0)
		nthreads = atoi(e) > 16 ? 16 : atoi(e);
	pthread_t th[16];
	for (int i = 0; i < nthreads; i++)
		pthread_create(&th[i], NULL, worker, NULL);
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);

	int bad = 0;
	printf("%-60s %5s %6s %6s %6s %6s\n", "specialisation", "regs", "spillS", "spillL", "stack",
	       "sec");
	for (int i = 0; i < njobs; i++) {
		const struct job *j = &jobs[i], *b = &jobs[j->base];
		char name[128];
		fa_kernel_spec_name(&j->spec, name, sizeof name);
		if (j->st != FA_OK) {
			printf("%-60s COMPILE ERROR: %s\n", name, j->err);
			bad++;
			continue;
		}
		/* where the default is clean, clean; where it spills already (a tile the planner
		 * offers over the register cap because nothing lighter fits), ptxas' allocation
		 * moves by a few words either way: at most test_nvrtc_bwd's small spill (64 bytes)
		 * more */
		const int slack = b->u.spill_stores > 0 ? 64 : 0;
		bool ok = j->u.regs > 0 && j->u.regs <= 255 &&
		          (b->st != FA_OK || (j->u.spill_stores <= b->u.spill_stores + slack &&
		                              j->u.spill_loads <= b->u.spill_loads + slack &&
		                              j->u.stack <= b->u.stack + slack));
		printf("%-60s %5d %6d %6d %6d %6.2f%s\n", name, j->u.regs, j->u.spill_stores,
		       j->u.spill_loads, j->u.stack, j->u.compile_s,
		       ok ? "" : "   <-- spills beyond the default's, or a bad report");
		if (!ok)
			bad++;
	}
	if (bad)
		fail_msg("%d of %d specialisations failed", bad, njobs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nvrtc_compiles_the_backward_window_and_softcap_without_new_spills),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
