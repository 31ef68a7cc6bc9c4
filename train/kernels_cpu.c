/*
 * kernels_cpu.c - the training kernels on the host, for cpu and sim devices.
 *
 * Each kernel is one job on its queue: the call copies its arguments into a
 * small closure and enqueues it with ts_queue_host_fn; the queue's worker
 * runs it after the queue's earlier work and frees the closure. So kernels
 * run asynchronously and in queue order, as GPU work does on a stream, and
 * operands stay borrowed until the queue has run them.
 *
 * gemm is OpenBLAS's cblas_sgemm, called column-major with the very
 * arguments cuBLAS gets (ts_m_gemm_colmajor); gemm_lp widens its 16-bit
 * operands to float32 first and runs the same sgemm (gemm_batched_lp batch
 * by batch); everything else is a plain loop over the formulas of
 * kernels_math.h, which the CUDA kernels use too. Sums run in double in
 * the reductions' fixed lane order, so a sequence of kernels gives
 * bit-identical results run after run, and the same sums as CUDA. The hot
 * loops (a cross-entropy row, Adam, the activations) are cloned for
 * avx512f and x86-64-v3 (target_clones): the same IEEE operations in wider
 * vectors, fused only where kernels_math.h writes fmaf (the build does not
 * contract), so the same bits on every machine.
 *
 * Threads: a product (its output's tiles), a batch of products, an
 * optimizer update (slices of 64Ki elements), a cross-entropy (eighths
 * of its rows), the row-wise kernels (LayerNorm, softmax, activations,
 * heads, adds, embeddings: whole rows, about 8Ki elements a piece) and
 * the sums over rows (LayerNorm's dg and db, sum_rows, the embedding's
 * scatter-add: blocks of 64 columns, each column summed in row order
 * within its one piece) are cut into pieces that the instance's team
 * (cpu_team.h: one thread per CPU, the queue's worker one of them)
 * shares; the rest (loss, sumsq, rounding) runs on the worker alone.
 * Pieces are cut by the kernel's shape alone (a product's tiles also by
 * the team's size: any cut of it gives the whole call's bits) and each
 * writes its own elements with single-threaded code, so the bits do not
 * depend on the threads. OpenBLAS itself runs one thread
 * per call: its own pool cuts a product into one fixed part per thread
 * whose threads wait for each other spinning (sched_yield), so under a
 * competing process the part whose thread lost its core held the product
 * up while the others spun; on the team a thread that loses its core
 * delays one piece, and the others take the rest (docs/BENCHMARKS.md).
 *
 * gemm_lp's float32 workspace is taken when enqueueing (so running out of
 * memory is an error of the call, before anything runs) from the queue's
 * warm workspace (struct cpu_ws): jobs of one queue run one at a time, so
 * every gemm_lp of a queue can widen into the same buffer, which stays
 * mapped from one step to the next. A fresh buffer per product was freshly
 * mapped memory each time: every page faulted in and zeroed by the kernel
 * before the widening wrote it, which made the bfloat16 guide step take
 * 94-120 ms where its float32 step takes 52-65 (bench_train). A product
 * that needs more than the buffer holds gets a larger one; the old stays
 * alive until its last job has run (reference counted).
 *
 * Thread-safety: the per-queue buffers are under the instance's mutex and
 * their counts atomic; each job touches only its own operands and its
 * queue's buffer, which no other job of that queue runs beside.
 */
#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/lock.h"
#include "device/topology.h"
#include "formats/convert.h"
#include "train/cpu_team.h"
#include "train/kernels_int.h"
#include "train/kernels_math.h"

/* The hot loops' clones for wider vector units, on x86-64 where GCC makes
 * them (elsewhere one version); ISO C's -ffp-contract=off keeps every
 * clone's arithmetic the same IEEE operations, and both vector clones have
 * FMA (x86-64-v3: AVX2 with it) for the fmaf of kernels_math.h (the
 * default one calls libm's: the same bits, slower). Not under
 * ThreadSanitizer: the clones' resolvers (ifuncs) run while the program
 * is relocated, before its runtime is up, and crash there. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define HOT_LOOP_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define HOT_LOOP_CLONES
#endif


struct job;
typedef void (*job_fn)(const struct job *j);

/* A float32 workspace: one reference per job that will widen into it, and
 * one for the queue slot that keeps it for the next product. */
struct cpu_ws {
	atomic_int refs;
	size_t cap;
	unsigned char mem[];            /* malloc's alignment: enough for floats */
};

/* Queues whose warm workspace is kept (past that, the least recent goes),
 * and the largest kept: a bigger one serves its product and is freed, its
 * page faults small against that product's FLOPs. */
#define CPU_WS_QUEUES 8
#define CPU_WS_KEEP_MAX ((size_t)64 << 20)

/* The instance's state: per queue, its warm workspace. A freed queue's
 * slot may serve a new queue at the same address: ts_queue_free has run all
 * of the old one's work by then. */
struct cpu_kernels {
	struct ts_mutex mu;
	struct {
		const struct ts_queue *q;
		struct cpu_ws *ws;
		uint64_t used;              /* tick of the last take, for eviction */
	} slot[CPU_WS_QUEUES];
	uint64_t tick;
	struct ts__cpu_team *team;      /* immutable after init; NULL: none (cpu_team.h) */
};

