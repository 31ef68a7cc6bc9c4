/*
 * handlers.h - every route's handler, one file per resource.
 *
 * A handler reads a ts_call and fills a ts_reply (see api.h). Each is safe to
 * run on any server thread at the same time as any other.
 */
#ifndef TS_HANDLERS_H
#define TS_HANDLERS_H

#include "handlers/api.h"

struct ts_space;

typedef void ts_handler_fn(const struct ts_call *call, struct ts_reply *reply);

/* health.c */
ts_handler_fn ts_h_livez;

/* backends.c */
ts_handler_fn ts_h_backends_list;

/* devices.c */
ts_handler_fn ts_h_devices_list;
/* GET /v1/devices' body: {"devices": [...], "default_device", "default_backend"}
 * (new reference; NULL when out of memory). */
json_t *ts_h_devices_json(const struct ts_core *core);
ts_handler_fn ts_h_devices_get;
ts_handler_fn ts_h_devices_memory_stats;
/* topology.c: GET /v1/topology and its body {"source", "discovery_ms",
 * "numa_nodes": [...], "devices": [...]} (also the start log's topology line) */
ts_handler_fn ts_h_topology_get;
json_t *ts_h_topology_json(const struct ts_core *core);
/* {"numa_node", "local_cpus"} of a device's placement: null where unknown */
json_t *ts_h_device_place_json(const struct ts_topology_device *d);

/* arrays.c */
ts_handler_fn ts_h_arrays_list;
ts_handler_fn ts_h_arrays_get;
ts_handler_fn ts_h_arrays_delete;
ts_handler_fn ts_h_arrays_gather;
ts_handler_fn ts_h_arrays_sharding;

/* download.c */
ts_handler_fn ts_h_arrays_data;
ts_handler_fn ts_h_arrays_rows;

/* upload.c */
extern const struct ts_upload_ops ts_h_arrays_put;

/* safetensors_io.c */
extern const struct ts_upload_ops ts_h_arrays_import;
ts_handler_fn ts_h_arrays_export;

/* checkpoint.c */
ts_handler_fn ts_h_models_export;
extern const struct ts_upload_ops ts_h_models_import;

/* state.c */
ts_handler_fn ts_h_arrays_persist;
ts_handler_fn ts_h_arrays_unpersist;
ts_handler_fn ts_h_models_persist;
ts_handler_fn ts_h_models_unpersist;
ts_handler_fn ts_h_state_get;
ts_handler_fn ts_h_state_save;

/* shardings.c */
ts_handler_fn ts_h_shardings_create;
ts_handler_fn ts_h_shardings_list;
ts_handler_fn ts_h_shardings_get;
ts_handler_fn ts_h_shardings_with_memory_kind;

/* wait.c */
struct ts_operation;
ts_handler_fn ts_h_operations_wait;

/* Answers when op finishes or timeout_ns passes, holding no thread: with
 * answer_result, a finished operation answers its result (or error)
 * itself; otherwise (and on timeout) the operation, 202 while running. */
void ts_h_reply_wait(struct ts_reply *reply, struct ts_operation *op, uint64_t timeout_ns,
                     bool answer_result);

/* Whether the caller asked to wait (?wait=true, Prefer: wait=N), and how long:
 * --wait-limit (core->wait_limit_ns) for ?wait=true, N cut to it. */
bool ts_h_wait_requested(const struct ts_call *call, uint64_t *timeout_ns);

/* The timeout of a :wait from ?timeout= (query, may be NULL) and the body
 * (body_len bytes: none, or {"timeout": "30s"}), validated as every JSON
 * body is (strict members, no duplicates); none given is 3600 s, which the
 * handler cuts to --wait-limit as any longer timeout. Pure; TS_INVALID_ARGUMENT with
 * err naming the problem. */
ts_status ts_h_wait_timeout(const char *query, const char *body, size_t body_len,
                            uint64_t *timeout_ns, struct ts_error *err);

/* moves.c */
ts_handler_fn ts_h_arrays_put_sharding;
ts_handler_fn ts_h_arrays_copy;

/* operations.c (renderers for other handlers: handlers/operations.h) */
ts_handler_fn ts_h_operations_list;
ts_handler_fn ts_h_operations_get;
ts_handler_fn ts_h_operations_cancel;
ts_handler_fn ts_h_operations_delete;

/* models.c */
ts_handler_fn ts_h_models_create;
ts_handler_fn ts_h_models_list;
ts_handler_fn ts_h_models_get;
ts_handler_fn ts_h_models_delete;
ts_handler_fn ts_h_models_analyze;
ts_handler_fn ts_h_models_analyze_spec;
ts_handler_fn ts_h_models_step;
ts_handler_fn ts_h_models_evaluate;
ts_handler_fn ts_h_models_generate;

/* faults.c: only in a fault-injection build (common/fault.h) */
#ifdef TS_FAULT_BUILD
ts_handler_fn ts_h_debug_faults_get;
ts_handler_fn ts_h_debug_faults_arm;
#endif

/* memory.c */
ts_handler_fn ts_h_memory_get;
ts_handler_fn ts_h_memory_reset_peak;

/* The rendered "spaces" list of GET /v1/memory, reused while the memory
 * table's generation is unchanged. Thread-safe; NULL when out of memory. */
struct ts_view_cache *ts_view_cache_new(void);
void ts_view_cache_free(struct ts_view_cache *c);

/* The stats of one space as JSON: JAX memory_stats() keys plus free bytes.
 * New reference, NULL when out of memory. */
json_t *ts_h_space_stats_json(const struct ts_space *sp);

#endif
