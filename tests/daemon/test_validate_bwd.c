/* test_validate_bwd.c - ATTN_BWD validation: a good request resolves to the backward descriptor
 * and nine pointers; each kind of bad request gets its exact status and a detail naming the
 * tensor, in the forward's order; every gradient against every input and every other gradient in
 * the memory itself (identities set by hand, as test_validate.c does). */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dtest.h"
#include "log.h"
#include "validate.h"

#define REGION_BYTES 65536

struct fixture {
	struct session_table t;
	struct session *s, *other;
	struct region *r1, *r2, *foreign;
	struct fa_proto_req req;
};

/* B=1, Sq=4, Sk=6, Hq=2, Hkv=1, D=8, fp16: q, o, dout, dq 128 bytes each, k, v, dk, dv 96,
 * lse fp32 [1, 2, 4, 1] 32 bytes, each at its own 256-byte slot of r1. */
static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	struct ipc_peer p = dtest_peer(1);
	char err[256];

	session_table_init(&f->t, 8, 8, 8);
	if (session_open(&f->t, &p, "", &f->s, err, sizeof err) != FA_OK ||
	    session_open(&f->t, &p, "", &f->other, err, sizeof err) != FA_OK)
		return -1;
	f->r1 = dtest_region(f->s, REGION_BYTES);
	f->r2 = dtest_region(f->s, REGION_BYTES);
	f->foreign = dtest_region(f->other, REGION_BYTES);
	if (!f->r1 || !f->r2 || !f->foreign)
		return -1;
	f->req.v = FA_PROTO_VERSION;
	f->req.op = FA_OP_ATTN_BWD;
	f->req.session = f->s->id;
	dtest_tensor(&f->req.u.bwd.q, f->r1, 0, FA_DTYPE_FP16, 1, 4, 2, 8);
	dtest_tensor(&f->req.u.bwd.k, f->r1, 256, FA_DTYPE_FP16, 1, 6, 1, 8);
	dtest_tensor(&f->req.u.bwd.v, f->r1, 512, FA_DTYPE_FP16, 1, 6, 1, 8);
	dtest_tensor(&f->req.u.bwd.o, f->r1, 768, FA_DTYPE_FP16, 1, 4, 2, 8);
	dtest_tensor(&f->req.u.bwd.lse, f->r1, 1024, FA_DTYPE_FP32, 1, 2, 4, 1);
	dtest_tensor(&f->req.u.bwd.dout, f->r1, 1280, FA_DTYPE_FP16, 1, 4, 2, 8);
	dtest_tensor(&f->req.u.bwd.dq, f->r1, 1536, FA_DTYPE_FP16, 1, 4, 2, 8);
	dtest_tensor(&f->req.u.bwd.dk, f->r1, 1792, FA_DTYPE_FP16, 1, 6, 1, 8);
	dtest_tensor(&f->req.u.bwd.dv, f->r1, 2048, FA_DTYPE_FP16, 1, 6, 1, 8);
	f->req.u.bwd.mask = FA_MASK_CAUSAL_BOTTOM_RIGHT;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	session_table_fini(&f->t, true);
	free(f);
	return 0;
}

static void expect(struct fixture *f, size_t align, fa_status want, const char *needle)
{
	struct validate_bwd_result vr;
	char err[FA_PROTO_DETAIL_MAX];
	fa_status st = validate_attn_bwd(f->s, &f->req, align, &vr, err, sizeof err);

	if (st != want)
		fail_msg("status %s, want %s (detail: %s)", fa_status_name(st), fa_status_name(want),
		         err);
	if (needle != NULL && strstr(err, needle) == NULL)
		fail_msg("detail '%s' does not mention '%s'", err, needle);
}

