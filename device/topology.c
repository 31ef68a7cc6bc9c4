/*
 * topology.c - NUMA nodes and device locality from hwloc (topology.h).
 *
 * The hwloc topology lives only while ts_topology_new runs: what callers
 * read afterwards is copied out into plain arrays, so a topology is
 * immutable and needs no lock. The peer matrix is built there too: CUDA
 * pairs from the runtime and hwloc's PCI tree, sim pairs from
 * --sim-peer-links, every link the PCI tree cannot tell from the NUMA
 * placement. The CPU binding of each device's threads is decided there as
 * well, from the local CPUs against the node's, and applied later by
 * whoever starts the threads (ts_topology_bind_cpus).
 */
#include "device/topology.h"

#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/textbuf.h"
#include "common/units.h"

struct ts_topology {
	char source[4096];
	uint64_t discovery_ns;
	size_t nnuma;
	struct ts_topology_numa *numa;
	size_t ndev;
	struct ts_topology_device *dev;
	hwloc_bitmap_t *dev_cpus;         /* [ndev]: local CPUs, NULL where unknown */
	hwloc_topology_t hw;              /* this machine's, kept for binding; NULL for a file */
	size_t npeer;
	size_t *peer_dev;                 /* [npeer]: index into dev */
	struct ts_topology_peer *peer;    /* [npeer * npeer], row-major */
};

static const struct {
	const char *name, *abbrev, *legend;
} link_names[TS_LINK_KIND_COUNT] = {
	[TS_LINK_SELF] = {"self", "X", "the device itself"},
	[TS_LINK_NVLINK] = {"nvlink", "NV", "NVLink"},
	[TS_LINK_PCIE_SWITCH] = {"pcie_switch", "PIX", "a PCIe switch"},
	[TS_LINK_HOST_BRIDGE] = {"host_bridge", "PHB", "one PCIe host bridge"},
	[TS_LINK_NUMA_NODE] = {"numa_node", "NODE", "host bridges of one NUMA node"},
	[TS_LINK_CROSS_SOCKET] = {"cross_socket", "SYS", "across NUMA nodes (sockets)"},
	[TS_LINK_UNKNOWN] = {"unknown", "?", "unknown"},
};

const char *ts_link_name(enum ts_link_kind k)
{
	return k < TS_LINK_KIND_COUNT ? link_names[k].name : "unknown";
}

const char *ts_link_abbrev(enum ts_link_kind k)
{
	return k < TS_LINK_KIND_COUNT ? link_names[k].abbrev : "?";
}

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

/* ---- the peer matrix ---------------------------------------------------- */

/* The link the NUMA placement implies, where nothing nearer is known. */
static enum ts_link_kind numa_link(const struct ts_topology_device *a,
                                   const struct ts_topology_device *b)
{
	if (a->numa_node < 0 || b->numa_node < 0)
		return TS_LINK_UNKNOWN;
	return a->numa_node == b->numa_node ? TS_LINK_NUMA_NODE : TS_LINK_CROSS_SOCKET;
}

/* The link between two PCI devices from hwloc's tree: the nearest object
 * above both, a PCI-PCI bridge (a switch) or a host bridge; TS_LINK_KIND_COUNT
 * when they meet above the I/O tree or either is not in it. */
static enum ts_link_kind pci_link(hwloc_topology_t topo, const char *a, const char *b)
{
	hwloc_obj_t pa = a[0] ? hwloc_get_pcidev_by_busidstring(topo, a) : NULL;
	hwloc_obj_t pb = b[0] ? hwloc_get_pcidev_by_busidstring(topo, b) : NULL;

	for (hwloc_obj_t x = pa ? pa->parent : NULL; pb && x && x->type == HWLOC_OBJ_BRIDGE;
	     x = x->parent)
		for (hwloc_obj_t y = pb->parent; y && y->type == HWLOC_OBJ_BRIDGE; y = y->parent)
			if (x == y)
				return x->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI
				               ? TS_LINK_PCIE_SWITCH
				               : TS_LINK_HOST_BRIDGE;
	return TS_LINK_KIND_COUNT;
}

