/* fa_convert.c - fp16 and bf16 <-> float for C users who fill and read tensors by hand (C has no
 * portable half type; _Float16 and __bf16 depend on the compiler and target).
 *
 * Bit-pattern arithmetic, independent of the FPU's rounding mode: round to nearest, ties to even;
 * infinities and subnormals as IEEE 754 says; a NaN stays a (quiet) NaN. The same results as the
 * daemon's CPU reference (kernels/fa_dtype.c; test_messages compares every bf16 and every fp16).
 * Pure functions: any thread.
 */
#include <stdint.h>
#include <string.h>

#include "fa/fa_client.h"

static uint32_t float_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static float bits_float(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

FA_API float fa_float_from_fp16(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t e = (h >> 10) & 0x1fu;
	uint32_t m = h & 0x3ffu;

	if (e == 0) {
		float v = (float)m * 0x1p-24f; /* zero or subnormal, exact */
		return sign ? -v : v;
	}
	if (e == 31)
		return bits_float(sign | 0x7f800000u | (m << 13));
	return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

FA_API uint16_t fa_fp16_from_float(float f)
{
	uint32_t x = float_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t ax = x & 0x7fffffffu;

	if (ax >= 0x7f800000u) {
		if (ax > 0x7f800000u)
			return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
		return (uint16_t)(sign | 0x7c00u);
	}
	if (ax >= 0x477ff000u) /* >= 65520: rounds to inf */
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
		if (ax < 0x33000000u)
			return sign;
		uint32_t e = ax >> 23;
		uint32_t m = (ax & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126u - e;
		uint32_t q = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1u);
		uint32_t halfway = 1u << (shift - 1u);
		if (rem > halfway || (rem == halfway && (q & 1u)))
			q++;
		return (uint16_t)(sign | q);
	}
	uint32_t r = ax - 0x38000000u;
	uint32_t h = r >> 13;
	uint32_t rem = r & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
		h++;
	return (uint16_t)(sign | h);
}

FA_API float fa_float_from_bf16(uint16_t h)
{
	return bits_float((uint32_t)h << 16);
}

FA_API uint16_t fa_bf16_from_float(float f)
{
	uint32_t x = float_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x0040u);
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}
