/* test_bwd_det_turns.c - the backward kernel's index math (kernels/attn_bwd.cu) restated on the
 * host and checked without a GPU, over many shapes, masks, windows and tiles:
 *   - the window folded into the range [win_lo, win_hi] of j - i (fa_attn_window_diffs, what
 *     gpu_bwd.c passes to FA_WIN) says exactly what fa_attn_key_range says, pair by pair;
 *   - a key block walks exactly the query blocks that hold a row seeing one of its keys
 *     (qblock_range: no visible pair is missed, no block that sees nothing is walked, so the
 *     time follows the window), and a step it does not mask (need_mask) holds only visible
 *     pairs;
 *   - the deterministic mode's turns (det_turn): for every query block, the counts the key
 *     blocks that walk it wait for are a permutation of 0 .. walkers - 1, and a simulation of
 *     the hand-over protocol (release a step late, wait for the turn; blocks resident a few at a
 *     time in launch order, picked at random) completes, every add of a query block in the same
 *     order on every run. A turn counted from key block 0 under a window (the prefix the masks
 *     give) waits for an add that never comes: the simulation reports the deadlock.
 *   - attn_bwd_sm90.cu's rotated order (det_iq, det_rank): every query block's ranks a
 *     permutation, and the kernel's loop, simulated with one head's key blocks resident or
 *     more, completes with the same order of adds on every schedule;
 *   - attn_bwd_sm90.cu's chain under a window (det_win_turn): the key blocks that walk a query
 *     block are exactly n = a .. b - 1 with a the block of its first visible key, so the turns
 *     n - a are 0 .. walkers - 1 (each waits only on lower, earlier launched key blocks).
 * The functions below are attn_bwd.cu's (and attn_bwd_sm90.cu's), line for line (FA_WIN and
 * the masks); a change there is made here too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_attn.h"

/* The kernel's parameters and compile-time tile, and the block's place in the grid. */
struct kp {
	int Sq, Sk, nq, BQ, BKV, mask, win, win_lo, win_hi, dgrp_lg;
	int member, G; /* det_member(p), blockIdx.z */
};

/* ---- attn_bwd.cu, restated ------------------------------------------------------------------ */

static int first_qblock(const struct kp *p, int n)
{
	if (!p->mask)
		return 0;
	const int r = n * p->BKV - (p->mask == 1 ? p->Sk - p->Sq : 0);
	return r >= p->Sq ? p->nq : r > 0 ? r / p->BQ : 0;
}

static void qblock_range(const struct kp *p, int n, int *f, int *l)
{
	if (p->win) {
		const long long kv0 = (long long)n * p->BKV;
		const long long ke = kv0 + p->BKV < p->Sk ? kv0 + p->BKV : (long long)p->Sk;
		const long long ilo = kv0 - p->win_hi > 0 ? kv0 - p->win_hi : 0LL;
		const long long ihi = ke - p->win_lo < p->Sq ? ke - p->win_lo : (long long)p->Sq;
		*f = ilo < ihi ? (int)(ilo / p->BQ) : 0;
		*l = ilo < ihi ? (int)((ihi + p->BQ - 1) / p->BQ) : 0;
	} else {
		*f = first_qblock(p, n);
		*l = p->nq;
	}
}

static int det_rot(const struct kp *p, int n, int x)
{
	int f, l;
	qblock_range(p, n, &f, &l);
	const int span = l - f;
	return span > 0 ? 2 * x % span : 0;
}

static int step_qblock(const struct kp *p, int n, int iq0, int iq1, int k)
{
	const int iq = iq0 + k + det_rot(p, n, p->member);
	return iq >= iq1 ? iq - (iq1 - iq0) : iq;
}

/* prefix_bug: count from key block 0 under a window too (what a turn assuming the masks'
 * prefix does), so that the test shows it would catch it. */
