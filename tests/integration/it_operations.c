/*
 * it_operations.c - Check suite "operations": the operation resource of a
 * real daemon. Before any operation exists: an empty list and its filters,
 * the google.rpc.Status answers for unknown ids and bad arguments, wrong
 * methods, and the tstage_operations gauge. With operations (from :put and
 * training steps): the AIP-151 shape, paging past the first page with
 * opaque tokens, DELETE of finished and running ones, conditional GETs
 * (304), and --wait-limit.
 *
 * Each test case runs in its own forked process with its own daemon (a
 * checked fixture).
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct th_daemon D;

static void daemon_up(void)
{
	th_daemon_start(&D, NULL);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

START_TEST(test_list_empty)
{
	static const char *const paths[] = {
		"/v1/operations",
		"/v1/operations?state=RUNNING",
		"/v1/operations?state=SUCCEEDED&page_size=1000",
		"/v1/operations?page_size=1",
	};
	struct th_response r;

	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		json_t *body = th_get_json(&D, paths[i], &r);

		ck_assert_msg(json_array_size(th_arr(body, "operations")) == 0, "%s: %s", paths[i],
		              r.body);
		ck_assert_str_eq(th_header(&r, "Content-Type"), "application/json");
		th_response_free(&r);
	}
}
END_TEST

START_TEST(test_list_bad_arguments)
{
	static const struct {
		const char *path, *reason;
	} cases[] = {
		{"/v1/operations?state=running", "BAD_STATE"},
		{"/v1/operations?state=DONE", "BAD_STATE"},
		{"/v1/operations?page_size=0", "BAD_PAGE_SIZE"},
		{"/v1/operations?page_size=1001", "BAD_PAGE_SIZE"},
		{"/v1/operations?page_size=ten", "BAD_PAGE_SIZE"},
	};
	struct th_response r;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		th_get(&D, cases[i].path, &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", cases[i].reason);
		th_response_free(&r);
	}
}
END_TEST

START_TEST(test_unknown_operation)
{
	struct th_response r;
	json_t *error;

	th_get(&D, "/v1/operations/op-0123456789abcdef", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	error = th_obj(th_json(&r), "error");
	ck_assert_msg(strstr(th_str(error, "message"), "op-0123456789abcdef"),
	              "message does not name the id: %s", r.body);
	th_response_free(&r);

	th_get(&D, "/v1/operations/nonsense", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	th_response_free(&r);
}
END_TEST

START_TEST(test_cancel_unknown)
{
	struct th_response r;

	th_request(&D, "POST", "/v1/operations/op-0123456789abcdef:cancel", NULL, NULL, 0, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	th_response_free(&r);

	th_request(&D, "POST", "/v1/operations/op-0123456789abcdef:cancel", NULL, "{}", 2, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	th_response_free(&r);
}
END_TEST

START_TEST(test_wrong_methods)
{
	static const char *const cases[][2] = {
		{"DELETE", "/v1/operations"},
		{"POST", "/v1/operations"},
		{"GET", "/v1/operations/op-0123456789abcdef:cancel"},
	};
	struct th_response r;

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		th_request(&D, cases[i][0], cases[i][1], NULL, NULL, 0, &r);
		th_assert_error(&r, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED");
		th_response_free(&r);
	}
}
END_TEST

START_TEST(test_delete_unknown)
{
	struct th_response r;

	th_request(&D, "DELETE", "/v1/operations/op-0123456789abcdef", NULL, NULL, 0, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	th_response_free(&r);
}
END_TEST

START_TEST(test_operations_gauge)
{
	static const char *const states[] = {"PENDING", "RUNNING", "SUCCEEDED", "FAILED",
	                                     "CANCELLED"};
	struct th_response r;
	char why[256];

	th_get(&D, "/metrics", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_msg(th_prom_validate(r.body, why, sizeof why) > 0, "metrics: %s", why);
	ck_assert_ptr_nonnull(strstr(r.body, "# TYPE tstage_operations_listed gauge"));
	for (size_t i = 0; i < sizeof states / sizeof states[0]; i++) {
		char labels[64];
		double v = -1;

		snprintf(labels, sizeof labels, "state=\"%s\"", states[i]);
		ck_assert_msg(th_prom_find(r.body, "tstage_operations_listed", labels, &v),
		              "no tstage_operations_listed{%s}", labels);
		ck_assert_msg(v == 0, "tstage_operations_listed{%s} = %g", labels, v);
	}
	th_response_free(&r);
}
END_TEST

/* ---- with operations ------------------------------------------------------------ */

