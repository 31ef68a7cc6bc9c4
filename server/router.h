/*
 * router.h - the static route table and the matcher that maps a method and
 * a path to a route and its path parameters.
 *
 * Patterns are '/'-separated segments: a literal ("devices"), a parameter
 * ("{device}", any non-empty segment that calls no custom method), or a
 * parameter with a custom method ("{array}:put", Google's AIP-136 style), or
 * a literal with a custom method ("memory:resetPeak"). A segment calls a
 * custom method when its last ':' is followed by a letter ("m:forward");
 * "sim:0" calls none and is a plain value. A path that matches some pattern
 * under another method is 405 with the allowed methods; one that matches
 * none, an unknown custom method included, is 404. HEAD is answered by GET
 * routes.
 *
 * Each route also declares the query parameters it reads; the server refuses
 * any other before the handler runs (ts_query_arg_check), so that a typo
 * such as "memory_knd=" is an error, not a silent default.
 *
 * Thread-safety: the table is immutable; matching and checking are pure.
 */
#ifndef TS_ROUTER_H
#define TS_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "handlers/handlers.h"

struct ts_server;

/* Routes answered by the server itself (they need server state). */
typedef void ts_server_handler_fn(struct ts_server *srv, const struct ts_call *call,
                                  struct ts_reply *reply);

enum ts_body_mode {
	TS_BODY_NONE = 0,   /* a body, if any, is read and ignored */
	TS_BODY_JSON,       /* buffered whole (at most TS_JSON_BODY_MAX bytes) */
	TS_BODY_STREAM,     /* handed piece by piece to the route's upload ops */
};

#define TS_JSON_BODY_MAX (1u << 20)

struct ts_route {
	const char *method;
	const char *pattern;
	ts_handler_fn *fn;              /* one of fn, sfn */
	ts_server_handler_fn *sfn;
	const struct ts_upload_ops *upload;   /* TS_BODY_STREAM routes */
	enum ts_body_mode body;
	bool public_route;              /* no token needed (health, metrics) */
	/* the query parameters the handler reads, comma-separated, each
	 * optionally typed ("device,wait:bool"); "" for none. ":bool" values
	 * must be true or false. At most 32. */
	const char *query;
};

/* The table and its size. */
extern const struct ts_route ts_routes[];
extern const size_t ts_nroutes;

/* Pattern strings in table order (for metrics labels). */
extern const char *const ts_route_patterns[];

enum ts_match { TS_MATCH_FOUND, TS_MATCH_NO_PATH, TS_MATCH_BAD_METHOD };

/* Path parameters longer than this match, but are refused (400). */
#define TS_PARAM_MAX 255

struct ts_route_match {
	size_t index;                   /* into ts_routes when FOUND */
	int nparams;
	int too_long;                   /* a parameter over TS_PARAM_MAX (its first
	                                 * TS_PARAM_MAX bytes kept), or -1 */
	struct {
		char name[32];              /* from the pattern ("device") */
		char value[TS_PARAM_MAX + 1];
		size_t len;                 /* the whole value's, even when cut */
	} params[TS_CALL_MAX_PARAMS];
	char allow[64];                 /* "GET, POST" when BAD_METHOD */
};

/*
 * A route table prepared for matching: each pattern split into its
 * segments once, so that a request's path, split once too, is compared
 * segment by segment and only with patterns of as many segments. Made
 * when the server starts; NULL when out of memory. Immutable after.
 */
struct ts_router;

struct ts_router *ts_router_new(const struct ts_route *routes, size_t n);
void ts_router_free(struct ts_router *rt);

/*
 * Matches method and path (without query string) against the table. A
 * path parameter longer than TS_PARAM_MAX bytes still matches, with
 * out->too_long set. Pure; never allocates.
 */
enum ts_match ts_router_find(const struct ts_router *rt, const char *method, const char *path,
                             struct ts_route_match *out);

/* The same for a table used once (tests): prepares it, matches, frees;
 * NO_PATH when out of memory. */
enum ts_match ts_route_find(const struct ts_route *routes, size_t n,
                            const char *method, const char *path,
                            struct ts_route_match *out);

/* What a path parameter of a given name may hold: at most max bytes, or
 * it is refused with reason before any handler runs (routes.c). */
struct ts_param_rule {
	const char *name;               /* as in the patterns: "array" */
	const char *what;               /* for messages: "array name" */
	size_t max;
	const char *reason;             /* ErrorInfo reason: "BAD_ARRAY_NAME" */
};

extern const struct ts_param_rule ts_param_rules[];
extern const size_t ts_nparam_rules;

/* The rule for a parameter name: its entry in ts_param_rules, or a generic
 * one (TS_PARAM_MAX bytes, BAD_PATH_PARAMETER). Never NULL. */
const struct ts_param_rule *ts_param_rule_find(const char *name);

/*
 * Decodes %HH escapes of the NUL-terminated s in place and returns the new
 * length (libmicrohttpd's unescape callback contract: never longer). A
 * decoded NUL is written as C0 80, which ts_utf8_check reports as a NUL, so
 * that "a%00b" cannot pass for "a" once the text is a C string. Anything
 * else ('%' without two hex digits) is kept as it is.
 */
size_t ts_url_unescape(char *s);

/*
 * Checks one query argument of a request for route: key (key_len bytes)
 * must be one the route declares and not seen before (*seen, zero before
 * the first argument, records which were), and both key and value
 * (value_len bytes; value NULL when the argument has no '=') must be valid
 * UTF-8 without NUL. An empty key without a value ("?&a=1") is skipped.
 * Returns TS_OK or TS_INVALID_ARGUMENT with err naming the argument and,
 * for an unknown one, the ones the route takes. Pure.
 */
ts_status ts_query_arg_check(const struct ts_route *route, const char *key, size_t key_len,
                             const char *value, size_t value_len, uint32_t *seen,
                             struct ts_error *err);

#endif
