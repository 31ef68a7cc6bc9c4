/*
 * histogram.c - fixed-bound latency histograms on relaxed atomics.
 */
#include "common/histogram.h"

const double ts_histogram_request_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                              0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                              10};
const size_t ts_histogram_request_nbounds =
	sizeof ts_histogram_request_bounds / sizeof ts_histogram_request_bounds[0];

const double ts_histogram_long_bounds[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                           5, 10, 30, 60, 120, 300, 600};
const size_t ts_histogram_long_nbounds =
	sizeof ts_histogram_long_bounds / sizeof ts_histogram_long_bounds[0];

void ts_histogram_init(struct ts_histogram *h, const double *bounds, size_t n)
{
	h->bounds = bounds;
	h->nbounds = n < TS_HISTOGRAM_MAX ? n : TS_HISTOGRAM_MAX;
	for (size_t i = 0; i <= TS_HISTOGRAM_MAX; i++)
		atomic_init(&h->bucket[i], 0);
	atomic_init(&h->sum_ns, 0);
}

void ts_histogram_observe(struct ts_histogram *h, uint64_t ns)
{
	double secs = (double)ns / 1e9;
	size_t b = h->nbounds;

	for (size_t i = 0; i < h->nbounds; i++) {
		if (secs <= h->bounds[i]) {
			b = i;
			break;
		}
	}
	atomic_fetch_add_explicit(&h->bucket[b], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void ts_histogram_read(const struct ts_histogram *h, struct ts_histogram_snapshot *out)
{
	struct ts_histogram *m = (struct ts_histogram *)h;   /* atomics read only */
	uint64_t cum = 0;

	for (size_t i = 0; i <= h->nbounds; i++) {
		cum += atomic_load_explicit(&m->bucket[i], memory_order_relaxed);
		out->cumulative[i] = cum;
	}
	out->count = cum;
	out->sum_seconds = (double)atomic_load_explicit(&m->sum_ns, memory_order_relaxed) / 1e9;
}
