/*
 * trace.c - the trace recorder (trace.h): a bounded buffer of events in
 * chunks, a table of track names, an optional sampler thread, and the
 * Chrome Trace Event JSON they are answered in.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "common/lock.h"
#include "common/textbuf.h"
#include "common/trace.h"
#include "common/units.h"

#define CHUNK 8192
#define NAMES_MAX 512

struct event {
	char ph;                        /* 'X', 'C', 's', 'f' */
	uint32_t pid, tid;
	const char *cat, *name;         /* static; name NULL: label */
	char label[TS_TRACE_NAME_MAX];
	uint64_t ts, dur, id, bytes;
};

struct track_name {
	uint32_t pid, tid;
	bool process;
	char name[TS_TRACE_NAME_MAX];
};

struct ts_trace {
	struct ts__trace_head head;     /* first: ts_trace_on reads it */
	size_t max_events;              /* immutable */
	size_t nchunks_max;             /* immutable */
	ts_trace_sample_fn *sample;     /* immutable */
	void *cls;                      /* immutable */
	uint64_t period_ns;             /* immutable */
	_Atomic uint64_t next_flow;
	struct ts_mutex mu;
	pthread_cond_t cv;              /* stop the sampler */
	uint64_t gen;                   /* guarded by: mu; the recording one, 0: none */
	uint64_t last_gen;              /* guarded by: mu */
	uint64_t start_ns;              /* guarded by: mu */
	struct event **chunks;          /* guarded by: mu; nchunks_max slots */
	size_t n;                       /* guarded by: mu; events held */
	uint64_t dropped;               /* guarded by: mu */
	struct track_name names[NAMES_MAX];   /* guarded by: mu */
	size_t nnames;                  /* guarded by: mu */
	bool sampler_running;           /* guarded by: mu */
	bool sampler_stop;              /* guarded by: mu */
	pthread_t sampler;
};

static _Thread_local uint64_t current_op;

ts_status ts_trace_new(const struct ts_trace_config *cfg, struct ts_trace **out,
                       struct ts_error *err)
{
	struct ts_trace *t;

	*out = NULL;
	if (cfg->max_events == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TRACE_BOUND",
		                    "a trace needs room for at least one event");
	t = calloc(1, sizeof *t);
	if (!t)
		return ts_error_oom(err, "no memory for the trace recorder");
	t->max_events = cfg->max_events;
	t->nchunks_max = (cfg->max_events + CHUNK - 1) / CHUNK;
	t->chunks = calloc(t->nchunks_max, sizeof *t->chunks);
	if (!t->chunks || ts_mutex_init(&t->mu) != 0) {
		free(t->chunks);
		free(t);
		return ts_error_oom(err, "no memory for the trace recorder");
	}
	pthread_cond_init(&t->cv, NULL);
	t->sample = cfg->sample;
	t->cls = cfg->cls;
	t->period_ns = cfg->period_ns ? cfg->period_ns : 10000000ull;
	*out = t;
	return TS_OK;
}

static void chunks_free_locked(struct ts_trace *t)
{
	for (size_t i = 0; i < t->nchunks_max; i++) {
		free(t->chunks[i]);
		t->chunks[i] = NULL;
	}
}

void ts_trace_free(struct ts_trace *t)
{
	uint64_t gen;

	if (!t)
		return;
	ts_mutex_lock(&t->mu);
	gen = t->gen;
	ts_mutex_unlock(&t->mu);
	if (gen)
		ts_trace_finish(t, gen, NULL, NULL);
	chunks_free_locked(t);
	free(t->chunks);
	pthread_cond_destroy(&t->cv);
	ts_mutex_destroy(&t->mu);
	free(t);
}

