/*
 * plan_int.h - the schedule builder's primitives, for the builders of
 * train/: plan.c (the MLP kinds) and plan_gpt.c (the GPT kind).
 *
 * A builder emits actions in execution order; every device buffer it
 * allocates (ts__pb_temp) it also frees (ts__pb_release), so the live-bytes
 * curve place.c reads from the schedule is the one the executor's
 * allocator will see. The first failure (out of memory) sticks in
 * b->failed and turns every later call into a no-op; ts__pb_finish
 * reports it.
 *
 * Internal to train/. Thread-safety: a builder is one thread's.
 */
#ifndef TS_PLAN_INT_H
#define TS_PLAN_INT_H

#include "train/plan.h"

#define F32 4u        /* bytes of a float32 element */
#define LOWP 2u       /* bytes of a bfloat16 or float16 element */

/* A builder: the plan being built and, for plan.c, its per-layer state. */
struct ts__pb {
	struct ts_plan *p;
	int cap_bufs, cap_actions;
	ts_status failed;
	/* per-layer state */
	int *x;          /* device buffer holding layer l's input, or -1 */
	int *xh;         /* pinned_host copy of x_l, or -1 */
	int *h;          /* device buffer holding h_l, or -1 */
	int *hh;         /* pinned_host copy of h_l, or -1 */
	int *w1, *w2;    /* device buffers of streamed params, or -1 */
	int W1, W2, MU1, MU2, NU1, NU2, IN, TGT, G1, G2;
	/* token models: the table, the projection, their state and gradients */
	int EMB, PRJ, MUE, MUP, NUE, NUP, GE, GP;
	int x0;          /* the gathered first input (a temp), or -1 */
	int norm;        /* fused updates: the global norm's temp, or -1 */
	int micro;       /* the micro-batch being built (0 without accumulation) */
	/* ZeRO-2: each parameter's part of its reduced gradient (an MLP's w1,
	 * w2, embed, proj; a GPT's tensors in order), a temp from its first
	 * part on, or -1 */
	int sg[TS_GPT_NPARAMS > 4 ? TS_GPT_NPARAMS : 4];
	/* Data parallel with whole gradients (ts__pb_reduce_early): per
	 * gradient buffer, the range made and not yet all-reduced (the open
	 * bucket, grown by adjacent ranges) and the floats all-reduced so far;
	 * buf -1: a free entry */
	struct ts__pb_bucket {
		int buf;
		uint64_t off, n, done;        /* bytes; floats; floats */
	} bk[TS_GPT_NPARAMS > 4 ? TS_GPT_NPARAMS : 4];
};


/* A parameter for update_param: its argument and Adam state, the slice
 * updated (offset and bytes), and the roles of its device copies. */
struct ts__pb_param {
	int W, MU, NU;
	uint64_t off, bytes;
	enum ts_pbuf_role rw, rmu, rnu;
	bool no_decay;                  /* adamw's decay masked off (not a matrix) */
};

/* A buffer of the plan (no action); -1 once the builder failed. */
int ts__pb_buf(struct ts__pb *b, enum ts_pbuf_role role, enum ts_pbuf_class cls,
               enum ts_memory_kind kind, int layer, uint64_t bytes);
/* A new action (its buffers unset), or NULL once the builder failed. */
struct ts_paction *ts__pb_emit(struct ts__pb *b, enum ts_pop op, int layer, const char *phase);
/* A temp buffer allocated now; freed by ts__pb_release (buf < 0: nothing). */
int ts__pb_temp(struct ts__pb *b, enum ts_pbuf_role role, enum ts_memory_kind kind, int layer,
                uint64_t bytes, const char *phase);
void ts__pb_release(struct ts__pb *b, int buf, int layer, const char *phase);
/* dst (+doff) <- src (+soff), bytes, on a copy queue, and the wait for it. */
void ts__pb_copy(struct ts__pb *b, int dst, uint64_t doff, int src, uint64_t soff,
                 uint64_t bytes, int layer, const char *phase);
/* A device temp of role TS_ROLE_LOWP holding n elements of buffer src
 * (+soff) rounded to the compute dtype (plan.h); freed by ts__pb_release. */
int ts__pb_round(struct ts__pb *b, int src, uint64_t soff, uint64_t n, int layer,
                 const char *phase);
/* c (+coff) = op(a) @ op(b) (+ beta c), rounded operands in a 16-bit compute dtype. */
void ts__pb_gemm(struct ts__pb *b, int c, uint64_t coff, int a_, uint64_t aoff, bool ta, int b_,
                 uint64_t boff, bool tb, int M, int N, int K, float beta, int layer,
                 const char *phase);
void ts__pb_elementwise(struct ts__pb *b, enum ts_pop op, int a_, int b_, int c, uint64_t n,
                        int layer, const char *phase);
