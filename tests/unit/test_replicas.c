/*
 * test_replicas.c - data-parallel steps (plan.h's ts_plan_build_replicated,
 * exec.h's ts_exec_run_replicas): R devices, each with its replica of every
 * argument and its slice of the batch, gradients all-reduced.
 *
 * On sim devices (2 and 4) and, with TS_TEST_BACKEND=cuda, on every GPU
 * (under ../shared/fakecuda with 2, 4 and 8, shuffled): the replicated
 * step equals one device's step on the whole batch within float32
 * summation error, replicas are bit-identical after every step, two runs
 * give the same bits, and every fault point of a step (copies and
 * allocations on any device) leaves every replica as it was. The
 * collectives run on each device's comm queue, the gradients' all-reduced
 * during the backward pass: the same bits as on the compute queue after
 * it.
 */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "memory/space.h"
#include "tests/unit/unit.h"
#include "train/exec.h"
#include "train/session.h"

#define NMAX 8

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_comm *comm;
static int ndev;
static struct ts_device *devs[NMAX];
static struct ts_space *dsp[NMAX], *psp[NMAX];
static struct ts_kernels *kern[NMAX];
static struct ts_queue *qc[NMAX], *qh[NMAX], *qd[NMAX], *qm[NMAX];
static struct ts_exec_env envs[NMAX];
static struct ts_error err;
static bool on_cuda;

#define OK(call) TS_UNIT_OK(err, call)

static void setup_with(const struct ts_device_config *dc, enum ts_backend_kind kind, int want,
                       double fraction)
{
	struct ts_memory_config mc = {.device_memory_fraction = fraction,
	                              .pinned_host_limit = 512ull << 20,
	                              .unpinned_host_limit = 64ull << 20,
	                              .pinned_segment = 32ull << 20};

	ts_error_clear(&err);
	OK(ts_device_set_new(dc, &set, &err));
	ndev = 0;
	for (size_t i = 0; i < ts_device_set_count(set) && ndev < want; i++)
		if (ts_device_props(ts_device_set_at(set, i))->backend == kind)
			devs[ndev++] = ts_device_set_at(set, i);
	ck_assert_msg(ndev >= 2, "%d device(s): data parallel needs 2", ndev);
	OK(ts_memory_new(set, &mc, &mem, &err));
	for (int k = 0; k < ndev; k++) {
		const char *id = ts_device_props(devs[k])->id;

		dsp[k] = ts_memory_find(mem, id, TS_MEM_DEVICE);
		psp[k] = ts_memory_find(mem, id, TS_MEM_PINNED_HOST);
		ck_assert_ptr_nonnull(dsp[k]);
		ck_assert_ptr_nonnull(psp[k]);
		OK(ts_kernels_new(devs[k], &kern[k], &err));
		OK(ts_queue_new(devs[k], &qc[k], &err));
		OK(ts_queue_new(devs[k], &qh[k], &err));
		OK(ts_queue_new(devs[k], &qd[k], &err));
		OK(ts_queue_new(devs[k], &qm[k], &err));
		envs[k] = (struct ts_exec_env){.dev = devs[k], .device_space = dsp[k],
		                               .pinned_space = psp[k], .kernels = kern[k],
		                               .compute = qc[k], .h2d = qh[k], .d2h = qd[k],
		                               .comm = qm[k]};
	}
	OK(ts_comm_new(devs, ndev, &comm, &err));
}

static void setup_sim(int n)
{
	struct ts_device_config dc = {.sim_devices = n, .sim_device_memory = 128ull << 20,
	                              .host = "t"};

	on_cuda = false;
	setup_with(&dc, TS_BACKEND_SIM, n, 1.0);
}

static void setup_sim2(void)
{
	setup_sim(2);
}

static void setup_sim4(void)
{
	setup_sim(4);
}

static void setup_cuda(void)
{
	struct ts_device_config dc = {.sim_devices = 0, .cuda = true, .host = "t"};

	on_cuda = true;
	setup_with(&dc, TS_BACKEND_CUDA, NMAX, 0.05);
}

/* The stand-in's count of rule violations (0 on a real GPU: no stand-in). */
static int cuda_violations(void)
{
	int (*fn)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fakecuda_violations");

	return fn ? fn() : 0;
}

static void teardown(void)
{
	ts_comm_free(comm);
	for (int k = 0; k < ndev; k++) {
		ts_queue_free(qc[k]);
		ts_queue_free(qh[k]);
		ts_queue_free(qd[k]);
		ts_queue_free(qm[k]);
		ts_kernels_free(kern[k]);
	}
	ts_memory_free(mem);
	ts_device_set_free(set);
	ck_assert_msg(cuda_violations() == 0, "FAKECUDA VIOLATION (see stderr)");
}

static uint64_t in_use(struct ts_space *sp)
{
	struct ts_space_stats s;

	ts_space_stats(sp, &s);
	return s.bytes_in_use;
}

/* ---- the models and their data ------------------------------------------------- */

static const struct ts_optimizer adamw_clip = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f,
                                               .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f,
                                               .adamw = true, .weight_decay = 0.1f,
                                               .clip_global_norm = 0.5f};
static const struct ts_optimizer sgd_clip = {.type = TS_OPT_SGD, .learning_rate = 0.1f,
                                             .clip_global_norm = 0.5f};
static const struct ts_optimizer grads_only = {.type = TS_OPT_NONE};
static const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f,
                                         .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f};

static const struct ts_mlp dense = {.layers = 3, .d_model = 16, .d_hidden = 24,
                                    .act = TS_ACT_GELU, .residual = true,
                                    .loss = TS_LOSS_MSE};

/* vocab 37, windows of 8 tokens, 2 blocks of width 16 (4 heads) */
/* a layer's gradient 1 MiB: TS_PLAN_BUCKET_BYTES is 4 of its 6 layers */
static const struct ts_mlp wide_dense = {.layers = 6, .d_model = 512, .act = TS_ACT_GELU,
                                   .residual = true, .loss = TS_LOSS_MSE};

static const struct ts_mlp gpt = {.layers = 2, .d_model = 16, .d_hidden = 32,
                                  .act = TS_ACT_GELU, .loss = TS_LOSS_XENT, .vocab = 37,
                                  .id_bytes = 4, .gpt = true, .heads = 4, .context = 8};

static float rnd(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (float)((*s >> 8) & 0xffff) / 65536.0f;
}

/* The contents of a role's argument of a plan with `rows` rows (the whole
 * batch's rows for inputs and targets; the same whatever the plan's batch
 * for the rest): weights in [-0.3, 0.3) (LayerNorm scales near 1),
 * optimizer state zero, inputs in [-1, 1) or token ids. */
static void *initial(const struct ts_plan *p, enum ts_pbuf_role role, uint64_t bytes)
{
	float *x = malloc(bytes);
	uint64_t n = bytes / sizeof *x;
	unsigned s = 7u + 131u * (unsigned)role;
	int kind = -1, t = -1;

	ck_assert_ptr_nonnull(x);
	if ((ts_mlp_tokens(&p->mlp) || p->mlp.gpt) &&
	    (role == TS_ROLE_INPUT || role == TS_ROLE_TARGET)) {
		int32_t *ids = (int32_t *)(void *)x;

		for (uint64_t i = 0; i < n; i++)
			ids[i] = (int32_t)(rnd(&s) * (float)p->mlp.vocab) % p->mlp.vocab;
		return x;
	}
	if (ts_role_opt_state(role)) {
		memset(x, 0, bytes);
		return x;
	}
	ts_gpt_role_of(role, &kind, &t);
	for (uint64_t i = 0; i < n; i++) {
		x[i] = role == TS_ROLE_INPUT || role == TS_ROLE_TARGET ? 2 * rnd(&s) - 1
		                                                         : 0.6f * rnd(&s) - 0.3f;
		if (kind == 0 && ts_gpt_param_is_scale((enum ts_gpt_param)t))
			x[i] += 1.0f;
	}
	return x;
}

/* A plan run on R devices (replicas R of the plan; R = 1: one device). */
struct rjob {
	struct ts_plan plan;
	int R;
	void **args[NMAX];
	void **outs[NMAX];
};

static void put(int k, const struct ts_pbuf *b, void *dst, const void *src)
{
	if (b->kind == TS_MEM_DEVICE) {
		OK(ts_queue_copy(qh[k], dst, src, b->bytes, TS_COPY_H2D, &err));
		OK(ts_queue_sync(qh[k], &err));
	} else {
		memcpy(dst, src, b->bytes);
	}
}

