/*
 * plan_gpt.c - the schedule of a GPT step or evaluation (plan.h, gpt.h).
 *
 * The same builder primitives as the MLP kinds' (plan_int.h), so the
 * placement, the analysis and the executor are theirs: measured peak =
 * predicted holds for a GPT as for an MLP. Rows are tokens: a batch of B
 * windows of T = context tokens is N = B*T rows (the plan's batch). An
 * evaluation may take shorter windows (T < context: positions 0..T-1, the
 * first T rows of wpe) and skip the loss, or run the head on each window's
 * last row only (plan.h's ts_eval_spec).
 *
 * Policy: params and opt_state on the device or pinned_host (streamed per
 * block, with prefetch_depth 1 the next block's already on the way; the
 * token table, the position table and the final LayerNorm whole, when
 * used); activations: "x" (a block's input) saved, offloaded to
 * pinned_host or recomputed from the nearest earlier input, as the MLP's;
 * a block's intermediates by name (gpt.h's ts_gpt_act, "h" for all but
 * mlp_act) each saved from the forward pass, offloaded to pinned_host and
 * copied back when the block's backward pass starts, or recomputed then
 * from the block's input and what it has (mlp_act where the backward pass
 * reads it). A block's input is kept on the device (unless offloaded) when
 * the policy keeps anything of the block: its backward pass reads it.
 *
 * Every kernel computes from the same inputs whatever the policy (a
 * recomputation repeats the forward pass's kernels on the same bits), so
 * the results are the same bits under every policy.
 */
#include "train/plan_int.h"

#include <stdlib.h>
#include <string.h>

#define NP TS_GPT_NPARAMS

/* A block's intermediates (buffers, -1 when not held): ln1's output and
 * statistics, q k v by head, the probabilities, the heads' merged output,
 * the residual between the halves, ln2's, the MLP's product before and
 * after the GELU. */
struct act {
	int y1, st1, qkvh, p, att, xm, y2, st2, h, h2;
};

#define NACT 10

/* The fields of *a, and the name each goes by (gpt.h). */
static void act_fields(struct act *a, int *f[NACT])
{
	int *v[NACT] = {&a->y1, &a->st1, &a->qkvh, &a->p, &a->att, &a->xm, &a->y2, &a->st2,
	                &a->h, &a->h2};

	memcpy(f, v, sizeof v);
}

static const enum ts_gpt_act act_name[NACT] = {
	TS_GPT_A_LN1, TS_GPT_A_LN1, TS_GPT_A_QKV, TS_GPT_A_ATTN, TS_GPT_A_ATTN_OUT,
	TS_GPT_A_RESID, TS_GPT_A_LN2, TS_GPT_A_LN2, TS_GPT_A_MLP_H, TS_GPT_A_MLP_ACT,
};

#define ACT_NONE ((struct act){-1, -1, -1, -1, -1, -1, -1, -1, -1, -1})

struct gpt {
	struct ts__pb *b;
	int N, B, T, d, H, hd, F, V, L;
	int W[NP], MU[NP], NU[NP], G[NP];     /* arguments, outputs or whole gradients */
	int IN, TGT;
	int *lw;          /* [L + 1][NP]: a block's streamed params on the device, or -1 */
	int whole[NP];    /* whole params (wte, wpe, lnf) fetched to the device, or -1 */
	int *x, *xh;      /* [L + 1]: block inputs on the device / pinned_host, or -1 */
	struct act *act;  /* [L]: saved intermediates */
	struct act *acth; /* [L]: intermediates offloaded to pinned_host */
};

static uint64_t slice_bytes(const struct gpt *g, int t)
{
	return ts_gpt_param_slice(&g->b->p->mlp, (enum ts_gpt_param)t) * F32;
}

static bool on_host(const struct gpt *g)
{
	return g->b->p->policy.params != TS_MEM_DEVICE;
}

/* ---- parameters ------------------------------------------------------------ */

static void block_fetch(struct gpt *g, int l, const char *phase)
{
	if (!on_host(g) || l < 0 || l >= g->L)
		return;
	for (int t = 0; t < NP; t++) {
		int *w = &g->lw[l * NP + t];
		uint64_t n = slice_bytes(g, t);

		if (!ts_gpt_param_per_layer((enum ts_gpt_param)t) || *w >= 0)
			continue;
		*w = ts__pb_temp(g->b, ts_gpt_role(0, t), TS_MEM_DEVICE, l, n, phase);
		ts__pb_copy(g->b, *w, 0, g->W[t], (uint64_t)l * n, n, l, phase);
	}
}

static void block_drop(struct gpt *g, int l, const char *phase)
{
	if (!on_host(g) || l < 0 || l >= g->L)
		return;
	for (int t = 0; t < NP; t++) {
		ts__pb_release(g->b, g->lw[l * NP + t], l, phase);
		g->lw[l * NP + t] = -1;
	}
}

/* Where layer l's slice of parameter t is (l -1: a whole parameter). */
static int param_at(struct gpt *g, int t, int l, uint64_t *off)
{
	*off = 0;
	if (!ts_gpt_param_per_layer((enum ts_gpt_param)t)) {
		if (!on_host(g))
			return g->W[t];
		if (g->whole[t] < 0) {
			g->whole[t] = ts__pb_temp(g->b, ts_gpt_role(0, t), TS_MEM_DEVICE, -1,
			                          slice_bytes(g, t), "fetch");
			ts__pb_copy(g->b, g->whole[t], 0, g->W[t], 0, slice_bytes(g, t), -1, "fetch");
		}
		return g->whole[t];
	}
	if (!on_host(g)) {
		*off = (uint64_t)l * slice_bytes(g, t);
		return g->W[t];
	}
	return g->lw[l * NP + t];
}

static void whole_drop(struct gpt *g, int t, const char *phase)
{
	ts__pb_release(g->b, g->whole[t], -1, phase);
	g->whole[t] = -1;
}

/* ---- kernels ---------------------------------------------------------------------- */

static struct ts_paction *op(struct gpt *g, enum ts_pop o, int l, const char *phase)
{
	return ts__pb_emit(g->b, o, l, phase);
}

/* y, st = LayerNorm(x) with parameters gt, bt of layer l (-1: whole). */
static void ln_fwd(struct gpt *g, int x, int gt, int bt, int l, int y, int st, const char *ph)
{
	uint64_t go, bo;
	int gb = param_at(g, gt, l, &go), bb = param_at(g, bt, l, &bo);
	struct ts_paction *a = op(g, TS_P_LN_FWD, l, ph);

	if (!a)
		return;
	a->a = x;
	a->b = gb;
	a->boff = go;
	a->c = bb;
	a->coff = bo;
	a->d = y;
	a->e = st;
	a->n = (uint64_t)g->N;
	a->N = g->d;
}

