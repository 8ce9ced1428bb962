/* test_dtype.c - element types: sizes, names, and fp16/bf16 conversions against known bit patterns.
 *
 * The expected patterns are IEEE 754 binary16 and bfloat16 with round to nearest, ties to even.
 * Each rounding case is built from exact powers of two so its expectation can be checked by hand.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fa_attn.h"

static uint32_t bits_of(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static float float_of(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* fp16 pattern of f, and the pattern fa_store_elem writes for the double v. */
static uint16_t half_of_double(double v)
{
	uint16_t h = 0;
	fa_store_elem(&h, FA_DTYPE_FP16, 0, v);
	return h;
}

static uint16_t bf16_of_double(double v)
{
	uint16_t h = 0;
	fa_store_elem(&h, FA_DTYPE_BF16, 0, v);
	return h;
}

static void test_dtype_sizes_and_names(void **state)
{
	(void)state;
	assert_int_equal(fa_dtype_size(FA_DTYPE_FP16), 2);
	assert_int_equal(fa_dtype_size(FA_DTYPE_BF16), 2);
	assert_int_equal(fa_dtype_size(FA_DTYPE_FP32), 4);
	assert_int_equal(fa_dtype_size((fa_dtype)0), 0);
	assert_int_equal(fa_dtype_size((fa_dtype)77), 0);
	assert_string_equal(fa_dtype_name(FA_DTYPE_FP16), "fp16");
	assert_string_equal(fa_dtype_name(FA_DTYPE_BF16), "bf16");
	assert_string_equal(fa_dtype_name(FA_DTYPE_FP32), "fp32");
	assert_string_equal(fa_dtype_name((fa_dtype)9), "?");
}

static void test_dtype_parse_accepts_common_spellings(void **state)
{
	(void)state;
	static const struct {
		const char *s;
		fa_dtype dt;
	} ok[] = {{"fp16", FA_DTYPE_FP16},     {"F16", FA_DTYPE_FP16},  {"half", FA_DTYPE_FP16},
	          {"float16", FA_DTYPE_FP16},  {"bf16", FA_DTYPE_BF16}, {"BFloat16", FA_DTYPE_BF16},
	          {"fp32", FA_DTYPE_FP32},     {"f32", FA_DTYPE_FP32},  {"float", FA_DTYPE_FP32},
	          {"float32", FA_DTYPE_FP32},  {"single", FA_DTYPE_FP32}};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		fa_dtype dt = (fa_dtype)0;
		assert_true(fa_dtype_parse(ok[i].s, &dt));
		assert_int_equal(dt, ok[i].dt);
		/* the name of a dtype parses back to it */
		assert_true(fa_dtype_parse(fa_dtype_name(ok[i].dt), &dt));
		assert_int_equal(dt, ok[i].dt);
	}
}

static void test_dtype_parse_rejects_unknown_names(void **state)
{
	(void)state;
	fa_dtype dt = FA_DTYPE_BF16;
	assert_false(fa_dtype_parse("fp8", &dt));
	assert_false(fa_dtype_parse("", &dt));
	assert_false(fa_dtype_parse("fp16 ", &dt));
	assert_false(fa_dtype_parse("?", &dt));
	assert_false(fa_dtype_parse(NULL, &dt));
	assert_int_equal(dt, FA_DTYPE_BF16); /* untouched */
}

static void test_half_encodes_known_values(void **state)
{
	(void)state;
	assert_int_equal(fa_float_to_half(0.0f), 0x0000);
	assert_int_equal(fa_float_to_half(-0.0f), 0x8000);
	assert_int_equal(fa_float_to_half(1.0f), 0x3c00);
	assert_int_equal(fa_float_to_half(-2.0f), 0xc000);
	assert_int_equal(fa_float_to_half(0.5f), 0x3800);
	assert_int_equal(fa_float_to_half(0.1f), 0x2e66);
	assert_int_equal(fa_float_to_half(1.0f / 3.0f), 0x3555);
	assert_int_equal(fa_float_to_half(65504.0f), 0x7bff);     /* max */
	assert_int_equal(fa_float_to_half(-65504.0f), 0xfbff);
	assert_int_equal(fa_float_to_half(0x1p-14f), 0x0400);     /* min normal */
	assert_int_equal(fa_float_to_half(0x1p-24f), 0x0001);     /* min subnormal */
	assert_int_equal(fa_float_to_half(0x3ffp-24f), 0x03ff);   /* max subnormal */
	assert_int_equal(fa_float_to_half(-0x1p-24f), 0x8001);
	assert_int_equal(fa_float_to_half(INFINITY), 0x7c00);
	assert_int_equal(fa_float_to_half(-INFINITY), 0xfc00);
}

