/*
 * topology.c - NUMA nodes and device locality from hwloc (topology.h).
 *
 * The hwloc topology lives only while ts_topology_new runs: what callers
 * read afterwards is copied out into plain arrays, so a topology is
 * immutable and needs no lock.
 */
#include "device/topology.h"

#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"

struct ts_topology {
	char source[4096];
	uint64_t discovery_ns;
	size_t nnuma;
	struct ts_topology_numa *numa;
	size_t ndev;
	struct ts_topology_device *dev;
};

static void cpuset_string(char *buf, size_t cap, hwloc_const_bitmap_t set)
{
	buf[0] = '\0';
	if (set && !hwloc_bitmap_iszero(set))
		hwloc_bitmap_list_snprintf(buf, cap, set);
}

/* The NUMA node nearest obj: the single memory child of its closest ancestor
 * that has memory children; -1 when that ancestor has several. */
static int numa_of(hwloc_obj_t obj)
{
	while (obj && obj->memory_arity == 0)
		obj = obj->parent;
	if (!obj || obj->memory_arity != 1 || obj->memory_first_child->type != HWLOC_OBJ_NUMANODE)
		return -1;
	return (int)obj->memory_first_child->os_index;
}

static const struct ts_topology_numa *numa_find(const struct ts_topology *t, int index)
{
	for (size_t i = 0; i < t->nnuma; i++)
		if (t->numa[i].index == index)
			return &t->numa[i];
	return NULL;
}

static ts_status load(hwloc_topology_t *topo, const char *xml, bool pci, struct ts_error *err)
{
	if (hwloc_topology_init(topo) < 0)
		return ts_error_oom(err, "no memory for the hwloc topology");
	/* keep GPUs and the bridges above them where CUDA devices are to be found
	 * by bus id; elsewhere the PCI scan is time spent for nothing */
	if (pci)
		hwloc_topology_set_io_types_filter(*topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
	if (xml && hwloc_topology_set_xml(*topo, xml) < 0) {
		int e = errno;

		hwloc_topology_destroy(*topo);
		return ts_error_set(err, TS_INVALID_ARGUMENT, "TOPOLOGY_FILE",
		                    "--topology-file '%s' cannot be read as hwloc XML: %s", xml,
		                    strerror(e));
	}
	if (hwloc_topology_load(*topo) < 0) {
		int e = errno;

		hwloc_topology_destroy(*topo);
		if (xml)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "TOPOLOGY_FILE",
			                    "--topology-file '%s' cannot be loaded as hwloc XML: %s", xml,
			                    strerror(e));
		return ts_error_set(err, TS_INTERNAL, "TOPOLOGY",
		                    "hwloc cannot discover this machine's topology: %s", strerror(e));
	}
	return TS_OK;
}

static ts_status copy_numa(struct ts_topology *t, hwloc_topology_t topo, struct ts_error *err)
{
	int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);

	if (n <= 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "TOPOLOGY_FILE",
		                    "topology from %s has no NUMA node", t->source);
	t->numa = calloc((size_t)n, sizeof *t->numa);
	if (!t->numa)
		return ts_error_oom(err, "no memory for %d NUMA nodes", n);
	for (int i = 0; i < n; i++) {
		hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);

		t->numa[i].index = (int)o->os_index;
		t->numa[i].memory = o->attr->numanode.local_memory;
		cpuset_string(t->numa[i].cpuset, sizeof t->numa[i].cpuset, o->cpuset);
	}
	t->nnuma = (size_t)n;
	return TS_OK;
}

/* Places a CUDA device by its PCI bus id; unknown when hwloc has no such
 * PCI object (a file of another machine, or discovery without PCI). */
static void place_pci(struct ts_topology_device *d, hwloc_topology_t topo, const char *busid)
{
	hwloc_obj_t pci = busid[0] ? hwloc_get_pcidev_by_busidstring(topo, busid) : NULL;
	hwloc_obj_t near = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : NULL;

	if (!near)
		return;
	d->numa_node = numa_of(near);
	cpuset_string(d->local_cpus, sizeof d->local_cpus, near->cpuset);
}

