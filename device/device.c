/*
 * device.c - the device set and the backend-independent half of device.h
 * (the kinds' names and what backends call of the core are backend.c's).
 *
 * A device set is every device the backends found, in the order cuda, sim,
 * cpu, with one info record per backend. The public queue, event and memory
 * functions check their arguments here, refuse work on a broken device, and
 * dispatch through the device's backend ops. Pinned and pageable host memory
 * are served here for every backend (pinned through the set's provider).
 *
 * Invariants: a set always holds cpu:0; the device array and the backend
 * infos do not change after ts_device_set_new returns.
 *
 * Thread-safety: the set is immutable once built; per-device queue lists are
 * guarded by the device's queues_mu.
 */
#include "device/device.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/units.h"
#include "device/backend.h"

struct ts_device_set {
	struct ts_device **devices;                 /* immutable after new */
	size_t count;
	struct ts_backend_info info[TS_BACKEND_COUNT];
	struct ts__pinned_ops pinned;               /* immutable after new */
	struct ts__host_maps host_maps;             /* its devices' shareable host memory */
};

static const char *const copy_kind_names[] = {
	[TS_COPY_H2D] = "H2D",
	[TS_COPY_D2H] = "D2H",
	[TS_COPY_D2D] = "D2D",
	[TS_COPY_H2H] = "H2H",
};

/* ---- the set -------------------------------------------------------------- */

/* Frees a device of the set: its leftover queues (waiting for their work),
 * then the backend's state. */
static void device_release(struct ts_device *dev)
{
	struct ts_queue *q;

	pthread_mutex_lock(&dev->queues_mu);
	while ((q = dev->queues) != NULL) {
		dev->queues = q->next;
		if (dev->queues)
			dev->queues->prev = NULL;
		pthread_mutex_unlock(&dev->queues_mu);
		dev->ops->queue_free(q);
		pthread_mutex_lock(&dev->queues_mu);
	}
	pthread_mutex_unlock(&dev->queues_mu);
	dev->ops->device_sync(dev, NULL);
	ts__device_destroy(dev);
}

static void resolve_host(const struct ts_device_config *cfg, char *buf, size_t len)
{
	if (cfg->host) {
		snprintf(buf, len, "%s", cfg->host);
		return;
	}
	if (gethostname(buf, len) != 0) {
		snprintf(buf, len, "localhost");
		return;
	}
	buf[len - 1] = '\0';
}

ts_status ts_device_set_new(const struct ts_device_config *cfg,
                            struct ts_device_set **out, struct ts_error *err)
{
	static const struct ts_device_config defaults = {
		.sim_devices = -1, .sim_device_memory = 0, .cuda = true, .host = NULL,
	};
	struct ts__discover_ctx ctx = {0};
	struct ts_device_set *set;
	char host[64];
	ts_status st;

	*out = NULL;
	if (!cfg)
		cfg = &defaults;
	set = calloc(1, sizeof *set);
	if (!set)
		return ts_error_oom(err, "device set: out of memory");
	ts__host_maps_init(&set->host_maps);
	ts__pinned_ops_default(&set->pinned, &set->host_maps);
	resolve_host(cfg, host, sizeof host);
	ctx.cfg = cfg;
	ctx.host = host;
	ctx.pinned = &set->pinned;
	ctx.host_maps = &set->host_maps;

	st = ts__cuda_discover(&ctx, &set->info[TS_BACKEND_CUDA], err);
	if (st != TS_OK)
		goto out_free;
	if (cfg->sim_devices >= 0)
		ctx.sim_devices = cfg->sim_devices;
	else
		ctx.sim_devices = set->info[TS_BACKEND_CUDA].device_count > 0 ? 0 : 2;
	st = ts__sim_discover(&ctx, &set->info[TS_BACKEND_SIM], err);
	if (st != TS_OK)
		goto out_free;
	st = ts__cpu_discover(&ctx, &set->info[TS_BACKEND_CPU], err);
	if (st != TS_OK)
		goto out_free;

