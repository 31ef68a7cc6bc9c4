/*
 * kernels_cpu.c - the training kernels on the host, for cpu and sim devices.
 *
 * Each kernel is one job on its queue: the call copies its arguments into a
 * small closure and enqueues it with ts_queue_host_fn; the queue's worker
 * runs it after the queue's earlier work and frees the closure. So kernels
 * run asynchronously and in queue order, as GPU work does on a stream, and
 * operands stay borrowed until the queue has run them.
 *
 * gemm is OpenBLAS's cblas_sgemm; everything else is a plain, single
 * threaded loop in float arithmetic (sums in double), so a sequence of
 * kernels gives bit-identical results run after run. The formulas are
 * optax's and jax.nn's: gelu is the tanh approximation, Adam has bias
 * correction and eps outside the square root, clipping is
 * clip_by_global_norm's select.
 *
 * Thread-safety: stateless; each job touches only its own operands.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "train/kernels_int.h"

/* sqrt(2 / pi) in float, as jax.nn.gelu rounds it. */
#define GELU_S 0.7978845608028654f
#define GELU_C 0.044715f

struct job;
typedef void (*job_fn)(const struct job *j);

/* One enqueued kernel: what to run, and its arguments (operands borrowed). */
struct job {
	job_fn run;
	union {
		struct {
			bool ta, tb;
			int M, N, K;
			float alpha, beta;
			const float *A, *B;
			float *C;
		} gemm;
		struct {
			enum ts_act act;
			const float *in;        /* fwd: input; bwd: pre-activation */
			const float *grad;      /* bwd: gradient of the output */
			float *out;
			uint64_t n;
		} act;
		struct {
			const float *x;
			float *y;
			uint64_t n;
		} add;
		struct {
			enum ts_loss loss;
			const float *out, *target;
			float *value, *grad;
			uint64_t n;
		} loss;
		struct {
			const float *x;
			float *acc;
			uint64_t n;
		} sumsq;
		struct {
			struct ts_optimizer opt;    /* copied: the caller's may go */
			int step;
			float *p, *mu, *nu;
			const float *g, *gnorm_sq;
			uint64_t n;
		} update;
		struct {
			float *x;
			float v;
			uint64_t n;
		} fill;
	} u;
};

/* ---- the kernels (run on the queue's worker) ------------------------------ */

static void run_gemm(const struct job *j)
{
	int M = j->u.gemm.M, N = j->u.gemm.N, K = j->u.gemm.K;
	float beta = j->u.gemm.beta;
	float *C = j->u.gemm.C;

	if (K == 0) {
		/* C = beta * C, and BLAS's beta == 0 ignores what C held */
		for (size_t i = 0; i < (size_t)M * (size_t)N; i++)
			C[i] = beta == 0.0f ? 0.0f : beta * C[i];
		return;
	}
	cblas_sgemm(CblasRowMajor, j->u.gemm.ta ? CblasTrans : CblasNoTrans,
	            j->u.gemm.tb ? CblasTrans : CblasNoTrans, M, N, K, j->u.gemm.alpha,
	            j->u.gemm.A, j->u.gemm.ta ? M : K, j->u.gemm.B, j->u.gemm.tb ? K : N, beta,
	            C, N);
}

static float gelu(float x)
{
	float cdf = 0.5f * (1.0f + tanhf(GELU_S * (x + GELU_C * (x * x * x))));

	return x * cdf;
}

