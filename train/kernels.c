/*
 * kernels.c - the training kernels' front: picks the backend of a device
 * and checks every call before a backend enqueues it.
 *
 * A ts_kernels is a device, its backend's ops (kernels_int.h) and the
 * backend's state. Nothing can be reported once a kernel runs (it runs
 * later, on a queue worker or a stream), so every argument is checked
 * here, at enqueue time: NULL operands, negative sizes, unknown enums,
 * optimizer hyperparameters that would divide by zero, a queue of another
 * backend (or, on CUDA, of another device than the kernels'), a broken
 * device. Empty work (a zero size) is accepted and enqueues nothing.
 *
 * Invariants: dev, ops and impl are immutable between new and free.
 *
 * Thread-safety: a ts_kernels may be used from any thread once made; the
 * backends make their ops safe for that.
 */
#include "train/kernels.h"

#include <math.h>
#include <stdlib.h>

#include "train/kernels_int.h"

struct ts_kernels {
	struct ts_device *dev;                  /* borrowed; immutable */
	const struct ts__kernel_ops *ops;       /* immutable */
	void *impl;                             /* the backend's; immutable */
};

/* Bad input, through the one helper (common/status.h). */
#define BAD(err, what) ts_error_bad((err), "INVALID_ARGUMENT", NULL, "%s", (what))

/* While a trace records: the span of the kernel enqueued next on q, where
 * q's backend times its own work (CUDA: events around it; sim and cpu name
 * their host functions instead, and this is NULL). */
static void *span(struct ts_queue *q, const char *name)
{
	return ts_queue_span_begin(q, "compute", name);
}

/* Ends the span sp (NULL: none) once its kernel is enqueued; answers st. */
static ts_status traced(struct ts_queue *q, void *sp, ts_status st)
{
	ts_queue_span_end(q, sp);
	return st;
}

ts_status ts_kernels_new(struct ts_device *dev, struct ts_kernels **out, struct ts_error *err)
{
	const struct ts__kernel_ops *ops;
	struct ts_kernels *k;
	ts_status st;

	if (!out)
		return BAD(err, "training kernels: nowhere to put them");
	*out = NULL;
	if (!dev)
		return BAD(err, "training kernels: no device");
	if (ts_device_broken(dev))
		return ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN",
		                    "%s is unusable after an unrecoverable (sticky) error",
		                    ts_device_props(dev)->id);
	switch (ts_device_props(dev)->backend) {
	case TS_BACKEND_CUDA:
		ops = ts__kernels_cuda_ops();
		break;
	case TS_BACKEND_SIM:
	case TS_BACKEND_CPU:
		ops = ts__kernels_cpu_ops();
		break;
	default:
		ops = NULL;
		break;
	}
	if (!ops)
		return ts_error_set(err, TS_UNIMPLEMENTED, "NO_KERNELS",
		                    "%s: no training kernels for backend '%s' (built without CUDA)",
		                    ts_device_props(dev)->id,
		                    ts_backend_name(ts_device_props(dev)->backend));
	k = calloc(1, sizeof *k);
	if (!k)
		return ts_error_oom(err, "%s: out of memory creating training kernels",
		                    ts_device_props(dev)->id);
	k->dev = dev;
	k->ops = ops;
	st = ops->init(dev, &k->impl, err);
	if (st != TS_OK) {
		free(k);
		return st;
	}
	*out = k;
	return TS_OK;
}

void ts_kernels_free(struct ts_kernels *k)
{
	if (!k)
		return;
	k->ops->fini(k->impl);
	free(k);
}

/* Whether q can run k's kernels: a queue of the kernels' own device on
 * CUDA (the cuBLAS handle belongs to it), of any cpu or sim device
 * otherwise (they all compute on host memory), and not broken. */
static ts_status check_queue(const struct ts_kernels *k, struct ts_queue *q, const char *what,
                             struct ts_error *err)
{
	struct ts_device *qdev;
	enum ts_backend_kind kb, qb;
	bool fits;