static void test_validate_bwd_accepts_a_good_request(void **state)
{
	struct fixture *f = *state;
	struct validate_bwd_result vr;
	char err[FA_PROTO_DETAIL_MAX];

	assert_int_equal(validate_attn_bwd(f->s, &f->req, 16, &vr, err, sizeof err), FA_OK);
	const struct fa_attn_fwd_desc *d = &vr.desc.fwd;
	assert_int_equal(d->B, 1);
	assert_int_equal(d->Sq, 4);
	assert_int_equal(d->Sk, 6);
	assert_int_equal(d->Hq, 2);
	assert_int_equal(d->Hkv, 1);
	assert_int_equal(d->D, 8);
	assert_int_equal(d->mask, FA_MASK_CAUSAL_BOTTOM_RIGHT);
	assert_int_equal(d->precision, FA_PREC_3XTF32);
	assert_true(fabs(d->scale - 1.0 / sqrt(8.0)) < 1e-15);
	assert_int_equal(d->lse_stride[1], 4);
	assert_int_equal(vr.desc.do_stride[1], 16);
	assert_int_equal(vr.desc.dq_stride[0], 64);
	assert_int_equal(vr.desc.dk_stride[1], 8);
	assert_int_equal(vr.desc.dv_stride[0], 48);
	static const uint64_t offs[FA_BWD_NTENSORS] = {0, 256, 512, 768, 1024, 1280, 1536, 1792,
	                                               2048};
	for (int i = 0; i < FA_BWD_NTENSORS; i++) {
		assert_ptr_equal(vr.ptr[i], (char *)f->r1->base + offs[i]);
		assert_ptr_equal(vr.region[i], f->r1);
		assert_false(vr.on_device[i]);
	}
	f->req.u.bwd.scale = -0.5;
	f->req.u.bwd.precision = FA_PREC_TF32;
	assert_int_equal(validate_attn_bwd(f->s, &f->req, 0, &vr, err, sizeof err), FA_OK);
	assert_true(vr.desc.fwd.scale == -0.5);
	assert_int_equal(vr.desc.fwd.precision, FA_PREC_TF32);
}

static void test_validate_bwd_regions_are_the_sessions(void **state)
{
	struct fixture *f = *state;

	f->req.u.bwd.dk.region = f->foreign->id;
	expect(f, 0, FA_EREGION, "dk: region");
	f->req.u.bwd.dk.region = f->r1->id;
	f->req.u.bwd.lse.region = 12345;
	expect(f, 0, FA_EREGION, "lse: region 0000000000003039 is not registered");
	f->req.u.bwd.lse.region = f->r2->id;
	atomic_store(&f->r2->broken, 1);
	expect(f, 0, FA_ERANGE, "lse: region");
}

static void test_validate_bwd_dtypes_and_shapes(void **state)
{
	struct fixture *f = *state;
	struct fa_proto_req good = f->req;

	f->req.u.bwd.dv.dtype = FA_DTYPE_BF16;
	expect(f, 0, FA_EDTYPE, "dv: dtype bf16 differs from q's fp16");
	f->req = good;
	f->req.u.bwd.lse.dtype = FA_DTYPE_FP16;
	expect(f, 0, FA_EDTYPE, "lse: dtype must be fp32");
	f->req = good;
	f->req.u.bwd.q.dtype = 9;
	expect(f, 0, FA_EDTYPE, "q: dtype 9 is unknown");
	f->req = good;
	f->req.u.bwd.lse.shape[2] = 5;
	expect(f, 0, FA_ESHAPE, "lse: shape [1, 2, 5, 1] differs from [B, Hq, Sq, 1] = [1, 2, 4, 1]");
	f->req = good;
	f->req.u.bwd.dout.shape[1] = 6;
	expect(f, 0, FA_ESHAPE, "dout: shape [1, 6, 2, 8] differs from q's [1, 4, 2, 8]");
	f->req = good;
	f->req.u.bwd.dq.shape[2] = 1;
	expect(f, 0, FA_ESHAPE, "dq: shape");
	f->req = good;
	f->req.u.bwd.dk.shape[1] = 4;
	expect(f, 0, FA_ESHAPE, "dk: shape [1, 4, 1, 8] differs from k's [1, 6, 1, 8]");
	f->req = good;
	f->req.u.bwd.dv.shape[3] = 16;
	expect(f, 0, FA_ESHAPE, "dv: shape");
	f->req = good;
	f->req.u.bwd.dv.shape[0] = 0;
	expect(f, 0, FA_ESHAPE, "dv: shape[0] is 0");
	f->req = good;
	f->req.u.bwd.dq.stride[3] = 2;
	expect(f, 0, FA_ESHAPE, "dq: stride[3] is 2; the head dim must be contiguous");
	f->req = good;
	f->req.u.bwd.mask = 3;
	expect(f, 0, FA_EINVAL, "mask 3");
	/* The forward's order: a dtype error is reported before a shape error. */
	f->req = good;
	f->req.u.bwd.dk.shape[1] = 4;
	f->req.u.bwd.dout.dtype = FA_DTYPE_FP32;
	expect(f, 0, FA_EDTYPE, "dout: dtype fp32");
}

