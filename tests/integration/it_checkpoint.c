/*
 * it_checkpoint.c - Check suite "checkpoint": exact checkpoints of models
 * against real tstaged daemons: GET /v1/models/{m}:export writes the
 * weights, the optimizer state, the spec and the step count (Adam's t) as
 * a safetensors file; POST /v1/models:import in a fresh daemon creates the
 * model from it, and continuing there gives the same losses and weights,
 * bit for bit, as a run that never stopped. A step count set at creation
 * is the model's; a bad or partial checkpoint is a 4xx naming the problem
 * and leaves nothing behind.
 *
 * Each case runs forked with its own daemons.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CASE_TIMEOUT_S 120
#define B 8
#define D 16

static struct th_daemon A, Bd;
static struct th_response r_resp;
static const char *const args[] = {"--sim-device-memory", "256MiB", NULL};

static void up(void)
{
	th_daemon_start(&A, args);
	th_daemon_start(&Bd, args);
}

static void down(void)
{
	th_daemon_stop_ok(&A);
	th_daemon_stop_ok(&Bd);
}

/* Inputs "x" and targets "t" on d. */
static void data_up(struct th_daemon *d)
{
	float *x = th_signed_floats(B * D, 31), *t = th_signed_floats(B * D, 32);

	th_put_floats(d, "x", x, B, D, NULL);
	th_put_floats(d, "t", t, B, D, NULL);
	free(x);
	free(t);
}

/* A 3-layer residual gelu MLP with optimizer opt, mse loss. */
static void create(struct th_daemon *d, const char *name, const char *opt)
{
	char *spec = th_fmt("{\"name\": \"%s\", \"mlp\": {\"layers\": 3, \"d_model\": %d, \"d_hidden\": 24, "
	                    "\"activation\": \"gelu\", \"residual\": true}, \"loss\": \"mse\", "
	                    "\"optimizer\": %s, \"init\": {\"seed\": 7, \"scale\": 0.3}}",
	                    name, D, opt);

	json_decref(th_post_json(d, "/v1/models?wait=true", spec, 200));
	free(spec);
}

/* The import must fail with http/reason and a message naming word. */
static void import_error(struct th_daemon *d, const char *file, size_t len, long http,
                         const char *status, const char *reason, const char *word)
{
	struct th_response r;
	const char *msg;

	th_import_model(d, NULL, file, len, &r);
	th_assert_error(&r, http, status, reason);
	msg = th_str(th_obj(th_json(&r), "error"), "message");
	ck_assert_msg(strstr(msg, word), "import: the message does not name '%s': %s", word, msg);
	th_response_free(&r);
}

/* ---- safetensors files, taken apart and put back ----------------------------------- */

/* The header of a safetensors file (new reference) and where its data begins. */
static json_t *st_header(const char *file, size_t len, size_t *data_at)
{
	uint64_t n = 0;
	json_error_t e;
	json_t *h;

	ck_assert_uint_ge(len, 8);
	for (int i = 7; i >= 0; i--)
		n = n << 8 | (unsigned char)file[i];
	ck_assert_uint_le(8 + n, len);
	h = json_loadb(file + 8, (size_t)n, 0, &e);
	ck_assert_msg(json_is_object(h), "header: %s", e.text);
	*data_at = 8 + (size_t)n;
	return h;
}

/* A file of header h and data[0, data_len) (new buffer, *len bytes). */
static char *st_file(json_t *h, const char *data, size_t data_len, size_t *len)
{
	char *text = json_dumps(h, JSON_COMPACT), *f;
	size_t n = strlen(text);

	f = malloc(8 + n + data_len + 1);
	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < 8; i++)
		f[i] = (char)((uint64_t)n >> (8 * i));
	memcpy(f + 8, text, n);
	memcpy(f + 8 + n, data, data_len);
	*len = 8 + n + data_len;
	free(text);
	return f;
}

/* The file with __metadata__ key set to value (NULL: removed). */
static char *st_with_meta(const char *file, size_t len, const char *key, const char *value,
                          size_t *out_len)
{
	size_t at;
	json_t *h = st_header(file, len, &at), *meta = th_obj(h, "__metadata__");
	char *f;

	if (value)
		json_object_set_new(meta, key, json_string(value));
	else
		json_object_del(meta, key);
	f = st_file(h, file + at, len - at, out_len);
	json_decref(h);
	return f;
}

/* ---- the cases ------------------------------------------------------------------------- */

#define N 3
#define M 4

static const char *const adam_roles[] = {"w1", "w2", "adam.mu.w1", "adam.mu.w2", "adam.nu.w1",
                                         "adam.nu.w2"};

/* Train N steps on A, export, import into a fresh daemon, continue M
 * steps: the losses and every array are those of N + M steps at once. */
