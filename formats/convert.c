/*
 * convert.c - element conversions between float32, bfloat16 and float16.
 * float16 <-> bfloat16 goes through float32: the widening is exact, so the
 * one rounding is the narrowing's.
 */
#include "formats/convert.h"

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

void ts_convert(enum ts_dtype to, void *dst, enum ts_dtype from, const void *src, uint64_t n)
{
	if (from == to) {
		memcpy(dst, src, n * ts_dtype_size(from));
		return;
	}
	/* the common pairs as tight loops the compiler vectorises */
	if (from == TS_DT_FLOAT32 && to == TS_DT_BFLOAT16) {
		const float *s = src;
		uint16_t *d = dst;

		for (uint64_t i = 0; i < n; i++)
			d[i] = ts_f32_to_bf16(s[i]);
		return;
	}
	if (from == TS_DT_BFLOAT16 && to == TS_DT_FLOAT32) {
		const uint16_t *s = src;
		float *d = dst;

		for (uint64_t i = 0; i < n; i++)
			d[i] = ts_bf16_to_f32(s[i]);
		return;
	}
	for (uint64_t i = 0; i < n; i++)
		store(to, dst, i, load(from, src, i));
}
