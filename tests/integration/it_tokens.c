/*
 * it_tokens.c - Check suite "tokens": token models end to end against real
 * tstaged daemons. A uint16 token dataset (safetensors, inputs [N, T] and
 * the next tokens as targets [N, T]) is imported into pinned_host; a token
 * model (embedding table, two residual gelu layers, output projection,
 * softmax cross-entropy) is created with its parameters and Adam state on
 * pinned_host; steps run over batches of the dataset's rows, call after
 * call; the model is exported, imported into a fresh daemon, and continued
 * there with losses and weights bit-identical to a run that never stopped.
 * The measured device peak is the predicted one at every call, :analyze
 * predicts the step's analysis, and an id outside the vocabulary is a 400
 * naming it, leaving the model as it was.
 *
 * Each case runs forked with its own daemons.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <curl/curl.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CASE_TIMEOUT_S 300
#define NROWS 48          /* dataset rows */
#define T 16              /* tokens per row */
#define V 97              /* vocabulary */
#define BATCH 4           /* rows per step */
#define CALLS 8           /* :step calls */
#define PER_CALL 25       /* steps per call: 200 in all */
#define SPLIT 4           /* calls before the checkpoint */

static struct th_daemon A, Bd;
static const char *const args[] = {"--sim-device-memory", "256MiB", NULL};
static const char *const json_headers[] = {"Content-Type: application/json", NULL};
static const char *const octet_headers[] = {"Content-Type: application/octet-stream", NULL};

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

/* Whether the JSON text of o mentions word. */
static bool mentions(json_t *o, const char *word)
{
	char *text = json_dumps(o, 0);
	bool yes = text && strstr(text, word);

	free(text);
	return yes;
}

/* ---- the dataset ---------------------------------------------------------------------- */

/* A token stream with structure to learn (each token mostly follows from
 * the one before), cut into NROWS rows of T + 1: inputs are a row's first
 * T tokens, targets its last T. bad >= 0 puts that id at row 5, token 3. */
static char *dataset(size_t *len, int bad)
{
	static uint16_t in[NROWS][T], tg[NROWS][T];
	uint64_t s = 12345;
	char hdr[512], *f;
	size_t n, data = sizeof in + sizeof tg;

	for (int r = 0; r < NROWS; r++) {
		uint16_t tok = (uint16_t)(th_rand(&s) % V);

		for (int t = 0; t <= T; t++) {
			uint16_t next = (uint16_t)((th_rand(&s) % 4 == 0) ? th_rand(&s) % V
			                                                   : (tok * 7u + 3u) % V);

			if (t < T)
				in[r][t] = tok;
			if (t > 0)
				tg[r][t - 1] = tok;
			tok = next;
		}
	}
	if (bad >= 0)
		in[5][3] = (uint16_t)bad;
	n = (size_t)snprintf(hdr, sizeof hdr,
	                     "{\"inputs\":{\"dtype\":\"U16\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
	                     "\"targets\":{\"dtype\":\"U16\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
	                     NROWS, T, sizeof in, NROWS, T, sizeof in, data);
	while (n % 8)
		hdr[n++] = ' ';
	f = malloc(8 + n + data);
	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < 8; i++)
		f[i] = (char)((uint64_t)n >> (8 * i));
	memcpy(f + 8, hdr, n);
	memcpy(f + 8 + n, in, sizeof in);
	memcpy(f + 8 + n + sizeof in, tg, sizeof tg);
	*len = 8 + n + data;
	return f;
}

/* Imports the dataset into pinned_host as "{prefix}inputs", "{prefix}targets". */
static void dataset_up(struct th_daemon *d, const char *prefix, int bad)
{
	struct th_response r;
	char path[256];
	size_t len;
	char *f = dataset(&len, bad);
	json_t *a;

	snprintf(path, sizeof path, "/v1/arrays:import?prefix=%s&memory_kind=pinned_host&wait=true",
	         prefix);
	th_request(d, "POST", path, octet_headers, f, len, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "import: %ld %s", r.status, r.body);
	th_response_free(&r);
	free(f);
	snprintf(path, sizeof path, "/v1/arrays/%sinputs", prefix);
	a = th_get_object(d, path);
	ck_assert_str_eq(th_str(a, "dtype"), "uint16");
	ck_assert_msg(mentions(a, "pinned_host"), "the dataset is not on pinned_host");
	json_decref(a);
}

/* ---- the model ------------------------------------------------------------------------ */

#define SPEC                                                                                 \
	"{\"name\": \"%s\", \"mlp\": {\"layers\": 2, \"d_model\": 24, \"d_hidden\": 40, "        \
	"\"activation\": \"gelu\", \"residual\": true, \"vocab\": %d, \"projection\": true}, "    \
	"\"loss\": \"softmax_cross_entropy\", "                                                \
	"\"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.01, \"clip_global_norm\": 1.0}, " \
	"\"placement\": {\"params\": \"pinned_host\", \"opt_state\": \"pinned_host\"}, "          \
	"\"init\": {\"seed\": 5, \"scale\": 0.2}}"

static const char *const roles[] = {"embed", "proj", "w1", "w2", "adam.mu.embed",
                                    "adam.nu.embed", "adam.mu.proj", "adam.nu.proj",
                                    "adam.mu.w1", "adam.nu.w1", "adam.mu.w2", "adam.nu.w2"};

static void create(struct th_daemon *d, const char *name)
{
	char spec[1024];
	json_t *m;

	snprintf(spec, sizeof spec, SPEC, name, V);
	m = th_post_json(d, "/v1/models?wait=true", spec, 200);
	json_decref(m);
	snprintf(spec, sizeof spec, "/v1/arrays/%s.embed", name);
	m = th_get_object(d, spec);
	ck_assert_msg(mentions(m, "pinned_host"), "embed is not on pinned_host");
	json_decref(m);
}

/* Every array of model ma on da (weights, Adam state) has the bytes of
 * model mb's on db. */
static void same_arrays(struct th_daemon *da, const char *ma, struct th_daemon *db,
                        const char *mb)
{
	for (size_t r = 0; r < sizeof roles / sizeof roles[0]; r++) {
		char a[64];
		size_t n0, n1;
		char *w0, *w1;

		snprintf(a, sizeof a, "%s.%s", ma, roles[r]);
		w0 = th_download(da, a, &n0);
		snprintf(a, sizeof a, "%s.%s", mb, roles[r]);
		w1 = th_download(db, a, &n1);
		th_assert_bytes(a, w1, n1, w0, n0);
		free(w0);
		free(w1);
	}
}

