/*
 * mesh_layout.c - "devices": "auto": a mesh's devices grouped by NUMA node
 * (mesh_layout.h).
 */
#include "device/mesh_layout.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* The NUMA node of d, or -1. */
static int node_of(const struct ts_topology *t, const struct ts_device *d)
{
	const struct ts_topology_device *p = t ? ts_topology_device_find(t, ts_device_props(d)->id)
	                                       : NULL;

	return p ? p->numa_node : -1;
}

/* How well a and b are linked, lower is better: the link's kind where
 * peer access is possible, past every kind where it is not, last where the
 * matrix does not know the pair. */
static int link_rank(const struct ts_topology *t, const struct ts_device *a,
                     const struct ts_device *b)
{
	const struct ts_topology_peer *p = ts_topology_peer_find(t, ts_device_props(a)->id,
	                                                         ts_device_props(b)->id);

	if (!p)
		return 2 * TS_LINK_KIND_COUNT + 1;
	return p->access ? (int)p->link : TS_LINK_KIND_COUNT + (int)p->link;
}

/* Orders g[0..n) in place as a chain: the first stays, each next is the
 * one best linked to the one before it (ties: the earlier in g). Returns
 * whether the order changed. */
static bool chain_by_links(const struct ts_topology *t, struct ts_device **g, int n)
{
	bool changed = false;

	for (int i = 1; i < n; i++) {
		int best = i;

		for (int j = i + 1; j < n; j++)
			if (link_rank(t, g[i - 1], g[j]) < link_rank(t, g[i - 1], g[best]))
				best = j;
		if (best != i) {
			struct ts_device *d = g[best];

			/* keep the others in their order */
			memmove(g + i + 1, g + i, (size_t)(best - i) * sizeof *g);
			g[i] = d;
			changed = true;
		}
	}
	return changed;
}

/* Appends to why (at *len of cap), cutting what does not fit. */
static void say(char *why, size_t cap, size_t *len, const char *fmt, ...)
{
	va_list ap;
	int k;

	if (*len + 1 >= cap)
		return;
	va_start(ap, fmt);
	k = vsnprintf(why + *len, cap - *len, fmt, ap);
	va_end(ap);
	if (k > 0)
		*len = *len + (size_t)k < cap ? *len + (size_t)k : cap - 1;
}

#define RELINKED "each device follows the one best linked to the one before it (the peer " \
	"matrix's link kinds, best first: nvlink, pcie_switch, host_bridge, numa_node)"

void ts_mesh_layout(const struct ts_topology *t, struct ts_device *const *cand, int n,
                    int last_axis, struct ts_device **out, char *why, size_t cap)
{
	int node[TS_MESH_LAYOUT_MAX], nodes[TS_MESH_LAYOUT_MAX], onode[TS_MESH_LAYOUT_MAX];
	int nnodes = 0, k = 0, rows, split = 0;
	bool relinked = false;
	size_t len = 0;

	if (cap)
		why[0] = 0;
	if (n > TS_MESH_LAYOUT_MAX)
		n = TS_MESH_LAYOUT_MAX;
	if (n <= 0)
		return;
	if (last_axis < 1 || last_axis > n)
		last_axis = n;
	/* the distinct known nodes, in increasing order (insertion sort) */
	for (int i = 0; i < n; i++) {
		int j;

		node[i] = node_of(t, cand[i]);
		if (node[i] < 0)
			continue;
		for (j = 0; j < nnodes && nodes[j] != node[i]; j++)
			;
		if (j < nnodes)
			continue;
		for (j = nnodes++; j > 0 && nodes[j - 1] > node[i]; j--)
			nodes[j] = nodes[j - 1];
		nodes[j] = node[i];
	}
	/* each node's devices chained by their links, then those of unknown
	 * place in the set's order */
	for (int g = 0; g <= nnodes; g++) {
		int first = k;

		for (int i = 0; i < n; i++)
			if (g < nnodes ? node[i] == nodes[g] : node[i] < 0) {
				onode[k] = node[i];
				out[k++] = cand[i];
			}
		if (g < nnodes && t && chain_by_links(t, out + first, k - first))
			relinked = true;
	}
	if (nnodes == 0) {
		say(why, cap, &len, "no NUMA placement is known for these devices: the order in "
		    "which the node lists them");
		return;
	}
	if (nnodes == 1 && onode[n - 1] >= 0) {
		if (relinked)
			say(why, cap, &len, "all %d devices sit on NUMA node %d: %s", n, nodes[0],
			    RELINKED);
		else
			say(why, cap, &len, "all %d devices sit on NUMA node %d: the order in which "
			    "the node lists them (PCI bus order on CUDA)", n, nodes[0]);
		return;
	}
	say(why, cap, &len, "grouped by NUMA node:");
	for (int i = 0; i < n; i++) {
		bool first = i == 0 || onode[i - 1] != onode[i];

		if (first && onode[i] >= 0)
			say(why, cap, &len, "%s node %d (", i ? ";" : "", onode[i]);
		else if (first)
			say(why, cap, &len, "%s unknown (", i ? ";" : "");
		say(why, cap, &len, "%s%s", first ? "" : ", ", ts_device_props(out[i])->id);
		if (i + 1 == n || onode[i + 1] != onode[i])
			say(why, cap, &len, ")");
	}
	if (relinked)
		say(why, cap, &len, "; inside a node, %s", RELINKED);
	rows = n / last_axis;
	for (int r = 0; r < rows; r++)
		for (int i = r * last_axis; i < (r + 1) * last_axis; i++)
			if (onode[i] < 0 || onode[i] != onode[r * last_axis]) {
				split++;
				break;
			}
	if (split == 0)
		say(why, cap, &len, "; each row of the last axis (%d device%s) stays within one "
		    "NUMA node", last_axis, last_axis == 1 ? "" : "s");
	else
		say(why, cap, &len, "; %d of %d rows of the last axis (%d devices) span NUMA nodes "
		    "or hold devices of unknown place (a node holds fewer devices than a row)",
		    split, rows, last_axis);
}

size_t ts_mesh_layout_node(const struct ts_topology *t, const struct ts_device_set *set,
                           struct ts_device **out, size_t cap)
{
	struct ts_device *cand[TS_MESH_LAYOUT_MAX], *row[TS_MESH_LAYOUT_MAX];
	size_t n = ts_device_set_count(set), k = 0;

	for (int b = 0; b < TS_BACKEND_COUNT && k < cap; b++) {
		size_t nb = 0;

		for (size_t i = 0; i < n && nb < TS_MESH_LAYOUT_MAX; i++)
			if ((int)ts_device_props(ts_device_set_at(set, i))->backend == b)
				cand[nb++] = ts_device_set_at(set, i);
		if (nb == 0)
			continue;
		/* a 1 x nb mesh: one row, the whole backend */
		ts_mesh_layout(t, cand, (int)nb, (int)nb, row, NULL, 0);
		if (nb > cap - k)
			nb = cap - k;
		memcpy(out + k, row, nb * sizeof *row);
		k += nb;
	}
	return k;
}
