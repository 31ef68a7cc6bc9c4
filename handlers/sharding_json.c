/*
 * sharding_json.c - sharding JSON in and out (the shapes are in
 * sharding_json.h). Every refusal names the field it is about, from
 * "sharding" down ("sharding.mesh.devices[2]", "sharding.spec[1][0]").
 */
#include "handlers/sharding_json.h"

#include <stdio.h>
#include <string.h>

#include "device/mesh_layout.h"

/* An INVALID_ARGUMENT with reason BAD_SHARDING; returns the status. */
/* Bad input, through the one helper (common/status.h). */
#define BAD(err, ...) ts_error_bad((err), "BAD_SHARDING", NULL, __VA_ARGS__)

/* The value of a JSON string without embedded NULs, else NULL. */
static const char *plain_string(json_t *v)
{
	const char *s = json_string_value(v);

	return s && strlen(s) == json_string_length(v) ? s : NULL;
}

/* The first key of o that is not in keys (NULL-terminated), or NULL. */
static const char *unknown_key(json_t *o, const char *const *keys)
{
	const char *k;
	json_t *v;

	json_object_foreach(o, k, v) {
		size_t i = 0;

		while (keys[i] && strcmp(keys[i], k) != 0)
			i++;
		if (!keys[i])
			return k;
	}
	return NULL;
}

/* ---- mesh -------------------------------------------------------------------------- */

static ts_status parse_mesh_devices(const struct ts_core *core, json_t *list,
                                    struct ts_mesh *m, struct ts_error *err)
{
	size_t n = json_array_size(list);

	if (!json_is_array(list) || n == 0 || n > TS_MESH_MAX_DEVICES)
		return BAD(err, "sharding.mesh.devices: expected a list of 1 to %d device ids, or "
		           "\"auto\"", TS_MESH_MAX_DEVICES);
	for (size_t i = 0; i < n; i++) {
		const char *id = plain_string(json_array_get(list, i));

		if (!id)
			return BAD(err, "sharding.mesh.devices[%zu]: expected a device id string", i);
		m->devices[i] = ts_device_set_find(core->env.devices, id);
		if (!m->devices[i])
			return ts_error_set(err, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
			                    "sharding.mesh.devices[%zu]: device '%.64s' is not a device "
			                    "of this node", i, id);
		for (size_t j = 0; j < i; j++)
			if (m->devices[j] == m->devices[i])
				return BAD(err, "sharding.mesh.devices[%zu]: device '%s' is listed twice",
				           i, id);
	}
	m->ndevices = (int)n;
	return TS_OK;
}

static ts_status parse_mesh_axes(json_t *list, struct ts_mesh *m, struct ts_error *err)
{
	size_t n = json_array_size(list);

	if (!json_is_array(list) || n == 0 || n > TS_MESH_MAX_AXES)
		return BAD(err, "sharding.mesh.axis_names: expected a list of 1 to %d axis names",
		           TS_MESH_MAX_AXES);
	for (size_t i = 0; i < n; i++) {
		const char *name = plain_string(json_array_get(list, i));

		if (!name || !name[0] || strlen(name) >= TS_AXIS_NAME_MAX)
			return BAD(err, "sharding.mesh.axis_names[%zu]: expected a name of 1 to %d "
			           "characters", i, TS_AXIS_NAME_MAX - 1);
		for (size_t j = 0; j < i; j++)
			if (strcmp(m->axis_names[j], name) == 0)
				return BAD(err, "sharding.mesh.axis_names[%zu]: axis '%s' is named twice",
				           i, name);
		memcpy(m->axis_names[i], name, strlen(name) + 1);
	}
	m->naxes = (int)n;
	return TS_OK;
}

/* source: what names the mesh's ndevices devices, for the refusal of a
 * shape that does not multiply to their count. */
static ts_status parse_mesh_shape(json_t *list, struct ts_mesh *m, const char *source,
                                  struct ts_error *err)
{
	long long prod = 1;

