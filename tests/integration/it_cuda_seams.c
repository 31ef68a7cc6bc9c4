/*
 * it_cuda_seams.c - integration suite "cuda_seams": where backends meet.
 *
 * Copies between every pair of (device, memory kind) of a daemon that mixes
 * backends, :put through all of them, an uncommitted array moved next to a
 * committed one on another backend by a training step, meshes whose devices
 * belong to two backends, strided slices of device arrays, and a download
 * cut short by a device error mid-stream, which the client must see as a
 * short body (Content-Length), never as a complete 200.
 *
 * With TS_TEST_BACKEND=cuda the daemon runs on the machine's GPUs (or
 * ../shared/fakecuda, FAKECUDA_DEVICES=2 for two) plus one sim device and
 * cpu:0: the GPU is "gpu" and sim:0 "other". Without it, sim:0 plays the
 * accelerator and cpu:0 the other backend. Every case fails on a FAKECUDA
 * VIOLATION in the daemon's stderr and on a daemon that does not exit 0.
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static struct th_daemon D;
static char gpu[16], gpu2[16], other[16];

static const char *const kinds[] = {"device", "pinned_host", "unpinned_host"};

static void start(const char *const *env)
{
	static const char *const sim_args[] = {NULL};
	/* a small device pool: the stand-in's memory is real host memory */
	static const char *const cuda_args[] = {"--sim-devices", "1", "--device-memory-fraction",
	                                        "0.05", NULL};
	struct th_start how = {.args = th_backend_is_sim() ? sim_args : cuda_args, .env = env};
	struct th_response r;
	json_t *devs;
	size_t i;
	json_t *dv;

	th_daemon_start_ex(&D, &how);
	snprintf(gpu, sizeof gpu, "%s:0", th_backend());
	snprintf(other, sizeof other, "%s", th_backend_is_sim() ? "cpu:0" : "sim:0");
	gpu2[0] = '\0';
	devs = th_arr(th_get_json(&D, "/v1/devices", &r), "devices");
	json_array_foreach(devs, i, dv) {
		char want[16];

		snprintf(want, sizeof want, "%s:1", th_backend());
		if (strcmp(th_str(dv, "id"), want) == 0)
			snprintf(gpu2, sizeof gpu2, "%s", want);
	}
	th_response_free(&r);
}

static void setup(void)
{
	start(NULL);
}

static void teardown(void)
{
	char *err = th_daemon_stderr(&D);

	ck_assert_msg(!err || !strstr(err, "FAKECUDA VIOLATION"), "the stand-in saw a violation:\n%s",
	              err);
	free(err);
	th_daemon_stop_ok(&D);
}

/* ---- helpers ------------------------------------------------------------------ */

static void delete_array(const char *name)
{
	struct th_response r;
	char path[300];

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200 || r.status == 204, "DELETE %s: %ld %s", path, r.status, r.body);
	th_response_free(&r);
}

/* The array's placement as its metadata says. */
static void expect_placement(const char *name, const char *dev, const char *kind)
{
	struct th_response r;
	char path[300];
	json_t *sh;

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	sh = th_obj(th_get_json(&D, path, &r), "sharding");
	ck_assert_str_eq(th_str(sh, "device"), dev);
	ck_assert_str_eq(th_str(sh, "memory_kind"), kind);
	th_response_free(&r);
}

/* Every byte at index i*step of src (n bytes). */
static unsigned char *every(const unsigned char *src, size_t n, size_t step, size_t *out_n)
{
	unsigned char *o = malloc(n / step + 1);

	ck_assert_ptr_nonnull(o);
	*out_n = 0;
	for (size_t i = 0; i < n; i += step)
		o[(*out_n)++] = src[i];
	return o;
}

/* The devices of the daemon under test, for the matrix. */
static size_t devices(const char **out)
{
	size_t n = 0;

	out[n++] = gpu;
	if (gpu2[0])
		out[n++] = gpu2;
	out[n++] = other;
	if (strcmp(other, "cpu:0") != 0)
		out[n++] = "cpu:0";
	return n;
}

/* ---- cases ----------------------------------------------------------------------- */

