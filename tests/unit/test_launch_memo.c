/* test_launch_memo.c - the launch memo (kernels/fa_launch_memo.h) without a GPU: its key
 * separates every field the launch's choice reads and nothing else, a hit returns the plan
 * fa_launch_plan_make (fa_gpu_attn_fwd_tile's planning) makes for the descriptor at hand, a
 * tuning table's change or another table makes a plan stale, hits count in the table as the
 * picks they replace, and the table stays consistent under threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include <cmocka.h>

#include "fa_launch_memo.h"
#include "fa_settings.h"

/* A dense BSHD descriptor. */
static struct fa_attn_fwd_desc desc(fa_dtype dt, fa_precision p, fa_mask m, int64_t B,
                                    int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv, int64_t D)
{
	struct fa_attn_fwd_desc d;
	memset(&d, 0, sizeof d);
	d.dtype = dt;
	d.precision = p;
	d.mask = m;
	d.scale = 0.125;
	d.B = B;
	d.Sq = Sq;
	d.Sk = Sk;
	d.Hq = Hq;
	d.Hkv = Hkv;
	d.D = D;
	const int64_t qs[3] = {Sq * Hq * D, Hq * D, D}, ks[3] = {Sk * Hkv * D, Hkv * D, D};
	for (int i = 0; i < 3; i++) {
		d.q_stride[i] = d.o_stride[i] = qs[i];
		d.k_stride[i] = d.v_stride[i] = ks[i];
	}
	d.lse_stride[0] = Hq * Sq;
	d.lse_stride[1] = Sq;
	d.lse_stride[2] = 1;
	return d;
}

/* The same problem as d in the BHSD layout, another scale: the same key. */
static struct fa_attn_fwd_desc relaid(const struct fa_attn_fwd_desc *d)
{
	struct fa_attn_fwd_desc e = *d;
	e.scale = -0.3;
	e.q_stride[0] = e.o_stride[0] = d->Hq * d->Sq * d->D + 64;
	e.q_stride[1] = e.o_stride[1] = d->D;
	e.q_stride[2] = e.o_stride[2] = d->Sq * d->D;
	e.k_stride[0] = e.v_stride[0] = d->Hkv * d->Sk * d->D;
	e.k_stride[1] = e.v_stride[1] = d->D;
	e.k_stride[2] = e.v_stride[2] = d->Sk * d->D;
	e.lse_stride[1] = d->Sq + 8;
	return e;
}

static bool key_eq(const struct fa_attn_fwd_desc *a, const struct fa_attn_fwd_desc *b)
{
	struct fa_launch_key x, y;
	fa_launch_key_make(a, &x);
	fa_launch_key_make(b, &y);
	return fa_launch_key_equal(&x, &y);
}

static void test_memo_key_ignores_strides_scale_and_sides_of_no_window(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc a = desc(FA_DTYPE_BF16, FA_PREC_DEFAULT, FA_MASK_NONE, 8, 4096, 4096,
	                                 16, 16, 128);
	struct fa_attn_fwd_desc b = relaid(&a);
	assert_true(key_eq(&a, &b));
	b = a;
	b.window_left = 100; /* no window: its sides choose nothing */
	b.window_right = 3;
	assert_true(key_eq(&a, &b));
	b = a;
	b.softcap = -0.0; /* off either way */
	assert_true(key_eq(&a, &b));
}

