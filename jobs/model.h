/*
 * model.h - a model's life in the catalog: creation (its arrays admitted,
 * then initialised by an operation and published all at once), deletion
 * (its arrays and gradients all at once, never while an operation holds
 * one) and where its arrays are now (the policy a step or an analysis runs
 * with).
 *
 * A model's arrays are owned by it: their owner label is ts_model_owner's,
 * only the model's own jobs write them, and a creation that fails or is
 * cancelled leaves no model and no array behind.
 *
 * Thread-safety: every function is safe on any thread; creation's
 * initialisation runs on an operation worker.
 */
#ifndef TS_JOBS_MODEL_H
#define TS_JOBS_MODEL_H

#include "common/status.h"
#include "jobs/env.h"
#include "ops/operation.h"
#include "train/model.h"

/*
 * Creates model m (copied; its uid and create time are set here) with its
 * weights started as init says: the model is listed at once (not ready),
 * its arrays are allocated now, on the calling thread - admission: a model
 * that cannot fit is refused at once - and an operation of kind "create"
 * initialises them on a worker, publishes them all at once, marks the model
 * ready and leaves ts_render_model of it as its result. ALREADY_EXISTS
 * when the model's or one of its arrays' names is taken;
 * RESOURCE_EXHAUSTED when its arrays do not fit; nothing is left behind on
 * failure. A new reference to the operation in *op.
 */
/* Where the model's array of role lives: on its device in the policy's
 * memory kind for the role (params or opt_state), or, data parallel, a
 * replica on each of its devices (a named sharding over a one-axis mesh
 * "data" of them, in the model's order, no dimension split). Committed. */
struct ts_placement;
void ts_job_model_placement(const struct ts_model *m, enum ts_pbuf_role role,
                            struct ts_placement *pl);

/* The buffer of replica k of a model array (k 0 for one on one device). */
struct ts_buffer;
struct ts_array;
struct ts_buffer *ts_job_model_buffer(const struct ts_array *a, int k);

ts_status ts_job_model_create_submit(const struct ts_jobs_env *env, const struct ts_model *m,
                                     const struct ts_model_init *init, struct ts_operation **op,
                                     struct ts_error *err);

/*
 * Deletes model m (a ready one, as copied out of the registry): its arrays
 * and the gradients of earlier steps go all at once, then the model.
 * ABORTED (MODEL_BUSY, naming the operation and the array) while an
 * operation holds any of them; nothing changes on failure.
 */
ts_status ts_job_model_delete(const struct ts_jobs_env *env, const struct ts_model *m,
                              struct ts_error *err);

/*
 * The policy a run of m starts from: m's (activations, prefetch), with
 * params and opt_state the memory kinds where their arrays are now.
 * FAILED_PRECONDITION when an array is missing (ARRAY_NOT_FOUND) or the
 * params (or the optimizer state) are in mixed memory kinds
 * (MIXED_MEMORY_KINDS, naming two).
 */
ts_status ts_job_model_policy(const struct ts_jobs_env *env, const struct ts_model *m,
                              struct ts_policy *out, struct ts_error *err);

#endif
