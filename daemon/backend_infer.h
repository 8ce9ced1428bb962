/* backend_infer.h - what an ATTN_VARLEN or ATTN_KVCACHE job carries beyond a forward's: the
 * client's int32 index tensors (sequence offsets, cache lengths, page table) and the inference
 * descriptor built from them.
 *
 * Why a snapshot: the index tensors live in the client's memory, which the client can rewrite at
 * any time. The daemon copies them once (backend_infer_prepare), checks the copy with
 * fa_attn_infer_check, and computes from the copy only, so what was checked is what is read.
 * The copy runs on a backend thread, not the loop: a client that shrinks its shm object makes the
 * read fault, and only the CPU backend's workers turn that fault into FA_ERANGE (backend_cpu.c).
 * The GPU backend does the same for device regions (gpu/gpu_exec_infer.c): it copies the tables
 * to the host (cuMemcpyDtoH on its stream; host tables by DMA too), checks that copy with
 * backend_infer_prepare, and uploads it to a buffer of its own for the kernel to read, never the
 * client's.
 */
#ifndef FA_DAEMON_BACKEND_INFER_H
#define FA_DAEMON_BACKEND_INFER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "fa_attn_infer.h"
#include "fa_proto.h"

/* The index tensors, by what they are. */
enum { INFER_CU_Q, INFER_CU_K, INFER_CACHE_LEN, INFER_PAGE_TABLE, INFER_NINDEX };

/* "cu_seqlens_q", "cu_seqlens_k", "cache_seqlens", "page_table" by INFER_*. */
extern const char *const backend_infer_names[INFER_NINDEX];

/* One index tensor in the client's memory: n0 x n1 int32 at base with element strides s0, s1;
 * base NULL when the request has none. */
struct backend_index_src {
	const int32_t *base;
	int64_t n0, n1, s0, s1;
};

struct backend_infer {
	uint32_t op;                  /* FA_OP_ATTN_VARLEN or FA_OP_ATTN_KVCACHE: the reply's op */
	struct fa_attn_infer_desc desc; /* filled by validation but for the index pointers, which
	                                 * backend_infer_prepare points at the copies */
	struct backend_index_src src[INFER_NINDEX];
	bool find_max_q, find_max_k;  /* the request said 0: take the longest sequence */
	int32_t *copy;                /* every copy, one allocation (backend_infer_prepare) */
	/* prepare runs once per job, whichever worker comes first */
	pthread_mutex_t mu;
	int state;                    /* 0 not yet, 1 ready, 2 failed */
	fa_status status;             /* of a failed prepare */
	char detail[FA_PROTO_DETAIL_MAX];
};

/* Allocate a zeroed one for op (the caller fills desc and src). NULL when out of memory. */
struct backend_infer *backend_infer_alloc(uint32_t op);

/* Free it and its copies. Safe on NULL. */
void backend_infer_free(struct backend_infer *bi);

/* Copy the index tensors, find the max lengths asked for, and check the descriptor, once: the
 * first caller does it, later callers (other chunks of the same job, on other threads) wait for
 * it and get the same answer. Returns FA_OK, FA_ENOMEM, or fa_attn_infer_check's status with the
 * detail in bi->detail. Thread-safe. */
fa_status backend_infer_prepare(struct backend_infer *bi);

#endif /* FA_DAEMON_BACKEND_INFER_H */
