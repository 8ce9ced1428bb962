/* fa_check.h - the rules an attention request must follow, written once, used by the client
 * library (before anything is sent), the daemon (daemon/validate.c, which trusts no client) and
 * the GPU launcher (kernels/gpu_cuda.c) and the descriptor check (kernels/attn_check.c).
 *
 * Each check returns FA_OK or one status with a detail text in err (truncated, always terminated;
 * err may be NULL or errlen 0) that names the tensor and the numbers ("q: stride[3] is 2; the head
 * dim must be contiguous (stride 1)"): the texts go back to clients verbatim, and tests match
 * them. Every size comes from a client, so every product and sum is overflow-checked: a wrapped
 * extent is how a request reads or writes outside its region. Pure functions: thread-safe, no
 * allocation. Internal: compiled into every program and, hidden, into libfaclient.
 */
#ifndef FA_CHECK_H
#define FA_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fa_types.h"

/* The largest head dim the kernels and the reference take (a multiple of 8). */
#define FA_ATTN_MAX_HEAD_DIM 256

/* Bytes the GPU kernels' vector loads (cp.async, 16-byte loads) need tensor addresses and the
 * batch/seq/head strides in bytes to be multiples of. */
#define FA_KERNEL_ALIGN 16

/* The tensors of a forward request, in the order every check and detail text uses. */
enum { FA_FWD_Q, FA_FWD_K, FA_FWD_V, FA_FWD_O, FA_FWD_LSE, FA_FWD_NTENSORS };

/* "q", "k", "v", "o", "lse" by FA_FWD_* index. */
extern const char *const fa_fwd_names[FA_FWD_NTENSORS];

/* The tensors of a backward request: the forward's five first, at the forward's indices (o and
 * lse are inputs here), then the upstream gradient dout, then the three outputs. */
enum {
	FA_BWD_Q = FA_FWD_Q,
	FA_BWD_K = FA_FWD_K,
	FA_BWD_V = FA_FWD_V,
	FA_BWD_O = FA_FWD_O,
	FA_BWD_LSE = FA_FWD_LSE,
	FA_BWD_DO,
	FA_BWD_DQ,
	FA_BWD_DK,
	FA_BWD_DV,
	FA_BWD_NTENSORS
};

/* "q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv" by FA_BWD_* index. */
extern const char *const fa_bwd_names[FA_BWD_NTENSORS];

/* Whether FA_BWD_* index i is written (dq, dk, dv) rather than read. */
static inline bool fa_bwd_is_output(int i)
{
	return i >= FA_BWD_DQ;
}

/* Bytes per element of a dtype; 0 for an unknown one (also for values outside the enum). */
size_t fa_dtype_size(fa_dtype dt);

/* Name of a dtype ("bf16"); "?" for an unknown one. Static storage. */
const char *fa_dtype_name(fa_dtype dt);

/* The byte range [*lo, *hi) that a strided tensor of `ndim` dimensions touches, relative to its
 * base, with overflow-checked arithmetic. Sizes must be >= 1 and strides >= 0. lo and hi may be
 * NULL. Returns false on overflow (past INT64_MAX) or a bad size. */
bool fa_tensor_extent(int ndim, const int64_t *shape, const int64_t *stride, size_t elem_size,
                      uint64_t *lo, uint64_t *hi);

/* The dtypes of a forward request (dt by FA_FWD_*, as numbers from the caller or the wire): q's
 * is known, k, v and o share it, lse (when has_lse) is fp32. Returns FA_OK or FA_EDTYPE. */
fa_status fa_check_fwd_dtypes(const int dt[FA_FWD_NTENSORS], bool has_lse, char *err,
                              size_t errlen);

/* The dtypes of a backward request (dt by FA_BWD_*): q's is known, k, v, o, dout, dq, dk and dv
 * share it, lse is fp32 (it is required). Returns FA_OK or FA_EDTYPE. */
fa_status fa_check_bwd_dtypes(const int dt[FA_BWD_NTENSORS], char *err, size_t errlen);

/* One tensor's sizes (each >= 1: FA_ESHAPE), strides (each >= 0: FA_EINVAL) and, when
 * head_dim_contiguous, stride[3] == 1 (FA_ESHAPE). Returns FA_OK or that status. */
