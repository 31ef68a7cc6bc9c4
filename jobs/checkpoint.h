/*
 * checkpoint.h - a model's exact checkpoint: the one serialization of a
 * model, which GET /v1/models/{model}:export streams, POST
 * /v1/models:import reads, and the state dir (jobs/state.h) writes and
 * restores.
 *
 * A checkpoint is a safetensors file: the model's parameters and optimizer
 * state as float32 tensors named by their role ("w1", "w2", "adam.mu.w1",
 * ...; those the model has, in ts_model_roles order), and in "__metadata__"
 * the strings "format" ("tstage.model.v1"), "model" (the model's spec as
 * POST /v1/models takes it, without "steps") and "steps" (the optimizer's
 * step count, Adam's t, in decimal). Reading one creates the model with
 * exactly those bytes and that t, so training continues as if it had never
 * stopped: the same losses bit for bit.
 *
 * The reader (struct ts_checkpoint_rx) checks the header as the model's
 * (the metadata, every tensor's name, dtype and shape; a tensor missing or
 * extra is INVALID_ARGUMENT BAD_CHECKPOINT naming it) before any byte
 * lands, lists the model (not ready) and admits its arrays at once, and
 * publishes them all together, ready, at ts_checkpoint_rx_publish: a
 * refused or truncated checkpoint leaves nothing.
 *
 * Thread-safety: a reader belongs to one thread at a time; the rest are
 * pure functions of a model record.
 */
#ifndef TS_JOBS_CHECKPOINT_H
#define TS_JOBS_CHECKPOINT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "jobs/env.h"
#include "jobs/import.h"
#include "train/model.h"

#define TS_CHECKPOINT_FORMAT "tstage.model.v1"

/* The roles model m has, in ts_model_roles order, into roles (room for
 * TS_MODEL_NROLES); their count. */
size_t ts_checkpoint_roles(const struct ts_model *m, enum ts_pbuf_role *roles);

/* The tensor name of a role: the array's name after "{model}." */
void ts_checkpoint_tensor_name(const struct ts_model *m, enum ts_pbuf_role r, char *buf,
                               size_t cap);

/* The checkpoint's __metadata__ for m (new reference; NULL when out of
 * memory). */
json_t *ts_checkpoint_metadata(const struct ts_model *m);

/* A checkpoint being read. Fields are the reader's; model is the model as
 * listed once the header is admitted (its uid set). */
struct ts_checkpoint_rx {
	const struct ts_jobs_env *env;
	struct ts_device *default_device;
	char name[TS_MODEL_NAME_MAX + 1];      /* "" for the checkpoint's */
	char device[64];                       /* "" for the checkpoint's */
	bool persist;                          /* the model's persist mark */
	struct ts_import_rx rx;
	struct ts_model model;
	bool published;
};

/* Starts a reader of a content_length-byte checkpoint (UINT64_MAX:
 * unknown) naming the model name and placing it on device when not NULL
 * or "" (copied; INVALID_ARGUMENT when too long). env and default_device
 * are borrowed for the reader's life. */
ts_status ts_checkpoint_rx_init(struct ts_checkpoint_rx *c, const struct ts_jobs_env *env,
                                struct ts_device *default_device, const char *name,
                                const char *device, bool persist, uint64_t content_length,
                                struct ts_error *err);

/* The next n bytes (ts_import_rx_bytes' errors, and the checkpoint's:
 * BAD_CHECKPOINT, ALREADY_EXISTS for a model or array name taken). */
ts_status ts_checkpoint_rx_bytes(struct ts_checkpoint_rx *c, const char *data, size_t n,
                                 struct ts_error *err);

/* Checks the data is whole (TRUNCATED) and publishes the model's arrays
 * all at once, the model ready. */
ts_status ts_checkpoint_rx_publish(struct ts_checkpoint_rx *c, struct ts_error *err);

/* Frees what c holds; a model listed but not published is removed. */
void ts_checkpoint_rx_release(struct ts_checkpoint_rx *c);

#endif
