/*
 * devices.c - GET /v1/devices, /v1/devices/{device} and
 * /v1/devices/{device}/memory_stats: each device's properties, its memories
 * with live stats, and JAX's memory_stats() keys for one memory kind. The
 * list is in topology order (ts_mesh_layout_node).
 */
#include "handlers/handlers.h"

#include <stdio.h>
#include <string.h>

#include "device/mesh_layout.h"
#include "memory/space.h"

static json_t *device_json(const struct ts_core *core, struct ts_device *dev)
{
	const struct ts_device_props *pr = ts_device_props(dev);
	json_t *mems = json_array(), *o;

	for (int k = 0; mems && k < TS_MEM_KIND_COUNT; k++) {
		struct ts_space *sp = ts_memory_find(core->env.memory, pr->id, (enum ts_memory_kind)k);

		if (!sp)
			continue;
		json_array_append_new(mems, json_pack("{s:s, s:o*}", "kind",
		                                      ts_memory_kind_name((enum ts_memory_kind)k),
		                                      "stats", ts_h_space_stats_json(sp)));
	}
	o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:b, s:I, s:s, s:b, s:b, s:i, s:o*}",
	              "id", pr->id, "backend", ts_backend_name(pr->backend),
	              "ordinal", pr->ordinal, "name", pr->name, "host", pr->host,
	              "simulated", pr->simulated,
	              "total_memory_bytes", (json_int_t)pr->total_memory,
	              "default_memory_kind", ts_memory_kind_name(core->default_memory_kind),
	              "default", dev == core->default_device,
	              "broken", ts_device_broken(dev),
	              "multiprocessors", pr->multiprocessors,
	              "memories", mems);
	if (o && pr->backend == TS_BACKEND_CUDA) {
		char cc[16];

		snprintf(cc, sizeof cc, "%d.%d", pr->compute_major, pr->compute_minor);
		json_object_set_new(o, "compute_capability", json_string(cc));
		json_object_set_new(o, "pci_bus_id", json_string(pr->pci_bus_id));
	}
	if (o)
		json_object_update_new(o, ts_h_device_place_json(
		                              ts_topology_device_find(core->topology, pr->id)));
	return o;
}

/* The device named by the path, or a NOT_FOUND reply. */
static struct ts_device *device_from_path(const struct ts_call *call,
                                          struct ts_reply *reply)
{
	const char *id = ts_call_param(call, "device");
	struct ts_device *dev = id ? ts_device_set_find(call->core->env.devices, id) : NULL;

	if (!dev)
		ts_reply_fail(reply, TS_NOT_FOUND, "DEVICE_NOT_FOUND",
		              "device '%s' not found; GET /v1/devices lists them",
		              id ? id : "");
	return dev;
}

json_t *ts_h_devices_json(const struct ts_core *core)
{
	struct ts_device *order[TS_MESH_LAYOUT_MAX];
	size_t n = ts_mesh_layout_node(core->topology, core->env.devices, order, TS_MESH_LAYOUT_MAX);
	json_t *list = json_array();

	/* in topology order (mesh_layout.h) */
	for (size_t i = 0; list && i < n; i++)
		json_array_append_new(list, device_json(core, order[i]));
	return json_pack("{s:o*, s:s, s:s}", "devices", list, "default_device",
	                 ts_device_props(core->default_device)->id,
	                 "default_backend",
	                 ts_backend_name(ts_device_set_default_backend(core->env.devices)));
}

void ts_h_devices_list(const struct ts_call *call, struct ts_reply *reply)
{
	ts_reply_json(reply, TS_HTTP_OK, ts_h_devices_json(call->core));
}

void ts_h_devices_get(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_device *dev = device_from_path(call, reply);

	if (dev)
		ts_reply_json(reply, TS_HTTP_OK, device_json(call->core, dev));
}

void ts_h_devices_memory_stats(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_device *dev = device_from_path(call, reply);
	const char *kind_s = ts_call_query(call, "memory_kind");
	enum ts_memory_kind kind = TS_MEM_DEVICE;
	struct ts_space *sp;

	if (!dev)
		return;
	if (kind_s && !ts_memory_kind_parse(kind_s, &kind)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
		              "memory_kind '%s' is not one of device, pinned_host, unpinned_host",
		              kind_s);
		return;
	}
	sp = ts_memory_find(call->core->env.memory, ts_device_props(dev)->id, kind);
	if (!sp) {
		ts_reply_fail(reply, TS_NOT_FOUND, "MEMORY_NOT_FOUND",
		              "device '%s' has no %s memory", ts_device_props(dev)->id,
		              ts_memory_kind_name(kind));
		return;
	}
	ts_reply_json(reply, TS_HTTP_OK, ts_h_space_stats_json(sp));
}
