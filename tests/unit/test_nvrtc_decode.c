/* test_nvrtc_decode.c - the decode kernels (kernels/attn_decode.cu) the decode planner picks
 * compile with NVRTC for sm_80, sm_86, sm_89, sm_90, sm_100 and sm_120 without local-memory
 * spills, and fit the shared memory the plan computed. No GPU needed; skipped (with the reason)
 * when NVRTC cannot be loaded. Also the planner's decode decisions on the issue's shapes (no
 * NVRTC needed for those).
 *
 * Default: a sample (every dtype, head dims 8..256, every mask, GQA 1..32, Sq 1..16), and the
 * sliding window and softcap on dense batches and over the inference layouts (FA_LAYOUT 1, the
 * window's per-sequence specialisation).
 * FA_GPU_GRID=full: every head dim that is a multiple of 8 for each dtype, on sm_90.
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

/* A dense BSHD decode problem. */
static void make_desc(struct fa_attn_fwd_desc *d, fa_dtype dt, int D, fa_mask m, int64_t B,
                      int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv)
{
	memset(d, 0, sizeof *d);
	d->dtype = dt;
	d->mask = m;
	d->scale = 0.125;
	d->B = B;
	d->Sq = Sq;
	d->Sk = Sk;
	d->Hq = Hq;
	d->Hkv = Hkv;
	d->D = D;
	int64_t q[3] = {Sq * Hq * D, Hq * D, D}, k[3] = {Sk * Hkv * D, Hkv * D, D};
	memcpy(d->q_stride, q, sizeof q);
	memcpy(d->o_stride, q, sizeof q);
	memcpy(d->k_stride, k, sizeof k);
	memcpy(d->v_stride, k, sizeof k);
	d->lse_stride[0] = Hq * Sq;
	d->lse_stride[1] = Sq;
	d->lse_stride[2] = 1;
}

/* The next add_job calls' extras: bit 0 a window (1000, 0), bit 1 softcap 50, bit 2 over an
 * inference layout (as launch_decode specialises it: only with the window). */
static int ext_mask;

