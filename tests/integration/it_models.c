/*
 * it_models.c - Check suite "models": offloaded training over HTTP against a
 * real tstaged (two simulated devices of 256 MiB, or the GPUs with
 * TS_TEST_BACKEND=cuda, every device id from the harness): creating, listing and
 * deleting models and the arrays that hold their parameters and optimizer
 * state; the memory analysis of the JAX host-offloading guide's
 * configurations (:analyze on a model and on a spec alone); steps whose
 * measured peak equals the prediction and whose losses and gradients are the
 * same bit for bit under every placement policy; Adam with clipping, SGD and
 * plain gradients against a float64 numpy reference (py/train_reference.py);
 * inputs taken as rows of a dataset; committed and uncommitted operands;
 * progress in steps and cancellation.
 *
 * Each case runs forked with its own daemon, so every space starts empty.
 * Weights come from the daemon's own seeded initialisation and are
 * downloaded before the first step, so the reference starts from exactly
 * the same float32 values.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1ull << 20)
#define CASE_TIMEOUT_S 120

/* The daemon of the checked fixture (per forked case). */
static struct th_daemon D;

static const char *const base_args[] = {"--sim-device-memory", "256MiB", NULL};

static void daemon_up(void)
{
	th_daemon_start(&D, base_args);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* The guide's 10-layer MLP (relu, loss sum, gradients only). */
#define GUIDE_MLP "{\"layers\": 10, \"d_model\": 256, \"d_hidden\": 1024, \"activation\": \"relu\"}"
#define GUIDE_B 256
#define GUIDE_D 256

/* ---- the devices under test ------------------------------------------------------------ */

/* Whether the daemon has a second device of the backend under test (a
 * one-GPU machine has not: the cases that need two say so and pass). */
static bool two_devices(void)
{
	if (th_daemon_has_device(&D, th_dev(1)))
		return true;
	fprintf(stderr, "models: no %s: a two-device case skipped\n", th_dev(1));
	return false;
}

/* The second device, or the first where there is only one. */
static const char *second_device(void)
{
	return th_daemon_has_device(&D, th_dev(1)) ? th_dev(1) : th_dev(0);
}

/* ---- requests ------------------------------------------------------------------------ */

/* Creates a model from its JSON, waiting for its creation (an operation);
 * 200 with the model (new reference). */
static json_t *create(const char *spec)
{
	return th_post_json(&D, "/v1/models?wait=true", spec, 200);
}

/* :put an array to another memory kind of its device, waiting. */
static void move_to(const char *name, const char *kind)
{
	char path[300], body[128];
	json_t *a;

	snprintf(path, sizeof path, "/v1/arrays/%s:put?wait=true", name);
	snprintf(body, sizeof body, "{\"memory_kind\": \"%s\"}", kind);
	a = th_post_json(&D, path, body, 200);
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), kind);
	json_decref(a);
}

static void delete_array(const char *name)
{
	struct th_response r;
	char path[300];

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200 || r.status == 204 || r.status == 404, "DELETE %s: %ld %s", path,
	              r.status, r.body);
	th_response_free(&r);
}

/* POST /v1/models/{m}:analyze (new reference). */
static json_t *analyze(const char *model, const char *body)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/models/%s:analyze?timeline=true", model);
	return th_post_json(&D, path, body, 200);
}

/* A space's stats from /v1/memory (new reference). */
static json_t *space(const char *dev, const char *kind)
{
	json_t *feed = th_get_object(&D, "/v1/memory"), *sp, *found = NULL;
	size_t i;

	json_array_foreach(th_arr(feed, "spaces"), i, sp)
		if (strcmp(th_str(sp, "device"), dev) == 0 && strcmp(th_str(sp, "memory_kind"), kind) == 0)
			found = json_incref(sp);
	json_decref(feed);
	ck_assert_msg(found != NULL, "no space (%s, %s) in /v1/memory", dev, kind);
	return found;
}

static json_int_t space_int(const char *dev, const char *kind, const char *key)
{
	json_t *sp = space(dev, kind);
	json_int_t v = th_int(sp, key);

	json_decref(sp);
	return v;
}

static json_int_t implicit_total(void)
{
	json_t *feed = th_get_object(&D, "/v1/memory");
	json_int_t v = th_int(th_obj(feed, "transfers"), "implicit_transfer_bytes");

	json_decref(feed);
	return v;
}

/* The i-th loss of a step result. */
static double loss_at(json_t *result, size_t i)
{
	json_t *l = json_array_get(th_arr(result, "losses"), i);

	ck_assert_msg(json_is_number(l), "losses[%zu] is not a number", i);
	return json_number_value(l);
}

/* ---- operations ---------------------------------------------------------------------- */

/* Starts a step as an operation: 202 with kind "step", target model and
 * progress in steps; returns its id (new string). */
static char *step_start(const char *model, const char *body, json_int_t steps)
{
	char path[300];
	json_t *op, *progress;
	char *id;

	snprintf(path, sizeof path, "/v1/models/%s:step", model);
	op = th_post_json(&D, path, body, 202);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "kind")), "step");
	ck_assert_str_eq(json_string_value(th_op_meta(op, "target")), model);
	progress = th_op_meta(op, "progress");
	ck_assert_int_eq(th_int(progress, "steps_total"), steps);
	ck_assert_msg(th_int(progress, "steps_done") >= 0, "steps_done < 0");
	ck_assert_msg(json_object_get(progress, "bytes_done") == NULL, "a step counts bytes: %s",
	              json_dumps(op, 0));
	id = strdup(json_string_value(th_op_meta(op, "id")));
	ck_assert_ptr_nonnull(id);
	json_decref(op);
	return id;
}

/* Polls until the operation is done; returns it (new reference) and counts
 * in *middle the snapshots with 0 < steps_done < steps_total. */
static json_t *op_poll(const char *id, int *middle)
{
	long long deadline = th_now_ms() + 90000;
	json_int_t last = 0;

	*middle = 0;
	for (;;) {
		json_t *op = th_op_get(&D, id), *progress = th_op_meta(op, "progress");
		json_int_t done = th_int(progress, "steps_done"), total = th_int(progress, "steps_total");

		ck_assert_msg(done >= last && done <= total, "steps_done went %lld -> %lld of %lld",
		              (long long)last, (long long)done, (long long)total);
		last = done;
		if (done > 0 && done < total)
			(*middle)++;
		if (th_bool(op, "done")) {
			ck_assert_msg(th_op_terminal(json_string_value(th_op_meta(op, "state"))), "done in state %s", json_string_value(th_op_meta(op, "state")));
			return op;
		}
		json_decref(op);
		ck_assert_msg(th_now_ms() < deadline, "operation %s did not finish", id);
		usleep(2000);
	}
}

/* ---- data ----------------------------------------------------------------------------- */

static void assert_rel(const char *what, double got, double want, double rel)
{
	ck_assert_msg(fabs(got - want) <= rel * fabs(want), "%s: %.9g, reference %.9g", what, got,
	              want);
}

/* ---- the reference -------------------------------------------------------------------- */

/* A small model as the reference and the daemon both see it. */
struct small {
	const char *name;
	int layers, d, h, batch;
	const char *act;
	bool residual;
	const char *loss;                /* "sum" or "mse" */
	const char *optimizer;           /* JSON object, or NULL for none */
	double scale;                    /* init scale */
	int seed;
};

static char *small_spec(const struct small *s)
{
	return th_fmt("{\"name\": \"%s\", \"mlp\": {\"layers\": %d, \"d_model\": %d, \"d_hidden\": %d, "
	              "\"activation\": \"%s\", \"residual\": %s}, \"loss\": \"%s\", "
	              "\"optimizer\": %s, \"init\": {\"seed\": %d, \"scale\": %g}}",
	              s->name, s->layers, s->d, s->h, s->act, s->residual ? "true" : "false",
	              s->loss, s->optimizer ? s->optimizer : "{\"type\": \"none\"}", s->seed,
	              s->scale);
}

/* A model's files for the reference: its initial weights, inputs and targets. */
struct ref_files {
	char dir[512];
	char w1[600], w2[600], inputs[600], targets[600], out[600];
};

/* Creates the model, downloads its initial weights, uploads inputs
 * "{name}.x" and targets "{name}.t" (uncommitted, values in [-2, 2)) and
 * writes all of them where the reference reads them. Returns the model
 * (new reference). */
static json_t *small_setup(const struct small *s, struct ref_files *f)
{
	char *spec = small_spec(s), name[160];
	size_t n = (size_t)s->batch * (size_t)s->d, nw;
	float *x = th_floats(n, (unsigned)s->seed * 3 + 1, -2.0f, 2.0f);
	float *t = th_floats(n, (unsigned)s->seed * 3 + 2, -2.0f, 2.0f);
	json_t *m = create(spec);
	float *w;

	free(spec);
	th_temp_dir(s->name, f->dir, sizeof f->dir);
	snprintf(f->w1, sizeof f->w1, "%s/w1.f32", f->dir);
	snprintf(f->w2, sizeof f->w2, "%s/w2.f32", f->dir);
	snprintf(f->inputs, sizeof f->inputs, "%s/inputs.f32", f->dir);
	snprintf(f->targets, sizeof f->targets, "%s/targets.f32", f->dir);
	snprintf(f->out, sizeof f->out, "%s/out", f->dir);
	snprintf(name, sizeof name, "%s.w1", s->name);
	w = th_download_floats(&D, name, &nw);
	ck_assert_uint_eq(nw, (size_t)s->layers * s->d * (s->h ? s->h : s->d));
	th_write_file(f->w1, w, nw * sizeof *w);
	free(w);
	if (s->h) {
		snprintf(name, sizeof name, "%s.w2", s->name);
		w = th_download_floats(&D, name, &nw);
		ck_assert_uint_eq(nw, (size_t)s->layers * s->h * s->d);
		th_write_file(f->w2, w, nw * sizeof *w);
		free(w);
	}
	th_write_file(f->inputs, x, n * sizeof *x);
	th_write_file(f->targets, t, n * sizeof *t);
	snprintf(name, sizeof name, "%s.x", s->name);
	th_put_floats(&D, name, x, (size_t)s->batch, (size_t)s->d, NULL);
	snprintf(name, sizeof name, "%s.t", s->name);
	th_put_floats(&D, name, t, (size_t)s->batch, (size_t)s->d, NULL);
	free(x);
	free(t);
	return m;
}

/* Runs train_reference.py for steps steps of model m (its JSON, as the
 * daemon holds it: the optimizer's float32 values); returns result.json
 * (new reference). */
static json_t *reference(const struct small *s, json_t *m, int steps, const struct ref_files *f)
{
	char spec_path[600], cmd[2048], result[700];
	json_t *spec, *res;
	json_error_t e;
	int st;

	spec = json_pack("{s:i, s:i, s:i, s:s, s:b, s:s, s:O, s:i, s:i, s:s, s:s, s:s, s:s, s:s}",
	                 "layers", s->layers, "d_model", s->d, "d_hidden", s->h, "activation", s->act,
	                 "residual", s->residual, "loss", s->loss, "optimizer", th_obj(m, "optimizer"),
	                 "batch", s->batch, "steps", steps, "w1", f->w1, "w2", f->w2,
	                 "inputs", f->inputs, "targets", f->targets, "out", f->out);
	ck_assert_ptr_nonnull(spec);
	snprintf(spec_path, sizeof spec_path, "%s/spec.json", f->dir);
	ck_assert_int_eq(json_dump_file(spec, spec_path, 0), 0);
	json_decref(spec);
	snprintf(cmd, sizeof cmd, "python3 '%s/train_reference.py' '%s'", th_py_dir(), spec_path);
	st = system(cmd);
	ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	              "'%s' failed (status %d): it needs python3 and numpy", cmd, st);
	snprintf(result, sizeof result, "%s/result.json", f->out);
	res = json_load_file(result, 0, &e);
	ck_assert_msg(res != NULL, "%s: %s", result, e.text);
	return res;
}

/* A float32 file the reference wrote (new buffer), *n floats. */
static float *ref_read(const struct ref_files *f, const char *file, size_t *n)
{
	char path[700];
	size_t len = 0;
	float *x;

	snprintf(path, sizeof path, "%s/%s", f->out, file);
	x = (float *)th_read_file(path, &len);
	ck_assert_msg(x != NULL, "cannot read %s", path);
	*n = len / sizeof *x;
	return x;
}

/* The array "{model}.{suffix}" against the reference's file, 1e-5 of scale. */
static void compare_array(const char *model, const char *suffix, const struct ref_files *f,
                          const char *file)
{
	char name[200], what[300];
	size_t ng, nw;
	float *got, *want;

	snprintf(name, sizeof name, "%s.%s", model, suffix);
	got = th_download_floats(&D, name, &ng);
	want = ref_read(f, file, &nw);
	snprintf(what, sizeof what, "'%s' vs reference %s", name, file);
	th_assert_close_floats(what, got, ng, want, nw, 1e-5);
	free(got);
	free(want);
}

static void compare_losses(json_t *result, json_t *ref, size_t first, const char *what)
{
	json_t *want = th_arr(ref, "losses");
	char label[200];

	for (size_t i = 0; i < json_array_size(want); i++) {
		snprintf(label, sizeof label, "%s: loss of step %zu", what, first + i + 1);
		assert_rel(label, loss_at(result, first + i), json_number_value(json_array_get(want, i)),
		           1e-5);
	}
}

/* ---- creating, listing, deleting ------------------------------------------------------ */

/* Checks "{model}.{suffix}": shape, float32, committed, single on dev/kind. */
static void check_param_array(const char *model, const char *suffix, const json_int_t shape[3],
                              const char *dev, const char *kind)
{
	char name[200];
	json_t *a, *sh, *want;

	snprintf(name, sizeof name, "%s.%s", model, suffix);
	a = th_array_meta(&D, name);
	want = json_pack("[III]", shape[0], shape[1], shape[2]);
	ck_assert_msg(json_equal(th_arr(a, "shape"), want), "%s: shape %s", name,
	              json_dumps(th_arr(a, "shape"), 0));
	ck_assert_str_eq(th_str(a, "dtype"), "float32");
	ck_assert_int_eq(th_int(a, "nbytes"), shape[0] * shape[1] * shape[2] * 4);
	ck_assert_msg(th_bool(a, "committed"), "%s is not committed", name);
	sh = th_obj(a, "sharding");
	ck_assert_str_eq(th_str(sh, "device"), dev);
	ck_assert_str_eq(th_str(sh, "memory_kind"), kind);
	json_decref(want);
	json_decref(a);
}

