/*
 * fuzz_query.c - libFuzzer target: a query string as a client sends it,
 * split and unescaped as libmicrohttpd does with the server's unescaper,
 * checked argument by argument against a route of the real table. Every
 * argument is accepted or refused; a refusal has a non-empty message that
 * is valid UTF-8 and renders as a google.rpc.Status; an accepted one is a
 * key the route declares, with NUL-free UTF-8 text; decoding never grows
 * the text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "server/router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(const struct ts_error *err)
{
	json_t *j;
	char *text;

	if (err->status != TS_INVALID_ARGUMENT || !err->message[0] ||
	    ts_utf8_check(err->message, strlen(err->message), NULL) != TS_UTF8_OK)
		abort();
	j = ts_error_to_json(err, 0);
	text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (!text)
		abort();
	free(text);
	json_decref(j);
}

/* One "key[=value]" piece, NUL-terminated in place. */
static void check_arg(const struct ts_route *route, char *arg, uint32_t *seen)
{
	char *eq = strchr(arg, '=');
	size_t klen, vlen = 0, before;
	struct ts_error err;
	uint32_t was = *seen;

	if (eq)
		*eq++ = '\0';
	for (char *p = arg; *p; p++)          /* libmicrohttpd's '+' to ' ' */
		if (*p == '+')
			*p = ' ';
	before = strlen(arg);
	klen = ts_url_unescape(arg);
	if (klen > before)
		abort();
	if (eq) {
		for (char *p = eq; *p; p++)
			if (*p == '+')
				*p = ' ';
		before = strlen(eq);
		vlen = ts_url_unescape(eq);
		if (vlen > before)
			abort();
	}
	ts_error_clear(&err);
	if (ts_query_arg_check(route, arg, klen, eq, vlen, seen, &err) != TS_OK) {
		check_error(&err);
		return;
	}
	if (klen == 0 && !eq)
		return;                           /* skipped */
	if (!eq || *seen == was || ts_utf8_check(arg, klen, NULL) != TS_UTF8_OK ||
	    ts_utf8_check(eq, vlen, NULL) != TS_UTF8_OK || !route->query ||
	    !strstr(route->query, arg))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct ts_route *route;
	uint32_t seen = 0;
	char *q, *arg, *next;

	if (size < 1)
		return 0;
	route = &ts_routes[data[0] % ts_nroutes];
	q = malloc(size);
	if (!q)
		return 0;
	memcpy(q, data + 1, size - 1);
	q[size - 1] = '\0';
	for (arg = q; arg; arg = next) {
		next = strchr(arg, '&');
		if (next)
			*next++ = '\0';
		check_arg(route, arg, &seen);
	}
	free(q);
	return 0;
}