	if (!k || !q)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "%s: no kernels or no queue", what);
	qdev = ts_queue_device(q);
	kb = ts_device_props(k->dev)->backend;
	qb = ts_device_props(qdev)->backend;
	if (kb == TS_BACKEND_CUDA)
		fits = qdev == k->dev;
	else
		fits = qb == TS_BACKEND_SIM || qb == TS_BACKEND_CPU;
	if (!fits)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "%s: the kernels of %s cannot run on a queue of %s", what,
		                    ts_device_props(k->dev)->id, ts_device_props(qdev)->id);
	if (ts_device_broken(qdev))
		return ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN",
		                    "%s is unusable after an unrecoverable (sticky) error",
		                    ts_device_props(qdev)->id);
	return TS_OK;
}

static bool act_known(enum ts_act act)
{
	return act == TS_ACT_NONE || act == TS_ACT_RELU || act == TS_ACT_GELU ||
	       act == TS_ACT_TANH;
}

ts_status ts_k_gemm(struct ts_kernels *k, struct ts_queue *q, bool ta, bool tb, int M, int N,
                    int K, float alpha, const float *A, const float *B, float beta, float *C,
                    struct ts_error *err)
{
	ts_status st = check_queue(k, q, "gemm", err);

	if (st != TS_OK)
		return st;
	if (M < 0 || N < 0 || K < 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "gemm: negative size (M=%d, N=%d, K=%d)", M, N, K);
	if (M == 0 || N == 0)
		return TS_OK;
	if (!C || (K > 0 && (!A || !B)))
		return BAD(err, "gemm: NULL operand");
	void *sp = span(q, "gemm");

	return traced(q, sp, k->ops->gemm(k->impl, q, ta, tb, M, N, K, alpha, A, B, beta, C, err));
}

static bool lowp_known(enum ts_compute dt)
{
	return dt == TS_COMPUTE_BF16 || dt == TS_COMPUTE_F16;
}

ts_status ts_k_lowp_check(struct ts_kernels *k, enum ts_compute dt, struct ts_error *err)
{
	if (!k)
		return BAD(err, "mixed precision: no kernels");
	if (dt == TS_COMPUTE_F32)
		return TS_OK;
	if (!lowp_known(dt))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "mixed precision: unknown compute dtype %d", (int)dt);
	return TS_OK;
}

ts_status ts_k_round(struct ts_kernels *k, struct ts_queue *q, enum ts_compute to,
                     const float *x, uint16_t *y, uint64_t n, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "round", err);

	if (st != TS_OK)
		return st;
	if (!lowp_known(to))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "round: compute dtype %d is not bfloat16 or float16", (int)to);
	if (n == 0)
		return TS_OK;
	if (!x || !y)
		return BAD(err, "round: NULL operand");
	void *sp = span(q, "round");

	return traced(q, sp, k->ops->round(k->impl, q, to, x, y, n, err));
}

ts_status ts_k_gemm_lp(struct ts_kernels *k, struct ts_queue *q, enum ts_compute dt, bool ta,
                       bool tb, int M, int N, int K, float alpha, const uint16_t *A,
                       const uint16_t *B, float beta, float *C, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "gemm_lp", err);

	if (st != TS_OK)
		return st;
	if (!lowp_known(dt))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "gemm_lp: compute dtype %d is not bfloat16 or float16", (int)dt);
	if (M < 0 || N < 0 || K < 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "gemm_lp: negative size (M=%d, N=%d, K=%d)", M, N, K);
	if (M == 0 || N == 0)
		return TS_OK;
	if (!C || (K > 0 && (!A || !B)))
		return BAD(err, "gemm_lp: NULL operand");
	if (K == 0) {    /* C = beta * C: no operand to read */
		void *sp0 = span(q, "gemm");

		return traced(q, sp0, k->ops->gemm(k->impl, q, ta, tb, M, N, 0, alpha, NULL, NULL,
		                                   beta, C, err));
	}
	void *sp = span(q, "gemm_lp");

	return traced(q, sp, k->ops->gemm_lp(k->impl, q, dt, ta, tb, M, N, K, alpha, A, B, beta, C,
	                                     err));
}

