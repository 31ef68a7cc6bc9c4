/*
 * test_kernels.c - the training kernels against float64 references: gemm in
 * every transpose combination against a naive triple loop, activations and
 * their derivatives against central finite differences, the losses, sums of
 * squares, SGD and Adam (with and without global-norm clipping) against
 * optax's formulas, a whole tiny MLP's gradients against finite differences
 * of its loss, bit-for-bit determinism, queue order, and argument checks;
 * mixed precision: rounding to bfloat16 / float16 bit for bit as
 * formats/convert.h, and gemm_lp against float64 of the rounded operands.
 *
 * Every case runs on sim:0 (the CPU kernels); with TS_TEST_BACKEND=cuda the
 * backend-independent ones run again on cuda:0 (cuBLAS and the CUDA
 * kernels), and every CUDA kernel is compared with the CPU kernel on the
 * same inputs: reductions bit for bit, the rest to a few ulp. Operands live
 * in device memory, filled and read back with queue copies, so the same
 * code drives both. The row-major to column-major gemm mapping is checked
 * on its own against cblas_sgemm(CblasColMajor) for every transpose and the
 * plan's six gemms.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "formats/convert.h"
#include "tests/unit/unit.h"
#include "train/kernels.h"
#include "train/kernels_math.h"

static struct ts_device_set *set;
static struct ts_device *dev;
static struct ts_kernels *kern;
static struct ts_queue *q;
static struct ts_error err;

/* Device buffers of the running case, freed by dfree_all or teardown. */
#define MAX_BUFS 512
static struct {
	void *p;
	size_t size;
} bufs[MAX_BUFS];
static int nbufs;

#define OK(call) TS_UNIT_OK(err, call)

#define REFUSED(call)                                                                  \
	do {                                                                           \
		ts_error_clear(&err);                                                  \
		ck_assert_int_eq((call), TS_INVALID_ARGUMENT);                         \
		ck_assert_int_eq(err.status, TS_INVALID_ARGUMENT);                     \
		ts_error_clear(&err);                                                  \
	} while (0)

static void setup_on(const struct ts_device_config *dc, const char *id)
{
	ts_error_clear(&err);
	nbufs = 0;
	OK(ts_device_set_new(dc, &set, &err));
	dev = ts_device_set_find(set, id);
	ck_assert_msg(dev != NULL, "no device %s", id);
	OK(ts_kernels_new(dev, &kern, &err));
	OK(ts_queue_new(dev, &q, &err));
}

static void setup_sim(void)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 64ull << 20,
	                              .cuda = false, .host = "t"};

	setup_on(&dc, "sim:0");
}

static void setup_cuda(void)
{
	struct ts_device_config dc = {.sim_devices = 0, .cuda = true, .host = "t"};

	setup_on(&dc, "cuda:0");
}

static void dfree_all(void)
{
	if (q)
		ts_queue_sync(q, NULL);
	for (int i = 0; i < nbufs; i++)
		ts_device_mem_free(dev, TS_MEM_DEVICE, bufs[i].p, bufs[i].size);
	nbufs = 0;
}

static void teardown(void)
{
	dfree_all();
	ts_queue_free(q);
	q = NULL;
	ts_kernels_free(kern);
	ts_device_set_free(set);
}

/* ---- device buffers --------------------------------------------------------- */

static float *dalloc(size_t n)
{
	void *p = NULL;

	ck_assert_int_lt(nbufs, MAX_BUFS);
	OK(ts_device_mem_alloc(dev, TS_MEM_DEVICE, (n ? n : 1) * sizeof(float), &p, &err));
	bufs[nbufs].p = p;
	bufs[nbufs].size = (n ? n : 1) * sizeof(float);
	nbufs++;
	return p;
}

/* A device copy of h[0..n) (h may go once this returns). */
static float *dput(const float *h, size_t n)
{
	float *d = dalloc(n);

	OK(ts_queue_copy(q, d, h, n * sizeof(float), TS_COPY_H2D, &err));
	OK(ts_queue_sync(q, &err));
	return d;
}

/* Waits for the queue, then reads d[0..n) into h. */
static void dget(float *h, const float *d, size_t n)
{
	OK(ts_queue_copy(q, h, d, n * sizeof(float), TS_COPY_D2H, &err));
	OK(ts_queue_sync(q, &err));
}

static float dget1(const float *d)
{
	float v;

	dget(&v, d, 1);
	return v;
}

static void dcopy(float *dst, const float *src, size_t n)
{
	OK(ts_queue_copy(q, dst, src, n * sizeof(float), TS_COPY_D2D, &err));
}

/* ---- references ------------------------------------------------------------- */

/* Deterministic uniform numbers in [lo, hi). */
static float rnd(unsigned *s, float lo, float hi)
{
	*s = *s * 1664525u + 1013904223u;
	return lo + (hi - lo) * (float)((*s >> 8) & 0xffffff) / 16777216.0f;
}

static void fill_rnd(float *x, size_t n, unsigned seed, float lo, float hi)
{
	for (size_t i = 0; i < n; i++)
		x[i] = rnd(&seed, lo, hi);
}

static double act_ref(enum ts_act act, double x)
{
	switch (act) {
	case TS_ACT_RELU:
		return x > 0 ? x : 0;
	case TS_ACT_GELU:
		return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
	case TS_ACT_TANH:
		return tanh(x);
	case TS_ACT_NONE:
	default:
		return x;
	}
}

/* Central finite difference of act_ref at x. */
static double act_fd(enum ts_act act, double x)
{
	const double h = 1e-6;

	return (act_ref(act, x + h) - act_ref(act, x - h)) / (2 * h);
}

/* |got - ref| <= rtol * (|ref| + floor). */
static void check_close(double got, double ref, double rtol, double floor, const char *what,
                        size_t i)
{
	ck_assert_msg(fabs(got - ref) <= rtol * (fabs(ref) + floor),
	              "%s[%zu]: got %.9g, want %.9g (diff %.3g)", what, i, got, ref,
	              fabs(got - ref));
}

static double max_abs(const double *x, size_t n)
{
	double m = 0;

	for (size_t i = 0; i < n; i++)
		m = fmax(m, fabs(x[i]));
	return m;
}

static const enum ts_act all_acts[] = {TS_ACT_NONE, TS_ACT_RELU, TS_ACT_GELU, TS_ACT_TANH};

/* ---- names --------------------------------------------------------------------- */

START_TEST(test_names_round_trip)
{
	enum ts_act a;
	enum ts_loss l;
	enum ts_opt o;

	for (int i = 0; i < 4; i++) {
		ck_assert(ts_act_parse(ts_act_name(all_acts[i]), &a));
		ck_assert_int_eq(a, all_acts[i]);
	}
	ck_assert_str_eq(ts_act_name(TS_ACT_GELU), "gelu");
	ck_assert_str_eq(ts_loss_name(TS_LOSS_MSE), "mse");
	ck_assert_str_eq(ts_opt_name(TS_OPT_ADAM), "adam");
	ck_assert(ts_loss_parse("sum", &l) && l == TS_LOSS_SUM);
	ck_assert(ts_loss_parse("mse", &l) && l == TS_LOSS_MSE);
	ck_assert(ts_opt_parse("none", &o) && o == TS_OPT_NONE);
	ck_assert(ts_opt_parse("sgd", &o) && o == TS_OPT_SGD);
	ck_assert(ts_opt_parse("adam", NULL));
	ck_assert(!ts_act_parse("Relu", &a));
	ck_assert(!ts_act_parse("", &a));
	ck_assert(!ts_act_parse(NULL, &a));
	ck_assert(!ts_loss_parse("l2", &l));
	ck_assert(!ts_opt_parse("adamw", &o));
	ck_assert_str_eq(ts_act_name((enum ts_act)42), "unknown");
	ck_assert_str_eq(ts_loss_name((enum ts_loss)-1), "unknown");
}
END_TEST

/* ---- gemm ---------------------------------------------------------------------- */

/* One gemm against the naive loop, with an error bound scaled by the sum of
 * the magnitudes that went into each element. */
static void gemm_case(bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                      unsigned seed)
{
	size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
	float *A = malloc(na * sizeof *A + 1), *B = malloc(nb * sizeof *B + 1);
	float *C0 = malloc(nc * sizeof *C0), *C = malloc(nc * sizeof *C);
	float *dA, *dB, *dC;

	fill_rnd(A, na, seed, -1, 1);
	fill_rnd(B, nb, seed + 1, -1, 1);
	fill_rnd(C0, nc, seed + 2, -1, 1);
	if (beta == 0.0f)
		for (size_t i = 0; i < nc; i++)
			C0[i] = NAN;    /* beta == 0: what C held is ignored */
	dA = dput(A, na);
	dB = dput(B, nb);
	dC = dput(C0, nc);
	OK(ts_k_gemm(kern, q, ta, tb, M, N, K, alpha, dA, dB, beta, dC, &err));
	dget(C, dC, nc);
	for (int i = 0; i < M; i++) {
		for (int j = 0; j < N; j++) {
			double s = 0, mag = 0, ref;

			for (int k = 0; k < K; k++) {
				double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
				double b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];

				s += a * b;
				mag += fabs(a * b);
			}
			ref = alpha * s;
			mag = fabs(alpha) * mag;
			if (beta != 0.0f) {
				ref += beta * (double)C0[(size_t)i * N + j];
				mag += fabs(beta * (double)C0[(size_t)i * N + j]);
			}
			ck_assert_msg(fabs(C[(size_t)i * N + j] - ref) <= 1e-5 * (mag + 1e-30),
			              "gemm ta=%d tb=%d %dx%dx%d: C[%d,%d] = %.9g, want %.9g", ta,
			              tb, M, N, K, i, j, C[(size_t)i * N + j], ref);
		}
	}
	free(A);
	free(B);
	free(C0);
	free(C);
	dfree_all();
}

/* ---- the column-major gemm mapping --------------------------------------------- */

/* Row-major C = alpha op(A) op(B) + beta C through ts_m_gemm_colmajor and
 * cblas_sgemm(CblasColMajor), against the naive loop. */
static void colmajor_case(bool ta, bool tb, int M, int N, int K, float alpha, float beta,
                          unsigned seed)
{
	size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
	float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B);
	float *C = malloc(nc * sizeof *C), *C0 = malloc(nc * sizeof *C0);
	struct ts_m_colmajor_gemm g = ts_m_gemm_colmajor(ta, tb, M, N, K);

	ck_assert(g.a_is_B);
	ck_assert_int_eq(g.m, N);
	ck_assert_int_eq(g.n, M);
	ck_assert_int_eq(g.k, K);
	fill_rnd(A, na, seed, -1, 1);
	fill_rnd(B, nb, seed + 1, -1, 1);
	fill_rnd(C0, nc, seed + 2, -1, 1);
	memcpy(C, C0, nc * sizeof *C);
	cblas_sgemm(CblasColMajor, g.transa ? CblasTrans : CblasNoTrans,
	            g.transb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, alpha, B, g.lda, A,
	            g.ldb, beta, C, g.ldc);
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double sum = 0, mag = 0, ref;

			for (int k = 0; k < K; k++) {
				double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
				double b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];

				sum += a * b;
				mag += fabs(a * b);
			}
			ref = alpha * sum + beta * (double)C0[(size_t)i * N + j];
			mag = fabs(alpha) * mag + fabs(beta * (double)C0[(size_t)i * N + j]);
			ck_assert_msg(fabs(C[(size_t)i * N + j] - ref) <= 1e-5 * (mag + 1e-30),
			              "colmajor ta=%d tb=%d %dx%dx%d: C[%d,%d] = %.9g, want %.9g", ta,
			              tb, M, N, K, i, j, C[(size_t)i * N + j], ref);
		}
	free(A);
	free(B);
	free(C);
	free(C0);
}

START_TEST(test_gemm_colmajor_mapping)
{
	enum { B_ = 6, H = 10, D = 7 };
	/* the plan's six: h = x w1, y = a w2, G2 = A^T g, A = g w2^T,
	 * G1 = x^T A, gx = A w1^T (ta, tb, M, N, K) */
	static const int plan6[6][5] = {{0, 0, B_, H, D}, {0, 0, B_, D, H}, {1, 0, H, D, B_},
	                                {0, 1, B_, H, D}, {1, 0, D, H, B_}, {0, 1, B_, D, H}};
	static const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 65}, {2, 130, 9}};

	for (int t = 0; t < 4; t++)
		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
			colmajor_case(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f,
			              0.0f, (unsigned)(t * 7 + s));
			colmajor_case(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], -0.75f,
			              0.5f, (unsigned)(t * 7 + s + 50));
		}
	for (int i = 0; i < 6; i++)
		colmajor_case(plan6[i][0], plan6[i][1], plan6[i][2], plan6[i][3], plan6[i][4], 1.0f,
		              i % 2 ? 1.0f : 0.0f, (unsigned)(200 + i));
}
END_TEST

START_TEST(test_gemm_all_transposes)
{
	static const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {3, 4, 2}, {33, 17, 65},
	                                {64, 48, 128}, {2, 130, 9}};

	for (int t = 0; t < 4; t++) {
		bool ta = t & 1, tb = t & 2;

		for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
			gemm_case(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 1.0f, 0.0f,
			          (unsigned)(t * 10 + s));
			gemm_case(ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 1.25f, 0.5f,
			          (unsigned)(t * 10 + s + 100));
		}
	}
}
END_TEST

START_TEST(test_gemm_empty_sizes)
{
	float C0[6] = {1, 2, 3, 4, 5, 6}, C[6];
	float *dC = dput(C0, 6);

	/* K == 0: C = beta * C */
	OK(ts_k_gemm(kern, q, false, false, 2, 3, 0, 1.0f, NULL, NULL, 0.5f, dC, &err));
	dget(C, dC, 6);
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(C[i], 0.5f * C0[i]);
	OK(ts_k_gemm(kern, q, true, true, 2, 3, 0, 1.0f, NULL, NULL, 0.0f, dC, &err));
	dget(C, dC, 6);
	for (int i = 0; i < 6; i++)
		ck_assert_float_eq(C[i], 0.0f);
	/* M or N == 0: nothing at all, NULL operands included */
	OK(ts_k_gemm(kern, q, false, false, 0, 3, 4, 1.0f, NULL, NULL, 0.0f, NULL, &err));
	OK(ts_k_gemm(kern, q, false, false, 3, 0, 4, 1.0f, NULL, NULL, 0.0f, NULL, &err));
	OK(ts_queue_sync(q, &err));
}
END_TEST

/* ---- activations ---------------------------------------------------------------- */

#define NX 64

/* Points over [-6, 6], none within 1e-3 of relu's kink. */
static void act_points(float *x)
{
	static const float fixed[] = {-20, -9, -6, -4, -1, -0.5f, 0.25f, 1, 3, 4, 9, 20};
	unsigned s = 7;

	for (int i = 0; i < NX; i++) {
		float v = i < 12 ? fixed[i] : rnd(&s, -6, 6);

		if (fabsf(v) < 1e-3f)
			v = 0.5f;
		x[i] = v;
	}
}

START_TEST(test_activations_forward)
{
	float x[NX], y[NX];
	float *dx, *dy;

	act_points(x);
	dx = dput(x, NX);
	dy = dalloc(NX);
	for (int a = 0; a < 4; a++) {
		OK(ts_k_act_fwd(kern, q, all_acts[a], dx, dy, NX, &err));
		dget(y, dy, NX);
		for (int i = 0; i < NX; i++)
			check_close(y[i], act_ref(all_acts[a], x[i]), 1e-5, 0.1 * (1 + fabs(x[i])),
			            ts_act_name(all_acts[a]), (size_t)i);
	}
	/* in place */
	OK(ts_k_act_fwd(kern, q, TS_ACT_TANH, dx, dx, NX, &err));
	dget(y, dx, NX);
	for (int i = 0; i < NX; i++)
		check_close(y[i], tanh(x[i]), 1e-5, 0.1, "tanh in place", (size_t)i);
	/* relu at zero, and gelu's exact value at a point */
	x[0] = 0.0f;
	x[1] = 1.0f;
	dx = dput(x, 2);
	OK(ts_k_act_fwd(kern, q, TS_ACT_RELU, dx, dy, 2, &err));
	dget(y, dy, 2);
	ck_assert_float_eq(y[0], 0.0f);
	ck_assert_float_eq(y[1], 1.0f);
	OK(ts_k_act_fwd(kern, q, TS_ACT_GELU, dx + 1, dy, 1, &err));
	ck_assert_double_eq_tol(dget1(dy), 0.8411919906082768, 1e-6);
}
END_TEST

START_TEST(test_activations_backward)
{
	float x[NX], go[NX], gi[NX];
	float *dx, *dgo, *dgi;

	act_points(x);
	fill_rnd(go, NX, 11, -2, 2);
	dx = dput(x, NX);
	dgo = dput(go, NX);
	dgi = dalloc(NX);
	for (int a = 0; a < 4; a++) {
		enum ts_act act = all_acts[a];

		OK(ts_k_act_bwd(kern, q, act, dx, dgo, dgi, NX, &err));
		dget(gi, dgi, NX);
		for (int i = 0; i < NX; i++)
			check_close(gi[i], go[i] * act_fd(act, x[i]), 1e-5,
			            fabs(go[i]) * (1 + fabs(x[i])) * 0.1, ts_act_name(act),
			            (size_t)i);
	}
	/* in place (grad_in == grad_out) */
	OK(ts_k_act_bwd(kern, q, TS_ACT_GELU, dx, dgo, dgo, NX, &err));
	dget(gi, dgo, NX);
	for (int i = 0; i < NX; i++)
		check_close(gi[i], go[i] * act_fd(TS_ACT_GELU, x[i]), 1e-5,
		            fabs(go[i]) * (1 + fabs(x[i])) * 0.1, "gelu in place", (size_t)i);
	/* jax.nn.relu's derivative at 0 is 0 */
	x[0] = 0.0f;
	go[0] = 3.0f;
	dx = dput(x, 1);
	dgo = dput(go, 1);
	OK(ts_k_act_bwd(kern, q, TS_ACT_RELU, dx, dgo, dgi, 1, &err));
	ck_assert_float_eq(dget1(dgi), 0.0f);
}
END_TEST

