/*
 * it_metrics.c - Check suite "metrics": what GET /metrics and the log say
 * about a real daemon, and that they change as the daemon works.
 *
 * Metrics: family names do not collide and put units last; node-wide host
 * pools are listed once and space series add up to their pools; an upload,
 * a move, a refused allocation, a failed operation and training steps move
 * exactly the series they should; pinned segments left idle go back to the
 * system above --pinned-host-keep, and what pinning again costs is counted; requests in flight and the process_*
 * series are there. Logs: every line is JSON; the lifecycle events (start
 * with the configuration, backends, devices, drain, exit), one line per
 * operation end, and per request the client, user agent, bytes in and out,
 * the error of a failed one and a valid W3C traceparent (an invalid one is
 * ignored).
 *
 * Each test case runs in its own forked process with its own daemon (a
 * checked fixture) logging at info.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct th_daemon D;

static void daemon_up(void)
{
	static const char *const args[] = {"--log-level", "info", NULL};

	th_daemon_start(&D, args);
}

static void daemon_down(void)
{
	if (D.pid)
		th_daemon_stop_ok(&D);
}

/* Stops the daemon (it must exit 0), keeping its files for log_lines. */
static void stop_keeping_log(void)
{
	ck_assert_int_eq(th_daemon_stop(&D, true), 0);
}

/* ---- reading the exposition ----------------------------------------------------- */

/* One scrape, its samples parsed. */
struct scrape {
	char *text;
	struct th_prom_sample *s;
	int n;
};

