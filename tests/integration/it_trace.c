/*
 * it_trace.c - Check suite "trace": GET /v1/trace of a real daemon. While a
 * trace records, an array is uploaded to a device's pinned_host memory,
 * :put to its device memory, and a model takes a step; the answer is Chrome
 * Trace Event JSON whose every event has the fields its phase needs, whose
 * spans lie inside the trace, whose device copy of the move sits on the
 * device's copy track with a flow from the :put operation, whose counters
 * show the upload, and whose step shows its operation and its GEMMs on the
 * step's compute track (on CUDA timed by events around them). The step's memory timeline (POST
 * :analyze?timeline=true) places every device temp at its planned offset. Bad ?seconds= is a 400 naming it; a second trace while one
 * records is refused.
 *
 * Each test case runs in its own forked process with its own daemon.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A trace requested on a thread of its own while the test works. */
struct tracer {
	pthread_t thread;
	struct th_client client;
	char path[64];
	struct th_response r;
	bool answered;
};

static void *tracer_main(void *arg)
{
	struct tracer *t = arg;

	t->answered = th_client_request(&t->client, "GET", t->path, NULL, NULL, 0, &t->r);
	return NULL;
}

static void tracer_start(struct tracer *t, int seconds)
{
	memset(t, 0, sizeof *t);
	th_client_open(&t->client, &th_case_daemon);
	snprintf(t->path, sizeof t->path, "/v1/trace?seconds=%d", seconds);
	ck_assert_int_eq(pthread_create(&t->thread, NULL, tracer_main, t), 0);
	usleep(300 * 1000);    /* the trace has begun */
}

/* Joins the tracer: its answer, parsed (borrowed from t->r). */
static json_t *tracer_join(struct tracer *t)
{
	pthread_join(t->thread, NULL);
	th_client_close(&t->client);
	ck_assert_msg(t->answered, "no answer to the trace: %s", t->client.error);
	ck_assert_msg(t->r.status == 200, "trace: %ld %s", t->r.status, t->r.body);
	return th_json(&t->r);
}

static double num(json_t *e, const char *key)
{
	json_t *v = json_object_get(e, key);

	ck_assert_msg(json_is_number(v), "event without a number '%s'", key);
	return json_number_value(v);
}

/* The name metadata ("process_name" or "thread_name") of (pid, tid), or NULL. */
static const char *name_of(json_t *evs, const char *what, json_int_t pid, json_int_t tid)
{
	size_t i;
	json_t *e;

	json_array_foreach(evs, i, e)
		if (strcmp(th_str(e, "ph"), "M") == 0 && strcmp(th_str(e, "name"), what) == 0 &&
		    th_int(e, "pid") == pid && (tid < 0 || th_int(e, "tid") == tid))
			return th_str(th_obj(e, "args"), "name");
	return NULL;
}

/* Every event has what its phase needs and lies inside the trace. */
static void check_fields(json_t *trace)
{
	json_t *evs = th_arr(trace, "traceEvents"), *e;
	double span = (double)th_int(th_obj(trace, "metadata"), "duration_us");
	size_t i;

	ck_assert_str_eq(th_str(trace, "displayTimeUnit"), "ms");
	ck_assert_int_eq(th_int(th_obj(trace, "metadata"), "dropped_events"), 0);
	ck_assert_int_le(th_int(th_obj(trace, "metadata"), "events"),
	                 th_int(th_obj(trace, "metadata"), "max_events"));
	json_array_foreach(evs, i, e) {
		const char *ph = th_str(e, "ph");

		ck_assert_int_eq(strlen(ph), 1);
		ck_assert_ptr_nonnull(strchr("XCMsf", ph[0]));
		th_int(e, "pid");
		th_int(e, "tid");
		ck_assert(th_str(e, "name")[0]);
		ck_assert_msg(num(e, "ts") >= 0 && num(e, "ts") <= span + 1, "ts %f of %f",
		              num(e, "ts"), span);
		if (ph[0] == 'X') {
			ck_assert(num(e, "dur") >= 0);
			ck_assert_msg(num(e, "ts") + num(e, "dur") <= span + 1, "span past the end");
			th_str(e, "cat");
		} else if (ph[0] == 'C') {
			th_int(th_obj(e, "args"), "bytes");
		} else if (ph[0] == 's' || ph[0] == 'f') {
			ck_assert_int_gt(th_int(e, "id"), 0);
		} else {
			th_str(th_obj(e, "args"), "name");
		}
	}
}

