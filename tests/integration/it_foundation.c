/*
 * it_foundation.c - Check suite "foundation": tstaged's first endpoints
 * against a real daemon: health, metrics, backends, devices, memory, the
 * HTTP pipeline's errors (404, 405, body limits, request ids), token
 * authentication, the command line and environment, request logging and
 * graceful shutdown.
 *
 * Each test case runs in its own forked process with its own daemon (a
 * checked fixture, or started by the test when it needs other flags), so
 * counters start from zero and a crash stays in its case. What depends on
 * the backend (TS_TEST_BACKEND) is computed by expected_devices(): with sim,
 * exactly sim:0, sim:1, cpu:0.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1u << 20)

static const char *const jax_keys[] = {
	"bytes_in_use", "peak_bytes_in_use", "num_allocs", "largest_alloc_size",
	"bytes_limit", "bytes_reserved", "peak_bytes_reserved", "largest_free_block_bytes",
};
#define NJAX (sizeof jax_keys / sizeof jax_keys[0])

static const char *const kinds[] = {"device", "pinned_host", "unpinned_host"};

/* The daemon of the checked fixture (per forked test case). */
static struct th_daemon D;

static void daemon_up(void)
{
	th_daemon_start(&D, NULL);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* ---- helpers ------------------------------------------------------------------ */

struct expected {
	int n;
	char ids[16][32];
	const char *default_backend;
};

/* The devices the default run must list, in order. */
static void expected_devices(struct th_daemon *d, struct expected *e)
{
	memset(e, 0, sizeof *e);
	if (th_backend_is_sim()) {
		snprintf(e->ids[e->n++], sizeof e->ids[0], "sim:0");
		snprintf(e->ids[e->n++], sizeof e->ids[0], "sim:1");
		e->default_backend = "sim";
	} else {
		struct th_response r;
		json_t *list = th_arr(th_get_json(d, "/v1/backends", &r), "backends");
		json_int_t ncuda = th_int(json_array_get(list, 0), "device_count");

		ck_assert_msg(ncuda >= 1, "TS_TEST_BACKEND=cuda but no cuda device: %s", r.body);
		for (json_int_t i = 0; i < ncuda && e->n < 15; i++)
			snprintf(e->ids[e->n++], sizeof e->ids[0], "cuda:%lld", (long long)i);
		e->default_backend = "cuda";
		th_response_free(&r);
	}
	snprintf(e->ids[e->n++], sizeof e->ids[0], "cpu:0");
}

/* Whether the daemon was built with CUDA, from tstage_build_info. */
static bool built_with_cuda(struct th_daemon *d)
{
	struct th_response r;
	struct th_prom_sample *s;
	int n;
	bool cuda = false, found = false;

	th_get(d, "/metrics", &r);
	ck_assert_int_eq(r.status, 200);
	s = th_prom_samples(r.body, &n);
	for (int i = 0; i < n; i++) {
		if (strcmp(s[i].name, "tstage_build_info") == 0) {
			const char *c = th_prom_label(&s[i], "cuda");

			ck_assert_msg(c && (strcmp(c, "true") == 0 || strcmp(c, "false") == 0),
			              "tstage_build_info has no cuda=\"true|false\" label");
			cuda = strcmp(c, "true") == 0;
			found = true;
		}
	}
	free(s);
	th_response_free(&r);
	ck_assert_msg(found, "tstage_build_info missing");
	return cuda;
}

/* The value of a metric sample (0 when absent). */
static double metric(struct th_daemon *d, const char *name, const char *labels)
{
	struct th_response r;
	double v = 0;

	th_get(d, "/metrics", &r);
	ck_assert_int_eq(r.status, 200);
	if (!th_prom_find(r.body, name, labels, &v))
		v = 0;
	th_response_free(&r);
	return v;
}

static void assert_jax_stats(json_t *stats)
{
	for (size_t i = 0; i < NJAX; i++) {
		json_int_t v = th_int(stats, jax_keys[i]);

		ck_assert_msg(v >= 0, "%s is negative", jax_keys[i]);
	}
	ck_assert(th_int(stats, "bytes_in_use") <= th_int(stats, "bytes_limit"));
	ck_assert(th_int(stats, "peak_bytes_in_use") >= th_int(stats, "bytes_in_use"));
}

static const char *backend_of(const char *id)
{
	if (strncmp(id, "sim:", 4) == 0)
		return "sim";
	if (strncmp(id, "cuda:", 5) == 0)
		return "cuda";
	return "cpu";
}

/* A backends entry by name. */
static json_t *backend_entry(json_t *root, const char *name)
{
	json_t *list = th_arr(root, "backends"), *b;
	size_t i;

	json_array_foreach(list, i, b)
		if (strcmp(th_str(b, "name"), name) == 0)
			return b;
	ck_abort_msg("backend '%s' not listed", name);
	return NULL;
}

/* Whether text holds a line that is a JSON object with msg "request" and the
 * given request_id; checks that line's keys. */
static bool find_request_log(const char *text, const char *request_id)
{
	const char *p = text;

	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);
		json_error_t e;
		json_t *j = json_loadb(p, len, 0, &e);
		bool hit = false;

		ck_assert_msg(j && json_is_object(j), "log line is not a JSON object: %.*s",
		              (int)len, p);
		th_str(j, "ts");
		th_str(j, "level");
		th_str(j, "msg");
		if (strcmp(th_str(j, "msg"), "request") == 0 &&
		    json_object_get(j, "request_id") &&
		    strcmp(th_str(j, "request_id"), request_id) == 0) {
			ck_assert_str_eq(th_str(j, "level"), "info");
			ck_assert_int_eq(th_int(j, "status"), 200);
			ck_assert_str_eq(th_str(j, "method"), "GET");
			ck_assert_str_eq(th_str(j, "path"), "/v1/devices");
			hit = true;
		}
		json_decref(j);
		if (hit)
			return true;
		if (!nl)
			break;
		p = nl + 1;
	}
	return false;
}

/* ---- health ----------------------------------------------------------------------- */