	if (!list) {
		if (m->naxes != 1)
			return BAD(err, "sharding.mesh.shape: needed when the mesh has %d axes", m->naxes);
		m->shape[0] = m->ndevices;
		return TS_OK;
	}
	if (!json_is_array(list) || json_array_size(list) != (size_t)m->naxes)
		return BAD(err, "sharding.mesh.shape: expected a list of %d sizes, one per axis name",
		           m->naxes);
	for (int a = 0; a < m->naxes; a++) {
		json_t *v = json_array_get(list, (size_t)a);
		json_int_t size = json_integer_value(v);

		if (!json_is_integer(v) || size < 1 || size > TS_MESH_MAX_DEVICES)
			return BAD(err, "sharding.mesh.shape[%d]: expected an integer in 1..%d", a,
			           TS_MESH_MAX_DEVICES);
		m->shape[a] = (int)size;
		prod *= size;
		if (prod > TS_MESH_MAX_DEVICES)
			break;
	}
	if (prod != m->ndevices)
		return BAD(err, "sharding.mesh.shape: its sizes multiply to %s%lld but %s %d devices",
		           prod > TS_MESH_MAX_DEVICES ? "more than " : "",
		           prod > TS_MESH_MAX_DEVICES ? (long long)TS_MESH_MAX_DEVICES : prod,
		           source, m->ndevices);
	return TS_OK;
}

/* "devices": "auto": every device of the node's default backend, laid out
 * by the topology (device/mesh_layout.h) once the shape is known; why
 * (cap bytes, may be NULL) receives the reason for the order. */
static ts_status parse_mesh_auto(const struct ts_core *core, json_t *shape, struct ts_mesh *m,
                                 char *why, size_t cap, struct ts_error *err)
{
	struct ts_device *cand[TS_MESH_MAX_DEVICES];
	enum ts_backend_kind kind = ts_device_set_default_backend(core->env.devices);
	size_t total = ts_device_set_count(core->env.devices);
	char source[96], scratch[2];
	int n = 0;
	ts_status st;

	for (size_t i = 0; i < total; i++) {
		struct ts_device *d = ts_device_set_at(core->env.devices, i);

		if (ts_device_props(d)->backend != kind)
			continue;
		if (n == TS_MESH_MAX_DEVICES)
			return BAD(err, "sharding.mesh.devices: \"auto\" would lay out more than %d "
			           "%s devices; list them", TS_MESH_MAX_DEVICES, ts_backend_name(kind));
		cand[n++] = d;
	}
	m->ndevices = n;
	snprintf(source, sizeof source, "\"auto\" lays out every %s device of the node:",
	         ts_backend_name(kind));
	st = parse_mesh_shape(shape, m, source, err);
	if (st != TS_OK)
		return st;
	ts_mesh_layout(core->topology, cand, n, m->shape[m->naxes - 1], m->devices,
	               why ? why : scratch, why ? cap : sizeof scratch);
	return TS_OK;
}

static ts_status parse_mesh(const struct ts_core *core, json_t *j, struct ts_mesh *m,
                            char *why, size_t cap, struct ts_error *err)
{
	static const char *const keys[] = {"devices", "axis_names", "shape", NULL};
	json_t *devices = NULL, *axes = NULL, *shape = NULL;
	json_error_t jerr;
	ts_status st;

	if (!json_is_object(j))
		return BAD(err, "sharding.mesh: expected an object with devices, axis_names and shape");
	if (json_unpack_ex(j, &jerr, JSON_STRICT, "{s:o, s:o, s?o}", "devices", &devices,
	                   "axis_names", &axes, "shape", &shape) != 0) {
		const char *k = unknown_key(j, keys);

		if (k)
			return BAD(err, "sharding.mesh: unknown field '%.64s' (expected devices, "
			           "axis_names, shape)", k);
		return BAD(err, "sharding.mesh: needs %s", devices ? "axis_names" : "devices");
	}
	if (json_is_string(devices)) {
		if (strcmp(json_string_value(devices), "auto") != 0)
			return BAD(err, "sharding.mesh.devices: expected a list of 1 to %d device ids, "
			           "or \"auto\"", TS_MESH_MAX_DEVICES);
		st = parse_mesh_axes(axes, m, err);
		return st == TS_OK ? parse_mesh_auto(core, shape, m, why, cap, err) : st;
	}
	st = parse_mesh_devices(core, devices, m, err);
	if (st == TS_OK)
		st = parse_mesh_axes(axes, m, err);
	if (st == TS_OK)
		st = parse_mesh_shape(shape, m, "sharding.mesh.devices lists", err);
	return st;
}