static void *get(int k, const struct ts_pbuf *b, const void *src)
{
	void *x = malloc(b->bytes);

	ck_assert_ptr_nonnull(x);
	if (b->kind == TS_MEM_DEVICE) {
		OK(ts_queue_copy(qd[k], x, src, b->bytes, TS_COPY_D2H, &err));
		OK(ts_queue_sync(qd[k], &err));
	} else {
		memcpy(x, src, b->bytes);
	}
	return x;
}

/* Plans m on R devices of `batch` rows each (rjob_bind). */
static void rjob_bind(int R, struct rjob *j);

static void rjob_new(const struct ts_mlp *m, const struct ts_optimizer *o, int batch, int R,
                     const struct ts_policy *pol, struct rjob *j)
{
	memset(j, 0, sizeof *j);
	OK(ts_plan_build_replicated(m, o, batch, 1, R, pol, &j->plan, &err));
	rjob_bind(R, j);
}

/* The same with Adam's state sharded over the R devices (ZeRO-1). */
static void rjob_new_zero(const struct ts_mlp *m, const struct ts_optimizer *o, int batch, int R,
                          const struct ts_policy *pol, struct rjob *j)
{
	memset(j, 0, sizeof *j);
	OK(ts_plan_build_zero(m, o, batch, 1, R, pol, &j->plan, &err));
	ck_assert(j->plan.shard_state);
	rjob_bind(R, j);
}

/* The same at ZeRO stage `zero` (0: replicated, 1, 2: the gradients
 * sharded too), `accumulate` micro-batches a step. */
static void rjob_new_stage(const struct ts_mlp *m, const struct ts_optimizer *o, int batch,
                           int accumulate, int R, int zero, const struct ts_policy *pol,
                           struct rjob *j)
{
	memset(j, 0, sizeof *j);
	OK((zero == 2 ? ts_plan_build_zero2 : zero == 1 ? ts_plan_build_zero
	                                                : ts_plan_build_replicated)(
		m, o, batch, accumulate, R, pol, &j->plan, &err));
	ck_assert(j->plan.shard_state == (zero >= 1));
	ck_assert(j->plan.shard_grads == (zero >= 2));
	rjob_bind(R, j);
}

/* Gives each of R replicas its arguments: the same weights (zero state),
 * and rows k*batch.. of the whole batch. */
static void rjob_bind(int R, struct rjob *j)
{
	j->R = R;
	ck_assert_int_eq(j->plan.replicas, R);
	for (int k = 0; k < R; k++) {
		j->args[k] = calloc((size_t)j->plan.nbufs, sizeof(void *));
		j->outs[k] = calloc((size_t)j->plan.nbufs, sizeof(void *));
		ck_assert_ptr_nonnull(j->args[k]);
		ck_assert_ptr_nonnull(j->outs[k]);
	}
	for (int i = 0; i < j->plan.nbufs; i++) {
		const struct ts_pbuf *b = &j->plan.bufs[i];
		bool rows = b->role == TS_ROLE_INPUT || b->role == TS_ROLE_TARGET;
		char *whole;

		if (b->cls == TS_PB_TEMP)
			continue;
		whole = initial(&j->plan, b->role, rows ? b->bytes * (uint64_t)R : b->bytes);
		for (int k = 0; k < R; k++) {
			struct ts_space *sp = b->kind == TS_MEM_DEVICE ? dsp[k] : psp[k];

			OK(ts_space_alloc(sp, b->bytes, &j->args[k][i], &err));
			if (b->versioned)
				OK(ts_space_alloc(sp, b->bytes, &j->outs[k][i], &err));
			put(k, b, j->args[k][i], whole + (rows ? (uint64_t)k * b->bytes : 0));
		}
		free(whole);
	}
}

static void rjob_free(struct rjob *j)
{
	for (int k = 0; k < j->R; k++) {
		for (int i = 0; i < j->plan.nbufs; i++) {
			const struct ts_pbuf *b = &j->plan.bufs[i];
			struct ts_space *sp = b->kind == TS_MEM_DEVICE ? dsp[k] : psp[k];

			if (j->args[k][i])
				ts_space_release(sp, j->args[k][i], b->bytes);
			if (j->outs[k][i])
				ts_space_release(sp, j->outs[k][i], b->bytes);
		}
		free(j->args[k]);
		free(j->outs[k]);
	}
	ts_plan_release(&j->plan);
}

/* One step on every replica; the new versions become the arguments. The
 * loss is the replicas' mean (in rank order). */
static ts_status rjob_try(struct rjob *j, int step, float *loss, struct ts_exec_result *res)
{
	void *const *a[NMAX], *const *o[NMAX];
	ts_status st;

	for (int k = 0; k < j->R; k++) {
		a[k] = j->args[k];
		o[k] = j->outs[k];
	}
	ts_error_clear(&err);
	st = ts_exec_run_replicas(&j->plan, envs, j->R, j->R > 1 ? comm : NULL, a, o, step, res,
	                          &err);
	if (st != TS_OK)
		return st;
	for (int k = 0; k < j->R; k++)
		for (int i = 0; i < j->plan.nbufs; i++)
			if (j->plan.bufs[i].versioned) {
				void *t = j->args[k][i];

				j->args[k][i] = j->outs[k][i];
				j->outs[k][i] = t;
			}
	if (loss) {
		float s = 0;

		for (int k = 0; k < j->R; k++)
			s += res[k].loss;
		*loss = s / (float)j->R;
	}
	return TS_OK;
}

static float rjob_step_res(struct rjob *j, int step, struct ts_exec_result *res)
{
	uint64_t d0[NMAX], h0[NMAX];
	float loss;

	for (int k = 0; k < j->R; k++) {
		d0[k] = in_use(dsp[k]);
		h0[k] = in_use(psp[k]);
	}
	OK(rjob_try(j, step, &loss, res));
	for (int k = 0; k < j->R; k++) {
		/* every device's measured peak is the plan's, and nothing stays */
		ck_assert_uint_eq(res[k].measured_temp_peak, j->plan.temp_size_in_bytes);
		ck_assert_uint_eq(res[k].measured_host_temp_peak, j->plan.host_temp_size_in_bytes);
		ck_assert_uint_eq(in_use(dsp[k]), d0[k]);
		ck_assert_uint_eq(in_use(psp[k]), h0[k]);
		/* each replica's queue spent time in the collectives (sim times its
		 * workers; a CUDA stream is timed by events where the runtime can) */
		ck_assert_msg(j->R == 1 ? res[k].comm_s == 0 : on_cuda || res[k].comm_s > 0,
		              "replica %d: %g s in collectives", k, res[k].comm_s);
		/* the compute queue is busy, waits for copies or waits for the
		 * comm queue's collectives, which overlap it */
		ck_assert(res[k].compute_s + res[k].copy_wait_s + res[k].comm_wait_s <=
		          res[k].wall_s * 1.001 + 1e-6);
		ck_assert(res[k].comm_s <= res[k].wall_s * 1.001 + 1e-6);
		ck_assert(j->R > 1 || res[k].comm_wait_s == 0);
		/* the norm is of the reduced gradients: the same on every replica */
		ck_assert_msg(memcmp(&res[k].grad_norm, &res[0].grad_norm, sizeof(float)) == 0,
		              "replica %d's gradient norm %.9g, replica 0's %.9g", k,
		              (double)res[k].grad_norm, (double)res[0].grad_norm);
	}
	return loss;
}

static float rjob_step(struct rjob *j, int step)
{
	struct ts_exec_result res[NMAX];

	return rjob_step_res(j, step, res);
}

/* Replica k's argument i, read back (malloc'd). */
static float *rjob_read(const struct rjob *j, int k, int i)
{
	return get(k, &j->plan.bufs[i], j->args[k][i]);
}

static bool state_arg(const struct ts_plan *p, int i)
{
	return p->bufs[i].cls == TS_PB_ARGUMENT && ts_role_state(p->bufs[i].role);
}

/* Every replica's parameters and optimizer state are replica 0's bits
 * (sharded state: each replica's own slice; the parameters alone). */
static void replicas_identical(const struct rjob *j, const char *when)
{
	for (int i = 0; i < j->plan.nbufs; i++) {
		float *x0;

		if (!state_arg(&j->plan, i) ||
		    (j->plan.shard_state && ts_role_opt_state(j->plan.bufs[i].role)))
			continue;
		x0 = rjob_read(j, 0, i);
		for (int k = 1; k < j->R; k++) {
			float *x = rjob_read(j, k, i);

			ck_assert_msg(memcmp(x, x0, j->plan.bufs[i].bytes) == 0,
			              "%s: replica %d's role %d differs from replica 0's", when, k,
			              (int)j->plan.bufs[i].role);
			free(x);
		}
		free(x0);
	}
}

