/*
 * cuda_backend.c - CUDA GPUs through the CUDA runtime API.
 *
 * Every device the driver reports becomes "cuda:<ordinal>". Device memory is
 * cudaMalloc'd, queues are non-blocking streams, events are timing-free CUDA
 * events, host callbacks go through cudaLaunchHostFunc, and copies are
 * cudaMemcpyAsync (D2D with cudaMemcpyDefault, so peers copy directly where
 * peer access could be enabled, and through the driver otherwise). Once a
 * device exists, pinned host memory for every device of the set comes from
 * cudaHostAlloc(cudaHostAllocPortable), in the context of any healthy GPU;
 * with cfg->shareable_pinned (the lease service is on) it is memfd host
 * pages (hostmem.c) pinned with cudaHostRegister(Portable) instead, so that
 * a lease can hand them out by descriptor as on sim. A lease hands a device
 * array to another process on the node by cudaIpcGetMemHandle of its pool
 * chunk.
 *
 * While a trace records, each copy, and each kernel or GEMM the training
 * kernels enqueue (queue_span_begin/end around them), is bracketed by two
 * timing events and followed by a host function that marks it done when
 * the stream reaches it. The span's start and end are the events' times
 * on the device's own clock: their elapsed time (cudaEventElapsedTime)
 * from the device's reference event of the trace, recorded on an idle
 * stream at the trace's first span on the device and waited for, plus the
 * host clock then; so spans on different streams of a device keep the
 * order the device ran them in. Spans are collected (the
 * events read and destroyed) on the queue's next traced copy, when the
 * trace asks (ts__queue_trace_flush) and when the queue is freed; a host
 * function may call no CUDA API, so it only stamps.
 *
 * Every cudaError_t is translated in cuda_fail() and nowhere else: an error
 * that corrupts the context (illegal address, launch failure, ECC, ...) is
 * UNAVAILABLE and marks the device broken for good.
 *
 * A binary built with CUDA runs where there is no driver or GPU:
 * cudaGetDeviceCount fails, the reason goes into the backend's detail, and
 * discovery moves on to sim and cpu.
 *
 * Thread-safety: all functions may be called from any thread; each one sets
 * the calling thread's current device first (cudaSetDevice), since callers
 * come from any thread. The CUDA runtime serialises the rest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "common/log.h"
#include "common/units.h"
#include "device/backend.h"

struct cuda_dev {
	int ordinal;                    /* immutable: the CUDA device ordinal */
	/* the trace's clock on this device (see the top): a reference event per
	 * trace, recorded on a stream of its own (idle), and the host clock
	 * when it completed */
	pthread_mutex_t clock_mu;
	bool clock_stream_made;         /* guarded by: clock_mu */
	cudaStream_t clock_stream;      /* guarded by: clock_mu */
	cudaEvent_t clock_ev;           /* guarded by: clock_mu; valid while clock_gen */
	uint64_t clock_gen;             /* guarded by: clock_mu; 0: no reference */
	uint64_t clock_ns;              /* guarded by: clock_mu */
	struct cuda_pinned *pinned;     /* the set's pinned provider, owned by the
	                                 * first GPU (freed last of the set) */
};

/* A traced copy or kernel in flight (see the top). */
struct cuda_span {
	struct cuda_span *next;         /* guarded by: the queue's spans_mu */
	cudaEvent_t start, end;         /* immutable */
	_Atomic uint64_t stamped_ns;    /* set once by the host function; 0 before */
	uint64_t gen, flow, bytes;      /* immutable */
	const char *cat, *name;         /* immutable, static */
};

struct cuda_queue {
	struct ts_queue base;           /* first: device.c sees this */
	cudaStream_t stream;            /* immutable */
	pthread_mutex_t spans_mu;
	struct cuda_span *spans;        /* guarded by: spans_mu; traced copies in flight */
	/* one collector at a time, so that spans are recorded in stream order */
	pthread_mutex_t emit_mu;
	uint64_t last_end_ns;           /* guarded by: emit_mu; the last recorded span's end */
};

struct cuda_event {
	struct ts_event base;           /* first: device.c sees this */
	cudaEvent_t event;              /* immutable */
};

/* What an allocation asked for, so that an out-of-memory answer can carry
 * the numbers. */
struct alloc_ask {
	const struct ts_device *dev;    /* the device the memory is for */
	enum ts_memory_kind kind;
	size_t size;
};

static int ordinal_of(const struct ts_device *dev)
{
	return ((const struct cuda_dev *)dev->impl)->ordinal;
}

static struct cuda_queue *to_cq(struct ts_queue *q)
{
	return (struct cuda_queue *)q;
}

static struct cuda_event *to_ce(struct ts_event *ev)
{
	return (struct cuda_event *)ev;
}

/* Errors after which the context is corrupt: every later call on it fails
 * the same way, and only a new process recovers. */
static bool cuda_error_sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorLaunchTimeout:
	case cudaErrorECCUncorrectable:
	case cudaErrorNvlinkUncorrectable:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorAssert:
	case cudaErrorExternalDevice:
	case cudaErrorMpsClientTerminated:
