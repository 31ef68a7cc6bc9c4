/*
 * test_convert.c - float32 <-> bfloat16 <-> float16 element conversions
 * (formats/convert.h): the rounding cases that decide correctness (ties to
 * even, the largest finite values, the subnormal boundary, overflow to
 * infinity, signed zeros, quiet NaNs), every 16-bit pattern widened and
 * narrowed back to itself, and the array conversion against the scalar
 * one. tests/integration/it_convert.c checks the same conversions against
 * numpy and ml_dtypes on random data.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "formats/convert.h"

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

int main(void)
{
	Suite *s = suite_create("convert");
	TCase *tc = tcase_create("convert");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_bf16_rounding);
	tcase_add_test(tc, test_f16_rounding);
	tcase_add_test(tc, test_every_pattern_round_trips);
	tcase_add_test(tc, test_arrays_match_scalars);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