/* The rows of call c: BATCH rows starting at (c * BATCH) % NROWS. */
static void rows_of(int c, char *buf, size_t cap)
{
	int at = (c * BATCH) % NROWS, n = 0;

	n += snprintf(buf + n, cap - (size_t)n, "[");
	for (int i = 0; i < BATCH; i++)
		n += snprintf(buf + n, cap - (size_t)n, "%s%d", i ? ", " : "", (at + i) % NROWS);
	snprintf(buf + n, cap - (size_t)n, "]");
}

/* Call c: PER_CALL steps of name on d over its rows; losses appended to out. */
static void call(struct th_daemon *d, const char *name, const char *prefix, int c, double *out)
{
	char path[256], body[512], rows[128];
	json_t *res, *losses;

	rows_of(c, rows, sizeof rows);
	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", name);
	snprintf(body, sizeof body,
	         "{\"inputs\": {\"array\": \"%sinputs\", \"rows\": %s}, "
	         "\"targets\": {\"array\": \"%stargets\", \"rows\": %s}, \"steps\": %d}",
	         prefix, rows, prefix, rows, PER_CALL);
	res = th_post_json(d, path, body, 200);
	losses = th_arr(res, "losses");
	ck_assert_uint_eq(json_array_size(losses), PER_CALL);
	for (int i = 0; i < PER_CALL; i++)
		out[i] = json_number_value(json_array_get(losses, (size_t)i));
	/* the plan is exact for token models too */
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	ck_assert_int_eq(th_int(res, "measured_temp_size_in_bytes"),
	                 th_int(res, "predicted_temp_size_in_bytes"));
	json_decref(res);
}

/* ---- the cases ------------------------------------------------------------------------- */

START_TEST(test_tokens_train_checkpoint_resume)
{
	double whole[CALLS * PER_CALL], part[CALLS * PER_CALL];
	size_t len;
	char *file;
	json_t *m;

	dataset_up(&A, "gpt.", -1);
	dataset_up(&Bd, "gpt.", -1);
	create(&A, "u");
	create(&A, "c");
	for (int c = 0; c < CALLS; c++)
		call(&A, "u", "gpt.", c, whole + c * PER_CALL);
	for (int c = 0; c < SPLIT; c++)
		call(&A, "c", "gpt.", c, part + c * PER_CALL);
	file = th_export_model(&A, "c", &len);
	th_import_ok(&Bd, NULL, file, len);
	m = th_get_object(&Bd, "/v1/models/c");
	ck_assert_int_eq(th_int(m, "steps"), SPLIT * PER_CALL);
	ck_assert_int_eq(th_int(th_obj(m, "mlp"), "vocab"), V);
	json_decref(m);
	for (int c = SPLIT; c < CALLS; c++)
		call(&Bd, "c", "gpt.", c, part + c * PER_CALL);
	for (int i = 0; i < CALLS * PER_CALL; i++)
		ck_assert_msg(part[i] == whole[i], "step %d: loss %.17g, uninterrupted %.17g", i + 1,
		              part[i], whole[i]);
	/* it learns: the first loss is about log(V), the last well below */
	fprintf(stderr, "tokens: %d steps, loss %.5f -> %.5f\n", CALLS * PER_CALL, whole[0],
	        whole[CALLS * PER_CALL - 1]);
	ck_assert_msg(whole[0] > 4.0 && whole[0] < 5.2, "first loss %g", whole[0]);
	ck_assert_msg(whole[CALLS * PER_CALL - 1] < whole[0] - 1.0, "last loss %g, first %g",
	              whole[CALLS * PER_CALL - 1], whole[0]);
	same_arrays(&A, "u", &Bd, "c");
	free(file);
}
END_TEST

/* :analyze of [B, T] uint16 ids predicts what the step measures. */
START_TEST(test_tokens_analyze_matches_step)
{
	json_t *an, *res;
	char body[512], rows[128];

	dataset_up(&A, "", -1);
	create(&A, "a");
	an = th_post_json(&A, "/v1/models/a:analyze",
	               "{\"batch\": [4, 16], \"dtype\": \"uint16\"}", 200);
	rows_of(0, rows, sizeof rows);
	snprintf(body, sizeof body,
	         "{\"inputs\": {\"array\": \"inputs\", \"rows\": %s}, "
	         "\"targets\": {\"array\": \"targets\", \"rows\": %s}, \"steps\": 2}", rows, rows);
	res = th_post_json(&A, "/v1/models/a:step?wait=true", body, 200);
	ck_assert_int_eq(th_int(an, "peak_device_bytes"),
	                 th_int(res, "measured_peak_device_bytes"));
	ck_assert_int_eq(th_int(an, "host_argument_size_in_bytes"),
	                 th_int(th_obj(res, "analysis"), "host_argument_size_in_bytes"));
	/* the table, the projection and their Adam state are host arguments */
	ck_assert_int_ge(th_int(an, "host_argument_size_in_bytes"), 6 * V * 24 * 4);
	json_decref(an);
	json_decref(res);
	/* float inputs, or a batch that is not [B, T], are refused */
	json_decref(th_post_json(&A, "/v1/models/a:analyze", "{\"batch\": [4, 16], \"dtype\": \"float32\"}",
	                      400));
}
END_TEST

