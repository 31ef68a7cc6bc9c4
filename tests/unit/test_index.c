/*
 * test_index.c - basic indexing: parsed selections and their byte runs are
 * checked element by element against a brute-force reference (its own tiny
 * parser and CPython's slice.indices(), enumerated by nested loops), for a
 * table of expressions and for random ones; plus merging, error messages,
 * the row gather helpers and a huge virtual parent.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/index.h"
#include "tests/unit/unit.h"

/* ---- the reference ------------------------------------------------------ */

#define REF_MAX_ITEMS 40

enum ref_kind { REF_INT, REF_SLICE, REF_ELLIPSIS };

struct ref_item {
	enum ref_kind kind;
	int64_t v[3];
	bool has[3];
};

struct ref_result {
	ts_status status;
	uint64_t n;          /* elements selected */
	uint64_t *off;       /* their element offsets, output order */
	int out_rank;
	uint64_t out_shape[TS_INDEX_MAX_RANK];
};

static char *ref_trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
		*--e = '\0';
	return s;
}

/* Splits a valid expression into items (empty tokens, as after a trailing
 * comma, are skipped). */
static int ref_parse(const char *expr, struct ref_item *items)
{
	char buf[512], *save = NULL, *tok;
	int n = 0;

	if (!expr)
		return 0;
	snprintf(buf, sizeof buf, "%s", expr);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		struct ref_item *it = &items[n];
		char *t = ref_trim(tok), *part = t;

		if (!*t)
			continue;
		memset(it, 0, sizeof *it);
		n++;
		if (strcmp(t, "...") == 0) {
			it->kind = REF_ELLIPSIS;
			continue;
		}
		if (!strchr(t, ':')) {
			it->kind = REF_INT;
			it->v[0] = strtoll(t, NULL, 10);
			continue;
		}
		it->kind = REF_SLICE;
		for (int k = 0; k < 3 && part; k++) {
			char *colon = strchr(part, ':'), *p;

			if (colon)
				*colon = '\0';
			p = ref_trim(part);
			if (*p) {
				it->has[k] = true;
				it->v[k] = strtoll(p, NULL, 10);
			}
			part = colon ? colon + 1 : NULL;
		}
	}
	return n;
}

/* CPython's slice.indices() followed by range(): the indices selected. */
static size_t ref_slice(const struct ref_item *it, int64_t len, int64_t *out)
{
	int64_t step = it->has[2] ? it->v[2] : 1;
	int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
	int64_t start, stop;
	size_t n = 0;

	if (!it->has[0]) {
		start = step < 0 ? upper : lower;
	} else {
		start = it->v[0];
		if (start < 0) {
			start += len;
			if (start < lower)
				start = lower;
		} else if (start > upper) {
			start = upper;
		}
	}
	if (!it->has[1]) {
		stop = step < 0 ? lower : upper;
	} else {
		stop = it->v[1];
		if (stop < 0) {
			stop += len;
			if (stop < lower)
				stop = lower;
		} else if (stop > upper) {
			stop = upper;
		}
	}
	for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
		out[n++] = i;
		if (__builtin_add_overflow(i, step, &i))
			break;
	}
	return n;
}

/* Evaluates items on a parent by brute force. Shapes must be small. */
static void ref_eval(const struct ref_item *items, int nitems, int rank,
                     const uint64_t *shape, struct ref_result *r)
{
	int64_t idx[TS_INDEX_MAX_RANK][64];
	size_t cnt[TS_INDEX_MAX_RANK], pos[TS_INDEX_MAX_RANK];
	struct ref_item axes[TS_INDEX_MAX_RANK];
	uint64_t estride[TS_INDEX_MAX_RANK];
	int nindexed = 0, a = 0;

	memset(r, 0, sizeof *r);
	for (int k = 0; k < nitems; k++)
		nindexed += items[k].kind != REF_ELLIPSIS;
	if (nindexed > rank) {
		r->status = TS_INVALID_ARGUMENT;
		return;
	}
	for (int k = 0; k < nitems; k++) {
		if (items[k].kind == REF_ELLIPSIS) {
			for (int e = 0; e < rank - nindexed; e++)
				axes[a++] = (struct ref_item){.kind = REF_SLICE};
		} else {
			axes[a++] = items[k];
		}
	}
	while (a < rank)
		axes[a++] = (struct ref_item){.kind = REF_SLICE};
	for (int i = 0; i < rank; i++) {
		ck_assert_uint_le(shape[i], 64);
		if (axes[i].kind == REF_INT) {
			int64_t v = axes[i].v[0], len = (int64_t)shape[i];

			if (v < -len || v >= len) {
				r->status = TS_OUT_OF_RANGE;
				return;
			}
			idx[i][0] = v < 0 ? v + len : v;
			cnt[i] = 1;
		} else {
			if (axes[i].has[2] && axes[i].v[2] == 0) {
				r->status = TS_INVALID_ARGUMENT;
				return;
			}
			cnt[i] = ref_slice(&axes[i], (int64_t)shape[i], idx[i]);
			r->out_shape[r->out_rank++] = cnt[i];
		}
	}
	r->n = 1;
	for (int i = rank - 1; i >= 0; i--) {
		estride[i] = i == rank - 1 ? 1 : estride[i + 1] * shape[i + 1];
		r->n *= cnt[i];
	}
	r->off = calloc(r->n ? r->n : 1, sizeof *r->off);
	ck_assert_ptr_nonnull(r->off);
	memset(pos, 0, sizeof pos);
	for (uint64_t e = 0; e < r->n; e++) {
		uint64_t o = 0;

		for (int i = 0; i < rank; i++)
			o += (uint64_t)idx[i][pos[i]] * estride[i];
		r->off[e] = o;
		for (int i = rank - 1; i >= 0; i--) {
			if (++pos[i] < cnt[i])
				break;
			pos[i] = 0;
		}
	}
}

/* ---- checking a selection against the reference ------------------------- */

static uint64_t parent_elems(int rank, const uint64_t *shape)
{
	uint64_t n = 1;

	for (int i = 0; i < rank; i++)
		n *= shape[i];
	return n;
}

/*
 * Every invariant of the runs of s, and their elements equal r's. Runs are
 * of one length; two may touch (a step-3 axis of size 4 selects its last
 * element, then the next row's first) but not all of them.
 */
