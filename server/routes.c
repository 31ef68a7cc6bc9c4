/*
 * routes.c - the route table: every endpoint tstaged serves, in one place.
 */
#include "server/router.h"

#include "server/server_routes.h"
#include "storage/array.h"
#include "train/model.h"

/* X(method, pattern, handler, server handler, upload ops, body, public,
 *   query parameters the handler reads). Every call that makes or moves
 * bytes takes ?wait= (DESIGN: 202 with an operation, or the finished result
 * when asked to wait); one that always finishes before it answers (:gather,
 * model creation today) satisfies wait=true as it is. */
#define PLACE "sharding,device,memory_kind"
#define ROUTES(X)                                                                          \
	X("GET", "/livez", ts_h_livez, NULL, NULL, TS_BODY_NONE, true, "")                     \
	X("GET", "/healthz", ts_h_livez, NULL, NULL, TS_BODY_NONE, true, "")                   \
	X("GET", "/readyz", NULL, ts_s_readyz, NULL, TS_BODY_NONE, true, "")                   \
	X("GET", "/metrics", NULL, ts_s_metrics, NULL, TS_BODY_NONE, true, "")                 \
	X("GET", "/openapi.yaml", NULL, ts_s_openapi, NULL, TS_BODY_NONE, false, "")           \
	X("GET", "/dashboard", NULL, ts_s_dashboard, NULL, TS_BODY_NONE, false, "")            \
	X("GET", "/v1/backends", ts_h_backends_list, NULL, NULL, TS_BODY_NONE, false, "")      \
	X("GET", "/v1/devices", ts_h_devices_list, NULL, NULL, TS_BODY_NONE, false, "")        \
	X("GET", "/v1/devices/{device}", ts_h_devices_get, NULL, NULL, TS_BODY_NONE, false, "") \
	X("GET", "/v1/devices/{device}/memory_stats", ts_h_devices_memory_stats, NULL, NULL,   \
	  TS_BODY_NONE, false, "memory_kind")                                                  \
	X("GET", "/v1/topology", ts_h_topology_get, NULL, NULL, TS_BODY_NONE, false, "host")  \
	X("GET", "/v1/fleet", NULL, ts_s_fleet, NULL, TS_BODY_NONE, false, "scope")           \
	X("POST", "/v1/fleet:ticket", NULL, ts_s_fleet_ticket, NULL, TS_BODY_NONE, false, "")  \
	X("POST", "/v1/fleet:receive", NULL, ts_s_fleet_receive, NULL, TS_BODY_JSON, false,    \
	  "wait:bool")                                                                         \
	X("POST", "/v1/fleet/receives/{receive}:commit", NULL, ts_s_fleet_receive_commit, NULL, \
	  TS_BODY_NONE, false, "wait:bool")                                                    \
	X("POST", "/v1/fleet/receives/{receive}:abort", NULL, ts_s_fleet_receive_abort, NULL,  \
	  TS_BODY_NONE, false, "")                                                             \
	X("GET", "/v1/fleet/receives/{receive}", NULL, ts_s_fleet_receive_get, NULL,           \
	  TS_BODY_NONE, false, "wait_ms")                                                      \
	X("GET", "/v1/memory", ts_h_memory_get, NULL, NULL, TS_BODY_NONE, false, "host")       \
	X("GET", "/v1/memory/history", NULL, ts_s_history, NULL, TS_BODY_NONE, false,          \
	  "since,step,host")                                                                   \
	X("GET", "/v1/trace", NULL, ts_s_trace, NULL, TS_BODY_NONE, false, "seconds")         \
	X("POST", "/v1/memory:resetPeak", ts_h_memory_reset_peak, NULL, NULL, TS_BODY_JSON,    \
	  false, "")                                                                           \
	X("GET", "/v1/arrays", ts_h_arrays_list, NULL, NULL, TS_BODY_NONE, false,              \
	  "device,memory_kind,page_size,page_token,host")                                      \
	X("POST", "/v1/arrays:import", NULL, NULL, &ts_h_arrays_import, TS_BODY_STREAM, false, \
	  PLACE ",prefix,overwrite:bool,persist:bool,wait:bool")                               \
	X("GET", "/v1/arrays:export", ts_h_arrays_export, NULL, NULL, TS_BODY_NONE, false,     \
	  "names")                                                                             \
	X("PUT", "/v1/arrays/{array}", NULL, NULL, &ts_h_arrays_put, TS_BODY_STREAM, false,    \
	  "dtype,shape,persist:bool," PLACE)                                                   \
	X("GET", "/v1/arrays/{array}", ts_h_arrays_get, NULL, NULL, TS_BODY_NONE, false, "")   \
	X("DELETE", "/v1/arrays/{array}", ts_h_arrays_delete, NULL, NULL, TS_BODY_NONE, false, \
	  "")                                                                                  \
	X("GET", "/v1/arrays/{array}/data", ts_h_arrays_data, NULL, NULL, TS_BODY_NONE, false, \
	  "format,index,rows")                                                                    \
	X("POST", "/v1/arrays/{array}:rows", ts_h_arrays_rows, NULL, NULL, TS_BODY_JSON,       \
	  false, "format")                                                                     \
	X("POST", "/v1/arrays/{array}:gather", ts_h_arrays_gather, NULL, NULL, TS_BODY_JSON,   \
	  false, "wait:bool")                                                                  \
	X("POST", "/v1/arrays/{array}:put", ts_h_arrays_put_sharding, NULL, NULL,              \
	  TS_BODY_JSON, false, "wait:bool")                                                    \
	X("POST", "/v1/arrays/{array}:copy", ts_h_arrays_copy, NULL, NULL, TS_BODY_JSON, false,\
	  "wait:bool")                                                                         \
	X("POST", "/v1/arrays/{array}:persist", ts_h_arrays_persist, NULL, NULL, TS_BODY_NONE, \
	  false, "")                                                                           \
	X("POST", "/v1/arrays/{array}:unpersist", ts_h_arrays_unpersist, NULL, NULL,           \
	  TS_BODY_NONE, false, "")                                                             \
	X("GET", "/v1/arrays/{array}/sharding", ts_h_arrays_sharding, NULL, NULL, TS_BODY_NONE,\
	  false, "format")                                                                     \
	X("POST", "/v1/operations/{operation}:wait", ts_h_operations_wait, NULL, NULL,         \
	  TS_BODY_JSON, false, "timeout")                                                      \
	X("GET", "/v1/operations", ts_h_operations_list, NULL, NULL, TS_BODY_NONE, false,      \
	  "state,page_size,page_token,host")                                                   \
	X("GET", "/v1/operations/{operation}", ts_h_operations_get, NULL, NULL, TS_BODY_NONE,  \
	  false, "")                                                                           \
	X("POST", "/v1/operations/{operation}:cancel", ts_h_operations_cancel, NULL, NULL,     \
	  TS_BODY_NONE, false, "")                                                             \
	X("DELETE", "/v1/operations/{operation}", ts_h_operations_delete, NULL, NULL,          \
	  TS_BODY_NONE, false, "")                                                             \
	X("POST", "/v1/shardings", ts_h_shardings_create, NULL, NULL, TS_BODY_JSON, false, "") \
	X("GET", "/v1/shardings", ts_h_shardings_list, NULL, NULL, TS_BODY_NONE, false, "")    \
	X("GET", "/v1/shardings/{sharding}", ts_h_shardings_get, NULL, NULL, TS_BODY_NONE,     \
	  false, "")                                                                           \
	X("POST", "/v1/shardings/{sharding}:withMemoryKind", ts_h_shardings_with_memory_kind,  \
	  NULL, NULL, TS_BODY_JSON, false, "")                                                 \
	X("POST", "/v1/models", ts_h_models_create, NULL, NULL, TS_BODY_JSON, false,          \
	  "wait:bool")                                                                         \
	X("GET", "/v1/models", ts_h_models_list, NULL, NULL, TS_BODY_NONE, false, "host")      \
	X("POST", "/v1/models:import", NULL, NULL, &ts_h_models_import, TS_BODY_STREAM, false, \
	  "name,device,persist:bool")                                                          \
	X("POST", "/v1/models:analyze", ts_h_models_analyze_spec, NULL, NULL, TS_BODY_JSON,    \
	  false, "timeline:bool")                                                              \
	X("GET", "/v1/models/{model}", ts_h_models_get, NULL, NULL, TS_BODY_NONE, false, "")   \
	X("GET", "/v1/models/{model}:export", ts_h_models_export, NULL, NULL, TS_BODY_NONE,    \
	  false, "")                                                                           \
	X("DELETE", "/v1/models/{model}", ts_h_models_delete, NULL, NULL, TS_BODY_NONE, false, \
	  "")                                                                                  \
	X("POST", "/v1/models/{model}:analyze", ts_h_models_analyze, NULL, NULL, TS_BODY_JSON, \
	  false, "timeline:bool")                                                              \
	X("POST", "/v1/models/{model}:step", ts_h_models_step, NULL, NULL, TS_BODY_JSON, false,\
	  "wait:bool")                                                                         \
	X("POST", "/v1/models/{model}:evaluate", ts_h_models_evaluate, NULL, NULL,             \
	  TS_BODY_JSON, false, "wait:bool")                                                    \
	X("POST", "/v1/models/{model}:generate", ts_h_models_generate, NULL, NULL,             \
	  TS_BODY_JSON, false, "wait:bool")                                                    \
	X("POST", "/v1/models/{model}:persist", ts_h_models_persist, NULL, NULL, TS_BODY_NONE, \
	  false, "")                                                                           \
	X("POST", "/v1/models/{model}:unpersist", ts_h_models_unpersist, NULL, NULL,           \
	  TS_BODY_NONE, false, "")                                                             \
	X("GET", "/v1/state", ts_h_state_get, NULL, NULL, TS_BODY_NONE, false, "")             \
	X("POST", "/v1/state:save", ts_h_state_save, NULL, NULL, TS_BODY_NONE, false,         \
	  "wait:bool")