/* dx = LayerNorm's input gradient; the parameters' gradients into their
 * buffers (dg, db at offsets). */
static void ln_bwd(struct gpt *g, int x, int gt, int l, int st, int dy, int dx, int dg,
                   uint64_t dgo, int db, uint64_t dbo, const char *ph)
{
	uint64_t go;
	int gb = param_at(g, gt, l, &go);
	struct ts_paction *a = op(g, TS_P_LN_BWD, l, ph);

	if (!a)
		return;
	a->a = x;
	a->b = gb;
	a->boff = go;
	a->c = st;
	a->d = dy;
	a->e = dx;
	a->f = dg;
	a->foff = dgo;
	a->g = db;
	a->goff = dbo;
	a->n = (uint64_t)g->N;
	a->N = g->d;
}

/* y [rows, n] += x (+xo) [period, n] */
static void add_rows(struct gpt *g, int x, uint64_t xo, int y, int rows, int n, int period,
                     int l, const char *ph)
{
	struct ts_paction *a = op(g, TS_P_ADD_ROWS, l, ph);

	if (!a)
		return;
	a->a = x;
	a->aoff = xo;
	a->b = y;
	a->n = (uint64_t)rows;
	a->N = n;
	a->K = period;
}

static void sum_rows(struct gpt *g, int dy, int rows, int n, int period, int out, uint64_t oo,
                     int l, const char *ph)
{
	struct ts_paction *a = op(g, TS_P_SUM_ROWS, l, ph);

	if (!a)
		return;
	a->a = dy;
	a->b = out;
	a->boff = oo;
	a->n = (uint64_t)rows;
	a->N = n;
	a->K = period;
}

/* [B, T, P, H, hd] <-> [P, B, H, T, hd] */
static void heads(struct gpt *g, bool to, int in, int out, int parts, int l, const char *ph)
{
	struct ts_paction *a = op(g, TS_P_HEADS, l, ph);

	if (!a)
		return;
	a->a = in;
	a->b = out;
	a->ta = !to;
	a->M = g->B;
	a->N = g->T;
	a->K = parts;
	a->n = (uint64_t)g->N * (uint64_t)parts * (uint64_t)g->d;
}

/* B*H products of [M, K] x [K, N], dense batches; with a 16-bit compute
 * dtype on rounded copies of both operands (plan.h), as ts__pb_gemm. */
static void bmm(struct gpt *g, int c, uint64_t co, int a_, uint64_t ao, bool ta, int b_,
                uint64_t bo, bool tb, int M, int N, int K, int l, const char *ph)
{
	uint64_t nb = (uint64_t)g->B * (uint64_t)g->H;
	bool lowp = ts_mlp_lowp(&g->b->p->mlp) && M > 0 && N > 0 && K > 0;
	int ra = -1, rb = -1;
	struct ts_paction *a;

	if (lowp) {
		ra = ts__pb_round(g->b, a_, ao, nb * (uint64_t)M * (uint64_t)K, l, ph);
		rb = ts__pb_round(g->b, b_, bo, nb * (uint64_t)K * (uint64_t)N, l, ph);
	}
	a = op(g, lowp ? TS_P_GEMM_BATCHED_LP : TS_P_GEMM_BATCHED, l, ph);
	if (a) {
		a->a = lowp ? ra : a_;
		a->aoff = lowp ? 0 : ao;
		a->b = lowp ? rb : b_;
		a->boff = lowp ? 0 : bo;
		a->c = c;
		a->coff = co;
		a->ta = ta;
		a->tb = tb;
		a->M = M;
		a->N = N;
		a->K = K;
		a->n = nb;
	}
	ts__pb_release(g->b, ra, l, ph);
	ts__pb_release(g->b, rb, l, ph);
}

static void softmax(struct gpt *g, enum ts_pop o, int a_, int b_, int c, int l, const char *ph)
{
	struct ts_paction *a = op(g, o, l, ph);

	if (!a)
		return;
	a->a = a_;
	a->b = b_;
	a->c = c;
	a->n = (uint64_t)g->B * (uint64_t)g->H;
	a->N = g->T;
}

/* y [N, n] = x @ w(t, l) + bias(bt, l) */
static void linear(struct gpt *g, int y, int x, int wt, int bt, int n, int k, int l,
                   const char *ph)
{
	uint64_t wo, bo;
	int w = param_at(g, wt, l, &wo), bb = param_at(g, bt, l, &bo);

	ts__pb_gemm(g->b, y, 0, x, 0, false, w, wo, false, g->N, n, k, 0.0f, l, ph);
	add_rows(g, bb, bo, y, g->N, n, 1, l, ph);
}

/* ---- a block -------------------------------------------------------------------------- */

static int dtemp(struct gpt *g, int l, uint64_t floats, const char *ph)
{
	return ts__pb_temp(g->b, TS_ROLE_GPT_ACT, TS_MEM_DEVICE, l, floats * F32, ph);
}

static void act_release(struct gpt *g, struct act *a, int l, const char *ph)
{
	int *f[NACT];

	act_fields(a, f);
	for (int i = 0; i < NACT; i++) {
		ts__pb_release(g->b, *f[i], l, ph);
		*f[i] = -1;
	}
}

/* Block l forward from x: computes the intermediates *a lacks (those it
 * holds are the same bits) up to the MLP's product before the GELU; with
 * out, the GELU's output too and x_{l+1}, returned (else -1). */