/* One enqueued kernel: what to run, and its arguments (operands borrowed). */
struct job {
	job_fn run;
	struct ts__cpu_team *team;      /* the instance's, or NULL */
	union {
		struct {
			bool ta, tb;
			int M, N, K;
			float alpha, beta;
			const float *A, *B;
			float *C;
			/* gemm_lp: the 16-bit operands, widened into A and B (in
			 * ws, the queue's workspace) before the sgemm */
			enum ts_dtype dt;
			const uint16_t *A16, *B16;
			struct cpu_ws *ws;      /* released once the job ran */
			/* gemm_batched: batch products, strides in elements */
			uint64_t sA, sB, sC;
			int batch;
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
		struct {
			enum ts_dtype to;
			const float *x;
			uint16_t *y;
			uint64_t n;
		} round;
		struct {
			const float *in;        /* fwd: table; bwd: grad_out; xent: logits */
			const void *ids;
			float *out;             /* fwd: rows; bwd: grad_table; xent: grad */
			float *loss;            /* xent: rows + 1 */
			double *ws;             /* xent: vocab doubles after the closure */
			int id_bytes, vocab, d;
			uint64_t rows;
		} tok;
		struct {
			/* ln: x, g, b | stats; softmax: S or P, dP; rows: x or dy */
			const float *a, *b, *c, *d;
			float *y, *y2, *y3;     /* ln_bwd: dx, dg, db */
			uint64_t rows, period;
			int n;                  /* a row's width (ln's d, softmax's T) */
			int B, T, P, H, hd;     /* heads */
			float eps, scale;
			bool to_heads;
		} tf;
	} u;
};

/* ---- the kernels (run on the queue's worker) ------------------------------ */

/* One product on the calling thread. */
static void gemm_one(const struct job *j)
{
	int M = j->u.gemm.M, N = j->u.gemm.N, K = j->u.gemm.K;
	float beta = j->u.gemm.beta;
	float *C = j->u.gemm.C;
	struct ts_m_colmajor_gemm g;

	if (K == 0) {
		/* C = beta * C, and BLAS's beta == 0 ignores what C held */
		for (size_t i = 0; i < (size_t)M * (size_t)N; i++)
			C[i] = beta == 0.0f ? 0.0f : beta * C[i];
		return;
	}
	/* the column-major call cuBLAS gets too (kernels_math.h) */
	g = ts_m_gemm_colmajor(j->u.gemm.ta, j->u.gemm.tb, M, N, K);
	cblas_sgemm(CblasColMajor, g.transa ? CblasTrans : CblasNoTrans,
	            g.transb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, j->u.gemm.alpha,
	            j->u.gemm.B, g.lda, j->u.gemm.A, g.ldb, beta, C, g.ldc);
}

/*
 * A product's pieces for the team: tiles of its column-major output. Tiles
 * split the output's rows and columns, never K: a tile is the sgemm of its
 * rows of op(A) and columns of op(B) over the whole K, so each element is
 * summed as the single-threaded call sums it. Tile edges fall on multiples
 * of GEMM_TILE_EDGE from the output's origin (the last tile of a row or
 * column takes what is left, never less than an edge), so an element meets
 * the same register block of OpenBLAS's kernel in its tile as in the whole
 * product; and every tile has at least GEMM_TILE_MNK multiply-adds, past
 * the sizes for which OpenBLAS (0.3.21, SkylakeX-class cores) takes its
 * small-matrix kernel, which sums K in one run instead of in its blocks:
 * a sliver of a few rows would take that kernel and round otherwise. So
 * every cut gives the bits of the one whole call (test_kernels'
 * test_gemm_tiles_same_bits_as_one_call), and the product alone of the
 * team's kernels may be cut by the team's size: GEMM_TILES_PER_THREAD
 * tiles a thread (at most GEMM_TILES_MAX), enough that a thread which
 * loses its core delays a few tiles while the others take the rest. More
 * tiles than that cost more than they balance: each tile's sgemm packs
 * its own rows of op(A) and columns of op(B), which OpenBLAS's own threads
 * pack once and share, and 32 tiles of the GPT's products on 2 threads
 * spent 8% more CPU time than 8 (docs/BENCHMARKS.md).
 */
struct gemm_split {
	int mt, nt;                     /* tiles down the rows, across the columns */
	int tm, tn;                     /* a tile's rows, columns (the last: what is left) */
};

#define GEMM_TILES_MAX 32
#define GEMM_TILES_PER_THREAD 4
#define GEMM_TILE_EDGE 64
#define GEMM_TILE_MNK ((double)(1 << 21))

static int tile_side(int whole, int tiles)
{
	return tiles == 1 ? whole : whole / tiles / GEMM_TILE_EDGE * GEMM_TILE_EDGE;
}

/* The tiles of an m x n output over k (column-major sgemm dimensions), at
 * most `most`. */
static struct gemm_split gemm_split(int m, int n, int k, int most)
{
	struct gemm_split s = {.mt = 1, .nt = 1, .tm = m, .tn = n};
	int pieces = (int)fmin(most, (double)m * n * k / GEMM_TILE_MNK);
	int mmax = m / GEMM_TILE_EDGE > 1 ? m / GEMM_TILE_EDGE : 1;
	int nmax = n / GEMM_TILE_EDGE > 1 ? n / GEMM_TILE_EDGE : 1;