/* Two jobs of one plan hold the same state bits (replica 0's). */
static void same_state(const struct rjob *a, const struct rjob *b, const char *what)
{
	for (int i = 0; i < a->plan.nbufs; i++) {
		float *x, *y;

		if (!state_arg(&a->plan, i))
			continue;
		x = rjob_read(a, 0, i);
		y = rjob_read(b, 0, i);
		ck_assert_msg(memcmp(x, y, a->plan.bufs[i].bytes) == 0, "%s: role %d differs", what,
		              (int)a->plan.bufs[i].role);
		free(x);
		free(y);
	}
}

/* The replicated job's state (replica 0) against the one-device job's,
 * role by role, within float32 summation error of each tensor's scale. */
static void close_to(const struct rjob *dp, const struct rjob *one, double tol,
                     const char *when)
{
	for (int i = 0; i < dp->plan.nbufs; i++) {
		enum ts_pbuf_role role = dp->plan.bufs[i].role;
		int i1 = -1;
		float *x, *y;
		double scale = 0, worst = 0;
		uint64_t n = dp->plan.bufs[i].bytes / sizeof(float);

		if (!state_arg(&dp->plan, i) && dp->plan.bufs[i].cls != TS_PB_OUTPUT)
			continue;
		for (int b = 0; b < one->plan.nbufs; b++)
			if (one->plan.bufs[b].cls == dp->plan.bufs[i].cls &&
			    one->plan.bufs[b].role == role)
				i1 = b;
		ck_assert_int_ge(i1, 0);
		ck_assert_uint_eq(one->plan.bufs[i1].bytes, dp->plan.bufs[i].bytes);
		x = rjob_read(dp, 0, i);
		y = rjob_read(one, 0, i1);
		for (uint64_t e = 0; e < n; e++)
			scale = fmax(scale, fabs(y[e]));
		for (uint64_t e = 0; e < n; e++)
			worst = fmax(worst, fabs((double)x[e] - y[e]) / (scale + 1e-30));
		ck_assert_msg(worst <= tol, "%s: role %d off by %.3g of its scale %.3g", when,
		              (int)role, worst, scale);
		free(x);
		free(y);
	}
}

/* ---- the cases ------------------------------------------------------------------ */

/* Replicated steps against one device's on the whole batch: the losses
 * and the gradients (optimizer none: the outputs) or the weights (SGD:
 * linear in the gradient) within float32 summation error. Adam's first
 * steps divide each gradient by its own magnitude, so an element whose
 * gradient is rounding noise moves by up to the learning rate either way:
 * with Adam the losses are compared, and the replicas among themselves. */
static void dp_equals_whole_batch(const struct ts_mlp *m, const struct ts_optimizer *o,
                                  int batch, const struct ts_policy *pol, const char *what)
{
	struct rjob dp, one;
	char when[160];
	int steps = on_cuda ? 2 : 4;     /* the stand-in runs kernels thread by thread */

	rjob_new(m, o, batch, ndev, pol, &dp);
	rjob_new(m, o, batch * ndev, 1, pol, &one);
	/* each device's memory is one device's of its slice: the plan's
	 * collectives allocate nothing */
	for (int step = 1; step <= steps; step++) {
		float ld = rjob_step(&dp, step), l1 = rjob_step(&one, step);

		snprintf(when, sizeof when, "%s, %d devices, step %d", what, ndev, step);
		ck_assert_msg(fabsf(ld - l1) <= (o->type == TS_OPT_ADAM ? 1e-3f : 1e-5f) * fabsf(l1) +
		                                    1e-6f,
		              "%s: loss %.9g, one device on the whole batch %.9g", when, (double)ld,
		              (double)l1);
		replicas_identical(&dp, when);
		if (o->type != TS_OPT_ADAM)
			close_to(&dp, &one, 2e-5, when);
	}
	fprintf(stderr, "%s on %d devices: %d steps equal one device's on the whole batch\n", what,
	        ndev, steps);
	rjob_free(&dp);
	rjob_free(&one);
}

START_TEST(test_dense_model_equals_one_device)
{
	struct ts_policy on_dev = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                           .save_x = true, .save_h = true};
	struct ts_policy host = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_PINNED_HOST,
	                         .offload_x = true, .prefetch_depth = 1};

	dp_equals_whole_batch(&dense, &grads_only, 8, &on_dev, "dense, gradients");
	dp_equals_whole_batch(&dense, &sgd_clip, 8, &host, "dense, sgd, clipping, offloaded");
	dp_equals_whole_batch(&dense, &adamw_clip, 8, &on_dev, "dense, adamw, clipping");
	dp_equals_whole_batch(&dense, &adam, 8, &host, "dense, adam, all offloaded");
}
END_TEST

START_TEST(test_gpt_equals_one_device)
{
	struct ts_policy on_dev = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                           .save_x = true, .save_h = true};
	struct ts_policy host = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_PINNED_HOST,
	                         .prefetch_depth = 1};

	dp_equals_whole_batch(&gpt, &grads_only, 16, &on_dev, "gpt, gradients");
	dp_equals_whole_batch(&gpt, &sgd_clip, 16, &host, "gpt, sgd, clipping, streamed");
	dp_equals_whole_batch(&gpt, &adamw_clip, 16, &on_dev, "gpt, adamw, clipping");
	dp_equals_whole_batch(&gpt, &adam, 16, &host, "gpt, adam, streamed from pinned_host");
}
END_TEST

/* Two runs of the same replicated steps: the same bits. */
START_TEST(test_same_bits_every_run)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_PINNED_HOST,
	                        .save_x = true};
	struct rjob a, b;

	rjob_new(&gpt, &adamw_clip, 16, ndev, &pol, &a);
	rjob_new(&gpt, &adamw_clip, 16, ndev, &pol, &b);
	for (int step = 1; step <= 3; step++) {
		float la = rjob_step(&a, step), lb = rjob_step(&b, step);

		ck_assert_msg(memcmp(&la, &lb, sizeof la) == 0, "step %d: loss %.9g, then %.9g", step,
		              (double)la, (double)lb);
	}
	same_state(&a, &b, "two runs");
	rjob_free(&a);
	rjob_free(&b);
}
END_TEST

/* The plan: one ALLREDUCE per gradient, each device's analysis the same
 * as one device's of its slice but for the norm, and no fused update. */
START_TEST(test_plan_reduces_every_gradient_once)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .save_h = true};
	struct ts_plan p, p1;
	uint64_t reduced = 0, grads = 0;    /* bytes all-reduced; of the parameters */
	int allreduces = 0, first_update = -1, last_reduce = -1;

	ts_error_clear(&err);
	OK(ts_plan_build_replicated(&gpt, &adam, 16, 1, 4, &pol, &p, &err));
	OK(ts_plan_build_replicated(&gpt, &adam, 16, 1, 1, &pol, &p1, &err));
	for (int i = 0; i < p.nactions; i++) {
		const struct ts_paction *a = &p.actions[i];

		if (a->op == TS_P_ALLREDUCE) {
			allreduces++;
			reduced += a->n * sizeof(float);
			last_reduce = i;
			ck_assert_int_eq(p.bufs[a->a].kind, TS_MEM_DEVICE);
		}
		if (a->op == TS_P_UPDATE && first_update < 0)
			first_update = i;
	}
	for (int i = 0; i < p.nbufs; i++) {
		int kind, t;

		if (p.bufs[i].cls == TS_PB_ARGUMENT && ts_gpt_role_of(p.bufs[i].role, &kind, &t) &&
		    kind == 0)
			grads += p.bufs[i].bytes;      /* a gradient per parameter */
	}
	for (int i = 0; i < p1.nactions; i++)
		ck_assert_int_ne(p1.actions[i].op, TS_P_ALLREDUCE);
	ck_assert_int_eq(allreduces, TS_GPT_NPARAMS);
	/* the all-reduced bytes are the gradients' size: no hidden copies */
	ck_assert_uint_eq(reduced, grads);
	ck_assert_uint_eq(p.all_reduce_bytes, reduced);
	ck_assert_uint_eq(p1.all_reduce_bytes, 0);
	ck_assert_int_lt(last_reduce, first_update);
	ck_assert_uint_eq(p.argument_size_in_bytes, p1.argument_size_in_bytes);
	ts_plan_release(&p);
	ts_plan_release(&p1);
	ck_assert_int_eq(ts_plan_build_replicated(&gpt, &adam, 16, 1, 0, &pol, &p, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_REPLICAS");
}
END_TEST

/* A plan for R devices refuses another count, or no communicator. */
START_TEST(test_bad_runs_refused)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE};
	struct ts_exec_result res[NMAX];
	struct rjob j;
	void *const *a[NMAX], *const *o[NMAX];

	rjob_new(&dense, &adam, 4, ndev, &pol, &j);
	for (int k = 0; k < ndev; k++) {
		a[k] = j.args[k];
		o[k] = j.outs[k];
	}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run(&j.plan, &envs[0], a[0], o[0], 1, res, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_REPLICAS");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run_replicas(&j.plan, envs, ndev, NULL, a, o, 1, res, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_exec_run_replicas(&j.plan, envs + 1, ndev - 1, comm, a, o, 1, res,
	                                      &err),
	                 TS_INVALID_ARGUMENT);
	/* replicas on the communicator's devices in another order */
	if (ndev >= 2) {
		struct ts_exec_env swapped[NMAX];

		memcpy(swapped, envs, sizeof swapped);
		swapped[0] = envs[1];
		swapped[1] = envs[0];
		ts_error_clear(&err);
		ck_assert_int_eq(ts_exec_run_replicas(&j.plan, swapped, ndev, comm, a, o, 1, res,
		                                      &err),
		                 TS_INVALID_ARGUMENT);
		ck_assert_msg(strstr(err.message, "rank 0") != NULL, "%s", err.message);
	}
	rjob_step(&j, 1);           /* nothing was touched: it still runs */
	replicas_identical(&j, "after refusals");
	rjob_free(&j);
}
END_TEST

