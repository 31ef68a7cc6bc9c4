/*
 * test_trace.c - the trace recorder (common/trace.h): nothing is recorded
 * while off; the buffer holds at most max_events and counts what it drops,
 * and the answer says so; one recording at a time, ended only by its
 * generation; the answer is Chrome Trace Event JSON with names, spans cut
 * at the start, counters from the sampler, and flows only from a thread
 * that runs an operation.
 */
#include <check.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/trace.h"
#include "common/units.h"
#include "tests/unit/unit.h"

static struct ts_trace *trace_new(size_t max, ts_trace_sample_fn *fn, void *cls)
{
	struct ts_trace *t = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_trace_new(&(struct ts_trace_config){.max_events = max, .sample = fn,
	                                                     .cls = cls, .period_ns = 1000000},
	                           &t, &err) == TS_OK, "%s", err.message);
	return t;
}

static json_t *finish(struct ts_trace *t, uint64_t gen)
{
	char *text = NULL;
	size_t len = 0;
	json_error_t jerr;
	json_t *j;

	ck_assert(ts_trace_finish(t, gen, &text, &len));
	ck_assert_ptr_nonnull(text);
	ck_assert_uint_eq(strlen(text), len);
	j = json_loads(text, 0, &jerr);
	ck_assert_msg(j != NULL, "%s: %s", jerr.text, text);
	free(text);
	return j;
}

static size_t count_ph(json_t *j, const char *ph)
{
	json_t *evs = json_object_get(j, "traceEvents"), *e;
	size_t i, n = 0;

	json_array_foreach(evs, i, e)
		if (strcmp(json_string_value(json_object_get(e, "ph")), ph) == 0)
			n++;
	return n;
}

START_TEST(test_off_records_nothing)
{
	struct ts_trace *t = trace_new(16, NULL, NULL);
	uint64_t rec, drop, gen;
	json_t *j;

	ck_assert(!ts_trace_on(t));
	ck_assert(!ts_trace_on(NULL));
	ts_trace_span(t, 0, 1, "c", "before", NULL, 1, 2, 0, 0);
	ts_trace_counter(t, 0, "x", 1, 1);
	gen = ts_trace_begin(t, &(struct ts_error){0});
	ck_assert_uint_gt(gen, 0);
	ck_assert(ts_trace_on(t));
	j = finish(t, gen);
	ck_assert(!ts_trace_on(t));
	ts_trace_span(t, 0, 1, "c", "after", NULL, 1, 2, 0, 0);
	ts_trace_counts(t, &rec, &drop);
	ck_assert_uint_eq(rec, 0);
	ck_assert_uint_eq(drop, 0);
	ck_assert_uint_eq(json_array_size(json_object_get(j, "traceEvents")), 0);
	json_decref(j);
	ts_trace_free(t);
}
END_TEST

START_TEST(test_bounded_and_drops_counted)
{
	struct ts_trace *t = trace_new(10000, NULL, NULL);   /* two chunks, the second part full */
	uint64_t gen = ts_trace_begin(t, &(struct ts_error){0}), rec, drop, now = ts_now_ns();
	json_t *j, *md;

	for (int i = 0; i < 10250; i++)
		ts_trace_span(t, 0, 1, "c", "s", NULL, now, now + 10, 0, (uint64_t)i + 1);
	ts_trace_counts(t, &rec, &drop);
	ck_assert_uint_eq(rec, 10000);
	ck_assert_uint_eq(drop, 250);
	j = finish(t, gen);
	md = json_object_get(j, "metadata");
	ck_assert_int_eq(json_integer_value(json_object_get(md, "events")), 10000);
	ck_assert_int_eq(json_integer_value(json_object_get(md, "dropped_events")), 250);
	ck_assert_int_eq(json_integer_value(json_object_get(md, "max_events")), 10000);
	ck_assert_uint_eq(count_ph(j, "X"), 10000);
	/* the first 10000 are kept, in order */
	ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(
	                     json_array_get(json_object_get(j, "traceEvents"), 9999), "args"),
	                     "bytes")), 10000);
	json_decref(j);

	/* the next recording starts empty */
	gen = ts_trace_begin(t, &(struct ts_error){0});
	ts_trace_span(t, 0, 1, "c", "s", NULL, now, now, 0, 0);
	ts_trace_counts(t, &rec, &drop);
	ck_assert_uint_eq(rec, 1);
	ck_assert_uint_eq(drop, 0);
	ts_trace_free(t);    /* ends it */
}
END_TEST