static void scrape(struct scrape *sc)
{
	struct th_response r;
	char why[300];

	th_get(&D, "/metrics", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_msg(th_prom_validate(r.body, why, sizeof why) > 0, "exposition invalid at %s", why);
	sc->text = strdup(r.body);
	ck_assert_ptr_nonnull(sc->text);
	sc->s = th_prom_samples(r.body, &sc->n);
	th_response_free(&r);
}

static void scrape_free(struct scrape *sc)
{
	free(sc->text);
	free(sc->s);
}

/* Whether sample s has label name equal to value (value NULL: any). */
static bool has(const struct th_prom_sample *s, const char *name, const char *value)
{
	const char *v = th_prom_label(s, name);

	return v && (!value || strcmp(v, value) == 0);
}

/*
 * The sum of the samples called name whose labels include every pair of
 * sel (up to three pairs: label, value, label, value, ..., NULL), and in
 * *count how many there were (may be NULL).
 */
static double sum_of(const struct scrape *sc, const char *name, int *count, ...)
{
	const char *sel[6] = {0};
	double sum = 0;
	int n = 0;
	va_list ap;

	va_start(ap, count);
	for (int i = 0; i < 6; i++) {
		sel[i] = va_arg(ap, const char *);
		if (!sel[i])
			break;
	}
	va_end(ap);
	for (int i = 0; i < sc->n; i++) {
		bool ok = strcmp(sc->s[i].name, name) == 0;

		for (int k = 0; ok && k + 1 < 6 && sel[k]; k += 2)
			ok = has(&sc->s[i], sel[k], sel[k + 1]);
		if (ok) {
			sum += sc->s[i].value;
			n++;
		}
	}
	if (count)
		*count = n;
	return sum;
}

/* The one sample called name with those labels (as sum_of); fails unless
 * exactly one matches. */
static double one(const struct scrape *sc, const char *name, const char *l1, const char *v1,
                  const char *l2, const char *v2)
{
	int n = 0;
	double v = sum_of(sc, name, &n, l1, v1, l2, v2, NULL);

	ck_assert_msg(n == 1, "%d samples of %s{%s=%s,%s=%s}, want 1", n, name, l1 ? l1 : "",
	              v1 ? v1 : "", l2 ? l2 : "", v2 ? v2 : "");
	return v;
}

/* A metric with no labels, or with one label pair. */
static double value_of(const char *name, const char *label, const char *value)
{
	struct scrape sc;
	double v;

	scrape(&sc);
	v = one(&sc, name, label, value, NULL, NULL);
	scrape_free(&sc);
	return v;
}

/* ---- requests ----------------------------------------------------------------------- */

/* PUT /v1/arrays/name?query with len bytes of data; returns the status. */
static long put_array(const char *name, const char *query, size_t len)
{
	struct th_response r;
	char path[512];
	char *data = malloc(len ? len : 1);
	long st;

	ck_assert_ptr_nonnull(data);
	for (size_t i = 0; i < len; i++)
		data[i] = (char)(i * 7 + 1);
	snprintf(path, sizeof path, "/v1/arrays/%s?%s", name, th_on_backend(query));
	th_request(&D, "PUT", path, NULL, data, len, &r);
	st = r.status;
	th_response_free(&r);
	free(data);
	return st;
}

/*
 * Restarts the daemon with --data-dir and a malformed safetensors file in it,
 * and imports that file waiting: the import operation runs and fails
 * (INVALID_ARGUMENT, 400).
 */
static void failed_import(void)
{
	static const char junk[] = "\x10\x00\x00\x00\x00\x00\x00\x00{not a header}";
	char dir[512], file[600], body[700];
	const char *args[] = {"--log-level", "info", "--data-dir", dir, NULL};

	th_temp_dir("data", dir, sizeof dir);
	snprintf(file, sizeof file, "%s/bad.safetensors", dir);
	th_write_file(file, junk, sizeof junk - 1);
	th_daemon_stop_ok(&D);
	th_daemon_start(&D, args);
	snprintf(body, sizeof body, "{\"path\": \"%s\"}", file);
	th_post_error(&D, "/v1/arrays:import?wait=true", body, 400, "INVALID_ARGUMENT", NULL, NULL,
	              NULL);
}

/* ---- names ----------------------------------------------------------------------------- */

struct family {
	char name[128];
	char type[16];
};

/* The "# TYPE" lines of text (new array, *n entries). */
static struct family *families(const char *text, int *n)
{
	struct family *f = NULL;
	const char *p = text;

	*n = 0;
	while ((p = strstr(p, "# TYPE "))) {
		f = realloc(f, (size_t)(*n + 1) * sizeof *f);
		ck_assert_ptr_nonnull(f);
		ck_assert_int_eq(sscanf(p, "# TYPE %127s %15s", f[*n].name, f[*n].type), 2);
		(*n)++;
		p += 7;
	}
	return f;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* No family is declared twice, none is another's counter stem or histogram
 * part, counters end in _total, and a family carrying bytes or seconds says
 * so last (before _total). */
START_TEST(test_names_do_not_collide)
{
	static const char *const parts[] = {"_total", "_bucket", "_sum", "_count"};
	static const char *const want[] = {
		"tstage_memory_in_use_bytes", "tstage_memory_refusals_total", "tstage_pool_limit_bytes",
		"tstage_pool_reserved_bytes", "tstage_device_transfer_bytes_total",
		"tstage_device_copy_queue_depth", "tstage_operations_total",
		"tstage_operation_duration_seconds", "tstage_http_requests_in_flight",
		"tstage_training_steps_total", "tstage_training_step_duration_seconds",
		"process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total",
		"process_start_time_seconds",
	};
	struct th_response r;
	struct family *f;
	int n;

	th_get(&D, "/livez", &r);
	th_response_free(&r);
	th_get(&D, "/metrics", &r);
	f = families(r.body, &n);
	ck_assert_int_gt(n, 20);
	for (int i = 0; i < n; i++) {
		const char *name = f[i].name;

		if (strcmp(f[i].type, "counter") == 0)
			ck_assert_msg(ends_with(name, "_total"), "counter %s does not end in _total", name);
		else
			ck_assert_msg(!ends_with(name, "_total"), "%s %s ends in _total", f[i].type, name);
		if (strstr(name, "_bytes") && strcmp(f[i].type, "counter") != 0)
			ck_assert_msg(ends_with(name, "_bytes"), "%s: the unit is not last", name);
		if (strstr(name, "_bytes") && strcmp(f[i].type, "counter") == 0)
			ck_assert_msg(ends_with(name, "_bytes_total"), "%s: the unit is not last", name);
		for (int j = 0; j < n; j++) {
			char other[160];

			if (j == i)
				continue;
			ck_assert_msg(strcmp(name, f[j].name) != 0, "%s declared twice", name);
			for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
				snprintf(other, sizeof other, "%s%s", name, parts[k]);
				ck_assert_msg(strcmp(other, f[j].name) != 0, "%s %s collides with %s %s",
				              f[i].type, name, f[j].type, f[j].name);
			}
		}
	}
	for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
		bool found = false;

		for (int i = 0; i < n; i++)
			found = found || strcmp(f[i].name, want[k]) == 0;
		ck_assert_msg(found, "no family %s", want[k]);
	}
	free(f);
	/* method and route are labels of their own */
	ck_assert_ptr_nonnull(strstr(r.body, "tstage_http_requests_total{method=\"GET\",route=\"/livez\",code=\"200\"}"));
	th_response_free(&r);
}
END_TEST

/* ---- memory -------------------------------------------------------------------------- */

/* The pinned_host pool is one series whatever the device count; the space
 * series of every device add up to what their pools hold; device info
 * carries the join labels. */