/* Every replica's state, read back. */
static float **snapshot(const struct rjob *j)
{
	float **s = calloc((size_t)(j->R * j->plan.nbufs), sizeof *s);

	ck_assert_ptr_nonnull(s);
	for (int k = 0; k < j->R; k++)
		for (int i = 0; i < j->plan.nbufs; i++)
			if (state_arg(&j->plan, i))
				s[k * j->plan.nbufs + i] = rjob_read(j, k, i);
	return s;
}

static void same_as(const struct rjob *j, float **s, const char *when)
{
	for (int k = 0; k < j->R; k++)
		for (int i = 0; i < j->plan.nbufs; i++) {
			float *x;

			if (!s[k * j->plan.nbufs + i])
				continue;
			x = rjob_read(j, k, i);
			ck_assert_msg(memcmp(x, s[k * j->plan.nbufs + i], j->plan.bufs[i].bytes) == 0,
			              "%s: replica %d's role %d changed", when, k,
			              (int)j->plan.bufs[i].role);
			free(x);
		}
}

static void snapshot_free(const struct rjob *j, float **s)
{
	for (int e = 0; e < j->R * j->plan.nbufs; e++)
		free(s[e]);
	free(s);
}

/* A copy failing on one device, at points through the step: it fails
 * (naming that device), every replica as it was, no memory kept; then the
 * job trains on equal to an untouched one. */
START_TEST(test_copy_failure_on_one_device_leaves_every_replica_whole)
{
	struct ts_policy pol = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_DEVICE,
	                        .offload_x = true, .prefetch_depth = 1};
	struct rjob j, fresh;
	uint64_t c0, per_step;
	int done = 1, failed = 0;

	if (on_cuda)
		return;              /* injected through the sim backend */
	rjob_new(&dense, &adamw_clip, 8, ndev, &pol, &j);
	rjob_new(&dense, &adamw_clip, 8, ndev, &pol, &fresh);
	c0 = ts_device_copies(devs[1]);
	rjob_step(&j, 1);
	per_step = ts_device_copies(devs[1]) - c0;
	rjob_step(&fresh, 1);
	ck_assert_uint_gt(per_step, 4);
	for (int k = 1; k <= 6; k++) {
		struct ts_exec_result res[NMAX];
		float **snap = snapshot(&j);
		uint64_t d0[NMAX], h0[NMAX];
		char when[120];
		ts_status st;

		for (int r = 0; r < ndev; r++) {
			d0[r] = in_use(dsp[r]);
			h0[r] = in_use(psp[r]);
		}
		snprintf(when, sizeof when, "a copy of device 1 failing after %d/7 of a step", k);
		ts__sim_inject_copy_failure_after(devs[1], (int)(per_step * (uint64_t)k / 7), 1);
		st = rjob_try(&j, done + 1, NULL, res);
		ts__sim_inject_copy_failure(devs[1], 0);
		for (int r = 0; r < ndev; r++)
			ck_assert_msg(in_use(dsp[r]) == d0[r] && in_use(psp[r]) == h0[r],
			              "%s: device %d's memory in use changed", when, r);
		if (st == TS_OK) {
			rjob_step(&fresh, ++done);
		} else {
			ck_assert_msg(st == TS_INTERNAL, "%s: %s", when, err.message);
			ck_assert_str_eq(err.reason, "COPY_FAILED");
			same_as(&j, snap, when);
			failed++;
		}
		snapshot_free(&j, snap);
	}
	ck_assert_int_ge(failed, 5);
	rjob_step(&j, done + 1);
	rjob_step(&fresh, done + 1);
	replicas_identical(&j, "after the failures");
	same_state(&j, &fresh, "after the failures, against an untouched job");
	rjob_free(&j);
	rjob_free(&fresh);
}
END_TEST

#ifdef TS_FAULT_BUILD
#include "common/fault.h"

/* Every fault point of a replicated step - each copy and each allocation,
 * on any device - fails it cleanly (every replica as it was, no memory
 * kept) or is absorbed; then it trains on, equal to an untouched job. */
static void walk(const struct ts_mlp *m, const struct ts_optimizer *o,
                 const struct ts_policy *pol, int zero, const char *what)
{
	static const enum ts_fault_kind kinds[] = {TS_FAULT_COPY, TS_FAULT_ALLOC_HEAP,
	                                           TS_FAULT_ALLOC_DEVICE, TS_FAULT_ALLOC_PINNED};
	struct rjob j, fresh;
	int done = 1, failed = 0, points = 0;

	rjob_new_stage(m, o, 8, 1, ndev, zero, pol, &j);
	rjob_new_stage(m, o, 8, 1, ndev, zero, pol, &fresh);
	rjob_step(&j, 1);
	rjob_step(&fresh, 1);
	for (size_t f = 0; f < sizeof kinds / sizeof kinds[0]; f++) {
		uint64_t n;

		ts_fault_arm(kinds[f], 0);
		rjob_step(&j, ++done);
		n = ts_fault_count(kinds[f]);
		rjob_step(&fresh, done);
		for (uint64_t at = 1; at <= n; at++) {
			struct ts_exec_result res[NMAX];
			float **snap = snapshot(&j);
			uint64_t d0[NMAX], h0[NMAX];
			char when[200];
			ts_status st;

			for (int k = 0; k < ndev; k++) {
				d0[k] = in_use(dsp[k]);
				h0[k] = in_use(psp[k]);
			}
			snprintf(when, sizeof when, "%s: %s point %llu of %llu", what,
			         ts_fault_kind_name(kinds[f]), (unsigned long long)at,
			         (unsigned long long)n);
			ts_fault_arm(kinds[f], at);
			st = rjob_try(&j, done + 1, NULL, res);
			ck_assert_msg(ts_fault_fired() == 1, "%s: not reached", when);
			ts_fault_arm(kinds[f], 0);
			for (int k = 0; k < ndev; k++)
				ck_assert_msg(in_use(dsp[k]) == d0[k] && in_use(psp[k]) == h0[k],
				              "%s: device %d's memory in use changed", when, k);
			points++;
			if (st == TS_OK) {
				rjob_step(&fresh, ++done);
			} else {
				ck_assert_msg(st == TS_INTERNAL || st == TS_RESOURCE_EXHAUSTED,
				              "%s: %s %s", when, ts_status_name(st), err.message);
				same_as(&j, snap, when);
				failed++;
			}
			snapshot_free(&j, snap);
		}
	}
	rjob_step(&j, done + 1);
	rjob_step(&fresh, done + 1);
	replicas_identical(&j, what);
	same_state(&j, &fresh, what);
	fprintf(stderr, "%s on %d devices: %d failure points, %d failed cleanly, %d absorbed\n",
	        what, ndev, points, failed, points - failed);
	ck_assert_int_gt(failed, 0);
	rjob_free(&j);
	rjob_free(&fresh);
}

