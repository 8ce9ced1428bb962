/* bench_attn_decode.c - the decode path (kernels/attn_decode.cu) through the launch API: time and
 * TB/s of K and V bytes read (each once), on the shapes (bf16, D=128, 32 query heads,
 * 8 kv heads: B=16 x 8k keys, B=64 x 2k, B=1 x 32k) and a few more, next to the prefill kernel
 * on the same shape (the "before": fa_gpu_plan's first tile, launched explicitly). BHSD layout,
 * as tools/sdpa_decode_anchors.py gives PyTorch SDPA, random inputs.
 *
 * Timing: CUDA events around 20 back-to-back launches (the host's enqueue time stays out), the
 * median of 5 such batches; the launches rotate over enough K/V copies that the 50 MB L2 never
 * holds the next one's inputs.
 * Prints "no GPU: skipped" and exits 0 without a GPU. FA_BENCH_TSV=path appends one
 * tab-separated line per measurement; FA_BENCH_SWEEP=1 also times forced splits and ring depths
 * (sweep).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa_gpu.h"
#include "fa_ksettings.h"

struct shape {
	const char *name;
	fa_dtype dt;
	int D, B, Sq, Sk, Hq, Hkv;
	fa_mask mask;
};

static const struct shape shapes[] = {
	{"issue-1 B16 8k", FA_DTYPE_BF16, 128, 16, 1, 8192, 32, 8, FA_MASK_NONE},
	{"issue-2 B64 2k", FA_DTYPE_BF16, 128, 64, 1, 2048, 32, 8, FA_MASK_NONE},
	{"issue-3 B1 32k", FA_DTYPE_BF16, 128, 1, 1, 32768, 32, 8, FA_MASK_NONE},
	{"spec Sq4 causal", FA_DTYPE_BF16, 128, 16, 4, 8192, 32, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT},
	{"spec Sq8 causal", FA_DTYPE_BF16, 128, 16, 8, 8192, 32, 8, FA_MASK_CAUSAL_BOTTOM_RIGHT},
	{"fp16 d64 B16 8k", FA_DTYPE_FP16, 64, 16, 1, 8192, 32, 8, FA_MASK_NONE},
	{"bf16 d256 B8 4k", FA_DTYPE_BF16, 256, 8, 1, 4096, 32, 8, FA_MASK_NONE},
	{"MQA B16 8k", FA_DTYPE_BF16, 128, 16, 1, 8192, 32, 1, FA_MASK_NONE},
	{"fp32 B16 8k", FA_DTYPE_FP32, 128, 16, 1, 8192, 32, 8, FA_MASK_NONE},
};

static struct fa_gpu *g;
static FILE *tsv;

static void make_desc(const struct shape *s, struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
	d->dtype = s->dt;
	d->mask = s->mask;
	d->scale = 1.0 / sqrt((double)s->D);
	d->B = s->B;
	d->Sq = s->Sq;
	d->Sk = s->Sk;
	d->Hq = s->Hq;
	d->Hkv = s->Hkv;
	d->D = s->D;
	int64_t D = s->D;
	int64_t q[3] = {s->Hq * s->Sq * D, D, s->Sq * D}, k[3] = {s->Hkv * s->Sk * D, D, s->Sk * D};
	memcpy(d->q_stride, q, sizeof q);
	memcpy(d->o_stride, q, sizeof q);
	memcpy(d->k_stride, k, sizeof k);
	memcpy(d->v_stride, k, sizeof k);
	d->lse_stride[0] = s->Hq * s->Sq;
	d->lse_stride[1] = s->Sq;
	d->lse_stride[2] = 1;
}

/* Random values in [-1, 1) of dt, uploaded in 16 MiB pieces. */
static int fill(CUdeviceptr p, size_t bytes, fa_dtype dt, uint64_t seed)
{
	const size_t piece = 16u << 20;
	unsigned char *h = malloc(piece);
	if (!h)
		return -1;
	uint64_t x = seed | 1;
	size_t es = fa_dtype_size(dt);
	for (size_t i = 0; i < piece / es; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		double f = (double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0;
		fa_store_elem(h, dt, (int64_t)i, f);
	}
	char err[256];
	for (size_t off = 0; off < bytes; off += piece) {
		size_t n = bytes - off < piece ? bytes - off : piece;
		if (fa_gpu_upload(g, p + off, h, n, err, sizeof err) != FA_OK) {
			fprintf(stderr, "upload: %s\n", err);
			free(h);
			return -1;
		}
	}
	free(h);
	return 0;
}

enum { MAXSETS = 8, BATCH = 20, BATCHES = 5 };

/* Median microseconds per launch; tile NULL: fa_gpu_attn_fwd's own choice (decode). */
static double time_it(const struct fa_attn_fwd_desc *d, const struct fa_tile *t, int nsets,
                      const CUdeviceptr *q, const CUdeviceptr *k, const CUdeviceptr *v,
                      CUdeviceptr o, CUdeviceptr lse, char *err, size_t errlen)
{
	double us[BATCHES];
	for (int i = 0; i < 3; i++)
		if (fa_gpu_attn_fwd_tile(g, d, t, q[i % nsets], k[i % nsets], v[i % nsets], o, lse,
		                         NULL, err, errlen))
			return -1;
	if (fa_gpu_sync(g, err, errlen))
		return -1;
	for (int b = 0; b < BATCHES; b++) {
		struct fa_gpu_timer *tm;
		float ms;
		if (fa_gpu_timer_start(g, NULL, &tm, err, errlen))
			return -1;
		for (int i = 0; i < BATCH; i++) {
			int s = (b * BATCH + i) % nsets;
			if (fa_gpu_attn_fwd_tile(g, d, t, q[s], k[s], v[s], o, lse, NULL, err, errlen))
				return -1;
		}
		if (fa_gpu_timer_stop(g, tm, NULL, &ms, err, errlen))
			return -1;
		us[b] = 1e3 * ms / BATCH;
	}
	for (int i = 1; i < BATCHES; i++)
		for (int j = i; j > 0 && us[j - 1] > us[j]; j--) {
			double x = us[j];
			us[j] = us[j - 1];
			us[j - 1] = x;
		}
	return us[BATCHES / 2];
}

static void bench(const struct shape *s, bool with_prefill)
{
	struct fa_attn_fwd_desc d;
	make_desc(s, &d);
	size_t es = fa_dtype_size(s->dt);
	size_t qb = (size_t)(d.B * d.Sq * d.Hq * d.D) * es, kb = (size_t)(d.B * d.Sk * d.Hkv * d.D) * es;
	int nsets = (int)((512u << 20) / (2 * kb)) + 1;
	if (nsets > MAXSETS)
		nsets = MAXSETS;
	CUdeviceptr q[MAXSETS] = {0}, k[MAXSETS] = {0}, v[MAXSETS] = {0}, o = 0, lse = 0;
	char err[2048];
	int ok = fa_gpu_alloc(g, qb, &o, err, sizeof err) == FA_OK &&
	         fa_gpu_alloc(g, (size_t)(d.B * d.Hq * d.Sq) * 4, &lse, err, sizeof err) == FA_OK;
	for (int i = 0; i < nsets && ok; i++)
		ok = fa_gpu_alloc(g, qb, &q[i], err, sizeof err) == FA_OK &&
		     fa_gpu_alloc(g, kb, &k[i], err, sizeof err) == FA_OK &&
		     fa_gpu_alloc(g, kb, &v[i], err, sizeof err) == FA_OK && !fill(q[i], qb, s->dt, 3 * i + 1) &&
		     !fill(k[i], kb, s->dt, 3 * i + 2) && !fill(v[i], kb, s->dt, 3 * i + 3);
	if (!ok) {
		printf("%-16s setup failed: %s\n", s->name, err);
		goto out;
	}
	char kname[96] = "";
	bool ready;
	fa_gpu_kernel_lookup(g, &d, &ready, kname, sizeof kname, err, sizeof err);
	double dec = time_it(&d, NULL, nsets, q, k, v, o, lse, err, sizeof err);
	if (dec < 0) {
		printf("%-16s decode FAILED: %s\n", s->name, err);
		goto out;
	}
	struct fa_tile pt;
	int n = 0;
	double pre = -1;
	char ptb[48] = "-";
	if (with_prefill && fa_gpu_plan(g, &d, &pt, 1, &n, err, sizeof err) == FA_OK) {
		fa_tile_format(&pt, ptb, sizeof ptb);
		pre = time_it(&d, &pt, nsets, q, k, v, o, lse, err, sizeof err);
	}
	struct fa_decode_plan dp;
	fa_plan_decode(fa_gpu_model(g), &d, fa_gpu_settings(g), NULL, &dp, err, sizeof err);
	double bytes = 2.0 * (double)kb;
	const char *kn = strstr(kname, " dec ") ? strstr(kname, " dec ") + 1 : kname;
	printf("%-16s %s D=%3d B=%2d Sq=%d Sk=%5d Hq=%d Hkv=%d %-9s %-15s splits %3d  %8.1f us "
	       "%5.2f TB/s | prefill %-14s %8.1f us %5.2f TB/s  x%.1f\n", s->name,
	       fa_dtype_size(s->dt) == 4 ? "fp32" : s->dt == FA_DTYPE_FP16 ? "fp16" : "bf16", s->D,
	       s->B, s->Sq, s->Sk, s->Hq, s->Hkv, s->mask ? "causal-br" : "", kn, dp.nsplit, dec,
	       bytes / dec / 1e6, ptb, pre, pre > 0 ? bytes / pre / 1e6 : 0, pre > 0 ? pre / dec : 0);
	fflush(stdout);
	if (tsv)
		fprintf(tsv, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%.2f\t%.3f\t%s\t%.2f\t%.3f\n", s->name,
		        s->D, s->B, s->Sq, s->Sk, s->Hq, s->Hkv, kn, dp.nsplit, dec, bytes / dec / 1e6,
		        ptb, pre, pre > 0 ? bytes / pre / 1e6 : 0);
out:
	for (int i = 0; i < nsets; i++) {
		fa_gpu_free(g, q[i]);
		fa_gpu_free(g, k[i]);
		fa_gpu_free(g, v[i]);
	}
	fa_gpu_free(g, o);
	fa_gpu_free(g, lse);
}

/* FA_BENCH_SWEEP=1: the shapes and MQA under forced splits and ring depths (a device
 * handle per setting, kernels through a disk cache in $TMPDIR), to check the planner's pick. */
static void sweep(const struct fa_kernel_settings *base)
{
	static const int shape_ix[] = {0, 1, 2, 7};
	static const int splits[] = {0, 1, 2, 4, 8, 16, 33, 66};
	const char *tmp = getenv("TMPDIR");
	char dir[512], err[512];
	snprintf(dir, sizeof dir, "%s/fa-bench-decode-cache", tmp && *tmp ? tmp : "/tmp");
	struct fa_gpu *keep = g;
	for (int st = 2; st <= 4; st++)
		for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
			struct fa_kernel_settings ks = *base;
			char v[16];
			snprintf(v, sizeof v, "%d", st);
			fa_kernel_settings_set(&ks, "FA_DECODE_STAGES", v, err, sizeof err);
			snprintf(v, sizeof v, "%d", splits[si]);
			fa_kernel_settings_set(&ks, "FA_DECODE_SPLITS", v, err, sizeof err);
			struct fa_gpu *h;
			if (fa_gpu_open(&h, 0, &ks, err, sizeof err) != FA_OK) {
				printf("sweep: %s\n", err);
				continue;
			}
			fa_gpu_set_cache_dir(h, dir, err, sizeof err);
			g = h;
			printf("sweep stages=%d splits=%d%s\n", st, splits[si], splits[si] ? "" : " (planner)");
			for (size_t k = 0; k < sizeof shape_ix / sizeof shape_ix[0]; k++)
				bench(&shapes[shape_ix[k]], false);
			fa_gpu_close(h);
			g = keep;
		}
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
	printf("GPU: %s, sm_%d, %d SMs\n", fa_gpu_name(g), fa_gpu_sm(g), fa_gpu_model(g)->sm_count);
	const char *tp = getenv("FA_BENCH_TSV");
	if (tp)
		tsv = fopen(tp, "a");
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		bench(&shapes[i], true);
	const char *sw = getenv("FA_BENCH_SWEEP");
	if (sw && strcmp(sw, "1") == 0)
		sweep(&ks);
	if (tsv)
		fclose(tsv);
	fa_gpu_close(g);
	return 0;
}
