/* fa_prepared.c - prepared calls: an argument block built once, called again and again with its
 * tensors' memory moved (fa_prepare, fa_prepared_call; see fa_client.h).
 *
 * Why in the library: a binding that repeats a call on arrays whose memory moves (Python's fast
 * path, python/fa/_fast.py) would otherwise patch the block, query the driver for each
 * allocation's id and wait for the producer's stream through its foreign-function layer, each a
 * crossing that costs more than the work (on the H200 host a buffer-id query through ctypes took
 * 2.07 us, the driver's part of it well under that). Here the checks, the patch, the stream wait
 * and the call are one library call.
 *
 * What a call trusts: nothing from an earlier call but the block's shapes, strides, dtypes and
 * scalars (which every call checks again, as the op's own call does). Each place is checked
 * anew: inside its buffer, and a device buffer's allocation still the registered one (the
 * driver's buffer id: a freed allocation's address reused by another has a new id). Layer: above
 * fa_client.c, fa_attn_bwd.c, fa_attn_infer.c (the calls) and fa_cuda.c (the id, the wait).
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fa_client_int.h"

/* Every op's struct fits in a block of this union, aligned as its members. */
union prepared_block {
	fa_attn_fwd_args fwd;
	fa_attn_bwd_args bwd;
	fa_attn_varlen_args varlen;
	fa_attn_kvcache_args kvcache;
};

struct fa_prepared {
	fa_client *client;
	fa_prepared_op op;
	unsigned n;
	uint32_t field[FA_PREPARED_MAX_TENSORS];
	uint64_t span[FA_PREPARED_MAX_TENSORS];
	size_t size; /* of op's struct */
	union prepared_block block;
};

/* fa_tensor and fa_index both start with their buffer and offset: the two fields a place
 * writes, at the same offsets, so one patch serves both. */
_Static_assert(offsetof(fa_tensor, buf) == 0 && offsetof(fa_index, buf) == 0 &&
                   offsetof(fa_tensor, offset) == offsetof(fa_index, offset),
               "a place patches fa_tensor and fa_index alike");

#define T(s, m) offsetof(s, m)
static const uint32_t fwd_fields[] = {
	T(fa_attn_fwd_args, q), T(fa_attn_fwd_args, k), T(fa_attn_fwd_args, v),
	T(fa_attn_fwd_args, o), T(fa_attn_fwd_args, lse)};
static const uint32_t bwd_fields[] = {
	T(fa_attn_bwd_args, q),    T(fa_attn_bwd_args, k),    T(fa_attn_bwd_args, v),
	T(fa_attn_bwd_args, o),    T(fa_attn_bwd_args, dout), T(fa_attn_bwd_args, lse),
	T(fa_attn_bwd_args, dq),   T(fa_attn_bwd_args, dk),   T(fa_attn_bwd_args, dv)};
static const uint32_t varlen_fields[] = {
	T(fa_attn_varlen_args, q),   T(fa_attn_varlen_args, k),
	T(fa_attn_varlen_args, v),   T(fa_attn_varlen_args, o),
	T(fa_attn_varlen_args, lse), T(fa_attn_varlen_args, cu_seqlens_q),
	T(fa_attn_varlen_args, cu_seqlens_k)};
static const uint32_t kvcache_fields[] = {
	T(fa_attn_kvcache_args, q),             T(fa_attn_kvcache_args, k),
	T(fa_attn_kvcache_args, v),             T(fa_attn_kvcache_args, o),
	T(fa_attn_kvcache_args, lse),           T(fa_attn_kvcache_args, cache_seqlens),
	T(fa_attn_kvcache_args, page_table),    T(fa_attn_kvcache_args, cu_seqlens_q)};
#undef T
#define NFIELDS(a) ((unsigned)(sizeof(a) / sizeof((a)[0])))

struct op_info {
	const char *name;
	size_t size;
	const uint32_t *fields;
	unsigned nfields;
};

