/* bench_attn_bwd.c - forward + backward TFLOP/s through the launch APIs (fa_gpu_attn_fwd,
 * fa_gpu_attn_bwd), timed with CUDA events. Flops: the forward 4*B*H*S^2*D (halved when causal),
 * the backward 2.5x the forward (FlashAttention's convention: five matrix products against two),
 * so forward + backward = 3.5x the forward's flops over the sum of both times. The shapes
 * (kernels/RESULTS.md): B*S = 32k tokens, 16 heads, S = 4096, BHSD layout, random inputs; the
 * PyTorch anchors of the same run come from tools/sdpa_bwd_anchors.py. Then issue 11's window
 * rows (rows 11-13: bf16 D=128 S=16k, full causal, window (4095, 0), the window with softcap 30;
 * flops by visible pairs) and the window's backward time over dense 4k's (row 0) and full
 * causal 16k's; rows 14-16: bf16 D=256 causal, fp16 D=256, bf16 D=192 (the wgmma backward's
 * wide form; swept with FA_BENCH_SWEEP like rows 0-3); rows 17-20: the window and softcap on
 * the wgmma backward (bf16 D=128 S=4096: window (1023, 0), softcap 30, both; bf16 D=256 both),
 * swept too, with the deterministic mode's time per tile.
 * A sweep times attn_bwd.cu's first tile too where the first FA_BENCH_SWEEP_N are all the
 * wgmma backward's (the comparison of the two kernels in one run); rows 21-23: fp32 3xtf32
 * and tf32 D=64, tf32 D=128 causal (the fp32 wgmma backward's; every fp32 row is swept).
 *
 * Prints "no GPU: skipped" and exits 0 without a GPU. Environment:
 *   FA_BENCH_SWEEP=1   also time the backward's first FA_BENCH_SWEEP_N (6) planner candidates of
 *                      the headline shapes (tuning data for planner_bwd.c)
 *   FA_BENCH_TSV=path  append one tab-separated line per measurement
 *   FA_BENCH_SHAPES=0,5  time only these rows of the shape table (indices)
 *   FA_BENCH_ERR_DIR=dir  first, the error against float64 on the inputs tools/sdpa_bwd_anchors.py
 *                      wrote there (FA_ERR_DUMP): dir/cases.txt lists "name dtype D S causal B H",
 *                      dir/name.{q,k,v,g}.f32 the inputs (BHSD, fp32 values of the dtype),
 *                      dir/name.{dq,dk,dv}.f64 the float64 gradients; one "err" line per case
 *                      and precision, beside the anchors' SDPA errors on the same inputs;
 *                      FA_BENCH_ERR_ONLY=substring keeps the cases whose name contains it;
 *                      where the dump has name.{o,lse}.f64, a "fwd" line first: the forward's
 *                      O (relative Frobenius) and lse (rms, mean; natural units) errors;
 *                      FA_BENCH_ERR_FWD=1: those alone, no backward; FA_BENCH_ERR_X3=1:
 *                      the fp32 cases at 3xtf32 only
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu.h"
#include "fa_gpu_bwd.h"
#include "fa_ksettings.h"

static struct fa_gpu *g;
static FILE *tsv;

struct shape {
	fa_dtype dt;
	fa_precision prec;
	int D, S, causal;
	int fwd_only;
	int win, wl, wr; /* a sliding window (fa_attn.h) */
	double cap;      /* softcap, 0: off */
};

/* The last run_shape's times (ms; -1 where it failed): the window rows' ratios. */
static float last_fwd, last_bwd, last_det;

static const char *label(const struct shape *s)
{
	static char b[32];
	if (s->dt == FA_DTYPE_BF16)
		return "bf16";
	if (s->dt == FA_DTYPE_FP16)
		return "fp16";
	snprintf(b, sizeof b, "fp32-%s", fa_prec_name(fa_prec_resolve(s->dt, s->prec)));
	return b;
}

