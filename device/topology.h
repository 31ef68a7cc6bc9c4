/*
 * topology.h - the node's NUMA layout and where each device sits in it.
 *
 * Discovered once at start with hwloc, from this machine or from an hwloc
 * XML file (tests, nodes where discovery is restricted): the NUMA nodes with
 * their memory and CPU sets, and for each device of a device set its NUMA
 * node and local CPUs. CUDA GPUs are found by PCI bus id among hwloc's PCI
 * objects; sim devices are placed by a list (--sim-numa-nodes); a device
 * whose place cannot be known has numa_node -1 and local_cpus "", except on
 * a node with one NUMA node, where every device sits on it.
 *
 * Invariants: immutable after ts_topology_new; NUMA nodes are listed in
 * hwloc's logical order and named by their OS index (as numactl names
 * them); devices are listed in the device set's order. CPU sets are list
 * strings ("0-7,16-23").
 *
 * Thread-safety: a topology may be read from any thread once made.
 */
#ifndef TS_TOPOLOGY_H
#define TS_TOPOLOGY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"

#define TS_TOPOLOGY_CPUSET_MAX 256

struct ts_topology_numa {
	int index;                /* OS index */
	uint64_t memory;          /* bytes local to the node */
	char cpuset[TS_TOPOLOGY_CPUSET_MAX];
};

struct ts_topology_device {
	char id[32];              /* as ts_device_props' id */
	int numa_node;            /* OS index, or -1: unknown */
	char local_cpus[TS_TOPOLOGY_CPUSET_MAX]; /* "" when unknown */
};

struct ts_topology_config {
	const char *xml_file;     /* NULL or "": this machine */
	const int *sim_numa_nodes; /* one NUMA OS index per sim device, or NULL */
	size_t sim_numa_count;
};

struct ts_topology;

/*
 * Loads the topology and places every device of set. Fails with
 * INVALID_ARGUMENT (reason TOPOLOGY_FILE) when the XML file cannot be read
 * or parsed, or (reason SIM_NUMA_NODES) when sim_numa_nodes names a NUMA
 * node the topology lacks or its count differs from the sim devices'.
 * Returns a new topology owned by the caller (ts_topology_free).
 */
ts_status ts_topology_new(const struct ts_topology_config *cfg,
                          const struct ts_device_set *set,
                          struct ts_topology **out, struct ts_error *err);
void ts_topology_free(struct ts_topology *t);

/* "machine", or the XML file's path as given. */
const char *ts_topology_source(const struct ts_topology *t);

/* Nanoseconds ts_topology_new spent loading and placing. */
uint64_t ts_topology_discovery_ns(const struct ts_topology *t);

size_t ts_topology_numa_count(const struct ts_topology *t);
const struct ts_topology_numa *ts_topology_numa_at(const struct ts_topology *t, size_t i);

size_t ts_topology_device_count(const struct ts_topology *t);
const struct ts_topology_device *ts_topology_device_at(const struct ts_topology *t, size_t i);

/* The placement of the device with this id, or NULL (borrowed). */
const struct ts_topology_device *ts_topology_device_find(const struct ts_topology *t,
                                                         const char *id);

/*
 * Parses --sim-numa-nodes: comma-separated non-negative integers ("0,0,1,1").
 * Writes at most cap of them to out and their count to *n. INVALID_ARGUMENT
 * (reason SIM_NUMA_NODES) on anything else or more than cap.
 */
ts_status ts_topology_parse_list(const char *s, int *out, size_t cap, size_t *n,
                                 struct ts_error *err);

#endif