/* The X event of cat whose name starts with prefix, on pid (any when < 0). */
static json_t *find_span(json_t *evs, json_int_t pid, const char *cat, const char *prefix)
{
	size_t i;
	json_t *e;

	json_array_foreach(evs, i, e)
		if (strcmp(th_str(e, "ph"), "X") == 0 && (pid < 0 || th_int(e, "pid") == pid) &&
		    strcmp(th_str(e, "cat"), cat) == 0 &&
		    strncmp(th_str(e, "name"), prefix, strlen(prefix)) == 0)
			return e;
	return NULL;
}

static json_t *find_flow(json_t *evs, const char *ph, json_int_t id)
{
	size_t i;
	json_t *e;

	json_array_foreach(evs, i, e)
		if (strcmp(th_str(e, "ph"), ph) == 0 && th_int(e, "id") == id)
			return e;
	return NULL;
}

static bool inside(json_t *point, json_t *span)
{
	return th_int(point, "pid") == th_int(span, "pid") &&
	       th_int(point, "tid") == th_int(span, "tid") && num(point, "ts") >= num(span, "ts") &&
	       num(point, "ts") <= num(span, "ts") + num(span, "dur");
}

/* The largest rise of a counter of pid, in time order: from *low, the
 * lowest value before *top (a transient at the trace's start, such as an
 * earlier upload's staging, does not hide a rise after it). */
static void counter_range(json_t *evs, json_int_t pid, const char *name, json_int_t *low,
                          json_int_t *top)
{
	size_t i;
	json_t *e;
	json_int_t min = -1;

	*low = *top = -1;
	json_array_foreach(evs, i, e)
		if (strcmp(th_str(e, "ph"), "C") == 0 && th_int(e, "pid") == pid &&
		    strcmp(th_str(e, "name"), name) == 0) {
			json_int_t v = th_int(th_obj(e, "args"), "bytes");

			if (min < 0 || v < min)
				min = v;
			if (*top < 0 || v - min > *top - *low) {
				*low = min;
				*top = v;
			}
		}
	ck_assert_msg(*low >= 0, "no counter '%s' of process %lld", name, (long long)pid);
}

#define NBYTES (1u << 20)

