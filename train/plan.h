/*
 * plan.h - the step planner: (model, batch, policy) -> a buffer schedule,
 * and the memory analysis read from it before anything runs.
 *
 * A schedule is the exact list of what a training step does on its device,
 * in order: allocate and free device buffers, copy between host and device
 * (on the copy queues), wait for a copy, and run kernels (on the compute
 * queue). The executor performs these actions and nothing else, so the
 * peak device memory it measures equals the peak the plan predicts.
 *
 * Policy, per model and per call:
 *   params      device | pinned_host: on the host, each layer's w1/w2 are
 *               copied in before use (forward and backward), and with
 *               prefetch_depth 1 the next layer's are already on the way
 *               (and the last layer's stay from the forward into the
 *               backward pass: copied in once, not twice, in a step of a
 *               model without tokens);
 *   opt_state   device | pinned_host: Adam's mu/nu streamed in per layer,
 *               updated, streamed out;
 *   activations the layer input x and hidden pre-activation h of every
 *               layer are saved on the device, offloaded to pinned_host and
 *               fetched back for the backward pass, or recomputed (x from the
 *               nearest earlier saved or offloaded input, h from x); a
 *               GPT's block intermediates also one by one, by the names of
 *               gpt.h's ts_gpt_act (plan_gpt.c).
 *
 * Analysis (XLA's memory_analysis names): argument = device-resident inputs
 * of the step (params and optimizer state on the device, the batch input
 * and target); output = gradients when the optimizer is none; alias = the
 * arguments the step updates in place (params and optimizer state on the
 * device, with an optimizer); temp = the peak of everything else on the
 * device; host_* = the same on pinned_host; peak_device_bytes = argument +
 * output + temp (aliases are not counted twice).
 *
 * Token models (mlp.h): the input and target are n ids (the plan's batch is
 * one row per token); the embedding table and the projection are parameters
 * like w1 and w2 (on the device or streamed whole from pinned_host, with
 * their Adam state), their gradients temps or outputs like w1's. The first
 * layer's input x_0 is a temp, the gathered rows, kept until the backward
 * pass has scattered its gradient into the table's.
 *
 * Mixed precision (mlp.h, compute bfloat16 or float16): the parameters,
 * their gradients and the optimizer state stay float32 (master weights),
 * and so does all element-wise math (activations, loss, update); every
 * GEMM of the step and of an evaluation - forward, both backward products,
 * the token projection's - takes its two operands rounded to the compute
 * dtype (round to nearest even, formats/convert.h) and accumulates in
 * float32 into its float32 result. In the schedule it first rounds them
 * into two device temps of role TS_ROLE_LOWP, 2 bytes an element
 * (op(A) [M, K] and op(B) [K, N] as stored), runs on them with float32
 * accumulation into its float32 result, and frees them: ROUND, ROUND,
 * GEMM_LP. So the rounded copies are temps like any other, placed in the
 * device arena and counted in temp_size_in_bytes, live for one product
 * each. Parameters, gradients, optimizer state and every element-wise
 * kernel stay float32. The CPU kernels widen the two rounded copies back to
 * float32 (exactly) and multiply them with sgemm: exact, since the product
 * of two bfloat16 (or float16) values is exact in float32, so only the
 * accumulation order differs from a bf16 GEMM; CUDA runs cublasGemmEx on
 * them (CUDA_R_16BF or CUDA_R_16F operands, CUDA_R_32F result,
 * CUBLAS_COMPUTE_32F). A GPT's batched attention products (q k^T, p v and
 * their four backward products) are the same: their two operands, every
 * batch of each, rounded into two LOWP temps (ROUND, ROUND,
 * GEMM_BATCHED_LP), on CPU widened and multiplied batch by batch with
 * sgemm, on CUDA cublasGemmStridedBatchedEx; the softmax, LayerNorm, GELU,
 * the attention scale and the cross-entropy stay float32.
 *
 * Atomicity: a step either updates every weight or leaves every array as it
 * was. Temps live at planner-assigned offsets in one arena per memory kind
 * (temp_size_in_bytes is the device arena, host_temp_size_in_bytes the
 * pinned one, each taken whole before the first action). An argument the
 * step updates on pinned_host is `versioned`: its update is copied out to
 * new memory of its size, published only when the step succeeded
 * (host_version_size_in_bytes). A device argument is updated in place by
 * kernels (an alias); when a copy, which can fail, follows its first update,
 * it is `journaled`: copied to pinned_host before the first update and
 * copied back if the step fails after it (host_journal_size_in_bytes; its
 * bytes move once each way, not counted in h2d/d2h_bytes).
 *
 * Thread-safety: pure functions over caller-owned values.
 */
