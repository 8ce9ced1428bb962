/* test_validate.c - ATTN_FWD validation: a good request resolves to a descriptor and pointers;
 * each kind of bad request gets its exact status and a detail that names the tensor; the memo
 * of the last success answers its repeats and nothing else. */
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

/* B=1, Sq=Sk=4, Hq=2, Hkv=1 (GQA 2:1), D=8, fp16; lse fp32 [1, 2, 4, 1]. */
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
	f->req.op = FA_OP_ATTN_FWD;
	f->req.session = f->s->id;
	dtest_tensor(&f->req.u.fwd.q, f->r1, 0, FA_DTYPE_FP16, 1, 4, 2, 8);
	dtest_tensor(&f->req.u.fwd.k, f->r1, 128, FA_DTYPE_FP16, 1, 4, 1, 8);
	dtest_tensor(&f->req.u.fwd.v, f->r1, 256, FA_DTYPE_FP16, 1, 4, 1, 8);
	dtest_tensor(&f->req.u.fwd.o, f->r1, 512, FA_DTYPE_FP16, 1, 4, 2, 8);
	dtest_tensor(&f->req.u.fwd.lse, f->r1, 1024, FA_DTYPE_FP32, 1, 2, 4, 1);
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
	struct validate_result vr;
	char err[FA_PROTO_DETAIL_MAX];
	fa_status st = validate_attn_fwd(f->s, &f->req, align, &vr, err, sizeof err);

	if (st != want)
		fail_msg("status %s, want %s (detail: %s)", fa_status_name(st), fa_status_name(want),
		         err);
	if (needle != NULL && strstr(err, needle) == NULL)
		fail_msg("detail '%s' does not mention '%s'", err, needle);
}

static void test_validate_accepts_a_good_request(void **state)
{
	struct fixture *f = *state;
	struct validate_result vr;
	char err[FA_PROTO_DETAIL_MAX];

	assert_int_equal(validate_attn_fwd(f->s, &f->req, 0, &vr, err, sizeof err), FA_OK);
	assert_int_equal(vr.desc.B, 1);
	assert_int_equal(vr.desc.Sq, 4);
	assert_int_equal(vr.desc.Sk, 4);
	assert_int_equal(vr.desc.Hq, 2);
	assert_int_equal(vr.desc.Hkv, 1);
	assert_int_equal(vr.desc.D, 8);
	assert_int_equal(vr.desc.dtype, FA_DTYPE_FP16);
	assert_int_equal(vr.desc.precision, FA_PREC_3XTF32); /* default resolved */
	assert_true(fabs(vr.desc.scale - 1.0 / sqrt(8.0)) < 1e-15); /* 0 means 1/sqrt(D) */
	assert_int_equal(vr.desc.q_stride[0], 64);
	assert_int_equal(vr.desc.q_stride[1], 16);
	assert_int_equal(vr.desc.q_stride[2], 8);
	assert_int_equal(vr.desc.lse_stride[1], 4);
	assert_ptr_equal(vr.q, f->r1->base);
	assert_ptr_equal(vr.o, (char *)f->r1->base + 512);
	assert_ptr_equal(vr.lse, (char *)f->r1->base + 1024);
	assert_ptr_equal(vr.region[0], f->r1);

	/* Without lse; an explicit scale is kept. */
	f->req.u.fwd.lse.region = 0;
	f->req.u.fwd.scale = 0.25;
	assert_int_equal(validate_attn_fwd(f->s, &f->req, 0, &vr, err, sizeof err), FA_OK);
	assert_null(vr.lse);
	assert_null(vr.region[VALIDATE_LSE]);
	assert_true(vr.desc.scale == 0.25);
}

static void test_validate_extent_past_the_region_is_erange(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.o.offset = REGION_BYTES - 64; /* o needs 128 bytes */
	expect(f, 0, FA_ERANGE, "o: extent ends at byte 65600 (offset 65472 + 128), region has 65536");
}

static void test_validate_overflowing_strides_are_erange(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.q.stride[1] = INT64_C(1) << 62; /* 3 steps of 2^62 elements */
	expect(f, 0, FA_ERANGE, "q: shape and strides reach past 2^63 bytes");
}

static void test_validate_offset_plus_extent_overflow_is_erange(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.k.offset = UINT64_MAX - 8;
	expect(f, 0, FA_ERANGE, "k: offset 18446744073709551607 + extent 64 overflows");
}

