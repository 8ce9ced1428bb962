/* fa_case.h - one attention problem as the end-to-end tests, the demo and the benchmark see it:
 * a shape, its tensors laid out in one client buffer, random inputs, poisoned outputs, and the
 * check against the float64 CPU reference (kernels/fa_attn.h).
 *
 * Header-only on purpose: the helpers' .c files are linked into every test program and must stay
 * libc-only, while this needs libfaclient and libfakernels, which only the integration tests,
 * the demo and the benchmarks link.
 */
#ifndef FA_CASE_H
#define FA_CASE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fa/fa_client.h"
#include "fa_attn.h"
#include "fa_test.h"

/* A forward problem and how its tensors sit in memory. */
struct fa_case {
	fa_dtype dtype;
	int64_t B, Sq, Sk, Hq, Hkv, D;
	fa_mask mask;
	double scale;           /* 0: the default 1/sqrt(D) */
	bool lse;               /* ask for the logsumexp */
	bool bhsd;              /* [B, H, S, D] in memory instead of [B, S, H, D] */
	int64_t pad;            /* extra elements after each head row (a multiple of 8 keeps alignment) */
	fa_precision precision; /* fp32 only */
};

/* Byte offsets in the buffer and element strides of each tensor; spans in elements. */
struct fa_case_layout {
	uint64_t q_off, k_off, v_off, o_off, lse_off;
	int64_t q_stride[4], kv_stride[4], o_stride[4], lse_stride[4];
	int64_t q_span, kv_span, o_span, lse_span;
	size_t total; /* bytes the buffer needs */
};

#define FA_CASE_ALIGN 256
#define FA_CASE_BASE 64 /* the first tensor is not at offset 0, so offsets are exercised */

static inline uint64_t fa_case_round_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

/* Relative Frobenius tolerance for a dtype against the float64 reference (ARCHITECTURE.md). */
static inline double fa_case_tol(fa_dtype dt)
{
	switch (dt) {
	case FA_DTYPE_FP32: return 1e-5;
	case FA_DTYPE_BF16: return 1e-2;
	default: return 2e-3;
	}
}

/* Elements one tensor reaches: 1 + sum (shape_i - 1) * stride_i. */
static inline int64_t fa_case_span(const int64_t shape[4], const int64_t stride[4])
{
	int64_t s = 1;
	for (int i = 0; i < 4; i++)
		s += (shape[i] - 1) * stride[i];
	return s;
}

/* Strides of a [B, S, H, D] tensor in the case's layout. */
static inline void fa_case_strides(const struct fa_case *c, int64_t S, int64_t H, int64_t st[4])
{
	int64_t row = c->D + c->pad;
	if (c->bhsd) {
		st[0] = H * S * row;
		st[1] = row;
		st[2] = S * row;
	} else {
		st[0] = S * H * row;
		st[1] = H * row;
		st[2] = row;
	}
	st[3] = 1;
}

/* Lay Q, K, V, O (and lse) out one after another, each aligned, in one buffer. */
static inline void fa_case_layout(const struct fa_case *c, struct fa_case_layout *l)
{
	size_t es = fa_dtype_size(c->dtype);
	int64_t qshape[4] = {c->B, c->Sq, c->Hq, c->D}, kshape[4] = {c->B, c->Sk, c->Hkv, c->D};
	int64_t lshape[4] = {c->B, c->Hq, c->Sq, 1};
	memset(l, 0, sizeof *l);
	fa_case_strides(c, c->Sq, c->Hq, l->q_stride);
	fa_case_strides(c, c->Sk, c->Hkv, l->kv_stride);
	memcpy(l->o_stride, l->q_stride, sizeof l->o_stride);
	l->lse_stride[0] = c->Hq * c->Sq;
	l->lse_stride[1] = c->Sq;
	l->lse_stride[2] = 1;
	l->lse_stride[3] = 1;
	l->q_span = fa_case_span(qshape, l->q_stride);
	l->kv_span = fa_case_span(kshape, l->kv_stride);
	l->o_span = l->q_span;
	l->lse_span = fa_case_span(lshape, l->lse_stride);
	uint64_t off = FA_CASE_BASE;
	l->q_off = off;
	off = fa_case_round_up(off + (uint64_t)l->q_span * es, FA_CASE_ALIGN);
	l->k_off = off;
	off = fa_case_round_up(off + (uint64_t)l->kv_span * es, FA_CASE_ALIGN);
	l->v_off = off;
	off = fa_case_round_up(off + (uint64_t)l->kv_span * es, FA_CASE_ALIGN);
	l->o_off = off;
	off = fa_case_round_up(off + (uint64_t)l->o_span * es, FA_CASE_ALIGN);
	l->lse_off = off;
	if (c->lse)
		off = fa_case_round_up(off + (uint64_t)l->lse_span * 4, FA_CASE_ALIGN);
	l->total = (size_t)off;
}