START_TEST(test_create_adam)
{
	json_t *m = create("{\"name\": \"net\", \"mlp\": {\"layers\": 3, \"d_model\": 8, "
	                   "\"d_hidden\": 12, \"activation\": \"gelu\", \"residual\": true}, "
	                   "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
	                   "\"learning_rate\": 0.01, \"clip_global_norm\": 1.0}, "
	                   "\"placement\": {\"params\": \"device\", \"opt_state\": \"pinned_host\", "
	                   "\"activations\": {\"save\": [\"h\"], \"offload\": [\"x\"]}, "
	                   "\"prefetch_depth\": 1}}");
	static const char *const roles[] = {"w1", "w2", "adam.mu.w1", "adam.mu.w2", "adam.nu.w1",
	                                    "adam.nu.w2"};
	json_int_t w1[3] = {3, 8, 12}, w2[3] = {3, 12, 8};
	json_t *mlp = th_obj(m, "mlp"), *opt = th_obj(m, "optimizer"), *pl = th_obj(m, "placement");
	json_t *arrays = th_obj(m, "arrays");
	char want[64];

	ck_assert_str_eq(th_str(m, "name"), "net");
	ck_assert_int_eq(th_int(mlp, "layers"), 3);
	ck_assert_int_eq(th_int(mlp, "d_model"), 8);
	ck_assert_int_eq(th_int(mlp, "d_hidden"), 12);
	ck_assert_str_eq(th_str(mlp, "activation"), "gelu");
	ck_assert(th_bool(mlp, "residual"));
	ck_assert_str_eq(th_str(m, "loss"), "mse");
	ck_assert_str_eq(th_str(m, "dtype"), "float32");
	ck_assert_str_eq(th_str(opt, "type"), "adam");
	ck_assert_msg(fabs(json_number_value(json_object_get(opt, "learning_rate")) - 0.01) < 1e-8,
	              "learning_rate");
	ck_assert_msg(fabs(json_number_value(json_object_get(opt, "b1")) - 0.9) < 1e-7, "b1 default");
	ck_assert_msg(fabs(json_number_value(json_object_get(opt, "b2")) - 0.999) < 1e-7, "b2 default");
	ck_assert_msg(fabs(json_number_value(json_object_get(opt, "eps")) - 1e-8) < 1e-14, "eps default");
	ck_assert_msg(json_number_value(json_object_get(opt, "clip_global_norm")) == 1.0, "clip");
	ck_assert_str_eq(th_str(pl, "device"), th_dev(0));
	ck_assert_str_eq(th_str(pl, "params"), "device");
	ck_assert_str_eq(th_str(pl, "opt_state"), "pinned_host");
	ck_assert_int_eq(th_int(pl, "prefetch_depth"), 1);
	{
		json_t *acts = json_pack("{s:[s], s:[s]}", "save", "h", "offload", "x");

		ck_assert_msg(json_equal(th_obj(pl, "activations"), acts), "activations %s",
		              json_dumps(th_obj(pl, "activations"), 0));
		json_decref(acts);
	}
	ck_assert_int_eq(th_int(m, "steps"), 0);
	ck_assert_uint_eq(json_object_size(arrays), 6);
	for (size_t i = 0; i < 6; i++) {
		snprintf(want, sizeof want, "net.%s", roles[i]);
		ck_assert_str_eq(th_str(arrays, roles[i]), want);
		check_param_array("net", roles[i], strstr(roles[i], "w1") ? w1 : w2, th_dev(0),
		                  i < 2 ? "device" : "pinned_host");
	}
	/* the weights are initialised (normal, scale 0.02), the state is zero */
	{
		size_t n;
		float *w = th_download_floats(&D, "net.w1", &n);
		float *mu = th_download_floats(&D, "net.adam.mu.w2", &n);
		double ss = 0;
		bool zero = true;

		for (size_t i = 0; i < 3 * 8 * 12; i++)
			ss += (double)w[i] * w[i];
		for (size_t i = 0; i < n; i++)
			zero = zero && mu[i] == 0.0f;
		ck_assert_msg(ss > 0 && sqrt(ss / (3 * 8 * 12)) < 0.1, "w1 rms %g", sqrt(ss / 288));
		ck_assert_msg(zero, "adam.mu.w2 is not zero");
		free(w);
		free(mu);
	}
	json_decref(m);
}
END_TEST

START_TEST(test_create_variants)
{
	json_int_t sq[3] = {2, 6, 6}, w1[3] = {4, 6, 10};
	json_t *m;

	/* without d_hidden: one d x d matrix per layer, no w2; defaults relu, sum, none */
	m = create("{\"name\": \"sq\", \"mlp\": {\"layers\": 2, \"d_model\": 6}}");
	ck_assert_uint_eq(json_object_size(th_obj(m, "arrays")), 1);
	ck_assert_str_eq(th_str(th_obj(m, "mlp"), "activation"), "relu");
	ck_assert_str_eq(th_str(m, "loss"), "sum");
	ck_assert_str_eq(th_str(th_obj(m, "optimizer"), "type"), "none");
	ck_assert_str_eq(th_str(th_obj(m, "placement"), "params"), "device");
	check_param_array("sq", "w1", sq, th_dev(0), "device");
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/sq.w2"), 404);
	json_decref(m);

	/* sgd keeps no state; params on pinned_host of the second device (the
	 * first on a one-GPU machine) */
	{
		const char *d1 = second_device();
		char *body = th_fmt("{\"name\": \"sgd1\", \"mlp\": {\"layers\": 4, \"d_model\": 6, "
		                  "\"d_hidden\": 10, \"activation\": \"tanh\"}, \"optimizer\": "
		                  "{\"type\": \"sgd\"}, \"placement\": {\"device\": \"%s\", "
		                  "\"params\": \"pinned_host\"}}", d1);

		m = create(body);
		free(body);
		ck_assert_uint_eq(json_object_size(th_obj(m, "arrays")), 2);
		check_param_array("sgd1", "w1", w1, d1, "pinned_host");
		ck_assert_int_eq(th_get_status(&D, "/v1/arrays/sgd1.adam.mu.w1"), 404);
		json_decref(m);
	}

	/* a constant init */
	m = create("{\"name\": \"c\", \"mlp\": {\"layers\": 1, \"d_model\": 2, \"d_hidden\": 3}, "
	           "\"init\": {\"constant\": 0.5}}");
	{
		size_t n;
		float *w = th_download_floats(&D, "c.w2", &n);

		ck_assert_uint_eq(n, 6);
		for (size_t i = 0; i < n; i++)
			ck_assert_msg(w[i] == 0.5f, "c.w2[%zu] = %g", i, (double)w[i]);
		free(w);
	}
	json_decref(m);
}
END_TEST

START_TEST(test_create_bad_specs)
{
	static const struct {
		const char *body, *reason, *field;
	} cases[] = {
		{"{\"name\": \"m\"}", "BAD_MODEL", "mlp"},
		{"{\"name\": \"m\", \"mlp\": {\"d_model\": 4}}", "BAD_MODEL", "layers"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 0, \"d_model\": 4}}", "BAD_MODEL", "mlp.layers"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": -4}}", "BAD_MODEL", "mlp.d_model"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4, \"d_hidden\": -1}}", "BAD_MODEL",
		 "mlp.d_hidden"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4, \"activation\": \"swish\"}}",
		 "BAD_MODEL", "mlp.activation"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4, \"bogus\": 1}}", "BAD_MODEL",
		 "bogus"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"colour\": \"red\"}", "BAD_MODEL",
		 "colour"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"loss\": \"l1\"}", "BAD_MODEL",
		 "loss"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"optimizer\": {\"type\": \"adamax\"}}",
		 "BAD_OPTIMIZER", "optimizer.type"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0}}", "BAD_OPTIMIZER", "learning_rate"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"adam\", \"b1\": 1.0}}", "BAD_OPTIMIZER", "b1"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"adam\", \"clip_global_norm\": -1}}", "BAD_OPTIMIZER",
		 "clip_global_norm"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"adam\", \"momentum\": 0.5}}", "BAD_OPTIMIZER", "momentum"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"adam\", \"weight_decay\": 0.1}}", "BAD_OPTIMIZER", "weight_decay"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"adamw\", \"weight_decay\": -1}}", "BAD_OPTIMIZER", "weight_decay"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"adamw\", \"learning_rate\": 0.1, \"schedule\": {\"type\": \"constant\", \"value\": 0.1}}}", "BAD_OPTIMIZER", "exclusive"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"sgd\", \"schedule\": {\"type\": \"step\"}}}", "BAD_OPTIMIZER", "optimizer.schedule.type"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"sgd\", \"schedule\": {\"type\": \"warmup_cosine_decay\", \"init_value\": 0, \"peak_value\": 0.1, \"warmup_steps\": 10, \"decay_steps\": 10}}}", "BAD_OPTIMIZER", "decay_steps"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"sgd\", \"schedule\": {\"type\": \"warmup_cosine_decay\", \"peak_value\": 0.1, \"warmup_steps\": 1, \"decay_steps\": 10}}}", "BAD_OPTIMIZER", "init_value"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"sgd\", \"schedule\": {\"type\": \"warmup_cosine_decay\", \"init_value\": 0, \"peak_value\": 0.1, \"warmup_steps\": 1, \"decay_steps\": 10, \"alpha\": 0}}}", "BAD_OPTIMIZER", "optimizer.schedule.alpha"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"type\": \"sgd\", \"schedule\": {\"type\": \"constant\", \"value\": 0.1, \"peak_value\": 1}}}", "BAD_OPTIMIZER", "optimizer.schedule.peak_value"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"steps\": -1}", "BAD_MODEL", "steps"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"placement\": {\"params\": \"gpu\"}}", "BAD_POLICY", "placement.params"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"placement\": {\"opt_state\": \"unpinned_host\"}}", NULL, "opt_state"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"placement\": {\"prefetch_depth\": 2}}", "BAD_POLICY", "prefetch_depth"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"placement\": {\"prefetch_depth\": \"one\"}}", "BAD_POLICY", "prefetch_depth"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"placement\": {\"activations\": {\"save\": [\"y\"]}}}", "BAD_POLICY",
		 "placement.activations.save"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"placement\": {\"activations\": [\"x\"]}}", "BAD_POLICY", "placement.activations"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"placement\": {\"device\": \"sim:9\"}}", "DEVICE_NOT_FOUND", "placement.device"},
		{"{\"name\": \"bad name\", \"mlp\": {\"layers\": 1, \"d_model\": 4}}", "BAD_MODEL_NAME",
		 "bad name"},
		{"{\"mlp\": {\"layers\": 1, \"d_model\": 4}}", "BAD_MODEL", "name"},
		{"[1, 2]", "BAD_REQUEST_BODY", "JSON object"},
		{"{\"name\": ", "BAD_REQUEST_BODY", "body"},
		/* float32, bfloat16 or float16: a dtype that is no compute dtype is
		 * refused, and what is no dtype at all is a bad argument
		 * (schemathesis: "" was 501) */
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"dtype\": \"int8\"}",
		 "BAD_DTYPE", "'int8'"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"dtype\": \"\"}",
		 "BAD_DTYPE", "''"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"dtype\": \"f32\"}",
		 "BAD_DTYPE", "'f32'"},
	};
	json_t *list;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		th_post_error_words(&D, "/v1/models", cases[i].body, 400, "INVALID_ARGUMENT",
		                    cases[i].reason, cases[i].field, NULL);
	/* nothing was created */
	list = th_get_object(&D, "/v1/models");
	ck_assert_uint_eq(json_array_size(th_arr(list, "models")), 0);
	json_decref(list);
	ck_assert_int_eq(space_int(th_dev(0), "device", "bytes_in_use"), 0);
}
END_TEST

/* Type errors inside the spec must name the field, as every other bad
 * field does (jansson's own "Expected integer, got string" names none). */
START_TEST(test_create_type_errors_name_the_field)
{
	static const struct {
		const char *body, *field;
	} cases[] = {
		{"{\"name\": \"m\", \"mlp\": {\"layers\": \"two\", \"d_model\": 4}}", "layers"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4.5}}", "d_model"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4, \"residual\": \"yes\"}}", "residual"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
		 "\"optimizer\": {\"learning_rate\": \"fast\"}}", "learning_rate"},
		{"{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"init\": {\"seed\": \"x\"}}", "seed"},
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		th_post_error_words(&D, "/v1/models", cases[i].body, 400, "INVALID_ARGUMENT", NULL,
		                    cases[i].field, NULL);
}
END_TEST

/* Sizes beyond int must be refused, not truncated: 4294967297 layers is
 * not one layer, nor is a d_model of 4294967300 four. */
START_TEST(test_create_sizes_not_truncated)
{
	th_post_error_words(&D, "/v1/models",
	                    "{\"name\": \"m1\", \"mlp\": {\"layers\": 4294967297, \"d_model\": 4}}",
	                    400, "INVALID_ARGUMENT", NULL, "layers", NULL);
	th_post_error_words(&D, "/v1/models",
	                    "{\"name\": \"m2\", \"mlp\": {\"layers\": 1, \"d_model\": 4294967300}}",
	                    400, "INVALID_ARGUMENT", NULL, "d_model", NULL);
}
END_TEST

/* A placement with an unknown field (a typo such as "param" for "params")
 * must be refused, naming it, as unknown fields elsewhere in the spec are,
 * not ignored. */
START_TEST(test_create_placement_unknown_field)
{
	th_post_error_words(&D, "/v1/models",
	                    "{\"name\": \"m3\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, "
	                    "\"placement\": {\"param\": \"pinned_host\"}}",
	                    400, "INVALID_ARGUMENT", NULL, "param", NULL);
	ck_assert_int_eq(th_get_status(&D, "/v1/models/m3"), 404);
}
END_TEST

/* A GPT's block intermediates by name: rendered back as given, each
 * analysis of its own (offloaded names on pinned_host), and refused with
 * the name when in both lists (itself or through "h") or given to an MLP. */