START_TEST(test_every_failure_point_leaves_every_replica_whole)
{
	struct ts_policy on_dev = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                           .save_x = true, .save_h = true};
	struct ts_policy host = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_DEVICE,
	                         .offload_x = true, .prefetch_depth = 1};

	walk(&dense, &adamw_clip, &on_dev, 0, "dense on the devices");
	walk(&dense, &adam, &host, 0, "dense, params on pinned_host (journaled)");
	walk(&dense, &adamw_clip, &on_dev, 1, "dense, ZeRO-1");
	walk(&dense, &adamw_clip, &on_dev, 2, "dense, ZeRO-2");
	walk(&gpt, &adamw_clip, &on_dev, 2, "gpt, ZeRO-2");
}
END_TEST
#endif

/* ZeRO-1: Adam's state sharded over the devices gives the replicated
 * steps' weights bit for bit, and each device's state is its part of the
 * replicated state; each device's arguments shrink by the state's
 * (R-1)/R. */
static void zero_equals_replicated(const struct ts_mlp *m, int batch, const char *what)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .save_h = true};
	struct rjob rep, zero;
	uint64_t state = 0;

	rjob_new(m, &adamw_clip, batch, ndev, &pol, &rep);
	rjob_new_zero(m, &adamw_clip, batch, ndev, &pol, &zero);
	for (int i = 0; i < rep.plan.nbufs; i++)
		if (rep.plan.bufs[i].cls == TS_PB_ARGUMENT && ts_role_opt_state(rep.plan.bufs[i].role))
			state += rep.plan.bufs[i].bytes;
	ck_assert_uint_gt(state, 0);
	ck_assert_uint_eq(zero.plan.argument_size_in_bytes,
	                  rep.plan.argument_size_in_bytes - state + state / (uint64_t)ndev);
	for (int step = 1; step <= 3; step++) {
		float lr = rjob_step(&rep, step), lz = rjob_step(&zero, step);

		ck_assert_msg(memcmp(&lr, &lz, sizeof lr) == 0, "%s step %d: loss %.9g, replicated %.9g",
		              what, step, (double)lz, (double)lr);
	}
	replicas_identical(&zero, what);
	for (int i = 0; i < rep.plan.nbufs; i++) {
		const struct ts_pbuf *b = &rep.plan.bufs[i];
		float *x, *y;

		if (b->cls != TS_PB_ARGUMENT || !ts_role_param(b->role))
			continue;
		x = rjob_read(&rep, 0, i);
		y = rjob_read(&zero, 0, i);
		ck_assert_msg(memcmp(x, y, b->bytes) == 0, "%s: role %d differs from replicated Adam's",
		              what, (int)b->role);
		free(x);
		free(y);
	}
	/* each replica's mu and nu: for every sharded update, its part */
	for (int k = 0; k < ndev; k++)
		for (int a = 0; a < zero.plan.nactions; a++) {
			const struct ts_paction *u = &zero.plan.actions[a];

			if (u->op != TS_P_UPDATE || !u->rank_slice)
				continue;
			for (int s = 0; s < 2; s++) {
				int zi = s ? u->d : u->c, ri = -1;
				float *zs, *rs;

				for (int b = 0; b < rep.plan.nbufs; b++)
					if (rep.plan.bufs[b].cls == TS_PB_ARGUMENT &&
					    rep.plan.bufs[b].role == zero.plan.bufs[zi].role)
						ri = b;
				ck_assert_int_ge(ri, 0);
				zs = rjob_read(&zero, k, zi);
				rs = rjob_read(&rep, k, ri);
				ck_assert_msg(memcmp((char *)zs + u->coff,
				                     (char *)rs + u->aoff + (uint64_t)k * u->n * 4,
				                     u->n * 4) == 0,
				              "%s: replica %d's %s of update %d is not its part", what, k,
				              s ? "nu" : "mu", a);
				free(zs);
				free(rs);
			}
		}
	fprintf(stderr, "%s on %d devices: ZeRO-1 equals replicated Adam, state %llu -> %llu "
	        "bytes a device\n", what, ndev, (unsigned long long)state,
	        (unsigned long long)(state / (uint64_t)ndev));
	rjob_free(&rep);
	rjob_free(&zero);
}

START_TEST(test_zero1_equals_replicated_adam)
{
	struct ts_mlp tokens = {.layers = 2, .d_model = 16, .d_hidden = 24, .act = TS_ACT_GELU,
	                        .residual = true, .loss = TS_LOSS_XENT, .vocab = 32,
	                        .id_bytes = 4, .proj = true};

	zero_equals_replicated(&dense, 8, "dense");
	zero_equals_replicated(&gpt, 16, "gpt");
	zero_equals_replicated(&tokens, 8, "token model");
}
END_TEST

/* What ZeRO-1 refuses: another optimizer, state or params off the devices,
 * one device, an update that does not split. */
START_TEST(test_zero1_refusals)
{
	struct ts_policy on_dev = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE};
	struct ts_policy host = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_PINNED_HOST};
	struct ts_mlp odd = dense;
	struct ts_plan p;

	odd.d_model = 15;
	odd.d_hidden = 7;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_zero(&dense, &sgd_clip, 8, 1, 2, &on_dev, &p, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_zero(&dense, &adam, 8, 1, 2, &host, &p, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_zero(&dense, &adam, 8, 1, 1, &on_dev, &p, &err),
	                 TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_plan_build_zero(&odd, &adam, 8, 1, 2, &on_dev, &p, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_SHARDING");
	ck_assert_msg(strstr(err.message, "w1") != NULL, "%s", err.message);
}
END_TEST

/* The largest relative difference between two jobs' parameters (replica
 * 0's), each tensor against its own scale. */
static double params_off(const struct rjob *a, const struct rjob *b)
{
	double worst = 0;

	for (int i = 0; i < a->plan.nbufs; i++) {
		const struct ts_pbuf *bf = &a->plan.bufs[i];
		uint64_t n = bf->bytes / sizeof(float);
		double scale = 0;
		float *x, *y;

		if (bf->cls != TS_PB_ARGUMENT || !ts_role_param(bf->role))
			continue;
		ck_assert_int_eq(b->plan.bufs[i].role, bf->role);
		x = rjob_read(a, 0, i);
		y = rjob_read(b, 0, i);
		for (uint64_t e = 0; e < n; e++)
			scale = fmax(scale, fabs(y[e]));
		for (uint64_t e = 0; e < n; e++)
			worst = fmax(worst, fabs((double)x[e] - y[e]) / (scale + 1e-30));
		free(x);
		free(y);
	}
	return worst;
}

/* ZeRO-2 against replicated Adam and ZeRO-1, `accumulate` micro-batches a
 * step: without clipping (the norm unused) and one micro-batch, the
 * gradient parts are the all-reduce's parts (the host and the stand-in
 * sum in rank order), so the weights are the same bits; with clipping (the
 * norm summed part by part, then over the devices) or accumulation (the
 * sum over the devices first, then the micro-batches) within float32
 * summation error. Replicas bit-identical and every device's peak the
 * plan's after every step (rjob_step); the state arguments ZeRO-1's. */
static void zero2_equals(const struct ts_mlp *m, const struct ts_optimizer *o, int batch,
                         int accumulate, const char *what)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .save_h = true};
	struct rjob rep, z1, z2;
	bool exact = !(o->clip_global_norm > 0) && accumulate == 1 && !on_cuda;
	char when[160];
	double off;

	rjob_new_stage(m, o, batch, accumulate, ndev, 0, &pol, &rep);
	rjob_new_stage(m, o, batch, accumulate, ndev, 1, &pol, &z1);
	rjob_new_stage(m, o, batch, accumulate, ndev, 2, &pol, &z2);
	/* the same arguments as ZeRO-1 (the gradients are temps) */
	ck_assert_uint_eq(z2.plan.argument_size_in_bytes, z1.plan.argument_size_in_bytes);
	for (int step = 1; step <= 3; step++) {
		struct ts_exec_result rr[NMAX], r2[NMAX];
		float lr = rjob_step_res(&rep, step, rr), l2 = rjob_step_res(&z2, step, r2);

		rjob_step(&z1, step);
		snprintf(when, sizeof when, "%s, accumulate %d, %d devices, step %d", what,
		         accumulate, ndev, step);
		/* the loss is of the weights before the step: step 1's the same */
		ck_assert_msg(memcmp(&lr, &l2, sizeof lr) == 0 ||
		              (!exact && step > 1 && fabsf(lr - l2) <= 1e-4f * fabsf(lr)),
		              "%s: loss %.9g, replicated %.9g", when, (double)l2, (double)lr);
		/* the norm of the parts summed over the devices: the whole one's */
		ck_assert_msg(fabsf(r2[0].grad_norm - rr[0].grad_norm) <=
		              1e-5f * rr[0].grad_norm + 1e-7f,
		              "%s: gradient norm %.9g, replicated %.9g", when,
		              (double)r2[0].grad_norm, (double)rr[0].grad_norm);
		replicas_identical(&z2, when);
	}
	off = params_off(&z2, &rep);
	if (exact) {
		same_state(&z2, &z1, what);   /* params and each device's mu, nu: ZeRO-1's */
		ck_assert(off == 0);
	} else {
		/* Adam divides each gradient by its own size: a summation-order
		 * difference in a near-zero one moves it by up to the rate */
		ck_assert_msg(off <= 0.1, "%s: parameters off by %.3g of their scale", what, off);
	}
	fprintf(stderr, "%s on %d devices, accumulate %d: ZeRO-2 equals replicated Adam%s "
	        "(parameters off by %.2g of their scale); temps %llu bytes a device, ZeRO-1's "
	        "%llu\n", what, ndev, accumulate, exact ? " bit for bit" : "", off,
	        (unsigned long long)z2.plan.temp_size_in_bytes,
	        (unsigned long long)z1.plan.temp_size_in_bytes);
	rjob_free(&rep);
	rjob_free(&z1);
	rjob_free(&z2);
}

