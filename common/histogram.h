/*
 * histogram.h - a lock-free latency histogram with fixed bucket bounds, in
 * the shape Prometheus exposes (cumulative buckets, a sum and a count).
 *
 * Invariants: bounds are ascending seconds, at most TS_HISTOGRAM_MAX of
 * them, and are immutable after init; every observation lands in exactly
 * one bucket (the last one, +Inf, for values past every bound) and adds to
 * sum and count.
 *
 * Thread-safety: ts_histogram_observe and ts_histogram_read may run on any
 * threads at once (relaxed atomics; a read is a consistent-enough snapshot
 * whose count is the sum of the buckets it read).
 */
#ifndef TS_HISTOGRAM_H
#define TS_HISTOGRAM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define TS_HISTOGRAM_MAX 20

struct ts_histogram {
	const double *bounds;                        /* immutable; borrowed */
	size_t nbounds;                              /* immutable */
	_Atomic uint64_t bucket[TS_HISTOGRAM_MAX + 1];   /* non-cumulative; last: +Inf */
	_Atomic uint64_t sum_ns;
};

/* Request latencies: 100 us .. 10 s. */
extern const double ts_histogram_request_bounds[];
extern const size_t ts_histogram_request_nbounds;

/* Operations and training steps: 1 ms .. 10 min. */
extern const double ts_histogram_long_bounds[];
extern const size_t ts_histogram_long_nbounds;

/* Sets h empty with bounds (borrowed, must outlive h; n is capped at
 * TS_HISTOGRAM_MAX). */
void ts_histogram_init(struct ts_histogram *h, const double *bounds, size_t n);

/* Counts one observation of ns nanoseconds. */
void ts_histogram_observe(struct ts_histogram *h, uint64_t ns);

/* A snapshot: cumulative[i] for bounds[i], cumulative[nbounds] for +Inf
 * (the count); cumulative has TS_HISTOGRAM_MAX + 1 entries. */
struct ts_histogram_snapshot {
	uint64_t cumulative[TS_HISTOGRAM_MAX + 1];
	uint64_t count;
	double sum_seconds;
};
void ts_histogram_read(const struct ts_histogram *h, struct ts_histogram_snapshot *out);

#endif
