/*
 * model.h - models: an MLP, its optimizer and offload policy, and the names
 * of the catalog arrays that hold its parameters and optimizer state.
 *
 * A model's parameters are ordinary catalog arrays in the scanned layout:
 * "{name}.w1" [L, d, h] and "{name}.w2" [L, h, d] (float32), and with Adam
 * "{name}.adam.mu.w1", "{name}.adam.nu.w1", ... They can be downloaded,
 * replaced (loading weights) and moved like any array; a step runs with
 * them wherever they are, so moving "{name}.w1" to pinned_host offloads the
 * parameters. The registry maps names to models.
 *
 * Thread-safety: the registry is guarded by its lock; a model record is an
 * immutable value copied out.
 */
#ifndef TS_MODEL_H
#define TS_MODEL_H

#include <stdint.h>

#include "common/status.h"
#include "storage/array.h"
#include "train/mlp.h"
#include "train/plan.h"

#define TS_MODEL_NAME_MAX 100

struct ts_model {
	char name[TS_MODEL_NAME_MAX + 1];
	struct ts_mlp mlp;
	struct ts_optimizer opt;
	struct ts_policy policy;          /* activations and prefetch; params/opt_state: initial placement */
	struct ts_device *device;
	uint64_t steps;                   /* steps run so far (Adam's t) */
	uint64_t create_ns;
};

/* Catalog names of the model's arrays: role is one of TS_ROLE_W1, W2,
 * MU_W1, MU_W2, NU_W1, NU_W2. */
void ts_model_array_name(const struct ts_model *m, enum ts_pbuf_role role, char *buf, size_t cap);

/* The shape of a parameter role: [L, d, h] or [L, h, d]. */
void ts_model_param_shape(const struct ts_model *m, enum ts_pbuf_role role, uint64_t shape[3]);

struct ts_model_registry;
struct ts_model_registry *ts_model_registry_new(void);
void ts_model_registry_free(struct ts_model_registry *r);

/* ALREADY_EXISTS when the name is taken. */
ts_status ts_model_registry_put(struct ts_model_registry *r, const struct ts_model *m,
                                struct ts_error *err);
/* Copies the model out; false when absent. */
bool ts_model_registry_get(struct ts_model_registry *r, const char *name, struct ts_model *out);
bool ts_model_registry_remove(struct ts_model_registry *r, const char *name);
/* Adds n to the step counter; returns the counter before. */
uint64_t ts_model_registry_advance(struct ts_model_registry *r, const char *name, uint64_t n);
/* Copies up to cap models in name order into out; returns the count. */
size_t ts_model_registry_list(struct ts_model_registry *r, struct ts_model *out, size_t cap);

#endif
