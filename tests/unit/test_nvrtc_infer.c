/* test_nvrtc_infer.c - the inference layouts of the forward kernel (attn_fwd.cu with FA_LAYOUT 1,
 * sequences of their own lengths, and 2, a paged KV cache) compile with NVRTC, for the tiles
 * fa_gpu_fwd_infer would pick, without local-memory spills or a stack frame and within the
 * register file; and the layout reaches the options and the names (so the dense kernels' option
 * lists, and their disk-cache keys, stay as they were). No GPU needed; the compile test is
 * skipped (with the reason) when NVRTC cannot be loaded.
 *
 * Default: a sample (every dtype and fp32 precision, head dims 8..256, every mask, both layouts,
 * sm_80 and sm_90, long and short prefills; the sliding window and softcap, alone and together,
 * on both layouts: FA_WIN and FA_SOFTCAP with FA_LAYOUT). FA_GPU_GRID=full: every head dim that is a multiple
 * of 8, each dtype and precision, both layouts, on sm_90. The table (spec, registers, spills,
 * stack, shared memory) goes to stdout.
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
#include "fa_gpu_infer.h"
#include "gpu_int.h"

struct job {
	struct fa_kernel_spec spec;
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

/* The window and softcap of the next plan_spec calls: bit 0 a window (256, 0), bit 1 softcap 30. */
static int ext_mask;

/* The tile fa_gpu_fwd_infer plans for the longest sequence (Sq x Sk, B sequences, 32 query
 * heads): the planner's first mma.sync candidate. */
static void plan_spec(struct fa_kernel_spec *s, const char *arch, fa_dtype dt, fa_precision p,
                      int D, fa_mask m, int64_t B, int64_t Sq, int64_t Sk, int layout)
{
	const struct fa_device_model *dev = fa_device_model_find(arch);
	assert_non_null(dev);
	struct fa_attn_fwd_desc d;
	memset(&d, 0, sizeof d);
	d.dtype = dt;
	d.precision = p;
	d.D = D;
	d.mask = m;
	d.B = B;
	d.Sq = Sq;
	d.Sk = Sk;
	d.Hq = d.Hkv = 32;
	d.window = ext_mask & 1;
	d.window_left = 256;
	d.window_right = 0;
	d.softcap = ext_mask & 2 ? 30.0 : 0.0;
	char err[512];
	if (layout == FA_KLAYOUT_DENSE) { /* the dense launch's first choice, for the options */
		struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
		ks.wgmma = false;
		struct fa_plan_req r = {.dtype = dt, .precision = p, .D = D, .mask = m, .B = B,
		                        .H = 32, .Sq = Sq, .Sk = Sk, .ks = &ks};
		struct fa_tile t;
		int n = 0;
		if (fa_plan(dev, &r, &t, 1, &n, err, sizeof err) != FA_OK)
			fail_msg("plan %s D=%d: %s", arch, D, err);
		fa_kernel_spec_make(s, dev->sm, dt, p, D, m, &t);
		return;
	}
	if (fa_plan_fwd_infer(dev, NULL, &d, Sq, Sk, layout, s, err, sizeof err) != FA_OK)
		fail_msg("plan %s D=%d: %s", arch, D, err);
	assert_false(fa_kpath_is_wg(s->tile.path));
	assert_int_equal(s->layout, layout);
	assert_int_equal(s->window, (ext_mask & 1) != 0);
	assert_int_equal(s->softcap, (ext_mask & 2) != 0);
	assert_true(s->tile.smem <= dev->smem_optin);
}

static void add_job(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask m, int64_t B,
                    int64_t Sq, int64_t Sk, int layout)
{
	struct fa_kernel_spec s;
	plan_spec(&s, arch, dt, p, D, m, B, Sq, Sk, layout);
	for (int i = 0; i < njobs; i++)
		if (memcmp(&jobs[i].spec, &s, sizeof s) == 0)
			return;
	struct job *j = &jobs[njobs++];
	memset(j, 0, sizeof *j);
	j->spec = s;
}

