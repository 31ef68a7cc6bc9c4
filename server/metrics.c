/*
 * metrics.c - request and operation counters, latency histograms and the
 * Prometheus text exposition, including the memory of every space and pool,
 * transfers per device, training steps and the process_* series.
 *
 * Naming: base units last (`_bytes`, `_seconds`), counters end in `_total`,
 * and no gauge shares a name with a counter's stem. Space series
 * (`tstage_memory_*{device,memory_kind,pool}`) count only the space's own
 * bytes, so sums over devices add up; the limits of node-wide host pools are
 * their own series (`tstage_pool_*{pool,memory_kind}`), listed once.
 */
#include "server/metrics.h"

#include <assert.h>
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/histogram.h"
#include "common/textbuf.h"
#include "common/units.h"
#include "common/version.h"
#include "handlers/api.h"
#include "jobs/state.h"
#include "memory/space.h"
#include "storage/array.h"
#include "storage/stage.h"
#include "train/model.h"

static const int code_slots[] = {200, 201, 202, 204, 206, 304, 400, 401, 403, 404,
                                 405, 408, 409, 411, 412, 413, 416, 429, 499, 500,
                                 501, 503, 504};
#define NCODES (sizeof code_slots / sizeof code_slots[0])
#define CODE_OTHER NCODES

/* Operation kinds tstaged submits; anything else counts as "other". */
static const char *const op_kinds[] = {"put", "copy", "import", "create", "step", "other"};
#define NKINDS (sizeof op_kinds / sizeof op_kinds[0])
#define NOUTCOMES 3

struct route_metrics {
	_Atomic uint64_t codes[NCODES + 1];
	struct ts_histogram latency;
};

struct kind_metrics {
	_Atomic uint64_t outcomes[NOUTCOMES];   /* succeeded, failed, cancelled */
	_Atomic uint64_t bytes;                 /* moved by those whose unit is bytes */
	struct ts_histogram duration;
};

/*
 * Request counters, one set per shard: every request's start and end write
 * them, from every worker thread, so a thread keeps to a shard of its own
 * (threads are dealt shards in turn) and a line two workers both write is
 * never on the request path; the exposition sums the shards.
 */
#define SHARDS 8

struct shard {
	_Alignas(64) _Atomic int64_t in_flight;
	struct route_metrics *routes;           /* nroutes + 1 entries */
};

struct ts_metrics {
	size_t nroutes;                         /* immutable */
	const char *const *patterns;            /* immutable, borrowed */
	struct shard shards[SHARDS];
	_Atomic unsigned next_shard;
	struct kind_metrics kinds[NKINDS];
	_Atomic uint64_t conns[TS_CONN_EVENTS];
	/* connections open on each small-request worker: placement reads them
	 * (accept.c), /metrics shows them */
	_Atomic int64_t *worker_conns;          /* nworkers; set once at start */
	int nworkers;
	_Atomic int64_t lease_device[2];        /* GPU lease memory: bytes, allocations */
	_Atomic int64_t fleet_peers[2];         /* reachable, unreachable (server/fleet.c) */
	_Atomic uint64_t history[2];            /* samples, sampler CPU ns (server/history.c) */
	_Atomic uint64_t fleet_ucx_conns[2];    /* accepted, rejected (server/fleet_ucx.c) */
	_Atomic int64_t fleet_ucx_open;
	_Atomic uint64_t fleet_bytes[2];        /* sent, received (server/fleet_xfer.c, fleet_recv.c) */
	_Atomic int64_t fleet_receives;         /* open (server/fleet_recv.c) */
	_Atomic int64_t fleet_staging;          /* bytes staged by receives (server/fleet_recv.c) */
};

/* The calling thread's shard. Its slot is a per-thread cache, dealt on the
 * thread's first request (any slot is valid for any ts_metrics). */
static struct shard *shard_of(struct ts_metrics *m)
{
	static _Thread_local int slot = -1;

	if (slot < 0)
		slot = (int)(atomic_fetch_add_explicit(&m->next_shard, 1, memory_order_relaxed) %
		             SHARDS);
	return &m->shards[slot];
}

struct ts_metrics *ts_metrics_new(size_t nroutes, const char *const *patterns)
{
	/* the shards' alignment; sizeof is a multiple of it */
	struct ts_metrics *m = aligned_alloc(_Alignof(struct ts_metrics), sizeof *m);

	if (!m)
		return NULL;
	memset(m, 0, sizeof *m);
	m->nroutes = nroutes;
	m->patterns = patterns;
	for (int k = 0; k < SHARDS; k++) {
		struct shard *sh = &m->shards[k];

		sh->routes = calloc(nroutes + 1, sizeof *sh->routes);
		if (!sh->routes) {
			ts_metrics_free(m);
			return NULL;
		}
		for (size_t i = 0; i <= nroutes; i++)
			ts_histogram_init(&sh->routes[i].latency, ts_histogram_request_bounds,
			                  ts_histogram_request_nbounds);
	}
	for (size_t k = 0; k < NKINDS; k++)
		ts_histogram_init(&m->kinds[k].duration, ts_histogram_long_bounds,
		                  ts_histogram_long_nbounds);
	return m;
}

void ts_metrics_free(struct ts_metrics *m)
{
	if (!m)
		return;
	for (int k = 0; k < SHARDS; k++)
		free(m->shards[k].routes);
	free(m->worker_conns);
	free(m);
}

