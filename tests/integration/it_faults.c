/*
 * it_faults.c - Check suite "faults": the fault-injection walk, against a
 * tstaged built with FAULT=1 (make faults).
 *
 * For each workflow (raw uploads to a device and to a mesh, a .npy upload,
 * safetensors import from the body and from a server-side path, :put
 * between kinds and devices and onto a mesh, :copy,
 * :gather, model create, :step with the parameters on the device and
 * offloaded), the walk first runs it once with the failure points only
 * counted, to learn how many points of each kind (device, pinned, pageable,
 * heap allocation, copy) it passes; then, for each kind and each of its
 * points N, it fails the N-th one and runs the workflow again. Every run
 * must answer a clean google.rpc.Status error (RESOURCE_EXHAUSTED for an
 * allocation, INTERNAL or UNAVAILABLE for a copy) or succeed with correct
 * data; the server stays alive; every space's bytes_in_use and live
 * allocations come back to what they were before the run (nothing leaks);
 * bytes_in_use equals the sum of the shards the array list places in each
 * space; and the previous data of the target downloads byte-identical.
 *
 * Points above WALK_ALL (400) of a kind are sampled (the first and last few and
 * evenly between); FAULT_WALK_ALL=1 walks every one.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WALK_ALL 400        /* points of a kind walked whole; above, sampled */
#define WALK_SAMPLE 24

static struct th_daemon D;
static char data_dir[512];

static const char *const kinds[] = {"alloc_device", "alloc_pinned", "alloc_pageable",
                                    "alloc_heap", "copy"};
#define NKINDS 5

/* Points walked across every case (printed by each forked case). */
static long walked;



static const char *const json_h[] = {"Content-Type: application/json", NULL};
static const char *const npy_h[] = {"Content-Type: application/x-npy", NULL};

/* ---- requests ---------------------------------------------------------------------- */

static void fault_arm(const char *kind, long at)
{
	struct th_response r;
	char body[96];

	snprintf(body, sizeof body, "{\"kind\": \"%s\", \"at\": %ld}", kind, at);
	th_request(&D, "POST", "/debug/faults", json_h, body, strlen(body), &r);
	ck_assert_msg(r.status == 200, "POST /debug/faults: %ld %s (is $TSTAGED a FAULT=1 build?)",
	              r.status, r.body);
	th_response_free(&r);
}

/* The points of each kind counted since the last arm, and the failures. */
static long fault_counts(long *counts)
{
	struct th_response r;
	json_t *j = th_get_json(&D, "/debug/faults", &r), *c = th_obj(j, "counts");
	long fired = (long)th_int(j, "fired");

	for (int k = 0; k < NKINDS; k++)
		counts[k] = (long)th_int(c, kinds[k]);
	th_response_free(&r);
	return fired;
}

/* A finished answer: a 202 operation is waited for and becomes the status
 * and body of its outcome (the error's code, or 200 with the response). */
static void settle(struct th_response *r)
{
	json_t *op;
	char path[300];
	long long deadline = th_now_ms() + 20000;

	if (r->status != 202)
		return;
	op = json_loadb(r->body, r->body_len, 0, NULL);
	ck_assert_msg(op && json_is_string(json_object_get(op, "name")), "202 without an operation: %s",
	              r->body);
	snprintf(path, sizeof path, "/v1/%s", json_string_value(json_object_get(op, "name")));
	json_decref(op);
	for (;;) {
		th_response_free(r);
		th_get(&D, path, r);
		ck_assert_msg(r->status == 200, "GET %s: %ld %s", path, r->status, r->body);
		op = th_json(r);
		if (json_is_true(json_object_get(op, "done")))
			break;
		ck_assert_msg(th_now_ms() < deadline, "operation %s not done after 20 s", path);
		usleep(5000);
	}
	if (json_object_get(op, "error")) {
		json_t *e = json_pack("{s:O}", "error", json_object_get(op, "error"));
		char *text = json_dumps(e, JSON_COMPACT);

		r->status = (long)json_integer_value(json_object_get(json_object_get(op, "error"), "code"));
		free(r->body);
		r->body = text;
		r->body_len = strlen(text);
		json_decref(e);
	} else {
		char *text = json_dumps(json_object_get(op, "response"), JSON_COMPACT);

		r->status = 200;
		free(r->body);
		r->body = text ? text : strdup("{}");
		r->body_len = strlen(r->body);
	}
	json_decref(r->json);
	r->json = NULL;
}

static void req(const char *method, const char *path, const char *const *h, const void *body,
                size_t len, struct th_response *r)
{
	th_request(&D, method, path, h, body, len, r);
	settle(r);
}

