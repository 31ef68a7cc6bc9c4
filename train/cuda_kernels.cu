/*
 * cuda_kernels.cu - the training kernels on a CUDA GPU: cuBLAS for gemm,
 * small CUDA kernels for the rest, all on the queue's stream.
 *
 * Each CUDA device has one cuBLAS handle for the life of the process,
 * created in its context by the first kernels of the device and shared by
 * every later one (creating and destroying one synchronises the device).
 * Each gemm binds it to the calling queue's stream for that call only
 * (cublasSetStream, which also selects cuBLAS's default workspace of that
 * stream) and back to no stream, under the handle's mutex: the handle never
 * refers to a stream its queue may destroy. The row-major to column-major
 * mapping is ts_m_gemm_colmajor (kernels_math.h, tested against OpenBLAS).
 * The math mode is CUBLAS_DEFAULT_MATH: full float32, no TF32. Mixed
 * precision (kernels.h) rounds with k_round and multiplies with
 * cublasGemmEx, or cublasGemmStridedBatchedEx for a GPT's attention
 * products (CUDA_R_16BF / CUDA_R_16F operands, CUDA_R_32F result,
 * CUBLAS_COMPUTE_32F), looked up at run time as cudaEventElapsedTime is.
 *
 * The element-wise kernels use grid-stride loops over 64-bit indices and
 * the formulas of kernels_math.h, the CPU kernels' own. sumsq and loss are
 * one block each: 256 lanes in double, then a fixed tree, the same order
 * as the CPU's (no atomics), so their results do not depend on how blocks
 * are scheduled and equal the CPU's bit for bit. Clipping and the global
 * norm are read on the device, in stream order.
 *
 * Timelines (kernels.h) are CUDA events with timing, one per mark, on the
 * marked stream; cudaEventElapsedTime is looked up at read time, so a
 * runtime without it (a CPU stand-in) reads UNIMPLEMENTED, not a failed
 * load.
 *
 * Every cudaError_t and cublasStatus_t is translated here, once: errors
 * that corrupt the context are UNAVAILABLE (the device layer marks the
 * device broken at its next call, which meets the same error).
 *
 * Thread-safety: ops may be called from any thread; each first makes the
 * kernels' device current; a device's cuBLAS handle is guarded by its
 * slot's mu, the cache by blas_cache.mu.
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


/* A device's cuBLAS handle, shared by every kernels object of it. */
struct blas_slot {
	bool made;                      /* guarded by: blas_cache.mu; then immutable */
	cublasHandle_t h;               /* immutable once made */
	pthread_mutex_t mu;             /* guards h's stream binding and each gemm */
};

struct cuda_kernels {
	struct ts_device *dev;          /* immutable; borrowed */
	int ordinal;                    /* immutable: the CUDA device ordinal */
	char id[32];                    /* immutable: "cuda:0", for messages */
	unsigned max_blocks;            /* immutable */
	struct blas_slot *blas;         /* immutable; the device's (blas_cache) */
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

#include "train/kernels_math.h"
#include "formats/convert.h"

#define GRID_STRIDE(i, n)                                                          \
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (uint64_t)gridDim.x * blockDim.x)

/* The reductions' lanes: thread t of the one block of a reduction kernel
 * takes elements t, t + THREADS, ... in order (kernels_math.h). */
#define LANE_STRIDE(i, n) for (uint64_t i = threadIdx.x; i < (n); i += THREADS)

static_assert(THREADS == TS_RED_LANES, "a reduction block is one lane per thread");

/* A row kernel's lanes: one block per row of n <= THREADS values is only as
 * wide as the row needs (row_threads()), its lanes taking elements t,
 * t + blockDim.x, ...; the tree below then starts at blockDim.x / 2. That
 * is still TS_RED_LANES' order: a lane past the row holds +0.0 (a lane's
 * double sum starts at +0.0 and is never -0.0), so the levels a narrower
 * block skips would only have added +0.0 to each sum, which changes none. */
#define ROW_STRIDE(i, n) for (uint64_t i = threadIdx.x; i < (n); i += blockDim.x)

__global__ static void k_act_fwd(int act, const float *in, float *out, uint64_t n)
{
	GRID_STRIDE(i, n)
		out[i] = ts_m_act_fwd(act, in[i]);
}

