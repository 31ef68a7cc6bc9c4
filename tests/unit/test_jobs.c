/*
 * test_jobs.c - Check suite "jobs": the work operations run (jobs/), on
 * sim:0, without HTTP: a model's creation (all of its arrays published at
 * once, or nothing), the holds a step takes (every other writer, an
 * evaluation and a delete refused while it runs), publish-once (one new
 * version per array for a call of N steps), the private versions of
 * offloaded arrays (a reader of the old version keeps its bytes) against
 * in-place device arrays, cancellation between steps with its partial
 * result, the batches and epochs of a data-driven run (positions wrap
 * into the next epoch; a seed gives one order), and an evaluation that
 * writes nothing of its model.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jobs/model.h"
#include "jobs/step.h"
#include "memory/buffer.h"
#include "memory/space.h"
#include "storage/array.h"
#include "storage/array_io.h"
#include "storage/stage.h"
#include "tests/unit/unit.h"

static struct ts_jobs_env env;
static struct ts_device *dev;
static struct ts_error err;

#define OK(call) TS_UNIT_OK(err, call)

#define D 8          /* d_model */
#define ROWS 6       /* rows of the datasets */

static void setup(void)
{
	static const struct ts_unit_sim_config sim = {.devices = 1, .device_memory = 64ull << 20,
	                                              .device_fraction = 1.0,
	                                              .pinned = 64ull << 20, .unpinned = 16ull << 20,
	                                              .segment = 8ull << 20};
	struct ts_op_registry_config oc = {.workers = 2, .keep_finished = 64};

	ts_error_clear(&err);
	memset(&env, 0, sizeof env);
	ts_unit_sim_new(&sim, &env.devices, &env.memory, &env.stager);
	dev = ts_device_set_find(env.devices, "sim:0");
	ck_assert_ptr_nonnull(dev);
	env.catalog = ts_catalog_new();
	env.models = ts_model_registry_new();
	ck_assert_ptr_nonnull(env.catalog);
	ck_assert_ptr_nonnull(env.models);
	OK(ts_op_registry_new(&oc, &env.operations, &err));
}

static void teardown(void)
{
	ts_op_registry_free(env.operations);
	ts_model_registry_free(env.models);
	ts_catalog_free(env.catalog);
	ts_unit_sim_free(env.devices, env.memory, env.stager);
}

/* ---- helpers -------------------------------------------------------------------- */

/* Waits for op and returns its snapshot (the caller releases it); drops op. */
static struct ts_op_snapshot finish(struct ts_operation *op)
{
	struct ts_op_snapshot s;

	ck_assert(ts_operation_block(op, 120ull * 1000000000ull));
	ts_operation_snapshot(op, &s);
	ts_operation_unref(op);
	return s;
}

/* Model m, named name, created (weights from seed) and ready; the
 * registry's copy in *out. */
static void create_spec(struct ts_model m, const char *name, uint64_t seed, struct ts_model *out)
{
	struct ts_model_init init = {.scale = 0.5, .seed = seed};
	struct ts_operation *op = NULL;
	struct ts_op_snapshot s;

	snprintf(m.name, sizeof m.name, "%s", name);
	OK(ts_job_model_create_submit(&env, &m, &init, &op, &err));
	s = finish(op);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "create: %s", s.error.message);
	ck_assert_str_eq(json_string_value(json_object_get(s.result, "state")), "READY");
	ts_op_snapshot_release(&s);
	ck_assert(ts_model_registry_get(env.models, name, out));
	ck_assert(out->ready);
}

/* A model with Adam, its params and optimizer state in kind, created and
 * ready; the registry's copy in *out. */
static void create_model(const char *name, enum ts_memory_kind kind, uint64_t seed,
                         struct ts_model *out)
{
	struct ts_model m = {.mlp = {.layers = 2, .d_model = D, .d_hidden = 16,
	                             .act = TS_ACT_GELU, .loss = TS_LOSS_MSE},
	                     .opt = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                             .b2 = 0.999f, .eps = 1e-8f},
	                     .policy = {.params = kind, .opt_state = kind, .save_x = true,
	                                .save_h = true},
	                     .device = dev};
	create_spec(m, name, seed, out);
}

/* Publishes name, of dtype [rows, cols], on sim:0's kind memory with the
 * bytes of v. */
