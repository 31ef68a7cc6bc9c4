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
 * The peer matrix covers the accelerators (CUDA and sim devices, not the
 * host's cpu:0), in the set's order: for every ordered pair, whether the
 * first may access the second's memory directly, how well (CUDA's
 * performance rank, native atomics) and the kind of link between them.
 * CUDA pairs are asked of the runtime (ts_device_peer_caps; a pair it
 * cannot answer for has no access), and their link read from hwloc's PCI
 * tree: a PCIe switch above both, their host bridge, or the NUMA nodes they
 * hang off; NVLink is not visible there. Sim pairs
 * come from --sim-peer-links (ts_topology_parse_links); pairs of two
 * backends never have peer access.
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

#include <pthread.h>
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

/*
 * Where a device's host threads run, decided for every device at
 * ts_topology_new whether or not it can be applied:
 *   - copy_threads: the worker of each of its host queues (sim and cpu
 *     devices: they run its copies, staging copies included, and its
 *     kernels' jobs) is bound to its local CPUs, where these are known. A
 *     CUDA GPU's copies are its copy engines' work, fed by streams, with no
 *     thread of tstage's to bind;
 *   - cpu_kernels: the team of threads of the CPU kernels of a model on it
 *     (sim and cpu devices) is bound there too, one thread per local CPU,
 *     only where the local CPUs are at least TS_CPUBIND_TEAM_MIN and leave
 *     at least one of the node's CPUs outside them: a team bound to every
 *     CPU would leave the HTTP workers none that no kernel thread takes (a
 *     team not bound keeps one thread per CPU of the process, as before).
 * applied: the decision is carried out, on a topology of this machine whose
 * hwloc can bind threads; from a file (which may describe another machine)
 * it is made and reported, and nothing is bound. reason says all of it.
 */
#define TS_CPUBIND_TEAM_MIN 2

struct ts_topology_cpubind {
	bool copy_threads;
	bool cpu_kernels;
	bool applied;
	char reason[384];
};

struct ts_topology_device {
	char id[32];              /* as ts_device_props' id */
	int numa_node;            /* OS index, or -1: unknown */
	char local_cpus[TS_TOPOLOGY_CPUSET_MAX]; /* "" when unknown */
	struct ts_topology_cpubind cpubind;
};

/* How two devices are connected, best first, as nvidia-smi topo -m names
 * them (ts_link_abbrev). */
enum ts_link_kind {
	TS_LINK_SELF = 0,         /* "X": the device itself */
	TS_LINK_NVLINK,           /* "NV": a direct NVLink (sim only: not visible to hwloc) */
	TS_LINK_PCIE_SWITCH,      /* "PIX": a PCIe switch (PCI-PCI bridge) above both */
	TS_LINK_HOST_BRIDGE,      /* "PHB": the same PCIe host bridge */
	TS_LINK_NUMA_NODE,        /* "NODE": host bridges of the same NUMA node */
	TS_LINK_CROSS_SOCKET,     /* "SYS": NUMA nodes apart (the inter-socket link) */
	TS_LINK_UNKNOWN,          /* "?": a device whose place is unknown */
	TS_LINK_KIND_COUNT
};

/* "self", "nvlink", "pcie_switch", "host_bridge", "numa_node",
 * "cross_socket", "unknown". */
const char *ts_link_name(enum ts_link_kind k);
/* "X", "NV", "PIX", "PHB", "NODE", "SYS", "?". */
const char *ts_link_abbrev(enum ts_link_kind k);

/* One ordered pair of the peer matrix: may row access column's memory. */
struct ts_topology_peer {
	bool access;              /* peer access possible (true on the diagonal) */
	int perf_rank;            /* lower is better; 0 without access */
	bool native_atomics;
	enum ts_link_kind link;
};

