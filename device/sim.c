/*
 * sim.c - simulated accelerators: device memory is host memory with a hard
 * capacity, copies run on per-queue copy threads.
 *
 * A sim device stands in for a GPU where there is none. Its memory is
 * shareable host mappings (memfd, hostmem.c: charged only once touched, and
 * never touched here), so that a lease hands it to a client on the node as
 * a GPU's memory is handed by a CUDA IPC handle; counted
 * against the configured capacity with exact sizes: an allocation past the
 * remaining capacity is refused with RESOURCE_EXHAUSTED, whatever the host
 * could give. Each queue is a copy thread running memcpy jobs in order
 * (hostq.c); a device-local fault injector makes copies fail on demand, for
 * tests of the failure paths.
 *
 * Invariants: 0 <= used <= capacity; used is the sum of the sizes of the
 * device allocations not yet freed.
 *
 * Thread-safety: all functions may be called from any thread; used is
 * guarded by the device's mutex, the injector is atomic.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/copy.h"
#include "common/units.h"
#include "device/backend.h"

struct sim_dev {
	pthread_mutex_t mu;
	uint64_t capacity;       /* immutable */
	uint64_t used;           /* guarded by: mu */
	atomic_int fail_copies;  /* copies left to fail (fault injection) */
	atomic_int skip_copies;  /* copies to let through before those */
};

static const struct ts__backend_ops sim_ops;

#define SIM_STREAM_MIN ((size_t)8 << 20)

static struct sim_dev *sim_of(const struct ts_device *dev)
{
	return dev->impl;
}

static ts_status sim_mem_alloc(struct ts_device *dev, size_t size, void **out,
                               struct ts_error *err)
{
	struct sim_dev *s = sim_of(dev);
	uint64_t free_bytes;
	ts_status st;

	pthread_mutex_lock(&s->mu);
	free_bytes = s->capacity - s->used;
	if ((uint64_t)size > free_bytes) {
		pthread_mutex_unlock(&s->mu);
		return ts__oom(err, dev, TS_MEM_DEVICE, size, free_bytes,
		               s->capacity, NULL);
	}
	s->used += size;
	pthread_mutex_unlock(&s->mu);

	st = ts__host_pages_alloc(dev, TS_MEM_DEVICE, size, true, out, err);
	if (st != TS_OK) {
		pthread_mutex_lock(&s->mu);
		s->used -= size;
		pthread_mutex_unlock(&s->mu);
	}
	return st;
}

static void sim_mem_free(struct ts_device *dev, void *p, size_t size)
{
	struct sim_dev *s = sim_of(dev);

	ts__host_pages_free(dev, p, size);
	pthread_mutex_lock(&s->mu);
	s->used -= size <= s->used ? size : s->used;
	pthread_mutex_unlock(&s->mu);
}

/* Takes one injected failure, if any is left. */
static bool take_injected_failure(struct sim_dev *s)
{
	int left = atomic_load(&s->fail_copies), skip = atomic_load(&s->skip_copies);

	while (left > 0 && skip > 0)
		if (atomic_compare_exchange_weak(&s->skip_copies, &skip, skip - 1))
			return false;

	while (left > 0)
		if (atomic_compare_exchange_weak(&s->fail_copies, &left, left - 1))
			return true;
	return false;
}

static ts_status sim_copy(struct ts_device *dev, void *dst, const void *src,
                          size_t n, enum ts_copy_kind kind, struct ts_error *err)
{
	static const char *const kinds[] = {"H2D", "D2H", "D2D", "H2H"};
	size_t done;

	if (take_injected_failure(sim_of(dev)))
		return ts_error_set(err, TS_INTERNAL, "COPY_FAILED",
		                    "%s: %s copy of %zu bytes failed (injected)",
		                    dev->props.id, kinds[kind], n);
	/* into fresh pages of a host mapping (a new array's first copy), through
	 * its file: each page allocated as it is written, without a fault and
	 * a zeroing first (ts_host_mem_fill) */
	done = n >= SIM_STREAM_MIN ? ts_host_mem_fill_file(dev, dst, src, n) : 0;
	/* past the size of a last-level cache a copy leaves nothing of use in
	 * it: streaming stores skip reading every destination line first */
	if (n - done >= SIM_STREAM_MIN)
		ts_copy_streaming((char *)dst + done, (const char *)src + done, n - done);
	else
		memcpy((char *)dst + done, (const char *)src + done, n - done);
	return TS_OK;
}

static ts_status sim_queue_new(struct ts_device *dev, struct ts_queue **out,
                               struct ts_error *err)
{
	return ts__hostq_new(dev, sim_copy, out, err);
}