static void make_desc(const struct shape *s, struct fa_attn_bwd_desc *bd)
{
	memset(bd, 0, sizeof *bd);
	struct fa_attn_fwd_desc *d = &bd->fwd;
	int64_t B = 32768 / s->S, H = 16, S = s->S, D = s->D;
	if (B < 1)
		B = 1;
	d->dtype = s->dt;
	d->precision = s->prec;
	d->mask = s->causal ? FA_MASK_CAUSAL_TOP_LEFT : FA_MASK_NONE;
	d->scale = 1.0 / sqrt((double)D);
	d->B = B;
	d->Sq = d->Sk = S;
	d->Hq = d->Hkv = H;
	d->D = D;
	int64_t st[3] = {H * S * D, D, S * D};
	memcpy(d->q_stride, st, sizeof st);
	memcpy(d->k_stride, st, sizeof st);
	memcpy(d->v_stride, st, sizeof st);
	memcpy(d->o_stride, st, sizeof st);
	memcpy(bd->do_stride, st, sizeof st);
	memcpy(bd->dq_stride, st, sizeof st);
	memcpy(bd->dk_stride, st, sizeof st);
	memcpy(bd->dv_stride, st, sizeof st);
	d->lse_stride[0] = H * S;
	d->lse_stride[1] = S;
	d->lse_stride[2] = 1;
	d->window = s->win != 0;
	d->window_left = s->wl;
	d->window_right = s->wr;
	d->softcap = s->cap;
}

/* The forward's flops: 4 D per visible (query, key) pair; causal without a window as 0.5 S^2
 * (the convention the anchors use), a window by its exact pairs (fa_attn_key_range). */
static double fwd_flops(const struct fa_attn_bwd_desc *bd, const struct shape *s)
{
	const struct fa_attn_fwd_desc *d = &bd->fwd;
	double pairs = (double)d->Sq * d->Sk * (s->causal ? 0.5 : 1.0);
	if (s->win) {
		pairs = 0;
		for (int64_t i = 0; i < d->Sq; i++) {
			int64_t lo, hi;
			fa_attn_key_range(d, d->Sq, d->Sk, i, &lo, &hi);
			pairs += (double)(hi - lo);
		}
	}
	return 4.0 * d->B * d->Hq * pairs * d->D;
}

static const char *shape_ext(const struct shape *s)
{
	static char b[64];
	b[0] = 0;
	if (s->win)
		snprintf(b, sizeof b, " window (%d, %d)%s", s->wl, s->wr, s->cap > 0 ? " cap" : "");
	else if (s->cap > 0)
		snprintf(b, sizeof b, " softcap");
	return b;
}