/* An id outside the vocabulary: 400 naming it, and nothing changes. */
START_TEST(test_tokens_bad_id_refused)
{
	struct th_response r;
	char body[512], etag[128];
	const char *msg;
	json_t *m;

	dataset_up(&A, "", 200);
	create(&A, "b");
	th_get(&A, "/v1/arrays/b.embed", &r);
	snprintf(etag, sizeof etag, "%s", th_header(&r, "ETag") ? th_header(&r, "ETag") : "");
	th_response_free(&r);
	snprintf(body, sizeof body,
	         "{\"inputs\": {\"array\": \"inputs\", \"rows\": [4, 5]}, "
	         "\"targets\": {\"array\": \"targets\", \"rows\": [4, 5]}, \"steps\": 3}");
	th_request(&A, "POST", "/v1/models/b:step?wait=true", json_headers, body, strlen(body), &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_TOKEN");
	msg = th_str(th_obj(th_json(&r), "error"), "message");
	ck_assert_msg(strstr(msg, "200") && strstr(msg, "row 1") && strstr(msg, "position 3"),
	              "%s", msg);
	th_response_free(&r);
	m = th_get_object(&A, "/v1/models/b");
	ck_assert_int_eq(th_int(m, "steps"), 0);
	json_decref(m);
	th_get(&A, "/v1/arrays/b.embed", &r);
	ck_assert_str_eq(th_header(&r, "ETag") ? th_header(&r, "ETag") : "", etag);
	th_response_free(&r);
	/* rows without the bad id train */
	snprintf(body, sizeof body,
	         "{\"inputs\": {\"array\": \"inputs\", \"rows\": [0, 1]}, "
	         "\"targets\": {\"array\": \"targets\", \"rows\": [0, 1]}, \"steps\": 1}");
	json_decref(th_post_json(&A, "/v1/models/b:step?wait=true", body, 200));
	/* a model spec that does not fit tokens is refused */
	json_decref(th_post_json(&A, "/v1/models",
	                      "{\"name\": \"x\", \"mlp\": {\"layers\": 1, \"d_model\": 8, \"vocab\": 9}}",
	                      400));
	json_decref(th_post_json(&A, "/v1/models",
	                      "{\"name\": \"x\", \"mlp\": {\"layers\": 1, \"d_model\": 8, \"vocab\": 0}}",
	                      400));
	json_decref(th_post_json(&A, "/v1/models",
	                      "{\"name\": \"x\", \"mlp\": {\"layers\": 1, \"d_model\": 8}, "
	                      "\"loss\": \"softmax_cross_entropy\"}", 400));
}
END_TEST


/*
 * Data-driven runs of a token model: "batches" of rows of the [N, T] uint16
 * dataset equal the same rows given call by call; an id outside the
 * vocabulary in a later batch (staged while a step computes) is 400
 * BAD_TOKEN, and the failed operation keeps what the steps before it did.
 */
START_TEST(test_tokens_batches)
{
	double a[6], b[6];
	char body[512], rows[128];
	const char *msg;
	struct th_response r;
	json_t *res, *losses;

	dataset_up(&A, "", -1);
	dataset_up(&Bd, "", 200);           /* row 5 holds id 200 at position 3 */
	create(&A, "da");
	create(&A, "db");
	res = th_post_json(&A, "/v1/models/da:step?wait=true",
	                "{\"inputs\": \"inputs\", \"targets\": \"targets\", \"steps\": 6, "
	                "\"batches\": {\"batch_size\": 4}}", 200);
	losses = th_arr(res, "losses");
	ck_assert_uint_eq(json_array_size(losses), 6);
	for (int i = 0; i < 6; i++)
		a[i] = json_number_value(json_array_get(losses, (size_t)i));
	ck_assert_int_eq(th_int(th_obj(res, "batches"), "next"), 24);
	ck_assert_int_eq(th_int(th_obj(res, "bytes_moved"), "staged_h2d"), 6 * 2 * BATCH * T * 2);
	json_decref(res);
	for (int c = 0; c < 6; c++) {
		rows_of(c, rows, sizeof rows);
		snprintf(body, sizeof body,
		         "{\"inputs\": {\"array\": \"inputs\", \"rows\": %s}, "
		         "\"targets\": {\"array\": \"targets\", \"rows\": %s}}", rows, rows);
		res = th_post_json(&A, "/v1/models/db:step?wait=true", body, 200);
		b[c] = json_number_value(json_array_get(th_arr(res, "losses"), 0));
		json_decref(res);
	}
	for (int i = 0; i < 6; i++)
		ck_assert_msg(a[i] == b[i], "step %d: batches %.17g, rows %.17g", i + 1, a[i], b[i]);
	/* the second batch (rows 4..7) holds the bad id: found as it is staged */
	create(&Bd, "dc");
	th_request(&Bd, "POST", "/v1/models/dc:step?wait=true", json_headers,
	           "{\"inputs\": \"inputs\", \"targets\": \"targets\", \"steps\": 3, "
	           "\"batches\": {\"batch_size\": 4}}", strlen("{\"inputs\": \"inputs\", "
	           "\"targets\": \"targets\", \"steps\": 3, \"batches\": {\"batch_size\": 4}}"), &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_TOKEN");
	msg = th_str(th_obj(th_json(&r), "error"), "message");
	ck_assert_msg(strstr(msg, "200") && strstr(msg, "row 1") && strstr(msg, "position 3"),
	              "%s", msg);
	th_response_free(&r);
	/* the first batch's step ran and is kept, as any failed run's */
	res = th_get_object(&Bd, "/v1/models/dc");
	ck_assert_int_eq(th_int(res, "steps"), 1);
	json_decref(res);
	/* and the failed operation says so: its loss, the step count and where
	 * to continue (the batch after the one that failed is not drawn) */
	res = th_get_object(&Bd, "/v1/operations?state=FAILED");
	{
		json_t *op = json_array_get(th_arr(res, "operations"), 0), *part;

		ck_assert_ptr_nonnull(op);
		ck_assert_str_eq(th_str(th_obj(op, "error"), "status"), "INVALID_ARGUMENT");
		part = th_op_meta(op, "partial_result");
		ck_assert_int_eq(th_int(part, "steps"), 1);
		ck_assert_uint_eq(json_array_size(th_arr(part, "losses")), 1);
		ck_assert_int_eq(th_int(part, "model_steps"), 1);
		ck_assert_int_eq(th_int(th_obj(part, "batches"), "next"), 4);
	}
	json_decref(res);
}
END_TEST

/* Ids [B] int32, no projection (d_model == vocab), no optimizer: the
 * gradients of the table and the layers are arrays; they go with the model. */
START_TEST(test_tokens_rank1_no_projection_gradients)
{
	static const int32_t ids[6] = {3, 3, 0, 7, 3, 1}, tg[6] = {1, 2, 3, 4, 5, 6};
	struct th_response r;
	json_t *res, *g;
	size_t n;
	char *x;

	th_request(&A, "PUT", "/v1/arrays/ids?dtype=int32&shape=6", NULL, (const char *)ids,
	           sizeof ids, &r);
	ck_assert_msg(r.status == 201 || r.status == 200, "PUT ids: %ld %s", r.status, r.body);
	th_response_free(&r);
	th_request(&A, "PUT", "/v1/arrays/tg?dtype=int32&shape=6", NULL, (const char *)tg,
	           sizeof tg, &r);
	th_response_free(&r);
	json_decref(th_post_json(&A, "/v1/models?wait=true",
	                      "{\"name\": \"g\", \"mlp\": {\"layers\": 1, \"d_model\": 8, "
	                      "\"d_hidden\": 4, \"vocab\": 8}, \"init\": {\"seed\": 2}}", 200));
	res = th_post_json(&A, "/v1/models/g:step?wait=true",
	                "{\"inputs\": \"ids\", \"targets\": \"tg\"}", 200);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	json_decref(res);
	g = th_get_object(&A, "/v1/arrays/g.grad.embed");
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(g, "shape"), 0)), 8);
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(g, "shape"), 1)), 8);
	json_decref(g);
	/* rows of ids never seen (2, 4, 5, 6) have no gradient; id 3's is the sum of three */
	x = th_download(&A, "g.grad.embed", &n);
	ck_assert_uint_eq(n, 8 * 8 * sizeof(float));
	for (int v = 0; v < 8; v++) {
		bool seen = v == 0 || v == 1 || v == 3 || v == 7, any = false;

		for (int c = 0; c < 8; c++)
			any = any || ((float *)(void *)x)[v * 8 + c] != 0.0f;
		ck_assert_msg(any == seen, "grad.embed row %d: %s", v, any ? "nonzero" : "zero");
	}
	free(x);
	th_request(&A, "DELETE", "/v1/models/g", NULL, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	th_get(&A, "/v1/arrays/g.grad.embed", &r);
	ck_assert_int_eq(r.status, 404);
	th_response_free(&r);
}
END_TEST

