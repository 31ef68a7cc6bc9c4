/*
 * router.c - matching a request line against the route table, decoding its
 * escapes and checking its query arguments against what the route takes.
 */
#include "server/router.h"

#include <stdio.h>
#include <string.h>

#include "common/utf8.h"

/* Whether segment [s, se) calls a custom method: its last ':' is followed
 * by a letter, as verbs are ("x:put"), unlike ids such as "sim:0". */
static bool calls_custom_method(const char *s, const char *se)
{
	const char *colon = NULL;

	for (const char *q = s; q < se; q++)
		if (*q == ':')
			colon = q;
	return colon && colon + 1 < se &&
	       ((colon[1] >= 'a' && colon[1] <= 'z') || (colon[1] >= 'A' && colon[1] <= 'Z'));
}

/* Matches one pattern segment [p, pe) against one path segment [s, se). */
static bool match_segment(const char *p, const char *pe, const char *s,
                          const char *se, struct ts_route_match *m)
{
	const char *close;
	size_t vlen, nlen, keep;

	if (p == pe || *p != '{')
		return (size_t)(pe - p) == (size_t)(se - s) && memcmp(p, s, (size_t)(pe - p)) == 0;
	close = memchr(p, '}', (size_t)(pe - p));
	if (!close)
		return false;
	/* "{name}" or "{name}:verb": the verb must end the path segment */
	if (close + 1 < pe) {
		size_t vl = (size_t)(pe - (close + 1));

		if ((size_t)(se - s) <= vl || memcmp(se - vl, close + 1, vl) != 0)
			return false;
		se -= vl;
	}
	vlen = (size_t)(se - s);
	nlen = (size_t)(close - (p + 1));
	/* a parameter followed by a custom method holds no ':' itself; a bare
	 * one may ("sim:0") unless the segment calls a method the verb patterns
	 * (tried first) did not know: that is no resource (404) */
	if (close + 1 < pe ? memchr(s, ':', vlen) != NULL : calls_custom_method(s, se))
		return false;
	if (vlen == 0 || nlen >= sizeof m->params[0].name || m->nparams >= TS_CALL_MAX_PARAMS)
		return false;
	keep = vlen;
	if (keep > TS_PARAM_MAX) {
		keep = TS_PARAM_MAX;
		if (m->too_long < 0)
			m->too_long = m->nparams;
	}
	memcpy(m->params[m->nparams].name, p + 1, nlen);
	m->params[m->nparams].name[nlen] = '\0';
	memcpy(m->params[m->nparams].value, s, keep);
	m->params[m->nparams].value[keep] = '\0';
	m->params[m->nparams].len = vlen;
	m->nparams++;
	return true;
}

static bool match_pattern(const char *pattern, const char *path,
                          struct ts_route_match *m)
{
	const char *p = pattern, *s = path;

	m->nparams = 0;
	m->too_long = -1;
	for (;;) {
		const char *pe, *se;

		if (*p != '/' || *s != '/')
			return false;
		p++;
		s++;
		pe = strchr(p, '/');
		se = strchr(s, '/');
		if (!pe)
			pe = p + strlen(p);
		if (!se)
			se = s + strlen(s);
		if (!match_segment(p, pe, s, se, m))
			return false;
		p = pe;
		s = se;
		if (!*p || !*s)
			return !*p && !*s;
	}
}

static bool method_is(const char *route_method, const char *method)
{
	if (strcmp(route_method, method) == 0)
		return true;
	return strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0;
}

static bool has_custom_method(const char *pattern)
{
	return strchr(pattern, ':') != NULL;
}

enum ts_match ts_route_find(const struct ts_route *routes, size_t n,
                            const char *method, const char *path,
                            struct ts_route_match *out)
{
	struct ts_route_match tmp;
	bool path_known = false;

	out->allow[0] = '\0';
	out->nparams = 0;
	out->too_long = -1;
	/* pass 0: patterns with a custom method ("{a}:put"); pass 1: the rest */
	for (size_t k = 0; k < 2 * n && !(k == n && path_known); k++) {
		size_t i = k % n;

		if (has_custom_method(routes[i].pattern) != (k < n))
			continue;
		if (!match_pattern(routes[i].pattern, path, &tmp))
			continue;
		if (method_is(routes[i].method, method)) {
			*out = tmp;
			out->index = i;
			return TS_MATCH_FOUND;
		}
		if (strcmp(routes[i].method, "GET") == 0 && !strstr(out->allow, "HEAD") &&
		    strlen(out->allow) + 12 < sizeof out->allow) {
			if (out->allow[0])
				strcat(out->allow, ", ");
			strcat(out->allow, "GET, HEAD");
			path_known = true;
			continue;
		}
		if (!strstr(out->allow, routes[i].method) &&
		    strlen(out->allow) + strlen(routes[i].method) + 2 < sizeof out->allow) {
			if (out->allow[0])
				strcat(out->allow, ", ");
			strcat(out->allow, routes[i].method);
		}
		path_known = true;
	}
	return path_known ? TS_MATCH_BAD_METHOD : TS_MATCH_NO_PATH;
}

