/* validate.c - ATTN_FWD request -> struct fa_attn_fwd_desc + pointers, in the order a client would
 * fix its mistakes: which memory, which types, which shapes, then where the bytes are. */
#include "validate.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

static const char *const validate_names[VALIDATE_NTENSORS] = {"q", "k", "v", "o", "lse"};

/* A shape as "[a, b, c, d]". */
static void validate_shape_text(const int64_t sh[4], char *buf, size_t cap)
{
	snprintf(buf, cap, "[%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]", sh[0], sh[1],
	         sh[2], sh[3]);
}

/* Whether two shapes are equal. */
static bool validate_same_shape(const int64_t a[4], const int64_t b[4])
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* FA_ESHAPE with both shapes in the detail. */
static fa_status validate_shape_mismatch(const char *what, const int64_t got[4], const char *ref,
                                         const int64_t want[4], char *err, size_t errlen)
{
	char g[96], w[96];

	validate_shape_text(got, g, sizeof g);
	validate_shape_text(want, w, sizeof w);
	return util_fail(err, errlen, FA_ESHAPE, "%s: shape %s differs from %s %s", what, g, ref,
	                 w);
}

/* Validate an ATTN_FWD against the session; see validate.h. */
fa_status validate_attn_fwd(const struct session *s, const struct fa_proto_req *req, size_t align,
                            struct validate_result *out, char *err, size_t errlen)
{
	const struct fa_proto_tensor *t[VALIDATE_NTENSORS] = {&req->u.fwd.q, &req->u.fwd.k,
	                                                      &req->u.fwd.v, &req->u.fwd.o,
	                                                      &req->u.fwd.lse};
	uint64_t lo[VALIDATE_NTENSORS] = {0}, hi[VALIDATE_NTENSORS] = {0}; /* byte ranges */
	bool has_lse = req->u.fwd.lse.region != 0;
	int n = has_lse ? VALIDATE_NTENSORS : VALIDATE_LSE;

	memset(out, 0, sizeof(*out));
	if (err != NULL && errlen > 0)
		err[0] = '\0';

	/* Which memory: a region of this session (another session's id is as unknown as a
	 * made-up one). */
	for (int i = 0; i < n; i++) {
		out->region[i] = session_region_find(s, t[i]->region);
		if (out->region[i] == NULL)
			return util_fail(err, errlen, FA_EREGION,
			                 "%s: region %016" PRIx64
			                 " is not registered in this session",
			                 validate_names[i], t[i]->region);
		if (atomic_load(&out->region[i]->broken))
			return util_fail(err, errlen, FA_ERANGE,
			                 "%s: region %016" PRIx64
			                 " lost pages while in use (its shm "
			                 "object shrank); unregister it",
			                 validate_names[i], t[i]->region);
	}

	/* Types: q, k, v, o share one; lse is fp32. */
	fa_dtype dt = (fa_dtype)t[VALIDATE_Q]->dtype;
	size_t esz = fa_dtype_size(dt);
	if (esz == 0)
		return util_fail(err, errlen, FA_EDTYPE,
		                 "q: dtype %u is unknown (fp16, bf16 or fp32)",
		                 t[VALIDATE_Q]->dtype);
	for (int i = VALIDATE_K; i <= VALIDATE_O; i++)
		if (t[i]->dtype != t[VALIDATE_Q]->dtype)
			return util_fail(
			    err, errlen, FA_EDTYPE,
			    "%s: dtype %s differs from q's %s (q, k, v and o share one dtype)",
			    validate_names[i], fa_dtype_name((fa_dtype)t[i]->dtype),
			    fa_dtype_name(dt));
	if (has_lse && t[VALIDATE_LSE]->dtype != FA_DTYPE_FP32)
		return util_fail(err, errlen, FA_EDTYPE, "lse: dtype must be fp32, not %s",
		                 fa_dtype_name((fa_dtype)t[VALIDATE_LSE]->dtype));