static int det_turn(const struct kp *p, int iq, bool prefix_bug)
{
	const int c = 1 << p->dgrp_lg, r = p->member, G = p->G;
	const int nkv = (p->Sk + p->BKV - 1) / p->BKV;
	int w = G * c, mine = 0;
	if (p->win && !prefix_bug) {
		const long long k0 = (long long)iq * p->BQ + p->win_lo;
		const int a = k0 > 0 ? (int)(k0 / p->BKV) : 0;
		w = G * c > a ? G * c - a : 0;
	}
	for (int pass = 0; pass < 2; pass++)
		for (int x = 0; x < c; x++) {
			const int n = G * c + x;
			if (pass == 0 && x != r)
				continue;
			if (n >= nkv)
				break;
			int f, l;
			qblock_range(p, n, &f, &l);
			const int span = l - f;
			if (iq < f || (p->win && iq >= l))
				continue;
			const int k = (iq - f - det_rot(p, n, x) + span) % span;
			if (pass == 0)
				mine = k;
			else if (x != r && (k < mine || (k == mine && x < r)))
				w++;
		}
	return w;
}

/* bwd_step's need_mask under FA_WIN: some pair of the tile may be invisible. */
static bool need_mask_win(const struct kp *p, int kv0, int q0)
{
	return kv0 + p->BKV > p->Sk || kv0 - (q0 + p->BQ - 1) < p->win_lo ||
	       kv0 + p->BKV - 1 - q0 > p->win_hi;
}

/* ---- the cases ------------------------------------------------------------------------------ */

static const int LENS[] = {1, 2, 17, 64, 100, 129, 257, 1000};
#define NLENS ((int)(sizeof LENS / sizeof LENS[0]))
static const fa_mask MASKS[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT, FA_MASK_CAUSAL_TOP_LEFT};
/* window (left, right); {2, 2}: no window */
static const int64_t WINS[][2] = {{2, 2},   {-1, -1}, {0, 0},   {3, -1},     {-1, 5},
                                  {16, 16}, {100, 0}, {0, 100}, {-1, 0},     {5, 3},
                                  {1000, 1000}, {40, 7}, {0, 4096}, {4096, 4096}};
#define NWINS ((int)(sizeof WINS / sizeof WINS[0]))
static const int TILES[][2] = {{16, 16}, {32, 64}, {64, 128}, {128, 64}, {64, 16}}; /* BQ, BKV */
#define NTILES ((int)(sizeof TILES / sizeof TILES[0]))

static struct fa_attn_fwd_desc make_desc(int Sq, int Sk, fa_mask m, int wi)
{
	struct fa_attn_fwd_desc d;
	memset(&d, 0, sizeof d);
	d.Sq = Sq;
	d.Sk = Sk;
	d.mask = m;
	d.window = wi != 0;
	d.window_left = WINS[wi][0];
	d.window_right = WINS[wi][1];
	return d;
}

/* The kernel's parameters as gpu_bwd.c sets them for d and tile t: FA_WIN where the window
 * bounds a side (fa_kernel_spec_mask_ext), the mask alone otherwise. */
static struct kp make_kp(const struct fa_attn_fwd_desc *d, int t)
{
	struct kp p;
	memset(&p, 0, sizeof p);
	p.Sq = (int)d->Sq;
	p.Sk = (int)d->Sk;
	p.BQ = TILES[t][0];
	p.BKV = TILES[t][1];
	p.nq = (p.Sq + p.BQ - 1) / p.BQ;
	p.mask = (int)d->mask;
	p.win = fa_attn_window_active(d);
	if (p.win) {
		int64_t lo, hi;
		fa_attn_window_diffs(d, &lo, &hi);
		p.win_lo = (int)lo;
		p.win_hi = (int)hi;
	}
	return p;
}

