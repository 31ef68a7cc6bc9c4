/*
 * test_exec.c - the step executor on a sim device: the measured temp peaks
 * equal the plan's predictions for the JAX guide's configurations, and the
 * bytes copied its figures; every placement policy gives the same loss and
 * gradients bit for bit; gradients against finite differences (of a float64
 * reference and of the executor's own forward); SGD and Adam with clipping
 * equal on device and on pinned_host; failures (injected copy faults,
 * running out of device memory mid-step, bad arguments) leave the memory
 * spaces as they were; bfloat16 and float16 steps against float64 of their
 * rounded operands, with the plan's peaks.
 *
 * Every case runs on sim:0; with TS_TEST_BACKEND=cuda the ones that need no
 * fault injection run again on cuda:0, bit for bit there too (reductions
 * run in one fixed order). The measured peak is the step's own: another
 * allocation made on the same space during a step does not change it.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device/backend.h"
#include "formats/convert.h"
#include "tests/unit/unit.h"
#include "train/exec.h"
#include "train/session.h"

#define MiB (1024.0 * 1024.0)

static struct ts_device_set *set;
static struct ts_device *dev;
static struct ts_memory *mem;
static struct ts_space *dsp, *psp;
static struct ts_kernels *kern;
static struct ts_queue *qc, *qh, *qd;
static struct ts_exec_env env;
static struct ts_error err;
static bool exact;              /* results repeat bit for bit (both backends) */
static bool timed;              /* compute_s > 0 for sure (host clocks on sim) */
static bool fused;              /* kernels contract multiply-adds (cuda) */
static int sparse;              /* the GPT cases visit every sparse-th policy or element:
                                   1 on sim, more where a step costs more (cuda's
                                   stand-in runs each kernel's threads in turn) */

#define OK(call) TS_UNIT_OK(err, call)

static void setup_on(const struct ts_device_config *dc, const char *id, double fraction)
{
	struct ts_memory_config mc = {.device_memory_fraction = fraction,
	                              .pinned_host_limit = 256ull << 20,
	                              .unpinned_host_limit = 64ull << 20,
	                              .pinned_segment = 32ull << 20};

	ts_error_clear(&err);
	OK(ts_device_set_new(dc, &set, &err));
	dev = ts_device_set_find(set, id);
	ck_assert_msg(dev != NULL, "no device %s", id);
	if (fraction < 0) {
		/* -bytes: a pool of that many bytes, whatever the GPU's size */
		uint64_t free_b = 0, total_b = 0;

		OK(ts_device_mem_info(dev, &free_b, &total_b, &err));
		ck_assert_uint_gt(free_b, 0);
		mc.device_memory_fraction = -fraction >= (double)free_b ? 1.0 : -fraction / (double)free_b;
	}
	OK(ts_memory_new(set, &mc, &mem, &err));
	dsp = ts_memory_find(mem, id, TS_MEM_DEVICE);
	psp = ts_memory_find(mem, id, TS_MEM_PINNED_HOST);
	ck_assert_ptr_nonnull(dsp);
	ck_assert_ptr_nonnull(psp);
	OK(ts_kernels_new(dev, &kern, &err));
	OK(ts_queue_new(dev, &qc, &err));
	OK(ts_queue_new(dev, &qh, &err));
	OK(ts_queue_new(dev, &qd, &err));
	env = (struct ts_exec_env){.dev = dev, .device_space = dsp, .pinned_space = psp,
	                           .kernels = kern, .compute = qc, .h2d = qh, .d2h = qd};
}

static void setup_sim(void)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 256ull << 20,
	                              .cuda = false, .host = "t"};

	exact = true;
	timed = true;
	fused = false;
	sparse = 1;
	setup_on(&dc, "sim:0", 1.0);
}

static void setup_cuda(void)
{
	struct ts_device_config dc = {.sim_devices = 0, .cuda = true, .host = "t"};

	/* reductions run in one fixed order on CUDA too */
	exact = true;
	timed = false;
	fused = true;
	sparse = 24;
	setup_on(&dc, "cuda:0", -256.0 * MiB);
}

static void teardown(void)
{
	ts_queue_free(qc);
	ts_queue_free(qh);
	ts_queue_free(qd);
	ts_kernels_free(kern);
	ts_memory_free(mem);
	ts_device_set_free(set);
}

static uint64_t in_use(struct ts_space *sp)
{
	struct ts_space_stats s;

	ts_space_stats(sp, &s);
	return s.bytes_in_use;
}

/* ---- a planned step with its arguments ---------------------------------------- */

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

/* A plan and the memory of its arguments and outputs. */
struct job {
	struct ts_plan plan;
	void **args;
	void **outs;                 /* new memory of the versioned arguments */
};

/* The argument or output of a role, or -1. */
static int role_index(const struct ts_plan *p, enum ts_pbuf_role role)
{
	for (int i = 0; i < p->nbufs; i++)
		if (p->bufs[i].cls != TS_PB_TEMP && p->bufs[i].role == role)
			return i;
	return -1;
}

/* Copies host bytes into buffer i (device memory through a queue). */
static void put(struct job *j, int i, const void *src, size_t n)
{
	if (j->plan.bufs[i].kind == TS_MEM_DEVICE) {
		OK(ts_queue_copy(qh, j->args[i], src, n, TS_COPY_H2D, &err));
		OK(ts_queue_sync(qh, &err));
	} else {
		memcpy(j->args[i], src, n);
	}
}

static void get(const struct job *j, int i, void *dst, size_t n)
{
	if (j->plan.bufs[i].kind == TS_MEM_DEVICE) {
		OK(ts_queue_copy(qd, dst, j->args[i], n, TS_COPY_D2H, &err));
		OK(ts_queue_sync(qd, &err));
	} else {
		memcpy(dst, j->args[i], n);
	}
}

/* The initial contents of a role's argument, whatever its placement:
 * weights scaled by their fan-in, optimizer state zero, inputs in [-1, 1),
 * outputs NaN (the step must write every element). */
static void initial(const struct ts_plan *p, enum ts_pbuf_role role, unsigned seed, float *x,
                    size_t n)
{
	int d = p->mlp.d_model, h = ts_mlp_hidden(&p->mlp);
	float b1 = sqrtf(3.0f / (float)d), b2 = sqrtf(6.0f / (float)h);

	if (ts_mlp_tokens(&p->mlp) && (role == TS_ROLE_INPUT || role == TS_ROLE_TARGET)) {
		/* token ids in the vocabulary, repeated (x holds n floats' bytes) */
		unsigned s = seed * 16 + (role == TS_ROLE_INPUT ? 5 : 6);
		size_t k = n * sizeof *x / (size_t)p->mlp.id_bytes;

		for (size_t i = 0; i < k; i++) {
			int v = (int)(rnd(&s, 0, 1) * (float)(role == TS_ROLE_INPUT ? (p->mlp.vocab + 1) / 2
			                                                          : p->mlp.vocab));
			uint16_t u = (uint16_t)v;
			int32_t w = v;

			if (p->mlp.id_bytes == 2)
				memcpy((char *)x + 2 * i, &u, 2);
			else
				memcpy((char *)x + 4 * i, &w, 4);
		}
		return;
	}
	{
		int kind, t;

		if (ts_gpt_role_of(role, &kind, &t)) {
			if (kind == 3)
				for (size_t i = 0; i < n; i++)
					x[i] = NAN;
			else if (kind != 0)
				memset(x, 0, n * sizeof *x);
			else if (ts_gpt_param_is_scale((enum ts_gpt_param)t))
				fill_rnd(x, n, seed * 64 + 9 + (unsigned)t, 0.8f, 1.2f);
			else
				fill_rnd(x, n, seed * 64 + 9 + (unsigned)t, -0.3f, 0.3f);
			return;
		}
	}
	switch (role) {
	case TS_ROLE_EMBED:
		fill_rnd(x, n, seed * 16 + 7, -1.0f, 1.0f);
		break;
	case TS_ROLE_PROJ:
		fill_rnd(x, n, seed * 16 + 8, -b1, b1);
		break;
	case TS_ROLE_W1:
		fill_rnd(x, n, seed * 16 + 1, -b1, b1);
		break;
	case TS_ROLE_W2:
		fill_rnd(x, n, seed * 16 + 2, -b2, b2);
		break;
	case TS_ROLE_INPUT:
		fill_rnd(x, n, seed * 16 + 3, -1.0f, 1.0f);
		break;
	case TS_ROLE_TARGET:
		fill_rnd(x, n, seed * 16 + 4, -1.0f, 1.0f);
		break;
	case TS_ROLE_GRAD_W1:
	case TS_ROLE_GRAD_W2:
	case TS_ROLE_GRAD_EMBED:
	case TS_ROLE_GRAD_PROJ:
	case TS_ROLE_OUTPUT:
		for (size_t i = 0; i < n; i++)
			x[i] = NAN;
		break;
	default:
		memset(x, 0, n * sizeof *x);
		break;
	}
}

static void job_bind(unsigned seed, struct job *j);

static void job_new(const struct ts_mlp *m, const struct ts_optimizer *o, int batch,
                    const struct ts_policy *pol, unsigned seed, struct job *j)
{
	OK(ts_plan_build(m, o, batch, pol, &j->plan, &err));
	job_bind(seed, j);
}

/* An evaluation's job (ts_plan_build_eval), its arguments as job_new's. */
static void job_new_eval(const struct ts_mlp *m, int batch, const struct ts_policy *pol,
                         bool outputs, enum ts_memory_kind kind, unsigned seed, struct job *j)
{
	OK(ts_plan_build_eval(m, batch, pol, outputs, kind, &j->plan, &err));
	job_bind(seed, j);
}

/* Allocates and fills the plan's arguments. */
static void job_bind(unsigned seed, struct job *j)
{
	j->args = calloc((size_t)j->plan.nbufs, sizeof *j->args);
	j->outs = calloc((size_t)j->plan.nbufs, sizeof *j->outs);
	ck_assert_ptr_nonnull(j->args);
	ck_assert_ptr_nonnull(j->outs);
	for (int i = 0; i < j->plan.nbufs; i++) {
		const struct ts_pbuf *b = &j->plan.bufs[i];
		struct ts_space *sp = b->kind == TS_MEM_DEVICE ? dsp : psp;
		float *x;

		if (b->cls == TS_PB_TEMP)
			continue;
		OK(ts_space_alloc(sp, b->bytes, &j->args[i], &err));
		if (b->versioned)
			OK(ts_space_alloc(sp, b->bytes, &j->outs[i], &err));
		x = malloc(b->bytes);
		ck_assert_ptr_nonnull(x);
		initial(&j->plan, b->role, seed, x, b->bytes / sizeof *x);
		put(j, i, x, b->bytes);
		free(x);
	}
}

/* After a successful step, the new versions are the arguments of the next
 * (as the session publishes them); the old memory takes the next update. */
