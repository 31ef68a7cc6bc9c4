/*
 * bench_train.c - a training step on the CPU path (a sim device: OpenBLAS
 * sgemm and the plain C kernels), planned and executed in process, against
 * a roofline measured in the same run:
 *
 *   roofline = FLOPs / (cblas_sgemm's rate on the step's own GEMM shapes
 *              and transpositions, warmed up, best of a few, FLOP-weighted)
 *            + the optimizer's bytes / (memory bandwidth: 2 x memcpy's rate,
 *              as a memcpy reads and writes every byte it copies)
 *
 * where the FLOPs are the textbook count (2 B d h per matmul, two matmuls
 * per layer forward, twice that backward; the configurations here
 * recompute nothing) and the optimizer's bytes are, per parameter, Adam's
 * p, g, mu and nu read and p, mu and nu written (plus g read once more for
 * the global norm every step reports: the plan's SUMSQ passes).
 * Rows: the guide's 10-layer model and a 4-layer d = h = 2048 model with
 * Adam, each as the fraction of its roofline reached (target >= 0.85); the
 * guide in bfloat16 (target >= 0.85) against the sgemm roofline plus, at
 * the measured memory rate, the passes the CPU makes that a float32 step
 * does not: each product's operands rounded (4 bytes read and 2 written an
 * element) and widened back for sgemm (2 read, 4 written); a token model
 * (embedding [8192, 256], 4 layers d 256 h 1024, projection, softmax
 * cross-entropy, Adam, 256 tokens; target >= 0.7: its scatter, gather and
 * softmax are not in the roofline); the three float32 models each against
 * JAX on the CPU running the same model, shapes and optimizer on this
 * machine in this run (tests/bench/jax_train.py, jax.jit; ratio JAX's time
 * over ours, target >= 1: tstage faster; skipped without jax); the Adam
 * model with params and optimizer state on pinned_host (prefetch 1) over
 * the same model all on the device (target <= 1.15), run interleaved so
 * that drift falls on both alike; and a data-driven run (a session drawing
 * each step's batch from rows of a pinned_host dataset, staged while the
 * step before computes) over the same number of fixed-batch steps (target
 * <= 1.05), interleaved too. Each time is the best of a few after a
 * warm-up.
 */
#include <cblas.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/units.h"
#include "device/backend.h"
#include "tests/bench/benchlib.h"
#include "train/exec.h"
#include "train/session.h"

#define MiB (1ull << 20)

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_space *dsp, *psp;
static struct ts_kernels *kern;
static struct ts_exec_env env;

static void die(const char *what, const struct ts_error *err)
{
	fprintf(stderr, "bench_train: %s: %s\n", what, err ? err->message : "failed");
	exit(1);
}

static double now_s(void)
{
	return (double)ts_now_ns() / 1e9;
}

/* ---- references ---------------------------------------------------------------- */

/* Deterministic values in [lo, hi). */
static void fill(float *x, size_t n, unsigned seed, float lo, float hi)
{
	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		x[i] = lo + (hi - lo) * (float)(seed >> 8) / 16777216.0f;
	}
}

/* Deterministic int32 token ids in [0, vocab). */
static void fill_ids(void *ids, size_t n, unsigned seed, int vocab)
{
	int32_t *x = ids;

	for (size_t i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		x[i] = (int32_t)((seed >> 8) % (unsigned)vocab);
	}
}

/* cblas_sgemm's best rate (FLOP/s) on one shape, in this process, with
 * OpenBLAS's own threads, one per CPU (the kernels set it to one thread:
 * they share a product's tiles among threads of their own). */
static double sgemm_rate(int M, int N, int K, bool ta, bool tb)
{
	int threads = openblas_get_num_threads();
	size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
	float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = malloc(nc * sizeof *C);
	double flops = 2.0 * M * N * K, best = 0;
	int reps;

	if (!A || !B || !C)
		die("sgemm buffers", NULL);
	fill(A, na, 1, -1, 1);
	fill(B, nb, 2, -1, 1);
	memset(C, 0, nc * sizeof *C);
	openblas_set_num_threads((int)sysconf(_SC_NPROCESSORS_ONLN));
	/* warm up (threads, pages), and size a run to ~30 ms */
	{
		double t0 = now_s();

		cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
		            M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C, N);
		reps = (int)(0.03 / fmax(now_s() - t0, 1e-6)) + 1;
	}
	for (int r = 0; r < 5; r++) {
		double t0 = now_s(), rate;

		for (int i = 0; i < reps; i++)
			cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
			            tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, ta ? M : K, B,
			            tb ? K : N, 0.0f, C, N);
		rate = flops * reps / (now_s() - t0);
		if (rate > best)
			best = rate;
	}
	openblas_set_num_threads(threads);
	free(A);
	free(B);
	free(C);
	return best;
}

