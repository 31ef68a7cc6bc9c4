/*
 * it_topology.c - Check suite "topology": the daemon started on the
 * two-socket hwloc XML of tests/data with four sim devices placed by
 * --sim-numa-nodes reports its NUMA nodes and placements in GET /v1/topology
 * and /v1/devices; bad lists and unreadable files are refused at start.
 * With --sim-peer-links, the peer matrix (matrices and text) is in GET
 * /v1/topology, and a copy between sim devices goes by peer access where
 * the matrix allows it and through pinned host memory otherwise: the
 * operation's metadata says which, and the devices' per-direction transfer
 * counters show it. Case "cuda" (TS_TEST_BACKEND=cuda; skipped elsewhere)
 * does the same on the GPUs, placed in the two-socket file, whose matrix is
 * the runtime's: tests/gpu/fakecuda.sh runs it on the file's eight bus ids
 * with two peer groups of four. With sim devices on both sockets,
 * /v1/memory shows a pinned_host pool per NUMA node, split by the devices'
 * share of --pinned-host-limit, not bound (the file is not this machine),
 * each device's pinned memory counted in its own node's pool.
 * Each device's binding of its threads to CPUs is reported (decided from
 * the file, applied on this machine, where each queue worker's
 * Cpus_allowed_list is its device's local CPUs), and /v1/devices lists the
 * devices in topology order: NUMA node by node.
 * Runs on sim devices whatever the backend under test (the placement of
 * CUDA GPUs needs their PCI bus ids in the file).
 */
#include <check.h>
#include <dirent.h>
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

static void start_links(struct th_daemon *d, const char *numa, const char *links)
{
	const char *const args[] = {"--no-cuda", "--sim-devices", "4", "--sim-device-memory",
	                            TH_SIM_MEMORY_ARG, "--topology-file", two_socket,
	                            "--sim-numa-nodes", numa, "--log-level", "info",
	                            "--sim-peer-links", links, NULL};

	th_daemon_start_ex(d, &(struct th_start){.args = args, .no_backend_args = true});
}

