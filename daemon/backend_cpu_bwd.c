/* backend_cpu_bwd.c - the backward pass on the CPU backend's workers: how a job is cut and what
 * a chunk computes; backend_cpu.c schedules it like a forward job. */
#include "backend_cpu_bwd.h"

#include "fa_attn_bwd.h"

/* Per pair: the group's query heads, each Sq * Sk * D multiply-adds 5 times (the scores again,
 * dV, dP, dQ, dK) against the forward's 2. */
void cpu_bwd_units(const struct backend_job *job, int64_t *units, int64_t *per_unit)
{
	const struct fa_attn_fwd_desc *d = &job->bwd.desc.fwd;
	int64_t w;

	*units = d->B * d->Hkv; /* fits: fa_attn_fwd_check bounded B*Sk*Hkv*D */
	if (__builtin_mul_overflow(d->Sq, d->Sk, &w) || __builtin_mul_overflow(w, d->D, &w) ||
	    __builtin_mul_overflow(w, d->Hq / d->Hkv, &w) || __builtin_mul_overflow(w, 5, &w))
		w = INT64_MAX;
	else
		w /= 2;
	*per_unit = w;
}

/* The reference over the job's (batch, kv-head) pairs [u0, u1). */
fa_status cpu_bwd_run(const struct backend_job *job, int64_t u0, int64_t u1)
{
	const struct backend_bwd *b = &job->bwd;

	return fa_attn_bwd_ref(&b->desc, job->q, job->k, job->v, job->o, b->dout, job->lse, b->dq,
	                       b->dk, b->dv, u0, u1);
}
