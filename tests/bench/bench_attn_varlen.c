/* bench_attn_varlen.c - the prefill forward over the inference layouts (fa_gpu_fwd_infer) against
 * the dense kernel on the same tokens, timed with CUDA events (median of 15 after 3 warm-ups).
 *
 * 1. Varlen: 16 sequences of random lengths 1..4096 (a fixed seed), packed queries and keys,
 *    against the same number of tokens as one dense batch of 16 equal lengths (issue 11's target:
 *    within 10% of its time), and against the dense batch padded to the longest sequence (what a
 *    caller without varlen runs). Attention's work is quadratic in each length, so random lengths
 *    hold more score pairs than equal ones with the same tokens (sum L^2 >= (sum L)^2 / 16): the
 *    time ratio is printed beside the ratio per score pair (TFLOP/s), which is the kernel's cost of
 *    the layout.
 * 2. Paged vs contiguous: chunked prefill, 16 sequences of 512 new queries against 4096 cached
 *    keys, the cache contiguous (per-sequence lengths) or paged (16, 64, 256 tokens, shuffled).
 * 3. A sliding window over a long cache: 4 sequences of 512 new queries against 16384 keys,
 *    causal with and without the window (4095, 0), contiguous and paged (16, 256), against the
 *    same queries over 4096 keys without a window (the window's keys): issue 11's target is a
 *    time proportional to the window. FA_BENCH_WINDOW_ONLY=1 runs this part alone.
 * bf16, D = 128, 32 query heads, 8 KV heads (GQA 4:1), no mask and causal (bottom-right). Prints
 * "no GPU: skipped" and exits 0 without a GPU. FA_BENCH_TSV=path appends one line per row.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu_infer.h"
#include "fa_ksettings.h"

#define NSEQ 16
#define HQ 32
#define HKV 8
#define HD 128

static struct fa_gpu *g;
static FILE *tsv;
static CUdeviceptr dq, dk, dv, dout, dlse, dix;

static int fill(CUdeviceptr p, size_t bytes)
{
	uint16_t *h = malloc(bytes);
	uint64_t x = 0x2545F4914F6CDD1Dull;
	for (size_t i = 0; i < bytes / 2; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		float f = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
		uint32_t u;
		memcpy(&u, &f, 4);
		h[i] = (uint16_t)(u >> 16); /* bf16 */
	}
	char err[256];
	fa_status st = fa_gpu_upload(g, p, h, bytes, err, sizeof err);
	free(h);
	if (st)
		fprintf(stderr, "upload: %s\n", err);
	return st ? -1 : 0;
}

typedef fa_status (*launch_fn)(const void *ctx, char *err, size_t errlen);

/* Median milliseconds of 15 timed launches after 3 untimed ones; -1 on failure. */
static double time_it(launch_fn fn, const void *ctx, char *err, size_t errlen)
{
	float ms[15];
	for (int i = 0; i < 3; i++)
		if (fn(ctx, err, errlen))
			return -1;
	if (fa_gpu_sync(g, err, errlen))
		return -1;
	for (int i = 0; i < 15; i++) {
		struct fa_gpu_timer *t;
		if (fa_gpu_timer_start(g, NULL, &t, err, errlen) || fn(ctx, err, errlen) ||
		    fa_gpu_timer_stop(g, t, NULL, &ms[i], err, errlen))
			return -1;
	}
	for (int i = 1; i < 15; i++)
		for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) {
			float y = ms[j];
			ms[j] = ms[j - 1];
			ms[j - 1] = y;
		}
	return ms[7];
}

static fa_status run_dense(const void *ctx, char *err, size_t errlen)
{
	return fa_gpu_attn_fwd(g, ctx, dq, dk, dv, dout, dlse, NULL, err, errlen);
}

struct infer_ctx {
	struct fa_attn_infer_desc d;
	struct fa_gpu_infer_index ix;
};

static fa_status run_infer(const void *ctx, char *err, size_t errlen)
{
	const struct infer_ctx *c = ctx;
	return fa_gpu_fwd_infer(g, &c->d, &c->ix, dq, dk, dv, dout, dlse, NULL, err, errlen);
}

