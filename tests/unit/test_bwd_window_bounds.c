/* test_bwd_window_bounds.c - the backward kernel's sliding-window bookkeeping (attn_bwd.cu,
 * FA_WIN), checked on the host without a GPU: the window as gpu_bwd.c passes it
 * (fa_gpu_window_range), the query blocks [iq0, iq1) a key block walks, the element mask of its
 * edge steps, and the deterministic mode's turns. Over odd lengths, tile sizes, both causal
 * masks and one- and two-sided windows:
 *   - a key block visits exactly the query blocks holding a (row, key) pair the window lets
 *     through (fa_attn_allows, the reference's rule), and on a visited step the kernel's mask
 *     lets through exactly those pairs;
 *   - the key blocks that visit a query block take the turns 0, 1, 2, ... in block order, so
 *     the deterministic mode never waits for a turn nobody gives.
 * The kernel's formulas are restated below (they are device code); a change to one is a change
 * to the other.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fa_attn.h"
#include "gpu_int.h"

/* attn_bwd.cu's floor_div, iq0, iq1, TURN, need_mask and fa_win_sees (fa_device.cuh). */
static int floor_div(int a, int b)
{
	return a >= 0 ? a / b : -((b - 1 - a) / b);
}
static int imax(int a, int b) { return a > b ? a : b; }
static int imin(int a, int b) { return a < b ? a : b; }

struct kgeom {
	int Sq, Sk, BQ, BKV, lo, hi, nq;
};

static void block_range(const struct kgeom *g, int n, int *iq0, int *iq1)
{
	const int kv0 = n * g->BKV, kend = imin(kv0 + g->BKV, g->Sk);
	*iq0 = imax(0, floor_div(kv0 - g->hi, g->BQ));
	*iq1 = imin(g->nq, floor_div(kend - 1 - g->lo, g->BQ) + 1); /* may be below *iq0 */
}

static int turn(const struct kgeom *g, int n, int iq)
{
	return n - imax(0, floor_div(iq * g->BQ + g->lo, g->BKV));
}

static bool kernel_sees(const struct kgeom *g, int n, int iq, int i, int j)
{
	const int kv0 = n * g->BKV, q0 = iq * g->BQ;
	const bool need_mask = kv0 + g->BKV > g->Sk || kv0 - (q0 + g->BQ - 1) < g->lo ||
	                       kv0 + g->BKV - 1 - q0 > g->hi;
	if (!need_mask)
		return true;
	const int dd = j - i;
	return j < g->Sk && dd >= g->lo && dd <= g->hi;
}

/* One configuration; the number of problems found (0: fine), the first described in why. */
static int check_one(const struct fa_attn_fwd_desc *d, int BQ, int BKV, char *why, size_t whylen)
{
	struct kgeom g = {(int)d->Sq, (int)d->Sk, BQ, BKV, 0, 0, (int)((d->Sq + BQ - 1) / BQ)};
	fa_gpu_window_range(d, &g.lo, &g.hi);
	const int nk = (g.Sk + BKV - 1) / BKV;
	int bad = 0;
	for (int iq = 0; iq < g.nq; iq++) {
		int next_turn = 0;
		for (int n = 0; n < nk; n++) {
			int iq0, iq1;
			block_range(&g, n, &iq0, &iq1);
			const bool visits = iq >= iq0 && iq < iq1;
			bool any = false;
			for (int i = iq * BQ; i < (iq + 1) * BQ && i < g.Sq; i++)
				for (int j = n * BKV; j < (n + 1) * BKV && j < g.Sk; j++) {
					const bool want = fa_attn_allows(d, d->Sq, d->Sk, i, j);
					any |= want;
					if (visits && kernel_sees(&g, n, iq, i, j) != want && bad++ == 0)
						snprintf(why, whylen, "row %d key %d: kernel %d, reference %d", i, j,
						         !want, want);
				}
			if (any && !visits && bad++ == 0)
				snprintf(why, whylen, "key block %d skips query block %d, which sees it", n, iq);
			if (visits) {
				if (turn(&g, n, iq) != next_turn && bad++ == 0)
					snprintf(why, whylen, "key block %d takes turn %d at query block %d, "
					         "want %d", n, turn(&g, n, iq), iq, next_turn);
				next_turn++;
			}
		}
	}
	return bad;
}

static void test_key_blocks_visit_exactly_the_query_blocks_their_window_reaches(void **state)
{
	(void)state;
	static const int lens[] = {1, 2, 17, 64, 65, 127, 129, 200};
	static const int64_t lefts[] = {-1, 0, 1, 5, 16, 100, 300};
	static const int64_t rights[] = {-1, 0, 3, 16, 200};
	static const fa_mask masks[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT,
	                                FA_MASK_CAUSAL_TOP_LEFT};
	static const int tiles[][2] = {{16, 32}, {64, 64}, {32, 128}, {64, 16}};
	int configs = 0, failed = 0;
	char why[256];
	for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++)
		for (size_t b = 0; b < sizeof lens / sizeof lens[0]; b++)
			for (size_t m = 0; m < 3; m++)
				for (size_t l = 0; l < sizeof lefts / sizeof lefts[0]; l++)
					for (size_t r = 0; r < sizeof rights / sizeof rights[0]; r++) {
						struct fa_attn_fwd_desc d;
						memset(&d, 0, sizeof d);
						d.Sq = lens[a];
						d.Sk = lens[b];
						d.mask = masks[m];
						d.window = true;
						d.window_left = lefts[l];
						d.window_right = rights[r];
						if (!fa_attn_window_active(&d))
							continue; /* FA_WIN is not compiled in: the mask's own path */
						for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
							configs++;
							if (check_one(&d, tiles[t][0], tiles[t][1], why, sizeof why) &&
							    failed++ < 10)
								printf("Sq=%d Sk=%d mask %d window (%lld, %lld) BQ %d BKV %d: "
								       "%s\n", lens[a], lens[b], (int)masks[m],
								       (long long)lefts[l], (long long)rights[r],
								       tiles[t][0], tiles[t][1], why);
						}
					}
	printf("%d configurations, %d wrong\n", configs, failed);
	assert_int_equal(failed, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_key_blocks_visit_exactly_the_query_blocks_their_window_reaches),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
