/*
 * memory_history.c - what the daemon's history (history.h) records and GET
 * /v1/memory/history, which answers it.
 *
 * The series, fixed at start from the memory table and the device set: the
 * bytes in use of every (device, memory kind) space; the bytes in use and
 * the limit of every pool (node-wide host pools once); the bytes each
 * device's queues copied, per direction; HTTP requests answered; operations
 * pending, running and ended. They are read once a second from the same
 * counters /v1/memory and /metrics read (atomics, and the operation
 * registry's counts under its short lock); no request waits on the sampler.
 */
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "memory/space.h"
#include "server/history.h"
#include "server/server_int.h"
#include "server/server_routes.h"

#define DIRECTIONS 4    /* TS_COPY_H2D .. TS_COPY_H2H */

static const char *const direction_names[DIRECTIONS] = {"h2d", "d2h", "d2d", "h2h"};

/* Where each group of series begins. The memory table's spaces and pools
 * and the device set are fixed at start, so the layout is too. */
struct layout {
	size_t nspaces, npools, ndevices;
	size_t spaces, pool_use, pool_limit, transfers, requests, ops, total;
};

static struct layout layout_of(const struct ts_server *srv)
{
	struct layout l;

	l.nspaces = ts_memory_space_count(srv->memory);
	l.npools = ts_memory_pool_count(srv->memory);
	l.ndevices = ts_device_set_count(srv->devices);
	l.spaces = 0;
	l.pool_use = l.spaces + l.nspaces;
	l.pool_limit = l.pool_use + l.npools;
	l.transfers = l.pool_limit + l.npools;
	l.requests = l.transfers + l.ndevices * DIRECTIONS;
	l.ops = l.requests + 1;             /* pending, running, ended */
	l.total = l.ops + 3;
	return l;
}

static void sample(void *cls, uint64_t *v)
{
	struct ts_server *srv = cls;
	struct layout l = layout_of(srv);
	uint64_t counts[TS_OP_CANCELLED + 1] = {0};

	for (size_t i = 0; i < l.nspaces; i++) {
		struct ts_space_stats st;

		ts_space_stats(ts_memory_space_at(srv->memory, i), &st);
		v[l.spaces + i] = st.bytes_in_use;
	}
	for (size_t i = 0; i < l.npools; i++) {
		struct ts_pool_stats ps;

		ts_memory_pool_stats(srv->memory, i, &ps);
		v[l.pool_use + i] = ps.bytes_in_use;
		v[l.pool_limit + i] = ps.limit;
	}
	for (size_t d = 0; d < l.ndevices; d++)
		for (int k = 0; k < DIRECTIONS; k++)
			v[l.transfers + d * DIRECTIONS + (size_t)k] =
				ts_device_copied_bytes(ts_device_set_at(srv->devices, d),
				                       (enum ts_copy_kind)(TS_COPY_H2D + k));
	v[l.requests] = ts_metrics_requests_total(srv->metrics);
	ts_op_counts(srv->core.env.operations, counts);
	v[l.ops] = counts[TS_OP_PENDING];
	v[l.ops + 1] = counts[TS_OP_RUNNING];
	v[l.ops + 2] = ts_metrics_operations_ended(srv->metrics);
}

ts_status ts__history_start(struct ts_server *srv, struct ts_error *err)
{
	struct layout l = layout_of(srv);
	enum ts_history_fold *fold = calloc(l.total, sizeof *fold);
	ts_status st;

	if (!fold)
		return ts_error_oom(err, "no memory for the history");
	/* gauges (calloc's 0) but for the counters */
	for (size_t i = l.transfers; i < l.requests + 1; i++)
		fold[i] = TS_HISTORY_COUNTER;
	fold[l.ops + 2] = TS_HISTORY_COUNTER;
	st = ts_history_new(&(struct ts_history_config){.nseries = l.total, .fold = fold,
	                                                .sample = sample, .cls = srv},
	                    &srv->history, err);
	free(fold);
	return st;
}

void ts__history_stop(struct ts_server *srv)
{
	ts_history_free(srv->history);
	srv->history = NULL;
}

/* ---- GET /v1/memory/history ------------------------------------------------------ */

/*
 * The answer is written as text: a full 1 s ring is tens of thousands of
 * numbers, and a jansson value for each would cost the worker that serves it
 * about ten times as long as printing them. Names (device ids, pools) go
 * through jansson's string encoder.
 */
struct out {
	char *buf;
	size_t len, cap;
	bool failed;
};

static bool out_room(struct out *o, size_t n)
{
	char *grown;
	size_t cap;

	if (o->failed)
		return false;
	if (o->len + n + 1 <= o->cap)
		return true;
	cap = (o->cap ? o->cap : 4096);
	while (cap < o->len + n + 1)
		cap *= 2;
	grown = realloc(o->buf, cap);
	if (!grown) {
		o->failed = true;
		return false;
	}
	o->buf = grown;
	o->cap = cap;
	return true;
}

static void put(struct out *o, const char *text)
{
	size_t n = strlen(text);

	if (!out_room(o, n))
		return;
	memcpy(o->buf + o->len, text, n + 1);
	o->len += n;
}

static void put_u64(struct out *o, uint64_t v)
{
	char tmp[20];
	int n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	if (!out_room(o, (size_t)n))
		return;
	while (n)
		o->buf[o->len++] = tmp[--n];
	o->buf[o->len] = '\0';
}

/* "key":"value", value JSON-encoded. */
static void put_string(struct out *o, const char *key, const char *value)
{
	json_t *j = json_string(value);
	char *enc = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;

	json_decref(j);
	if (!enc) {
		o->failed = true;
		return;
	}
	put(o, "\"");
	put(o, key);
	put(o, "\":");
	put(o, enc);
	free(enc);
}

