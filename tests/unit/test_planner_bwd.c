/* test_planner_bwd.c - the backward's tile planner (kernels/planner_bwd.c) on device models,
 * without a GPU: its own shared-memory formula, the opt-in limit, the cases the issue names
 * (fp32 head dim 256 on the H200, fp32 head dim 128 causal on a 99 KiB card), FA_ENOFIT with the
 * bytes, bad requests, the wgmma backward's tiles, the window and softcap. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_attn.h"
#include "fa_planner.h"
#include "fa_settings.h"

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

static struct fa_tile tile(int path, int nw, int bkv, int bq)
{
	struct fa_tile t;
	memset(&t, 0, sizeof t);
	t.path = path;
	t.nw = nw;
	t.rt = 1;
	t.bc = bkv;
	t.br = bq;
	t.stages = 1;
	return t;
}

/* attn_bwd.cu's layout by hand: K, V (bkv rows), Q, dO (bq rows) with padded rows, P^T and dS^T
 * (bkv x bq, padded), lse2 and delta. */
static void test_planner_bwd_smem_is_the_kernels_layout(void **state)
{
	(void)state;
	struct fa_tile t = tile(FA_KPATH_BWD16, 8, 64, 64);
	/* 16-bit, D=128: rows of 136 elements, P rows of 72 */
	assert_int_equal(fa_bwd_tile_smem(&t, 128), 2 * ((2 * 64 + 2 * 64) * 136 + 2 * 64 * 72) + 8 * 64);
	/* 16-bit, D=40 pads to 48 */
	assert_int_equal(fa_bwd_tile_smem(&t, 40), 2 * ((2 * 64 + 2 * 64) * 56 + 2 * 64 * 72) + 8 * 64);
	t = tile(FA_KPATH_BWD32, 8, 64, 32);
	/* fp32, D=256: rows of 260 words, P rows of 36 */
	assert_int_equal(fa_bwd_tile_smem(&t, 256), 4 * ((2 * 64 + 2 * 32) * 260 + 2 * 64 * 36) + 8 * 32);
	char b[48];
	fa_tile_format(&t, b, sizeof b);
	assert_string_equal(b, "bwd kv64 q32 w8");
	/* two stages: a second Q, dO (and lse2, delta) */
	t.stages = 2;
	assert_int_equal(fa_bwd_tile_smem(&t, 256),
	                 4 * ((2 * 64 + 4 * 32) * 260 + 2 * 64 * 36) + 16 * 32);
	fa_tile_format(&t, b, sizeof b);
	assert_string_equal(b, "bwd kv64 q32 w8 s2");
}

static void test_planner_bwd_layout_rules(void **state)
{
	(void)state;
	struct fa_tile t = tile(FA_KPATH_BWD16, 8, 64, 64);
	assert_true(fa_bwd_tile_layout_ok(&t, 128));
	assert_false(fa_bwd_tile_layout_ok(&t, 8)); /* pads to 16: 2 column warps of 8 are no n8 pair */
	t = tile(FA_KPATH_BWD16, 8, 32, 32); /* 2 x 4 warps over 32 keys: 32 query columns / 4 = 8 */
	assert_false(fa_bwd_tile_layout_ok(&t, 128));
	t = tile(FA_KPATH_BWD32, 8, 32, 32); /* fp32 needs n8 tiles only */
	assert_true(fa_bwd_tile_layout_ok(&t, 128));
	t = tile(FA_KPATH_BWD16, 8, 16, 64); /* 1 x 8 warps: head dim 48 / 8 is not a pair of n8 */
	assert_false(fa_bwd_tile_layout_ok(&t, 40));
}

/* The issue's cases: fp32 head dim 256 (every precision) on the H200, fp32 head dim 128 causal
 * on a 99 KiB card (sm_86, sm_89, sm_120), every choice within the device's opt-in limit. */
