/*
 * head.c - the acceptor's check of a connection's first request head, before
 * libmicrohttpd reads a byte of it: whether the head has all come, whether
 * it fits the limits every connection holds (TS_HTTP_HEAD_MAX bytes,
 * TS_HTTP_HEAD_FIELDS_MAX fields), whether a small-request connection holds
 * it, and what is wrong with it where libmicrohttpd would answer on its own
 * (in HTML): a head too long, a request line without a version, a header
 * line without a colon, a version other than HTTP/1.x, a Content-Length that
 * is not a number, a Transfer-Encoding other than chunked.
 *
 * Only what the library refuses is refused here; what it serves (bare LF
 * line ends, empty lines before the request line, folded lines) is left to
 * it. Pure: reads b[0..n) and nothing past it.
 */
#include "server/server_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server/http_tuning.h"

/* The line at b[at..n): its length without the line end in *len and the
 * offset after its '\n'; 0 when no '\n' has come. */
static size_t line_end(const char *b, size_t n, size_t at, size_t *len)
{
	const char *nl = memchr(b + at, '\n', n - at);
	size_t l;

	if (!nl)
		return 0;
	l = (size_t)(nl - (b + at));
	*len = l > 0 && b[at + l - 1] == '\r' ? l - 1 : l;
	return (size_t)(nl - b) + 1;
}