__global__ static void k_act_bwd(int act, const float *pre, const float *go, float *gi,
                                 uint64_t n)
{
	GRID_STRIDE(i, n)
		gi[i] = ts_m_act_bwd(act, pre[i], go[i]);
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

/* y = x rounded to bfloat16 (to_bf16) or float16, 16-bit patterns, with
 * the host's very conversions (formats/convert.h). */
__global__ static void k_round(int to_bf16, const float *x, uint16_t *y, uint64_t n)
{
	GRID_STRIDE(i, n)
		y[i] = to_bf16 ? ts_f32_to_bf16(x[i]) : ts_f32_to_f16(x[i]);
}

/* C = beta * C (beta == 0 ignores what C held): a gemm with K == 0. */
__global__ static void k_scale(float *x, float beta, uint64_t n)
{
	GRID_STRIDE(i, n)
		x[i] = beta == 0.0f ? 0.0f : beta * x[i];
}

/* The sum of every thread's v, in the lanes' tree order, valid in every
 * thread on return. Once per kernel (one shared array). */
__device__ static double lanes_reduce(double v)
{
	__shared__ double part[THREADS];

	part[threadIdx.x] = v;
	__syncthreads();
	for (unsigned s = THREADS / 2; s > 0; s >>= 1) {
		if (threadIdx.x < s)
			part[threadIdx.x] += part[threadIdx.x + s];
		__syncthreads();
	}
	return part[0];
}

/* A lane's elements loaded at once by k_sumsq before it adds them. */
#define RED_BATCH 32

/*
 * One block: *acc += sum(x^2), in the lanes' fixed order. A gradient's
 * squares are one of a step's largest reads (every parameter), so each lane
 * loads RED_BATCH of its elements before adding them in order: the loads
 * are in flight together (one block is one multiprocessor, whose bandwidth
 * is then bounded by how many loads wait at once, not by their latency one
 * after another), and the sum is the same, term by term.
 */
__global__ static void k_sumsq(const float *x, uint64_t n, float *acc)
{
	const uint64_t span = (uint64_t)RED_BATCH * THREADS;
	uint64_t i = threadIdx.x;
	double s = 0.0;

	for (; i + span - THREADS < n; i += span) {
		float v[RED_BATCH];

#pragma unroll
		for (int k = 0; k < RED_BATCH; k++)
			v[k] = x[i + (uint64_t)k * THREADS];
#pragma unroll
		for (int k = 0; k < RED_BATCH; k++)
			s += ts_m_sq(v[k]);
	}
	for (; i < n; i += THREADS)
		s += ts_m_sq(x[i]);
	s = lanes_reduce(s);
	if (threadIdx.x == 0)
		*acc = ts_m_sumsq_acc(*acc, s);
}

/* One block: *value = the loss (overwritten); sum: grad 1; mse: grad
 * 2 (out - target) / n. */
__global__ static void k_loss(int loss, const float *out, const float *target, float *value,
                              float *grad, uint64_t n)
{
	double s = 0.0;

	if (loss == TS_LOSS_SUM) {
		LANE_STRIDE(i, n) {
			s += out[i];
			grad[i] = 1.0f;
		}
	} else {
		LANE_STRIDE(i, n) {
			float d = ts_m_mse_diff(out[i], target[i]);

			s += ts_m_sq(d);
			grad[i] = ts_m_mse_grad(d, n);
		}
	}
	s = lanes_reduce(s);
	if (threadIdx.x == 0)
		*value = ts_m_loss_value(loss, s, n);
}

/* out[r, c] = table[ids[r], c] (zeros for a stray id). */
__global__ static void k_embed_fwd(const float *table, int vocab, int d, const void *ids,
                                   int id_bytes, uint64_t rows, float *out)
{
	GRID_STRIDE(i, rows * (uint64_t)d) {
		uint64_t r = i / (uint64_t)d, c = i % (uint64_t)d;
		int64_t t = ts_m_token(ids, id_bytes, r, vocab);

		out[i] = t >= 0 ? table[(uint64_t)t * d + c] : 0.0f;
	}
}

/* The scatter-add: one thread per column, over the rows in order, so each
 * element's sum runs in row order (the CPU's) whatever the block order. */
__global__ static void k_embed_bwd(const void *ids, int id_bytes, uint64_t rows, int vocab,
                                   int d, const float *go, float *gt)
{
	GRID_STRIDE(c, (uint64_t)d) {
		for (uint64_t r = 0; r < rows; r++) {
			int64_t t = ts_m_token(ids, id_bytes, r, vocab);

			if (t >= 0)
				gt[(uint64_t)t * d + c] += go[r * d + c];
		}
	}
}

/* One block per row (grid-stride over rows): the row's max, its sum of
 * exp(x - max) in the lanes' order, the gradients and the row's loss. */
__global__ static void k_xent_rows(const float *x, const void *ids, int id_bytes,
                                   uint64_t rows, int vocab, float *loss, float *grad)
{
	__shared__ float fmax_part[THREADS];
	__shared__ double part[THREADS];
	uint64_t V = (uint64_t)vocab;

	for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *xr = x + r * V;
		float *gr = grad + r * V, m = -INFINITY;
		int64_t t = ts_m_token(ids, id_bytes, r, vocab);
		double s = 0.0, sum, inv;

		LANE_STRIDE(c, V)
			m = fmaxf(m, xr[c]);
		fmax_part[threadIdx.x] = m;
		__syncthreads();
		for (unsigned k = THREADS / 2; k > 0; k >>= 1) {
			if (threadIdx.x < k)
				fmax_part[threadIdx.x] = fmaxf(fmax_part[threadIdx.x],
				                               fmax_part[threadIdx.x + k]);
			__syncthreads();
		}
		m = fmax_part[0];
		LANE_STRIDE(c, V)
			s += ts_m_xent_exp(xr[c], m);
		part[threadIdx.x] = s;
		__syncthreads();
		for (unsigned k = THREADS / 2; k > 0; k >>= 1) {
			if (threadIdx.x < k)
				part[threadIdx.x] += part[threadIdx.x + k];
			__syncthreads();
		}
		sum = part[0];
		inv = ts_m_inv(sum);
		LANE_STRIDE(c, V)
			gr[c] = t < 0 ? 0.0f : ts_m_xent_grad(xr[c], m, inv, (int64_t)c == t, rows);
		if (threadIdx.x == 0)
			loss[1 + r] = t < 0 ? 0.0f : ts_m_xent_loss(sum, m, xr[t]);
		__syncthreads();        /* the shared parts are reused by the next row */
	}
}

