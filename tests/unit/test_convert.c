/*
 * test_convert.c - float32 <-> bfloat16 <-> float16 element conversions
 * (formats/convert.h): the rounding cases that decide correctness (ties to
 * even, the largest finite values, the subnormal boundary, overflow to
 * infinity, signed zeros, quiet NaNs), every 16-bit pattern widened and
 * narrowed back to itself, and the array conversion against the scalar
 * one, and the vector loops of every level the CPU runs against the
 * scalars. tests/integration/it_convert.c checks the same conversions against
 * numpy and ml_dtypes on random data.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/convert.h"
#include "tests/unit/unit.h"

static float f(uint32_t bits) { return ts_f32_from_bits(bits); }

START_TEST(test_bf16_rounding)
{
	ck_assert_uint_eq(ts_f32_to_bf16(1.0f), 0x3f80);
	ck_assert_uint_eq(ts_f32_to_bf16(-2.0f), 0xc000);
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x3f808000)), 0x3f80);   /* tie: to the even 0x3f80 */
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x3f818000)), 0x3f82);   /* tie: to the even 0x3f82 */
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x3f808001)), 0x3f81);   /* past the tie: up */
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x3f807fff)), 0x3f80);   /* below it: down */
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x7f7fffff)), 0x7f80);   /* FLT_MAX rounds to inf */
	ck_assert_uint_eq(ts_f32_to_bf16(INFINITY), 0x7f80);
	ck_assert_uint_eq(ts_f32_to_bf16(-INFINITY), 0xff80);
	ck_assert_uint_eq(ts_f32_to_bf16(-0.0f), 0x8000);
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x00010000)), 0x0001);   /* a subnormal stays one */
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x7fc00000)), 0x7fc0);
	ck_assert_uint_eq(ts_f32_to_bf16(f(0x7f800001)) & 0x7fc0, 0x7fc0);  /* signalling: quiet */
	ck_assert_uint_eq(ts_f32_to_bf16(f(0xffc00000)), 0xffc0);
}
END_TEST

START_TEST(test_f16_rounding)
{
	ck_assert_uint_eq(ts_f32_to_f16(1.0f), 0x3c00);
	ck_assert_uint_eq(ts_f32_to_f16(-2.0f), 0xc000);
	ck_assert_uint_eq(ts_f32_to_f16(65504.0f), 0x7bff);          /* the largest finite */
	ck_assert_uint_eq(ts_f32_to_f16(65519.996f), 0x7bff);
	ck_assert_uint_eq(ts_f32_to_f16(65520.0f), 0x7c00);          /* the tie goes to inf */
	ck_assert_uint_eq(ts_f32_to_f16(1e10f), 0x7c00);
	ck_assert_uint_eq(ts_f32_to_f16(-1e10f), 0xfc00);
	ck_assert_uint_eq(ts_f32_to_f16(ldexpf(1.0f, -14)), 0x0400); /* the smallest normal */
	ck_assert_uint_eq(ts_f32_to_f16(ldexpf(1.0f, -24)), 0x0001); /* the smallest subnormal */
	ck_assert_uint_eq(ts_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* its half: tie to even 0 */
	ck_assert_uint_eq(ts_f32_to_f16(ldexpf(3.0f, -26)), 0x0001); /* above the half: up */
	ck_assert_uint_eq(ts_f32_to_f16(ldexpf(3.0f, -25)), 0x0002); /* 1.5 units: tie to even 2 */
	ck_assert_uint_eq(ts_f32_to_f16(ldexpf(5.0f, -25)), 0x0002); /* 2.5 units: tie to even 2 */
	ck_assert_uint_eq(ts_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400); /* carries into normal */
	ck_assert_uint_eq(ts_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);   /* tie: even */
	ck_assert_uint_eq(ts_f32_to_f16(1.0f + ldexpf(3.0f, -11)), 0x3c02);   /* tie: even */
	ck_assert_uint_eq(ts_f32_to_f16(f(0x00000001)), 0x0000);     /* a float32 subnormal */
	ck_assert_uint_eq(ts_f32_to_f16(-0.0f), 0x8000);
	ck_assert_uint_eq(ts_f32_to_f16(INFINITY), 0x7c00);
	ck_assert_uint_eq(ts_f32_to_f16(f(0x7fc00000)), 0x7e00);
	ck_assert_uint_eq(ts_f32_to_f16(f(0x7f800001)) & 0x7e00, 0x7e00);     /* signalling: quiet */
}
END_TEST

/* Every 16-bit pattern widens exactly and narrows back to itself (NaNs to
 * a quiet NaN of the same sign). */
START_TEST(test_every_pattern_round_trips)
{
	for (uint32_t h = 0; h < 0x10000; h++) {
		float a = ts_f16_to_f32((uint16_t)h), b = ts_bf16_to_f32((uint16_t)h);
		bool f16_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff), bf16_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);

		ck_assert_msg(f16_nan == (bool)isnan(a), "f16 %04x", h);
		ck_assert_msg(bf16_nan == (bool)isnan(b), "bf16 %04x", h);
		if (f16_nan)
			ck_assert_uint_eq(ts_f32_to_f16(a), h | 0x0200);
		else
			ck_assert_msg(ts_f32_to_f16(a) == h, "f16 %04x -> %a -> %04x", h, a, ts_f32_to_f16(a));
		if (bf16_nan)
			ck_assert_uint_eq(ts_f32_to_bf16(b), h | 0x0040);
		else
			ck_assert_msg(ts_f32_to_bf16(b) == h, "bf16 %04x -> %04x", h, ts_f32_to_bf16(b));
	}
	/* widening is exact: the smallest subnormals */
	ck_assert(ts_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
	ck_assert(ts_f16_to_f32(0x83ff) == -ldexpf(1023.0f, -24));
	ck_assert(ts_f16_to_f32(0x7bff) == 65504.0f);
}
END_TEST

