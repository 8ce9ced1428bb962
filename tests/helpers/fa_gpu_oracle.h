/* fa_gpu_oracle.h - the forward GPU tests' random inputs and their float64 oracle for single
 * rows (test_attn_fwd_gpu, test_attn_decode_gpu, test_attn_window_gpu): large cases are checked
 * on sampled rows, each computed here from the descriptor alone, so the oracle is independent
 * of the kernels and of fa_attn_fwd_ref64's blocking.
 *
 * One oracle for all three: the row's keys are fa_attn_key_range's (the mask and the sliding
 * window), the scores capped when d->softcap > 0; with neither it is the plain masked softmax.
 * Header-only: static inline, no state (the caller owns its random state).
 */
#ifndef FA_GPU_ORACLE_H
#define FA_GPU_ORACLE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "fa_attn.h"
#include "fa_test.h"

/* n elements of dtype dt, uniform in [-amp, amp), from *rng. */
static inline void fa_gpu_fill_random(void *buf, fa_dtype dt, size_t n, double amp,
                                      uint64_t *rng)
{
	for (size_t i = 0; i < n; i++)
		fa_store_elem(buf, dt, (int64_t)i, amp * (2.0 * fa_rand_uniform(rng) - 1.0));
}

/* Query row i of (batch b, query head h) under d: o[D] and its logsumexp (-inf and O = 0 for a
 * row that sees no key). sc: scratch of d->Sk doubles. */
static inline void fa_gpu_oracle_row(const struct fa_attn_fwd_desc *d, const void *q,
                                     const void *k, const void *v, int64_t b, int64_t h,
                                     int64_t i, double *o, double *lse, double *sc)
{
	int64_t hk = h / (d->Hq / d->Hkv), lo, hi;
	fa_attn_key_range(d, d->Sq, d->Sk, i, &lo, &hi);
	double mx = -INFINITY;
	for (int64_t j = lo; j < hi; j++) {
		double s = 0;
		for (int64_t e = 0; e < d->D; e++)
			s += fa_load_elem(q, d->dtype, b * d->q_stride[0] + i * d->q_stride[1] +
			                                   h * d->q_stride[2] + e) *
			     fa_load_elem(k, d->dtype, b * d->k_stride[0] + j * d->k_stride[1] +
			                                   hk * d->k_stride[2] + e);
		s *= d->scale;
		if (d->softcap > 0)
			s = d->softcap * tanh(s / d->softcap);
		sc[j] = s;
		if (s > mx)
			mx = s;
	}
	for (int64_t e = 0; e < d->D; e++)
		o[e] = 0;
	if (hi <= lo) {
		*lse = -INFINITY;
		return;
	}
	double l = 0;
	for (int64_t j = lo; j < hi; j++) {
		double p = exp(sc[j] - mx);
		l += p;
		for (int64_t e = 0; e < d->D; e++)
			o[e] += p * fa_load_elem(v, d->dtype, b * d->v_stride[0] + j * d->v_stride[1] +
			                                          hk * d->v_stride[2] + e);
	}
	for (int64_t e = 0; e < d->D; e++)
		o[e] /= l;
	*lse = mx + log(l);
}

/* One thread's share of the sampled rows of a launch: rows first, first + step, ... of rows
 * (triples b, h, i), compared with the GPU's o and lse. Sums the squared error and the
 * reference's square (num, den: the relative Frobenius error), the worst lse error, and sets
 * bad for a non-finite output or an lse that disagrees on -inf. */
struct fa_gpu_sample_job {
	const struct fa_attn_fwd_desc *d;
	const void *q, *k, *v, *o;
	const float *lse;
	const int64_t *rows; /* triples b, h, i */
	int nrows, first, step;
	double num, den, lse_err;
	bool bad;
};

/* pthread entry: arg is a struct fa_gpu_sample_job. */
static inline void *fa_gpu_sample_worker(void *arg)
{
	struct fa_gpu_sample_job *j = arg;
	const struct fa_attn_fwd_desc *d = j->d;
	double *o = malloc(sizeof(double) * (size_t)d->D), *sc = malloc(sizeof(double) * (size_t)d->Sk);
	for (int r = j->first; r < j->nrows; r += j->step) {
		int64_t b = j->rows[3 * r], h = j->rows[3 * r + 1], i = j->rows[3 * r + 2];
		double lse;
		fa_gpu_oracle_row(d, j->q, j->k, j->v, b, h, i, o, &lse, sc);
		for (int64_t e = 0; e < d->D; e++) {
			double x = fa_load_elem(j->o, d->dtype, b * d->o_stride[0] + i * d->o_stride[1] +
			                                            h * d->o_stride[2] + e);
			if (!isfinite(x))
				j->bad = true;
			j->num += (x - o[e]) * (x - o[e]);
			j->den += o[e] * o[e];
		}
		float gl = j->lse[b * d->lse_stride[0] + h * d->lse_stride[1] + i * d->lse_stride[2]];
		if (isinf(lse) && lse < 0) {
			if (!(isinf(gl) && gl < 0))
				j->bad = true;
		} else if (!isfinite(gl)) {
			j->bad = true;
		} else if (fabs(gl - lse) > j->lse_err) {
			j->lse_err = fabs(gl - lse);
		}
	}
	free(o);
	free(sc);
	return NULL;
}

#endif /* FA_GPU_ORACLE_H */
