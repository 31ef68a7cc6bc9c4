/*
 * buffer.h - a reference-counted block of one memory space.
 *
 * Every holder of a buffer - an array version in the catalog, a download
 * being sent, a copy in flight - holds its own reference; the block goes back
 * to its space when the last one is dropped. Device memory is released only
 * by the last holder, after the work using it has completed (holders of
 * queued work keep their reference until their event completes).
 *
 * A buffer is host-visible when the CPU may read and write it directly:
 * pinned and unpinned host memory, and cpu:0's device memory. Device memory
 * of an accelerator (CUDA, and sim, which is simulated faithfully) is reached
 * only through its device's queues - by this process: another process on the
 * node may be handed it by a lease (a descriptor of a sim device's memfd, a
 * CUDA IPC handle of a GPU pool's chunk).
 *
 * A buffer handed to a lessee by descriptor is memory that no other array
 * ever gets: its own mapping, or a copy kept with it (ts_buffer_leasable).
 *
 * Thread-safety: ref/unref are atomic; the bytes are guarded by whoever
 * writes them (a buffer is written only before it is published).
 */
#ifndef TS_BUFFER_H
#define TS_BUFFER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "memory/space.h"

struct ts_buffer;

/* A new buffer of size bytes in sp, one reference held by the caller. Fails
 * as ts_space_alloc does (RESOURCE_EXHAUSTED with the space's numbers). */
ts_status ts_buffer_new(struct ts_space *sp, uint64_t size, struct ts_buffer **out,
                        struct ts_error *err);

/* Takes another reference; returns b. */
struct ts_buffer *ts_buffer_ref(struct ts_buffer *b);

/* Drops a reference (NULL is ignored); the last one frees the block. */
void ts_buffer_unref(struct ts_buffer *b);

/* The block's address (a device pointer for device memory). */
void *ts_buffer_data(const struct ts_buffer *b);
uint64_t ts_buffer_size(const struct ts_buffer *b);
struct ts_space *ts_buffer_space(const struct ts_buffer *b);
struct ts_device *ts_buffer_device(const struct ts_buffer *b);
enum ts_memory_kind ts_buffer_kind(const struct ts_buffer *b);

/* Whether the CPU may touch the bytes directly. */
bool ts_buffer_host_visible(const struct ts_buffer *b);

/*
 * A read-only descriptor of the shareable host memory holding b's bytes and
 * their offset in it (see ts_host_mem_share: no holder of it can write the
 * memory). Host memory and sim device memory (a memfd standing for a GPU's)
 * can be; a negative errno when b is a GPU's memory or not shareable
 * (-ENOENT). The descriptor names the whole memfd: see ts_buffer_leasable
 * for the memory a lease may hand out.
 */
int ts_buffer_share(const struct ts_buffer *b, uint64_t *offset);

/*
 * The buffer whose memory a lease hands out for b's bytes, into *out
 * (borrowed: it lives as long as b): memory that holds b's bytes and will
 * never hold another array's, however long a lessee keeps it mapped. That
 * is b itself when its bytes are a mapping of their own (pageable host
 * memory: unmapped and closed when b is freed, never reused); otherwise (a
 * pinned segment or a device region, carved and reused) a copy of b in
 * copy_space (a pageable host space), made at the first call and freed
 * with b. Call it only once b's bytes are final (a published version).
 * Fails as ts_buffer_new in copy_space does (RESOURCE_EXHAUSTED with its
 * numbers). Thread-safe: concurrent first calls make one copy between them.
 */
ts_status ts_buffer_leasable(struct ts_buffer *b, struct ts_space *copy_space,
                             struct ts_buffer **out, struct ts_error *err);

/*
 * The pool chunk holding b's bytes (see ts_space_chunk): its base, its size
 * and b's offset in it, for a CUDA IPC handle (taken of a cudaMalloc base).
 * false when b lies in no chunk (pageable memory: its own mapping).
 */
bool ts_buffer_chunk(const struct ts_buffer *b, void **base, uint64_t *size,
                     uint64_t *offset);

#endif
