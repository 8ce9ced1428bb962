/* test_tune.c - the autotuner without a GPU: a fake timer (a table of costs per tile and a fake
 * clock it advances) drives tuner.c; the table's file is checked by reading it back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <ftw.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "fa_test.h"
#include "fa_tune.h"

static char root[64];
static int ndir;

/* A fresh directory under root for one test. */
static void newdir(char *out, size_t cap)
{
	snprintf(out, cap, "%s/%d", root, ndir++);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb;
	(void)flag;
	(void)f;
	return remove(p);
}

static void copy_file(const char *from, const char *to)
{
	char buf[16384];
	FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
	assert_non_null(a);
	assert_non_null(b);
	size_t n = fread(buf, 1, sizeof buf, a);
	assert_int_equal(fwrite(buf, 1, n, b), n);
	fclose(a);
	fclose(b);
}

/* ---- the fake device ---------------------------------------------------------------------- */

struct fake {
	uint64_t now;           /* the clock, us */
	struct fa_tile fast;    /* this tile costs fast_us; every other one slow_us + 10 us * rank */
	double fast_us, slow_us;
	struct fa_tile fail;    /* this tile fails to run (path 0: none) */
	uint64_t prepare_us;
	int prepares, runs;
	uint64_t max_unit;      /* the longest unit seen */
	struct fa_tile order[FA_PLAN_MAX_CANDIDATES];
	int norder;
};

static bool same(const struct fa_tile *a, const struct fa_tile *b)
{
	return a->path == b->path && a->nw == b->nw && a->rt == b->rt && a->bc == b->bc &&
	       a->stages == b->stages;
}

static uint64_t fake_now(void *ctx)
{
	return ((struct fake *)ctx)->now;
}

static fa_status fake_prepare(void *ctx, const struct fa_attn_fwd_desc *d,
                              const struct fa_tile *tile, char *err, size_t errlen)
{
	struct fake *f = ctx;
	(void)d;
	(void)tile;
	(void)err;
	(void)errlen;
	f->prepares++;
	f->now += f->prepare_us;
	if (f->prepare_us > f->max_unit)
		f->max_unit = f->prepare_us;
	return FA_OK;
}

static fa_status fake_time(void *ctx, const struct fa_attn_fwd_desc *d, const struct fa_tile *tile,
                           double *us, char *err, size_t errlen)
{
	struct fake *f = ctx;
	(void)d;
	f->runs++;
	if (f->fail.path && same(tile, &f->fail)) {
		snprintf(err, errlen, "fake launch failure");
		f->now += 5;
		return FA_EDEVICE;
	}
	double c = f->slow_us;
	for (int i = 0; i < f->norder; i++)
		if (same(tile, &f->order[i]))
			c = f->slow_us + 10.0 * i;
	if (same(tile, &f->fast))
		c = f->fast_us;
	*us = c;
	f->now += (uint64_t)c;
	if ((uint64_t)c > f->max_unit)
		f->max_unit = (uint64_t)c;
	return FA_OK;
}

static struct fa_tune_ops fake_ops(struct fake *f)
{
	struct fa_tune_ops o = {0};
	o.ctx = f;
	o.prepare = fake_prepare;
	o.time = fake_time;
	o.now_us = fake_now;
	return o;
}

/* bf16, D=128, S=4096 (BSHD dense), GQA ratio `gqa`. */
static struct fa_attn_fwd_desc shape(int64_t S, int gqa)
{
	struct fa_tune_key k = {.dtype = FA_DTYPE_BF16, .precision = FA_PREC_DEFAULT, .D = 128,
	                        .mask = FA_MASK_NONE};
	struct fa_attn_fwd_desc d;
	int b = 0;
	while (((int64_t)1 << b) < S)
		b++;
	k.sq_log2 = k.sk_log2 = b;
	while ((1 << (k.gqa_log2 + 1)) <= gqa)
		k.gqa_log2++;
	fa_tune_key_desc(&k, &d);
	return d;
}

static const struct fa_device_model *sm90(void)
{
	return fa_device_model_find("sm_90");
}

static struct fa_tune_ident ident_a(void)
{
	uint8_t u[16];
	struct fa_tune_ident id;
	for (int i = 0; i < 16; i++)
		u[i] = (uint8_t)(i + 1);
	fa_tune_ident_make(&id, u, 13000, NULL);
	return id;
}

