/*
 * test_router.c - route matching: literals, parameters, custom methods,
 * 404 versus 405 with Allow, HEAD on GET routes, and the real table.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "server/router.h"
#include "tests/unit/unit.h"

static void noop(const struct ts_call *c, struct ts_reply *r)
{
	(void)c;
	(void)r;
}

static const struct ts_route table[] = {
	{"GET", "/v1/devices", noop, NULL, NULL, TS_BODY_NONE, false, ""},
	{"GET", "/v1/devices/{device}", noop, NULL, NULL, TS_BODY_NONE, false, ""},
	{"GET", "/v1/devices/{device}/memory_stats", noop, NULL, NULL, TS_BODY_NONE, false,
	 "memory_kind"},
	{"POST", "/v1/memory:resetPeak", noop, NULL, NULL, TS_BODY_JSON, false, ""},
	{"PUT", "/v1/arrays/{array}", noop, NULL, NULL, TS_BODY_NONE, false,
	 "dtype,shape,device,memory_kind"},
	{"GET", "/v1/arrays/{array}", noop, NULL, NULL, TS_BODY_NONE, false, ""},
	{"DELETE", "/v1/arrays/{array}", noop, NULL, NULL, TS_BODY_NONE, false, ""},
	{"POST", "/v1/arrays/{array}:put", noop, NULL, NULL, TS_BODY_JSON, false, "wait:bool"},
	{"POST", "/v1/arrays:import", noop, NULL, NULL, TS_BODY_NONE, false, ""},
};
#define N (sizeof table / sizeof table[0])

START_TEST(test_literal_and_params)
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

START_TEST(test_custom_methods)
{
	struct ts_route_match m;

	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/memory:resetPeak", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 3);
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/memory:other", &m), TS_MATCH_NO_PATH);
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/w1:put", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 7);
	ck_assert_str_eq(m.params[0].value, "w1");
	/* ":put" with an empty name is no call of the verb, and no resource */
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/:put", &m), TS_MATCH_NO_PATH);
	/* an unknown verb is no resource under any method, not the bare
	 * parameter's route (405, or a handler given "w1:zap" as a name) */
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/w1:zap", &m), TS_MATCH_NO_PATH);
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/arrays/w1:zap", &m), TS_MATCH_NO_PATH);
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/devices/sim:x", &m), TS_MATCH_NO_PATH);
	/* a ':' followed by no letter calls nothing: an id such as "sim:0" */
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/devices/a:b:0", &m), TS_MATCH_FOUND);
	ck_assert_str_eq(m.params[0].value, "a:b:0");
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/arrays/w1:", &m), TS_MATCH_FOUND);
	ck_assert_str_eq(m.params[0].value, "w1:");
	/* a verb route's path under another method is 405, not the bare route */
	ck_assert_int_eq(ts_route_find(table, N, "GET", "/v1/arrays/w1:put", &m),
	                 TS_MATCH_BAD_METHOD);
	ck_assert_str_eq(m.allow, "POST");
	/* the collection-level verb is not taken for an array called "arrays:import" */
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays:import", &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 8);
}
END_TEST

START_TEST(test_method_not_allowed)
{
	struct ts_route_match m;

	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/devices", &m), TS_MATCH_BAD_METHOD);
	ck_assert_str_eq(m.allow, "GET, HEAD");
	ck_assert_int_eq(ts_route_find(table, N, "POST", "/v1/arrays/a", &m), TS_MATCH_BAD_METHOD);
	ck_assert_str_eq(m.allow, "PUT, GET, HEAD, DELETE");
	ck_assert_int_eq(ts_route_find(table, N, "HEAD", "/v1/devices", &m), TS_MATCH_FOUND);
}
END_TEST

START_TEST(test_unmatched_shapes)
{
	static const char *const paths[] = {"", "/", "v1/devices", "/v1/devices/", "/v1//devices",
	                                    "/v1/devices/a/b", "/v1/devices/a/memory_stats/x",
	                                    "/v1", "/v2/devices"};
	struct ts_route_match m;

	char deep[400] = "/v1/devices";

	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
		ck_assert_msg(ts_route_find(table, N, "GET", paths[i], &m) == TS_MATCH_NO_PATH,
		              "'%s' should not match", paths[i]);
	/* more segments than any pattern has: split no further, nothing matches */
	for (int i = 0; i < 40; i++)
		strcat(deep, "/x");
	ck_assert_int_eq(ts_route_find(table, N, "GET", deep, &m), TS_MATCH_NO_PATH);
}
END_TEST

