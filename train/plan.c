/*
 * plan.c - building a step's or an evaluation's schedule (plan.h).
 *
 * The builder emits actions in execution order through a small state
 * machine per layer (forward, loss, backward, update); every device buffer
 * it allocates it also frees, so the live-bytes curve it records is the one
 * the executor's allocator will see. Where the temps go and the analysis
 * read from them are place.c's.
 */
#include "train/plan.h"
#include "train/place.h"
#include "train/plan_int.h"

#include <stdlib.h>
#include <string.h>

int ts__pb_buf(struct ts__pb *b, enum ts_pbuf_role role, enum ts_pbuf_class cls,
                   enum ts_memory_kind kind, int layer, uint64_t bytes)
{
	struct ts_plan *p = b->p;

	if (b->failed)
		return -1;
	if (p->nbufs == b->cap_bufs) {
		int cap = b->cap_bufs ? b->cap_bufs * 2 : 64;
		struct ts_pbuf *g = realloc(p->bufs, (size_t)cap * sizeof *g);

		if (!g) {
			b->failed = TS_RESOURCE_EXHAUSTED;
			return -1;
		}
		p->bufs = g;
		b->cap_bufs = cap;
	}
	p->bufs[p->nbufs] = (struct ts_pbuf){.role = role, .cls = cls, .kind = kind,
	                                     .layer = layer, .bytes = bytes};
	return p->nbufs++;
}

struct ts_paction *ts__pb_emit(struct ts__pb *b, enum ts_pop op, int layer, const char *phase)
{
	struct ts_plan *p = b->p;

	if (b->failed)
		return NULL;
	if (p->nactions == b->cap_actions) {
		int cap = b->cap_actions ? b->cap_actions * 2 : 256;
		struct ts_paction *g = realloc(p->actions, (size_t)cap * sizeof *g);

		if (!g) {
			b->failed = TS_RESOURCE_EXHAUSTED;
			return NULL;
		}
		p->actions = g;
		b->cap_actions = cap;
	}
	p->actions[p->nactions] = (struct ts_paction){.op = op, .a = -1, .b = -1, .c = -1,
	                                              .d = -1, .e = -1, .f = -1, .g = -1,
	                                              .layer = layer,
	                                              .phase = phase};
	return &p->actions[p->nactions++];
}

/* A temp buffer allocated now. */
int ts__pb_temp(struct ts__pb *b, enum ts_pbuf_role role, enum ts_memory_kind kind, int layer,
                uint64_t bytes, const char *phase)
{
	int i = ts__pb_buf(b, role, TS_PB_TEMP, kind, layer, bytes);
	struct ts_paction *a = ts__pb_emit(b, TS_P_ALLOC, layer, phase);

	if (a)
		a->a = i;
	return i;
}

void ts__pb_release(struct ts__pb *b, int buf, int layer, const char *phase)
{
	struct ts_paction *a;

	if (buf < 0)
		return;
	a = ts__pb_emit(b, TS_P_FREE, layer, phase);
	if (a)
		a->a = buf;
}

/* The loss kernel on x (n floats) against the targets; returns its
 * gradient (a temp of xb bytes of layer L). The loss value goes back to the
 * host at once (the executor reads it after the kernel): its buffer lives
 * through the loss phase only. */
static int emit_loss(struct ts__pb *b, int x, uint64_t n, uint64_t xb, int L)
{
	int loss = ts__pb_temp(b, TS_ROLE_LOSS, TS_MEM_DEVICE, -1, F32, "loss");
	int g = ts__pb_temp(b, TS_ROLE_G, TS_MEM_DEVICE, L, xb, "loss");
	struct ts_paction *a = ts__pb_emit(b, TS_P_LOSS, -1, "loss");

	if (a) {
		a->a = x;
		a->b = b->TGT;
		a->c = loss;
		a->d = g;
		a->n = n;
	}
	ts__pb_release(b, loss, -1, "loss");
	return g;
}

void ts__pb_copy(struct ts__pb *b, int dst, uint64_t doff, int src, uint64_t soff,
                 uint64_t bytes, int layer, const char *phase)
{
	struct ts_paction *a = ts__pb_emit(b, TS_P_COPY, layer, phase);

	if (!a)
		return;
	a->a = dst;
	a->b = src;
	a->aoff = doff;
	a->boff = soff;
	a->bytes = bytes;
	a = ts__pb_emit(b, TS_P_WAIT, layer, phase);
	if (a)
		a->a = dst;
}

int ts__pb_round(struct ts__pb *b, int src, uint64_t soff, uint64_t n, int layer,
                 const char *phase)
{
	int t = ts__pb_temp(b, TS_ROLE_LOWP, TS_MEM_DEVICE, layer, n * LOWP, phase);
	struct ts_paction *x = ts__pb_emit(b, TS_P_ROUND, layer, phase);

	if (x) {
		x->a = src;
		x->aoff = soff;
		x->b = t;
		x->n = n;
	}
	return t;
}

/* c (+coff) = op(a) @ op(b) (+ beta c): one GEMM, or with a 16-bit compute
 * dtype the two rounded copies, the GEMM on them, and their release. */
void ts__pb_gemm(struct ts__pb *b, int c, uint64_t coff, int a_, uint64_t aoff, bool ta, int b_,
                 uint64_t boff, bool tb, int M, int N, int K, float beta, int layer,
                 const char *phase)
{
	bool lowp = ts_mlp_lowp(&b->p->mlp) && M > 0 && N > 0 && K > 0;
	int ra = -1, rb = -1;
	struct ts_paction *x;

	if (lowp) {
		ra = ts__pb_round(b, a_, aoff, (uint64_t)M * (uint64_t)K, layer, phase);
		rb = ts__pb_round(b, b_, boff, (uint64_t)K * (uint64_t)N, layer, phase);
		a_ = ra;
		b_ = rb;
		aoff = boff = 0;
	}
	x = ts__pb_emit(b, lowp ? TS_P_GEMM_LP : TS_P_GEMM, layer, phase);
	if (x) {
		x->a = a_;
		x->aoff = aoff;
		x->b = b_;
		x->boff = boff;
		x->c = c;
		x->coff = coff;
		x->ta = ta;
		x->tb = tb;
		x->M = M;
		x->N = N;
		x->K = K;
		x->beta = beta;
	}
	ts__pb_release(b, ra, layer, phase);
	ts__pb_release(b, rb, layer, phase);
}

void ts__pb_elementwise(struct ts__pb *b, enum ts_pop op, int a_, int b_, int c, uint64_t n,
                        int layer, const char *phase)
{
	struct ts_paction *x = ts__pb_emit(b, op, layer, phase);

	if (!x)
		return;
	x->a = a_;
	x->b = b_;
	x->c = c;
	x->n = n;
}

/* ---- parameters of one layer --------------------------------------------- */

static uint64_t w1_bytes(const struct ts_plan *p)
{
	return (uint64_t)p->mlp.d_model * (uint64_t)ts_mlp_hidden(&p->mlp) * F32;
}

/* Issues the device copies of layer l's streamed params (no-op on device). */
static void params_fetch(struct ts__pb *b, int l, const char *phase)
{
	const struct ts_plan *p = b->p;
	uint64_t n = w1_bytes(p);

	if (p->policy.params == TS_MEM_DEVICE || l < 0 || l >= p->mlp.layers || b->w1[l] >= 0)
		return;
	b->w1[l] = ts__pb_temp(b, TS_ROLE_W1, TS_MEM_DEVICE, l, n, phase);
	ts__pb_copy(b, b->w1[l], 0, b->W1, (uint64_t)l * n, n, l, phase);
	if (ts_mlp_has_w2(&p->mlp)) {
		b->w2[l] = ts__pb_temp(b, TS_ROLE_W2, TS_MEM_DEVICE, l, n, phase);
		ts__pb_copy(b, b->w2[l], 0, b->W2, (uint64_t)l * n, n, l, phase);
	}
}

static void params_drop(struct ts__pb *b, int l, const char *phase)
{
	if (b->p->policy.params == TS_MEM_DEVICE)
		return;
	ts__pb_release(b, b->w1[l], l, phase);
	ts__pb_release(b, b->w2[l], l, phase);
	b->w1[l] = b->w2[l] = -1;
}

/* Where layer l's w1 / w2 are: a buffer and an offset into it. */
static int w1_at(struct ts__pb *b, int l, uint64_t *off)
{
	if (b->p->policy.params == TS_MEM_DEVICE) {
		*off = (uint64_t)l * w1_bytes(b->p);
		return b->W1;
	}
	*off = 0;
	return b->w1[l];
}

