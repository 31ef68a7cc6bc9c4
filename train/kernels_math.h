/*
 * kernels_math.h - the element-wise formulas of the training kernels, once,
 * for the CPU loops (kernels_cpu.c) and the CUDA kernels (cuda_kernels.cu):
 * activations and their gradients, the losses and their gradients, the
 * Adam, AdamW and SGD updates with clip_by_global_norm's scaling, the
 * learning-rate schedule, the order of the
 * reductions, and the mapping of a row-major gemm onto column-major BLAS.
 * What the CPU tests check is what the GPU runs.
 *
 * Every function is `static inline` and, under nvcc, `__host__ __device__`
 * (TS_HD). The formulas are optax's and jax.nn's: gelu is the tanh
 * approximation, Adam has bias correction and eps outside the square root,
 * clipping is clip_by_global_norm's select (a NaN norm clips).
 *
 * Reductions (sum of squares, the losses) run in one fixed order on both
 * backends: TS_RED_LANES partial sums in double, lane l taking elements
 * l, l + TS_RED_LANES, ... in increasing order, then a pairwise tree over
 * the lanes (lane l adds lane l + s for s = LANES/2, ..., 1). The products
 * of two floats are exact in double, so the result does not depend on
 * fused multiply-adds either: CPU and CUDA sums agree bit for bit, run
 * after run, whatever the order in which blocks are scheduled.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_KERNELS_MATH_H
#define TS_KERNELS_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "train/mlp.h"

#if defined(__CUDACC__)
#define TS_HD __host__ __device__
#else
#define TS_HD
#endif

/* sqrt(2 / pi) in float, as jax.nn.gelu rounds it. */
#define TS_GELU_S 0.7978845608028654f
#define TS_GELU_C 0.044715f

/* Partial sums of a reduction: one CUDA block of this many threads. */
#define TS_RED_LANES 256

/* ---- losses and reductions ------------------------------------------------- */

/* One element's term of a sum of squares. */
TS_HD static inline double ts_m_sq(float x)
{
	return (double)x * x;
}

/* mse: the difference, its term of the sum, and its gradient 2 d / n. */
TS_HD static inline float ts_m_mse_diff(float out, float target)
{
	return out - target;
}

TS_HD static inline float ts_m_mse_grad(float d, uint64_t n)
{
	return 2.0f * d / (float)n;
}

/* The loss from the reduced sum: sum itself, or mse's mean. */
TS_HD static inline float ts_m_loss_value(int loss, double sum, uint64_t n)
{
	return (float)(loss == TS_LOSS_SUM ? sum : sum / (double)n);
}

/* The global norm's accumulator after adding one tensor's sum. */
TS_HD static inline float ts_m_sumsq_acc(float acc, double sum)
{
	return (float)((double)acc + sum);
}

/* ---- token models ----------------------------------------------------------- */

/* Token id r of ids (uint16 when id_bytes is 2, else int32), or -1 when it
 * is outside [0, vocab) (the caller checked: a stray one reads as nothing). */
TS_HD static inline int64_t ts_m_token(const void *ids, int id_bytes, uint64_t r, int vocab)
{
	int64_t v = id_bytes == 2 ? (int64_t)((const uint16_t *)ids)[r]
	                          : (int64_t)((const int32_t *)ids)[r];

	return v >= 0 && v < vocab ? v : -1;
}

/* Double products and sums rounded one by one, never fused (nvcc would
 * contract a * b + c; the host build does not): both backends compute the
 * same bits. */
#if defined(__CUDA_ARCH__)
#define TS_M_DMUL(a, b) __dmul_rn((a), (b))
#define TS_M_DADD(a, b) __dadd_rn((a), (b))
#else
#define TS_M_DMUL(a, b) ((a) * (b))
#define TS_M_DADD(a, b) ((a) + (b))
#endif

/* A float's bits and back. */
TS_HD static inline int32_t ts_m_fbits(float x)
{
#if defined(__CUDA_ARCH__)
	return __float_as_int(x);
#else
	int32_t b;

	memcpy(&b, &x, sizeof b);
	return b;
#endif
}