START_TEST(test_create_gpt_activation_names)
{
	static const char *const gpt = "\"gpt\": {\"vocab\": 37, \"context\": 8, \"layers\": 2, "
	                               "\"d_model\": 16, \"heads\": 4}";
	char *body = th_fmt("{\"name\": \"g\", %s, \"placement\": {\"activations\": "
	                    "{\"save\": [\"x\", \"ln1\", \"attn\"], "
	                    "\"offload\": [\"qkv\", \"mlp_act\"]}}}", gpt);
	json_t *m = create(body), *want, *all, *none, *host;

	want = json_pack("{s:[s, s, s], s:[s, s]}", "save", "x", "ln1", "attn", "offload", "qkv",
	                 "mlp_act");
	ck_assert_msg(json_equal(th_obj(th_obj(m, "placement"), "activations"), want),
	              "activations as created");
	json_decref(want);
	json_decref(m);
	free(body);
	all = th_post_json(&D, "/v1/models/g:analyze", "{\"batch\": [2, 8], \"placement\": "
	                   "{\"activations\": {\"save\": [\"x\", \"h\", \"mlp_act\"]}}}", 200);
	none = th_post_json(&D, "/v1/models/g:analyze", "{\"batch\": [2, 8], \"placement\": "
	                    "{\"activations\": {\"save\": [\"x\"]}}}", 200);
	host = th_post_json(&D, "/v1/models/g:analyze", "{\"batch\": [2, 8], \"placement\": "
	                    "{\"activations\": {\"offload\": [\"h\", \"mlp_act\"]}}}", 200);
	ck_assert_int_gt(th_int(all, "temp_size_in_bytes"), th_int(none, "temp_size_in_bytes"));
	ck_assert_int_eq(th_int(all, "host_temp_size_in_bytes"), 0);
	ck_assert_int_gt(th_int(host, "host_temp_size_in_bytes"), 0);
	ck_assert_int_gt(th_int(host, "h2d_bytes"), 0);
	json_decref(all);
	json_decref(none);
	json_decref(host);
	th_post_error_words(&D, "/v1/models/g:analyze", "{\"batch\": [2, 8], \"placement\": "
	                    "{\"activations\": {\"save\": [\"qkv\"], \"offload\": [\"qkv\"]}}}",
	                    400, "INVALID_ARGUMENT", "BAD_POLICY", "exclusive", "'qkv'", NULL);
	th_post_error_words(&D, "/v1/models/g:analyze", "{\"batch\": [2, 8], \"placement\": "
	                    "{\"activations\": {\"save\": [\"h\"], \"offload\": [\"attn\"]}}}",
	                    400, "INVALID_ARGUMENT", "BAD_POLICY", "'attn'", "through", NULL);
	th_post_error_words(&D, "/v1/models/g:analyze", "{\"batch\": [2, 8], \"placement\": "
	                    "{\"activations\": {\"save\": [\"ln3\"]}}}",
	                    400, "INVALID_ARGUMENT", "BAD_POLICY", "save[0]", "mlp_act", NULL);
	th_post_error_words(&D, "/v1/models", "{\"name\": \"m\", \"mlp\": {\"layers\": 1, "
	                    "\"d_model\": 4}, \"placement\": {\"activations\": "
	                    "{\"save\": [\"x\", \"attn_out\"]}}}",
	                    400, "INVALID_ARGUMENT", "BAD_POLICY", "'attn_out'", "GPT", NULL);
}
END_TEST

START_TEST(test_create_exclusive_names)
{
	static const char *const policies[] = {
		"{\"activations\": {\"save\": [\"x\"], \"offload\": [\"x\"]}}",
		"{\"activations\": {\"save\": [\"x\", \"h\"], \"offload\": [\"h\"]}}",
	};
	json_t *m;

	for (size_t i = 0; i < 2; i++) {
		char *body = th_fmt("{\"name\": \"m\", \"mlp\": {\"layers\": 2, \"d_model\": 4, \"d_hidden\": 8}, "
		                    "\"placement\": %s}",
		                    policies[i]);
		char *step = th_fmt("{\"inputs\": \"x\", \"placement\": %s}", policies[i]);
		char *an = th_fmt("{\"batch\": [2, 4], \"placement\": %s}", policies[i]);
		char *spec = th_fmt("{\"model\": {\"mlp\": {\"layers\": 2, \"d_model\": 4, \"d_hidden\": 8}, "
		                    "\"placement\": %s}, \"batch\": [2, 4]}",
		                    policies[i]);

		th_post_error_words(&D, "/v1/models", body, 400, "INVALID_ARGUMENT", NULL,
		                    "exclusive", NULL);
		th_post_error_words(&D, "/v1/models:analyze", spec, 400, "INVALID_ARGUMENT", NULL,
		                    "exclusive", NULL);
		if (i == 0) {
			m = create("{\"name\": \"ok\", \"mlp\": {\"layers\": 2, \"d_model\": 4, \"d_hidden\": 8}}");
			json_decref(m);
		}
		th_post_error_words(&D, "/v1/models/ok:analyze", an, 400, "INVALID_ARGUMENT", NULL,
		                    "exclusive", NULL);
		th_post_error_words(&D, "/v1/models/ok:step", step, 400, "INVALID_ARGUMENT", NULL,
		                    "exclusive", NULL);
		free(body);
		free(step);
		free(an);
		free(spec);
	}
	ck_assert_int_eq(th_get_status(&D, "/v1/models/m"), 404);
}
END_TEST

START_TEST(test_create_duplicate)
{
	static const char *spec = "{\"name\": \"dup\", \"mlp\": {\"layers\": 1, \"d_model\": 4}}";
	float one = 1.0f;
	json_t *m = create(spec), *a;

	json_decref(m);
	a = th_array_meta(&D, "dup.w1");
	th_post_error_words(&D, "/v1/models", spec, 409, "ALREADY_EXISTS", NULL, "dup", NULL);
	/* the first one's array is untouched */
	{
		json_t *again = th_array_meta(&D, "dup.w1");

		ck_assert_str_eq(th_str(a, "etag"), th_str(again, "etag"));
		json_decref(again);
	}
	json_decref(a);
	/* an array already holding one of the names: refused, nothing registered */
	th_put_floats(&D, "taken.w1", &one, 1, 1, NULL);
	th_post_error_words(&D, "/v1/models",
	                    "{\"name\": \"taken\", \"mlp\": {\"layers\": 1, \"d_model\": 4}}", 409,
	                    "ALREADY_EXISTS", NULL, "taken.w1", NULL);
	ck_assert_int_eq(th_get_status(&D, "/v1/models/taken"), 404);
	a = th_array_meta(&D, "taken.w1");
	ck_assert_int_eq(th_int(a, "nbytes"), 4);
	json_decref(a);
}
END_TEST

START_TEST(test_get_list_delete)
{
	static const char *const names[] = {"b-model", "a.model", "c_model"};
	json_t *m, *list, *got;
	json_int_t base = space_int(th_dev(0), "device", "bytes_in_use");

	for (size_t i = 0; i < 3; i++) {
		char *spec = th_fmt("{\"name\": \"%s\", \"mlp\": {\"layers\": 2, \"d_model\": 8, \"d_hidden\": 16}, "
		                    "\"optimizer\": {\"type\": \"adam\"}}",
		                    names[i]);

		m = create(spec);
		free(spec);
		if (i == 0) {
			got = th_get_object(&D, "/v1/models/b-model");
			ck_assert_msg(json_equal(got, m), "GET differs from the 201 body:\n%s\n%s",
			              json_dumps(got, 0), json_dumps(m, 0));
			json_decref(got);
		}
		json_decref(m);
	}
	/* 3 models x (w1, w2, mu, nu) x 2 x 8 x 16 floats */
	ck_assert_int_eq(space_int(th_dev(0), "device", "bytes_in_use") - base, 3 * 6 * 2 * 8 * 16 * 4);
	list = th_get_object(&D, "/v1/models");
	ck_assert_uint_eq(json_array_size(th_arr(list, "models")), 3);
	ck_assert_str_eq(th_str(json_array_get(th_arr(list, "models"), 0), "name"), "a.model");
	ck_assert_str_eq(th_str(json_array_get(th_arr(list, "models"), 1), "name"), "b-model");
	ck_assert_str_eq(th_str(json_array_get(th_arr(list, "models"), 2), "name"), "c_model");
	json_decref(list);

	/* delete: the model and every array of it go */
	json_decref(create("{\"name\": \"x\", \"mlp\": {\"layers\": 1, \"d_model\": 2}}"));
	{
		struct th_response r;

		th_request(&D, "DELETE", "/v1/models/b-model", NULL, NULL, 0, &r);
		ck_assert_msg(r.status == 200, "DELETE: %ld %s", r.status, r.body);
		th_response_free(&r);
		th_request(&D, "DELETE", "/v1/models/b-model", NULL, NULL, 0, &r);
		th_assert_error(&r, 404, "NOT_FOUND", "MODEL_NOT_FOUND");
		th_response_free(&r);
		th_get(&D, "/v1/models/nope", &r);
		th_assert_error(&r, 404, "NOT_FOUND", "MODEL_NOT_FOUND");
		th_response_free(&r);
	}
	ck_assert_int_eq(th_get_status(&D, "/v1/models/b-model"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/b-model.w1"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/b-model.w2"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/b-model.adam.mu.w1"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/b-model.adam.nu.w2"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/a.model.w1"), 200);
	ck_assert_int_eq(space_int(th_dev(0), "device", "bytes_in_use") - base,
	                 2 * 6 * 2 * 8 * 16 * 4 + 2 * 2 * 4);
	list = th_get_object(&D, "/v1/models");
	ck_assert_uint_eq(json_array_size(th_arr(list, "models")), 3);
	json_decref(list);
	/* the name can be taken again */
	m = create("{\"name\": \"b-model\", \"mlp\": {\"layers\": 1, \"d_model\": 4}}");
	ck_assert_int_eq(th_int(m, "steps"), 0);
	json_decref(m);
}
END_TEST

/* ---- analysis ------------------------------------------------------------------------ */

/* The guide's configurations: params on the device or pinned_host, the
 * activation policy, the guide's argument and temp figures (MiB; temp 0:
 * none given). */
static const struct guide_case {
	const char *label, *params, *acts;
	double argument, temp;
} guide_cases[] = {
	{"no offload", "device", "{\"save\": [\"x\", \"h\"], \"offload\": []}", 20.25, 17.25},
	{"params offloaded", "pinned_host", "{\"save\": [\"x\", \"h\"], \"offload\": []}", 0.25, 0},
	{"activation x offloaded", "device", "{\"save\": [], \"offload\": [\"x\"]}", 20.25, 6.50},
	{"both", "pinned_host", "{\"save\": [], \"offload\": [\"x\"]}", 0.25, 4.75},
};

static json_int_t J(json_t *o, const char *k)
{
	return th_int(o, k);
}

/* The figures that must hold of any analysis. */
static void check_analysis(json_t *an, const char *what)
{
	json_t *tl = th_arr(an, "timeline"), *p;
	json_int_t peak = 0;
	size_t i;

	ck_assert_msg(J(an, "peak_device_bytes") == J(an, "argument_size_in_bytes") +
	              J(an, "output_size_in_bytes") + J(an, "temp_size_in_bytes"),
	              "%s: peak != argument + output + temp: %s", what, json_dumps(an, 0));
	json_array_foreach(tl, i, p)
		if (J(p, "live_device_bytes") > peak)
			peak = J(p, "live_device_bytes");
	ck_assert_msg(peak == J(an, "peak_device_bytes"), "%s: the timeline peaks at %lld, not %lld",
	              what, (long long)peak, (long long)J(an, "peak_device_bytes"));
}

START_TEST(test_analyze_guide)
{
	json_int_t params_bytes = 10ll * 2 * 256 * 1024 * 4, temp0[4] = {0};

	for (int prefetch = 0; prefetch <= 1; prefetch++) {
		for (size_t i = 0; i < 4; i++) {
			const struct guide_case *g = &guide_cases[i];
			char *spec = th_fmt("{\"mlp\": " GUIDE_MLP ", \"loss\": \"sum\", \"placement\": "
			                    "{\"params\": \"%s\", \"activations\": %s, \"prefetch_depth\": %d}}",
			                    g->params, g->acts, prefetch);
			char *body = th_fmt("{\"model\": %s, \"batch\": [256, 256]}", spec);
			char *named = th_fmt("{\"name\": \"g%zu%d\", %s", i, prefetch, spec + 1);
			json_t *an = th_post_json(&D, "/v1/models:analyze?timeline=true", body,
			                          200),
			       *m, *an2;
			char what[96];
			bool host = strcmp(g->params, "pinned_host") == 0;

			snprintf(what, sizeof what, "%s, prefetch %d", g->label, prefetch);
			check_analysis(an, what);
			ck_assert_msg(J(an, "argument_size_in_bytes") == (json_int_t)(g->argument * MiB),
			              "%s: argument %lld", what, (long long)J(an, "argument_size_in_bytes"));
			ck_assert_msg(J(an, "output_size_in_bytes") == (json_int_t)(20 * MiB), "%s: output %lld",
			              what, (long long)J(an, "output_size_in_bytes"));
			ck_assert_int_eq(J(an, "alias_size_in_bytes"), 0);
			ck_assert_int_eq(J(an, "host_argument_size_in_bytes"), host ? params_bytes : 0);
			if (prefetch == 0 && g->temp > 0)
				ck_assert_msg(J(an, "temp_size_in_bytes") <= (json_int_t)(g->temp * MiB),
				              "%s: temp %.4f MiB > the guide's %.2f", what,
				              (double)J(an, "temp_size_in_bytes") / MiB, g->temp);
			/* bytes moved: weights in twice (forward and backward) when on
			 * the host, but prefetching the last layer's once (they stay
			 * for the backward pass); offloaded x out once and back once */
			ck_assert_int_eq(J(an, "h2d_bytes"),
			                 (host ? 2 * params_bytes - prefetch * params_bytes / 10 : 0) +
			                 J(an, "d2h_bytes"));
			ck_assert_int_eq(J(an, "d2h_bytes"), strstr(g->acts, "\"offload\": [\"x\"]") ? 9 * 256 * 1024 : 0);
			/* prefetching the next layer's weights costs one layer's w1 and w2 */
			if (prefetch == 0)
				temp0[i] = J(an, "temp_size_in_bytes");
			else
				ck_assert_int_eq(J(an, "temp_size_in_bytes") - temp0[i],
				                 host ? 2 * 256 * 1024 * 4 : 0);
			/* the same on a created model, whose arrays are where the spec says */
			m = create(named);
			an2 = analyze(th_str(m, "name"), "{\"batch\": [256, 256]}");
			ck_assert_msg(json_equal(an, an2), "%s: :analyze of the model differs:\n%s\n%s", what,
			              json_dumps(an, 0), json_dumps(an2, 0));
			json_decref(an2);
			json_decref(m);
			json_decref(an);
			free(spec);
			free(body);
			free(named);
		}
	}
}
END_TEST

START_TEST(test_analyze_adam_7168)
{
	static const char *fmt_spec = "{\"model\": {\"mlp\": {\"layers\": 4, \"d_model\": 7168, "
	                              "\"activation\": \"relu\"}, \"optimizer\": {\"type\": \"adam\", "
	                              "\"learning_rate\": 1e-3}, \"placement\": {\"params\": \"device\", "
	                              "\"opt_state\": \"%s\"}}, \"batch\": [128, 7168]}";
	json_int_t weights = 4ll * 7168 * 7168 * 4;
	json_t *on, *off, *before = space(th_dev(0), "device"), *after, *list;
	char body[512];

	snprintf(body, sizeof body, fmt_spec, "device");
	on = th_post_json(&D, "/v1/models:analyze?timeline=true", body, 200);
	snprintf(body, sizeof body, fmt_spec, "pinned_host");
	off = th_post_json(&D, "/v1/models:analyze?timeline=true", body, 200);
	check_analysis(on, "7168 adam on device");
	check_analysis(off, "7168 adam, state on host");
	ck_assert_msg(J(on, "peak_device_bytes") <= 4590000000ll, "peak %lld > 4.59e9",
	              (long long)J(on, "peak_device_bytes"));
	ck_assert_msg(J(off, "peak_device_bytes") <= 2870000000ll, "peak %lld > 2.87e9",
	              (long long)J(off, "peak_device_bytes"));
	/* params and the two moments are updated in place: aliases */
	ck_assert_int_eq(J(on, "alias_size_in_bytes"), 3 * weights);
	ck_assert_int_eq(J(off, "alias_size_in_bytes"), weights);
	ck_assert_int_eq(J(off, "host_argument_size_in_bytes"), 2 * weights);
	/* atomic steps: the offloaded state is updated into new versions; the
	 * device weights, which state copies follow, are journaled on the host */
	ck_assert_int_eq(J(off, "host_version_size_in_bytes"), 2 * weights);
	ck_assert_int_eq(J(off, "host_journal_size_in_bytes"), weights);
	ck_assert_int_eq(J(on, "host_version_size_in_bytes"), 0);
	ck_assert_int_eq(J(on, "host_journal_size_in_bytes"), 0);
	ck_assert_int_eq(J(on, "output_size_in_bytes"), 0);
	ck_assert_int_eq(J(on, "peak_device_bytes") - J(off, "peak_device_bytes"),
	                 2 * weights - (J(off, "temp_size_in_bytes") - J(on, "temp_size_in_bytes")));
	/* analysed, not created: nothing was allocated or registered */
	after = space(th_dev(0), "device");
	ck_assert_int_eq(th_int(after, "bytes_in_use"), th_int(before, "bytes_in_use"));
	ck_assert_int_eq(th_int(after, "num_allocs"), th_int(before, "num_allocs"));
	list = th_get_object(&D, "/v1/models");
	ck_assert_uint_eq(json_array_size(th_arr(list, "models")), 0);
	json_decref(list);
	json_decref(before);
	json_decref(after);
	json_decref(on);
	json_decref(off);
}
END_TEST

START_TEST(test_analyze_errors)
{
	json_t *m = create("{\"name\": \"a\", \"mlp\": {\"layers\": 2, \"d_model\": 4, \"d_hidden\": 8}}");

	json_decref(m);
	th_post_error_words(&D, "/v1/models/a:analyze", "{\"batch\": [2, 5]}", 400,
	                    "INVALID_ARGUMENT", "BAD_BATCH", "d_model", NULL);
	th_post_error_words(&D, "/v1/models/a:analyze", "{\"batch\": [0, 4]}", 400,
	                    "INVALID_ARGUMENT", "BAD_BATCH", NULL);
	th_post_error_words(&D, "/v1/models/a:analyze", "{\"batch\": 4}", 400, "INVALID_ARGUMENT",
	                    "BAD_REQUEST_BODY", NULL);
	th_post_error_words(&D, "/v1/models/a:analyze", "{\"batch\": [2, 4], \"steps\": 3}", 400,
	                    "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "steps", NULL);
	th_post_error_words(&D, "/v1/models/nope:analyze", "{\"batch\": [2, 4]}", 404, "NOT_FOUND",
	                    "MODEL_NOT_FOUND", "nope", NULL);
	th_post_error_words(&D, "/v1/models:analyze", "{\"batch\": [2, 4]}", 400,
	                    "INVALID_ARGUMENT", "BAD_REQUEST_BODY", NULL);
	th_post_error_words(&D, "/v1/models:analyze",
	                    "{\"model\": {\"mlp\": {\"layers\": 1, \"d_model\": 4}}, "
	                    "\"batch\": [2, 3]}",
	                    400, "INVALID_ARGUMENT", "BAD_BATCH", NULL);
	th_post_error_words(&D, "/v1/models:analyze",
	                    "{\"model\": {\"mlp\": {\"layers\": 1}}, \"batch\": [2, 3]}", 400,
	                    "INVALID_ARGUMENT", "BAD_MODEL", "d_model", NULL);
}
END_TEST

/* ---- steps: the guide's configurations ----------------------------------------------- */

/* The guide's model (gradients only, loss sum) with weights large enough
 * that the loss is far from zero, and its batch "x" (uncommitted). */
static void guide_setup(const char *name, const char *placement)
{
	char *spec = th_fmt("{\"name\": \"%s\", \"mlp\": " GUIDE_MLP ", \"loss\": \"sum\", "
	                    "\"init\": {\"seed\": 11, \"scale\": 0.05}%s%s}", name,
	                    placement ? ", \"placement\": " : "", placement ? placement : "");
	float *x = th_floats(GUIDE_B * GUIDE_D, 5, -1.0f, 1.0f);

	json_decref(create(spec));
	if (th_get_status(&D, "/v1/arrays/x") == 404)
		th_put_floats(&D, "x", x, GUIDE_B, GUIDE_D, NULL);
	free(x);
	free(spec);
}

/* A step's result must report measured == predicted, agree with :analyze
 * under the same placement, and have moved what the plan says. */
static void check_step_result(json_t *res, json_t *an, const char *what)
{
	json_t *a = th_obj(res, "analysis"), *t = json_deep_copy(an);

	ck_assert_msg(J(res, "measured_peak_device_bytes") == J(res, "predicted_peak_device_bytes"),
	              "%s: measured %lld, predicted %lld", what,
	              (long long)J(res, "measured_peak_device_bytes"),
	              (long long)J(res, "predicted_peak_device_bytes"));
	ck_assert_int_eq(J(res, "measured_temp_size_in_bytes"), J(res, "predicted_temp_size_in_bytes"));
	ck_assert_int_eq(J(res, "predicted_peak_device_bytes"), J(an, "peak_device_bytes"));
	json_object_del(t, "timeline");
	ck_assert_msg(json_equal(a, t), "%s: the step's analysis differs from :analyze:\n%s\n%s", what,
	              json_dumps(a, 0), json_dumps(t, 0));
	json_decref(t);
	/* the steps' copies, and staging the batch once when it is in host memory */
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "h2d"),
	                 J(res, "steps") * J(an, "h2d_bytes") + J(th_obj(res, "bytes_moved"), "staged_h2d"));
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "d2h"), J(res, "steps") * J(an, "d2h_bytes"));
	ck_assert_str_eq(th_str(res, "device"), th_dev(0));
	ck_assert_msg(json_number_value(json_object_get(th_obj(res, "time"), "wall_s")) > 0, "wall_s");
}

