/*
 * backend.h - what a device backend implements, and the pieces backends share.
 *
 * Internal to device/: nothing above this layer includes it. A backend (cuda,
 * sim, cpu) fills a struct ts__backend_ops; the public functions of device.h
 * check their arguments in device.c and dispatch through dev->ops. Backend
 * queues and events embed struct ts_queue / struct ts_event as their first
 * member, so a backend casts the public pointer to its own type. What the
 * backends call of the core (making a device, adding it to the set being
 * discovered, the broken flag, ts__oom) is backend.c's, below device.c:
 * device.c calls the backends, never the other way.
 *
 * Invariants: a device's props, ops and pinned provider are immutable after
 * discovery; its broken flag only ever goes from false to true; every live
 * queue of a device is on its queue list, linked by device.c.
 *
 * Thread-safety: ops are called from any thread, concurrently, and must be
 * safe for that; the queue list is guarded by the device's queues_mu.
 */
#ifndef TS_DEVICE_BACKEND_H
#define TS_DEVICE_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/lock.h"
#include "common/status.h"
#include "common/trace.h"
#include "device/device.h"

/* Default capacity of a sim device when the configuration says 0. */
#define TS__SIM_DEFAULT_MEMORY (2ULL << 30)

/* The base every backend queue embeds first. */
struct ts_queue {
	struct ts_device *dev;          /* immutable */
	struct ts_queue *prev, *next;   /* guarded by: dev->queues_mu */
	uint32_t track;                 /* immutable: its number on dev, for traces */
	_Atomic(const char *) label;    /* a static string: what it carries ("h2d") */
	_Atomic uint64_t trace_named;   /* the trace generation its track was named in */
};

/* The base every backend event embeds first. */
struct ts_event {
	struct ts_device *dev;          /* immutable */
};

/*
 * Which events a queue can wait on: queues of the host family (sim, cpu)
 * wait on any host-family event; CUDA streams on any CUDA event.
 */
enum ts__event_family {
	TS__EVENTS_HOST = 0,
	TS__EVENTS_CUDA,
};

/* The collectives of device.h's ts_comm. */
enum ts__coll {
	TS__COLL_ALLREDUCE = 0,
	TS__COLL_REDUCE_SCATTER,
	TS__COLL_ALL_GATHER,
};

/*
 * The operations of one backend. device.c has already checked the
 * arguments (non-NULL, known kinds, event and queue of compatible families,
 * device not broken) before it calls one. Failures are reported through err
 * with the backend's own error translated once, where it arises.
 */
struct ts__backend_ops {
	enum ts__event_family events;

	/* Device memory of exactly size (> 0) bytes, untouched. */
	ts_status (*mem_alloc)(struct ts_device *dev, size_t size, void **out,
	                       struct ts_error *err);
	void (*mem_free)(struct ts_device *dev, void *p, size_t size);

	/* A new queue (not yet on the device's list: device.c links it). */
	ts_status (*queue_new)(struct ts_device *dev, struct ts_queue **out,
	                       struct ts_error *err);
	/* Waits for the queue's work, then frees it (already unlinked). */
	void (*queue_free)(struct ts_queue *q);
	ts_status (*queue_copy)(struct ts_queue *q, void *dst, const void *src,
	                        size_t n, enum ts_copy_kind kind,
	                        struct ts_error *err);
	ts_status (*queue_host_fn)(struct ts_queue *q, void (*fn)(void *arg),
	                           void *arg, struct ts_error *err);
	/* The same, with the name its span has in traces (static); optional:
	 * NULL when the backend's host functions are not traced. */
	ts_status (*queue_host_fn_named)(struct ts_queue *q, void (*fn)(void *arg), void *arg,
	                                 const char *name, struct ts_error *err);
	ts_status (*queue_wait_event)(struct ts_queue *q, struct ts_event *ev,
	                              struct ts_error *err);
	ts_status (*queue_sync)(struct ts_queue *q, struct ts_error *err);
	/* Makes the next `jobs` submissions to q (copies, host functions, event
	 * records and waits) need no allocation; optional: NULL when the
	 * backend's submissions allocate nothing on the host. */
	ts_status (*queue_reserve)(struct ts_queue *q, size_t jobs, struct ts_error *err);
	/* The queue's native handle (a cudaStream_t); optional: NULL when the
	 * backend has none. */
	void *(*queue_native)(const struct ts_queue *q);
	/* Records the spans of traced work that has finished on q and is not
	 * yet recorded; optional: NULL when a backend records as work ends. */
	void (*queue_trace_flush)(struct ts_queue *q);
	/* While a trace records: brackets the work enqueued on q between the
	 * two calls as one span (cat, name: static strings) timed by the device
	 * itself; begin answers NULL when it cannot (the work goes untraced),
	 * end takes that NULL too. Optional: NULL when the backend traces its
	 * work another way (sim and cpu name their host functions). */
	void *(*queue_span_begin)(struct ts_queue *q, const char *cat, const char *name);
	void (*queue_span_end)(struct ts_queue *q, void *span);