static int w2_at(struct ts__pb *b, int l, uint64_t *off)
{
	if (b->p->policy.params == TS_MEM_DEVICE) {
		*off = (uint64_t)l * w1_bytes(b->p);
		return b->W2;
	}
	*off = 0;
	return b->w2[l];
}

/* ---- one layer forward ------------------------------------------------------ */

/*
 * Runs layer l forward from buffer x (offset 0): returns the new device
 * buffer holding x_{l+1}; keeps h in *h_out when keep_h (else frees it).
 */
static int layer_forward_into(struct ts__pb *b, int l, int x, int y_dst, bool keep_h,
                              int *h_out, const char *phase);

static int layer_forward(struct ts__pb *b, int l, int x, bool keep_h, int *h_out,
                         const char *phase)
{
	return layer_forward_into(b, l, x, -1, keep_h, h_out, phase);
}

/* The same, writing x_{l+1} into the device buffer y_dst (an argument or
 * output, offset 0) instead of a new temp when y_dst >= 0. */
static int layer_forward_into(struct ts__pb *b, int l, int x, int y_dst, bool keep_h,
                              int *h_out, const char *phase)
{
	const struct ts_plan *p = b->p;
	int B = p->batch, d = p->mlp.d_model, H = ts_mlp_hidden(&p->mlp);
	uint64_t xb = (uint64_t)B * d * F32, hb = (uint64_t)B * H * F32, o1, o2;
	int h, a, y, w1, w2;

	w1 = w1_at(b, l, &o1);
	h = ts__pb_temp(b, TS_ROLE_H, TS_MEM_DEVICE, l, hb, phase);
	ts__pb_gemm(b, h, 0, x, 0, false, w1, o1, false, B, H, d, 0.0f, l, phase);
	y = y_dst >= 0 ? y_dst : ts__pb_temp(b, TS_ROLE_X, TS_MEM_DEVICE, l + 1, xb, phase);
	if (ts_mlp_has_w2(&p->mlp)) {
		a = keep_h ? ts__pb_temp(b, TS_ROLE_A, TS_MEM_DEVICE, l, hb, phase) : h;
		ts__pb_elementwise(b, TS_P_ACT_FWD, h, a, -1, (uint64_t)B * H, l, phase);
		w2 = w2_at(b, l, &o2);
		ts__pb_gemm(b, y, 0, a, 0, false, w2, o2, false, B, d, H, 0.0f, l, phase);
		if (a != h)
			ts__pb_release(b, a, l, phase);
	} else {
		ts__pb_elementwise(b, TS_P_ACT_FWD, h, y, -1, (uint64_t)B * H, l, phase);
	}
	if (p->mlp.residual)
		ts__pb_elementwise(b, TS_P_ADD, x, y, -1, (uint64_t)B * d, l, phase);
	if (keep_h) {
		*h_out = h;
	} else {
		ts__pb_release(b, h, l, phase);
		*h_out = -1;
	}
	return y;
}

/* ---- the step ------------------------------------------------------------------ */

static void forward(struct ts__pb *b, int *xL)
{
	const struct ts_plan *p = b->p;
	const struct ts_policy *pol = &p->policy;
	int L = p->mlp.layers;
	uint64_t xb = (uint64_t)p->batch * p->mlp.d_model * F32;
	uint64_t hb = (uint64_t)p->batch * ts_mlp_hidden(&p->mlp) * F32;
	int x = b->x0 >= 0 ? b->x0 : b->IN;

	b->x[0] = x;
	params_fetch(b, 0, "forward");
	for (int l = 0; l < L; l++) {
		int h, y;

		if (pol->prefetch_depth)
			params_fetch(b, l + 1, "forward");
		y = layer_forward(b, l, x, pol->save_h || pol->offload_h, &h, "forward");
		if (pol->offload_h) {
			b->hh[l] = ts__pb_temp(b, TS_ROLE_H, TS_MEM_PINNED_HOST, l, hb, "forward");
			ts__pb_copy(b, b->hh[l], 0, h, 0, hb, l, "forward");
			ts__pb_release(b, h, l, "forward");
		} else if (pol->save_h) {
			b->h[l] = h;
		}
		/* the layer's input: the argument stays; others are kept, offloaded or dropped */
		if (l > 0) {
			if (pol->offload_x) {
				b->xh[l] = ts__pb_temp(b, TS_ROLE_X, TS_MEM_PINNED_HOST, l, xb, "forward");
				ts__pb_copy(b, b->xh[l], 0, x, 0, xb, l, "forward");
				ts__pb_release(b, x, l, "forward");
				b->x[l] = -1;
			} else if (pol->save_x) {
				b->x[l] = x;
			} else {
				ts__pb_release(b, x, l, "forward");
				b->x[l] = -1;
			}
		}
		/* prefetching, the last layer's streamed weights stay for the
		 * backward pass, which starts with them (a token model's loss,
		 * whose projection and logits may outweigh them, runs without) */
		if (l < L - 1 || !pol->prefetch_depth || ts_mlp_tokens(&p->mlp))
			params_drop(b, l, "forward");
		if (!pol->prefetch_depth)
			params_fetch(b, l + 1, "forward");
		x = y;
	}
	*xL = x;
}

/* A device buffer holding x_l for the backward pass: saved, fetched back
 * from pinned_host, or recomputed forward from the nearest earlier input
 * that exists (x_0, the argument, always does). *temp_out says whether the
 * caller frees it. */
static int backward_input(struct ts__pb *b, int l, bool *temp_out)
{
	const struct ts_plan *p = b->p;
	uint64_t xb = (uint64_t)p->batch * p->mlp.d_model * F32;
	bool owned;
	int j, x, h;

	*temp_out = false;
	if (b->x[l] >= 0)
		return b->x[l];
	*temp_out = true;
	if (b->xh[l] >= 0) {
		x = ts__pb_temp(b, TS_ROLE_X, TS_MEM_DEVICE, l, xb, "backward");
		ts__pb_copy(b, x, 0, b->xh[l], 0, xb, l, "backward");
		return x;
	}
	for (j = l - 1; j > 0 && b->x[j] < 0 && b->xh[j] < 0; j--)
		;
	owned = b->x[j] < 0;
	if (owned) {
		x = ts__pb_temp(b, TS_ROLE_X, TS_MEM_DEVICE, j, xb, "recompute");
		ts__pb_copy(b, x, 0, b->xh[j], 0, xb, j, "recompute");
	} else {
		x = b->x[j];
	}
	for (int k = j; k < l; k++) {
		int y;

		params_fetch(b, k, "recompute");
		y = layer_forward(b, k, x, false, &h, "recompute");
		if (owned)
			ts__pb_release(b, x, k, "recompute");
		params_drop(b, k, "recompute");
		x = y;
		owned = true;
	}
	return x;
}

static void update_one(struct ts__pb *b, int l, int k, int G, uint64_t goff, int norm,
                       int fused, const char *phase);

/* Whether each layer's update runs right after its backward (no clipping:
 * no global norm to wait for; no accumulation: no later micro-batch), so
 * gradients exist one layer at a time. */
bool ts__pb_update_fused(const struct ts_plan *p)
{
	return p->opt.type != TS_OPT_NONE && !(p->opt.clip_global_norm > 0) && p->accumulate <= 1 &&
	       p->replicas <= 1;
}

void ts__pb_norm_begin(struct ts__pb *b)
{
	if (!ts__pb_update_fused(b->p) || b->norm >= 0)
		return;
	b->norm = ts__pb_temp(b, TS_ROLE_NORM, TS_MEM_DEVICE, -1, F32, "forward");
	ts__pb_elementwise(b, TS_P_FILL, b->norm, -1, -1, 1, -1, "forward");
	b->p->norm_after = b->norm >= 0;
}

