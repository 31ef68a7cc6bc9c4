/*
 * test_accept.c - which daemon a connection's first bytes choose
 * (ts__first_request_class): methods with a body, methods split across
 * packets, long request lines, and bytes that are no HTTP at all.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

/* The class of the text s: 1 or 0 as answered, *bulk as set. */
static int class_of(const char *s, size_t n, bool *bulk)
{
	*bulk = !*bulk;                 /* set either way, never left as it was */
	return ts__first_request_class(s, n, bulk);
}

START_TEST(methods)
{
	static const char *const bulk_lines[] = {"PUT /v1/arrays/a HTTP/1.1\r\n", "POST /v1/models HTTP/1.1\r\n",
	                                         "PATCH /x HTTP/1.1\r\n", "PUT ", "POST /"};
	static const char *const small_lines[] = {"GET /livez HTTP/1.1\r\n", "DELETE /v1/arrays/a HTTP/1.1\r\n",
	                                          "HEAD / HTTP/1.1\r\n", "OPTIONS * HTTP/1.1\r\n",
	                                          "put / HTTP/1.1\r\n", "PUTX / HTTP/1.1\r\n",
	                                          "POS T / HTTP/1.1\r\n"};
	bool bulk = false;

	for (size_t i = 0; i < sizeof bulk_lines / sizeof bulk_lines[0]; i++) {
		ck_assert_int_eq(class_of(bulk_lines[i], strlen(bulk_lines[i]), &bulk), 1);
		ck_assert_msg(bulk, "%s", bulk_lines[i]);
	}
	for (size_t i = 0; i < sizeof small_lines / sizeof small_lines[0]; i++) {
		ck_assert_int_eq(class_of(small_lines[i], strlen(small_lines[i]), &bulk), 1);
		ck_assert_msg(!bulk, "%s", small_lines[i]);
	}
}
END_TEST

START_TEST(still_coming)
{
	static const char *const parts[] = {"G", "GE", "PU", "POS", "PATC", "GET /v1/arrays/a/data?rows=1,2"};
	bool bulk = true;

	for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
		ck_assert_int_eq(class_of(parts[i], strlen(parts[i]), &bulk), 0);
		ck_assert_msg(!bulk, "the guess for '%s' is the small daemon", parts[i]);
	}
	ck_assert_int_eq(class_of("", 0, &bulk), 0);
}
END_TEST

START_TEST(long_lines)
{
	char *b = malloc(2 * TS__LONG_LINE);
	bool bulk = false;

	ck_assert_ptr_nonnull(b);
	memset(b, 'a', 2 * TS__LONG_LINE);
	memcpy(b, "GET /", 5);
	/* a line whose end shows within the window: small */
	b[TS__LONG_LINE - 1] = '\n';
	ck_assert_int_eq(class_of(b, TS__LONG_LINE, &bulk), 1);
	ck_assert(!bulk);
	/* no end within the window: bulk, however much has come */
	b[TS__LONG_LINE - 1] = 'a';
	ck_assert_int_eq(class_of(b, TS__LONG_LINE - 1, &bulk), 0);
	ck_assert_int_eq(class_of(b, TS__LONG_LINE, &bulk), 1);
	ck_assert(bulk);
	b[TS__LONG_LINE + 10] = '\n';        /* past the window: not looked at */
	ck_assert_int_eq(class_of(b, 2 * TS__LONG_LINE, &bulk), 1);
	ck_assert(bulk);
	free(b);
}
END_TEST

START_TEST(not_http)
{
	static const char nul[] = "GET\0/ HTTP/1.1\r\n";
	static const char crlf_first[] = "\r\nPUT /v1/arrays/a HTTP/1.1\r\n";
	bool bulk = false;

	ck_assert_int_eq(class_of(nul, sizeof nul - 1, &bulk), 1);
	ck_assert(!bulk);
	/* an empty line before the request (RFC 9112 lets a server skip it)
	 * costs the upload its large pieces, nothing else */
	ck_assert_int_eq(class_of(crlf_first, sizeof crlf_first - 1, &bulk), 1);
	ck_assert(!bulk);
	ck_assert_int_eq(class_of("\x16\x03\x01\x02\x00\x01", 6, &bulk), 0);   /* a TLS hello */
}
END_TEST

static Suite *accept_suite(void)
{
	Suite *s = suite_create("accept");
	TCase *tc = tcase_create("first_request");

	tcase_add_test(tc, methods);
	tcase_add_test(tc, still_coming);
	tcase_add_test(tc, long_lines);
	tcase_add_test(tc, not_http);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(accept_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