/* GET /v1/trace on a client of its own while the test's thread steps. */
struct trace_grab {
	struct th_client c;
	struct th_response r;
	bool ok;
};

static void *trace_thread(void *p)
{
	struct trace_grab *g = p;

	g->ok = th_client_request(&g->c, "GET", "/v1/trace?seconds=5", NULL, NULL, 0, &g->r);
	return NULL;
}

/* A trace's compute and copy spans summed by (category, name), the largest
 * totals printed per step: where a step's time went, in the summary of a
 * GPU run ("large:   gemm ..."). */
static void print_trace_totals(const struct th_response *r, int steps)
{
	struct {
		char name[48];
		double us;
		long n;
		double bytes;
	} tot[32];
	int nt = 0;
	json_t *doc = json_loadb(r->body, r->body_len, 0, NULL), *ev;
	size_t i;

	if (!doc) {
		fprintf(stderr, "large:   (the trace did not parse)\n");
		return;
	}
	json_array_foreach(json_object_get(doc, "traceEvents"), i, ev) {
		const char *ph = json_string_value(json_object_get(ev, "ph"));
		const char *cat = json_string_value(json_object_get(ev, "cat"));
		const char *name = json_string_value(json_object_get(ev, "name"));
		char key[48];
		int k;

		if (!ph || strcmp(ph, "X") != 0 || !cat || !name ||
		    (strcmp(cat, "compute") != 0 && strcmp(cat, "copy") != 0))
			continue;
		snprintf(key, sizeof key, "%s %s", cat, name);
		for (k = 0; k < nt && strcmp(tot[k].name, key) != 0; k++)
			;
		if (k == nt) {
			if (nt == 32)
				continue;
			snprintf(tot[nt].name, sizeof tot[nt].name, "%s", key);
			tot[nt].us = tot[nt].bytes = 0;
			tot[nt].n = 0;
			nt++;
		}
		tot[k].us += json_number_value(json_object_get(ev, "dur"));
		tot[k].bytes += json_number_value(json_object_get(json_object_get(ev, "args"),
		                                                   "bytes"));
		tot[k].n++;
	}
	for (int shown = 0; shown < 10; shown++) {
		int best = -1;

		for (int k = 0; k < nt; k++)
			if (tot[k].n && (best < 0 || tot[k].us > tot[best].us))
				best = k;
		if (best < 0)
			break;
		fprintf(stderr, "large:   %-22s %6.1f calls %9.3f ms a step%s", tot[best].name,
		        (double)tot[best].n / steps, tot[best].us / 1e3 / steps,
		        tot[best].bytes > 0 ? "" : "\n");
		if (tot[best].bytes > 0)
			fprintf(stderr, " (%.1f MB)\n", tot[best].bytes / 1e6 / steps);
		tot[best].n = 0;
	}
	json_decref(doc);
}

/* The issue's large model, timed: 4 layers of D x D with Adam (D from
 * TS_TEST_LARGE_D: 7168 on a GPU; unset, the case does nothing), batch
 * 128, once on the device and once with params and optimizer state on
 * pinned_host (prefetch 1): the measured peak equals the prediction, and
 * each step's time is printed ("large: ..." on stderr). */
START_TEST(test_step_adam_large_timed)
{
	const char *ds = getenv("TS_TEST_LARGE_D");
	long d = ds ? atol(ds) : 0;
	static const char *const where[2] = {
		"{\"params\": \"device\", \"opt_state\": \"device\"}",
		"{\"params\": \"pinned_host\", \"opt_state\": \"pinned_host\", \"prefetch_depth\": 1}"};
	double per[2];
	float *x;

	if (d <= 0)
		return;
	x = th_floats((size_t)128 * d, 90, -1.0f, 1.0f);
	th_put_floats(&D, "bx", x, 128, (size_t)d, NULL);
	for (int w = 0; w < 2; w++) {
		char *spec = th_fmt("{\"name\": \"big%d\", \"mlp\": {\"layers\": 4, \"d_model\": %ld, "
		                    "\"activation\": \"relu\"}, \"loss\": \"sum\", \"optimizer\": "
		                    "{\"type\": \"adam\", \"learning_rate\": 1e-4}, \"placement\": %s}",
		                    w, d, where[w]);
		char name[16], *an_body = th_fmt("{\"batch\": [128, %ld]}", d);
		struct trace_grab grab;
		pthread_t tracer;
		json_t *an, *res;

		snprintf(name, sizeof name, "big%d", w);
		json_decref(create(spec));
		an = analyze(name, an_body);
		json_decref(th_model_step(&D, name,
		                          "{\"inputs\": \"bx\", \"steps\": 1}")); /* warm-up */
		/* the timed steps inside a trace: its spans summed below */
		th_client_open(&grab.c, &D);
		memset(&grab.r, 0, sizeof grab.r);
		ck_assert_int_eq(pthread_create(&tracer, NULL, trace_thread, &grab), 0);
		usleep(300 * 1000);
		res = th_model_step(&D, name, "{\"inputs\": \"bx\", \"steps\": 3}");
		pthread_join(tracer, NULL);
		th_client_close(&grab.c);
		ck_assert_msg(J(res, "measured_peak_device_bytes") == J(res, "predicted_peak_device_bytes"),
		              "%s: measured %lld, predicted %lld", name,
		              (long long)J(res, "measured_peak_device_bytes"),
		              (long long)J(res, "predicted_peak_device_bytes"));
		ck_assert_int_eq(J(res, "predicted_peak_device_bytes"), J(an, "peak_device_bytes"));
		for (int i = 0; i < 3; i++)
			ck_assert_msg(isfinite(loss_at(res, i)), "%s: loss %d not finite", name, i);
		per[w] = json_number_value(json_object_get(th_obj(res, "time"), "per_step_s"));
		fprintf(stderr, "large: 4x%ld adam on %s, %s: %.2f ms per step, compute %.2f ms, "
		        "peak %lld bytes (predicted %lld)\n", d, th_str(res, "device"),
		        w ? "params and state on pinned_host, prefetch 1" : "all on the device",
		        per[w] * 1e3,
		        json_number_value(json_object_get(th_obj(res, "time"), "compute_s")) * 1e3 / 3,
		        (long long)J(res, "measured_peak_device_bytes"),
		        (long long)J(res, "predicted_peak_device_bytes"));
		if (grab.ok && grab.r.status == 200)
			print_trace_totals(&grab.r, 3);
		else
			fprintf(stderr, "large:   no trace (%s, %ld)\n", grab.c.error, grab.r.status);
		th_response_free(&grab.r);
		json_decref(an);
		json_decref(res);
		free(spec);
		free(an_body);
		{
			struct th_response r;
			char path[64];

			/* its params and state go: the next placement has the room */
			snprintf(path, sizeof path, "/v1/models/%s", name);
			th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
			ck_assert_msg(r.status == 200, "DELETE %s: %ld %s", path, r.status, r.body);
			th_response_free(&r);
		}
	}
	fprintf(stderr, "large: 4x%ld adam offloaded / on device: %.3f\n", d, per[1] / per[0]);
	free(x);
}
END_TEST

/* Activation policies beyond the guide's: every residual saved, offloaded
 * or recomputed. */
