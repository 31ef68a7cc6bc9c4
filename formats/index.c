/*
 * index.c - numpy basic indexing: text to selection, selection to byte runs.
 *
 * Parsing is two passes over a small item list: the text is read into items
 * (integer, slice, ellipsis) with syntax errors reported at their offset,
 * then items are laid onto axes (the ellipsis expands) and resolved with
 * Python's slice rules. The run walker merges the innermost fully selected
 * axes into one block, extends it by the first partial axis when that axis
 * steps by 1, and drives the remaining axes with an odometer whose adjacent
 * levels are fused when one tiles the other, so each run costs O(1).
 */
#include "formats/index.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- parsing ------------------------------------------------------------ */

enum item_kind { ITEM_INT, ITEM_SLICE, ITEM_ELLIPSIS };

struct item {
	enum item_kind kind;
	int64_t v[3];   /* integer in v[0]; slice start, stop, step */
	bool has[3];    /* which slice parts were written */
};

struct parser {
	const char *s;
	size_t pos;
	struct ts_error *err;
};

/* Items kept: enough for a full-rank index plus one ellipsis. */
#define MAX_ITEMS (TS_INDEX_MAX_RANK + 1)

/* How much of the expression an error message quotes. */
#define QUOTE 80

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_alpha(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static void skip_ws(struct parser *p)
{
	while (is_space(p->s[p->pos]))
		p->pos++;
}

static ts_status bad_syntax(struct parser *p, const char *what, size_t at)
{
	unsigned char c = (unsigned char)p->s[at];

	if (c >= 0x20 && c < 0x7f)
		return ts_error_bad(p->err, "BAD_INDEX", NULL,
		                    "%s '%c' at offset %zu in index '%.*s'", what,
		                    (char)c, at, QUOTE, p->s);
	return ts_error_bad(p->err, "BAD_INDEX", NULL,
	                    "%s byte 0x%02x at offset %zu in index", what, c, at);
}

static bool word_is(const char *w, size_t n, const char *lit)
{
	return strlen(lit) == n && memcmp(w, lit, n) == 0;
}

/* Explains a word where a number was expected (None, True, names). */
static ts_status bad_word(struct parser *p)
{
	const char *w = p->s + p->pos;
	size_t n = 0;

	while (is_alpha(w[n]) || is_digit(w[n]) || w[n] == '.')
		n++;
	if (word_is(w, n, "None") || word_is(w, n, "newaxis") ||
	    word_is(w, n, "np.newaxis") || word_is(w, n, "numpy.newaxis"))
		return ts_error_bad(p->err, "BAD_INDEX", NULL,
		                    "new axes ('%.*s') are not supported in index '%.*s'",
		                    (int)n, w, QUOTE, p->s);
	if (word_is(w, n, "True") || word_is(w, n, "False") ||
	    word_is(w, n, "true") || word_is(w, n, "false"))
		return ts_error_bad(p->err, "BAD_INDEX", NULL,
		                    "boolean indices ('%.*s') are not supported in index '%.*s'",
		                    (int)n, w, QUOTE, p->s);
	return ts_error_bad(p->err, "BAD_INDEX", NULL,
	                    "unexpected '%.*s' at offset %zu in index '%.*s'",
	                    (int)(n > 32 ? 32 : n), w, p->pos, QUOTE, p->s);
}

/*
 * Reads an optional signed decimal integer. Leaves *has false and the
 * position unchanged when none starts here and the next character may end a
 * slice part; words, brackets and malformed numbers are errors.
 */
static ts_status parse_int(struct parser *p, int64_t *v, bool *has)
{
	const char *s = p->s;
	size_t at = p->pos, i = at;
	uint64_t mag = 0, limit = INT64_MAX;
	bool neg = false, overflow = false;

	*has = false;
	if (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-';
		i++;
		if (!is_digit(s[i]))
			return bad_syntax(p, "expected a digit after the sign, found", i);
	} else if (!is_digit(s[i])) {
		if (is_alpha(s[i]))
			return bad_word(p);
		if (s[i] == '[' || s[i] == '(' || s[i] == '{')
			return ts_error_bad(p->err, "BAD_INDEX", NULL,
			                    "index arrays and lists are not supported in index '%.*s' "
			                    "(only integers, slices and '...')", QUOTE, s);
		return TS_OK;
	}
	for (; is_digit(s[i]); i++) {
		unsigned d = (unsigned)(s[i] - '0');

		if (mag > (UINT64_MAX - d) / 10)
			overflow = true;
		else
			mag = mag * 10 + d;
	}
	if (s[i] == '.' || is_alpha(s[i]) || is_digit(s[i])) {
		size_t end = i;

		while (is_alpha(s[end]) || is_digit(s[end]) || s[end] == '.')
			end++;
		return ts_error_bad(p->err, "BAD_INDEX", NULL,
		                    "non-integer index '%.*s' at offset %zu",
		                    (int)(end - at > 32 ? 32 : end - at), s + at, at);
	}
	if (neg)
		limit = (uint64_t)INT64_MAX + 1;
	if (overflow || mag > limit)
		return ts_error_bad(p->err, "BAD_INDEX", NULL,
		                    "index '%.*s' at offset %zu does not fit in a 64-bit integer",
		                    (int)(i - at > 40 ? 40 : i - at), s + at, at);
	if (!neg)
		*v = (int64_t)mag;
	else
		*v = mag > (uint64_t)INT64_MAX ? INT64_MIN : -(int64_t)mag;
	*has = true;
	p->pos = i;
	return TS_OK;
}

/* Reads the parts of a slice after its start; the position is on a ':'. */
static ts_status parse_slice_rest(struct parser *p, struct item *it)
{
	ts_status st;

	it->kind = ITEM_SLICE;
	for (int part = 1; part < 3; part++) {
		p->pos++; /* the ':' */
		skip_ws(p);
		if ((st = parse_int(p, &it->v[part], &it->has[part])) != TS_OK)
			return st;
		skip_ws(p);
		if (p->s[p->pos] != ':')
			return TS_OK;
	}
	return bad_syntax(p, "too many parts in slice: unexpected", p->pos);
}

/* Reads one item up to the ',' or NUL that ends it, and leaves the position
 * there. number is the item's 1-based position, for messages. */
static ts_status parse_item(struct parser *p, int number, struct item *it)
{
	ts_status st = TS_OK;

	memset(it, 0, sizeof *it);
	skip_ws(p);
	if (strncmp(p->s + p->pos, "...", 3) == 0) {
		it->kind = ITEM_ELLIPSIS;
		p->pos += 3;
	} else {
		if ((st = parse_int(p, &it->v[0], &it->has[0])) != TS_OK)
			return st;
		skip_ws(p);
		if (p->s[p->pos] == ':')
			st = parse_slice_rest(p, it);
		else if (it->has[0])
			it->kind = ITEM_INT;
		else if (p->s[p->pos] == ',' || p->s[p->pos] == '\0')
			return ts_error_bad(p->err, "BAD_INDEX", NULL,
			                    "empty item at position %d in index '%.*s'",
			                    number, QUOTE, p->s);
		if (st != TS_OK)
			return st;
	}
	skip_ws(p);
	if (p->s[p->pos] != ',' && p->s[p->pos] != '\0')
		return bad_syntax(p, "unexpected character", p->pos);
	return TS_OK;
}

/* ---- resolving ---------------------------------------------------------- */

/*
 * Python's slice.indices() for an axis of size len (<= INT64_MAX) with the
 * given parts: the first index and the count (Python's PySlice_AdjustIndices).
 * step must not be zero.
 */
static void slice_resolve(int64_t start, int64_t stop, int64_t step,
                          bool has_start, bool has_stop, uint64_t size,
                          struct ts_index_dim *out)
{
	int64_t len = (int64_t)size;
	uint64_t ustep = step < 0 ? 0 - (uint64_t)step : (uint64_t)step;
	uint64_t count = 0;

	if (!has_start)
		start = step < 0 ? INT64_MAX : 0;
	if (!has_stop)
		stop = step < 0 ? INT64_MIN : INT64_MAX;
	if (start < 0) {
		start += len;
		if (start < 0)
			start = step < 0 ? -1 : 0;
	} else if (start >= len) {
		start = step < 0 ? len - 1 : len;
	}
	if (stop < 0) {
		stop += len;
		if (stop < 0)
			stop = step < 0 ? -1 : 0;
	} else if (stop >= len) {
		stop = step < 0 ? len - 1 : len;
	}
	if (step < 0) {
		if (stop < start)
			count = (uint64_t)(start - stop - 1) / ustep + 1;
	} else if (start < stop) {
		count = (uint64_t)(stop - start - 1) / ustep + 1;
	}
	out->start = start;
	out->step = step;
	out->count = count;
	out->collapsed = false;
}

static ts_status step_zero(struct ts_error *err, int axis)
{
	return ts_error_bad(err, "BAD_INDEX", NULL,
	                    "slice step cannot be zero for axis %d", axis);
}

/* An integer index on one axis: bounds-checked, negatives from the end. */
static ts_status resolve_int(int64_t v, int axis, uint64_t size,
                             struct ts_index_dim *out, struct ts_error *err)
{
	uint64_t idx;

	if (v < 0) {
		uint64_t back = 0 - (uint64_t)v;

		idx = back <= size ? size - back : UINT64_MAX;
	} else {
		idx = (uint64_t)v;
	}
	if (idx >= size) {
		ts_error_set(err, TS_OUT_OF_RANGE, "INDEX_OUT_OF_RANGE",
		             "index %lld is out of range for axis %d with size %llu",
		             (long long)v, axis, (unsigned long long)size);
		ts_error_meta(err, "axis", "%d", axis);
		ts_error_meta(err, "index", "%lld", (long long)v);
		ts_error_meta_u64(err, "size", size);
		return TS_OUT_OF_RANGE;
	}
	out->start = (int64_t)idx;
	out->step = 1;
	out->count = 1;
	out->collapsed = true;
	return TS_OK;
}

static ts_status resolve_item(const struct item *it, int axis, uint64_t size,
                              struct ts_index_dim *out, struct ts_error *err)
{
	int64_t step = it->has[2] ? it->v[2] : 1;

	if (it->kind == ITEM_INT)
		return resolve_int(it->v[0], axis, size, out, err);
	if (step == 0)
		return step_zero(err, axis);
	slice_resolve(it->v[0], it->v[1], step, it->has[0], it->has[1], size, out);
	return TS_OK;
}

static void fill_out_shape(struct ts_selection *s)
{
	s->out_rank = 0;
	for (int i = 0; i < s->rank; i++)
		if (!s->dims[i].collapsed)
			s->out_shape[s->out_rank++] = s->dims[i].count;
}

static ts_status check_shape(int rank, const uint64_t *shape, struct ts_error *err)
{
	uint64_t elems = 1;
	bool empty = false, overflow = false;

	if (rank < 0 || rank > TS_INDEX_MAX_RANK)
		return ts_error_bad(err, "BAD_INDEX", NULL,
		                    "array rank %d is outside the indexing limit of %d",
		                    rank, TS_INDEX_MAX_RANK);
	for (int i = 0; i < rank; i++) {
		if (shape[i] > (uint64_t)INT64_MAX)
			return ts_error_bad(err, "BAD_INDEX", NULL,
			                    "size %llu of axis %d is too large to index",
			                    (unsigned long long)shape[i], i);
		if (shape[i] == 0)
			empty = true;
		else if (elems > UINT64_MAX / shape[i])
			overflow = true;
		else
			elems *= shape[i];
	}
	if (overflow && !empty)
		return ts_error_bad(err, "BAD_INDEX", NULL,
		                    "array shape has more than 2^64 elements");
	return TS_OK;
}

/* Lays the parsed items onto the axes of out (shape already set). */
static ts_status apply_items(const struct item *items, int nitems, int nindexed,
                             struct ts_selection *out, struct ts_error *err)
{
	int axis = 0;
	ts_status st;

	for (int k = 0; k < nitems; k++) {
		if (items[k].kind == ITEM_ELLIPSIS) {
			for (int e = 0; e < out->rank - nindexed; e++, axis++)
				slice_resolve(0, 0, 1, false, false, out->shape[axis],
				              &out->dims[axis]);
			continue;
		}
		st = resolve_item(&items[k], axis, out->shape[axis], &out->dims[axis], err);
		if (st != TS_OK)
			return st;
		axis++;
	}
	for (; axis < out->rank; axis++)
		slice_resolve(0, 0, 1, false, false, out->shape[axis], &out->dims[axis]);
	fill_out_shape(out);
	return TS_OK;
}

ts_status ts_index_parse(const char *expr, int rank, const uint64_t *shape,
                         struct ts_selection *out, struct ts_error *err)
{
	struct parser p = {.s = expr, .pos = 0, .err = err};
	struct item items[MAX_ITEMS];
	int nitems = 0, nindexed = 0, number = 0;
	bool ellipsis = false;
	ts_status st;

	if ((st = check_shape(rank, shape, err)) != TS_OK)
		return st;
	ts_selection_all(rank, shape, out);
	if (!expr)
		return TS_OK;
	skip_ws(&p);
	while (p.s[p.pos] != '\0') {
		struct item item;

		if ((st = parse_item(&p, ++number, &item)) != TS_OK)
			return st;
		if (item.kind == ITEM_ELLIPSIS) {
			if (ellipsis)
				return ts_error_bad(err, "BAD_INDEX", NULL,
				                    "an index can only have a single ellipsis ('...')");
			ellipsis = true;
		} else {
			nindexed++;
		}
		if (nitems < MAX_ITEMS)
			items[nitems++] = item;
		if (p.s[p.pos] == ',') {
			p.pos++;
			skip_ws(&p);
		}
	}
	if (nindexed > rank)
		return ts_error_bad(err, "BAD_INDEX", NULL,
		                    "too many indices: array is %d-dimensional, but %d were indexed",
		                    rank, nindexed);
	return apply_items(items, nitems, nindexed, out, err);
}

void ts_selection_all(int rank, const uint64_t *shape, struct ts_selection *out)
{
	assert(rank >= 0 && rank <= TS_INDEX_MAX_RANK);
	memset(out, 0, sizeof *out);
	out->rank = rank;
	for (int i = 0; i < rank; i++) {
		out->shape[i] = shape[i];
		slice_resolve(0, 0, 1, false, false, shape[i], &out->dims[i]);
	}
	fill_out_shape(out);
}

uint64_t ts_selection_elems(const struct ts_selection *s)
{
	uint64_t n = 1;

	for (int i = 0; i < s->rank; i++)
		n *= s->dims[i].count;
	return n;
}

/* ---- runs --------------------------------------------------------------- */

/* An axis whose selection covers it whole, in order. */
static bool axis_full(const struct ts_selection *s, int i)
{
	const struct ts_index_dim *d = &s->dims[i];

	return d->count == s->shape[i] && (d->count <= 1 || (d->start == 0 && d->step == 1));
}

/* Adds an odometer level, fusing it into the one outside when that one's
 * byte step is exactly this level's whole sweep. */
static void add_level(struct ts_run_iter *it, uint64_t count, int64_t step,
                      uint64_t stride)
{
	uint64_t delta = (uint64_t)step * stride;
	int64_t sweep;

	if (it->nlevels > 0 && stride <= (uint64_t)INT64_MAX && count <= (uint64_t)INT64_MAX &&
	    !__builtin_mul_overflow(step, (int64_t)stride, &sweep) &&
	    !__builtin_mul_overflow(sweep, (int64_t)count, &sweep) &&
	    (uint64_t)sweep == it->delta[it->nlevels - 1]) {
		it->count[it->nlevels - 1] *= count;
		it->delta[it->nlevels - 1] = delta;
		return;
	}
	it->count[it->nlevels] = count;
	it->delta[it->nlevels] = delta;
	it->idx[it->nlevels] = 0;
	it->nlevels++;
}

void ts_run_iter_init(struct ts_run_iter *it, const struct ts_selection *s,
                      size_t elem_size)
{
	uint64_t stride[TS_INDEX_MAX_RANK], block = elem_size, base = 0, nruns = 1;
	int inner = s->rank - 1;

	it->nlevels = 0;
	it->offset = 0;
	it->len = 0;
	it->remaining = 0;
	if (elem_size == 0 || ts_selection_elems(s) == 0)
		return;
	for (int i = s->rank - 1; i >= 0; i--) {
		stride[i] = block;
		block *= s->shape[i];
	}
	for (int i = 0; i < s->rank; i++)
		base += (uint64_t)s->dims[i].start * stride[i];

	/* the contiguous block: full inner axes, then one partial axis by 1 */
	block = elem_size;
	while (inner >= 0 && axis_full(s, inner))
		block *= s->shape[inner--];
	if (inner >= 0 && (s->dims[inner].step == 1 || s->dims[inner].count == 1))
		block *= s->dims[inner--].count;

	for (int i = 0; i <= inner; i++) {
		if (s->dims[i].count == 1)
			continue;
		add_level(it, s->dims[i].count, s->dims[i].step, stride[i]);
		nruns *= s->dims[i].count;
	}
	it->offset = base;
	it->len = block;
	it->remaining = nruns;
}

bool ts_run_iter_next(struct ts_run_iter *it, uint64_t *offset, uint64_t *len)
{
	if (it->remaining == 0)
		return false;
	*offset = it->offset;
	*len = it->len;
	if (--it->remaining == 0)
		return true;
	for (int k = it->nlevels - 1; k >= 0; k--) {
		if (++it->idx[k] < it->count[k]) {
			it->offset += it->delta[k];
			break;
		}
		it->idx[k] = 0;
		it->offset -= it->delta[k] * (it->count[k] - 1);
	}
	return true;
}

uint64_t ts_selection_nruns(const struct ts_selection *s, size_t elem_size)
{
	struct ts_run_iter it;

	ts_run_iter_init(&it, s, elem_size);
	return it.remaining;
}

bool ts_selection_contiguous(const struct ts_selection *s, size_t elem_size,
                             uint64_t *offset, uint64_t *len)
{
	struct ts_run_iter it;

	ts_run_iter_init(&it, s, elem_size);
	if (it.remaining > 1)
		return false;
	if (offset)
		*offset = it.remaining ? it.offset : 0;
	if (len)
		*len = it.remaining ? it.len : 0;
	return true;
}

/* ---- rows (gather along axis 0) ---------------------------------------- */

ts_status ts_rows_check(const int64_t *rows, size_t n, uint64_t dim0,
                        uint64_t *normalized, struct ts_error *err)
{
	for (size_t i = 0; i < n; i++) {
		int64_t v = rows[i];
		bool bad = v < 0 ? 0 - (uint64_t)v > dim0 : (uint64_t)v >= dim0;

		if (bad) {
			ts_error_set(err, TS_OUT_OF_RANGE, "INDEX_OUT_OF_RANGE",
			             "row index %lld at position %zu is out of range for axis 0 "
			             "with size %llu", (long long)v, i, (unsigned long long)dim0);
			ts_error_meta(err, "position", "%zu", i);
			ts_error_meta(err, "index", "%lld", (long long)v);
			ts_error_meta_u64(err, "size", dim0);
			return TS_OUT_OF_RANGE;
		}
	}
	for (size_t i = 0; i < n; i++) {
		int64_t v = rows[i];

		normalized[i] = v < 0 ? dim0 - (0 - (uint64_t)v) : (uint64_t)v;
	}
	return TS_OK;
}

void ts_rows_iter_init(struct ts_rows_iter *it, const uint64_t *normalized,
                       size_t n, uint64_t row_bytes)
{
	it->rows = normalized;
	it->n = row_bytes ? n : 0;
	it->pos = 0;
	it->row_bytes = row_bytes;
}

bool ts_rows_iter_next(struct ts_rows_iter *it, uint64_t *src_offset, uint64_t *len)
{
	uint64_t first;
	size_t k = 1;

	if (it->pos >= it->n)
		return false;
	first = it->rows[it->pos];
	while (it->pos + k < it->n && it->rows[it->pos + k] == first + k)
		k++;
	*src_offset = first * it->row_bytes;
	*len = (uint64_t)k * it->row_bytes;
	it->pos += k;
	return true;
}

ts_status ts_rows_from_slice(int64_t start, int64_t stop, int64_t step,
                             bool has_start, bool has_stop, uint64_t dim0,
                             struct ts_index_dim *out, struct ts_error *err)
{
	if (dim0 > (uint64_t)INT64_MAX)
		return ts_error_bad(err, "BAD_INDEX", NULL,
		                    "size %llu of axis 0 is too large to index",
		                    (unsigned long long)dim0);
	if (step == 0)
		return step_zero(err, 0);
	slice_resolve(start, stop, step, has_start, has_stop, dim0, out);
	return TS_OK;
}

static const char *json_kind(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "a list";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a real number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "a value";
}

static ts_status rows_list(const json_t *rows, const char *field, uint64_t dim0, uint64_t **out,
                           size_t *n, struct ts_error *err)
{
	size_t cnt = json_array_size(rows);
	int64_t *raw;
	uint64_t *norm;
	ts_status st = TS_OK;

	if (cnt > TS_ROWS_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		                    "%s lists %zu rows; at most %u per call", field, cnt, TS_ROWS_MAX);
	for (size_t i = 0; i < cnt; i++) {
		const json_t *v = json_array_get(rows, i);

		if (!json_is_integer(v))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
			                    "%s[%zu] must be an integer row index, not %s", field, i,
			                    json_kind(v));
	}
	raw = malloc((cnt ? cnt : 1) * sizeof *raw);
	norm = malloc((cnt ? cnt : 1) * sizeof *norm);
	if (!raw || !norm) {
		st = ts_error_oom(err, "no memory for %zu rows",
		                  cnt);
		goto out;
	}
	for (size_t i = 0; i < cnt; i++)
		raw[i] = (int64_t)json_integer_value(json_array_get(rows, i));
	st = ts_rows_check(raw, cnt, dim0, norm, err);
	if (st == TS_OK) {
		*out = norm;
		*n = cnt;
		norm = NULL;
	}
out:
	free(raw);
	free(norm);
	return st;
}

