/* test_attn_bwd_gpu.c - the backward kernels on the GPU against a float64 reference.
 *
 * Grid: dtypes x fp32 precisions x head dims x (Sq, Sk) x masks x GQA ratios x layouts (BSHD,
 * BHSD), as the forward's test. Each case draws fresh random Q, K, V, dO, runs the GPU forward
 * for O and lse (the backward's inputs: the oracle gets exactly the same O, in its dtype, and the
 * same fp32 lse, so only the backward is measured), poisons dQ, dK, dV (all bits set: NaN) and
 * runs the backward. Small cases compare with fa_attn_bwd_ref64 over everything; large ones with
 * a float64 oracle on sampled query rows (dQ) and keys (dK, dV: first, last and random ones of
 * every head), after checking that no element kept its poison. Error: relative Frobenius error
 * of each gradient; tolerances below (why: each one's comment). Deterministic mode: several cases
 * run five times (outputs poisoned each time) and must give the same bits, and agree with the
 * atomic mode (relative Frobenius difference within the tolerance); among them the wgmma
 * kernel's two orders (attn_bwd_sm90.cu: rotated, and the chain past 33 key blocks) with GQA,
 * both causal masks, Sq != Sk both ways and more key blocks than query blocks. The sliding window and softcap (FA_WIN,
 * FA_SOFTCAP) have their own cases: one- and two-sided windows, with both causal masks, a window
 * that bounds nothing, rows that see no key (Sq > Sk), softcaps 1..20, the deterministic mode bit
 * for bit with a window, and on sm_90's 16-bit the wgmma backward's window and softcap (narrow
 * and wide forms, deterministic chain). Default: a
 * representative sample; FA_GPU_GRID=full the whole grid; FA_GPU_GRID_D / FA_GPU_GRID_DT narrow
 * it as in test_attn_fwd_gpu, FA_GPU_GRID_WIN=1 keeps the window and softcap cases,
 * FA_GPU_GRID_DET=1 the deterministic ones,
 * FA_GPU_VERBOSE=1 prints every case with its tile,
 * FA_GPU_GRID_SHARD=k/n keeps every n-th case from the k-th (the full
 * grid over n device calls). Without a GPU it prints why and skips.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fa_gpu_tol.h"
#include "fa_gpu.h"
#include "fa_gpu_bwd.h"
#include "fa_attn_bwd.h"
#include "fa_test.h"
#include "fa_ksettings.h"

struct gcase {
	fa_dtype dt;
	fa_precision prec;
	int D;
	int Sq, Sk;
	fa_mask mask;
	int B, Hq, Hkv;
	int bhsd; /* layout: 0 BSHD, 1 BHSD */
	int neg;  /* negative scale */
	int det;  /* also the deterministic mode, DET_RUNS runs, bit for bit */
	int win;  /* a sliding window (wl, wr) (fa_attn.h: a negative side is unbounded) */
	int wl, wr;
	double cap; /* softcap, 0: off */
};

#define DET_RUNS 5

static struct fa_gpu *gpu;
static char gpu_err[512];
static uint64_t seed0 = 0x9e3779b97f4a7c15ull;
static _Thread_local uint64_t rng;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

/* Relative Frobenius error of each gradient. The forward's tolerances (ARCHITECTURE.md) times the
 * backward's extra roundings: 16-bit P and dS are rounded to the input type before the dK, dV and
 * dQ products (FlashAttention-2 does the same), and dQ, dK sum dS, whose rows sum to zero, so
 * their relative error is that of dS amplified by the cancellation. fp32 3xtf32 and ieee keep
 * everything in fp32. */
static double tol_of(fa_dtype dt, fa_precision p)
{
	if (dt == FA_DTYPE_FP16)
		return 5e-3;
	if (dt == FA_DTYPE_BF16)
		return 4e-2;
	switch (fa_prec_resolve(dt, p)) {
	case FA_PREC_TF32: return 5e-3;
	case FA_PREC_BF16: return 4e-2;
	default: return 2e-5;
	}
}

/* The cancellation floor's size per unit of acc3's mabs (see there): the unit roundoff u of the
 * inputs the kernel rounds before its products, doubled (dP's and delta's terms both round), at
 * the tolerance: an error of 2u times the terms' sizes reads as exactly the tolerance. 0 where
 * the products are exact (16-bit inputs) or fp32-accurate (ieee, 3xtf32). */
static double noise_floor(fa_dtype dt, fa_precision p, double tol)
{
	if (dt != FA_DTYPE_FP32)
		return 0;
	switch (fa_prec_resolve(dt, p)) {
	case FA_PREC_TF32: return 2.0 * 0x1p-11 / tol;
	case FA_PREC_BF16: return 2.0 * 0x1p-8 / tol;
	default: return 0;
	}
}

static void make_desc(const struct gcase *c, struct fa_attn_bwd_desc *bd)
{
	memset(bd, 0, sizeof *bd);
	struct fa_attn_fwd_desc *d = &bd->fwd;
	d->dtype = c->dt;
	d->precision = c->prec;
	d->mask = c->mask;
	d->scale = (c->neg ? -1.0 : 1.0) / sqrt((double)c->D);
	d->B = c->B;
	d->Sq = c->Sq;
	d->Sk = c->Sk;
	d->Hq = c->Hq;
	d->Hkv = c->Hkv;
	d->D = c->D;
	int64_t D = c->D;
	int64_t q[3], k[3];
	if (!c->bhsd) {
		int64_t q_[3] = {c->Sq * c->Hq * D, c->Hq * D, D}, k_[3] = {c->Sk * c->Hkv * D, c->Hkv * D, D};
		memcpy(q, q_, sizeof q);
		memcpy(k, k_, sizeof k);
	} else {
		int64_t q_[3] = {c->Hq * c->Sq * D, D, c->Sq * D}, k_[3] = {c->Hkv * c->Sk * D, D, c->Sk * D};
		memcpy(q, q_, sizeof q);
		memcpy(k, k_, sizeof k);
	}
	memcpy(d->q_stride, q, sizeof q);
	memcpy(d->o_stride, q, sizeof q);
	memcpy(d->k_stride, k, sizeof k);
	memcpy(d->v_stride, k, sizeof k);
	memcpy(bd->do_stride, q, sizeof q);
	memcpy(bd->dq_stride, q, sizeof q);
	memcpy(bd->dk_stride, k, sizeof k);
	memcpy(bd->dv_stride, k, sizeof k);
	d->lse_stride[0] = (int64_t)c->Hq * c->Sq;
	d->lse_stride[1] = c->Sq;
	d->lse_stride[2] = 1;
	d->window = c->win != 0;
	d->window_left = c->win ? c->wl : 0;
	d->window_right = c->win ? c->wr : 0;
	d->softcap = c->cap;
}

static void fill_random(void *buf, fa_dtype dt, size_t n, double amp)
{
	for (size_t i = 0; i < n; i++)
		fa_store_elem(buf, dt, (int64_t)i, amp * (2.0 * fa_rand_uniform(&rng) - 1.0));
}

/* The host copies of one case. */
struct hostbufs {
	const struct fa_attn_bwd_desc *d;
	void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
	float *lse;
	double *delta;     /* [B][Hq][Sq] */
	double *delta_abs; /* the same sums of |dO||O| (the size of delta's terms) */
};

static double elem(const struct hostbufs *h, const void *t, const int64_t *st, int64_t b,
                   int64_t s, int64_t hh, int64_t e)
{
	return fa_load_elem(t, h->d->fwd.dtype, b * st[0] + s * st[1] + hh * st[2] + e);
}

/* P of (i, j) from the forward's lse, under the mask and window; with a softcap c, the score
 * s becomes c tanh(s / c) and *dcap (may be NULL) gets its derivative 1 - tanh^2, by which dS is
 * multiplied (1 without one). */