/* ---- loss, sumsq, add, fill -------------------------------------------------------- */

START_TEST(test_loss_sum_and_mse)
{
	enum { N = 37 };
	float out[N], target[N], grad[N];
	float *dout, *dtarget, *dgrad, *dloss;
	double sum = 0, sq = 0;

	fill_rnd(out, N, 3, -2, 2);
	fill_rnd(target, N, 4, -2, 2);
	dout = dput(out, N);
	dtarget = dput(target, N);
	dgrad = dalloc(N);
	dloss = dalloc(1);
	for (int i = 0; i < N; i++) {
		sum += out[i];
		sq += ((double)out[i] - target[i]) * ((double)out[i] - target[i]);
	}

	OK(ts_k_loss(kern, q, TS_LOSS_SUM, dout, NULL, dloss, dgrad, N, &err));
	check_close(dget1(dloss), sum, 1e-6, 1.0, "sum loss", 0);
	dget(grad, dgrad, N);
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(grad[i], 1.0f);

	OK(ts_k_loss(kern, q, TS_LOSS_MSE, dout, dtarget, dloss, dgrad, N, &err));
	check_close(dget1(dloss), sq / N, 1e-6, 0, "mse loss", 0);
	dget(grad, dgrad, N);
	for (int i = 0; i < N; i++)
		check_close(grad[i], 2 * ((double)out[i] - target[i]) / N, 1e-6, 1e-3, "mse grad",
		            (size_t)i);
	/* the loss is written, not accumulated */
	OK(ts_k_loss(kern, q, TS_LOSS_MSE, dout, dtarget, dloss, dgrad, N, &err));
	check_close(dget1(dloss), sq / N, 1e-6, 0, "mse loss again", 0);
}
END_TEST

START_TEST(test_sumsq_accumulates)
{
	enum { N = 1000 };
	float x[N], y[N], acc0 = 1.5f;
	float *dx, *dy, *dacc;
	double want = acc0;

	fill_rnd(x, N, 5, -1, 1);
	fill_rnd(y, N, 6, -3, 3);
	for (int i = 0; i < N; i++)
		want += (double)x[i] * x[i] + (double)y[i] * y[i];
	dx = dput(x, N);
	dy = dput(y, N);
	dacc = dput(&acc0, 1);
	OK(ts_k_sumsq(kern, q, dx, N, dacc, &err));
	OK(ts_k_sumsq(kern, q, dy, N, dacc, &err));
	OK(ts_k_sumsq(kern, q, NULL, 0, dacc, &err));   /* empty: no change */
	check_close(dget1(dacc), want, 1e-6, 0, "sumsq", 0);
}
END_TEST

START_TEST(test_add_and_fill)
{
	enum { N = 3001 };
	float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *got = malloc(N * sizeof *got);
	float *dx, *dy;

	fill_rnd(y, N, 9, -5, 5);
	dx = dalloc(N);
	dy = dput(y, N);
	OK(ts_k_fill(kern, q, dx, 0.375f, N, &err));
	dget(x, dx, N);
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(x[i], 0.375f);
	OK(ts_k_add(kern, q, dx, dy, N, &err));
	OK(ts_k_add(kern, q, dx, dy, N - 1, &err));
	dget(got, dy, N);
	for (int i = 0; i < N; i++) {
		float want = y[i] + 0.375f;

		if (i < N - 1)
			want += 0.375f;
		ck_assert_float_eq(got[i], want);
	}
	OK(ts_k_fill(kern, q, dx, -1.0f, 0, &err));    /* empty: no change */
	ck_assert_float_eq(dget1(dx), 0.375f);
	free(x);
	free(y);
	free(got);
}
END_TEST

/* ---- optimizers -------------------------------------------------------------------- */

enum { NP1 = 40, NP2 = 23, STEPS = 3 };

/* The float64 model of optax's chain(clip_by_global_norm(c), adam) or sgd
 * over two tensors sharing one global norm. */
struct opt_ref {
	double p[NP1 + NP2], mu[NP1 + NP2], nu[NP1 + NP2];
};

/* optax's learning rate after count updates, in float64. */
static double ref_learning_rate(const struct ts_optimizer *o, int count)
{
	const struct ts_schedule *s = &o->schedule;
	double warm = s->warmup_steps, span = s->decay_steps - s->warmup_steps, c;

	if (s->type != TS_SCHED_WARMUP_COSINE)
		return o->learning_rate;
	if (count < s->warmup_steps)
		return s->init_value + (s->peak_value - s->init_value) * (count / warm);
	c = fmin(count - warm, span);
	return s->end_value + (s->peak_value - s->end_value) * 0.5 * (1 + cos(M_PI * c / span));
}

static void opt_ref_step(struct opt_ref *r, const struct ts_optimizer *o, int t, const float *g)
{
	double gsq = 0, norm, scale_num = 1, scale_den = 1;
	double b1 = o->b1, b2 = o->b2, eps = o->eps, c = o->clip_global_norm;
	double lr = ref_learning_rate(o, t - 1), wd = o->adamw ? o->weight_decay : 0;

	for (int i = 0; i < NP1 + NP2; i++)
		gsq += (double)g[i] * g[i];
	norm = sqrt(gsq);
	if (c > 0 && !(norm < c)) {
		scale_num = c;
		scale_den = norm;
	}
	for (int i = 0; i < NP1 + NP2; i++) {
		double gi = g[i] / scale_den * scale_num;

		if (o->type == TS_OPT_SGD) {
			r->p[i] -= lr * gi;
			continue;
		}
		r->mu[i] = (1 - b1) * gi + b1 * r->mu[i];
		r->nu[i] = (1 - b2) * gi * gi + b2 * r->nu[i];
		r->p[i] -= lr * ((r->mu[i] / (1 - pow(b1, t))) / (sqrt(r->nu[i] / (1 - pow(b2, t))) + eps) +
		                 wd * r->p[i]);
	}
}

/* Runs STEPS updates of two tensors on the kernels and on the reference;
 * compares parameters and moments after each step. */
static void optimizer_case(const struct ts_optimizer *o, unsigned seed)
{
	float p[NP1 + NP2], g[STEPS][NP1 + NP2], got[NP1 + NP2], zero[NP1 + NP2] = {0};
	struct opt_ref r;
	float *dp, *dmu, *dnu, *dg[STEPS], *dgsq;

	fill_rnd(p, NP1 + NP2, seed, -1, 1);
	for (int t = 0; t < STEPS; t++) {
		unsigned s = seed + 17 * (t + 1);

		for (int i = 0; i < NP1 + NP2; i++) {
			float m = rnd(&s, 0.1f, 1.5f);

			g[t][i] = rnd(&s, 0, 1) < 0.5f ? -m : m;
		}
	}
	for (int i = 0; i < NP1 + NP2; i++) {
		r.p[i] = p[i];
		r.mu[i] = r.nu[i] = 0;
	}
	dp = dput(p, NP1 + NP2);
	dmu = dput(zero, NP1 + NP2);
	dnu = dput(zero, NP1 + NP2);
	dgsq = dalloc(1);
	for (int t = 0; t < STEPS; t++)
		dg[t] = dput(g[t], NP1 + NP2);

	for (int t = 1; t <= STEPS; t++) {
		float *gg = dg[t - 1];

		/* the global norm over both tensors, then each tensor's update */
		OK(ts_k_fill(kern, q, dgsq, 0.0f, 1, &err));
		OK(ts_k_sumsq(kern, q, gg, NP1, dgsq, &err));
		OK(ts_k_sumsq(kern, q, gg + NP1, NP2, dgsq, &err));
		OK(ts_k_update(kern, q, o, t, dp, gg, dmu, dnu, NP1, dgsq, &err));
		OK(ts_k_update(kern, q, o, t, dp + NP1, gg + NP1, dmu + NP1, dnu + NP1, NP2, dgsq,
		               &err));
		opt_ref_step(&r, o, t, g[t - 1]);

		dget(got, dp, NP1 + NP2);
		for (int i = 0; i < NP1 + NP2; i++)
			check_close(got[i], r.p[i], 1e-6, 1e-1, "p", (size_t)i);
		if (o->type != TS_OPT_ADAM)
			continue;
		dget(got, dmu, NP1 + NP2);
		for (int i = 0; i < NP1 + NP2; i++)
			/* mu sums terms of both signs: relative to their scale */
			check_close(got[i], r.mu[i], 1e-6, max_abs(r.mu, NP1 + NP2), "mu",
			            (size_t)i);
		dget(got, dnu, NP1 + NP2);
		for (int i = 0; i < NP1 + NP2; i++)
			check_close(got[i], r.nu[i], 1e-6, 0, "nu", (size_t)i);
	}
	dfree_all();
}

START_TEST(test_sgd_updates)
{
	struct ts_optimizer o = {.type = TS_OPT_SGD, .learning_rate = 0.05f};

	optimizer_case(&o, 21);
	o.clip_global_norm = 0.75f;     /* clips: the norm is about 6 */
	optimizer_case(&o, 22);
}
END_TEST

START_TEST(test_adam_without_clipping)
{
	struct ts_optimizer o = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                         .b2 = 0.999f, .eps = 1e-8f};

	optimizer_case(&o, 31);
	o.learning_rate = 0.3f;
	o.b1 = 0.5f;
	o.b2 = 0.75f;
	o.eps = 1e-3f;
	optimizer_case(&o, 32);
	/* a bound above the norm changes nothing */
	o.clip_global_norm = 1e3f;
	optimizer_case(&o, 33);
}
END_TEST

START_TEST(test_adam_with_clipping)
{
	struct ts_optimizer o = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                         .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 1.0f};

	optimizer_case(&o, 41);
	o.clip_global_norm = 0.05f;
	o.eps = 1e-2f;      /* clipped gradients are small: eps shows */
	optimizer_case(&o, 42);
}
END_TEST

/* AdamW: the decay of every parameter, decoupled from the moments. */
START_TEST(test_adamw_updates)
{
	struct ts_optimizer o = {.type = TS_OPT_ADAM, .adamw = true, .weight_decay = 0.1f,
	                         .learning_rate = 1e-2f, .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f};

	optimizer_case(&o, 51);
	o.clip_global_norm = 1.0f;
	o.weight_decay = 0.5f;
	optimizer_case(&o, 52);
	o.weight_decay = 0.0f;      /* no decay: Adam's update */
	optimizer_case(&o, 53);
}
END_TEST

/* optax's warmup_cosine_decay_schedule: init at count 0, the peak at the
 * end of the warmup, end_value from decay_steps on, float64's curve in
 * between; and the updates of SGD and AdamW follow it. */
START_TEST(test_warmup_cosine_schedule)
{
	struct ts_optimizer o = {.type = TS_OPT_SGD, .learning_rate = 0.05f,
	                         .schedule = {TS_SCHED_WARMUP_COSINE, 0.001f, 0.05f, 0.005f, 4, 20}};

	/* float32 as optax: (init - peak) * 1 + peak is init within rounding */
	check_close(ts_m_learning_rate(&o, 0), 0.001, 1e-6, 0.05, "lr at 0", 0);
	check_close(ts_m_learning_rate(&o, 4), 0.05, 1e-6, 0, "lr at the peak", 4);
	for (int c = 0; c <= 30; c++)
		check_close(ts_m_learning_rate(&o, c), ref_learning_rate(&o, c), 1e-6, 0.05, "lr",
		            (size_t)c);
	ck_assert_float_eq(ts_m_learning_rate(&o, 20), ts_m_learning_rate(&o, 25));
	ck_assert(fabsf(ts_m_learning_rate(&o, 20) - 0.005f) < 1e-9f);
	ck_assert(ts_m_learning_rate(&o, 2) < ts_m_learning_rate(&o, 3));
	ck_assert(ts_m_learning_rate(&o, 10) > ts_m_learning_rate(&o, 11));
	/* a constant schedule is the learning rate */
	o.schedule.type = TS_SCHED_CONSTANT;
	ck_assert_float_eq(ts_m_learning_rate(&o, 7), 0.05f);
	/* the kernels step along it: warmup over counts 0, 1; cosine at 2 */
	o.schedule = (struct ts_schedule){TS_SCHED_WARMUP_COSINE, 0.01f, 0.2f, 0.0f, 2, 4};
	optimizer_case(&o, 61);
	o = (struct ts_optimizer){.type = TS_OPT_ADAM, .adamw = true, .weight_decay = 0.1f,
	                          .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 1.0f,
	                          .learning_rate = 0.02f,
	                          .schedule = {TS_SCHED_WARMUP_COSINE, 0.0f, 0.02f, 0.001f, 1, 3}};
	optimizer_case(&o, 62);
}
END_TEST

/* ---- a whole MLP --------------------------------------------------------------------- */

enum { MB = 3, MD = 4, MH = 3, ML = 2 };

struct mlp_case {
	struct ts_mlp m;
	float x0[MB * MD], target[MB * MD];
	float w1[ML * MD * MD], w2[ML * MD * MD];      /* room for h <= d */
};

static void mlp_case_init(struct mlp_case *c, enum ts_act act, bool residual, enum ts_loss loss,
                          int d_hidden, unsigned seed)
{
	int h;

	memset(c, 0, sizeof *c);
	c->m.layers = ML;
	c->m.d_model = MD;
	c->m.d_hidden = d_hidden;
	c->m.act = act;
	c->m.residual = residual;
	c->m.loss = loss;
	h = ts_mlp_hidden(&c->m);
	fill_rnd(c->x0, MB * MD, seed, -1, 1);
	fill_rnd(c->target, MB * MD, seed + 1, -1, 1);
	fill_rnd(c->w1, (size_t)ML * MD * h, seed + 2, -0.9f, 0.9f);
	fill_rnd(c->w2, (size_t)ML * h * MD, seed + 3, -0.9f, 0.9f);
}

/* The loss of the model in float64, for weights w1, w2 (doubles). */
static double mlp_loss_ref(const struct mlp_case *c, const double *w1, const double *w2)
{
	int d = MD, h = ts_mlp_hidden(&c->m);
	double x[MB * MD], hid[MB * MD], y[MB * MD], loss = 0;

	for (int i = 0; i < MB * d; i++)
		x[i] = c->x0[i];
	for (int l = 0; l < ML; l++) {
		const double *a = w1 + (size_t)l * d * h, *b = w2 + (size_t)l * h * d;

		for (int r = 0; r < MB; r++)
			for (int j = 0; j < h; j++) {
				double s = 0;

				for (int k = 0; k < d; k++)
					s += x[r * d + k] * a[k * h + j];
				hid[r * h + j] = act_ref(c->m.act, s);
			}
		for (int r = 0; r < MB; r++)
			for (int j = 0; j < d; j++) {
				double s = 0;

				if (ts_mlp_has_w2(&c->m))
					for (int k = 0; k < h; k++)
						s += hid[r * h + k] * b[k * d + j];
				else
					s = hid[r * h + j];
				y[r * d + j] = s;
			}
		for (int i = 0; i < MB * d; i++)
			x[i] = c->m.residual ? x[i] + y[i] : y[i];
	}
	for (int i = 0; i < MB * d; i++) {
		if (c->m.loss == TS_LOSS_SUM)
			loss += x[i];
		else
			loss += (x[i] - c->target[i]) * (x[i] - c->target[i]);
	}
	return c->m.loss == TS_LOSS_SUM ? loss : loss / (MB * d);
}

/* Device state of one forward and backward pass. */
struct mlp_dev {
	float *x0, *target, *w1, *w2;
	float *xs;          /* [L+1, B, d]: layer inputs, then the output */
	float *hs, *as;     /* [L, B, h]: pre-activations and activations */
	float *dx, *dx2;    /* [B, d] */
	float *da, *dh;     /* [B, h] */
	float *dw1, *dw2;
	float *loss;
};

static void mlp_dev_init(struct mlp_dev *md, const struct mlp_case *c)
{
	int d = MD, h = ts_mlp_hidden(&c->m);

	md->x0 = dput(c->x0, MB * d);
	md->target = dput(c->target, MB * d);
	md->w1 = dput(c->w1, (size_t)ML * d * h);
	md->w2 = dput(c->w2, (size_t)ML * h * d);
	md->xs = dalloc((size_t)(ML + 1) * MB * d);
	md->hs = dalloc((size_t)ML * MB * h);
	md->as = dalloc((size_t)ML * MB * h);
	md->dx = dalloc(MB * d);
	md->dx2 = dalloc(MB * d);
	md->da = dalloc(MB * h);
	md->dh = dalloc(MB * h);
	md->dw1 = dalloc((size_t)ML * d * h);
	md->dw2 = dalloc((size_t)ML * h * d);
	md->loss = dalloc(1);
}

