/*
 * device.h - accelerators and the host behind one interface.
 *
 * A device is one place that computes: a CUDA GPU ("cuda:0"), a simulated
 * accelerator whose device memory is host memory with a hard capacity
 * ("sim:0"), or the host itself ("cpu:0"). Every backend offers the same
 * operations: raw memory per memory kind, in-order queues of asynchronous
 * copies, events that mark a point in a queue, and host callbacks.
 *
 * Invariants: device properties are immutable after discovery; a device set
 * lists backends in the order cuda, sim, cpu; a queue runs its work in
 * submission order; an event completes once all work submitted to its queue
 * before it was recorded has completed. Memory returned by ts_device_mem_alloc
 * is never touched by this layer (first touch is the caller's choice).
 *
 * This layer knows nothing of array names, HTTP or JSON.
 *
 * Failures: a copy that fails makes its queue's later events complete with
 * that failure until ts_queue_sync reports and clears it (on CUDA every such
 * failure is sticky: UNAVAILABLE, and the device is broken for good). A
 * broken device answers UNAVAILABLE to every call.
 *
 * Thread-safety: every function here may be called from any thread; queues
 * and events may be used by several threads, but one queue's submission order
 * is the order in which calls returned.
 */
#ifndef TS_DEVICE_H
#define TS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

enum ts_memory_kind {
	TS_MEM_DEVICE = 0,
	TS_MEM_PINNED_HOST,
	TS_MEM_UNPINNED_HOST,
	TS_MEM_KIND_COUNT
};

/* "device", "pinned_host", "unpinned_host". */
const char *ts_memory_kind_name(enum ts_memory_kind kind);

/* Parses a memory kind name; false for anything else. */
bool ts_memory_kind_parse(const char *s, enum ts_memory_kind *out);

enum ts_backend_kind {
	TS_BACKEND_CUDA = 0,
	TS_BACKEND_SIM,
	TS_BACKEND_CPU,
	TS_BACKEND_COUNT
};

/* "cuda", "sim", "cpu". */
const char *ts_backend_name(enum ts_backend_kind kind);

/* What a device says about itself; immutable after discovery. */
struct ts_device_props {
	char id[32];              /* "cuda:0", "sim:1", "cpu:0" */
	enum ts_backend_kind backend;
	int ordinal;              /* index within its backend */
	char name[128];           /* "NVIDIA H200", "tstage simulated accelerator" */
	char host[64];            /* node the device lives on (hostname) */
	uint64_t total_memory;    /* bytes of device memory the hardware has */
	uint64_t free_memory;     /* bytes free at discovery */
	int compute_major;        /* CUDA compute capability; 0 elsewhere */
	int compute_minor;
	int multiprocessors;      /* SMs on CUDA, cores on cpu, copy threads on sim */
	char pci_bus_id[32];      /* CUDA only, else "" */
	char uuid[48];            /* CUDA only, as nvidia-smi and DCGM write it
	                           * ("GPU-8f6e...-..."), else "" */
	bool simulated;           /* true for sim devices: never presented as a GPU */
};

struct ts_device;   /* opaque: one device of one backend */
struct ts_device_set;

/* Direction of a copy, named by the kinds of its ends. */
enum ts_copy_kind {
	TS_COPY_H2D = 0,   /* host (pinned or not) -> device memory */
	TS_COPY_D2H,       /* device memory -> host */
	TS_COPY_D2D,       /* device memory -> device memory (same or peer) */
	TS_COPY_H2H,       /* host -> host */
};

/* An in-order queue of asynchronous work on one device (a CUDA stream; a
 * copy worker thread of its own on sim and on cpu: copies never run on the
 * submitting thread). Opaque. */
struct ts_queue;

/* A marker recorded into a queue. Opaque. */
struct ts_event;