	set->devices = ctx.devices;
	set->count = ctx.count;
	*out = set;
	return TS_OK;

out_free:
	for (size_t i = ctx.count; i-- > 0;)
		device_release(ctx.devices[i]);
	free(ctx.devices);
	ts__host_maps_release(&set->host_maps);
	free(set);
	return st;
}

void ts_device_set_free(struct ts_device_set *set)
{
	if (!set)
		return;
	/* CUDA devices last: the pinned provider may live in their context. */
	for (size_t i = set->count; i-- > 0;)
		device_release(set->devices[i]);
	free(set->devices);
	ts__host_maps_release(&set->host_maps);
	free(set);
}

size_t ts_device_set_count(const struct ts_device_set *set)
{
	return set->count;
}

void ts_device_set_trace(struct ts_device_set *set, struct ts_trace *trace)
{
	for (size_t i = 0; i < set->count; i++) {
		set->devices[i]->trace = trace;
		set->devices[i]->trace_pid = (uint32_t)i + 1;
	}
}

void ts_device_set_topology(struct ts_device_set *set, const struct ts_topology *t)
{
	for (size_t i = 0; i < set->count; i++)
		set->devices[i]->topo = t;
}

const struct ts_topology *ts_device_topology(const struct ts_device *dev)
{
	return dev->topo;
}

void ts_device_set_trace_flush(struct ts_device_set *set)
{
	for (size_t i = 0; i < set->count; i++) {
		struct ts_device *dev = set->devices[i];

		if (!dev->ops->queue_trace_flush)
			continue;
		pthread_mutex_lock(&dev->queues_mu);
		for (struct ts_queue *q = dev->queues; q; q = q->next)
			dev->ops->queue_trace_flush(q);
		pthread_mutex_unlock(&dev->queues_mu);
	}
}

struct ts_device *ts_device_set_at(const struct ts_device_set *set, size_t i)
{
	return i < set->count ? set->devices[i] : NULL;
}

struct ts_device *ts_device_set_find(const struct ts_device_set *set,
                                     const char *id)
{
	if (!id)
		return NULL;
	for (size_t i = 0; i < set->count; i++)
		if (strcmp(set->devices[i]->props.id, id) == 0)
			return set->devices[i];
	return NULL;
}

void ts_device_set_backend(const struct ts_device_set *set,
                           enum ts_backend_kind kind,
                           struct ts_backend_info *out)
{
	if ((unsigned)kind >= TS_BACKEND_COUNT) {
		memset(out, 0, sizeof *out);
		out->kind = kind;
		snprintf(out->detail, sizeof out->detail, "unknown backend");
		return;
	}
	*out = set->info[kind];
}

enum ts_backend_kind ts_device_set_default_backend(const struct ts_device_set *set)
{
	for (int k = 0; k < TS_BACKEND_COUNT; k++)
		if (set->info[k].device_count > 0)
			return (enum ts_backend_kind)k;
	return TS_BACKEND_CPU;
}

/* ---- devices ------------------------------------------------------------- */

const struct ts_device_props *ts_device_props(const struct ts_device *dev)
{
	return &dev->props;
}

bool ts_device_has_memory_kind(const struct ts_device *dev, enum ts_memory_kind k)
{
	return dev && (unsigned)k < TS_MEM_KIND_COUNT;
}

static ts_status refuse_broken(const struct ts_device *dev, struct ts_error *err)
{
	return ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN",
	                    "%s is unusable after an unrecoverable (sticky) error",
	                    dev->props.id);
}

/* Bad input, through the one helper (common/status.h). */
#define BAD_ARGUMENT(err, what) ts_error_bad((err), "INVALID_ARGUMENT", NULL, "%s", (what))