static void put_array(const char *name, enum ts_dtype dtype, uint64_t rows, uint64_t cols,
                      enum ts_memory_kind kind, const void *v)
{
	struct ts_array_desc d = {.dtype = dtype, .rank = 2, .shape = {rows, cols}};
	struct ts_placement pl;
	struct ts_array *a = NULL;
	struct ts_array_writer *w = NULL;

	ts_placement_single(&pl, dev, kind, true);
	OK(ts_array_desc_init(&d, &err));
	OK(ts_array_new(name, &d, &pl, env.memory, &a, &err));
	OK(ts_array_writer_new(env.stager, a, &w, &err));
	OK(ts_array_writer_write(w, v, d.nbytes, &err));
	OK(ts_array_writer_finish(w, &err));
	ts_array_writer_free(w);
	OK(ts_catalog_put(env.catalog, a, &(struct ts_precondition){0}, NULL, &err));
	ts_array_unref(a);
}

/* Publishes float32 [rows, D] name on sim:0's kind memory, element i
 * being f(i). */
static void put_floats(const char *name, uint64_t rows, enum ts_memory_kind kind,
                       float (*f)(uint64_t))
{
	float *v = malloc(rows * D * sizeof *v);

	ck_assert_ptr_nonnull(v);
	for (uint64_t i = 0; i < rows * D; i++)
		v[i] = f(i);
	put_array(name, TS_DT_FLOAT32, rows, D, kind, v);
	free(v);
}

static float inputs_f(uint64_t i) { return (float)sin(0.37 * (double)i); }
static float targets_f(uint64_t i) { return (float)cos(0.11 * (double)i); }

/* The bytes of a version (malloc'd). */
static float *read_all(const struct ts_array *a)
{
	uint64_t n = ts_array_desc(a)->nbytes;
	struct ts_run run = {0, 0, n};
	float *v = malloc(n);

	ck_assert_ptr_nonnull(v);
	OK(ts_array_read(env.stager, a, &run, 1, v, &err));
	return v;
}

static uint64_t version_of(const char *name)
{
	struct ts_array *a = ts_catalog_get(env.catalog, name);
	uint64_t v;

	ck_assert_ptr_nonnull(a);
	v = ts_array_version(a);
	ts_array_unref(a);
	return v;
}

/* A step of m on the datasets "x" and "y" (whole), steps steps. */
static struct ts_job_run step_of(const struct ts_model *m, uint64_t steps)
{
	struct ts_job_run run = {.model = *m, .steps = steps,
	                         .inputs = {.array = "x"}, .targets = {.array = "y"}};

	OK(ts_job_model_policy(&env, m, &run.policy, &err));
	return run;
}

static void datasets(void)
{
	put_floats("x", ROWS, TS_MEM_PINNED_HOST, inputs_f);
	put_floats("y", ROWS, TS_MEM_PINNED_HOST, targets_f);
}

/* Runs run as a step (or an evaluation) to its end; the snapshot. */
static struct ts_op_snapshot run_step(const struct ts_job_run *run)
{
	struct ts_operation *op = NULL;

	OK(ts_job_step_submit(&env, run, &op, &err));
	return finish(op);
}

static struct ts_op_snapshot run_eval(const struct ts_job_run *run)
{
	struct ts_operation *op = NULL;

	OK(ts_job_eval_submit(&env, run, &op, &err));
	return finish(op);
}

static json_int_t result_int(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);

	ck_assert_msg(json_is_integer(v), "no integer '%s'", key);
	return json_integer_value(v);
}

/* ---- creation ------------------------------------------------------------------- */

START_TEST(test_create_publishes_every_array_at_once)
{
	static const char *const names[] = {"m.w1", "m.w2", "m.adam.mu.w1", "m.adam.mu.w2",
	                                    "m.adam.nu.w1", "m.adam.nu.w2"};
	struct ts_model m;

	create_model("m", TS_MEM_DEVICE, 1, &m);
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		struct ts_array *a = ts_catalog_get(env.catalog, names[i]);

		ck_assert_msg(a != NULL, "%s missing", names[i]);
		ck_assert_str_eq(ts_array_owner(a), "model 'm'");
		ck_assert_uint_eq(ts_array_version(a), 1);
		ts_array_unref(a);
	}
	/* Adam's state starts at zero, the weights do not */
	{
		struct ts_array *mu = ts_catalog_get(env.catalog, "m.adam.mu.w1");
		struct ts_array *w1 = ts_catalog_get(env.catalog, "m.w1");
		float *a = read_all(mu), *b = read_all(w1);
		uint64_t n = ts_array_desc(w1)->nbytes / 4, nonzero = 0;

		for (uint64_t i = 0; i < n; i++) {
			ck_assert(a[i] == 0.0f);
			nonzero += b[i] != 0.0f;
		}
		ck_assert_uint_gt(nonzero, n / 2);
		free(a);
		free(b);
		ts_array_unref(mu);
		ts_array_unref(w1);
	}
}
END_TEST