static void must(const char *method, const char *path, const char *const *h, const void *body,
                 size_t len)
{
	struct th_response r;

	req(method, path, h, body, len, &r);
	ck_assert_msg(r.status >= 200 && r.status < 300, "%s %s: %ld %s", method, path, r.status,
	              r.body);
	th_response_free(&r);
}

static void post_json(const char *path, const char *body)
{
	must("POST", path, json_h, body, strlen(body));
}

static void delete_name(const char *what, const char *name)
{
	struct th_response r;
	char path[300];

	snprintf(path, sizeof path, "/v1/%s/%s", what, name);
	th_request(&D, "DELETE", path, NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200 || r.status == 204 || r.status == 404, "DELETE %s: %ld %s", path,
	              r.status, r.body);
	th_response_free(&r);
}

/* The data of an array, or NULL when it does not exist (new buffer). */
static char *data_of(const char *name, size_t *len)
{
	struct th_response r;
	char path[300], *out = NULL;

	snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
	th_get(&D, path, &r);
	ck_assert_msg(r.status == 200 || r.status == 404, "GET %s: %ld %s", path, r.status, r.body);
	if (r.status == 200) {
		out = malloc(r.body_len + 1);
		ck_assert_ptr_nonnull(out);
		memcpy(out, r.body, r.body_len);
		*len = r.body_len;
	}
	th_response_free(&r);
	return out;
}

static void expect_data(const char *when, const char *name, const void *want, size_t len)
{
	size_t got_len = 0;
	char *got = data_of(name, &got_len), what[256];

	ck_assert_msg(got, "%s: array '%s' is gone", when, name);
	snprintf(what, sizeof what, "%s: array '%s'", when, name);
	th_assert_bytes(what, got, got_len, want, len);
	free(got);
}

static void expect_absent(const char *when, const char *name)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	ck_assert_msg(th_get_status(&D, path) == 404, "%s: array '%s' exists", when, name);
}

/* ---- accounting -------------------------------------------------------------------- */

#define MAX_SPACES 32

struct spaces {
	int n;
	char key[MAX_SPACES][48];
	long long in_use[MAX_SPACES];
	long long live[MAX_SPACES];
	long long shards[MAX_SPACES];   /* sum of the listed shards placed there */
};

static void spaces_read(struct spaces *s)
{
	struct th_response r;
	json_t *list, *a, *sh, *sums = json_object();
	size_t i, k;

	list = th_arr(th_get_json(&D, "/v1/arrays?page_size=1000", &r), "arrays");
	json_array_foreach(list, i, a) {
		json_array_foreach(th_arr(a, "shards"), k, sh) {
			char key[64];

			snprintf(key, sizeof key, "%s/%s", th_str(sh, "device"), th_str(sh, "memory_kind"));
			json_object_set_new(sums, key, json_integer(json_integer_value(json_object_get(sums,
			                                            key)) + th_int(sh, "nbytes")));
		}
	}
	th_response_free(&r);
	list = th_arr(th_get_json(&D, "/v1/memory", &r), "spaces");
	s->n = 0;
	json_array_foreach(list, i, a) {
		ck_assert_int_lt(s->n, MAX_SPACES);
		snprintf(s->key[s->n], sizeof s->key[0], "%s/%s", th_str(a, "device"),
		         th_str(a, "memory_kind"));
		s->in_use[s->n] = th_int(a, "bytes_in_use");
		s->live[s->n] = th_int(a, "live_allocations");
		s->shards[s->n] = json_integer_value(json_object_get(sums, s->key[s->n]));
		s->n++;
	}
	th_response_free(&r);
	json_decref(sums);
}

/* What differs between before and now (in why); true when nothing. */
static bool spaces_diff(const struct spaces *before, const struct spaces *now, bool shards,
                        char *why, size_t cap)
{
	size_t o = 0;

	why[0] = '\0';
	for (int i = 0; i < now->n; i++) {
		if (now->in_use[i] != before->in_use[i] || now->live[i] != before->live[i])
			o += (size_t)snprintf(why + o, cap > o ? cap - o : 0,
			                      "%s: %lld bytes in %lld allocations, before %lld in %lld; ",
			                      now->key[i], now->in_use[i], now->live[i], before->in_use[i],
			                      before->live[i]);
		if (shards && now->in_use[i] != now->shards[i])
			o += (size_t)snprintf(why + o, cap > o ? cap - o : 0,
			                      "%s: %lld bytes in use, its shards %lld; ", now->key[i],
			                      now->in_use[i], now->shards[i]);
	}
	return o == 0;
}

/* Buffers of a failed operation may go back a moment after its answer:
 * waits up to 5 s for the accounting to come back to before. */