/* Discovery configuration. */
struct ts_device_config {
	int sim_devices;          /* < 0: 2 when no CUDA device exists, else 0 */
	uint64_t sim_device_memory; /* capacity of each sim device, bytes; 0: 2 GiB */
	bool cuda;                /* try the CUDA backend (false: skip it) */
	const char *host;         /* node name reported; NULL: gethostname() */
	bool shareable_pinned;    /* CUDA: pinned host memory as memfd pages pinned with
	                           * cudaHostRegister (shareable by leases), not
	                           * cudaHostAlloc; without CUDA it is memfd anyway */
};

/* Per-backend discovery outcome, for GET /v1/backends. */
struct ts_backend_info {
	enum ts_backend_kind kind;
	bool compiled;            /* support built into this binary */
	bool available;           /* at least one device */
	int device_count;
	char detail[160];         /* why unavailable ("cudaGetDeviceCount: no CUDA-capable device is detected"), or platform version */
};

/*
 * Discovers every backend in the order cuda, sim, cpu. A CUDA build on a
 * machine without a driver logs nothing here: the failure is kept in that
 * backend's info.detail, and discovery goes on. cpu:0 always exists.
 * Returns a new set owned by the caller (ts_device_set_free), or an error.
 */
ts_status ts_device_set_new(const struct ts_device_config *cfg,
                            struct ts_device_set **out, struct ts_error *err);

/* Synchronizes and frees every device, queue worker and backend resource.
 * Queues still open are freed here (after their work); events and memory
 * must have been freed by their owners first. NULL is a no-op. */
void ts_device_set_free(struct ts_device_set *set);

struct ts_trace;

/* Gives every device of set the trace recorder its queues record their work
 * in (borrowed: it outlives the set's use), device i as trace process i + 1.
 * Call before any queue work, from the thread that made the set. */
void ts_device_set_trace(struct ts_device_set *set, struct ts_trace *trace);

struct ts_topology;

/* Gives every device of set the node's topology (borrowed: it outlives
 * every queue of the set), whose CPU binding decision (topology.h's
 * ts_topology_cpubind) the threads of its later queues and CPU kernels
 * follow. Call before any queue is made, from the thread that made the
 * set. */
void ts_device_set_topology(struct ts_device_set *set, const struct ts_topology *t);

/* The topology set_topology gave dev, or NULL (borrowed). Any thread. */
const struct ts_topology *ts_device_topology(const struct ts_device *dev);

/* Records in the trace the spans of finished queue work that a backend
 * collects late (CUDA copies, timed by events); before a trace is answered.
 * Any thread. */
void ts_device_set_trace_flush(struct ts_device_set *set);

/* Number of devices, and the i-th (borrowed; lives as long as the set). */
size_t ts_device_set_count(const struct ts_device_set *set);
struct ts_device *ts_device_set_at(const struct ts_device_set *set, size_t i);

/* The device with this id, or NULL (borrowed). */
struct ts_device *ts_device_set_find(const struct ts_device_set *set,
                                     const char *id);

/* Backend info (copied out). */
void ts_device_set_backend(const struct ts_device_set *set,
                           enum ts_backend_kind kind,
                           struct ts_backend_info *out);

/* The default backend: the first of cuda, sim, cpu that has devices. */
enum ts_backend_kind ts_device_set_default_backend(const struct ts_device_set *set);

/* Properties (borrowed, immutable). */
const struct ts_device_props *ts_device_props(const struct ts_device *dev);

/* Memory kinds a device offers, in order: device, pinned_host, unpinned_host.
 * Every device offers all three. */
bool ts_device_has_memory_kind(const struct ts_device *dev, enum ts_memory_kind k);

/*
 * Raw memory of a kind, for a memory pool to carve: device memory of a GPU
 * (cudaMalloc), of a sim device (host pages, not touched), pinned host memory
 * (cudaHostAlloc portable where CUDA exists, else host pages), pageable host
 * memory. Sizes are exact. Fails with RESOURCE_EXHAUSTED (reason
 * OUT_OF_MEMORY; message and metadata name the device, kind, requested, free
 * and limit bytes), INVALID_ARGUMENT for size 0, or UNAVAILABLE on a sticky
 * CUDA error. A sim device refuses anything past its remaining capacity.
 * Returns memory owned by the caller, released with ts_device_mem_free and
 * the same size.
 */