static void publish(struct job *j)
{
	for (int i = 0; i < j->plan.nbufs; i++) {
		void *t = j->args[i];

		if (!j->plan.bufs[i].versioned)
			continue;
		j->args[i] = j->outs[i];
		j->outs[i] = t;
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

/* Runs one step and checks what must hold after every successful one. */
static void job_run(struct job *j, int step, struct ts_exec_result *res)
{
	uint64_t dev0 = in_use(dsp), host0 = in_use(psp);

	ts_error_clear(&err);
	OK(ts_exec_run(&j->plan, &env, j->args, j->outs, step, res, &err));
	publish(j);
	ck_assert_uint_eq(res->measured_temp_peak, j->plan.temp_size_in_bytes);
	ck_assert_uint_eq(res->measured_host_temp_peak, j->plan.host_temp_size_in_bytes);
	ck_assert_uint_eq(res->h2d_bytes, j->plan.h2d_bytes);
	ck_assert_uint_eq(res->d2h_bytes, j->plan.d2h_bytes);
	ck_assert_uint_eq(in_use(dsp), dev0);
	ck_assert_uint_eq(in_use(psp), host0);
	ck_assert(res->wall_s > 0);
	if (timed) {
		ck_assert(res->compute_s > 0);
		ck_assert(res->copy_wait_s >= 0);
		ck_assert(res->compute_s + res->copy_wait_s <= res->wall_s * 1.001 + 1e-6);
	} else {
		/* CUDA events time the stream where the runtime can (0 under a
		 * stand-in without cudaEventElapsedTime); the stream's busy and
		 * waiting stretches lie within the step */
		ck_assert(res->compute_s >= 0 && res->copy_wait_s >= 0);
		ck_assert(res->compute_s + res->copy_wait_s <= res->wall_s * 1.001 + 1e-6);
	}
}

/* A role's argument read back (malloc'd, *n elements), NULL without it. */
static float *job_read(const struct job *j, enum ts_pbuf_role role, size_t *n)
{
	int i = role_index(&j->plan, role);
	float *x;

	*n = 0;
	if (i < 0)
		return NULL;
	*n = j->plan.bufs[i].bytes / sizeof *x;
	x = malloc(j->plan.bufs[i].bytes);
	ck_assert_ptr_nonnull(x);
	get(j, i, x, j->plan.bufs[i].bytes);
	return x;
}

static void job_write(struct job *j, enum ts_pbuf_role role, const float *x)
{
	int i = role_index(&j->plan, role);

	ck_assert_int_ge(i, 0);
	put(j, i, x, j->plan.bufs[i].bytes);
}

/* x and y agree: bit for bit where results are exact, else to a relative
 * 1e-4 of y (or of 1e-2 * scale, for values near zero). */
static bool agree(float x, float y, double scale)
{
	if (exact)
		return memcmp(&x, &y, sizeof x) == 0;
	return fabs((double)x - y) <= 1e-4 * (fabs(y) + 1e-2 * scale);
}

static void same_loss(float x, float y, const char *what)
{
	ck_assert_msg(agree(x, y, 0), "%s: loss %.9g, reference %.9g", what, x, y);
}

/* Whether two jobs' arguments of a role hold the same values. */
static void same_values(const struct job *a, const struct job *b, enum ts_pbuf_role role,
                        const char *what)
{
	size_t na, nb;
	float *x = job_read(a, role, &na), *y = job_read(b, role, &nb);
	double scale = 0;

	ck_assert_uint_eq(na, nb);
	for (size_t i = 0; i < nb; i++)
		scale = fmax(scale, fabs(y[i]));
	if (exact && na && memcmp(x, y, na * sizeof *x) == 0)
		na = 0;     /* the common case, without a check per element */
	for (size_t i = 0; i < na; i++)
		if (!agree(x[i], y[i], scale))
			ck_abort_msg("%s: role %d element %zu differs: %.9g vs %.9g", what,
			             (int)role, i, x[i], y[i]);
	free(x);
	free(y);
}

/* ---- policies ------------------------------------------------------------------ */

static const struct ts_optimizer grads_only = {.type = TS_OPT_NONE};

/* test_plan.c's guide policies: x and h saved, or x offloaded and h recomputed. */
static struct ts_policy guide_policy(bool params_host, bool offload_x, int prefetch)
{
	struct ts_policy p = {.params = params_host ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
	                      .opt_state = TS_MEM_DEVICE, .prefetch_depth = prefetch};

	if (offload_x) {
		p.offload_x = true;
	} else {
		p.save_x = true;
		p.save_h = true;
	}
	return p;
}

/* Every placement: params on device or pinned_host, x and h each saved,
 * offloaded or recomputed, prefetch 0 or 1 (36 policies). */
static struct ts_policy any_policy(int k)
{
	int px = k % 3, ph = (k / 3) % 3;
	struct ts_policy p = {.params = (k / 9) % 2 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
	                      .opt_state = TS_MEM_DEVICE,
	                      .save_x = px == 1, .offload_x = px == 2,
	                      .save_h = ph == 1, .offload_h = ph == 2,
	                      .prefetch_depth = (k / 18) % 2};

	return p;
}

#define ANY_POLICIES 36

static void say(const char *what, const struct ts_plan *p, const struct ts_exec_result *r)
{
	fprintf(stderr, "%s: temp %.4f MiB (plan %.4f), host temp %.4f MiB (plan %.4f), "
	                "h2d %.2f MiB (plan %.2f), d2h %.2f MiB (plan %.2f); wall %.1f ms, "
	                "compute %.1f ms, copy wait %.1f ms\n",
	        what, r->measured_temp_peak / MiB, p->temp_size_in_bytes / MiB,
	        r->measured_host_temp_peak / MiB, p->host_temp_size_in_bytes / MiB,
	        r->h2d_bytes / MiB, p->h2d_bytes / MiB, r->d2h_bytes / MiB, p->d2h_bytes / MiB,
	        r->wall_s * 1e3, r->compute_s * 1e3, r->copy_wait_s * 1e3);
}

/* ---- 1. the guide's configurations --------------------------------------------- */

/* The guide's model in a compute dtype under its eight placements: measured
 * peaks equal the plan's (job_run), the same bits under each. */
static void guide_peaks(enum ts_compute compute)
{
	const struct ts_mlp guide = {.layers = 10, .d_model = 256, .d_hidden = 1024,
	                             .act = TS_ACT_RELU, .residual = false,
	                             .loss = TS_LOSS_SUM, .compute = compute};
	struct job ref;
	struct ts_exec_result r0;
	bool have_ref = false;

	for (int k = 0; k < 8; k++) {
		bool params_host = k & 1, offload_x = k & 2;
		int prefetch = (k >> 2) & 1;
		struct ts_policy pol = guide_policy(params_host, offload_x, prefetch);
		struct ts_exec_result r;
		struct job j;
		char what[96];

		job_new(&guide, &grads_only, 256, &pol, 1, &j);
		job_run(&j, 1, &r);
		snprintf(what, sizeof what, "guide %s params_host=%d offload_x=%d prefetch=%d",
		         ts_compute_name(compute), params_host, offload_x, prefetch);
		say(what, &j.plan, &r);
		ck_assert(isfinite(r.loss));
		if (!have_ref) {
			ref = j;
			r0 = r;
			have_ref = true;
			continue;
		}
		same_loss(r.loss, r0.loss, what);
		same_values(&ref, &j, TS_ROLE_GRAD_W1, what);
		same_values(&ref, &j, TS_ROLE_GRAD_W2, what);
		job_free(&j);
	}
	job_free(&ref);
}

START_TEST(test_guide_peaks_equal_the_plan)
{
	guide_peaks(TS_COMPUTE_F32);
}
END_TEST

/* The same with the rounded copies of every product among the temps. */
START_TEST(test_lowp_guide_peaks_equal_the_plan)
{
	guide_peaks(TS_COMPUTE_BF16);
}
END_TEST

/* ---- 1b. the peak is the step's own ---------------------------------------------- */

/* Holds the compute queue until opened. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool open;
};

static void gate_wait(void *arg)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->mu);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

struct intruder {
	struct gate *gate;
	uint64_t base, bytes;
	void *p;
};

/* Other work on the same device: once the step holds temps, allocates
 * bytes from the device space, then lets the step's kernels run. */
static void *intruder_main(void *arg)
{
	struct intruder *in = arg;
	struct ts_error e;

	while (in_use(dsp) <= in->base)
		usleep(1000);
	ts_error_clear(&e);
	if (ts_space_alloc(dsp, in->bytes, &in->p, &e) != TS_OK)
		in->p = NULL;
	pthread_mutex_lock(&in->gate->mu);
	in->gate->open = true;
	pthread_cond_signal(&in->gate->cv);
	pthread_mutex_unlock(&in->gate->mu);
	return NULL;
}

START_TEST(test_peak_is_the_steps_own_while_others_allocate)
{
	const struct ts_mlp m = {.layers = 4, .d_model = 64, .d_hidden = 128, .act = TS_ACT_GELU,
	                         .residual = false, .loss = TS_LOSS_SUM};
	struct ts_policy pol = guide_policy(false, false, 0);
	struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
	struct intruder in = {&g, 0, 0, NULL};
	struct ts_exec_result r;
	pthread_t t;
	struct job j;

	job_new(&m, &grads_only, 32, &pol, 4, &j);
	/* more than the step's whole temp peak: any count of it shows */
	in.bytes = 2 * j.plan.temp_size_in_bytes;
	in.base = in_use(dsp);
	/* the compute queue waits for the intruder while the host enqueues
	 * the step, whose arenas were taken before */
	OK(ts_queue_host_fn(qc, gate_wait, &g, &err));
	ck_assert_int_eq(pthread_create(&t, NULL, intruder_main, &in), 0);
	ts_error_clear(&err);
	OK(ts_exec_run(&j.plan, &env, j.args, j.outs, 1, &r, &err));
	pthread_join(t, NULL);
	ck_assert_msg(in.p != NULL, "the intruder got no memory");
	ck_assert_msg(r.measured_temp_peak == j.plan.temp_size_in_bytes,
	              "measured %llu with another %llu bytes in use, predicted %llu",
	              (unsigned long long)r.measured_temp_peak, (unsigned long long)in.bytes,
	              (unsigned long long)j.plan.temp_size_in_bytes);
	ts_space_release(dsp, in.p, in.bytes);
	ck_assert_uint_eq(in_use(dsp), in.base);
	job_free(&j);
}
END_TEST

struct held_run {
	struct job *j;
	struct ts_exec_result r;
	struct ts_error e;
	ts_status st;
};

static void *held_run_main(void *arg)
{
	struct held_run *h = arg;

	ts_error_clear(&h->e);
	h->st = ts_exec_run(&h->j->plan, &env, h->j->args, h->j->outs, 1, &h->r, &h->e);
	return NULL;
}

/* A FREE does not block the host: with the compute queue held, the host
 * still enqueues every copy of a step that streams its params and
 * offloads its residuals (the places freed temps leave are reused by later
 * ones, which wait on the device), and the results are those of a step
 * run unheld. On CUDA the loss comes back into pageable memory, which
 * cudaMemcpyAsync waits for: there the host gets as far as every copy
 * before the loss. */
START_TEST(test_host_enqueues_the_whole_step_while_compute_is_held)
{
	const struct ts_mlp m = {.layers = 4, .d_model = 64, .d_hidden = 128, .act = TS_ACT_GELU,
	                         .residual = true, .loss = TS_LOSS_SUM};
	struct ts_policy pol = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_DEVICE,
	                        .offload_x = true, .offload_h = true, .prefetch_depth = 1};
	struct gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false};
	struct held_run h = {0};
	struct ts_exec_result r0;
	bool cuda = ts_device_props(dev)->backend == TS_BACKEND_CUDA;
	uint64_t copies = cuda ? 0 : 1, c0, seen = 0;   /* the plan's copies, the loss's */
	bool all = false;
	struct job ref, j;
	pthread_t t;

	job_new(&m, &grads_only, 32, &pol, 5, &ref);
	job_run(&ref, 1, &r0);
	job_new(&m, &grads_only, 32, &pol, 5, &j);
	for (int i = 0; i < j.plan.nactions; i++) {
		if (j.plan.actions[i].op == TS_P_LOSS && cuda)
			break;
		copies += j.plan.actions[i].op == TS_P_COPY;
	}
	ck_assert_uint_gt(copies, 3 * (uint64_t)m.layers);
	h.j = &j;
	c0 = ts_device_copies(dev);
	OK(ts_queue_host_fn(qc, gate_wait, &g, &err));
	ck_assert_int_eq(pthread_create(&t, NULL, held_run_main, &h), 0);
	/* a liveness wait, not a timing: the old behaviour never gets there */
	for (int k = 0; k < 30000 && !all; k++) {
		seen = ts_device_copies(dev) - c0;
		all = seen >= copies;
		if (!all)
			usleep(1000);
	}
	pthread_mutex_lock(&g.mu);
	g.open = true;
	pthread_cond_signal(&g.cv);
	pthread_mutex_unlock(&g.mu);
	pthread_join(t, NULL);
	ck_assert_msg(h.st == TS_OK, "%s", h.e.message);
	ck_assert_msg(all, "with the compute queue held the host enqueued %llu of the step's %llu "
	              "copies", (unsigned long long)seen, (unsigned long long)copies);
	publish(&j);
	ck_assert_uint_eq(h.r.measured_temp_peak, j.plan.temp_size_in_bytes);
	ck_assert_uint_eq(h.r.measured_host_temp_peak, j.plan.host_temp_size_in_bytes);
	same_loss(h.r.loss, r0.loss, "held compute queue");
	same_values(&ref, &j, TS_ROLE_GRAD_W1, "held compute queue");
	same_values(&ref, &j, TS_ROLE_GRAD_W2, "held compute queue");
	job_free(&j);
	job_free(&ref);
}
END_TEST

/* A long plan (hundreds of temps freed while the queues may still use
 * them, more than the executor tracks at once): every placement the same
 * loss and gradients as on the device, each peak the plan's. */
START_TEST(test_long_plan_same_results)
{
	const struct ts_mlp m = {.layers = 160, .d_model = 8, .d_hidden = 24, .act = TS_ACT_TANH,
	                         .residual = true, .loss = TS_LOSS_SUM};
	struct ts_policy on = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                       .save_x = true, .save_h = true};
	struct ts_policy off = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_DEVICE,
	                        .offload_x = true, .offload_h = true, .prefetch_depth = 1};
	struct ts_exec_result r0, r1;
	struct job ref, j;

	job_new(&m, &grads_only, 4, &on, 6, &ref);
	job_run(&ref, 1, &r0);
	job_new(&m, &grads_only, 4, &off, 6, &j);
	job_run(&j, 1, &r1);
	same_loss(r1.loss, r0.loss, "long plan, offloaded");
	same_values(&ref, &j, TS_ROLE_GRAD_W1, "long plan, offloaded");
	same_values(&ref, &j, TS_ROLE_GRAD_W2, "long plan, offloaded");
	job_free(&j);
	job_free(&ref);
}
END_TEST

/* ---- 2. every placement, the same numbers ----------------------------------------- */

static void every_policy_same_results(const struct ts_mlp *m, int batch)
{
	struct job ref;
	struct ts_exec_result r0;

	for (int k = 0; k < ANY_POLICIES; k++) {
		struct ts_policy pol = any_policy(k);
		struct ts_exec_result r;
		struct job j;
		char what[160];

		job_new(m, &grads_only, batch, &pol, 2, &j);
		job_run(&j, 1, &r);
		snprintf(what, sizeof what, "policy %d (params %s, x %s, h %s, prefetch %d)", k,
		         ts_memory_kind_name(pol.params),
		         pol.save_x ? "saved" : pol.offload_x ? "offloaded" : "recomputed",
		         pol.save_h ? "saved" : pol.offload_h ? "offloaded" : "recomputed",
		         pol.prefetch_depth);
		if (k == 0) {
			ref = j;
			r0 = r;
			continue;
		}
		same_loss(r.loss, r0.loss, what);
		same_values(&ref, &j, TS_ROLE_GRAD_W1, what);
		if (ts_mlp_has_w2(m))
			same_values(&ref, &j, TS_ROLE_GRAD_W2, what);
		job_free(&j);
	}
	job_free(&ref);
}

/* Token models: every placement gives the same loss and gradients of the
 * table, the projection and the layers, each measured peak the plan's. */
static void every_policy_same_token_results(const struct ts_mlp *m, int rows)
{
	struct job ref;
	struct ts_exec_result r0;

	for (int k = 0; k < ANY_POLICIES; k++) {
		struct ts_policy pol = any_policy(k);
		struct ts_exec_result r;
		struct job j;
		char what[64];

		job_new(m, &grads_only, rows, &pol, 3, &j);
		job_run(&j, 1, &r);
		ck_assert(isfinite(r.loss) && r.loss > 0);
		snprintf(what, sizeof what, "token model, policy %d", k);
		if (k == 0) {
			ref = j;
			r0 = r;
			continue;
		}
		same_loss(r.loss, r0.loss, what);
		same_values(&ref, &j, TS_ROLE_GRAD_W1, what);
		same_values(&ref, &j, TS_ROLE_GRAD_EMBED, what);
		if (ts_mlp_has_w2(m))
			same_values(&ref, &j, TS_ROLE_GRAD_W2, what);
		if (m->proj)
			same_values(&ref, &j, TS_ROLE_GRAD_PROJ, what);
		job_free(&j);
	}
	job_free(&ref);
}

START_TEST(test_token_models_every_policy_same_results)
{
	const struct ts_mlp a = {.layers = 3, .d_model = 12, .d_hidden = 20, .act = TS_ACT_GELU,
	                         .residual = true, .loss = TS_LOSS_XENT, .vocab = 29,
	                         .proj = true, .id_bytes = 2};
	const struct ts_mlp b = {.layers = 2, .d_model = 11, .d_hidden = 0, .act = TS_ACT_TANH,
	                         .residual = false, .loss = TS_LOSS_XENT, .vocab = 11,
	                         .id_bytes = 4};

	every_policy_same_token_results(&a, 14);
	every_policy_same_token_results(&b, 9);
}
END_TEST

/* Adam on a token model, fused into the backward pass (no clipping) and
 * after it (clipping): the same on the device and streamed from the host. */
