/*
 * it_arrays.c - Check suite "arrays": the array endpoints of a real tstaged
 * (PUT, GET and DELETE /v1/arrays/{a}, its /data with ?index=, :gather,
 * :import, :export and the list) against data that tstaged did not make:
 * bytes generated here, .npy files written by numpy and safetensors files
 * written by the reference safetensors package (py/make_fixtures.py, run
 * once by th_suite), and what tstaged serves read back by those same readers
 * (py/check_export.py).
 *
 * Each case runs forked with its own daemon (two sim devices of 64 MiB), so
 * every space starts empty and a case can hold bytes_in_use to exact
 * numbers. The cases are written for sim:0, sim:1 and a 64 MiB device.
 * With TS_TEST_BACKEND=cuda the cases that do not depend on the 64 MiB
 * limit run again ("on_backend") on a daemon of the machine's GPUs: every
 * "sim:N" they send or expect becomes that backend's device (B(), the
 * second GPU, or the first on a one-GPU machine), so uploads, slices, npy,
 * safetensors and gathers are exercised on GPU memory. After any refused or broken upload a case checks the same two
 * things: the previous version is whole, and the spaces' stats are as they
 * were.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB (1u << 20)
#define KiB (1u << 10)

/* Set once by th_suite before any case runs; read-only in the forked cases. */
static char fixture_dir[512];
static bool fixtures_ok;

/* The daemon of the checked fixture (per forked case). */
static struct th_daemon D;

/* Starts a daemon on two simulated devices of TH_SIM_MEMORY, CUDA off,
 * with extra flags (NULL-terminated, may be NULL). */
static void start_sim(struct th_daemon *d, const char *const *extra)
{
	const char *args[16] = {"--sim-devices", "2", "--sim-device-memory", TH_SIM_MEMORY_ARG,
	                        "--no-cuda"};
	struct th_start how = {.args = args, .no_backend_args = true};
	int n = 5;

	for (; extra && *extra && n < 15; extra++)
		args[n++] = *extra;
	args[n] = NULL;
	th_daemon_start_ex(d, &how);
}

static void daemon_up(void)
{
	start_sim(&D, NULL);
}

/* The backend pass: the daemon runs on the backend under test. */
static bool on_backend;
static bool one_device;         /* the backend has no second device */

static void daemon_up_backend(void)
{
	th_daemon_start(&D, NULL);
	on_backend = true;
	one_device = !th_daemon_has_device(&D, th_dev(1));
}

/* text written for sim, for the daemon under test (borrowed, see
 * th_on_backend): identity on the sim daemon; on the backend pass every
 * sim:N is that backend's device N, and sim:1 the first device where
 * there is only one. */