/* memcpy's best rate (bytes copied per second) on 256 MiB, touched first. */
static double memcpy_rate(void)
{
	size_t n = 256 * MiB;
	char *a = malloc(n), *b = malloc(n);
	double best = 0;

	if (!a || !b)
		die("memcpy buffers", NULL);
	memset(a, 1, n);
	memset(b, 2, n);
	for (int r = 0; r < 4; r++) {
		double t0 = now_s(), rate;

		memcpy(b, a, n);
		rate = (double)n / (now_s() - t0);
		if (rate > best)
			best = rate;
	}
	free(a);
	free(b);
	return best;
}

/* ---- a planned step with its arguments ------------------------------------------- */

struct job {
	struct ts_plan plan;
	void **args;
	void **outs;                 /* new memory of the versioned arguments */
	int step;
};

static void job_new(const struct ts_mlp *m, const struct ts_optimizer *o, int batch,
                    const struct ts_policy *pol, struct job *j)
{
	struct ts_error err;

	ts_error_clear(&err);
	if (ts_plan_build(m, o, batch, pol, &j->plan, &err) != TS_OK)
		die("plan", &err);
	j->args = calloc((size_t)j->plan.nbufs, sizeof *j->args);
	j->outs = calloc((size_t)j->plan.nbufs, sizeof *j->outs);
	j->step = 0;
	if (!j->args || !j->outs)
		die("args", NULL);
	for (int i = 0; i < j->plan.nbufs; i++) {
		const struct ts_pbuf *b = &j->plan.bufs[i];
		float *x;
		size_t n = b->bytes / sizeof *x;
		int kind, t;

		if (b->cls == TS_PB_TEMP)
			continue;
		if (ts_space_alloc(b->kind == TS_MEM_DEVICE ? dsp : psp, b->bytes, &j->args[i], &err) != TS_OK)
			die("argument", &err);
		if (b->versioned &&
		    ts_space_alloc(b->kind == TS_MEM_DEVICE ? dsp : psp, b->bytes, &j->outs[i], &err) != TS_OK)
			die("argument", &err);
		/* sim device memory is host memory: written directly */
		x = j->args[i];
		if (ts_gpt_role_of(b->role, &kind, &t)) {
			if (kind != 0)
				memset(x, 0, b->bytes);
			else if (ts_gpt_param_is_matrix((enum ts_gpt_param)t))
				fill(x, n, 60 + (unsigned)t, -0.02f, 0.02f);
			else
				for (size_t e = 0; e < n; e++)
					x[e] = ts_gpt_param_is_scale((enum ts_gpt_param)t) ? 1.0f : 0.0f;
			continue;
		}
		switch (b->role) {
		case TS_ROLE_W1:
		case TS_ROLE_W2:
		case TS_ROLE_EMBED:
		case TS_ROLE_PROJ:
			fill(x, n, 10 + (unsigned)b->role, -0.03f, 0.03f);
			break;
		case TS_ROLE_INPUT:
		case TS_ROLE_TARGET:
			if (ts_mlp_tokens(m))
				fill_ids(j->args[i], b->bytes / 4, 30 + (unsigned)b->role, m->vocab);
			else
				fill(x, n, 20 + (unsigned)b->role, -1.0f, 1.0f);
			break;
		default:
			memset(x, 0, b->bytes);
			break;
		}
	}
}

static void job_free(struct job *j)
{
	for (int i = 0; i < j->plan.nbufs; i++) {
		struct ts_space *sp = j->plan.bufs[i].kind == TS_MEM_DEVICE ? dsp : psp;

		if (j->args[i])
			ts_space_release(sp, j->args[i], j->plan.bufs[i].bytes);
		if (j->outs[i])
			ts_space_release(sp, j->outs[i], j->plan.bufs[i].bytes);
	}
	free(j->args);
	free(j->outs);
	ts_plan_release(&j->plan);
}

