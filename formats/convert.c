/*
 * convert.c - element conversions between float32, bfloat16 and float16.
 * float16 <-> bfloat16 goes through float32: the widening is exact, so the
 * one rounding is the narrowing's.
 *
 * The four float32 <-> 16-bit loops have vector versions on x86-64, chosen
 * per call with __builtin_cpu_supports (ts__convert_level; no ifuncs, so
 * they also run under ThreadSanitizer): AVX-512F 16 lanes at a time, AVX2
 * with F16C 8. Each gives the bits of the scalar conversions of convert.h:
 * bfloat16 rounds with the same integer ties-to-even trick in every lane
 * (not VCVTNEPS2BF16, which flushes subnormal inputs to zero), float16 with
 * VCVTPS2PH in round-to-nearest-even, which IEEE-rounds subnormals, turns a
 * NaN quiet keeping its top mantissa bits, and VCVTPH2PS, which is exact.
 * The MXCSR's DAZ and FTZ stay clear in this process, as IEEE asks. The
 * elements a vector does not cover go through the scalar conversions.
 */
#include "formats/convert.h"

/* GCC's: clang's __builtin_cpu_supports may not know "f16c" (its builds
 * run the scalar loops) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define TS_CONVERT_X86 1
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,f16c")))
#endif

static bool is_float(enum ts_dtype dt)
{
	return dt == TS_DT_FLOAT32 || dt == TS_DT_BFLOAT16 || dt == TS_DT_FLOAT16;
}

bool ts_convert_supported(enum ts_dtype from, enum ts_dtype to)
{
	return from == to || (is_float(from) && is_float(to));
}

static float load(enum ts_dtype dt, const void *src, uint64_t i)
{
	uint16_t h;
	float f;

	if (dt == TS_DT_FLOAT32) {
		memcpy(&f, (const char *)src + i * 4, 4);
		return f;
	}
	memcpy(&h, (const char *)src + i * 2, 2);
	return dt == TS_DT_BFLOAT16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
}

static void store(enum ts_dtype dt, void *dst, uint64_t i, float f)
{
	uint16_t h;

	if (dt == TS_DT_FLOAT32) {
		memcpy((char *)dst + i * 4, &f, 4);
		return;
	}
	h = dt == TS_DT_BFLOAT16 ? ts_f32_to_bf16(f) : ts_f32_to_f16(f);
	memcpy((char *)dst + i * 2, &h, 2);
}

/* ---- vector loops: each returns how many leading elements it converted --- */

#ifdef TS_CONVERT_X86
/* ts_f32_to_bf16 in 16 lanes: NaNs get the quiet bit, the rest
 * u + 0x7fff + lsb, which carries into the exponent (and into infinity) as
 * the scalar's does. */
AVX512 static uint64_t f32_to_bf16_avx512(uint16_t *d, const float *s, uint64_t n)
{
	const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
	const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
	const __m512i quiet = _mm512_set1_epi32(0x0040);
	uint64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512i u = _mm512_loadu_si512((const void *)(s + i));
		__m512i hi = _mm512_srli_epi32(u, 16);
		__m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one)));
		__mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);

		r = _mm512_mask_mov_epi32(_mm512_srli_epi32(r, 16), nan, _mm512_or_si512(hi, quiet));
		_mm256_storeu_si256((void *)(d + i), _mm512_cvtepi32_epi16(r));
	}
	return i;
}

AVX512 static uint64_t bf16_to_f32_avx512(float *d, const uint16_t *s, uint64_t n)
{
	uint64_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m256i h = _mm256_loadu_si256((const void *)(s + i));

		_mm512_storeu_si512((void *)(d + i), _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
	}
	return i;
}

AVX512 static uint64_t f32_to_f16_avx512(uint16_t *d, const float *s, uint64_t n)
{
	uint64_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((void *)(d + i),
		                    _mm512_cvtps_ph(_mm512_loadu_ps(s + i),
		                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	return i;
}

AVX512 static uint64_t f16_to_f32_avx512(float *d, const uint16_t *s, uint64_t n)
{
	uint64_t i = 0;

	for (; i + 16 <= n; i += 16)
		_mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const void *)(s + i))));
	return i;
}