	if (pieces < 2)
		return s;
	/* the most tiles up to `pieces` that the edges allow (a 256 x 256
	 * output over a long K cuts in at most 4 x 4), and among those the cut
	 * that packs the least: a tile's sgemm packs its rows of the first
	 * operand and its columns of the second, (tm + tn) k floats, so
	 * nt m + mt n in all (cutting columns alone packed the first operand
	 * whole for every tile: 32 times an 8192 x 256 head's); ties go to
	 * more column tiles (a tile's output is then the more contiguous) */
	for (int mt = 1; mt <= pieces && mt <= mmax; mt++) {
		int nt = pieces / mt < nmax ? pieces / mt : nmax;
		double cost = (double)nt * m + (double)mt * n;
		double best = (double)s.nt * m + (double)s.mt * n;

		if (mt * nt > s.mt * s.nt || (mt * nt == s.mt * s.nt && cost < best)) {
			s.mt = mt;
			s.nt = nt;
		}
	}
	for (;;) {
		s.tm = tile_side(m, s.mt);
		s.tn = tile_side(n, s.nt);
		if ((double)s.tm * s.tn * k >= GEMM_TILE_MNK || s.mt * s.nt == 1)
			return s;
		if (s.mt > 1)
			s.mt--;
		else
			s.nt--;
	}
}

/* A (batched) product's tiles: piece i is tile i % tiles of product i / tiles. */
struct gemm_task {
	const struct job *j;
	struct ts_m_colmajor_gemm g;
	struct gemm_split s;
	int64_t tiles;
};

static void gemm_piece(const void *arg, int64_t i)
{
	const struct gemm_task *t = arg;
	const struct job *j = t->j;
	const struct ts_m_colmajor_gemm *g = &t->g;
	uint64_t p = (uint64_t)(i / t->tiles);
	int tile = (int)(i % t->tiles), ri = tile % t->s.mt, ci = tile / t->s.mt;
	int r0 = ri * t->s.tm, c0 = ci * t->s.tn;
	int m = ri == t->s.mt - 1 ? g->m - r0 : t->s.tm, n = ci == t->s.nt - 1 ? g->n - c0 : t->s.tn;
	/* the call's A is the job's B, its B the job's A (gemm_one) */
	const float *a = j->u.gemm.B + p * j->u.gemm.sB;
	const float *b = j->u.gemm.A + p * j->u.gemm.sA;

	a += g->transa ? (size_t)r0 * g->lda : (size_t)r0;
	b += g->transb ? (size_t)c0 : (size_t)c0 * g->ldb;
	cblas_sgemm(CblasColMajor, g->transa ? CblasTrans : CblasNoTrans,
	            g->transb ? CblasTrans : CblasNoTrans, m, n, g->k, j->u.gemm.alpha, a, g->lda,
	            b, g->ldb, j->u.gemm.beta,
	            j->u.gemm.C + p * j->u.gemm.sC + r0 + (size_t)c0 * g->ldc, g->ldc);
}

/* batch products (strides sA, sB, sC; 0 for one), their tiles shared by
 * the team: GEMM_TILES_PER_THREAD pieces a thread in all, so a batch of
 * at least that many products runs each whole. */
static void gemm_tiles(const struct job *j, int batch)
{
	struct gemm_task t = {.j = j};
	int threads = ts__cpu_team_threads(j->team);
	int most = threads < 2 ? 1 : (int)fmin(GEMM_TILES_MAX, GEMM_TILES_PER_THREAD * threads);

	most = most / batch > 1 ? most / batch : 1;
	t.g = ts_m_gemm_colmajor(j->u.gemm.ta, j->u.gemm.tb, j->u.gemm.M, j->u.gemm.N, j->u.gemm.K);
	t.s = gemm_split(t.g.m, t.g.n, t.g.k, most);
	t.tiles = (int64_t)t.s.mt * t.s.nt;
	ts__cpu_team_for(j->team, t.tiles * batch, gemm_piece, &t);
}

static void run_gemm(const struct job *j)
{
	if (j->u.gemm.K == 0 || j->u.gemm.M == 0 || j->u.gemm.N == 0) {
		gemm_one(j);
		return;
	}
	gemm_tiles(j, 1);
}

/* The 16-bit operands widened exactly to float32 (formats/convert.h), then
 * the float32 GEMM: the products of two bfloat16 or float16 values are
 * exact in float32, the sums float32. */
static void run_gemm_lp(const struct job *j)
{
	uint64_t mk = (uint64_t)j->u.gemm.M * (uint64_t)j->u.gemm.K;
	uint64_t kn = (uint64_t)j->u.gemm.K * (uint64_t)j->u.gemm.N;

	ts_convert(TS_DT_FLOAT32, (float *)j->u.gemm.A, j->u.gemm.dt, j->u.gemm.A16, mk);
	ts_convert(TS_DT_FLOAT32, (float *)j->u.gemm.B, j->u.gemm.dt, j->u.gemm.B16, kn);
	run_gemm(j);
}

static void run_round(const struct job *j)
{
	ts_convert(j->u.round.to, j->u.round.y, TS_DT_FLOAT32, j->u.round.x, j->u.round.n);
}

/*
 * The row-wise kernels' pieces for the team: whole rows (elements, for an
 * element-wise kernel), about PIECE_ELEMS elements' worth and at least
 * one row, cut by the kernel's shape alone. Each row's result is computed
 * by the one piece holding it with the same single-threaded code, and a
 * sum across rows runs in its one fixed order inside one piece, so the
 * bits do not depend on the team's size or on which thread ran which
 * piece.
 */
#define PIECE_ELEMS ((uint64_t)1 << 13)

typedef void (*rows_fn)(const struct job *j, uint64_t r0, uint64_t r1);

struct rows_task {
	const struct job *j;
	rows_fn fn;
	uint64_t rows, per;
};

static void rows_piece(const void *arg, int64_t i)
{
	const struct rows_task *t = arg;
	uint64_t r0 = (uint64_t)i * t->per, r1 = r0 + t->per;

	t->fn(t->j, r0, r1 < t->rows ? r1 : t->rows);
}

/* fn over rows [0, rows) of `width` elements each, in pieces on j's team. */
static void team_rows(const struct job *j, uint64_t rows, uint64_t width, rows_fn fn)
{
	struct rows_task t = {.j = j, .fn = fn, .rows = rows};

	t.per = width >= PIECE_ELEMS ? 1 : PIECE_ELEMS / (width ? width : 1);
	ts__cpu_team_for(j->team, (int64_t)((rows + t.per - 1) / t.per), rows_piece, &t);
}

HOT_LOOP_CLONES
static void act_fwd_range(const struct job *j, uint64_t i0, uint64_t i1)
{
	const float *in = j->u.act.in + i0;
	float *out = j->u.act.out + i0;
	uint64_t n = i1 - i0;

	/* one loop per activation: each vectorises on its own */
	switch (j->u.act.act) {
	case TS_ACT_RELU:
		for (uint64_t i = 0; i < n; i++)
			out[i] = ts_m_relu(in[i]);
		break;
	case TS_ACT_GELU:
		for (uint64_t i = 0; i < n; i++)
			out[i] = ts_m_gelu(in[i]);
		break;
	case TS_ACT_TANH:
		for (uint64_t i = 0; i < n; i++)
			out[i] = ts_m_tanh(in[i]);
		break;
	case TS_ACT_NONE:
	default:
		for (uint64_t i = 0; i < n && in != out; i++)
			out[i] = in[i];
		break;
	}
}

static void run_act_fwd(const struct job *j)
{
	team_rows(j, j->u.act.n, 1, act_fwd_range);
}

HOT_LOOP_CLONES
static void act_bwd_range(const struct job *j, uint64_t i0, uint64_t i1)
{
	const float *pre = j->u.act.in + i0, *go = j->u.act.grad + i0;
	float *gi = j->u.act.out + i0;
	uint64_t n = i1 - i0;

	switch (j->u.act.act) {
	case TS_ACT_RELU:
		for (uint64_t i = 0; i < n; i++)
			gi[i] = ts_m_relu_bwd(pre[i], go[i]);
		break;
	case TS_ACT_GELU:
		for (uint64_t i = 0; i < n; i++)
			gi[i] = ts_m_gelu_bwd(pre[i], go[i]);
		break;
	case TS_ACT_TANH:
		for (uint64_t i = 0; i < n; i++)
			gi[i] = ts_m_tanh_bwd(pre[i], go[i]);
		break;
	case TS_ACT_NONE:
	default:
		for (uint64_t i = 0; i < n && go != gi; i++)
			gi[i] = go[i];
		break;
	}
}

static void run_act_bwd(const struct job *j)
{
	team_rows(j, j->u.act.n, 1, act_bwd_range);
}

static void add_range(const struct job *j, uint64_t i0, uint64_t i1)
{
	const float *x = j->u.add.x;
	float *y = j->u.add.y;

	for (uint64_t i = i0; i < i1; i++)
		y[i] += x[i];
}

static void run_add(const struct job *j)
{
	team_rows(j, j->u.add.n, 1, add_range);
}

/* The lanes' tree over part (kernels_math.h): CUDA's order exactly. */
static double lanes_reduce(double *part)
{
	for (unsigned s = TS_RED_LANES / 2; s > 0; s >>= 1)
		for (unsigned l = 0; l < s; l++)
			part[l] += part[l + s];
	return part[0];
}

static void run_loss(const struct job *j)
{
	const float *out = j->u.loss.out, *target = j->u.loss.target;
	float *grad = j->u.loss.grad;
	uint64_t n = j->u.loss.n;
	double part[TS_RED_LANES] = {0};

	/* element i goes to lane i % LANES, in increasing i per lane */
	for (uint64_t b = 0; b < n; b += TS_RED_LANES) {
		unsigned lim = n - b < TS_RED_LANES ? (unsigned)(n - b) : TS_RED_LANES;

		if (j->u.loss.loss == TS_LOSS_SUM) {
			for (unsigned l = 0; l < lim; l++) {
				part[l] += out[b + l];
				grad[b + l] = 1.0f;
			}
			continue;
		}
		for (unsigned l = 0; l < lim; l++) {
			float d = ts_m_mse_diff(out[b + l], target[b + l]);

			part[l] += ts_m_sq(d);
			grad[b + l] = ts_m_mse_grad(d, n);
		}
	}
	*j->u.loss.value = ts_m_loss_value(j->u.loss.loss, lanes_reduce(part), n);
}

static void run_sumsq(const struct job *j)
{
	const float *x = j->u.sumsq.x;
	uint64_t n = j->u.sumsq.n;
	double part[TS_RED_LANES] = {0};

	for (uint64_t b = 0; b < n; b += TS_RED_LANES) {
		unsigned lim = n - b < TS_RED_LANES ? (unsigned)(n - b) : TS_RED_LANES;

		for (unsigned l = 0; l < lim; l++)
			part[l] += ts_m_sq(x[b + l]);
	}
	*j->u.sumsq.acc = ts_m_sumsq_acc(*j->u.sumsq.acc, lanes_reduce(part));
}

/*
 * Adam over n parameters. The operands never overlap (restrict), so the
 * compiler vectorises the loop (the build passes -fno-math-errno, letting
 * sqrtf become one instruction); the arithmetic per element is exactly
 * ts_m_adam's.
 */
HOT_LOOP_CLONES
static void adam_loop(float *restrict p, const float *restrict g, float *restrict mu,
                      float *restrict nu, uint64_t n, float lr, float b1, float b2, float eps,
                      float bc1, float bc2, float wd, float norm, float c, bool clip)
{
	/* -O3 unswitches the loop on the invariant clip, then vectorises each copy */
	for (uint64_t i = 0; i < n; i++) {
		float gi = ts_m_clip_grad(g[i], clip, norm, c);

		p[i] = ts_m_adam(p[i], gi, &mu[i], &nu[i], lr, b1, b2, eps, bc1, bc2, wd);
	}
}

/* An update in slices of UPDATE_PIECE elements (each element's update is
 * its own: the same bits however it is cut). */
#define UPDATE_PIECE ((uint64_t)1 << 16)

static void update_piece(const void *arg, int64_t i)
{
	const struct job *j = arg;
	const struct ts_optimizer *o = &j->u.update.opt;
	uint64_t i0 = (uint64_t)i * UPDATE_PIECE, n = j->u.update.n - i0;
	float *p = j->u.update.p + i0, *mu = j->u.update.mu, *nu = j->u.update.nu;
	const float *g = j->u.update.g + i0;
	float lr = ts_m_learning_rate(o, j->u.update.step - 1), c = o->clip_global_norm, norm = 0.0f;
	bool clip = false;

	n = n < UPDATE_PIECE ? n : UPDATE_PIECE;
	if (c > 0.0f)
		clip = ts_m_clips(*j->u.update.gnorm_sq, c, &norm);
	if (o->type == TS_OPT_SGD) {
		for (uint64_t e = 0; e < n; e++)
			p[e] = ts_m_sgd(p[e], ts_m_clip_grad(g[e], clip, norm, c), lr);
		return;
	}
	adam_loop(p, g, mu + i0, nu + i0, n, lr, o->b1, o->b2, o->eps,
	          ts_m_bias_correction(o->b1, j->u.update.step),
	          ts_m_bias_correction(o->b2, j->u.update.step), o->adamw ? o->weight_decay : 0.0f,
	          clip ? norm : 1.0f, clip ? c : 1.0f, clip);
}

static void run_update(const struct job *j)
{
	ts__cpu_team_for(j->team, (int64_t)((j->u.update.n + UPDATE_PIECE - 1) / UPDATE_PIECE),
	         update_piece, j);
}

static void fill_range(const struct job *j, uint64_t i0, uint64_t i1)
{
	float *x = j->u.fill.x;
	float v = j->u.fill.v;

	for (uint64_t i = i0; i < i1; i++)
		x[i] = v;
}

static void run_fill(const struct job *j)
{
	team_rows(j, j->u.fill.n, 1, fill_range);
}

static void embed_fwd_range(const struct job *j, uint64_t r0, uint64_t r1)
{
	const float *table = j->u.tok.in;
	float *out = j->u.tok.out;
	size_t d = (size_t)j->u.tok.d;

	for (uint64_t r = r0; r < r1; r++) {
		int64_t t = ts_m_token(j->u.tok.ids, j->u.tok.id_bytes, r, j->u.tok.vocab);

		if (t >= 0)
			memcpy(out + r * d, table + (size_t)t * d, d * sizeof *out);
		else
			memset(out + r * d, 0, d * sizeof *out);
	}
}

static void run_embed_fwd(const struct job *j)
{
	team_rows(j, j->u.tok.rows, (uint64_t)j->u.tok.d, embed_fwd_range);
}

/* The scatter-add's pieces: blocks of EMBED_COLS columns, each zeroed and
 * then summed in row order over every row, as the CUDA kernel's threads
 * (one column each) sum: the same adds, whoever runs a block. */
#define EMBED_COLS 64

static void embed_bwd_piece(const void *arg, int64_t i)
{
	const struct job *j = arg;
	const float *go = j->u.tok.in;
	float *gt = j->u.tok.out;
	size_t d = (size_t)j->u.tok.d, c0 = (size_t)i * EMBED_COLS;
	size_t c1 = c0 + EMBED_COLS < d ? c0 + EMBED_COLS : d;

	for (size_t v = 0; v < (size_t)j->u.tok.vocab; v++)
		memset(gt + v * d + c0, 0, (c1 - c0) * sizeof *gt);
	for (uint64_t r = 0; r < j->u.tok.rows; r++) {
		int64_t t = ts_m_token(j->u.tok.ids, j->u.tok.id_bytes, r, j->u.tok.vocab);

		if (t < 0)
			continue;
		for (size_t c = c0; c < c1; c++)
			gt[(size_t)t * d + c] += go[r * d + c];
	}
}

static void run_embed_bwd(const struct job *j)
{
	ts__cpu_team_for(j->team, (j->u.tok.d + EMBED_COLS - 1) / EMBED_COLS, embed_bwd_piece, j);
}

/* The largest of x[0, n), as the fold max = fmaxf(max, x[c]) from -inf
 * gives it (NaNs skipped), inline compares in W independent lanes rather
 * than a call per element: which lane saw an element does not change the
 * maximum. */
static float row_max(const float *restrict x, uint64_t n)
{
	enum { W = 16 };
	float m[W], max = -INFINITY;
	uint64_t c = 0;

	for (unsigned l = 0; l < W; l++)
		m[l] = -INFINITY;
	for (; c + W <= n; c += W)
		for (unsigned l = 0; l < W; l++)
			m[l] = x[c + l] > m[l] ? x[c + l] : m[l];
	for (; c < n; c++)
		max = x[c] > max ? x[c] : max;
	for (unsigned l = 0; l < W; l++)
		max = m[l] > max ? m[l] : max;
	return max;
}

/*
 * One row of softmax cross-entropy: each term exp(x - max) computed once
 * into e (V doubles), summed in the lanes' order (element c to lane
 * c % LANES, a block of LANES at a time: the lanes' adds are independent
 * and vectorise), then the gradients from the same terms. Returns the
 * row's loss.
 */
HOT_LOOP_CLONES
static float xent_row(const float *restrict xr, float *restrict gr, double *restrict e,
                      uint64_t V, int64_t t, uint64_t rows)
{
	double part[TS_RED_LANES] = {0}, sum, inv;
	float max;

	if (t < 0) {
		for (uint64_t c = 0; c < V; c++)
			gr[c] = 0.0f;
		return 0.0f;
	}
	max = row_max(xr, V);
	for (uint64_t c = 0; c < V; c++)
		e[c] = ts_m_xent_exp(xr[c], max);
	for (uint64_t b = 0; b < V; b += TS_RED_LANES) {
		unsigned lim = V - b < TS_RED_LANES ? (unsigned)(V - b) : TS_RED_LANES;

		for (unsigned l = 0; l < lim; l++)
			part[l] += e[b + l];
	}
	sum = lanes_reduce(part);
	inv = ts_m_inv(sum);
	for (uint64_t c = 0; c < V; c++)
		gr[c] = ts_m_xent_grad_e(e[c], inv, false, rows);
	gr[t] = ts_m_xent_grad_e(e[t], inv, true, rows);
	return ts_m_xent_loss(sum, max, xr[t]);
}

/* A cross-entropy's rows in XENT_PIECES slices (the team's pieces; each
 * row is its own), each slice with its own V doubles of j->u.tok.ws for
 * the terms of a row; then the mean, in the lanes' order as ever. */
#define XENT_PIECES 8

static void xent_piece(const void *arg, int64_t i)
{
	const struct job *j = arg;
	uint64_t rows = j->u.tok.rows, V = (uint64_t)j->u.tok.vocab;
	uint64_t r0 = rows * (uint64_t)i / XENT_PIECES, r1 = rows * (uint64_t)(i + 1) / XENT_PIECES;

	for (uint64_t r = r0; r < r1; r++)
		j->u.tok.loss[1 + r] = xent_row(j->u.tok.in + r * V, j->u.tok.out + r * V,
		                                j->u.tok.ws + (uint64_t)i * V, V,
		                                ts_m_token(j->u.tok.ids, j->u.tok.id_bytes, r, (int)V),
		                                rows);
}

static void run_xent(const struct job *j)
{
	float *loss = j->u.tok.loss;
	uint64_t rows = j->u.tok.rows;
	double part[TS_RED_LANES] = {0};

	ts__cpu_team_for(j->team, XENT_PIECES, xent_piece, j);
	for (uint64_t r = 0; r < rows; r++)
		part[r % TS_RED_LANES] += loss[1 + r];
	loss[0] = (float)(lanes_reduce(part) / (double)rows);
}

/* ---- transformer blocks ------------------------------------------------------ */

/* The sum of f over a row's d elements in the lanes' order. */
#define LANES_SUM(out, d, expr)                                                       \
	do {                                                                          \
		double part_[TS_RED_LANES] = {0};                                     \
		for (uint64_t b_ = 0; b_ < (uint64_t)(d); b_ += TS_RED_LANES) {       \
			unsigned lim_ = (uint64_t)(d) - b_ < TS_RED_LANES                \
			                ? (unsigned)((uint64_t)(d) - b_) : TS_RED_LANES; \
			for (unsigned l_ = 0; l_ < lim_; l_++) {                      \
				uint64_t c = b_ + l_;                                 \
				part_[l_] += (expr);                                  \
			}                                                             \
		}                                                                     \
		(out) = lanes_reduce(part_);                                          \
	} while (0)

HOT_LOOP_CLONES
static void ln_fwd_range(const struct job *j, uint64_t r0, uint64_t r1)
{
	const float *x = j->u.tf.a, *g = j->u.tf.b, *bias = j->u.tf.c;
	float *y = j->u.tf.y, *stats = j->u.tf.y2;
	int d = j->u.tf.n;

	for (uint64_t r = r0; r < r1; r++) {
		const float *xr = x + r * (uint64_t)d;
		float *yr = y + r * (uint64_t)d, mean, rstd;
		double sum, var, m;

		LANES_SUM(sum, d, (double)xr[c]);
		m = sum / (double)d;
		LANES_SUM(var, d, ts_m_ln_dev_sq(xr[c], m));
		mean = (float)m;
		rstd = ts_m_ln_rstd(var, d, j->u.tf.eps);
		for (int c = 0; c < d; c++)
			yr[c] = ts_m_ln_out(ts_m_ln_xhat(xr[c], mean, rstd), g[c], bias[c]);
		stats[2 * r] = mean;
		stats[2 * r + 1] = rstd;
	}
}

static void run_ln_fwd(const struct job *j)
{
	team_rows(j, j->u.tf.rows, (uint64_t)j->u.tf.n, ln_fwd_range);
}

/* dx, row by row. */
HOT_LOOP_CLONES
static void ln_bwd_range(const struct job *j, uint64_t r0, uint64_t r1)
{
	const float *x = j->u.tf.a, *g = j->u.tf.b, *stats = j->u.tf.c, *dy = j->u.tf.d;
	float *dx = j->u.tf.y;
	int d = j->u.tf.n;

	for (uint64_t r = r0; r < r1; r++) {
		const float *xr = x + r * (uint64_t)d, *dyr = dy + r * (uint64_t)d;
		float *dxr = dx + r * (uint64_t)d, mean = stats[2 * r], rstd = stats[2 * r + 1];
		double s1, s2;

		LANES_SUM(s1, d, (double)ts_m_ln_dyg(dyr[c], g[c]));
		LANES_SUM(s2, d, (double)ts_m_ln_dyg(dyr[c], g[c]) * (double)ts_m_ln_xhat(xr[c], mean, rstd));
		for (int c = 0; c < d; c++)
			dxr[c] = ts_m_ln_dx(ts_m_ln_dyg(dyr[c], g[c]), ts_m_ln_xhat(xr[c], mean, rstd), rstd, s1, s2,
			                    d);
	}
}

/* The pieces of a sum over rows per column (the LayerNorm's dg and db,
 * sum_rows'): blocks of COL_BLOCK columns, each column summed in double
 * in increasing row order (as CUDA's threads, one per column, sum it),
 * walking the rows in memory order with a block of partial sums. */
#define COL_BLOCK 64

/* The parameters' gradients of columns [c0, c0 + COL_BLOCK) of d. */
static void ln_bwd_cols(const void *arg, int64_t i)
{
	const struct job *j = arg;
	const float *x = j->u.tf.a, *stats = j->u.tf.c, *dy = j->u.tf.d;
	uint64_t d = (uint64_t)j->u.tf.n, c0 = (uint64_t)i * COL_BLOCK;
	unsigned w = d - c0 < COL_BLOCK ? (unsigned)(d - c0) : COL_BLOCK;
	double sg[COL_BLOCK] = {0}, sb[COL_BLOCK] = {0};

	for (uint64_t r = 0; r < j->u.tf.rows; r++) {
		const float *dyr = dy + r * d + c0, *xr = x + r * d + c0;
		float mean = stats[2 * r], rstd = stats[2 * r + 1];

		for (unsigned c = 0; c < w; c++) {
			sg[c] += (double)dyr[c] * (double)ts_m_ln_xhat(xr[c], mean, rstd);
			sb[c] += (double)dyr[c];
		}
	}
	for (unsigned c = 0; c < w; c++) {
		j->u.tf.y2[c0 + c] = (float)sg[c];
		j->u.tf.y3[c0 + c] = (float)sb[c];
	}
}

static void run_ln_bwd(const struct job *j)
{
	team_rows(j, j->u.tf.rows, (uint64_t)j->u.tf.n, ln_bwd_range);
	ts__cpu_team_for(j->team, (j->u.tf.n + COL_BLOCK - 1) / COL_BLOCK, ln_bwd_cols, j);
}

static void add_rows_range(const struct job *j, uint64_t r0, uint64_t r1)
{
	const float *x = j->u.tf.a;
	float *y = j->u.tf.y;
	uint64_t n = (uint64_t)j->u.tf.n, period = j->u.tf.period;

	for (uint64_t r = r0; r < r1; r++) {
		const float *xr = x + (r % period) * n;
		float *yr = y + r * n;

		for (uint64_t c = 0; c < n; c++)
			yr[c] += xr[c];
	}
}

static void run_add_rows(const struct job *j)
{
	team_rows(j, j->u.tf.rows, (uint64_t)j->u.tf.n, add_rows_range);
}

/* Output row p's columns [c0, c0 + COL_BLOCK), piece p * blocks + block:
 * each summed in double in increasing r. */
static void sum_rows_piece(const void *arg, int64_t i)
{
	const struct job *j = arg;
	const float *dy = j->u.tf.a;
	uint64_t n = (uint64_t)j->u.tf.n, period = j->u.tf.period, rows = j->u.tf.rows;
	uint64_t blocks = (n + COL_BLOCK - 1) / COL_BLOCK;
	uint64_t p = (uint64_t)i / blocks, c0 = (uint64_t)i % blocks * COL_BLOCK;
	unsigned w = n - c0 < COL_BLOCK ? (unsigned)(n - c0) : COL_BLOCK;
	double s[COL_BLOCK] = {0};

	for (uint64_t r = p; r < rows; r += period)
		for (unsigned c = 0; c < w; c++)
			s[c] += (double)dy[r * n + c0 + c];
	for (unsigned c = 0; c < w; c++)
		j->u.tf.y[p * n + c0 + c] = (float)s[c];
}

static void run_sum_rows(const struct job *j)
{
	uint64_t blocks = ((uint64_t)j->u.tf.n + COL_BLOCK - 1) / COL_BLOCK;

	ts__cpu_team_for(j->team, (int64_t)(j->u.tf.period * blocks), sum_rows_piece, j);
}

/* Rows (b, t) of the [B, T, P, H, hd] side: each head's hd floats of a
 * row are contiguous on both sides (ts_m_heads_index's places), copied
 * whole. */
static void heads_range(const struct job *j, uint64_t r0, uint64_t r1)
{
	uint64_t B = (uint64_t)j->u.tf.B, T = (uint64_t)j->u.tf.T, P = (uint64_t)j->u.tf.P;
	uint64_t H = (uint64_t)j->u.tf.H, hd = (uint64_t)j->u.tf.hd;
	const float *in = j->u.tf.a;
	float *out = j->u.tf.y;

	for (uint64_t r = r0; r < r1; r++)
		for (uint64_t ph = 0; ph < P * H; ph++) {
			uint64_t i = (r * P * H + ph) * hd;
			uint64_t o = ts_m_heads_index(i, B, T, P, H, hd);

			if (j->u.tf.to_heads)
				memcpy(out + o, in + i, hd * sizeof *out);
			else
				memcpy(out + i, in + o, hd * sizeof *out);
		}
}

static void run_heads(const struct job *j)
{
	uint64_t rows = (uint64_t)j->u.tf.B * (uint64_t)j->u.tf.T;

	team_rows(j, rows, (uint64_t)j->u.tf.P * (uint64_t)j->u.tf.H * (uint64_t)j->u.tf.hd,
	          heads_range);
}

/* The products of a batch and their tiles shared by the team. */
static void run_gemm_batched(const struct job *j)
{
	struct job one = *j;

	if (j->u.gemm.K != 0 && j->u.gemm.M != 0 && j->u.gemm.N != 0) {
		gemm_tiles(j, j->u.gemm.batch);
		return;
	}
	for (int i = 0; i < j->u.gemm.batch; i++) {
		one.u.gemm.C = j->u.gemm.C + (uint64_t)i * j->u.gemm.sC;
		gemm_one(&one);
	}
}

/* Batch by batch: product i's 16-bit operands at A16 + i sA and B16 + i sB
 * widened into the workspace (one product's worth), then its sgemm. */
static void run_gemm_batched_lp(const struct job *j)
{
	struct job one = *j;

	for (int i = 0; i < j->u.gemm.batch; i++) {
		one.u.gemm.A16 = j->u.gemm.A16 + (uint64_t)i * j->u.gemm.sA;
		one.u.gemm.B16 = j->u.gemm.B16 + (uint64_t)i * j->u.gemm.sB;
		one.u.gemm.C = j->u.gemm.C + (uint64_t)i * j->u.gemm.sC;
		run_gemm_lp(&one);
	}
}

/* The longest row whose terms exp(x - max) a piece keeps (on its stack)
 * from the sum to the probabilities; a longer row computes them twice (the
 * same bits both times). */
#define SOFTMAX_KEEP 1024

/* Row i of a T x T block of scores attends to columns 0..i. */
HOT_LOOP_CLONES
static void softmax_fwd_range(const struct job *j, uint64_t r0, uint64_t r1)
{
	uint64_t T = (uint64_t)j->u.tf.n;
	float scale = j->u.tf.scale;
	double e[SOFTMAX_KEEP];

	for (uint64_t r = r0; r < r1; r++) {
		const float *sr = j->u.tf.a + r * T;
		float *pr = j->u.tf.y + r * T, max = -INFINITY;
		uint64_t len = r % T + 1;
		double sum, inv;

		for (uint64_t c = 0; c < len; c++) {
			float v = ts_m_att_scaled(sr[c], scale);

			max = v > max ? v : max;
		}
		if (len <= SOFTMAX_KEEP) {
			for (uint64_t c = 0; c < len; c++)
				e[c] = ts_m_att_exp(sr[c], scale, max);
			LANES_SUM(sum, len, e[c]);
			inv = ts_m_inv(sum);
			for (uint64_t c = 0; c < len; c++)
				pr[c] = ts_m_softmax_p(e[c], inv);
		} else {
			LANES_SUM(sum, len, ts_m_att_exp(sr[c], scale, max));
			inv = ts_m_inv(sum);
			for (uint64_t c = 0; c < len; c++)
				pr[c] = ts_m_softmax_p(ts_m_att_exp(sr[c], scale, max),
				                       inv);
		}
		for (uint64_t c = len; c < T; c++)
			pr[c] = 0.0f;
	}
}

static void run_softmax_fwd(const struct job *j)
{
	team_rows(j, j->u.tf.rows, (uint64_t)j->u.tf.n, softmax_fwd_range);
}

HOT_LOOP_CLONES
static void softmax_bwd_range(const struct job *j, uint64_t r0, uint64_t r1)
{
	uint64_t T = (uint64_t)j->u.tf.n;

	for (uint64_t r = r0; r < r1; r++) {
		const float *pr = j->u.tf.a + r * T, *dpr = j->u.tf.b + r * T;
		float *dsr = j->u.tf.y + r * T;
		uint64_t len = r % T + 1;
		double pdp;

		LANES_SUM(pdp, len, (double)pr[c] * (double)dpr[c]);
		for (uint64_t c = 0; c < T; c++)
			dsr[c] = c < len ? ts_m_att_grad(pr[c], dpr[c], pdp, j->u.tf.scale) : 0.0f;
	}
}

static void run_softmax_bwd(const struct job *j)
{
	team_rows(j, j->u.tf.rows, (uint64_t)j->u.tf.n, softmax_bwd_range);
}

/* ---- enqueueing ------------------------------------------------------------ */

static void ws_release(struct cpu_ws *ws)
{
	if (ws && atomic_fetch_sub(&ws->refs, 1) == 1)
		free(ws);
}

/* What a closure holds beside its own memory: a gemm_lp's workspace (a
 * batched one's too). */
static void job_release(const struct job *j)
{
	if (j->run == run_gemm_lp || j->run == run_gemm_batched_lp)
		ws_release(j->u.gemm.ws);
}

static void job_free(struct job *j)
{
	job_release(j);
	free(j);
}

/* The host callback: runs the kernel, then frees its closure (steals arg). */
static void job_main(void *arg)
{
	struct job *j = arg;

	j->run(j);
	job_free(j);
}

/* The kernel's name in traces (static). */
static const char *job_name(job_fn run)
{
	static const struct {
		job_fn run;
		const char *name;
	} names[] = {
		{run_gemm, "gemm"}, {run_gemm_lp, "gemm_lp"}, {run_round, "round"},
		{run_act_fwd, "act_fwd"}, {run_act_bwd, "act_bwd"}, {run_add, "add"},
		{run_loss, "loss"}, {run_sumsq, "sumsq"}, {run_update, "update"}, {run_fill, "fill"},
		{run_embed_fwd, "embed_fwd"}, {run_embed_bwd, "embed_bwd"}, {run_xent, "xent"},
		{run_ln_fwd, "ln_fwd"}, {run_ln_bwd, "ln_bwd"}, {run_add_rows, "add_rows"},
		{run_sum_rows, "sum_rows"}, {run_heads, "heads"},
		{run_gemm_batched, "gemm_batched"}, {run_gemm_batched_lp, "gemm_batched_lp"},
		{run_softmax_fwd, "softmax_fwd"}, {run_softmax_bwd, "softmax_bwd"},
	};

	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (names[i].run == run)
			return names[i].name;
	return "kernel";
}

/* Enqueues j on q (steals j, also on failure). */
static ts_status job_submit(struct ts_queue *q, struct job *j, struct ts_error *err)
{
	ts_status st = ts_queue_host_fn_named(q, job_main, j, job_name(j->run), err);

	if (st != TS_OK)
		job_free(j);
	return st;
}

/* Enqueues a copy of *a (a kernel and its arguments) on q; what *a holds
 * passes to the copy, and is released on failure. */
static ts_status job_post(void *impl, struct ts_queue *q, const struct job *a,
                          struct ts_error *err)
{
	struct job *j = malloc(sizeof *j);