/* Seconds of one step (timed around ts_exec_run, which returns once the
 * step's work has completed). */
static double job_step(struct job *j)
{
	struct ts_exec_result r;
	struct ts_error err;
	double t0 = now_s();

	ts_error_clear(&err);
	if (ts_exec_run(&j->plan, &env, j->args, j->outs, ++j->step, &r, &err) != TS_OK)
		die("step", &err);
	/* the new versions are the next step's arguments */
	for (int i = 0; i < j->plan.nbufs; i++)
		if (j->plan.bufs[i].versioned) {
			void *t = j->args[i];

			j->args[i] = j->outs[i];
			j->outs[i] = t;
		}
	if (r.measured_temp_peak != j->plan.temp_size_in_bytes)
		fprintf(stderr, "bench_train: measured temp %llu != planned %llu\n",
		        (unsigned long long)r.measured_temp_peak,
		        (unsigned long long)j->plan.temp_size_in_bytes);
	return now_s() - t0;
}

/* ---- the roofline ------------------------------------------------------------------ */

#define MAX_SHAPES 32

struct shape_rate {
	int M, N, K;
	bool ta, tb;
	double rate;
};

struct roofline {
	double flops, gemm_s;       /* the plan's GEMMs, at their measured rates */
	double opt_bytes, opt_s;    /* the optimizer's reads and writes */
	/* bfloat16/float16 on CPU: rounding each operand (4 bytes read, 2
	 * written an element) and widening it back for sgemm (2 read, 4
	 * written), passes over memory a float32 step does not make */
	double conv_bytes, conv_s;
};

static double rate_of(struct shape_rate *cache, int *n, const struct ts_paction *a)
{
	for (int i = 0; i < *n; i++)
		if (cache[i].M == a->M && cache[i].N == a->N && cache[i].K == a->K &&
		    cache[i].ta == a->ta && cache[i].tb == a->tb)
			return cache[i].rate;
	if (*n == MAX_SHAPES)
		die("too many GEMM shapes", NULL);
	cache[*n] = (struct shape_rate){a->M, a->N, a->K, a->ta, a->tb,
	                                sgemm_rate(a->M, a->N, a->K, a->ta, a->tb)};
	return cache[(*n)++].rate;
}

static void roofline_of(const struct ts_plan *p, double mem_bw, struct roofline *out)
{
	struct shape_rate cache[MAX_SHAPES];
	int ncache = 0;
	bool adam = p->opt.type == TS_OPT_ADAM;

	memset(out, 0, sizeof *out);
	for (int i = 0; i < p->nactions; i++) {
		const struct ts_paction *a = &p->actions[i];
		double f = 2.0 * a->M * a->N * a->K;

		if (a->op == TS_P_GEMM_BATCHED && f > 0) {
			/* n products of one shape, each measured as one sgemm */
			out->flops += f * (double)a->n;
			out->gemm_s += f * (double)a->n / rate_of(cache, &ncache, a);
		} else if ((a->op == TS_P_GEMM || a->op == TS_P_GEMM_LP) && f > 0) {
			out->flops += f;
			out->gemm_s += f / rate_of(cache, &ncache, a);
			if (a->op == TS_P_GEMM_LP)
				out->conv_bytes += ((double)a->M * a->K + (double)a->K * a->N) * 6;
		} else if (a->op == TS_P_ROUND) {
			out->conv_bytes += (double)a->n * 6;
		} else if (a->op == TS_P_UPDATE) {
			/* adam: p g mu nu in, p mu nu out; sgd: p g in, p out */
			out->opt_bytes += (double)a->n * 4 * (adam ? 7 : 3);
		} else if (a->op == TS_P_SUMSQ) {
			out->opt_bytes += (double)a->n * 4;
		}
	}
	out->opt_s = out->opt_bytes / mem_bw;
	out->conv_s = out->conv_bytes / mem_bw;
}

/* 2 B d h per matmul, two per layer forward, twice the forward backward;
 * a token model's projection likewise (2 B d V forward). */