static void test_window_diffs_say_what_the_key_range_says(void **state)
{
	(void)state;
	long pairs = 0;
	for (int a = 0; a < NLENS; a++)
		for (int b = 0; b < NLENS; b++)
			for (int m = 0; m < 3; m++)
				for (int wi = 0; wi < NWINS; wi++) {
					const int Sq = LENS[a], Sk = LENS[b];
					struct fa_attn_fwd_desc d = make_desc(Sq, Sk, MASKS[m], wi);
					int64_t lo, hi;
					fa_attn_window_diffs(&d, &lo, &hi);
					const int64_t diag = m == 2 ? 0 : Sk - Sq;
					assert_true(lo <= diag && diag <= hi);
					assert_true(lo >= -Sq - 1 && hi <= Sk + 1);
					for (int i = 0; i < Sq; i++)
						for (int j = 0; j < Sk; j++, pairs++) {
							const bool want = fa_attn_allows(&d, Sq, Sk, i, j);
							const bool got = j - i >= lo && j - i <= hi;
							if (want != got)
								fail_msg("Sq=%d Sk=%d mask %d window (%lld, %lld): (i %d, j %d) "
								         "key range %d, diffs [%lld, %lld] %d", Sq, Sk, m,
								         (long long)d.window_left, (long long)d.window_right, i,
								         j, want, (long long)lo, (long long)hi, got);
						}
				}
	printf("%ld pairs\n", pairs);
}

/* Whether a row of query block iq sees a key of key block n. */
static bool tile_sees(const struct fa_attn_fwd_desc *d, const struct kp *p, int n, int iq)
{
	for (int i = iq * p->BQ; i < (iq + 1) * p->BQ && i < p->Sq; i++) {
		int64_t lo, hi;
		fa_attn_key_range(d, p->Sq, p->Sk, i, &lo, &hi);
		if (lo < hi && lo < (int64_t)(n + 1) * p->BKV && hi > (int64_t)n * p->BKV)
			return true;
	}
	return false;
}

static void test_a_key_block_walks_exactly_the_query_blocks_that_see_it(void **state)
{
	(void)state;
	long walked = 0, visible_total = 0, unmasked = 0;
	for (int a = 0; a < NLENS; a++)
		for (int b = 0; b < NLENS; b++)
			for (int m = 0; m < 3; m++)
				for (int wi = 0; wi < NWINS; wi++)
					for (int t = 0; t < NTILES; t++) {
						struct fa_attn_fwd_desc d = make_desc(LENS[a], LENS[b], MASKS[m], wi);
						struct kp p = make_kp(&d, t);
						const int nkv = (p.Sk + p.BKV - 1) / p.BKV;
						for (int n = 0; n < nkv; n++) {
							int f, l;
							qblock_range(&p, n, &f, &l);
							assert_true(f >= 0 && l <= p.nq && (f <= l || !p.win));
							for (int iq = 0; iq < p.nq; iq++) {
								const bool in = iq >= f && iq < l;
								const bool sees = tile_sees(&d, &p, n, iq);
								if (in != sees)
									fail_msg("Sq=%d Sk=%d mask %d window %d (%lld, %lld) tile "
									         "q%d kv%d: key block %d, query block %d: walked %d, "
									         "sees %d", p.Sq, p.Sk, m, (int)d.window,
									         (long long)d.window_left, (long long)d.window_right,
									         p.BQ, p.BKV, n, iq, in, sees);
								walked += in;
								visible_total += sees;
								if (!in || !p.win || need_mask_win(&p, n * p.BKV, iq * p.BQ))
									continue;
								/* an unmasked step: every pair of it is visible */
								unmasked++;
								for (int i = iq * p.BQ; i < (iq + 1) * p.BQ && i < p.Sq; i++)
									for (int j = n * p.BKV; j < (n + 1) * p.BKV; j++)
										if (!(j < p.Sk && fa_attn_allows(&d, p.Sq, p.Sk, i, j)))
											fail_msg("unmasked step hides (i %d, j %d)", i, j);
							}
						}
					}
	printf("%ld steps walked (%ld tiles see a pair), %ld of the window's unmasked\n", walked,
	       visible_total, unmasked);
}

/* ---- the deterministic protocol, simulated -------------------------------------------------- */