static void check_runs(const char *label, const struct ts_selection *s,
                       const struct ref_result *r, size_t elem)
{
	struct ts_run_iter it;
	uint64_t off, len, prev_end = UINT64_MAX, k = 0, nruns = 0, c_off = 7, c_len = 7;
	uint64_t first_len = 0, gaps = 0;
	uint64_t parent_bytes = parent_elems(s->rank, s->shape) * elem;
	bool contiguous;

	ck_assert_msg(s->out_rank == r->out_rank, "%s: out_rank %d, want %d", label,
	              s->out_rank, r->out_rank);
	for (int i = 0; i < r->out_rank; i++)
		ck_assert_msg(s->out_shape[i] == r->out_shape[i], "%s: out_shape[%d]", label, i);
	ck_assert_msg(ts_selection_elems(s) == r->n, "%s: elems %" PRIu64 ", want %" PRIu64,
	              label, ts_selection_elems(s), r->n);
	ts_run_iter_init(&it, s, elem);
	while (ts_run_iter_next(&it, &off, &len)) {
		ck_assert_msg(len > 0 && len % elem == 0 && off % elem == 0, "%s: run shape", label);
		ck_assert_msg(off <= parent_bytes && len <= parent_bytes - off,
		              "%s: run [%" PRIu64 ", +%" PRIu64 ") outside the parent", label, off, len);
		ck_assert_msg(nruns == 0 || len == first_len, "%s: runs of unequal length", label);
		if (nruns == 0)
			first_len = len;
		else if (off != prev_end)
			gaps++;
		for (uint64_t e = 0; e < len / elem; e++, k++)
			ck_assert_msg(k < r->n && r->off[k] == off / elem + e,
			              "%s: element %" PRIu64 " is %" PRIu64 ", want %" PRIu64, label,
			              k, off / elem + e, k < r->n ? r->off[k] : UINT64_MAX);
		prev_end = off + len;
		nruns++;
	}
	ck_assert_msg(!ts_run_iter_next(&it, &off, &len), "%s: iterator restarted", label);
	/* runs all end where the next begins only if they should have been one */
	ck_assert_msg(nruns < 2 || gaps > 0, "%s: %" PRIu64 " runs make one block", label, nruns);
	ck_assert_msg(k == r->n, "%s: %" PRIu64 " elements, want %" PRIu64, label, k, r->n);
	ck_assert_msg(nruns == ts_selection_nruns(s, elem), "%s: nruns %" PRIu64 " vs %" PRIu64,
	              label, nruns, ts_selection_nruns(s, elem));
	contiguous = ts_selection_contiguous(s, elem, &c_off, &c_len);
	ck_assert_msg(contiguous == (nruns <= 1), "%s: contiguous", label);
	if (nruns == 1)
		ck_assert_msg(c_off == r->off[0] * elem && c_len == r->n * elem,
		              "%s: contiguous run", label);
	if (nruns == 0)
		ck_assert_msg(c_off == 0 && c_len == 0, "%s: empty contiguous run", label);
}

/* Parses expr and compares it with the reference parse of the same text. */
static void check_expr(const char *expr, int rank, const uint64_t *shape)
{
	struct ref_item items[REF_MAX_ITEMS];
	struct ts_selection s;
	struct ts_error err;
	struct ref_result r;
	char label[160];
	ts_status st;

	snprintf(label, sizeof label, "'%s' rank %d", expr ? expr : "(null)", rank);
	ref_eval(items, ref_parse(expr, items), rank, shape, &r);
	ck_assert_msg(r.status == TS_OK, "%s: the table holds an invalid expression", label);
	ts_error_clear(&err);
	st = ts_index_parse(expr, rank, shape, &s, &err);
	ck_assert_msg(st == TS_OK, "%s: %s", label, err.message);
	ck_assert_int_eq(s.rank, rank);
	check_runs(label, &s, &r, 1);
	check_runs(label, &s, &r, 4);
	check_runs(label, &s, &r, 6);
	free(r.off);
}

/* ---- the table ---------------------------------------------------------- */

struct expr_case {
	int rank;
	uint64_t shape[4];
	const char *expr;
};

