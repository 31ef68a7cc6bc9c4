/*
 * it_optax.c - Check suite "optax": a daemon's training steps against JAX
 * and optax themselves (py/optax_reference.py: jax.grad and
 * optax.chain(clip_by_global_norm, sgd | adam | adamw) with a constant
 * learning rate or optax.warmup_cosine_decay_schedule, in float32), step by
 * step over 24 steps with clipping active: every loss and, at the end, the
 * weights and Adam's moments, within 3e-5 relative (float32 sums in two
 * orders). The float64 numpy reference of it_models stays the stricter
 * check of the formulas; this one checks that they are optax's. Mixed
 * precision: bfloat16 and float16 models against JAX's
 * jnp.matmul(a.astype(dt), b.astype(dt), preferred_element_type=float32)
 * (lowp_case says which tolerances and why), and the analysis of their
 * rounded copies; a bfloat16 GPT against py/gpt_reference.py's same
 * expression (test_gpt_bf16_vs_jax).
 *
 * Needs python3 with jax, jaxlib and optax (scripts/deps.sh installs them).
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

#define CASE_TIMEOUT_S 240
#define STEPS 24
#define REL 3e-5

static struct th_daemon D;
static const char *const args[] = {"--sim-device-memory", "256MiB", NULL};

static void up(void)
{
	th_daemon_start(&D, args);
}

static void down(void)
{
	th_daemon_stop_ok(&D);
}

/* The model's initial weights and the batch, as files in a temporary
 * directory (dir) for the Python reference to read. */
static void reference_inputs(const char *model, char *dir, size_t cap, const float *x,
                             const float *t, size_t nx)
{
	char name[160], path[400];

	th_temp_dir(model, dir, cap);
	for (int k = 0; k < 2; k++) {
		size_t nw;
		float *w;

		snprintf(name, sizeof name, "%s.w%d", model, k + 1);
		w = th_download_floats(&D, name, &nw);
		snprintf(path, sizeof path, "%s/w%d.f32", dir, k + 1);
		th_write_file(path, w, nw * sizeof *w);
		free(w);
	}
	snprintf(path, sizeof path, "%s/inputs.f32", dir);
	th_write_file(path, x, nx * sizeof *x);
	snprintf(path, sizeof path, "%s/targets.f32", dir);
	th_write_file(path, t, nx * sizeof *t);
}

struct net {
	const char *name;
	int layers, d, h, batch;
	const char *act;
	const char *optimizer;       /* the spec's JSON object */
};

static const char *const adam_files[][2] = {
	{"w1", "w1.f32"}, {"w2", "w2.f32"}, {"adam.mu.w1", "mu_w1.f32"}, {"adam.mu.w2", "mu_w2.f32"},
	{"adam.nu.w1", "nu_w1.f32"}, {"adam.nu.w2", "nu_w2.f32"},
};

/*
 * What compare_rel lets a GPU's 16-bit products move, as a unit of the
 * compute dtype (0: nothing) and the share of a tensor's elements. There
 * the products run on tensor cores, which add them in float32 in their own
 * blocks and order, each block aligned to its largest product and cut, not
 * rounded: the sums differ from an IEEE float32 sum in any order by more
 * than the float32 bound, where the terms cancel most, and now and then a
 * forward activation rounds to the next 16-bit value, moving the gradient
 * rows it multiplies by up to that unit. Those elements must stay within
 * one unit of the compute dtype of the largest magnitude and be at most
 * gpu_share of the tensor; every other element within rel. An H200 gave:
 * the float16 MLP's gradient 2 of 1152 elements past 1e-5 (at most
 * 1.8e-5), the bfloat16 GPT's tied embedding 175 of 1952 (at most 5.8e-4,
 * a seventh of a bfloat16 unit); the CPU backends none (nothing allowed).
 */
static double gpu_unit, gpu_share;

/* Sets what compare_rel allows for the gradients of compute dtype `dtype`
 * on a GPU (share of the elements); nothing on the CPU backends. */
static void allow_gpu_sums(const char *dtype, double share)
{
	gpu_unit = 0;
	gpu_share = 0;
	if (th_backend_is_sim())
		return;
	gpu_unit = strcmp(dtype, "float16") == 0 ? 0x1p-11 : 0x1p-8;
	gpu_share = share;
}

/* got against want elementwise, within rel of want's largest magnitude
 * (but for what a GPU's sums may move, above); returns the largest difference in
 * units of that magnitude. */
static double compare_rel(const char *what, const float *got, size_t ng, const float *want,
                          size_t nw, double rel)
{
	double scale = 0, worst = 0;
	size_t moved = 0;

	ck_assert_msg(ng == nw, "%s: %zu elements, reference %zu", what, ng, nw);
	for (size_t i = 0; i < nw; i++)
		scale = fmax(scale, fabs((double)want[i]));
	for (size_t i = 0; i < nw; i++) {
		double d = fabs((double)got[i] - (double)want[i]);

		if (d > rel * scale && d <= gpu_unit * scale) {
			moved++;
		} else {
			ck_assert_msg(d <= rel * scale, "%s[%zu]: %.9g, optax %.9g (tolerance %.3g)",
			              what, i, (double)got[i], (double)want[i], rel * scale);
		}
		worst = fmax(worst, d / (scale + 1e-30));
	}
	if (moved) {
		fprintf(stderr, "%s: %zu of %zu elements past %.3g (the GPU's 16-bit sums), the "
		        "largest %.3g\n", what, moved, nw, rel, worst);
		ck_assert_msg((double)moved <= gpu_share * (double)nw,
		              "%s: %zu of %zu elements past %.3g, more than %.0f%%", what, moved, nw,
		              rel, 100 * gpu_share);
	}
	return worst;
}

static void compare(const char *what, const float *got, size_t ng, const float *want, size_t nw)
{
	compare_rel(what, got, ng, want, nw, REL);
}

/* Runs optax_reference.py on the spec in rspec (dumped into dir); the
 * result.json (new reference). */
static json_t *run_script(const char *script, const char *dir, json_t *rspec, const char *tag)
{
	char path[700], cmd[2048];
	json_t *ref;
	json_error_t e;
	int st;

	snprintf(path, sizeof path, "%s/spec%s.json", dir, tag);
	ck_assert_int_eq(json_dump_file(rspec, path, 0), 0);
	snprintf(cmd, sizeof cmd, "python3 '%s/%s' '%s'", th_py_dir(), script, path);
	st = system(cmd);
	ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	              "'%s' failed (status %d): it needs python3 with jax, jaxlib and optax "
	              "(scripts/deps.sh)", cmd, st);
	snprintf(path, sizeof path, "%s/out%s/result.json", dir, tag);
	ref = json_load_file(path, 0, &e);
	ck_assert_msg(ref != NULL, "%s: %s", path, e.text);
	return ref;
}

static json_t *run_reference(const char *dir, json_t *rspec, const char *tag)
{
	return run_script("optax_reference.py", dir, rspec, tag);
}

/* Creates the model, runs STEPS steps on the daemon and in optax from the
 * same initial weights and batch, and compares them. */
static void optax_case(const struct net *n)
{
	char dir[512], path[700], cmd[2048], name[160];
	size_t nx = (size_t)n->batch * (size_t)n->d;
	float *x = th_signed_floats(nx, 41), *t = th_signed_floats(nx, 42);
	char *spec = th_fmt("{\"name\": \"%s\", \"mlp\": {\"layers\": %d, \"d_model\": %d, \"d_hidden\": %d, "
	                    "\"activation\": \"%s\", \"residual\": true}, \"loss\": \"mse\", "
	                    "\"optimizer\": %s, \"init\": {\"seed\": 11, \"scale\": 0.3}}",
	                    n->name, n->layers, n->d, n->h, n->act, n->optimizer);
	json_t *m, *res, *ref, *rspec, *want, *got;
	json_error_t e;
	bool adam;
	int st, nclipped = 0;

	m = th_post_json(&D, "/v1/models?wait=true", spec, 200);
	free(spec);
	snprintf(path, sizeof path, "/v1/models/%s", n->name);
	{
		struct th_response r;

		json_decref(m);
		m = json_incref(th_get_json(&D, path, &r));
		th_response_free(&r);
	}
	adam = strncmp(th_str(th_obj(m, "optimizer"), "type"), "adam", 4) == 0;
	reference_inputs(n->name, dir, sizeof dir, x, t, nx);
	th_put_floats(&D, "x", x, (size_t)n->batch, (size_t)n->d, NULL);
	th_put_floats(&D, "t", t, (size_t)n->batch, (size_t)n->d, NULL);
	free(x);
	free(t);

	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", n->name);
	res = th_post_json(&D, path, "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 24}", 200);

	rspec = json_pack("{s:i, s:i, s:i, s:s, s:b, s:s, s:O, s:i, s:i, s:s+, s:s+, s:s+, s:s+,"
	                  " s:s+}",
	                  "layers", n->layers, "d_model", n->d, "d_hidden", n->h, "activation", n->act,
	                  "residual", 1, "loss", "mse", "optimizer", th_obj(m, "optimizer"),
	                  "batch", n->batch, "steps", STEPS, "w1", dir, "/w1.f32", "w2", dir,
	                  "/w2.f32", "inputs", dir, "/inputs.f32", "targets", dir, "/targets.f32",
	                  "out", dir, "/out");
	ck_assert_ptr_nonnull(rspec);
	snprintf(path, sizeof path, "%s/spec.json", dir);
	ck_assert_int_eq(json_dump_file(rspec, path, 0), 0);
	json_decref(rspec);
	snprintf(cmd, sizeof cmd, "python3 '%s/optax_reference.py' '%s'", th_py_dir(), path);
	st = system(cmd);
	ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	              "'%s' failed (status %d): it needs python3 with jax, jaxlib and optax "
	              "(scripts/deps.sh)", cmd, st);
	snprintf(path, sizeof path, "%s/out/result.json", dir);
	ref = json_load_file(path, 0, &e);
	ck_assert_msg(ref != NULL, "%s: %s", path, e.text);

	want = th_arr(ref, "losses");
	got = th_arr(res, "losses");
	ck_assert_uint_eq(json_array_size(want), STEPS);
	ck_assert_uint_eq(json_array_size(got), STEPS);
	for (size_t i = 0; i < STEPS; i++) {
		double g = json_number_value(json_array_get(got, i));
		double r = json_number_value(json_array_get(want, i));

		ck_assert_msg(fabs(g - r) <= REL * fabs(r), "%s: loss of step %zu: %.9g, optax %.9g",
		              n->name, i + 1, g, r);
		nclipped += json_is_true(json_array_get(th_arr(ref, "clipped"), i));
	}
	/* clipping is exercised: the first steps' norms are above the bound */
	ck_assert_msg(json_is_true(json_array_get(th_arr(ref, "clipped"), 0)) && nclipped >= 4,
	              "%s: optax clipped %d of %d steps: norms %s", n->name, nclipped, STEPS,
	              json_dumps(th_arr(ref, "grad_norms"), 0));
	ck_assert_msg(json_number_value(json_array_get(got, STEPS - 1)) <
	              json_number_value(json_array_get(got, 0)), "%s: the loss did not go down",
	              n->name);
	for (size_t k = 0; k < (adam ? 6u : 2u); k++) {
		size_t ng, nr;
		float *a, *b;
		char what[200];

		snprintf(name, sizeof name, "%s.%s", n->name, adam_files[k][0]);
		a = th_download_floats(&D, name, &ng);
		snprintf(path, sizeof path, "%s/out/%s", dir, adam_files[k][1]);
		b = (float *)th_read_file(path, &nr);
		ck_assert_msg(b != NULL, "cannot read %s", path);
		snprintf(what, sizeof what, "'%s' after %d steps vs optax", name, STEPS);
		compare(what, a, ng, b, nr / sizeof *b);
		free(a);
		free(b);
	}
	json_decref(ref);
	json_decref(res);
	json_decref(m);
}