	if (!j) {
		job_release(a);
		return ts_error_oom(err, "%s: out of memory queueing a kernel",
		                    ts_device_props(ts_queue_device(q))->id);
	}
	*j = *a;
	j->team = impl ? ((struct cpu_kernels *)impl)->team : NULL;
	return job_submit(q, j, err);
}

/* A copy of *a followed by a workspace of ws_bytes (not zeroed), on 64
 * bytes; NULL when there is no memory for it. */
static struct job *job_with_workspace(const struct job *a, size_t ws_bytes, void **ws)
{
	size_t head = (sizeof(struct job) + 63) & ~(size_t)63;
	struct job *j = ws_bytes <= SIZE_MAX - head ? malloc(head + ws_bytes) : NULL;

	if (j) {
		*j = *a;
		*ws = (char *)j + head;
	}
	return j;
}

/* A helper of dev's team onto its local CPUs (ts__cpu_team_bind_fn). */
static void team_bind(void *ctx, pthread_t helper)
{
	const struct ts_device *dev = ctx;

	(void)ts_topology_bind_cpus(ts_device_topology(dev), ts_device_props(dev)->id,
	                            TS_CPUBIND_KERNELS, helper);
}

static ts_status cpu_init(struct ts_device *dev, void **impl, struct ts_error *err)
{
	int bound;

	struct cpu_kernels *k = calloc(1, sizeof *k);

	if (!k || ts_mutex_init(&k->mu) != 0) {
		free(k);
		return ts_error_oom(err, "%s: out of memory for the cpu kernels",
		                    ts_device_props(dev)->id);
	}
	/* the products' threads are the team's, one OpenBLAS thread each: the
	 * setting is the process's (OpenBLAS has no other), and nothing else in
	 * it calls OpenBLAS */
	openblas_set_num_threads(1);
	/* on the device's local CPUs, one thread each, where the topology binds
	 * its kernels (topology.h); else one per CPU of the process */
	bound = ts_topology_kernel_threads(ts_device_topology(dev), ts_device_props(dev)->id);
	k->team = ts__cpu_team_new(bound, bound ? team_bind : NULL, dev);
	*impl = k;
	return TS_OK;
}

/* Jobs still pending keep their workspaces: the last to run frees each. */
static void cpu_fini(void *impl)
{
	struct cpu_kernels *k = impl;

	if (!k)
		return;
	ts__cpu_team_free(k->team);
	for (int i = 0; i < CPU_WS_QUEUES; i++)
		ws_release(k->slot[i].ws);
	ts_mutex_destroy(&k->mu);
	free(k);
}

/* A workspace of at least bytes for a job on q, with a reference for it:
 * q's warm one when it is large enough, else a new one, which q keeps
 * (its old one freed when its last job has run) unless it is larger than
 * CPU_WS_KEEP_MAX. NULL when there is no memory. */
static struct cpu_ws *ws_take(struct cpu_kernels *k, const struct ts_queue *q, size_t bytes)
{
	struct cpu_ws *ws;
	int at = -1, oldest = 0;