/* The update of a parameter slice from its gradient G (+goff): fetched,
 * updated and written back when on the host (fused: a device copy the
 * backward pass holds, else -1), its streamed Adam state in and out; norm
 * the global norm's buffer when clipping, else -1. */
void ts__pb_update_param(struct ts__pb *b, const struct ts__pb_param *pr, int l, int G,
                         uint64_t goff, int norm, int fused, const char *phase);
/* Whether each update runs right after its gradient (no clipping). */
bool ts__pb_update_fused(const struct ts_plan *p);
/* A step with fused updates: the global norm's temp, allocated (and
 * zeroed) before everything else of the step and freed by ts__pb_finish
 * after everything else; each update adds its gradient's squares into it
 * (ts__pb_update_param), and the executor reads it back after the step
 * (plan.h's norm_after). No-op for a plan without fused updates. */
void ts__pb_norm_begin(struct ts__pb *b);
/* A whole-model buffer when want, else -1. */
int ts__pb_whole(struct ts__pb *b, bool want, enum ts_pbuf_role role, enum ts_pbuf_class cls,
                 enum ts_memory_kind kind, uint64_t bytes);
/* Gradient accumulation (plan.h's ts_plan_build_accumulate). micro: the
 * actions from index `first` on read micro-batch j of the input and target
 * arguments IN and TGT (their offsets there moved by j micro-batches).
 * accumulate: acc += g (n floats, whole buffers), then g freed. mean: acc
 * (n floats) summed over the replicas (data parallel: TS_P_ALLREDUCE) and
 * scaled by 1 / (the plan's accumulate * replicas). */
void ts__pb_micro(struct ts__pb *b, int first, int j, int IN, int TGT);
void ts__pb_accumulate(struct ts__pb *b, int acc, int g, uint64_t n, const char *phase);
void ts__pb_mean(struct ts__pb *b, int acc, uint64_t n, const char *phase);
/* ZeRO-2 (plan.h's ts_plan_build_zero2): whether the plan shards the
 * gradients; scatter: the whole gradient G of one update (n floats, a temp)
 * reduce-scattered into this replica's part of parameter k's gradient,
 * sg[k] at byte offset soff (allocated, part_bytes in all, at the first;
 * micro-batch 0 scatters into it, a later one into a temp added into it),
 * then G freed; norm: after the parts' squares were added into the norm
 * buffer, their sum over the replicas (no-op without sharded gradients). */
bool ts__pb_grads_sharded(const struct ts_plan *p);
void ts__pb_scatter(struct ts__pb *b, int k, enum ts_pbuf_role role, uint64_t part_bytes, int G,
                    uint64_t n, uint64_t soff, int layer, const char *phase);
void ts__pb_norm_sum(struct ts__pb *b, int norm);
/* Data parallel, whole gradients, one micro-batch (plan.h's early
 * all-reduce): reduce_early whether the plan all-reduces each gradient as
 * the backward pass makes it; ready: n floats of gradient buffer G at byte
 * offset off are final, into their buffer's open bucket, which is
 * all-reduced (TS_P_ALLREDUCE, layer's) once it holds TS_PLAN_BUCKET_BYTES
 * or a range not adjacent to it comes (no-op unless reduce_early). The
 * rest of a bucket is all-reduced by ts__pb_mean, which then all-reduces
 * nothing else of that buffer. */
bool ts__pb_reduce_early(const struct ts_plan *p);
void ts__pb_grad_ready(struct ts__pb *b, int G, uint64_t off, uint64_t n, int layer);
/* Starts building *out (zeroed): model, policy, batch, the per-layer state. */
void ts__pb_start(struct ts__pb *b, struct ts_plan *out, const struct ts_mlp *mlp,
                  const struct ts_policy *policy, int batch);
/* Ends building: the analysis (place.h); on failure the plan released and
 * RESOURCE_EXHAUSTED, "no memory to plan the <what>". */
ts_status ts__pb_finish(struct ts__pb *b, const char *what, struct ts_error *err);

/* The GPT kind's step and evaluation (plan_gpt.c), as
 * ts_plan_build_accumulate and ts_plan_build_eval, which call them for a
 * GPT; zero 0 replicated, 1 or 2 ts_plan_build_zero's or _zero2's. */
ts_status ts__plan_build_gpt(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                             int accumulate, int replicas, int zero,
                             const struct ts_policy *policy,
                             struct ts_plan *out, struct ts_error *err);
ts_status ts__plan_build_gpt_eval(const struct ts_mlp *mlp, int batch,
                                  const struct ts_policy *policy,
                                  const struct ts_eval_spec *spec, struct ts_plan *out,
                                  struct ts_error *err);

#endif