/* Whether o is the PCI device pci, or an OS device of it (hwloc's NVML and
 * CUDA backends hang a GPU's "nvml0" or "cuda0" under its PCI device). */
static bool obj_is_gpu(hwloc_obj_t o, hwloc_obj_t pci)
{
	return o == pci || (o && o->type == HWLOC_OBJ_OS_DEVICE && o->parent == pci);
}

/* The bandwidth d gives from the GPU at PCI device pa to the one at pb (0
 * when either is not among its objects). */
static uint64_t gpu_pair_value(const struct hwloc_distances_s *d, hwloc_obj_t pa, hwloc_obj_t pb)
{
	unsigned ia = d->nbobjs, ib = d->nbobjs;

	for (unsigned i = 0; i < d->nbobjs; i++) {
		if (obj_is_gpu(d->objs[i], pa))
			ia = i;
		if (obj_is_gpu(d->objs[i], pb))
			ib = i;
	}
	return ia < d->nbobjs && ib < d->nbobjs && ia != ib ? d->values[ia * d->nbobjs + ib] : 0;
}

/* Whether hwloc's "NVLinkBandwidth" distances (its NVML backend's on a real
 * node, or a topology file's) give two PCI devices (bus ids) a bandwidth:
 * directly, or, where GPUs meet through NVSwitches (their bandwidth to each
 * other 0, to the switches' ports not), once the ports are merged and the
 * matrix closed transitively (hwloc_distances_transform, which changes this
 * copy of the matrix only; the closure also zeroes direct links, hence
 * the direct look first). */
static bool nvlink_between(hwloc_topology_t topo, const char *a, const char *b)
{
	hwloc_obj_t pa = a[0] ? hwloc_get_pcidev_by_busidstring(topo, a) : NULL;
	hwloc_obj_t pb = b[0] ? hwloc_get_pcidev_by_busidstring(topo, b) : NULL;
	struct hwloc_distances_s *d[4];
	unsigned nr = 4;
	bool linked = false;

	if (!pa || !pb || hwloc_distances_get_by_name(topo, "NVLinkBandwidth", &nr, d, 0) < 0)
		return false;
	for (unsigned k = 0; k < nr && k < 4; k++) {
		linked |= gpu_pair_value(d[k], pa, pb) > 0;
		if (!linked &&
		    hwloc_distances_transform(topo, d[k], HWLOC_DISTANCES_TRANSFORM_MERGE_SWITCH_PORTS,
		                              NULL, 0) == 0 &&
		    hwloc_distances_transform(topo, d[k], HWLOC_DISTANCES_TRANSFORM_TRANSITIVE_CLOSURE,
		                              NULL, 0) == 0)
			linked |= gpu_pair_value(d[k], pa, pb) > 0;
	}
	for (unsigned k = 0; k < nr && k < 4; k++)
		hwloc_distances_release(topo, d[k]);
	return linked;
}

static enum ts_link_kind sim_rank_link(enum ts_link_kind k, int *rank)
{
	*rank = k == TS_LINK_NVLINK ? 0 : k == TS_LINK_PCIE_SWITCH ? 1 : 2;
	return k;
}

/* One ordered pair of different devices. A pair the runtime cannot answer
 * for has no peer access (its copies stage through host memory). */