START_TEST(test_pools_add_up)
{
	struct scrape sc;
	int n = 0, ndev = 0;
	double spaces, pool;

	ck_assert_int_eq(put_array("a", "dtype=uint8&shape=1024&device=sim:0&memory_kind=pinned_host",
	                           1024), 201);
	ck_assert_int_eq(put_array("b", "dtype=uint8&shape=2048&device=cpu:0&memory_kind=pinned_host",
	                           2048), 201);
	scrape(&sc);
	sum_of(&sc, "tstage_pool_limit_bytes", &n, "pool", "host/pinned_host", NULL);
	ck_assert_int_eq(n, 1);
	sum_of(&sc, "tstage_pool_limit_bytes", &n, "memory_kind", "unpinned_host", NULL);
	ck_assert_int_eq(n, 1);
	sum_of(&sc, "tstage_device_info", &ndev, NULL);
	sum_of(&sc, "tstage_memory_in_use_bytes", &n, "memory_kind", "pinned_host", NULL);
	ck_assert_int_eq(n, ndev);          /* one space per device */
	spaces = sum_of(&sc, "tstage_memory_in_use_bytes", NULL, "memory_kind", "pinned_host", NULL);
	ck_assert_msg(spaces == 3072, "pinned_host spaces hold %g bytes, want 3072", spaces);
	/* sizes that need no alignment: the pool holds exactly the spaces' sum */
	for (int i = 0; i < sc.n; i++) {
		const char *p;

		if (strcmp(sc.s[i].name, "tstage_pool_in_use_bytes") != 0)
			continue;
		p = th_prom_label(&sc.s[i], "pool");
		ck_assert_ptr_nonnull(p);
		pool = sum_of(&sc, "tstage_memory_in_use_bytes", NULL, "pool", p, NULL);
		ck_assert_msg(pool == sc.s[i].value, "pool %s holds %g, its spaces %g", p, sc.s[i].value,
		              pool);
	}
	/* a device pool reserves its region apart from what is in use */
	if (th_backend_is_sim())
		ck_assert(one(&sc, "tstage_pool_reserved_bytes", "pool", "sim:0/device", NULL, NULL) ==
		          (double)TH_SIM_MEMORY);
	for (int i = 0; i < sc.n; i++) {
		if (strcmp(sc.s[i].name, "tstage_device_info") != 0)
			continue;
		ck_assert(has(&sc.s[i], "gpu_uuid", NULL) || has(&sc.s[i], "backend", "sim") ||
		          has(&sc.s[i], "backend", "cpu"));
		if (has(&sc.s[i], "backend", "cuda"))
			ck_assert_msg(strncmp(th_prom_label(&sc.s[i], "gpu_uuid"), "GPU-", 4) == 0 &&
			              strlen(th_prom_label(&sc.s[i], "gpu_uuid")) == 40,
			              "gpu_uuid '%s'", th_prom_label(&sc.s[i], "gpu_uuid"));
		if (has(&sc.s[i], "backend", "cuda") && th_prom_label(&sc.s[i], "pci_bus_id")[0])
			ck_assert_msg(strchr(th_prom_label(&sc.s[i], "pci_bus_id"), ':') ==
			              th_prom_label(&sc.s[i], "pci_bus_id") + 8,
			              "pci_bus_id '%s' has no 8-digit domain",
			              th_prom_label(&sc.s[i], "pci_bus_id"));
	}
	scrape_free(&sc);
}
END_TEST

/* An upload counts in its space and in the device's h2d bytes; a :put to
 * the other device is one succeeded put operation that moved the bytes,
 * and the space series follow the array. */
