/*
 * mlp.h - the model tstage trains: an MLP in the scanned layout of the JAX
 * host-offloading guide, its loss, and its optimizers.
 *
 * Parameters: w1 [L, d, h] and w2 [L, h, d] (or, without a hidden width,
 * w1 [L, d, d] only). Layer l maps x [B, d] to
 *     h = x @ w1[l]            (pre-activation, [B, h])
 *     a = act(h)
 *     y = a @ w2[l]            ([B, d]; without w2, y = a)
 *     x <- residual ? x + y : y
 * Loss: "sum" is sum(x_L); "mse" is mean((x_L - target)^2) over all B*d
 * elements; "softmax_cross_entropy" (token models, below) the mean over rows
 * of -log softmax(logits)[target]. Activations: none, relu, gelu (tanh approximation, as
 * jax.nn.gelu's default), tanh. Optimizers follow optax: SGD (p -= lr*g),
 * and chain(clip_by_global_norm(c), adam(lr, b1, b2, eps)) with bias
 * correction and eps outside the square root; with c == 0 no clipping;
 * adamw(lr, b1, b2, eps, weight_decay) likewise; lr a constant or optax's
 * warmup_cosine_decay_schedule.
 *
 * Thread-safety: plain values.
 */
#ifndef TS_MLP_H
#define TS_MLP_H

#include <stdbool.h>
#include <stdint.h>

enum ts_act { TS_ACT_NONE = 0, TS_ACT_RELU, TS_ACT_GELU, TS_ACT_TANH };
enum ts_loss { TS_LOSS_SUM = 0, TS_LOSS_MSE, TS_LOSS_XENT };
enum ts_opt { TS_OPT_NONE = 0, TS_OPT_SGD, TS_OPT_ADAM };

/* The compute dtype of a model's matrix products (its "dtype"): float32,
 * or bfloat16 / float16 for mixed precision, which plan.h defines. */
enum ts_compute { TS_COMPUTE_F32 = 0, TS_COMPUTE_BF16, TS_COMPUTE_F16 };

struct ts_mlp {
	int layers;          /* L >= 1 */
	int d_model;         /* d >= 1 */
	int d_hidden;        /* h; 0: one d x d matrix per layer (no w2) */
	enum ts_act act;
	bool residual;
	enum ts_loss loss;
	/* token models (vocab > 0): the inputs are token ids, one per row of the
	 * batch, looked up in embed [vocab, d]; with proj, the last layer's
	 * output x_L [B, d] is projected to logits x_L @ proj [B, vocab],
	 * without it d == vocab and x_L are the logits. The loss is then
	 * softmax_cross_entropy against integer targets, one per row: the mean
	 * over rows of logsumexp(logits) - logits[target]. id_bytes is the width
	 * of the ids a step is fed: 2 (uint16) or 4 (int32); 0 reads as 4. */
	int vocab;
	bool proj;
	int id_bytes;
	enum ts_compute compute;     /* the GEMMs' operand dtype (above) */
	/* the GPT kind (gpt.h; gpt true): a GPT-2 decoder over windows of
	 * `context` tokens, `heads` attention heads (d_model % heads == 0),
	 * d_hidden its MLP's width d_ff, act gelu, vocab its vocabulary, loss
	 * softmax_cross_entropy, the head tied to the token table (no proj) */
	bool gpt;
	int heads, context;
};

static inline bool ts_mlp_tokens(const struct ts_mlp *m)
{
	return m->vocab > 0;
}

static inline int ts_mlp_id_bytes(const struct ts_mlp *m)
{
	return m->id_bytes == 2 ? 2 : 4;
}

/*
 * The learning rate at update count c (0 for the first update), as optax's
 * schedules: constant (learning_rate), or warmup_cosine_decay_schedule(
 * init_value, peak_value, warmup_steps, decay_steps, end_value): linear
 * from init_value to peak_value over warmup_steps, then cosine decay to
 * end_value at decay_steps (which includes the warmup), end_value after.
 */
enum ts_sched { TS_SCHED_CONSTANT = 0, TS_SCHED_WARMUP_COSINE };

struct ts_schedule {
	enum ts_sched type;
	float init_value, peak_value, end_value;
	int warmup_steps, decay_steps;    /* 0 <= warmup < decay */
};

struct ts_optimizer {
	enum ts_opt type;
	float learning_rate;      /* the constant schedule's; the peak of a warmup cosine */
	float b1, b2, eps;        /* adam; optax defaults 0.9, 0.999, 1e-8 */
	float clip_global_norm;   /* 0: no clipping */
	/* adamw is type adam with decoupled weight decay (optax.adamw: the decay
	 * added to Adam's update of every parameter, no mask, before the
	 * learning rate scales it); weight_decay 0 otherwise */
	bool adamw;
	float weight_decay;
	/* adamw: decay only the matrices (a GPT's embeddings and weight
	 * matrices; every parameter of the MLP kinds is one), as nanoGPT
	 * decays the parameters of dim >= 2 and optax.adamw's mask does;
	 * false: every parameter */
	bool decay_matrices;
	struct ts_schedule schedule;
};

/* "none", "sgd", "adam" or "adamw". */
const char *ts_optimizer_name(const struct ts_optimizer *o);

/* The learning rate of the update at Adam's t (1 for the first), as the
 * update kernels take it on both backends (kernels_math.h's
 * ts_m_learning_rate at t - 1). */
float ts_optimizer_learning_rate(const struct ts_optimizer *o, uint64_t t);

/* "none", "relu", ... and their parsers (false on unknown names). */
const char *ts_act_name(enum ts_act a);
bool ts_act_parse(const char *s, enum ts_act *out);
const char *ts_loss_name(enum ts_loss l);
bool ts_loss_parse(const char *s, enum ts_loss *out);
const char *ts_opt_name(enum ts_opt o);
bool ts_opt_parse(const char *s, enum ts_opt *out);
/* "float32", "bfloat16", "float16". */
const char *ts_compute_name(enum ts_compute c);
bool ts_compute_parse(const char *s, enum ts_compute *out);

/* Whether the model's GEMMs take rounded 16-bit operands. */
static inline bool ts_mlp_lowp(const struct ts_mlp *m)
{
	return m->compute != TS_COMPUTE_F32;
}

/* The width of the hidden layer (d_hidden, or d_model without w2). */
static inline int ts_mlp_hidden(const struct ts_mlp *m)
{
	return m->d_hidden ? m->d_hidden : m->d_model;
}

static inline bool ts_mlp_has_w2(const struct ts_mlp *m)
{
	return m->d_hidden != 0;
}

#endif