	if (bytes > SIZE_MAX - sizeof *ws)
		return NULL;
	ts_mutex_lock(&k->mu);
	k->tick++;
	for (int i = 0; i < CPU_WS_QUEUES; i++) {
		if (k->slot[i].ws && k->slot[i].q == q)
			at = i;
		if (k->slot[i].used < k->slot[oldest].used)
			oldest = i;
	}
	if (at >= 0 && k->slot[at].ws->cap >= bytes) {
		ws = k->slot[at].ws;
	} else {
		/* not zeroed: the widening writes every element it reads */
		ws = malloc(sizeof *ws + bytes);
		if (!ws) {
			ts_mutex_unlock(&k->mu);
			return NULL;
		}
		ws->cap = bytes;
		atomic_init(&ws->refs, 0);
		if (bytes <= CPU_WS_KEEP_MAX) {
			if (at < 0)
				at = oldest;
			ws_release(k->slot[at].ws);     /* its pending jobs keep theirs */
			atomic_fetch_add(&ws->refs, 1);
			k->slot[at].q = q;
			k->slot[at].ws = ws;
		}
	}
	if (at >= 0)
		k->slot[at].used = k->tick;
	atomic_fetch_add(&ws->refs, 1);
	ts_mutex_unlock(&k->mu);
	return ws;
}

static ts_status cpu_gemm(void *impl, struct ts_queue *q, bool ta, bool tb, int M, int N, int K,
                          float alpha, const float *A, const float *B, float beta, float *C,
                          struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_gemm,
	                                       .u.gemm = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K,
	                                                  .alpha = alpha, .beta = beta, .A = A, .B = B,
	                                                  .C = C}},
	                err);
}