static const struct expr_case expr_cases[] = {
	/* rank 1 */
	{1, {10}, NULL}, {1, {10}, ""}, {1, {10}, "  "}, {1, {10}, "..."},
	{1, {10}, "0"}, {1, {10}, "9"}, {1, {10}, "-1"}, {1, {10}, "-10"}, {1, {10}, "+3"},
	{1, {10}, ":"}, {1, {10}, "::"}, {1, {10}, "::1"}, {1, {10}, "::2"}, {1, {10}, "::3"},
	{1, {10}, "1::3"}, {1, {10}, "5:"}, {1, {10}, ":5"}, {1, {10}, ":-1"}, {1, {10}, "-3:"},
	{1, {10}, "2:8"}, {1, {10}, "2:8:2"}, {1, {10}, "8:2"}, {1, {10}, "8:2:-1"},
	{1, {10}, "8:2:-3"}, {1, {10}, "::-1"}, {1, {10}, "::-2"}, {1, {10}, "-1::-1"},
	{1, {10}, "5::-1"}, {1, {10}, ":5:-1"}, {1, {10}, ":-11:-1"}, {1, {10}, "-100:100"},
	{1, {10}, "100:"}, {1, {10}, ":-100"}, {1, {10}, "100::-1"}, {1, {10}, "-100::-1"},
	{1, {10}, "3:3"}, {1, {10}, "4:3"}, {1, {10}, "0:10:100"}, {1, {10}, "9:0:-100"},
	{1, {10}, "::9223372036854775807"}, {1, {10}, "::-9223372036854775808"},
	{1, {10}, "-9223372036854775808:9223372036854775807"},
	{1, {10}, "9223372036854775807:-9223372036854775808:-1"},
	{1, {10}, " 1 : 7 : 2 "}, {1, {10}, "\t-2\t"}, {1, {10}, "3,"}, {1, {10}, ":,"},
	{1, {10}, "...,2"}, {1, {10}, "2,..."}, {1, {10}, "..., ::-1"},
	{1, {0}, ""}, {1, {0}, ":"}, {1, {0}, "::-1"}, {1, {0}, "5:"}, {1, {0}, "..."},
	{1, {1}, "0"}, {1, {1}, "-1"}, {1, {1}, ":"}, {1, {1}, "::-1"}, {1, {1}, "1:"},
	/* rank 0 */
	{0, {0}, ""}, {0, {0}, NULL}, {0, {0}, "..."}, {0, {0}, " ... "}, {0, {0}, "...,"},
	/* rank 2 */
	{2, {4, 6}, ""}, {2, {4, 6}, "1"}, {2, {4, 6}, "1,2"}, {2, {4, 6}, "-1,-1"},
	{2, {4, 6}, ":,2"}, {2, {4, 6}, "1:3"}, {2, {4, 6}, "1:3,:"}, {2, {4, 6}, "1:3,1:4"},
	{2, {4, 6}, "::2,::2"}, {2, {4, 6}, "::-1"}, {2, {4, 6}, ":,::-1"},
	{2, {4, 6}, "::-1,::-1"}, {2, {4, 6}, "...,1"}, {2, {4, 6}, "1,..."},
	{2, {4, 6}, "..., 2:5"}, {2, {4, 6}, "1,...,2"}, {2, {4, 6}, "3:1,:"},
	{2, {4, 6}, ":,6:"}, {2, {4, 6}, "2,1:2"}, {2, {4, 6}, "1:2,1:2"},
	{2, {4, 6}, "0:4,0:6"}, {2, {4, 6}, "-4:,-6:"}, {2, {4, 6}, "::3,1::4"},
	{2, {4, 1}, ":,0"}, {2, {4, 1}, "1:3,0"}, {2, {4, 1}, "::2"}, {2, {1, 6}, "0"},
	{2, {1, 6}, "0,::2"}, {2, {1, 1}, "0,0"}, {2, {1, 1}, ""}, {2, {0, 6}, ":,2"},
	{2, {0, 6}, ""}, {2, {6, 0}, "2"}, {2, {6, 0}, "::-1"}, {2, {6, 0}, "1:3,:"},
	/* rank 3 */
	{3, {8, 6, 16}, "2:5"}, {3, {8, 6, 16}, "1,:,3"}, {3, {8, 6, 16}, "1,2,3"},
	{3, {8, 6, 16}, "...,3"}, {3, {8, 6, 16}, "..., 3:9"}, {3, {8, 6, 16}, ":,2:4"},
	{3, {8, 6, 16}, ":,2"}, {3, {8, 6, 16}, "2:5,3"}, {3, {8, 6, 16}, "2:5,3:4"},
	{3, {8, 6, 16}, "2:5,3:4,:"}, {3, {8, 6, 16}, "::2,::2,::2"},
	{3, {8, 6, 16}, "::-1,::-1,::-1"}, {3, {8, 6, 16}, "-1,...,-1"},
	{3, {8, 6, 16}, "1,...,2:3"}, {3, {8, 6, 16}, "..., :, :, :"},
	{3, {8, 6, 16}, ":, :, ::-1"}, {3, {8, 6, 16}, ":, ::-1"}, {3, {8, 6, 16}, "7::-3, 5:0:-2"},
	{3, {3, 1, 5}, ":,0,1:4"}, {3, {3, 1, 5}, ":,:,1"}, {3, {3, 1, 5}, "1:"},
	{3, {3, 0, 5}, "1"}, {3, {3, 0, 5}, "...,2"}, {3, {2, 3, 4}, "...,1:2,:"},
	/* rank 4 */
	{4, {3, 4, 5, 6}, ""}, {4, {3, 4, 5, 6}, "1"}, {4, {3, 4, 5, 6}, "1,2"},
	{4, {3, 4, 5, 6}, "1,2,3,4"}, {4, {3, 4, 5, 6}, "...,1"}, {4, {3, 4, 5, 6}, "1,...,1"},
	{4, {3, 4, 5, 6}, ":,1:3,...,::2"}, {4, {3, 4, 5, 6}, "::-1,:,::-2,1:"},
	{4, {3, 4, 5, 6}, ":,:,2:4"}, {4, {3, 4, 5, 6}, ":,:,2:4,:"}, {4, {3, 4, 5, 6}, ":,0"},
	{4, {3, 4, 5, 6}, "-1,-1,-1,-1"}, {4, {3, 4, 5, 6}, "1:,1:,1:,1:"},
	{4, {2, 1, 3, 1}, ":,0,:,0"}, {4, {2, 1, 3, 1}, "1"}, {4, {2, 1, 3, 1}, "..., 0"},
	{4, {2, 0, 3, 1}, "1,:,2"}, {4, {1, 1, 1, 1}, "0,0,0,0"}, {4, {1, 1, 1, 1}, "..."},
};

START_TEST(test_table_matches_reference)
{
	for (size_t i = 0; i < sizeof expr_cases / sizeof expr_cases[0]; i++)
		check_expr(expr_cases[i].expr, expr_cases[i].rank, expr_cases[i].shape);
}
END_TEST

START_TEST(test_identity_forms_agree)
{
	static const uint64_t shape[3] = {5, 0, 2};
	static const char *const forms[] = {NULL, "", "...", ":", ":,:,:", "..., :", "::1,:,"};
	struct ts_selection all, s;
	struct ts_error err;

	ts_selection_all(3, shape, &all);
	for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
		ts_error_clear(&err);
		ck_assert_int_eq(ts_index_parse(forms[i], 3, shape, &s, &err), TS_OK);
		ck_assert(memcmp(&s, &all, sizeof s) == 0);
	}
	ts_selection_all(0, NULL, &all);
	ck_assert_int_eq(all.out_rank, 0);
	ck_assert_uint_eq(ts_selection_elems(&all), 1);
	ck_assert_uint_eq(ts_selection_nruns(&all, 8), 1);
}
END_TEST

/* ---- merging ------------------------------------------------------------ */

struct runs_case {
	int rank;
	uint64_t shape[4];
	const char *expr;
	size_t elem;
	uint64_t nruns;
	uint64_t first_off; /* first run, bytes */
	uint64_t len;       /* every run, bytes */
};