static double pij(const struct hostbufs *h, int64_t b, int64_t hq, int64_t i, int64_t j,
                  double *dcap)
{
	const struct fa_attn_fwd_desc *d = &h->d->fwd;
	if (dcap)
		*dcap = 1;
	float l = h->lse[b * d->lse_stride[0] + hq * d->lse_stride[1] + i * d->lse_stride[2]];
	if (isinf(l) && l < 0)
		return 0;
	if (!fa_attn_allows(d, d->Sq, d->Sk, i, j))
		return 0;
	int64_t hk = hq / (d->Hq / d->Hkv);
	double s = 0;
	for (int64_t e = 0; e < d->D; e++)
		s += elem(h, h->q, d->q_stride, b, i, hq, e) * elem(h, h->k, d->k_stride, b, j, hk, e);
	s *= d->scale;
	if (d->softcap > 0) {
		const double t = tanh(s / d->softcap);
		s = d->softcap * t;
		if (dcap)
			*dcap = 1 - t * t;
	}
	return exp(s - (double)l);
}

/* dP of (i, j) = dO_i . V_j; *abs_sum (may be NULL) gets the sum of its terms' sizes. */
static double dpij(const struct hostbufs *h, int64_t b, int64_t hq, int64_t i, int64_t j,
                   double *abs_sum)
{
	const struct fa_attn_fwd_desc *d = &h->d->fwd;
	int64_t hk = hq / (d->Hq / d->Hkv);
	double s = 0, a = 0;
	for (int64_t e = 0; e < d->D; e++) {
		const double t = elem(h, h->dout, h->d->do_stride, b, i, hq, e) *
		                 elem(h, h->v, d->v_stride, b, j, hk, e);
		s += t;
		a += fabs(t);
	}
	if (abs_sum)
		*abs_sum = a;
	return s;
}

/* Per gradient: squared error, squared reference, and the squared magnitude of the sums the
 * reference is made of (sum of |terms| per element). dQ and dK are sums of dS, whose rows sum
 * to zero: where a row sees one key (Sk = 1, a causal edge) they are exactly 0 while the kernel
 * rightly returns rounding noise of the size of its terms. The error is relative to the larger
 * of the reference and a tenth of that magnitude (only strong cancellation reaches the floor).
 * Where the kernel rounds its inputs before the products (tf32: 2^-11; fp32 through bf16:
 * 2^-8), dP's own rounding is of the size of ITS terms, sum |dO_e V_e|, which the first
 * magnitude does not see (it takes |dP|, and dP is a dot product that cancels too): mabs is the
 * magnitude with dP's and delta's terms taken apart, and where the reference is pure
 * cancellation the floor is also the noise that rounding can make at the tolerance
 * (noise_floor below). Found on the H200: fp32 tf32 D=80 Sq=Sk=1 gave
 * dQ 6.0e-3 against 5e-3 on one seed in about ten runs. */
struct acc3 {
	double num[3], den[3], mag[3], mabs[3];
	bool bad;
};

static void add_err(struct acc3 *a, int w, double got, double want, double mag, double mabs)
{
	if (!isfinite(got))
		a->bad = true;
	a->num[w] += (got - want) * (got - want);
	a->den[w] += want * want;
	a->mag[w] += mag * mag;
	a->mabs[w] += mabs * mabs;
}

/* The relative error; floor: the noise's size per unit of mabs (0: none beyond the tenth),
 * taken only where the cancellation floor applies (elsewhere the reference is the measure, as
 * for every other precision). */
static double rel_of(const struct acc3 *a, int w, double floor)
{
	double den = a->den[w];
	if (den < 1e-2 * a->mag[w]) {
		den = 1e-2 * a->mag[w];
		if (den < floor * floor * a->mabs[w])
			den = floor * floor * a->mabs[w];
	}
	return den > 0 ? sqrt(a->num[w] / den) : (a->num[w] > 0 ? INFINITY : 0);
}

/* Sampled oracle: dQ of query row (b, hq, i), or dK and dV of key (b, hk, j). */
static void oracle_row(const struct hostbufs *h, int64_t b, int64_t hq, int64_t i, double *tmp,
                       struct acc3 *a)
{
	const struct fa_attn_fwd_desc *d = &h->d->fwd;
	int64_t hk = hq / (d->Hq / d->Hkv);
	double delta = h->delta[(b * d->Hq + hq) * d->Sq + i];
	double delta_abs = h->delta_abs[(b * d->Hq + hq) * d->Sq + i];
	double *mg = tmp + d->D, *ma = tmp + 2 * d->D;
	for (int64_t e = 0; e < 3 * d->D; e++)
		tmp[e] = 0;
	for (int64_t j = 0; j < d->Sk; j++) {
		double dc;
		double p = pij(h, b, hq, i, j, &dc);
		if (p == 0)
			continue;
		double dpa;
		double dp = dpij(h, b, hq, i, j, &dpa);
		double ds = p * (dp - delta) * dc, dsm = p * (fabs(dp) + fabs(delta)) * dc;
		double dsa = p * (dpa + delta_abs) * dc;
		for (int64_t e = 0; e < d->D; e++) {
			double kv = elem(h, h->k, d->k_stride, b, j, hk, e);
			tmp[e] += ds * kv;
			mg[e] += dsm * fabs(kv);
			ma[e] += dsa * fabs(kv);
		}
	}
	for (int64_t e = 0; e < d->D; e++)
		add_err(a, 0, elem(h, h->dq, h->d->dq_stride, b, i, hq, e), d->scale * tmp[e],
		        fabs(d->scale) * mg[e], fabs(d->scale) * ma[e]);
}

static void oracle_key(const struct hostbufs *h, int64_t b, int64_t hk, int64_t j, double *tmp,
                       struct acc3 *a)
{
	const struct fa_attn_fwd_desc *d = &h->d->fwd;
	const int64_t D = d->D, grp = d->Hq / d->Hkv;
	double *tk = tmp, *tv = tmp + D, *mk = tmp + 2 * D, *mv = tmp + 3 * D, *ka = tmp + 4 * D;
	for (int64_t e = 0; e < 5 * D; e++)
		tmp[e] = 0;
	for (int64_t hq = hk * grp; hq < (hk + 1) * grp; hq++)
		for (int64_t i = 0; i < d->Sq; i++) {
			double dc;
			double p = pij(h, b, hq, i, j, &dc);
			if (p == 0)
				continue;
			double dpa;
			double dp = dpij(h, b, hq, i, j, &dpa);
			double dl = h->delta[(b * d->Hq + hq) * d->Sq + i];
			double dla = h->delta_abs[(b * d->Hq + hq) * d->Sq + i];
			double ds = p * (dp - dl) * dc, dsm = p * (fabs(dp) + fabs(dl)) * dc;
			double dsa = p * (dpa + dla) * dc;
			for (int64_t e = 0; e < D; e++) {
				double o = elem(h, h->dout, h->d->do_stride, b, i, hq, e);
				double q = elem(h, h->q, d->q_stride, b, i, hq, e);
				tv[e] += p * o;
				mv[e] += p * fabs(o);
				tk[e] += ds * q;
				mk[e] += dsm * fabs(q);
				ka[e] += dsa * fabs(q);
			}
		}
	for (int64_t e = 0; e < D; e++) {
		add_err(a, 1, elem(h, h->dk, h->d->dk_stride, b, j, hk, e), d->scale * tk[e],
		        fabs(d->scale) * mk[e], fabs(d->scale) * ka[e]);
		add_err(a, 2, elem(h, h->dv, h->d->dv_stride, b, j, hk, e), tv[e], mv[e], mv[e]);
	}
}

struct sample_job {
	const struct hostbufs *h;
	const int64_t *items; /* (kind, b, head, index): kind 0 row, 1 key */
	int n, first, step;
	struct acc3 a;
};

static void *sample_worker(void *arg)
{
	struct sample_job *j = arg;
	double *tmp = malloc(sizeof(double) * 5 * (size_t)j->h->d->fwd.D);
	for (int r = j->first; r < j->n; r += j->step) {
		const int64_t *it = j->items + 4 * r;
		if (it[0] == 0)
			oracle_row(j->h, it[1], it[2], it[3], tmp, &j->a);
		else
			oracle_key(j->h, it[1], it[2], it[3], tmp, &j->a);
	}
	free(tmp);
	return NULL;
}

static int ncases, nfail;
static double worst[8][3]; /* by dtype/precision slot; dQ, dK, dV */

struct devbufs {
	CUdeviceptr q, k, v, o, dout, lse, dq, dk, dv;
};