static int cmpf(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/* Median of 5 timed runs after one warm-up; kind 0 forward, 1 backward, 2 deterministic. */
static float time_it(const struct fa_attn_bwd_desc *d, const struct fa_gpu_bwd_ptrs *p, int kind,
                     const struct fa_tile *tile, char *err, size_t errlen)
{
	float t[5];
	for (int r = -1; r < 5; r++) {
		struct fa_gpu_timer *tm;
		if (fa_gpu_timer_start(g, NULL, &tm, err, errlen))
			return -1;
		fa_status st = kind == 0
		    ? fa_gpu_attn_fwd(g, &d->fwd, p->q, p->k, p->v, p->o, p->lse, NULL, err, errlen)
		    : fa_gpu_attn_bwd_tile(g, d, tile, p, kind == 2 ? FA_GPU_BWD_DETERMINISTIC : 0,
		                           NULL, err, errlen);
		float ms = 0;
		fa_status s2 = fa_gpu_timer_stop(g, tm, NULL, &ms, err, errlen);
		if (st || s2)
			return -1;
		if (r >= 0)
			t[r] = ms;
	}
	qsort(t, 5, sizeof t[0], cmpf);
	return t[2];
}

static void fill(CUdeviceptr p, size_t bytes, fa_dtype dt)
{
	/* small random values: a host buffer of 1 MiB repeated */
	static unsigned char *h;
	static fa_dtype hdt = 0;
	const size_t chunk = 1 << 20;
	if (!h)
		h = malloc(chunk);
	if (hdt != dt) {
		uint64_t x = 0x12345678;
		for (size_t i = 0; i < chunk / 4; i++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			double v = ((double)(x >> 11) / 9007199254740992.0) * 2 - 1;
			if (dt == FA_DTYPE_FP32) {
				float f = (float)v;
				memcpy(h + 4 * i, &f, 4);
			} else {
				fa_store_elem(h, dt, (int64_t)(2 * i), v);
				fa_store_elem(h, dt, (int64_t)(2 * i + 1), -v * 0.5);
			}
		}
		hdt = dt;
	}
	char err[256];
	for (size_t o = 0; o < bytes; o += chunk)
		fa_gpu_upload(g, p + o, h, bytes - o < chunk ? bytes - o : chunk, err, sizeof err);
}

static void run_shape(const struct shape *s, bool sweep)
{
	last_fwd = last_bwd = last_det = -1;
	struct fa_attn_bwd_desc d;
	make_desc(s, &d);
	const size_t es = fa_dtype_size(s->dt);
	const size_t n = (size_t)(d.fwd.B * d.fwd.Sq * d.fwd.Hq * d.fwd.D) * es;
	const size_t nl = (size_t)(d.fwd.B * d.fwd.Hq * d.fwd.Sq) * 4;
	char err[2048];
	CUdeviceptr b[9] = {0};
	for (int i = 0; i < 9; i++)
		if (fa_gpu_alloc(g, i == 5 ? nl : n, &b[i], err, sizeof err)) {
			printf("%s: %s\n", label(s), err);
			goto out;
		}
	struct fa_gpu_bwd_ptrs p = {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8]};
	fill(b[0], n, s->dt);
	fill(b[1], n, s->dt);
	fill(b[2], n, s->dt);
	fill(b[4], n, s->dt);
	const double fl = fwd_flops(&d, s);
	float tf = time_it(&d, &p, 0, NULL, err, sizeof err);
	if (tf < 0) {
		printf("%-12s D=%3d S=%d%s forward: %s\n", label(s), s->D, s->S,
		       s->causal ? " causal" : "", err);
		goto out;
	}
	if (s->fwd_only) {
		printf("%-12s D=%3d S=%d%-7s forward alone %8.3f ms %7.1f TFLOP/s\n", label(s), s->D,
		       s->S, s->causal ? " causal" : "", tf, fl / tf / 1e9);
		if (tsv)
			fprintf(tsv, "fwd\t%s\t%d\t%d\t%d\t-\t%.4f\t%.2f\n", label(s), s->D, s->S, s->causal,
			        tf, fl / tf / 1e9);
		goto out;
	}
	struct fa_tile t;
	int nt = 0;
	if (fa_gpu_plan_bwd(g, &d, &t, 1, &nt, err, sizeof err)) {
		printf("%s: %s\n", label(s), err);
		goto out;
	}
	float tb = time_it(&d, &p, 1, NULL, err, sizeof err);
	float td = time_it(&d, &p, 2, NULL, err, sizeof err);
	char tn[48];
	fa_tile_format(&t, tn, sizeof tn);
	if (tb < 0 || td < 0) {
		printf("%-12s D=%3d S=%d%s backward: %s\n", label(s), s->D, s->S,
		       s->causal ? " causal" : "", err);
		goto out;
	}
	last_fwd = tf;
	last_bwd = tb;
	last_det = td;
	printf("%-12s D=%3d S=%d%-7s%s %-16s fwd %7.3f ms bwd %7.3f ms (det %7.3f ms, %+.0f%%)  "
	       "fwd+bwd %7.1f TFLOP/s  bwd %7.1f  fwd %7.1f\n", label(s), s->D, s->S,
	       s->causal ? " causal" : "", shape_ext(s), tn, tf, tb, td, 100.0 * (td - tb) / tb,
	       3.5 * fl / (tf + tb) / 1e9, 2.5 * fl / tb / 1e9, fl / tf / 1e9);
	if (tsv)
		fprintf(tsv, "fwdbwd\t%s%s\t%d\t%d\t%d\t%s\t%.4f\t%.4f\t%.4f\t%.2f\n", label(s),
		        shape_ext(s), s->D, s->S, s->causal, tn, tf, tb, td, 3.5 * fl / (tf + tb) / 1e9);
	fflush(stdout);
	if (sweep) {
		struct fa_tile c[FA_PLAN_MAX_CANDIDATES];
		int nc = 0;
		const char *sn = getenv("FA_BENCH_SWEEP_N");
		int lim = sn ? atoi(sn) : 6;
		if (fa_gpu_plan_bwd(g, &d, c, FA_PLAN_MAX_CANDIDATES, &nc, err, sizeof err) == FA_OK)
			for (int i = 0, mma = 0; i < nc && (i < lim || !mma); i++) {
				/* past the first lim: only attn_bwd.cu's first tile, if none came before */
				if (i >= lim && c[i].path == FA_KPATH_BWDWG16)
					continue;
				mma |= c[i].path != FA_KPATH_BWDWG16;
				float x = time_it(&d, &p, 1, &c[i], err, sizeof err);
				/* the window and softcap rows: the deterministic mode per tile too */
				float xd = s->win || s->cap > 0 ? time_it(&d, &p, 2, &c[i], err, sizeof err)
				                                : -1;
				fa_tile_format(&c[i], tn, sizeof tn);
				printf("    sweep %-16s smem %6zu est regs %3d  bwd %7.3f ms %7.1f TFLOP/s",
				       tn, c[i].smem, c[i].regs, x, x > 0 ? 2.5 * fl / x / 1e9 : 0.0);
				if (xd > 0)
					printf("  det %7.3f ms %7.1f TFLOP/s", xd, 2.5 * fl / xd / 1e9);
				printf("\n");
				if (tsv)
					fprintf(tsv, "sweep\t%s%s\t%d\t%d\t%d\t%s\t%.4f\t%.4f\n", label(s),
					        shape_ext(s), s->D, s->S, s->causal, tn, x, xd);
			}
	}
out:
	for (int i = 0; i < 9; i++)
		fa_gpu_free(g, b[i]);
}

