/* test_planner.c - the tile planner on device models, without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_planner.h"

static struct fa_plan_req req(fa_dtype dt, fa_precision p, int D, fa_mask m)
{
	struct fa_plan_req r;
	memset(&r, 0, sizeof r);
	r.dtype = dt;
	r.precision = p;
	r.D = D;
	r.mask = m;
	return r;
}

static void test_planner_knows_the_named_device_models(void **state)
{
	(void)state;
	const struct fa_device_model *m;
	assert_non_null(m = fa_device_model_find("sm_75"));
	assert_int_equal(m->smem_optin, 64 * 1024);
	assert_non_null(m = fa_device_model_find("sm_80"));
	assert_int_equal(m->smem_optin, 163 * 1024);
	assert_non_null(m = fa_device_model_find("sm_86"));
	assert_int_equal(m->smem_optin, 99 * 1024);
	assert_non_null(m = fa_device_model_find("sm_89"));
	assert_int_equal(m->smem_optin, 99 * 1024);
	assert_non_null(m = fa_device_model_find("sm_90"));
	assert_int_equal(m->smem_optin, 227 * 1024);
	assert_non_null(m = fa_device_model_find("h200"));
	assert_int_equal(m->sm, 90);
	assert_non_null(m = fa_device_model_find("89"));
	assert_int_equal(m->sm, 89);
	/* Blackwell: datacenter (B200) 227 KiB of 228 per SM, consumer (RTX 50xx) 99 of 100 */
	assert_non_null(m = fa_device_model_find("sm_100"));
	assert_int_equal(m->sm, 100);
	assert_int_equal(m->smem_optin, 227 * 1024);
	assert_int_equal(m->smem_per_sm, 228 * 1024);
	assert_non_null(m = fa_device_model_find("b200"));
	assert_int_equal(m->sm, 100);
	assert_non_null(m = fa_device_model_find("100"));
	assert_int_equal(m->sm, 100);
	assert_non_null(m = fa_device_model_find("sm_120"));
	assert_int_equal(m->sm, 120);
	assert_int_equal(m->smem_optin, 99 * 1024);
	assert_int_equal(m->smem_per_sm, 100 * 1024);
	assert_non_null(m = fa_device_model_find("sm120"));
	assert_int_equal(m->sm, 120);
	assert_null(fa_device_model_find("sm_42"));
}

/* wgmma is sm_90a's alone: on sm_100 and sm_120 every dtype and precision plans mma.sync tiles,
 * also where sm_90 takes the wgmma paths (fp32 tf32 d128, bf16 d256, long sequences), and with
 * FA_WGMMA16=1; the limits are the models' own. */