/* :copy from every (device, memory kind) to every other, and :put through
 * all of them in turn: the bytes arrive whole, strided slices of each copy
 * read back exactly, and the daemon survives every combination. */
START_TEST(test_copy_between_every_pair)
{
	enum { N = 65541 };
	unsigned char *x = th_pattern(N, 7), *strided;
	const char *devs[4];
	size_t ndev = devices(devs), ns;
	char query[128], body[256];

	strided = every(x, N, 3, &ns);
	for (size_t a = 0; a < ndev; a++)
		for (size_t ka = 0; ka < 3; ka++) {
			snprintf(query, sizeof query, "dtype=uint8&shape=%d&device=%s&memory_kind=%s", N,
			         devs[a], kinds[ka]);
			th_put_array(&D, "src", query, x, N);
			for (size_t b = 0; b < ndev; b++)
				for (size_t kb = 0; kb < 3; kb++) {
					char what[128];
					json_t *res;

					snprintf(what, sizeof what, "%s/%s -> %s/%s", devs[a], kinds[ka], devs[b],
					         kinds[kb]);
					snprintf(body, sizeof body,
					         "{\"out\": \"dst\", \"device\": \"%s\", \"memory_kind\": \"%s\"}",
					         devs[b], kinds[kb]);
					res = th_post_json(&D, "/v1/arrays/src:copy?wait=true", body, 200);
					json_decref(res);
					expect_placement("dst", devs[b], kinds[kb]);
					th_expect_data(&D, "dst", NULL, x, N);
					th_expect_data(&D, "dst", "::3", strided, ns);
					delete_array("dst");
				}
		}
	/* one array moved through every end in turn */
	for (size_t b = 0; b < ndev; b++)
		for (size_t kb = 0; kb < 3; kb++) {
			json_t *res;

			snprintf(body, sizeof body, "{\"device\": \"%s\", \"memory_kind\": \"%s\"}", devs[b],
			         kinds[kb]);
			res = th_post_json(&D, "/v1/arrays/src:put?wait=true", body, 200);
			json_decref(res);
			expect_placement("src", devs[b], kinds[kb]);
			th_expect_data(&D, "src", NULL, x, N);
		}
	free(strided);
	free(x);
}
END_TEST

/* A training step on a model committed to the other backend moves an
 * uncommitted input from the accelerator to it (the JAX-style implicit
 * transfer), counted, and computes the same loss as with the input placed
 * there from the start. */
START_TEST(test_colocation_across_backends)
{
	float x[4 * 8];
	char body[512], query[128];
	json_t *m, *res, *meta;
	struct th_response r;
	double moved_loss, placed_loss;

	for (size_t i = 0; i < 32; i++)
		x[i] = (float)((int)(i * 37 % 11) - 5) / 8.0f;
	snprintf(body, sizeof body,
	         "{\"name\": \"m\", \"mlp\": {\"layers\": 2, \"d_model\": 8, \"d_hidden\": 12}, "
	         "\"init\": {\"constant\": 0.125}, \"placement\": {\"device\": \"%s\"}}", other);
	m = th_post_json(&D, "/v1/models?wait=true", body, 200);
	json_decref(m);
	/* no placement: lands on the default device (the accelerator), uncommitted */
	th_put_array(&D, "x", "dtype=float32&shape=4,8", x, sizeof x);
	meta = th_get_json(&D, "/v1/arrays/x", &r);
	ck_assert(!th_bool(meta, "committed"));
	ck_assert_str_eq(th_str(th_obj(meta, "sharding"), "device"), gpu);
	th_response_free(&r);
	res = th_post_json(&D, "/v1/models/m:step?wait=true", "{\"inputs\": \"x\"}", 200);
	moved_loss = json_number_value(json_array_get(th_arr(res, "losses"), 0));
	json_decref(res);
	meta = th_get_json(&D, "/v1/arrays/x", &r);
	ck_assert_str_eq(th_str(th_obj(meta, "sharding"), "device"), other);
	ck_assert_int_eq(th_int(meta, "implicit_transfer_bytes"), (json_int_t)sizeof x);
	th_response_free(&r);
	th_expect_data(&D, "x", NULL, x, sizeof x);
	/* the same step with the input placed there: the same loss (fresh model) */
	snprintf(body, sizeof body,
	         "{\"name\": \"m2\", \"mlp\": {\"layers\": 2, \"d_model\": 8, \"d_hidden\": 12}, "
	         "\"init\": {\"constant\": 0.125}, \"placement\": {\"device\": \"%s\"}}", other);
	json_decref(th_post_json(&D, "/v1/models?wait=true", body, 200));
	snprintf(query, sizeof query, "dtype=float32&shape=4,8&device=%s&memory_kind=device", other);
	th_put_array(&D, "x2", query, x, sizeof x);
	res = th_post_json(&D, "/v1/models/m2:step?wait=true", "{\"inputs\": \"x2\"}", 200);
	placed_loss = json_number_value(json_array_get(th_arr(res, "losses"), 0));
	json_decref(res);
	ck_assert_msg(moved_loss == placed_loss, "loss %.9g after the move, %.9g placed", moved_loss,
	              placed_loss);
}
END_TEST

