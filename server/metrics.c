/*
 * metrics.c - request counters, latency histograms and the Prometheus text
 * exposition, including the memory gauges of every space.
 */
#include "server/metrics.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "common/version.h"
#include "handlers/api.h"
#include "memory/space.h"
#include "ops/operation.h"
#include "storage/array.h"
#include "storage/stage.h"

static const int code_slots[] = {200, 201, 202, 204, 206, 304, 400, 401, 403, 404,
                                 405, 409, 411, 412, 413, 416, 429, 499, 500, 501,
                                 503, 504};
#define NCODES (sizeof code_slots / sizeof code_slots[0])
#define CODE_OTHER NCODES

static const double buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
#define NBUCKETS (sizeof buckets / sizeof buckets[0])

struct route_metrics {
	_Atomic uint64_t codes[NCODES + 1];
	_Atomic uint64_t bucket[NBUCKETS + 1];   /* last: +Inf (non-cumulative) */
	_Atomic uint64_t sum_ns;
	_Atomic uint64_t count;
};

struct ts_metrics {
	size_t nroutes;                         /* immutable */
	const char *const *patterns;            /* immutable, borrowed */
	struct route_metrics *routes;           /* nroutes + 1 entries */
};

struct ts_metrics *ts_metrics_new(size_t nroutes, const char *const *patterns)
{
	struct ts_metrics *m = calloc(1, sizeof *m);

	if (!m)
		return NULL;
	m->routes = calloc(nroutes + 1, sizeof *m->routes);
	if (!m->routes) {
		free(m);
		return NULL;
	}
	m->nroutes = nroutes;
	m->patterns = patterns;
	return m;
}

void ts_metrics_free(struct ts_metrics *m)
{
	if (!m)
		return;
	free(m->routes);
	free(m);
}

void ts_metrics_record(struct ts_metrics *m, size_t route, int http_code,
                       uint64_t duration_ns)
{
	struct route_metrics *r = &m->routes[route < m->nroutes ? route : m->nroutes];
	double secs = (double)duration_ns / 1e9;
	size_t c = CODE_OTHER, b = NBUCKETS;

	for (size_t i = 0; i < NCODES; i++)
		if (code_slots[i] == http_code)
			c = i;
	for (size_t i = 0; i < NBUCKETS; i++) {
		if (secs <= buckets[i]) {
			b = i;
			break;
		}
	}
	atomic_fetch_add_explicit(&r->codes[c], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&r->bucket[b], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&r->sum_ns, duration_ns, memory_order_relaxed);
	atomic_fetch_add_explicit(&r->count, 1, memory_order_relaxed);
}

/* A growing output buffer; a failed append marks it broken. */
struct out {
	char *buf;
	size_t len, cap;
	int failed;
};

static void out_printf(struct out *o, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void out_printf(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->failed)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->failed = 1;
			return;
		}
		if ((size_t)n < o->cap - o->len) {
			o->len += (size_t)n;
			return;
		}
		size_t cap = (o->cap + (size_t)n + 1) * 2;
		char *grown = realloc(o->buf, cap);

		if (!grown) {
			o->failed = 1;
			return;
		}
		o->buf = grown;
		o->cap = cap;
	}
}

static const char *route_name(const struct ts_metrics *m, size_t i)
{
	return i < m->nroutes ? m->patterns[i] : "unmatched";
}