static int backward(struct ts__pb *b, int g)
{
	const struct ts_plan *p = b->p;
	const struct ts_policy *pol = &p->policy;
	int L = p->mlp.layers, B = p->batch, d = p->mlp.d_model, H = ts_mlp_hidden(&p->mlp);
	uint64_t xb = (uint64_t)B * d * F32, hb = (uint64_t)B * H * F32, wb = w1_bytes(p);
	bool fused = ts__pb_update_fused(p), sharded = ts__pb_grads_sharded(p);
	uint64_t R = (uint64_t)p->replicas;

	params_fetch(b, L - 1, "backward");
	for (int l = L - 1; l >= 0; l--) {
		bool x_temp;
		int x, h, A, gx = -1, w1, w2, G1 = b->G1, G2 = b->G2;
		uint64_t o1, o2, goff = (uint64_t)l * wb;

		if (pol->prefetch_depth)
			params_fetch(b, l - 1, "backward");
		x = backward_input(b, l, &x_temp);
		params_fetch(b, l, "backward");     /* recompute may have dropped it */
		w1 = w1_at(b, l, &o1);
		if (b->h[l] >= 0) {
			h = b->h[l];
		} else if (b->hh[l] >= 0) {
			h = ts__pb_temp(b, TS_ROLE_H, TS_MEM_DEVICE, l, hb, "backward");
			ts__pb_copy(b, h, 0, b->hh[l], 0, hb, l, "backward");
		} else {
			h = ts__pb_temp(b, TS_ROLE_H, TS_MEM_DEVICE, l, hb, "backward");
			ts__pb_gemm(b, h, 0, x, 0, false, w1, o1, false, B, H, d, 0.0f, l, "backward");
		}
		if (fused || sharded) {    /* this layer's gradients only */
			G1 = ts__pb_temp(b, TS_ROLE_GRAD_W1, TS_MEM_DEVICE, l, wb, "backward");
			G2 = ts_mlp_has_w2(&p->mlp) ? ts__pb_temp(b, TS_ROLE_GRAD_W2, TS_MEM_DEVICE, l, wb,
			                                   "backward") : -1;
			goff = 0;
		}
		A = ts__pb_temp(b, TS_ROLE_A, TS_MEM_DEVICE, l, hb, "backward");
		if (ts_mlp_has_w2(&p->mlp)) {
			w2 = w2_at(b, l, &o2);
			ts__pb_elementwise(b, TS_P_ACT_FWD, h, A, -1, (uint64_t)B * H, l, "backward");
			ts__pb_gemm(b, G2, goff, A, 0, true, g, 0, false, H, d, B, 0.0f, l, "backward");
			ts__pb_gemm(b, A, 0, g, 0, false, w2, o2, true, B, H, d, 0.0f, l, "backward");
			ts__pb_elementwise(b, TS_P_ACT_BWD, h, A, A, (uint64_t)B * H, l, "backward");
		} else {
			ts__pb_elementwise(b, TS_P_ACT_BWD, h, g, A, (uint64_t)B * H, l, "backward");
		}
		ts__pb_release(b, h, l, "backward");
		b->h[l] = -1;
		ts__pb_gemm(b, G1, goff, x, 0, true, A, 0, false, d, H, B, 0.0f, l, "backward");
		if (l > 0 || b->x0 >= 0) {     /* token models: x_0's gradient too */
			gx = ts__pb_temp(b, TS_ROLE_GX, TS_MEM_DEVICE, l, xb, "backward");
			ts__pb_gemm(b, gx, 0, A, 0, false, w1, o1, true, B, d, H, 0.0f, l, "backward");
			if (p->mlp.residual)
				ts__pb_elementwise(b, TS_P_ADD, g, gx, -1, (uint64_t)B * d, l, "backward");
		}
		ts__pb_release(b, A, l, "backward");
		ts__pb_release(b, g, l, "backward");
		g = gx;
		if (fused) {          /* the layer's weights are used no more: update them now */
			update_one(b, l, 0, G1, 0, -1, b->w1[l], "backward");
			if (G2 >= 0)
				update_one(b, l, 1, G2, 0, -1, b->w2[l], "backward");
			ts__pb_release(b, G1, l, "backward");
			ts__pb_release(b, G2, l, "backward");
		} else if (sharded) { /* ZeRO-2: into this replica's parts, at once */
			ts__pb_scatter(b, 0, TS_ROLE_GRAD_W1, wb * (uint64_t)L / R, G1, wb / F32,
			               (uint64_t)l * wb / R, l, "backward");
			ts__pb_scatter(b, 1, TS_ROLE_GRAD_W2, wb * (uint64_t)L / R, G2, wb / F32,
			               (uint64_t)l * wb / R, l, "backward");
		} else {            /* data parallel: all-reduced as made */
			ts__pb_grad_ready(b, G1, goff, wb / F32, l);
			ts__pb_grad_ready(b, G2, goff, wb / F32, l);
		}
		if (x_temp || ((l > 0 || b->x0 >= 0) && b->x[l] >= 0))
			ts__pb_release(b, x, l, "backward");
		b->x[l] = l == 0 && b->x0 < 0 ? b->IN : -1;
		ts__pb_release(b, b->xh[l], l, "backward");
		ts__pb_release(b, b->hh[l], l, "backward");
		b->xh[l] = b->hh[l] = -1;
		params_drop(b, l, "backward");
		if (!pol->prefetch_depth)
			params_fetch(b, l - 1, "backward");
	}
	return g;
}

/*
 * Updates parameter k (0: w1, 1: w2) of layer l from its gradient G
 * (+goff). The parameter's device copy is `fused` when the backward pass
 * still holds it (params on the host, update fused into backward), else it
 * is the device slice or a copy fetched here. Streamed optimizer state comes
 * in, is updated, and goes back; a host parameter is written back.
 */

static void update_one(struct ts__pb *b, int l, int k, int G, uint64_t goff, int norm,
                       int fused, const char *phase)
{
	uint64_t wb = w1_bytes(b->p);
	struct ts__pb_param pr = {
		.W = k ? b->W2 : b->W1, .MU = k ? b->MU2 : b->MU1, .NU = k ? b->NU2 : b->NU1,
		.off = (uint64_t)l * wb, .bytes = wb,
		.rw = k ? TS_ROLE_W2 : TS_ROLE_W1, .rmu = k ? TS_ROLE_MU_W2 : TS_ROLE_MU_W1,
		.rnu = k ? TS_ROLE_NU_W2 : TS_ROLE_NU_W1,
	};

	ts__pb_update_param(b, &pr, l, G, goff, norm, fused, phase);
}

/* The table (k 0) or projection (k 1) of a token model as a param_ref. */
static struct ts__pb_param token_param(const struct ts__pb *b, int k)
{
	uint64_t bytes = (uint64_t)b->p->mlp.vocab * (uint64_t)b->p->mlp.d_model * F32;

	return (struct ts__pb_param){
		.W = k ? b->PRJ : b->EMB, .MU = k ? b->MUP : b->MUE, .NU = k ? b->NUP : b->NUE,
		.off = 0, .bytes = bytes,
		.rw = k ? TS_ROLE_PROJ : TS_ROLE_EMBED, .rmu = k ? TS_ROLE_MU_PROJ : TS_ROLE_MU_EMBED,
		.rnu = k ? TS_ROLE_NU_PROJ : TS_ROLE_NU_EMBED,
	};
}

void ts__pb_update_param(struct ts__pb *b, const struct ts__pb_param *pr, int l, int G,
                         uint64_t goff, int norm, int fused, const char *phase)
{
	const struct ts_plan *p = b->p;
	uint64_t wb = pr->bytes, n = wb / F32;
	bool adam = p->opt.type == TS_OPT_ADAM;
	bool host_p = p->policy.params != TS_MEM_DEVICE, host_s = p->policy.opt_state != TS_MEM_DEVICE;
	int W = pr->W, MU = pr->MU, NU = pr->NU;
	int pbuf = W, mu = MU, nu = NU;
	uint64_t poff = pr->off, soff = poff;
	struct ts_paction *u;

	if (host_p && fused >= 0) {
		pbuf = fused;
		poff = 0;
	} else if (host_p) {
		pbuf = ts__pb_temp(b, pr->rw, TS_MEM_DEVICE, l, wb, phase);
		ts__pb_copy(b, pbuf, 0, W, poff, wb, l, phase);
		poff = 0;
	}
	if (adam && host_s) {
		mu = ts__pb_temp(b, pr->rmu, TS_MEM_DEVICE, l, wb, phase);
		ts__pb_copy(b, mu, 0, MU, soff, wb, l, phase);
		nu = ts__pb_temp(b, pr->rnu, TS_MEM_DEVICE, l, wb, phase);
		ts__pb_copy(b, nu, 0, NU, soff, wb, l, phase);
	}
	if (norm < 0 && b->norm >= 0) {
		/* fused: the gradient's squares into the step's global norm */
		struct ts_paction *q = ts__pb_emit(b, TS_P_SUMSQ, l, phase);

		if (q) {
			q->a = G;
			q->aoff = goff;
			q->b = b->norm;
			q->n = n;
		}
	}
	u = ts__pb_emit(b, TS_P_UPDATE, l, phase);
	if (u && p->shard_state) {
		/* ZeRO-1: this replica's part of the n elements, then every part
		 * gathered into every replica (plan.h's ts_plan_build_zero) */
		uint64_t part = n / (uint64_t)p->replicas;
		struct ts_paction *ag;

		u->a = pbuf;
		u->aoff = poff;
		u->b = G;
		u->boff = goff;
		u->c = mu;
		u->d = nu;
		u->coff = soff / (uint64_t)p->replicas;
		u->e = norm;
		u->n = part;
		u->rank_slice = true;
		u->no_decay = pr->no_decay;
		ag = ts__pb_emit(b, TS_P_ALLGATHER, l, phase);
		if (ag) {
			ag->a = pbuf;
			ag->aoff = poff;
			ag->n = part;
		}
		return;
	}
	if (u) {
		u->a = pbuf;
		u->aoff = poff;
		u->b = G;
		u->boff = goff;
		u->c = adam ? mu : -1;
		u->coff = adam && !host_s ? soff : 0;
		u->d = adam ? nu : -1;
		u->n = n;
		u->e = norm;
		u->no_decay = pr->no_decay;
	}
	if (host_p) {
		ts__pb_copy(b, W, pr->off, pbuf, 0, wb, l, phase);
		if (fused < 0)
			ts__pb_release(b, pbuf, l, phase);
	}
	if (adam && host_s) {
		ts__pb_copy(b, MU, soff, mu, 0, wb, l, phase);
		ts__pb_copy(b, NU, soff, nu, 0, wb, l, phase);
		ts__pb_release(b, mu, l, phase);
		ts__pb_release(b, nu, l, phase);
	}
}