static void test_validate_misaligned_offset_is_ealign(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.v.offset = 257;
	expect(f, 0, FA_EALIGN, "v: offset 257 is not a multiple of 2 (the element size)");
	f->req.u.fwd.v.offset = 256;
	f->req.u.fwd.lse.offset = 1026; /* fp32 needs 4 */
	expect(f, 0, FA_EALIGN, "lse: offset 1026 is not a multiple of 4");
	f->req.u.fwd.lse.offset = 1024;
	/* A backend asking for 16-byte alignment (the GPU's vector loads). */
	f->req.u.fwd.o.offset = 520;
	expect(f, 16, FA_EALIGN, "o: offset 520 is not a multiple of 16 (the backend's alignment)");
	f->req.u.fwd.o.offset = 512;
	f->req.u.fwd.k.stride[1] = 12; /* 24 bytes */
	expect(f, 16, FA_EALIGN, "k: stride[1] of 12 elements is not a multiple of 16 bytes");
}

static void test_validate_overlapping_output_is_eoverlap(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.o.offset = 64; /* over q's [0, 128) */
	expect(f, 0, FA_EOVERLAP, "o overlaps q in region");
	f->req.u.fwd.o.offset = 512;
	f->req.u.fwd.lse.offset = 576; /* inside o's [512, 640) */
	expect(f, 0, FA_EOVERLAP, "lse overlaps o");
	/* The same offsets in different regions do not overlap. */
	f->req.u.fwd.lse.offset = 1024;
	f->req.u.fwd.o.region = f->r2->id;
	f->req.u.fwd.o.offset = 0;
	expect(f, 0, FA_OK, NULL);
	/* Inputs may share bytes (q = k = v is legal). */
	f->req.u.fwd.q.offset = 0;
	f->req.u.fwd.k = f->req.u.fwd.q;
	f->req.u.fwd.v = f->req.u.fwd.q;
	f->req.u.fwd.k.shape[2] = f->req.u.fwd.v.shape[2] = 2;
	expect(f, 0, FA_OK, NULL);
}

/* A second registration of r's shm object in session s (what a client may do up to
 * --max-regions): a new region id, the same memory. */
static struct region *register_again(struct session *s, const struct region *r)
{
	char err[256];
	struct region *again;

	if (region_open_shm(&again, r->name, r->size, s->uid, UINT64_MAX, err, sizeof err) != FA_OK)
		fail_msg("region_open_shm %s again: %s", r->name, err);
	if (session_region_add(s, again, err, sizeof err) != FA_OK)
		fail_msg("session_region_add: %s", err);
	return again;
}

/* The case: O in the second registration at Q's bytes in the first. */
static void test_validate_output_over_an_input_through_another_registration_is_eoverlap(
    void **state)
{
	struct fixture *f = *state;
	struct region *again = register_again(f->s, f->r1);
	char want[FA_PROTO_DETAIL_MAX];

	assert_true(again->id != f->r1->id);
	assert_true(region_same_mem(again, f->r1));
	f->req.u.fwd.o.region = again->id;
	f->req.u.fwd.o.offset = 64; /* over q's [0, 128) of r1 */
	snprintf(want, sizeof want,
	         "o overlaps q: regions %016" PRIx64 " and %016" PRIx64
	         " map the same memory (o: bytes [64, 192) of the first, q: [0, 128) of the second)",
	         again->id, f->r1->id);
	expect(f, 0, FA_EOVERLAP, want);
	/* lse in the first registration over o in the second: outputs against each other too. */
	f->req.u.fwd.o.offset = 512;
	f->req.u.fwd.lse.offset = 576;
	snprintf(want, sizeof want, "lse overlaps o: regions %016" PRIx64 " and %016" PRIx64
	         " map the same memory", f->r1->id, again->id);
	expect(f, 0, FA_EOVERLAP, want);
	/* Disjoint bytes of one memory through two registrations are fine. */
	f->req.u.fwd.lse.offset = 1024;
	expect(f, 0, FA_OK, NULL);
	f->req.u.fwd.lse.region = again->id;
	expect(f, 0, FA_OK, NULL);
}

/* Identities set by hand: equal identity (and where each region starts in that memory) decides,
 * not the region id. */
