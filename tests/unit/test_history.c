/*
 * test_history.c - the history's rings (server/history.h): the finest ring
 * wraps keeping its newest rows in order; a coarser ring's rows are exactly
 * the largest gauge and the last counter of each whole step; reads start
 * at since; ?since= and ?step= choose the ring and the start or are refused
 * with the parameter named; RFC 3339 parsing; and the sampler thread
 * filling the rings while readers copy them, counting its samples and
 * their CPU time.
 */
#include <check.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server/history.h"
#include "tests/unit/unit.h"

#define NS 1000000000ull
#define T0 (1796300000ull * NS)   /* a whole multiple of 10 s */

static const enum ts_history_fold folds[2] = {TS_HISTORY_GAUGE, TS_HISTORY_COUNTER};

static struct ts_history *history_new(ts_history_sample_fn *fn, void *cls)
{
	struct ts_history *h = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_history_new(&(struct ts_history_config){.nseries = 2, .fold = folds,
	                                                          .sample = fn, .cls = cls,
	                                                          .interval_ms = 5},
	                             &h, &err) == TS_OK, "%s", err.message);
	return h;
}

static void read_ok(struct ts_history *h, int level, uint64_t since, struct ts_history_slice *s)
{
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_history_read(h, level, since, s, &err) == TS_OK, "%s", err.message);
}

/* Reads as read_ok does; the slice must hold rows rows. */
static void read_rows(struct ts_history *h, int level, uint64_t since, struct ts_history_slice *s,
                      size_t rows)
{
	read_ok(h, level, since, s);
	ck_assert_uint_eq(s->rows, rows);
}

/* Sample i: a gauge that rises and falls within each 10 s ((i * 7) % 10,
 * plus i, so each step's largest is not its last) and a counter 3 i. */
static uint64_t gauge_at(uint64_t i)
{
	return (i * 7) % 10 + i;
}

/* Row r of s is (t, gauge, counter). */
static void expect_row(const struct ts_history_slice *s, size_t r, uint64_t t, uint64_t gauge,
                       uint64_t counter)
{
	ck_assert_uint_eq(s->times_ns[r], t);
	ck_assert_uint_eq(s->values[r * 2], gauge);
	ck_assert_uint_eq(s->values[r * 2 + 1], counter);
}

static void feed(struct ts_history *h, uint64_t from, uint64_t to)
{
	for (uint64_t i = from; i < to; i++) {
		uint64_t v[2] = {gauge_at(i), 3 * i};

		ts_history_add(h, T0 + i * NS, v);
	}
}

START_TEST(test_memory_cost_is_fixed)
{
	struct ts_history *h = history_new(NULL, NULL);
	size_t rows = 0;

	for (int l = 0; l < TS_HISTORY_LEVELS; l++)
		rows += ts_history_levels[l].rows;
	ck_assert_uint_eq(ts_history_levels[0].step_s, 1);
	ck_assert_uint_eq(ts_history_levels[0].rows, 900);
	ck_assert_uint_eq(ts_history_bytes(h), rows * 3 * sizeof(uint64_t));
	feed(h, 0, 5000);
	ck_assert_uint_eq(ts_history_bytes(h), rows * 3 * sizeof(uint64_t));
	ts_history_free(h);
}
END_TEST

START_TEST(test_finest_ring_wraps_newest_first_kept)
{
	struct ts_history *h = history_new(NULL, NULL);
	uint32_t cap = ts_history_levels[0].rows;
	struct ts_history_slice s;

	feed(h, 0, 10);
	read_rows(h, 0, 0, &s, 10);
	ck_assert_uint_eq(s.times_ns[0], T0);
	ts_history_slice_release(&s);

	feed(h, 10, cap + 250);
	read_rows(h, 0, 0, &s, cap);
	for (size_t r = 0; r < s.rows; r++)
		expect_row(&s, r, T0 + (250 + r) * NS, gauge_at(250 + r), 3 * (250 + r));
	ts_history_slice_release(&s);
	ts_history_free(h);
}
END_TEST

START_TEST(test_coarse_rows_fold_exactly)
{
	struct ts_history *h = history_new(NULL, NULL);
	uint32_t step = ts_history_levels[1].step_s;
	struct ts_history_slice s;

	feed(h, 0, 10 * step + 3);   /* 10 whole steps, the 11th in progress */
	read_rows(h, 1, 0, &s, 10);
	ck_assert_uint_eq(s.step_s, step);
	for (size_t r = 0; r < s.rows; r++) {
		uint64_t max = 0, first = r * step, last = first + step - 1;

		for (uint64_t i = first; i <= last; i++)
			if (gauge_at(i) > max)
				max = gauge_at(i);
		expect_row(&s, r, T0 + last * NS, max, 3 * last);
		ck_assert_uint_ne(s.values[r * 2], gauge_at(last));   /* the largest, not the last */
	}
	ts_history_slice_release(&s);
	ts_history_free(h);
}
END_TEST