static const struct runs_case runs_cases[] = {
	{3, {8, 6, 16}, "2:5", 4, 1, 2 * 96 * 4, 3 * 96 * 4},
	{3, {8, 6, 16}, "", 4, 1, 0, 8 * 96 * 4},
	{3, {8, 6, 16}, "3", 2, 1, 3 * 96 * 2, 96 * 2},
	{3, {8, 6, 16}, "3, 2:4", 2, 1, (3 * 96 + 32) * 2, 32 * 2},
	{3, {8, 6, 16}, "3, 2, 4:9", 2, 1, (3 * 96 + 32 + 4) * 2, 5 * 2},
	{3, {8, 6, 16}, "1,:,3", 4, 6, (96 + 3) * 4, 4},
	{3, {8, 6, 16}, ":,2", 1, 8, 32, 16},
	{3, {8, 6, 16}, ":,2:4", 1, 8, 32, 32},
	{3, {8, 6, 16}, "...,3", 1, 48, 3, 1},
	{3, {8, 6, 16}, "::-1", 1, 8, 7 * 96, 96},
	{3, {8, 6, 16}, "::2, ::2", 1, 12, 0, 16},
	{3, {8, 6, 16}, "2:5, 3:4", 8, 3, (2 * 96 + 48) * 8, 16 * 8},
	{3, {8, 1, 16}, "2:5, 0", 4, 1, 2 * 16 * 4, 3 * 16 * 4},
	{3, {8, 6, 16}, "5:6, 1:3, 0:16", 4, 1, (5 * 96 + 16) * 4, 32 * 4},
	{1, {10}, "::2", 8, 5, 0, 8},
	{1, {10}, "::-1", 8, 10, 72, 8},
	{1, {10}, "3:4:7", 8, 1, 24, 8},
	{1, {10}, "9:10:-1", 8, 0, 0, 0},
	{2, {4, 6}, "::2, :", 4, 2, 0, 24},
	{2, {4, 6}, "1:3, 0:5", 4, 2, 24, 20},
	{2, {4, 0}, "", 4, 0, 0, 0},
	{0, {0}, "", 8, 1, 0, 8},
	{4, {3, 4, 5, 6}, ":, :, :, 1", 4, 60, 4, 4},
	{4, {3, 4, 5, 6}, "1, :, 2", 4, 4, (120 + 12) * 4, 24},
};

START_TEST(test_runs_merge)
{
	for (size_t i = 0; i < sizeof runs_cases / sizeof runs_cases[0]; i++) {
		const struct runs_case *c = &runs_cases[i];
		struct ts_selection s;
		struct ts_run_iter it;
		struct ts_error err;
		uint64_t off, len, n = 0;

		ts_error_clear(&err);
		ck_assert_int_eq(ts_index_parse(c->expr, c->rank, c->shape, &s, &err), TS_OK);
		ck_assert_msg(ts_selection_nruns(&s, c->elem) == c->nruns, "'%s': %" PRIu64 " runs",
		              c->expr, ts_selection_nruns(&s, c->elem));
		ts_run_iter_init(&it, &s, c->elem);
		while (ts_run_iter_next(&it, &off, &len)) {
			if (n == 0)
				ck_assert_msg(off == c->first_off, "'%s': first run at %" PRIu64, c->expr, off);
			ck_assert_msg(len == c->len, "'%s': run of %" PRIu64 " bytes", c->expr, len);
			n++;
		}
		ck_assert_uint_eq(n, c->nruns);
	}
}
END_TEST

/* ---- errors ------------------------------------------------------------- */

struct error_case {
	int rank;
	uint64_t shape[4];
	const char *expr;
	ts_status status;
	const char *message; /* a substring */
};

static const struct error_case error_cases[] = {
	{3, {8, 6, 16}, "0, 7", TS_OUT_OF_RANGE,
	 "index 7 is out of range for axis 1 with size 6"},
	{3, {8, 6, 16}, ":, -7", TS_OUT_OF_RANGE,
	 "index -7 is out of range for axis 1 with size 6"},
	{3, {8, 6, 16}, "..., 16", TS_OUT_OF_RANGE,
	 "index 16 is out of range for axis 2 with size 16"},
	{1, {0}, "0", TS_OUT_OF_RANGE, "index 0 is out of range for axis 0 with size 0"},
	{1, {4}, "-9223372036854775808", TS_OUT_OF_RANGE,
	 "index -9223372036854775808 is out of range for axis 0 with size 4"},
	{1, {4}, "9223372036854775807", TS_OUT_OF_RANGE, "for axis 0 with size 4"},
	{1, {4}, "::0", TS_INVALID_ARGUMENT, "slice step cannot be zero for axis 0"},
	{3, {8, 6, 16}, "..., ::0", TS_INVALID_ARGUMENT, "slice step cannot be zero for axis 2"},
	{3, {8, 6, 16}, "1,2,3,4", TS_INVALID_ARGUMENT,
	 "too many indices: array is 3-dimensional, but 4 were indexed"},
	{3, {8, 6, 16}, "..., 1,2,3,4", TS_INVALID_ARGUMENT, "but 4 were indexed"},
	{0, {0}, "0", TS_INVALID_ARGUMENT,
	 "too many indices: array is 0-dimensional, but 1 were indexed"},
	{0, {0}, ":", TS_INVALID_ARGUMENT, "array is 0-dimensional, but 1 were indexed"},
	{1, {4}, "99999999999999999999", TS_INVALID_ARGUMENT,
	 "index '99999999999999999999' at offset 0 does not fit in a 64-bit integer"},
	{1, {4}, "1:99999999999999999999", TS_INVALID_ARGUMENT, "does not fit in a 64-bit"},
	{1, {4}, "9223372036854775808", TS_INVALID_ARGUMENT, "does not fit in a 64-bit"},
	{1, {4}, "-9223372036854775809", TS_INVALID_ARGUMENT, "does not fit in a 64-bit"},
	{1, {4}, "None", TS_INVALID_ARGUMENT, "new axes ('None') are not supported"},
	{1, {4}, "np.newaxis", TS_INVALID_ARGUMENT, "new axes ('np.newaxis') are not"},
	{2, {4, 4}, ":, newaxis", TS_INVALID_ARGUMENT, "new axes ('newaxis')"},
	{1, {4}, "True", TS_INVALID_ARGUMENT, "boolean indices ('True') are not supported"},
	{1, {4}, "false", TS_INVALID_ARGUMENT, "boolean indices"},
	{1, {4}, "[1, 2]", TS_INVALID_ARGUMENT, "index arrays and lists are not supported"},
	{1, {4}, "(1, 2)", TS_INVALID_ARGUMENT, "index arrays and lists are not supported"},
	{2, {4, 4}, "1, [0]", TS_INVALID_ARGUMENT, "index arrays and lists"},
	{3, {4, 4, 4}, "1,,2", TS_INVALID_ARGUMENT, "empty item at position 2 in index '1,,2'"},
	{3, {4, 4, 4}, ",", TS_INVALID_ARGUMENT, "empty item at position 1"},
	{3, {4, 4, 4}, "1, ,", TS_INVALID_ARGUMENT, "empty item at position 2"},
	{3, {4, 4, 4}, "1,,", TS_INVALID_ARGUMENT, "empty item at position 2"},
	{3, {4, 4, 4}, "...,...", TS_INVALID_ARGUMENT, "only have a single ellipsis"},
	{1, {4}, "1.5", TS_INVALID_ARGUMENT, "non-integer index '1.5'"},
	{1, {4}, "1e3", TS_INVALID_ARGUMENT, "non-integer index '1e3'"},
	{1, {4}, "0x1", TS_INVALID_ARGUMENT, "non-integer index '0x1'"},
	{1, {4}, "1:2:3:4", TS_INVALID_ARGUMENT, "too many parts in slice"},
	{1, {4}, "abc", TS_INVALID_ARGUMENT, "unexpected 'abc' at offset 0"},
	{2, {4, 4}, "1 2", TS_INVALID_ARGUMENT, "unexpected character '2' at offset 2"},
	{1, {4}, "-", TS_INVALID_ARGUMENT, "expected a digit after the sign"},
	{1, {4}, "- 1", TS_INVALID_ARGUMENT, "expected a digit after the sign"},
	{1, {4}, "--1", TS_INVALID_ARGUMENT, "expected a digit after the sign"},
	{1, {4}, "1:*", TS_INVALID_ARGUMENT, "unexpected character '*' at offset 2"},
	{1, {4}, "....", TS_INVALID_ARGUMENT, "unexpected character '.' at offset 3"},
	{1, {4}, "..", TS_INVALID_ARGUMENT, "unexpected character '.' at offset 0"},
	{1, {4}, "\x01", TS_INVALID_ARGUMENT, "unexpected character byte 0x01 at offset 0"},
	{1, {4}, "1;2", TS_INVALID_ARGUMENT, "unexpected character ';'"},
};

