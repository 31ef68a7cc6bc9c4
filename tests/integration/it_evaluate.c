/*
 * it_evaluate.c - Check suite "evaluate": POST /v1/models/{m}:evaluate
 * against a real tstaged (simulated devices of 256 MiB, or the GPUs with
 * TS_TEST_BACKEND=cuda): the loss of a batch and the outputs (the last
 * layer's activations) written to an array at a placement the call names.
 *
 * The loss equals the loss the next :step reports before its update, bit
 * for bit, and the float64 reference (py/train_reference.py) within float32
 * precision, as do the outputs; the model's weights and optimizer state
 * keep their bytes, versions and ETags and its step count; params offloaded
 * to pinned_host (streamed per layer) give the same loss and outputs bit for
 * bit; the measured peak equals the forward-only plan's prediction, which
 * :analyze with "mode": "evaluate" answers before any run and which is
 * below a step's; rows of a dataset as inputs; a step running refuses an
 * evaluation and an evaluation running refuses a move of the weights (409
 * naming the operation); bad requests are 4xx naming the problem; a
 * cancelled evaluation publishes nothing.
 *
 * Each case runs forked with its own daemon.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CASE_TIMEOUT_S 120

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

/* ---- requests ------------------------------------------------------------------------ */

static void move_to(const char *name, const char *kind)
{
	char path[300], body[128];

	snprintf(path, sizeof path, "/v1/arrays/%s:put?wait=true", name);
	snprintf(body, sizeof body, "{\"memory_kind\": \"%s\"}", kind);
	json_decref(th_post_json(&D, path, body, 200));
}

static json_int_t space_int(const char *dev, const char *kind, const char *key)
{
	json_t *feed = th_get_object(&D, "/v1/memory"), *sp;
	json_int_t v = -1;
	size_t i;

	json_array_foreach(th_arr(feed, "spaces"), i, sp)
		if (strcmp(th_str(sp, "device"), dev) == 0 && strcmp(th_str(sp, "memory_kind"), kind) == 0)
			v = th_int(sp, key);
	json_decref(feed);
	ck_assert_msg(v >= 0, "no space (%s, %s)", dev, kind);
	return v;
}

/* :evaluate?wait=true: 200 with the result (new reference). */
static json_t *evaluate(const char *model, const char *body)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/models/%s:evaluate?wait=true", model);
	return th_post_json(&D, path, body, 200);
}

static json_t *analyze(const char *model, const char *body)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/models/%s:analyze", model);
	return th_post_json(&D, path, body, 200);
}

#define J(o, k) th_int((o), (k))

/* ---- data and the reference ------------------------------------------------------------ */

/* The small model of these cases: 3 layers, d 32, h 64, gelu, residual,
 * mse, Adam; inputs "x" and targets "t" of 16 rows. */
#define L_ 3
#define D_ 32
#define H_ 64
#define B_ 16

struct files {
	char dir[512], w1[600], w2[600], inputs[600], targets[600], out[600];
};

static void small_setup(const char *name, const char *placement, struct files *f)
{
	char *spec = th_fmt("{\"name\": \"%s\", \"mlp\": {\"layers\": %d, \"d_model\": %d, "
	                    "\"d_hidden\": %d, \"activation\": \"gelu\", \"residual\": true}, "
	                    "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
	                    "\"learning_rate\": 0.01}, \"init\": {\"seed\": 7, \"scale\": 0.2}%s%s}",
	                    name, L_, D_, H_, placement ? ", \"placement\": " : "",
	                    placement ? placement : "");
	float *x = th_floats(B_ * D_, 3, -2.0f, 2.0f), *t = th_floats(B_ * D_, 4, -2.0f, 2.0f), *w;
	char an[200];
	size_t n;

	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	th_put_floats(&D, "x", x, B_, D_, NULL);
	th_put_floats(&D, "t", t, B_, D_, NULL);
	if (f) {
		th_temp_dir(name, f->dir, sizeof f->dir);
		snprintf(f->w1, sizeof f->w1, "%s/w1.f32", f->dir);
		snprintf(f->w2, sizeof f->w2, "%s/w2.f32", f->dir);
		snprintf(f->inputs, sizeof f->inputs, "%s/inputs.f32", f->dir);
		snprintf(f->targets, sizeof f->targets, "%s/targets.f32", f->dir);
		snprintf(f->out, sizeof f->out, "%s/out", f->dir);
		snprintf(an, sizeof an, "%s.w1", name);
		w = th_download_floats(&D, an, &n);
		th_write_file(f->w1, w, n * sizeof *w);
		free(w);
		snprintf(an, sizeof an, "%s.w2", name);
		w = th_download_floats(&D, an, &n);
		th_write_file(f->w2, w, n * sizeof *w);
		free(w);
		th_write_file(f->inputs, x, sizeof(float) * B_ * D_);
		th_write_file(f->targets, t, sizeof(float) * B_ * D_);
	}
	free(x);
	free(t);
}