START_TEST(test_token_models_adam_same_on_device_and_host)
{
	const struct ts_mlp m = {.layers = 2, .d_model = 12, .d_hidden = 16, .act = TS_ACT_GELU,
	                         .residual = true, .loss = TS_LOSS_XENT, .vocab = 23,
	                         .proj = true, .id_bytes = 4};
	static const enum ts_pbuf_role state[] = {
		TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_EMBED, TS_ROLE_PROJ, TS_ROLE_MU_EMBED,
		TS_ROLE_NU_EMBED, TS_ROLE_MU_PROJ, TS_ROLE_NU_PROJ, TS_ROLE_MU_W1, TS_ROLE_NU_W2};

	for (int clip = 0; clip < 2; clip++) {
		const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f,
		                                  .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f,
		                                  .clip_global_norm = clip ? 0.05f : 0.0f};
		struct ts_policy pols[3] = {any_policy(1 + 3), any_policy(9 + 2 + 6 + 18),
		                            any_policy(9)};
		struct job jobs[3];
		float loss[3][3];

		pols[1].opt_state = TS_MEM_PINNED_HOST;
		for (int k = 0; k < 3; k++) {
			job_new(&m, &adam, 10, &pols[k], 6, &jobs[k]);
			for (int step = 1; step <= 3; step++) {
				struct ts_exec_result r;

				job_run(&jobs[k], step, &r);
				loss[k][step - 1] = r.loss;
			}
		}
		for (int k = 1; k < 3; k++) {
			char what[64];

			snprintf(what, sizeof what, "token adam clip=%d policy %d vs 0", clip, k);
			for (int s2 = 0; s2 < 3; s2++)
				same_loss(loss[k][s2], loss[0][s2], what);
			for (size_t i = 0; i < sizeof state / sizeof *state; i++)
				same_values(&jobs[0], &jobs[k], state[i], what);
		}
		ck_assert_float_lt(loss[0][2], loss[0][0]);
		for (int k = 0; k < 3; k++)
			job_free(&jobs[k]);
	}
}
END_TEST

START_TEST(test_every_policy_same_loss_and_gradients)
{
	const struct ts_mlp a = {.layers = 5, .d_model = 16, .d_hidden = 24, .act = TS_ACT_GELU,
	                         .residual = true, .loss = TS_LOSS_MSE};
	const struct ts_mlp b = {.layers = 4, .d_model = 12, .d_hidden = 0, .act = TS_ACT_TANH,
	                         .residual = false, .loss = TS_LOSS_SUM};

	every_policy_same_results(&a, 6);
	every_policy_same_results(&b, 5);
}
END_TEST

/* ---- 3. gradients against finite differences -------------------------------------- */

/* The loss in float64 for weights w1, w2 (doubles) and the job's inputs. */
static double loss_ref(const struct ts_mlp *m, int B, const float *x0, const float *target,
                       const double *w1, const double *w2)
{
	int d = m->d_model, h = ts_mlp_hidden(m);
	double *x = calloc((size_t)B * d, sizeof *x), *y = calloc((size_t)B * d, sizeof *y);
	double *a = calloc((size_t)B * h, sizeof *a), loss = 0;

	for (int i = 0; i < B * d; i++)
		x[i] = x0[i];
	for (int l = 0; l < m->layers; l++) {
		const double *u = w1 + (size_t)l * d * h, *v = w2 + (size_t)l * h * d;

		for (int r = 0; r < B; r++)
			for (int j = 0; j < h; j++) {
				double s = 0, c;

				for (int k = 0; k < d; k++)
					s += x[r * d + k] * u[k * h + j];
				switch (m->act) {
				case TS_ACT_GELU:
					c = 0.5 * (1 + tanh(sqrt(2 / M_PI) * (s + 0.044715 * s * s * s)));
					s *= c;
					break;
				case TS_ACT_TANH:
					s = tanh(s);
					break;
				case TS_ACT_RELU:
					s = s > 0 ? s : 0;
					break;
				default:
					break;
				}
				a[r * h + j] = s;
			}
		for (int r = 0; r < B; r++)
			for (int j = 0; j < d; j++) {
				double s = 0;

				if (ts_mlp_has_w2(m))
					for (int k = 0; k < h; k++)
						s += a[r * h + k] * v[k * d + j];
				else
					s = a[r * h + j];
				y[r * d + j] = s;
			}
		for (int i = 0; i < B * d; i++)
			x[i] = m->residual ? x[i] + y[i] : y[i];
	}
	for (int i = 0; i < B * d; i++)
		loss += m->loss == TS_LOSS_SUM ? x[i] : (x[i] - target[i]) * (x[i] - target[i]);
	free(x);
	free(y);
	free(a);
	return m->loss == TS_LOSS_SUM ? loss : loss / (B * d);
}

static void fd_check(const struct ts_mlp *m, const struct ts_policy *pol)
{
	const int B = 2;
	struct job j;
	struct ts_exec_result r;
	size_t n1, n2, nx, nt, nw1, nw2;
	float *w1, *w2, *g1, *g2, *x0, *target;
	double *dw1, *dw2;
	char what[128];

	job_new(m, &grads_only, B, pol, 3, &j);
	job_run(&j, 1, &r);
	w1 = job_read(&j, TS_ROLE_W1, &nw1);
	w2 = job_read(&j, TS_ROLE_W2, &nw2);
	g1 = job_read(&j, TS_ROLE_GRAD_W1, &n1);
	g2 = job_read(&j, TS_ROLE_GRAD_W2, &n2);
	x0 = job_read(&j, TS_ROLE_INPUT, &nx);
	target = job_read(&j, TS_ROLE_TARGET, &nt);
	ck_assert_uint_eq(n1, nw1);
	ck_assert_uint_eq(n2, nw2);
	dw1 = calloc(n1 + 1, sizeof *dw1);
	dw2 = calloc(n2 + 1, sizeof *dw2);
	for (size_t i = 0; i < n1; i++)
		dw1[i] = w1[i];
	for (size_t i = 0; i < n2; i++)
		dw2[i] = w2[i];
	snprintf(what, sizeof what, "%s residual=%d %s hidden=%d", ts_act_name(m->act),
	         m->residual, ts_loss_name(m->loss), m->d_hidden);

	/* the loss, against float64 */
	{
		double ref = loss_ref(m, B, x0, target, dw1, dw2);

		ck_assert_msg(fabs(r.loss - ref) <= 1e-5 * (fabs(ref) + 1), "%s: loss %.9g, want %.9g",
		              what, r.loss, ref);
	}
	for (size_t i = 0; i < n1 + n2; i++) {
		bool first = i < n1;
		size_t k = first ? i : i - n1;
		double *w = first ? &dw1[k] : &dw2[k], keep = *w, lp, lm, fd64, fd32, g;
		float *wf = first ? w1 : w2, wkeep = wf[k];
		const float eps32 = 1e-2f;
		struct ts_exec_result rp, rm;

		/* central differences of the float64 loss: tight */
		*w = keep + 1e-6;
		lp = loss_ref(m, B, x0, target, dw1, dw2);
		*w = keep - 1e-6;
		lm = loss_ref(m, B, x0, target, dw1, dw2);
		*w = keep;
		fd64 = (lp - lm) / 2e-6;
		g = first ? g1[k] : g2[k];
		ck_assert_msg(fabs(g - fd64) <= 1e-4 + 1e-3 * fabs(fd64),
		              "%s: d loss / d %s[%zu] = %.9g, float64 differences %.9g", what,
		              first ? "w1" : "w2", k, g, fd64);

		/* central differences of the executor's own float32 loss: loose */
		wf[k] = wkeep + eps32;
		job_write(&j, first ? TS_ROLE_W1 : TS_ROLE_W2, wf);
		job_run(&j, 1, &rp);
		wf[k] = wkeep - eps32;
		job_write(&j, first ? TS_ROLE_W1 : TS_ROLE_W2, wf);
		job_run(&j, 1, &rm);
		wf[k] = wkeep;
		job_write(&j, first ? TS_ROLE_W1 : TS_ROLE_W2, wf);
		fd32 = ((double)rp.loss - (double)rm.loss) / (2.0 * eps32);
		ck_assert_msg(fabs(g - fd32) <= 5e-3 + 1e-2 * fabs(g),
		              "%s: d loss / d %s[%zu] = %.9g, executor differences %.9g", what,
		              first ? "w1" : "w2", k, g, fd32);
	}
	free(w1);
	free(w2);
	free(g1);
	free(g2);
	free(x0);
	free(target);
	free(dw1);
	free(dw2);
	job_free(&j);
}

START_TEST(test_gradients_match_finite_differences)
{
	/* the plainest placement (device, x and h saved) and a busy one (params
	 * on the host with prefetch, x offloaded, h recomputed) */
	struct ts_policy plain = any_policy(1 + 3);
	struct ts_policy busy = any_policy(18 + 9 + 2 + 0);

	for (int k = 0; k < 8; k++) {
		struct ts_mlp m = {.layers = 2, .d_model = 3, .d_hidden = k & 4 ? 0 : 4,
		                   .act = TS_ACT_GELU, .residual = k & 1,
		                   .loss = k & 2 ? TS_LOSS_MSE : TS_LOSS_SUM};

		fd_check(&m, k % 2 ? &busy : &plain);
	}
}
END_TEST

/* ---- 3b. mixed precision -------------------------------------------------------------- */

/* x rounded to the compute dtype and back: the value a 16-bit GEMM operand has. */
static double rnd16(enum ts_compute dt, float x)
{
	return dt == TS_COMPUTE_BF16 ? ts_bf16_to_f32(ts_f32_to_bf16(x))
	                             : ts_f16_to_f32(ts_f32_to_f16(x));
}

/* C [M, N] (float32 storage) = sum over K of rounded op(A) times rounded
 * op(B), in float64: what a GEMM of the compute dtype computes exactly. */
static void ref_gemm(enum ts_compute dt, bool ta, bool tb, int M, int N, int K, const float *A,
                     const float *B, float *C)
{
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0;

			for (int k = 0; k < K; k++)
				s += rnd16(dt, ta ? A[k * M + i] : A[i * K + k]) *
				     rnd16(dt, tb ? B[j * K + k] : B[k * N + j]);
			C[i * N + j] = (float)s;
		}
}

/*
 * The float64 reference of one mixed-precision step of a relu, residual
 * mse MLP with w2: every intermediate kept in float32, as the executor
 * keeps it, every GEMM of ref_gemm (the forward's two, and per layer the
 * backward's G2 = A^T g, A = g w2^T, G1 = x^T A, gx = A w1^T). Returns the
 * loss; writes the gradients.
 */
static double lowp_ref(const struct ts_mlp *m, int B, const float *x0, const float *t,
                       const float *w1, const float *w2, float *g1, float *g2)
{
	int L = m->layers, d = m->d_model, H = m->d_hidden, n = B * d;
	float *xs = malloc(sizeof(float) * (size_t)(L + 1) * n);
	float *h = malloc(sizeof(float) * (size_t)B * H), *a = malloc(sizeof(float) * (size_t)B * H);
	float *y = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
	float *gx = malloc(sizeof(float) * (size_t)n);
	double loss = 0;

	ck_assert(xs && h && a && y && g && gx);
	memcpy(xs, x0, sizeof(float) * (size_t)n);
	for (int l = 0; l < L; l++) {
		float *x = xs + (size_t)l * n, *xn = x + n;

		ref_gemm(m->compute, false, false, B, H, d, x, w1 + (size_t)l * d * H, h);
		for (int i = 0; i < B * H; i++)
			a[i] = h[i] > 0 ? h[i] : 0;
		ref_gemm(m->compute, false, false, B, d, H, a, w2 + (size_t)l * H * d, y);
		for (int i = 0; i < n; i++)
			xn[i] = x[i] + y[i];
	}
	for (int i = 0; i < n; i++) {
		double e = (double)xs[(size_t)L * n + i] - t[i];

		loss += e * e;
		g[i] = (float)(2.0 * e / n);
	}
	for (int l = L - 1; l >= 0; l--) {
		float *x = xs + (size_t)l * n;

		ref_gemm(m->compute, false, false, B, H, d, x, w1 + (size_t)l * d * H, h);
		for (int i = 0; i < B * H; i++)
			a[i] = h[i] > 0 ? h[i] : 0;
		ref_gemm(m->compute, true, false, H, d, B, a, g, g2 + (size_t)l * H * d);
		ref_gemm(m->compute, false, true, B, H, d, g, w2 + (size_t)l * H * d, a);
		for (int i = 0; i < B * H; i++)
			a[i] = h[i] > 0 ? a[i] : 0;
		ref_gemm(m->compute, true, false, d, H, B, x, a, g1 + (size_t)l * d * H);
		if (l > 0) {
			ref_gemm(m->compute, false, true, B, d, H, a, w1 + (size_t)l * d * H, gx);
			for (int i = 0; i < n; i++)
				g[i] = gx[i] + g[i];
		}
	}
	free(xs);
	free(h);
	free(a);
	free(y);
	free(g);
	free(gx);
	return loss / n;
}

/*
 * A bfloat16 and a float16 step on the CPU kernels equal the float64
 * reference computed from rounded operands (lowp_ref) within float32
 * accumulation: 1e-5 relative (the products of rounded operands are exact
 * in float32 and in float64, only the float32 sums and the float32 storage
 * of intermediates differ, K <= 12 terms a sum), while the float32 model's
 * gradients differ from them by far more (the rounding is there: a
 * bfloat16 operand is off by up to 2^-9 relative). The measured peaks equal
 * the plan's (job_run) with the rounded copies among the temps, under two
 * placements that give the same bits.
 */