/* The same in 8 lanes; packus cannot narrow the unsigned 16-bit results,
 * so the low halves are gathered with a byte shuffle. */
AVX2 static uint64_t f32_to_bf16_avx2(uint16_t *d, const float *s, uint64_t n)
{
	const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
	const __m256i quiet = _mm256_set1_epi32(0x0040);
	const __m256i low = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
	                                     0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
	uint64_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256i u = _mm256_loadu_si256((const void *)(s + i));
		__m256i hi = _mm256_srli_epi32(u, 16);
		__m256i r = _mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one)));
		/* a > inf as signed compares: both operands are below 2^31 */
		__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);

		r = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16), _mm256_or_si256(hi, quiet), nan);
		r = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, low), 0x08);
		_mm_storeu_si128((void *)(d + i), _mm256_castsi256_si128(r));
	}
	return i;
}

AVX2 static uint64_t bf16_to_f32_avx2(float *d, const uint16_t *s, uint64_t n)
{
	uint64_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m128i h = _mm_loadu_si128((const void *)(s + i));

		_mm256_storeu_si256((void *)(d + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	}
	return i;
}

AVX2 static uint64_t f32_to_f16_avx2(uint16_t *d, const float *s, uint64_t n)
{
	uint64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((void *)(d + i),
		                 _mm256_cvtps_ph(_mm256_loadu_ps(s + i),
		                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
	return i;
}

AVX2 static uint64_t f16_to_f32_avx2(float *d, const uint16_t *s, uint64_t n)
{
	uint64_t i = 0;

	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const void *)(s + i))));
	return i;
}
#endif

int ts__convert_level(void)
{
#ifdef TS_CONVERT_X86
	if (__builtin_cpu_supports("avx512f"))
		return 2;
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
		return 1;
#endif
	return 0;
}

static void f32_to_half(int level, enum ts_dtype to, uint16_t *d, const float *s, uint64_t n)
{
	bool bf = to == TS_DT_BFLOAT16;
	uint64_t i = 0;

#ifdef TS_CONVERT_X86
	if (level >= 2)
		i = bf ? f32_to_bf16_avx512(d, s, n) : f32_to_f16_avx512(d, s, n);
	else if (level == 1)
		i = bf ? f32_to_bf16_avx2(d, s, n) : f32_to_f16_avx2(d, s, n);
#endif
	for (; i < n; i++)
		d[i] = bf ? ts_f32_to_bf16(s[i]) : ts_f32_to_f16(s[i]);
}

static void half_to_f32(int level, float *d, enum ts_dtype from, const uint16_t *s, uint64_t n)
{
	bool bf = from == TS_DT_BFLOAT16;
	uint64_t i = 0;

#ifdef TS_CONVERT_X86
	if (level >= 2)
		i = bf ? bf16_to_f32_avx512(d, s, n) : f16_to_f32_avx512(d, s, n);
	else if (level == 1)
		i = bf ? bf16_to_f32_avx2(d, s, n) : f16_to_f32_avx2(d, s, n);
#endif
	for (; i < n; i++)
		d[i] = bf ? ts_bf16_to_f32(s[i]) : ts_f16_to_f32(s[i]);
}

void ts__convert_at(int level, enum ts_dtype to, void *dst, enum ts_dtype from, const void *src,
                    uint64_t n)
{
	int max = ts__convert_level();

	if (level > max)
		level = max;
	if (from == to) {
		memcpy(dst, src, n * ts_dtype_size(from));
		return;
	}
	/* float32 <-> a 16-bit type: the vector loops, which need the pointers
	 * aligned only to their elements' size, as any array's are */
	if (from == TS_DT_FLOAT32) {
		f32_to_half(level, to, dst, src, n);
		return;
	}
	if (to == TS_DT_FLOAT32) {
		half_to_f32(level, dst, from, src, n);
		return;
	}
	for (uint64_t i = 0; i < n; i++)
		store(to, dst, i, load(from, src, i));
}

void ts_convert(enum ts_dtype to, void *dst, enum ts_dtype from, const void *src, uint64_t n)
{
	ts__convert_at(2, to, dst, from, src, n);   /* capped at the CPU's level there */
}