static const char *const act_policies[] = {
	"{\"save\": [\"x\", \"h\"], \"offload\": []}",
	"{\"save\": [], \"offload\": [\"x\"]}",
	"{\"save\": [], \"offload\": [\"x\", \"h\"]}",
	"{\"save\": [\"x\"], \"offload\": [\"h\"]}",
	"{\"save\": [\"h\"], \"offload\": [\"x\"]}",
	"{\"save\": [\"x\"], \"offload\": []}",
	"{\"save\": [], \"offload\": []}",
};

START_TEST(test_step_guide_policies)
{
	float *ref_g1 = NULL, *ref_g2 = NULL;
	size_t n1 = 0, n2 = 0;
	double ref_loss = 0;
	int runs = 0;

	guide_setup("g", NULL);
	for (int host = 0; host <= 1; host++) {
		if (host) {
			move_to("g.w1", "pinned_host");
			move_to("g.w2", "pinned_host");
		}
		for (int prefetch = 0; prefetch <= 1; prefetch++) {
			for (size_t k = 0; k < sizeof act_policies / sizeof act_policies[0]; k++) {
				char *pl = th_fmt("{\"activations\": %s, \"prefetch_depth\": %d}",
				                  act_policies[k], prefetch);
				char *sbody = th_fmt("{\"inputs\": \"x\", \"steps\": 1, \"placement\": %s}",
				                     pl);
				char *abody = th_fmt("{\"batch\": [256, 256], \"placement\": %s}", pl);
				char what[256];
				json_t *an = analyze("g", abody),
				       *res = th_model_step(&D, "g", sbody);
				float *g1, *g2;
				size_t m1, m2;

				snprintf(what, sizeof what, "params %s, prefetch %d, activations %s",
				         host ? "pinned_host" : "device", prefetch, act_policies[k]);
				ck_assert_int_eq(J(an, "host_argument_size_in_bytes"), host ? 20 * MiB : 0);
				check_step_result(res, an, what);
				g1 = th_download_floats(&D, "g.grad.w1", &m1);
				g2 = th_download_floats(&D, "g.grad.w2", &m2);
				if (!runs++) {
					ref_loss = loss_at(res, 0);
					ck_assert_msg(isfinite(ref_loss) && fabs(ref_loss) > 1e-3, "loss %g", ref_loss);
					ref_g1 = g1;
					ref_g2 = g2;
					n1 = m1;
					n2 = m2;
				} else {
					ck_assert_msg(memcmp(&(double){loss_at(res, 0)}, &ref_loss, sizeof ref_loss) == 0,
					              "%s: loss %.17g, first run %.17g", what, loss_at(res, 0), ref_loss);
					th_assert_same_floats(what, g1, m1, ref_g1, n1);
					th_assert_same_floats(what, g2, m2, ref_g2, n2);
					free(g1);
					free(g2);
				}
				json_decref(an);
				json_decref(res);
				free(pl);
				free(sbody);
				free(abody);
			}
		}
	}
	/* nothing is left behind: params (host), the batch and the gradients */
	ck_assert_int_eq(space_int(th_dev(0), "device", "bytes_in_use"),
	                 (json_int_t)(GUIDE_B * GUIDE_D * 4 + 20 * MiB));
	ck_assert_int_eq(space_int(th_dev(0), "pinned_host", "bytes_in_use"), (json_int_t)(20 * MiB));
	free(ref_g1);
	free(ref_g2);
}
END_TEST

/* The guide's four models, created with their policy (as
 * examples/offload_guide.py does): measured == predicted, same losses. */
START_TEST(test_step_guide_models)
{
	double first = 0;

	for (size_t i = 0; i < 4; i++) {
		const struct guide_case *g = &guide_cases[i];
		char name[16], *pl = th_fmt("{\"params\": \"%s\", \"activations\": %s}", g->params,
		                            g->acts);
		json_t *an, *res;

		snprintf(name, sizeof name, "guide%zu", i);
		guide_setup(name, pl);
		an = analyze(name, "{\"batch\": [256, 256]}");
		res = th_model_step(&D, name, "{\"inputs\": \"x\", \"steps\": 2}");
		check_step_result(res, an, g->label);
		ck_assert_uint_eq(json_array_size(th_arr(res, "losses")), 2);
		/* gradients only: the weights do not change, nor the loss */
		ck_assert_msg(loss_at(res, 0) == loss_at(res, 1), "%s: %.17g then %.17g", g->label,
		              loss_at(res, 0), loss_at(res, 1));
		if (i == 0)
			first = loss_at(res, 0);
		ck_assert_msg(loss_at(res, 0) == first, "%s: loss %.17g, first model %.17g", g->label,
		              loss_at(res, 0), first);
		json_decref(an);
		json_decref(res);
		free(pl);
	}
}
END_TEST

/*
 * The peak that the device space itself records while a step runs must be
 * the predicted one: with only the model's arrays and the batch on the
 * device, after :resetPeak, peak_bytes_in_use must equal
 * predicted_peak_device_bytes (the reported measured peak is computed from
 * a baseline taken inside the step, after whatever the handler allocated).
 */
START_TEST(test_step_peak_seen_by_the_space)
{
	guide_setup("g", "{\"params\": \"pinned_host\", \"activations\": {\"offload\": [\"x\"]}}");
	for (int run = 0; run < 2; run++) {
		json_t *res, *sp;

		delete_array("g.grad.w1");
		delete_array("g.grad.w2");
		json_decref(th_post_json(&D, "/v1/memory:resetPeak", "{}", 200));
		res = th_model_step(&D, "g", "{\"inputs\": \"x\"}");
		sp = space(th_dev(0), "device");
		ck_assert_msg(th_int(sp, "peak_bytes_in_use") == J(res, "predicted_peak_device_bytes"),
		              "run %d: the device space peaked at %lld bytes; predicted %lld, reported "
		              "measured %lld", run, (long long)th_int(sp, "peak_bytes_in_use"),
		              (long long)J(res, "predicted_peak_device_bytes"),
		              (long long)J(res, "measured_peak_device_bytes"));
		json_decref(sp);
		json_decref(res);
	}
}
END_TEST

/* A step's placement override must be honoured or refused: :analyze with
 * {"params": "pinned_host"} reports the offloaded plan, so :step with the
 * same placement may not silently run another. */
START_TEST(test_step_params_override_not_ignored)
{
	static const char *pl = "{\"params\": \"pinned_host\"}";
	char body[256];
	struct th_response r;
	json_t *an;

	guide_setup("g", NULL);
	snprintf(body, sizeof body, "{\"batch\": [256, 256], \"placement\": %s}", pl);
	an = analyze("g", body);
	snprintf(body, sizeof body, "{\"inputs\": \"x\", \"placement\": %s}", pl);
	th_post(&D, "/v1/models/g:step?wait=true", body, &r);
	if (r.status == 200) {
		json_t *a = th_obj(th_json(&r), "analysis");

		ck_assert_msg(J(a, "argument_size_in_bytes") == J(an, "argument_size_in_bytes") &&
		              J(a, "host_argument_size_in_bytes") == J(an, "host_argument_size_in_bytes"),
		              "placement.params ignored: :analyze reports argument %lld (host %lld), the step "
		              "ran with %lld (host %lld)", (long long)J(an, "argument_size_in_bytes"),
		              (long long)J(an, "host_argument_size_in_bytes"),
		              (long long)J(a, "argument_size_in_bytes"),
		              (long long)J(a, "host_argument_size_in_bytes"));
	} else {
		th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	}
	th_response_free(&r);
	json_decref(an);
}
END_TEST

/* Params split between memory kinds ("{m}.w1" moved to pinned_host, "{m}.w2"
 * left on the device): the step must run with each where it is, or be
 * refused with a message that names both arrays; and :analyze may not
 * report a plan the step would not run. */
START_TEST(test_step_params_split)
{
	float *x = th_floats(8 * 16, 80, -1.0f, 1.0f);
	struct th_response r;
	json_t *an;

	json_decref(create("{\"name\": \"sp\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}}"));
	th_put_floats(&D, "spx", x, 8, 16, NULL);
	move_to("sp.w1", "pinned_host");
	th_post(&D, "/v1/models/sp:step?wait=true", "{\"inputs\": \"spx\"}", &r);
	if (r.status == 200) {
		json_t *a = th_obj(th_json(&r), "analysis");

		/* w1 on the host, w2 and the batch on the device */
		ck_assert_int_eq(J(a, "host_argument_size_in_bytes"), 2 * 16 * 8 * 4);
		ck_assert_int_eq(J(a, "argument_size_in_bytes"), 2 * 8 * 16 * 4 + 8 * 16 * 4);
	} else {
		const char *msg;

		ck_assert_msg(r.status == 400, "step: %ld %s", r.status, r.body);
		msg = th_str(th_obj(th_json(&r), "error"), "message");
		ck_assert_msg(strstr(msg, "sp.w1") && strstr(msg, "sp.w2"),
		              "the refusal does not name the split arrays: %s", msg);
	}
	th_response_free(&r);
	/* :analyze answers the same way as the step: no plan for a split model */
	th_post(&D, "/v1/models/sp:analyze", "{\"batch\": [8, 16]}", &r);
	ck_assert_msg(r.status == 400, ":analyze of a split model: %ld %s", r.status, r.body);
	ck_assert_msg(strstr(r.body, "sp.w1") && strstr(r.body, "sp.w2"),
	              ":analyze does not name the split arrays: %s", r.body);
	th_response_free(&r);
	(void)an;
	free(x);
}
END_TEST

/* ---- steps against the reference ------------------------------------------------------ */

START_TEST(test_step_adam_clipped)
{
	static const struct small s = {"adam", 3, 16, 24, 8, "gelu", true, "mse",
	                               "{\"type\": \"adam\", \"learning_rate\": 0.01, "
	                               "\"clip_global_norm\": 1.0}", 0.3, 7};
	struct ref_files f;
	json_t *m = small_setup(&s, &f), *res, *ref, *got;

	res = th_model_step(&D, "adam",
	                    "{\"inputs\": \"adam.x\", \"targets\": \"adam.t\", \"steps\": 4}");
	ref = reference(&s, m, 4, &f);
	/* the norm is above the clip in every step here: clipping is exercised */
	ck_assert_msg(json_is_true(json_array_get(th_arr(ref, "clipped"), 0)),
	              "the reference did not clip: norms %s", json_dumps(th_arr(ref, "grad_norms"), 0));
	ck_assert_uint_eq(json_array_size(th_arr(res, "losses")), 4);
	compare_losses(res, ref, 0, "adam");
	ck_assert_msg(loss_at(res, 3) < loss_at(res, 0), "the loss did not go down");
	compare_array("adam", "w1", &f, "w1.f32");
	compare_array("adam", "w2", &f, "w2.f32");
	compare_array("adam", "adam.mu.w1", &f, "mu_w1.f32");
	compare_array("adam", "adam.mu.w2", &f, "mu_w2.f32");
	compare_array("adam", "adam.nu.w1", &f, "nu_w1.f32");
	compare_array("adam", "adam.nu.w2", &f, "nu_w2.f32");
	/* Adam's t is the model's: 4 steps taken */
	got = th_get_object(&D, "/v1/models/adam");
	ck_assert_int_eq(th_int(got, "steps"), 4);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/adam.grad.w1"), 404);
	json_decref(got);
	json_decref(ref);
	json_decref(res);
	json_decref(m);
}
END_TEST

/* Two calls of 2 steps continue the bias correction where the first left
 * it: the same params bit for bit as one call of 4; and the same with
 * params and optimizer state on pinned_host. */
START_TEST(test_step_adam_split_and_offloaded)
{
	static const char *opt = "{\"type\": \"adam\", \"learning_rate\": 0.01, \"clip_global_norm\": 1.0}";
	static const char *const roles[] = {"w1", "w2", "adam.mu.w1", "adam.mu.w2", "adam.nu.w1",
	                                    "adam.nu.w2"};
	float *x = th_floats(8 * 16, 22, -2.0f, 2.0f), *t = th_floats(8 * 16, 23, -2.0f, 2.0f);
	json_t *res[3];
	double all[3][4];

	for (int i = 0; i < 3; i++) {
		char *spec = th_fmt("{\"name\": \"m%d\", \"mlp\": {\"layers\": 3, \"d_model\": 16, \"d_hidden\": 24, "
		                    "\"activation\": \"gelu\", \"residual\": true}, \"loss\": \"mse\", "
		                    "\"optimizer\": %s, \"init\": {\"seed\": 7, \"scale\": 0.3}%s}",
		                    i, opt,
		                    i == 2 ? ", \"placement\": {\"params\": \"pinned_host\", \"opt_state\": "
		                             "\"pinned_host\", \"prefetch_depth\": 1}"
		                           : "");

		json_decref(create(spec));
		free(spec);
	}
	th_put_floats(&D, "x", x, 8, 16, NULL);
	th_put_floats(&D, "t", t, 8, 16, NULL);
	res[0] = th_model_step(&D, "m0", "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 4}");
	res[1] = th_model_step(&D, "m1", "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 2}");
	res[2] = th_model_step(&D, "m1", "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 2}");
	for (int i = 0; i < 4; i++) {
		all[0][i] = loss_at(res[0], (size_t)i);
		all[1][i] = loss_at(res[i < 2 ? 1 : 2], (size_t)(i % 2));
	}
	json_decref(res[1]);
	json_decref(res[2]);
	res[2] = th_model_step(&D, "m2", "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 4}");
	ck_assert_int_eq(J(th_obj(res[2], "analysis"), "host_argument_size_in_bytes"), 6 * 3 * 16 * 24 * 4);
	ck_assert_int_eq(J(th_obj(res[2], "analysis"), "argument_size_in_bytes"), 2 * 8 * 16 * 4);
	for (int i = 0; i < 4; i++)
		all[2][i] = loss_at(res[2], (size_t)i);
	for (int i = 0; i < 4; i++)
		ck_assert_msg(all[1][i] == all[0][i] && all[2][i] == all[0][i],
		              "step %d: losses %.17g (4 at once), %.17g (2 + 2), %.17g (offloaded)", i + 1,
		              all[0][i], all[1][i], all[2][i]);
	for (size_t r = 0; r < 6; r++) {
		char a[64], what[128];
		size_t n0, n;
		float *w0, *w;

		snprintf(a, sizeof a, "m0.%s", roles[r]);
		w0 = th_download_floats(&D, a, &n0);
		for (int i = 1; i < 3; i++) {
			snprintf(a, sizeof a, "m%d.%s", i, roles[r]);
			snprintf(what, sizeof what, "%s vs m0", a);
			w = th_download_floats(&D, a, &n);
			th_assert_same_floats(what, w, n, w0, n0);
			free(w);
		}
		free(w0);
	}
	json_decref(res[0]);
	json_decref(res[2]);
	free(x);
	free(t);
}
END_TEST

