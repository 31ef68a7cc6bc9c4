/*
 * colocate.h - committed and uncommitted arrays used together.
 *
 * An operation that uses several arrays at once (a training step's
 * parameters, inputs and targets) runs on one device. Committed arrays
 * (placed by an explicit request) never move unless asked: if they sit on
 * different devices, the operation is refused with FAILED_PRECONDITION
 * naming them and their devices. Uncommitted arrays (uploaded without a
 * placement) follow: one that is elsewhere is moved to the operation's
 * device - keeping its memory kind, staying uncommitted - and every such
 * move is counted, in the array's metadata and in the node's
 * implicit-transfer total, because this is exactly the copy that JAX users
 * pay for without seeing it.
 *
 * Thread-safety: safe from any thread; a move publishes a new version only
 * if the array was not replaced meanwhile (else ABORTED).
 */
#ifndef TS_COLOCATE_H
#define TS_COLOCATE_H

#include "storage/array.h"
#include "storage/stage.h"

/*
 * Picks the device for an operation on arrs[0..n): the device of the
 * committed arrays (all must agree; sharded placements count as their first
 * device and must span the same devices in the same order, however each
 * splits its array), else `fallback`. Moves every
 * uncommitted array not on it there; arrs[i] is replaced by the moved
 * version (the reference in arrs[i] is dropped, a new one stored). *where
 * receives the device. Each move is ts_move's (metadata and counts kept,
 * published only over the version read); holder (may be NULL) is the
 * operation asking, which may move the arrays it holds (they stay held).
 */
ts_status ts_colocate(struct ts_catalog *cat, struct ts_stager *st, struct ts_memory *mem,
                      struct ts_array **arrs, size_t n, struct ts_device *fallback,
                      const char *holder, struct ts_device **where, struct ts_error *err);

#endif