static void peer_pair(struct ts_topology *t, hwloc_topology_t topo,
                      const struct ts_device_set *set, const enum ts_link_kind *sim_links,
                      size_t nsim, size_t i, size_t j)
{
	const struct ts_topology_device *a = &t->dev[t->peer_dev[i]], *b = &t->dev[t->peer_dev[j]];
	struct ts_device *da = ts_device_set_at(set, t->peer_dev[i]);
	struct ts_device *db = ts_device_set_at(set, t->peer_dev[j]);
	const struct ts_device_props *pa = ts_device_props(da), *pb = ts_device_props(db);
	struct ts_topology_peer *p = &t->peer[i * t->npeer + j];
	struct ts_peer_caps caps;
	struct ts_error ignore;

	p->link = numa_link(a, b);
	if (pa->backend == TS_BACKEND_CUDA && pb->backend == TS_BACKEND_CUDA) {
		enum ts_link_kind k = pci_link(topo, pa->pci_bus_id, pb->pci_bus_id);

		ts_error_clear(&ignore);
		if (ts_device_peer_caps(da, db, &caps, &ignore) != TS_OK)
			memset(&caps, 0, sizeof caps);
		p->access = caps.access;
		p->perf_rank = caps.perf_rank;
		p->native_atomics = caps.native_atomics;
		if (k != TS_LINK_KIND_COUNT)
			p->link = k;
		if (nvlink_between(topo, pa->pci_bus_id, pb->pci_bus_id))
			p->link = TS_LINK_NVLINK;
	} else if (pa->backend == TS_BACKEND_SIM && pb->backend == TS_BACKEND_SIM &&
	           (size_t)pa->ordinal < nsim && (size_t)pb->ordinal < nsim) {
		enum ts_link_kind k = sim_links[(size_t)pa->ordinal * nsim + (size_t)pb->ordinal];

		p->access = k != TS_LINK_KIND_COUNT;
		if (p->access && k != TS_LINK_UNKNOWN) {
			p->link = sim_rank_link(k, &p->perf_rank);
			p->native_atomics = k == TS_LINK_NVLINK;
		}
	}
}

static ts_status build_peers(struct ts_topology *t, hwloc_topology_t topo,
                             const struct ts_topology_config *cfg,
                             const struct ts_device_set *set, struct ts_error *err)
{
	size_t nsim = 0;
	enum ts_link_kind *sim_links = NULL;
	ts_status st = TS_OK;

	t->peer_dev = calloc(t->ndev ? t->ndev : 1, sizeof *t->peer_dev);
	if (!t->peer_dev)
		return ts_error_oom(err, "no memory for the peer matrix");
	for (size_t i = 0; i < t->ndev; i++) {
		enum ts_backend_kind k = ts_device_props(ts_device_set_at(set, i))->backend;

		if (k != TS_BACKEND_CPU)
			t->peer_dev[t->npeer++] = i;
		nsim += k == TS_BACKEND_SIM;
	}
	t->peer = calloc(t->npeer ? t->npeer * t->npeer : 1, sizeof *t->peer);
	sim_links = calloc(nsim ? nsim * nsim : 1, sizeof *sim_links);
	if (!t->peer || !sim_links) {
		free(sim_links);
		return ts_error_oom(err, "no memory for the peer matrix of %zu devices", t->npeer);
	}
	st = ts_topology_parse_links(cfg->sim_peer_links, nsim, sim_links, err);
	for (size_t i = 0; st == TS_OK && i < t->npeer; i++)
		for (size_t j = 0; j < t->npeer; j++) {
			if (i == j)
				t->peer[i * t->npeer + j] = (struct ts_topology_peer){
				        .access = true, .native_atomics = true, .link = TS_LINK_SELF};
			else
				peer_pair(t, topo, set, sim_links, nsim, i, j);
		}
	free(sim_links);
	return st;
}

/* ---- binding threads to CPUs --------------------------------------------- */

/* Appends to a fixed buffer, cutting what does not fit. */
static void say(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void say(char *buf, size_t cap, const char *fmt, ...)
{
	size_t len = strnlen(buf, cap);
	va_list ap;

	if (len + 1 >= cap)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + len, cap - len, fmt, ap);
	va_end(ap);
}

/* Why nothing is bound where the decision binds something, or NULL: it is
 * applied. */
static const char *not_applied(const struct ts_topology *t, bool machine)
{
	const struct hwloc_topology_support *s = t->hw ? hwloc_topology_get_support(t->hw) : NULL;

	if (!machine)
		return "from a file, not this machine";
	if (!s || !s->cpubind || !s->cpubind->set_thread_cpubind)
		return "hwloc cannot bind threads here";
	return NULL;
}