START_TEST(test_upload_then_move)
{
	const char *d0 = th_dev(0), *d1 = th_dev(1), *k1 = "device";
	struct scrape a, b, c;
	char body[128];

	if (!th_daemon_has_device(&D, d1)) {      /* a one-GPU machine */
		d1 = d0;
		k1 = "pinned_host";
	}
	double moved0, moved1, moved2;

	scrape(&a);
	ck_assert_int_eq(put_array("w", "dtype=float32&shape=1024&device=sim:0&memory_kind=device",
	                           4096), 201);
	scrape(&b);
	ck_assert(one(&b, "tstage_memory_in_use_bytes", "device", d0, "memory_kind", "device") ==
	          one(&a, "tstage_memory_in_use_bytes", "device", d0, "memory_kind", "device") + 4096);
	ck_assert(one(&b, "tstage_memory_allocations_total", "device", d0, "memory_kind", "device") ==
	          one(&a, "tstage_memory_allocations_total", "device", d0, "memory_kind", "device") + 1);
	ck_assert(one(&b, "tstage_memory_live_allocations", "device", d0, "memory_kind", "device") ==
	          one(&a, "tstage_memory_live_allocations", "device", d0, "memory_kind", "device") + 1);
	ck_assert(one(&b, "tstage_device_transfer_bytes_total", "device", d0, "direction", "h2d") ==
	          one(&a, "tstage_device_transfer_bytes_total", "device", d0, "direction", "h2d") +
	          4096);
	moved0 = sum_of(&b, "tstage_device_transfer_bytes_total", NULL, NULL);

	snprintf(body, sizeof body, "{\"device\": \"%s\", \"memory_kind\": \"%s\"}", d1, k1);
	json_decref(th_post_json(&D, "/v1/arrays/w:put?wait=true", body, 200));
	scrape(&c);
	ck_assert(one(&c, "tstage_operations_total", "kind", "put", "outcome", "succeeded") ==
	          one(&b, "tstage_operations_total", "kind", "put", "outcome", "succeeded") + 1);
	ck_assert(one(&c, "tstage_operations_total", "kind", "put", "outcome", "failed") == 0);
	ck_assert(one(&c, "tstage_operation_duration_seconds_count", "kind", "put", NULL, NULL) ==
	          one(&b, "tstage_operation_duration_seconds_count", "kind", "put", NULL, NULL) + 1);
	ck_assert(one(&c, "tstage_operation_moved_bytes_total", "kind", "put", NULL, NULL) ==
	          one(&b, "tstage_operation_moved_bytes_total", "kind", "put", NULL, NULL) + 4096);
	ck_assert(one(&c, "tstage_memory_in_use_bytes", "device", d0, "memory_kind", "device") ==
	          one(&a, "tstage_memory_in_use_bytes", "device", d0, "memory_kind", "device"));
	ck_assert(one(&c, "tstage_memory_in_use_bytes", "device", d1, "memory_kind", k1) ==
	          one(&a, "tstage_memory_in_use_bytes", "device", d1, "memory_kind", k1) + 4096);
	/* the move's bytes crossed some device's queue */
	moved1 = sum_of(&c, "tstage_device_transfer_bytes_total", NULL, NULL);
	ck_assert_msg(moved1 >= moved0 + 4096, "transfer bytes %g -> %g", moved0, moved1);
	/* nothing is left queued once the operation is done (sim and cpu say) */
	moved2 = sum_of(&c, "tstage_device_copy_queue_depth", NULL, NULL);
	ck_assert_msg(moved2 == 0, "copy queues hold %g copies", moved2);
	scrape_free(&a);
	scrape_free(&b);
	scrape_free(&c);
}
END_TEST

/* An upload or a :copy that cannot fit is refused and counted in its
 * space, and no other. */
START_TEST(test_refusals_counted)
{
	const char *d0 = th_dev(0);
	struct scrape a, b, c;
	long st;

	if (!th_backend_is_sim())
		return;             /* a GPU's pool is too large to fill here */
	ck_assert_int_eq(put_array("big", "dtype=uint8&shape=41943040&device=sim:0&memory_kind=device",
	                           40u << 20), 201);
	scrape(&a);
	st = put_array("big2", "dtype=uint8&shape=41943040&device=sim:0&memory_kind=device", 40u << 20);
	ck_assert_msg(st >= 400 && st < 500, "second upload: %ld", st);
	scrape(&b);
	ck_assert(one(&b, "tstage_memory_refusals_total", "device", d0, "memory_kind", "device") ==
	          one(&a, "tstage_memory_refusals_total", "device", d0, "memory_kind", "device") + 1);
	ck_assert(one(&b, "tstage_memory_refusals_total", "device", th_dev(1), "memory_kind",
	              "device") == 0);
	th_post_error(&D, "/v1/arrays/big:copy?wait=true",
	              th_on_backend("{\"out\": \"big3\", \"device\": \"sim:0\", "
	                            "\"memory_kind\": \"device\"}"),
	              429, "RESOURCE_EXHAUSTED", NULL, NULL, NULL);
	scrape(&c);
	ck_assert(one(&c, "tstage_memory_refusals_total", "device", d0, "memory_kind", "device") ==
	          one(&b, "tstage_memory_refusals_total", "device", d0, "memory_kind", "device") + 1);
	scrape_free(&a);
	scrape_free(&b);
	scrape_free(&c);
}
END_TEST

/* A daemon with 1 GiB of pinned memory that keeps 16 MiB of idle segments. */
static void daemon_up_small_keep(void)
{
	static const char *const args[] = {"--log-level", "info", "--pinned-host-limit", "1GiB",
	                                   "--pinned-host-keep", "16MiB", NULL};

	th_daemon_start(&D, args);
}

/* The pinned_host space of the first device in GET /v1/memory (new ref). */
static json_t *pinned_space(void)
{
	json_t *mem = th_get_object(&D, "/v1/memory"), *sp = NULL;

	for (size_t i = 0; i < json_array_size(th_arr(mem, "spaces")); i++) {
		json_t *o = json_array_get(th_arr(mem, "spaces"), i);

		if (strcmp(th_str(o, "device"), th_dev(0)) == 0 &&
		    strcmp(th_str(o, "memory_kind"), "pinned_host") == 0)
			sp = json_incref(o);
	}
	json_decref(mem);
	ck_assert_ptr_nonnull(sp);
	return sp;
}