/* The planner's candidates for d on m (what the tuner will time, best first). */
static int plan(const struct fa_device_model *m, const struct fa_attn_fwd_desc *d,
                struct fa_tile *t)
{
	struct fa_plan_req r = {.dtype = d->dtype, .precision = d->precision, .D = (int)d->D,
	                        .mask = d->mask, .B = d->B, .H = d->Hq, .Sq = d->Sq, .Sk = d->Sk};
	int n = 0;
	char err[256];
	assert_int_equal(fa_plan(m, &r, t, FA_PLAN_MAX_CANDIDATES, &n, err, sizeof err), FA_OK);
	return n;
}

/* A fake where the candidate of rank `fast` (within the tuner's default N) is fastest. */
static void fake_init(struct fake *f, const struct fa_attn_fwd_desc *d, int fast)
{
	memset(f, 0, sizeof *f);
	f->norder = plan(sm90(), d, f->order);
	assert_true(f->norder > fast);
	f->fast = f->order[fast];
	f->fast_us = 50;
	f->slow_us = 100;
	f->prepare_us = 1000;
}

static struct fa_tune_table *open_table(const char *dir, const struct fa_tune_ident *id,
                                        const struct fa_device_model *m)
{
	struct fa_tune_table *t = NULL;
	char err[256];
	fa_status st = fa_tune_table_open(&t, dir, id, m, 0, err, sizeof err);
	if (st != FA_OK)
		fail_msg("open %s: %s", dir ? dir : "(memory)", err);
	return t;
}