static int block_forward(struct gpt *g, int l, int x, struct act *a, bool out, const char *ph)
{
	uint64_t N = (uint64_t)g->N, d = (uint64_t)g->d, F = (uint64_t)g->F;
	uint64_t part = N * d * F32, ss = (uint64_t)g->B * g->H * g->T * g->T;
	int qkv, yh, xo;

	if (a->y1 < 0) {
		a->y1 = dtemp(g, l, N * d, ph);
		a->st1 = dtemp(g, l, 2 * N, ph);
		ln_fwd(g, x, TS_GPT_LN1_G, TS_GPT_LN1_B, l, a->y1, a->st1, ph);
	}
	if (a->qkvh < 0) {
		qkv = dtemp(g, l, 3 * N * d, ph);
		linear(g, qkv, a->y1, TS_GPT_QKV_W, TS_GPT_QKV_B, 3 * g->d, g->d, l, ph);
		a->qkvh = dtemp(g, l, 3 * N * d, ph);
		heads(g, true, qkv, a->qkvh, 3, l, ph);
		ts__pb_release(g->b, qkv, l, ph);
	}
	if (a->p < 0) {
		a->p = dtemp(g, l, ss, ph);
		bmm(g, a->p, 0, a->qkvh, 0, false, a->qkvh, part, true, g->T, g->T, g->hd, l, ph);
		softmax(g, TS_P_SOFTMAX_FWD, a->p, a->p, -1, l, ph);
	}
	if (a->att < 0) {
		yh = dtemp(g, l, N * d, ph);
		bmm(g, yh, 0, a->p, 0, false, a->qkvh, 2 * part, false, g->T, g->hd, g->T, l, ph);
		a->att = dtemp(g, l, N * d, ph);
		heads(g, false, yh, a->att, 1, l, ph);
		ts__pb_release(g->b, yh, l, ph);
	}
	if (a->xm < 0) {
		a->xm = dtemp(g, l, N * d, ph);
		linear(g, a->xm, a->att, TS_GPT_O_W, TS_GPT_O_B, g->d, g->d, l, ph);
		ts__pb_elementwise(g->b, TS_P_ADD, x, a->xm, -1, N * d, l, ph);
	}
	if (a->y2 < 0) {
		a->y2 = dtemp(g, l, N * d, ph);
		a->st2 = dtemp(g, l, 2 * N, ph);
		ln_fwd(g, a->xm, TS_GPT_LN2_G, TS_GPT_LN2_B, l, a->y2, a->st2, ph);
	}
	if (a->h < 0) {
		a->h = dtemp(g, l, N * F, ph);
		linear(g, a->h, a->y2, TS_GPT_FC_W, TS_GPT_FC_B, g->F, g->d, l, ph);
	}
	if (!out)
		return -1;
	if (a->h2 < 0) {
		a->h2 = dtemp(g, l, N * F, ph);
		ts__pb_elementwise(g->b, TS_P_ACT_FWD, a->h, a->h2, -1, N * F, l, ph);
	}
	xo = ts__pb_temp(g->b, TS_ROLE_X, TS_MEM_DEVICE, l + 1, N * d * F32, ph);
	linear(g, xo, a->h2, TS_GPT_PROJ_W, TS_GPT_PROJ_B, g->d, g->F, l, ph);
	ts__pb_elementwise(g->b, TS_P_ADD, a->xm, xo, -1, N * d, l, ph);
	return xo;
}

/* Block l forward from x, nothing kept: returns x_{l+1}. */
static int block_through(struct gpt *g, int l, int x, const char *ph)
{
	struct act a = ACT_NONE;
	int y = block_forward(g, l, x, &a, true, ph);

	act_release(g, &a, l, ph);
	return y;
}

/* Where the policy keeps intermediate n for the backward pass. */
enum fate { RECOMPUTE = 0, SAVE, OFFLOAD };

static enum fate fate(const struct ts_policy *p, enum ts_gpt_act n)
{
	unsigned bit = 1u << n;

	if ((p->save_acts & bit) || (p->save_h && (TS_GPT_ACTS_H & bit)))
		return SAVE;
	if ((p->offload_acts & bit) || (p->offload_h && (TS_GPT_ACTS_H & bit)))
		return OFFLOAD;
	return RECOMPUTE;
}

/* Whether the policy keeps any of a block's intermediates. */
static bool keeps_any(const struct ts_policy *p)
{
	return p->save_h || p->offload_h || p->save_acts || p->offload_acts;
}

/* After block l's forward pass: each intermediate of *a (its whole
 * output, emptied) saved, offloaded or freed as the policy says. */
static void act_keep(struct gpt *g, int l, struct act *a, const char *ph)
{
	int *f[NACT], *fs[NACT], *fh[NACT];

	act_fields(a, f);
	act_fields(&g->act[l], fs);
	act_fields(&g->acth[l], fh);
	for (int i = 0; i < NACT; i++) {
		enum fate k = fate(&g->b->p->policy, act_name[i]);
		uint64_t n = *f[i] >= 0 && !g->b->failed ? g->b->p->bufs[*f[i]].bytes : 0;

		if (k == SAVE) {
			*fs[i] = *f[i];
		} else if (k == OFFLOAD && *f[i] >= 0) {
			*fh[i] = ts__pb_temp(g->b, TS_ROLE_GPT_ACT, TS_MEM_PINNED_HOST, l, n, ph);
			ts__pb_copy(g->b, *fh[i], 0, *f[i], 0, n, l, ph);
			ts__pb_release(g->b, *f[i], l, ph);
		} else {
			ts__pb_release(g->b, *f[i], l, ph);
		}
		*f[i] = -1;
	}
}

/* Before block l's backward pass: its offloaded intermediates copied back
 * to the device (their host copies freed). */
static void act_fetch(struct gpt *g, int l, const char *ph)
{
	int *fs[NACT], *fh[NACT];

	act_fields(&g->act[l], fs);
	act_fields(&g->acth[l], fh);
	for (int i = 0; i < NACT; i++) {
		uint64_t n;

		if (*fh[i] < 0)
			continue;
		n = !g->b->failed ? g->b->p->bufs[*fh[i]].bytes : 0;
		*fs[i] = ts__pb_temp(g->b, TS_ROLE_GPT_ACT, TS_MEM_DEVICE, l, n, ph);
		ts__pb_copy(g->b, *fs[i], 0, *fh[i], 0, n, l, ph);
		ts__pb_release(g->b, *fh[i], l, ph);
		*fh[i] = -1;
	}
}

/* A gradient slice of parameter t at layer l: the whole gradient's slice,
 * or a temp of its own (fused updates). */
static int grad_at(struct gpt *g, int t, int l, bool fused, int *tmp, uint64_t *off,
                   const char *ph)
{
	if (!fused) {
		*off = ts_gpt_param_per_layer((enum ts_gpt_param)t) && l >= 0
		       ? (uint64_t)l * slice_bytes(g, t) : 0;
		return g->G[t];
	}
	*off = 0;
	tmp[t] = ts__pb_temp(g->b, ts_gpt_role(3, t), TS_MEM_DEVICE, l, slice_bytes(g, t), ph);
	return tmp[t];
}

/* ZeRO-2: parameter t's gradient of layer l (-1: whole), the temp G,
 * reduce-scattered into this replica's part of it and freed (plan_int.h's
 * ts__pb_scatter). */
static void scatter(struct gpt *g, int t, int l, int G, const char *ph)
{
	bool per = ts_gpt_param_per_layer((enum ts_gpt_param)t);
	uint64_t n = slice_bytes(g, t), R = (uint64_t)g->b->p->replicas;

	ts__pb_scatter(g->b, t, ts_gpt_role(3, t), n * (per ? (uint64_t)g->L : 1) / R, G, n / F32,
	               per ? (uint64_t)l * n / R : 0, per ? l : -1, ph);
}

/* Updates parameter t's slice of layer l (-1: whole) from gradient G
 * (+goff); fused: right after the gradient, with the block's device copy. */