START_TEST(test_create_refused_leaves_nothing)
{
	struct ts_model m, again;
	struct ts_model_init init = {.scale = 0.1};
	struct ts_operation *op = NULL;

	create_model("m", TS_MEM_DEVICE, 1, &m);
	/* the model's name taken */
	again = m;
	ck_assert_int_eq(ts_job_model_create_submit(&env, &again, &init, &op, &err),
	                 TS_ALREADY_EXISTS);
	ck_assert_ptr_null(op);
	/* one of its arrays' names taken: refused, and no model 'n' is left */
	put_floats("n.w2", 2, TS_MEM_DEVICE, inputs_f);
	snprintf(again.name, sizeof again.name, "n");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_job_model_create_submit(&env, &again, &init, &op, &err),
	                 TS_ALREADY_EXISTS);
	ck_assert_str_eq(err.reason, "ARRAY_EXISTS");
	ck_assert(!ts_model_registry_get(env.models, "n", &again));
	ck_assert_ptr_null(ts_catalog_get(env.catalog, "n.w1"));
}
END_TEST

/* ---- steps ---------------------------------------------------------------------- */

START_TEST(test_step_publishes_once)
{
	struct ts_model m;
	struct ts_job_run run;
	struct ts_op_snapshot s;
	uint64_t t = 0;

	create_model("m", TS_MEM_DEVICE, 2, &m);
	datasets();
	run = step_of(&m, 5);
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	ck_assert_int_eq(result_int(s.result, "steps"), 5);
	ck_assert_int_eq(result_int(s.result, "model_steps"), 5);
	ck_assert_uint_eq(json_array_size(json_object_get(s.result, "losses")), 5);
	ck_assert_uint_eq(s.done_units, 5);
	/* five steps, one new version of each array the steps updated */
	ck_assert_uint_eq(version_of("m.w1"), 2);
	ck_assert_uint_eq(version_of("m.w2"), 2);
	ck_assert_uint_eq(version_of("m.adam.nu.w2"), 2);
	/* the inputs are read, never written */
	ck_assert_uint_eq(version_of("x"), 1);
	ck_assert(ts_model_registry_step_count(env.models, m.uid, &t));
	ck_assert_uint_eq(t, 5);
	/* losses fall on a fixed batch */
	{
		json_t *l = json_object_get(s.result, "losses");

		ck_assert(json_real_value(json_array_get(l, 4)) < json_real_value(json_array_get(l, 0)));
	}
	ts_op_snapshot_release(&s);
	/* the holds are gone with the step */
	ck_assert(!ts_catalog_held(env.catalog, "m.w1", NULL, 0));
}
END_TEST

START_TEST(test_offloaded_arrays_get_private_versions)
{
	struct ts_model m;
	struct ts_job_run run;
	struct ts_op_snapshot s;
	struct ts_array *old, *now;
	float *before, *after_old, *after_new;
	uint64_t n;

	create_model("m", TS_MEM_PINNED_HOST, 3, &m);
	datasets();
	old = ts_catalog_get(env.catalog, "m.w1");
	before = read_all(old);
	n = ts_array_desc(old)->nbytes / 4;
	run = step_of(&m, 3);
	ck_assert(run.policy.params == TS_MEM_PINNED_HOST);
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	ts_op_snapshot_release(&s);
	now = ts_catalog_get(env.catalog, "m.w1");
	ck_assert_ptr_ne(now, old);
	/* new memory: the reader of the old version keeps every byte */
	ck_assert_ptr_ne(ts_buffer_data(ts_array_single_buffer(now)),
	                 ts_buffer_data(ts_array_single_buffer(old)));
	after_old = read_all(old);
	after_new = read_all(now);
	ck_assert_mem_eq(before, after_old, n * 4);
	ck_assert(memcmp(before, after_new, n * 4) != 0);
	ck_assert_str_eq(ts_array_owner(now), "model 'm'");
	free(before);
	free(after_old);
	free(after_new);
	ts_array_unref(old);
	ts_array_unref(now);
}
END_TEST