static void expect_spaces(const char *when, const struct spaces *before, bool shards)
{
	long long deadline = th_now_ms() + 5000;
	struct spaces now;
	char why[4096];

	for (;;) {
		spaces_read(&now);
		if (spaces_diff(before, &now, shards, why, sizeof why) || th_now_ms() > deadline)
			break;
		usleep(10000);
	}
	ck_assert_msg(why[0] == '\0', "%s: %s", when, why);
}

/* ---- the walk ---------------------------------------------------------------------- */

/*
 * A workflow: run sends it (the answer settled in r); intact checks, after
 * a failed run, that the previous data is whole and nothing half-made is
 * left; undo brings a successful run back to the starting state (after
 * checking its result). shards: whether every byte in use belongs to a
 * listed array (false while a model's step keeps buffers of its own).
 */
struct workflow {
	const char *name;
	void (*run)(struct th_response *r);
	void (*intact)(const char *when);
	void (*undo)(const char *when);
	bool shards;
};

/* The points walked for a kind with count points. */
static int walk_points(long count, long *pts)
{
	const char *all = getenv("FAULT_WALK_ALL");
	int n = 0;

	if (count <= WALK_ALL || (all && strcmp(all, "1") == 0)) {
		for (long i = 1; i <= count; i++)
			pts[n++] = i;
		return n;
	}
	for (long i = 1; i <= 6; i++)
		pts[n++] = i;
	for (int i = 1; i < WALK_SAMPLE - 12; i++)
		pts[n++] = 6 + (count - 12) * i / (WALK_SAMPLE - 12);
	for (long i = count - 5; i <= count; i++)
		pts[n++] = i;
	return n;
}

/* Whether r is a clean google.rpc.Status error for a failure of kind. */
static void expect_clean_error(const char *when, int kind, struct th_response *r)
{
	json_t *j = json_loadb(r->body, r->body_len, 0, NULL), *e = json_object_get(j, "error");
	const char *status = json_string_value(json_object_get(e, "status"));
	const char *msg = json_string_value(json_object_get(e, "message"));

	ck_assert_msg(e && status && msg && *msg, "%s: %ld without a google.rpc.Status: %s", when,
	              r->status, r->body);
	ck_assert_msg(json_integer_value(json_object_get(e, "code")) == r->status,
	              "%s: code %lld in a %ld answer", when,
	              (long long)json_integer_value(json_object_get(e, "code")), r->status);
	if (kind == 4)
		ck_assert_msg((r->status == 500 && strcmp(status, "INTERNAL") == 0) ||
		              (r->status == 503 && strcmp(status, "UNAVAILABLE") == 0),
		              "%s: a failed copy answers %ld %s: %s", when, r->status, status, msg);
	else
		ck_assert_msg(r->status == 429 && strcmp(status, "RESOURCE_EXHAUSTED") == 0,
		              "%s: a failed allocation answers %ld %s: %s", when, r->status, status, msg);
	json_decref(j);
}

static void walk(const struct workflow *w)
{
	long counts[NKINDS], pts[WALK_ALL + WALK_SAMPLE + 16], total = 0, failed = 0, late = 0;
	struct spaces before;
	struct th_response r;
	char when[256];

	/* once to warm every cache, once counting */
	for (int pass = 0; pass < 2; pass++) {
		spaces_read(&before);
		fault_arm("copy", 0);
		w->run(&r);
		ck_assert_msg(r.status >= 200 && r.status < 300, "%s without faults: %ld %s", w->name,
		              r.status, r.body);
		th_response_free(&r);
		fault_counts(counts);
		w->undo(w->name);
		expect_spaces(w->name, &before, w->shards);
	}
	for (int k = 0; k < NKINDS; k++) {
		int n = walk_points(counts[k], pts);

		for (int i = 0; i < n; i++) {
			long now[NKINDS], fired;

			snprintf(when, sizeof when, "%s, %s point %ld of %ld", w->name, kinds[k], pts[i],
			         counts[k]);
			spaces_read(&before);
			fault_arm(kinds[k], pts[i]);
			w->run(&r);
			fired = fault_counts(now);
			fault_arm(kinds[k], 0);
			ck_assert_msg(th_get_status(&D, "/livez") == 200, "%s: the server is not alive", when);
			if (fired == 0) {
				/* the last points of a run may come after its answer
				 * (releases on a worker): not reached this time */
				ck_assert_msg(r.status >= 200 && r.status < 300,
				              "%s: %ld without a failure injected: %s", when, r.status,
				              r.body);
				th_response_free(&r);
				w->undo(when);
				late++;
			} else if (r.status >= 200 && r.status < 300) {
				/* the failure was absorbed: the result must still be right */
				th_response_free(&r);
				w->undo(when);
			} else {
				expect_clean_error(when, k, &r);
				w->intact(when);
				th_response_free(&r);
				failed++;
			}
			expect_spaces(when, &before, w->shards);
			total++;
		}
	}
	walked += total;
	printf("faults: %-22s %4ld points: %ld failed cleanly, %ld absorbed, %ld not reached; "
	       "device %ld, pinned %ld, pageable %ld, heap %ld, copy %ld\n",
	       w->name, total, failed, total - failed - late, late, counts[0], counts[1],
	       counts[2], counts[3], counts[4]);
	fflush(stdout);
}