static ts_status place(struct ts_topology *t, hwloc_topology_t topo,
                       const struct ts_topology_config *cfg,
                       const struct ts_device_set *set, struct ts_error *err)
{
	size_t n = set ? ts_device_set_count(set) : 0, nsim = 0, next_sim = 0;

	for (size_t i = 0; i < n; i++)
		nsim += ts_device_props(ts_device_set_at(set, i))->backend == TS_BACKEND_SIM;
	if (cfg->sim_numa_nodes && cfg->sim_numa_count != nsim)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_NUMA_NODES",
		                    "--sim-numa-nodes lists %zu NUMA nodes for %zu sim devices",
		                    cfg->sim_numa_count, nsim);
	for (size_t i = 0; cfg->sim_numa_nodes && i < cfg->sim_numa_count; i++)
		if (!numa_find(t, cfg->sim_numa_nodes[i]))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_NUMA_NODES",
			                    "--sim-numa-nodes names NUMA node %d, which the topology "
			                    "from %s lacks (it has %zu)",
			                    cfg->sim_numa_nodes[i], t->source, t->nnuma);
	t->dev = calloc(n ? n : 1, sizeof *t->dev);
	if (!t->dev)
		return ts_error_oom(err, "no memory for %zu device placements", n);
	for (size_t i = 0; i < n; i++) {
		const struct ts_device_props *pr = ts_device_props(ts_device_set_at(set, i));
		struct ts_topology_device *d = &t->dev[i];
		const struct ts_topology_numa *node = NULL;

		snprintf(d->id, sizeof d->id, "%s", pr->id);
		d->numa_node = -1;
		if (pr->backend == TS_BACKEND_CUDA)
			place_pci(d, topo, pr->pci_bus_id);
		else if (pr->backend == TS_BACKEND_SIM && cfg->sim_numa_nodes)
			node = numa_find(t, cfg->sim_numa_nodes[next_sim]);
		else if (pr->backend == TS_BACKEND_CPU)
			cpuset_string(d->local_cpus, sizeof d->local_cpus,
			              hwloc_topology_get_topology_cpuset(topo));
		next_sim += pr->backend == TS_BACKEND_SIM;
		if (!node && d->numa_node < 0 && t->nnuma == 1)
			node = &t->numa[0];
		if (node) {
			d->numa_node = node->index;
			if (!d->local_cpus[0])
				snprintf(d->local_cpus, sizeof d->local_cpus, "%s", node->cpuset);
		}
	}
	t->ndev = n;
	return TS_OK;
}

ts_status ts_topology_new(const struct ts_topology_config *cfg,
                          const struct ts_device_set *set,
                          struct ts_topology **out, struct ts_error *err)
{
	uint64_t t0 = ts_now_ns();
	const char *xml = cfg->xml_file && cfg->xml_file[0] ? cfg->xml_file : NULL;
	struct ts_topology *t = calloc(1, sizeof *t);
	hwloc_topology_t topo;
	bool cuda = false;
	ts_status st;

	if (!t)
		return ts_error_oom(err, "no memory for the topology");
	snprintf(t->source, sizeof t->source, "%s", xml ? xml : "machine");

	for (size_t i = 0; set && i < ts_device_set_count(set); i++)
		cuda |= ts_device_props(ts_device_set_at(set, i))->backend == TS_BACKEND_CUDA;
	st = load(&topo, xml, cuda, err);
	if (st != TS_OK)
		goto out_free;
	st = copy_numa(t, topo, err);
	if (st == TS_OK)
		st = place(t, topo, cfg, set, err);
	hwloc_topology_destroy(topo);
	if (st != TS_OK)
		goto out_free;
	t->discovery_ns = ts_now_ns() - t0;
	*out = t;
	return TS_OK;

out_free:
	ts_topology_free(t);
	return st;
}

void ts_topology_free(struct ts_topology *t)
{
	if (!t)
		return;
	free(t->numa);
	free(t->dev);
	free(t);
}

const char *ts_topology_source(const struct ts_topology *t)
{
	return t->source;
}

uint64_t ts_topology_discovery_ns(const struct ts_topology *t)
{
	return t->discovery_ns;
}

size_t ts_topology_numa_count(const struct ts_topology *t)
{
	return t->nnuma;
}

const struct ts_topology_numa *ts_topology_numa_at(const struct ts_topology *t, size_t i)
{
	return i < t->nnuma ? &t->numa[i] : NULL;
}

size_t ts_topology_device_count(const struct ts_topology *t)
{
	return t->ndev;
}

const struct ts_topology_device *ts_topology_device_at(const struct ts_topology *t, size_t i)
{
	return i < t->ndev ? &t->dev[i] : NULL;
}

const struct ts_topology_device *ts_topology_device_find(const struct ts_topology *t,
                                                         const char *id)
{
	for (size_t i = 0; t && id && i < t->ndev; i++)
		if (strcmp(t->dev[i].id, id) == 0)
			return &t->dev[i];
	return NULL;
}

ts_status ts_topology_parse_list(const char *s, int *out, size_t cap, size_t *n,
                                 struct ts_error *err)
{
	const char *p = s;

	*n = 0;
	while (p && *p) {
		char *end;
		long v;

		errno = 0;
		v = strtol(p, &end, 10);
		if (end == p || errno || v < 0 || v > INT_MAX || (*end && *end != ',') ||
		    (*end == ',' && !end[1]) || p[0] == '-' || p[0] == '+' || p[0] == ' ')
			return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_NUMA_NODES",
			                    "--sim-numa-nodes '%s' is not a comma-separated list of "
			                    "NUMA node indexes such as 0,0,1,1", s);
		if (*n == cap)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_NUMA_NODES",
			                    "--sim-numa-nodes '%s' lists more than %zu entries", s, cap);
		out[(*n)++] = (int)v;
		p = *end ? end + 1 : end;
	}
	return TS_OK;
}