ts_status ts_k_act_fwd(struct ts_kernels *k, struct ts_queue *q, enum ts_act act,
                       const float *in, float *out, uint64_t n, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "activation", err);

	if (st != TS_OK)
		return st;
	if (!act_known(act))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "activation: unknown activation %d", (int)act);
	if (n == 0)
		return TS_OK;
	if (!in || !out)
		return BAD(err, "activation: NULL operand");
	void *sp = span(q, "act_fwd");

	return traced(q, sp, k->ops->act_fwd(k->impl, q, act, in, out, n, err));
}

ts_status ts_k_act_bwd(struct ts_kernels *k, struct ts_queue *q, enum ts_act act,
                       const float *pre, const float *grad_out, float *grad_in, uint64_t n,
                       struct ts_error *err)
{
	ts_status st = check_queue(k, q, "activation gradient", err);

	if (st != TS_OK)
		return st;
	if (!act_known(act))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "activation gradient: unknown activation %d", (int)act);
	if (n == 0)
		return TS_OK;
	if (!pre || !grad_out || !grad_in)
		return BAD(err, "activation gradient: NULL operand");
	void *sp = span(q, "act_bwd");

	return traced(q, sp, k->ops->act_bwd(k->impl, q, act, pre, grad_out, grad_in, n, err));
}

ts_status ts_k_add(struct ts_kernels *k, struct ts_queue *q, const float *x, float *y,
                   uint64_t n, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "add", err);

	if (st != TS_OK)
		return st;
	if (n == 0)
		return TS_OK;
	if (!x || !y)
		return BAD(err, "add: NULL operand");
	void *sp = span(q, "add");

	return traced(q, sp, k->ops->add(k->impl, q, x, y, n, err));
}

ts_status ts_k_loss(struct ts_kernels *k, struct ts_queue *q, enum ts_loss loss,
                    const float *out, const float *target, float *loss_dev, float *grad,
                    uint64_t n, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "loss", err);

	if (st != TS_OK)
		return st;
	if (loss != TS_LOSS_SUM && loss != TS_LOSS_MSE)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "loss: unknown loss %d", (int)loss);
	if (n == 0)
		return BAD(err, "loss: no elements");
	if (!out || !loss_dev || !grad || (loss == TS_LOSS_MSE && !target))
		return BAD(err, "loss: NULL operand");
	void *sp = span(q, "loss");

	return traced(q, sp, k->ops->loss(k->impl, q, loss, out, target, loss_dev, grad, n, err));
}

ts_status ts_k_sumsq(struct ts_kernels *k, struct ts_queue *q, const float *x, uint64_t n,
                     float *acc, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "sum of squares", err);

	if (st != TS_OK)
		return st;
	if (n == 0)
		return TS_OK;
	if (!x || !acc)
		return BAD(err, "sum of squares: NULL operand");
	void *sp = span(q, "sumsq");

	return traced(q, sp, k->ops->sumsq(k->impl, q, x, n, acc, err));
}

/* The optimizer's settings, as an update needs them. */
static ts_status check_optimizer(const struct ts_optimizer *opt, int step, struct ts_error *err)
{
	if (!opt)
		return BAD(err, "update: no optimizer");
	if (opt->type != TS_OPT_SGD && opt->type != TS_OPT_ADAM)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "update: optimizer '%s' updates nothing",
		                    ts_opt_name(opt->type));
	if (!isfinite(opt->learning_rate))
		return BAD(err, "update: learning rate is not finite");
	if (!(opt->clip_global_norm >= 0.0f) || isinf(opt->clip_global_norm))
		return BAD(err, "update: clip_global_norm must be finite and >= 0");
	if (opt->schedule.type == TS_SCHED_WARMUP_COSINE &&
	    (!isfinite(opt->schedule.init_value) || !isfinite(opt->schedule.peak_value) ||
	     !isfinite(opt->schedule.end_value) || opt->schedule.warmup_steps < 0 ||
	     opt->schedule.decay_steps <= opt->schedule.warmup_steps))
		return BAD(err, "update: a warmup cosine schedule needs finite values and "
		                "0 <= warmup_steps < decay_steps");
	if (opt->schedule.type != TS_SCHED_CONSTANT && opt->schedule.type != TS_SCHED_WARMUP_COSINE)
		return BAD(err, "update: unknown learning-rate schedule");
	if (opt->adamw && (opt->type != TS_OPT_ADAM || !(opt->weight_decay >= 0.0f) ||
	                   isinf(opt->weight_decay)))
		return BAD(err, "update: adamw's weight_decay must be finite and >= 0");
	if (opt->type != TS_OPT_ADAM)
		return TS_OK;
	if (step < 1)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "update: adam step %d; steps count from 1", step);
	if (!(opt->b1 >= 0.0f && opt->b1 < 1.0f) || !(opt->b2 >= 0.0f && opt->b2 < 1.0f))
		return BAD(err, "update: adam b1 and b2 must lie in [0, 1)");
	if (!(opt->eps >= 0.0f) || isinf(opt->eps))
		return BAD(err, "update: adam eps must be finite and >= 0");
	return TS_OK;
}