	ts_status (*event_new)(struct ts_device *dev, struct ts_event **out,
	                       struct ts_error *err);
	void (*event_free)(struct ts_event *ev);
	ts_status (*event_record)(struct ts_event *ev, struct ts_queue *q,
	                          struct ts_error *err);
	bool (*event_done)(struct ts_event *ev);
	ts_status (*event_sync)(struct ts_event *ev, struct ts_error *err);

	ts_status (*device_sync)(struct ts_device *dev, struct ts_error *err);
	ts_status (*mem_info)(struct ts_device *dev, uint64_t *free_bytes,
	                      uint64_t *total_bytes, struct ts_error *err);

	/* Whether dev may access peer's memory (another device of the same
	 * backend); optional: NULL when the backend cannot tell. */
	ts_status (*peer_caps)(struct ts_device *dev, struct ts_device *peer,
	                       struct ts_peer_caps *out, struct ts_error *err);

	/* Collectives (device.h's ts_comm) over n devices of this backend;
	 * optional: NULL for the host family, whose collectives are comm.c's
	 * host functions. ctx is the backend's communicator. recv: NULL for
	 * the in-place forms, else a reduce-scatter's result per rank. */
	ts_status (*comm_new)(struct ts_device *const *devs, int n, void **ctx,
	                      struct ts_error *err);
	void (*comm_free)(void *ctx, int n);
	ts_status (*comm_run)(void *ctx, int n, enum ts__coll coll, struct ts_queue *const *qs,
	                      float *const *bufs, float *const *recv, uint64_t count,
	                      struct ts_error *err);

	/* Frees dev->impl; called once every queue is gone. */
	void (*device_free)(struct ts_device *dev);
};

/*
 * Where pinned host memory comes from, one per device set: cudaHostAlloc
 * (portable) once the CUDA backend has found a device, page-aligned host
 * memory otherwise. ctx is the provider's (for CUDA, the device whose
 * context allocates). dev is the device the memory is asked for, for
 * messages only.
 */
struct ts__pinned_ops {
	ts_status (*alloc)(void *ctx, struct ts_device *dev, size_t size,
	                   void **out, struct ts_error *err);
	void (*free)(void *ctx, void *p, size_t size);
	void *ctx;
	const char *source;             /* "cudaHostAlloc", "memfd+cudaHostRegister", "memfd" */
};

/*
 * The shareable host mappings of a device set (hostmem.c): memfd mappings
 * by base address, so that an address can be named as (descriptor, offset).
 * One per set, shared by its devices.
 */
struct ts__host_map {
	uintptr_t base;
	size_t size;
	int fd;
	bool sealed;                    /* against writes but the mapping's (F_SEAL_FUTURE_WRITE) */
};

struct ts__host_maps {
	struct ts_mutex mu;
	struct ts__host_map *maps;      /* guarded by: mu; sorted by base */
	size_t n, cap;                  /* guarded by: mu */
};

/* An empty table; frees one whose mappings are all gone. */
void ts__host_maps_init(struct ts__host_maps *m);
void ts__host_maps_release(struct ts__host_maps *m);

struct ts_device {
	struct ts_device_props props;           /* immutable after discovery */
	const struct ts__backend_ops *ops;      /* immutable */
	const struct ts__pinned_ops *pinned;    /* the set's; immutable after discovery */
	struct ts__host_maps *host_maps;        /* the set's; immutable after discovery */
	void *impl;                             /* the backend's */
	atomic_bool broken;                     /* set once, by a sticky error */
	_Atomic uint64_t copies;                /* copies accepted by its queues */
	_Atomic uint64_t copied[TS_COPY_H2H + 1];   /* their bytes, per direction */
	_Atomic uint64_t copies_queued;         /* accepted, not yet run (host queues) */
	_Atomic uint64_t collective_bytes;      /* its ranks' data in collectives (comm.c) */
	pthread_mutex_t queues_mu;
	struct ts_queue *queues;                /* guarded by: queues_mu */
	uint32_t nqueues_made;                  /* guarded by: queues_mu; numbers queues */
	/* the daemon's trace recorder (borrowed; NULL: none) and this device's
	 * process number in it: set by ts_device_set_trace before any work */
	struct ts_trace *trace;
	uint32_t trace_pid;
	/* the node's topology (borrowed; NULL: none): set by
	 * ts_device_set_topology before any queue */
	const struct ts_topology *topo;
};