START_TEST(test_trace_shows_the_work)
{
	struct tracer t;
	float *x = th_floats(NBYTES / 4, 3, -1.0f, 1.0f);
	float *bx = th_floats(16 * 32, 5, -1.0f, 1.0f);
	char *q = th_fmt("dtype=float32&shape=%u&device=%s&memory_kind=pinned_host", NBYTES / 4,
	                 th_dev(0));
	json_t *trace, *evs, *e, *copy = NULL, *put_op, *s, *f, *res;
	json_int_t pid = -1, low, top;
	size_t i;

	json_decref(th_post_json(&th_case_daemon, "/v1/models?wait=true",
	                         "{\"name\": \"m\", \"mlp\": {\"layers\": 2, \"d_model\": 32, "
	                         "\"d_hidden\": 64, \"activation\": \"relu\"}, \"loss\": \"sum\", "
	                         "\"init\": {\"seed\": 1, \"scale\": 0.05}}", 200));
	th_put_floats(&th_case_daemon, "bx", bx, 16, 32, NULL);
	tracer_start(&t, 3);
	th_put_array(&th_case_daemon, "a", q, x, NBYTES);
	usleep(200 * 1000);    /* the sampler (every 10 ms) sees it in pinned_host */
	json_decref(th_post_json(&th_case_daemon, "/v1/arrays/a:put?wait=true",
	                         "{\"memory_kind\": \"device\"}", 200));
	res = th_model_step(&th_case_daemon, "m", "{\"inputs\": \"bx\", \"steps\": 1}");
	json_decref(res);
	trace = tracer_join(&t);
	check_fields(trace);
	evs = th_arr(trace, "traceEvents");

	/* the device is a process; the move's copy is on one of its copy tracks */
	json_array_foreach(evs, i, e)
		if (strcmp(th_str(e, "ph"), "M") == 0 && strcmp(th_str(e, "name"), "process_name") == 0 &&
		    strcmp(th_str(th_obj(e, "args"), "name"), th_dev(0)) == 0)
			pid = th_int(e, "pid");
	ck_assert_msg(pid > 0, "no process named %s", th_dev(0));
	json_array_foreach(evs, i, e)
		if (strcmp(th_str(e, "ph"), "X") == 0 && th_int(e, "pid") == pid &&
		    strcmp(th_str(e, "cat"), "copy") == 0 && strcmp(th_str(e, "name"), "H2D") == 0 &&
		    json_object_get(th_obj(e, "args"), "bytes") &&
		    th_int(th_obj(e, "args"), "bytes") == NBYTES && !copy)
			copy = e;
	ck_assert_msg(copy, "no H2D copy of %u bytes on %s", NBYTES, th_dev(0));
	ck_assert_msg(name_of(evs, "thread_name", pid, th_int(copy, "tid")), "copy track unnamed");
	ck_assert_ptr_nonnull(strstr(name_of(evs, "thread_name", pid, th_int(copy, "tid")), "copy"));

	/* a flow from the :put operation's span to the copy */
	put_op = find_span(evs, 0, "operation", "put a");
	ck_assert_msg(put_op, "no span of the :put operation");
	f = NULL;
	json_array_foreach(evs, i, e)
		if (strcmp(th_str(e, "ph"), "f") == 0 && inside(e, copy))
			f = e;
	ck_assert_msg(f, "no flow ends in the copy");
	ck_assert_str_eq(th_str(f, "bp"), "e");
	s = find_flow(evs, "s", th_int(f, "id"));
	ck_assert_msg(s && inside(s, put_op), "the copy's flow does not start in the :put");
	ck_assert_int_eq(th_int(th_obj(s, "args"), "op"), th_int(th_obj(put_op, "args"), "op"));
	ck_assert(find_span(evs, 0, "http", "PUT /v1/arrays/{array} 201"));

	/* the device's counters show the upload to pinned_host, then the move */
	counter_range(evs, pid, "pinned_host bytes_in_use", &low, &top);
	ck_assert_msg(top >= low + NBYTES, "pinned_host rises from %lld to %lld at most",
	              (long long)low, (long long)top);
	counter_range(evs, pid, "device bytes_in_use", &low, &top);
	ck_assert_msg(top >= low + NBYTES, "device rises from %lld to %lld at most",
	              (long long)low, (long long)top);

	/* the step: its operation, and its compute on the step's compute queue */
	ck_assert_msg(find_span(evs, 0, "operation", "step m"), "no span of the step");
	e = find_span(evs, pid, "compute", "gemm");
	ck_assert_msg(e, "no gemm span on %s", th_dev(0));
	ck_assert_ptr_nonnull(strstr(name_of(evs, "thread_name", pid, th_int(e, "tid")), "compute"));
	ck_assert_msg(find_span(evs, pid, "compute", "act_fwd") &&
	              find_span(evs, pid, "compute", "loss"), "no act_fwd or loss span on %s",
	              th_dev(0));
	/* the compute track's spans follow one another, as its work does */
	{
		json_int_t tid = th_int(e, "tid");
		double prev_end = -1;
		json_t *sp;

		json_array_foreach(evs, i, sp)
			if (strcmp(th_str(sp, "ph"), "X") == 0 && th_int(sp, "pid") == pid &&
			    th_int(sp, "tid") == tid) {
				ck_assert_msg(num(sp, "ts") >= prev_end - 0.001,
				              "%s at %.3f starts before the span before it ends (%.3f)",
				              th_str(sp, "name"), num(sp, "ts"), prev_end);
				prev_end = num(sp, "ts") + num(sp, "dur");
			}
	}
	th_response_free(&t.r);
	free(q);
	free(x);
	free(bx);
}
END_TEST

START_TEST(test_bad_seconds_are_named)
{
	static const char *const bad[] = {"0", "61", "-1", "abc", "", "5s", "1e1"};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct th_response r;
		char *path = th_fmt("/v1/trace?seconds=%s", bad[i]);

		th_get(&th_case_daemon, path, &r);
		th_expect_error(&r, path, 400, "INVALID_ARGUMENT", "BAD_TRACE_SECONDS", "seconds",
		                "1..60");
		free(path);
	}
}
END_TEST

