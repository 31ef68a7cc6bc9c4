/*
 * bench_transfer.c - the transfer core on its own: 1 GiB host->device and
 * device->host per path (pinned, pageable through the staging ring,
 * device->device, pinned both directions at once), each as a ratio to a
 * reference measured in the same run on the same buffers: single-thread
 * memcpy on sim (whose device memory is host memory); on CUDA a raw
 * cudaMemcpyAsync loop (64 MiB pieces on one stream of its own, then one
 * synchronisation), the runtime alone without tstage in between - for the
 * ring, that loop on the same pageable buffer (the driver's own staging).
 * Buffers are touched once before timing, and each figure is the best of a
 * few runs.
 *
 * The device->device row copies to a second device of the same backend
 * (cuda:1, sim:1), or within the first one where it is alone. BENCH_SECONDS
 * below 1 makes every buffer 1/4 GiB (and BENCH_MiB sets it outright).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if TS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "common/units.h"
#include "storage/stage.h"
#include "tests/bench/benchlib.h"

#define GiB (1ull << 30)
#define RUNS 3

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_stager *stg;

static struct ts_buffer *alloc(const char *dev, enum ts_memory_kind k, uint64_t n)
{
	struct ts_buffer *b = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	if (ts_buffer_new(ts_memory_find(mem, dev, k), n, &b, &err) != TS_OK) {
		fprintf(stderr, "bench_transfer: %s\n", err.message);
		exit(1);
	}
	return b;
}

static double best_copy(struct ts_buffer *dst, struct ts_buffer *src, uint64_t n)
{
	struct ts_run run = {0, 0, n};
	double best = 0;

	for (int r = 0; r < RUNS; r++) {
		struct ts_error err;
		uint64_t t0 = ts_now_ns();

		ts_error_clear(&err);
		if (ts_stage_copy_runs(stg, dst, src, &run, 1, &err) != TS_OK) {
			fprintf(stderr, "bench_transfer: %s\n", err.message);
			exit(1);
		}
		double rate = (double)n / ((double)(ts_now_ns() - t0) / 1e9);

		if (rate > best)
			best = rate;
	}
	return best;
}

#if TS_HAVE_CUDA
/* A raw cudaMemcpyAsync loop over n bytes on a stream of its own: bytes/s,
 * or 0 where the runtime refuses. */