static void test_validate_overlap_compares_memory_identity_and_bytes_in_it(void **state)
{
	struct fixture *f = *state;
	char want[FA_PROTO_DETAIL_MAX];

	/* r2 made a second view of r1's memory: o at its offset 64 lies on q. */
	f->r2->mem = f->r1->mem;
	f->req.u.fwd.o.region = f->r2->id;
	f->req.u.fwd.o.offset = 64;
	expect(f, 0, FA_EOVERLAP, "map the same memory (o: bytes [64, 192) of the first, q: [0, 128)");
	f->req.u.fwd.o.offset = 2048;
	expect(f, 0, FA_OK, NULL);

	/* r2 starting 4096 bytes into that memory: its byte 0 is r1's byte 4096. */
	f->r2->mem_at = 4096;
	f->req.u.fwd.o.offset = 0;
	expect(f, 0, FA_OK, NULL);
	f->req.u.fwd.k.offset = 4096 + 64; /* k [4160, 4224) of r1 */
	snprintf(want, sizeof want,
	         "o overlaps k: regions %016" PRIx64 " and %016" PRIx64
	         " map the same memory (o: bytes [0, 128) of the first, k: [4160, 4224) of the second)",
	         f->r2->id, f->r1->id);
	expect(f, 0, FA_EOVERLAP, want);
	f->req.u.fwd.k.offset = 128;

	/* Different identities at the same offsets: another object, another kind, not known. */
	f->r2->mem_at = 0;
	f->req.u.fwd.o.offset = 0; /* q's offset, in r2 */
	f->r2->mem.obj = f->r1->mem.obj + 1;
	expect(f, 0, FA_OK, NULL);
	f->r2->mem = f->r1->mem;
	f->r2->mem.dev = f->r1->mem.dev + 1;
	expect(f, 0, FA_OK, NULL);
	f->r2->mem = f->r1->mem;
	f->r2->mem.kind = FA_REGION_CUDA_IPC;
	expect(f, 0, FA_OK, NULL);
	f->r1->mem = f->r2->mem = (struct region_mem){0, 0, 0};
	expect(f, 0, FA_OK, NULL);
}

static void test_validate_foreign_or_unknown_region_is_eregion(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.k.region = f->foreign->id;
	expect(f, 0, FA_EREGION, "k: region");
	f->req.u.fwd.k.region = f->r1->id ^ f->r2->id ^ 0x5a5a;
	expect(f, 0, FA_EREGION, "is not registered in this session");
	f->req.u.fwd.k.region = f->r1->id;
	f->req.u.fwd.lse.region = f->foreign->id;
	expect(f, 0, FA_EREGION, "lse: region");
}

static void test_validate_dtype_mismatch_is_edtype(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.k.dtype = FA_DTYPE_BF16;
	expect(f, 0, FA_EDTYPE, "k: dtype bf16 differs from q's fp16");
	f->req.u.fwd.k.dtype = FA_DTYPE_FP16;
	f->req.u.fwd.lse.dtype = FA_DTYPE_FP16;
	expect(f, 0, FA_EDTYPE, "lse: dtype must be fp32, not fp16");
}

static void test_validate_gqa_mismatch_is_eshape(void **state)
{
	struct fixture *f = *state;

	dtest_tensor(&f->req.u.fwd.q, f->r1, 0, FA_DTYPE_FP16, 1, 4, 3, 8);
	dtest_tensor(&f->req.u.fwd.o, f->r1, 512, FA_DTYPE_FP16, 1, 4, 3, 8);
	dtest_tensor(&f->req.u.fwd.k, f->r1, 2048, FA_DTYPE_FP16, 1, 4, 2, 8);
	dtest_tensor(&f->req.u.fwd.v, f->r1, 4096, FA_DTYPE_FP16, 1, 4, 2, 8);
	f->req.u.fwd.lse.region = 0;
	expect(f, 0, FA_ESHAPE, "GQA: q has 3 heads, not a multiple of k/v's 2");
}

static void test_validate_lse_shape_is_eshape(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.lse.shape[2] = 3; /* Sq is 4 */
	expect(f, 0, FA_ESHAPE, "lse: shape [1, 2, 3, 1] differs from [B, Hq, Sq, 1] = [1, 2, 4, 1]");
	f->req.u.fwd.lse.shape[2] = 4;
	f->req.u.fwd.lse.shape[3] = 2;
	expect(f, 0, FA_ESHAPE, "lse: shape");
}

static void test_validate_other_shape_errors_are_eshape(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.q.stride[3] = 2;
	expect(f, 0, FA_ESHAPE, "q: stride[3] is 2; the head dim must be contiguous");
	f->req.u.fwd.q.stride[3] = 1;
	f->req.u.fwd.v.shape[1] = 5;
	expect(f, 0, FA_ESHAPE, "v: shape [1, 5, 1, 8] differs from k's [1, 4, 1, 8]");
	f->req.u.fwd.v.shape[1] = 4;
	f->req.u.fwd.o.shape[0] = 0;
	expect(f, 0, FA_ESHAPE, "o: shape[0] is 0; every size must be >= 1");
	f->req.u.fwd.o.shape[0] = 1;
	f->req.u.fwd.k.shape[0] = 2;
	expect(f, 0, FA_ESHAPE, "k: batch 2 differs from q's 1");
	f->req.u.fwd.k.shape[0] = 1;
	/* Head dim 12: the descriptor check (not a multiple of 8). */
	dtest_tensor(&f->req.u.fwd.q, f->r1, 0, FA_DTYPE_FP16, 1, 4, 2, 12);
	dtest_tensor(&f->req.u.fwd.o, f->r1, 512, FA_DTYPE_FP16, 1, 4, 2, 12);
	dtest_tensor(&f->req.u.fwd.k, f->r1, 2048, FA_DTYPE_FP16, 1, 4, 1, 12);
	dtest_tensor(&f->req.u.fwd.v, f->r1, 4096, FA_DTYPE_FP16, 1, 4, 1, 12);
	expect(f, 0, FA_ESHAPE, "head dim 12 is not a multiple of 8");
}

