/*
 * mesh_layout.h - the order of a mesh's devices when the caller leaves it to
 * the node ("devices": "auto"), as jax.experimental.mesh_utils'
 * create_device_mesh lays a mesh out by physical topology.
 *
 * A mesh is row-major: neighbours along its last (fastest) axis are
 * consecutive in the order, and a block of the last axis' size is one row
 * of it. The order keeps each NUMA node's devices together (a row that fits
 * in a node's devices stays inside that node, so its traffic never crosses
 * the inter-socket link), NUMA nodes in their OS index order, devices of
 * unknown place last. Within a node the devices form a chain by the peer
 * matrix: the node's first device in the set's order, then each time the
 * device best linked to the one before (NVLink, then a shared PCIe switch,
 * host bridge, NUMA node; pairs without peer access after those), ties in
 * the set's order (CUDA's PCI bus order, in which devices behind one switch
 * are adjacent).
 *
 * Thread-safety: pure; the topology is read only.
 */
#ifndef TS_MESH_LAYOUT_H
#define TS_MESH_LAYOUT_H

#include <stddef.h>

#include "device/device.h"
#include "device/topology.h"

/* Devices one layout orders at most (more are left out of out). */
#define TS_MESH_LAYOUT_MAX 256

/*
 * Writes the n devices of cand (in the device set's order) to out in the
 * mesh's order for a last axis of last_axis devices, and to why (cap bytes,
 * NUL-terminated, cut if longer) a sentence naming the groups and whether
 * each row stays in one NUMA node. t may be NULL (no topology: the set's
 * order, said so).
 */
void ts_mesh_layout(const struct ts_topology *t, struct ts_device *const *cand, int n,
                    int last_axis, struct ts_device **out, char *why, size_t cap);

/*
 * The node's devices in topology order, as GET /v1/devices lists them:
 * backend by backend in the set's order (CUDA, sim, cpu), each backend's
 * devices in the order ts_mesh_layout gives a 1 x n mesh of all of them
 * (NUMA node by node, best linked neighbours adjacent). Writes at most cap
 * devices (borrowed from set) to out and returns their count; t may be
 * NULL (the set's order).
 */
size_t ts_mesh_layout_node(const struct ts_topology *t, const struct ts_device_set *set,
                           struct ts_device **out, size_t cap);

#endif
