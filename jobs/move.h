/*
 * move.h - device_put and copy as operations: a move of storage/move.h
 * admitted on the caller's thread (the destination allocated, or refused
 * at once), then copied and published by an operation worker, which leaves
 * the new version's metadata (ts_render_array) as the result.
 *
 * Thread-safety: submission is safe on any thread; the copy runs on an
 * operation worker.
 */
#ifndef TS_JOBS_MOVE_H
#define TS_JOBS_MOVE_H

#include "common/status.h"
#include "jobs/env.h"
#include "ops/operation.h"
#include "storage/move.h"

/*
 * Submits moving src (borrowed) as spec says (spec->name NULL or src's name
 * for a put; spec->dtype the destination's) as an operation of kind "put"
 * or "copy" targeting src's name. Refusals the publish would meet are
 * answered now: a hold on the target (ABORTED) or an owner, and for a copy
 * without spec->overwrite an existing array (ALREADY_EXISTS ARRAY_EXISTS);
 * RESOURCE_EXHAUSTED when the destination does not fit; ABORTED
 * (TARGET_BUSY) while another operation moves src. A new reference to the
 * operation in *op.
 */
ts_status ts_job_move_submit(const struct ts_jobs_env *env, struct ts_array *src,
                             const struct ts_move_spec *spec, bool is_copy,
                             struct ts_operation **op, struct ts_error *err);

struct ts_job_move;

/*
 * ts_job_move_submit in two steps, for a move whose source is filled
 * between them (a cross-node copy's staging array, server/fleet_recv.c):
 * prepare answers the same refusals and admits (the destination allocated,
 * *bytes what the copy writes); start submits it as the operation (and
 * owns jm, even when it fails), here: run on the calling thread before it
 * returns (ts_op_submit_here: only for a move that copies nothing, its
 * source consumed in place); discard drops a prepared one, freeing the
 * destination.
 */
ts_status ts_job_move_prepare(const struct ts_jobs_env *env, struct ts_array *src,
                              const struct ts_move_spec *spec, bool is_copy,
                              struct ts_job_move **jm, uint64_t *bytes, struct ts_error *err);
ts_status ts_job_move_start(struct ts_job_move *jm, bool here, struct ts_operation **op,
                            struct ts_error *err);
void ts_job_move_discard(struct ts_job_move *jm);

#endif