#ifndef TS_PLAN_H
#define TS_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "train/gpt.h"
#include "train/mlp.h"

struct ts_policy {
	enum ts_memory_kind params;       /* TS_MEM_DEVICE or TS_MEM_PINNED_HOST */
	enum ts_memory_kind opt_state;
	bool save_x, save_h;
	bool offload_x, offload_h;
	/* a GPT block's intermediates named one by one: bits 1u << enum
	 * ts_gpt_act (gpt.h); save_h / offload_h stand for TS_GPT_ACTS_H */
	unsigned save_acts, offload_acts;
	int prefetch_depth;               /* 0 or 1 */
};

/* Checks a policy: memory kinds device or pinned_host, a residual not both
 * saved and offloaded, by its name or through "h" ("names must be
 * exclusive", as JAX's ValueError), prefetch_depth 0 or 1. */
ts_status ts_policy_check(const struct ts_policy *p, struct ts_error *err);

/* Checks that a policy names only activations model m has: a GPT block's
 * intermediates one by one only for a GPT. INVALID_ARGUMENT (BAD_POLICY)
 * naming the first other. */
ts_status ts_policy_check_names(const struct ts_policy *p, const struct ts_mlp *m,
                                struct ts_error *err);

enum ts_pbuf_class { TS_PB_ARGUMENT = 0, TS_PB_OUTPUT, TS_PB_TEMP };

/* A buffer of the schedule. Arguments name catalog arrays (role says which);
 * temps are allocated and freed by the schedule. */
enum ts_pbuf_role {
	TS_ROLE_W1 = 0, TS_ROLE_W2, TS_ROLE_MU_W1, TS_ROLE_MU_W2, TS_ROLE_NU_W1, TS_ROLE_NU_W2,
	TS_ROLE_INPUT, TS_ROLE_TARGET, TS_ROLE_GRAD_W1, TS_ROLE_GRAD_W2,
	TS_ROLE_X, TS_ROLE_H, TS_ROLE_A, TS_ROLE_G, TS_ROLE_GX, TS_ROLE_LOSS, TS_ROLE_NORM,
	TS_ROLE_OUTPUT,                  /* an evaluation's outputs x_L [B, d] */
	/* token models (mlp.h): the embedding table [vocab, d] and the output
	 * projection [d, vocab], their Adam state and gradients, the logits */
	TS_ROLE_EMBED, TS_ROLE_PROJ, TS_ROLE_MU_EMBED, TS_ROLE_MU_PROJ, TS_ROLE_NU_EMBED,
	TS_ROLE_NU_PROJ, TS_ROLE_GRAD_EMBED, TS_ROLE_GRAD_PROJ, TS_ROLE_LOGITS,
	TS_ROLE_LOWP,                    /* a GEMM operand rounded to the compute dtype */
	/* the GPT kind (gpt.h): each parameter tensor, then its Adam mu and nu,
	 * then its gradient, in the order of TS_GPT_PARAMS */
#define TS_GPT_ROLE_P(id, name) TS_ROLE_GPT_##id,
#define TS_GPT_ROLE_MU(id, name) TS_ROLE_MU_GPT_##id,
#define TS_GPT_ROLE_NU(id, name) TS_ROLE_NU_GPT_##id,
#define TS_GPT_ROLE_G(id, name) TS_ROLE_GRAD_GPT_##id,
	TS_GPT_PARAMS(TS_GPT_ROLE_P)
	TS_GPT_PARAMS(TS_GPT_ROLE_MU)
	TS_GPT_PARAMS(TS_GPT_ROLE_NU)
	TS_GPT_PARAMS(TS_GPT_ROLE_G)
#undef TS_GPT_ROLE_P
#undef TS_GPT_ROLE_MU
#undef TS_GPT_ROLE_NU
#undef TS_GPT_ROLE_G
	TS_ROLE_GPT_ACT,                 /* a GPT block's activations (gpt.h) */
	TS_ROLE_COUNT
};

