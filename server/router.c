/*
 * router.c - matching a request line against the route table.
 */
#include "server/router.h"

#include <string.h>

/* Matches one pattern segment [p, pe) against one path segment [s, se). */
static bool match_segment(const char *p, const char *pe, const char *s,
                          const char *se, struct ts_route_match *m)
{
	const char *close, *colon;
	size_t vlen, nlen;

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
	 * one may ("sim:0"), since verb patterns are tried first */
	colon = close + 1 < pe ? memchr(s, ':', vlen) : NULL;
	if (vlen == 0 || colon || vlen >= sizeof m->params[0].value ||
	    nlen >= sizeof m->params[0].name || m->nparams >= TS_CALL_MAX_PARAMS)
		return false;
	memcpy(m->params[m->nparams].name, p + 1, nlen);
	m->params[m->nparams].name[nlen] = '\0';
	memcpy(m->params[m->nparams].value, s, vlen);
	m->params[m->nparams].value[vlen] = '\0';
	m->nparams++;
	return true;
}

static bool match_pattern(const char *pattern, const char *path,
                          struct ts_route_match *m)
{
	const char *p = pattern, *s = path;

	m->nparams = 0;
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
