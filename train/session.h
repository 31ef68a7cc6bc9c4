/*
 * session.h - a training session: the steps of one :step call on one
 * device, from memory bound to the plan's roles to measured results.
 *
 * A session owns the plan of (model, batch, policy), the kernels and three
 * queues (compute, host->device, device->host) on its device, and the
 * staged batch. Its caller owns the arrays: it binds the memory of each
 * role - one slot per role of the plan (w1, w2, mu/nu of each, inputs,
 * targets, gradients), never by position - and stages the inputs and
 * targets from a source in any memory (only the selected rows move, merged
 * into runs). Then ts_session_run runs the steps one after another.
 *
 * Atomic steps: an argument the plan updates into new memory ("versioned",
 * plan.h) gets that memory from the caller before every step (hooks'
 * prepare, ts_session_set_next) and is handed back after every step that
 * succeeded (hooks' publish), when it becomes the role's memory for the
 * next step. A step that fails leaves every bound argument as it was.
 *
 * A session knows memory (device/, memory/), not arrays: it never calls up
 * into the layers that own them.
 *
 * An evaluation session (cfg.evaluate) plans the forward pass and the loss
 * only: ts_session_run with steps 1 computes the loss into the report (the
 * same value, bit for bit, as a step's before its update) and, when bound,
 * the outputs; no role is versioned and nothing but the outputs is written.
 *
 * Data parallel (cfg.replicas > 1): the step runs on cfg.devs[0..R-1]
 * together (plan.h's ts_plan_build_replicated: gradients all-reduced, the
 * same update everywhere). Each replica's memory is bound and its next
 * versions given per replica (ts_session_bind_replica,
 * ts_session_set_next_replica; the plain calls are replica 0's); a staged
 * source holds every replica's rows one after another (R times the plan's
 * batch), replica k getting the k-th R-th of them. The report's loss of a
 * step is the replicas' mean; its bytes are summed over them.
 *
 * Thread-safety: a session is used by one thread at a time.
 */
#ifndef TS_SESSION_H
#define TS_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "memory/space.h"
#include "train/exec.h"
#include "train/mlp.h"
#include "train/plan.h"

struct ts_session;

struct ts_session_config {
	struct ts_device *dev;           /* where the steps run (borrowed) */
	struct ts_memory *memory;        /* its spaces: arenas and staging (borrowed) */
	struct ts_mlp mlp;
	struct ts_optimizer opt;
	struct ts_policy policy;         /* params and opt_state where their memory is */
	int batch;                       /* rows per step (per micro-batch, accumulating) */
	int accumulate;                  /* micro-batches a step (plan.h's
	                                    ts_plan_build_accumulate; 0: 1); the staged
	                                    inputs and targets hold all of them */
	/* an evaluation (ts_plan_build_eval): forward and loss only, opt is not
	 * used, nothing is updated; with outputs, role TS_ROLE_OUTPUT is bound
	 * to memory of [batch, d_model] float32 in outputs_kind */
	bool evaluate;
	bool outputs;
	enum ts_memory_kind outputs_kind;
	/* an evaluation's inference choices (plan.h's ts_eval_spec): the
	 * logits only, no targets staged (no loss in the report); a GPT's
	 * windows' last positions only; its tokens per window (0: context) */
	bool no_targets;
	bool last;
	int window;
	/* data parallel: replicas > 1 devices (devs[0] == dev), each running the
	 * step on `batch` rows of its own (a step, not an evaluation) */
	int replicas;
	struct ts_device *devs[TS_PLAN_REPLICAS_MAX];
	bool shard_state;                /* ZeRO-1 (plan.h's ts_plan_build_zero): each
	                                    replica's optimizer state its slice */
	bool shard_grads;                /* ZeRO-2 (ts_plan_build_zero2): and its part of
	                                    the reduced gradients; with shard_state */
};

/* Where a role's batch comes from: memory of `bytes` holding rows of
 * row_bytes, on src_dev in src_kind (any device, any memory kind). */
struct ts_session_source {
	const void *mem;                 /* borrowed; alive until the session is freed */
	uint64_t bytes;
	uint64_t row_bytes;
	struct ts_device *src_dev;
	enum ts_memory_kind src_kind;
	const uint64_t *rows;            /* normalised rows (formats/index.h), borrowed; */
	size_t nrows;                    /* NULL: all of it, in order */
};

/* What the steps did, summed over them (peaks: the largest). */
struct ts_session_report {
	uint64_t steps;                  /* steps that succeeded */
	float *losses;                   /* one per step that succeeded (owned by the session) */
	float *grad_norms;               /* likewise: the gradients' global norm before
	                                    clipping, NaN where the plan computes none */
	float *learning_rates;           /* likewise: the rate its update used (NaN for
	                                    an evaluation or optimizer none) */
	uint64_t measured_temp_peak, measured_host_temp_peak;
	uint64_t h2d_bytes, d2h_bytes;   /* the steps' and the staging's */
	uint64_t staged_h2d_bytes;       /* of them, staging the batch from host memory */
	uint64_t spare_bytes;            /* device memory of the next batches (hooks' batch) */
	double wall_s, compute_s, copy_wait_s;   /* replicas: the slowest's, summed over steps */
	double replica_compute_s[TS_PLAN_REPLICAS_MAX];   /* each replica's, summed */
	double replica_comm_s[TS_PLAN_REPLICAS_MAX];      /* each replica's time in
	                                                     collectives, summed */
	double replica_comm_wait_s[TS_PLAN_REPLICAS_MAX]; /* each replica's compute
	                                                     queue waiting for them */
	uint64_t allreduce_bytes;        /* all-reduced on each device, summed over steps */
};

