/*
 * test_topology.c - Check suite "topology": NUMA nodes and device placement
 * from hwloc, against the XML files of a one-socket and a two-socket node
 * (tests/data, read relative to the checkout: run from its root, or set
 * TS_TEST_DATA) and against this machine; bad --sim-numa-nodes lists and
 * unreadable files refused; the peer matrix of sim devices from
 * --sim-peer-links and their NUMA placement, and its text. Case "cuda"
 * places the CUDA GPUs of this machine by PCI bus id in the two-socket
 * file: a GPU whose bus id the file holds must sit on that GPU's socket,
 * any other is unknown; their peer matrix is what the runtime answers, with
 * links read from the file's PCI tree, and, where TS_TEST_PEER_GROUPS names
 * the groups of GPUs that can reach each other (--sim-peer-links' syntax,
 * by CUDA ordinal), exactly those pairs have access (tests/gpu/fakecuda.sh
 * runs it with the file's eight bus ids and two groups of four). The
 * binding of each device's threads to CPUs: decided from both files
 * (never applied: they are not this machine) and applied on this one,
 * where a queue worker started from a thread bound to one CPU must run on
 * its device's local CPUs instead.
 */
#include <check.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device/device.h"
#include "device/topology.h"
#include "tests/unit/unit.h"

/* The refusal's reason, for a topology that must not load. */
static const char *refusal(const char *xml, const struct ts_device_set *set, const int *numa,
                           size_t n, struct ts_error *err)
{
	struct ts_topology *t = NULL;

	ts_error_clear(err);
	ck_assert_int_eq(ts_topology_new(&(struct ts_topology_config){.xml_file = xml,
	                                                              .sim_numa_nodes = numa,
	                                                              .sim_numa_count = n},
	                                 set, &t, err),
	                 TS_INVALID_ARGUMENT);
	ck_assert_ptr_null(t);
	return err->reason;
}

static void check_device(const struct ts_topology *t, const char *id, int numa,
                         const char *cpus)
{
	const struct ts_topology_device *d = ts_topology_device_find(t, id);

	ck_assert_msg(d != NULL, "no placement for '%s'", id);
	ck_assert_int_eq(d->numa_node, numa);
	ck_assert_str_eq(d->local_cpus, cpus);
}

static void check_bind(const struct ts_topology *t, const char *id, bool copy, bool kernels,
                       bool applied, const char *why)
{
	const struct ts_topology_device *d = ts_topology_device_find(t, id);

	ck_assert_msg(d != NULL, "no placement for '%s'", id);
	ck_assert_msg(d->cpubind.copy_threads == copy && d->cpubind.cpu_kernels == kernels &&
	                      d->cpubind.applied == applied,
	              "%s: copy %d kernels %d applied %d: %s", id, d->cpubind.copy_threads,
	              d->cpubind.cpu_kernels, d->cpubind.applied, d->cpubind.reason);
	ck_assert_msg(strstr(d->cpubind.reason, why), "%s: '%s' lacks '%s'", id,
	              d->cpubind.reason, why);
}