	/* Shapes. */
	for (int i = 0; i < n; i++) {
		for (int d = 0; d < 4; d++)
			if (t[i]->shape[d] < 1)
				return util_fail(err, errlen, FA_ESHAPE,
				                 "%s: shape[%d] is %" PRId64
				                 "; every size must be >= 1",
				                 validate_names[i], d, t[i]->shape[d]);
		for (int d = 0; d < 4; d++)
			if (t[i]->stride[d] < 0)
				return util_fail(err, errlen, FA_EINVAL,
				                 "%s: stride[%d] is %" PRId64
				                 "; strides must be >= 0",
				                 validate_names[i], d, t[i]->stride[d]);
		if (i != VALIDATE_LSE && t[i]->stride[3] != 1)
			return util_fail(err, errlen, FA_ESHAPE,
			                 "%s: stride[3] is %" PRId64
			                 "; the head dim must be contiguous "
			                 "(stride 1)",
			                 validate_names[i], t[i]->stride[3]);
	}
	const int64_t *qs = t[VALIDATE_Q]->shape, *ks = t[VALIDATE_K]->shape;
	int64_t B = qs[0], Sq = qs[1], Hq = qs[2], D = qs[3], Sk = ks[1], Hkv = ks[2];
	if (ks[0] != B)
		return util_fail(err, errlen, FA_ESHAPE,
		                 "k: batch %" PRId64 " differs from q's %" PRId64, ks[0], B);
	if (ks[3] != D)
		return util_fail(err, errlen, FA_ESHAPE,
		                 "k: head dim %" PRId64 " differs from q's %" PRId64, ks[3], D);
	if (!validate_same_shape(t[VALIDATE_V]->shape, ks))
		return validate_shape_mismatch("v", t[VALIDATE_V]->shape, "k's", ks, err, errlen);
	if (!validate_same_shape(t[VALIDATE_O]->shape, qs))
		return validate_shape_mismatch("o", t[VALIDATE_O]->shape, "q's", qs, err, errlen);
	if (Hq % Hkv != 0)
		return util_fail(err, errlen, FA_ESHAPE,
		                 "GQA: q has %" PRId64 " heads, not a multiple of k/v's %" PRId64,
		                 Hq, Hkv);
	if (has_lse) {
		const int64_t want[4] = {B, Hq, Sq, 1};
		if (!validate_same_shape(t[VALIDATE_LSE]->shape, want))
			return validate_shape_mismatch("lse", t[VALIDATE_LSE]->shape,
			                               "[B, Hq, Sq, 1] =", want, err, errlen);
	}

	/* The descriptor, and its own checks (head dim, mask, precision, sizes). */
	struct fa_attn_fwd_desc *d = &out->desc;
	d->dtype = dt;
	d->precision = (fa_precision)req->u.fwd.precision;
	if (d->precision == FA_PREC_DEFAULT)
		d->precision = FA_PREC_3XTF32;
	d->mask = (fa_mask)req->u.fwd.mask;
	d->scale = req->u.fwd.scale != 0 ? req->u.fwd.scale : 1.0 / sqrt((double)D);
	d->B = B;
	d->Sq = Sq;
	d->Sk = Sk;
	d->Hq = Hq;
	d->Hkv = Hkv;
	d->D = D;
	int64_t *ds[4] = {d->q_stride, d->k_stride, d->v_stride, d->o_stride};
	for (int i = 0; i < 4; i++)
		memcpy(ds[i], t[i]->stride, 3 * sizeof(int64_t));
	if (has_lse)
		memcpy(d->lse_stride, t[VALIDATE_LSE]->stride, 3 * sizeof(int64_t));
	fa_status st = fa_attn_fwd_check(d, err, errlen);
	if (st != FA_OK)
		return st;