/* Runs the reference (no steps: the initial forward only); result.json. */
static json_t *reference(const struct files *f)
{
	char spec_path[600], cmd[2048], result[700];
	json_t *spec, *res;
	json_error_t e;
	int st;

	spec = json_pack("{s:i, s:i, s:i, s:s, s:b, s:s, s:{s:s}, s:i, s:i, s:s, s:s, s:s, s:s, s:s}",
	                 "layers", L_, "d_model", D_, "d_hidden", H_, "activation", "gelu",
	                 "residual", 1, "loss", "mse", "optimizer", "type", "none", "batch", B_,
	                 "steps", 1, "w1", f->w1, "w2", f->w2, "inputs", f->inputs,
	                 "targets", f->targets, "out", f->out);
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

/* The bytes and ETags of the model's four arrays. */
struct snapshot {
	float *data[4];
	size_t n[4];
	char etag[4][128];
	json_int_t version[4];
};

static const char *const roles[4] = {"w1", "w2", "adam.mu.w1", "adam.nu.w2"};

static void snap(const char *model, struct snapshot *s)
{
	char name[200];

	for (int i = 0; i < 4; i++) {
		json_t *m;

		snprintf(name, sizeof name, "%s.%s", model, roles[i]);
		s->data[i] = th_download_floats(&D, name, &s->n[i]);
		m = th_array_meta(&D, name);
		snprintf(s->etag[i], sizeof s->etag[i], "%s", th_str(m, "etag"));
		s->version[i] = J(m, "version");
		json_decref(m);
	}
}

static void assert_untouched(const char *model, struct snapshot *before, const char *what)
{
	struct snapshot now;
	char label[300];

	snap(model, &now);
	for (int i = 0; i < 4; i++) {
		snprintf(label, sizeof label, "%s: %s.%s", what, model, roles[i]);
		th_assert_same_floats(label, now.data[i], now.n[i], before->data[i], before->n[i]);
		ck_assert_msg(strcmp(now.etag[i], before->etag[i]) == 0, "%s: ETag %s, was %s", label,
		              now.etag[i], before->etag[i]);
		ck_assert_int_eq(now.version[i], before->version[i]);
		free(now.data[i]);
	}
}

static void snap_free(struct snapshot *s)
{
	for (int i = 0; i < 4; i++)
		free(s->data[i]);
}

static json_int_t model_steps(const char *model)
{
	char path[200];
	json_t *m;
	json_int_t v;

	snprintf(path, sizeof path, "/v1/models/%s", model);
	m = th_get_object(&D, path);
	v = J(m, "steps");
	json_decref(m);
	return v;
}

/* measured == predicted, and the analysis is :analyze's for mode evaluate. */
static void check_peak(json_t *res, json_t *an, const char *what)
{
	json_t *a = th_obj(res, "analysis"), *t = json_deep_copy(an);

	ck_assert_msg(J(res, "measured_peak_device_bytes") == J(res, "predicted_peak_device_bytes"),
	              "%s: measured %lld, predicted %lld", what,
	              (long long)J(res, "measured_peak_device_bytes"),
	              (long long)J(res, "predicted_peak_device_bytes"));
	ck_assert_int_eq(J(res, "measured_temp_size_in_bytes"), J(res, "predicted_temp_size_in_bytes"));
	json_object_del(t, "timeline");
	ck_assert_msg(json_equal(a, t), "%s: the analysis differs from :analyze:\n%s\n%s", what,
	              json_dumps(a, 0), json_dumps(t, 0));
	json_decref(t);
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "h2d"), J(an, "h2d_bytes"));
	ck_assert_int_eq(J(th_obj(res, "bytes_moved"), "d2h"), J(an, "d2h_bytes"));
}