START_TEST(test_two_socket_places_sim_devices_by_list)
{
	struct ts_device_set *set = ts_unit_sims(4);
	static const int numa[] = {0, 0, 1, 1};
	const char *xml = ts_unit_data("two_socket.xml");
	struct ts_topology *t = ts_unit_topology(xml, set, numa, 4, NULL);
	const struct ts_topology_numa *n0 = ts_topology_numa_at(t, 0), *n1 = ts_topology_numa_at(t, 1);

	ck_assert_str_eq(ts_topology_source(t), xml);
	ck_assert_uint_eq(ts_topology_numa_count(t), 2);
	ck_assert_int_eq(n0->index, 0);
	ck_assert_int_eq(n1->index, 1);
	ck_assert_uint_eq(n0->memory, 64000000000ull);
	ck_assert_uint_eq(n1->memory, 64000000000ull);
	ck_assert_str_eq(n0->cpuset, "0-7");
	ck_assert_str_eq(n1->cpuset, "8-15");
	ck_assert_ptr_null(ts_topology_numa_at(t, 2));
	/* sim:0..3 then cpu:0, in the set's order */
	ck_assert_uint_eq(ts_topology_device_count(t), ts_device_set_count(set));
	ck_assert_str_eq(ts_topology_device_at(t, 0)->id, "sim:0");
	check_device(t, "sim:0", 0, "0-7");
	check_device(t, "sim:1", 0, "0-7");
	check_device(t, "sim:2", 1, "8-15");
	check_device(t, "sim:3", 1, "8-15");
	/* the host spans both nodes: no NUMA node of its own, every CPU */
	check_device(t, "cpu:0", -1, "0-15");
	ck_assert_ptr_null(ts_topology_device_find(t, "sim:4"));
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_two_socket_without_list_leaves_sim_devices_unknown)
{
	struct ts_device_set *set = ts_unit_sims(2);
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("two_socket.xml"), set, NULL, 0, NULL);

	check_device(t, "sim:0", -1, "");
	check_device(t, "sim:1", -1, "");
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_one_socket_puts_every_device_on_its_node)
{
	struct ts_device_set *set = ts_unit_sims(2);
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("one_socket.xml"), set, NULL, 0, NULL);
	const struct ts_topology_numa *n0 = ts_topology_numa_at(t, 0);

	ck_assert_uint_eq(ts_topology_numa_count(t), 1);
	ck_assert_int_eq(n0->index, 0);
	ck_assert_uint_eq(n0->memory, 32000000000ull);
	ck_assert_str_eq(n0->cpuset, "0-15");
	check_device(t, "sim:0", 0, "0-15");
	check_device(t, "sim:1", 0, "0-15");
	check_device(t, "cpu:0", 0, "0-15");
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_this_machine)
{
	struct ts_device_set *set = ts_unit_sims(2);
	static const int numa[] = {0, 0};
	struct ts_topology *t = ts_unit_topology(NULL, set, NULL, 0, NULL), *t2;
	size_t n = ts_topology_numa_count(t);

	ck_assert_str_eq(ts_topology_source(t), "machine");
	ck_assert_uint_ge(n, 1);
	for (size_t i = 0; i < n; i++) {
		ck_assert_uint_gt(ts_topology_numa_at(t, i)->memory, 0);
		ck_assert_str_ne(ts_topology_numa_at(t, i)->cpuset, "");
	}
	ck_assert_uint_gt(ts_topology_discovery_ns(t), 0);
	if (n == 1) {
		const char *all = ts_topology_numa_at(t, 0)->cpuset;

		for (size_t i = 0; i < ts_topology_device_count(t); i++) {
			ck_assert_int_eq(ts_topology_device_at(t, i)->numa_node,
			                 ts_topology_numa_at(t, 0)->index);
			ck_assert_str_eq(ts_topology_device_at(t, i)->local_cpus, all);
		}
	}
	/* node 0 exists on every Linux machine */
	t2 = ts_unit_topology("", set, numa, 2, NULL);
	check_device(t2, "sim:1", 0, ts_topology_numa_at(t2, 0)->cpuset);
	ts_topology_free(t2);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_bad_lists_and_files_are_refused)
{
	struct ts_device_set *set = ts_unit_sims(4);
	static const int three[] = {0, 0, 1}, far[] = {0, 0, 1, 2};
	struct ts_error err;

	ck_assert_str_eq(refusal(ts_unit_data("two_socket.xml"), set, three, 3, &err),
	                 "SIM_NUMA_NODES");
	ck_assert_ptr_nonnull(strstr(err.message, "3 NUMA nodes for 4 sim devices"));
	ck_assert_str_eq(refusal(ts_unit_data("two_socket.xml"), set, far, 4, &err),
	                 "SIM_NUMA_NODES");
	ck_assert_ptr_nonnull(strstr(err.message, "NUMA node 2"));
	ck_assert_str_eq(refusal(ts_unit_data("one_socket.xml"), set, far, 4, &err),
	                 "SIM_NUMA_NODES");
	ck_assert_str_eq(refusal(ts_unit_data("no_such_file.xml"), set, NULL, 0, &err),
	                 "TOPOLOGY_FILE");
	ck_assert_ptr_nonnull(strstr(err.message, "no_such_file.xml"));
	/* a file that is not hwloc XML */
	ck_assert_str_eq(refusal("tests/unit/test_topology.c", set, NULL, 0, &err), "TOPOLOGY_FILE");
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_parse_list)
{
	int v[4];
	size_t n = 99;
	struct ts_error err;
	static const char *const bad[] = {"a", "0,,1", "1,", ",1", "-1", "0, 1", "1x", "+1",
	                                  "0,1,2,3,4", "99999999999"};

	ts_error_clear(&err);
	ck_assert_int_eq(ts_topology_parse_list("0,0,1,1", v, 4, &n, &err), TS_OK);
	ck_assert_uint_eq(n, 4);
	ck_assert_int_eq(v[2], 1);
	ck_assert_int_eq(ts_topology_parse_list("3", v, 4, &n, &err), TS_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(v[0], 3);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ts_error_clear(&err);
		ck_assert_msg(ts_topology_parse_list(bad[i], v, 4, &n, &err) == TS_INVALID_ARGUMENT,
		              "'%s' accepted", bad[i]);
		ck_assert_str_eq(err.reason, "SIM_NUMA_NODES");
	}
}
END_TEST

