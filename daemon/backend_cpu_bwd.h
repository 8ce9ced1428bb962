/* backend_cpu_bwd.h - the backward pass's part of the CPU backend (backend_cpu.c runs it).
 *
 * A backward job is split into (batch, kv-head) pairs, the unit fa_attn_bwd_ref owns a dK/dV
 * slice by (dQ of the query heads of its group too), so chunks on different workers never write
 * the same byte and the result does not depend on the split: the CPU backend is deterministic
 * with or without FA_PROTO_BWD_DETERMINISTIC.
 */
#ifndef FA_DAEMON_BACKEND_CPU_BWD_H
#define FA_DAEMON_BACKEND_CPU_BWD_H

#include <stdint.h>

#include "backend.h"

/* A backward job's units: *units = B * Hkv (batch, kv-head) pairs, *per_unit its multiply-adds,
 * about 2.5 forward passes of the group's query heads (saturated at INT64_MAX). */
void cpu_bwd_units(const struct backend_job *job, int64_t *units, int64_t *per_unit);

/* Compute units [u0, u1) of a backward job (fa_attn_bwd_ref). Any worker thread; calls on
 * disjoint ranges of one job may run at once. Returns fa_attn_bwd_ref's status. */
fa_status cpu_bwd_run(const struct backend_job *job, int64_t u0, int64_t u1);

#endif /* FA_DAEMON_BACKEND_CPU_BWD_H */
