/*
 * model_spec.h - the model spec of POST /v1/models (and of
 * POST /v1/models:analyze) and the placement policy of :analyze and :step,
 * parsed strictly: an unknown key or a wrong type is INVALID_ARGUMENT
 * naming the field ("mlp.layers must be an integer", "model.bogus is not a
 * field this API knows"), a value out of range names it and the range.
 *
 * Thread-safety: pure functions of their arguments (the core is read only).
 */
#ifndef TS_HANDLERS_MODEL_SPEC_H
#define TS_HANDLERS_MODEL_SPEC_H

#include <jansson.h>

#include "handlers/api.h"
#include "jobs/render.h"
#include "train/model.h"


/* A model (name, mlp, dtype, loss, optimizer, init, placement) from body
 * (borrowed, any JSON value): *m and *init on success; m->device is the
 * placement's device or the core's default; m->steps from "steps" (the
 * optimizer's step count, Adam's t: a resumed model's). Optimizers: none,
 * sgd, adam, adamw (weight_decay, optax's default 1e-4), each with
 * learning_rate or a schedule {"type": "constant", "value"} or
 * {"type": "warmup_cosine_decay", "init_value", "peak_value",
 * "warmup_steps", "decay_steps", "end_value"} (optax's). dtype float32
 * (default), bfloat16 or float16: the compute dtype of the model's GEMMs
 * (mlp.h), INVALID_ARGUMENT BAD_DTYPE for any other. */
ts_status ts_h_model_parse(const struct ts_core *core, json_t *body, struct ts_model *m,
                           struct ts_model_init *init, struct ts_error *err);


/* Activations and prefetch (and params / opt_state memory kinds) from a
 * "placement" object into *p; absent fields keep *p. Checks the result
 * (ts_policy_check). */
ts_status ts_h_policy_parse(json_t *pl, struct ts_policy *p, struct ts_error *err);

#endif