static double textbook_flops(const struct ts_mlp *m, int batch)
{
	double fwd = 2.0 * batch * m->d_model * ts_mlp_hidden(m) * (ts_mlp_has_w2(m) ? 2 : 1);
	double proj = ts_mlp_tokens(m) && m->proj ? 2.0 * batch * m->d_model * m->vocab : 0;

	return 3.0 * (fwd * m->layers + proj);
}

static const char *fmt_s(char *buf, size_t cap, double s)
{
	if (s < 1.0)
		snprintf(buf, cap, "%.1f ms", s * 1e3);
	else
		snprintf(buf, cap, "%.2f s", s);
	return buf;
}

/* Best of runs steps after a warm-up, against its roofline; prints a row.
 * The FLOPs are the textbook count; the sgemm rate is the one the step's
 * own GEMM shapes reach (their FLOP-weighted harmonic mean). */
static double roofline_row(const char *name, struct job *j, int runs, double mem_bw,
                           double target)
{
	struct roofline rl;
	double best = INFINITY, flops = textbook_flops(&j->plan.mlp, j->plan.batch), rate, roof;
	char v[32], r[64], t[16];

	roofline_of(&j->plan, mem_bw, &rl);
	if (j->plan.mlp.gpt)
		flops = rl.flops;        /* the plan's products: it recomputes nothing */
	rate = rl.flops / rl.gemm_s;
	roof = flops / rate + rl.opt_s + rl.conv_s;
	job_step(j);
	for (int i = 0; i < runs; i++)
		best = fmin(best, job_step(j));
	fprintf(stderr, "bench_train: %s: %.4g GFLOP (the plan's GEMMs: %.4g, without layer 0's "
	        "input gradient) at %.1f GFLOP/s (sgemm on the step's shapes) = %.1f ms, + optimizer "
	        "%.0f MB at %.1f GB/s = %.1f ms, + rounding and widening %.0f MB = %.1f ms; "
	        "roofline %.1f ms, step %.1f ms\n", name, flops / 1e9,
	        rl.flops / 1e9, rate / 1e9, flops / rate * 1e3, rl.opt_bytes / 1e6, mem_bw / 1e9,
	        rl.opt_s * 1e3, rl.conv_bytes / 1e6, rl.conv_s * 1e3, roof * 1e3, best * 1e3);
	fmt_s(v, sizeof v, best);
	fmt_s(r, sizeof r, roof);
	strncat(r, " roofline", sizeof r - strlen(r) - 1);
	snprintf(t, sizeof t, ">= %.2f", target);
	bench_row(name, v, r, roof / best, t, true, roof / best >= target);
	return best;
}

/* ---- JAX on the CPU, the same model ------------------------------------------------ */

/* The best step time of tests/bench/jax_train.py's model (in
 * $BENCH_PY_DIR, default tests/bench), or a negative number when it could
 * not run (no python3, jax or optax). */
static double jax_best(const char *model, int runs)
{
	const char *dir = getenv("BENCH_PY_DIR");
	char cmd[1024], line[512], *at;
	double best = -1;
	FILE *f;

	snprintf(cmd, sizeof cmd, "python3 '%s/jax_train.py' %s %d", dir && *dir ? dir : "tests/bench",
	         model, runs);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if ((at = strstr(line, "\"best_s\": ")) != NULL)
			best = strtod(at + 10, NULL);
	if (pclose(f) != 0)
		return -1;
	return best;
}

/* A row: our step time against JAX's on the same model (ratio JAX / ours:
 * above 1 when tstage is faster). */
static void jax_row(const char *name, const char *model, double ours, int runs)
{
	double jax = jax_best(model, runs + 1);
	char v[32], r[64];

	fmt_s(v, sizeof v, ours);
	if (jax <= 0) {
		fprintf(stderr, "bench_train: %s: jax_train.py %s did not run (python3 with jax and "
		        "optax needed): skipped\n", name, model);
		bench_row(name, v, "JAX cpu: not run", NAN, ">= 1.00", false, false);
		return;
	}
	fmt_s(r, sizeof r, jax);
	strncat(r, " JAX cpu", sizeof r - strlen(r) - 1);
	fprintf(stderr, "bench_train: %s: tstage %.1f ms, JAX (jit, cpu) %.1f ms\n", name,
	        ours * 1e3, jax * 1e3);
	bench_row(name, v, r, jax / ours, ">= 1.00", true, jax / ours >= 1.0);
}

