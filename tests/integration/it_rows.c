/*
 * it_rows.c - Check suite "rows": GET /v1/arrays/{a}/data?rows=7,1,2,3
 * against a real daemon: the named rows of axis 0 in the given order, in
 * one [n, ...] body (raw, or .npy with Accept), from host and device
 * memory, answered in place or streamed across response blocks; and its errors: out-of-range and
 * negative out-of-range rows (400 naming the row), entries that are not
 * integers, rows= with index=, rows of a scalar; and POST
 * /v1/arrays/{a}:rows, the same rows named in a JSON body.
 *
 * Every case has its own daemon (checked fixture, forked per case).
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CASE_TIMEOUT_S 120

static struct th_daemon D;

static void daemon_up(void)
{
	th_daemon_start(&D, NULL);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* Uploads nrows rows of row_bytes (uint8, shape [nrows, row_bytes]) filled
 * from seed into kind; returns the bytes (caller frees). */
static char *put_rows(const char *name, size_t nrows, size_t row_bytes, const char *kind,
                      uint64_t seed)
{
	char query[160];
	char *data = malloc(nrows * row_bytes);

	ck_assert_ptr_nonnull(data);
	th_fill(data, nrows * row_bytes, seed);
	snprintf(query, sizeof query, "dtype=uint8&shape=%zu,%zu&memory_kind=%s", nrows, row_bytes,
	         kind);
	th_put_array(&D, name, query, data, nrows * row_bytes);
	return data;
}

/* GETs ?rows=list and checks the body is rows want[0..n) of data, in order. */
static void check_rows(const char *name, const char *list, const long *want, size_t n,
                       const char *data, size_t row_bytes)
{
	struct th_response r;
	char path[2048], shape[64], what[2100];
	char *expect = malloc(n * row_bytes + 1);

	ck_assert_ptr_nonnull(expect);
	for (size_t i = 0; i < n; i++)
		memcpy(expect + i * row_bytes, data + (size_t)want[i] * row_bytes, row_bytes);
	snprintf(path, sizeof path, "/v1/arrays/%s/data?rows=%s", name, list);
	th_get(&D, path, &r);
	ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
	snprintf(shape, sizeof shape, "[%zu,%zu]", n, row_bytes);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Shape"), shape);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Dtype"), "uint8");
	snprintf(what, sizeof what, "GET %s", path);
	th_assert_bytes(what, r.body, r.body_len, expect, n * row_bytes);
	th_response_free(&r);
	free(expect);
}

static void rows_in(const char *kind)
{
	char *data = put_rows(kind, 8, 16, kind, 7);
	static const long order[] = {7, 1, 2, 3}, dups[] = {4, 0, 0, 4, 4},
	                  neg[] = {7, 6, 0}, one[] = {5}, asc[] = {1, 2, 3, 4, 5, 6};

	check_rows(kind, "7,1,2,3", order, 4, data, 16);
	check_rows(kind, "4,0,0,4,4", dups, 5, data, 16);
	check_rows(kind, "-1,-2,-8", neg, 3, data, 16);
	check_rows(kind, "5", one, 1, data, 16);
	check_rows(kind, "1,2,3,4,5,6", asc, 6, data, 16);
	free(data);
}

START_TEST(test_rows_host)
{
	rows_in("unpinned_host");
	rows_in("pinned_host");
}
END_TEST

START_TEST(test_rows_device)
{
	rows_in("device");
}
END_TEST

/* Rows of 100 KiB: a body of several 256 KiB response blocks, runs cut at
 * block edges. */
START_TEST(test_rows_across_blocks)
{
	static const long want[] = {9, 0, 1, 2, 5, 5, 3, 8};
	const size_t row = 100 * 1024;
	char *data = put_rows("big", 10, row, "unpinned_host", 11);

	check_rows("big", "9,0,1,2,5,5,3,8", want, 8, data, row);
	free(data);
	data = put_rows("bigd", 10, row, "device", 12);
	check_rows("bigd", "9,0,1,2,5,5,3,8", want, 8, data, row);
	free(data);
}
END_TEST

/* More runs than a reply answers in place (descending rows never merge):
 * the rows are streamed, in host and device memory alike. */
