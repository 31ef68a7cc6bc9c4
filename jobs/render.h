/*
 * render.h - the core's objects as JSON, in the one shape every answer and
 * every operation result uses: a sharding, an array's metadata, a plan's
 * memory analysis, a model's spec and its state. What renders here parses
 * back (handlers/sharding_json.h, jobs/model_spec.h) to an equal value.
 *
 * Every function returns a new reference built of nothing another thread
 * holds (values are copied, never shared), or NULL when out of memory.
 *
 * Thread-safety: safe on any thread; each reads one immutable value (an
 * array version, a model record copied out of its registry).
 */
#ifndef TS_JOBS_RENDER_H
#define TS_JOBS_RENDER_H

#include <jansson.h>
#include <stdbool.h>

#include "storage/array.h"
#include "storage/sharding.h"
#include "train/model.h"
#include "train/plan.h"

/* The JSON of s, always with memory_kind, and for a named sharding the
 * mesh's devices, axis_names and shape and the spec as given. */
json_t *ts_render_sharding(const struct ts_sharding *s);

/* An array version's shards: device, memory_kind, index (per dimension
 * [start, stop)), replica and nbytes of each. */
json_t *ts_render_shards(const struct ts_array *a);

/* The metadata of an array version: name, dtype, shape, nbytes, sharding,
 * committed, shards, version, etag, times, implicit_transfer_bytes and a
 * copy of its metadata. */
json_t *ts_render_array(const struct ts_array *a);

/* The memory analysis of a plan (the *_size_in_bytes, peak_device_bytes,
 * h2d/d2h bytes, and a step's accumulate when above 1), with timeline the
 * live device bytes at each point. */
json_t *ts_render_plan(const struct ts_plan *p, bool timeline);

/* The optimizer object of a spec: type (adamw for decoupled decay), b1, b2,
 * eps, clip_global_norm, weight_decay (adamw), and learning_rate or, for a
 * warmup cosine, the schedule. */
json_t *ts_render_optimizer(const struct ts_optimizer *o);

/* The model as a spec ts_job_model_parse reads back to the same model (name,
 * mlp, dtype, loss, optimizer, placement, steps; no init): what a
 * checkpoint carries. */
json_t *ts_render_model_spec(const struct ts_model *m);

/* The spec, the names of its arrays ("arrays": role -> name) and "state"
 * (CREATING with "creating_operation" while its creation runs, then READY):
 * what GET /v1/models/{m} shows and a creation leaves as its result. */
json_t *ts_render_model(const struct ts_model *m);

#endif