#if CUDART_VERSION >= 13000
	case cudaErrorContained:
	case cudaErrorTensorMemoryLeak:
#endif
		return true;
	default:
		return false;
	}
}

/* The class of a non-sticky error. */
static ts_status cuda_error_class(cudaError_t e, const char **reason)
{
	switch (e) {
	case cudaErrorMemoryAllocation:
		*reason = "OUT_OF_MEMORY";
		return TS_RESOURCE_EXHAUSTED;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidHostPointer:
	case cudaErrorInvalidMemcpyDirection:
	case cudaErrorInvalidResourceHandle:
	case cudaErrorInvalidDevice:
		*reason = "CUDA_INVALID_ARGUMENT";
		return TS_INVALID_ARGUMENT;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInitializationError:
	case cudaErrorDevicesUnavailable:
	case cudaErrorSystemNotReady:
	case cudaErrorSystemDriverMismatch:
	case cudaErrorCompatNotSupportedOnDevice:
	case cudaErrorCudartUnloading:
	case cudaErrorStubLibrary:
	case cudaErrorDeviceUninitialized:
	case cudaErrorContextIsDestroyed:
		*reason = "CUDA_UNAVAILABLE";
		return TS_UNAVAILABLE;
	case cudaErrorNotSupported:
	case cudaErrorPeerAccessUnsupported:
	case cudaErrorNotYetImplemented:
		*reason = "CUDA_UNSUPPORTED";
		return TS_UNIMPLEMENTED;
	case cudaErrorNotPermitted:
		*reason = "CUDA_NOT_PERMITTED";
		return TS_PERMISSION_DENIED;
	case cudaErrorTimeout:
		*reason = "CUDA_TIMEOUT";
		return TS_DEADLINE_EXCEEDED;
	default:
		*reason = "CUDA_ERROR";
		return TS_INTERNAL;
	}
}

/*
 * The one translation of cudaError_t into ts_status. dev is the device whose
 * context the call ran in (marked broken on a sticky error); ask, when the
 * call allocated, turns an out-of-memory error into the ts__oom answer with
 * the live free and total figures. err may be NULL (cleanup paths).
 */
static ts_status cuda_fail(struct ts_device *dev, cudaError_t e, const char *call,
                           const struct alloc_ask *ask, struct ts_error *err)
{
	const char *reason;
	ts_status st;

	if (e == cudaSuccess)
		return TS_OK;
	if (cuda_error_sticky(e)) {
		ts__device_mark_broken(dev);
		st = ts_error_set(err, TS_UNAVAILABLE, "CUDA_STICKY_ERROR",
		                  "%s: %s: %s; the device is unusable until the "
		                  "daemon restarts", dev->props.id, call,
		                  cudaGetErrorString(e));
		ts_error_meta(err, "device", "%s", dev->props.id);
		ts_error_meta(err, "cuda_error", "%s", cudaGetErrorName(e));
		return st;
	}
	cudaGetLastError();             /* not sticky: clear it for later calls */
	st = cuda_error_class(e, &reason);
	if (st == TS_RESOURCE_EXHAUSTED && ask) {
		uint64_t free_bytes = 0, total_bytes = 0;
		char cause[96];

		if (ask->kind == TS_MEM_DEVICE) {
			size_t f = 0, t = 0;

			if (cudaMemGetInfo(&f, &t) == cudaSuccess) {
				free_bytes = f;
				total_bytes = t;
			} else {
				cudaGetLastError();
			}
		} else {
			ts__host_meminfo(&free_bytes, &total_bytes, NULL);
		}
		snprintf(cause, sizeof cause, "%s: %s", call, cudaGetErrorString(e));
		return ts__oom(err, ask->dev, ask->kind, ask->size, free_bytes,
		               total_bytes, cause);
	}
	st = ts_error_set(err, st, reason, "%s: %s: %s", dev->props.id, call,
	                  cudaGetErrorString(e));
	ts_error_meta(err, "device", "%s", dev->props.id);
	ts_error_meta(err, "cuda_error", "%s", cudaGetErrorName(e));
	return st;
}

/* Makes dev the calling thread's current device. */
static ts_status cuda_enter(struct ts_device *dev, struct ts_error *err)
{
	return cuda_fail(dev, cudaSetDevice(ordinal_of(dev)), "cudaSetDevice",
	                 NULL, err);
}

/* ---- memory -------------------------------------------------------------- */

static ts_status cuda_mem_alloc(struct ts_device *dev, size_t size, void **out,
                                struct ts_error *err)
{
	struct alloc_ask ask = {dev, TS_MEM_DEVICE, size};
	void *p = NULL;
	ts_status st;

	st = cuda_enter(dev, err);
	if (st != TS_OK)
		return st;
	st = cuda_fail(dev, cudaMalloc(&p, size), "cudaMalloc", &ask, err);
	if (st != TS_OK)
		return st;
	*out = p;
	return TS_OK;
}

