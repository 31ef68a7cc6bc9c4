/*
 * it_integrity.c - Check suite "integrity": versions and identity under
 * concurrent writers, against a real tstaged (two simulated devices).
 *
 * A running step holds its model's arrays: every writer of them (PUT, :put,
 * :copy onto, :gather onto, DELETE of an array or of the model) is refused
 * 409 ABORTED naming the step; a step that changed weights publishes new
 * versions (ETags), so a stale If-Match fails; a model created again under
 * a deleted one's name starts from nothing. A model's array keeps its dtype
 * and shape, a committed array replaced without a placement keeps its
 * placement, and a move keeps metadata and implicit-transfer counts. Rows of
 * axis 0 are one parser for :gather and :step, strict about every field.
 * :copy onto an existing array needs "overwrite"; "donate" on :put is 400.
 * Model creation runs as an operation, so /livez answers while six 128 MiB
 * models initialise.
 *
 * Device ids are written for sim and run on the backend under test
 * (th_on_backend): tests/gpu/fakecuda.sh runs the suite on the stand-in's
 * GPUs. Each case runs forked with its own daemon.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CASE_TIMEOUT_S 240

static struct th_daemon D;

/* A small Adam model: w1 [2, 8, 16], w2 [2, 16, 8]. */
#define ADAM_SPEC(name)                                                                         \
	"{\"name\": \"" name "\", \"mlp\": {\"layers\": 2, \"d_model\": 8, \"d_hidden\": 16}, "    \
	"\"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.01}, \"init\": {\"seed\": 3}, "   \
	"\"placement\": {\"device\": \"sim:0\"}}"

static void daemon_up(void)
{
	static const char *const args[] = {"--sim-device-memory", "1GiB", NULL};

	th_daemon_start(&D, args);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* ---- requests ------------------------------------------------------------------------ */

/* Paths, bodies and queries are written for sim and run on the backend
 * under test: these map them (th_on_backend) onto the harness's requests. */

static void post_error(const char *path, const char *body, long http, const char *status,
                       const char *reason, const char *word, const char *word2)
{
	th_post_error(&D, th_on_backend(path), th_on_backend(body), http, status, reason, word,
	              word2);
}

/* float32 [rows, cols] of a fixed pattern. */
static void put_floats(const char *name, size_t rows, size_t cols, float seed, const char *extra)
{
	float *x = malloc(rows * cols * sizeof *x);
	char query[256];

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < rows * cols; i++)
		x[i] = seed * (float)((i * 7) % 13) / 13.0f - 0.25f;
	snprintf(query, sizeof query, "dtype=float32&shape=%zu,%zu%s%s", rows, cols,
	         extra ? "&" : "", extra ? extra : "");
	th_put_array(&D, name, th_on_backend(query), x, rows * cols * sizeof *x);
	free(x);
}

/* The operation id of a 202 answer (copied into id). */
static void start_op(const char *path, const char *body, char *id, size_t cap)
{
	json_t *op = th_post_json_on_backend(&D, path, body, 202);

	snprintf(id, cap, "%s", json_string_value(th_op_meta(op, "id")));
	json_decref(op);
}

/* Waits (bounded) until the operation has done at least one unit. */
static void wait_progress(const char *id, const char *unit)
{
	for (int i = 0; i < 20000; i++) {
		json_t *op = th_op_get(&D, id);
		json_int_t done = th_int(th_op_meta(op, "progress"), unit);
		bool finished = th_bool(op, "done");

		json_decref(op);
		ck_assert_msg(!finished, "operation %s finished before the test could use it", id);
		if (done >= 1)
			return;
		usleep(1000);
	}
	ck_abort_msg("operation %s made no progress", id);
}

/* Waits for the operation to finish; returns its final JSON. */
static json_t *op_wait(const char *id)
{
	char path[160];

	snprintf(path, sizeof path, "/v1/operations/%.60s:wait?timeout=120s", id);
	return th_post_json_on_backend(&D, path, "{}", 200);
}

static void cancel_and_wait(const char *id, const char *state)
{
	char path[160];
	json_t *op;
	struct th_response r;

	snprintf(path, sizeof path, "/v1/operations/%.60s:cancel", id);
	th_request(&D, "POST", path, NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "POST %s: %ld %s", path, r.status, r.body);
	th_response_free(&r);
	op = op_wait(id);
	ck_assert(th_bool(op, "done"));
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), state);
	json_decref(op);
}

