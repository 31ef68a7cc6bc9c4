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

#include "common/textbuf.h"
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
 * about ten times as long as printing them. Names (device ids, pools) are
 * encoded as JSON strings as jansson writes them.
 */

/* "key":"value", value JSON-encoded. */
static void put_string(struct ts_textbuf *o, const char *key, const char *value)
{
	ts_textbuf_puts(o, "\"");
	ts_textbuf_puts(o, key);
	ts_textbuf_puts(o, "\":");
	ts_textbuf_json_string(o, value);
}

/* "key":[v0,v1,...], one series of the slice. */
static void put_column(struct ts_textbuf *o, const char *key, const struct ts_history_slice *s,
                       size_t series)
{
	ts_textbuf_puts(o, "\"");
	ts_textbuf_puts(o, key);
	ts_textbuf_puts(o, "\":[");
	for (size_t r = 0; r < s->rows; r++) {
		if (r)
			ts_textbuf_puts(o, ",");
		ts_textbuf_u64(o, s->values[r * s->nseries + series]);
	}
	ts_textbuf_puts(o, "]");
}

static void put_times(struct ts_textbuf *o, const struct ts_history_slice *s)
{
	ts_textbuf_puts(o, "\"times_unix_ms\":[");
	for (size_t r = 0; r < s->rows; r++) {
		if (r)
			ts_textbuf_puts(o, ",");
		ts_textbuf_u64(o, s->times_ns[r] / 1000000u);
	}
	ts_textbuf_puts(o, "]");
}

static void put_spaces(struct ts_textbuf *o, const struct ts_server *srv, const struct layout *l,
                       const struct ts_history_slice *s)
{
	ts_textbuf_puts(o, "\"spaces\":[");
	for (size_t i = 0; i < l->nspaces; i++) {
		const struct ts_space *sp = ts_memory_space_at(srv->memory, i);

		ts_textbuf_puts(o, i ? ",{" : "{");
		put_string(o, "device", ts_device_props(ts_space_device(sp))->id);
		ts_textbuf_puts(o, ",");
		put_string(o, "memory_kind", ts_memory_kind_name(ts_space_kind(sp)));
		ts_textbuf_puts(o, ",");
		put_string(o, "pool", ts_space_pool_name(sp));
		ts_textbuf_puts(o, ",");
		put_column(o, "bytes_in_use", s, l->spaces + i);
		ts_textbuf_puts(o, "}");
	}
	ts_textbuf_puts(o, "]");
}

static void put_pools(struct ts_textbuf *o, const struct ts_server *srv, const struct layout *l,
                      const struct ts_history_slice *s)
{
	ts_textbuf_puts(o, "\"pools\":[");
	for (size_t i = 0; i < l->npools; i++) {
		struct ts_pool_stats ps;

		ts_memory_pool_stats(srv->memory, i, &ps);
		ts_textbuf_puts(o, i ? ",{" : "{");
		put_string(o, "pool", ps.name);
		ts_textbuf_puts(o, ",");
		put_string(o, "memory_kind", ts_memory_kind_name(ps.kind));
		if (ps.device) {
			ts_textbuf_puts(o, ",");
			put_string(o, "device", ts_device_props(ps.device)->id);
		}
		ts_textbuf_puts(o, ",");
		put_column(o, "bytes_in_use", s, l->pool_use + i);
		ts_textbuf_puts(o, ",");
		put_column(o, "bytes_limit", s, l->pool_limit + i);
		ts_textbuf_puts(o, "}");
	}
	ts_textbuf_puts(o, "]");
}

static void put_transfers(struct ts_textbuf *o, const struct ts_server *srv, const struct layout *l,
                          const struct ts_history_slice *s)
{
	ts_textbuf_puts(o, "\"transfers\":[");
	for (size_t d = 0; d < l->ndevices; d++)
		for (int k = 0; k < DIRECTIONS; k++) {
			ts_textbuf_puts(o, d || k ? ",{" : "{");
			put_string(o, "device", ts_device_props(ts_device_set_at(srv->devices, d))->id);
			ts_textbuf_puts(o, ",");
			put_string(o, "direction", direction_names[k]);
			ts_textbuf_puts(o, ",");
			put_column(o, "bytes_total", s, l->transfers + d * DIRECTIONS + (size_t)k);
			ts_textbuf_puts(o, "}");
		}
	ts_textbuf_puts(o, "]");
}

static void put_retention(struct ts_textbuf *o)
{
	ts_textbuf_puts(o, "\"retention\":[");
	for (int i = 0; i < TS_HISTORY_LEVELS; i++) {
		ts_textbuf_puts(o, i ? ",{\"step_seconds\":" : "{\"step_seconds\":");
		ts_textbuf_u64(o, ts_history_levels[i].step_s);
		ts_textbuf_puts(o, ",\"rows\":");
		ts_textbuf_u64(o, ts_history_levels[i].rows);
		ts_textbuf_puts(o, "}");
	}
	ts_textbuf_puts(o, "]");
}

void ts_s_history(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	struct layout l = layout_of(srv);
	struct ts_history_query q;
	struct ts_history_slice s;
	struct ts_error err;
	char since[40], *text;
	struct ts_textbuf o;
	size_t len;

	ts_error_clear(&err);
	if (ts_history_query_parse(ts_call_query(call, "since"), ts_call_query(call, "step"),
	                           ts_wall_ns(), &q, &err) != TS_OK ||
	    ts_history_read(srv->history, q.level, q.since_ns, &s, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	if (!ts_format_rfc3339(since, sizeof since, q.since_ns))
		strcpy(since, "1970-01-01T00:00:00Z");
	ts_textbuf_init(&o);
	ts_textbuf_reserve(&o, (s.rows + 1) * (l.total + 1) * 12 + 4096);   /* most values' digits */
	ts_textbuf_puts(&o, "{\"step_seconds\":");
	ts_textbuf_u64(&o, s.step_s);
	ts_textbuf_puts(&o, ",");
	put_string(&o, "since", since);
	ts_textbuf_puts(&o, ",");
	put_times(&o, &s);
	ts_textbuf_puts(&o, ",");
	put_spaces(&o, srv, &l, &s);
	ts_textbuf_puts(&o, ",");
	put_pools(&o, srv, &l, &s);
	ts_textbuf_puts(&o, ",");
	put_transfers(&o, srv, &l, &s);
	ts_textbuf_puts(&o, ",");
	put_column(&o, "http_requests_total", &s, l.requests);
	ts_textbuf_puts(&o, ",\"operations\":{");
	put_column(&o, "pending", &s, l.ops);
	ts_textbuf_puts(&o, ",");
	put_column(&o, "running", &s, l.ops + 1);
	ts_textbuf_puts(&o, ",");
	put_column(&o, "ended_total", &s, l.ops + 2);
	ts_textbuf_puts(&o, "},");
	put_retention(&o);
	ts_textbuf_puts(&o, ",\"memory_bytes\":");
	ts_textbuf_u64(&o, ts_history_bytes(srv->history));
	ts_textbuf_puts(&o, "}");
	ts_history_slice_release(&s);
	text = ts_textbuf_take(&o, &len);
	if (!text) {
		ts_reply_oom(reply, "no memory for the history");
		return;
	}
	ts_reply_text_owned(reply, TS_HTTP_OK, "application/json", text, len);
}