START_TEST(test_errors_name_the_problem)
{
	for (size_t i = 0; i < sizeof error_cases / sizeof error_cases[0]; i++) {
		const struct error_case *c = &error_cases[i];
		const char *reason = c->status == TS_OUT_OF_RANGE ? "INDEX_OUT_OF_RANGE" : "BAD_INDEX";
		struct ts_selection s;
		struct ts_error err;

		ts_error_clear(&err);
		ck_assert_msg(ts_index_parse(c->expr, c->rank, c->shape, &s, &err) == c->status,
		              "'%s': status %s (%s)", c->expr, ts_status_name(err.status),
		              err.message);
		ck_assert_int_eq(err.status, c->status);
		ck_assert_str_eq(err.reason, reason);
		ck_assert_msg(strstr(err.message, c->message), "'%s': message '%s', want '%s'",
		              c->expr, err.message, c->message);
	}
}
END_TEST

START_TEST(test_errors_metadata_and_limits)
{
	uint64_t shape[TS_INDEX_MAX_RANK + 1];
	struct ts_selection s;
	struct ts_error err;

	for (int i = 0; i <= TS_INDEX_MAX_RANK; i++)
		shape[i] = 2;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_index_parse("0, 5", 2, shape, &s, &err), TS_OUT_OF_RANGE);
	ck_assert_int_eq(err.nmeta, 3);
	ck_assert_str_eq(err.meta[0].key, "axis");
	ck_assert_str_eq(err.meta[0].value, "1");
	ck_assert_str_eq(err.meta[2].value, "2");

	ts_error_clear(&err);
	ck_assert_int_eq(ts_index_parse("", TS_INDEX_MAX_RANK + 1, shape, &s, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert(strstr(err.message, "rank 33"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_index_parse("", -1, shape, &s, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_index_parse("...,1", TS_INDEX_MAX_RANK, shape, &s, &err), TS_OK);
	ck_assert_int_eq(s.out_rank, TS_INDEX_MAX_RANK - 1);
	ck_assert_uint_eq(ts_selection_nruns(&s, 1), 1ull << (TS_INDEX_MAX_RANK - 1));

	shape[0] = (uint64_t)INT64_MAX + 1;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_index_parse("", 1, shape, &s, &err), TS_INVALID_ARGUMENT);
	ck_assert(strstr(err.message, "axis 0"));
	shape[0] = 1ull << 40;
	shape[1] = 1ull << 40;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_index_parse("", 2, shape, &s, &err), TS_INVALID_ARGUMENT);
	ck_assert(strstr(err.message, "2^64"));
	shape[2] = 0;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_index_parse("", 3, shape, &s, &err), TS_OK);
	ck_assert_uint_eq(ts_selection_nruns(&s, 4), 0);

	/* a long list of indices is counted, not stored */
	{
		char many[400];
		size_t n = 0;

		for (int i = 0; i < 100; i++)
			n += (size_t)snprintf(many + n, sizeof many - n, "%s0", i ? "," : "");
		ts_error_clear(&err);
		ck_assert_int_eq(ts_index_parse(many, 3, shape, &s, &err), TS_INVALID_ARGUMENT);
		ck_assert(strstr(err.message, "array is 3-dimensional, but 100 were indexed"));
	}
	ck_assert_int_eq(ts_index_parse("9", 1, shape, &s, NULL), TS_OK);
	ck_assert_int_eq(ts_index_parse("x", 1, shape, &s, NULL), TS_INVALID_ARGUMENT);
}
END_TEST

/* ---- random expressions ------------------------------------------------- */

struct rng {
	uint64_t s;
};

static uint64_t rng_next(struct rng *r)
{
	r->s ^= r->s << 13;
	r->s ^= r->s >> 7;
	r->s ^= r->s << 17;
	return r->s;
}