#define SEG (256ull << 20)    /* the pinned pool's growth step */
#define BIG (260ull << 20)    /* past it: a segment of its own, exactly */

/* After churn, bytes_reserved falls back towards bytes_in_use: the idle
 * segments of arrays deleted go back to the system, the keep stays below
 * 16 MiB, and what the pool pins again is counted in the metrics and in
 * the space's pinned_pool. */
START_TEST(test_pinned_segments_go_back)
{
	const char *q_small = "dtype=uint8&shape=1048576&device=sim:0&memory_kind=pinned_host";
	char q_big[128];
	struct th_response r;
	struct scrape sc;
	json_t *sp, *pool;
	int n = -1;

	snprintf(q_big, sizeof q_big, "dtype=uint8&shape=%llu&device=sim:0&memory_kind=pinned_host",
	         BIG);
	ck_assert_int_eq(put_array("small", q_small, 1u << 20), 201);   /* a 256 MiB segment */
	ck_assert_int_eq(put_array("b1", q_big, BIG), 201);
	ck_assert_int_eq(put_array("b2", q_big, BIG), 201);
	sp = pinned_space();
	ck_assert_int_eq(th_int(sp, "bytes_reserved"), SEG + 2 * BIG);
	json_decref(sp);
	for (int i = 1; i <= 2; i++) {
		th_request(&D, "DELETE", i == 1 ? "/v1/arrays/b1" : "/v1/arrays/b2", NULL, NULL, 0, &r);
		ck_assert_int_eq(r.status, 200);
		th_response_free(&r);
	}
	sp = pinned_space();
	ck_assert_int_eq(th_int(sp, "bytes_in_use"), 1 << 20);
	ck_assert_int_eq(th_int(sp, "bytes_reserved"), SEG);             /* down from 776 MiB */
	ck_assert_int_eq(th_int(sp, "peak_bytes_reserved"), SEG + 2 * BIG);
	pool = th_obj(sp, "pinned_pool");
	ck_assert_int_eq(th_int(pool, "keep_bytes"), 16 << 20);
	ck_assert_int_eq(th_int(pool, "segments"), 1);
	ck_assert_int_eq(th_int(pool, "segments_released"), 2);
	ck_assert_int_eq(th_int(pool, "released_bytes"), 2 * BIG);
	ck_assert_int_eq(th_int(pool, "repinned_bytes"), 0);
	json_decref(sp);

	/* pinned again: below the 776 MiB held before, so a re-pin */
	ck_assert_int_eq(put_array("b3", q_big, BIG), 201);
	scrape(&sc);
	ck_assert(one(&sc, "tstage_pool_segments", "pool", "host/pinned_host", NULL, NULL) == 2);
	ck_assert(one(&sc, "tstage_pool_keep_bytes", "pool", "host/pinned_host", NULL, NULL) ==
	          16 << 20);
	ck_assert(one(&sc, "tstage_pool_segments_pinned_total", "pool", "host/pinned_host", NULL,
	              NULL) == 4);
	ck_assert(one(&sc, "tstage_pool_segments_released_total", "pool", "host/pinned_host", NULL,
	              NULL) == 2);
	ck_assert(one(&sc, "tstage_pool_released_bytes_total", "pool", "host/pinned_host", NULL,
	              NULL) == (double)(2 * BIG));
	ck_assert(one(&sc, "tstage_pool_pinned_bytes_total", "pool", "host/pinned_host", NULL,
	              NULL) == (double)(SEG + 3 * BIG));
	ck_assert(one(&sc, "tstage_pool_repinned_bytes_total", "pool", "host/pinned_host", NULL,
	              NULL) == (double)BIG);
	ck_assert(one(&sc, "tstage_pool_pin_seconds_total", "pool", "host/pinned_host", NULL,
	              NULL) >= one(&sc, "tstage_pool_repin_seconds_total", "pool",
	                           "host/pinned_host", NULL, NULL));
	ck_assert(one(&sc, "tstage_pool_reserved_bytes", "pool", "host/pinned_host", NULL, NULL) ==
	          (double)(SEG + BIG));
	/* device pools are no segment pools */
	sum_of(&sc, "tstage_pool_segments", &n, "memory_kind", "device", NULL);
	ck_assert_int_eq(n, 0);
	scrape_free(&sc);
}
END_TEST