/* Tune d's class with the fake, into a table in dir, save. */
static void tune_and_save(const char *dir, const struct fa_tune_ident *id,
                          const struct fa_attn_fwd_desc *d, int fast, struct fa_tune_entry *e)
{
	struct fake f;
	fake_init(&f, d, fast);
	struct fa_tune_ops ops = fake_ops(&f);
	struct fa_tune_table *t = open_table(dir, id, sm90());
	char err[256];
	assert_int_equal(fa_tune_key(t, d, &ops, NULL, e, err, sizeof err), FA_OK);
	assert_int_equal(fa_tune_table_save(t, err, sizeof err), FA_OK);
	fa_tune_table_close(t);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_tune_picks_the_fastest_candidate_and_persists_it(void **state)
{
	(void)state;
	char dir[96];
	newdir(dir, sizeof dir);
	struct fa_attn_fwd_desc d = shape(4096, 1);
	struct fa_tune_ident id = ident_a();
	struct fake f;
	fake_init(&f, &d, 3);
	struct fa_tune_ops ops = fake_ops(&f);
	struct fa_tune_table *t = open_table(dir, &id, sm90());
	struct fa_tile tile;
	enum fa_tune_src src;
	char err[256];

	/* before tuning: the heuristic, and the class is wanted */
	assert_int_equal(fa_tune_pick(t, NULL, &d, &tile, &src, err, sizeof err), FA_OK);
	assert_int_equal(src, FA_TUNE_SRC_HEURISTIC);
	assert_true(same(&tile, &f.order[0]));
	struct fa_tune_key want, k;
	fa_tune_key_make(&d, &k);
	assert_true(fa_tune_table_next_wanted(t, &want));
	assert_true(fa_tune_key_equal(&want, &k));
	assert_false(fa_tune_table_next_wanted(t, &want));

	struct fa_tune_entry e;
	assert_int_equal(fa_tune_key(t, &d, &ops, NULL, &e, err, sizeof err), FA_OK);
	assert_true(same(&e.best, &f.fast));
	assert_true(e.best_us == 50);
	assert_true(same(&e.second, &f.order[0])); /* 100 us: the runner-up */
	assert_true(e.second_us == 100);
	assert_true(same(&e.heur, &f.order[0]));
	assert_true(e.heur_us == 100);
	assert_int_equal(e.candidates, f.norder < FA_TUNE_DEFAULT_CANDIDATES ?
	                 f.norder : FA_TUNE_DEFAULT_CANDIDATES);
	assert_int_equal(f.prepares, e.candidates);

	/* another shape of the same class gets the tuned tile too */
	struct fa_attn_fwd_desc d2 = d;
	d2.Sq = d2.Sk = 3000;
	assert_int_equal(fa_tune_pick(t, NULL, &d2, &tile, &src, err, sizeof err), FA_OK);
	assert_int_equal(src, FA_TUNE_SRC_TUNED);
	assert_true(same(&tile, &f.fast));
	assert_int_equal(tile.smem, fa_tile_smem(&tile, 128));

	assert_int_equal(fa_tune_table_save(t, err, sizeof err), FA_OK);
	assert_int_equal(access(fa_tune_table_path(t), R_OK), 0);
	struct fa_tune_stats s;
	fa_tune_table_stats(t, &s);
	assert_int_equal(s.entries, 1);
	assert_int_equal(s.hits, 1);
	assert_int_equal(s.misses, 1);
	fa_tune_table_close(t);

	/* reload: the same pick, from the file */
	t = open_table(dir, &id, sm90());
	fa_tune_table_stats(t, &s);
	assert_int_equal(s.loaded, 1);
	assert_int_equal(s.corrupt, 0);
	assert_false(s.stale);
	assert_int_equal(fa_tune_pick(t, NULL, &d, &tile, &src, err, sizeof err), FA_OK);
	assert_int_equal(src, FA_TUNE_SRC_TUNED);
	assert_true(same(&tile, &f.fast));
	struct fa_tune_entry e2;
	assert_true(fa_tune_table_get(t, &k, &e2));
	assert_true(same(&e2.second, &e.second));
	assert_true(e2.best_us == e.best_us && e2.heur_us == e.heur_us && e2.when == e.when);
	fa_tune_table_close(t);
}

static void test_tune_table_of_another_gpu_driver_or_source_is_ignored(void **state)
{
	(void)state;
	char dir[96];
	newdir(dir, sizeof dir);
	struct fa_attn_fwd_desc d = shape(1024, 1);
	struct fa_tune_ident a = ident_a();
	struct fa_tune_entry e;
	tune_and_save(dir, &a, &d, 2, &e);

	struct fa_tune_ident other[3] = {a, a, a};
	other[0].uuid[15] ^= 1; /* its own file name: A's file is copied there below */
	other[1].driver = 12080;
	other[2].src_hash[0] ^= 1;
	for (int i = 0; i < 3; i++) {
		struct fa_tune_table *t = open_table(dir, &other[i], sm90());
		if (i == 0) {
			/* another GPU's file under this GPU's name (a copied cache dir) */
			struct fa_tune_table *ta = open_table(dir, &a, sm90());
			copy_file(fa_tune_table_path(ta), fa_tune_table_path(t));
			fa_tune_table_close(ta);
			fa_tune_table_close(t);
			t = open_table(dir, &other[0], sm90());
		}
		struct fa_tune_stats s;
		fa_tune_table_stats(t, &s);
		assert_true(s.stale);
		assert_int_equal(s.entries, 0);
		assert_true(strstr(s.why, "another GPU") != NULL);
		struct fa_tile tile;
		enum fa_tune_src src;
		char err[256];
		assert_int_equal(fa_tune_pick(t, NULL, &d, &tile, &src, err, sizeof err), FA_OK);
		assert_int_equal(src, FA_TUNE_SRC_HEURISTIC);
		fa_tune_table_close(t);
	}
	/* the original identity still reads it */
	struct fa_tune_table *t = open_table(dir, &a, sm90());
	struct fa_tune_stats s;
	fa_tune_table_stats(t, &s);
	assert_false(s.stale);
	assert_int_equal(s.entries, 1);
	fa_tune_table_close(t);
}

static void test_tune_table_skips_corrupt_lines(void **state)
{
	(void)state;
	char dir[96];
	newdir(dir, sizeof dir);
	struct fa_tune_ident a = ident_a();
	struct fa_attn_fwd_desc d1 = shape(1024, 1), d2 = shape(8192, 4);
	struct fa_tune_entry e;
	tune_and_save(dir, &a, &d1, 1, &e);
	tune_and_save(dir, &a, &d2, 2, &e); /* merged: the file has both */

	struct fa_tune_table *t = open_table(dir, &a, sm90());
	char path[512], text[8192];
	snprintf(path, sizeof path, "%s", fa_tune_table_path(t));
	fa_tune_table_close(t);
	FILE *fp = fopen(path, "r");
	assert_non_null(fp);
	size_t n = fread(text, 1, sizeof text - 1, fp);
	fclose(fp);
	text[n] = 0;
	/* the second entry line: flip one digit of its time (checksum mismatch) */
	char *l1 = strstr(text, "\nbf16 ");
	assert_non_null(l1);
	char *l2 = strstr(l1 + 1, "\nbf16 ");
	assert_non_null(l2);
	char *us = strstr(l2, "best_us=");
	assert_non_null(us);
	us[8] = us[8] == '9' ? '8' : (char)(us[8] + 1);
	fp = fopen(path, "w");
	assert_non_null(fp);
	fputs(text, fp);
	fputs("garbage line\n", fp);
	fputs("bf16 default d128 none sq10 sk10 gqa0 best=128x64:w4:r2:s2:p1 crc=00000000\n", fp);
	/* a torn last line: the first 40 bytes of a real one, no newline */
	fwrite(l1 + 1, 1, 40, fp);
	fclose(fp);

	t = open_table(dir, &a, sm90());
	struct fa_tune_stats s;
	fa_tune_table_stats(t, &s);
	assert_false(s.stale);
	assert_int_equal(s.loaded, 1);
	assert_int_equal(s.corrupt, 4);
	struct fa_tune_key k1;
	fa_tune_key_make(&d1, &k1);
	assert_true(fa_tune_table_get(t, &k1, NULL));
	fa_tune_table_close(t);
}

static void test_tune_entry_that_does_not_fit_the_device_gives_the_heuristic(void **state)
{
	(void)state;
	/* a tile that fits sm_90 (227 KiB) but not sm_86 (99 KiB) */
	const struct fa_device_model *m86 = fa_device_model_find("sm_86");
	struct fa_attn_fwd_desc d = shape(4096, 1);
	d.D = 256;
	for (int i = 0; i < 3; i++) {
		d.q_stride[i] = d.q_stride[i] / 128 * 256;
		d.k_stride[i] = d.k_stride[i] / 128 * 256;
	}
	memcpy(d.v_stride, d.k_stride, sizeof d.v_stride);
	memcpy(d.o_stride, d.q_stride, sizeof d.o_stride);
	struct fa_tile t90[FA_PLAN_MAX_CANDIDATES], t86[FA_PLAN_MAX_CANDIDATES];
	int n90 = plan(sm90(), &d, t90), n86 = plan(m86, &d, t86), big = -1;
	for (int i = 0; i < n90 && big < 0; i++) {
		bool in86 = false;
		for (int j = 0; j < n86; j++)
			in86 = in86 || same(&t90[i], &t86[j]);
		if (!in86)
			big = i;
	}
	assert_true(big >= 0);
	struct fa_tune_ident a = ident_a();
	struct fa_tune_table *t = open_table(NULL, &a, m86);
	struct fa_tune_entry e = {0};
	fa_tune_key_make(&d, &e.key);
	e.best = t90[big];
	e.best_us = 1;
	e.heur = t90[0];
	e.candidates = e.runs = 1;
	assert_int_equal(fa_tune_table_put(t, &e), FA_OK);
	struct fa_tile tile;
	enum fa_tune_src src;
	char err[256];
	assert_int_equal(fa_tune_pick(t, NULL, &d, &tile, &src, err, sizeof err), FA_OK);
	assert_int_equal(src, FA_TUNE_SRC_UNFIT);
	assert_true(same(&tile, &t86[0]));
	assert_true(tile.smem <= m86->smem_optin);
	struct fa_tune_stats s;
	fa_tune_table_stats(t, &s);
	assert_int_equal(s.unfit, 1);
	fa_tune_table_close(t);

	/* no table: the heuristic, from the model given */
	assert_int_equal(fa_tune_pick(NULL, m86, &d, &tile, &src, err, sizeof err), FA_OK);
	assert_int_equal(src, FA_TUNE_SRC_HEURISTIC);
	assert_true(same(&tile, &t86[0]));
}

static void test_tune_steps_stay_within_budget_plus_one_unit_and_finish(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc d = shape(2048, 2);
	struct fa_tune_ident a = ident_a();
	static const uint64_t budgets[] = {0, 150, 500, 2000};
	struct fa_tune_entry ref;
	{
		struct fake f;
		fake_init(&f, &d, 5);
		struct fa_tune_ops ops = fake_ops(&f);
		struct fa_tune_table *t = open_table(NULL, &a, sm90());
		char err[256];
		assert_int_equal(fa_tune_key(t, &d, &ops, NULL, &ref, err, sizeof err), FA_OK);
		fa_tune_table_close(t);
	}
	for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++) {
		struct fake f;
		fake_init(&f, &d, 5);
		f.slow_us = 300; /* runs of 50..450 us, compiles of 1000 us */
		struct fa_tune_ops ops = fake_ops(&f);
		struct fa_tune_table *t = open_table(NULL, &a, sm90());
		struct fa_tuner *tu;
		char err[256];
		assert_int_equal(fa_tuner_start(&tu, t, &d, &ops, NULL, err, sizeof err), FA_OK);
		bool done = false;
		int steps = 0, total = 0, units = 0;
		while (!done) {
			uint64_t t0 = f.now;
			int before = 0;
			fa_tuner_progress(tu, &before, &total);
			assert_int_equal(fa_tuner_step(tu, budgets[b], &done, err, sizeof err), FA_OK);
			fa_tuner_progress(tu, &units, NULL);
			uint64_t took = f.now - t0;
			assert_true(units > before); /* always progress */
			/* the bound: the budget plus the one unit that started before it ran out */
			if (took > budgets[b] + f.max_unit)
				fail_msg("budget %llu: a step took %llu us (longest unit %llu)",
				         (unsigned long long)budgets[b], (unsigned long long)took,
				         (unsigned long long)f.max_unit);
			if (budgets[b] == 0)
				assert_int_equal(units - before, 1);
			steps++;
			assert_true(steps < 10000);
		}
		assert_true(units <= total);
		assert_true(steps > 1);
		struct fa_tune_entry e;
		assert_true(fa_tuner_result(tu, &e, NULL));
		assert_true(same(&e.best, &ref.best));
		assert_true(same(&e.best, &f.fast));
		fa_tuner_free(tu);
		fa_tune_table_close(t);
	}
}