ts_status ts_device_mem_alloc(struct ts_device *dev, enum ts_memory_kind kind,
                              size_t size, void **out, struct ts_error *err);
void ts_device_mem_free(struct ts_device *dev, enum ts_memory_kind kind,
                        void *p, size_t size);

/* New in-order queue on dev (owned by caller; ts_queue_free waits for its
 * work to finish first, and must not be called from the queue's own host
 * function). RESOURCE_EXHAUSTED when no thread or stream can be made. */
ts_status ts_queue_new(struct ts_device *dev, struct ts_queue **out,
                       struct ts_error *err);
void ts_queue_free(struct ts_queue *q);

/* Names what q carries in traces ("compute", "h2d"): label is a static
 * string; a queue not named shows as "queue". Any thread. */
void ts_queue_set_label(struct ts_queue *q, const char *label);

/* The device a queue or event belongs to (borrowed). */
struct ts_device *ts_queue_device(const struct ts_queue *q);

/* The backend's own handle of q, for code that launches backend work on it
 * (train/cuda_*): its cudaStream_t on CUDA; NULL on sim and cpu, and for a
 * NULL q. Borrowed: lives as long as q. */
void *ts_queue_native(const struct ts_queue *q);

/*
 * Enqueues a copy of n bytes. dst and src stay borrowed: the caller keeps
 * them alive until an event recorded after this copy completes. n == 0 is a
 * no-op. A failure to enqueue is returned; a failure while copying makes the
 * queue's later events complete with that error, until ts_queue_sync returns
 * and clears it (later work still runs; the failed copy wrote nothing on sim).
 */
ts_status ts_queue_copy(struct ts_queue *q, void *dst, const void *src,
                        size_t n, enum ts_copy_kind kind, struct ts_error *err);

/* Copies accepted by dev's queues so far (each ts_queue_copy of n > 0 that
 * returned TS_OK counts one), for tests and accounting. Lock-free. */
uint64_t ts_device_copies(const struct ts_device *dev);

/* Bytes of the copies dev's queues accepted so far, of one direction
 * (counted as ts_device_copies counts). Lock-free. */
uint64_t ts_device_copied_bytes(const struct ts_device *dev, enum ts_copy_kind kind);

/* Copies accepted by dev's queues that have not completed yet, in *out;
 * false when the backend cannot tell (CUDA: a stream does not say). sim and
 * cpu count them on their queue workers. Lock-free. */
bool ts_device_copies_queued(const struct ts_device *dev, uint64_t *out);

/*
 * Enqueues fn(arg) to run on a host thread after all earlier work in q (the
 * queue's worker on sim and cpu, the driver's callback thread on CUDA); the
 * queue's later work waits for it to return. fn must not call back into the
 * device layer (ts_queue_free or ts_device_sync from it would deadlock): it
 * only wakes someone.
 */
ts_status ts_queue_host_fn(struct ts_queue *q, void (*fn)(void *arg), void *arg,
                           struct ts_error *err);

/* While a trace records, where q's backend times its own work (CUDA: two
 * events around it, cudaEventElapsedTime): the work enqueued on q between
 * ts_queue_span_begin and ts_queue_span_end is one span of the trace, cat
 * and name static strings ("compute", "gemm"). begin answers NULL (and end
 * does nothing with it) when no trace records or the backend records its
 * work otherwise (sim, cpu: ts_queue_host_fn_named). */
void *ts_queue_span_begin(struct ts_queue *q, const char *cat, const char *name);
void ts_queue_span_end(struct ts_queue *q, void *span);

/* ts_queue_host_fn, with the name (a static string) its span has in traces
 * where the backend records host functions (sim, cpu: they are the compute
 * of those devices, "gemm", "act_fwd"). */
ts_status ts_queue_host_fn_named(struct ts_queue *q, void (*fn)(void *arg), void *arg,
                                 const char *name, struct ts_error *err);