static void test_validate_bwd_extents_and_alignment(void **state)
{
	struct fixture *f = *state;
	struct fa_proto_req good = f->req;

	f->req.u.bwd.dv.offset = REGION_BYTES - 64;
	expect(f, 0, FA_ERANGE, "dv: extent ends at byte 65568");
	f->req = good;
	f->req.u.bwd.dq.stride[1] = INT64_MAX / 2;
	expect(f, 0, FA_ERANGE, "dq: shape and strides reach past 2^63 bytes");
	f->req = good;
	f->req.u.bwd.dk.offset = 1793;
	expect(f, 0, FA_EALIGN, "dk: offset 1793 is not a multiple of 2");
	f->req = good;
	f->req.u.bwd.dout.offset = 1288; /* 8-byte aligned: fine for the CPU, not for the GPU */
	expect(f, 0, FA_OK, NULL);
	expect(f, 16, FA_EALIGN, "dout: offset 1288 is not a multiple of 16");
	f->req = good;
	f->req.u.bwd.lse.offset = 1028; /* lse needs its element size only */
	expect(f, 16, FA_OK, NULL);
}

/* Each gradient against every input and every earlier gradient, in that order. */
static void test_validate_bwd_overlapping_gradient_is_eoverlap(void **state)
{
	struct fixture *f = *state;
	struct fa_proto_req good = f->req;
	static const struct {
		size_t field; /* offsetof the gradient */
		uint64_t at;
		const char *want;
	} cases[] = {
		{offsetof(struct fa_proto_req, u.bwd.dq), 0, "dq overlaps q in region"},
		{offsetof(struct fa_proto_req, u.bwd.dq), 1300, "dq overlaps dout"},
		{offsetof(struct fa_proto_req, u.bwd.dk), 780, "dk overlaps o"},
		{offsetof(struct fa_proto_req, u.bwd.dk), 1536, "dk overlaps dq"},
		{offsetof(struct fa_proto_req, u.bwd.dv), 1000, "dv overlaps lse"},
		{offsetof(struct fa_proto_req, u.bwd.dv), 1800, "dv overlaps dk"},
		{offsetof(struct fa_proto_req, u.bwd.dv), 512, "dv overlaps v"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		f->req = good;
		struct fa_proto_tensor *t = (struct fa_proto_tensor *)((char *)&f->req + cases[i].field);
		t->offset = cases[i].at;
		expect(f, 0, FA_EOVERLAP, cases[i].want);
	}
	/* Inputs may share bytes (dout is o, k is v): only outputs are judged. */
	f->req = good;
	f->req.u.bwd.dout.offset = f->req.u.bwd.o.offset;
	f->req.u.bwd.v.offset = f->req.u.bwd.k.offset;
	expect(f, 0, FA_OK, NULL);
}

/* Two regions of one memory (identity set by hand): the bytes decide, not the region ids. */
static void test_validate_bwd_gradient_over_an_input_through_another_registration(void **state)
{
	struct fixture *f = *state;
	char want[FA_PROTO_DETAIL_MAX];

	f->r2->mem = f->r1->mem;
	f->req.u.bwd.dq.region = f->r2->id;
	f->req.u.bwd.dq.offset = 0; /* q's bytes of r1 */
	snprintf(want, sizeof want,
	         "dq overlaps q: regions %016" PRIx64 " and %016" PRIx64
	         " map the same memory (dq: bytes [0, 128) of the first, q: [0, 128) of the second)",
	         f->r2->id, f->r1->id);
	expect(f, 0, FA_EOVERLAP, want);
	f->req.u.bwd.dq.offset = 1536; /* its own bytes, through the other registration */
	expect(f, 0, FA_OK, NULL);
	/* dv in r1 over dk in r2: outputs against each other through two registrations. */
	f->req.u.bwd.dk.region = f->r2->id;
	f->req.u.bwd.dv.offset = 1792;
	snprintf(want, sizeof want, "dv overlaps dk: regions %016" PRIx64 " and %016" PRIx64,
	         f->r1->id, f->r2->id);
	expect(f, 0, FA_EOVERLAP, want);
	/* Another object at the same offsets: no overlap. */
	f->r2->mem.obj = f->r1->mem.obj + 1;
	expect(f, 0, FA_OK, NULL);
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_validate_bwd_accepts_a_good_request),
		T(test_validate_bwd_regions_are_the_sessions),
		T(test_validate_bwd_dtypes_and_shapes),
		T(test_validate_bwd_extents_and_alignment),
		T(test_validate_bwd_overlapping_gradient_is_eoverlap),
		T(test_validate_bwd_gradient_over_an_input_through_another_registration),
	};
	log_level = FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