/* BSHD strides of [B, S, H, D]. */
static void bshd(int64_t *st, int64_t S, int64_t H)
{
	st[0] = S * H * HD;
	st[1] = H * HD;
	st[2] = HD;
}

static void base_desc(struct fa_attn_fwd_desc *f, fa_mask m, int64_t B, int64_t Sq, int64_t Sk)
{
	memset(f, 0, sizeof *f);
	f->dtype = FA_DTYPE_BF16;
	f->mask = m;
	f->scale = 1.0 / sqrt((double)HD);
	f->B = B;
	f->Sq = Sq;
	f->Sk = Sk;
	f->Hq = HQ;
	f->Hkv = HKV;
	f->D = HD;
	bshd(f->q_stride, Sq, HQ);
	memcpy(f->o_stride, f->q_stride, sizeof f->q_stride);
	bshd(f->k_stride, Sk, HKV);
	memcpy(f->v_stride, f->k_stride, sizeof f->k_stride);
	f->lse_stride[0] = HQ * Sq;
	f->lse_stride[1] = Sq;
	f->lse_stride[2] = 1;
}

/* Score pairs f's mask and window leave of one sequence of sq x sk. */
static double pairs_of(const struct fa_attn_fwd_desc *f, int64_t sq, int64_t sk)
{
	double n = 0;
	for (int64_t i = 0; i < sq; i++) {
		int64_t lo, hi;
		fa_attn_key_range(f, sq, sk, i, &lo, &hi);
		n += (double)(hi - lo);
	}
	return n;
}

/* Shuffled pages of ps tokens for nseq sequences of nk keys: the table [nseq][nk / ps]. */
static int32_t *shuffled_pages(int64_t nseq, int64_t nk, int64_t ps)
{
	const int64_t pages = nseq * (nk / ps);
	int32_t *pt = malloc(sizeof(int32_t) * (size_t)pages);
	for (int64_t i = 0; i < pages; i++)
		pt[i] = (int32_t)i;
	uint64_t y = 12345;
	for (int64_t i = pages - 1; i > 0; i--) {
		y = y * 6364136223846793005ull + 1442695040888963407ull;
		int64_t j = (int64_t)((y >> 33) % (uint64_t)(i + 1));
		int32_t t = pt[i];
		pt[i] = pt[j];
		pt[j] = t;
	}
	return pt;
}

/* Score pairs a mask leaves of an sq x sk problem (bottom-right causal). */
static double pairs(fa_mask m, int64_t sq, int64_t sk)
{
	if (m == FA_MASK_NONE)
		return (double)sq * sk;
	double n = 0;
	for (int64_t i = 0; i < sq; i++) {
		int64_t hi = i + sk - sq + 1;
		n += hi < 0 ? 0 : hi > sk ? sk : hi;
	}
	return n;
}

static void row(const char *what, fa_mask m, double ms, double work, const char *extra)
{
	double tf = 4.0 * HQ * HD * work / ms / 1e9;
	printf("%-44s %-7s %9.3f ms %7.1f TFLOP/s%s\n", what, m ? "causal" : "", ms, tf, extra);
	fflush(stdout);
	if (tsv)
		fprintf(tsv, "%s\t%s\t%.4f\t%.2f\n", what, m ? "causal" : "none", ms, tf);
}