static void test_memo_key_differs_in_every_field_the_choice_reads(void **state)
{
	(void)state;
	const struct fa_attn_fwd_desc a = desc(FA_DTYPE_FP32, FA_PREC_TF32, FA_MASK_NONE, 2, 256,
	                                       512, 8, 4, 64);
	struct fa_attn_fwd_desc b;
#define DIFFERS(stmt)                                                                      \
	do {                                                                               \
		b = a;                                                                     \
		stmt;                                                                      \
		if (key_eq(&a, &b))                                                        \
			fail_msg("the key does not see: %s", #stmt);                       \
	} while (0)
	DIFFERS(b.dtype = FA_DTYPE_FP16);
	DIFFERS(b.precision = FA_PREC_3XTF32);
	DIFFERS(b.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT);
	DIFFERS(b.mask = FA_MASK_CAUSAL_TOP_LEFT);
	DIFFERS(b.D = 128);
	DIFFERS(b.B = 3);
	DIFFERS(b.Sq = 257);
	DIFFERS(b.Sk = 511);
	DIFFERS(b.Hq = 16);
	DIFFERS(b.Hkv = 8);
	DIFFERS(b.window = true);
	DIFFERS((b.window = true, b.window_left = 5));
	DIFFERS(b.softcap = 30.0);
#undef DIFFERS
	struct fa_attn_fwd_desc w = a, w2;
	w.window = true;
	w.window_left = 64;
	w.window_right = 0;
	w2 = w;
	w2.window_left = 65;
	assert_false(key_eq(&w, &w2));
	w2 = w;
	w2.window_right = 1;
	assert_false(key_eq(&w, &w2));
}

static bool plan_same(const struct fa_launch_plan *a, const struct fa_launch_plan *b)
{
	return a->decode == b->decode && memcmp(&a->spec, &b->spec, sizeof a->spec) == 0 &&
	       (!a->decode || memcmp(&a->dp, &b->dp, sizeof a->dp) == 0) &&
	       a->tuned == b->tuned && a->tune_src == b->tune_src;
}

/* Over dtypes, precisions, head dims, masks, windows, softcaps, GQA and shapes on both sides of
 * the decode threshold, on three device models: a plan remembered for a descriptor is, field for
 * field, the plan fa_launch_plan_make makes for another descriptor of the same key. Each group
 * (model, type, head dim: 54 shapes) is put whole before it is looked up, so two shapes that
 * shared a key would read each other's plan; a miss is allowed only where a full set evicted. */
#define NEXT 3
#define NSHAPES 6
#define NMASKS 3
static void test_memo_hit_is_the_planners_choice_for_every_shape(void **state)
{
	(void)state;
	static const char *const models[] = {"h200", "sm_80", "sm_89"};
	static const struct {
		fa_dtype dt;
		fa_precision p;
	} types[] = {{FA_DTYPE_BF16, FA_PREC_DEFAULT}, {FA_DTYPE_FP16, FA_PREC_DEFAULT},
	             {FA_DTYPE_FP32, FA_PREC_DEFAULT}, {FA_DTYPE_FP32, FA_PREC_TF32},
	             {FA_DTYPE_FP32, FA_PREC_BF16}, {FA_DTYPE_FP32, FA_PREC_IEEE}};
	static const int Ds[] = {64, 80, 128, 256};
	static const fa_mask masks[NMASKS] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT,
	                                      FA_MASK_CAUSAL_TOP_LEFT};
	static const int64_t shapes[NSHAPES][5] = {/* B, Sq, Sk, Hq, Hkv */
	                                           {1, 128, 128, 16, 16}, {8, 4096, 4096, 16, 16},
	                                           {1, 1, 8192, 32, 8},   {1, 1, 8192, 32, 32},
	                                           {2, 17, 300, 4, 4},    {1, 1000, 77, 6, 2}};
	enum { GROUP = NMASKS * NSHAPES * NEXT };
	char err[256];
	int checked = 0, decodes = 0;
	struct fa_launch_memo *m = malloc(sizeof *m);
	struct fa_launch_plan *want = malloc(GROUP * sizeof *want);
	struct fa_attn_fwd_desc *ds = malloc(GROUP * sizeof *ds);
	bool *ok = malloc(GROUP * sizeof *ok);
	assert_true(m && want && ds && ok);
	for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
		const struct fa_device_model *dev = fa_device_model_find(models[mi]);
		assert_non_null(dev);
		for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
			for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) {
				fa_launch_memo_init(m);
				for (int g = 0; g < GROUP; g++) {
					const int ki = g / (NSHAPES * NEXT), si = g / NEXT % NSHAPES,
					          ext = g % NEXT;
					const int64_t *sh = shapes[si];
					struct fa_attn_fwd_desc d = desc(types[ti].dt, types[ti].p,
					                                 masks[ki], sh[0], sh[1], sh[2],
					                                 sh[3], sh[4], Ds[di]);
					if (ext == 1) {
						d.window = true;
						d.window_left = 64;
						d.window_right = masks[ki] == FA_MASK_NONE ? 16 : -1;
					} else if (ext == 2) {
						d.softcap = 30.0;
					}
					ds[g] = d;
					/* a shape that does not fit this model: nothing to remember */
					ok[g] = fa_launch_plan_make(dev, NULL, NULL, &d, NULL, &want[g], err,
					                            sizeof err) == FA_OK;
					if (!ok[g])
						continue;
					want[g].kernel = &want[g]; /* any pointer: the memo hands it back */
					struct fa_launch_key k;
					fa_launch_key_make(&d, &k);
					fa_launch_memo_put(m, &k, NULL, 0, &want[g]);
				}
				for (int g = 0; g < GROUP; g++) {
					if (!ok[g])
						continue;
					const struct fa_attn_fwd_desc e = relaid(&ds[g]);
					struct fa_launch_key k;
					struct fa_launch_plan got, again;
					fa_launch_key_make(&e, &k);
					if (!fa_launch_memo_get(m, &k, NULL, 0, &got)) {
						/* only a full set forgets */
						struct fa_launch_memo_stats st;
						fa_launch_memo_stats(m, &st);
						assert_true(st.evictions > 0);
						continue;
					}
					assert_ptr_equal(got.kernel, &want[g]);
					assert_int_equal(fa_launch_plan_make(dev, NULL, NULL, &e, NULL, &again,
					                                     err, sizeof err),
					                 FA_OK);
					if (!plan_same(&got, &again))
						fail_msg("%s %s d%d mask %d B%lld Sq%lld Sk%lld Hkv%lld: the "
						         "memo's plan is not the planner's", models[mi],
						         fa_dtype_name(e.dtype), (int)e.D, (int)e.mask,
						         (long long)e.B, (long long)e.Sq, (long long)e.Sk,
						         (long long)e.Hkv);
					checked++;
					decodes += got.decode;
				}
				fa_launch_memo_destroy(m);
			}
	}
	free(m);
	free(want);
	free(ds);
	free(ok);
	assert_true(checked > 500);
	assert_true(decodes > 50);
}

