/*
 * backend.c - the part of device/ that backends build on (backend.h): the
 * names of device.h's kinds, a device's making and unmaking, its broken
 * flag, and the out-of-memory answer in device terms.
 *
 * Calls between the files of device/ go one way: device.c (the set and
 * the public functions) calls the backends' discovery, hostmem.c and this
 * file; the backends (cuda_backend.c, sim.c, cpu.c) call hostq.c,
 * hostmem.c and this file; hostmem.c calls this file; this file calls none
 * of them.
 *
 * Thread-safety: the names are immutable; ts__device_mark_broken and
 * ts_device_broken are atomic; a device is made and unmade by one thread
 * (discovery, the set's release).
 */
#include "device/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const memory_kind_names[TS_MEM_KIND_COUNT] = {
	[TS_MEM_DEVICE] = "device",
	[TS_MEM_PINNED_HOST] = "pinned_host",
	[TS_MEM_UNPINNED_HOST] = "unpinned_host",
};

static const char *const backend_names[TS_BACKEND_COUNT] = {
	[TS_BACKEND_CUDA] = "cuda",
	[TS_BACKEND_SIM] = "sim",
	[TS_BACKEND_CPU] = "cpu",
};

const char *ts_memory_kind_name(enum ts_memory_kind kind)
{
	if ((unsigned)kind >= TS_MEM_KIND_COUNT)
		return "unknown";
	return memory_kind_names[kind];
}

bool ts_memory_kind_parse(const char *s, enum ts_memory_kind *out)
{
	if (!s)
		return false;
	for (int k = 0; k < TS_MEM_KIND_COUNT; k++) {
		if (strcmp(s, memory_kind_names[k]) == 0) {
			if (out)
				*out = (enum ts_memory_kind)k;
			return true;
		}
	}
	return false;
}

const char *ts_backend_name(enum ts_backend_kind kind)
{
	if ((unsigned)kind >= TS_BACKEND_COUNT)
		return "unknown";
	return backend_names[kind];
}

/* ---- devices, as backends make them ------------------------------------- */

ts_status ts__oom(struct ts_error *err, const struct ts_device *dev,
                  enum ts_memory_kind kind, uint64_t requested,
                  uint64_t free_bytes, uint64_t limit_bytes, const char *cause)
{
	char where[96];
	struct ts_oom_figures f = {
		.where = where,
		.ids = {{"device", dev->props.id}, {"memory_kind", ts_memory_kind_name(kind)}},
		.requested = requested, .free_bytes = free_bytes, .limit = limit_bytes,
		.largest = TS_ERROR_UNKNOWN_BYTES, .cause = cause,
	};

	snprintf(where, sizeof where, "%s/%s", dev->props.id, ts_memory_kind_name(kind));
	return ts_error_oom_bytes(err, &f);
}

struct ts_device *ts__device_new(struct ts__discover_ctx *ctx,
                                 enum ts_backend_kind backend, int ordinal,
                                 const struct ts__backend_ops *ops)
{
	struct ts_device *dev = calloc(1, sizeof *dev);

	if (!dev)
		return NULL;
	if (pthread_mutex_init(&dev->queues_mu, NULL) != 0) {
		free(dev);
		return NULL;
	}
	snprintf(dev->props.id, sizeof dev->props.id, "%s:%d",
	         ts_backend_name(backend), ordinal);
	snprintf(dev->props.host, sizeof dev->props.host, "%s", ctx->host);
	dev->props.backend = backend;
	dev->props.ordinal = ordinal;
	dev->props.simulated = backend == TS_BACKEND_SIM;
	dev->ops = ops;
	dev->pinned = ctx->pinned;
	dev->host_maps = ctx->host_maps;
	atomic_init(&dev->broken, false);
	atomic_init(&dev->copies, 0);
	for (int k = 0; k <= TS_COPY_H2H; k++)
		atomic_init(&dev->copied[k], 0);
	atomic_init(&dev->copies_queued, 0);
	return dev;
}

void ts__device_destroy(struct ts_device *dev)
{
	if (!dev)
		return;
	if (dev->impl)
		dev->ops->device_free(dev);
	pthread_mutex_destroy(&dev->queues_mu);
	free(dev);
}

ts_status ts__discover_add(struct ts__discover_ctx *ctx, struct ts_device *dev,
                           struct ts_error *err)
{
	if (ctx->count == ctx->cap) {
		size_t cap = ctx->cap ? ctx->cap * 2 : 8;
		struct ts_device **v = realloc(ctx->devices, cap * sizeof *v);

		if (!v) {
			ts__device_destroy(dev);
			return ts_error_oom(err, "device discovery: out of memory");
		}
		ctx->devices = v;
		ctx->cap = cap;
	}
	ctx->devices[ctx->count++] = dev;
	return TS_OK;
}

/* ---- the broken flag ----------------------------------------------------- */

bool ts_device_broken(const struct ts_device *dev)
{
	return atomic_load(&dev->broken);
}

bool ts__device_mark_broken(struct ts_device *dev)
{
	bool expected = false;

	return atomic_compare_exchange_strong(&dev->broken, &expected, true);
}