void ts_metrics_request_started(struct ts_metrics *m)
{
	atomic_fetch_add_explicit(&shard_of(m)->in_flight, 1, memory_order_relaxed);
}

int64_t ts_metrics_in_flight(struct ts_metrics *m)
{
	int64_t n = 0;

	/* a request may end on another shard than it began: only the sum holds */
	for (int k = 0; k < SHARDS; k++)
		n += atomic_load_explicit(&m->shards[k].in_flight, memory_order_relaxed);
	return n > 0 ? n : 0;
}

void ts_metrics_history(struct ts_metrics *m, uint64_t samples, uint64_t cpu_ns)
{
	atomic_store_explicit(&m->history[0], samples, memory_order_relaxed);
	atomic_store_explicit(&m->history[1], cpu_ns, memory_order_relaxed);
}

uint64_t ts_metrics_requests_total(struct ts_metrics *m)
{
	uint64_t n = 0;

	for (int k = 0; k < SHARDS; k++)
		for (size_t i = 0; i <= m->nroutes; i++)
			for (size_t c = 0; c <= NCODES; c++)
				n += atomic_load_explicit(&m->shards[k].routes[i].codes[c],
				                          memory_order_relaxed);
	return n;
}

uint64_t ts_metrics_operations_ended(struct ts_metrics *m)
{
	uint64_t n = 0;

	for (size_t k = 0; k < NKINDS; k++)
		for (int s = 0; s < NOUTCOMES; s++)
			n += atomic_load_explicit(&m->kinds[k].outcomes[s], memory_order_relaxed);
	return n;
}

void ts_metrics_record(struct ts_metrics *m, size_t route, int http_code,
                       uint64_t duration_ns)
{
	struct shard *sh = shard_of(m);
	struct route_metrics *r = &sh->routes[route < m->nroutes ? route : m->nroutes];
	size_t c = CODE_OTHER;

	for (size_t i = 0; i < NCODES; i++)
		if (code_slots[i] == http_code)
			c = i;
	atomic_fetch_add_explicit(&r->codes[c], 1, memory_order_relaxed);
	ts_histogram_observe(&r->latency, duration_ns);
	atomic_fetch_sub_explicit(&sh->in_flight, 1, memory_order_relaxed);
}

void ts_metrics_fleet_ucx_conn(struct ts_metrics *m, bool accepted)
{
	atomic_fetch_add_explicit(&m->fleet_ucx_conns[accepted ? 0 : 1], 1, memory_order_relaxed);
}

void ts_metrics_fleet_ucx_open(struct ts_metrics *m, int64_t delta)
{
	atomic_fetch_add_explicit(&m->fleet_ucx_open, delta, memory_order_relaxed);
}

void ts_metrics_fleet_bytes(struct ts_metrics *m, bool sent, uint64_t n)
{
	if (m)
		atomic_fetch_add_explicit(&m->fleet_bytes[sent ? 0 : 1], n, memory_order_relaxed);
}

void ts_metrics_fleet_receives(struct ts_metrics *m, int64_t dopen, int64_t dstaging)
{
	if (!m)
		return;
	atomic_fetch_add_explicit(&m->fleet_receives, dopen, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->fleet_staging, dstaging, memory_order_relaxed);
}

void ts_metrics_fleet_peers(struct ts_metrics *m, int64_t reachable, int64_t unreachable)
{
	atomic_store_explicit(&m->fleet_peers[0], reachable, memory_order_relaxed);
	atomic_store_explicit(&m->fleet_peers[1], unreachable, memory_order_relaxed);
}

const char *ts_metrics_outcome_name(enum ts_op_state state)
{
	switch (state) {
	case TS_OP_SUCCEEDED: return "succeeded";
	case TS_OP_CANCELLED: return "cancelled";
	default: return "failed";
	}
}

static int outcome_slot(enum ts_op_state state)
{
	return state == TS_OP_SUCCEEDED ? 0 : state == TS_OP_CANCELLED ? 2 : 1;
}

void ts_metrics_operation_ended(struct ts_metrics *m, const struct ts_op_end *end)
{
	size_t k = NKINDS - 1;

	for (size_t i = 0; i + 1 < NKINDS; i++)
		if (strcmp(end->kind, op_kinds[i]) == 0)
			k = i;
	atomic_fetch_add_explicit(&m->kinds[k].outcomes[outcome_slot(end->state)], 1,
	                          memory_order_relaxed);
	if (strcmp(end->unit, "bytes") == 0)
		atomic_fetch_add_explicit(&m->kinds[k].bytes, end->done_units, memory_order_relaxed);
	ts_histogram_observe(&m->kinds[k].duration, end->run_ns);
}

/* ---- the exposition -------------------------------------------------------- */