static void *sampler_main(void *arg)
{
	struct ts_trace *t = arg;
	uint64_t next = ts_now_ns();

	ts_mutex_lock(&t->mu);
	while (!t->sampler_stop) {
		struct timespec until;
		uint64_t wall;

		ts_mutex_unlock(&t->mu);
		t->sample(t->cls, t, ts_now_ns());
		ts_mutex_lock(&t->mu);
		next += t->period_ns;
		wall = ts_wall_ns() + (next > ts_now_ns() ? next - ts_now_ns() : 0);
		until.tv_sec = (time_t)(wall / 1000000000ull);
		until.tv_nsec = (long)(wall % 1000000000ull);
		while (!t->sampler_stop && ts_now_ns() < next)
			if (ts_mutex_wait(&t->mu, &t->cv, &until) == ETIMEDOUT)
				break;
	}
	ts_mutex_unlock(&t->mu);
	return NULL;
}

uint64_t ts_trace_begin(struct ts_trace *t, struct ts_error *err)
{
	uint64_t gen = 0;
	int rc;

	ts_mutex_lock(&t->mu);
	if (t->gen) {
		ts_error_set(err, TS_ABORTED, "TRACE_RUNNING",
		             "a trace is recording already (one at a time); try again when it ends");
		goto out;
	}
	chunks_free_locked(t);
	t->n = 0;
	t->dropped = 0;
	t->nnames = 0;
	t->start_ns = ts_now_ns();
	t->gen = gen = ++t->last_gen;
	atomic_store_explicit(&t->head.gen, gen, memory_order_relaxed);
	atomic_store_explicit(&t->head.on, true, memory_order_relaxed);
	if (t->sample) {
		t->sampler_stop = false;
		rc = pthread_create(&t->sampler, NULL, sampler_main, t);
		if (rc != 0) {
			atomic_store_explicit(&t->head.on, false, memory_order_relaxed);
			atomic_store_explicit(&t->head.gen, 0, memory_order_relaxed);
			t->gen = gen = 0;
			ts_error_set(err, TS_RESOURCE_EXHAUSTED, "THREAD_LIMIT",
			             "cannot start the trace's sampler: %s", strerror(rc));
			goto out;
		}
		t->sampler_running = true;
	}
out:
	ts_mutex_unlock(&t->mu);
	return gen;
}

/* ---- events ------------------------------------------------------------------------ */

/* A slot for one more event, or NULL (counted as dropped) when the trace is
 * full, not recording, or out of memory; mu held. */
static struct event *slot_locked(struct ts_trace *t)
{
	size_t c = t->n / CHUNK;

	if (!t->gen || t->n >= t->max_events)
		goto drop;
	if (!t->chunks[c]) {
		t->chunks[c] = malloc(CHUNK * sizeof(struct event));
		if (!t->chunks[c])
			goto drop;
	}
	return &t->chunks[c][t->n++ % CHUNK];
drop:
	if (t->gen)
		t->dropped++;
	return NULL;
}

static void copy_name(char *dst, const char *src)
{
	size_t n = src ? strlen(src) : 0;

	if (n >= TS_TRACE_NAME_MAX)
		n = TS_TRACE_NAME_MAX - 1;
	memcpy(dst, src ? src : "", n);
	dst[n] = '\0';
}

static void add(struct ts_trace *t, const struct event *e)
{
	struct event *s;

	ts_mutex_lock(&t->mu);
	s = slot_locked(t);
	if (s) {
		*s = *e;
		if (s->ts < t->start_ns) {     /* began before the trace: cut there */
			uint64_t end = s->ts + s->dur;

			s->ts = t->start_ns;
			s->dur = end > t->start_ns ? end - t->start_ns : 0;
		}
	}
	ts_mutex_unlock(&t->mu);
}