static int refuse(struct ts__head *h, int http, const char *reason, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Records why the head is refused; returns TS__HEAD_REFUSED. */
static int refuse(struct ts__head *h, int http, const char *reason, const char *fmt, ...)
{
	va_list ap;

	h->http = http;
	h->reason = reason;
	va_start(ap, fmt);
	vsnprintf(h->message, sizeof h->message, fmt, ap);
	va_end(ap);
	return TS__HEAD_REFUSED;
}

/* Query parameters in the request target t (len bytes): the '&'-separated
 * pieces after its '?'. */
static int query_fields(const char *t, size_t len)
{
	const char *q = memchr(t, '?', len);
	int k = 0;

	if (!q)
		return 0;
	for (const char *p = q + 1; p < t + len; p++)
		k += *p == '&';
	return k + 1;
}

/* The request line b[0..len): METHOD SP target SP HTTP/1.x; the fields its
 * target's query adds go to h->fields. */
static int request_line(const char *b, size_t len, struct ts__head *h)
{
	const char *sp1 = memchr(b, ' ', len), *sp2;

	if (!sp1 || sp1 == b)
		return refuse(h, 400, "MALFORMED_REQUEST",
		              "the request line is not 'METHOD target HTTP/1.1' (%zu bytes)", len);
	sp2 = memrchr(sp1 + 1, ' ', len - (size_t)(sp1 + 1 - b));
	if (!sp2 || sp2 == sp1)
		return refuse(h, 400, "MALFORMED_REQUEST",
		              "the request line has no HTTP version (%zu bytes)", len);
	if ((size_t)(b + len - (sp2 + 1)) < 8 || memcmp(sp2 + 1, "HTTP/1.", 7) != 0 ||
	    strspn(sp2 + 8, "0123456789") != (size_t)(b + len - (sp2 + 8)))
		return refuse(h, 505, "HTTP_VERSION_NOT_SUPPORTED",
		              "only HTTP/1.0 and HTTP/1.1 are served (the request line is %zu bytes)",
		              len);
	h->fields += query_fields(sp1 + 1, (size_t)(sp2 - (sp1 + 1)));
	return TS__HEAD_OK;
}

static bool named(const char *line, size_t name_len, const char *name)
{
	return strlen(name) == name_len && strncasecmp(line, name, name_len) == 0;
}

/* One header line b[0..len) (folded lines are the library's): its name, and
 * the values the library reads itself. */
static int header_line(const char *b, size_t len, size_t nr, struct ts__head *h)
{
	const char *colon = memchr(b, ':', len), *v;
	size_t name_len, vlen;

	if (b[0] == ' ' || b[0] == '\t')
		return TS__HEAD_OK;              /* a folded line: part of the last field */
	if (!colon)
		return refuse(h, 400, "MALFORMED_HEADER",
		              "header line %zu has no ':' between a name and a value (%zu bytes)", nr, len);
	h->fields++;
	name_len = (size_t)(colon - b);
	v = colon + 1;
	vlen = len - name_len - 1;
	while (vlen && (*v == ' ' || *v == '\t'))
		v++, vlen--;
	while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
		vlen--;
	if (named(b, name_len, "Cookie")) {
		for (size_t i = 0; i < vlen; i++)
			h->fields += v[i] == ';';
	} else if (named(b, name_len, "Content-Length")) {
		unsigned long long x = 0;

		if (vlen == 0 || strspn(v, "0123456789") < vlen)
			return refuse(h, 400, "BAD_CONTENT_LENGTH",
			              "Content-Length (header line %zu) is not a decimal number of bytes",
			              nr);
		for (size_t i = 0; i < vlen; i++) {
			if (x > (~0ull - 9) / 10)
				return refuse(h, 400, "BAD_CONTENT_LENGTH",
				              "Content-Length (header line %zu) is past 2^64 bytes", nr);
			x = x * 10 + (unsigned)(v[i] - '0');
		}
	} else if (named(b, name_len, "Transfer-Encoding")) {
		if (vlen != 7 || strncasecmp(v, "chunked", 7) != 0)
			return refuse(h, 501, "UNSUPPORTED_TRANSFER_ENCODING",
			              "Transfer-Encoding (header line %zu) may only be 'chunked'", nr);
	}
	return TS__HEAD_OK;
}

/* Refuses a head past the limits, in bytes so far or in fields. */
static int over_limits(struct ts__head *h, size_t bytes, bool line_done)
{
	if (!line_done && bytes > TS_HTTP_HEAD_MAX)
		return refuse(h, 414, "URI_TOO_LONG",
		              "the request line is longer than %zu bytes, the most a request head may "
		              "hold; send long row lists in a body (POST /v1/arrays/{name}:rows)",
		              (size_t)TS_HTTP_HEAD_MAX);
	if (bytes > TS_HTTP_HEAD_MAX)
		return refuse(h, 431, "REQUEST_HEAD_TOO_LARGE",
		              "the request head (request line and headers) is longer than %zu bytes",
		              (size_t)TS_HTTP_HEAD_MAX);
	if (h->fields > TS_HTTP_HEAD_FIELDS_MAX)
		return refuse(h, 431, "REQUEST_HEAD_TOO_LARGE",
		              "the request head holds more than %zu fields (headers, query parameters "
		              "and cookies; %zu so far)", (size_t)TS_HTTP_HEAD_FIELDS_MAX,
		              (size_t)h->fields);
	return TS__HEAD_OK;
}

int ts__head_check(const char *b, size_t n, struct ts__head *h)
{
	size_t at = 0, next, len, nr = 0;
	int r;

	memset(h, 0, sizeof *h);
	/* empty lines before the request line are skipped, as the library does */
	while ((next = line_end(b, n, at, &len)) && len == 0)
		at = next;
	if (!next)
		return over_limits(h, n, false) == TS__HEAD_REFUSED ? TS__HEAD_REFUSED : TS__HEAD_MORE;
	if ((r = request_line(b + at, len, h)) != TS__HEAD_OK ||
	    (r = over_limits(h, next, true)) != TS__HEAD_OK)
		return r;
	for (at = next; (next = line_end(b, n, at, &len)); at = next) {
		if (len == 0) {
			h->len = next;
			h->small = h->len + (size_t)h->fields * TS_HTTP_FIELD_COST <= TS_HTTP_SMALL_HEAD;
			return TS__HEAD_OK;
		}
		if ((r = header_line(b + at, len, ++nr, h)) != TS__HEAD_OK ||
		    (r = over_limits(h, next, true)) != TS__HEAD_OK)
			return r;
	}
	return over_limits(h, n, true) == TS__HEAD_REFUSED ? TS__HEAD_REFUSED : TS__HEAD_MORE;
}