fa_status fa_check_tensor_dims(const char *name, const int64_t shape[4], const int64_t stride[4],
                               bool head_dim_contiguous, char *err, size_t errlen);

/* The shapes of a forward request agree (each tensor's sizes checked already): k [B, Sk, Hkv, D]
 * with q's B and D, v as k, o as q, Hq a multiple of Hkv, and lse [B, Hq, Sq, 1] unless it is
 * NULL. Returns FA_OK or FA_ESHAPE. */
fa_status fa_check_fwd_shapes(const int64_t q[4], const int64_t k[4], const int64_t v[4],
                              const int64_t o[4], const int64_t *lse, char *err, size_t errlen);

/* The shapes of a backward request agree (shape by FA_BWD_*, each checked already): the forward's
 * rules on q, k, v, o and lse (fa_check_fwd_shapes, lse required), then dout and dq as q, dk and
 * dv as k. Returns FA_OK or FA_ESHAPE. */
fa_status fa_check_bwd_shapes(const int64_t *const shape[FA_BWD_NTENSORS], char *err,
                              size_t errlen);

/* The head dim D (>= 1 already): a multiple of 8 up to FA_ATTN_MAX_HEAD_DIM. FA_OK or FA_ESHAPE. */
fa_status fa_check_head_dim(int64_t D, char *err, size_t errlen);

/* A mask value is one of fa_mask. FA_OK or FA_EINVAL. */
fa_status fa_check_mask(int mask, char *err, size_t errlen);

/* A precision value is one of fa_precision. FA_OK or FA_EINVAL. */
fa_status fa_check_precision(int precision, char *err, size_t errlen);

/* The scale is finite (0 is allowed here: it asks for 1/sqrt(D)). FA_OK or FA_EINVAL. */
fa_status fa_check_scale(double scale, char *err, size_t errlen);

/* A tensor [offset, offset + extent) lies inside a region of region_size bytes (sizes and strides
 * checked already); *end (may be NULL) gets offset + extent. FA_OK or FA_ERANGE. */
fa_status fa_check_extent(const char *name, uint64_t offset, const int64_t shape[4],
                          const int64_t stride[4], size_t elem, uint64_t region_size,
                          uint64_t *end, char *err, size_t errlen);

/* The strides of the first three dimensions, in bytes, are multiples of align where the dimension
 * is larger than 1 (a stride of a dimension of size 1 is never used: the kernels agree).
 * FA_OK or FA_EALIGN. */
fa_status fa_check_stride_align(const char *name, const int64_t shape[3], const int64_t stride[3],
                                size_t elem, size_t align, char *err, size_t errlen);

/* A tensor's byte offset is a multiple of max(elem, align), and so are its strides
 * (fa_check_stride_align) when align > elem. align 0: the element size only (enough for the CPU
 * backend; FA_KERNEL_ALIGN for the GPU). FA_OK or FA_EALIGN. */
fa_status fa_check_align(const char *name, uint64_t offset, const int64_t shape[3],
                         const int64_t stride[3], size_t elem, size_t align, char *err,
                         size_t errlen);

/* Where a tensor's bytes lie, for fa_check_overlap: [lo, hi) of the region `region` (its id, as
 * the request names it), whose byte 0 is byte `at` of the memory that region maps (the daemon's
 * regions start at byte 0 of their shm object or CUDA allocation). */
struct fa_check_span {
	const char *name; /* the tensor ("o"), borrowed */
	uint64_t region;
	uint64_t at;
	uint64_t lo, hi;
};

/* An output's bytes a and another tensor's b (an input, or another output) do not share a byte
 * of the memory both map: else a race inside one request, and a retried request could not run
 * again on unchanged inputs. The caller has found that both map one memory: the same region, or
 * two registrations of one shm object or CUDA allocation (then the text says the two regions map
 * the same memory). Bounding ranges: interleaved layouts that do not really share a byte are
 * refused too (rare for an output; the text says which bytes). at + hi must not pass 2^64 (a
 * region lies inside its memory). FA_OK or FA_EOVERLAP. */
fa_status fa_check_overlap(const struct fa_check_span *a, const struct fa_check_span *b,
                           char *err, size_t errlen);

#endif /* FA_CHECK_H */