/* ---- a competing CPU-bound process ----------------------------------------------------- */

/* Starts a process that spins on one core at the bench's own priority until
 * killed (what another user's job does to a shared machine); its pid. */
static pid_t load_start(void)
{
	pid_t pid = fork();

	if (pid < 0)
		die("fork the competing load", NULL);
	if (pid == 0) {
		volatile unsigned long x = 0;

		for (;;)
			x++;
	}
	return pid;
}

static void load_stop(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* Whether row group `name` runs: all of them, or those listed in
 * $BENCH_TRAIN_ROWS (comma separated: guide, tokens, bf16, adam, data, gpt,
 * load). */
static bool want(const char *name)
{
	const char *rows = getenv("BENCH_TRAIN_ROWS");
	size_t n = strlen(name);

	if (!rows || !*rows)
		return true;
	for (const char *at = rows; (at = strstr(at, name)) != NULL; at += n)
		if ((at == rows || at[-1] == ',') && (at[n] == ',' || at[n] == 0))
			return true;
	return false;
}

/* Our step and JAX's, each alone and then with a competing CPU-bound
 * process, alternated `rounds` times (best of each); rows: under load, ours
 * against JAX's (target >= 0.9), and each one's slowdown. */
static void load_rows(const char *label, const char *model, struct job *j, int runs, int rounds)
{
	double ours = INFINITY, ours_l = INFINITY, jax = INFINITY, jax_l = INFINITY;
	char name[64], v[32], r[64];

	for (int k = 0; k < rounds; k++) {
		pid_t pid;
		double t;

		for (int i = 0; i < runs; i++)
			ours = fmin(ours, job_step(j));
		t = jax_best(model, runs + 1);
		jax = t > 0 ? fmin(jax, t) : jax;
		pid = load_start();
		job_step(j);
		for (int i = 0; i < runs; i++)
			ours_l = fmin(ours_l, job_step(j));
		t = jax_best(model, runs + 1);
		jax_l = t > 0 ? fmin(jax_l, t) : jax_l;
		load_stop(pid);
		fprintf(stderr, "bench_train: %s round %d: tstage %.1f ms quiet, %.1f ms loaded; "
		        "JAX %.1f ms quiet, %.1f ms loaded (best so far)\n", label, k, ours * 1e3,
		        ours_l * 1e3, jax * 1e3, jax_l * 1e3);
	}
	fmt_s(v, sizeof v, ours_l);
	snprintf(name, sizeof name, "train sim: %s loaded / JAX loaded", label);
	if (!isfinite(jax_l)) {
		bench_row(name, v, "JAX cpu: not run", NAN, ">= 0.90", false, false);
		return;
	}
	fmt_s(r, sizeof r, jax_l);
	strncat(r, " JAX loaded", sizeof r - strlen(r) - 1);
	bench_row(name, v, r, jax_l / ours_l, ">= 0.90", true, jax_l / ours_l >= 0.9);
	snprintf(name, sizeof name, "train sim: %s loaded / quiet", label);
	fmt_s(r, sizeof r, ours);
	strncat(r, " quiet", sizeof r - strlen(r) - 1);
	bench_row(name, v, r, ours_l / ours, NULL, false, false);
	snprintf(name, sizeof name, "train sim: %s JAX loaded / quiet", label);
	fmt_s(v, sizeof v, jax_l);
	fmt_s(r, sizeof r, jax);
	strncat(r, " quiet", sizeof r - strlen(r) - 1);
	bench_row(name, v, r, jax_l / jax, NULL, false, false);
}

/* ---- a data-driven run against fixed-batch steps ------------------------------------ */

#define DATA_ROWS 4096

struct data_run {
	struct ts_session_config cfg;
	void *role[TS_ROLE_COUNT];         /* the model's memory, on the device */
	uint64_t bytes[TS_ROLE_COUNT];
	float *x, *y;                      /* the dataset: [DATA_ROWS, d] each, pinned_host */
	uint64_t row_bytes;
	uint64_t rows[2][1024];            /* the batch's rows, inputs and targets */
};

static struct ts_session_source data_source(struct data_run *d, int k, uint64_t n)
{
	int B = d->cfg.batch;

	for (int i = 0; i < B; i++)
		d->rows[k][i] = (n * (uint64_t)B + (uint64_t)i) % DATA_ROWS;
	return (struct ts_session_source){
		.mem = k ? d->y : d->x, .bytes = DATA_ROWS * d->row_bytes, .row_bytes = d->row_bytes,
		.src_dev = env.dev, .src_kind = TS_MEM_PINNED_HOST, .rows = d->rows[k],
		.nrows = (size_t)B};
}

static ts_status data_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                            struct ts_session_source *src, struct ts_error *err)
{
	(void)err;
	*src = data_source(arg, role == TS_ROLE_TARGET, n);
	return TS_OK;
}