static void upload4(const char *name)
{
	static const float x[4] = {1, 2, 3, 4};

	th_put_array(&D, name, "dtype=float32&shape=4", x, sizeof x);
}

/* The id of a new operation (the 202 answer of path), copied into id. */
static void op_start(const char *path, const char *body, char *id, size_t cap)
{
	json_t *op = th_post_json(&D, path, body, 202);

	snprintf(id, cap, "%s", json_string_value(th_op_meta(op, "id")));
	json_decref(op);
}

/* Waits for operation id to finish; its final JSON (new reference). */
static json_t *op_wait(const char *id)
{
	char path[96];

	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	return th_post_json(&D, path, "{\"timeout\": \"60s\"}", 200);
}

/* n finished moves of array "a", alternating pinned_host and device; their
 * ids in creation order into ids (n entries of 32). */
static void moves(int n, char (*ids)[32])
{
	upload4("a");
	for (int i = 0; i < n; i++) {
		op_start("/v1/arrays/a:put", i % 2 ? "{\"memory_kind\": \"device\"}"
		                                     : "{\"memory_kind\": \"pinned_host\"}",
		         ids[i], sizeof ids[i]);
		json_decref(op_wait(ids[i]));
	}
}

/* A training step operation that runs until cancelled: a 10-layer MLP
 * stepping 1000000 times; its id into id. */
static void long_step(struct th_daemon *d, char *id, size_t cap, const char *query)
{
	static const char spec[] =
		"{\"name\": \"g\", \"mlp\": {\"layers\": 10, \"d_model\": 256, "
		"\"d_hidden\": 1024, \"activation\": \"relu\"}, \"loss\": \"sum\", "
		"\"init\": {\"seed\": 11, \"scale\": 0.05}}";
	static const char body[] = "{\"inputs\": \"x\", \"steps\": 1000000}";
	size_t n = 256 * 256;
	float *x = calloc(n, sizeof *x);
	struct th_response r;
	char path[96];

	ck_assert_ptr_nonnull(x);
	th_request(d, "POST", "/v1/models?wait=true", NULL, spec, strlen(spec), &r);
	ck_assert_msg(r.status == 200 || r.status == 201 || r.status == 202, "model: %ld %s",
	              r.status, r.body);
	if (r.status == 202) {
		/* a daemon with a short --wait-limit on a busy machine answers
		 * before the creation is done: wait for it in turns */
		char wait[128];
		json_t *op = json_incref(th_json(&r));

		static const char tmo[] = "{\"timeout\": \"1s\"}";

		snprintf(wait, sizeof wait, "/v1/%s:wait", th_str(op, "name"));
		json_decref(op);
		for (int i = 0; i < 120 && r.status == 202; i++) {
			th_response_free(&r);
			th_request(d, "POST", wait, NULL, tmo, strlen(tmo), &r);
			ck_assert_msg(r.status == 200 || r.status == 202, "model: %ld %s", r.status,
			              r.body);
		}
		ck_assert_msg(r.status == 200 && !json_object_get(th_json(&r), "error"),
		              "model creation: %ld %s", r.status, r.body);
	}
	th_response_free(&r);
	th_request(d, "PUT", "/v1/arrays/x?dtype=float32&shape=256,256", NULL, (const char *)x,
	           n * sizeof *x, &r);
	ck_assert_msg(r.status == 201, "x: %ld %s", r.status, r.body);
	th_response_free(&r);
	free(x);
	snprintf(path, sizeof path, "/v1/models/g:step%s", query ? query : "");
	th_request(d, "POST", path, NULL, body, strlen(body), &r);
	ck_assert_msg(r.status == 202, "step: %ld %s", r.status, r.body);
	snprintf(id, cap, "%s", json_string_value(th_op_meta(th_json(&r), "id")));
	ck_assert(!th_bool(th_json(&r), "done"));
	th_response_free(&r);
}