static enum ts_dtype lowp_dtype(enum ts_compute c)
{
	return c == TS_COMPUTE_F16 ? TS_DT_FLOAT16 : TS_DT_BFLOAT16;
}

static ts_status cpu_round(void *impl, struct ts_queue *q, enum ts_compute to, const float *x,
                           uint16_t *y, uint64_t n, struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_round,
	                                       .u.round = {.to = lowp_dtype(to), .x = x, .y = y, .n = n}},
	                err);
}

/* The float32 workspace of the widened operands (sgemm needs float32) is
 * the queue's warm one (ws_take), taken when enqueueing like the closure. */
static ts_status cpu_gemm_lp(void *impl, struct ts_queue *q, enum ts_compute dt, bool ta,
                             bool tb, int M, int N, int K, float alpha, const uint16_t *A,
                             const uint16_t *B, float beta, float *C, struct ts_error *err)
{
	uint64_t mk = (uint64_t)M * (uint64_t)K, kn = (uint64_t)K * (uint64_t)N;
	struct job a = {.run = run_gemm_lp,
	                .u.gemm = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha,
	                           .beta = beta, .C = C, .dt = lowp_dtype(dt), .A16 = A, .B16 = B}};
	struct cpu_ws *ws = NULL;

	if (mk + kn <= SIZE_MAX / sizeof(float))
		ws = ws_take(impl, q, (size_t)(mk + kn) * sizeof(float));
	if (!ws)
		return ts_error_oom(err, "%s: out of memory for the float32 workspace of a %s gemm "
		                    "(%llu elements)", ts_device_props(ts_queue_device(q))->id,
		                    ts_compute_name(dt), (unsigned long long)(mk + kn));
	a.u.gemm.ws = ws;
	a.u.gemm.A = (const float *)(const void *)ws->mem;
	a.u.gemm.B = (const float *)(const void *)ws->mem + mk;
	return job_post(impl, q, &a, err);
}