START_TEST(test_coarse_ring_wraps_and_skips_gaps)
{
	struct ts_history *h = history_new(NULL, NULL);
	uint32_t cap = ts_history_levels[1].rows;
	struct ts_history_slice s;
	uint64_t v[2] = {1, 1};

	/* a sample every 25 s (over 2 steps): each its own step's row, none for the steps between */
	for (uint64_t i = 0; i < cap + 8; i++)
		ts_history_add(h, T0 + i * 25 * NS, v);
	read_rows(h, 1, 0, &s, cap);
	ck_assert_uint_eq(s.times_ns[0], T0 + 7 * 25 * NS);
	ck_assert_uint_eq(s.times_ns[cap - 1], T0 + (cap + 6) * 25 * NS);
	ts_history_slice_release(&s);
	ts_history_free(h);
}
END_TEST

START_TEST(test_read_starts_at_since)
{
	struct ts_history *h = history_new(NULL, NULL);
	struct ts_history_slice s;

	feed(h, 0, 100);
	read_rows(h, 0, T0 + 60 * NS, &s, 40);
	ck_assert_uint_eq(s.times_ns[0], T0 + 60 * NS);
	ck_assert_uint_eq(s.values[1], 180);
	ts_history_slice_release(&s);
	read_rows(h, 0, T0 + 60 * NS + 1, &s, 39);
	ts_history_slice_release(&s);
	read_rows(h, 0, T0 + 1000 * NS, &s, 0);   /* after the newest: none */
	ts_history_slice_release(&s);
	ts_history_free(h);
}
END_TEST

static void parse_ok(const char *since, const char *step, uint64_t now,
                     struct ts_history_query *q)
{
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_history_query_parse(since, step, now, q, &err) == TS_OK,
	              "since=%s step=%s: %s", since, step, err.message);
}

static void parse_bad(const char *since, const char *step, const char *reason,
                      const char *needle)
{
	struct ts_history_query q;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_history_query_parse(since, step, T0, &q, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, reason);
	ck_assert_msg(strstr(err.message, needle), "'%s' lacks '%s'", err.message, needle);
}

#define ANY_LEVEL (-1)          /* a row that checks only since_ns */
#define ANY_SINCE UINT64_MAX    /* a row that checks only the level */

START_TEST(test_since_and_step_choose_the_ring)
{
	static const struct {
		const char *since, *step;
		uint64_t now;
		int level;
		uint64_t since_ns;
	} rows[] = {
		{NULL, NULL, T0, 0, T0 - 900 * NS},               /* the finest, whole */
		{"60", NULL, T0, 0, T0 - 60 * NS},
		{"15m", NULL, T0, 0, ANY_SINCE},                  /* the finest's span, just */
		{"901s", NULL, T0, 1, T0 - 901 * NS},             /* past it: the coarser */
		{"2.5h", NULL, T0, 1, T0 - 9000 * NS},
		{NULL, "10s", T0, 1, T0 - 10800 * NS},            /* step alone: that ring, whole */
		{"30", "2", T0, 1, T0 - 30 * NS},                 /* rounded up to a ring */
		{"4h", "1s", T0, 0, ANY_SINCE},                   /* step wins over span */
		{NULL, "1h", T0, 1, ANY_SINCE},                   /* coarser than any: the coarsest */
		{"2026-12-03T11:00:00Z", NULL, T0, 1, 1796295600ull * NS},   /* T0 is 12:13:20 */
		{"2026-12-03T12:10:00.25+00:00", NULL, T0, 0, 1796299800ull * NS + NS / 4},
		{"100000000", NULL, 5 * NS, ANY_LEVEL, 0},        /* before the epoch: from 0 */
	};

	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		struct ts_history_query q;

		parse_ok(rows[i].since, rows[i].step, rows[i].now, &q);
		if (rows[i].level != ANY_LEVEL)
			ck_assert_msg(q.level == rows[i].level, "row %zu: level %d, want %d", i,
			              q.level, rows[i].level);
		if (rows[i].since_ns != ANY_SINCE)
			ck_assert_msg(q.since_ns == rows[i].since_ns, "row %zu: since %llu, want %llu",
			              i, (unsigned long long)q.since_ns,
			              (unsigned long long)rows[i].since_ns);
	}
}
END_TEST

