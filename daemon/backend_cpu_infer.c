/* backend_cpu_infer.c - ATTN_VARLEN and ATTN_KVCACHE on the CPU backend's workers: the index
 * snapshot, checked, then the inference reference over a range of (sequence, head) units. The
 * snapshot is taken here and not on the loop thread because reading a client's shared memory can
 * fault (a shrunk shm object), and only the workers repair such a fault (backend_cpu.c). */
#include "backend_cpu_infer.h"

#include <stdio.h>

#include "backend_infer.h"

fa_status cpu_infer_run(const struct backend_job *job, int64_t u0, int64_t u1)
{
	struct backend_infer *bi = job->infer;
	fa_status st = backend_infer_prepare(bi);
	if (st != FA_OK)
		return st;
	return fa_attn_infer_ref(&bi->desc, job->q, job->k, job->v, job->o, job->lse, u0, u1);
}

bool cpu_infer_detail(struct backend_job *job)
{
	struct backend_infer *bi = job->infer;
	bool failed;

	if (bi == NULL)
		return false;
	pthread_mutex_lock(&bi->mu);
	failed = bi->state == 2 && bi->detail[0] != '\0';
	if (failed)
		snprintf(job->detail, sizeof job->detail, "%s", bi->detail);
	pthread_mutex_unlock(&bi->mu);
	return failed;
}
