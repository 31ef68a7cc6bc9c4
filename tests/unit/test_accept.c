/*
 * test_accept.c - which daemon a connection's first bytes choose
 * (ts__first_request_class): methods with a body, methods split across
 * packets, long request lines, and bytes that are no HTTP at all; and which
 * small-request worker a connection goes to (ts__worker_pick): each fills
 * to --worker-fill in turn, then the least loaded.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"
#include "tests/unit/unit.h"

/* The class of the text s: 1 or 0 as answered, *bulk as set. */
static int class_of(const char *s, size_t n, bool *bulk)
{
	*bulk = !*bulk;                 /* set either way, never left as it was */
	return ts__first_request_class(s, n, bulk);
}

START_TEST(test_methods)
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

START_TEST(test_still_coming)
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

START_TEST(test_long_lines)
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

START_TEST(test_not_http)
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

/* Places conns connections one at a time on n workers that start with
 * start[] open, closing none, as the acceptor would: the counts after. */
static void place(int64_t *counts, const int64_t *start, int n, int fill, int conns)
{
	memcpy(counts, start, (size_t)n * sizeof *counts);
	for (int i = 0; i < conns; i++) {
		int w = ts__worker_pick(counts, n, fill);

		ck_assert_int_ge(w, 0);
		ck_assert_int_lt(w, n);
		counts[w]++;
	}
}

START_TEST(test_fill_then_balance)
{
	static const int64_t idle[4] = {0};
	int64_t c[4];

	/* a few connections share the first worker's poll loop */
	place(c, idle, 4, 4, 4);
	ck_assert(c[0] == 4 && c[1] == 0 && c[2] == 0 && c[3] == 0);
	/* the fifth opens the second worker */
	place(c, idle, 4, 4, 5);
	ck_assert(c[0] == 4 && c[1] == 1 && c[2] == 0 && c[3] == 0);
	/* every worker full: the least loaded takes the next, evenly */
	place(c, idle, 4, 4, 16);
	ck_assert(c[0] == 4 && c[1] == 4 && c[2] == 4 && c[3] == 4);
	place(c, idle, 4, 4, 256);
	for (int w = 0; w < 4; w++)
		ck_assert_int_eq(c[w], 64);
	place(c, idle, 4, 4, 18);
	ck_assert(c[0] == 5 && c[1] == 5 && c[2] == 4 && c[3] == 4);
}
END_TEST

START_TEST(test_fill_one_spreads)
{
	static const int64_t idle[3] = {0};
	int64_t c[3];

	place(c, idle, 3, 1, 4);
	ck_assert(c[0] == 2 && c[1] == 1 && c[2] == 1);
	place(c, idle, 3, 1, 300);
	ck_assert(c[0] == 100 && c[1] == 100 && c[2] == 100);
}
END_TEST

START_TEST(test_after_closes)
{
	/* worker 0 lost its connections: new ones fill it again first */
	static const int64_t left[3] = {0, 4, 2};
	/* every worker past fill, unevenly: the least loaded catch up */
	static const int64_t uneven[3] = {9, 5, 7};
	int64_t c[3];

	place(c, left, 3, 4, 4);
	ck_assert(c[0] == 4 && c[1] == 4 && c[2] == 2);
	place(c, left, 3, 4, 6);
	ck_assert(c[0] == 4 && c[1] == 4 && c[2] == 4);
	place(c, uneven, 3, 4, 4);
	ck_assert(c[0] == 9 && c[1] == 8 && c[2] == 8);
	/* one worker: everything goes there */
	place(c, uneven, 1, 4, 3);
	ck_assert_int_eq(c[0], 12);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("accept");
	TCase *tc = tcase_create("first_request");

	tcase_add_test(tc, test_methods);
	tcase_add_test(tc, test_still_coming);
	tcase_add_test(tc, test_long_lines);
	tcase_add_test(tc, test_not_http);
	suite_add_tcase(s, tc);
	tc = tcase_create("worker_pick");
	tcase_add_test(tc, test_fill_then_balance);
	tcase_add_test(tc, test_fill_one_spreads);
	tcase_add_test(tc, test_after_closes);
	suite_add_tcase(s, tc);
	return s;
}