static int setup(void **state)
{
	(void)state;
	setenv("CUDA_CACHE_DISABLE", "1", 1); /* ptxas must run (test_nvrtc_compile.c says why) */
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

static const fa_dtype K_DT[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
                                FA_DTYPE_FP32, FA_DTYPE_FP32};
static const fa_precision K_PR[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
                                    FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
static const fa_mask K_MASK[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT,
                                 FA_MASK_CAUSAL_TOP_LEFT};

static void test_nvrtc_compiles_the_inference_layouts_without_spills(void **state)
{
	(void)state;
	if (!nv) {
		printf("skipped: NVRTC not available: %s\n", nv_err);
		skip();
	}
	const char *grid = getenv("FA_GPU_GRID");
	bool full = grid && strcmp(grid, "full") == 0;
	jobs = calloc(4096, sizeof *jobs);
	assert_non_null(jobs);
	if (full) {
		for (int a = 0; a < 6; a++)
			for (int D = 8; D <= 256; D += 8)
				for (int l = 1; l <= 2; l++)
					add_job("sm_90", K_DT[a], K_PR[a], D, K_MASK[(D / 8 + l) % 3], 16, 4096,
					        4096, l);
	} else {
		/* the varlen benchmark's shape (bf16 D=128, 16 sequences to 4096) on sm_90, each
		 * layout and mask; then every kind at rotating head dims and masks, long and
		 * chunked-prefill shapes, sm_80 and sm_90 */
		for (int l = 1; l <= 2; l++)
			for (int m = 0; m < 3; m++)
				add_job("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, K_MASK[m], 16, 4096,
				        4096, l);
		const int Ds[] = {64, 256, 40, 8, 72, 160, 96, 128};
		int k = 0;
		for (int a = 0; a < 6; a++)
			for (int l = 1; l <= 2; l++, k++) {
				add_job(k % 3 ? "sm_90" : "sm_80", K_DT[a], K_PR[a], Ds[k % 8], K_MASK[k % 3],
				        16, 4096, 4096, l);
				add_job("sm_90", K_DT[a], K_PR[a], Ds[(k + 3) % 8], K_MASK[(k + 1) % 3], 4,
				        200, 3000, l);
			}
		/* the window, softcap and both over each layout: every kind, rotating head dims
		 * and masks (the varlen benchmark's shape first), sm_80 once */
		for (int x = 1; x < 4; x++) {
			ext_mask = x;
			for (int l = 1; l <= 2; l++) {
				add_job("sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, K_MASK[x % 3], 16, 4096,
				        4096, l);
				for (int a = 0; a < 6; a++, k++)
					add_job(k % 5 ? "sm_90" : "sm_80", K_DT[a], K_PR[a], Ds[k % 8],
					        K_MASK[k % 3], 4, 1000, 3000, l);
			}
		}
		ext_mask = 0;
	}
	fa_test_parallel_for(njobs, compile_one);
	int bad = 0;
	printf("%-56s %5s %6s %6s %7s %6s\n", "specialisation", "regs", "spills", "stack", "smem",
	       "sec");
	for (int i = 0; i < njobs; i++) {
		struct job *j = &jobs[i];
		char name[112];
		fa_kernel_spec_name(&j->spec, name, sizeof name);
		if (j->st != FA_OK) {
			printf("%-56s FAILED: %.1500s\n", name, j->err);
			bad++;
			continue;
		}
		bool ok = j->u.regs > 0 && j->u.regs <= 255 && j->u.spill_stores == 0 &&
		          j->u.spill_loads == 0 && j->u.stack == 0;
		printf("%-56s %5d %6d %6d %7zu %6.1f%s\n", name, j->u.regs,
		       j->u.spill_stores + j->u.spill_loads, j->u.stack, j->spec.tile.smem,
		       j->u.compile_s, ok ? "" : "  <-- spills or bad report");
		if (!ok)
			bad++;
	}
	printf("%d inference-layout specialisations, %d bad\n", njobs, bad);
	assert_int_equal(bad, 0);
}

/* The layout is one -D option appended only where it is set, and part of the name; a dense
 * spec's options are those it always had. */
static void test_layout_reaches_the_options_and_the_name(void **state)
{
	(void)state;
	struct fa_kernel_spec s;
	plan_spec(&s, "sm_90", FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_NONE, 16, 4096, 4096,
	          FA_KLAYOUT_DENSE);
	struct fa_nvrtc_opts dense, seq, paged;
	fa_nvrtc_options(NULL, &s, &dense);
	char name[112];
	fa_kernel_spec_name(&s, name, sizeof name);
	assert_null(strstr(name, "varlen"));
	assert_null(strstr(name, "paged"));
	for (int i = 0; i < dense.n; i++)
		assert_null(strstr(dense.v[i], "FA_LAYOUT"));
	s.layout = FA_KLAYOUT_SEQ;
	fa_nvrtc_options(NULL, &s, &seq);
	fa_kernel_spec_name(&s, name, sizeof name);
	assert_non_null(strstr(name, " varlen"));
	s.layout = FA_KLAYOUT_PAGED;
	fa_nvrtc_options(NULL, &s, &paged);
	fa_kernel_spec_name(&s, name, sizeof name);
	assert_non_null(strstr(name, " paged"));
	assert_int_equal(seq.n, dense.n + 1);
	assert_int_equal(paged.n, dense.n + 1);
	for (int i = 0; i < dense.n; i++) {
		assert_string_equal(seq.v[i], dense.v[i]);
		assert_string_equal(paged.v[i], dense.v[i]);
	}
	assert_string_equal(seq.v[dense.n], "-DFA_LAYOUT=1");
	assert_string_equal(paged.v[dense.n], "-DFA_LAYOUT=2");
	/* fp32 staged as bf16 (FA_QIN=3 too) with a layout: still within the option table */
	plan_spec(&s, "sm_90", FA_DTYPE_FP32, FA_PREC_BF16, 64, FA_MASK_CAUSAL_BOTTOM_RIGHT, 4, 100,
	          900, FA_KLAYOUT_PAGED);
	fa_nvrtc_options(NULL, &s, &paged);
	assert_true(paged.n <= FA_NVRTC_MAX_OPTS);
	assert_string_equal(paged.v[paged.n - 1], "-DFA_LAYOUT=2");
	assert_string_equal(paged.v[paged.n - 2], "-DFA_QIN=3");
	/* and with the window and softcap, both after the layout, still within the table */
	ext_mask = 3;
	plan_spec(&s, "sm_90", FA_DTYPE_FP32, FA_PREC_BF16, 64, FA_MASK_CAUSAL_BOTTOM_RIGHT, 4, 100,
	          900, FA_KLAYOUT_PAGED);
	ext_mask = 0;
	fa_nvrtc_options(NULL, &s, &paged);
	assert_true(paged.n <= FA_NVRTC_MAX_OPTS);
	assert_string_equal(paged.v[paged.n - 3], "-DFA_LAYOUT=2");
	assert_string_equal(paged.v[paged.n - 2], "-DFA_WIN=1");
	assert_string_equal(paged.v[paged.n - 1], "-DFA_SOFTCAP=1");
	fa_kernel_spec_name(&s, name, sizeof name);
	assert_non_null(strstr(name, " paged win cap"));
}

/* A window that bounds nothing at the batch's largest lengths bounds no sequence: the plan
 * keeps the kernel without FA_WIN (fa_attn_window_active on the bounds). */
static void test_a_window_wider_than_every_sequence_plans_no_window(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("sm_90");
	struct fa_attn_fwd_desc d;
	memset(&d, 0, sizeof d);
	d.dtype = FA_DTYPE_BF16;
	d.D = 128;
	d.B = 4;
	d.Sq = 300;
	d.Sk = 500;
	d.Hq = d.Hkv = 8;
	d.window = true;
	d.window_left = 800; /* >= Sk + Sq */
	d.window_right = 500; /* >= Sk */
	struct fa_kernel_spec s;
	char err[256];
	assert_int_equal(fa_plan_fwd_infer(dev, NULL, &d, 300, 500, FA_KLAYOUT_SEQ, &s, err,
	                                   sizeof err), FA_OK);
	assert_false(s.window);
	d.window_left = 799;
	assert_int_equal(fa_plan_fwd_infer(dev, NULL, &d, 300, 500, FA_KLAYOUT_SEQ, &s, err,
	                                   sizeof err), FA_OK);
	assert_true(s.window);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_layout_reaches_the_options_and_the_name),
		cmocka_unit_test(test_a_window_wider_than_every_sequence_plans_no_window),
		cmocka_unit_test(test_nvrtc_compiles_the_inference_layouts_without_spills),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