ts_status ts_device_mem_alloc(struct ts_device *dev, enum ts_memory_kind kind,
                              size_t size, void **out, struct ts_error *err)
{
	*out = NULL;
	if (!dev || (unsigned)kind >= TS_MEM_KIND_COUNT)
		return BAD_ARGUMENT(err, "device memory allocation: no device or unknown memory kind");
	if (size == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "%s/%s: cannot allocate 0 bytes", dev->props.id,
		                    ts_memory_kind_name(kind));
	if (ts_device_broken(dev))
		return refuse_broken(dev, err);
	switch (kind) {
	case TS_MEM_DEVICE:
		return dev->ops->mem_alloc(dev, size, out, err);
	case TS_MEM_PINNED_HOST:
		return dev->pinned->alloc(dev->pinned->ctx, dev, size, out, err);
	case TS_MEM_UNPINNED_HOST:
	default:
		return ts__host_pages_alloc(dev, kind, size, false, out, err);
	}
}

void ts_device_mem_free(struct ts_device *dev, enum ts_memory_kind kind,
                        void *p, size_t size)
{
	if (!dev || !p)
		return;
	switch (kind) {
	case TS_MEM_DEVICE:
		dev->ops->mem_free(dev, p, size);
		break;
	case TS_MEM_PINNED_HOST:
		dev->pinned->free(dev->pinned->ctx, p, size);
		break;
	case TS_MEM_UNPINNED_HOST:
		ts__host_pages_free(dev, p, size);
		break;
	default:
		break;
	}
}

ts_status ts_device_sync(struct ts_device *dev, struct ts_error *err)
{
	if (!dev)
		return BAD_ARGUMENT(err, "device sync: no device");
	if (ts_device_broken(dev))
		return refuse_broken(dev, err);
	return dev->ops->device_sync(dev, err);
}

ts_status ts_device_mem_info(struct ts_device *dev, uint64_t *free_bytes,
                             uint64_t *total_bytes, struct ts_error *err)
{
	uint64_t f = 0, t = 0;
	ts_status st;

	if (!dev)
		return BAD_ARGUMENT(err, "device memory info: no device");
	if (ts_device_broken(dev))
		return refuse_broken(dev, err);
	st = dev->ops->mem_info(dev, &f, &t, err);
	if (free_bytes)
		*free_bytes = f;
	if (total_bytes)
		*total_bytes = t;
	return st;
}

ts_status ts_device_peer_caps(struct ts_device *dev, struct ts_device *peer,
                              struct ts_peer_caps *out, struct ts_error *err)
{
	memset(out, 0, sizeof *out);
	if (!dev || !peer)
		return BAD_ARGUMENT(err, "peer capabilities: no device");
	if (dev == peer || dev->ops != peer->ops || !dev->ops->peer_caps)
		return TS_OK;
	if (ts_device_broken(dev))
		return refuse_broken(dev, err);
	return dev->ops->peer_caps(dev, peer, out, err);
}

/* ---- queues -------------------------------------------------------------- */

ts_status ts_queue_new(struct ts_device *dev, struct ts_queue **out,
                       struct ts_error *err)
{
	struct ts_queue *q = NULL;
	ts_status st;

	*out = NULL;
	if (!dev)
		return BAD_ARGUMENT(err, "queue: no device");
	if (ts_device_broken(dev))
		return refuse_broken(dev, err);
	st = dev->ops->queue_new(dev, &q, err);
	if (st != TS_OK)
		return st;
	q->dev = dev;
	pthread_mutex_lock(&dev->queues_mu);
	q->track = ++dev->nqueues_made;
	atomic_store_explicit(&q->label, "queue", memory_order_relaxed);
	q->prev = NULL;
	q->next = dev->queues;
	if (dev->queues)
		dev->queues->prev = q;
	dev->queues = q;
	pthread_mutex_unlock(&dev->queues_mu);
	*out = q;
	return TS_OK;
}

void ts_queue_free(struct ts_queue *q)
{
	struct ts_device *dev;

	if (!q)
		return;
	dev = q->dev;
	pthread_mutex_lock(&dev->queues_mu);
	if (q->prev)
		q->prev->next = q->next;
	else
		dev->queues = q->next;
	if (q->next)
		q->next->prev = q->prev;
	q->prev = q->next = NULL;
	pthread_mutex_unlock(&dev->queues_mu);
	dev->ops->queue_free(q);
}