START_TEST(test_lowp_step_matches_float64_of_rounded_operands)
{
	const int B = 4;
	struct ts_policy pols[2] = {any_policy(1 + 3), any_policy(18 + 9 + 2)};

	for (int c = 0; c < 2; c++) {
		struct ts_mlp m = {.layers = 3, .d_model = 8, .d_hidden = 12, .act = TS_ACT_RELU,
		                   .residual = true, .loss = TS_LOSS_MSE,
		                   .compute = c ? TS_COMPUTE_F16 : TS_COMPUTE_BF16};
		struct ts_mlp mf = m;
		struct job j[2], jf;
		struct ts_exec_result r[2], rf;
		size_t n1, n2, nx, nt, nw1, nw2;
		float *w1, *w2, *x0, *t, *g1, *g2, *ref1, *ref2, *f1;
		double loss, worst_f32 = 0, scale = 0;

		mf.compute = TS_COMPUTE_F32;
		for (int k = 0; k < 2; k++) {
			job_new(&m, &grads_only, B, &pols[k], 11, &j[k]);
			job_run(&j[k], 1, &r[k]);
			ck_assert_uint_gt(r[k].measured_temp_peak, 0);
		}
		job_new(&mf, &grads_only, B, &pols[0], 11, &jf);
		job_run(&jf, 1, &rf);
		w1 = job_read(&j[0], TS_ROLE_W1, &nw1);
		w2 = job_read(&j[0], TS_ROLE_W2, &nw2);
		x0 = job_read(&j[0], TS_ROLE_INPUT, &nx);
		t = job_read(&j[0], TS_ROLE_TARGET, &nt);
		g1 = job_read(&j[0], TS_ROLE_GRAD_W1, &n1);
		g2 = job_read(&j[0], TS_ROLE_GRAD_W2, &n2);
		f1 = job_read(&jf, TS_ROLE_GRAD_W1, &n1);
		ref1 = malloc(n1 * sizeof *ref1);
		ref2 = malloc(n2 * sizeof *ref2);
		ck_assert(ref1 && ref2);
		loss = lowp_ref(&m, B, x0, t, w1, w2, ref1, ref2);
		ck_assert_msg(fabs(r[0].loss - loss) <= 1e-5 * fabs(loss), "%s: loss %.9g, want %.9g",
		              ts_compute_name(m.compute), r[0].loss, loss);
		for (size_t i = 0; i < n1; i++)
			scale = fmax(scale, fabs(ref1[i]));
		for (size_t i = 0; i < n2 + n1; i++) {
			bool first = i < n1;
			size_t k = first ? i : i - n1;
			double got = first ? g1[k] : g2[k], want = first ? ref1[k] : ref2[k];

			ck_assert_msg(fabs(got - want) <= 1e-5 * (fabs(want) + 1e-2 * scale),
			              "%s: d loss / d w%d[%zu] = %.9g, want %.9g",
			              ts_compute_name(m.compute), first ? 1 : 2, k, got, want);
			if (first)
				worst_f32 = fmax(worst_f32, fabs((double)f1[k] - want) /
				                            (fabs(want) + 1e-2 * scale));
		}
		ck_assert_msg(worst_f32 > 1e-4, "%s: float32 gradients within %.3g of the rounded "
		              "ones: nothing was rounded", ts_compute_name(m.compute), worst_f32);
		/* another placement, the same bits (on one backend) */
		same_loss(r[1].loss, r[0].loss, "mixed precision, two placements");
		same_values(&j[1], &j[0], TS_ROLE_GRAD_W1, "mixed precision, two placements");
		same_values(&j[1], &j[0], TS_ROLE_GRAD_W2, "mixed precision, two placements");
		fprintf(stderr, "%s step: temp %.0f B (float32 %.0f B), loss %.9g (float32 %.9g), "
		        "float32 gradients off by %.3g relative\n", ts_compute_name(m.compute),
		        (double)j[0].plan.temp_size_in_bytes, (double)jf.plan.temp_size_in_bytes,
		        r[0].loss, rf.loss, worst_f32);
		free(w1);
		free(w2);
		free(x0);
		free(t);
		free(g1);
		free(g2);
		free(f1);
		free(ref1);
		free(ref2);
		job_free(&j[0]);
		job_free(&j[1]);
		job_free(&jf);
	}
}
END_TEST

/* An Adam step of a bfloat16 model updates float32 master weights: the
 * weights after it are not all bfloat16 values, and the state is float32. */
START_TEST(test_lowp_adam_keeps_float32_master_weights)
{
	const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-3f,
	                                  .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f};
	struct ts_mlp m = {.layers = 3, .d_model = 8, .d_hidden = 12, .act = TS_ACT_GELU,
	                   .residual = true, .loss = TS_LOSS_MSE};
	struct ts_policy pol = any_policy(9 + 2 + 6 + 18);
	struct job j;
	struct ts_exec_result r;
	size_t n, off = 0;
	float *w;

	m.compute = TS_COMPUTE_BF16;
	pol.opt_state = TS_MEM_PINNED_HOST;
	job_new(&m, &adam, 4, &pol, 12, &j);
	for (int step = 1; step <= 2; step++)
		job_run(&j, step, &r);
	w = job_read(&j, TS_ROLE_W1, &n);
	for (size_t i = 0; i < n; i++)
		off += ts_bf16_to_f32(ts_f32_to_bf16(w[i])) != w[i];
	ck_assert_msg(off > n / 2, "%zu of %zu weights are not bfloat16 values", off, n);
	free(w);
	job_free(&j);
}
END_TEST

/* A bfloat16 token model with its projection: every placement gives the
 * same bits and measures the plan's peaks (job_run), and its loss is not
 * the float32 model's (the projection and layers multiply rounded). */
START_TEST(test_lowp_token_model_every_policy)
{
	struct ts_mlp m = {.layers = 2, .d_model = 12, .d_hidden = 20, .act = TS_ACT_GELU,
	                   .residual = true, .loss = TS_LOSS_XENT, .vocab = 29, .proj = true,
	                   .id_bytes = 2, .compute = TS_COMPUTE_BF16};
	struct ts_policy pol = any_policy(1 + 3);
	struct ts_exec_result r16, r32;
	struct job j;

	every_policy_same_token_results(&m, 14);
	job_new(&m, &grads_only, 14, &pol, 3, &j);
	job_run(&j, 1, &r16);
	job_free(&j);
	m.compute = TS_COMPUTE_F32;
	job_new(&m, &grads_only, 14, &pol, 3, &j);
	job_run(&j, 1, &r32);
	job_free(&j);
	ck_assert_msg(r16.loss != r32.loss && fabs(r16.loss - r32.loss) < 1e-2 * fabs(r32.loss),
	              "bfloat16 loss %.9g, float32 %.9g", r16.loss, r32.loss);
}
END_TEST

/* ---- 4. optimizers ------------------------------------------------------------------ */

static const struct ts_mlp small = {.layers = 3, .d_model = 8, .d_hidden = 12,
                                    .act = TS_ACT_GELU, .residual = true,
                                    .loss = TS_LOSS_MSE};

START_TEST(test_adam_with_clipping_same_on_device_and_host)
{
	const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f,
	                                  .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f,
	                                  .clip_global_norm = 0.05f};
	static const enum ts_pbuf_role state[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_MU_W1,
	                                          TS_ROLE_MU_W2, TS_ROLE_NU_W1, TS_ROLE_NU_W2};
	struct ts_policy pols[4] = {
		any_policy(1 + 3),                  /* all on device, saved */
		any_policy(9 + 2 + 6 + 18),         /* params host, x and h offloaded, prefetch */
		any_policy(0),                      /* device, everything recomputed */
		any_policy(9 + 1),                  /* params host, x saved, h recomputed */
	};
	struct job jobs[4];
	float loss[4][3];

	pols[1].opt_state = TS_MEM_PINNED_HOST;
	pols[2].opt_state = TS_MEM_PINNED_HOST;
	for (int k = 0; k < 4; k++) {
		job_new(&small, &adam, 4, &pols[k], 5, &jobs[k]);
		for (int step = 1; step <= 3; step++) {
			struct ts_exec_result r;

			job_run(&jobs[k], step, &r);
			loss[k][step - 1] = r.loss;
		}
	}
	for (int k = 1; k < 4; k++) {
		char what[64];

		snprintf(what, sizeof what, "adam policy %d vs 0", k);
		for (int s = 0; s < 3; s++)
			same_loss(loss[k][s], loss[0][s], what);
		for (size_t i = 0; i < sizeof state / sizeof *state; i++)
			same_values(&jobs[0], &jobs[k], state[i], what);
	}
	/* the steps trained: the loss went down */
	ck_assert_float_lt(loss[0][2], loss[0][0]);
	for (int k = 0; k < 4; k++)
		job_free(&jobs[k]);
}
END_TEST

/* Adam's first step from zero state, with the global norm clipped, against
 * optax's formulas in float64 from the gradients of an optimizer-less run. */
START_TEST(test_adam_first_step_matches_optax)
{
	const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f,
	                                  .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-3f,
	                                  .clip_global_norm = 0.05f};
	struct ts_policy pol = any_policy(9 + 2 + 18);
	struct job jg, ja;
	struct ts_exec_result r;
	size_t n[2], np, nm, nv;
	float *g[2];
	double norm = 0, scale;
	static const enum ts_pbuf_role gr[2] = {TS_ROLE_GRAD_W1, TS_ROLE_GRAD_W2};
	static const enum ts_pbuf_role pr[2] = {TS_ROLE_W1, TS_ROLE_W2};
	static const enum ts_pbuf_role mr[2] = {TS_ROLE_MU_W1, TS_ROLE_MU_W2};
	static const enum ts_pbuf_role vr[2] = {TS_ROLE_NU_W1, TS_ROLE_NU_W2};

	pol.opt_state = TS_MEM_PINNED_HOST;
	job_new(&small, &grads_only, 4, &pol, 6, &jg);
	job_run(&jg, 1, &r);
	for (int k = 0; k < 2; k++) {
		g[k] = job_read(&jg, gr[k], &n[k]);
		for (size_t i = 0; i < n[k]; i++)
			norm += (double)g[k][i] * g[k][i];
	}
	norm = sqrt(norm);
	ck_assert_msg(norm > adam.clip_global_norm, "norm %g does not clip", norm);
	scale = adam.clip_global_norm / norm;
	job_new(&small, &adam, 4, &pol, 6, &ja);
	job_run(&ja, 1, &r);
	for (int k = 0; k < 2; k++) {
		float *p0 = job_read(&jg, pr[k], &np), *p1 = job_read(&ja, pr[k], &np);
		float *mu = job_read(&ja, mr[k], &nm), *nu = job_read(&ja, vr[k], &nv);

		ck_assert_uint_eq(np, n[k]);
		for (size_t i = 0; i < np; i++) {
			double gc = g[k][i] * scale, m = (1 - adam.b1) * gc;
			double v = (1 - adam.b2) * gc * gc;
			double want = p0[i] - adam.learning_rate * (m / (1 - adam.b1)) /
			                      (sqrt(v / (1 - adam.b2)) + adam.eps);

			ck_assert_msg(fabs(mu[i] - m) <= 1e-5 * fabs(m) + 1e-12, "mu[%zu] %.9g, want %.9g",
			              i, mu[i], m);
			ck_assert_msg(fabs(nu[i] - v) <= 1e-5 * fabs(v) + 1e-15, "nu[%zu] %.9g, want %.9g",
			              i, nu[i], v);
			ck_assert_msg(fabs(p1[i] - want) <= 1e-6 + 1e-5 * fabs(want),
			              "w%d[%zu] %.9g, want %.9g", k + 1, i, p1[i], want);
		}
		free(p0);
		free(p1);
		free(mu);
		free(nu);
		free(g[k]);
	}
	job_free(&jg);
	job_free(&ja);
}
END_TEST

START_TEST(test_sgd_step_is_minus_lr_grad)
{
	const struct ts_optimizer sgd = {.type = TS_OPT_SGD, .learning_rate = 0.1f};
	const int pols[3] = {1 + 3, 9 + 2 + 18, 9 + 6};

	for (int k = 0; k < 3; k++) {
		struct ts_policy pol = any_policy(pols[k]);
		struct job jg, js;
		struct ts_exec_result rg, rs;

		job_new(&small, &grads_only, 4, &pol, 7, &jg);
		job_new(&small, &sgd, 4, &pol, 7, &js);
		job_run(&jg, 1, &rg);
		job_run(&js, 1, &rs);
		same_loss(rs.loss, rg.loss, "sgd");
		for (int w = 0; w < 2; w++) {
			size_t n, ng, n1;
			float *p0 = job_read(&jg, w ? TS_ROLE_W2 : TS_ROLE_W1, &n);
			float *g = job_read(&jg, w ? TS_ROLE_GRAD_W2 : TS_ROLE_GRAD_W1, &ng);
			float *p1 = job_read(&js, w ? TS_ROLE_W2 : TS_ROLE_W1, &n1);

			ck_assert_uint_eq(n, ng);
			ck_assert_uint_eq(n, n1);
			for (size_t i = 0; i < n; i++) {
				float want = p0[i] - sgd.learning_rate * g[i];

				/* on CUDA the update may be one fused multiply-add */
				ck_assert_msg(fused ? fabs((double)p1[i] - want) <= 1e-6 * (fabs(want) + 1e-3)
				                    : agree(p1[i], want, 1.0),
				              "policy %d w%d[%zu]: %.9g, want %.9g",
				              pols[k], w + 1, i, p1[i], want);
			}
			free(p0);
			free(g);
			free(p1);
		}
		job_free(&jg);
		job_free(&js);
	}
}
END_TEST

/* ---- 5. failures ------------------------------------------------------------------ */

static const struct ts_optimizer adam_opt = {.type = TS_OPT_ADAM, .learning_rate = 1e-3f,
                                             .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f,
                                             .clip_global_norm = 1.0f};

static const struct ts_mlp mid = {.layers = 6, .d_model = 64, .d_hidden = 128,
                                  .act = TS_ACT_GELU, .residual = true, .loss = TS_LOSS_MSE};

/* An Adam step with everything offloaded. */
static void offloaded_job(struct job *j)
{
	struct ts_policy pol = any_policy(9 + 2 + 6 + 18);

	pol.opt_state = TS_MEM_PINNED_HOST;
	job_new(&mid, &adam_opt, 16, &pol, 8, j);
}

/* The value of an error's metadata key, or NULL. */
static const char *meta(const struct ts_error *e, const char *key)
{
	for (int i = 0; i < e->nmeta; i++)
		if (strcmp(e->meta[i].key, key) == 0)
			return e->meta[i].value;
	return NULL;
}

/* Every argument's bytes (NULL for temps), to compare after a failure. */
static void **snapshot(const struct job *j)
{
	void **snap = calloc((size_t)j->plan.nbufs, sizeof *snap);

	ck_assert_ptr_nonnull(snap);
	for (int i = 0; i < j->plan.nbufs; i++) {
		if (j->plan.bufs[i].cls != TS_PB_ARGUMENT)
			continue;
		snap[i] = malloc(j->plan.bufs[i].bytes);
		ck_assert_ptr_nonnull(snap[i]);
		get(j, i, snap[i], j->plan.bufs[i].bytes);
	}
	return snap;
}