ts_status ts_k_update(struct ts_kernels *k, struct ts_queue *q, const struct ts_optimizer *opt,
                      int step, float *p, const float *g, float *mu, float *nu, uint64_t n,
                      const float *gnorm_sq_dev, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "update", err);

	if (st != TS_OK)
		return st;
	st = check_optimizer(opt, step, err);
	if (st != TS_OK)
		return st;
	if (n == 0)
		return TS_OK;
	if (!p || !g || (opt->type == TS_OPT_ADAM && (!mu || !nu)))
		return BAD(err, "update: NULL operand");
	if (opt->clip_global_norm > 0.0f && !gnorm_sq_dev)
		return BAD(err, "update: clipping without a global norm");
	void *sp = span(q, "update");

	return traced(q, sp, k->ops->update(k->impl, q, opt, step, p, g, mu, nu, n, gnorm_sq_dev,
	                                    err));
}

ts_status ts_k_fill(struct ts_kernels *k, struct ts_queue *q, float *x, float v, uint64_t n,
                    struct ts_error *err)
{
	ts_status st = check_queue(k, q, "fill", err);

	if (st != TS_OK)
		return st;
	if (n == 0)
		return TS_OK;
	if (!x)
		return BAD(err, "fill: NULL operand");
	void *sp = span(q, "fill");

	return traced(q, sp, k->ops->fill(k->impl, q, x, v, n, err));
}

/* ---- token models ------------------------------------------------------------ */

static ts_status check_tokens(int vocab, int d, int id_bytes, const char *what,
                              struct ts_error *err)
{
	if (id_bytes != 2 && id_bytes != 4)
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "%s: token ids are 2 (uint16) or 4 (int32) bytes, not %d", what,
		                    id_bytes);
	if (vocab < 1 || d < 1)
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "%s: vocab %d and width %d must be positive", what, vocab, d);
	return TS_OK;
}

ts_status ts_k_embed_fwd(struct ts_kernels *k, struct ts_queue *q, const float *table, int vocab,
                         int d, const void *ids, int id_bytes, uint64_t rows, float *out,
                         struct ts_error *err)
{
	ts_status st = check_queue(k, q, "embedding", err);

	if (st == TS_OK)
		st = check_tokens(vocab, d, id_bytes, "embedding", err);
	if (st != TS_OK || rows == 0)
		return st;
	if (!table || !ids || !out)
		return BAD(err, "embedding: NULL operand");
	void *sp = span(q, "embed_fwd");

	return traced(q, sp, k->ops->embed_fwd(k->impl, q, table, vocab, d, ids, id_bytes, rows,
	                                       out, err));
}

ts_status ts_k_embed_bwd(struct ts_kernels *k, struct ts_queue *q, const void *ids, int id_bytes,
                         uint64_t rows, int vocab, int d, const float *grad_out,
                         float *grad_table, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "embedding gradient", err);

	if (st == TS_OK)
		st = check_tokens(vocab, d, id_bytes, "embedding gradient", err);
	if (st != TS_OK)
		return st;
	if (!grad_table || (rows && (!ids || !grad_out)))
		return BAD(err, "embedding gradient: NULL operand");
	void *sp = span(q, "embed_bwd");

	return traced(q, sp, k->ops->embed_bwd(k->impl, q, ids, id_bytes, rows, vocab, d, grad_out,
	                                       grad_table, err));
}