static void render_http(struct out *o, struct ts_metrics *m)
{
	out_printf(o, "# HELP tstage_http_requests_total HTTP requests by route and status code.\n"
	              "# TYPE tstage_http_requests_total counter\n");
	for (size_t i = 0; i <= m->nroutes; i++) {
		for (size_t c = 0; c <= NCODES; c++) {
			uint64_t v = atomic_load_explicit(&m->routes[i].codes[c], memory_order_relaxed);

			if (!v)
				continue;
			if (c == CODE_OTHER)
				out_printf(o, "tstage_http_requests_total{route=\"%s\",code=\"other\"} %llu\n",
				           route_name(m, i), (unsigned long long)v);
			else
				out_printf(o, "tstage_http_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
				           route_name(m, i), code_slots[c], (unsigned long long)v);
		}
	}
	out_printf(o, "# HELP tstage_http_request_duration_seconds Time from the first byte of a request to the end of its response.\n"
	              "# TYPE tstage_http_request_duration_seconds histogram\n");
	for (size_t i = 0; i <= m->nroutes; i++) {
		struct route_metrics *r = &m->routes[i];
		uint64_t cum = 0, count = atomic_load_explicit(&r->count, memory_order_relaxed);

		if (!count)
			continue;
		for (size_t b = 0; b < NBUCKETS; b++) {
			cum += atomic_load_explicit(&r->bucket[b], memory_order_relaxed);
			out_printf(o, "tstage_http_request_duration_seconds_bucket{route=\"%s\",le=\"%g\"} %llu\n",
			           route_name(m, i), buckets[b], (unsigned long long)cum);
		}
		cum += atomic_load_explicit(&r->bucket[NBUCKETS], memory_order_relaxed);
		/* count read first, buckets after: +Inf is the bucket total, so that
		 * the series stays consistent under concurrent updates */
		out_printf(o, "tstage_http_request_duration_seconds_bucket{route=\"%s\",le=\"+Inf\"} %llu\n"
		              "tstage_http_request_duration_seconds_sum{route=\"%s\"} %.9f\n"
		              "tstage_http_request_duration_seconds_count{route=\"%s\"} %llu\n",
		           route_name(m, i), (unsigned long long)cum, route_name(m, i),
		           (double)atomic_load_explicit(&r->sum_ns, memory_order_relaxed) / 1e9,
		           route_name(m, i), (unsigned long long)cum);
	}
}

static const struct {
	const char *name, *help;
	size_t offset;
} memory_gauges[] = {
	{"tstage_memory_bytes_in_use", "Bytes allocated in a (device, memory kind) space.",
	 offsetof(struct ts_space_stats, bytes_in_use)},
	{"tstage_memory_peak_bytes", "Peak bytes in use since start or the last resetPeak.",
	 offsetof(struct ts_space_stats, peak_bytes_in_use)},
	{"tstage_memory_bytes_limit", "Limit of the pool the space draws from.",
	 offsetof(struct ts_space_stats, bytes_limit)},
	{"tstage_memory_bytes_reserved", "Bytes the space's pool holds from the system.",
	 offsetof(struct ts_space_stats, bytes_reserved)},
	{"tstage_memory_largest_free_block_bytes", "Largest allocation that fits now.",
	 offsetof(struct ts_space_stats, largest_free_block_bytes)},
	{"tstage_memory_allocations", "Live allocations in the space.",
	 offsetof(struct ts_space_stats, live_allocs)},
};

static void render_memory(struct out *o, const struct ts_core *core)
{
	size_t n = ts_memory_space_count(core->memory);
	struct ts_space_stats *st = calloc(n ? n : 1, sizeof *st);

	if (!st) {
		o->failed = 1;
		return;
	}
	for (size_t i = 0; i < n; i++)
		ts_space_stats(ts_memory_space_at(core->memory, i), &st[i]);
	for (size_t g = 0; g < sizeof memory_gauges / sizeof memory_gauges[0]; g++) {
		out_printf(o, "# HELP %s %s\n# TYPE %s gauge\n", memory_gauges[g].name,
		           memory_gauges[g].help, memory_gauges[g].name);
		for (size_t i = 0; i < n; i++) {
			const struct ts_space *sp = ts_memory_space_at(core->memory, i);
			uint64_t v = *(const uint64_t *)((const char *)&st[i] + memory_gauges[g].offset);

			out_printf(o, "%s{device=\"%s\",memory_kind=\"%s\"} %llu\n",
			           memory_gauges[g].name, ts_device_props(ts_space_device(sp))->id,
			           ts_memory_kind_name(ts_space_kind(sp)), (unsigned long long)v);
		}
	}
	out_printf(o, "# HELP tstage_memory_allocations_total Allocations made in the space since start.\n"
	              "# TYPE tstage_memory_allocations_total counter\n");
	for (size_t i = 0; i < n; i++) {
		const struct ts_space *sp = ts_memory_space_at(core->memory, i);

		out_printf(o, "tstage_memory_allocations_total{device=\"%s\",memory_kind=\"%s\"} %llu\n",
		           ts_device_props(ts_space_device(sp))->id,
		           ts_memory_kind_name(ts_space_kind(sp)), (unsigned long long)st[i].num_allocs);
	}
	free(st);
}

