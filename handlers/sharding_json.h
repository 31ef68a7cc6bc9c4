/*
 * sharding_json.h - shardings as JSON, in the one shape every handler
 * accepts and answers:
 *
 *   {"device": "sim:0", "memory_kind": "pinned_host"}              single device
 *   {"mesh": {"devices": ["sim:0", "sim:1"], "axis_names": ["x"],
 *             "shape": [2]},
 *    "spec": ["x", null], "memory_kind": "device"}                 named
 *
 * A spec entry is null (the dimension is whole), an axis name, or a list of
 * axis names (outermost first). "shape" may be left out when the mesh has
 * one axis; "memory_kind" may be left out (or null) for the server default.
 * Whatever parses is a valid sharding (ts_sharding_validate holds), and
 * ts_render_sharding (jobs/render.h) of it parses back to an equal one.
 *
 * Thread-safety: pure functions of their arguments; the saved shardings are
 * read through the registry's own lock.
 */
#ifndef TS_HANDLERS_SHARDING_JSON_H
#define TS_HANDLERS_SHARDING_JSON_H

#include <jansson.h>

#include "handlers/api.h"
#include "jobs/render.h"
#include "storage/sharding.h"

/*
 * Parses a sharding object (j borrowed) against core's devices; fills *out
 * only on success. A mesh's "devices" is a list of device ids or "auto". Unknown keys, unknown devices or axis names, bad types
 * and invalid meshes or specs are INVALID_ARGUMENT with a message naming
 * the field ("sharding.spec[1]: axis 'z' is not in the mesh"); reasons are
 * BAD_SHARDING, DEVICE_NOT_FOUND or BAD_MEMORY_KIND.
 */
ts_status ts_h_sharding_parse(const struct ts_core *core, json_t *j, struct ts_sharding *out,
                              struct ts_error *err);

/*
 * Like ts_h_sharding_parse, but j may also be a string naming a saved
 * sharding (core->env.shardings): NOT_FOUND (SHARDING_NOT_FOUND) when no such
 * sharding is saved. Anything else is INVALID_ARGUMENT.
 */
ts_status ts_h_sharding_resolve(const struct ts_core *core, json_t *j, struct ts_sharding *out,
                                struct ts_error *err);

/*
 * The two above, and for a mesh of "devices": "auto" (every device of the
 * node's default backend, laid out by the topology: device/mesh_layout.h)
 * the reason for the order chosen in why (cap bytes; "" for any other
 * sharding). why may be NULL when cap is 0.
 */
ts_status ts_h_sharding_parse_layout(const struct ts_core *core, json_t *j,
                                     struct ts_sharding *out, char *why, size_t cap,
                                     struct ts_error *err);
ts_status ts_h_sharding_resolve_layout(const struct ts_core *core, json_t *j,
                                       struct ts_sharding *out, char *why, size_t cap,
                                       struct ts_error *err);


#endif