/* The pair (a accessing b) by id; it must exist. */
static const struct ts_topology_peer *pair(const struct ts_topology *t, const char *a,
                                           const char *b)
{
	const struct ts_topology_peer *p = ts_topology_peer_find(t, a, b);

	ck_assert_msg(p != NULL, "no pair %s -> %s", a, b);
	return p;
}

static void check_pair(const struct ts_topology *t, const char *a, const char *b, bool access,
                       enum ts_link_kind link, int rank, bool atomics)
{
	const struct ts_topology_peer *p = pair(t, a, b);

	ck_assert_msg(p->access == access, "%s -> %s: access %d", a, b, p->access);
	ck_assert_msg(p->link == link, "%s -> %s: link %s, want %s", a, b, ts_link_name(p->link),
	              ts_link_name(link));
	ck_assert_int_eq(p->perf_rank, rank);
	ck_assert_int_eq(p->native_atomics, atomics);
}

START_TEST(test_peer_matrix_of_sim_links)
{
	struct ts_device_set *set = ts_unit_sims(4);
	static const int numa[] = {0, 0, 1, 1};
	struct ts_topology *t = ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 4,
	                                   "0-1:nvlink,2-3:pcie_switch,1-2:host_bridge");
	char *text;

	/* the accelerators only, in the set's order */
	ck_assert_uint_eq(ts_topology_peer_count(t), 4);
	ck_assert_str_eq(ts_topology_peer_id(t, 3), "sim:3");
	ck_assert_ptr_null(ts_topology_peer_id(t, 4));
	ck_assert_ptr_null(ts_topology_peer_at(t, 0, 4));
	ck_assert_ptr_null(ts_topology_peer_find(t, "sim:0", "cpu:0"));
	for (int i = 0; i < 4; i++) {
		char id[16];

		snprintf(id, sizeof id, "sim:%d", i);
		check_pair(t, id, id, true, TS_LINK_SELF, 0, true);
	}
	check_pair(t, "sim:0", "sim:1", true, TS_LINK_NVLINK, 0, true);
	check_pair(t, "sim:1", "sim:0", true, TS_LINK_NVLINK, 0, true);
	check_pair(t, "sim:2", "sim:3", true, TS_LINK_PCIE_SWITCH, 1, false);
	check_pair(t, "sim:3", "sim:2", true, TS_LINK_PCIE_SWITCH, 1, false);
	check_pair(t, "sim:1", "sim:2", true, TS_LINK_HOST_BRIDGE, 2, false);
	/* unlisted pairs: no access, the link the sockets imply */
	check_pair(t, "sim:0", "sim:2", false, TS_LINK_CROSS_SOCKET, 0, false);
	check_pair(t, "sim:3", "sim:0", false, TS_LINK_CROSS_SOCKET, 0, false);
	check_pair(t, "sim:3", "sim:1", false, TS_LINK_CROSS_SOCKET, 0, false);

	text = ts_topology_matrix_text(t);
	ck_assert_ptr_nonnull(text);
	ck_assert_ptr_nonnull(strstr(text, "sim:0   X       NV      SYS*    SYS*    0       0-7\n"));
	ck_assert_ptr_nonnull(strstr(text, "sim:1   NV      X       PHB     SYS*    0       0-7\n"));
	ck_assert_ptr_nonnull(strstr(text, "sim:3   SYS*    SYS*    PIX     X       1       8-15\n"));
	ck_assert_ptr_null(strstr(text, "cpu:0"));
	ck_assert_ptr_nonnull(strstr(text, "Legend:"));
	free(text);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_peer_matrix_defaults_follow_numa)
{
	struct ts_device_set *set = ts_unit_sims(3);
	static const int numa[] = {0, 1, 1};
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 3, NULL);
	struct ts_topology *t2, *t3;
	struct ts_peer_caps caps = {.known = true, .access = true};
	struct ts_error err;

	/* the sim backend has nothing to say: the flag decides */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_device_peer_caps(ts_device_set_at(set, 0), ts_device_set_at(set, 1),
	                                     &caps, &err),
	                 TS_OK);
	ck_assert(!caps.known && !caps.access);
	/* every sim pair is a peer by default; the link is the placement's */
	check_pair(t, "sim:0", "sim:1", true, TS_LINK_CROSS_SOCKET, 0, false);
	check_pair(t, "sim:1", "sim:2", true, TS_LINK_NUMA_NODE, 0, false);
	t2 = ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 3, "none");
	check_pair(t2, "sim:1", "sim:2", false, TS_LINK_NUMA_NODE, 0, false);
	check_pair(t2, "sim:1", "sim:1", true, TS_LINK_SELF, 0, true);
	/* without placement, the link is unknown */
	t3 = ts_unit_topology(ts_unit_data("two_socket.xml"), set, NULL, 0, "all");
	check_pair(t3, "sim:0", "sim:2", true, TS_LINK_UNKNOWN, 0, false);
	ts_topology_free(t3);
	ts_topology_free(t2);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_bad_peer_links_are_refused)
{
	struct ts_device_set *set = ts_unit_sims(4);
	struct ts_error err;
	enum ts_link_kind links[16];
	static const char *const bad[] = {"0", "0-", "-1", "0--1", "0-1,", ",0-1", "0-1,,2-3",
	                                  "a-b", "0-1:fast", "0-1:", "0-0", "0-1,1-0", "0-4",
	                                  "0-1-2,2-1", " 0-1", "0-99999999999"};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct ts_topology *t = NULL;

		ts_error_clear(&err);
		ck_assert_msg(ts_topology_new(&(struct ts_topology_config){
		                                      .xml_file = ts_unit_data("one_socket.xml"),
		                                      .sim_peer_links = bad[i]},
		                              set, &t, &err) == TS_INVALID_ARGUMENT,
		              "'%s' accepted", bad[i]);
		ck_assert_str_eq(err.reason, "SIM_PEER_LINKS");
		ck_assert_msg(strstr(err.message, bad[i]) != NULL, "'%s' not named: %s", bad[i],
		              err.message);
		ck_assert_ptr_null(t);
	}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_topology_parse_links("0-4", 4, links, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "sim:4; there are 4 sim devices"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_topology_parse_links("0-1,1-0", 4, links, &err), TS_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(err.message, "sim:1 and sim:0 twice"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_topology_parse_links("0-1-2:pcie_switch,3-0", 4, links, &err), TS_OK);
	ck_assert_int_eq(links[0 * 4 + 2], TS_LINK_PCIE_SWITCH);
	ck_assert_int_eq(links[2 * 4 + 1], TS_LINK_PCIE_SWITCH);
	ck_assert_int_eq(links[3 * 4 + 0], TS_LINK_NVLINK);
	ck_assert_int_eq(links[1 * 4 + 3], TS_LINK_KIND_COUNT);
	ck_assert_int_eq(links[3 * 4 + 3], TS_LINK_SELF);
	ts_device_set_free(set);
}
END_TEST