/* The GPT's parameter tensors: of kind (0 the parameter, 1 Adam's mu, 2
 * nu, 3 the gradient) the role of tensor t (0 .. TS_GPT_NPARAMS-1), and
 * back: whether r is one and which. */
static inline enum ts_pbuf_role ts_gpt_role(int kind, int t)
{
	return (enum ts_pbuf_role)(TS_ROLE_GPT_WTE + kind * TS_GPT_NPARAMS + t);
}

static inline bool ts_gpt_role_of(enum ts_pbuf_role r, int *kind, int *t)
{
	int i = (int)r - (int)TS_ROLE_GPT_WTE;

	if (i < 0 || i >= 4 * TS_GPT_NPARAMS)
		return false;
	*kind = i / TS_GPT_NPARAMS;
	*t = i % TS_GPT_NPARAMS;
	return true;
}

/* A parameter (w1, w2, embed, proj); optimizer state (mu, nu of one); either:
 * the arguments a step with an optimizer updates. */
static inline bool ts_role_param(enum ts_pbuf_role r)
{
	int kind, t;

	return r == TS_ROLE_W1 || r == TS_ROLE_W2 || r == TS_ROLE_EMBED || r == TS_ROLE_PROJ ||
	       (ts_gpt_role_of(r, &kind, &t) && kind == 0);
}

static inline bool ts_role_opt_state(enum ts_pbuf_role r)
{
	int kind, t;

	return (r >= TS_ROLE_MU_W1 && r <= TS_ROLE_NU_W2) ||
	       (r >= TS_ROLE_MU_EMBED && r <= TS_ROLE_NU_PROJ) ||
	       (ts_gpt_role_of(r, &kind, &t) && (kind == 1 || kind == 2));
}

static inline bool ts_role_state(enum ts_pbuf_role r)
{
	return ts_role_param(r) || ts_role_opt_state(r);
}

struct ts_pbuf {
	enum ts_pbuf_role role;
	enum ts_pbuf_class cls;
	enum ts_memory_kind kind;        /* device or pinned_host */
	int layer;                       /* -1 for whole-model buffers */
	uint64_t bytes;
	uint64_t offset;                 /* temps: where in the arena of its kind;
	                                    journaled arguments: where in the journal */
	bool versioned;                  /* host arguments: updated into new memory */
	bool journaled;                  /* device arguments: saved before the update */
};