START_TEST(test_arrays_match_scalars)
{
	enum { N = 4099 };
	static const enum ts_dtype kinds[] = {TS_DT_FLOAT32, TS_DT_BFLOAT16, TS_DT_FLOAT16};
	static float src[N], back[N];
	static uint16_t half[N];
	uint64_t seed = 12345;

	for (int i = 0; i < N; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		src[i] = f((uint32_t)(seed >> 32));
	}
	ck_assert(ts_convert_supported(TS_DT_FLOAT32, TS_DT_BFLOAT16));
	ck_assert(ts_convert_supported(TS_DT_FLOAT16, TS_DT_BFLOAT16));
	ck_assert(ts_convert_supported(TS_DT_INT32, TS_DT_INT32));
	ck_assert(!ts_convert_supported(TS_DT_INT32, TS_DT_FLOAT32));
	ck_assert(!ts_convert_supported(TS_DT_FLOAT64, TS_DT_FLOAT32));
	for (int k = 1; k < 3; k++) {
		ts_convert(kinds[k], half, TS_DT_FLOAT32, src, N);
		for (int i = 0; i < N; i++) {
			uint16_t want = kinds[k] == TS_DT_BFLOAT16 ? ts_f32_to_bf16(src[i])
			                                           : ts_f32_to_f16(src[i]);

			ck_assert_msg(half[i] == want, "%s[%d]", ts_dtype_name(kinds[k]), i);
		}
		ts_convert(TS_DT_FLOAT32, back, kinds[k], half, N);
		for (int i = 0; i < N; i++) {
			float want = kinds[k] == TS_DT_BFLOAT16 ? ts_bf16_to_f32(half[i])
			                                        : ts_f16_to_f32(half[i]);

			ck_assert(ts_f32_bits(back[i]) == ts_f32_bits(want));
		}
	}
	/* float16 -> bfloat16: through float32, one rounding */
	{
		uint16_t h = 0x3c01, out;         /* 1 + 2^-10: bf16 keeps 7 bits, so 1.0 */

		ts_convert(TS_DT_BFLOAT16, &out, TS_DT_FLOAT16, &h, 1);
		ck_assert_uint_eq(out, 0x3f80);
	}
}
END_TEST

/* ---- the vector loops (every level this CPU runs) against the scalars ---- */

enum { PAD = 32 };                        /* elements of slack for the offsets */

/* dst[0, n) of a conversion to `to` at level, each element's bits against
 * the scalar conversion of the same source element (a plain compare per
 * element: ck_assert marks a point through a pipe each time). */
static void check_against_scalar(int level, enum ts_dtype to, const void *dst, enum ts_dtype from,
                                 const void *src, uint64_t n, const char *what)
{
	for (uint64_t i = 0; i < n; i++) {
		if (from == TS_DT_FLOAT32) {
			float x = ((const float *)src)[i];
			uint16_t got = ((const uint16_t *)dst)[i];
			uint16_t want = to == TS_DT_BFLOAT16 ? ts_f32_to_bf16(x) : ts_f32_to_f16(x);

			if (got != want)
				ck_abort_msg("level %d %s %s[%llu]: %08x -> %04x, want %04x", level, what,
				             ts_dtype_name(to), (unsigned long long)i, ts_f32_bits(x), got,
				             want);
		} else {
			uint16_t h = ((const uint16_t *)src)[i];
			uint32_t got = ts_f32_bits(((const float *)dst)[i]);
			uint32_t want = ts_f32_bits(from == TS_DT_BFLOAT16 ? ts_bf16_to_f32(h)
			                                                   : ts_f16_to_f32(h));

			if (got != want)
				ck_abort_msg("level %d %s %s[%llu]: %04x -> %08x, want %08x", level, what,
				             ts_dtype_name(from), (unsigned long long)i, h, got, want);
		}
	}
}

/* Converts src[0, n) at every level, whole and from element offsets that
 * leave the vectors unaligned, with lengths that are no multiple of a
 * vector, into a destination poisoned first; checks each element and that
 * nothing past the end was written. */