/* Enqueues one forward and backward pass; gradients land in dw1, dw2. */
static void mlp_step(struct mlp_dev *md, const struct ts_mlp *m)
{
	int B = MB, d = m->d_model, h = ts_mlp_hidden(m), L = m->layers;
	bool w2 = ts_mlp_has_w2(m);

	dcopy(md->xs, md->x0, (size_t)B * d);
	for (int l = 0; l < L; l++) {
		float *xl = md->xs + (size_t)l * B * d, *xn = xl + (size_t)B * d;
		float *hl = md->hs + (size_t)l * B * h, *al = md->as + (size_t)l * B * h;

		OK(ts_k_gemm(kern, q, false, false, B, h, d, 1.0f, xl, md->w1 + (size_t)l * d * h,
		             0.0f, hl, &err));
		OK(ts_k_act_fwd(kern, q, m->act, hl, al, (uint64_t)B * h, &err));
		if (w2)
			OK(ts_k_gemm(kern, q, false, false, B, d, h, 1.0f, al,
			             md->w2 + (size_t)l * h * d, 0.0f, xn, &err));
		else
			dcopy(xn, al, (size_t)B * d);
		if (m->residual)
			OK(ts_k_add(kern, q, xl, xn, (uint64_t)B * d, &err));
	}
	OK(ts_k_loss(kern, q, m->loss, md->xs + (size_t)L * B * d, md->target, md->loss, md->dx,
	             (uint64_t)B * d, &err));
	for (int l = L - 1; l >= 0; l--) {
		float *xl = md->xs + (size_t)l * B * d;
		float *hl = md->hs + (size_t)l * B * h, *al = md->as + (size_t)l * B * h;
		float *w1l = md->w1 + (size_t)l * d * h, *w2l = md->w2 + (size_t)l * h * d;
		float *tmp;

		if (w2) {
			/* dW2 = a^T dy; da = dy W2^T */
			OK(ts_k_gemm(kern, q, true, false, h, d, B, 1.0f, al, md->dx, 0.0f,
			             md->dw2 + (size_t)l * h * d, &err));
			OK(ts_k_gemm(kern, q, false, true, B, h, d, 1.0f, md->dx, w2l, 0.0f, md->da,
			             &err));
			OK(ts_k_act_bwd(kern, q, m->act, hl, md->da, md->dh, (uint64_t)B * h, &err));
		} else {
			OK(ts_k_act_bwd(kern, q, m->act, hl, md->dx, md->dh, (uint64_t)B * h, &err));
		}
		/* dW1 = x^T dh; dx = dh W1^T (+ dy through the residual) */
		OK(ts_k_gemm(kern, q, true, false, d, h, B, 1.0f, xl, md->dh, 0.0f,
		             md->dw1 + (size_t)l * d * h, &err));
		OK(ts_k_gemm(kern, q, false, true, B, d, h, 1.0f, md->dh, w1l, 0.0f, md->dx2, &err));
		if (m->residual)
			OK(ts_k_add(kern, q, md->dx, md->dx2, (uint64_t)B * d, &err));
		tmp = md->dx;
		md->dx = md->dx2;
		md->dx2 = tmp;
	}
}

/* Gradients of one model against central differences of its float64 loss. */
static void mlp_check(enum ts_act act, bool residual, enum ts_loss loss, int d_hidden,
                      unsigned seed)
{
	struct mlp_case c;
	struct mlp_dev md;
	int h, n1, n2;
	double w1[ML * MD * MD], w2[ML * MD * MD], fd[2 * ML * MD * MD], gmax;
	float got[2 * ML * MD * MD];
	const double eps = 1e-6;
	char what[96];

	mlp_case_init(&c, act, residual, loss, d_hidden, seed);
	h = ts_mlp_hidden(&c.m);
	n1 = ML * MD * h;
	n2 = ts_mlp_has_w2(&c.m) ? ML * h * MD : 0;
	for (int i = 0; i < n1; i++)
		w1[i] = c.w1[i];
	for (int i = 0; i < ML * h * MD; i++)
		w2[i] = c.w2[i];
	for (int i = 0; i < n1 + n2; i++) {
		double *w = i < n1 ? &w1[i] : &w2[i - n1];
		double keep = *w, lp, lm;

		*w = keep + eps;
		lp = mlp_loss_ref(&c, w1, w2);
		*w = keep - eps;
		lm = mlp_loss_ref(&c, w1, w2);
		*w = keep;
		fd[i] = (lp - lm) / (2 * eps);
	}
	gmax = max_abs(fd, (size_t)(n1 + n2));

	mlp_dev_init(&md, &c);
	mlp_step(&md, &c.m);
	dget(got, md.dw1, (size_t)n1);
	if (n2)
		dget(got + n1, md.dw2, (size_t)n2);
	snprintf(what, sizeof what, "%s residual=%d %s h=%d grad", ts_act_name(act), residual,
	         ts_loss_name(loss), d_hidden);
	for (int i = 0; i < n1 + n2; i++)
		check_close(got[i], fd[i], 1e-3, 1e-2 * gmax, what, (size_t)i);
	snprintf(what, sizeof what, "%s residual=%d %s h=%d loss", ts_act_name(act), residual,
	         ts_loss_name(loss), d_hidden);
	check_close(dget1(md.loss), mlp_loss_ref(&c, w1, w2), 1e-5, 1e-3, what, 0);
	dfree_all();
}

START_TEST(test_mlp_gradients_match_finite_differences)
{
	unsigned seed = 100;

	for (int a = 0; a < 4; a++)
		for (int r = 0; r < 2; r++)
			for (int l = 0; l < 2; l++) {
				enum ts_loss loss = l ? TS_LOSS_MSE : TS_LOSS_SUM;

				mlp_check(all_acts[a], r, loss, MH, seed++);
				mlp_check(all_acts[a], r, loss, 0, seed++);
			}
}
END_TEST

/* ---- determinism, order, arguments ------------------------------------------------ */

/* A forward, backward and two clipped Adam steps, plus a larger gemm; the
 * results are appended to out (n floats). */
static size_t training_run(float *out)
{
	struct ts_optimizer o = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                         .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 0.5f};
	enum { GM = 96, GN = 80, GK = 200 };
	struct mlp_case c;
	struct mlp_dev md;
	float zero[ML * MD * MH] = {0};
	float *A = malloc(GM * GK * sizeof *A), *B = malloc(GK * GN * sizeof *B);
	float *dmu, *dnu, *dgsq, *dA, *dB, *dC;
	size_t n = 0, nw = ML * MD * MH;

	mlp_case_init(&c, TS_ACT_GELU, true, TS_LOSS_MSE, MH, 7);
	mlp_dev_init(&md, &c);
	dmu = dput(zero, nw);
	dnu = dput(zero, nw);
	dgsq = dalloc(1);
	for (int t = 1; t <= 2; t++) {
		mlp_step(&md, &c.m);
		OK(ts_k_fill(kern, q, dgsq, 0.0f, 1, &err));
		OK(ts_k_sumsq(kern, q, md.dw1, nw, dgsq, &err));
		OK(ts_k_update(kern, q, &o, t, md.w1, md.dw1, dmu, dnu, nw, dgsq, &err));
	}
	dget(out + n, md.w1, nw);
	n += nw;
	dget(out + n, dmu, nw);
	n += nw;
	dget(out + n, dnu, nw);
	n += nw;
	dget(out + n, md.loss, 1);
	n += 1;
	fill_rnd(A, GM * GK, 1, -1, 1);
	fill_rnd(B, GK * GN, 2, -1, 1);
	dA = dput(A, GM * GK);
	dB = dput(B, GK * GN);
	dC = dalloc(GM * GN);
	OK(ts_k_gemm(kern, q, true, false, GM, GN, GK, 1.0f, dA, dB, 0.0f, dC, &err));
	dget(out + n, dC, GM * GN);
	n += GM * GN;
	free(A);
	free(B);
	dfree_all();
	return n;
}

START_TEST(test_same_sequence_same_bits)
{
	size_t cap = 4 * ML * MD * MH + 96 * 80 + 16, n1, n2;
	float *a = malloc(cap * sizeof *a), *b = malloc(cap * sizeof *b);

	n1 = training_run(a);
	n2 = training_run(b);
	ck_assert_uint_eq(n1, n2);
	ck_assert_uint_le(n1, cap);
	ck_assert_msg(memcmp(a, b, n1 * sizeof *a) == 0, "two identical runs differ");
	free(a);
	free(b);
}
END_TEST

/* Two queues share one ts_kernels and run gemms at once (OpenBLAS called
 * from two queue workers); each matches the same gemms run alone. */
START_TEST(test_queues_share_kernels)
{
	enum { G = 96, ROUNDS = 12 };
	size_t n = (size_t)G * G;
	float *A = malloc(n * sizeof *A), *B = malloc(n * sizeof *B);
	float *alone = malloc(n * sizeof *alone), *got = malloc(n * sizeof *got);
	struct ts_queue *q2;
	float *dA, *dB, *dC1, *dC2, *dAlone;

	fill_rnd(A, n, 51, -1, 1);
	fill_rnd(B, n, 52, -1, 1);
	dA = dput(A, n);
	dB = dput(B, n);
	dC1 = dalloc(n);
	dC2 = dalloc(n);
	dAlone = dalloc(n);
	OK(ts_k_gemm(kern, q, false, true, G, G, G, 1.0f, dA, dB, 0.0f, dAlone, &err));
	for (int r = 1; r < ROUNDS; r++)
		OK(ts_k_gemm(kern, q, false, true, G, G, G, 0.5f, dA, dB, 0.5f, dAlone, &err));
	dget(alone, dAlone, n);

	OK(ts_queue_new(dev, &q2, &err));
	OK(ts_k_gemm(kern, q, false, true, G, G, G, 1.0f, dA, dB, 0.0f, dC1, &err));
	OK(ts_k_gemm(kern, q2, false, true, G, G, G, 1.0f, dA, dB, 0.0f, dC2, &err));
	for (int r = 1; r < ROUNDS; r++) {
		OK(ts_k_gemm(kern, q, false, true, G, G, G, 0.5f, dA, dB, 0.5f, dC1, &err));
		OK(ts_k_gemm(kern, q2, false, true, G, G, G, 0.5f, dA, dB, 0.5f, dC2, &err));
	}
	OK(ts_queue_sync(q2, &err));
	dget(got, dC1, n);
	ck_assert_msg(memcmp(got, alone, n * sizeof *got) == 0, "queue 1 differs");
	dget(got, dC2, n);
	ck_assert_msg(memcmp(got, alone, n * sizeof *got) == 0, "queue 2 differs");
	ts_queue_free(q2);
	free(A);
	free(B);
	free(alone);
	free(got);
}
END_TEST

/* A host job that holds the queue until released. */
struct latch {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool open;
};

static void latch_wait(void *arg)
{
	struct latch *l = arg;

	pthread_mutex_lock(&l->mu);
	while (!l->open)
		pthread_cond_wait(&l->cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
}

START_TEST(test_kernels_run_later_in_queue_order)
{
	struct latch l = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
	float zero[4] = {0}, x[4], y[4];
	float *dx = dput(zero, 4), *dy = dput(zero, 4);

	OK(ts_queue_host_fn(q, latch_wait, &l, &err));
	OK(ts_k_fill(kern, q, dx, 2.0f, 4, &err));
	OK(ts_k_add(kern, q, dx, dy, 4, &err));
	OK(ts_k_fill(kern, q, dx, 5.0f, 4, &err));
	OK(ts_k_add(kern, q, dx, dy, 4, &err));
	/* sim memory is host memory: nothing has run yet */
	memcpy(x, dx, sizeof x);
	memcpy(y, dy, sizeof y);
	for (int i = 0; i < 4; i++) {
		ck_assert_float_eq(x[i], 0.0f);
		ck_assert_float_eq(y[i], 0.0f);
	}
	pthread_mutex_lock(&l.mu);
	l.open = true;
	pthread_cond_signal(&l.cv);
	pthread_mutex_unlock(&l.mu);
	dget(y, dy, 4);
	for (int i = 0; i < 4; i++)
		ck_assert_float_eq(y[i], 7.0f);
}
END_TEST

START_TEST(test_sim_kernels_run_on_cpu_queues)
{
	struct ts_device *cpu = ts_device_set_find(set, "cpu:0");
	struct ts_queue *cq;
	float *x = malloc(8 * sizeof *x);

	ck_assert_ptr_nonnull(cpu);
	OK(ts_queue_new(cpu, &cq, &err));
	OK(ts_k_fill(kern, cq, x, 1.5f, 8, &err));
	OK(ts_queue_sync(cq, &err));
	for (int i = 0; i < 8; i++)
		ck_assert_float_eq(x[i], 1.5f);
	ts_queue_free(cq);
	free(x);
}
END_TEST

START_TEST(test_native_queue_handle)
{
	bool cuda = ts_device_props(dev)->backend == TS_BACKEND_CUDA;

	/* a cudaStream_t on CUDA, nothing on the host backends */
	ck_assert(cuda ? ts_queue_native(q) != NULL : ts_queue_native(q) == NULL);
	ck_assert_ptr_null(ts_queue_native(NULL));
}
END_TEST

START_TEST(test_bad_arguments_refused)
{
	struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-3f, .b1 = 0.9f,
	                            .b2 = 0.999f, .eps = 1e-8f};
	struct ts_optimizer o;
	struct ts_kernels *k2 = (struct ts_kernels *)1;
	float *x = dalloc(16), *y = dalloc(16), *s = dalloc(1);

	REFUSED(ts_kernels_new(NULL, &k2, &err));
	ck_assert_ptr_null(k2);
	REFUSED(ts_k_fill(NULL, q, x, 0, 4, &err));
	REFUSED(ts_k_fill(kern, NULL, x, 0, 4, &err));
	REFUSED(ts_k_fill(kern, q, NULL, 0, 4, &err));

	REFUSED(ts_k_gemm(kern, q, false, false, -1, 2, 2, 1, x, y, 0, s, &err));
	REFUSED(ts_k_gemm(kern, q, false, false, 2, -2, 2, 1, x, y, 0, s, &err));
	REFUSED(ts_k_gemm(kern, q, false, false, 2, 2, -1, 1, x, y, 0, s, &err));
	REFUSED(ts_k_gemm(kern, q, false, false, 2, 2, 2, 1, NULL, y, 0, s, &err));
	REFUSED(ts_k_gemm(kern, q, false, false, 2, 2, 2, 1, x, NULL, 0, s, &err));
	REFUSED(ts_k_gemm(kern, q, false, false, 2, 2, 2, 1, x, y, 0, NULL, &err));

	REFUSED(ts_k_act_fwd(kern, q, (enum ts_act)9, x, y, 4, &err));
	REFUSED(ts_k_act_fwd(kern, q, TS_ACT_RELU, NULL, y, 4, &err));
	REFUSED(ts_k_act_bwd(kern, q, (enum ts_act)-1, x, y, y, 4, &err));
	REFUSED(ts_k_act_bwd(kern, q, TS_ACT_TANH, x, NULL, y, 4, &err));
	REFUSED(ts_k_add(kern, q, NULL, y, 4, &err));

	REFUSED(ts_k_loss(kern, q, (enum ts_loss)5, x, y, s, y, 4, &err));
	REFUSED(ts_k_loss(kern, q, TS_LOSS_MSE, x, NULL, s, y, 4, &err));
	REFUSED(ts_k_loss(kern, q, TS_LOSS_SUM, x, NULL, NULL, y, 4, &err));
	REFUSED(ts_k_loss(kern, q, TS_LOSS_SUM, x, NULL, s, y, 0, &err));
	REFUSED(ts_k_sumsq(kern, q, x, 4, NULL, &err));
	REFUSED(ts_k_sumsq(kern, q, NULL, 4, s, &err));

	REFUSED(ts_k_update(kern, q, NULL, 1, x, y, x, y, 4, NULL, &err));
	o = adam;
	o.type = TS_OPT_NONE;
	REFUSED(ts_k_update(kern, q, &o, 1, x, y, x, y, 4, NULL, &err));
	REFUSED(ts_k_update(kern, q, &adam, 0, x, y, x, y, 4, NULL, &err));
	REFUSED(ts_k_update(kern, q, &adam, 1, x, y, NULL, y, 4, NULL, &err));
	REFUSED(ts_k_update(kern, q, &adam, 1, NULL, y, x, y, 4, NULL, &err));
	o = adam;
	o.b1 = 1.0f;
	REFUSED(ts_k_update(kern, q, &o, 1, x, y, x, y, 4, NULL, &err));
	o = adam;
	o.clip_global_norm = -1.0f;
	REFUSED(ts_k_update(kern, q, &o, 1, x, y, x, y, 4, NULL, &err));
	o.clip_global_norm = 1.0f;      /* clipping needs the norm */
	REFUSED(ts_k_update(kern, q, &o, 1, x, y, x, y, 4, NULL, &err));
	o = adam;
	o.learning_rate = NAN;
	REFUSED(ts_k_update(kern, q, &o, 1, x, y, x, y, 4, NULL, &err));
	/* CUDA kernels run on their own device's streams only */
	if (ts_device_props(dev)->backend == TS_BACKEND_CUDA) {
		struct ts_queue *cq;

		OK(ts_queue_new(ts_device_set_find(set, "cpu:0"), &cq, &err));
		REFUSED(ts_k_fill(kern, cq, x, 0, 4, &err));
		ts_queue_free(cq);
	}
	/* SGD needs neither moments nor a step count */
	o = adam;
	o.type = TS_OPT_SGD;
	OK(ts_k_fill(kern, q, x, 1.0f, 4, &err));
	OK(ts_k_fill(kern, q, y, 2.0f, 4, &err));
	OK(ts_k_update(kern, q, &o, 0, x, y, NULL, NULL, 4, NULL, &err));
	check_close(dget1(x), 1.0 - 2e-3, 1e-6, 0, "sgd", 0);
}
END_TEST

/* ---- CUDA against the CPU on the same inputs ---------------------------------- */