static void resume_case(const char *opt)
{
	double whole[N + M], first[N], rest[M], reset[M];
	size_t len, len0;
	char *file, *file0;
	json_t *m;

	data_up(&A);
	data_up(&Bd);
	create(&A, "u", opt);
	create(&A, "c", opt);
	th_model_losses(&A, "u", "x", "t", N + M, whole);
	th_model_losses(&A, "c", "x", "t", N, first);
	for (int i = 0; i < N; i++)
		ck_assert_msg(first[i] == whole[i], "step %d: %.17g vs %.17g", i + 1, first[i], whole[i]);
	file = th_export_model(&A, "c", &len);
	th_import_ok(&Bd, NULL, file, len);
	m = th_get_object(&Bd, "/v1/models/c");
	ck_assert_int_eq(th_int(m, "steps"), N);
	json_decref(m);
	th_model_losses(&Bd, "c", "x", "t", M, rest);
	for (int i = 0; i < M; i++)
		ck_assert_msg(rest[i] == whole[N + i],
		              "resumed step %d: loss %.17g, uninterrupted %.17g", N + i + 1, rest[i],
		              whole[N + i]);
	m = th_get_object(&Bd, "/v1/models/c");
	ck_assert_int_eq(th_int(m, "steps"), N + M);
	json_decref(m);
	for (size_t r = 0; r < sizeof adam_roles / sizeof adam_roles[0]; r++) {
		char a[64];
		size_t n0, n1;
		char *w0, *w1;

		snprintf(a, sizeof a, "u.%s", adam_roles[r]);
		w0 = th_download(&A, a, &n0);
		snprintf(a, sizeof a, "c.%s", adam_roles[r]);
		w1 = th_download(&Bd, a, &n1);
		th_assert_bytes(a, w1, n1, w0, n0);
		free(w0);
		free(w1);
	}
	/* the step count is what makes it exact: imported as 0, the same
	 * weights and moments continue differently (from the second loss on:
	 * the first is the imported weights') */
	file0 = st_with_meta(file, len, "steps", "0", &len0);
	th_import_ok(&Bd, "name=c0", file0, len0);
	th_model_losses(&Bd, "c0", "x", "t", M, reset);
	ck_assert_msg(reset[0] == whole[N], "t = 0: first loss %.17g vs %.17g", reset[0], whole[N]);
	ck_assert_msg(reset[1] != whole[N + 1], "t = 0 resumed the same: %.17g", reset[1]);
	free(file0);
	free(file);
}

START_TEST(test_resume_adam_bit_identical)
{
	resume_case("{\"type\": \"adam\", \"learning_rate\": 0.01, \"clip_global_norm\": 1.0}");
}
END_TEST

/* AdamW on a warmup cosine schedule: t places the resumed run on the
 * schedule too. */
START_TEST(test_resume_adamw_schedule_bit_identical)
{
	resume_case("{\"type\": \"adamw\", \"weight_decay\": 0.05, \"clip_global_norm\": 1.0, "
	            "\"schedule\": {\"type\": \"warmup_cosine_decay\", \"init_value\": 0.001, "
	            "\"peak_value\": 0.01, \"warmup_steps\": 2, \"decay_steps\": 6, "
	            "\"end_value\": 0.002}}");
}
END_TEST

/* The checkpoint is what it says: the spec in its metadata, t, the tensors. */
START_TEST(test_export_contents)
{
	double l[2];
	size_t len, at;
	char *file;
	json_t *h, *meta, *spec, *t;
	json_error_t e;

	data_up(&A);
	create(&A, "e", "{\"type\": \"adam\", \"learning_rate\": 0.01}");
	th_model_losses(&A, "e", "x", "t", 2, l);
	file = th_export_model(&A, "e", &len);
	h = st_header(file, len, &at);
	meta = th_obj(h, "__metadata__");
	ck_assert_str_eq(th_str(meta, "format"), "tstage.model.v1");
	ck_assert_str_eq(th_str(meta, "steps"), "2");
	spec = json_loads(th_str(meta, "model"), 0, &e);
	ck_assert_msg(spec != NULL, "metadata model: %s", e.text);
	ck_assert_str_eq(th_str(spec, "name"), "e");
	ck_assert_str_eq(th_str(th_obj(spec, "optimizer"), "type"), "adam");
	ck_assert_ptr_null(json_object_get(spec, "steps"));
	for (size_t r = 0; r < sizeof adam_roles / sizeof adam_roles[0]; r++) {
		t = th_obj(h, adam_roles[r]);
		ck_assert_str_eq(th_str(t, "dtype"), "F32");
		ck_assert_uint_eq(json_array_size(th_arr(t, "shape")), 3);
	}
	ck_assert_uint_eq(json_object_size(h), 7);
	json_decref(spec);
	json_decref(h);
	free(file);
}
END_TEST

