/*
 * it_lease.c - Check suite "lease": the lease service beside --unix-socket
 * ("<socket>.lease"). A client on the same node leases an array in host
 * memory and maps the descriptor it receives (SCM_RIGHTS) read-only: the
 * bytes stay as they were while the name is replaced or deleted, and the
 * memory goes back to its space (/v1/memory bytes_in_use) only when the
 * lease is released or the client's connection closes, also when the client
 * is killed. A writable lease is invisible until published and freed when
 * its connection closes unpublished. Read-only descriptors cannot be mapped
 * for writing or truncated; descriptors a client sends are dropped; the
 * lease socket's file has the mode of --unix-socket-mode. Device arrays
 * follow the same rules: on sim a descriptor of the sim device's memfd
 * (mapped and checked byte for byte, also while the array is moved to host
 * memory), on a GPU a CUDA IPC handle of device memory of the lease's own
 * (a copy of the version for a read lease; its shape and the accounting
 * checked, the handle opened here with cudaIpcOpenMemHandle and the bytes
 * read and written through it: writes through a read lease, or through a
 * writer's handle after publish, never reach the version). Pinned host memory is shareable on every backend once --unix-socket
 * is on (on CUDA, memfd pages pinned with cudaHostRegister).
 *
 * What no lessee can do, whatever it does with a descriptor: write a
 * version through a read lease's descriptor reopened read-write
 * (/proc/self/fd, O_RDWR), change a published version through the writer's
 * mapping, or see other arrays' bytes in a view it keeps after its lease
 * ended and the memory was used again; frames pipelined in one write are
 * answered in order, every one; a flood of connections under a
 * 1,024-descriptor limit is capped, refused with a readable error, costs
 * no spinning, and HTTP keeps answering.
 *
 * Each test case runs in its own forked process with its own daemon.
 */
#include "tests/integration/harness.h"
#include "tests/integration/lease_wire.h"

#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1u << 20)

static struct th_daemon d;
static char sock[300];

static void start(const char *mode)
{
	char dir[256];
	const char *args[] = {"--unix-socket", sock, "--unix-socket-mode", mode, NULL};

	snprintf(sock, sizeof sock, "%s/s", th_temp_dir("lease", dir, sizeof dir));
	th_daemon_start(&d, args);
}

static long long in_use(const char *dev, const char *kind)
{
	struct th_response r;
	json_t *spaces = th_arr(th_get_json(&d, "/v1/memory", &r), "spaces"), *s;
	long long v = -1;
	size_t i;

	json_array_foreach(spaces, i, s)
		if (strcmp(th_str(s, "device"), dev) == 0 && strcmp(th_str(s, "memory_kind"), kind) == 0)
			v = th_int(s, "bytes_in_use");
	th_response_free(&r);
	ck_assert_msg(v >= 0, "no space %s/%s in /v1/memory", dev, kind);
	return v;
}

/* bytes_in_use of (dev, kind) once it reads want (a closed connection is
 * served a moment later), or its value after timeout_ms. */
static long long settle_on(const char *dev, const char *kind, long long want, int timeout_ms)
{
	long long deadline = th_now_ms() + timeout_ms, v = in_use(dev, kind);

	while (v != want && th_now_ms() < deadline) {
		usleep(20000);
		v = in_use(dev, kind);
	}
	return v;
}

static long long settle(const char *kind, long long want, int timeout_ms)
{
	return settle_on("cpu:0", kind, want, timeout_ms);
}

static void upload_on(const char *name, const char *dev, const char *kind, const void *data,
                      size_t n)
{
	char path[256];
	struct th_response r;

	snprintf(path, sizeof path, "/v1/arrays/%s?dtype=uint8&shape=%zu&device=%s&memory_kind=%s",
	         name, n, dev, kind);
	th_request(&d, "PUT", path, NULL, data, n, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "PUT %s: %ld %s", path, r.status, r.body);
	th_response_free(&r);
}

static void upload(const char *name, const char *kind, const void *data, size_t n)
{
	upload_on(name, "cpu:0", kind, data, n);
}

static long http_status(const char *method, const char *path)
{
	struct th_response r;
	long s;

	th_request(&d, method, path, NULL, NULL, 0, &r);
	s = r.status;
	th_response_free(&r);
	return s;
}

struct mapped {
	json_t *answer;
	const unsigned char *data;      /* NULL for a shard handed by CUDA IPC */
	void *base;
	size_t maplen;
	uint64_t lease;
	void *ipc_base;                 /* a CUDA IPC handle opened here, or NULL */
	unsigned char *dev_data;        /* the array's bytes in it (device memory) */
};

/* ---- the CUDA runtime, where the suite runs on a GPU ---------------------- */

/* cudaIpcMemHandle_t as the runtime takes it: 64 bytes, by value. */
/* A GPU array's lease opened in this process as a client opens it, so that
 * on CUDA the lease rules are checked byte for byte, as a mapping's are on
 * sim. Each case runs in a process of its own (fork mode): the runtime is
 * initialised in it, never in the parent. A build without CUDA has no GPU
 * arrays, so these run only where the suite was built with CUDA. */
#if TS_HAVE_CUDA
#include <cuda_runtime.h>

static int gpu_open(const char *pci_bus_id, const unsigned char handle[64], void **base)
{
	cudaIpcMemHandle_t h;
	int dev = -1;

	memcpy(&h, handle, sizeof h);
	ck_assert_int_eq(cudaDeviceGetByPCIBusId(&dev, pci_bus_id), cudaSuccess);
	ck_assert_int_eq(cudaSetDevice(dev), cudaSuccess);
	return (int)cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess);
}

static int gpu_close(void *base)
{
	return (int)cudaIpcCloseMemHandle(base);
}