static void render_devices(struct out *o, const struct ts_core *core)
{
	size_t n = ts_device_set_count(core->devices);

	out_printf(o, "# HELP tstage_device_info A device tstaged serves (value 1).\n"
	              "# TYPE tstage_device_info gauge\n");
	for (size_t i = 0; i < n; i++) {
		const struct ts_device_props *p = ts_device_props(ts_device_set_at(core->devices, i));

		out_printf(o, "tstage_device_info{device=\"%s\",backend=\"%s\",simulated=\"%s\"} 1\n",
		           p->id, ts_backend_name(p->backend), p->simulated ? "true" : "false");
	}
	out_printf(o, "# HELP tstage_device_healthy 1 unless the device hit a sticky error.\n"
	              "# TYPE tstage_device_healthy gauge\n");
	for (size_t i = 0; i < n; i++) {
		struct ts_device *d = ts_device_set_at(core->devices, i);

		out_printf(o, "tstage_device_healthy{device=\"%s\"} %d\n", ts_device_props(d)->id,
		           ts_device_broken(d) ? 0 : 1);
	}
}

static void render_operations(struct out *o, const struct ts_core *core)
{
	uint64_t counts[TS_OP_CANCELLED + 1];

	if (!core->operations)
		return;
	ts_op_counts(core->operations, counts);
	out_printf(o, "# HELP tstage_operations Operations listed, by state (finished ones until "
	              "retention drops them).\n"
	              "# TYPE tstage_operations gauge\n");
	for (int s = TS_OP_PENDING; s <= TS_OP_CANCELLED; s++)
		out_printf(o, "tstage_operations{state=\"%s\"} %llu\n",
		           ts_op_state_name((enum ts_op_state)s), (unsigned long long)counts[s]);
}

static void render_transfers(struct out *o, const struct ts_core *core)
{
	uint64_t moved[TS_MEM_KIND_COUNT][TS_MEM_KIND_COUNT], count = 0, bytes = 0;

	if (core->stager) {
		ts_stager_totals(core->stager, moved);
		out_printf(o, "# HELP tstage_transfer_bytes_total Bytes moved, by source and destination "
		              "memory kind (HTTP bodies count as unpinned_host).\n"
		              "# TYPE tstage_transfer_bytes_total counter\n");
		for (int a = 0; a < TS_MEM_KIND_COUNT; a++)
			for (int b = 0; b < TS_MEM_KIND_COUNT; b++)
				out_printf(o, "tstage_transfer_bytes_total{src_kind=\"%s\",dst_kind=\"%s\"} %llu\n",
				           ts_memory_kind_name((enum ts_memory_kind)a),
				           ts_memory_kind_name((enum ts_memory_kind)b),
				           (unsigned long long)moved[a][b]);
		out_printf(o, "# HELP tstage_implicit_transfer_bytes_total Bytes of uncommitted arrays "
		              "moved because an operation needed them elsewhere.\n"
		              "# TYPE tstage_implicit_transfer_bytes_total counter\n"
		              "tstage_implicit_transfer_bytes_total %llu\n",
		           (unsigned long long)ts_stager_implicit(core->stager));
	}
	if (core->catalog) {
		ts_catalog_totals(core->catalog, &count, &bytes);
		out_printf(o, "# HELP tstage_arrays Arrays in the catalog.\n"
		              "# TYPE tstage_arrays gauge\n"
		              "tstage_arrays %llu\n"
		              "# HELP tstage_array_bytes Bytes of the arrays in the catalog.\n"
		              "# TYPE tstage_array_bytes gauge\n"
		              "tstage_array_bytes %llu\n",
		           (unsigned long long)count, (unsigned long long)bytes);
	}
}

char *ts_metrics_render(struct ts_metrics *m, const struct ts_core *core, size_t *len)
{
	struct out o = {0};

	out_printf(&o, "# HELP tstage_build_info Build of the running tstaged (value 1).\n"
	               "# TYPE tstage_build_info gauge\n"
	               "tstage_build_info{version=\"%s\",revision=\"%s\",cuda=\"%s\"} 1\n",
	           ts_version, ts_git_rev,
#ifdef TS_HAVE_CUDA
	           "true"
#else
	           "false"
#endif
	);
	out_printf(&o, "# HELP tstage_uptime_seconds Seconds since tstaged started.\n"
	               "# TYPE tstage_uptime_seconds gauge\n"
	               "tstage_uptime_seconds %.3f\n",
	           (double)(ts_now_ns() - core->started_ns) / 1e9);
	render_devices(&o, core);
	render_memory(&o, core);
	render_operations(&o, core);
	render_transfers(&o, core);
	render_http(&o, m);
	if (o.failed) {
		free(o.buf);
		return NULL;
	}
	*len = o.len;
	return o.buf;
}