/* ---- the daemon and its data ------------------------------------------------------- */

#define ROWS 64
#define COLS 32
#define NBYTES (ROWS * COLS * 4)

static unsigned char old_t[NBYTES], new_t[NBYTES];

static void daemon_up(void)
{
	static char dir[512];
	const char *args[] = {"--sim-devices", "2", "--sim-device-memory", "64MiB",
	                      "--pinned-host-limit", "256MiB", "--unpinned-host-limit", "256MiB",
	                      "--data-dir", dir, NULL};

	th_temp_dir("data", dir, sizeof dir);
	snprintf(data_dir, sizeof data_dir, "%s", dir);
	th_daemon_start(&D, args);
	th_fill(old_t, sizeof old_t, 1);
	th_fill(new_t, sizeof new_t, 2);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
	printf("faults: %ld points walked in this case\n", walked);
}

static void put_raw(const char *name, const char *where, const void *data, size_t len,
                    struct th_response *r)
{
	char path[1024];

	snprintf(path, sizeof path, "/v1/arrays/%s?dtype=float32&shape=%d,%d%s%s", name, ROWS,
	         COLS, where ? "&" : "", where ? where : "");
	req("PUT", path, NULL, data, len, r);
}

static void seed(const char *name, const char *where, const void *data)
{
	struct th_response r;

	put_raw(name, where, data, NBYTES, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "PUT %s: %ld %s", name, r.status, r.body);
	th_response_free(&r);
}

/* ---- uploads ----------------------------------------------------------------------- */

static void raw_run(struct th_response *r)
{
	put_raw("t", "device=sim:0&memory_kind=device", new_t, NBYTES, r);
}

static void t_intact(const char *when)
{
	expect_data(when, "t", old_t, NBYTES);
}

static void t_undo(const char *when)
{
	expect_data(when, "t", new_t, NBYTES);
	seed("t", "device=sim:0&memory_kind=device", old_t);
}

START_TEST(test_walk_upload_raw)
{
	static const struct workflow w = {"upload raw", raw_run, t_intact, t_undo, true};

	seed("t", "device=sim:0&memory_kind=device", old_t);
	walk(&w);
}
END_TEST

static void mesh_where(char *buf, size_t cap)
{
	static const char mesh[] = "{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], "
	                           "\"axis_names\": [\"x\"], \"shape\": [2]}, \"spec\": [\"x\", null], "
	                           "\"memory_kind\": \"device\"}";
	char esc[512];

	th_url_escape(esc, sizeof esc, mesh);
	snprintf(buf, cap, "sharding=%s", esc);
}

static void raw_mesh_run(struct th_response *r)
{
	char where[600];

	mesh_where(where, sizeof where);
	put_raw("t", where, new_t, NBYTES, r);
}

static void t_mesh_undo(const char *when)
{
	struct th_response r;
	json_t *a;

	expect_data(when, "t", new_t, NBYTES);
	a = th_get_json(&D, "/v1/arrays/t", &r);
	ck_assert_msg(json_array_size(th_arr(a, "shards")) == 2, "%s: 't' is %s", when, r.body);
	th_response_free(&r);
	seed("t", "device=sim:0&memory_kind=device", old_t);
}

START_TEST(test_walk_upload_raw_mesh)
{
	static const struct workflow w = {"upload raw to mesh", raw_mesh_run, t_intact, t_mesh_undo,
	                                  true};

	seed("t", "device=sim:0&memory_kind=device", old_t);
	walk(&w);
}
END_TEST

/* A .npy of ROWS x COLS float32. */
static unsigned char *npy_of(const void *data, size_t *len)
{
	char head[128];
	int hl = snprintf(head, sizeof head,
	                  "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", ROWS, COLS);
	size_t pad = 64 - (10 + (size_t)hl + 1) % 64, hlen = (size_t)hl + pad + 1;
	unsigned char *p = malloc(10 + hlen + NBYTES);

	ck_assert_ptr_nonnull(p);
	memcpy(p, "\x93NUMPY\x01\x00", 8);
	p[8] = (unsigned char)(hlen & 0xff);
	p[9] = (unsigned char)(hlen >> 8);
	memcpy(p + 10, head, (size_t)hl);
	memset(p + 10 + hl, ' ', pad);
	p[10 + hlen - 1] = '\n';
	memcpy(p + 10 + hlen, data, NBYTES);
	*len = 10 + hlen + NBYTES;
	return p;
}