static void family(struct ts_textbuf *o, const char *name, const char *type, const char *help)
{
	ts_textbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * Writes a histogram's samples: name_bucket{labels,le=...}, name_sum and
 * name_count. labels is "" or a run of label pairs without braces.
 */
static void histogram_of(struct ts_textbuf *o, const char *name, const char *labels,
                         const struct ts_histogram *h, const struct ts_histogram_snapshot *sp)
{
	const struct ts_histogram_snapshot *s = sp;
	const char *sep = labels[0] ? "," : "";

	for (size_t b = 0; b < h->nbounds; b++)
		ts_textbuf_printf(o, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep,
		                  h->bounds[b], (unsigned long long)s->cumulative[b]);
	ts_textbuf_printf(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
	                  (unsigned long long)s->count);
	if (labels[0])
		ts_textbuf_printf(o, "%s_sum{%s} %.9f\n%s_count{%s} %llu\n", name, labels,
		                  s->sum_seconds, name, labels, (unsigned long long)s->count);
	else
		ts_textbuf_printf(o, "%s_sum %.9f\n%s_count %llu\n", name, s->sum_seconds, name,
		                  (unsigned long long)s->count);
}

static void histogram(struct ts_textbuf *o, const char *name, const char *labels,
                      const struct ts_histogram *h)
{
	struct ts_histogram_snapshot s;

	ts_histogram_read(h, &s);
	histogram_of(o, name, labels, h, &s);
}

/* Route i's latency summed over the shards. */
static void route_latency(const struct ts_metrics *m, size_t i, struct ts_histogram_snapshot *out)
{
	memset(out, 0, sizeof *out);
	for (int k = 0; k < SHARDS; k++) {
		struct ts_histogram_snapshot s;

		ts_histogram_read(&m->shards[k].routes[i].latency, &s);
		for (size_t b = 0; b <= TS_HISTOGRAM_MAX; b++)
			out->cumulative[b] += s.cumulative[b];
		out->count += s.count;
		out->sum_seconds += s.sum_seconds;
	}
}

/* The method and path of route i ("GET", "/v1/memory"); "other" and
 * "unmatched" for requests no route matched. */
static void route_labels(const struct ts_metrics *m, size_t i, char *buf, size_t cap)
{
	const char *p = i < m->nroutes ? m->patterns[i] : NULL;
	const char *sp = p ? strchr(p, ' ') : NULL;

	if (!sp)
		snprintf(buf, cap, "method=\"other\",route=\"unmatched\"");
	else
		snprintf(buf, cap, "method=\"%.*s\",route=\"%s\"", (int)(sp - p), p, sp + 1);
}

uint64_t ts_metrics_connection(struct ts_metrics *m, enum ts_conn_event e)
{
	return atomic_fetch_add_explicit(&m->conns[e], 1, memory_order_relaxed) + 1;
}

ts_status ts_metrics_set_workers(struct ts_metrics *m, int n)
{
	if (n < 1 || m->worker_conns)
		return TS_INVALID_ARGUMENT;
	m->worker_conns = calloc((size_t)n, sizeof *m->worker_conns);
	if (!m->worker_conns)
		return TS_RESOURCE_EXHAUSTED;
	m->nworkers = n;
	return TS_OK;
}

void ts_metrics_worker_conns_add(struct ts_metrics *m, int w, int delta)
{
	assert(w >= 0 && w < m->nworkers);
	atomic_fetch_add_explicit(&m->worker_conns[w], delta, memory_order_relaxed);
}

void ts_metrics_lease_device_add(struct ts_metrics *m, int64_t bytes, int allocs)
{
	atomic_fetch_add_explicit(&m->lease_device[0], bytes, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->lease_device[1], allocs, memory_order_relaxed);
}

int64_t ts_metrics_worker_conns(const struct ts_metrics *m, int w)
{
	assert(w >= 0 && w < m->nworkers);
	return atomic_load_explicit(&m->worker_conns[w], memory_order_relaxed);
}

static void render_http(struct ts_textbuf *o, struct ts_metrics *m)
{
	static const char *const daemons[2] = {"small", "bulk"};
	char labels[320];
	int64_t in_flight = ts_metrics_in_flight(m);

	family(o, "tstage_http_connections_total", "counter",
	       "Connections accepted and served, by the daemon their first request chose "
	       "(bulk: PUT, POST or PATCH; small: the rest).");
	for (int d = 0; d < 2; d++)
		ts_textbuf_printf(o, "tstage_http_connections_total{daemon=\"%s\"} %llu\n",
		                  daemons[d],
		                  (unsigned long long)atomic_load_explicit(&m->conns[d],
		                                                           memory_order_relaxed));
	family(o, "tstage_http_worker_connections", "gauge",
	       "Connections open on each small-request worker (--threads of them; one fills "
	       "to --worker-fill before the next takes any).");
	for (int w = 0; w < m->nworkers; w++)
		ts_textbuf_printf(o, "tstage_http_worker_connections{worker=\"%d\"} %lld\n", w,
		                  (long long)ts_metrics_worker_conns(m, w));
	family(o, "tstage_http_connections_refused_total", "counter",
	       "Connections answered 503 past --max-connections or --max-connections-per-ip.");
	ts_textbuf_printf(o, "tstage_http_connections_refused_total %llu\n",
	                  (unsigned long long)atomic_load_explicit(&m->conns[TS_CONN_REFUSED],
	                                                           memory_order_relaxed));
	family(o, "tstage_lease_device_bytes", "gauge",
	       "Device memory GPU leases hold, outside the device pools (a read lease's copy "
	       "of its version, a writer's memory), until released or their client exits.");
	ts_textbuf_printf(o, "tstage_lease_device_bytes %lld\n",
	                  (long long)atomic_load_explicit(&m->lease_device[0],
	                                                  memory_order_relaxed));
	family(o, "tstage_lease_device_allocations", "gauge",
	       "Allocations of device memory GPU leases hold (one per leased shard).");
	ts_textbuf_printf(o, "tstage_lease_device_allocations %lld\n",
	                  (long long)atomic_load_explicit(&m->lease_device[1],
	                                                  memory_order_relaxed));

	family(o, "tstage_http_requests_in_flight", "gauge",
	       "HTTP requests received and not yet answered in full.");
	ts_textbuf_printf(o, "tstage_http_requests_in_flight %lld\n", (long long)in_flight);
	family(o, "tstage_http_requests_total", "counter",
	       "HTTP requests answered, by method, route and status code.");
	for (size_t i = 0; i <= m->nroutes; i++) {
		route_labels(m, i, labels, sizeof labels);
		for (size_t c = 0; c <= NCODES; c++) {
			uint64_t v = 0;

			for (int k = 0; k < SHARDS; k++)
				v += atomic_load_explicit(&m->shards[k].routes[i].codes[c],
				                          memory_order_relaxed);

			if (!v)
				continue;
			if (c == CODE_OTHER)
				ts_textbuf_printf(o, "tstage_http_requests_total{%s,code=\"other\"} "
				                     "%llu\n", labels, (unsigned long long)v);
			else
				ts_textbuf_printf(o, "tstage_http_requests_total{%s,code=\"%d\"} "
				                     "%llu\n",
				                  labels, code_slots[c], (unsigned long long)v);
		}
	}
	family(o, "tstage_http_request_duration_seconds", "histogram",
	       "Time from the first byte of a request to the end of its response.");
	for (size_t i = 0; i <= m->nroutes; i++) {
		struct ts_histogram_snapshot s;

		route_latency(m, i, &s);
		if (!s.count)
			continue;
		route_labels(m, i, labels, sizeof labels);
		histogram_of(o, "tstage_http_request_duration_seconds", labels,
		             &m->shards[0].routes[i].latency, &s);
	}
}

static void render_operations(struct ts_textbuf *o, struct ts_metrics *m,
                              const struct ts_core *core)
{
	static const char *const outcomes[NOUTCOMES] = {"succeeded", "failed", "cancelled"};
	uint64_t counts[TS_OP_CANCELLED + 1];
	char labels[64];

	if (core->env.operations) {
		ts_op_counts(core->env.operations, counts);
		family(o, "tstage_operations_listed", "gauge",
		       "Operations listed now, by state (finished ones until retention drops them).");
		for (int s = TS_OP_PENDING; s <= TS_OP_CANCELLED; s++)
			ts_textbuf_printf(o, "tstage_operations_listed{state=\"%s\"} %llu\n",
			                  ts_op_state_name((enum ts_op_state)s),
			                  (unsigned long long)counts[s]);
	}
	family(o, "tstage_operations_total", "counter",
	       "Operations ended since start, by kind and outcome.");
	for (size_t k = 0; k < NKINDS; k++)
		for (int s = 0; s < NOUTCOMES; s++) {
			uint64_t v = atomic_load_explicit(&m->kinds[k].outcomes[s],
			                                  memory_order_relaxed);

			ts_textbuf_printf(o, "tstage_operations_total{kind=\"%s\",outcome=\"%s\"} "
			                     "%llu\n", op_kinds[k], outcomes[s], (unsigned long long)v);
		}
	family(o, "tstage_operation_moved_bytes_total", "counter",
	       "Bytes that ended operations moved (those counted in bytes), by kind.");
	for (size_t k = 0; k < NKINDS; k++)
		ts_textbuf_printf(o, "tstage_operation_moved_bytes_total{kind=\"%s\"} %llu\n",
		                  op_kinds[k],
		                  (unsigned long long)atomic_load_explicit(&m->kinds[k].bytes,
		                                                           memory_order_relaxed));
	family(o, "tstage_operation_duration_seconds", "histogram",
	       "Time ended operations ran (0 for those cancelled before they started), by kind.");
	for (size_t k = 0; k < NKINDS; k++) {
		snprintf(labels, sizeof labels, "kind=\"%s\"", op_kinds[k]);
		histogram(o, "tstage_operation_duration_seconds", labels, &m->kinds[k].duration);
	}
}

/* ---- memory ---------------------------------------------------------------- */

static const struct {
	const char *name, *type, *help;
	size_t offset;
} space_series[] = {
	{"tstage_memory_in_use_bytes", "gauge",
	 "Bytes allocated in a (device, memory kind) space; sums over devices add up.",
	 offsetof(struct ts_space_stats, bytes_in_use)},
	{"tstage_memory_peak_bytes", "gauge",
	 "Peak bytes in use in the space since start or the last resetPeak.",
	 offsetof(struct ts_space_stats, peak_bytes_in_use)},
	{"tstage_memory_live_allocations", "gauge", "Allocations of the space alive now.",
	 offsetof(struct ts_space_stats, live_allocs)},
	{"tstage_memory_allocations_total", "counter", "Allocations made in the space since start.",
	 offsetof(struct ts_space_stats, num_allocs)},
	{"tstage_memory_refusals_total", "counter",
	 "Allocations and uploads the space refused for want of memory since start.",
	 offsetof(struct ts_space_stats, refusals)},
};

static const struct {
	const char *name, *help;
	size_t offset;
} pool_series[] = {
	{"tstage_pool_limit_bytes", "Limit of a memory pool (node-wide host pools listed once).",
	 offsetof(struct ts_pool_stats, limit)},
	{"tstage_pool_in_use_bytes", "Bytes in use in the pool by every space drawing from it.",
	 offsetof(struct ts_pool_stats, bytes_in_use)},
	{"tstage_pool_reserved_bytes",
	 "Bytes the pool holds from the system: a device pool's region reserved at start "
	 "(what nvidia-smi and DCGM show as used), pinned segments.",
	 offsetof(struct ts_pool_stats, bytes_reserved)},
	{"tstage_pool_peak_reserved_bytes", "Peak of tstage_pool_reserved_bytes.",
	 offsetof(struct ts_pool_stats, peak_bytes_reserved)},
	{"tstage_pool_largest_free_block_bytes", "Largest single allocation the pool fits now.",
	 offsetof(struct ts_pool_stats, largest_free_block_bytes)},
};

/* A pool of pinned segments only: what it keeps, gives back and pins again. */
static const struct {
	const char *name, *type, *help;
	size_t offset;
	bool ns;                      /* a count of nanoseconds, rendered in seconds */
} segment_series[] = {
	{"tstage_pool_segments", "gauge", "Pinned segments the pool holds now.",
	 offsetof(struct ts_pool_stats, segments), false},
	{"tstage_pool_keep_bytes", "gauge",
	 "Idle segment bytes the pool keeps reserved for reuse (--pinned-host-keep); "
	 "segments idle beyond it go back to the system.",
	 offsetof(struct ts_pool_stats, keep_bytes), false},
	{"tstage_pool_segments_pinned_total", "counter", "Segments pinned since start.",
	 offsetof(struct ts_pool_stats, segments_pinned), false},
	{"tstage_pool_segments_released_total", "counter",
	 "Idle segments given back to the system since start.",
	 offsetof(struct ts_pool_stats, segments_released), false},
	{"tstage_pool_pinned_bytes_total", "counter", "Bytes pinned since start.",
	 offsetof(struct ts_pool_stats, pinned_bytes), false},
	{"tstage_pool_released_bytes_total", "counter",
	 "Bytes of segments given back to the system since start.",
	 offsetof(struct ts_pool_stats, released_bytes), false},
	{"tstage_pool_repinned_bytes_total", "counter",
	 "Bytes pinned again: pinned below the highest reservation the pool has had, "
	 "after it gave them back.",
	 offsetof(struct ts_pool_stats, repinned_bytes), false},
	{"tstage_pool_pin_seconds_total", "counter", "Time spent pinning segments.",
	 offsetof(struct ts_pool_stats, pin_ns), true},
	{"tstage_pool_repin_seconds_total", "counter",
	 "The part of tstage_pool_pin_seconds_total spent pinning bytes again.",
	 offsetof(struct ts_pool_stats, repin_ns), true},
};

static void render_spaces(struct ts_textbuf *o, const struct ts_core *core)
{
	size_t n = ts_memory_space_count(core->env.memory);
	struct ts_space_stats *st = calloc(n ? n : 1, sizeof *st);

	if (!st) {
		o->failed = 1;
		return;
	}
	for (size_t i = 0; i < n; i++)
		ts_space_stats(ts_memory_space_at(core->env.memory, i), &st[i]);
	for (size_t g = 0; g < sizeof space_series / sizeof space_series[0]; g++) {
		family(o, space_series[g].name, space_series[g].type, space_series[g].help);
		for (size_t i = 0; i < n; i++) {
			const struct ts_space *sp = ts_memory_space_at(core->env.memory, i);
			uint64_t v = *(const uint64_t *)((const char *)&st[i] + space_series[g].offset);

			ts_textbuf_printf(o,
			                  "%s{device=\"%s\",memory_kind=\"%s\",pool=\"%s\"} %llu\n",
			                  space_series[g].name,
			                  ts_device_props(ts_space_device(sp))->id,
			                  ts_memory_kind_name(ts_space_kind(sp)),
			                  ts_space_pool_name(sp), (unsigned long long)v);
		}
	}
	free(st);
}

static void render_pools(struct ts_textbuf *o, const struct ts_core *core)
{
	size_t n = ts_memory_pool_count(core->env.memory);

	for (size_t g = 0; g < sizeof pool_series / sizeof pool_series[0]; g++) {
		family(o, pool_series[g].name, "gauge", pool_series[g].help);
		for (size_t i = 0; i < n; i++) {
			struct ts_pool_stats ps;
			uint64_t v;

			ts_memory_pool_stats(core->env.memory, i, &ps);
			v = *(const uint64_t *)((const char *)&ps + pool_series[g].offset);
			if (ps.device)
				ts_textbuf_printf(o, "%s{pool=\"%s\",memory_kind=\"%s\","
				                     "device=\"%s\"} %llu\n",
				                  pool_series[g].name, ps.name,
				                  ts_memory_kind_name(ps.kind),
				                  ts_device_props(ps.device)->id,
				                  (unsigned long long)v);
			else
				ts_textbuf_printf(o, "%s{pool=\"%s\",memory_kind=\"%s\"} %llu\n",
				                  pool_series[g].name, ps.name,
				                  ts_memory_kind_name(ps.kind),
				                  (unsigned long long)v);
		}
	}
	for (size_t g = 0; g < sizeof segment_series / sizeof segment_series[0]; g++) {
		family(o, segment_series[g].name, segment_series[g].type, segment_series[g].help);
		for (size_t i = 0; i < n; i++) {
			struct ts_pool_stats ps;
			uint64_t v;

			ts_memory_pool_stats(core->env.memory, i, &ps);
			if (!ps.segmented)
				continue;
			v = *(const uint64_t *)((const char *)&ps + segment_series[g].offset);
			if (segment_series[g].ns)
				ts_textbuf_printf(o, "%s{pool=\"%s\",memory_kind=\"%s\"} %.6f\n",
				                  segment_series[g].name, ps.name,
				                  ts_memory_kind_name(ps.kind), (double)v / 1e9);
			else
				ts_textbuf_printf(o, "%s{pool=\"%s\",memory_kind=\"%s\"} %llu\n",
				                  segment_series[g].name, ps.name,
				                  ts_memory_kind_name(ps.kind),
				                  (unsigned long long)v);
		}
	}
}

/* ---- devices and transfers -------------------------------------------------- */

/*
 * A PCI bus id as the DCGM exporter and nvidia-smi write it, with an 8-digit
 * domain ("00000000:3B:00.0"); cudaDeviceGetPCIBusId writes 4 ("0000:3B:00.0").
 * "" stays "".
 */
static void dcgm_bus_id(const char *in, char *out, size_t cap)
{
	const char *colon = strchr(in, ':');
	size_t domain = colon ? (size_t)(colon - in) : 0;

	if (!colon || domain >= 8)
		snprintf(out, cap, "%s", in);
	else
		snprintf(out, cap, "%.*s%s", (int)(8 - domain), "00000000", in);
}

static void render_devices(struct ts_textbuf *o, const struct ts_core *core)
{
	static const char *const directions[] = {"h2d", "d2h", "d2d", "h2h"};
	size_t n = ts_device_set_count(core->env.devices);

	family(o, "tstage_device_info", "gauge",
	       "A device tstaged serves (value 1); CUDA devices carry gpu_uuid and pci_bus_id "
	       "to join with DCGM exporter series.");
	for (size_t i = 0; i < n; i++) {
		const struct ts_device_props *p = ts_device_props(ts_device_set_at(core->env.devices, i));
		char bus[48];

		dcgm_bus_id(p->pci_bus_id, bus, sizeof bus);
		ts_textbuf_printf(o, "tstage_device_info{device=\"%s\",backend=\"%s\","
		                     "simulated=\"%s\",gpu_uuid=\"%s\",pci_bus_id=\"%s\"} 1\n",
		                  p->id, ts_backend_name(p->backend),
		                  p->simulated ? "true" : "false", p->uuid, bus);
	}
	family(o, "tstage_device_healthy", "gauge", "1 unless the device hit a sticky error.");
	for (size_t i = 0; i < n; i++) {
		struct ts_device *d = ts_device_set_at(core->env.devices, i);

		ts_textbuf_printf(o, "tstage_device_healthy{device=\"%s\"} %d\n",
		                  ts_device_props(d)->id, ts_device_broken(d) ? 0 : 1);
	}
	family(o, "tstage_device_transfer_bytes_total", "counter",
	       "Bytes of the copies a device's queues accepted, by direction.");
	for (size_t i = 0; i < n; i++) {
		struct ts_device *d = ts_device_set_at(core->env.devices, i);

		for (int k = TS_COPY_H2D; k <= TS_COPY_H2H; k++) {
			uint64_t v = ts_device_copied_bytes(d, (enum ts_copy_kind)k);

			ts_textbuf_printf(o, "tstage_device_transfer_bytes_total{device=\"%s\","
			                     "direction=\"%s\"} %llu\n",
			                  ts_device_props(d)->id, directions[k], (unsigned long long)v);
		}
	}
	family(o, "tstage_device_collective_bytes_total", "counter",
	       "Bytes of a device's buffers in collectives over several devices (the "
	       "gradients a data-parallel step all-reduces).");
	for (size_t i = 0; i < n; i++) {
		struct ts_device *d = ts_device_set_at(core->env.devices, i);

		ts_textbuf_printf(o, "tstage_device_collective_bytes_total{device=\"%s\"} %llu\n",
		                  ts_device_props(d)->id,
		                  (unsigned long long)ts_device_collective_bytes(d));
	}
	family(o, "tstage_device_copy_queue_depth", "gauge",
	       "Copies accepted by a device's queues and not yet run (sim and cpu devices; "
	       "a CUDA stream does not say).");
	for (size_t i = 0; i < n; i++) {
		struct ts_device *d = ts_device_set_at(core->env.devices, i);
		uint64_t depth;

		if (ts_device_copies_queued(d, &depth))
			ts_textbuf_printf(o, "tstage_device_copy_queue_depth{device=\"%s\"} %llu\n",
			                  ts_device_props(d)->id, (unsigned long long)depth);
	}
}


/* The state dir's counters (jobs/state.h). */
static void render_state(struct ts_textbuf *o, struct ts_state *state)
{
	struct ts_state_stats st;

	ts_state_stats(state, &st);
	family(o, "tstage_state_restore_skipped_total", "counter",
	       "Entries of the state dir that the last start could not restore, by reason.");
	for (int r = 0; r < TS_STATE_SKIP_COUNT; r++)
		ts_textbuf_printf(o, "tstage_state_restore_skipped_total{reason=\"%s\"} %llu\n",
		                  ts_state_skip_name((enum ts_state_skip)r),
		                  (unsigned long long)st.skipped[r]);
	family(o, "tstage_state_restored", "gauge",
	       "Arrays and models restored from the state dir at start.");
	ts_textbuf_printf(o, "tstage_state_restored{kind=\"array\"} %llu\n",
	                  (unsigned long long)st.restored_arrays);
	ts_textbuf_printf(o, "tstage_state_restored{kind=\"model\"} %llu\n",
	                  (unsigned long long)st.restored_models);
	family(o, "tstage_state_saves_total", "counter", "Saves of the state dir, by outcome.");
	ts_textbuf_printf(o, "tstage_state_saves_total{outcome=\"ok\"} %llu\n",
	                  (unsigned long long)st.saves);
	ts_textbuf_printf(o, "tstage_state_saves_total{outcome=\"failed\"} %llu\n",
	                  (unsigned long long)st.save_failures);
	family(o, "tstage_state_last_save_timestamp_seconds", "gauge",
	       "When the last save of the state dir finished (0: none since start).");
	ts_textbuf_printf(o, "tstage_state_last_save_timestamp_seconds %.3f\n",
	                  (double)st.last_save_wall_ns / 1e9);
}

static void render_transfers(struct ts_textbuf *o, const struct ts_core *core)
{
	uint64_t moved[TS_MEM_KIND_COUNT][TS_MEM_KIND_COUNT], count = 0, bytes = 0;

	if (core->env.stager) {
		ts_stager_totals(core->env.stager, moved);
		family(o, "tstage_transfer_bytes_total", "counter",
		       "Bytes moved, by source and destination memory kind (HTTP bodies count as "
		       "unpinned_host).");
		for (int a = 0; a < TS_MEM_KIND_COUNT; a++)
			for (int b = 0; b < TS_MEM_KIND_COUNT; b++)
				ts_textbuf_printf(o, "tstage_transfer_bytes_total{src_kind=\"%s\","
				                     "dst_kind=\"%s\"} %llu\n",
				                  ts_memory_kind_name((enum ts_memory_kind)a),
				                  ts_memory_kind_name((enum ts_memory_kind)b),
				                  (unsigned long long)moved[a][b]);
		family(o, "tstage_implicit_transfer_bytes_total", "counter",
		       "Bytes of uncommitted arrays moved because an operation needed them elsewhere.");
		ts_textbuf_printf(o, "tstage_implicit_transfer_bytes_total %llu\n",
		                  (unsigned long long)ts_stager_implicit(core->env.stager));
	}
	if (core->state)
		render_state(o, core->state);
	if (core->env.catalog) {
		ts_catalog_totals(core->env.catalog, &count, &bytes);
		family(o, "tstage_arrays", "gauge", "Arrays in the catalog.");
		ts_textbuf_printf(o, "tstage_arrays %llu\n", (unsigned long long)count);
		family(o, "tstage_array_bytes", "gauge", "Bytes of the arrays in the catalog.");
		ts_textbuf_printf(o, "tstage_array_bytes %llu\n", (unsigned long long)bytes);
	}
}

static void render_training(struct ts_textbuf *o, const struct ts_core *core)
{
	const struct ts_histogram *h;
	struct ts_histogram_snapshot s;

	if (!core->env.models)
		return;
	h = ts_model_registry_step_times(core->env.models);
	ts_histogram_read(h, &s);
	family(o, "tstage_training_steps_total", "counter", "Training steps run since start.");
	ts_textbuf_printf(o, "tstage_training_steps_total %llu\n", (unsigned long long)s.count);
	family(o, "tstage_training_step_duration_seconds", "histogram",
	       "Wall time of one training step, transfers it waited for included.");
	histogram(o, "tstage_training_step_duration_seconds", "", h);
}

/* ---- the process ------------------------------------------------------------- */

/* Open descriptors of this process (/proc/self/fd less the one reading it). */
static long open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	long n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;
}