START_TEST(test_step_sgd_clipped)
{
	static const struct small s = {"sgd", 2, 12, 20, 6, "tanh", true, "mse",
	                               "{\"type\": \"sgd\", \"learning_rate\": 0.05, "
	                               "\"clip_global_norm\": 0.5}", 0.3, 3};
	struct ref_files f;
	json_t *m = small_setup(&s, &f), *res, *ref;

	res = th_model_step(&D, "sgd",
	                    "{\"inputs\": \"sgd.x\", \"targets\": \"sgd.t\", \"steps\": 3}");
	ref = reference(&s, m, 3, &f);
	ck_assert_msg(json_is_true(json_array_get(th_arr(ref, "clipped"), 0)), "no clipping: %s",
	              json_dumps(th_arr(ref, "grad_norms"), 0));
	compare_losses(res, ref, 0, "sgd");
	compare_array("sgd", "w1", &f, "w1.f32");
	compare_array("sgd", "w2", &f, "w2.f32");
	json_decref(ref);
	json_decref(res);
	json_decref(m);
}
END_TEST

START_TEST(test_step_gradients)
{
	static const struct small cases[] = {
		{"gr0", 3, 16, 24, 8, "relu", false, "sum", NULL, 0.3, 1},
		{"gr1", 3, 16, 24, 8, "gelu", true, "mse", NULL, 0.3, 2},
		{"gr2", 2, 16, 0, 8, "tanh", true, "sum", NULL, 0.3, 3},
		{"gr3", 2, 10, 12, 5, "none", false, "mse", NULL, 0.3, 4},
		{"gr4", 4, 8, 16, 4, "gelu", false, "sum", NULL, 0.5, 5},
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const struct small *s = &cases[i];
		struct ref_files f;
		json_t *m = small_setup(s, &f), *res, *ref, *g;
		char *body = th_fmt("{\"inputs\": \"%s.x\"%s%s%s}", s->name,
		                    strcmp(s->loss, "mse") == 0 ? ", \"targets\": \"" : "",
		                    strcmp(s->loss, "mse") == 0 ? s->name : "",
		                    strcmp(s->loss, "mse") == 0 ? ".t\"" : "");
		char name[64];
		json_int_t shape[3] = {s->layers, s->d, s->h ? s->h : s->d};

		snprintf(name, sizeof name, "/v1/arrays/%s.grad.w1", s->name);
		ck_assert_int_eq(th_get_status(&D, name), 404);
		res = th_model_step(&D, s->name, body);
		ref = reference(s, m, 1, &f);
		compare_losses(res, ref, 0, s->name);
		check_param_array(s->name, "grad.w1", shape, th_dev(0), "device");
		compare_array(s->name, "grad.w1", &f, "grad_w1.f32");
		if (s->h) {
			json_int_t shape2[3] = {s->layers, s->h, s->d};

			check_param_array(s->name, "grad.w2", shape2, th_dev(0), "device");
			compare_array(s->name, "grad.w2", &f, "grad_w2.f32");
		} else {
			snprintf(name, sizeof name, "/v1/arrays/%s.grad.w2", s->name);
			ck_assert_int_eq(th_get_status(&D, name), 404);
		}
		/* gradients only: the weights are untouched, no steps counted */
		compare_array(s->name, "w1", &f, "w1.f32");
		snprintf(name, sizeof name, "/v1/models/%s", s->name);
		g = th_get_object(&D, name);
		ck_assert_int_eq(th_int(g, "steps"), 0);
		json_decref(g);
		json_decref(ref);
		json_decref(res);
		json_decref(m);
		free(body);
	}
}
END_TEST

/* ---- operands ------------------------------------------------------------------------- */

START_TEST(test_step_rows)
{
	static const int rows[8] = {5, 0, 31, 7, 12, 3, 20, 8};
	float *data = th_floats(32 * 16, 40, -2.0f, 2.0f);
	float *tdata = th_floats(32 * 16, 41, -2.0f, 2.0f);
	float batch[8 * 16], tbatch[8 * 16];
	float *g_rows, *g_own;
	size_t n_rows, n_own;
	json_t *a, *b;
	json_int_t implicit0;

	json_decref(create("{\"name\": \"r\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 24, "
	                   "\"activation\": \"gelu\", \"residual\": true}, \"loss\": \"mse\", "
	                   "\"init\": {\"seed\": 2, \"scale\": 0.3}}"));
	for (int i = 0; i < 8; i++) {
		memcpy(batch + i * 16, data + rows[i] * 16, 16 * sizeof *data);
		memcpy(tbatch + i * 16, tdata + rows[i] * 16, 16 * sizeof *tdata);
	}
	th_put_floats(&D, "data", data, 32, 16, NULL);
	th_put_floats(&D, "tdata", tdata, 32, 16, NULL);
	th_put_floats(&D, "batch", batch, 8, 16, NULL);
	th_put_floats(&D, "tbatch", tbatch, 8, 16, NULL);
	implicit0 = implicit_total();
	a = th_model_step(&D, "r",
	                  "{\"inputs\": {\"array\": \"data\", \"rows\": [5, 0, 31, 7, 12, 3, 20, 8]}, "
	                  "\"targets\": {\"array\": \"tdata\", \"rows\": [5, 0, 31, 7, 12, 3, 20, 8]}}");
	g_rows = th_download_floats(&D, "r.grad.w1", &n_rows);
	b = th_model_step(&D, "r", "{\"inputs\": \"batch\", \"targets\": \"tbatch\"}");
	g_own = th_download_floats(&D, "r.grad.w1", &n_own);
	ck_assert_msg(loss_at(a, 0) == loss_at(b, 0), "rows: loss %.17g, own array %.17g",
	              loss_at(a, 0), loss_at(b, 0));
	th_assert_same_floats("r.grad.w1 (rows vs own array)", g_rows, n_rows, g_own, n_own);
	/* the plan's batch is the rows' count */
	ck_assert_int_eq(J(th_obj(a, "analysis"), "argument_size_in_bytes"),
	                 J(th_obj(b, "analysis"), "argument_size_in_bytes"));
	/* the datasets stay where they were, nothing moved implicitly */
	ck_assert_int_eq(implicit_total(), implicit0);
	json_decref(a);
	json_decref(b);
	/* rows mixed with a plain name */
	a = th_model_step(&D, "r",
	                  "{\"inputs\": {\"array\": \"data\", \"rows\": [5, 0, 31, 7, 12, 3, 20, 8]}, "
	                  "\"targets\": \"tbatch\"}");
	b = th_model_step(&D, "r", "{\"inputs\": \"batch\", \"targets\": \"tbatch\"}");
	ck_assert_msg(loss_at(a, 0) == loss_at(b, 0), "rows + name: %.17g vs %.17g", loss_at(a, 0),
	              loss_at(b, 0));
	json_decref(a);
	json_decref(b);
	/* bad rows */
	th_post_error_words(&D, "/v1/models/r:step?wait=true",
	                    "{\"inputs\": {\"array\": \"data\", \"rows\": [0, 32]}, "
	                    "\"targets\": \"tbatch\"}",
	                    400, "OUT_OF_RANGE", NULL, NULL);
	th_post_error_words(&D, "/v1/models/r:step?wait=true",
	                    "{\"inputs\": {\"array\": \"data\", \"rows\": \"all\"}, "
	                    "\"targets\": \"tbatch\"}",
	                    400, "INVALID_ARGUMENT", NULL, "rows", NULL);
	th_post_error_words(&D, "/v1/models/r:step?wait=true",
	                    "{\"inputs\": {\"array\": \"data\", \"rows\": [0, 1]}, "
	                    "\"targets\": \"tbatch\"}",
	                    400, "INVALID_ARGUMENT", "BAD_TARGETS", NULL);
	free(g_rows);
	free(g_own);
	free(data);
	free(tdata);
}
END_TEST

/* A daemon whose default device is the second one (sim:1, cuda:1):
 * uploads without a placement land there, uncommitted, while the model is
 * placed on the first. Without a second device, a plain daemon (the cases
 * skip). */
static void daemon_up_default_sim1(void)
{
	const char *args[] = {"--sim-device-memory", "256MiB", "--default-device", th_dev(1), NULL};

	th_daemon_start(&D, base_args);
	if (!th_daemon_has_device(&D, th_dev(1)))
		return;
	th_daemon_stop_ok(&D);
	th_daemon_start(&D, args);
}

START_TEST(test_step_uncommitted_inputs_follow)
{
	float *x = th_floats(8 * 16, 50, -1.0f, 1.0f);
	json_t *a, *res;
	json_int_t before;

	if (!two_devices())
		return;
	json_decref(create(th_on_backend("{\"name\": \"u\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"placement\": {\"device\": \"sim:0\"}}")));
	th_put_floats(&D, "ux", x, 8, 16, NULL);
	a = th_array_meta(&D, "ux");
	ck_assert(!th_bool(a, "committed"));
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "device"), th_dev(1));
	ck_assert_int_eq(th_int(a, "implicit_transfer_bytes"), 0);
	json_decref(a);
	before = implicit_total();
	res = th_model_step(&D, "u", "{\"inputs\": \"ux\"}");
	ck_assert_str_eq(th_str(res, "device"), th_dev(0));
	a = th_array_meta(&D, "ux");
	ck_assert_msg(th_int(a, "implicit_transfer_bytes") == 8 * 16 * 4,
	              "implicit_transfer_bytes %lld", (long long)th_int(a, "implicit_transfer_bytes"));
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "device"), th_dev(0));
	ck_assert(!th_bool(a, "committed"));
	ck_assert_int_eq(implicit_total() - before, 8 * 16 * 4);
	json_decref(a);
	json_decref(res);
	/* it is there now: a second step moves nothing */
	json_decref(th_model_step(&D, "u", "{\"inputs\": \"ux\"}"));
	ck_assert_int_eq(implicit_total() - before, 8 * 16 * 4);
	free(x);
}
END_TEST

START_TEST(test_step_committed_apart)
{
	float *x = th_floats(8 * 16, 60, -1.0f, 1.0f);
	struct th_response r;
	char *id;
	json_t *op, *err;
	int middle;

	if (!two_devices())
		return;
	json_decref(create("{\"name\": \"c\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"loss\": \"mse\"}"));
	th_put_floats(&D, "cx", x, 8, 16, th_on_backend("device=sim:1"));
	th_put_floats(&D, "ct", x, 8, 16, NULL);
	th_post_error_words(&D, "/v1/models/c:step?wait=true",
	                    "{\"inputs\": \"cx\", \"targets\": \"ct\"}", 400, "FAILED_PRECONDITION",
	                    "COMMITTED_APART", "c.w1", th_dev(0), "cx", th_dev(1), NULL);
	/* as an operation: it fails with the same error */
	id = step_start("c", "{\"inputs\": \"cx\", \"targets\": \"ct\"}", 1);
	op = op_poll(id, &middle);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "FAILED");
	err = th_obj(op, "error");
	ck_assert_msg(strstr(th_str(err, "message"), "cx") && strstr(th_str(err, "message"), th_dev(1)),
	              "error %s", json_dumps(err, 0));
	json_decref(op);
	free(id);
	/* nothing moved, nothing counted */
	op = th_array_meta(&D, "cx");
	ck_assert_str_eq(th_str(th_obj(op, "sharding"), "device"), th_dev(1));
	ck_assert_int_eq(th_int(op, "implicit_transfer_bytes"), 0);
	json_decref(op);
	ck_assert_int_eq(implicit_total(), 0);
	/* moved next to the model, it runs */
	{
		const char *put = th_on_backend("{\"device\": \"sim:0\", \"memory_kind\": \"device\"}");

		th_post(&D, "/v1/arrays/cx:put?wait=true", put, &r);
	}
	ck_assert_msg(r.status == 200, "put: %ld %s", r.status, r.body);
	th_response_free(&r);
	json_decref(th_model_step(&D, "c", "{\"inputs\": \"cx\", \"targets\": \"ct\"}"));
	free(x);
}
END_TEST

/* Committed-apart operands for the rows tests: a model on sim:0, a
 * dataset on sim:0 (uncommitted) and one committed to sim:1, targets
 * committed to sim:1, inputs on sim:0. */
static void apart_setup(void)
{
	float *x = th_floats(32 * 16, 61, -1.0f, 1.0f);

	json_decref(create("{\"name\": \"c\", \"mlp\": {\"layers\": 1, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"loss\": \"mse\"}"));
	th_put_floats(&D, "ds", x, 32, 16, NULL);
	th_put_floats(&D, "ds1", x, 32, 16, th_on_backend("device=sim:1"));
	th_put_floats(&D, "t1", x, 8, 16, th_on_backend("device=sim:1"));
	th_put_floats(&D, "in0", x, 8, 16, NULL);
	free(x);
}

/* Targets given by name are colocated whether the inputs are given by name
 * or as rows: targets committed to sim:1 beside a model on sim:0 are
 * refused in both cases. */
START_TEST(test_step_named_targets_colocated_with_row_inputs)
{
	if (!two_devices())
		return;
	apart_setup();
	/* rows of ds1 (committed to sim:1), as inputs and as targets: gathered */
	json_decref(th_model_step(&D, "c",
	                          "{\"inputs\": {\"array\": \"ds1\", \"rows\": [0, 1, 2, 3, 4, 5, 6, 7]}, "
	                          "\"targets\": {\"array\": \"ds1\", \"rows\": [1, 2, 3, 4, 5, 6, 7, 8]}}"));
	th_post_error_words(&D, "/v1/models/c:step?wait=true",
	                    "{\"inputs\": \"in0\", \"targets\": \"t1\"}", 400,
	                    "FAILED_PRECONDITION", "COMMITTED_APART", "t1", th_dev(1), NULL);
	th_post_error_words(&D, "/v1/models/c:step?wait=true",
	                    "{\"inputs\": {\"array\": \"ds\", \"rows\": "
	                    "[0, 1, 2, 3, 4, 5, 6, 7]}, \"targets\": \"t1\"}",
	                    400, "FAILED_PRECONDITION", "COMMITTED_APART", "t1", th_dev(1), NULL);
}
END_TEST