/* The update after the backward pass (needed when the global norm of all
 * gradients must be known first: clipping; or every micro-batch's
 * gradient: accumulation, which reports the norm). */
static void update(struct ts__pb *b)
{
	const struct ts_plan *p = b->p;
	int L = p->mlp.layers;
	bool sh = ts__pb_grads_sharded(p);
	uint64_t R = sh ? (uint64_t)p->replicas : 1;     /* ZeRO-2: the replica's parts */
	uint64_t wb = w1_bytes(p), n = wb / F32 / R;
	int norm = -1, nparams = ts_mlp_has_w2(&p->mlp) ? 2 : 1;
	int G[4] = {sh ? b->sg[0] : b->G1, sh ? b->sg[1] : b->G2, sh ? b->sg[2] : b->GE,
	            sh ? b->sg[3] : b->GP};

	if (p->opt.clip_global_norm > 0 || p->accumulate > 1 || p->replicas > 1) {
		norm = ts__pb_temp(b, TS_ROLE_NORM, TS_MEM_DEVICE, -1, F32, "update");
		ts__pb_elementwise(b, TS_P_FILL, norm, -1, -1, 1, -1, "update");
		ts__pb_elementwise(b, TS_P_SUMSQ, G[0], norm, -1, n * (uint64_t)L, -1, "update");
		if (nparams == 2)
			ts__pb_elementwise(b, TS_P_SUMSQ, G[1], norm, -1, n * (uint64_t)L, -1, "update");
		for (int k = 0; k < 2; k++)
			if (G[2 + k] >= 0)
				ts__pb_elementwise(b, TS_P_SUMSQ, G[2 + k], norm, -1,
				            token_param(b, k).bytes / F32 / R, -1, "update");
		ts__pb_norm_sum(b, norm);
	}
	for (int l = 0; l < L; l++)
		for (int k = 0; k < nparams; k++)
			update_one(b, l, k, G[k], (uint64_t)l * wb / R, norm, -1, "update");
	for (int k = 0; k < 2; k++) {
		struct ts__pb_param pr = token_param(b, k);

		if (G[2 + k] >= 0)
			ts__pb_update_param(b, &pr, -1, G[2 + k], 0, norm, -1, "update");
	}
	ts__pb_release(b, norm, -1, "update");
}

/* ---- token models ------------------------------------------------------------------ */

/* A whole parameter on the device: the argument itself, or a copy of it
 * fetched from pinned_host (token_drop frees it). */
static int token_fetch(struct ts__pb *b, int W, enum ts_pbuf_role role, uint64_t bytes,
                       const char *phase)
{
	int t;

	if (b->p->policy.params == TS_MEM_DEVICE)
		return W;
	t = ts__pb_temp(b, role, TS_MEM_DEVICE, -1, bytes, phase);
	ts__pb_copy(b, t, 0, W, 0, bytes, -1, phase);
	return t;
}

static void token_drop(struct ts__pb *b, int t, int W, const char *phase)
{
	if (t != W)
		ts__pb_release(b, t, -1, phase);
}

static void token_op(struct ts__pb *b, enum ts_pop op, int a_, int b_, int c, int d,
                     const char *phase)
{
	struct ts_paction *x = ts__pb_emit(b, op, -1, phase);

	if (!x)
		return;
	x->a = a_;
	x->b = b_;
	x->c = c;
	x->d = d;
	x->n = (uint64_t)b->p->batch;
}

/* x_0 = the table's rows at the input ids. */
static void token_forward(struct ts__pb *b)
{
	const struct ts_plan *p = b->p;
	uint64_t eb = token_param(b, 0).bytes;
	int tab = token_fetch(b, b->EMB, TS_ROLE_EMBED, eb, "forward");

	b->x0 = ts__pb_temp(b, TS_ROLE_X, TS_MEM_DEVICE, 0, (uint64_t)p->batch * p->mlp.d_model * F32,
	             "forward");
	token_op(b, TS_P_EMBED_FWD, tab, b->IN, b->x0, -1, "forward");
	token_drop(b, tab, b->EMB, "forward");
}

/* The cross-entropy kernel on the logits (x_L itself without a projection)
 * against the target ids; returns its gradient (a temp of the logits' size).
 * The loss value goes back to the host at once, as emit_loss's. */
static int token_xent(struct ts__pb *b, int logits)
{
	const struct ts_plan *p = b->p;
	uint64_t lb = (uint64_t)p->batch * p->mlp.vocab * F32;
	int loss = ts__pb_temp(b, TS_ROLE_LOSS, TS_MEM_DEVICE, -1, ((uint64_t)p->batch + 1) * F32, "loss");
	int glog = ts__pb_temp(b, p->mlp.proj ? TS_ROLE_LOGITS : TS_ROLE_G, TS_MEM_DEVICE, p->mlp.layers,
	                lb, "loss");

	token_op(b, TS_P_XENT, logits, b->TGT, loss, glog, "loss");
	ts__pb_release(b, loss, -1, "loss");
	return glog;
}

/* The loss of x_L: projected to logits (or x_L itself), cross-entropy
 * against the target ids; the projection's gradient and update; returns
 * the gradient of x_L. Frees x_L. */
static int token_loss(struct ts__pb *b, int xL, enum ts_pbuf_class gcls)
{
	const struct ts_plan *p = b->p;
	int B = p->batch, d = p->mlp.d_model, V = p->mlp.vocab, L = p->mlp.layers;
	uint64_t lb = (uint64_t)B * V * F32, xb = (uint64_t)B * d * F32;
	struct ts__pb_param pr = token_param(b, 1);
	int prj = -1, logits = xL, glog, g;

	if (p->mlp.proj) {
		prj = token_fetch(b, b->PRJ, TS_ROLE_PROJ, pr.bytes, "loss");
		logits = ts__pb_temp(b, TS_ROLE_LOGITS, TS_MEM_DEVICE, L, lb, "loss");
		ts__pb_gemm(b, logits, 0, xL, 0, false, prj, 0, false, B, V, d, 0.0f, L, "loss");
	}
	glog = token_xent(b, logits);
	if (!p->mlp.proj) {
		ts__pb_release(b, xL, L, "loss");
		return glog;
	}
	ts__pb_release(b, logits, L, "loss");
	if (gcls == TS_PB_TEMP)
		b->GP = ts__pb_temp(b, TS_ROLE_GRAD_PROJ, TS_MEM_DEVICE, -1, pr.bytes, "loss");
	ts__pb_gemm(b, b->GP, 0, xL, 0, true, glog, 0, false, d, V, B, 0.0f, L, "loss");
	g = ts__pb_temp(b, TS_ROLE_G, TS_MEM_DEVICE, L, xb, "loss");
	ts__pb_gemm(b, g, 0, glog, 0, false, prj, 0, true, B, d, V, 0.0f, L, "loss");
	ts__pb_release(b, glog, L, "loss");
	ts__pb_release(b, xL, L, "loss");
	if (ts__pb_update_fused(p)) {
		ts__pb_update_param(b, &pr, -1, b->GP, 0, -1, prj != b->PRJ ? prj : -1, "loss");
		ts__pb_release(b, b->GP, -1, "loss");
		b->GP = -1;
	} else if (ts__pb_grads_sharded(p)) {
		ts__pb_scatter(b, 3, TS_ROLE_GRAD_PROJ, pr.bytes / (uint64_t)p->replicas, b->GP,
		               pr.bytes / F32, 0, -1, "loss");
		b->GP = -1;
	} else {
		ts__pb_grad_ready(b, b->GP, 0, pr.bytes / F32, L);
	}
	token_drop(b, prj, b->PRJ, "loss");
	return g;
}