/* One key block of the simulation: its steps over `group` query heads, and where it is. */
struct sblock {
	struct kp p;
	int n, iq0, iq1, total, at; /* at: the next step; total + 1: retired */
	bool released;              /* the release before step `at` is done */
};

/* The counter (head hh, query block iq) of step `it` of block b. */
static int step_iq(const struct sblock *b, int it)
{
	const int span = b->iq1 - b->iq0;
	return step_qblock(&b->p, b->n, b->iq0, b->iq1, it % span);
}

/* Run the protocol over the key blocks of p (groups of 2^dgrp_lg, `resident` at once, picked at
 * random); returns false on a deadlock. order[(hh * nq + iq) * nkv + k] gets the key block of the
 * k-th add to (hh, iq); turns are checked against the counters as the kernel waits on them. */
static bool simulate(const struct kp *base, int group, int resident, uint64_t seed, bool prefix_bug,
                     int *order, int *count)
{
	const int nkv = (base->Sk + base->BKV - 1) / base->BKV, c = 1 << base->dgrp_lg;
	const int ngroups = (nkv + c - 1) / c, nq = base->nq;
	int *turn = calloc((size_t)group * nq, sizeof(int));
	struct sblock *bl = calloc((size_t)ngroups * c, sizeof *bl);
	int nblocks = 0;
	for (int G = 0; G < ngroups; G++) /* launch order: groups, members fastest */
		for (int x = 0; x < c; x++) {
			struct sblock *b = &bl[nblocks++];
			b->p = *base;
			b->p.G = G;
			b->p.member = x;
			b->n = G * c + x;
			if (b->n >= nkv) { /* the last group's missing members return at once */
				b->total = 0;
				b->at = 1;
				continue;
			}
			qblock_range(&b->p, b->n, &b->iq0, &b->iq1);
			b->total = (b->iq1 - b->iq0) * group;
		}
	memset(count, 0, sizeof(int) * (size_t)group * nq);
	int next = 0, live = 0, done = 0;
	int *res = malloc(sizeof(int) * (size_t)resident);
	uint64_t rng = seed;
	bool ok = true;
	while (done < nblocks) {
		while (live < resident && next < nblocks)
			res[live++] = next++;
		/* a random resident block tries to move; a round in which none can is a deadlock */
		bool moved = false;
		const int start = (int)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >>
		                        33) % live;
		for (int tries = 0; tries < live && !moved; tries++) {
			const int slot = (start + tries) % live;
			struct sblock *b = &bl[res[slot]];
			const int span = b->iq1 - b->iq0;
			if (b->at >= b->total) { /* the end: release the last step's part, retire */
				if (b->total > 0)
					turn[(group - 1) * nq + step_iq(b, span - 1)]++;
				b->at = b->total + 1;
				res[slot] = res[--live];
				done++;
				moved = true;
				break;
			}
			const int hh = b->at / span, k = b->at % span, iq = step_iq(b, k);
			if (!b->released) { /* the previous step's part, before the wait */
				if (k > 0)
					turn[hh * nq + step_iq(b, k - 1)]++;
				else if (hh > 0)
					turn[(hh - 1) * nq + step_iq(b, span - 1)]++;
				b->released = true;
				moved = true; /* progress: another block may now go on */
			}
			if (turn[hh * nq + iq] != det_turn(&b->p, iq, prefix_bug))
				continue; /* waits */
			order[(hh * nq + iq) * nkv + count[hh * nq + iq]++] = b->n;
			b->at++;
			b->released = false;
			moved = true;
		}
		if (!moved) {
			ok = false;
			if (getenv("FA_TEST_VERBOSE"))
				for (int i = 0; i < live; i++) {
					const struct sblock *b = &bl[res[i]];
					const int span = b->iq1 - b->iq0, hh = b->at / span, k = b->at % span;
					const int iq = step_iq(b, k);
					printf("  stuck: key block %d, head %d, step %d of %d: query block %d, "
					       "counter %d, turn %d\n", b->n, hh, k, span, iq, turn[hh * nq + iq],
					       det_turn(&b->p, iq, prefix_bug));
				}
			break;
		}
	}
	free(res);
	free(turn);
	free(bl);
	return ok;
}