/* sim:0 (the CPU kernels) beside cuda:0, with a queue and kernels each. */
static struct ts_device *xdev[2];
static struct ts_kernels *xk[2];
static struct ts_queue *xq[2];

static void setup_both(void)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 256ull << 20,
	                              .cuda = true, .host = "t"};
	static const char *const ids[2] = {"sim:0", "cuda:0"};

	setup_on(&dc, "cuda:0");
	for (int b = 0; b < 2; b++) {
		xdev[b] = ts_device_set_find(set, ids[b]);
		ck_assert_msg(xdev[b] != NULL, "no device %s", ids[b]);
		OK(ts_kernels_new(xdev[b], &xk[b], &err));
		OK(ts_queue_new(xdev[b], &xq[b], &err));
	}
}

static void teardown_both(void)
{
	for (int b = 0; b < 2; b++) {
		ts_queue_free(xq[b]);
		ts_kernels_free(xk[b]);
	}
	teardown();
}

/* Device copies on both backends of h[0..n): x[0] on sim, x[1] on cuda. */
struct xbuf {
	float *d[2];
	size_t n;
};

static struct xbuf xput(const float *h, size_t n)
{
	struct xbuf x = {{NULL, NULL}, n};

	for (int b = 0; b < 2; b++) {
		void *p = NULL;

		ck_assert_int_lt(nbufs, MAX_BUFS);
		OK(ts_device_mem_alloc(xdev[b], TS_MEM_DEVICE, n * sizeof(float), &p, &err));
		/* dfree_all frees on dev (cuda:0); sim buffers go by hand below */
		x.d[b] = p;
		OK(ts_queue_copy(xq[b], p, h, n * sizeof(float), TS_COPY_H2D, &err));
		OK(ts_queue_sync(xq[b], &err));
	}
	return x;
}

static void xfree(struct xbuf *x)
{
	for (int b = 0; b < 2; b++) {
		ts_queue_sync(xq[b], NULL);
		ts_device_mem_free(xdev[b], TS_MEM_DEVICE, x->d[b], x->n * sizeof(float));
	}
}

/* Both backends' contents, read back into h[0] (sim) and h[1] (cuda). */
static void xget(float *h[2], const struct xbuf *x)
{
	for (int b = 0; b < 2; b++) {
		OK(ts_queue_copy(xq[b], h[b], x->d[b], x->n * sizeof(float), TS_COPY_D2H, &err));
		OK(ts_queue_sync(xq[b], &err));
	}
}

/* Distance in units in the last place between two floats (NaN == NaN). */
static uint64_t ulps(float a, float b)
{
	int32_t ia, ib;

	if (isnan(a) && isnan(b))
		return 0;
	if (isnan(a) || isnan(b))
		return UINT64_MAX;
	memcpy(&ia, &a, 4);
	memcpy(&ib, &b, 4);
	if (ia < 0)
		ia = INT32_MIN - ia;
	if (ib < 0)
		ib = INT32_MIN - ib;
	return ia > ib ? (uint64_t)((int64_t)ia - ib) : (uint64_t)((int64_t)ib - ia);
}

/* CPU and CUDA results of one kernel agree within max_ulp, or within
 * abs_tol where the values are tiny (cancellation near 0). */
static void xcheck(const struct xbuf *x, uint64_t max_ulp, double abs_tol, const char *what)
{
	float *h[2] = {malloc(x->n * sizeof(float)), malloc(x->n * sizeof(float))};

	xget(h, x);
	for (size_t i = 0; i < x->n; i++) {
		uint64_t u = ulps(h[0][i], h[1][i]);

		ck_assert_msg(u <= max_ulp || fabs((double)h[0][i] - h[1][i]) <= abs_tol,
		              "%s[%zu]: cpu %.9g, cuda %.9g (%llu ulp)", what, i, h[0][i],
		              h[1][i], (unsigned long long)u);
	}
	free(h[0]);
	free(h[1]);
}

/* Inputs with the awkward values first: 0, -0, tiny, large, then random. */
static float *x_inputs(size_t n, unsigned seed, float lo, float hi)
{
	static const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 30.0f, -30.0f, 1.0f, -1.0f};
	float *h = malloc(n * sizeof *h);

	fill_rnd(h, n, seed, lo, hi);
	for (size_t i = 0; i < n && i < sizeof edge / sizeof edge[0]; i++)
		h[i] = edge[i];
	return h;
}

/* not a multiple of 256, above one block's lanes and the sim grid */
#define XN ((size_t)300007)

START_TEST(test_cuda_matches_cpu_elementwise)
{
	float *in = x_inputs(XN, 11, -6, 6), *go = x_inputs(XN, 12, -2, 2);
	struct xbuf x = xput(in, XN), g = xput(go, XN), y = xput(go, XN);

	for (size_t a = 0; a < sizeof all_acts / sizeof all_acts[0]; a++) {
		for (int b = 0; b < 2; b++)
			OK(ts_k_act_fwd(xk[b], xq[b], all_acts[a], x.d[b], y.d[b], XN, &err));
		/* gelu cancels 1 + tanh for negative x: absolute, not relative,
		 * agreement there (FMA contraction and CUDA's tanhf differ) */
		xcheck(&y, 4, 2e-6, ts_act_name(all_acts[a]));
		for (int b = 0; b < 2; b++)
			OK(ts_k_act_bwd(xk[b], xq[b], all_acts[a], x.d[b], g.d[b], y.d[b], XN, &err));
		xcheck(&y, 8, 2e-6, "activation gradient");
	}
	for (int b = 0; b < 2; b++) {
		OK(ts_k_add(xk[b], xq[b], x.d[b], g.d[b], XN, &err));
		OK(ts_k_fill(xk[b], xq[b], y.d[b], -2.5f, XN / 2, &err));
	}
	xcheck(&g, 0, 0, "add");
	xcheck(&y, 4, 2e-6, "fill");
	xfree(&x);
	xfree(&g);
	xfree(&y);
	free(in);
	free(go);
}
END_TEST

START_TEST(test_cuda_matches_cpu_reductions_bit_for_bit)
{
	/* 8192 and past it: whole batches of k_sumsq's loads, and a tail */
	static const size_t sizes[] = {1, 255, 256, 257, 4096, 8192, 8447, XN};
	float *out = x_inputs(XN, 21, -3, 3), *tgt = x_inputs(XN, 22, -3, 3);
	float zero = 0.0f;
	struct xbuf o = xput(out, XN), t = xput(tgt, XN), g = xput(out, XN);
	struct xbuf acc = xput(&zero, 1), val = xput(&zero, 1);

	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		for (int l = 0; l < 2; l++) {
			enum ts_loss loss = l ? TS_LOSS_MSE : TS_LOSS_SUM;

			for (int b = 0; b < 2; b++)
				OK(ts_k_loss(xk[b], xq[b], loss, o.d[b], l ? t.d[b] : NULL, val.d[b],
				             g.d[b], sizes[s], &err));
			xcheck(&val, 0, 0, ts_loss_name(loss));
			xcheck(&g, 4, 0, "loss gradient");
		}
		/* accumulated over the sizes: the global norm of several tensors */
		for (int b = 0; b < 2; b++)
			OK(ts_k_sumsq(xk[b], xq[b], o.d[b], sizes[s], acc.d[b], &err));
		xcheck(&acc, 0, 0, "sum of squares");
	}
	xfree(&o);
	xfree(&t);
	xfree(&g);
	xfree(&acc);
	xfree(&val);
	free(out);
	free(tgt);
}
END_TEST


/* ---- token models --------------------------------------------------------------- */

/* Device copies of token ids as uint16 (id_bytes 2) or int32. */
static void *dput_ids(const int *ids, size_t n, int id_bytes)
{
	float *d = dalloc((n * (size_t)id_bytes + 3) / 4);
	char *h = malloc(n * (size_t)id_bytes + 1);

	for (size_t i = 0; i < n; i++) {
		if (id_bytes == 2) {
			uint16_t v = (uint16_t)ids[i];

			memcpy(h + 2 * i, &v, 2);
		} else {
			int32_t v = ids[i];

			memcpy(h + 4 * i, &v, 4);
		}
	}
	OK(ts_queue_copy(q, d, h, n * (size_t)id_bytes, TS_COPY_H2D, &err));
	OK(ts_queue_sync(q, &err));
	free(h);
	return d;
}

START_TEST(test_embedding_gather_and_scatter_add)
{
	enum { V = 7, D = 5, R = 11 };
	/* repeated ids (3 four times, 0 twice), and ids never used (4, 6) */
	static const int ids[R] = {3, 0, 3, 1, 5, 3, 2, 0, 3, 1, 5};
	float table[V * D], go[R * D], out[R * D], gt[V * D];

	fill_rnd(table, V * D, 31, -1, 1);
	fill_rnd(go, R * D, 32, -1, 1);
	for (int w = 2; w <= 4; w += 2) {
		float *dt = dput(table, V * D), *dgo = dput(go, R * D), *dout = dalloc(R * D);
		float *dgt = dput(go, V * D);            /* garbage: overwritten */
		void *di = dput_ids(ids, R, w);

		OK(ts_k_embed_fwd(kern, q, dt, V, D, di, w, R, dout, &err));
		dget(out, dout, R * D);
		for (int r = 0; r < R; r++)
			for (int c = 0; c < D; c++)
				ck_assert_float_eq(out[r * D + c], table[ids[r] * D + c]);
		OK(ts_k_embed_bwd(kern, q, di, w, R, V, D, dgo, dgt, &err));
		dget(gt, dgt, V * D);
		for (int v = 0; v < V; v++)
			for (int c = 0; c < D; c++) {
				double ref = 0;

				for (int r = 0; r < R; r++)
					if (ids[r] == v)
						ref += go[r * D + c];
				check_close(gt[v * D + c], ref, 1e-6, 1e-6, "embedding gradient",
				            (size_t)(v * D + c));
			}
		dfree_all();
	}
}
END_TEST

START_TEST(test_softmax_cross_entropy)
{
	enum { V = 300, R = 9 };     /* more classes than a block's lanes */
	static const int tg[R] = {0, 299, 17, 17, 256, 255, 1, 42, 299};
	float *x = malloc(V * R * sizeof *x), *g = malloc(V * R * sizeof *g), loss[R + 1];

	fill_rnd(x, V * R, 41, -8, 8);
	x[5] = 60.0f;                /* a dominant logit: the max is taken out */
	for (int w = 2; w <= 4; w += 2) {
		float *dx = dput(x, V * R), *dg = dalloc(V * R), *dl = dalloc(R + 1);
		void *dt = dput_ids(tg, R, w);
		double mean = 0;

		OK(ts_k_xent(kern, q, dx, dt, w, R, V, dl, dg, &err));
		dget(loss, dl, R + 1);
		dget(g, dg, V * R);
		for (int r = 0; r < R; r++) {
			double m = -INFINITY, s = 0, lse;

			for (int c = 0; c < V; c++)
				m = fmax(m, x[r * V + c]);
			for (int c = 0; c < V; c++)
				s += exp((double)x[r * V + c] - m);
			lse = log(s) + m;
			check_close(loss[1 + r], lse - x[r * V + tg[r]], 1e-6, 1e-6, "row loss",
			            (size_t)r);
			mean += (lse - x[r * V + tg[r]]) / R;
			for (int c = 0; c < V; c++) {
				double p = exp((double)x[r * V + c] - lse);

				check_close(g[r * V + c], (p - (c == tg[r])) / R, 1e-5, 1e-7,
				            "cross-entropy gradient", (size_t)(r * V + c));
			}
		}
		check_close(loss[0], mean, 1e-6, 0, "cross-entropy", 0);
		/* refused: no rows, a bad id width */
		ck_assert_int_eq(ts_k_xent(kern, q, dx, dt, w, 0, V, dl, dg, &err), TS_INVALID_ARGUMENT);
		ck_assert_int_eq(ts_k_xent(kern, q, dx, dt, 3, R, V, dl, dg, &err), TS_INVALID_ARGUMENT);
		ck_assert_int_eq(ts_k_embed_fwd(kern, q, dx, V, 1, NULL, w, R, dg, &err),
		                 TS_INVALID_ARGUMENT);
		dfree_all();
	}
	free(x);
	free(g);
}
END_TEST

/* The bits of a double, as a signed distance on the line of doubles. */
static int64_t dorder(double x)
{
	int64_t b;

	memcpy(&b, &x, sizeof b);
	return b < 0 ? INT64_MIN - b : b;
}

static int64_t ulps_from_libm(double a)
{
	return llabs(dorder(ts_m_exp_neg(a)) - dorder(exp(a)));
}

/* ts_m_exp_neg, the exp of the cross-entropy's terms on both backends:
 * within an ulp of libm's exp over (-708, 0], 0 below, NaN kept. */
START_TEST(test_exp_neg_within_an_ulp)
{
	unsigned s = 61;

	for (int i = 0; i < 400000; i++) {
		/* uniform over the range, and dense near 0 where the terms matter */
		double a = i % 2 ? -708.0 * rnd(&s, 0, 1) : -(double)rnd(&s, 0, 1) * rnd(&s, 0, 1);

		ck_assert_msg(ulps_from_libm(a) <= 1, "exp(%a): got %a, libm %a", a,
		              ts_m_exp_neg(a), exp(a));
	}
	/* the reduction's boundaries k ln 2 and k ln 2 - ln 2 / 2 */
	for (int k = -1021; k <= 0; k++)
		for (int h = 0; h <= 1; h++) {
			double a = k * M_LN2 - h * M_LN2 / 2;

			if (a > -708.0)
				ck_assert_msg(ulps_from_libm(a) <= 1, "exp(%a)", a);
		}
	ck_assert(ts_m_exp_neg(0.0) == 1.0 && ts_m_exp_neg(-0.0) == 1.0);
	ck_assert(ts_m_exp_neg(-708.5) == 0.0 && ts_m_exp_neg(-1e300) == 0.0);
	ck_assert(ts_m_exp_neg(-INFINITY) == 0.0);
	ck_assert(isnan(ts_m_exp_neg(NAN)));
	ck_assert(ts_m_exp_neg(5.0) == 1.0);                /* outside the domain: as 0 */
}
END_TEST

/* The bits of a float, as a signed distance on the line of floats. */
static int32_t forder(float x)
{
	int32_t b;

	memcpy(&b, &x, sizeof b);
	return b < 0 ? INT32_MIN - b : b;
}

/* Checks tanh, a float tanh of the kernels, against the correctly rounded
 * tanh (libm's in double, rounded to float) over every 97th float of
 * either sign: within ulps of it, odd, never past 1; exact at 0 and the
 * infinities, NaN kept. */
static void check_tanh(float (*tanh_f)(float), int ulps)
{
	int worst = 0;

	for (uint32_t b = 0; b < 0x7f800000u; b += 97) {
		for (int sgn = 0; sgn < 2; sgn++) {
			uint32_t bits = b | (sgn ? 0x80000000u : 0);
			float x, got, want;
			int d;

			memcpy(&x, &bits, sizeof x);
			got = tanh_f(x);
			want = (float)tanh((double)x);
			d = abs(forder(got) - forder(want));
			/* (a passed ck_assert writes its place to a file) */
			if (d > ulps || got != -tanh_f(-x) || fabsf(got) > 1.0f)
				ck_abort_msg("tanh(%a): got %a, want %a", (double)x, (double)got,
				             (double)want);
			worst = d > worst ? d : worst;
		}
	}
	ck_assert(tanh_f(0.0f) == 0.0f && signbit(tanh_f(-0.0f)));
	ck_assert(tanh_f(INFINITY) == 1.0f && tanh_f(-INFINITY) == -1.0f);
	ck_assert(isnan(tanh_f(NAN)));
	ck_assert_int_le(worst, ulps);
}

static float tanh_double(float x)
{
	return ts_m_tanh(x);
}

static float tanh_rational(float x)
{
	return ts_m_tanh_rational(x);
}

/* ts_m_tanh, the activations' tanh on both backends (GELU's backward's):
 * within an ulp. */
START_TEST(test_tanh_within_an_ulp)
{
	check_tanh(tanh_double, 1);
}
END_TEST

/* ts_m_exp_negf, the exp of the cross-entropy's and the attention's
 * terms on both backends: within an ulp of the correctly rounded exp
 * (libm's in double, rounded to float) over every 31st float in [-87, 0],
 * 0 below, NaN kept. */
START_TEST(test_exp_negf_within_an_ulp)
{
	int worst = 0;

	for (uint32_t b = 0; b < 0x7f800000u; b += 31) {
		uint32_t bits = b | 0x80000000u;
		float a, got, want;
		int d;

		memcpy(&a, &bits, sizeof a);
		if (a < -87.0f)
			break;
		got = ts_m_exp_negf(a);
		want = (float)exp((double)a);
		d = abs(forder(got) - forder(want));
		if (d > 1)   /* (a passed ck_assert writes its place to a file) */
			ck_abort_msg("exp(%a): got %a, want %a", (double)a, (double)got, (double)want);
		worst = d > worst ? d : worst;
	}
	/* the reduction's boundaries k ln 2 and k ln 2 - ln 2 / 2 */
	for (int k = -125; k <= 0; k++)
		for (int h = 0; h <= 1; h++) {
			float a = (float)(k * M_LN2 - h * M_LN2 / 2);

			if (a > -87.0f)
				ck_assert_msg(abs(forder(ts_m_exp_negf(a)) - forder((float)exp((double)a))) <= 1,
				              "exp(%a)", (double)a);
		}
	ck_assert(ts_m_exp_negf(0.0f) == 1.0f && ts_m_exp_negf(-0.0f) == 1.0f);
	ck_assert(ts_m_exp_negf(-87.5f) == 0.0f && ts_m_exp_negf(-1e30f) == 0.0f);
	ck_assert(ts_m_exp_negf(-INFINITY) == 0.0f);
	ck_assert(isnan(ts_m_exp_negf(NAN)));
	ck_assert(ts_m_exp_negf(5.0f) == 1.0f);             /* outside the domain: as 0 */
	ck_assert(worst <= 1);
}
END_TEST