enum ts_pop {
	TS_P_ALLOC = 0,   /* a: buffer */
	TS_P_FREE,        /* a: buffer (after the work using it) */
	TS_P_COPY,        /* a <- b (+offset into the larger of the two), bytes; copy queue */
	TS_P_WAIT,        /* compute waits for the last copy into a */
	TS_P_GEMM,        /* c (+coff) = op(a (+aoff)) @ op(b (+boff)) (+ beta c); M N K ta tb */
	TS_P_ACT_FWD,     /* b = act(a), n */
	TS_P_ACT_BWD,     /* c = b * act'(a), n */
	TS_P_ADD,         /* b += a, n */
	TS_P_LOSS,        /* c: loss scalar, d: grad, a: output, b: target (or -1), n */
	TS_P_SUMSQ,       /* b[0] += sum(a^2) */
	TS_P_UPDATE,      /* param a (+aoff) with grad b (+boff), mu c, nu d (+coff), norm e, n */
	TS_P_FILL,        /* a = 0 */
	TS_P_PHASE,       /* a label for the timeline */
	/* token models: vocab, d and the ids' width are the plan's mlp's */
	TS_P_EMBED_FWD,   /* c [n, d] = rows of table a (+aoff) at ids b, n rows */
	TS_P_EMBED_BWD,   /* c (+coff) [vocab, d] = scatter-add of a [n, d] at ids b */
	TS_P_XENT,        /* c: loss (n + 1 floats), d: grad, a: logits [n, vocab], b: target ids */
	/* mixed precision: the mlp's compute dtype */
	TS_P_ROUND,       /* b (16-bit) = a (+aoff) rounded, n elements */
	TS_P_GEMM_LP,     /* as GEMM, with a and b 16-bit copies (offset 0), c float32 */
	/* the GPT kind (kernels.h's transformer blocks); heads and context are
	 * the plan's mlp's */
	TS_P_LN_FWD,      /* d [n, N] = LayerNorm of a [n, N] with g b (+boff), bias c
	                     (+coff); e [n, 2] its statistics */
	TS_P_LN_BWD,      /* its gradient: e [n, N] = dx of dy d at x a, g b (+boff),
	                     stats c; dg f (+foff), db g (+goff), overwritten */
	TS_P_ADD_ROWS,    /* b [n, N] += a (+aoff) [K, N] by row period K */
	TS_P_SUM_ROWS,    /* b (+boff) [K, N] = a [n, N] summed by row period K */
	TS_P_HEADS,       /* b = a from [M, N, K, heads, hd] to [K, M, heads, N, hd]
	                     (ta: back) */
	TS_P_GEMM_BATCHED,/* n products of GEMM's shapes, dense batches back to back */
	TS_P_SOFTMAX_FWD, /* b = causal softmax of a, n blocks of N x N */
	TS_P_SOFTMAX_BWD, /* c = its gradient at probabilities a, upstream b */
	TS_P_GEMM_BATCHED_LP, /* as GEMM_BATCHED, with a and b 16-bit copies of its
	                         n dense batches (offset 0), c float32 */
	/* data parallel (ts_plan_build_replicated) */
	TS_P_ALLREDUCE,   /* a (+aoff), n floats = their sum over the replicas (the
	                     executor's communicator, on the compute queue) */
	TS_P_ALLGATHER,   /* a (+aoff), n * replicas floats: each replica's n at
	                     aoff + rank * n gathered into every replica's */
	TS_P_REDUCE_SCATTER, /* b (+boff), n floats = the sum over the replicas of
	                        a (+aoff + rank * n floats), a holding n * replicas
	                        (ZeRO-2: a gradient into the replica's part) */
};

struct ts_paction {
	enum ts_pop op;
	int a, b, c, d, e;               /* buffer indices, -1 unused (e: UPDATE's norm) */
	int f, g;                        /* LN_BWD's parameter gradients, -1 unused */
	uint64_t aoff, boff, coff;       /* byte offsets into a, b, c */
	uint64_t foff, goff;             /* and into f, g */
	uint64_t bytes;                  /* COPY */
	int M, N, K;
	bool ta, tb;
	float beta;
	bool no_decay;                   /* UPDATE: without adamw's weight decay */
	bool rank_slice;                 /* UPDATE of a sharded optimizer state: the n
	                                    elements of a and b at aoff / boff + rank * n
	                                    floats (the executor's replica), c and d the
	                                    replica's own slice at coff; with the plan's
	                                    shard_grads b is the replica's own part at
	                                    boff too */
	uint64_t n;                      /* elements */
	int layer;
	const char *phase;               /* static: "forward", "backward", "update", ... */
};