/* n bytes between host and device memory, done when it returns */
static int gpu_copy(void *dst, const void *src, size_t n)
{
	cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDefault);

	return (int)(e == cudaSuccess ? cudaDeviceSynchronize() : e);
}
#else
static int gpu_open(const char *pci_bus_id, const unsigned char handle[64], void **base)
{
	ck_abort_msg("a CUDA IPC shard (%s) from a daemon built without CUDA", pci_bus_id);
	return -1;
}

static int gpu_close(void *base)
{
	return -1;
}

static int gpu_copy(void *dst, const void *src, size_t n)
{
	return -1;
}
#endif

/* Opens the handle of a "cuda_ipc" shard on the GPU of its bus id. */
static void ipc_open(json_t *sh, struct mapped *m)
{
	json_t *ipc = th_obj(sh, "cuda_ipc");
	unsigned char h[64];
	void *base = NULL;
	int e;

	ck_assert_int_eq(lw_ipc_handle(sh, h), 0);
	e = gpu_open(th_str(ipc, "pci_bus_id"), h, &base);
	ck_assert_msg(e == 0 && base, "cudaIpcOpenMemHandle: error %d", e);
	m->ipc_base = base;
	m->dev_data = (unsigned char *)base + th_int(sh, "offset");
}

/* Checks a shard handed by CUDA IPC (a GPU's device array): a handle of
 * 128 hex digits, the array's bytes inside the chunk it names, the GPU's
 * ordinal, PCI bus id and UUID as /v1/devices says them. */
static void check_ipc_shard(json_t *sh)
{
	json_t *ipc = th_obj(sh, "cuda_ipc");
	const char *hex = th_str(ipc, "handle"), *dev = th_str(sh, "device");
	char path[96];
	struct th_response r;
	json_t *props;

	ck_assert_uint_eq(strlen(hex), 128);
	ck_assert_uint_eq(strspn(hex, "0123456789abcdef"), 128);
	/* the handle names memory of the lease's own: these bytes, nothing else */
	ck_assert_int_eq(th_int(sh, "offset"), 0);
	ck_assert_int_eq(th_int(ipc, "chunk_bytes"),
	                 th_int(sh, "length") > 0 ? th_int(sh, "length") : 1);
	snprintf(path, sizeof path, "/v1/devices/%s", dev);
	props = th_get_json(&d, path, &r);
	ck_assert_int_eq(th_int(ipc, "ordinal"), atoi(strchr(dev, ':') + 1));
	ck_assert_str_eq(th_str(ipc, "pci_bus_id"), th_str(props, "pci_bus_id"));
	ck_assert_msg(strncmp(th_str(ipc, "uuid"), "GPU-", 4) == 0, "uuid '%s'",
	              th_str(ipc, "uuid"));
	th_response_free(&r);
}

/* Leases name (or creates it from a create request) on fd and maps its one
 * shard; a shard handed by CUDA IPC is checked, not mapped (data NULL). */
static void lease_map(int fd, const char *req, bool writable, struct mapped *m)
{
	int fds[LW_MAX_FDS], nfds = 0;
	json_t *sh;

	m->answer = lw_call(fd, req, fds, &nfds);
	ck_assert_msg(m->answer && !json_object_get(m->answer, "error"), "%s: %s", req,
	              m->answer ? json_dumps(m->answer, 0) : "no answer");
	sh = json_array_get(th_arr(m->answer, "shards"), 0);
	m->lease = (uint64_t)th_int(m->answer, "lease");
	m->data = NULL;
	m->base = NULL;
	m->ipc_base = NULL;
	m->dev_data = NULL;
	if (strcmp(th_str(sh, "transport"), "cuda_ipc") == 0) {
		ck_assert_int_eq(nfds, 0);
		check_ipc_shard(sh);
		ipc_open(sh, m);
		return;
	}
	ck_assert_str_eq(th_str(sh, "transport"), "fd");
	ck_assert_int_eq(nfds, 1);
	m->data = lw_map(fds[0], (uint64_t)th_int(sh, "offset"), (uint64_t)th_int(sh, "length"),
	                 writable, 0, &m->base, &m->maplen);
	ck_assert_msg(m->data != NULL, "mmap: %s", strerror(errno));
	close(fds[0]);
}

static void unmap(struct mapped *m)
{
	if (m->base)
		munmap(m->base, m->maplen);
	if (m->ipc_base)
		ck_assert_int_eq(gpu_close(m->ipc_base), 0);
	json_decref(m->answer);
}

/* th_assert_bytes over a lease's bytes, mapped (host, sim) or opened
 * (CUDA IPC). */
static void assert_mapped(const char *what, const struct mapped *m, const void *want, size_t n)
{
	unsigned char *got;

	if (m->data) {
		th_assert_bytes(what, m->data, n, want, n);
		return;
	}
	ck_assert_ptr_nonnull(m->dev_data);
	got = malloc(n);
	ck_assert_ptr_nonnull(got);
	ck_assert_int_eq(gpu_copy(got, m->dev_data, n), 0);
	th_assert_bytes(what, got, n, want, n);
	free(got);
}

/* Writes n bytes of src into a writable lease, done when it returns. */
static void fill_leased(struct mapped *m, const void *src, size_t n)
{
	if (m->data) {
		memcpy((void *)m->data, src, n);
		return;
	}
	ck_assert_ptr_nonnull(m->dev_data);
	ck_assert_int_eq(gpu_copy(m->dev_data, src, n), 0);  /* another process reads it next */
}