/* ---- evaluation ------------------------------------------------------------------------ */

/* The ETag of an array (new string). */
static char *etag_of(struct th_daemon *d, const char *name)
{
	struct th_response r;
	char path[256], *e;

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	th_get(d, path, &r);
	ck_assert_msg(r.status == 200 && th_header(&r, "ETag"), "GET %s: %ld", path, r.status);
	e = strdup(th_header(&r, "ETag"));
	th_response_free(&r);
	return e;
}

/* Writes array name of d to dir/file and returns the path in buf. */
static const char *save_array(struct th_daemon *d, const char *name, const char *dir,
                              const char *file, char *buf, size_t cap, size_t keep)
{
	size_t n;
	char *x = th_download(d, name, &n);

	snprintf(buf, cap, "%s/%s", dir, file);
	th_write_file(buf, x, keep && keep < n ? keep : n);
	free(x);
	return buf;
}

/* The float64 reference of model m's forward pass on the first `rows` rows
 * of the dataset: its loss; its logits [rows * T, V] into *logits (new). */
static double token_reference(struct th_daemon *d, const char *m, int rows, float **logits)
{
	char dir[512], p[7][600], a[128], spec_path[600], cmd[2048], res_path[700];
	const char *parts[5] = {"embed", "w1", "w2", "proj", NULL};
	json_t *spec, *res;
	json_error_t e;
	size_t n;
	double loss;
	int st;

	th_temp_dir("token-eval", dir, sizeof dir);
	for (int i = 0; parts[i]; i++) {
		snprintf(a, sizeof a, "%s.%s", m, parts[i]);
		save_array(d, a, dir, parts[i], p[i], sizeof p[i], 0);
	}
	save_array(d, "inputs", dir, "inputs", p[4], sizeof p[4], (size_t)rows * T * 2);
	save_array(d, "targets", dir, "targets", p[5], sizeof p[5], (size_t)rows * T * 2);
	snprintf(p[6], sizeof p[6], "%s/out", dir);
	spec = json_pack("{s:i, s:i, s:i, s:i, s:s, s:b, s:b, s:s, s:i, s:s, s:s, s:s, s:s, s:s,"
	                 " s:s, s:s}",
	                 "layers", 2, "d_model", 24, "d_hidden", 40, "vocab", V, "activation", "gelu",
	                 "residual", 1, "projection", 1, "id_dtype", "uint16", "tokens", rows * T,
	                 "embed", p[0], "w1", p[1], "w2", p[2], "proj", p[3], "inputs", p[4],
	                 "targets", p[5], "out", p[6]);
	ck_assert_ptr_nonnull(spec);
	snprintf(spec_path, sizeof spec_path, "%s/spec.json", dir);
	ck_assert_int_eq(json_dump_file(spec, spec_path, 0), 0);
	json_decref(spec);
	snprintf(cmd, sizeof cmd, "python3 '%s/token_eval_reference.py' '%s'", th_py_dir(),
	         spec_path);
	st = system(cmd);
	ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	              "'%s' failed (status %d): it needs python3 and numpy", cmd, st);
	snprintf(res_path, sizeof res_path, "%s/result.json", p[6]);
	res = json_load_file(res_path, 0, &e);
	ck_assert_msg(res != NULL, "%s: %s", res_path, e.text);
	loss = json_number_value(json_object_get(res, "loss"));
	json_decref(res);
	snprintf(res_path, sizeof res_path, "%s/logits.f32", p[6]);
	*logits = (float *)(void *)th_read_file(res_path, &n);
	ck_assert_uint_eq(n, (size_t)rows * T * V * sizeof(float));
	return loss;
}

/* POST :evaluate?wait=true of model m on rows 0..3 (new reference). */
static json_t *evaluate4(struct th_daemon *d, const char *m, const char *outputs)
{
	char path[256], body[768];

	snprintf(path, sizeof path, "/v1/models/%s:evaluate?wait=true", m);
	snprintf(body, sizeof body,
	         "{\"inputs\": {\"array\": \"inputs\", \"rows\": [0, 1, 2, 3]}, "
	         "\"targets\": {\"array\": \"targets\", \"rows\": [0, 1, 2, 3]}%s%s}",
	         outputs ? ", \"outputs\": " : "", outputs ? outputs : "");
	return th_post_json(d, path, body, 200);
}

/*
 * :evaluate of a token model: the forward-only plan gathers the embedding,
 * runs the layers, projects and takes the cross-entropy. Its loss is the
 * loss the following :step reports for the same batch, bit for bit; no
 * weight or optimizer state changes its ETag; the logits, written where the
 * request places them, match a float64 numpy reference from the model's
 * downloaded weights; params offloaded to pinned_host and on the device give
 * the same bits; the measured peak is the predicted one.
 */
