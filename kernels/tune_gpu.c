/* tune_gpu.c - the tuner's callbacks on a real GPU: compile with fa_gpu_prepare, time one launch
 * of fa_gpu_attn_fwd_tile with CUDA events on stream 0.
 *
 * Inputs are random values in [-1, 1) (not zeros: zeros make the exponentials trivial and the
 * memory traffic compressible on some parts), in scratch buffers sized for the tuning shape,
 * allocated on the first run of a shape and freed by ops->finish. Kept thin: the logic is in
 * tuner.c and is tested on the CPU with a fake timer.
 */
#include "fa_gpu.h"
#include "fa_tune.h"
#include "fa_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gpu_tune_ctx {
	struct fa_gpu *g;
	bool have;
	struct fa_attn_fwd_desc d; /* the shape the buffers are for */
	CUdeviceptr q, k, v, o, lse;
	uint64_t rng;
};

static void release(struct gpu_tune_ctx *c)
{
	if (!c->have)
		return;
	fa_gpu_free(c->g, c->q);
	fa_gpu_free(c->g, c->k);
	fa_gpu_free(c->g, c->v);
	fa_gpu_free(c->g, c->o);
	fa_gpu_free(c->g, c->lse);
	c->q = c->k = c->v = c->o = c->lse = 0;
	c->have = false;
}

/* Bytes a [n0, n1, n2, D] tensor with these strides spans. */
static size_t span(const int64_t *shape3, const int64_t *stride, int64_t D, size_t es)
{
	int64_t shape[4] = {shape3[0], shape3[1], shape3[2], D}, st[4];
	uint64_t lo = 0, hi = 0;
	memcpy(st, stride, 3 * sizeof *st);
	st[3] = 1;
	if (!fa_tensor_extent(4, shape, st, es, &lo, &hi))
		return 0;
	return (size_t)hi;
}

/* A buffer of `bytes` filled with random elements of dtype dt. */
static fa_status random_buffer(struct gpu_tune_ctx *c, fa_dtype dt, size_t bytes, CUdeviceptr *p,
                               char *err, size_t errlen)
{
	size_t es = fa_dtype_size(dt), n = bytes / es;
	void *h = malloc(bytes ? bytes : 1);
	if (!h)
		return FA_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		c->rng ^= c->rng << 13;
		c->rng ^= c->rng >> 7;
		c->rng ^= c->rng << 17;
		double x = (double)(c->rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
		fa_store_elem(h, dt, (int64_t)i, x);
	}
	fa_status st = fa_gpu_alloc(c->g, bytes, p, err, errlen);
	if (st == FA_OK)
		st = fa_gpu_upload(c->g, *p, h, bytes, err, errlen);
	free(h);
	return st;
}

static fa_status ensure(struct gpu_tune_ctx *c, const struct fa_attn_fwd_desc *d, char *err,
                        size_t errlen)
{
	if (c->have && memcmp(&c->d, d, sizeof *d) == 0)
		return FA_OK;
	release(c);
	size_t es = fa_dtype_size(d->dtype);
	int64_t qs[3] = {d->B, d->Sq, d->Hq}, ks[3] = {d->B, d->Sk, d->Hkv};
	size_t bq = span(qs, d->q_stride, d->D, es), bk = span(ks, d->k_stride, d->D, es),
	       bv = span(ks, d->v_stride, d->D, es), bo = span(qs, d->o_stride, d->D, es);
	size_t bl = (size_t)(d->B * d->Hq * d->Sq) * 4;
	if (!bq || !bk || !bv || !bo) {
		return fa_err(err, errlen, FA_ESHAPE, "tuning shape too large");
	}
	fa_status st;
	c->have = true; /* release() frees whatever was allocated */
	if ((st = random_buffer(c, d->dtype, bq, &c->q, err, errlen)) ||
	    (st = random_buffer(c, d->dtype, bk, &c->k, err, errlen)) ||
	    (st = random_buffer(c, d->dtype, bv, &c->v, err, errlen)) ||
	    (st = fa_gpu_alloc(c->g, bo, &c->o, err, errlen)) ||
	    (st = fa_gpu_alloc(c->g, bl, &c->lse, err, errlen))) {
		release(c);
		return st;
	}
	c->d = *d;
	return FA_OK;
}

static fa_status gpu_prepare(void *ctx, const struct fa_attn_fwd_desc *d,
                             const struct fa_tile *tile, char *err, size_t errlen)
{
	struct gpu_tune_ctx *c = ctx;
	return fa_gpu_prepare(c->g, d, tile, err, errlen);
}

static fa_status gpu_time(void *ctx, const struct fa_attn_fwd_desc *d, const struct fa_tile *tile,
                          double *us, char *err, size_t errlen)
{
	struct gpu_tune_ctx *c = ctx;
	struct fa_gpu_timer *tm = NULL;
	float ms = 0;
	fa_status st = ensure(c, d, err, errlen);
	if (st != FA_OK)
		return st;
	if ((st = fa_gpu_timer_start(c->g, 0, &tm, err, errlen)))
		return st;
	fa_status lst = fa_gpu_attn_fwd_tile(c->g, d, tile, c->q, c->k, c->v, c->o, c->lse, 0, err,
	                                     errlen);
	char terr[256];
	st = fa_gpu_timer_stop(c->g, tm, 0, &ms, terr, sizeof terr); /* frees the timer */
	if (lst != FA_OK)
		return lst;
	if (st != FA_OK) {
		return fa_err(err, errlen, st, "%s", terr);
	}
	*us = (double)ms * 1000.0;
	return FA_OK;
}

static void gpu_finish(void *ctx)
{
	release(ctx);
}

fa_status fa_tune_gpu_ops_init(struct fa_tune_ops *ops, struct fa_gpu *g, char *err,
                               size_t errlen)
{
	memset(ops, 0, sizeof *ops);
	struct gpu_tune_ctx *c = calloc(1, sizeof *c);
	if (!c) {
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	}
	c->g = g;
	c->rng = 0x9e3779b97f4a7c15ull;
	ops->ctx = c;
	ops->prepare = gpu_prepare;
	ops->time = gpu_time;
	ops->finish = gpu_finish;
	return FA_OK;
}

void fa_tune_gpu_ops_fini(struct fa_tune_ops *ops)
{
	if (!ops || !ops->ctx)
		return;
	release(ops->ctx);
	free(ops->ctx);
	ops->ctx = NULL;
}

void fa_tune_gpu_ident(struct fa_gpu *g, struct fa_tune_ident *id)
{
	uint8_t u[16];
	fa_gpu_uuid(g, u);
	fa_tune_ident_make(id, u, fa_gpu_driver_version(g), fa_gpu_settings(g));
}
