/* validate_infer.h - turn an ATTN_VARLEN or ATTN_KVCACHE request into an inference job's
 * descriptor and pointers (validate_infer.c), or say exactly why not, with validate_attn_fwd's
 * rules in its order (regions, dtypes, each tensor's sizes, shapes, the descriptor, extents,
 * alignment, overlaps) and the index tensors' layouts and extents. The index tensors' values are
 * checked later, on the backend's copy (backend_infer.h says why); a bad entry then fails the
 * job with the entry named and nothing written.
 */
#ifndef FA_DAEMON_VALIDATE_INFER_H
#define FA_DAEMON_VALIDATE_INFER_H

#include <stdbool.h>
#include <stddef.h>

#include "backend_infer.h"
#include "validate.h"

/* The tensors of an inference request: q, k, v, o, lse (FA_FWD_*), then the index tensors
 * (FA_FWD_NTENSORS + INFER_*). */
#define VALIDATE_INFER_N (FA_FWD_NTENSORS + INFER_NINDEX)

/* The most int32 entries a request's index tensors may have together (64 MiB of copies). */
#define VALIDATE_INFER_MAX_ENTRIES (INT64_C(1) << 24)

struct validate_infer_result {
	struct backend_infer *bi;                /* on FA_OK: allocated, the caller's to free */
	struct region *region[VALIDATE_INFER_N]; /* borrowed from the session; NULL: absent */
	const void *q, *k, *v;
	void *o;
	float *lse;                              /* NULL when not wanted */
	bool on_device[VALIDATE_INFER_N];        /* the tensor is in a CUDA IPC region */
};

/* Validate req (op ATTN_VARLEN or ATTN_KVCACHE) against session s; `align` as
 * validate_attn_fwd's. Index tensors may be in host or device memory (on_device says which).
 * Returns FA_OK, FA_EREGION, FA_EDTYPE, FA_ESHAPE, FA_EINVAL,
 * FA_ERANGE, FA_EALIGN, FA_EOVERLAP, FA_ENOTSUP or FA_ENOMEM, with the detail in err. Loop
 * thread. */
fa_status validate_attn_infer(const struct session *s, const struct fa_proto_req *req,
                              size_t align, struct validate_infer_result *out, char *err,
                              size_t errlen);

#endif /* FA_DAEMON_VALIDATE_INFER_H */