/* One block: loss[0] = the mean of the rows' losses, in the lanes' order. */
__global__ static void k_xent_mean(float *loss, uint64_t rows)
{
	double s = 0.0;

	LANE_STRIDE(r, rows)
		s += loss[1 + r];
	s = lanes_reduce(s);
	if (threadIdx.x == 0)
		loss[0] = (float)(s / (double)rows);
}

/* ---- transformer blocks ---- */

/* The sum of every thread's v in the lanes' tree order (kernels_math.h),
 * in part (THREADS doubles of shared memory; a row kernel's block may be
 * narrower, ROW_STRIDE), valid in every thread on return; part may be used
 * again at once. */
__device__ static double block_sum(double v, double *part)
{
	double s;

	part[threadIdx.x] = v;
	__syncthreads();
	for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
		if (threadIdx.x < k)
			part[threadIdx.x] += part[threadIdx.x + k];
		__syncthreads();
	}
	s = part[0];
	__syncthreads();
	return s;
}

/* The largest of every thread's v (NaNs skipped), in every thread. */
__device__ static float block_max(float v, float *part)
{
	float m;

	part[threadIdx.x] = v;
	__syncthreads();
	for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
		if (threadIdx.x < k)
			part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + k]);
		__syncthreads();
	}
	m = part[0];
	__syncthreads();
	return m;
}

/* One block per row (grid-stride over rows): LayerNorm's two sums in the
 * lanes' order, then the row's outputs and its mean and rstd. */
__global__ static void k_ln_fwd(const float *x, const float *g, const float *b, uint64_t rows,
                                int d, float eps, float *y, float *stats)
{
	__shared__ double part[THREADS];

	for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *xr = x + r * (uint64_t)d;
		float *yr = y + r * (uint64_t)d, mean, rstd;
		double s = 0.0, v = 0.0, m;

		ROW_STRIDE(c, (uint64_t)d)
			s += (double)xr[c];
		m = block_sum(s, part) / (double)d;
		ROW_STRIDE(c, (uint64_t)d)
			v += ts_m_ln_dev_sq(xr[c], m);
		v = block_sum(v, part);
		mean = (float)m;
		rstd = ts_m_ln_rstd(v, d, eps);
		ROW_STRIDE(c, (uint64_t)d)
			yr[c] = ts_m_ln_out(ts_m_ln_xhat(xr[c], mean, rstd), g[c], b[c]);
		if (threadIdx.x == 0) {
			stats[2 * r] = mean;
			stats[2 * r + 1] = rstd;
		}
	}
}

/* LayerNorm's input gradient: one block per row. */
__global__ static void k_ln_bwd_rows(const float *x, const float *g, const float *stats,
                                     const float *dy, uint64_t rows, int d, float *dx)
{
	__shared__ double part[THREADS];

	for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *xr = x + r * (uint64_t)d, *dyr = dy + r * (uint64_t)d;
		float *dxr = dx + r * (uint64_t)d, mean = stats[2 * r], rstd = stats[2 * r + 1];
		double s1 = 0.0, s2 = 0.0;

		ROW_STRIDE(c, (uint64_t)d)
			s1 += (double)ts_m_ln_dyg(dyr[c], g[c]);
		s1 = block_sum(s1, part);
		ROW_STRIDE(c, (uint64_t)d)
			s2 += (double)ts_m_ln_dyg(dyr[c], g[c]) * (double)ts_m_ln_xhat(xr[c], mean, rstd);
		s2 = block_sum(s2, part);
		ROW_STRIDE(c, (uint64_t)d)
			dxr[c] = ts_m_ln_dx(ts_m_ln_dyg(dyr[c], g[c]), ts_m_ln_xhat(xr[c], mean, rstd), rstd, s1, s2,
			                    d);
	}
}

/* LayerNorm's parameter gradients: one thread per column, over the rows in
 * order (the CPU's order). */
__global__ static void k_ln_bwd_cols(const float *x, const float *stats, const float *dy,
                                     uint64_t rows, int d, float *dg, float *db)
{
	GRID_STRIDE(c, (uint64_t)d) {
		double sg = 0.0, sb = 0.0;

		for (uint64_t r = 0; r < rows; r++) {
			float dyv = dy[r * (uint64_t)d + c];
			float xh = ts_m_ln_xhat(x[r * (uint64_t)d + c], stats[2 * r], stats[2 * r + 1]);

			sg += (double)dyv * (double)xh;
			sb += (double)dyv;
		}
		dg[c] = (float)sg;
		db[c] = (float)sb;
	}
}

__global__ static void k_add_rows(const float *x, uint64_t period, float *y, uint64_t rows,
                                  int n)
{
	GRID_STRIDE(i, rows * (uint64_t)n) {
		uint64_t r = i / (uint64_t)n, c = i % (uint64_t)n;

		y[i] += x[(r % period) * (uint64_t)n + c];
	}
}

