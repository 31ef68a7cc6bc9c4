/*
 * metrics.h - request, operation and process counters, latency histograms,
 * and the Prometheus text exposition (format 0.0.4) of everything tstaged
 * measures.
 *
 * Request counters are per route (the route table's method and pattern as
 * separate labels, never an array name) and per HTTP status code, with a
 * histogram per route and a gauge of requests in flight; operations are
 * counted per kind and outcome, with a duration histogram per kind. The
 * exposition adds what the core's objects count (memory per space and per
 * pool, transfers per device and direction, training steps) and process_*
 * series. All updates are relaxed atomics: recording never takes a lock, and
 * request counters are kept per thread shard, so two workers never write
 * one cache line on the request path.
 *
 * Thread-safety: every function but new and free may run on any threads at
 * once.
 */
#ifndef TS_METRICS_H
#define TS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "ops/operation.h"

struct ts_metrics;
struct ts_core;

/* New metrics for nroutes routes named by patterns ("GET /v1/memory";
 * borrowed, must outlive it); route index nroutes is "unmatched". NULL when
 * out of memory. */
struct ts_metrics *ts_metrics_new(size_t nroutes, const char *const *patterns);
void ts_metrics_free(struct ts_metrics *m);

/* What became of an accepted connection: handed to the small daemon (its
 * first request has no body), to the bulk daemon (PUT, POST or PATCH), or
 * answered 503 past a connection limit. */
enum ts_conn_event { TS_CONN_SMALL, TS_CONN_BULK, TS_CONN_REFUSED, TS_CONN_EVENTS };

/* Counts one accepted connection's event; answers how many there have been. */
uint64_t ts_metrics_connection(struct ts_metrics *m, enum ts_conn_event e);

/* Sets the number of small-request workers (once, before any connection):
 * TS_OK, TS_RESOURCE_EXHAUSTED without memory, TS_INVALID_ARGUMENT when n < 1
 * or already set. */
ts_status ts_metrics_set_workers(struct ts_metrics *m, int n);

/* Worker w (0 <= w < the number set) has delta more connections open; the
 * count, relaxed (placement and the gauge need no order with anything). */
void ts_metrics_worker_conns_add(struct ts_metrics *m, int w, int delta);
int64_t ts_metrics_worker_conns(const struct ts_metrics *m, int w);

/* GPU lease memory (server/lease.c) grew by bytes in allocs allocations
 * (negative: freed). Relaxed. */
void ts_metrics_lease_device_add(struct ts_metrics *m, int64_t bytes, int allocs);

/* A request began (in flight until its ts_metrics_record). */
void ts_metrics_request_started(struct ts_metrics *m);

/* Requests begun and not yet recorded, over every thread. */
int64_t ts_metrics_in_flight(struct ts_metrics *m);

/* Counts one finished request, begun with ts_metrics_request_started. */
void ts_metrics_record(struct ts_metrics *m, size_t route, int http_code,
                       uint64_t duration_ns);

/* Requests answered since start (every route and code: the sum of
 * tstage_http_requests_total), and operations ended (the sum of
 * tstage_operations_total). Relaxed. */
uint64_t ts_metrics_requests_total(struct ts_metrics *m);
uint64_t ts_metrics_operations_ended(struct ts_metrics *m);

/* Counts one operation's end (its kind, outcome and time running; the
 * bytes it moved when its unit is bytes). */
void ts_metrics_operation_ended(struct ts_metrics *m, const struct ts_op_end *end);

/* "succeeded", "failed", "cancelled": the outcome label of an ended
 * operation's state. */
const char *ts_metrics_outcome_name(enum ts_op_state state);

/* The fleet's peers now: how many answered their last poll and how many did
 * not (server/fleet.c sets them after each round; both 0 without peers). */
void ts_metrics_fleet_peers(struct ts_metrics *m, int64_t reachable, int64_t unreachable);

/* The history's sampler so far (server/history.h): samples taken and the
 * CPU time they took; set before each render. Relaxed. */
void ts_metrics_history(struct ts_metrics *m, uint64_t samples, uint64_t cpu_ns);
/* The fleet's data port (server/fleet_ucx.c): one endpoint accepted (its
 * ticket was good) or rejected; endpoints open now changed by delta. */
void ts_metrics_fleet_ucx_conn(struct ts_metrics *m, bool accepted);
void ts_metrics_fleet_ucx_open(struct ts_metrics *m, int64_t delta);

/* Bytes of cross-node copies: written to peers (sent, as each write
 * completes: server/fleet_xfer.c) or arrived from them (received, as a
 * receive is committed: server/fleet_recv.c). */
void ts_metrics_fleet_bytes(struct ts_metrics *m, bool sent, uint64_t n);

/* Cross-node receives (server/fleet_recv.c): open ones changed by dopen,
 * bytes of staging memory they hold (until their endpoints are closed) by
 * dstaging. */
void ts_metrics_fleet_receives(struct ts_metrics *m, int64_t dopen, int64_t dstaging);

/* Renders the exposition into a new malloc'd string (caller frees); NULL
 * when out of memory. *len receives its length. */
char *ts_metrics_render(struct ts_metrics *m, const struct ts_core *core,
                        size_t *len);

#endif
