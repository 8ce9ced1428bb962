/* launch_memo.c - the launch memo (fa_launch_memo.h): a small set-associative table from a
 * shape's key to the plan and kernel a launch of it chose. */
#include "fa_launch_memo.h"

#include "fa_err.h"

#include <string.h>

fa_status fa_launch_plan_make(const struct fa_device_model *model,
                              const struct fa_kernel_settings *ks, struct fa_tune_table *tt,
                              const struct fa_attn_fwd_desc *d, const struct fa_tile *tile,
                              struct fa_launch_plan *pl, char *err, size_t errlen)
{
	fa_status st;
	memset(pl, 0, sizeof *pl);
	if (tile ? fa_kpath_is_decode(tile->path) : fa_decode_wanted(model, d, ks)) {
		pl->decode = true;
		if ((st = fa_plan_decode(model, d, ks, tile, &pl->dp, err, errlen)) != FA_OK)
			return st;
		fa_kernel_spec_make(&pl->spec, model->sm, d->dtype, d->precision, (int)d->D, d->mask,
		                    &pl->dp.tile);
		fa_kernel_spec_mask_ext(&pl->spec, d);
		return FA_OK;
	}
	struct fa_tile t;
	if (tile) {
		t = *tile;
	} else if (tt) {
		enum fa_tune_src src = FA_TUNE_SRC_HEURISTIC;
		if ((st = fa_tune_pick(tt, model, d, &t, &src, err, errlen)) != FA_OK)
			return st;
		pl->tuned = true;
		pl->tune_src = (int)src;
		fa_tune_key_make(d, &pl->tune_key);
	} else {
		struct fa_plan_req r;
		int n = 0;
		fa_plan_req_from_desc(d, &r);
		r.ks = ks;
		if ((st = fa_plan(model, &r, &t, 1, &n, err, errlen)) != FA_OK)
			return st;
	}
	struct fa_kernel_spec *spec = &pl->spec;
	fa_kernel_spec_make(spec, model->sm, d->dtype, d->precision, (int)d->D, d->mask, &t);
	fa_kernel_spec_mask_ext(spec, d);
	if (spec->tile.smem > model->smem_optin) {
		char tb[48];
		fa_tile_format(&spec->tile, tb, sizeof tb);
		return fa_err(err, errlen, FA_ENOFIT,
		              "tile %s needs %zu bytes of shared memory, %s allows %zu", tb,
		              spec->tile.smem, model->name ? model->name : "the device",
		              model->smem_optin);
	}
	return FA_OK;
}

void fa_launch_key_make(const struct fa_attn_fwd_desc *d, struct fa_launch_key *k)
{
	memset(k, 0, sizeof *k); /* padding too: keys are compared whole */
	k->dtype = (int32_t)d->dtype;
	k->precision = (int32_t)d->precision;
	k->mask = (int32_t)d->mask;
	k->window = d->window;
	k->D = d->D;
	k->B = d->B;
	k->Sq = d->Sq;
	k->Sk = d->Sk;
	k->Hq = d->Hq;
	k->Hkv = d->Hkv;
	if (d->window) {
		k->window_left = d->window_left;
		k->window_right = d->window_right;
	}
	const double cap = d->softcap == 0 ? 0.0 : d->softcap; /* -0.0 reads as 0.0 */
	memcpy(&k->softcap_bits, &cap, sizeof cap);
}

bool fa_launch_key_equal(const struct fa_launch_key *a, const struct fa_launch_key *b)
{
	return memcmp(a, b, sizeof *a) == 0;
}

/* FNV-1a over the key's bytes: the set. */
static unsigned key_set(const struct fa_launch_key *k)
{
	const unsigned char *p = (const unsigned char *)k;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < sizeof *k; i++) {
		h ^= p[i];
		h *= 1099511628211ull;
	}
	return (unsigned)((h ^ (h >> 32)) % FA_LAUNCH_MEMO_SETS);
}

void fa_launch_memo_init(struct fa_launch_memo *m)
{
	memset(m, 0, sizeof *m);
	pthread_mutex_init(&m->lock, NULL);
}

void fa_launch_memo_destroy(struct fa_launch_memo *m)
{
	pthread_mutex_destroy(&m->lock);
}

/* get and peek: the plan of k under (table, gen); count: a launch's lookup (the stats, the
 * LRU clock), else a query that leaves both as they were. */
static bool memo_find(struct fa_launch_memo *m, const struct fa_launch_key *k,
                      const struct fa_tune_table *table, uint64_t gen,
                      struct fa_launch_plan *out, bool count)
{
	struct fa_launch_memo_slot *set = m->slot[key_set(k)];
	bool hit = false;
	pthread_mutex_lock(&m->lock);
	for (int w = 0; w < FA_LAUNCH_MEMO_WAYS; w++) {
		struct fa_launch_memo_slot *s = &set[w];
		if (!s->used || !fa_launch_key_equal(&s->key, k))
			continue;
		if (s->table != table || s->table_gen != gen) {
			if (count)
				m->st.stale++; /* chosen under another table state: plan again */
			break;
		}
		if (count)
			s->last = ++m->clock;
		*out = s->plan;
		hit = true;
		break;
	}
	if (count && hit)
		m->st.hits++;
	else if (count)
		m->st.misses++;
	pthread_mutex_unlock(&m->lock);
	return hit;
}

bool fa_launch_memo_get(struct fa_launch_memo *m, const struct fa_launch_key *k,
                        const struct fa_tune_table *table, uint64_t gen,
                        struct fa_launch_plan *out)
{
	return memo_find(m, k, table, gen, out, true);
}

bool fa_launch_memo_peek(struct fa_launch_memo *m, const struct fa_launch_key *k,
                         const struct fa_tune_table *table, uint64_t gen,
                         struct fa_launch_plan *out)
{
	return memo_find(m, k, table, gen, out, false);
}

void fa_launch_memo_put(struct fa_launch_memo *m, const struct fa_launch_key *k,
                        const struct fa_tune_table *table, uint64_t gen,
                        const struct fa_launch_plan *plan)
{
	struct fa_launch_memo_slot *set = m->slot[key_set(k)];
	pthread_mutex_lock(&m->lock);
	struct fa_launch_memo_slot *to = NULL;
	for (int w = 0; w < FA_LAUNCH_MEMO_WAYS && !to; w++)
		if (set[w].used && fa_launch_key_equal(&set[w].key, k))
			to = &set[w];
	for (int w = 0; w < FA_LAUNCH_MEMO_WAYS && !to; w++)
		if (!set[w].used)
			to = &set[w];
	if (!to) {
		to = &set[0];
		for (int w = 1; w < FA_LAUNCH_MEMO_WAYS; w++)
			if (set[w].last < to->last)
				to = &set[w];
		m->st.evictions++;
	}
	to->used = true;
	to->key = *k;
	to->table = table;
	to->table_gen = gen;
	to->last = ++m->clock;
	to->plan = *plan;
	pthread_mutex_unlock(&m->lock);
}

void fa_launch_memo_clear(struct fa_launch_memo *m)
{
	pthread_mutex_lock(&m->lock);
	for (int i = 0; i < FA_LAUNCH_MEMO_SETS; i++)
		for (int w = 0; w < FA_LAUNCH_MEMO_WAYS; w++)
			m->slot[i][w].used = false;
	m->st.clears++;
	pthread_mutex_unlock(&m->lock);
}

void fa_launch_memo_stats(struct fa_launch_memo *m, struct fa_launch_memo_stats *out)
{
	pthread_mutex_lock(&m->lock);
	*out = m->st;
	pthread_mutex_unlock(&m->lock);
}