static const struct ts_session_hooks data_hooks = {.batch = data_batch};

/* Seconds of `steps` steps in one session: each on its own batch of rows
 * (batches) or all on the first batch. */
static double data_steps(struct data_run *d, uint64_t steps, bool batches)
{
	static const enum ts_pbuf_role roles[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_MU_W1,
	                                          TS_ROLE_MU_W2, TS_ROLE_NU_W1, TS_ROLE_NU_W2};
	struct ts_session *s;
	struct ts_session_source src;
	struct ts_error err;
	double t0;

	ts_error_clear(&err);
	if (ts_session_new(&d->cfg, &s, &err) != TS_OK)
		die("session", &err);
	for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
		enum ts_pbuf_role r = roles[i];

		if (!d->role[r]) {
			if (!ts_session_slot(s, r, &d->bytes[r], NULL) ||
			    ts_space_alloc(dsp, d->bytes[r], &d->role[r], &err) != TS_OK)
				die("model memory", &err);
			if (r <= TS_ROLE_W2)
				fill(d->role[r], d->bytes[r] / 4, 40 + (unsigned)r, -0.03f, 0.03f);
			else
				memset(d->role[r], 0, d->bytes[r]);
		}
		if (ts_session_bind(s, r, d->role[r], d->bytes[r], TS_MEM_DEVICE, &err) != TS_OK)
			die("bind", &err);
	}
	for (int k = 0; k < 2; k++) {
		src = data_source(d, k, 0);
		if (ts_session_stage(s, k ? TS_ROLE_TARGET : TS_ROLE_INPUT, &src, &err) != TS_OK)
			die("stage", &err);
	}
	t0 = now_s();
	if (ts_session_run(s, steps, 1, batches ? &data_hooks : NULL, d, &err) != TS_OK)
		die("data-driven steps", &err);
	t0 = now_s() - t0;
	ts_session_free(s);
	return t0;
}

/* The guide's shapes with Adam and mse, on the device: N steps drawing
 * their batches from a pinned_host dataset over N steps on one batch. */
static void data_row(int runs)
{
	struct data_run d = {.cfg = {
		.dev = env.dev, .memory = mem, .batch = 256,
		.mlp = {.layers = 10, .d_model = 256, .d_hidden = 1024, .act = TS_ACT_RELU,
		        .loss = TS_LOSS_MSE},
		.opt = {.type = TS_OPT_ADAM, .learning_rate = 1e-4f, .b1 = 0.9f, .b2 = 0.999f,
		        .eps = 1e-8f},
		.policy = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE, .save_x = true,
		           .save_h = true}}};
	const uint64_t steps = 10;
	double t_data = INFINITY, t_fixed = INFINITY, ratio;
	struct ts_error err;
	char v[32], r[64];

	ts_error_clear(&err);
	d.row_bytes = (uint64_t)d.cfg.mlp.d_model * 4;
	if (ts_space_alloc(psp, DATA_ROWS * d.row_bytes, (void **)&d.x, &err) != TS_OK ||
	    ts_space_alloc(psp, DATA_ROWS * d.row_bytes, (void **)&d.y, &err) != TS_OK)
		die("dataset", &err);
	fill(d.x, DATA_ROWS * (size_t)d.cfg.mlp.d_model, 50, -1.0f, 1.0f);
	fill(d.y, DATA_ROWS * (size_t)d.cfg.mlp.d_model, 51, -1.0f, 1.0f);
	data_steps(&d, 2, true);
	for (int i = 0; i < runs; i++) {
		t_fixed = fmin(t_fixed, data_steps(&d, steps, false));
		t_data = fmin(t_data, data_steps(&d, steps, true));
	}
	ratio = t_data / t_fixed;
	fmt_s(v, sizeof v, t_data);
	fmt_s(r, sizeof r, t_fixed);
	strncat(r, " fixed batch", sizeof r - strlen(r) - 1);
	fprintf(stderr, "bench_train: %llu data-driven steps (batches of 256 of %d host rows) "
	        "%.1f ms, on one batch %.1f ms\n", (unsigned long long)steps, DATA_ROWS,
	        t_data * 1e3, t_fixed * 1e3);
	bench_row("train sim: data-driven / fixed-batch x10", v, r, ratio, "<= 1.05", true,
	          ratio <= 1.05);
	for (int k = 0; k < TS_ROLE_COUNT; k++)
		if (d.role[k])
			ts_space_release(dsp, d.role[k], d.bytes[k]);
	ts_space_release(psp, d.x, DATA_ROWS * d.row_bytes);
	ts_space_release(psp, d.y, DATA_ROWS * d.row_bytes);
}

