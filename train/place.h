/*
 * place.h - placing a built schedule's temps in their arenas and reading
 * the memory analysis from it (plan.h names the fields).
 *
 * The planner (plan.c) emits buffers and actions; this file gives every
 * temp its offset in the arena of its memory kind (no two temps alive at
 * the same time overlap; each starts at a multiple of TS_PLAN_ALIGN), marks
 * the versioned and journaled arguments, and fills the analysis and the
 * device timeline. The same schedule always gets the same placement.
 *
 * Thread-safety: a pure function over a caller-owned plan.
 */
#ifndef TS_PLACE_H
#define TS_PLACE_H

#include "common/status.h"
#include "train/plan.h"

/*
 * Places the temps of p (offsets in p->bufs), marks its versioned and
 * journaled arguments, and fills every *_size_in_bytes field, h2d/d2h_bytes,
 * peak_device_bytes and the timeline (p->points, owned by p). Returns
 * RESOURCE_EXHAUSTED when out of memory (p keeps what it had; the caller
 * releases it).
 */
ts_status ts__plan_analyse(struct ts_plan *p);

#endif