/* One device's decision (topology.h's ts_topology_cpubind). */
static void decide_cpubind(struct ts_topology *t, size_t i, enum ts_backend_kind backend,
                           hwloc_const_bitmap_t all, bool machine)
{
	struct ts_topology_device *d = &t->dev[i];
	struct ts_topology_cpubind *b = &d->cpubind;
	hwloc_bitmap_t cpus = t->dev_cpus[i];
	int nlocal = cpus ? hwloc_bitmap_weight(cpus) : 0;
	int nall = hwloc_bitmap_weight(all), outside = 0;
	const char *why_not = not_applied(t, machine);

	b->reason[0] = '\0';
	if (cpus) {
		hwloc_bitmap_t rest = hwloc_bitmap_alloc();

		if (rest && hwloc_bitmap_andnot(rest, all, cpus) == 0)
			outside = hwloc_bitmap_weight(rest);
		hwloc_bitmap_free(rest);
	}
	if (backend == TS_BACKEND_CUDA) {
		say(b->reason, sizeof b->reason, "a CUDA GPU's copies run on its copy engines, fed "
		    "by streams, and its kernels on the GPU: no thread of its own to bind");
		return;
	}
	if (nlocal <= 0) {
		say(b->reason, sizeof b->reason, "local CPUs unknown: its threads run on any CPU");
		return;
	}
	b->copy_threads = true;
	b->cpu_kernels = nlocal >= TS_CPUBIND_TEAM_MIN && outside > 0;
	if (b->cpu_kernels)
		say(b->reason, sizeof b->reason, "copy threads and the CPU kernels' team (%d "
		    "threads) on its local CPUs %s; %d of the node's %d CPUs left outside the team "
		    "for the HTTP workers", nlocal, d->local_cpus, outside, nall);
	else if (outside == 0)
		say(b->reason, sizeof b->reason, "copy threads on its local CPUs %s; not the CPU "
		    "kernels' team: those are all the node's %d CPUs, none would be left outside "
		    "it for the HTTP workers, so it keeps one thread per CPU of the process",
		    d->local_cpus, nall);
	else
		say(b->reason, sizeof b->reason, "copy threads on its local CPUs %s; not the CPU "
		    "kernels' team: %d local CPU%s, fewer than %d", d->local_cpus, nlocal,
		    nlocal == 1 ? "" : "s", TS_CPUBIND_TEAM_MIN);
	b->applied = why_not == NULL;
	if (why_not)
		say(b->reason, sizeof b->reason, "; nothing bound: the topology is %s", why_not);
}

static ts_status decide_all(struct ts_topology *t, hwloc_topology_t topo,
                            const struct ts_device_set *set, bool machine,
                            struct ts_error *err)
{
	hwloc_const_bitmap_t all = hwloc_topology_get_topology_cpuset(topo);

	t->dev_cpus = calloc(t->ndev ? t->ndev : 1, sizeof *t->dev_cpus);
	if (!t->dev_cpus)
		return ts_error_oom(err, "no memory for the CPU sets of %zu devices", t->ndev);
	for (size_t i = 0; i < t->ndev; i++) {
		const char *list = t->dev[i].local_cpus;

		if (list[0]) {
			t->dev_cpus[i] = hwloc_bitmap_alloc();
			if (!t->dev_cpus[i])
				return ts_error_oom(err, "no memory for the CPU set of %s", t->dev[i].id);
			if (hwloc_bitmap_list_sscanf(t->dev_cpus[i], list) < 0 ||
			    hwloc_bitmap_iszero(t->dev_cpus[i])) {
				hwloc_bitmap_free(t->dev_cpus[i]);
				t->dev_cpus[i] = NULL;
			}
		}
		decide_cpubind(t, i, ts_device_props(ts_device_set_at(set, i))->backend, all,
		               machine);
	}
	return TS_OK;
}

