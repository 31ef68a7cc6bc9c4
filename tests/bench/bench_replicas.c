/*
 * bench_replicas.c - a data-parallel step (train/session.h with replicas)
 * on two sim devices against one device on the whole batch, in process:
 * a 4-layer d 512, h 2048 MLP with Adam, 256 rows a step (128 a device).
 *
 * Rows:
 *   - the step's time on two devices over one device's on the whole batch
 *     (no target: two sim devices on a two-core machine share its cores, so
 *     they are not expected to scale; on a GPU node the bundle measures
 *     the 8-GPU figure);
 *   - the bytes each device all-reduces a step over the gradients' size
 *     (target = 1: nothing but the gradients crosses between devices);
 *   - the all-reduce alone (ts_comm_allreduce of the gradients' size over
 *     both devices, the host's sum in device order) against memcpy of the
 *     bytes it touches (each device's buffer read once and written once),
 *     measured in the same run (no target: it says what communication
 *     costs here);
 *   - each device's compute and communication time a step, from the
 *     session's report (its compute queue's busy time, and its time in
 *     the collectives, waiting for the other device included);
 *   - each device's planned temps with ZeRO-2 (gradients reduce-scattered
 *     and freed per layer) over ZeRO-1's (whole gradients until the
 *     update), from the plans' analysis (exact: the measured peak is the
 *     plan's; target: below ZeRO-1's by at least half the gradients less
 *     one layer's).
 * Each time is the best of a few after a warm-up.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "tests/bench/benchlib.h"
#include "train/session.h"

#define ROWS 256
#define STEPS 3
#define RUNS 4

static const struct ts_mlp model = {.layers = 4, .d_model = 512, .d_hidden = 2048,
                                    .act = TS_ACT_GELU, .residual = true,
                                    .loss = TS_LOSS_MSE};
static const struct ts_optimizer adam = {.type = TS_OPT_ADAM, .learning_rate = 1e-4f,
                                         .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-8f};

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_device *devs[2];

static void die(const char *what, const struct ts_error *err)
{
	fprintf(stderr, "bench_replicas: %s: %s\n", what, err ? err->message : "failed");
	exit(1);
}

static double now_s(void)
{
	return (double)ts_now_ns() / 1e9;
}

/* A session of R devices over the model, its state bound (device memory,
 * small random weights, zero Adam state), the batch staged from data. */
struct run {
	int R;
	struct ts_session *s;
	void *mem[2][TS_ROLE_COUNT];
	uint64_t bytes[TS_ROLE_COUNT];
};

static void run_open(struct run *r, int R, const float *data)
{
	struct ts_session_config cfg = {.dev = devs[0], .memory = mem, .mlp = model, .opt = adam,
	                                .batch = ROWS / R, .replicas = R,
	                                .policy = {.params = TS_MEM_DEVICE,
	                                           .opt_state = TS_MEM_DEVICE, .save_x = true,
	                                           .save_h = true}};
	uint64_t rb = (uint64_t)model.d_model * sizeof(float);
	struct ts_session_source src = {.mem = data, .bytes = ROWS * rb, .row_bytes = rb,
	                                .src_dev = devs[0], .src_kind = TS_MEM_UNPINNED_HOST};
	struct ts_error err;

	ts_error_clear(&err);
	memset(r, 0, sizeof *r);
	r->R = R;
	cfg.devs[0] = devs[0];
	cfg.devs[1] = devs[1];
	if (ts_session_new(&cfg, &r->s, &err) != TS_OK)
		die("session", &err);
	for (int role = 0; role < TS_ROLE_COUNT; role++) {
		enum ts_memory_kind kind;

		if (!ts_role_state((enum ts_pbuf_role)role) ||
		    !ts_session_slot(r->s, (enum ts_pbuf_role)role, &r->bytes[role], &kind))
			continue;
		for (int k = 0; k < R; k++) {
			struct ts_space *sp = ts_memory_find(mem, ts_device_props(devs[k])->id, kind);
			float *x;

			if (ts_space_alloc(sp, r->bytes[role], &r->mem[k][role], &err) != TS_OK)
				die("state", &err);
			x = r->mem[k][role];     /* sim device memory is host memory */
			for (uint64_t i = 0; i < r->bytes[role] / sizeof *x; i++)
				x[i] = ts_role_param((enum ts_pbuf_role)role)
				       ? (float)((i * 2654435761u) % 1000) * 2e-5f - 0.01f : 0.0f;
			if (ts_session_bind_replica(r->s, k, (enum ts_pbuf_role)role, x, r->bytes[role],
			                            kind, &err) != TS_OK)
				die("bind", &err);
		}
	}
	if (ts_session_stage(r->s, TS_ROLE_INPUT, &src, &err) != TS_OK ||
	    ts_session_stage(r->s, TS_ROLE_TARGET, &src, &err) != TS_OK)
		die("stage", &err);
}