START_TEST(test_tokens_evaluate)
{
	char spec[1024], outs[256], *tags[sizeof roles / sizeof roles[0]], a[64], *lg, *lgd;
	struct th_response r;
	double loss, ref_loss, scale = 0, step_loss;
	float *ref;
	size_t n, nd;
	json_t *res, *o, *m, *an;

	dataset_up(&A, "", -1);
	create(&A, "e");
	/* the same model (same seed) with everything on the device */
	snprintf(spec, sizeof spec, SPEC, "ed", V);
	{
		char *at = strstr(spec, "\"placement\"");
		const char *dev = "\"placement\": {\"params\": \"device\", \"opt_state\": \"device\"}, "
		                  "\"init\": {\"seed\": 5, \"scale\": 0.2}}";

		ck_assert_ptr_nonnull(at);
		snprintf(at, sizeof spec - (size_t)(at - spec), "%s", dev);
	}
	json_decref(th_post_json(&A, "/v1/models?wait=true", spec, 200));
	for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
		snprintf(a, sizeof a, "e.%s", roles[i]);
		tags[i] = etag_of(&A, a);
	}
	/* offloaded params, logits to pinned_host */
	snprintf(outs, sizeof outs, "{\"name\": \"lg\", \"device\": \"%s\", \"memory_kind\": "
	         "\"pinned_host\"}", th_dev(0));
	an = th_post_json(&A, "/v1/models/e:analyze", "{\"batch\": [4, 16], \"dtype\": \"uint16\", "
	               "\"mode\": \"evaluate\", \"outputs\": {\"memory_kind\": \"pinned_host\"}}", 200);
	res = evaluate4(&A, "e", outs);
	loss = json_number_value(json_object_get(res, "loss"));
	/* :analyze predicted it before the run */
	ck_assert_int_eq(th_int(an, "peak_device_bytes"), th_int(res, "measured_peak_device_bytes"));
	ck_assert_int_eq(th_int(an, "host_output_size_in_bytes"), 4 * T * V * 4);
	json_decref(an);
	ck_assert_int_eq(th_int(res, "batch"), 4 * T);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	ck_assert_int_eq(th_int(res, "measured_temp_size_in_bytes"),
	                 th_int(res, "predicted_temp_size_in_bytes"));
	ck_assert_int_ge(th_int(th_obj(res, "analysis"), "host_argument_size_in_bytes"),
	                 2 * V * 24 * 4);
	o = th_obj(res, "outputs");
	ck_assert_str_eq(th_str(o, "dtype"), "float32");
	ck_assert_uint_eq(json_array_size(th_arr(o, "shape")), 3);
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(o, "shape"), 0)), 4);
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(o, "shape"), 1)), T);
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(o, "shape"), 2)), V);
	ck_assert_msg(mentions(o, "pinned_host"), "outputs not on pinned_host: %s", json_dumps(o, 0));
	json_decref(res);
	/* nothing of the model changed */
	for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
		char *now;

		snprintf(a, sizeof a, "e.%s", roles[i]);
		now = etag_of(&A, a);
		ck_assert_msg(strcmp(now, tags[i]) == 0, "%s: ETag %s, was %s", a, now, tags[i]);
		free(now);
	}
	m = th_get_object(&A, "/v1/models/e");
	ck_assert_int_eq(th_int(m, "steps"), 0);
	json_decref(m);
	/* the logits and the loss against the float64 reference */
	ref_loss = token_reference(&A, "e", 4, &ref);
	lg = th_download(&A, "lg", &n);
	ck_assert_uint_eq(n, (size_t)4 * T * V * sizeof(float));
	for (size_t i = 0; i < n / sizeof(float); i++)
		scale = fmax(scale, fabs((double)ref[i]));
	for (size_t i = 0; i < n / sizeof(float); i++) {
		double got = ((float *)(void *)lg)[i];

		ck_assert_msg(fabs(got - ref[i]) <= 1e-5 * scale, "logit %zu is %.9g, reference %.9g",
		              i, got, (double)ref[i]);
	}
	ck_assert_msg(fabs(loss - ref_loss) <= 1e-5 * fabs(ref_loss), "loss %.9g, reference %.9g",
	              loss, ref_loss);
	/* everything on the device, logits on the device: the same bits */
	snprintf(outs, sizeof outs, "{\"name\": \"lgd\", \"device\": \"%s\", \"memory_kind\": "
	         "\"device\"}", th_dev(0));
	res = evaluate4(&A, "ed", outs);
	ck_assert_msg(json_number_value(json_object_get(res, "loss")) == loss,
	              "device params: loss %.17g, offloaded %.17g",
	              json_number_value(json_object_get(res, "loss")), loss);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	json_decref(res);
	lgd = th_download(&A, "lgd", &nd);
	th_assert_bytes("logits on the device", lgd, nd, lg, n);
	/* the step's loss for the same batch (before its update) is the same */
	res = th_post_json(&A, "/v1/models/e:step?wait=true",
	                "{\"inputs\": {\"array\": \"inputs\", \"rows\": [0, 1, 2, 3]}, "
	                "\"targets\": {\"array\": \"targets\", \"rows\": [0, 1, 2, 3]}}", 200);
	step_loss = json_number_value(json_array_get(th_arr(res, "losses"), 0));
	ck_assert_msg(step_loss == loss, "step loss %.17g, evaluation %.17g", step_loss, loss);
	json_decref(res);
	/* and after it, an evaluation sees the updated weights */
	res = evaluate4(&A, "e", NULL);
	ck_assert_msg(json_number_value(json_object_get(res, "loss")) != loss,
	              "the evaluation after a step gives the loss before it");
	json_decref(res);
	/* a token model without targets answers its logits only: it needs
	 * outputs to write them to; and ids */
	th_request(&A, "POST", "/v1/models/e:evaluate?wait=true", json_headers,
	           "{\"inputs\": \"inputs\"}", strlen("{\"inputs\": \"inputs\"}"), &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "NO_OUTPUTS");
	th_response_free(&r);
	{
		json_t *w = th_post_json(&A, "/v1/models/e:evaluate?wait=true",
		                         "{\"inputs\": {\"array\": \"inputs\", \"rows\": [0, 1]}, "
		                         "\"targets\": {\"array\": \"targets\", \"rows\": [0, 1]}, "
		                         "\"outputs\": {\"name\": \"lt\"}}", 200);
		json_t *nt = th_post_json(&A, "/v1/models/e:evaluate?wait=true",
		                         "{\"inputs\": {\"array\": \"inputs\", \"rows\": [0, 1]}, "
		                         "\"outputs\": {\"name\": \"ln\"}}", 200);
		size_t n1, n2;
		float *l1 = th_download_floats(&A, "lt", &n1), *l2 = th_download_floats(&A, "ln", &n2);

		ck_assert_ptr_nonnull(json_object_get(w, "loss"));
		ck_assert_ptr_null(json_object_get(nt, "loss"));
		ck_assert_int_eq(th_int(nt, "measured_peak_device_bytes"),
		                 th_int(nt, "predicted_peak_device_bytes"));
		ck_assert(n1 == n2 && n1 > 0 && memcmp(l1, l2, n1 * sizeof *l1) == 0);
		free(l1);
		free(l2);
		json_decref(w);
		json_decref(nt);
	}
	th_request(&A, "PUT", "/v1/arrays/fx?dtype=float32&shape=2,24", NULL, (const char *)ref,
	           2 * 24 * sizeof(float), &r);
	th_response_free(&r);
	th_request(&A, "POST", "/v1/models/e:evaluate?wait=true", json_headers,
	           "{\"inputs\": \"fx\", \"targets\": \"fx\"}",
	           strlen("{\"inputs\": \"fx\", \"targets\": \"fx\"}"), &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_INPUTS");
	th_response_free(&r);
	for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
		free(tags[i]);
	free(ref);
	free(lg);
	free(lgd);
}
END_TEST