static void dev_free(struct devbufs *b)
{
	CUdeviceptr *p = &b->q;
	for (int i = 0; i < 9; i++)
		fa_gpu_free(gpu, p[i]);
}

static fa_status run_bwd(const struct fa_attn_bwd_desc *d, const struct devbufs *db, size_t nq,
                         size_t nk, size_t es, unsigned flags, struct hostbufs *h, char *err,
                         size_t errlen)
{
	fa_status st;
	struct fa_gpu_bwd_ptrs p = {db->q, db->k, db->v, db->o, db->dout, db->lse, db->dq, db->dk,
	                            db->dv};
	if ((st = fa_gpu_memset8(gpu, db->dq, 0xff, nq * es, err, errlen)) ||
	    (st = fa_gpu_memset8(gpu, db->dk, 0xff, nk * es, err, errlen)) ||
	    (st = fa_gpu_memset8(gpu, db->dv, 0xff, nk * es, err, errlen)) ||
	    (st = fa_gpu_attn_bwd(gpu, d, &p, flags, NULL, err, errlen)) ||
	    (st = fa_gpu_sync(gpu, err, errlen)) ||
	    (st = fa_gpu_download(gpu, h->dq, db->dq, nq * es, err, errlen)) ||
	    (st = fa_gpu_download(gpu, h->dk, db->dk, nk * es, err, errlen)) ||
	    (st = fa_gpu_download(gpu, h->dv, db->dv, nk * es, err, errlen)))
		return st;
	return FA_OK;
}

/* One case's host buffers (delta's are the caller's): random Q, K, V, dO (amplitudes 1.5,
 * 1.5, 1, 1), the rest unset; and its device buffers with Q, K, V, dO uploaded. */
static void host_setup(struct hostbufs *h, fa_dtype dt, size_t nq, size_t nk, size_t nl)
{
	const size_t es = fa_dtype_size(dt);
	h->q = malloc(nq * es);
	h->k = malloc(nk * es);
	h->v = malloc(nk * es);
	h->o = malloc(nq * es);
	h->dout = malloc(nq * es);
	h->dq = malloc(nq * es);
	h->dk = malloc(nk * es);
	h->dv = malloc(nk * es);
	h->lse = malloc(nl * sizeof(float));
	assert_non_null(h->lse);
	fill_random(h->q, dt, nq, 1.5);
	fill_random(h->k, dt, nk, 1.5);
	fill_random(h->v, dt, nk, 1.0);
	fill_random(h->dout, dt, nq, 1.0);
}

static void host_free(struct hostbufs *h)
{
	void *p[] = {h->q, h->k, h->v, h->o, h->dout, h->dq, h->dk, h->dv, h->lse};
	for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
		free(p[i]);
}

static fa_status dev_setup(struct devbufs *db, const struct hostbufs *h, size_t nq, size_t nk,
                           size_t nl, size_t es, char *err, size_t errlen)
{
	fa_status st;
	if ((st = fa_gpu_alloc(gpu, nq * es, &db->q, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db->k, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db->v, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nq * es, &db->o, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nq * es, &db->dout, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nl * 4, &db->lse, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nq * es, &db->dq, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db->dk, err, errlen)) ||
	    (st = fa_gpu_alloc(gpu, nk * es, &db->dv, err, errlen)) ||
	    (st = fa_gpu_upload(gpu, db->q, h->q, nq * es, err, errlen)) ||
	    (st = fa_gpu_upload(gpu, db->k, h->k, nk * es, err, errlen)) ||
	    (st = fa_gpu_upload(gpu, db->v, h->v, nk * es, err, errlen)) ||
	    (st = fa_gpu_upload(gpu, db->dout, h->dout, nq * es, err, errlen)))
		return st;
	return FA_OK;
}