static void *read_file(const char *dir, const char *name, const char *ext, size_t bytes)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
	FILE *f = fopen(path, "rb");
	void *b = malloc(bytes);
	if (!f || !b || fread(b, 1, bytes, f) != bytes) {
		printf("err %s: cannot read %zu bytes of %s\n", name, bytes, path);
		if (f)
			fclose(f);
		free(b);
		return NULL;
	}
	fclose(f);
	return b;
}

/* FA_BENCH_ERR_FWD=1: the forward's errors alone (no backward); FA_BENCH_ERR_X3=1: the fp32
 * cases at 3xtf32 alone (no ieee run: variants of the 3xtf32 kernels) */
static bool fwd_only, x3_only;

/* The forward's own errors on a dumped case, where the dump has name.{o,lse}.f64 (float64 O and
 * natural lse): O's relative Frobenius error, the lse's rms and mean error (the lse is what the
 * backward's P is recomputed from, so a bias in it scales every gradient). Returns nonzero
 * when a download failed. */
static int fwd_errors(const char *dir, const char *name, fa_dtype dt,
                      const struct fa_gpu_bwd_ptrs *p, size_t n, size_t nrows, const char *pn,
                      void *host)
{
	char path[1024], err[512];
	snprintf(path, sizeof path, "%s/%s.lse.f64", dir, name);
	FILE *probe = fopen(path, "rb");
	if (!probe)
		return 0; /* an older dump: no forward reference */
	fclose(probe);
	double *o64 = read_file(dir, name, "o.f64", n * 8), *l64 = read_file(dir, name, "lse.f64",
	                                                                      nrows * 8);
	float *lse = malloc(nrows * 4);
	int rc = -1;
	if (!o64 || !l64 || !lse)
		goto out;
	if (fa_gpu_download(g, host, p->o, n * fa_dtype_size(dt), err, sizeof err) ||
	    fa_gpu_download(g, lse, p->lse, nrows * 4, err, sizeof err)) {
		printf("err %s: %s\n", name, err);
		goto out;
	}
	double num = 0, den = 0, l2 = 0, l1 = 0;
	for (size_t e = 0; e < n; e++) {
		const double x = fa_load_elem(host, dt, (int64_t)e) - o64[e];
		num += x * x;
		den += o64[e] * o64[e];
	}
	for (size_t r = 0; r < nrows; r++) {
		const double x = (double)lse[r] - l64[r];
		l2 += x * x;
		l1 += x;
	}
	printf("fwd %-22s %-16s ours  O %.3g lse rms %.3g mean %+.3g\n", name, pn,
	       den > 0 ? sqrt(num / den) : 0, sqrt(l2 / nrows), l1 / nrows);
	if (tsv)
		fprintf(tsv, "fwderr\t%s\t%s\t%.4g\t%.4g\t%.4g\n", name, pn,
		        den > 0 ? sqrt(num / den) : 0, sqrt(l2 / nrows), l1 / nrows);
	rc = 0;
out:
	free(o64);
	free(l64);
	free(lse);
	return rc;
}