static size_t dev_index(const struct ts_topology *t, const char *id)
{
	size_t i = 0;

	while (id && i < t->ndev && strcmp(t->dev[i].id, id) != 0)
		i++;
	return id ? i : t->ndev;
}

bool ts_topology_bind_cpus(const struct ts_topology *t, const char *id, enum ts_cpubind_use use,
                           pthread_t th)
{
	size_t i = t ? dev_index(t, id) : 0;
	const struct ts_topology_cpubind *b;

	if (!t || i == t->ndev || !t->hw || !t->dev_cpus[i])
		return false;
	b = &t->dev[i].cpubind;
	if (!b->applied || !(use == TS_CPUBIND_COPY ? b->copy_threads : b->cpu_kernels))
		return false;
	return hwloc_set_thread_cpubind(t->hw, th, t->dev_cpus[i], HWLOC_CPUBIND_THREAD) == 0;
}

int ts_topology_kernel_threads(const struct ts_topology *t, const char *id)
{
	size_t i = t ? dev_index(t, id) : 0;

	if (!t || i == t->ndev || !t->dev_cpus[i] || !t->dev[i].cpubind.applied ||
	    !t->dev[i].cpubind.cpu_kernels)
		return 0;
	return hwloc_bitmap_weight(t->dev_cpus[i]);
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
	if (st == TS_OK)
		st = build_peers(t, topo, cfg, set, err);
	if (st == TS_OK && !xml)
		t->hw = topo;     /* this machine: memory and threads can be bound */
	if (st == TS_OK)
		st = decide_all(t, topo, set, !xml, err);
	if (!t->hw)
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
	for (size_t i = 0; t->dev_cpus && i < t->ndev; i++)
		hwloc_bitmap_free(t->dev_cpus[i]);
	free(t->dev_cpus);
	free(t->dev);
	free(t->peer_dev);
	free(t->peer);
	if (t->hw)
		hwloc_topology_destroy(t->hw);
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

size_t ts_topology_peer_count(const struct ts_topology *t)
{
	return t->npeer;
}

const char *ts_topology_peer_id(const struct ts_topology *t, size_t i)
{
	return i < t->npeer ? t->dev[t->peer_dev[i]].id : NULL;
}

const struct ts_topology_peer *ts_topology_peer_at(const struct ts_topology *t, size_t i,
                                                   size_t j)
{
	return i < t->npeer && j < t->npeer ? &t->peer[i * t->npeer + j] : NULL;
}

static size_t peer_index(const struct ts_topology *t, const char *id)
{
	size_t i = 0;

	while (i < t->npeer && strcmp(t->dev[t->peer_dev[i]].id, id) != 0)
		i++;
	return i;
}

const struct ts_topology_peer *ts_topology_peer_find(const struct ts_topology *t,
                                                     const char *src, const char *dst)
{
	if (!t || !src || !dst)
		return NULL;
	return ts_topology_peer_at(t, peer_index(t, src), peer_index(t, dst));
}

char *ts_topology_matrix_text(const struct ts_topology *t)
{
	struct ts_textbuf b;
	char cell[16];
	int w = 8;

	ts_textbuf_init(&b);
	for (size_t i = 0; i < t->npeer; i++)
		if ((int)strlen(ts_topology_peer_id(t, i)) + 2 > w)
			w = (int)strlen(ts_topology_peer_id(t, i)) + 2;
	ts_textbuf_printf(&b, "%-*s", w, "");
	for (size_t j = 0; j < t->npeer; j++)
		ts_textbuf_printf(&b, "%-*s", w, ts_topology_peer_id(t, j));
	ts_textbuf_printf(&b, "%-*s%s\n", w, "NUMA", "CPU affinity");
	for (size_t i = 0; i < t->npeer; i++) {
		const struct ts_topology_device *d = &t->dev[t->peer_dev[i]];

		ts_textbuf_printf(&b, "%-*s", w, d->id);
		for (size_t j = 0; j < t->npeer; j++) {
			const struct ts_topology_peer *p = &t->peer[i * t->npeer + j];

			snprintf(cell, sizeof cell, "%s%s", ts_link_abbrev(p->link), p->access ? "" : "*");
			ts_textbuf_printf(&b, "%-*s", w, cell);
		}
		if (d->numa_node >= 0)
			snprintf(cell, sizeof cell, "%d", d->numa_node);
		else
			snprintf(cell, sizeof cell, "N/A");
		ts_textbuf_printf(&b, "%-*s%s\n", w, cell, d->local_cpus[0] ? d->local_cpus : "N/A");
	}
	ts_textbuf_puts(&b, "\nLegend:\n");
	for (int k = 0; k < TS_LINK_KIND_COUNT; k++)
		ts_textbuf_printf(&b, "  %-5s = %s\n", link_names[k].abbrev, link_names[k].legend);
	ts_textbuf_puts(&b, "  *     = no peer access: copies stage through pinned host memory\n");
	return ts_textbuf_take(&b, NULL);
}

/* One group of --sim-peer-links ("0-1-2:nvlink") into links. */
static ts_status parse_group(const char *all, const char *g, size_t glen, size_t nsim,
                             enum ts_link_kind *links, struct ts_error *err)
{
	static const struct {
		const char *name;
		enum ts_link_kind k;
	} kinds[] = {{"nvlink", TS_LINK_NVLINK},
	             {"pcie_switch", TS_LINK_PCIE_SWITCH},
	             {"host_bridge", TS_LINK_HOST_BRIDGE}};
	size_t member[64], n = 0;
	const char *p = g, *end = g + glen, *colon = memchr(g, ':', glen);
	enum ts_link_kind kind = TS_LINK_NVLINK;

	if (colon) {
		size_t k = 0, klen = (size_t)(end - colon - 1);

		while (k < sizeof kinds / sizeof kinds[0] &&
		       (strlen(kinds[k].name) != klen || strncmp(kinds[k].name, colon + 1, klen)))
			k++;
		if (k == sizeof kinds / sizeof kinds[0])
			return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_PEER_LINKS",
			                    "--sim-peer-links '%s': link kind '%.*s' is none of nvlink, "
			                    "pcie_switch, host_bridge", all, (int)klen, colon + 1);
		kind = kinds[k].k;
		end = colon;
	}
	while (p < end) {
		size_t v = 0;
		const char *q = p;

		while (q < end && *q >= '0' && *q <= '9' && v < 100000)
			v = v * 10 + (size_t)(*q++ - '0');
		if (q == p || (q < end && *q != '-') || (q < end && q + 1 == end) ||
		    n == sizeof member / sizeof member[0])
			return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_PEER_LINKS",
			                    "--sim-peer-links '%s' is not all, none or a list of groups "
			                    "of sim device ordinals such as 0-1-2-3:nvlink,4-5", all);
		if (v >= nsim)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_PEER_LINKS",
			                    "--sim-peer-links '%s' names sim:%zu; there are %zu sim "
			                    "devices", all, v, nsim);
		member[n++] = v;
		p = q < end ? q + 1 : q;
	}
	if (n < 2)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_PEER_LINKS",
		                    "--sim-peer-links '%s': a group needs two devices or more", all);
	for (size_t a = 0; a < n; a++)
		for (size_t b = 0; b < n; b++) {
			enum ts_link_kind *l = &links[member[a] * nsim + member[b]];

			if (a == b)
				continue;
			if (member[a] == member[b] || *l != TS_LINK_KIND_COUNT)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_PEER_LINKS",
				                    "--sim-peer-links '%s' links sim:%zu and sim:%zu "
				                    "twice", all, member[a], member[b]);
			*l = kind;
		}
	return TS_OK;
}