static void test_planner_blackwell_plans_mma_sync_only(void **state)
{
	(void)state;
	const char *archs[] = {"sm_100", "sm_120", "b200", "rtx5090"};
	const fa_dtype dts[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
	                        FA_DTYPE_FP32, FA_DTYPE_FP32};
	const fa_precision precs[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
	                              FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
	struct fa_kernel_settings all16 = FA_KERNEL_SETTINGS_INIT;
	all16.wgmma16 = FA_WGMMA16_ALL;
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	char err[512];
	for (size_t a = 0; a < 4; a++) {
		const struct fa_device_model *m = fa_device_model_find(archs[a]);
		assert_non_null(m);
		assert_false(fa_plan_wgmma_enabled(m, NULL));
		assert_false(fa_plan_wgmma16_enabled(m, &all16));
		for (size_t d = 0; d < 6; d++)
			for (int D = 64; D <= 256; D += 64) {
				struct fa_plan_req r = req(dts[d], precs[d], D, FA_MASK_NONE);
				r.B = 4;
				r.H = 16;
				r.Sq = r.Sk = 8192;
				r.ks = &all16;
				int n = 0;
				assert_int_equal(fa_plan(m, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
				                 FA_OK);
				assert_true(n > 0);
				for (int i = 0; i < n; i++) {
					assert_false(fa_kpath_is_wg(t[i].path));
					assert_true(t[i].smem <= m->smem_optin);
				}
			}
	}
	/* the same request on sm_90 does take wgmma (the test means something) */
	struct fa_plan_req r = req(FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_NONE);
	int n = 0;
	assert_int_equal(fa_plan(fa_device_model_find("sm_90"), &r, t, FA_PLAN_MAX_CANDIDATES, &n, err,
	                         sizeof err),
	                 FA_OK);
	assert_true(fa_kpath_is_wg(t[0].path));
	/* sm_120's 99 KiB gives the tiles sm_89 gets; sm_100's 227 KiB those of sm_90's mma.sync */
	int n89 = 0, n120 = 0;
	r = req(FA_DTYPE_FP32, FA_PREC_IEEE, 256, FA_MASK_NONE);
	assert_int_equal(fa_plan(fa_device_model_find("sm_89"), &r, t, FA_PLAN_MAX_CANDIDATES, &n89,
	                         err, sizeof err),
	                 FA_OK);
	assert_int_equal(fa_plan(fa_device_model_find("sm_120"), &r, t, FA_PLAN_MAX_CANDIDATES, &n120,
	                         err, sizeof err),
	                 FA_OK);
	assert_int_equal(n89, n120);
}

/* Every candidate fits, is sorted best first, and its bytes are the formula's. */
static void check_plan(const char *arch, fa_dtype dt, fa_precision p, int D, fa_mask mask)
{
	const struct fa_device_model *m = fa_device_model_find(arch);
	struct fa_plan_req r = req(dt, p, D, mask);
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	char err[512];
	fa_status st = fa_plan(m, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err);
	if (st != FA_OK)
		fail_msg("%s dtype %d prec %d D %d: %s", arch, (int)dt, (int)p, D, err);
	assert_true(n > 0);
	for (int i = 0; i < n; i++) {
		assert_true(t[i].smem <= m->smem_optin);
		assert_int_equal(t[i].smem, fa_tile_smem(&t[i], D));
		assert_int_equal(t[i].br, 16 * t[i].nw * t[i].rt);
		assert_true(t[i].regs <= 255);
		assert_true(t[i].blocks_per_sm >= 1);
		if (i > 0)
			assert_true(t[i - 1].score >= t[i].score);
	}
}

static void test_planner_fits_every_head_dim_on_every_sm80_plus_model(void **state)
{
	(void)state;
	const char *archs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"};
	const fa_dtype dts[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32};
	const fa_precision precs[] = {FA_PREC_IEEE, FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
	for (size_t a = 0; a < 6; a++)
		for (int D = 8; D <= 256; D += 8)
			for (size_t d = 0; d < 3; d++)
				for (size_t p = 0; p < (dts[d] == FA_DTYPE_FP32 ? 4u : 1u); p++)
					check_plan(archs[a], dts[d], precs[p], D, FA_MASK_CAUSAL_BOTTOM_RIGHT);
}

/* The case: fp32 D=128 on the 99 KiB parts needs tiles the 48 KiB static limit cannot
 * hold; the shared memory is the kernel's layout, row strides padded. */
static void test_planner_fp32_d128_fits_sm89_above_48k(void **state)
{
	(void)state;
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	char err[512];
	struct fa_plan_req r = req(FA_DTYPE_FP32, FA_PREC_DEFAULT, 128, FA_MASK_CAUSAL_BOTTOM_RIGHT);
	assert_int_equal(fa_plan(fa_device_model_find("sm_89"), &r, t, FA_PLAN_MAX_CANDIDATES, &n,
	                         err, sizeof err),
	                 FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_32);
	bool above48k = false;
	for (int i = 0; i < n; i++)
		above48k |= t[i].smem > 48 * 1024;
	assert_true(above48k);
	/* 64 rows x (128 + 8) words + 2 stages x 32 keys x ((128 + 8) + (128 + 4)) words */
	struct fa_tile x = {.path = FA_KPATH_32, .nw = 4, .rt = 1, .bc = 32, .stages = 2};
	assert_int_equal(fa_tile_smem(&x, 128), 4 * (64 * 136 + 2 * 32 * (136 + 132)));
	struct fa_tile y = {.path = FA_KPATH_16, .nw = 4, .rt = 2, .bc = 64, .stages = 2};
	assert_int_equal(fa_tile_smem(&y, 40), 2 * (128 * 56 + 2 * 64 * 2 * 56));
}

/* sm_90 runs fp32 tf32 and 3xtf32 on the wgmma kernel (attn_fwd_sm90.cu) where it fits, with
 * its shared memory exactly as that kernel lays it out (3xtf32 above head dim 128 on its one
 * tile); other devices, other precisions and FA_WGMMA=0 stay on mma.sync. */
static void test_planner_sm90_fp32_takes_the_wgmma_path(void **state)
{
	(void)state;
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	char err[512], tb[48];
	const struct fa_device_model *h = fa_device_model_find("h200"), *l = fa_device_model_find("l40s");
	struct fa_plan_req r = req(FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_NONE);
	assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_WG32);
	assert_int_equal(t[0].rt, 1);
	assert_int_equal(t[0].br, 16 * t[0].nw);
	/* Q (128 x 128) + 2 stages x (K, V^T) of 64 keys, fp32 */
	assert_int_equal(t[0].smem, 4 * (128 * 128 + 2 * 64 * 128 * 2));
	fa_tile_format(&t[0], tb, sizeof tb);
	assert_string_equal(tb, "128x64 wg2 s2");
	bool mma = false;
	for (int i = 0; i < n; i++)
		mma |= t[i].path == FA_KPATH_32; /* the mma.sync tiles stay as candidates (tuner) */
	assert_true(mma);
	r.precision = FA_PREC_DEFAULT; /* 3xtf32: K, K_lo, V^T, V^T_lo per stage */
	assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_WG32X3);
	assert_int_equal(t[0].smem, 4 * ((size_t)t[0].br * 128 + (size_t)t[0].stages * t[0].bc * 128 * 4));
	/* above 128: X3S with FA_WG_BC=16, and by default above 192 (another key step leaves the
	 * mma.sync kernel): one warpgroup, 16 keys; Q and Q_lo + three half tiles (K or V^T, hi
	 * and lo), 224 KiB at D = 256, under the H200's 227 KiB; a 99 KiB card stays on mma.sync */
	struct fa_kernel_settings bc16 = FA_KERNEL_SETTINGS_INIT, bc32 = FA_KERNEL_SETTINGS_INIT;
	bc16.wg_bc = 16; /* FA_WG_BC=16 */
	bc32.wg_bc = 32;
	for (int D = 136; D <= 256; D += 120) {
		r.D = D;
		r.ks = &bc32;
		assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
		for (int i = 0; i < n; i++)
			assert_false(t[i].path == FA_KPATH_WG32X3);
		r.ks = &bc16;
		assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
		assert_int_equal(t[0].path, FA_KPATH_WG32X3);
		r.ks = NULL;
		assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
		if (D <= 192) {
			for (int i = 0; i < n; i++)
				assert_false(t[i].path == FA_KPATH_WG32X3);
			r.ks = &bc16;
			assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
			                 FA_OK);
			r.ks = NULL;
		}
		assert_int_equal(t[0].path, FA_KPATH_WG32X3);
		fa_tile_format(&t[0], tb, sizeof tb);
		assert_string_equal(tb, "64x16 wg1 s2");
		assert_int_equal(t[0].smem, 4 * (2 * 64 * (size_t)D + 3 * 2 * 16 * (size_t)D));
		assert_true(t[0].smem <= h->smem_optin);
		for (int i = 1; i < n; i++)
			assert_false(t[i].path == FA_KPATH_WG32X3);
	}
	assert_int_equal(fa_plan(l, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_32);
	r.D = 256;
	r.precision = FA_PREC_TF32;
	assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_WG32);
	assert_true(t[0].smem <= h->smem_optin);
	r.D = 128;
	assert_int_equal(fa_plan(l, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_32);
	r.precision = FA_PREC_IEEE;
	assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_32);
	r.precision = FA_PREC_TF32;
	struct fa_kernel_settings off = FA_KERNEL_SETTINGS_INIT;
	off.wgmma = false; /* FA_WGMMA=0 */
	r.ks = &off;
	assert_int_equal(fa_plan(h, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	r.ks = NULL;
	for (int i = 0; i < n; i++)
		assert_false(fa_kpath_is_wg(t[i].path));
}

/* A bigger device never offers fewer configurations. */
static void test_planner_larger_devices_offer_more_tiles(void **state)
{
	(void)state;
	const char *archs[] = {"sm_75", "sm_86", "sm_80", "sm_90"};
	int prev = 0;
	for (size_t a = 0; a < 4; a++) {
		struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
		int n = 0;
		char err[512];
		struct fa_plan_req r = req(FA_DTYPE_FP32, FA_PREC_3XTF32, 256, FA_MASK_NONE);
		fa_status st = fa_plan(fa_device_model_find(archs[a]), &r, t, FA_PLAN_MAX_CANDIDATES, &n,
		                       err, sizeof err);
		assert_true(st == FA_OK || st == FA_ENOFIT);
		assert_true(n >= prev);
		prev = n;
	}
	assert_true(prev > 0);
}

/* Nothing fits: the error names the shape, the smallest need in bytes and the limit. */
static void test_planner_nofit_names_shape_need_and_limit(void **state)
{
	(void)state;
	struct fa_tile t[4];
	int n = 7;
	char err[512];
	struct fa_plan_req r = req(FA_DTYPE_FP32, FA_PREC_IEEE, 256, FA_MASK_NONE);
	fa_status st = fa_plan(fa_device_model_find("sm_75"), &r, t, 4, &n, err, sizeof err);
	assert_int_equal(st, FA_ENOFIT);
	assert_int_equal(n, 0);
	assert_non_null(strstr(err, "fp32 head dim 256"));
	assert_non_null(strstr(err, "65536"));
	struct fa_tile small = {.path = FA_KPATH_32, .nw = 2, .rt = 1, .bc = 16, .stages = 2};
	char need[32];
	snprintf(need, sizeof need, "%zu bytes", fa_tile_smem(&small, 256));
	assert_non_null(strstr(err, need));

	r = req(FA_DTYPE_BF16, FA_PREC_DEFAULT, 512, FA_MASK_NONE);
	st = fa_plan(fa_device_model_find("sm_90"), &r, t, 4, &n, err, sizeof err);
	assert_int_equal(st, FA_ENOFIT);
	assert_non_null(strstr(err, "head dim 512"));
	assert_non_null(strstr(err, "232448"));
	assert_non_null(strstr(err, "bytes"));
}

static void test_planner_rejects_bad_head_dims_and_dtypes(void **state)
{
	(void)state;
	struct fa_tile t[4];
	int n;
	char err[256];
	struct fa_plan_req r = req(FA_DTYPE_BF16, FA_PREC_DEFAULT, 12, FA_MASK_NONE);
	assert_int_equal(fa_plan(fa_device_model_find("sm_90"), &r, t, 4, &n, err, sizeof err),
	                 FA_ESHAPE);
	r = req((fa_dtype)9, FA_PREC_DEFAULT, 64, FA_MASK_NONE);
	assert_int_equal(fa_plan(fa_device_model_find("sm_90"), &r, t, 4, &n, err, sizeof err),
	                 FA_EDTYPE);
}

/* The default fp32 precision is 3xtf32; bf16 staging runs on the 16-bit path. */
static void test_planner_resolves_precisions(void **state)
{
	(void)state;
	assert_int_equal(fa_prec_resolve(FA_DTYPE_FP32, FA_PREC_DEFAULT), FA_PREC_3XTF32);
	assert_int_equal(fa_prec_resolve(FA_DTYPE_BF16, FA_PREC_TF32), FA_PREC_DEFAULT);
	assert_int_equal(fa_plan_path(FA_DTYPE_FP32, FA_PREC_BF16), FA_KPATH_16);
	assert_int_equal(fa_plan_path(FA_DTYPE_FP32, FA_PREC_TF32), FA_KPATH_32);
	fa_precision p;
	assert_true(fa_prec_parse("3xtf32", &p));
	assert_int_equal(p, FA_PREC_3XTF32);
	assert_false(fa_prec_parse("fp8", &p));
}

/* Short, many-head problems prefer tiles that fill the machine's waves. */
static void test_planner_prefers_short_tiles_for_short_queries(void **state)
{
	(void)state;
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n;
	char err[256];
	struct fa_plan_req r = req(FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_NONE);
	r.B = 1;
	r.H = 8;
	r.Sq = 17;
	r.Sk = 4096;
	assert_int_equal(fa_plan(fa_device_model_find("sm_90"), &r, t, FA_PLAN_MAX_CANDIDATES, &n,
	                         err, sizeof err),
	                 FA_OK);
	assert_int_equal(t[0].br, 64);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_planner_knows_the_named_device_models),
		cmocka_unit_test(test_planner_blackwell_plans_mma_sync_only),
		cmocka_unit_test(test_planner_fits_every_head_dim_on_every_sm80_plus_model),
		cmocka_unit_test(test_planner_fp32_d128_fits_sm89_above_48k),
		cmocka_unit_test(test_planner_sm90_fp32_takes_the_wgmma_path),
		cmocka_unit_test(test_planner_larger_devices_offer_more_tiles),
		cmocka_unit_test(test_planner_nofit_names_shape_need_and_limit),
		cmocka_unit_test(test_planner_rejects_bad_head_dims_and_dtypes),
		cmocka_unit_test(test_planner_resolves_precisions),
		cmocka_unit_test(test_planner_prefers_short_tiles_for_short_queries),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