static void test_half_rounds_to_nearest_even(void **state)
{
	(void)state;
	/* 1 + 2^-11 is halfway between 0x3c00 and 0x3c01: ties go to the even 0x3c00 */
	assert_int_equal(fa_float_to_half(1.0f + 0x1p-11f), 0x3c00);
	/* 1 + 3*2^-11 is halfway between 0x3c01 and 0x3c02: even is 0x3c02 */
	assert_int_equal(fa_float_to_half(1.0f + 0x3p-11f), 0x3c02);
	/* just above and below a tie go to the nearer */
	assert_int_equal(fa_float_to_half(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
	assert_int_equal(fa_float_to_half(1.0f + 0x1p-11f - 0x1p-20f), 0x3c00);
	/* 65519 is below the tie to 2^16: max; 65520 is the tie: rounds to even, which is inf */
	assert_int_equal(fa_float_to_half(65519.0f), 0x7bff);
	assert_int_equal(fa_float_to_half(65520.0f), 0x7c00);
	assert_int_equal(fa_float_to_half(1e6f), 0x7c00);
	assert_int_equal(fa_float_to_half(-1e6f), 0xfc00);
	/* 2^-25 is half the smallest subnormal: tie to even 0; anything above it rounds up */
	assert_int_equal(fa_float_to_half(0x1p-25f), 0x0000);
	assert_int_equal(fa_float_to_half(-0x1p-25f), 0x8000);
	assert_int_equal(fa_float_to_half(0x1.000002p-25f), 0x0001);
	assert_int_equal(fa_float_to_half(0x1p-26f), 0x0000);
	assert_int_equal(fa_float_to_half(0x1p-149f), 0x0000); /* float's smallest subnormal */
	/* 3 * 2^-25 is halfway between subnormals 1 and 2: even is 2 */
	assert_int_equal(fa_float_to_half(0x3p-25f), 0x0002);
	assert_int_equal(fa_float_to_half(0x5p-25f), 0x0002);
	/* the largest subnormal plus half a step ties up into the smallest normal (even) */
	assert_int_equal(fa_float_to_half(0x7ffp-25f), 0x0400);
}

static void test_half_keeps_nan(void **state)
{
	(void)state;
	uint16_t h = fa_float_to_half(NAN);
	assert_int_equal(h & 0x7c00, 0x7c00);
	assert_int_not_equal(h & 0x03ff, 0);
	assert_int_equal(fa_float_to_half(-NAN) & 0x8000, 0x8000);
	/* a signalling NaN whose payload lives only in the low bits must not become inf */
	h = fa_float_to_half(float_of(0x7f800001u));
	assert_int_equal(h & 0x7c00, 0x7c00);
	assert_int_not_equal(h & 0x03ff, 0);
	assert_true(isnan(fa_half_to_float(0x7e00)));
	assert_true(isnan(fa_half_to_float(0x7c01)));
	assert_true(isnan(fa_half_to_float(0xfe00)));
	assert_true(signbit(fa_half_to_float(0xfe00)));
	/* a quiet NaN's payload survives the round trip */
	assert_int_equal(fa_float_to_half(fa_half_to_float(0x7e5a)), 0x7e5a);
}

static void test_half_decodes_known_values(void **state)
{
	(void)state;
	assert_true(fa_half_to_float(0x3c00) == 1.0f);
	assert_true(fa_half_to_float(0x7bff) == 65504.0f);
	assert_true(fa_half_to_float(0x0001) == 0x1p-24f);
	assert_true(fa_half_to_float(0x03ff) == 0x3ffp-24f);
	assert_true(fa_half_to_float(0x0400) == 0x1p-14f);
	assert_true(fa_half_to_float(0x7c00) == INFINITY);
	assert_true(fa_half_to_float(0xfc00) == -INFINITY);
	assert_true(fa_half_to_float(0x8000) == 0.0f && signbit(fa_half_to_float(0x8000)));
	assert_true(fa_half_to_float(0xc000) == -2.0f);
}

/* Every non-NaN half decodes to sign * mantissa * 2^exponent and encodes back to itself. */
static void test_half_round_trips_every_pattern(void **state)
{
	(void)state;
	for (uint32_t u = 0; u <= 0xffff; u++) {
		uint16_t h = (uint16_t)u;
		uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
		float f = fa_half_to_float(h);
		if (e == 31 && m != 0) {
			assert_true(isnan(f));
			assert_true(isnan(fa_half_to_float(fa_float_to_half(f))));
			continue;
		}
		double want = e == 31 ? INFINITY
		              : e == 0 ? ldexp((double)m, -24)
		                       : ldexp((double)(m | 0x400), (int)e - 25);
		if (h & 0x8000)
			want = -want;
		assert_true((double)f == want);
		assert_int_equal(fa_float_to_half(f), h);
	}
}

static void test_bf16_encodes_known_values(void **state)
{
	(void)state;
	assert_int_equal(fa_float_to_bf16(0.0f), 0x0000);
	assert_int_equal(fa_float_to_bf16(-0.0f), 0x8000);
	assert_int_equal(fa_float_to_bf16(1.0f), 0x3f80);
	assert_int_equal(fa_float_to_bf16(-2.0f), 0xc000);
	assert_int_equal(fa_float_to_bf16(3.0f), 0x4040);
	assert_int_equal(fa_float_to_bf16(0.1f), 0x3dcd); /* 0x3dcccccd rounds up */
	assert_int_equal(fa_float_to_bf16(float_of(0x7f7f0000u)), 0x7f7f); /* max bf16 */
	assert_int_equal(fa_float_to_bf16(0x1p-126f), 0x0080);    /* min normal */
	assert_int_equal(fa_float_to_bf16(0x1p-133f), 0x0001);    /* min subnormal */
	assert_int_equal(fa_float_to_bf16(INFINITY), 0x7f80);
	assert_int_equal(fa_float_to_bf16(-INFINITY), 0xff80);
}

static void test_bf16_rounds_to_nearest_even(void **state)
{
	(void)state;
	assert_int_equal(fa_float_to_bf16(float_of(0x3f808000u)), 0x3f80); /* tie, even down */
	assert_int_equal(fa_float_to_bf16(float_of(0x3f818000u)), 0x3f82); /* tie, even up */
	assert_int_equal(fa_float_to_bf16(float_of(0x3f808001u)), 0x3f81);
	assert_int_equal(fa_float_to_bf16(float_of(0x3f807fffu)), 0x3f80);
	/* FLT_MAX is above the tie between bf16 max and 2^128: inf */
	assert_int_equal(fa_float_to_bf16(float_of(0x7f7fffffu)), 0x7f80);
	assert_int_equal(fa_float_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f);
	assert_int_equal(fa_float_to_bf16(float_of(0x7f7f8000u)), 0x7f80); /* tie: even is inf */
	/* subnormals round the same way */
	assert_int_equal(fa_float_to_bf16(float_of(0x00008000u)), 0x0000); /* tie to even 0 */
	assert_int_equal(fa_float_to_bf16(float_of(0x00018000u)), 0x0002);
	assert_int_equal(fa_float_to_bf16(float_of(0x00000001u)), 0x0000);
	assert_int_equal(fa_float_to_bf16(float_of(0x807fffffu)), 0x8080); /* into min normal */
}

static void test_bf16_keeps_nan(void **state)
{
	(void)state;
	uint16_t h = fa_float_to_bf16(NAN);
	assert_int_equal(h & 0x7f80, 0x7f80);
	assert_int_not_equal(h & 0x007f, 0);
	/* signalling NaNs with only low payload bits, and the NaN closest to inf, stay NaN */
	assert_true(isnan(fa_bf16_to_float(fa_float_to_bf16(float_of(0x7f800001u)))));
	assert_true(isnan(fa_bf16_to_float(fa_float_to_bf16(float_of(0x7fffffffu)))));
	assert_true(isnan(fa_bf16_to_float(fa_float_to_bf16(float_of(0xff800001u)))));
	assert_int_equal(fa_float_to_bf16(float_of(0xff800001u)) & 0x8000, 0x8000);
	assert_int_equal(fa_float_to_bf16(fa_bf16_to_float(0x7fc1)), 0x7fc1);
}

static void test_bf16_round_trips_every_pattern(void **state)
{
	(void)state;
	for (uint32_t u = 0; u <= 0xffff; u++) {
		uint16_t h = (uint16_t)u;
		float f = fa_bf16_to_float(h);
		assert_int_equal(bits_of(f), u << 16);
		if ((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0)
			assert_true(isnan(fa_bf16_to_float(fa_float_to_bf16(f))));
		else
			assert_int_equal(fa_float_to_bf16(f), h);
	}
}

/* Stores round once, from double: a double just above a tie of the 16-bit type must round up
 * even though rounding it to float first would land exactly on the tie. */
static void test_store_rounds_double_once(void **state)
{
	(void)state;
	double above = 1.0 + 0x1p-11 + 0x1p-40; /* (float) of it is exactly the fp16 tie */
	assert_true((double)(float)above == 1.0 + 0x1p-11);
	assert_int_equal(half_of_double(above), 0x3c01);
	assert_int_equal(half_of_double(1.0 + 0x1p-11), 0x3c00);
	assert_int_equal(half_of_double(1.0 + 0x1p-11 - 0x1p-40), 0x3c00);
	assert_int_equal(half_of_double(-(1.0 + 0x1p-11 + 0x1p-40)), 0xbc01);
	assert_int_equal(half_of_double(0x1p-25 + 0x1p-60), 0x0001); /* float would give 2^-25: 0 */
	assert_int_equal(half_of_double(0x1p-25), 0x0000);
	assert_int_equal(half_of_double(1e300), 0x7c00);
	assert_int_equal(half_of_double(-1e300), 0xfc00);
	assert_int_equal(half_of_double(1e-300), 0x0000);
	assert_int_equal(half_of_double(-1e-300), 0x8000);
	assert_int_equal(half_of_double(65519.999), 0x7bff);
	assert_int_equal(half_of_double(65520.0), 0x7c00);

	above = 1.0 + 0x1p-8 + 0x1p-40;
	assert_int_equal(bf16_of_double(above), 0x3f81);
	assert_int_equal(bf16_of_double(1.0 + 0x1p-8), 0x3f80);
	assert_int_equal(bf16_of_double(1e300), 0x7f80);
	assert_int_equal(bf16_of_double(-1e300), 0xff80);
	assert_int_equal(bf16_of_double(0x1p-134 + 0x1p-170), 0x0001); /* float would give 2^-134: 0 */
	assert_int_equal(bf16_of_double(0x1p-134), 0x0000);
	assert_int_equal(bf16_of_double(3.3962e38), 0x7f80); /* above the tie to 2^128, 3.39618e38 */
	assert_int_equal(bf16_of_double(3.3950e38), 0x7f7f);

	assert_int_equal(half_of_double(INFINITY), 0x7c00);
	assert_int_equal(bf16_of_double(-INFINITY), 0xff80);
	assert_true(isnan(fa_half_to_float(half_of_double(NAN))));
	assert_true(isnan(fa_bf16_to_float(bf16_of_double(NAN))));
	assert_int_equal(half_of_double(-NAN) & 0x8000, 0x8000);
	assert_int_equal(bf16_of_double(-NAN) & 0x8000, 0x8000);
}

static void test_load_and_store_elements_by_index(void **state)
{
	(void)state;
	float f32[3] = {0};
	uint16_t f16[3] = {0}, b16[3] = {0};
	const double vals[3] = {1.5, -0.25, 1024.0};
	for (int i = 0; i < 3; i++) {
		fa_store_elem(f32, FA_DTYPE_FP32, i, vals[i]);
		fa_store_elem(f16, FA_DTYPE_FP16, i, vals[i]);
		fa_store_elem(b16, FA_DTYPE_BF16, i, vals[i]);
	}
	for (int i = 0; i < 3; i++) {
		assert_true(fa_load_elem(f32, FA_DTYPE_FP32, i) == vals[i]);
		assert_true(fa_load_elem(f16, FA_DTYPE_FP16, i) == vals[i]);
		assert_true(fa_load_elem(b16, FA_DTYPE_BF16, i) == vals[i]);
	}
	assert_int_equal(f16[2], 0x6400);
	assert_int_equal(b16[0], 0x3fc0);
	/* fp32 stores round double to nearest float */
	fa_store_elem(f32, FA_DTYPE_FP32, 0, 0.1);
	assert_int_equal(bits_of(f32[0]), 0x3dcccccdu);
	/* an unknown dtype reads as NaN and writes nothing */
	assert_true(isnan(fa_load_elem(f32, (fa_dtype)0, 0)));
	fa_store_elem(f32, (fa_dtype)0, 1, 7.0);
	assert_true(f32[1] == -0.25f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dtype_sizes_and_names),
		cmocka_unit_test(test_dtype_parse_accepts_common_spellings),
		cmocka_unit_test(test_dtype_parse_rejects_unknown_names),
		cmocka_unit_test(test_half_encodes_known_values),
		cmocka_unit_test(test_half_rounds_to_nearest_even),
		cmocka_unit_test(test_half_keeps_nan),
		cmocka_unit_test(test_half_decodes_known_values),
		cmocka_unit_test(test_half_round_trips_every_pattern),
		cmocka_unit_test(test_bf16_encodes_known_values),
		cmocka_unit_test(test_bf16_rounds_to_nearest_even),
		cmocka_unit_test(test_bf16_keeps_nan),
		cmocka_unit_test(test_bf16_round_trips_every_pattern),
		cmocka_unit_test(test_store_rounds_double_once),
		cmocka_unit_test(test_load_and_store_elements_by_index),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