START_TEST(test_device_arrays_update_in_place)
{
	struct ts_model m;
	struct ts_job_run run;
	struct ts_op_snapshot s;
	struct ts_array *old, *now;

	create_model("m", TS_MEM_DEVICE, 3, &m);
	datasets();
	old = ts_catalog_get(env.catalog, "m.w1");
	run = step_of(&m, 2);
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	ts_op_snapshot_release(&s);
	now = ts_catalog_get(env.catalog, "m.w1");
	/* a new version (new ETag) over the same memory */
	ck_assert_uint_eq(ts_array_version(now), ts_array_version(old) + 1);
	ck_assert_str_ne(ts_array_etag(now), ts_array_etag(old));
	ck_assert_ptr_eq(ts_buffer_data(ts_array_single_buffer(now)),
	                 ts_buffer_data(ts_array_single_buffer(old)));
	ts_array_unref(old);
	ts_array_unref(now);
}
END_TEST

/* Waits until op has done at least one unit (a step). */
static void until_started(struct ts_operation *op)
{
	for (int i = 0; i < 60000; i++) {
		struct ts_op_snapshot s;
		uint64_t done;

		ts_operation_snapshot(op, &s);
		done = s.done_units;
		ts_op_snapshot_release(&s);
		if (done > 0)
			return;
		usleep(1000);
	}
	ck_abort_msg("the step never started");
}

START_TEST(test_holds_refuse_writers_until_cancelled_between_steps)
{
	struct ts_model m;
	struct ts_job_run run, ev;
	struct ts_operation *op = NULL, *op2 = NULL;
	struct ts_op_snapshot s;
	struct ts_array *w1;
	char holder[40];
	json_int_t k;
	uint64_t t = 0;

	create_model("m", TS_MEM_PINNED_HOST, 4, &m);
	datasets();
	run = step_of(&m, 1000000);
	OK(ts_job_step_submit(&env, &run, &op, &err));
	until_started(op);
	/* every array of the model is held by the step */
	ck_assert(ts_catalog_held(env.catalog, "m.w1", holder, sizeof holder));
	ck_assert_str_eq(holder, ts_operation_id(op));
	ck_assert(ts_catalog_held(env.catalog, "m.adam.nu.w2", NULL, 0));
	/* another writer of w1 is refused, naming the step */
	w1 = ts_catalog_get(env.catalog, "m.w1");
	{
		struct ts_array *v = NULL;

		OK(ts_array_new_version(w1, &v, &err));
		ts_error_clear(&err);
		ck_assert_int_eq(ts_catalog_put(env.catalog, v, &(struct ts_precondition){0}, NULL,
		                                &err), TS_ABORTED);
		ck_assert_str_eq(err.reason, "ARRAY_HELD");
		ck_assert_ptr_nonnull(strstr(err.message, ts_operation_id(op)));
		ts_array_unref(v);
	}
	ts_array_unref(w1);
	/* so are an evaluation, a second step and a delete */
	ev = step_of(&m, 1);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_job_eval_submit(&env, &ev, &op2, &err), TS_ABORTED);
	ck_assert_ptr_null(op2);
	ck_assert_ptr_nonnull(strstr(err.message, ts_operation_id(op)));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_job_step_submit(&env, &ev, &op2, &err), TS_ABORTED);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_job_model_delete(&env, &m, &err), TS_ABORTED);
	ck_assert_str_eq(err.reason, "MODEL_BUSY");
	ck_assert(ts_model_registry_get(env.models, "m", &m));
	/* cancelled between steps: what ran is published once, and said */
	OK(ts_operation_cancel(op, &err));
	s = finish(op);
	ck_assert_int_eq(s.state, TS_OP_CANCELLED);
	ck_assert_ptr_null(s.result);
	ck_assert_ptr_nonnull(s.partial);
	k = result_int(s.partial, "steps");
	ck_assert_int_ge(k, 1);
	ck_assert_int_lt(k, 1000000);
	ck_assert_uint_eq(json_array_size(json_object_get(s.partial, "losses")), (size_t)k);
	ck_assert_int_eq(result_int(s.partial, "model_steps"), k);
	ck_assert(ts_model_registry_step_count(env.models, m.uid, &t));
	ck_assert_uint_eq(t, (uint64_t)k);
	ck_assert_uint_eq(version_of("m.w1"), 2);
	ck_assert_uint_eq(version_of("m.adam.mu.w1"), 2);
	ts_op_snapshot_release(&s);
	/* and the holds went with it */
	ck_assert(!ts_catalog_held(env.catalog, "m.w1", NULL, 0));
	OK(ts_job_model_delete(&env, &m, &err));
	ck_assert_ptr_null(ts_catalog_get(env.catalog, "m.w1"));
	ck_assert(!ts_model_registry_get(env.models, "m", &m));
}
END_TEST