START_TEST(test_sgd_clipped)
{
	static const struct net n = {"sgd", 3, 16, 24, 8, "tanh",
	                             "{\"type\": \"sgd\", \"learning_rate\": 0.05, "
	                             "\"clip_global_norm\": 0.5}"};

	optax_case(&n);
}
END_TEST

START_TEST(test_adam_clipped)
{
	static const struct net n = {"adam", 3, 16, 24, 8, "gelu",
	                             "{\"type\": \"adam\", \"learning_rate\": 0.003, "
	                             "\"clip_global_norm\": 1.0}"};

	optax_case(&n);
}
END_TEST

START_TEST(test_adamw_clipped)
{
	static const struct net n = {"adamw", 3, 16, 24, 8, "gelu",
	                             "{\"type\": \"adamw\", \"learning_rate\": 0.003, "
	                             "\"weight_decay\": 0.1, \"clip_global_norm\": 1.0}"};

	optax_case(&n);
}
END_TEST

/* optax.adamw's default weight decay (1e-4) and a warmup then cosine decay
 * that ends inside the run (end_value from step 21 on). */
START_TEST(test_adamw_warmup_cosine)
{
	static const struct net n = {"adamwc", 3, 16, 24, 8, "relu",
	                             "{\"type\": \"adamw\", \"clip_global_norm\": 1.0, \"schedule\": "
	                             "{\"type\": \"warmup_cosine_decay\", \"init_value\": 0.0001, "
	                             "\"peak_value\": 0.005, \"warmup_steps\": 5, "
	                             "\"decay_steps\": 20, \"end_value\": 0.0005}}"};

	optax_case(&n);
}
END_TEST


/* ---- mixed precision ---------------------------------------------------------------- */

static const char *const octet_headers[] = {"Content-Type: application/octet-stream", NULL};

/* :evaluate?wait=true of model on x and t: its loss. */
static double evaluate_loss(const char *model)
{
	char path[300];
	json_t *r;
	double loss;

	snprintf(path, sizeof path, "/v1/models/%s:evaluate?wait=true", model);
	r = th_post_json(&D, path, "{\"inputs\": \"x\", \"targets\": \"t\"}", 200);
	loss = json_number_value(json_object_get(r, "loss"));
	json_decref(r);
	return loss;
}

/* The largest |got - want| / |want| over the two loss curves (or any two
 * arrays of per-step numbers: the global norms). */
static double worst_loss(json_t *got, json_t *want)
{
	double worst = 0;

	ck_assert_uint_eq(json_array_size(got), json_array_size(want));
	for (size_t i = 0; i < json_array_size(want); i++) {
		double g = json_number_value(json_array_get(got, i));
		double r = json_number_value(json_array_get(want, i));

		worst = fmax(worst, fabs(g - r) / fabs(r));
	}
	return worst;
}

/* The daemon's arrays (files[k][0], of model) against the reference's
 * files[k][1] in out<tag>: the largest difference, each within rel. */
static double compare_files(const char *model, const char *const (*files)[2], size_t n,
                            const char *dir, const char *tag, double rel, const char *when)
{
	double worst = 0;

	for (size_t k = 0; k < n; k++) {
		char name[160], path[700], what[300];
		size_t ng, nr;
		float *a, *b;

		snprintf(name, sizeof name, "%s.%s", model, files[k][0]);
		a = th_download_floats(&D, name, &ng);
		snprintf(path, sizeof path, "%s/out%s/%s", dir, tag, files[k][1]);
		b = (float *)th_read_file(path, &nr);
		ck_assert_msg(b != NULL, "cannot read %s", path);
		snprintf(what, sizeof what, "'%s' %s vs JAX (%s)", name, when, *tag ? tag + 1 : "rounded");
		worst = fmax(worst, compare_rel(what, a, ng, b, nr / sizeof *b, rel));
		free(a);
		free(b);
	}
	return worst;
}

static const char *const grad_files[][2] = {{"grad.w1", "grad_w1.f32"}, {"grad.w2", "grad_w2.f32"}};

/* Gradients of the rounded model against jax.grad of the same: float32
 * accumulation of exact products (K = 8 rows, 16 or 24 terms a sum). */
#define GRAD_REL 1e-5

/*
 * A bfloat16 (or float16) model - 3 residual gelu layers, Adam with
 * clipping - against JAX from the same weights and batch, JAX's matmuls
 * being jnp.matmul(a.astype(dt), b.astype(dt), preferred_element_type=
 * jnp.float32) (py/optax_reference.py), with the backward products that
 * same expression ("rounded", a custom_vjp: the daemon's definition):
 *
 * - the gradients at the initial weights (a twin with optimizer none)
 *   within GRAD_REL of jax.grad's: the products of rounded operands are
 *   exact in float32 on both sides, only the order of float32 sums
 *   differs. The float32 model's gradients are more than 10 GRAD_REL away:
 *   the check sees the rounding.
 * - STEPS losses and the final weights and moments within rel_curve. Here
 *   the two runs drift: a float32 sum a few ulps off that lands across a
 *   rounding boundary becomes an operand one unit of the compute dtype off
 *   (2^-8 relative for bfloat16, which has 8 bits of mantissa; 2^-11 for
 *   float16), and Adam, scaling each update by 1/sqrt(nu), passes that on
 *   to small gradients whole. rel_curve is four such units.
 * - with rel_jax > 0, the same against jax.grad of the expression itself
 *   (its transpose rule keeps the cotangent float32 and rounds the operand
 *   gradients to dt instead), within rel_jax. Not for float16, whose range
 *   JAX's rounded gradients underflow without loss scaling.
 *
 * Also: GET and the checkpoint carry the dtype (export, import under
 * another name, the same :evaluate loss), :evaluate computes with it (the
 * first step's loss, bit for bit), and the measured temps equal the plan's.
 */
static void lowp_case(const char *model, const char *dtype, double rel_curve, double rel_jax)
{
	const int L = 3, d = 16, h = 24, B = 8;
	const char *spec_fmt = "{\"name\": \"%s%s\", \"mlp\": {\"layers\": %d, \"d_model\": %d, "
	                       "\"d_hidden\": %d, \"activation\": \"gelu\", \"residual\": true}, "
	                       "\"dtype\": \"%s\", \"loss\": \"mse\", \"optimizer\": %s, "
	                       "\"init\": {\"seed\": 11, \"scale\": 0.3}}";
	const char *opt = "{\"type\": \"adam\", \"learning_rate\": 0.003, \"clip_global_norm\": 1.0}";
	char dir[512], path[700], imported[160], grads[160];
	size_t nx = (size_t)B * d;
	float *x = th_signed_floats(nx, 41), *t = th_signed_floats(nx, 42);
	char *spec;
	json_t *m, *res, *ref, *rspec;
	double eval0, g_round, g_f32, l_round, s_round, l_jax = 0, s_jax = 0;
	struct th_response r;
	char *file;
	size_t len;

	spec = th_fmt(spec_fmt, model, "", L, d, h, dtype, opt);
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	spec = th_fmt(spec_fmt, model, "g", L, d, h, dtype, "{\"type\": \"none\"}");
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	snprintf(grads, sizeof grads, "%sg", model);
	snprintf(path, sizeof path, "/v1/models/%s", model);
	m = json_incref(th_get_json(&D, path, &r));
	th_response_free(&r);
	ck_assert_str_eq(th_str(m, "dtype"), dtype);
	reference_inputs(model, dir, sizeof dir, x, t, nx);
	th_put_floats(&D, "x", x, (size_t)B, (size_t)d, NULL);
	th_put_floats(&D, "t", t, (size_t)B, (size_t)d, NULL);
	free(x);
	free(t);

	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", grads);
	json_decref(th_post_json(&D, path, "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 1}",
	                         200));
	eval0 = evaluate_loss(model);
	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", model);
	res = th_post_json(&D, path, "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 24}", 200);
	ck_assert_int_eq(th_int(res, "measured_temp_size_in_bytes"),
	                 th_int(res, "predicted_temp_size_in_bytes"));
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	ck_assert_msg(json_number_value(json_array_get(th_arr(res, "losses"), 0)) == eval0,
	              "%s: the first step's loss %.9g is not :evaluate's %.9g", dtype,
	              json_number_value(json_array_get(th_arr(res, "losses"), 0)), eval0);
	ck_assert_msg(json_number_value(json_array_get(th_arr(res, "losses"), STEPS - 1)) <
	              json_number_value(json_array_get(th_arr(res, "losses"), 0)),
	              "%s: the loss did not go down", dtype);

	rspec = json_pack("{s:i, s:i, s:i, s:s, s:b, s:s, s:O, s:i, s:i, s:s+, s:s+, s:s+, s:s+,"
	                  " s:s+, s:s, s:s}",
	                  "layers", L, "d_model", d, "d_hidden", h, "activation", "gelu",
	                  "residual", 1, "loss", "mse", "optimizer", th_obj(m, "optimizer"),
	                  "batch", B, "steps", STEPS, "w1", dir, "/w1.f32", "w2", dir, "/w2.f32",
	                  "inputs", dir, "/inputs.f32", "targets", dir, "/targets.f32",
	                  "out", dir, "/out", "dtype", dtype, "vjp", "rounded");
	ck_assert_ptr_nonnull(rspec);
	ref = run_reference(dir, rspec, "");
	allow_gpu_sums(dtype, 0.05);
	g_round = compare_files(grads, grad_files, 2, dir, "", GRAD_REL, "at the initial weights");
	gpu_unit = 0;   /* everything else: none */
	l_round = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
	ck_assert_msg(l_round <= rel_curve, "%s: losses off by %.3g from JAX's, tolerance %.3g",
	              dtype, l_round, rel_curve);
	s_round = compare_files(model, adam_files, 6, dir, "", rel_curve, "after 24 steps");
	json_decref(ref);
	if (rel_jax > 0) {
		snprintf(path, sizeof path, "%s/out_jax", dir);
		json_object_set_new(rspec, "out", json_string(path));
		json_object_set_new(rspec, "vjp", json_string("jax"));
		ref = run_reference(dir, rspec, "_jax");
		l_jax = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
		ck_assert_msg(l_jax <= rel_jax, "%s: losses off by %.3g from jax.grad's, tolerance "
		              "%.3g", dtype, l_jax, rel_jax);
		s_jax = compare_files(model, adam_files, 6, dir, "_jax", rel_jax, "after 24 steps");
		json_decref(ref);
	}
	snprintf(path, sizeof path, "%s/out_f32", dir);
	json_object_set_new(rspec, "out", json_string(path));
	json_object_set_new(rspec, "dtype", json_string("float32"));
	json_decref(run_reference(dir, rspec, "_f32"));
	json_decref(rspec);
	g_f32 = compare_files(grads, grad_files, 2, dir, "_f32", 1.0, "at the initial weights");
	ck_assert_msg(g_f32 > 10 * GRAD_REL, "%s: gradients within %.3g of the float32 model's: "
	              "the check cannot see the rounding", dtype, g_f32);
	fprintf(stderr, "%s vs JAX: gradients off by %.3g (the float32 model's by %.3g); over %d "
	        "Adam steps losses by %.3g, state by %.3g; jax.grad's own rule: %.3g, %.3g\n",
	        dtype, g_round, g_f32, STEPS, l_round, s_round, l_jax, s_jax);
	json_decref(res);

	/* the checkpoint carries the dtype */
	snprintf(path, sizeof path, "/v1/models/%s:export", model);
	th_get(&D, path, &r);
	ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
	len = r.body_len;
	file = malloc(len);
	ck_assert_ptr_nonnull(file);
	memcpy(file, r.body, len);
	th_response_free(&r);
	snprintf(imported, sizeof imported, "%s_i", model);
	snprintf(path, sizeof path, "/v1/models:import?name=%s", imported);
	th_request(&D, "POST", path, octet_headers, file, len, &r);
	ck_assert_msg(r.status == 201, "import: %ld %s", r.status, r.body);
	th_response_free(&r);
	free(file);
	json_decref(m);
	snprintf(path, sizeof path, "/v1/models/%s", imported);
	m = json_incref(th_get_json(&D, path, &r));
	th_response_free(&r);
	ck_assert_str_eq(th_str(m, "dtype"), dtype);
	json_decref(m);
	ck_assert(evaluate_loss(imported) == evaluate_loss(model));
}