	/* Where the bytes are: inside the region, aligned. */
	for (int i = 0; i < n; i++) {
		size_t el = i == VALIDATE_LSE ? sizeof(float) : esz;
		/* lse is read and written element by element: its element size is enough. */
		size_t need = i != VALIDATE_LSE && align > el ? align : el;
		uint64_t ext, end;
		if (!fa_tensor_extent(4, t[i]->shape, t[i]->stride, el, NULL, &ext))
			return util_fail(err, errlen, FA_ERANGE,
			                 "%s: shape and strides reach past 2^63 bytes",
			                 validate_names[i]);
		if (__builtin_add_overflow(t[i]->offset, ext, &end))
			return util_fail(err, errlen, FA_ERANGE,
			                 "%s: offset %" PRIu64 " + extent %" PRIu64 " overflows",
			                 validate_names[i], t[i]->offset, ext);
		if (end > out->region[i]->size)
			return util_fail(err, errlen, FA_ERANGE,
			                 "%s: extent ends at byte %" PRIu64 " (offset %" PRIu64
			                 " + %" PRIu64 "), region has %" PRIu64,
			                 validate_names[i], end, t[i]->offset, ext,
			                 out->region[i]->size);
		if (t[i]->offset % need != 0)
			return util_fail(err, errlen, FA_EALIGN,
			                 "%s: offset %" PRIu64 " is not a multiple of %zu (%s)",
			                 validate_names[i], t[i]->offset, need,
			                 need == el ? "the element size"
			                            : "the backend's alignment");
		/* The stride of a dimension of size 1 is never used (the kernels agree). */
		for (int k = 0; need > el && k < 3; k++)
			if (t[i]->shape[k] > 1 && ((uint64_t)t[i]->stride[k] * el) % need != 0)
				return util_fail(err, errlen, FA_EALIGN,
				                 "%s: stride[%d] of %" PRId64
				                 " elements is not a multiple "
				                 "of %zu bytes",
				                 validate_names[i], k, t[i]->stride[k], need);
		lo[i] = t[i]->offset;
		hi[i] = end;
	}

	/* Outputs overlap nothing else: a race inside one request, and a retried request must
	 * be able to run again on unchanged inputs. Bounding ranges: interleaved layouts that do
	 * not really share a byte are refused too (rare for an output; the text says so). */
	static const int pairs[][2] = {
		{VALIDATE_O, VALIDATE_Q},   {VALIDATE_O, VALIDATE_K},   {VALIDATE_O, VALIDATE_V},
		{VALIDATE_LSE, VALIDATE_Q}, {VALIDATE_LSE, VALIDATE_K}, {VALIDATE_LSE, VALIDATE_V},
		{VALIDATE_LSE, VALIDATE_O},
	};
	for (size_t p = 0; p < sizeof(pairs) / sizeof(pairs[0]); p++) {
		int i = pairs[p][0], j = pairs[p][1];
		if (i >= n || out->region[i] != out->region[j] || hi[i] <= lo[j] || hi[j] <= lo[i])
			continue;
		return util_fail(err, errlen, FA_EOVERLAP,
		                 "%s overlaps %s in region %016" PRIx64 ": bytes [%" PRIu64
		                 ", %" PRIu64 ") and [%" PRIu64 ", %" PRIu64 ")",
		                 validate_names[i], validate_names[j], out->region[i]->id, lo[i],
		                 hi[i], lo[j], hi[j]);
	}

	/* A device region's base is a device address: the sum is only ever handed to the GPU. */
	char *b[VALIDATE_NTENSORS];
	for (int i = 0; i < n; i++) {
		b[i] = (char *)((uintptr_t)out->region[i]->base + t[i]->offset);
		out->on_device[i] = out->region[i]->kind == FA_REGION_CUDA_IPC;
	}
	out->q = b[VALIDATE_Q];
	out->k = b[VALIDATE_K];
	out->v = b[VALIDATE_V];
	out->o = b[VALIDATE_O];
	out->lse = has_lse ? (float *)(void *)b[VALIDATE_LSE] : NULL;
	return FA_OK;
}
