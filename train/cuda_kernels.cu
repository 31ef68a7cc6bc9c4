/*
 * cuda_kernels.cu - the training kernels on a CUDA GPU: cuBLAS for gemm,
 * small CUDA kernels for the rest, all on the queue's stream.
 *
 * A ts_kernels of a cuda device owns one cuBLAS handle, created in that
 * device's context; each gemm binds it to the calling queue's stream
 * (cublasSetStream, which also selects cuBLAS's default workspace of that
 * stream) under a mutex, since the handle is shared by every caller.
 * Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS
 * gets the operands swapped and nothing is transposed in memory. The math
 * mode is CUBLAS_DEFAULT_MATH: full float32, no TF32.
 *
 * The element-wise kernels use grid-stride loops over 64-bit indices;
 * sumsq and loss reduce in double per block and atomicAdd each block's
 * sum into the float in device memory (so their last bits may vary with
 * scheduling). Clipping and the global norm are read on the device, in
 * stream order. The formulas are those of kernels_cpu.c.
 *
 * Every cudaError_t and cublasStatus_t is translated here, once: errors
 * that corrupt the context are UNAVAILABLE (the device layer marks the
 * device broken at its next call, which meets the same error).
 *
 * Thread-safety: ops may be called from any thread; each first makes the
 * kernels' device current; the cuBLAS handle is guarded by mu.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "train/kernels_int.h"

#define THREADS 256             /* threads per block, every kernel */
#define BLOCKS_PER_SM 16        /* grid cap for grid-stride loops */

#define GELU_S 0.7978845608028654f
#define GELU_C 0.044715f

struct cuda_kernels {
	struct ts_device *dev;          /* immutable; borrowed */
	int ordinal;                    /* immutable: the CUDA device ordinal */
	char id[32];                    /* immutable: "cuda:0", for messages */
	unsigned max_blocks;            /* immutable */
	pthread_mutex_t mu;
	cublasHandle_t blas;            /* guarded by: mu (its stream binding) */
};

/* ---- error translation ------------------------------------------------------ */

/* A cudaError_t from call: translated by the device layer, which owns the
 * one table of CUDA errors and marks the device broken on sticky ones. */
static ts_status cuda_status(const struct cuda_kernels *ck, cudaError_t e, const char *call,
                             struct ts_error *err)
{
	if (e == cudaSuccess)
		return TS_OK;
	return ts_device_cuda_status(ck->dev, (int)e, call, err);
}

/* The one translation of a cublasStatus_t from call into ts_status. */
static ts_status blas_status(const struct cuda_kernels *ck, cublasStatus_t s, const char *call,
                             struct ts_error *err)
{
	const char *reason;
	ts_status st;
	cudaError_t e;

	switch (s) {
	case CUBLAS_STATUS_SUCCESS:
		return TS_OK;
	case CUBLAS_STATUS_ALLOC_FAILED:
		st = TS_RESOURCE_EXHAUSTED;
		reason = "OUT_OF_MEMORY";
		break;
	case CUBLAS_STATUS_INVALID_VALUE:
		st = TS_INVALID_ARGUMENT;
		reason = "CUBLAS_INVALID_ARGUMENT";
		break;
	case CUBLAS_STATUS_ARCH_MISMATCH:
	case CUBLAS_STATUS_NOT_SUPPORTED:
		st = TS_UNIMPLEMENTED;
		reason = "CUBLAS_UNSUPPORTED";
		break;
	case CUBLAS_STATUS_NOT_INITIALIZED:
		st = TS_UNAVAILABLE;
		reason = "CUBLAS_NOT_INITIALIZED";
		break;
	default:
		/* execution failed, internal or mapping error: the CUDA error
		 * beneath, when there is one, says more (and whether it sticks) */
		e = cudaGetLastError();
		if (e != cudaSuccess)
			return cuda_status(ck, e, call, err);
		st = TS_INTERNAL;
		reason = "CUBLAS_ERROR";
		break;
	}
	st = ts_error_set(err, st, reason, "%s: %s: %s", ck->id, call, cublasGetStatusString(s));
	ts_error_meta(err, "device", "%s", ck->id);
	ts_error_meta(err, "cublas_status", "%s", cublasGetStatusName(s));
	return st;
}