static void update_slice(struct gpt *g, int t, int l, int G, uint64_t goff, int norm,
                         bool fused, const char *ph)
{
	bool per = ts_gpt_param_per_layer((enum ts_gpt_param)t);
	uint64_t n = slice_bytes(g, t);
	struct ts__pb_param pr = {
		.W = g->W[t], .MU = g->MU[t], .NU = g->NU[t],
		.off = per ? (uint64_t)l * n : 0, .bytes = n,
		.rw = ts_gpt_role(0, t), .rmu = ts_gpt_role(1, t), .rnu = ts_gpt_role(2, t),
		.no_decay = g->b->p->opt.decay_matrices &&
		            !ts_gpt_param_is_matrix((enum ts_gpt_param)t),
	};
	int dev = -1;

	if (fused && on_host(g))
		dev = per ? g->lw[l * NP + t] : g->whole[t];
	ts__pb_update_param(g->b, &pr, per ? l : -1, G, goff, norm, dev, ph);
}

/* Block l backward: gy = dL/dx_{l+1} (freed); returns dL/dx_l. */
static int block_backward(struct gpt *g, int l, int x, struct act *a, int gy, bool fused)
{
	const char *ph = "backward";
	uint64_t N = (uint64_t)g->N, d = (uint64_t)g->d, F = (uint64_t)g->F;
	uint64_t part = N * d * F32, ss = (uint64_t)g->B * g->H * g->T * g->T, wo, go[NP];
	int tmp[NP], G[NP], h2, da, dy, dx, gm, w, dyh, dp, dq, dqkv;
	bool sharded = ts__pb_grads_sharded(g->b->p);

	for (int t = 0; t < NP; t++) {
		tmp[t] = -1;
		G[t] = ts_gpt_param_per_layer((enum ts_gpt_param)t)
		       ? grad_at(g, t, l, fused || sharded, tmp, &go[t], ph) : -1;
	}
	/* the MLP half (the GELU's output recomputed unless kept) */
	h2 = a->h2;
	a->h2 = -1;
	if (h2 < 0) {
		h2 = dtemp(g, l, N * F, ph);
		ts__pb_elementwise(g->b, TS_P_ACT_FWD, a->h, h2, -1, N * F, l, ph);
	}
	ts__pb_gemm(g->b, G[TS_GPT_PROJ_W], go[TS_GPT_PROJ_W], h2, 0, true, gy, 0, false, g->F,
	            g->d, g->N, 0.0f, l, ph);
	sum_rows(g, gy, g->N, g->d, 1, G[TS_GPT_PROJ_B], go[TS_GPT_PROJ_B], l, ph);
	ts__pb_release(g->b, h2, l, ph);
	da = dtemp(g, l, N * F, ph);
	w = param_at(g, TS_GPT_PROJ_W, l, &wo);
	ts__pb_gemm(g->b, da, 0, gy, 0, false, w, wo, true, g->N, g->F, g->d, 0.0f, l, ph);
	ts__pb_elementwise(g->b, TS_P_ACT_BWD, a->h, da, da, N * F, l, ph);
	ts__pb_gemm(g->b, G[TS_GPT_FC_W], go[TS_GPT_FC_W], a->y2, 0, true, da, 0, false, g->d,
	            g->F, g->N, 0.0f, l, ph);
	sum_rows(g, da, g->N, g->F, 1, G[TS_GPT_FC_B], go[TS_GPT_FC_B], l, ph);
	dy = dtemp(g, l, N * d, ph);
	w = param_at(g, TS_GPT_FC_W, l, &wo);
	ts__pb_gemm(g->b, dy, 0, da, 0, false, w, wo, true, g->N, g->d, g->F, 0.0f, l, ph);
	ts__pb_release(g->b, da, l, ph);
	gm = dtemp(g, l, N * d, ph);
	ln_bwd(g, a->xm, TS_GPT_LN2_G, l, a->st2, dy, gm, G[TS_GPT_LN2_G], go[TS_GPT_LN2_G],
	       G[TS_GPT_LN2_B], go[TS_GPT_LN2_B], ph);
	ts__pb_release(g->b, dy, l, ph);
	ts__pb_elementwise(g->b, TS_P_ADD, gy, gm, -1, N * d, l, ph);
	ts__pb_release(g->b, gy, l, ph);
	/* the attention half */
	ts__pb_gemm(g->b, G[TS_GPT_O_W], go[TS_GPT_O_W], a->att, 0, true, gm, 0, false, g->d, g->d,
	            g->N, 0.0f, l, ph);
	sum_rows(g, gm, g->N, g->d, 1, G[TS_GPT_O_B], go[TS_GPT_O_B], l, ph);
	dy = dtemp(g, l, N * d, ph);
	w = param_at(g, TS_GPT_O_W, l, &wo);
	ts__pb_gemm(g->b, dy, 0, gm, 0, false, w, wo, true, g->N, g->d, g->d, 0.0f, l, ph);
	dyh = dtemp(g, l, N * d, ph);
	heads(g, true, dy, dyh, 1, l, ph);
	ts__pb_release(g->b, dy, l, ph);
	dp = dtemp(g, l, ss, ph);
	bmm(g, dp, 0, dyh, 0, false, a->qkvh, 2 * part, true, g->T, g->T, g->hd, l, ph);
	dq = dtemp(g, l, 3 * N * d, ph);
	bmm(g, dq, 2 * part, a->p, 0, true, dyh, 0, false, g->T, g->hd, g->T, l, ph);
	ts__pb_release(g->b, dyh, l, ph);
	softmax(g, TS_P_SOFTMAX_BWD, a->p, dp, dp, l, ph);
	bmm(g, dq, 0, dp, 0, false, a->qkvh, part, false, g->T, g->hd, g->T, l, ph);
	bmm(g, dq, part, dp, 0, true, a->qkvh, 0, false, g->T, g->hd, g->T, l, ph);
	ts__pb_release(g->b, dp, l, ph);
	dqkv = dtemp(g, l, 3 * N * d, ph);
	heads(g, false, dq, dqkv, 3, l, ph);
	ts__pb_release(g->b, dq, l, ph);
	ts__pb_gemm(g->b, G[TS_GPT_QKV_W], go[TS_GPT_QKV_W], a->y1, 0, true, dqkv, 0, false, g->d,
	            3 * g->d, g->N, 0.0f, l, ph);
	sum_rows(g, dqkv, g->N, 3 * g->d, 1, G[TS_GPT_QKV_B], go[TS_GPT_QKV_B], l, ph);
	dy = dtemp(g, l, N * d, ph);
	w = param_at(g, TS_GPT_QKV_W, l, &wo);
	ts__pb_gemm(g->b, dy, 0, dqkv, 0, false, w, wo, true, g->N, g->d, 3 * g->d, 0.0f, l, ph);
	ts__pb_release(g->b, dqkv, l, ph);
	dx = ts__pb_temp(g->b, TS_ROLE_GX, TS_MEM_DEVICE, l, N * d * F32, ph);
	ln_bwd(g, x, TS_GPT_LN1_G, l, a->st1, dy, dx, G[TS_GPT_LN1_G], go[TS_GPT_LN1_G],
	       G[TS_GPT_LN1_B], go[TS_GPT_LN1_B], ph);
	ts__pb_release(g->b, dy, l, ph);
	ts__pb_elementwise(g->b, TS_P_ADD, gm, dx, -1, N * d, l, ph);
	ts__pb_release(g->b, gm, l, ph);
	act_release(g, a, l, ph);
	if (fused) {         /* the block's parameters are used no more: update them now */
		for (int t = 0; t < NP; t++) {
			if (tmp[t] < 0)
				continue;
			update_slice(g, t, l, tmp[t], 0, -1, true, ph);
			ts__pb_release(g->b, tmp[t], l, ph);
		}
	} else if (sharded) { /* ZeRO-2: into this replica's parts, at once */
		for (int t = 0; t < NP; t++)
			if (tmp[t] >= 0)
				scatter(g, t, l, tmp[t], ph);
	} else {              /* data parallel: all-reduced as made */
		for (int t = 0; t < NP; t++)
			if (G[t] >= 0)
				ts__pb_grad_ready(g->b, G[t], go[t], slice_bytes(g, t) / F32, l);
	}
	return dx;
}