/* Meshes whose devices belong to two backends: upload, whole and strided
 * reads, :put to each backend alone and :copy into the reversed mesh. */
START_TEST(test_mesh_of_two_backends)
{
	enum { ROWS = 8, COLS = 1024 };
	float *x = malloc(ROWS * COLS * sizeof *x), *sl;
	char sharding[512], esc[1024], query[1400], body[700];
	size_t ns = 0;

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < ROWS * COLS; i++)
		x[i] = (float)i * 0.5f - 3.0f;
	sl = malloc(ROWS * COLS * sizeof *sl);
	ck_assert_ptr_nonnull(sl);
	for (size_t i = 0; i < ROWS; i += 3)
		for (size_t j = 0; j < COLS; j += 4)
			sl[ns++] = x[i * COLS + j];
	for (size_t k = 0; k < 3; k++) {
		json_t *res;

		snprintf(sharding, sizeof sharding,
		         "{\"mesh\": {\"devices\": [\"%s\", \"%s\"], \"axis_names\": [\"x\"]}, "
		         "\"spec\": [\"x\", null], \"memory_kind\": \"%s\"}", gpu, other, kinds[k]);
		th_url_escape(esc, sizeof esc, sharding);
		snprintf(query, sizeof query, "dtype=float32&shape=%d,%d&sharding=%s", ROWS, COLS, esc);
		th_put_array(&D, "mx", query, x, ROWS * COLS * sizeof *x);
		th_expect_data(&D, "mx", NULL, x, ROWS * COLS * sizeof *x);
		th_expect_data(&D, "mx", "::3,::4", sl, ns * sizeof *sl);
		/* into the reversed mesh, every kind */
		for (size_t kb = 0; kb < 3; kb++) {
			snprintf(body, sizeof body,
			         "{\"out\": \"my\", \"sharding\": {\"mesh\": {\"devices\": [\"%s\", \"%s\"], "
			         "\"axis_names\": [\"x\"]}, \"spec\": [\"x\", null], \"memory_kind\": \"%s\"}}",
			         other, gpu, kinds[kb]);
			res = th_post_json(&D, "/v1/arrays/mx:copy?wait=true", body, 200);
			json_decref(res);
			th_expect_data(&D, "my", NULL, x, ROWS * COLS * sizeof *x);
			th_expect_data(&D, "my", "::3,::4", sl, ns * sizeof *sl);
			delete_array("my");
		}
		/* onto each backend alone, then back onto the mesh */
		snprintf(body, sizeof body, "{\"device\": \"%s\", \"memory_kind\": \"device\"}", other);
		json_decref(th_post_json(&D, "/v1/arrays/mx:put?wait=true", body, 200));
		th_expect_data(&D, "mx", NULL, x, ROWS * COLS * sizeof *x);
		snprintf(body, sizeof body, "{\"device\": \"%s\", \"memory_kind\": \"device\"}", gpu);
		json_decref(th_post_json(&D, "/v1/arrays/mx:put?wait=true", body, 200));
		th_expect_data(&D, "mx", NULL, x, ROWS * COLS * sizeof *x);
		snprintf(body, sizeof body, "{\"sharding\": %s}", sharding);
		json_decref(th_post_json(&D, "/v1/arrays/mx:put?wait=true", body, 200));
		th_expect_data(&D, "mx", "::3,::4", sl, ns * sizeof *sl);
		delete_array("mx");
	}
	free(sl);
	free(x);
}
END_TEST