struct ts_plan {
	struct ts_mlp mlp;
	struct ts_optimizer opt;
	struct ts_policy policy;
	int batch;                       /* rows of one micro-batch (of the step, without
	                                    accumulation) */
	int accumulate;                  /* micro-batches per step, >= 1 (ts_plan_build_accumulate) */
	int replicas;                    /* devices running the step together, >= 1
	                                    (ts_plan_build_replicated) */
	bool shard_state;                /* ZeRO-1: each replica keeps 1/replicas of the
	                                    optimizer state (ts_plan_build_zero) */
	bool shard_grads;                /* ZeRO-2: and of the reduced gradients
	                                    (ts_plan_build_zero2); implies shard_state */
	bool norm_after;                 /* fused updates: the global norm's temp (role
	                                    NORM, the first temp allocated and the last
	                                    freed) is read back after the step */
	bool evaluate;                   /* forward and loss only (ts_plan_build_eval) */
	bool no_targets;                 /* an evaluation of the logits only (ts_eval_spec) */
	bool last;                       /* a GPT's outputs: each window's last position */
	int window;                      /* a GPT's tokens per window (its context, or less) */
	int nbufs, nactions;
	struct ts_pbuf *bufs;            /* owned */
	struct ts_paction *actions;      /* owned */
	/* the analysis */
	uint64_t argument_size_in_bytes, output_size_in_bytes, alias_size_in_bytes;
	uint64_t temp_size_in_bytes;
	uint64_t host_argument_size_in_bytes, host_output_size_in_bytes;
	uint64_t host_alias_size_in_bytes, host_temp_size_in_bytes;
	uint64_t host_version_size_in_bytes, host_journal_size_in_bytes;
	uint64_t peak_device_bytes;
	uint64_t h2d_bytes, d2h_bytes;
	uint64_t all_reduce_bytes;       /* data parallel: each device's bytes reduced
	                                    (TS_P_ALLREDUCE's n, TS_P_REDUCE_SCATTER's
	                                    n * replicas floats) */
	int npoints;                     /* the timeline: live device bytes after each change */
	struct {
		const char *phase;
		int layer;
		uint64_t live;
	} *points;                       /* owned */
};

/*
 * Plans one step of mlp/opt on a batch of `batch` rows under policy.
 * INVALID_ARGUMENT for a bad model, batch or policy; RESOURCE_EXHAUSTED
 * when out of memory. Fills *out (ts_plan_release frees it).
 */
ts_status ts_plan_build(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                        const struct ts_policy *policy, struct ts_plan *out,
                        struct ts_error *err);
void ts_plan_release(struct ts_plan *p);

/*
 * Gradient accumulation: plans one step that runs the forward and backward
 * pass of `accumulate` micro-batches of `batch` rows each, then one update
 * (optax.MultiSteps, nanoGPT's gradient_accumulation_steps). The input and
 * target arguments hold accumulate * batch rows; micro-batch j reads rows
 * j * batch onwards. Micro-batch 0's gradients land in the whole gradients
 * (the accumulators: temps, or the outputs with optimizer none); each later
 * one's in whole temps of their own, added into the accumulators (TS_P_ADD,
 * in the parameters' order) and freed; then the accumulators are scaled by
 * 1 / accumulate (a TS_P_GEMM with K = 0: c = beta c), so the gradient is
 * the mean of the micro-batches' mean-loss gradients. The update is never
 * fused (it needs every micro-batch's gradient), and the global norm is
 * always computed (clipping or not) and read back before the first update.
 * The executor reads every micro-batch's loss back and reports their mean.
 * accumulate 1 is ts_plan_build. INVALID_ARGUMENT (BAD_ACCUMULATE) for
 * accumulate < 1 or above TS_PLAN_ACCUMULATE_MAX; otherwise as
 * ts_plan_build.
 */