/* ts_m_tanh_rational, GELU's forward tanh on both backends: within 5
 * ulps. */
START_TEST(test_tanh_rational_within_5_ulps)
{
	check_tanh(tanh_rational, 5);
}
END_TEST

/* The lanes' tree over part, as kernels_math.h orders it. */
static double lanes_tree(double *part)
{
	for (int w = TS_RED_LANES / 2; w > 0; w >>= 1)
		for (int l = 0; l < w; l++)
			part[l] += part[l + w];
	return part[0];
}

/*
 * Rows as wide as a token model's vocabulary, on the CPU, against the
 * formulas with libm's exp (the kernel's before it had its own exp) bit
 * for bit, and against float64 within softmax_cross_entropy's
 * tolerances: the max in a row's last element (the vectorised max's
 * tail), in its first, terms below exp(-708) (0: a row's sum is >= 1),
 * and a row whose id is outside the vocabulary (zeros, loss 0).
 */
START_TEST(test_softmax_cross_entropy_wide_rows_same_bits)
{
	enum { V = 8195, RMAX = 8 };
	static const int tg[RMAX] = {8194, 0, 4097, 8194, 17, V, 5, 123};
	float *x = malloc(V * RMAX * sizeof *x), *g = malloc(V * RMAX * sizeof *g);
	float *gw = malloc(V * RMAX * sizeof *gw), loss[RMAX + 1], lw[RMAX + 1];
	double part[TS_RED_LANES];

	fill_rnd(x, V * RMAX, 71, -12, 12);
	x[V - 1] = 30.0f;                       /* row 0: max last */
	x[V] = 25.0f;                           /* row 1: max first */
	for (int c = 0; c < V; c += 3)          /* row 2: a third far below */
		x[2 * V + c] = -720.0f + (float)(c % 40);
	x[3 * V + 100] = 720.0f;                /* row 3: all the others below */
	/* 6 rows, and 8: the gradient's division by a power of two */
	for (int R = 6; R <= RMAX; R += 2) {
		float *dx = dput(x, V * R), *dg = dalloc(V * R), *dl = dalloc(R + 1);
		void *dt = dput_ids(tg, R, 4);

		OK(ts_k_xent(kern, q, dx, dt, 4, R, V, dl, dg, &err));
		dget(loss, dl, R + 1);
		dget(g, dg, V * R);
		for (int r = 0; r < R; r++) {
			const float *xr = x + (size_t)r * V;
			float m = -INFINITY;
			double sum, lse;

			for (int c = 0; c < V; c++)
				m = fmaxf(m, xr[c]);
			for (int l = 0; l < TS_RED_LANES; l++)
				part[l] = 0;
			for (int c = 0; c < V; c++)
				part[c % TS_RED_LANES] += ts_m_xent_exp(xr[c], m);
			sum = lanes_tree(part);
			lse = log(sum) + m;
			for (int c = 0; c < V; c++) {
				double e = ts_m_xent_exp(xr[c], m);
				size_t i = (size_t)r * V + (size_t)c;

				gw[i] = tg[r] >= V ? 0.0f :
				        (float)((e * (1.0 / sum) - (c == tg[r] ? 1.0 : 0.0)) / R);
				if (tg[r] < V)
					check_close(g[i], (exp((double)xr[c] - lse) - (c == tg[r])) / R,
					            1e-5, 1e-7, "cross-entropy gradient", i);
			}
			lw[1 + r] = tg[r] >= V ? 0.0f :
			            (float)(log(sum) + (double)m - (double)xr[tg[r]]);
			if (tg[r] < V)
				check_close(loss[1 + r], lse - xr[tg[r]], 1e-6, 1e-6, "row loss",
				            (size_t)r);
		}
		for (int l = 0; l < TS_RED_LANES; l++)
			part[l] = 0;
		for (int r = 0; r < R; r++)
			part[r % TS_RED_LANES] += lw[1 + r];
		lw[0] = (float)(lanes_tree(part) / R);
		ck_assert_mem_eq(g, gw, (size_t)V * R * sizeof *g);
		ck_assert_mem_eq(loss, lw, (size_t)(R + 1) * sizeof *loss);
		for (int c = 0; c < V; c++)
			ck_assert_float_eq(g[(size_t)5 * V + c], 0.0f);
		ck_assert_float_eq(loss[1 + 5], 0.0f);
		dfree_all();
	}
	free(x);
	free(g);
	free(gw);
}
END_TEST

/*
 * The CPU's Adam, AdamW and SGD loops (vectorised, cloned for avx512f and
 * avx2) give the bits of the per-element formulas of kernels_math.h
 * evaluated one element at a time, clipping or not, over a length that
 * is no multiple of a vector.
 */
START_TEST(test_updates_match_the_formulas_bit_for_bit)
{
	enum { N = 100003 };
	float *h[7], gsq = 3.7f;
	unsigned s = 81;

	for (int k = 0; k < 7; k++)
		h[k] = malloc(N * sizeof(float));
	for (int v = 0; v < 4; v++) {
		struct ts_optimizer o = {.type = v == 3 ? TS_OPT_SGD : TS_OPT_ADAM,
		                         .learning_rate = 1e-3f, .b1 = 0.9f, .b2 = 0.999f,
		                         .eps = 1e-8f, .adamw = v == 1, .weight_decay = 0.01f,
		                         .clip_global_norm = v >= 2 ? 0.5f : 0.0f};
		float *p = h[0], *g = h[1], *mu = h[2], *nu = h[3], *pw = h[4], *muw = h[5];
		float *nuw = h[6], *dp, *dg, *dmu, *dnu, *dgsq;
		float lr = ts_m_learning_rate(&o, 6), norm = 1.0f, c = 1.0f;
		bool clip = false;

		for (int i = 0; i < N; i++) {
			p[i] = rnd(&s, -0.5f, 0.5f);
			g[i] = rnd(&s, -5e-3f, 5e-3f);
			mu[i] = 0.3f * g[i];
			nu[i] = 0.5f * g[i] * g[i];
		}
		dp = dput(p, N);
		dg = dput(g, N);
		dmu = dput(mu, N);
		dnu = dput(nu, N);
		dgsq = dput(&gsq, 1);
		OK(ts_k_update(kern, q, &o, 7, dp, dg, dmu, dnu, N, dgsq, &err));
		dget(pw, dp, N);
		dget(muw, dmu, N);
		dget(nuw, dnu, N);
		if (o.clip_global_norm > 0 && ts_m_clips(gsq, o.clip_global_norm, &norm)) {
			clip = true;
			c = o.clip_global_norm;
		}
		for (int i = 0; i < N; i++) {
			float gi = ts_m_clip_grad(g[i], clip, norm, c);

			if (o.type == TS_OPT_SGD)
				p[i] = ts_m_sgd(p[i], gi, lr);
			else
				p[i] = ts_m_adam(p[i], gi, &mu[i], &nu[i], lr, o.b1, o.b2, o.eps,
				                 ts_m_bias_correction(o.b1, 7),
				                 ts_m_bias_correction(o.b2, 7),
				                 o.adamw ? o.weight_decay : 0.0f);
		}
		ck_assert_mem_eq(pw, p, N * sizeof(float));
		if (o.type == TS_OPT_ADAM) {
			ck_assert_mem_eq(muw, mu, N * sizeof(float));
			ck_assert_mem_eq(nuw, nu, N * sizeof(float));
		}
		dfree_all();
	}
	for (int k = 0; k < 7; k++)
		free(h[k]);
}
END_TEST

/* Token ids on both backends, int32. */
static struct xbuf xput_ids(const int *ids, size_t n)
{
	return xput((const float *)(const void *)ids, n);
}

START_TEST(test_cuda_matches_cpu_tokens_bit_for_bit)
{
	enum { V = 1031, D = 67, R = 700 };
	int *ids = malloc(R * sizeof *ids);
	float *table = x_inputs(V * D, 51, -1, 1), *go = x_inputs(R * D, 52, -1, 1);
	float *logits = x_inputs(R * V, 53, -6, 6);
	struct xbuf t, g, o, gt, lg, gl, l, id;
	unsigned seed = 54;

	for (int r = 0; r < R; r++)      /* many repeats: 40 distinct ids */
		ids[r] = (int)(rnd(&seed, 0, 40) * 1.0f) * 25;
	t = xput(table, V * D);
	g = xput(go, R * D);
	o = xput(go, R * D);
	gt = xput(table, V * D);
	lg = xput(logits, R * V);
	gl = xput(logits, R * V);
	l = xput(go, R + 1);
	id = xput_ids(ids, R);
	for (int b = 0; b < 2; b++) {
		OK(ts_k_embed_fwd(xk[b], xq[b], t.d[b], V, D, id.d[b], 4, R, o.d[b], &err));
		OK(ts_k_embed_bwd(xk[b], xq[b], id.d[b], 4, R, V, D, g.d[b], gt.d[b], &err));
		OK(ts_k_xent(xk[b], xq[b], lg.d[b], id.d[b], 4, R, V, l.d[b], gl.d[b], &err));
	}
	xcheck(&o, 0, 0, "embedding");
	xcheck(&gt, 0, 0, "embedding gradient");
	/* exp and log of the two libms may differ by an ulp in double */
	xcheck(&l, 1, 0, "cross-entropy");
	xcheck(&gl, 2, 1e-12, "cross-entropy gradient");
	xfree(&t);
	xfree(&g);
	xfree(&o);
	xfree(&gt);
	xfree(&lg);
	xfree(&gl);
	xfree(&l);
	xfree(&id);
	free(ids);
	free(table);
	free(go);
	free(logits);
}
END_TEST

START_TEST(test_cuda_matches_cpu_updates)
{
	struct ts_optimizer opts[] = {
		{.type = TS_OPT_SGD, .learning_rate = 0.1f},
		{.type = TS_OPT_SGD, .learning_rate = 0.1f, .clip_global_norm = 0.5f},
		{.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f},
		{.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f,
		 .clip_global_norm = 1.0f},
		{.type = TS_OPT_ADAM, .adamw = true, .weight_decay = 0.1f, .learning_rate = 1e-2f,
		 .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 1.0f,
		 .schedule = {TS_SCHED_WARMUP_COSINE, 0.001f, 0.01f, 0.0f, 1, 3}},
	};
	float *p0 = x_inputs(XN, 31, -1, 1), *g0 = x_inputs(XN, 32, -1, 1);
	float zero = 0.0f, *z = calloc(XN, sizeof *z);

	for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
		struct xbuf p = xput(p0, XN), g = xput(g0, XN), mu = xput(z, XN), nu = xput(z, XN);
		struct xbuf gsq = xput(&zero, 1);

		for (int step = 1; step <= 3; step++)
			for (int b = 0; b < 2; b++) {
				OK(ts_k_fill(xk[b], xq[b], gsq.d[b], 0.0f, 1, &err));
				OK(ts_k_sumsq(xk[b], xq[b], g.d[b], XN, gsq.d[b], &err));
				OK(ts_k_update(xk[b], xq[b], &opts[i], step, p.d[b], g.d[b], mu.d[b],
				               nu.d[b], XN, gsq.d[b], &err));
			}
		xcheck(&gsq, 0, 0, "global norm");
		xcheck(&p, 4, 1e-7, ts_opt_name(opts[i].type));
		xcheck(&mu, 4, 1e-9, "mu");
		xcheck(&nu, 4, 1e-12, "nu");
		xfree(&p);
		xfree(&g);
		xfree(&mu);
		xfree(&nu);
		xfree(&gsq);
	}
	free(p0);
	free(g0);
	free(z);
}
END_TEST

/*
 * C = op(A) op(B) + beta C on the host in double, and the size that bounds
 * the rounding of any float32 evaluation of it: sum_k |a_mk b_kn| + |beta c|.
 */
static void gemm_exact(bool ta, bool tb, int M, int N, int K, const float *A, const float *B,
                       float beta, const float *C, double *exact, double *mag)
{
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			double s = (double)beta * C[(size_t)m * N + n];
			double a = fabs(s);

			for (int k = 0; k < K; k++) {
				double p = (double)(ta ? A[(size_t)k * M + m] : A[(size_t)m * K + k]) *
				           (tb ? B[(size_t)n * K + k] : B[(size_t)k * N + n]);

				s += p;
				a += fabs(p);
			}
			exact[(size_t)m * N + n] = s;
			mag[(size_t)m * N + n] = a;
		}
}

/*
 * The plan's six GEMMs (every transpose pair) on both backends, each
 * within the forward error bound of a float32 sum of K + 1 terms in any
 * order, gamma_{K+1} = (K+1)u / (1 - (K+1)u) with u = 2^-24, times
 * sum |terms|, of the exact result: cuBLAS sums in its own order (on an
 * H200, 128 ulp from OpenBLAS where the inputs' +-30 cancel), so ulps of
 * each other would be a rule neither library keeps; a wrong operand
 * mapping is off by the whole result.
 */
START_TEST(test_cuda_matches_cpu_gemm)
{
	enum { B_ = 64, H = 96, D = 80 };
	static const int plan6[6][5] = {{0, 0, B_, H, D}, {0, 0, B_, D, H}, {1, 0, H, D, B_},
	                                {0, 1, B_, H, D}, {1, 0, D, H, B_}, {0, 1, B_, D, H}};
	size_t big = (size_t)H * H;
	float *a0 = x_inputs(big, 41, -1, 1), *b0 = x_inputs(big, 42, -1, 1);
	float *c0 = x_inputs(big, 43, -1, 1);
	float *h[2] = {malloc(big * sizeof(float)), malloc(big * sizeof(float))};
	double *exact = malloc(big * sizeof(double)), *mag = malloc(big * sizeof(double));
	struct xbuf A = xput(a0, big), B = xput(b0, big), C = xput(c0, big);

	for (int i = 0; i < 6; i++) {
		bool ta = plan6[i][0], tb = plan6[i][1];
		int M = plan6[i][2], N = plan6[i][3], K = plan6[i][4];
		float beta = i % 2 ? 1.0f : 0.0f;
		double u = 0x1p-24, gamma = (K + 1) * u / (1 - (K + 1) * u);

		for (int b = 0; b < 2; b++) {
			OK(ts_queue_copy(xq[b], C.d[b], c0, big * sizeof(float), TS_COPY_H2D, &err));
			OK(ts_k_gemm(xk[b], xq[b], ta, tb, M, N, K, 1.0f, A.d[b], B.d[b], beta, C.d[b],
			             &err));
		}
		gemm_exact(ta, tb, M, N, K, a0, b0, beta, c0, exact, mag);
		xget(h, &C);
		for (size_t e = 0; e < (size_t)M * N; e++)
			for (int b = 0; b < 2; b++)
				ck_assert_msg(fabs(h[b][e] - exact[e]) <= gamma * mag[e],
				              "gemm %d [%zu] on %s: %.9g, exact %.12g, bound %.3g", i, e,
				              b ? "cuda" : "cpu", h[b][e], exact[e], gamma * mag[e]);
	}
	xfree(&A);
	xfree(&B);
	xfree(&C);
	free(a0);
	free(b0);
	free(c0);
	free(h[0]);
	free(h[1]);
	free(exact);
	free(mag);
}
END_TEST

/* Kernels of one device share its cuBLAS handle: making and freeing them
 * per step creates and destroys none (and stays correct). */
START_TEST(test_cuda_kernels_made_per_step)
{
	float a[4] = {1, 2, 3, 4}, c[4];
	float *dA = dput(a, 4), *dC = dalloc(4);

	uint64_t free0 = 0, free1 = 0, total = 0;

	for (int i = 0; i < 50; i++) {
		struct ts_kernels *k2;
		struct ts_queue *q2;

		OK(ts_kernels_new(dev, &k2, &err));
		OK(ts_queue_new(dev, &q2, &err));
		OK(ts_k_gemm(k2, q2, false, false, 2, 2, 2, 1.0f, dA, dA, 0.0f, dC, &err));
		/* the queue (its stream) goes first: the handle must not hold it */
		ts_queue_free(q2);
		ts_kernels_free(k2);
		if (i == 0)
			OK(ts_device_mem_info(dev, &free0, &total, &err));
	}
	/* nothing kept per stream: 49 more streams cost no device memory
	 * (a cuBLAS workspace per stream would be 4 to 32 MiB each) */
	OK(ts_device_mem_info(dev, &free1, &total, &err));
	ck_assert_msg(free1 + (64ull << 20) >= free0, "device free memory fell by %llu MiB over 49 "
	              "steps' streams", (unsigned long long)((free0 - free1) >> 20));
	dget(c, dC, 4);
	ck_assert_float_eq(c[0], 7.0f);
	ck_assert_float_eq(c[1], 10.0f);
	ck_assert_float_eq(c[2], 15.0f);
	ck_assert_float_eq(c[3], 22.0f);
}
END_TEST

/* A closed gate on a queue, and a thread that forces it open after a long
 * while (so that a blocked free ends, and says so). */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool open, forced;
};

static void *gate_forcer(void *arg)
{
	struct gate *g = arg;
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 30;
	pthread_mutex_lock(&g->mu);
	while (!g->open)
		if (pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0)
			break;
	if (!g->open) {
		g->forced = g->open = true;
		pthread_cond_broadcast(&g->cv);
	}
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

static void gate_wait(void *arg)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->mu);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

