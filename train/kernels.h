/*
 * kernels.h - the numerical kernels of a training step, behind one
 * interface with two implementations: the CPU (OpenBLAS sgemm and plain C
 * loops), used for cpu and sim devices, and CUDA (cuBLAS and small CUDA
 * kernels), used for cuda devices. One planner and executor drive both.
 *
 * Every kernel is enqueued on a compute queue of the device that holds its
 * operands (pointers are device pointers: host memory on cpu and sim) and
 * runs after the queue's earlier work; the caller orders queues with
 * events. All data is float32, row-major (the mixed-precision kernels'
 * 16-bit operands excepted). Operands are borrowed: they must
 * stay alive until the kernel has run (an event recorded after it).
 *
 * Failures: nothing can be reported once a kernel runs, so every call
 * checks its arguments when it enqueues: NULL kernels, queue or operand,
 * a negative size, an unknown enum, or a queue the kernels cannot use (on
 * CUDA, a queue of another device than the kernels'; on cpu and sim, a
 * queue of a cuda device) is INVALID_ARGUMENT; a broken device UNAVAILABLE;
 * running out of memory RESOURCE_EXHAUSTED. A zero size enqueues nothing
 * (NULL operands are then allowed), except where a kernel says otherwise.
 * On CUDA, launch and cuBLAS errors are translated when enqueueing; a
 * sticky one is UNAVAILABLE.
 *
 * Thread-safety: a ts_kernels object may be shared; kernels on one queue
 * run in order.
 */
#ifndef TS_KERNELS_H
#define TS_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "train/mlp.h"

struct ts_kernels;

/* The kernels for dev's backend (CPU kernels for cpu and sim, cuBLAS and
 * CUDA kernels for cuda; UNIMPLEMENTED for cuda in a build without CUDA).
 * New object, freed with ts_kernels_free, which on CUDA waits for the
 * device; dev is borrowed and must outlive it. */
ts_status ts_kernels_new(struct ts_device *dev, struct ts_kernels **out, struct ts_error *err);
void ts_kernels_free(struct ts_kernels *k);

/* C[M,N] = alpha * op(A) @ op(B) + beta * C, op = transpose when ta / tb;
 * A is [M,K] (or [K,M] when ta), B is [K,N] (or [N,K] when tb); dense,
 * row-major, leading dimensions implied by the shapes. With beta == 0, C
 * is only written (as BLAS); K == 0 gives C = beta * C. */
ts_status ts_k_gemm(struct ts_kernels *k, struct ts_queue *q, bool ta, bool tb, int M, int N,
                    int K, float alpha, const float *A, const float *B, float beta, float *C,
                    struct ts_error *err);

/*
 * Mixed precision (mlp.h). round: y[i] = x[i] rounded to the compute dtype
 * `to` (bfloat16 or float16, round to nearest even as formats/convert.h:
 * the same bits on both backends), stored as its 16-bit pattern. gemm_lp:
 * ts_k_gemm with A and B such 16-bit values of dtype dt, products and sums
 * in float32, C float32 (CPU: A and B widened exactly to float32 in a
 * workspace the call takes with its closure, then sgemm; CUDA:
 * cublasGemmEx with CUBLAS_COMPUTE_32F). INVALID_ARGUMENT for a compute
 * dtype that is not bfloat16 or float16, and as ts_k_gemm.
 */
ts_status ts_k_round(struct ts_kernels *k, struct ts_queue *q, enum ts_compute to,
                     const float *x, uint16_t *y, uint64_t n, struct ts_error *err);
ts_status ts_k_gemm_lp(struct ts_kernels *k, struct ts_queue *q, enum ts_compute dt, bool ta,
                       bool tb, int M, int N, int K, float alpha, const uint16_t *A,
                       const uint16_t *B, float beta, float *C, struct ts_error *err);
/* TS_OK when dt is a compute dtype the kernels run (float32, bfloat16,
 * float16: every backend runs all three); INVALID_ARGUMENT otherwise. */
