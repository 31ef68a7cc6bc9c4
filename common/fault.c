/*
 * fault.c - the counters and the armed point of a fault-injection build.
 *
 * Compiled to nothing unless TS_FAULT_BUILD: a production binary has no
 * counters and no way to arm a failure.
 */
#include "common/fault.h"

#ifdef TS_FAULT_BUILD

#include <stdatomic.h>
#include <string.h>

static const char *const kind_names[TS_FAULT_KIND_COUNT] = {
	"alloc_device", "alloc_pinned", "alloc_pageable", "alloc_heap", "copy",
};

/* Process-wide by design (see fault.h): the points are in code that no
 * request state reaches. */
static _Atomic uint64_t counts[TS_FAULT_KIND_COUNT];
static _Atomic int armed_kind;
static _Atomic uint64_t armed_at;
static _Atomic uint64_t fired;

bool ts_fault_fire(enum ts_fault_kind kind)
{
	uint64_t n;

	if ((unsigned)kind >= TS_FAULT_KIND_COUNT)
		return false;
	n = atomic_fetch_add(&counts[kind], 1) + 1;
	if ((int)kind != atomic_load(&armed_kind) || n != atomic_load(&armed_at))
		return false;
	atomic_fetch_add(&fired, 1);
	return true;
}

const char *ts_fault_kind_name(enum ts_fault_kind kind)
{
	return (unsigned)kind < TS_FAULT_KIND_COUNT ? kind_names[kind] : "unknown";
}

bool ts_fault_kind_parse(const char *name, enum ts_fault_kind *out)
{
	for (int k = 0; name && k < TS_FAULT_KIND_COUNT; k++)
		if (strcmp(name, kind_names[k]) == 0) {
			*out = (enum ts_fault_kind)k;
			return true;
		}
	return false;
}

void ts_fault_arm(enum ts_fault_kind kind, uint64_t at)
{
	atomic_store(&armed_at, 0);
	for (int k = 0; k < TS_FAULT_KIND_COUNT; k++)
		atomic_store(&counts[k], 0);
	atomic_store(&fired, 0);
	atomic_store(&armed_kind, (int)kind);
	atomic_store(&armed_at, at);
}

uint64_t ts_fault_count(enum ts_fault_kind kind)
{
	return (unsigned)kind < TS_FAULT_KIND_COUNT ? atomic_load(&counts[kind]) : 0;
}

uint64_t ts_fault_fired(void)
{
	return atomic_load(&fired);
}

void ts_fault_armed(enum ts_fault_kind *kind, uint64_t *at)
{
	*kind = (enum ts_fault_kind)atomic_load(&armed_kind);
	*at = atomic_load(&armed_at);
}

#else

/* Keeps the translation unit non-empty in production builds. */
typedef int ts__fault_unused;

#endif