/* ---- the pieces of a step ---------------------------------------------------- */

/* x_0 = wte[ids] + wpe by position. */
static int embed_forward(struct gpt *g, const char *ph)
{
	uint64_t eo, po;
	int x0 = ts__pb_temp(g->b, TS_ROLE_X, TS_MEM_DEVICE, 0, (uint64_t)g->N * g->d * F32, ph);
	int wte = param_at(g, TS_GPT_WTE, -1, &eo), wpe;
	struct ts_paction *a = op(g, TS_P_EMBED_FWD, -1, ph);

	if (a) {
		a->a = wte;
		a->aoff = eo;
		a->b = g->IN;
		a->c = x0;
		a->n = (uint64_t)g->N;
	}
	wpe = param_at(g, TS_GPT_WPE, -1, &po);
	add_rows(g, wpe, po, x0, g->N, g->d, g->T, -1, ph);
	whole_drop(g, TS_GPT_WPE, ph);
	return x0;
}

/* The final LayerNorm: the normalised rows and their statistics into
 * *yf, *stf. */
static void head_norm(struct gpt *g, int xL, int *yf, int *stf, const char *ph)
{
	*yf = dtemp(g, g->L, (uint64_t)g->N * g->d, ph);
	*stf = dtemp(g, g->L, 2 * (uint64_t)g->N, ph);
	ln_fwd(g, xL, TS_GPT_LNF_G, TS_GPT_LNF_B, -1, *yf, *stf, ph);
}

/* head_norm and the tied head's logits [N, V] (into dst, else a temp). */
static int head_forward(struct gpt *g, int xL, int *yf, int *stf, int dst, const char *ph)
{
	uint64_t eo;
	int logits, wte;

	head_norm(g, xL, yf, stf, ph);
	logits = dst >= 0 ? dst : ts__pb_temp(g->b, TS_ROLE_LOGITS, TS_MEM_DEVICE, g->L,
	                                       (uint64_t)g->N * g->V * F32, ph);
	wte = param_at(g, TS_GPT_WTE, -1, &eo);
	ts__pb_gemm(g->b, logits, 0, *yf, 0, false, wte, eo, true, g->N, g->V, g->d, 0.0f, g->L, ph);
	return logits;
}

/* The cross-entropy against the targets; its gradient [N, V] (a temp). */
static int xent(struct gpt *g, int logits)
{
	int loss = ts__pb_temp(g->b, TS_ROLE_LOSS, TS_MEM_DEVICE, -1, ((uint64_t)g->N + 1) * F32,
	                       "loss");
	int gl = ts__pb_temp(g->b, TS_ROLE_G, TS_MEM_DEVICE, g->L, (uint64_t)g->N * g->V * F32,
	                     "loss");
	struct ts_paction *a = op(g, TS_P_XENT, -1, "loss");

	if (a) {
		a->a = logits;
		a->b = g->TGT;
		a->c = loss;
		a->d = gl;
		a->n = (uint64_t)g->N;
	}
	ts__pb_release(g->b, loss, -1, "loss");
	return gl;
}

/* ---- building ------------------------------------------------------------------- */

static int *ints(int n)
{
	int *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);

	for (int i = 0; v && i < n; i++)
		v[i] = -1;
	return v;
}

static ts_status gpt_check(const struct ts_mlp *mlp, int batch, int T,
                           const struct ts_policy *policy, struct ts_error *err)
{
	ts_status st = ts_gpt_check(mlp, err);

	if (st != TS_OK)
		return st;
	if (batch < 1 || batch % T != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCH",
		                    "gpt: a batch is whole windows of %d tokens, not %d tokens",
		                    T, batch);
	return ts_policy_check(policy, err);
}

/* Starts a plan of windows of T tokens; the target ids an argument when
 * targets. */
static ts_status gpt_start(struct gpt *g, struct ts__pb *b, struct ts_plan *out,
                           const struct ts_mlp *mlp, const struct ts_policy *policy, int batch,
                           int T, bool grads_out, bool adam, bool targets)
{
	const struct ts_mlp *m = &out->mlp;
	enum ts_memory_kind pk = policy->params, sk = policy->opt_state;
	uint64_t ib;

	ts__pb_start(b, out, mlp, policy, batch);
	memset(g, 0, sizeof *g);
	g->b = b;
	g->N = batch;
	g->T = T;
	g->B = batch / T;
	out->window = T;
	g->d = mlp->d_model;
	g->H = mlp->heads;
	g->hd = ts_gpt_head_dim(mlp);
	g->F = mlp->d_hidden;
	g->V = mlp->vocab;
	g->L = mlp->layers;
	g->lw = ints((g->L + 1) * NP);
	g->x = ints(g->L + 1);
	g->xh = ints(g->L + 1);
	g->act = malloc((size_t)g->L * sizeof *g->act);
	g->acth = malloc((size_t)g->L * sizeof *g->acth);
	if (!g->lw || !g->x || !g->xh || !g->act || !g->acth)
		b->failed = TS_RESOURCE_EXHAUSTED;
	for (int l = 0; g->act && g->acth && l < g->L; l++)
		g->act[l] = g->acth[l] = ACT_NONE;
	for (int t = 0; t < NP; t++) {
		uint64_t whole = ts_gpt_param_slice(m, (enum ts_gpt_param)t) * F32 *
		                 (ts_gpt_param_per_layer((enum ts_gpt_param)t) ? (uint64_t)g->L : 1);

		g->whole[t] = -1;
		g->W[t] = ts__pb_whole(b, true, ts_gpt_role(0, t), TS_PB_ARGUMENT, pk, whole);
		g->MU[t] = ts__pb_whole(b, adam, ts_gpt_role(1, t), TS_PB_ARGUMENT, sk, whole);
		g->NU[t] = ts__pb_whole(b, adam, ts_gpt_role(2, t), TS_PB_ARGUMENT, sk, whole);
		g->G[t] = ts__pb_whole(b, grads_out, ts_gpt_role(3, t), TS_PB_OUTPUT, TS_MEM_DEVICE,
		                       whole);
	}
	ib = (uint64_t)batch * (uint64_t)m->id_bytes * (uint64_t)out->accumulate;
	g->IN = ts__pb_whole(b, true, TS_ROLE_INPUT, TS_PB_ARGUMENT, TS_MEM_DEVICE, ib);
	g->TGT = ts__pb_whole(b, targets, TS_ROLE_TARGET, TS_PB_ARGUMENT, TS_MEM_DEVICE, ib);
	return b->failed;
}