#define TS_PLAN_ACCUMULATE_MAX 1024
ts_status ts_plan_build_accumulate(const struct ts_mlp *mlp, const struct ts_optimizer *opt,
                                   int batch, int accumulate, const struct ts_policy *policy,
                                   struct ts_plan *out, struct ts_error *err);

/*
 * Data parallel: plans one step that `replicas` devices run together
 * (exec.h's ts_exec_run_replicas), each on its own `batch` rows (times
 * `accumulate` micro-batches) with its own replica of every argument: the
 * same schedule on every device. Each gradient is summed over the
 * replicas (TS_P_ALLREDUCE): with one micro-batch, during the backward pass
 * as it is made, in buckets (a gradient's adjacent layers' slices, all-
 * reduced once they reach TS_PLAN_BUCKET_BYTES, the rest after the
 * backward pass; the executor runs them on each device's communication
 * queue, beside the backward pass); accumulating, after the backward pass
 * (the accumulators: whole buffers, in the parameters' order). Then each
 * is scaled by 1 / (accumulate * replicas), so every replica holds the mean gradient of the whole batch
 * of replicas * accumulate * batch rows; then the global norm (always
 * computed and read back, as accumulating) and the same update on every
 * replica, which therefore stay bit-identical. The update is never fused.
 * The analysis is each device's: the same on every one. replicas 1 is
 * ts_plan_build_accumulate. INVALID_ARGUMENT (BAD_REPLICAS) for replicas
 * < 1 or above TS_PLAN_REPLICAS_MAX; otherwise as ts_plan_build_accumulate.
 */
#define TS_PLAN_REPLICAS_MAX 64
#define TS_PLAN_BUCKET_BYTES (4u << 20)     /* an early all-reduce's least size */
ts_status ts_plan_build_replicated(const struct ts_mlp *mlp, const struct ts_optimizer *opt,
                                   int batch, int accumulate, int replicas,
                                   const struct ts_policy *policy, struct ts_plan *out,
                                   struct ts_error *err);

/*
 * ZeRO-1 (DeepSpeed's stage 1): ts_plan_build_replicated, with each replica
 * keeping only its 1/replicas slice of Adam's state. Every update of n
 * elements (a layer of a parameter, or a whole one) is split in `replicas`
 * consecutive parts; replica r updates part r of its parameter from part r
 * of the all-reduced gradient with its own mu and nu (TS_P_UPDATE with
 * rank_slice), then the parts are gathered into every replica's parameter
 * (TS_P_ALLGATHER), so the replicas stay bit-identical and the result is
 * the replicated update's, bit for bit. The state arguments are each
 * replica's slices, laid out update after update (a parameter [L, a, ...]
 * updated layer by layer: [L, a / replicas, ...]; a whole one [a, ...]:
 * [a / replicas, ...]), so the analysis' argument bytes drop by that much.
 * INVALID_ARGUMENT (BAD_SHARDING) unless the optimizer is Adam, params and
 * optimizer state are on the device, and every update's size divides by
 * replicas (naming the first that does not).
 */
ts_status ts_plan_build_zero(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                             int accumulate, int replicas, const struct ts_policy *policy,
                             struct ts_plan *out, struct ts_error *err);

/*
 * ZeRO-2 (DeepSpeed's stage 2): ts_plan_build_zero, with each replica
 * keeping only its 1/replicas part of the reduced gradients too. During
 * the backward pass every gradient of an update (a layer of a parameter,
 * or a whole one) is made in a temp of its own, which is reduce-scattered
 * (TS_P_REDUCE_SCATTER) as soon as the backward pass has made it -
 * replica r receiving part r of the sum, the part its rank_slice update
 * reads - and freed at once: the whole gradients never exist together,
 * only one update's at a time, beside the replica's parts of all of them
 * (a temp per parameter, 1/replicas of its gradient, allocated at its
 * first part). With accumulation every micro-batch's gradients are
 * reduce-scattered (micro-batch 0's into the parts, a later one's into a
 * temp added into them: the sum runs over the replicas, then the
 * micro-batches). The parts are scaled by 1 / (accumulate * replicas);
 * the global norm is each replica's sum of its parts' squares, then those
 * sums added over the replicas (a TS_P_ALLREDUCE of one float, in rank
 * order on sim, the same bits on every replica). The update and the
 * gather are ZeRO-1's. Errors as ts_plan_build_zero.
 */