/* Freeing kernels does not synchronise the device (cublasDestroy would):
 * it returns while another queue of the device is held. */
START_TEST(test_cuda_kernels_free_does_not_wait_for_the_device)
{
	struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
	struct ts_kernels *k2;
	pthread_t t;

	OK(ts_kernels_new(dev, &k2, &err));
	OK(ts_queue_host_fn(q, gate_wait, &g, &err));
	ck_assert_int_eq(pthread_create(&t, NULL, gate_forcer, &g), 0);
	ts_kernels_free(k2);
	pthread_mutex_lock(&g.mu);
	g.open = true;
	pthread_cond_broadcast(&g.cv);
	pthread_mutex_unlock(&g.mu);
	pthread_join(t, NULL);
	OK(ts_queue_sync(q, &err));
	ck_assert_msg(!g.forced, "freeing kernels waited for the whole device");
}
END_TEST

/* A device-timed timeline on the CUDA stream: marks recorded in stream
 * order, read after the sync (busy time > 0 where the runtime times
 * events; a stand-in without cudaEventElapsedTime says so). */
START_TEST(test_cuda_timeline_times_the_stream)
{
	enum { N = 1 << 18 };
	struct ts_k_timeline *tl;
	float *x = dalloc(N);
	double busy = -1, wait = -1, comm = -1;
	ts_status st;

	OK(ts_k_timeline_new(kern, &tl, &err));
	OK(ts_k_timeline_mark(tl, q, TS_K_OPEN, &err));
	for (int i = 0; i < 8; i++)
		OK(ts_k_fill(kern, q, x, (float)i, N, &err));
	OK(ts_k_timeline_mark(tl, q, TS_K_WAIT_BEGIN, &err));
	OK(ts_k_timeline_mark(tl, q, TS_K_WAIT_END, &err));
	OK(ts_k_fill(kern, q, x, 9.0f, N, &err));
	/* a stretch of communication: what runs between the marks */
	OK(ts_k_timeline_mark(tl, q, TS_K_COMM_BEGIN, &err));
	for (int i = 0; i < 4; i++)
		OK(ts_k_fill(kern, q, x, 10.0f, N, &err));
	OK(ts_k_timeline_mark(tl, q, TS_K_COMM_END, &err));
	OK(ts_k_fill(kern, q, x, 9.0f, N, &err));
	OK(ts_k_timeline_mark(tl, q, TS_K_CLOSE, &err));
	REFUSED(ts_k_timeline_mark(tl, q, (enum ts_k_mark)7, &err));
	OK(ts_queue_sync(q, &err));
	ck_assert_float_eq(dget1(x + N - 1), 9.0f);
	st = ts_k_timeline_read(tl, &busy, &wait, &comm, &err);
	if (st == TS_UNIMPLEMENTED) {
		ck_assert_msg(strstr(err.message, "cudaEventElapsedTime"), "%s", err.message);
		ck_assert(busy == 0 && wait == 0 && comm == 0);
	} else {
		OK(st);
		ck_assert_msg(busy > 0, "busy %g s", busy);
		ck_assert_msg(comm > 0, "comm %g s", comm);
		ck_assert_msg(wait >= 0 && wait < busy + 1, "wait %g s", wait);
	}
	ts_k_timeline_free(tl);
}
END_TEST

/* cpu and sim kernels time themselves on their workers: no timeline. */
START_TEST(test_sim_keeps_no_device_timeline)
{
	struct ts_k_timeline *tl = (struct ts_k_timeline *)&err;

	ck_assert_int_eq(ts_k_timeline_new(kern, &tl, &err), TS_UNIMPLEMENTED);
	ck_assert_ptr_null(tl);
	ts_k_timeline_free(NULL);
}
END_TEST

/* ---- mixed precision ------------------------------------------------------------ */

/* The float32 value of a 16-bit pattern of compute dtype dt. */
static double widen(enum ts_compute dt, uint16_t h)
{
	return dt == TS_COMPUTE_BF16 ? ts_bf16_to_f32(h) : ts_f16_to_f32(h);
}

static uint16_t narrow(enum ts_compute dt, float f)
{
	return dt == TS_COMPUTE_BF16 ? ts_f32_to_bf16(f) : ts_f32_to_f16(f);
}

/* n 16-bit elements of device memory (as floats, rounded up). */
static uint16_t *dalloc16(size_t n)
{
	return (uint16_t *)(void *)dalloc((n + 1) / 2);
}

static void dget16(uint16_t *h, const uint16_t *d, size_t n)
{
	float *t = malloc(((n + 1) / 2) * sizeof *t);

	ck_assert_ptr_nonnull(t);
	dget(t, (const float *)(const void *)d, (n + 1) / 2);
	memcpy(h, t, n * sizeof *h);
	free(t);
}

/* round gives formats/convert.h's bits (round to nearest even, ties, signed
 * zeros, overflow to inf, subnormals, NaN quiet) for every element. */
START_TEST(test_lowp_round_is_converts)
{
	static const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f, 1.01171875f,
	                             1.0009765625f, 1.0029296875f, 3.4e38f, -3.4e38f, 65504.0f,
	                             65520.0f, 1e-40f, 6e-8f, 3e-8f, 2.9e-8f, INFINITY,
	                             -INFINITY, NAN};
	enum { N = 4096 };
	float *x = malloc(N * sizeof *x);
	uint16_t *got = malloc(N * sizeof *got);

	ck_assert_ptr_nonnull(x);
	ck_assert_ptr_nonnull(got);
	fill_rnd(x, N, 77, -3, 3);
	memcpy(x, edge, sizeof edge);
	for (int c = 0; c < 2; c++) {
		enum ts_compute dt = c ? TS_COMPUTE_F16 : TS_COMPUTE_BF16;
		float *dx = dput(x, N);
		uint16_t *dy = dalloc16(N);

		OK(ts_k_round(kern, q, dt, dx, dy, N, &err));
		dget16(got, dy, N);
		for (size_t i = 0; i < N; i++)
			ck_assert_msg(got[i] == narrow(dt, x[i]), "%s round of %.9g: 0x%04x, want 0x%04x",
			              ts_compute_name(dt), x[i], got[i], narrow(dt, x[i]));
	}
	free(x);
	free(got);
}
END_TEST

/* gemm_lp on rounded operands equals the float64 product of the rounded
 * values within float32 accumulation (1e-5 of the sum of |terms|, as the
 * float32 gemm's case: K <= 128 sums of exact products, each addition off
 * by at most 2^-24), and differs from the unrounded product by more: the
 * operands were rounded (bfloat16 keeps 8 significant bits, float16 11). */
static void gemm_lp_case(enum ts_compute dt, bool ta, bool tb, int M, int N, int K, float alpha,
                         float beta, unsigned seed)
{
	size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
	float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C0 = malloc(nc * sizeof *C0);
	float *C = malloc(nc * sizeof *C);
	uint16_t *A16 = malloc(na * sizeof *A16), *B16 = malloc(nb * sizeof *B16);
	float *dA, *dB, *dC;
	uint16_t *dA16, *dB16;
	double worst_unrounded = 0, tol_worst = 0;

	ck_assert(A && B && C0 && C && A16 && B16);
	fill_rnd(A, na, seed, -1, 1);
	fill_rnd(B, nb, seed + 1, -1, 1);
	fill_rnd(C0, nc, seed + 2, -1, 1);
	dA = dput(A, na);
	dB = dput(B, nb);
	dC = dput(C0, nc);
	dA16 = dalloc16(na);
	dB16 = dalloc16(nb);
	OK(ts_k_round(kern, q, dt, dA, dA16, na, &err));
	OK(ts_k_round(kern, q, dt, dB, dB16, nb, &err));
	OK(ts_k_gemm_lp(kern, q, dt, ta, tb, M, N, K, alpha, dA16, dB16, beta, dC, &err));
	dget(C, dC, nc);
	dget16(A16, dA16, na);
	dget16(B16, dB16, nb);
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double sum = 0, raw = 0, mag = 0, ref, c0 = C0[(size_t)i * N + j];

			for (int k = 0; k < K; k++) {
				size_t ia = ta ? (size_t)k * M + i : (size_t)i * K + k;
				size_t ib = tb ? (size_t)j * K + k : (size_t)k * N + j;
				double a = widen(dt, A16[ia]), b = widen(dt, B16[ib]);

				sum += a * b;
				raw += (double)A[ia] * B[ib];
				mag += fabs(a * b);
			}
			ref = alpha * sum + beta * c0;
			mag = fabs(alpha) * mag + fabs(beta * c0);
			ck_assert_msg(fabs(C[(size_t)i * N + j] - ref) <= 1e-5 * (mag + 1e-30),
			              "%s ta=%d tb=%d %dx%dx%d: C[%d,%d] = %.9g, want %.9g",
			              ts_compute_name(dt), ta, tb, M, N, K, i, j, C[(size_t)i * N + j],
			              ref);
			if (fabs(C[(size_t)i * N + j] - (alpha * raw + beta * c0)) > worst_unrounded) {
				worst_unrounded = fabs(C[(size_t)i * N + j] - (alpha * raw + beta * c0));
				tol_worst = 1e-5 * (mag + 1e-30);
			}
		}
	ck_assert_msg(K < 2 || worst_unrounded > tol_worst,
	              "%s %dx%dx%d: no element shows the rounding of the operands",
	              ts_compute_name(dt), M, N, K);
	free(A);
	free(B);
	free(C0);
	free(C);
	free(A16);
	free(B16);
}

START_TEST(test_lowp_gemm_all_transposes)
{
	static const int shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 65}, {64, 48, 128},
	                                {2, 130, 9}};

	for (int c = 0; c < 2; c++)
		for (int t = 0; t < 4; t++)
			for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
				enum ts_compute dt = c ? TS_COMPUTE_F16 : TS_COMPUTE_BF16;

				gemm_lp_case(dt, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2],
				             1.0f, 0.0f, (unsigned)(c * 100 + t * 10 + s));
				gemm_lp_case(dt, t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2],
				             -0.75f, 0.5f, (unsigned)(c * 100 + t * 10 + s + 50));
			}
}
END_TEST

/* Products enqueued back to back on two queues, none waited for before the
 * next: a queue's products share its warm float32 workspace, larger ones
 * take a new one while earlier products still wait to run in the old, and
 * the other queue's run beside them. Each must equal its own product
 * (checked as gemm_lp_case does, within float32 accumulation). */
START_TEST(test_lowp_gemm_back_to_back_on_two_queues)
{
	static const int shapes[][3] = {{64, 48, 128}, {5, 7, 3},   {130, 90, 200},
	                                {33, 17, 65},  {200, 150, 220}, {1, 1, 1},
	                                {96, 64, 100}};
	enum { NS = sizeof shapes / sizeof shapes[0], NC = 2 * NS };
	struct ts_queue *q2;
	struct {
		int M, N, K;
		uint16_t *dA16, *dB16;
		float *dC;
	} c[NC];

	OK(ts_queue_new(dev, &q2, &err));
	for (int i = 0; i < NC; i++) {
		int M = shapes[i % NS][0], N = shapes[i % NS][1], K = shapes[i % NS][2];
		size_t na = (size_t)M * K, nb = (size_t)K * N;
		float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B);

		ck_assert(A && B);
		fill_rnd(A, na, 900 + (unsigned)i, -1, 1);
		fill_rnd(B, nb, 950 + (unsigned)i, -1, 1);
		c[i].M = M;
		c[i].N = N;
		c[i].K = K;
		c[i].dA16 = dalloc16(na);
		c[i].dB16 = dalloc16(nb);
		c[i].dC = dalloc((size_t)M * N);
		OK(ts_k_round(kern, q, TS_COMPUTE_BF16, dput(A, na), c[i].dA16, na, &err));
		OK(ts_k_round(kern, q, TS_COMPUTE_BF16, dput(B, nb), c[i].dB16, nb, &err));
		free(A);
		free(B);
	}
	OK(ts_queue_sync(q, &err));
	for (int i = 0; i < NC; i++)
		OK(ts_k_gemm_lp(kern, i < NS ? q : q2, TS_COMPUTE_BF16, false, false, c[i].M, c[i].N,
		                c[i].K, 1.0f, c[i].dA16, c[i].dB16, 0.0f, c[i].dC, &err));
	OK(ts_queue_sync(q2, &err));
	OK(ts_queue_sync(q, &err));
	for (int i = 0; i < NC; i++) {
		int M = c[i].M, N = c[i].N, K = c[i].K;
		uint16_t *A16 = malloc((size_t)M * K * sizeof *A16);
		uint16_t *B16 = malloc((size_t)K * N * sizeof *B16);
		float *C = malloc((size_t)M * N * sizeof *C);

		ck_assert(A16 && B16 && C);
		dget16(A16, c[i].dA16, (size_t)M * K);
		dget16(B16, c[i].dB16, (size_t)K * N);
		dget(C, c[i].dC, (size_t)M * N);
		for (int r = 0; r < M; r++)
			for (int col = 0; col < N; col++) {
				double sum = 0, mag = 0;

				for (int k = 0; k < K; k++) {
					double t = widen(TS_COMPUTE_BF16, A16[(size_t)r * K + k]) *
					           widen(TS_COMPUTE_BF16, B16[(size_t)k * N + col]);

					sum += t;
					mag += fabs(t);
				}
				ck_assert_msg(fabs(C[(size_t)r * N + col] - sum) <= 1e-5 * (mag + 1e-30),
				              "product %d (%dx%dx%d): C[%d,%d] = %.9g, want %.9g", i, M, N,
				              K, r, col, C[(size_t)r * N + col], sum);
			}
		free(A16);
		free(B16);
		free(C);
	}
	ts_queue_free(q2);
}
END_TEST

START_TEST(test_lowp_bad_arguments_refused)
{
	float *x = dalloc(4);
	uint16_t *y = dalloc16(4);

	OK(ts_k_lowp_check(kern, TS_COMPUTE_F32, &err));
	REFUSED(ts_k_round(kern, q, TS_COMPUTE_F32, x, y, 4, &err));
	REFUSED(ts_k_round(kern, q, (enum ts_compute)7, x, y, 4, &err));
	REFUSED(ts_k_round(kern, q, TS_COMPUTE_BF16, NULL, y, 4, &err));
	REFUSED(ts_k_gemm_lp(kern, q, TS_COMPUTE_F32, false, false, 1, 1, 1, 1, y, y, 0, x, &err));
	REFUSED(ts_k_gemm_lp(kern, q, TS_COMPUTE_BF16, false, false, -1, 1, 1, 1, y, y, 0, x, &err));
	REFUSED(ts_k_gemm_lp(kern, q, TS_COMPUTE_F16, false, false, 1, 1, 1, 1, NULL, y, 0, x, &err));
	REFUSED(ts_k_lowp_check(kern, (enum ts_compute)7, &err));
	/* empty work enqueues nothing */
	OK(ts_k_round(kern, q, TS_COMPUTE_BF16, NULL, NULL, 0, &err));
	OK(ts_k_gemm_lp(kern, q, TS_COMPUTE_BF16, false, false, 0, 3, 3, 1, NULL, NULL, 0, NULL,
	                &err));
}
END_TEST

/* Every backend's kernels multiply in every compute dtype. */
START_TEST(test_lowp_supported)
{
	OK(ts_k_lowp_check(kern, TS_COMPUTE_BF16, &err));
	OK(ts_k_lowp_check(kern, TS_COMPUTE_F16, &err));
}
END_TEST

/* ---- transformer blocks ------------------------------------------------------ */

/* LayerNorm of one row in double: y, mean and rstd. */
static void ln_ref(const float *x, const float *g, const float *b, int d, double eps,
                   double *y, double *mean, double *rstd)
{
	double m = 0, v = 0;

	for (int c = 0; c < d; c++)
		m += x[c];
	m /= d;
	for (int c = 0; c < d; c++)
		v += (x[c] - m) * (x[c] - m);
	v /= d;
	*mean = m;
	*rstd = 1 / sqrt(v + eps);
	for (int c = 0; c < d; c++)
		y[c] = (x[c] - m) * *rstd * g[c] + b[c];
}

/* sum over the row of w[c] y[c](x), in double: a scalar whose gradient in
 * x is the row's dx for dy = w. */
static double ln_dot(const double *x, const float *g, const float *b, const float *w, int d,
                     double eps)
{
	double m = 0, v = 0, s = 0, r;

	for (int c = 0; c < d; c++)
		m += x[c];
	m /= d;
	for (int c = 0; c < d; c++)
		v += (x[c] - m) * (x[c] - m);
	r = 1 / sqrt(v / d + eps);
	for (int c = 0; c < d; c++)
		s += w[c] * ((x[c] - m) * r * g[c] + b[c]);
	return s;
}

/* LayerNorm forward against float64, and its gradients against central
 * finite differences of the float64 forward (dx) and the definitions (dg,
 * db). Rows of 300 (more than a block's lanes), centred off zero. */
