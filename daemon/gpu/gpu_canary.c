/* gpu_canary.c - health: every device runs a canary (a small attention checked against the
 * float64 reference) at least once a second between jobs; the watchdog is fed only while every
 * device's canary passed recently (gpu_healthy). A wrong canary result is a fault. */
#include "gpu_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "log.h"
#include "util.h"

/* Prepare d's canary: a causal fp16 attention of 32 tokens at D=64 on fixed pseudo-random
 * inputs, its float64 reference, device buffers, and the kernel (compiled or loaded from the
 * disk cache now, so the worker never compiles for it). */
fa_status gpu_canary_init(struct gpu_dev *d, char *err, size_t errlen)
{
	const struct fa_cu_api *cu = fa_cu;
	struct fa_attn_fwd_desc *c = &d->canary_desc;
	const int64_t S = 32, D = 64;
	size_t n = (size_t)(S * D);
	uint16_t *host;
	uint32_t x = 0x9e3779b9u;
	fa_cu_res r;
	fa_status st;

	memset(c, 0, sizeof *c);
	c->dtype = FA_DTYPE_FP16;
	c->mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	c->scale = 0.125;
	c->B = 1;
	c->Sq = c->Sk = S;
	c->Hq = c->Hkv = 1;
	c->D = D;
	for (int i = 0; i < 3; i++) {
		int64_t st3[3] = {S * D, D, D};
		memcpy(c->q_stride, st3, sizeof st3);
		memcpy(c->k_stride, st3, sizeof st3);
		memcpy(c->v_stride, st3, sizeof st3);
		memcpy(c->o_stride, st3, sizeof st3);
	}
	d->canary_bytes = n * sizeof(uint16_t);
	if ((host = malloc(3 * d->canary_bytes)) == NULL ||
	    (d->canary_ref = malloc(n * sizeof(double))) == NULL ||
	    (d->canary_out = malloc(d->canary_bytes)) == NULL) {
		free(host);
		return fa_err(err, errlen, FA_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < 3 * n; i++) {
		x = x * 1664525u + 1013904223u;
		host[i] = fa_float_to_half((float)((double)(x >> 8) / (double)(1u << 24) * 2.0 - 1.0));
	}
	st = fa_attn_fwd_ref64(c, host, host + n, host + 2 * n, d->canary_ref, NULL);
	if (st != FA_OK) {
		free(host);
		return fa_err(err, errlen, st, "the canary's reference failed");
	}
	if ((r = cu->MemAlloc(&d->canary_mem, 4 * d->canary_bytes)) != 0) {
		d->canary_mem = 0;
		free(host);
		return fa_err(err, errlen, r == 2 ? FA_ENOMEM : FA_ENOGPU,
		              "GPU %d: allocating the canary: CUDA error %d (%s)", d->ordinal, r,
		              fa_cu_errstr(r));
	}
	r = cu->MemcpyHtoDAsync(d->canary_mem, host, 3 * d->canary_bytes, d->stream);
	if (r == 0)
		r = cu->StreamSynchronize(d->stream);
	free(host);
	if (r != 0)
		return fa_err(err, errlen, FA_ENOGPU, "GPU %d: uploading the canary: CUDA error "
		              "%d (%s)", d->ordinal, r, fa_cu_errstr(r));
	/* An explicit tile: the canary must not count as (or queue) a class for the tuner. */
	int nt = 0;
	if ((st = fa_gpu_plan(d->g, c, &d->canary_tile, 1, &nt, err, errlen)) != FA_OK)
		return st;
	if (nt < 1)
		return fa_err(err, errlen, FA_ENOFIT, "no tile for the canary");
	if ((st = fa_gpu_prepare(d->g, c, &d->canary_tile, err, errlen)) != FA_OK)
		return st;
	atomic_store(&d->canary_ok_ns, fa_now_ns());
	return FA_OK;
}

/* Run the canary on d's stream and check it (worker, mutex not held). Returns whether it
 * passed; *sticky when the context is lost; *wrong when it computed a wrong result. */
static bool gpu_canary_run(struct gpu_dev *d, bool *sticky, bool *wrong, char *why, size_t whylen)
{
	const struct fa_cu_api *cu = fa_cu;
	fa_cu_ptr q = d->canary_mem, k = q + d->canary_bytes, v = k + d->canary_bytes,
	        o = v + d->canary_bytes;
	double e = INFINITY;
	fa_cu_res r;
	fa_status st;

	*sticky = *wrong = false;
	d->canary_last_ns = fa_now_ns();
	r = cu->MemsetD8Async(o, 0xff, d->canary_bytes, d->stream); /* NaN: never passes */
	if (r == 0) {
		st = fa_gpu_attn_fwd_tile(d->g, &d->canary_desc, &d->canary_tile, q, k, v, o, 0,
		                          (CUstream)d->stream, why, whylen);
		if (st != FA_OK)
			r = -1;
	} else {
		snprintf(why, whylen, "cuMemsetD8Async: CUDA error %d (%s)", r, fa_cu_errstr(r));
	}
	if (r == 0 && (r = cu->MemcpyDtoHAsync(d->canary_out, o, d->canary_bytes, d->stream)) != 0)
		snprintf(why, whylen, "cuMemcpyDtoHAsync: CUDA error %d (%s)", r, fa_cu_errstr(r));
	fa_cu_res rs = cu->StreamSynchronize(d->stream);
	if (rs != 0) {
		*sticky = fa_cu_sticky(rs);
		if (r == 0)
			snprintf(why, whylen, "the canary kernel: CUDA error %d (%s)", rs,
			         fa_cu_errstr(rs));
		r = rs;
	} else if (r == -1 && (rs = cu->CtxSynchronize()) != 0 && fa_cu_sticky(rs)) {
		*sticky = true;
	}
	if (r == 0) {
		e = fa_attn_fwd_rel_error(&d->canary_desc, d->canary_out, d->canary_ref);
		if (!(e <= GPU_CANARY_TOL)) {
			*wrong = true;
			snprintf(why, whylen, "the canary computed a wrong result on GPU %d: relative "
			         "error %.3g (tolerance %.0e)", d->ordinal, e, GPU_CANARY_TOL);
		}
	}
	bool ok = r == 0 && !*wrong;
	pthread_mutex_lock(&d->b->mu);
	d->canary_runs++;
	d->canary_err = e;
	if (!ok)
		d->canary_failed++;
	pthread_mutex_unlock(&d->b->mu);
	if (ok)
		atomic_store(&d->canary_ok_ns, fa_now_ns());
	return ok;
}

/* The canary's turn on d's worker (mutex held on entry and exit): run it when it is due. A
 * wrong result or a lost context is the fatal path; another failure only stops the canary's
 * passes (the watchdog starves after GPU_CANARY_STALE_NS). Returns whether it ran. */
bool gpu_canary_turn_locked(struct gpu_dev *d)
{
	struct gpu_backend *b = d->b;
	char why[FA_PROTO_DETAIL_MAX];
	bool sticky, wrong;

	if (d->canary_mem == 0 || fault_marked(&b->base) ||
	    fa_now_ns() - d->canary_last_ns < GPU_CANARY_EVERY_NS)
		return false;
	pthread_mutex_unlock(&b->mu);
	why[0] = '\0';
	bool ok = gpu_canary_run(d, &sticky, &wrong, why, sizeof why);
	pthread_mutex_lock(&b->mu);
	if (!ok) {
		log_err("gpu: GPU %d: canary failed: %s", d->ordinal, why);
		if (sticky || wrong)
			gpu_fatal_locked(b, why);
	}
	return true;
}

/* Healthy while no fault poisoned a context and every device's canary passed within
 * GPU_CANARY_STALE_NS (a worker stuck in a kernel, or a canary that keeps failing, starves the
 * watchdog and systemd restarts the daemon). */
bool gpu_healthy(struct backend *base)
{
	struct gpu_backend *b = (struct gpu_backend *)base;
	uint64_t now = fa_now_ns();

	if (fault_marked(base))
		return false;
	for (unsigned i = 0; i < b->ndevs; i++) {
		uint64_t ok = atomic_load(&b->devs[i].canary_ok_ns);
		if (now > ok && now - ok > GPU_CANARY_STALE_NS)
			return false;
	}
	return true;
}