/* d gelu / dx of the tanh approximation, exactly differentiated. */
static float gelu_grad(float x)
{
	float x2 = x * x;
	float t = tanhf(GELU_S * (x + GELU_C * (x2 * x)));
	float du = GELU_S * (1.0f + 3.0f * GELU_C * x2);

	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

static void run_act_fwd(const struct job *j)
{
	const float *in = j->u.act.in;
	float *out = j->u.act.out;
	uint64_t n = j->u.act.n;

	switch (j->u.act.act) {
	case TS_ACT_RELU:
		for (uint64_t i = 0; i < n; i++)
			out[i] = in[i] < 0.0f ? 0.0f : in[i];
		break;
	case TS_ACT_GELU:
		for (uint64_t i = 0; i < n; i++)
			out[i] = gelu(in[i]);
		break;
	case TS_ACT_TANH:
		for (uint64_t i = 0; i < n; i++)
			out[i] = tanhf(in[i]);
		break;
	case TS_ACT_NONE:
	default:
		for (uint64_t i = 0; i < n && in != out; i++)
			out[i] = in[i];
		break;
	}
}

static void run_act_bwd(const struct job *j)
{
	const float *pre = j->u.act.in, *go = j->u.act.grad;
	float *gi = j->u.act.out;
	uint64_t n = j->u.act.n;

	switch (j->u.act.act) {
	case TS_ACT_RELU:
		/* jax.nn.relu's derivative is 0 at 0 */
		for (uint64_t i = 0; i < n; i++)
			gi[i] = pre[i] > 0.0f ? go[i] : 0.0f;
		break;
	case TS_ACT_GELU:
		for (uint64_t i = 0; i < n; i++)
			gi[i] = go[i] * gelu_grad(pre[i]);
		break;
	case TS_ACT_TANH:
		for (uint64_t i = 0; i < n; i++) {
			float t = tanhf(pre[i]);

			gi[i] = go[i] * (1.0f - t * t);
		}
		break;
	case TS_ACT_NONE:
	default:
		for (uint64_t i = 0; i < n && go != gi; i++)
			gi[i] = go[i];
		break;
	}
}

static void run_add(const struct job *j)
{
	const float *x = j->u.add.x;
	float *y = j->u.add.y;

	for (uint64_t i = 0; i < j->u.add.n; i++)
		y[i] += x[i];
}

static void run_loss(const struct job *j)
{
	const float *out = j->u.loss.out, *target = j->u.loss.target;
	float *grad = j->u.loss.grad;
	uint64_t n = j->u.loss.n;
	double sum = 0.0;

	if (j->u.loss.loss == TS_LOSS_SUM) {
		for (uint64_t i = 0; i < n; i++) {
			sum += out[i];
			grad[i] = 1.0f;
		}
		*j->u.loss.value = (float)sum;
		return;
	}
	for (uint64_t i = 0; i < n; i++) {
		float d = out[i] - target[i];

		sum += (double)d * d;
		grad[i] = 2.0f * d / (float)n;
	}
	*j->u.loss.value = (float)(sum / (double)n);
}

static void run_sumsq(const struct job *j)
{
	const float *x = j->u.sumsq.x;
	double sum = 0.0;

	for (uint64_t i = 0; i < j->u.sumsq.n; i++)
		sum += (double)x[i] * x[i];
	*j->u.sumsq.acc = (float)((double)*j->u.sumsq.acc + sum);
}

/*
 * Adam over n parameters. The operands never overlap (restrict), so the
 * compiler vectorises the loop (the build passes -fno-math-errno, letting
 * sqrtf become one instruction); the arithmetic per element is exactly the
 * scalar one.
 */
static void adam_loop(float *restrict p, const float *restrict g, float *restrict mu,
                      float *restrict nu, uint64_t n, float lr, float b1, float b2, float eps,
                      float bc1, float bc2, float norm, float c, bool clip)
{
	/* -O3 unswitches the loop on the invariant clip, then vectorises each copy */
	for (uint64_t i = 0; i < n; i++) {
		float gi = clip ? g[i] / norm * c : g[i];
		float m = (1.0f - b1) * gi + b1 * mu[i];
		float v = (1.0f - b2) * (gi * gi) + b2 * nu[i];

		mu[i] = m;
		nu[i] = v;
		p[i] -= lr * ((m / bc1) / (sqrtf(v / bc2) + eps));
	}
}

static void run_update(const struct job *j)
{
	const struct ts_optimizer *o = &j->u.update.opt;
	const float *g = j->u.update.g;
	float *p = j->u.update.p, *mu = j->u.update.mu, *nu = j->u.update.nu;
	uint64_t n = j->u.update.n;
	float lr = o->learning_rate, c = o->clip_global_norm, norm = 0.0f;
	bool clip = false;

	if (c > 0.0f) {
		/* optax: select(norm < c, g, g / norm * c); a NaN norm clips */
		norm = sqrtf(*j->u.update.gnorm_sq);
		clip = !(norm < c);
	}
	if (o->type == TS_OPT_SGD) {
		for (uint64_t i = 0; i < n; i++) {
			float gi = clip ? g[i] / norm * c : g[i];

			p[i] -= lr * gi;
		}
		return;
	}

	adam_loop(p, g, mu, nu, n, lr, o->b1, o->b2, o->eps,
	          1.0f - powf(o->b1, (float)j->u.update.step),
	          1.0f - powf(o->b2, (float)j->u.update.step), clip ? norm : 1.0f, clip ? c : 1.0f,
	          clip);
}

static void run_fill(const struct job *j)
{
	float *x = j->u.fill.x;
	float v = j->u.fill.v;

	for (uint64_t i = 0; i < j->u.fill.n; i++)
		x[i] = v;
}

/* ---- enqueueing ------------------------------------------------------------ */

/* The host callback: runs the kernel, then frees its closure (steals arg). */
static void job_main(void *arg)
{
	struct job *j = arg;

	j->run(j);
	free(j);
}

/* A new closure for run in *out (owned by the caller until submitted). */
static ts_status job_new(job_fn run, struct ts_queue *q, struct job **out, struct ts_error *err)
{
	struct job *j = calloc(1, sizeof *j);

	*out = j;
	if (!j)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		                    "%s: out of memory queueing a kernel",
		                    ts_device_props(ts_queue_device(q))->id);
	j->run = run;
	return TS_OK;
}