static void cuda_mem_free(struct ts_device *dev, void *p, size_t size)
{
	if (cuda_enter(dev, NULL) != TS_OK)
		return;
	cuda_fail(dev, cudaFree(p), "cudaFree", NULL, NULL);
}

static const struct ts__backend_ops cuda_ops;

_Static_assert(sizeof(cudaIpcMemHandle_t) == TS_IPC_HANDLE_BYTES,
               "a CUDA IPC handle is TS_IPC_HANDLE_BYTES bytes");

ts_status ts_device_ipc_handle(struct ts_device *dev, void *base, struct ts_ipc_handle *out,
                               struct ts_error *err)
{
	cudaIpcMemHandle_t h;
	ts_status st;

	memset(out, 0, sizeof *out);
	if (dev->ops != &cuda_ops)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "NOT_CUDA_DEVICE",
		                    "'%s' is no CUDA device: it has no CUDA IPC handles",
		                    dev->props.id);
	if (ts_device_broken(dev))
		return ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN",
		                    "%s is unusable after an unrecoverable (sticky) error",
		                    dev->props.id);
	st = cuda_enter(dev, err);
	if (st != TS_OK)
		return st;
	st = cuda_fail(dev, cudaIpcGetMemHandle(&h, base), "cudaIpcGetMemHandle", NULL, err);
	if (st == TS_OK)
		memcpy(out->bytes, &h, sizeof out->bytes);
	return st;
}

/*
 * Pinned host memory for every device of the set comes from cudaHostAlloc
 * (portable: every GPU's streams may use it, whichever context made it).
 * The provider holds every GPU of the set, not one: a sticky error corrupts
 * one context only, so memory is pinned in the context of the GPU it is
 * asked for when that one is healthy, else of the first healthy GPU, and
 * freed with a healthy GPU current. Only when every GPU is broken is pinned
 * memory refused (UNAVAILABLE naming them).
 */
struct cuda_pinned {
	bool registered;                /* immutable: memfd pages pinned with
	                                 * cudaHostRegister, else cudaHostAlloc */
	size_t n;
	struct ts_device *gpus[];       /* immutable: the set's GPUs, in order */
};

/* Host pages of size bytes registered (pinned, portable) in gpu's context. */
static ts_status register_pages(struct ts_device *gpu, struct ts_device *dev, size_t size,
                                const struct alloc_ask *ask, void **out,
                                struct ts_error *err)
{
	void *p = NULL;
	ts_status st = ts__host_pages_alloc(dev, TS_MEM_PINNED_HOST, size, false, &p, err);

	if (st != TS_OK)
		return st;
	st = cuda_fail(gpu, cudaHostRegister(p, size, cudaHostRegisterPortable),
	               "cudaHostRegister", ask, err);
	if (st != TS_OK) {
		ts__host_pages_free(dev, p, size);
		return st;
	}
	*out = p;
	return TS_OK;
}

/* The GPU whose context pins memory asked for dev: dev itself when it is a
 * healthy GPU, else the first healthy one; NULL when every GPU is broken. */
static struct ts_device *pinning_gpu(const struct cuda_pinned *cp, struct ts_device *dev)
{
	for (size_t i = 0; dev && i < cp->n; i++)
		if (cp->gpus[i] == dev && !ts_device_broken(dev))
			return dev;
	for (size_t i = 0; i < cp->n; i++)
		if (!ts_device_broken(cp->gpus[i]))
			return cp->gpus[i];
	return NULL;
}

static ts_status cuda_pinned_alloc(void *ctx, struct ts_device *dev, size_t size,
                                   void **out, struct ts_error *err)
{
	const struct cuda_pinned *cp = ctx;
	struct alloc_ask ask = {dev, TS_MEM_PINNED_HOST, size};
	bool fresh = !err || err->status == TS_OK;
	struct ts_device *gpu;
	void *p = NULL;
	ts_status st;

	/* a GPU that breaks meanwhile hands the request on to the next one */
	while ((gpu = pinning_gpu(cp, dev)) != NULL) {
		st = cuda_enter(gpu, err);
		if (st == TS_OK && cp->registered)
			st = register_pages(gpu, dev, size, &ask, &p, err);
		else if (st == TS_OK)
			st = cuda_fail(gpu, cudaHostAlloc(&p, size, cudaHostAllocPortable),
			               "cudaHostAlloc", &ask, err);
		if (st == TS_OK) {
			*out = p;
			return TS_OK;
		}
		if (!ts_device_broken(gpu) || !fresh)
			return st;
		if (err)
			ts_error_clear(err);     /* ours: the next GPU answers instead */
	}
	st = ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN",
	                  "%s/pinned_host: cannot pin %zu bytes: every GPU (%s%s) is unusable "
	                  "after an unrecoverable (sticky) error", dev->props.id, size,
	                  cp->gpus[0]->props.id, cp->n > 1 ? ", ..." : "");
	ts_error_meta(err, "device", "%s", dev->props.id);
	ts_error_meta(err, "memory_kind", "%s", ts_memory_kind_name(TS_MEM_PINNED_HOST));
	return st;
}