START_TEST(test_a_failed_step_publishes_nothing)
{
	struct ts_model m;
	struct ts_job_run run;
	struct ts_op_snapshot s;

	create_model("m", TS_MEM_DEVICE, 5, &m);
	datasets();
	run = step_of(&m, 3);
	run.targets.array = "missing";
	s = run_step(&run);
	ck_assert_int_eq(s.state, TS_OP_FAILED);
	ck_assert_int_eq(s.error.status, TS_NOT_FOUND);
	ck_assert_ptr_null(s.partial);      /* no step ran */
	ts_op_snapshot_release(&s);
	ck_assert_uint_eq(version_of("m.w1"), 1);
	ck_assert(!ts_catalog_held(env.catalog, "m.w1", NULL, 0));
}
END_TEST

/* ---- batches and epochs ------------------------------------------------------- */

START_TEST(test_batches_wrap_into_the_next_epoch)
{
	struct ts_model m;
	struct ts_job_run run;
	struct ts_op_snapshot s;
	json_t *b;

	create_model("m", TS_MEM_DEVICE, 6, &m);
	datasets();
	run = step_of(&m, 3);
	run.batches = (struct ts_job_batches){.on = true, .size = 4, .start = 1};
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	b = json_object_get(s.result, "batches");
	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(result_int(b, "start"), 1);
	ck_assert_int_eq(result_int(b, "next"), 13);     /* 1 + 3 * 4 */
	ck_assert_int_eq(result_int(b, "epoch"), 2);     /* 13 / 6 */
	ck_assert_int_eq(result_int(b, "rows"), ROWS);
	ck_assert_str_eq(json_string_value(json_object_get(b, "order")), "sequential");
	ts_op_snapshot_release(&s);
}
END_TEST

/* The loss of a data-driven step at position p is the loss of the rows
 * p, p+1, ... (mod the rows), as an evaluation of the same weights says. */
START_TEST(test_a_batch_is_the_rows_at_its_position)
{
	struct ts_model m;
	struct ts_job_run run, ev;
	struct ts_op_snapshot s;
	json_t *rows = json_pack("[i, i, i, i]", 4, 5, 0, 1);
	double want, got;

	create_model("m", TS_MEM_DEVICE, 7, &m);
	datasets();
	ev = step_of(&m, 1);
	ev.inputs.rows = rows;
	ev.targets.rows = rows;
	s = run_eval(&ev);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	want = json_real_value(json_object_get(s.result, "loss"));
	ts_op_snapshot_release(&s);
	json_decref(rows);

	run = step_of(&m, 1);
	run.batches = (struct ts_job_batches){.on = true, .size = 4, .start = 4};
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	got = json_real_value(json_array_get(json_object_get(s.result, "losses"), 0));
	ck_assert_msg(got == want, "step's loss %.9g, evaluation's %.9g", got, want);
	ts_op_snapshot_release(&s);
}
END_TEST

/* A shuffled run's order comes from its seed: the same seed, the same
 * losses; another seed, other batches. */