START_TEST(test_one_trace_at_a_time)
{
	struct tracer t;
	struct th_response r;
	json_t *trace;

	tracer_start(&t, 2);
	th_get(&th_case_daemon, "/v1/trace?seconds=1", &r);
	th_expect_error(&r, "a second trace", 409, "ABORTED", "TRACE_RUNNING", "one at a time",
	                NULL);
	trace = tracer_join(&t);
	ck_assert_int_ge(th_int(th_obj(trace, "metadata"), "duration_us"), 2000000);
	th_response_free(&t.r);
	/* once it is answered, the next may record */
	th_get(&th_case_daemon, "/v1/trace?seconds=1", &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	check_fields(th_json(&r));
	th_response_free(&r);
}
END_TEST

/* The memory timeline of a step (POST :analyze?timeline=true): every
 * device temp's allocation and free at its planned offset; the temps live
 * at once never overlap, lie inside the arena, and the live bytes after
 * each allocation reach its end. */
START_TEST(test_step_timeline_has_temp_offsets)
{
	json_t *an = th_post_json(&th_case_daemon, "/v1/models:analyze?timeline=true",
	                          "{\"model\": {\"mlp\": {\"layers\": 3, \"d_model\": 32, "
	                          "\"d_hidden\": 64}, \"optimizer\": {\"type\": \"adam\"}}, "
	                          "\"batch\": [16, 32]}", 200);
	json_t *tl = th_arr(an, "timeline"), *e;
	json_int_t temp = th_int(an, "temp_size_in_bytes"), peak = th_int(an, "peak_device_bytes");
	json_int_t base = peak - temp, top = 0, live_max = 0;
	enum { MAXB = 512 };
	json_int_t off[MAXB], len[MAXB];
	int state[MAXB] = {0};    /* 0 never, 1 live, 2 freed */
	size_t i;
	int allocs = 0, frees = 0;

	ck_assert_uint_gt(json_array_size(tl), 0);
	json_array_foreach(tl, i, e) {
		const char *ev = th_str(e, "event");
		json_int_t b = th_int(e, "buffer");

		ck_assert(b >= 0 && b < MAXB);
		if (strcmp(ev, "alloc") == 0) {
			ck_assert_msg(state[b] == 0, "temp %lld allocated twice", (long long)b);
			off[b] = th_int(e, "offset");
			len[b] = th_int(e, "bytes");
			ck_assert(off[b] >= 0 && len[b] > 0 && off[b] + len[b] <= temp);
			for (int j = 0; j < MAXB; j++)
				ck_assert_msg(state[j] != 1 || off[j] + len[j] <= off[b] ||
				              off[b] + len[b] <= off[j],
				              "temps %d and %lld overlap", j, (long long)b);
			state[b] = 1;
			ck_assert_int_ge(th_int(e, "live_device_bytes"), base + off[b] + len[b]);
			if (off[b] + len[b] > top)
				top = off[b] + len[b];
			allocs++;
		} else {
			ck_assert_str_eq(ev, "free");
			ck_assert_msg(state[b] == 1, "temp %lld freed while not live", (long long)b);
			ck_assert_int_eq(th_int(e, "offset"), off[b]);
			state[b] = 2;
			frees++;
		}
		if (th_int(e, "live_device_bytes") > live_max)
			live_max = th_int(e, "live_device_bytes");
	}
	ck_assert_int_gt(allocs, 0);
	ck_assert_int_le(frees, allocs);
	ck_assert_int_eq(live_max, peak);
	ck_assert_int_le(top, temp);
	json_decref(an);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("trace");
	TCase *tc = tcase_create("trace");

	tcase_add_checked_fixture(tc, th_case_up, th_case_down);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_trace_shows_the_work);
	tcase_add_test(tc, test_bad_seconds_are_named);
	tcase_add_test(tc, test_one_trace_at_a_time);
	tcase_add_test(tc, test_step_timeline_has_temp_offsets);
	suite_add_tcase(s, tc);
	return s;
}