START_TEST(test_rows_many_runs)
{
	static const char *const kinds[] = {"unpinned_host", "device"};
	long want[150];
	char list[1024];
	size_t o = 0;

	for (int i = 0; i < 150; i++) {
		want[i] = (long)(199 - (i * 7) % 200);
		o += (size_t)snprintf(list + o, sizeof list - o, "%s%ld", i ? "," : "", want[i]);
	}
	for (size_t k = 0; k < 2; k++) {
		char *data = put_rows(kinds[k], 200, 24, kinds[k], 5 + k);

		check_rows(kinds[k], list, want, 150, data, 24);
		free(data);
	}
}
END_TEST

/* Accept: application/x-npy: an .npy of shape (n, ...) with the rows. */
START_TEST(test_rows_npy)
{
	static const char *const accept[] = {"Accept: application/x-npy", NULL};
	char *data = put_rows("n", 6, 4, "unpinned_host", 3);
	struct th_response r;
	const char *hdr;
	size_t hlen;

	th_request(&D, "GET", "/v1/arrays/n/data?rows=5,0,5", accept, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert_str_eq(th_header(&r, "Content-Type"), "application/x-npy");
	ck_assert_msg(r.body_len > 10 && memcmp(r.body, "\x93NUMPY", 6) == 0, "not an .npy");
	hlen = 10 + (size_t)((unsigned char)r.body[8] | (unsigned char)r.body[9] << 8);
	ck_assert_uint_eq(r.body_len, hlen + 12);
	hdr = strstr(r.body + 10, "'shape': (3, 4)");
	ck_assert_msg(hdr && hdr < r.body + hlen, "header: %.*s", (int)(hlen - 10), r.body + 10);
	ck_assert_int_eq(memcmp(r.body + hlen, data + 20, 4), 0);
	ck_assert_int_eq(memcmp(r.body + hlen + 4, data, 4), 0);
	ck_assert_int_eq(memcmp(r.body + hlen + 8, data + 20, 4), 0);
	th_response_free(&r);
	free(data);
}
END_TEST

/* Fails with http/status/reason and a message that holds needle. */
static void check_error(const char *path, long http, const char *status, const char *reason,
                        const char *needle)
{
	struct th_response r;
	char what[300];

	snprintf(what, sizeof what, "GET %s", path);
	th_get(&D, path, &r);
	th_expect_error(&r, what, http, status, reason, needle, NULL);
}

START_TEST(test_rows_errors)
{
	struct th_response r;

	free(put_rows("e", 5, 8, "unpinned_host", 1));
	check_error("/v1/arrays/e/data?rows=1,5", 400, "OUT_OF_RANGE", "INDEX_OUT_OF_RANGE",
	            "row index 5 at position 1");
	check_error("/v1/arrays/e/data?rows=-6", 400, "OUT_OF_RANGE", "INDEX_OUT_OF_RANGE",
	            "row index -6");
	check_error("/v1/arrays/e/data?rows=0,x,2", 400, "INVALID_ARGUMENT", "BAD_ROWS", "'x'");
	check_error("/v1/arrays/e/data?rows=0,,2", 400, "INVALID_ARGUMENT", "BAD_ROWS",
	            "entry 1");
	check_error("/v1/arrays/e/data?rows=", 400, "INVALID_ARGUMENT", "BAD_ROWS", "entry 0");
	check_error("/v1/arrays/e/data?rows=99999999999999999999", 400, "INVALID_ARGUMENT",
	            "BAD_ROWS", "not an integer");
	check_error("/v1/arrays/e/data?rows=1,2&index=0", 400, "INVALID_ARGUMENT", "BAD_ROWS",
	            "rows and index");
	th_request(&D, "PUT", "/v1/arrays/s?dtype=uint8&shape=&memory_kind=unpinned_host", NULL,
	           "x", 1, &r);
	ck_assert_msg(r.status == 201, "PUT scalar: %ld %s", r.status, r.body);
	th_response_free(&r);
	check_error("/v1/arrays/s/data?rows=0", 400, "INVALID_ARGUMENT", "BAD_ROWS", "scalar");
	check_error("/v1/arrays/missing/data?rows=0", 404, "NOT_FOUND", NULL, "missing");
}
END_TEST

/* POSTs the JSON text body to path with headers (NULL or NULL-terminated). */
static void post_json(const char *path, const char *const *headers, const char *body,
                      struct th_response *r)
{
	th_request(&D, "POST", path, headers, body, strlen(body), r);
}

/* POST /v1/arrays/{a}:rows: a list too long for a URL (100,000 rows, about
 * 490 KB of JSON) in a body, answered as ?rows= answers; a slice; the
 * body's errors name the field. */
START_TEST(test_rows_in_body)
{
	static const char *const npy[] = {"Accept: application/x-npy", NULL};
	const size_t n = 100000, nrows = 4096, row = 3;
	char *data = put_rows("b", nrows, row, "unpinned_host", 9);
	size_t cap = n * 8 + 32, o = 0;
	char *body = malloc(cap), *expect = malloc(n * row), shape[64];
	struct th_response r;

	ck_assert_ptr_nonnull(body);
	ck_assert_ptr_nonnull(expect);
	o += (size_t)snprintf(body + o, cap - o, "{\"rows\": [");
	for (size_t i = 0; i < n; i++) {
		long v = (long)((i * 7919) % nrows) - (long)(i % 2) * (long)nrows;

		o += (size_t)snprintf(body + o, cap - o, "%s%ld", i ? "," : "", v);
		memcpy(expect + i * row, data + (size_t)(v < 0 ? v + (long)nrows : v) * row, row);
	}
	snprintf(body + o, cap - o, "]}");
	th_request(&D, "POST", "/v1/arrays/b:rows", NULL, body, strlen(body), &r);
	ck_assert_msg(r.status == 200, "POST :rows: %ld %.300s", r.status, r.body);
	snprintf(shape, sizeof shape, "[%zu,%zu]", n, row);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Shape"), shape);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Dtype"), "uint8");
	ck_assert_ptr_nonnull(th_header(&r, "ETag"));
	th_assert_bytes("POST :rows", r.body, r.body_len, expect, n * row);
	th_response_free(&r);

	post_json("/v1/arrays/b:rows?format=npy", NULL,
	          "{\"rows\": {\"start\": 10, \"stop\": 4, \"step\": -3}}", &r);
	ck_assert_msg(r.status == 200, "POST :rows slice: %ld %.300s", r.status, r.body);
	ck_assert_str_eq(th_header(&r, "Content-Type"), "application/x-npy");
	ck_assert_int_eq(memcmp(r.body + r.body_len - 6, data + 10 * row, row), 0);
	ck_assert_int_eq(memcmp(r.body + r.body_len - 3, data + 7 * row, row), 0);
	th_response_free(&r);
	post_json("/v1/arrays/b:rows", npy, "{\"rows\": [1]}", &r);
	ck_assert_str_eq(th_header(&r, "Content-Type"), "application/x-npy");
	th_response_free(&r);

	post_json("/v1/arrays/b:rows", NULL, "{\"rows\": [0, 4096]}", &r);
	th_expect_error(&r, "row past the end", 400, "OUT_OF_RANGE", "INDEX_OUT_OF_RANGE",
	                "row index 4096", NULL);
	post_json("/v1/arrays/b:rows", NULL, "{\"rows\": [0, \"x\"]}", &r);
	th_expect_error(&r, "a string row", 400, "INVALID_ARGUMENT", "BAD_ROWS", "rows[1]", NULL);
	post_json("/v1/arrays/b:rows", NULL, "{\"rows\": [0], \"x\": 1}", &r);
	th_expect_error(&r, "an unknown key", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "x", NULL);
	post_json("/v1/arrays/b:rows", NULL, "rows=1,2", &r);
	th_expect_error(&r, "not JSON", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", NULL, NULL);
	post_json("/v1/arrays/nope:rows", NULL, "{\"rows\": [0]}", &r);
	th_expect_error(&r, "missing array", 404, "NOT_FOUND", NULL, "nope", NULL);
	free(body);
	free(expect);
	free(data);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("rows");
	TCase *tc = tcase_create("rows");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_rows_host);
	tcase_add_test(tc, test_rows_device);
	tcase_add_test(tc, test_rows_across_blocks);
	tcase_add_test(tc, test_rows_many_runs);
	tcase_add_test(tc, test_rows_npy);
	tcase_add_test(tc, test_rows_errors);
	tcase_add_test(tc, test_rows_in_body);
	suite_add_tcase(s, tc);
	return s;
}
