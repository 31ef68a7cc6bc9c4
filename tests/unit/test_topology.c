/*
 * test_topology.c - Check suite "topology": NUMA nodes and device placement
 * from hwloc, against the XML files of a one-socket and a two-socket node
 * (tests/data, read relative to the checkout: run from its root, or set
 * TS_TEST_DATA) and against this machine; bad --sim-numa-nodes lists and
 * unreadable files refused. Case "cuda" places the CUDA GPUs of this
 * machine by PCI bus id in the two-socket file: a GPU whose bus id the file
 * holds must sit on that GPU's socket, any other is unknown (tests/gpu/
 * fakecuda.sh runs it with the file's eight bus ids).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "device/device.h"
#include "device/topology.h"
#include "tests/unit/unit.h"

static char path_buf[4][512];

static const char *data(const char *name)
{
	static int next;
	const char *dir = getenv("TS_TEST_DATA");
	char *p = path_buf[next++ % 4];

	snprintf(p, sizeof path_buf[0], "%s/%s", dir ? dir : "tests/data", name);
	return p;
}

static struct ts_device_set *sims(int n)
{
	struct ts_device_config cfg = {.sim_devices = n, .sim_device_memory = 1 << 20,
	                               .cuda = false, .host = "testhost"};
	struct ts_device_set *set = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_set_new(&cfg, &set, &err) == TS_OK, "%s", err.message);
	return set;
}

static struct ts_topology *load(const char *xml, const struct ts_device_set *set,
                                const int *numa, size_t n)
{
	struct ts_topology *t = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_topology_new(&(struct ts_topology_config){.xml_file = xml,
	                                                           .sim_numa_nodes = numa,
	                                                           .sim_numa_count = n},
	                              set, &t, &err) == TS_OK,
	              "%s", err.message);
	return t;
}

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

START_TEST(test_two_socket_places_sim_devices_by_list)
{
	struct ts_device_set *set = sims(4);
	static const int numa[] = {0, 0, 1, 1};
	const char *xml = data("two_socket.xml");
	struct ts_topology *t = load(xml, set, numa, 4);
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
	struct ts_device_set *set = sims(2);
	struct ts_topology *t = load(data("two_socket.xml"), set, NULL, 0);

	check_device(t, "sim:0", -1, "");
	check_device(t, "sim:1", -1, "");
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_one_socket_puts_every_device_on_its_node)
{
	struct ts_device_set *set = sims(2);
	struct ts_topology *t = load(data("one_socket.xml"), set, NULL, 0);
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
	struct ts_device_set *set = sims(2);
	static const int numa[] = {0, 0};
	struct ts_topology *t = load(NULL, set, NULL, 0), *t2;
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
	t2 = load("", set, numa, 2);
	check_device(t2, "sim:1", 0, ts_topology_numa_at(t2, 0)->cpuset);
	ts_topology_free(t2);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

START_TEST(test_bad_lists_and_files_are_refused)
{
	struct ts_device_set *set = sims(4);
	static const int three[] = {0, 0, 1}, far[] = {0, 0, 1, 2};
	struct ts_error err;

	ck_assert_str_eq(refusal(data("two_socket.xml"), set, three, 3, &err), "SIM_NUMA_NODES");
	ck_assert_ptr_nonnull(strstr(err.message, "3 NUMA nodes for 4 sim devices"));
	ck_assert_str_eq(refusal(data("two_socket.xml"), set, far, 4, &err), "SIM_NUMA_NODES");
	ck_assert_ptr_nonnull(strstr(err.message, "NUMA node 2"));
	ck_assert_str_eq(refusal(data("one_socket.xml"), set, far, 4, &err), "SIM_NUMA_NODES");
	ck_assert_str_eq(refusal(data("no_such_file.xml"), set, NULL, 0, &err), "TOPOLOGY_FILE");
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
	t = load(data("two_socket.xml"), set, NULL, 0);
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
		placed++;
	}
	fprintf(stderr, "topology: %zu GPUs placed by bus id\n", placed);
	ts_topology_free(t);
	ts_device_set_free(set);
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
	tcase_add_test(cuda, test_cuda_gpus_placed_by_bus_id);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, cuda);
	return s;
}
