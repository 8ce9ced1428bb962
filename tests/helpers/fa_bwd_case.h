/* fa_bwd_case.h - one backward problem as the end-to-end tests and the demo see it: a forward
 * case (fa_case.h) whose nine tensors (q, k, v, o, lse, dout, dq, dk, dv) lie in one client
 * buffer, random inputs and upstream gradient, poisoned outputs, and the check of dQ, dK, dV
 * against the float64 oracle (kernels/fa_attn_bwd.h, fa_attn_bwd_ref64).
 *
 * Header-only, like fa_case.h: it needs libfaclient and libfakernels.
 */
#ifndef FA_BWD_CASE_H
#define FA_BWD_CASE_H

#include "fa_attn_bwd.h"
#include "fa_case.h"

/* The forward's layout (lse always) and, after it, dout like q, dq like q, dk and dv like k. */
struct fa_bwd_layout {
	struct fa_case_layout f;
	uint64_t do_off, dq_off, dk_off, dv_off;
	size_t total; /* bytes the buffer needs */
};

/* The case with lse on: the backward always needs it. */
static inline struct fa_case fa_bwd_fwd_case(const struct fa_case *c)
{
	struct fa_case f = *c;
	f.lse = true;
	return f;
}

static inline void fa_bwd_layout(const struct fa_case *c, struct fa_bwd_layout *l)
{
	struct fa_case f = fa_bwd_fwd_case(c);
	size_t es = fa_dtype_size(c->dtype);
	memset(l, 0, sizeof *l);
	fa_case_layout(&f, &l->f);
	uint64_t off = fa_case_round_up(l->f.total, FA_CASE_ALIGN);
	l->do_off = off;
	off = fa_case_round_up(off + (uint64_t)l->f.q_span * es, FA_CASE_ALIGN);
	l->dq_off = off;
	off = fa_case_round_up(off + (uint64_t)l->f.q_span * es, FA_CASE_ALIGN);
	l->dk_off = off;
	off = fa_case_round_up(off + (uint64_t)l->f.kv_span * es, FA_CASE_ALIGN);
	l->dv_off = off;
	off = fa_case_round_up(off + (uint64_t)l->f.kv_span * es, FA_CASE_ALIGN);
	l->total = (size_t)off;
}

/* The forward's arguments (it writes o and lse) and the backward's, in buffer b. */
static inline void fa_bwd_args(const struct fa_case *c, const struct fa_bwd_layout *l,
                               fa_buffer *b, unsigned flags, fa_attn_fwd_args *fwd,
                               fa_attn_bwd_args *bwd)
{
	struct fa_case f = fa_bwd_fwd_case(c);
	fa_case_args(&f, &l->f, b, fwd);
	memset(bwd, 0, sizeof *bwd);
	bwd->q = fwd->q;
	bwd->k = fwd->k;
	bwd->v = fwd->v;
	bwd->o = fwd->o;
	bwd->lse = fwd->lse;
	bwd->dout = fa_case_tensor(b, l->do_off, c->dtype, c->B, c->Sq, c->Hq, c->D, l->f.q_stride);
	bwd->dq = fa_case_tensor(b, l->dq_off, c->dtype, c->B, c->Sq, c->Hq, c->D, l->f.q_stride);
	bwd->dk = fa_case_tensor(b, l->dk_off, c->dtype, c->B, c->Sk, c->Hkv, c->D, l->f.kv_stride);
	bwd->dv = fa_case_tensor(b, l->dv_off, c->dtype, c->B, c->Sk, c->Hkv, c->D, l->f.kv_stride);
	bwd->scale = c->scale;
	bwd->mask = c->mask;
	bwd->precision = c->precision;
	bwd->flags = flags;
}

/* The oracle's descriptor (the forward's with the gradients' strides). */
static inline void fa_bwd_desc(const struct fa_case *c, const struct fa_bwd_layout *l,
                               struct fa_attn_bwd_desc *d)
{
	struct fa_case f = fa_bwd_fwd_case(c);
	memset(d, 0, sizeof *d);
	fa_case_desc(&f, &l->f, &d->fwd);
	for (int i = 0; i < 3; i++) {
		d->do_stride[i] = l->f.q_stride[i];
		d->dq_stride[i] = l->f.q_stride[i];
		d->dk_stride[i] = l->f.kv_stride[i];
		d->dv_stride[i] = l->f.kv_stride[i];
	}
}