/* A step count given at creation is the model's t. */
START_TEST(test_create_with_steps)
{
	json_t *m, *err;
	double l0[1], l1[1];

	data_up(&A);
	create(&A, "s0", "{\"type\": \"adam\", \"learning_rate\": 0.01}");
	json_decref(th_post_json(&A, "/v1/models?wait=true",
	                      "{\"name\": \"s5\", \"mlp\": {\"layers\": 3, \"d_model\": 16, "
	                      "\"d_hidden\": 24, \"activation\": \"gelu\", \"residual\": true}, "
	                      "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
	                      "\"learning_rate\": 0.01}, \"init\": {\"seed\": 7, \"scale\": 0.3}, "
	                      "\"steps\": 5}", 200));
	m = th_get_object(&A, "/v1/models/s5");
	ck_assert_int_eq(th_int(m, "steps"), 5);
	json_decref(m);
	/* the same weights; t = 6 on the first step corrects the bias less */
	th_model_losses(&A, "s0", "x", "t", 1, l0);
	th_model_losses(&A, "s5", "x", "t", 1, l1);
	ck_assert_msg(l0[0] == l1[0], "the first loss is the weights' own: %.17g vs %.17g", l0[0],
	              l1[0]);
	th_model_losses(&A, "s0", "x", "t", 1, l0);
	th_model_losses(&A, "s5", "x", "t", 1, l1);
	ck_assert_msg(l0[0] != l1[0], "t = 6 stepped as t = 1: %.17g", l1[0]);
	m = th_get_object(&A, "/v1/models/s5");
	ck_assert_int_eq(th_int(m, "steps"), 7);
	json_decref(m);
	err = th_post_json(&A, "/v1/models",
	                "{\"name\": \"bad\", \"mlp\": {\"layers\": 1, \"d_model\": 4}, \"steps\": -1}",
	                400);
	ck_assert_msg(strstr(th_str(th_obj(err, "error"), "message"), "steps"), "%s",
	              th_str(th_obj(err, "error"), "message"));
	json_decref(err);
}
END_TEST