int main(void)
{
	char err[1024];
	struct fa_kernel_settings ks;
	fa_test_kernel_settings(&ks);
	if (fa_gpu_open(&g, 0, &ks, err, sizeof err) != FA_OK) {
		printf("no GPU: skipped (%s)\n", err);
		return 0;
	}
	const char *tp = getenv("FA_BENCH_TSV");
	if (tp)
		tsv = fopen(tp, "a");
	printf("GPU %s sm_%d; bf16 D=%d, %d query heads, %d KV heads\n", fa_gpu_name(g), fa_gpu_sm(g),
	       HD, HQ, HKV);
	/* the lengths: fixed, so every run times the same batch */
	int32_t len[NSEQ], cu[NSEQ + 1];
	uint64_t x = 0x9e3779b97f4a7c15ull;
	cu[0] = 0;
	for (int b = 0; b < NSEQ; b++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		len[b] = 1 + (int32_t)((x >> 33) % 4096);
		cu[b + 1] = cu[b] + len[b];
	}
	const int64_t T = cu[NSEQ], S = (T + NSEQ - 1) / NSEQ;
	printf("lengths:");
	for (int b = 0; b < NSEQ; b++)
		printf(" %d", len[b]);
	printf(" (%lld tokens; dense equivalent B=%d S=%lld)\n", (long long)T, NSEQ, (long long)S);
	/* buffers: the padded dense batch is the largest (16 x 4096 rows) */
	const size_t rows = (size_t)NSEQ * 4096 + 64;
	const size_t qb = rows * HQ * HD * 2, kb = rows * HKV * HD * 2;
	if (fa_gpu_alloc(g, qb, &dq, err, sizeof err) || fa_gpu_alloc(g, kb, &dk, err, sizeof err) ||
	    fa_gpu_alloc(g, kb, &dv, err, sizeof err) || fa_gpu_alloc(g, qb, &dout, err, sizeof err) ||
	    fa_gpu_alloc(g, rows * HQ * 4, &dlse, err, sizeof err) ||
	    fa_gpu_alloc(g, 1 << 20, &dix, err, sizeof err) || fill(dq, qb) || fill(dk, kb) ||
	    fill(dv, kb)) {
		printf("setup: %s\n", err);
		return 1;
	}
	const char *wo = getenv("FA_BENCH_WINDOW_ONLY");
	const int parts12 = wo && strcmp(wo, "1") == 0 ? 0 : 2; /* masks of parts 1 and 2 */
	for (int mi = 0; mi < parts12; mi++) {
		const fa_mask m = mi ? FA_MASK_CAUSAL_BOTTOM_RIGHT : FA_MASK_NONE;
		double wv = 0;
		for (int b = 0; b < NSEQ; b++)
			wv += pairs(m, len[b], len[b]);
		/* varlen */
		struct infer_ctx c;
		memset(&c, 0, sizeof c);
		base_desc(&c.d.fwd, m, NSEQ, 4096, 4096);
		bshd(c.d.fwd.q_stride, T, HQ);
		memcpy(c.d.fwd.o_stride, c.d.fwd.q_stride, sizeof c.d.fwd.q_stride);
		bshd(c.d.fwd.k_stride, T, HKV);
		memcpy(c.d.fwd.v_stride, c.d.fwd.k_stride, sizeof c.d.fwd.k_stride);
		c.d.fwd.lse_stride[0] = HQ * T;
		c.d.fwd.lse_stride[1] = T;
		c.d.cu_q = cu;
		c.d.total_q = T;
		c.d.kv = FA_KV_PACKED;
		c.d.cu_k = cu;
		c.d.total_k = T;
		c.ix.cu_q = c.ix.cu_k = dix;
		if (fa_gpu_upload(g, dix, cu, sizeof cu, err, sizeof err))
			return 1;
		double tv = time_it(run_infer, &c, err, sizeof err);
		if (tv < 0) {
			printf("varlen: %s\n", err);
			return 1;
		}
		row("varlen 16 seqs (packed q, k, v)", m, tv, wv, "");
		/* the same tokens as one dense batch of equal lengths */
		struct fa_attn_fwd_desc f;
		base_desc(&f, m, NSEQ, S, S);
		double wd = NSEQ * pairs(m, S, S);
		double td = time_it(run_dense, &f, err, sizeof err);
		struct fa_tile t;
		int n = 0;
		char tb[48] = "";
		if (fa_gpu_plan(g, &f, &t, 1, &n, err, sizeof err) == FA_OK)
			fa_tile_format(&t, tb, sizeof tb);
		char ex[160];
		snprintf(ex, sizeof ex, "  (%s)", tb);
		row("dense B=16 equal lengths (same tokens)", m, td, wd, ex);
		/* the same dense batch through the inference path (a cache of equal lengths) */
		struct infer_ctx e;
		memset(&e, 0, sizeof e);
		e.d.fwd = f;
		e.d.kv = FA_KV_CACHE;
		int32_t eq[NSEQ];
		for (int b = 0; b < NSEQ; b++)
			eq[b] = (int32_t)S;
		e.d.seqlens_k = eq;
		e.d.cache_rows = S;
		e.ix.seqlens_k = dix + 4096;
		if (fa_gpu_upload(g, dix + 4096, eq, sizeof eq, err, sizeof err))
			return 1;
		double te = time_it(run_infer, &e, err, sizeof err);
		row("dense B=16 equal lengths, inference path", m, te, wd, "");
		base_desc(&f, m, NSEQ, 4096, 4096);
		double tpad = time_it(run_dense, &f, err, sizeof err);
		row("dense B=16 padded to 4096", m, tpad, NSEQ * pairs(m, 4096, 4096), "");
		printf("  varlen / dense same tokens: time %.3f, per score pair %.3f (target: time <= "
		       "1.10); varlen / padded: time %.3f\n",
		       tv / td, (tv / wv) / (td / wd), tv / tpad);
		if (tsv)
			fprintf(tsv, "ratio\t%s\t%.4f\t%.4f\n", m ? "causal" : "none", tv / td,
			        (tv / wv) / (td / wd));
	}
	/* paged vs contiguous: chunked prefill, 512 new queries against 4096 keys each */
	const int64_t NQ = 512, NK = 4096;
	for (int mi = 0; mi < parts12; mi++) {
		const fa_mask m = mi ? FA_MASK_CAUSAL_BOTTOM_RIGHT : FA_MASK_NONE;
		const double w = NSEQ * pairs(m, NQ, NK);
		struct infer_ctx c;
		memset(&c, 0, sizeof c);
		base_desc(&c.d.fwd, m, NSEQ, NQ, NK);
		int32_t sl[NSEQ];
		for (int b = 0; b < NSEQ; b++)
			sl[b] = (int32_t)NK;
		c.d.kv = FA_KV_CACHE;
		c.d.seqlens_k = sl;
		c.d.cache_rows = NK;
		c.ix.seqlens_k = dix;
		if (fa_gpu_upload(g, dix, sl, sizeof sl, err, sizeof err))
			return 1;
		double tc = time_it(run_infer, &c, err, sizeof err);
		if (tc < 0) {
			printf("contiguous: %s\n", err);
			return 1;
		}
		row("chunked prefill 16 x 512 q / 4096 k, contiguous", m, tc, w, "");
		const int psz[] = {16, 64, 256};
		for (int pi = 0; pi < 3; pi++) {
			const int64_t ps = psz[pi], cols = NK / ps, pages = NSEQ * cols;
			int32_t *pt = shuffled_pages(NSEQ, NK, ps);
			struct infer_ctx p = c;
			p.d.kv = FA_KV_PAGED;
			p.d.cache_rows = 0;
			p.d.page_table = pt;
			p.d.pt_cols = cols;
			p.d.pages = pages;
			p.d.page_size = ps;
			bshd(p.d.fwd.k_stride, ps, HKV);
			memcpy(p.d.fwd.v_stride, p.d.fwd.k_stride, sizeof p.d.fwd.k_stride);
			p.ix.page_table = dix + 4096;
			if (fa_gpu_upload(g, dix + 4096, pt, sizeof(int32_t) * (size_t)pages, err,
			                  sizeof err))
				return 1;
			double tpg = time_it(run_infer, &p, err, sizeof err);
			char what[64], ex[64];
			snprintf(what, sizeof what, "  paged, pages of %d (shuffled)", psz[pi]);
			snprintf(ex, sizeof ex, "  (%.3fx contiguous)", tpg / tc);
			if (tpg < 0)
				printf("%s: %s\n", what, err);
			else
				row(what, m, tpg, w, ex);
			free(pt);
		}
	}
	/* a sliding window over a long cache: 4 x 512 new queries against 16384 keys, causal with
	 * and without the window (4095, 0), contiguous and paged; then the window's keys alone */
	{
		const int64_t WB = 4, WQ = 512, WK = 16384;
		int32_t sl[4] = {WK, WK, WK, WK};
		if (fa_gpu_upload(g, dix, sl, sizeof sl, err, sizeof err))
			return 1;
		double tref = 0;
		{
			struct infer_ctx c;
			memset(&c, 0, sizeof c);
			base_desc(&c.d.fwd, FA_MASK_CAUSAL_BOTTOM_RIGHT, WB, WQ, 4096);
			int32_t s4[4] = {4096, 4096, 4096, 4096};
			c.d.kv = FA_KV_CACHE;
			c.d.seqlens_k = s4;
			c.d.cache_rows = 4096;
			c.ix.seqlens_k = dix + 64;
			if (fa_gpu_upload(g, dix + 64, s4, sizeof s4, err, sizeof err))
				return 1;
			tref = time_it(run_infer, &c, err, sizeof err);
			if (tref < 0)
				printf("window reference: %s\n", err);
			else
				row("window: 4 x 512 q / 4096 k, contiguous (its keys)", FA_MASK_CAUSAL_BOTTOM_RIGHT,
				    tref, WB * pairs_of(&c.d.fwd, WQ, 4096), "");
		}
		static const int wps[] = {0, 16, 256};
		for (int pi = 0; pi < 3; pi++)
			for (int w = 0; w < 2; w++) {
				struct infer_ctx c;
				memset(&c, 0, sizeof c);
				base_desc(&c.d.fwd, FA_MASK_CAUSAL_BOTTOM_RIGHT, WB, WQ, WK);
				c.d.fwd.window = w == 1;
				c.d.fwd.window_left = 4095;
				c.d.fwd.window_right = 0;
				c.d.seqlens_k = sl;
				c.ix.seqlens_k = dix;
				int32_t *pt = NULL;
				if (wps[pi] == 0) {
					c.d.kv = FA_KV_CACHE;
					c.d.cache_rows = WK;
				} else {
					pt = shuffled_pages(WB, WK, wps[pi]);
					c.d.kv = FA_KV_PAGED;
					c.d.page_table = pt;
					c.d.pt_cols = WK / wps[pi];
					c.d.pages = WB * c.d.pt_cols;
					c.d.page_size = wps[pi];
					bshd(c.d.fwd.k_stride, wps[pi], HKV);
					memcpy(c.d.fwd.v_stride, c.d.fwd.k_stride, sizeof c.d.fwd.k_stride);
					c.ix.page_table = dix + 4096;
					if (fa_gpu_upload(g, dix + 4096, pt, sizeof(int32_t) * (size_t)c.d.pages,
					                  err, sizeof err))
						return 1;
				}
				double t = time_it(run_infer, &c, err, sizeof err);
				char what[80], ex[96] = "";
				snprintf(what, sizeof what, "window: 4 x 512 q / 16384 k, %s%s%s",
				         wps[pi] ? "paged " : "contiguous", wps[pi] ? (wps[pi] == 16 ? "16" : "256") : "",
				         w ? ", window 4096" : "");
				if (w && tref > 0)
					snprintf(ex, sizeof ex, "  (%.3fx the window's keys alone)", t / tref);
				if (t < 0)
					printf("%s: %s\n", what, err);
				else
					row(what, FA_MASK_CAUSAL_BOTTOM_RIGHT, t, WB * pairs_of(&c.d.fwd, WQ, WK), ex);
				free(pt);
			}
	}
	if (tsv)
		fclose(tsv);
	fa_gpu_free(g, dq);
	fa_gpu_free(g, dk);
	fa_gpu_free(g, dv);
	fa_gpu_free(g, dout);
	fa_gpu_free(g, dlse);
	fa_gpu_free(g, dix);
	fa_gpu_close(g);
	return 0;
}