/* Makes later work in q wait until ev, as last recorded, completes
 * (cross-queue ordering). ev may belong to another device of the same kind
 * of queues: any CUDA device for a CUDA queue, any sim or cpu device for a
 * sim or cpu queue; otherwise INVALID_ARGUMENT. A never-recorded ev is no
 * wait. On sim and cpu, an ev that completes with a failure passes the
 * failure on to q. */
ts_status ts_queue_wait_event(struct ts_queue *q, struct ts_event *ev,
                              struct ts_error *err);

/*
 * Takes now, on the host, what the next `jobs` submissions to q (copies,
 * host functions, event records, waits) need, so that they cannot fail for
 * memory: work that must not be interrupted halfway reserves before it
 * starts. A reservation only grows; what is left goes with the queue.
 * RESOURCE_EXHAUSTED when it cannot be taken (nothing is reserved then).
 */
ts_status ts_queue_reserve(struct ts_queue *q, size_t jobs, struct ts_error *err);

/* Blocks until all work submitted to q so far has completed; returns the
 * first copy failure seen by the queue, if any, and clears it (the queue's
 * later events complete cleanly again). */
ts_status ts_queue_sync(struct ts_queue *q, struct ts_error *err);

/* Events, owned by the caller. ts_event_record marks the current end of q,
 * which must be a queue of the event's own device (else INVALID_ARGUMENT);
 * recording again moves the mark. ts_event_free may be called while a
 * record is still pending: it waits for it (sim, cpu) or lets the driver
 * release it later (CUDA). */
ts_status ts_event_new(struct ts_device *dev, struct ts_event **out,
                       struct ts_error *err);
void ts_event_free(struct ts_event *ev);
ts_status ts_event_record(struct ts_event *ev, struct ts_queue *q,
                          struct ts_error *err);

/* true when complete (or never recorded). */
bool ts_event_done(struct ts_event *ev);

/* Blocks until complete; returns the queue's copy failure, if any (the
 * outcome stays with the event until it is recorded again). A failure already
 * held by err is kept, as ts_error_set does. */
ts_status ts_event_sync(struct ts_event *ev, struct ts_error *err);

/* Waits for all work submitted to the device's queues so far (failures stay
 * with their queues and events; on CUDA, cudaDeviceSynchronize). */
ts_status ts_device_sync(struct ts_device *dev, struct ts_error *err);

/* Live free/total device memory as the backend reports it now (cudaMemGetInfo
 * on CUDA; the configured capacity on sim; MemAvailable/MemTotal on cpu). */
ts_status ts_device_mem_info(struct ts_device *dev, uint64_t *free_bytes,
                             uint64_t *total_bytes, struct ts_error *err);

/*
 * Translates a CUDA runtime error code (cudaError_t as an int) raised by
 * work on dev's streams outside this layer (training kernels, cuBLAS) into a
 * status, once, the same way the device layer translates its own: a sticky
 * error marks dev broken and is UNAVAILABLE. `call` names what failed. In a
 * build without CUDA it is INTERNAL.
 */
ts_status ts_device_cuda_status(struct ts_device *dev, int cuda_error, const char *call,
                                struct ts_error *err);

/* What a backend says of one device reaching another's memory directly. */
struct ts_peer_caps {
	bool known;               /* the backend answered (a pair of CUDA GPUs) */
	bool access;              /* cudaDeviceCanAccessPeer */
	int perf_rank;            /* cudaDevP2PAttrPerformanceRank: lower is better */
	bool native_atomics;      /* cudaDevP2PAttrNativeAtomicSupported */
};

/*
 * Asks dev's backend whether dev may access peer's memory directly, and how
 * well: on CUDA, cudaDeviceCanAccessPeer and cudaDeviceGetP2PAttribute for
 * two different GPUs; every other pair (one device with itself, sim, cpu,
 * two backends) answers known = false and nothing else. A CUDA error is
 * translated as everywhere. Thread-safe.
 */
ts_status ts_device_peer_caps(struct ts_device *dev, struct ts_device *peer,
                              struct ts_peer_caps *out, struct ts_error *err);

/* true once the device hit an unrecoverable (sticky) error; readiness drops. */
bool ts_device_broken(const struct ts_device *dev);

