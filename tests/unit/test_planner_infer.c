/* test_planner_infer.c - the routing of inference descriptors between the decode and prefill
 * kernels, and the decode plan over the longest sequence (kernels/planner_infer.c), without a
 * GPU: the lengths read from each layout's tables, the FA_DECODE modes, the plan against the
 * dense plan of the longest sequence, an all-empty batch, and the grid's limits; with a sliding
 * window, splits over the window's keys only that still cover every sequence's own window. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_infer_route.h"
#include "fa_test.h"

/* A paged batch (bf16, D=128, 32 query heads, 8 kv heads) of B sequences of `lens` keys and
 * dense queries Sq, pages of 16 in order. */
static int32_t lens_buf[64], pt_buf[64 * 600];
static void paged(struct fa_attn_infer_desc *d, int64_t B, int64_t Sq, const int32_t *lens)
{
	memset(d, 0, sizeof *d);
	struct fa_attn_fwd_desc *f = &d->fwd;
	f->dtype = FA_DTYPE_BF16;
	f->scale = 0.088;
	f->B = B;
	f->Sq = Sq;
	f->Hq = 32;
	f->Hkv = 8;
	f->D = 128;
	int64_t q[3] = {Sq * 32 * 128, 32 * 128, 128}, k[3] = {16 * 8 * 128, 8 * 128, 128};
	memcpy(f->q_stride, q, sizeof q);
	memcpy(f->o_stride, q, sizeof q);
	memcpy(f->k_stride, k, sizeof k);
	memcpy(f->v_stride, k, sizeof k);
	f->lse_stride[0] = 32 * Sq;
	f->lse_stride[1] = Sq;
	f->lse_stride[2] = 1;
	d->kv = FA_KV_PAGED;
	d->page_size = 16;
	d->pt_cols = 600;
	d->pages = 64 * 600;
	f->Sk = 600 * 16;
	for (int64_t b = 0; b < B; b++) {
		lens_buf[b] = lens[b];
		for (int64_t p = 0; p < 600; p++)
			pt_buf[b * 600 + p] = (int32_t)(b * 600 + p);
	}
	d->seqlens_k = lens_buf;
	d->page_table = pt_buf;
}

static void test_infer_route_reads_the_longest_sequence(void **state)
{
	(void)state;
	struct fa_attn_infer_desc d;
	int32_t lens[4] = {5, 8192, 0, 17};
	paged(&d, 4, 3, lens);
	char err[256];
	assert_int_equal(fa_attn_infer_check(&d, err, sizeof err), FA_OK);
	int64_t sq, sk;
	fa_infer_longest(&d, &sq, &sk);
	assert_int_equal(sq, 3);
	assert_int_equal(sk, 8192);
	/* packed queries and keys */
	int32_t cu_q[4] = {0, 2, 2, 9}, cu_k[4] = {4, 104, 104, 4200};
	d.cu_q = cu_q;
	d.total_q = 12;
	d.kv = FA_KV_PACKED;
	d.cu_k = cu_k;
	d.total_k = 4300;
	d.fwd.B = 3;
	d.fwd.Sq = 16;
	d.fwd.Sk = 8192;
	d.fwd.q_stride[0] = d.fwd.o_stride[0] = 12 * 32 * 128;
	d.fwd.k_stride[0] = d.fwd.v_stride[0] = 4300 * 8 * 128;
	assert_int_equal(fa_attn_infer_check(&d, err, sizeof err), FA_OK);
	fa_infer_longest(&d, &sq, &sk);
	assert_int_equal(sq, 7);
	assert_int_equal(sk, 4096);
}