START_TEST(test_bfloat16_adam_vs_jax)
{
	/* four bfloat16 units (2^-8) for the same definition, eight for JAX's
	 * own transpose rule (its gradients rounded to bfloat16 too) */
	lowp_case("bf", "bfloat16", 4.0 / 256, 8.0 / 256);
}
END_TEST

START_TEST(test_float16_adam_vs_jax)
{
	/* float16 keeps 11 bits: four units of 2^-11 */
	lowp_case("hf", "float16", 4.0 / 2048, 0);
}
END_TEST

/* The analysis counts the rounded copies: the guide's model in bfloat16
 * needs its largest product's two copies (h [256, 1024] and w2 [1024,
 * 256], 2 bytes an element: 1 MiB) more temp than in float32, arguments
 * and outputs unchanged. */
START_TEST(test_bfloat16_analysis_counts_the_copies)
{
	const char *body = "{\"model\": {\"mlp\": {\"layers\": 10, \"d_model\": 256, "
	                   "\"d_hidden\": 1024, \"activation\": \"relu\"}, \"loss\": \"sum\", "
	                   "\"dtype\": \"%s\"}, \"batch\": [256, 256]}";
	char *b32 = th_fmt(body, "float32"), *b16 = th_fmt(body, "bfloat16");
	json_t *a32 = th_post_json(&D, "/v1/models:analyze", b32, 200);
	json_t *a16 = th_post_json(&D, "/v1/models:analyze", b16, 200);

	ck_assert_int_eq(th_int(a16, "temp_size_in_bytes"),
	                 th_int(a32, "temp_size_in_bytes") + 1024 * 1024);
	ck_assert_int_eq(th_int(a16, "argument_size_in_bytes"), th_int(a32, "argument_size_in_bytes"));
	ck_assert_int_eq(th_int(a16, "output_size_in_bytes"), th_int(a32, "output_size_in_bytes"));
	json_decref(a32);
	json_decref(a16);
	free(b32);
	free(b16);
}
END_TEST

/* ---- a token model ------------------------------------------------------------------ */

#define TV 37         /* vocabulary */
#define TB 4          /* rows of ids */
#define TT 8          /* ids per row: TB * TT rows of the step */

static void upload_ids(const char *name, const int32_t *ids)
{
	struct th_response r;
	char path[256];

	snprintf(path, sizeof path, "/v1/arrays/%s?dtype=int32&shape=%d,%d", name, TB, TT);
	th_request(&D, "PUT", path, NULL, (const char *)ids, TB * TT * sizeof *ids, &r);
	ck_assert_msg(r.status == 201 || r.status == 200, "PUT %s: %ld %s", path, r.status, r.body);
	th_response_free(&r);
}

/* Downloads name's array and compares it with the reference's file. */
static void compare_file(const char *name, const char *dir, const char *file, const char *when)
{
	char path[700], what[300];
	size_t ng, nr;
	float *a = th_download_floats(&D, name, &ng), *b;

	snprintf(path, sizeof path, "%s/out/%s", dir, file);
	b = (float *)th_read_file(path, &nr);
	ck_assert_msg(b != NULL, "cannot read %s", path);
	snprintf(what, sizeof what, "'%s' %s vs optax", name, when);
	compare(what, a, ng, b, nr / sizeof *b);
	free(a);
	free(b);
}

/*
 * Embedding table, two residual gelu layers, output projection, softmax
 * cross-entropy against int32 ids (repeated ones among them), Adam with
 * clipping: STEPS losses and the final weights and moments against optax,
 * and the gradients at the initial weights (a twin with optimizer none,
 * the same init) against jax.grad.
 */
START_TEST(test_tokens_adam_clipped)
{
	static const char *const files[][2] = {
		{"embed", "embed.f32"}, {"proj", "proj.f32"}, {"w1", "w1.f32"}, {"w2", "w2.f32"},
		{"adam.mu.embed", "mu_embed.f32"}, {"adam.nu.embed", "nu_embed.f32"},
		{"adam.mu.proj", "mu_proj.f32"}, {"adam.nu.proj", "nu_proj.f32"},
		{"adam.mu.w1", "mu_w1.f32"}, {"adam.nu.w1", "nu_w1.f32"},
	};
	static const char *const grads[][2] = {
		{"embed", "grad_embed.f32"}, {"proj", "grad_proj.f32"}, {"w1", "grad_w1.f32"},
		{"w2", "grad_w2.f32"},
	};
	const char *spec_fmt =
		"{\"name\": \"%s\", \"mlp\": {\"layers\": 2, \"d_model\": 16, \"d_hidden\": 24, "
		"\"activation\": \"gelu\", \"residual\": true, \"vocab\": %d, \"projection\": true}, "
		"\"loss\": \"softmax_cross_entropy\", \"optimizer\": %s, "
		"\"init\": {\"seed\": 13, \"scale\": 0.5}}";
	const char *opt = "{\"type\": \"adam\", \"learning_rate\": 0.01, \"clip_global_norm\": 0.3}";
	int32_t ids[TB * TT], tg[TB * TT];
	uint64_t seed = 77;
	char dir[512], path[700], cmd[2048], name[160], *spec;
	json_t *m, *res, *ref, *rspec, *want, *got;
	json_error_t e;
	int st, nclipped = 0;

	for (int i = 0; i < TB * TT; i++) {
		ids[i] = (int32_t)(th_rand(&seed) % 12);     /* 12 of 37 ids, each many times */
		tg[i] = (int32_t)(th_rand(&seed) % TV);
	}
	spec = th_fmt(spec_fmt, "tok", TV, opt);
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	spec = th_fmt(spec_fmt, "tokg", TV, "{\"type\": \"none\"}");
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	{
		struct th_response r;

		m = json_incref(th_get_json(&D, "/v1/models/tok", &r));
		th_response_free(&r);
	}
	th_temp_dir("tok", dir, sizeof dir);
	for (size_t k = 0; k < 4; k++) {
		size_t nw;
		float *w;

		snprintf(name, sizeof name, "tok.%s", files[k][0]);
		w = th_download_floats(&D, name, &nw);
		snprintf(path, sizeof path, "%s/%s", dir, files[k][1]);
		th_write_file(path, w, nw * sizeof *w);
		free(w);
	}
	snprintf(path, sizeof path, "%s/inputs.i32", dir);
	th_write_file(path, ids, sizeof ids);
	snprintf(path, sizeof path, "%s/targets.i32", dir);
	th_write_file(path, tg, sizeof tg);
	upload_ids("ids", ids);
	upload_ids("labels", tg);

	res = th_post_json(&D, "/v1/models/tokg:step?wait=true",
	                   "{\"inputs\": \"ids\", \"targets\": \"labels\", \"steps\": 1}", 200);
	json_decref(res);
	res = th_post_json(&D, "/v1/models/tok:step?wait=true",
	                   "{\"inputs\": \"ids\", \"targets\": \"labels\", \"steps\": 24}", 200);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));

	rspec = json_pack("{s:i, s:i, s:i, s:s, s:b, s:s, s:O, s:i, s:i, s:i, s:b,"
	                  " s:s+, s:s+, s:s+, s:s+, s:s+, s:s+, s:s+}",
	                  "layers", 2, "d_model", 16, "d_hidden", 24, "activation", "gelu",
	                  "residual", 1, "loss", "softmax_cross_entropy",
	                  "optimizer", th_obj(m, "optimizer"), "batch", TB * TT, "steps", STEPS,
	                  "vocab", TV, "projection", 1,
	                  "w1", dir, "/w1.f32", "w2", dir, "/w2.f32", "embed", dir, "/embed.f32",
	                  "proj", dir, "/proj.f32", "inputs", dir, "/inputs.i32",
	                  "targets", dir, "/targets.i32", "out", dir, "/out");
	ck_assert_ptr_nonnull(rspec);
	snprintf(path, sizeof path, "%s/spec.json", dir);
	ck_assert_int_eq(json_dump_file(rspec, path, 0), 0);
	json_decref(rspec);
	snprintf(cmd, sizeof cmd, "python3 '%s/optax_reference.py' '%s'", th_py_dir(), path);
	st = system(cmd);
	ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	              "'%s' failed (status %d): it needs python3 with jax, jaxlib and optax "
	              "(scripts/deps.sh)", cmd, st);
	snprintf(path, sizeof path, "%s/out/result.json", dir);
	ref = json_load_file(path, 0, &e);
	ck_assert_msg(ref != NULL, "%s: %s", path, e.text);
	want = th_arr(ref, "losses");
	got = th_arr(res, "losses");
	ck_assert_uint_eq(json_array_size(got), STEPS);
	for (size_t i = 0; i < STEPS; i++) {
		double g = json_number_value(json_array_get(got, i));
		double r = json_number_value(json_array_get(want, i));

		ck_assert_msg(fabs(g - r) <= REL * fabs(r), "tokens: loss of step %zu: %.9g, optax %.9g",
		              i + 1, g, r);
		nclipped += json_is_true(json_array_get(th_arr(ref, "clipped"), i));
	}
	ck_assert_msg(nclipped >= 4, "tokens: optax clipped %d of %d steps", nclipped, STEPS);
	ck_assert_msg(json_number_value(json_array_get(got, STEPS - 1)) <
	              json_number_value(json_array_get(got, 0)) - 0.1, "tokens: the loss did not go down");
	for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
		snprintf(name, sizeof name, "tok.%s", files[k][0]);
		compare_file(name, dir, files[k][1], "after 24 steps");
	}
	for (size_t k = 0; k < sizeof grads / sizeof grads[0]; k++) {
		snprintf(name, sizeof name, "tokg.grad.%s", grads[k][0]);
		compare_file(name, dir, grads[k][1], "at the initial weights (jax.grad)");
	}
	json_decref(ref);
	json_decref(res);
	json_decref(m);
}
END_TEST