/* The decode plan's kernel for (arch, shape), once per distinct specialisation. */
static void add_job(const char *arch, fa_dtype dt, int D, fa_mask m, int Sq, int group)
{
	const struct fa_device_model *dev = fa_device_model_find(arch);
	assert_non_null(dev);
	struct fa_attn_fwd_desc d;
	make_desc(&d, dt, D, m, 2, Sq, 4096, 8 * group, 8);
	d.window = ext_mask & 1;
	d.window_left = 1000;
	d.window_right = 0;
	d.softcap = ext_mask & 2 ? 50.0 : 0.0;
	struct fa_decode_plan p;
	char err[512];
	if (fa_plan_decode(dev, &d, NULL, NULL, &p, err, sizeof err) != FA_OK)
		fail_msg("plan %s: %s", arch, err);
	assert_true(p.tile.smem <= dev->smem_optin);
	struct fa_kernel_spec s;
	fa_kernel_spec_make(&s, dev->sm, dt, FA_PREC_DEFAULT, D, m, &p.tile);
	fa_kernel_spec_mask_ext(&s, &d);
	if ((ext_mask & 4) && s.window)
		s.layout = FA_KLAYOUT_SEQ;
	assert_int_equal(s.tile.smem, p.tile.smem);
	for (int i = 0; i < njobs; i++)
		if (memcmp(&jobs[i].spec, &s, sizeof s) == 0)
			return;
	struct job *j = &jobs[njobs++];
	memset(j, 0, sizeof *j);
	j->spec = s;
	j->regs_est = p.tile.regs;
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

static void test_nvrtc_compiles_the_decode_specialisations_without_spills(void **state)
{
	(void)state;
	if (!nv) {
		printf("skipped: NVRTC not available: %s\n", nv_err);
		skip();
	}
	const char *grid = getenv("FA_GPU_GRID");
	bool full = grid && strcmp(grid, "full") == 0;
	const char *archs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"};
	const fa_dtype dts[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32};
	const fa_mask masks[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT, FA_MASK_CAUSAL_TOP_LEFT};
	/* (Sq, group): the packed rows 1 .. 128, so every row-tile count and row chunking */
	const int rows[][2] = {{1, 4}, {1, 1}, {2, 4}, {8, 4}, {5, 8}, {1, 32}, {16, 8}, {4, 2}};
	jobs = calloc(4096, sizeof *jobs);
	assert_non_null(jobs);
	if (full) {
		for (int a = 0; a < 3; a++)
			for (int D = 8; D <= 256; D += 8)
				for (int r = 0; r < 8; r++)
					add_job("sm_90", dts[a], D, masks[(D / 8 + r) % 3], rows[r][0], rows[r][1]);
	} else {
		const int Ds[] = {128, 64, 256, 40, 8, 72, 160, 96};
		int k = 0;
		for (int ar = 0; ar < 6; ar++)
			for (int a = 0; a < 3; a++, k++)
				add_job(archs[ar], dts[a], Ds[k % 8], masks[k % 3], rows[k % 8][0],
				        rows[k % 8][1]);
		/* the issue's shape on sm_90 for each dtype, and the register-heavy corners */
		for (int a = 0; a < 3; a++) {
			add_job("sm_90", dts[a], 128, FA_MASK_NONE, 1, 4);
			add_job("sm_90", dts[a], 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 8, 4);
			add_job("sm_90", dts[a], 256, FA_MASK_NONE, 16, 8);
			add_job("sm_90", dts[a], 64, FA_MASK_CAUSAL_TOP_LEFT, 16, 8);
		}
	}
	/* the window and softcap (dense, and the window's layout specialisation): each dtype,
	 * rotating head dims, masks and rows */
	for (int x = 1; x < 8; x++) {
		if (x == 4 || x == 6)
			continue; /* a layout without a window is the dense kernel */
		ext_mask = x;
		for (int a = 0; a < 3; a++)
			add_job(x == 7 && a == 0 ? "sm_80" : "sm_90", dts[a], (int[]){128, 64, 256}[(x + a) % 3],
			        masks[(x + a) % 3], rows[(x + 2 * a) % 8][0], rows[(x + 2 * a) % 8][1]);
	}
	ext_mask = 0;
	fa_test_parallel_for(njobs, compile_one);
	int bad = 0;
	printf("%-44s %5s %5s %6s %6s %7s\n", "specialisation", "regs", "est", "spills", "stack",
	       "smem");
	for (int i = 0; i < njobs; i++) {
		struct job *j = &jobs[i];
		char name[96];
		fa_kernel_spec_name(&j->spec, name, sizeof name);
		if (j->st != FA_OK) {
			printf("%-44s FAILED: %.600s\n", name, j->err);
			bad++;
			continue;
		}
		bool spill = j->u.spill_stores > 0 || j->u.spill_loads > 0;
		printf("%-44s %5d %5d %6d %6d %7zu%s\n", name, j->u.regs, j->regs_est,
		       j->u.spill_stores + j->u.spill_loads, j->u.stack, j->spec.tile.smem,
		       spill || j->u.regs < 0 ? "  <--" : "");
		if (spill || j->u.regs < 0)
			bad++;
	}
	printf("%d decode specialisations, %d bad\n", njobs, bad);
	assert_int_equal(bad, 0);
}

/* The planner on the issue's shapes (H200: 132 SMs): the decode path is taken, one or more
 * splits as the shape needs, whole waves; the prefill kernel above FA_DECODE_MAX_SQ; the
 * settings force and forbid it. */
static void test_decode_planner_on_the_issue_shapes(void **state)
{
	(void)state;
	const struct fa_device_model *h200 = fa_device_model_find("h200");
	struct fa_attn_fwd_desc d;
	struct fa_decode_plan p;
	char err[512];
	const int64_t shapes[][2] = {{16, 8192}, {64, 2048}, {1, 32768}};
	for (int i = 0; i < 3; i++) {
		make_desc(&d, FA_DTYPE_BF16, 128, FA_MASK_NONE, shapes[i][0], 1, shapes[i][1], 32, 8);
		assert_true(fa_decode_wanted(h200, &d, NULL));
		assert_int_equal(fa_plan_decode(h200, &d, NULL, NULL, &p, err, sizeof err), FA_OK);
		int64_t blocks = d.B * d.Hkv * p.row_chunks * p.nsplit;
		int64_t resident = 132; /* the planner's waves: one block per SM */
		int64_t waves = (blocks + resident - 1) / resident;
		printf("B=%lld Sk=%lld: tile %d rows, %d warps, %d stages, %zu B smem, %d/SM; %d "
		       "splits of %d keys; %lld blocks (%.0f%% of %lld waves)\n", (long long)d.B,
		       (long long)d.Sk, p.tile.br, p.tile.nw, p.tile.stages, p.tile.smem,
		       p.tile.blocks_per_sm, p.nsplit, p.split_keys, (long long)blocks,
		       100.0 * (double)blocks / (double)(waves * resident), (long long)waves);
		assert_int_equal(p.rows, 4);
		assert_int_equal(p.tile.br, 16);
		assert_true((double)blocks / (double)(waves * resident) >= 0.9);
		assert_true((int64_t)p.nsplit * p.split_keys >= d.Sk);
		assert_true((int64_t)(p.nsplit - 1) * p.split_keys < d.Sk);
		assert_int_equal(p.split_keys % 16, 0);
		assert_int_equal(p.scratch > 0, p.nsplit > 1);
	}
	/* a long cache over few heads is split, many short ones are not */
	make_desc(&d, FA_DTYPE_BF16, 128, FA_MASK_NONE, 1, 1, 32768, 32, 8);
	assert_int_equal(fa_plan_decode(h200, &d, NULL, NULL, &p, err, sizeof err), FA_OK);
	assert_int_equal(p.nsplit, 16); /* the H200 sweep's best (kernels/RESULTS.md) */
	make_desc(&d, FA_DTYPE_BF16, 128, FA_MASK_NONE, 64, 1, 2048, 32, 8);
	assert_int_equal(fa_plan_decode(h200, &d, NULL, NULL, &p, err, sizeof err), FA_OK);
	assert_int_equal(p.nsplit, 1);
	/* a short cache is never split below 64 keys per warp */
	make_desc(&d, FA_DTYPE_FP32, 64, FA_MASK_NONE, 1, 1, 17, 4, 4);
	assert_int_equal(fa_plan_decode(h200, &d, NULL, NULL, &p, err, sizeof err), FA_OK);
	assert_int_equal(p.nsplit, 1);
	assert_int_equal(p.tile.path, FA_KPATH_DEC32);
	assert_int_equal(p.tile.br, 1);
	/* MQA 32:1 with 8 queries: 256 packed rows in chunks */
	make_desc(&d, FA_DTYPE_FP16, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 8, 4097, 32, 1);
	assert_int_equal(fa_plan_decode(h200, &d, NULL, NULL, &p, err, sizeof err), FA_OK);
	assert_int_equal(p.rows, 256);
	assert_int_equal(p.row_chunks * p.tile.br >= 256, true);
	/* the settings: the splits forced, decode off, decode everywhere, a bad tile */
	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE_SPLITS", "7", err, sizeof err), FA_OK);
	make_desc(&d, FA_DTYPE_BF16, 128, FA_MASK_NONE, 16, 1, 8192, 32, 8);
	assert_int_equal(fa_plan_decode(h200, &d, &ks, NULL, &p, err, sizeof err), FA_OK);
	assert_int_equal(p.nsplit, 7);
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE", "0", err, sizeof err), FA_OK);
	assert_false(fa_decode_wanted(h200, &d, &ks));
	d.Sq = 17;
	assert_false(fa_decode_wanted(h200, &d, NULL));
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE", "1", err, sizeof err), FA_OK);
	assert_true(fa_decode_wanted(h200, &d, &ks));
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE", "2", err, sizeof err), FA_EINVAL);
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE_STAGES", "1", err, sizeof err),
	                 FA_EINVAL);
	char buf[16];
	assert_true(fa_kernel_settings_get(&ks, "FA_DECODE", buf, sizeof buf));
	assert_string_equal(buf, "1");
	struct fa_tile bad = p.tile;
	bad.path = FA_KPATH_16;
	assert_int_equal(fa_plan_decode(h200, &d, NULL, &bad, &p, err, sizeof err), FA_EINVAL);
	printf("bad tile: %s\n", err);
}