/* ---- the cases ----------------------------------------------------------------------- */

/* The loss and outputs against the reference; the weights untouched; the
 * next step's loss is the evaluation's, bit for bit. */
START_TEST(test_evaluate_loss_outputs_and_step)
{
	struct files f;
	struct snapshot before;
	json_t *res, *ref, *an, *st, *om;
	float *got, *want, loss;
	size_t ng, nw;
	char path[700];

	small_setup("m", NULL, &f);
	snap("m", &before);
	an = analyze("m", "{\"batch\": [16, 32], \"mode\": \"evaluate\", "
	                  "\"outputs\": {\"memory_kind\": \"device\"}}");
	res = evaluate("m", "{\"inputs\": \"x\", \"targets\": \"t\", "
	                    "\"outputs\": {\"name\": \"m.out\", \"memory_kind\": \"device\"}}");
	check_peak(res, an, "evaluate, outputs on device");
	ck_assert_int_eq(J(th_obj(res, "analysis"), "output_size_in_bytes"), B_ * D_ * 4);
	ck_assert_int_eq(J(th_obj(res, "analysis"), "alias_size_in_bytes"), 0);
	ck_assert_int_eq(J(res, "batch"), B_);
	assert_untouched("m", &before, "after :evaluate");
	ck_assert_int_eq(model_steps("m"), 0);
	/* the outputs: a committed float32 [16, 32] array on the device */
	om = th_obj(res, "outputs");
	ck_assert_str_eq(th_str(om, "name"), "m.out");
	ck_assert_str_eq(th_str(th_obj(om, "sharding"), "memory_kind"), "device");
	json_decref(om = th_array_meta(&D, "m.out"));
	ref = reference(&f);
	loss = (float)json_number_value(json_object_get(res, "loss"));
	ck_assert_msg(fabs(loss - json_number_value(json_object_get(ref, "initial_loss"))) <=
	              1e-5 * fabs(json_number_value(json_object_get(ref, "initial_loss"))),
	              "loss %.9g, reference %.9g", (double)loss,
	              json_number_value(json_object_get(ref, "initial_loss")));
	got = th_download_floats(&D, "m.out", &ng);
	snprintf(path, sizeof path, "%s/outputs.f32", f.out);
	want = (float *)th_read_file(path, &nw);
	ck_assert_ptr_nonnull(want);
	th_assert_close_floats("outputs vs reference", got, ng, want, nw / sizeof(float), 1e-5);
	free(got);
	free(want);
	/* the step that follows reports, before its update, the same loss */
	st = th_model_step(&D, "m", "{\"inputs\": \"x\", \"targets\": \"t\"}");
	{
		float sl = (float)json_number_value(json_array_get(th_arr(st, "losses"), 0));

		ck_assert_msg(memcmp(&sl, &loss, sizeof sl) == 0,
		              "the step's loss %.9g is not the evaluation's %.9g bit for bit",
		              (double)sl, (double)loss);
	}
	/* and the evaluation reads the updated weights afterwards */
	json_decref(res);
	res = evaluate("m", "{\"inputs\": \"x\", \"targets\": \"t\"}");
	ck_assert_msg(json_number_value(json_object_get(res, "loss")) != (double)loss,
	              "the evaluation after a step sees the old weights");
	ck_assert_msg(json_object_get(res, "outputs") == NULL, "outputs without asking");
	json_decref(st);
	json_decref(res);
	json_decref(ref);
	json_decref(an);
	snap_free(&before);
}
END_TEST

/* Params on pinned_host (streamed per layer), outputs on pinned_host: the
 * same loss and outputs bit for bit, the weights' bytes moved once. */
