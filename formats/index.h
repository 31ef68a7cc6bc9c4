/*
 * index.h - numpy basic indexing as selections walked in contiguous byte runs.
 *
 * An index expression ("1:5, ..., ::-2") becomes a ts_selection: per parent
 * axis a start, a step and a count, the semantics of Python slices exactly.
 * A selection is read as a list of contiguous byte runs (offset, length) in
 * the parent's C-order layout, in output order, with adjacent axes merged
 * wherever the selection is contiguous, so a slice costs O(bytes selected +
 * runs) whatever the parent's size. The row helpers do the same for a gather
 * along axis 0 (a list of rows, or a slice given as JSON parts).
 *
 * Invariants of a selection made here: 0 <= rank <= TS_INDEX_MAX_RANK; every
 * dims[i].step != 0; when dims[i].count > 0, every selected index
 * start + k*step (k < count) lies in [0, shape[i]); a collapsed axis has
 * count 1; out_shape lists the counts of the axes not collapsed, in order.
 * A parent's byte size (product of shape times the element size) must fit
 * in 64 bits, which holds for any array that exists.
 *
 * Thread-safety: every function is pure; a selection or iterator belongs to
 * one thread at a time (distinct ones may be used concurrently).
 */
#ifndef TS_INDEX_H
#define TS_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/status.h"

#define TS_INDEX_MAX_RANK 32

/* What is selected along one parent axis. */
struct ts_index_dim {
	int64_t start;   /* first index selected (meaningless when count == 0) */
	int64_t step;    /* != 0; negative walks the axis backwards */
	uint64_t count;  /* elements selected along this axis */
	bool collapsed;  /* an integer index: the axis is not in the output */
};

struct ts_selection {
	int rank;                                    /* parent rank */
	uint64_t shape[TS_INDEX_MAX_RANK];           /* parent shape */
	struct ts_index_dim dims[TS_INDEX_MAX_RANK]; /* one per parent axis */
	int out_rank;                                /* axes not collapsed */
	uint64_t out_shape[TS_INDEX_MAX_RANK];
};

/*
 * Parses expr (numpy basic indexing as text, without the brackets) against a
 * parent of the given rank and shape, and fills *out. NULL, "" or blanks
 * select everything. Items are integers (negative counts from the end),
 * slices start:stop[:step] with any part omitted, and at most one "...";
 * fewer items than the rank mean trailing ":"; one trailing comma is allowed,
 * as in Python. Fails with TS_OUT_OF_RANGE ("INDEX_OUT_OF_RANGE") for an
 * integer outside its axis, and TS_INVALID_ARGUMENT ("BAD_INDEX") for bad
 * syntax, a zero step, too many indices, numbers that overflow 64 bits,
 * None/newaxis, booleans, arrays or lists, or a rank/shape beyond the limits
 * (rank > TS_INDEX_MAX_RANK, a size above INT64_MAX, more than 2^64
 * elements); err says what and names the axis. *out is unspecified on
 * failure. expr and shape are borrowed (shape may be NULL when rank is 0).
 */
ts_status ts_index_parse(const char *expr, int rank, const uint64_t *shape,
                         struct ts_selection *out, struct ts_error *err);

/* Fills *out with the identity selection. rank must be in
 * [0, TS_INDEX_MAX_RANK] and every size at most INT64_MAX; shape is borrowed
 * (may be NULL when rank is 0). Cannot fail. */
void ts_selection_all(int rank, const uint64_t *shape, struct ts_selection *out);

/* Number of elements selected: the product of the counts (1 for a 0-d
 * parent, 0 when any axis selects nothing). */
uint64_t ts_selection_elems(const struct ts_selection *s);

/* Walks a selection's contiguous byte runs; fields are private. */
struct ts_run_iter {
	/* private */
	int nlevels;                         /* odometer levels, outermost first */
	uint64_t count[TS_INDEX_MAX_RANK];   /* positions per level (>= 2) */
	uint64_t delta[TS_INDEX_MAX_RANK];   /* byte step per level, mod 2^64 */
	uint64_t idx[TS_INDEX_MAX_RANK];     /* current position per level */
	uint64_t offset;                     /* offset of the next run */
	uint64_t len;                        /* bytes in every run */
	uint64_t remaining;                  /* runs not yet returned */
};