static ts_status sim_mem_info(struct ts_device *dev, uint64_t *free_bytes,
                              uint64_t *total_bytes, struct ts_error *err)
{
	struct sim_dev *s = sim_of(dev);

	pthread_mutex_lock(&s->mu);
	*free_bytes = s->capacity - s->used;
	*total_bytes = s->capacity;
	pthread_mutex_unlock(&s->mu);
	return TS_OK;
}

static void sim_device_free(struct ts_device *dev)
{
	struct sim_dev *s = sim_of(dev);

	pthread_mutex_destroy(&s->mu);
	free(s);
	dev->impl = NULL;
}

void ts__sim_inject_copy_failure(struct ts_device *dev, int n)
{
	if (!dev || dev->ops != &sim_ops)
		return;
	atomic_store(&sim_of(dev)->skip_copies, 0);
	atomic_store(&sim_of(dev)->fail_copies, n > 0 ? n : 0);
}

void ts__sim_inject_copy_failure_after(struct ts_device *dev, int skip, int n)
{
	if (!dev || dev->ops != &sim_ops)
		return;
	/* the skip first: a copy running meanwhile must not fail early */
	atomic_store(&sim_of(dev)->fail_copies, 0);
	atomic_store(&sim_of(dev)->skip_copies, skip > 0 ? skip : 0);
	atomic_store(&sim_of(dev)->fail_copies, n > 0 ? n : 0);
}

static const struct ts__backend_ops sim_ops = {
	.events = TS__EVENTS_HOST,
	.mem_alloc = sim_mem_alloc,
	.mem_free = sim_mem_free,
	.queue_new = sim_queue_new,
	.queue_free = ts__hostq_free,
	.queue_copy = ts__hostq_copy,
	.queue_host_fn = ts__hostq_host_fn,
	.queue_host_fn_named = ts__hostq_host_fn_named,
	.queue_wait_event = ts__hostq_wait_event,
	.queue_sync = ts__hostq_sync,
	.queue_reserve = ts__hostq_reserve,
	.event_new = ts__hostev_new,
	.event_free = ts__hostev_free,
	.event_record = ts__hostev_record,
	.event_done = ts__hostev_done,
	.event_sync = ts__hostev_sync,
	.device_sync = ts__hostq_device_sync,
	.mem_info = sim_mem_info,
	.device_free = sim_device_free,
};

/* One sim device with its capacity; appended to ctx. */
static ts_status sim_add(struct ts__discover_ctx *ctx, int ordinal,
                         uint64_t capacity, struct ts_error *err)
{
	struct ts_device *dev = ts__device_new(ctx, TS_BACKEND_SIM, ordinal, &sim_ops);
	struct sim_dev *s;

	if (!dev)
		goto out_oom;
	s = calloc(1, sizeof *s);
	if (!s)
		goto out_dev;
	if (pthread_mutex_init(&s->mu, NULL) != 0)
		goto out_impl;
	s->capacity = capacity;
	atomic_init(&s->fail_copies, 0);
	atomic_init(&s->skip_copies, 0);
	dev->impl = s;

	snprintf(dev->props.name, sizeof dev->props.name,
	         "tstage simulated accelerator");
	dev->props.total_memory = capacity;
	dev->props.free_memory = capacity;
	dev->props.multiprocessors = 1;   /* one copy thread per queue */
	return ts__discover_add(ctx, dev, err);

out_impl:
	free(s);
out_dev:
	ts__device_destroy(dev);
out_oom:
	return ts_error_oom(err, "sim:%d: out of memory during discovery", ordinal);
}

ts_status ts__sim_discover(struct ts__discover_ctx *ctx,
                           struct ts_backend_info *info,
                           struct ts_error *err)
{
	uint64_t capacity = ctx->cfg->sim_device_memory;
	char cap_h[32];
	ts_status st;

	if (capacity == 0)
		capacity = TS__SIM_DEFAULT_MEMORY;
	memset(info, 0, sizeof *info);
	info->kind = TS_BACKEND_SIM;
	info->compiled = true;
	for (int i = 0; i < ctx->sim_devices; i++) {
		st = sim_add(ctx, i, capacity, err);
		if (st != TS_OK)
			return st;
		info->device_count++;
	}
	info->available = info->device_count > 0;
	ts_format_bytes(cap_h, sizeof cap_h, capacity);
	if (info->available)
		snprintf(info->detail, sizeof info->detail,
		         "%d simulated device%s of %s each (host memory)",
		         info->device_count, info->device_count == 1 ? "" : "s", cap_h);
	else
		snprintf(info->detail, sizeof info->detail,
		         "no simulated devices configured");
	return TS_OK;
}