static bool run_case(const struct gcase *c, int verbose)
{
	struct fa_attn_bwd_desc bd;
	make_desc(c, &bd);
	const struct fa_attn_fwd_desc *d = &bd.fwd;
	size_t es = fa_dtype_size(c->dt);
	size_t nq = (size_t)c->B * c->Sq * c->Hq * c->D, nk = (size_t)c->B * c->Sk * c->Hkv * c->D;
	size_t nl = (size_t)c->B * c->Hq * c->Sq;
	struct hostbufs h = {.d = &bd};
	host_setup(&h, c->dt, nq, nk, nl);
	h.delta = malloc(nl * sizeof(double));
	h.delta_abs = malloc(nl * sizeof(double));
	assert_non_null(h.delta);
	assert_non_null(h.delta_abs);
	struct devbufs db = {0};
	char err[2048];
	fa_status st;
	if ((st = dev_setup(&db, &h, nq, nk, nl, es, err, sizeof err)))
		fail_msg("setup: %s", err);
	struct fa_tile tile = {0};
	int ntile = 0;
	bool det_ok = true;
	st = fa_gpu_plan_bwd(gpu, &bd, &tile, 1, &ntile, err, sizeof err);
	if (st == FA_OK)
		st = fa_gpu_attn_fwd(gpu, d, db.q, db.k, db.v, db.o, db.lse, NULL, err, sizeof err);
	if (st == FA_OK)
		st = fa_gpu_sync(gpu, err, sizeof err);
	if (st == FA_OK && (st = fa_gpu_download(gpu, h.o, db.o, nq * es, err, sizeof err)) == FA_OK)
		st = fa_gpu_download(gpu, h.lse, db.lse, nl * 4, err, sizeof err);
	void *ref[3] = {NULL, NULL, NULL}; /* the deterministic mode's gradients */
	if (st == FA_OK && c->det) {
		/* DET_RUNS deterministic runs: the same bits each time */
		ref[0] = malloc(nq * es);
		ref[1] = malloc(nk * es);
		ref[2] = malloc(nk * es);
		for (int run = 0; run < DET_RUNS && st == FA_OK; run++) {
			st = run_bwd(&bd, &db, nq, nk, es, FA_GPU_BWD_DETERMINISTIC, &h, err, sizeof err);
			if (st != FA_OK)
				break;
			if (run == 0) {
				memcpy(ref[0], h.dq, nq * es);
				memcpy(ref[1], h.dk, nk * es);
				memcpy(ref[2], h.dv, nk * es);
			} else if (memcmp(ref[0], h.dq, nq * es) || memcmp(ref[1], h.dk, nk * es) ||
			           memcmp(ref[2], h.dv, nk * es)) {
				det_ok = false;
			}
		}
	}
	/* the atomic mode's result is the one compared with the oracle below; the deterministic
	 * one (same bits on every run) must agree with it within the same tolerance */
	if (st == FA_OK)
		st = run_bwd(&bd, &db, nq, nk, es, 0, &h, err, sizeof err);
	double det_diff = 0;
	if (st == FA_OK && c->det) {
		const void *atom[3] = {h.dq, h.dk, h.dv};
		const size_t cnt[3] = {nq, nk, nk};
		/* dQ: the fixed-point deterministic dQ (fp16, bf16, tf32; kernels/fa_device.cuh) errs
		 * by 2^-29 of its row bound per key block, not relative to the row: where a row's
		 * gradient cancels (a row that sees one key: its softmax has none) both modes give
		 * noise. So each row's difference also counts against 1e-4 of its scale |scale|
		 * |dO_i| max|V| max|K| (the bound up to the factor of 2 from delta): far above the
		 * fixed point's error, far below any wrong multiplier's. */
		const fa_precision pr = fa_prec_resolve(c->dt, c->prec);
		const bool fixed = !(c->dt == FA_DTYPE_FP32 &&
		                     (pr == FA_PREC_IEEE || pr == FA_PREC_3XTF32));
		double dq_floor2 = 0;
		for (int64_t b = 0; fixed && b < c->B; b++)
			for (int64_t hk = 0; hk < c->Hkv; hk++) {
				double vmax = 0, kmax = 0;
				for (int64_t j = 0; j < c->Sk; j++) {
					double v2 = 0;
					for (int64_t e = 0; e < c->D; e++) {
						const double v = elem(&h, h.v, d->v_stride, b, j, hk, e);
						v2 += v * v;
						kmax = fmax(kmax, fabs(elem(&h, h.k, d->k_stride, b, j, hk, e)));
					}
					vmax = fmax(vmax, sqrt(v2));
				}
				for (int64_t hq = hk * (c->Hq / c->Hkv); hq < (hk + 1) * (c->Hq / c->Hkv); hq++)
					for (int64_t i = 0; i < c->Sq; i++) {
						double n2 = 0;
						for (int64_t e = 0; e < c->D; e++) {
							const double x = elem(&h, h.dout, bd.do_stride, b, i, hq, e);
							n2 += x * x;
						}
						const double rho = 1e-4 * fabs(d->scale) * sqrt(n2) * vmax * kmax;
						dq_floor2 += (double)c->D * rho * rho;
					}
			}
		for (int w = 0; w < 3; w++) {
			double num = 0, den = w == 0 ? dq_floor2 : 0;
			for (size_t i = 0; i < cnt[w]; i++) {
				double a = fa_load_elem(atom[w], c->dt, (int64_t)i);
				double x = fa_load_elem(ref[w], c->dt, (int64_t)i) - a;
				num += x * x;
				den += a * a;
			}
			double r = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
			if (!(r <= det_diff))
				det_diff = isnan(r) ? INFINITY : r;
		}
	}
	for (int i = 0; i < 3; i++)
		free(ref[i]);
	dev_free(&db);
	if (st != FA_OK) {
		pthread_mutex_lock(&out_lock);
		printf("FAIL launch %s D=%d Sq=%d Sk=%d: %s: %s\n",
		       fa_gpu_kind_name(fa_gpu_kind(c->dt, c->prec)), c->D, c->Sq, c->Sk, fa_status_name(st), err);
		ncases++;
		nfail++;
		pthread_mutex_unlock(&out_lock);
		goto out;
	}

	/* delta from the O the GPU wrote */
	for (int64_t b = 0; b < c->B; b++)
		for (int64_t hq = 0; hq < c->Hq; hq++)
			for (int64_t i = 0; i < c->Sq; i++) {
				double s = 0, sa = 0;
				for (int64_t e = 0; e < c->D; e++) {
					const double t = elem(&h, h.o, d->o_stride, b, i, hq, e) *
					                 elem(&h, h.dout, bd.do_stride, b, i, hq, e);
					s += t;
					sa += fabs(t);
				}
				h.delta[(b * c->Hq + hq) * c->Sq + i] = s;
				h.delta_abs[(b * c->Hq + hq) * c->Sq + i] = sa;
			}
	bool finite = true;
	for (size_t i = 0; i < nq && finite; i++)
		finite = isfinite(fa_load_elem(h.dq, c->dt, (int64_t)i));
	for (size_t i = 0; i < nk && finite; i++)
		finite = isfinite(fa_load_elem(h.dk, c->dt, (int64_t)i)) &&
		         isfinite(fa_load_elem(h.dv, c->dt, (int64_t)i));

	struct acc3 tot = {{0}, {0}, {0}, {0}, false};
	double work = (double)c->B * c->Hq * c->Sq * (double)c->Sk * c->D;
	const bool dense = work <= 4e6; /* every row and key; else sampled ones */
	int per_q = dense || c->Sq <= 24 ? c->Sq : 12, per_k = dense || c->Sk <= 24 ? c->Sk : 12;
	{
		int64_t *items = malloc(sizeof(int64_t) * 4 * (size_t)(c->B * (c->Hq * per_q + c->Hkv * per_k)));
		int n = 0;
		for (int b = 0; b < c->B; b++) {
			for (int hq = 0; hq < c->Hq; hq++)
				for (int r = 0; r < per_q; r++) {
					int64_t i = per_q == c->Sq ? r : r < 3 ? r : r < 6 ? c->Sq - 1 - (r - 3)
					          : fa_rand_range(&rng, 0, c->Sq - 1);
					int64_t it[4] = {0, b, hq, i};
					memcpy(items + 4 * n++, it, sizeof it);
				}
			for (int hk = 0; hk < c->Hkv; hk++)
				for (int r = 0; r < per_k; r++) {
					int64_t j = per_k == c->Sk ? r : r < 3 ? r : r < 6 ? c->Sk - 1 - (r - 3)
					          : fa_rand_range(&rng, 0, c->Sk - 1);
					int64_t it[4] = {1, b, hk, j};
					memcpy(items + 4 * n++, it, sizeof it);
				}
		}
		enum { NT = 4 };
		struct sample_job jobs[NT];
		pthread_t th[NT];
		for (int t = 0; t < NT; t++) {
			jobs[t] = (struct sample_job){.h = &h, .items = items, .n = n, .first = t, .step = NT};
			pthread_create(&th[t], NULL, sample_worker, &jobs[t]);
		}
		for (int t = 0; t < NT; t++) {
			pthread_join(th[t], NULL);
			for (int w = 0; w < 3; w++) {
				tot.num[w] += jobs[t].a.num[w];
				tot.den[w] += jobs[t].a.den[w];
				tot.mag[w] += jobs[t].a.mag[w];
				tot.mabs[w] += jobs[t].a.mabs[w];
			}
			tot.bad |= jobs[t].a.bad;
		}
		free(items);
	}
	/* The project's oracle, fa_attn_bwd_ref64, on the small cases: the test's own float64
	 * formulas above must agree with it (relative 1e-9), so that the sampled large cases are
	 * measured against the same thing. */
	if (work <= 2e5) {
		double *o64 = malloc(sizeof(double) * nq), *l64 = malloc(sizeof(double) * nl);
		double *g64[3] = {malloc(sizeof(double) * nq), malloc(sizeof(double) * nk),
		                  malloc(sizeof(double) * nk)};
		for (int64_t b = 0; b < c->B; b++)
			for (int64_t i = 0; i < c->Sq; i++)
				for (int64_t hq = 0; hq < c->Hq; hq++) {
					for (int64_t e = 0; e < c->D; e++)
						o64[((b * c->Sq + i) * c->Hq + hq) * c->D + e] =
						    elem(&h, h.o, d->o_stride, b, i, hq, e);
					l64[(b * c->Hq + hq) * c->Sq + i] =
					    h.lse[b * d->lse_stride[0] + hq * d->lse_stride[1] + i];
				}
		st = fa_attn_bwd_ref64(&bd, h.q, h.k, h.v, o64, h.dout, l64, g64[0], g64[1], g64[2]);
		if (st != FA_OK)
			fail_msg("reference: %s", fa_status_name(st));
		/* dQ of rows 0..3 of batch 0, head 0 by the test's formulas against ref64's */
		double num = 0, den = 0;
		for (int64_t i = 0; i < c->Sq && i < 4; i++) {
			double dq_i[256];
			for (int64_t e = 0; e < c->D; e++)
				dq_i[e] = 0;
			double dl = h.delta[i];
			for (int64_t j = 0; j < c->Sk; j++) {
				double dc;
				double p = pij(&h, 0, 0, i, j, &dc);
				if (p == 0)
					continue;
				double ds = p * (dpij(&h, 0, 0, i, j, NULL) - dl) * dc;
				for (int64_t e = 0; e < c->D; e++)
					dq_i[e] += ds * elem(&h, h.k, d->k_stride, 0, j, 0, e);
			}
			for (int64_t e = 0; e < c->D; e++) {
				double r = g64[0][(i * c->Hq) * c->D + e], m = d->scale * dq_i[e];
				num += (r - m) * (r - m);
				den += r * r + 1e-30;
			}
		}
		if (sqrt(num / den) > 1e-9 && den > 1e-20)
			fail_msg("the test's oracle and fa_attn_bwd_ref64 disagree: %.3g", sqrt(num / den));
		free(o64);
		free(l64);
		for (int i = 0; i < 3; i++)
			free(g64[i]);
	}
	double rel[3];
	double tol = tol_of(c->dt, c->prec);
	for (int w = 0; w < 3; w++)
		rel[w] = rel_of(&tot, w, noise_floor(c->dt, c->prec, tol));
	if (!finite || tot.bad)
		rel[0] = rel[1] = rel[2] = INFINITY;
	bool ok = rel[0] <= tol && rel[1] <= tol && rel[2] <= tol && det_ok &&
	          det_diff <= tol; /* NaN fails */
	int s = fa_gpu_kind(c->dt, c->prec);
	pthread_mutex_lock(&out_lock);
	for (int w = 0; w < 3; w++)
		if (rel[w] > worst[s][w] || isnan(rel[w]))
			worst[s][w] = rel[w];
	char tb[48];
	fa_tile_format(&tile, tb, sizeof tb);
	ncases++;
	if (!ok)
		nfail++;
	char ext[64] = "";
	if (c->win || c->cap > 0) {
		int n = 0;
		if (c->win)
			n = snprintf(ext, sizeof ext, " window (%d, %d)", c->wl, c->wr);
		if (c->cap > 0)
			snprintf(ext + n, sizeof ext - (size_t)n, " softcap %g", c->cap);
	}
	if (!ok || verbose)
		printf("%s %-11s D=%3d Sq=%4d Sk=%4d B=%d Hq=%d Hkv=%d %s %-19s%s%s tile %-16s dQ %.3g dK "
		       "%.3g dV %.3g (tol %.0e)%s%s%s\n", ok ? "ok  " : "FAIL", fa_gpu_kind_name(s), c->D,
		       c->Sq, c->Sk, c->B, c->Hq, c->Hkv, c->bhsd ? "BHSD" : "BSHD",
		       fa_mask_name(c->mask), c->neg ? " neg" : "", ext, tb, rel[0], rel[1], rel[2], tol,
		       !c->det ? "" : !det_ok ? " deterministic: BITS DIFFER"
		       : det_diff <= tol ? " deterministic: same bits x5" : " deterministic: FAR FROM ATOMIC",
		       finite ? "" : " (non-finite output or poison left)", tot.bad ? " (non-finite)" : "");
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
out:
	host_free(&h);
	free(h.delta);
	free(h.delta_abs);
	return ok;
}