static void cancel_and_wait(struct th_daemon *d, const char *id)
{
	struct th_response r;
	char path[96];

	snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
	th_request(d, "POST", path, NULL, NULL, 0, &r);
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	th_request(d, "POST", path, NULL, "{\"timeout\": \"60s\"}", 18, &r);
	ck_assert_msg(r.status == 200 && th_bool(th_json(&r), "done"), "wait: %ld %s", r.status,
	              r.body);
	th_response_free(&r);
}

/* AIP-151: name, metadata, done and response (or error), nothing else. */
START_TEST(test_shape)
{
	static const char *const top[] = {"name", "metadata", "done", "response"};
	char ids[1][32], name[64];
	struct th_response r;
	json_t *op, *meta, *v;
	const char *key;

	moves(1, ids);
	snprintf(name, sizeof name, "/v1/operations/%s", ids[0]);
	op = th_get_json(&D, name, &r);
	ck_assert_msg(json_object_size(op) == 4, "members beyond the four of AIP-151: %s", r.body);
	for (size_t i = 0; i < 4; i++)
		ck_assert_msg(json_object_get(op, top[i]), "no '%s': %s", top[i], r.body);
	snprintf(name, sizeof name, "operations/%s", ids[0]);
	ck_assert_str_eq(th_str(op, "name"), name);
	ck_assert(th_bool(op, "done"));
	meta = th_obj(op, "metadata");
	ck_assert_str_eq(th_str(meta, "@type"), "type.googleapis.com/tstage.v1.OperationMetadata");
	json_object_foreach(meta, key, v)
		ck_assert_ptr_eq(th_op_meta(op, key), v);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "id")), ids[0]);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "kind")), "put");
	ck_assert_str_eq(json_string_value(th_op_meta(op, "target")), "a");
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	ck_assert_int_eq(th_int(th_op_meta(op, "progress"), "bytes_done"), 16);
	ck_assert(json_is_string(th_op_meta(op, "create_time")));
	ck_assert(json_is_string(th_op_meta(op, "end_time")));
	ck_assert_str_eq(th_str(th_op_result(op), "name"), "a");
	th_response_free(&r);
}
END_TEST

/* Every finished operation is reachable, page after page; a token is good
 * only for the listing that made it. */