static void check_shape(const struct fa_attn_fwd_desc *d, int t, int dgrp_lg, int group,
                        long *sims)
{
	struct kp p = make_kp(d, t);
	p.dgrp_lg = dgrp_lg;
	const int nkv = (p.Sk + p.BKV - 1) / p.BKV, c = 1 << dgrp_lg, nq = p.nq;
	/* the turns of every query block: a permutation of 0 .. walkers - 1 */
	int *seen = calloc((size_t)nkv + 1, sizeof(int));
	for (int iq = 0; iq < nq; iq++) {
		int walkers = 0;
		memset(seen, 0, sizeof(int) * ((size_t)nkv + 1));
		for (int n = 0; n < nkv; n++) {
			struct kp q = p;
			q.G = n / c;
			q.member = n % c;
			int f, l;
			qblock_range(&q, n, &f, &l);
			if (iq < f || iq >= l)
				continue;
			walkers++;
			const int w = det_turn(&q, iq, false);
			if (w < 0 || w >= nkv || seen[w]++)
				fail_msg("Sq=%lld Sk=%lld mask %d window %d (%lld, %lld) tile q%d kv%d group "
				         "%d: query block %d, key block %d: turn %d taken twice or out of range",
				         (long long)d->Sq, (long long)d->Sk, (int)d->mask, (int)d->window,
				         (long long)d->window_left, (long long)d->window_right, p.BQ, p.BKV, c,
				         iq, n, w);
		}
		for (int w = 0; w < walkers; w++)
			if (!seen[w])
				fail_msg("query block %d: no key block takes turn %d of %d (deadlock)", iq, w,
				         walkers);
	}
	free(seen);
	/* the protocol: completes, the same order of adds on every schedule */
	const size_t ocells = (size_t)group * nq * nkv;
	int *o1 = malloc(sizeof(int) * (ocells + 1)), *o2 = malloc(sizeof(int) * (ocells + 1));
	int *c1 = malloc(sizeof(int) * ((size_t)group * nq + 1));
	int *c2 = malloc(sizeof(int) * ((size_t)group * nq + 1));
	const int res[2] = {c, 2 * c + 1};
	for (int r = 0; r < 2; r++) {
		if (!simulate(&p, group, res[r], 0x1234u + (uint64_t)r, false, o1, c1) ||
		    !simulate(&p, group, res[r], 0x9876u * (uint64_t)(r + 3), false, o2, c2))
			fail_msg("Sq=%lld Sk=%lld mask %d window %d (%lld, %lld) tile q%d kv%d group %d "
			         "resident %d: the hand-over deadlocks", (long long)d->Sq, (long long)d->Sk,
			         (int)d->mask, (int)d->window, (long long)d->window_left,
			         (long long)d->window_right, p.BQ, p.BKV, c, res[r]);
		for (int x = 0; x < group * nq; x++) {
			assert_int_equal(c1[x], c2[x]);
			for (int k = 0; k < c1[x]; k++)
				if (o1[(size_t)x * nkv + k] != o2[(size_t)x * nkv + k])
					fail_msg("query block %d: add %d from key block %d, then %d", x % nq, k,
					         o1[(size_t)x * nkv + k], o2[(size_t)x * nkv + k]);
			/* groups of one: the adds come in key-block order */
			for (int k = 1; c == 1 && k < c1[x]; k++)
				assert_true(o1[(size_t)x * nkv + k - 1] < o1[(size_t)x * nkv + k]);
		}
		(*sims) += 2;
	}
	free(o1);
	free(o2);
	free(c1);
	free(c2);
}