/* Makes the kernels' device current on the calling thread. */
static ts_status enter(const struct cuda_kernels *ck, struct ts_error *err)
{
	return cuda_status(ck, cudaSetDevice(ck->ordinal), "cudaSetDevice", err);
}

/* What the launch just made said, translated. */
static ts_status launched(const struct cuda_kernels *ck, const char *what, struct ts_error *err)
{
	return cuda_status(ck, cudaGetLastError(), what, err);
}

static cudaStream_t stream_of(struct ts_queue *q)
{
	return (cudaStream_t)ts_queue_native(q);
}

static unsigned blocks_for(const struct cuda_kernels *ck, uint64_t n)
{
	uint64_t b = (n + THREADS - 1) / THREADS;

	return (unsigned)(b < ck->max_blocks ? b : ck->max_blocks);
}

/* ---- device code ------------------------------------------------------------- */

#define GRID_STRIDE(i, n)                                                          \
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (uint64_t)gridDim.x * blockDim.x)

__device__ static float gelu(float x)
{
	float cdf = 0.5f * (1.0f + tanhf(GELU_S * (x + GELU_C * (x * x * x))));

	return x * cdf;
}

__device__ static float gelu_grad(float x)
{
	float x2 = x * x;
	float t = tanhf(GELU_S * (x + GELU_C * (x2 * x)));
	float du = GELU_S * (1.0f + 3.0f * GELU_C * x2);

	return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

__device__ static float act_fwd(int act, float x)
{
	switch (act) {
	case TS_ACT_RELU:
		return x < 0.0f ? 0.0f : x;
	case TS_ACT_GELU:
		return gelu(x);
	case TS_ACT_TANH:
		return tanhf(x);
	default:
		return x;
	}
}

__device__ static float act_grad(int act, float x)
{
	float t;

	switch (act) {
	case TS_ACT_RELU:
		return x > 0.0f ? 1.0f : 0.0f;
	case TS_ACT_GELU:
		return gelu_grad(x);
	case TS_ACT_TANH:
		t = tanhf(x);
		return 1.0f - t * t;
	default:
		return 1.0f;
	}
}

__global__ static void k_act_fwd(int act, const float *in, float *out, uint64_t n)
{
	GRID_STRIDE(i, n)
		out[i] = act_fwd(act, in[i]);
}

__global__ static void k_act_bwd(int act, const float *pre, const float *go, float *gi,
                                 uint64_t n)
{
	GRID_STRIDE(i, n) {
		/* relu passes go through untouched where it is 1 (no 0 * inf) */
		if (act == TS_ACT_RELU)
			gi[i] = pre[i] > 0.0f ? go[i] : 0.0f;
		else
			gi[i] = go[i] * act_grad(act, pre[i]);
	}
}

__global__ static void k_add(const float *x, float *y, uint64_t n)
{
	GRID_STRIDE(i, n)
		y[i] += x[i];
}

__global__ static void k_fill(float *x, float v, uint64_t n)
{
	GRID_STRIDE(i, n)
		x[i] = v;
}

/* C = beta * C (beta == 0 ignores what C held): a gemm with K == 0. */
__global__ static void k_scale(float *x, float beta, uint64_t n)
{
	GRID_STRIDE(i, n)
		x[i] = beta == 0.0f ? 0.0f : beta * x[i];
}

/* Adds the block's sum of v, times scale, to *acc (one atomicAdd per block). */
__device__ static void block_accumulate(double v, double scale, float *acc)
{
	__shared__ double part[THREADS];

	part[threadIdx.x] = v;
	__syncthreads();
	for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s)
			part[threadIdx.x] += part[threadIdx.x + s];
		__syncthreads();
	}
	if (threadIdx.x == 0)
		atomicAdd(acc, (float)(part[0] * scale));
}

__global__ static void k_sumsq(const float *x, uint64_t n, float *acc)
{
	double s = 0.0;

	GRID_STRIDE(i, n)
		s += (double)x[i] * x[i];
	block_accumulate(s, 1.0, acc);
}