static ts_status rows_slice(const json_t *rows, const char *field, uint64_t dim0, uint64_t **out,
                            size_t *n, struct ts_error *err)
{
	static const char *const keys[] = {"start", "stop", "step"};
	const json_t *part[3] = {NULL, NULL, NULL};
	struct ts_index_dim dim;
	const char *key;
	json_t *v;
	uint64_t *norm;
	ts_status st;

	json_object_foreach((json_t *)rows, key, v) {
		int k;

		for (k = 0; k < 3 && strcmp(key, keys[k]) != 0; k++)
			;
		if (k == 3)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
			                    "%s.%s is not a field this API knows; a slice of rows takes "
			                    "start, stop and step", field, key);
		if (!json_is_integer(v) && !json_is_null(v))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
			                    "%s.%s must be an integer or null, not %s", field, key,
			                    json_kind(v));
		part[k] = json_is_integer(v) ? v : NULL;
	}
	st = ts_rows_from_slice(json_integer_value(part[0]), json_integer_value(part[1]),
	                        part[2] ? json_integer_value(part[2]) : 1, part[0] != NULL,
	                        part[1] != NULL, dim0, &dim, err);
	if (st != TS_OK)
		return st;
	if (dim.count > TS_ROWS_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		                    "%s selects %" PRIu64 " rows; at most %u per call", field, dim.count,
		                    TS_ROWS_MAX);
	norm = malloc((dim.count ? dim.count : 1) * sizeof *norm);
	if (!norm)
		return ts_error_oom(err, "no memory for %" PRIu64 " rows", dim.count);
	for (uint64_t i = 0; i < dim.count; i++)
		norm[i] = (uint64_t)(dim.start + (int64_t)i * dim.step);
	*out = norm;
	*n = (size_t)dim.count;
	return TS_OK;
}

ts_status ts_rows_parse(const json_t *rows, const char *field, uint64_t dim0, uint64_t **out,
                        size_t *n, struct ts_error *err)
{
	*out = NULL;
	*n = 0;
	if (json_is_array(rows))
		return rows_list(rows, field, dim0, out, n, err);
	if (json_is_object(rows))
		return rows_slice(rows, field, dim0, out, n, err);
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
	                    "%s must be a list of integer row indices or {\"start\", \"stop\", "
	                    "\"step\"}, not %s", field, rows ? json_kind(rows) : "missing");
}