TS_HD static inline float ts_m_ffrom(int32_t b)
{
#if defined(__CUDA_ARCH__)
	return __int_as_float(b);
#else
	float x;

	memcpy(&x, &b, sizeof x);
	return x;
#endif
}

/* A double's bits and back. */
TS_HD static inline int64_t ts_m_dbits(double x)
{
#if defined(__CUDA_ARCH__)
	return __double_as_longlong(x);
#else
	int64_t b;

	memcpy(&b, &x, sizeof b);
	return b;
#endif
}

TS_HD static inline double ts_m_dfrom(int64_t b)
{
#if defined(__CUDA_ARCH__)
	return __longlong_as_double(b);
#else
	double x;

	memcpy(&x, &b, sizeof x);
	return x;
#endif
}

/*
 * exp(a) in double for a <= 0 (a > 0 reads as 0; NaN stays NaN), without
 * branches, so that the CPU loop over a row vectorises, and the same
 * operations on both backends: a = k ln 2 + r with k = round(a / ln 2) and
 * ln 2 in two parts (the high one's product with k is exact), exp(r) for
 * |r| <= ln 2 / 2 as 1 + r + r^2 (1/2! + r (1/3! + ... + r / 13!)) (the
 * series' remainder is below 1e-17 relative), times 2^k put into the
 * exponent's bits. Within an ulp or so of the correctly rounded value;
 * below -708 (exp(a) < 2^-1021) it is 0: a term a row's sum (at least 1,
 * the max's own term) cannot hold anyway.
 */
TS_HD static inline double ts_m_exp_neg(double a)
{
	const double l2e = 1.4426950408889634, shift = 6755399441055744.0; /* 1.5 * 2^52 */
	const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
	double lo = a < -708.0 ? -708.0 : a, ac = lo > 0.0 ? 0.0 : lo;
	double t = TS_M_DADD(TS_M_DMUL(ac, l2e), shift), kd = t - shift;
	double r = TS_M_DADD(TS_M_DADD(ac, -TS_M_DMUL(kd, ln2_hi)), -TS_M_DMUL(kd, ln2_lo));
	double q = 1.0 / 6227020800.0;                          /* 1/13! */

	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 479001600.0);      /* 1/12! */
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 39916800.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 3628800.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 362880.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 40320.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 5040.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 720.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 120.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 24.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 1.0 / 6.0);
	q = TS_M_DADD(TS_M_DMUL(q, r), 0.5);                    /* 1/2! */
	q = TS_M_DADD(1.0, TS_M_DADD(r, TS_M_DMUL(TS_M_DMUL(r, r), q)));
	q = ts_m_dfrom(ts_m_dbits(q) + (int64_t)((uint64_t)(ts_m_dbits(t) - ts_m_dbits(shift)) << 52));
	q = a != a ? a : q;
	return a < -708.0 ? 0.0 : q;
}

/*
 * tanh(x) rounded to float, from ts_m_exp_neg: for |x| = a,
 * tanh(a) = (1 - e) / (1 + e) with e = exp(-2a) in double, whose
 * cancellation costs at most 2^-52 / (2a) relative, below half a float ulp
 * for a >= 2^-20; below that a - a^3 / 3 (the series' next term, 2 a^5 / 15,
 * is far below an ulp). Without branches, so that a CPU loop over it
 * vectorises where libm's tanhf is a call per element, and the same
 * operations on both backends. Inf reads as 1, NaN stays NaN.
 */
TS_HD static inline float ts_m_tanh(float x)
{
	double a = fabs((double)x);
	double e = ts_m_exp_neg(TS_M_DMUL(-2.0, a));
	double t = (1.0 - e) / (1.0 + e);
	double small = TS_M_DMUL(a, TS_M_DADD(1.0, -TS_M_DMUL(TS_M_DMUL(a, a), 1.0 / 3.0)));
	float r = (float)(a < 0x1p-20 ? small : t);

	return copysignf(r, x);
}