/* ---- the GPT kind against a jax.numpy GPT-2 ---------------------------------------- */

/* py/gpt_reference.py's files of the weights, by the daemon's role. */
static const char *const gpt_files[][2] = {
	{"wte", "wte.f32"}, {"wpe", "wpe.f32"}, {"ln1.g", "ln1_g.f32"}, {"ln1.b", "ln1_b.f32"},
	{"attn.qkv.w", "attn_qkv_w.f32"}, {"attn.qkv.b", "attn_qkv_b.f32"},
	{"attn.o.w", "attn_o_w.f32"}, {"attn.o.b", "attn_o_b.f32"}, {"ln2.g", "ln2_g.f32"},
	{"ln2.b", "ln2_b.f32"}, {"mlp.fc.w", "mlp_fc_w.f32"}, {"mlp.fc.b", "mlp_fc_b.f32"},
	{"mlp.proj.w", "mlp_proj_w.f32"}, {"mlp.proj.b", "mlp_proj_b.f32"},
	{"lnf.g", "lnf_g.f32"}, {"lnf.b", "lnf_b.f32"},
};
#define GPT_NW (sizeof gpt_files / sizeof gpt_files[0])

enum { GV = 61, GC = 16, GL = 2, GD = 32, GH = 4, GF = 64, GB = 4, GSTEPS = 10 };

/* The key third of attn.qkv.b: a bias added to every key of a head moves a
 * query's scores by one constant, which the softmax ignores, so its
 * gradient is 0 in exact arithmetic and rounding noise on both sides; Adam
 * scales noise to steps of the learning rate's size, differently on each.
 * It changes no output (the losses and logits agree); its elements are
 * left out of the weight and moment comparisons (zeroed in both). */
static void mask_key_bias(float *x, size_t n)
{
	for (size_t l = 0; l < GL; l++)
		for (size_t i = 0; i < GD && (l * 3 + 1) * GD + i < n; i++)
			x[(l * 3 + 1) * GD + i] = 0.0f;
}

/* The daemon's "{model}.{name}" against the reference's out/{file}, within
 * rel of the largest magnitude, the key bias masked; the largest difference. */
static double compare_masked(const char *model, const char *name, const char *dir,
                             const char *file)
{
	char an[160], path[700], what[300];
	size_t ng, nr;
	float *a, *b;
	double w;

	snprintf(an, sizeof an, "%s.%s", model, name);
	a = th_download_floats(&D, an, &ng);
	snprintf(path, sizeof path, "%s/out/%s", dir, file);
	b = (float *)th_read_file(path, &nr);
	ck_assert_msg(b != NULL, "cannot read %s", path);
	mask_key_bias(a, ng);
	mask_key_bias(b, nr / sizeof *b);
	snprintf(what, sizeof what, "'%s' after %d steps vs JAX (key bias masked)", an, GSTEPS);
	w = compare_rel(what, a, ng, b, nr / sizeof *b, 1e-4);
	free(a);
	free(b);
	return w;
}

/* Writes the model's weights into dir (file per weight) and the windows'
 * inputs and targets (int32 [GB, GC]) as arrays "gx", "gt" and files. */
static void gpt_inputs(const char *model, const char *dir, int32_t *in, int32_t *tg)
{
	unsigned s = 97;
	char name[160], path[700];
	struct th_response r;

	for (size_t k = 0; k < GPT_NW; k++) {
		size_t n;
		float *w;

		snprintf(name, sizeof name, "%s.%s", model, gpt_files[k][0]);
		w = th_download_floats(&D, name, &n);
		snprintf(path, sizeof path, "%s/%s", dir, gpt_files[k][1]);
		th_write_file(path, w, n * sizeof *w);
		free(w);
	}
	for (int i = 0; i < GB * (GC + 1); i++) {
		s = s * 1664525u + 1013904223u;
		in[i] = (int32_t)((s >> 8) % GV);
	}
	/* windows of GC + 1 tokens: inputs the first GC, targets the last GC */
	for (int b = 0; b < GB; b++)
		for (int t = 0; t < GC; t++) {
			tg[b * GC + t] = in[b * (GC + 1) + t + 1];
			in[b * GC + t] = in[b * (GC + 1) + t];
		}
	snprintf(path, sizeof path, "%s/inputs.i32", dir);
	th_write_file(path, in, GB * GC * sizeof *in);
	snprintf(path, sizeof path, "%s/targets.i32", dir);
	th_write_file(path, tg, GB * GC * sizeof *tg);
	for (int k = 0; k < 2; k++) {
		snprintf(path, sizeof path, "/v1/arrays/%s?dtype=int32&shape=%d,%d", k ? "gt" : "gx",
		         GB, GC);
		th_request(&D, "PUT", path, NULL, (const char *)(k ? tg : in), GB * GC * sizeof *in,
		           &r);
		ck_assert_msg(r.status == 201 || r.status == 200, "PUT %s: %ld %s", path, r.status,
		              r.body);
		th_response_free(&r);
	}
}


/* The GPT's arrays of one kind (the weights: prefixes "" and ""; Adam's
 * moments: "adam.mu." and "mu_", ...) against the reference's files within
 * 1e-4 of their largest, attn.qkv.b (index 5) with its key third masked:
 * the worst. */
static double compare_gpt(const char *model, const char *dir, const char *array_pfx,
                          const char *file_pfx, const char *when)
{
	char names[GPT_NW][2][64];
	const char *files[GPT_NW][2];
	double worst;

	for (size_t i = 0; i < GPT_NW; i++) {
		snprintf(names[i][0], sizeof names[i][0], "%s%s", array_pfx, gpt_files[i][0]);
		snprintf(names[i][1], sizeof names[i][1], "%s%s", file_pfx, gpt_files[i][1]);
		files[i][0] = names[i][0];
		files[i][1] = names[i][1];
	}
	worst = compare_files(model, (const char *const (*)[2])files, 5, dir, "", 1e-4, when);
	worst = fmax(worst, compare_files(model, (const char *const (*)[2])files + 6, GPT_NW - 6,
	                                  dir, "", 1e-4, when));
	return fmax(worst, compare_masked(model, files[5][0], dir, files[5][1]));
}

/* A GPT, trained GSTEPS AdamW steps (weight decay on the matrices only,
 * nanoGPT's choice) with clipping and a warmup-cosine schedule on the daemon and in gpt_reference.py from the same initial
 * weights and windows: every loss within 1e-5 relative, the weights and
 * Adam's moments within 1e-4 of their largest magnitude; the gradients at
 * the initial weights (a twin without an optimizer) within 1e-5 of theirs;
 * an evaluation's logits within 1e-5; then export, import as another model,
 * and one more step of each: the same loss, bit for bit. */
START_TEST(test_gpt_adamw_vs_jax)
{
	static const char *const spec_fmt =
		"{\"name\": \"%s\", \"gpt\": {\"vocab\": %d, \"context\": %d, \"layers\": %d, "
		"\"d_model\": %d, \"heads\": %d, \"d_ff\": %d}, \"init\": {\"seed\": 5, "
		"\"scale\": 0.1}, \"optimizer\": %s}";
	static const char *const opt =
		"{\"type\": \"adamw\", \"weight_decay\": 0.1, \"decay\": \"matrices\", "
		"\"clip_global_norm\": 1.0, "
		"\"b1\": 0.9, \"b2\": 0.95, \"eps\": 1e-8, \"schedule\": {\"type\": "
		"\"warmup_cosine_decay\", \"init_value\": 0.0, \"peak_value\": 0.01, "
		"\"warmup_steps\": 3, \"decay_steps\": 10, \"end_value\": 0.001}}";
	int32_t in[GB * (GC + 1)], tg[GB * GC];
	char dir[512], path[700], *spec;
	json_t *res, *ref, *rspec, *ev;
	double l_worst, w_worst, g_worst, lg_worst;
	size_t ng, nr;
	float *a, *b;
	char *file;
	size_t len;
	struct th_response r;

	spec = th_fmt(spec_fmt, "gp", GV, GC, GL, GD, GH, GF, opt);
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	spec = th_fmt(spec_fmt, "gpg", GV, GC, GL, GD, GH, GF, "{\"type\": \"none\"}");
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	th_temp_dir("gpt", dir, sizeof dir);
	gpt_inputs("gpg", dir, in, tg);
	/* the twin shares the first model's initial weights (the same seed) */
	json_decref(th_post_json(&D, "/v1/models/gpg:step?wait=true",
	                         "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 1}", 200));
	res = th_post_json(&D, "/v1/models/gp:step?wait=true",
	                   "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 10}", 200);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	ev = th_post_json_on_backend(&D, "/v1/models/gp:evaluate?wait=true",
	                             "{\"inputs\": \"gx\", \"targets\": \"gt\", \"outputs\": "
	                             "{\"name\": \"glog\", \"device\": \"sim:0\", "
	                             "\"memory_kind\": \"pinned_host\"}}",
	                             200);

	rspec = json_pack("{s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:s+, s:s+, s:i, s:o, s:s+, s:s+,"
	                  " s:i, s:i, s:b, s:b, s:{s:s}}",
	                  "gpt", "vocab", GV, "context", GC, "layers", GL, "d_model", GD, "heads", GH,
	                  "d_ff", GF, "weights", dir, "", "out", dir, "/out", "steps", GSTEPS,
	                  "optimizer", json_loads(opt, 0, NULL),
	                  "inputs", dir, "/inputs.i32", "targets", dir, "/targets.i32",
	                  "batch", GB, "tokens", GC, "grads", 1, "adam_state", 1,
	                  "evaluate", "positions", "all");
	ck_assert_ptr_nonnull(rspec);
	ck_assert_ptr_nonnull(json_object_get(rspec, "optimizer"));
	ref = run_script("gpt_reference.py", dir, rspec, "");
	l_worst = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
	ck_assert_msg(l_worst <= 1e-5, "gpt losses off by %.3g relative from JAX's", l_worst);
	{
		double el = json_number_value(json_object_get(ev, "loss"));
		double rl = json_number_value(json_object_get(ref, "eval_loss"));

		ck_assert_msg(fabs(el - rl) <= 1e-5 * fabs(rl), "evaluate after the steps: %.9g, JAX "
		              "%.9g", el, rl);
	}
	json_decref(ev);
	/* every weight but attn.qkv.b (index 5), then it with its key third masked */
	w_worst = compare_gpt("gp", dir, "", "", "after 10 steps");
	w_worst = fmax(w_worst, compare_gpt("gp", dir, "adam.mu.", "mu_", "after 10 steps"));
	w_worst = fmax(w_worst, compare_gpt("gp", dir, "adam.nu.", "nu_", "after 10 steps"));
	{
		char names[GPT_NW][2][64];
		const char *files[GPT_NW][2];

		for (size_t i = 0; i < GPT_NW; i++) {
			snprintf(names[i][0], sizeof names[i][0], "grad.%s", gpt_files[i][0]);
			snprintf(names[i][1], sizeof names[i][1], "grad_%s", gpt_files[i][1]);
			files[i][0] = names[i][0];
			files[i][1] = names[i][1];
		}
		g_worst = compare_files("gpg", (const char *const (*)[2])files, GPT_NW, dir, "", 1e-5,
		                        "at the initial weights");
	}
	/* the logits [GB, GC, GV] after the steps */
	a = th_download_floats(&D, "glog", &ng);
	snprintf(path, sizeof path, "%s/out/logits.f32", dir);
	b = (float *)th_read_file(path, &nr);
	ck_assert_msg(b != NULL, "cannot read %s", path);
	lg_worst = compare_rel("logits after 10 steps", a, ng, b, nr / sizeof *b, 1e-4);
	free(a);
	free(b);

	/* export, import as another model, one more step of each: the same bits */
	th_get(&D, "/v1/models/gp:export", &r);
	ck_assert_msg(r.status == 200, "export: %ld", r.status);
	len = r.body_len;
	file = malloc(len);
	ck_assert_ptr_nonnull(file);
	memcpy(file, r.body, len);
	th_response_free(&r);
	th_request(&D, "POST", "/v1/models:import?name=gp2", octet_headers, file, len, &r);
	ck_assert_msg(r.status == 201, "import: %ld %s", r.status, r.body);
	th_response_free(&r);
	free(file);
	{
		json_t *x = th_post_json(&D, "/v1/models/gp:step?wait=true",
		                         "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 1}",
		                         200);
		json_t *y = th_post_json(&D, "/v1/models/gp2:step?wait=true",
		                         "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 1}",
		                         200);

		ck_assert(json_number_value(json_array_get(th_arr(x, "losses"), 0)) ==
		          json_number_value(json_array_get(th_arr(y, "losses"), 0)));
		json_decref(x);
		json_decref(y);
	}
	fprintf(stderr, "gpt vs JAX: losses over %d AdamW steps off by %.3g relative, weights and "
	        "moments by %.3g of their largest, gradients by %.3g, logits by %.3g\n", GSTEPS,
	        l_worst, w_worst, g_worst, lg_worst);
	json_decref(res);
	json_decref(ref);
	json_decref(rspec);
}
END_TEST