struct ts_topology_config {
	const char *xml_file;     /* NULL or "": this machine */
	const char *sim_peer_links; /* --sim-peer-links; NULL or "": every sim pair */
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
 * The peer matrix: its devices (ids borrowed, the set's order, no cpu
 * device) and the pair (row i accessing column j); NULL out of range.
 */
size_t ts_topology_peer_count(const struct ts_topology *t);
const char *ts_topology_peer_id(const struct ts_topology *t, size_t i);
const struct ts_topology_peer *ts_topology_peer_at(const struct ts_topology *t, size_t i,
                                                   size_t j);

/* The pair of the devices with these ids (src accessing dst), or NULL when
 * either is not in the matrix (borrowed). */
const struct ts_topology_peer *ts_topology_peer_find(const struct ts_topology *t,
                                                     const char *src, const char *dst);

/*
 * The matrix as nvidia-smi topo -m prints it: a header row of device ids,
 * one row per device with the link abbreviation of each pair ("*" after
 * it where peer access is impossible), the device's NUMA node and local
 * CPUs, then the legend. Returns a new string (free), or NULL when out of
 * memory.
 */
char *ts_topology_matrix_text(const struct ts_topology *t);

/*
 * Binding memory to a NUMA node (OS index), for pools local to their
 * devices: only a topology of this machine whose hwloc can bind (never one
 * from a file, which may describe another machine); false when it cannot or
 * the call fails, and nothing is bound then. bind_area binds the pages of
 * [p, p + len) not yet touched; bind_thread makes the calling thread's
 * later allocations (those the CUDA driver pins at once) come from node,
 * until unbind_thread. node_of is the node holding all of [p, p + len)'s
 * touched pages, or -1 (several, none, or unknown). Thread-safe.
 */
bool ts_topology_can_bind(const struct ts_topology *t);
bool ts_topology_bind_area(const struct ts_topology *t, void *p, size_t len, int node);
bool ts_topology_bind_thread(const struct ts_topology *t, int node);
void ts_topology_unbind_thread(const struct ts_topology *t);
int ts_topology_node_of(const struct ts_topology *t, const void *p, size_t len);
/* The node [p, p + len) is bound to (a BIND policy to one node, as
 * get_mempolicy reads it), or -1. */
int ts_topology_area_binding(const struct ts_topology *t, const void *p, size_t len);

/* The threads ts_topology_bind_cpus binds (see ts_topology_cpubind). */
enum ts_cpubind_use {
	TS_CPUBIND_COPY,          /* a host queue's worker */
	TS_CPUBIND_KERNELS,       /* a helper of the CPU kernels' team */
};

/*
 * Binds thread th (hwloc_set_thread_cpubind) to the local CPUs of the
 * device with this id, where its decision binds threads of that use and is
 * applied; true when th was bound. t may be NULL (false). Thread-safe.
 */
bool ts_topology_bind_cpus(const struct ts_topology *t, const char *id, enum ts_cpubind_use use,
                           pthread_t th);

/* The threads of a CPU kernels' team bound to the device's local CPUs (one
 * per CPU), or 0 when its team is not bound (t NULL, the decision, or not
 * applied). */
int ts_topology_kernel_threads(const struct ts_topology *t, const char *id);

/*
 * Parses --sim-numa-nodes: comma-separated non-negative integers ("0,0,1,1").
 * Writes at most cap of them to out and their count to *n. INVALID_ARGUMENT
 * (reason SIM_NUMA_NODES) on anything else or more than cap.
 */
ts_status ts_topology_parse_list(const char *s, int *out, size_t cap, size_t *n,
                                 struct ts_error *err);

/*
 * --sim-peer-links, which pairs of sim devices (by ordinal) have peer
 * access: "all" (every pair, the default), "none", or a comma-separated
 * list of groups "0-1-2-3", each optionally ":nvlink" (the default),
 * ":pcie_switch" or ":host_bridge": every pair inside a group is linked
 * that way, both directions; a pair in two groups is refused. Pairs outside
 * every group have no peer access. Performance rank by kind (nvlink 0,
 * pcie_switch 1, host_bridge 2), native atomics over NVLink only.
 * Checked against nsim sim devices; INVALID_ARGUMENT (reason
 * SIM_PEER_LINKS) names what is wrong. Writes the links of the nsim x nsim
 * pairs into links (row-major): TS_LINK_SELF on the diagonal,
 * TS_LINK_KIND_COUNT for no peer access, TS_LINK_UNKNOWN for access over a
 * link the flag does not name ("all": the NUMA placement tells it).
 */
ts_status ts_topology_parse_links(const char *s, size_t nsim, enum ts_link_kind *links,
                                  struct ts_error *err);

#endif
