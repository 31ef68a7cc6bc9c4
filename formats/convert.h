/*
 * convert.h - converting floating-point elements between float32, bfloat16
 * and float16, as jnp.astype does: widening is exact, narrowing rounds to
 * the nearest value with ties to even, overflows to infinity, keeps signed
 * zeros and subnormals, and turns a NaN into a quiet NaN of the same sign.
 *
 * The scalar conversions are static inline (and, under nvcc, __host__
 * __device__), so a device kernel converts exactly as the host does.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_CONVERT_H
#define TS_CONVERT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "formats/dtype.h"

#if defined(__CUDACC__)
#define TS_CONVERT_HD __host__ __device__
#else
#define TS_CONVERT_HD
#endif

static inline TS_CONVERT_HD uint32_t ts_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof u);
	return u;
}

static inline TS_CONVERT_HD float ts_f32_from_bits(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof f);
	return f;
}

/* bfloat16 is the upper half of a float32. */
static inline TS_CONVERT_HD float ts_bf16_to_f32(uint16_t h)
{
	return ts_f32_from_bits((uint32_t)h << 16);
}

static inline TS_CONVERT_HD uint16_t ts_f32_to_bf16(float f)
{
	uint32_t u = ts_f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)            /* NaN: keep it quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	u += 0x7fffu + ((u >> 16) & 1u);                /* ties to even; carries into inf */
	return (uint16_t)(u >> 16);
}

static inline TS_CONVERT_HD float ts_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;

	if (exp == 0x1f)                                /* inf, NaN (quiet) */
		return ts_f32_from_bits(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0));
	if (exp == 0) {
		if (man == 0)
			return ts_f32_from_bits(sign);
		/* subnormal: man * 2^-24, exact in float32 */
		float v = (float)man * (1.0f / 16777216.0f);

		return sign ? -v : v;
	}
	return ts_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline TS_CONVERT_HD uint16_t ts_f32_to_f16(float f)
{
	uint32_t u = ts_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;

	if (a > 0x7f800000u)                            /* NaN: quiet, top mantissa bits kept */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u)                           /* rounds to 65520 or more: inf */
		return (uint16_t)(sign | 0x7c00u);
	if (a < 0x38800000u) {                          /* below 2^-14: subnormal or zero */
		uint32_t exp = a >> 23, man, shift, q, rest, half;

		if (exp < 102)                              /* below half the smallest subnormal */
			return (uint16_t)sign;
		man = (a & 0x7fffffu) | 0x800000u;
		shift = 126 - exp;                          /* to units of 2^-24 */
		q = man >> shift;
		rest = man & ((1u << shift) - 1);
		half = 1u << (shift - 1);
		q += rest > half || (rest == half && (q & 1u));
		return (uint16_t)(sign | q);                /* q may carry into the normal range */
	}
	/* normal: rebias 127 -> 15, round 13 bits away (ties to even) */
	a -= 0x38000000u;
	a += 0xfffu + ((a >> 13) & 1u);
	return (uint16_t)(sign | (a >> 13));
}

/* Whether elements of `from` can be converted to `to` (the floating types
 * float32, bfloat16 and float16, either way; a type to itself). */
bool ts_convert_supported(enum ts_dtype from, enum ts_dtype to);

/* Converts n elements of src (dtype from) into dst (dtype to); the pair must
 * be supported. src and dst do not overlap. float32 <-> bfloat16 and
 * float16 run in the widest vectors the CPU has, with the scalar
 * conversions' bits. */
void ts_convert(enum ts_dtype to, void *dst, enum ts_dtype from, const void *src, uint64_t n);

/* Internal, for tests: the widest vector loops this CPU runs (0 scalar,
 * 1 AVX2 with F16C, 2 AVX-512F), and ts_convert with them capped at level
 * (a level above the CPU's runs the CPU's). */
int ts__convert_level(void);
void ts__convert_at(int level, enum ts_dtype to, void *dst, enum ts_dtype from, const void *src,
                    uint64_t n);

#endif