/* An operation that fails counts as failed, with its duration. */
START_TEST(test_failed_operation_counted)
{
	struct scrape a;

	failed_import();
	scrape(&a);
	ck_assert(one(&a, "tstage_operations_total", "kind", "import", "outcome", "failed") == 1);
	ck_assert(one(&a, "tstage_operations_total", "kind", "import", "outcome", "succeeded") == 0);
	ck_assert(one(&a, "tstage_operation_duration_seconds_count", "kind", "import", NULL, NULL) ==
	          1);
	scrape_free(&a);
}
END_TEST

/* Three training steps are three steps with a duration each, and one
 * succeeded step operation. */
START_TEST(test_training_steps_counted)
{
	struct th_response r;
	struct scrape a, b;
	float x[8 * 4];

	for (size_t i = 0; i < sizeof x / sizeof x[0]; i++)
		x[i] = (float)i / 32.0f;
	json_decref(th_post_json(&D, "/v1/models?wait=true",
	                         "{\"name\": \"mm\", \"mlp\": {\"layers\": 1, \"d_model\": 4}}",
	                         200));
	th_request(&D, "PUT", "/v1/arrays/mm.x?dtype=float32&shape=8,4", NULL, (const char *)x,
	           sizeof x, &r);
	ck_assert_int_eq(r.status, 201);
	th_response_free(&r);
	scrape(&a);
	json_decref(th_post_json(&D, "/v1/models/mm:step?wait=true",
	                         "{\"inputs\": \"mm.x\", \"steps\": 3}", 200));
	scrape(&b);
	ck_assert(one(&b, "tstage_training_steps_total", NULL, NULL, NULL, NULL) ==
	          one(&a, "tstage_training_steps_total", NULL, NULL, NULL, NULL) + 3);
	ck_assert(one(&b, "tstage_training_step_duration_seconds_count", NULL, NULL, NULL, NULL) ==
	          one(&a, "tstage_training_step_duration_seconds_count", NULL, NULL, NULL, NULL) + 3);
	ck_assert(one(&b, "tstage_training_step_duration_seconds_sum", NULL, NULL, NULL, NULL) >
	          one(&a, "tstage_training_step_duration_seconds_sum", NULL, NULL, NULL, NULL));
	ck_assert(one(&b, "tstage_operations_total", "kind", "step", "outcome", "succeeded") ==
	          one(&a, "tstage_operations_total", "kind", "step", "outcome", "succeeded") + 1);
	ck_assert(one(&b, "tstage_operations_total", "kind", "create", "outcome", "succeeded") == 1);
	scrape_free(&a);
	scrape_free(&b);
}
END_TEST

/* The scrape is itself a request in flight; the process series are the
 * daemon's. */
START_TEST(test_in_flight_and_process)
{
	double start = value_of("process_start_time_seconds", NULL, NULL);
	double now = (double)time(NULL);

	ck_assert_msg(value_of("tstage_http_requests_in_flight", NULL, NULL) >= 1,
	              "the scrape is not in flight");
	ck_assert_msg(fabs(start - now) < 120, "process_start_time_seconds %g, now %g", start, now);
	ck_assert(value_of("process_resident_memory_bytes", NULL, NULL) > 1 << 20);
	ck_assert(value_of("process_open_fds", NULL, NULL) >= 3);
	ck_assert(value_of("process_max_fds", NULL, NULL) >= value_of("process_open_fds", NULL, NULL));
	ck_assert(value_of("process_cpu_seconds_total", NULL, NULL) >= 0);
}
END_TEST

/* ---- logs ---------------------------------------------------------------------------- */

/*
 * The lines of the stopped daemon's stderr (new reference: an array of
 * objects); fails unless every line is a JSON object with ts, level, msg.
 */
static json_t *log_lines(void)
{
	char *text = th_daemon_stderr(&D), *p = text;
	json_t *lines = json_array();

	while (p && *p) {
		char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);
		json_error_t e;
		json_t *j = json_loadb(p, len, 0, &e);

		ck_assert_msg(j && json_is_object(j), "log line is not a JSON object: %.*s", (int)len, p);
		th_str(j, "ts");
		th_str(j, "level");
		th_str(j, "msg");
		json_array_append_new(lines, j);
		if (!nl)
			break;
		p = nl + 1;
	}
	free(text);
	th_daemon_cleanup(&D);
	return lines;
}

/* The first line whose member key is the string value (borrowed), or NULL. */
static json_t *line_with(json_t *lines, const char *key, const char *value, const char *key2,
                         const char *value2)
{
	size_t i;
	json_t *j;

	json_array_foreach(lines, i, j) {
		json_t *v = json_object_get(j, key), *v2 = key2 ? json_object_get(j, key2) : NULL;

		if (json_is_string(v) && strcmp(json_string_value(v), value) == 0 &&
		    (!key2 || (json_is_string(v2) && strcmp(json_string_value(v2), value2) == 0)))
			return j;
	}
	return NULL;
}

