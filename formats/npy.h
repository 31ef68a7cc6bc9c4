/*
 * npy.h - the numpy .npy preamble: magic, version, header length and the
 * Python dict literal that describes the array.
 *
 * A file is "\x93NUMPY", a major and minor version byte (1.0, 2.0 or 3.0), the
 * header length (2 bytes little-endian in 1.0, 4 in 2.0 and 3.0), then the
 * header: {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with
 * spaces and a '\n' so the preamble is a multiple of 64 bytes (16 in very old
 * files; any length up to TS_NPY_PREAMBLE_MAX is read). The data follows at
 * data_offset. This codec reads and writes preambles only; it never touches
 * array data, except for the Fortran-to-C reordering helper.
 *
 * Streaming use: buffer until 12 bytes have arrived (enough for every
 * version), call ts_npy_preamble() to learn data_offset, buffer until
 * data_offset bytes have arrived, then call ts_npy_parse_header(). Both
 * answer TS_UNAVAILABLE ("need more bytes") when given too little, and
 * TS_INVALID_ARGUMENT (reason "BAD_NPY_HEADER") for anything malformed.
 *
 * Thread-safety: pure functions; no state.
 */
#ifndef TS_NPY_H
#define TS_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/dtype.h"

/* Largest preamble (magic through header padding) this codec reads. */
#define TS_NPY_PREAMBLE_MAX (1u << 20)

/* A buffer this large always holds ts_npy_write_header's output. */
#define TS_NPY_HEADER_MAX 4096

struct ts_npy_header {
	enum ts_dtype dtype;
	bool big_endian;        /* descr '>' on a multi-byte type: data needs swapping */
	bool fortran_order;     /* data is column-major */
	int rank;               /* 0..TS_MAX_RANK */
	uint64_t shape[TS_MAX_RANK];
	uint64_t data_offset;   /* preamble length: where the data starts */
	uint64_t nbytes;        /* bytes of data that follow (overflow-checked) */
	bool dtype_from_hint;   /* descr was a 2-byte void read as the hinted bfloat16 */
};

/*
 * Validates the magic and version of the first len bytes of a file and
 * stores the preamble length (where data starts) in *data_offset. 10 bytes
 * suffice for version 1.0, 12 for 2.0 and 3.0; a wrong magic is reported as
 * soon as the bytes given differ from it.
 * Fails: TS_UNAVAILABLE "need more bytes" when len is too short to decide;
 * TS_INVALID_ARGUMENT for a bad magic, an unknown version or a preamble
 * longer than TS_NPY_PREAMBLE_MAX. buf is borrowed.
 */
ts_status ts_npy_preamble(const void *buf, size_t len, uint64_t *data_offset,
                          struct ts_error *err);

/*
 * Parses a whole preamble (len >= its data_offset; bytes past it are ignored)
 * into *out. hint, when not NULL, is the dtype the caller was told to expect
 * (?dtype=...): a concrete descr must agree with it, and only a bfloat16 hint
 * lets the 2-byte void descr '<V2' / '|V2' through (out->dtype_from_hint).
 * The header dict needs exactly the keys 'descr', 'fortran_order' and 'shape'
 * in any order; strings may use either quote; shape is a tuple of
 * non-negative integers (a py2 'L' suffix is allowed) of rank <= TS_MAX_RANK
 * whose byte count fits in 64 bits.
 * Fails: TS_UNAVAILABLE "need more bytes" when len < data_offset;
 * TS_INVALID_ARGUMENT naming the offending key, value or byte offset
 * otherwise. *out is written only on success. buf is borrowed.
 */
ts_status ts_npy_parse_header(const void *buf, size_t len, const enum ts_dtype *hint,
                              struct ts_npy_header *out, struct ts_error *err);

/*
 * Writes the preamble numpy writes for a C-order little-endian array of dt
 * and shape: version 1.0 (2.0 if the header needs more than 65535 bytes),
 * "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", numpy's
 * spare growth spaces, then spaces and '\n' up to a multiple of 64 bytes.
 * Returns the preamble length (the data offset), or 0 when cap is too small
 * (TS_NPY_HEADER_MAX always suffices), dt is outside the enum or rank is
 * outside [0, TS_MAX_RANK]. Nothing is NUL-terminated.
 */
size_t ts_npy_write_header(char *buf, size_t cap, enum ts_dtype dt, int rank,
                           const uint64_t *shape);

/*
 * Copies a whole array of `shape` stored in Fortran (column-major) order
 * from src into dst in C (row-major) order. The shape must have passed
 * ts_shape_nbytes(); dst and src must not overlap and hold the array's bytes.
 */
void ts_npy_fortran_to_c(void *dst, const void *src, size_t elem_size, int rank,
                         const uint64_t *shape);

#endif