/* The daemon's "{model}.{pre}{role}" against out{tag}/{fpre}{file} of the
 * reference for every GPT weight, each within rel of its largest magnitude,
 * the key third of attn.qkv.b masked (mask_key_bias); the largest
 * difference. */
static double gpt_compare_all(const char *model, const char *pre, const char *fpre,
                              const char *dir, const char *tag, double rel, const char *when)
{
	double worst = 0;

	for (size_t k = 0; k < GPT_NW; k++) {
		char an[160], path[700], what[300];
		size_t ng, nr;
		float *a, *b;

		snprintf(an, sizeof an, "%s.%s%s", model, pre, gpt_files[k][0]);
		a = th_download_floats(&D, an, &ng);
		snprintf(path, sizeof path, "%s/out%s/%s%s", dir, tag, fpre, gpt_files[k][1]);
		b = (float *)th_read_file(path, &nr);
		ck_assert_msg(b != NULL, "cannot read %s", path);
		if (k == 5) {
			mask_key_bias(a, ng);
			mask_key_bias(b, nr / sizeof *b);
		}
		snprintf(what, sizeof what, "'%s' %s vs JAX (%s)", an, when, *tag ? tag + 1 : "rounded");
		worst = fmax(worst, compare_rel(what, a, ng, b, nr / sizeof *b, rel));
		free(a);
		free(b);
	}
	return worst;
}

/* A GPT's :evaluate loss on the windows gx, gt (gpt_inputs). */
static double gpt_eval_loss(const char *model)
{
	char path[300];
	json_t *r;
	double loss;

	snprintf(path, sizeof path, "/v1/models/%s:evaluate?wait=true", model);
	r = th_post_json(&D, path, "{\"inputs\": \"gx\", \"targets\": \"gt\"}", 200);
	loss = json_number_value(json_object_get(r, "loss"));
	json_decref(r);
	return loss;
}

/* Tolerances of a bfloat16 GPT against the reference's same expression
 * ("rounded"): the gradients at the initial weights (of each tensor's
 * largest magnitude), over GSTEPS AdamW steps the losses (relative), the
 * weights and Adam's moments (of their largest magnitude); against
 * jax.grad's own transpose rule ("jax") the losses. Measured on sim:
 * 3.4e-7, 2.7e-4, 2.7e-3 and 3.3e-2 (mu of ln1.b); 1.7e-3. */
#define GPT_BF16_GRAD 1e-5
#define GPT_BF16_LOSS (1.0 / 256)
#define GPT_BF16_WEIGHTS (4.0 / 256)
#define GPT_BF16_MOMENTS (16.0 / 256)
#define GPT_BF16_JAX (8.0 / 256)

/*
 * A bfloat16 GPT (every product, the attention's batched ones and the tied
 * head included, on operands rounded to bfloat16 with float32 sums; the
 * backward products the same, the cotangent rounded like any operand:
 * docs/API.md's definition) against gpt_reference.py's "dtype": "bfloat16",
 * "vjp": "rounded" - jax.grad of that custom_vjp expression - from the
 * same initial weights and windows, trained as test_gpt_adamw_vs_jax does:
 *
 * - the gradients at the initial weights (a twin without an optimizer)
 *   within GPT_BF16_GRAD of each tensor's largest: both sides multiply the
 *   same rounded operands exactly and sum in float32 (in other orders);
 *   the float32 model's gradients are more than ten times further away
 *   (the check sees the rounding);
 * - GSTEPS losses within GPT_BF16_LOSS relative, the weights within
 *   GPT_BF16_WEIGHTS (four bfloat16 units, as the MLP's) and Adam's
 *   moments within GPT_BF16_MOMENTS: past the first step the two runs'
 *   gradients drift apart by whole bfloat16 units now and then, and the
 *   moments of the small ones (LayerNorm shifts, biases) carry that whole;
 * - the loss curve against jax.grad of the plain expression (its rule
 *   keeps cotangents float32) within GPT_BF16_JAX; its weights are only
 *   reported (a LayerNorm shift drifts by 15% of its largest: another
 *   definition);
 * - the first step's loss is :evaluate's before it, bit for bit; the
 *   measured peak equals the plan's; GET and the checkpoint carry the dtype.
 */
START_TEST(test_gpt_bf16_vs_jax)
{
	static const char *const spec_fmt =
		"{\"name\": \"%s\", \"gpt\": {\"vocab\": %d, \"context\": %d, \"layers\": %d, "
		"\"d_model\": %d, \"heads\": %d, \"d_ff\": %d}, \"dtype\": \"bfloat16\", "
		"\"init\": {\"seed\": 5, \"scale\": 0.1}, \"optimizer\": %s}";
	static const char *const opt =
		"{\"type\": \"adamw\", \"weight_decay\": 0.1, \"decay\": \"matrices\", "
		"\"clip_global_norm\": 1.0, "
		"\"b1\": 0.9, \"b2\": 0.95, \"eps\": 1e-8, \"schedule\": {\"type\": "
		"\"warmup_cosine_decay\", \"init_value\": 0.0, \"peak_value\": 0.01, "
		"\"warmup_steps\": 3, \"decay_steps\": 10, \"end_value\": 0.001}}";
	int32_t in[GB * (GC + 1)], tg[GB * GC];
	char dir[512], path[700], *spec;
	json_t *res, *ref, *rspec, *m;
	double eval0, g_round, g_f32, l_round, w_round, s_round, l_jax, s_jax;
	struct th_response r;

	spec = th_fmt(spec_fmt, "gbf", GV, GC, GL, GD, GH, GF, opt);
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	spec = th_fmt(spec_fmt, "gbfg", GV, GC, GL, GD, GH, GF, "{\"type\": \"none\"}");
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	m = json_incref(th_get_json(&D, "/v1/models/gbf", &r));
	th_response_free(&r);
	ck_assert_str_eq(th_str(m, "dtype"), "bfloat16");
	json_decref(m);
	th_temp_dir("gptbf", dir, sizeof dir);
	gpt_inputs("gbfg", dir, in, tg);
	json_decref(th_post_json(&D, "/v1/models/gbfg:step?wait=true",
	                         "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 1}", 200));
	eval0 = gpt_eval_loss("gbf");
	res = th_post_json(&D, "/v1/models/gbf:step?wait=true",
	                   "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 10}", 200);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	ck_assert_int_eq(th_int(res, "measured_temp_size_in_bytes"),
	                 th_int(res, "predicted_temp_size_in_bytes"));
	ck_assert_msg(json_number_value(json_array_get(th_arr(res, "losses"), 0)) == eval0,
	              "the first step's loss %.9g is not :evaluate's %.9g",
	              json_number_value(json_array_get(th_arr(res, "losses"), 0)), eval0);

	rspec = json_pack("{s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:s+, s:s+, s:i, s:o, s:s+, s:s+,"
	                  " s:i, s:i, s:b, s:b, s:s, s:s}",
	                  "gpt", "vocab", GV, "context", GC, "layers", GL, "d_model", GD, "heads", GH,
	                  "d_ff", GF, "weights", dir, "", "out", dir, "/out", "steps", GSTEPS,
	                  "optimizer", json_loads(opt, 0, NULL),
	                  "inputs", dir, "/inputs.i32", "targets", dir, "/targets.i32",
	                  "batch", GB, "tokens", GC, "grads", 1, "adam_state", 1,
	                  "dtype", "bfloat16", "vjp", "rounded");
	ck_assert_ptr_nonnull(rspec);
	ck_assert_ptr_nonnull(json_object_get(rspec, "optimizer"));
	ref = run_script("gpt_reference.py", dir, rspec, "");
	allow_gpu_sums("bfloat16", 0.25);
	g_round = gpt_compare_all("gbfg", "grad.", "grad_", dir, "", GPT_BF16_GRAD,
	                          "at the initial weights");
	gpu_unit = 0;   /* everything else: none */
	l_round = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
	ck_assert_msg(l_round <= GPT_BF16_LOSS, "bfloat16 gpt: losses off by %.3g from JAX's, "
	              "tolerance %.3g", l_round, GPT_BF16_LOSS);
	w_round = gpt_compare_all("gbf", "", "", dir, "", GPT_BF16_WEIGHTS, "after 10 steps");
	s_round = gpt_compare_all("gbf", "adam.mu.", "mu_", dir, "", GPT_BF16_MOMENTS,
	                          "after 10 steps");
	s_round = fmax(s_round, gpt_compare_all("gbf", "adam.nu.", "nu_", dir, "",
	                                        GPT_BF16_MOMENTS, "after 10 steps"));
	json_decref(ref);

	snprintf(path, sizeof path, "%s/out_jax", dir);
	json_object_set_new(rspec, "out", json_string(path));
	json_object_set_new(rspec, "vjp", json_string("jax"));
	ref = run_script("gpt_reference.py", dir, rspec, "_jax");
	l_jax = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
	ck_assert_msg(l_jax <= GPT_BF16_JAX, "bfloat16 gpt: losses off by %.3g from jax.grad's, "
	              "tolerance %.3g", l_jax, GPT_BF16_JAX);
	s_jax = gpt_compare_all("gbf", "", "", dir, "_jax", 1.0, "after 10 steps");
	json_decref(ref);

	/* the float32 model's gradients, from the same weights and windows */
	snprintf(path, sizeof path, "%s/out_f32", dir);
	json_object_set_new(rspec, "out", json_string(path));
	json_object_set_new(rspec, "dtype", json_string("float32"));
	json_object_set_new(rspec, "steps", json_integer(0));
	json_object_del(rspec, "adam_state");
	json_decref(run_script("gpt_reference.py", dir, rspec, "_f32"));
	json_decref(rspec);
	g_f32 = gpt_compare_all("gbfg", "grad.", "grad_", dir, "_f32", 1.0, "at the initial weights");
	fprintf(stderr, "bfloat16 gpt vs JAX: gradients off by %.3g of their largest (the float32 "
	        "model's by %.3g); over %d AdamW steps losses by %.3g relative, weights by %.3g "
	        "and moments by %.3g of their largest; jax.grad's own rule: losses %.3g, weights "
	        "%.3g\n", g_round, g_f32, GSTEPS, l_round, w_round, s_round, l_jax, s_jax);
	ck_assert_msg(g_f32 > 10 * GPT_BF16_GRAD, "bfloat16 gpt: gradients %.3g from the float32 "
	              "model's: the check cannot see the rounding", g_f32);
	json_decref(res);

	/* the checkpoint carries the dtype: an import computes the same loss */
	{
		char *file;
		size_t len;

		th_get(&D, "/v1/models/gbf:export", &r);
		ck_assert_msg(r.status == 200, "export: %ld", r.status);
		len = r.body_len;
		file = malloc(len);
		ck_assert_ptr_nonnull(file);
		memcpy(file, r.body, len);
		th_response_free(&r);
		th_request(&D, "POST", "/v1/models:import?name=gbf2", octet_headers, file, len, &r);
		ck_assert_msg(r.status == 201, "import: %ld %s", r.status, r.body);
		th_response_free(&r);
		free(file);
		m = json_incref(th_get_json(&D, "/v1/models/gbf2", &r));
		th_response_free(&r);
		ck_assert_str_eq(th_str(m, "dtype"), "bfloat16");
		json_decref(m);
		ck_assert(gpt_eval_loss("gbf2") == gpt_eval_loss("gbf"));
	}
}
END_TEST

