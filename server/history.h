/*
 * history.h - a bounded history of the daemon's counters: rings of samples
 * of a fixed set of series (each a uint64_t per sample), one ring per
 * resolution, and the thread that fills them.
 *
 * The finest ring takes every sample (one a second: the last 15 minutes);
 * each coarser one keeps one row per whole step of wall-clock time (10 s:
 * the last 3 hours), folded from the finer samples of that step: a gauge
 * keeps the step's largest value (a spike is never lost by downsampling), a
 * counter its last (differences between rows stay exact). A step's row is
 * written when the first sample of the next step arrives. Every ring is
 * allocated whole at creation: the memory cost is fixed,
 * ts_history_bytes(), 8 bytes x (1 + series) x (900 + 1080) rows.
 *
 * What the series mean is the caller's (server/memory_history.c); this file
 * only stores, folds and copies them.
 *
 * Thread-safety: ts_history_add, ts_history_read and ts_history_bytes may
 * run on any threads at once (a short lock around one row's write or one
 * range's copy; nothing is rendered under it); new and free on one. The
 * query parser is pure.
 */
#ifndef TS_HISTORY_H
#define TS_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* The rings, finest first: step in seconds and rows kept. */
#define TS_HISTORY_LEVELS 2
struct ts_history_level {
	uint32_t step_s;
	uint32_t rows;
};
extern const struct ts_history_level ts_history_levels[TS_HISTORY_LEVELS];

/* How a coarser ring folds the samples of one step. */
enum ts_history_fold {
	TS_HISTORY_GAUGE,      /* the largest */
	TS_HISTORY_COUNTER,    /* the last */
};

/* Fills values[0..nseries) with the counters now; called by the sampler
 * thread only. */
typedef void ts_history_sample_fn(void *cls, uint64_t *values);

struct ts_history_config {
	size_t nseries;                      /* >= 1 */
	const enum ts_history_fold *fold;    /* nseries; copied */
	ts_history_sample_fn *sample;        /* NULL: no thread, ts_history_add feeds it */
	void *cls;                           /* borrowed; outlives the history */
	uint32_t interval_ms;                /* between samples; 0: 1000 */
};

struct ts_history;

/* A new history with its rings allocated (and its sampler started when
 * cfg->sample is set): *out, or TS_RESOURCE_EXHAUSTED / TS_INVALID_ARGUMENT
 * with err. */
ts_status ts_history_new(const struct ts_history_config *cfg, struct ts_history **out,
                         struct ts_error *err);

/* Stops the sampler and frees h; NULL is fine. */
void ts_history_free(struct ts_history *h);

/* Records one sample of every series (values: nseries, borrowed) taken at
 * wall time t_ns, into the finest ring and the coarser ones' folds. */
void ts_history_add(struct ts_history *h, uint64_t t_ns, const uint64_t *values);

/* The fixed memory the rings take, in bytes. */
size_t ts_history_bytes(const struct ts_history *h);

/* Samples the sampler thread has taken, and the CPU time it spent taking
 * and recording them (its own thread's clock). Relaxed. */
void ts_history_sampler_stats(struct ts_history *h, uint64_t *samples, uint64_t *cpu_ns);

/* How many series h has. */
size_t ts_history_series(const struct ts_history *h);

/* A copy of the rows of one ring, oldest first. */
struct ts_history_slice {
	int level;
	uint32_t step_s;
	size_t rows;
	size_t nseries;
	uint64_t *times_ns;      /* rows; owned */
	uint64_t *values;        /* rows x nseries, row by row; owned */
};

/* Copies the rows of ring level whose time is since_ns or later into *out
 * (release with ts_history_slice_release): TS_OK, or TS_RESOURCE_EXHAUSTED
 * with err. */
ts_status ts_history_read(struct ts_history *h, int level, uint64_t since_ns,
                          struct ts_history_slice *out, struct ts_error *err);
void ts_history_slice_release(struct ts_history_slice *s);

/* A request for history: ?since= and ?step= resolved against now. */
struct ts_history_query {
	uint64_t since_ns;      /* wall time of the oldest row wanted */
	int level;              /* the ring answering */
};

/*
 * Parses ?since= (NULL: the answering ring's whole span) and ?step= (NULL:
 * the finest ring whose span covers since) at wall time now_ns. since is
 * RFC 3339 ("2026-12-03T14:00:00Z", "...T15:00:00.5+01:00") or a time ago:
 * a non-negative number of seconds with an optional unit s, m or h ("90",
 * "90s", "15m"); it may not be in the future. step is a positive duration
 * in the same form; the answering ring is the finest whose step is at least
 * it (the coarsest when none is). Pure; TS_INVALID_ARGUMENT with err
 * naming the parameter and the problem.
 */
ts_status ts_history_query_parse(const char *since, const char *step, uint64_t now_ns,
                                 struct ts_history_query *q, struct ts_error *err);

/* Parses RFC 3339 date-time text into ns since the epoch; false on anything
 * else (or a time before 1970 or past what 64 bits of ns hold, 2554). Pure. */
bool ts_parse_rfc3339(const char *s, uint64_t *ns);

#endif