static void cuda_pinned_free(void *ctx, void *p, size_t size)
{
	const struct cuda_pinned *cp = ctx;
	struct ts_device *gpu = pinning_gpu(cp, NULL);

	/* with every GPU broken the memory stays mapped until the process ends */
	if (!gpu || cuda_enter(gpu, NULL) != TS_OK)
		return;
	if (cp->registered) {
		cuda_fail(gpu, cudaHostUnregister(p), "cudaHostUnregister", NULL, NULL);
		ts__host_pages_free(gpu, p, size);      /* the set's table, as every device's */
		return;
	}
	cuda_fail(gpu, cudaFreeHost(p), "cudaFreeHost", NULL, NULL);
}

static ts_status cuda_mem_info(struct ts_device *dev, uint64_t *free_bytes,
                               uint64_t *total_bytes, struct ts_error *err)
{
	size_t f = 0, t = 0;
	ts_status st;

	st = cuda_enter(dev, err);
	if (st != TS_OK)
		return st;
	st = cuda_fail(dev, cudaMemGetInfo(&f, &t), "cudaMemGetInfo", NULL, err);
	if (st != TS_OK)
		return st;
	*free_bytes = f;
	*total_bytes = t;
	return TS_OK;
}

/* ---- queues -------------------------------------------------------------- */

static ts_status cuda_queue_new(struct ts_device *dev, struct ts_queue **out,
                                struct ts_error *err)
{
	struct cuda_queue *q = calloc(1, sizeof *q);
	ts_status st;

	if (!q)
		return ts_error_oom(err, "%s: out of memory creating a queue", dev->props.id);
	st = cuda_enter(dev, err);
	if (st != TS_OK)
		goto out_free;
	st = cuda_fail(dev, cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking),
	               "cudaStreamCreateWithFlags", NULL, err);
	if (st != TS_OK)
		goto out_free;
	pthread_mutex_init(&q->spans_mu, NULL);
	pthread_mutex_init(&q->emit_mu, NULL);
	q->base.dev = dev;
	*out = &q->base;
	return TS_OK;

out_free:
	free(q);
	return st;
}

/* Records the spans of q's stamped traced work (all of them with every,
 * after the stream is drained) and frees them; the rest stay. The stream
 * runs its work in order, but each stamp comes some time after its work
 * ended: a span that would begin before the previous one's end on the
 * queue begins at that end instead (a queue's spans never overlap, as
 * Perfetto's slices on one track must nest). */
/* The device's reference for trace generation gen (made when it has none
 * for gen): its event and host time into *ev, *ns; false when it cannot be
 * made (the span then goes untraced). Takes clock_mu; the caller has
 * entered the device. */
static bool clock_ref(struct ts_device *dev, uint64_t gen, cudaEvent_t *ev, uint64_t *ns)
{
	struct cuda_dev *c = dev->impl;
	bool ok = true;

	pthread_mutex_lock(&c->clock_mu);
	if (c->clock_gen != gen) {
		if (c->clock_gen)
			cudaEventDestroy(c->clock_ev);
		c->clock_gen = 0;
		if (!c->clock_stream_made &&
		    cudaStreamCreateWithFlags(&c->clock_stream, cudaStreamNonBlocking) == cudaSuccess)
			c->clock_stream_made = true;
		ok = c->clock_stream_made && cudaEventCreate(&c->clock_ev) == cudaSuccess;
		if (ok && (cudaEventRecord(c->clock_ev, c->clock_stream) != cudaSuccess ||
		           cudaEventSynchronize(c->clock_ev) != cudaSuccess)) {
			cudaEventDestroy(c->clock_ev);
			ok = false;
		}
		if (ok) {
			c->clock_ns = ts_now_ns();
			c->clock_gen = gen;
		}
	}
	*ev = c->clock_ev;
	*ns = c->clock_ns;
	pthread_mutex_unlock(&c->clock_mu);
	return ok;
}

/* The host time of event e on the device's clock for generation gen; false
 * when the reference is another trace's now. */
static bool clock_at(struct ts_device *dev, uint64_t gen, cudaEvent_t e, uint64_t *out)
{
	struct cuda_dev *c = dev->impl;
	float ms = 0;
	bool ok;

	pthread_mutex_lock(&c->clock_mu);
	ok = c->clock_gen == gen && cudaEventElapsedTime(&ms, c->clock_ev, e) == cudaSuccess;
	if (ok)
		*out = c->clock_ns + (ms > 0 ? (uint64_t)((double)ms * 1e6) : 0);
	pthread_mutex_unlock(&c->clock_mu);
	return ok;
}

