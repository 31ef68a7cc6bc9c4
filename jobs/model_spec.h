/*
 * model_spec.h - the model spec of POST /v1/models (and of
 * POST /v1/models:analyze) and the placement policy of :analyze and :step,
 * parsed strictly: an unknown key or a wrong type is INVALID_ARGUMENT
 * naming the field ("mlp.layers must be an integer", "model.bogus is not a
 * field this API knows"), a value out of range names it and the range.
 *
 * They sit below the handlers because a model comes back from a checkpoint
 * (jobs/checkpoint.h) as well as from a request.
 *
 * Thread-safety: pure functions of their arguments (the devices are read only).
 */
#ifndef TS_JOBS_MODEL_SPEC_H
#define TS_JOBS_MODEL_SPEC_H

#include <jansson.h>

#include "jobs/env.h"
#include "jobs/render.h"
#include "train/model.h"


/* A model (name, mlp, dtype, loss, optimizer, init, placement) from body
 * (borrowed, any JSON value): *m and *init on success; m->device is the
 * placement's device or default_device;
 * "persist" (a boolean) into m->persist; m->steps from "steps" (the
 * optimizer's step count, Adam's t: a resumed model's). Optimizers: none,
 * sgd, adam, adamw (weight_decay, optax's default 1e-4), each with
 * learning_rate or a schedule {"type": "constant", "value"} or
 * {"type": "warmup_cosine_decay", "init_value", "peak_value",
 * "warmup_steps", "decay_steps", "end_value"} (optax's). dtype float32
 * (default), bfloat16 or float16: the compute dtype of the model's GEMMs
 * (mlp.h), INVALID_ARGUMENT BAD_DTYPE for any other. */
ts_status ts_job_model_parse(const struct ts_jobs_env *env, struct ts_device *default_device,
                             json_t *body, struct ts_model *m, struct ts_model_init *init,
                             struct ts_error *err);


/* Activations and prefetch (and params / opt_state memory kinds) from a
 * "placement" object into *p; absent fields keep *p. Checks the result
 * (ts_policy_check). */
ts_status ts_job_policy_parse(json_t *pl, struct ts_policy *p, struct ts_error *err);

#endif