ts_status ts_topology_parse_links(const char *s, size_t nsim, enum ts_link_kind *links,
                                  struct ts_error *err)
{
	bool all = !s || !s[0] || strcmp(s, "all") == 0;

	for (size_t i = 0; i < nsim; i++)
		for (size_t j = 0; j < nsim; j++)
			links[i * nsim + j] = i == j ? TS_LINK_SELF
			                      : all  ? TS_LINK_UNKNOWN
			                             : TS_LINK_KIND_COUNT;
	if (all || strcmp(s, "none") == 0)
		return TS_OK;
	for (const char *p = s; *p;) {
		const char *comma = strchr(p, ',');
		size_t glen = comma ? (size_t)(comma - p) : strlen(p);
		ts_status st = parse_group(s, p, glen, nsim, links, err);

		if (st != TS_OK)
			return st;
		if (comma && !comma[1])
			return ts_error_set(err, TS_INVALID_ARGUMENT, "SIM_PEER_LINKS",
			                    "--sim-peer-links '%s' ends with a comma", s);
		p = comma ? comma + 1 : p + glen;
	}
	return TS_OK;
}

/* ---- binding memory to NUMA nodes ----------------------------------------- */

bool ts_topology_can_bind(const struct ts_topology *t)
{
	const struct hwloc_topology_support *s;

	if (!t || !t->hw)
		return false;
	s = hwloc_topology_get_support(t->hw);
	return s && s->membind && s->membind->set_area_membind && s->membind->set_thisthread_membind &&
	       s->membind->bind_membind;
}