static void run_close(struct run *r)
{
	ts_session_free(r->s);
	for (int role = 0; role < TS_ROLE_COUNT; role++)
		for (int k = 0; k < r->R; k++)
			if (r->mem[k][role])
				ts_space_release(ts_memory_find(mem, ts_device_props(devs[k])->id,
				                                TS_MEM_DEVICE),
				                 r->mem[k][role], r->bytes[role]);
}

/* Seconds of one step, best of RUNS runs of STEPS (after one warm-up). */
static double step_s(struct run *r, uint64_t *t)
{
	struct ts_error err;
	double best = 1e30;

	ts_error_clear(&err);
	for (int i = 0; i <= RUNS; i++) {
		double t0 = now_s(), dt;

		if (ts_session_run(r->s, STEPS, *t, NULL, NULL, &err) != TS_OK)
			die("step", &err);
		*t += STEPS;
		dt = (now_s() - t0) / STEPS;
		if (i > 0 && dt < best)
			best = dt;
	}
	return best;
}

/* The all-reduce of n floats over both devices alone, and memcpy of the
 * bytes it touches, best of a few each (seconds). */
static void allreduce_vs_memcpy(uint64_t n, double *ar_s, double *cp_s)
{
	struct ts_comm *comm;
	struct ts_queue *q[2];
	float *b[2];
	char *src, *dst;
	struct ts_error err;
	uint64_t bytes = n * sizeof(float);

	ts_error_clear(&err);
	if (ts_comm_new(devs, 2, &comm, &err) != TS_OK)
		die("communicator", &err);
	for (int k = 0; k < 2; k++) {
		void *p;

		if (ts_queue_new(devs[k], &q[k], &err) != TS_OK ||
		    ts_space_alloc(ts_memory_find(mem, ts_device_props(devs[k])->id, TS_MEM_DEVICE),
		                   bytes, &p, &err) != TS_OK)
			die("buffers", &err);
		b[k] = p;
		memset(p, 1, bytes);
	}
	src = malloc(2 * bytes);
	dst = malloc(2 * bytes);
	if (!src || !dst)
		die("memcpy buffers", NULL);
	memset(src, 1, 2 * bytes);
	memset(dst, 0, 2 * bytes);
	*ar_s = *cp_s = 1e30;
	for (int i = 0; i <= RUNS; i++) {
		double t0 = now_s(), t1;

		if (ts_comm_allreduce(comm, q, b, n, &err) != TS_OK ||
		    ts_queue_sync(q[0], &err) != TS_OK || ts_queue_sync(q[1], &err) != TS_OK)
			die("all-reduce", &err);
		t1 = now_s();
		memcpy(dst, src, 2 * bytes);
		if (i > 0) {
			*ar_s = t1 - t0 < *ar_s ? t1 - t0 : *ar_s;
			*cp_s = now_s() - t1 < *cp_s ? now_s() - t1 : *cp_s;
		}
	}
	if (dst[bytes] != 1)
		die("memcpy reference", NULL);
	free(src);
	free(dst);
	for (int k = 0; k < 2; k++) {
		ts_queue_free(q[k]);
		ts_space_release(ts_memory_find(mem, ts_device_props(devs[k])->id, TS_MEM_DEVICE), b[k],
		                 bytes);
	}
	ts_comm_free(comm);
}

/* ZeRO-2's planned temps a device against ZeRO-1's, on the bench's step. */
static void zero2_vs_zero1(uint64_t grads)
{
	struct ts_policy pol = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                        .save_x = true, .save_h = true};
	uint64_t layer = grads / (uint64_t)model.layers;
	struct ts_plan z1, z2;
	struct ts_error err;
	char v[64], ref[64], tgt[64];

	ts_error_clear(&err);
	if (ts_plan_build_zero(&model, &adam, ROWS / 2, 1, 2, &pol, &z1, &err) != TS_OK ||
	    ts_plan_build_zero2(&model, &adam, ROWS / 2, 1, 2, &pol, &z2, &err) != TS_OK)
		die("ZeRO plans", &err);
	snprintf(v, sizeof v, "%.1f MiB", (double)z2.temp_size_in_bytes / 1048576.0);
	snprintf(ref, sizeof ref, "ZeRO-1: %.1f MiB", (double)z1.temp_size_in_bytes / 1048576.0);
	snprintf(tgt, sizeof tgt, "<= %.2f",
	         (double)(z1.temp_size_in_bytes - grads / 2 + layer) /
	         (double)z1.temp_size_in_bytes);
	bench_row("ZeRO-2 / ZeRO-1: temps a device (plan)", v, ref,
	          (double)z2.temp_size_in_bytes / (double)z1.temp_size_in_bytes, tgt, true,
	          z2.temp_size_in_bytes + grads / 2 <= z1.temp_size_in_bytes + layer);
	ts_plan_release(&z1);
	ts_plan_release(&z2);
}