static void gpt_end(struct gpt *g)
{
	free(g->lw);
	free(g->x);
	free(g->xh);
	free(g->act);
	free(g->acth);
}

/* The forward pass of a step: every block's input and intermediates kept,
 * offloaded or dropped as the policy says. */
static int forward(struct gpt *g)
{
	const struct ts_policy *pol = &g->b->p->policy;
	uint64_t xb = (uint64_t)g->N * g->d * F32;
	int x = embed_forward(g, "forward");

	block_fetch(g, 0, "forward");
	for (int l = 0; l < g->L; l++) {
		int y;
		struct act a = ACT_NONE;

		if (pol->prefetch_depth)
			block_fetch(g, l + 1, "forward");
		y = block_forward(g, l, x, &a, true, "forward");
		act_keep(g, l, &a, "forward");
		if (pol->offload_x) {
			g->xh[l] = ts__pb_temp(g->b, TS_ROLE_X, TS_MEM_PINNED_HOST, l, xb, "forward");
			ts__pb_copy(g->b, g->xh[l], 0, x, 0, xb, l, "forward");
			ts__pb_release(g->b, x, l, "forward");
		} else if (pol->save_x || keeps_any(pol)) {
			g->x[l] = x;       /* a kept block's backward reads its input too */
		} else {
			ts__pb_release(g->b, x, l, "forward");    /* recomputed (x_0 from the ids) */
		}
		block_drop(g, l, "forward");
		if (!pol->prefetch_depth)
			block_fetch(g, l + 1, "forward");
		x = y;
	}
	return x;
}

/* Block l's input for its backward pass: saved, fetched back, or
 * recomputed from the nearest earlier input that exists (x_0 from the ids).
 * *owned: the caller frees it. */
static int backward_input(struct gpt *g, int l, bool *owned)
{
	uint64_t xb = (uint64_t)g->N * g->d * F32;
	int j, x;
	bool own;

	*owned = false;
	if (g->x[l] >= 0)
		return g->x[l];
	*owned = true;
	if (g->xh[l] >= 0) {
		x = ts__pb_temp(g->b, TS_ROLE_X, TS_MEM_DEVICE, l, xb, "backward");
		ts__pb_copy(g->b, x, 0, g->xh[l], 0, xb, l, "backward");
		return x;
	}
	for (j = l - 1; j >= 0 && g->x[j] < 0 && g->xh[j] < 0; j--)
		;
	own = true;
	if (j < 0) {
		x = embed_forward(g, "recompute");
		j = 0;
	} else if (g->x[j] >= 0) {
		x = g->x[j];
		own = false;
	} else {
		x = ts__pb_temp(g->b, TS_ROLE_X, TS_MEM_DEVICE, j, xb, "recompute");
		ts__pb_copy(g->b, x, 0, g->xh[j], 0, xb, j, "recompute");
	}
	for (int k = j; k < l; k++) {
		int y;

		block_fetch(g, k, "recompute");
		y = block_through(g, k, x, "recompute");
		if (own)
			ts__pb_release(g->b, x, k, "recompute");
		block_drop(g, k, "recompute");
		x = y;
		own = true;
	}
	return x;
}

/* The embedding's gradients from dL/dx_0 (freed): wpe's by position, the
 * table's scattered by id and added to the head's. */
static void embed_backward(struct gpt *g, int g0)
{
	uint64_t tb = slice_bytes(g, TS_GPT_WTE);
	int sc = ts__pb_temp(g->b, ts_gpt_role(3, TS_GPT_WTE), TS_MEM_DEVICE, -1, tb, "backward");
	struct ts_paction *a = op(g, TS_P_EMBED_BWD, -1, "backward");

	if (a) {
		a->a = g0;
		a->b = g->IN;
		a->c = sc;
		a->n = (uint64_t)g->N;
	}
	ts__pb_elementwise(g->b, TS_P_ADD, sc, g->G[TS_GPT_WTE], -1, tb / F32, -1, "backward");
	ts__pb_release(g->b, sc, -1, "backward");
	sum_rows(g, g0, g->N, g->d, g->T, g->G[TS_GPT_WPE], 0, -1, "backward");
	ts__pb_release(g->b, g0, 0, "backward");
}

/* The update after the backward pass, once the global norm is known (and
 * every micro-batch's gradient, accumulating). */
static void update_all(struct gpt *g)
{
	const struct ts_plan *p = g->b->p;
	bool sh = ts__pb_grads_sharded(p);
	uint64_t R = sh ? (uint64_t)p->replicas : 1;     /* ZeRO-2: the replica's parts */
	int norm = -1;

	if (p->opt.clip_global_norm > 0 || p->accumulate > 1 || p->replicas > 1) {
		norm = ts__pb_temp(g->b, TS_ROLE_NORM, TS_MEM_DEVICE, -1, F32, "update");
		ts__pb_elementwise(g->b, TS_P_FILL, norm, -1, -1, 1, -1, "update");
		for (int t = 0; t < NP; t++)
			ts__pb_elementwise(g->b, TS_P_SUMSQ, sh ? g->b->sg[t] : g->G[t], norm, -1,
			                   ts_gpt_param_slice(&p->mlp, (enum ts_gpt_param)t) *
			                   (ts_gpt_param_per_layer((enum ts_gpt_param)t) ? g->L : 1) / R,
			                   -1, "update");
		ts__pb_norm_sum(g->b, norm);
	}
	for (int t = 0; t < NP; t++) {
		bool per = ts_gpt_param_per_layer((enum ts_gpt_param)t);

		for (int l = 0; l < (per ? g->L : 1); l++)
			update_slice(g, t, per ? l : -1, sh ? g->b->sg[t] : g->G[t],
			             per ? (uint64_t)l * slice_bytes(g, t) / R : 0, norm, false, "update");
	}
	ts__pb_release(g->b, norm, -1, "update");
}

