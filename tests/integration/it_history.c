/*
 * it_history.c - Check suite "history": GET /v1/memory/history of a real
 * daemon. An upload held for a few seconds and then deleted is a spike in
 * its space's and its pool's series, the figures once settled equal
 * /metrics read at the same moment (pool use and limit, the device's h2d
 * bytes), node-wide pools are listed once, requests are counted; ?step=
 * chooses the ring, and bad ?since= or ?step= is a 400 naming the
 * parameter.
 *
 * Each test case runs in its own forked process with its own daemon.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The member of list whose key is value (borrowed), or NULL. */
static json_t *find(json_t *list, const char *key, const char *value, const char *key2,
                    const char *value2)
{
	size_t i;
	json_t *o;

	json_array_foreach(list, i, o) {
		const char *v = json_string_value(json_object_get(o, key));
		const char *v2 = key2 ? json_string_value(json_object_get(o, key2)) : NULL;

		if (v && strcmp(v, value) == 0 && (!key2 || (v2 && strcmp(v2, value2) == 0)))
			return o;
	}
	return NULL;
}

static uint64_t last_of(json_t *series)
{
	size_t n = json_array_size(series);

	ck_assert_uint_gt(n, 0);
	return (uint64_t)json_integer_value(json_array_get(series, n - 1));
}

static uint64_t last_time(json_t *h)
{
	return last_of(json_object_get(h, "times_unix_ms"));
}

/* GET /v1/memory/history?since=120 (new reference). */
static json_t *history(void)
{
	return th_get_object(&th_case_daemon, "/v1/memory/history?since=120");
}

/* Waits (at most 10 s) for a row taken after after_ms: the history then. */
static json_t *history_after(uint64_t after_ms)
{
	for (int i = 0; i < 100; i++) {
		json_t *h = history();

		if (json_array_size(json_object_get(h, "times_unix_ms")) &&
		    last_time(h) > after_ms)
			return h;
		json_decref(h);
		usleep(100000);
	}
	ck_abort_msg("no history row after %llu ms", (unsigned long long)after_ms);
	return NULL;
}

static double metric(const char *text, const char *name, const char *labels)
{
	double v = -1;

	ck_assert_msg(th_prom_find(text, name, labels, &v), "no %s{%s}", name, labels);
	return v;
}