static double raw_cuda_copy(void *dst, const void *src, uint64_t n, int ordinal)
{
	const uint64_t piece = 64ull << 20;
	cudaStream_t s;
	uint64_t t0;
	bool ok = true;

	if (cudaSetDevice(ordinal) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
		return 0;
	t0 = ts_now_ns();
	for (uint64_t o = 0; ok && o < n; o += piece)
		ok = cudaMemcpyAsync((char *)dst + o, (const char *)src + o,
		                     n - o < piece ? n - o : piece, cudaMemcpyDefault,
		                     s) == cudaSuccess;
	ok = cudaStreamSynchronize(s) == cudaSuccess && ok;
	t0 = ts_now_ns() - t0;
	cudaStreamDestroy(s);
	return ok ? (double)n / ((double)t0 / 1e9) : 0;
}
#endif

/* The reference: memcpy on host-visible memory, else the raw runtime loop. */
static double best_reference(struct ts_buffer *dst, struct ts_buffer *src, uint64_t n,
                             enum ts_copy_kind kind)
{
	double best = 0;

	for (int r = 0; r < RUNS; r++) {
		uint64_t t0 = ts_now_ns();
		double rate;

		if (ts_device_props(ts_buffer_device(dst))->simulated ||
		    ts_device_props(ts_buffer_device(src))->simulated || kind == TS_COPY_H2H) {
			memcpy(ts_buffer_data(dst), ts_buffer_data(src), n);
			rate = (double)n / ((double)(ts_now_ns() - t0) / 1e9);
		} else {
#if TS_HAVE_CUDA
			struct ts_device *d = kind == TS_COPY_D2H ? ts_buffer_device(src)
			                                          : ts_buffer_device(dst);

			rate = raw_cuda_copy(ts_buffer_data(dst), ts_buffer_data(src), n,
			                     ts_device_props(d)->ordinal);
#else
			rate = 0;
#endif
		}
		if (rate > best)
			best = rate;
	}
	if (best <= 0) {
		fprintf(stderr, "bench_transfer: the reference copy failed\n");
		exit(1);
	}
	return best;
}

/* The device of d0's backend after d0 (cuda:1 after cuda:0), else d0. */
static const char *second_of(const char *d0)
{
	struct ts_device *first = ts_device_set_find(set, d0);

	for (size_t i = 0; i < ts_device_set_count(set); i++) {
		struct ts_device *d = ts_device_set_at(set, i);

		if (d != first &&
		    ts_device_props(d)->backend == ts_device_props(first)->backend)
			return ts_device_props(d)->id;
	}
	return d0;
}

static void row(const char *name, double rate, double ref, double target)
{
	char v[32], r[48], t[32];

	bench_fmt_bandwidth(v, sizeof v, rate);
	bench_fmt_bandwidth(r, sizeof r, ref);
	strncat(r, " ref", sizeof r - strlen(r) - 1);
	snprintf(t, sizeof t, ">= %.2f", target);
	bench_row(name, v, r, rate / ref, t, true, rate / ref >= target);
}

/*
 * A copy through the staging ring against the same copy of the pageable
 * buffer by the runtime alone (on CUDA the driver's own staging, what any
 * program copying from a numpy array gets; on sim memcpy); its share of
 * the pinned rate (pinned_rate) printed beside it.
 */
static void ring_row(const char *tag, const char *sz, const char *what, struct ts_buffer *dst,
                     struct ts_buffer *src, uint64_t n, enum ts_copy_kind kind,
                     double pinned_rate, bool cuda)
{
	char name[96];
	double ring = best_copy(dst, src, n);

	snprintf(name, sizeof name, "xfer %s: %s %s (ring)", tag, sz, what);
	row(name, ring, best_reference(dst, src, n, kind), cuda ? 0.8 : 0.5);
	printf("xfer %s: %s (ring) / the same from pinned: %.2f\n", tag, what, ring / pinned_rate);
}

struct both_arg {
	struct ts_buffer *dst, *src;
	uint64_t n;
	double rate;
};

static void *both_thread(void *p)
{
	struct both_arg *a = p;

	a->rate = best_copy(a->dst, a->src, a->n);
	return NULL;
}

int main(void)
{
	struct ts_device_config dc = {.sim_devices = 2, .sim_device_memory = 3 * GiB, .cuda = true};
	struct ts_memory_config mc = {.device_memory_fraction = 0.5, .pinned_host_limit = 3 * GiB,
	                              .unpinned_host_limit = 4 * GiB, .pinned_segment = GiB};
	struct ts_error err;
	const char *d0, *d1;
	uint64_t n = (uint64_t)(bench_seconds(1.0) >= 1.0 ? GiB : GiB / 4);
	const char *mib = getenv("BENCH_MiB");
	bool cuda;

	ts_error_clear(&err);
	if (ts_device_set_new(&dc, &set, &err) != TS_OK || ts_memory_new(set, &mc, &mem, &err) != TS_OK ||
	    ts_stager_new(set, mem, &stg, &err) != TS_OK) {
		fprintf(stderr, "bench_transfer: %s\n", err.message);
		return 1;
	}
	cuda = ts_device_set_default_backend(set) == TS_BACKEND_CUDA;
	d0 = ts_device_props(ts_device_set_at(set, 0))->id;
	d1 = second_of(d0);
	if (mib && atoll(mib) > 0)
		n = (uint64_t)atoll(mib) << 20;
	printf("bench_transfer: %s -> %s for device -> device, %llu MiB per copy\n", d0, d1,
	       (unsigned long long)(n >> 20));
	{
		struct ts_buffer *pin = alloc(d0, TS_MEM_PINNED_HOST, n);
		struct ts_buffer *page = alloc(d0, TS_MEM_UNPINNED_HOST, n);
		struct ts_buffer *dev = alloc(d0, TS_MEM_DEVICE, n);
		struct ts_buffer *dev1 = alloc(d1, TS_MEM_DEVICE, n);
		double ref_h2d, ref_d2h;
		const char *tag = cuda ? "cuda" : "sim";
		char name[96], sz[24];
		double target = cuda ? 0.95 : 0.8;

		if (n % GiB == 0)
			snprintf(sz, sizeof sz, "%llu GiB", (unsigned long long)(n / GiB));
		else
			snprintf(sz, sizeof sz, "%llu MiB", (unsigned long long)(n >> 20));
		/* touch everything once: first touch of fresh pages is slow here */
		memset(ts_buffer_data(pin), 1, n);
		memset(ts_buffer_data(page), 2, n);
		best_copy(dev, pin, n);
		best_copy(dev1, pin, n);
		ref_h2d = best_reference(dev, pin, n, TS_COPY_H2D);
		ref_d2h = best_reference(pin, dev, n, TS_COPY_D2H);
		snprintf(name, sizeof name, "xfer %s: %s pinned -> device", tag, sz);
		row(name, best_copy(dev, pin, n), ref_h2d, target);
		snprintf(name, sizeof name, "xfer %s: %s device -> pinned", tag, sz);
		row(name, best_copy(pin, dev, n), ref_d2h, target);
		ring_row(tag, sz, "unpinned -> device", dev, page, n, TS_COPY_H2D, ref_h2d, cuda);
		ring_row(tag, sz, "device -> unpinned", page, dev, n, TS_COPY_D2H, ref_d2h, cuda);
		snprintf(name, sizeof name, "xfer %s: %s device -> device", tag, sz);
		row(name, best_copy(dev1, dev, n), best_reference(dev1, dev, n, TS_COPY_D2D),
		    cuda ? 0.9 : 0.8);
		{
			/* pinned both ways: the goal is the link's two directions */
			struct ts_buffer *pin2 = alloc(d0, TS_MEM_PINNED_HOST, n / 2);
			struct both_arg up = {dev, pin, n / 2, 0}, down = {pin2, dev1, n / 2, 0};
			pthread_t a, b;

			pthread_create(&a, NULL, both_thread, &up);
			pthread_create(&b, NULL, both_thread, &down);
			pthread_join(a, NULL);
			pthread_join(b, NULL);
			snprintf(name, sizeof name, "xfer %s: both directions at once (sum)", tag);
			row(name, up.rate + down.rate, ref_h2d, cuda ? 1.6 : 0.8);
			ts_buffer_unref(pin2);
		}
		ts_buffer_unref(pin);
		ts_buffer_unref(page);
		ts_buffer_unref(dev);
		ts_buffer_unref(dev1);
	}
	ts_stager_free(stg);
	ts_memory_free(mem);
	ts_device_set_free(set);
	return 0;
}
