/*
 * gpt.c - the GPT model kind's parameters (names, shapes, slices) and the names of
 * a block's intermediates (gpt.h).
 */
#include "train/gpt.h"

#include <stddef.h>
#include <string.h>

static const char *const names[TS_GPT_NPARAMS] = {
#define TS_GPT_NAME_(id, name) [TS_GPT_##id] = name,
	TS_GPT_PARAMS(TS_GPT_NAME_)
#undef TS_GPT_NAME_
};

const char *ts_gpt_param_name(enum ts_gpt_param t)
{
	return (unsigned)t < TS_GPT_NPARAMS ? names[t] : "?";
}

static const char *const act_names[TS_GPT_NACTS] = {
#define TS_GPT_ACT_NAME_(id, name) [TS_GPT_A_##id] = name,
	TS_GPT_ACTS(TS_GPT_ACT_NAME_)
#undef TS_GPT_ACT_NAME_
};

const char *ts_gpt_act_name(enum ts_gpt_act a)
{
	return (unsigned)a < TS_GPT_NACTS ? act_names[a] : "?";
}

bool ts_gpt_act_parse(const char *s, enum ts_gpt_act *out)
{
	for (int a = 0; s && a < TS_GPT_NACTS; a++)
		if (strcmp(s, act_names[a]) == 0) {
			*out = (enum ts_gpt_act)a;
			return true;
		}
	return false;
}

bool ts_gpt_param_per_layer(enum ts_gpt_param t)
{
	return t != TS_GPT_WTE && t != TS_GPT_WPE && t != TS_GPT_LNF_G && t != TS_GPT_LNF_B;
}

bool ts_gpt_param_is_scale(enum ts_gpt_param t)
{
	return t == TS_GPT_LN1_G || t == TS_GPT_LN2_G || t == TS_GPT_LNF_G;
}

bool ts_gpt_param_is_matrix(enum ts_gpt_param t)
{
	return t == TS_GPT_WTE || t == TS_GPT_WPE || t == TS_GPT_QKV_W || t == TS_GPT_O_W ||
	       t == TS_GPT_FC_W || t == TS_GPT_PROJ_W;
}

/* One slice's shape (rank 1 or 2 into s). */
static int slice_shape(const struct ts_mlp *m, enum ts_gpt_param t, uint64_t s[2])
{
	uint64_t d = (uint64_t)m->d_model, F = (uint64_t)m->d_hidden;

	switch (t) {
	case TS_GPT_WTE:
		s[0] = (uint64_t)m->vocab;
		s[1] = d;
		return 2;
	case TS_GPT_WPE:
		s[0] = (uint64_t)m->context;
		s[1] = d;
		return 2;
	case TS_GPT_QKV_W:
		s[0] = d;
		s[1] = 3 * d;
		return 2;
	case TS_GPT_QKV_B:
		s[0] = 3 * d;
		return 1;
	case TS_GPT_O_W:
		s[0] = d;
		s[1] = d;
		return 2;
	case TS_GPT_FC_W:
		s[0] = d;
		s[1] = F;
		return 2;
	case TS_GPT_FC_B:
		s[0] = F;
		return 1;
	case TS_GPT_PROJ_W:
		s[0] = F;
		s[1] = d;
		return 2;
	default:            /* LayerNorm scales and shifts, the d-wide biases */
		s[0] = d;
		return 1;
	}
}

int ts_gpt_param_shape(const struct ts_mlp *m, enum ts_gpt_param t, uint64_t shape[3])
{
	uint64_t s[2] = {0, 0};
	int r = slice_shape(m, t, s);

	if (!ts_gpt_param_per_layer(t)) {
		shape[0] = s[0];
		shape[1] = s[1];
		shape[2] = 0;
		return r;
	}
	shape[0] = (uint64_t)m->layers;
	shape[1] = s[0];
	shape[2] = s[1];
	return r + 1;
}

uint64_t ts_gpt_param_slice(const struct ts_mlp *m, enum ts_gpt_param t)
{
	uint64_t s[2] = {0, 0};
	int r = slice_shape(m, t, s);

	return r == 2 ? s[0] * s[1] : s[0];
}

ts_status ts_gpt_check(const struct ts_mlp *m, struct ts_error *err)
{
	const char *why = NULL;

	if (m->vocab < 1 || m->vocab > (1 << 24))
		why = "vocab must lie in [1, 16777216]";
	else if (m->context < 1 || m->context > (1 << 16))
		why = "context must lie in [1, 65536]";
	else if (m->layers < 1 || m->layers > 100000 || m->d_model < 1 || m->d_hidden < 1)
		why = "layers, d_model and d_ff must be positive";
	else if (m->heads < 1 || m->d_model % m->heads != 0)
		why = "heads must be positive and divide d_model";
	else if (m->loss != TS_LOSS_XENT || m->act != TS_ACT_GELU || m->proj || m->residual)
		why = "a GPT takes loss softmax_cross_entropy, gelu, a tied head and its own "
		      "residuals";
	if (!why)
		return TS_OK;
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL", "gpt: %s", why);
}