/* Rows of a committed dataset are gathered wherever it is, for targets as
 * for inputs, whether the other operand is given by name or as rows. */
START_TEST(test_step_target_rows_gathered_with_named_inputs)
{
	if (!two_devices())
		return;
	apart_setup();
	json_decref(th_model_step(&D, "c",
	                          "{\"inputs\": {\"array\": \"ds1\", \"rows\": [0, 1, 2, 3, 4, 5, 6, 7]}, "
	                          "\"targets\": {\"array\": \"ds\", \"rows\": [1, 2, 3, 4, 5, 6, 7, 8]}}"));
	json_decref(th_model_step(&D, "c",
	                          "{\"inputs\": \"in0\", \"targets\": {\"array\": \"ds1\", \"rows\": "
	                          "[1, 2, 3, 4, 5, 6, 7, 8]}}"));
}
END_TEST

/* :analyze answers its timeline only when asked (?timeline=true); a value
 * that is not a bool is 400 naming the parameter. */
START_TEST(test_analyze_timeline_only_when_asked)
{
	json_t *plain, *with;
	struct th_response r;

	json_decref(create("{\"name\": \"tl\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"loss\": \"sum\"}"));
	plain = th_post_json(&D, "/v1/models/tl:analyze", "{\"batch\": [4, 16]}", 200);
	ck_assert_ptr_null(json_object_get(plain, "timeline"));
	with = th_post_json(&D, "/v1/models/tl:analyze?timeline=true", "{\"batch\": [4, 16]}", 200);
	ck_assert_int_gt((json_int_t)json_array_size(th_arr(with, "timeline")), 0);
	json_object_del(with, "timeline");
	ck_assert(json_equal(plain, with));
	json_decref(plain);
	json_decref(with);
	plain = th_post_json(&D, "/v1/models:analyze",
	                     "{\"model\": {\"mlp\": {\"layers\": 1, \"d_model\": 4}}, \"batch\": [2, 4]}",
	                     200);
	ck_assert_ptr_null(json_object_get(plain, "timeline"));
	json_decref(plain);
	th_post(&D, "/v1/models/tl:analyze?timeline=yes", "{\"batch\": [4, 16]}", &r);
	ck_assert_msg(r.status == 400 && strstr(r.body, "timeline"), ":analyze?timeline=yes: %ld %s",
	              r.status, r.body);
	th_response_free(&r);
}
END_TEST

/* Inputs and targets on pinned_host are staged to the device once per
 * call: bytes_moved.h2d counts them (staged_h2d), named or as rows. */
START_TEST(test_step_counts_staging_from_the_host)
{
	float *x = th_floats(12 * 16, 71, -1.0f, 1.0f);
	json_t *res;
	const json_int_t batch = 8 * 16 * 4;

	char *spec = th_fmt("{\"name\": \"hs\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                    "\"loss\": \"mse\", \"placement\": {\"device\": \"%s\"}}",
	                    th_dev(0));
	char *host = th_fmt("device=%s&memory_kind=pinned_host", th_dev(0)),
	     *dev0 = th_fmt("device=%s", th_dev(0));

	json_decref(create(spec));
	th_put_floats(&D, "hx", x, 8, 16, host);
	th_put_floats(&D, "hy", x + 16, 8, 16, host);
	th_put_floats(&D, "hds", x, 12, 16, host);
	res = th_model_step(&D, "hs", "{\"inputs\": \"hx\", \"targets\": \"hy\", \"steps\": 2}");
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "staged_h2d"), 2 * batch);
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "h2d"),
	                 2 * J(th_obj(res, "analysis"), "h2d_bytes") + 2 * batch);
	json_decref(res);
	res = th_model_step(&D, "hs",
	                    "{\"inputs\": {\"array\": \"hds\", \"rows\": [0, 1, 2, 3, 4, 5, 6, 7]}, "
	                    "\"targets\": {\"array\": \"hds\", \"rows\": {\"start\": 4}}}");
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "staged_h2d"), 2 * batch);
	json_decref(res);
	/* already on the device: nothing is staged */
	th_put_floats(&D, "dx", x, 8, 16, dev0);
	th_put_floats(&D, "dy", x + 16, 8, 16, dev0);
	res = th_model_step(&D, "hs", "{\"inputs\": \"dx\", \"targets\": \"dy\"}");
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "staged_h2d"), 0);
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "h2d"), J(th_obj(res, "analysis"), "h2d_bytes"));
	json_decref(res);
	free(spec);
	free(host);
	free(dev0);
	free(x);
}
END_TEST

/* The losses of a result, appended to out[*n]. */
static void take_losses(json_t *res, double *out, size_t *n)
{
	json_t *l = th_arr(res, "losses");

	for (size_t i = 0; i < json_array_size(l); i++)
		out[(*n)++] = json_real_value(json_array_get(l, i));
}

/* Creates the Adam model name of the batches test on the first device. */
static void batch_model(const char *name)
{
	char *spec = th_fmt("{\"name\": \"%s\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                    "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.01}, "
	                    "\"placement\": {\"device\": \"%s\"}}",
	                    name, th_dev(0));

	json_decref(create(spec));
	free(spec);
}

/*
 * Data-driven runs: "batches" draws each step's batch from whole datasets
 * (12 rows, batches of 4): sequential runs wrap into the next epoch and
 * equal the same rows given step by step; a run resumed at the "next" it
 * reported continues exactly, shuffled too (each epoch its own order, the
 * same for the same seed); only the batches' rows move (staged_h2d).
 */
START_TEST(test_step_batches)
{
	static const struct {
		const char *body, *word;
	} bad_batches[] = {
		{"{\"inputs\": {\"array\": \"bx\", \"rows\": [0]}, \"targets\": \"by\", "
		 "\"batches\": {\"batch_size\": 1}}", "exclusive"},
		{"{\"inputs\": \"bx\", \"targets\": \"by\", \"batches\": {\"batch_size\": 13}}", "12"},
		{"{\"inputs\": \"bx\", \"targets\": \"by\", "
		 "\"batches\": {\"batch_size\": 4, \"order\": \"random\"}}", "order"},
		{"{\"inputs\": \"bx\", \"targets\": \"by\", \"batches\": {\"size\": 4}}", "size"},
	};
	float *x = th_floats(12 * 16, 72, -1.0f, 1.0f), *y = th_floats(12 * 16, 73, -1.0f, 1.0f);
	double a[8], b[8], c[8], d[8], e[8];
	size_t na = 0, nb = 0, nc = 0, nd = 0, ne = 0;
	char *host = th_fmt("device=%s&memory_kind=pinned_host", th_dev(0));
	json_t *res, *bt;
	char body[512];

	th_put_floats(&D, "bx", x, 12, 16, host);
	th_put_floats(&D, "by", y, 12, 16, host);
	batch_model("ba");
	batch_model("bb");
	batch_model("bc");
	/* 5 steps of 4 rows over 12: rows 0..11, then 0..7 of the next epoch */
	res = th_model_step(&D, "ba", "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 5, "
	                    "\"batches\": {\"batch_size\": 4}}");
	take_losses(res, a, &na);
	bt = th_obj(res, "batches");
	ck_assert_int_eq(J(bt, "next"), 20);
	ck_assert_int_eq(J(bt, "epoch"), 1);
	ck_assert_int_eq(J(bt, "rows"), 12);
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "staged_h2d"), 5 * 2 * 4 * 16 * 4);
	/* the next batch is staged in a second buffer per operand meanwhile:
	 * counted in the prediction and measured */
	ck_assert_int_eq(J(res, "predicted_peak_device_bytes"),
	                 J(th_obj(res, "analysis"), "peak_device_bytes") + 2 * 4 * 16 * 4);
	ck_assert_int_eq(J(res, "measured_peak_device_bytes"), J(res, "predicted_peak_device_bytes"));
	json_decref(res);
	for (int i = 0; i < 5; i++) {
		int r0 = (i * 4) % 12;

		snprintf(body, sizeof body, "{\"inputs\": {\"array\": \"bx\", \"rows\": [%d, %d, %d, %d]}, "
		         "\"targets\": {\"array\": \"by\", \"rows\": [%d, %d, %d, %d]}}",
		         r0, r0 + 1, r0 + 2, r0 + 3, r0, r0 + 1, r0 + 2, r0 + 3);
		res = th_model_step(&D, "bb", body);
		take_losses(res, b, &nb);
		json_decref(res);
	}
	ck_assert_uint_eq(na, 5);
	ck_assert_uint_eq(nb, 5);
	ck_assert_msg(memcmp(a, b, sizeof a[0] * 5) == 0, "batches differ from the same rows");
	/* resumed where it stopped */
	res = th_model_step(&D, "bc", "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 2, "
	                    "\"batches\": {\"batch_size\": 4}}");
	take_losses(res, c, &nc);
	snprintf(body, sizeof body, "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 3, "
	         "\"batches\": {\"batch_size\": 4, \"start\": %lld}}",
	         (long long)J(th_obj(res, "batches"), "next"));
	json_decref(res);
	res = th_model_step(&D, "bc", body);
	take_losses(res, c, &nc);
	json_decref(res);
	ck_assert_msg(nc == 5 && memcmp(a, c, sizeof a[0] * 5) == 0, "a resumed run differs");
	/* shuffled: the same seed, in one call or resumed, the same run */
	batch_model("bd");
	batch_model("be");
	res = th_model_step(&D, "bd",
	                    "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 6, "
	                    "\"batches\": {\"batch_size\": 4, \"order\": \"shuffle\", \"seed\": 7}}");
	take_losses(res, d, &nd);
	json_decref(res);
	res = th_model_step(&D, "be",
	                    "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 4, "
	                    "\"batches\": {\"batch_size\": 4, \"order\": \"shuffle\", \"seed\": 7}}");
	take_losses(res, e, &ne);
	json_decref(res);
	res = th_model_step(&D, "be", "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 2, "
	                    "\"batches\": {\"batch_size\": 4, \"order\": \"shuffle\", \"seed\": 7, "
	                    "\"start\": 16}}");
	take_losses(res, e, &ne);
	json_decref(res);
	ck_assert_msg(nd == 6 && ne == 6 && memcmp(d, e, sizeof d[0] * 6) == 0,
	              "a resumed shuffled run differs");
	/* shuffled is not sequential */
	ck_assert_msg(memcmp(a, d, sizeof a[0] * 3) != 0, "shuffle drew the sequential batches");
	/* refused: rows and batches together, a batch larger than the data, an
	 * unknown order, an unknown field */
	for (size_t i = 0; i < sizeof bad_batches / sizeof bad_batches[0]; i++)
		th_post_error_words(&D, "/v1/models/ba:step?wait=true", bad_batches[i].body, 400,
		                    "INVALID_ARGUMENT", "BAD_BATCHES", bad_batches[i].word, NULL);
	free(host);
	free(x);
	free(y);
}
END_TEST

/* The losses of a :step result or partial result r appended to out (as
 * doubles: each is the float32 loss exactly). */
static void take_all(json_t *r, double **out, size_t *n)
{
	json_t *l = th_arr(r, "losses");

	*out = realloc(*out, (*n + json_array_size(l) + 1) * sizeof **out);
	ck_assert_ptr_nonnull(*out);
	for (size_t i = 0; i < json_array_size(l); i++)
		(*out)[(*n)++] = json_real_value(json_array_get(l, i));
}

/*
 * A data-driven run cancelled mid-way keeps what its steps did in the
 * operation's metadata (partial_result): the losses of the steps that ran,
 * their count, the model's step count and the position it stopped at. They
 * are the first k losses of an uninterrupted run in a second daemon, bit
 * for bit, and continuing from the reported position gives its next ones.
 */
START_TEST(test_step_cancel_keeps_losses)
{
	float *x = th_floats(12 * 16, 82, -1.0f, 1.0f), *y = th_floats(12 * 16, 83, -1.0f, 1.0f);
	char *host = th_fmt("device=%s&memory_kind=pinned_host", th_dev(0));
	const char *run = "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 1000000, "
	                  "\"batches\": {\"batch_size\": 4, \"order\": \"shuffle\", \"seed\": 5}}";
	double *kept = NULL, *more = NULL, *whole = NULL;
	size_t nk = 0, nm = 0, nw = 0;
	json_int_t k, next;
	json_t *op, *part, *bt, *res, *m;
	struct th_daemon first;
	long long deadline;
	char *id, path[96], body[512];

	th_put_floats(&D, "bx", x, 12, 16, host);
	th_put_floats(&D, "by", y, 12, 16, host);
	batch_model("bk");
	id = step_start("bk", run, 1000000);
	deadline = th_now_ms() + 60000;
	for (;;) {
		op = th_op_get(&D, id);
		if (th_int(th_op_meta(op, "progress"), "steps_done") >= 20)
			break;
		ck_assert_msg(!th_bool(op, "done"), "the run ended: %s", json_dumps(op, 0));
		json_decref(op);
		ck_assert_msg(th_now_ms() < deadline, "the steps did not start");
		usleep(2000);
	}
	json_decref(op);
	snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
	json_decref(th_post_json(&D, path, "{}", 200));
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	op = th_post_json(&D, path, "{\"timeout\": \"60s\"}", 200);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "CANCELLED");
	ck_assert_int_eq(th_int(th_obj(op, "error"), "code"), 499);
	ck_assert_msg(!json_object_get(op, "response"), "a cancelled run has a response");
	part = th_op_meta(op, "partial_result");
	k = J(part, "steps");
	ck_assert_msg(k >= 20 && k < 1000000, "%lld steps kept", (long long)k);
	ck_assert_int_eq(k, th_int(th_op_meta(op, "progress"), "steps_done"));
	ck_assert_int_eq(J(part, "model_steps"), k);
	take_all(part, &kept, &nk);
	ck_assert_uint_eq(nk, (size_t)k);
	bt = th_obj(part, "batches");
	next = J(bt, "next");
	ck_assert_int_eq(J(bt, "start"), 0);
	ck_assert_int_eq(next, 4 * k);
	ck_assert_int_eq(J(bt, "epoch"), 4 * k / 12);
	ck_assert_int_eq(J(part, "measured_peak_device_bytes"), J(part, "predicted_peak_device_bytes"));
	json_decref(op);
	m = th_get_object(&D, "/v1/models/bk");
	ck_assert_int_eq(th_int(m, "steps"), k);
	json_decref(m);
	/* continuing where it stopped */
	snprintf(body, sizeof body, "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": 30, "
	         "\"batches\": {\"batch_size\": 4, \"order\": \"shuffle\", \"seed\": 5, "
	         "\"start\": %lld}}", (long long)next);
	res = th_model_step(&D, "bk", body);
	take_all(res, &more, &nm);
	ck_assert_int_eq(J(res, "model_steps"), k + 30);
	json_decref(res);
	/* the same run uninterrupted, in a second daemon (the helpers speak to D) */
	first = D;
	th_daemon_start(&D, base_args);
	th_put_floats(&D, "bx", x, 12, 16, host);
	th_put_floats(&D, "by", y, 12, 16, host);
	batch_model("bk");
	snprintf(body, sizeof body, "{\"inputs\": \"bx\", \"targets\": \"by\", \"steps\": %lld, "
	         "\"batches\": {\"batch_size\": 4, \"order\": \"shuffle\", \"seed\": 5}}",
	         (long long)k + 30);
	res = th_model_step(&D, "bk", body);
	take_all(res, &whole, &nw);
	json_decref(res);
	th_daemon_stop_ok(&D);
	D = first;
	ck_assert_uint_eq(nw, (size_t)k + 30);
	for (size_t i = 0; i < nk; i++)
		ck_assert_msg(memcmp(&kept[i], &whole[i], sizeof kept[i]) == 0,
		              "kept loss %zu is %.17g, uninterrupted %.17g", i, kept[i], whole[i]);
	for (size_t i = 0; i < nm; i++)
		ck_assert_msg(memcmp(&more[i], &whole[nk + i], sizeof more[i]) == 0,
		              "continued loss %zu is %.17g, uninterrupted %.17g", i, more[i],
		              whole[nk + i]);
	free(kept);
	free(more);
	free(whole);
	free(id);
	free(host);
	free(x);
	free(y);
}
END_TEST