ts_status ts_k_lowp_check(struct ts_kernels *k, enum ts_compute dt, struct ts_error *err);

/* out[i] = act(in[i]), n elements (in == out allowed). */
ts_status ts_k_act_fwd(struct ts_kernels *k, struct ts_queue *q, enum ts_act act,
                       const float *in, float *out, uint64_t n, struct ts_error *err);

/* grad_in[i] = grad_out[i] * act'(pre[i]) (grad_in == grad_out allowed). */
ts_status ts_k_act_bwd(struct ts_kernels *k, struct ts_queue *q, enum ts_act act,
                       const float *pre, const float *grad_out, float *grad_in, uint64_t n,
                       struct ts_error *err);

/* y[i] += x[i]. */
ts_status ts_k_add(struct ts_kernels *k, struct ts_queue *q, const float *x, float *y,
                   uint64_t n, struct ts_error *err);

/*
 * The loss of out (n elements) against target (mse; NULL for sum) into
 * *loss_dev (one float in device memory, overwritten), and its gradient
 * into grad (n elements): sum -> 1 everywhere; mse -> 2 (out - target) / n.
 * n == 0 is INVALID_ARGUMENT.
 */
ts_status ts_k_loss(struct ts_kernels *k, struct ts_queue *q, enum ts_loss loss,
                    const float *out, const float *target, float *loss_dev, float *grad,
                    uint64_t n, struct ts_error *err);

/* acc[0] += sum(x[i]^2) (acc one float in device memory), for global norms. */
ts_status ts_k_sumsq(struct ts_kernels *k, struct ts_queue *q, const float *x, uint64_t n,
                     float *acc, struct ts_error *err);

/*
 * One optimizer update of n parameters from their gradient g, with the
 * global gradient norm's square in *gnorm_sq_dev (device memory; read only
 * when opt->clip_global_norm > 0): g is scaled by min(1, c / norm) first,
 * as optax's clip_by_global_norm. Adam keeps mu and nu (n each) and uses
 * step t (1-based) for bias correction: mu = b1 mu + (1-b1) g;
 * nu = b2 nu + (1-b2) g^2; p -= lr * (mu / (1-b1^t)) / (sqrt(nu / (1-b2^t)) + eps).
 * With opt->adamw, weight_decay * p is added to Adam's update before lr
 * scales it (optax.adamw). lr is opt's schedule at count step - 1
 * (ts_m_learning_rate), computed on the host the same way for both
 * backends. SGD: p -= lr * g (mu and nu unused). INVALID_ARGUMENT for
 * optimizer "none", a non-finite learning rate, a negative or infinite
 * clip_global_norm (or a positive one without gnorm_sq_dev), and for Adam
 * a step < 1, b1 or b2 outside [0, 1), or a negative eps.
 */
ts_status ts_k_update(struct ts_kernels *k, struct ts_queue *q, const struct ts_optimizer *opt,
                      int step, float *p, const float *g, float *mu, float *nu, uint64_t n,
                      const float *gnorm_sq_dev, struct ts_error *err);

/*
 * Token models. ids are `rows` token ids, uint16 (id_bytes 2) or int32
 * (id_bytes 4), in device memory; the caller has checked them against the
 * vocabulary (an id outside [0, vocab) reads as a row of zeros and
 * contributes nothing).
 *
 * embed_fwd: out[r, :] = table[ids[r], :] (table [vocab, d], out [rows, d]).
 * embed_bwd: grad_table = 0, then grad_table[ids[r], :] += grad_out[r, :]
 * for r = 0, 1, ... in order: a scatter-add whose sums run in row order on
 * both backends (no atomics), so repeated ids give the same bits every run
 * and on CPU and CUDA.
 * xent: softmax cross-entropy of logits [rows, vocab] against the target ids:
 * loss_dev[0] = the mean over rows of logsumexp(logits[r]) -
 * logits[r, target[r]], loss_dev[1 + r] each row's (rows + 1 floats of
 * device memory, overwritten); grad [rows, vocab] = (softmax - onehot) / rows.
 * INVALID_ARGUMENT for NULL operands, id_bytes not 2 or 4, vocab or d < 1;
 * rows == 0 enqueues nothing, except for xent (INVALID_ARGUMENT: no mean).
 */