/* Start with the configuration in effect, one line per backend and per
 * device, then drain and exit. */
START_TEST(test_lifecycle_logged)
{
	json_t *lines, *start, *j;

	stop_keeping_log();
	lines = log_lines();
	start = line_with(lines, "event", "start", NULL, NULL);
	ck_assert_msg(start, "no start line");
	ck_assert_int_eq(th_int(start, "port"), D.port);
	ck_assert_str_eq(th_str(start, "log_level"), "info");
	ck_assert_str_eq(th_str(start, "default_device"), th_dev(0));
	ck_assert_int_gt(th_int(start, "pinned_host_limit"), 0);
	ck_assert(!th_bool(start, "token_required"));
	ck_assert_ptr_null(json_object_get(start, "token"));
	for (const char *b = "cuda"; b; b = strcmp(b, "cuda") == 0 ? "sim" :
	                                     strcmp(b, "sim") == 0 ? "cpu" : NULL) {
		j = line_with(lines, "event", "backend", "backend", b);
		ck_assert_msg(j, "no line for backend %s", b);
		th_str(j, "detail");
		th_int(j, "devices");
	}
	/* the CUDA backend says why it has no device (switched off on sim runs) */
	j = line_with(lines, "event", "backend", "backend", "cuda");
	if (th_backend_is_sim())
		ck_assert_int_eq(th_int(j, "devices"), 0);
	ck_assert_msg(strlen(th_str(j, "detail")) > 0, "cuda backend without a detail");
	for (int i = 0; i < (th_backend_is_sim() ? 2 : 1); i++) {
		j = line_with(lines, "event", "device", "device", th_dev(i));
		ck_assert_msg(j, "no line for device %s", th_dev(i));
		th_int(j, "total_memory_bytes");
		th_str(j, "gpu_uuid");
	}
	ck_assert_ptr_nonnull(line_with(lines, "event", "device", "device", "cpu:0"));
	j = line_with(lines, "event", "drain", NULL, NULL);
	ck_assert_msg(j, "no drain line");
	ck_assert_str_eq(th_str(j, "signal"), "SIGTERM");
	j = line_with(lines, "event", "exit", NULL, NULL);
	ck_assert_msg(j, "no exit line");
	ck_assert_int_eq(th_int(j, "code"), 0);
	json_decref(lines);
}
END_TEST

/* One line per operation end: kind, outcome, duration and bytes; a failed
 * one at warn with its error. */
START_TEST(test_operation_end_logged)
{
	json_t *lines, *ok = NULL, *bad = NULL, *j;
	size_t i;

	failed_import();
	ck_assert_int_eq(put_array("v", "dtype=uint8&shape=8192&device=sim:0&memory_kind=device",
	                           8192), 201);
	json_decref(th_post_json(&D, "/v1/arrays/v:put?wait=true",
	                         "{\"memory_kind\": \"pinned_host\"}", 200));
	stop_keeping_log();
	lines = log_lines();
	json_array_foreach(lines, i, j) {
		json_t *kind = json_object_get(j, "kind");

		if (!json_object_get(j, "operation") || !json_is_string(kind))
			continue;
		if (strcmp(json_string_value(kind), "put") == 0)
			ok = j;
		if (strcmp(json_string_value(kind), "import") == 0)
			bad = j;
	}
	ck_assert_msg(ok, "no line for the put's end");
	ck_assert_str_eq(th_str(ok, "outcome"), "succeeded");
	ck_assert_str_eq(th_str(ok, "level"), "info");
	ck_assert_str_eq(th_str(ok, "target"), "v");
	ck_assert_int_eq(th_int(ok, "bytes"), 8192);
	ck_assert_str_eq(th_str(ok, "unit"), "bytes");
	ck_assert(json_is_number(json_object_get(ok, "duration_ms")));
	ck_assert(json_number_value(json_object_get(ok, "duration_ms")) >= 0);
	ck_assert_ptr_null(json_object_get(ok, "error"));
	ck_assert_msg(bad, "no line for the import's end");
	ck_assert_str_eq(th_str(bad, "outcome"), "failed");
	ck_assert_str_eq(th_str(bad, "level"), "warn");
	ck_assert_str_eq(th_str(th_obj(bad, "error"), "status"), "INVALID_ARGUMENT");
	th_str(th_obj(bad, "error"), "reason");
	ck_assert(strlen(th_str(th_obj(bad, "error"), "message")) > 0);
	json_decref(lines);
}
END_TEST

/* The request line: client, user agent, bytes in and out, the error of a
 * failed request, and a valid traceparent with its trace id; an invalid
 * traceparent is ignored (the request is served, nothing is logged). */