/* A parameter too long to hold still matches (so the server answers 400
 * naming it, not 404), keeping a prefix; one that fits is whole. */
START_TEST(test_long_parameters)
{
	struct ts_route_match m;
	char path[400], put[420];

	memset(path, 'a', sizeof path);
	memcpy(path, "/v1/arrays/", 11);
	path[11 + TS_PARAM_MAX] = '\0';
	ck_assert_int_eq(ts_route_find(table, N, "GET", path, &m), TS_MATCH_FOUND);
	ck_assert_int_eq(m.too_long, -1);
	ck_assert_uint_eq(strlen(m.params[0].value), TS_PARAM_MAX);
	path[11 + TS_PARAM_MAX] = 'a';
	path[sizeof path - 1] = '\0';
	ck_assert_int_eq(ts_route_find(table, N, "GET", path, &m), TS_MATCH_FOUND);
	ck_assert_int_eq(m.too_long, 0);
	ck_assert_str_eq(m.params[0].name, "array");
	ck_assert_uint_eq(strlen(m.params[0].value), TS_PARAM_MAX);
	ck_assert_int_eq(strncmp(m.params[0].value, path + 11, TS_PARAM_MAX), 0);
	snprintf(put, sizeof put, "%s:put", path);
	ck_assert_int_eq(ts_route_find(table, N, "POST", put, &m), TS_MATCH_FOUND);
	ck_assert_uint_eq(m.index, 7);
	ck_assert_int_eq(m.too_long, 0);
	ck_assert_uint_eq(m.params[0].len, sizeof path - 1 - 11);
	ck_assert_str_eq(ts_param_rule_find("array")->reason, "BAD_ARRAY_NAME");
	ck_assert_uint_eq(ts_param_rule_find("array")->max, 128);
	ck_assert_str_eq(ts_param_rule_find("operation")->reason, "BAD_OPERATION_ID");
	ck_assert_str_eq(ts_param_rule_find("zzz")->reason, "BAD_PATH_PARAMETER");
	ck_assert_uint_eq(ts_param_rule_find("zzz")->max, TS_PARAM_MAX);
}
END_TEST

/* %HH decodes in place; %00 becomes C0 80 so that it stays visible. */
START_TEST(test_unescape)
{
	static const struct {
		const char *in, *out;
		size_t len;
	} cases[] = {
		{"abc", "abc", 3},
		{"a%20b", "a b", 3},
		{"%41%4a%4A", "AJJ", 3},
		{"a%00b", "a\xC0\x80" "b", 4},
		{"%00", "\xC0\x80", 2},
		{"%ff", "\xff", 1},
		{"%", "%", 1},
		{"%4", "%4", 2},
		{"%zz", "%zz", 3},
		{"%%41", "%A", 2},
		{"a+b", "a+b", 3},
		{"", "", 0},
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char buf[32];
		size_t n;

		snprintf(buf, sizeof buf, "%s", cases[i].in);
		n = ts_url_unescape(buf);
		ck_assert_msg(n == cases[i].len, "'%s': length %zu, want %zu", cases[i].in, n,
		              cases[i].len);
		ck_assert_msg(memcmp(buf, cases[i].out, n + 1) == 0, "'%s' decoded wrongly",
		              cases[i].in);
	}
}
END_TEST

static ts_status check_arg(const struct ts_route *r, const char *key, const char *value,
                           uint32_t *seen, struct ts_error *err)
{
	ts_error_clear(err);
	return ts_query_arg_check(r, key, strlen(key), value, value ? strlen(value) : 0, seen,
	                          err);
}