/* Creates a model and waits for it (200 with the ready model; the creation
 * itself is checked by the test_create_ cases). */
static void create_model(const char *spec)
{
	struct th_response r;

	th_post_on_backend(&D, "/v1/models?wait=true", spec, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "POST /v1/models %s: %ld %s", spec,
	              r.status, r.body);
	th_response_free(&r);
}

/* ==== a running step holds its arrays ==================================================== */

START_TEST(test_step_holds_arrays)
{
	char id[64], path[256];
	json_t *before, *after, *op;
	struct th_response r;
	float w2[2 * 16 * 8] = {0};

	create_model(ADAM_SPEC("m"));
	put_floats("x", 4, 8, 1.0f, "device=sim:0");
	before = th_array_meta(&D, "m.w1");
	start_op("/v1/models/m:step", "{\"inputs\": \"x\", \"steps\": 1000000}", id, sizeof id);
	wait_progress(id, "steps_done");

	/* PUT of zeros over a held array: refused before its body is read */
	th_request(&D, "PUT", "/v1/arrays/m.w2?dtype=float32&shape=2,16,8", NULL, (char *)w2,
	           sizeof w2, &r);
	th_expect_error(&r, "PUT m.w2", 409, "ABORTED", "ARRAY_HELD", id, "m.w2");
	post_error("/v1/arrays/m.w2:put", "{\"memory_kind\": \"pinned_host\"}", 409, "ABORTED",
	           "ARRAY_HELD", id, "m.w2");
	put_floats("w", 16, 16, 2.0f, "device=sim:0");
	post_error("/v1/arrays/w:copy", "{\"out\": \"m.w1\", \"device\": \"sim:0\", \"overwrite\": true}",
	           409, "ABORTED", "ARRAY_HELD", id, "m.w1");
	post_error("/v1/arrays/w:gather", "{\"rows\": [0], \"out\": {\"name\": \"m.adam.mu.w1\"}}", 409,
	           "ABORTED", "ARRAY_HELD", id, NULL);
	th_request(&D, "DELETE", "/v1/arrays/m.adam.nu.w2", NULL, NULL, 0, &r);
	th_expect_error(&r, "DELETE m.adam.nu.w2", 409, "ABORTED", "ARRAY_HELD", id, NULL);
	th_request(&D, "DELETE", "/v1/models/m", NULL, NULL, 0, &r);
	th_expect_error(&r, "DELETE model m", 409, "ABORTED", "MODEL_BUSY", id, NULL);
	post_error("/v1/models/m:step", "{\"inputs\": \"x\"}", 409, "ABORTED", "TARGET_BUSY", id, NULL);

	cancel_and_wait(id, "CANCELLED");
	/* the cancelled run changed the weights: they are a new version */
	after = th_array_meta(&D, "m.w1");
	ck_assert_str_ne(th_str(after, "etag"), th_str(before, "etag"));
	ck_assert_int_gt(th_int(after, "version"), th_int(before, "version"));
	json_decref(before);
	json_decref(after);
	/* and nothing holds them any more */
	snprintf(path, sizeof path, "/v1/arrays/m.w2:put?wait=true");
	op = th_post_json_on_backend(&D, path, "{\"memory_kind\": \"pinned_host\"}", 200);
	json_decref(op);
}
END_TEST

/* ==== a step publishes new versions ====================================================== */

START_TEST(test_step_publishes_versions)
{
	json_t *before, *after, *res;
	struct th_response r;
	char etag0[64], hdr[128], *trained, *now;
	size_t n_trained, n_now;
	float zeros[2 * 8 * 16] = {0};
	const char *const headers[] = {hdr, NULL};

	create_model(ADAM_SPEC("v"));
	put_floats("x", 4, 8, 1.0f, "device=sim:0");
	before = th_array_meta(&D, "v.w1");
	snprintf(etag0, sizeof etag0, "%s", th_str(before, "etag"));
	res = th_post_json_on_backend(&D, "/v1/models/v:step?wait=true", "{\"inputs\": \"x\", \"steps\": 2}", 200);
	json_decref(res);
	after = th_array_meta(&D, "v.w1");
	ck_assert_str_ne(th_str(after, "etag"), etag0);
	ck_assert_int_eq(th_int(after, "version"), th_int(before, "version") + 1);
	trained = th_download(&D, "v.w1", &n_trained);

	/* a PUT guarded by the ETag taken before the step does not overwrite trained weights */
	snprintf(hdr, sizeof hdr, "If-Match: %s", etag0);
	th_request(&D, "PUT", "/v1/arrays/v.w1?dtype=float32&shape=2,8,16", headers, (char *)zeros,
	           sizeof zeros, &r);
	th_expect_error(&r, "PUT v.w1 If-Match old", 400, "FAILED_PRECONDITION", "ETAG_MISMATCH", NULL,
	             NULL);
	now = th_download(&D, "v.w1", &n_now);
	th_assert_bytes("v.w1 after the refused PUT", now, n_now, trained, n_trained);
	/* with the current ETag it goes through */
	snprintf(hdr, sizeof hdr, "If-Match: %s", th_str(after, "etag"));
	th_request(&D, "PUT", "/v1/arrays/v.w1?dtype=float32&shape=2,8,16", headers, (char *)zeros,
	           sizeof zeros, &r);
	ck_assert_msg(r.status == 200, "PUT v.w1 If-Match current: %ld %s", r.status, r.body);
	th_response_free(&r);
	free(trained);
	free(now);
	json_decref(before);
	json_decref(after);
}
END_TEST