static void test_infer_route_sends_decode_shapes_to_the_decode_kernel(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("h200");
	struct fa_attn_infer_desc d;
	int32_t lens[2] = {100, 9000};
	paged(&d, 2, 1, lens);
	int32_t cu_q[3] = {0, FA_DECODE_MAX_SQ, FA_DECODE_MAX_SQ + 3};
	d.cu_q = cu_q;
	d.total_q = FA_DECODE_MAX_SQ + 3;
	d.fwd.Sq = FA_DECODE_MAX_SQ + 1;
	assert_true(fa_infer_decode_wanted(dev, &d, NULL)); /* 16 and 3 queries */
	cu_q[2] = 2 * FA_DECODE_MAX_SQ + 1;                  /* 16 and 17 */
	d.total_q = cu_q[2];
	assert_false(fa_infer_decode_wanted(dev, &d, NULL));
	struct fa_kernel_settings ks = *fa_kernel_settings_default();
	char err[256];
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE", "1", err, sizeof err), FA_OK);
	assert_true(fa_infer_decode_wanted(dev, &d, &ks));
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE", "0", err, sizeof err), FA_OK);
	cu_q[2] = FA_DECODE_MAX_SQ + 3;
	assert_false(fa_infer_decode_wanted(dev, &d, &ks));
}

static void test_infer_route_plans_for_the_longest_sequence(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("h200");
	struct fa_attn_infer_desc d;
	int32_t lens[16];
	struct fa_attn_fwd_desc pd, dense;
	struct fa_decode_plan p, q;
	char err[256];
	/* uniform lengths: exactly the dense plan (the split the sweep measured best) */
	for (int b = 0; b < 16; b++)
		lens[b] = 8192;
	paged(&d, 16, 1, lens);
	assert_int_equal(fa_infer_plan_decode(dev, &d, NULL, &pd, &p, err, sizeof err), FA_OK);
	assert_int_equal(pd.Sq, 1);
	assert_int_equal(pd.Sk, 8192);
	dense = d.fwd;
	dense.Sk = 8192;
	assert_int_equal(fa_plan_decode(dev, &dense, NULL, NULL, &q, err, sizeof err), FA_OK);
	assert_int_equal(p.nsplit, q.nsplit);
	assert_int_equal(p.split_keys, q.split_keys);
	assert_int_equal(p.tile.br, q.tile.br);
	/* one long sequence among short ones: the dense plan's one split would leave its blocks
	 * the critical path; the ragged rule splits it, covering every key */
	for (int b = 0; b < 16; b++)
		lens[b] = b == 5 ? 8192 : 1 + 37 * b;
	paged(&d, 16, 1, lens);
	assert_int_equal(fa_infer_plan_decode(dev, &d, NULL, &pd, &p, err, sizeof err), FA_OK);
	assert_int_equal(pd.Sk, 8192);
	printf("one 8k sequence among 15 short ones: %d splits of %d keys (dense plan: %d)\n",
	       p.nsplit, p.split_keys, q.nsplit);
	assert_true(p.nsplit > q.nsplit);
	assert_true((int64_t)p.split_keys * p.nsplit >= 8192);
	assert_true(p.scratch > 0);
	/* ... unless the settings force a split */
	struct fa_kernel_settings ks = *fa_kernel_settings_default();
	assert_int_equal(fa_kernel_settings_set(&ks, "FA_DECODE_SPLITS", "1", err, sizeof err), FA_OK);
	assert_int_equal(fa_infer_plan_decode(dev, &d, &ks, &pd, &p, err, sizeof err), FA_OK);
	assert_int_equal(p.nsplit, 1);
	/* every sequence empty: still a plan (its blocks all exit), of one split */
	memset(lens, 0, sizeof lens);
	paged(&d, 16, 1, lens);
	assert_int_equal(fa_infer_plan_decode(dev, &d, NULL, &pd, &p, err, sizeof err), FA_OK);
	assert_int_equal(pd.Sk, 1);
	assert_int_equal(p.nsplit, 1);
	/* over the grid: a contiguous cache of 70000 sequences */
	int32_t *many = calloc(70000, sizeof *many);
	assert_non_null(many);
	d.fwd.B = 70000;
	d.kv = FA_KV_CACHE;
	d.seqlens_k = many;
	d.page_table = NULL;
	assert_int_equal(fa_infer_plan_decode(dev, &d, NULL, &pd, &p, err, sizeof err), FA_ESHAPE);
	assert_non_null(strstr(err, "70000 sequences"));
	free(many);
}