static int setup(void **state)
{
	(void)state;
	struct fa_kernel_settings ks;
	fa_test_kernel_settings(&ks);
	if (fa_gpu_open(&gpu, 0, &ks, gpu_err, sizeof gpu_err) != FA_OK)
		gpu = NULL;
	const char *seed = getenv("FA_TEST_SEED");
	const uint64_t seed_in = seed ? strtoull(seed, NULL, 0) : (uint64_t)fa_test_now_us();
	seed0 ^= seed_in; /* the value printed is the one to pass back */
	printf("FA_TEST_SEED=0x%llx repeats this run's inputs\n", (unsigned long long)seed_in);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	fa_gpu_close(gpu);
	return 0;
}

struct prep {
	struct gcase *cases;
	int n, next;
	bool verbose; /* FA_GPU_VERBOSE=1: a line for every case (its tile), not only the failed */
	pthread_mutex_t lock;
};

static void *case_worker(void *arg)
{
	struct prep *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->lock);
		int i = p->next++;
		pthread_mutex_unlock(&p->lock);
		if (i >= p->n)
			return NULL;
		rng = seed0 ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
		run_case(&p->cases[i], p->cases[i].det || i < 4 || p->verbose);
	}
}

static const fa_dtype G_DT[] = {FA_DTYPE_FP16, FA_DTYPE_BF16, FA_DTYPE_FP32, FA_DTYPE_FP32,
                                FA_DTYPE_FP32, FA_DTYPE_FP32};
static const fa_precision G_PR[] = {FA_PREC_DEFAULT, FA_PREC_DEFAULT, FA_PREC_IEEE,
                                    FA_PREC_3XTF32, FA_PREC_TF32, FA_PREC_BF16};
static const int G_D[] = {8, 40, 64, 80, 96, 128, 160, 192, 256};
static const int G_LEN[][2] = {{1, 1}, {17, 17}, {127, 127}, {129, 129}, {1000, 1000},
                               {4097, 4097}, {17, 1000}, {1000, 17}, {1, 4097}, {129, 4097},
                               {4097, 129}, {127, 1000}};
static const int G_NLEN = (int)(sizeof G_LEN / sizeof G_LEN[0]);
static const int G_HEADS[][2] = {{2, 2}, {4, 2}, {4, 1}, {8, 2}}; /* Hq, Hkv: 1:1, GQA, MQA */
static const fa_mask G_MASK[] = {FA_MASK_NONE, FA_MASK_CAUSAL_BOTTOM_RIGHT, FA_MASK_CAUSAL_TOP_LEFT};

static void set_heads(struct gcase *c, int k)
{
	c->Hq = G_HEADS[k % 4][0];
	c->Hkv = G_HEADS[k % 4][1];
	c->B = (c->Sq >= 1000 || c->Sk >= 1000) ? 1 : 2;
	if (c->Sq >= 4000 && c->Sk >= 4000) {
		c->Hq = c->Hq / c->Hkv;
		c->Hkv = 1;
	}
}