static ts_status cpu_act_fwd(void *impl, struct ts_queue *q, enum ts_act act, const float *in,
                             float *out, uint64_t n, struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_act_fwd,
	                                       .u.act = {.act = act, .in = in, .out = out, .n = n}},
	                err);
}

static ts_status cpu_act_bwd(void *impl, struct ts_queue *q, enum ts_act act, const float *pre,
                             const float *grad_out, float *grad_in, uint64_t n,
                             struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_act_bwd,
	                                       .u.act = {.act = act, .in = pre, .grad = grad_out,
	                                                 .out = grad_in, .n = n}},
	                err);
}

static ts_status cpu_add(void *impl, struct ts_queue *q, const float *x, float *y, uint64_t n,
                         struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_add, .u.add = {.x = x, .y = y, .n = n}},
	                err);
}

static ts_status cpu_loss(void *impl, struct ts_queue *q, enum ts_loss loss, const float *out,
                          const float *target, float *loss_dev, float *grad, uint64_t n,
                          struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_loss,
	                                       .u.loss = {.loss = loss, .out = out, .target = target,
	                                                  .value = loss_dev, .grad = grad, .n = n}},
	                err);
}

static ts_status cpu_sumsq(void *impl, struct ts_queue *q, const float *x, uint64_t n,
                           float *acc, struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_sumsq,
	                                       .u.sumsq = {.x = x, .acc = acc, .n = n}},
	                err);
}

static ts_status cpu_update(void *impl, struct ts_queue *q, const struct ts_optimizer *opt,
                            int step, float *p, const float *g, float *mu, float *nu,
                            uint64_t n, const float *gnorm_sq_dev, struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_update,
	                                       .u.update = {.opt = *opt, .step = step, .p = p, .g = g,
	                                                    .mu = mu, .nu = nu, .n = n,
	                                                    .gnorm_sq = gnorm_sq_dev}},
	                err);
}

static ts_status cpu_fill(void *impl, struct ts_queue *q, float *x, float v, uint64_t n,
                         struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run_fill, .u.fill = {.x = x, .v = v, .n = n}},
	                err);
}

static ts_status cpu_tok(void *impl, job_fn run, struct ts_queue *q, const float *in, const void *ids,
                         int id_bytes, uint64_t rows, int vocab, int d, float *out, float *loss,
                         struct ts_error *err)
{
	return job_post(impl, q, &(struct job){.run = run,
	                                 .u.tok = {.in = in, .ids = ids, .id_bytes = id_bytes,
	                                           .rows = rows, .vocab = vocab, .d = d, .out = out,
	                                           .loss = loss}},
	                err);
}

