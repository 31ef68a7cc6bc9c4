/*
 * metrics.h - request counters and latency histograms, and the Prometheus
 * text exposition (format 0.0.4) of everything tstaged measures.
 *
 * Counters are per route (the route table's pattern, never an array name)
 * and per HTTP status code; the histogram is per route. All updates are
 * relaxed atomics: recording a request never takes a lock.
 *
 * Thread-safety: ts_metrics_record and ts_metrics_render may run on any
 * threads at once.
 */
#ifndef TS_METRICS_H
#define TS_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct ts_metrics;
struct ts_core;

/* New metrics for nroutes routes named by patterns (borrowed, must outlive
 * it); route index nroutes is "unmatched". NULL when out of memory. */
struct ts_metrics *ts_metrics_new(size_t nroutes, const char *const *patterns);
void ts_metrics_free(struct ts_metrics *m);

/* Counts one finished request. */
void ts_metrics_record(struct ts_metrics *m, size_t route, int http_code,
                       uint64_t duration_ns);

/* Renders the exposition into a new malloc'd string (caller frees); NULL
 * when out of memory. *len receives its length. */
char *ts_metrics_render(struct ts_metrics *m, const struct ts_core *core,
                        size_t *len);

#endif