/* A tensor descriptor for the API. */
static inline fa_tensor fa_case_tensor(fa_buffer *b, uint64_t off, fa_dtype dt, int64_t s0,
                                       int64_t s1, int64_t s2, int64_t s3, const int64_t st[4])
{
	fa_tensor t;
	memset(&t, 0, sizeof t);
	t.buf = b;
	t.offset = off;
	t.dtype = dt;
	t.shape[0] = s0;
	t.shape[1] = s1;
	t.shape[2] = s2;
	t.shape[3] = s3;
	memcpy(t.stride, st, sizeof t.stride);
	return t;
}

/* The API arguments of a case whose tensors live in buffer b at layout l. */
static inline void fa_case_args(const struct fa_case *c, const struct fa_case_layout *l,
                                fa_buffer *b, fa_attn_fwd_args *a)
{
	memset(a, 0, sizeof *a);
	a->q = fa_case_tensor(b, l->q_off, c->dtype, c->B, c->Sq, c->Hq, c->D, l->q_stride);
	a->k = fa_case_tensor(b, l->k_off, c->dtype, c->B, c->Sk, c->Hkv, c->D, l->kv_stride);
	a->v = fa_case_tensor(b, l->v_off, c->dtype, c->B, c->Sk, c->Hkv, c->D, l->kv_stride);
	a->o = fa_case_tensor(b, l->o_off, c->dtype, c->B, c->Sq, c->Hq, c->D, l->o_stride);
	if (c->lse)
		a->lse = fa_case_tensor(b, l->lse_off, FA_DTYPE_FP32, c->B, c->Hq, c->Sq, 1,
		                        l->lse_stride);
	a->scale = c->scale;
	a->mask = c->mask;
	a->precision = c->precision;
}

/* The reference's descriptor for the same problem (scale resolved as the daemon does). */
static inline void fa_case_desc(const struct fa_case *c, const struct fa_case_layout *l,
                                struct fa_attn_fwd_desc *d)
{
	memset(d, 0, sizeof *d);
	d->dtype = c->dtype;
	d->precision = c->precision;
	d->mask = c->mask;
	d->scale = c->scale != 0 ? c->scale : 1.0 / sqrt((double)c->D);
	d->B = c->B;
	d->Sq = c->Sq;
	d->Sk = c->Sk;
	d->Hq = c->Hq;
	d->Hkv = c->Hkv;
	d->D = c->D;
	for (int i = 0; i < 3; i++) {
		d->q_stride[i] = l->q_stride[i];
		d->k_stride[i] = l->kv_stride[i];
		d->v_stride[i] = l->kv_stride[i];
		d->o_stride[i] = l->o_stride[i];
		d->lse_stride[i] = l->lse_stride[i];
	}
}

/* Fill n elements of dtype dt with random values in [-1, 1). */
static inline void fa_case_fill_dt(void *p, fa_dtype dt, size_t n, uint64_t *rng)
{
	if (dt == FA_DTYPE_FP32)
		fa_fill_f32(p, n, rng, -1.0f, 1.0f);
	else if (dt == FA_DTYPE_BF16)
		fa_fill_bf16(p, n, rng, -1.0f, 1.0f);
	else
		fa_fill_f16(p, n, rng, -1.0f, 1.0f);
}

/* NaN in every element of the output's span (the padding included), so rows the daemon does
 * not write, and writes outside the tensor, are caught. */
static inline void fa_case_poison_dt(void *p, fa_dtype dt, size_t n)
{
	if (dt == FA_DTYPE_FP32)
		fa_poison_f32(p, n);
	else if (dt == FA_DTYPE_BF16)
		fa_poison_bf16(p, n);
	else
		fa_poison_f16(p, n);
}

/* Random Q, K, V; poisoned O and lse. data is the buffer's mapping. */
static inline void fa_case_fill(const struct fa_case *c, const struct fa_case_layout *l,
                                void *data, uint64_t *rng)
{
	char *b = data;
	fa_case_fill_dt(b + l->q_off, c->dtype, (size_t)l->q_span, rng);
	fa_case_fill_dt(b + l->k_off, c->dtype, (size_t)l->kv_span, rng);
	fa_case_fill_dt(b + l->v_off, c->dtype, (size_t)l->kv_span, rng);
	fa_case_poison_dt(b + l->o_off, c->dtype, (size_t)l->o_span);
	if (c->lse)
		fa_poison_f32((float *)(void *)(b + l->lse_off), (size_t)l->lse_span);
}