/* ---- windows of a token stream --------------------------------------------------------- */

#define SN 327            /* stream tokens: 20 windows of T, and 6 tokens no window reads */
#define SW ((SN - 1) / T) /* windows an epoch */

/* The stream: structured tokens as the dataset's; with bad_tail, the
 * tokens after the last whole window (SW * T + 1 onwards) are outside the
 * vocabulary, so that any read of them fails. */
static void stream_make(uint16_t *x, bool bad_tail)
{
	uint64_t s = 777;
	uint16_t tok = 5;

	for (int i = 0; i < SN; i++) {
		x[i] = tok;
		tok = (uint16_t)((th_rand(&s) % 4 == 0) ? th_rand(&s) % V : (tok * 7u + 3u) % V);
	}
	for (int i = SW * T + 1; bad_tail && i < SN; i++)
		x[i] = 200;
}

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* docs/API.md's offset of window q: sequential (q mod W) * T; random
 * splitmix64(seed, q) mod (n - T). Never past the end. */
static uint64_t win_offset(bool random, uint64_t seed, uint64_t q)
{
	uint64_t o = random ? mix64(seed + (q + 1) * 0x9e3779b97f4a7c15ull) % (SN - T)
	                    : (q % SW) * T;

	ck_assert_uint_le(o + T + 1, SN);
	return o;
}

/* One step of model m on explicit copies of step i's windows: inputs and
 * targets arrays [BATCH, T] built here from the stream; its result. */
static json_t *explicit_step(struct th_daemon *d, const char *m, const uint16_t *x, bool random,
                             uint64_t seed, uint64_t start, uint64_t i)
{
	uint16_t in[BATCH][T], tg[BATCH][T];
	char path[128];

	for (int b = 0; b < BATCH; b++) {
		uint64_t o = win_offset(random, seed, start + i * BATCH + (uint64_t)b);

		memcpy(in[b], x + o, sizeof in[b]);
		memcpy(tg[b], x + o + 1, sizeof tg[b]);
	}
	th_put_array(d, "xin", "dtype=uint16&shape=4,16", in, sizeof in);
	th_put_array(d, "xtg", "dtype=uint16&shape=4,16", tg, sizeof tg);
	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", m);
	return th_post_json(d, path, "{\"inputs\": \"xin\", \"targets\": \"xtg\"}", 200);
}

/* The losses (and learning rates, norms) of a windows result equal, bit
 * for bit, those of the same steps run on explicit copies; the weights
 * after them too. */
static void windows_vs_copies(const char *order, uint64_t seed, uint64_t start, int steps,
                              bool bad_tail)
{
	static uint16_t x[SN];
	bool random = order[0] == 'r';
	char body[512];
	json_t *res, *w;

	stream_make(x, bad_tail);
	/* any shape: the stream is read flat */
	th_put_array(&A, "stream", "dtype=uint16&shape=3,109&memory_kind=pinned_host", x, sizeof x);
	create(&A, "win");
	create(&A, "cp");
	snprintf(body, sizeof body,
	         "{\"windows\": {\"array\": \"stream\", \"context\": %d, \"batch_size\": %d, "
	         "\"order\": \"%s\", \"seed\": %llu, \"start\": %llu}, \"steps\": %d}", T, BATCH,
	         order, (unsigned long long)seed, (unsigned long long)start, steps);
	res = th_post_json(&A, "/v1/models/win:step?wait=true", body, 200);
	ck_assert_int_eq(th_int(res, "measured_peak_device_bytes"),
	                 th_int(res, "predicted_peak_device_bytes"));
	/* each step stages its windows' tokens, twice (inputs and targets) */
	ck_assert_int_eq(th_int(th_obj(res, "bytes_moved"), "staged_h2d"),
	                 (json_int_t)steps * 2 * BATCH * T * 2);
	w = th_obj(res, "windows");
	ck_assert_int_eq(th_int(w, "next"), (json_int_t)(start + (uint64_t)steps * BATCH));
	ck_assert_int_eq(th_int(w, "epoch"), (json_int_t)((start + (uint64_t)steps * BATCH) / SW));
	ck_assert_int_eq(th_int(w, "windows_per_epoch"), SW);
	ck_assert_int_eq(th_int(w, "tokens"), SN);
	ck_assert_uint_eq(json_array_size(th_arr(res, "learning_rates")), (size_t)steps);
	ck_assert_uint_eq(json_array_size(th_arr(res, "grad_norms")), (size_t)steps);
	for (int i = 0; i < steps; i++) {
		json_t *one = explicit_step(&A, "cp", x, random, seed, start, (uint64_t)i);
		static const char *const per[] = {"losses", "learning_rates", "grad_norms"};

		for (int k = 0; k < 3; k++) {
			double a = json_number_value(json_array_get(th_arr(res, per[k]), (size_t)i));
			double b = json_number_value(json_array_get(th_arr(one, per[k]), 0));

			ck_assert_msg(a == b && isfinite(a), "%s step %d: windows %.17g, copies %.17g",
			              per[k], i + 1, a, b);
		}
		json_decref(one);
	}
	/* a constant rate, a positive norm */
	ck_assert_msg(json_number_value(json_array_get(th_arr(res, "learning_rates"), 0)) ==
	              (double)0.01f, "learning rate");
	ck_assert_msg(json_number_value(json_array_get(th_arr(res, "grad_norms"), 0)) > 0, "norm");
	same_arrays(&A, "win", &A, "cp");
	json_decref(res);
}