static void test_tune_prunes_slow_candidates_and_survives_a_failing_one(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc d = shape(4096, 1);
	struct fake f;
	fake_init(&f, &d, 0); /* the heuristic is fastest: the rest are 2x slower */
	f.slow_us = 100;
	f.fast_us = 40;
	f.fail = f.order[1];
	f.prepare_us = 0;
	struct fa_tune_ops ops = fake_ops(&f);
	struct fa_tune_ident a = ident_a();
	struct fa_tune_table *t = open_table(NULL, &a, sm90());
	struct fa_tuner *tu;
	char err[256];
	struct fa_tune_opts o = {.runs = 7};
	assert_int_equal(fa_tuner_start(&tu, t, &d, &ops, &o, err, sizeof err), FA_OK);
	bool done = false;
	while (!done)
		assert_int_equal(fa_tuner_step(tu, 1000, &done, err, sizeof err), FA_OK);
	struct fa_tune_entry e;
	int fails = 0;
	assert_true(fa_tuner_result(tu, &e, &fails));
	assert_int_equal(fails, 1);
	assert_true(same(&e.best, &f.order[0]));
	/* the winner: warm-up + 7; each of the other N-2: warm-up + 1 (pruned); the failure: 1 */
	int n = e.candidates;
	assert_int_equal(f.runs, 8 + 2 * (n - 2) + 1);
	fa_tuner_free(tu);
	fa_tune_table_close(t);
}