/* Bad and partial checkpoints: 400 naming the problem; nothing is left. */
START_TEST(test_import_errors)
{
	double l[1];
	size_t len, at, n2;
	char *file, *f2;
	json_t *h, *list;
	struct th_response r;
	const char *last = NULL;
	json_int_t last_begin = -1;
	const char *key;
	json_t *v;

	data_up(&A);
	create(&A, "m", "{\"type\": \"adam\", \"learning_rate\": 0.01}");
	th_model_losses(&A, "m", "x", "t", 1, l);
	file = th_export_model(&A, "m", &len);

	/* the name is taken: 409 on A */
	th_import_model(&A, NULL, file, len, &r);
	th_assert_error(&r, 409, "ALREADY_EXISTS", "MODEL_EXISTS");
	th_response_free(&r);

	/* truncated */
	import_error(&Bd, file, len - 5, 400, "INVALID_ARGUMENT", NULL, "");
	/* no metadata key, a wrong format, a bad step count, a bad spec */
	f2 = st_with_meta(file, len, "steps", NULL, &n2);
	import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", "steps");
	free(f2);
	f2 = st_with_meta(file, len, "format", "other", &n2);
	import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", "format");
	free(f2);
	f2 = st_with_meta(file, len, "steps", "-3", &n2);
	import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", "steps");
	free(f2);
	f2 = st_with_meta(file, len, "model", "{\"name\": \"m\", \"bogus\": 1}", &n2);
	import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", NULL, "bogus");
	free(f2);
	f2 = st_with_meta(file, len, "model", "[1", &n2);
	import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", "model");
	free(f2);
	/* a model without Adam state: the moments are extra tensors */
	f2 = st_with_meta(file, len, "model",
	                  "{\"name\": \"m\", \"mlp\": {\"layers\": 3, \"d_model\": 16, \"d_hidden\": 24,"
	                  " \"activation\": \"gelu\", \"residual\": true}, \"loss\": \"mse\", "
	                  "\"optimizer\": {\"type\": \"sgd\", \"learning_rate\": 0.1}}", &n2);
	import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", "adam.");
	free(f2);
	/* a wrong shape */
	f2 = st_with_meta(file, len, "model",
	                  "{\"name\": \"m\", \"mlp\": {\"layers\": 3, \"d_model\": 16, \"d_hidden\": 20,"
	                  " \"activation\": \"gelu\", \"residual\": true}, \"loss\": \"mse\", "
	                  "\"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.1}}", &n2);
	import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", "[3, 16, 20]");
	free(f2);
	/* the last tensor left out (and its bytes): missing, named */
	h = st_header(file, len, &at);
	json_object_foreach(h, key, v) {
		json_int_t b;

		if (strcmp(key, "__metadata__") == 0)
			continue;
		b = json_integer_value(json_array_get(th_arr(v, "data_offsets"), 0));
		if (b > last_begin) {
			last_begin = b;
			last = key;
		}
	}
	ck_assert_ptr_nonnull(last);
	{
		char missing[64];

		snprintf(missing, sizeof missing, "'%s'", last);
		json_object_del(h, last);
		f2 = st_file(h, file + at, (size_t)last_begin, &n2);
		import_error(&Bd, f2, n2, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", missing);
		free(f2);
	}
	json_decref(h);
	/* not a checkpoint: an array export has no model metadata */
	{
		struct th_response e;
		char *ae;
		size_t alen;

		th_get(&A, "/v1/arrays:export?names=x", &e);
		ck_assert_int_eq(e.status, 200);
		alen = e.body_len;
		ae = malloc(alen);
		memcpy(ae, e.body, alen);
		th_response_free(&e);
		import_error(&Bd, ae, alen, 400, "INVALID_ARGUMENT", "BAD_CHECKPOINT", "__metadata__");
		free(ae);
	}
	/* nothing of any of them stayed: no model, no arrays */
	list = th_get_object(&Bd, "/v1/models");
	ck_assert_uint_eq(json_array_size(th_arr(list, "models")), 0);
	json_decref(list);
	list = th_get_object(&Bd, "/v1/arrays");
	ck_assert_uint_eq(json_array_size(th_arr(list, "arrays")), 0);
	json_decref(list);
	/* and the file itself imports, under another name too */
	th_import_ok(&Bd, NULL, file, len);
	th_import_ok(&Bd, "name=m2", file, len);
	list = th_get_object(&Bd, "/v1/models/m2");
	ck_assert_int_eq(th_int(list, "steps"), 1);
	json_decref(list);
	free(file);
}
END_TEST

START_TEST(test_export_errors)
{
	struct th_response r;

	th_get(&A, "/v1/models/nope:export", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "MODEL_NOT_FOUND");
	th_response_free(&r);
}
END_TEST

/* While a step changes the weights in place, export is refused naming
 * it; once it ends, the file carries the t the model shows. */
START_TEST(test_export_during_a_step)
{
	char path[300], *name, *file;
	json_t *op, *m, *h;
	size_t len, at;

	data_up(&A);
	create(&A, "r", "{\"type\": \"adam\", \"learning_rate\": 0.001}");
	op = th_post_json(&A, "/v1/models/r:step",
	               "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": 1000000}", 202);
	name = strdup(th_str(op, "name"));
	json_decref(op);
	th_get(&A, "/v1/models/r:export", &r_resp);
	th_assert_error(&r_resp, 409, "ABORTED", "ARRAY_HELD");
	ck_assert_msg(strstr(th_str(th_obj(th_json(&r_resp), "error"), "message"), "op-"),
	              "the refusal does not name the step: %s", r_resp.body);
	th_response_free(&r_resp);
	snprintf(path, sizeof path, "/v1/%s:cancel", name);
	th_request(&A, "POST", path, NULL, NULL, 0, &r_resp);
	ck_assert_msg(r_resp.status == 200, "cancel: %ld %s", r_resp.status, r_resp.body);
	th_response_free(&r_resp);
	snprintf(path, sizeof path, "/v1/%s:wait?timeout=60s", name);
	op = th_post_json(&A, path, "{}", 200);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "CANCELLED");
	json_decref(op);
	free(name);
	file = th_export_model(&A, "r", &len);
	m = th_get_object(&A, "/v1/models/r");
	h = st_header(file, len, &at);
	{
		char want[32];

		snprintf(want, sizeof want, "%lld", (long long)th_int(m, "steps"));
		ck_assert_str_eq(th_str(th_obj(h, "__metadata__"), "steps"), want);
	}
	json_decref(h);
	json_decref(m);
	free(file);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("checkpoint");
	TCase *tc = tcase_create("checkpoint");

	tcase_add_checked_fixture(tc, up, down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_resume_adam_bit_identical);
	tcase_add_test(tc, test_resume_adamw_schedule_bit_identical);
	tcase_add_test(tc, test_export_contents);
	tcase_add_test(tc, test_create_with_steps);
	tcase_add_test(tc, test_import_errors);
	tcase_add_test(tc, test_export_errors);
	tcase_add_test(tc, test_export_during_a_step);
	suite_add_tcase(s, tc);
	return s;
}
