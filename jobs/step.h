/*
 * step.h - the runs of a model: training steps and evaluations, each an
 * operation that joins the model's catalog arrays to a training session
 * (train/session.h).
 *
 * Holds. A run holds the model's arrays it reads or writes (by identity,
 * in the catalog: ts_catalog_hold) from submission to completion: a step
 * its parameters and optimizer state, an evaluation its parameters. Every
 * other writer of them, and every other run of the model, is refused
 * meanwhile (409 ABORTED naming the run).
 *
 * Operands. Inputs (and targets) are arrays by name, or rows of them; they
 * are read at the run's start, as current then. The run goes where the
 * parameters are: committed arrays decide the device, uncommitted operands
 * given by name follow (counted as implicit transfers), operands given as
 * rows move only those rows. A data-driven step instead draws each step's
 * batch from whole datasets (batch size, sequential or shuffled order per
 * epoch from a seed, a start position), staging the next batch while the
 * current one computes. A token model's run may instead read windows of
 * one token stream (struct ts_job_windows): inputs and targets both from
 * the one array, only each window's tokens staged, the next step's while
 * the current one computes.
 *
 * Versions. Each step is atomic: one that fails leaves every array as the
 * step before left it, and the model's step count (Adam's t) advances per
 * step that succeeded. Offloaded arrays are updated into private memory
 * (two unpublished versions per array, taking turns), device ones in
 * place. A run publishes once, as it ends (also when it failed or was
 * cancelled after some steps): a new version (new ETag) of every array its
 * steps updated. An evaluation writes nothing of the model; it publishes
 * only its outputs array, when asked and when it succeeded.
 *
 * Results. What the steps did is the operation's result; a run that stopped
 * early (cancelled between steps, or failed after starting) leaves the same
 * object as the partial result: the losses of the steps that ran, their
 * count, the model's step count and, for a data-driven run, the position
 * to continue from. While a step runs, the same object, without the
 * analysis, is its partial result, renewed after every step.
 *
 * Thread-safety: submission is safe on any thread; the run happens on an
 * operation worker and never calls into handlers/.
 */
#ifndef TS_JOBS_STEP_H
#define TS_JOBS_STEP_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/name.h"
#include "common/status.h"
#include "device/device.h"
#include "jobs/env.h"
#include "ops/operation.h"
#include "train/model.h"

/* An operand: an array by name and, optionally, rows of it. */
struct ts_job_operand {
	const char *array;                 /* borrowed; NULL: none */
	json_t *rows;                      /* borrowed; rows as :gather takes them, NULL: all */
};

/* A data-driven step's batches: step i of the call draws rows start +
 * i * size onwards, wrapping into the next epoch (each epoch its own order
 * from seed when shuffled). */
struct ts_job_batches {
	bool on;
	bool shuffle;
	uint64_t size, start, seed;
};

/* Windows of a token stream: one uint16 or int32 array of any shape, read
 * as a flat stream of n tokens. Step s of the call (0-based) takes windows
 * q = start + s * size + b, b = 0..size-1; window q is the context + 1
 * tokens at offset o_q, inputs its first context, targets its last context:
 * sequential, o_q = (q mod W) * context with W = (n - 1) / context windows
 * an epoch; random, o_q = splitmix64(seed, q) mod (n - context). No window
 * crosses the end of the stream. */
struct ts_job_windows {
	bool on;
	bool random;
	char array[TS_NAME_MAX + 1];
	uint64_t context, size, seed, start;
};

/* Where an evaluation's outputs go: a new array name, on dev (NULL: where
 * the evaluation runs) in kind (device or pinned_host). */
struct ts_job_outputs {
	bool outputs;
	char name[TS_NAME_MAX + 1];
	struct ts_device *dev;
	enum ts_memory_kind kind;
};

