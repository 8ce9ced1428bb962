/* tuner.c - tuning one specialisation class in small steps, and the pick of the tile to launch.
 *
 * A tuner holds the planner's best N candidates for a representative problem (the heuristic
 * pick first, so the best time known early lets slow candidates be pruned after one run). The
 * work is a list of units: per candidate an optional prepare (compile / load), one warm-up run,
 * then `runs` timed runs whose median is kept. fa_tuner_step does units until its budget is
 * spent, so the daemon's GPU worker can put one step between client jobs: no client waits
 * longer than one step (budget + one unit). Everything device-specific goes through struct
 * fa_tune_ops, so tests drive it with a fake timer and clock.
 */
#include "fa_time.h"
#include "fa_tune.h"
#include "fa_err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RUNS 31

struct cand {
	struct fa_tile tile;
	double t[MAX_RUNS];
	int nt;
	bool prepared, warmed, failed, pruned;
	double med;
};

struct fa_tuner {
	struct fa_tune_table *table;
	struct fa_attn_fwd_desc d;
	struct fa_tune_key key;
	struct fa_tune_ops ops;
	int runs;
	double prune;
	struct cand c[FA_PLAN_MAX_CANDIDATES];
	int nc, cur;
	double best; /* best median so far, 0 when none */
	bool done, stored, finished_ops;
	int fails, units_done;
	fa_status last_st;
	char last_err[512];
	struct fa_tune_entry result;
};

static uint64_t mono_us(void *ctx)
{
	(void)ctx;
	return fa_now_ns() / 1000u;
}

const char *fa_tune_src_name(enum fa_tune_src s)
{
	switch (s) {
	case FA_TUNE_SRC_TUNED: return "tuned";
	case FA_TUNE_SRC_HEURISTIC: return "heuristic";
	case FA_TUNE_SRC_UNFIT: return "heuristic (tuned tile does not fit)";
	}
	return "?";
}

static bool same_tile(const struct fa_tile *a, const struct fa_tile *b)
{
	return a->path == b->path && a->nw == b->nw && a->rt == b->rt && a->bc == b->bc &&
	       a->stages == b->stages;
}

fa_status fa_tune_pick(struct fa_tune_table *t, const struct fa_device_model *model,
                       const struct fa_attn_fwd_desc *d, struct fa_tile *tile,
                       enum fa_tune_src *src, char *err, size_t errlen)
{
	struct fa_tile c[FA_PLAN_MAX_CANDIDATES];
	struct fa_plan_req r;
	int n = 0;
	if (src)
		*src = FA_TUNE_SRC_HEURISTIC;
	if (!model)
		model = t ? fa_tune_table_model(t) : NULL;
	if (!model || !d || !tile) {
		return fa_err(err, errlen, FA_EINVAL, "fa_tune_pick: NULL argument");
	}
	fa_plan_req_from_desc(d, &r);
	r.ks = t ? fa_tune_table_settings(t) : NULL;
	/* every fitting candidate: the tuned tile must be one of them to be used */
	fa_status st = fa_plan(model, &r, c, FA_PLAN_MAX_CANDIDATES, &n, err, errlen);
	if (st != FA_OK)
		return st;
	*tile = c[0];
	if (!t)
		return FA_OK;
	struct fa_tune_key k;
	struct fa_tune_entry e;
	enum fa_tune_src s = FA_TUNE_SRC_HEURISTIC;
	fa_tune_key_make(d, &k);
	if (fa_tune_table_get(t, &k, &e)) {
		s = FA_TUNE_SRC_UNFIT;
		for (int i = 0; i < n; i++)
			if (same_tile(&c[i], &e.best)) {
				*tile = c[i];
				s = FA_TUNE_SRC_TUNED;
				break;
			}
	}
	fa_tune_table_note(t, &k, (int)s);
	if (src)
		*src = s;
	return FA_OK;
}