/* One thread per element of out, over its rows in increasing order. */
__global__ static void k_sum_rows(const float *dy, uint64_t rows, int n, uint64_t period,
                                  float *out)
{
	GRID_STRIDE(i, period * (uint64_t)n) {
		uint64_t p = i / (uint64_t)n, c = i % (uint64_t)n;
		double s = 0.0;

		for (uint64_t r = p; r < rows; r += period)
			s += (double)dy[r * (uint64_t)n + c];
		out[i] = (float)s;
	}
}

__global__ static void k_heads(int to_heads, const float *in, float *out, uint64_t B,
                               uint64_t T, uint64_t P, uint64_t H, uint64_t hd)
{
	GRID_STRIDE(i, B * T * P * H * hd) {
		uint64_t h = ts_m_heads_index(i, B, T, P, H, hd);

		if (to_heads)
			out[h] = in[i];
		else
			out[i] = in[h];
	}
}

/* One block per row of the [rows, T] scores (grid-stride over rows); row
 * r attends to columns 0 .. r % T. */
__global__ static void k_softmax_fwd(const float *S, uint64_t rows, int T, float scale,
                                     float *P)
{
	__shared__ double part[THREADS];
	__shared__ float fpart[THREADS];

	for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *sr = S + r * (uint64_t)T;
		float *pr = P + r * (uint64_t)T, m = -INFINITY;
		uint64_t len = r % (uint64_t)T + 1;
		double s = 0.0;

		ROW_STRIDE(c, len)
			m = fmaxf(m, ts_m_att_scaled(sr[c], scale));
		m = block_max(m, fpart);
		ROW_STRIDE(c, len)
			s += ts_m_att_exp(sr[c], scale, m);
		s = ts_m_inv(block_sum(s, part));
		ROW_STRIDE(c, (uint64_t)T)
			pr[c] = c < len ? ts_m_softmax_p(ts_m_att_exp(sr[c], scale, m), s)
			                : 0.0f;
	}
}

__global__ static void k_softmax_bwd(const float *P, const float *dP, uint64_t rows, int T,
                                     float scale, float *dS)
{
	__shared__ double part[THREADS];

	for (uint64_t r = blockIdx.x; r < rows; r += gridDim.x) {
		const float *pr = P + r * (uint64_t)T, *dpr = dP + r * (uint64_t)T;
		float *dsr = dS + r * (uint64_t)T;
		uint64_t len = r % (uint64_t)T + 1;
		double s = 0.0;

		ROW_STRIDE(c, len)
			s += (double)pr[c] * (double)dpr[c];
		s = block_sum(s, part);
		ROW_STRIDE(c, (uint64_t)T)
			dsr[c] = c < len ? ts_m_att_grad(pr[c], dpr[c], s, scale) : 0.0f;
	}
}

struct update_args {
	int adam;
	float lr, b1, b2, eps;
	float bc1, bc2;                 /* 1 - b^t, computed on the host */
	float wd;                       /* adamw's decoupled weight decay; 0: none */
	float clip;                     /* 0: none */
	const float *gnorm_sq;
};

__global__ static void k_update(struct update_args a, float *p, const float *g, float *mu,
                                float *nu, uint64_t n)
{
	float norm = 0.0f;
	bool clip = false;

	if (a.clip > 0.0f)
		clip = ts_m_clips(*a.gnorm_sq, a.clip, &norm);
	GRID_STRIDE(i, n) {
		float gi = ts_m_clip_grad(g[i], clip, norm, a.clip);

		if (!a.adam)
			p[i] = ts_m_sgd(p[i], gi, a.lr);
		else
			p[i] = ts_m_adam(p[i], gi, &mu[i], &nu[i], a.lr, a.b1, a.b2, a.eps, a.bc1,
			                 a.bc2, a.wd);
	}
}

/* ---- ops ------------------------------------------------------------------------ */

/*
 * One cuBLAS handle per CUDA device for the life of the process, made by the
 * first kernels of that device and shared by all later ones: a handle
 * belongs to the device's primary context, which is process-wide too, and
 * cublasCreate / cublasDestroy synchronise the whole device, so they must
 * not run once per step. Never destroyed (the context goes at exit).
 */
#define MAX_BLAS 64

static struct blas_cache {
	pthread_mutex_t mu;             /* guards made and h of every slot */
	struct blas_slot slot[MAX_BLAS];
} blas_cache = {PTHREAD_MUTEX_INITIALIZER, {}};

/* The shared handle of ck's device into ck->blas (made on first use, in
 * that device's context, which enter() made current). */