START_TEST(test_upload_spike_is_in_the_history)
{
	const char *dev = th_dev(0);
	size_t n = 4u << 20;
	char *data = calloc(1, n), *pool = th_fmt("%s/device", dev);
	char *pool_labels = th_fmt("pool=\"%s\",memory_kind=\"device\",device=\"%s\"", pool, dev);
	char *h2d_labels = th_fmt("device=\"%s\",direction=\"h2d\"", dev);
	char *query = th_fmt("dtype=uint8&shape=%zu&device=%s&memory_kind=device", n, dev);
	struct th_response r = {0};
	json_t *h, *space, *p, *times, *use;
	uint64_t before, base, up_start, up_end, held_end, requests0, scraped;
	size_t rows, spike_rows = 0, after_rows = 0, before_rows = 0;
	char *text;

	ck_assert_ptr_nonnull(data);
	h = history_after(0);
	base = last_of(json_object_get(find(json_object_get(h, "pools"), "pool", pool, NULL,
	                                    NULL), "bytes_in_use"));
	requests0 = last_of(json_object_get(h, "http_requests_total"));
	json_decref(h);

	before = wall_ms();
	usleep(1200000);                      /* a row or more before the upload */
	up_start = wall_ms();
	th_put_array(&th_case_daemon, "spike", query, data, n);
	up_end = wall_ms();
	h = history_after(up_end);
	held_end = wall_ms();
	json_decref(h);
	th_request(&th_case_daemon, "DELETE", "/v1/arrays/spike", NULL, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	h = history_after(wall_ms() + 1000);   /* settled: a row a second after */

	/* the history read after /metrics equals it where nothing moves */
	scraped = wall_ms();
	th_get(&th_case_daemon, "/metrics", &r);
	text = r.body;
	json_decref(h);
	h = history_after(wall_ms());
	times = json_object_get(h, "times_unix_ms");
	rows = json_array_size(times);
	space = find(json_object_get(h, "spaces"), "device", dev, "memory_kind", "device");
	p = find(json_object_get(h, "pools"), "pool", pool, NULL, NULL);
	ck_assert_ptr_nonnull(space);
	ck_assert_ptr_nonnull(p);
	ck_assert_str_eq(json_string_value(json_object_get(space, "pool")), pool);
	ck_assert_uint_eq(last_of(json_object_get(p, "bytes_in_use")),
	                  (uint64_t)metric(text, "tstage_pool_in_use_bytes", pool_labels));
	ck_assert_uint_eq(last_of(json_object_get(p, "bytes_limit")),
	                  (uint64_t)metric(text, "tstage_pool_limit_bytes", pool_labels));
	ck_assert_uint_eq(last_of(json_object_get(find(json_object_get(h, "transfers"), "device",
	                                               dev, "direction", "h2d"),
	                                          "bytes_total")),
	                  (uint64_t)metric(text, "tstage_device_transfer_bytes_total", h2d_labels));
	ck_assert_uint_ge(last_of(json_object_get(h, "http_requests_total")), requests0 + 5);
	/* the sampler counts itself: every row taken before the scrape */
	{
		size_t taken = 0;

		for (size_t i = 0; i < rows; i++)
			taken += (uint64_t)json_integer_value(json_array_get(times, i)) < scraped;
		ck_assert_uint_ge(taken, 1);
		ck_assert_uint_ge(metric(text, "tstage_history_samples_total", ""), taken);
	}
	ck_assert(metric(text, "tstage_history_sampler_cpu_seconds_total", "") >= 0);

	/* before: base; while held: base + n, in the space and its pool; after: base */
	use = json_object_get(space, "bytes_in_use");
	ck_assert_uint_eq(json_array_size(use), rows);
	for (size_t i = 0; i < rows; i++) {
		uint64_t t = (uint64_t)json_integer_value(json_array_get(times, i));
		uint64_t v = (uint64_t)json_integer_value(json_array_get(use, i));
		uint64_t pv = (uint64_t)json_integer_value(
			json_array_get(json_object_get(p, "bytes_in_use"), i));

		ck_assert_uint_eq(v, pv);   /* the pool's one space on this device */
		if (t >= before && t < up_start) {
			ck_assert_uint_eq(v, base);
			before_rows++;
		} else if (t > up_end && t < held_end) {
			ck_assert_uint_eq(v, base + n);
			spike_rows++;
		} else if (i == rows - 1) {
			ck_assert_uint_eq(v, base);
			after_rows++;
		}
	}
	ck_assert_uint_ge(before_rows, 1);
	ck_assert_uint_ge(spike_rows, 1);
	ck_assert_uint_eq(after_rows, 1);
	/* node-wide host pools once, with no device */
	ck_assert_ptr_nonnull(find(json_object_get(h, "pools"), "pool", "host/pinned_host", NULL,
	                           NULL));
	{
		size_t i, pinned = 0;
		json_t *o;

		json_array_foreach(json_object_get(h, "pools"), i, o)
			if (strcmp(json_string_value(json_object_get(o, "memory_kind")),
			           "pinned_host") == 0) {
				pinned++;
				ck_assert_ptr_null(json_object_get(o, "device"));
			}
		ck_assert_uint_eq(pinned, 1);
	}
	ck_assert_int_eq(json_integer_value(json_object_get(h, "step_seconds")), 1);
	ck_assert_int_gt(json_integer_value(json_object_get(h, "memory_bytes")), 0);
	json_decref(h);
	th_response_free(&r);
	free(data);
	free(pool);
	free(pool_labels);
	free(h2d_labels);
	free(query);
}
END_TEST

static void expect_400(const char *path, const char *reason, const char *needle)
{
	struct th_response r = {0};
	json_t *j, *err;

	th_get(&th_case_daemon, path, &r);
	ck_assert_msg(r.status == 400, "%s: %ld", path, r.status);
	j = json_loads(r.body, 0, NULL);
	ck_assert_ptr_nonnull(j);
	err = json_object_get(j, "error");
	ck_assert_str_eq(json_string_value(json_object_get(err, "status")), "INVALID_ARGUMENT");
	ck_assert_msg(strstr(json_string_value(json_object_get(err, "message")), needle),
	              "%s: %s", path, r.body);
	ck_assert_msg(strstr(r.body, reason), "%s: %s", path, r.body);
	json_decref(j);
	th_response_free(&r);
}

START_TEST(test_parameters)
{
	json_t *h;
	char since[64];
	time_t now = time(NULL) - 30;
	struct tm tm;

	expect_400("/v1/memory/history?since=yesterday", "BAD_SINCE", "since 'yesterday'");
	expect_400("/v1/memory/history?since=2500-01-01T00:00:00Z", "BAD_SINCE", "future");
	expect_400("/v1/memory/history?step=0", "BAD_STEP", "step '0'");
	expect_400("/v1/memory/history?step=fast&since=10", "BAD_STEP", "step 'fast'");
	expect_400("/v1/memory/history?sinc=10", "", "sinc");

	h = th_get_object(&th_case_daemon, "/v1/memory/history?step=10s");
	ck_assert_int_eq(json_integer_value(json_object_get(h, "step_seconds")), 10);
	json_decref(h);
	h = th_get_object(&th_case_daemon, "/v1/memory/history?since=4h");
	ck_assert_int_eq(json_integer_value(json_object_get(h, "step_seconds")), 10);
	json_decref(h);
	gmtime_r(&now, &tm);
	strftime(since, sizeof since, "/v1/memory/history?since=%Y-%m-%dT%H:%M:%SZ", &tm);
	h = history_after(0);
	json_decref(h);
	h = th_get_object(&th_case_daemon, since);
	ck_assert_int_eq(json_integer_value(json_object_get(h, "step_seconds")), 1);
	ck_assert_uint_ge(json_array_size(json_object_get(h, "times_unix_ms")), 1);
	ck_assert_uint_ge((uint64_t)json_integer_value(
		                  json_array_get(json_object_get(h, "times_unix_ms"), 0)),
	                  (uint64_t)now * 1000);
	json_decref(h);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("history");
	TCase *tc = tcase_create("history");

	tcase_add_checked_fixture(tc, th_case_up, th_case_down);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_upload_spike_is_in_the_history);
	tcase_add_test(tc, test_parameters);
	suite_add_tcase(s, tc);
	return s;
}