START_TEST(test_layernorm_against_float64)
{
	enum { R = 9, D = 300 };
	const float eps = 1e-5f;
	float *x = malloc(R * D * sizeof *x), *dy = malloc(R * D * sizeof *dy);
	float g[D], b[D], y[R * D], st[2 * R], dx[R * D], dg[D], db[D];
	double yr[D], m, rs, xd[D];
	float *dX, *dG, *dB, *dY, *dS, *ddy, *ddx, *ddg, *ddb;

	fill_rnd(x, R * D, 61, 2.0f, 4.0f);
	fill_rnd(dy, R * D, 62, -1.0f, 1.0f);
	fill_rnd(g, D, 63, 0.5f, 1.5f);
	fill_rnd(b, D, 64, -0.5f, 0.5f);
	dX = dput(x, R * D);
	dG = dput(g, D);
	dB = dput(b, D);
	dY = dalloc(R * D);
	dS = dalloc(2 * R);
	ddy = dput(dy, R * D);
	ddx = dalloc(R * D);
	ddg = dalloc(D);
	ddb = dalloc(D);
	OK(ts_k_ln_fwd(kern, q, dX, dG, dB, R, D, eps, dY, dS, &err));
	OK(ts_k_ln_bwd(kern, q, dX, dG, dS, ddy, R, D, ddx, ddg, ddb, &err));
	dget(y, dY, R * D);
	dget(st, dS, 2 * R);
	dget(dx, ddx, R * D);
	dget(dg, ddg, D);
	dget(db, ddb, D);
	for (int r = 0; r < R; r++) {
		ln_ref(x + r * D, g, b, D, eps, yr, &m, &rs);
		ck_assert_msg(fabs(st[2 * r] - m) <= 1e-6 * fabs(m), "mean %d: %.9g, want %.9g", r,
		              st[2 * r], m);
		ck_assert_msg(fabs(st[2 * r + 1] - rs) <= 1e-6 * rs, "rstd %d: %.9g, want %.9g", r,
		              st[2 * r + 1], rs);
		for (int c = 0; c < D; c++)
			ck_assert_msg(fabs(y[r * D + c] - yr[c]) <= 2e-6 * (fabs(yr[c]) + 1),
			              "y[%d,%d] = %.9g, want %.9g", r, c, y[r * D + c], yr[c]);
		for (int c = 0; c < D; c++)
			xd[c] = x[r * D + c];
		for (int c = 0; c < D; c += 7) {
			double h = 1e-4, keep = xd[c], fd;

			xd[c] = keep + h;
			fd = ln_dot(xd, g, b, dy + r * D, D, eps);
			xd[c] = keep - h;
			fd = (fd - ln_dot(xd, g, b, dy + r * D, D, eps)) / (2 * h);
			xd[c] = keep;
			ck_assert_msg(fabs(dx[r * D + c] - fd) <= 1e-4 * (fabs(fd) + 1),
			              "dx[%d,%d] = %.9g, finite differences %.9g", r, c, dx[r * D + c], fd);
		}
	}
	for (int c = 0; c < D; c++) {
		double sg = 0, sb = 0;

		for (int r = 0; r < R; r++) {
			ln_ref(x + r * D, g, b, D, eps, yr, &m, &rs);
			sg += dy[r * D + c] * (x[r * D + c] - m) * rs;
			sb += dy[r * D + c];
		}
		ck_assert_msg(fabs(dg[c] - sg) <= 1e-5 * (fabs(sg) + 1), "dg[%d] = %.9g, want %.9g",
		              c, dg[c], sg);
		ck_assert_msg(fabs(db[c] - sb) <= 1e-6 * (fabs(sb) + 1), "db[%d] = %.9g, want %.9g",
		              c, db[c], sb);
	}
	free(x);
	free(dy);
}
END_TEST

/* add_rows adds a period's rows exactly; sum_rows sums each residue class
 * in increasing row order, as a double rounded once. */
START_TEST(test_add_and_sum_rows)
{
	enum { R = 50, N = 33, P = 7 };
	float y0[R * N], x[P * N], y[R * N], s[P * N];
	float *dY, *dX, *dO;

	fill_rnd(y0, R * N, 71, -2.0f, 2.0f);
	fill_rnd(x, P * N, 72, -2.0f, 2.0f);
	dY = dput(y0, R * N);
	dX = dput(x, P * N);
	dO = dalloc(P * N);
	OK(ts_k_add_rows(kern, q, dX, P, dY, R, N, &err));
	OK(ts_k_sum_rows(kern, q, dY, R, N, P, dO, &err));
	dget(y, dY, R * N);
	dget(s, dO, P * N);
	for (int r = 0; r < R; r++)
		for (int c = 0; c < N; c++)
			ck_assert(y[r * N + c] == y0[r * N + c] + x[(r % P) * N + c]);
	for (int p = 0; p < P; p++)
		for (int c = 0; c < N; c++) {
			double want = 0;

			for (int r = p; r < R; r += P)
				want += y[r * N + c];
			ck_assert_msg(s[p * N + c] == (float)want, "sum[%d,%d] = %.9g, want %.9g", p, c,
			              s[p * N + c], (float)want);
		}
	/* a bias: period 1 */
	OK(ts_k_sum_rows(kern, q, dY, R, N, 1, dO, &err));
	dget(s, dO, N);
	for (int c = 0; c < N; c++) {
		double want = 0;

		for (int r = 0; r < R; r++)
			want += y[r * N + c];
		ck_assert(s[c] == (float)want);
	}
}
END_TEST

/* [B, T, P, H, hd] to [P, B, H, T, hd] and back, element by element. */
START_TEST(test_heads_round_trip)
{
	enum { B = 2, T = 5, P = 3, H = 4, HD = 6, N = B * T * P * H * HD };
	float in[N], out[N], back[N];
	float *dI, *dO, *dB;

	for (int i = 0; i < N; i++)
		in[i] = (float)i;
	dI = dput(in, N);
	dO = dalloc(N);
	dB = dalloc(N);
	OK(ts_k_heads(kern, q, true, dI, dO, B, T, P, H, HD, &err));
	OK(ts_k_heads(kern, q, false, dO, dB, B, T, P, H, HD, &err));
	dget(out, dO, N);
	dget(back, dB, N);
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++)
			for (int p = 0; p < P; p++)
				for (int h = 0; h < H; h++)
					for (int e = 0; e < HD; e++) {
						int src = (((b * T + t) * P + p) * H + h) * HD + e;
						int dst = (((p * B + b) * H + h) * T + t) * HD + e;

						ck_assert_msg(out[dst] == in[src], "heads[%d] = %g, want %g",
						              dst, out[dst], in[src]);
					}
	ck_assert_mem_eq(back, in, sizeof in);
	REFUSED(ts_k_heads(kern, q, true, dI, dI + 1, B, T, P, H, HD, &err));
	REFUSED(ts_k_heads(kern, q, true, dI, dO, B, 0, P, H, HD, &err));
}
END_TEST

/* Batched products against float64, every transpose, strides with gaps:
 * the gaps between C's batches stay as they were. */
START_TEST(test_gemm_batched_against_float64)
{
	enum { M = 7, N = 9, K = 11, BATCH = 5, GAP = 3 };
	enum { SA = M * K + GAP, SB = K * N + GAP, SC = M * N + GAP };
	float A[SA * BATCH], Bm[SB * BATCH], C0[SC * BATCH], C[SC * BATCH];
	float *dA, *dB, *dC;

	fill_rnd(A, SA * BATCH, 81, -1.0f, 1.0f);
	fill_rnd(Bm, SB * BATCH, 82, -1.0f, 1.0f);
	fill_rnd(C0, SC * BATCH, 83, -1.0f, 1.0f);
	dA = dput(A, SA * BATCH);
	dB = dput(Bm, SB * BATCH);
	for (int t = 0; t < 4; t++) {
		bool ta = t & 1, tb = t & 2;
		float beta = t == 3 ? 0.5f : 0.0f;

		dC = dput(C0, SC * BATCH);
		OK(ts_k_gemm_batched(kern, q, ta, tb, M, N, K, 1.5f, dA, SA, dB, SB, beta, dC, SC,
		                     BATCH, &err));
		dget(C, dC, SC * BATCH);
		for (int i = 0; i < BATCH; i++) {
			const float *a = A + i * SA, *bb = Bm + i * SB;

			for (int r = 0; r < M; r++)
				for (int c = 0; c < N; c++) {
					double s = 0;

					for (int k = 0; k < K; k++)
						s += (double)(ta ? a[k * M + r] : a[r * K + k]) *
						     (tb ? bb[c * K + k] : bb[k * N + c]);
					s = 1.5 * s + beta * (double)C0[i * SC + r * N + c];
					ck_assert_msg(fabs(C[i * SC + r * N + c] - s) <= 1e-5 * (fabs(s) + 1),
					              "t %d batch %d C[%d,%d] = %.9g, want %.9g", t, i, r, c,
					              C[i * SC + r * N + c], s);
				}
			for (int gI = M * N; gI < SC; gI++)
				ck_assert(C[i * SC + gI] == C0[i * SC + gI]);
		}
	}
	REFUSED(ts_k_gemm_batched(kern, q, false, false, M, N, K, 1, dA, SA, dB, SB, 0, dC, 10,
	                          BATCH, &err));
	REFUSED(ts_k_gemm_batched(kern, q, false, false, M, N, K, 1, dA, SA, dB, SB, 0, dC, SC,
	                          -1, &err));
	OK(ts_k_gemm_batched(kern, q, false, false, M, N, K, 1, dA, SA, dB, SB, 0, dC, SC, 0, &err));
	/* K = 0: C = beta C in each batch, the gaps kept */
	dC = dput(C0, SC * BATCH);
	OK(ts_k_gemm_batched(kern, q, false, false, M, N, 0, 1, NULL, 0, NULL, 0, 0.5f, dC, SC,
	                     BATCH, &err));
	dget(C, dC, SC * BATCH);
	for (int e = 0; e < SC * BATCH; e++)
		ck_assert(C[e] == (e % SC < M * N ? 0.5f * C0[e] : C0[e]));
}
END_TEST

/* Batched products of 16-bit operands (bfloat16, float16) against float64
 * of the rounded values, every transpose, strides with gaps (rounded whole,
 * gaps and all, as a plan rounds a dense operand): each batch within float32
 * accumulation (as gemm_lp_case), the gaps between C's batches kept; K = 0
 * scales C; bad arguments refused. */
START_TEST(test_lowp_gemm_batched_against_float64)
{
	enum { M = 6, N = 10, K = 13, BATCH = 4, GAP = 5 };
	enum { SA = M * K + GAP, SB = K * N + GAP, SC = M * N + GAP };
	float A[SA * BATCH], Bm[SB * BATCH], C0[SC * BATCH], C[SC * BATCH];
	uint16_t A16[SA * BATCH], B16[SB * BATCH];

	fill_rnd(A, SA * BATCH, 181, -1.0f, 1.0f);
	fill_rnd(Bm, SB * BATCH, 182, -1.0f, 1.0f);
	fill_rnd(C0, SC * BATCH, 183, -1.0f, 1.0f);
	for (int c = 0; c < 2; c++) {
		enum ts_compute dt = c ? TS_COMPUTE_F16 : TS_COMPUTE_BF16;
		float *dA = dput(A, SA * BATCH), *dB = dput(Bm, SB * BATCH), *dC;
		uint16_t *dA16 = dalloc16(SA * BATCH), *dB16 = dalloc16(SB * BATCH);

		OK(ts_k_round(kern, q, dt, dA, dA16, SA * BATCH, &err));
		OK(ts_k_round(kern, q, dt, dB, dB16, SB * BATCH, &err));
		dget16(A16, dA16, SA * BATCH);
		dget16(B16, dB16, SB * BATCH);
		for (int t = 0; t < 4; t++) {
			bool ta = t & 1, tb = t & 2;
			float beta = t == 3 ? 0.5f : 0.0f;

			dC = dput(C0, SC * BATCH);
			OK(ts_k_gemm_batched_lp(kern, q, dt, ta, tb, M, N, K, 1.5f, dA16, SA, dB16, SB,
			                        beta, dC, SC, BATCH, &err));
			dget(C, dC, SC * BATCH);
			for (int i = 0; i < BATCH; i++) {
				const uint16_t *a = A16 + i * SA, *bb = B16 + i * SB;

				for (int r = 0; r < M; r++)
					for (int col = 0; col < N; col++) {
						double sum = 0, mag = 0, want, c0 = C0[i * SC + r * N + col];

						for (int k = 0; k < K; k++) {
							double x = widen(dt, ta ? a[k * M + r] : a[r * K + k]);
							double y = widen(dt, tb ? bb[col * K + k] : bb[k * N + col]);

							sum += x * y;
							mag += fabs(x * y);
						}
						want = 1.5 * sum + beta * c0;
						mag = 1.5 * mag + fabs(beta * c0);
						ck_assert_msg(fabs(C[i * SC + r * N + col] - want) <= 1e-5 * mag + 1e-30,
						              "%s t %d batch %d C[%d,%d] = %.9g, want %.9g",
						              ts_compute_name(dt), t, i, r, col,
						              C[i * SC + r * N + col], want);
					}
				for (int gI = M * N; gI < SC; gI++)
					ck_assert(C[i * SC + gI] == C0[i * SC + gI]);
			}
		}
		/* K = 0: C = beta C, no operand read */
		dC = dput(C0, SC * BATCH);
		OK(ts_k_gemm_batched_lp(kern, q, dt, false, false, M, N, 0, 1, NULL, 0, NULL, 0, 0.5f,
		                        dC, SC, BATCH, &err));
		dget(C, dC, SC * BATCH);
		for (int i = 0; i < BATCH; i++)
			for (int e = 0; e < M * N; e++)
				ck_assert(C[i * SC + e] == 0.5f * C0[i * SC + e]);
		REFUSED(ts_k_gemm_batched_lp(kern, q, TS_COMPUTE_F32, false, false, M, N, K, 1, dA16,
		                             SA, dB16, SB, 0, dC, SC, BATCH, &err));
		REFUSED(ts_k_gemm_batched_lp(kern, q, dt, false, false, M, N, K, 1, dA16, SA, dB16,
		                             SB, 0, dC, 10, BATCH, &err));
		REFUSED(ts_k_gemm_batched_lp(kern, q, dt, false, false, M, N, K, 1, NULL, SA, dB16,
		                             SB, 0, dC, SC, BATCH, &err));
		REFUSED(ts_k_gemm_batched_lp(kern, q, dt, false, false, M, N, K, 1, dA16, SA, dB16,
		                             SB, 0, dC, SC, -1, &err));
		OK(ts_k_gemm_batched_lp(kern, q, dt, false, false, M, N, K, 1, dA16, SA, dB16, SB, 0,
		                        dC, SC, 0, &err));
	}
}
END_TEST

/* Products large enough for the CPU kernels to cut into tiles for their
 * team (kernels_cpu.c), through ts_k_gemm and ts_k_gemm_batched, against
 * one single-threaded cblas_sgemm of the whole product (the kernels set
 * OpenBLAS to one thread): the same bits, with operands at any offset, as
 * tiles cut along the output's rows and columns only sum each element as
 * the whole call does. Shapes: edges that are multiples of the tiles' 64
 * and not, K inside and past OpenBLAS's K blocks, one batch whose
 * products are cut too, a wide output over a short K (a tied LM
 * head's proportions), cut along both, and a small output over a long K (a
 * weight's gradient), cut as far as its edges allow. The cut follows the
 * team's size, so a machine with more CPUs runs other cuts of the same
 * shapes. */
static void tiles_case(bool ta, bool tb, int M, int N, int K, int batch, float beta, int shift,
                       unsigned seed)
{
	size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
	float *A = malloc((na * batch + 1) * sizeof *A), *B = malloc((nb * batch + 1) * sizeof *B);
	float *C0 = malloc((nc * batch + 1) * sizeof *C0), *C = malloc(nc * batch * sizeof *C);
	float *W = malloc(nc * batch * sizeof *W);
	struct ts_m_colmajor_gemm g = ts_m_gemm_colmajor(ta, tb, M, N, K);
	float *dA, *dB, *dC;

	fill_rnd(A, na * batch + 1, seed, -1, 1);
	fill_rnd(B, nb * batch + 1, seed + 1, -1, 1);
	fill_rnd(C0, nc * batch + 1, seed + 2, -1, 1);
	/* operands `shift` floats past where dput puts them */
	dA = dput(A, na * batch + 1) + shift;
	dB = dput(B, nb * batch + 1) + shift;
	dC = dput(C0, nc * batch + 1) + shift;
	if (batch == 1)
		OK(ts_k_gemm(kern, q, ta, tb, M, N, K, 1.0f, dA, dB, beta, dC, &err));
	else
		OK(ts_k_gemm_batched(kern, q, ta, tb, M, N, K, 1.0f, dA, na, dB, nb, beta, dC, nc,
		                     batch, &err));
	dget(C, dC, nc * batch);
	memcpy(W, C0 + shift, nc * batch * sizeof *W);
	for (int i = 0; i < batch; i++)
		cblas_sgemm(CblasColMajor, g.transa ? CblasTrans : CblasNoTrans,
		            g.transb ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.0f,
		            B + shift + i * nb, g.lda, A + shift + i * na, g.ldb, beta, W + i * nc,
		            g.ldc);
	for (size_t e = 0; e < nc * batch; e++)
		ck_assert_msg(memcmp(&C[e], &W[e], sizeof *C) == 0,
		              "ta=%d tb=%d %dx%dx%d batch %d: C[%zu] = %.9g, the whole product's "
		              "%.9g", ta, tb, M, N, K, batch, e, C[e], W[e]);
	free(A);
	free(B);
	free(C0);
	free(C);
	free(W);
	dfree_all();
}

START_TEST(test_gemm_tiles_same_bits_as_one_call)
{
	static const int shapes[][4] = {{256, 1024, 256, 1}, {300, 1000, 777, 1},
	                                {130, 700, 513, 1}, {333, 257, 1500, 1},
	                                {2048, 256, 64, 1}, {256, 256, 64, 3},
	                                {512, 2048, 256, 1}, {256, 256, 2048, 1}};

	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
		for (int t = 0; t < 4; t++)
			tiles_case(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
			           t == 3 ? 0.5f : 0.0f, (int)(s + t) % 2, (unsigned)(40 * s + t));
	/* and against float64, cut as it is */
	gemm_case(false, true, 300, 200, 513, 1.0f, 0.5f, 977);
}
END_TEST