/* A row: the offloaded step over the same step on the device. */
static void offload_row(const char *name, double t_off, double t_on)
{
	char v[32], r[64];
	double ratio = t_off / t_on;

	fmt_s(v, sizeof v, t_off);
	fmt_s(r, sizeof r, t_on);
	strncat(r, " on device", sizeof r - strlen(r) - 1);
	bench_row(name, v, r, ratio, "<= 1.15", true, ratio <= 1.15);
}

/* The GPT (issue 28's shapes: L 4, d 256, 4 heads, context 256, d_ff 1024,
 * vocab 8192, batch 8 windows, AdamW): its roofline, JAX, offloaded over
 * on-device, and JAX under a competing load. */
static void gpt_rows(const struct ts_mlp *m, const struct ts_optimizer *o, int runs, double bw)
{
	struct ts_policy on_dev = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                           .save_x = true, .save_h = true};
	struct ts_policy off = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_PINNED_HOST,
	                        .save_x = true, .save_h = true, .prefetch_depth = 1};
	int batch = 8 * m->context;
	struct job jon, joff;
	double t_on, t_off = INFINITY;

	job_new(m, o, batch, &on_dev, &jon);
	t_on = roofline_row("train sim: gpt L=4 d=256 T=256 B=8 adamw step", &jon, runs, bw, 0.80);
	jax_row("train sim: gpt step / JAX cpu", "gpt", t_on, runs);
	job_new(m, o, batch, &off, &joff);
	job_step(&joff);
	for (int i = 0; i < runs; i++) {
		t_off = fmin(t_off, job_step(&joff));
		t_on = fmin(t_on, job_step(&jon));
	}
	offload_row("train sim: gpt offload / on-device", t_off, t_on);
	job_free(&joff);
	if (want("load"))
		load_rows("gpt", "gpt", &jon, runs, runs);
	job_free(&jon);
}