static void check_all_levels(enum ts_dtype to, enum ts_dtype from, const void *src, uint64_t n)
{
	static const uint64_t offs[] = {0, 1, 3, 7, 8, 15, 17};
	size_t in = ts_dtype_size(from), out = ts_dtype_size(to);
	size_t bytes = ((size_t)(n + PAD) * out + 64 + 63) & ~(size_t)63;
	unsigned char *dst = aligned_alloc(64, bytes);  /* C11: a multiple of the alignment */

	ck_assert_ptr_nonnull(dst);
	for (int level = 0; level <= ts__convert_level(); level++)
		for (size_t o = 0; o < sizeof offs / sizeof offs[0]; o++) {
			uint64_t off = offs[o], m = n - off - (o % 3) * 5;
			const unsigned char *s = (const unsigned char *)src + off * in;
			unsigned char *d = dst + ((off * 5) % 16) * out;

			memset(dst, 0xa5, bytes);
			ts__convert_at(level, to, d, from, s, m);
			check_against_scalar(level, to, d, from, s, m, o ? "offset" : "whole");
			for (size_t b = 0; b < 2 * out; b++)
				ck_assert_msg(d[m * out + b] == 0xa5, "level %d: written past the end", level);
			/* short lengths: the tails alone */
			for (uint64_t k = 0; k <= 40; k++) {
				ts__convert_at(level, to, d, from, s, k);
				check_against_scalar(level, to, d, from, s, k, "short");
			}
		}
	free(dst);
}

/* Every bfloat16 and float16 bit pattern widened at every level. */
START_TEST(test_vector_widen_every_pattern)
{
	uint16_t *h = malloc((0x10000 + PAD) * sizeof *h);

	ck_assert_ptr_nonnull(h);
	for (uint32_t i = 0; i < 0x10000 + PAD; i++)
		h[i] = (uint16_t)(i * 0x9e37u);    /* every pattern once in the first 2^16 (odd step) */
	check_all_levels(TS_DT_FLOAT32, TS_DT_BFLOAT16, h, 0x10000 + PAD);
	check_all_levels(TS_DT_FLOAT32, TS_DT_FLOAT16, h, 0x10000 + PAD);
	free(h);
}
END_TEST

/* float32 values around every rounding boundary of both types (each
 * bfloat16 value's ties and neighbours, each float16 midpoint and its
 * neighbours, which include the subnormal range, the overflow to
 * infinity and the smallest subnormal's half), float32 subnormals, infs,
 * NaNs (signalling and quiet, every payload bit) and random bit patterns,
 * narrowed at every level. */
START_TEST(test_vector_narrow_boundaries)
{
	enum { RANDOM = 1 << 18 };
	uint64_t cap = 0x10000 * 6 + 0x10000 * 5 + 0x10000 + 64 + RANDOM, n = 0, seed = 99;
	uint32_t *u = malloc(cap * sizeof *u);
	static const uint32_t bf16_near[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};

	ck_assert_ptr_nonnull(u);
	for (uint32_t h = 0; h < 0x10000; h++)
		for (size_t k = 0; k < sizeof bf16_near / sizeof bf16_near[0]; k++)
			u[n++] = (h << 16) + bf16_near[k];
	for (uint32_t h = 0; h < 0x10000; h++) {
		float a = ts_f16_to_f32((uint16_t)h), b = ts_f16_to_f32((uint16_t)(h + 1));
		uint32_t mid;

		if (isnan(a) || isnan(b) || isinf(a) || (h & 0x7fff) == 0x7fff)
			continue;
		/* the exact midpoint of neighbouring float16 values (12 bits fit a float32) */
		mid = ts_f32_bits((float)(((double)a + (double)b) / 2));
		u[n++] = mid - 1;
		u[n++] = mid;
		u[n++] = mid + 1;
		u[n++] = ts_f32_bits(a) - 1;
		u[n++] = ts_f32_bits(a) + 1;
	}
	for (uint32_t k = 0; k < 0x10000; k++)     /* float32 subnormals, both signs */
		u[n++] = ((k & 1) << 31) | (k * 0x7fu & 0x7fffffu);
	for (uint32_t k = 0; k < 23; k++) {         /* NaNs: each payload bit, both signs */
		u[n++] = 0x7f800000u | (1u << k);
		u[n++] = 0xff800000u | (1u << k);
	}
	u[n++] = 0x7f800000u;
	u[n++] = 0xff800000u;
	u[n++] = 0x7fffffffu;
	u[n++] = 0xffffffffu;
	for (int k = 0; k < RANDOM; k++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		u[n++] = (uint32_t)(seed >> 32);
	}
	ck_assert_uint_le(n, cap);
	check_all_levels(TS_DT_BFLOAT16, TS_DT_FLOAT32, u, n);
	check_all_levels(TS_DT_FLOAT16, TS_DT_FLOAT32, u, n);
	free(u);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("convert");
	TCase *tc = tcase_create("convert");

	tcase_add_test(tc, test_bf16_rounding);
	tcase_add_test(tc, test_f16_rounding);
	tcase_add_test(tc, test_every_pattern_round_trips);
	tcase_add_test(tc, test_arrays_match_scalars);
	tcase_add_test(tc, test_vector_widen_every_pattern);
	tcase_add_test(tc, test_vector_narrow_boundaries);
	suite_add_tcase(s, tc);
	return s;
}