/* *value was zeroed before; sum: grad 1; mse: grad 2 (out - target) / n. */
__global__ static void k_loss(int loss, const float *out, const float *target, float *value,
                              float *grad, uint64_t n)
{
	double s = 0.0;

	if (loss == TS_LOSS_SUM) {
		GRID_STRIDE(i, n) {
			s += out[i];
			grad[i] = 1.0f;
		}
		block_accumulate(s, 1.0, value);
		return;
	}
	GRID_STRIDE(i, n) {
		float d = out[i] - target[i];

		s += (double)d * d;
		grad[i] = 2.0f * d / (float)n;
	}
	block_accumulate(s, 1.0 / (double)n, value);
}

struct update_args {
	int adam;
	float lr, b1, b2, eps;
	float bc1, bc2;                 /* 1 - b^t, computed on the host */
	float clip;                     /* 0: none */
	const float *gnorm_sq;
};

__global__ static void k_update(struct update_args a, float *p, const float *g, float *mu,
                                float *nu, uint64_t n)
{
	float norm = 0.0f;
	bool clip = false;

	if (a.clip > 0.0f) {
		/* optax: select(norm < c, g, g / norm * c); a NaN norm clips */
		norm = sqrtf(*a.gnorm_sq);
		clip = !(norm < a.clip);
	}
	GRID_STRIDE(i, n) {
		float gi = clip ? g[i] / norm * a.clip : g[i];

		if (!a.adam) {
			p[i] -= a.lr * gi;
			continue;
		}
		float m = (1.0f - a.b1) * gi + a.b1 * mu[i];
		float v = (1.0f - a.b2) * (gi * gi) + a.b2 * nu[i];

		mu[i] = m;
		nu[i] = v;
		p[i] -= a.lr * ((m / a.bc1) / (sqrtf(v / a.bc2) + a.eps));
	}
}

/* ---- ops ------------------------------------------------------------------------ */

static ts_status cuda_init(struct ts_device *dev, void **impl, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)calloc(1, sizeof *ck);
	int sms = 0;
	ts_status st;

	*impl = NULL;
	if (!ck)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		                    "%s: out of memory creating training kernels",
		                    ts_device_props(dev)->id);
	ck->dev = dev;
	ck->ordinal = ts_device_props(dev)->ordinal;
	snprintf(ck->id, sizeof ck->id, "%s", ts_device_props(dev)->id);
	if (pthread_mutex_init(&ck->mu, NULL) != 0) {
		free(ck);
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		                    "%s: cannot create a mutex for training kernels",
		                    ts_device_props(dev)->id);
	}
	st = enter(ck, err);
	if (st != TS_OK)
		goto out_mutex;
	st = cuda_status(ck, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
	                                            ck->ordinal),
	                 "cudaDeviceGetAttribute", err);
	if (st != TS_OK)
		goto out_mutex;
	ck->max_blocks = (unsigned)(sms > 0 ? sms : 1) * BLOCKS_PER_SM;
	st = blas_status(ck, cublasCreate(&ck->blas), "cublasCreate", err);
	if (st != TS_OK)
		goto out_mutex;
	st = blas_status(ck, cublasSetMathMode(ck->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode",
	                 err);
	if (st != TS_OK)
		goto out_blas;
	*impl = ck;
	return TS_OK;

out_blas:
	cublasDestroy(ck->blas);
out_mutex:
	pthread_mutex_destroy(&ck->mu);
	free(ck);
	return st;
}

static void cuda_fini(void *impl)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;

	if (!ck)
		return;
	/* cublasDestroy waits for the device: pending gemms finish first; the
	 * handle lets go of the last queue's stream (maybe gone) before */
	if (enter(ck, NULL) == TS_OK) {
		blas_status(ck, cublasSetStream(ck->blas, NULL), "cublasSetStream", NULL);
		blas_status(ck, cublasDestroy(ck->blas), "cublasDestroy", NULL);
	}
	pthread_mutex_destroy(&ck->mu);
	free(ck);
}

