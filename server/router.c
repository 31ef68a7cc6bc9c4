/*
 * router.c - matching a request line against the route table, decoding its
 * escapes and checking its query arguments against what the route takes.
 */
#include "server/router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hex.h"
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

/* A path split at its '/'s once per request, so that each pattern is
 * compared segment by segment without scanning the path again. */
#define MAX_SEGMENTS 16

struct segments {
	int n;
	const char *s[MAX_SEGMENTS];
	size_t len[MAX_SEGMENTS];
};

/* Splits path ("/a/b"); false when it does not start with '/' or has more
 * segments than any pattern could (then nothing matches). */
static bool split_path(const char *path, struct segments *out)
{
	const char *s = path + 1;

	out->n = 0;
	if (*path != '/')
		return false;
	for (;;) {
		const char *e = s;

		while (*e && *e != '/')
			e++;
		if (out->n == MAX_SEGMENTS)
			return false;
		out->s[out->n] = s;
		out->len[out->n] = (size_t)(e - s);
		out->n++;
		if (!*e)
			return true;
		s = e + 1;
	}
}

/* A pattern split into its segments once, when the router is made. */
struct prepared {
	int nsegs;                      /* 0: a pattern no path can match */
	bool custom;                    /* calls a custom method ("{a}:put") */
	const char *seg[MAX_SEGMENTS], *seg_end[MAX_SEGMENTS];
};

/* The patterns prepared in table order, and their indices grouped by
 * segment count (only those can match a path of that many segments), each
 * group in table order: by_count[first[k] .. first[k + 1]) have k. */
struct ts_router {
	const struct ts_route *routes;
	size_t n;
	size_t first[MAX_SEGMENTS + 2];
	size_t *by_count;
	struct prepared r[];
};

static void prepare(const char *pattern, struct prepared *out)
{
	const char *p = pattern;

	out->nsegs = 0;
	out->custom = strchr(pattern, ':') != NULL;
	while (*p == '/') {
		const char *pe = ++p;

		while (*pe && *pe != '/')
			pe++;
		if (out->nsegs == MAX_SEGMENTS || pe == p) {
			out->nsegs = 0;
			return;
		}
		out->seg[out->nsegs] = p;
		out->seg_end[out->nsegs] = pe;
		out->nsegs++;
		p = pe;
	}
	if (*p)
		out->nsegs = 0;
}

struct ts_router *ts_router_new(const struct ts_route *routes, size_t n)
{
	struct ts_router *rt = malloc(sizeof *rt + n * sizeof rt->r[0]);
	size_t at = 0;

	if (!rt)
		return NULL;
	rt->routes = routes;
	rt->n = n;
	rt->by_count = malloc((n ? n : 1) * sizeof *rt->by_count);
	if (!rt->by_count) {
		free(rt);
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		prepare(routes[i].pattern, &rt->r[i]);
	for (int k = 0; k <= MAX_SEGMENTS; k++) {
		rt->first[k] = at;
		for (size_t i = 0; i < n; i++)
			if (rt->r[i].nsegs == k)
				rt->by_count[at++] = i;
	}
	rt->first[MAX_SEGMENTS + 1] = at;
	return rt;
}

void ts_router_free(struct ts_router *rt)
{
	if (rt)
		free(rt->by_count);
	free(rt);
}

static bool match_prepared(const struct prepared *pr, const struct segments *path,
                           struct ts_route_match *m)
{
	m->nparams = 0;
	m->too_long = -1;
	if (pr->nsegs != path->n)
		return false;
	for (int k = 0; k < pr->nsegs; k++)
		if (!match_segment(pr->seg[k], pr->seg_end[k], path->s[k], path->s[k] + path->len[k],
		                   m))
			return false;
	return true;
}

static bool method_is(const char *route_method, const char *method)
{
	if (strcmp(route_method, method) == 0)
		return true;
	return strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0;
}

/* Adds a route's method to an Allow list ("GET, HEAD" for GET). */
static void allow_add(char *allow, size_t cap, const char *method)
{
	const char *add = strcmp(method, "GET") == 0 ? "GET, HEAD" : method;

	if (strstr(allow, add) || strlen(allow) + strlen(add) + 3 > cap)
		return;
	if (allow[0])
		strcat(allow, ", ");
	strcat(allow, add);
}

/*
 * One pass over the table. Patterns with a custom method ("{a}:put") take
 * precedence: the first one that matches path and method wins, and one that
 * matches the path alone decides 405 with its methods. Otherwise the first
 * plain pattern that matches both wins, or 405 lists the plain patterns'
 * methods for the path.
 */
enum ts_match ts_router_find(const struct ts_router *rt, const char *method, const char *path,
                             struct ts_route_match *out)
{
	struct segments segs;
	struct ts_route_match tmp;
	char allow_plain[sizeof out->allow] = "";
	bool custom_known = false, plain_known = false;
	size_t plain_found = rt->n;

	out->allow[0] = '\0';
	out->nparams = 0;
	out->too_long = -1;
	if (!split_path(path, &segs))
		return TS_MATCH_NO_PATH;
	for (size_t g = rt->first[segs.n]; g < rt->first[segs.n + 1]; g++) {
		size_t i = rt->by_count[g];
		const struct ts_route *route = &rt->routes[i];

		if (!match_prepared(&rt->r[i], &segs, &tmp))
			continue;
		if (method_is(route->method, method)) {
			if (rt->r[i].custom) {
				*out = tmp;
				out->index = i;
				return TS_MATCH_FOUND;
			}
			if (plain_found == rt->n)
				plain_found = i;
		} else if (rt->r[i].custom) {
			custom_known = true;
			allow_add(out->allow, sizeof out->allow, route->method);
		} else {
			plain_known = true;
			allow_add(allow_plain, sizeof allow_plain, route->method);
		}
	}
	if (custom_known)
		return TS_MATCH_BAD_METHOD;
	if (plain_found < rt->n) {
		match_prepared(&rt->r[plain_found], &segs, out);
		out->index = plain_found;
		return TS_MATCH_FOUND;
	}
	if (plain_known) {
		memcpy(out->allow, allow_plain, sizeof allow_plain);
		return TS_MATCH_BAD_METHOD;
	}
	return TS_MATCH_NO_PATH;
}

enum ts_match ts_route_find(const struct ts_route *routes, size_t n,
                            const char *method, const char *path,
                            struct ts_route_match *out)
{
	struct ts_router *rt = ts_router_new(routes, n);
	enum ts_match m;

	if (!rt) {
		out->allow[0] = '\0';
		out->nparams = 0;
		out->too_long = -1;
		return TS_MATCH_NO_PATH;
	}
	m = ts_router_find(rt, method, path, out);
	ts_router_free(rt);
	return m;
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

size_t ts_url_unescape(char *s)
{
	char *r = s, *w = s;

	while (*r) {
		int hi, lo;

		if (r[0] == '%' && (hi = ts_hex_value(r[1])) >= 0 && (lo = ts_hex_value(r[2])) >= 0) {
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