ts_status ts_k_embed_fwd(struct ts_kernels *k, struct ts_queue *q, const float *table, int vocab,
                         int d, const void *ids, int id_bytes, uint64_t rows, float *out,
                         struct ts_error *err);
ts_status ts_k_embed_bwd(struct ts_kernels *k, struct ts_queue *q, const void *ids, int id_bytes,
                         uint64_t rows, int vocab, int d, const float *grad_out,
                         float *grad_table, struct ts_error *err);
ts_status ts_k_xent(struct ts_kernels *k, struct ts_queue *q, const float *logits,
                    const void *targets, int id_bytes, uint64_t rows, int vocab, float *loss_dev,
                    float *grad, struct ts_error *err);

/*
 * Transformer blocks (the GPT model kind). Rows are tokens; every matrix is
 * row-major float32.
 *
 * ln_fwd: LayerNorm of x [rows, d] over each row (jax.nn / nanoGPT's:
 * the mean and the population variance, rstd = 1 / sqrt(var + eps)):
 * y = (x - mean) rstd g + b (g, b [d]); stats [rows, 2] gets each row's
 * mean and rstd for ln_bwd. ln_bwd: from x, g, stats and dy [rows, d]:
 * dx = rstd (dy g - mean(dy g) - xhat mean(dy g xhat)), and the
 * parameters' gradients dg = sum over rows of dy xhat, db = sum of dy
 * (overwritten). Row sums run in double in the reductions' lane order,
 * column sums in double in row order: the same bits on both backends.
 * INVALID_ARGUMENT for d < 1 or eps not finite and > 0.
 */
ts_status ts_k_ln_fwd(struct ts_kernels *k, struct ts_queue *q, const float *x, const float *g,
                      const float *b, uint64_t rows, int d, float eps, float *y, float *stats,
                      struct ts_error *err);
ts_status ts_k_ln_bwd(struct ts_kernels *k, struct ts_queue *q, const float *x, const float *g,
                      const float *stats, const float *dy, uint64_t rows, int d, float *dx,
                      float *dg, float *db, struct ts_error *err);

/*
 * add_rows: y[r, :] += x[r % period, :] for r < rows (x [period, n], y
 * [rows, n]): a bias (period 1) or the position embeddings of a batch of
 * windows (period = context). sum_rows, its gradient: out[p, :] = the sum
 * over r < rows with r % period == p of dy[r, :], in increasing r, in
 * double, rounded once (out [period, n], overwritten). INVALID_ARGUMENT for
 * n < 1 or period < 1.
 */
ts_status ts_k_add_rows(struct ts_kernels *k, struct ts_queue *q, const float *x,
                        uint64_t period, float *y, uint64_t rows, int n, struct ts_error *err);
ts_status ts_k_sum_rows(struct ts_kernels *k, struct ts_queue *q, const float *dy,
                        uint64_t rows, int n, uint64_t period, float *out,
                        struct ts_error *err);

/*
 * Attention heads: in and out hold B*T*P*H*hd floats; to_heads copies a
 * [B, T, P, H, hd] tensor (a projection's rows: P = 3 for q, k, v; 1 for
 * the heads' output) into the [P, B, H, T, hd] layout the batched products
 * take; !to_heads copies back. in and out must not overlap.
 * INVALID_ARGUMENT for a size < 1.
 */
ts_status ts_k_heads(struct ts_kernels *k, struct ts_queue *q, bool to_heads, const float *in,
                     float *out, int B, int T, int P, int H, int hd, struct ts_error *err);

/*
 * batch products of ts_k_gemm's shapes, product i on A + i sA, B + i sB,
 * C + i sC (strides in elements; C's batches must not overlap). CPU: one
 * sgemm per product; CUDA: cublasSgemmStridedBatched.
 */