/* ---- spec --------------------------------------------------------------------------- */

/* Adds the axis named by v to entry e of dimension d (field names the JSON
 * place); refuses unknown and reused axes. used[a] holds 1 + the dimension
 * that took axis a, or 0. */
static ts_status spec_axis(const struct ts_mesh *m, json_t *v, const char *field, int d,
                           struct ts_spec_entry *e, int *used, struct ts_error *err)
{
	const char *name = plain_string(v);
	int a = 0;

	if (!name)
		return BAD(err, "%s: expected an axis name", field);
	while (a < m->naxes && strcmp(m->axis_names[a], name) != 0)
		a++;
	if (a == m->naxes)
		return BAD(err, "%s: axis '%.64s' is not in the mesh", field, name);
	if (used[a])
		return BAD(err, "%s: mesh axis '%s' already splits dimension %d; a mesh axis may "
		           "split one dimension only", field, name, used[a] - 1);
	if (e->naxes == TS_SPEC_MAX_AXES)
		return BAD(err, "%s: at most %d mesh axes may split one dimension", field,
		           TS_SPEC_MAX_AXES);
	used[a] = d + 1;
	e->axes[e->naxes++] = a;
	return TS_OK;
}

static ts_status parse_spec(json_t *j, struct ts_sharding *s, struct ts_error *err)
{
	int used[TS_MESH_MAX_AXES] = {0};
	size_t n = json_array_size(j);

	if (!json_is_array(j))
		return BAD(err, "sharding.spec: expected a list with one entry per dimension: null, "
		           "an axis name, or a list of axis names");
	if (n > TS_MAX_RANK)
		return BAD(err, "sharding.spec: has %zu entries; arrays have at most %d dimensions",
		           n, TS_MAX_RANK);
	for (size_t d = 0; d < n; d++) {
		json_t *v = json_array_get(j, d);
		struct ts_spec_entry *e = &s->spec[d];
		char field[32];
		ts_status st = TS_OK;

		snprintf(field, sizeof field, "sharding.spec[%d]", (int)d);
		if (json_is_null(v))
			continue;
		if (json_is_string(v)) {
			st = spec_axis(&s->mesh, v, field, (int)d, e, used, err);
		} else if (json_is_array(v)) {
			if (json_array_size(v) > TS_SPEC_MAX_AXES)
				return BAD(err, "%s: at most %d mesh axes may split one dimension", field,
				           TS_SPEC_MAX_AXES);
			for (size_t i = 0; st == TS_OK && i < json_array_size(v); i++) {
				char sub[80];

				snprintf(sub, sizeof sub, "%s[%d]", field, (int)i);
				st = spec_axis(&s->mesh, json_array_get(v, i), sub, (int)d, e, used, err);
			}
		} else {
			return BAD(err, "%s: expected null, an axis name or a list of axis names", field);
		}
		if (st != TS_OK)
			return st;
	}
	s->spec_rank = (int)n;
	return TS_OK;
}

/* ---- the sharding object -------------------------------------------------------------- */

static ts_status parse_kind(const struct ts_core *core, json_t *v, enum ts_memory_kind *out,
                            struct ts_error *err)
{
	const char *name = plain_string(v);

	*out = core->default_memory_kind;
	if (!v || json_is_null(v))
		return TS_OK;
	if (!json_is_string(v))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
		                    "sharding.memory_kind: expected one of device, pinned_host, "
		                    "unpinned_host");
	if (!name || !ts_memory_kind_parse(name, out))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
		                    "sharding.memory_kind: '%.64s' is not one of device, pinned_host, "
		                    "unpinned_host", json_string_value(v));
	return TS_OK;
}