/* The test-only control of injected failures exists in fault builds only. */
#ifdef TS_FAULT_BUILD
#define FAULT_ROUTES(X)                                                                    \
	X("GET", "/debug/faults", ts_h_debug_faults_get, NULL, NULL, TS_BODY_NONE, false, "")  \
	X("POST", "/debug/faults", ts_h_debug_faults_arm, NULL, NULL, TS_BODY_JSON, false, "")
#else
#define FAULT_ROUTES(X)
#endif

const struct ts_route ts_routes[] = {
#define ROUTE_ROW(m, p, fn, sfn, up, body, pub, q) {m, p, fn, sfn, up, body, pub, q},
	ROUTES(ROUTE_ROW)
	FAULT_ROUTES(ROUTE_ROW)
#undef ROUTE_ROW
};

const size_t ts_nroutes = sizeof ts_routes / sizeof ts_routes[0];

const char *const ts_route_patterns[] = {
#define ROUTE_PATTERN(m, p, fn, sfn, up, body, pub, q) m " " p,
	ROUTES(ROUTE_PATTERN)
	FAULT_ROUTES(ROUTE_PATTERN)
#undef ROUTE_PATTERN
};

/* Lengths checked before any handler runs, so that a name too long for
 * its kind is a bad name (400), never "not found"; the handlers check the
 * rest of each name's form. */
const struct ts_param_rule ts_param_rules[] = {
	{"array", "array name", TS_ARRAY_NAME_MAX, "BAD_ARRAY_NAME"},
	{"sharding", "sharding name", TS_ARRAY_NAME_MAX, "BAD_SHARDING_NAME"},
	{"model", "model name", TS_MODEL_NAME_MAX, "BAD_MODEL_NAME"},
	{"operation", "operation id", TS_PARAM_MAX, "BAD_OPERATION_ID"},
	{"device", "device id", TS_PARAM_MAX, "BAD_DEVICE_ID"},
};

const size_t ts_nparam_rules = sizeof ts_param_rules / sizeof ts_param_rules[0];