/* x[::4] of 64K float32 elements of a device array, raw and .npy: exact. */
START_TEST(test_strided_slice_of_a_device_array)
{
	enum { N = 1 << 18 };
	float *x = malloc(N * sizeof *x), *want = malloc(N / 4 * sizeof *want);
	char query[128];
	struct th_response r;

	ck_assert(x && want);
	for (size_t i = 0; i < N; i++)
		x[i] = (float)i;
	for (size_t i = 0; i < N / 4; i++)
		want[i] = x[4 * i];
	snprintf(query, sizeof query, "dtype=float32&shape=%d&device=%s&memory_kind=device", N, gpu);
	th_put_array(&D, "v", query, x, N * sizeof *x);
	th_expect_data(&D, "v", "::4", want, N / 4 * sizeof *want);
	for (size_t i = 0; i < N / 4; i++)
		want[i] = x[N - 1 - 4 * i];
	th_expect_data(&D, "v", "::-4", want, N / 4 * sizeof *want);
	th_get(&D, "/v1/arrays/v/data?index=1::4&format=npy", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_uint_gt(r.body_len, N / 4 * sizeof *want);
	for (size_t i = 0; i < N / 4; i++)
		want[i] = x[1 + 4 * i];
	th_assert_bytes("v[1::4] as npy", r.body + r.body_len - N / 4 * sizeof *want,
	                N / 4 * sizeof *want, want, N / 4 * sizeof *want);
	th_response_free(&r);
	free(x);
	free(want);
}
END_TEST

/* ---- a download cut short by a device error ------------------------------------------ */

/* Reads from fd until "\r\n\r\n"; returns the header block (new string) and
 * leaves in *body_got the body bytes that came with it. */
static char *read_head(int fd, size_t *body_got)
{
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap + 1), *end = NULL;

	ck_assert_ptr_nonnull(buf);
	while (!end) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		ck_assert_msg(poll(&p, 1, 10000) == 1, "no response head within 10 s");
		n = recv(fd, buf + len, cap - len, 0);
		ck_assert_msg(n > 0, "connection closed before the head: %s", strerror(errno));
		len += (size_t)n;
		buf[len] = '\0';
		end = strstr(buf, "\r\n\r\n");
		ck_assert_msg(end || len < cap, "head larger than 64 KiB");
	}
	*body_got = len - (size_t)(end + 4 - buf);
	end[2] = '\0';
	return buf;
}

/* Reads until the peer closes (or resets); bytes read. */
static size_t read_to_close(int fd, int timeout_ms)
{
	static char chunk[1 << 16];
	size_t got = 0;

	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		ck_assert_msg(poll(&p, 1, timeout_ms) == 1, "the connection neither ended nor closed "
		              "within %d ms (%zu bytes)", timeout_ms, got);
		n = recv(fd, chunk, sizeof chunk, 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return got;
		ck_assert_msg(n > 0, "recv: %s", strerror(errno));
		got += (size_t)n;
	}
}

/*
 * A GPU array of 64 MiB is being downloaded by a client that reads slowly;
 * meanwhile a training step on the same GPU hits a sticky error
 * (FAKECUDA_STICKY_AT=1: its first kernel faults). The response announced
 * its length, so the client sees a body shorter than Content-Length when the
 * connection closes: never a complete-looking 200. Later downloads of it
 * are refused (503) before a response begins. The daemon lives on, not
 * ready. On a real GPU nothing faults: the body then arrives whole.
 */