START_TEST(test_shuffled_batches_follow_their_seed)
{
	struct ts_model a, b, c;
	double la[4], lb[4], lc[4];
	struct ts_model *ms[3] = {&a, &b, &c};
	double *ls[3] = {la, lb, lc};
	uint64_t seeds[3] = {11, 11, 12};

	create_model("a", TS_MEM_DEVICE, 8, &a);
	create_model("b", TS_MEM_DEVICE, 8, &b);
	create_model("c", TS_MEM_DEVICE, 8, &c);
	datasets();
	for (int i = 0; i < 3; i++) {
		struct ts_job_run run = step_of(ms[i], 4);
		struct ts_op_snapshot s;
		json_t *l;

		run.batches = (struct ts_job_batches){.on = true, .shuffle = true, .size = 2,
		                                      .seed = seeds[i]};
		s = run_step(&run);
		ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
		ck_assert_str_eq(json_string_value(json_object_get(json_object_get(s.result, "batches"),
		                                                   "order")), "shuffle");
		l = json_object_get(s.result, "losses");
		for (int k = 0; k < 4; k++)
			ls[i][k] = json_real_value(json_array_get(l, (size_t)k));
		ts_op_snapshot_release(&s);
	}
	ck_assert_mem_eq(la, lb, sizeof la);
	ck_assert(memcmp(la, lc, sizeof la) != 0);
}
END_TEST

START_TEST(test_batches_larger_than_the_dataset_are_refused)
{
	struct ts_model m;
	struct ts_job_run run;
	struct ts_op_snapshot s;

	create_model("m", TS_MEM_DEVICE, 9, &m);
	datasets();
	run = step_of(&m, 1);
	run.batches = (struct ts_job_batches){.on = true, .size = ROWS + 1};
	s = run_step(&run);
	ck_assert_int_eq(s.state, TS_OP_FAILED);
	ck_assert_str_eq(s.error.reason, "BAD_BATCHES");
	ts_op_snapshot_release(&s);
	ck_assert_uint_eq(version_of("m.w1"), 1);
}
END_TEST

/* ---- gradient accumulation ------------------------------------------------------- */

/*
 * A data-driven step of accumulate 2 draws two batches a step: its loss is
 * the mean of the evaluations' of those rows, its result says where it
 * stopped (start + steps * 2 * batch_size), the batch size asked for, the
 * accumulation, and a global norm per step.
 */
START_TEST(test_accumulate_draws_its_micro_batches)
{
	struct ts_model m;
	struct ts_job_run run, ev;
	struct ts_op_snapshot s;
	float micro[2];
	json_t *b, *norms;

	create_model("m", TS_MEM_DEVICE, 12, &m);
	datasets();
	for (int j = 0; j < 2; j++) {
		json_t *rows = json_pack("[i, i]", 1 + 2 * j, 2 + 2 * j);

		ev = step_of(&m, 1);
		ev.inputs.rows = rows;
		ev.targets.rows = rows;
		s = run_eval(&ev);
		ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
		micro[j] = (float)json_real_value(json_object_get(s.result, "loss"));
		ts_op_snapshot_release(&s);
		json_decref(rows);
	}
	run = step_of(&m, 2);
	run.batches = (struct ts_job_batches){.on = true, .size = 2, .start = 1};
	run.accumulate = 2;
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	ck_assert_int_eq(result_int(s.result, "accumulate"), 2);
	ck_assert_int_eq(json_array_size(json_object_get(s.result, "losses")), 2);
	ck_assert_msg(json_real_value(json_array_get(json_object_get(s.result, "losses"), 0)) ==
	              (double)((micro[0] + micro[1]) / 2.0f),
	              "the step's loss is not the mean of its micro-batches' (%.9g, %.9g)",
	              (double)micro[0], (double)micro[1]);
	norms = json_object_get(s.result, "grad_norms");
	ck_assert_int_eq(json_array_size(norms), 2);
	for (size_t i = 0; i < 2; i++)
		ck_assert(json_real_value(json_array_get(norms, i)) > 0);
	b = json_object_get(s.result, "batches");
	ck_assert_int_eq(result_int(b, "batch_size"), 2);
	ck_assert_int_eq(result_int(b, "next"), 9);      /* 1 + 2 steps * 2 micro-batches * 2 */
	ck_assert_int_eq(result_int(b, "epoch"), 1);
	ts_op_snapshot_release(&s);
	ck_assert_uint_eq(version_of("m.w1"), 2);
}
END_TEST

/* Inputs whose rows accumulate does not divide into micro-batches: the
 * operation fails naming accumulate, and nothing changes. */