START_TEST(test_zero2_equals_replicated_adam)
{
	struct ts_mlp tokens = {.layers = 2, .d_model = 16, .d_hidden = 24, .act = TS_ACT_GELU,
	                        .residual = true, .loss = TS_LOSS_XENT, .vocab = 32,
	                        .id_bytes = 4, .proj = true};

	zero2_equals(&dense, &adam, 8, 1, "dense");
	zero2_equals(&dense, &adamw_clip, 8, 1, "dense, clipping");
	zero2_equals(&dense, &adam, 4, 2, "dense");
	zero2_equals(&gpt, &adam, 16, 1, "gpt");
	zero2_equals(&gpt, &adamw_clip, 8, 2, "gpt, clipping");
	zero2_equals(&tokens, &adam, 8, 1, "token model");
	zero2_equals(&tokens, &adamw_clip, 8, 1, "token model, clipping");
}
END_TEST

/* The ZeRO-2 plan: a REDUCE_SCATTER per update (a layer of a parameter, or
 * a whole one), each whole gradient freed right after it, no ALLREDUCE but
 * the norm's one float; the bytes reduced are the gradients' (plus the
 * norm's 4); each device's temps below ZeRO-1's by at least the gradients'
 * (R-1)/R less one layer's whole gradients, where the gradients dominate. */
START_TEST(test_zero2_plan_scatters_and_frees_each_gradient)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .save_h = true};
	struct ts_mlp wide = {.layers = 4, .d_model = 64, .d_hidden = 256, .act = TS_ACT_GELU,
	                      .residual = true, .loss = TS_LOSS_MSE};
	const int R = 4;
	uint64_t grads = 2ull * 4 * 64 * 256 * 4, layer = 2ull * 64 * 256 * 4;
	struct ts_plan z1, z2;
	int scatters = 0, reduces = 0, first_update = -1, last_scatter = -1;

	ts_error_clear(&err);
	OK(ts_plan_build_zero(&wide, &adam, 2, 1, R, &pol, &z1, &err));
	OK(ts_plan_build_zero2(&wide, &adam, 2, 1, R, &pol, &z2, &err));
	for (int i = 0; i < z2.nactions; i++) {
		const struct ts_paction *a = &z2.actions[i];

		if (a->op == TS_P_REDUCE_SCATTER) {
			scatters++;
			last_scatter = i;
			ck_assert_uint_eq(a->n * (uint64_t)R * 4, z2.bufs[a->a].bytes);
			/* the whole gradient is freed next */
			ck_assert_int_eq(z2.actions[i + 1].op, TS_P_FREE);
			ck_assert_int_eq(z2.actions[i + 1].a, a->a);
			ck_assert_int_eq(z2.bufs[a->a].cls, TS_PB_TEMP);
			ck_assert_uint_eq(z2.bufs[a->b].bytes, z2.bufs[a->a].bytes * 4 / (uint64_t)R);
		}
		if (a->op == TS_P_ALLREDUCE) {
			reduces++;
			ck_assert_uint_eq(a->n, 1);
			ck_assert_int_eq(z2.bufs[a->a].role, TS_ROLE_NORM);
		}
		if (a->op == TS_P_UPDATE && first_update < 0) {
			first_update = i;
			ck_assert(a->rank_slice);
		}
	}
	ck_assert_int_eq(scatters, 2 * wide.layers);
	ck_assert_int_eq(reduces, 1);
	ck_assert_int_lt(last_scatter, first_update);
	ck_assert_uint_eq(z2.all_reduce_bytes, grads + 4);
	ck_assert_uint_eq(z1.all_reduce_bytes, grads);
	ck_assert_uint_eq(z2.argument_size_in_bytes, z1.argument_size_in_bytes);
	fprintf(stderr, "ZeRO-2 on %d devices: temps %llu bytes a device, ZeRO-1's %llu "
	        "(gradients %llu)\n", R, (unsigned long long)z2.temp_size_in_bytes,
	        (unsigned long long)z1.temp_size_in_bytes, (unsigned long long)grads);
	ck_assert_uint_le(z2.temp_size_in_bytes + grads - grads / R,
	                  z1.temp_size_in_bytes + layer);
	ck_assert_uint_lt(z2.peak_device_bytes, z1.peak_device_bytes);
	ts_plan_release(&z1);
	ts_plan_release(&z2);
	/* ZeRO-2 refuses what ZeRO-1 does */
	wide.d_model = 15;
	wide.d_hidden = 7;
	ck_assert_int_eq(ts_plan_build_zero2(&wide, &adam, 2, 1, R, &pol, &z2, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_SHARDING");
}
END_TEST

/* ---- sessions ------------------------------------------------------------------ */

#define SROWS 64                 /* the dataset's rows */
#define SBATCH 8                 /* rows a step, over all replicas */

/* A session's model: each replica's memory of every state role, and the
 * next version of each versioned one (taking turns). */
struct smodel {
	int R;
	const struct ts_policy *pol;
	void *role[NMAX][TS_ROLE_COUNT], *next[NMAX][TS_ROLE_COUNT];
	uint64_t bytes[TS_ROLE_COUNT];
	enum ts_memory_kind kind[TS_ROLE_COUNT];
	float *data;                 /* SROWS rows of d_model, pinned_host of device 0 */
	uint64_t rows_in[SBATCH], rows_tgt[SBATCH];
	float losses[8];
	int published;
};

static struct ts_session_config sconfig(const struct smodel *m)
{
	struct ts_session_config cfg = {.dev = devs[0], .memory = mem, .mlp = dense,
	                                .opt = sgd_clip, .batch = SBATCH / m->R,
	                                .policy = *m->pol, .replicas = m->R};

	for (int k = 0; k < m->R; k++)
		cfg.devs[k] = devs[k];
	return cfg;
}

static ts_status s_prepare(void *arg, struct ts_session *s, struct ts_error *e)
{
	struct smodel *m = arg;

	for (int r = 0; r < TS_ROLE_COUNT; r++)
		for (int k = 0; k < m->R; k++) {
			ts_status st;

			if (!m->role[k][r] || !ts_session_versioned(s, (enum ts_pbuf_role)r))
				continue;
			st = ts_session_set_next_replica(s, k, (enum ts_pbuf_role)r, m->next[k][r], e);
			if (st != TS_OK)
				return st;
		}
	return TS_OK;
}

static ts_status s_publish(void *arg, struct ts_session *s, float loss, struct ts_error *e)
{
	struct smodel *m = arg;

	(void)e;
	m->losses[m->published++] = loss;
	for (int r = 0; r < TS_ROLE_COUNT; r++)
		for (int k = 0; k < m->R; k++) {
			void *t = m->role[k][r];

			if (!t || !ts_session_versioned(s, (enum ts_pbuf_role)r))
				continue;
			m->role[k][r] = m->next[k][r];
			m->next[k][r] = t;
		}
	return TS_OK;
}

/* Step n's rows: inputs 8n.. (mod SROWS) shuffled by a stride, targets
 * the rows after them; all replicas' rows, replica k's the k-th part. */
static ts_status s_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                         struct ts_session_source *src, struct ts_error *e)
{
	struct smodel *m = arg;
	uint64_t rb = (uint64_t)dense.d_model * 4;
	uint64_t *rows = role == TS_ROLE_INPUT ? m->rows_in : m->rows_tgt;

	(void)e;
	for (int j = 0; j < SBATCH; j++)
		rows[j] = (8 * n + (uint64_t)j * 5 + (role == TS_ROLE_TARGET)) % SROWS;
	*src = (struct ts_session_source){.mem = m->data, .bytes = SROWS * rb, .row_bytes = rb,
	                                  .src_dev = devs[0], .src_kind = TS_MEM_PINNED_HOST,
	                                  .rows = rows, .nrows = SBATCH};
	return TS_OK;
}