START_TEST(test_download_cut_short_by_a_device_error)
{
	static const char *const env[] = {"FAKECUDA_STICKY_AT=1", NULL};
	enum { N = 64 << 20 };
	unsigned char *x = th_pattern(N, 11);
	char query[128], req[256], body[300];
	const char *cl;
	size_t early, rest;
	unsigned long long length;
	struct th_response r;
	char *head;
	int fd;

	th_daemon_stop_ok(&D);
	start(env);
	snprintf(body, sizeof body,
	         "{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 8}, "
	         "\"placement\": {\"device\": \"%s\"}}", gpu);
	json_decref(th_post_json(&D, "/v1/models?wait=true", body, 200));
	snprintf(query, sizeof query, "dtype=float32&shape=4,8&device=%s&memory_kind=device", gpu);
	th_put_array(&D, "in", query, x, 4 * 8 * sizeof(float));
	snprintf(query, sizeof query, "dtype=uint8&shape=%d&device=%s&memory_kind=device", N, gpu);
	th_put_array(&D, "big", query, x, N);

	fd = th_raw_connect(&D);
	/* Connection: close - a whole body ends the connection too (a kept one
	 * would wait for the next request) */
	snprintf(req, sizeof req, "GET /v1/arrays/big/data?index=0: HTTP/1.1\r\nHost: t\r\n"
	         "Connection: close\r\n\r\n");
	th_raw_send(fd, req);
	head = read_head(fd, &early);
	ck_assert_msg(strncmp(head, "HTTP/1.1 200", 12) == 0, "%s", head);
	cl = strcasestr(head, "\r\nContent-Length:");
	ck_assert_msg(cl != NULL, "a download without Content-Length:\n%s", head);
	length = strtoull(cl + 17, NULL, 10);
	ck_assert_uint_eq(length, N);
	ck_assert_ptr_null(strcasestr(head, "Transfer-Encoding"));
	free(head);

	/* the client stalls: the daemon's sends block once the socket buffers fill */
	usleep(300 * 1000);
	th_request(&D, "POST", "/v1/models/m:step?wait=true", NULL, "{\"inputs\": \"in\"}", 16, &r);
	rest = read_to_close(fd, 30000);
	close(fd);
	if (r.status == 200) {
		/* no fault injected (a real GPU): the whole body came */
		ck_assert_uint_eq(early + rest, N);
	} else {
		th_assert_error(&r, 503, "UNAVAILABLE", NULL);
		ck_assert_msg(early + rest < N, "%zu bytes of %d arrived after the device broke",
		              early + rest, N);
		th_response_free(&r);
		th_get(&D, "/readyz", &r);
		ck_assert_int_eq(r.status, 503);
		th_response_free(&r);
		/* a download begun now is refused whole, not a 200 that stops short */
		th_get(&D, "/v1/arrays/big/data?index=::2", &r);
		th_assert_error(&r, 503, "UNAVAILABLE", "DEVICE_BROKEN");
		ck_assert_ptr_nonnull(strstr(r.body, gpu));
		th_response_free(&r);
		th_get(&D, "/v1/arrays:export?names=big", &r);
		th_assert_error(&r, 503, "UNAVAILABLE", "DEVICE_BROKEN");
		/* the other backend still serves */
		snprintf(query, sizeof query, "dtype=uint8&shape=4096&device=%s&memory_kind=device",
		         other);
		th_put_array(&D, "after", query, x, 4096);
		th_expect_data(&D, "after", NULL, x, 4096);
	}
	th_response_free(&r);
	free(x);
}
END_TEST

Suite *th_suite(void)
{
	/* from the environment: th_backend() asserts, which only a running test may */
	const char *backend = getenv("TS_TEST_BACKEND");
	bool cuda = backend && strcmp(backend, "cuda") == 0;
	Suite *s = suite_create("cuda_seams");
	TCase *tc = tcase_create("seams");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_copy_between_every_pair);
	tcase_add_test(tc, test_colocation_across_backends);
	tcase_add_test(tc, test_mesh_of_two_backends);
	tcase_add_test(tc, test_strided_slice_of_a_device_array);
	if (cuda)
		tcase_add_test(tc, test_download_cut_short_by_a_device_error);
	suite_add_tcase(s, tc);
	return s;
}