/*
 * A read-only descriptor of the shareable host mapping holding [p, p + len)
 * (host pages of pinned or pageable host memory of dev's set, hostmem.c:
 * any device of the set answers the same), and p's offset in it into
 * *offset. It is a new O_RDONLY open of the memfd, and the memfd is sealed
 * (here, at its first share) against every write but the daemon's own
 * mapping's (F_SEAL_FUTURE_WRITE):
 * whoever holds the descriptor, reopened read-write or not, can neither map
 * it writable nor write it. The caller owns the descriptor (close-on-exec).
 * A negative errno when p is in no shareable mapping (-ENOENT: device
 * memory, cudaHostAlloc memory, anonymous fallback pages) or a descriptor
 * cannot be made. Thread-safe; the caller keeps the memory alive meanwhile.
 */
int ts_host_mem_share(const struct ts_device *dev, const void *p, uint64_t len,
                      uint64_t *offset);

/*
 * Copies n bytes from src to p (host memory of dev's set that the caller
 * alone writes now, not yet published): where p lies in a shareable
 * mapping not yet shared and none of its pages there exists yet (a fresh
 * allocation, a pool segment's first use), through its file (pwrite: the
 * pages are allocated as they are written, without a fault and a zeroing
 * each; on the development VM 256 MiB in 0.10 s instead of 0.21 s);
 * otherwise, and where shared memory gets huge pages (the mapping's faults
 * are 2 MiB ones then), by memcpy. Cannot fail: what the file does not
 * take is copied by memcpy. Thread-safe.
 */
void ts_host_mem_fill(const struct ts_device *dev, void *p, const void *src, size_t n);

/* The same through the file alone: the bytes written that way from the
 * start of [p, p + n) (0 where the file cannot be used, and below 256 KiB,
 * where its checks cost more than the faults they save), the rest left to
 * the caller, for a copy of its own (streaming stores). Thread-safe. */
size_t ts_host_mem_fill_file(const struct ts_device *dev, void *p, const void *src, size_t n);

/*
 * Scratch memory of a writable lease: a memfd of size bytes outside every
 * pool, sealed at its size, that a lessee maps read-write and fills; the
 * daemon maps it read-only (data; NULL when size is 0) and copies it out.
 * Released, the daemon's mapping and descriptor go; a lessee's mapping
 * keeps its pages, which no array ever uses again.
 */
struct ts_host_scratch {
	int fd;                /* owned */
	const void *data;      /* the daemon's read-only mapping */
	size_t size;
};

/* A new scratch of size bytes into *out; RESOURCE_EXHAUSTED, reason
 * LEASE_SCRATCH, when no memfd can be made (memory, descriptors). */
ts_status ts_host_scratch_new(size_t size, struct ts_host_scratch *out, struct ts_error *err);

/* A read-write descriptor of s's memfd (the caller owns it), or a negative
 * errno. */
int ts_host_scratch_share(const struct ts_host_scratch *s);

/* Unmaps and closes s; one released already (fd -1) is left as it is. */
void ts_host_scratch_release(struct ts_host_scratch *s);

/*
 * Whether the node lets shared memory (memfd, tmpfs) use transparent huge
 * pages on advice: the mode bracketed in
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled is copied into mode
 * ("unknown" when it cannot be read); true for "advise", "within_size",
 * "always" and "force".
 */
bool ts_host_shmem_huge(char *mode, size_t cap);

/* The bytes of a CUDA IPC memory handle (cudaIpcMemHandle_t), opaque. */
#define TS_IPC_HANDLE_BYTES 64
struct ts_ipc_handle {
	unsigned char bytes[TS_IPC_HANDLE_BYTES];
};

/*
 * A CUDA IPC memory handle of the device memory allocation based at base (a
 * base ts_device_mem_alloc returned for dev's device memory: a handle names
 * a whole cudaMalloc allocation), which a process on the same node opens
 * with cudaIpcOpenMemHandle. FAILED_PRECONDITION, reason NOT_CUDA_DEVICE,
 * for a device that is no GPU (every device of a build without CUDA); CUDA
 * errors
 * translated as everywhere (UNAVAILABLE for a sticky one). The caller keeps
 * the allocation alive while the handle is in use. Thread-safe.
 */
