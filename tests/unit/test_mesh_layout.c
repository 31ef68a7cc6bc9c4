/*
 * test_mesh_layout.c - Check suite "mesh_layout": the order of "devices":
 * "auto" meshes (device/mesh_layout.h) on the two-socket and one-socket
 * hwloc files (tests/data; run from the checkout's root or set
 * TS_TEST_DATA): 1x8, 2x4, 4x2 and 8x1 meshes of eight sim devices placed
 * across the sockets out of order keep each socket's devices together, in
 * the set's order within it, and say whether each row of the last axis
 * stays on one NUMA node; devices of unknown place go last; inside a node
 * the peer matrix's links chain them; without a topology the set's order
 * stands. The node's device list (ts_mesh_layout_node) is each backend's
 * devices as a 1xN mesh of them, backend by backend. Case "cuda" lays out the CUDA GPUs of
 * this machine found in the two-socket file (tests/gpu/fakecuda.sh gives
 * the stand-in's eight GPUs the file's bus ids, sockets interleaved).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/mesh_layout.h"
#include "device/topology.h"
#include "tests/unit/unit.h"

/* The devices of backend kind in the set's order; their count. */
static int devices_of(const struct ts_device_set *set, enum ts_backend_kind kind,
                      struct ts_device **out)
{
	int n = 0;

	for (size_t i = 0; i < ts_device_set_count(set); i++)
		if (ts_device_props(ts_device_set_at(set, i))->backend == kind)
			out[n++] = ts_device_set_at(set, i);
	return n;
}

/* The ids of out[0..n) joined by ",". */
static const char *ids(struct ts_device *const *out, int n, char *buf, size_t cap)
{
	size_t len = 0;

	buf[0] = 0;
	for (int i = 0; i < n && len < cap; i++)
		len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? "," : "",
		                        ts_device_props(out[i])->id);
	return buf;
}

/* Eight sim devices, the even ones on the second socket: every mesh shape
 * takes socket 0's devices first, each socket's in the set's order; rows of
 * up to four devices stay on one socket, a row of eight cannot. */
START_TEST(test_two_socket_meshes)
{
	static const int numa[] = {1, 0, 1, 0, 1, 0, 1, 0};
	static const struct {
		int last_axis;
		const char *says;
	} shapes[] = {
		{8, "1 of 1 rows of the last axis (8 devices) span NUMA nodes"},        /* 1x8 */
		{4, "each row of the last axis (4 devices) stays within one NUMA node"}, /* 2x4 */
		{2, "each row of the last axis (2 devices) stays within one NUMA node"}, /* 4x2 */
		{1, "each row of the last axis (1 device) stays within one NUMA node"},  /* 8x1 */
	};
	struct ts_device_set *set = ts_unit_sims(8);
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 8, NULL);
	struct ts_device *cand[8], *out[8];
	char why[1024], buf[256];
	int n = devices_of(set, TS_BACKEND_SIM, cand);

	ck_assert_int_eq(n, 8);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		memset(out, 0, sizeof out);
		ts_mesh_layout(t, cand, n, shapes[s].last_axis, out, why, sizeof why);
		ck_assert_str_eq(ids(out, n, buf, sizeof buf),
		                 "sim:1,sim:3,sim:5,sim:7,sim:0,sim:2,sim:4,sim:6");
		ck_assert_msg(strstr(why, "node 0 (sim:1, sim:3, sim:5, sim:7); node 1 (sim:0, "
		                          "sim:2, sim:4, sim:6)"), "%s", why);
		ck_assert_msg(strstr(why, shapes[s].says), "'%s' not in: %s", shapes[s].says, why);
	}
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

/* Six devices, three on each socket: rows of two cannot all stay on one
 * socket (the middle one straddles them), and the reason says how many. */
START_TEST(test_rows_that_straddle_sockets_are_counted)
{
	static const int numa[] = {0, 1, 0, 1, 0, 1};
	struct ts_device_set *set = ts_unit_sims(6);
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 6, NULL);
	struct ts_device *cand[6], *out[6];
	char why[1024], buf[256];
	int n = devices_of(set, TS_BACKEND_SIM, cand);

	ts_mesh_layout(t, cand, n, 2, out, why, sizeof why);
	ck_assert_str_eq(ids(out, n, buf, sizeof buf), "sim:0,sim:2,sim:4,sim:1,sim:3,sim:5");
	ck_assert_msg(strstr(why, "1 of 3 rows of the last axis (2 devices) span NUMA nodes"),
	              "%s", why);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