static ts_status blas_get(struct cuda_kernels *ck, struct ts_error *err)
{
	struct blas_slot *b;
	ts_status st = TS_OK;

	if (ck->ordinal < 0 || ck->ordinal >= MAX_BLAS)
		return ts_error_set(err, TS_UNIMPLEMENTED, "TOO_MANY_DEVICES",
		                    "%s: training kernels serve cuda ordinals below %d", ck->id,
		                    MAX_BLAS);
	b = &blas_cache.slot[ck->ordinal];
	pthread_mutex_lock(&blas_cache.mu);
	if (!b->made) {
		cublasHandle_t h = NULL;

		st = blas_status(ck, cublasCreate(&h), "cublasCreate", err);
		/* full float32: no TF32 tensor-op math */
		if (st == TS_OK)
			st = blas_status(ck, cublasSetMathMode(h, CUBLAS_DEFAULT_MATH),
			                 "cublasSetMathMode", err);
		if (st == TS_OK && pthread_mutex_init(&b->mu, NULL) != 0)
			st = ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
			                  "%s: cannot create a mutex for cuBLAS", ck->id);
		if (st == TS_OK) {
			b->h = h;
			b->made = true;
		} else if (h) {
			cublasDestroy(h);
		}
	}
	pthread_mutex_unlock(&blas_cache.mu);
	if (st == TS_OK)
		ck->blas = b;
	return st;
}

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
	st = enter(ck, err);
	if (st != TS_OK)
		goto out_free;
	st = cuda_status(ck, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
	                                            ck->ordinal),
	                 "cudaDeviceGetAttribute", err);
	if (st != TS_OK)
		goto out_free;
	ck->max_blocks = (unsigned)(sms > 0 ? sms : 1) * BLOCKS_PER_SM;
	st = blas_get(ck, err);
	if (st != TS_OK)
		goto out_free;
	*impl = ck;
	return TS_OK;

out_free:
	free(ck);
	return st;
}

/* The shared handle stays (blas_cache); it is bound to no stream between
 * gemms, so no queue freed after this outlives it. */
static void cuda_fini(void *impl)
{
	free(impl);
}

/*
 * One cuBLAS product as the ops ask it: column-major arguments of a
 * row-major product (ts_m_gemm_colmajor), float32 (cublasSgemm), 16-bit
 * operands (cublasGemmEx, CUBLAS_COMPUTE_32F), batches at strides
 * (cublasSgemmStridedBatched) or 16-bit batches at strides
 * (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F).
 */
enum blas_kind { BLAS_SGEMM, BLAS_GEMM_EX, BLAS_STRIDED, BLAS_STRIDED_EX };

struct blas_job {
	enum blas_kind kind;
	struct ts_m_colmajor_gemm g;
	float alpha, beta;
	const void *A, *B;
	float *C;
	cudaDataType in;                /* BLAS_GEMM_EX, BLAS_STRIDED_EX: A's and B's type */
	long long sA, sB, sC;           /* BLAS_STRIDED(_EX): strides in elements */
	int batch;
};