/* The table's gradient: x_0's scattered by id; its update when fused. */
static void token_backward(struct ts__pb *b, int gx0)
{
	struct ts__pb_param pr = token_param(b, 0);
	bool fused = ts__pb_update_fused(b->p), sharded = ts__pb_grads_sharded(b->p);

	if (fused || sharded)
		b->GE = ts__pb_temp(b, TS_ROLE_GRAD_EMBED, TS_MEM_DEVICE, -1, pr.bytes, "backward");
	token_op(b, TS_P_EMBED_BWD, gx0, b->IN, b->GE, -1, "backward");
	ts__pb_release(b, gx0, 0, "backward");
	if (fused) {
		ts__pb_update_param(b, &pr, -1, b->GE, 0, -1, -1, "backward");
		ts__pb_release(b, b->GE, -1, "backward");
		b->GE = -1;
	} else if (sharded) {
		ts__pb_scatter(b, 2, TS_ROLE_GRAD_EMBED, pr.bytes / (uint64_t)b->p->replicas, b->GE,
		               pr.bytes / F32, 0, -1, "backward");
		b->GE = -1;
	} else {
		ts__pb_grad_ready(b, b->GE, 0, pr.bytes / F32, 0);
	}
}

/* ---- entry points ------------------------------------------------------------------ */

static int first_bit(unsigned v)
{
	int i = 0;

	while (v && !(v & 1u)) {
		v >>= 1;
		i++;
	}
	return i;
}

ts_status ts_policy_check(const struct ts_policy *p, struct ts_error *err)
{
	if ((p->params != TS_MEM_DEVICE && p->params != TS_MEM_PINNED_HOST) ||
	    (p->opt_state != TS_MEM_DEVICE && p->opt_state != TS_MEM_PINNED_HOST))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "params and opt_state live on device or pinned_host");
	const char *both = p->save_x && p->offload_x ? "x" : p->save_h && p->offload_h ? "h" : NULL;
	unsigned via_h = ((p->save_h ? p->offload_acts : 0u) | (p->offload_h ? p->save_acts : 0u)) &
	                 TS_GPT_ACTS_H;

	if (!both && (p->save_acts & p->offload_acts))
		both = ts_gpt_act_name((enum ts_gpt_act)first_bit(p->save_acts & p->offload_acts));
	if (both)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "activation names in \"save\" and \"offload\" must be exclusive; "
		                    "'%s' is in both", both);
	if (via_h)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "activation names in \"save\" and \"offload\" must be exclusive; "
		                    "'%s' is in \"%s\" and, through \"h\", in \"%s\"",
		                    ts_gpt_act_name((enum ts_gpt_act)first_bit(via_h)),
		                    p->save_h ? "offload" : "save", p->save_h ? "save" : "offload");
	if (p->prefetch_depth != 0 && p->prefetch_depth != 1)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "prefetch_depth is 0 or 1, not %d", p->prefetch_depth);
	return TS_OK;
}

ts_status ts_policy_check_names(const struct ts_policy *p, const struct ts_mlp *m,
                                struct ts_error *err)
{
	unsigned named = p->save_acts | p->offload_acts;

	if (m->gpt || !named)
		return TS_OK;
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
	                    "activation '%s' is a GPT block's; this model's activations are \"x\" "
	                    "and \"h\"", ts_gpt_act_name((enum ts_gpt_act)first_bit(named)));
}

static int *ints(int n)
{
	int *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);

	for (int i = 0; v && i < n; i++)
		v[i] = -1;
	return v;
}

/* Checks a model, a batch and a policy for either builder. */
static ts_status check_model(const struct ts_mlp *mlp, int batch, const struct ts_policy *policy,
                             struct ts_error *err)
{
	int L = mlp->layers, d = mlp->d_model;
	bool tok = ts_mlp_tokens(mlp);

	if (L < 1 || d < 1 || mlp->d_hidden < 0 || batch < 1 || L > 100000)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "layers, d_model and batch must be positive");
	if (tok != (mlp->loss == TS_LOSS_XENT) || mlp->vocab < 0 || mlp->vocab > (1 << 24) ||
	    (tok && !mlp->proj && mlp->vocab != d))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "a token model (vocab %d) takes loss softmax_cross_entropy, and "
		                    "without a projection d_model == vocab", mlp->vocab);
	if (ts_policy_check_names(policy, mlp, err) != TS_OK)
		return err->status;
	return ts_policy_check(policy, err);
}

/* Starts building *out (zeroed, the model checked): its model, policy and
 * batch; no buffer yet, every index unset, the per-layer state allocated
 * (b->failed when it could not be). */
void ts__pb_start(struct ts__pb *b, struct ts_plan *out, const struct ts_mlp *mlp,
                          const struct ts_policy *policy, int batch)
{
	int L = mlp->layers;

	*b = (struct ts__pb){.p = out, .W1 = -1, .W2 = -1, .MU1 = -1, .MU2 = -1, .NU1 = -1,
	                      .NU2 = -1, .IN = -1, .TGT = -1, .G1 = -1, .G2 = -1, .EMB = -1,
	                      .PRJ = -1, .MUE = -1, .MUP = -1, .NUE = -1, .NUP = -1, .GE = -1,
	                      .GP = -1, .x0 = -1, .norm = -1};
	for (size_t k = 0; k < sizeof b->sg / sizeof b->sg[0]; k++)
		b->sg[k] = -1;
	for (size_t k = 0; k < sizeof b->bk / sizeof b->bk[0]; k++)
		b->bk[k].buf = -1;
	out->mlp = *mlp;
	out->mlp.id_bytes = ts_mlp_id_bytes(mlp);
	out->policy = *policy;
	out->batch = batch;
	if (out->accumulate < 1)         /* set by a step with accumulation */
		out->accumulate = 1;
	if (out->replicas < 1)           /* set by a data-parallel step */
		out->replicas = 1;
	b->x = ints(L + 1);
	b->xh = ints(L + 1);
	b->h = ints(L);
	b->hh = ints(L);
	b->w1 = ints(L + 1);
	b->w2 = ints(L + 1);
	if (!b->x || !b->xh || !b->h || !b->hh || !b->w1 || !b->w2)
		b->failed = TS_RESOURCE_EXHAUSTED;
}

/* A whole-model buffer when `want`, else -1. */
int ts__pb_whole(struct ts__pb *b, bool want, enum ts_pbuf_role role,
                     enum ts_pbuf_class cls, enum ts_memory_kind kind, uint64_t bytes)
{
	/* ZeRO-1: a replica's optimizer state is its slice of every update */
	if (b->p->shard_state && cls == TS_PB_ARGUMENT && ts_role_opt_state(role))
		bytes /= (uint64_t)b->p->replicas;
	return want ? ts__pb_buf(b, role, cls, kind, -1, bytes) : -1;
}

/*
 * The buffers a plan starts with, in this order: the layers' parameters and
 * (Adam) their state; a token model's table and projection, their state,
 * and their gradients when `grads_out`; the batch's input and target (a
 * token model's are ids, of every micro-batch; no target when `targets` is
 * false); the layers'
 * gradients when `grads_out`.
 */