static ts_status cpu_embed_fwd(void *impl, struct ts_queue *q, const float *table, int vocab,
                               int d, const void *ids, int id_bytes, uint64_t rows, float *out,
                               struct ts_error *err)
{
	return cpu_tok(impl, run_embed_fwd, q, table, ids, id_bytes, rows, vocab, d, out, NULL, err);
}

static ts_status cpu_embed_bwd(void *impl, struct ts_queue *q, const void *ids, int id_bytes,
                               uint64_t rows, int vocab, int d, const float *grad_out,
                               float *grad_table, struct ts_error *err)
{
	return cpu_tok(impl, run_embed_bwd, q, grad_out, ids, id_bytes, rows, vocab, d, grad_table, NULL,
	               err);
}

/* The closure carries the workspace of a row's terms (vocab doubles), taken
 * when enqueueing like the closure itself. */
static ts_status cpu_xent(void *impl, struct ts_queue *q, const float *logits,
                          const void *targets, int id_bytes, uint64_t rows, int vocab,
                          float *loss_dev, float *grad, struct ts_error *err)
{
	const struct job a = {.run = run_xent,
	                      .u.tok = {.in = logits, .ids = targets, .id_bytes = id_bytes,
	                                .rows = rows, .vocab = vocab, .d = 1, .out = grad,
	                                .loss = loss_dev}};
	void *ws = NULL;
	struct job *j = job_with_workspace(&a, (size_t)vocab * XENT_PIECES * sizeof(double), &ws);

	if (!j)
		return ts_error_oom(err, "%s: out of memory for the workspace of a cross-entropy "
		                    "(vocab %d)", ts_device_props(ts_queue_device(q))->id, vocab);
	j->u.tok.ws = ws;
	j->team = impl ? ((struct cpu_kernels *)impl)->team : NULL;
	return job_submit(q, j, err);
}

static ts_status cpu_ln_fwd(void *impl, struct ts_queue *q, const float *x, const float *g,
                            const float *b, uint64_t rows, int d, float eps, float *y,
                            float *stats, struct ts_error *err)
{
	const struct job a = {.run = run_ln_fwd,
	                      .u.tf = {.a = x, .b = g, .c = b, .y = y, .y2 = stats, .rows = rows,
	                               .n = d, .eps = eps}};

	return job_post(impl, q, &a, err);
}

static ts_status cpu_ln_bwd(void *impl, struct ts_queue *q, const float *x, const float *g,
                            const float *stats, const float *dy, uint64_t rows, int d,
                            float *dx, float *dg, float *db, struct ts_error *err)
{
	const struct job a = {.run = run_ln_bwd,
	                      .u.tf = {.a = x, .b = g, .c = stats, .d = dy, .y = dx, .y2 = dg,
	                               .y3 = db, .rows = rows, .n = d}};

	return job_post(impl, q, &a, err);
}

static ts_status cpu_add_rows(void *impl, struct ts_queue *q, const float *x, uint64_t period,
                              float *y, uint64_t rows, int n, struct ts_error *err)
{
	const struct job a = {.run = run_add_rows,
	                      .u.tf = {.a = x, .y = y, .rows = rows, .period = period, .n = n}};

	return job_post(impl, q, &a, err);
}

static ts_status cpu_sum_rows(void *impl, struct ts_queue *q, const float *dy, uint64_t rows,
                              int n, uint64_t period, float *out, struct ts_error *err)
{
	const struct job a = {.run = run_sum_rows,
	                      .u.tf = {.a = dy, .y = out, .rows = rows, .period = period, .n = n}};

	return job_post(impl, q, &a, err);
}

static ts_status cpu_heads(void *impl, struct ts_queue *q, bool to_heads, const float *in,
                           float *out, int B, int T, int P, int H, int hd, struct ts_error *err)
{
	const struct job a = {.run = run_heads,
	                      .u.tf = {.a = in, .y = out, .B = B, .T = T, .P = P, .H = H,
	                               .hd = hd, .to_heads = to_heads}};

	return job_post(impl, q, &a, err);
}

static ts_status cpu_gemm_batched(void *impl, struct ts_queue *q, bool ta, bool tb, int M, int N,
                                  int K, float alpha, const float *A, uint64_t sA,
                                  const float *B, uint64_t sB, float beta, float *C, uint64_t sC,
                                  int batch, struct ts_error *err)
{
	const struct job a = {.run = run_gemm_batched,
	                      .u.gemm = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K,
	                                 .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C,
	                                 .sA = sA, .sB = sB, .sC = sC, .batch = batch}};

	return job_post(impl, q, &a, err);
}

/* One product's float32 workspace, the queue's warm one (ws_take) as
 * gemm_lp's: the batches widen into it in turn. */
static ts_status cpu_gemm_batched_lp(void *impl, struct ts_queue *q, enum ts_compute dt,
                                     bool ta, bool tb, int M, int N, int K, float alpha,
                                     const uint16_t *A, uint64_t sA, const uint16_t *B,
                                     uint64_t sB, float beta, float *C, uint64_t sC, int batch,
                                     struct ts_error *err)
{
	uint64_t mk = (uint64_t)M * (uint64_t)K, kn = (uint64_t)K * (uint64_t)N;
	struct job a = {.run = run_gemm_batched_lp,
	                .u.gemm = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha,
	                           .beta = beta, .C = C, .dt = lowp_dtype(dt), .A16 = A, .B16 = B,
	                           .sA = sA, .sB = sB, .sC = sC, .batch = batch}};
	struct cpu_ws *ws = NULL;

	if (mk + kn <= SIZE_MAX / sizeof(float))
		ws = ws_take(impl, q, (size_t)(mk + kn) * sizeof(float));
	if (!ws)
		return ts_error_oom(err, "%s: out of memory for the float32 workspace of a batched "
		                    "%s gemm (%llu elements)", ts_device_props(ts_queue_device(q))->id,
		                    ts_compute_name(dt), (unsigned long long)(mk + kn));
	a.u.gemm.ws = ws;
	a.u.gemm.A = (const float *)(const void *)ws->mem;
	a.u.gemm.B = (const float *)(const void *)ws->mem + mk;
	return job_post(impl, q, &a, err);
}

static ts_status cpu_softmax_fwd(void *impl, struct ts_queue *q, const float *S, int batch,
                                 int T, float scale, float *P, struct ts_error *err)
{
	const struct job a = {.run = run_softmax_fwd,
	                      .u.tf = {.a = S, .y = P, .rows = (uint64_t)batch * (uint64_t)T,
	                               .n = T, .scale = scale}};

	return job_post(impl, q, &a, err);
}

static ts_status cpu_softmax_bwd(void *impl, struct ts_queue *q, const float *P, const float *dP,
                                 int batch, int T, float scale, float *dS, struct ts_error *err)
{
	const struct job a = {.run = run_softmax_bwd,
	                      .u.tf = {.a = P, .b = dP, .y = dS,
	                               .rows = (uint64_t)batch * (uint64_t)T, .n = T,
	                               .scale = scale}};

	return job_post(impl, q, &a, err);
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
	.embed_fwd = cpu_embed_fwd,
	.embed_bwd = cpu_embed_bwd,
	.xent = cpu_xent,
	.ln_fwd = cpu_ln_fwd,
	.ln_bwd = cpu_ln_bwd,
	.add_rows = cpu_add_rows,
	.sum_rows = cpu_sum_rows,
	.heads = cpu_heads,
	.gemm_batched = cpu_gemm_batched,
	.softmax_fwd = cpu_softmax_fwd,
	.softmax_bwd = cpu_softmax_bwd,
	.round = cpu_round,
	.gemm_lp = cpu_gemm_lp,
	.gemm_batched_lp = cpu_gemm_batched_lp,
};

const struct ts__kernel_ops *ts__kernels_cpu_ops(void)
{
	return &cpu_ops;
}
