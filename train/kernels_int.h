/*
 * kernels_int.h - what a kernel backend implements for kernels.c.
 *
 * Internal to train/: kernels.c checks every argument of the public ts_k_*
 * functions (non-NULL operands, sizes, known enums, a queue of the right
 * backend, a device that is not broken) and skips empty work before it
 * calls an op, so ops only enqueue. A backend keeps its own state in impl
 * (NULL for the CPU one; the cuBLAS handle for CUDA).
 *
 * The CPU backend lives in kernels_cpu.c; the CUDA one in cuda_kernels.cu,
 * or nocuda_kernels.c for builds without CUDA, whose ts__kernels_cuda_ops()
 * returns NULL.
 *
 * Thread-safety: ops are called from any thread, concurrently, and must be
 * safe for that.
 */
#ifndef TS_KERNELS_INT_H
#define TS_KERNELS_INT_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "train/kernels.h"

/*
 * The operations of one kernel backend. Every op enqueues on q (a queue of a
 * device of the backend, not broken) and returns what enqueueing cost:
 * RESOURCE_EXHAUSTED when out of memory, the backend's own errors otherwise.
 * Sizes are non-zero; M, N > 0 and K >= 0 for gemm; n > 0 elsewhere.
 */
struct ts__kernel_ops {
	const char *name;                       /* "cpu", "cuda" */

	/* The backend's state for dev into *impl (may stay NULL). */
	ts_status (*init)(struct ts_device *dev, void **impl, struct ts_error *err);
	/* Frees impl (NULL allowed); every kernel enqueued may still be pending. */
	void (*fini)(void *impl);

	ts_status (*gemm)(void *impl, struct ts_queue *q, bool ta, bool tb, int M, int N,
	                  int K, float alpha, const float *A, const float *B, float beta,
	                  float *C, struct ts_error *err);
	ts_status (*act_fwd)(void *impl, struct ts_queue *q, enum ts_act act, const float *in,
	                     float *out, uint64_t n, struct ts_error *err);
	ts_status (*act_bwd)(void *impl, struct ts_queue *q, enum ts_act act, const float *pre,
	                     const float *grad_out, float *grad_in, uint64_t n,
	                     struct ts_error *err);
	ts_status (*add)(void *impl, struct ts_queue *q, const float *x, float *y, uint64_t n,
	                 struct ts_error *err);
	ts_status (*loss)(void *impl, struct ts_queue *q, enum ts_loss loss, const float *out,
	                  const float *target, float *loss_dev, float *grad, uint64_t n,
	                  struct ts_error *err);
	ts_status (*sumsq)(void *impl, struct ts_queue *q, const float *x, uint64_t n,
	                   float *acc, struct ts_error *err);
	/* opt is adam or sgd, checked; for adam, step >= 1 and mu, nu set; when
	 * opt->clip_global_norm > 0, gnorm_sq_dev is set. */
	ts_status (*update)(void *impl, struct ts_queue *q, const struct ts_optimizer *opt,
	                    int step, float *p, const float *g, float *mu, float *nu,
	                    uint64_t n, const float *gnorm_sq_dev, struct ts_error *err);
	ts_status (*fill)(void *impl, struct ts_queue *q, float *x, float v, uint64_t n,
	                  struct ts_error *err);
	/* token models (kernels.h); checked, rows > 0 */
	ts_status (*embed_fwd)(void *impl, struct ts_queue *q, const float *table, int vocab,
	                       int d, const void *ids, int id_bytes, uint64_t rows, float *out,
	                       struct ts_error *err);
	ts_status (*embed_bwd)(void *impl, struct ts_queue *q, const void *ids, int id_bytes,
	                       uint64_t rows, int vocab, int d, const float *grad_out,
	                       float *grad_table, struct ts_error *err);
	ts_status (*xent)(void *impl, struct ts_queue *q, const float *logits, const void *targets,
	                  int id_bytes, uint64_t rows, int vocab, float *loss_dev, float *grad,
	                  struct ts_error *err);

	/* transformer blocks (kernels.h); checked, sizes > 0 */
	ts_status (*ln_fwd)(void *impl, struct ts_queue *q, const float *x, const float *g,
	                    const float *b, uint64_t rows, int d, float eps, float *y, float *stats,
	                    struct ts_error *err);
	ts_status (*ln_bwd)(void *impl, struct ts_queue *q, const float *x, const float *g,
	                    const float *stats, const float *dy, uint64_t rows, int d, float *dx,
	                    float *dg, float *db, struct ts_error *err);
	ts_status (*add_rows)(void *impl, struct ts_queue *q, const float *x, uint64_t period,
	                      float *y, uint64_t rows, int n, struct ts_error *err);
	ts_status (*sum_rows)(void *impl, struct ts_queue *q, const float *dy, uint64_t rows, int n,
	                      uint64_t period, float *out, struct ts_error *err);
	ts_status (*heads)(void *impl, struct ts_queue *q, bool to_heads, const float *in,
	                   float *out, int B, int T, int P, int H, int hd, struct ts_error *err);
	ts_status (*gemm_batched)(void *impl, struct ts_queue *q, bool ta, bool tb, int M, int N,
	                          int K, float alpha, const float *A, uint64_t sA, const float *B,
	                          uint64_t sB, float beta, float *C, uint64_t sC, int batch,
	                          struct ts_error *err);
	ts_status (*softmax_fwd)(void *impl, struct ts_queue *q, const float *S, int batch, int T,
	                         float scale, float *P, struct ts_error *err);
	ts_status (*softmax_bwd)(void *impl, struct ts_queue *q, const float *P, const float *dP,
	                         int batch, int T, float scale, float *dS, struct ts_error *err);

	/* mixed precision (kernels.h); dt bfloat16 or float16, sizes as gemm's */
	ts_status (*round)(void *impl, struct ts_queue *q, enum ts_compute to, const float *x,
	                   uint16_t *y, uint64_t n, struct ts_error *err);
	ts_status (*gemm_lp)(void *impl, struct ts_queue *q, enum ts_compute dt, bool ta, bool tb,
	                     int M, int N, int K, float alpha, const uint16_t *A,
	                     const uint16_t *B, float beta, float *C, struct ts_error *err);
	ts_status (*gemm_batched_lp)(void *impl, struct ts_queue *q, enum ts_compute dt, bool ta,
	                             bool tb, int M, int N, int K, float alpha, const uint16_t *A,
	                             uint64_t sA, const uint16_t *B, uint64_t sB, float beta,
	                             float *C, uint64_t sC, int batch, struct ts_error *err);

	/* A device-timed timeline (kernels.h); NULL ops: none. q is a queue of
	 * the kernels' device, checked. */
	ts_status (*timeline_new)(void *impl, void **tl, struct ts_error *err);
	ts_status (*timeline_mark)(void *tl, struct ts_queue *q, enum ts_k_mark m,
	                           struct ts_error *err);
	ts_status (*timeline_read)(void *tl, double *busy_s, double *wait_s, double *comm_s,
	                           struct ts_error *err);
	void (*timeline_free)(void *tl);
};

/* The CPU kernels (OpenBLAS and plain loops, run on host queue workers). */
const struct ts__kernel_ops *ts__kernels_cpu_ops(void);

/* The CUDA kernels (cuBLAS and CUDA kernels on the queue's stream), or NULL
 * in a build without CUDA. */
const struct ts__kernel_ops *ts__kernels_cuda_ops(void);

#ifdef __cplusplus
}
#endif

#endif