/* Is element i of an array of dt still the poison NaN? */
static inline bool fa_case_is_poison(const void *base, fa_dtype dt, int64_t i)
{
	if (dt == FA_DTYPE_FP32)
		return isnan(((const float *)base)[i]);
	uint16_t v = ((const uint16_t *)base)[i];
	return dt == FA_DTYPE_BF16 ? v == 0x7fc0u : v == 0x7e00u;
}

/* A one-line description, for failure messages. */
static inline void fa_case_describe(const struct fa_case *c, char *out, size_t cap)
{
	static const char *const masks[] = {"none", "causal-br", "causal-tl"};
	snprintf(out, cap,
	         "%s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld mask=%s scale=%g lse=%d %s pad=%lld",
	         fa_dtype_name(c->dtype), (long long)c->B, (long long)c->Sq, (long long)c->Sk,
	         (long long)c->Hq, (long long)c->Hkv, (long long)c->D,
	         (unsigned)c->mask < 3 ? masks[c->mask] : "?", c->scale, (int)c->lse,
	         c->bhsd ? "bhsd" : "bshd", (long long)c->pad);
}

/* Floating-point operations of the forward pass: 4 * D per (query, visible key) pair and head. */
static inline double fa_case_flops(const struct fa_case *c)
{
	double pairs = 0;
	for (int64_t i = 0; i < c->Sq; i++) {
		int64_t lim = c->mask == FA_MASK_CAUSAL_BOTTOM_RIGHT ? i + c->Sk - c->Sq
		              : c->mask == FA_MASK_CAUSAL_TOP_LEFT    ? i
		                                                      : c->Sk - 1;
		if (lim >= c->Sk)
			lim = c->Sk - 1;
		if (lim >= 0)
			pairs += (double)(lim + 1);
	}
	return 4.0 * (double)c->B * (double)c->Hq * (double)c->D * pairs;
}

/* Check O (and lse) in the buffer against the float64 reference, and that nothing in O's span
 * outside the tensor was written. Returns true when it passes; *err_out gets the relative error
 * (may be NULL) and why says what failed. */
static inline bool fa_case_check(const struct fa_case *c, const struct fa_case_layout *l,
                                 const void *data, double *err_out, char *why, size_t whycap)
{
	const char *b = data;
	struct fa_attn_fwd_desc d;
	fa_case_desc(c, l, &d);
	size_t n = (size_t)(c->B * c->Sq * c->Hq * c->D), nl = (size_t)(c->B * c->Hq * c->Sq);
	double *o64 = malloc(n * sizeof *o64), *lse64 = malloc(nl * sizeof *lse64);
	bool ok = true;
	if (why && whycap)
		why[0] = '\0';
	if (!o64 || !lse64) {
		snprintf(why, whycap, "out of memory");
		free(o64);
		free(lse64);
		return false;
	}
	fa_attn_fwd_ref64(&d, b + l->q_off, b + l->k_off, b + l->v_off, o64, lse64);
	double err = fa_attn_fwd_rel_error(&d, b + l->o_off, o64);
	if (err_out)
		*err_out = err;
	if (!(err <= fa_case_tol(c->dtype))) {
		snprintf(why, whycap, "O: relative error %.3g > %.3g", err, fa_case_tol(c->dtype));
		ok = false;
	}
	if (ok) {
		/* The Frobenius norm forgives one bad element among many: each element gets a bound
		 * too, a few units in the last place of the dtype plus a floor against the largest
		 * reference value (a GPU's fp32 accumulation stays well inside it). */
		double rtol = c->dtype == FA_DTYPE_FP32 ? 1e-5 : c->dtype == FA_DTYPE_BF16 ? 3e-2 : 4e-3;
		double atol = c->dtype == FA_DTYPE_FP32 ? 1e-5 : c->dtype == FA_DTYPE_BF16 ? 1.5e-2 : 2e-3;
		double amax = 0;
		for (size_t i = 0; i < n; i++)
			amax = fmax(amax, fabs(o64[i]));
		for (int64_t bb = 0; ok && bb < c->B; bb++)
			for (int64_t s = 0; ok && s < c->Sq; s++)
				for (int64_t h = 0; ok && h < c->Hq; h++)
					for (int64_t e = 0; ok && e < c->D; e++) {
						double ref = o64[((bb * c->Sq + s) * c->Hq + h) * c->D + e];
						double got = fa_load_elem(b + l->o_off, c->dtype,
						                          bb * l->o_stride[0] + s * l->o_stride[1] +
						                              h * l->o_stride[2] + e);
						if (!(fabs(got - ref) <= rtol * fabs(ref) + atol * amax)) {
							snprintf(why, whycap,
							         "O[b=%lld s=%lld h=%lld d=%lld] = %.9g, want %.9g",
							         (long long)bb, (long long)s, (long long)h, (long long)e,
							         got, ref);
							ok = false;
						}
					}
	}
	if (ok && c->lse) {
		const float *lse = (const float *)(const void *)(b + l->lse_off);
		for (int64_t bb = 0; ok && bb < c->B; bb++)
			for (int64_t h = 0; ok && h < c->Hq; h++)
				for (int64_t s = 0; ok && s < c->Sq; s++) {
					double ref = lse64[(bb * c->Hq + h) * c->Sq + s];
					double got = lse[bb * l->lse_stride[0] + h * l->lse_stride[1] +
					                 s * l->lse_stride[2]];
					bool same = isinf(ref) ? got == ref
					                       : fabs(got - ref) <= 1e-3 * fmax(1.0, fabs(ref));
					if (!same) {
						snprintf(why, whycap, "lse[b=%lld h=%lld s=%lld] = %.9g, want %.9g",
						         (long long)bb, (long long)h, (long long)s, got, ref);
						ok = false;
					}
				}
	}
	if (ok && (c->pad > 0 || c->bhsd)) {
		/* The elements of O's span that belong to no (b, s, h, d) must still hold the poison. */
		unsigned char *mine = calloc((size_t)l->o_span, 1);
		if (mine) {
			for (int64_t bb = 0; bb < c->B; bb++)
				for (int64_t s = 0; s < c->Sq; s++)
					for (int64_t h = 0; h < c->Hq; h++)
						memset(mine + bb * l->o_stride[0] + s * l->o_stride[1] +
						           h * l->o_stride[2],
						       1, (size_t)c->D);
			for (int64_t i = 0; ok && i < l->o_span; i++)
				if (!mine[i] && !fa_case_is_poison(b + l->o_off, c->dtype, i)) {
					snprintf(why, whycap, "O: element %lld of the padding was written",
					         (long long)i);
					ok = false;
				}
			free(mine);
		}
	}
	free(o64);
	free(lse64);
	return ok;
}