static void npy_run(struct th_response *r)
{
	size_t len;
	unsigned char *p = npy_of(new_t, &len);

	req("PUT", "/v1/arrays/n?device=sim:1&memory_kind=pinned_host", npy_h, p, len, r);
	free(p);
}

static void n_intact(const char *when)
{
	expect_data(when, "n", old_t, NBYTES);
}

static void n_undo(const char *when)
{
	expect_data(when, "n", new_t, NBYTES);
	seed("n", "device=sim:1&memory_kind=pinned_host", old_t);
}

START_TEST(test_walk_upload_npy)
{
	static const struct workflow w = {"upload npy", npy_run, n_intact, n_undo, true};

	seed("n", "device=sim:1&memory_kind=pinned_host", old_t);
	walk(&w);
}
END_TEST

/* ---- import ------------------------------------------------------------------------ */

/* A safetensors file of two ROWS x COLS float32 tensors "a" and "b". */
static unsigned char *safetensors_of(const void *a, const void *b, size_t *len)
{
	char head[256];
	int hl = snprintf(head, sizeof head,
	                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[0,%d]},"
	                  "\"b\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%d,%d]}}",
	                  ROWS, COLS, NBYTES, ROWS, COLS, NBYTES, 2 * NBYTES);
	size_t hlen = ((size_t)hl + 7) / 8 * 8;
	unsigned char *p = malloc(8 + hlen + 2 * NBYTES);
	uint64_t le = hlen;

	ck_assert_ptr_nonnull(p);
	memcpy(p, &le, 8);
	memcpy(p + 8, head, (size_t)hl);
	memset(p + 8 + hl, ' ', hlen - (size_t)hl);
	memcpy(p + 8 + hlen, a, NBYTES);
	memcpy(p + 8 + hlen + NBYTES, b, NBYTES);
	*len = 8 + hlen + 2 * NBYTES;
	return p;
}

static void import_seed(void)
{
	seed("ia", "device=sim:0&memory_kind=device", old_t);
	seed("ib", "device=sim:1&memory_kind=device", old_t);
}

static void import_body_run(struct th_response *r)
{
	size_t len;
	unsigned char *p = safetensors_of(new_t, new_t, &len);

	req("POST", "/v1/arrays:import?prefix=i&device=sim:0&memory_kind=device&wait=true", NULL, p,
	    len, r);
	free(p);
}

static void import_intact(const char *when)
{
	expect_data(when, "ia", old_t, NBYTES);
	expect_data(when, "ib", old_t, NBYTES);
}

static void import_undo(const char *when)
{
	expect_data(when, "ia", new_t, NBYTES);
	expect_data(when, "ib", new_t, NBYTES);
	import_seed();
}

START_TEST(test_walk_import_body)
{
	static const struct workflow w = {"import body", import_body_run, import_intact,
	                                  import_undo, true};

	import_seed();
	walk(&w);
}
END_TEST

static void import_path_run(struct th_response *r)
{
	char body[700];

	snprintf(body, sizeof body, "{\"path\": \"%s/w.safetensors\"}", data_dir);
	req("POST", "/v1/arrays:import?prefix=i&device=sim:1&memory_kind=pinned_host&wait=true",
	    json_h, body, strlen(body), r);
}

START_TEST(test_walk_import_path)
{
	static const struct workflow w = {"import path", import_path_run, import_intact,
	                                  import_undo, true};
	char path[600];
	size_t len;
	unsigned char *p = safetensors_of(new_t, new_t, &len);

	snprintf(path, sizeof path, "%s/w.safetensors", data_dir);
	th_write_file(path, p, len);
	free(p);
	import_seed();
	walk(&w);
}
END_TEST

/* ---- moves ------------------------------------------------------------------------- */

#define MESH2 "{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"], " \
	"\"shape\": [2]}, \"spec\": [\"x\", null], \"memory_kind\": \"device\"}"

static void put_d2h_run(struct th_response *r)
{
	static const char body[] = "{\"sharding\": {\"device\": \"sim:1\", "
	                           "\"memory_kind\": \"pinned_host\"}}";

	req("POST", "/v1/arrays/t:put?wait=true", json_h, body, strlen(body), r);
}