int main(void)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 1536 * MiB,
	                              .cuda = false, .host = "bench"};
	struct ts_memory_config mc = {.device_memory_fraction = 1.0, .pinned_host_limit = 1024 * MiB,
	                              .unpinned_host_limit = 64 * MiB, .pinned_segment = 512 * MiB};
	struct ts_mlp guide = {.layers = 10, .d_model = 256, .d_hidden = 1024, .act = TS_ACT_RELU,
	                       .loss = TS_LOSS_SUM};
	struct ts_mlp big = {.layers = 4, .d_model = 2048, .d_hidden = 2048, .act = TS_ACT_RELU,
	                     .loss = TS_LOSS_SUM};
	struct ts_mlp tokens = {.layers = 4, .d_model = 256, .d_hidden = 1024, .act = TS_ACT_RELU,
	                        .loss = TS_LOSS_XENT, .vocab = 8192, .proj = true, .id_bytes = 4};
	struct ts_optimizer none = {.type = TS_OPT_NONE};
	struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-4f, .b1 = 0.9f,
	                            .b2 = 0.999f, .eps = 1e-8f};
	struct ts_policy on_dev = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                           .save_x = true, .save_h = true};
	struct ts_policy off = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_PINNED_HOST,
	                        .save_x = true, .save_h = true, .prefetch_depth = 1};
	struct ts_mlp gpt = {.layers = 4, .d_model = 256, .d_hidden = 1024, .act = TS_ACT_GELU,
	                     .loss = TS_LOSS_XENT, .vocab = 8192, .id_bytes = 4, .gpt = true,
	                     .heads = 4, .context = 256};
	struct ts_optimizer adamw = {.type = TS_OPT_ADAM, .learning_rate = 1e-4f, .b1 = 0.9f,
	                             .b2 = 0.999f, .eps = 1e-8f, .adamw = true,
	                             .weight_decay = 1e-4f};
	struct ts_error err;
	struct job j, jon, joff;
	double bw, t_on = INFINITY, t_off = INFINITY, t_step;
	int runs = bench_seconds(1.0) >= 1.0 ? 3 : 1;

	ts_error_clear(&err);
	if (ts_device_set_new(&dc, &set, &err) != TS_OK || ts_memory_new(set, &mc, &mem, &err) != TS_OK)
		die("devices", &err);
	env.dev = ts_device_set_find(set, "sim:0");
	if (!env.dev)
		die("no sim:0", NULL);
	dsp = ts_memory_find(mem, "sim:0", TS_MEM_DEVICE);
	psp = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
	if (ts_kernels_new(env.dev, &kern, &err) != TS_OK || ts_queue_new(env.dev, &env.compute, &err) != TS_OK ||
	    ts_queue_new(env.dev, &env.h2d, &err) != TS_OK || ts_queue_new(env.dev, &env.d2h, &err) != TS_OK)
		die("kernels and queues", &err);
	env.kernels = kern;
	env.device_space = dsp;
	env.pinned_space = psp;

	bw = 2.0 * memcpy_rate();
	fprintf(stderr, "bench_train: memory bandwidth %.1f GB/s (2 x memcpy)\n", bw / 1e9);

	if (want("guide")) {
		job_new(&guide, &none, 256, &on_dev, &j);
		t_step = roofline_row("train sim: guide L=10 d=256 h=1024 step", &j, runs * 2, bw, 0.85);
		job_free(&j);
		jax_row("train sim: guide step / JAX cpu", "guide", t_step, runs * 2);
	}

	if (want("tokens") || want("load")) {
		job_new(&tokens, &adam, 256, &on_dev, &j);
		if (want("tokens")) {
			t_step = roofline_row("train sim: tokens V=8192 d=256 L=4 adam step", &j,
			                      runs * 2, bw, 0.70);
			jax_row("train sim: tokens step / JAX cpu", "tokens", t_step, runs * 2);
		}
		if (want("load"))
			load_rows("tokens", "tokens", &j, runs * 2, runs);
		job_free(&j);
	}

	/* bfloat16 compute: the same products on rounded operands, against the
	 * float32 sgemm roofline of the same shapes */
	if (want("bf16")) {
		guide.compute = TS_COMPUTE_BF16;
		job_new(&guide, &none, 256, &on_dev, &j);
		roofline_row("train sim: guide bfloat16 step", &j, runs * 2, bw, 0.85);
		job_free(&j);
		guide.compute = TS_COMPUTE_F32;
	}

	if (want("gpt"))
		gpt_rows(&gpt, &adamw, runs, bw);

	if (want("adam")) {
		job_new(&big, &adam, 256, &on_dev, &jon);
		t_on = roofline_row("train sim: adam L=4 d=h=2048 B=256 step", &jon, runs, bw, 0.85);
		jax_row("train sim: adam 4x2048 step / JAX cpu", "adam", t_on, runs);

		/* offloaded over on-device, interleaved */
		job_new(&big, &adam, 256, &off, &joff);
		job_step(&joff);
		for (int i = 0; i < runs; i++) {
			t_off = fmin(t_off, job_step(&joff));
			t_on = fmin(t_on, job_step(&jon));
		}
		fprintf(stderr, "bench_train: offloaded step moves %.0f MB in, %.0f MB out\n",
		        (double)joff.plan.h2d_bytes / 1e6, (double)joff.plan.d2h_bytes / 1e6);
		offload_row("train sim: adam 4x2048 offload / on-device", t_off, t_on);
		job_free(&joff);
		job_free(&jon);
	}

	if (want("data"))
		data_row(runs + 2);

	ts_queue_free(env.compute);
	ts_queue_free(env.h2d);
	ts_queue_free(env.d2h);
	ts_kernels_free(kern);
	ts_memory_free(mem);
	ts_device_set_free(set);
	return 0;
}