ts_status ts_k_xent(struct ts_kernels *k, struct ts_queue *q, const float *logits,
                    const void *targets, int id_bytes, uint64_t rows, int vocab, float *loss_dev,
                    float *grad, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "cross-entropy", err);

	if (st == TS_OK)
		st = check_tokens(vocab, 1, id_bytes, "cross-entropy", err);
	if (st != TS_OK)
		return st;
	if (rows == 0)
		return BAD(err, "cross-entropy: no rows");
	if (!logits || !targets || !loss_dev || !grad)
		return BAD(err, "cross-entropy: NULL operand");
	void *sp = span(q, "xent");

	return traced(q, sp, k->ops->xent(k->impl, q, logits, targets, id_bytes, rows, vocab,
	                                  loss_dev, grad, err));
}

/* ---- transformer blocks --------------------------------------------------------- */

ts_status ts_k_ln_fwd(struct ts_kernels *k, struct ts_queue *q, const float *x, const float *g,
                      const float *b, uint64_t rows, int d, float eps, float *y, float *stats,
                      struct ts_error *err)
{
	ts_status st = check_queue(k, q, "layernorm", err);

	if (st != TS_OK)
		return st;
	if (d < 1 || !(eps > 0.0f) || isinf(eps))
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "layernorm: width %d must be positive and eps %g finite and "
		                    "positive", d, (double)eps);
	if (rows == 0)
		return TS_OK;
	if (!x || !g || !b || !y || !stats)
		return BAD(err, "layernorm: NULL operand");
	void *sp = span(q, "ln_fwd");

	return traced(q, sp, k->ops->ln_fwd(k->impl, q, x, g, b, rows, d, eps, y, stats, err));
}

ts_status ts_k_ln_bwd(struct ts_kernels *k, struct ts_queue *q, const float *x, const float *g,
                      const float *stats, const float *dy, uint64_t rows, int d, float *dx,
                      float *dg, float *db, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "layernorm gradient", err);

	if (st != TS_OK)
		return st;
	if (d < 1)
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "layernorm gradient: width %d must be positive", d);
	if (!dg || !db || (rows && (!x || !g || !stats || !dy || !dx)))
		return BAD(err, "layernorm gradient: NULL operand");
	void *sp = span(q, "ln_bwd");

	return traced(q, sp, k->ops->ln_bwd(k->impl, q, x, g, stats, dy, rows, d, dx, dg, db, err));
}

ts_status ts_k_add_rows(struct ts_kernels *k, struct ts_queue *q, const float *x,
                        uint64_t period, float *y, uint64_t rows, int n, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "add rows", err);

	if (st != TS_OK)
		return st;
	if (n < 1 || period < 1)
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "add rows: width %d and period %llu must be positive", n,
		                    (unsigned long long)period);
	if (rows == 0)
		return TS_OK;
	if (!x || !y)
		return BAD(err, "add rows: NULL operand");
	void *sp = span(q, "add_rows");

	return traced(q, sp, k->ops->add_rows(k->impl, q, x, period, y, rows, n, err));
}

ts_status ts_k_sum_rows(struct ts_kernels *k, struct ts_queue *q, const float *dy,
                        uint64_t rows, int n, uint64_t period, float *out,
                        struct ts_error *err)
{
	ts_status st = check_queue(k, q, "sum rows", err);

	if (st != TS_OK)
		return st;
	if (n < 1 || period < 1)
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "sum rows: width %d and period %llu must be positive", n,
		                    (unsigned long long)period);
	if (!out || (rows && !dy))
		return BAD(err, "sum rows: NULL operand");
	void *sp = span(q, "sum_rows");

	return traced(q, sp, k->ops->sum_rows(k->impl, q, dy, rows, n, period, out, err));
}

ts_status ts_k_heads(struct ts_kernels *k, struct ts_queue *q, bool to_heads, const float *in,
                     float *out, int B, int T, int P, int H, int hd, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "heads", err);
	uint64_t n;

	if (st != TS_OK)
		return st;
	if (B < 1 || T < 1 || P < 1 || H < 1 || hd < 1)
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "heads: sizes B=%d T=%d P=%d H=%d hd=%d must be positive", B, T,
		                    P, H, hd);
	if (!in || !out)
		return BAD(err, "heads: NULL operand");
	n = (uint64_t)B * (uint64_t)T * (uint64_t)P * (uint64_t)H * (uint64_t)hd;
	if ((in < out && in + n > out) || (out < in && out + n > in) || in == out)
		return BAD(err, "heads: in and out overlap");
	void *sp = span(q, "heads");

	return traced(q, sp, k->ops->heads(k->impl, q, to_heads, in, out, B, T, P, H, hd, err));
}