static int64_t rng_range(struct rng *r, int64_t lo, int64_t hi)
{
	return lo + (int64_t)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

static void put(char *buf, size_t cap, size_t *n, const char *s)
{
	size_t l = strlen(s);

	ck_assert_uint_lt(*n + l, cap);
	memcpy(buf + *n, s, l + 1);
	*n += l;
}

static void put_ws(struct rng *r, char *buf, size_t cap, size_t *n)
{
	if (rng_next(r) % 4 == 0)
		put(buf, cap, n, rng_next(r) % 2 ? " " : " \t ");
}

static void put_int(struct rng *r, char *buf, size_t cap, size_t *n, int64_t v)
{
	char num[32];

	snprintf(num, sizeof num, "%s%lld", v >= 0 && rng_next(r) % 8 == 0 ? "+" : "",
	         (long long)v);
	put(buf, cap, n, num);
}

/* A random item on an axis of the given size, and its text. */
static void random_item(struct rng *r, int64_t size, struct ref_item *it, char *buf,
                        size_t cap, size_t *n)
{
	memset(it, 0, sizeof *it);
	put_ws(r, buf, cap, n);
	if (rng_next(r) % 3 == 0) {
		it->kind = REF_INT;
		it->v[0] = rng_range(r, -size - 2, size + 1);
		put_int(r, buf, cap, n, it->v[0]);
	} else {
		int parts = rng_next(r) % 2 ? 3 : 2;

		it->kind = REF_SLICE;
		for (int k = 0; k < parts; k++) {
			if (k)
				put(buf, cap, n, ":");
			put_ws(r, buf, cap, n);
			if (rng_next(r) % 3 == 0)
				continue;
			it->has[k] = true;
			it->v[k] = k == 2 ? rng_range(r, -4, 4) : rng_range(r, -size - 3, size + 3);
			if (k == 2 && it->v[k] == 0 && rng_next(r) % 4)
				it->v[k] = 1; /* a zero step now and then, not a third of the time */
			put_int(r, buf, cap, n, it->v[k]);
			put_ws(r, buf, cap, n);
		}
	}
	put_ws(r, buf, cap, n);
}

START_TEST(test_random_matches_reference)
{
	struct rng r = {0x9e3779b97f4a7c15ull};
	int ok = 0, failed = 0;

	for (int round = 0; round < 20000; round++) {
		struct ref_item items[REF_MAX_ITEMS];
		uint64_t shape[4];
		int rank = (int)rng_range(&r, 0, 4), nindexed, nitems = 0, ell;
		char expr[512];
		size_t n = 0;
		struct ts_selection s;
		struct ts_error err;
		struct ref_result ref;
		ts_status st;

		expr[0] = '\0';
		for (int i = 0; i < rank; i++)
			shape[i] = (uint64_t)(rng_next(&r) % 8 == 0 ? rng_range(&r, 0, 1)
			                                            : rng_range(&r, 2, 7));
		nindexed = (int)rng_range(&r, 0, rank);
		if (rng_next(&r) % 16 == 0)
			nindexed++; /* too many */
		ell = rng_next(&r) % 3 == 0 ? (int)rng_range(&r, 0, nindexed) : -1;
		for (int k = 0, axis = 0; k <= nindexed; k++) {
			if (k == ell || k < nindexed) {
				if (nitems)
					put(expr, sizeof expr, &n, ",");
			}
			if (k == ell) {
				items[nitems++] = (struct ref_item){.kind = REF_ELLIPSIS};
				put_ws(&r, expr, sizeof expr, &n);
				put(expr, sizeof expr, &n, "...");
				put_ws(&r, expr, sizeof expr, &n);
				axis += rank - nindexed > 0 ? rank - nindexed : 0;
				if (k < nindexed)
					put(expr, sizeof expr, &n, ",");
			}
			if (k < nindexed) {
				int64_t size = axis < rank ? (int64_t)shape[axis] : 3;

				random_item(&r, size, &items[nitems++], expr, sizeof expr, &n);
				axis++;
			}
		}
		if (nitems && rng_next(&r) % 8 == 0)
			put(expr, sizeof expr, &n, ",");

		ref_eval(items, nitems, rank, shape, &ref);
		ts_error_clear(&err);
		st = ts_index_parse(expr, rank, shape, &s, &err);
		ck_assert_msg(st == ref.status, "round %d '%s' rank %d: status %s (%s), want %s",
		              round, expr, rank, ts_status_name(st), err.message,
		              ts_status_name(ref.status));
		if (st == TS_OK) {
			char label[600];

			snprintf(label, sizeof label, "round %d '%s'", round, expr);
			check_runs(label, &s, &ref, (size_t)1 << (round % 4));
			ok++;
		} else {
			ck_assert(err.message[0]);
			failed++;
		}
		free(ref.off);
	}
	ck_assert_int_gt(ok, 10000);
	ck_assert_int_gt(failed, 500);
}
END_TEST

/* ---- rows --------------------------------------------------------------- */

START_TEST(test_rows_normalize_and_merge)
{
	static const int64_t rows[] = {0, -1, 3, 3, 4, 5, -8};
	static const struct {
		uint64_t off, len;
	} want[] = {{0, 10}, {70, 10}, {30, 10}, {30, 30}, {0, 10}};
	uint64_t norm[7], off, len;
	struct ts_rows_iter it;
	struct ts_error err;
	size_t k = 0;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_check(rows, 7, 8, norm, &err), TS_OK);
	ck_assert_uint_eq(norm[1], 7);
	ck_assert_uint_eq(norm[6], 0);
	ts_rows_iter_init(&it, norm, 7, 10);
	while (ts_rows_iter_next(&it, &off, &len)) {
		ck_assert_uint_lt(k, 5);
		ck_assert_uint_eq(off, want[k].off);
		ck_assert_uint_eq(len, want[k].len);
		k++;
	}
	ck_assert_uint_eq(k, 5);

	/* all ascending: one run; none: no run; zero-byte rows: no run */
	{
		static const uint64_t up[] = {2, 3, 4, 5};

		ts_rows_iter_init(&it, up, 4, 3);
		ck_assert(ts_rows_iter_next(&it, &off, &len));
		ck_assert_uint_eq(off, 6);
		ck_assert_uint_eq(len, 12);
		ck_assert(!ts_rows_iter_next(&it, &off, &len));
		ts_rows_iter_init(&it, up, 0, 3);
		ck_assert(!ts_rows_iter_next(&it, &off, &len));
		ts_rows_iter_init(&it, up, 4, 0);
		ck_assert(!ts_rows_iter_next(&it, &off, &len));
	}
	ck_assert_int_eq(ts_rows_check(rows, 0, 0, norm, &err), TS_OK);
}
END_TEST