static void test_planner_bwd_fits_the_issues_cases(void **state)
{
	(void)state;
	static const fa_precision precs[] = {FA_PREC_IEEE, FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
	const struct fa_device_model *h200 = fa_device_model_find("h200");
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	char err[512];
	for (int i = 0; i < 4; i++) {
		struct fa_plan_req r = req(FA_DTYPE_FP32, precs[i], 256, FA_MASK_NONE);
		assert_int_equal(fa_plan_bwd(h200, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
		                 FA_OK);
		assert_true(n > 0);
		assert_true(t[0].smem <= h200->smem_optin);
		assert_true(fa_kpath_is_bwd(t[0].path));
		char b[48];
		fa_tile_format(&t[0], b, sizeof b);
		printf("h200 fp32 %s d256: %s, %zu of %zu bytes, %d candidates\n", fa_prec_name(precs[i]),
		       b, t[0].smem, h200->smem_optin, n);
	}
	static const char *small[] = {"sm_86", "sm_89", "sm_120", "l40s", "rtx4090"};
	for (size_t m = 0; m < sizeof small / sizeof small[0]; m++) {
		const struct fa_device_model *dev = fa_device_model_find(small[m]);
		assert_non_null(dev);
		for (int i = 0; i < 4; i++) {
			struct fa_plan_req r = req(FA_DTYPE_FP32, precs[i], 128, FA_MASK_CAUSAL_TOP_LEFT);
			assert_int_equal(fa_plan_bwd(dev, &r, t, 1, &n, err, sizeof err), FA_OK);
			assert_int_equal(n, 1);
			assert_true(t[0].smem <= dev->smem_optin);
			assert_true(t[0].smem <= 99 * 1024);
		}
	}
}

/* Every dtype, precision, head dim and model: a choice within the limit, a layout the kernel
 * takes, candidates best first. */
static void test_planner_bwd_every_shape_plans_within_the_limit(void **state)
{
	(void)state;
	static const fa_dtype dts[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
	                               FA_DTYPE_FP32, FA_DTYPE_FP32};
	static const fa_precision precs[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
	                                     FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
	int nm = 0;
	const struct fa_device_model *models = fa_device_models(&nm);
	for (int m = 0; m < nm; m++)
		for (int a = 0; a < 6 && models[m].sm >= 80; a++) /* the kernels need sm_80 */
			for (int D = 8; D <= 256; D += 8) {
				struct fa_plan_req r = req(dts[a], precs[a], D, FA_MASK_CAUSAL_BOTTOM_RIGHT);
				struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
				int n = 0;
				char err[512];
				fa_status st = fa_plan_bwd(&models[m], &r, t, FA_PLAN_MAX_CANDIDATES, &n, err,
				                           sizeof err);
				if (st != FA_OK)
					fail_msg("%s %d D=%d: %s", models[m].name, a, D, err);
				for (int i = 0; i < n; i++) {
					assert_true(t[i].smem <= models[m].smem_optin);
					assert_true(fa_bwd_tile_layout_ok(&t[i], D));
					assert_int_equal(t[i].smem, fa_bwd_tile_smem(&t[i], D));
					if (i > 0)
						assert_true(t[i - 1].score >= t[i].score);
				}
				/* sm_90, 16-bit, head dims 64 to 128 and 192 to 256 (auto: where it measured
				 * faster): the wgmma backward first (above 128 its wide form); fp32 tf32 64
				 * to 128 and 3xtf32 64: the fp32 wgmma backward */
				const bool wg = models[m].sm == 90 && dts[a] != FA_DTYPE_FP32 &&
				                ((D >= 64 && D <= 128) || D >= 192);
				const bool wg32 = models[m].sm == 90 && dts[a] == FA_DTYPE_FP32 &&
				                  ((precs[a] == FA_PREC_TF32 && D >= 64 && D <= 128) ||
				                   (precs[a] == FA_PREC_3XTF32 && D == 64));
				assert_int_equal(t[0].path,
				                 wg     ? FA_KPATH_BWDWG16
				                 : wg32 ? (precs[a] == FA_PREC_TF32 ? FA_KPATH_BWDWG32
				                                                    : FA_KPATH_BWDWG32X3)
				                        : fa_plan_bwd_path(dts[a], precs[a]));
			}
}

/* Nothing fits: FA_ENOFIT with the shape, the smallest configuration's bytes and the limit. */
static void test_planner_bwd_explains_when_nothing_fits(void **state)
{
	(void)state;
	struct fa_device_model tiny = *fa_device_model_find("sm_86");
	tiny.name = "tiny";
	tiny.smem_optin = 16 * 1024;
	struct fa_plan_req r = req(FA_DTYPE_FP32, FA_PREC_3XTF32, 256, FA_MASK_NONE);
	struct fa_tile t[4];
	int n = 7;
	char err[512];
	assert_int_equal(fa_plan_bwd(&tiny, &r, t, 4, &n, err, sizeof err), FA_ENOFIT);
	assert_int_equal(n, 0);
	printf("%s\n", err);
	/* the smallest configuration the kernel's layout takes */
	size_t least = (size_t)-1;
	static const int nws[] = {2, 4, 8}, sizes[] = {16, 32, 64, 128}; /* one stage: the least */
	for (int a = 0; a < 3; a++)
		for (int b = 0; b < 4; b++)
			for (int c = 0; c < 4; c++) {
				struct fa_tile s = tile(FA_KPATH_BWD32, nws[a], sizes[b], sizes[c]);
				if (fa_bwd_tile_layout_ok(&s, 256) && fa_bwd_tile_smem(&s, 256) < least)
					least = fa_bwd_tile_smem(&s, 256);
			}
	char want[64];
	snprintf(want, sizeof want, "needs %zu bytes", least);
	assert_non_null(strstr(err, "no backward tile fits: fp32 head dim 256 (precision 3xtf32)"));
	assert_non_null(strstr(err, want));
	assert_non_null(strstr(err, "allows 16384"));
	/* above the kernels' maximum head dim */
	r = req(FA_DTYPE_BF16, FA_PREC_DEFAULT, 264, FA_MASK_NONE);
	assert_int_equal(fa_plan_bwd(fa_device_model_find("h200"), &r, t, 4, &n, err, sizeof err),
	                 FA_ENOFIT);
	assert_non_null(strstr(err, "above the kernels' maximum of 256"));
}

static void test_planner_bwd_rejects_bad_requests(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("sm_90");
	struct fa_tile t[4];
	int n = 0;
	char err[256];
	struct fa_plan_req r = req(FA_DTYPE_BF16, FA_PREC_DEFAULT, 100, FA_MASK_NONE);
	assert_int_equal(fa_plan_bwd(dev, &r, t, 4, &n, err, sizeof err), FA_ESHAPE);
	assert_non_null(strstr(err, "multiple of 8"));
	r = req((fa_dtype)9, FA_PREC_DEFAULT, 64, FA_MASK_NONE);
	assert_int_equal(fa_plan_bwd(dev, &r, t, 4, &n, err, sizeof err), FA_EDTYPE);
	assert_int_equal(fa_plan_bwd(dev, NULL, t, 4, &n, err, sizeof err), FA_EINVAL);
}

/* FA_BWD_DET_GROUP: the deterministic backward's group size, a power of two up to 8 (0: the
 * default, groups of one); anything else refused by name, and the value reads back. */
static void test_planner_bwd_det_group_setting(void **state)
{
	(void)state;
	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
	char err[256], buf[32];
	assert_int_equal(ks.bwd_det_group, 0);
	static const char *const good[] = {"0", "1", "2", "4", "8"};
	for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
		assert_int_equal(fa_kernel_settings_set(&ks, "FA_BWD_DET_GROUP", good[i], err,
		                                        sizeof err), FA_OK);
		assert_true(fa_kernel_settings_get(&ks, "FA_BWD_DET_GROUP", buf, sizeof buf));
		assert_string_equal(buf, good[i]);
	}
	static const char *const bad[] = {"3", "6", "16", "-1", "x", ""};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		assert_int_equal(fa_kernel_settings_set(&ks, "FA_BWD_DET_GROUP", bad[i], err,
		                                        sizeof err), FA_EINVAL);
		assert_non_null(strstr(err, "FA_BWD_DET_GROUP"));
		assert_int_equal(ks.bwd_det_group, 8); /* a refused value changes nothing */
	}
	bool listed = false;
	for (const char *const *n = fa_kernel_settings_names(); *n; n++)
		listed |= strcmp(*n, "FA_BWD_DET_GROUP") == 0;
	assert_true(listed);
}

/* The wgmma backward (attn_bwd_sm90.cu): offered first on sm_90 for fp16 / bf16 up to head dim
 * 256 (above 128 its wide form: two warpgroups on 64 keys), never for fp32 (any precision),
 * before sm_90 or after it (sm_100, sm_120),
 * with FA_WGMMA=0 or FA_WGMMA16_BWD=0; its tiles follow the kernel's static checks and shared
 * memory layout; the setting parses like FA_WGMMA16. */
static void test_planner_bwd_wgmma_path(void **state)
{
	(void)state;
	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
	struct fa_plan_req r = req(FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, FA_MASK_NONE);
	r.ks = &ks;
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	char err[512], buf[16];
	const struct fa_device_model *h200 = fa_device_model_find("sm_90");
	assert_int_equal(fa_plan_bwd(h200, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_int_equal(t[0].path, FA_KPATH_BWDWG16);
	assert_int_equal(t[0].nw, 8);
	assert_int_equal(t[0].bc, 128);
	assert_int_equal(t[0].br, 64);
	/* K, V (128 x 128), 2 x (Q, dO) (64 x 128), dS^T (128 x 64) 16-bit; 2 x (lse2, delta) */
	assert_int_equal(t[0].smem, 2 * (2 * 128 * 128 + 4 * 64 * 128 + 128 * 64) + 4 * 4 * 64);
	assert_int_equal(t[1].path, FA_KPATH_BWDWG16);
	assert_int_equal(t[1].nw, 4);
	assert_true(t[2].path == FA_KPATH_BWD16);
	const char *archs[] = {"sm_80", "sm_86", "sm_89", "sm_100", "sm_120"};
	for (int a = 0; a < 5; a++) {
		assert_int_equal(fa_plan_bwd(fa_device_model_find(archs[a]), &r, t, 4, &n, err,
		                             sizeof err), FA_OK);
		for (int i = 0; i < n; i++)
			assert_true(t[i].path != FA_KPATH_BWDWG16);
	}
	const struct { fa_dtype dt; fa_precision p; int D; } no[] = {
		{FA_DTYPE_FP32, FA_PREC_BF16, 128}, {FA_DTYPE_FP32, FA_PREC_TF32, 64},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 256}, {FA_DTYPE_FP32, FA_PREC_IEEE, 136}};
	for (int i = 0; i < 4; i++) {
		struct fa_plan_req q = req(no[i].dt, no[i].p, no[i].D, FA_MASK_NONE);
		q.ks = &ks;
		assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
		                 FA_OK);
		for (int k = 0; k < n; k++)
			assert_true(t[k].path != FA_KPATH_BWDWG16);
	}
	/* auto: head dims 64 to 128 (measured faster); FA_WGMMA16_BWD=1: every head dim up to
	 * 128, its tiles passing the layout check */
	struct fa_kernel_settings all = ks;
	assert_int_equal(fa_kernel_settings_set(&all, "FA_WGMMA16_BWD", "1", err, sizeof err), FA_OK);
	for (int D = 8; D <= 128; D += 8) {
		struct fa_plan_req q = req(FA_DTYPE_FP16, FA_PREC_DEFAULT, D, FA_MASK_CAUSAL_TOP_LEFT);
		q.ks = &ks;
		assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
		                 FA_OK);
		assert_int_equal(t[0].path == FA_KPATH_BWDWG16, D >= 64);
		q.ks = &all;
		assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
		                 FA_OK);
		assert_int_equal(t[0].path, FA_KPATH_BWDWG16);
		assert_true(fa_bwd_tile_layout_ok(&t[0], D));
	}
	/* the wide form, head dims 136 to 256 (auto from 192: measured faster there,
	 * kernels/RESULTS.md; FA_WGMMA16_BWD=1 from 136): two warpgroups, 64 keys, 64 query rows;
	 * K, V, 2 x (Q, dO) with the head dim padded to 32, P^T and dS^T (64 x 64), 2 x (lse2,
	 * delta); attn_bwd.cu's tiles next */
	for (int D = 136; D <= 256; D += 8) {
		struct fa_plan_req q = req(D % 16 ? FA_DTYPE_FP16 : FA_DTYPE_BF16, FA_PREC_DEFAULT, D,
		                           (fa_mask)(D / 8 % 3));
		q.ks = &ks;
		assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
		                 FA_OK);
		assert_int_equal(t[0].path == FA_KPATH_BWDWG16, D >= 192);
		q.ks = &all;
		assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
		                 FA_OK);
		assert_int_equal(t[0].path, FA_KPATH_BWDWG16);
		assert_int_equal(t[0].nw, 8);
		assert_int_equal(t[0].bc, 64);
		assert_int_equal(t[0].br, 64);
		const int dp = (D + 31) / 32 * 32;
		assert_int_equal(fa_bwd_padded_d(t[0].path, D), dp);
		/* K, V, two buffers of Q and dO, P^T and dS^T, lse2 and delta, four staged dQ rows */
		assert_int_equal(t[0].smem,
		                 2 * (2 * 64 * dp + 4 * 64 * dp + 2 * 64 * 64) + 4 * 4 * 64 + 4 * 4 * dp);
		assert_true(t[0].smem <= h200->smem_optin);
		assert_true(fa_bwd_tile_layout_ok(&t[0], D));
		assert_true(fa_bwd_tile_regs(&t[0], D, FA_PREC_DEFAULT) < 240); /* ptxas: 154..218 */
		assert_true(n > 1 && t[1].path == FA_KPATH_BWD16);
		struct fa_tile one = t[0];
		one.nw = 4;
		assert_false(fa_bwd_tile_layout_ok(&one, D));
		one = t[0];
		one.bc = 128;
		assert_false(fa_bwd_tile_layout_ok(&one, D));
	}
	{
		struct fa_plan_req q = req(FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, FA_MASK_NONE);
		q.ks = &ks;
		assert_int_equal(fa_plan_bwd(h200, &q, t, 1, &n, err, sizeof err), FA_OK);
		assert_int_equal(t[0].smem, 218112); /* under sm_90's 232,448 with both buffers */
		q.D = 264;
		assert_int_not_equal(fa_plan_bwd(h200, &q, t, 1, &n, err, sizeof err), FA_OK);
	}
	struct fa_plan_req q128 = req(FA_DTYPE_FP16, FA_PREC_DEFAULT, 128, FA_MASK_CAUSAL_TOP_LEFT);
	q128.ks = &all;
	assert_int_equal(fa_plan_bwd(h200, &q128, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err),
	                 FA_OK);
	struct fa_tile bad = t[0];
	bad.br = 32;
	assert_false(fa_bwd_tile_layout_ok(&bad, 64));
	bad = t[0];
	assert_false(fa_bwd_tile_layout_ok(&bad, 136));
	bad.bc = 64;
	assert_false(fa_bwd_tile_layout_ok(&bad, 64)); /* two warpgroups own 128 keys */
	/* the switches */
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_WGMMA16_BWD", "0", err, sizeof err), FA_OK);
	assert_true(fa_kernel_settings_get(&ks, "FA_WGMMA16_BWD", buf, sizeof buf));
	assert_string_equal(buf, "0");
	assert_int_equal(fa_plan_bwd(h200, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	for (int k = 0; k < n; k++)
		assert_true(t[k].path != FA_KPATH_BWDWG16);
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_WGMMA16_BWD", "1", err, sizeof err), FA_OK);
	assert_true(fa_kernel_settings_get(&ks, "FA_WGMMA16_BWD", buf, sizeof buf));
	assert_string_equal(buf, "1");
	assert_int_equal(ks.wgmma16, FA_WGMMA16_MEASURED); /* the forward's switch is its own */
	ks.wgmma = false;
	assert_int_equal(fa_plan_bwd(h200, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_true(t[0].path != FA_KPATH_BWDWG16);
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_WGMMA16_BWD", "yes", err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "FA_WGMMA16_BWD"));
	bool listed = false;
	for (const char *const *nm = fa_kernel_settings_names(); *nm; nm++)
		listed |= strcmp(*nm, "FA_WGMMA16_BWD") == 0;
	assert_true(listed);
}

/* The sliding window and softcap reach the planner (fa_plan_req_from_desc: a window only when
 * it bounds a side) and change no candidate: on sm_90 the wgmma backward serves them (its
 * FA_WIN / FA_SOFTCAP specialisations, narrow and wide forms, atomic and deterministic), first
 * as without them; elsewhere attn_bwd.cu's tiles, the same as without them. */
static void test_planner_bwd_window_and_softcap_plan_the_same_tiles(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc d;
	memset(&d, 0, sizeof d);
	d.dtype = FA_DTYPE_BF16;
	d.D = 128;
	d.B = 2;
	d.Hq = 8;
	d.Sq = d.Sk = 4096;
	d.window = true;
	d.window_left = 1023;
	d.window_right = 0;
	d.softcap = 30.0;
	struct fa_plan_req r;
	fa_plan_req_from_desc(&d, &r);
	assert_true(r.window);
	assert_int_equal(r.window_left, 1023);
	assert_int_equal(r.window_right, 0);
	assert_true(r.softcap == 30.0);
	d.window_left = d.window_right = -1; /* bounds nothing: runs as none */
	d.softcap = -1;
	fa_plan_req_from_desc(&d, &r);
	assert_false(r.window);
	assert_true(r.softcap == 0);

	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT;
	const char *archs[] = {"sm_90", "sm_80", "sm_86", "sm_120"};
	const int Ds[] = {64, 128, 192, 256};
	for (int a = 0; a < 4; a++)
		for (int i = 0; i < 4; i++)
			for (int m = 0; m < 3; m++) {
				const struct fa_device_model *dev = fa_device_model_find(archs[a]);
				struct fa_plan_req q = req(i % 2 ? FA_DTYPE_FP16 : FA_DTYPE_BF16,
				                           FA_PREC_DEFAULT, Ds[i], (fa_mask)m);
				q.ks = &ks;
				q.Sq = q.Sk = 4096;
				q.B = 2;
				q.H = 16;
				struct fa_tile t0[FA_PLAN_MAX_CANDIDATES], t1[FA_PLAN_MAX_CANDIDATES];
				int n0 = 0, n1 = 0;
				char err[512];
				assert_int_equal(fa_plan_bwd(dev, &q, t0, FA_PLAN_MAX_CANDIDATES, &n0, err,
				                             sizeof err), FA_OK);
				q.window = m != 1;
				q.window_left = 255 * (m + 1);
				q.window_right = m == 0 ? 255 : 0;
				q.softcap = m != 2 ? 30.0 : 0;
				assert_int_equal(fa_plan_bwd(dev, &q, t1, FA_PLAN_MAX_CANDIDATES, &n1, err,
				                             sizeof err), FA_OK);
				assert_int_equal(n0, n1);
				for (int k = 0; k < n0; k++) {
					assert_int_equal(t0[k].path, t1[k].path);
					assert_int_equal(t0[k].bc, t1[k].bc);
					assert_int_equal(t0[k].nw, t1[k].nw);
				}
				assert_int_equal(t1[0].path == FA_KPATH_BWDWG16, a == 0);
			}
}

/* The fp32 wgmma backward (attn_bwd_sm90_tf32.cu): under FA_WGMMA32_BWD=1 offered first on sm_90
 * for fp32 tf32 up to head dim 128 (64 query rows a step where both buffers fit, 32 above)
 * and 3xtf32 up to 64 (32 rows; above, its images pass 227 KiB), never for ieee or the bf16
 * staging, above 128, off sm_90, with FA_WGMMA=0 or FA_WGMMA32_BWD=0; under "auto" where it
 * measured faster (FP32WG_AUTO); its shared memory is the kernel's layout; the setting parses
 * like FA_WGMMA16_BWD. */
static bool fp32wg_auto(fa_precision p, int D)
{
	/* measured faster on the H200 (kernels/RESULTS.md): tf32 64..128, 3xtf32 64 */
	return p == FA_PREC_TF32 ? D >= 64 && D <= 128 : D == 64;
}

static void test_planner_bwd_fp32_wgmma_path(void **state)
{
	(void)state;
	struct fa_kernel_settings ks = FA_KERNEL_SETTINGS_INIT, all = FA_KERNEL_SETTINGS_INIT;
	char err[512], buf[16];
	assert_int_equal(fa_kernel_settings_set(&all, "FA_WGMMA32_BWD", "1", err, sizeof err), FA_OK);
	assert_true(fa_kernel_settings_get(&all, "FA_WGMMA32_BWD", buf, sizeof buf));
	assert_string_equal(buf, "1");
	assert_int_equal(all.wgmma16_bwd, FA_WGMMA16_MEASURED); /* the 16-bit switch is its own */
	const struct fa_device_model *h200 = fa_device_model_find("sm_90");
	struct fa_tile t[FA_PLAN_MAX_CANDIDATES];
	int n = 0;
	for (int pi = 0; pi < 2; pi++)
		for (int D = 8; D <= 136; D += 8) {
			const fa_precision p = pi ? FA_PREC_3XTF32 : FA_PREC_TF32;
			struct fa_plan_req q = req(FA_DTYPE_FP32, p, D, (fa_mask)(D / 8 % 3));
			q.ks = &ks;
			assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err,
			                             sizeof err), FA_OK);
			assert_int_equal(fa_kpath_is_bwdwg32(t[0].path), fp32wg_auto(p, D));
			q.ks = &all;
			assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err,
			                             sizeof err), FA_OK);
			const bool fits = D <= (pi ? 64 : 128);
			assert_int_equal(fa_kpath_is_bwdwg32(t[0].path), fits);
			for (int k = fits ? 1 : 0; k < n; k++) /* attn_bwd.cu's tiles after it */
				assert_true(t[k].path == FA_KPATH_BWD32 || fa_kpath_is_bwdwg32(t[k].path));
			assert_true(n > 1 && !fa_kpath_is_bwdwg32(t[n - 1].path));
			if (!fits)
				continue;
			assert_int_equal(t[0].path, pi ? FA_KPATH_BWDWG32X3 : FA_KPATH_BWDWG32);
			assert_int_equal(t[0].nw, 8); /* two warpgroups, then one */
			assert_true(n > 1 && t[1].path == t[0].path && t[1].nw == 4 && t[1].br == t[0].br);
			assert_int_equal(t[0].bc, 64);
			const int dp = (D + 15) / 16 * 16, dqp = (D + 63) / 64 * 64, ni = pi ? 2 : 1;
			const int bq = t[0].br;
			assert_int_equal(bq, !pi && D <= 64 ? 64 : 32);
			const size_t ds = dp >= 64 ? 0 : (size_t)bq * 64 * 2;
			assert_int_equal(t[0].smem, 4 * ni * (2 * 64 * dp + dqp * 64 + 8 * bq * dp + ds) +
			                                16 * bq);
			assert_true(t[0].smem <= h200->smem_optin);
			assert_true(fa_bwd_tile_layout_ok(&t[0], D));
			assert_int_equal(fa_bwd_padded_d(t[0].path, D), dp);
			assert_true(fa_bwd_tile_regs(&t[0], D, p) <= 255);
			struct fa_tile bad = t[0];
			bad.nw = 2;
			assert_false(fa_bwd_tile_layout_ok(&bad, D));
			bad = t[0];
			bad.bc = 128;
			assert_false(fa_bwd_tile_layout_ok(&bad, D));
			bad = t[0];
			bad.br = 16;
			assert_false(fa_bwd_tile_layout_ok(&bad, D));
		}
	{ /* the largest: tf32 and 3xtf32 at their limits, 229,888 bytes of 232,448 */
		struct fa_plan_req q = req(FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_NONE);
		q.ks = &all;
		assert_int_equal(fa_plan_bwd(h200, &q, t, 1, &n, err, sizeof err), FA_OK);
		assert_int_equal(t[0].smem, 229888);
		q.precision = FA_PREC_3XTF32;
		q.D = 64;
		assert_int_equal(fa_plan_bwd(h200, &q, t, 1, &n, err, sizeof err), FA_OK);
		assert_int_equal(t[0].smem, 229888);
		struct fa_tile x3 = t[0];
		x3.br = 64; /* 3xtf32: 32 rows only (its registers) */
		assert_false(fa_bwd_tile_layout_ok(&x3, 64));
	}
	{ /* a window or softcap (the kernel has neither): attn_bwd.cu's tiles only, so that
	   * what fa-ctl plan shows is what gpu_bwd.c runs */
		struct fa_plan_req q = req(FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_NONE);
		q.ks = &all;
		for (int w = 0; w < 3; w++) {
			q.window = w == 1;
			q.window_left = w == 1 ? 255 : -1;
			q.window_right = w == 1 ? 0 : -1;
			q.softcap = w == 2 ? 30.0 : 0;
			assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err,
			                             sizeof err), FA_OK);
			for (int k = 0; k < n; k++)
				assert_int_equal(fa_kpath_is_bwdwg32(t[k].path), w == 0 && k < 2);
		}
	}
	/* never: other precisions and dtypes, other devices, the switches off */
	const struct { fa_dtype dt; fa_precision p; int D; const char *arch; } no[] = {
		{FA_DTYPE_FP32, FA_PREC_IEEE, 64, "sm_90"},  {FA_DTYPE_FP32, FA_PREC_BF16, 128, "sm_90"},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, "sm_90"}, {FA_DTYPE_FP32, FA_PREC_TF32, 128, "sm_80"},
		{FA_DTYPE_FP32, FA_PREC_TF32, 64, "sm_100"}, {FA_DTYPE_FP32, FA_PREC_3XTF32, 64, "sm_86"}};
	for (int i = 0; i < 6; i++) {
		struct fa_plan_req q = req(no[i].dt, no[i].p, no[i].D, FA_MASK_NONE);
		q.ks = &all;
		assert_int_equal(fa_plan_bwd(fa_device_model_find(no[i].arch), &q, t,
		                             FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
		for (int k = 0; k < n; k++)
			assert_false(fa_kpath_is_bwdwg32(t[k].path));
	}
	struct fa_plan_req q = req(FA_DTYPE_FP32, FA_PREC_TF32, 128, FA_MASK_NONE);
	struct fa_kernel_settings off = all;
	q.ks = &off;
	off.wgmma = false;
	assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_false(fa_kpath_is_bwdwg32(t[0].path));
	off = all;
	assert_int_equal(fa_kernel_settings_set(&off, "FA_WGMMA32_BWD", "0", err, sizeof err), FA_OK);
	assert_true(fa_kernel_settings_get(&off, "FA_WGMMA32_BWD", buf, sizeof buf));
	assert_string_equal(buf, "0");
	assert_int_equal(fa_plan_bwd(h200, &q, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	for (int k = 0; k < n; k++)
		assert_false(fa_kpath_is_bwdwg32(t[k].path));
	assert_int_equal(fa_kernel_settings_set(&off, "FA_WGMMA32_BWD", "auto", err, sizeof err),
	                 FA_OK);
	assert_int_equal(off.wgmma32_bwd, FA_WGMMA16_MEASURED);
	assert_int_equal(fa_kernel_settings_set(&off, "FA_WGMMA32_BWD", "2", err, sizeof err),
	                 FA_EINVAL);
	assert_non_null(strstr(err, "FA_WGMMA32_BWD"));
	bool listed = false;
	for (const char *const *nm = fa_kernel_settings_names(); *nm; nm++)
		listed |= strcmp(*nm, "FA_WGMMA32_BWD") == 0;
	assert_true(listed);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_planner_bwd_smem_is_the_kernels_layout),
		cmocka_unit_test(test_planner_bwd_layout_rules),
		cmocka_unit_test(test_planner_bwd_fits_the_issues_cases),
		cmocka_unit_test(test_planner_bwd_every_shape_plans_within_the_limit),
		cmocka_unit_test(test_planner_bwd_explains_when_nothing_fits),
		cmocka_unit_test(test_planner_bwd_rejects_bad_requests),
		cmocka_unit_test(test_planner_bwd_det_group_setting),
		cmocka_unit_test(test_planner_bwd_wgmma_path),
		cmocka_unit_test(test_planner_bwd_window_and_softcap_plan_the_same_tiles),
		cmocka_unit_test(test_planner_bwd_fp32_wgmma_path),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