/* Over an inference layout only the window has its own specialisation (-DFA_LAYOUT=1 before
 * -DFA_WIN=1); softcap alone and plain decodes keep the dense kernel's option list. */
static void test_decode_layout_option_only_with_a_window(void **state)
{
	(void)state;
	const struct fa_device_model *h200 = fa_device_model_find("h200");
	struct fa_attn_fwd_desc d;
	struct fa_decode_plan p;
	char err[256];
	make_desc(&d, FA_DTYPE_BF16, 128, FA_MASK_NONE, 4, 1, 4096, 32, 8);
	assert_int_equal(fa_plan_decode(h200, &d, NULL, NULL, &p, err, sizeof err), FA_OK);
	struct fa_kernel_spec s;
	fa_kernel_spec_make(&s, h200->sm, d.dtype, FA_PREC_DEFAULT, 128, d.mask, &p.tile);
	struct fa_nvrtc_opts dense, lay;
	fa_nvrtc_options(NULL, &s, &dense);
	s.softcap = true;
	s.layout = FA_KLAYOUT_SEQ; /* not set by the launcher without a window; ignored anyway */
	fa_nvrtc_options(NULL, &s, &lay);
	assert_int_equal(lay.n, dense.n + 1);
	assert_string_equal(lay.v[dense.n], "-DFA_SOFTCAP=1");
	s.window = true;
	fa_nvrtc_options(NULL, &s, &lay);
	assert_int_equal(lay.n, dense.n + 3);
	for (int i = 0; i < dense.n; i++)
		assert_string_equal(lay.v[i], dense.v[i]);
	assert_string_equal(lay.v[dense.n], "-DFA_LAYOUT=1");
	assert_string_equal(lay.v[dense.n + 1], "-DFA_WIN=1");
	char name[112];
	fa_kernel_spec_name(&s, name, sizeof name);
	assert_non_null(strstr(name, " varlen win cap"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_decode_planner_on_the_issue_shapes),
		cmocka_unit_test(test_decode_layout_option_only_with_a_window),
		cmocka_unit_test(test_nvrtc_compiles_the_decode_specialisations_without_spills),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