static struct fa_tune_ident ident(void)
{
	uint8_t u[16];
	struct fa_tune_ident id;
	for (int i = 0; i < 16; i++)
		u[i] = (uint8_t)(0x40 + i);
	fa_tune_ident_make(&id, u, 13000, NULL);
	return id;
}

/* A table's new result makes the plan chosen before it stale, and the new plan is the tuned
 * tile; another table, or none, does not see the plan either. */
static void test_memo_plan_goes_stale_when_the_table_changes(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("sm_90");
	struct fa_tune_ident id = ident();
	struct fa_tune_table *t = NULL, *t2 = NULL;
	char err[256];
	assert_int_equal(fa_tune_table_open(&t, NULL, &id, dev, 0, err, sizeof err), FA_OK);
	assert_int_equal(fa_tune_table_open(&t2, NULL, &id, dev, 0, err, sizeof err), FA_OK);
	struct fa_launch_memo *m = malloc(sizeof *m);
	assert_non_null(m);
	fa_launch_memo_init(m);
	const struct fa_attn_fwd_desc d = desc(FA_DTYPE_BF16, FA_PREC_DEFAULT, FA_MASK_NONE, 8, 4096,
	                                       4096, 16, 16, 128);
	struct fa_launch_key k;
	struct fa_launch_plan p0, got, p1;
	fa_launch_key_make(&d, &k);

	uint64_t g0 = fa_tune_table_generation(t);
	assert_int_equal(fa_launch_plan_make(dev, NULL, t, &d, NULL, &p0, err, sizeof err), FA_OK);
	assert_true(p0.tuned);
	assert_int_equal(p0.tune_src, FA_TUNE_SRC_HEURISTIC);
	fa_launch_memo_put(m, &k, t, g0, &p0);
	assert_true(fa_launch_memo_get(m, &k, t, g0, &got));
	assert_false(fa_launch_memo_get(m, &k, t2, fa_tune_table_generation(t2), &got));
	assert_false(fa_launch_memo_get(m, &k, NULL, 0, &got));

	/* the tuner's result for the class: the planner's second candidate */
	struct fa_tile c[FA_PLAN_MAX_CANDIDATES];
	struct fa_plan_req r;
	int n = 0;
	fa_plan_req_from_desc(&d, &r);
	r.ks = fa_tune_table_settings(t);
	assert_int_equal(fa_plan(dev, &r, c, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	assert_true(n >= 2);
	struct fa_tune_entry e;
	memset(&e, 0, sizeof e);
	fa_tune_key_make(&d, &e.key);
	e.best = c[1];
	e.best_us = 10;
	e.heur = c[0];
	e.heur_us = 12;
	e.candidates = n;
	e.runs = 5;
	e.when = 1;
	assert_int_equal(fa_tune_table_put(t, &e), FA_OK);
	const uint64_t g1 = fa_tune_table_generation(t);
	assert_true(g1 != g0);
	struct fa_launch_memo_stats st0, st1;
	fa_launch_memo_stats(m, &st0);
	assert_false(fa_launch_memo_get(m, &k, t, g1, &got));
	fa_launch_memo_stats(m, &st1);
	assert_int_equal(st1.stale, st0.stale + 1);
	assert_int_equal(fa_launch_plan_make(dev, NULL, t, &d, NULL, &p1, err, sizeof err), FA_OK);
	assert_int_equal(p1.tune_src, FA_TUNE_SRC_TUNED);
	assert_int_equal(p1.spec.tile.bc, c[1].bc);
	assert_int_equal(p1.spec.tile.nw, c[1].nw);
	assert_int_equal(p1.spec.tile.stages, c[1].stages);
	assert_false(plan_same(&p0, &p1));
	fa_launch_memo_put(m, &k, t, g1, &p1);
	assert_true(fa_launch_memo_get(m, &k, t, g1, &got));
	assert_true(plan_same(&got, &p1));
	/* the same entry put again (a save's merge of an older one changes nothing) */
	e.when = 0;
	assert_int_equal(fa_tune_table_put(t, &e), FA_OK); /* replaces: a change */
	assert_true(fa_tune_table_generation(t) != g1);

	fa_launch_memo_clear(m);
	assert_false(fa_launch_memo_get(m, &k, t, fa_tune_table_generation(t), &got));
	fa_launch_memo_destroy(m);
	free(m);
	fa_tune_table_close(t);
	fa_tune_table_close(t2);
}

/* One pick and N notes count in the table as N + 1 picks: the same stats, the same wanted list. */
static void test_memo_hits_count_in_the_table_as_picks(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("sm_90");
	struct fa_tune_ident id = ident();
	struct fa_tune_table *picks = NULL, *memo = NULL;
	char err[256];
	assert_int_equal(fa_tune_table_open(&picks, NULL, &id, dev, 0, err, sizeof err), FA_OK);
	assert_int_equal(fa_tune_table_open(&memo, NULL, &id, dev, 0, err, sizeof err), FA_OK);
	const struct fa_attn_fwd_desc d = desc(FA_DTYPE_FP16, FA_PREC_DEFAULT,
	                                       FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 128, 128, 16, 16, 64);
	struct fa_launch_plan p;
	for (int i = 0; i < 6; i++)
		assert_int_equal(fa_launch_plan_make(dev, NULL, picks, &d, NULL, &p, err, sizeof err),
		                 FA_OK);
	assert_int_equal(fa_launch_plan_make(dev, NULL, memo, &d, NULL, &p, err, sizeof err), FA_OK);
	for (int i = 0; i < 5; i++)
		fa_tune_table_note(memo, &p.tune_key, p.tune_src);
	struct fa_tune_stats a, b;
	fa_tune_table_stats(picks, &a);
	fa_tune_table_stats(memo, &b);
	assert_int_equal(a.misses, 6);
	assert_int_equal(a.misses, b.misses);
	assert_int_equal(a.hits, b.hits);
	assert_int_equal(a.unfit, b.unfit);
	struct fa_tune_key ka, kb;
	assert_true(fa_tune_table_next_wanted(picks, &ka));
	assert_true(fa_tune_table_next_wanted(memo, &kb));
	assert_true(fa_tune_key_equal(&ka, &kb));
	assert_false(fa_tune_table_next_wanted(picks, &ka));
	assert_false(fa_tune_table_next_wanted(memo, &kb));
	fa_tune_table_close(picks);
	fa_tune_table_close(memo);
}

/* More shapes than slots: the least recently used go, the latest stay; clear drops all. */
static void test_memo_evicts_and_clears(void **state)
{
	(void)state;
	struct fa_launch_memo *m = malloc(sizeof *m);
	assert_non_null(m);
	fa_launch_memo_init(m);
	const int n = FA_LAUNCH_MEMO_SETS * FA_LAUNCH_MEMO_WAYS * 2;
	struct fa_launch_plan p, got;
	memset(&p, 0, sizeof p);
	struct fa_launch_key k;
	for (int i = 1; i <= n; i++) {
		struct fa_attn_fwd_desc d = desc(FA_DTYPE_BF16, FA_PREC_DEFAULT, FA_MASK_NONE, 1, i, i,
		                                 8, 8, 64);
		fa_launch_key_make(&d, &k);
		p.kernel = (void *)(uintptr_t)i;
		fa_launch_memo_put(m, &k, NULL, 0, &p);
		assert_true(fa_launch_memo_get(m, &k, NULL, 0, &got));
		assert_ptr_equal(got.kernel, p.kernel);
	}
	struct fa_launch_memo_stats st;
	fa_launch_memo_stats(m, &st);
	assert_true(st.evictions >= (uint64_t)(n - FA_LAUNCH_MEMO_SETS * FA_LAUNCH_MEMO_WAYS));
	int kept = 0;
	for (int i = 1; i <= n; i++) {
		struct fa_attn_fwd_desc d = desc(FA_DTYPE_BF16, FA_PREC_DEFAULT, FA_MASK_NONE, 1, i, i,
		                                 8, 8, 64);
		fa_launch_key_make(&d, &k);
		if (fa_launch_memo_get(m, &k, NULL, 0, &got)) {
			assert_ptr_equal(got.kernel, (void *)(uintptr_t)i);
			kept++;
		}
	}
	assert_true(kept > 0 && kept <= FA_LAUNCH_MEMO_SETS * FA_LAUNCH_MEMO_WAYS);
	fa_launch_memo_clear(m);
	for (int i = 1; i <= n; i++) {
		struct fa_attn_fwd_desc d = desc(FA_DTYPE_BF16, FA_PREC_DEFAULT, FA_MASK_NONE, 1, i, i,
		                                 8, 8, 64);
		fa_launch_key_make(&d, &k);
		assert_false(fa_launch_memo_get(m, &k, NULL, 0, &got));
	}
	fa_launch_memo_destroy(m);
	free(m);
}

/* Threads looking up and putting more shapes than fit: a hit is always its own key's plan. */
struct race {
	struct fa_launch_memo *m;
	unsigned seed;
	atomic_int bad;
	atomic_long hits;
};

static void *racer(void *arg)
{
	struct race *r = arg;
	unsigned s = r->seed;
	for (int i = 0; i < 20000; i++) {
		s = s * 1103515245u + 12345u;
		const int64_t sq = 1 + (int64_t)((s >> 8) % 400);
		struct fa_attn_fwd_desc d = desc(FA_DTYPE_FP16, FA_PREC_DEFAULT, FA_MASK_NONE, 2, sq,
		                                 512, 8, 8, 128);
		struct fa_launch_key k;
		struct fa_launch_plan p;
		fa_launch_key_make(&d, &k);
		if (fa_launch_memo_get(r->m, &k, NULL, 0, &p)) {
			if (p.kernel != (void *)(uintptr_t)sq || p.dp.rows != (int)sq)
				atomic_fetch_add(&r->bad, 1);
			atomic_fetch_add(&r->hits, 1);
		} else {
			memset(&p, 0, sizeof p);
			p.kernel = (void *)(uintptr_t)sq;
			p.dp.rows = (int)sq;
			fa_launch_memo_put(r->m, &k, NULL, 0, &p);
		}
	}
	return NULL;
}

static void test_memo_is_consistent_under_threads(void **state)
{
	(void)state;
	struct race r;
	memset(&r, 0, sizeof r);
	r.m = malloc(sizeof *r.m);
	assert_non_null(r.m);
	fa_launch_memo_init(r.m);
	pthread_t th[4];
	struct race rs[4];
	for (int i = 0; i < 4; i++) {
		rs[i] = r;
		rs[i].seed = 17u * (unsigned)i + 1u;
		atomic_init(&rs[i].bad, 0);
		atomic_init(&rs[i].hits, 0);
		assert_int_equal(pthread_create(&th[i], NULL, racer, &rs[i]), 0);
	}
	long hits = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(atomic_load(&rs[i].bad), 0);
		hits += atomic_load(&rs[i].hits);
	}
	assert_true(hits > 0);
	fa_launch_memo_destroy(r.m);
	free(r.m);
}

/* The planning's refusals come back with their detail (nothing remembered by the caller). */
static void test_memo_plan_make_reports_a_tile_that_does_not_fit(void **state)
{
	(void)state;
	char err[256] = "";
	struct fa_launch_plan p;
	const struct fa_attn_fwd_desc d = desc(FA_DTYPE_FP32, FA_PREC_IEEE, FA_MASK_NONE, 1, 512,
	                                       512, 4, 4, 256);
	const struct fa_tile big = {.path = FA_KPATH_32, .nw = 8, .rt = 1, .br = 128, .bc = 128,
	                            .stages = 3};
	assert_int_equal(fa_launch_plan_make(fa_device_model_find("sm_80"), NULL, NULL, &d, &big,
	                                     &p, err, sizeof err),
	                 FA_ENOFIT);
	assert_non_null(strstr(err, "bytes of shared memory"));
	struct fa_attn_fwd_desc e = desc(FA_DTYPE_BF16, FA_PREC_DEFAULT, FA_MASK_NONE, 1, 512, 512,
	                                 4, 4, 64);
	e.D = 12; /* the planner's refusal (fa_attn_fwd_check refuses it first in a launch) */
	err[0] = '\0';
	assert_int_equal(fa_launch_plan_make(fa_device_model_find("sm_90"), NULL, NULL, &e, NULL,
	                                     &p, err, sizeof err),
	                 FA_ESHAPE);
	assert_non_null(strstr(err, "head dim 12"));
}

/* A query (fa_launch_memo_peek, fa_gpu_kernel_lookup's) gives get's answer, stale and missing
 * entries included, and counts nothing: the stats and the LRU order stay as they were. */
static void test_memo_peek_answers_as_get_and_counts_nothing(void **state)
{
	(void)state;
	const struct fa_device_model *dev = fa_device_model_find("sm_90");
	struct fa_launch_memo *m = malloc(sizeof *m);
	char err[256];
	assert_non_null(m);
	fa_launch_memo_init(m);
	const struct fa_attn_fwd_desc d = desc(FA_DTYPE_BF16, FA_PREC_DEFAULT, FA_MASK_NONE, 8, 4096,
	                                       4096, 16, 16, 128);
	const struct fa_attn_fwd_desc other = desc(FA_DTYPE_FP16, FA_PREC_DEFAULT, FA_MASK_NONE, 1,
	                                           128, 128, 16, 16, 64);
	struct fa_launch_key k, ko;
	struct fa_launch_plan p, got;
	fa_launch_key_make(&d, &k);
	fa_launch_key_make(&other, &ko);
	assert_int_equal(fa_launch_plan_make(dev, NULL, NULL, &d, NULL, &p, err, sizeof err), FA_OK);
	fa_launch_memo_put(m, &k, NULL, 0, &p);
	struct fa_launch_memo_stats st0, st1;
	fa_launch_memo_stats(m, &st0);
	const uint64_t clock0 = m->clock;
	memset(&got, 0, sizeof got);
	assert_true(fa_launch_memo_peek(m, &k, NULL, 0, &got));
	assert_true(plan_same(&got, &p));
	assert_false(fa_launch_memo_peek(m, &ko, NULL, 0, &got));             /* missing */
	assert_false(fa_launch_memo_peek(m, &k, (const void *)m, 1, &got));  /* another table */
	fa_launch_memo_stats(m, &st1);
	assert_memory_equal(&st0, &st1, sizeof st0);
	assert_true(m->clock == clock0);
	/* get says the same, and counts */
	assert_true(fa_launch_memo_get(m, &k, NULL, 0, &got));
	assert_false(fa_launch_memo_get(m, &ko, NULL, 0, &got));
	fa_launch_memo_stats(m, &st1);
	assert_int_equal(st1.hits, st0.hits + 1);
	assert_int_equal(st1.misses, st0.misses + 1);
	fa_launch_memo_destroy(m);
	free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_memo_key_ignores_strides_scale_and_sides_of_no_window),
		cmocka_unit_test(test_memo_key_differs_in_every_field_the_choice_reads),
		cmocka_unit_test(test_memo_hit_is_the_planners_choice_for_every_shape),
		cmocka_unit_test(test_memo_plan_goes_stale_when_the_table_changes),
		cmocka_unit_test(test_memo_hits_count_in_the_table_as_picks),
		cmocka_unit_test(test_memo_evicts_and_clears),
		cmocka_unit_test(test_memo_is_consistent_under_threads),
		cmocka_unit_test(test_memo_plan_make_reports_a_tile_that_does_not_fit),
		cmocka_unit_test(test_memo_peek_answers_as_get_and_counts_nothing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