/* Without a list the two-socket file cannot place sim devices: the set's
 * order, said so; no topology at all likewise; one socket: the set's order,
 * with the node named. A reason longer than its buffer is cut, not
 * overrun. */
START_TEST(test_unknown_places_and_one_socket_keep_the_sets_order)
{
	struct ts_device_set *set = ts_unit_sims(4);
	struct ts_topology *two =
		ts_unit_topology(ts_unit_data("two_socket.xml"), set, NULL, 0, NULL);
	struct ts_topology *one =
		ts_unit_topology(ts_unit_data("one_socket.xml"), set, NULL, 0, NULL);
	struct ts_device *cand[4], *out[4];
	char why[1024], tiny[8], buf[256];
	int n = devices_of(set, TS_BACKEND_SIM, cand);

	ts_mesh_layout(two, cand, n, 2, out, why, sizeof why);
	ck_assert_str_eq(ids(out, n, buf, sizeof buf), "sim:0,sim:1,sim:2,sim:3");
	ck_assert_msg(strstr(why, "no NUMA placement is known"), "%s", why);
	ts_mesh_layout(NULL, cand, n, 2, out, why, sizeof why);
	ck_assert_str_eq(ids(out, n, buf, sizeof buf), "sim:0,sim:1,sim:2,sim:3");
	ck_assert_msg(strstr(why, "no NUMA placement is known"), "%s", why);
	ts_mesh_layout(one, cand, n, 4, out, why, sizeof why);
	ck_assert_str_eq(ids(out, n, buf, sizeof buf), "sim:0,sim:1,sim:2,sim:3");
	ck_assert_msg(strstr(why, "all 4 devices sit on NUMA node 0"), "%s", why);
	ts_mesh_layout(one, cand, n, 4, out, tiny, sizeof tiny);
	ck_assert_uint_eq(strlen(tiny), sizeof tiny - 1);
	ts_topology_free(two);
	ts_topology_free(one);
	ts_device_set_free(set);
}
END_TEST

/* A device of unknown place (cpu:0 spans both sockets) goes after those
 * placed on a node, and a row holding it is counted as spanning nodes. */
START_TEST(test_devices_of_unknown_place_go_last)
{
	static const int numa[] = {1, 0, 1};
	struct ts_device_set *set = ts_unit_sims(3);
	struct ts_topology *t =
		ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 3, NULL);
	struct ts_device *cand[4], *out[4];
	char why[1024], buf[256];
	int n = devices_of(set, TS_BACKEND_SIM, cand + 1);

	cand[0] = ts_device_set_find(set, "cpu:0");
	ck_assert_ptr_nonnull(cand[0]);
	ts_mesh_layout(t, cand, n + 1, 2, out, why, sizeof why);
	ck_assert_str_eq(ids(out, n + 1, buf, sizeof buf), "sim:1,sim:0,sim:2,cpu:0");
	ck_assert_msg(strstr(why, "; unknown (cpu:0)"), "%s", why);
	ck_assert_msg(strstr(why, "2 of 2 rows"), "%s", why);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

/* Inside a NUMA node the devices chain by their links: NVLink pairs that
 * the set's order keeps apart become neighbours, so rows of two are each
 * one NVLink pair; the reason says the links reordered them. */
START_TEST(test_links_chain_devices_inside_a_node)
{
	static const int numa[] = {0, 1, 0, 1, 0, 1, 0, 1};
	struct ts_device_set *set = ts_unit_sims(8), *four = ts_unit_sims(4);
	struct ts_topology *t = ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 8,
	                                   "0-4:nvlink,2-6:nvlink,1-5:nvlink,3-7:nvlink");
	struct ts_topology *one = ts_unit_topology(ts_unit_data("one_socket.xml"), four, NULL, 0,
	                                     "0-2:nvlink,1-3:pcie_switch");
	struct ts_device *cand[8], *out[8];
	char why[1024], buf[256];
	int n = devices_of(set, TS_BACKEND_SIM, cand);

	ts_mesh_layout(t, cand, n, 2, out, why, sizeof why);
	ck_assert_str_eq(ids(out, n, buf, sizeof buf),
	                 "sim:0,sim:4,sim:2,sim:6,sim:1,sim:5,sim:3,sim:7");
	ck_assert_msg(strstr(why, "inside a node, each device follows the one best linked"),
	              "%s", why);
	ck_assert_msg(strstr(why, "each row of the last axis (2 devices) stays within one NUMA"),
	              "%s", why);
	n = devices_of(four, TS_BACKEND_SIM, cand);
	ts_mesh_layout(one, cand, n, 2, out, why, sizeof why);
	ck_assert_str_eq(ids(out, n, buf, sizeof buf), "sim:0,sim:2,sim:1,sim:3");
	ck_assert_msg(strstr(why, "all 4 devices sit on NUMA node 0: each device follows"),
	              "%s", why);
	ts_topology_free(t);
	ts_topology_free(one);
	ts_device_set_free(set);
	ts_device_set_free(four);
}
END_TEST