static void spans_collect(struct cuda_queue *q, bool every)
{
	struct ts_device *dev = q->base.dev;
	struct cuda_span *done = NULL, **pp;

	pthread_mutex_lock(&q->emit_mu);
	pthread_mutex_lock(&q->spans_mu);
	for (pp = &q->spans; *pp;) {
		struct cuda_span *sp = *pp;

		if (every || atomic_load_explicit(&sp->stamped_ns, memory_order_acquire)) {
			*pp = sp->next;
			sp->next = done;
			done = sp;
		} else {
			pp = &sp->next;
		}
	}
	pthread_mutex_unlock(&q->spans_mu);
	while (done) {
		struct cuda_span *sp = done;
		uint64_t t0 = 0, t1 = 0;

		done = sp->next;
		if (atomic_load_explicit(&sp->stamped_ns, memory_order_acquire) &&
		    sp->gen == ts_trace_generation(dev->trace) &&
		    clock_at(dev, sp->gen, sp->start, &t0) && clock_at(dev, sp->gen, sp->end, &t1)) {
			if (t0 < q->last_end_ns)
				t0 = q->last_end_ns;
			if (t1 < t0)
				t1 = t0;
			q->last_end_ns = t1;
			ts__queue_trace_span(&q->base, sp->cat, sp->name, t0, t1, sp->bytes, sp->flow);
		}
		cudaEventDestroy(sp->start);
		cudaEventDestroy(sp->end);
		free(sp);
	}
	pthread_mutex_unlock(&q->emit_mu);
}

static void span_stamp(void *arg)
{
	struct cuda_span *sp = arg;

	atomic_store_explicit(&sp->stamped_ns, ts_now_ns(), memory_order_release);
}

static void cuda_queue_trace_flush(struct ts_queue *base)
{
	if (cuda_enter(base->dev, NULL) == TS_OK)
		spans_collect(to_cq(base), false);
}

/* A span in flight of the work enqueued next (cat, name; bytes 0 and no
 * flow for a kernel), its start event recorded; NULL (nothing recorded)
 * when it cannot be made: the work then goes untraced. */
static struct cuda_span *span_begin(struct cuda_queue *q, const char *cat, const char *name,
                                    uint64_t bytes, bool flow)
{
	struct ts_device *dev = q->base.dev;
	struct cuda_span *sp;

	spans_collect(q, false);
	sp = calloc(1, sizeof *sp);
	if (!sp)
		return NULL;
	if (cudaEventCreate(&sp->start) != cudaSuccess) {
		free(sp);
		return NULL;
	}
	if (cudaEventCreate(&sp->end) != cudaSuccess) {
		cudaEventDestroy(sp->start);
		free(sp);
		return NULL;
	}
	sp->gen = ts_trace_generation(dev->trace);
	{
		cudaEvent_t ref;
		uint64_t ref_ns;

		if (!sp->gen || !clock_ref(dev, sp->gen, &ref, &ref_ns)) {
			cudaEventDestroy(sp->start);
			cudaEventDestroy(sp->end);
			free(sp);
			return NULL;
		}
	}
	sp->flow = flow ? ts_trace_flow_start(dev->trace) : 0;
	sp->bytes = bytes;
	sp->cat = cat;
	sp->name = name;
	if (cudaEventRecord(sp->start, q->stream) != cudaSuccess) {
		cudaEventDestroy(sp->start);
		cudaEventDestroy(sp->end);
		free(sp);
		return NULL;
	}
	return sp;
}

/* After the copy: the end event and the stamp; the span joins the queue's
 * list (or, when that cannot be arranged, is dropped once the stream has
 * passed its start event). */
static void span_end(struct cuda_queue *q, struct cuda_span *sp)
{
	if (cudaEventRecord(sp->end, q->stream) != cudaSuccess ||
	    cudaLaunchHostFunc(q->stream, span_stamp, sp) != cudaSuccess) {
		cudaEventSynchronize(sp->start);
		cudaEventDestroy(sp->start);
		cudaEventDestroy(sp->end);
		free(sp);
		return;
	}
	pthread_mutex_lock(&q->spans_mu);
	sp->next = q->spans;
	q->spans = sp;
	pthread_mutex_unlock(&q->spans_mu);
}

static void *cuda_queue_span_begin(struct ts_queue *base, const char *cat, const char *name)
{
	if (cuda_enter(base->dev, NULL) != TS_OK)
		return NULL;
	return span_begin(to_cq(base), cat, name, 0, false);
}

static void cuda_queue_span_end(struct ts_queue *base, void *span)
{
	/* on a device that cannot be entered the records fail: span_end drops
	 * the span */
	(void)cuda_enter(base->dev, NULL);
	span_end(to_cq(base), span);
}

static void cuda_queue_free(struct ts_queue *base)
{
	struct cuda_queue *q = to_cq(base);
	struct ts_device *dev = base->dev;

	if (cuda_enter(dev, NULL) == TS_OK) {
		cuda_fail(dev, cudaStreamSynchronize(q->stream),
		          "cudaStreamSynchronize", NULL, NULL);
		spans_collect(q, true);     /* every host function has run */
		cuda_fail(dev, cudaStreamDestroy(q->stream), "cudaStreamDestroy",
		          NULL, NULL);
	}
	pthread_mutex_destroy(&q->spans_mu);
	pthread_mutex_destroy(&q->emit_mu);
	free(q);
}