/* Enqueues j on q (steals j, also on failure). */
static ts_status job_submit(struct ts_queue *q, struct job *j, struct ts_error *err)
{
	ts_status st = ts_queue_host_fn(q, job_main, j, err);

	if (st != TS_OK)
		free(j);
	return st;
}

static ts_status cpu_init(struct ts_device *dev, void **impl, struct ts_error *err)
{
	*impl = NULL;
	return TS_OK;
}

static void cpu_fini(void *impl)
{
}

static ts_status cpu_gemm(void *impl, struct ts_queue *q, bool ta, bool tb, int M, int N, int K,
                          float alpha, const float *A, const float *B, float beta, float *C,
                          struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_gemm, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.gemm.ta = ta;
	j->u.gemm.tb = tb;
	j->u.gemm.M = M;
	j->u.gemm.N = N;
	j->u.gemm.K = K;
	j->u.gemm.alpha = alpha;
	j->u.gemm.beta = beta;
	j->u.gemm.A = A;
	j->u.gemm.B = B;
	j->u.gemm.C = C;
	return job_submit(q, j, err);
}

static ts_status cpu_act_fwd(void *impl, struct ts_queue *q, enum ts_act act, const float *in,
                             float *out, uint64_t n, struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_act_fwd, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.act.act = act;
	j->u.act.in = in;
	j->u.act.out = out;
	j->u.act.n = n;
	return job_submit(q, j, err);
}

static ts_status cpu_act_bwd(void *impl, struct ts_queue *q, enum ts_act act, const float *pre,
                             const float *grad_out, float *grad_in, uint64_t n,
                             struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_act_bwd, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.act.act = act;
	j->u.act.in = pre;
	j->u.act.grad = grad_out;
	j->u.act.out = grad_in;
	j->u.act.n = n;
	return job_submit(q, j, err);
}

static ts_status cpu_add(void *impl, struct ts_queue *q, const float *x, float *y, uint64_t n,
                         struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_add, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.add.x = x;
	j->u.add.y = y;
	j->u.add.n = n;
	return job_submit(q, j, err);
}

static ts_status cpu_loss(void *impl, struct ts_queue *q, enum ts_loss loss, const float *out,
                          const float *target, float *loss_dev, float *grad, uint64_t n,
                          struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_loss, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.loss.loss = loss;
	j->u.loss.out = out;
	j->u.loss.target = target;
	j->u.loss.value = loss_dev;
	j->u.loss.grad = grad;
	j->u.loss.n = n;
	return job_submit(q, j, err);
}

static ts_status cpu_sumsq(void *impl, struct ts_queue *q, const float *x, uint64_t n,
                           float *acc, struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_sumsq, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.sumsq.x = x;
	j->u.sumsq.acc = acc;
	j->u.sumsq.n = n;
	return job_submit(q, j, err);
}

static ts_status cpu_update(void *impl, struct ts_queue *q, const struct ts_optimizer *opt,
                            int step, float *p, const float *g, float *mu, float *nu,
                            uint64_t n, const float *gnorm_sq_dev, struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_update, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.update.opt = *opt;
	j->u.update.step = step;
	j->u.update.p = p;
	j->u.update.g = g;
	j->u.update.mu = mu;
	j->u.update.nu = nu;
	j->u.update.n = n;
	j->u.update.gnorm_sq = gnorm_sq_dev;
	return job_submit(q, j, err);
}

static ts_status cpu_fill(void *impl, struct ts_queue *q, float *x, float v, uint64_t n,
                          struct ts_error *err)
{
	struct job *j;
	ts_status st = job_new(run_fill, q, &j, err);

	if (st != TS_OK)
		return st;
	j->u.fill.x = x;
	j->u.fill.v = v;
	j->u.fill.n = n;
	return job_submit(q, j, err);
}

static const struct ts__kernel_ops cpu_ops = {
	.name = "cpu",
	.init = cpu_init,
	.fini = cpu_fini,
	.gemm = cpu_gemm,
	.act_fwd = cpu_act_fwd,
	.act_bwd = cpu_act_bwd,
	.add = cpu_add,
	.loss = cpu_loss,
	.sumsq = cpu_sumsq,
	.update = cpu_update,
	.fill = cpu_fill,
};

const struct ts__kernel_ops *ts__kernels_cpu_ops(void)
{
	return &cpu_ops;
}