/* One micro-batch j of a step (plan.h's ts_plan_build_accumulate):
 * forward, loss and backward; its gradients into the whole gradients
 * (micro-batch 0: outputs, whole temps or, fused, per slice as each is
 * made), a later one's into whole temps added into them. */
static void step_micro(struct gpt *g, int j, bool grads_out, bool fused)
{
	struct ts__pb *b = g->b;
	const struct ts_policy *policy = &b->p->policy;
	int xL, yf, stf, logits, gl, gy, dyf, acc[NP], first = b->p->nactions;
	bool sharded = ts__pb_grads_sharded(b->p);

	b->micro = j;
	xL = forward(g);
	logits = head_forward(g, xL, &yf, &stf, -1, "loss");
	gl = xent(g, logits);
	ts__pb_release(b, logits, g->L, "loss");
	/* gradients: outputs (no optimizer), whole temps (clipping,
	 * accumulation), or per slice as each is made (fused updates); the
	 * table's and the final LayerNorm's are whole in every case */
	for (int t = 0; t < NP; t++)
		acc[t] = g->G[t];
	if (!sharded && (j > 0 || (!grads_out && !fused)))
		for (int t = 0; t < NP; t++)
			g->G[t] = ts__pb_temp(b, ts_gpt_role(3, t), TS_MEM_DEVICE, -1,
			                      slice_bytes(g, t) *
			                      (ts_gpt_param_per_layer((enum ts_gpt_param)t) ? g->L : 1),
			                      "backward");
	if (fused || sharded)
		for (int t = 0; t < NP; t++)
			if (!ts_gpt_param_per_layer((enum ts_gpt_param)t))
				g->G[t] = ts__pb_temp(b, ts_gpt_role(3, t), TS_MEM_DEVICE, -1,
				                      slice_bytes(g, t), "loss");
	{
		uint64_t eo;
		int wte = param_at(g, TS_GPT_WTE, -1, &eo);

		ts__pb_gemm(b, g->G[TS_GPT_WTE], 0, gl, 0, true, yf, 0, false, g->V, g->d, g->N, 0.0f,
		            g->L, "loss");
		dyf = dtemp(g, g->L, (uint64_t)g->N * g->d, "loss");
		ts__pb_gemm(b, dyf, 0, gl, 0, false, wte, eo, false, g->N, g->d, g->V, 0.0f, g->L,
		            "loss");
	}
	ts__pb_release(b, gl, g->L, "loss");
	gy = ts__pb_temp(b, TS_ROLE_G, TS_MEM_DEVICE, g->L, (uint64_t)g->N * g->d * F32, "loss");
	ln_bwd(g, xL, TS_GPT_LNF_G, -1, stf, dyf, gy, g->G[TS_GPT_LNF_G], 0, g->G[TS_GPT_LNF_B], 0,
	       "loss");
	ts__pb_release(b, dyf, g->L, "loss");
	ts__pb_release(b, yf, g->L, "loss");
	ts__pb_release(b, stf, g->L, "loss");
	ts__pb_release(b, xL, g->L, "loss");
	if (fused) {
		update_slice(g, TS_GPT_LNF_G, -1, g->G[TS_GPT_LNF_G], 0, -1, true, "loss");
		update_slice(g, TS_GPT_LNF_B, -1, g->G[TS_GPT_LNF_B], 0, -1, true, "loss");
		ts__pb_release(b, g->G[TS_GPT_LNF_G], -1, "loss");
		ts__pb_release(b, g->G[TS_GPT_LNF_B], -1, "loss");
		whole_drop(g, TS_GPT_LNF_G, "loss");
		whole_drop(g, TS_GPT_LNF_B, "loss");
	} else if (sharded) {
		scatter(g, TS_GPT_LNF_G, -1, g->G[TS_GPT_LNF_G], "loss");
		scatter(g, TS_GPT_LNF_B, -1, g->G[TS_GPT_LNF_B], "loss");
		g->G[TS_GPT_LNF_G] = g->G[TS_GPT_LNF_B] = -1;
	} else {
		ts__pb_grad_ready(b, g->G[TS_GPT_LNF_G], 0, slice_bytes(g, TS_GPT_LNF_G) / F32, g->L);
		ts__pb_grad_ready(b, g->G[TS_GPT_LNF_B], 0, slice_bytes(g, TS_GPT_LNF_B) / F32, g->L);
	}
	/* the blocks, last first */
	block_fetch(g, g->L - 1, "backward");
	for (int l = g->L - 1; l >= 0; l--) {
		bool owned;
		int x;

		if (policy->prefetch_depth)
			block_fetch(g, l - 1, "backward");
		x = backward_input(g, l, &owned);
		block_fetch(g, l, "backward");      /* recompute may have dropped it */
		act_fetch(g, l, "backward");
		block_forward(g, l, x, &g->act[l], false, "recompute");
		gy = block_backward(g, l, x, &g->act[l], gy, fused);
		if (owned || g->x[l] >= 0)
			ts__pb_release(b, x, l, "backward");
		g->x[l] = -1;
		ts__pb_release(b, g->xh[l], l, "backward");
		g->xh[l] = -1;
		block_drop(g, l, "backward");
		if (!policy->prefetch_depth)
			block_fetch(g, l - 1, "backward");
	}
	embed_backward(g, gy);
	if (fused) {
		update_slice(g, TS_GPT_WTE, -1, g->G[TS_GPT_WTE], 0, -1, true, "backward");
		update_slice(g, TS_GPT_WPE, -1, g->G[TS_GPT_WPE], 0, -1, false, "backward");
		ts__pb_release(b, g->G[TS_GPT_WTE], -1, "backward");
		ts__pb_release(b, g->G[TS_GPT_WPE], -1, "backward");
	} else if (sharded) {
		scatter(g, TS_GPT_WTE, -1, g->G[TS_GPT_WTE], "backward");
		scatter(g, TS_GPT_WPE, -1, g->G[TS_GPT_WPE], "backward");
		g->G[TS_GPT_WTE] = g->G[TS_GPT_WPE] = -1;
	} else {
		ts__pb_grad_ready(b, g->G[TS_GPT_WTE], 0, slice_bytes(g, TS_GPT_WTE) / F32, 0);
		ts__pb_grad_ready(b, g->G[TS_GPT_WPE], 0, slice_bytes(g, TS_GPT_WPE) / F32, 0);
	}
	ts__pb_micro(b, first, j, g->IN, g->TGT);
	for (int t = 0; j > 0 && !sharded && !b->failed && t < NP; t++) {
		ts__pb_accumulate(b, acc[t], g->G[t], b->p->bufs[acc[t]].bytes / F32, "accumulate");
		g->G[t] = acc[t];
	}
}