/* A window over a ragged batch: the splits cover the keys each row chunk of each sequence walks
 * (attn_decode.cu: from the tile of its first row's first key to its last row's last key, the
 * window aligned per sequence) without leaning on the kernel's last-split rule, for windows of
 * several shapes, every mask, query counts 1..16; and a 4096-key window over a 16k cache plans
 * splits of the window, not of the cache. */
static void test_infer_route_splits_a_window_and_covers_every_sequence(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("h200");
	struct fa_attn_infer_desc d;
	struct fa_attn_fwd_desc pd;
	struct fa_decode_plan p;
	char err[256];
	int32_t lens[16];
	static const int64_t wins[][2] = {{4096, 0}, {100, 0}, {0, 0}, {37, 5}, {-1, 3},
	                                  {1000, -1}, {16, 16}, {5000, 200}};
	static const fa_mask masks[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT,
	                                FA_MASK_CAUSAL_TOP_LEFT};
	uint64_t rng = 0x5eedu;
	int checked = 0;
	for (int w = 0; w < 8; w++)
		for (int m = 0; m < 3; m++)
			for (int sq = 1; sq <= 16; sq += 5) {
				for (int b = 0; b < 16; b++)
					lens[b] = (int32_t)(fa_rand_range(&rng, 0, 9000));
				paged(&d, 16, sq, lens);
				d.fwd.mask = masks[m];
				d.fwd.window = true;
				d.fwd.window_left = wins[w][0];
				d.fwd.window_right = wins[w][1];
				assert_int_equal(fa_attn_infer_check(&d, err, sizeof err), FA_OK);
				assert_int_equal(fa_infer_plan_decode(dev, &d, NULL, &pd, &p, err, sizeof err),
				                 FA_OK);
				assert_int_equal(p.split_keys % 16, 0);
				const int64_t group = 4, br = p.tile.br;
				for (int b = 0; b < 16; b++)
					for (int64_t r0 = 0; r0 < sq * group; r0 += br) {
						const int64_t rl = (r0 + br < sq * group ? r0 + br : sq * group) - 1;
						int64_t lo, hi, lo1, hi1;
						fa_attn_key_range(&d.fwd, sq, lens[b], r0 / group, &lo, &hi);
						fa_attn_key_range(&d.fwd, sq, lens[b], rl / group, &lo1, &hi1);
						if (hi1 <= lo)
							continue; /* this chunk sees nothing */
						const int64_t kbase = lo / 16 * 16;
						const int64_t ns = (lens[b] + p.split_keys - 1) / p.split_keys;
						const int64_t splits = ns < p.nsplit ? (ns > 0 ? ns : 1) : p.nsplit;
						if (kbase + splits * p.split_keys < hi1)
							fail_msg("window (%lld, %lld) mask %d Sq %d: sequence %d of %d "
							         "keys, rows %lld..: keys %lld..%lld, %lld splits of %d",
							         (long long)wins[w][0], (long long)wins[w][1], m, sq, b,
							         lens[b], (long long)r0, (long long)kbase, (long long)hi1,
							         (long long)splits, p.split_keys);
						checked++;
					}
			}
	printf("%d windowed row chunks covered\n", checked);
	assert_true(checked > 1000);
	/* time follows the window: B=1, 16k keys, a 4096-key window, one query */
	lens[0] = 16384;
	paged(&d, 1, 1, lens);
	d.fwd.window = true;
	d.fwd.window_left = 4095;
	d.fwd.window_right = 0;
	assert_int_equal(fa_infer_plan_decode(dev, &d, NULL, &pd, &p, err, sizeof err), FA_OK);
	printf("a 4096-key window over 16384 keys: %d splits of %d keys\n", p.nsplit, p.split_keys);
	assert_true((int64_t)p.nsplit * p.split_keys >= 4096);
	assert_true((int64_t)p.nsplit * p.split_keys <= 4096 + 16 * p.nsplit);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_infer_route_reads_the_longest_sequence),
		cmocka_unit_test(test_infer_route_sends_decode_shapes_to_the_decode_kernel),
		cmocka_unit_test(test_infer_route_plans_for_the_longest_sequence),
		cmocka_unit_test(test_infer_route_splits_a_window_and_covers_every_sequence),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