/* The peer matrix of the CUDA GPUs: what the runtime answers for each
 * pair, with the links of the two-socket file's PCI tree. */
static void check_cuda_peers(struct ts_device_set *set, const struct ts_topology *t)
{
	const char *groups = getenv("TS_TEST_PEER_GROUPS");
	size_t n = 0, pairs = 0, with_access = 0;
	enum ts_link_kind want[64 * 64];
	struct ts_device *gpu[64];
	struct ts_error err;

	for (size_t i = 0; i < ts_device_set_count(set) && n < 64; i++)
		if (ts_device_props(ts_device_set_at(set, i))->backend == TS_BACKEND_CUDA)
			gpu[n++] = ts_device_set_at(set, i);
	ts_error_clear(&err);
	if (groups)
		ck_assert_msg(ts_topology_parse_links(groups, n, want, &err) == TS_OK, "%s",
		              err.message);
	for (size_t a = 0; a < n; a++)
		for (size_t b = 0; b < n; b++) {
			const struct ts_device_props *pa = ts_device_props(gpu[a]),
			                             *pb = ts_device_props(gpu[b]);
			const struct ts_topology_peer *p = pair(t, pa->id, pb->id);
			const struct ts_topology_device *da = ts_topology_device_find(t, pa->id),
			                                *db = ts_topology_device_find(t, pb->id);
			struct ts_peer_caps caps;

			if (a == b) {
				ck_assert(p->access && p->link == TS_LINK_SELF);
				continue;
			}
			ck_assert_int_eq(ts_device_peer_caps(gpu[a], gpu[b], &caps, &err), TS_OK);
			ck_assert(caps.known);
			ck_assert_int_eq(p->access, caps.access);
			ck_assert_int_eq(p->perf_rank, caps.perf_rank);
			ck_assert_int_eq(p->native_atomics, caps.native_atomics);
			if (groups)
				ck_assert_msg(p->access == (want[a * n + b] != TS_LINK_KIND_COUNT),
				              "%s -> %s: access %d against groups %s", pa->id, pb->id,
				              p->access, groups);
			/* the file's GPUs hang four under each package's host bridge */
			if (da->numa_node >= 0 && db->numa_node >= 0)
				ck_assert_msg(p->link == (da->numa_node == db->numa_node
				                                  ? TS_LINK_HOST_BRIDGE
				                                  : TS_LINK_CROSS_SOCKET),
				              "%s -> %s: link %s", pa->id, pb->id, ts_link_name(p->link));
			else
				ck_assert_int_eq(p->link, TS_LINK_UNKNOWN);
			pairs++;
			with_access += p->access;
		}
	fprintf(stderr, "topology: %zu GPU pairs, %zu with peer access\n", pairs, with_access);
}

