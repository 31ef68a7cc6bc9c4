/*
 * buffer.c - reference-counted blocks of memory spaces.
 */
#include "memory/buffer.h"

#include "common/fault.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct ts_buffer {
	_Atomic uint32_t refs;
	_Atomic(struct ts_buffer *) lease_copy; /* owned; NULL until a lease needs one */
	struct ts_space *space;   /* immutable; borrowed (outlives every buffer) */
	void *data;               /* immutable */
	uint64_t size;            /* immutable */
};

ts_status ts_buffer_new(struct ts_space *sp, uint64_t size, struct ts_buffer **out,
                        struct ts_error *err)
{
	struct ts_buffer *b = ts_fault_malloc(sizeof *b);
	ts_status st;

	if (!b)
		return ts_error_oom(err, "no memory for a buffer record");
	st = ts_space_alloc(sp, size, &b->data, err);
	if (st != TS_OK) {
		free(b);
		return st;
	}
	atomic_init(&b->refs, 1);
	atomic_init(&b->lease_copy, NULL);
	b->space = sp;
	b->size = size;
	*out = b;
	return TS_OK;
}

struct ts_buffer *ts_buffer_ref(struct ts_buffer *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

void ts_buffer_unref(struct ts_buffer *b)
{
	uint32_t was;

	if (!b)
		return;
	was = atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel);
	assert(was > 0);     /* an unref without its reference */
	if (was != 1)
		return;
	ts_buffer_unref(atomic_load(&b->lease_copy));
	ts_space_release(b->space, b->data, b->size);
	free(b);
}

void *ts_buffer_data(const struct ts_buffer *b)
{
	return b->data;
}

uint64_t ts_buffer_size(const struct ts_buffer *b)
{
	return b->size;
}

struct ts_space *ts_buffer_space(const struct ts_buffer *b)
{
	return b->space;
}

struct ts_device *ts_buffer_device(const struct ts_buffer *b)
{
	return ts_space_device(b->space);
}

enum ts_memory_kind ts_buffer_kind(const struct ts_buffer *b)
{
	return ts_space_kind(b->space);
}

bool ts_buffer_host_visible(const struct ts_buffer *b)
{
	enum ts_memory_kind k = ts_space_kind(b->space);

	return k != TS_MEM_DEVICE ||
	       ts_device_props(ts_space_device(b->space))->backend == TS_BACKEND_CPU;
}

int ts_buffer_share(const struct ts_buffer *b, uint64_t *offset)
{
	if (ts_buffer_kind(b) == TS_MEM_DEVICE &&
	    ts_device_props(ts_buffer_device(b))->backend == TS_BACKEND_CUDA)
		return -ENOENT;   /* a device pointer: never in a host mapping */
	return ts_host_mem_share(ts_buffer_device(b), b->data, b->size ? b->size : 1, offset);
}

ts_status ts_buffer_leasable(struct ts_buffer *b, struct ts_space *copy_space,
                             struct ts_buffer **out, struct ts_error *err)
{
	struct ts_buffer *copy = atomic_load(&b->lease_copy), *none = NULL;
	void *base;
	uint64_t size;
	ts_status st;

	*out = b;
	if (ts_buffer_kind(b) == TS_MEM_DEVICE &&
	    ts_device_props(ts_buffer_device(b))->backend == TS_BACKEND_CUDA)
		return TS_OK;     /* a GPU's memory is handed by CUDA IPC, not copied */
	if (copy) {
		*out = copy;
		return TS_OK;
	}
	/* a mapping of its own goes back to the system when b is freed */
	if (!ts_space_chunk(b->space, b->data, &base, &size))
		return TS_OK;
	st = ts_buffer_new(copy_space, b->size, &copy, err);
	if (st != TS_OK)
		return st;
	/* fresh pages: written through the file where it can be */
	ts_host_mem_fill(ts_buffer_device(copy), copy->data, b->data, b->size);
	if (!atomic_compare_exchange_strong(&b->lease_copy, &none, copy)) {
		ts_buffer_unref(copy);
		copy = none;
	}
	*out = copy;
	return TS_OK;
}

bool ts_buffer_chunk(const struct ts_buffer *b, void **base, uint64_t *size,
                     uint64_t *offset)
{
	if (!ts_space_chunk(b->space, b->data, base, size))
		return false;
	*offset = (uint64_t)((uintptr_t)b->data - (uintptr_t)*base);
	return true;
}