/* Every argument holds the bytes of snap, byte for byte. */
static void same_as_snapshot(const struct job *j, void **snap, const char *when)
{
	for (int i = 0; i < j->plan.nbufs; i++) {
		void *now;

		if (!snap[i])
			continue;
		now = malloc(j->plan.bufs[i].bytes);
		ck_assert_ptr_nonnull(now);
		get(j, i, now, j->plan.bufs[i].bytes);
		ck_assert_msg(memcmp(now, snap[i], j->plan.bufs[i].bytes) == 0,
		              "%s: argument %d (role %d, %s) changed", when, i,
		              (int)j->plan.bufs[i].role, ts_memory_kind_name(j->plan.bufs[i].kind));
		free(now);
	}
}

static void snapshot_free(const struct job *j, void **snap)
{
	for (int i = 0; i < j->plan.nbufs; i++)
		free(snap[i]);
	free(snap);
}

START_TEST(test_copy_failure_releases_every_temp)
{
	static const enum ts_pbuf_role state[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_MU_W1,
	                                          TS_ROLE_MU_W2, TS_ROLE_NU_W1, TS_ROLE_NU_W2};
	struct job j, fresh;
	struct ts_exec_result r;
	uint64_t dev0, host0;
	ts_status st;

	offloaded_job(&j);
	offloaded_job(&fresh);
	dev0 = in_use(dsp);
	host0 = in_use(psp);
	/* the first copy fails, or every copy */
	for (int n = 1; n <= 1000; n += 999) {
		ts__sim_inject_copy_failure(dev, n);
		ts_error_clear(&err);
		st = ts_exec_run(&j.plan, &env, j.args, j.outs, 1, &r, &err);
		ts__sim_inject_copy_failure(dev, 0);
		ck_assert_int_eq(st, TS_INTERNAL);
		ck_assert_str_eq(err.reason, "COPY_FAILED");
		/* the parameters and state are whole */
		ck_assert_uint_eq(in_use(dsp), dev0);
		ck_assert_uint_eq(in_use(psp), host0);
		for (size_t i = 0; i < sizeof state / sizeof *state; i++)
			same_values(&j, &fresh, state[i], "after a failed step");
	}
	/* the queues are clean again: the next step runs, as on a fresh job */
	{
		struct ts_exec_result rf;

		job_run(&j, 1, &r);
		job_run(&fresh, 1, &rf);
		ck_assert(memcmp(&r.loss, &rf.loss, sizeof r.loss) == 0);
	}
	job_free(&j);
	job_free(&fresh);
}
END_TEST

/*
 * A copy that fails anywhere in a step - before the first update, between
 * updates, while optimizer state streams in and out - leaves every argument
 * byte for byte as it was, whatever the placement: params and state on the
 * device, on pinned_host, mixed, with residuals offloaded (copies after the
 * first in-place update). The next step then runs as on an untouched job.
 */
static void fail_mid_step(const struct ts_mlp *m, const struct ts_optimizer *o,
                          struct ts_policy pol, const char *what)
{
	struct job j, fresh;
	struct ts_exec_result r, rf;
	uint64_t dev0, host0, per_step, c0;
	int failed = 0, done = 1;

	job_new(m, o, 16, &pol, 8, &j);
	job_new(m, o, 16, &pol, 8, &fresh);
	c0 = ts_device_copies(dev);
	job_run(&j, 1, &r);
	job_run(&fresh, 1, &rf);
	per_step = (ts_device_copies(dev) - c0) / 2;
	ck_assert_uint_gt(per_step, 2);
	dev0 = in_use(dsp);
	host0 = in_use(psp);
	for (int k = 1; k <= 8; k++) {
		void **snap = snapshot(&j);
		ts_status st;
		char when[160];

		/* copy per_step * k / 9 of the step fails, whatever the timing */
		ts__sim_inject_copy_failure_after(dev, (int)(per_step * (uint64_t)k / 9), 1);
		ts_error_clear(&err);
		st = ts_exec_run(&j.plan, &env, j.args, j.outs, done + 1, &r, &err);
		ts__sim_inject_copy_failure(dev, 0);
		ck_assert_uint_eq(in_use(dsp), dev0);
		ck_assert_uint_eq(in_use(psp), host0);
		snprintf(when, sizeof when, "%s, a copy failing after %d/9 of a step", what, k);
		if (st == TS_OK) {
			/* a step with fewer copies than the first: it went through */
			publish(&j);
			job_run(&fresh, ++done, &rf);
			snapshot_free(&j, snap);
			continue;
		}
		ck_assert_msg(st == TS_INTERNAL, "%s: %s", when, err.message);
		ck_assert_str_eq(err.reason, "COPY_FAILED");
		ck_assert_ptr_null(meta(&err, "partial_update"));
		same_as_snapshot(&j, snap, when);
		snapshot_free(&j, snap);
		failed++;
	}
	ck_assert_msg(failed == 8, "%s: %d of 8 injected failures landed in a step", what, failed);
	/* whole and trainable: the next step equals an untouched job's */
	job_run(&j, done + 1, &r);
	job_run(&fresh, done + 1, &rf);
	ck_assert_msg(memcmp(&r.loss, &rf.loss, sizeof r.loss) == 0, "%s: loss %g, untouched %g",
	              what, (double)r.loss, (double)rf.loss);
	for (int i = 0; i < j.plan.nbufs; i++)
		if (j.plan.bufs[i].cls == TS_PB_ARGUMENT && j.plan.bufs[i].role <= TS_ROLE_NU_W2)
			same_values(&j, &fresh, j.plan.bufs[i].role, what);
	job_free(&j);
	job_free(&fresh);
}

START_TEST(test_copy_failure_mid_step_leaves_every_array_whole)
{
	static const struct ts_optimizer adam_fused = {.type = TS_OPT_ADAM,
	                                               .learning_rate = 1e-3f, .b1 = 0.9f,
	                                               .b2 = 0.999f, .eps = 1e-8f};
	struct ts_policy pol = any_policy(9 + 2 + 6 + 18);

	pol.opt_state = TS_MEM_PINNED_HOST;
	fail_mid_step(&mid, &adam_opt, pol, "all offloaded, clipped");
	fail_mid_step(&mid, &adam_fused, pol, "all offloaded, fused update");
	pol = guide_policy(false, true, 0);
	fail_mid_step(&mid, &adam_fused, pol, "on the device, x offloaded, fused update");
	pol.opt_state = TS_MEM_PINNED_HOST;
	fail_mid_step(&mid, &adam_fused, pol, "params on the device, state on pinned_host");
	pol = guide_policy(true, false, 1);
	fail_mid_step(&mid, &adam_fused, pol, "params on pinned_host, state on the device");
}
END_TEST

#ifdef TS_FAULT_BUILD
#include "common/fault.h"

/*
 * The walk over every failure point of a step (a fault build): each
 * allocation (device, pinned, heap) and each copy of one step fails in turn;
 * a step that fails leaves every argument byte for byte as it was, a step
 * that absorbed the failure trained, and either way the job keeps training
 * exactly as an untouched one.
 */
static void job_new_acc(const struct ts_mlp *m, const struct ts_optimizer *o, int batch,
                        int accumulate, const struct ts_policy *pol, unsigned seed,
                        struct job *j);

static void walk_step_k(const struct ts_mlp *m, const struct ts_optimizer *o,
                        struct ts_policy pol, int micro, const char *what)
{
	static const enum ts_fault_kind kinds[] = {TS_FAULT_COPY, TS_FAULT_ALLOC_HEAP,
	                                           TS_FAULT_ALLOC_DEVICE, TS_FAULT_ALLOC_PINNED,
	                                           TS_FAULT_ALLOC_PAGEABLE};
	struct job j, fresh;
	struct ts_exec_result r, rf;
	int done = 1, failed = 0, points = 0;

	job_new_acc(m, o, 16, micro, &pol, 8, &j);
	job_new_acc(m, o, 16, micro, &pol, 8, &fresh);
	job_run(&j, 1, &r);
	job_run(&fresh, 1, &rf);
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		uint64_t n;

		ts_fault_arm(kinds[k], 0);
		job_run(&j, ++done, &r);
		n = ts_fault_count(kinds[k]);
		job_run(&fresh, done, &rf);
		for (uint64_t at = 1; at <= n; at++) {
			void **snap = snapshot(&j);
			uint64_t dev0 = in_use(dsp), host0 = in_use(psp);
			char when[200];
			ts_status st;

			snprintf(when, sizeof when, "%s: %s point %llu of %llu", what,
			         ts_fault_kind_name(kinds[k]), (unsigned long long)at,
			         (unsigned long long)n);
			ts_fault_arm(kinds[k], at);
			ts_error_clear(&err);
			st = ts_exec_run(&j.plan, &env, j.args, j.outs, done + 1, &r, &err);
			ck_assert_msg(ts_fault_fired() == 1, "%s: not reached", when);
			ts_fault_arm(kinds[k], 0);
			ck_assert_msg(in_use(dsp) == dev0 && in_use(psp) == host0,
			              "%s: memory in use changed", when);
			points++;
			if (st == TS_OK) {
				publish(&j);
				job_run(&fresh, ++done, &rf);
			} else {
				ck_assert_msg(st == TS_INTERNAL || st == TS_RESOURCE_EXHAUSTED,
				              "%s: %s %s", when, ts_status_name(st), err.message);
				same_as_snapshot(&j, snap, when);
				failed++;
			}
			snapshot_free(&j, snap);
		}
	}
	job_run(&j, done + 1, &r);
	job_run(&fresh, done + 1, &rf);
	ck_assert_msg(memcmp(&r.loss, &rf.loss, sizeof r.loss) == 0, "%s: loss %g, untouched %g",
	              what, (double)r.loss, (double)rf.loss);
	for (int i = 0; i < j.plan.nbufs; i++)
		if (j.plan.bufs[i].cls == TS_PB_ARGUMENT && j.plan.bufs[i].role <= TS_ROLE_NU_W2)
			same_values(&j, &fresh, j.plan.bufs[i].role, what);
	fprintf(stderr, "%s: %d failure points, %d failed cleanly, %d absorbed\n", what, points,
	        failed, points - failed);
	ck_assert_int_gt(failed, 0);
	job_free(&j);
	job_free(&fresh);
}

static void walk_step(const struct ts_mlp *m, const struct ts_optimizer *o,
                      struct ts_policy pol, const char *what)
{
	walk_step_k(m, o, pol, 1, what);
}

START_TEST(test_every_failure_point_of_a_step_leaves_every_array_whole)
{
	static const struct ts_optimizer adam_fused = {.type = TS_OPT_ADAM,
	                                               .learning_rate = 1e-3f, .b1 = 0.9f,
	                                               .b2 = 0.999f, .eps = 1e-8f};
	static const struct ts_mlp walk_mlp = {.layers = 3, .d_model = 32, .d_hidden = 48,
	                                    .act = TS_ACT_GELU, .residual = true,
	                                    .loss = TS_LOSS_MSE};
	struct ts_policy pol = any_policy(9 + 2 + 6 + 18);

	pol.opt_state = TS_MEM_PINNED_HOST;
	walk_step(&walk_mlp, &adam_opt, pol, "all offloaded, clipped");
	walk_step(&walk_mlp, &adam_fused, pol, "all offloaded, fused");
	pol = guide_policy(false, true, 0);
	walk_step(&walk_mlp, &adam_fused, pol, "on the device, x offloaded");
	walk_step(&walk_mlp, &adam_opt, pol, "on the device, x offloaded, clipped");
	pol.opt_state = TS_MEM_PINNED_HOST;
	walk_step(&walk_mlp, &adam_fused, pol, "params on the device, state on pinned_host");
	pol = guide_policy(true, false, 1);
	walk_step(&walk_mlp, &adam_fused, pol, "params on pinned_host, state on the device");
	pol = guide_policy(false, false, 0);
	walk_step(&walk_mlp, &adam_fused, pol, "everything on the device");
	walk_step_k(&walk_mlp, &adam_fused, pol, 2, "everything on the device, 2 micro-batches");
	pol = guide_policy(true, true, 1);
	pol.opt_state = TS_MEM_PINNED_HOST;
	walk_step_k(&walk_mlp, &adam_opt, pol, 3, "all offloaded, clipped, 3 micro-batches");
}
END_TEST
#endif

START_TEST(test_out_of_memory_mid_step_releases_every_temp)
{
	struct job j;
	struct ts_exec_result r;
	struct ts_space_stats s;
	uint64_t dev0, host0;
	void *filler = NULL;
	uint64_t fsize;
	ts_status st;

	offloaded_job(&j);
	dev0 = in_use(dsp);
	host0 = in_use(psp);
	/* leave room for half the step's temps: it fails somewhere inside */
	ts_space_stats(dsp, &s);
	fsize = s.largest_free_block_bytes - j.plan.temp_size_in_bytes / 2;
	OK(ts_space_alloc(dsp, fsize, &filler, &err));
	ts_error_clear(&err);
	st = ts_exec_run(&j.plan, &env, j.args, j.outs, 1, &r, &err);
	ck_assert_int_eq(st, TS_RESOURCE_EXHAUSTED);
	ck_assert_uint_eq(in_use(dsp), dev0 + fsize);
	ck_assert_uint_eq(in_use(psp), host0);
	ts_space_release(dsp, filler, fsize);
	job_run(&j, 1, &r);
	job_free(&j);
}
END_TEST

START_TEST(test_bad_arguments_refused)
{
	struct job j;
	struct ts_exec_result r;
	struct ts_exec_env no_queue = env;
	void *keep;
	int i;

	offloaded_job(&j);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run(NULL, &env, j.args, j.outs, 1, &r, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run(&j.plan, NULL, j.args, j.outs, 1, &r, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run(&j.plan, &env, NULL, NULL, 1, &r, &err), TS_INVALID_ARGUMENT);
	no_queue.h2d = NULL;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run(&j.plan, &no_queue, j.args, j.outs, 1, &r, &err),
	                 TS_INVALID_ARGUMENT);
	i = role_index(&j.plan, TS_ROLE_INPUT);
	keep = j.args[i];
	j.args[i] = NULL;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run(&j.plan, &env, j.args, j.outs, 1, &r, &err), TS_INVALID_ARGUMENT);
	j.args[i] = keep;
	/* Adam counts steps from 1: refused when enqueued, everything released */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run(&j.plan, &env, j.args, j.outs, 0, &r, &err), TS_INVALID_ARGUMENT);
	ck_assert_uint_eq(in_use(dsp), j.plan.argument_size_in_bytes);
	job_run(&j, 1, &r);
	job_free(&j);
}
END_TEST

/* ---- evaluation ---------------------------------------------------------------- */

/* An evaluation under every params placement, prefetch and outputs kind:
 * its measured peak and bytes are the plan's (job_run), its loss is the
 * step's before the update (bit for bit where exact), its outputs agree
 * with its loss and are the same under every policy, and it writes no
 * argument. */