static void release(int fd, uint64_t lease)
{
	char req[96];
	int nfds;
	json_t *j;

	snprintf(req, sizeof req, "{\"op\":\"release\",\"lease\":%llu}", (unsigned long long)lease);
	ck_assert_int_eq(lw_send_frame(fd, req, (uint32_t)strlen(req), NULL, 0), 0);
	j = lw_call(fd, "{\"op\":\"ping\"}", NULL, &nfds);     /* releases have no answer */
	ck_assert_msg(j && json_object_size(j) == 0, "ping after release");
	json_decref(j);
}

/* Releases m's lease; a CUDA IPC handle is closed first, as the protocol
 * asks (the lease's device memory is freed on release), while a mapping
 * stays mapped (unmap does it later). */
static void release_mapped(int fd, struct mapped *m)
{
	if (m->ipc_base) {
		ck_assert_int_eq(gpu_close(m->ipc_base), 0);
		m->ipc_base = NULL;
	}
	release(fd, m->lease);
}

/* A lease of a's version on (dev, kind) keeps its bytes and its memory while
 * the name is replaced and deleted; the memory goes back on release. */
static void check_kept_on(const char *dev, const char *kind)
{
	unsigned char *v1 = th_pattern(4 * MiB, 1), *v2 = th_pattern(4 * MiB, 2);
	struct th_response r;
	struct mapped m;
	int fd;

	upload_on("a", dev, kind, v1, 4 * MiB);
	fd = lw_connect(sock);
	ck_assert_int_ge(fd, 0);
	lease_map(fd, "{\"op\":\"lease\",\"name\":\"a\"}", false, &m);
	ck_assert_str_eq(th_str(m.answer, "dtype"), "uint8");
	ck_assert_int_eq(th_int(m.answer, "nbytes"), 4 * MiB);
	assert_mapped("mapped", &m, v1, 4 * MiB);

	/* replaced: the name reads the new bytes, the mapping the old */
	upload_on("a", dev, kind, v2, 4 * MiB);
	th_get(&d, "/v1/arrays/a/data", &r);
	th_assert_bytes("downloaded", r.body, r.body_len, v2, 4 * MiB);
	th_response_free(&r);
	assert_mapped("mapped after replace", &m, v1, 4 * MiB);
	ck_assert_int_eq(in_use(dev, kind), 8 * MiB);

	/* deleted: still the old bytes, still held */
	ck_assert_int_eq(http_status("DELETE", "/v1/arrays/a"), 200);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/a"), 404);
	assert_mapped("mapped after delete", &m, v1, 4 * MiB);
	ck_assert_int_eq(in_use(dev, kind), 4 * MiB);

	release_mapped(fd, &m);
	ck_assert_int_eq(in_use(dev, kind), 0);
	unmap(&m);
	close(fd);
	free(v1);
	free(v2);
}

static void check_kept(const char *kind)
{
	check_kept_on("cpu:0", kind);
}