START_TEST(test_evaluate_offloaded_params)
{
	struct snapshot before;
	json_t *dev, *host, *an, *om;
	float *a, *b;
	size_t na, nb;
	char *body;

	small_setup("m", NULL, NULL);
	dev = evaluate("m", "{\"inputs\": \"x\", \"targets\": \"t\", "
	                    "\"outputs\": {\"name\": \"out_dev\"}}");
	move_to("m.w1", "pinned_host");
	move_to("m.w2", "pinned_host");
	snap("m", &before);
	an = analyze("m", "{\"batch\": [16, 32], \"mode\": \"evaluate\", "
	                  "\"outputs\": {\"memory_kind\": \"pinned_host\"}}");
	ck_assert_int_eq(J(an, "h2d_bytes"), 2 * L_ * D_ * H_ * 4);
	ck_assert_int_eq(J(an, "host_argument_size_in_bytes"), 2 * L_ * D_ * H_ * 4);
	ck_assert_int_eq(J(an, "host_output_size_in_bytes"), B_ * D_ * 4);
	body = th_fmt("{\"inputs\": \"x\", \"targets\": \"t\", \"placement\": {\"prefetch_depth\": 1}, "
	              "\"outputs\": {\"name\": \"out_host\", \"sharding\": {\"device\": \"%s\", "
	              "\"memory_kind\": \"pinned_host\"}}}",
	              th_dev(0));
	host = evaluate("m", body);
	free(body);
	ck_assert_msg(json_equal(json_object_get(dev, "loss"), json_object_get(host, "loss")),
	              "offloaded params: loss %.9g, on device %.9g",
	              json_number_value(json_object_get(host, "loss")), json_number_value(json_object_get(dev, "loss")));
	ck_assert_msg(J(host, "measured_peak_device_bytes") == J(host, "predicted_peak_device_bytes"),
	              "measured %lld, predicted %lld", (long long)J(host, "measured_peak_device_bytes"),
	              (long long)J(host, "predicted_peak_device_bytes"));
	ck_assert_int_eq(J(th_obj(host, "bytes_moved"), "d2h"), B_ * D_ * 4);
	ck_assert_int_ge(J(th_obj(host, "bytes_moved"), "h2d"), 2 * L_ * D_ * H_ * 4);
	ck_assert_int_lt(J(host, "predicted_peak_device_bytes"), J(dev, "predicted_peak_device_bytes"));
	om = th_array_meta(&D, "out_host");
	ck_assert_str_eq(th_str(th_obj(om, "sharding"), "memory_kind"), "pinned_host");
	json_decref(om);
	a = th_download_floats(&D, "out_dev", &na);
	b = th_download_floats(&D, "out_host", &nb);
	th_assert_same_floats("outputs with params offloaded", b, nb, a, na);
	assert_untouched("m", &before, "after an offloaded :evaluate");
	free(a);
	free(b);
	snap_free(&before);
	json_decref(an);
	json_decref(dev);
	json_decref(host);
}
END_TEST

/* Rows of a dataset: the loss of rows r is the loss of an array of those rows. */
START_TEST(test_evaluate_rows)
{
	float *x = th_floats(B_ * D_, 3, -2.0f, 2.0f), *t = th_floats(B_ * D_, 4, -2.0f, 2.0f);
	json_t *rows, *whole;

	small_setup("m", NULL, NULL);
	/* rows 4..11 of x and t as arrays of their own */
	th_put_floats(&D, "x8", x + 4 * D_, 8, D_, NULL);
	th_put_floats(&D, "t8", t + 4 * D_, 8, D_, NULL);
	rows = evaluate("m", "{\"inputs\": {\"array\": \"x\", \"rows\": {\"start\": 4, \"stop\": 12}},"
	                     " \"targets\": {\"array\": \"t\", \"rows\": {\"start\": 4, \"stop\": 12}}}");
	whole = evaluate("m", "{\"inputs\": \"x8\", \"targets\": \"t8\"}");
	ck_assert_int_eq(J(rows, "batch"), 8);
	ck_assert_msg(json_equal(json_object_get(rows, "loss"), json_object_get(whole, "loss")),
	              "rows: loss %.9g, the same rows as an array %.9g",
	              json_number_value(json_object_get(rows, "loss")), json_number_value(json_object_get(whole, "loss")));
	json_decref(rows);
	json_decref(whole);
	free(x);
	free(t);
}
END_TEST

