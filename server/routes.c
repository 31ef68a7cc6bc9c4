/*
 * routes.c - the route table: every endpoint tstaged serves, in one place.
 */
#include "server/router.h"
#include "server/server_routes.h"

#define ROUTES(X)                                                                        \
	X("GET", "/livez", ts_h_livez, NULL, TS_BODY_NONE, true)                             \
	X("GET", "/healthz", ts_h_livez, NULL, TS_BODY_NONE, true)                           \
	X("GET", "/readyz", NULL, ts_s_readyz, TS_BODY_NONE, true)                           \
	X("GET", "/metrics", NULL, ts_s_metrics, TS_BODY_NONE, true)                         \
	X("GET", "/v1/backends", ts_h_backends_list, NULL, TS_BODY_NONE, false)              \
	X("GET", "/v1/devices", ts_h_devices_list, NULL, TS_BODY_NONE, false)                \
	X("GET", "/v1/devices/{device}", ts_h_devices_get, NULL, TS_BODY_NONE, false)        \
	X("GET", "/v1/devices/{device}/memory_stats", ts_h_devices_memory_stats, NULL,       \
	  TS_BODY_NONE, false)                                                               \
	X("GET", "/v1/memory", ts_h_memory_get, NULL, TS_BODY_NONE, false)                   \
	X("POST", "/v1/memory:resetPeak", ts_h_memory_reset_peak, NULL, TS_BODY_JSON, false)

const struct ts_route ts_routes[] = {
#define ROUTE_ROW(m, p, fn, sfn, body, pub) {m, p, fn, sfn, body, pub},
	ROUTES(ROUTE_ROW)
#undef ROUTE_ROW
};

const size_t ts_nroutes = sizeof ts_routes / sizeof ts_routes[0];

const char *const ts_route_patterns[] = {
#define ROUTE_PATTERN(m, p, fn, sfn, body, pub) m " " p,
	ROUTES(ROUTE_PATTERN)
#undef ROUTE_PATTERN
};