/* A run's request, as the caller parsed it (copied by the submit). */
struct ts_job_run {
	struct ts_model model;             /* a ready model, copied out of the registry */
	struct ts_policy policy;           /* activations and prefetch (ts_job_model_policy) */
	uint64_t steps;                    /* 1..1000000; evaluations: 1 */
	struct ts_job_operand inputs;
	struct ts_job_operand targets;     /* array NULL: none */
	struct ts_job_batches batches;     /* steps only */
	struct ts_job_windows windows;     /* instead of inputs and targets */
	int accumulate;                    /* steps only: micro-batches a step (0, 1: none;
	                                      train/plan.h's ts_plan_build_accumulate): the
	                                      inputs' rows split in that many, or that many
	                                      batches (windows) drawn a step */
	struct ts_job_outputs outputs;     /* evaluations only */
	bool last;                         /* evaluations of a GPT: outputs are each window's
	                                      last position's logits [B, V] */
};

/*
 * Submits run->steps training steps of run->model as an operation of kind
 * "step" (unit "steps", target the model's name), holding the model's
 * arrays as current now. FAILED_PRECONDITION when one is missing
 * (ARRAY_NOT_FOUND) or not the model's (ARRAY_NOT_OWNED); UNIMPLEMENTED
 * when sharded; ABORTED when another operation holds one or runs on the
 * model. Every later failure (operands, shapes, memory) is the operation's.
 * run is borrowed (its rows copied); a new reference to the operation in
 * *op.
 */
ts_status ts_job_step_submit(const struct ts_jobs_env *env, const struct ts_job_run *run,
                             struct ts_operation **op, struct ts_error *err);

/*
 * Submits an evaluation of run->model (kind "evaluate", unit "passes"):
 * the loss over the batch and, with run->outputs, the outputs (a token
 * model's logits) published under their name when it succeeded. A token
 * model's (or GPT's) evaluation without targets computes the logits only
 * (no loss; outputs required); a GPT's takes windows [B, T] of 1..context
 * tokens, and with run->last answers each window's last position's
 * logits. Fails as ts_job_step_submit does, holding the parameters only.
 */
ts_status ts_job_eval_submit(const struct ts_jobs_env *env, const struct ts_job_run *run,
                             struct ts_operation **op, struct ts_error *err);

/* The bounds of a generation's request. */
#define TS_GENERATE_MAX_TOKENS 4096
#define TS_GENERATE_PROMPT_MAX 65536

/* A generation's request, as the caller parsed and checked it (copied by
 * the submit). */
struct ts_job_generate {
	struct ts_model model;             /* a ready GPT, copied out of the registry */
	struct ts_policy policy;           /* prefetch (ts_job_model_policy) */
	const int32_t *prompt;             /* borrowed; ids in [0, vocab) */
	size_t nprompt;                    /* 1..TS_GENERATE_PROMPT_MAX */
	uint64_t max_tokens;               /* 1..TS_GENERATE_MAX_TOKENS */
	float temperature;                 /* >= 0; 0: greedy */
	int top_k;                         /* 0..vocab; 0: every id */
	uint64_t seed;
};

/*
 * Submits a generation of req->max_tokens tokens after req->prompt by a
 * GPT (kind "generate", unit "tokens", progress a token at a time): each
 * token is the evaluation of the last min(len, context) tokens of the
 * sequence so far, positions 0.., the logits of its last position only
 * (train/plan.h's ts_eval_spec, where the params are, as :evaluate runs),
 * and the next token from them (train/sample.h: greedy at temperature 0,
 * else sampled from seed). The result: {"model", "tokens" (the generated
 * ids, without the prompt), "prompt_tokens", "device",
 * "predicted_peak_device_bytes", "measured_peak_device_bytes", "time"};
 * while it runs, the tokens so far are its partial result. Holds the
 * parameters as an evaluation does and fails as ts_job_eval_submit does;
 * INVALID_ARGUMENT (BAD_MODEL) for a model that is no GPT.
 */
ts_status ts_job_generate_submit(const struct ts_jobs_env *env,
                                 const struct ts_job_generate *req, struct ts_operation **op,
                                 struct ts_error *err);

/*
 * Whether an evaluation's outputs may be published under their name: not
 * over an array some model owns (FAILED_PRECONDITION ARRAY_OWNED), nor
 * over one an operation holds (ABORTED). Checked at submission and again
 * as the evaluation publishes.
 */
ts_status ts_job_outputs_writable(const struct ts_jobs_env *env,
                                  const struct ts_job_outputs *o, struct ts_error *err);

#endif