static void t_where(const char *when, const char *dev, const char *kind)
{
	struct th_response r;
	json_t *a = th_get_json(&D, "/v1/arrays/t", &r), *sh = th_obj(a, "sharding");

	ck_assert_msg(strcmp(th_str(sh, "device"), dev) == 0 &&
	              strcmp(th_str(sh, "memory_kind"), kind) == 0,
	              "%s: 't' is on %s, want %s/%s", when, r.body, dev, kind);
	th_response_free(&r);
}

static void put_intact(const char *when)
{
	t_intact(when);
	t_where(when, "sim:0", "device");
}

static void put_d2h_undo(const char *when)
{
	t_intact(when);
	t_where(when, "sim:1", "pinned_host");
	post_json("/v1/arrays/t:put?wait=true",
	          "{\"sharding\": {\"device\": \"sim:0\", \"memory_kind\": \"device\"}}");
}

START_TEST(test_walk_put_device_to_host)
{
	static const struct workflow w = {":put device to pinned", put_d2h_run, put_intact,
	                                  put_d2h_undo, true};

	seed("t", "device=sim:0&memory_kind=device", old_t);
	walk(&w);
}
END_TEST

static void put_mesh_run(struct th_response *r)
{
	static const char body[] = "{\"sharding\": " MESH2 "}";

	req("POST", "/v1/arrays/t:put?wait=true", json_h, body, strlen(body), r);
}

static void put_mesh_undo(const char *when)
{
	struct th_response r;
	json_t *a;

	t_intact(when);
	a = th_get_json(&D, "/v1/arrays/t", &r);
	ck_assert_msg(json_array_size(th_arr(a, "shards")) == 2, "%s: 't' is %s", when, r.body);
	th_response_free(&r);
	post_json("/v1/arrays/t:put?wait=true",
	          "{\"sharding\": {\"device\": \"sim:0\", \"memory_kind\": \"device\"}}");
}

START_TEST(test_walk_put_to_mesh)
{
	static const struct workflow w = {":put device to mesh", put_mesh_run, put_intact,
	                                  put_mesh_undo, true};

	seed("t", "device=sim:0&memory_kind=device", old_t);
	walk(&w);
}
END_TEST

static void put_h2d_run(struct th_response *r)
{
	static const char body[] = "{\"sharding\": {\"device\": \"sim:1\", "
	                           "\"memory_kind\": \"device\"}}";

	req("POST", "/v1/arrays/h:put?wait=true", json_h, body, strlen(body), r);
}

static void h_where(const char *when, const char *dev, const char *kind)
{
	struct th_response r;
	json_t *a = th_get_json(&D, "/v1/arrays/h", &r), *sh = th_obj(a, "sharding");

	ck_assert_msg(strcmp(th_str(sh, "device"), dev) == 0 &&
	              strcmp(th_str(sh, "memory_kind"), kind) == 0,
	              "%s: 'h' is on %s, want %s/%s", when, r.body, dev, kind);
	th_response_free(&r);
}

static void put_h2d_intact(const char *when)
{
	expect_data(when, "h", old_t, NBYTES);
	h_where(when, "sim:0", "unpinned_host");
}

static void put_h2d_undo(const char *when)
{
	expect_data(when, "h", old_t, NBYTES);
	h_where(when, "sim:1", "device");
	post_json("/v1/arrays/h:put?wait=true",
	          "{\"sharding\": {\"device\": \"sim:0\", \"memory_kind\": \"unpinned_host\"}}");
}

START_TEST(test_walk_put_host_to_device)
{
	static const struct workflow w = {":put pageable to device", put_h2d_run, put_h2d_intact,
	                                  put_h2d_undo, true};

	seed("h", "device=sim:0&memory_kind=unpinned_host", old_t);
	walk(&w);
}
END_TEST

static void copy_run(struct th_response *r)
{
	static const char body[] = "{\"out\": \"c\", \"sharding\": {\"device\": \"sim:1\", "
	                           "\"memory_kind\": \"unpinned_host\"}}";

	req("POST", "/v1/arrays/t:copy?wait=true", json_h, body, strlen(body), r);
}

static void copy_intact(const char *when)
{
	put_intact(when);
	expect_absent(when, "c");
}

static void copy_undo(const char *when)
{
	put_intact(when);
	expect_data(when, "c", old_t, NBYTES);
	delete_name("arrays", "c");
}

START_TEST(test_walk_copy)
{
	static const struct workflow w = {":copy", copy_run, copy_intact, copy_undo, true};

	seed("t", "device=sim:0&memory_kind=device", old_t);
	walk(&w);
}
END_TEST