static ts_status cuda_gemm(void *impl, struct ts_queue *q, bool ta, bool tb, int M, int N,
                           int K, float alpha, const float *A, const float *B, float beta,
                           float *C, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	cudaStream_t s = stream_of(q);
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	if (K == 0) {
		uint64_t n = (uint64_t)M * (uint64_t)N;

		k_scale<<<blocks_for(ck, n), THREADS, 0, s>>>(C, beta, n);
		return launched(ck, "gemm (K = 0)", err);
	}
	/* row-major C[M,N] is column-major C^T[N,M] = op(B)^T op(A)^T */
	pthread_mutex_lock(&ck->mu);
	st = blas_status(ck, cublasSetStream(ck->blas, s), "cublasSetStream", err);
	if (st == TS_OK)
		st = blas_status(ck,
		                 cublasSgemm(ck->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
		                             ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
		                             tb ? K : N, A, ta ? M : K, &beta, C, N),
		                 "cublasSgemm", err);
	pthread_mutex_unlock(&ck->mu);
	return st;
}

static ts_status cuda_act_fwd(void *impl, struct ts_queue *q, enum ts_act act, const float *in,
                              float *out, uint64_t n, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_act_fwd<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>((int)act, in, out, n);
	return launched(ck, "activation", err);
}

static ts_status cuda_act_bwd(void *impl, struct ts_queue *q, enum ts_act act,
                              const float *pre, const float *grad_out, float *grad_in,
                              uint64_t n, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_act_bwd<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>((int)act, pre, grad_out,
	                                                             grad_in, n);
	return launched(ck, "activation gradient", err);
}

static ts_status cuda_add(void *impl, struct ts_queue *q, const float *x, float *y, uint64_t n,
                          struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_add<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>(x, y, n);
	return launched(ck, "add", err);
}

static ts_status cuda_loss(void *impl, struct ts_queue *q, enum ts_loss loss, const float *out,
                           const float *target, float *loss_dev, float *grad, uint64_t n,
                           struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	cudaStream_t s = stream_of(q);
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	st = cuda_status(ck, cudaMemsetAsync(loss_dev, 0, sizeof(float), s), "cudaMemsetAsync",
	                 err);
	if (st != TS_OK)
		return st;
	k_loss<<<blocks_for(ck, n), THREADS, 0, s>>>((int)loss, out, target, loss_dev, grad, n);
	return launched(ck, "loss", err);
}

static ts_status cuda_sumsq(void *impl, struct ts_queue *q, const float *x, uint64_t n,
                            float *acc, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_sumsq<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>(x, n, acc);
	return launched(ck, "sum of squares", err);
}

static ts_status cuda_update(void *impl, struct ts_queue *q, const struct ts_optimizer *opt,
                             int step, float *p, const float *g, float *mu, float *nu,
                             uint64_t n, const float *gnorm_sq_dev, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	struct update_args a;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	a.adam = opt->type == TS_OPT_ADAM;
	a.lr = opt->learning_rate;
	a.b1 = opt->b1;
	a.b2 = opt->b2;
	a.eps = opt->eps;
	a.bc1 = a.adam ? 1.0f - powf(opt->b1, (float)step) : 1.0f;
	a.bc2 = a.adam ? 1.0f - powf(opt->b2, (float)step) : 1.0f;
	a.clip = opt->clip_global_norm;
	a.gnorm_sq = gnorm_sq_dev;
	k_update<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>(a, p, g, mu, nu, n);
	return launched(ck, "update", err);
}

static ts_status cuda_fill(void *impl, struct ts_queue *q, float *x, float v, uint64_t n,
                           struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_fill<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>(x, v, n);
	return launched(ck, "fill", err);
}

/* In the order of struct ts__kernel_ops (C++17 has no designated
 * initializers). */
static const struct ts__kernel_ops cuda_ops = {
	"cuda",
	cuda_init,
	cuda_fini,
	cuda_gemm,
	cuda_act_fwd,
	cuda_act_bwd,
	cuda_add,
	cuda_loss,
	cuda_sumsq,
	cuda_update,
	cuda_fill,
};

const struct ts__kernel_ops *ts__kernels_cuda_ops(void)
{
	return &cuda_ops;
}