/* The forward-only plan needs less than a step; :analyze says so first. */
START_TEST(test_evaluate_analyze_mode)
{
	json_t *ev, *st;

	small_setup("m", NULL, NULL);
	ev = analyze("m", "{\"batch\": [16, 32], \"mode\": \"evaluate\"}");
	st = analyze("m", "{\"batch\": [16, 32]}");
	ck_assert_int_lt(J(ev, "temp_size_in_bytes"), J(st, "temp_size_in_bytes"));
	ck_assert_int_lt(J(ev, "peak_device_bytes"), J(st, "peak_device_bytes"));
	/* arguments: the params, inputs and targets - no optimizer state */
	ck_assert_int_eq(J(ev, "argument_size_in_bytes"), 2 * L_ * D_ * H_ * 4 + 2 * B_ * D_ * 4);
	ck_assert_int_eq(J(ev, "alias_size_in_bytes"), 0);
	ck_assert_int_eq(J(ev, "output_size_in_bytes"), 0);
	json_decref(ev);
	json_decref(st);
	th_post_error_words(&D, "/v1/models/m:analyze",
	                    "{\"batch\": [16, 32], \"mode\": \"infer\"}", 400, "INVALID_ARGUMENT",
	                    "BAD_MODE", "infer", NULL);
	th_post_error_words(&D, "/v1/models/m:analyze", "{\"batch\": [16, 32], \"outputs\": {}}",
	                    400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "evaluate", NULL);
}
END_TEST

START_TEST(test_evaluate_errors)
{
	const char *p = "/v1/models/m:evaluate?wait=true";
	char *body;
	static const struct {
		const char *body;
		int status;
		const char *code, *reason, *word;
	} cases[] = {
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 2}", 400, "INVALID_ARGUMENT",
		 "BAD_REQUEST_BODY", "steps"},
		{"{\"inputs\": \"x\"}", 400, "INVALID_ARGUMENT", "NO_TARGETS", "targets"},
		{"{\"inputs\": {\"array\": \"x\", \"row\": [1]}, \"targets\": \"t\"}", 400,
		 "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "inputs.row"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"memory_kind\": \"device\"}}",
		 400, "INVALID_ARGUMENT", "BAD_OUTPUTS", "outputs.name"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"o\", "
		 "\"memory_kind\": \"unpinned_host\"}}",
		 400, "INVALID_ARGUMENT", "BAD_MEMORY_KIND", "unpinned_host"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"o\", "
		 "\"memory_kind\": \"vram\"}}",
		 400, "INVALID_ARGUMENT", "BAD_MEMORY_KIND", "vram"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"o\", \"colour\": 1}}",
		 400, "INVALID_ARGUMENT", "BAD_OUTPUTS", "outputs.colour"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"bad name\"}}",
		 400, "INVALID_ARGUMENT", "BAD_OUTPUTS", "outputs.name"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"m.w1\"}}",
		 400, "FAILED_PRECONDITION", "ARRAY_OWNED", "m.w1"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"s.w1\"}}",
		 400, "FAILED_PRECONDITION", "ARRAY_OWNED", "s.w1"},
		{"{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"o\", "
		 "\"device\": \"nodev:9\"}}",
		 400, "INVALID_ARGUMENT", NULL, "nodev:9"},
		{"{\"inputs\": \"nothere\", \"targets\": \"t\"}", 404, "NOT_FOUND", "ARRAY_NOT_FOUND",
		 "nothere"},
	};

	small_setup("m", NULL, NULL);
	json_decref(th_post_json(&D, "/v1/models?wait=true",
	                         "{\"name\": \"s\", \"mlp\": {\"layers\": 1, \"d_model\": 32}, "
	                         "\"loss\": \"sum\"}", 200));
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		th_post_error_words(&D, p, cases[i].body, cases[i].status, cases[i].code,
		                    cases[i].reason, cases[i].word, NULL);
	th_post_error_words(&D, "/v1/models/s:evaluate", "{\"inputs\": \"x\", \"targets\": \"t\"}",
	                    400, "INVALID_ARGUMENT", "UNEXPECTED_TARGETS", "sum", NULL);
	th_post_error_words(&D, "/v1/models/ghost:evaluate", "{\"inputs\": \"x\"}", 404,
	                    "NOT_FOUND", NULL, "ghost", NULL);
	/* inputs of the wrong width */
	{
		float *w = th_floats(4 * 8, 9, -1.0f, 1.0f);

		th_put_floats(&D, "narrow", w, 4, 8, NULL);
		free(w);
	}
	th_post_error_words(&D, p, "{\"inputs\": \"narrow\", \"targets\": \"narrow\"}", 400,
	                    "INVALID_ARGUMENT", "BAD_INPUTS", "32", NULL);
	/* outputs asked for on another device than the model's */
	if (th_daemon_has_device(&D, th_dev(1))) {
		body = th_fmt("{\"inputs\": \"x\", \"targets\": \"t\", \"outputs\": {\"name\": \"o\", "
		              "\"device\": \"%s\"}}",
		              th_dev(1));
		th_post_error_words(&D, p, body, 400, "FAILED_PRECONDITION", "OUTPUTS_ELSEWHERE",
		                    th_dev(1), NULL);
		free(body);
	}
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/o"), 404);
}
END_TEST