static enum cudaMemcpyKind memcpy_kind(enum ts_copy_kind kind)
{
	switch (kind) {
	case TS_COPY_H2D:
		return cudaMemcpyHostToDevice;
	case TS_COPY_D2H:
		return cudaMemcpyDeviceToHost;
	case TS_COPY_H2H:
		return cudaMemcpyHostToHost;
	case TS_COPY_D2D:
	default:
		/* Same device or a peer: unified addressing tells them apart. */
		return cudaMemcpyDefault;
	}
}

static ts_status cuda_queue_copy(struct ts_queue *base, void *dst, const void *src,
                                 size_t n, enum ts_copy_kind kind,
                                 struct ts_error *err)
{
	struct cuda_queue *q = to_cq(base);
	struct cuda_span *sp = NULL;
	ts_status st;

	st = cuda_enter(base->dev, err);
	if (st != TS_OK)
		return st;
	if (ts_trace_on(base->dev->trace))
		sp = span_begin(q, "copy", ts__copy_kind_name(kind), n, true);
	st = cuda_fail(base->dev, cudaMemcpyAsync(dst, src, n, memcpy_kind(kind), q->stream),
	               "cudaMemcpyAsync", NULL, err);
	if (sp)
		span_end(q, sp);
	return st;
}

static ts_status cuda_queue_host_fn(struct ts_queue *base, void (*fn)(void *arg),
                                    void *arg, struct ts_error *err)
{
	struct cuda_queue *q = to_cq(base);
	ts_status st;

	st = cuda_enter(base->dev, err);
	if (st != TS_OK)
		return st;
	return cuda_fail(base->dev, cudaLaunchHostFunc(q->stream, fn, arg),
	                 "cudaLaunchHostFunc", NULL, err);
}

static void *cuda_queue_native(const struct ts_queue *base)
{
	return ((const struct cuda_queue *)base)->stream;
}

static ts_status cuda_queue_wait_event(struct ts_queue *base, struct ts_event *ev,
                                       struct ts_error *err)
{
	struct cuda_queue *q = to_cq(base);
	ts_status st;

	st = cuda_enter(base->dev, err);
	if (st != TS_OK)
		return st;
	return cuda_fail(base->dev,
	                 cudaStreamWaitEvent(q->stream, to_ce(ev)->event, 0),
	                 "cudaStreamWaitEvent", NULL, err);
}

static ts_status cuda_queue_sync(struct ts_queue *base, struct ts_error *err)
{
	struct cuda_queue *q = to_cq(base);
	ts_status st;

	st = cuda_enter(base->dev, err);
	if (st != TS_OK)
		return st;
	return cuda_fail(base->dev, cudaStreamSynchronize(q->stream),
	                 "cudaStreamSynchronize", NULL, err);
}

/* ---- events -------------------------------------------------------------- */

static ts_status cuda_event_new(struct ts_device *dev, struct ts_event **out,
                                struct ts_error *err)
{
	struct cuda_event *ev = calloc(1, sizeof *ev);
	ts_status st;

	if (!ev)
		return ts_error_oom(err, "%s: out of memory creating an event", dev->props.id);
	st = cuda_enter(dev, err);
	if (st != TS_OK)
		goto out_free;
	st = cuda_fail(dev, cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming),
	               "cudaEventCreateWithFlags", NULL, err);
	if (st != TS_OK)
		goto out_free;
	ev->base.dev = dev;
	*out = &ev->base;
	return TS_OK;

out_free:
	free(ev);
	return st;
}

static void cuda_event_free(struct ts_event *base)
{
	struct cuda_event *ev = to_ce(base);

	/* Destroying an event with work still pending is allowed: the driver
	 * releases it once the work is done. */
	if (cuda_enter(base->dev, NULL) == TS_OK)
		cuda_fail(base->dev, cudaEventDestroy(ev->event), "cudaEventDestroy",
		          NULL, NULL);
	free(ev);
}

static ts_status cuda_event_record(struct ts_event *ev, struct ts_queue *base,
                                   struct ts_error *err)
{
	ts_status st;

	st = cuda_enter(base->dev, err);
	if (st != TS_OK)
		return st;
	return cuda_fail(base->dev,
	                 cudaEventRecord(to_ce(ev)->event, to_cq(base)->stream),
	                 "cudaEventRecord", NULL, err);
}

static bool cuda_event_done(struct ts_event *base)
{
	cudaError_t e;

	if (cuda_enter(base->dev, NULL) != TS_OK)
		return true;            /* broken: ts_event_sync says why */
	e = cudaEventQuery(to_ce(base)->event);
	if (e == cudaErrorNotReady) {
		cudaGetLastError();
		return false;
	}
	/* Done, or failed: either way waiting is over; the sync reports it. */
	cuda_fail(base->dev, e, "cudaEventQuery", NULL, NULL);
	return true;
}

static ts_status cuda_event_sync(struct ts_event *base, struct ts_error *err)
{
	ts_status st;

	st = cuda_enter(base->dev, err);
	if (st != TS_OK)
		return st;
	return cuda_fail(base->dev, cudaEventSynchronize(to_ce(base)->event),
	                 "cudaEventSynchronize", NULL, err);
}