static void add_arguments(struct ts__pb *b, bool grads_out, bool targets)
{
	const struct ts_plan *p = b->p;
	const struct ts_mlp *m = &p->mlp;
	enum ts_memory_kind pk = p->policy.params, sk = p->policy.opt_state;
	bool has2 = ts_mlp_has_w2(m), adam = p->opt.type == TS_OPT_ADAM, tok = ts_mlp_tokens(m);
	bool p2 = tok && m->proj;
	uint64_t wb = (uint64_t)m->d_model * ts_mlp_hidden(m) * F32 * (uint64_t)m->layers;
	uint64_t eb = (uint64_t)m->vocab * (uint64_t)m->d_model * F32;
	uint64_t ib = (tok ? (uint64_t)p->batch * (uint64_t)m->id_bytes
	                   : (uint64_t)p->batch * m->d_model * F32) * (uint64_t)p->accumulate;

	b->W1 = ts__pb_whole(b, true, TS_ROLE_W1, TS_PB_ARGUMENT, pk, wb);
	b->W2 = ts__pb_whole(b, has2, TS_ROLE_W2, TS_PB_ARGUMENT, pk, wb);
	b->MU1 = ts__pb_whole(b, adam, TS_ROLE_MU_W1, TS_PB_ARGUMENT, sk, wb);
	b->NU1 = ts__pb_whole(b, adam, TS_ROLE_NU_W1, TS_PB_ARGUMENT, sk, wb);
	b->MU2 = ts__pb_whole(b, adam && has2, TS_ROLE_MU_W2, TS_PB_ARGUMENT, sk, wb);
	b->NU2 = ts__pb_whole(b, adam && has2, TS_ROLE_NU_W2, TS_PB_ARGUMENT, sk, wb);
	b->EMB = ts__pb_whole(b, tok, TS_ROLE_EMBED, TS_PB_ARGUMENT, pk, eb);
	b->PRJ = ts__pb_whole(b, p2, TS_ROLE_PROJ, TS_PB_ARGUMENT, pk, eb);
	b->MUE = ts__pb_whole(b, tok && adam, TS_ROLE_MU_EMBED, TS_PB_ARGUMENT, sk, eb);
	b->NUE = ts__pb_whole(b, tok && adam, TS_ROLE_NU_EMBED, TS_PB_ARGUMENT, sk, eb);
	b->MUP = ts__pb_whole(b, p2 && adam, TS_ROLE_MU_PROJ, TS_PB_ARGUMENT, sk, eb);
	b->NUP = ts__pb_whole(b, p2 && adam, TS_ROLE_NU_PROJ, TS_PB_ARGUMENT, sk, eb);
	b->GE = ts__pb_whole(b, tok && grads_out, TS_ROLE_GRAD_EMBED, TS_PB_OUTPUT, TS_MEM_DEVICE, eb);
	b->GP = ts__pb_whole(b, p2 && grads_out, TS_ROLE_GRAD_PROJ, TS_PB_OUTPUT, TS_MEM_DEVICE, eb);
	b->IN = ts__pb_whole(b, true, TS_ROLE_INPUT, TS_PB_ARGUMENT, TS_MEM_DEVICE, ib);
	b->TGT = ts__pb_whole(b, (m->loss == TS_LOSS_MSE || tok) && targets, TS_ROLE_TARGET,
	                      TS_PB_ARGUMENT,
	                   TS_MEM_DEVICE, ib);
	b->G1 = ts__pb_whole(b, grads_out, TS_ROLE_GRAD_W1, TS_PB_OUTPUT, TS_MEM_DEVICE, wb);
	b->G2 = ts__pb_whole(b, grads_out && has2, TS_ROLE_GRAD_W2, TS_PB_OUTPUT, TS_MEM_DEVICE, wb);
}

/* Ends building: frees the per-layer state and reads the analysis of the
 * schedule built (place.h). On failure releases the plan and answers
 * RESOURCE_EXHAUSTED, "no memory to plan the <what>". */
ts_status ts__pb_finish(struct ts__pb *b, const char *what, struct ts_error *err)
{
	free(b->x);
	free(b->xh);
	free(b->h);
	free(b->hh);
	free(b->w1);
	free(b->w2);
	ts__pb_release(b, b->norm, -1, "update");     /* the last of the step's temps */
	b->norm = -1;
	if (!b->failed)
		b->failed = ts__plan_analyse(b->p);
	for (int i = 0; !b->failed && i < b->p->nactions; i++)
		if (b->p->actions[i].op == TS_P_ALLREDUCE)
			b->p->all_reduce_bytes += b->p->actions[i].n * F32;
		else if (b->p->actions[i].op == TS_P_REDUCE_SCATTER)
			b->p->all_reduce_bytes += b->p->actions[i].n * F32 * (uint64_t)b->p->replicas;
	if (b->failed) {
		ts_plan_release(b->p);
		return ts_error_oom(err, "no memory to plan the %s", what);
	}
	return TS_OK;
}

/* ---- gradient accumulation ---------------------------------------------------- */

void ts__pb_micro(struct ts__pb *b, int first, int j, int IN, int TGT)
{
	const struct ts_plan *p = b->p;

	for (int i = first; j > 0 && !b->failed && i < p->nactions; i++) {
		struct ts_paction *a = &p->actions[i];
		int *buf[] = {&a->a, &a->b, &a->c, &a->f, &a->g};
		uint64_t *off[] = {&a->aoff, &a->boff, &a->coff, &a->foff, &a->goff};

		if (a->op == TS_P_ALLOC || a->op == TS_P_FREE || a->op == TS_P_WAIT)
			continue;
		for (int k = 0; k < 5; k++)
			if (*buf[k] >= 0 && (*buf[k] == IN || *buf[k] == TGT))
				*off[k] += (uint64_t)j * (p->bufs[*buf[k]].bytes /
				                          (uint64_t)p->accumulate);
	}
}

void ts__pb_accumulate(struct ts__pb *b, int acc, int g, uint64_t n, const char *phase)
{
	if (acc < 0 || g < 0)
		return;
	ts__pb_elementwise(b, TS_P_ADD, g, acc, -1, n, -1, phase);
	ts__pb_release(b, g, -1, phase);
}

/* A chunk of a product's N: the mean scales a buffer as rows of this. */
#define MEAN_CHUNK (1u << 30)

bool ts__pb_reduce_early(const struct ts_plan *p)
{
	return p->replicas > 1 && !ts__pb_grads_sharded(p) && p->accumulate <= 1;
}

/* The bucket entry of gradient buffer G (a free one taken), or NULL when
 * every entry holds another buffer. */
static struct ts__pb_bucket *bucket_of(struct ts__pb *b, int G)
{
	const size_t nb = sizeof b->bk / sizeof b->bk[0];

	for (size_t k = 0; k < nb; k++)
		if (b->bk[k].buf == G)
			return &b->bk[k];
	for (size_t k = 0; k < nb; k++)
		if (b->bk[k].buf < 0) {
			b->bk[k] = (struct ts__pb_bucket){.buf = G};
			return &b->bk[k];
		}
	return NULL;
}

/* All-reduces the open bucket of entry k, if any (its sum over the
 * replicas, in place). */
static void bucket_flush(struct ts__pb *b, struct ts__pb_bucket *k, int layer)
{
	struct ts_paction *a;

	if (!k->n)
		return;
	a = ts__pb_emit(b, TS_P_ALLREDUCE, layer, "all-reduce");
	if (a) {
		a->a = k->buf;
		a->aoff = k->off;
		a->n = k->n;
	}
	k->done += k->n;
	k->n = 0;
}

void ts__pb_grad_ready(struct ts__pb *b, int G, uint64_t off, uint64_t n, int layer)
{
	struct ts__pb_bucket *k;

	if (G < 0 || !n || !ts__pb_reduce_early(b->p))
		return;
	k = bucket_of(b, G);
	if (!k) {                 /* more buffers than entries: not early (ts__pb_mean) */
		b->failed = b->failed ? b->failed : TS_INTERNAL;
		return;
	}
	if (k->n && off + n * F32 == k->off) {           /* the layer below (backward) */
		k->off = off;
		k->n += n;
	} else if (k->n && k->off + k->n * F32 == off) { /* the layer above */
		k->n += n;
	} else {
		bucket_flush(b, k, layer);
		k->off = off;
		k->n = n;
	}
	if (k->n * F32 >= TS_PLAN_BUCKET_BYTES)
		bucket_flush(b, k, layer);
}

void ts__pb_mean(struct ts__pb *b, int acc, uint64_t n, const char *phase)
{
	int R = b->p->replicas > 1 ? b->p->replicas : 1;
	float beta = 1.0f / ((float)b->p->accumulate * (float)R);
	bool early = false;

	if (acc >= 0 && ts__pb_reduce_early(b->p)) {
		/* the backward pass all-reduced it bucket by bucket: the last
		 * bucket now; a buffer it never reported all-reduced whole */
		const size_t nb = sizeof b->bk / sizeof b->bk[0];

		for (size_t k = 0; k < nb && !early; k++)
			if (b->bk[k].buf == acc) {
				bucket_flush(b, &b->bk[k], -1);
				if (b->bk[k].done != n && !b->failed)
					b->failed = TS_INTERNAL;      /* a gradient reported in part */
				early = true;
			}
	}
	if (acc >= 0 && R > 1 && !ts__pb_grads_sharded(b->p) && !early) {
		struct ts_paction *a = ts__pb_emit(b, TS_P_ALLREDUCE, -1, "all-reduce");

		if (!a)
			return;
		a->a = acc;
		a->n = n;
	}
	for (uint64_t at = 0; acc >= 0 && at < n; at += MEAN_CHUNK) {
		uint64_t len = n - at < MEAN_CHUNK ? n - at : MEAN_CHUNK;
		struct ts_paction *a = ts__pb_emit(b, TS_P_GEMM, -1, phase);

		/* C [1, len] = beta C: a product with K = 0 (kernels.h) */
		if (!a)
			return;
		a->a = a->b = a->c = acc;
		a->aoff = a->boff = a->coff = at * F32;
		a->M = 1;
		a->N = (int)len;
		a->K = 0;
		a->beta = beta;
	}
}