static ts_status parse_single(const struct ts_core *core, json_t *device, json_t *spec,
                              struct ts_sharding *s, struct ts_error *err)
{
	const char *id = plain_string(device);

	if (spec)
		return BAD(err, "sharding.spec: only a named sharding (with a mesh) takes a spec");
	if (!id)
		return BAD(err, "sharding.device: expected a device id string");
	s->type = TS_SHARDING_SINGLE;
	s->device = ts_device_set_find(core->env.devices, id);
	if (!s->device)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
		                    "sharding.device: device '%.64s' is not a device of this node", id);
	return TS_OK;
}

ts_status ts_h_sharding_parse(const struct ts_core *core, json_t *j, struct ts_sharding *out,
                              struct ts_error *err)
{
	return ts_h_sharding_parse_layout(core, j, out, NULL, 0, err);
}

ts_status ts_h_sharding_parse_layout(const struct ts_core *core, json_t *j,
                                     struct ts_sharding *out, char *why, size_t cap,
                                     struct ts_error *err)
{
	static const char *const keys[] = {"device", "mesh", "spec", "memory_kind", NULL};
	json_t *device = NULL, *mesh = NULL, *spec = NULL, *kind = NULL;
	struct ts_sharding s;
	json_error_t jerr;
	ts_status st;

	if (cap)
		why[0] = 0;
	if (!json_is_object(j))
		return BAD(err, "sharding: expected an object, {\"device\", \"memory_kind\"} or "
		           "{\"mesh\", \"spec\", \"memory_kind\"}");
	if (json_unpack_ex(j, &jerr, JSON_STRICT, "{s?o, s?o, s?o, s?o}", "device", &device,
	                   "mesh", &mesh, "spec", &spec, "memory_kind", &kind) != 0)
		return BAD(err, "sharding: unknown field '%.64s' (expected device, mesh, spec, "
		           "memory_kind)", unknown_key(j, keys) ? unknown_key(j, keys) : "?");
	memset(&s, 0, sizeof s);
	if (device && mesh)
		return BAD(err, "sharding: give either device (single-device) or mesh and spec "
		           "(named), not both");
	if (!device && !mesh)
		return BAD(err, "sharding: needs device (single-device) or mesh and spec (named)");
	st = parse_kind(core, kind, &s.memory_kind, err);
	if (st != TS_OK)
		return st;
	if (device) {
		st = parse_single(core, device, spec, &s, err);
	} else {
		s.type = TS_SHARDING_NAMED;
		st = parse_mesh(core, mesh, &s.mesh, why, cap, err);
		if (st == TS_OK && !spec)
			st = BAD(err, "sharding.spec: a named sharding needs a spec, one entry per "
			         "dimension ([] replicates the array on every device)");
		if (st == TS_OK)
			st = parse_spec(spec, &s, err);
	}
	if (st == TS_OK)
		st = ts_sharding_validate(&s, err);
	if (st == TS_OK)
		*out = s;
	return st;
}

ts_status ts_h_sharding_resolve(const struct ts_core *core, json_t *j, struct ts_sharding *out,
                                struct ts_error *err)
{
	return ts_h_sharding_resolve_layout(core, j, out, NULL, 0, err);
}

ts_status ts_h_sharding_resolve_layout(const struct ts_core *core, json_t *j,
                                       struct ts_sharding *out, char *why, size_t cap,
                                       struct ts_error *err)
{
	const char *name;

	if (cap)
		why[0] = 0;
	if (!json_is_string(j))
		return json_is_object(j)
		           ? ts_h_sharding_parse_layout(core, j, out, why, cap, err)
		           : BAD(err, "sharding: expected an object or the name of a saved sharding");
	name = plain_string(j);
	if (!name || !core->env.shardings || !ts_sharding_registry_get(core->env.shardings, name, out))
		return ts_error_set(err, TS_NOT_FOUND, "SHARDING_NOT_FOUND",
		                    "sharding '%.128s' not found", json_string_value(j));
	return TS_OK;
}