START_TEST(test_cuda_gpus_placed_by_bus_id)
{
	/* the GPUs of tests/data/two_socket.xml: four under each package */
	static const struct {
		const char *bus;
		int numa;
		const char *cpus;
	} gpus[] = {
		{"0000:11:00.0", 0, "0-7"}, {"0000:12:00.0", 0, "0-7"}, {"0000:13:00.0", 0, "0-7"},
		{"0000:14:00.0", 0, "0-7"}, {"0000:81:00.0", 1, "8-15"}, {"0000:82:00.0", 1, "8-15"},
		{"0000:83:00.0", 1, "8-15"}, {"0000:84:00.0", 1, "8-15"},
	};
	struct ts_device_config cfg = {.sim_devices = 0, .cuda = true, .host = "testhost"};
	struct ts_device_set *set = NULL;
	struct ts_topology *t;
	struct ts_error err;
	size_t placed = 0;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_set_new(&cfg, &set, &err) == TS_OK, "%s", err.message);
	t = ts_unit_topology(ts_unit_data("two_socket.xml"), set, NULL, 0, NULL);
	for (size_t i = 0; i < ts_device_set_count(set); i++) {
		const struct ts_device_props *pr = ts_device_props(ts_device_set_at(set, i));
		const struct ts_topology_device *d = ts_topology_device_find(t, pr->id);
		size_t g = 0;

		if (pr->backend != TS_BACKEND_CUDA)
			continue;
		while (g < sizeof gpus / sizeof gpus[0] && strcasecmp(gpus[g].bus, pr->pci_bus_id))
			g++;
		ck_assert_ptr_nonnull(d);
		if (g == sizeof gpus / sizeof gpus[0]) {
			ck_assert_msg(d->numa_node == -1 && !d->local_cpus[0],
			              "%s (%s) is not in the file but placed on %d", pr->id,
			              pr->pci_bus_id, d->numa_node);
			continue;
		}
		ck_assert_int_eq(d->numa_node, gpus[g].numa);
		ck_assert_str_eq(d->local_cpus, gpus[g].cpus);
		/* no thread of its own to bind, wherever it sits */
		check_bind(t, pr->id, false, false, false, "copy engines");
		placed++;
	}
	fprintf(stderr, "topology: %zu GPUs placed by bus id\n", placed);
	check_cuda_peers(set, t);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