/* The op's struct and its tensor members; false for an unknown op. */
static bool op_info(fa_prepared_op op, struct op_info *o)
{
	switch (op) {
	case FA_PREPARED_FWD:
		*o = (struct op_info){"FA_PREPARED_FWD", sizeof(fa_attn_fwd_args), fwd_fields,
		                      NFIELDS(fwd_fields)};
		return true;
	case FA_PREPARED_BWD:
		*o = (struct op_info){"FA_PREPARED_BWD", sizeof(fa_attn_bwd_args), bwd_fields,
		                      NFIELDS(bwd_fields)};
		return true;
	case FA_PREPARED_VARLEN:
		*o = (struct op_info){"FA_PREPARED_VARLEN", sizeof(fa_attn_varlen_args),
		                      varlen_fields, NFIELDS(varlen_fields)};
		return true;
	case FA_PREPARED_KVCACHE:
		*o = (struct op_info){"FA_PREPARED_KVCACHE", sizeof(fa_attn_kvcache_args),
		                      kvcache_fields, NFIELDS(kvcache_fields)};
		return true;
	}
	return false;
}

/* See fa_client.h. */
FA_API fa_status fa_prepare(fa_client *c, fa_prepared_op op, const void *args, unsigned n,
                            const uint32_t *field, const uint64_t *span, fa_prepared **out)
{
	struct op_info o;
	fa_prepared *p;

	fa__detail_clear();
	if (out == NULL)
		return fa__fail(FA_EINVAL, "fa_prepare: out is NULL");
	*out = NULL;
	if (c == NULL || args == NULL || field == NULL || span == NULL)
		return fa__fail(FA_EINVAL, "fa_prepare: %s is NULL",
		                c == NULL ? "client" : args == NULL ? "args" :
		                field == NULL ? "field" : "span");
	if (!op_info(op, &o))
		return fa__fail(FA_EINVAL, "fa_prepare: op %d is not an fa_prepared_op (1 forward, 2 "
		                "backward, 3 varlen, 4 kvcache)", (int)op);
	if (n < 1 || n > FA_PREPARED_MAX_TENSORS)
		return fa__fail(FA_EINVAL, "fa_prepare: %u tensors; 1 to %d", n,
		                FA_PREPARED_MAX_TENSORS);
	for (unsigned i = 0; i < n; i++) {
		bool member = false;
		for (unsigned j = 0; j < o.nfields && !member; j++)
			member = field[i] == o.fields[j];
		if (!member)
			return fa__fail(FA_EINVAL, "fa_prepare: field[%u] = %" PRIu32 " is not the offset "
			                "of a tensor of %s's struct", i, field[i], o.name);
		for (unsigned j = 0; j < i; j++)
			if (field[j] == field[i])
				return fa__fail(FA_EINVAL, "fa_prepare: field[%u] and field[%u] are both %"
				                PRIu32 ": each tensor at most once", j, i, field[i]);
		if (span[i] == 0)
			return fa__fail(FA_EINVAL, "fa_prepare: span[%u] is 0; a tensor spans at least "
			                "one element", i);
	}
	if ((p = calloc(1, sizeof *p)) == NULL)
		return fa__fail(FA_ENOMEM, "no memory for a prepared call");
	p->client = c;
	p->op = op;
	p->n = n;
	p->size = o.size;
	memcpy(p->field, field, n * sizeof *field);
	memcpy(p->span, span, n * sizeof *span);
	memcpy(&p->block, args, o.size);
	*out = p;
	return FA_OK;
}

/* See fa_client.h. */
FA_API void fa_prepared_free(fa_prepared *p)
{
	free(p);
}

/* Check place i of pl for p and write it into blk (see fa_prepared_call). checked[] holds the
 * device buffers already found current on this call (*nchecked of them). */