/*
 * Sequential windows equal explicit inputs/targets copies, bit for bit,
 * across an epoch's end (6 steps of 4 windows: 24 > 20 windows an epoch,
 * wrapping to 0), on a stream whose length is not a multiple of T whose
 * tail (after the last whole window) no window reads: ids there are
 * outside the vocabulary and nothing fails.
 */
START_TEST(test_tokens_windows_sequential)
{
	windows_vs_copies("sequential", 0, 0, 6, true);
}
END_TEST

/* Random windows (SplitMix64 from the seed, as docs/API.md defines them),
 * from a start in the middle, equal explicit copies bit for bit. */
START_TEST(test_tokens_windows_random)
{
	windows_vs_copies("random", 11, 7, 5, false);
}
END_TEST

/*
 * Calls that continue where the last stopped ("start": next) draw the
 * windows of one longer run: the same losses; :evaluate over windows gives
 * the next step's loss for those windows and logits [B, T, V]; a stream of
 * exactly T + 1 tokens holds one window, read whole, never past the end.
 */
START_TEST(test_tokens_windows_continue)
{
	static uint16_t x[SN];
	double whole[7], part[7];
	char body[512];
	json_t *res;
	int at = 0;

	stream_make(x, true);
	th_put_array(&A, "stream", "dtype=uint16&shape=327&memory_kind=pinned_host", x, sizeof x);
	create(&A, "w1");
	create(&A, "w2");
	res = th_post_json(&A, "/v1/models/w1:step?wait=true",
	                   "{\"windows\": {\"array\": \"stream\", \"context\": 16, \"batch_size\": 4}, "
	                   "\"steps\": 7}", 200);
	for (int i = 0; i < 7; i++)
		whole[i] = json_number_value(json_array_get(th_arr(res, "losses"), (size_t)i));
	ck_assert_int_eq(th_int(th_obj(res, "windows"), "next"), 28);
	ck_assert_int_eq(th_int(th_obj(res, "windows"), "epoch"), 1);
	json_decref(res);
	for (int c = 0, start = 0; c < 3; c++) {
		int steps = c == 2 ? 1 : 3;

		snprintf(body, sizeof body,
		         "{\"windows\": {\"array\": \"stream\", \"context\": 16, \"batch_size\": 4, "
		         "\"start\": %d}, \"steps\": %d}", start, steps);
		res = th_post_json(&A, "/v1/models/w2:step?wait=true", body, 200);
		for (int i = 0; i < steps; i++)
			part[at++] = json_number_value(json_array_get(th_arr(res, "losses"), (size_t)i));
		start = (int)th_int(th_obj(res, "windows"), "next");
		json_decref(res);
	}
	for (int i = 0; i < 7; i++)
		ck_assert_msg(part[i] == whole[i], "step %d: in parts %.17g, whole %.17g", i + 1,
		              part[i], whole[i]);
	/* :evaluate of windows 28..31 is the loss the next step reports first */
	res = th_post_json(&A, "/v1/models/w1:evaluate?wait=true",
	                   "{\"windows\": {\"array\": \"stream\", \"context\": 16, \"batch_size\": 4, "
	                   "\"start\": 28}, \"outputs\": {\"name\": \"wl\"}}", 200);
	{
		double ev = json_number_value(json_object_get(res, "loss"));
		json_t *shape = th_arr(th_obj(res, "outputs"), "shape");
		json_t *st;

		ck_assert_int_eq(json_integer_value(json_array_get(shape, 0)), 4);
		ck_assert_int_eq(json_integer_value(json_array_get(shape, 1)), 16);
		ck_assert_int_eq(json_integer_value(json_array_get(shape, 2)), V);
		ck_assert_int_eq(th_int(th_obj(res, "windows"), "next"), 32);
		st = th_post_json(&A, "/v1/models/w1:step?wait=true",
		                  "{\"windows\": {\"array\": \"stream\", \"context\": 16, "
		                  "\"batch_size\": 4, \"start\": 28}}", 200);
		ck_assert_msg(json_number_value(json_array_get(th_arr(st, "losses"), 0)) == ev,
		              "step loss %.17g, evaluation %.17g",
		              json_number_value(json_array_get(th_arr(st, "losses"), 0)), ev);
		json_decref(st);
	}
	json_decref(res);
	/* T + 1 tokens: one window (offset 0 in both orders), every step */
	th_put_array(&A, "short", "dtype=uint16&shape=17", x, 17 * sizeof *x);
	res = th_post_json(&A, "/v1/models/w2:step?wait=true",
	                   "{\"windows\": {\"array\": \"short\", \"context\": 16, \"batch_size\": 1, "
	                   "\"order\": \"random\", \"seed\": 3}, \"steps\": 3}", 200);
	ck_assert_int_eq(th_int(th_obj(res, "windows"), "windows_per_epoch"), 1);
	ck_assert_int_eq(th_int(th_obj(res, "windows"), "epoch"), 3);
	json_decref(res);
}
END_TEST

/* Windows refused with 400 BAD_WINDOWS naming the problem, before
 * anything runs: the model's step count stays. */
START_TEST(test_tokens_windows_refused)
{
	static uint16_t x[SN];
	static float f[64];
	const char *p = "/v1/models/wr:step?wait=true";
	json_t *m;

	stream_make(x, false);
	th_put_array(&A, "stream", "dtype=uint16&shape=327", x, sizeof x);
	th_put_array(&A, "floats", "dtype=float32&shape=64", f, sizeof f);
	create(&A, "wr");
	th_post_error(&A, p, "{\"windows\": {\"array\": \"stream\", \"context\": 0, "
	              "\"batch_size\": 4}}", 400, "INVALID_ARGUMENT", "BAD_WINDOWS",
	              "windows.context", NULL);
	th_post_error_words(&A, p, "{\"windows\": {\"array\": \"stream\", \"context\": 16, "
	                    "\"batch_size\": 21}}", 400, "INVALID_ARGUMENT", "BAD_WINDOWS",
	                    "batch_size 21", "20 windows", "327 tokens", NULL);
	th_post_error_words(&A, p, "{\"windows\": {\"array\": \"stream\", \"context\": 400, "
	                    "\"batch_size\": 1}}", 400, "INVALID_ARGUMENT", "BAD_WINDOWS",
	                    "327 tokens", "401", NULL);
	th_post_error_words(&A, p, "{\"windows\": {\"array\": \"floats\", \"context\": 4, "
	                    "\"batch_size\": 1}}", 400, "INVALID_ARGUMENT", "BAD_WINDOWS",
	                    "float32", "uint16 or int32", NULL);
	th_post_error(&A, p, "{\"inputs\": \"stream\", \"windows\": {\"array\": \"stream\", "
	              "\"context\": 16, \"batch_size\": 4}}", 400, "INVALID_ARGUMENT", "BAD_WINDOWS",
	              "exclusive", "inputs");
	th_post_error(&A, p, "{\"targets\": \"stream\", \"windows\": {\"array\": \"stream\", "
	              "\"context\": 16, \"batch_size\": 4}}", 400, "INVALID_ARGUMENT", "BAD_WINDOWS",
	              "exclusive", "targets");
	th_post_error(&A, "/v1/models/wr:evaluate?wait=true", "{\"inputs\": \"stream\", "
	              "\"windows\": {\"array\": \"stream\", \"context\": 16, \"batch_size\": 4}}",
	              400, "INVALID_ARGUMENT", "BAD_WINDOWS", "exclusive", NULL);
	th_post_error(&A, p, "{\"windows\": {\"array\": \"stream\", \"context\": 16, "
	              "\"batch_size\": 4, \"order\": \"shuffle\"}}", 400, "INVALID_ARGUMENT",
	              "BAD_WINDOWS", "random", NULL);
	th_post_error(&A, p, "{\"windows\": {\"array\": \"nosuch\", \"context\": 16, "
	              "\"batch_size\": 4}}", 404, "NOT_FOUND", "ARRAY_NOT_FOUND", "nosuch", NULL);
	m = th_get_object(&A, "/v1/models/wr");
	ck_assert_int_eq(th_int(m, "steps"), 0);
	json_decref(m);
}
END_TEST