/* ==== a model created again starts from nothing ========================================== */

START_TEST(test_recreated_model_is_new)
{
	char id[64], *mine, *ref;
	size_t n_mine, n_ref;
	struct th_response r;
	json_t *m;

	create_model(ADAM_SPEC("m"));
	put_floats("x", 4, 8, 1.0f, "device=sim:0");
	start_op("/v1/models/m:step", "{\"inputs\": \"x\", \"steps\": 1000000}", id, sizeof id);
	wait_progress(id, "steps_done");
	th_request(&D, "DELETE", "/v1/models/m", NULL, NULL, 0, &r);
	th_expect_error(&r, "DELETE model m while it steps", 409, "ABORTED", "MODEL_BUSY", id, NULL);
	cancel_and_wait(id, "CANCELLED");
	th_request(&D, "DELETE", "/v1/models/m", NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "DELETE model m: %ld %s", r.status, r.body);
	th_response_free(&r);
	ck_assert_int_eq(th_get_status(&D, "/v1/models/m"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/m.w1"), 404);

	create_model(ADAM_SPEC("m"));
	m = th_get_object(&D, "/v1/models/m");
	ck_assert_int_eq(th_int(m, "steps"), 0);
	json_decref(m);
	/* one step of the new model is Adam's first step: as a fresh model's */
	create_model(ADAM_SPEC("ref"));
	json_decref(th_post_json_on_backend(&D, "/v1/models/m:step?wait=true", "{\"inputs\": \"x\"}", 200));
	json_decref(th_post_json_on_backend(&D, "/v1/models/ref:step?wait=true", "{\"inputs\": \"x\"}", 200));
	m = th_get_object(&D, "/v1/models/m");
	ck_assert_int_eq(th_int(m, "steps"), 1);
	json_decref(m);
	mine = th_download(&D, "m.w1", &n_mine);
	ref = th_download(&D, "ref.w1", &n_ref);
	th_assert_bytes("m.w1 after one step of the new model", mine, n_mine, ref, n_ref);
	free(mine);
	free(ref);
}
END_TEST

/* ==== a model's arrays keep their dtype and shape ======================================== */

START_TEST(test_model_array_shape)
{
	float small[3] = {1, 2, 3};
	double wide[2 * 8 * 16] = {0};
	struct th_response r;
	json_t *res;

	create_model(ADAM_SPEC("s"));
	put_floats("x", 4, 8, 1.0f, "device=sim:0");
	th_request(&D, "PUT", "/v1/arrays/s.w1?dtype=float32&shape=3", NULL, (char *)small,
	           sizeof small, &r);
	th_expect_error(&r, "PUT s.w1 [3]", 400, "INVALID_ARGUMENT", "OWNED_SHAPE", "model 's'",
	             "float32 [2, 8, 16]");
	th_request(&D, "PUT", "/v1/arrays/s.w1?dtype=float64&shape=2,8,16", NULL, (char *)wide,
	           sizeof wide, &r);
	th_expect_error(&r, "PUT s.w1 float64", 400, "INVALID_ARGUMENT", "OWNED_SHAPE", "s.w1",
	             "float32 [2, 8, 16]");
	/* a copy onto it too */
	put_floats("y", 3, 8, 1.0f, "device=sim:0");
	post_error("/v1/arrays/y:copy?wait=true",
	           "{\"out\": \"s.w2\", \"device\": \"sim:0\", \"overwrite\": true}", 400,
	           "INVALID_ARGUMENT", "OWNED_SHAPE", "s.w2", "float32 [2, 16, 8]");
	/* only the model deletes its arrays */
	th_request(&D, "DELETE", "/v1/arrays/s.w1", NULL, NULL, 0, &r);
	th_expect_error(&r, "DELETE s.w1", 400, "FAILED_PRECONDITION", "ARRAY_OWNED", "model 's'", NULL);
	/* the same dtype and shape loads weights, and the model still steps */
	{
		float same[2 * 8 * 16];

		for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
			same[i] = 0.01f * (float)(i % 7);
		th_put_array(&D, "s.w1", "dtype=float32&shape=2,8,16", same, sizeof same);
	}
	res = th_post_json_on_backend(&D, "/v1/models/s:step?wait=true", "{\"inputs\": \"x\"}", 200);
	json_decref(res);
}
END_TEST

/* ==== a PUT without placement keeps a committed array's placement ======================= */

START_TEST(test_put_keeps_placement)
{
	json_t *a;

	if (!th_second_device(&D, __func__))
		return;
	put_floats("h.w1", 4, 8, 1.0f, "device=sim:1&memory_kind=pinned_host");
	put_floats("h.w1", 4, 8, 2.0f, NULL);
	a = th_array_meta(&D, "h.w1");
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "device"), th_dev(1));
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), "pinned_host");
	ck_assert(th_bool(a, "committed"));
	ck_assert_int_eq(th_int(a, "version"), 2);
	json_decref(a);
	/* an uncommitted one still goes to the default placement */
	put_floats("u", 4, 8, 1.0f, NULL);
	put_floats("u", 4, 8, 1.0f, NULL);
	a = th_array_meta(&D, "u");
	ck_assert(!th_bool(a, "committed"));
	json_decref(a);
	/* a placement given still wins */
	put_floats("h.w1", 4, 8, 2.0f, "device=sim:0");
	a = th_array_meta(&D, "h.w1");
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "device"), th_dev(0));
	json_decref(a);
}
END_TEST