ts_status ts_k_gemm_batched(struct ts_kernels *k, struct ts_queue *q, bool ta, bool tb, int M,
                            int N, int K, float alpha, const float *A, uint64_t sA,
                            const float *B, uint64_t sB, float beta, float *C, uint64_t sC,
                            int batch, struct ts_error *err);
/*
 * gemm_batched_lp: the same batch products with A and B 16-bit values of
 * the compute dtype dt (as gemm_lp's), products and sums in float32, C
 * float32. CPU: each product's two operands widened exactly to float32 in
 * the queue's workspace (one product's worth, reused batch by batch), then
 * sgemm; CUDA: cublasGemmStridedBatchedEx (CUDA_R_16BF or CUDA_R_16F
 * operands, CUDA_R_32F result, CUBLAS_COMPUTE_32F). INVALID_ARGUMENT as
 * gemm_lp's and gemm_batched's.
 */
ts_status ts_k_gemm_batched_lp(struct ts_kernels *k, struct ts_queue *q, enum ts_compute dt,
                               bool ta, bool tb, int M, int N, int K, float alpha,
                               const uint16_t *A, uint64_t sA, const uint16_t *B, uint64_t sB,
                               float beta, float *C, uint64_t sC, int batch,
                               struct ts_error *err);

/*
 * Causal softmax of scores S [batch, T, T]: row i attends to columns
 * j <= i. fwd: P[i, j] = exp(x_j - max) / sum over k <= i of exp(x_k -
 * max), x = scale S[i, j] (a float product), for j <= i; 0 above the
 * diagonal. bwd: dS[i, j] = scale P[i, j] (dP[i, j] - sum over k of
 * P[i, k] dP[i, k]) for j <= i, 0 above (dS may be dP). Terms and sums in
 * double (kernels_math.h): the same bits on both backends. INVALID_ARGUMENT
 * for T < 1 or a scale that is not finite.
 */
ts_status ts_k_softmax_causal_fwd(struct ts_kernels *k, struct ts_queue *q, const float *S,
                                  int batch, int T, float scale, float *P, struct ts_error *err);
ts_status ts_k_softmax_causal_bwd(struct ts_kernels *k, struct ts_queue *q, const float *P,
                                  const float *dP, int batch, int T, float scale, float *dS,
                                  struct ts_error *err);

/* x[i] = v. */
ts_status ts_k_fill(struct ts_kernels *k, struct ts_queue *q, float *x, float v, uint64_t n,
                    struct ts_error *err);

/*
 * A timeline of marks on a device queue, timed by the device itself (CUDA
 * events with timing), for busy and waiting times that host callbacks
 * would distort on a GPU stream. A mark records where the queue is: OPEN,
 * WAIT_END and COMM_END start a busy stretch, CLOSE, WAIT_BEGIN and
 * COMM_BEGIN end one; WAIT_BEGIN to WAIT_END is waiting (for copies),
 * COMM_BEGIN to COMM_END communicating (a collective with the other
 * devices, waiting for them included). Read once every mark has run (the
 * queue synced); comm_s may be NULL. UNIMPLEMENTED for cpu and sim kernels
 * (their queue workers time themselves). New object from new, freed by
 * free (NULL allowed).
 */
enum ts_k_mark {
	TS_K_OPEN, TS_K_CLOSE, TS_K_WAIT_BEGIN, TS_K_WAIT_END, TS_K_COMM_BEGIN, TS_K_COMM_END
};
struct ts_k_timeline;

ts_status ts_k_timeline_new(struct ts_kernels *k, struct ts_k_timeline **out,
                            struct ts_error *err);
ts_status ts_k_timeline_mark(struct ts_k_timeline *tl, struct ts_queue *q, enum ts_k_mark m,
                             struct ts_error *err);
ts_status ts_k_timeline_read(struct ts_k_timeline *tl, double *busy_s, double *wait_s,
                             double *comm_s, struct ts_error *err);
void ts_k_timeline_free(struct ts_k_timeline *tl);

#endif