/* The same GPT trained on windows of one uint16 token stream (no second
 * copy of the data), sequential from a start and random, against the
 * reference's windows: the losses within 1e-5, the stream position where
 * the run stopped the reference's. */
START_TEST(test_gpt_windows_vs_jax)
{
	static const char *const spec =
		"{\"name\": \"gw\", \"gpt\": {\"vocab\": 61, \"context\": 16, \"layers\": 2, "
		"\"d_model\": 32, \"heads\": 4, \"d_ff\": 64}, \"init\": {\"seed\": 6, "
		"\"scale\": 0.1}, \"optimizer\": {\"type\": \"adamw\", \"learning_rate\": 0.01, "
		"\"weight_decay\": 0.1}}";
	enum { N = 333 };
	uint16_t stream[N];
	unsigned seed = 7;
	char dir[512], path[700], body[256], tag[16];
	struct th_response r;

	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	{
		char *spec2 = th_fmt("%s", spec);

		memcpy(strstr(spec2, "\"gw\""), "\"g2\"", 4);    /* a twin: the same seed */
		json_decref(th_post_json(&D, "/v1/models?wait=true", spec2, 200));
		free(spec2);
	}
	th_temp_dir("gptw", dir, sizeof dir);
	for (size_t k = 0; k < GPT_NW; k++) {
		char name[160];
		size_t n;
		float *w;

		snprintf(name, sizeof name, "gw.%s", gpt_files[k][0]);
		w = th_download_floats(&D, name, &n);
		snprintf(path, sizeof path, "%s/%s", dir, gpt_files[k][1]);
		th_write_file(path, w, n * sizeof *w);
		free(w);
	}
	for (int i = 0; i < N; i++) {
		seed = seed * 1664525u + 1013904223u;
		stream[i] = (uint16_t)((seed >> 8) % 61);
	}
	snprintf(path, sizeof path, "%s/stream.u16", dir);
	th_write_file(path, stream, sizeof stream);
	th_request(&D, "PUT", "/v1/arrays/stream?dtype=uint16&shape=333", NULL,
	           (const char *)stream, sizeof stream, &r);
	ck_assert_msg(r.status == 201 || r.status == 200, "PUT stream: %ld %s", r.status, r.body);
	th_response_free(&r);
	for (int o = 0; o < 2; o++) {
		const char *order = o ? "random" : "sequential";
		json_t *res, *ref, *rspec;
		double worst, nworst;

		snprintf(body, sizeof body, "{\"windows\": {\"array\": \"stream\", \"context\": 16, "
		         "\"batch_size\": 4, \"order\": \"%s\", \"seed\": 3, \"start\": 2}, "
		         "\"steps\": 3}", order);
		/* g2 starts from gw's initial weights (the same seed) */
		res = th_post_json(&D, o ? "/v1/models/g2:step?wait=true"
		                         : "/v1/models/gw:step?wait=true", body, 200);
		snprintf(tag, sizeof tag, "_%d", o);
		snprintf(path, sizeof path, "%s/out%s", dir, tag);
		rspec = json_pack("{s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:s+, s:s, s:i,"
		                  " s:{s:s, s:f, s:f}, s:{s:s+, s:i, s:i, s:s, s:i, s:i}}",
		                  "gpt", "vocab", 61, "context", 16, "layers", 2, "d_model", 32,
		                  "heads", 4, "d_ff", 64, "weights", dir, "", "out", path, "steps", 3,
		                  "optimizer", "type", "adamw", "learning_rate", 0.01,
		                  "weight_decay", 0.1,
		                  "windows", "stream", dir, "/stream.u16", "context", 16, "batch_size", 4,
		                  "order", order, "seed", 3, "start", 2);
		ck_assert_ptr_nonnull(rspec);
		ref = run_script("gpt_reference.py", dir, rspec, tag);
		worst = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
		ck_assert_msg(worst <= 1e-5, "gpt %s windows: losses off by %.3g", order, worst);
		ck_assert_int_eq(th_int(th_obj(res, "windows"), "next"),
		                 th_int(th_obj(ref, "windows"), "next"));
		/* no clipping: the updates are fused, and the norm is reported all the same */
		nworst = worst_loss(th_arr(res, "grad_norms"), th_arr(ref, "grad_norms"));
		ck_assert_msg(nworst <= 1e-5, "gpt %s windows: global norms off by %.3g", order,
		              nworst);
		fprintf(stderr, "gpt %s windows vs JAX: losses off by %.3g, global norms by %.3g\n",
		        order, worst, nworst);
		json_decref(res);
		json_decref(ref);
		json_decref(rspec);
	}
}
END_TEST

/*
 * Gradient accumulation against gpt_reference.py's (the gradients of the k
 * micro-batches' mean losses summed in order and divided by k, then one
 * clip + AdamW update, as optax.MultiSteps and nanoGPT do): 5 steps of 2
 * micro-batches of 2 windows each, clipping on, a warmup-cosine schedule:
 * every loss (the mean of the micro-batches') within 1e-5 relative, the
 * learning rates optax's (one per optimizer step), every global norm
 * within 1e-5, the
 * weights and Adam's moments within 1e-4 of their largest; a twin without
 * an optimizer writes the mean gradient within 1e-5 of JAX's; then 2 steps
 * of 4 micro-batches of random windows of a stream, losses within 1e-5 and
 * the stream's next window JAX's.
 */