/* The nodeset of the NUMA node with OS index node (new), or NULL. */
static hwloc_bitmap_t nodeset_of(const struct ts_topology *t, int node)
{
	hwloc_bitmap_t set;

	if (!ts_topology_can_bind(t) || node < 0 || !numa_find(t, node))
		return NULL;
	set = hwloc_bitmap_alloc();
	if (set)
		hwloc_bitmap_only(set, (unsigned)node);
	return set;
}

bool ts_topology_bind_area(const struct ts_topology *t, void *p, size_t len, int node)
{
	hwloc_bitmap_t set = nodeset_of(t, node);
	bool ok = set && hwloc_set_area_membind(t->hw, p, len, set, HWLOC_MEMBIND_BIND,
	                                        HWLOC_MEMBIND_BYNODESET) == 0;

	hwloc_bitmap_free(set);
	return ok;
}

bool ts_topology_bind_thread(const struct ts_topology *t, int node)
{
	hwloc_bitmap_t set = nodeset_of(t, node);
	bool ok = set && hwloc_set_membind(t->hw, set, HWLOC_MEMBIND_BIND,
	                                   HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) == 0;

	hwloc_bitmap_free(set);
	return ok;
}

void ts_topology_unbind_thread(const struct ts_topology *t)
{
	hwloc_bitmap_t all;

	if (!ts_topology_can_bind(t))
		return;
	all = hwloc_bitmap_dup(hwloc_topology_get_topology_nodeset(t->hw));
	if (all && hwloc_set_membind(t->hw, all, HWLOC_MEMBIND_DEFAULT,
	                             HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) != 0)
		errno = 0;
	hwloc_bitmap_free(all);
}

int ts_topology_area_binding(const struct ts_topology *t, const void *p, size_t len)
{
	hwloc_bitmap_t set;
	hwloc_membind_policy_t policy;
	int node = -1;

	if (!t || !t->hw || !(set = hwloc_bitmap_alloc()))
		return -1;
	if (hwloc_get_area_membind(t->hw, p, len, set, &policy, HWLOC_MEMBIND_BYNODESET) == 0 &&
	    policy == HWLOC_MEMBIND_BIND && hwloc_bitmap_weight(set) == 1)
		node = hwloc_bitmap_first(set);
	hwloc_bitmap_free(set);
	return node;
}

int ts_topology_node_of(const struct ts_topology *t, const void *p, size_t len)
{
	hwloc_bitmap_t set;
	int node = -1;

	if (!t || !t->hw || !(set = hwloc_bitmap_alloc()))
		return -1;
	if (hwloc_get_area_memlocation(t->hw, p, len, set, HWLOC_MEMBIND_BYNODESET) == 0 &&
	    hwloc_bitmap_weight(set) == 1)
		node = hwloc_bitmap_first(set);
	hwloc_bitmap_free(set);
	return node;
}