/* Random q, k, v and dout; poisoned o, lse, dq, dk, dv (every element of their spans). */
static inline void fa_bwd_fill(const struct fa_case *c, const struct fa_bwd_layout *l,
                               void *data, uint64_t *rng)
{
	struct fa_case f = fa_bwd_fwd_case(c);
	char *b = data;
	fa_case_fill(&f, &l->f, data, rng);
	fa_case_fill_dt(b + l->do_off, c->dtype, (size_t)l->f.q_span, rng);
	fa_case_poison_dt(b + l->dq_off, c->dtype, (size_t)l->f.q_span);
	fa_case_poison_dt(b + l->dk_off, c->dtype, (size_t)l->f.kv_span);
	fa_case_poison_dt(b + l->dv_off, c->dtype, (size_t)l->f.kv_span);
}

/* Relative Frobenius tolerance of a gradient against the oracle fed the exact forward: the
 * forward's O rounded to the dtype (and fp32 lse) is what the backward reads, so 16-bit dtypes
 * get twice the forward's bound. */
static inline double fa_bwd_tol(fa_dtype dt)
{
	return dt == FA_DTYPE_FP32 ? 1e-5 : 2.0 * fa_case_tol(dt);
}

/* One gradient [B, S, H, D] at `base` with strides st against dense g64: the relative
 * Frobenius error (0 when both are all zero; +inf with a NaN), and whether every element of its
 * span outside the tensor still holds the poison. */
static inline double fa_bwd_grad_error(const struct fa_case *c, const void *base, int64_t S,
                                       int64_t H, const int64_t st[4], int64_t span,
                                       const double *g64, bool *padding_ok)
{
	double num = 0, den = 0;
	bool nan = false;
	unsigned char *mine = calloc((size_t)span, 1);
	for (int64_t b = 0; b < c->B; b++)
		for (int64_t s = 0; s < S; s++)
			for (int64_t h = 0; h < H; h++)
				for (int64_t e = 0; e < c->D; e++) {
					int64_t at = b * st[0] + s * st[1] + h * st[2] + e;
					double got = fa_load_elem(base, c->dtype, at);
					double ref = g64[((b * S + s) * H + h) * c->D + e];
					if (isnan(got))
						nan = true;
					num += (got - ref) * (got - ref);
					den += ref * ref;
					if (mine)
						mine[at] = 1;
				}
	*padding_ok = mine != NULL;
	for (int64_t i = 0; mine && i < span; i++)
		if (!mine[i] && !fa_case_is_poison(base, c->dtype, i))
			*padding_ok = false;
	free(mine);
	if (nan)
		return INFINITY;
	if (den == 0)
		return num == 0 ? 0 : INFINITY;
	return sqrt(num / den);
}

/* Check dq, dk, dv in the buffer. The oracle: fa_attn_fwd_ref64 of q, k, v gives the exact O and
 * lse, fa_attn_bwd_ref64 the exact gradients, each gradient within fa_bwd_tol. With `tight` also
 * against the oracle fed the O and lse the buffer holds (what the daemon's backward read), within
 * `tight` (the CPU backend: the final rounding only). err_out[3] (may be NULL) gets the errors
 * against the exact oracle. `win` (may be NULL: off) gives the sliding window and softcap the
 * calls got (its window and softcap fields only). Returns true when it passes; why says what
 * failed. */