START_TEST(test_bad_since_and_step_are_named)
{
	parse_bad("yesterday", NULL, "BAD_SINCE", "since 'yesterday'");
	parse_bad("-5", NULL, "BAD_SINCE", "RFC 3339");
	parse_bad("", NULL, "BAD_SINCE", "since ''");
	parse_bad("5d", NULL, "BAD_SINCE", "seconds ago");
	parse_bad("2026-12-03T14:00:00", NULL, "BAD_SINCE", "since");     /* no offset */
	parse_bad("2026-02-30T14:00:00Z", NULL, "BAD_SINCE", "since");
	parse_bad("2027-01-01T00:00:00Z", NULL, "BAD_SINCE", "in the future");
	parse_bad(NULL, "0", "BAD_STEP", "step '0'");
	parse_bad(NULL, "fast", "BAD_STEP", "positive duration");
	parse_bad("10", "1x", "BAD_STEP", "step '1x'");
	parse_bad(NULL, "99999999999999999999", "BAD_STEP", "step");
}
END_TEST

START_TEST(test_rfc3339)
{
	uint64_t ns;

	ck_assert(ts_parse_rfc3339("1970-01-01T00:00:00Z", &ns));
	ck_assert_uint_eq(ns, 0);
	ck_assert(ts_parse_rfc3339("2000-02-29T12:34:56.789z", &ns));
	ck_assert_uint_eq(ns, 951827696ull * NS + 789000000ull);
	ck_assert(ts_parse_rfc3339("2026-12-03T16:00:00+02:00", &ns));
	ck_assert_uint_eq(ns, 1796306400ull * NS);
	ck_assert(ts_parse_rfc3339("2026-12-03 09:00:00.0000000001-05:00", &ns));
	ck_assert_uint_eq(ns, 1796306400ull * NS);
	ck_assert(!ts_parse_rfc3339("1900-02-29T00:00:00Z", &ns));   /* not a leap year */
	ck_assert(!ts_parse_rfc3339("1969-12-31T23:59:59Z", &ns));   /* before the epoch */
	ck_assert(!ts_parse_rfc3339("2026-12-03T24:00:00Z", &ns));
	ck_assert(!ts_parse_rfc3339("2026-12-03T12:00:00.Z", &ns));
	ck_assert(!ts_parse_rfc3339("2026-12-03T12:00:00+0200", &ns));
	ck_assert(!ts_parse_rfc3339("2026-12-03T12:00:00Zx", &ns));
	ck_assert(!ts_parse_rfc3339("2026-1-03T12:00:00Z", &ns));
}
END_TEST

/* The sampler: a source that counts its calls (gauge = counter = calls). */
struct source {
	_Atomic uint64_t calls;
};

static void count_sample(void *cls, uint64_t *v)
{
	struct source *src = cls;
	uint64_t n = atomic_fetch_add(&src->calls, 1) + 1;

	v[0] = n;
	v[1] = n;
}

START_TEST(test_sampler_fills_while_read)
{
	struct source src = {0};
	struct ts_history *h = history_new(count_sample, &src);
	struct ts_history_slice s;
	uint64_t seen = 0;

	/* every 5 ms; readers copy meanwhile, each copy in order */
	while (atomic_load(&src.calls) < 40) {
		read_ok(h, 0, 0, &s);
		for (size_t r = 1; r < s.rows; r++) {
			ck_assert_uint_eq(s.values[r * 2 + 1], s.values[(r - 1) * 2 + 1] + 1);
			ck_assert_uint_ge(s.times_ns[r], s.times_ns[r - 1]);
		}
		if (s.rows)
			seen = s.values[(s.rows - 1) * 2];
		ts_history_slice_release(&s);
		usleep(1000);
	}
	{
		uint64_t samples, cpu_ns;

		ts_history_sampler_stats(h, &samples, &cpu_ns);
		ck_assert_uint_ge(samples, 39);   /* each call recorded, the last maybe not yet */
		ck_assert_uint_le(samples, atomic_load(&src.calls));
		ck_assert_uint_gt(cpu_ns, 0);
	}
	ts_history_free(h);   /* stops the thread: no sample after */
	ck_assert_uint_gt(seen, 0);
	seen = atomic_load(&src.calls);
	usleep(20000);
	ck_assert_uint_eq(atomic_load(&src.calls), seen);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("history");
	TCase *rings = tcase_create("rings"), *query = tcase_create("query");
	TCase *sampler = tcase_create("sampler");

	tcase_add_test(rings, test_memory_cost_is_fixed);
	tcase_add_test(rings, test_finest_ring_wraps_newest_first_kept);
	tcase_add_test(rings, test_coarse_rows_fold_exactly);
	tcase_add_test(rings, test_coarse_ring_wraps_and_skips_gaps);
	tcase_add_test(rings, test_read_starts_at_since);
	tcase_add_test(query, test_since_and_step_choose_the_ring);
	tcase_add_test(query, test_bad_since_and_step_are_named);
	tcase_add_test(query, test_rfc3339);
	tcase_add_test(sampler, test_sampler_fills_while_read);
	suite_add_tcase(s, rings);
	suite_add_tcase(s, query);
	suite_add_tcase(s, sampler);
	return s;
}