START_TEST(test_kept_while_replaced_and_deleted)
{
	start("0600");
	check_kept("unpinned_host");
	/* memfd pages: without CUDA as they are, on CUDA pinned with
	 * cudaHostRegister (the GPU suite runs this case there) */
	check_kept("pinned_host");
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_killed_client_returns_memory)
{
	unsigned char *v = th_pattern(8 * MiB, 3);
	int ready[2];
	char c = 0;
	pid_t pid;

	start("0600");
	upload("k", "unpinned_host", v, 8 * MiB);
	ck_assert_int_eq(pipe(ready), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = lw_connect(sock), fds[LW_MAX_FDS], nfds;
		json_t *a = fd >= 0 ? lw_call(fd, "{\"op\":\"lease\",\"name\":\"k\"}", fds, &nfds) : NULL;
		json_t *w = fd >= 0 ? lw_call(fd, "{\"op\":\"create\",\"name\":\"never\",\"dtype\":"
		                                  "\"uint8\",\"shape\":[1048576],\"device\":\"cpu:0\","
		                                  "\"memory_kind\":\"unpinned_host\"}", fds, &nfds)
		                    : NULL;

		c = a && w && !json_object_get(a, "error") && !json_object_get(w, "error") ? 'y' : 'n';
		if (write(ready[1], &c, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(ready[1]);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(c, 'y');
	ck_assert_int_eq(http_status("DELETE", "/v1/arrays/k"), 200);
	ck_assert_int_eq(in_use("cpu:0", "unpinned_host"), 9 * MiB);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/never"), 404);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	ck_assert_int_eq(settle("unpinned_host", 0, 10000), 0);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/never"), 404);
	close(ready[0]);
	free(v);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_write_lease)
{
	const char *kind = "pinned_host";
	char req[256];
	struct th_response r;
	struct mapped m;
	int fd, nfds;
	json_t *j;

	start("0600");
	fd = lw_connect(sock);
	ck_assert_int_ge(fd, 0);
	snprintf(req, sizeof req, "{\"op\":\"create\",\"name\":\"w\",\"dtype\":\"uint8\","
	         "\"shape\":[2,1048576],\"device\":\"cpu:0\",\"memory_kind\":\"%s\"}", kind);
	lease_map(fd, req, true, &m);
	ck_assert(th_bool(m.answer, "writable"));
	th_fill((void *)m.data, 2 * MiB, 7);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/w"), 404);    /* not yet */
	ck_assert_int_eq(in_use("cpu:0", kind), 2 * MiB);
	snprintf(req, sizeof req, "{\"op\":\"publish\",\"lease\":%llu}", (unsigned long long)m.lease);
	j = lw_call(fd, req, NULL, &nfds);
	ck_assert_msg(j && !json_object_get(j, "error"), "publish");
	ck_assert_str_eq(th_str(j, "name"), "w");
	json_decref(j);
	th_get(&d, "/v1/arrays/w/data", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Shape"), "[2,1048576]");
	{
		unsigned char *want = th_pattern(2 * MiB, 7);

		th_assert_bytes("published", r.body, r.body_len, want, 2 * MiB);
		free(want);
	}
	th_response_free(&r);
	unmap(&m);

	/* a second writer that never publishes: nothing visible, memory back
	 * when its connection closes */
	snprintf(req, sizeof req, "{\"op\":\"create\",\"name\":\"ghost\",\"dtype\":\"float32\","
	         "\"shape\":[262144],\"device\":\"cpu:0\",\"memory_kind\":\"%s\"}", kind);
	lease_map(fd, req, true, &m);
	memset((void *)m.data, 1, MiB);
	ck_assert_int_eq(in_use("cpu:0", kind), 3 * MiB);
	close(fd);
	ck_assert_int_eq(settle(kind, 2 * MiB, 10000), 2 * MiB);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/ghost"), 404);
	unmap(&m);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- device arrays ------------------------------------------------------- */

START_TEST(test_device_kept_while_replaced_and_deleted)
{
	start("0600");
	check_kept_on(th_dev(0), "device");
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_device_kept_while_moved)
{
	const char *json[] = {"Content-Type: application/json", NULL};
	unsigned char *v = th_pattern(4 * MiB, 5);
	char body[128];
	struct th_response r;
	struct mapped m;
	int fd;

	start("0600");
	upload_on("mv", th_dev(0), "device", v, 4 * MiB);
	fd = lw_connect(sock);
	ck_assert_int_ge(fd, 0);
	lease_map(fd, "{\"op\":\"lease\",\"name\":\"mv\"}", false, &m);
	ck_assert_str_eq(th_str(json_array_get(th_arr(m.answer, "shards"), 0), "memory_kind"),
	                 "device");
	assert_mapped("mapped", &m, v, 4 * MiB);
	snprintf(body, sizeof body, "{\"device\": \"cpu:0\", \"memory_kind\": \"pinned_host\"}");
	th_request(&d, "POST", "/v1/arrays/mv:put?wait=true", json, body, strlen(body), &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	th_response_free(&r);
	/* moved: the name is in pinned_host now, the leased version still on
	 * the device, its bytes as they were */
	ck_assert_int_eq(in_use("cpu:0", "pinned_host"), 4 * MiB);
	ck_assert_int_eq(in_use(th_dev(0), "device"), 4 * MiB);
	assert_mapped("mapped after the move", &m, v, 4 * MiB);
	release_mapped(fd, &m);
	ck_assert_int_eq(in_use(th_dev(0), "device"), 0);
	th_get(&d, "/v1/arrays/mv/data", &r);
	th_assert_bytes("moved", r.body, r.body_len, v, 4 * MiB);
	th_response_free(&r);
	unmap(&m);
	close(fd);
	free(v);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_device_write_lease)
{
	unsigned char *want = th_pattern(2 * MiB, 9);
	char req[256];
	struct th_response r;
	struct mapped m;
	int fd, nfds;
	json_t *j;

	start("0600");
	fd = lw_connect(sock);
	ck_assert_int_ge(fd, 0);
	snprintf(req, sizeof req, "{\"op\":\"create\",\"name\":\"dw\",\"dtype\":\"uint8\","
	         "\"shape\":[2097152],\"device\":\"%s\",\"memory_kind\":\"device\"}", th_dev(0));
	lease_map(fd, req, true, &m);
	ck_assert(th_bool(m.answer, "writable"));
	fill_leased(&m, want, 2 * MiB);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/dw"), 404);    /* not yet */
	ck_assert_int_eq(in_use(th_dev(0), "device"), 2 * MiB);
	snprintf(req, sizeof req, "{\"op\":\"publish\",\"lease\":%llu}", (unsigned long long)m.lease);
	j = lw_call(fd, req, NULL, &nfds);
	ck_assert_msg(j && !json_object_get(j, "error"), "publish");
	json_decref(j);
	th_get(&d, "/v1/arrays/dw/data", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(r.body_len, 2 * MiB);
	th_assert_bytes("published", r.body, r.body_len, want, 2 * MiB);
	th_response_free(&r);
	unmap(&m);

	/* a writer that never publishes: nothing visible, the device's memory
	 * back when its connection closes */
	snprintf(req, sizeof req, "{\"op\":\"create\",\"name\":\"dghost\",\"dtype\":\"float32\","
	         "\"shape\":[262144],\"device\":\"%s\",\"memory_kind\":\"device\"}", th_dev(0));
	lease_map(fd, req, true, &m);
	ck_assert_int_eq(in_use(th_dev(0), "device"), 3 * MiB);
	close(fd);
	ck_assert_int_eq(settle_on(th_dev(0), "device", 2 * MiB, 10000), 2 * MiB);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/dghost"), 404);
	unmap(&m);
	free(want);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_device_killed_client_and_many_leases)
{
	unsigned char *v = th_pattern(MiB, 6);
	char req[256];
	int ready[2], conns[3];
	char c = 0;
	pid_t pid;

	start("0600");
	upload_on("dk", th_dev(0), "device", v, MiB);
	ck_assert_int_eq(pipe(ready), 0);
	snprintf(req, sizeof req, "{\"op\":\"create\",\"name\":\"dnever\",\"dtype\":\"uint8\","
	         "\"shape\":[1048576],\"device\":\"%s\",\"memory_kind\":\"device\"}", th_dev(0));
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fd = lw_connect(sock), fds[LW_MAX_FDS], nfds;
		json_t *a = fd >= 0 ? lw_call(fd, "{\"op\":\"lease\",\"name\":\"dk\"}", fds, &nfds)
		                    : NULL;
		json_t *w = fd >= 0 ? lw_call(fd, req, fds, &nfds) : NULL;

		c = a && w && !json_object_get(a, "error") && !json_object_get(w, "error") ? 'y' : 'n';
		if (write(ready[1], &c, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(ready[1]);
	ck_assert_int_eq(read(ready[0], &c, 1), 1);
	ck_assert_int_eq(c, 'y');
	close(ready[0]);

	/* many leases of one version on three connections besides */
	for (int k = 0; k < 3; k++) {
		conns[k] = lw_connect(sock);
		ck_assert_int_ge(conns[k], 0);
		for (int i = 0; i < 40; i++) {
			struct mapped m;

			lease_map(conns[k], "{\"op\":\"lease\",\"name\":\"dk\"}", false, &m);
			assert_mapped("one of many", &m, v, MiB);
			unmap(&m);          /* unmapped; the lease stays until its connection ends */
		}
	}
	ck_assert_int_eq(http_status("DELETE", "/v1/arrays/dk"), 200);
	ck_assert_int_eq(in_use(th_dev(0), "device"), 2 * MiB);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	/* the killed client's writer is gone; its lease of dk is one of many */
	ck_assert_int_eq(settle_on(th_dev(0), "device", MiB, 10000), MiB);
	ck_assert_int_eq(http_status("GET", "/v1/arrays/dnever"), 404);
	/* the version stays while any connection holds a lease of it */
	close(conns[0]);
	close(conns[1]);
	ck_assert_int_eq(in_use(th_dev(0), "device"), MiB);
	close(conns[2]);
	ck_assert_int_eq(settle_on(th_dev(0), "device", 0, 10000), 0);
	free(v);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_read_only_descriptors)
{
	unsigned char *v = th_pattern(MiB, 4);
	int fd, fds[LW_MAX_FDS], nfds;
	json_t *a;
	void *w;

	start("0600");
	upload("ro", "unpinned_host", v, MiB);
	fd = lw_connect(sock);
	a = lw_call(fd, "{\"op\":\"lease\",\"name\":\"ro\"}", fds, &nfds);
	ck_assert_msg(a && nfds == 1, "lease");
	w = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
	ck_assert_ptr_eq(w, MAP_FAILED);
	ck_assert_int_eq(errno, EACCES);
	ck_assert_int_ne(ftruncate(fds[0], 0), 0);
	ck_assert_int_lt(write(fds[0], "x", 1), 0);
	close(fds[0]);
	json_decref(a);
	close(fd);
	free(v);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_refusals)
{
	char path[8];
	int fd, nfds, p[2];
	struct pollfd pf;
	json_t *j;

	start("0600");
	fd = lw_connect(sock);
	ck_assert_int_ge(fd, 0);
	j = lw_call(fd, "{\"op\":\"lease\",\"name\":\"missing\"}", NULL, &nfds);
	ck_assert_str_eq(th_str(th_obj(j, "error"), "status"), "NOT_FOUND");
	json_decref(j);

	/* a descriptor sent to the service is dropped, not kept: the pipe's
	 * read end sees EOF once ours is closed */
	ck_assert_int_eq(pipe(p), 0);
	ck_assert_int_eq(lw_send_frame(fd, "{\"op\":\"ping\"}", 13, &p[1], 1), 0);
	close(p[1]);
	j = lw_recv(fd, NULL, &nfds);
	ck_assert_msg(j && json_object_size(j) == 0, "ping");
	json_decref(j);
	pf = (struct pollfd){.fd = p[0], .events = POLLIN};
	ck_assert_int_eq(poll(&pf, 1, 5000), 1);
	ck_assert_int_eq(read(p[0], path, 1), 0);
	close(p[0]);

	/* a frame that cannot be read: answered, then the connection closes */
	ck_assert_int_eq(lw_send_frame(fd, "", 0, NULL, 0), 0);
	j = lw_recv(fd, NULL, &nfds);
	ck_assert_str_eq(th_str(th_obj(j, "error"), "status"), "INVALID_ARGUMENT");
	json_decref(j);
	ck_assert_ptr_null(lw_recv(fd, NULL, &nfds));
	close(fd);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_socket_mode)
{
	char lease[320];
	struct stat st;

	start("0640");
	snprintf(lease, sizeof lease, "%s.lease", sock);
	ck_assert_int_eq(stat(lease, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode));
	ck_assert_int_eq(st.st_mode & 0777, 0640);
	th_daemon_stop_ok(&d);
	ck_assert_int_ne(access(lease, F_OK), 0);      /* removed at stop */
}
END_TEST

/* ---- what no lessee can do (issue 29) ------------------------------------------ */

static char *etag_of(const char *name)
{
	char path[128];
	struct th_response r;
	char *e;

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	e = strdup(th_str(th_get_json(&d, path, &r), "etag"));
	th_response_free(&r);
	return e;
}

static void assert_downloaded(const char *name, const void *want, size_t n, const char *etag)
{
	char path[128];
	struct th_response r;
	char *now;

	snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
	th_get(&d, path, &r);
	ck_assert_int_eq(r.status, 200);
	th_assert_bytes(name, r.body, r.body_len, want, n);
	th_response_free(&r);
	now = etag_of(name);
	ck_assert_str_eq(now, etag);
	free(now);
}

/* Every way to write through fd, reopened read-write, fails; 0 when none
 * wrote. */
static void assert_no_write_through(int fd, size_t len)
{
	char path[64];
	int rw;
	void *m;

	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	rw = open(path, O_RDWR);         /* same uid (root here): the open itself works */
	if (rw < 0) {
		ck_assert_int_eq(errno, EACCES);
		return;
	}
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
	ck_assert_msg(m == MAP_FAILED, "a reopened read lease mapped writable");
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_lt(pwrite(rw, "x", 1, 0), 0);
	ck_assert_int_eq(errno, EPERM);
	ck_assert_int_ne(fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
	m = mmap(NULL, len, PROT_READ, MAP_SHARED, rw, 0);
	ck_assert_ptr_ne(m, MAP_FAILED);
	ck_assert_int_ne(mprotect(m, len, PROT_READ | PROT_WRITE), 0);
	munmap(m, len);
	close(rw);
}

static void check_reopen_on(const char *dev, const char *kind)
{
	unsigned char *v = th_pattern(MiB, 11);
	int fd = lw_connect(sock), fds[LW_MAX_FDS], nfds = 0;
	char *etag;
	json_t *a, *sh;

	upload_on("r1", dev, kind, v, MiB);
	etag = etag_of("r1");
	ck_assert_int_ge(fd, 0);
	a = lw_call(fd, "{\"op\":\"lease\",\"name\":\"r1\"}", fds, &nfds);
	ck_assert_msg(a && nfds == 1, "lease on %s/%s", dev, kind);
	sh = json_array_get(th_arr(a, "shards"), 0);
	assert_no_write_through(fds[0], (size_t)(th_int(sh, "offset") + th_int(sh, "length")));
	assert_downloaded("r1", v, MiB, etag);
	close(fds[0]);
	json_decref(a);
	close(fd);
	free(etag);
	free(v);
}

START_TEST(test_reopened_read_lease_cannot_write)
{
	start("0666");
	check_reopen_on("cpu:0", "unpinned_host");
	check_reopen_on("cpu:0", "pinned_host");
	/* a sim device's memory is a memfd like host memory; a GPU's array is
	 * leased by CUDA IPC, which maps read-write whatever the lease says
	 * (docs/API.md): no descriptor to reopen there */
	if (th_backend_is_sim())
		check_reopen_on(th_dev(0), "device");
	th_daemon_stop_ok(&d);
}
END_TEST

/* A gauge of /metrics, without labels. */
static double gauge(const char *name)
{
	struct th_response r;
	double v = -1;

	th_get(&d, "/metrics", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_msg(th_prom_find(r.body, name, NULL, &v), "no %s", name);
	th_response_free(&r);
	return v;
}

/* A read lease of a GPU's array is a CUDA IPC handle, which maps read-write
 * whatever the lease says: the handle names a copy of the version made for
 * that lease, so writing through it changes neither what GET answers nor
 * the ETag, nor another lease of the same version; that memory is the
 * lease's own, outside the device pool, counted by /metrics until the lease
 * is released. (On sim, the reopened descriptor case above covers the same
 * rule.) */
START_TEST(test_device_read_lease_writes_reach_nothing)
{
	unsigned char *v = th_pattern(MiB, 21), *scribble = th_pattern(MiB, 22);
	struct mapped m1, m2, m3;
	char *etag;
	int fd;

	start("0600");
	upload_on("gw", th_dev(0), "device", v, MiB);
	etag = etag_of("gw");
	fd = lw_connect(sock);
	ck_assert_int_ge(fd, 0);
	lease_map(fd, "{\"op\":\"lease\",\"name\":\"gw\"}", false, &m1);
	lease_map(fd, "{\"op\":\"lease\",\"name\":\"gw\"}", false, &m2);
	if (m1.data) {               /* sim: a read-only mapping, nothing to write */
		ck_assert(gauge("tstage_lease_device_bytes") == 0);
		unmap(&m1);
		unmap(&m2);
		goto out;
	}
	/* the GPU's lease memory lies outside the device pool */
	ck_assert_int_eq(in_use(th_dev(0), "device"), MiB);
	ck_assert(gauge("tstage_lease_device_bytes") == 2.0 * MiB);
	ck_assert(gauge("tstage_lease_device_allocations") == 2);
	fill_leased(&m1, scribble, MiB);
	assert_mapped("written through its own lease", &m1, scribble, MiB);
	assert_downloaded("gw", v, MiB, etag);
	assert_mapped("another lease of the version", &m2, v, MiB);
	lease_map(fd, "{\"op\":\"lease\",\"name\":\"gw\"}", false, &m3);
	assert_mapped("a later lease", &m3, v, MiB);
	unmap(&m1);
	unmap(&m2);
	unmap(&m3);
	ck_assert(gauge("tstage_lease_device_bytes") == 3.0 * MiB);
	release(fd, m1.lease);
	release(fd, m2.lease);
	release(fd, m3.lease);
	ck_assert(gauge("tstage_lease_device_bytes") == 0);
	ck_assert(gauge("tstage_lease_device_allocations") == 0);
	assert_downloaded("gw", v, MiB, etag);
out:
	close(fd);
	free(etag);
	free(scribble);
	free(v);
	th_daemon_stop_ok(&d);
}
END_TEST

static void check_publish_freezes_on(const char *dev, const char *kind)
{
	unsigned char *want = th_pattern(MiB, 12), *scribble = th_pattern(MiB, 99);
	char req[256];
	struct mapped m;
	struct stat st;
	int fd = lw_connect(sock), nfds;
	char *etag;
	json_t *j, *sh;

	ck_assert_int_ge(fd, 0);
	snprintf(req, sizeof req, "{\"op\":\"create\",\"name\":\"pf\",\"dtype\":\"uint8\","
	         "\"shape\":[1048576],\"device\":\"%s\",\"memory_kind\":\"%s\"}", dev, kind);
	lease_map(fd, req, true, &m);
	/* the writer's memory holds this array only */
	sh = json_array_get(th_arr(m.answer, "shards"), 0);
	ck_assert_int_eq(th_int(sh, "offset"), 0);
	fill_leased(&m, want, MiB);
	snprintf(req, sizeof req, "{\"op\":\"publish\",\"lease\":%llu}", (unsigned long long)m.lease);
	j = lw_call(fd, req, NULL, &nfds);
	ck_assert_msg(j && !json_object_get(j, "error"), "publish");
	etag = strdup(th_str(j, "etag"));
	json_decref(j);
	assert_downloaded("pf", want, MiB, etag);
	/* the writer writes on after publish (through its mapping, or its CUDA
	 * IPC handle on a GPU): the version does not change */
	fill_leased(&m, scribble, MiB);
	assert_downloaded("pf", want, MiB, etag);
	(void)st;
	unmap(&m);
	/* nor does it once the connection is gone */
	close(fd);
	assert_downloaded("pf", want, MiB, etag);
	ck_assert_int_eq(http_status("DELETE", "/v1/arrays/pf"), 200);
	free(etag);
	free(scribble);
	free(want);
}

START_TEST(test_published_version_does_not_change)
{
	start("0600");
	check_publish_freezes_on("cpu:0", "pinned_host");
	check_publish_freezes_on("cpu:0", "unpinned_host");
	check_publish_freezes_on(th_dev(0), "device");
	th_daemon_stop_ok(&d);
}
END_TEST

/* n lease frames of name in one write, then a ping: every one answered, in
 * order (lease ids rising), each with its descriptor. */
static void check_pipelined(int fd, const char *name, int n)
{
	char one[128];
	size_t len = (size_t)snprintf(one, sizeof one, "{\"op\":\"lease\",\"name\":\"%s\"}", name);
	size_t per = 4 + len, total = per * (size_t)n + 4 + 13, off = 0;
	unsigned char *buf = malloc(total);
	long long last = 0;
	int fds[LW_MAX_FDS], nfds;
	json_t *j;

	ck_assert_ptr_nonnull(buf);
	for (int i = 0; i < n; i++, off += per) {
		buf[off] = 0;
		buf[off + 1] = 0;
		buf[off + 2] = (unsigned char)(len >> 8);
		buf[off + 3] = (unsigned char)len;
		memcpy(buf + off + 4, one, len);
	}
	memcpy(buf + off, "\0\0\0\x0d{\"op\":\"ping\"}", 17);
	/* one write of every frame, before reading any answer */
	for (size_t sent = 0; sent < total;) {
		ssize_t k = write(fd, buf + sent, total - sent);

		ck_assert_msg(k > 0, "write: %s", strerror(errno));
		sent += (size_t)k;
	}
	for (int i = 0; i < n; i++) {
		nfds = 0;
		j = lw_recv(fd, fds, &nfds);
		ck_assert_msg(j != NULL, "answer %d of %d: the connection closed", i + 1, n);
		ck_assert_msg(!json_object_get(j, "error"), "answer %d: %s", i + 1,
		              json_dumps(j, 0));
		ck_assert_int_gt(th_int(j, "lease"), last);
		last = th_int(j, "lease");
		ck_assert_int_eq(nfds, 1);
		close(fds[0]);
		json_decref(j);
	}
	j = lw_recv(fd, NULL, &nfds);
	ck_assert_msg(j && json_object_size(j) == 0, "the ping after %d leases", n);
	json_decref(j);
	free(buf);
}

START_TEST(test_pipelined_frames_answered_in_order)
{
	unsigned char *v = th_pattern(4096, 13);
	int fd;

	start("0600");
	upload("p", "pinned_host", v, 4096);
	fd = lw_connect(sock);
	ck_assert_int_ge(fd, 0);
	check_pipelined(fd, "p", 1000);
	/* the connection goes on: once more */
	check_pipelined(fd, "p", 300);
	close(fd);
	free(v);
	th_daemon_stop_ok(&d);
}
END_TEST

/* A view kept mapped after its lease ended (the connection closed) shows
 * that version's bytes however the memory is used again. */
static void check_kept_view_on(const char *dev, const char *kind)
{
	unsigned char *v = th_pattern(MiB, 14), *other = th_pattern(MiB, 15);
	struct mapped m;
	char name[32];
	int fd = lw_connect(sock);

	ck_assert_int_ge(fd, 0);
	upload_on("kv", dev, kind, v, MiB);
	lease_map(fd, "{\"op\":\"lease\",\"name\":\"kv\"}", false, &m);
	if (!m.data) {
		unmap(&m);
		close(fd);
		free(v);
		free(other);
		return;
	}
	close(fd);                                 /* the lease ends */
	ck_assert_int_eq(http_status("DELETE", "/v1/arrays/kv"), 200);
	ck_assert_int_eq(settle_on(dev, kind, 0, 10000), 0);
	for (int i = 0; i < 8; i++) {            /* the freed memory is used again */
		snprintf(name, sizeof name, "o%d", i);
		upload_on(name, dev, kind, other, MiB);
	}
	assert_mapped("a view kept after its lease ended", &m, v, MiB);
	for (int i = 0; i < 8; i++) {
		snprintf(name, sizeof name, "/v1/arrays/o%d", i);
		ck_assert_int_eq(http_status("DELETE", name), 200);
	}
	unmap(&m);
	free(v);
	free(other);
}

START_TEST(test_ended_lease_never_shows_other_arrays)
{
	start("0600");
	check_kept_view_on("cpu:0", "pinned_host");
	check_kept_view_on("cpu:0", "unpinned_host");
	check_kept_view_on(th_dev(0), "device");
	/* the lease copies went with their versions */
	ck_assert_int_eq(settle("unpinned_host", 0, 10000), 0);
	th_daemon_stop_ok(&d);
}
END_TEST

/* CPU seconds the process has used (user + system). */
static double cpu_seconds(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(buf, sizeof buf, f));
	fclose(f);
	p = strrchr(buf, ')');
	ck_assert_ptr_nonnull(p);
	/* after the name: state, then 10 fields, then utime and stime */
	ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
	                        &ut, &st), 2);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Opens n connections and sorts them: served (a ping answers), refused (a
 * readable RESOURCE_EXHAUSTED error naming connections, then closed), or
 * closed without a word; the connections stay open in conns. */
static void open_and_sort(int *conns, int n, int counts[3])
{
	int nfds;
	json_t *j;

	for (int i = 0; i < n; i++) {
		conns[i] = lw_connect(sock);
		ck_assert_msg(conns[i] >= 0, "connect %d: %s", i, strerror(errno));
	}
	for (int i = 0; i < n; i++) {
		struct pollfd pf = {.fd = conns[i], .events = POLLIN};

		if (poll(&pf, 1, 0) == 1)            /* refused: the error is waiting */
			j = lw_recv(conns[i], NULL, &nfds);
		else
			j = lw_call(conns[i], "{\"op\":\"ping\"}", NULL, &nfds);
		if (!j) {
			counts[2]++;
			continue;
		}
		if (json_object_get(j, "error")) {
			ck_assert_str_eq(th_str(th_obj(j, "error"), "status"), "RESOURCE_EXHAUSTED");
			ck_assert_msg(strstr(th_str(th_obj(j, "error"), "message"), "connections"),
			              "%s", th_str(th_obj(j, "error"), "message"));
			counts[1]++;
		} else {
			counts[0]++;
		}
		json_decref(j);
	}
}

START_TEST(test_connections_capped_below_the_descriptor_limit)
{
	enum { HALF = 550 };
	static int conns[HALF];
	struct rlimit low = {1024, 1024};
	int counts[3] = {0, 0, 0}, theirs[3], up[2], down[2];
	double before, spent;
	char c = 0;
	pid_t helper;

	/* the daemon, this process and a helper each hold 1,024 descriptors at
	 * most (hard limit: the daemon cannot raise it); the two clients hold
	 * 1,100 connections between them */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	start("0600");
	ck_assert_int_eq(pipe(up), 0);
	ck_assert_int_eq(pipe(down), 0);
	helper = fork();
	ck_assert_int_ge(helper, 0);
	if (helper == 0) {
		open_and_sort(conns, HALF, counts);
		if (write(up[1], counts, sizeof counts) != (ssize_t)sizeof counts ||
		    read(down[0], &c, 1) != 1)
			_exit(1);
		_exit(0);
	}
	ck_assert_int_eq(read(up[0], theirs, sizeof theirs), (ssize_t)sizeof theirs);
	open_and_sort(conns, HALF, counts);
	/* a quarter of 1,024 in all, a quarter of that for this one uid; every
	 * other connection refused with an error it can read */
	ck_assert_msg(counts[0] + theirs[0] > 0 && counts[0] + theirs[0] <= 64,
	              "served %d", counts[0] + theirs[0]);
	ck_assert_int_eq(counts[2] + theirs[2], 0);
	ck_assert_int_eq(counts[0] + counts[1] + theirs[0] + theirs[1], 2 * HALF);
	/* the lease thread is not spinning, and HTTP answers */
	before = cpu_seconds(d.pid);
	usleep(1000000);
	spent = cpu_seconds(d.pid) - before;
	ck_assert_msg(spent < 0.3, "the daemon used %.2f s of CPU in 1 s while idle", spent);
	ck_assert_int_eq(http_status("GET", "/livez"), 200);
	for (int i = 0; i < HALF; i++)
		close(conns[i]);
	ck_assert_int_eq(write(down[1], "x", 1), 1);
	ck_assert_int_eq(waitpid(helper, NULL, 0), helper);
	/* once they are gone, new connections are served */
	{
		long long deadline = th_now_ms() + 10000;
		int fd = -1, nfds;
		json_t *j = NULL;

		do {
			usleep(20000);
			fd = lw_connect(sock);
			j = fd >= 0 ? lw_call(fd, "{\"op\":\"ping\"}", NULL, &nfds) : NULL;
			if (fd >= 0)
				close(fd);
			if (j && !json_object_get(j, "error"))
				break;
			json_decref(j);
			j = NULL;
		} while (th_now_ms() < deadline);
		ck_assert_msg(j != NULL, "no connection served after the flood");
		json_decref(j);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("lease");
	TCase *tc = tcase_create("lease");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_kept_while_replaced_and_deleted);
	tcase_add_test(tc, test_killed_client_returns_memory);
	tcase_add_test(tc, test_write_lease);
	tcase_add_test(tc, test_device_kept_while_replaced_and_deleted);
	tcase_add_test(tc, test_device_kept_while_moved);
	tcase_add_test(tc, test_device_write_lease);
	tcase_add_test(tc, test_device_killed_client_and_many_leases);
	tcase_add_test(tc, test_read_only_descriptors);
	tcase_add_test(tc, test_refusals);
	tcase_add_test(tc, test_socket_mode);
	tcase_add_test(tc, test_reopened_read_lease_cannot_write);
	tcase_add_test(tc, test_published_version_does_not_change);
	tcase_add_test(tc, test_device_read_lease_writes_reach_nothing);
	tcase_add_test(tc, test_pipelined_frames_answered_in_order);
	tcase_add_test(tc, test_ended_lease_never_shows_other_arrays);
	tcase_add_test(tc, test_connections_capped_below_the_descriptor_limit);
	suite_add_tcase(s, tc);
	return s;
}