/* NVLink from hwloc's "NVLinkBandwidth" distances: tests/data/two_socket_nvlink.xml
 * is two_socket.xml with an NVML OS device under each GPU (as hwloc's NVML
 * backend hangs them) and that matrix among them, made with hwloc-annotate
 * (`distances`, kind 9: from the OS, a bandwidth): the four GPUs of a
 * package linked to each other, none across. Pairs in one package are
 * nvlink, pairs across cross_socket; a GPU not in the file, unknown. */
START_TEST(test_cuda_nvlink_from_hwloc_distances)
{
	struct ts_device_config cfg = {.sim_devices = 0, .cuda = true, .host = "testhost"};
	struct ts_device_set *set = NULL;
	struct ts_topology *t;
	struct ts_error err;
	size_t nvlink = 0, same = 0;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_set_new(&cfg, &set, &err) == TS_OK, "%s", err.message);
	t = ts_unit_topology(ts_unit_data("two_socket_nvlink.xml"), set, NULL, 0, NULL);
	for (size_t i = 0; i < ts_device_set_count(set); i++)
		for (size_t j = 0; j < ts_device_set_count(set); j++) {
			const struct ts_device_props *pa = ts_device_props(ts_device_set_at(set, i)),
			                             *pb = ts_device_props(ts_device_set_at(set, j));
			const struct ts_topology_device *da = ts_topology_device_find(t, pa->id),
			                                *db = ts_topology_device_find(t, pb->id);
			const struct ts_topology_peer *p;

			if (i == j || pa->backend != TS_BACKEND_CUDA || pb->backend != TS_BACKEND_CUDA)
				continue;
			p = pair(t, pa->id, pb->id);
			if (da->numa_node < 0 || db->numa_node < 0) {
				ck_assert_int_eq(p->link, TS_LINK_UNKNOWN);
				continue;
			}
			same += da->numa_node == db->numa_node;
			nvlink += p->link == TS_LINK_NVLINK;
			ck_assert_msg(p->link == (da->numa_node == db->numa_node ? TS_LINK_NVLINK
			                                                         : TS_LINK_CROSS_SOCKET),
			              "%s (%s) -> %s (%s): link %s", pa->id, pa->pci_bus_id, pb->id,
			              pb->pci_bus_id, ts_link_name(p->link));
		}
	ck_assert_uint_eq(nvlink, same);
	fprintf(stderr, "topology: %zu GPU pairs linked by NVLink\n", nvlink);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

