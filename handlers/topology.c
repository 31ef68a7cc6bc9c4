/*
 * topology.c - GET /v1/topology: the node's NUMA nodes (memory, CPUs),
 * each device's NUMA node and local CPUs, and the peer matrix of the
 * accelerators (as matrices and as nvidia-smi topo -m text), as discovered
 * at start; devices in GET /v1/devices' (topology) order, each with the
 * binding of its threads to CPUs.
 */
#include "handlers/handlers.h"

#include <stdlib.h>

#include "common/utf8.h"
#include "device/mesh_layout.h"

json_t *ts_h_device_place_json(const struct ts_topology_device *d)
{
	bool numa = d && d->numa_node >= 0, cpus = d && d->local_cpus[0];

	return json_pack("{s:o, s:o}", "numa_node",
	                 numa ? json_integer(d->numa_node) : json_null(), "local_cpus",
	                 cpus ? json_string(d->local_cpus) : json_null());
}

/* The peer matrix: one n x n matrix per property, rows accessing columns. */
static json_t *peers_json(const struct ts_topology *t)
{
	size_t n = ts_topology_peer_count(t);
	json_t *ids = json_array(), *access = json_array(), *link = json_array(),
	       *rank = json_array(), *atomics = json_array();
	char *text = ts_topology_matrix_text(t);
	json_t *o;

	for (size_t i = 0; i < n && ids && access && link && rank && atomics; i++) {
		json_t *ra = json_array(), *rl = json_array(), *rr = json_array(), *rt = json_array();

		json_array_append_new(ids, json_string(ts_topology_peer_id(t, i)));
		for (size_t j = 0; j < n; j++) {
			const struct ts_topology_peer *p = ts_topology_peer_at(t, i, j);

			json_array_append_new(ra, json_boolean(p->access));
			json_array_append_new(rl, json_string(ts_link_name(p->link)));
			json_array_append_new(rr, json_integer(p->perf_rank));
			json_array_append_new(rt, json_boolean(p->native_atomics));
		}
		json_array_append_new(access, ra);
		json_array_append_new(link, rl);
		json_array_append_new(rank, rr);
		json_array_append_new(atomics, rt);
	}
	o = json_pack("{s:o*, s:o*, s:o*, s:o*, s:o*, s:o*}", "devices", ids, "access", access,
	              "link", link, "perf_rank", rank, "native_atomics", atomics, "text",
	              text ? json_string(text) : NULL);
	free(text);
	return o;
}

/* Where the device's threads run (topology.h's ts_topology_cpubind). */
static json_t *cpubind_json(const struct ts_topology_cpubind *b)
{
	return json_pack("{s:b, s:b, s:b, s:o*}", "copy_threads", b->copy_threads, "cpu_kernels",
	                 b->cpu_kernels, "applied", b->applied, "reason", ts_json_text(b->reason));
}

json_t *ts_h_topology_json(const struct ts_core *core)
{
	const struct ts_topology *t = core->topology;
	json_t *nodes = json_array(), *devs = json_array();
	struct ts_device *order[TS_MESH_LAYOUT_MAX];
	size_t ndev;

	for (size_t i = 0; nodes && i < ts_topology_numa_count(t); i++) {
		const struct ts_topology_numa *n = ts_topology_numa_at(t, i);

		json_array_append_new(nodes, json_pack("{s:i, s:I, s:s}", "index", n->index,
		                                       "memory_bytes", (json_int_t)n->memory,
		                                       "cpuset", n->cpuset));
	}
	ndev = ts_mesh_layout_node(t, core->env.devices, order, TS_MESH_LAYOUT_MAX);
	for (size_t i = 0; devs && i < ndev; i++) {
		const struct ts_topology_device *d =
		        ts_topology_device_find(t, ts_device_props(order[i])->id);
		json_t *o = ts_h_device_place_json(d);

		if (o && d) {
			json_object_set_new(o, "id", json_string(d->id));
			json_object_set_new(o, "cpu_binding", cpubind_json(&d->cpubind));
		}
		json_array_append_new(devs, o);
	}
	return json_pack("{s:o*, s:f, s:o*, s:o*, s:o*}", "source",
	                 ts_json_text(ts_topology_source(t)), "discovery_ms",
	                 (double)ts_topology_discovery_ns(t) / 1e6, "numa_nodes", nodes, "devices",
	                 devs, "peers", peers_json(t));
}

void ts_h_topology_get(const struct ts_call *call, struct ts_reply *reply)
{
	ts_reply_json(reply, TS_HTTP_OK, ts_h_topology_json(call->core));
}