void ts_trace_span(struct ts_trace *t, uint32_t pid, uint32_t tid, const char *cat,
                   const char *name, const char *label, uint64_t t0_ns, uint64_t t1_ns,
                   uint64_t id, uint64_t bytes)
{
	struct event e = {.ph = 'X', .pid = pid, .tid = tid, .cat = cat, .name = name,
	                  .ts = t0_ns, .dur = t1_ns > t0_ns ? t1_ns - t0_ns : 0, .id = id,
	                  .bytes = bytes};

	if (!ts_trace_on(t))
		return;
	if (!name)
		copy_name(e.label, label);
	add(t, &e);
}

void ts_trace_counter(struct ts_trace *t, uint32_t pid, const char *name, uint64_t now_ns,
                      uint64_t value)
{
	struct event e = {.ph = 'C', .pid = pid, .cat = "memory", .ts = now_ns, .bytes = value};

	if (!ts_trace_on(t))
		return;
	copy_name(e.label, name);
	add(t, &e);
}

static void name_add(struct ts_trace *t, bool process, uint32_t pid, uint32_t tid,
                     const char *name)
{
	if (!ts_trace_on(t))
		return;
	ts_mutex_lock(&t->mu);
	for (size_t i = 0; i < t->nnames; i++)
		if (t->names[i].process == process && t->names[i].pid == pid &&
		    t->names[i].tid == tid)
			goto out;
	if (t->gen && t->nnames < NAMES_MAX) {
		struct track_name *n = &t->names[t->nnames++];

		n->process = process;
		n->pid = pid;
		n->tid = tid;
		copy_name(n->name, name);
	}
out:
	ts_mutex_unlock(&t->mu);
}

void ts_trace_name_process(struct ts_trace *t, uint32_t pid, const char *name)
{
	name_add(t, true, pid, 0, name);
}

void ts_trace_name_track(struct ts_trace *t, uint32_t pid, uint32_t tid, const char *name)
{
	name_add(t, false, pid, tid, name);
}

uint32_t ts_trace_thread(void)
{
	return (uint32_t)syscall(SYS_gettid);
}

void ts_trace_op_enter(uint64_t op_seq)
{
	current_op = op_seq;
}

void ts_trace_op_leave(void)
{
	current_op = 0;
}

uint64_t ts_trace_flow_start(struct ts_trace *t)
{
	struct event e = {.ph = 's', .cat = "flow", .name = "causes"};

	if (!ts_trace_on(t) || !current_op)
		return 0;
	e.id = atomic_fetch_add_explicit(&t->next_flow, 1, memory_order_relaxed) + 1;
	e.tid = ts_trace_thread();
	e.ts = ts_now_ns();
	e.bytes = current_op;
	add(t, &e);
	return e.id;
}

void ts_trace_flow_end(struct ts_trace *t, uint32_t pid, uint32_t tid, uint64_t id,
                       uint64_t now_ns)
{
	struct event e = {.ph = 'f', .pid = pid, .tid = tid, .cat = "flow", .name = "causes",
	                  .id = id, .ts = now_ns};

	if (!id || !ts_trace_on(t))
		return;
	add(t, &e);
}

/* ---- the answer ----------------------------------------------------------------- */

/* Microseconds since start, with nanosecond digits. */
static void put_us(struct ts_textbuf *o, const char *key, uint64_t ns)
{
	ts_textbuf_printf(o, ",\"%s\":%llu.%03llu", key, (unsigned long long)(ns / 1000),
	                  (unsigned long long)(ns % 1000));
}