START_TEST(test_health_endpoints)
{
	static const char *const paths[] = {"/livez", "/healthz", "/readyz"};
	struct th_response r;

	for (size_t i = 0; i < 3; i++) {
		th_get(&D, paths[i], &r);
		ck_assert_msg(r.status == 200, "GET %s: %ld", paths[i], r.status);
		ck_assert_ptr_nonnull(th_header(&r, "X-Request-Id"));
		ck_assert_ptr_nonnull(strstr(th_header(&r, "Content-Type"), "text/plain"));
		ck_assert_msg(r.body_len > 0, "GET %s: empty body", paths[i]);
		th_response_free(&r);
	}
	th_request(&D, "HEAD", "/livez", NULL, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(r.body_len, 0);
	th_response_free(&r);
}
END_TEST

/* ---- metrics ---------------------------------------------------------------------- */

START_TEST(test_metrics_exposition)
{
	struct th_response r;
	char dev0[32], labels[192], why[300];
	const char *ct;
	double v = -1;
	int n;

	th_get(&D, "/metrics", &r);
	ck_assert_int_eq(r.status, 200);
	ct = th_header(&r, "Content-Type");
	ck_assert_msg(ct && strncmp(ct, "text/plain; version=0.0.4", 25) == 0,
	              "Content-Type '%s'", ct ? ct : "(none)");
	n = th_prom_validate(r.body, why, sizeof why);
	ck_assert_msg(n > 0, "exposition invalid at %s", why);
	ck_assert_ptr_nonnull(strstr(r.body, "\ntstage_build_info{"));
	ck_assert_ptr_nonnull(strstr(r.body, "# TYPE tstage_build_info gauge\n"));
	th_device_id(0, dev0, sizeof dev0);
	snprintf(labels, sizeof labels, "device=\"%s\",memory_kind=\"device\",pool=\"%s/device\"",
	         dev0, dev0);
	ck_assert_msg(th_prom_find(r.body, "tstage_memory_in_use_bytes", labels, &v),
	              "tstage_memory_in_use_bytes{%s} missing", labels);
	ck_assert(v == 0);
	if (th_backend_is_sim()) {
		snprintf(labels, sizeof labels,
		         "pool=\"%s/device\",memory_kind=\"device\",device=\"%s\"", dev0, dev0);
		ck_assert(th_prom_find(r.body, "tstage_pool_limit_bytes", labels, &v));
		ck_assert(v == (double)TH_SIM_MEMORY);
	}
	ck_assert(th_prom_find(r.body, "tstage_memory_in_use_bytes",
	                       "memory_kind=\"pinned_host\",device=\"cpu:0\","
	                       "pool=\"host/pinned_host\"", &v));
	th_response_free(&r);
}
END_TEST

START_TEST(test_metrics_count_requests)
{
	const char *sel = "method=\"GET\",route=\"/v1/devices\",code=\"200\"";
	const char *unmatched = "method=\"other\",route=\"unmatched\",code=\"404\"";
	struct th_response r;
	double before = metric(&D, "tstage_http_requests_total", sel), after = 0;
	long long deadline;

	ck_assert(before == 0);
	for (int i = 0; i < 5; i++) {
		th_get(&D, "/v1/devices", &r);
		ck_assert_int_eq(r.status, 200);
		th_response_free(&r);
	}
	/* a request is counted when its response is done; allow a moment */
	deadline = th_now_ms() + 2000;
	while ((after = metric(&D, "tstage_http_requests_total", sel)) < 5 &&
	       th_now_ms() < deadline)
		usleep(10000);
	ck_assert_msg(after == 5, "counted %g GET /v1/devices, want 5", after);

	th_get(&D, "/no/such/thing", &r);
	ck_assert_int_eq(r.status, 404);
	th_response_free(&r);
	deadline = th_now_ms() + 2000;
	while (metric(&D, "tstage_http_requests_total", unmatched) < 1 &&
	       th_now_ms() < deadline)
		usleep(10000);
	ck_assert(metric(&D, "tstage_http_requests_total", unmatched) == 1);
}
END_TEST

START_TEST(test_metrics_histogram)
{
	struct th_response r;
	struct th_prom_sample *s;
	int n, counts = 0;

	for (int i = 0; i < 3; i++) {
		th_get(&D, "/v1/memory", &r);
		th_response_free(&r);
		th_get(&D, "/livez", &r);
		th_response_free(&r);
	}
	th_get(&D, "/metrics", &r);
	s = th_prom_samples(r.body, &n);
	for (int i = 0; i < n; i++) {
		const char *route;
		double inf = -1, sum = -1, prev = 0, prev_le = -INFINITY;
		bool saw_inf = false;

		if (strcmp(s[i].name, "tstage_http_request_duration_seconds_count") != 0)
			continue;
		counts++;
		route = th_prom_label(&s[i], "route");
		ck_assert_ptr_nonnull(route);
		for (int j = 0; j < n; j++) {
			const char *rt = th_prom_label(&s[j], "route"), *le;

			if (!rt || strcmp(rt, route) != 0)
				continue;
			if (strcmp(s[j].name, "tstage_http_request_duration_seconds_sum") == 0)
				sum = s[j].value;
			if (strcmp(s[j].name, "tstage_http_request_duration_seconds_bucket") != 0)
				continue;
			le = th_prom_label(&s[j], "le");
			ck_assert_ptr_nonnull(le);
			ck_assert_msg(strtod(le, NULL) > prev_le, "le=%s out of order (%s)", le, route);
			ck_assert_msg(s[j].value >= prev, "bucket le=%s of %s decreases", le, route);
			prev_le = strtod(le, NULL);
			prev = s[j].value;
			if (strcmp(le, "+Inf") == 0) {
				inf = s[j].value;
				saw_inf = true;
			}
		}
		ck_assert_msg(saw_inf, "no +Inf bucket for %s", route);
		ck_assert_msg(inf == s[i].value, "%s: +Inf bucket %g != _count %g", route, inf,
		              s[i].value);
		ck_assert_msg(sum >= 0, "%s: _sum missing or negative", route);
	}
	ck_assert_msg(counts >= 2, "only %d histograms", counts);
	ck_assert(th_prom_find(r.body, "tstage_http_request_duration_seconds_count",
	                       "method=\"GET\",route=\"/v1/memory\"", NULL));
	free(s);
	th_response_free(&r);
}
END_TEST

/* ---- backends ---------------------------------------------------------------------- */

/* Checks the backends answer of a run on the default backend. */
static void check_backends(json_t *root, bool cuda_built, int sim_count,
                           const char *default_backend)
{
	static const char *const names[] = {"cuda", "sim", "cpu"};
	json_t *list = th_arr(root, "backends"), *b;
	size_t i;
	int defaults = 0;

	ck_assert_str_eq(th_str(root, "default_backend"), default_backend);
	ck_assert_int_eq(json_array_size(list), 3);
	json_array_foreach(list, i, b) {
		ck_assert_str_eq(th_str(b, "name"), names[i]);
		th_str(b, "detail");
		if (th_bool(b, "available"))
			ck_assert(th_int(b, "device_count") > 0);
		else
			ck_assert_int_eq(th_int(b, "device_count"), 0);
		if (th_bool(b, "default")) {
			defaults++;
			ck_assert_str_eq(th_str(b, "name"), default_backend);
		}
	}
	ck_assert_int_eq(defaults, 1);
	b = backend_entry(root, "cuda");
	ck_assert_msg(th_bool(b, "compiled") == cuda_built, "cuda compiled %d, build_info says %d",
	              th_bool(b, "compiled"), cuda_built);
	if (th_bool(b, "compiled") && !th_bool(b, "available"))
		ck_assert_msg(th_str(b, "detail")[0] != '\0', "cuda unavailable without a detail");
	if (!th_bool(b, "compiled"))
		ck_assert(!th_bool(b, "available"));
	b = backend_entry(root, "sim");
	ck_assert(th_bool(b, "compiled"));
	ck_assert_int_eq(th_int(b, "device_count"), sim_count);
	ck_assert(th_bool(b, "available") == (sim_count > 0));
	b = backend_entry(root, "cpu");
	ck_assert(th_bool(b, "compiled"));
	ck_assert(th_bool(b, "available"));
	ck_assert_int_eq(th_int(b, "device_count"), 1);
}

START_TEST(test_backends)
{
	struct th_response r;
	json_t *root;
	bool cuda = built_with_cuda(&D);

	root = th_get_json(&D, "/v1/backends", &r);
	if (th_backend_is_sim()) {
		check_backends(root, cuda, 2, "sim");
	} else {
		ck_assert(cuda);
		ck_assert(th_bool(backend_entry(root, "cuda"), "available"));
		check_backends(root, cuda, 0, "cuda");
	}
	th_response_free(&r);
}
END_TEST

/* Without --no-cuda: a CUDA build tries the driver; where there is none the
 * cuda entry says why and sim stays the default. */
START_TEST(test_backends_cuda_discovery)
{
	static const char *const args[] = {"--sim-devices", "2", "--sim-device-memory",
	                                   TH_SIM_MEMORY_ARG, NULL};
	struct th_start how = {.args = args, .no_backend_args = true};
	struct th_daemon d;
	struct th_response r;
	json_t *root, *cuda;
	bool built;

	th_daemon_start_ex(&d, &how);
	built = built_with_cuda(&d);
	root = th_get_json(&d, "/v1/backends", &r);
	cuda = backend_entry(root, "cuda");
	if (th_bool(cuda, "available")) {
		ck_assert(built);
		check_backends(root, built, 2, "cuda");
	} else {
		check_backends(root, built, 2, "sim");
		if (built)
			ck_assert_msg(th_str(cuda, "detail")[0], "no detail for an unavailable cuda");
	}
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- devices ------------------------------------------------------------------------ */

static void check_device(json_t *dev, const char *id)
{
	json_t *mems = th_arr(dev, "memories"), *m;
	const char *name = th_str(dev, "name");
	size_t i;

	ck_assert_str_eq(th_str(dev, "id"), id);
	ck_assert_str_eq(th_str(dev, "backend"), backend_of(id));
	ck_assert_int_eq(th_int(dev, "ordinal"), atoi(strchr(id, ':') + 1));
	ck_assert(name[0] != '\0');
	th_str(dev, "host");
	ck_assert(!th_bool(dev, "broken"));
	ck_assert(th_int(dev, "total_memory_bytes") > 0);
	if (strcmp(backend_of(id), "sim") == 0) {
		ck_assert(th_bool(dev, "simulated"));
		ck_assert_msg(!strstr(name, "NVIDIA"), "sim device named '%s'", name);
		ck_assert_int_eq(th_int(dev, "total_memory_bytes"), TH_SIM_MEMORY);
	} else {
		ck_assert(!th_bool(dev, "simulated"));
	}
	if (strcmp(backend_of(id), "cuda") == 0) {
		th_str(dev, "compute_capability");
		th_str(dev, "pci_bus_id");
	}
	ck_assert_int_eq(json_array_size(mems), 3);
	json_array_foreach(mems, i, m) {
		json_t *stats = th_obj(m, "stats");

		ck_assert_str_eq(th_str(m, "kind"), kinds[i]);
		assert_jax_stats(stats);
		if (i == 0 && strcmp(backend_of(id), "sim") == 0)
			ck_assert_int_eq(th_int(stats, "bytes_limit"), TH_SIM_MEMORY);
	}
}

START_TEST(test_devices_list)
{
	struct th_response r;
	struct expected e;
	json_t *root, *list, *dev;
	size_t i;
	int defaults = 0;

	expected_devices(&D, &e);
	root = th_get_json(&D, "/v1/devices", &r);
	list = th_arr(root, "devices");
	ck_assert_int_eq(json_array_size(list), e.n);
	json_array_foreach(list, i, dev) {
		check_device(dev, e.ids[i]);
		if (th_bool(dev, "default")) {
			defaults++;
			ck_assert_str_eq(th_str(dev, "id"), e.ids[0]);
		}
	}
	ck_assert_int_eq(defaults, 1);
	ck_assert_str_eq(th_str(root, "default_device"), e.ids[0]);
	ck_assert_str_eq(th_str(root, "default_backend"), e.default_backend);
	th_response_free(&r);
}
END_TEST

START_TEST(test_device_get)
{
	struct th_response r;
	struct expected e;
	char path[96];
	json_t *dev;

	expected_devices(&D, &e);
	/* the second device (sim:1), or cpu:0 on a one-GPU machine */
	snprintf(path, sizeof path, "/v1/devices/%s", e.ids[1]);
	dev = th_get_json(&D, path, &r);
	check_device(dev, e.ids[1]);
	ck_assert(!th_bool(dev, "default"));
	th_response_free(&r);

	snprintf(path, sizeof path, "/v1/devices/%s", e.ids[0]);
	dev = th_get_json(&D, path, &r);
	ck_assert(th_bool(dev, "default"));
	th_response_free(&r);
}
END_TEST

START_TEST(test_device_not_found)
{
	struct th_response r;
	char path[400];

	th_get(&D, "/v1/devices/nope", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "DEVICE_NOT_FOUND");
	ck_assert_ptr_nonnull(strstr(th_str(th_obj(r.json, "error"), "message"), "nope"));
	th_response_free(&r);

	th_get(&D, "/v1/devices/sim:9/memory_stats", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "DEVICE_NOT_FOUND");
	th_response_free(&r);

	/* a segment too long for a parameter is a bad id, not a missing route */
	snprintf(path, sizeof path, "/v1/devices/%0300d", 0);
	th_get(&D, path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_DEVICE_ID");
	th_response_free(&r);
}
END_TEST

START_TEST(test_memory_stats)
{
	struct th_response r;
	char dev0[32], path[128];
	json_t *st;

	th_device_id(0, dev0, sizeof dev0);
	snprintf(path, sizeof path, "/v1/devices/%s/memory_stats", dev0);
	st = th_get_json(&D, path, &r);
	assert_jax_stats(st);
	if (th_backend_is_sim())
		ck_assert_int_eq(th_int(st, "bytes_limit"), TH_SIM_MEMORY);
	th_response_free(&r);

	snprintf(path, sizeof path, "/v1/devices/%s/memory_stats?memory_kind=pinned_host", dev0);
	st = th_get_json(&D, path, &r);
	assert_jax_stats(st);
	th_response_free(&r);

	st = th_get_json(&D, "/v1/devices/cpu:0/memory_stats?memory_kind=unpinned_host", &r);
	assert_jax_stats(st);
	th_response_free(&r);

	snprintf(path, sizeof path, "/v1/devices/%s/memory_stats?memory_kind=bogus", dev0);
	th_get(&D, path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_MEMORY_KIND");
	th_response_free(&r);
}
END_TEST

START_TEST(test_memory_view)
{
	struct th_response r;
	struct expected e;
	json_t *root, *spaces, *sp;
	size_t i;

	expected_devices(&D, &e);
	root = th_get_json(&D, "/v1/memory", &r);
	spaces = th_arr(root, "spaces");
	ck_assert_int_eq(json_array_size(spaces), (size_t)e.n * 3);
	json_array_foreach(spaces, i, sp) {
		const char *id = e.ids[i / 3];

		/* ordered by device, then memory kind */
		ck_assert_str_eq(th_str(sp, "device"), id);
		ck_assert_str_eq(th_str(sp, "memory_kind"), kinds[i % 3]);
		ck_assert_str_eq(th_str(sp, "backend"), backend_of(id));
		assert_jax_stats(sp);
		th_int(sp, "bytes_free");
		th_int(sp, "live_allocations");
	}
	th_str(root, "host");
	ck_assert(json_is_number(json_object_get(root, "uptime_seconds")));
	ck_assert(th_int(root, "timestamp_ms") > 0);
	th_response_free(&r);
}
END_TEST

START_TEST(test_reset_peak)
{
	static const char *const json_ct[] = {"Content-Type: application/json", NULL};
	struct th_response r;

	th_request(&D, "POST", "/v1/memory:resetPeak", NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "status %ld: %s", r.status, r.body);
	th_arr(th_json(&r), "spaces");
	th_response_free(&r);

	th_request(&D, "POST", "/v1/memory:resetPeak", json_ct, "{}", 2, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
}
END_TEST

/* ---- the HTTP pipeline --------------------------------------------------------------- */

START_TEST(test_unknown_path)
{
	static const char *const paths[] = {"/", "/v2/devices", "/v1/devices/sim:0/nothing",
	                                    "/v1/nothing?x=1", "/livez/"};
	struct th_response r;

	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		th_get(&D, paths[i], &r);
		th_assert_error(&r, 404, "NOT_FOUND", "ROUTE_NOT_FOUND");
		ck_assert_ptr_nonnull(th_header(&r, "X-Request-Id"));
		th_response_free(&r);
	}
}
END_TEST

START_TEST(test_wrong_method)
{
	static const struct {
		const char *method, *path, *allow;
	} cases[] = {
		{"DELETE", "/v1/devices", "GET"},
		{"POST", "/livez", "GET"},
		{"PUT", "/metrics", "GET"},
		{"GET", "/v1/memory:resetPeak", "POST"},
		{"DELETE", "/v1/devices/sim:0", "GET"},
	};
	struct th_response r;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *allow;

		th_request(&D, cases[i].method, cases[i].path, NULL, NULL, 0, &r);
		/* 405 is no 501: the body does not say UNIMPLEMENTED */
		th_assert_error(&r, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED");
		allow = th_header(&r, "Allow");
		ck_assert_msg(allow && strstr(allow, cases[i].allow), "%s %s: Allow '%s', want %s",
		              cases[i].method, cases[i].path, allow ? allow : "(none)",
		              cases[i].allow);
		ck_assert_ptr_nonnull(th_header(&r, "X-Request-Id"));
		th_response_free(&r);
	}
}
END_TEST

START_TEST(test_request_id)
{
	static const char *const given[] = {"X-Request-Id: it-abc.DEF_123", NULL};
	static const char *const bad[] = {"X-Request-Id: has space?", NULL};
	struct th_response r;
	char first[128];

	th_get(&D, "/livez", &r);
	ck_assert_ptr_nonnull(th_header(&r, "X-Request-Id"));
	ck_assert(th_header(&r, "X-Request-Id")[0] != '\0');
	snprintf(first, sizeof first, "%s", th_header(&r, "X-Request-Id"));
	th_response_free(&r);
	th_get(&D, "/livez", &r);
	ck_assert_str_ne(th_header(&r, "X-Request-Id"), first);
	th_response_free(&r);

	th_request(&D, "GET", "/v1/devices", given, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_str_eq(th_header(&r, "X-Request-Id"), "it-abc.DEF_123");
	th_response_free(&r);

	th_request(&D, "GET", "/nowhere", given, NULL, 0, &r);
	ck_assert_int_eq(r.status, 404);
	ck_assert_str_eq(th_header(&r, "X-Request-Id"), "it-abc.DEF_123");
	th_response_free(&r);

	th_request(&D, "GET", "/livez", bad, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_ptr_nonnull(th_header(&r, "X-Request-Id"));
	ck_assert_str_ne(th_header(&r, "X-Request-Id"), "has space?");
	th_response_free(&r);
}
END_TEST

static char *json_body(size_t len)
{
	char *b = malloc(len + 1);

	ck_assert_ptr_nonnull(b);
	memset(b, ' ', len);
	b[0] = '{';
	b[len - 1] = '}';
	b[len] = '\0';
	return b;
}

START_TEST(test_body_too_large)
{
	static const char *const plain[] = {"Content-Type: application/json",
	                                    "Expect: 100-continue", NULL};
	static const char *const chunked[] = {"Content-Type: application/json",
	                                      "Transfer-Encoding: chunked", NULL};
	struct th_response r;
	char *big = json_body(MiB + 1), *max = json_body(MiB);

	th_request(&D, "POST", "/v1/memory:resetPeak", plain, big, MiB + 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BODY_TOO_LARGE");
	th_response_free(&r);

	th_request(&D, "POST", "/v1/memory:resetPeak", chunked, big, MiB + 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BODY_TOO_LARGE");
	th_response_free(&r);

	/* exactly the limit is fine */
	th_request(&D, "POST", "/v1/memory:resetPeak", plain, max, MiB, &r);
	ck_assert_msg(r.status == 200, "1 MiB body: %ld %s", r.status, r.body);
	th_response_free(&r);
	th_request(&D, "POST", "/v1/memory:resetPeak", chunked, max, MiB, &r);
	ck_assert_msg(r.status == 200, "1 MiB chunked body: %ld %s", r.status, r.body);
	th_response_free(&r);

	th_get(&D, "/livez", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	free(big);
	free(max);
}
END_TEST

/* ---- authentication --------------------------------------------------------------------- */

#define TOKEN "0123456789abcdefghijABCDEFGHIJxy"   /* 32 characters */

START_TEST(test_token_auth)
{
	static const char *const right[] = {"Authorization: Bearer " TOKEN, NULL};
	static const char *const wrong[] = {"Authorization: Bearer " "0123456789abcdefghijABCDEFGHIJxz",
	                                    NULL};
	static const char *const prefix[] = {"Authorization: Bearer " "0123456789abcdef", NULL};
	static const char *const longer[] = {"Authorization: Bearer " TOKEN "0", NULL};
	static const char *const basic[] = {"Authorization: Basic " TOKEN, NULL};
	static const char *const *const refused[] = {NULL, wrong, prefix, longer, basic};
	static const char *const public_paths[] = {"/livez", "/healthz", "/readyz", "/metrics"};
	char file[512];
	const char *args[] = {"--token-file", NULL, NULL};
	struct th_daemon d;
	struct th_response r;

	args[1] = th_write_temp("token", TOKEN "\n", file, sizeof file);
	th_daemon_start(&d, args);
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		th_request(&d, "GET", "/v1/devices", refused[i], NULL, 0, &r);
		th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
		ck_assert_ptr_nonnull(th_header(&r, "WWW-Authenticate"));
		ck_assert_ptr_nonnull(th_header(&r, "X-Request-Id"));
		th_response_free(&r);
	}
	th_request(&d, "POST", "/v1/memory:resetPeak", NULL, NULL, 0, &r);
	th_assert_error(&r, 401, "UNAUTHENTICATED", NULL);
	th_response_free(&r);

	th_request(&d, "GET", "/v1/devices", right, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	th_request(&d, "POST", "/v1/memory:resetPeak", right, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);

	for (size_t i = 0; i < sizeof public_paths / sizeof public_paths[0]; i++) {
		th_get(&d, public_paths[i], &r);
		ck_assert_msg(r.status == 200, "GET %s without a token: %ld", public_paths[i],
		              r.status);
		th_response_free(&r);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

/* Authentication comes before routing: without the token, a wrong method
 * or an unknown path under a protected prefix is 401 (not 405 with an
 * Allow list, nor 404); a public path's wrong method is still 405. The
 * Bearer scheme is case-insensitive (RFC 9110 11.1), with one or more
 * spaces before the token. */
START_TEST(test_token_before_routing)
{
	static const char *const lower[] = {"Authorization: bearer " TOKEN, NULL};
	static const char *const upper[] = {"Authorization: BEARER  " TOKEN, NULL};
	static const char *const glued[] = {"Authorization: Bearer" TOKEN, NULL};
	static const char *const probes[][2] = {
		{"OPTIONS", "/v1/arrays"}, {"PATCH", "/v1/arrays/x"}, {"GET", "/v1/nothing"},
		{"GET", "/nothing"},       {"DELETE", "/dashboard"},
	};
	char file[512];
	const char *args[] = {"--token-file", NULL, NULL};
	struct th_daemon d;
	struct th_response r;

	args[1] = th_write_temp("token", TOKEN "\n", file, sizeof file);
	th_daemon_start(&d, args);
	for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
		th_request(&d, probes[i][0], probes[i][1], NULL, NULL, 0, &r);
		th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
		ck_assert_msg(!th_header(&r, "Allow"), "%s %s: an Allow list without a token",
		              probes[i][0], probes[i][1]);
		th_response_free(&r);
	}
	th_request(&d, "POST", "/livez", NULL, NULL, 0, &r);
	th_assert_error(&r, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED");
	th_response_free(&r);
	th_request(&d, "OPTIONS", "/v1/arrays", lower, NULL, 0, &r);
	th_assert_error(&r, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED");
	th_response_free(&r);
	th_request(&d, "GET", "/v1/devices", lower, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	th_request(&d, "GET", "/v1/devices", upper, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	th_request(&d, "GET", "/v1/devices", glued, NULL, 0, &r);
	th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

/* HTTP Basic with the token as the password (what a browser sends after
 * the prompt /dashboard's 401 raises) is the token too; the page and the
 * API description are behind it, the challenge on the page is Basic. */
START_TEST(test_token_basic)
{
	/* base64 of "tstage:" TOKEN, of ":" TOKEN, of "tstage:" + a wrong one,
	 * of the token alone (no colon) */
	static const char *const user[] = {
		"Authorization: Basic dHN0YWdlOjAxMjM0NTY3ODlhYmNkZWZnaGlqQUJDREVGR0hJSnh5", NULL};
	static const char *const nouser[] = {
		"Authorization: Basic OjAxMjM0NTY3ODlhYmNkZWZnaGlqQUJDREVGR0hJSnh5", NULL};
	static const char *const wrong[] = {
		"Authorization: Basic dHN0YWdlOjAxMjM0NTY3ODlhYmNkZWZnaGlqQUJDREVGR0hJSnh6", NULL};
	static const char *const nocolon[] = {
		"Authorization: Basic MDEyMzQ1Njc4OWFiY2RlZmdoaWpBQkNERUZHSElKeHk=", NULL};
	static const char *const notb64[] = {"Authorization: Basic ***", NULL};
	static const char *const paths[] = {"/v1/devices", "/dashboard", "/openapi.yaml"};
	char file[512];
	const char *args[] = {"--token-file", NULL, NULL};
	struct th_daemon d;
	struct th_response r;

	args[1] = th_write_temp("token", TOKEN "\n", file, sizeof file);
	th_daemon_start(&d, args);
	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		th_request(&d, "GET", paths[i], user, NULL, 0, &r);
		ck_assert_msg(r.status == 200, "%s with Basic: %ld", paths[i], r.status);
		th_response_free(&r);
		th_request(&d, "GET", paths[i], nouser, NULL, 0, &r);
		ck_assert_msg(r.status == 200, "%s with Basic, no user: %ld", paths[i], r.status);
		th_response_free(&r);
		th_request(&d, "GET", paths[i], wrong, NULL, 0, &r);
		th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
		th_response_free(&r);
		th_request(&d, "GET", paths[i], nocolon, NULL, 0, &r);
		th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
		th_response_free(&r);
		th_request(&d, "GET", paths[i], notb64, NULL, 0, &r);
		th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
		th_response_free(&r);
		th_get(&d, paths[i], &r);
		th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
		ck_assert_str_eq(th_header(&r, "WWW-Authenticate"),
		                 strcmp(paths[i], "/dashboard") == 0
		                     ? "Basic realm=\"tstage\", charset=\"UTF-8\""
		                     : "Bearer realm=\"tstage\"");
		th_response_free(&r);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

/* The message of r's error, and its "scheme" metadata (NULL when none). */
static const char *auth_refusal(struct th_response *r, const char **scheme)
{
	json_t *info = json_array_get(th_arr(th_obj(th_json(r), "error"), "details"), 0);
	json_t *sch = json_object_get(th_obj(info, "metadata"), "scheme");

	*scheme = sch ? json_string_value(sch) : NULL;
	return th_str(th_obj(th_json(r), "error"), "message");
}

/* Both schemes the daemon takes are matched in any case (RFC 9110 11.1:
 * "basic" and "BASIC" as "Basic", which libmicrohttpd's own parser would
 * refuse); every refusal is a JSON 401 with a challenge whose message says
 * what was wrong - an unknown scheme, a scheme without credentials, Basic
 * credentials that are not base64 or not "user:password", a wrong token -
 * and names the scheme given, never echoing the credentials. */
START_TEST(test_token_scheme_any_case)
{
	/* base64 of "u:" TOKEN, of "u:" + a wrong one, of the token (no colon) */
	static const char *const ok[] = {
		"Authorization: basic dTowMTIzNDU2Nzg5YWJjZGVmZ2hpakFCQ0RFRkdISUp4eQ==",
		"Authorization: BASIC dTowMTIzNDU2Nzg5YWJjZGVmZ2hpakFCQ0RFRkdISUp4eQ",
		"Authorization: bAsIc   dTowMTIzNDU2Nzg5YWJjZGVmZ2hpakFCQ0RFRkdISUp4eQ==",
		"Authorization: bEaReR " TOKEN,
	};
	static const struct {
		const char *header, *says, *scheme, *challenge;
	} refused[] = {
		{"Authorization: Digest username=\"u\"", "scheme is not one the daemon takes",
		 "Digest", "Bearer realm=\"tstage\""},
		{"Authorization: Token " TOKEN, "scheme is not one the daemon takes", "Token",
		 "Bearer realm=\"tstage\""},
		{"Authorization: Bearer", "carries no token", "Bearer", "Bearer realm=\"tstage\""},
		{"Authorization: basic", "carries no credentials", "basic", "Bearer realm=\"tstage\""},
		{"Authorization: basic ***", "not base64", "basic", "Bearer realm=\"tstage\""},
		{"Authorization: Basic MDEyMzQ1Njc4OWFiY2RlZmdoaWpBQkNERUZHSElKeHk=",
		 "not 'user:password'", "Basic", "Bearer realm=\"tstage\""},
		{"Authorization: BASIC dTowMTIzNDU2Nzg5YWJjZGVmZ2hpakFCQ0RFRkdISUp4eg==",
		 "Basic password is not the daemon's token", "BASIC", "Bearer realm=\"tstage\""},
		{"Authorization: bearer 0123456789abcdefghijABCDEFGHIJxz",
		 "Bearer token is not the daemon's token", "bearer",
		 "Bearer realm=\"tstage\", error=\"invalid_token\""},
		{"Authorization: BEARER" TOKEN, "no space after 'Bearer'", "BEARER",
		 "Bearer realm=\"tstage\""},
		{"Authorization: " TOKEN, "no scheme (Bearer or Basic) before its credentials", NULL,
		 "Bearer realm=\"tstage\""},
		{NULL, "no Authorization header", NULL, "Bearer realm=\"tstage\""},
	};
	char file[512];
	const char *args[] = {"--token-file", NULL, NULL};
	struct th_daemon d;
	struct th_response r;

	args[1] = th_write_temp("token", TOKEN "\n", file, sizeof file);
	th_daemon_start(&d, args);
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		const char *hdr[] = {ok[i], NULL};

		th_request(&d, "GET", "/v1/devices", hdr, NULL, 0, &r);
		ck_assert_msg(r.status == 200, "'%s': %ld", ok[i], r.status);
		th_response_free(&r);
	}
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		const char *hdr[] = {refused[i].header, NULL}, *scheme, *msg;

		th_request(&d, "GET", "/v1/devices", refused[i].header ? hdr : NULL, NULL, 0, &r);
		th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
		msg = auth_refusal(&r, &scheme);
		ck_assert_msg(strstr(msg, refused[i].says), "'%s': '%s'", refused[i].header, msg);
		ck_assert_msg(!strstr(msg, TOKEN) && !strstr(msg, "dTow"), "echoed: '%s'", msg);
		if (refused[i].scheme)
			ck_assert_str_eq(scheme, refused[i].scheme);
		else
			ck_assert_ptr_null(scheme);
		ck_assert_str_eq(th_header(&r, "WWW-Authenticate"), refused[i].challenge);
		th_response_free(&r);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_token_file_bad)
{
	char file[512];
	const char *args[] = {"--port", "0", "--sim-devices", "1", "--no-cuda",
	                      "--token-file", NULL, NULL};
	struct th_run_result res;

	args[6] = th_write_temp("short-token", "short\n", file, sizeof file);
	th_run(args, NULL, 10000, &res);
	ck_assert_msg(res.status == 1, "short token: exit %d", res.status);
	ck_assert_ptr_nonnull(strstr(res.err, "16"));
	th_run_free(&res);

	args[6] = "/nonexistent/tstage/token";
	th_run(args, NULL, 10000, &res);
	ck_assert_msg(res.status == 1, "missing token file: exit %d", res.status);
	ck_assert_ptr_nonnull(strstr(res.err, "/nonexistent/tstage/token"));
	th_run_free(&res);
}
END_TEST

/* ---- the command line ---------------------------------------------------------------------- */

START_TEST(test_insecure_bind_refused)
{
	char pf[512];
	const char *args[] = {"--bind", "0.0.0.0", "--port", "0", "--port-file", NULL,
	                      "--sim-devices", "1", "--no-cuda", NULL};
	struct th_run_result res;

	args[5] = th_write_temp("refused-port", "", pf, sizeof pf);
	unlink(pf);
	th_run(args, NULL, 10000, &res);
	ck_assert_msg(res.status != 0 && res.status < 128, "exit %d: %s", res.status, res.err);
	ck_assert_msg(strstr(res.err, "--insecure") != NULL, "stderr does not name --insecure: %s",
	              res.err);
	ck_assert_msg(access(pf, F_OK) != 0, "it wrote a port file: it listened");
	th_run_free(&res);
}
END_TEST

START_TEST(test_insecure_bind_allowed)
{
	static const char *const args[] = {"--bind", "0.0.0.0", "--insecure", NULL};
	struct th_daemon d;
	struct th_response r;

	th_daemon_start(&d, args);
	th_get(&d, "/livez", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_help_and_version)
{
	static const char *const help[] = {"--help", NULL};
	static const char *const version[] = {"--version", NULL};
	struct th_run_result res;

	th_run(help, NULL, 10000, &res);
	ck_assert_int_eq(res.status, 0);
	ck_assert_ptr_nonnull(strstr(res.out, "--sim-devices"));
	ck_assert_ptr_nonnull(strstr(res.out, "--port-file"));
	ck_assert_ptr_nonnull(strstr(res.out, "TSTAGE_SIM_DEVICES"));
	th_run_free(&res);

	th_run(version, NULL, 10000, &res);
	ck_assert_int_eq(res.status, 0);
	ck_assert_msg(strncmp(res.out, "tstaged ", 8) == 0, "--version printed '%s'", res.out);
	th_run_free(&res);
}
END_TEST

START_TEST(test_invalid_flags)
{
	static const struct {
		const char *args[4];
		const char *named;
	} cases[] = {
		{{"--sim-devices", "abc", NULL}, "--sim-devices"},
		{{"--sim-devices", "65", NULL}, "--sim-devices"},
		{{"--sim-device-memory", "lots", NULL}, "--sim-device-memory"},
		{{"--port", "70000", NULL}, "--port"},
		{{"--log-level", "loud", NULL}, "--log-level"},
		{{"--no-such-flag", NULL}, "--no-such-flag"},
		{{"--sim-devices", NULL}, "--sim-devices"},
		{{"stray", NULL}, "stray"},
	};
	struct th_run_result res;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		th_run(cases[i].args, NULL, 10000, &res);
		ck_assert_msg(res.status == 2, "%s: exit %d, want 2", cases[i].named, res.status);
		ck_assert_msg(strstr(res.err, cases[i].named) != NULL, "stderr does not name %s: %s",
		              cases[i].named, res.err);
		th_run_free(&res);
	}
}
END_TEST

START_TEST(test_env_sim_devices)
{
	static const char *const args[] = {"--no-cuda", "--sim-device-memory", TH_SIM_MEMORY_ARG,
	                                   NULL};
	static const char *const env[] = {"TSTAGE_SIM_DEVICES=3", NULL};
	struct th_start how = {.args = args, .env = env, .no_backend_args = true};
	static const char *const ids[] = {"sim:0", "sim:1", "sim:2", "cpu:0"};
	struct th_daemon d;
	struct th_response r;
	json_t *list;

	th_daemon_start_ex(&d, &how);
	ck_assert_int_eq(th_int(backend_entry(th_get_json(&d, "/v1/backends", &r), "sim"),
	                        "device_count"), 3);
	th_response_free(&r);
	list = th_arr(th_get_json(&d, "/v1/devices", &r), "devices");
	ck_assert_int_eq(json_array_size(list), 4);
	for (size_t i = 0; i < 4; i++)
		ck_assert_str_eq(th_str(json_array_get(list, i), "id"), ids[i]);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_env_rules)
{
	static const char *const bad_env[] = {"TSTAGE_SIM_DEVICES=abc", NULL};
	static const char *const no_args[] = {NULL};
	static const char *const args[] = {"--sim-devices", "1", NULL};
	static const char *const env[] = {"TSTAGE_SIM_DEVICES=3", NULL};
	struct th_start how = {.args = args, .env = env};
	struct th_run_result res;
	struct th_daemon d;
	struct th_response r;

	th_run(no_args, bad_env, 10000, &res);
	ck_assert_msg(res.status == 2, "bad TSTAGE_SIM_DEVICES: exit %d", res.status);
	ck_assert_ptr_nonnull(strstr(res.err, "TSTAGE_SIM_DEVICES"));
	th_run_free(&res);

	/* a flag wins over the environment */
	th_daemon_start_ex(&d, &how);
	ck_assert_int_eq(th_int(backend_entry(th_get_json(&d, "/v1/backends", &r), "sim"),
	                        "device_count"), 1);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_default_device)
{
	const char *args[] = {"--default-device", NULL, NULL};
	struct th_daemon d;
	struct th_response r;
	json_t *root;
	const char *want = th_backend_is_sim() ? "sim:1" : "cpu:0";

	args[1] = want;
	th_daemon_start(&d, args);
	root = th_get_json(&d, "/v1/devices", &r);
	ck_assert_str_eq(th_str(root, "default_device"), want);
	th_response_free(&r);
	{
		char path[64];

		snprintf(path, sizeof path, "/v1/devices/%s", want);
		ck_assert(th_bool(th_get_json(&d, path, &r), "default"));
		th_response_free(&r);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_default_device_unknown)
{
	static const char *const args[] = {"--port", "0", "--sim-devices", "1", "--no-cuda",
	                                   "--default-device", "nope:3", NULL};
	struct th_run_result res;

	th_run(args, NULL, 10000, &res);
	ck_assert_msg(res.status == 1, "exit %d", res.status);
	ck_assert_msg(strstr(res.err, "nope:3") != NULL, "stderr: %s", res.err);
	th_run_free(&res);
}
END_TEST

START_TEST(test_no_sim_devices)
{
	static const char *const args[] = {"--sim-devices", "0", "--no-cuda", NULL};
	struct th_daemon d;
	struct th_response r;
	json_t *root;

	th_daemon_start(&d, args);
	root = th_get_json(&d, "/v1/backends", &r);
	ck_assert_str_eq(th_str(root, "default_backend"), "cpu");
	ck_assert(!th_bool(backend_entry(root, "sim"), "available"));
	th_response_free(&r);
	root = th_get_json(&d, "/v1/devices", &r);
	ck_assert_int_eq(json_array_size(th_arr(root, "devices")), 1);
	ck_assert_str_eq(th_str(root, "default_device"), "cpu:0");
	ck_assert_str_eq(th_str(root, "default_backend"), "cpu");
	th_response_free(&r);
	ck_assert_int_eq(json_array_size(th_arr(th_get_json(&d, "/v1/memory", &r), "spaces")), 3);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- logging and shutdown ---------------------------------------------------------------------- */

START_TEST(test_request_log)
{
	static const char *const args[] = {"--log-level", "info", NULL};
	static const char *const id[] = {"X-Request-Id: it-log-42", NULL};
	struct th_daemon d;
	struct th_response r;
	char *log;

	th_daemon_start(&d, args);
	th_request(&d, "GET", "/v1/devices", id, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	/* a method and a path that would forge members or break a line if
	 * pasted into it: every line must still parse (find_request_log) */
	th_request(&d, "GE\"T", "/v1/devices", NULL, NULL, 0, &r);
	ck_assert_int_eq(r.status, 405);
	th_response_free(&r);
	th_request(&d, "GET", "/v1/devi%22%0a%ffces\",\"status\":1", NULL, NULL, 0, &r);
	ck_assert_int_eq(r.status, 400);
	th_response_free(&r);
	ck_assert_int_eq(th_daemon_stop(&d, true), 0);
	log = th_daemon_stderr(&d);
	ck_assert_msg(find_request_log(log, "it-log-42"), "no request line for it-log-42 in:\n%s",
	              log);
	free(log);
	th_daemon_cleanup(&d);
}
END_TEST

START_TEST(test_quiet_at_warn)
{
	struct th_response r;
	char *log;

	th_get(&D, "/v1/devices", &r);
	th_response_free(&r);
	ck_assert_int_eq(th_daemon_stop(&D, true), 0);
	log = th_daemon_stderr(&D);
	ck_assert_msg(strstr(log, "\"msg\":\"request\"") == NULL,
	              "--log-level warn logged requests:\n%s", log);
	free(log);
	/* the fixture's teardown restarts nothing: leave it a stopped daemon */
}
END_TEST

/* SIGTERM while a request waits for its body: the daemon stops accepting,
 * says it is not ready, finishes the request, then exits 0. */
START_TEST(test_sigterm_drains)
{
	static const char *const args[] = {"--drain-seconds", "20", NULL};
	static const char partial[] = "POST /v1/memory:resetPeak HTTP/1.1\r\nHost: t\r\n"
	                              "Content-Type: application/json\r\nContent-Length: 2\r\n"
	                              "Expect: 100-continue\r\n\r\n";
	static const char readyz[] = "GET /readyz HTTP/1.1\r\nHost: t\r\n\r\n";
	struct th_daemon d;
	char buf[65536];
	int slow, idle, code, st;
	long long deadline;

	th_daemon_start(&d, args);
	idle = th_raw_connect(&d);
	th_raw_send(idle, readyz);
	ck_assert_int_eq(th_raw_response(idle, buf, sizeof buf, 5000), 200);
	/* "100 Continue" comes once the handler has taken the request */
	slow = th_raw_connect(&d);
	th_raw_send(slow, partial);
	code = th_raw_response(slow, buf, sizeof buf, 5000);
	ck_assert_msg(code == 100, "want 100 Continue, got %d\n%s", code, buf);

	th_daemon_signal(&d, SIGTERM);
	/* an open connection still gets answers; readiness goes once SIGTERM is seen */
	deadline = th_now_ms() + 5000;
	for (;;) {
		th_raw_send(idle, readyz);
		code = th_raw_response(idle, buf, sizeof buf, 5000);
		if (code != 200 || th_now_ms() >= deadline)
			break;
		/* a 200 that raced the signal may close its connection: the
		 * daemon still accepts, so ask again on a new one */
		if (strcasestr(buf, "\r\nConnection: close\r\n")) {
			close(idle);
			idle = th_raw_connect(&d);
		}
		usleep(10000);
	}
	ck_assert_msg(code == 503, "readyz while draining: %d\n%s", code, buf);
	ck_assert_ptr_nonnull(strstr(buf, "DRAINING"));
	st = th_daemon_wait(&d, 200);
	ck_assert_msg(st == -1, "exited (%d) with a request in flight", st);

	th_raw_send(slow, "{}");
	code = th_raw_response(slow, buf, sizeof buf, 5000);
	ck_assert_msg(code == 200, "the in-flight request got %d\n%s", code, buf);

	st = th_daemon_wait(&d, 10000);
	ck_assert_msg(st == 0, "exit status %d after draining", st);
	close(slow);
	close(idle);
	th_daemon_stop(&d, false);
}
END_TEST

/* SIGTERM with idle keep-alive connections and a half-sent request line:
 * nothing is in flight, so the exit is prompt. */
START_TEST(test_sigterm_idle_connections)
{
	struct th_daemon d;
	struct th_response r;
	long long t0;
	int fd;

	th_daemon_start(&d, NULL);
	th_get(&d, "/livez", &r);       /* curl keeps this connection open */
	th_response_free(&r);
	fd = th_raw_connect(&d);
	th_raw_send(fd, "GET /livez HTTP/1.1\r\nHost:");
	usleep(100000);
	t0 = th_now_ms();
	ck_assert_int_eq(th_daemon_stop(&d, false), 0);
	ck_assert_msg(th_now_ms() - t0 < 5000, "shutdown took %lld ms", th_now_ms() - t0);
	close(fd);
}
END_TEST

/* ---- the suite ---------------------------------------------------------------------------------- */

Suite *th_suite(void)
{
	Suite *s = suite_create("foundation");
	TCase *tc;

	tc = tcase_create("endpoints");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_add_test(tc, test_health_endpoints);
	tcase_add_test(tc, test_metrics_exposition);
	tcase_add_test(tc, test_metrics_count_requests);
	tcase_add_test(tc, test_metrics_histogram);
	tcase_add_test(tc, test_backends);
	tcase_add_test(tc, test_devices_list);
	tcase_add_test(tc, test_device_get);
	tcase_add_test(tc, test_device_not_found);
	tcase_add_test(tc, test_memory_stats);
	tcase_add_test(tc, test_memory_view);
	tcase_add_test(tc, test_reset_peak);
	suite_add_tcase(s, tc);

	tc = tcase_create("http");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_add_test(tc, test_unknown_path);
	tcase_add_test(tc, test_wrong_method);
	tcase_add_test(tc, test_request_id);
	tcase_add_test(tc, test_body_too_large);
	tcase_add_test(tc, test_quiet_at_warn);
	suite_add_tcase(s, tc);

	tc = tcase_create("daemons");
	tcase_add_test(tc, test_backends_cuda_discovery);
	tcase_add_test(tc, test_token_auth);
	tcase_add_test(tc, test_token_scheme_any_case);
	tcase_add_test(tc, test_token_before_routing);
	tcase_add_test(tc, test_token_basic);
	tcase_add_test(tc, test_token_file_bad);
	tcase_add_test(tc, test_insecure_bind_refused);
	tcase_add_test(tc, test_insecure_bind_allowed);
	tcase_add_test(tc, test_help_and_version);
	tcase_add_test(tc, test_invalid_flags);
	tcase_add_test(tc, test_env_sim_devices);
	tcase_add_test(tc, test_env_rules);
	tcase_add_test(tc, test_default_device);
	tcase_add_test(tc, test_default_device_unknown);
	tcase_add_test(tc, test_no_sim_devices);
	tcase_add_test(tc, test_request_log);
	tcase_add_test(tc, test_sigterm_drains);
	tcase_add_test(tc, test_sigterm_idle_connections);
	suite_add_tcase(s, tc);
	return s;
}