/* C = beta * C batch by batch (K = 0: no operand to read; cuBLAS refuses a
 * leading dimension of 0, so no batched call). */
static ts_status batched_scale(struct ts_kernels *k, struct ts_queue *q, int M, int N,
                               float beta, float *C, uint64_t sC, int batch,
                               struct ts_error *err)
{
	ts_status st = TS_OK;

	for (int i = 0; i < batch && st == TS_OK; i++)
		st = k->ops->gemm(k->impl, q, false, false, M, N, 0, 1.0f, NULL, NULL, beta,
		                  C + (uint64_t)i * sC, err);
	return st;
}

ts_status ts_k_gemm_batched(struct ts_kernels *k, struct ts_queue *q, bool ta, bool tb, int M,
                            int N, int K, float alpha, const float *A, uint64_t sA,
                            const float *B, uint64_t sB, float beta, float *C, uint64_t sC,
                            int batch, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "batched gemm", err);

	if (st != TS_OK)
		return st;
	if (M < 0 || N < 0 || K < 0 || batch < 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "batched gemm: negative size (M=%d, N=%d, K=%d, batch=%d)", M, N,
		                    K, batch);
	if (M == 0 || N == 0 || batch == 0)
		return TS_OK;
	if (!C || (K > 0 && (!A || !B)))
		return BAD(err, "batched gemm: NULL operand");
	if (batch > 1 && sC < (uint64_t)M * (uint64_t)N)
		return BAD(err, "batched gemm: C's batches overlap (stride below M*N)");
	if (K == 0)
		return batched_scale(k, q, M, N, beta, C, sC, batch, err);
	void *sp = span(q, "gemm_batched");

	return traced(q, sp, k->ops->gemm_batched(k->impl, q, ta, tb, M, N, K, alpha, A, sA, B, sB,
	                                          beta, C, sC, batch, err));
}

ts_status ts_k_gemm_batched_lp(struct ts_kernels *k, struct ts_queue *q, enum ts_compute dt,
                               bool ta, bool tb, int M, int N, int K, float alpha,
                               const uint16_t *A, uint64_t sA, const uint16_t *B, uint64_t sB,
                               float beta, float *C, uint64_t sC, int batch,
                               struct ts_error *err)
{
	ts_status st = check_queue(k, q, "batched gemm_lp", err);

	if (st != TS_OK)
		return st;
	if (!lowp_known(dt))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "batched gemm_lp: compute dtype %d is not bfloat16 or float16",
		                    (int)dt);
	if (M < 0 || N < 0 || K < 0 || batch < 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "batched gemm_lp: negative size (M=%d, N=%d, K=%d, batch=%d)", M,
		                    N, K, batch);
	if (M == 0 || N == 0 || batch == 0)
		return TS_OK;
	if (!C || (K > 0 && (!A || !B)))
		return BAD(err, "batched gemm_lp: NULL operand");
	if (batch > 1 && sC < (uint64_t)M * (uint64_t)N)
		return BAD(err, "batched gemm_lp: C's batches overlap (stride below M*N)");
	if (K == 0)
		return batched_scale(k, q, M, N, beta, C, sC, batch, err);
	void *sp = span(q, "gemm_batched_lp");

	return traced(q, sp, k->ops->gemm_batched_lp(k->impl, q, dt, ta, tb, M, N, K, alpha, A, sA,
	                                             B, sB, beta, C, sC, batch, err));
}

static ts_status check_softmax(int batch, int T, float scale, const char *what,
                               struct ts_error *err)
{
	if (batch < 0 || T < 1 || !isfinite(scale))
		return ts_error_bad(err, "INVALID_ARGUMENT", NULL,
		                    "%s: batch %d must be >= 0, T %d positive and the scale %g "
		                    "finite", what, batch, T, (double)scale);
	return TS_OK;
}