START_TEST(test_accumulate_must_split_the_inputs)
{
	struct ts_model m;
	struct ts_job_run run;
	struct ts_op_snapshot s;

	create_model("m", TS_MEM_DEVICE, 13, &m);
	datasets();
	run = step_of(&m, 1);
	run.accumulate = 4;                /* 6 rows */
	s = run_step(&run);
	ck_assert_int_eq(s.state, TS_OP_FAILED);
	ck_assert_str_eq(s.error.reason, "BAD_ACCUMULATE");
	ck_assert_ptr_nonnull(strstr(s.error.message, "accumulate"));
	ts_op_snapshot_release(&s);
	ck_assert_uint_eq(version_of("m.w1"), 1);
	run.accumulate = 3;                /* 3 micro-batches of 2 rows */
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	ck_assert_int_eq(result_int(s.result, "accumulate"), 3);
	ts_op_snapshot_release(&s);
}
END_TEST

/* ---- windows of a token stream ---------------------------------------------------- */

#define TV 11        /* a token model's vocabulary */
#define TN 23        /* stream tokens: (23 - 1) / 4 = 5 windows of context 4 */

/* A token model with Adam (on the device), created and ready. */
static void create_token_model(const char *name, struct ts_model *out)
{
	struct ts_model m = {.mlp = {.layers = 1, .d_model = D, .d_hidden = 16,
	                             .act = TS_ACT_GELU, .loss = TS_LOSS_XENT, .vocab = TV,
	                             .proj = true},
	                     .opt = {.type = TS_OPT_ADAM, .learning_rate = 1e-2f, .b1 = 0.9f,
	                             .b2 = 0.999f, .eps = 1e-8f, .clip_global_norm = 1.0f},
	                     .policy = {.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                                .save_x = true, .save_h = true},
	                     .device = dev};
	create_spec(m, name, 3, out);
}

/* Publishes uint16 ids [rows, cols] name on sim:0's pinned_host. */
static void put_ids(const char *name, const uint16_t *v, uint64_t rows, uint64_t cols)
{
	put_array(name, TS_DT_UINT16, rows, cols, TS_MEM_PINNED_HOST, v);
}

/*
 * A windows step reads window q = start + b of the stream as docs/API.md
 * defines it (sequential: offset (q mod W) * context, wrapping at W = (n -
 * 1) / context windows): its loss is the evaluation's of the same windows
 * copied out by hand, and its result says where it stopped.
 */
START_TEST(test_windows_read_the_stream_at_their_offsets)
{
	uint16_t stream[TN], in[2][4], tg[2][4];
	struct ts_model m;
	struct ts_job_run ev, run;
	struct ts_op_snapshot s;
	json_t *w;
	double want, got;

	for (int i = 0; i < TN; i++)
		stream[i] = (uint16_t)((i * 7 + 2) % TV);
	put_ids("stream", stream, 1, TN);
	/* windows 4 and 5 of a call starting at 4: offsets 16 and 0 (5 mod 5) */
	memcpy(in[0], stream + 16, sizeof in[0]);
	memcpy(tg[0], stream + 17, sizeof tg[0]);
	memcpy(in[1], stream + 0, sizeof in[1]);
	memcpy(tg[1], stream + 1, sizeof tg[1]);
	put_ids("win", &in[0][0], 2, 4);
	put_ids("wtg", &tg[0][0], 2, 4);
	create_token_model("t", &m);
	ev = (struct ts_job_run){.model = m, .steps = 1, .inputs = {.array = "win"},
	                         .targets = {.array = "wtg"}};
	OK(ts_job_model_policy(&env, &m, &ev.policy, &err));
	s = run_eval(&ev);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	want = json_real_value(json_object_get(s.result, "loss"));
	ts_op_snapshot_release(&s);

	run = (struct ts_job_run){.model = m, .steps = 2};
	OK(ts_job_model_policy(&env, &m, &run.policy, &err));
	run.windows = (struct ts_job_windows){.on = true, .context = 4, .size = 2, .start = 4};
	snprintf(run.windows.array, sizeof run.windows.array, "stream");
	s = run_step(&run);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	got = json_real_value(json_array_get(json_object_get(s.result, "losses"), 0));
	ck_assert_msg(got == want, "windows' loss %.9g, the copies' %.9g", got, want);
	w = json_object_get(s.result, "windows");
	ck_assert_int_eq(result_int(w, "next"), 8);
	ck_assert_int_eq(result_int(w, "epoch"), 1);
	ck_assert_int_eq(result_int(w, "windows_per_epoch"), 5);
	ck_assert_uint_eq(json_array_size(json_object_get(s.result, "grad_norms")), 2);
	ck_assert_uint_eq(json_array_size(json_object_get(s.result, "learning_rates")), 2);
	ck_assert_ptr_null(s.partial);
	ts_op_snapshot_release(&s);

	/* a batch of more windows than the stream holds is refused */
	run.windows.size = 6;
	s = run_step(&run);
	ck_assert_int_eq(s.state, TS_OP_FAILED);
	ck_assert_str_eq(s.error.reason, "BAD_WINDOWS");
	ts_op_snapshot_release(&s);
}
END_TEST