/* ---- devices ------------------------------------------------------------- */

static ts_status cuda_device_sync(struct ts_device *dev, struct ts_error *err)
{
	ts_status st;

	st = cuda_enter(dev, err);
	if (st != TS_OK)
		return st;
	return cuda_fail(dev, cudaDeviceSynchronize(), "cudaDeviceSynchronize",
	                 NULL, err);
}

static void cuda_device_free(struct ts_device *dev)
{
	struct cuda_dev *c = dev->impl;

	if (cudaSetDevice(c->ordinal) == cudaSuccess) {
		if (c->clock_gen)
			cudaEventDestroy(c->clock_ev);
		if (c->clock_stream_made)
			cudaStreamDestroy(c->clock_stream);
	}
	pthread_mutex_destroy(&c->clock_mu);

	free(c->pinned);
	free(c);
	dev->impl = NULL;
}

static ts_status cuda_peer_caps(struct ts_device *dev, struct ts_device *peer,
                                struct ts_peer_caps *out, struct ts_error *err)
{
	int a = ordinal_of(dev), b = ordinal_of(peer), can = 0, rank = 0, atomics = 0;
	ts_status st = cuda_fail(dev, cudaDeviceCanAccessPeer(&can, a, b),
	                         "cudaDeviceCanAccessPeer", NULL, err);

	if (st == TS_OK && can)
		st = cuda_fail(dev, cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank,
		                                              a, b),
		               "cudaDeviceGetP2PAttribute", NULL, err);
	if (st == TS_OK && can)
		st = cuda_fail(dev, cudaDeviceGetP2PAttribute(&atomics,
		                                              cudaDevP2PAttrNativeAtomicSupported,
		                                              a, b),
		               "cudaDeviceGetP2PAttribute", NULL, err);
	if (st != TS_OK)
		return st;
	out->known = true;
	out->access = can != 0;
	out->perf_rank = rank;
	out->native_atomics = atomics != 0;
	return TS_OK;
}

static const struct ts__backend_ops cuda_ops = {
	.events = TS__EVENTS_CUDA,
	.mem_alloc = cuda_mem_alloc,
	.mem_free = cuda_mem_free,
	.queue_new = cuda_queue_new,
	.queue_free = cuda_queue_free,
	.queue_copy = cuda_queue_copy,
	.queue_host_fn = cuda_queue_host_fn,
	.queue_wait_event = cuda_queue_wait_event,
	.queue_sync = cuda_queue_sync,
	.queue_native = cuda_queue_native,
	.queue_trace_flush = cuda_queue_trace_flush,
	.queue_span_begin = cuda_queue_span_begin,
	.queue_span_end = cuda_queue_span_end,
	.event_new = cuda_event_new,
	.event_free = cuda_event_free,
	.event_record = cuda_event_record,
	.event_done = cuda_event_done,
	.event_sync = cuda_event_sync,
	.device_sync = cuda_device_sync,
	.mem_info = cuda_mem_info,
	.peer_caps = cuda_peer_caps,
	.comm_new = ts__cuda_comm_new,
	.comm_free = ts__cuda_comm_free,
	.comm_run = ts__cuda_comm_run,
	.device_free = cuda_device_free,
};

ts_status ts_device_cuda_status(struct ts_device *dev, int cuda_error, const char *call,
                                struct ts_error *err)
{
	return cuda_fail(dev, (cudaError_t)cuda_error, call, NULL, err);
}

/* ---- discovery ----------------------------------------------------------- */