/*
 * exp(a) in float for a <= 0 (a > 0 reads as 0; NaN stays NaN), the
 * cross-entropy's and the attention's terms, without branches, so that
 * the CPU loop over a row vectorises (16 lanes of avx512f, twice
 * ts_m_exp_neg's 8): a = k ln 2 + r with k = round(a / ln 2) and ln 2 in
 * two parts, exp(r) for |r| <= ln 2 / 2 as 1 + r + r^2 (1/2! + r (1/3! +
 * ... + r / 7!)) (the series' remainder is below 6e-9 relative), times
 * 2^k put into the exponent's bits. Within an ulp of the correctly rounded value
 * over all of [-87, 0] (test_kernels' test_exp_negf_within_an_ulp checks
 * every 31st float); below -87 (past the normal floats) it is 0: a term
 * that a row's sum (at least 1, the max's own term) cannot hold anyway.
 * Written with fmaf: a fused multiply-add is one correctly rounded
 * operation on every backend, so CUDA, the CPU's clones (avx512f and
 * x86-64-v3 make it one instruction; a CPU without FMA gets libm's, slower
 * and the same bits) and any compiler, whatever it contracts, compute the
 * same bits.
 */
TS_HD static inline float ts_m_exp_negf(float a)
{
	const float l2e = 1.44269504f, shift = 12582912.0f; /* 1.5 * 2^23 */
	const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
	float lo = a < -87.0f ? -87.0f : a, ac = lo > 0.0f ? 0.0f : lo;
	float t = fmaf(ac, l2e, shift), kf = t - shift;
	float r = fmaf(-kf, ln2_lo, fmaf(-kf, ln2_hi, ac));
	float q = 1.0f / 5040.0f;                               /* 1/7! */

	q = fmaf(q, r, 1.0f / 720.0f);
	q = fmaf(q, r, 1.0f / 120.0f);
	q = fmaf(q, r, 1.0f / 24.0f);
	q = fmaf(q, r, 1.0f / 6.0f);
	q = fmaf(q, r, 0.5f);                                   /* 1/2! */
	q = 1.0f + fmaf(r * r, q, r);
	q = ts_m_ffrom(ts_m_fbits(q) + (int32_t)((uint32_t)(ts_m_fbits(t) - ts_m_fbits(shift)) << 23));
	q = a != a ? a : q;
	return a < -87.0f ? 0.0f : q;
}

/*
 * GELU's tanh in its forward pass: the 13/6-degree rational interpolant
 * that Eigen's and XLA's CPU tanh use, x p(x^2) / q(x^2) in float with
 * its multiply-adds fused (fmaf: one correctly rounded operation on every
 * backend, so CUDA, the CPU's clones and any compiler give the same bits),
 * x clamped to +-7.99881172180175781 (where the interpolant is 1; tanh is
 * 1 in float from about 8.7), x itself below 0.0004. So GELU's forward
 * has the bits of JAX's jax.nn.gelu on the CPU (jax 0.10.2: every one of
 * 4.2 million points in [-40, 40] alike for tanh, and a million normal
 * GELU inputs), and runs in 16 lanes without a double division (a third
 * of ts_m_tanh's time, docs/BENCHMARKS.md). Within 5 ulps of the correctly
 * rounded tanh over every float, never past +-1 (test_kernels'
 * test_tanh_rational_within_5_ulps checks every 97th). Inf reads as +-1,
 * NaN stays NaN. The backward pass keeps ts_m_tanh (ts_m_gelu_grad): with
 * this one there, float16 models' gradients landed across float16
 * rounding boundaries from jax.grad's (it_optax's
 * test_float16_adam_vs_jax).
 */
TS_HD static inline float ts_m_tanh_rational(float x)
{
	const float edge = 7.99881172180175781f;
	float c = x > edge ? edge : x < -edge ? -edge : x;
	float x2 = c * c;
	float p = fmaf(x2, -2.76076847742355e-16f, 2.00018790482477e-13f);
	float q = fmaf(x2, 1.19825839466702e-06f, 1.18534705686654e-04f);
	float r;

	p = fmaf(x2, p, -8.60467152213735e-11f);
	p = fmaf(x2, p, 5.12229709037114e-08f);
	p = fmaf(x2, p, 1.48572235717979e-05f);
	p = fmaf(x2, p, 6.37261928875436e-04f);
	p = fmaf(x2, p, 4.89352455891786e-03f);
	q = fmaf(x2, q, 2.26843463243900e-03f);
	q = fmaf(x2, q, 4.89352518554385e-03f);
	r = (c * p) / q;
	r = fabsf(x) < 0.0004f ? x : r;
	return x != x ? x : r;
}