/* Only declared keys, each once, with clean text; bool values true/false. */
START_TEST(test_query_args)
{
	const struct ts_route *put = &table[4], *move = &table[7], *none = &table[0];
	struct ts_error err;
	uint32_t seen = 0;

	ck_assert_int_eq(check_arg(put, "dtype", "uint8", &seen, &err), TS_OK);
	ck_assert_int_eq(check_arg(put, "shape", "", &seen, &err), TS_OK);
	ck_assert_int_eq(check_arg(put, "memory_kind", "device", &seen, &err), TS_OK);
	/* a typo names itself and what the route takes */
	ck_assert_int_eq(check_arg(put, "memory_knd", "device", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "UNKNOWN_QUERY_PARAMETER");
	ck_assert_ptr_nonnull(strstr(err.message, "'memory_knd'"));
	ck_assert_ptr_nonnull(strstr(err.message, "dtype, shape, device, memory_kind"));
	ck_assert_ptr_nonnull(strstr(err.message, "PUT /v1/arrays/{array}"));
	/* a prefix or an extension of a known key is unknown */
	ck_assert_int_eq(check_arg(put, "dtyp", "x", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_int_eq(check_arg(put, "dtypes", "x", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_int_eq(check_arg(put, "memory", "x", &seen, &err), TS_INVALID_ARGUMENT);
	/* twice */
	ck_assert_int_eq(check_arg(put, "dtype", "uint8", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "DUPLICATE_QUERY_PARAMETER");
	/* no '=' */
	ck_assert_int_eq(check_arg(put, "device", NULL, &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_QUERY_PARAMETER");
	/* an empty key without a value is skipped */
	ck_assert_int_eq(check_arg(put, "", NULL, &seen, &err), TS_OK);
	ck_assert_int_eq(check_arg(put, "", "x", &seen, &err), TS_INVALID_ARGUMENT);
	/* NUL (as the unescaper writes it, and raw) and bad UTF-8 */
	seen = 0;
	ck_assert_int_eq(check_arg(put, "device", "sim:0\xC0\x80x", &seen, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_ENCODING");
	ck_assert_ptr_nonnull(strstr(err.message, "NUL"));
	ck_assert_ptr_nonnull(strstr(err.message, "'device'"));
	seen = 0;
	ck_assert_int_eq(ts_query_arg_check(put, "device", 6, "ab\0c", 4, &seen, &err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "NUL"));
	seen = 0;
	ck_assert_int_eq(check_arg(put, "device", "\xff", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "UTF-8"));
	ck_assert_int_eq(check_arg(put, "dev\xffice", "x", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_ENCODING");
	/* typed bools */
	seen = 0;
	ck_assert_int_eq(check_arg(move, "wait", "true", &seen, &err), TS_OK);
	seen = 0;
	ck_assert_int_eq(check_arg(move, "wait", "false", &seen, &err), TS_OK);
	seen = 0;
	ck_assert_int_eq(check_arg(move, "wait", "yes", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "true or false"));
	/* a route that takes none says so */
	seen = 0;
	ck_assert_int_eq(check_arg(none, "x", "1", &seen, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "no query parameters"));
}
END_TEST

/* Every route of the real table declares its parameters well-formed: names
 * of [a-z_], an optional ":bool", at most 32, none twice. */
START_TEST(test_real_table_queries)
{
	for (size_t i = 0; i < ts_nroutes; i++) {
		const char *q = ts_routes[i].query;
		char copy[512], *save = NULL;
		const char *names[40];
		int n = 0;

		ck_assert_msg(q != NULL, "%s has no query declaration", ts_route_patterns[i]);
		snprintf(copy, sizeof copy, "%s", q);
		for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
			char *colon = strchr(t, ':');

			if (colon) {
				ck_assert_str_eq(colon, ":bool");
				*colon = '\0';
			}
			ck_assert_msg(*t && strspn(t, "abcdefghijklmnopqrstuvwxyz_") == strlen(t),
			              "%s: bad parameter name '%s'", ts_route_patterns[i], t);
			for (int k = 0; k < n; k++)
				ck_assert_str_ne(names[k], t);
			ck_assert_int_lt(n, 32);
			names[n++] = t;
		}
	}
}
END_TEST

START_TEST(test_real_table)
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
START_TEST(test_fault_control_only_in_fault_builds)
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

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("router");
	TCase *tc = tcase_create("match");

	tcase_add_test(tc, test_literal_and_params);
	tcase_add_test(tc, test_custom_methods);
	tcase_add_test(tc, test_method_not_allowed);
	tcase_add_test(tc, test_unmatched_shapes);
	tcase_add_test(tc, test_real_table);
	tcase_add_test(tc, test_long_parameters);
	tcase_add_test(tc, test_unescape);
	tcase_add_test(tc, test_query_args);
	tcase_add_test(tc, test_real_table_queries);
	tcase_add_test(tc, test_fault_control_only_in_fault_builds);
	suite_add_tcase(s, tc);
	return s;
}
