/*
 * mlp.c - the names of the MLP's activations, losses, optimizers and
 * compute dtypes, and the learning rate an optimizer uses at a step.
 *
 * Each enum has one name table; a name and its parser come from the same
 * row, so they cannot disagree.
 *
 * Thread-safety: the tables are immutable.
 */
#include "train/mlp.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "train/kernels_math.h"

static const char *const act_names[] = {
	[TS_ACT_NONE] = "none",
	[TS_ACT_RELU] = "relu",
	[TS_ACT_GELU] = "gelu",
	[TS_ACT_TANH] = "tanh",
};

static const char *const loss_names[] = {
	[TS_LOSS_SUM] = "sum",
	[TS_LOSS_MSE] = "mse",
	[TS_LOSS_XENT] = "softmax_cross_entropy",
};

static const char *const opt_names[] = {
	[TS_OPT_NONE] = "none",
	[TS_OPT_SGD] = "sgd",
	[TS_OPT_ADAM] = "adam",
};

static const char *const compute_names[] = {
	[TS_COMPUTE_F32] = "float32",
	[TS_COMPUTE_BF16] = "bfloat16",
	[TS_COMPUTE_F16] = "float16",
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *name_of(const char *const *names, size_t n, int v)
{
	if (v < 0 || (size_t)v >= n)
		return "unknown";
	return names[v];
}

/* The index of s in names, or -1. */
static int index_of(const char *const *names, size_t n, const char *s)
{
	if (!s)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (strcmp(s, names[i]) == 0)
			return (int)i;
	return -1;
}

const char *ts_act_name(enum ts_act a)
{
	return name_of(act_names, COUNT(act_names), (int)a);
}

bool ts_act_parse(const char *s, enum ts_act *out)
{
	int i = index_of(act_names, COUNT(act_names), s);

	if (i < 0)
		return false;
	if (out)
		*out = (enum ts_act)i;
	return true;
}

const char *ts_loss_name(enum ts_loss l)
{
	return name_of(loss_names, COUNT(loss_names), (int)l);
}

bool ts_loss_parse(const char *s, enum ts_loss *out)
{
	int i = index_of(loss_names, COUNT(loss_names), s);

	if (i < 0)
		return false;
	if (out)
		*out = (enum ts_loss)i;
	return true;
}

float ts_optimizer_learning_rate(const struct ts_optimizer *o, uint64_t t)
{
	return ts_m_learning_rate(o, t > (uint64_t)INT32_MAX ? INT32_MAX - 1 : (int)t - 1);
}

const char *ts_optimizer_name(const struct ts_optimizer *o)
{
	return o->type == TS_OPT_ADAM && o->adamw ? "adamw" : ts_opt_name(o->type);
}

const char *ts_opt_name(enum ts_opt o)
{
	return name_of(opt_names, COUNT(opt_names), (int)o);
}

bool ts_opt_parse(const char *s, enum ts_opt *out)
{
	int i = index_of(opt_names, COUNT(opt_names), s);

	if (i < 0)
		return false;
	if (out)
		*out = (enum ts_opt)i;
	return true;
}

const char *ts_compute_name(enum ts_compute c)
{
	return name_of(compute_names, COUNT(compute_names), (int)c);
}

bool ts_compute_parse(const char *s, enum ts_compute *out)
{
	int i = index_of(compute_names, COUNT(compute_names), s);

	if (i < 0)
		return false;
	if (out)
		*out = (enum ts_compute)i;
	return true;
}