/* Copies a fixed-size, maybe unterminated string, cut to fit dst. */
static void copy_truncated(char *dst, size_t dst_len, const char *src, size_t src_len)
{
	size_t n = strnlen(src, src_len);

	if (n >= dst_len)
		n = dst_len - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* The 16 bytes of a cudaUUID_t as nvidia-smi and the DCGM exporter write
 * them: "GPU-" and 8-4-4-4-12 lower-case hex digits (dst holds 41). */
static void format_uuid(char *dst, size_t cap, const unsigned char *b)
{
	snprintf(dst, cap,
	         "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
	         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
	         b[13], b[14], b[15]);
}

/* Notes in the backend's detail a device that could not be used. */
static void detail_skipped(struct ts_backend_info *info, const char *id,
                           const char *call, cudaError_t e)
{
	size_t len = strlen(info->detail);

	if (len + 1 >= sizeof info->detail)
		return;
	snprintf(info->detail + len, sizeof info->detail - len,
	         "; %s skipped: %s: %s", id, call, cudaGetErrorString(e));
}

/*
 * Queries device i and appends it to ctx. A device the runtime cannot
 * describe is skipped (noted in info->detail, *added false); only running out
 * of host memory fails.
 */
static ts_status cuda_add(struct ts__discover_ctx *ctx, int i,
                          struct ts_backend_info *info, bool *added,
                          struct ts_error *err)
{
	struct cudaDeviceProp p;
	struct ts_device *dev;
	struct cuda_dev *c;
	char id[32];
	size_t f = 0, t = 0;
	cudaError_t e;
	const char *call;

	*added = false;
	snprintf(id, sizeof id, "cuda:%d", i);
	memset(&p, 0, sizeof p);
	call = "cudaGetDeviceProperties";
	e = cudaGetDeviceProperties(&p, i);
	if (e == cudaSuccess) {
		call = "cudaSetDevice";
		e = cudaSetDevice(i);
	}
	if (e == cudaSuccess) {
		call = "cudaMemGetInfo";
		e = cudaMemGetInfo(&f, &t);
	}
	if (e != cudaSuccess) {
		cudaGetLastError();
		detail_skipped(info, id, call, e);
		return TS_OK;
	}

	dev = ts__device_new(ctx, TS_BACKEND_CUDA, i, &cuda_ops);
	if (!dev)
		goto out_oom;
	c = calloc(1, sizeof *c);
	if (!c)
		goto out_dev;
	c->ordinal = i;
	pthread_mutex_init(&c->clock_mu, NULL);
	dev->impl = c;

	copy_truncated(dev->props.name, sizeof dev->props.name, p.name, sizeof p.name);
	dev->props.total_memory = p.totalGlobalMem;
	dev->props.free_memory = f;
	dev->props.compute_major = p.major;
	dev->props.compute_minor = p.minor;
	dev->props.multiprocessors = p.multiProcessorCount;
	if (cudaDeviceGetPCIBusId(dev->props.pci_bus_id,
	                          (int)sizeof dev->props.pci_bus_id, i) != cudaSuccess) {
		cudaGetLastError();
		dev->props.pci_bus_id[0] = '\0';
	}
	format_uuid(dev->props.uuid, sizeof dev->props.uuid, (const unsigned char *)p.uuid.bytes);
	*added = true;
	return ts__discover_add(ctx, dev, err);

out_dev:
	ts__device_destroy(dev);
out_oom:
	return ts_error_oom(err, "%s: out of memory during discovery", id);
}

/* Lets every pair of found devices that can reach each other copy directly.
 * Failing to enable it only makes D2D copies go through the driver. */
static void enable_peer_access(struct ts_device **devs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int a = ordinal_of(devs[i]);

		if (cudaSetDevice(a) != cudaSuccess) {
			cudaGetLastError();
			continue;
		}
		for (size_t j = 0; j < n; j++) {
			int b = ordinal_of(devs[j]);
			int can = 0;

			if (i == j)
				continue;
			if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) {
				cudaGetLastError();
				continue;
			}
			if (cudaDeviceEnablePeerAccess(b, 0) != cudaSuccess)
				cudaGetLastError();   /* already enabled, or not possible */
		}
	}
}

ts_status ts__cuda_discover(struct ts__discover_ctx *ctx,
                            struct ts_backend_info *info,
                            struct ts_error *err)
{
	int n = 0, runtime = 0, driver = 0;
	size_t first = ctx->count;
	struct cuda_pinned *cp;
	cudaError_t e;

	memset(info, 0, sizeof *info);
	info->kind = TS_BACKEND_CUDA;
	info->compiled = true;
	if (!ctx->cfg->cuda) {
		snprintf(info->detail, sizeof info->detail, "disabled by configuration");
		return TS_OK;
	}
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(info->detail, sizeof info->detail, "cudaGetDeviceCount: %s",
		         cudaGetErrorString(e));
		return TS_OK;
	}
	if (cudaRuntimeGetVersion(&runtime) != cudaSuccess ||
	    cudaDriverGetVersion(&driver) != cudaSuccess)
		cudaGetLastError();
	snprintf(info->detail, sizeof info->detail,
	         "CUDA runtime %d.%d, driver %d.%d", runtime / 1000,
	         (runtime % 1000) / 10, driver / 1000, (driver % 1000) / 10);
	if (n == 0) {
		snprintf(info->detail, sizeof info->detail,
		         "cudaGetDeviceCount: no CUDA devices");
		return TS_OK;
	}
	for (int i = 0; i < n; i++) {
		bool added;
		ts_status st = cuda_add(ctx, i, info, &added, err);

		if (st != TS_OK)
			return st;
		if (added)
			info->device_count++;
	}
	info->available = info->device_count > 0;
	if (!info->available)
		return TS_OK;

	enable_peer_access(ctx->devices + first, ctx->count - first);
	cp = malloc(sizeof *cp + (ctx->count - first) * sizeof cp->gpus[0]);
	if (!cp)
		return ts_error_oom(err, "cuda: out of memory during discovery");
	cp->n = ctx->count - first;
	memcpy(cp->gpus, ctx->devices + first, cp->n * sizeof cp->gpus[0]);
	cp->registered = ctx->cfg->shareable_pinned;
	((struct cuda_dev *)ctx->devices[first]->impl)->pinned = cp;
	ctx->pinned->alloc = cuda_pinned_alloc;
	ctx->pinned->free = cuda_pinned_free;
	ctx->pinned->ctx = cp;
	ctx->pinned->source = cp->registered ? "memfd+cudaHostRegister" : "cudaHostAlloc";
	return TS_OK;
}