/* ==== rows: one parser, every form, every field checked ================================== */

START_TEST(test_rows_one_parser)
{
	static const struct {
		const char *rows, *field;
	} bad[] = {
		{"[\"a\", 1.5, null]", "rows[0]"},
		{"[0, 1.5]", "rows[1]"},
		{"[0, null]", "rows[1]"},
		{"[true]", "rows[0]"},
		{"{\"start\": 0.5}", "rows.start"},
		{"{\"start\": \"0\"}", "rows.start"},
		{"{\"begin\": 0}", "rows.begin"},
		{"\"0:4\"", "rows"},
		{"7", "rows"},
	};
	json_t *g, *s1, *s2;
	char body[512];

	put_floats("ds", 8, 8, 1.0f, "device=sim:0");
	create_model("{\"name\": \"g\", \"mlp\": {\"layers\": 1, \"d_model\": 8}, "
	             "\"placement\": {\"device\": \"sim:0\"}}");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char field[64];

		snprintf(body, sizeof body, "{\"rows\": %s, \"out\": {\"name\": \"o\"}}", bad[i].rows);
		post_error("/v1/arrays/ds:gather", body, 400, "INVALID_ARGUMENT", "BAD_ROWS", bad[i].field,
		           NULL);
		snprintf(body, sizeof body, "{\"inputs\": {\"array\": \"ds\", \"rows\": %s}}", bad[i].rows);
		snprintf(field, sizeof field, "inputs.%s", bad[i].field);
		post_error("/v1/models/g:step?wait=true", body, 400, "INVALID_ARGUMENT", "BAD_ROWS", field,
		           NULL);
	}
	post_error("/v1/models/g:step?wait=true", "{\"inputs\": {\"array\": \"ds\", \"rowz\": [1]}}",
	           400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "inputs.rowz", NULL);
	post_error("/v1/models/g:step?wait=true", "{\"inputs\": {\"rows\": [1]}}", 400,
	           "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "inputs.array", NULL);
	post_error("/v1/models/g:step?wait=true", "{\"inputs\": {\"array\": \"ds\", \"rows\": [8]}}",
	           400, "OUT_OF_RANGE", "INDEX_OUT_OF_RANGE", "8", NULL);
	/* every form :gather takes, :step takes: a slice trains on the same rows as the list */
	s1 = th_post_json_on_backend(&D, "/v1/models/g:step?wait=true",
	               "{\"inputs\": {\"array\": \"ds\", \"rows\": {\"start\": 1, \"stop\": 7, "
	               "\"step\": 2}}}", 200);
	s2 = th_post_json_on_backend(&D, "/v1/models/g:step?wait=true",
	               "{\"inputs\": {\"array\": \"ds\", \"rows\": [1, 3, -3]}}", 200);
	ck_assert(json_equal(th_arr(s1, "losses"), th_arr(s2, "losses")));
	json_decref(s1);
	json_decref(s2);
	g = th_post_json_on_backend(&D, "/v1/arrays/ds:gather",
	              "{\"rows\": {\"start\": null, \"stop\": 3}, \"out\": {\"name\": \"o\"}}", 201);
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(g, "shape"), 0)), 3);
	json_decref(g);
}
END_TEST

