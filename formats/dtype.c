/*
 * dtype.c - the dtype table and the shape arithmetic over it.
 *
 * The table is indexed by enum ts_dtype; every lookup range-checks first, so
 * a value outside the enum never reads past it.
 */
#include "formats/dtype.h"

#include <stdio.h>
#include <string.h>

static const struct {
	const char *name;
	size_t size;
	const char *st;
	const char *npy;
} dtype_table[TS_DT_COUNT] = {
	[TS_DT_BOOL] = {"bool", 1, "BOOL", "|b1"},
	[TS_DT_INT8] = {"int8", 1, "I8", "|i1"},
	[TS_DT_UINT8] = {"uint8", 1, "U8", "|u1"},
	[TS_DT_INT16] = {"int16", 2, "I16", "<i2"},
	[TS_DT_UINT16] = {"uint16", 2, "U16", "<u2"},
	[TS_DT_INT32] = {"int32", 4, "I32", "<i4"},
	[TS_DT_UINT32] = {"uint32", 4, "U32", "<u4"},
	[TS_DT_INT64] = {"int64", 8, "I64", "<i8"},
	[TS_DT_UINT64] = {"uint64", 8, "U64", "<u8"},
	[TS_DT_FLOAT16] = {"float16", 2, "F16", "<f2"},
	[TS_DT_BFLOAT16] = {"bfloat16", 2, "BF16", "<V2"},
	[TS_DT_FLOAT32] = {"float32", 4, "F32", "<f4"},
	[TS_DT_FLOAT64] = {"float64", 8, "F64", "<f8"},
};

static bool valid(enum ts_dtype dt)
{
	return (unsigned)dt < TS_DT_COUNT;
}

const char *ts_dtype_name(enum ts_dtype dt)
{
	return valid(dt) ? dtype_table[dt].name : NULL;
}

const char *ts_dtype_names(char *buf, size_t cap)
{
	size_t n = 0;

	if (!cap)
		return buf;
	buf[0] = '\0';
	for (int i = 0; i < TS_DT_COUNT && n < cap; i++) {
		int w = snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", dtype_table[i].name);

		if (w < 0)
			break;
		n += (size_t)w;
	}
	return buf;
}

bool ts_dtype_parse(const char *s, enum ts_dtype *out)
{
	if (!s)
		return false;
	for (int i = 0; i < TS_DT_COUNT; i++)
		if (strcmp(s, dtype_table[i].name) == 0) {
			*out = (enum ts_dtype)i;
			return true;
		}
	return false;
}

size_t ts_dtype_size(enum ts_dtype dt)
{
	return valid(dt) ? dtype_table[dt].size : 0;
}

const char *ts_dtype_safetensors(enum ts_dtype dt)
{
	return valid(dt) ? dtype_table[dt].st : NULL;
}

bool ts_dtype_from_safetensors(const char *s, enum ts_dtype *out)
{
	if (!s)
		return false;
	for (int i = 0; i < TS_DT_COUNT; i++)
		if (strcmp(s, dtype_table[i].st) == 0) {
			*out = (enum ts_dtype)i;
			return true;
		}
	return false;
}

const char *ts_dtype_npy_descr(enum ts_dtype dt)
{
	return valid(dt) ? dtype_table[dt].npy : NULL;
}

bool ts_shape_nbytes(int rank, const uint64_t *shape, enum ts_dtype dt, uint64_t *out)
{
	uint64_t n;
	bool empty = false;

	if (!valid(dt) || rank < 0 || rank > TS_MAX_RANK || (rank > 0 && !shape))
		return false;
	n = dtype_table[dt].size;
	for (int i = 0; i < rank; i++) {
		if (shape[i] == 0) {
			empty = true;
			continue;
		}
		if (n > UINT64_MAX / shape[i])
			return false;
		n *= shape[i];
	}
	*out = empty ? 0 : n;
	return true;
}

static void swap_generic(unsigned char *p, uint64_t nelems, size_t size)
{
	for (uint64_t e = 0; e < nelems; e++, p += size)
		for (size_t i = 0, j = size - 1; i < j; i++, j--) {
			unsigned char t = p[i];

			p[i] = p[j];
			p[j] = t;
		}
}

void ts_byteswap(void *data, uint64_t nelems, size_t elem_size)
{
	unsigned char *p = data;

	switch (elem_size) {
	case 0:
	case 1:
		return;
	case 2:
		for (uint64_t i = 0; i < nelems; i++, p += 2) {
			uint16_t v;

			memcpy(&v, p, 2);
			v = __builtin_bswap16(v);
			memcpy(p, &v, 2);
		}
		return;
	case 4:
		for (uint64_t i = 0; i < nelems; i++, p += 4) {
			uint32_t v;

			memcpy(&v, p, 4);
			v = __builtin_bswap32(v);
			memcpy(p, &v, 4);
		}
		return;
	case 8:
		for (uint64_t i = 0; i < nelems; i++, p += 8) {
			uint64_t v;

			memcpy(&v, p, 8);
			v = __builtin_bswap64(v);
			memcpy(p, &v, 8);
		}
		return;
	default:
		swap_generic(p, nelems, elem_size);
		return;
	}
}