/* utime + stime in seconds, vsize and rss in bytes, from /proc/self/stat. */
static bool proc_stat(double *cpu, uint64_t *vsize, uint64_t *rss)
{
	char buf[1024], *p;
	unsigned long utime, stime, vs;
	long rs, tck = sysconf(_SC_CLK_TCK), psz = sysconf(_SC_PAGESIZE);
	FILE *f = fopen("/proc/self/stat", "r");
	size_t n;

	if (!f)
		return false;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');     /* the command name may hold spaces */
	if (!p || tck <= 0 || psz <= 0 ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %*d %*d %*d %*d "
	                  "%*d %*d %*u %lu %ld", &utime, &stime, &vs, &rs) != 4)
		return false;
	*cpu = (double)(utime + stime) / (double)tck;
	*vsize = vs;
	*rss = (uint64_t)(rs > 0 ? rs : 0) * (uint64_t)psz;
	return true;
}

static void render_process(struct ts_textbuf *o, const struct ts_core *core)
{
	struct rlimit rl;
	double cpu;
	uint64_t vsize, rss;
	long fds = open_fds();

	if (proc_stat(&cpu, &vsize, &rss)) {
		family(o, "process_cpu_seconds_total", "counter", "User and system CPU time spent.");
		ts_textbuf_printf(o, "process_cpu_seconds_total %.2f\n", cpu);
		family(o, "process_resident_memory_bytes", "gauge", "Resident memory size.");
		ts_textbuf_printf(o, "process_resident_memory_bytes %llu\n",
		                  (unsigned long long)rss);
		family(o, "process_virtual_memory_bytes", "gauge", "Virtual memory size.");
		ts_textbuf_printf(o, "process_virtual_memory_bytes %llu\n",
		                  (unsigned long long)vsize);
	}
	if (fds >= 0) {
		family(o, "process_open_fds", "gauge", "Open file descriptors.");
		ts_textbuf_printf(o, "process_open_fds %ld\n", fds);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		family(o, "process_max_fds", "gauge", "Limit of open file descriptors.");
		ts_textbuf_printf(o, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
	}
	family(o, "process_start_time_seconds", "gauge",
	       "Start time of the process since the Unix epoch.");
	ts_textbuf_printf(o, "process_start_time_seconds %.3f\n",
	                  (double)core->started_wall_ns / 1e9);
}

char *ts_metrics_render(struct ts_metrics *m, const struct ts_core *core, size_t *len)
{
	struct ts_textbuf o;

	ts_textbuf_init(&o);
	family(&o, "tstage_build_info", "gauge", "Build of the running tstaged (value 1).");
	ts_textbuf_printf(&o, "tstage_build_info{version=\"%s\",revision=\"%s\",cuda=\"%s\"} 1\n",
	                  ts_version, ts_git_rev,
#ifdef TS_HAVE_CUDA
	                  "true"
#else
	                  "false"
#endif
	);
	family(&o, "tstage_fleet_peers", "gauge",
	       "Peers named by --peers, by whether they answered their last poll.");
	ts_textbuf_printf(&o, "tstage_fleet_peers{state=\"reachable\"} %lld\n",
	                  (long long)atomic_load_explicit(&m->fleet_peers[0],
	                                                  memory_order_relaxed));
	ts_textbuf_printf(&o, "tstage_fleet_peers{state=\"unreachable\"} %lld\n",
	                  (long long)atomic_load_explicit(&m->fleet_peers[1],
	                                                  memory_order_relaxed));
	family(&o, "tstage_history_samples_total", "counter",
	       "Samples the memory history's sampler has taken (one a second).");
	ts_textbuf_printf(&o, "tstage_history_samples_total %llu\n",
	                  (unsigned long long)atomic_load_explicit(&m->history[0],
	                                                           memory_order_relaxed));
	family(&o, "tstage_history_sampler_cpu_seconds_total", "counter",
	       "CPU time the memory history's sampler spent reading the counters and recording them.");
	ts_textbuf_printf(&o, "tstage_history_sampler_cpu_seconds_total %.6f\n",
	                  (double)atomic_load_explicit(&m->history[1], memory_order_relaxed) / 1e9);
	family(&o, "tstage_fleet_ucx_connections_total", "counter",
	       "Endpoints that connected to the fleet port, by whether their ticket admitted them.");
	ts_textbuf_printf(&o, "tstage_fleet_ucx_connections_total{result=\"accepted\"} %llu\n",
	                  (unsigned long long)atomic_load_explicit(&m->fleet_ucx_conns[0],
	                                                           memory_order_relaxed));
	ts_textbuf_printf(&o, "tstage_fleet_ucx_connections_total{result=\"rejected\"} %llu\n",
	                  (unsigned long long)atomic_load_explicit(&m->fleet_ucx_conns[1],
	                                                           memory_order_relaxed));
	family(&o, "tstage_fleet_ucx_endpoints", "gauge",
	       "Admitted endpoints open on the fleet port now.");
	ts_textbuf_printf(&o, "tstage_fleet_ucx_endpoints %lld\n",
	                  (long long)atomic_load_explicit(&m->fleet_ucx_open,
	                                                  memory_order_relaxed));
	family(&o, "tstage_fleet_receives_open", "gauge",
	       "Cross-node receives open here now (admitted, neither committed nor ended).");
	ts_textbuf_printf(&o, "tstage_fleet_receives_open %lld\n",
	                  (long long)atomic_load_explicit(&m->fleet_receives,
	                                                  memory_order_relaxed));
	family(&o, "tstage_fleet_staging_bytes", "gauge",
	       "Bytes of staging memory that cross-node receives hold now, open or waiting "
	       "for their endpoints to close.");
	ts_textbuf_printf(&o, "tstage_fleet_staging_bytes %lld\n",
	                  (long long)atomic_load_explicit(&m->fleet_staging,
	                                                  memory_order_relaxed));
	family(&o, "tstage_fleet_transfer_bytes_total", "counter",
	       "Bytes of cross-node copies: written to peers (sent) and arrived from them "
	       "(received, counted when the receive is committed).");
	ts_textbuf_printf(&o, "tstage_fleet_transfer_bytes_total{direction=\"sent\"} %llu\n",
	                  (unsigned long long)atomic_load_explicit(&m->fleet_bytes[0],
	                                                           memory_order_relaxed));
	ts_textbuf_printf(&o, "tstage_fleet_transfer_bytes_total{direction=\"received\"} %llu\n",
	                  (unsigned long long)atomic_load_explicit(&m->fleet_bytes[1],
	                                                           memory_order_relaxed));
	family(&o, "tstage_uptime_seconds", "gauge", "Seconds since tstaged started.");
	ts_textbuf_printf(&o, "tstage_uptime_seconds %.3f\n",
	                  (double)(ts_now_ns() - core->started_ns) / 1e9);
	render_process(&o, core);
	render_devices(&o, core);
	render_spaces(&o, core);
	render_pools(&o, core);
	render_operations(&o, m, core);
	render_transfers(&o, core);
	render_training(&o, core);
	render_http(&o, m);
	return ts_textbuf_take(&o, len);
}
