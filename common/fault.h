/*
 * fault.h - injected failures for tests of the failure paths: the N-th
 * allocation of a kind (device, pinned, pageable memory, heap records) or the
 * N-th copy fails as a real one would.
 *
 * Every failure point calls ts_fault_fire(kind) where the real failure can
 * happen and, when it answers true, takes the path a real failure takes (the
 * allocation returns NULL or RESOURCE_EXHAUSTED, the copy reports an error).
 * In a production build ts_fault_fire is a constant false: the points compile
 * away and nothing can arm them. Only a build with TS_FAULT_BUILD (make
 * FAULT=1, into build/fault) counts the points and has the arming API, which
 * the daemon exposes as the test-only route /debug/faults.
 *
 * Invariants: each kind counts the points reached since it was last reset;
 * an armed kind fails exactly its at-th point, once.
 *
 * Thread-safety: every function is safe from any thread (atomics). The
 * counters are process-wide, on purpose: a failure point sits in code (an
 * allocator, a copy worker) that no request's state reaches.
 */
#ifndef TS_FAULT_H
#define TS_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

enum ts_fault_kind {
	TS_FAULT_ALLOC_DEVICE = 0,   /* a device pool's allocation */
	TS_FAULT_ALLOC_PINNED,       /* the pinned host pool's */
	TS_FAULT_ALLOC_PAGEABLE,     /* the pageable pool's (cpu:0's device memory too) */
	TS_FAULT_ALLOC_HEAP,         /* a bookkeeping record of a request path */
	TS_FAULT_COPY,               /* a copy run by a host queue (sim, cpu) */
	TS_FAULT_KIND_COUNT
};

#ifdef TS_FAULT_BUILD

/* Counts a point of kind; true when this is the armed one (fail it). */
bool ts_fault_fire(enum ts_fault_kind kind);

/* "alloc_device", "alloc_pinned", "alloc_pageable", "alloc_heap", "copy". */
const char *ts_fault_kind_name(enum ts_fault_kind kind);

/* The kind named name; false when there is none. */
bool ts_fault_kind_parse(const char *name, enum ts_fault_kind *out);

/* Resets every counter and arms the at-th point of kind to fail (at == 0:
 * none, count only). */
void ts_fault_arm(enum ts_fault_kind kind, uint64_t at);

/* Points of kind reached since the last ts_fault_arm; failures injected. */
uint64_t ts_fault_count(enum ts_fault_kind kind);
uint64_t ts_fault_fired(void);

/* The armed kind and point (at == 0: nothing armed). */
void ts_fault_armed(enum ts_fault_kind *kind, uint64_t *at);

#else

static inline bool ts_fault_fire(enum ts_fault_kind kind)
{
	(void)kind;
	return false;
}

#endif

/* malloc and calloc of a heap failure point (NULL when it fires). */
static inline void *ts_fault_malloc(size_t size)
{
	return ts_fault_fire(TS_FAULT_ALLOC_HEAP) ? NULL : malloc(size);
}

static inline void *ts_fault_calloc(size_t n, size_t size)
{
	return ts_fault_fire(TS_FAULT_ALLOC_HEAP) ? NULL : calloc(n, size);
}

#endif
