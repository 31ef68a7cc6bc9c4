/*
 * test_accept.c - which daemon a connection's first bytes choose
 * (ts__first_request_class): methods with a body, methods split across
 * packets, long request lines, and bytes that are no HTTP at all; and which
 * small-request worker a connection goes to (ts__worker_pick): each fills
 * to --worker-fill in turn, then the least loaded.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_tuning.h"
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

/* ts__head_check on s: its answer, *h filled. */
static int head(const char *s, struct ts__head *h)
{
	return ts__head_check(s, strlen(s), h);
}

/* A connection's first head: whole or still coming, its length and fields,
 * which daemon holds it, and each refusal with its status and reason. */
START_TEST(test_head_check)
{
	static const struct {
		const char *text, *reason;
		int http;
	} refused[] = {
		{"GET /x HTTP/1.1\r\nHost: t\r\nnocolon\r\n\r\n", "MALFORMED_HEADER", 400},
		{"GET /x\r\n\r\n", "MALFORMED_REQUEST", 400},
		{"GARBAGE\r\n", "MALFORMED_REQUEST", 400},
		{" /x HTTP/1.1\r\n", "MALFORMED_REQUEST", 400},
		{"GET /x HTTP/2.0\r\n", "HTTP_VERSION_NOT_SUPPORTED", 505},
		{"GET /x HTTP/1.x\r\n", "HTTP_VERSION_NOT_SUPPORTED", 505},
		{"PUT /x HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", "BAD_CONTENT_LENGTH", 400},
		{"PUT /x HTTP/1.1\r\ncontent-length: \r\n\r\n", "BAD_CONTENT_LENGTH", 400},
		{"PUT /x HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
		 "BAD_CONTENT_LENGTH", 400},
		{"PUT /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		 "UNSUPPORTED_TRANSFER_ENCODING", 501},
	};
	struct ts__head h;
	char *big = malloc(TS_HTTP_HEAD_MAX + 64);
	size_t o;

	ck_assert_ptr_nonnull(big);
	ck_assert_int_eq(head("GET /livez?a=1&b=2 HTTP/1.1\r\nHost: t\r\nCookie: x=1; y=2\r\n\r\nbody",
	                      &h), TS__HEAD_OK);
	ck_assert_uint_eq(h.len, 58);
	ck_assert_int_eq(h.fields, 2 + 1 + 2);   /* query, Host, two cookies */
	ck_assert(h.small);
	ck_assert_int_eq(head("\r\nGET / HTTP/1.0\nX: 1\n folded\n\n", &h), TS__HEAD_OK);
	ck_assert_int_eq(head("PUT /x HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n", &h),
	                 TS__HEAD_OK);
	ck_assert_int_eq(head("GET /livez HTTP/1.1\r\nHost: t\r\n", &h), TS__HEAD_MORE);
	ck_assert_int_eq(head("GET /livez HT", &h), TS__HEAD_MORE);
	ck_assert_int_eq(head("", &h), TS__HEAD_MORE);
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		ck_assert_msg(head(refused[i].text, &h) == TS__HEAD_REFUSED, "%s", refused[i].text);
		ck_assert_str_eq(h.reason, refused[i].reason);
		ck_assert_int_eq(h.http, refused[i].http);
		ck_assert(h.message[0]);
	}
	/* a 7 KiB header goes to the bulk daemon; 48 KiB is the most; a URL past it is 414 */
	o = (size_t)sprintf(big, "GET / HTTP/1.1\r\nX: ");
	memset(big + o, 'a', 7 * 1024);
	strcpy(big + o + 7 * 1024, "\r\n\r\n");
	ck_assert_int_eq(head(big, &h), TS__HEAD_OK);
	ck_assert(!h.small);
	memset(big + o, 'a', TS_HTTP_HEAD_MAX);
	big[TS_HTTP_HEAD_MAX + 1] = '\0';
	ck_assert_int_eq(head(big, &h), TS__HEAD_REFUSED);
	ck_assert_int_eq(h.http, 431);
	memcpy(big, "GET /?", 6);
	memset(big + 6, 'a', TS_HTTP_HEAD_MAX);
	big[TS_HTTP_HEAD_MAX + 1] = '\0';
	ck_assert_int_eq(head(big, &h), TS__HEAD_REFUSED);
	ck_assert_int_eq(h.http, 414);
	ck_assert_str_eq(h.reason, "URI_TOO_LONG");
	/* 200 fields are served, 201 are not */
	o = (size_t)sprintf(big, "GET / HTTP/1.1\r\n");
	for (int i = 0; i < 200; i++)
		o += (size_t)sprintf(big + o, "X: 1\r\n");
	strcpy(big + o, "\r\n");
	ck_assert_int_eq(head(big, &h), TS__HEAD_OK);
	strcpy(big + o, "Y: 2\r\n\r\n");
	ck_assert_int_eq(head(big, &h), TS__HEAD_REFUSED);
	ck_assert_int_eq(h.http, 431);
	free(big);
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
	tcase_add_test(tc, test_head_check);
	suite_add_tcase(s, tc);
	tc = tcase_create("worker_pick");
	tcase_add_test(tc, test_fill_then_balance);
	tcase_add_test(tc, test_fill_one_spreads);
	tcase_add_test(tc, test_after_closes);
	suite_add_tcase(s, tc);
	return s;
}