/* The node's list: the sim devices as a 1x8 mesh (by socket, linked
 * neighbours adjacent), then cpu:0; a cap cuts it; no topology: the set's
 * order. */
START_TEST(test_node_order_is_each_backends_row)
{
	static const int numa[] = {0, 1, 0, 1, 0, 1, 0, 1};
	struct ts_device_set *set = ts_unit_sims(8);
	struct ts_topology *t = ts_unit_topology(ts_unit_data("two_socket.xml"), set, numa, 8,
	                                         "0-4:nvlink,2-6:nvlink,1-5:nvlink,3-7:nvlink");
	struct ts_device *out[16];
	char buf[256];
	size_t n = ts_mesh_layout_node(t, set, out, 16);

	ck_assert_uint_eq(n, 9);
	ck_assert_str_eq(ids(out, (int)n, buf, sizeof buf),
	                 "sim:0,sim:4,sim:2,sim:6,sim:1,sim:5,sim:3,sim:7,cpu:0");
	n = ts_mesh_layout_node(t, set, out, 3);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(ids(out, (int)n, buf, sizeof buf), "sim:0,sim:4,sim:2");
	n = ts_mesh_layout_node(NULL, set, out, 16);
	ck_assert_str_eq(ids(out, (int)n, buf, sizeof buf),
	                 "sim:0,sim:1,sim:2,sim:3,sim:4,sim:5,sim:6,sim:7,cpu:0");
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

/* The CUDA GPUs of this machine in the two-socket file: those on socket 0
 * (bus 11-14) first, then socket 1's (81-84), each in the set's order. */
START_TEST(test_cuda_gpus_grouped_by_socket)
{
	struct ts_device_config cfg = {.sim_devices = 0, .cuda = true, .host = "testhost"};
	struct ts_device_set *set = NULL;
	struct ts_device *cand[64], *out[64];
	struct ts_topology *t;
	struct ts_error err;
	char why[2048];
	int n, seen1 = 0;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_set_new(&cfg, &set, &err) == TS_OK, "%s", err.message);
	t = ts_unit_topology(ts_unit_data("two_socket.xml"), set, NULL, 0, NULL);
	n = devices_of(set, TS_BACKEND_CUDA, cand);
	ts_mesh_layout(t, cand, n, n > 1 ? n / 2 : 1, out, why, sizeof why);
	for (int i = 0; i < n; i++) {
		const struct ts_topology_device *d =
			ts_topology_device_find(t, ts_device_props(out[i])->id);
		int node = d ? d->numa_node : -1;

		/* the nodes never go back: 0s, then 1s, then unknown */
		if (node == 1)
			seen1 = 1;
		ck_assert_msg(!(seen1 && node == 0), "%s on node 0 after a node 1 device: %s",
		              ts_device_props(out[i])->id, why);
		for (int j = 0; j < i; j++)
			ck_assert_ptr_ne(out[j], out[i]);
	}
	fprintf(stderr, "mesh layout of %d GPUs: %s\n", n, why);
	ts_topology_free(t);
	ts_device_set_free(set);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("mesh_layout");
	TCase *tc = tcase_create("core"), *cuda = tcase_create("cuda");

	tcase_add_test(tc, test_two_socket_meshes);
	tcase_add_test(tc, test_rows_that_straddle_sockets_are_counted);
	tcase_add_test(tc, test_unknown_places_and_one_socket_keep_the_sets_order);
	tcase_add_test(tc, test_devices_of_unknown_place_go_last);
	tcase_add_test(tc, test_links_chain_devices_inside_a_node);
	tcase_add_test(tc, test_node_order_is_each_backends_row);
	tcase_add_test(cuda, test_cuda_gpus_grouped_by_socket);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, cuda);
	return s;
}