static void start(struct th_daemon *d, const char *numa)
{
	start_links(d, numa, "all");
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

/* Device i of a devices array has id. */
static void expect_id(json_t *devs, size_t i, const char *id)
{
	ck_assert_str_eq(json_string_value(json_object_get(json_array_get(devs, i), "id")), id);
}

static void expect_binding(json_t *dev, bool copy, bool kernels, bool applied, const char *why)
{
	json_t *b = json_object_get(dev, "cpu_binding");
	const char *reason = json_string_value(json_object_get(b, "reason"));

	ck_assert_msg(json_is_object(b), "no cpu_binding");
	ck_assert_int_eq(json_is_true(json_object_get(b, "copy_threads")), copy);
	ck_assert_int_eq(json_is_true(json_object_get(b, "cpu_kernels")), kernels);
	ck_assert_int_eq(json_is_true(json_object_get(b, "applied")), applied);
	ck_assert_msg(reason && strstr(reason, why), "reason '%s' lacks '%s'", reason, why);
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

/* Row i, column j of one of the peer matrices. */
static json_t *cell(json_t *peers, const char *matrix, int i, int j)
{
	return json_array_get(json_array_get(json_object_get(peers, matrix), (size_t)i), (size_t)j);
}

/* tstage_device_transfer_bytes_total of a device and direction. */
static long long transfer_bytes(struct th_daemon *d, const char *dev, const char *dir)
{
	size_t n;
	char *m = th_get_bytes(d, "/metrics", &n), key[128];
	const char *at;
	long long v = -1;

	snprintf(key, sizeof key, "tstage_device_transfer_bytes_total{device=\"%s\",direction=\"%s\"} ",
	         dev, dir);
	at = strstr(m, key);
	ck_assert_msg(at != NULL, "no %s in /metrics", key);
	v = atoll(at + strlen(key));
	free(m);
	return v;
}

/* :copy of array a to a new array on dev; waits; returns the finished
 * operation (new reference), which must have succeeded. */
static json_t *copy_to(struct th_daemon *d, const char *out, const char *dev)
{
	char body[128], path[96];
	json_t *op;
	char *id;

	snprintf(body, sizeof body, "{\"out\": \"%s\", \"device\": \"%s\"}", out, dev);
	op = th_post_json(d, "/v1/arrays/a:copy", body, 202);
	id = strdup(json_string_value(th_op_meta(op, "id")));
	json_decref(op);
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	op = th_post_json(d, path, "{\"timeout\": \"60s\"}", 200);
	free(id);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	return op;
}

START_TEST(test_peer_matrix_and_copy_paths)
{
	enum { N = 3 << 20 };
	struct th_daemon d;
	json_t *t, *peers, *op;
	const char *text;
	char *data = malloc(N), *back;
	long long d2h0, h2d2, d2d1, h2d1;
	size_t n;

	for (size_t i = 0; i < N; i++)
		data[i] = (char)(i * 7 + i / 4096);
	find_file();
	start_links(&d, "0,0,1,1", "0-1:nvlink,2-3:pcie_switch");
	t = th_get_object(&d, "/v1/topology");
	peers = json_object_get(t, "peers");
	ck_assert_uint_eq(json_array_size(json_object_get(peers, "devices")), 4);
	ck_assert_str_eq(json_string_value(json_array_get(json_object_get(peers, "devices"), 2)),
	                 "sim:2");
	ck_assert(json_is_true(cell(peers, "access", 0, 1)));
	ck_assert(json_is_false(cell(peers, "access", 0, 2)));
	ck_assert(json_is_true(cell(peers, "access", 3, 2)));
	ck_assert_str_eq(json_string_value(cell(peers, "link", 0, 0)), "self");
	ck_assert_str_eq(json_string_value(cell(peers, "link", 1, 0)), "nvlink");
	ck_assert_str_eq(json_string_value(cell(peers, "link", 2, 3)), "pcie_switch");
	ck_assert_str_eq(json_string_value(cell(peers, "link", 1, 3)), "cross_socket");
	ck_assert_int_eq(json_integer_value(cell(peers, "perf_rank", 2, 3)), 1);
	ck_assert(json_is_true(cell(peers, "native_atomics", 0, 1)));
	ck_assert(json_is_false(cell(peers, "native_atomics", 2, 3)));
	text = json_string_value(json_object_get(peers, "text"));
	ck_assert_ptr_nonnull(text);
	ck_assert_msg(strstr(text, "sim:2   SYS*    SYS*    X       PIX     1       8-15\n"), "%s",
	              text);
	json_decref(t);

	th_put_array(&d, "a", "dtype=uint8&shape=3145728&device=sim:0", data, N);
	d2h0 = transfer_bytes(&d, "sim:0", "d2h");
	h2d2 = transfer_bytes(&d, "sim:2", "h2d");
	d2d1 = transfer_bytes(&d, "sim:1", "d2d");
	h2d1 = transfer_bytes(&d, "sim:1", "h2d");

	/* peers: one device-to-device copy on the destination's queue */
	op = copy_to(&d, "b1", "sim:1");
	ck_assert_str_eq(json_string_value(th_op_meta(op, "path")), "peer");
	ck_assert_int_eq(th_int(th_op_meta(op, "path_pairs"), "peer"), 1);
	ck_assert_int_eq(th_int(th_op_meta(op, "path_pairs"), "staged"), 0);
	json_decref(op);
	ck_assert_int_eq(transfer_bytes(&d, "sim:1", "d2d"), d2d1 + N);
	ck_assert_int_eq(transfer_bytes(&d, "sim:1", "h2d"), h2d1);
	ck_assert_int_eq(transfer_bytes(&d, "sim:0", "d2h"), d2h0);

	/* no peer access: out of sim:0 into pinned slots, from them into sim:2 */
	op = copy_to(&d, "b2", "sim:2");
	ck_assert_str_eq(json_string_value(th_op_meta(op, "path")), "staged");
	ck_assert_int_eq(th_int(th_op_meta(op, "path_pairs"), "staged"), 1);
	json_decref(op);
	ck_assert_int_eq(transfer_bytes(&d, "sim:0", "d2h"), d2h0 + N);
	ck_assert_int_eq(transfer_bytes(&d, "sim:2", "h2d"), h2d2 + N);

	/* on the same device no path is recorded */
	op = copy_to(&d, "b0", "sim:0");
	ck_assert_ptr_null(json_object_get(json_object_get(op, "metadata"), "path"));
	json_decref(op);

	for (int i = 0; i < 3; i++) {
		char name[16];

		snprintf(name, sizeof name, "b%d", i);
		back = th_download(&d, name, &n);
		ck_assert_uint_eq(n, N);
		ck_assert_msg(memcmp(back, data, N) == 0, "%s differs from a", name);
		free(back);
	}
	free(data);
	th_daemon_stop_ok(&d);
}
END_TEST

/* A copy of array a from cuda:0 to each of a GPU it has peer access with
 * and one it has not (where there are such), by the path the matrix says. */
START_TEST(test_cuda_copy_paths_follow_the_matrix)
{
	enum { N = 1 << 20 };
	/* small device pools: eight of them are reserved, and given back at the end */
	const char *const args[] = {"--topology-file", two_socket, "--sim-devices", "0",
	                            "--device-memory-fraction", "0.05", NULL};
	struct th_daemon d;
	json_t *t, *peers, *ids, *op;
	char *data, *back;
	int checked = 0;
	size_t n;

	if (th_backend_is_sim()) {
		fprintf(stderr, "topology: case cuda needs TS_TEST_BACKEND=cuda; skipped\n");
		return;
	}
	find_file();
	th_daemon_start_ex(&d, &(struct th_start){.args = args});
	t = th_get_object(&d, "/v1/topology");
	peers = json_object_get(t, "peers");
	ids = json_object_get(peers, "devices");
	/* a GPU has no thread of tstage's to bind */
	for (size_t i = 0; i < json_array_size(json_object_get(t, "devices")); i++) {
		json_t *o = json_array_get(json_object_get(t, "devices"), i);

		if (strncmp(json_string_value(json_object_get(o, "id")), "cuda:", 5) == 0)
			expect_binding(o, false, false, false, "copy engines");
	}
	data = malloc(N);
	for (size_t i = 0; i < N; i++)
		data[i] = (char)(i * 13 + i / 512);
	th_put_array(&d, "a", "dtype=uint8&shape=1048576&device=cuda:0", data, N);
	for (int want = 1; want >= 0; want--) {
		size_t j = 1;

		/* both directions must allow it for a direct copy */
		while (j < json_array_size(ids) &&
		       (json_is_true(cell(peers, "access", 0, (int)j)) &&
		        json_is_true(cell(peers, "access", (int)j, 0))) != want)
			j++;
		if (j == json_array_size(ids))
			continue;
		op = copy_to(&d, want ? "peer" : "staged", json_string_value(json_array_get(ids, j)));
		ck_assert_str_eq(json_string_value(th_op_meta(op, "path")), want ? "peer" : "staged");
		json_decref(op);
		back = th_download(&d, want ? "peer" : "staged", &n);
		ck_assert_uint_eq(n, N);
		ck_assert_msg(memcmp(back, data, N) == 0, "the copy to %s differs",
		              json_string_value(json_array_get(ids, j)));
		free(back);
		fprintf(stderr, "topology: cuda:0 -> %s %s\n",
		        json_string_value(json_array_get(ids, j)), want ? "peer" : "staged");
		checked++;
	}
	fprintf(stderr, "topology: %d GPU copy paths checked\n", checked);
	free(data);
	json_decref(t);
	th_daemon_stop_ok(&d);
}
END_TEST

/* The pinned_pool object of dev's pinned_host space in /v1/memory m. */
static json_t *pinned_pool(json_t *m, const char *dev)
{
	json_t *spaces = json_object_get(m, "spaces");

	for (size_t i = 0; i < json_array_size(spaces); i++) {
		json_t *s = json_array_get(spaces, i);

		if (strcmp(th_str(s, "device"), dev) == 0 &&
		    strcmp(th_str(s, "memory_kind"), "pinned_host") == 0)
			return th_obj(s, "pinned_pool");
	}
	ck_abort_msg("no pinned_host space of %s", dev);
	return NULL;
}

START_TEST(test_pinned_pools_per_numa_node)
{
	const char *const args[] = {"--no-cuda", "--sim-devices", "4", "--sim-device-memory",
	                            TH_SIM_MEMORY_ARG, "--topology-file", two_socket,
	                            "--sim-numa-nodes", "0,1,1,1", "--pinned-host-limit", "64MiB",
	                            NULL};
	static const char *const devs[] = {"sim:0", "sim:1", "sim:2", "sim:3", "cpu:0"};
	static const char *const pool[] = {"numa0/pinned_host", "numa1/pinned_host",
	                                   "numa1/pinned_host", "numa1/pinned_host",
	                                   "numa0/pinned_host"};
	char *data = calloc(1, 3 << 20);
	struct th_daemon d;
	json_t *m, *p0, *p1;

	find_file();
	th_daemon_start_ex(&d, &(struct th_start){.args = args, .no_backend_args = true});
	th_put_array(&d, "h", "dtype=uint8&shape=3145728&device=sim:2&memory_kind=pinned_host",
	             data, 3 << 20);
	th_put_array(&d, "g", "dtype=uint8&shape=1048576&device=sim:0&memory_kind=pinned_host",
	             data, 1 << 20);
	m = th_get_object(&d, "/v1/memory");
	for (int i = 0; i < 5; i++) {
		json_t *pp = pinned_pool(m, devs[i]);

		ck_assert_str_eq(th_str(pp, "name"), pool[i]);
		ck_assert(json_is_false(json_object_get(pp, "bound")));
	}
	p0 = pinned_pool(m, "sim:0");
	p1 = pinned_pool(m, "sim:3");
	ck_assert_int_eq(th_int(p0, "numa_node"), 0);
	ck_assert_int_eq(th_int(p1, "numa_node"), 1);
	/* a quarter of the budget for node 0's one device, the rest for node 1's three */
	ck_assert_int_eq(th_int(p0, "limit_bytes"), 16 << 20);
	ck_assert_int_eq(th_int(p1, "limit_bytes"), 48 << 20);
	ck_assert_int_eq(th_int(p0, "bytes_in_use"), 1 << 20);
	ck_assert_int_eq(th_int(p1, "bytes_in_use"), 3 << 20);
	json_decref(m);
	free(data);
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

START_TEST(test_bad_peer_links_refused_at_start)
{
	const char *links[] = {"--no-cuda", "--port", "0", "--sim-devices", "4",
	                       "--sim-peer-links", "0-1,1-0", NULL};

	expect_refused(links, "--sim-peer-links '0-1,1-0' links sim:1 and sim:0 twice");
	links[6] = "0-4:nvlink";
	expect_refused(links, "names sim:4; there are 4 sim devices");
	links[6] = "0-1:wire";
	expect_refused(links, "link kind 'wire'");
}
END_TEST

/* Sockets given in reverse (sim:2 and sim:3 on node 0): both lists put
 * node 0's devices first, and each device's binding is decided, not
 * applied (the file is not this machine). */
START_TEST(test_binding_decided_and_devices_in_topology_order)
{
	static const char *const order[] = {"sim:2", "sim:3", "sim:0", "sim:1", "cpu:0"};
	struct th_daemon d;
	json_t *t, *devs;
	char *log;

	find_file();
	start(&d, "1,1,0,0");
	t = th_get_object(&d, "/v1/devices");
	devs = json_object_get(t, "devices");
	ck_assert_uint_eq(json_array_size(devs), 5);
	for (size_t i = 0; i < 5; i++)
		expect_id(devs, i, order[i]);
	expect_place(json_array_get(devs, 0), 0, "0-7");
	json_decref(t);

	t = th_get_object(&d, "/v1/topology");
	devs = json_object_get(t, "devices");
	ck_assert_uint_eq(json_array_size(devs), 5);
	for (size_t i = 0; i < 5; i++)
		expect_id(devs, i, order[i]);
	expect_binding(json_array_get(devs, 0), true, true, false, "local CPUs 0-7");
	expect_binding(json_array_get(devs, 3), true, true, false,
	               "nothing bound: the topology is from a file");
	expect_binding(json_array_get(devs, 4), true, false, false, "all the node's 16 CPUs");
	json_decref(t);

	log = th_daemon_stderr(&d);
	ck_assert_msg(strstr(log, "\"cpu_binding\"") != NULL, "no binding in the log: %s", log);
	free(log);
	th_daemon_stop_ok(&d);
}
END_TEST

/* The Cpus_allowed_list of the daemon's first thread named name, into
 * out; false when there is none. */
static bool thread_cpus(pid_t pid, const char *name, char *out, size_t cap)
{
	char path[128], line[256];
	struct dirent *e;
	bool found = false;
	DIR *dir;

	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	while (!found && (e = readdir(dir))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%.20s/comm", (int)pid, e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		found = fgets(line, sizeof line, f) && strncmp(line, name, strlen(name)) == 0 &&
		        line[strlen(name)] == '\n';
		fclose(f);
		if (!found)
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%.20s/status", (int)pid, e->d_name);
		f = fopen(path, "r");
		ck_assert_ptr_nonnull(f);
		out[0] = '\0';
		while (fgets(line, sizeof line, f))
			if (strncmp(line, "Cpus_allowed_list:", 18) == 0)
				snprintf(out, cap, "%s", line + 18 + strspn(line + 18, " \t"));
		out[strcspn(out, "\n")] = '\0';
		fclose(f);
	}
	closedir(dir);
	return found;
}

/* This machine: the binding is applied, and the queue workers of each
 * sim device run on its local CPUs. */
START_TEST(test_binding_applied_on_this_machine)
{
	const char *const args[] = {"--no-cuda", "--sim-devices", "2", "--sim-device-memory",
	                            TH_SIM_MEMORY_ARG, NULL};
	struct th_daemon d;
	json_t *t, *devs;
	int checked = 0;

	th_daemon_start_ex(&d, &(struct th_start){.args = args, .no_backend_args = true});
	t = th_get_object(&d, "/v1/topology");
	devs = json_object_get(t, "devices");
	for (size_t i = 0; i < json_array_size(devs); i++) {
		json_t *o = json_array_get(devs, i), *b = json_object_get(o, "cpu_binding");
		const char *id = json_string_value(json_object_get(o, "id"));
		const char *cpus = json_string_value(json_object_get(o, "local_cpus"));
		char name[32], got[256];

		ck_assert_msg(json_is_object(b), "%s: no cpu_binding", id);
		if (!json_is_true(json_object_get(b, "applied")) || !cpus) {
			fprintf(stderr, "topology: %s not bound: %s\n", id,
			        json_string_value(json_object_get(b, "reason")));
			continue;
		}
		/* every device has the stager's queues from the start */
		snprintf(name, sizeof name, "tsq-%.11s", id);
		ck_assert_msg(thread_cpus(d.pid, name, got, sizeof got), "%s: no thread %s", id,
		              name);
		ck_assert_msg(strcmp(got, cpus) == 0, "%s's queue worker may run on %s, not on its "
		              "local CPUs %s", id, got, cpus);
		fprintf(stderr, "topology: %s's queue worker on %s\n", id, got);
		checked++;
	}
	fprintf(stderr, "topology: %d devices' queue workers bound\n", checked);
	json_decref(t);
	th_daemon_stop_ok(&d);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("topology");
	TCase *tc = tcase_create("topology"), *cuda = tcase_create("cuda");

	tcase_add_test(tc, test_two_socket_file_and_sim_placement);
	tcase_add_test(tc, test_bad_placement_refused_at_start);
	tcase_add_test(tc, test_bad_peer_links_refused_at_start);
	tcase_add_test(tc, test_peer_matrix_and_copy_paths);
	tcase_add_test(tc, test_pinned_pools_per_numa_node);
	tcase_add_test(tc, test_binding_decided_and_devices_in_topology_order);
	tcase_add_test(tc, test_binding_applied_on_this_machine);
	/* daemons start slowly under sanitizers on a loaded machine */
	tcase_set_timeout(tc, 60);
	tcase_set_timeout(cuda, 120);
	tcase_add_test(cuda, test_cuda_copy_paths_follow_the_matrix);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, cuda);
	return s;
}