START_TEST(test_rows_in_place_and_errors)
{
	int64_t rows[4] = {-2, 1, -4, 3};
	uint64_t norm[4] = {11, 11, 11, 11};
	int64_t bad[3] = {1, 2, 8};
	int64_t bad_neg[2] = {0, -9};
	int64_t extreme[2] = {INT64_MIN, INT64_MAX};
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_check(rows, 4, 4, (uint64_t *)rows, &err), TS_OK);
	ck_assert_uint_eq((uint64_t)rows[0], 2);
	ck_assert_uint_eq((uint64_t)rows[2], 0);

	ck_assert_int_eq(ts_rows_check(bad, 3, 8, norm, &err), TS_OUT_OF_RANGE);
	ck_assert_str_eq(err.reason, "INDEX_OUT_OF_RANGE");
	ck_assert_str_eq(err.message,
	                 "row index 8 at position 2 is out of range for axis 0 with size 8");
	ck_assert_uint_eq(norm[0], 11); /* untouched */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_check(bad_neg, 2, 8, norm, &err), TS_OUT_OF_RANGE);
	ck_assert(strstr(err.message, "row index -9 at position 1"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_check(extreme, 2, 8, norm, &err), TS_OUT_OF_RANGE);
	ck_assert(strstr(err.message, "-9223372036854775808 at position 0"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_check(extreme + 1, 1, 0, norm, &err), TS_OUT_OF_RANGE);
	ck_assert(strstr(err.message, "size 0"));
}
END_TEST

START_TEST(test_rows_random_cover_the_list)
{
	struct rng r = {12345};

	for (int round = 0; round < 2000; round++) {
		int64_t rows[40];
		uint64_t norm[40], off, len, dim0 = (uint64_t)rng_range(&r, 1, 12), prev_end = 0;
		size_t n = (size_t)rng_range(&r, 0, 40), k = 0;
		uint64_t row_bytes = (uint64_t)rng_range(&r, 1, 9);
		struct ts_rows_iter it;
		struct ts_error err;
		bool first = true;

		for (size_t i = 0; i < n; i++) {
			/* often the row after the previous one, to be merged */
			int64_t next = i ? (rows[i - 1] + 1) % (int64_t)dim0 : 0;

			rows[i] = i && rng_next(&r) % 2 ? next
			                                : rng_range(&r, -(int64_t)dim0, (int64_t)dim0 - 1);
		}
		ts_error_clear(&err);
		ck_assert_int_eq(ts_rows_check(rows, n, dim0, norm, &err), TS_OK);
		ts_rows_iter_init(&it, norm, n, row_bytes);
		while (ts_rows_iter_next(&it, &off, &len)) {
			ck_assert(len > 0 && len % row_bytes == 0 && off % row_bytes == 0);
			ck_assert(off + len <= dim0 * row_bytes);
			ck_assert(first || off != prev_end);
			for (uint64_t j = 0; j < len / row_bytes; j++, k++) {
				int64_t want = rows[k] < 0 ? rows[k] + (int64_t)dim0 : rows[k];

				ck_assert_uint_eq(off / row_bytes + j, (uint64_t)want);
			}
			prev_end = off + len;
			first = false;
		}
		ck_assert_uint_eq(k, n);
	}
}
END_TEST

START_TEST(test_rows_slice_python_semantics)
{
	struct rng r = {777};
	struct ts_index_dim d;
	struct ts_error err;

	for (int round = 0; round < 20000; round++) {
		struct ref_item it = {.kind = REF_SLICE};
		int64_t len = rng_range(&r, 0, 9), want[64];
		size_t n;

		it.has[0] = rng_next(&r) % 3 != 0;
		it.has[1] = rng_next(&r) % 3 != 0;
		it.has[2] = true;
		it.v[0] = rng_range(&r, -12, 12);
		it.v[1] = rng_range(&r, -12, 12);
		it.v[2] = rng_range(&r, -4, 4);
		if (it.v[2] == 0)
			it.v[2] = round % 2 ? INT64_MAX : INT64_MIN;
		if (round % 50 == 0) {
			it.v[0] = round % 100 ? INT64_MIN : INT64_MAX;
			it.v[1] = round % 100 ? INT64_MAX : INT64_MIN;
		}
		n = ref_slice(&it, len, want);
		ts_error_clear(&err);
		ck_assert_int_eq(ts_rows_from_slice(it.v[0], it.v[1], it.v[2], it.has[0], it.has[1],
		                                    (uint64_t)len, &d, &err), TS_OK);
		ck_assert_uint_eq(d.count, n);
		ck_assert(!d.collapsed);
		ck_assert_int_eq(d.step, it.v[2]);
		for (size_t k = 0; k < n; k++)
			ck_assert_int_eq(d.start + (int64_t)k * d.step, want[k]);
	}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_from_slice(0, 5, 0, true, true, 10, &d, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_INDEX");
	ck_assert(strstr(err.message, "slice step cannot be zero for axis 0"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_from_slice(0, 5, 1, true, true, UINT64_MAX, &d, &err),
	                 TS_INVALID_ARGUMENT);
}
END_TEST

/* ---- a huge virtual parent ---------------------------------------------- */

START_TEST(test_huge_parent_one_run)
{
	static const uint64_t shape[3] = {530640, 6, 1024};
	static const struct {
		const char *expr;
		uint64_t off, len; /* in elements */
	} cases[] = {
		{"12345", 12345ull * 6144, 6144},
		{"12345:12346", 12345ull * 6144, 6144},
		{"12345, 2", 12345ull * 6144 + 2048, 1024},
		{"12345, 2, 7", 12345ull * 6144 + 2048 + 7, 1},
		{"-1", 530639ull * 6144, 6144},
		{"100:200", 100ull * 6144, 100ull * 6144},
		{"530639::-1000000", 530639ull * 6144, 6144},
		{"", 0, 530640ull * 6144},
	};
	struct ts_selection s;
	struct ts_run_iter it;
	struct ts_error err;
	uint64_t off, len;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		ts_error_clear(&err);
		ck_assert_int_eq(ts_index_parse(cases[i].expr, 3, shape, &s, &err), TS_OK);
		ck_assert_uint_eq(ts_selection_nruns(&s, 4), 1);
		ts_run_iter_init(&it, &s, 4);
		ck_assert(ts_run_iter_next(&it, &off, &len));
		ck_assert_uint_eq(off, cases[i].off * 4);
		ck_assert_uint_eq(len, cases[i].len * 4);
		ck_assert(!ts_run_iter_next(&it, &off, &len));
		ck_assert(ts_selection_contiguous(&s, 4, &off, &len));
		ck_assert_uint_eq(off, cases[i].off * 4);
	}
	/* run counts come from the shape alone */
	ck_assert_int_eq(ts_index_parse("..., 5", 3, shape, &s, &err), TS_OK);
	ck_assert_uint_eq(ts_selection_nruns(&s, 4), 530640ull * 6);
	ck_assert(!ts_selection_contiguous(&s, 4, NULL, NULL));
	ck_assert_int_eq(ts_index_parse("::2", 3, shape, &s, &err), TS_OK);
	ck_assert_uint_eq(ts_selection_nruns(&s, 4), 265320);
	ck_assert_uint_eq(ts_selection_elems(&s), 265320ull * 6144);
}
END_TEST


/* The one JSON rows parser of :gather and :step: every form, every field. */
START_TEST(test_rows_parse_json_forms)
{
	static const struct {
		const char *json, *reason, *names;
	} bad[] = {
		{"[\"a\", 1.5, null]", "BAD_ROWS", "rows[0] must be an integer row index, not a string"},
		{"[0, 1.5]", "BAD_ROWS", "rows[1] must be an integer row index, not a real number"},
		{"[0, null]", "BAD_ROWS", "rows[1] must be an integer row index, not null"},
		{"[false]", "BAD_ROWS", "rows[0] must be an integer row index, not a boolean"},
		{"[[1]]", "BAD_ROWS", "rows[0] must be an integer row index, not a list"},
		{"{\"start\": 0.5}", "BAD_ROWS", "rows.start must be an integer or null, not a real"},
		{"{\"stop\": \"3\"}", "BAD_ROWS", "rows.stop must be an integer or null, not a string"},
		{"{\"begin\": 0}", "BAD_ROWS", "rows.begin is not a field this API knows"},
		{"{\"step\": 0}", "BAD_INDEX", "step"},
		{"\"0:3\"", "BAD_ROWS", "rows must be a list of integer row indices"},
		{"[8]", "INDEX_OUT_OF_RANGE", "row index 8 at position 0"},
		{"[-9]", "INDEX_OUT_OF_RANGE", "row index -9 at position 0"},
	};
	static const struct {
		const char *json;
		size_t n;
		uint64_t rows[8];
	} good[] = {
		{"[7, 1, -1, 0, 0]", 5, {7, 1, 7, 0, 0}},
		{"[]", 0, {0}},
		{"{}", 8, {0, 1, 2, 3, 4, 5, 6, 7}},
		{"{\"start\": 1, \"stop\": 7, \"step\": 2}", 3, {1, 3, 5}},
		{"{\"start\": null, \"stop\": -5, \"step\": null}", 3, {0, 1, 2}},
		{"{\"step\": -3}", 3, {7, 4, 1}},
		{"{\"start\": 100}", 0, {0}},
	};
	struct ts_error err;
	uint64_t *rows;
	size_t n;

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		json_t *j = json_loads(bad[i].json, JSON_DECODE_ANY, NULL);
		ts_status st;

		ck_assert_ptr_nonnull(j);
		ts_error_clear(&err);
		st = ts_rows_parse(j, "rows", 8, &rows, &n, &err);
		ck_assert_msg(st != TS_OK && st == err.status, "%s: %d", bad[i].json, st);
		ck_assert_msg(strcmp(err.reason, bad[i].reason) == 0, "%s: reason %s", bad[i].json,
		              err.reason);
		ck_assert_msg(strstr(err.message, bad[i].names), "%s: message %s", bad[i].json,
		              err.message);
		ck_assert_ptr_null(rows);
		json_decref(j);
	}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_rows_parse(NULL, "inputs.rows", 8, &rows, &n, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "inputs.rows"));
	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		json_t *j = json_loads(good[i].json, JSON_DECODE_ANY, NULL);

		ck_assert_ptr_nonnull(j);
		ts_error_clear(&err);
		ck_assert_msg(ts_rows_parse(j, "rows", 8, &rows, &n, &err) == TS_OK, "%s: %s",
		              good[i].json, err.message);
		ck_assert_ptr_nonnull(rows);
		ck_assert_uint_eq(n, good[i].n);
		for (size_t k = 0; k < n; k++)
			ck_assert_uint_eq(rows[k], good[i].rows[k]);
		free(rows);
		json_decref(j);
	}
	/* a slice selecting more rows than one call may take */
	{
		json_t *j = json_loads("{}", 0, NULL);

		ts_error_clear(&err);
		ck_assert_int_eq(ts_rows_parse(j, "rows", (uint64_t)TS_ROWS_MAX + 1, &rows, &n, &err),
		                 TS_INVALID_ARGUMENT);
		ck_assert_ptr_nonnull(strstr(err.message, "at most"));
		json_decref(j);
	}
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("index");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_table_matches_reference);
	tcase_add_test(tc, test_identity_forms_agree);
	tcase_add_test(tc, test_runs_merge);
	tcase_add_test(tc, test_errors_name_the_problem);
	tcase_add_test(tc, test_errors_metadata_and_limits);
	tcase_add_test(tc, test_random_matches_reference);
	tcase_add_test(tc, test_rows_normalize_and_merge);
	tcase_add_test(tc, test_rows_in_place_and_errors);
	tcase_add_test(tc, test_rows_random_cover_the_list);
	tcase_add_test(tc, test_rows_slice_python_semantics);
	tcase_add_test(tc, test_rows_parse_json_forms);
	tcase_add_test(tc, test_huge_parent_one_run);
	suite_add_tcase(s, tc);
	return s;
}