struct ts_session_hooks {
	/* True to stop before the next step (CANCELLED). */
	bool (*cancelled)(void *arg);
	/* Before each step: ts_session_set_next for every versioned role. */
	ts_status (*prepare)(void *arg, struct ts_session *s, struct ts_error *err);
	/* After each step that succeeded, with its loss: the versioned roles'
	 * next memory holds their update; publish it. Must not fail for memory
	 * (prepare what publishing needs). A failure stops the run. */
	ts_status (*publish)(void *arg, struct ts_session *s, float loss, struct ts_error *err);
	/* Data-driven runs (optional): the source of the batch of the run's
	 * step n for role (TS_ROLE_INPUT, then TS_ROLE_TARGET when staged; rows
	 * borrowed until the next call). Step 0's batch is the one staged with
	 * ts_session_stage; each later one is staged into a second buffer of
	 * the session's (report's spare_bytes) while the step before computes. */
	ts_status (*batch)(void *arg, uint64_t n, enum ts_pbuf_role role,
	                   struct ts_session_source *src, struct ts_error *err);
};

/*
 * Plans the step and makes the kernels and queues on cfg->dev.
 * INVALID_ARGUMENT for a model, batch or policy the planner refuses;
 * RESOURCE_EXHAUSTED when out of memory. New session in *out.
 */
ts_status ts_session_new(const struct ts_session_config *cfg, struct ts_session **out,
                         struct ts_error *err);
void ts_session_free(struct ts_session *s);

/* The plan (borrowed, as long as s). */
const struct ts_plan *ts_session_plan(const struct ts_session *s);

/* Whether the plan has a buffer of role that the caller binds (an
 * argument or output), and whether the steps update it into new memory. */
bool ts_session_has_role(const struct ts_session *s, enum ts_pbuf_role role);
bool ts_session_versioned(const struct ts_session *s, enum ts_pbuf_role role);

/* The replicas the steps run on (1: one device). */
int ts_session_replicas(const struct ts_session *s);

/* The bytes and memory kind the plan wants for role (false: no such slot). */
bool ts_session_slot(const struct ts_session *s, enum ts_pbuf_role role, uint64_t *bytes,
                     enum ts_memory_kind *kind);

/*
 * Binds role's memory (borrowed: the caller keeps it alive and unchanged by
 * others while the session runs). FAILED_PRECONDITION ("BAD_BINDING",
 * naming the role) when its size or memory kind is not the plan's;
 * INVALID_ARGUMENT for a role the plan does not bind.
 */
ts_status ts_session_bind(struct ts_session *s, enum ts_pbuf_role role, void *mem,
                          uint64_t bytes, enum ts_memory_kind kind, struct ts_error *err);
/* The same for replica k (memory of its device); INVALID_ARGUMENT for a
 * replica the session does not have. */
ts_status ts_session_bind_replica(struct ts_session *s, int replica, enum ts_pbuf_role role,
                                  void *mem, uint64_t bytes, enum ts_memory_kind kind,
                                  struct ts_error *err);

/*
 * Stages role (TS_ROLE_INPUT or TS_ROLE_TARGET) from src: the memory itself
 * when it already is the plan's (all rows, in the device memory of the
 * session's device), else a copy of the selected rows into device memory the
 * session allocates, counted in the report (h2d when src is host memory).
 * RESOURCE_EXHAUSTED when the device cannot hold it; FAILED_PRECONDITION
 * when the staged size is not the plan's.
 */
ts_status ts_session_stage(struct ts_session *s, enum ts_pbuf_role role,
                           const struct ts_session_source *src, struct ts_error *err);

/* Drops what ts_session_stage staged for role (a copy it made is freed),
 * so the next run can stage another batch of the same size: an inference
 * loop's next tokens. */
void ts_session_unstage(struct ts_session *s, enum ts_pbuf_role role);

/* Gives a versioned role the memory its next update lands in (borrowed, of
 * the role's size and kind). */
ts_status ts_session_set_next(struct ts_session *s, enum ts_pbuf_role role, void *mem,
                              struct ts_error *err);
ts_status ts_session_set_next_replica(struct ts_session *s, int replica,
                                      enum ts_pbuf_role role, void *mem, struct ts_error *err);

/*
 * Runs `steps` steps, the first with Adam's t = first_t: before each,
 * hooks->cancelled and hooks->prepare; after each that succeeded,
 * hooks->publish. Stops at the first failure, which leaves the arguments as
 * the last published step left them. The report (borrowed from s) counts
 * the steps that succeeded, also on failure.
 */
ts_status ts_session_run(struct ts_session *s, uint64_t steps, uint64_t first_t,
                         const struct ts_session_hooks *hooks, void *arg,
                         struct ts_error *err);

const struct ts_session_report *ts_session_report(const struct ts_session *s);

#endif