bool ts__pb_grads_sharded(const struct ts_plan *p)
{
	return p->shard_grads && p->replicas > 1;
}

void ts__pb_scatter(struct ts__pb *b, int k, enum ts_pbuf_role role, uint64_t part_bytes, int G,
                    uint64_t n, uint64_t soff, int layer, const char *phase)
{
	uint64_t part = n / (uint64_t)b->p->replicas;
	struct ts_paction *a;
	int t = -1;

	if (G < 0)
		return;
	if (b->sg[k] < 0)
		b->sg[k] = ts__pb_temp(b, role, TS_MEM_DEVICE, -1, part_bytes, phase);
	if (b->micro > 0)        /* a later micro-batch's: added into the parts */
		t = ts__pb_temp(b, role, TS_MEM_DEVICE, layer, part * F32, phase);
	a = ts__pb_emit(b, TS_P_REDUCE_SCATTER, layer, "reduce-scatter");
	if (a) {
		a->a = G;
		a->b = t >= 0 ? t : b->sg[k];
		a->boff = t >= 0 ? 0 : soff;
		a->n = part;
	}
	ts__pb_release(b, G, layer, phase);
	if (t < 0)
		return;
	a = ts__pb_emit(b, TS_P_ADD, layer, phase);
	if (a) {
		a->a = t;
		a->b = b->sg[k];
		a->boff = soff;
		a->n = part;
	}
	ts__pb_release(b, t, layer, phase);
}

void ts__pb_norm_sum(struct ts__pb *b, int norm)
{
	struct ts_paction *a;

	if (norm < 0 || !ts__pb_grads_sharded(b->p))
		return;
	a = ts__pb_emit(b, TS_P_ALLREDUCE, -1, "all-reduce");
	if (a) {
		a->a = norm;
		a->n = 1;
	}
}

/* One micro-batch of an MLP kind's step: forward, loss and backward, its
 * gradients into the whole gradients (micro-batch 0: the accumulators, of
 * class gcls) or into whole temps added into them (later ones). */
static void mlp_micro(struct ts__pb *b, int j, enum ts_pbuf_class gcls)
{
	const struct ts_plan *p = b->p;
	const struct ts_mlp *mlp = &p->mlp;
	bool tok = ts_mlp_tokens(mlp), has2 = ts_mlp_has_w2(mlp);
	int L = mlp->layers, d = mlp->d_model, H = ts_mlp_hidden(mlp);
	uint64_t wb = (uint64_t)d * H * F32, xb = (uint64_t)p->batch * d * F32;
	uint64_t eb = (uint64_t)mlp->vocab * (uint64_t)d * F32;
	int *grad[4] = {&b->G1, &b->G2, &b->GE, &b->GP}, acc[4];
	uint64_t gn[4] = {wb * L / F32, wb * L / F32, eb / F32, eb / F32};
	int first = p->nactions, g, xL;
	bool sharded = ts__pb_grads_sharded(p);

	b->micro = j;
	if (j > 0) {
		gcls = TS_PB_TEMP;
		for (int k = 0; k < 4; k++) {
			acc[k] = *grad[k];
			*grad[k] = -1;
		}
	}
	if (tok)
		token_forward(b);
	forward(b, &xL);
	if (tok) {
		g = token_loss(b, xL, gcls);
	} else {
		g = emit_loss(b, xL, (uint64_t)p->batch * d, xb, L);
		ts__pb_release(b, xL, L, "loss");
	}
	if (gcls == TS_PB_TEMP && !ts__pb_update_fused(p) && !sharded) {
		b->G1 = ts__pb_temp(b, TS_ROLE_GRAD_W1, TS_MEM_DEVICE, -1, wb * L, "backward");
		b->G2 = has2 ? ts__pb_temp(b, TS_ROLE_GRAD_W2, TS_MEM_DEVICE, -1, wb * L, "backward") : -1;
		if (tok)
			b->GE = ts__pb_temp(b, TS_ROLE_GRAD_EMBED, TS_MEM_DEVICE, -1, eb, "backward");
	}
	g = backward(b, g);
	if (tok)
		token_backward(b, g);
	ts__pb_micro(b, first, j, b->IN, b->TGT);
	if (j > 0) {
		for (int k = 0; k < 4; k++) {
			ts__pb_accumulate(b, acc[k], *grad[k], gn[k], "accumulate");
			*grad[k] = acc[k];
		}
	}
	if (j == p->accumulate - 1 && (j > 0 || p->replicas > 1))
		for (int k = 0; k < 4; k++)
			ts__pb_mean(b, sharded ? b->sg[k] : *grad[k],
			            sharded ? gn[k] / (uint64_t)p->replicas : gn[k], "accumulate");
}

ts_status ts_plan_build(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                        const struct ts_policy *policy, struct ts_plan *out,
                        struct ts_error *err)
{
	return ts_plan_build_accumulate(mlp, opt, batch, 1, policy, out, err);
}

ts_status ts_plan_build_accumulate(const struct ts_mlp *mlp, const struct ts_optimizer *opt,
                                   int batch, int accumulate, const struct ts_policy *policy,
                                   struct ts_plan *out, struct ts_error *err)
{
	return ts_plan_build_replicated(mlp, opt, batch, accumulate, 1, policy, out, err);
}

static ts_status build_step(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                            int accumulate, int replicas, int zero,
                            const struct ts_policy *policy, struct ts_plan *out,
                            struct ts_error *err);

ts_status ts_plan_build_replicated(const struct ts_mlp *mlp, const struct ts_optimizer *opt,
                                   int batch, int accumulate, int replicas,
                                   const struct ts_policy *policy, struct ts_plan *out,
                                   struct ts_error *err)
{
	return build_step(mlp, opt, batch, accumulate, replicas, 0, policy, out, err);
}

/* The elements of each update of model m's parameter k (an MLP's w1, w2,
 * embed, proj; a GPT's tensors in order) into *n (0: the model has none),
 * *name its name; false past the last. */
static bool update_size(const struct ts_mlp *m, int k, uint64_t *n, const char **name)
{
	uint64_t dh = (uint64_t)m->d_model * (uint64_t)ts_mlp_hidden(m);
	uint64_t vd = (uint64_t)m->vocab * (uint64_t)m->d_model;
	static const char *const names[4] = {"w1", "w2", "embed", "proj"};

	if (m->gpt) {
		if (k >= TS_GPT_NPARAMS)
			return false;
		*name = ts_gpt_param_name((enum ts_gpt_param)k);
		*n = ts_gpt_param_slice(m, (enum ts_gpt_param)k);
		return true;
	}
	if (k >= 4)
		return false;
	*name = names[k];
	*n = k == 0 ? dh : k == 1 ? (ts_mlp_has_w2(m) ? dh : 0)
	   : k == 2 ? (ts_mlp_tokens(m) ? vd : 0) : (ts_mlp_tokens(m) && m->proj ? vd : 0);
	return true;
}

/* ZeRO stage `zero` (1 or 2): the checks both stages make, then the step. */
static ts_status build_zero(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                            int accumulate, int replicas, int zero,
                            const struct ts_policy *policy, struct ts_plan *out,
                            struct ts_error *err)
{
	const char *name = "";
	uint64_t n;

	memset(out, 0, sizeof *out);
	if (opt->type != TS_OPT_ADAM || replicas < 2 || policy->params != TS_MEM_DEVICE ||
	    policy->opt_state != TS_MEM_DEVICE)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING",
		                    "shard_optimizer slices Adam's state over 2 or more devices, with "
		                    "params and opt_state on the devices");
	for (int k = 0; update_size(mlp, k, &n, &name); k++)
		if (n % (uint64_t)replicas)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING",
			                    "shard_optimizer: %s's updates of %llu elements do not "
			                    "split over %d devices", name, (unsigned long long)n,
			                    replicas);
	return build_step(mlp, opt, batch, accumulate, replicas, zero, policy, out, err);
}

ts_status ts_plan_build_zero(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                             int accumulate, int replicas, const struct ts_policy *policy,
                             struct ts_plan *out, struct ts_error *err)
{
	return build_zero(mlp, opt, batch, accumulate, replicas, 1, policy, out, err);
}

ts_status ts_plan_build_zero2(const struct ts_mlp *mlp, const struct ts_optimizer *opt,
                              int batch, int accumulate, int replicas,
                              const struct ts_policy *policy, struct ts_plan *out,
                              struct ts_error *err)
{
	return build_zero(mlp, opt, batch, accumulate, replicas, 2, policy, out, err);
}