ts_status ts_k_softmax_causal_fwd(struct ts_kernels *k, struct ts_queue *q, const float *S,
                                  int batch, int T, float scale, float *P, struct ts_error *err)
{
	ts_status st = check_queue(k, q, "causal softmax", err);

	if (st == TS_OK)
		st = check_softmax(batch, T, scale, "causal softmax", err);
	if (st != TS_OK || batch == 0)
		return st;
	if (!S || !P)
		return BAD(err, "causal softmax: NULL operand");
	void *sp = span(q, "softmax_fwd");

	return traced(q, sp, k->ops->softmax_fwd(k->impl, q, S, batch, T, scale, P, err));
}

ts_status ts_k_softmax_causal_bwd(struct ts_kernels *k, struct ts_queue *q, const float *P,
                                  const float *dP, int batch, int T, float scale, float *dS,
                                  struct ts_error *err)
{
	ts_status st = check_queue(k, q, "causal softmax gradient", err);

	if (st == TS_OK)
		st = check_softmax(batch, T, scale, "causal softmax gradient", err);
	if (st != TS_OK || batch == 0)
		return st;
	if (!P || !dP || !dS)
		return BAD(err, "causal softmax gradient: NULL operand");
	void *sp = span(q, "softmax_bwd");

	return traced(q, sp, k->ops->softmax_bwd(k->impl, q, P, dP, batch, T, scale, dS, err));
}

/* ---- device-timed timelines ------------------------------------------------ */

struct ts_k_timeline {
	struct ts_kernels *k;                   /* borrowed */
	void *impl;                             /* the backend's */
};

ts_status ts_k_timeline_new(struct ts_kernels *k, struct ts_k_timeline **out,
                            struct ts_error *err)
{
	struct ts_k_timeline *tl;
	ts_status st;

	if (!out)
		return BAD(err, "timeline: nowhere to put it");
	*out = NULL;
	if (!k)
		return BAD(err, "timeline: no kernels");
	if (!k->ops->timeline_new)
		return ts_error_set(err, TS_UNIMPLEMENTED, "NO_DEVICE_TIMING",
		                    "%s: %s kernels keep no device-timed timeline",
		                    ts_device_props(k->dev)->id, k->ops->name);
	tl = calloc(1, sizeof *tl);
	if (!tl)
		return ts_error_oom(err,
		                    "%s: out of memory for a timeline", ts_device_props(k->dev)->id);
	tl->k = k;
	st = k->ops->timeline_new(k->impl, &tl->impl, err);
	if (st != TS_OK) {
		free(tl);
		return st;
	}
	*out = tl;
	return TS_OK;
}

ts_status ts_k_timeline_mark(struct ts_k_timeline *tl, struct ts_queue *q, enum ts_k_mark m,
                             struct ts_error *err)
{
	ts_status st;

	if (!tl)
		return BAD(err, "timeline mark: no timeline");
	st = check_queue(tl->k, q, "timeline mark", err);
	if (st != TS_OK)
		return st;
	if (m != TS_K_OPEN && m != TS_K_CLOSE && m != TS_K_WAIT_BEGIN && m != TS_K_WAIT_END &&
	    m != TS_K_COMM_BEGIN && m != TS_K_COMM_END)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "INVALID_ARGUMENT",
		                    "timeline mark: unknown mark %d", (int)m);
	return tl->k->ops->timeline_mark(tl->impl, q, m, err);
}

ts_status ts_k_timeline_read(struct ts_k_timeline *tl, double *busy_s, double *wait_s,
                             double *comm_s, struct ts_error *err)
{
	double comm = 0;
	ts_status st;

	if (!tl || !busy_s || !wait_s)
		return BAD(err, "timeline read: no timeline or nowhere to put the times");
	*busy_s = *wait_s = 0;
	st = tl->k->ops->timeline_read(tl->impl, busy_s, wait_s, &comm, err);
	if (comm_s)
		*comm_s = st == TS_OK ? comm : 0;
	return st;
}

void ts_k_timeline_free(struct ts_k_timeline *tl)
{
	if (!tl)
		return;
	tl->k->ops->timeline_free(tl->impl);
	free(tl);
}
