/*
 * test_router.c - route matching: literals, parameters, custom methods,
 * 404 versus 405 with Allow, HEAD on GET routes, and the real table.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "server/router.h"

static void noop(const struct ts_call *c, struct ts_reply *r)
{
	(void)c;
	(void)r;
}

static const struct ts_route table[] = {
	{"GET", "/v1/devices", noop, NULL, NULL, TS_BODY_NONE, false},
	{"GET", "/v1/devices/{device}", noop, NULL, NULL, TS_BODY_NONE, false},
	{"GET", "/v1/devices/{device}/memory_stats", noop, NULL, NULL, TS_BODY_NONE, false},
	{"POST", "/v1/memory:resetPeak", noop, NULL, NULL, TS_BODY_JSON, false},
	{"PUT", "/v1/arrays/{array}", noop, NULL, NULL, TS_BODY_NONE, false},
	{"GET", "/v1/arrays/{array}", noop, NULL, NULL, TS_BODY_NONE, false},
	{"DELETE", "/v1/arrays/{array}", noop, NULL, NULL, TS_BODY_NONE, false},
	{"POST", "/v1/arrays/{array}:put", noop, NULL, NULL, TS_BODY_JSON, false},
	{"POST", "/v1/arrays:import", noop, NULL, NULL, TS_BODY_NONE, false},
};
#define N (sizeof table / sizeof table[0])

START_TEST(literal_and_params)
{
	struct ts_route_match m;

	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/devices", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 0);
	ck_assert_int_eq(m.nparams, 0);
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/devices/sim:0", &m), TS_MATCH_FOUND);
	ck_assert_str_eq(m.params[0].value, "sim:0");
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/devices/sim0", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 1);
	ck_assert_int_eq(m.nparams, 1);
	ck_assert_str_eq(m.params[0].name, "device");
	ck_assert_str_eq(m.params[0].value, "sim0");
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/devices/x/memory_stats", &m),
	                 TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 2);
	ck_assert_str_eq(m.params[0].value, "x");
}
END_TEST

START_TEST(custom_methods)
{
	struct ts_route_match m;

	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/memory:resetPeak", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 3);
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/memory:other", &m), TS_MATCH_NO_PATH);
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/w1:put", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 7);
	ck_assert_str_eq(m.params[0].value, "w1");
	/* ":put" with an empty name is no call of the verb */
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/:put", &m),
	                 TS_MATCH_BAD_METHOD);
	/* an unknown verb falls to the bare parameter, whose handler rejects
	 * the name: POST is not allowed there */
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/w1:zap", &m),
	                 TS_MATCH_BAD_METHOD);
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/arrays/w1:zap", &m), TS_MATCH_FOUND);
	ck_assert_str_eq(m.params[0].value, "w1:zap");
	/* a verb route's path under another method is 405, not the bare route */
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/arrays/w1:put", &m),
	                 TS_MATCH_BAD_METHOD);
	ck_assert_str_eq(m.allow, "POST");
	/* the collection-level verb is not taken for an array called "arrays:import" */
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays:import", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 8);
}
END_TEST

START_TEST(method_not_allowed)
{
	struct ts_route_match m;

	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/devices", &m), TS_MATCH_BAD_METHOD);
	ck_assert_str_eq(m.allow, "GET, HEAD");
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/a", &m), TS_MATCH_BAD_METHOD);
	ck_assert_str_eq(m.allow, "PUT, GET, HEAD, DELETE");
	ck_assert_int_eq(ts_route_find(table, N, "HEAD", "/v1/devices", &m), TS_MATCH_FOUND);
}
END_TEST

START_TEST(unmatched_shapes)
{
	static const char *const paths[] = {"", "/", "v1/devices", "/v1/devices/", "/v1//devices",
	                                    "/v1/devices/a/b", "/v1/devices/a/memory_stats/x",
	                                    "/v1", "/v2/devices"};
	struct ts_route_match m;
	char longname[400];

	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
		ck_assert_msg(ts_route_find(table, N, "GET", paths[i], &m) == TS_MATCH_NO_PATH,
		              "'%s' should not match", paths[i]);
	memset(longname, 'a', sizeof longname);
	memcpy(longname, "/v1/devices/", 12);
	longname[sizeof longname - 1] = '\0';
	ck_assert_int_eq(ts_route_find(table, N, "GET", longname, &m), TS_MATCH_NO_PATH);
}
END_TEST

START_TEST(real_table)
{
	struct ts_route_match m;

	ck_assert_uint_gt(ts_nroutes, 5);
	for (size_t i = 0; i < ts_nroutes; i++) {
		ck_assert(ts_routes[i].fn || ts_routes[i].sfn || ts_routes[i].upload);
		ck_assert((ts_routes[i].body == TS_BODY_STREAM) == (ts_routes[i].upload != NULL));
		ck_assert_ptr_nonnull(ts_route_patterns[i]);
	}
	ck_assert_int_eq(ts_route_find(ts_routes, ts_nroutes, "GET", "/v1/memory", &m), TS_MATCH_FOUND);
	ck_assert_int_eq(ts_route_find(ts_routes, ts_nroutes, "POST", "/livez", &m),
	                 TS_MATCH_BAD_METHOD);
	ck_assert_int_eq(ts_route_find(ts_routes, ts_nroutes, "GET", "/nope", &m), TS_MATCH_NO_PATH);
}
END_TEST

/* The control of injected failures is a route of fault builds only. */
START_TEST(fault_control_only_in_fault_builds)
{
	struct ts_route_match m;
#ifdef TS_FAULT_BUILD
	enum ts_match want = TS_MATCH_FOUND;
#else
	enum ts_match want = TS_MATCH_NO_PATH;
#endif

	ck_assert_int_eq(ts_route_find(ts_routes, ts_nroutes, "GET", "/debug/faults", &m), want);
	ck_assert_int_eq(ts_route_find(ts_routes, ts_nroutes, "POST", "/debug/faults", &m), want);
}
END_TEST

static Suite *router_suite(void)
{
	Suite *s = suite_create("router");
	TCase *tc = tcase_create("match");

	tcase_add_test(tc, literal_and_params);
	tcase_add_test(tc, custom_methods);
	tcase_add_test(tc, method_not_allowed);
	tcase_add_test(tc, unmatched_shapes);
	tcase_add_test(tc, real_table);
	tcase_add_test(tc, fault_control_only_in_fault_builds);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(router_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
