/*
 * router.h - the static route table and the matcher that maps a method and
 * a path to a route and its path parameters.
 *
 * Patterns are '/'-separated segments: a literal ("devices"), a parameter
 * ("{device}", any non-empty segment without ':'), or a parameter with a
 * custom method ("{array}:put", Google's AIP-136 style), or a literal with a
 * custom method ("memory:resetPeak"). A path that matches some pattern under
 * another method is 405 with the allowed methods; one that matches none is
 * 404. HEAD is answered by GET routes.
 *
 * Thread-safety: the table is immutable; matching is pure.
 */
#ifndef TS_ROUTER_H
#define TS_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

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
};

/* The table and its size. */
extern const struct ts_route ts_routes[];
extern const size_t ts_nroutes;

/* Pattern strings in table order (for metrics labels). */
extern const char *const ts_route_patterns[];

enum ts_match { TS_MATCH_FOUND, TS_MATCH_NO_PATH, TS_MATCH_BAD_METHOD };

struct ts_route_match {
	size_t index;                   /* into ts_routes when FOUND */
	int nparams;
	struct {
		char name[32];              /* from the pattern ("device") */
		char value[256];
	} params[TS_CALL_MAX_PARAMS];
	char allow[64];                 /* "GET, POST" when BAD_METHOD */
};

/*
 * Matches method and path (without query string) against routes[0..n).
 * Path parameters longer than 255 bytes do not match. Pure; never allocates.
 */
enum ts_match ts_route_find(const struct ts_route *routes, size_t n,
                            const char *method, const char *path,
                            struct ts_route_match *out);

#endif