/* ---- binding threads to CPUs --------------------------------------------- */


START_TEST(test_cpubind_two_socket_decided_not_applied)
{
	struct ts_device_set *set = ts_unit_sims(4);
	static const int numa[] = {0, 0, 1, 1};
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 4, NULL);
	cpu_set_t before, after;

	/* each socket's devices: 8 of 16 CPUs, 8 left to the HTTP workers */
	check_bind(t, "sim:0", true, true, false, "local CPUs 0-7; 8 of the node's 16 CPUs left");
	check_bind(t, "sim:3", true, true, false, "local CPUs 8-15;");
	check_bind(t, "sim:3", true, true, false, "nothing bound: the topology is from a file");
	/* the host's CPUs are all of them: its kernels' team stays unbound */
	check_bind(t, "cpu:0", true, false, false, "those are all the node's 16 CPUs");
	/* nothing is applied from a file */
	ck_assert_int_eq(ts_topology_kernel_threads(t, "sim:0"), 0);
	ck_assert_int_eq(sched_getaffinity(0, sizeof before, &before), 0);
	ck_assert(!ts_topology_bind_cpus(t, "sim:0", TS_CPUBIND_COPY, pthread_self()));
	ck_assert(!ts_topology_bind_cpus(t, "sim:0", TS_CPUBIND_KERNELS, pthread_self()));
	ck_assert(!ts_topology_bind_cpus(NULL, "sim:0", TS_CPUBIND_COPY, pthread_self()));
	ck_assert(!ts_topology_bind_cpus(t, "sim:9", TS_CPUBIND_COPY, pthread_self()));
	ck_assert_int_eq(sched_getaffinity(0, sizeof after, &after), 0);
	ck_assert(CPU_EQUAL(&before, &after));
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_cpubind_one_socket_and_unknown_places)
{
	struct ts_device_set *set = ts_unit_sims(2);
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("one_socket.xml"), set, NULL, 0, NULL);
	struct ts_topology *t2;

	/* one node: every device's local CPUs are all 16, no team is bound */
	check_bind(t, "sim:0", true, false, false, "local CPUs 0-15; not the CPU kernels' team");
	check_bind(t, "cpu:0", true, false, false, "none would be left outside it");
	ts_topology_free(t);
	/* sim devices of unknown place on two sockets: nothing to bind to */
	t2 = ts_unit_topology(ts_unit_data("two_socket.xml"), set, NULL, 0, NULL);
	check_bind(t2, "sim:1", false, false, false, "local CPUs unknown");
	ts_topology_free(t2);
	ts_device_set_free(set);
}
END_TEST

struct affinity {
	cpu_set_t cpus;
	int rc;
};

static void read_affinity(void *arg)
{
	struct affinity *a = arg;

	a->rc = sched_getaffinity(0, sizeof a->cpus, &a->cpus);
}

/* The CPUs of a list string ("0-7,16") as a cpu_set_t. */
static void cpus_of(const char *list, cpu_set_t *out)
{
	hwloc_bitmap_t b = hwloc_bitmap_alloc();
	unsigned i;

	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(hwloc_bitmap_list_sscanf(b, list), 0);
	CPU_ZERO(out);
	hwloc_bitmap_foreach_begin(i, b)
		if (i < CPU_SETSIZE)
			CPU_SET(i, out);
	hwloc_bitmap_foreach_end();
	hwloc_bitmap_free(b);
}