static cublasStatus_t blas_issue(cublasHandle_t h, const struct blas_job *j)
{
	cublasOperation_t ta = j->g.transa ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasOperation_t tb = j->g.transb ? CUBLAS_OP_T : CUBLAS_OP_N;

	switch (j->kind) {
	case BLAS_GEMM_EX:
		return cublasGemmEx(h, ta, tb, j->g.m, j->g.n, j->g.k, &j->alpha, j->B, j->in, j->g.lda,
		                    j->A, j->in, j->g.ldb, &j->beta, j->C, CUDA_R_32F, j->g.ldc,
		                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	case BLAS_STRIDED:
		return cublasSgemmStridedBatched(h, ta, tb, j->g.m, j->g.n, j->g.k, &j->alpha,
		                                 (const float *)j->B, j->g.lda, j->sB,
		                                 (const float *)j->A, j->g.ldb, j->sA, &j->beta, j->C,
		                                 j->g.ldc, j->sC, j->batch);
	case BLAS_STRIDED_EX:
		return cublasGemmStridedBatchedEx(h, ta, tb, j->g.m, j->g.n, j->g.k, &j->alpha, j->B,
		                                  j->in, j->g.lda, j->sB, j->A, j->in, j->g.ldb, j->sA,
		                                  &j->beta, j->C, CUDA_R_32F, j->g.ldc, j->sC,
		                                  j->batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	default:
		return cublasSgemm(h, ta, tb, j->g.m, j->g.n, j->g.k, &j->alpha, (const float *)j->B,
		                   j->g.lda, (const float *)j->A, j->g.ldb, &j->beta, j->C, j->g.ldc);
	}
}

/* Runs j on q's stream: the shared handle is bound to that stream for this
 * call only, so it never refers to a stream its queue may destroy after
 * the step. */
static ts_status blas_run(struct cuda_kernels *ck, struct ts_queue *q, const struct blas_job *j,
                          const char *what, struct ts_error *err)
{
	ts_status st, unbound;

	pthread_mutex_lock(&ck->blas->mu);
	st = blas_status(ck, cublasSetStream(ck->blas->h, stream_of(q)), "cublasSetStream", err);
	if (st == TS_OK)
		st = blas_status(ck, blas_issue(ck->blas->h, j), what, err);
	unbound = blas_status(ck, cublasSetStream(ck->blas->h, NULL), "cublasSetStream", err);
	if (st == TS_OK)
		st = unbound;
	pthread_mutex_unlock(&ck->blas->mu);
	return st;
}

static ts_status cuda_gemm(void *impl, struct ts_queue *q, bool ta, bool tb, int M, int N,
                           int K, float alpha, const float *A, const float *B, float beta,
                           float *C, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	cudaStream_t s = stream_of(q);
	struct blas_job j = {};
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	if (K == 0) {
		uint64_t n = (uint64_t)M * (uint64_t)N;

		k_scale<<<blocks_for(ck, n), THREADS, 0, s>>>(C, beta, n);
		return launched(ck, "gemm (K = 0)", err);
	}
	j.kind = BLAS_SGEMM;
	j.g = ts_m_gemm_colmajor(ta, tb, M, N, K);
	j.alpha = alpha;
	j.beta = beta;
	j.A = A;
	j.B = B;
	j.C = C;
	return blas_run(ck, q, &j, "cublasSgemm", err);
}

static ts_status cuda_round(void *impl, struct ts_queue *q, enum ts_compute to, const float *x,
                            uint16_t *y, uint64_t n, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_round<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>(to == TS_COMPUTE_BF16, x, y, n);
	return launched(ck, "round", err);
}

/* cublasGemmEx: 16-bit operands, float32 result, CUBLAS_COMPUTE_32F (float32
 * products and sums). */
static ts_status cuda_gemm_lp(void *impl, struct ts_queue *q, enum ts_compute dt, bool ta,
                              bool tb, int M, int N, int K, float alpha, const uint16_t *A,
                              const uint16_t *B, float beta, float *C, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	struct blas_job j = {};
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	j.kind = BLAS_GEMM_EX;
	j.in = dt == TS_COMPUTE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
	j.g = ts_m_gemm_colmajor(ta, tb, M, N, K);
	j.alpha = alpha;
	j.beta = beta;
	j.A = A;
	j.B = B;
	j.C = C;
	return blas_run(ck, q, &j, "cublasGemmEx", err);
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
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	/* one block: the lanes' fixed order, no atomics (kernels_math.h) */
	k_loss<<<1, THREADS, 0, stream_of(q)>>>((int)loss, out, target, loss_dev, grad, n);
	return launched(ck, "loss", err);
}

static ts_status cuda_sumsq(void *impl, struct ts_queue *q, const float *x, uint64_t n,
                            float *acc, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	/* one block: the lanes' fixed order, no atomics (kernels_math.h) */
	k_sumsq<<<1, THREADS, 0, stream_of(q)>>>(x, n, acc);
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
	/* the schedule on the host, as the CPU kernels compute it */
	a.lr = ts_m_learning_rate(opt, step - 1);
	a.b1 = opt->b1;
	a.b2 = opt->b2;
	a.eps = opt->eps;
	a.bc1 = a.adam ? ts_m_bias_correction(opt->b1, step) : 1.0f;
	a.bc2 = a.adam ? ts_m_bias_correction(opt->b2, step) : 1.0f;
	a.wd = a.adam && opt->adamw ? opt->weight_decay : 0.0f;
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

/* ---- device-timed timelines ---------------------------------------------------- */

/* Events with timing recorded on the queues' streams, one per mark. */
struct cuda_timeline {
	struct cuda_kernels *ck;        /* borrowed */
	cudaEvent_t *ev;
	int *mark;
	int n, cap;
};

static ts_status cuda_timeline_new(void *impl, void **out, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	struct cuda_timeline *tl = (struct cuda_timeline *)calloc(1, sizeof *tl);

	*out = tl;
	if (!tl)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		                    "%s: out of memory for a timeline", ck->id);
	tl->ck = ck;
	return TS_OK;
}

static ts_status cuda_timeline_mark(void *p, struct ts_queue *q, enum ts_k_mark m,
                                    struct ts_error *err)
{
	struct cuda_timeline *tl = (struct cuda_timeline *)p;
	cudaEvent_t e;
	ts_status st = enter(tl->ck, err);

	if (st != TS_OK)
		return st;
	if (tl->n == tl->cap) {
		int cap = tl->cap ? 2 * tl->cap : 32;
		cudaEvent_t *ev = (cudaEvent_t *)realloc(tl->ev, (size_t)cap * sizeof *ev);
		int *mark;

		if (ev)
			tl->ev = ev;
		mark = ev ? (int *)realloc(tl->mark, (size_t)cap * sizeof *mark) : NULL;
		if (!mark)
			return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
			                    "%s: out of memory for timeline marks", tl->ck->id);
		tl->mark = mark;
		tl->cap = cap;
	}
	/* default flags: timing on (the device layer's events have it off) */
	st = cuda_status(tl->ck, cudaEventCreate(&e), "cudaEventCreate", err);
	if (st != TS_OK)
		return st;
	st = cuda_status(tl->ck, cudaEventRecord(e, stream_of(q)), "cudaEventRecord", err);
	if (st != TS_OK) {
		cudaEventDestroy(e);
		return st;
	}
	tl->ev[tl->n] = e;
	tl->mark[tl->n] = (int)m;
	tl->n++;
	return TS_OK;
}

static ts_status cuda_timeline_read(void *p, double *busy_s, double *wait_s, double *comm_s,
                                    struct ts_error *err)
{
	struct cuda_timeline *tl = (struct cuda_timeline *)p;
	double busy = 0, wait = 0, comm = 0;
	ts_status st = enter(tl->ck, err);

	if (st != TS_OK)
		return st;
	for (int i = 1; i < tl->n && st == TS_OK; i++) {
		int a = tl->mark[i - 1], b = tl->mark[i];
		bool busy_span = (a == TS_K_OPEN || a == TS_K_WAIT_END || a == TS_K_COMM_END) &&
		                 (b == TS_K_CLOSE || b == TS_K_WAIT_BEGIN || b == TS_K_COMM_BEGIN);
		bool wait_span = a == TS_K_WAIT_BEGIN && b == TS_K_WAIT_END;
		bool comm_span = a == TS_K_COMM_BEGIN && b == TS_K_COMM_END;
		float ms = 0;

		if (!busy_span && !wait_span && !comm_span)
			continue;
		st = cuda_status(tl->ck, cudaEventElapsedTime(&ms, tl->ev[i - 1], tl->ev[i]),
		                 "cudaEventElapsedTime", err);
		if (busy_span)
			busy += ms / 1e3;
		else if (wait_span)
			wait += ms / 1e3;
		else
			comm += ms / 1e3;
	}
	if (st == TS_OK) {
		*busy_s = busy;
		*wait_s = wait;
		*comm_s = comm;
	}
	return st;
}

static void cuda_timeline_free(void *p)
{
	struct cuda_timeline *tl = (struct cuda_timeline *)p;

	if (!tl)
		return;
	/* a destroyed event still pending is released by the driver later */
	if (enter(tl->ck, NULL) == TS_OK)
		for (int i = 0; i < tl->n; i++)
			cudaEventDestroy(tl->ev[i]);
	free(tl->ev);
	free(tl->mark);
	free(tl);
}

static ts_status cuda_embed_fwd(void *impl, struct ts_queue *q, const float *table, int vocab,
                                int d, const void *ids, int id_bytes, uint64_t rows, float *out,
                                struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_embed_fwd<<<blocks_for(ck, rows * (uint64_t)d), THREADS, 0, stream_of(q)>>>(
		table, vocab, d, ids, id_bytes, rows, out);
	return launched(ck, "embedding", err);
}

static ts_status cuda_embed_bwd(void *impl, struct ts_queue *q, const void *ids, int id_bytes,
                                uint64_t rows, int vocab, int d, const float *grad_out,
                                float *grad_table, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	uint64_t n = (uint64_t)vocab * (uint64_t)d;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_fill<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>(grad_table, 0.0f, n);
	st = launched(ck, "embedding gradient", err);
	if (st != TS_OK || rows == 0)
		return st;
	k_embed_bwd<<<blocks_for(ck, (uint64_t)d), THREADS, 0, stream_of(q)>>>(
		ids, id_bytes, rows, vocab, d, grad_out, grad_table);
	return launched(ck, "embedding gradient", err);
}

static ts_status cuda_xent(void *impl, struct ts_queue *q, const float *logits,
                           const void *targets, int id_bytes, uint64_t rows, int vocab,
                           float *loss_dev, float *grad, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	unsigned blocks = (unsigned)(rows < ck->max_blocks ? rows : ck->max_blocks);
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_xent_rows<<<blocks, THREADS, 0, stream_of(q)>>>(logits, targets, id_bytes, rows, vocab,
	                                                    loss_dev, grad);
	st = launched(ck, "cross-entropy", err);
	if (st != TS_OK)
		return st;
	/* one block: the lanes' fixed order, no atomics (kernels_math.h) */
	k_xent_mean<<<1, THREADS, 0, stream_of(q)>>>(loss_dev, rows);
	return launched(ck, "cross-entropy", err);
}

/* ---- transformer blocks ---- */

/* Blocks for a kernel with one block per row. */
static unsigned row_blocks(const struct cuda_kernels *ck, uint64_t rows)
{
	return (unsigned)(rows < ck->max_blocks ? rows : ck->max_blocks);
}

/* Threads of a row kernel's block for rows of n values: the power of two
 * that covers the row, a warp at least, THREADS at most (ROW_STRIDE); a
 * short row (a context's scores, a narrow LayerNorm) parks no idle warps
 * and runs fewer rounds of its reduction tree. */
static unsigned row_threads(uint64_t n)
{
	unsigned t = 32;

	while (t < THREADS && t < n)
		t <<= 1;
	return t;
}

static ts_status cuda_ln_fwd(void *impl, struct ts_queue *q, const float *x, const float *g,
                             const float *b, uint64_t rows, int d, float eps, float *y,
                             float *stats, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_ln_fwd<<<row_blocks(ck, rows), row_threads((uint64_t)d), 0, stream_of(q)>>>(
		x, g, b, rows, d, eps, y, stats);
	return launched(ck, "layernorm", err);
}

static ts_status cuda_ln_bwd(void *impl, struct ts_queue *q, const float *x, const float *g,
                             const float *stats, const float *dy, uint64_t rows, int d,
                             float *dx, float *dg, float *db, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	if (rows > 0) {
		k_ln_bwd_rows<<<row_blocks(ck, rows), row_threads((uint64_t)d), 0, stream_of(q)>>>(
			x, g, stats, dy, rows, d, dx);
		st = launched(ck, "layernorm gradient", err);
		if (st != TS_OK)
			return st;
	}
	k_ln_bwd_cols<<<blocks_for(ck, (uint64_t)d), THREADS, 0, stream_of(q)>>>(x, stats, dy, rows,
	                                                                          d, dg, db);
	return launched(ck, "layernorm gradient", err);
}

static ts_status cuda_add_rows(void *impl, struct ts_queue *q, const float *x, uint64_t period,
                               float *y, uint64_t rows, int n, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_add_rows<<<blocks_for(ck, rows * (uint64_t)n), THREADS, 0, stream_of(q)>>>(x, period, y,
	                                                                              rows, n);
	return launched(ck, "add rows", err);
}

static ts_status cuda_sum_rows(void *impl, struct ts_queue *q, const float *dy, uint64_t rows,
                               int n, uint64_t period, float *out, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_sum_rows<<<blocks_for(ck, period * (uint64_t)n), THREADS, 0, stream_of(q)>>>(dy, rows, n,
	                                                                                period, out);
	return launched(ck, "sum rows", err);
}

static ts_status cuda_heads(void *impl, struct ts_queue *q, bool to_heads, const float *in,
                            float *out, int B, int T, int P, int H, int hd, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	uint64_t n = (uint64_t)B * (uint64_t)T * (uint64_t)P * (uint64_t)H * (uint64_t)hd;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_heads<<<blocks_for(ck, n), THREADS, 0, stream_of(q)>>>(to_heads ? 1 : 0, in, out,
	                                                         (uint64_t)B, (uint64_t)T,
	                                                         (uint64_t)P, (uint64_t)H,
	                                                         (uint64_t)hd);
	return launched(ck, "heads", err);
}

static ts_status cuda_gemm_batched(void *impl, struct ts_queue *q, bool ta, bool tb, int M,
                                   int N, int K, float alpha, const float *A, uint64_t sA,
                                   const float *B, uint64_t sB, float beta, float *C,
                                   uint64_t sC, int batch, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	struct blas_job j = {};
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	j.kind = BLAS_STRIDED;
	j.g = ts_m_gemm_colmajor(ta, tb, M, N, K);
	j.alpha = alpha;
	j.beta = beta;
	j.A = A;
	j.B = B;
	j.C = C;
	j.sA = (long long)sA;
	j.sB = (long long)sB;
	j.sC = (long long)sC;
	j.batch = batch;
	return blas_run(ck, q, &j, "cublasSgemmStridedBatched", err);
}

/* cublasGemmStridedBatchedEx: 16-bit batches, float32 results,
 * CUBLAS_COMPUTE_32F, as gemm_lp's products. */
static ts_status cuda_gemm_batched_lp(void *impl, struct ts_queue *q, enum ts_compute dt,
                                      bool ta, bool tb, int M, int N, int K, float alpha,
                                      const uint16_t *A, uint64_t sA, const uint16_t *B,
                                      uint64_t sB, float beta, float *C, uint64_t sC, int batch,
                                      struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	struct blas_job j = {};
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	j.kind = BLAS_STRIDED_EX;
	j.in = dt == TS_COMPUTE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
	j.g = ts_m_gemm_colmajor(ta, tb, M, N, K);
	j.alpha = alpha;
	j.beta = beta;
	j.A = A;
	j.B = B;
	j.C = C;
	j.sA = (long long)sA;
	j.sB = (long long)sB;
	j.sC = (long long)sC;
	j.batch = batch;
	return blas_run(ck, q, &j, "cublasGemmStridedBatchedEx", err);
}

static ts_status cuda_softmax_fwd(void *impl, struct ts_queue *q, const float *S, int batch,
                                  int T, float scale, float *P, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	uint64_t rows = (uint64_t)batch * (uint64_t)T;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_softmax_fwd<<<row_blocks(ck, rows), row_threads((uint64_t)T), 0, stream_of(q)>>>(
		S, rows, T, scale, P);
	return launched(ck, "causal softmax", err);
}

static ts_status cuda_softmax_bwd(void *impl, struct ts_queue *q, const float *P, const float *dP,
                                  int batch, int T, float scale, float *dS, struct ts_error *err)
{
	struct cuda_kernels *ck = (struct cuda_kernels *)impl;
	uint64_t rows = (uint64_t)batch * (uint64_t)T;
	ts_status st = enter(ck, err);

	if (st != TS_OK)
		return st;
	k_softmax_bwd<<<row_blocks(ck, rows), row_threads((uint64_t)T), 0, stream_of(q)>>>(
		P, dP, rows, T, scale, dS);
	return launched(ck, "causal softmax gradient", err);
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
	cuda_embed_fwd,
	cuda_embed_bwd,
	cuda_xent,
	cuda_ln_fwd,
	cuda_ln_bwd,
	cuda_add_rows,
	cuda_sum_rows,
	cuda_heads,
	cuda_gemm_batched,
	cuda_softmax_fwd,
	cuda_softmax_bwd,
	cuda_round,
	cuda_gemm_lp,
	cuda_gemm_batched_lp,
	cuda_timeline_new,
	cuda_timeline_mark,
	cuda_timeline_read,
	cuda_timeline_free,
};

const struct ts__kernel_ops *ts__kernels_cuda_ops(void)
{
	return &cuda_ops;
}
