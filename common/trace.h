/*
 * trace.h - a recorder of timed events for one trace at a time, answered in
 * the Chrome Trace Event Format that Perfetto's UI and chrome://tracing open.
 *
 * The places that do the work (queue workers, the operation runner, the HTTP
 * completion) ask ts_trace_on() first: while no trace records, that is one
 * relaxed atomic load and a branch. While one records, each event is copied
 * into a buffer bounded at max_events (allocated in chunks as it fills);
 * past the bound, events are dropped and counted, and the answer says how
 * many in its metadata. Timestamps are ts_now_ns() (monotonic); the answer
 * counts microseconds from the trace's start, and a span that began before
 * it is cut at the start.
 *
 * Tracks: a "process" (pid) per device, numbered from 1 in the device set's
 * order, and pid 0 for the daemon itself; a "thread" (tid) per device queue
 * (its number on the device) or per daemon thread (its kernel thread id).
 * Names of both come from ts_trace_name_process/ts_trace_name_track.
 *
 * Thread-safety: every function may be called from any thread; events are
 * appended under one mutex, taken only while a trace records. A begun trace
 * is ended by whoever holds its generation (ts_trace_finish).
 */
#ifndef TS_TRACE_H
#define TS_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct ts_trace;

/* The part of struct ts_trace that ts_trace_on reads; private. */
struct ts__trace_head {
	atomic_bool on;
	_Atomic uint64_t gen;         /* the recording's generation, 0: none */
};

/* Whether a trace records now: t NULL is never on. */
static inline bool ts_trace_on(const struct ts_trace *t)
{
	return t && atomic_load_explicit(&((const struct ts__trace_head *)(const void *)t)->on,
	                                 memory_order_relaxed);
}

/* The generation of the recording now (0: none): a place that names its
 * track once a recording keeps the generation it named it in. */
static inline uint64_t ts_trace_generation(const struct ts_trace *t)
{
	return t ? atomic_load_explicit(&((const struct ts__trace_head *)(const void *)t)->gen,
	                                memory_order_relaxed)
	         : 0;
}

#define TS_TRACE_NAME_MAX 48   /* copied names (counters, operations) are cut to 47 bytes */

/* Called every period while a trace records, on the trace's own thread, to
 * add counter events (ts_trace_counter). */
typedef void ts_trace_sample_fn(void *cls, struct ts_trace *t, uint64_t now_ns);

struct ts_trace_config {
	size_t max_events;            /* the bound (>= 1) */
	ts_trace_sample_fn *sample;   /* NULL: no sampler thread */
	void *cls;                    /* borrowed; outlives the trace */
	uint64_t period_ns;           /* of the sampler; 0: 10 ms */
};

/* A new idle recorder in *out (free with ts_trace_free). RESOURCE_EXHAUSTED
 * when out of memory, INVALID_ARGUMENT for max_events 0. */
ts_status ts_trace_new(const struct ts_trace_config *cfg, struct ts_trace **out,
                       struct ts_error *err);

/* Stops a recording if any and frees t. NULL does nothing. */
void ts_trace_free(struct ts_trace *t);

/* Starts recording: returns its generation (> 0), or 0 when a trace records
 * already (or its sampler cannot start: err says which; ABORTED when busy). */
uint64_t ts_trace_begin(struct ts_trace *t, struct ts_error *err);

/*
 * Ends the recording of generation gen and, when json is not NULL, answers
 * it as a new NUL-terminated string in *json (caller frees; *len its length)
 * and releases the buffer; NULL in *json when out of memory. Returns false,
 * touching nothing, when gen is not the recording one (already finished).
 */
bool ts_trace_finish(struct ts_trace *t, uint64_t gen, char **json, size_t *len);

/* Events recorded and dropped by the current or last recording. */
void ts_trace_counts(struct ts_trace *t, uint64_t *recorded, uint64_t *dropped);

/* ---- events: each does nothing unless a trace records ------------------------------ */

/* A complete ("X") span [t0_ns, t1_ns] on (pid, tid). name and cat are
 * borrowed static strings (or name NULL and label copied); id, when not 0,
 * is shown as args.id (operation sequence numbers); bytes, when not 0, as
 * args.bytes. */
void ts_trace_span(struct ts_trace *t, uint32_t pid, uint32_t tid, const char *cat,
                   const char *name, const char *label, uint64_t t0_ns, uint64_t t1_ns,
                   uint64_t id, uint64_t bytes);

/* A counter ("C") sample: name copied. */
void ts_trace_counter(struct ts_trace *t, uint32_t pid, const char *name, uint64_t now_ns,
                      uint64_t value);

/* Names a process or a track (copied; the first name given wins). */
void ts_trace_name_process(struct ts_trace *t, uint32_t pid, const char *name);
void ts_trace_name_track(struct ts_trace *t, uint32_t pid, uint32_t tid, const char *name);

/* The calling thread's kernel id, for tracks of daemon threads. */
uint32_t ts_trace_thread(void);

/*
 * Flows from an operation to the work it causes. The operation runner marks
 * the thread that runs one (ts_trace_op_enter, _leave); whoever submits work
 * on that thread calls ts_trace_flow_start, which records the flow's start
 * ("s") there and returns its id (0 when no trace records or the thread runs
 * no operation); the queue that runs the work records ts_trace_flow_end
 * with that id inside the work's span.
 */
void ts_trace_op_enter(uint64_t op_seq);
void ts_trace_op_leave(void);
uint64_t ts_trace_flow_start(struct ts_trace *t);
void ts_trace_flow_end(struct ts_trace *t, uint32_t pid, uint32_t tid, uint64_t id,
                       uint64_t now_ns);

#endif