START_TEST(test_evaluation_is_the_steps_forward)
{
	const struct ts_mlp m = {.layers = 4, .d_model = 64, .d_hidden = 128, .act = TS_ACT_GELU,
	                         .residual = true, .loss = TS_LOSS_MSE};
	struct ts_policy dp = guide_policy(false, false, 0);
	struct ts_exec_result rs, r;
	struct job st, first;
	bool have = false;

	job_new(&m, &grads_only, 32, &dp, 3, &st);
	job_run(&st, 1, &rs);
	for (int k = 0; k < 8; k++) {
		struct ts_policy pol = guide_policy(k & 1, false, (k >> 1) & 1);
		enum ts_memory_kind kind = k & 4 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE;
		size_t nw0, nw1, no, nt;
		float *w0, *w1, *out, *tgt;
		double sum = 0;
		struct job ev;
		char what[96];

		snprintf(what, sizeof what, "evaluation params_host=%d prefetch=%d outputs %s", k & 1,
		         (k >> 1) & 1, ts_memory_kind_name(kind));
		job_new_eval(&m, 32, &pol, true, kind, 3, &ev);
		w0 = job_read(&ev, TS_ROLE_W1, &nw0);
		job_run(&ev, 1, &r);
		say(what, &ev.plan, &r);
		{
			struct ts_plan sp;      /* a step under the same policy needs more */

			OK(ts_plan_build(&m, &grads_only, 32, &pol, &sp, &err));
			ck_assert_uint_lt(ev.plan.temp_size_in_bytes, sp.temp_size_in_bytes);
			ts_plan_release(&sp);
		}
		same_loss(r.loss, rs.loss, what);
		w1 = job_read(&ev, TS_ROLE_W1, &nw1);
		ck_assert_uint_eq(nw0, nw1);
		ck_assert_msg(memcmp(w0, w1, nw0 * sizeof *w0) == 0, "%s: w1 was written", what);
		out = job_read(&ev, TS_ROLE_OUTPUT, &no);
		tgt = job_read(&ev, TS_ROLE_TARGET, &nt);
		ck_assert_uint_eq(no, (size_t)32 * 64);
		ck_assert_uint_eq(nt, no);
		for (size_t i = 0; i < no; i++) {
			ck_assert_msg(isfinite(out[i]), "%s: outputs[%zu] not written", what, i);
			sum += ((double)out[i] - tgt[i]) * ((double)out[i] - tgt[i]);
		}
		ck_assert_msg(fabs(sum / (double)no - r.loss) <= 1e-5 * fabs(r.loss),
		              "%s: the outputs' mse %.9g is not the loss %.9g", what, sum / (double)no,
		              (double)r.loss);
		free(w0);
		free(w1);
		free(out);
		free(tgt);
		if (!have) {
			first = ev;
			have = true;
			continue;
		}
		same_values(&first, &ev, TS_ROLE_OUTPUT, what);
		job_free(&ev);
	}
	job_free(&first);
	job_free(&st);
}
END_TEST

/* The same through a session, by role: only params, inputs, targets and
 * outputs have slots; the loss and outputs are the executor's. */
START_TEST(test_evaluation_session_binds_by_role)
{
	const struct ts_mlp m = {.layers = 3, .d_model = 64, .d_hidden = 128, .act = TS_ACT_TANH,
	                         .residual = true, .loss = TS_LOSS_MSE};
	struct ts_policy pol = guide_policy(true, false, 1);
	struct ts_session_config cfg = {.dev = dev, .memory = mem, .mlp = m, .policy = pol,
	                                .batch = 16, .evaluate = true, .outputs = true,
	                                .outputs_kind = TS_MEM_PINNED_HOST};
	const struct ts_session_report *rep;
	struct ts_session *sess;
	struct ts_exec_result r;
	struct job ev;
	size_t nx, nt, no;
	float *x, *t, *want;
	void *px, *pt, *po;
	uint64_t xb = 16 * 64 * sizeof(float);

	job_new_eval(&m, 16, &pol, true, TS_MEM_PINNED_HOST, 5, &ev);
	job_run(&ev, 1, &r);
	x = job_read(&ev, TS_ROLE_INPUT, &nx);
	t = job_read(&ev, TS_ROLE_TARGET, &nt);
	want = job_read(&ev, TS_ROLE_OUTPUT, &no);
	OK(ts_session_new(&cfg, &sess, &err));
	ck_assert(ts_session_has_role(sess, TS_ROLE_W1) && ts_session_has_role(sess, TS_ROLE_W2));
	ck_assert(ts_session_has_role(sess, TS_ROLE_OUTPUT));
	ck_assert(!ts_session_has_role(sess, TS_ROLE_MU_W1));
	ck_assert(!ts_session_has_role(sess, TS_ROLE_GRAD_W1));
	ck_assert(!ts_session_versioned(sess, TS_ROLE_W1));
	for (int k = 0; k < 2; k++) {
		enum ts_pbuf_role role = k ? TS_ROLE_W2 : TS_ROLE_W1;
		int i = role_index(&ev.plan, role);

		OK(ts_session_bind(sess, role, ev.args[i], ev.plan.bufs[i].bytes, TS_MEM_PINNED_HOST,
		                   &err));
	}
	OK(ts_space_alloc(psp, xb, &px, &err));
	OK(ts_space_alloc(psp, xb, &pt, &err));
	OK(ts_space_alloc(psp, xb, &po, &err));
	memcpy(px, x, xb);
	memcpy(pt, t, xb);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_bind(sess, TS_ROLE_OUTPUT, po, xb, TS_MEM_DEVICE, &err),
	                 TS_FAILED_PRECONDITION);
	ck_assert_ptr_nonnull(strstr(err.message, "outputs"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_bind(sess, TS_ROLE_MU_W1, po, xb, TS_MEM_DEVICE, &err),
	                 TS_INVALID_ARGUMENT);
	OK(ts_session_bind(sess, TS_ROLE_OUTPUT, po, xb, TS_MEM_PINNED_HOST, &err));
	OK(ts_session_stage(sess, TS_ROLE_INPUT, &(struct ts_session_source){
		.mem = px, .bytes = xb, .row_bytes = 64 * sizeof(float), .src_dev = dev,
		.src_kind = TS_MEM_PINNED_HOST}, &err));
	OK(ts_session_stage(sess, TS_ROLE_TARGET, &(struct ts_session_source){
		.mem = pt, .bytes = xb, .row_bytes = 64 * sizeof(float), .src_dev = dev,
		.src_kind = TS_MEM_PINNED_HOST}, &err));
	OK(ts_session_run(sess, 1, 1, NULL, NULL, &err));
	rep = ts_session_report(sess);
	ck_assert_uint_eq(rep->steps, 1);
	same_loss(rep->losses[0], r.loss, "session evaluation");
	ck_assert_uint_eq(rep->measured_temp_peak, ts_session_plan(sess)->temp_size_in_bytes);
	ck_assert_uint_eq(rep->staged_h2d_bytes, 2 * xb);
	ck_assert(ts_session_plan(sess)->evaluate);
	ck_assert_uint_eq(no * sizeof(float), xb);
	ck_assert_msg(memcmp(po, want, xb) == 0, "the session's outputs are not the executor's");
	ts_session_free(sess);
	ts_space_release(psp, px, xb);
	ts_space_release(psp, pt, xb);
	ts_space_release(psp, po, xb);
	free(x);
	free(t);
	free(want);
	job_free(&ev);
}
END_TEST

static void add_common(TCase *tc)
{
	tcase_add_test(tc, test_guide_peaks_equal_the_plan);
	tcase_add_test(tc, test_peak_is_the_steps_own_while_others_allocate);
	tcase_add_test(tc, test_host_enqueues_the_whole_step_while_compute_is_held);
	tcase_add_test(tc, test_long_plan_same_results);
	tcase_add_test(tc, test_every_policy_same_loss_and_gradients);
	tcase_add_test(tc, test_gradients_match_finite_differences);
	tcase_add_test(tc, test_adam_with_clipping_same_on_device_and_host);
	tcase_add_test(tc, test_adam_first_step_matches_optax);
	tcase_add_test(tc, test_sgd_step_is_minus_lr_grad);
	tcase_add_test(tc, test_out_of_memory_mid_step_releases_every_temp);
	tcase_add_test(tc, test_bad_arguments_refused);
	tcase_add_test(tc, test_evaluation_is_the_steps_forward);
	tcase_add_test(tc, test_evaluation_session_binds_by_role);
}

/* Token models' cases: they run the token kernels (k_embed_fwd,
 * k_embed_bwd, k_xent_rows, k_xent_mean). */
static void add_tokens(TCase *tc)
{
	tcase_add_test(tc, test_token_models_every_policy_same_results);
	tcase_add_test(tc, test_token_models_adam_same_on_device_and_host);
}

/* Mixed-precision models' cases (k_round, cublasGemmEx). */
static void add_lowp(TCase *tc)
{
	tcase_add_test(tc, test_lowp_guide_peaks_equal_the_plan);
	tcase_add_test(tc, test_lowp_step_matches_float64_of_rounded_operands);
	tcase_add_test(tc, test_lowp_adam_keeps_float32_master_weights);
	tcase_add_test(tc, test_lowp_token_model_every_policy);
}

/* ---- the GPT kind ---------------------------------------------------------------- */

/* A small GPT: vocab 37, windows of 8 tokens, 2 blocks of width 16 with 4
 * heads and an MLP of 32, batches of 2 windows (16 rows). */
static const struct ts_mlp tiny_gpt = {.layers = 2, .d_model = 16, .d_hidden = 32,
                                       .act = TS_ACT_GELU, .loss = TS_LOSS_XENT,
                                       .vocab = 37, .id_bytes = 4, .gpt = true, .heads = 4,
                                       .context = 8};

#define A(n) (1u << TS_GPT_A_##n)

/* A block's intermediates by name (gpt.h): each saved, offloaded or
 * recomputed, mixed, and with "h" beside mlp_act. */
static const struct {
	unsigned save, offload;
	bool save_h, offload_h;
} gpt_named[] = {
	{A(ATTN) | A(LN2), A(QKV) | A(MLP_ACT) | A(RESID), false, false},
	{0, A(MLP_ACT), false, true},                                   /* all on the host */
	{A(LN1) | A(LN2) | A(MLP_H), A(ATTN_OUT) | A(RESID), false, false},
	{0, A(MLP_ACT), true, false},
	{A(MLP_ACT), 0, false, false},
	{A(ATTN), 0, false, false},
	{A(MLP_ACT), 0, false, true},
	{A(QKV) | A(ATTN_OUT), A(LN1) | A(LN2), false, false},
	{A(RESID) | A(MLP_H) | A(MLP_ACT), A(ATTN), false, false},
	{A(LN1), A(QKV) | A(ATTN) | A(ATTN_OUT) | A(RESID) | A(LN2) | A(MLP_H), false, false},
	{TS_GPT_ACTS_H | A(MLP_ACT), 0, false, false},
	{A(QKV) | A(ATTN), A(MLP_H) | A(MLP_ACT), false, false},
};

#define GPT_BASE 72
#define GPT_POLICIES (GPT_BASE + (int)(sizeof gpt_named / sizeof gpt_named[0]))

/* Every GPT policy the planner takes: params and optimizer state on the
 * device or pinned_host, x saved, offloaded or recomputed, h saved,
 * offloaded or recomputed, prefetch 0 or 1 (the first GPT_BASE); then the
 * intermediates by name (gpt_named) under placements of the same kinds. */
static struct ts_policy gpt_policy(int k)
{
	int j = k - GPT_BASE;
	struct ts_policy p = {.params = k % 2 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
	                      .opt_state = (k / 2) % 2 ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE,
	                      .save_x = (k / 4) % 3 == 1, .offload_x = (k / 4) % 3 == 2,
	                      .save_h = (k / 12) % 3 == 1, .offload_h = (k / 12) % 3 == 2,
	                      .prefetch_depth = (k / 36) % 2};

	if (j < 0)
		return p;
	p.save_x = j % 3 == 1;
	p.offload_x = j % 3 == 2;
	p.prefetch_depth = (j / 4) % 2;
	p.save_acts = gpt_named[j].save;
	p.offload_acts = gpt_named[j].offload;
	p.save_h = gpt_named[j].save_h;
	p.offload_h = gpt_named[j].offload_h;
	return p;
}

/* The next policy a case visits: all of them where steps are cheap; on
 * the stand-in (sparse > 1) a few of each part. */
static int gpt_next_policy(int k)
{
	if (k >= GPT_BASE)
		return k + (sparse > 1 ? 6 : 1);
	k = k ? k + (sparse > 1 ? GPT_BASE / 2 : 1) : 1;
	return k < GPT_BASE ? k : GPT_BASE;
}

/* Three Adam steps (with clipping, and without: fused updates) under every
 * policy: each step's measured peaks equal the plan's (job_run), the loss
 * falls, and the losses, weights and moments are the same bits as under
 * the first policy. */
START_TEST(test_gpt_every_policy_same_results)
{
	const struct ts_optimizer opts[2] = {
		{.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f,
		 .clip_global_norm = 0.5f},
		{.type = TS_OPT_ADAM, .adamw = true, .weight_decay = 0.1f, .learning_rate = 1e-2f,
		 .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f},
	};

	for (int o = 0; o < 2; o++) {
		struct job ref;
		float ref_loss[3];

		for (int k = 0; k < GPT_POLICIES; k = gpt_next_policy(k)) {
			struct ts_policy pol = gpt_policy(k);
			struct ts_exec_result r;
			struct job j;

			job_new(&tiny_gpt, &opts[o], 16, &pol, 21, &j);
			for (int step = 1; step <= 3; step++) {
				job_run(&j, step, &r);
				if (k == 0)
					ref_loss[step - 1] = r.loss;
				else
					same_loss(r.loss, ref_loss[step - 1], "gpt policy");
			}
			if (k == 0) {
				ck_assert_msg(ref_loss[2] < ref_loss[0], "loss %.6g -> %.6g", ref_loss[0],
				              ref_loss[2]);
				ref = j;
				continue;
			}
			for (int t = 0; t < TS_GPT_NPARAMS; t++)
				for (int kind = 0; kind < 3; kind++)
					same_values(&j, &ref, ts_gpt_role(kind, t), "gpt policy");
			job_free(&j);
		}
		job_free(&ref);
	}
}
END_TEST