/* One dumped case at one precision: our forward + backward, the relative Frobenius error of
 * dQ, dK, dV against the float64 gradients (all elements); the forward's (fwd_errors) first. */
static void err_case(const char *dir, const char *name, fa_dtype dt, fa_precision prec,
                     fa_precision fwd_prec, int D, int S, int causal, int B, int H)
{
	struct fa_attn_bwd_desc d;
	memset(&d, 0, sizeof d);
	struct fa_attn_fwd_desc *f = &d.fwd;
	f->dtype = dt;
	f->precision = prec;
	f->mask = causal ? FA_MASK_CAUSAL_TOP_LEFT : FA_MASK_NONE;
	f->scale = 1.0 / sqrt((double)D);
	f->B = B;
	f->Sq = f->Sk = S;
	f->Hq = f->Hkv = H;
	f->D = D;
	int64_t st[3] = {(int64_t)H * S * D, D, (int64_t)S * D};
	memcpy(f->q_stride, st, sizeof st);
	memcpy(f->k_stride, st, sizeof st);
	memcpy(f->v_stride, st, sizeof st);
	memcpy(f->o_stride, st, sizeof st);
	memcpy(d.do_stride, st, sizeof st);
	memcpy(d.dq_stride, st, sizeof st);
	memcpy(d.dk_stride, st, sizeof st);
	memcpy(d.dv_stride, st, sizeof st);
	f->lse_stride[0] = (int64_t)H * S;
	f->lse_stride[1] = S;
	f->lse_stride[2] = 1;
	const size_t n = (size_t)B * H * S * D, es = fa_dtype_size(dt);
	float *in[4] = {0};
	double *ref[3] = {0};
	void *host = malloc(n * 8);
	static const char *ie[4] = {"q.f32", "k.f32", "v.f32", "g.f32"};
	static const char *re[3] = {"dq.f64", "dk.f64", "dv.f64"};
	CUdeviceptr b[9] = {0};
	char err[2048];
	for (int i = 0; i < 4; i++)
		if (!(in[i] = read_file(dir, name, ie[i], n * 4)))
			goto out;
	for (int i = 0; i < 3; i++)
		if (!(ref[i] = read_file(dir, name, re[i], n * 8)))
			goto out;
	for (int i = 0; i < 9; i++)
		if (fa_gpu_alloc(g, i == 5 ? (size_t)B * H * S * 4 : n * es, &b[i], err, sizeof err)) {
			printf("err %s: %s\n", name, err);
			goto out;
		}
	static const int slot[4] = {0, 1, 2, 4}; /* q, k, v, dO */
	for (int i = 0; i < 4; i++) {
		for (size_t e = 0; e < n; e++)
			fa_store_elem(host, dt, (int64_t)e, in[i][e]);
		if (fa_gpu_upload(g, b[slot[i]], host, n * es, err, sizeof err))
			goto fail;
	}
	struct fa_gpu_bwd_ptrs p = {b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8]};
	struct fa_attn_fwd_desc ff = *f; /* the forward's own precision (fwd_prec) */
	ff.precision = fwd_prec;
	if (fa_gpu_attn_fwd(g, &ff, p.q, p.k, p.v, p.o, p.lse, NULL, err, sizeof err) ||
	    fa_gpu_sync(g, err, sizeof err))
		goto fail;
	char pn[40];
	const bool f32 = dt == FA_DTYPE_FP32, other = fwd_prec != prec;
	snprintf(pn, sizeof pn, "%s%s%s", f32 ? fa_prec_name(fa_prec_resolve(dt, prec)) : "-",
	         other ? "/fwd-" : "", other ? fa_prec_name(fa_prec_resolve(dt, fwd_prec)) : "");
	if (!other && fwd_errors(dir, name, dt, &p, n, (size_t)B * H * S, pn, host))
		goto fail;
	if (fwd_only)
		goto out;
	if (fa_gpu_attn_bwd(g, &d, &p, 0, NULL, err, sizeof err) || fa_gpu_sync(g, err, sizeof err))
		goto fail;
	double rel[3];
	for (int w = 0; w < 3; w++) {
		if (fa_gpu_download(g, host, b[6 + w], n * es, err, sizeof err))
			goto fail;
		double num = 0, den = 0;
		for (size_t e = 0; e < n; e++) {
			double x = fa_load_elem(host, dt, (int64_t)e) - ref[w][e];
			num += x * x;
			den += ref[w][e] * ref[w][e];
		}
		rel[w] = den > 0 ? sqrt(num / den) : 0;
	}
	printf("err %-22s %-16s ours  dQ %.3g dK %.3g dV %.3g\n", name, pn, rel[0], rel[1], rel[2]);
	if (tsv)
		fprintf(tsv, "err\t%s\t%s\t%.4g\t%.4g\t%.4g\n", name, pn, rel[0], rel[1], rel[2]);
	goto out;