START_TEST(test_gpt_accumulate_vs_jax)
{
	static const char *const spec_fmt =
		"{\"name\": \"%s\", \"gpt\": {\"vocab\": %d, \"context\": %d, \"layers\": %d, "
		"\"d_model\": %d, \"heads\": %d, \"d_ff\": %d}, \"init\": {\"seed\": 8, "
		"\"scale\": 0.1}, \"optimizer\": %s}";
	static const char *const opt =
		"{\"type\": \"adamw\", \"weight_decay\": 0.1, \"decay\": \"matrices\", "
		"\"clip_global_norm\": 0.5, \"b1\": 0.9, \"b2\": 0.95, \"eps\": 1e-8, "
		"\"schedule\": {\"type\": \"warmup_cosine_decay\", \"init_value\": 0.0, "
		"\"peak_value\": 0.01, \"warmup_steps\": 2, \"decay_steps\": 5, "
		"\"end_value\": 0.001}}";
	enum { K = 2, STEPS_A = 5, N = 401 };
	int32_t in[GB * (GC + 1)], tg[GB * GC];
	uint16_t stream[N];
	unsigned seed = 11;
	char dir[512], path[700], *spec;
	json_t *res, *ref, *rspec, *g;
	double l_worst, n_worst, w_worst, g_worst = 0;
	struct th_response r;

	spec = th_fmt(spec_fmt, "ga", GV, GC, GL, GD, GH, GF, opt);
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	spec = th_fmt(spec_fmt, "gag", GV, GC, GL, GD, GH, GF, "{\"type\": \"none\"}");
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	th_temp_dir("gpta", dir, sizeof dir);
	gpt_inputs("gag", dir, in, tg);
	g = th_post_json(&D, "/v1/models/gag:step?wait=true",
	                 "{\"inputs\": \"gx\", \"targets\": \"gt\", \"accumulate\": 2}", 200);
	ck_assert_int_eq(th_int(g, "accumulate"), K);
	json_decref(g);
	res = th_post_json(&D, "/v1/models/ga:step?wait=true",
	                   "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 5, "
	                   "\"accumulate\": 2}", 200);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	ck_assert_int_eq(th_int(res, "accumulate"), K);
	rspec = json_pack("{s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:s+, s:s+, s:i, s:i, s:o, s:s+,"
	                  " s:s+, s:i, s:i, s:b, s:b}",
	                  "gpt", "vocab", GV, "context", GC, "layers", GL, "d_model", GD, "heads", GH,
	                  "d_ff", GF, "weights", dir, "", "out", dir, "/out", "steps", STEPS_A,
	                  "accumulate", K, "optimizer", json_loads(opt, 0, NULL),
	                  "inputs", dir, "/inputs.i32", "targets", dir, "/targets.i32",
	                  "batch", GB / K, "tokens", GC, "grads", 1, "adam_state", 1);
	ck_assert_ptr_nonnull(rspec);
	ref = run_script("gpt_reference.py", dir, rspec, "");
	l_worst = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
	ck_assert_msg(l_worst <= 1e-5, "accumulating gpt: losses off by %.3g from JAX's", l_worst);
	n_worst = worst_loss(th_arr(res, "grad_norms"), th_arr(ref, "grad_norms"));
	ck_assert_msg(n_worst <= 1e-5, "accumulating gpt: global norms off by %.3g from JAX's",
	              n_worst);
	/* one learning rate per optimizer step, optax's schedule at its count */
	for (size_t i = 0; i < STEPS_A; i++)
		ck_assert_msg((float)json_number_value(json_array_get(th_arr(res, "learning_rates"),
		                                                      i)) ==
		              (float)json_number_value(json_array_get(th_arr(ref, "learning_rates"),
		                                                      i)),
		              "accumulating gpt: step %zu's learning rate is not optax's", i);
	w_worst = compare_gpt("ga", dir, "", "", "after 5 accumulating steps");
	w_worst = fmax(w_worst, compare_gpt("ga", dir, "adam.mu.", "mu_", "after 5 steps"));
	w_worst = fmax(w_worst, compare_gpt("ga", dir, "adam.nu.", "nu_", "after 5 steps"));
	{
		char names[GPT_NW][2][64];
		const char *files[GPT_NW][2];

		for (size_t i = 0; i < GPT_NW; i++) {
			snprintf(names[i][0], sizeof names[i][0], "grad.%s", gpt_files[i][0]);
			snprintf(names[i][1], sizeof names[i][1], "grad_%s", gpt_files[i][1]);
			files[i][0] = names[i][0];
			files[i][1] = names[i][1];
		}
		g_worst = compare_files("gag", (const char *const (*)[2])files, GPT_NW, dir, "", 1e-5,
		                        "the mean gradient at the initial weights");
	}
	fprintf(stderr, "gpt accumulating %d micro-batches vs JAX: losses off by %.3g relative, "
	        "global norms by %.3g, weights and moments by %.3g of their largest, the mean "
	        "gradient by %.3g\n", K, l_worst, n_worst, w_worst, g_worst);
	json_decref(res);
	json_decref(ref);
	json_decref(rspec);

	/* windows of a stream, 4 micro-batches of 2 random windows a step */
	for (int i = 0; i < N; i++) {
		seed = seed * 1664525u + 1013904223u;
		stream[i] = (uint16_t)((seed >> 8) % GV);
	}
	snprintf(path, sizeof path, "%s/stream.u16", dir);
	th_write_file(path, stream, sizeof stream);
	th_request(&D, "PUT", "/v1/arrays/stream?dtype=uint16&shape=401", NULL,
	           (const char *)stream, sizeof stream, &r);
	ck_assert_msg(r.status == 201 || r.status == 200, "PUT stream: %ld %s", r.status, r.body);
	th_response_free(&r);
	/* a third twin, from the same initial weights */
	spec = th_fmt(spec_fmt, "gaw", GV, GC, GL, GD, GH, GF, opt);
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	res = th_post_json(&D, "/v1/models/gaw:step?wait=true",
	                   "{\"windows\": {\"array\": \"stream\", \"context\": 16, \"batch_size\": 2, "
	                   "\"order\": \"random\", \"seed\": 4, \"start\": 1}, \"steps\": 2, "
	                   "\"accumulate\": 4}", 200);
	ck_assert_int_eq(th_int(th_obj(res, "windows"), "batch_size"), 2);
	rspec = json_pack("{s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:s+, s:s+, s:i, s:i, s:o,"
	                  " s:{s:s+, s:i, s:i, s:s, s:i, s:i}}",
	                  "gpt", "vocab", GV, "context", GC, "layers", GL, "d_model", GD, "heads", GH,
	                  "d_ff", GF, "weights", dir, "", "out", dir, "/out_w", "steps", 2,
	                  "accumulate", 4, "optimizer", json_loads(opt, 0, NULL),
	                  "windows", "stream", dir, "/stream.u16", "context", 16, "batch_size", 2,
	                  "order", "random", "seed", 4, "start", 1);
	ck_assert_ptr_nonnull(rspec);
	ref = run_script("gpt_reference.py", dir, rspec, "_w");
	l_worst = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
	ck_assert_msg(l_worst <= 1e-5, "accumulating gpt on windows: losses off by %.3g", l_worst);
	ck_assert_int_eq(th_int(th_obj(res, "windows"), "next"),
	                 th_int(th_obj(ref, "windows"), "next"));
	ck_assert_int_eq(th_int(th_obj(res, "windows"), "next"), 1 + 2 * 4 * 2);
	fprintf(stderr, "gpt accumulating 4 micro-batches of windows vs JAX: losses off by %.3g\n",
	        l_worst);
	json_decref(res);
	json_decref(ref);
	json_decref(rspec);
}
END_TEST

/* Data parallel against JAX: test_gpt_adamw_vs_jax's GPT and AdamW (clipped,
 * warmup-cosine) placed on two devices, each stepping on half of every
 * batch, its gradients all-reduced (overlapped with the backward pass) and
 * meaned, against gpt_reference.py's single-device steps on the whole batch
 * from the same initial weights: losses, global norms, weights and Adam's
 * moments within float32 summation order; every device's measured peak the
 * plan's; the all-reduced bytes the gradients' size a step. On a machine with one
 * accelerator the test has no second device and says so. */
START_TEST(test_gpt_data_parallel_vs_jax)
{
	static const char *const spec_fmt =
		"{\"name\": \"%s\", \"gpt\": {\"vocab\": %d, \"context\": %d, \"layers\": %d, "
		"\"d_model\": %d, \"heads\": %d, \"d_ff\": %d}, \"init\": {\"seed\": 5, "
		"\"scale\": 0.1}, \"optimizer\": %s, \"placement\": {\"devices\": [\"%s\", \"%s\"]}}";
	static const char *const opt =
		"{\"type\": \"adamw\", \"weight_decay\": 0.1, \"decay\": \"matrices\", "
		"\"clip_global_norm\": 1.0, "
		"\"b1\": 0.9, \"b2\": 0.95, \"eps\": 1e-8, \"schedule\": {\"type\": "
		"\"warmup_cosine_decay\", \"init_value\": 0.0, \"peak_value\": 0.01, "
		"\"warmup_steps\": 3, \"decay_steps\": 10, \"end_value\": 0.001}}";
	enum { STEPS_DP = 6 };
	int32_t in[GB * (GC + 1)], tg[GB * GC];
	char dir[512], *spec;
	json_t *res, *ref, *rspec, *devs;
	double l_worst, n_worst, w_worst;
	uint64_t grad_bytes = 0;

	if (!th_daemon_has_device(&D, th_dev(1))) {
		fprintf(stderr, "gpt data parallel vs JAX: no second device (%s) here\n", th_dev(1));
		return;
	}
	spec = th_fmt(spec_fmt, "gdp", GV, GC, GL, GD, GH, GF, opt, th_dev(0), th_dev(1));
	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	free(spec);
	th_temp_dir("gptdp", dir, sizeof dir);
	gpt_inputs("gdp", dir, in, tg);
	res = th_post_json(&D, "/v1/models/gdp:step?wait=true",
	                   "{\"inputs\": \"gx\", \"targets\": \"gt\", \"steps\": 6}", 200);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	devs = th_arr(res, "devices");
	ck_assert_int_eq(json_array_size(devs), 2);
	for (size_t k = 0; k < GPT_NW; k++) {
		char name[160];
		size_t n;
		float *w;

		snprintf(name, sizeof name, "gdp.%s", gpt_files[k][0]);
		w = th_download_floats(&D, name, &n);
		grad_bytes += n * sizeof *w;
		free(w);
	}
	/* each step all-reduces every gradient once, nothing else */
	for (size_t i = 0; i < 2; i++)
		ck_assert_int_eq(th_int(json_array_get(devs, i), "all_reduce_bytes"),
		                 STEPS_DP * grad_bytes);
	rspec = json_pack("{s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:s+, s:s+, s:i, s:o, s:s+, s:s+,"
	                  " s:i, s:i, s:b, s:b}",
	                  "gpt", "vocab", GV, "context", GC, "layers", GL, "d_model", GD, "heads", GH,
	                  "d_ff", GF, "weights", dir, "", "out", dir, "/out", "steps", STEPS_DP,
	                  "optimizer", json_loads(opt, 0, NULL),
	                  "inputs", dir, "/inputs.i32", "targets", dir, "/targets.i32",
	                  "batch", GB, "tokens", GC, "grads", 0, "adam_state", 1);
	ck_assert_ptr_nonnull(rspec);
	ref = run_script("gpt_reference.py", dir, rspec, "");
	l_worst = worst_loss(th_arr(res, "losses"), th_arr(ref, "losses"));
	ck_assert_msg(l_worst <= 1e-5, "data-parallel gpt: losses off by %.3g relative from JAX's",
	              l_worst);
	n_worst = worst_loss(th_arr(res, "grad_norms"), th_arr(ref, "grad_norms"));
	ck_assert_msg(n_worst <= 1e-5, "data-parallel gpt: global norms off by %.3g from JAX's",
	              n_worst);
	w_worst = compare_gpt("gdp", dir, "", "", "after 6 data-parallel steps");
	w_worst = fmax(w_worst, compare_gpt("gdp", dir, "adam.mu.", "mu_", "after 6 steps"));
	w_worst = fmax(w_worst, compare_gpt("gdp", dir, "adam.nu.", "nu_", "after 6 steps"));
	fprintf(stderr, "gpt data parallel over %s and %s vs JAX on the whole batch: losses off by "
	        "%.3g relative, global norms by %.3g, weights and moments by %.3g of their "
	        "largest\n", th_dev(0), th_dev(1), l_worst, n_worst, w_worst);
	json_decref(res);
	json_decref(ref);
	json_decref(rspec);
}
END_TEST

/* The generated tokens of a :generate?wait=true answer, as a JSON array
 * (new reference). */
static json_t *generate_tokens(const char *model, const char *body)
{
	char path[200];
	json_t *r, *t;

	snprintf(path, sizeof path, "/v1/models/%s:generate?wait=true", model);
	r = th_post_json(&D, path, body, 200);
	ck_assert_int_eq(th_int(r, "measured_peak_device_bytes"),
	                 th_int(r, "predicted_peak_device_bytes"));
	t = json_incref(th_arr(r, "tokens"));
	json_decref(r);
	return t;
}

/* Inference of the GPT against gpt_reference.py from the same weights:
 * logits without targets are the with-targets logits bit for bit, with
 * "positions": "last" each window's last row; windows shorter than the
 * context are the reference's wpe[0:T] forward pass; greedy generation
 * from a prompt shorter than the context, running past it (so the context
 * is cropped), and from a prompt longer than it, gives the reference's
 * tokens exactly; sampling is reproducible from its seed; the refusals. */