START_TEST(test_cpubind_this_machine_binds_queue_workers)
{
	struct ts_device_set *set = ts_unit_sims(2);
	struct ts_topology *t = ts_unit_topology(NULL, set, NULL, 0, NULL);
	const struct ts_topology_device *d = ts_topology_device_find(t, "sim:0");
	struct affinity a = {.rc = -1};
	cpu_set_t local, one, saved;
	struct ts_queue *q = NULL;
	struct ts_error err;
	int first = -1;

	ck_assert_ptr_nonnull(d);
	ck_assert_int_eq(sched_getaffinity(0, sizeof saved, &saved), 0);
	if (!d->cpubind.applied || !d->local_cpus[0]) {
		fprintf(stderr, "topology: threads not bound here: %s\n", d->cpubind.reason);
		goto out;
	}
	ck_assert(d->cpubind.copy_threads);
	cpus_of(d->local_cpus, &local);
	/* start the worker from a thread bound to one CPU: it would inherit
	 * that, were it not bound to the device's local CPUs */
	for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
		if (CPU_ISSET(c, &local) && CPU_ISSET(c, &saved))
			first = c;
	ck_assert_int_ge(first, 0);
	CPU_ZERO(&one);
	CPU_SET(first, &one);
	ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0);
	ts_device_set_topology(set, t);
	ck_assert_ptr_eq(ts_device_topology(ts_device_set_find(set, "sim:0")), t);
	ts_error_clear(&err);
	ck_assert_msg(ts_queue_new(ts_device_set_find(set, "sim:0"), &q, &err) == TS_OK, "%s",
	              err.message);
	ck_assert_int_eq(sched_setaffinity(0, sizeof saved, &saved), 0);
	ck_assert_int_eq(ts_queue_host_fn(q, read_affinity, &a, &err), TS_OK);
	ck_assert_int_eq(ts_queue_sync(q, &err), TS_OK);
	ck_assert_int_eq(a.rc, 0);
	ck_assert_msg(CPU_EQUAL(&a.cpus, &local), "the queue worker runs on %d CPUs, not on "
	              "sim:0's local CPUs %s", CPU_COUNT(&a.cpus), d->local_cpus);
	fprintf(stderr, "topology: sim:0's queue worker bound to %s\n", d->local_cpus);
	/* the kernels' team: its thread count follows the decision */
	ck_assert_int_eq(ts_topology_kernel_threads(t, "sim:0"),
	                 d->cpubind.cpu_kernels ? CPU_COUNT(&local) : 0);
	ts_queue_free(q);
out:
	ts_device_set_free(set);
	ts_topology_free(t);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("topology");
	TCase *tc = tcase_create("core"), *cuda = tcase_create("cuda");

	tcase_add_test(tc, test_two_socket_places_sim_devices_by_list);
	tcase_add_test(tc, test_two_socket_without_list_leaves_sim_devices_unknown);
	tcase_add_test(tc, test_one_socket_puts_every_device_on_its_node);
	tcase_add_test(tc, test_this_machine);
	tcase_add_test(tc, test_bad_lists_and_files_are_refused);
	tcase_add_test(tc, test_parse_list);
	tcase_add_test(tc, test_peer_matrix_of_sim_links);
	tcase_add_test(tc, test_peer_matrix_defaults_follow_numa);
	tcase_add_test(tc, test_bad_peer_links_are_refused);
	tcase_add_test(tc, test_cpubind_two_socket_decided_not_applied);
	tcase_add_test(tc, test_cpubind_one_socket_and_unknown_places);
	tcase_add_test(tc, test_cpubind_this_machine_binds_queue_workers);
	tcase_add_test(cuda, test_cuda_gpus_placed_by_bus_id);
	tcase_add_test(cuda, test_cuda_nvlink_from_hwloc_distances);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, cuda);
	return s;
}