/*
 * What one backend's discovery gets and fills. Devices are appended with
 * ts__discover_add in ordinal order.
 */
struct ts__discover_ctx {
	const struct ts_device_config *cfg;     /* borrowed; never NULL */
	const char *host;                       /* node name for props.host */
	int sim_devices;                        /* resolved count (>= 0) for sim */
	struct ts__pinned_ops *pinned;          /* the set's: CUDA replaces it */
	struct ts__host_maps *host_maps;        /* the set's */
	struct ts_device **devices;             /* owned by the set being built */
	size_t count, cap;
};

/*
 * Discovery of each backend, called by ts_device_set_new in the order cuda,
 * sim, cpu. Each fills info (kind, compiled, available, device_count,
 * detail) and appends its devices. A backend that finds nothing is not a
 * failure (TS_OK with available false and the reason in info->detail);
 * only running out of memory or threads is. The CUDA one lives in
 * cuda_backend.c, or in nocuda.c for builds without CUDA.
 */
/* The CUDA backend's collectives (cuda_comm.c: NCCL), its comm ops. */
ts_status ts__cuda_comm_new(struct ts_device *const *devs, int n, void **ctx,
                            struct ts_error *err);
void ts__cuda_comm_free(void *ctx, int n);
ts_status ts__cuda_comm_run(void *ctx, int n, enum ts__coll coll, struct ts_queue *const *qs,
                            float *const *bufs, float *const *recv, uint64_t count,
                            struct ts_error *err);

ts_status ts__cuda_discover(struct ts__discover_ctx *ctx,
                            struct ts_backend_info *info,
                            struct ts_error *err);
ts_status ts__sim_discover(struct ts__discover_ctx *ctx,
                           struct ts_backend_info *info,
                           struct ts_error *err);
ts_status ts__cpu_discover(struct ts__discover_ctx *ctx,
                           struct ts_backend_info *info,
                           struct ts_error *err);

/*
 * A new device of a backend with id "<backend>:<ordinal>", host, backend,
 * ordinal, ops and the set's pinned provider filled in; everything else in
 * props is zero for the backend to fill. Returns NULL when out of memory.
 * Owned by the caller until ts__discover_add takes it.
 */
struct ts_device *ts__device_new(struct ts__discover_ctx *ctx,
                                 enum ts_backend_kind backend, int ordinal,
                                 const struct ts__backend_ops *ops);

/* Frees a device that never reached the set (calls ops->device_free when
 * impl is set). */
void ts__device_destroy(struct ts_device *dev);

/* Appends dev to the set being built (steals it, also on failure, when it
 * is destroyed). RESOURCE_EXHAUSTED when out of memory. */
ts_status ts__discover_add(struct ts__discover_ctx *ctx, struct ts_device *dev,
                           struct ts_error *err);

/* Marks dev unusable (sticky error); true if this call flipped it. */
bool ts__device_mark_broken(struct ts_device *dev);

/*
 * Records an out-of-memory failure through the one builder (common/status.h,
 * ts_error_oom_bytes): "sim:0/device: cannot allocate 1048576 bytes
 * (1.00 MiB); 512 bytes (512 B) free of 4096 (4.00 KiB)", reason
 * OUT_OF_MEMORY, metadata device, memory_kind, requested_bytes, free_bytes,
 * limit_bytes. cause, when not NULL, is appended ("...: cudaMalloc: out of
 * memory"). Returns RESOURCE_EXHAUSTED (or the error already recorded in err).
 */
ts_status ts__oom(struct ts_error *err, const struct ts_device *dev,
                  enum ts_memory_kind kind, uint64_t requested,
                  uint64_t free_bytes, uint64_t limit_bytes, const char *cause);

/* ---- host memory (hostmem.c) --------------------------------------------- */

/*
 * Page-aligned host memory of exactly size bytes, never touched here: a
 * shareable memfd mapping (ts_host_mem_share), or anonymous pages when no
 * memfd can be had. noreserve is for sim device memory, whose capacity may
 * exceed what the host would commit: a memfd reserves nothing either, and
 * the anonymous fallback is then mapped MAP_NORESERVE, whatever made the
 * memfd fail. Shareable mappings are entered in dev->host_maps.
 * Fails with RESOURCE_EXHAUSTED (ts__oom wording, host MemAvailable as the
 * free figure). Owned by the caller; release with ts__host_pages_free.
 */