const char *ts__copy_kind_name(enum ts_copy_kind kind)
{
	return kind <= TS_COPY_H2H ? copy_kind_names[kind] : "copy";
}

void ts__queue_trace_span(struct ts_queue *q, const char *cat, const char *name,
                          uint64_t t0_ns, uint64_t t1_ns, uint64_t bytes, uint64_t flow)
{
	struct ts_device *dev = q->dev;
	uint64_t gen = ts_trace_generation(dev->trace);

	if (!ts_trace_on(dev->trace))
		return;
	if (atomic_exchange_explicit(&q->trace_named, gen, memory_order_relaxed) != gen) {
		char track[TS_TRACE_NAME_MAX];

		snprintf(track, sizeof track, "%.24s queue %u",
		         atomic_load_explicit(&q->label, memory_order_relaxed), q->track);
		ts_trace_name_process(dev->trace, dev->trace_pid, dev->props.id);
		ts_trace_name_track(dev->trace, dev->trace_pid, q->track, track);
	}
	ts_trace_span(dev->trace, dev->trace_pid, q->track, cat, name, NULL, t0_ns, t1_ns, 0,
	              bytes);
	ts_trace_flow_end(dev->trace, dev->trace_pid, q->track, flow, t0_ns + (t1_ns - t0_ns) / 2);
}

void ts_queue_set_label(struct ts_queue *q, const char *label)
{
	atomic_store_explicit(&q->label, label, memory_order_relaxed);
}

struct ts_device *ts_queue_device(const struct ts_queue *q)
{
	return q->dev;
}

void *ts_queue_native(const struct ts_queue *q)
{
	if (!q || !q->dev->ops->queue_native)
		return NULL;
	return q->dev->ops->queue_native(q);
}

ts_status ts_queue_copy(struct ts_queue *q, void *dst, const void *src,
                        size_t n, enum ts_copy_kind kind, struct ts_error *err)
{
	ts_status st;

	if (!q || (unsigned)kind > TS_COPY_H2H)
		return BAD_ARGUMENT(err, "copy: no queue or unknown copy kind");
	if (n == 0)
		return TS_OK;
	if (!dst || !src)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "%s: %s copy of %zu bytes with a NULL end",
		                    q->dev->props.id, copy_kind_names[kind], n);
	if (ts_device_broken(q->dev))
		return refuse_broken(q->dev, err);
	st = q->dev->ops->queue_copy(q, dst, src, n, kind, err);
	if (st == TS_OK) {
		atomic_fetch_add_explicit(&q->dev->copies, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&q->dev->copied[kind], n, memory_order_relaxed);
	}
	return st;
}

uint64_t ts_device_copied_bytes(const struct ts_device *dev, enum ts_copy_kind kind)
{
	if ((unsigned)kind > TS_COPY_H2H)
		return 0;
	return atomic_load_explicit(&((struct ts_device *)dev)->copied[kind], memory_order_relaxed);
}

bool ts_device_copies_queued(const struct ts_device *dev, uint64_t *out)
{
	if (dev->props.backend == TS_BACKEND_CUDA)
		return false;
	*out = atomic_load_explicit(&((struct ts_device *)dev)->copies_queued,
	                            memory_order_relaxed);
	return true;
}

uint64_t ts_device_copies(const struct ts_device *dev)
{
	return atomic_load_explicit(&((struct ts_device *)dev)->copies, memory_order_relaxed);
}

ts_status ts_queue_host_fn(struct ts_queue *q, void (*fn)(void *arg), void *arg,
                           struct ts_error *err)
{
	if (!q || !fn)
		return BAD_ARGUMENT(err, "host function: no queue or no function");
	if (ts_device_broken(q->dev))
		return refuse_broken(q->dev, err);
	return q->dev->ops->queue_host_fn(q, fn, arg, err);
}