static void test_attn_bwd_gpu_matches_the_float64_reference(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	printf("GPU: %s, sm_%d, opt-in shared memory %zu bytes\n", fa_gpu_name(gpu), fa_gpu_sm(gpu),
	       fa_gpu_smem_optin(gpu));
	const char *grid = getenv("FA_GPU_GRID");
	bool full = grid && strcmp(grid, "full") == 0;
	struct gcase *cases = calloc(20000, sizeof *cases);
	int n = 0, k = 0;
	/* The seed's case: fp32 head dim 128 causal (deterministic too), and fp32 head dim 256. */
	cases[n++] = (struct gcase){FA_DTYPE_FP32, FA_PREC_DEFAULT, 128, 4096, 4096,
	                            FA_MASK_CAUSAL_TOP_LEFT, 1, 4, 4, 0, 0, 1};
	cases[n++] = (struct gcase){FA_DTYPE_FP32, FA_PREC_DEFAULT, 256, 2048, 2048, FA_MASK_NONE,
	                            1, 4, 2, 1, 0, 0};
	cases[n++] = (struct gcase){FA_DTYPE_FP32, FA_PREC_DEFAULT, 256, 1000, 1000,
	                            FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 2, 2, 0, 0, 1};
	/* deterministic: 16-bit, GQA, both masks, ragged */
	cases[n++] = (struct gcase){FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 1000, 1000,
	                            FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 8, 2, 1, 0, 1};
	cases[n++] = (struct gcase){FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, 129, 4097, FA_MASK_NONE, 2,
	                            4, 1, 0, 0, 1};
	/* deterministic on the wgmma kernel (16-bit, D 64..128 by default, all of 8..128 under
	 * FA_WGMMA16_BWD=1): the rotated order with the benchmark's wrap (64 query blocks, 32 key
	 * blocks) and GQA; both causal masks with Sq < Sk (blocks that share a first query block)
	 * and Sq > Sk (rows that see no key); more key blocks than query blocks; the chain order
	 * (Sk = 9000: 71 key blocks of 128, past a quarter of 132 SMs) with and without a mask */
	static const struct gcase wg_det[] = {
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4096, 4096, FA_MASK_NONE, 1, 4, 1, 1, 0, 1},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 1000, 3000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 2,
		 0, 0, 1},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, 3000, 1000, FA_MASK_CAUSAL_TOP_LEFT, 1, 6, 2, 1, 0,
		 1},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 96, 3000, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 0,
		 1, 1},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 80, 777, 2500, FA_MASK_NONE, 2, 3, 3, 1, 0, 1},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 40, 1000, 1000, FA_MASK_CAUSAL_TOP_LEFT, 1, 4, 2, 0, 0,
		 1},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 200, 9000, FA_MASK_NONE, 1, 2, 1, 0, 0, 1},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, 300, 9000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 1,
		 0, 1},
		/* the fixed point's other kernels: tf32 on attn_bwd_sm90_tf32.cu (GQA, a negative
		 * scale, Sq != Sk) and the fp32 bf16 staging on attn_bwd.cu */
		{FA_DTYPE_FP32, FA_PREC_TF32, 128, 1000, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 4, 2, 1,
		 0, 1},
		{FA_DTYPE_FP32, FA_PREC_TF32, 64, 777, 2500, FA_MASK_NONE, 2, 3, 3, 0, 1, 1},
		{FA_DTYPE_FP32, FA_PREC_BF16, 128, 500, 700, FA_MASK_NONE, 1, 2, 1, 0, 0, 1},
		/* 3xtf32 on attn_bwd_sm90_tf32.cu: the 64-bit fixed point */
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 64, 777, 2500, FA_MASK_NONE, 2, 3, 3, 0, 1, 1},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 40, 1000, 1000, FA_MASK_CAUSAL_TOP_LEFT, 1, 4, 2, 1, 0,
		 1},
	};
	for (size_t i = 0; i < sizeof wg_det / sizeof wg_det[0]; i++)
		cases[n++] = wg_det[i];
	/* the wgmma backward's wide form (head dims 136..256 on sm_90): deterministic, GQA and MQA,
	 * both masks, Sq != Sk both ways, both layouts, a negative scale, the padded head dims
	 * (136 and 200: 160 and 224) */
	static const struct gcase wide[] = {
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 1000, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 4, 2, 0,
		 0, 1},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 192, 129, 4097, FA_MASK_NONE, 2, 4, 1, 1, 0, 1},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 136, 1000, 17, FA_MASK_CAUSAL_TOP_LEFT, 1, 8, 2, 0, 0, 1},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 256, 4097, 129, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 1,
		 0, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 200, 127, 1000, FA_MASK_NONE, 2, 4, 4, 0, 1, 1},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 136, 17, 17, FA_MASK_CAUSAL_TOP_LEFT, 2, 2, 1, 1, 0, 0},
	};
	for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++)
		cases[n++] = wide[i];
	/* the fp32 wgmma backward (attn_bwd_sm90_tf32.cu on sm_90: by default tf32 64..128 and
	 * 3xtf32 64, FA_WGMMA32_BWD=1 wherever it fits; attn_bwd.cu otherwise): tf32 up to head
	 * dim 128 (64 query rows a step up to 64, 32 above; K^T padded
	 * at 40 and 96; dS beside the images at 8), 3xtf32 up to 64; GQA and MQA, both masks,
	 * Sq != Sk both ways, odd lengths, both layouts, a negative scale; the deterministic mode
	 * (attn_bwd.cu's, the next candidate); 3xtf32 at 128 (no tile fits: attn_bwd.cu) */
	static const struct gcase wg32[] = {
		{FA_DTYPE_FP32, FA_PREC_TF32, 128, 4097, 4097, FA_MASK_NONE, 1, 4, 1, 1, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 128, 1000, 3000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 2, 0, 0,
		 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 64, 3000, 1000, FA_MASK_CAUSAL_TOP_LEFT, 1, 6, 2, 1, 1, 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 96, 777, 2500, FA_MASK_NONE, 2, 3, 3, 1, 0, 1},
		{FA_DTYPE_FP32, FA_PREC_TF32, 8, 17, 17, FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 2, 1, 0, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 40, 129, 1000, FA_MASK_CAUSAL_TOP_LEFT, 1, 4, 4, 0, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 64, 4097, 4097, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 2, 1, 0,
		 0, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 64, 129, 1000, FA_MASK_NONE, 2, 4, 2, 1, 0, 1},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 40, 1000, 17, FA_MASK_CAUSAL_TOP_LEFT, 1, 8, 2, 0, 1, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 8, 1, 4097, FA_MASK_NONE, 2, 2, 2, 1, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 128, 1000, 1000, FA_MASK_NONE, 1, 4, 2, 0, 0, 0},
	};
	for (size_t i = 0; i < sizeof wg32 / sizeof wg32[0]; i++)
		cases[n++] = wg32[i];
	for (int a = 0; a < 6; a++)
		for (int di = 0; di < 9; di++)
			for (int m = 0; m < 3; m++) {
				int nl = full ? G_NLEN : (G_D[di] == 64 || G_D[di] == 128 ? 2 : 1);
				for (int li = 0; li < nl; li++, k++) {
					struct gcase c = {0};
					c.dt = G_DT[a];
					c.prec = G_PR[a];
					c.D = G_D[di];
					c.mask = G_MASK[m];
					int l = full ? li : (k * 5 + li * 7) % G_NLEN;
					c.Sq = G_LEN[l][0];
					c.Sk = G_LEN[l][1];
					set_heads(&c, k);
					c.bhsd = k % 2;
					c.det = full ? (k % 7 == 0) : (k % 11 == 0);
					cases[n++] = c;
				}
			}
	for (int a = 0; a < 6; a++) { /* a negative scale, every kind */
		struct gcase c = {G_DT[a], G_PR[a], 72, 129, 300, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 4, 2,
		                  a % 2, 1, 0};
		cases[n++] = c;
	}
	/* The sliding window and softcap (FA_WIN, FA_SOFTCAP): every kind, one- and two-sided
	 * windows alone and with both causal masks, Sq != Sk both ways (Sq > Sk: rows that see no
	 * key), lengths 1 to 4097, GQA and MQA, both layouts, the deterministic mode with windows. */
	static const struct gcase win_cases[] = {
		/* dt, prec, D, Sq, Sk, mask, B, Hq, Hkv, bhsd, neg, det, win, wl, wr, cap */
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 1000, 1000, FA_MASK_NONE, 1, 4, 2, 0, 0, 1, 1,
		 100, 100, 0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, 129, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 1, 1,
		 0, 1, 1, 64, -1, 0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 128, 1000, 1000, FA_MASK_CAUSAL_TOP_LEFT, 1, 2, 2, 0, 0,
		 1, 1, 255, 0, 0},
		{FA_DTYPE_FP32, FA_PREC_IEEE, 64, 17, 129, FA_MASK_NONE, 2, 2, 2, 1, 0, 0, 1, -1, 8, 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 128, 1000, 17, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 4, 2, 0, 0,
		 1, 1, 3, 3, 0},
		{FA_DTYPE_FP32, FA_PREC_BF16, 96, 129, 129, FA_MASK_NONE, 1, 2, 1, 1, 0, 0, 1, 16, 5,
		 5.0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 1, 1000, FA_MASK_NONE, 2, 8, 2, 0, 0, 0, 1, 300, 0,
		 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 1000, 1000, FA_MASK_NONE, 1, 2, 2, 1, 0, 1, 0, 0, 0,
		 20.0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 128, 1000, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 4, 4,
		 0, 0, 1, 1, 200, 0, 10.0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 256, 129, 1000, FA_MASK_NONE, 1, 2, 1, 0, 0, 0, 0, 0, 0,
		 5.0},
		{FA_DTYPE_FP32, FA_PREC_IEEE, 40, 1, 1, FA_MASK_NONE, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1.0},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 128, 4097, 4097, FA_MASK_CAUSAL_TOP_LEFT, 1, 2, 1, 1, 0,
		 1, 1, 512, 0, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 1000, 1000, FA_MASK_NONE, 1, 2, 2, 0, 0, 0, 1, 0, 0,
		 0},
		{FA_DTYPE_FP32, FA_PREC_TF32, 72, 129, 300, FA_MASK_NONE, 1, 4, 2, 0, 1, 0, 1, 8, 8, 2.0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 128, 17, 17, FA_MASK_CAUSAL_TOP_LEFT, 2, 2, 2, 0, 0, 1, 1,
		 -1, -1, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4097, 4097, FA_MASK_NONE, 1, 4, 1, 0, 0, 1, 1,
		 1024, 1024, 0},
		{FA_DTYPE_FP32, FA_PREC_IEEE, 128, 1000, 129, FA_MASK_NONE, 1, 4, 2, 1, 0, 1, 1, 20,
		 -1, 1.0},
		{FA_DTYPE_FP32, FA_PREC_BF16, 256, 17, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 2, 2, 0, 0,
		 1, 1, 500, 0, 0},
	};
	for (size_t i = 0; i < sizeof win_cases / sizeof win_cases[0]; i++)
		cases[n++] = win_cases[i];
	/* the window and softcap on the wgmma backward (attn_bwd_sm90.cu, 16-bit on sm_90: head
	 * dims 64..128 its narrow form, 192..256 its wide one): causal with a window, GQA and MQA,
	 * Sq != Sk both ways (Sq > Sk: rows that see no key) with odd lengths, one-sided windows,
	 * key blocks that no query sees (their dK, dV zero) and the deterministic chain counting
	 * from a query block's first key block */
	static const struct gcase wg_win[] = {
		/* dt, prec, D, Sq, Sk, mask, B, Hq, Hkv, bhsd, neg, det, win, wl, wr, cap */
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 1000, 3000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 8, 2,
		 0, 0, 1, 1, 255, 0, 0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 96, 777, 777, FA_MASK_NONE, 2, 4, 1, 1, 0, 0, 1, 100, 37,
		 15.0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 3001, 1000, FA_MASK_CAUSAL_TOP_LEFT, 1, 6, 2, 0, 0,
		 1, 1, 64, -1, 0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 80, 129, 4097, FA_MASK_NONE, 1, 2, 2, 0, 1, 0, 1, -1,
		 300, 5.0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 300, 5000, FA_MASK_NONE, 1, 4, 2, 1, 0, 1, 1, 10, 10,
		 0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 64, 1000, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 2, 4, 4, 0,
		 0, 0, 1, 1, -1, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 128, 4097, 4097, FA_MASK_NONE, 1, 2, 1, 0, 0, 1, 0, 0, 0,
		 50.0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 1000, 1000, FA_MASK_CAUSAL_BOTTOM_RIGHT, 1, 4, 2, 0,
		 0, 1, 1, 300, 0, 30.0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 192, 1500, 999, FA_MASK_NONE, 1, 4, 1, 1, 0, 0, 1, 128,
		 128, 0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 256, 129, 2049, FA_MASK_CAUSAL_TOP_LEFT, 2, 2, 1, 0, 0,
		 1, 1, 511, 0, 0},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 200, 17, 17, FA_MASK_NONE, 2, 2, 2, 0, 1, 0, 0, 0, 0,
		 2.0},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 224, 333, 4000, FA_MASK_NONE, 1, 2, 2, 1, 0, 1, 1, 20, 7,
		 10.0},
	};
	for (size_t i = 0; i < sizeof wg_win / sizeof wg_win[0]; i++)
		cases[n++] = wg_win[i];
	const char *wonly = getenv("FA_GPU_GRID_WIN"); /* 1: only the window and softcap cases */
	if (wonly && strcmp(wonly, "1") == 0) {
		int m = 0;
		for (int i = 0; i < n; i++)
			if (cases[i].win || cases[i].cap > 0)
				cases[m++] = cases[i];
		printf("FA_GPU_GRID_WIN=1: %d of %d cases\n", m, n);
		n = m;
	}
	const char *donly = getenv("FA_GPU_GRID_DET"); /* 1: only the deterministic cases */
	if (donly && strcmp(donly, "1") == 0) {
		int m = 0;
		for (int i = 0; i < n; i++)
			if (cases[i].det)
				cases[m++] = cases[i];
		printf("FA_GPU_GRID_DET=1: %d of %d cases\n", m, n);
		n = m;
	}
	const char *only = getenv("FA_GPU_GRID_D");
	if (only && *only) {
		int m = 0;
		char have[128];
		snprintf(have, sizeof have, " %.120s ", only);
		for (int i = 0; i < n; i++) {
			char want[16];
			snprintf(want, sizeof want, " %d ", cases[i].D);
			if (strstr(have, want))
				cases[m++] = cases[i];
		}
		printf("FA_GPU_GRID_D=%s: %d of %d cases\n", only, m, n);
		n = m;
	}
	const char *kinds = getenv("FA_GPU_GRID_DT");
	if (kinds && *kinds) {
		int m = 0;
		char have[128];
		snprintf(have, sizeof have, " %.120s ", kinds);
		for (int i = 0; i < n; i++) {
			char want[24];
			const int kind = fa_gpu_kind(cases[i].dt, cases[i].prec);
			snprintf(want, sizeof want, " %s ", fa_gpu_kind_name(kind));
			for (char *c = want + 1; c[1]; c++)
				if (*c == ' ')
					*c = '-';
			if (strstr(have, want))
				cases[m++] = cases[i];
		}
		printf("FA_GPU_GRID_DT=%s: %d of %d cases\n", kinds, m, n);
		n = m;
	}
	const char *shard = getenv("FA_GPU_GRID_SHARD"); /* "k/n": every n-th case from the k-th */
	int sk = 0, sn = 0;
	if (shard && sscanf(shard, "%d/%d", &sk, &sn) == 2 && sn > 0 && sk >= 0 && sk < sn) {
		int m = 0;
		for (int i = 0; i < n; i++)
			if (i % sn == sk)
				cases[m++] = cases[i];
		printf("FA_GPU_GRID_SHARD=%d/%d: %d of %d cases\n", sk, sn, m, n);
		n = m;
	} else if (shard && *shard) {
		fail_msg("FA_GPU_GRID_SHARD=%s: expected k/n with 0 <= k < n", shard);
	}
	uint64_t t0 = fa_test_now_ms();
	const char *vb = getenv("FA_GPU_VERBOSE");
	struct prep r = {.cases = cases, .n = n, .verbose = vb && strcmp(vb, "1") == 0};
	pthread_mutex_init(&r.lock, NULL);
	pthread_t th[8];
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, case_worker, &r);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	printf("%d cases, %d failed, %.1f s\n", ncases, nfail, (fa_test_now_ms() - t0) / 1e3);
	for (int s = 0; s < 6; s++)
		printf("  worst relative error %-12s dQ %.3g dK %.3g dV %.3g (tol %.0e)\n",
		       fa_gpu_kind_name(s), worst[s][0], worst[s][1], worst[s][2],
		       tol_of(G_DT[s], G_PR[s]));
	free(cases);
	assert_int_equal(nfail, 0);
}

