/* fa_dtype.c - element types: parsing their names, and the fp16/bf16 <-> float conversions
 * (their sizes and names are request rules: common/fa_check.c).
 *
 * The conversions work on bit patterns so they do not depend on the compiler's _Float16 or the
 * host FPU's rounding mode, and so NaN payloads, infinities and subnormals come out exactly as
 * IEEE 754 (round to nearest, ties to even) says. The CPU reference stores its float64 results
 * through fa_store_elem, which rounds once, directly from double to the target type (no double
 * rounding through float).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "fa_attn.h"

/* Parse a dtype name, case-insensitively, with the spellings of PyTorch, NumPy and Julia. */
bool fa_dtype_parse(const char *s, fa_dtype *out)
{
	static const struct {
		const char *name;
		fa_dtype dt;
	} names[] = {
		{"fp16", FA_DTYPE_FP16},  {"f16", FA_DTYPE_FP16},      {"half", FA_DTYPE_FP16},
		{"float16", FA_DTYPE_FP16}, {"bf16", FA_DTYPE_BF16},   {"bfloat16", FA_DTYPE_BF16},
		{"fp32", FA_DTYPE_FP32},  {"f32", FA_DTYPE_FP32},      {"float", FA_DTYPE_FP32},
		{"float32", FA_DTYPE_FP32}, {"single", FA_DTYPE_FP32},
	};
	if (s == NULL)
		return false;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcasecmp(s, names[i].name) == 0) {
			if (out != NULL)
				*out = names[i].dt;
			return true;
		}
	}
	return false;
}

static uint32_t float_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	return u;
}

static float bits_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* fp16 -> float is exact: every half is a float. */
float fa_half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0) {
		/* zero or subnormal: m * 2^-24, exact in float */
		float v = (float)m * 0x1p-24f;
		return sign ? -v : v;
	}
	if (e == 31) /* inf, or NaN with its payload (the quiet bit lands on float's) */
		return bits_float(sign | 0x7f800000u | (m << 13));
	return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* float -> fp16, round to nearest even. */
uint16_t fa_float_to_half(float f)
{
	uint32_t x = float_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t ax = x & 0x7fffffffu;

	if (ax >= 0x7f800000u) {
		if (ax > 0x7f800000u) /* NaN: keep it quiet and keep the top of the payload */
			return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
		return (uint16_t)(sign | 0x7c00u);
	}
	if (ax >= 0x477ff000u) /* >= 65520 = halfway between 65504 and 2^16: ties go to inf (even) */
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) { /* below 2^-14: a subnormal half or zero */
		if (ax < 0x33000000u) /* below 2^-25 (half the smallest subnormal): zero */
			return sign;
		uint32_t e = ax >> 23;
		uint32_t m = (ax & 0x7fffffu) | 0x800000u;
		/* value = m * 2^(e-150); in units of 2^-24 that is m >> (126 - e) */
		uint32_t shift = 126u - e; /* 14..24 */
		uint32_t q = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1u);
		uint32_t halfway = 1u << (shift - 1u);
		if (rem > halfway || (rem == halfway && (q & 1u)))
			q++; /* may carry into the exponent: 0x400 is the smallest normal, still right */
		return (uint16_t)(sign | q);
	}
	/* normal: rebias the exponent (127 -> 15), drop 13 mantissa bits with rounding; a carry out
	 * of the mantissa increments the exponent, which is the right result */
	uint32_t r = ax - 0x38000000u;
	uint32_t h = r >> 13;
	uint32_t rem = r & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
		h++;
	return (uint16_t)(sign | h);
}

/* bf16 -> float is exact: a bf16 is the top half of a float. */
float fa_bf16_to_float(uint16_t h)
{
	return bits_float((uint32_t)h << 16);
}

/* float -> bf16, round to nearest even; overflow rounds to inf by the carry. */
uint16_t fa_float_to_bf16(float f)
{
	uint32_t x = float_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: force the quiet bit so it cannot become inf */
		return (uint16_t)((x >> 16) | 0x0040u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

/* double -> float rounded to odd: truncate toward zero and set the last bit if anything was lost.
 * Rounding that result to a type with at least two fewer significant bits (fp16: 11, bf16: 8,
 * versus float's 24, and likewise on their subnormal grids) gives the same value as rounding the
 * double directly, so stores round once. */
static float double_to_float_odd(double v)
{
	if (isnan(v))
		return signbit(v) ? -NAN : NAN;
	float f = (float)v;
	if ((double)f == v)
		return f;
	uint32_t b = float_bits(f);
	if (fabs((double)f) > fabs(v))
		b -= 1; /* one step toward zero in magnitude (inf becomes FLT_MAX) */
	return bits_float(b | 1u);
}

double fa_load_elem(const void *base, fa_dtype dt, int64_t i)
{
	switch (dt) {
	case FA_DTYPE_FP16: return fa_half_to_float(((const uint16_t *)base)[i]);
	case FA_DTYPE_BF16: return fa_bf16_to_float(((const uint16_t *)base)[i]);
	case FA_DTYPE_FP32: return ((const float *)base)[i];
	}
	return NAN;
}

void fa_store_elem(void *base, fa_dtype dt, int64_t i, double v)
{
	switch (dt) {
	case FA_DTYPE_FP16:
		((uint16_t *)base)[i] = fa_float_to_half(double_to_float_odd(v));
		break;
	case FA_DTYPE_BF16:
		((uint16_t *)base)[i] = fa_float_to_bf16(double_to_float_odd(v));
		break;
	case FA_DTYPE_FP32:
		((float *)base)[i] = (float)v;
		break;
	}
}