ts_status ts__host_pages_alloc(const struct ts_device *dev,
                               enum ts_memory_kind kind, size_t size,
                               bool noreserve, void **out,
                               struct ts_error *err);
void ts__host_pages_free(const struct ts_device *dev, void *p, size_t size);

/* The pinned provider without CUDA: host pages (see ts__host_pages_alloc)
 * entered in maps (its ctx). */
void ts__pinned_ops_default(struct ts__pinned_ops *ops, struct ts__host_maps *maps);

/* MemAvailable and MemTotal of /proc/meminfo, in bytes; an errno-translated
 * failure when it cannot be read. */
ts_status ts__host_meminfo(uint64_t *avail, uint64_t *total,
                           struct ts_error *err);

/* ---- host queues and events (hostq.c), shared by sim and cpu ------------- */

/*
 * A host queue is a worker thread running jobs (copies, host callbacks,
 * event signals and waits) in submission order. Copies run through the
 * backend's copy function, which may fail (sim fault injection). A failure
 * is sticky until a sync clears it, as on a CUDA stream but recoverable:
 *   - the job after a failed copy still runs (the failed copy wrote
 *     nothing); every event recorded after the failed copy completes with
 *     the queue's first failure, so no event ever reports success for work
 *     that depended on a failed copy;
 *   - ts_queue_sync waits, returns that failure and clears it: work and
 *     events submitted after the sync see a clean queue;
 *   - a queue that waited on an event that completed with a failure takes
 *     the failure as its own (it travels along dependencies).
 */
typedef ts_status (*ts__hostq_copy_fn)(struct ts_device *dev, void *dst,
                                       const void *src, size_t n,
                                       enum ts_copy_kind kind,
                                       struct ts_error *err);

/* A new host queue on dev whose copies run through copy. */
ts_status ts__hostq_new(struct ts_device *dev, ts__hostq_copy_fn copy,
                        struct ts_queue **out, struct ts_error *err);

/* The host-family implementations of the queue, event and device-sync
 * operations, for a backend's ops table. */
/* Records, when a trace is on, a span of q's work [t0_ns, t1_ns] on q's
 * track (cat, name static; bytes 0 for none) and the end of flow (0: none)
 * inside it; names the device's process and the queue's track. */
void ts__queue_trace_span(struct ts_queue *q, const char *cat, const char *name,
                          uint64_t t0_ns, uint64_t t1_ns, uint64_t bytes, uint64_t flow);

/* "H2D" etc. (static). */
const char *ts__copy_kind_name(enum ts_copy_kind kind);

void ts__hostq_free(struct ts_queue *q);
ts_status ts__hostq_copy(struct ts_queue *q, void *dst, const void *src,
                         size_t n, enum ts_copy_kind kind, struct ts_error *err);
ts_status ts__hostq_host_fn(struct ts_queue *q, void (*fn)(void *arg),
                            void *arg, struct ts_error *err);
ts_status ts__hostq_host_fn_named(struct ts_queue *q, void (*fn)(void *arg), void *arg,
                                  const char *name, struct ts_error *err);
ts_status ts__hostq_wait_event(struct ts_queue *q, struct ts_event *ev,
                               struct ts_error *err);
ts_status ts__hostq_sync(struct ts_queue *q, struct ts_error *err);
ts_status ts__hostq_reserve(struct ts_queue *q, size_t jobs, struct ts_error *err);
ts_status ts__hostev_new(struct ts_device *dev, struct ts_event **out,
                         struct ts_error *err);
void ts__hostev_free(struct ts_event *ev);
ts_status ts__hostev_record(struct ts_event *ev, struct ts_queue *q,
                            struct ts_error *err);
bool ts__hostev_done(struct ts_event *ev);
ts_status ts__hostev_sync(struct ts_event *ev, struct ts_error *err);

/* Waits for the work already submitted to every queue of dev (failures
 * stay with their queues and events). Holds dev->queues_mu meanwhile. */
ts_status ts__hostq_device_sync(struct ts_device *dev, struct ts_error *err);

/* ---- sim test hook (sim.c) ------------------------------------------------ */

/*
 * Makes the next n copies executed on any queue of the sim device dev fail
 * (INTERNAL, reason COPY_FAILED) without touching their destination; n <= 0
 * cancels what is left. No-op on other backends. For tests.
 */
void ts__sim_inject_copy_failure(struct ts_device *dev, int n);

/* The same after the next skip copies have run: copy skip + 1 (counted from
 * now, on any queue of dev) fails, and n - 1 after it. For tests that make
 * a failure land in the middle of work whose copies they have counted. */
void ts__sim_inject_copy_failure_after(struct ts_device *dev, int skip, int n);

#endif