static void gather_run(struct th_response *r)
{
	static const char body[] = "{\"rows\": [3, 1, 60, 7], \"out\": {\"name\": \"g\", "
	                           "\"device\": \"sim:1\", \"memory_kind\": \"device\"}}";

	req("POST", "/v1/arrays/t:gather?wait=true", json_h, body, strlen(body), r);
}

static void gather_intact(const char *when)
{
	put_intact(when);
	expect_absent(when, "g");
}

static void gather_undo(const char *when)
{
	static const int rows[] = {3, 1, 60, 7};
	unsigned char want[4 * COLS * 4];

	for (int i = 0; i < 4; i++)
		memcpy(want + (size_t)i * COLS * 4, old_t + (size_t)rows[i] * COLS * 4, COLS * 4);
	put_intact(when);
	expect_data(when, "g", want, sizeof want);
	delete_name("arrays", "g");
}

START_TEST(test_walk_gather)
{
	static const struct workflow w = {":gather", gather_run, gather_intact, gather_undo, true};

	seed("t", "device=sim:0&memory_kind=device", old_t);
	walk(&w);
}
END_TEST

/* ---- models ------------------------------------------------------------------------ */

#define MODEL_SPEC(name, params, opt) \
	"{\"name\": \"" name "\", \"mlp\": {\"layers\": 2, \"d_model\": 32, \"d_hidden\": 48}, " \
	"\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.01}, " \
	"\"placement\": {\"device\": \"sim:0\", \"params\": \"" params "\", \"opt_state\": \"" \
	opt "\"}}"

static void create_run(struct th_response *r)
{
	static const char body[] = MODEL_SPEC("mc", "device", "pinned_host");

	req("POST", "/v1/models?wait=true", json_h, body, strlen(body), r);
}

static void create_intact(const char *when)
{
	struct th_response r;
	json_t *list;
	size_t i;
	json_t *a;

	ck_assert_msg(th_get_status(&D, "/v1/models/mc") == 404, "%s: model 'mc' exists", when);
	list = th_arr(th_get_json(&D, "/v1/arrays?page_size=1000", &r), "arrays");
	json_array_foreach(list, i, a)
		ck_assert_msg(strncmp(th_str(a, "name"), "mc.", 3) != 0,
		              "%s: array '%s' of a model that was not made is left", when,
		              th_str(a, "name"));
	th_response_free(&r);
}

static void create_undo(const char *when)
{
	ck_assert_msg(th_get_status(&D, "/v1/models/mc") == 200, "%s: model 'mc' missing", when);
	delete_name("models", "mc");
	create_intact(when);
}

START_TEST(test_walk_model_create)
{
	static const struct workflow w = {"model create", create_run, create_intact, create_undo,
	                                  true};

	walk(&w);
}
END_TEST

/* Every array of the model (weights and Adam's state), in one buffer, and
 * its step count. */
static unsigned char *weights(const char *model, size_t *len, long *steps)
{
	static const char *const suffix[] = {"w1", "w2", "adam.mu.w1", "adam.mu.w2",
	                                     "adam.nu.w1", "adam.nu.w2"};
	unsigned char *all = NULL;
	struct th_response r;
	char name[64];
	json_t *m;

	*len = 0;
	for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
		size_t l = 0;
		char *d;

		snprintf(name, sizeof name, "%s.%s", model, suffix[i]);
		d = data_of(name, &l);
		ck_assert_msg(d, "model '%s' has lost its array '%s'", model, name);
		all = realloc(all, *len + l);
		ck_assert_ptr_nonnull(all);
		memcpy(all + *len, d, l);
		*len += l;
		free(d);
	}
	snprintf(name, sizeof name, "/v1/models/%s", model);
	m = th_get_json(&D, name, &r);
	*steps = (long)th_int(m, "steps");
	th_response_free(&r);
	return all;
}

static unsigned char *step_before;
static size_t step_before_len;
static long step_before_steps;
static const char *step_model;

static void step_run(struct th_response *r)
{
	static const char body[] = "{\"inputs\": \"x\", \"targets\": \"y\"}";
	char path[128];

	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", step_model);
	req("POST", path, json_h, body, strlen(body), r);
}

/*
 * A failed step leaves every array of the model - weights and optimizer
 * state - byte for byte as it was before it, and its step count (Adam's t)
 * unchanged, wherever in the step the failure was: before the first update
 * or between updates (the executor takes all its memory first, writes
 * offloaded arrays to new versions and journals device ones a copy
 * follows). The model then trains on: the next step succeeds.
 */