/* A random case of bounded work (B*Hq*Sq*Sk*D <= max_work): every dtype, head dims from
 * {8, 40, 64, 128, 256}, Sq != Sk, Sq or Sk = 1, both causal alignments, GQA 1/2/4, both
 * layouts, padding, scale, lse on and off. */
static inline void fa_case_random(struct fa_case *c, uint64_t *rng, int64_t max_s,
                                  double max_work)
{
	static const int64_t dims[] = {8, 40, 64, 128, 256};
	static const int64_t ratios[] = {1, 2, 4};
	memset(c, 0, sizeof *c);
	c->dtype = (fa_dtype)fa_rand_range(rng, 1, 3);
	c->D = dims[fa_rand_range(rng, 0, 4)];
	c->Hkv = fa_rand_range(rng, 1, 2);
	c->Hq = c->Hkv * ratios[fa_rand_range(rng, 0, 2)];
	c->B = fa_rand_range(rng, 1, 2);
	switch (fa_rand_range(rng, 0, 5)) {
	case 0: c->Sq = 1; c->Sk = fa_rand_range(rng, 1, max_s); break;
	case 1: c->Sq = fa_rand_range(rng, 1, max_s); c->Sk = 1; break;
	case 2: c->Sq = c->Sk = fa_rand_range(rng, 1, max_s); break;
	default:
		c->Sq = fa_rand_range(rng, 1, max_s);
		c->Sk = fa_rand_range(rng, 1, max_s);
		break;
	}
	c->mask = (fa_mask)fa_rand_range(rng, 0, 2);
	c->scale = fa_rand_range(rng, 0, 1) ? 0.0 : 0.05 + 0.45 * fa_rand_uniform(rng);
	c->lse = fa_rand_range(rng, 0, 1);
	c->bhsd = fa_rand_range(rng, 0, 1);
	c->pad = fa_rand_range(rng, 0, 3) == 0 ? 8 : 0;
	/* fp32: the precisions held to fp32-level error (1e-5); tf32 and bf16 staging are not. */
	static const fa_precision precs[] = {FA_PREC_DEFAULT, FA_PREC_IEEE, FA_PREC_3XTF32};
	c->precision = c->dtype == FA_DTYPE_FP32 ? precs[fa_rand_range(rng, 0, 2)] : FA_PREC_DEFAULT;
	while ((double)(c->B * c->Hq * c->Sq * c->Sk * c->D) > max_work) {
		if (c->Sq >= c->Sk && c->Sq > 1)
			c->Sq = (c->Sq + 1) / 2;
		else if (c->Sk > 1)
			c->Sk = (c->Sk + 1) / 2;
		else if (c->Hq > c->Hkv)
			c->Hq /= 2;
		else
			break;
	}
}

#endif /* FA_CASE_H */