/* "key":[v0,v1,...], one series of the slice. */
static void put_column(struct out *o, const char *key, const struct ts_history_slice *s,
                       size_t series)
{
	put(o, "\"");
	put(o, key);
	put(o, "\":[");
	for (size_t r = 0; r < s->rows; r++) {
		if (r)
			put(o, ",");
		put_u64(o, s->values[r * s->nseries + series]);
	}
	put(o, "]");
}

static void put_times(struct out *o, const struct ts_history_slice *s)
{
	put(o, "\"times_unix_ms\":[");
	for (size_t r = 0; r < s->rows; r++) {
		if (r)
			put(o, ",");
		put_u64(o, s->times_ns[r] / 1000000u);
	}
	put(o, "]");
}

static void put_spaces(struct out *o, const struct ts_server *srv, const struct layout *l,
                       const struct ts_history_slice *s)
{
	put(o, "\"spaces\":[");
	for (size_t i = 0; i < l->nspaces; i++) {
		const struct ts_space *sp = ts_memory_space_at(srv->memory, i);

		put(o, i ? ",{" : "{");
		put_string(o, "device", ts_device_props(ts_space_device(sp))->id);
		put(o, ",");
		put_string(o, "memory_kind", ts_memory_kind_name(ts_space_kind(sp)));
		put(o, ",");
		put_string(o, "pool", ts_space_pool_name(sp));
		put(o, ",");
		put_column(o, "bytes_in_use", s, l->spaces + i);
		put(o, "}");
	}
	put(o, "]");
}

static void put_pools(struct out *o, const struct ts_server *srv, const struct layout *l,
                      const struct ts_history_slice *s)
{
	put(o, "\"pools\":[");
	for (size_t i = 0; i < l->npools; i++) {
		struct ts_pool_stats ps;

		ts_memory_pool_stats(srv->memory, i, &ps);
		put(o, i ? ",{" : "{");
		put_string(o, "pool", ps.name);
		put(o, ",");
		put_string(o, "memory_kind", ts_memory_kind_name(ps.kind));
		if (ps.device) {
			put(o, ",");
			put_string(o, "device", ts_device_props(ps.device)->id);
		}
		put(o, ",");
		put_column(o, "bytes_in_use", s, l->pool_use + i);
		put(o, ",");
		put_column(o, "bytes_limit", s, l->pool_limit + i);
		put(o, "}");
	}
	put(o, "]");
}

static void put_transfers(struct out *o, const struct ts_server *srv, const struct layout *l,
                          const struct ts_history_slice *s)
{
	put(o, "\"transfers\":[");
	for (size_t d = 0; d < l->ndevices; d++)
		for (int k = 0; k < DIRECTIONS; k++) {
			put(o, d || k ? ",{" : "{");
			put_string(o, "device", ts_device_props(ts_device_set_at(srv->devices, d))->id);
			put(o, ",");
			put_string(o, "direction", direction_names[k]);
			put(o, ",");
			put_column(o, "bytes_total", s, l->transfers + d * DIRECTIONS + (size_t)k);
			put(o, "}");
		}
	put(o, "]");
}

static void put_retention(struct out *o)
{
	put(o, "\"retention\":[");
	for (int i = 0; i < TS_HISTORY_LEVELS; i++) {
		put(o, i ? ",{\"step_seconds\":" : "{\"step_seconds\":");
		put_u64(o, ts_history_levels[i].step_s);
		put(o, ",\"rows\":");
		put_u64(o, ts_history_levels[i].rows);
		put(o, "}");
	}
	put(o, "]");
}

void ts_s_history(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	struct layout l = layout_of(srv);
	struct ts_history_query q;
	struct ts_history_slice s;
	struct ts_error err;
	char since[40];
	struct out o = {0};

	ts_error_clear(&err);
	if (ts_history_query_parse(ts_call_query(call, "since"), ts_call_query(call, "step"),
	                           ts_wall_ns(), &q, &err) != TS_OK ||
	    ts_history_read(srv->history, q.level, q.since_ns, &s, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	if (!ts_format_rfc3339(since, sizeof since, q.since_ns))
		strcpy(since, "1970-01-01T00:00:00Z");
	out_room(&o, (s.rows + 1) * (l.total + 1) * 12 + 4096);   /* digits of most values */
	put(&o, "{\"step_seconds\":");
	put_u64(&o, s.step_s);
	put(&o, ",");
	put_string(&o, "since", since);
	put(&o, ",");
	put_times(&o, &s);
	put(&o, ",");
	put_spaces(&o, srv, &l, &s);
	put(&o, ",");
	put_pools(&o, srv, &l, &s);
	put(&o, ",");
	put_transfers(&o, srv, &l, &s);
	put(&o, ",");
	put_column(&o, "http_requests_total", &s, l.requests);
	put(&o, ",\"operations\":{");
	put_column(&o, "pending", &s, l.ops);
	put(&o, ",");
	put_column(&o, "running", &s, l.ops + 1);
	put(&o, ",");
	put_column(&o, "ended_total", &s, l.ops + 2);
	put(&o, "},");
	put_retention(&o);
	put(&o, ",\"memory_bytes\":");
	put_u64(&o, ts_history_bytes(srv->history));
	put(&o, "}");
	ts_history_slice_release(&s);
	if (o.failed) {
		free(o.buf);
		ts_reply_oom(reply, "no memory for the history");
		return;
	}
	ts_reply_text_owned(reply, TS_HTTP_OK, "application/json", o.buf, o.len);
}