static void test_deterministic_turns_are_a_permutation_and_the_hand_over_completes(void **state)
{
	(void)state;
	static const int lens[] = {1, 17, 64, 129, 300};
	const int nl = (int)(sizeof lens / sizeof lens[0]);
	long sims = 0;
	for (int a = 0; a < nl; a++)
		for (int b = 0; b < nl; b++)
			for (int m = 0; m < 3; m++)
				for (int wi = 0; wi < NWINS; wi++)
					for (int t = 0; t < NTILES; t++)
						for (int g = 0; g <= 3; g += 1) {
							struct fa_attn_fwd_desc d = make_desc(lens[a], lens[b], MASKS[m], wi);
							check_shape(&d, t, g, g % 2 ? 2 : 1, &sims);
						}
	printf("%ld schedules simulated\n", sims);
}

/* The trap the brief names: turns counted from key block 0 (the masks' prefix) under a window
 * that hides keys below the diagonal wait for adds that never come. */
static void test_turns_counted_from_key_block_zero_deadlock_under_a_window(void **state)
{
	(void)state;
	struct fa_attn_fwd_desc d = make_desc(300, 300, FA_MASK_NONE, 5); /* window (16, 16) */
	struct kp p = make_kp(&d, 0);
	const int nkv = (p.Sk + p.BKV - 1) / p.BKV;
	int *o = malloc(sizeof(int) * (size_t)p.nq * nkv), *c = malloc(sizeof(int) * (size_t)p.nq);
	assert_true(simulate(&p, 1, 4, 1, false, o, c));
	assert_false(simulate(&p, 1, 4, 1, true, o, c));
	free(o);
	free(c);
}

/* ---- attn_bwd_sm90.cu's rotated order (det_rot: the atomic grid, key block fastest) -------- */

/* The query block of a block's step position j (det_iq with rot0 = n nq / nk, no mask). */
static int wg_step_iq(const struct kp *p, int n, int nk, int j)
{
	const int iq = first_qblock(p, n) + j;
	if (p->mask)
		return iq;
	const int r = iq + n * p->nq / nk;
	return r >= p->nq ? r - p->nq : r;
}

/* det_rank: the adds to iq before key block n's. */
static int wg_rank(const struct kp *p, int n, int nk, int iq)
{
	int M;
	if (p->mask) {
		const int off = p->mask == 1 ? p->Sk - p->Sq : 0;
		const int q0 = iq * p->BQ, ql = (q0 + p->BQ < p->Sq ? q0 + p->BQ : p->Sq) - 1 + off;
		M = ql / p->BKV < nk - 1 ? ql / p->BKV : nk - 1;
	} else {
		M = (int)(((long long)(iq + 1) * nk - 1) / p->nq);
	}
	const int r = M - n;
	return r < 0 ? r + nk : r;
}

/* The kernel's loop for hk kv heads of `group` query heads each, nk key blocks per kv head
 * launched in grid order (key block fastest), `resident` at once, a random one moving; the
 * count of a step handed on before the next step's wait. Returns false on a deadlock; order
 * gets the key block of each add per (kv head, query head, query block). */
static bool wg_simulate(const struct kp *p, int hk, int group, int resident, uint64_t seed,
                        int *order, int *count)
{
	const int nk = (p->Sk + p->BKV - 1) / p->BKV, nq = p->nq, nb = hk * nk;
	const size_t ncnt = (size_t)hk * group * nq;
	int *turn = calloc(ncnt, sizeof(int)), *at = calloc((size_t)nb, sizeof(int));
	bool *rel = calloc((size_t)nb, sizeof(bool));
	int *res = malloc(sizeof(int) * (size_t)resident);
	memset(count, 0, sizeof(int) * ncnt);
	int next = 0, live = 0, done = 0;
	uint64_t rng = seed;
	bool ok = true;
	while (done < nb) {
		while (live < resident && next < nb)
			res[live++] = next++;
		bool moved = false;
		const int start = (int)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >>
		                        33) % live;
		for (int tries = 0; tries < live && !moved; tries++) {
			const int slot = (start + tries) % live, id = res[slot];
			const int h = id / nk, n = id % nk, steps = nq - first_qblock(p, n);
			const int total = steps > 0 ? steps * group : 0;
			int *t = turn + (size_t)h * group * nq;
			/* the counter of step it of this block */
#define WG_CELL(it) ((it) / steps * nq + wg_step_iq(p, n, nk, (it) % steps))
			if (at[id] >= total) { /* the last step's count, then retire */
				if (total > 0)
					t[WG_CELL(total - 1)]++;
				res[slot] = res[--live];
				done++;
				moved = true;
				break;
			}
			if (!rel[id]) {
				if (at[id] > 0)
					t[WG_CELL(at[id] - 1)]++;
				rel[id] = true;
				moved = true;
			}
			const int cell = WG_CELL(at[id]);
#undef WG_CELL
			if (t[cell] != wg_rank(p, n, nk, cell % nq))
				continue;
			const size_t x = (size_t)h * group * nq + cell;
			order[x * nk + count[x]++] = n;
			at[id]++;
			rel[id] = false;
			moved = true;
		}
		if (!moved) {
			ok = false;
			break;
		}
	}
	free(turn);
	free(at);
	free(rel);
	free(res);
	return ok;
}

