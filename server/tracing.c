/*
 * tracing.c - the daemon's trace (common/trace.h) and GET /v1/trace, which
 * records for ?seconds= (1..60, default 5) and answers Chrome Trace Event
 * JSON.
 *
 * The recorder exists from start: the device queues and the operation
 * runner hold it (borrowed) and ask ts_trace_on() before recording, so
 * while no trace runs they pay one relaxed load. One trace at a time: a
 * second request while one records is refused (409 ABORTED). The request
 * waits suspended (no thread held); at its deadline the recording ends and
 * is answered; a client that leaves first ends it too. While it records, a
 * sampler thread adds each (device, memory kind) space's bytes in use as
 * counters every 10 ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/trace.h"
#include "common/units.h"
#include "memory/space.h"
#include "server/server_int.h"
#include "server/server_routes.h"

/* At most this many events a trace (about 120 bytes each, allocated as it
 * fills: 60 MiB when full); more are dropped and counted. */
#define TRACE_EVENTS_MAX (512u * 1024u)
#define TRACE_SECONDS_DEFAULT 5
#define TRACE_SECONDS_MAX 60

static void sample(void *cls, struct ts_trace *t, uint64_t now_ns)
{
	struct ts_server *srv = cls;
	size_t nspaces = ts_memory_space_count(srv->memory);
	size_t ndev = ts_device_set_count(srv->devices);

	for (size_t i = 0; i < nspaces; i++) {
		const struct ts_space *sp = ts_memory_space_at(srv->memory, i);
		const struct ts_device *dev = ts_space_device(sp);
		struct ts_space_stats st;
		char name[TS_TRACE_NAME_MAX];
		uint32_t pid = 0;

		for (size_t d = 0; d < ndev; d++)
			if (ts_device_set_at(srv->devices, d) == dev)
				pid = (uint32_t)d + 1;
		ts_space_stats(sp, &st);
		snprintf(name, sizeof name, "%.24s bytes_in_use", ts_memory_kind_name(ts_space_kind(sp)));
		ts_trace_name_process(t, pid, ts_device_props(dev)->id);
		ts_trace_counter(t, pid, name, now_ns, st.bytes_in_use);
	}
}

ts_status ts__trace_start(struct ts_server *srv, struct ts_error *err)
{
	ts_status st = ts_trace_new(&(struct ts_trace_config){.max_events = TRACE_EVENTS_MAX,
	                                                      .sample = sample, .cls = srv},
	                            &srv->trace, err);

	if (st == TS_OK)
		ts_device_set_trace(srv->devices, srv->trace);
	return st;
}

void ts__trace_free(struct ts_server *srv)
{
	ts_trace_free(srv->trace);
	srv->trace = NULL;
}

void ts__trace_request(struct ts_server *srv, const char *method, const char *pattern,
                       int code, uint64_t t0_ns, uint64_t t1_ns)
{
	char label[TS_TRACE_NAME_MAX];
	uint32_t tid;

	if (!ts_trace_on(srv->trace))
		return;
	tid = ts_trace_thread();
	snprintf(label, sizeof label, "%.42s %d", pattern, code);
	ts_trace_name_process(srv->trace, 0, "tstaged");
	ts_trace_name_track(srv->trace, 0, tid, "http");
	ts_trace_span(srv->trace, 0, tid, "http", NULL, label, t0_ns, t1_ns, 0, 0);
}

/* ---- GET /v1/trace ------------------------------------------------------------------ */

struct recording {
	struct ts_server *srv;
	uint64_t gen;
};

static bool never_early(void *state, void (*wake)(void *token), void *token)
{
	(void)state;
	(void)wake;
	(void)token;
	return true;          /* the deadline answers */
}

static void nothing_to_disarm(void *state, void (*wake)(void *token), void *token)
{
	(void)state;
	(void)wake;
	(void)token;
}

static void answer(void *state, bool timed_out, struct ts_reply *reply)
{
	struct recording *r = state;
	char *json = NULL;
	size_t len = 0;

	(void)timed_out;
	ts_device_set_trace_flush(r->srv->devices);   /* CUDA copies timed by events */
	if (!ts_trace_finish(r->srv->trace, r->gen, &json, &len)) {
		ts_reply_fail(reply, TS_INTERNAL, "TRACE_LOST", "the trace ended before its answer");
		return;
	}
	if (!json) {
		ts_reply_oom(reply, "no memory for the trace's answer");
		return;
	}
	ts_reply_text_owned(reply, TS_HTTP_OK, "application/json", json, len);
}

static void release(void *state)
{
	struct recording *r = state;

	ts_trace_finish(r->srv->trace, r->gen, NULL, NULL);   /* the client left first */
	free(r);
}

static bool seconds_parse(const char *s, long *out, struct ts_error *err)
{
	char *end;
	long v;

	*out = TRACE_SECONDS_DEFAULT;
	if (!s)
		return true;
	v = strtol(s, &end, 10);
	if (*s < '0' || *s > '9' || *end || v < 1 || v > TRACE_SECONDS_MAX) {
		ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TRACE_SECONDS",
		             "seconds '%.32s' is not a whole number of seconds in 1..%d", s,
		             TRACE_SECONDS_MAX);
		return false;
	}
	*out = v;
	return true;
}

void ts_s_trace(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	struct recording *r;
	struct ts_error err;
	long seconds;

	ts_error_clear(&err);
	if (!seconds_parse(ts_call_query(call, "seconds"), &seconds, &err)) {
		ts_reply_error(reply, &err);
		return;
	}
	r = calloc(1, sizeof *r);
	if (!r) {
		ts_reply_oom(reply, "no memory to record a trace");
		return;
	}
	r->srv = srv;
	r->gen = ts_trace_begin(srv->trace, &err);
	if (!r->gen) {
		free(r);
		ts_reply_error(reply, &err);
		return;
	}
	ts_reply_suspend(reply, &(struct ts_suspend){
		.timeout_ns = (uint64_t)seconds * 1000000000ull, .arm = never_early,
		.disarm = nothing_to_disarm, .resume = answer, .release = release, .state = r});
}