static const struct ts_session_hooks s_hooks = {.prepare = s_prepare, .publish = s_publish,
                                                .batch = s_batch};

static struct ts_session *smodel_new(struct smodel *m, int R, const struct ts_policy *pol)
{
	struct ts_session_config cfg;
	struct ts_session *s;
	struct ts_session_source src;

	memset(m, 0, sizeof *m);
	m->R = R;
	m->pol = pol;
	cfg = sconfig(m);
	ts_error_clear(&err);
	OK(ts_session_new(&cfg, &s, &err));
	ck_assert_int_eq(ts_session_replicas(s), R);
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		const struct ts_plan *p = ts_session_plan(s);
		int i;
		void *x;

		if (!ts_role_state((enum ts_pbuf_role)r) ||
		    !ts_session_slot(s, (enum ts_pbuf_role)r, &m->bytes[r], &m->kind[r]))
			continue;
		for (i = 0; (int)p->bufs[i].role != r || p->bufs[i].cls == TS_PB_TEMP; i++)
			;
		x = initial(p, (enum ts_pbuf_role)r, m->bytes[r]);
		for (int k = 0; k < R; k++) {
			struct ts_space *sp = m->kind[r] == TS_MEM_DEVICE ? dsp[k] : psp[k];

			OK(ts_space_alloc(sp, m->bytes[r], &m->role[k][r], &err));
			put(k, &p->bufs[i], m->role[k][r], x);
			if (ts_session_versioned(s, (enum ts_pbuf_role)r))
				OK(ts_space_alloc(sp, m->bytes[r], &m->next[k][r], &err));
			OK(ts_session_bind_replica(s, k, (enum ts_pbuf_role)r, m->role[k][r], m->bytes[r],
			                           m->kind[r], &err));
		}
		free(x);
	}
	OK(ts_space_alloc(psp[0], SROWS * (uint64_t)dense.d_model * 4, (void **)&m->data, &err));
	{
		unsigned seed = 99;

		for (uint64_t e = 0; e < SROWS * (uint64_t)dense.d_model; e++)
			m->data[e] = 2 * rnd(&seed) - 1;
	}
	OK(s_batch(m, 0, TS_ROLE_INPUT, &src, &err));
	OK(ts_session_stage(s, TS_ROLE_INPUT, &src, &err));
	OK(s_batch(m, 0, TS_ROLE_TARGET, &src, &err));
	OK(ts_session_stage(s, TS_ROLE_TARGET, &src, &err));
	return s;
}

static void smodel_free(struct smodel *m, struct ts_session *s)
{
	ts_session_free(s);
	for (int r = 0; r < TS_ROLE_COUNT; r++)
		for (int k = 0; k < m->R; k++) {
			struct ts_space *sp = m->kind[r] == TS_MEM_DEVICE ? dsp[k] : psp[k];

			if (m->role[k][r])
				ts_space_release(sp, m->role[k][r], m->bytes[r]);
			if (m->next[k][r])
				ts_space_release(sp, m->next[k][r], m->bytes[r]);
		}
	ts_space_release(psp[0], m->data, SROWS * (uint64_t)dense.d_model * 4);
}

/* Replica k's state of role r, read back (malloc'd). */
static float *sread(const struct smodel *m, int k, int r)
{
	struct ts_pbuf b = {.kind = m->kind[r], .bytes = m->bytes[r]};

	return get(k, &b, m->role[k][r]);
}

/* A data-driven session of SGD steps over every device equals one
 * device's session on the same rows: each replica staged its part of each
 * step's rows (the next step's while this one computes), the versions of
 * the offloaded weights taking turns on every replica. */
START_TEST(test_session_on_every_device_equals_one_device)
{
	struct ts_policy pol = {.params = TS_MEM_PINNED_HOST, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .prefetch_depth = 1};
	struct smodel dp, one;
	struct ts_session *sd = smodel_new(&dp, ndev, &pol), *s1 = smodel_new(&one, 1, &pol);
	const struct ts_session_report *rep;

	OK(ts_session_run(sd, 5, 1, &s_hooks, &dp, &err));
	OK(ts_session_run(s1, 5, 1, &s_hooks, &one, &err));
	ck_assert_int_eq(dp.published, 5);
	for (int n = 0; n < 5; n++)
		ck_assert_msg(fabsf(dp.losses[n] - one.losses[n]) <= 1e-5f * fabsf(one.losses[n]),
		              "step %d: loss %.9g on %d devices, %.9g on one", n + 1,
		              (double)dp.losses[n], ndev, (double)one.losses[n]);
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		float *y;
		double scale = 0, worst = 0;
		uint64_t n = one.bytes[r] / 4;

		if (!one.role[0][r])
			continue;
		y = sread(&one, 0, r);
		for (uint64_t e = 0; e < n; e++)
			scale = fmax(scale, fabs(y[e]));
		for (int k = 0; k < ndev; k++) {
			float *x = sread(&dp, k, r);

			if (k > 0) {
				float *x0 = sread(&dp, 0, r);

				ck_assert_msg(memcmp(x, x0, one.bytes[r]) == 0,
				              "replica %d's role %d differs from replica 0's", k, r);
				free(x0);
			}
			for (uint64_t e = 0; e < n; e++)
				worst = fmax(worst, fabs((double)x[e] - y[e]) / (scale + 1e-30));
			free(x);
		}
		ck_assert_msg(worst <= 2e-5, "role %d off by %.3g of its scale", r, worst);
		free(y);
	}
	rep = ts_session_report(sd);
	ck_assert_uint_eq(rep->steps, 5);
	/* the all-reduces moved each replica's gradients: the parameters' size */
	ck_assert_uint_eq(rep->allreduce_bytes,
	                  5 * (dp.bytes[TS_ROLE_W1] + dp.bytes[TS_ROLE_W2]));
	for (int k = 0; k < ndev; k++)
		ck_assert_msg(rep->replica_compute_s[k] >= 0, "replica %d's compute time", k);
	smodel_free(&dp, sd);
	smodel_free(&one, s1);
}
END_TEST

/* A session refuses replicas for an evaluation, or a first device that is
 * not cfg.dev; a source of the wrong size to split. */
START_TEST(test_session_refusals)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE};
	struct smodel m = {.R = ndev, .pol = &pol};
	struct ts_session_config cfg = sconfig(&m);
	struct ts_session *s;
	float *x;
	struct ts_session_source src;

	ts_error_clear(&err);
	cfg.evaluate = true;
	ck_assert_int_eq(ts_session_new(&cfg, &s, &err), TS_INVALID_ARGUMENT);
	cfg = sconfig(&m);
	cfg.dev = devs[1];
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_new(&cfg, &s, &err), TS_INVALID_ARGUMENT);
	cfg = sconfig(&m);
	OK(ts_session_new(&cfg, &s, &err));
	x = calloc(SBATCH * 2, (size_t)dense.d_model * 4);
	ck_assert_ptr_nonnull(x);
	/* one replica's rows, not every replica's */
	src = (struct ts_session_source){.mem = x, .bytes = SBATCH / (uint64_t)ndev *
	                                                    (uint64_t)dense.d_model * 4,
	                                 .row_bytes = (uint64_t)dense.d_model * 4,
	                                 .src_dev = devs[0], .src_kind = TS_MEM_UNPINNED_HOST};
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_stage(s, TS_ROLE_INPUT, &src, &err), TS_FAILED_PRECONDITION);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_session_bind_replica(s, ndev, TS_ROLE_W1, x, 4, TS_MEM_DEVICE, &err),
	                 TS_INVALID_ARGUMENT);
	free(x);
	ts_session_free(s);
}
END_TEST

/* Overlap, planned: a replicated step of one micro-batch all-reduces each
 * gradient in buckets as the backward pass makes it - the first before the
 * backward pass's last product, each layer's slice once, in backward order,
 * TS_PLAN_BUCKET_BYTES but the last of each gradient - and the bytes are
 * still the gradients' size; accumulating, every all-reduce comes after
 * the backward pass (the accumulators are whole only then). */