ts_status ts_plan_build_zero2(const struct ts_mlp *mlp, const struct ts_optimizer *opt,
                              int batch, int accumulate, int replicas,
                              const struct ts_policy *policy, struct ts_plan *out,
                              struct ts_error *err);

/*
 * Plans an evaluation of mlp on a batch of `batch` rows: the forward pass
 * and the loss, nothing else - no gradient, no backward, no update, and no
 * activation kept past the layer that reads it (policy's save/offload names
 * do not apply; params and prefetch_depth do: params on pinned_host are
 * streamed in per layer). The loss is computed by the step's own kernel, so
 * it equals bit for bit the loss a step reports before its update. With
 * `outputs`, the last layer's activations x_L [batch, d] are written to an
 * OUTPUT buffer of role TS_ROLE_OUTPUT in outputs_kind (device: the last
 * layer writes it directly; pinned_host: copied out of a device temp). The
 * plan's optimizer is none and no argument is updated (no alias, version or
 * journal). The loss kernel is the step's, gradient included: that gradient
 * [batch, d] lands in a temp freed right after it (counted in the analysis;
 * below the forward's peak unless the model has one layer). Errors as
 * ts_plan_build.
 *
 * A token model's evaluation gathers x_0 from the table at the input ids,
 * runs the layers, projects to logits [batch, vocab] (x_L itself without a
 * projection) and takes the step's cross-entropy against the target ids;
 * its OUTPUT is the logits (the projection writes it directly when on the
 * device). The table and projection are arguments where params are
 * (streamed whole from pinned_host like the step's).
 */
ts_status ts_plan_build_eval(const struct ts_mlp *mlp, int batch, const struct ts_policy *policy,
                             bool outputs, enum ts_memory_kind outputs_kind,
                             struct ts_plan *out, struct ts_error *err);

/*
 * What an inference evaluation computes, beyond ts_plan_build_eval's
 * arguments (a zeroed spec is ts_plan_build_eval's evaluation):
 *   no_targets  a token model's or GPT's logits only: no TS_ROLE_TARGET
 *               argument, no cross-entropy, no loss read back (the
 *               outputs are the one result, so outputs must be set);
 *   last        a GPT's outputs are each window's last position's logits,
 *               [batch / window, vocab]: the final LayerNorm runs on every
 *               row, the tied head only on the last row of each window (one
 *               product [1, d] x [d, V] a window, into the outputs or a
 *               device temp copied out), so neither the head's compute nor
 *               the [batch, vocab] logits temp grows with the window;
 *   window      a GPT's tokens per window, 1..context (0: context): the
 *               forward pass of windows shorter than the context, positions
 *               0..window-1 (the first `window` rows of wpe; wpe stays the
 *               whole [context, d] argument), batch a multiple of it.
 */
struct ts_eval_spec {
	bool outputs;
	enum ts_memory_kind outputs_kind;
	bool no_targets;
	bool last;
	int window;
};

/* Plans an evaluation as ts_plan_build_eval, with spec's choices above.
 * INVALID_ARGUMENT (BAD_EVALUATION) for a choice the model does not
 * have: last or window on a model that is no GPT, no_targets on one
 * without tokens or without outputs, a window outside 1..context. */
ts_status ts_plan_build_eval_spec(const struct ts_mlp *mlp, int batch,
                                  const struct ts_policy *policy,
                                  const struct ts_eval_spec *spec, struct ts_plan *out,
                                  struct ts_error *err);

/* Bytes between temps in an arena: every temp starts at a multiple. */
#define TS_PLAN_ALIGN 256u

#endif
