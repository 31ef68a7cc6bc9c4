/*
 * test_common.c - the status table, error recorder, byte-size parsing and
 * formatting, and log escaping.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "common/units.h"

START_TEST(status_canonical_mapping)
{
	static const struct {
		ts_status st;
		const char *name;
		int http;
	} want[] = {
		{TS_OK, "OK", 200},
		{TS_INVALID_ARGUMENT, "INVALID_ARGUMENT", 400},
		{TS_UNAUTHENTICATED, "UNAUTHENTICATED", 401},
		{TS_PERMISSION_DENIED, "PERMISSION_DENIED", 403},
		{TS_NOT_FOUND, "NOT_FOUND", 404},
		{TS_ALREADY_EXISTS, "ALREADY_EXISTS", 409},
		{TS_ABORTED, "ABORTED", 409},
		{TS_FAILED_PRECONDITION, "FAILED_PRECONDITION", 400},
		{TS_RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED", 429},
		{TS_CANCELLED, "CANCELLED", 499},
		{TS_INTERNAL, "INTERNAL", 500},
		{TS_UNAVAILABLE, "UNAVAILABLE", 503},
		{TS_DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", 504},
	};

	ck_assert_int_eq(TS_OK, 0);
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		ck_assert_str_eq(ts_status_name(want[i].st), want[i].name);
		ck_assert_int_eq(ts_status_http(want[i].st), want[i].http);
	}
	ck_assert_str_eq(ts_status_name((ts_status)999), "UNKNOWN");
	ck_assert_int_eq(ts_status_http((ts_status)999), 500);
}
END_TEST

START_TEST(status_from_errno)
{
	ck_assert_int_eq(ts_status_from_errno(0), TS_OK);
	ck_assert_int_eq(ts_status_from_errno(ENOMEM), TS_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(ts_status_from_errno(ENOENT), TS_NOT_FOUND);
	ck_assert_int_eq(ts_status_from_errno(EACCES), TS_PERMISSION_DENIED);
	ck_assert_int_eq(ts_status_from_errno(EEXIST), TS_ALREADY_EXISTS);
	ck_assert_int_eq(ts_status_from_errno(EIO), TS_INTERNAL);
}
END_TEST

START_TEST(error_first_wins)
{
	struct ts_error e;

	ts_error_clear(&e);
	ck_assert_int_eq(ts_error_set(&e, TS_NOT_FOUND, "A", "first %d", 1), TS_NOT_FOUND);
	ck_assert_int_eq(ts_error_set(&e, TS_INTERNAL, "B", "second"), TS_NOT_FOUND);
	ck_assert_str_eq(e.message, "first 1");
	ck_assert_str_eq(e.reason, "A");
	ts_error_meta_u64(&e, "bytes", 12345678901234ull);
	ck_assert_int_eq(e.nmeta, 1);
	ck_assert_str_eq(e.meta[0].value, "12345678901234");
	for (int i = 0; i < 20; i++)
		ts_error_meta(&e, "k", "%d", i);
	ck_assert_int_eq(e.nmeta, TS_ERROR_META_MAX);
	ck_assert_int_eq(ts_error_set(NULL, TS_ABORTED, "X", "y"), TS_ABORTED);
}
END_TEST

START_TEST(size_parse)
{
	static const struct {
		const char *s;
		uint64_t v;
	} ok[] = {
		{"0", 0}, {"512", 512}, {"512B", 512}, {"1K", 1024}, {"1KiB", 1024},
		{"1kb", 1000}, {"2GiB", 2ull << 30}, {"2gib", 2ull << 30}, {"2G", 2ull << 30},
		{"1.5MiB", 1572864}, {"3MB", 3000000}, {"1TiB", 1ull << 40}, {"64 MiB", 64ull << 20},
	};
	static const char *const bad[] = {"", "-1", "abc", "1XB", "GiB", "1e30TiB", "nan",
	                                   "inf", " 1", "1GiBx", "0x10"};
	uint64_t v;

	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		ck_assert_msg(ts_parse_size(ok[i].s, &v), "%s should parse", ok[i].s);
		ck_assert_uint_eq(v, ok[i].v);
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ck_assert_msg(!ts_parse_size(bad[i], &v), "'%s' should not parse", bad[i]);
	ck_assert(!ts_parse_size(NULL, &v));
}
END_TEST

START_TEST(size_format)
{
	char buf[32];

	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 0), "0 B");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 1023), "1023 B");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 1024), "1.00 KiB");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 2ull << 30), "2.00 GiB");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 768ull << 20), "768.00 MiB");
}
END_TEST

START_TEST(long_parse)
{
	long v;

	ck_assert(ts_parse_long("42", 0, 100, &v) && v == 42);
	ck_assert(ts_parse_long("-1", -1, 5, &v) && v == -1);
	ck_assert(!ts_parse_long("101", 0, 100, &v));
	ck_assert(!ts_parse_long("4x", 0, 100, &v));
	ck_assert(!ts_parse_long("", 0, 100, &v));
	ck_assert(!ts_parse_long("99999999999999999999999", 0, 100, &v));
}
END_TEST

START_TEST(json_escape)
{
	char buf[64];

	ck_assert_str_eq(ts_json_escape(buf, sizeof buf, "a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
	/* truncation keeps the result a valid string */
	ts_json_escape(buf, 10, "\"\"\"\"\"\"\"\"\"\"");
	ck_assert_uint_lt(strlen(buf), 10);
	ck_assert(strlen(buf) % 2 == 0);
}
END_TEST

START_TEST(log_levels)
{
	enum ts_log_level l;

	ck_assert(ts_log_level_parse("debug", &l) && l == TS_LOG_DEBUG);
	ck_assert(ts_log_level_parse("WARN", &l) && l == TS_LOG_WARN);
	ck_assert(ts_log_level_parse("warning", &l) && l == TS_LOG_WARN);
	ck_assert(!ts_log_level_parse("loud", &l));
	ts_log_set_level(TS_LOG_WARN);
	ck_assert(!ts_log_enabled(TS_LOG_INFO));
	ck_assert(ts_log_enabled(TS_LOG_ERROR));
	ts_log_set_level(TS_LOG_INFO);
}
END_TEST

static Suite *common_suite(void)
{
	Suite *s = suite_create("common");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, status_canonical_mapping);
	tcase_add_test(tc, status_from_errno);
	tcase_add_test(tc, error_first_wins);
	tcase_add_test(tc, size_parse);
	tcase_add_test(tc, size_format);
	tcase_add_test(tc, long_parse);
	tcase_add_test(tc, json_escape);
	tcase_add_test(tc, log_levels);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(common_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
