/*
 * dtype.h - element types of staged tensors and their names in each format.
 *
 * One table row per dtype gives its element size, our name ("float32"), its
 * safetensors name ("F32") and the numpy descr numpy writes for it on a
 * little-endian machine ("<f4"). Names parse back to the same dtype exactly
 * (case-sensitive, no aliases). Shapes have at most TS_MAX_RANK dimensions;
 * byte counts of shapes are computed with overflow checks.
 *
 * Thread-safety: pure functions over immutable tables.
 */
#ifndef TS_DTYPE_H
#define TS_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ts_dtype {
	TS_DT_BOOL,
	TS_DT_INT8,
	TS_DT_UINT8,
	TS_DT_INT16,
	TS_DT_UINT16,
	TS_DT_INT32,
	TS_DT_UINT32,
	TS_DT_INT64,
	TS_DT_UINT64,
	TS_DT_FLOAT16,
	TS_DT_BFLOAT16,
	TS_DT_FLOAT32,
	TS_DT_FLOAT64,
	TS_DT_COUNT
};

#define TS_MAX_RANK 32

/* Our name ("bool", "int8", ..., "bfloat16", "float32", "float64"); a static
 * string, NULL for values outside the enum. */
const char *ts_dtype_name(enum ts_dtype dt);

/* Every name of ours in table order, joined by ", " ("bool, int8, ...,
 * float64"), for messages; into buf (cap bytes, TS_DTYPE_NAMES_MAX holds
 * them all; cut short to fit a smaller one). Returns buf. */
#define TS_DTYPE_NAMES_MAX 128
const char *ts_dtype_names(char *buf, size_t cap);

/* Parses one of our names exactly; false (and *out untouched) otherwise. */
bool ts_dtype_parse(const char *s, enum ts_dtype *out);

/* Bytes per element; 0 for values outside the enum. */
size_t ts_dtype_size(enum ts_dtype dt);

/* The safetensors dtype string ("BOOL", "I8", ..., "BF16", "F32"); a static
 * string, NULL for values outside the enum. */
const char *ts_dtype_safetensors(enum ts_dtype dt);

/* Parses a safetensors dtype string exactly; false for names outside our set
 * (F8_E4M3, C64, ...) and *out untouched. */
bool ts_dtype_from_safetensors(const char *s, enum ts_dtype *out);

/* The little-endian numpy descr numpy writes ("|b1", "<f4", ...). bfloat16
 * has no numpy dtype and is written as the 2-byte void "<V2", which readers
 * accept only with an explicit bfloat16 hint. A static string, NULL for
 * values outside the enum. */
const char *ts_dtype_npy_descr(enum ts_dtype dt);

/*
 * Bytes taken by a dense array of `shape` (rank entries; shape may be NULL
 * when rank is 0, a scalar of one element). Returns false when rank is
 * outside [0, TS_MAX_RANK], dt is outside the enum, or the byte count does
 * not fit in 64 bits. Overflow is judged on the non-zero dimensions, so the
 * answer does not depend on where a zero dimension sits: (2^40, 2^40, 0)
 * overflows like (0, 2^40, 2^40).
 */
bool ts_shape_nbytes(int rank, const uint64_t *shape, enum ts_dtype dt, uint64_t *out);

/* Reverses the bytes of each of nelems elements of elem_size bytes in place
 * (elem_size 1 leaves data as it is). */
void ts_byteswap(void *data, uint64_t nelems, size_t elem_size);

#endif