START_TEST(test_request_fields_logged)
{
	static const char *const valid[] = {
		"X-Request-Id: it-trace-1", "User-Agent: it-metrics/1.0",
		"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", NULL};
	static const char *const bad_tp[] = {
		"traceparent: 00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
		"traceparent: ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"traceparent: 00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
		"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"traceparent: garbage",
	};
	struct th_response r;
	json_t *lines, *j;
	char id[32];

	th_request(&D, "GET", "/v1/devices/no-such-device", valid, NULL, 0, &r);
	ck_assert_int_eq(r.status, 404);
	th_response_free(&r);
	for (size_t i = 0; i < sizeof bad_tp / sizeof bad_tp[0]; i++) {
		const char *h[3] = {id, bad_tp[i], NULL};

		snprintf(id, sizeof id, "X-Request-Id: it-bad-%zu", i);
		th_request(&D, "GET", "/v1/memory", h, NULL, 0, &r);
		ck_assert_int_eq(r.status, 200);
		th_response_free(&r);
	}
	{
		static const char *const h[] = {"X-Request-Id: it-upload", NULL};
		char data[1000] = {0};

		th_request(&D, "PUT", th_on_backend("/v1/arrays/u?dtype=uint8&shape=1000&device=sim:0"),
		           h, data, sizeof data, &r);
		ck_assert_int_eq(r.status, 201);
		th_response_free(&r);
	}
	{
		static const char *const h[] = {"X-Request-Id: it-download", NULL};

		th_request(&D, "GET", "/v1/arrays/u/data", h, NULL, 0, &r);
		ck_assert_int_eq(r.status, 200);
		ck_assert_uint_eq(r.body_len, 1000);
		th_response_free(&r);
	}
	stop_keeping_log();
	lines = log_lines();

	j = line_with(lines, "request_id", "it-trace-1", NULL, NULL);
	ck_assert_msg(j, "no line for it-trace-1");
	ck_assert_str_eq(th_str(j, "msg"), "request");
	ck_assert_int_eq(th_int(j, "status"), 404);
	ck_assert_str_eq(th_str(j, "client"), "127.0.0.1");
	ck_assert_str_eq(th_str(j, "user_agent"), "it-metrics/1.0");
	ck_assert_str_eq(th_str(j, "traceparent"),
	                 "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
	ck_assert_str_eq(th_str(j, "trace_id"), "4bf92f3577b34da6a3ce929d0e0e4736");
	ck_assert_str_eq(th_str(th_obj(j, "error"), "status"), "NOT_FOUND");
	ck_assert_str_eq(th_str(th_obj(j, "error"), "reason"), "DEVICE_NOT_FOUND");
	ck_assert_ptr_nonnull(strstr(th_str(th_obj(j, "error"), "message"), "no-such-device"));
	ck_assert_int_eq(th_int(j, "bytes_in"), 0);
	ck_assert_int_gt(th_int(j, "bytes_out"), 0);
	for (size_t i = 0; i < sizeof bad_tp / sizeof bad_tp[0]; i++) {
		snprintf(id, sizeof id, "it-bad-%zu", i);
		j = line_with(lines, "request_id", id, NULL, NULL);
		ck_assert_msg(j, "no line for %s", id);
		ck_assert_msg(!json_object_get(j, "traceparent") && !json_object_get(j, "trace_id"),
		              "%s logged an invalid traceparent", bad_tp[i]);
		ck_assert_ptr_null(json_object_get(j, "error"));
	}
	j = line_with(lines, "request_id", "it-upload", NULL, NULL);
	ck_assert_msg(j, "no line for the upload");
	ck_assert_int_eq(th_int(j, "bytes_in"), 1000);
	j = line_with(lines, "request_id", "it-download", NULL, NULL);
	ck_assert_msg(j, "no line for the download");
	ck_assert_int_eq(th_int(j, "bytes_out"), 1000);
	json_decref(lines);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("metrics");
	TCase *tc = tcase_create("exposition");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_add_test(tc, test_names_do_not_collide);
	tcase_add_test(tc, test_pools_add_up);
	tcase_add_test(tc, test_upload_then_move);
	tcase_add_test(tc, test_refusals_counted);
	tcase_add_test(tc, test_failed_operation_counted);
	tcase_add_test(tc, test_training_steps_counted);
	tcase_add_test(tc, test_in_flight_and_process);
	suite_add_tcase(s, tc);

	tc = tcase_create("pinned_pool");
	tcase_add_checked_fixture(tc, daemon_up_small_keep, daemon_down);
	tcase_add_test(tc, test_pinned_segments_go_back);
	suite_add_tcase(s, tc);

	tc = tcase_create("logs");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_add_test(tc, test_lifecycle_logged);
	tcase_add_test(tc, test_operation_end_logged);
	tcase_add_test(tc, test_request_fields_logged);
	suite_add_tcase(s, tc);
	return s;
}