/*
 * A GPT wide enough that the CPU kernels cut every row-wise kernel into
 * several pieces for their team (kernels_cpu.c: about 8Ki elements, 64
 * columns or 1/8 of a cross-entropy's rows each): 2 blocks of width 128
 * with 4 heads and an MLP of 512, windows of 32 tokens, vocab 300,
 * batches of 8 windows (256 rows).
 */
static const struct ts_mlp team_gpt = {.layers = 2, .d_model = 128, .d_hidden = 512,
                                       .act = TS_ACT_GELU, .loss = TS_LOSS_XENT,
                                       .vocab = 300, .id_bytes = 4, .gpt = true, .heads = 4,
                                       .context = 32};

/* Kernels made while this thread may run only on the first `cpus` CPUs
 * of its affinity (their team: one thread per CPU, cpu_team.h); NULL when
 * it has fewer. */
static struct ts_kernels *kernels_on_cpus(int cpus)
{
	cpu_set_t all, some;
	struct ts_kernels *k = NULL;

	ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
	if (CPU_COUNT(&all) < cpus)
		return NULL;
	CPU_ZERO(&some);
	for (int c = 0, n = 0; c < CPU_SETSIZE && n < cpus; c++)
		if (CPU_ISSET(c, &all)) {
			CPU_SET(c, &some);
			n++;
		}
	ck_assert_int_eq(sched_setaffinity(0, sizeof some, &some), 0);
	OK(ts_kernels_new(dev, &k, &err));
	ck_assert_int_eq(sched_setaffinity(0, sizeof all, &all), 0);
	return k;
}

/* Three AdamW steps (with clipping) of team_gpt on kernels whose team has
 * one thread, two threads, and one per CPU (the fixture's): the losses,
 * weights and moments are the same bits, whichever thread ran which piece
 * of a kernel. On a single CPU only the one-thread run is possible. */
START_TEST(test_gpt_same_bits_whatever_the_team)
{
	const struct ts_optimizer adamw = {.type = TS_OPT_ADAM, .adamw = true, .weight_decay = 0.1f,
	                                   .learning_rate = 1e-2f, .b1 = 0.9f, .b2 = 0.999f,
	                                   .eps = 1e-8f, .clip_global_norm = 0.5f};
	struct ts_policy pol = gpt_policy(0);
	struct ts_kernels *teams[3] = {kernels_on_cpus(1), kernels_on_cpus(2), kern};
	struct job ref;
	float ref_loss[3];

	ck_assert_ptr_nonnull(teams[0]);
	for (int t = 0; t < 3; t++) {
		struct ts_exec_result r;
		struct job j;

		if (!teams[t])
			continue;
		env.kernels = teams[t];
		job_new(&team_gpt, &adamw, 8 * team_gpt.context, &pol, 23, &j);
		for (int step = 1; step <= 3; step++) {
			job_run(&j, step, &r);
			if (t == 0)
				ref_loss[step - 1] = r.loss;
			else
				same_loss(r.loss, ref_loss[step - 1], "team");
		}
		env.kernels = kern;
		if (t == 0) {
			ck_assert_msg(ref_loss[2] < ref_loss[0], "loss %.6g -> %.6g", ref_loss[0],
			              ref_loss[2]);
			ref = j;
			continue;
		}
		for (int p = 0; p < TS_GPT_NPARAMS; p++)
			for (int kind = 0; kind < 3; kind++)
				same_values(&j, &ref, ts_gpt_role(kind, p), "team");
		job_free(&j);
	}
	job_free(&ref);
	ts_kernels_free(teams[0]);
	ts_kernels_free(teams[1]);
}
END_TEST

/* A bfloat16 GPT: every product of its plan - the projections, the tied
 * head and the attention's batched ones - runs on rounded operands (no
 * float32 GEMM is left), a few policies spanning every choice give the
 * same bits over three Adam steps (with clipping) and measure the plan's
 * peaks (job_run), and its loss is near the float32 model's but not it. */
START_TEST(test_gpt_bf16_policies_same_results)
{
	static const int pols[] = {0, 5, 11, 19, 30, 47};
	const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                                  .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 0.5f};
	struct ts_mlp m = tiny_gpt;
	struct ts_exec_result r;
	struct job ref;
	float ref_loss[3], f32_loss;
	int batched = 0, lp = 0;

	m.compute = TS_COMPUTE_BF16;
	for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
		struct ts_policy pol = gpt_policy(pols[i]);
		struct job j;

		if (sparse > 1 && i > 0 && i + 1 < sizeof pols / sizeof pols[0])
			continue;           /* the stand-in's CUDA: the first and the last */
		job_new(&m, &adam, 16, &pol, 21, &j);
		for (int a = 0; i == 0 && a < j.plan.nactions; a++) {
			enum ts_pop op = j.plan.actions[a].op;

			ck_assert_msg(op != TS_P_GEMM && op != TS_P_GEMM_BATCHED,
			              "action %d: a float32 product in a bfloat16 GPT", a);
			batched += op == TS_P_GEMM_BATCHED_LP;
			lp += op == TS_P_GEMM_LP;
		}
		for (int step = 1; step <= 3; step++) {
			job_run(&j, step, &r);
			if (i == 0)
				ref_loss[step - 1] = r.loss;
			else
				same_loss(r.loss, ref_loss[step - 1], "bfloat16 gpt policy");
		}
		if (i == 0) {
			/* per block: 2 forward, 4 backward; a recompute adds forwards */
			ck_assert_int_ge(batched, 6 * m.layers);
			ck_assert_int_gt(lp, 0);
			ck_assert_msg(ref_loss[2] < ref_loss[0], "loss %.6g -> %.6g", ref_loss[0],
			              ref_loss[2]);
			ref = j;
			continue;
		}
		for (int t = 0; t < TS_GPT_NPARAMS; t++)
			for (int kind = 0; kind < 3; kind++)
				same_values(&j, &ref, ts_gpt_role(kind, t), "bfloat16 gpt policy");
		job_free(&j);
	}
	job_free(&ref);
	{
		struct ts_policy pol = gpt_policy(0);
		struct job j;

		job_new(&tiny_gpt, &adam, 16, &pol, 21, &j);
		job_run(&j, 1, &r);
		f32_loss = r.loss;
		job_free(&j);
	}
	ck_assert_msg(ref_loss[0] != f32_loss &&
	              fabs(ref_loss[0] - f32_loss) < 1e-2 * fabs(f32_loss),
	              "bfloat16 loss %.9g, float32 %.9g", ref_loss[0], f32_loss);
}
END_TEST

/* A float16 GPT: the same rounded products in the other 16-bit dtype; the
 * first and last policies give the same bits over two steps, and its loss
 * is neither the float32 model's nor the bfloat16 one's (11 bits of
 * mantissa: nearer the float32 loss than bfloat16's 8). */
START_TEST(test_gpt_f16_same_results)
{
	const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                                  .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 0.5f};
	float loss[3][2];
	struct job ref;

	for (int c = 0; c < 3; c++) {
		struct ts_mlp m = tiny_gpt;

		m.compute = c == 0 ? TS_COMPUTE_F32 : c == 1 ? TS_COMPUTE_BF16 : TS_COMPUTE_F16;
		for (int k = 0; k < 2; k++) {
			struct ts_policy pol = gpt_policy(k ? GPT_POLICIES - 1 : 0);
			struct ts_exec_result r;
			struct job j;

			if (c < 2 && k)
				continue;
			job_new(&m, &adam, 16, &pol, 24, &j);
			for (int step = 1; step <= 2; step++) {
				job_run(&j, step, &r);
				if (k == 0)
					loss[c][step - 1] = r.loss;
				else
					same_loss(r.loss, loss[c][step - 1], "float16 gpt policy");
			}
			if (c == 2 && k == 0) {
				ref = j;
				continue;
			}
			if (c == 2)
				for (int t = 0; t < TS_GPT_NPARAMS; t++)
					for (int kind = 0; kind < 3; kind++)
						same_values(&j, &ref, ts_gpt_role(kind, t), "float16 gpt policy");
			job_free(&j);
		}
	}
	job_free(&ref);
	ck_assert_msg(loss[2][0] != loss[0][0] && loss[2][0] != loss[1][0] &&
	              fabs(loss[2][0] - loss[0][0]) < fabs(loss[1][0] - loss[0][0]),
	              "float16 loss %.9g, bfloat16 %.9g, float32 %.9g", loss[2][0], loss[1][0],
	              loss[0][0]);
}
END_TEST

/* The gradients of every parameter against central differences of the
 * step's own loss (optimizer none: the step writes the gradients and
 * leaves the weights), a few elements of each. */
START_TEST(test_gpt_gradients_match_finite_differences)
{
	struct ts_policy pol = gpt_policy(0);
	struct ts_exec_result r;
	struct job j;
	double worst = 0;

	job_new(&tiny_gpt, &grads_only, 16, &pol, 22, &j);
	job_run(&j, 1, &r);
	for (int t = 0; t < TS_GPT_NPARAMS; t++) {
		size_t n, ng;
		float *w = job_read(&j, ts_gpt_role(0, t), &n);
		float *gr = job_read(&j, ts_gpt_role(3, t), &ng);

		ck_assert_uint_eq(n, ng);
		for (size_t e = 0; e < n; e += (n / 5 + 1) * (size_t)sparse) {
			const float h = 1e-2f;
			float keep = w[e], lp, lm;
			double fd;

			w[e] = keep + h;
			job_write(&j, ts_gpt_role(0, t), w);
			job_run(&j, 1, &r);
			lp = r.loss;
			w[e] = keep - h;
			job_write(&j, ts_gpt_role(0, t), w);
			job_run(&j, 1, &r);
			lm = r.loss;
			w[e] = keep;
			job_write(&j, ts_gpt_role(0, t), w);
			fd = ((double)lp - lm) / (2.0 * h);
			worst = fmax(worst, fabs(gr[e] - fd) / (1e-1 + fabs(fd)));
			ck_assert_msg(fabs(gr[e] - fd) <= 2e-3 + 2e-2 * fabs(fd),
			              "%s[%zu]: gradient %.6g, finite differences %.6g",
			              ts_gpt_param_name((enum ts_gpt_param)t), e, gr[e], fd);
		}
		free(w);
		free(gr);
	}
	fprintf(stderr, "gpt gradients against central differences: worst |g - fd| / (0.1 + "
	        "|fd|) = %.3g\n", worst);
	job_free(&j);
}
END_TEST

/* An evaluation's loss is the step's before its update, bit for bit, and
 * its logits are what the loss was computed from. */
START_TEST(test_gpt_evaluation_is_the_steps_forward)
{
	struct ts_policy pol = gpt_policy(1);
	struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                            .b2 = 0.999f, .eps = 1e-8f};
	struct ts_exec_result r, e;
	struct job step, ev;

	job_new(&tiny_gpt, &adam, 16, &pol, 23, &step);
	job_new_eval(&tiny_gpt, 16, &pol, true, TS_MEM_PINNED_HOST, 23, &ev);
	job_run(&ev, 1, &e);
	job_run(&step, 1, &r);
	same_loss(e.loss, r.loss, "gpt evaluation");
	job_free(&step);
	job_free(&ev);
}
END_TEST

/* Refused with a message naming the culprit, before anything is planned. */
static void refused(const struct ts_mlp *m, int batch, const struct ts_policy *pol,
                    const char *culprit)
{
	struct ts_plan p;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build(m, &grads_only, batch, pol, &p, &err), TS_INVALID_ARGUMENT);
	ck_assert_msg(strstr(err.message, culprit), "'%s' not in: %s", culprit, err.message);
	ts_error_clear(&err);
}

/* A batch of part of a window, heads that do not divide the width, a name
 * both saved and offloaded (itself or through "h") and a GPT's names for
 * an MLP are refused before anything is planned. */
START_TEST(test_gpt_refusals)
{
	struct ts_policy pol = gpt_policy(0), named = gpt_policy(0);
	struct ts_mlp m = tiny_gpt;

	refused(&m, 12, &pol, "12 tokens");
	m.heads = 3;
	refused(&m, 16, &pol, "heads");
	m = tiny_gpt;
	named.save_acts = A(ATTN) | A(QKV);
	named.offload_acts = A(MLP_ACT) | A(QKV);
	refused(&m, 16, &named, "'qkv' is in both");
	named.offload_acts = A(MLP_ACT);
	named.offload_h = true;
	refused(&m, 16, &named, "'qkv' is in \"save\" and, through \"h\", in \"offload\"");
	named.offload_h = false;
	named.offload_acts = 0;
	m = small;
	m.gpt = false;
	refused(&m, 4, &named, "'qkv' is a GPT block's");
}
END_TEST

static void add_gpt(TCase *tc)
{
	tcase_add_test(tc, test_gpt_every_policy_same_results);
	tcase_add_test(tc, test_gpt_bf16_policies_same_results);
	tcase_add_test(tc, test_gpt_f16_same_results);
	tcase_add_test(tc, test_gpt_gradients_match_finite_differences);
	tcase_add_test(tc, test_gpt_evaluation_is_the_steps_forward);
	tcase_add_test(tc, test_gpt_refusals);
}

/* ---- gradient accumulation --------------------------------------------------------- */

/* A job of `accumulate` micro-batches of `batch` rows (its inputs and
 * targets every micro-batch's). */
static void job_new_acc(const struct ts_mlp *m, const struct ts_optimizer *o, int batch,
                        int accumulate, const struct ts_policy *pol, unsigned seed,
                        struct job *j)
{
	OK(ts_plan_build_accumulate(m, o, batch, accumulate, pol, &j->plan, &err));
	ck_assert_int_eq(j->plan.accumulate, accumulate);
	job_bind(seed, j);
}

/* The gradient roles a model's step writes (optimizer none). */
static int grad_roles(const struct ts_mlp *m, enum ts_pbuf_role *r)
{
	int n = 0;

	if (m->gpt) {
		for (int t = 0; t < TS_GPT_NPARAMS; t++)
			r[n++] = ts_gpt_role(3, t);
		return n;
	}
	r[n++] = TS_ROLE_GRAD_W1;
	if (ts_mlp_has_w2(m))
		r[n++] = TS_ROLE_GRAD_W2;
	if (ts_mlp_tokens(m))
		r[n++] = TS_ROLE_GRAD_EMBED;
	if (ts_mlp_tokens(m) && m->proj)
		r[n++] = TS_ROLE_GRAD_PROJ;
	return n;
}

/* Micro-batch j's rows of a role's argument of an accumulating job, written
 * into the one-micro-batch job one. */