static void test_validate_bad_mask_is_einval(void **state)
{
	struct fixture *f = *state;

	f->req.u.fwd.mask = 7;
	expect(f, 0, FA_EINVAL, "mask 7 is unknown");
}

static void test_validate_refuses_a_region_that_lost_pages(void **state)
{
	struct fixture *f = *state;

	atomic_store(&f->r1->broken, 1);
	expect(f, 0, FA_ERANGE, "lost pages while in use");
}

/* validate_attn_fwd_memo: st and text as validate_attn_fwd's, and the same result */
static fa_status memo_same(struct fixture *f, size_t align, struct validate_result *vr)
{
	struct validate_result want;
	char e1[FA_PROTO_DETAIL_MAX], e2[FA_PROTO_DETAIL_MAX];
	fa_status s1 = validate_attn_fwd_memo(f->s, &f->req, align, vr, e1, sizeof e1);
	fa_status s2 = validate_attn_fwd(f->s, &f->req, align, &want, e2, sizeof e2);
	assert_int_equal(s1, s2);
	assert_string_equal(e1, e2);
	if (s1 == FA_OK)
		assert_memory_equal(vr, &want, sizeof want);
	return s1;
}

static void test_validate_memo_answers_repeats_and_nothing_else(void **state)
{
	struct fixture *f = *state;
	struct validate_result vr;

	assert_int_equal(memo_same(f, 0, &vr), FA_OK);
	const void *memo = f->s->validate_memo;
	assert_non_null(memo);
	for (uint64_t seq = 1; seq < 5; seq++) { /* repeats: another seq only */
		f->req.seq = seq;
		assert_int_equal(memo_same(f, 0, &vr), FA_OK);
	}
	/* another field, another alignment: validated in full */
	f->req.u.fwd.o.offset = REGION_BYTES - 64;
	assert_int_equal(memo_same(f, 0, &vr), FA_ERANGE);
	f->req.u.fwd.o.offset = 520;
	assert_int_equal(memo_same(f, 0, &vr), FA_OK);
	assert_ptr_equal(vr.o, (char *)f->r1->base + 520);
	assert_int_equal(memo_same(f, 16, &vr), FA_EALIGN);
	assert_int_equal(memo_same(f, 0, &vr), FA_OK);
	/* a region that lost its pages since: the full checks' refusal */
	atomic_store(&f->r1->broken, 1);
	assert_int_equal(memo_same(f, 0, &vr), FA_ERANGE);
	atomic_store(&f->r1->broken, 0);
	assert_int_equal(memo_same(f, 0, &vr), FA_OK);
	/* the region unregistered: the remembered result is not used */
	uint64_t gen = f->s->regions_gen;
	assert_int_equal(session_region_remove(f->s, f->r1->id), FA_OK);
	assert_true(f->s->regions_gen != gen);
	assert_int_equal(memo_same(f, 0, &vr), FA_EREGION);
	assert_ptr_equal(f->s->validate_memo, memo); /* one memo per session, reused */
}

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_validate_accepts_a_good_request),
		T(test_validate_extent_past_the_region_is_erange),
		T(test_validate_overflowing_strides_are_erange),
		T(test_validate_offset_plus_extent_overflow_is_erange),
		T(test_validate_misaligned_offset_is_ealign),
		T(test_validate_overlapping_output_is_eoverlap),
		T(test_validate_output_over_an_input_through_another_registration_is_eoverlap),
		T(test_validate_overlap_compares_memory_identity_and_bytes_in_it),
		T(test_validate_foreign_or_unknown_region_is_eregion),
		T(test_validate_dtype_mismatch_is_edtype),
		T(test_validate_gqa_mismatch_is_eshape),
		T(test_validate_lse_shape_is_eshape),
		T(test_validate_other_shape_errors_are_eshape),
		T(test_validate_bad_mask_is_einval),
		T(test_validate_refuses_a_region_that_lost_pages),
		T(test_validate_memo_answers_repeats_and_nothing_else),
	};
	log_level = FA_LOG_ERR;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
