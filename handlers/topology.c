/*
 * topology.c - GET /v1/topology: the node's NUMA nodes (memory, CPUs) and
 * each device's NUMA node and local CPUs, as discovered at start.
 */
#include "handlers/handlers.h"

#include "common/utf8.h"

json_t *ts_h_device_place_json(const struct ts_topology_device *d)
{
	bool numa = d && d->numa_node >= 0, cpus = d && d->local_cpus[0];

	return json_pack("{s:o, s:o}", "numa_node",
	                 numa ? json_integer(d->numa_node) : json_null(), "local_cpus",
	                 cpus ? json_string(d->local_cpus) : json_null());
}

json_t *ts_h_topology_json(const struct ts_core *core)
{
	const struct ts_topology *t = core->topology;
	json_t *nodes = json_array(), *devs = json_array();

	for (size_t i = 0; nodes && i < ts_topology_numa_count(t); i++) {
		const struct ts_topology_numa *n = ts_topology_numa_at(t, i);

		json_array_append_new(nodes, json_pack("{s:i, s:I, s:s}", "index", n->index,
		                                       "memory_bytes", (json_int_t)n->memory,
		                                       "cpuset", n->cpuset));
	}
	for (size_t i = 0; devs && i < ts_topology_device_count(t); i++) {
		const struct ts_topology_device *d = ts_topology_device_at(t, i);
		json_t *o = ts_h_device_place_json(d);

		if (o)
			json_object_set_new(o, "id", json_string(d->id));
		json_array_append_new(devs, o);
	}
	return json_pack("{s:o*, s:f, s:o*, s:o*}", "source", ts_json_text(ts_topology_source(t)),
	                 "discovery_ms", (double)ts_topology_discovery_ns(t) / 1e6,
	                 "numa_nodes", nodes, "devices", devs);
}

void ts_h_topology_get(const struct ts_call *call, struct ts_reply *reply)
{
	ts_reply_json(reply, TS_HTTP_OK, ts_h_topology_json(call->core));
}