fail:
	printf("err %s: %s\n", name, err);
out:
	fflush(stdout);
	for (int i = 0; i < 9; i++)
		fa_gpu_free(g, b[i]);
	for (int i = 0; i < 4; i++)
		free(in[i]);
	for (int i = 0; i < 3; i++)
		free(ref[i]);
	free(host);
}

static void err_cases(const char *dir)
{
	char path[1024], line[256];
	snprintf(path, sizeof path, "%s/cases.txt", dir);
	FILE *f = fopen(path, "r");
	if (!f) {
		printf("err: no %s\n", path);
		return;
	}
	while (fgets(line, sizeof line, f)) {
		char name[128], dts[16];
		int D, S, causal, B, H;
		if (sscanf(line, "%127s %15s %d %d %d %d %d", name, dts, &D, &S, &causal, &B, &H) != 7)
			continue;
		const char *only = getenv("FA_BENCH_ERR_ONLY");
		if (only && *only && !strstr(name, only))
			continue;
		if (strcmp(dts, "fp32") == 0) {
			if (!x3_only)
				err_case(dir, name, FA_DTYPE_FP32, FA_PREC_IEEE, FA_PREC_IEEE, D, S, causal,
				         B, H);
			err_case(dir, name, FA_DTYPE_FP32, FA_PREC_3XTF32, FA_PREC_3XTF32, D, S, causal, B,
			         H);
			/* the backward's own share: the same backward after an ieee forward */
			if (!fwd_only && !x3_only)
				err_case(dir, name, FA_DTYPE_FP32, FA_PREC_3XTF32, FA_PREC_IEEE, D, S, causal, B, H);
		} else {
			err_case(dir, name, strcmp(dts, "bf16") == 0 ? FA_DTYPE_BF16 : FA_DTYPE_FP16,
			         FA_PREC_DEFAULT, FA_PREC_DEFAULT, D, S, causal, B, H);
		}
	}
	fclose(f);
}

static bool shape_wanted(size_t i)
{
	const char *e = getenv("FA_BENCH_SHAPES");
	if (!e || !*e)
		return true;
	for (const char *c = e; *c;) {
		char *end;
		long v = strtol(c, &end, 10);
		if (end == c)
			break;
		if ((size_t)v == i)
			return true;
		c = *end == ',' ? end + 1 : end;
	}
	return false;
}