/* A step running on the model: an evaluation is refused naming it (one
 * operation per model at a time, and the step holds the weights), and runs
 * once the step is done. */
START_TEST(test_evaluate_refused_while_a_step_runs)
{
	json_t *op, *done;
	char path[200], id[64];
	struct th_response r;
	const char *msg;

	small_setup("m", NULL, NULL);
	op = th_post_json(&D, "/v1/models/m:step", "{\"inputs\": \"x\", \"targets\": \"t\", "
	                                    "\"steps\": 100000}", 202);
	snprintf(id, sizeof id, "%s", json_string_value(th_op_meta(op, "id")));
	json_decref(op);
	th_post(&D, "/v1/models/m:evaluate", "{\"inputs\": \"x\", \"targets\": \"t\"}", &r);
	ck_assert_msg(r.status == 409, "evaluate during a step: %ld %s", r.status, r.body);
	th_assert_error(&r, 409, "ABORTED", "TARGET_BUSY");
	msg = th_str(th_obj(th_json(&r), "error"), "message");
	ck_assert_msg(strstr(msg, id) != NULL, "the refusal does not name the step %s: %s", id, msg);
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
	th_post(&D, path, "{}", &r);
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	json_decref(th_post_json(&D, path, "{\"timeout\": \"60s\"}", 200));
	done = evaluate("m", "{\"inputs\": \"x\", \"targets\": \"t\"}");
	ck_assert(json_is_number(json_object_get(done, "loss")));
	json_decref(done);
}
END_TEST

/* A cancel that reaches a running evaluation: CANCELLED, no outputs, every
 * temp back, the weights as they were. */
