/* validate.h - turn an ATTN_FWD request into a descriptor and pointers, or say exactly why not.
 *
 * Everything a client sends is checked before any byte of its memory is touched: the regions
 * belong to this session, dtypes agree (lse is fp32), shapes are consistent (GQA, lse
 * [B, Hq, Sq, 1]), the head dim is contiguous, every tensor's extent (offset + strided span,
 * overflow-checked) lies inside its region, offsets are aligned, and each output (O, lse) shares
 * no byte with an input or another output: in the memory itself, so two registrations of one shm
 * object or one CUDA allocation are compared as one (region.h's struct region_mem). A bad request
 * gets a status and a detail text naming the tensor and numbers.
 */
#ifndef FA_DAEMON_VALIDATE_H
#define FA_DAEMON_VALIDATE_H

#include <stddef.h>

#include "fa_attn.h"
#include "fa_attn_bwd.h"
#include "fa_check.h"
#include "fa_proto.h"
#include "region.h"
#include "session.h"

/* The tensors by index, as common/fa_check.h numbers them (fa_fwd_names). */
enum {
	VALIDATE_Q = FA_FWD_Q,
	VALIDATE_K = FA_FWD_K,
	VALIDATE_V = FA_FWD_V,
	VALIDATE_O = FA_FWD_O,
	VALIDATE_LSE = FA_FWD_LSE,
	VALIDATE_NTENSORS = FA_FWD_NTENSORS
};

struct validate_result {
	struct fa_attn_fwd_desc desc;              /* scale and precision resolved */
	struct region
	    *region[VALIDATE_NTENSORS]; /* borrowed from the session; lse NULL if absent */
	const void *q, *k, *v;
	void *o;
	float *lse;                                /* NULL when not wanted */
	bool on_device[VALIDATE_NTENSORS];         /* the tensor's region is device memory */
};

/* Validate req (op ATTN_FWD) against session s. `align`: byte alignment the backend needs for
 * the offset of q, k, v and o and for their batch/seq/head strides in bytes (of dimensions larger
 * than 1), beyond the element size (0: the element size only, enough for the CPU backend; 16 for
 * the GPU kernels' vector loads). lse needs its element size only. On FA_OK, out is filled; the regions are not referenced
 * (the caller takes references). Returns FA_OK, FA_EREGION, FA_EDTYPE, FA_ESHAPE, FA_EINVAL,
 * FA_ERANGE, FA_EALIGN or FA_EOVERLAP, with the detail in err. */
fa_status validate_attn_fwd(const struct session *s, const struct fa_proto_req *req, size_t align,
                            struct validate_result *out, char *err, size_t errlen);

/* validate_attn_fwd through the session's memo of its last success: a request equal to that
 * one but for its seq, while the session's regions are unchanged (regions_gen) and none of the
 * request's is broken, gets the same result without the checks (about 2,000 instructions of a
 * tiny request's ~6,000 in the daemon, 2026-12-03); anything else is validated in full, and a
 * success is remembered. The same statuses and texts as validate_attn_fwd. */
fa_status validate_attn_fwd_memo(struct session *s, const struct fa_proto_req *req, size_t align,
                                 struct validate_result *out, char *err, size_t errlen);

/* Each output among the n tensors (is_output[i]) against every input and every output before it,
 * where region_same_mem says both map one memory: fa_check_overlap on their spans. FA_OK or
 * FA_EOVERLAP with the detail in err. */
fa_status validate_overlaps(int n, const bool *is_output, struct region *const *region,
                            const struct fa_check_span *span, char *err, size_t errlen);

/* ---- the backward pass (validate_bwd.c) ------------------------------------------------------ */

/* An ATTN_BWD made a descriptor and pointers; every array by FA_BWD_* (common/fa_check.h). */
struct validate_bwd_result {
	struct fa_attn_bwd_desc desc;                 /* scale and precision resolved */
	struct region *region[FA_BWD_NTENSORS];       /* borrowed from the session */
	void *ptr[FA_BWD_NTENSORS];                   /* region base + offset (inputs only read) */
	bool on_device[FA_BWD_NTENSORS];              /* the tensor's region is device memory */
};

/* Validate req (op ATTN_BWD) against session s with the forward's rules, in its order: the nine
 * regions are this session's, the dtypes (fa_check_bwd_dtypes), each tensor's sizes and strides,
 * the shapes (fa_check_bwd_shapes), the descriptor (fa_attn_bwd_check), extents inside their
 * regions, alignment (`align` as validate_attn_fwd's, for every tensor but lse), and each output
 * (dq, dk, dv) against every input and every earlier output in the memory itself. On FA_OK, out
 * is filled; the regions are not referenced. Returns FA_OK, FA_EREGION, FA_EDTYPE, FA_ESHAPE,
 * FA_EINVAL, FA_ERANGE, FA_EALIGN or FA_EOVERLAP, with the detail in err. Loop thread. */
fa_status validate_attn_bwd(const struct session *s, const struct fa_proto_req *req, size_t align,
                            struct validate_bwd_result *out, char *err, size_t errlen);

#endif /* FA_DAEMON_VALIDATE_H */