ts_status ts_device_ipc_handle(struct ts_device *dev, void *base, struct ts_ipc_handle *out,
                               struct ts_error *err);

/*
 * Collectives over several devices of one backend: a communicator with one
 * rank per device, in the order given (rank r is devs[r]). On CUDA it is
 * NCCL's (ncclCommInitAll over the GPUs; every collective one NCCL group
 * over the ranks' streams); on sim and cpu it is the host's: each rank's
 * queue runs a host function that waits for every rank's, and the
 * reduction sums rank 0's value, then rank 1's, ... in that fixed order,
 * so its bits are the same on every rank and in every run.
 *
 * A collective is one call for every rank (as one thread drives an NCCL
 * group): it enqueues on qs[r] (a queue of devs[r]) for each r, after that
 * queue's earlier work; each queue's later work sees the result. It is all
 * or nothing: when it fails, no rank's queue waits for the others.
 * Buffers are memory of each rank's device (host memory on sim and cpu),
 * alive until each queue has run past the call.
 *
 * INVALID_ARGUMENT for fewer than 1 or more than TS_COMM_MAX devices,
 * devices repeated or of different backends, a queue of another device than
 * its rank's; UNAVAILABLE for a broken device or a transport error
 * (translated from NCCL's result once, naming the call); RESOURCE_EXHAUSTED
 * when out of memory.
 *
 * Thread-safety: one collective at a time per communicator (NCCL's rule);
 * ts_comm_free after every queue it used has run past its last call.
 */
#define TS_COMM_MAX 64

struct ts_comm;

ts_status ts_comm_new(struct ts_device *const *devs, int n, struct ts_comm **out,
                      struct ts_error *err);
void ts_comm_free(struct ts_comm *c);
int ts_comm_size(const struct ts_comm *c);
struct ts_device *ts_comm_device(const struct ts_comm *c, int rank);
/* "nccl" or "host": what carries the collectives (static string). */
const char *ts_comm_transport(const struct ts_comm *c);

/* Bytes of this device's ranks' buffers in collectives so far (a rank's
 * buffer size per collective over more than one device). */
uint64_t ts_device_collective_bytes(const struct ts_device *dev);

/* bufs[r][i] = the sum over ranks of bufs[r][i], n float32 each. */
ts_status ts_comm_allreduce(struct ts_comm *c, struct ts_queue *const *qs, float *const *bufs,
                            uint64_t n, struct ts_error *err);

/* bufs[r][r*n .. r*n + n) = the sum over ranks of that slice, each rank's
 * buffer n * size floats (the reduce-scatter in place: rank r's slice of
 * its own buffer; the rest of it is left as it was on the host and
 * unspecified on CUDA). */
ts_status ts_comm_reduce_scatter(struct ts_comm *c, struct ts_queue *const *qs,
                                 float *const *bufs, uint64_t n, struct ts_error *err);

/* recv[r][0 .. n) = the sum over ranks of bufs[k][r*n .. r*n + n): the
 * reduce-scatter out of place (ZeRO-2's, plan.h), each rank's slice into a
 * buffer of n floats of its own, apart from bufs[r] (bufs left as they
 * were); the same bits as ts_comm_reduce_scatter's and the all-reduce's
 * slice r on the host. */
ts_status ts_comm_reduce_scatter_to(struct ts_comm *c, struct ts_queue *const *qs,
                                    float *const *bufs, float *const *recv, uint64_t n,
                                    struct ts_error *err);

/* bufs[r][k*n .. k*n + n) = bufs[k][k*n .. k*n + n) for every k: each
 * rank's slice gathered into every rank's buffer (in place). */
ts_status ts_comm_all_gather(struct ts_comm *c, struct ts_queue *const *qs, float *const *bufs,
                             uint64_t n, struct ts_error *err);

#endif