static void test_the_wgmma_kernels_rotated_order_is_fixed_and_completes(void **state)
{
	(void)state;
	static const int lens[] = {1, 17, 64, 129, 300, 1000, 2500};
	static const int tiles[][2] = {{64, 128}, {64, 64}, {128, 128}, {128, 64}}; /* BQ, BKV */
	const int nl = (int)(sizeof lens / sizeof lens[0]);
	long sims = 0;
	for (int a = 0; a < nl; a++)
		for (int b = 0; b < nl; b++)
			for (int m = 0; m < 3; m++)
				for (int t = 0; t < 4; t++) {
					struct kp p;
					memset(&p, 0, sizeof p);
					p.Sq = lens[a];
					p.Sk = lens[b];
					p.BQ = tiles[t][0];
					p.BKV = tiles[t][1];
					p.nq = (p.Sq + p.BQ - 1) / p.BQ;
					p.mask = (int)MASKS[m];
					const int nk = (p.Sk + p.BKV - 1) / p.BKV, nq = p.nq;
					/* the ranks at each query block: a permutation of 0 .. walkers - 1 */
					int *seen = calloc((size_t)nk, sizeof(int));
					for (int iq = 0; iq < nq; iq++) {
						int walkers = 0;
						memset(seen, 0, sizeof(int) * (size_t)nk);
						for (int n = 0; n < nk; n++) {
							if (iq < first_qblock(&p, n))
								continue;
							walkers++;
							const int r = wg_rank(&p, n, nk, iq);
							if (r < 0 || r >= nk || seen[r]++)
								fail_msg("Sq=%d Sk=%d mask %d q%d kv%d: query block %d, key "
								         "block %d: rank %d twice or out of range", p.Sq, p.Sk,
								         p.mask, p.BQ, p.BKV, iq, n, r);
						}
						for (int r = 0; r < walkers; r++)
							if (!seen[r])
								fail_msg("Sq=%d Sk=%d mask %d q%d kv%d: query block %d: no "
								         "rank %d of %d", p.Sq, p.Sk, p.mask, p.BQ, p.BKV, iq, r,
								         walkers);
					}
					free(seen);
					/* two kv heads of two query heads; resident: one head's nk, more */
					const size_t cells = (size_t)2 * 2 * nq;
					int *o1 = malloc(sizeof(int) * cells * nk), *o2 = malloc(sizeof(int) * cells * nk);
					int *c1 = malloc(sizeof(int) * cells), *c2 = malloc(sizeof(int) * cells);
					const int res[3] = {nk, nk + 3, 4 * nk};
					for (int r = 0; r < 3; r++) {
						if (!wg_simulate(&p, 2, 2, res[0], 7 + (uint64_t)r, o1, c1) ||
						    !wg_simulate(&p, 2, 2, res[r], 0x5151u * (uint64_t)(r + 1), o2, c2))
							fail_msg("Sq=%d Sk=%d mask %d q%d kv%d resident %d: deadlock", p.Sq,
							         p.Sk, p.mask, p.BQ, p.BKV, res[r]);
						for (size_t x = 0; x < cells; x++) {
							assert_int_equal(c1[x], c2[x]);
							for (int k = 0; k < c1[x]; k++)
								if (o1[x * nk + k] != o2[x * nk + k])
									fail_msg("Sq=%d Sk=%d mask %d: cell %zu add %d from key "
									         "block %d, then %d", p.Sq, p.Sk, p.mask, x, k,
									         o1[x * nk + k], o2[x * nk + k]);
						}
						sims += 2;
					}
					free(o1);
					free(o2);
					free(c1);
					free(c2);
				}
	printf("%ld schedules simulated\n", sims);
}