int main(void)
{
	struct ts_device_config dc = {.sim_devices = 2, .sim_device_memory = 1ull << 30,
	                              .host = "bench"};
	struct ts_memory_config mc = {.device_memory_fraction = 1.0,
	                              .pinned_host_limit = 256ull << 20,
	                              .unpinned_host_limit = 64ull << 20};
	uint64_t params, t1 = 1, t2 = 1;
	struct run one, dp;
	float *data;
	double s1, s2, ar, cp;
	const struct ts_session_report *rep;
	char v[64], ref[64], tgt[32];
	struct ts_error err;

	ts_error_clear(&err);
	if (ts_device_set_new(&dc, &set, &err) != TS_OK || ts_memory_new(set, &mc, &mem, &err))
		die("devices", &err);
	devs[0] = ts_device_set_find(set, "sim:0");
	devs[1] = ts_device_set_find(set, "sim:1");
	if (!devs[0] || !devs[1])
		die("two sim devices", NULL);
	data = malloc((size_t)ROWS * (size_t)model.d_model * sizeof *data);
	if (!data)
		die("data", NULL);
	for (size_t i = 0; i < (size_t)ROWS * (size_t)model.d_model; i++)
		data[i] = (float)(i % 97) / 97.0f - 0.5f;
	run_open(&one, 1, data);
	run_open(&dp, 2, data);
	/* interleaved, so that drift on a shared machine falls on both */
	s1 = step_s(&one, &t1);
	s2 = step_s(&dp, &t2);
	s1 = fmin(s1, step_s(&one, &t1));
	s2 = fmin(s2, step_s(&dp, &t2));
	snprintf(v, sizeof v, "%.1f ms", s2 * 1e3);
	snprintf(ref, sizeof ref, "1 device: %.1f ms", s1 * 1e3);
	bench_row("data parallel: 2 sim devices / 1 (256 rows)", v, ref, s1 / s2, NULL, false,
	          false);
	rep = ts_session_report(dp.s);
	params = dp.bytes[TS_ROLE_W1] + dp.bytes[TS_ROLE_W2];
	snprintf(v, sizeof v, "%.2f MiB", (double)rep->allreduce_bytes / (double)rep->steps /
	                                     1048576.0);
	snprintf(ref, sizeof ref, "gradients: %.2f MiB", (double)params / 1048576.0);
	snprintf(tgt, sizeof tgt, "= 1");
	bench_row("data parallel: all-reduced / gradient bytes", v, ref,
	          (double)rep->allreduce_bytes / (double)rep->steps / (double)params, tgt, true,
	          rep->allreduce_bytes == rep->steps * params);
	allreduce_vs_memcpy(params / sizeof(float), &ar, &cp);
	snprintf(v, sizeof v, "%.2f ms", ar * 1e3);
	snprintf(ref, sizeof ref, "memcpy 2x: %.2f ms", cp * 1e3);
	bench_row("data parallel: all-reduce / memcpy", v, ref, ar / cp, NULL, false, false);
	snprintf(v, sizeof v, "%.1f / %.1f ms", rep->replica_compute_s[0] / (double)rep->steps * 1e3,
	         rep->replica_compute_s[1] / (double)rep->steps * 1e3);
	snprintf(ref, sizeof ref, "all-reduce %.1f%% of step", 100.0 * ar / s2);
	bench_row("data parallel: mean compute, sim:0 / sim:1", v, ref,
	          rep->replica_compute_s[1] > 0
	          ? rep->replica_compute_s[0] / rep->replica_compute_s[1] : 0.0 / 0.0,
	          NULL, false, false);
	snprintf(v, sizeof v, "%.1f / %.1f ms", rep->replica_comm_s[0] / (double)rep->steps * 1e3,
	         rep->replica_comm_s[1] / (double)rep->steps * 1e3);
	snprintf(ref, sizeof ref, "compute %.1f ms", rep->replica_compute_s[0] /
	                                             (double)rep->steps * 1e3);
	bench_row("data parallel: mean communication, sim:0 / 1", v, ref,
	          rep->replica_compute_s[0] > 0 ? rep->replica_comm_s[0] / rep->replica_compute_s[0]
	                                        : 0.0 / 0.0,
	          NULL, false, false);
	zero2_vs_zero1(params);
	run_close(&one);
	run_close(&dp);
	free(data);
	ts_memory_free(mem);
	ts_device_set_free(set);
	return 0;
}
