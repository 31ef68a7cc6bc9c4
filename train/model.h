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
 * Identity: every model the registry takes gets a uid never given before;
 * its arrays carry the owner label ts_model_owner() writes, and operations
 * (creation, steps) refer to the model by uid, so a model created again
 * under the same name is a different model that no earlier operation can
 * reach. A model is listed from the moment its creation is accepted; it is
 * ready once its arrays are initialised and published (creating names the
 * operation doing that until then).
 *
 * The registry's verbs are the house's (common/registry.h, the catalog,
 * the saved shardings): put, get, remove, list; set_ready, add_steps and
 * step_count change or read one model by uid.
 *
 * Thread-safety: the registry is guarded by its lock; a model record is an
 * immutable value copied out.
 */
#ifndef TS_MODEL_H
#define TS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/histogram.h"
#include "common/status.h"
#include "train/mlp.h"
#include "train/plan.h"

#define TS_MODEL_NAME_MAX 100
#define TS_MODEL_VOCAB_MAX (1 << 20)

struct ts_model {
	char name[TS_MODEL_NAME_MAX + 1];
	struct ts_mlp mlp;
	struct ts_optimizer opt;
	struct ts_policy policy;          /* activations and prefetch; params/opt_state: initial placement */
	struct ts_device *device;
	/* data parallel: a replica of every array on each of replicas > 1
	 * devices (replica_devs[0] == device), steps run on all of them
	 * (plan.h's ts_plan_build_replicated); 0: on device alone */
	int replicas;
	struct ts_device *replica_devs[TS_PLAN_REPLICAS_MAX];
	bool shard_optimizer;             /* ZeRO-1: each device keeps its slice of Adam's
	                                     state (plan.h's ts_plan_build_zero) */
	bool shard_gradients;             /* ZeRO-2: and of the reduced gradients during a
	                                     step (ts_plan_build_zero2); implies
	                                     shard_optimizer */
	uint64_t steps;                   /* steps run so far (Adam's t) */
	uint64_t create_ns;
	uint64_t uid;                     /* assigned by the registry */
	bool ready;                       /* arrays initialised and published */
	bool persist;                     /* kept across restarts (jobs/state.h) */
	char creating[40];                /* the creating operation's id while !ready */
};

/* How a new model's weights start: normal(0, scale) draws from seed, or a
 * constant. */
struct ts_model_init {
	bool constant;
	double value, scale;
	uint64_t seed;
};

/* The owner label of the model's arrays: "model 'name'". */
void ts_model_owner(const struct ts_model *m, char *buf, size_t cap);

/* Catalog names of the model's arrays: role is one of TS_ROLE_W1, W2,
 * MU_W1, MU_W2, NU_W1, NU_W2, and for token models EMBED ("{name}.embed"),
 * PROJ ("{name}.proj") and their state ("{name}.adam.mu.embed", ...). */
void ts_model_array_name(const struct ts_model *m, enum ts_pbuf_role role, char *buf, size_t cap);

/* The shape of a parameter role: [L, d, h] or [L, h, d]; embed [vocab, d]
 * and proj [d, vocab]; a GPT's as gpt.h lists them. Returns the rank (1 to
 * 3). */
int ts_model_param_shape(const struct ts_model *m, enum ts_pbuf_role role, uint64_t shape[3]);

/* Whether the model has the array of a parameter or optimizer-state role. */
bool ts_model_has_role(const struct ts_model *m, enum ts_pbuf_role role);

/* Every parameter and optimizer-state role a model may have, in order. */
#define TS_MODEL_NROLES (12 + 3 * TS_GPT_NPARAMS)
extern const enum ts_pbuf_role ts_model_roles[TS_MODEL_NROLES];

struct ts_memory;

/*
 * Admission of a model's arrays as a whole, before any of them is
 * allocated: for each space its params and its optimizer state go to
 * (m->device, the policy's memory kinds), the bytes of every such array
 * (float32, as created) against the space's free bytes. TS_OK when each
 * space has room for its share (advisory: the arrays' own allocations still
 * decide, and fragmentation is theirs to report). Else RESOURCE_EXHAUSTED,
 * reason OUT_OF_MEMORY, a message with what the whole model needs there
 * against the budget ("model 'm' needs 12.00 GiB of pinned_host on sim:0
 * (params 4.00 GiB, optimizer state 8.00 GiB); the budget is 5.90 GiB,
 * 5.10 GiB free"), metadata space, requested_bytes (the whole need),
 * free_bytes, largest_free_block_bytes, limit_bytes as every refusal of
 * memory has, and model, params_bytes, opt_state_bytes; the refusal counts
 * in the space's stats. mem is borrowed. Thread-safe.
 */
ts_status ts_model_check_fit(const struct ts_model *m, const struct ts_memory *mem,
                             struct ts_error *err);

struct ts_model_registry;
struct ts_model_registry *ts_model_registry_new(void);
void ts_model_registry_free(struct ts_model_registry *r);

/* Lists m under its name with a new uid (written to *uid, may be NULL);
 * ALREADY_EXISTS when the name is taken. */
ts_status ts_model_registry_put(struct ts_model_registry *r, const struct ts_model *m,
                                uint64_t *uid, struct ts_error *err);
/* Copies the model out; false when absent. */
bool ts_model_registry_get(struct ts_model_registry *r, const char *name, struct ts_model *out);
/* Removes the model with this uid; false when it is gone already. */
bool ts_model_registry_remove(struct ts_model_registry *r, uint64_t uid);
/* Marks the model with this uid ready, or records its creating operation
 * (ready false); false when it is gone. */
bool ts_model_registry_set_ready(struct ts_model_registry *r, uint64_t uid, bool ready,
                                 const char *creating);
/* Sets or clears the persist mark of the model with this uid; false when
 * it is gone. */
bool ts_model_registry_set_persist(struct ts_model_registry *r, uint64_t uid, bool on);
/* Adds n to the step counter of the model with this uid; the counter
 * before in *before (may be NULL). False, changing nothing, when gone. */
bool ts_model_registry_add_steps(struct ts_model_registry *r, uint64_t uid, uint64_t n,
                                 uint64_t *before);
/* The step counter of the model with this uid into *steps; false, leaving
 * *steps alone, when gone. */
bool ts_model_registry_step_count(struct ts_model_registry *r, uint64_t uid, uint64_t *steps);
/* Records one training step that ran for ns nanoseconds, whatever the
 * model (lock-free), in the histogram of them all. */
void ts_model_registry_record_step(struct ts_model_registry *r, uint64_t ns);
/* That histogram (borrowed; lives as long as r): its count is the steps
 * run since start. */
const struct ts_histogram *ts_model_registry_step_times(const struct ts_model_registry *r);
/* Copies up to cap models in name order into out; returns the count. */
size_t ts_model_registry_list(struct ts_model_registry *r, struct ts_model *out, size_t cap);

#endif