ts_status ts__plan_build_gpt(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                             int accumulate, int replicas, int zero,
                             const struct ts_policy *policy,
                             struct ts_plan *out, struct ts_error *err)
{
	struct ts__pb b;
	struct gpt g;
	bool grads_out = opt->type == TS_OPT_NONE, fused;
	ts_status st;

	memset(out, 0, sizeof *out);
	st = gpt_check(mlp, batch, mlp->context, policy, err);
	if (st != TS_OK)
		return st;
	out->opt = *opt;
	out->accumulate = accumulate;
	out->replicas = replicas;
	out->shard_state = zero >= 1;
	out->shard_grads = zero >= 2;
	gpt_start(&g, &b, out, mlp, policy, batch, mlp->context, grads_out,
	          opt->type == TS_OPT_ADAM, true);
	fused = ts__pb_update_fused(out);
	ts__pb_norm_begin(&b);
	for (int j = 0; j < accumulate && !b.failed; j++)
		step_micro(&g, j, grads_out, fused);
	for (int t = 0; (accumulate > 1 || replicas > 1) && !b.failed && t < NP; t++) {
		int G = ts__pb_grads_sharded(out) ? b.sg[t] : g.G[t];

		if (G >= 0)
			ts__pb_mean(&b, G, out->bufs[G].bytes / F32, "accumulate");
	}
	if (!fused && !grads_out) {
		for (int t = 0; t < NP; t++)        /* the update fetches what it updates */
			whole_drop(&g, t, "update");
		update_all(&g);
		for (int t = 0; t < NP; t++) {
			ts__pb_release(&b, g.G[t], -1, "update");
			ts__pb_release(&b, b.sg[t], -1, "update");
		}
	}
	for (int t = 0; t < NP; t++)
		whole_drop(&g, t, "update");
	gpt_end(&g);
	return ts__pb_finish(&b, "step", err);
}

/* The tied head on the last row of each window of the final LayerNorm's
 * rows yf: B products [1, d] x [d, V] into dst (a device buffer of [B, V]
 * floats). */
static void head_last(struct gpt *g, int yf, int dst, const char *ph)
{
	uint64_t eo, row = (uint64_t)g->d * F32, lrow = (uint64_t)g->V * F32;
	int wte = param_at(g, TS_GPT_WTE, -1, &eo);

	for (int w = 0; w < g->B; w++)
		ts__pb_gemm(g->b, dst, (uint64_t)w * lrow, yf,
		            ((uint64_t)w * g->T + (uint64_t)g->T - 1) * row, false, wte, eo, true, 1,
		            g->V, g->d, 0.0f, g->L, ph);
}

/* An evaluation's head: the logits of every row (the loss's, and the
 * outputs unless last) and, with last, each window's last row's into the
 * outputs; the cross-entropy against the targets when there are targets.
 * OUT (-1: none) is the outputs' buffer in kind. */
static void eval_head(struct gpt *g, int x, int OUT, enum ts_memory_kind kind)
{
	const struct ts_plan *p = g->b->p;
	int all = -1, yf, stf, gl, dst;
	uint64_t ob;

	if (!p->no_targets || !p->last)
		all = head_forward(g, x, &yf, &stf,
		                   OUT >= 0 && kind == TS_MEM_DEVICE && !p->last ? OUT : -1, "loss");
	else
		head_norm(g, x, &yf, &stf, "loss");
	if (p->last && OUT >= 0) {
		ob = (uint64_t)g->B * g->V * F32;
		dst = kind == TS_MEM_DEVICE ? OUT
		      : ts__pb_temp(g->b, TS_ROLE_LOGITS, TS_MEM_DEVICE, g->L, ob, "outputs");
		head_last(g, yf, dst, "outputs");
		if (dst != OUT) {
			ts__pb_copy(g->b, OUT, 0, dst, 0, ob, g->L, "outputs");
			ts__pb_release(g->b, dst, g->L, "outputs");
		}
	}
	ts__pb_release(g->b, yf, g->L, "loss");
	ts__pb_release(g->b, stf, g->L, "loss");
	ts__pb_release(g->b, x, g->L, "loss");
	if (all < 0)
		return;
	if (!p->no_targets) {
		gl = xent(g, all);
		ts__pb_release(g->b, gl, g->L, "loss");
	}
	ob = (uint64_t)g->N * g->V * F32;
	if (OUT >= 0 && !p->last && kind != TS_MEM_DEVICE)
		ts__pb_copy(g->b, OUT, 0, all, 0, ob, g->L, "outputs");
	if (all != OUT)
		ts__pb_release(g->b, all, g->L, "outputs");
}

ts_status ts__plan_build_gpt_eval(const struct ts_mlp *mlp, int batch,
                                  const struct ts_policy *policy,
                                  const struct ts_eval_spec *spec, struct ts_plan *out,
                                  struct ts_error *err)
{
	struct ts__pb b;
	struct gpt g;
	struct ts_policy pol = *policy;
	int x, OUT = -1, T = spec->window ? spec->window : mlp->context;
	uint64_t ob;
	ts_status st;

	memset(out, 0, sizeof *out);
	pol.save_x = pol.save_h = pol.offload_x = pol.offload_h = false;
	pol.save_acts = pol.offload_acts = 0;
	st = gpt_check(mlp, batch, T, &pol, err);
	if (st != TS_OK)
		return st;
	if (spec->outputs && spec->outputs_kind != TS_MEM_DEVICE &&
	    spec->outputs_kind != TS_MEM_PINNED_HOST)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "outputs live on device or pinned_host, not '%s'",
		                    ts_memory_kind_name(spec->outputs_kind));
	out->opt = (struct ts_optimizer){.type = TS_OPT_NONE};
	gpt_start(&g, &b, out, mlp, &pol, batch, T, false, false, !spec->no_targets);
	out->evaluate = true;
	out->no_targets = spec->no_targets;
	out->last = spec->last;
	ob = (uint64_t)(spec->last ? batch / T : batch) * (uint64_t)mlp->vocab * F32;
	if (spec->outputs)
		OUT = ts__pb_buf(&b, TS_ROLE_OUTPUT, TS_PB_OUTPUT, spec->outputs_kind, -1, ob);
	x = embed_forward(&g, "forward");
	block_fetch(&g, 0, "forward");
	for (int l = 0; l < g.L; l++) {
		int y;

		if (pol.prefetch_depth)
			block_fetch(&g, l + 1, "forward");
		y = block_through(&g, l, x, "forward");
		ts__pb_release(&b, x, l, "forward");
		block_drop(&g, l, "forward");
		if (!pol.prefetch_depth)
			block_fetch(&g, l + 1, "forward");
		x = y;
	}
	eval_head(&g, x, OUT, spec->outputs_kind);
	for (int t = 0; t < NP; t++)
		whole_drop(&g, t, "outputs");
	gpt_end(&g);
	return ts__pb_finish(&b, "evaluation", err);
}