/* attn_bwd_sm90.cu's det_win_turn: n - (the key block of q0 + win_lo, 0 below). */
static int wg_win_turn(const struct kp *p, int n, int q0)
{
	const long long k0 = (long long)q0 + p->win_lo;
	return n - (k0 > 0 ? (int)(k0 / p->BKV) : 0);
}

static void test_the_wgmma_kernels_chain_under_a_window_counts_from_the_first_key_block(void **state)
{
	(void)state;
	static const int tiles[][2] = {{64, 128}, {64, 64}}; /* BQ, BKV: the narrow and wide forms */
	long cells = 0;
	for (int a = 0; a < NLENS; a++)
		for (int b = 0; b < NLENS; b++)
			for (int m = 0; m < 3; m++)
				for (int wi = 1; wi < NWINS; wi++)
					for (int t = 0; t < 2; t++) {
						struct fa_attn_fwd_desc d = make_desc(LENS[a], LENS[b], MASKS[m], wi);
						struct kp p = make_kp(&d, 0);
						if (!p.win)
							continue;
						p.BQ = tiles[t][0];
						p.BKV = tiles[t][1];
						p.nq = (p.Sq + p.BQ - 1) / p.BQ;
						const int nkv = (p.Sk + p.BKV - 1) / p.BKV;
						for (int iq = 0; iq < p.nq; iq++, cells++) {
							int walkers = 0;
							unsigned long long seen = 0; /* turns, nkv <= 16 here */
							assert_true(nkv <= 64);
							for (int n = 0; n < nkv; n++) {
								int f, l;
								qblock_range(&p, n, &f, &l);
								if (iq < f || iq >= l)
									continue;
								walkers++;
								const int r = wg_win_turn(&p, n, iq * p.BQ);
								if (r < 0 || r >= nkv || (seen >> r & 1))
									fail_msg("Sq=%d Sk=%d mask %d window (%lld, %lld) q%d kv%d: "
									         "query block %d, key block %d: turn %d", p.Sq, p.Sk,
									         m, (long long)d.window_left,
									         (long long)d.window_right, p.BQ, p.BKV, iq, n, r);
								seen |= 1ull << r;
							}
							if (seen != (walkers ? ~0ull >> (64 - walkers) : 0))
								fail_msg("Sq=%d Sk=%d mask %d window (%lld, %lld) q%d kv%d: query "
								         "block %d: turns 0x%llx of %d walkers", p.Sq, p.Sk, m,
								         (long long)d.window_left, (long long)d.window_right,
								         p.BQ, p.BKV, iq, seen, walkers);
						}
					}
	printf("%ld query blocks\n", cells);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_window_diffs_say_what_the_key_range_says),
		cmocka_unit_test(test_a_key_block_walks_exactly_the_query_blocks_that_see_it),
		cmocka_unit_test(test_deterministic_turns_are_a_permutation_and_the_hand_over_completes),
		cmocka_unit_test(test_turns_counted_from_key_block_zero_deadlock_under_a_window),
		cmocka_unit_test(test_the_wgmma_kernels_rotated_order_is_fixed_and_completes),
		cmocka_unit_test(test_the_wgmma_kernels_chain_under_a_window_counts_from_the_first_key_block),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
