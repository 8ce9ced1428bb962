/* gpu_split.c - a large synchronous request as several launches: ranges of batches, or of
 * heads of one batch (whole GQA groups), each at most GPU_PIECE_FLOP of work where the shape
 * allows. Between launches the worker checks whether the job was stopped (its client is gone,
 * the drain deadline passed), so a dead client's remaining work is dropped within about one
 * launch (~6 ms of an H200), and a batch never holds the GPU much longer than that. Pure
 * arithmetic, no CUDA: tests/daemon/test_gpu_queue.c checks that the pieces cover every
 * (batch, head) pair once. */
#include "gpu_int.h"

#include "worklimit.h"

/* Plan job's pieces: piece_total, and piece_bh (batches per piece when piece_rows == 0, else
 * heads per piece of one batch, piece_row_blocks the pieces per batch). See gpu_int.h. */
void gpu_split_plan(struct backend_job *job)
{
	const struct fa_attn_fwd_desc *d = &job->desc;
	double per_head = 4.0 * (double)d->D * worklimit_pairs(d, 0, d->Sq);
	double per_batch = per_head * (double)d->Hq;
	int64_t g = d->Hq / d->Hkv;

	job->piece_rows = 0;
	job->piece_row_blocks = 1;
	/* an inference job runs whole: its sequences' work is only known after its snapshot */
	if (per_batch * (double)d->B <= GPU_PIECE_FLOP || job->async || job->infer) {
		job->piece_bh = d->B; /* one launch: the common case */
		job->piece_total = 1;
		return;
	}
	if (per_batch <= GPU_PIECE_FLOP) {
		job->piece_bh = (int64_t)(GPU_PIECE_FLOP / per_batch);
		if (job->piece_bh < 1)
			job->piece_bh = 1;
		job->piece_total = (d->B + job->piece_bh - 1) / job->piece_bh;
		return;
	}
	/* heads of one batch, whole groups (a KV head's query heads stay together) */
	int64_t groups = (int64_t)(GPU_PIECE_FLOP / (per_head * (double)g));
	if (groups < 1)
		groups = 1; /* a group above a piece: it runs whole */
	if (groups > d->Hkv)
		groups = d->Hkv;
	job->piece_bh = groups * g;
	job->piece_rows = 1; /* marks "heads of one batch" */
	job->piece_row_blocks = (d->Hkv + groups - 1) / groups;
	job->piece_total = d->B * job->piece_row_blocks;
}

/* Piece k of a planned job: its descriptor and the byte offsets of q, k, v, o and lse from the
 * job's pointers. */
void gpu_split_piece(const struct backend_job *job, int64_t k, struct fa_attn_fwd_desc *sub,
                     uint64_t off[5])
{
	const struct fa_attn_fwd_desc *d = &job->desc;
	int64_t es = (int64_t)fa_dtype_size(d->dtype), g = d->Hq / d->Hkv;
	int64_t b0, h0 = 0;

	*sub = *d;
	if (job->piece_total <= 1) {
		for (int i = 0; i < 5; i++)
			off[i] = 0;
		return;
	}
	if (job->piece_rows == 0) {
		b0 = k * job->piece_bh;
		sub->B = b0 + job->piece_bh < d->B ? job->piece_bh : d->B - b0;
	} else {
		b0 = k / job->piece_row_blocks;
		h0 = (k % job->piece_row_blocks) * job->piece_bh;
		sub->B = 1;
		sub->Hq = h0 + job->piece_bh < d->Hq ? job->piece_bh : d->Hq - h0;
		sub->Hkv = sub->Hq / g;
	}
	off[0] = (uint64_t)((b0 * d->q_stride[0] + h0 * d->q_stride[2]) * es);
	off[1] = (uint64_t)((b0 * d->k_stride[0] + h0 / g * d->k_stride[2]) * es);
	off[2] = (uint64_t)((b0 * d->v_stride[0] + h0 / g * d->v_stride[2]) * es);
	off[3] = (uint64_t)((b0 * d->o_stride[0] + h0 * d->o_stride[2]) * es);
	off[4] = (uint64_t)((b0 * d->lse_stride[0] + h0 * d->lse_stride[1]) * (int64_t)sizeof(float));
}