void *ts_queue_span_begin(struct ts_queue *q, const char *cat, const char *name)
{
	if (!q || !q->dev->ops->queue_span_begin || !ts_trace_on(q->dev->trace))
		return NULL;
	return q->dev->ops->queue_span_begin(q, cat, name);
}

void ts_queue_span_end(struct ts_queue *q, void *span)
{
	if (span)
		q->dev->ops->queue_span_end(q, span);
}

ts_status ts_queue_host_fn_named(struct ts_queue *q, void (*fn)(void *arg), void *arg,
                                 const char *name, struct ts_error *err)
{
	if (!q || !fn)
		return BAD_ARGUMENT(err, "host function: no queue or no function");
	if (ts_device_broken(q->dev))
		return refuse_broken(q->dev, err);
	if (!q->dev->ops->queue_host_fn_named)
		return q->dev->ops->queue_host_fn(q, fn, arg, err);
	return q->dev->ops->queue_host_fn_named(q, fn, arg, name, err);
}

ts_status ts_queue_reserve(struct ts_queue *q, size_t jobs, struct ts_error *err)
{
	if (!q)
		return BAD_ARGUMENT(err, "reserve: no queue");
	if (!q->dev->ops->queue_reserve)
		return TS_OK;
	return q->dev->ops->queue_reserve(q, jobs, err);
}

ts_status ts_queue_wait_event(struct ts_queue *q, struct ts_event *ev,
                              struct ts_error *err)
{
	if (!q || !ev)
		return BAD_ARGUMENT(err, "wait: no queue or no event");
	if (q->dev->ops->events != ev->dev->ops->events)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "a queue of %s cannot wait on an event of %s",
		                    q->dev->props.id, ev->dev->props.id);
	if (ts_device_broken(q->dev))
		return refuse_broken(q->dev, err);
	return q->dev->ops->queue_wait_event(q, ev, err);
}

ts_status ts_queue_sync(struct ts_queue *q, struct ts_error *err)
{
	if (!q)
		return BAD_ARGUMENT(err, "queue sync: no queue");
	if (ts_device_broken(q->dev))
		return refuse_broken(q->dev, err);
	return q->dev->ops->queue_sync(q, err);
}

/* ---- events -------------------------------------------------------------- */

ts_status ts_event_new(struct ts_device *dev, struct ts_event **out,
                       struct ts_error *err)
{
	struct ts_event *ev = NULL;
	ts_status st;

	*out = NULL;
	if (!dev)
		return BAD_ARGUMENT(err, "event: no device");
	if (ts_device_broken(dev))
		return refuse_broken(dev, err);
	st = dev->ops->event_new(dev, &ev, err);
	if (st != TS_OK)
		return st;
	ev->dev = dev;
	*out = ev;
	return TS_OK;
}

void ts_event_free(struct ts_event *ev)
{
	if (ev)
		ev->dev->ops->event_free(ev);
}

ts_status ts_event_record(struct ts_event *ev, struct ts_queue *q,
                          struct ts_error *err)
{
	if (!ev || !q)
		return BAD_ARGUMENT(err, "record: no event or no queue");
	if (ev->dev != q->dev)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "an event of %s cannot be recorded on a queue of %s",
		                    ev->dev->props.id, q->dev->props.id);
	if (ts_device_broken(q->dev))
		return refuse_broken(q->dev, err);
	return q->dev->ops->event_record(ev, q, err);
}

bool ts_event_done(struct ts_event *ev)
{
	if (!ev)
		return true;
	return ev->dev->ops->event_done(ev);
}

ts_status ts_event_sync(struct ts_event *ev, struct ts_error *err)
{
	if (!ev)
		return BAD_ARGUMENT(err, "event sync: no event");
	if (ts_device_broken(ev->dev))
		return refuse_broken(ev->dev, err);
	return ev->dev->ops->event_sync(ev, err);
}