static void copy_micro(const struct job *acc, struct job *one, enum ts_pbuf_role role, int j)
{
	int ia = role_index(&acc->plan, role), io = role_index(&one->plan, role);
	uint64_t per;
	char *x;

	if (ia < 0)
		return;
	ck_assert_int_ge(io, 0);
	per = one->plan.bufs[io].bytes;
	ck_assert_uint_eq(acc->plan.bufs[ia].bytes, per * (uint64_t)acc->plan.accumulate);
	x = malloc(acc->plan.bufs[ia].bytes);
	ck_assert_ptr_nonnull(x);
	get(acc, ia, x, acc->plan.bufs[ia].bytes);
	put(one, io, x + (uint64_t)j * per, per);
	free(x);
}

/*
 * Optimizer none, `accumulate` micro-batches: the step's gradients are
 * (g_0 + g_1 + ...) * (1 / k) of the gradients each micro-batch's own step
 * writes (summed in that order, as the plan does), its loss the mean of
 * theirs; each measured peak the plan's (job_run).
 */
static void accumulate_is_the_mean(const struct ts_mlp *m, int batch, int k,
                                   const struct ts_policy *pol, const char *what)
{
	enum ts_pbuf_role roles[TS_GPT_NPARAMS];
	int nr = grad_roles(m, roles);
	struct job acc, one;
	struct ts_exec_result ra, r;
	float *sum[TS_GPT_NPARAMS] = {0}, lsum = 0.0f;
	size_t n[TS_GPT_NPARAMS];

	job_new_acc(m, &grads_only, batch, k, pol, 31, &acc);
	job_run(&acc, 1, &ra);
	job_new(m, &grads_only, batch, pol, 31, &one);
	for (int j = 0; j < k; j++) {
		copy_micro(&acc, &one, TS_ROLE_INPUT, j);
		copy_micro(&acc, &one, TS_ROLE_TARGET, j);
		job_run(&one, 1, &r);
		lsum += r.loss;
		for (int t = 0; t < nr; t++) {
			float *g = job_read(&one, roles[t], &n[t]);

			if (j == 0) {
				sum[t] = g;
				continue;
			}
			for (size_t e = 0; e < n[t]; e++)
				sum[t][e] += g[e];
			free(g);
		}
	}
	same_loss(ra.loss, lsum / (float)k, what);
	for (int t = 0; t < nr; t++) {
		size_t na;
		float *g = job_read(&acc, roles[t], &na);
		double scale = 0;

		ck_assert_uint_eq(na, n[t]);
		for (size_t e = 0; e < na; e++) {
			sum[t][e] *= 1.0f / (float)k;
			scale = fmax(scale, fabs(sum[t][e]));
		}
		for (size_t e = 0; e < na; e++)
			ck_assert_msg(agree(g[e], sum[t][e], scale),
			              "%s: role %d element %zu: %.9g, mean of the micro-batches %.9g",
			              what, (int)roles[t], e, g[e], sum[t][e]);
		free(g);
		free(sum[t]);
	}
	job_free(&acc);
	job_free(&one);
}

START_TEST(test_accumulate_is_the_mean_of_the_micro_batches)
{
	const struct ts_mlp tok = {.layers = 2, .d_model = 12, .d_hidden = 20, .act = TS_ACT_GELU,
	                           .residual = true, .loss = TS_LOSS_XENT, .vocab = 29,
	                           .proj = true, .id_bytes = 2};
	struct ts_policy pol = any_policy(9 + 2 + 3 + 18);

	accumulate_is_the_mean(&small, 4, 3, &pol, "guide mlp, 3 micro-batches");
	accumulate_is_the_mean(&small, 5, 2, &pol, "guide mlp, 2 micro-batches");
	accumulate_is_the_mean(&tok, 7, 4, &pol, "token mlp, 4 micro-batches");
}
END_TEST

/*
 * Adam over accumulating steps under every placement: each step's measured
 * peaks equal the plan's, the same loss, weights and moments bit for bit as
 * under the first policy, and a global norm on every step (no clipping)
 * that is the norm of the mean gradient the same step computes without an
 * optimizer.
 */
static void accumulate_every_policy(const struct ts_mlp *m, int batch, int k, int npol,
                                    struct ts_policy (*policy)(int), int stride,
                                    const char *what)
{
	const struct ts_optimizer adamw = {.type = TS_OPT_ADAM, .adamw = true, .weight_decay = 0.1f,
	                                   .learning_rate = 1e-2f, .b1 = 0.9f, .b2 = 0.999f,
	                                   .eps = 1e-8f};
	enum ts_pbuf_role roles[TS_GPT_NPARAMS];
	int nr = grad_roles(m, roles);
	struct job ref, g;
	struct ts_exec_result r;
	float ref_loss[2];
	double sq = 0;

	/* the mean gradient at the start, and its norm */
	{
		struct ts_policy pol = policy(0);

		job_new_acc(m, &grads_only, batch, k, &pol, 32, &g);
		job_run(&g, 1, &r);
		for (int t = 0; t < nr; t++) {
			size_t n;
			float *x = job_read(&g, roles[t], &n);

			for (size_t e = 0; e < n; e++)
				sq += (double)x[e] * x[e];
			free(x);
		}
		job_free(&g);
	}
	for (int p = 0; p < npol; p += p ? stride : 1) {
		struct ts_policy pol = policy(p);
		struct job j;

		job_new_acc(m, &adamw, batch, k, &pol, 32, &j);
		for (int step = 1; step <= 2; step++) {
			job_run(&j, step, &r);
			ck_assert_msg(isfinite(r.grad_norm), "%s: no global norm", what);
			if (step == 1)
				ck_assert_msg(fabs(r.grad_norm - sqrt(sq)) <= 1e-5 * sqrt(sq),
				              "%s: global norm %.9g, of the mean gradient %.9g", what,
				              (double)r.grad_norm, sqrt(sq));
			if (p == 0)
				ref_loss[step - 1] = r.loss;
			else
				same_loss(r.loss, ref_loss[step - 1], what);
		}
		if (p == 0) {
			ref = j;
			continue;
		}
		for (int i = 0; i < j.plan.nbufs; i++)
			if (j.plan.bufs[i].cls == TS_PB_ARGUMENT && ts_role_state(j.plan.bufs[i].role))
				same_values(&j, &ref, j.plan.bufs[i].role, what);
		job_free(&j);
	}
	job_free(&ref);
}

static struct ts_policy any_policy_state(int k)
{
	struct ts_policy p = any_policy(k % ANY_POLICIES);

	p.opt_state = k / ANY_POLICIES ? TS_MEM_PINNED_HOST : TS_MEM_DEVICE;
	return p;
}

START_TEST(test_accumulate_every_policy_same_results)
{
	const struct ts_mlp tok = {.layers = 2, .d_model = 11, .d_hidden = 0, .act = TS_ACT_TANH,
	                           .residual = false, .loss = TS_LOSS_XENT, .vocab = 11,
	                           .id_bytes = 4};

	accumulate_every_policy(&small, 3, 2, 2 * ANY_POLICIES, any_policy_state, 1,
	                        "guide mlp accumulating");
	accumulate_every_policy(&tok, 5, 3, 2 * ANY_POLICIES, any_policy_state, 5,
	                        "token mlp accumulating");
}
END_TEST

/* Plans: accumulate 1 is the plain step; the accumulators and a later
 * micro-batch's gradients are temps of the plan (a larger temp); a count
 * outside 1..TS_PLAN_ACCUMULATE_MAX is refused, naming accumulate. */
START_TEST(test_accumulate_plans_and_refusals)
{
	const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                                  .b2 = 0.999f, .eps = 1e-8f};
	struct ts_policy pol = any_policy(0);
	struct ts_plan a, b, c;
	const int bad[] = {0, -1, TS_PLAN_ACCUMULATE_MAX + 1, INT32_MAX};

	OK(ts_plan_build(&small, &adam, 4, &pol, &a, &err));
	OK(ts_plan_build_accumulate(&small, &adam, 4, 1, &pol, &b, &err));
	ck_assert_int_eq(a.nactions, b.nactions);
	ck_assert_uint_eq(a.peak_device_bytes, b.peak_device_bytes);
	ck_assert_int_eq(b.accumulate, 1);
	OK(ts_plan_build_accumulate(&small, &adam, 4, 2, &pol, &c, &err));
	ck_assert_uint_gt(c.temp_size_in_bytes, a.temp_size_in_bytes);
	ck_assert_uint_eq(c.argument_size_in_bytes - a.argument_size_in_bytes,
	                  2u * 4u * (uint64_t)small.d_model * sizeof(float));
	ts_plan_release(&a);
	ts_plan_release(&b);
	ts_plan_release(&c);
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		ts_error_clear(&err);
		ck_assert_int_eq(ts_plan_build_accumulate(&small, &adam, 4, bad[i], &pol, &a, &err),
		                 TS_INVALID_ARGUMENT);
		ck_assert_str_eq(err.reason, "BAD_ACCUMULATE");
		ck_assert_ptr_nonnull(strstr(err.message, "accumulate"));
	}
	ts_error_clear(&err);
}
END_TEST

START_TEST(test_gpt_accumulate_is_the_mean_of_the_micro_batches)
{
	struct ts_policy pol = gpt_policy(1 + 4 * 2);

	accumulate_is_the_mean(&tiny_gpt, 16, 2, &pol, "gpt, 2 micro-batches");
}
END_TEST

START_TEST(test_gpt_accumulate_every_policy_same_results)
{
	accumulate_every_policy(&tiny_gpt, 16, 2, GPT_POLICIES, gpt_policy, sparse * 3,
	                        "gpt accumulating");
}
END_TEST

/*
 * Fused updates (no clipping, no accumulation) report the global norm too:
 * that of the gradients the same step writes without an optimizer, within
 * float32 rounding, the same bits under each placement, and the plan's
 * peaks measured (job_run) with the norm's temp among them.
 */
static void fused_norm(const struct ts_mlp *m, int batch, int npol,
                       struct ts_policy (*policy)(int), int stride, const char *what)
{
	const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                                  .b2 = 0.999f, .eps = 1e-8f};
	enum ts_pbuf_role roles[TS_GPT_NPARAMS];
	int nr = grad_roles(m, roles);
	struct ts_policy p0 = policy(0);
	struct ts_exec_result r;
	struct job g;
	double sq = 0;
	float first = NAN;

	job_new(m, &grads_only, batch, &p0, 33, &g);
	ck_assert(!g.plan.norm_after);
	job_run(&g, 1, &r);
	ck_assert(isnan(r.grad_norm));
	for (int t = 0; t < nr; t++) {
		size_t n;
		float *x = job_read(&g, roles[t], &n);

		for (size_t e = 0; e < n; e++)
			sq += (double)x[e] * x[e];
		free(x);
	}
	job_free(&g);
	for (int p = 0; p < npol; p += p ? stride : 1) {
		struct ts_policy pol = policy(p);
		struct job j;

		job_new(m, &adam, batch, &pol, 33, &j);
		ck_assert(j.plan.norm_after);
		job_run(&j, 1, &r);
		ck_assert_msg(fabs(r.grad_norm - sqrt(sq)) <= 1e-5 * sqrt(sq),
		              "%s, policy %d: global norm %.9g, of the gradients %.9g", what, p,
		              (double)r.grad_norm, sqrt(sq));
		if (p == 0)
			first = r.grad_norm;
		else
			ck_assert_msg(agree(r.grad_norm, first, 0), "%s, policy %d: norm %.9g, policy 0's "
			              "%.9g", what, p, (double)r.grad_norm, (double)first);
		job_free(&j);
	}
}

START_TEST(test_fused_steps_report_the_global_norm)
{
	const struct ts_mlp tok = {.layers = 2, .d_model = 12, .d_hidden = 20, .act = TS_ACT_GELU,
	                           .residual = true, .loss = TS_LOSS_XENT, .vocab = 29,
	                           .proj = true, .id_bytes = 2};

	fused_norm(&small, 5, 2 * ANY_POLICIES, any_policy_state, 7, "guide mlp");
	fused_norm(&tok, 9, 2 * ANY_POLICIES, any_policy_state, 7, "token mlp");
}
END_TEST

START_TEST(test_gpt_fused_steps_report_the_global_norm)
{
	fused_norm(&tiny_gpt, 16, GPT_POLICIES, gpt_policy, 5 * sparse, "gpt");
}
END_TEST

static void add_accumulate(TCase *tc)
{
	tcase_add_test(tc, test_fused_steps_report_the_global_norm);
	tcase_add_test(tc, test_accumulate_is_the_mean_of_the_micro_batches);
	tcase_add_test(tc, test_accumulate_every_policy_same_results);
	tcase_add_test(tc, test_accumulate_plans_and_refusals);
}

static void add_gpt_accumulate(TCase *tc)
{
	tcase_add_test(tc, test_gpt_fused_steps_report_the_global_norm);
	tcase_add_test(tc, test_gpt_accumulate_is_the_mean_of_the_micro_batches);
	tcase_add_test(tc, test_gpt_accumulate_every_policy_same_results);
}

Suite *ts_unit_suite(void)
{
	bool cuda = ts_unit_cuda();
	Suite *s = suite_create("exec");
	TCase *tc = tcase_create("sim");

	tcase_add_checked_fixture(tc, setup_sim, teardown);
	tcase_set_timeout(tc, 120);
	add_common(tc);
	add_tokens(tc);
	add_lowp(tc);
	add_gpt(tc);
	/* the CPU kernels' team */
	tcase_add_test(tc, test_gpt_same_bits_whatever_the_team);
	add_accumulate(tc);
	add_gpt_accumulate(tc);
	/* fault injection exists on sim only */
	tcase_add_test(tc, test_copy_failure_releases_every_temp);
	tcase_add_test(tc, test_copy_failure_mid_step_leaves_every_array_whole);
#ifdef TS_FAULT_BUILD
	tcase_add_test(tc, test_every_failure_point_of_a_step_leaves_every_array_whole);
#endif
	suite_add_tcase(s, tc);
	if (cuda) {
		tc = tcase_create("cuda");
		tcase_add_checked_fixture(tc, setup_cuda, teardown);
		tcase_set_timeout(tc, 300);
		add_common(tc);
		add_tokens(tc);
		add_lowp(tc);
		add_accumulate(tc);
		suite_add_tcase(s, tc);
		/* the GPT's steps on CUDA, a case of their own (they take the stand-in
		 * minutes: tests/gpu/fakecuda.sh runs them once, not in every pass) */
		tc = tcase_create("cuda_gpt");
		tcase_add_checked_fixture(tc, setup_cuda, teardown);
		tcase_set_timeout(tc, 300);
		add_gpt(tc);
		add_gpt_accumulate(tc);
		suite_add_tcase(s, tc);
	}
	return s;
}