START_TEST(test_gpt_inference_vs_jax)
{
	static const char *const spec =
		"{\"name\": \"gi\", \"gpt\": {\"vocab\": 61, \"context\": 16, \"layers\": 2, "
		"\"d_model\": 32, \"heads\": 4, \"d_ff\": 64}, \"init\": {\"seed\": 9, "
		"\"scale\": 0.3}}";
	static const int32_t longp[20] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7,
	                                  9, 32, 38, 4, 6, 26, 43, 38, 32, 7};
	int32_t in[GB * (GC + 1)], tg[GB * GC], shortw[2 * 5];
	char dir[512], path[700], tag[16];
	size_t na, nb, nc;
	float *all, *none, *last, *want;
	json_t *r, *ref, *rspec, *got[3];
	struct th_response resp;
	double worst = 0, big = 0;

	json_decref(th_post_json(&D, "/v1/models?wait=true", spec, 200));
	th_temp_dir("gpti", dir, sizeof dir);
	gpt_inputs("gi", dir, in, tg);
	/* the logits with targets, without, and the last positions' */
	r = th_post_json(&D, "/v1/models/gi:evaluate?wait=true",
	                 "{\"inputs\": \"gx\", \"targets\": \"gt\", \"outputs\": {\"name\": "
	                 "\"gi_all\", \"memory_kind\": \"pinned_host\"}}", 200);
	ck_assert_ptr_nonnull(json_object_get(r, "loss"));
	json_decref(r);
	r = th_post_json(&D, "/v1/models/gi:evaluate?wait=true",
	                 "{\"inputs\": \"gx\", \"outputs\": {\"name\": \"gi_none\"}}", 200);
	ck_assert_ptr_null(json_object_get(r, "loss"));
	ck_assert_int_eq(th_int(r, "measured_peak_device_bytes"),
	                 th_int(r, "predicted_peak_device_bytes"));
	json_decref(r);
	r = th_post_json(&D, "/v1/models/gi:evaluate?wait=true",
	                 "{\"inputs\": \"gx\", \"positions\": \"last\", \"outputs\": {\"name\": "
	                 "\"gi_last\", \"memory_kind\": \"pinned_host\"}}", 200);
	ck_assert_int_eq(th_int(r, "measured_peak_device_bytes"),
	                 th_int(r, "predicted_peak_device_bytes"));
	json_decref(r);
	all = th_download_floats(&D, "gi_all", &na);
	none = th_download_floats(&D, "gi_none", &nb);
	last = th_download_floats(&D, "gi_last", &nc);
	ck_assert_uint_eq(na, (size_t)GB * GC * GV);
	ck_assert_uint_eq(nb, na);
	ck_assert_uint_eq(nc, (size_t)GB * GV);
	ck_assert_msg(memcmp(all, none, na * sizeof *all) == 0,
	              "logits without targets differ from those with targets");
	for (size_t i = 0; i < na; i++)
		big = fmax(big, fabs(all[i]));
	for (int b = 0; b < GB; b++)
		for (int v = 0; v < GV; v++)
			worst = fmax(worst, fabs(last[b * GV + v] - all[((size_t)b * GC + GC - 1) * GV + v]));
	ck_assert_msg(worst <= 1e-6 * big, "positions last off the last rows by %.3g (max %.3g)",
	              worst, big);
	free(all);
	free(none);
	free(last);
	/* windows of 5 tokens (shorter than the context 16), against wpe[0:5] */
	for (int b = 0; b < 2; b++)
		for (int t = 0; t < 5; t++)
			shortw[b * 5 + t] = in[b * GC + t];
	snprintf(path, sizeof path, "%s/short.i32", dir);
	th_write_file(path, shortw, sizeof shortw);
	th_request(&D, "PUT", "/v1/arrays/gs?dtype=int32&shape=2,5", NULL, (const char *)shortw,
	           sizeof shortw, &resp);
	ck_assert_msg(resp.status == 201 || resp.status == 200, "PUT gs: %ld", resp.status);
	th_response_free(&resp);
	json_decref(th_post_json(&D, "/v1/models/gi:evaluate?wait=true",
	                         "{\"inputs\": \"gs\", \"outputs\": {\"name\": \"gi_short\"}}", 200));
	/* greedy: a prompt of 5 tokens and 20 more (past the context: cropped),
	 * and a prompt of 20 (longer than the context) and 6 more */
	got[0] = generate_tokens("gi", "{\"prompt\": [3, 14, 15, 9, 26], \"max_tokens\": 20}");
	got[1] = generate_tokens("gi", "{\"prompt\": [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 32, 38, "
	                               "4, 6, 26, 43, 38, 32, 7], \"max_tokens\": 6, "
	                               "\"temperature\": 0}");
	for (int k = 0; k < 2; k++) {
		json_t *prompt = json_array();

		for (int i = 0; i < (k ? 20 : 5); i++)
			json_array_append_new(prompt, json_integer(longp[i]));
		snprintf(tag, sizeof tag, "_i%d", k);
		snprintf(path, sizeof path, "%s/out%s", dir, tag);
		rspec = json_pack("{s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:s, s:s,"
		                  " s:{s:o, s:i, s:f}}",
		                  "gpt", "vocab", 61, "context", 16, "layers", 2, "d_model", 32,
		                  "heads", 4, "d_ff", 64, "weights", dir, "out", path,
		                  "generate", "prompt", prompt, "max_tokens", k ? 6 : 20,
		                  "temperature", 0.0);
		ck_assert_ptr_nonnull(rspec);
		if (!k)
			json_object_set_new(rspec, "evaluate",
			                    json_pack("{s:s, s:s+, s:i, s:i}", "positions", "all", "inputs",
			                              dir, "/short.i32", "batch", 2, "tokens", 5));
		ref = run_script("gpt_reference.py", dir, rspec, tag);
		if (!json_equal(got[k], th_arr(ref, "tokens"))) {
			char *g = json_dumps(got[k], JSON_COMPACT);
			char *w = json_dumps(th_arr(ref, "tokens"), JSON_COMPACT);

			ck_abort_msg("greedy tokens %s differ from the reference's %s", g, w);
		}
		if (!k) {
			all = th_download_floats(&D, "gi_short", &na);
			snprintf(path, sizeof path, "%s/out%s/logits.f32", dir, tag);
			want = (float *)th_read_file(path, &nb);
			ck_assert_ptr_nonnull(want);
			worst = compare_rel("logits of windows of 5 tokens", all, na, want,
			                    nb / sizeof *want, 1e-5);
			fprintf(stderr, "gpt short windows vs JAX: logits off by %.3g\n", worst);
			free(all);
			free(want);
		}
		json_decref(ref);
		json_decref(rspec);
	}
	{
		char *g0 = json_dumps(got[0], JSON_COMPACT), *g1 = json_dumps(got[1], JSON_COMPACT);

		fprintf(stderr, "gpt greedy generation: %s and %s, the reference's\n", g0, g1);
		free(g0);
		free(g1);
	}
	/* sampling: the same seed, the same tokens; every id in the vocabulary */
	got[2] = generate_tokens("gi", "{\"prompt\": [1, 2], \"max_tokens\": 30, \"temperature\": "
	                               "1.5, \"top_k\": 8, \"seed\": 11}");
	json_decref(got[0]);
	got[0] = generate_tokens("gi", "{\"prompt\": [1, 2], \"max_tokens\": 30, \"temperature\": "
	                               "1.5, \"top_k\": 8, \"seed\": 11}");
	ck_assert(json_equal(got[0], got[2]));
	for (size_t i = 0; i < json_array_size(got[2]); i++) {
		json_int_t v = json_integer_value(json_array_get(got[2], i));

		ck_assert(v >= 0 && v < 61);
	}
	for (int k = 0; k < 3; k++)
		json_decref(got[k]);
	/* refusals, before anything runs */
	th_post_error(&D, "/v1/models/gi:generate", "{\"prompt\": [1, 61], \"max_tokens\": 2}", 400,
	              "INVALID_ARGUMENT", "BAD_TOKEN", "prompt[1]", "61");
	th_post_error(&D, "/v1/models/gi:generate", "{\"prompt\": [1, -1], \"max_tokens\": 2}", 400,
	              "INVALID_ARGUMENT", "BAD_TOKEN", "prompt[1]", NULL);
	th_post_error(&D, "/v1/models/gi:generate", "{\"prompt\": [], \"max_tokens\": 2}", 400,
	              "INVALID_ARGUMENT", "BAD_PROMPT", NULL, NULL);
	th_post_error(&D, "/v1/models/gi:generate", "{\"prompt\": [1], \"max_tokens\": 0}", 400,
	              "INVALID_ARGUMENT", "BAD_MAX_TOKENS", "1..4096", NULL);
	th_post_error(&D, "/v1/models/gi:generate", "{\"prompt\": [1], \"max_tokens\": 4097}", 400,
	              "INVALID_ARGUMENT", "BAD_MAX_TOKENS", NULL, NULL);
	th_post_error(&D, "/v1/models/gi:generate",
	              "{\"prompt\": [1], \"max_tokens\": 2, \"temperature\": -1}", 400,
	              "INVALID_ARGUMENT", "BAD_TEMPERATURE", NULL, NULL);
	th_post_error(&D, "/v1/models/gi:generate",
	              "{\"prompt\": [1], \"max_tokens\": 2, \"top_k\": 62}", 400,
	              "INVALID_ARGUMENT", "BAD_TOP_K", NULL, NULL);
	th_post_error(&D, "/v1/models/gi:generate", "{\"prompt\": [1], \"max_tokens\": 2, "
	              "\"color\": 1}", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "color", NULL);
	th_post_error(&D, "/v1/models/gi:evaluate", "{\"inputs\": \"gx\"}", 400,
	              "INVALID_ARGUMENT", "NO_OUTPUTS", "outputs", NULL);
	th_post_error(&D, "/v1/models/gi:evaluate", "{\"inputs\": \"gx\", \"positions\": "
	              "\"first\", \"outputs\": {\"name\": \"z\"}}", 400, "INVALID_ARGUMENT",
	              "BAD_POSITIONS", "first", NULL);
	th_post_error(&D, "/v1/models/gi:step?wait=true",
	              "{\"inputs\": \"gs\", \"targets\": \"gs\"}", 400, "INVALID_ARGUMENT",
	              "BAD_INPUTS", "16", NULL);
	th_post_error(&D, "/v1/models/nosuch:generate", "{\"prompt\": [1], \"max_tokens\": 2}",
	              404, "NOT_FOUND", "MODEL_NOT_FOUND", NULL, NULL);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("optax");
	TCase *tc = tcase_create("optax");

	tcase_add_checked_fixture(tc, up, down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_sgd_clipped);
	tcase_add_test(tc, test_adam_clipped);
	tcase_add_test(tc, test_adamw_clipped);
	tcase_add_test(tc, test_adamw_warmup_cosine);
	tcase_add_test(tc, test_tokens_adam_clipped);
	tcase_add_test(tc, test_bfloat16_adam_vs_jax);
	tcase_add_test(tc, test_float16_adam_vs_jax);
	tcase_add_test(tc, test_bfloat16_analysis_counts_the_copies);
	suite_add_tcase(s, tc);
	/* the GPT kind against a jax.numpy GPT-2 (py/gpt_reference.py) */
	tc = tcase_create("gpt");
	tcase_add_checked_fixture(tc, up, down);
	tcase_set_timeout(tc, 2 * CASE_TIMEOUT_S);     /* JAX compiles a GPT per case */
	tcase_add_test(tc, test_gpt_adamw_vs_jax);
	tcase_add_test(tc, test_gpt_bf16_vs_jax);
	tcase_add_test(tc, test_gpt_windows_vs_jax);
	tcase_add_test(tc, test_gpt_accumulate_vs_jax);
	tcase_add_test(tc, test_gpt_data_parallel_vs_jax);
	tcase_add_test(tc, test_gpt_inference_vs_jax);
	suite_add_tcase(s, tc);
	return s;
}