/*
 * While a step runs, GET /v1/operations/{id} shows the losses so far in
 * metadata.partial_result, as many as the steps done or more, with their
 * learning rates and norms and where the windows are; cancelled, the
 * partial result keeps them; a run that succeeds answers only its result.
 */
START_TEST(test_tokens_partial_result_running)
{
	static uint16_t x[SN];
	char id[64];
	json_t *op, *part = NULL;
	bool seen = false;

	stream_make(x, false);
	th_put_array(&A, "stream", "dtype=uint16&shape=327&memory_kind=pinned_host", x, sizeof x);
	create(&A, "pr");
	op = th_post_json(&A, "/v1/models/pr:step",
	                  "{\"windows\": {\"array\": \"stream\", \"context\": 16, \"batch_size\": 4, "
	                  "\"order\": \"random\"}, \"steps\": 1000000}", 202);
	snprintf(id, sizeof id, "%s", th_str(th_obj(op, "metadata"), "id"));
	json_decref(op);
	for (int tries = 0; tries < 3000 && !seen; tries++) {
		json_t *prog;

		op = th_op_get(&A, id);
		prog = th_op_meta(op, "progress");
		if (th_int(prog, "steps_done") >= 3 && json_object_get(th_obj(op, "metadata"),
		                                                       "partial_result")) {
			json_int_t done = th_int(prog, "steps_done");

			ck_assert_str_eq(th_str(th_obj(op, "metadata"), "state"), "RUNNING");
			part = th_op_meta(op, "partial_result");
			ck_assert_int_ge((json_int_t)json_array_size(th_arr(part, "losses")), done);
			ck_assert_int_eq(th_int(part, "steps"),
			                 (json_int_t)json_array_size(th_arr(part, "losses")));
			ck_assert_uint_eq(json_array_size(th_arr(part, "learning_rates")),
			                  json_array_size(th_arr(part, "losses")));
			ck_assert_uint_eq(json_array_size(th_arr(part, "grad_norms")),
			                  json_array_size(th_arr(part, "losses")));
			ck_assert_int_eq(th_int(th_obj(part, "windows"), "next"), 4 * th_int(part, "steps"));
			seen = true;
		}
		json_decref(op);
		if (!seen)
			usleep(10000);
	}
	ck_assert_msg(seen, "no partial result while the step ran");
	/* cancelled: the partial result is the run's whole object */
	{
		char path[128];
		struct th_response r;

		snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
		th_post(&A, path, "", &r);
		th_response_free(&r);
		snprintf(path, sizeof path, "/v1/operations/%s:wait?timeout=60s", id);
		th_post(&A, path, "", &r);
		th_response_free(&r);
	}
	op = th_op_get(&A, id);
	ck_assert_str_eq(th_str(th_obj(op, "metadata"), "state"), "CANCELLED");
	part = th_op_meta(op, "partial_result");
	ck_assert_uint_eq(json_array_size(th_arr(part, "losses")), (size_t)th_int(part, "steps"));
	ck_assert_int_eq(th_int(part, "model_steps"), th_int(part, "steps"));
	ck_assert_ptr_nonnull(json_object_get(part, "analysis"));
	json_decref(op);
	/* succeeded: the response, no partial result */
	op = th_post_json(&A, "/v1/models/pr:step",
	                  "{\"windows\": {\"array\": \"stream\", \"context\": 16, \"batch_size\": 4}, "
	                  "\"steps\": 2}", 202);
	snprintf(id, sizeof id, "%s", th_str(th_obj(op, "metadata"), "id"));
	json_decref(op);
	{
		char path[128];
		struct th_response r;

		snprintf(path, sizeof path, "/v1/operations/%s:wait?timeout=60s", id);
		th_post(&A, path, "", &r);
		th_response_free(&r);
	}
	op = th_op_get(&A, id);
	ck_assert_str_eq(th_str(th_obj(op, "metadata"), "state"), "SUCCEEDED");
	ck_assert_ptr_null(json_object_get(th_obj(op, "metadata"), "partial_result"));
	ck_assert_uint_eq(json_array_size(th_arr(th_op_result(op), "losses")), 2);
	json_decref(op);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("tokens");
	TCase *tc = tcase_create("tokens");

	tcase_add_checked_fixture(tc, up, down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_tokens_train_checkpoint_resume);
	tcase_add_test(tc, test_tokens_analyze_matches_step);
	tcase_add_test(tc, test_tokens_bad_id_refused);
	tcase_add_test(tc, test_tokens_rank1_no_projection_gradients);
	tcase_add_test(tc, test_tokens_batches);
	tcase_add_test(tc, test_tokens_evaluate);
	tcase_add_test(tc, test_tokens_windows_sequential);
	tcase_add_test(tc, test_tokens_windows_random);
	tcase_add_test(tc, test_tokens_windows_continue);
	tcase_add_test(tc, test_tokens_windows_refused);
	tcase_add_test(tc, test_tokens_partial_result_running);
	suite_add_tcase(s, tc);
	return s;
}