const struct ts_param_rule *ts_param_rule_find(const char *name)
{
	static const struct ts_param_rule generic = {"", "path parameter", TS_PARAM_MAX,
	                                             "BAD_PATH_PARAMETER"};

	for (size_t i = 0; i < ts_nparam_rules; i++)
		if (strcmp(ts_param_rules[i].name, name) == 0)
			return &ts_param_rules[i];
	return &generic;
}

/* ---- escapes ------------------------------------------------------------------------ */

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

size_t ts_url_unescape(char *s)
{
	char *r = s, *w = s;

	while (*r) {
		int hi, lo;

		if (r[0] == '%' && (hi = hex_value(r[1])) >= 0 && (lo = hex_value(r[2])) >= 0) {
			int byte = hi * 16 + lo;

			if (byte == 0) {            /* 3 bytes become 2: never longer */
				*w++ = (char)0xC0;
				*w++ = (char)0x80;
			} else {
				*w++ = (char)byte;
			}
			r += 3;
		} else {
			*w++ = *r++;
		}
	}
	*w = '\0';
	return (size_t)(w - s);
}

/* ---- query arguments ---------------------------------------------------------------- */

/* Finds key in the route's declaration: its index, and whether it is typed
 * ":bool"; -1 when the route does not take it. */
static int query_find(const char *spec, const char *key, size_t key_len, bool *is_bool)
{
	int idx = 0;

	for (const char *p = spec; p && *p; idx++) {
		const char *end = strchr(p, ','), *colon;
		size_t len;

		if (!end)
			end = p + strlen(p);
		colon = memchr(p, ':', (size_t)(end - p));
		len = (size_t)((colon ? colon : end) - p);
		if (len == key_len && memcmp(p, key, len) == 0) {
			*is_bool = colon && (size_t)(end - colon) == 5 && memcmp(colon, ":bool", 5) == 0;
			return idx;
		}
		p = *end ? end + 1 : end;
	}
	return -1;
}

/* "a, b, c" from the declaration "a,b:bool,c" (or "no query parameters"). */
static void query_known(const char *spec, char *buf, size_t cap)
{
	size_t o = 0;

	buf[0] = '\0';
	for (const char *p = spec; p && *p && o + 1 < cap;) {
		const char *end = strchr(p, ','), *colon;
		size_t len;

		if (!end)
			end = p + strlen(p);
		colon = memchr(p, ':', (size_t)(end - p));
		len = (size_t)((colon ? colon : end) - p);
		o += (size_t)snprintf(buf + o, cap - o, "%s%.*s", o ? ", " : "", (int)len, p);
		p = *end ? end + 1 : end;
	}
	if (!buf[0])
		snprintf(buf, cap, "no query parameters");
}

/* Checks that text is valid UTF-8 without NUL; what names it in messages. */
static ts_status text_check(const char *what, const char *key, size_t key_len,
                            const char *text, size_t len, struct ts_error *err)
{
	int kl = ts_utf8_prefix(key, key_len, 64);
	size_t at = 0;

	switch (ts_utf8_check(text, len, &at)) {
	case TS_UTF8_OK:
		return TS_OK;
	case TS_UTF8_NUL:
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ENCODING",
		                    "%s '%.*s' holds a NUL byte (%%00) at byte %zu", what, kl, key, at);
	default:
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ENCODING",
		                    "%s '%.*s' is not valid UTF-8 (byte 0x%02x at offset %zu)", what, kl,
		                    key, (unsigned char)text[at], at);
	}
}

ts_status ts_query_arg_check(const struct ts_route *route, const char *key, size_t key_len,
                             const char *value, size_t value_len, uint32_t *seen,
                             struct ts_error *err)
{
	char known[256];
	bool is_bool = false;
	int idx, klen = ts_utf8_prefix(key, key_len, 64);

	if (key_len == 0 && !value)
		return TS_OK;               /* "?&a=1", "a=1&&b=2" */
	if (ts_utf8_check(key, key_len, NULL) != TS_UTF8_OK)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ENCODING",
		                    "a query parameter name is not valid UTF-8 or holds a NUL byte");
	idx = query_find(route->query, key, key_len, &is_bool);
	if (idx < 0 || idx >= 32) {
		query_known(route->query, known, sizeof known);
		ts_error_set(err, TS_INVALID_ARGUMENT, "UNKNOWN_QUERY_PARAMETER",
		             "unknown query parameter '%.*s' for %s %s; it takes %s", klen, key,
		             route->method, route->pattern, known);
		ts_error_meta(err, "parameter", "%.*s", klen, key);
		ts_error_meta(err, "allowed", "%s", known);
		return TS_INVALID_ARGUMENT;
	}
	if (*seen & (1u << idx))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "DUPLICATE_QUERY_PARAMETER",
		                    "query parameter '%.*s' is given more than once", klen, key);
	*seen |= 1u << idx;
	if (!value)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_QUERY_PARAMETER",
		                    "query parameter '%.*s' has no value (write %.*s=...)", klen, key,
		                    klen, key);
	if (text_check("query parameter", key, key_len, value, value_len, err) != TS_OK)
		return TS_INVALID_ARGUMENT;
	if (is_bool && strcmp(value, "true") != 0 && strcmp(value, "false") != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_QUERY_PARAMETER",
		                    "query parameter '%.*s' is '%.64s'; it takes true or false", klen,
		                    key, value);
	return TS_OK;
}