START_TEST(test_step_errors)
{
	float *x = th_floats(8 * 16, 70, -1.0f, 1.0f);

	json_decref(create("{\"name\": \"e\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 8}, "
	                   "\"loss\": \"mse\"}"));
	th_put_floats(&D, "ex", x, 8, 16, NULL);
	th_put_floats(&D, "ey", x, 4, 32, NULL);
	th_put_floats(&D, "ez", x, 4, 16, NULL);
	th_post_error_words(&D, "/v1/models/nope:step?wait=true", "{\"inputs\": \"ex\"}", 404,
	                    "NOT_FOUND", "MODEL_NOT_FOUND", "nope", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true", "{\"steps\": 1}", 400,
	                    "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "inputs", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true",
	                    "{\"inputs\": \"ex\", \"targets\": \"ex\", \"lr\": 1}", 400,
	                    "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "lr", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true",
	                    "{\"inputs\": \"ex\", \"targets\": \"ex\", \"steps\": 0}", 400,
	                    "INVALID_ARGUMENT", "BAD_STEPS", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true",
	                    "{\"inputs\": \"missing\", \"targets\": \"ex\"}", 404, "NOT_FOUND",
	                    "ARRAY_NOT_FOUND", "missing", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true", "{\"inputs\": \"ex\"}", 400,
	                    "INVALID_ARGUMENT", "NO_TARGETS", "targets", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true",
	                    "{\"inputs\": \"ey\", \"targets\": \"ey\"}", 400, "INVALID_ARGUMENT",
	                    "BAD_INPUTS", "16", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true",
	                    "{\"inputs\": \"ex\", \"targets\": \"ez\"}", 400, "INVALID_ARGUMENT",
	                    "BAD_TARGETS", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true",
	                    "{\"inputs\": 5, \"targets\": \"ex\"}", 400, "INVALID_ARGUMENT",
	                    "BAD_REQUEST_BODY", "inputs", NULL);
	th_post_error_words(&D, "/v1/models/e:step?wait=true",
	                    "{\"inputs\": \"ex\", \"targets\": \"ex\", "
	                    "\"placement\": {\"prefetch_depth\": 3}}",
	                    400, "INVALID_ARGUMENT", "BAD_POLICY", "prefetch_depth", NULL);
	/* after all that, it runs, and no failed step counted */
	json_decref(th_model_step(&D, "e", "{\"inputs\": \"ex\", \"targets\": \"ex\"}"));
	free(x);
}
END_TEST

/* ---- progress and cancellation -------------------------------------------------------- */

START_TEST(test_step_progress)
{
	char *id;
	json_t *op, *res;
	int middle;

	guide_setup("g", NULL);
	id = step_start("g", "{\"inputs\": \"x\", \"steps\": 3}", 3);
	op = op_poll(id, &middle);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	ck_assert_int_eq(th_int(th_op_meta(op, "progress"), "steps_done"), 3);
	ck_assert_msg(middle > 0, "no snapshot showed 0 < steps_done < 3");
	res = th_op_result(op);
	ck_assert_uint_eq(json_array_size(th_arr(res, "losses")), 3);
	ck_assert_int_eq(th_int(res, "steps"), 3);
	ck_assert_str_eq(th_str(res, "model"), "g");
	json_decref(op);
	/* :wait on it answers the finished operation */
	{
		char path[96];

		snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
		op = th_post_json(&D, path, "{\"timeout\": \"5s\"}", 200);
		ck_assert(th_bool(op, "done"));
		json_decref(op);
	}
	free(id);
}
END_TEST

START_TEST(test_step_cancel)
{
	json_t *op, *res, *m;
	json_int_t dev0, host0;
	char *id, path[96];
	long long deadline;
	const char *state;

	guide_setup("g", "{\"params\": \"pinned_host\", \"activations\": {\"offload\": [\"x\"]}, "
	                 "\"prefetch_depth\": 1}");
	json_decref(th_model_step(&D, "g", "{\"inputs\": \"x\"}"));
	dev0 = space_int(th_dev(0), "device", "bytes_in_use");
	host0 = space_int(th_dev(0), "pinned_host", "bytes_in_use");
	id = step_start("g", "{\"inputs\": \"x\", \"steps\": 200}", 200);
	/* let it start */
	deadline = th_now_ms() + 30000;
	for (;;) {
		op = th_op_get(&D, id);
		if (th_int(th_op_meta(op, "progress"), "steps_done") >= 1 || th_bool(op, "done"))
			break;
		json_decref(op);
		ck_assert_msg(th_now_ms() < deadline, "the steps did not start");
		usleep(2000);
	}
	json_decref(op);
	snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
	{
		struct th_response r;

		th_post(&D, path, "{}", &r);
		ck_assert_msg(r.status == 200 || r.status == 400, "cancel: %ld %s", r.status, r.body);
		th_response_free(&r);
	}
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	op = th_post_json(&D, path, "{\"timeout\": \"60s\"}", 200);
	state = json_string_value(th_op_meta(op, "state"));
	ck_assert_msg(strcmp(state, "CANCELLED") == 0 || strcmp(state, "SUCCEEDED") == 0, "state %s",
	              state);
	if (strcmp(state, "CANCELLED") == 0) {
		json_t *e = th_obj(op, "error");

		ck_assert_msg(th_int(th_op_meta(op, "progress"), "steps_done") < 200, "cancelled after all");
		ck_assert_msg(th_int(e, "code") == 499 && strcmp(th_str(e, "status"), "CANCELLED") == 0,
		              "error %s", json_dumps(e, 0));
	}
	json_decref(op);
	/* every temp is back, and the model still runs, as predicted */
	ck_assert_int_eq(space_int(th_dev(0), "device", "bytes_in_use"), dev0);
	ck_assert_int_eq(space_int(th_dev(0), "pinned_host", "bytes_in_use"), host0);
	res = th_model_step(&D, "g", "{\"inputs\": \"x\", \"steps\": 2}");
	ck_assert_int_eq(J(res, "measured_peak_device_bytes"), J(res, "predicted_peak_device_bytes"));
	ck_assert_msg(loss_at(res, 0) == loss_at(res, 1), "losses differ");
	json_decref(res);
	m = th_get_object(&D, "/v1/models/g");
	ck_assert_int_eq(th_int(m, "steps"), 0);
	json_decref(m);
	free(id);
}
END_TEST

/* ---- the suite ------------------------------------------------------------------------- */

/* ---- admission of a whole model ------------------------------------------------------- */

/* A daemon with 64 MiB of pinned_host memory in all. */
static void daemon_up_small_pinned(void)
{
	static const char *const args[] = {"--sim-device-memory", "256MiB", "--pinned-host-limit",
	                                   "64MiB", NULL};

	th_daemon_start(&D, args);
}

/* A metadata value of an error's ErrorInfo, as a number. */
static unsigned long long error_meta_u64(json_t *body, const char *key)
{
	json_t *info = json_array_get(th_arr(th_obj(body, "error"), "details"), 0);
	json_t *v = json_object_get(th_obj(info, "metadata"), key);

	ck_assert_msg(json_is_string(v), "ErrorInfo metadata has no '%s'", key);
	return strtoull(json_string_value(v), NULL, 10);
}

/* A model whose every array fits but whose whole does not is refused with
 * what the whole model needs against the budget, not with the one array
 * that happened to come last; nothing of it is left. */
START_TEST(test_create_refusal_names_the_whole_model)
{
	/* w1, w2: 4 x 512 x 2048 float32 = 16 MiB each; Adam's mu and nu twice that */
	const char *body = "{\"name\": \"big\", \"mlp\": {\"layers\": 4, \"d_model\": 512, "
	                   "\"d_hidden\": 2048}, \"optimizer\": {\"type\": \"adam\"}, "
	                   "\"placement\": {\"params\": \"pinned_host\", "
	                   "\"opt_state\": \"pinned_host\"}}";
	struct th_response r;
	json_t *j, *mem;
	char want[96];

	th_post(&D, "/v1/models?wait=true", body, &r);
	ck_assert_msg(r.status == 429, "%ld: %s", r.status, r.body);
	ck_assert_msg(strstr(r.body, "(params 32.00 MiB, optimizer state 64.00 MiB)") &&
	              strstr(r.body, "the budget is 64.00 MiB, 64.00 MiB free"), "%s", r.body);
	ck_assert_msg(!strstr(r.body, "big.w1") && !strstr(r.body, "big.adam"),
	              "the refusal names one array: %s", r.body);
	j = th_json(&r);
	ck_assert_uint_eq(error_meta_u64(j, "requested_bytes"), 96 * MiB);
	ck_assert_uint_eq(error_meta_u64(j, "params_bytes"), 32 * MiB);
	ck_assert_uint_eq(error_meta_u64(j, "opt_state_bytes"), 64 * MiB);
	ck_assert_uint_eq(error_meta_u64(j, "limit_bytes"), 64 * MiB);
	ck_assert_uint_eq(error_meta_u64(j, "free_bytes"), 64 * MiB);
	snprintf(want, sizeof want, "pinned_host on %s", th_dev(0));
	th_expect_error(&r, "a model larger than the pinned budget", 429, "RESOURCE_EXHAUSTED",
	                "OUT_OF_MEMORY", "model 'big' needs 96.00 MiB of", want);
	ck_assert_int_eq(th_get_status(&D, "/v1/models/big"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/big.w1"), 404);
	mem = th_get_object(&D, "/v1/memory");
	for (size_t i = 0; i < json_array_size(th_arr(mem, "spaces")); i++)
		ck_assert_int_eq(th_int(json_array_get(th_arr(mem, "spaces"), i), "bytes_in_use"), 0);
	json_decref(mem);

	/* the same model with its optimizer state on the device fits */
	json_decref(th_post_json(&D, "/v1/models?wait=true",
	                         "{\"name\": \"big\", \"mlp\": {\"layers\": 4, \"d_model\": 512, "
	                         "\"d_hidden\": 2048}, \"optimizer\": {\"type\": \"adam\"}, "
	                         "\"placement\": {\"params\": \"pinned_host\", "
	                         "\"opt_state\": \"device\"}}", 200));
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("models");
	TCase *tc;

	tc = tcase_create("create");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_create_adam);
	tcase_add_test(tc, test_create_variants);
	tcase_add_test(tc, test_create_bad_specs);
	tcase_add_test(tc, test_create_type_errors_name_the_field);
	tcase_add_test(tc, test_create_sizes_not_truncated);
	tcase_add_test(tc, test_create_placement_unknown_field);
	tcase_add_test(tc, test_create_exclusive_names);
	tcase_add_test(tc, test_create_gpt_activation_names);
	tcase_add_test(tc, test_create_duplicate);
	tcase_add_test(tc, test_get_list_delete);
	suite_add_tcase(s, tc);

	tc = tcase_create("admission");
	tcase_add_checked_fixture(tc, daemon_up_small_pinned, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_create_refusal_names_the_whole_model);
	suite_add_tcase(s, tc);

	tc = tcase_create("analyze");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_analyze_guide);
	tcase_add_test(tc, test_analyze_adam_7168);
	tcase_add_test(tc, test_analyze_errors);
	suite_add_tcase(s, tc);

	tc = tcase_create("guide_steps");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_step_guide_policies);
	tcase_add_test(tc, test_step_guide_models);
	tcase_add_test(tc, test_step_peak_seen_by_the_space);
	tcase_add_test(tc, test_step_params_override_not_ignored);
	tcase_add_test(tc, test_step_params_split);
	suite_add_tcase(s, tc);

	tc = tcase_create("large");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_step_adam_large_timed);
	suite_add_tcase(s, tc);

	tc = tcase_create("reference");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_step_adam_clipped);
	tcase_add_test(tc, test_step_adam_split_and_offloaded);
	tcase_add_test(tc, test_step_sgd_clipped);
	tcase_add_test(tc, test_step_gradients);
	suite_add_tcase(s, tc);

	tc = tcase_create("operands");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_step_rows);
	tcase_add_test(tc, test_step_committed_apart);
	tcase_add_test(tc, test_step_named_targets_colocated_with_row_inputs);
	tcase_add_test(tc, test_step_target_rows_gathered_with_named_inputs);
	tcase_add_test(tc, test_step_errors);
	tcase_add_test(tc, test_analyze_timeline_only_when_asked);
	tcase_add_test(tc, test_step_counts_staging_from_the_host);
	tcase_add_test(tc, test_step_batches);
	tcase_add_test(tc, test_step_cancel_keeps_losses);
	suite_add_tcase(s, tc);

	tc = tcase_create("uncommitted");
	tcase_add_checked_fixture(tc, daemon_up_default_sim1, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_step_uncommitted_inputs_follow);
	suite_add_tcase(s, tc);

	tc = tcase_create("operations");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_step_progress);
	tcase_add_test(tc, test_step_cancel);
	suite_add_tcase(s, tc);
	return s;
}