START_TEST(test_one_at_a_time)
{
	struct ts_trace *t = trace_new(16, NULL, NULL);
	struct ts_error err;
	uint64_t gen = ts_trace_begin(t, &(struct ts_error){0}), gen2;

	ts_error_clear(&err);
	ck_assert_uint_eq(ts_trace_begin(t, &err), 0);
	ck_assert_int_eq(err.status, TS_ABORTED);
	ck_assert_ptr_nonnull(strstr(err.message, "already"));
	ck_assert(!ts_trace_finish(t, gen + 1, NULL, NULL));
	ck_assert(ts_trace_on(t));
	ck_assert(ts_trace_finish(t, gen, NULL, NULL));
	ck_assert(!ts_trace_finish(t, gen, NULL, NULL));   /* already ended */
	gen2 = ts_trace_begin(t, &(struct ts_error){0});
	ck_assert_uint_gt(gen2, gen);
	ck_assert(!ts_trace_finish(t, gen, NULL, NULL));   /* an old owner cannot end it */
	ck_assert(ts_trace_on(t));
	ck_assert(ts_trace_finish(t, gen2, NULL, NULL));
	ts_trace_free(t);
}
END_TEST

static void sample(void *cls, struct ts_trace *t, uint64_t now)
{
	_Atomic int *calls = cls;

	ts_trace_counter(t, 1, "sim:0/device", now, (uint64_t)atomic_fetch_add(calls, 1) * 100);
}

START_TEST(test_answer_shape)
{
	_Atomic int calls = 0;
	struct ts_trace *t = trace_new(1000, sample, &calls);
	uint64_t before = ts_now_ns(), gen, flow;
	json_t *j, *evs, *e;
	size_t i;
	int flows_s = 0, flows_f = 0, spans = 0;

	usleep(1000);
	gen = ts_trace_begin(t, &(struct ts_error){0});
	ts_trace_name_process(t, 1, "sim:0");
	ts_trace_name_track(t, 1, 2, "h2d 2");
	ts_trace_name_track(t, 1, 2, "other");   /* the first name wins */
	ck_assert_uint_eq(ts_trace_flow_start(t), 0);   /* no operation on this thread */
	ts_trace_op_enter(7);
	flow = ts_trace_flow_start(t);
	ts_trace_op_leave();
	ck_assert_uint_gt(flow, 0);
	ts_trace_span(t, 1, 2, "copy", "h2d", NULL, ts_now_ns(), ts_now_ns() + 5000, 0, 64);
	ts_trace_flow_end(t, 1, 2, flow, ts_now_ns());
	ts_trace_span(t, 0, 9, "op", NULL, "a-name-longer-than-forty-seven-bytes-is-cut-there-ok",
	              before, ts_now_ns(), 7, 0);  /* began before: cut at the start */
	usleep(20000);
	j = finish(t, gen);
	ck_assert_int_gt(atomic_load(&calls), 2);
	ck_assert_str_eq(json_string_value(json_object_get(j, "displayTimeUnit")), "ms");
	evs = json_object_get(j, "traceEvents");
	json_array_foreach(evs, i, e) {
		const char *ph = json_string_value(json_object_get(e, "ph"));

		ck_assert_ptr_nonnull(ph);
		ck_assert(json_is_integer(json_object_get(e, "pid")));
		ck_assert(json_is_integer(json_object_get(e, "tid")));
		ck_assert(json_is_string(json_object_get(e, "name")));
		ck_assert(json_number_value(json_object_get(e, "ts")) >= 0);
		if (strcmp(ph, "X") == 0) {
			spans++;
			ck_assert(json_number_value(json_object_get(e, "dur")) >= 0);
			if (json_object_get(json_object_get(e, "args"), "op")) {
				ck_assert_int_eq(json_number_value(json_object_get(e, "ts")), 0);
				ck_assert_int_eq(strlen(json_string_value(json_object_get(e, "name"))),
				                 TS_TRACE_NAME_MAX - 1);
			}
		} else if (strcmp(ph, "s") == 0) {
			flows_s++;
			ck_assert_int_eq(json_integer_value(json_object_get(e, "id")), (json_int_t)flow);
		} else if (strcmp(ph, "f") == 0) {
			flows_f++;
			ck_assert_str_eq(json_string_value(json_object_get(e, "bp")), "e");
		} else if (strcmp(ph, "M") == 0) {
			const char *v = json_string_value(json_object_get(json_object_get(e, "args"),
			                                                  "name"));
			ck_assert(strcmp(v, "sim:0") == 0 || strcmp(v, "h2d 2") == 0);
		}
	}
	ck_assert_int_eq(spans, 2);
	ck_assert_int_eq(flows_s, 1);
	ck_assert_int_eq(flows_f, 1);
	ck_assert_uint_eq(count_ph(j, "M"), 2);
	ck_assert_uint_gt(count_ph(j, "C"), 2);
	json_decref(j);
	ts_trace_free(t);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("trace");
	TCase *buffer = tcase_create("buffer"), *answer = tcase_create("answer");

	tcase_add_test(buffer, test_off_records_nothing);
	tcase_add_test(buffer, test_bounded_and_drops_counted);
	tcase_add_test(buffer, test_one_at_a_time);
	tcase_add_test(answer, test_answer_shape);
	suite_add_tcase(s, buffer);
	suite_add_tcase(s, answer);
	return s;
}