static void put_event(struct ts_textbuf *o, const struct event *e, uint64_t start)
{
	char ph[2] = {e->ph, 0};

	ts_textbuf_printf(o, "{\"ph\":\"%s\",\"pid\":%u,\"tid\":%u,\"cat\":", ph, e->pid, e->tid);
	ts_textbuf_json_string(o, e->cat ? e->cat : "");
	ts_textbuf_puts(o, ",\"name\":");
	ts_textbuf_json_string(o, e->name ? e->name : e->label);
	put_us(o, "ts", e->ts >= start ? e->ts - start : 0);
	switch (e->ph) {
	case 'X':
		put_us(o, "dur", e->dur);
		ts_textbuf_puts(o, ",\"args\":{");
		if (e->id)
			ts_textbuf_printf(o, "\"op\":%llu%s", (unsigned long long)e->id,
			                  e->bytes ? "," : "");
		if (e->bytes)
			ts_textbuf_printf(o, "\"bytes\":%llu", (unsigned long long)e->bytes);
		ts_textbuf_puts(o, "}");
		break;
	case 'C':
		ts_textbuf_printf(o, ",\"args\":{\"bytes\":%llu}", (unsigned long long)e->bytes);
		break;
	case 's':
		ts_textbuf_printf(o, ",\"id\":%llu,\"args\":{\"op\":%llu}",
		                  (unsigned long long)e->id, (unsigned long long)e->bytes);
		break;
	case 'f':
		ts_textbuf_printf(o, ",\"id\":%llu,\"bp\":\"e\"", (unsigned long long)e->id);
		break;
	}
	ts_textbuf_puts(o, "}");
}

static void render_locked(struct ts_trace *t, uint64_t end_ns, struct ts_textbuf *o)
{
	bool first = true;

	if (!ts_textbuf_reserve(o, t->n * 160 + t->nnames * 96 + 512))
		return;
	ts_textbuf_puts(o, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
	for (size_t i = 0; i < t->nnames; i++) {
		const struct track_name *n = &t->names[i];

		ts_textbuf_printf(o, "%s{\"ph\":\"M\",\"pid\":%u,\"tid\":%u,\"name\":\"%s\","
		                     "\"ts\":0,\"args\":{\"name\":",
		                  first ? "" : ",", n->pid, n->tid,
		                  n->process ? "process_name" : "thread_name");
		ts_textbuf_json_string(o, n->name);
		ts_textbuf_puts(o, "}}");
		first = false;
	}
	for (size_t i = 0; i < t->n; i++) {
		ts_textbuf_puts(o, first ? "" : ",");
		put_event(o, &t->chunks[i / CHUNK][i % CHUNK], t->start_ns);
		first = false;
	}
	ts_textbuf_printf(o, "],\"metadata\":{\"duration_us\":%llu,\"events\":%zu,"
	                     "\"dropped_events\":%llu,\"max_events\":%zu}}",
	                  (unsigned long long)((end_ns - t->start_ns) / 1000), t->n,
	                  (unsigned long long)t->dropped, t->max_events);
}

bool ts_trace_finish(struct ts_trace *t, uint64_t gen, char **json, size_t *len)
{
	struct ts_textbuf o;
	uint64_t end_ns;
	bool join;

	ts_mutex_lock(&t->mu);
	if (!gen || t->gen != gen) {
		ts_mutex_unlock(&t->mu);
		return false;
	}
	join = t->sampler_running;
	t->sampler_stop = true;
	t->sampler_running = false;
	pthread_cond_broadcast(&t->cv);
	ts_mutex_unlock(&t->mu);
	if (join)
		pthread_join(t->sampler, NULL);   /* its last samples still land */

	ts_mutex_lock(&t->mu);
	atomic_store_explicit(&t->head.on, false, memory_order_relaxed);
	atomic_store_explicit(&t->head.gen, 0, memory_order_relaxed);
	end_ns = ts_now_ns();
	if (json) {
		ts_textbuf_init(&o);
		render_locked(t, end_ns, &o);
		*len = 0;
		*json = ts_textbuf_take(&o, len);
	}
	chunks_free_locked(t);
	t->gen = 0;        /* last: no begin reuses the buffer before it is answered */
	ts_mutex_unlock(&t->mu);
	return true;
}

void ts_trace_counts(struct ts_trace *t, uint64_t *recorded, uint64_t *dropped)
{
	ts_mutex_lock(&t->mu);
	*recorded = t->n;
	*dropped = t->dropped;
	ts_mutex_unlock(&t->mu);
}