START_TEST(test_plan_all_reduces_during_backward)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .save_h = true};
	const uint64_t wb = 512ull * 512 * sizeof(float);
	struct ts_plan p;

	ts_error_clear(&err);
	for (int acc = 1; acc <= 2; acc++) {
		int first = -1, last_gemm = -1, n = 0;
		uint64_t bytes = 0, next_end = 6 * wb;

		OK(ts_plan_build_replicated(&wide_dense, &sgd_clip, 4, acc, 2, &pol, &p, &err));
		for (int i = 0; i < p.nactions; i++) {
			const struct ts_paction *a = &p.actions[i];

			if (a->op == TS_P_GEMM && a->phase && !strcmp(a->phase, "backward"))
				last_gemm = i;
			if (a->op != TS_P_ALLREDUCE)
				continue;
			first = first < 0 ? i : first;
			n++;
			bytes += a->n * sizeof(float);
			/* w1's gradient, from its last layer down, no byte twice */
			ck_assert_uint_eq(a->aoff + a->n * sizeof(float), next_end);
			next_end = a->aoff;
		}
		ck_assert_uint_eq(bytes, 6 * wb);
		ck_assert_uint_eq(p.all_reduce_bytes, bytes);
		ck_assert_uint_eq(next_end, 0);
		if (acc == 1) {
			ck_assert_int_eq(n, 2);     /* layers 5..2 (4 MiB), then 1..0 */
			ck_assert_int_lt(first, last_gemm);
		} else {
			ck_assert_int_eq(n, 1);
			ck_assert_int_gt(first, last_gemm);
		}
		fprintf(stderr, "wide, accumulate %d: %d all-reduce(s), the first at action %d, the "
		        "backward pass's last product at %d\n", acc, n, first, last_gemm);
		ts_plan_release(&p);
	}
	/* a GPT whose MLP weights' gradients are 4 MiB a layer: they go
	 * during the backward pass, every gradient's bytes once in all */
	{
		const struct ts_mlp big = {.layers = 2, .d_model = 512, .d_hidden = 2048,
		                           .act = TS_ACT_GELU, .loss = TS_LOSS_XENT, .vocab = 37,
		                           .id_bytes = 4, .gpt = true, .heads = 8, .context = 8};
		uint64_t *done;
		int first = -1, last_gemm = -1, nreduced = 0;

		OK(ts_plan_build_replicated(&big, &adam, 8, 1, 2, &pol, &p, &err));
		done = calloc((size_t)p.nbufs, sizeof *done);
		ck_assert_ptr_nonnull(done);
		for (int i = 0; i < p.nactions; i++) {
			const struct ts_paction *a = &p.actions[i];

			if ((a->op == TS_P_GEMM || a->op == TS_P_GEMM_BATCHED) && a->phase &&
			    !strcmp(a->phase, "backward"))
				last_gemm = i;
			if (a->op != TS_P_ALLREDUCE)
				continue;
			first = first < 0 ? i : first;
			ck_assert_uint_le(a->aoff + a->n * sizeof(float), p.bufs[a->a].bytes);
			done[a->a] += a->n * sizeof(float);
		}
		for (int i = 0; i < p.nbufs; i++) {
			int kind = -1, t;

			if (!done[i])
				continue;
			ck_assert(ts_gpt_role_of(p.bufs[i].role, &kind, &t) && kind == 3);
			ck_assert_uint_eq(done[i], p.bufs[i].bytes);     /* a gradient, whole */
			nreduced++;
		}
		ck_assert_int_eq(nreduced, TS_GPT_NPARAMS);
		ck_assert_int_lt(first, last_gemm);
		free(done);
		ts_plan_release(&p);
	}
}
END_TEST

/* Overlap, run: the step whose all-reduces run on each device's comm queue
 * during the backward pass holds the same bits as the step that runs them
 * on the compute queue (no comm queue), equals one device's step on the
 * whole batch, keeps every replica identical and every measured peak the
 * plan's (rjob_step), and its comm queue's clock holds the collectives'
 * time (sim) while the compute queue's waiting for them is apart. */
START_TEST(test_overlapped_all_reduce_same_bits)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .save_h = true};
	struct ts_exec_result res[NMAX];
	struct rjob over, inline_, one;
	char when[96];

	rjob_new(&wide_dense, &sgd_clip, 4, ndev, &pol, &over);
	rjob_new(&wide_dense, &sgd_clip, 4, ndev, &pol, &inline_);
	rjob_new(&wide_dense, &sgd_clip, 4 * ndev, 1, &pol, &one);
	for (int step = 1; step <= 2; step++) {
		float lo, li, l1;

		lo = rjob_step_res(&over, step, res);
		for (int k = 0; k < ndev; k++) {
			ck_assert(on_cuda || res[k].comm_s > 0);
			/* the backward pass never waited for an all-reduce: the
			 * compute queue waits for the comm queue once, at the
			 * mean's scaling after the last bucket */
			ck_assert_msg(res[k].comm_waits == 1, "replica %d: %llu waits for the comm "
			              "queue", k, (unsigned long long)res[k].comm_waits);
			envs[k].comm = NULL;
		}
		li = rjob_step_res(&inline_, step, res);
		for (int k = 0; k < ndev; k++) {
			ck_assert(res[k].comm_wait_s == 0 && res[k].comm_waits == 0);
			envs[k].comm = qm[k];
		}
		l1 = rjob_step(&one, step);
		snprintf(when, sizeof when, "wide, sgd, clipping, %d devices, step %d", ndev, step);
		ck_assert_msg(memcmp(&lo, &li, sizeof lo) == 0, "%s: loss %.9g, collectives on the "
		              "compute queue %.9g", when, (double)lo, (double)li);
		ck_assert_msg(fabsf(lo - l1) <= 1e-5f * fabsf(l1) + 1e-6f,
		              "%s: loss %.9g, one device %.9g", when, (double)lo, (double)l1);
		replicas_identical(&over, when);
		same_state(&over, &inline_, when);
		close_to(&over, &one, 2e-5, when);
	}
	rjob_free(&over);
	rjob_free(&inline_);
	rjob_free(&one);
}
END_TEST

static void add_cases(TCase *tc)
{
	tcase_add_test(tc, test_overlapped_all_reduce_same_bits);
	tcase_add_test(tc, test_dense_model_equals_one_device);
	tcase_add_test(tc, test_gpt_equals_one_device);
	tcase_add_test(tc, test_same_bits_every_run);
	tcase_add_test(tc, test_bad_runs_refused);
	tcase_add_test(tc, test_copy_failure_on_one_device_leaves_every_replica_whole);
	tcase_add_test(tc, test_session_on_every_device_equals_one_device);
	tcase_add_test(tc, test_session_refusals);
	tcase_add_test(tc, test_zero1_equals_replicated_adam);
	tcase_add_test(tc, test_zero2_equals_replicated_adam);
#ifdef TS_FAULT_BUILD
	tcase_add_test(tc, test_every_failure_point_leaves_every_replica_whole);
#endif
}

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("replicas");
	TCase *tc = tcase_create("plan");

	tcase_add_test(tc, test_plan_reduces_every_gradient_once);
	tcase_add_test(tc, test_plan_all_reduces_during_backward);
	tcase_add_test(tc, test_zero1_refusals);
	tcase_add_test(tc, test_zero2_plan_scatters_and_frees_each_gradient);
	suite_add_tcase(s, tc);
	tc = tcase_create("sim2");
	tcase_add_checked_fixture(tc, setup_sim2, teardown);
	tcase_set_timeout(tc, 120);
	add_cases(tc);
	suite_add_tcase(s, tc);
	tc = tcase_create("sim4");
	tcase_add_checked_fixture(tc, setup_sim4, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_dense_model_equals_one_device);
	tcase_add_test(tc, test_gpt_equals_one_device);
	tcase_add_test(tc, test_overlapped_all_reduce_same_bits);
	tcase_add_test(tc, test_session_on_every_device_equals_one_device);
	tcase_add_test(tc, test_zero1_equals_replicated_adam);
	tcase_add_test(tc, test_zero2_equals_replicated_adam);
	suite_add_tcase(s, tc);
	if (ts_unit_cuda()) {
		tc = tcase_create("cuda");
		tcase_add_checked_fixture(tc, setup_cuda, teardown);
		tcase_set_timeout(tc, 600);
		add_cases(tc);
		suite_add_tcase(s, tc);
	}
	return s;
}