static fa_status place(const fa_prepared *p, fa_placement *pl, unsigned i, unsigned char *blk,
                       const fa_buffer **checked, unsigned *nchecked)
{
	const fa_buffer *b = pl->buf[i];
	uint64_t addr = pl->addr[i];

	if (b == NULL)
		return fa__fail(FA_EINVAL, "fa_prepared_call: place %u has no buffer", i);
	if (b->client != p->client)
		return fa__fail(FA_EREGION, "fa_prepared_call: place %u: the buffer belongs to "
		                "another fa_client", i);
	uint64_t base = (uint64_t)(uintptr_t)b->data;
	if (addr < base || addr - base > b->size || p->span[i] > b->size - (addr - base)) {
		pl->moved = (int32_t)i;
		return fa__fail(FA_ERANGE, "place %u: 0x%" PRIx64 " + %" PRIu64 " bytes is not "
		                "inside its buffer [0x%" PRIx64 ", +%zu)", i, addr, p->span[i], base,
		                b->size);
	}
	if (b->ops->kind == FA_REGION_CUDA_IPC) {
		bool seen = false;
		for (unsigned j = 0; j < *nchecked && !seen; j++)
			seen = checked[j] == b;
		if (!seen) {
			if (!fa_cuda_buffer_current(b, addr)) {
				pl->moved = (int32_t)i;
				return fa__fail(FA_EREGION, "place %u: 0x%" PRIx64 " is no longer in the "
				                "allocation its buffer registered (freed, or made anew at "
				                "the same address)", i, addr);
			}
			checked[(*nchecked)++] = b;
		}
	}
	fa_tensor *t = (fa_tensor *)(void *)(blk + p->field[i]);
	t->buf = (fa_buffer *)b;
	t->offset = addr - base;
	return FA_OK;
}

/* See fa_client.h. */
FA_API fa_status fa_prepared_call(const fa_prepared *p, fa_placement *pl)
{
	union prepared_block blk;
	const fa_buffer *checked[FA_PREPARED_MAX_TENSORS];
	unsigned nchecked = 0;
	fa_status st;

	fa__detail_clear();
	if (p == NULL || pl == NULL)
		return fa__fail(FA_EINVAL, "fa_prepared_call: %s is NULL",
		                p == NULL ? "the prepared call" : "the placement");
	pl->moved = -1;
	uint32_t flags = pl->flags;
	bool async = (flags & FA_PLACE_ASYNC) != 0;
	if ((flags & ~(uint32_t)(FA_PLACE_SYNC_STREAM | FA_PLACE_ASYNC)) != 0 ||
	    (async && (flags & FA_PLACE_SYNC_STREAM) != 0))
		return fa__fail(FA_EINVAL, "fa_prepared_call: flags 0x%" PRIx32 ": FA_PLACE_SYNC_STREAM "
		                "or FA_PLACE_ASYNC, not both, no other bits", flags);
	memcpy(&blk, &p->block, p->size);
	for (unsigned i = 0; i < p->n; i++)
		if ((st = place(p, pl, i, (unsigned char *)&blk, checked, &nchecked)) != FA_OK)
			return st;
	if ((flags & FA_PLACE_SYNC_STREAM) != 0 && (st = fa_cuda_stream_sync(pl->stream)) != FA_OK)
		return st;
	switch (p->op) {
	case FA_PREPARED_FWD:
		return async ? fa_attn_fwd_async(p->client, &blk.fwd, pl->stream)
		             : fa_attn_fwd(p->client, &blk.fwd);
	case FA_PREPARED_BWD:
		return async ? fa_attn_bwd_async(p->client, &blk.bwd, pl->stream)
		             : fa_attn_bwd(p->client, &blk.bwd);
	case FA_PREPARED_VARLEN:
		return async ? fa_attn_varlen_async(p->client, &blk.varlen, pl->stream)
		             : fa_attn_varlen(p->client, &blk.varlen);
	case FA_PREPARED_KVCACHE:
		return async ? fa_attn_kvcache_async(p->client, &blk.kvcache, pl->stream)
		             : fa_attn_kvcache(p->client, &blk.kvcache);
	}
	return fa__fail(FA_EINTERNAL, "fa_prepared_call: op %d", (int)p->op);
}