START_TEST(test_paging)
{
	enum { N = 107 };
	static char ids[N][32];
	struct th_response r;
	char path[160], token[64];
	json_t *body, *list;
	size_t seen = 0;

	moves(N, ids);
	/* the default page (100) is not the whole list */
	body = th_get_json(&D, "/v1/operations", &r);
	ck_assert_int_eq(json_array_size(th_arr(body, "operations")), 100);
	ck_assert_msg(json_is_string(json_object_get(body, "next_page_token")),
	              "107 operations, 100 listed, no next_page_token");
	th_response_free(&r);

	token[0] = '\0';
	for (int page = 0;; page++) {
		snprintf(path, sizeof path, "/v1/operations?page_size=10%s%s",
		         token[0] ? "&page_token=" : "", token);
		body = th_get_json(&D, path, &r);
		list = th_arr(body, "operations");
		ck_assert_int_eq(json_array_size(list), page < N / 10 ? 10 : N % 10);
		for (size_t i = 0; i < json_array_size(list); i++, seen++)
			ck_assert_str_eq(json_string_value(th_op_meta(json_array_get(list, i), "id")),
			                 ids[N - 1 - seen]);
		if (!json_object_get(body, "next_page_token")) {
			th_response_free(&r);
			break;
		}
		ck_assert_msg(page < N / 10, "a next_page_token after the last page: %s", r.body);
		snprintf(token, sizeof token, "%s", th_str(body, "next_page_token"));
		th_response_free(&r);
	}
	ck_assert_int_eq(seen, N);

	/* the same with a state filter, and a token of another listing */
	body = th_get_json(&D, "/v1/operations?state=SUCCEEDED&page_size=100", &r);
	snprintf(token, sizeof token, "%s", th_str(body, "next_page_token"));
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations?state=SUCCEEDED&page_token=%s", token);
	body = th_get_json(&D, path, &r);
	ck_assert_int_eq(json_array_size(th_arr(body, "operations")), N - 100);
	ck_assert_str_eq(json_string_value(th_op_meta(json_array_get(th_arr(body, "operations"), 0),
	                                              "id")), ids[N - 101]);
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations?page_token=%s", token);
	th_get(&D, path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_PAGE_TOKEN");
	th_response_free(&r);
	snprintf(path, sizeof path, "/v1/operations?state=FAILED&page_token=%s", token);
	th_get(&D, path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_PAGE_TOKEN");
	th_response_free(&r);
	token[3] = token[3] == '0' ? '1' : '0';
	snprintf(path, sizeof path, "/v1/operations?state=SUCCEEDED&page_token=%s", token);
	th_get(&D, path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_PAGE_TOKEN");
	th_response_free(&r);
	th_get(&D, "/v1/operations?page_token=op-0123", &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_PAGE_TOKEN");
	th_response_free(&r);
}
END_TEST

/* A finished operation is forgotten; a running one is refused until it
 * ends. */
START_TEST(test_delete)
{
	char ids[2][32], path[96], step[32];
	struct th_response r;
	json_t *list;

	moves(2, ids);
	snprintf(path, sizeof path, "/v1/operations/%s", ids[0]);
	th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200 && json_object_size(th_json(&r)) == 0, "DELETE: %ld %s",
	              r.status, r.body);
	th_response_free(&r);
	th_get(&D, path, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	th_response_free(&r);
	th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	th_response_free(&r);
	list = th_arr(th_get_json(&D, "/v1/operations", &r), "operations");
	ck_assert_int_eq(json_array_size(list), 1);
	ck_assert_str_eq(json_string_value(th_op_meta(json_array_get(list, 0), "id")), ids[1]);
	th_response_free(&r);

	long_step(&D, step, sizeof step, NULL);
	snprintf(path, sizeof path, "/v1/operations/%s", step);
	th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
	th_assert_error(&r, 400, "FAILED_PRECONDITION", "OPERATION_RUNNING");
	ck_assert_msg(strstr(r.body, step), "the refusal does not name %s: %s", step, r.body);
	th_response_free(&r);
	th_get(&D, path, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	cancel_and_wait(&D, step);
	th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "DELETE of a cancelled operation: %ld %s", r.status, r.body);
	th_response_free(&r);
}
END_TEST

/* If-None-Match with the current ETag is 304 without a body; another tag,
 * or a changed resource, is 200. */
START_TEST(test_conditional_get)
{
	char ids[1][32], path[96], etag[128], hdr[160], step[32];
	const char *headers[] = {hdr, NULL};
	struct th_response r;

	moves(1, ids);
	snprintf(path, sizeof path, "/v1/operations/%s", ids[0]);
	th_get(&D, path, &r);
	ck_assert_ptr_nonnull(th_header(&r, "ETag"));
	snprintf(etag, sizeof etag, "%s", th_header(&r, "ETag"));
	th_response_free(&r);
	snprintf(hdr, sizeof hdr, "If-None-Match: %s", etag);
	th_request(&D, "GET", path, headers, NULL, 0, &r);
	ck_assert_msg(r.status == 304 && r.body_len == 0, "%s with its ETag: %ld %s", path, r.status,
	              r.body);
	ck_assert_str_eq(th_header(&r, "ETag"), etag);
	th_response_free(&r);
	snprintf(hdr, sizeof hdr, "If-None-Match: \"other\", W/%s", etag);
	th_request(&D, "GET", path, headers, NULL, 0, &r);
	ck_assert_int_eq(r.status, 304);
	th_response_free(&r);
	snprintf(hdr, sizeof hdr, "If-None-Match: \"other\"");
	th_request(&D, "GET", path, headers, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);

	/* an array: unchanged 304, replaced 200 with a new tag; its data too */
	th_get(&D, "/v1/arrays/a", &r);
	snprintf(hdr, sizeof hdr, "If-None-Match: %s", th_header(&r, "ETag"));
	th_response_free(&r);
	th_request(&D, "GET", "/v1/arrays/a", headers, NULL, 0, &r);
	ck_assert_msg(r.status == 304 && r.body_len == 0, "array: %ld %s", r.status, r.body);
	th_response_free(&r);
	th_request(&D, "GET", "/v1/arrays/a/data", headers, NULL, 0, &r);
	ck_assert_msg(r.status == 304 && r.body_len == 0, "array data: %ld", r.status);
	th_response_free(&r);
	upload4("a");
	th_request(&D, "GET", "/v1/arrays/a", headers, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_str_ne(th_header(&r, "ETag"), hdr + strlen("If-None-Match: "));
	th_response_free(&r);

	/* a running operation's tag follows its progress */
	long_step(&D, step, sizeof step, NULL);
	snprintf(path, sizeof path, "/v1/operations/%s", step);
	th_get(&D, path, &r);
	snprintf(hdr, sizeof hdr, "If-None-Match: %s", th_header(&r, "ETag"));
	th_response_free(&r);
	cancel_and_wait(&D, step);
	th_request(&D, "GET", path, headers, NULL, 0, &r);
	ck_assert_msg(r.status == 200 && th_bool(th_json(&r), "done"), "a finished operation "
	              "answered as unchanged: %ld %s", r.status, r.body);
	th_response_free(&r);
}
END_TEST

/* --wait-limit 1: ?wait=true answers 202 with the operation running once a
 * second has passed, and so does a :wait asking for longer. */
START_TEST(test_wait_limit)
{
	static const char *const args[] = {"--wait-limit", "1", NULL};
	struct th_daemon d;
	struct th_response r;
	char id[32], path[96];
	long long t0;

	th_daemon_start(&d, args);
	t0 = th_now_ms();
	long_step(&d, id, sizeof id, "?wait=true");
	ck_assert_msg(th_now_ms() - t0 < 30000, "?wait=true held the call past the limit");
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	t0 = th_now_ms();
	th_request(&d, "POST", path, NULL, "{\"timeout\": \"30s\"}", 18, &r);
	ck_assert_msg(r.status == 202 && !th_bool(th_json(&r), "done"), ":wait: %ld %s", r.status,
	              r.body);
	ck_assert_msg(th_now_ms() - t0 < 20000, ":wait of 30s past a limit of 1s took %lld ms",
	              th_now_ms() - t0);
	th_response_free(&r);
	cancel_and_wait(&d, id);
	th_daemon_stop_ok(&d);
}
END_TEST

/* A short :wait that starts while a long one waits ends at its own deadline:
 * the deadline thread sleeps until the earliest deadline it knows, and one
 * that comes before it must wake it. */
START_TEST(test_short_wait_after_long)
{
	static const char longer[] = "{\"timeout\": \"40s\"}", shorter[] = "{\"timeout\": \"1s\"}";
	struct th_response r;
	char id[32], path[96], req[256], buf[4096];
	long long t0, took;
	int fd;

	long_step(&D, id, sizeof id, NULL);
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	fd = th_raw_connect(&D);
	snprintf(req, sizeof req,
	         "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
	         "Content-Length: %zu\r\n\r\n%s", path, strlen(longer), longer);
	th_raw_send(fd, req);
	usleep(300000);           /* the long wait suspends first */
	t0 = th_now_ms();
	th_request(&D, "POST", path, NULL, shorter, strlen(shorter), &r);
	took = th_now_ms() - t0;
	ck_assert_msg(r.status == 202 && !th_bool(th_json(&r), "done"), ":wait: %ld %s", r.status,
	              r.body);
	ck_assert_msg(took >= 900 && took < 20000,
	              "a 1 s :wait behind a 40 s one answered after %lld ms", took);
	th_response_free(&r);
	/* the long one answers once the operation ends */
	cancel_and_wait(&D, id);
	ck_assert_msg(th_raw_response(fd, buf, sizeof buf, 10000) == 200, "the long wait: %.200s",
	              buf);
	close(fd);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("operations");
	TCase *tc = tcase_create("empty");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_add_test(tc, test_list_empty);
	tcase_add_test(tc, test_list_bad_arguments);
	tcase_add_test(tc, test_unknown_operation);
	tcase_add_test(tc, test_cancel_unknown);
	tcase_add_test(tc, test_wrong_methods);
	tcase_add_test(tc, test_delete_unknown);
	tcase_add_test(tc, test_operations_gauge);
	suite_add_tcase(s, tc);

	tc = tcase_create("lifecycle");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_shape);
	tcase_add_test(tc, test_paging);
	tcase_add_test(tc, test_delete);
	tcase_add_test(tc, test_conditional_get);
	tcase_add_test(tc, test_wait_limit);
	tcase_add_test(tc, test_short_wait_after_long);
	suite_add_tcase(s, tc);
	return s;
}