/* ---- evaluation ----------------------------------------------------------------- */

START_TEST(test_evaluation_writes_nothing_of_its_model)
{
	struct ts_model m;
	struct ts_job_run ev;
	struct ts_op_snapshot s;
	struct ts_array *out;
	uint64_t t = 99;

	create_model("m", TS_MEM_DEVICE, 10, &m);
	datasets();
	ev = step_of(&m, 1);
	ev.outputs = (struct ts_job_outputs){.outputs = true, .kind = TS_MEM_PINNED_HOST};
	snprintf(ev.outputs.name, sizeof ev.outputs.name, "preds");
	s = run_eval(&ev);
	ck_assert_msg(s.state == TS_OP_SUCCEEDED, "%s", s.error.message);
	ck_assert(isfinite(json_real_value(json_object_get(s.result, "loss"))));
	ck_assert_int_eq(result_int(s.result, "batch"), ROWS);
	ts_op_snapshot_release(&s);
	out = ts_catalog_get(env.catalog, "preds");
	ck_assert_ptr_nonnull(out);
	ck_assert_int_eq(ts_array_desc(out)->rank, 2);
	ck_assert_uint_eq(ts_array_desc(out)->shape[0], ROWS);
	ck_assert_uint_eq(ts_array_desc(out)->shape[1], D);
	ck_assert(ts_array_placement(out)->sharding.memory_kind == TS_MEM_PINNED_HOST);
	ts_array_unref(out);
	ck_assert_uint_eq(version_of("m.w1"), 1);
	ck_assert_uint_eq(version_of("m.adam.mu.w1"), 1);
	ck_assert(ts_model_registry_step_count(env.models, m.uid, &t));
	ck_assert_uint_eq(t, 0);
	/* outputs over a model's array are refused before anything runs */
	snprintf(ev.outputs.name, sizeof ev.outputs.name, "m.w2");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_job_outputs_writable(&env, &ev.outputs, &err), TS_FAILED_PRECONDITION);
	ck_assert_str_eq(err.reason, "ARRAY_OWNED");
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("jobs");
	TCase *c = tcase_create("jobs");

	tcase_add_checked_fixture(c, setup, teardown);
	tcase_set_timeout(c, 120);
	tcase_add_test(c, test_create_publishes_every_array_at_once);
	tcase_add_test(c, test_create_refused_leaves_nothing);
	tcase_add_test(c, test_step_publishes_once);
	tcase_add_test(c, test_offloaded_arrays_get_private_versions);
	tcase_add_test(c, test_device_arrays_update_in_place);
	tcase_add_test(c, test_holds_refuse_writers_until_cancelled_between_steps);
	tcase_add_test(c, test_a_failed_step_publishes_nothing);
	tcase_add_test(c, test_batches_wrap_into_the_next_epoch);
	tcase_add_test(c, test_a_batch_is_the_rows_at_its_position);
	tcase_add_test(c, test_shuffled_batches_follow_their_seed);
	tcase_add_test(c, test_batches_larger_than_the_dataset_are_refused);
	tcase_add_test(c, test_accumulate_draws_its_micro_batches);
	tcase_add_test(c, test_accumulate_must_split_the_inputs);
	tcase_add_test(c, test_evaluation_writes_nothing_of_its_model);
	tcase_add_test(c, test_windows_read_the_stream_at_their_offsets);
	suite_add_tcase(s, c);
	return s;
}
