/*
 * gpt.h - the GPT model kind: GPT-2's decoder as nanoGPT and the GPT-2
 * paper define it, over windows of `context` tokens.
 *
 *   x_0 = wte[ids] + wpe[position]                    ([B*T, d])
 *   for each of `layers` blocks (pre-norm):
 *     a   = LayerNorm(x; ln1.g, ln1.b)
 *     qkv = a @ attn.qkv.w + attn.qkv.b               ([B*T, 3d]: q | k | v,
 *                                                       head h at columns h*hd..)
 *     y   = softmax(q k^T / sqrt(hd), causal) v per head, heads concatenated
 *     x   = x + y @ attn.o.w + attn.o.b
 *     m   = LayerNorm(x; ln2.g, ln2.b)
 *     x   = x + gelu(m @ mlp.fc.w + mlp.fc.b) @ mlp.proj.w + mlp.proj.b
 *   logits = LayerNorm(x; lnf.g, lnf.b) @ wte^T         (the head tied to wte)
 *   loss   = the mean over the B*T positions of softmax cross-entropy against
 *            the next tokens
 *
 * LayerNorm's eps is 1e-5, its variance the population's (as jnp.var);
 * gelu the tanh approximation (jax.nn.gelu's default); the softmax in
 * float32. The parameters, in TS_GPT_PARAMS order, stacked over layers
 * where a block has one: wte [V, d], wpe [C, d], ln1.g [L, d], ln1.b
 * [L, d], attn.qkv.w [L, d, 3d], attn.qkv.b [L, 3d], attn.o.w [L, d, d],
 * attn.o.b [L, d], ln2.g [L, d], ln2.b [L, d], mlp.fc.w [L, d, F],
 * mlp.fc.b [L, F], mlp.proj.w [L, F, d], mlp.proj.b [L, d], lnf.g [d],
 * lnf.b [d] (F = d_ff, the mlp's d_hidden). The catalog names them
 * "{model}.{name}".
 *
 * With "dtype" bfloat16 (or float16) every product above - the four
 * projections, q k^T and p v per head, the tied head - and each of its two
 * backward products takes its operands rounded to that dtype and sums in
 * float32 (plan.h's mixed precision: the cotangent is rounded like any
 * operand); the scale 1/sqrt(hd) multiplies the float32 scores inside the
 * softmax; everything else, the weights included, stays float32.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_GPT_H
#define TS_GPT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "train/mlp.h"

#define TS_GPT_PARAMS(X)                                                              \
	X(WTE, "wte") X(WPE, "wpe") X(LN1_G, "ln1.g") X(LN1_B, "ln1.b")               \
	X(QKV_W, "attn.qkv.w") X(QKV_B, "attn.qkv.b") X(O_W, "attn.o.w")              \
	X(O_B, "attn.o.b") X(LN2_G, "ln2.g") X(LN2_B, "ln2.b") X(FC_W, "mlp.fc.w")    \
	X(FC_B, "mlp.fc.b") X(PROJ_W, "mlp.proj.w") X(PROJ_B, "mlp.proj.b")           \
	X(LNF_G, "lnf.g") X(LNF_B, "lnf.b")

enum ts_gpt_param {
#define TS_GPT_ENUM_(id, name) TS_GPT_##id,
	TS_GPT_PARAMS(TS_GPT_ENUM_)
#undef TS_GPT_ENUM_
	TS_GPT_NPARAMS
};

#define TS_GPT_LN_EPS 1e-5f

/* The parameter's name ("wte", "attn.qkv.w", ...). */
const char *ts_gpt_param_name(enum ts_gpt_param t);

/* Whether the parameter has one slice per block (stacked over layers). */
bool ts_gpt_param_per_layer(enum ts_gpt_param t);

/* Its shape (rank 1 to 3 into shape, returned) and the floats of one
 * layer's slice (of the whole, for a parameter that has no layers). */
int ts_gpt_param_shape(const struct ts_mlp *m, enum ts_gpt_param t, uint64_t shape[3]);
uint64_t ts_gpt_param_slice(const struct ts_mlp *m, enum ts_gpt_param t);

/* Whether a parameter is a LayerNorm scale (initialised to 1) or shift or
 * a bias (to 0); the rest are matrices (drawn). */
bool ts_gpt_param_is_scale(enum ts_gpt_param t);
bool ts_gpt_param_is_matrix(enum ts_gpt_param t);

/* The head width d_model / heads. */
static inline int ts_gpt_head_dim(const struct ts_mlp *m)
{
	return m->heads > 0 ? m->d_model / m->heads : 0;
}

/*
 * A block's intermediates by name, as a policy's activation lists name
 * them (plan.h's ts_policy): ln1 (the first LayerNorm's output and
 * statistics), qkv (q k v by head), attn (the attention probabilities
 * [B, heads, T, T]), attn_out (the heads' merged output before the
 * projection), resid (the residual stream between the halves), ln2, mlp_h
 * (the MLP's first product, before the GELU), mlp_act (after it). "h" names
 * every one but mlp_act, which the backward pass recomputes from mlp_h
 * unless it is named itself.
 */
#define TS_GPT_ACTS(X)                                                                \
	X(LN1, "ln1") X(QKV, "qkv") X(ATTN, "attn") X(ATTN_OUT, "attn_out")           \
	X(RESID, "resid") X(LN2, "ln2") X(MLP_H, "mlp_h") X(MLP_ACT, "mlp_act")

enum ts_gpt_act {
#define TS_GPT_ACT_ENUM_(id, name) TS_GPT_A_##id,
	TS_GPT_ACTS(TS_GPT_ACT_ENUM_)
#undef TS_GPT_ACT_ENUM_
	TS_GPT_NACTS
};

/* The names "h" stands for, as bits (1u << enum ts_gpt_act). */
#define TS_GPT_ACTS_H (((1u << TS_GPT_NACTS) - 1u) & ~(1u << TS_GPT_A_MLP_ACT))

/* An intermediate's name ("ln1", ...), or "?". */
const char *ts_gpt_act_name(enum ts_gpt_act a);

/* The intermediate named s, into *out; false when s names none. */
bool ts_gpt_act_parse(const char *s, enum ts_gpt_act *out);

/*
 * Checks a GPT model: vocab, context, layers, d_model, heads and d_ff
 * positive, d_model a multiple of heads, loss softmax_cross_entropy, act
 * gelu, no projection (any compute dtype: plan.h's mixed precision rounds
 * the operands of every product, the attention's batched ones too).
 * INVALID_ARGUMENT (BAD_MODEL)
 * naming what is wrong.
 */
ts_status ts_gpt_check(const struct ts_mlp *m, struct ts_error *err);

#endif
