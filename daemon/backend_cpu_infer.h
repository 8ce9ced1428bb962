/* backend_cpu_infer.h - the CPU backend's part for ATTN_VARLEN and ATTN_KVCACHE jobs
 * (backend_cpu_infer.c), called from backend_cpu.c's workers. A job's unit is a (sequence,
 * query head) pair, so the pool splits it as it splits a forward's (batch, head) pairs: desc.B is
 * the number of sequences and desc.Sq, desc.Sk bound their lengths. */
#ifndef FA_DAEMON_BACKEND_CPU_INFER_H
#define FA_DAEMON_BACKEND_CPU_INFER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

/* Compute units [u0, u1) of an inference job (job->infer != NULL): the index snapshot first
 * (once per job, backend_infer_prepare), then fa_attn_infer_ref. Worker threads, under the
 * SIGBUS repair of backend_cpu.c. Returns FA_OK or the failing status. */
fa_status cpu_infer_run(const struct backend_job *job, int64_t u0, int64_t u1);

/* When the job's index snapshot failed its check, put that detail (it names the bad entry) into
 * job->detail and return true; false otherwise (the generic texts apply). Caller holds the
 * backend's mutex, as for every write of job->detail. */
bool cpu_infer_detail(struct backend_job *job);

#endif /* FA_DAEMON_BACKEND_CPU_INFER_H */
