/*
 * it_topology.c - Check suite "topology": the daemon started on the
 * two-socket hwloc XML of tests/data with four sim devices placed by
 * --sim-numa-nodes reports its NUMA nodes and placements in GET /v1/topology
 * and /v1/devices; bad lists and unreadable files are refused at start.
 * Runs on sim devices whatever the backend under test (the placement of
 * CUDA GPUs needs their PCI bus ids in the file).
 */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static char two_socket[PATH_MAX];

/* The file's absolute path (the daemon runs in a folder of its own). */
static void find_file(void)
{
	ck_assert_msg(realpath("tests/data/two_socket.xml", two_socket) != NULL,
	              "run from the checkout's root: tests/data/two_socket.xml not found");
}

static void start(struct th_daemon *d, const char *numa)
{
	const char *const args[] = {"--no-cuda", "--sim-devices", "4", "--sim-device-memory",
	                            TH_SIM_MEMORY_ARG, "--topology-file", two_socket,
	                            "--sim-numa-nodes", numa, "--log-level", "info", NULL};

	th_daemon_start_ex(d, &(struct th_start){.args = args, .no_backend_args = true});
}

static void expect_place(json_t *o, int numa, const char *cpus)
{
	json_t *n = json_object_get(o, "numa_node"), *c = json_object_get(o, "local_cpus");

	if (numa < 0)
		ck_assert_msg(json_is_null(n), "numa_node is not null");
	else
		ck_assert_int_eq(json_integer_value(n), numa);
	if (!cpus)
		ck_assert_msg(json_is_null(c), "local_cpus is not null");
	else
		ck_assert_str_eq(json_string_value(c), cpus);
}

START_TEST(test_two_socket_file_and_sim_placement)
{
	struct th_daemon d;
	json_t *t, *nodes, *devs, *list;
	static const int want_numa[] = {0, 0, 1, 1};
	static const char *const want_cpus[] = {"0-7", "0-7", "8-15", "8-15"};
	char *log;

	find_file();
	start(&d, "0,0,1,1");
	t = th_get_object(&d, "/v1/topology");
	ck_assert_str_eq(json_string_value(json_object_get(t, "source")), two_socket);
	ck_assert(json_real_value(json_object_get(t, "discovery_ms")) >= 0);
	nodes = json_object_get(t, "numa_nodes");
	ck_assert_uint_eq(json_array_size(nodes), 2);
	for (int i = 0; i < 2; i++) {
		json_t *n = json_array_get(nodes, (size_t)i);

		ck_assert_int_eq(json_integer_value(json_object_get(n, "index")), i);
		ck_assert_int_eq(json_integer_value(json_object_get(n, "memory_bytes")), 64000000000);
		ck_assert_str_eq(json_string_value(json_object_get(n, "cpuset")), i ? "8-15" : "0-7");
	}
	devs = json_object_get(t, "devices");
	ck_assert_uint_eq(json_array_size(devs), 5);   /* sim:0..3, cpu:0 */
	for (int i = 0; i < 4; i++) {
		json_t *o = json_array_get(devs, (size_t)i);
		char id[16];

		snprintf(id, sizeof id, "sim:%d", i);
		ck_assert_str_eq(json_string_value(json_object_get(o, "id")), id);
		expect_place(o, want_numa[i], want_cpus[i]);
	}
	expect_place(json_array_get(devs, 4), -1, "0-15");
	json_decref(t);

	t = th_get_object(&d, "/v1/devices");
	list = json_object_get(t, "devices");
	ck_assert_uint_eq(json_array_size(list), 5);
	for (int i = 0; i < 4; i++)
		expect_place(json_array_get(list, (size_t)i), want_numa[i], want_cpus[i]);
	json_decref(t);
	t = th_get_object(&d, "/v1/devices/sim:3");
	expect_place(t, 1, "8-15");
	json_decref(t);

	log = th_daemon_stderr(&d);
	ck_assert_msg(strstr(log, "\"event\":\"topology\"") != NULL, "no topology line: %s", log);
	free(log);
	th_daemon_stop_ok(&d);
}
END_TEST

/* Runs tstaged with args; it must exit 1 before listening, naming what. */
static void expect_refused(const char *const *args, const char *names)
{
	struct th_run_result res;

	th_run(args, NULL, 10000, &res);
	ck_assert_msg(res.status == 1, "exit %d: %s", res.status, res.err);
	ck_assert_msg(strstr(res.err, names) != NULL, "stderr does not name '%s': %s", names,
	              res.err);
	th_run_free(&res);
}

START_TEST(test_bad_placement_refused_at_start)
{
	const char *args[] = {"--no-cuda", "--port", "0", "--sim-devices", "4",
	                      "--topology-file", two_socket, "--sim-numa-nodes", NULL, NULL};

	find_file();

	args[8] = "0,0,1";
	expect_refused(args, "3 NUMA nodes for 4 sim devices");
	args[8] = "0,0,1,2";
	expect_refused(args, "NUMA node 2");
	args[8] = "0,x";
	expect_refused(args, "--sim-numa-nodes '0,x'");
	args[6] = "/nonexistent/tstage/topology.xml";
	args[8] = "0,0,1,1";
	expect_refused(args, "--topology-file '/nonexistent/tstage/topology.xml'");
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("topology");
	TCase *tc = tcase_create("topology");

	tcase_add_test(tc, test_two_socket_file_and_sim_placement);
	tcase_add_test(tc, test_bad_placement_refused_at_start);
	suite_add_tcase(s, tc);
	return s;
}