/* Bad input is refused before anything runs: misaligned pointers and strides, a missing lse,
 * unknown flags, a tile that is not a backward one, the wgmma backward's tile for fp32 or off
 * sm_90 (with softcap it runs: attn_bwd_sm90.cu has FA_SOFTCAP). */
/* The fixed-point deterministic dQ (FA_DET 2: fp16, bf16, tf32; kernels/fa_device.cuh) holds a
 * row only while its parts fit the bound it derives from |dO_i|, |V| and |K| with the softmax
 * summing to 1. Where they do not (an lse far below the forward's, a NaN in Q) the row must come
 * out NaN, as the atomic mode's NaN or overflow would, never as wrapped integers; every other
 * row (of every batch) must still match the atomic mode. Run on the narrow and wide 16-bit wgmma
 * forms (D 64, 256), the tf32 one (D 64) and attn_bwd.cu (D 40) on sm_90, attn_bwd.cu elsewhere. */
static void test_attn_bwd_gpu_fixed_point_marks_rows_it_cannot_hold(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	static const struct gcase cs[] = {
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 256, 256, FA_MASK_NONE, 2, 2, 1, 0, 0, 1},
		{FA_DTYPE_FP16, FA_PREC_DEFAULT, 256, 200, 300, FA_MASK_CAUSAL_BOTTOM_RIGHT, 3, 2, 2, 1, 0, 1},
		{FA_DTYPE_FP32, FA_PREC_TF32, 64, 256, 256, FA_MASK_NONE, 2, 2, 1, 0, 0, 1},
		{FA_DTYPE_BF16, FA_PREC_DEFAULT, 40, 100, 300, FA_MASK_NONE, 2, 4, 2, 1, 0, 1},
		{FA_DTYPE_FP32, FA_PREC_3XTF32, 64, 256, 256, FA_MASK_NONE, 2, 2, 1, 0, 0, 1},
	};
	for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
		const struct gcase *c = &cs[ci];
		struct fa_attn_bwd_desc bd;
		make_desc(c, &bd);
		const size_t es = fa_dtype_size(c->dt);
		const size_t nq = (size_t)c->B * c->Sq * c->Hq * c->D;
		const size_t nk = (size_t)c->B * c->Sk * c->Hkv * c->D, nl = (size_t)c->B * c->Hq * c->Sq;
		struct hostbufs h = {.d = &bd};
		void *dq_det = malloc(nq * es);
		assert_non_null(dq_det);
		host_setup(&h, c->dt, nq, nk, nl);
		float *lse = h.lse;
		struct devbufs db = {0};
		char err[2048];
		if (dev_setup(&db, &h, nq, nk, nl, es, err, sizeof err) ||
		    fa_gpu_attn_fwd(gpu, &bd.fwd, db.q, db.k, db.v, db.o, db.lse, NULL, err,
		                    sizeof err) ||
		    fa_gpu_sync(gpu, err, sizeof err) ||
		    fa_gpu_download(gpu, lse, db.lse, nl * 4, err, sizeof err))
			fail_msg("setup: %s", err);
		/* row 7 of head 0: an lse 40 below the forward's (its softmax sums to e^40);
		 * row 11 of head 1: a NaN in Q */
		const int64_t bad_l = 7, bad_q = 11;
		lse[bad_l * bd.fwd.lse_stride[2]] -= 40.f;
		const int64_t qat = bad_q * bd.fwd.q_stride[1] + 1 * bd.fwd.q_stride[2] + 3;
		fa_store_elem(h.q, c->dt, qat, NAN);
		if (fa_gpu_upload(gpu, db.lse, lse, nl * 4, err, sizeof err) ||
		    fa_gpu_upload(gpu, db.q, h.q, nq * es, err, sizeof err))
			fail_msg("upload: %s", err);
		assert_int_equal(run_bwd(&bd, &db, nq, nk, es, FA_GPU_BWD_DETERMINISTIC, &h, err,
		                         sizeof err), FA_OK);
		memcpy(dq_det, h.dq, nq * es);
		assert_int_equal(run_bwd(&bd, &db, nq, nk, es, 0, &h, err, sizeof err), FA_OK);
		double num = 0, den = 0;
		int nan_rows = 0, finite_bad = 0;
		for (int64_t b = 0; b < c->B; b++)
		for (int64_t hq = 0; hq < c->Hq; hq++)
			for (int64_t i = 0; i < c->Sq; i++) {
				const bool marked = b == 0 && ((hq == 0 && i == bad_l) || (hq == 1 && i == bad_q));
				int nans = 0;
				for (int64_t e = 0; e < c->D; e++) {
					const int64_t at = b * bd.dq_stride[0] + i * bd.dq_stride[1] +
					                   hq * bd.dq_stride[2] + e;
					const double x = fa_load_elem(dq_det, c->dt, at);
					const double a = fa_load_elem(h.dq, c->dt, at);
					if (isnan(x))
						nans++;
					else if (!marked) {
						num += (x - a) * (x - a);
						den += a * a;
					}
				}
				if (marked && nans == c->D)
					nan_rows++;
				if (!marked && nans)
					finite_bad++;
			}
		const double rel = den > 0 ? sqrt(num / den) : 0;
		printf("%s D=%d %dx%d: marked rows NaN %d of 2, other rows with NaN %d, other rows "
		       "against atomic %.2e (tol %.0e)\n", fa_dtype_name(c->dt), c->D, c->Sq, c->Sk,
		       nan_rows, finite_bad, rel, tol_of(c->dt, c->prec));
		assert_int_equal(nan_rows, 2);
		assert_int_equal(finite_bad, 0);
		assert_true(rel <= tol_of(c->dt, c->prec));
		dev_free(&db);
		host_free(&h);
		free(dq_det);
	}
}