/* Causal softmax and its gradient against float64: row i of each block
 * weighs columns 0..i, rows sum to 1, nothing above the diagonal; T = 300
 * rows are longer than a block's lanes. In place (dS == dP) too. */
START_TEST(test_softmax_causal_against_float64)
{
	static const int Ts[] = {1, 70, 300};

	for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
		const int T = Ts[ti], BATCH = 2;
		const float scale = 0.125f;
		size_t n = (size_t)BATCH * T * T;
		float *S = malloc(n * sizeof *S), *dP = malloc(n * sizeof *dP);
		float *P = malloc(n * sizeof *P), *dS = malloc(n * sizeof *dS);
		double *e = malloc(T * sizeof *e);
		float *d_S, *d_P, *d_dP;

		fill_rnd(S, n, 91, -40.0f, 40.0f);
		fill_rnd(dP, n, 92, -1.0f, 1.0f);
		d_S = dput(S, n);
		d_P = dalloc(n);
		d_dP = dput(dP, n);
		OK(ts_k_softmax_causal_fwd(kern, q, d_S, BATCH, T, scale, d_P, &err));
		OK(ts_k_softmax_causal_bwd(kern, q, d_P, d_dP, BATCH, T, scale, d_dP, &err));
		dget(P, d_P, n);
		dget(dS, d_dP, n);
		for (int r = 0; r < BATCH * T; r++) {
			int i = r % T;
			const float *sr = S + (size_t)r * T, *pr = P + (size_t)r * T;
			const float *dpr = dP + (size_t)r * T, *dsr = dS + (size_t)r * T;
			double max = -INFINITY, sum = 0, pdp = 0, psum = 0;

			for (int j = 0; j <= i; j++)
				max = fmax(max, (double)(sr[j] * scale));
			for (int j = 0; j <= i; j++)
				sum += e[j] = exp((double)(sr[j] * scale) - max);
			for (int j = 0; j <= i; j++)
				pdp += e[j] / sum * dpr[j];
			for (int j = 0; j < T; j++) {
				double p = j <= i ? e[j] / sum : 0;
				double ds = j <= i ? scale * p * (dpr[j] - pdp) : 0;

				ck_assert_msg(fabs(pr[j] - p) <= 1e-7 + 1e-6 * p,
				              "T %d P[%d,%d] = %.9g, want %.9g", T, r, j, pr[j], p);
				ck_assert_msg(fabs(dsr[j] - ds) <= 1e-7 + 1e-5 * fabs(ds),
				              "T %d dS[%d,%d] = %.9g, want %.9g", T, r, j, dsr[j], ds);
				if (j > i)
					ck_assert(pr[j] == 0.0f && dsr[j] == 0.0f);
				psum += pr[j];
			}
			ck_assert_msg(fabs(psum - 1) <= 1e-5, "row %d sums to %.9g", r, psum);
		}
		free(S);
		free(dP);
		free(P);
		free(dS);
		free(e);
	}
	REFUSED(ts_k_softmax_causal_fwd(kern, q, dalloc(4), 1, 0, 1.0f, dalloc(4), &err));
	REFUSED(ts_k_softmax_causal_fwd(kern, q, dalloc(4), 1, 2, INFINITY, dalloc(4), &err));
	REFUSED(ts_k_ln_fwd(kern, q, dalloc(4), dalloc(4), dalloc(4), 1, 4, 0.0f, dalloc(4),
	                    dalloc(2), &err));
	REFUSED(ts_k_ln_fwd(kern, q, dalloc(4), dalloc(4), dalloc(4), 1, 0, 1e-5f, dalloc(4),
	                    dalloc(2), &err));
	REFUSED(ts_k_add_rows(kern, q, dalloc(4), 0, dalloc(4), 1, 4, &err));
}
END_TEST

/* The transformer kernels on CUDA against the CPU's on the same inputs:
 * every one bit for bit (their sums run in the lanes' and the rows' fixed
 * orders, their exp is kernels_math.h's own), the batched products within
 * cuBLAS's order of sums. */
START_TEST(test_cuda_matches_cpu_transformer_bit_for_bit)
{
	enum { R = 600, D = 272, T = 300, BT = 4, P = 7 };
	float *x = x_inputs(R * D, 101, -3, 5), *dy = x_inputs(R * D, 102, -1, 1);
	float *g = x_inputs(D, 103, 0.5f, 1.5f), *bb = x_inputs(D, 104, -0.5f, 0.5f);
	float *s = x_inputs((size_t)BT * T * T, 105, -30, 30);
	float *dp = x_inputs((size_t)BT * T * T, 106, -1, 1);
	struct xbuf X = xput(x, R * D), DY = xput(dy, R * D), G = xput(g, D), B = xput(bb, D);
	struct xbuf Y = xput(x, R * D), ST = xput(x, 2 * R), DX = xput(x, R * D);
	struct xbuf DG = xput(g, D), DB = xput(g, D), O = xput(x, P * D), HD = xput(x, R * D);
	struct xbuf S = xput(s, (size_t)BT * T * T), PP = xput(s, (size_t)BT * T * T);
	struct xbuf DP = xput(dp, (size_t)BT * T * T), C = xput(x, 8 * 24 * 24);
	/* the bfloat16 copies of X's first 2 * 8 * 24 * 17 floats (16 bits each) */
	struct xbuf X16 = xput(x, 8 * 24 * 17), CL = xput(x, 8 * 24 * 24);

	for (int b = 0; b < 2; b++) {
		OK(ts_k_ln_fwd(xk[b], xq[b], X.d[b], G.d[b], B.d[b], R, D, 1e-5f, Y.d[b], ST.d[b],
		               &err));
		OK(ts_k_ln_bwd(xk[b], xq[b], X.d[b], G.d[b], ST.d[b], DY.d[b], R, D, DX.d[b], DG.d[b],
		               DB.d[b], &err));
		OK(ts_k_add_rows(xk[b], xq[b], G.d[b], 1, DY.d[b], R, D, &err));
		OK(ts_k_sum_rows(xk[b], xq[b], DY.d[b], R, D, P, O.d[b], &err));
		/* 600 x 272 rows as [B 2, T 3, P 2, H 4, hd 17] ... wider: [4, 25, 3, 8, 17] */
		OK(ts_k_heads(xk[b], xq[b], true, X.d[b], HD.d[b], 4, 25, 3, 8, 17, &err));
		OK(ts_k_softmax_causal_fwd(xk[b], xq[b], S.d[b], BT, T, 0.0883883f, PP.d[b], &err));
		OK(ts_k_softmax_causal_bwd(xk[b], xq[b], PP.d[b], DP.d[b], BT, T, 0.0883883f, DP.d[b],
		                           &err));
		OK(ts_k_gemm_batched(xk[b], xq[b], false, true, 24, 24, 17, 0.25f, X.d[b], 24 * 17,
		                     X.d[b] + 5, 24 * 17, 0.0f, C.d[b], 24 * 24, 8, &err));
		OK(ts_k_round(xk[b], xq[b], TS_COMPUTE_BF16, X.d[b], (uint16_t *)(void *)X16.d[b],
		              2 * 8 * 24 * 17, &err));
		OK(ts_k_gemm_batched_lp(xk[b], xq[b], TS_COMPUTE_BF16, true, false, 24, 24, 17, 1.0f,
		                        (const uint16_t *)(void *)X16.d[b], 24 * 17,
		                        (const uint16_t *)(void *)X16.d[b] + 8 * 24 * 17, 24 * 17,
		                        0.0f, CL.d[b], 24 * 24, 8, &err));
	}
	xcheck(&Y, 0, 0, "layernorm");
	xcheck(&ST, 0, 0, "layernorm statistics");
	xcheck(&DX, 0, 0, "layernorm input gradient");
	xcheck(&DG, 0, 0, "layernorm scale gradient");
	xcheck(&DB, 0, 0, "layernorm shift gradient");
	xcheck(&DY, 0, 0, "add rows");
	xcheck(&O, 0, 0, "sum rows");
	xcheck(&HD, 0, 0, "heads");
	xcheck(&PP, 1, 0, "causal softmax");
	xcheck(&DP, 2, 1e-12, "causal softmax gradient");
	xcheck(&C, 64, 1e-5, "batched gemm");
	xcheck(&X16, 0, 0, "bfloat16 rounding");
	xcheck(&CL, 64, 1e-5, "batched bfloat16 gemm");
	xfree(&X16);
	xfree(&CL);
	xfree(&X);
	xfree(&DY);
	xfree(&G);
	xfree(&B);
	xfree(&Y);
	xfree(&ST);
	xfree(&DX);
	xfree(&DG);
	xfree(&DB);
	xfree(&O);
	xfree(&HD);
	xfree(&S);
	xfree(&PP);
	xfree(&DP);
	xfree(&C);
	free(x);
	free(dy);
	free(g);
	free(bb);
	free(s);
	free(dp);
}
END_TEST

/* Rows shorter than a block's lanes (a context's scores, a narrow model's
 * LayerNorm) run in blocks only as wide as the row needs: the same sums as
 * the CPU's TS_RED_LANES lanes, so the same bits. Widths below a warp, at
 * and between powers of two, and just under the block's lanes. */
START_TEST(test_cuda_matches_cpu_short_rows_bit_for_bit)
{
	static const int widths[] = {1, 7, 16, 24, 32, 33, 64, 100, 128, 129, 255};

	for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
		const int D = widths[w], T = widths[w], R = 3 * T, BT = 3;
		float *x = x_inputs((size_t)R * D, 201 + (unsigned)w, -3, 5);
		float *dy = x_inputs((size_t)R * D, 301 + (unsigned)w, -1, 1);
		float *g = x_inputs((size_t)D, 401 + (unsigned)w, 0.5f, 1.5f);
		float *bb = x_inputs((size_t)D, 501 + (unsigned)w, -0.5f, 0.5f);
		float *sc = x_inputs((size_t)BT * T * T, 601 + (unsigned)w, -30, 30);
		float *dp = x_inputs((size_t)BT * T * T, 701 + (unsigned)w, -1, 1);
		struct xbuf X = xput(x, (size_t)R * D), DY = xput(dy, (size_t)R * D);
		struct xbuf G = xput(g, (size_t)D), B = xput(bb, (size_t)D);
		struct xbuf Y = xput(x, (size_t)R * D), ST = xput(x, 2 * (size_t)R);
		struct xbuf DX = xput(x, (size_t)R * D), DG = xput(g, (size_t)D), DB = xput(g, (size_t)D);
		struct xbuf S = xput(sc, (size_t)BT * T * T), PP = xput(sc, (size_t)BT * T * T);
		struct xbuf DP = xput(dp, (size_t)BT * T * T);
		char what[64];

		for (int b = 0; b < 2; b++) {
			OK(ts_k_ln_fwd(xk[b], xq[b], X.d[b], G.d[b], B.d[b], R, D, 1e-5f, Y.d[b],
			               ST.d[b], &err));
			OK(ts_k_ln_bwd(xk[b], xq[b], X.d[b], G.d[b], ST.d[b], DY.d[b], R, D, DX.d[b],
			               DG.d[b], DB.d[b], &err));
			OK(ts_k_softmax_causal_fwd(xk[b], xq[b], S.d[b], BT, T, 0.25f, PP.d[b], &err));
			OK(ts_k_softmax_causal_bwd(xk[b], xq[b], PP.d[b], DP.d[b], BT, T, 0.25f,
			                           DP.d[b], &err));
		}
		snprintf(what, sizeof what, "layernorm (rows of %d)", D);
		xcheck(&Y, 0, 0, what);
		xcheck(&ST, 0, 0, what);
		snprintf(what, sizeof what, "layernorm input gradient (rows of %d)", D);
		xcheck(&DX, 0, 0, what);
		snprintf(what, sizeof what, "causal softmax (rows of %d)", T);
		xcheck(&PP, 1, 0, what);
		snprintf(what, sizeof what, "causal softmax gradient (rows of %d)", T);
		xcheck(&DP, 2, 1e-12, what);
		xfree(&X);
		xfree(&DY);
		xfree(&G);
		xfree(&B);
		xfree(&Y);
		xfree(&ST);
		xfree(&DX);
		xfree(&DG);
		xfree(&DB);
		xfree(&S);
		xfree(&PP);
		xfree(&DP);
		free(x);
		free(dy);
		free(g);
		free(bb);
		free(sc);
		free(dp);
	}
}
END_TEST

/* The transformer blocks' cases (k_ln_*, k_add_rows, k_sum_rows, k_heads,
 * k_softmax_*, the batched products). */
static void add_transformer(TCase *tc)
{
	tcase_add_test(tc, test_layernorm_against_float64);
	tcase_add_test(tc, test_add_and_sum_rows);
	tcase_add_test(tc, test_heads_round_trip);
	tcase_add_test(tc, test_gemm_batched_against_float64);
	tcase_add_test(tc, test_softmax_causal_against_float64);
}

/* The mixed-precision cases (k_round, cublasGemmEx). */
static void add_lowp(TCase *tc)
{
	tcase_add_test(tc, test_lowp_round_is_converts);
	tcase_add_test(tc, test_lowp_gemm_all_transposes);
	tcase_add_test(tc, test_lowp_gemm_back_to_back_on_two_queues);
	tcase_add_test(tc, test_lowp_bad_arguments_refused);
	tcase_add_test(tc, test_lowp_supported);
	tcase_add_test(tc, test_lowp_gemm_batched_against_float64);
}

static void add_common(TCase *tc)
{
	tcase_add_test(tc, test_gemm_all_transposes);
	tcase_add_test(tc, test_gemm_empty_sizes);
	tcase_add_test(tc, test_activations_forward);
	tcase_add_test(tc, test_activations_backward);
	tcase_add_test(tc, test_loss_sum_and_mse);
	tcase_add_test(tc, test_sumsq_accumulates);
	tcase_add_test(tc, test_add_and_fill);
	tcase_add_test(tc, test_sgd_updates);
	tcase_add_test(tc, test_adam_without_clipping);
	tcase_add_test(tc, test_adam_with_clipping);
	tcase_add_test(tc, test_adamw_updates);
	tcase_add_test(tc, test_warmup_cosine_schedule);
	tcase_add_test(tc, test_mlp_gradients_match_finite_differences);
	tcase_add_test(tc, test_bad_arguments_refused);
	tcase_add_test(tc, test_native_queue_handle);
}

/* The token kernels' cases (k_embed_fwd, k_embed_bwd, k_xent_rows,
 * k_xent_mean). */
static void add_tokens(TCase *tc)
{
	tcase_add_test(tc, test_embedding_gather_and_scatter_add);
	tcase_add_test(tc, test_softmax_cross_entropy);
}

Suite *ts_unit_suite(void)
{
	bool cuda = ts_unit_cuda();
	Suite *s = suite_create("kernels");
	TCase *tc = tcase_create("sim");

	tcase_add_checked_fixture(tc, setup_sim, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_names_round_trip);
	tcase_add_test(tc, test_gemm_colmajor_mapping);
	add_common(tc);
	add_tokens(tc);
	add_transformer(tc);
	add_lowp(tc);
	tcase_add_test(tc, test_same_sequence_same_bits);
	tcase_add_test(tc, test_exp_neg_within_an_ulp);
	tcase_add_test(tc, test_exp_negf_within_an_ulp);
	tcase_add_test(tc, test_tanh_within_an_ulp);
	tcase_add_test(tc, test_tanh_rational_within_5_ulps);
	tcase_add_test(tc, test_softmax_cross_entropy_wide_rows_same_bits);
	tcase_add_test(tc, test_updates_match_the_formulas_bit_for_bit);
	tcase_add_test(tc, test_queues_share_kernels);
	tcase_add_test(tc, test_gemm_tiles_same_bits_as_one_call);
	tcase_add_test(tc, test_kernels_run_later_in_queue_order);
	tcase_add_test(tc, test_sim_kernels_run_on_cpu_queues);
	tcase_add_test(tc, test_sim_keeps_no_device_timeline);
	suite_add_tcase(s, tc);
	if (cuda) {
		/* cuBLAS and the CUDA kernels; reductions are deterministic
		 * there too, whatever the block order */
		tc = tcase_create("cuda");
		tcase_add_checked_fixture(tc, setup_cuda, teardown);
		tcase_set_timeout(tc, 300);
		add_common(tc);
		add_tokens(tc);
		add_transformer(tc);
		add_lowp(tc);
		tcase_add_test(tc, test_same_sequence_same_bits);
		tcase_add_test(tc, test_cuda_kernels_made_per_step);
		tcase_add_test(tc, test_cuda_kernels_free_does_not_wait_for_the_device);
		tcase_add_test(tc, test_cuda_timeline_times_the_stream);
		suite_add_tcase(s, tc);
		tc = tcase_create("cuda_vs_cpu");
		tcase_add_checked_fixture(tc, setup_both, teardown_both);
		tcase_set_timeout(tc, 300);
		tcase_add_test(tc, test_cuda_matches_cpu_elementwise);
		tcase_add_test(tc, test_cuda_matches_cpu_reductions_bit_for_bit);
		tcase_add_test(tc, test_cuda_matches_cpu_updates);
		tcase_add_test(tc, test_cuda_matches_cpu_gemm);
		tcase_add_test(tc, test_cuda_matches_cpu_tokens_bit_for_bit);
		tcase_add_test(tc, test_cuda_matches_cpu_transformer_bit_for_bit);
		tcase_add_test(tc, test_cuda_matches_cpu_short_rows_bit_for_bit);
		suite_add_tcase(s, tc);
	}
	return s;
}