/* Writers in 4 processes, each tuning its own classes into the same directory, 5 saves each. */
static void test_tune_concurrent_writers_leave_a_valid_file_with_every_entry(void **state)
{
	(void)state;
	char dir[96];
	newdir(dir, sizeof dir);
	struct fa_tune_ident a = ident_a();
	enum { W = 4, K = 5 };
	pid_t pid[W];
	for (int w = 0; w < W; w++) {
		pid[w] = fork();
		assert_true(pid[w] >= 0);
		if (pid[w] == 0) {
			struct fa_tune_table *t = NULL;
			char err[256];
			if (fa_tune_table_open(&t, dir, &a, sm90(), 0, err, sizeof err) != FA_OK)
				_exit(2);
			for (int k = 0; k < K; k++) {
				struct fa_tune_entry e = {0};
				struct fa_attn_fwd_desc d = shape((int64_t)1 << (4 + k), 1 << w);
				fa_tune_key_make(&d, &e.key);
				int n = 0;
				struct fa_plan_req r = {.dtype = d.dtype, .D = 128};
				if (fa_plan(sm90(), &r, &e.best, 1, &n, err, sizeof err) != FA_OK)
					_exit(3);
				e.heur = e.best;
				e.best_us = 10 + w;
				e.candidates = e.runs = 1;
				e.when = 1000 + k;
				if (fa_tune_table_put(t, &e) != FA_OK ||
				    fa_tune_table_save(t, err, sizeof err) != FA_OK)
					_exit(4);
			}
			fa_tune_table_close(t);
			_exit(0);
		}
	}
	for (int w = 0; w < W; w++) {
		int status = 0;
		assert_int_equal(waitpid(pid[w], &status, 0), pid[w]);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	struct fa_tune_table *t = open_table(dir, &a, sm90());
	struct fa_tune_stats s;
	fa_tune_table_stats(t, &s);
	assert_false(s.stale);
	assert_int_equal(s.corrupt, 0);
	assert_int_equal(s.entries, W * K);
	fa_tune_table_close(t);
}

static void test_tune_table_is_bounded(void **state)
{
	(void)state;
	struct fa_tune_ident a = ident_a();
	struct fa_tune_table *t = NULL;
	char err[256];
	assert_int_equal(fa_tune_table_open(&t, NULL, &a, sm90(), 3, err, sizeof err), FA_OK);
	for (int k = 0; k < 5; k++) {
		struct fa_tune_entry e = {0};
		struct fa_attn_fwd_desc d = shape((int64_t)1 << (4 + k), 1);
		fa_tune_key_make(&d, &e.key);
		int n = 0;
		struct fa_plan_req r = {.dtype = d.dtype, .D = 128};
		assert_int_equal(fa_plan(sm90(), &r, &e.best, 1, &n, err, sizeof err), FA_OK);
		e.best_us = 1;
		e.when = 100 + k;
		assert_int_equal(fa_tune_table_put(t, &e), FA_OK);
	}
	struct fa_tune_stats s;
	fa_tune_table_stats(t, &s);
	assert_int_equal(s.entries, 3);
	assert_int_equal(s.evicted, 2);
	struct fa_tune_key k0;
	struct fa_attn_fwd_desc d0 = shape(16, 1);
	fa_tune_key_make(&d0, &k0);
	assert_false(fa_tune_table_get(t, &k0, NULL)); /* the oldest went first */
	fa_tune_table_close(t);
}

static void test_tune_key_buckets_sequence_lengths_by_powers_of_two(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc d = shape(4096, 1);
	struct fa_tune_key k;
	d.Sq = 4096;
	d.Sk = 4097;
	fa_tune_key_make(&d, &k);
	assert_int_equal(k.sq_log2, 12);
	assert_int_equal(k.sk_log2, 13);
	d.Sq = 1;
	d.Hq = 12;
	d.Hkv = 4;
	fa_tune_key_make(&d, &k);
	assert_int_equal(k.sq_log2, 0);
	assert_int_equal(k.gqa_log2, 1);
	struct fa_attn_fwd_desc r;
	k.sq_log2 = 12;
	fa_tune_key_desc(&k, &r);
	char err[256];
	assert_int_equal(fa_attn_fwd_check(&r, err, sizeof err), FA_OK);
	assert_int_equal(r.Sq, 4096);
	assert_int_equal(r.Hq / r.Hkv, 2);
	assert_int_equal(r.B, 4);
}

static int setup(void **state)
{
	(void)state;
	return fa_test_mkdir(root, sizeof root);
}

static int teardown(void **state)
{
	(void)state;
	if (!getenv("FA_TEST_KEEP"))
		nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tune_key_buckets_sequence_lengths_by_powers_of_two),
		cmocka_unit_test(test_tune_picks_the_fastest_candidate_and_persists_it),
		cmocka_unit_test(test_tune_table_of_another_gpu_driver_or_source_is_ignored),
		cmocka_unit_test(test_tune_table_skips_corrupt_lines),
		cmocka_unit_test(test_tune_entry_that_does_not_fit_the_device_gives_the_heuristic),
		cmocka_unit_test(test_tune_steps_stay_within_budget_plus_one_unit_and_finish),
		cmocka_unit_test(test_tune_prunes_slow_candidates_and_survives_a_failing_one),
		cmocka_unit_test(test_tune_concurrent_writers_leave_a_valid_file_with_every_entry),
		cmocka_unit_test(test_tune_table_is_bounded),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