fa_status fa_tuner_start(struct fa_tuner **out, struct fa_tune_table *t,
                         const struct fa_attn_fwd_desc *d, const struct fa_tune_ops *ops,
                         const struct fa_tune_opts *opts, char *err, size_t errlen)
{
	*out = NULL;
	if (!t || !d || !ops || !ops->time) {
		return fa_err(err, errlen, FA_EINVAL, "fa_tuner_start: NULL argument");
	}
	fa_status st = fa_attn_fwd_check(d, err, errlen);
	if (st != FA_OK)
		return st;
	struct fa_tuner *tu = calloc(1, sizeof *tu);
	if (!tu)
		return FA_ENOMEM;
	tu->table = t;
	tu->d = *d;
	fa_tune_key_make(d, &tu->key);
	tu->ops = *ops;
	if (!tu->ops.now_us)
		tu->ops.now_us = mono_us;
	int want = opts && opts->candidates > 0 ? opts->candidates : FA_TUNE_DEFAULT_CANDIDATES;
	tu->runs = opts && opts->runs > 0 ? opts->runs : FA_TUNE_DEFAULT_RUNS;
	if (tu->runs > MAX_RUNS)
		tu->runs = MAX_RUNS;
	tu->prune = opts && opts->prune != 0 ? opts->prune : 1.5;
	if (want > FA_PLAN_MAX_CANDIDATES)
		want = FA_PLAN_MAX_CANDIDATES;
	struct fa_tile c[FA_PLAN_MAX_CANDIDATES];
	struct fa_plan_req r;
	int n = 0;
	fa_plan_req_from_desc(d, &r);
	r.ks = fa_tune_table_settings(t);
	st = fa_plan(fa_tune_table_model(t), &r, c, want, &n, err, errlen);
	if (st != FA_OK) {
		free(tu);
		return st;
	}
	for (int i = 0; i < n; i++)
		tu->c[i].tile = c[i];
	tu->nc = n;
	*out = tu;
	return FA_OK;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double s[MAX_RUNS];
	memcpy(s, v, (size_t)n * sizeof *v);
	qsort(s, (size_t)n, sizeof *s, cmp_double);
	return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* The candidate is finished (measured, pruned or failed): on to the next. */
static void next_cand(struct fa_tuner *tu)
{
	struct cand *c = &tu->c[tu->cur];
	if (!c->failed) {
		c->med = c->pruned ? c->t[0] : median(c->t, c->nt);
		if (tu->best == 0 || c->med < tu->best)
			tu->best = c->med;
	}
	tu->cur++;
}

/* One unit of work on the current candidate. */
static void do_unit(struct fa_tuner *tu)
{
	struct cand *c = &tu->c[tu->cur];
	char err[sizeof tu->last_err];
	fa_status st;
	double us = 0;
	err[0] = 0;
	tu->units_done++;
	if (tu->ops.prepare && !c->prepared) {
		st = tu->ops.prepare(tu->ops.ctx, &tu->d, &c->tile, err, sizeof err);
		c->prepared = true;
	} else {
		st = tu->ops.time(tu->ops.ctx, &tu->d, &c->tile, &us, err, sizeof err);
		if (st == FA_OK && !(isfinite(us) && us > 0)) {
			snprintf(err, sizeof err, "timing callback returned %g us", us);
			st = FA_EINTERNAL;
		}
		if (st == FA_OK) {
			if (!c->warmed) {
				c->warmed = true;
			} else {
				c->t[c->nt++] = us;
				/* slower than prune x the best median already: it cannot win */
				if (c->nt == 1 && tu->prune >= 1 && tu->best > 0 && us > tu->prune * tu->best)
					c->pruned = true;
				if (c->pruned || c->nt >= tu->runs)
					next_cand(tu);
			}
		}
	}
	if (st != FA_OK) {
		char tb[48];
		fa_tile_format(&c->tile, tb, sizeof tb);
		snprintf(tu->last_err, sizeof tu->last_err, "tile %s: %s", tb, err);
		tu->last_st = st;
		tu->fails++;
		c->failed = true;
		next_cand(tu);
	}
}

/* All candidates are through: the winner, the runner-up and the heuristic into the table. */
static void finish(struct fa_tuner *tu)
{
	int b = -1, s = -1;
	for (int i = 0; i < tu->nc; i++) {
		if (tu->c[i].failed)
			continue;
		if (b < 0 || tu->c[i].med < tu->c[b].med) {
			s = b;
			b = i;
		} else if (s < 0 || tu->c[i].med < tu->c[s].med) {
			s = i;
		}
	}
	tu->done = true;
	if (b >= 0) {
		struct fa_tune_entry *e = &tu->result;
		memset(e, 0, sizeof *e);
		e->key = tu->key;
		e->best = tu->c[b].tile;
		e->best_us = tu->c[b].med;
		if (s >= 0) {
			e->second = tu->c[s].tile;
			e->second_us = tu->c[s].med;
		}
		e->heur = tu->c[0].tile;
		e->heur_us = tu->c[0].failed ? 0 : tu->c[0].med;
		e->candidates = tu->nc;
		e->runs = tu->runs;
		e->when = (int64_t)time(NULL);
		tu->stored = fa_tune_table_put(tu->table, e) == FA_OK;
	}
	if (tu->ops.finish && !tu->finished_ops) {
		tu->finished_ops = true;
		tu->ops.finish(tu->ops.ctx);
	}
}

fa_status fa_tuner_step(struct fa_tuner *tu, uint64_t budget_us, bool *done, char *err,
                        size_t errlen)
{
	uint64_t t0 = tu->ops.now_us(tu->ops.ctx);
	while (!tu->done) {
		if (tu->cur >= tu->nc) {
			finish(tu);
			break;
		}
		do_unit(tu);
		if (tu->cur >= tu->nc) {
			finish(tu);
			break;
		}
		if (tu->ops.now_us(tu->ops.ctx) - t0 >= budget_us)
			break;
	}
	*done = tu->done;
	if (tu->done && !tu->stored && tu->fails > 0) {
		snprintf(err, errlen, "every candidate failed; last: %s", tu->last_err);
		return tu->last_st;
	}
	return FA_OK;
}

bool fa_tuner_result(const struct fa_tuner *tu, struct fa_tune_entry *e, int *fails)
{
	if (fails)
		*fails = tu->fails;
	if (tu->stored && e)
		*e = tu->result;
	return tu->stored;
}

void fa_tuner_progress(const struct fa_tuner *tu, int *units_done, int *units_total)
{
	int per = tu->runs + 1 + (tu->ops.prepare ? 1 : 0);
	if (units_done)
		*units_done = tu->units_done;
	if (units_total)
		*units_total = tu->nc * per;
}

void fa_tuner_free(struct fa_tuner *tu)
{
	if (!tu)
		return;
	if (tu->ops.finish && !tu->finished_ops)
		tu->ops.finish(tu->ops.ctx);
	free(tu);
}

fa_status fa_tune_key(struct fa_tune_table *t, const struct fa_attn_fwd_desc *d,
                      const struct fa_tune_ops *ops, const struct fa_tune_opts *opts,
                      struct fa_tune_entry *e, char *err, size_t errlen)
{
	struct fa_tuner *tu;
	fa_status st = fa_tuner_start(&tu, t, d, ops, opts, err, errlen);
	if (st != FA_OK)
		return st;
	bool done = false;
	while (!done && st == FA_OK)
		st = fa_tuner_step(tu, UINT64_MAX, &done, err, errlen);
	if (st == FA_OK && !fa_tuner_result(tu, e, NULL)) {
		snprintf(err, errlen, "no candidate could be timed");
		st = FA_EINTERNAL;
	}
	fa_tuner_free(tu);
	return st;
}