static void test_attn_bwd_gpu_rejects_bad_input(void **state)
{
	(void)state;
	if (!gpu) {
		printf("skipped: no GPU: %s\n", gpu_err);
		skip();
	}
	struct gcase c = {FA_DTYPE_BF16, FA_PREC_DEFAULT, 64, 16, 16, FA_MASK_NONE, 1, 1, 1, 0, 0, 0};
	struct fa_attn_bwd_desc d;
	make_desc(&c, &d);
	char err[512];
	CUdeviceptr m = 0;
	assert_int_equal(fa_gpu_alloc(gpu, 1 << 20, &m, err, sizeof err), FA_OK);
	struct fa_gpu_bwd_ptrs p = {m, m + 65536, m + 2 * 65536, m + 3 * 65536, m + 4 * 65536,
	                            m + 5 * 65536, m + 6 * 65536, m + 7 * 65536, m + 8 * 65536};
	d.dk_stride[1] = 68; /* 136 bytes */
	assert_int_equal(fa_gpu_attn_bwd(gpu, &d, &p, 0, NULL, err, sizeof err), FA_EALIGN);
	printf("misaligned: %s\n", err);
	make_desc(&c, &d);
	struct fa_gpu_bwd_ptrs p2 = p;
	p2.dq += 8;
	assert_int_equal(fa_gpu_attn_bwd(gpu, &d, &p2, 0, NULL, err, sizeof err), FA_EALIGN);
	p2 = p;
	p2.lse = 0;
	assert_int_equal(fa_gpu_attn_bwd(gpu, &d, &p2, 0, NULL, err, sizeof err), FA_EINVAL);
	printf("no lse: %s\n", err);
	assert_int_equal(fa_gpu_attn_bwd(gpu, &d, &p, 0x80, NULL, err, sizeof err), FA_EINVAL);
	struct fa_tile t = {0};
	t.path = FA_KPATH_16;
	t.nw = 4;
	t.rt = 1;
	t.br = 64;
	t.bc = 64;
	t.stages = 2;
	assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p, 0, NULL, err, sizeof err), FA_EINVAL);
	/* the wgmma backward's tile: fp16 / bf16 on sm_90 only; with softcap it takes it there */
	t.path = FA_KPATH_BWDWG16;
	t.nw = 8;
	t.bc = 128;
	struct gcase c32 = c;
	c32.dt = FA_DTYPE_FP32;
	struct fa_attn_bwd_desc d32;
	make_desc(&c32, &d32);
	assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d32, &t, &p, 0, NULL, err, sizeof err),
	                 FA_EINVAL);
	printf("wgmma tile for fp32: %s\n", err);
	d.fwd.softcap = 30.0;
	if (fa_gpu_sm(gpu) != 90)
		assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p, 0, NULL, err, sizeof err),
		                 FA_EINVAL);
	else
		assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p, FA_GPU_BWD_PREPARE, NULL, err,
		                                      sizeof err), FA_OK);
	d.fwd.softcap = 0;
	/* the fp32 wgmma backward's tile: fp32 of its precision only (deterministic in both: the
	 * fixed point, 32-bit in tf32, 64-bit in 3xtf32) */
	t.path = FA_KPATH_BWDWG32;
	t.nw = 4;
	t.bc = 64;
	t.br = 64;
	assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p, 0, NULL, err, sizeof err), FA_EINVAL);
	printf("fp32 wgmma tile on bf16: %s\n", err);
	struct gcase t32 = {FA_DTYPE_FP32, FA_PREC_TF32, 64, 16, 16, FA_MASK_NONE, 1, 1, 1, 0, 0, 0};
	make_desc(&t32, &d);
	if (fa_gpu_sm(gpu) == 90)
		assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p,
		                                      FA_GPU_BWD_DETERMINISTIC | FA_GPU_BWD_PREPARE, NULL,
		                                      err, sizeof err), FA_OK);
	t.path = FA_KPATH_BWDWG32X3; /* a 3xtf32 tile for tf32 */
	t.br = 32;
	assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p, 0, NULL, err, sizeof err), FA_EINVAL);
	/* and 3xtf32's deterministic dQ (64-bit fixed point) on its own tile; not with a window */
	struct gcase x32 = t32;
	x32.prec = FA_PREC_3XTF32;
	make_desc(&x32, &d);
	if (fa_gpu_sm(gpu) == 90)
		assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p,
		                                      FA_GPU_BWD_DETERMINISTIC | FA_GPU_BWD_PREPARE, NULL,
		                                      err, sizeof err), FA_OK);
	d.fwd.window = 1;
	d.fwd.window_left = 4;
	assert_int_equal(fa_gpu_attn_bwd_tile(gpu, &d, &t, &p, FA_GPU_BWD_DETERMINISTIC, NULL, err,
	                                      sizeof err), FA_EINVAL);
	printf("fp32 wgmma tile with a window: %s\n", err);
	assert_int_equal(fa_gpu_sync(gpu, err, sizeof err), FA_OK);
	fa_gpu_free(gpu, m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attn_bwd_gpu_matches_the_float64_reference),
		cmocka_unit_test(test_attn_bwd_gpu_fixed_point_marks_rows_it_cannot_hold),
		cmocka_unit_test(test_attn_bwd_gpu_rejects_bad_input),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