static const char *B(const char *text)
{
	char one[4096];
	size_t n = 0;

	if (!on_backend || !text)
		return text;
	if (!one_device)
		return th_on_backend(text);
	for (const char *p = text; *p && n + 1 < sizeof one; p++) {
		one[n++] = *p;
		if (strncmp(p, "sim:1", 5) == 0) {
			memcpy(one + n, "im:0", 4);
			n += 4;
			p += 4;
		}
	}
	one[n] = '\0';
	return th_on_backend(one);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

static void need_fixtures(void)
{
	ck_assert_msg(fixtures_ok, "no fixtures: %s/make_fixtures.py failed (it needs python3 "
	              "with numpy and safetensors: run scripts/deps.sh)", th_py_dir());
}

/* ---- bytes ------------------------------------------------------------------------ */


/* ---- requests ----------------------------------------------------------------------- */

static void array_path(char *buf, size_t cap, const char *name, const char *suffix,
                       const char *query)
{
	bool q = query && *query;

	snprintf(buf, cap, "/v1/arrays/%s%s%s%s", name, suffix ? suffix : "", q ? "?" : "",
	         q ? B(query) : "");
}

/* PUT /v1/arrays/name?query with data as the body. */
static void put(struct th_daemon *d, const char *name, const char *query,
                const char *const *headers, const void *data, size_t len, struct th_response *r)
{
	char path[1024];

	array_path(path, sizeof path, name, NULL, query);
	th_request(d, "PUT", path, headers, data ? data : "", len, r);
}

/* A PUT that must answer want (201 created, 200 replaced). */
static void put_ok(struct th_daemon *d, const char *name, const char *query, const void *data,
                   size_t len, long want)
{
	struct th_response r;

	put(d, name, query, NULL, data, len, &r);
	ck_assert_msg(r.status == want, "PUT %s?%s: %ld, want %ld: %s", name, query ? query : "",
	              r.status, want, r.body);
	th_response_free(&r);
}

static void get_data(struct th_daemon *d, const char *name, const char *query,
                     const char *const *headers, struct th_response *r)
{
	char path[1024];

	array_path(path, sizeof path, name, "/data", query);
	th_request(d, "GET", path, headers, NULL, 0, r);
}

static json_t *get_meta(struct th_daemon *d, const char *name, struct th_response *r)
{
	char path[300];

	array_path(path, sizeof path, name, NULL, NULL);
	return th_get_json(d, path, r);
}

static json_int_t version_of(struct th_daemon *d, const char *name)
{
	struct th_response r;
	json_int_t v = th_int(get_meta(d, name, &r), "version");

	th_response_free(&r);
	return v;
}

static void expect_absent(struct th_daemon *d, const char *name)
{
	struct th_response r;
	char path[300];

	array_path(path, sizeof path, name, NULL, NULL);
	th_get(d, path, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
}

/* Whether X-Tstage-Shape says the shape as README.md has it: "[6,16]",
 * "[]" for a 0-d result (a header value cannot be empty). What is wrong goes
 * to why (when it is still empty), so that a case can check everything else
 * first. */
static bool shape_header_ok(const struct th_response *r, const char *what, const char *want,
                            char *why, size_t cap)
{
	const char *got = th_header(r, "X-Tstage-Shape");

	if (got && strcmp(got, want) == 0)
		return true;
	if (!why[0])
		snprintf(why, cap, "%s: X-Tstage-Shape %s%s%s, want '%s'", what, got ? "'" : "",
		         got ? got : "missing", got ? "'" : "", want);
	return false;
}

/* ---- memory spaces --------------------------------------------------------------------- */

/* GET /v1/memory's entry for (dev, kind) (new reference). */
static json_t *space_stats(struct th_daemon *d, const char *dev, const char *kind)
{
	struct th_response r;
	json_t *spaces = th_arr(th_get_json(d, "/v1/memory", &r), "spaces"), *s, *found = NULL;
	size_t i;

	dev = B(dev);
	json_array_foreach(spaces, i, s)
		if (strcmp(th_str(s, "device"), dev) == 0 && strcmp(th_str(s, "memory_kind"), kind) == 0)
			found = json_incref(s);
	th_response_free(&r);
	ck_assert_msg(found != NULL, "no space %s/%s in /v1/memory", dev, kind);
	return found;
}

static long long in_use(struct th_daemon *d, const char *dev, const char *kind)
{
	json_t *s = space_stats(d, dev, kind);
	long long v = th_int(s, "bytes_in_use");

	json_decref(s);
	return v;
}

/* Every space's bytes_in_use, as "dev/kind=N;..." (new string). */
static char *all_in_use(struct th_daemon *d)
{
	struct th_response r;
	json_t *spaces = th_arr(th_get_json(d, "/v1/memory", &r), "spaces"), *s;
	size_t i, o = 0, cap = 4096;
	char *out = malloc(cap);

	ck_assert_ptr_nonnull(out);
	out[0] = '\0';
	json_array_foreach(spaces, i, s)
		o += (size_t)snprintf(out + o, cap - o, "%s/%s=%lld;", th_str(s, "device"),
		                      th_str(s, "memory_kind"), (long long)th_int(s, "bytes_in_use"));
	th_response_free(&r);
	return out;
}

/* Waits at most timeout_ms until every space's bytes_in_use reads want
 * (from all_in_use); false with what they hold in why (may be NULL) when
 * they never do. Buffers go back when the last holder (a response still
 * being sent, an upload's completion) lets go, which may be a moment after
 * the client saw the end. */
static bool all_in_use_becomes(struct th_daemon *d, const char *want, int timeout_ms, char *why,
                               size_t cap)
{
	long long deadline = th_now_ms() + timeout_ms;
	char *now;
	bool ok;

	for (;;) {
		now = all_in_use(d);
		if (strcmp(now, want) == 0 || th_now_ms() > deadline)
			break;
		free(now);
		usleep(10000);
	}
	ok = strcmp(now, want) == 0;
	if (!ok && why)
		snprintf(why, cap, "spaces hold\n  %s\nwant\n  %s", now, want);
	free(now);
	return ok;
}

static void wait_all_in_use(struct th_daemon *d, const char *want, int timeout_ms)
{
	char why[2048];

	ck_assert_msg(all_in_use_becomes(d, want, timeout_ms, why, sizeof why), "%s", why);
}

static void wait_in_use(struct th_daemon *d, const char *dev, const char *kind, long long want,
                        int timeout_ms)
{
	long long deadline = th_now_ms() + timeout_ms, v;

	while ((v = in_use(d, dev, kind)) != want && th_now_ms() < deadline)
		usleep(10000);
	ck_assert_msg(v == want, "%s/%s holds %lld bytes, want %lld", dev, kind, v, want);
}

/* GET /v1/devices/dev/memory_stats (new reference). */
static json_t *memory_stats(struct th_daemon *d, const char *dev)
{
	char path[128];

	snprintf(path, sizeof path, "/v1/devices/%s/memory_stats", B(dev));
	return th_get_object(d, path);
}

/* An ErrorInfo metadata value as a number (metadata values are strings in
 * google.rpc; a JSON integer is taken too). */
static unsigned long long meta_u64(json_t *meta, const char *key)
{
	json_t *v = json_object_get(meta, key);

	ck_assert_msg(v != NULL, "ErrorInfo metadata has no '%s'", key);
	if (json_is_integer(v))
		return (unsigned long long)json_integer_value(v);
	ck_assert_msg(json_is_string(v), "metadata '%s' is neither a string nor a number", key);
	return strtoull(json_string_value(v), NULL, 10);
}

/* ---- raw sockets ---------------------------------------------------------------------- */

/* At most n bytes within timeout_ms: the count, 0 at the end of the stream,
 * -1 on a timeout or an error. */
static ssize_t recv_some(int fd, void *buf, size_t n, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	ssize_t got;

	if (poll(&p, 1, timeout_ms) <= 0)
		return -1;
	do
		got = recv(fd, buf, n, 0);
	while (got < 0 && errno == EINTR);
	return got;
}

/* The head of a response read from a raw socket, and the first body bytes
 * that arrived with it. */
struct raw_head {
	int status;
	long long length;            /* Content-Length, -1 when absent */
	size_t head_len, got;        /* bytes of head; bytes read in all */
	char buf[64 * 1024];
};

static void raw_read_head(int fd, struct raw_head *h, int timeout_ms)
{
	long long deadline = th_now_ms() + timeout_ms;
	const char *eoh = NULL, *cl;

	memset(h, 0, sizeof *h);
	while (!eoh) {
		ssize_t n;

		ck_assert_msg(h->got + 1 < sizeof h->buf, "response head too long");
		n = recv_some(fd, h->buf + h->got, sizeof h->buf - h->got - 1,
		              (int)(deadline - th_now_ms() > 0 ? deadline - th_now_ms() : 1));
		ck_assert_msg(n > 0, "no response head (got %zu bytes)", h->got);
		h->got += (size_t)n;
		h->buf[h->got] = '\0';
		eoh = memmem(h->buf, h->got, "\r\n\r\n", 4);
	}
	h->head_len = (size_t)(eoh - h->buf) + 4;
	ck_assert_msg(strncmp(h->buf, "HTTP/1.1 ", 9) == 0, "not HTTP/1.1: %.40s", h->buf);
	h->status = atoi(h->buf + 9);
	cl = strcasestr(h->buf, "\r\nContent-Length:");
	h->length = cl && cl < eoh ? strtoll(cl + 17, NULL, 10) : -1;
}

/* The JSON body of a complete response th_raw_response read (new reference). */
static json_t *raw_json_body(const char *resp)
{
	const char *b = strstr(resp, "\r\n\r\n");
	json_error_t e;
	json_t *j;

	ck_assert_ptr_nonnull(b);
	j = json_loads(b + 4, 0, &e);
	ck_assert_msg(j != NULL, "body is not JSON: %s", b + 4);
	return j;
}

/* ---- fixtures and the python readers ----------------------------------------------------- */

static void fixture_path(char *buf, size_t cap, const char *rel)
{
	snprintf(buf, cap, "%s/%s", fixture_dir, rel);
}

static char *fixture_bytes(const char *rel, size_t *len)
{
	char path[1024];
	char *b;

	fixture_path(path, sizeof path, rel);
	b = th_read_file(path, len);
	ck_assert_msg(b != NULL, "cannot read fixture %s", path);
	return b;
}

/* manifest.json (new reference). */
static json_t *manifest(void)
{
	char path[1024];
	json_error_t e;
	json_t *m;

	need_fixtures();
	fixture_path(path, sizeof path, "manifest.json");
	m = json_load_file(path, 0, &e);
	ck_assert_msg(m != NULL, "%s: %s", path, e.text);
	return m;
}

/* Checks collected in a case and run through check_export.py at once. */
struct pycheck {
	json_t *checks;
	char dir[512];
	int nfiles;
};

static void pyc_init(struct pycheck *pc)
{
	need_fixtures();
	pc->checks = json_array();
	pc->nfiles = 0;
	th_temp_dir("py", pc->dir, sizeof pc->dir);
}

/* Writes data to a new file of the check's directory; its path as a new
 * JSON string. */
static json_t *pyc_file(struct pycheck *pc, const char *ext, const void *data, size_t len)
{
	char path[700];

	snprintf(path, sizeof path, "%s/f%d.%s", pc->dir, pc->nfiles++, ext);
	th_write_file(path, data, len);
	return json_string(path);
}

static json_t *shape_json(int rank, const uint64_t *shape)
{
	json_t *a = json_array();

	for (int i = 0; i < rank; i++)
		json_array_append_new(a, json_integer((json_int_t)shape[i]));
	return a;
}

/* np.load(served) must be dtype and shape with exactly want as its bytes. */
static void pyc_npy(struct pycheck *pc, const void *served, size_t served_len, const char *dtype,
                    int rank, const uint64_t *shape, const void *want, size_t want_len)
{
	json_array_append_new(pc->checks,
	                      json_pack("{s:s, s:o, s:s, s:o, s:o}", "kind", "npy",
	                                "file", pyc_file(pc, "npy", served, served_len),
	                                "dtype", dtype, "shape", shape_json(rank, shape),
	                                "raw", pyc_file(pc, "raw", want, want_len)));
}

/* Runs every collected check; fails the case unless each passed. */
static void pyc_run(struct pycheck *pc)
{
	char spec[600], cmd[1400], line[1024], fails[4096] = "";
	size_t nchecks = json_array_size(pc->checks), ok = 0, fo = 0;
	json_t *root = json_pack("{s:o}", "checks", pc->checks);
	FILE *p;
	int st;

	snprintf(spec, sizeof spec, "%s/spec.json", pc->dir);
	ck_assert_int_eq(json_dump_file(root, spec, JSON_INDENT(1)), 0);
	json_decref(root);
	pc->checks = NULL;
	snprintf(cmd, sizeof cmd, "python3 '%s/check_export.py' '%s' 2>&1", th_py_dir(), spec);
	p = popen(cmd, "r");
	ck_assert_msg(p != NULL, "popen: %s", strerror(errno));
	while (fgets(line, sizeof line, p)) {
		if (strncmp(line, "ok ", 3) == 0)
			ok++;
		else if (fo + 1 < sizeof fails)
			fo += (size_t)snprintf(fails + fo, sizeof fails - fo, "%s", line);
	}
	st = pclose(p);
	ck_assert_msg(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && ok == nchecks,
	              "check_export.py: %zu of %zu checks passed (exit %d):\n%s", ok, nchecks,
	              WIFEXITED(st) ? WEXITSTATUS(st) : -1, fails);
}

/* ---- dtypes ------------------------------------------------------------------------------ */

static const struct {
	const char *name;
	size_t size;
	const char *descr;            /* what numpy writes for it */
} dtypes[] = {
	{"bool", 1, "|b1"}, {"int8", 1, "|i1"}, {"uint8", 1, "|u1"}, {"int16", 2, "<i2"},
	{"uint16", 2, "<u2"}, {"int32", 4, "<i4"}, {"uint32", 4, "<u4"}, {"int64", 8, "<i8"},
	{"uint64", 8, "<u8"}, {"float16", 2, "<f2"}, {"bfloat16", 2, "<V2"},
	{"float32", 4, "<f4"}, {"float64", 8, "<f8"},
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

/* Where the data of an .npy file we were served starts; checks the magic,
 * the version, numpy's 64-byte alignment and the descr. */
static size_t npy_data_offset(const char *b, size_t n, const char *descr)
{
	size_t off;
	char want[32];

	ck_assert_msg(n >= 12 && memcmp(b, "\x93NUMPY", 6) == 0, "not an .npy file (%zu bytes)", n);
	if (b[6] == 1)
		off = 10 + ((size_t)(unsigned char)b[8] | (size_t)(unsigned char)b[9] << 8);
	else
		off = 12 + ((size_t)(unsigned char)b[8] | (size_t)(unsigned char)b[9] << 8 |
		            (size_t)(unsigned char)b[10] << 16 | (size_t)(unsigned char)b[11] << 24);
	ck_assert_msg(off <= n && off % 64 == 0, ".npy data offset %zu (of %zu bytes)", off, n);
	ck_assert_msg(b[off - 1] == '\n', ".npy header does not end in a newline");
	snprintf(want, sizeof want, "'descr': '%s'", descr);
	ck_assert_msg(memmem(b, off, want, strlen(want)) != NULL, ".npy header lacks %s: %.*s", want,
	              (int)off - 10, b + 10);
	return off;
}

/* ==== uploads and downloads ======================================================================= */

/* Each dtype, raw up and down in device and host memory: the same bytes
 * back raw and as .npy, which numpy reads as the same values. */
START_TEST(test_raw_roundtrip_every_dtype)
{
	static const char *const placements[] = {"", "memory_kind=unpinned_host",
	                                         "device=sim:1&memory_kind=pinned_host"};
	static const char *const npy_accept[] = {"Accept: application/x-npy", NULL};
	static const uint64_t shape[3] = {3, 4, 5};
	struct pycheck pc;

	pyc_init(&pc);
	for (size_t i = 0; i < NDTYPES; i++) {
		size_t len = 60 * dtypes[i].size;
		unsigned char *data = th_pattern(len, i + 1);

		if (strcmp(dtypes[i].name, "bool") == 0)
			for (size_t k = 0; k < len; k++)
				data[k] &= 1;
		for (size_t p = 0; p < 3; p++) {
			struct th_response r;
			char name[64], query[200], etag[128];
			size_t off;

			snprintf(name, sizeof name, "rt-%s-%zu", dtypes[i].name, p);
			snprintf(query, sizeof query, "dtype=%s&shape=3,4,5%s%s", dtypes[i].name,
			         *placements[p] ? "&" : "", placements[p]);
			put(&D, name, query, NULL, data, len, &r);
			ck_assert_msg(r.status == 201, "PUT %s: %ld %s", query, r.status, r.body);
			ck_assert_str_eq(th_str(th_json(&r), "dtype"), dtypes[i].name);
			ck_assert_int_eq(th_int(th_json(&r), "nbytes"), len);
			snprintf(etag, sizeof etag, "%s", th_str(th_json(&r), "etag"));
			th_response_free(&r);

			get_data(&D, name, NULL, NULL, &r);
			ck_assert_int_eq(r.status, 200);
			th_assert_bytes(name, r.body, r.body_len, data, len);
			ck_assert_str_eq(th_header(&r, "Content-Type"), "application/octet-stream");
			ck_assert_str_eq(th_header(&r, "X-Tstage-Dtype"), dtypes[i].name);
			ck_assert_str_eq(th_header(&r, "X-Tstage-Shape"), "[3,4,5]");
			ck_assert_str_eq(th_header(&r, "ETag"), etag);
			th_response_free(&r);

			get_data(&D, name, p == 1 ? "format=npy" : NULL, p == 1 ? NULL : npy_accept, &r);
			ck_assert_int_eq(r.status, 200);
			ck_assert_str_eq(th_header(&r, "Content-Type"), "application/x-npy");
			off = npy_data_offset(r.body, r.body_len, dtypes[i].descr);
			th_assert_bytes(name, r.body + off, r.body_len - off, data, len);
			pyc_npy(&pc, r.body, r.body_len, dtypes[i].name, 3, shape, data, len);
			th_response_free(&r);
		}
		free(data);
	}
	pyc_run(&pc);
}
END_TEST

/* A 0-d array (empty shape=) and a zero-sized one, raw and .npy. */
START_TEST(test_raw_scalar_and_empty)
{
	static const uint64_t empty_shape[2] = {0, 5};
	double v = -2.5;
	struct th_response r;
	struct pycheck pc;
	char header_problem[256] = "";
	size_t off;

	pyc_init(&pc);
	put(&D, "scalar", "dtype=float64&shape=", NULL, &v, sizeof v, &r);
	ck_assert_msg(r.status == 201, "%ld %s", r.status, r.body);
	ck_assert_int_eq(json_array_size(th_arr(th_json(&r), "shape")), 0);
	th_response_free(&r);
	th_expect_data(&D, "scalar", NULL, &v, sizeof v);
	get_data(&D, "scalar", NULL, NULL, &r);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Dtype"), "float64");
	shape_header_ok(&r, "scalar", "[]", header_problem, sizeof header_problem);
	th_response_free(&r);
	get_data(&D, "scalar", "format=npy", NULL, &r);
	off = npy_data_offset(r.body, r.body_len, "<f8");
	th_assert_bytes("scalar npy", r.body + off, r.body_len - off, &v, sizeof v);
	ck_assert_ptr_nonnull(memmem(r.body, off, "'shape': ()", 11));
	pyc_npy(&pc, r.body, r.body_len, "float64", 0, NULL, &v, sizeof v);
	th_response_free(&r);

	put(&D, "nothing", "dtype=float32&shape=0,5&memory_kind=pinned_host", NULL, "", 0, &r);
	ck_assert_msg(r.status == 201, "%ld %s", r.status, r.body);
	ck_assert_int_eq(th_int(th_json(&r), "nbytes"), 0);
	th_response_free(&r);
	get_data(&D, "nothing", NULL, NULL, &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_int_eq(r.body_len, 0);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Shape"), "[0,5]");
	th_response_free(&r);
	get_data(&D, "nothing", "format=npy", NULL, &r);
	off = npy_data_offset(r.body, r.body_len, "<f4");
	ck_assert_int_eq(off, r.body_len);
	pyc_npy(&pc, r.body, r.body_len, "float32", 2, empty_shape, "", 0);
	th_response_free(&r);

	get_data(&D, "scalar", "format=csv", NULL, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_FORMAT");
	th_response_free(&r);
	pyc_run(&pc);
	ck_assert_msg(!header_problem[0], "%s", header_problem);
}
END_TEST

/* Every .npy numpy wrote (each dtype, 0-d, empty, Fortran order, big-endian,
 * version 2.0, bfloat16 as a 2-byte void) into device and host memory: the
 * array holds numpy's values in C order, little-endian. Served back as
 * .npy, numpy reads the same values. */
START_TEST(test_npy_fixtures)
{
	static const char *const npy[] = {"Content-Type: application/x-npy", NULL};
	static const char *const placements[] = {"device=sim:1", "memory_kind=unpinned_host"};
	json_t *m = manifest(), *e;
	struct pycheck pc;
	size_t i;
	int n = 0;

	pyc_init(&pc);
	json_array_foreach(th_arr(m, "npy"), i, e) {
		const char *cas = th_str(e, "case"), *dtype = th_str(e, "dtype");
		json_t *hint = json_object_get(e, "hint"), *shape = th_arr(e, "shape");
		size_t body_len, raw_len;
		char *body = fixture_bytes(th_str(e, "file"), &body_len);
		char *raw = fixture_bytes(th_str(e, "raw"), &raw_len);

		for (size_t p = 0; p < 2; p++) {
			struct th_response r;
			char name[128], query[200];
			uint64_t shp[32];
			int rank = (int)json_array_size(shape);

			snprintf(name, sizeof name, "npy-%s-%zu", cas, p);
			snprintf(query, sizeof query, "%s%s%s", placements[p],
			         json_is_string(hint) ? "&dtype=" : "",
			         json_is_string(hint) ? json_string_value(hint) : "");
			put(&D, name, query, npy, body, body_len, &r);
			ck_assert_msg(r.status == 201, "PUT %s (%s): %ld %s", th_str(e, "file"), query,
			              r.status, r.body);
			ck_assert_msg(strcmp(th_str(th_json(&r), "dtype"), dtype) == 0,
			              "%s: dtype %s, want %s", cas, th_str(th_json(&r), "dtype"), dtype);
			ck_assert_msg(json_equal(th_arr(th_json(&r), "shape"), shape), "%s: shape", cas);
			th_response_free(&r);
			th_expect_data(&D, name, NULL, raw, raw_len);

			get_data(&D, name, "format=npy", NULL, &r);
			ck_assert_int_eq(r.status, 200);
			for (int k = 0; k < rank; k++)
				shp[k] = (uint64_t)json_integer_value(json_array_get(shape, (size_t)k));
			pyc_npy(&pc, r.body, r.body_len, dtype, rank, shp, raw, raw_len);
			th_response_free(&r);
			n++;
		}
		free(body);
		free(raw);
	}
	ck_assert_msg(n >= 60, "only %d .npy uploads", n);
	json_decref(m);
	pyc_run(&pc);
}
END_TEST

/* .npy bodies tstaged must refuse, each with nothing created. */
START_TEST(test_npy_refused)
{
	static const char *const npy[] = {"Content-Type: application/x-npy", NULL};
	struct th_response r;
	size_t len, bf_len;
	char *i16, *bf, *bad;
	char before[4096];
	char *snap;

	need_fixtures();
	i16 = fixture_bytes("npy/dt_int16.npy", &len);
	bf = fixture_bytes("npy/bf16_le_void.npy", &bf_len);
	snap = all_in_use(&D);
	snprintf(before, sizeof before, "%s", snap);
	free(snap);

	put(&D, "bf", NULL, npy, bf, bf_len, &r);            /* '<V2' needs the hint */
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_NPY_HEADER");
	ck_assert_ptr_nonnull(strstr(th_str(th_obj(th_json(&r), "error"), "message"), "bfloat16"));
	th_response_free(&r);
	put(&D, "i16", "dtype=float32", npy, i16, len, &r);  /* hint disagrees */
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	put(&D, "i16", "dtype=bfloat16", npy, i16, len, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	put(&D, "i16", NULL, npy, i16, len - 2, &r);         /* data short */
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
	th_response_free(&r);
	bad = malloc(len + 2);
	ck_assert_ptr_nonnull(bad);
	memcpy(bad, i16, len);
	memcpy(bad + len, "xx", 2);
	put(&D, "i16", NULL, npy, bad, len + 2, &r);         /* data long */
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
	th_response_free(&r);
	put(&D, "i16", NULL, npy, i16, 40, &r);              /* ends inside the header */
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	memcpy(bad, i16, len);
	bad[1] = 'X';                                        /* bad magic */
	put(&D, "i16", NULL, npy, bad, len, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_NPY_HEADER");
	th_response_free(&r);
	memcpy(bad, i16, len);
	memcpy(memmem(bad, len, "<i2", 3), "<c8", 3);        /* a dtype tstage lacks */
	put(&D, "i16", NULL, npy, bad, len, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);

	expect_absent(&D, "bf");
	expect_absent(&D, "i16");
	wait_all_in_use(&D, before, 2000);
	free(bad);
	free(i16);
	free(bf);
}
END_TEST

/* Every placement: where the array says it is, and the space that counts
 * its bytes, exactly. */
START_TEST(test_placements)
{
	static const struct {
		const char *query, *dev, *kind;
		bool committed;
	} pl[] = {
		{"", "sim:0", "device", false},
		{"device=sim:0", "sim:0", "device", true},
		{"device=sim:1", "sim:1", "device", true},
		{"memory_kind=pinned_host", "sim:0", "pinned_host", true},
		{"device=sim:1&memory_kind=pinned_host", "sim:1", "pinned_host", true},
		{"memory_kind=unpinned_host", "sim:0", "unpinned_host", true},
		{"device=sim:1&memory_kind=unpinned_host", "sim:1", "unpinned_host", true},
		{"device=cpu:0", "cpu:0", "device", true},
		{"device=cpu:0&memory_kind=pinned_host", "cpu:0", "pinned_host", true},
	};
	json_t *held = json_object();      /* "dev/kind" -> bytes placed there so far */
	struct th_response r;

	for (size_t i = 0; i < sizeof pl / sizeof pl[0]; i++) {
		size_t len = 1000 + 37 * i;
		char key[64];
		json_int_t want;
		void *data = th_pattern(len, 100 + i);
		char name[32], query[200];
		json_t *j, *sh, *shards;

		snprintf(name, sizeof name, "pl%zu", i);
		snprintf(query, sizeof query, "dtype=uint8&shape=%zu%s%s", len, *pl[i].query ? "&" : "",
		         pl[i].query);
		put(&D, name, query, NULL, data, len, &r);
		ck_assert_msg(r.status == 201, "PUT %s: %ld %s", query, r.status, r.body);
		j = th_json(&r);
		sh = th_obj(j, "sharding");
		ck_assert_str_eq(th_str(sh, "device"), B(pl[i].dev));
		ck_assert_str_eq(th_str(sh, "memory_kind"), pl[i].kind);
		ck_assert_msg(th_bool(j, "committed") == pl[i].committed, "%s: committed", query);
		shards = th_arr(j, "shards");
		ck_assert_int_eq(json_array_size(shards), 1);
		ck_assert_str_eq(th_str(json_array_get(shards, 0), "device"), B(pl[i].dev));
		ck_assert_str_eq(th_str(json_array_get(shards, 0), "memory_kind"), pl[i].kind);
		ck_assert_int_eq(th_int(json_array_get(shards, 0), "nbytes"), len);
		th_response_free(&r);
		snprintf(key, sizeof key, "%s/%s", B(pl[i].dev), pl[i].kind);
		want = json_integer_value(json_object_get(held, key)) + (json_int_t)len;
		json_object_set_new(held, key, json_integer(want));
		ck_assert_msg(in_use(&D, pl[i].dev, pl[i].kind) == want, "%s holds %lld, want %lld",
		              key, in_use(&D, pl[i].dev, pl[i].kind), (long long)want);
		th_expect_data(&D, name, NULL, data, len);
		free(data);
	}

	put(&D, "x", "dtype=uint8&shape=1&device=sim:9", NULL, "a", 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "DEVICE_NOT_FOUND");
	th_response_free(&r);
	put(&D, "x", "dtype=uint8&shape=1&memory_kind=vram", NULL, "a", 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_MEMORY_KIND");
	th_response_free(&r);
	put(&D, "x", "dtype=complex64&shape=1", NULL, "a", 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_DTYPE");
	th_response_free(&r);
	put(&D, "x", "shape=1", NULL, "a", 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_DTYPE");
	th_response_free(&r);
	put(&D, "x", "dtype=uint8", NULL, "a", 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_SHAPE");
	th_response_free(&r);
	put(&D, "x", "dtype=uint8&shape=1,-1", NULL, "a", 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_SHAPE");
	th_response_free(&r);
	put(&D, "-x", "dtype=uint8&shape=1", NULL, "a", 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_ARRAY_NAME");
	th_response_free(&r);
	{
		char longname[140];

		memset(longname, 'n', 129);
		longname[129] = '\0';
		put(&D, longname, "dtype=uint8&shape=1", NULL, "a", 1, &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_ARRAY_NAME");
		th_response_free(&r);
		longname[128] = '\0';
		put_ok(&D, longname, "dtype=uint8&shape=1", "a", 1, 201);
	}
	expect_absent(&D, "x");
	json_decref(held);
}
END_TEST

static bool rfc3339_utc(const char *s)
{
	int y, mo, d, h, mi, se;
	char frac[16], z;

	return strlen(s) == 27 &&
	       sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%6[0-9]%c", &y, &mo, &d, &h, &mi, &se, frac, &z) == 8 &&
	       z == 'Z';
}

/* The metadata of an array, and what a replace changes in it. */
START_TEST(test_metadata)
{
	struct th_response r;
	char etag1[128], created[64], *data = th_pattern(8 * 6 * 2, 5);
	json_t *j;

	put(&D, "m", "dtype=int16&shape=8,6&device=sim:1", NULL, data, 96, &r);
	ck_assert_int_eq(r.status, 201);
	ck_assert_str_eq(th_header(&r, "Location"), "/v1/arrays/m");
	ck_assert_str_eq(th_header(&r, "ETag"), th_str(th_json(&r), "etag"));
	snprintf(etag1, sizeof etag1, "%s", th_header(&r, "ETag"));
	ck_assert_msg(etag1[0] == '"' && etag1[strlen(etag1) - 1] == '"', "ETag %s is not quoted",
	              etag1);
	th_response_free(&r);

	j = get_meta(&D, "m", &r);
	ck_assert_str_eq(th_str(j, "name"), "m");
	ck_assert_str_eq(th_str(j, "dtype"), "int16");
	ck_assert_int_eq(json_array_size(th_arr(j, "shape")), 2);
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(j, "shape"), 0)), 8);
	ck_assert_int_eq(json_integer_value(json_array_get(th_arr(j, "shape"), 1)), 6);
	ck_assert_int_eq(th_int(j, "nbytes"), 96);
	ck_assert_str_eq(th_str(th_obj(j, "sharding"), "device"), "sim:1");
	ck_assert_str_eq(th_str(th_obj(j, "sharding"), "memory_kind"), "device");
	ck_assert(th_bool(j, "committed"));
	ck_assert_int_eq(json_array_size(th_arr(j, "shards")), 1);
	ck_assert_int_eq(th_int(j, "version"), 1);
	ck_assert_str_eq(th_str(j, "etag"), etag1);
	ck_assert_str_eq(th_header(&r, "ETag"), etag1);
	ck_assert_msg(rfc3339_utc(th_str(j, "create_time")), "create_time %s",
	              th_str(j, "create_time"));
	ck_assert_msg(rfc3339_utc(th_str(j, "update_time")), "update_time %s",
	              th_str(j, "update_time"));
	snprintf(created, sizeof created, "%s", th_str(j, "create_time"));
	th_response_free(&r);

	usleep(2000);
	put(&D, "m", "dtype=uint8&shape=3", NULL, "abc", 3, &r);
	ck_assert_msg(r.status == 200, "replace: %ld %s", r.status, r.body);
	j = th_json(&r);
	ck_assert_int_eq(th_int(j, "version"), 2);
	ck_assert_str_ne(th_str(j, "etag"), etag1);
	ck_assert_str_eq(th_str(j, "dtype"), "uint8");
	/* no placement given: a committed array keeps its placement */
	ck_assert_str_eq(th_str(th_obj(j, "sharding"), "device"), "sim:1");
	ck_assert(th_bool(j, "committed"));
	ck_assert_str_eq(th_str(j, "create_time"), created);
	ck_assert_msg(strcmp(th_str(j, "update_time"), created) > 0, "update_time %s <= %s",
	              th_str(j, "update_time"), created);
	th_response_free(&r);
	/* the old version's bytes went back; the new ones are on sim:1 too */
	wait_in_use(&D, "sim:1", "device", 3, 2000);
	ck_assert_int_eq(in_use(&D, "sim:0", "device"), 0);

	th_get(&D, "/v1/arrays/no-such", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	th_get(&D, "/v1/arrays/no-such/data", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	th_get(&D, "/v1/arrays/bad%20name", &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_ARRAY_NAME");
	th_response_free(&r);
	th_request(&D, "POST", "/v1/arrays/m", NULL, "{}", 2, &r);
	ck_assert_int_eq(r.status, 405);
	th_response_free(&r);
	free(data);
}
END_TEST

/* ==== index expressions =========================================================================== */

#define NONE INT64_MIN
enum { AX_INT, AX_SLICE };

/* One axis of an expression, written out by hand (ellipsis expanded). */
struct ax {
	int kind;
	int64_t a, b, c;        /* AX_INT: a; AX_SLICE: start, stop, step (NONE: omitted) */
};
#define I(v) {AX_INT, (v), 0, 0}
#define SL(a, b, c) {AX_SLICE, (a), (b), (c)}
#define ALL SL(NONE, NONE, NONE)

static const struct index_case {
	const char *expr;
	struct ax ax[3];
} index_cases[] = {
	{"5", {I(5), ALL, ALL}},
	{"-1", {I(-1), ALL, ALL}},
	{"0:6", {SL(0, 6, NONE), ALL, ALL}},
	{"2:10:2,:", {SL(2, 10, 2), ALL, ALL}},
	{"::-1", {SL(NONE, NONE, -1), ALL, ALL}},
	{"1:7:3, ::-2, 3", {SL(1, 7, 3), SL(NONE, NONE, -2), I(3)}},
	{"..., 5", {ALL, ALL, I(5)}},
	{"..., ::-3", {ALL, ALL, SL(NONE, NONE, -3)}},
	{"3, 2, 1", {I(3), I(2), I(1)}},
	{"-8,-6,-16", {I(-8), I(-6), I(-16)}},
	{"7:2:-2, 1:, :4", {SL(7, 2, -2), SL(1, NONE, NONE), SL(NONE, 4, NONE)}},
	{"::, 0", {ALL, I(0), ALL}},
	{"5:5", {SL(5, 5, NONE), ALL, ALL}},
	{"2, ..., -1", {I(2), ALL, I(-1)}},
	{"-100:100", {SL(-100, 100, NONE), ALL, ALL}},
	{"1,", {I(1), ALL, ALL}},
	{":, 4:, -3:-1", {ALL, SL(4, NONE, NONE), SL(-3, -1, NONE)}},
	{"...", {ALL, ALL, ALL}},
	{"-1:-9:-1, 5::-2, 15:0:-4", {SL(-1, -9, -1), SL(5, NONE, -2), SL(15, 0, -4)}},
	{"3, 1:2", {I(3), SL(1, 2, NONE), ALL}},
	{"..., 0, 0", {ALL, I(0), I(0)}},
	{"2:3, 4:5, 6:7", {SL(2, 3, NONE), SL(4, 5, NONE), SL(6, 7, NONE)}},
	{"::3, ..., 10:", {SL(NONE, NONE, 3), ALL, SL(10, NONE, NONE)}},
};
#define NINDEX (sizeof index_cases / sizeof index_cases[0])

static const int64_t idx_dims[3] = {8, 6, 16};
#define IDX_ELEMS (8 * 6 * 16)

/* Python's slice.indices() and the length of the range (CPython's
 * PySlice_AdjustIndices). */
static uint64_t py_slice(int64_t start, int64_t stop, int64_t step, int64_t len, int64_t *first)
{
	int64_t lower, upper;

	if (step == NONE)
		step = 1;
	lower = step < 0 ? -1 : 0;
	upper = step < 0 ? len - 1 : len;
	if (start == NONE)
		start = step < 0 ? upper : lower;
	else if (start < 0)
		start = start + len < lower ? lower : start + len;
	else if (start > upper)
		start = upper;
	if (stop == NONE)
		stop = step < 0 ? lower : upper;
	else if (stop < 0)
		stop = stop + len < lower ? lower : stop + len;
	else if (stop > upper)
		stop = upper;
	*first = start;
	if (step > 0)
		return start < stop ? (uint64_t)((stop - start - 1) / step + 1) : 0;
	return stop < start ? (uint64_t)((start - stop - 1) / -step + 1) : 0;
}

/* parent[expr] as numpy computes it: its elements in C order, rank, shape. */
static size_t reference_index(const uint16_t *parent, const struct index_case *c, uint16_t *out,
                              int *rank, uint64_t *shape)
{
	int64_t idx[3][16];
	uint64_t n[3];
	size_t k = 0;

	*rank = 0;
	for (int i = 0; i < 3; i++) {
		const struct ax *x = &c->ax[i];

		if (x->kind == AX_INT) {
			idx[i][0] = x->a < 0 ? x->a + idx_dims[i] : x->a;
			n[i] = 1;
			continue;
		}
		{
			int64_t first, step = x->c == NONE ? 1 : x->c;

			n[i] = py_slice(x->a, x->b, x->c, idx_dims[i], &first);
			for (uint64_t j = 0; j < n[i]; j++)
				idx[i][j] = first + (int64_t)j * step;
			shape[(*rank)++] = n[i];
		}
	}
	for (uint64_t a = 0; a < n[0]; a++)
		for (uint64_t b = 0; b < n[1]; b++)
			for (uint64_t e = 0; e < n[2]; e++)
				out[k++] = parent[(idx[0][a] * 6 + idx[1][b]) * 16 + idx[2][e]];
	return k;
}

/* The [8,6,16] uint16 parent: every element distinct. */
static void index_parent(uint16_t *p)
{
	for (uint32_t i = 0; i < IDX_ELEMS; i++)
		p[i] = (uint16_t)((i * 40503u) ^ 0x5a5au);
}

/* "[6,16]", "[]" for rank 0: X-Tstage-Shape's spelling. */
static void format_shape(char *buf, size_t cap, int rank, const uint64_t *shape)
{
	size_t o = (size_t)snprintf(buf, cap, "[");

	for (int i = 0; i < rank; i++)
		o += (size_t)snprintf(buf + o, cap - o, i ? ",%" PRIu64 : "%" PRIu64, shape[i]);
	snprintf(buf + o, cap - o, "]");
}

/* Runs every index case on name (which holds index_parent), raw, and as
 * .npy for every third case (checked by numpy later). */
static void check_index_cases(struct th_daemon *d, const char *name, const uint16_t *parent,
                              struct pycheck *pc, char *header_problem, size_t cap)
{
	uint16_t want[IDX_ELEMS];

	for (size_t i = 0; i < NINDEX; i++) {
		const struct index_case *c = &index_cases[i];
		char esc[256], query[300], shape_s[64], what[300];
		uint64_t shape[3];
		struct th_response r;
		int rank;
		size_t n = reference_index(parent, c, want, &rank, shape), off;

		th_url_escape(esc, sizeof esc, c->expr);
		snprintf(query, sizeof query, "index=%s", esc);
		get_data(d, name, query, NULL, &r);
		ck_assert_msg(r.status == 200, "%s[%s]: %ld %s", name, c->expr, r.status, r.body);
		snprintf(what, sizeof what, "%s[%s]", name, c->expr);
		th_assert_bytes(what, r.body, r.body_len, want, n * 2);
		format_shape(shape_s, sizeof shape_s, rank, shape);
		shape_header_ok(&r, what, shape_s, header_problem, cap);
		ck_assert_str_eq(th_header(&r, "X-Tstage-Dtype"), "uint16");
		th_response_free(&r);
		if (i % 3)
			continue;
		snprintf(query, sizeof query, "index=%s&format=npy", esc);
		get_data(d, name, query, NULL, &r);
		ck_assert_int_eq(r.status, 200);
		off = npy_data_offset(r.body, r.body_len, "<u2");
		th_assert_bytes(what, r.body + off, r.body_len - off, want, n * 2);
		pyc_npy(pc, r.body, r.body_len, "uint16", rank, shape, want, n * 2);
		th_response_free(&r);
	}
}

/* Out of range names the axis; bad syntax is INVALID_ARGUMENT. */
static void check_index_errors(struct th_daemon *d, const char *name)
{
	static const struct {
		const char *expr;
		int axis;              /* -1: a syntax error */
	} bad[] = {
		{"8", 0}, {"-9", 0}, {"0, 6", 1}, {"0, 0, -17", 2}, {"..., 16", 2},
		{"::0", -1}, {"0,0,0,0", -1}, {"...,...", -1}, {"None", -1}, {"[1]", -1},
		{"1.5", -1}, {"0:1:2:3", -1}, {"a", -1}, {"1 2", -1},
	};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char esc[128], query[160], axis[32];
		struct th_response r;
		json_t *err;

		th_url_escape(esc, sizeof esc, bad[i].expr);
		snprintf(query, sizeof query, "index=%s", esc);
		get_data(d, name, query, NULL, &r);
		if (bad[i].axis < 0) {
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_INDEX");
			th_response_free(&r);
			continue;
		}
		th_assert_error(&r, 400, "OUT_OF_RANGE", "INDEX_OUT_OF_RANGE");
		err = th_obj(th_json(&r), "error");
		snprintf(axis, sizeof axis, "axis %d", bad[i].axis);
		ck_assert_msg(strstr(th_str(err, "message"), axis) != NULL,
		              "[%s]: message '%s' does not name %s", bad[i].expr, th_str(err, "message"),
		              axis);
		ck_assert_msg(meta_u64(th_obj(json_array_get(th_arr(err, "details"), 0), "metadata"),
		                       "axis") == (unsigned long long)bad[i].axis, "[%s]: metadata axis",
		              bad[i].expr);
		th_response_free(&r);
	}
}

static void index_suite_on(const char *placement)
{
	uint16_t parent[IDX_ELEMS];
	char query[128], header_problem[256] = "";
	struct pycheck pc;

	pyc_init(&pc);
	index_parent(parent);
	snprintf(query, sizeof query, "dtype=uint16&shape=8,6,16%s%s", *placement ? "&" : "",
	         placement);
	put_ok(&D, "p", query, parent, sizeof parent, 201);
	check_index_cases(&D, "p", parent, &pc, header_problem, sizeof header_problem);
	check_index_errors(&D, "p");
	pyc_run(&pc);
	ck_assert_msg(!header_problem[0], "%s", header_problem);
}

START_TEST(test_index_host)
{
	index_suite_on("memory_kind=unpinned_host");
}
END_TEST

START_TEST(test_index_pinned)
{
	index_suite_on("device=sim:1&memory_kind=pinned_host");
}
END_TEST

START_TEST(test_index_device)
{
	index_suite_on("");
}
END_TEST

/* A 0-d array takes only the empty, "..." and "()"-less expressions. */
START_TEST(test_index_scalar_parent)
{
	int32_t v = 77;
	struct th_response r;

	put_ok(&D, "s", "dtype=int32&shape=", &v, sizeof v, 201);
	get_data(&D, "s", "index=...", NULL, &r);
	ck_assert_int_eq(r.status, 200);
	th_assert_bytes("s[...]", r.body, r.body_len, &v, sizeof v);
	th_response_free(&r);
	get_data(&D, "s", "index=0", NULL, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_INDEX");
	th_response_free(&r);
}
END_TEST

/* ==== gather ======================================================================================= */

static size_t reference_rows(const uint16_t *parent, const int64_t *rows, size_t n, uint16_t *out)
{
	for (size_t i = 0; i < n; i++) {
		int64_t row = rows[i] < 0 ? rows[i] + 8 : rows[i];

		memcpy(out + i * 96, parent + row * 96, 96 * sizeof *out);
	}
	return n * 96;
}

static void gather(struct th_daemon *d, const char *src, const char *body, struct th_response *r)
{
	char path[300];

	array_path(path, sizeof path, src, ":gather", NULL);
	body = B(body);
	th_request(d, "POST", path, NULL, body, strlen(body), r);
}

START_TEST(test_gather)
{
	static const struct {
		const char *src_place;
		const char *rows;       /* JSON */
		int64_t list[16];
		size_t n;
		const char *out_place;  /* JSON members of "out" after the name */
		const char *dev, *kind;
	} cases[] = {
		{"", "[5, 1, 1, -1, 0, 7, 3, -8]", {5, 1, 1, -1, 0, 7, 3, -8}, 8,
		 ", \"device\": \"sim:1\", \"memory_kind\": \"pinned_host\"", "sim:1", "pinned_host"},
		{"memory_kind=unpinned_host", "[6, 2, 4]", {6, 2, 4}, 3, "", "sim:0", "device"},
		{"device=sim:1", "{\"start\": 6, \"stop\": 0, \"step\": -2}", {6, 4, 2}, 3,
		 ", \"device\": \"sim:0\"", "sim:0", "device"},
		{"memory_kind=pinned_host", "{\"start\": 1, \"stop\": 100}", {1, 2, 3, 4, 5, 6, 7}, 7,
		 ", \"memory_kind\": \"unpinned_host\"", "sim:0", "unpinned_host"},
		{"device=cpu:0", "{\"step\": 3}", {0, 3, 6}, 3, ", \"device\": \"sim:1\"", "sim:1",
		 "device"},
		{"", "{\"start\": -3}", {5, 6, 7}, 3, ", \"device\": \"cpu:0\"", "cpu:0", "device"},
		{"", "{}", {0, 1, 2, 3, 4, 5, 6, 7}, 8, "", "sim:0", "device"},
		{"", "[]", {0}, 0, "", "sim:0", "device"},
	};
	uint16_t parent[IDX_ELEMS], want[16 * 96];

	index_parent(parent);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char query[128], src[16], out[16], body[400];
		struct th_response r;
		size_t n;
		json_t *j;

		snprintf(src, sizeof src, "src%zu", i);
		snprintf(out, sizeof out, "out%zu", i);
		snprintf(query, sizeof query, "dtype=uint16&shape=8,6,16%s%s",
		         *cases[i].src_place ? "&" : "", cases[i].src_place);
		put_ok(&D, src, query, parent, sizeof parent, 201);
		snprintf(body, sizeof body, "{\"rows\": %s, \"out\": {\"name\": \"%s\"%s}}",
		         cases[i].rows, out, cases[i].out_place);
		gather(&D, src, body, &r);
		ck_assert_msg(r.status == 201, "%s: %ld %s", body, r.status, r.body);
		j = th_json(&r);
		ck_assert_str_eq(th_str(j, "name"), out);
		ck_assert_int_eq(json_integer_value(json_array_get(th_arr(j, "shape"), 0)), cases[i].n);
		ck_assert_int_eq(json_integer_value(json_array_get(th_arr(j, "shape"), 1)), 6);
		ck_assert_int_eq(json_integer_value(json_array_get(th_arr(j, "shape"), 2)), 16);
		ck_assert_str_eq(th_str(th_obj(j, "sharding"), "device"), B(cases[i].dev));
		ck_assert_str_eq(th_str(th_obj(j, "sharding"), "memory_kind"), cases[i].kind);
		ck_assert(th_bool(j, "committed") == (*cases[i].out_place != '\0'));
		th_response_free(&r);
		n = reference_rows(parent, cases[i].list, cases[i].n, want);
		th_expect_data(&D, out, NULL, want, n * 2);
		th_expect_data(&D, src, NULL, parent, sizeof parent);     /* the source is untouched */
	}
	{
		/* gathering onto an existing name replaces it */
		struct th_response r;
		int64_t row0[1] = {0};
		size_t n = reference_rows(parent, row0, 1, want);

		gather(&D, "src0", "{\"rows\": [0], \"out\": {\"name\": \"out1\"}}", &r);
		ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
		ck_assert_int_eq(th_int(th_json(&r), "version"), 2);
		th_response_free(&r);
		th_expect_data(&D, "out1", NULL, want, n * 2);
	}
}
END_TEST

START_TEST(test_gather_errors)
{
	static const struct {
		const char *src, *body;
		long http;
		const char *status, *reason;
	} bad[] = {
		{"g", "{\"rows\": [8], \"out\": {\"name\": \"o\"}}", 400, "OUT_OF_RANGE",
		 "INDEX_OUT_OF_RANGE"},
		{"g", "{\"rows\": [0, -9], \"out\": {\"name\": \"o\"}}", 400, "OUT_OF_RANGE",
		 "INDEX_OUT_OF_RANGE"},
		{"g", "{\"rows\": [1, \"a\"], \"out\": {\"name\": \"o\"}}", 400, "INVALID_ARGUMENT",
		 "BAD_ROWS"},
		{"g", "{\"rows\": {\"step\": 0}, \"out\": {\"name\": \"o\"}}", 400, "INVALID_ARGUMENT",
		 NULL},
		{"g", "{\"rows\": {\"begin\": 1}, \"out\": {\"name\": \"o\"}}", 400, "INVALID_ARGUMENT",
		 "BAD_ROWS"},
		{"g", "{\"rows\": 3, \"out\": {\"name\": \"o\"}}", 400, "INVALID_ARGUMENT", "BAD_ROWS"},
		{"g", "{\"rows\": [0]}", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY"},
		{"g", "{\"rows\": [0], \"out\": {\"name\": \"o\"}, \"extra\": 1}", 400,
		 "INVALID_ARGUMENT", "BAD_REQUEST_BODY"},
		{"g", "{\"rows\": [0], \"out\": {\"name\": \"-o\"}}", 400, "INVALID_ARGUMENT",
		 "BAD_ARRAY_NAME"},
		{"g", "{\"rows\": [0], \"out\": {\"name\": \"o\", \"device\": \"sim:7\"}}", 400,
		 "INVALID_ARGUMENT", "DEVICE_NOT_FOUND"},
		{"g", "not json", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY"},
		{"absent", "{\"rows\": [0], \"out\": {\"name\": \"o\"}}", 404, "NOT_FOUND",
		 "ARRAY_NOT_FOUND"},
		{"scalar", "{\"rows\": [0], \"out\": {\"name\": \"o\"}}", 400, "INVALID_ARGUMENT",
		 "BAD_ROWS"},
		/* 2 x 40 MiB cannot be on a 64 MiB device at once */
		{"big", "{\"rows\": {}, \"out\": {\"name\": \"o\", \"device\": \"sim:0\"}}", 429,
		 "RESOURCE_EXHAUSTED", NULL},
	};
	uint16_t parent[IDX_ELEMS];
	void *big = th_pattern(40 * MiB, 3);
	struct th_response r;
	char *before;

	index_parent(parent);
	put_ok(&D, "g", "dtype=uint16&shape=8,6,16", parent, sizeof parent, 201);
	put_ok(&D, "scalar", "dtype=uint16&shape=", parent, 2, 201);
	put_ok(&D, "big", "dtype=uint8&shape=40,1048576&device=sim:0", big, 40 * MiB, 201);
	before = all_in_use(&D);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		gather(&D, bad[i].src, bad[i].body, &r);
		th_assert_error(&r, bad[i].http, bad[i].status, bad[i].reason);
		th_response_free(&r);
		expect_absent(&D, "o");
	}
	wait_all_in_use(&D, before, 2000);
	th_expect_data(&D, "big", NULL, big, 40 * MiB);
	free(before);
	free(big);
}
END_TEST

/* ==== admission and broken uploads ================================================================= */

/* Sends only the head of a PUT with Expect: 100-continue and reads the one
 * answer: it must come at once, and it must not be "100 Continue". */
static json_t *refused_before_body(struct th_daemon *d, const char *path_query,
                                   const char *ctype, unsigned long long len, int want)
{
	char req[1024], buf[65536];
	int fd = th_raw_connect(d), code;
	json_t *j;

	snprintf(req, sizeof req,
	         "PUT %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n"
	         "Content-Length: %llu\r\nExpect: 100-continue\r\n\r\n", path_query, ctype, len);
	th_raw_send(fd, req);
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(strncmp(buf, "HTTP/1.1 100", 12) != 0,
	              "%s: the server asked for the body (100 Continue) before refusing it", path_query);
	ck_assert_msg(code == want, "%s: %d, want %d:\n%s", path_query, code, want, buf);
	j = raw_json_body(buf);
	close(fd);
	return j;
}

static void check_oom_details(json_t *body, const char *space, unsigned long long requested,
                              unsigned long long free_bytes, unsigned long long limit)
{
	json_t *err = th_obj(body, "error"), *info, *meta;

	ck_assert_int_eq(th_int(err, "code"), 429);
	ck_assert_str_eq(th_str(err, "status"), "RESOURCE_EXHAUSTED");
	info = json_array_get(th_arr(err, "details"), 0);
	ck_assert_str_eq(th_str(info, "@type"), "type.googleapis.com/google.rpc.ErrorInfo");
	meta = th_obj(info, "metadata");
	ck_assert_msg(strstr(th_str(meta, "space"), space) != NULL, "space '%s', want %s",
	              th_str(meta, "space"), space);
	ck_assert_int_eq(meta_u64(meta, "requested_bytes"), requested);
	ck_assert_int_eq(meta_u64(meta, "free_bytes"), free_bytes);
	ck_assert_int_eq(meta_u64(meta, "limit_bytes"), limit);
	ck_assert(meta_u64(meta, "largest_free_block_bytes") <= free_bytes);
}

START_TEST(test_admission_before_body)
{
	void *resident = th_pattern(40 * MiB, 7);
	json_t *before, *after, *body;
	struct th_response r;
	char path[200];

	put_ok(&D, "resident", "dtype=uint8&shape=41943040", resident, 40 * MiB, 201);
	before = memory_stats(&D, "sim:0");

	/* above the limit of the space */
	snprintf(path, sizeof path, "/v1/arrays/huge?dtype=uint8&shape=%llu", TH_SIM_MEMORY + 1);
	body = refused_before_body(&D, path, "application/octet-stream", TH_SIM_MEMORY + 1, 429);
	check_oom_details(body, "sim:0", TH_SIM_MEMORY + 1, 24 * MiB, TH_SIM_MEMORY);
	json_decref(body);
	/* within the limit, above what is free */
	body = refused_before_body(&D, "/v1/arrays/huge?dtype=float32&shape=1024,7680",
	                           "application/octet-stream", 30 * MiB, 429);
	check_oom_details(body, "sim:0", 30 * MiB, 24 * MiB, TH_SIM_MEMORY);
	json_decref(body);
	/* a replace needs room for both versions until the new one is whole */
	body = refused_before_body(&D, "/v1/arrays/resident?dtype=uint8&shape=41943040",
	                           "application/octet-stream", 40 * MiB, 429);
	json_decref(body);
	/* an .npy body whose data cannot fit, whatever its header says */
	body = refused_before_body(&D, "/v1/arrays/huge", "application/x-npy", 66 * MiB, 429);
	json_decref(body);
	/* a wrong byte count is refused before the body too */
	body = refused_before_body(&D, "/v1/arrays/small?dtype=uint16&shape=4", "application/octet-stream",
	                           9, 400);
	ck_assert_str_eq(th_str(json_array_get(th_arr(th_obj(body, "error"), "details"), 0), "reason"),
	                 "WRONG_BYTE_COUNT");
	json_decref(body);

	after = memory_stats(&D, "sim:0");
	ck_assert_msg(json_equal(before, after), "memory_stats changed:\n%s\n%s",
	              json_dumps(before, JSON_COMPACT), json_dumps(after, JSON_COMPACT));
	json_decref(before);
	json_decref(after);
	expect_absent(&D, "huge");
	expect_absent(&D, "small");
	ck_assert_int_eq(version_of(&D, "resident"), 1);
	th_expect_data(&D, "resident", NULL, resident, 40 * MiB);
	th_get(&D, "/livez", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	free(resident);
}
END_TEST

/* Short and long bodies, with Content-Length and chunked: 400, and the
 * previous version stays as it was. */
START_TEST(test_wrong_byte_count)
{
	static const char *const placements[] = {"", "memory_kind=unpinned_host",
	                                         "device=sim:1&memory_kind=pinned_host"};
	static const char *const chunked[] = {"Transfer-Encoding: chunked", NULL};
	static const char *const npy_h[] = {"Content-Type: application/x-npy", NULL};
	char *v1 = th_pattern(96, 1), *v2 = th_pattern(200 * KiB, 2), *before;
	struct th_response r;

	for (size_t p = 0; p < 3; p++) {
		static const size_t lens[] = {95, 97, 0, 1, 192};
		char name[16], query[160], *npy;
		size_t npy_len;

		snprintf(name, sizeof name, "w%zu", p);
		snprintf(query, sizeof query, "dtype=uint16&shape=8,6%s%s", *placements[p] ? "&" : "",
		         placements[p]);
		put_ok(&D, name, query, v1, 96, 201);
		get_data(&D, name, "format=npy", NULL, &r);
		ck_assert_int_eq(r.status, 200);
		npy_len = r.body_len;
		npy = malloc(npy_len + 4);
		ck_assert_ptr_nonnull(npy);
		memcpy(npy, r.body, npy_len);
		th_response_free(&r);
		before = all_in_use(&D);

		for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
			put(&D, name, query, NULL, v2, lens[i], &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
			th_response_free(&r);
			put(&D, name, query, chunked, v2, lens[i], &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
			th_response_free(&r);
		}
		/* a long chunked body found out midway, many chunks in */
		put(&D, name, query, chunked, v2, 200 * KiB, &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
		th_response_free(&r);
		/* .npy with its data two bytes short or long, sized and chunked */
		put(&D, name, placements[p], npy_h, npy, npy_len - 2, &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
		th_response_free(&r);
		{
			static const char *const npy_chunked[] = {"Content-Type: application/x-npy",
			                                          "Transfer-Encoding: chunked", NULL};

			memcpy(npy + npy_len, "zz", 2);
			put(&D, name, placements[p], npy_h, npy, npy_len + 2, &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
			th_response_free(&r);
			put(&D, name, placements[p], npy_chunked, npy, npy_len - 2, &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
			th_response_free(&r);
			put(&D, name, placements[p], npy_chunked, npy, npy_len + 2, &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "WRONG_BYTE_COUNT");
			th_response_free(&r);
		}
		ck_assert_int_eq(version_of(&D, name), 1);
		th_expect_data(&D, name, NULL, v1, 96);
		wait_all_in_use(&D, before, 2000);
		free(before);
		/* and a right one still goes through, sized and chunked */
		put_ok(&D, name, query, v2, 96, 200);
		put(&D, name, query, chunked, v1, 96, &r);
		ck_assert_msg(r.status == 200, "chunked replace: %ld %s", r.status, r.body);
		th_response_free(&r);
		th_expect_data(&D, name, NULL, v1, 96);
		free(npy);
	}
	free(v1);
	free(v2);
}
END_TEST

/* A body cut off midway (the client goes away): the previous version stays
 * whole and every space goes back to what it held. */
START_TEST(test_cut_off_body)
{
	static const struct {
		const char *query, *dev, *kind;
	} pl[] = {
		{"", "sim:0", "device"},
		{"memory_kind=unpinned_host", "sim:0", "unpinned_host"},
		{"device=sim:1&memory_kind=pinned_host", "sim:1", "pinned_host"},
	};
	const size_t len = 8 * MiB;
	char *v1 = th_pattern(len, 11), *v2 = th_pattern(len, 12), why[3][2048];
	int leaked = 0;

	for (size_t p = 0; p < 3; p++) {
		char name[16], query[160], req[512], *before;
		long long base;
		int fd;

		snprintf(name, sizeof name, "cut%zu", p);
		snprintf(query, sizeof query, "dtype=uint8&shape=%zu%s%s", len, *pl[p].query ? "&" : "",
		         pl[p].query);
		put_ok(&D, name, query, v1, len, 201);
		before = all_in_use(&D);
		base = in_use(&D, pl[p].dev, pl[p].kind);

		fd = th_raw_connect(&D);
		snprintf(req, sizeof req, "PUT /v1/arrays/%s?%s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
		         "Content-Length: %zu\r\n\r\n", name, query, len);
		th_raw_send(fd, req);
		/* admission reserves the new version's bytes before any of them come */
		wait_in_use(&D, pl[p].dev, pl[p].kind, base + (long long)len, 5000);
		/* half the body, then the client is gone: the close reaches the
		 * server while some of that half is still unread */
		th_raw_send_bytes(fd, v2, len / 2);
		close(fd);
		why[p][0] = '\0';
		if (!all_in_use_becomes(&D, before, 3000, why[p], sizeof why[p]))
			leaked++;
		ck_assert_int_eq(version_of(&D, name), 1);
		th_expect_data(&D, name, NULL, v1, len);
		free(before);
	}
	free(v1);
	free(v2);
	ck_assert_msg(!leaked, "%d of 3 cut-off uploads kept their bytes:\n%s/%s: %s\n%s/%s: %s\n"
	              "%s/%s: %s", leaked, pl[0].dev, pl[0].kind, why[0], pl[1].dev, pl[1].kind,
	              why[1], pl[2].dev, pl[2].kind, why[2]);
}
END_TEST

/* ==== preconditions and delete ========================================================================= */

START_TEST(test_preconditions_and_delete)
{
	static const char *const create_only[] = {"If-None-Match: *", NULL};
	static const char *const bad_inm[] = {"If-None-Match: \"x\"", NULL};
	static const char *const wrong[] = {"If-Match: \"nope\"", NULL};
	static const char *const any[] = {"If-Match: *", NULL};
	const char *match[2] = {NULL, NULL};
	char *v1 = th_pattern(64, 1), *v2 = th_pattern(64, 2), *v3 = th_pattern(64, 3);
	char etag1[128], etag2[128], hdr[160], stale[160];
	struct th_response r;

	put(&D, "p", "dtype=uint8&shape=64", create_only, v1, 64, &r);
	ck_assert_msg(r.status == 201, "%ld %s", r.status, r.body);
	snprintf(etag1, sizeof etag1, "%s", th_header(&r, "ETag"));
	th_response_free(&r);

	put(&D, "p", "dtype=uint8&shape=64", create_only, v2, 64, &r);
	th_assert_error(&r, 409, "ALREADY_EXISTS", NULL);
	th_response_free(&r);
	put(&D, "p", "dtype=uint8&shape=64", bad_inm, v2, 64, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	put(&D, "p", "dtype=uint8&shape=64", wrong, v2, 64, &r);
	th_assert_error(&r, 400, "FAILED_PRECONDITION", NULL);
	th_response_free(&r);
	put(&D, "absent", "dtype=uint8&shape=64", any, v2, 64, &r);
	th_assert_error(&r, 400, "FAILED_PRECONDITION", NULL);
	th_response_free(&r);
	expect_absent(&D, "absent");
	th_expect_data(&D, "p", NULL, v1, 64);
	ck_assert_int_eq(version_of(&D, "p"), 1);

	snprintf(hdr, sizeof hdr, "If-Match: %s", etag1);
	match[0] = hdr;
	put(&D, "p", "dtype=uint8&shape=64", match, v2, 64, &r);
	ck_assert_msg(r.status == 200, "If-Match current: %ld %s", r.status, r.body);
	snprintf(etag2, sizeof etag2, "%s", th_header(&r, "ETag"));
	ck_assert_str_ne(etag1, etag2);
	th_response_free(&r);
	snprintf(stale, sizeof stale, "%s", hdr);
	match[0] = stale;                        /* etag1 is stale now */
	put(&D, "p", "dtype=uint8&shape=64", match, v3, 64, &r);
	th_assert_error(&r, 400, "FAILED_PRECONDITION", NULL);
	th_response_free(&r);
	th_expect_data(&D, "p", NULL, v2, 64);
	put(&D, "p", "dtype=uint8&shape=64", any, v3, 64, &r);
	ck_assert_int_eq(r.status, 200);
	snprintf(etag2, sizeof etag2, "%s", th_header(&r, "ETag"));
	th_response_free(&r);
	th_expect_data(&D, "p", NULL, v3, 64);

	/* DELETE honours If-Match too */
	th_request(&D, "DELETE", "/v1/arrays/p", match, NULL, 0, &r);
	th_assert_error(&r, 400, "FAILED_PRECONDITION", NULL);
	th_response_free(&r);
	th_expect_data(&D, "p", NULL, v3, 64);
	snprintf(hdr, sizeof hdr, "If-Match: %s", etag2);
	match[0] = hdr;
	th_request(&D, "DELETE", "/v1/arrays/p", match, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "DELETE: %ld %s", r.status, r.body);
	th_response_free(&r);
	expect_absent(&D, "p");
	th_get(&D, "/v1/arrays/p/data", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	th_request(&D, "DELETE", "/v1/arrays/p", NULL, NULL, 0, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	wait_in_use(&D, "sim:0", "device", 0, 2000);
	/* a name that was deleted can be created again, with If-None-Match */
	put(&D, "p", "dtype=uint8&shape=64", create_only, v1, 64, &r);
	ck_assert_int_eq(r.status, 201);
	th_response_free(&r);
	th_expect_data(&D, "p", NULL, v1, 64);
	free(v1);
	free(v2);
	free(v3);
}
END_TEST

/* ==== the list =========================================================================================== */

/* The names of one page of GET path, "a,b,c", and its next_page_token
 * ("" when none). */
static void list_page(struct th_daemon *d, const char *path, char *names, size_t cap,
                      char *token, size_t tcap)
{
	struct th_response r;
	json_t *root = th_get_json(d, path, &r), *a, *next;
	size_t i, o = 0;

	names[0] = '\0';
	json_array_foreach(th_arr(root, "arrays"), i, a)
		o += (size_t)snprintf(names + o, cap - o, "%s%s", i ? "," : "", th_str(a, "name"));
	next = json_object_get(root, "next_page_token");
	ck_assert_msg(!next || json_is_string(next), "next_page_token is not a string");
	snprintf(token, tcap, "%s", next ? json_string_value(next) : "");
	th_response_free(&r);
}

START_TEST(test_list)
{
	static const struct {
		const char *name, *query;
	} arrays[] = {
		{"l3", "memory_kind=unpinned_host"}, {"l0", ""}, {"l4", "device=cpu:0"},
		{"l1", "device=sim:1"}, {"l2", "device=sim:1&memory_kind=pinned_host"},
	};
	static const struct {
		const char *filter, *pages[3];
	} cases[] = {
		{"", {"l0,l1", "l2,l3", "l4"}},
		{"&device=sim:1", {"l1,l2", "", NULL}},
		{"&memory_kind=pinned_host", {"l2", NULL, NULL}},
		{"&device=sim:0", {"l0,l3", "", NULL}},
		{"&device=sim:1&memory_kind=device", {"l1", NULL, NULL}},
		{"&memory_kind=device", {"l0,l1", "l4", NULL}},
		{"&device=sim:1&memory_kind=unpinned_host", {"", NULL, NULL}},
	};
	struct th_response r;
	char names[512], token[256], path[512];

	list_page(&D, "/v1/arrays", names, sizeof names, token, sizeof token);
	ck_assert_str_eq(names, "");
	ck_assert_str_eq(token, "");
	for (size_t i = 0; i < 5; i++) {
		char query[128];

		snprintf(query, sizeof query, "dtype=uint8&shape=4%s%s", *arrays[i].query ? "&" : "",
		         arrays[i].query);
		put_ok(&D, arrays[i].name, query, "abcd", 4, 201);
	}
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		token[0] = '\0';
		for (int p = 0; p < 3; p++) {
			if (!cases[c].pages[p])
				break;
			if (!*cases[c].pages[p] && p > 0)
				break;
			snprintf(path, sizeof path, "/v1/arrays?page_size=2%s%s%s", cases[c].filter,
			         token[0] ? "&page_token=" : "", token);
			list_page(&D, path, names, sizeof names, token, sizeof token);
			ck_assert_msg(strcmp(names, cases[c].pages[p]) == 0, "%s page %d: '%s', want '%s'",
			              path, p, names, cases[c].pages[p]);
			{
				bool last = p == 2 || !cases[c].pages[p + 1] || !*cases[c].pages[p + 1];

				ck_assert_msg(last == (token[0] == '\0'), "%s page %d: next_page_token '%s'",
				              path, p, token);
			}
		}
	}
	/* every entry is the full metadata */
	{
		json_t *root = th_get_json(&D, "/v1/arrays?page_size=1", &r), *a;

		a = json_array_get(th_arr(root, "arrays"), 0);
		ck_assert_str_eq(th_str(a, "name"), "l0");
		ck_assert_str_eq(th_str(a, "dtype"), "uint8");
		ck_assert_int_eq(th_int(a, "nbytes"), 4);
		th_str(a, "etag");
		th_int(a, "version");
		th_obj(a, "sharding");
		snprintf(token, sizeof token, "%s", th_str(root, "next_page_token"));
		th_response_free(&r);
	}
	{
		/* the token resumes after l0, and only for the listing it was made for */
		char *url = th_fmt("/v1/arrays?page_size=1&page_token=%s", token);
		json_t *root = th_get_json(&D, url, &r);

		ck_assert_str_eq(th_str(json_array_get(th_arr(root, "arrays"), 0), "name"), "l1");
		th_response_free(&r);
		free(url);
		url = th_fmt("/v1/arrays?memory_kind=device&page_token=%s", token);
		th_get(&D, url, &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_PAGE_TOKEN");
		th_response_free(&r);
		free(url);
		token[strlen(token) - 1] ^= 1;          /* one digit of the check changed */
		url = th_fmt("/v1/arrays?page_size=1&page_token=%s", token);
		th_get(&D, url, &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_PAGE_TOKEN");
		th_response_free(&r);
		free(url);
	}
	{
		static const char *const bad[][2] = {
			{"/v1/arrays?page_size=0", "BAD_PAGE_SIZE"},
			{"/v1/arrays?page_size=1001", "BAD_PAGE_SIZE"},
			{"/v1/arrays?page_size=abc", "BAD_PAGE_SIZE"},
			{"/v1/arrays?page_token=%21%21", "BAD_PAGE_TOKEN"},
			{"/v1/arrays?device=sim:5", "DEVICE_NOT_FOUND"},
			{"/v1/arrays?memory_kind=disk", "BAD_MEMORY_KIND"},
		};

		for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
			th_get(&D, bad[i][0], &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", bad[i][1]);
			th_response_free(&r);
		}
	}
	/* a deleted array leaves the list */
	th_request(&D, "DELETE", "/v1/arrays/l2", NULL, NULL, 0, &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	list_page(&D, "/v1/arrays", names, sizeof names, token, sizeof token);
	ck_assert_str_eq(names, "l0,l1,l3,l4");
}
END_TEST

/* ==== safetensors =========================================================================================== */

static json_t *find_named(json_t *list, const char *name)
{
	json_t *a;
	size_t i;

	json_array_foreach(list, i, a)
		if (strcmp(th_str(a, "name"), name) == 0)
			return a;
	ck_abort_msg("'%s' is not in the list", name);
	return NULL;
}

static void import_body(struct th_daemon *d, const char *query, const char *const *headers,
                        const void *body, size_t len, struct th_response *r)
{
	char path[512];

	snprintf(path, sizeof path, "/v1/arrays:import%s%s", query && *query ? "?" : "",
	         query ? B(query) : "");
	th_request(d, "POST", path, headers, body, len, r);
}

/* Checks an import's result ({"arrays": [...], "metadata": {...}}) and
 * each array's bytes against the manifest entry st (names prefixed). */
static void check_import_result(struct th_daemon *d, json_t *result, json_t *st,
                                const char *prefix, const char *dev, const char *kind)
{
	json_t *list = th_arr(result, "arrays"), *t, *meta = json_object_get(st, "metadata");
	size_t i;

	ck_assert_int_eq(json_array_size(list), json_array_size(th_arr(st, "tensors")));
	if (json_is_object(meta))
		ck_assert_msg(json_equal(json_object_get(result, "metadata"), meta),
		              "import metadata differs: %s", json_dumps(result, JSON_COMPACT));
	json_array_foreach(th_arr(st, "tensors"), i, t) {
		char name[256];
		size_t raw_len;
		char *raw = fixture_bytes(th_str(t, "raw"), &raw_len);
		json_t *a;

		snprintf(name, sizeof name, "%s%s", prefix, th_str(t, "name"));
		a = find_named(list, name);
		ck_assert_str_eq(th_str(a, "dtype"), th_str(t, "dtype"));
		ck_assert_msg(json_equal(th_arr(a, "shape"), th_arr(t, "shape")), "%s: shape", name);
		ck_assert_int_eq(th_int(a, "nbytes"), raw_len);
		ck_assert_str_eq(th_str(th_obj(a, "sharding"), "device"), B(dev));
		ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), kind);
		th_expect_data(d, name, NULL, raw, raw_len);
		free(raw);
	}
}

/* An import's answer: 201 with the result (a body import). */
static void check_imported(struct th_daemon *d, struct th_response *r, json_t *st,
                           const char *prefix, const char *dev, const char *kind)
{
	ck_assert_msg(r->status == 201, "import %s: %ld %s", th_str(st, "file"), r->status, r->body);
	check_import_result(d, th_json(r), st, prefix, dev, kind);
}

/* The tensors of manifest entry st as check_export.py "tensors", prefixed. */
static void add_expected_tensors(json_t *out, json_t *st, const char *prefix)
{
	json_t *t;
	size_t i;

	json_array_foreach(th_arr(st, "tensors"), i, t) {
		char name[256], raw[1024];

		snprintf(name, sizeof name, "%s%s", prefix, th_str(t, "name"));
		fixture_path(raw, sizeof raw, th_str(t, "raw"));
		json_array_append_new(out, json_pack("{s:s, s:s, s:O, s:s}", "name", name, "dtype",
		                                     th_str(t, "dtype"), "shape", th_arr(t, "shape"),
		                                     "raw", raw));
	}
}

/* ?names= of every tensor of st, prefixed, in reverse order. */
static void export_names(char *buf, size_t cap, json_t *st, const char *prefix, bool append)
{
	json_t *ts = th_arr(st, "tensors");
	size_t o = append ? strlen(buf) : 0;

	if (!append)
		buf[0] = '\0';
	for (size_t i = json_array_size(ts); i-- > 0;)
		o += (size_t)snprintf(buf + o, cap - o, "%s%s%s", o ? "," : "", prefix,
		                      th_str(json_array_get(ts, i), "name"));
}

/* The reference package's files imported into host and device memory,
 * exported again, and read back by the reference package: every tensor
 * identical, __metadata__ kept. */
START_TEST(test_safetensors_roundtrip)
{
	static const struct {
		const char *prefix_fmt, *placement, *dev, *kind;
	} pl[] = {
		{"h%zu_", "memory_kind=pinned_host", "sim:0", "pinned_host"},
		{"d%zu_", "device=sim:1", "sim:1", "device"},
		{"c%zu_", "device=cpu:0", "cpu:0", "device"},
	};
	json_t *m = manifest(), *st, *mixed_tensors = json_array();
	char names[4096], mixed[8192] = "";
	struct pycheck pc;
	size_t i;

	pyc_init(&pc);
	json_array_foreach(th_arr(m, "safetensors"), i, st) {
		char ref[1024];
		size_t len;
		char *body = fixture_bytes(th_str(st, "file"), &len);

		fixture_path(ref, sizeof ref, th_str(st, "file"));
		for (size_t p = 0; p < 3; p++) {
			struct th_response r;
			char prefix[32], query[200], path[4200];
			json_t *check, *tensors = json_array();

			snprintf(prefix, sizeof prefix, pl[p].prefix_fmt, i);
			snprintf(query, sizeof query, "prefix=%s&%s", prefix, pl[p].placement);
			import_body(&D, query, NULL, body, len, &r);
			check_imported(&D, &r, st, prefix, pl[p].dev, pl[p].kind);
			th_response_free(&r);

			export_names(names, sizeof names, st, prefix, false);
			snprintf(path, sizeof path, "/v1/arrays:export?names=%s", names);
			th_get(&D, path, &r);
			ck_assert_msg(r.status == 200, "export: %ld %s", r.status, r.body);
			ck_assert_str_eq(th_header(&r, "Content-Type"), "application/octet-stream");
			add_expected_tensors(tensors, st, prefix);
			check = json_pack("{s:s, s:o, s:o, s:s, s:s, s:O}", "kind", "safetensors",
			                  "file", pyc_file(&pc, "safetensors", r.body, r.body_len),
			                  "tensors", tensors, "reference", ref, "prefix", prefix,
			                  "metadata", json_object_get(st, "metadata"));
			json_array_append_new(pc.checks, check);

			/* our own file imports again, to the same bytes */
			{
				struct th_response r2;
				char again[64];

				snprintf(again, sizeof again, "prefix=r_&%s", pl[p].placement);
				import_body(&D, again, NULL, r.body, r.body_len, &r2);
				snprintf(again, sizeof again, "r_%s", prefix);
				check_imported(&D, &r2, st, again, pl[p].dev, pl[p].kind);
				th_response_free(&r2);
			}
			th_response_free(&r);
			if (i == 0) {
				export_names(mixed, sizeof mixed, st, prefix, true);
				add_expected_tensors(mixed_tensors, st, prefix);
			}
		}
		free(body);
	}
	/* one file from host and device arrays at once */
	{
		struct th_response r;
		char path[8300];

		snprintf(path, sizeof path, "/v1/arrays:export?names=%s", mixed);
		th_get(&D, path, &r);
		ck_assert_msg(r.status == 200, "mixed export: %ld %s", r.status, r.body);
		json_array_append_new(pc.checks,
		                      json_pack("{s:s, s:o, s:o, s:O}", "kind", "safetensors", "file",
		                                pyc_file(&pc, "safetensors", r.body, r.body_len),
		                                "tensors", mixed_tensors, "metadata",
		                                json_object_get(json_array_get(th_arr(m, "safetensors"), 0),
		                                                "metadata")));
		th_response_free(&r);
	}
	json_decref(m);
	pyc_run(&pc);
}
END_TEST

START_TEST(test_export_errors)
{
	struct th_response r;

	put_ok(&D, "a", "dtype=uint8&shape=2", "ab", 2, 201);
	th_get(&D, "/v1/arrays:export?names=a,missing", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	ck_assert_ptr_nonnull(strstr(r.body, "missing"));
	th_response_free(&r);
	th_get(&D, "/v1/arrays:export", &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	th_get(&D, "/v1/arrays:export?names=", &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	th_get(&D, "/v1/arrays:export?names=a,-bad", &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_ARRAY_NAME");
	th_response_free(&r);
	th_get(&D, "/v1/arrays:export?names=a,a", &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
}
END_TEST

/* overwrite=false over an existing name: 409 and nothing imported. */
START_TEST(test_import_no_overwrite)
{
	json_t *m = manifest(), *st = NULL, *e;
	int8_t mine[2] = {9, 9};
	struct th_response r;
	size_t i, len;
	char *body, *before;

	json_array_foreach(th_arr(m, "safetensors"), i, e)
		if (strstr(th_str(e, "file"), "clash"))
			st = e;
	ck_assert_ptr_nonnull(st);
	body = fixture_bytes(th_str(st, "file"), &len);
	put_ok(&D, "taken", "dtype=int8&shape=2&memory_kind=unpinned_host", mine, 2, 201);
	before = all_in_use(&D);

	import_body(&D, "overwrite=false", NULL, body, len, &r);
	th_assert_error(&r, 409, "ALREADY_EXISTS", NULL);
	ck_assert_ptr_nonnull(strstr(r.body, "taken"));
	th_response_free(&r);
	expect_absent(&D, "fresh");
	th_expect_data(&D, "taken", NULL, mine, 2);
	ck_assert_int_eq(version_of(&D, "taken"), 1);
	wait_all_in_use(&D, before, 2000);

	import_body(&D, "overwrite=false&prefix=new_", NULL, body, len, &r);
	check_imported(&D, &r, st, "new_", "sim:0", "device");
	th_response_free(&r);
	import_body(&D, "", NULL, body, len, &r);     /* overwrite is the default */
	check_imported(&D, &r, st, "", "sim:0", "device");
	th_response_free(&r);
	ck_assert_int_eq(version_of(&D, "taken"), 2);
	free(before);
	free(body);
	json_decref(m);
}
END_TEST

/* A safetensors body of header text and data bytes (new buffer). */
static char *st_body(const char *header, const void *data, size_t data_len, size_t *len)
{
	size_t h = strlen(header), padded = (h + 7) / 8 * 8;
	char *b = malloc(8 + padded + data_len + 1);

	ck_assert_ptr_nonnull(b);
	for (int i = 0; i < 8; i++)
		b[i] = (char)((uint64_t)padded >> (8 * i));
	memcpy(b + 8, header, h);
	memset(b + 8 + h, ' ', padded - h);
	memcpy(b + 8 + padded, data, data_len);
	*len = 8 + padded + data_len;
	return b;
}

START_TEST(test_import_malformed)
{
	static const char *const chunked[] = {"Transfer-Encoding: chunked", NULL};
	static const char *const headers[] = {
		"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
		"{\"a\": {\"dtype\": \"X99\", \"shape\": [1], \"data_offsets\": [0, 8]}}",
		"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
		"{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}",
		"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
		" \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
		"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"a\": {}}",
		"{\"__metadata__\": {\"k\": 5}, \"a\": {\"dtype\": \"U8\", \"shape\": [8], "
		"\"data_offsets\": [0, 8]}}",
		"[1, 2, 3]",
		"{not json",
	};
	char data[8] = "01234567", *before, *b, *good;
	struct th_response r;
	size_t len, good_len;

	need_fixtures();
	good = fixture_bytes("st/small.safetensors", &good_len);
	before = all_in_use(&D);
	for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
		b = st_body(headers[i], data, 8, &len);
		import_body(&D, NULL, NULL, b, len, &r);
		ck_assert_msg(r.status == 400, "header %s: %ld %s", headers[i], r.status, r.body);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
		th_response_free(&r);
		free(b);
	}
	/* a header length past the body; 8-byte bodies; fewer than 8 bytes */
	b = st_body("{}", "", 0, &len);
	b[5] = 1;
	import_body(&D, NULL, NULL, b, len, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	free(b);
	import_body(&D, NULL, NULL, "\x02\0\0\0\0\0\0\0", 8, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	import_body(&D, NULL, NULL, "abc", 3, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	import_body(&D, NULL, NULL, "", 0, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	/* a real file cut short, sized and chunked; a real file with a byte too many */
	import_body(&D, NULL, NULL, good, good_len - 5, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	import_body(&D, NULL, chunked, good, good_len - 5, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	import_body(&D, NULL, chunked, good, 20, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	b = malloc(good_len + 1);
	ck_assert_ptr_nonnull(b);
	memcpy(b, good, good_len);
	b[good_len] = 0;
	import_body(&D, NULL, NULL, b, good_len + 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	import_body(&D, NULL, chunked, b, good_len + 1, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	free(b);
	/* a bad placement or prefix is refused up front */
	import_body(&D, "device=sim:8", NULL, good, good_len, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "DEVICE_NOT_FOUND");
	th_response_free(&r);
	import_body(&D, "prefix=-", NULL, good, good_len, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_ARRAY_NAME");
	th_response_free(&r);

	{
		char names[64], token[64];

		list_page(&D, "/v1/arrays", names, sizeof names, token, sizeof token);
		ck_assert_msg(names[0] == '\0', "a failed import left arrays: %s", names);
	}
	wait_all_in_use(&D, before, 2000);
	free(before);
	free(good);
}
END_TEST

/* All or nothing under admission: the second tensor does not fit, so the
 * import is refused right after the header, before any data, and nothing
 * stays allocated. */
START_TEST(test_import_admission)
{
	static const char header[] =
		"{\"w1\": {\"dtype\": \"U8\", \"shape\": [41943040], \"data_offsets\": [0, 41943040]},"
		" \"w2\": {\"dtype\": \"U8\", \"shape\": [41943040], \"data_offsets\": [41943040, "
		"83886080]}}";
	struct th_response r;
	char *b, *before, *body;
	size_t len;

	before = all_in_use(&D);
	b = st_body(header, "", 0, &len);
	body = calloc(1, len + 80 * MiB);
	ck_assert_ptr_nonnull(body);
	memcpy(body, b, len);
	/* tstaged knows after the header; the rest of the body is drained
	 * (STYLE.md: keep draining, answer on the last call) */
	import_body(&D, NULL, NULL, body, len + 80 * MiB, &r);
	th_assert_error(&r, 429, "RESOURCE_EXHAUSTED", NULL);
	check_oom_details(th_json(&r), "sim:0", 40 * MiB, 24 * MiB, TH_SIM_MEMORY);
	th_response_free(&r);
	expect_absent(&D, "w1");
	expect_absent(&D, "w2");
	wait_all_in_use(&D, before, 5000);
	free(before);
	free(body);
	free(b);
}
END_TEST

/* POST :import?query of {"path": path}: a server-side import. */
static void import_path(struct th_daemon *d, const char *query, const char *path,
                        struct th_response *r)
{
	static const char *const json_h[] = {"Content-Type: application/json", NULL};
	json_t *j = json_pack("{s:s}", "path", path);
	char *text = json_dumps(j, JSON_COMPACT);

	import_body(d, query, json_h, text, strlen(text), r);
	free(text);
	json_decref(j);
}

/* Polls the operation at location until it is done (5 s at most); its
 * final JSON (new reference). */
static json_t *wait_operation(struct th_daemon *d, const char *location)
{
	long long deadline = th_now_ms() + 5000;
	json_t *op;

	for (;;) {
		op = th_get_object(d, location);
		if (th_bool(op, "done") || th_now_ms() > deadline)
			break;
		json_decref(op);
		usleep(10000);
	}
	ck_assert_msg(th_bool(op, "done"), "operation %s not done after 5 s", location);
	return op;
}

/* {"path": ...} reads a file on the server, only from below --data-dir, by
 * an operation: 202 and the operation, or with ?wait=true its result; a
 * path outside the data dir is refused before any operation starts. */
START_TEST(test_import_server_side)
{
	static const char *const json_h[] = {"Content-Type: application/json", NULL};
	static const char *const waits = "memory_kind=unpinned_host&wait=true";
	json_t *m = manifest(), *small = NULL, *e, *op;
	char dir[512], sibling[600], file[700], path[800], location[256];
	const char *args[] = {"--data-dir", dir, NULL};
	struct th_daemon d;
	struct th_response r;
	size_t i, len;
	char *body;

	json_array_foreach(th_arr(m, "safetensors"), i, e)
		if (strstr(th_str(e, "file"), "small"))
			small = e;
	ck_assert_ptr_nonnull(small);
	body = fixture_bytes(th_str(small, "file"), &len);
	th_temp_dir("data", dir, sizeof dir);
	snprintf(file, sizeof file, "%s/small.safetensors", dir);
	th_write_file(file, body, len);
	snprintf(path, sizeof path, "%s/trunc.safetensors", dir);
	th_write_file(path, body, len - 3);
	snprintf(path, sizeof path, "%s/sub", dir);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	snprintf(path, sizeof path, "%s/evil", dir);
	ck_assert_int_eq(symlink("/etc/passwd", path), 0);
	snprintf(sibling, sizeof sibling, "%s-x", dir);   /* shares the data dir's prefix */
	ck_assert_int_eq(mkdir(sibling, 0700), 0);
	snprintf(path, sizeof path, "%s/small.safetensors", sibling);
	th_write_file(path, body, len);

	/* the fixture's daemon has no --data-dir */
	import_path(&D, waits, file, &r);
	th_assert_error(&r, 403, "PERMISSION_DENIED", NULL);
	th_response_free(&r);

	start_sim(&d, args);
	import_path(&d, waits, file, &r);
	ck_assert_msg(r.status == 200, "import ?wait=true: %ld %s", r.status, r.body);
	check_import_result(&d, th_json(&r), small, "", "sim:0", "unpinned_host");
	th_response_free(&r);

	/* without wait: 202, an operation that ends with the same result */
	snprintf(path, sizeof path, "%s/sub/../small.safetensors", dir);
	import_path(&d, "prefix=again_&device=sim:1", path, &r);
	ck_assert_msg(r.status == 202, "import: %ld %s", r.status, r.body);
	ck_assert_str_eq(json_string_value(th_op_meta(th_json(&r), "kind")), "import");
	ck_assert_ptr_nonnull(th_header(&r, "Location"));
	snprintf(location, sizeof location, "%s", th_header(&r, "Location"));
	th_response_free(&r);
	op = wait_operation(&d, location);
	ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "state")), "SUCCEEDED") == 0, "operation: %s",
	              json_dumps(op, JSON_COMPACT));
	ck_assert_int_eq(th_int(th_op_meta(op, "progress"), "bytes_done"), len);
	check_import_result(&d, th_op_result(op), small, "again_", "sim:1", "device");
	json_decref(op);

	/* a malformed file fails its operation, and imports nothing */
	snprintf(path, sizeof path, "%s/trunc.safetensors", dir);
	import_path(&d, "prefix=t_&wait=true", path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
	expect_absent(&d, "t_a");

	/* what is not below the data dir is refused at once */
	{
		static const char *const queries[] = {"wait=true", ""};

		for (size_t q = 0; q < 2; q++) {
			import_path(&d, queries[q], "/etc/passwd", &r);
			th_assert_error(&r, 403, "PERMISSION_DENIED", NULL);
			th_response_free(&r);
			snprintf(path, sizeof path, "%s/../../../../../../etc/passwd", dir);
			import_path(&d, queries[q], path, &r);
			th_assert_error(&r, 403, "PERMISSION_DENIED", NULL);
			th_response_free(&r);
			snprintf(path, sizeof path, "%s/evil", dir);    /* a link out of it */
			import_path(&d, queries[q], path, &r);
			th_assert_error(&r, 403, "PERMISSION_DENIED", NULL);
			th_response_free(&r);
			snprintf(path, sizeof path, "%s/small.safetensors", sibling);
			import_path(&d, queries[q], path, &r);
			th_assert_error(&r, 403, "PERMISSION_DENIED", NULL);
			th_response_free(&r);
			snprintf(path, sizeof path, "%s/missing.safetensors", dir);
			import_path(&d, queries[q], path, &r);
			th_assert_error(&r, 404, "NOT_FOUND", NULL);
			th_response_free(&r);
			import_path(&d, queries[q], dir, &r);         /* a directory */
			ck_assert_msg(r.status == 400 || r.status == 403, "a directory: %ld %s", r.status,
			              r.body);
			th_assert_error(&r, r.status,
			                r.status == 400 ? "INVALID_ARGUMENT" : "PERMISSION_DENIED", NULL);
			th_response_free(&r);
		}
	}
	import_body(&d, NULL, json_h, "{\"path\": 5}", 11, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY");
	th_response_free(&r);
	import_body(&d, NULL, json_h, "{\"path\": \"x\", \"more\": 1}", 24, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY");
	th_response_free(&r);
	import_body(&d, NULL, json_h, "{\"path\":", 8, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY");
	th_response_free(&r);
	{
		/* only the two good imports hold memory */
		char names[256], token[64];

		list_page(&d, "/v1/arrays", names, sizeof names, token, sizeof token);
		ck_assert_str_eq(names, "a,again_a,again_b,b");
	}
	th_daemon_stop_ok(&d);
	free(body);
	json_decref(m);
}
END_TEST

/* ==== streaming and concurrency ============================================================================ */

/* A delete while a large download streams: the download still delivers
 * every byte of the version it started with; the bytes go back to the
 * space only when it is done. */
START_TEST(test_delete_while_downloading)
{
	static const struct {
		const char *query, *dev, *kind;
		size_t len;
	} pl[] = {
		{"", "sim:0", "device", 48 * MiB},
		{"memory_kind=unpinned_host", "sim:0", "unpinned_host", 96 * MiB},
		{"device=sim:1&memory_kind=pinned_host", "sim:1", "pinned_host", 64 * MiB},
	};

	for (size_t p = 0; p < 3; p++) {
		char name[16], query[160], req[256], *want = th_pattern(pl[p].len, 40 + p), *got;
		struct raw_head *h = malloc(sizeof *h);
		struct th_response r;
		size_t have;
		int fd;

		ck_assert_ptr_nonnull(h);
		snprintf(name, sizeof name, "big%zu", p);
		snprintf(query, sizeof query, "dtype=uint8&shape=%zu%s%s", pl[p].len,
		         *pl[p].query ? "&" : "", pl[p].query);
		put_ok(&D, name, query, want, pl[p].len, 201);

		fd = th_raw_connect(&D);
		snprintf(req, sizeof req, "GET /v1/arrays/%s/data HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		         name);
		th_raw_send(fd, req);
		raw_read_head(fd, h, 5000);
		ck_assert_int_eq(h->status, 200);
		ck_assert_int_eq(h->length, pl[p].len);
		got = malloc(pl[p].len);
		ck_assert_ptr_nonnull(got);
		have = h->got - h->head_len;
		memcpy(got, h->buf + h->head_len, have);

		/* the array goes while its bytes are on the way */
		snprintf(req, sizeof req, "/v1/arrays/%s", name);
		th_request(&D, "DELETE", req, NULL, NULL, 0, &r);
		ck_assert_msg(r.status == 200, "DELETE during a download: %ld %s", r.status, r.body);
		th_response_free(&r);
		expect_absent(&D, name);
		ck_assert_msg(have < pl[p].len / 2, "%zu of %zu bytes came before the DELETE", have,
		              pl[p].len);
		/* the response still holds the version it reads */
		ck_assert_int_eq(in_use(&D, pl[p].dev, pl[p].kind), pl[p].len);

		while (have < pl[p].len) {
			ssize_t n = recv_some(fd, got + have, pl[p].len - have, 10000);

			ck_assert_msg(n > 0, "the download stopped after %zu of %zu bytes", have,
			              pl[p].len);
			have += (size_t)n;
		}
		th_assert_bytes(name, got, have, want, pl[p].len);
		close(fd);
		wait_in_use(&D, pl[p].dev, pl[p].kind, 0, 5000);
		free(got);
		free(h);
		free(want);
	}
}
END_TEST

/* Several clients upload, replace, download and delete the same few names
 * at once. Every download is one whole version (its bytes say which); once
 * they stop, each space holds exactly the bytes of the arrays listed in it. */

#define CONC_THREADS 4
#define CONC_MS 2000

struct worker {
	pthread_t tid;
	int port;
	uint64_t seed;
	long long until_ms;
	unsigned long ops, bad;
	char first_bad[512];
	CURL *curl;
	char *body;                  /* the last response's body */
	size_t len, cap;
	char curl_err[CURL_ERROR_SIZE];
};

static size_t worker_body(char *p, size_t size, size_t nmemb, void *ud)
{
	struct worker *w = ud;
	size_t n = size * nmemb;

	if (w->len + n > w->cap) {
		size_t cap = (w->len + n) * 2;
		char *grown = realloc(w->body, cap);

		if (!grown)
			return 0;
		w->body = grown;
		w->cap = cap;
	}
	memcpy(w->body + w->len, p, n);
	w->len += n;
	return n;
}

/* One request on the worker's own connection: the status, or 0 when the
 * transfer failed. */
static long worker_request(struct worker *w, const char *method, const char *path,
                           const char *const *headers, const void *body, size_t len)
{
	struct curl_slist *hl = NULL;
	char url[512];
	long status = 0;

	for (const char *const *h = headers; h && *h; h++)
		hl = curl_slist_append(hl, *h);
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", w->port, path);
	w->len = 0;
	curl_easy_reset(w->curl);
	curl_easy_setopt(w->curl, CURLOPT_URL, url);
	curl_easy_setopt(w->curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(w->curl, CURLOPT_TIMEOUT_MS, 30000L);
	curl_easy_setopt(w->curl, CURLOPT_WRITEFUNCTION, worker_body);
	curl_easy_setopt(w->curl, CURLOPT_WRITEDATA, w);
	curl_easy_setopt(w->curl, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(w->curl, CURLOPT_ERRORBUFFER, w->curl_err);
	w->curl_err[0] = '\0';
	if (hl)
		curl_easy_setopt(w->curl, CURLOPT_HTTPHEADER, hl);
	if (body) {
		curl_easy_setopt(w->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
		curl_easy_setopt(w->curl, CURLOPT_POSTFIELDS, body);
	}
	if (curl_easy_perform(w->curl) == CURLE_OK) {
		curl_easy_getinfo(w->curl, CURLINFO_RESPONSE_CODE, &status);
	} else {
		long fresh = -1;
		double secs = -1;

		/* a transport error: say enough to tell a dead reused connection
		 * from a refused body */
		curl_easy_getinfo(w->curl, CURLINFO_NUM_CONNECTS, &fresh);
		curl_easy_getinfo(w->curl, CURLINFO_TOTAL_TIME, &secs);
		snprintf(w->curl_err + strlen(w->curl_err), sizeof w->curl_err - strlen(w->curl_err),
		         " (%s connection, %.3f s%s)", fresh > 0 ? "new" : "reused", secs,
		         headers ? ", conditional" : "");
	}
	curl_slist_free_all(hl);
	return status;
}

static void worker_bad(struct worker *w, const char *what, const char *path, long status)
{
	w->bad++;
	if (!w->first_bad[0])
		snprintf(w->first_bad, sizeof w->first_bad, "%s %s: %ld %.200s", what, path, status,
		         status == 200 ? "(body)" : status == 0 ? w->curl_err : (w->len ? w->body : ""));
}

/* Bytes whose first 16 say their seed and length, so that any download can
 * be checked on its own. */
static void conc_fill(unsigned char *p, size_t n, uint64_t seed)
{
	uint64_t len = n;

	th_fill(p, n, seed);
	memcpy(p, &seed, 8);
	memcpy(p + 8, &len, 8);
}

static bool conc_valid(const unsigned char *p, size_t n)
{
	uint64_t seed, len;
	unsigned char *want;
	bool ok;

	if (n < 16)
		return false;
	memcpy(&seed, p, 8);
	memcpy(&len, p + 8, 8);
	if (len != n || !(want = malloc(n)))
		return false;
	conc_fill(want, n, seed);
	ok = memcmp(want, p, n) == 0;
	free(want);
	return ok;
}

static void *worker_main(void *arg)
{
	static const char *const names[] = {"k0", "k1", "k2"};
	static const char *const places[] = {
		"", "&device=sim:1", "&memory_kind=pinned_host", "&memory_kind=unpinned_host",
		"&device=cpu:0", "&device=sim:1&memory_kind=pinned_host",
	};
	static const char *const conditional[] = {"If-None-Match: *", "Expect: 100-continue", NULL};
	struct worker *w = arg;

	while (th_now_ms() < w->until_ms) {
		uint64_t r = th_rand(&w->seed);
		const char *name = names[r % 3];
		unsigned op = (unsigned)((r >> 8) % 100);
		char path[256];
		long st;

		w->ops++;
		if (op < 40) {
			size_t n = 16 + (size_t)((r >> 16) % (256 * KiB));
			bool create_only = op >= 35;
			unsigned char *data = malloc(n);

			if (!data) {
				worker_bad(w, "malloc", "", 0);
				continue;
			}
			conc_fill(data, n, r);
			snprintf(path, sizeof path, "/v1/arrays/%s?dtype=uint8&shape=%zu%s", name, n,
			         places[(r >> 40) % (sizeof places / sizeof places[0])]);
			/* a conditional upload asks before it sends its body: refused
			 * (409), it is never sent (without Expect, a refusal answered
			 * while curl still writes the body can reach it as "Send
			 * failure: Broken pipe" instead of the 409) */
			st = worker_request(w, "PUT", path, create_only ? conditional : NULL, data, n);
			if (!(st == 201 || st == 200 || (create_only && st == 409)) ||
			    (create_only && st == 200))
				worker_bad(w, "PUT", path, st);
			free(data);
		} else if (op < 75) {
			snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
			st = worker_request(w, "GET", path, NULL, NULL, 0);
			if (st == 200 ? !conc_valid((unsigned char *)w->body, w->len) : st != 404)
				worker_bad(w, "GET", path, st);
		} else if (op < 85) {
			snprintf(path, sizeof path, "/v1/arrays/%s", name);
			st = worker_request(w, "GET", path, NULL, NULL, 0);
			if (st != 200 && st != 404)
				worker_bad(w, "GET", path, st);
		} else {
			snprintf(path, sizeof path, "/v1/arrays/%s", name);
			st = worker_request(w, "DELETE", path, NULL, NULL, 0);
			if (st != 200 && st != 404)
				worker_bad(w, "DELETE", path, st);
		}
	}
	return NULL;
}

START_TEST(test_concurrent_clients)
{
	struct worker w[CONC_THREADS];
	unsigned long ops = 0, bad = 0;
	long long deadline;
	char why[2048];
	const char *first = "";

	memset(w, 0, sizeof w);
	for (int i = 0; i < CONC_THREADS; i++) {
		w[i].port = D.port;
		w[i].seed = 0x1234567ull * (uint64_t)(i + 1);
		w[i].until_ms = th_now_ms() + CONC_MS;
		w[i].curl = curl_easy_init();
		ck_assert_ptr_nonnull(w[i].curl);
		ck_assert_int_eq(pthread_create(&w[i].tid, NULL, worker_main, &w[i]), 0);
	}
	for (int i = 0; i < CONC_THREADS; i++) {
		pthread_join(w[i].tid, NULL);
		curl_easy_cleanup(w[i].curl);
		free(w[i].body);
		ops += w[i].ops;
		bad += w[i].bad;
		if (!*first && w[i].first_bad[0])
			first = w[i].first_bad;
	}
	if (bad) {
		char *log = th_daemon_stderr(&D);
		size_t n = strlen(log);

		ck_abort_msg("%lu of %lu requests went wrong; first: %s\ntstaged said:\n%s", bad, ops,
		             first, log + (n > 3000 ? n - 3000 : 0));
	}
	ck_assert_msg(ops >= 100, "only %lu requests in %d ms", ops, CONC_MS);

	deadline = th_now_ms() + 3000;
	while (!th_spaces_match_shards(&D, why, sizeof why) && th_now_ms() < deadline)
		usleep(20000);
	ck_assert_msg(th_spaces_match_shards(&D, why, sizeof why), "after %lu requests: %s", ops, why);
}
END_TEST

/* ==== the suite =============================================================================================== */

/* Seconds a case may take: the slowest moves a few hundred MiB, which a
 * sanitizer build on a busy 2-core machine does in well under a minute. */
#define CASE_TIMEOUT_S 120

/* Runs make_fixtures.py once, into the runner's temporary root. */
static void make_fixtures(void)
{
	char cmd[1400];
	int st;

	if (!th_root()[0])
		return;
	snprintf(fixture_dir, sizeof fixture_dir, "%s/fixtures", th_root());
	if (mkdir(fixture_dir, 0700) != 0) {
		fprintf(stderr, "it_arrays: mkdir %s: %s\n", fixture_dir, strerror(errno));
		return;
	}
	snprintf(cmd, sizeof cmd, "python3 '%s/make_fixtures.py' '%s'", th_py_dir(), fixture_dir);
	st = system(cmd);
	fixtures_ok = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (!fixtures_ok)
		fprintf(stderr, "it_arrays: '%s' failed (status %d): the cases that need fixtures "
		        "will fail\n", cmd, st);
}

Suite *th_suite(void)
{
	Suite *s = suite_create("arrays");
	TCase *tc;

	make_fixtures();
	tc = tcase_create("data");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_raw_roundtrip_every_dtype);
	tcase_add_test(tc, test_raw_scalar_and_empty);
	tcase_add_test(tc, test_npy_fixtures);
	tcase_add_test(tc, test_npy_refused);
	tcase_add_test(tc, test_placements);
	tcase_add_test(tc, test_metadata);
	suite_add_tcase(s, tc);

	tc = tcase_create("index");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_index_host);
	tcase_add_test(tc, test_index_pinned);
	tcase_add_test(tc, test_index_device);
	tcase_add_test(tc, test_index_scalar_parent);
	tcase_add_test(tc, test_gather);
	tcase_add_test(tc, test_gather_errors);
	suite_add_tcase(s, tc);

	tc = tcase_create("uploads");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_admission_before_body);
	tcase_add_test(tc, test_wrong_byte_count);
	tcase_add_test(tc, test_cut_off_body);
	tcase_add_test(tc, test_preconditions_and_delete);
	tcase_add_test(tc, test_list);
	suite_add_tcase(s, tc);

	tc = tcase_create("safetensors");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_safetensors_roundtrip);
	tcase_add_test(tc, test_export_errors);
	tcase_add_test(tc, test_import_no_overwrite);
	tcase_add_test(tc, test_import_malformed);
	tcase_add_test(tc, test_import_admission);
	tcase_add_test(tc, test_import_server_side);
	suite_add_tcase(s, tc);

	tc = tcase_create("concurrency");
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, CASE_TIMEOUT_S);
	tcase_add_test(tc, test_delete_while_downloading);
	tcase_add_test(tc, test_concurrent_clients);
	suite_add_tcase(s, tc);

	/* (th_backend asserts: not callable outside a case) */
	if (getenv("TS_TEST_BACKEND") && strcmp(getenv("TS_TEST_BACKEND"), "sim") != 0) {
		/* the same bytes through GPU memory: every case that does not
		 * count on the 64 MiB sim limit */
		tc = tcase_create("on_backend");
		tcase_add_checked_fixture(tc, daemon_up_backend, daemon_down);
		tcase_set_timeout(tc, CASE_TIMEOUT_S);
		tcase_add_test(tc, test_raw_roundtrip_every_dtype);
		tcase_add_test(tc, test_raw_scalar_and_empty);
		tcase_add_test(tc, test_npy_fixtures);
		tcase_add_test(tc, test_placements);
		tcase_add_test(tc, test_index_host);
		tcase_add_test(tc, test_index_pinned);
		tcase_add_test(tc, test_index_device);
		tcase_add_test(tc, test_gather);
		tcase_add_test(tc, test_safetensors_roundtrip);
		suite_add_tcase(s, tc);
	}
	return s;
}