int main(void)
{
	char err[512];
	struct fa_kernel_settings ks;
	fa_test_kernel_settings(&ks);
	if (fa_gpu_open(&g, 0, &ks, err, sizeof err) != FA_OK) {
		printf("no GPU: skipped (%s)\n", err);
		return 0;
	}
	const char *tp = getenv("FA_BENCH_TSV");
	if (tp)
		tsv = fopen(tp, "a");
	printf("GPU: %s, sm_%d; B*S = 32768, H = 16, BHSD; TFLOP/s with the backward as 2.5x the "
	       "forward\n", fa_gpu_name(g), fa_gpu_sm(g));
	const bool sweep = getenv("FA_BENCH_SWEEP") != NULL;
	const char *ed = getenv("FA_BENCH_ERR_DIR");
	fwd_only = getenv("FA_BENCH_ERR_FWD") && strcmp(getenv("FA_BENCH_ERR_FWD"), "1") == 0;
	x3_only = getenv("FA_BENCH_ERR_X3") && strcmp(getenv("FA_BENCH_ERR_X3"), "1") == 0;
	if (ed && *ed)
		err_cases(ed);
	static const struct shape shapes[] = {
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 0, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 1, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 4096, 0, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 4096, 0, 0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 128, 4096, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 128, 4096, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 128, 4096, 1, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 256, 4096, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 128, 4096, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_BF16, 128, 4096, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 256, 4096, 0, 1},
		/* issue 11's window target, forward + backward: a window of 4,096 keys (4095, 0) on
		 * S = 16k against the full causal 16k and against dense 4k (row 0: each query sees
		 * 4,096 keys there too, the same 32k queries): time should follow the window */
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 16384, 1, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 16384, 0, 0, 1, 4095, 0, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 16384, 0, 0, 1, 4095, 0, 30.0},
		/* the wgmma backward's wide form (head dims above 128): D=256 causal, fp16, D=192 */
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 4096, 1, 0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 256, 4096, 0, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 192, 4096, 0, 0},
		/* the window and softcap on the wgmma backward, against attn_bwd.cu's tile (sweep) */
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 0, 0, 1, 1023, 0, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 0, 0, 0, 0, 0, 30.0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 0, 0, 1, 1023, 0, 30.0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 4096, 0, 0, 1, 1023, 0, 30.0},
		/* fp32 D=64 (the fp32 wgmma backward's 3xtf32 and 64-row tf32 tiles; rows 21, 22),
		 * tf32 D=128 causal */
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 64, 4096, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 64, 4096, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 128, 4096, 1, 0},
	};
	enum { ROW_DENSE4K = 0, ROW_CAUSAL16K = 11, ROW_WIN16K = 12, ROW_WIDE = 14 };
	float bwd_of[24], det_of[24];
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
		bwd_of[i] = det_of[i] = -1;
		if (shape_wanted(i)) {
			run_shape(&shapes[i], sweep && !shapes[i].fwd_only &&
			                          (i < 4 || shapes[i].dt == FA_DTYPE_FP32 || i >= ROW_WIDE));
			bwd_of[i] = last_bwd;
			det_of[i] = last_det;
		}
	}
	if (bwd_of[ROW_WIN16K] > 0 && bwd_of[ROW_DENSE4K] > 0 && bwd_of[ROW_CAUSAL16K] > 0)
		printf("window (4095, 0) on 16k, backward: / dense 4k %.3f (det %.3f; 1.0 = proportional "
		       "to the window), / full causal 16k %.3f (det %.3f; visible pairs give 0.44)\n",
		       bwd_of[ROW_WIN16K] / bwd_of[ROW_DENSE4K], det_of[ROW_WIN16K] / det_of[ROW_DENSE4K],
		       bwd_of[ROW_WIN16K] / bwd_of[ROW_CAUSAL16K],
		       det_of[ROW_WIN16K] / det_of[ROW_CAUSAL16K]);
	if (tsv)
		fclose(tsv);
	fa_gpu_close(g);
	return 0;
}