static inline bool fa_bwd_check_win(const struct fa_case *c, const struct fa_bwd_layout *l,
                                    const void *data, const struct fa_attn_fwd_desc *win,
                                    double tight, double err_out[3], char *why, size_t whycap)
{
	const char *b = data;
	struct fa_attn_bwd_desc d;
	fa_bwd_desc(c, l, &d);
	if (win != NULL) {
		d.fwd.window = win->window;
		d.fwd.window_left = win->window_left;
		d.fwd.window_right = win->window_right;
		d.fwd.softcap = win->softcap;
	}
	size_t nq = (size_t)(c->B * c->Sq * c->Hq * c->D), nk = (size_t)(c->B * c->Sk * c->Hkv * c->D);
	size_t nl = (size_t)(c->B * c->Hq * c->Sq);
	double *o64 = malloc(nq * sizeof(double)), *lse64 = malloc(nl * sizeof(double));
	double *g[3] = {malloc(nq * sizeof(double)), malloc(nk * sizeof(double)),
	                malloc(nk * sizeof(double))};
	static const char *const names[3] = {"dq", "dk", "dv"};
	const uint64_t offs[3] = {l->dq_off, l->dk_off, l->dv_off};
	const int64_t S[3] = {c->Sq, c->Sk, c->Sk}, H[3] = {c->Hq, c->Hkv, c->Hkv};
	const int64_t *st[3] = {l->f.q_stride, l->f.kv_stride, l->f.kv_stride};
	const int64_t span[3] = {l->f.q_span, l->f.kv_span, l->f.kv_span};
	bool ok = true;
	fa_status s;

	if (why && whycap)
		why[0] = '\0';
	if (!o64 || !lse64 || !g[0] || !g[1] || !g[2]) {
		snprintf(why, whycap, "out of memory");
		ok = false;
		goto out;
	}
	for (int pass = 0; ok && pass < (tight > 0 ? 2 : 1); pass++) {
		if (pass == 0) {
			s = fa_attn_fwd_ref64(&d.fwd, b + l->f.q_off, b + l->f.k_off, b + l->f.v_off, o64,
			                      lse64);
		} else {
			/* What the daemon's backward read: O in the dtype, lse in fp32. */
			s = FA_OK;
			for (int64_t bb = 0; bb < c->B; bb++)
				for (int64_t q = 0; q < c->Sq; q++)
					for (int64_t h = 0; h < c->Hq; h++) {
						for (int64_t e = 0; e < c->D; e++)
							o64[((bb * c->Sq + q) * c->Hq + h) * c->D + e] = fa_load_elem(
							    b + l->f.o_off, c->dtype,
							    bb * l->f.o_stride[0] + q * l->f.o_stride[1] +
							        h * l->f.o_stride[2] + e);
						lse64[(bb * c->Hq + h) * c->Sq + q] = ((const float *)(const void *)(
						    b + l->f.lse_off))[bb * l->f.lse_stride[0] + h * l->f.lse_stride[1] +
						                       q * l->f.lse_stride[2]];
					}
		}
		if (s == FA_OK)
			s = fa_attn_bwd_ref64(&d, b + l->f.q_off, b + l->f.k_off, b + l->f.v_off, o64,
			                      b + l->do_off, lse64, g[0], g[1], g[2]);
		if (s != FA_OK) {
			snprintf(why, whycap, "the oracle failed: %s", fa_status_name(s));
			ok = false;
			break;
		}
		double tol = pass == 0 ? fa_bwd_tol(c->dtype) : tight;
		for (int i = 0; ok && i < 3; i++) {
			bool pad_ok;
			double e = fa_bwd_grad_error(c, b + offs[i], S[i], H[i], st[i], span[i], g[i],
			                             &pad_ok);
			if (pass == 0 && err_out)
				err_out[i] = e;
			if (!(e <= tol)) {
				snprintf(why, whycap, "%s: relative error %.3g > %.3g (against the %s)",
				         names[i], e, tol,
				         pass == 0 ? "exact gradients" : "oracle fed the daemon's O and lse");
				ok = false;
			} else if (!pad_ok) {
				snprintf(why, whycap, "%s: an element of its padding was written",
				         names[i]);
				ok = false;
			}
		}
	}
out:
	free(o64);
	free(lse64);
	for (int i = 0; i < 3; i++)
		free(g[i]);
	return ok;
}

/* fa_bwd_check_win without a window or softcap. */
static inline bool fa_bwd_check(const struct fa_case *c, const struct fa_bwd_layout *l,
                                const void *data, double tight, double err_out[3], char *why,
                                size_t whycap)
{
	return fa_bwd_check_win(c, l, data, NULL, tight, err_out, why, whycap);
}

#endif /* FA_BWD_CASE_H */