/* ==== :copy onto an existing array; donate on :put ======================================= */

START_TEST(test_copy_overwrite_and_donate)
{
	char *a, *b;
	size_t na, nb;
	json_t *res;

	if (!th_second_device(&D, __func__))
		return;
	put_floats("a", 4, 8, 1.0f, "device=sim:0");
	put_floats("b", 4, 8, 3.0f, "device=sim:0");
	post_error("/v1/arrays/a:copy?wait=true", "{\"out\": \"b\", \"device\": \"sim:1\"}", 409,
	           "ALREADY_EXISTS", "ARRAY_EXISTS", "'b'", "overwrite");
	post_error("/v1/arrays/a:copy?wait=true",
	           "{\"out\": \"b\", \"device\": \"sim:1\", \"overwrite\": 1}", 400,
	           "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "overwrite", NULL);
	res = th_post_json_on_backend(&D, "/v1/arrays/a:copy?wait=true",
	                "{\"out\": \"b\", \"device\": \"sim:1\", \"overwrite\": true}", 200);
	ck_assert_str_eq(th_str(th_obj(res, "sharding"), "device"), th_dev(1));
	json_decref(res);
	a = th_download(&D, "a", &na);
	b = th_download(&D, "b", &nb);
	th_assert_bytes("b after the overwriting copy", b, nb, a, na);
	free(a);
	free(b);
	post_error("/v1/arrays/a:put?wait=true", "{\"device\": \"sim:1\", \"donate\": true}", 400,
	           "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "donate", NULL);
	post_error("/v1/arrays/a:put?wait=true", "{\"device\": \"sim:1\", \"donate\": false}", 400,
	           "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "donate", NULL);
}
END_TEST

/* ==== a move keeps metadata and implicit-transfer counts ================================ */

START_TEST(test_move_keeps_metadata_and_counts)
{
	static const char header[] = "{\"__metadata__\": {\"origin\": \"test\"}, "
	                             "\"t\": {\"dtype\": \"F32\", \"shape\": [2], "
	                             "\"data_offsets\": [0, 8]}}";
	char body[256];
	uint64_t hlen = sizeof header - 1;
	struct th_response r;
	json_t *a, *res;
	json_int_t implicit;

	if (!th_second_device(&D, __func__))
		return;
	memcpy(body, &hlen, 8);                      /* little-endian hosts */
	memcpy(body + 8, header, hlen);
	memset(body + 8 + hlen, 0, 8);
	th_request(&D, "POST", th_on_backend("/v1/arrays:import?device=sim:0&memory_kind=pinned_host"),
	           NULL, body, 8 + hlen + 8, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "import: %ld %s", r.status, r.body);
	th_response_free(&r);
	res = th_post_json_on_backend(&D, "/v1/arrays/t:put?wait=true", "{\"memory_kind\": \"device\"}", 200);
	json_decref(res);
	a = th_array_meta(&D, "t");
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), "device");
	ck_assert_str_eq(th_str(th_obj(a, "metadata"), "origin"), "test");
	json_decref(a);

	/* an uncommitted input moved by a step on sim:1 is counted, and a :put keeps the count */
	put_floats("u", 4, 8, 1.0f, NULL);
	create_model("{\"name\": \"g\", \"mlp\": {\"layers\": 1, \"d_model\": 8}, "
	             "\"placement\": {\"device\": \"sim:1\"}}");
	json_decref(th_post_json_on_backend(&D, "/v1/models/g:step?wait=true", "{\"inputs\": \"u\"}", 200));
	a = th_array_meta(&D, "u");
	implicit = th_int(a, "implicit_transfer_bytes");
	ck_assert_int_eq(implicit, 4 * 8 * 4);
	json_decref(a);
	res = th_post_json_on_backend(&D, "/v1/arrays/u:put?wait=true", "{\"memory_kind\": \"pinned_host\"}", 200);
	ck_assert_int_eq(th_int(res, "implicit_transfer_bytes"), implicit);
	json_decref(res);
}
END_TEST

/* ==== model creation runs on the operation workers ======================================= */

START_TEST(test_create_off_http_threads)
{
	char ids[6][64], body[512];
	int running = 0;
	struct th_response r;

	if (!th_second_device(&D, __func__))
		return;
	/* six 128 MiB models (w1 and w2 of 4 x 1024 x 4096 floats), three per device */
	for (int i = 0; i < 6; i++) {
		snprintf(body, sizeof body,
		         "{\"name\": \"big%d\", \"mlp\": {\"layers\": 4, \"d_model\": 1024, "
		         "\"d_hidden\": 4096}, \"placement\": {\"device\": \"sim:%d\"}}", i, i % 2);
		start_op("/v1/models", body, ids[i], sizeof ids[i]);
	}
	th_get(&D, "/livez", &r);
	ck_assert_msg(r.status == 200, "/livez: %ld %s", r.status, r.body);
	th_response_free(&r);
	/* /livez answered while creations were still running */
	for (int i = 0; i < 6; i++) {
		json_t *op = th_op_get(&D, ids[i]);

		ck_assert_str_eq(json_string_value(th_op_meta(op, "kind")), "create");
		running += !th_bool(op, "done");
		json_decref(op);
	}
	ck_assert_msg(running > 0, "every creation finished before /livez answered");
	for (int i = 0; i < 6; i++) {
		json_t *op = op_wait(ids[i]), *m;
		char path[64];

		ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
		ck_assert_str_eq(th_str(th_op_result(op), "state"), "READY");
		json_decref(op);
		snprintf(path, sizeof path, "/v1/models/big%d", i);
		m = th_get_object(&D, path);
		ck_assert_str_eq(th_str(m, "state"), "READY");
		json_decref(m);
	}
}
END_TEST

START_TEST(test_create_conflicts_and_cancel)
{
	char id[64];
	struct th_response r;
	json_t *m;

	start_op("/v1/models",
	         "{\"name\": \"big\", \"mlp\": {\"layers\": 12, \"d_model\": 1024, \"d_hidden\": 4096}, "
	         "\"placement\": {\"device\": \"sim:0\"}}", id,
	         sizeof id);
	wait_progress(id, "bytes_done");
	m = th_get_object(&D, "/v1/models/big");
	ck_assert_str_eq(th_str(m, "state"), "CREATING");
	ck_assert_str_eq(th_str(m, "creating_operation"), id);
	json_decref(m);
	post_error("/v1/models",
	           "{\"name\": \"big\", \"mlp\": {\"layers\": 1, \"d_model\": 4}}", 409,
	           "ALREADY_EXISTS", NULL, "big", NULL);
	put_floats("x", 4, 1024, 1.0f, "device=sim:0");
	post_error("/v1/models/big:step", "{\"inputs\": \"x\"}", 409, "ABORTED", "MODEL_CREATING", id,
	           NULL);
	th_request(&D, "DELETE", "/v1/models/big", NULL, NULL, 0, &r);
	th_expect_error(&r, "DELETE a model being created", 409, "ABORTED", "MODEL_CREATING", id, NULL);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/big.w1"), 404);   /* not published yet */
	cancel_and_wait(id, "CANCELLED");
	ck_assert_int_eq(th_get_status(&D, "/v1/models/big"), 404);
	ck_assert_int_eq(th_get_status(&D, "/v1/arrays/big.w1"), 404);
	/* the name is free again */
	create_model("{\"name\": \"big\", \"mlp\": {\"layers\": 1, \"d_model\": 4}}");
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("integrity");
	TCase *tc = tcase_create("integrity");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_step_holds_arrays);
	tcase_add_test(tc, test_step_publishes_versions);
	tcase_add_test(tc, test_recreated_model_is_new);
	tcase_add_test(tc, test_model_array_shape);
	tcase_add_test(tc, test_put_keeps_placement);
	tcase_add_test(tc, test_rows_one_parser);
	tcase_add_test(tc, test_copy_overwrite_and_donate);
	tcase_add_test(tc, test_move_keeps_metadata_and_counts);
	tcase_add_test(tc, test_create_off_http_threads);
	tcase_add_test(tc, test_create_conflicts_and_cancel);
	suite_add_tcase(s, tc);
	return s;
}