static void step_intact(const char *when)
{
	size_t len;
	long steps;
	unsigned char *now = weights(step_model, &len, &steps);
	char what[300];
	struct th_response r;

	snprintf(what, sizeof what, "%s: the arrays of '%s'", when, step_model);
	th_assert_bytes(what, now, len, step_before, step_before_len);
	ck_assert_msg(steps == step_before_steps, "%s: '%s' counts %ld steps, %ld before", when,
	              step_model, steps, step_before_steps);
	free(now);
	step_run(&r);
	ck_assert_msg(r.status == 200, "%s: the step after the failure: %ld %s", when, r.status,
	              r.body);
	th_response_free(&r);
	free(step_before);
	step_before = weights(step_model, &step_before_len, &step_before_steps);
}

/* A step that went through changed them and counted: the next run starts
 * from these. */
static void step_undo(const char *when)
{
	size_t len;
	long steps;
	unsigned char *now = weights(step_model, &len, &steps);

	ck_assert_msg(len != step_before_len || memcmp(now, step_before, len) != 0,
	              "%s: a step changed nothing", when);
	ck_assert_msg(steps == step_before_steps + 1, "%s: %ld steps after %ld and a step", when,
	              steps, step_before_steps);
	free(step_before);
	step_before = now;
	step_before_len = len;
	step_before_steps = steps;
}

static void step_walk(const char *name, const char *spec, const char *label)
{
	const struct workflow w = {label, step_run, step_intact, step_undo, false};
	float x[16 * 32], y[16 * 32];
	char path[128];
	struct th_response r;

	for (size_t i = 0; i < 16 * 32; i++) {
		x[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
		y[i] = (float)((i * 11) % 13) / 13.0f - 0.5f;
	}
	post_json("/v1/models", spec);
	snprintf(path, sizeof path, "/v1/arrays/x?dtype=float32&shape=16,32&device=sim:0");
	must("PUT", path, NULL, x, sizeof x);
	snprintf(path, sizeof path, "/v1/arrays/y?dtype=float32&shape=16,32&device=sim:0");
	must("PUT", path, NULL, y, sizeof y);
	step_model = name;
	step_before = weights(name, &step_before_len, &step_before_steps);
	walk(&w);
	free(step_before);
	step_before = NULL;
	(void)r;
}

START_TEST(test_walk_step_device)
{
	step_walk("md", MODEL_SPEC("md", "device", "device"), ":step on device");
}
END_TEST

START_TEST(test_walk_step_offloaded)
{
	step_walk("mo",
	          "{\"name\": \"mo\", \"mlp\": {\"layers\": 2, \"d_model\": 32, \"d_hidden\": 48}, "
	          "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.01}, "
	          "\"placement\": {\"device\": \"sim:0\", \"params\": \"pinned_host\", "
	          "\"opt_state\": \"pinned_host\", \"activations\": {\"save\": [], "
	          "\"offload\": [\"x\"]}}}",
	          ":step offloaded");
}
END_TEST

/* Params on the device, Adam's state streamed from pinned_host: copies
 * follow the first in-place update, so the weights are journaled. */
START_TEST(test_walk_step_mixed)
{
	step_walk("mx", MODEL_SPEC("mx", "device", "pinned_host"), ":step mixed");
}
END_TEST

/* Everything on the device, the layer inputs offloaded: their fetches
 * follow the first (fused) update. */
START_TEST(test_walk_step_device_offloaded_x)
{
	step_walk("mdx",
	          "{\"name\": \"mdx\", \"mlp\": {\"layers\": 3, \"d_model\": 32, \"d_hidden\": 48}, "
	          "\"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", \"learning_rate\": 0.01}, "
	          "\"placement\": {\"device\": \"sim:0\", \"params\": \"device\", "
	          "\"opt_state\": \"device\", \"activations\": {\"save\": [], "
	          "\"offload\": [\"x\"]}}}",
	          ":step device, x offloaded");
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("faults");
	TCase *tc = tcase_create("walk");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_walk_upload_raw);
	tcase_add_test(tc, test_walk_upload_raw_mesh);
	tcase_add_test(tc, test_walk_upload_npy);
	tcase_add_test(tc, test_walk_import_body);
	tcase_add_test(tc, test_walk_import_path);
	tcase_add_test(tc, test_walk_put_device_to_host);
	tcase_add_test(tc, test_walk_put_to_mesh);
	tcase_add_test(tc, test_walk_put_host_to_device);
	tcase_add_test(tc, test_walk_copy);
	tcase_add_test(tc, test_walk_gather);
	tcase_add_test(tc, test_walk_model_create);
	tcase_add_test(tc, test_walk_step_device);
	tcase_add_test(tc, test_walk_step_offloaded);
	tcase_add_test(tc, test_walk_step_mixed);
	tcase_add_test(tc, test_walk_step_device_offloaded_x);
	suite_add_tcase(s, tc);
	return s;
}