/* ---- activations ----------------------------------------------------------- */

TS_HD static inline float ts_m_relu(float x)
{
	return x < 0.0f ? 0.0f : x;
}

TS_HD static inline float ts_m_gelu(float x)
{
	float cdf = 0.5f * (1.0f + ts_m_tanh_rational(TS_GELU_S * fmaf(TS_GELU_C, x * x * x, x)));

	return x * cdf;
}

/* d gelu / dx of the tanh approximation, exactly differentiated. */
TS_HD static inline float ts_m_gelu_grad(float x)
{
	float x2 = x * x;
	float t = ts_m_tanh(TS_GELU_S * (x + TS_GELU_C * (x2 * x)));
	float du = TS_GELU_S * (1.0f + 3.0f * TS_GELU_C * x2);

	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

/* jax.nn.relu's derivative is 0 at 0; go passes through untouched where
 * the derivative is 1 (no 0 * inf). */
TS_HD static inline float ts_m_relu_bwd(float pre, float go)
{
	return pre > 0.0f ? go : 0.0f;
}

TS_HD static inline float ts_m_gelu_bwd(float pre, float go)
{
	return go * ts_m_gelu_grad(pre);
}

TS_HD static inline float ts_m_tanh_bwd(float pre, float go)
{
	float t = ts_m_tanh(pre);

	return go * (1.0f - t * t);
}

TS_HD static inline float ts_m_act_fwd(int act, float x)
{
	switch (act) {
	case TS_ACT_RELU:
		return ts_m_relu(x);
	case TS_ACT_GELU:
		return ts_m_gelu(x);
	case TS_ACT_TANH:
		return ts_m_tanh(x);
	default:
		return x;
	}
}

TS_HD static inline float ts_m_act_bwd(int act, float pre, float go)
{
	switch (act) {
	case TS_ACT_RELU:
		return ts_m_relu_bwd(pre, go);
	case TS_ACT_GELU:
		return ts_m_gelu_bwd(pre, go);
	case TS_ACT_TANH:
		return ts_m_tanh_bwd(pre, go);
	default:
		return go;
	}
}


/* Softmax cross-entropy of one row of logits: exp(x - max) summed (in
 * double, the lanes' order) gives the row's loss log(sum) + max - x[target]
 * and each gradient (exp(x - max) / sum - [j == target]) / rows, the
 * division by sum a product with inv = 1 / sum (ts_m_inv; a division per
 * element cost the CPU about 2 cycles of its 6). x - max is <= 0 (max is
 * the row's largest) and rounded once, as float subtraction rounds; its
 * exp is a float (ts_m_exp_negf), whose terms are summed in double. */
TS_HD static inline double ts_m_xent_exp(float x, float max)
{
	return (double)ts_m_exp_negf(x - max);
}

TS_HD static inline float ts_m_xent_loss(double sum, float max, float xt)
{
	return (float)(log(sum) + (double)max - (double)xt);
}

/* q / rows, as the product with 1 / rows when rows is a power of two:
 * then both are the same real number rounded once, the same bits, and
 * the product is the cheaper (the loop over a row vectorises either way,
 * unswitched on rows). */
TS_HD static inline double ts_m_div_rows(double q, uint64_t rows)
{
	return (rows & (rows - 1)) == 0 ? q * (1.0 / (double)rows) : q / (double)rows;
}

/* 1 / sum of a row's terms: each term's share is its product with it
 * (the cross-entropy's gradient, the attention's probabilities). */
TS_HD static inline double ts_m_inv(double sum)
{
	return 1.0 / sum;
}

/* The gradient from the element's term e = ts_m_xent_exp(x, max), inv
 * the row's ts_m_inv. */
TS_HD static inline float ts_m_xent_grad_e(double e, double inv, bool target, uint64_t rows)
{
	return (float)ts_m_div_rows(fma(e, inv, target ? -1.0 : 0.0), rows);
}

TS_HD static inline float ts_m_xent_grad(float x, float max, double inv, bool target,
                                         uint64_t rows)
{
	return ts_m_xent_grad_e(ts_m_xent_exp(x, max), inv, target, rows);
}

/* The attention's probability of a score whose term is e, inv the row's
 * ts_m_inv. */
TS_HD static inline float ts_m_softmax_p(double e, double inv)
{
	return (float)(e * inv);
}

/* ---- transformer blocks (the GPT model) ----------------------------------- */

/* LayerNorm of a row of d: the mean and the variance (population, as
 * jnp.var) are sums in double in the lanes' order, the variance's terms the
 * squares of each deviation from the mean rounded to float (exact in
 * double); rstd = 1 / sqrt(var + eps) in double, kept as a float beside the
 * mean. Every product that feeds a sum here and in the gradient is exact
 * in double, so a fused multiply-add (which nvcc and the stand-in's host
 * build contract to) computes the same bits as separate operations. */
TS_HD static inline double ts_m_ln_dev_sq(float x, double mean)
{
	float dv = (float)((double)x - mean);

	return (double)dv * (double)dv;
}

TS_HD static inline float ts_m_ln_rstd(double var_sum, int d, float eps)
{
	return (float)(1.0 / sqrt(var_sum / (double)d + (double)eps));
}

TS_HD static inline float ts_m_ln_xhat(float x, float mean, float rstd)
{
	return (float)(((double)x - (double)mean) * (double)rstd);
}

TS_HD static inline float ts_m_ln_out(float xhat, float g, float b)
{
	return (float)((double)xhat * (double)g + (double)b);
}

/* The gradient: dyg = dy g (a float), the row's sums s1 = sum(dyg) and
 * s2 = sum(dyg xhat), and each element's rstd (dyg - s1 / d - xhat c) with
 * c = s2 / d rounded to float. */
TS_HD static inline float ts_m_ln_dyg(float dy, float g)
{
	return dy * g;
}

TS_HD static inline float ts_m_ln_dx(float dyg, float xhat, float rstd, double s1, double s2,
                                      int d)
{
	float c = (float)(s2 / (double)d);
	double t = (double)dyg - s1 / (double)d;

	t = t - (double)xhat * (double)c;
	return (float)(t * (double)rstd);
}

/* Causal softmax of a row of scores: x = scale * s (a float product),
 * max the row's largest x, the terms exp(s scale - max) (ts_m_att_exp),
 * their sum in double in the lanes' order, p = term / sum (the product
 * with ts_m_inv). Its gradient: scale p (dp - sum(p dp)), the sum of exact
 * products in the lanes' order (no product feeds an add). */
TS_HD static inline float ts_m_att_scaled(float s, float scale)
{
	return s * scale;
}

/* A score's term: s scale - max as one fmaf (a product that feeds a sum,
 * which a compiler could fuse or not: fused on every backend), its exp. */
TS_HD static inline double ts_m_att_exp(float s, float scale, float max)
{
	return (double)ts_m_exp_negf(fmaf(s, scale, -max));
}

TS_HD static inline float ts_m_att_grad(float p, float dp, double pdp, float scale)
{
	return (float)((double)p * ((double)dp - pdp) * (double)scale);
}

/* Heads: element i of a [B, T, P, H, hd] tensor and its place in the
 * [P, B, H, T, hd] layout the batched products take. */
TS_HD static inline uint64_t ts_m_heads_index(uint64_t i, uint64_t B, uint64_t T, uint64_t P,
                                              uint64_t H, uint64_t hd)
{
	uint64_t e = i % hd, h = (i / hd) % H, p = (i / (hd * H)) % P;
	uint64_t t = (i / (hd * H * P)) % T, b = i / (hd * H * P * T);

	return (((p * B + b) * H + h) * T + t) * hd + e;
}

/* ---- optimizer updates ----------------------------------------------------- */

/* What one update needs, computed once on the host per kernel. */
struct ts_m_update {
	float lr, b1, b2, eps;
	float bc1, bc2;         /* 1 - b^t; 1 for sgd */
	float clip;             /* 0: none */
};

/* Adam's bias correction 1 - b^t. */
static inline float ts_m_bias_correction(float b, int step)
{
	return 1.0f - powf(b, (float)step);
}

/* clip_by_global_norm's decision from the norm's square: whether to clip,
 * and the norm in *norm (optax: select(norm < c, g, g / norm * c), so a
 * NaN norm clips). */
TS_HD static inline bool ts_m_clips(float gnorm_sq, float c, float *norm)
{
	*norm = sqrtf(gnorm_sq);
	return !(*norm < c);
}

TS_HD static inline float ts_m_clip_grad(float g, bool clip, float norm, float c)
{
	return clip ? g / norm * c : g;
}

TS_HD static inline float ts_m_sgd(float p, float g, float lr)
{
	return p - lr * g;
}

/*
 * The learning rate of the update after count updates (count 0 for the
 * first), on the host, once per update kernel, for both backends: the
 * constant, or optax's warmup_cosine_decay_schedule in float32 as optax
 * evaluates it (Python-float constants such as init - peak and
 * end / peak are formed in double and rounded once; count / steps, the
 * cosine and the products in float32).
 */
static inline float ts_m_learning_rate(const struct ts_optimizer *o, int count)
{
	const struct ts_schedule *s = &o->schedule;
	int warm = s->warmup_steps, span = s->decay_steps - s->warmup_steps;
	float c, cd;
	double alpha;

	if (s->type != TS_SCHED_WARMUP_COSINE)
		return o->learning_rate;
	if (count < 0)
		count = 0;
	if (count < warm) {
		/* linear_schedule(init, peak, warm): (init - peak) * frac + peak */
		float frac = 1.0f - (float)count / (float)warm;

		return (float)((double)s->init_value - (double)s->peak_value) * frac + s->peak_value;
	}
	/* cosine_decay_schedule(peak, decay - warm, alpha = end / peak) at count - warm */
	c = (float)(count - warm);
	if (c > (float)span)
		c = (float)span;
	cd = 0.5f * (1.0f + cosf((float)3.141592653589793 * c / (float)span));
	alpha = s->peak_value == 0.0f ? 0.0 : (double)s->end_value / (double)s->peak_value;
	return s->peak_value * ((float)(1.0 - alpha) * cd + (float)alpha);
}

/* One Adam element: new m, v into *m, *v; returns the new parameter. wd is
 * AdamW's decoupled weight decay (0 for Adam): optax's add_decayed_weights
 * adds wd * p to Adam's update before the learning rate scales it. */
TS_HD static inline float ts_m_adam(float p, float g, float *m, float *v, float lr, float b1,
                                    float b2, float eps, float bc1, float bc2, float wd)
{
	float mm = (1.0f - b1) * g + b1 * *m;
	float vv = (1.0f - b2) * (g * g) + b2 * *v;
	float u = (mm / bc1) / (sqrtf(vv / bc2) + eps);

	*m = mm;
	*v = vv;
	/* no branch on wd (0 for Adam): the CPU loop over it must vectorise */
	u = u + wd * p;
	return p - lr * u;
}

/* ---- gemm ------------------------------------------------------------------- */

/*
 * Row-major C[M,N] = alpha op(A) op(B) + beta C is column-major
 * C^T[N,M] = op(B)^T op(A)^T: the column-major call gets the operands
 * swapped (B first), the same transposes, m = N, n = M, and leading
 * dimensions that are the row lengths of the row-major matrices. Nothing
 * is transposed in memory.
 */
struct ts_m_colmajor_gemm {
	bool transa, transb;    /* of the first and second column-major operand */
	int m, n, k;
	bool a_is_B;            /* always true: the first operand is B */
	int lda, ldb, ldc;
};

static inline struct ts_m_colmajor_gemm ts_m_gemm_colmajor(bool ta, bool tb, int M, int N, int K)
{
	struct ts_m_colmajor_gemm g;

	g.transa = tb;
	g.transb = ta;
	g.m = N;
	g.n = M;
	g.k = K;
	g.a_is_B = true;
	g.lda = tb ? K : N;
	g.ldb = ta ? M : K;
	g.ldc = N;
	return g;
}

#endif
