/*
 * it_operations.c - Check suite "operations": the operation resource of a
 * real daemon before any operation exists (they come from :put and :copy):
 * an empty list and its filters, the google.rpc.Status answers for unknown
 * ids and bad arguments, wrong methods, and the tstage_operations gauge.
 *
 * Each test case runs in its own forked process with its own daemon (a
 * checked fixture).
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
		{"DELETE", "/v1/operations/op-0123456789abcdef"},
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

static Suite *operations_suite(void)
{
	Suite *s = suite_create("operations");
	TCase *tc = tcase_create("empty");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_add_test(tc, test_list_empty);
	tcase_add_test(tc, test_list_bad_arguments);
	tcase_add_test(tc, test_unknown_operation);
	tcase_add_test(tc, test_cancel_unknown);
	tcase_add_test(tc, test_wrong_methods);
	tcase_add_test(tc, test_operations_gauge);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr;
	int failed;

	curl_global_init(CURL_GLOBAL_DEFAULT);
	th_init();
	sr = srunner_create(operations_suite());
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	curl_global_cleanup();
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