/*
 * Prepares *it to walk s's runs for elements of elem_size bytes (> 0), in
 * output (C) order, merged as far as the layout allows: no two consecutive
 * runs are adjacent in the parent. O(rank); s is read now and not kept.
 * An empty selection has no runs.
 */
void ts_run_iter_init(struct ts_run_iter *it, const struct ts_selection *s,
                      size_t elem_size);

/* Next run: its byte offset in the parent and its length (> 0). Returns
 * false at the end. O(1) amortised. */
bool ts_run_iter_next(struct ts_run_iter *it, uint64_t *offset, uint64_t *len);

/* Number of runs ts_run_iter_next will return. O(rank). */
uint64_t ts_selection_nruns(const struct ts_selection *s, size_t elem_size);

/*
 * Whether the whole selection is at most one run; if so sets *offset and
 * *len (an empty selection is contiguous, with *offset 0 and *len 0).
 * O(rank). offset and len may be NULL.
 */
bool ts_selection_contiguous(const struct ts_selection *s, size_t elem_size,
                             uint64_t *offset, uint64_t *len);

/*
 * Gather along axis 0: checks n row indices against dim0, writing each as a
 * non-negative index into normalized (negatives count from the end; repeats
 * and any order are allowed). Fails with TS_OUT_OF_RANGE
 * ("INDEX_OUT_OF_RANGE") naming the position in the list and the bad value;
 * normalized is then left untouched. rows is borrowed; normalized (n
 * entries, caller-owned) may be the same memory as rows.
 */
ts_status ts_rows_check(const int64_t *rows, size_t n, uint64_t dim0,
                        uint64_t *normalized, struct ts_error *err);

/* Walks a checked row list as byte runs; fields are private. */
struct ts_rows_iter {
	/* private */
	const uint64_t *rows;  /* borrowed */
	size_t n;
	size_t pos;
	uint64_t row_bytes;
};

/*
 * Prepares *it to walk normalized (from ts_rows_check; borrowed, must
 * outlive the walk) as runs of whole rows of row_bytes bytes, merging rows
 * that follow each other in ascending order (5,6,7 is one run; 7,6 two).
 * Zero-byte rows give no runs.
 */
void ts_rows_iter_init(struct ts_rows_iter *it, const uint64_t *normalized,
                       size_t n, uint64_t row_bytes);

/* Next run: its byte offset in the parent and its length (> 0); runs come
 * in list order, so the destination offset is the sum of the lengths before.
 * Returns false at the end. */
bool ts_rows_iter_next(struct ts_rows_iter *it, uint64_t *src_offset, uint64_t *len);

/*
 * A slice of axis 0 given as parts ({"start","stop","step"} JSON; an absent
 * start or stop has has_* false and its value ignored), resolved with
 * Python's slice semantics against dim0 into *out (never collapsed). Fails
 * with TS_INVALID_ARGUMENT ("BAD_INDEX") for a zero step or dim0 above
 * INT64_MAX.
 */
ts_status ts_rows_from_slice(int64_t start, int64_t stop, int64_t step,
                             bool has_start, bool has_stop, uint64_t dim0,
                             struct ts_index_dim *out, struct ts_error *err);

/* Most rows one call may select (a list or a slice). */
#define TS_ROWS_MAX (1u << 26)

/*
 * The rows of axis 0 a request gives in JSON, the one parser of :gather and
 * :step: a list of integers (negative counts from the end; any order and
 * repeats), or a slice {"start", "stop", "step"} (each optional, an
 * integer or null; Python's semantics). Anything else - a string, real,
 * boolean or null in the list, an unknown key or a non-integer part of the
 * slice, another JSON type - is INVALID_ARGUMENT ("BAD_ROWS") naming the
 * field as field[i] or field.key (field is what the request calls it, e.g.
 * "rows" or "inputs.rows"); a row outside the axis is OUT_OF_RANGE as
 * ts_rows_check says; more than TS_ROWS_MAX rows is INVALID_ARGUMENT.
 * *out is a new malloc'd list of *n normalised rows (at least one element
 * allocated, so never NULL on success); RESOURCE_EXHAUSTED when out of
 * memory. rows is borrowed.
 */
ts_status ts_rows_parse(const json_t *rows, const char *field, uint64_t dim0, uint64_t **out,
                        size_t *n, struct ts_error *err);

#endif