START_TEST(test_evaluate_cancel)
{
	struct th_response r;
	json_t *op;
	json_int_t dev0;
	char path[200], id[64];
	long cancel;
	float *x = th_floats(2048 * 256, 5, -1.0f, 1.0f);

	json_decref(
	        th_post_json(&D, "/v1/models?wait=true",
	                     "{\"name\": \"g\", \"mlp\": {\"layers\": 8, \"d_model\": 256, "
	                     "\"d_hidden\": 2048, \"activation\": \"relu\"}, \"loss\": \"sum\", "
	                     "\"init\": {\"seed\": 3, \"scale\": 0.05}}",
	                     200));
	th_put_floats(&D, "gx", x, 2048, 256, NULL);
	free(x);
	dev0 = space_int(th_dev(0), "device", "bytes_in_use");
	op = th_post_json(&D, "/v1/models/g:evaluate",
	                  "{\"inputs\": \"gx\", \"outputs\": {\"name\": \"go\"}}", 202);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "kind")), "evaluate");
	ck_assert_str_eq(json_string_value(th_op_meta(op, "target")), "g");
	snprintf(id, sizeof id, "%s", json_string_value(th_op_meta(op, "id")));
	json_decref(op);
	snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
	th_post(&D, path, "{}", &r);
	cancel = r.status;
	ck_assert_msg(cancel == 200 || cancel == 400, "cancel: %ld %s", r.status, r.body);
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	op = th_post_json(&D, path, "{\"timeout\": \"60s\"}", 200);
	if (cancel == 200) {
		ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "CANCELLED");
		ck_assert_int_eq(th_int(th_obj(op, "error"), "code"), 499);
		ck_assert_int_eq(th_get_status(&D, "/v1/arrays/go"), 404);
	} else {
		fprintf(stderr, "evaluate: the evaluation ended before its cancel arrived\n");
		ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	}
	json_decref(op);
	if (cancel == 200)
		ck_assert_int_eq(space_int(th_dev(0), "device", "bytes_in_use"), dev0);
	/* and it runs again */
	op = evaluate("g", "{\"inputs\": \"gx\"}");
	ck_assert(json_is_number(json_object_get(op, "loss")));
	json_decref(op);
}
END_TEST

/* A long evaluation holds the weights: a move of one of them submitted
 * while it runs is refused naming it (a write that got through must have
 * come after the evaluation ended). */
START_TEST(test_evaluate_holds_the_weights)
{
	struct th_response r;
	json_t *op, *before, *after;
	char path[200], id[64];
	float *x = th_floats(2048 * 256, 5, -1.0f, 1.0f);

	json_decref(
	        th_post_json(&D, "/v1/models?wait=true",
	                     "{\"name\": \"g\", \"mlp\": {\"layers\": 8, \"d_model\": 256, "
	                     "\"d_hidden\": 2048, \"activation\": \"relu\"}, \"loss\": \"sum\"}",
	                     200));
	th_put_floats(&D, "gx", x, 2048, 256, NULL);
	free(x);
	before = th_array_meta(&D, "g.w1");
	op = th_post_json(&D, "/v1/models/g:evaluate", "{\"inputs\": \"gx\"}", 202);
	snprintf(id, sizeof id, "%s", json_string_value(th_op_meta(op, "id")));
	json_decref(op);
	th_post(&D, "/v1/arrays/g.w1:put", "{\"memory_kind\": \"pinned_host\"}", &r);
	if (r.status == 409) {
		const char *msg;

		th_assert_error(&r, 409, "ABORTED", "ARRAY_HELD");
		msg = th_str(th_obj(th_json(&r), "error"), "message");
		ck_assert_msg(strstr(msg, id) != NULL, "the refusal does not name %s: %s", id, msg);
	} else {
		snprintf(path, sizeof path, "/v1/operations/%s", id);
		op = th_get_object(&D, path);
		ck_assert_msg(th_bool(op, "done"), "a move of g.w1 (%ld) got through while evaluation "
		              "%s ran", r.status, id);
		json_decref(op);
		fprintf(stderr, "evaluate: the evaluation ended before the move arrived\n");
	}
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	op = th_post_json(&D, path, "{\"timeout\": \"60s\"}", 200);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	json_decref(op);
	after = th_array_meta(&D, "g.w1");
	ck_assert_str_eq(th_str(after, "etag"), th_str(before, "etag"));
	json_decref(before);
	json_decref(after);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("evaluate");
	TCase *tc = tcase_create("evaluate");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_evaluate_loss_outputs_and_step);
	tcase_add_test(tc, test_evaluate_offloaded_params);
	tcase_add_test(tc, test_evaluate_rows);
	tcase_add_test(tc, test_evaluate_analyze_mode);
	tcase_add_test(tc, test_evaluate_errors);
	tcase_add_test(tc, test_evaluate_refused_while_a_step_runs);
	tcase_add_test(tc, test_evaluate_cancel);
	tcase_add_test(tc, test_evaluate_holds_the_weights);
	suite_add_tcase(s, tc);
	return s;
}
