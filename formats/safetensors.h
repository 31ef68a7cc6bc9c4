/*
 * safetensors.h - the safetensors header: an 8-byte little-endian length N,
 * N bytes of UTF-8 JSON, then the data buffer.
 *
 * The JSON is an object whose optional "__metadata__" entry maps strings to
 * strings and whose every other entry is a tensor
 * {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]} with no
 * other field. A header is accepted as the reference implementation
 * (huggingface safetensors) accepts it: N <= TS_ST_HEADER_MAX, the JSON
 * starts with '{' (trailing spaces pad it), has no duplicate keys, every
 * dtype is known, every tensor's [begin, end) holds exactly its shape's
 * bytes, and the tensors sorted by begin tile [0, data_len) with no gap and
 * no overlap. The file is exactly 8 + N + data_len bytes.
 * Failures are TS_INVALID_ARGUMENT with reason "BAD_SAFETENSORS_HEADER" and
 * a message naming the tensor, field and numbers; out of memory is
 * TS_RESOURCE_EXHAUSTED.
 *
 * Thread-safety: pure functions; a ts_st_header belongs to one thread, and
 * so does its metadata: whoever hands it to another thread hands a copy
 * (json_deep_copy), never a reference, the rule for every jansson value
 * (docs/ARCHITECTURE.md).
 */
#ifndef TS_SAFETENSORS_H
#define TS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/status.h"
#include "formats/dtype.h"

/* Largest header length N the reference implementation reads (100 MB). */
#define TS_ST_HEADER_MAX 100000000ull

struct ts_st_tensor {
	char *name;             /* UTF-8; owned by the ts_st_header that holds it */
	enum ts_dtype dtype;
	int rank;
	uint64_t shape[TS_MAX_RANK];
	uint64_t begin, end;    /* [begin, end) within the data buffer */
};

struct ts_st_header {
	uint64_t header_len;           /* N */
	uint64_t data_len;             /* end of the last tensor (0 without tensors) */
	size_t ntensors;
	struct ts_st_tensor *tensors;  /* sorted by begin (then end, then name) */
	json_t *metadata;              /* "__metadata__" object: new reference, or NULL */
};

/*
 * Reads N from the first 8 bytes of a file into *n.
 * Fails: TS_INVALID_ARGUMENT when N > TS_ST_HEADER_MAX, with a message that
 * does not show N (the bytes of a file that may not be safetensors). first8
 * is borrowed.
 */
ts_status ts_st_header_len(const void *first8, uint64_t *n, struct ts_error *err);

/*
 * Parses and validates the n bytes of JSON that follow the length (json
 * need not be NUL-terminated) into *out, which the caller releases with
 * ts_st_header_release(). On failure *out is untouched and nothing is
 * held. json is borrowed.
 */
ts_status ts_st_parse_header(const char *json, size_t n, struct ts_st_header *out,
                             struct ts_error *err);

/* Frees the names, the tensor array and the metadata reference; leaves *h
 * zeroed. Safe on a zeroed header. */
void ts_st_header_release(struct ts_st_header *h);

/*
 * Checks that a file of total_len bytes is exactly 8 + N + data_len long.
 * Fails: TS_INVALID_ARGUMENT naming both numbers for trailing bytes or
 * truncation.
 */
ts_status ts_st_check_total(const struct ts_st_header *h, uint64_t total_len,
                            struct ts_error *err);

/*
 * Whole-file convenience: ts_st_header_len, a check that the N bytes are
 * present, ts_st_parse_header and ts_st_check_total over buf[0, len).
 * Fails as they do (a header longer than the buffer is TS_INVALID_ARGUMENT);
 * on success the caller releases *out. buf is borrowed.
 */
ts_status ts_st_parse_buffer(const void *buf, size_t len, struct ts_st_header *out,
                             struct ts_error *err);

/*
 * Builds the 8-byte length and JSON header of a file holding tensors[0..n)
 * laid out contiguously in the given order, with metadata (an object of
 * strings, borrowed; NULL for none) as "__metadata__". The header is padded
 * with spaces so that 8 + N is a multiple of 8, as the reference writer does.
 * The begin/end the caller passes are ignored; on success each tensor's
 * begin and end are set to its computed [begin, end), so the data buffer is
 * tensors[n-1].end bytes (0 when n is 0). *out is a new malloc'd buffer of
 * *out_len bytes, owned by the caller; the data follows it in the file.
 * Fails: TS_INVALID_ARGUMENT for a NULL, duplicate, non-UTF-8 or
 * "__metadata__" name, a dtype outside the enum, a rank outside
 * [0, TS_MAX_RANK], sizes beyond 2^63 or metadata that is not an object of
 * strings (tensors untouched); TS_RESOURCE_EXHAUSTED when out of memory.
 */
ts_status ts_st_build_header(struct ts_st_tensor *tensors, size_t n, const json_t *metadata,
                             char **out, size_t *out_len, struct ts_error *err);

#endif