static ts_status build_step(const struct ts_mlp *mlp, const struct ts_optimizer *opt, int batch,
                            int accumulate, int replicas, int zero,
                            const struct ts_policy *policy, struct ts_plan *out,
                            struct ts_error *err)
{
	struct ts__pb b;
	enum ts_pbuf_class gcls = opt->type == TS_OPT_NONE ? TS_PB_OUTPUT : TS_PB_TEMP;
	ts_status st;

	memset(out, 0, sizeof *out);
	if (accumulate < 1 || accumulate > TS_PLAN_ACCUMULATE_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ACCUMULATE",
		                    "accumulate is in 1..%d micro-batches a step, not %d",
		                    TS_PLAN_ACCUMULATE_MAX, accumulate);
	if (replicas < 1 || replicas > TS_PLAN_REPLICAS_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REPLICAS",
		                    "a step runs on 1..%d devices together, not %d",
		                    TS_PLAN_REPLICAS_MAX, replicas);
	if (mlp->gpt)
		return ts__plan_build_gpt(mlp, opt, batch, accumulate, replicas, zero, policy, out,
		                          err);
	st = check_model(mlp, batch, policy, err);
	if (st != TS_OK)
		return st;
	out->accumulate = accumulate;
	out->replicas = replicas;
	out->shard_state = zero >= 1;
	out->shard_grads = zero >= 2;
	ts__pb_start(&b, out, mlp, policy, batch);
	out->opt = *opt;
	add_arguments(&b, gcls == TS_PB_OUTPUT, true);
	ts__pb_norm_begin(&b);
	for (int j = 0; j < accumulate && !b.failed; j++)
		mlp_micro(&b, j, gcls);
	if (opt->type != TS_OPT_NONE && !ts__pb_update_fused(out)) {
		update(&b);
		ts__pb_release(&b, b.G1, -1, "update");
		ts__pb_release(&b, b.G2, -1, "update");
		ts__pb_release(&b, b.GE, -1, "update");
		ts__pb_release(&b, b.GP, -1, "update");
		for (int k = 0; k < 4; k++)
			ts__pb_release(&b, b.sg[k], -1, "update");
	}
	return ts__pb_finish(&b, "step", err);
}

/* ---- evaluation --------------------------------------------------------------- */

/* The forward pass of an evaluation: every layer's input is freed once the
 * layer read it; the last layer writes into `last` when it is set. */
static int forward_eval(struct ts__pb *b, int last)
{
	const struct ts_plan *p = b->p;
	int L = p->mlp.layers, x = b->x0 >= 0 ? b->x0 : b->IN;

	params_fetch(b, 0, "forward");
	for (int l = 0; l < L; l++) {
		int h, y;

		if (p->policy.prefetch_depth)
			params_fetch(b, l + 1, "forward");
		y = layer_forward_into(b, l, x, l == L - 1 ? last : -1, false, &h, "forward");
		if (x != b->IN)
			ts__pb_release(b, x, l, "forward");
		params_drop(b, l, "forward");
		if (!p->policy.prefetch_depth)
			params_fetch(b, l + 1, "forward");
		x = y;
	}
	return x;
}

/* A token model's loss in an evaluation: the logits of x_L (projected into
 * `dst` when set, else a temp; x_L itself without a projection), the
 * step's cross-entropy kernel against the target ids, its gradient into a
 * scratch temp freed at once (an evaluation without targets: no loss).
 * Returns the logits' buffer; frees x_L when it is not that. */
static int token_loss_eval(struct ts__pb *b, int xL, int dst)
{
	const struct ts_plan *p = b->p;
	int B = p->batch, d = p->mlp.d_model, V = p->mlp.vocab, L = p->mlp.layers;
	uint64_t lb = (uint64_t)B * V * F32;
	int logits = xL, glog, prj;

	if (p->mlp.proj) {
		prj = token_fetch(b, b->PRJ, TS_ROLE_PROJ, token_param(b, 1).bytes, "loss");
		logits = dst >= 0 ? dst : ts__pb_temp(b, TS_ROLE_LOGITS, TS_MEM_DEVICE, L, lb, "loss");
		ts__pb_gemm(b, logits, 0, xL, 0, false, prj, 0, false, B, V, d, 0.0f, L, "loss");
		token_drop(b, prj, b->PRJ, "loss");
		ts__pb_release(b, xL, L, "loss");
	}
	if (p->no_targets)
		return logits;
	glog = token_xent(b, logits);
	ts__pb_release(b, glog, L, "loss");
	return logits;
}

ts_status ts_plan_build_eval(const struct ts_mlp *mlp, int batch, const struct ts_policy *policy,
                             bool outputs, enum ts_memory_kind outputs_kind,
                             struct ts_plan *out, struct ts_error *err)
{
	struct ts_eval_spec spec = {.outputs = outputs, .outputs_kind = outputs_kind};

	return ts_plan_build_eval_spec(mlp, batch, policy, &spec, out, err);
}

/* The spec's choices the model has (plan.h's ts_eval_spec). */
static ts_status eval_spec_check(const struct ts_mlp *mlp, const struct ts_eval_spec *spec,
                                 struct ts_error *err)
{
	if ((spec->last || spec->window) && !mlp->gpt)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_EVALUATION",
		                    "the last positions and shorter windows are a GPT's");
	if (spec->no_targets && !ts_mlp_tokens(mlp))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_EVALUATION",
		                    "an evaluation without targets is a token model's");
	if (spec->no_targets && !spec->outputs)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_EVALUATION",
		                    "an evaluation without targets computes its outputs only: name them");
	if (mlp->gpt && (spec->window < 0 || spec->window > mlp->context))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_EVALUATION",
		                    "gpt: a window of %d tokens is outside 1..%d (the context)",
		                    spec->window, mlp->context);
	return TS_OK;
}

ts_status ts_plan_build_eval_spec(const struct ts_mlp *mlp, int batch,
                                  const struct ts_policy *policy,
                                  const struct ts_eval_spec *spec, struct ts_plan *out,
                                  struct ts_error *err)
{
	struct ts__pb b;
	bool tok = ts_mlp_tokens(mlp), outputs = spec->outputs;
	enum ts_memory_kind outputs_kind = spec->outputs_kind;
	int L = mlp->layers, d = mlp->d_model;
	uint64_t xb = (uint64_t)batch * d * F32;
	uint64_t ob = tok ? (uint64_t)batch * (uint64_t)mlp->vocab * F32 : xb;
	int g, xL, OUT = -1, dev_out;
	ts_status st;

	memset(out, 0, sizeof *out);
	st = eval_spec_check(mlp, spec, err);
	if (st != TS_OK)
		return st;
	if (mlp->gpt)
		return ts__plan_build_gpt_eval(mlp, batch, policy, spec, out, err);
	st = check_model(mlp, batch, policy, err);
	if (st != TS_OK)
		return st;
	if (outputs && outputs_kind != TS_MEM_DEVICE && outputs_kind != TS_MEM_PINNED_HOST)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "outputs live on device or pinned_host, not '%s'",
		                    ts_memory_kind_name(outputs_kind));
	ts__pb_start(&b, out, mlp, policy, batch);
	out->opt = (struct ts_optimizer){.type = TS_OPT_NONE};
	out->policy.save_x = out->policy.save_h = false;
	out->policy.offload_x = out->policy.offload_h = false;
	out->policy.save_acts = out->policy.offload_acts = 0;
	out->evaluate = true;
	out->no_targets = spec->no_targets;
	add_arguments(&b, false, !out->no_targets);
	if (outputs)
		OUT = ts__pb_buf(&b, TS_ROLE_OUTPUT, TS_PB_OUTPUT, outputs_kind, -1, ob);
	dev_out = OUT >= 0 && outputs_kind == TS_MEM_DEVICE ? OUT : -1;
	if (tok)
		token_forward(&b);
	xL = forward_eval(&b, tok && mlp->proj ? -1 : dev_out);
	if (tok) {
		xL = token_loss_eval(&b, xL, dev_out);
	} else {
		/* the step's loss kernel, for the same value bit for bit: its
		 * gradient lands in a scratch temp that is freed at once */
		g = emit_loss(&b, xL, (uint64_t)batch * d, xb, L);
		ts__pb_release(&b, g, L, "loss");
	}
	if (OUT >= 0 && outputs_kind != TS_MEM_DEVICE)
		ts__pb_copy(&b, OUT, 0, xL, 0, ob, L, "outputs");
	if (xL != OUT && xL != b.IN)
		ts__pb_release(&b, xL, L, "outputs");
	return ts__pb_finish(&b, "evaluation", err);
}

void ts_plan_release(struct ts_plan *p)
{
	free(p->bufs);
	free(p->actions);
	free(p->points);
	memset(p, 0, sizeof *p);
}
