/*
 * bench_topology.c - what topology discovery adds to a start: this
 * machine's hwloc topology loaded and every device placed, as tstaged does
 * (CUDA devices when there are, whose placement needs the PCI scan; two sim
 * devices). The row is the slowest of several discoveries; the target is
 * 50 ms. Against the two-socket XML of tests/data too, when run from the
 * checkout's root.
 *
 * And what NUMA locality buys: on a machine with two NUMA nodes or more, a
 * thread on node 0's CPUs copies from memory bound to node 0 (a local
 * pinned pool: what a device's staging reads on sim) and from memory bound
 * to the farthest other node, into a buffer on node 0 (best of several
 * 256 MiB copies each); the row is local over far (target >= 1.3). With one
 * NUMA node there is no far memory: the row says so and is not a finding.
 */
#include <hwloc.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/device.h"
#include "device/topology.h"
#include "tests/bench/benchlib.h"

#define RUNS 5
#define TARGET_MS 50.0

/* The slowest of RUNS discoveries from xml (NULL: this machine), in ms; -1
 * when one fails. */
static double slowest(const struct ts_device_set *set, const char *xml)
{
	double worst = 0;

	for (int i = 0; i < RUNS; i++) {
		struct ts_topology *t = NULL;
		struct ts_error err;
		double ms;

		ts_error_clear(&err);
		if (ts_topology_new(&(struct ts_topology_config){.xml_file = xml}, set, &t, &err) !=
		    TS_OK) {
			fprintf(stderr, "bench_topology: %s\n", err.message);
			return -1;
		}
		ms = (double)ts_topology_discovery_ns(t) / 1e6;
		worst = ms > worst ? ms : worst;
		ts_topology_free(t);
	}
	return worst;
}

static int row(const char *name, double ms)
{
	char v[32], tgt[32];

	if (ms < 0)
		return 1;
	snprintf(v, sizeof v, "%.1f ms", ms);
	snprintf(tgt, sizeof tgt, "< %.0f ms", TARGET_MS);
	bench_row(name, v, NULL, NAN, tgt, true, ms < TARGET_MS);
	return 0;
}

#define COPY_BYTES (256u << 20)
#define COPY_RUNS 5

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Bytes per second of the best of COPY_RUNS copies of src into dst. */
static double copy_rate(void *dst, const void *src)
{
	double best = INFINITY;

	memcpy(dst, src, COPY_BYTES);   /* first touch of dst, warm caches and TLB */
	for (int i = 0; i < COPY_RUNS; i++) {
		double t0 = now_s();

		memcpy(dst, src, COPY_BYTES);
		best = fmin(best, now_s() - t0);
	}
	return (double)COPY_BYTES / best;
}

/* Memory of COPY_BYTES bound to NUMA node `node`, touched; NULL on failure. */
static void *on_node(hwloc_topology_t t, hwloc_obj_t node)
{
	void *p = hwloc_alloc_membind(t, COPY_BYTES, node->nodeset, HWLOC_MEMBIND_BIND,
	                              HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);

	if (p)
		memset(p, 1, COPY_BYTES);
	return p;
}

/* The local-over-far row; 0, or 1 when the machine has two nodes and the
 * copies could not be made. */
static int numa_row(void)
{
	hwloc_topology_t t;
	hwloc_obj_t near, far;
	void *dst = NULL, *local = NULL, *remote = NULL;
	char v[64], ref[64];
	double r_local, r_far;
	int nodes, rc = 1;

	if (hwloc_topology_init(&t) != 0)
		return 1;
	if (hwloc_topology_load(t) != 0) {
		hwloc_topology_destroy(t);
		return 1;
	}
	nodes = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
	if (nodes < 2) {
		bench_row("topology: copy from local / far pool", "one NUMA node",
		          "not measurable here", NAN, ">= 1.3", false, true);
		hwloc_topology_destroy(t);
		return 0;
	}
	near = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, 0);
	far = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, (unsigned)nodes - 1);
	if (hwloc_set_cpubind(t, near->cpuset, HWLOC_CPUBIND_THREAD) == 0 &&
	    (dst = on_node(t, near)) != NULL && (local = on_node(t, near)) != NULL &&
	    (remote = on_node(t, far)) != NULL) {
		r_local = copy_rate(dst, local);
		r_far = copy_rate(dst, remote);
		snprintf(v, sizeof v, "%.2f GB/s", r_local / 1e9);
		snprintf(ref, sizeof ref, "%.2f GB/s from node %u", r_far / 1e9, far->os_index);
		bench_row("topology: copy from local / far pool", v, ref, r_local / r_far, ">= 1.3",
		          true, r_local / r_far >= 1.3);
		rc = 0;
	} else {
		fprintf(stderr, "bench_topology: cannot bind memory or the thread to NUMA nodes\n");
	}
	if (dst)
		hwloc_free(t, dst, COPY_BYTES);
	if (local)
		hwloc_free(t, local, COPY_BYTES);
	if (remote)
		hwloc_free(t, remote, COPY_BYTES);
	hwloc_topology_destroy(t);
	return rc;
}

int main(void)
{
	struct ts_device_config cfg = {.sim_devices = 2, .sim_device_memory = 1 << 20,
	                               .cuda = true};
	struct ts_device_set *set = NULL;
	struct ts_error err;
	int rc = 0;

	ts_error_clear(&err);
	if (ts_device_set_new(&cfg, &set, &err) != TS_OK) {
		fprintf(stderr, "bench_topology: %s\n", err.message);
		return 1;
	}
	rc |= row("topology: discovery, this machine", slowest(set, NULL));
	if (access("tests/data/two_socket.xml", R_OK) == 0)
		rc |= row("topology: discovery, two-socket XML", slowest(set, "tests/data/two_socket.xml"));
	ts_device_set_free(set);
	rc |= numa_row();
	return rc;
}
