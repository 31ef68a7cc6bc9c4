/*
 * it_moves.c - Check suite "moves": device_put and copy (POST
 * /v1/arrays/{array}:put and :copy) and the operations they run, against a
 * real tstaged with four simulated devices of 256 MiB and 1 GiB each of
 * pinned and pageable host memory: the acceptance scenario (pinned host, then
 * sharded over a 2x2 mesh of devices, then one device's pageable host, with
 * progress seen while it runs), every way to name a placement, sharded
 * uploads, waiting and cancelling, admission, and two workloads (a seeded
 * random sequence, and four clients at once) after which every space holds
 * exactly the bytes of the shards that the array list places in it.
 *
 * Each case runs forked with its own daemon, so every space starts empty.
 * The data is made here. The workloads' rows carry their seed, row number
 * and length, so that any download of any array, however it came to be
 * (uploaded, moved, copied, gathered), can be checked on its own.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB (1ull << 20)

/* The daemon of the checked fixture (per forked case). */
static struct th_daemon D;

static void daemon_up(void)
{
	static const char *const args[] = {"--sim-devices", "4", "--sim-device-memory", "256MiB",
	                                   "--pinned-host-limit", "1GiB",
	                                   "--unpinned-host-limit", "1GiB", NULL};

	th_daemon_start(&D, args);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* A 2x2 mesh of the four devices, each holding one quarter. */
#define MESH4 "{\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\",\"sim:3\"], " \
	"\"axis_names\": [\"x\",\"y\"], \"shape\": [2,2]}"
#define GRID "{\"mesh\": " MESH4 ", \"spec\": [\"x\",\"y\"], \"memory_kind\": \"device\"}"
/* The four devices in a line, dimension 0 split four ways. */
#define LINE4 "{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\",\"sim:3\"], " \
	"\"axis_names\": [\"x\"], \"shape\": [4]}, \"spec\": [\"x\"], \"memory_kind\": \"device\"}"

static const char *const json_headers[] = {"Content-Type: application/json", NULL};
static const char *const prefer_headers[] = {"Content-Type: application/json",
                                             "Prefer: wait=5", NULL};

/* ---- bytes ------------------------------------------------------------------------ */


/*
 * Self-describing rows: bytes 0..7 are the seed, 8..11 the row's number in
 * the upload, 12..15 the row's length, the rest follow from those. A row
 * stays valid wherever it goes (a gather keeps its number), so a download
 * can be checked without knowing which version it came from.
 */
#define ROW_HEAD 16

static void row_fill(unsigned char *row, size_t row_bytes, uint64_t seed, uint32_t idx)
{
	uint32_t len = (uint32_t)row_bytes;

	memcpy(row, &seed, 8);
	memcpy(row + 8, &idx, 4);
	memcpy(row + 12, &len, 4);
	th_fill(row + ROW_HEAD, row_bytes - ROW_HEAD, seed ^ ((uint64_t)idx * 0x9e3779b97f4a7c15ull));
}

static void rows_fill(unsigned char *p, size_t rows, size_t row_bytes, uint64_t seed)
{
	for (size_t i = 0; i < rows; i++)
		row_fill(p + i * row_bytes, row_bytes, seed, (uint32_t)i);
}

/* Whether p[0..len) is whole rows that row_fill wrote; what is wrong goes
 * to why. Safe from any thread. */
static bool rows_valid(const unsigned char *p, size_t len, char *why, size_t cap)
{
	unsigned char *want = NULL;
	uint32_t row_bytes;
	size_t at = 0;
	bool ok = true;

	if (len == 0)
		return true;
	if (len < ROW_HEAD) {
		snprintf(why, cap, "%zu bytes: shorter than a row", len);
		return false;
	}
	memcpy(&row_bytes, p + 12, 4);
	if (row_bytes < ROW_HEAD || len % row_bytes != 0 || !(want = malloc(row_bytes))) {
		snprintf(why, cap, "%zu bytes are not whole rows of %u", len, row_bytes);
		return false;
	}
	for (; ok && at < len; at += row_bytes) {
		uint64_t seed;
		uint32_t idx;

		memcpy(&seed, p + at, 8);
		memcpy(&idx, p + at + 8, 4);
		row_fill(want, row_bytes, seed, idx);
		if (memcmp(want, p + at, row_bytes) != 0) {
			snprintf(why, cap, "the row at byte %zu (seed %" PRIx64 ", row %u) is not whole",
			         at, seed, idx);
			ok = false;
		}
	}
	free(want);
	return ok;
}

/* ---- requests ----------------------------------------------------------------------- */

static json_t *load(const char *text)
{
	json_error_t e;
	json_t *j = json_loads(text, 0, &e);

	ck_assert_msg(j != NULL, "bad test JSON (%s): %s", e.text, text);
	return j;
}


static json_t *meta(const char *name, struct th_response *r)
{
	char path[300];

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	return th_get_json(&D, path, r);
}

/* The error message of a google.rpc.Status answer (borrowed from r). */
static const char *error_message(struct th_response *r)
{
	return th_str(th_obj(th_json(r), "error"), "message");
}

/* ---- operations --------------------------------------------------------------------- */

/* Checks the shape of an operation (kind may be NULL: any). */
static void check_operation(json_t *op, const char *kind)
{
	const char *id = json_string_value(th_op_meta(op, "id")), *state = json_string_value(th_op_meta(op, "state"));
	json_t *progress = th_op_meta(op, "progress");
	json_int_t done_b = th_int(progress, "bytes_done"), total = th_int(progress, "bytes_total");
	char name[64];

	ck_assert_msg(strncmp(id, "op-", 3) == 0 && strlen(id) == 19, "operation id '%s'", id);
	snprintf(name, sizeof name, "operations/%s", id);
	ck_assert_str_eq(th_str(op, "name"), name);
	if (kind)
		ck_assert_str_eq(json_string_value(th_op_meta(op, "kind")), kind);
	ck_assert_msg(done_b >= 0 && done_b <= total, "progress %lld of %lld",
	              (long long)done_b, (long long)total);
	json_string_value(th_op_meta(op, "create_time"));
	if (th_bool(op, "done")) {
		ck_assert_msg(th_op_terminal(state), "done in state %s", state);
		if (strcmp(state, "SUCCEEDED") == 0) {
			th_op_result(op);
			ck_assert_msg(done_b == total, "succeeded with %lld of %lld bytes",
			              (long long)done_b, (long long)total);
		} else {
			th_obj(op, "error");
		}
	} else {
		ck_assert_msg(strcmp(state, "PENDING") == 0 || strcmp(state, "RUNNING") == 0,
		              "not done in state %s", state);
		ck_assert_ptr_null(json_object_get(op, "response"));
		ck_assert_ptr_null(json_object_get(op, "error"));
	}
}

/* POST /v1/arrays/{name}{verb} (":put" or ":copy") with body, without
 * waiting: it must answer 202 with an operation of that kind and a Location;
 * returns the id (new string) and, when total is not NULL, its bytes_total. */
static char *move_start(const char *name, const char *verb, const char *body, json_int_t *total)
{
	struct th_response r;
	char path[300], loc[96];
	json_t *op;
	char *id;

	snprintf(path, sizeof path, "/v1/arrays/%s%s", name, verb);
	th_post_headers(&D, path, body, NULL, &r);
	ck_assert_msg(r.status == 202, "POST %s %s: %ld %s", path, body, r.status, r.body);
	op = th_json(&r);
	check_operation(op, verb + 1);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "target")), name);
	id = strdup(json_string_value(th_op_meta(op, "id")));
	ck_assert_ptr_nonnull(id);
	snprintf(loc, sizeof loc, "/v1/operations/%s", id);
	ck_assert_msg(th_header(&r, "Location") && strcmp(th_header(&r, "Location"), loc) == 0,
	              "Location '%s', want '%s'", th_header(&r, "Location") ? th_header(&r, "Location")
	                                                                   : "(none)", loc);
	if (total)
		*total = th_int(th_op_meta(op, "progress"), "bytes_total");
	th_response_free(&r);
	return id;
}

/* th_op_get, the operation's shape checked (new reference). */
static json_t *op_get_checked(const char *id)
{
	json_t *op = th_op_get(&D, id);

	check_operation(op, NULL);
	return op;
}

/* POST /v1/operations/{id}:wait with {"timeout": "60s"}: it must answer 200
 * with the finished operation (new reference). */
static json_t *op_wait(const char *id)
{
	struct th_response r;
	char path[96];
	json_t *op;

	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	th_post_headers(&D, path, "{\"timeout\": \"60s\"}", NULL, &r);
	ck_assert_msg(r.status == 200, "POST %s: %ld %s", path, r.status, r.body);
	op = json_incref(th_json(&r));
	th_response_free(&r);
	check_operation(op, NULL);
	ck_assert_msg(json_is_true(json_object_get(op, "done")), "waited for %s: not done", id);
	return op;
}

/* Starts a move, waits for it and wants it SUCCEEDED; returns its result
 * (new reference) and bytes_total in *total (may be NULL). */
static json_t *move_ok(const char *name, const char *verb, const char *body, json_int_t *total)
{
	char *id = move_start(name, verb, body, NULL);
	json_t *op = op_wait(id), *result;

	ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "state")), "SUCCEEDED") == 0, "%s%s %s: %s", name, verb, body,
	              json_dumps(op, 0));
	if (total)
		*total = th_int(th_op_meta(op, "progress"), "bytes_total");
	result = json_incref(th_op_result(op));
	json_decref(op);
	free(id);
	return result;
}

/* The same through ?wait=true or Prefer: wait=5 (headers): the answer must
 * be 200 with the array's metadata itself (new reference). */
static json_t *move_waiting(const char *name, const char *verb, const char *body, bool prefer)
{
	struct th_response r;
	char path[300];
	json_t *a;

	snprintf(path, sizeof path, "/v1/arrays/%s%s%s", name, verb, prefer ? "" : "?wait=true");
	th_post_headers(&D, path, body, prefer ? prefer_headers : NULL, &r);
	ck_assert_msg(r.status == 200, "POST %s %s: %ld %s", path, body, r.status, r.body);
	a = json_incref(th_json(&r));
	th_response_free(&r);
	ck_assert_msg(json_object_get(a, "done") == NULL && json_object_get(a, "shards") != NULL,
	              "POST %s: the answer is not the array", path);
	return a;
}

/* Number of operations GET /v1/operations lists. */
static size_t op_count(void)
{
	struct th_response r;
	size_t n = json_array_size(th_arr(th_get_json(&D, "/v1/operations?page_size=1000", &r),
	                                  "operations"));

	th_response_free(&r);
	return n;
}

/* What polling an operation saw. */
struct watch {
	int polls;                      /* snapshots taken */
	int busy;                       /* of them, at work: RUNNING, or some bytes done */
};

/* Polls an operation until done, counting the snapshots that show it at
 * work, and checks that bytes_done never goes back and bytes_total never
 * changes. Returns the finished operation (new reference). */
static json_t *watch(const char *id, json_int_t total, struct watch *w)
{
	long long deadline = th_now_ms() + 60000;
	json_int_t last = 0;
	json_t *op;

	memset(w, 0, sizeof *w);
	for (;;) {
		json_t *progress;
		json_int_t done_b;
		const char *state;

		op = op_get_checked(id);
		progress = th_op_meta(op, "progress");
		done_b = th_int(progress, "bytes_done");
		state = json_string_value(th_op_meta(op, "state"));
		w->polls++;
		ck_assert_msg(th_int(progress, "bytes_total") == total, "bytes_total %lld, then %lld",
		              (long long)total, (long long)th_int(progress, "bytes_total"));
		ck_assert_msg(done_b >= last, "bytes_done went back from %lld to %lld",
		              (long long)last, (long long)done_b);
		last = done_b;
		if (th_bool(op, "done"))
			return op;
		if (strcmp(state, "RUNNING") == 0 || (done_b > 0 && done_b < total))
			w->busy++;
		json_decref(op);
		ck_assert_msg(th_now_ms() < deadline, "operation %s still not done after 60 s", id);
	}
}

/* ---- memory --------------------------------------------------------------------------- */

/* GET /v1/memory's spaces (new reference). */
static json_t *spaces(void)
{
	struct th_response r;
	json_t *s = json_incref(th_arr(th_get_json(&D, "/v1/memory", &r), "spaces"));

	th_response_free(&r);
	return s;
}

/* What differs between two GET /v1/memory space lists, but for the stats
 * that ignore names (NULL-terminated, or NULL), as "dev/kind stat: a -> b;
 * ..." in buf; true when nothing does. */
static bool spaces_same(json_t *before, json_t *after, const char *const *ignore, char *buf,
                        size_t cap)
{
	size_t i, o = 0;
	json_t *b;

	buf[0] = '\0';
	if (json_array_size(before) != json_array_size(after)) {
		snprintf(buf, cap, "%zu spaces, then %zu", json_array_size(before),
		         json_array_size(after));
		return false;
	}
	json_array_foreach(before, i, b) {
		json_t *a = json_array_get(after, i), *v;
		const char *key;

		json_object_foreach(b, key, v) {
			json_t *w = json_object_get(a, key);
			bool skip = false;

			for (const char *const *k = ignore; k && *k; k++)
				skip = skip || strcmp(*k, key) == 0;
			if (!skip && !json_equal(v, w) && o < cap) {
				char *x = json_dumps(v, JSON_ENCODE_ANY), *y = json_dumps(w, JSON_ENCODE_ANY);

				o += (size_t)snprintf(buf + o, cap - o, "%s/%s %s: %s -> %s; ",
				                      th_str(b, "device"), th_str(b, "memory_kind"), key,
				                      x ? x : "?", y ? y : "(none)");
				free(x);
				free(y);
			}
		}
	}
	return buf[0] == '\0';
}

/* Every space's bytes_in_use as "dev/kind=N;..." (new string); with want
 * (a JSON object "dev/kind": N, others 0), what they should hold instead. */
static char *in_use_text(json_t *list, json_t *want)
{
	size_t i, o = 0, cap = 4096;
	char *out = malloc(cap);
	json_t *s;

	ck_assert_ptr_nonnull(out);
	out[0] = '\0';
	json_array_foreach(list, i, s) {
		char key[64];

		snprintf(key, sizeof key, "%s/%s", th_str(s, "device"), th_str(s, "memory_kind"));
		o += (size_t)snprintf(out + o, cap - o, "%s=%lld;", key,
		                      want ? (long long)json_integer_value(json_object_get(want, key))
		                           : (long long)th_int(s, "bytes_in_use"));
	}
	return out;
}

/* Waits at most timeout_ms until every space holds what want says
 * ("sim:0/device=1024 sim:1/pinned_host=8": the spaces named hold that
 * many bytes, every other none). Buffers go back when their last holder
 * lets go, which may be a moment after an operation shows done. */
static void expect_spaces(const char *want, int timeout_ms)
{
	long long deadline = th_now_ms() + timeout_ms;
	json_t *w = json_object();
	char buf[1024], *tok, *save = NULL, *got = NULL, *wanted = NULL;

	snprintf(buf, sizeof buf, "%s", want);
	for (tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		char *eq = strchr(tok, '=');

		ck_assert_msg(eq != NULL, "bad space spec '%s'", tok);
		*eq = '\0';
		json_object_set_new(w, tok, json_integer(strtoll(eq + 1, NULL, 10)));
	}
	for (;;) {
		json_t *list = spaces();

		free(got);
		free(wanted);
		got = in_use_text(list, NULL);
		wanted = in_use_text(list, w);
		json_decref(list);
		if (strcmp(got, wanted) == 0 || th_now_ms() > deadline)
			break;
		usleep(10000);
	}
	ck_assert_msg(strcmp(got, wanted) == 0, "spaces hold\n  %s\nwant\n  %s", got, wanted);
	free(got);
	free(wanted);
	json_decref(w);
}

/* Every operation listed is done; the accounting is exact within 5 s. */
static void expect_exact_accounting(const char *when)
{
	long long deadline = th_now_ms() + 5000;
	char why[4096];

	while (!th_spaces_match_shards(&D, why, sizeof why) && th_now_ms() < deadline)
		usleep(20000);
	ck_assert_msg(th_spaces_match_shards(&D, why, sizeof why), "%s: %s", when, why);
}

/* The shard of a metadata "shards" list on device (borrowed); fails the
 * test when there is not exactly one. */
static json_t *shard_on(json_t *array, const char *device)
{
	json_t *shard, *found = NULL;
	size_t i;

	json_array_foreach(th_arr(array, "shards"), i, shard) {
		if (strcmp(th_str(shard, "device"), device) == 0) {
			ck_assert_msg(found == NULL, "two shards of '%s' on %s", th_str(array, "name"),
			              device);
			found = shard;
		}
	}
	ck_assert_msg(found != NULL, "no shard of '%s' on %s", th_str(array, "name"), device);
	return found;
}

/* Checks a shard: memory kind, nbytes and its box (rank 2: [[r0,r1],[c0,c1]]). */
static void expect_shard(json_t *array, const char *device, const char *kind, json_int_t nbytes,
                         json_int_t r0, json_int_t r1, json_int_t c0, json_int_t c1)
{
	json_t *shard = shard_on(array, device), *index = th_arr(shard, "index");
	char want[96], *got = json_dumps(index, JSON_COMPACT);

	ck_assert_str_eq(th_str(shard, "memory_kind"), kind);
	ck_assert_msg(th_int(shard, "nbytes") == nbytes, "shard on %s: nbytes %lld, want %lld",
	              device, (long long)th_int(shard, "nbytes"), (long long)nbytes);
	snprintf(want, sizeof want, "[[%lld,%lld],[%lld,%lld]]", (long long)r0, (long long)r1,
	         (long long)c0, (long long)c1);
	ck_assert_msg(strcmp(got, want) == 0, "shard on %s: index %s, want %s", device, got, want);
	free(got);
}

/* ==== 1. the acceptance scenario ========================================================= */

/* 200 MiB of float32: big enough that a poll sees a move at work. */
#define BIG_ROWS 4096
#define BIG_COLS 12800
#define BIG_BYTES ((size_t)BIG_ROWS * BIG_COLS * 4)

START_TEST(test_acceptance)
{
	size_t q = BIG_BYTES / 4;
	char *data = th_pattern(BIG_BYTES, 1), *id, want[256];
	struct th_response r;
	json_t *a, *op, *grid = load(GRID), *res;
	json_int_t total;
	struct watch w;

	th_put_array(&D, "w", "dtype=float32&shape=4096,12800&device=sim:0&memory_kind=pinned_host", data,
	       BIG_BYTES);
	a = meta("w", &r);
	ck_assert_int_eq(th_int(a, "version"), 1);
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), "pinned_host");
	th_response_free(&r);
	snprintf(want, sizeof want, "sim:0/pinned_host=%zu", BIG_BYTES);
	expect_spaces(want, 2000);

	/* pinned host -> the four devices, a quarter each */
	id = move_start("w", ":put", "{\"sharding\": " GRID "}", &total);
	ck_assert_int_eq(total, BIG_BYTES);
	op = watch(id, total, &w);
	ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "state")), "SUCCEEDED") == 0, "put: %s", json_dumps(op, 0));
	ck_assert_msg(w.busy > 0, "none of %d polls of a 200 MiB put saw it running", w.polls);
	ck_assert_int_eq(th_int(th_op_meta(op, "progress"), "bytes_done"), BIG_BYTES);
	res = th_op_result(op);
	ck_assert_str_eq(th_str(res, "name"), "w");
	ck_assert_int_eq(th_int(res, "version"), 2);
	ck_assert(th_bool(res, "committed"));
	ck_assert_msg(json_equal(th_obj(res, "sharding"), grid), "sharding %s",
	              json_dumps(th_obj(res, "sharding"), 0));
	ck_assert_int_eq(json_array_size(th_arr(res, "shards")), 4);
	expect_shard(res, "sim:0", "device", q, 0, 2048, 0, 6400);
	expect_shard(res, "sim:1", "device", q, 0, 2048, 6400, 12800);
	expect_shard(res, "sim:2", "device", q, 2048, 4096, 0, 6400);
	expect_shard(res, "sim:3", "device", q, 2048, 4096, 6400, 12800);
	json_decref(op);
	free(id);
	snprintf(want, sizeof want, "sim:0/device=%zu sim:1/device=%zu sim:2/device=%zu "
	         "sim:3/device=%zu", q, q, q, q);
	expect_spaces(want, 5000);

	/* the four devices -> one device's pageable host, as a new array */
	id = move_start("w", ":copy", "{\"out\": \"w-host\", \"device\": \"sim:0\", "
	                "\"memory_kind\": \"unpinned_host\"}", &total);
	ck_assert_int_eq(total, BIG_BYTES);
	op = watch(id, total, &w);
	ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "state")), "SUCCEEDED") == 0, "copy: %s", json_dumps(op, 0));
	ck_assert_msg(w.busy > 0, "none of %d polls of a 200 MiB copy saw it running", w.polls);
	res = th_op_result(op);
	ck_assert_str_eq(th_str(res, "name"), "w-host");
	ck_assert_int_eq(th_int(res, "version"), 1);
	ck_assert(th_bool(res, "committed"));
	ck_assert_int_eq(json_array_size(th_arr(res, "shards")), 1);
	expect_shard(res, "sim:0", "unpinned_host", BIG_BYTES, 0, BIG_ROWS, 0, BIG_COLS);
	json_decref(op);
	free(id);

	th_expect_data(&D, "w-host", NULL, data, BIG_BYTES);
	th_expect_data(&D, "w", NULL, data, BIG_BYTES);
	/* the source of a copy is untouched */
	a = meta("w", &r);
	ck_assert_int_eq(th_int(a, "version"), 2);
	ck_assert(json_equal(th_obj(a, "sharding"), grid));
	th_response_free(&r);
	snprintf(want, sizeof want, "sim:0/device=%zu sim:1/device=%zu sim:2/device=%zu "
	         "sim:3/device=%zu sim:0/unpinned_host=%zu", q, q, q, q, BIG_BYTES);
	expect_spaces(want, 5000);
	expect_exact_accounting("after the acceptance scenario");
	json_decref(grid);
	free(data);
}
END_TEST

/* ==== 2. :put ============================================================================ */

/* The default device and memory kind (from GET /v1/devices) into dev, kind. */
static void defaults(char *dev, size_t dev_cap, char *kind, size_t kind_cap)
{
	struct th_response r;
	json_t *root = th_get_json(&D, "/v1/devices", &r), *d;
	size_t i;

	snprintf(dev, dev_cap, "%s", th_str(root, "default_device"));
	kind[0] = '\0';
	json_array_foreach(th_arr(root, "devices"), i, d)
		if (strcmp(th_str(d, "id"), dev) == 0)
			snprintf(kind, kind_cap, "%s", th_str(d, "default_memory_kind"));
	ck_assert_msg(kind[0], "default device %s is not listed", dev);
	th_response_free(&r);
}

START_TEST(test_put_device_and_kind)
{
	unsigned char *data = th_pattern(512, 2);
	struct th_response r;
	char etag[80], dev[32], kind[32], body[256], want[128];
	json_t *a, *single;
	json_int_t v, total;

	th_put_array(&D, "p", "dtype=int32&shape=16,8&device=sim:0&memory_kind=unpinned_host", data, 512);
	a = meta("p", &r);
	v = th_int(a, "version");
	ck_assert(th_bool(a, "committed"));
	ck_assert_ptr_nonnull(th_header(&r, "ETag"));
	snprintf(etag, sizeof etag, "%s", th_header(&r, "ETag"));
	th_response_free(&r);

	/* ?wait=true: the answer is the moved array */
	a = move_waiting("p", ":put", "{\"device\": \"sim:2\", \"memory_kind\": \"device\"}", false);
	single = load("{\"device\": \"sim:2\", \"memory_kind\": \"device\"}");
	ck_assert_str_eq(th_str(a, "name"), "p");
	ck_assert_int_eq(th_int(a, "version"), v + 1);
	ck_assert(th_bool(a, "committed"));
	ck_assert_msg(json_equal(th_obj(a, "sharding"), single), "sharding %s",
	              json_dumps(th_obj(a, "sharding"), 0));
	ck_assert_int_eq(json_array_size(th_arr(a, "shards")), 1);
	expect_shard(a, "sim:2", "device", 512, 0, 16, 0, 8);
	json_decref(single);
	json_decref(a);

	/* GET says the same, with a new ETag */
	a = meta("p", &r);
	ck_assert_int_eq(th_int(a, "version"), v + 1);
	ck_assert_ptr_nonnull(th_header(&r, "ETag"));
	ck_assert_msg(strcmp(th_header(&r, "ETag"), etag) != 0, "ETag %s did not change", etag);
	ck_assert_str_eq(th_str(a, "etag"), th_header(&r, "ETag"));
	snprintf(etag, sizeof etag, "%s", th_header(&r, "ETag"));
	th_response_free(&r);
	th_expect_data(&D, "p", NULL, data, 512);
	expect_spaces("sim:2/device=512", 2000);

	/* Prefer: wait=5, to another device's pinned host */
	a = move_waiting("p", ":put", "{\"device\": \"sim:3\", \"memory_kind\": \"pinned_host\"}",
	                 true);
	ck_assert_int_eq(th_int(a, "version"), v + 2);
	ck_assert_msg(strcmp(th_str(a, "etag"), etag) != 0, "etag %s did not change", etag);
	expect_shard(a, "sim:3", "pinned_host", 512, 0, 16, 0, 8);
	json_decref(a);
	th_expect_data(&D, "p", NULL, data, 512);
	expect_spaces("sim:3/pinned_host=512", 2000);

	/* to where it is: nothing to copy */
	a = move_ok("p", ":put", "{\"device\": \"sim:3\", \"memory_kind\": \"pinned_host\"}", &total);
	ck_assert_int_eq(total, 0);
	expect_shard(a, "sim:3", "pinned_host", 512, 0, 16, 0, 8);
	json_decref(a);
	th_expect_data(&D, "p", NULL, data, 512);
	expect_spaces("sim:3/pinned_host=512", 2000);

	/* an array uploaded without a placement is uncommitted; a put to the
	 * placement it already has copies nothing and commits it */
	th_put_array(&D, "q", "dtype=int32&shape=16,8", data, 512);
	a = meta("q", &r);
	ck_assert(!th_bool(a, "committed"));
	th_response_free(&r);
	defaults(dev, sizeof dev, kind, sizeof kind);
	snprintf(body, sizeof body, "{\"device\": \"%s\", \"memory_kind\": \"%s\"}", dev, kind);
	a = move_ok("q", ":put", body, &total);
	ck_assert_int_eq(total, 0);
	ck_assert(th_bool(a, "committed"));
	json_decref(a);
	th_expect_data(&D, "q", NULL, data, 512);
	if (strncmp(dev, "sim:", 4) == 0) {
		snprintf(want, sizeof want, "sim:3/pinned_host=512 %s/%s=512", dev, kind);
		expect_spaces(want, 2000);
	}
	expect_exact_accounting("after the puts");
	free(data);
}
END_TEST

/* {"memory_kind": k} alone changes the memory kind and nothing else, as
 * JAX's sharding.with_memory_kind and the README's example (a put to
 * "rows4", then {"memory_kind": "pinned_host"}) have it: the array stays on
 * its devices, with its mesh and spec. */
START_TEST(test_put_memory_kind_only)
{
	unsigned char *data = th_pattern(512, 10);
	json_t *a, *want;

	th_put_array(&D, "mk", "dtype=int32&shape=16,8&device=sim:2&memory_kind=device", data, 512);
	a = move_waiting("mk", ":put", "{\"memory_kind\": \"pinned_host\"}", false);
	want = load("{\"device\": \"sim:2\", \"memory_kind\": \"pinned_host\"}");
	ck_assert_msg(json_equal(th_obj(a, "sharding"), want), "{\"memory_kind\": \"pinned_host\"} "
	              "moved an array on sim:2 to %s", json_dumps(th_obj(a, "sharding"), 0));
	json_decref(want);
	json_decref(a);
	th_expect_data(&D, "mk", NULL, data, 512);

	json_decref(move_waiting("mk", ":put", "{\"sharding\": " GRID "}", false));
	a = move_waiting("mk", ":put", "{\"memory_kind\": \"unpinned_host\"}", true);
	want = load(GRID);
	json_object_set_new(want, "memory_kind", json_string("unpinned_host"));
	ck_assert_msg(json_equal(th_obj(a, "sharding"), want), "{\"memory_kind\": \"unpinned_host\"} "
	              "made an array sharded over four devices %s", json_dumps(th_obj(a, "sharding"), 0));
	json_decref(want);
	json_decref(a);
	th_expect_data(&D, "mk", NULL, data, 512);
	expect_spaces("sim:0/unpinned_host=128 sim:1/unpinned_host=128 sim:2/unpinned_host=128 "
	              "sim:3/unpinned_host=128", 2000);
	free(data);
}
END_TEST

/* int32 [8, 6] whose element [i][j] is i * 100 + j. */
static void grid_values(int32_t *v)
{
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 6; j++)
			v[i * 6 + j] = i * 100 + j;
}

/* numpy indexes of that [8, 6] array, each dimension as start, count and
 * step after normalisation. */
static const struct {
	const char *index;
	int r0, rn, rs, c0, cn, cs;
} grid_indexes[] = {
	{"3", 3, 1, 1, 0, 6, 1},
	{"-1", 7, 1, 1, 0, 6, 1},
	{"2:6", 2, 4, 1, 0, 6, 1},
	{"3:5,1:5", 3, 2, 1, 1, 4, 1},
	{"::3,4", 0, 3, 3, 4, 1, 1},
	{"7,5", 7, 1, 1, 5, 1, 1},
	{":,2:4", 0, 8, 1, 2, 2, 1},
	{"1:8:2,::2", 1, 4, 2, 0, 3, 2},
	{"4:8,3:6", 4, 4, 1, 3, 3, 1},
	{"0:4,0:3", 0, 4, 1, 0, 3, 1},
};

static void expect_grid_indexes(const char *name, const int32_t *v)
{
	for (size_t k = 0; k < sizeof grid_indexes / sizeof grid_indexes[0]; k++) {
		int32_t want[48];
		size_t n = 0;

		for (int i = 0; i < grid_indexes[k].rn; i++)
			for (int j = 0; j < grid_indexes[k].cn; j++)
				want[n++] = v[(grid_indexes[k].r0 + i * grid_indexes[k].rs) * 6 +
				              grid_indexes[k].c0 + j * grid_indexes[k].cs];
		th_expect_data(&D, name, grid_indexes[k].index, want, n * sizeof want[0]);
	}
}

START_TEST(test_put_inline_sharding)
{
	int32_t v[48];
	struct th_response r;
	json_t *a, *grid = load(GRID);
	const char *text, *ct;
	json_int_t ver;

	grid_values(v);
	th_put_array(&D, "g", "dtype=int32&shape=8,6&device=sim:0&memory_kind=unpinned_host", v, sizeof v);
	a = meta("g", &r);
	ver = th_int(a, "version");
	th_response_free(&r);

	a = move_waiting("g", ":put", "{\"sharding\": " GRID "}", true);
	ck_assert_str_eq(th_str(a, "name"), "g");
	ck_assert_int_eq(th_int(a, "version"), ver + 1);
	ck_assert(th_bool(a, "committed"));
	ck_assert(json_equal(th_obj(a, "sharding"), grid));
	ck_assert_int_eq(json_array_size(th_arr(a, "shards")), 4);
	expect_shard(a, "sim:0", "device", 48, 0, 4, 0, 3);
	expect_shard(a, "sim:1", "device", 48, 0, 4, 3, 6);
	expect_shard(a, "sim:2", "device", 48, 4, 8, 0, 3);
	expect_shard(a, "sim:3", "device", 48, 4, 8, 3, 6);
	json_decref(a);

	/* the sharding, as JSON and as a grid of devices */
	a = th_get_json(&D, "/v1/arrays/g/sharding", &r);
	ck_assert(json_equal(th_obj(a, "sharding"), grid));
	ck_assert(th_bool(a, "committed"));
	ck_assert_int_eq(json_array_size(th_arr(a, "shards")), 4);
	expect_shard(a, "sim:3", "device", 48, 4, 8, 3, 6);
	th_response_free(&r);
	th_get(&D, "/v1/arrays/g/sharding?format=text", &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ct = th_header(&r, "Content-Type");
	ck_assert_msg(ct && strncmp(ct, "text/plain", 10) == 0, "Content-Type %s", ct ? ct : "none");
	text = r.body;
	for (int i = 0; i < 4; i++) {
		char dev[16];

		snprintf(dev, sizeof dev, "sim:%d", i);
		ck_assert_msg(strstr(text, dev), "no %s in\n%s", dev, text);
	}
	ck_assert_msg(strstr(text, "[0:4, 0:3]") && strstr(text, "[4:8, 3:6]") &&
	              strstr(text, "memory_kind: device"), "grid:\n%s", text);
	th_response_free(&r);

	th_expect_data(&D, "g", NULL, v, sizeof v);
	expect_grid_indexes("g", v);
	expect_spaces("sim:0/device=48 sim:1/device=48 sim:2/device=48 sim:3/device=48", 2000);
	expect_exact_accounting("after a sharded put");
	json_decref(grid);
}
END_TEST

#define ROWS4 "{\"mesh\": " MESH4 ", \"spec\": [\"x\", null], \"memory_kind\": \"pinned_host\"}"
#define COLS4 "{\"mesh\": {\"devices\": [\"sim:3\",\"sim:2\",\"sim:1\",\"sim:0\"], " \
	"\"axis_names\": [\"d\"], \"shape\": [4]}, \"spec\": [null, \"d\"], \"memory_kind\": \"device\"}"

static void save_sharding(const char *name, const char *sharding)
{
	struct th_response r;
	char body[1024];

	snprintf(body, sizeof body, "{\"name\": \"%s\", \"sharding\": %s}", name, sharding);
	th_post_headers(&D, "/v1/shardings", body, NULL, &r);
	ck_assert_msg(r.status == 201, "POST /v1/shardings %s: %ld %s", name, r.status, r.body);
	th_response_free(&r);
}

START_TEST(test_put_saved_sharding)
{
	float v[64];
	struct th_response r;
	json_t *a, *want;
	json_int_t ver;

	for (int i = 0; i < 64; i++)
		v[i] = (float)i * 0.5f;
	save_sharding("rows4", ROWS4);
	save_sharding("cols4", COLS4);
	th_put_array(&D, "s", "dtype=float32&shape=8,8&device=sim:1&memory_kind=device", v, sizeof v);
	a = meta("s", &r);
	ver = th_int(a, "version");
	th_response_free(&r);

	/* rows split two ways over x, each half replicated over y */
	a = move_waiting("s", ":put", "{\"sharding\": \"rows4\"}", false);
	want = load(ROWS4);
	ck_assert_msg(json_equal(th_obj(a, "sharding"), want), "sharding %s",
	              json_dumps(th_obj(a, "sharding"), 0));
	json_decref(want);
	ck_assert_int_eq(th_int(a, "version"), ver + 1);
	ck_assert_int_eq(json_array_size(th_arr(a, "shards")), 4);
	expect_shard(a, "sim:0", "pinned_host", 128, 0, 4, 0, 8);
	expect_shard(a, "sim:1", "pinned_host", 128, 0, 4, 0, 8);
	expect_shard(a, "sim:2", "pinned_host", 128, 4, 8, 0, 8);
	expect_shard(a, "sim:3", "pinned_host", 128, 4, 8, 0, 8);
	ck_assert_int_ne(th_int(shard_on(a, "sim:0"), "replica"), th_int(shard_on(a, "sim:1"), "replica"));
	json_decref(a);
	th_expect_data(&D, "s", NULL, v, sizeof v);
	th_expect_data(&D, "s", "4:8", v + 32, 32 * sizeof v[0]);
	expect_spaces("sim:0/pinned_host=128 sim:1/pinned_host=128 sim:2/pinned_host=128 "
	              "sim:3/pinned_host=128", 2000);

	/* columns split four ways, the devices in reverse order */
	a = move_waiting("s", ":put", "{\"sharding\": \"cols4\"}", true);
	ck_assert_int_eq(th_int(a, "version"), ver + 2);
	expect_shard(a, "sim:3", "device", 64, 0, 8, 0, 2);
	expect_shard(a, "sim:2", "device", 64, 0, 8, 2, 4);
	expect_shard(a, "sim:1", "device", 64, 0, 8, 4, 6);
	expect_shard(a, "sim:0", "device", 64, 0, 8, 6, 8);
	json_decref(a);
	th_expect_data(&D, "s", NULL, v, sizeof v);
	{
		float want_cols[16];

		for (int i = 0; i < 8; i++) {
			want_cols[i * 2] = v[i * 8 + 1];
			want_cols[i * 2 + 1] = v[i * 8 + 2];
		}
		th_expect_data(&D, "s", ":,1:3", want_cols, sizeof want_cols);
	}
	expect_spaces("sim:0/device=64 sim:1/device=64 sim:2/device=64 sim:3/device=64", 2000);

	/* a saved sharding derived with another memory kind */
	th_post_headers(&D, "/v1/shardings/cols4:withMemoryKind",
	     "{\"memory_kind\": \"unpinned_host\", \"name\": \"cols4-host\"}", NULL, &r);
	ck_assert_msg(r.status == 201, "%ld %s", r.status, r.body);
	th_response_free(&r);
	a = move_ok("s", ":put", "{\"sharding\": \"cols4-host\"}", NULL);
	expect_shard(a, "sim:0", "unpinned_host", 64, 0, 8, 6, 8);
	json_decref(a);
	th_expect_data(&D, "s", NULL, v, sizeof v);
	expect_spaces("sim:0/unpinned_host=64 sim:1/unpinned_host=64 sim:2/unpinned_host=64 "
	              "sim:3/unpinned_host=64", 2000);
	expect_exact_accounting("after puts by saved shardings");
}
END_TEST

/* A put shares the shards that stay where they are and copies the rest. */
START_TEST(test_put_shares_unmoved_shards)
{
	unsigned char *data = th_pattern(1024, 3);
	json_t *a;
	json_int_t total;

	th_put_array(&D, "m", "dtype=float32&shape=16,16&device=sim:0&memory_kind=device", data, 1024);
	/* replicated on sim:0 and sim:1: the sim:0 copy is the old buffer */
	a = move_ok("m", ":put", "{\"sharding\": {\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], "
	            "\"axis_names\": [\"x\"], \"shape\": [2]}, \"spec\": [null, null], "
	            "\"memory_kind\": \"device\"}}", &total);
	ck_assert_int_eq(total, 1024);
	ck_assert_int_eq(json_array_size(th_arr(a, "shards")), 2);
	expect_shard(a, "sim:0", "device", 1024, 0, 16, 0, 16);
	expect_shard(a, "sim:1", "device", 1024, 0, 16, 0, 16);
	json_decref(a);
	expect_spaces("sim:0/device=1024 sim:1/device=1024", 2000);
	th_expect_data(&D, "m", NULL, data, 1024);

	/* the same again: nothing moves */
	a = move_ok("m", ":put", "{\"sharding\": {\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], "
	            "\"axis_names\": [\"x\"], \"shape\": [2]}, \"spec\": [null, null], "
	            "\"memory_kind\": \"device\"}}", &total);
	ck_assert_int_eq(total, 0);
	json_decref(a);
	expect_spaces("sim:0/device=1024 sim:1/device=1024", 2000);

	/* to the 2x2 grid: every box differs, a quarter each */
	a = move_ok("m", ":put", "{\"sharding\": " GRID "}", &total);
	ck_assert_int_eq(total, 1024);
	json_decref(a);
	expect_spaces("sim:0/device=256 sim:1/device=256 sim:2/device=256 sim:3/device=256", 2000);
	th_expect_data(&D, "m", NULL, data, 1024);
	{
		unsigned char block[256];

		for (int i = 0; i < 8; i++)
			memcpy(block + i * 32, data + ((8 + i) * 16 + 8) * 4, 32);
		th_expect_data(&D, "m", "8:16,8:16", block, sizeof block);
	}
	expect_exact_accounting("after puts that share shards");
	free(data);
}
END_TEST

/* Every refusal comes before any operation: nothing is queued, nothing
 * allocated, the array stays as it was, whether or not the call waits. */
#define PAIR "{\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"], \"shape\": [2]}"
#define TRIO "{\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\"], \"axis_names\": [\"x\"], " \
	"\"shape\": [3]}"

START_TEST(test_put_refused)
{
	static const struct {
		const char *verb, *body;
		long http;
		const char *status, *reason, *message;
	} cases[] = {
		{":put", "{\"sharding\": {\"mesh\": " PAIR ", \"spec\": [\"x\", null]}}", 400,
		 "INVALID_ARGUMENT", "BAD_SHARDING", "dimension 0"},
		{":put", "{\"sharding\": {\"mesh\": " TRIO ", \"spec\": [null, \"x\"]}}", 400,
		 "INVALID_ARGUMENT", "BAD_SHARDING", "dimension 1"},
		{":copy", "{\"out\": \"e2\", \"sharding\": {\"mesh\": " PAIR ", \"spec\": [\"x\"]}}", 400,
		 "INVALID_ARGUMENT", "BAD_SHARDING", "dimension 0"},
		{":put", "{\"device\": \"sim:9\"}", 400, "INVALID_ARGUMENT", "DEVICE_NOT_FOUND", "sim:9"},
		{":put", "{\"device\": \"sim:9\", \"memory_kind\": \"device\"}", 400, "INVALID_ARGUMENT",
		 "DEVICE_NOT_FOUND", "sim:9"},
		{":copy", "{\"out\": \"e2\", \"device\": \"sim:9\"}", 400, "INVALID_ARGUMENT",
		 "DEVICE_NOT_FOUND", "sim:9"},
		{":put", "{\"sharding\": {\"mesh\": {\"devices\": [\"sim:0\",\"sim:7\"], "
		 "\"axis_names\": [\"x\"], \"shape\": [2]}, \"spec\": []}}", 400, "INVALID_ARGUMENT",
		 "DEVICE_NOT_FOUND", "sim:7"},
		{":put", "{\"sharding\": \"nope\"}", 404, "NOT_FOUND", "SHARDING_NOT_FOUND", "nope"},
		{":copy", "{\"out\": \"e2\", \"sharding\": \"nope\"}", 404, "NOT_FOUND",
		 "SHARDING_NOT_FOUND", "nope"},
		{":put", "{\"device\": \"sim:0\", \"memory_kind\": \"hbm\"}", 400, "INVALID_ARGUMENT",
		 "BAD_MEMORY_KIND", "hbm"},
		{":put", "{}", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", ""},
		{":put", "[1]", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", ""},
		{":put", "{\"device\": ", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", ""},
		{":put", "{\"device\": 1}", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", ""},
		{":put", "{\"device\": \"sim:1\", \"colour\": 1}", 400, "INVALID_ARGUMENT",
		 "BAD_REQUEST_BODY", "colour"},
		{":put", "{\"device\": \"sim:1\", \"sharding\": " GRID "}", 400, "INVALID_ARGUMENT",
		 "BAD_REQUEST_BODY", ""},
		{":put", "{\"out\": \"e2\", \"device\": \"sim:1\"}", 400, "INVALID_ARGUMENT",
		 "BAD_REQUEST_BODY", "out"},
		{":copy", "{\"out\": \"e2\", \"device\": \"sim:1\", \"donate\": \"yes\"}", 400,
		 "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "donate"},
		{":copy", "{\"device\": \"sim:1\"}", 400, "INVALID_ARGUMENT", "BAD_ARRAY_NAME", "out"},
		{":copy", "{\"out\": \".e\", \"device\": \"sim:1\"}", 400, "INVALID_ARGUMENT",
		 "BAD_ARRAY_NAME", "out"},
	};
	static const char *const waits[] = {"", "?wait=true", "prefer"};
	struct th_response r;
	json_t *before, *after, *a;
	char etag[80], diff[2048];
	json_int_t v;

	th_put_array(&D, "e", "dtype=uint8&shape=3,4&device=sim:0&memory_kind=unpinned_host", "abcdefghijkl", 12);
	a = meta("e", &r);
	v = th_int(a, "version");
	snprintf(etag, sizeof etag, "%s", th_str(a, "etag"));
	th_response_free(&r);
	before = spaces();

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		for (size_t k = 0; k < 3; k++) {
			char path[128];
			bool prefer = strcmp(waits[k], "prefer") == 0;

			snprintf(path, sizeof path, "/v1/arrays/e%s%s", cases[i].verb, prefer ? "" : waits[k]);
			th_post_headers(&D, path, cases[i].body, prefer ? prefer_headers : NULL, &r);
			th_assert_error(&r, cases[i].http, cases[i].status, cases[i].reason);
			ck_assert_msg(strstr(error_message(&r), cases[i].message), "POST %s %s: message '%s' "
			              "does not say '%s'", path, cases[i].body, error_message(&r),
			              cases[i].message);
			th_response_free(&r);
		}
	}
	/* an array that is not there, a bad name, a wrong method */
	th_post_headers(&D, "/v1/arrays/absent:put", "{\"device\": \"sim:1\"}", NULL, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	th_post_headers(&D, "/v1/arrays/absent:copy?wait=true", "{\"out\": \"x\", \"device\": \"sim:1\"}", NULL, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	th_post_headers(&D, "/v1/arrays/.bad:put", "{\"device\": \"sim:1\"}", NULL, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_ARRAY_NAME");
	th_response_free(&r);
	th_get(&D, "/v1/arrays/e:put", &r);
	ck_assert_int_eq(r.status, 405);
	th_response_free(&r);

	ck_assert_int_eq(op_count(), 0);
	after = spaces();
	ck_assert_msg(spaces_same(before, after, NULL, diff, sizeof diff), "the spaces changed: %s",
	              diff);
	a = meta("e", &r);
	ck_assert_int_eq(th_int(a, "version"), v);
	ck_assert_str_eq(th_str(a, "etag"), etag);
	th_response_free(&r);
	th_get(&D, "/v1/arrays/e2", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	th_expect_data(&D, "e", NULL, "abcdefghijkl", 12);
	json_decref(before);
	json_decref(after);
}
END_TEST

/* ==== 3. sharded uploads ================================================================ */

static json_int_t device_in_use(const char *dev, const char *kind)
{
	struct th_response r;
	char path[128];
	json_int_t n;

	snprintf(path, sizeof path, "/v1/devices/%s/memory_stats?memory_kind=%s", dev, kind);
	n = th_int(th_get_json(&D, path, &r), "bytes_in_use");
	th_response_free(&r);
	return n;
}

#define HALVES "{\"mesh\": " MESH4 ", \"spec\": [null, \"y\"], \"memory_kind\": \"pinned_host\"}"

START_TEST(test_sharded_upload)
{
	int32_t a[64];
	uint16_t b[128], want[32];
	char query[1024], enc[768];
	struct th_response r;
	json_t *m, *grid = load(GRID), *halves = load(HALVES);

	for (int i = 0; i < 64; i++)
		a[i] = i * 7 - 100;
	for (int i = 0; i < 128; i++)
		b[i] = (uint16_t)(i * 31 + 5);

	/* by a saved sharding's name: a quarter on each device */
	save_sharding("grid", GRID);
	th_put_array(&D, "sa", "dtype=int32&shape=8,8&sharding=grid", a, sizeof a);
	m = meta("sa", &r);
	ck_assert(th_bool(m, "committed"));
	ck_assert(json_equal(th_obj(m, "sharding"), grid));
	ck_assert_int_eq(json_array_size(th_arr(m, "shards")), 4);
	expect_shard(m, "sim:0", "device", 64, 0, 4, 0, 4);
	expect_shard(m, "sim:1", "device", 64, 0, 4, 4, 8);
	expect_shard(m, "sim:2", "device", 64, 4, 8, 0, 4);
	expect_shard(m, "sim:3", "device", 64, 4, 8, 4, 8);
	th_response_free(&r);
	th_expect_data(&D, "sa", NULL, a, sizeof a);
	{
		int32_t block[8];

		for (int i = 0; i < 4; i++) {
			block[i * 2] = a[(2 + i) * 8 + 3];
			block[i * 2 + 1] = a[(2 + i) * 8 + 4];
		}
		th_expect_data(&D, "sa", "2:6,3:5", block, sizeof block);
	}
	for (int i = 0; i < 4; i++) {
		char dev[16];

		snprintf(dev, sizeof dev, "sim:%d", i);
		ck_assert_int_eq(device_in_use(dev, "device"), 64);
		ck_assert_int_eq(device_in_use(dev, "pinned_host"), 0);
	}

	/* inline JSON: columns split over y, each half replicated over x */
	th_url_escape(enc, sizeof enc, HALVES);
	snprintf(query, sizeof query, "dtype=uint16&shape=8,16&sharding=%s", enc);
	th_put_array(&D, "sb", query, b, sizeof b);
	m = meta("sb", &r);
	ck_assert(json_equal(th_obj(m, "sharding"), halves));
	ck_assert_int_eq(json_array_size(th_arr(m, "shards")), 4);
	expect_shard(m, "sim:0", "pinned_host", 128, 0, 8, 0, 8);
	expect_shard(m, "sim:1", "pinned_host", 128, 0, 8, 8, 16);
	expect_shard(m, "sim:2", "pinned_host", 128, 0, 8, 0, 8);
	expect_shard(m, "sim:3", "pinned_host", 128, 0, 8, 8, 16);
	th_response_free(&r);
	th_expect_data(&D, "sb", NULL, b, sizeof b);
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 4; j++)
			want[i * 4 + j] = b[i * 16 + 6 + j];
	th_expect_data(&D, "sb", ":,6:10", want, sizeof want);
	for (int i = 0; i < 4; i++) {
		char dev[16];

		snprintf(dev, sizeof dev, "sim:%d", i);
		ck_assert_int_eq(device_in_use(dev, "device"), 64);
		ck_assert_int_eq(device_in_use(dev, "pinned_host"), 128);
	}

	/* a sharded array moves like any other */
	m = move_waiting("sb", ":put", "{\"sharding\": \"grid\"}", false);
	expect_shard(m, "sim:3", "device", 64, 4, 8, 8, 16);
	json_decref(m);
	th_expect_data(&D, "sb", NULL, b, sizeof b);
	expect_spaces("sim:0/device=128 sim:1/device=128 sim:2/device=128 sim:3/device=128", 2000);
	expect_exact_accounting("after sharded uploads");
	json_decref(grid);
	json_decref(halves);
}
END_TEST

/* ==== 4. operations ====================================================================== */

#define MID_BYTES (128 * MiB)

START_TEST(test_wait)
{
	char *data = calloc(1, MID_BYTES), *id, path[128];
	struct th_response r;
	long long t0, took;
	json_t *op, *a;
	json_int_t v;

	ck_assert_ptr_nonnull(data);
	th_put_array(&D, "big", "dtype=uint8&shape=134217728&device=sim:0&memory_kind=pinned_host", data,
	       MID_BYTES);
	a = meta("big", &r);
	v = th_int(a, "version");
	th_response_free(&r);

	/* a zero timeout answers at once, done or not */
	id = move_start("big", ":put", "{\"sharding\": " LINE4 "}", NULL);
	snprintf(path, sizeof path, "/v1/operations/%s:wait?timeout=0s", id);
	t0 = th_now_ms();
	th_post_headers(&D, path, "", NULL, &r);
	took = th_now_ms() - t0;
	ck_assert_msg(r.status == 200 || r.status == 202, "POST %s: %ld %s", path, r.status, r.body);
	op = th_json(&r);
	check_operation(op, "put");
	ck_assert_str_eq(json_string_value(th_op_meta(op, "id")), id);
	ck_assert_msg(took < 2000, "a zero timeout took %lld ms", took);
	if (th_bool(op, "done"))
		ck_assert_int_eq(r.status, 200);
	th_response_free(&r);

	/* a timeout in the body: the answer comes when it is done, and the
	 * array has its new version by then */
	op = op_wait(id);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	ck_assert_int_eq(th_int(th_op_result(op), "version"), v + 1);
	json_decref(op);
	a = meta("big", &r);
	ck_assert_int_eq(th_int(a, "version"), v + 1);
	ck_assert_int_eq(json_array_size(th_arr(a, "shards")), 4);
	th_response_free(&r);
	op = op_get_checked(id);
	ck_assert(th_bool(op, "done"));
	json_decref(op);

	/* waiting for what is done answers at once */
	snprintf(path, sizeof path, "/v1/operations/%s:wait?timeout=30s", id);
	t0 = th_now_ms();
	th_post_headers(&D, path, "", NULL, &r);
	ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
	ck_assert(th_bool(th_json(&r), "done"));
	ck_assert_msg(th_now_ms() - t0 < 2000, "waiting for a finished operation took %lld ms",
	              th_now_ms() - t0);
	th_response_free(&r);
	free(id);

	/* a short timeout on a running move ends the wait, not the move */
	id = move_start("big", ":put", "{\"device\": \"sim:0\", \"memory_kind\": \"pinned_host\"}",
	                NULL);
	snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
	t0 = th_now_ms();
	th_post_headers(&D, path, "{\"timeout\": \"0.05s\"}", NULL, &r);
	took = th_now_ms() - t0;
	ck_assert_msg(r.status == 200 || r.status == 202, "POST %s: %ld %s", path, r.status, r.body);
	ck_assert_msg(took < 3000, "a 0.05 s timeout took %lld ms", took);
	if (!th_bool(th_json(&r), "done"))
		ck_assert_msg(took >= 40, "not done, but answered after %lld ms of 50", took);
	th_response_free(&r);
	op = op_wait(id);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	json_decref(op);

	/* bad timeouts, unknown operations */
	{
		static const char *const bad[] = {"?timeout=abc", "?timeout=-1s", "?timeout=5000s",
		                                  "?timeout=1m"};

		for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
			snprintf(path, sizeof path, "/v1/operations/%s:wait%s", id, bad[i]);
			th_post_headers(&D, path, "", NULL, &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_TIMEOUT");
			th_response_free(&r);
		}
		snprintf(path, sizeof path, "/v1/operations/%s:wait", id);
		th_post_headers(&D, path, "{\"timeout\": \"soon\"}", NULL, &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_TIMEOUT");
		th_response_free(&r);
	}
	th_post_headers(&D, "/v1/operations/op-0123456789abcdef:wait", "", NULL, &r);
	th_assert_error(&r, 404, "NOT_FOUND", "OPERATION_NOT_FOUND");
	th_response_free(&r);
	free(id);
	free(data);
	expect_exact_accounting("after waits");
}
END_TEST

START_TEST(test_cancel_finished)
{
	struct th_response r;
	char path[96], *id;
	json_t *op;

	th_put_array(&D, "k", "dtype=uint8&shape=64&device=sim:0&memory_kind=device",
	       "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 64);
	id = move_start("k", ":put", "{\"device\": \"sim:1\"}", NULL);
	json_decref(op_wait(id));
	snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
	th_request(&D, "POST", path, NULL, NULL, 0, &r);
	th_assert_error(&r, 400, "FAILED_PRECONDITION", "OPERATION_FINISHED");
	ck_assert_msg(strstr(error_message(&r), id), "message does not name %s: %s", id, r.body);
	th_response_free(&r);
	op = op_get_checked(id);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	json_decref(op);
	free(id);
}
END_TEST

START_TEST(test_cancel_running)
{
	char *data = th_pattern(BIG_BYTES, 6), *id, path[96], etag[80], want[128];
	struct th_response r;
	json_t *op, *a, *grid = load(GRID);
	const char *state;
	json_int_t v;

	th_put_array(&D, "c", "dtype=float32&shape=4096,12800&device=sim:0&memory_kind=pinned_host", data,
	       BIG_BYTES);
	a = meta("c", &r);
	v = th_int(a, "version");
	snprintf(etag, sizeof etag, "%s", th_str(a, "etag"));
	th_response_free(&r);
	snprintf(want, sizeof want, "sim:0/pinned_host=%zu", BIG_BYTES);
	expect_spaces(want, 2000);

	id = move_start("c", ":put", "{\"sharding\": " GRID "}", NULL);
	snprintf(path, sizeof path, "/v1/operations/%s:cancel", id);
	th_request(&D, "POST", path, NULL, NULL, 0, &r);
	if (r.status == 200) {
		check_operation(th_json(&r), "put");
		ck_assert_str_eq(json_string_value(th_op_meta(th_json(&r), "id")), id);
	} else {
		th_assert_error(&r, 400, "FAILED_PRECONDITION", "OPERATION_FINISHED");
	}
	th_response_free(&r);

	op = op_wait(id);
	state = json_string_value(th_op_meta(op, "state"));
	if (strcmp(state, "CANCELLED") == 0) {
		/* the array is where and what it was; the new buffers went back */
		json_t *err = th_obj(op, "error");

		ck_assert_str_eq(th_str(err, "status"), "CANCELLED");
		ck_assert_int_eq(th_int(err, "code"), 499);
		ck_assert_ptr_null(json_object_get(op, "response"));
		a = meta("c", &r);
		ck_assert_int_eq(th_int(a, "version"), v);
		ck_assert_str_eq(th_str(a, "etag"), etag);
		ck_assert_str_eq(th_str(th_obj(a, "sharding"), "device"), "sim:0");
		ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), "pinned_host");
		th_response_free(&r);
		expect_spaces(want, 5000);
	} else {
		/* it finished before the cancel reached it: then it is whole */
		ck_assert_msg(strcmp(state, "SUCCEEDED") == 0, "state %s: %s", state, json_dumps(op, 0));
		a = meta("c", &r);
		ck_assert_int_eq(th_int(a, "version"), v + 1);
		ck_assert(json_equal(th_obj(a, "sharding"), grid));
		th_response_free(&r);
	}
	json_decref(op);
	th_expect_data(&D, "c", NULL, data, BIG_BYTES);
	expect_exact_accounting("after a cancelled move");

	/* the array is free to move again */
	a = move_waiting("c", ":put", "{\"device\": \"sim:1\", \"memory_kind\": \"unpinned_host\"}",
	                 false);
	expect_shard(a, "sim:1", "unpinned_host", BIG_BYTES, 0, BIG_ROWS, 0, BIG_COLS);
	json_decref(a);
	th_expect_data(&D, "c", NULL, data, BIG_BYTES);
	snprintf(want, sizeof want, "sim:1/unpinned_host=%zu", BIG_BYTES);
	expect_spaces(want, 5000);
	json_decref(grid);
	free(id);
	free(data);
}
END_TEST

START_TEST(test_busy)
{
	char *data = calloc(1, BIG_BYTES), *id;
	static const struct {
		const char *path, *body;
		bool prefer;
	} second[] = {
		{"/v1/arrays/b:put", "{\"device\": \"sim:1\"}", false},
		{"/v1/arrays/b:put?wait=true", "{\"device\": \"sim:1\"}", false},
		{"/v1/arrays/b:put", "{\"sharding\": " GRID "}", true},
		{"/v1/arrays/b:copy", "{\"out\": \"b2\", \"device\": \"sim:2\"}", false},
		{"/v1/arrays/b:copy?wait=true", "{\"out\": \"b2\", \"device\": \"sim:2\"}", false},
	};
	struct th_response r;
	json_t *op, *a, *info;
	json_int_t v;

	ck_assert_ptr_nonnull(data);
	th_put_array(&D, "b", "dtype=float32&shape=4096,12800&device=sim:0&memory_kind=pinned_host", data,
	       BIG_BYTES);
	a = meta("b", &r);
	v = th_int(a, "version");
	th_response_free(&r);

	id = move_start("b", ":put", "{\"sharding\": " GRID "}", NULL);
	for (size_t i = 0; i < sizeof second / sizeof second[0]; i++) {
		th_post_headers(&D, second[i].path, second[i].body, second[i].prefer ? prefer_headers : NULL, &r);
		th_assert_error(&r, 409, "ABORTED", "TARGET_BUSY");
		ck_assert_msg(strstr(error_message(&r), id), "%s: message does not name %s: %s",
		              second[i].path, id, r.body);
		info = json_array_get(th_arr(th_obj(th_json(&r), "error"), "details"), 0);
		ck_assert_str_eq(th_str(th_obj(info, "metadata"), "operation"), id);
		th_response_free(&r);
	}
	op = op_get_checked(id);
	ck_assert_msg(!th_bool(op, "done"), "the first move ended before the refusals were all "
	              "made: the test proves nothing (make the array bigger)");
	json_decref(op);
	ck_assert_int_eq(op_count(), 1);

	op = op_wait(id);
	ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
	json_decref(op);
	a = meta("b", &r);
	ck_assert_int_eq(th_int(a, "version"), v + 1);
	th_response_free(&r);
	th_get(&D, "/v1/arrays/b2", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);

	/* once it is done, the next move is taken */
	a = move_waiting("b", ":put", "{\"device\": \"sim:1\", \"memory_kind\": \"pinned_host\"}",
	                 false);
	ck_assert_int_eq(th_int(a, "version"), v + 2);
	json_decref(a);
	free(id);
	free(data);
	expect_exact_accounting("after busy refusals");
}
END_TEST

START_TEST(test_list_newest_first)
{
	static const char *const kinds[] = {"put", "copy", "put"};
	int32_t v[64];
	char *ids[3];
	struct th_response r;
	json_t *list, *op;
	size_t i;

	for (i = 0; i < 64; i++)
		v[i] = (int32_t)i;
	th_put_array(&D, "l", "dtype=int32&shape=8,8&device=sim:0&memory_kind=unpinned_host", v, sizeof v);
	ids[0] = move_start("l", ":put", "{\"device\": \"sim:1\", \"memory_kind\": \"device\"}", NULL);
	json_decref(op_wait(ids[0]));
	ids[1] = move_start("l", ":copy", "{\"out\": \"l2\", \"device\": \"sim:2\", "
	                    "\"memory_kind\": \"pinned_host\"}", NULL);
	json_decref(op_wait(ids[1]));
	ids[2] = move_start("l", ":put", "{\"sharding\": " GRID "}", NULL);
	json_decref(op_wait(ids[2]));

	list = th_arr(th_get_json(&D, "/v1/operations", &r), "operations");
	ck_assert_int_eq(json_array_size(list), 3);
	json_array_foreach(list, i, op) {
		check_operation(op, kinds[2 - i]);
		ck_assert_str_eq(json_string_value(th_op_meta(op, "id")), ids[2 - i]);
		ck_assert_str_eq(json_string_value(th_op_meta(op, "target")), "l");
		ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
		if (i > 0)
			ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "create_time")),
			                     json_string_value(th_op_meta(json_array_get(list, i - 1), "create_time"))) <= 0,
			              "create_time goes forward down the list");
	}
	th_response_free(&r);

	list = th_arr(th_get_json(&D, "/v1/operations?state=SUCCEEDED&page_size=2", &r), "operations");
	ck_assert_int_eq(json_array_size(list), 2);
	ck_assert_str_eq(json_string_value(th_op_meta(json_array_get(list, 0), "id")), ids[2]);
	ck_assert_str_eq(json_string_value(th_op_meta(json_array_get(list, 1), "id")), ids[1]);
	th_response_free(&r);
	list = th_arr(th_get_json(&D, "/v1/operations?state=RUNNING", &r), "operations");
	ck_assert_int_eq(json_array_size(list), 0);
	th_response_free(&r);
	th_expect_data(&D, "l", NULL, v, sizeof v);
	th_expect_data(&D, "l2", NULL, v, sizeof v);
	for (i = 0; i < 3; i++)
		free(ids[i]);
}
END_TEST

/* An array replaced or deleted while it moves keeps what happened to it:
 * the put is dropped (FAILED, ABORTED) and its new buffers go back; a copy
 * reads the version it started from and still makes its array. */
START_TEST(test_changed_while_moving)
{
	char *data = th_pattern(BIG_BYTES, 7), *id, want[256];
	struct th_response r;
	json_t *op, *err, *a;

	th_put_array(&D, "x", "dtype=float32&shape=4096,12800&device=sim:0&memory_kind=pinned_host", data,
	       BIG_BYTES);

	/* replaced by an upload */
	id = move_start("x", ":put", "{\"sharding\": " GRID "}", NULL);
	th_put_array(&D, "x", "dtype=uint8&shape=4&device=sim:1&memory_kind=unpinned_host", "abcd", 4);
	op = op_wait(id);
	ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "state")), "FAILED") == 0, "a put of a replaced array: %s",
	              json_dumps(op, 0));
	err = th_obj(op, "error");
	ck_assert_str_eq(th_str(err, "status"), "ABORTED");
	ck_assert_str_eq(th_str(json_array_get(th_arr(err, "details"), 0), "reason"), "ARRAY_CHANGED");
	json_decref(op);
	free(id);
	a = meta("x", &r);
	ck_assert_int_eq(th_int(a, "nbytes"), 4);
	th_response_free(&r);
	th_expect_data(&D, "x", NULL, "abcd", 4);
	expect_spaces("sim:1/unpinned_host=4", 5000);

	/* deleted */
	th_put_array(&D, "x", "dtype=float32&shape=4096,12800&device=sim:0&memory_kind=pinned_host", data,
	       BIG_BYTES);
	id = move_start("x", ":put", "{\"sharding\": " GRID "}", NULL);
	th_request(&D, "DELETE", "/v1/arrays/x", NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "DELETE: %ld %s", r.status, r.body);
	th_response_free(&r);
	op = op_wait(id);
	ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "state")), "FAILED") == 0, "a put of a deleted array: %s",
	              json_dumps(op, 0));
	ck_assert_str_eq(th_str(th_obj(op, "error"), "status"), "ABORTED");
	json_decref(op);
	free(id);
	th_get(&D, "/v1/arrays/x", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	expect_spaces("", 5000);

	/* a copy whose source goes while it runs */
	th_put_array(&D, "x", "dtype=float32&shape=4096,12800&device=sim:0&memory_kind=pinned_host", data,
	       BIG_BYTES);
	id = move_start("x", ":copy", "{\"out\": \"x-copy\", \"sharding\": " GRID "}", NULL);
	th_request(&D, "DELETE", "/v1/arrays/x", NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "DELETE: %ld %s", r.status, r.body);
	th_response_free(&r);
	op = op_wait(id);
	ck_assert_msg(strcmp(json_string_value(th_op_meta(op, "state")), "SUCCEEDED") == 0, "a copy of a deleted array: %s",
	              json_dumps(op, 0));
	json_decref(op);
	free(id);
	th_expect_data(&D, "x-copy", NULL, data, BIG_BYTES);
	snprintf(want, sizeof want, "sim:0/device=%zu sim:1/device=%zu sim:2/device=%zu "
	         "sim:3/device=%zu", BIG_BYTES / 4, BIG_BYTES / 4, BIG_BYTES / 4, BIG_BYTES / 4);
	expect_spaces(want, 5000);
	expect_exact_accounting("after arrays changed while moving");
	free(data);
}
END_TEST

/* A copy that donates its source: the new array, and the source gone. */
START_TEST(test_copy_donate)
{
	unsigned char *data = th_pattern(4096, 8);
	struct th_response r;
	json_t *a;

	th_put_array(&D, "d", "dtype=uint32&shape=32,32&device=sim:2&memory_kind=device", data, 4096);
	a = move_waiting("d", ":copy", "{\"out\": \"d2\", \"sharding\": " GRID ", "
	                 "\"donate\": true}", false);
	ck_assert_str_eq(th_str(a, "name"), "d2");
	ck_assert_int_eq(th_int(a, "version"), 1);
	json_decref(a);
	th_get(&D, "/v1/arrays/d", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);
	th_expect_data(&D, "d2", NULL, data, 4096);
	expect_spaces("sim:0/device=1024 sim:1/device=1024 sim:2/device=1024 sim:3/device=1024",
	              5000);

	/* donate false (or left out) keeps it */
	a = move_waiting("d2", ":copy", "{\"out\": \"d3\", \"device\": \"sim:1\", "
	                 "\"memory_kind\": \"pinned_host\", \"donate\": false}", true);
	json_decref(a);
	th_expect_data(&D, "d2", NULL, data, 4096);
	th_expect_data(&D, "d3", NULL, data, 4096);
	expect_exact_accounting("after donating copies");
	free(data);
}
END_TEST

/* With every worker busy, a move waits its turn (PENDING); cancelled then,
 * it ends at once and gives back what its admission took. */
#define PEND_ARRAYS 6
#define PEND_BYTES (40 * MiB)

START_TEST(test_cancel_pending)
{
	char *data = th_pattern(PEND_BYTES, 9), *ids[PEND_ARRAYS], name[16], path[96];
	struct th_response r;
	json_t *op;
	int pending = -1;
	bool cancelled = false;

	for (int i = 0; i < PEND_ARRAYS; i++) {
		snprintf(name, sizeof name, "q%d", i);
		th_put_array(&D, name, "dtype=uint8&shape=41943040&device=sim:0&memory_kind=pinned_host", data,
		       PEND_BYTES);
	}
	for (int i = 0; i < PEND_ARRAYS; i++) {
		snprintf(name, sizeof name, "q%d", i);
		ids[i] = move_start(name, ":put", "{\"sharding\": " LINE4 "}", NULL);
	}
	/* the last one queued behind the others, if they are still at work */
	op = op_get_checked(ids[PEND_ARRAYS - 1]);
	if (strcmp(json_string_value(th_op_meta(op, "state")), "PENDING") == 0)
		pending = PEND_ARRAYS - 1;
	json_decref(op);
	snprintf(path, sizeof path, "/v1/operations/%s:cancel", ids[PEND_ARRAYS - 1]);
	th_request(&D, "POST", path, NULL, NULL, 0, &r);
	if (r.status == 200) {
		op = th_json(&r);
		check_operation(op, "put");
		/* unless a worker took it in between, it is over at once */
		if (pending >= 0 && strcmp(json_string_value(th_op_meta(op, "state")), "RUNNING") != 0)
			ck_assert_msg(th_bool(op, "done") && strcmp(json_string_value(th_op_meta(op, "state")), "CANCELLED") == 0,
			              "a pending move, cancelled: %s", r.body);
		cancelled = strcmp(json_string_value(th_op_meta(op, "state")), "CANCELLED") == 0;
	} else {
		th_assert_error(&r, 400, "FAILED_PRECONDITION", "OPERATION_FINISHED");
	}
	th_response_free(&r);
	for (int i = 0; i < PEND_ARRAYS; i++) {
		op = op_wait(ids[i]);
		if (i < PEND_ARRAYS - 1)
			ck_assert_str_eq(json_string_value(th_op_meta(op, "state")), "SUCCEEDED");
		json_decref(op);
		free(ids[i]);
	}
	op = th_get_json(&D, "/v1/operations?state=CANCELLED", &r);
	if (cancelled)
		ck_assert_msg(json_array_size(th_arr(op, "operations")) == 1, "a pending move, "
		              "cancelled, is not listed as CANCELLED: %s", r.body);
	th_response_free(&r);
	if (cancelled) {
		snprintf(name, sizeof name, "q%d", PEND_ARRAYS - 1);
		op = meta(name, &r);
		ck_assert_int_eq(th_int(op, "version"), 1);
		ck_assert_str_eq(th_str(th_obj(op, "sharding"), "memory_kind"), "pinned_host");
		th_response_free(&r);
	}
	for (int i = 0; i < PEND_ARRAYS; i++) {
		snprintf(name, sizeof name, "q%d", i);
		th_expect_data(&D, name, NULL, data, PEND_BYTES);
	}
	expect_exact_accounting("after a cancelled pending move");
	free(data);
}
END_TEST

/* ==== 5. admission ========================================================================= */

START_TEST(test_admission)
{
	static const struct {
		const char *verb, *body, *space;
		unsigned long long requested;
	} cases[] = {
		{":put", "{\"device\": \"sim:1\", \"memory_kind\": \"device\"}", "sim:1/device",
		 128 * MiB},
		{":copy", "{\"out\": \"h2\", \"device\": \"sim:1\", \"memory_kind\": \"device\"}",
		 "sim:1/device", 128 * MiB},
		/* two halves: sim:0 has room for its half, sim:1 has not */
		{":put", "{\"sharding\": {\"mesh\": " PAIR ", \"spec\": [\"x\"], "
		 "\"memory_kind\": \"device\"}}", "sim:1/device", 64 * MiB},
		{":copy", "{\"out\": \"h2\", \"sharding\": {\"mesh\": " PAIR ", \"spec\": [\"x\"], "
		 "\"memory_kind\": \"device\"}}", "sim:1/device", 64 * MiB},
		/* a whole replica each */
		{":put", "{\"sharding\": {\"mesh\": " PAIR ", \"spec\": [null], "
		 "\"memory_kind\": \"device\"}}", "sim:1/device", 128 * MiB},
	};
	static const char *const waits[] = {"", "?wait=true", "prefer"};
	static const char *const transient_stats[] = {"peak_bytes_in_use", "num_allocs",
	                                              "largest_alloc_size", "peak_bytes_reserved",
	                                              NULL};
	char *fill_bytes = calloc(1, 200 * MiB), *h = calloc(1, MID_BYTES), diff[1500];
	char transient[2200] = "";
	struct th_response r;
	json_t *before, *after, *a;
	json_int_t v;
	size_t ops;

	ck_assert(fill_bytes && h);
	th_put_array(&D, "fill", "dtype=uint8&shape=209715200&device=sim:1&memory_kind=device", fill_bytes,
	       200 * MiB);
	th_put_array(&D, "h", "dtype=uint8&shape=134217728&device=sim:0&memory_kind=unpinned_host", h,
	       MID_BYTES);
	expect_spaces("sim:1/device=209715200 sim:0/unpinned_host=134217728", 5000);
	a = meta("h", &r);
	v = th_int(a, "version");
	th_response_free(&r);
	ops = op_count();
	before = spaces();

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		for (size_t k = 0; k < 3; k++) {
			bool prefer = strcmp(waits[k], "prefer") == 0;
			char path[128], requested[32];
			long long t0 = th_now_ms();
			json_t *info, *md, *req;

			snprintf(path, sizeof path, "/v1/arrays/h%s%s", cases[i].verb, prefer ? "" : waits[k]);
			th_post_headers(&D, path, cases[i].body, prefer ? prefer_headers : NULL, &r);
			th_assert_error(&r, 429, "RESOURCE_EXHAUSTED", "OUT_OF_MEMORY");
			ck_assert_msg(th_now_ms() - t0 < 3000, "POST %s: refused after %lld ms", path,
			              th_now_ms() - t0);
			info = json_array_get(th_arr(th_obj(th_json(&r), "error"), "details"), 0);
			md = th_obj(info, "metadata");
			ck_assert_str_eq(th_str(md, "space"), cases[i].space);
			req = json_object_get(md, "requested_bytes");
			snprintf(requested, sizeof requested, "%llu", cases[i].requested);
			ck_assert_msg(req && ((json_is_string(req) && strcmp(json_string_value(req), requested) == 0) ||
			                      (json_is_integer(req) &&
			                       (unsigned long long)json_integer_value(req) == cases[i].requested)),
			              "POST %s %s: requested_bytes in %s, want %s", path, cases[i].body,
			              r.body, requested);
			th_response_free(&r);

			/* nothing is held; and nothing was, not even for a moment (the
			 * counters of what happened say so; checked last, so that one
			 * failure does not hide the others) */
			after = spaces();
			ck_assert_msg(spaces_same(before, after, transient_stats, diff, sizeof diff),
			              "POST %s %s changed the spaces: %s", path, cases[i].body, diff);
			if (!transient[0] && !spaces_same(before, after, NULL, diff, sizeof diff))
				snprintf(transient, sizeof transient, "POST %s %s: %s", path, cases[i].body,
				         diff);
			json_decref(after);
		}
	}
	ck_assert_int_eq(op_count(), ops);
	a = meta("h", &r);
	ck_assert_int_eq(th_int(a, "version"), v);
	th_response_free(&r);
	th_get(&D, "/v1/arrays/h2", &r);
	th_assert_error(&r, 404, "NOT_FOUND", "ARRAY_NOT_FOUND");
	th_response_free(&r);

	/* and what fits is still taken */
	a = move_waiting("h", ":put", "{\"sharding\": " LINE4 "}", false);
	ck_assert_int_eq(th_int(a, "version"), v + 1);
	json_decref(a);
	expect_exact_accounting("after admission refusals");
	ck_assert_msg(!transient[0], "a refused move allocated, then freed: %s", transient);
	json_decref(before);
	free(fill_bytes);
	free(h);
}
END_TEST

/* ==== 6. and 7. workloads =================================================================== */

/* Whether an answer is one that allowed lists: "202 404:ARRAY_NOT_FOUND"
 * names a status, or a status and the ErrorInfo reason it must carry.
 * Safe from any thread. */
static bool answer_ok(long status, const char *body, size_t len, const char *allowed)
{
	char reason[64] = "";
	const char *p = allowed;

	if (status >= 400) {
		json_t *j = json_loadb(body, len, 0, NULL);
		json_t *details = json_object_get(json_object_get(j, "error"), "details");
		const char *rs = json_string_value(json_object_get(json_array_get(details, 0), "reason"));

		if (rs)
			snprintf(reason, sizeof reason, "%s", rs);
		json_decref(j);
	}
	while (*p) {
		char *end;
		long code = strtol(p, &end, 10);
		size_t rlen = 0;
		const char *want = NULL;

		if (end == p)
			return false;
		if (*end == ':') {
			want = end + 1;
			rlen = strcspn(want, " ");
			end = (char *)want + rlen;
		}
		if (code == status && (!want || (strlen(reason) == rlen && strncmp(reason, want, rlen) == 0)))
			return true;
		p = end;
		while (*p == ' ')
			p++;
	}
	return false;
}

static const char *const kinds[] = {"device", "pinned_host", "unpinned_host"};

/* A placement drawn at random over the four devices and three memory kinds:
 * one device, or a mesh of two, four in a line or 2x2, with a spec that
 * splits, replicates or both. Every shape the workloads make has both
 * dimensions a multiple of 4 (or 0), so every placement fits it evenly. */
struct place {
	char body[600];                 /* the fields for a :put or :copy body */
	char query[1400];               /* the same for an upload */
	char device[16];                /* a single device and kind, for gathers */
	const char *kind;
};

static void random_place(uint64_t *s, struct place *p)
{
	static const char *const spec1[] = {"[\"x\", null]", "[null, \"x\"]", "[null, null]",
	                                    "[\"x\"]", "[]"};
	static const char *const spec2[] = {"[\"x\", \"y\"]", "[\"y\", \"x\"]", "[\"x\", null]",
	                                    "[null, \"y\"]", "[[\"x\", \"y\"], null]",
	                                    "[null, [\"y\", \"x\"]]", "[]"};
	uint64_t r = th_rand(s);
	int d[4] = {0, 1, 2, 3};
	char sharding[512], enc[1300];

	for (int i = 3; i > 0; i--) {
		int j = (int)(th_rand(s) % (uint64_t)(i + 1)), t = d[i];

		d[i] = d[j];
		d[j] = t;
	}
	p->kind = kinds[r % 3];
	snprintf(p->device, sizeof p->device, "sim:%d", d[0]);
	switch ((r >> 8) % 4) {
	case 0:
		snprintf(p->body, sizeof p->body, "\"device\": \"sim:%d\", \"memory_kind\": \"%s\"", d[0],
		         p->kind);
		snprintf(p->query, sizeof p->query, "device=sim:%d&memory_kind=%s", d[0], p->kind);
		return;
	case 1:
		snprintf(sharding, sizeof sharding, "{\"mesh\": {\"devices\": [\"sim:%d\",\"sim:%d\"], "
		         "\"axis_names\": [\"x\"], \"shape\": [2]}, \"spec\": %s, \"memory_kind\": \"%s\"}",
		         d[0], d[1], spec1[(r >> 16) % 5], p->kind);
		break;
	case 2:
		snprintf(sharding, sizeof sharding, "{\"mesh\": {\"devices\": [\"sim:%d\",\"sim:%d\","
		         "\"sim:%d\",\"sim:%d\"], \"axis_names\": [\"x\"], \"shape\": [4]}, \"spec\": %s, "
		         "\"memory_kind\": \"%s\"}", d[0], d[1], d[2], d[3], spec1[(r >> 16) % 5], p->kind);
		break;
	default:
		snprintf(sharding, sizeof sharding, "{\"mesh\": {\"devices\": [\"sim:%d\",\"sim:%d\","
		         "\"sim:%d\",\"sim:%d\"], \"axis_names\": [\"x\",\"y\"], \"shape\": [2,2]}, "
		         "\"spec\": %s, \"memory_kind\": \"%s\"}", d[0], d[1], d[2], d[3],
		         spec2[(r >> 16) % 7], p->kind);
		break;
	}
	snprintf(p->body, sizeof p->body, "\"sharding\": %s", sharding);
	th_url_escape(enc, sizeof enc, sharding);
	snprintf(p->query, sizeof p->query, "sharding=%s", enc);
}

/* Rows and columns (4-byte elements) of an upload: mostly small, now and
 * then 1 or 4 MiB, so that some moves are still running when cancelled. */
static void random_shape(uint64_t *s, size_t *rows, size_t *cols, size_t big_rows)
{
	static const size_t small[] = {4, 8, 12, 16, 32};
	static const size_t widths[] = {4, 8, 16};
	uint64_t r = th_rand(s);

	*cols = widths[r % 3];
	switch ((r >> 8) % 10) {
	case 0:
		*rows = big_rows;
		*cols = 16;
		break;
	case 1:
		*rows = big_rows / 4;
		break;
	default:
		*rows = small[(r >> 16) % 5];
		break;
	}
}

/* A new upload body of rows x cols 4-byte elements (caller frees). */
static unsigned char *random_rows(uint64_t *s, size_t rows, size_t cols)
{
	unsigned char *data = malloc(rows * cols * 4 + 1);

	if (data)
		rows_fill(data, rows, cols * 4, th_rand(s));
	return data;
}

/* The body of a gather of a slice of rows (multiples of 4, so the result
 * still divides evenly; it may be empty) to one device (new in buf). */
static void gather_body(uint64_t *s, const char *out, const struct place *p, char *buf,
                        size_t cap)
{
	uint64_t r = th_rand(s);
	int start = (int)(r % 2) * 4, stop = start + 4 * (1 + (int)((r >> 4) % 3));

	snprintf(buf, cap, "{\"rows\": {\"start\": %d, \"stop\": %d}, \"out\": {\"name\": \"%s\", "
	         "\"device\": \"%s\", \"memory_kind\": \"%s\"}}", start, stop, out, p->device,
	         p->kind);
}

/* Every operation the daemon lists has finished, and each one ended in a
 * way a move may end: SUCCEEDED with its result, CANCELLED, or FAILED
 * because its array changed or went while it moved. */
static void expect_all_finished(void)
{
	struct th_response r;
	json_t *list, *op;
	size_t i;

	list = th_arr(th_get_json(&D, "/v1/operations?page_size=1000", &r), "operations");
	json_array_foreach(list, i, op) {
		const char *state = json_string_value(th_op_meta(op, "state"));

		check_operation(op, NULL);
		ck_assert_msg(th_bool(op, "done"), "operation %s is %s", json_string_value(th_op_meta(op, "id")), state);
		if (strcmp(state, "CANCELLED") == 0) {
			ck_assert_str_eq(th_str(th_obj(op, "error"), "status"), "CANCELLED");
		} else if (strcmp(state, "FAILED") == 0) {
			json_t *err = th_obj(op, "error");
			json_t *info = json_array_get(th_arr(err, "details"), 0);

			ck_assert_msg(strcmp(th_str(err, "status"), "ABORTED") == 0 &&
			              strcmp(th_str(info, "reason"), "ARRAY_CHANGED") == 0,
			              "operation %s failed: %s", json_string_value(th_op_meta(op, "id")), json_dumps(err, 0));
		}
	}
	th_response_free(&r);
}

/* Waits for every operation that is not done (the list's PENDING and
 * RUNNING ones), until there are none. */
static void wait_all_operations(void)
{
	static const char *const paths[] = {"/v1/operations?state=PENDING&page_size=1000",
	                                    "/v1/operations?state=RUNNING&page_size=1000"};
	long long deadline = th_now_ms() + 120000;
	bool any = true;

	while (any) {
		any = false;
		ck_assert_msg(th_now_ms() < deadline, "operations still not done after 120 s");
		for (size_t k = 0; k < 2; k++) {
			struct th_response r;
			json_t *list, *op;
			size_t i;

			list = th_arr(th_get_json(&D, paths[k], &r), "operations");
			json_array_foreach(list, i, op) {
				any = true;
				json_decref(op_wait(json_string_value(th_op_meta(op, "id"))));
			}
			th_response_free(&r);
		}
	}
}

/* Every array listed downloads as whole rows, as many bytes as it says. */
static void expect_arrays_whole(const char *when)
{
	struct th_response r, d;
	json_t *list, *a;
	size_t i;

	list = th_arr(th_get_json(&D, "/v1/arrays?page_size=1000", &r), "arrays");
	json_array_foreach(list, i, a) {
		char path[300], why[300] = "";

		snprintf(path, sizeof path, "/v1/arrays/%s/data", th_str(a, "name"));
		th_get(&D, path, &d);
		ck_assert_msg(d.status == 200, "%s: GET %s: %ld %s", when, path, d.status, d.body);
		ck_assert_msg((json_int_t)d.body_len == th_int(a, "nbytes"), "%s: GET %s: %zu bytes, "
		              "its metadata says %lld", when, path, d.body_len,
		              (long long)th_int(a, "nbytes"));
		ck_assert_msg(rows_valid((unsigned char *)d.body, d.body_len, why, sizeof why),
		              "%s: GET %s: %s", when, path, why);
		th_response_free(&d);
	}
	th_response_free(&r);
}

/* ---- 6. a seeded random sequence ------------------------------------------------------- */

#define SEQ_STEPS 150
#define SEQ_PENDING 64

static const char *const seq_names[] = {"r0", "r1", "r2", "r3", "r4"};

struct seq {
	uint64_t seed;
	int step;
	char what[2200];                /* the step being taken, for messages */
	char pending[SEQ_PENDING][40];  /* operations started and not yet waited for */
	int npending;
	unsigned started, moved, waited, finished_ok, cancelled, gathered, uploads;
};

static void seq_expect(struct seq *q, struct th_response *r, const char *allowed)
{
	ck_assert_msg(answer_ok(r->status, r->body, r->body_len, allowed),
	              "step %d, %s: %ld %.500s (want %s)", q->step, q->what, r->status, r->body,
	              allowed);
}

static void seq_wait_one(struct seq *q, int i)
{
	json_t *op = op_wait(q->pending[i]);

	if (strcmp(json_string_value(th_op_meta(op, "state")), "SUCCEEDED") == 0)
		q->finished_ok++;
	else if (strcmp(json_string_value(th_op_meta(op, "state")), "CANCELLED") == 0)
		q->cancelled++;
	json_decref(op);
	q->waited++;
	memcpy(q->pending[i], q->pending[--q->npending], sizeof q->pending[0]);
}

static void seq_push(struct seq *q, struct th_response *r)
{
	json_t *op = th_json(r);

	check_operation(op, NULL);
	if (q->npending == SEQ_PENDING)
		seq_wait_one(q, 0);
	snprintf(q->pending[q->npending++], sizeof q->pending[0], "%s", json_string_value(th_op_meta(op, "id")));
	q->started++;
}

/* Cancels the i-th pending operation (it stays pending until waited for). */
static void seq_cancel(struct seq *q, int i)
{
	struct th_response r;
	char path[96];

	snprintf(path, sizeof path, "/v1/operations/%s:cancel", q->pending[i]);
	snprintf(q->what, sizeof q->what, "POST %s", path);
	th_request(&D, "POST", path, NULL, NULL, 0, &r);
	seq_expect(q, &r, "200 400:OPERATION_FINISHED");
	th_response_free(&r);
}

/* :put or :copy of name, without waiting, with ?wait=true or with Prefer. */
static void seq_move(struct seq *q, const char *name, const char *verb, const char *fields)
{
	static const char *const now_allowed = "202 404:ARRAY_NOT_FOUND 409:TARGET_BUSY";
	static const char *const wait_allowed =
		"200 202 404:ARRAY_NOT_FOUND 409:TARGET_BUSY 409:ARRAY_CHANGED";
	uint64_t r = th_rand(&q->seed);
	unsigned mode = (unsigned)(r % 4 < 2 ? 0 : r % 4 - 1);
	struct th_response resp;
	char path[128], body[1200];

	snprintf(path, sizeof path, "/v1/arrays/%s%s%s", name, verb, mode == 1 ? "?wait=true" : "");
	snprintf(body, sizeof body, "{%s}", fields);
	snprintf(q->what, sizeof q->what, "POST %s%s %s", path, mode == 2 ? " (Prefer: wait=5)" : "",
	         body);
	th_post_headers(&D, path, body, mode == 2 ? prefer_headers : NULL, &resp);
	seq_expect(q, &resp, mode == 0 ? now_allowed : wait_allowed);
	if (resp.status == 200 || resp.status == 202)
		q->moved++;
	if (resp.status == 202) {
		seq_push(q, &resp);
		if ((r >> 8) % 3 == 0)
			seq_cancel(q, q->npending - 1);
	} else if (resp.status == 200) {
		ck_assert_msg(json_object_get(th_json(&resp), "shards") != NULL, "step %d, %s: %s",
		              q->step, q->what, resp.body);
	}
	th_response_free(&resp);
}

static void seq_step(struct seq *q)
{
	uint64_t r = th_rand(&q->seed);
	const char *name = seq_names[r % 5], *out = seq_names[(r >> 4) % 5];
	unsigned what = (unsigned)((r >> 8) % 100);
	char path[2048], body[1024], fields[1024], why[300] = "";
	struct th_response resp;
	struct place p;

	random_place(&q->seed, &p);
	if (what < 20) {                         /* upload */
		size_t rows, cols;
		unsigned char *data;

		random_shape(&q->seed, &rows, &cols, 65536);
		data = random_rows(&q->seed, rows, cols);
		ck_assert_ptr_nonnull(data);
		snprintf(path, sizeof path, "/v1/arrays/%s?dtype=%s&shape=%zu,%zu&%s", name,
		         (r >> 40) & 1 ? "float32" : "uint32", rows, cols, p.query);
		snprintf(q->what, sizeof q->what, "PUT %s (%zu bytes)", path, rows * cols * 4);
		th_request(&D, "PUT", path, NULL, (char *)data, rows * cols * 4, &resp);
		seq_expect(q, &resp, "200 201");
		q->uploads++;
		free(data);
	} else if (what < 42) {                  /* put */
		seq_move(q, name, ":put", p.body);
		return;
	} else if (what < 57) {                  /* copy, sometimes donating */
		snprintf(fields, sizeof fields,
		         "\"out\": \"%s\", %s, \"overwrite\": true, \"donate\": %s", out, p.body,
		         (r >> 44) % 4 == 0 ? "true" : "false");
		seq_move(q, name, ":copy", fields);
		return;
	} else if (what < 69) {                  /* gather */
		gather_body(&q->seed, out, &p, body, sizeof body);
		snprintf(path, sizeof path, "/v1/arrays/%s:gather", name);
		snprintf(q->what, sizeof q->what, "POST %.200s %.1000s", path, body);
		th_post_headers(&D, path, body, NULL, &resp);
		seq_expect(q, &resp, "200 201 404:ARRAY_NOT_FOUND");
		if (resp.status != 404)
			q->gathered++;
	} else if (what < 77 && q->npending) {   /* cancel */
		seq_cancel(q, (int)((r >> 40) % (uint64_t)q->npending));
		return;
	} else if (what < 85) {                  /* delete */
		snprintf(path, sizeof path, "/v1/arrays/%s", name);
		snprintf(q->what, sizeof q->what, "DELETE %s", path);
		th_request(&D, "DELETE", path, NULL, NULL, 0, &resp);
		seq_expect(q, &resp, "200 404:ARRAY_NOT_FOUND");
	} else if (what < 93 || !q->npending) {  /* download */
		snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
		snprintf(q->what, sizeof q->what, "GET %s", path);
		th_get(&D, path, &resp);
		seq_expect(q, &resp, "200 404:ARRAY_NOT_FOUND");
		ck_assert_msg(resp.status != 200 ||
		              rows_valid((unsigned char *)resp.body, resp.body_len, why, sizeof why),
		              "step %d, %s: %s", q->step, q->what, why);
	} else {                                 /* wait for one */
		snprintf(q->what, sizeof q->what, "wait");
		seq_wait_one(q, (int)((r >> 40) % (uint64_t)q->npending));
		return;
	}
	th_response_free(&resp);
}

static void seq_settle(struct seq *q, const char *when)
{
	while (q->npending)
		seq_wait_one(q, q->npending - 1);
	wait_all_operations();
	expect_all_finished();
	expect_exact_accounting(when);
	expect_arrays_whole(when);
}

START_TEST(test_random_sequence)
{
	struct seq q;

	memset(&q, 0, sizeof q);
	q.seed = 0x5eedf00d2024ull;
	for (q.step = 0; q.step < SEQ_STEPS; q.step++) {
		seq_step(&q);
		if (q.step == SEQ_STEPS / 3)
			seq_settle(&q, "a third of the way");
		else if (q.step == 2 * SEQ_STEPS / 3)
			seq_settle(&q, "two thirds of the way");
	}
	seq_settle(&q, "after the random sequence");
	/* the seed gives a workload that does what it is for */
	ck_assert_msg(q.uploads >= 15 && q.moved >= 20 && q.started >= 10 && q.finished_ok >= 5 &&
	              q.gathered >= 5, "a thin workload: %u uploads, %u moves taken (%u without "
	              "waiting, %u of them succeeded), %u gathers", q.uploads, q.moved, q.started,
	              q.finished_ok, q.gathered);
	th_expect_no_sanitizer_report(&D);
}
END_TEST

/* ---- 7. four clients at once ----------------------------------------------------------- */

#define CONC_THREADS 4
#define CONC_MS 3000
#define CONC_PENDING 16

static const char *const conc_names[] = {"c0", "c1", "c2"};

struct client {
	pthread_t tid;
	struct th_client c;
	uint64_t seed;
	long long until_ms;
	unsigned long requests, bad, moves, uploads, downloads;
	char first_bad[800];
	char pending[CONC_PENDING][40];
	int npending;
};

static void client_bad(struct client *w, const char *what, long status, const char *detail)
{
	w->bad++;
	if (!w->first_bad[0])
		snprintf(w->first_bad, sizeof w->first_bad, "%.250s: %ld %.500s", what, status, detail);
}

/* One request on the client's own connection; false (and counted as bad)
 * when it failed, answered 5xx or answered what allowed does not list. r
 * must be freed either way. */
static bool client_call(struct client *w, const char *method, const char *path,
                        const char *const *headers, const char *body, size_t len,
                        const char *allowed, struct th_response *r)
{
	char what[2300];

	w->requests++;
	snprintf(what, sizeof what, "%s %s%s%.300s", method, path, body && len < 1000 ? " " : "",
	         body && len < 1000 ? body : "");
	if (!th_client_request(&w->c, method, path, headers, body, len, r)) {
		client_bad(w, what, 0, w->c.error);
		return false;
	}
	if (r->status >= 500 || !answer_ok(r->status, r->body, r->body_len, allowed)) {
		client_bad(w, what, r->status, r->body);
		return false;
	}
	return true;
}

/* The id of the operation in a 202's body, kept to cancel or wait for. */
static void client_push(struct client *w, struct th_response *r);

static void client_wait_one(struct client *w, int i)
{
	struct th_response r;
	char path[96];

	/* retention keeps the newest 1000 finished operations: with thousands
	 * of moves a second, an old one may be gone */
	snprintf(path, sizeof path, "/v1/operations/%s:wait", w->pending[i]);
	client_call(w, "POST", path, json_headers, "{\"timeout\": \"60s\"}", 18,
	            "200 404:OPERATION_NOT_FOUND", &r);
	th_response_free(&r);
	memcpy(w->pending[i], w->pending[--w->npending], sizeof w->pending[0]);
}

static void client_push(struct client *w, struct th_response *r)
{
	json_t *op = json_loadb(r->body, r->body_len, 0, NULL);
	const char *id = json_string_value(th_op_meta(op, "id"));

	if (!id) {
		client_bad(w, "202 without an operation id", r->status, r->body);
	} else {
		if (w->npending == CONC_PENDING)
			client_wait_one(w, 0);
		snprintf(w->pending[w->npending++], sizeof w->pending[0], "%s", id);
	}
	json_decref(op);
}

static void client_move(struct client *w, const char *name, const char *verb,
                        const char *fields)
{
	bool wait = th_rand(&w->seed) % 2;
	struct th_response r;
	char path[128], body[1200];

	snprintf(path, sizeof path, "/v1/arrays/%s%s%s", name, verb, wait ? "?wait=true" : "");
	snprintf(body, sizeof body, "{%s}", fields);
	if (client_call(w, "POST", path, json_headers, body, strlen(body),
	                wait ? "200 202 404:ARRAY_NOT_FOUND 409:TARGET_BUSY 409:ARRAY_CHANGED"
	                     : "202 404:ARRAY_NOT_FOUND 409:TARGET_BUSY", &r)) {
		if (r.status == 202)
			client_push(w, &r);
		if (r.status == 200 || r.status == 202)
			w->moves++;
	}
	th_response_free(&r);
}

static void client_step(struct client *w)
{
	static const char *const reads[] = {"/v1/memory", "/v1/operations?page_size=5",
	                                    "/v1/arrays", "/metrics"};
	uint64_t r = th_rand(&w->seed);
	const char *name = conc_names[r % 3], *out = conc_names[(r >> 4) % 3];
	unsigned what = (unsigned)((r >> 8) % 100);
	char path[2048], body[1024], fields[1024], why[300];
	struct th_response resp;
	struct place p;

	memset(&resp, 0, sizeof resp);
	random_place(&w->seed, &p);
	if (what < 18) {
		size_t rows, cols;
		unsigned char *data;

		random_shape(&w->seed, &rows, &cols, 16384);
		data = random_rows(&w->seed, rows, cols);
		if (!data) {
			client_bad(w, "malloc", 0, "");
			return;
		}
		snprintf(path, sizeof path, "/v1/arrays/%s?dtype=uint32&shape=%zu,%zu&%s", name, rows,
		         cols, p.query);
		if (client_call(w, "PUT", path, NULL, (char *)data, rows * cols * 4, "200 201", &resp))
			w->uploads++;
		free(data);
	} else if (what < 38) {
		client_move(w, name, ":put", p.body);
		return;
	} else if (what < 52) {
		snprintf(fields, sizeof fields,
		         "\"out\": \"%s\", %s, \"overwrite\": true, \"donate\": %s", out, p.body,
		         (r >> 44) % 4 == 0 ? "true" : "false");
		client_move(w, name, ":copy", fields);
		return;
	} else if (what < 62) {
		gather_body(&w->seed, out, &p, body, sizeof body);
		snprintf(path, sizeof path, "/v1/arrays/%s:gather", name);
		client_call(w, "POST", path, json_headers, body, strlen(body),
		            "200 201 404:ARRAY_NOT_FOUND", &resp);
	} else if (what < 78) {
		snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
		if (client_call(w, "GET", path, NULL, NULL, 0, "200 404:ARRAY_NOT_FOUND", &resp) &&
		    resp.status == 200) {
			w->downloads++;
			if (!rows_valid((unsigned char *)resp.body, resp.body_len, why, sizeof why))
				client_bad(w, path, resp.status, why);
		}
	} else if (what < 86) {
		snprintf(path, sizeof path, "/v1/arrays/%s", name);
		client_call(w, "DELETE", path, NULL, NULL, 0, "200 404:ARRAY_NOT_FOUND", &resp);
	} else if (what < 92 && w->npending) {
		snprintf(path, sizeof path, "/v1/operations/%s:cancel",
		         w->pending[(r >> 40) % (uint64_t)w->npending]);
		client_call(w, "POST", path, NULL, NULL, 0,
		            "200 400:OPERATION_FINISHED 404:OPERATION_NOT_FOUND", &resp);
	} else if (what < 95 && w->npending) {
		client_wait_one(w, (int)((r >> 40) % (uint64_t)w->npending));
		return;
	} else {
		snprintf(path, sizeof path, "/v1/arrays/%s", name);
		client_call(w, "GET", (r >> 40) % 5 == 0 ? path : reads[(r >> 40) % 4], NULL, NULL, 0,
		            "200 404:ARRAY_NOT_FOUND", &resp);
	}
	th_response_free(&resp);
}

static void *client_main(void *arg)
{
	struct client *w = arg;

	while (th_now_ms() < w->until_ms && w->bad < 20)
		client_step(w);
	while (w->npending)
		client_wait_one(w, w->npending - 1);
	return NULL;
}

START_TEST(test_concurrent_clients)
{
	struct client w[CONC_THREADS];
	unsigned long requests = 0, bad = 0, moves = 0, uploads = 0, downloads = 0;
	const char *first = "";

	memset(w, 0, sizeof w);
	for (int i = 0; i < CONC_THREADS; i++) {
		th_client_open(&w[i].c, &D);
		w[i].seed = 0xc0ffee11ull * (uint64_t)(i + 3);
		w[i].until_ms = th_now_ms() + CONC_MS;
	}
	for (int i = 0; i < CONC_THREADS; i++)
		ck_assert_int_eq(pthread_create(&w[i].tid, NULL, client_main, &w[i]), 0);
	for (int i = 0; i < CONC_THREADS; i++) {
		pthread_join(w[i].tid, NULL);
		th_client_close(&w[i].c);
		requests += w[i].requests;
		bad += w[i].bad;
		moves += w[i].moves;
		uploads += w[i].uploads;
		downloads += w[i].downloads;
		if (!*first && w[i].first_bad[0])
			first = w[i].first_bad;
	}
	if (bad) {
		char *log = th_daemon_stderr(&D);
		size_t n = strlen(log);

		ck_abort_msg("%lu of %lu requests went wrong; first: %s\ntstaged said:\n%s", bad,
		             requests, first, log + (n > 2500 ? n - 2500 : 0));
	}
	ck_assert_msg(requests >= 40 && moves >= 4 && uploads >= 4 && downloads >= 1,
	              "a thin workload: %lu requests, %lu moves, %lu uploads, %lu downloads",
	              requests, moves, uploads, downloads);

	wait_all_operations();
	expect_all_finished();
	expect_exact_accounting("after four clients");
	expect_arrays_whole("after four clients");
	th_expect_no_sanitizer_report(&D);
}
END_TEST

/* ==== the suite ============================================================================== */

static TCase *daemon_case(const char *name)
{
	TCase *tc = tcase_create(name);

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	/* generous, for sanitizer builds on small machines */
	tcase_set_timeout(tc, 300);
	return tc;
}

Suite *th_suite(void)
{
	Suite *s = suite_create("moves");
	TCase *tc;

	tc = daemon_case("acceptance");
	tcase_add_test(tc, test_acceptance);
	suite_add_tcase(s, tc);

	tc = daemon_case("put");
	tcase_add_test(tc, test_put_device_and_kind);
	tcase_add_test(tc, test_put_memory_kind_only);
	tcase_add_test(tc, test_put_inline_sharding);
	tcase_add_test(tc, test_put_saved_sharding);
	tcase_add_test(tc, test_put_shares_unmoved_shards);
	tcase_add_test(tc, test_put_refused);
	tcase_add_test(tc, test_sharded_upload);
	suite_add_tcase(s, tc);

	tc = daemon_case("operations");
	tcase_add_test(tc, test_wait);
	tcase_add_test(tc, test_cancel_finished);
	tcase_add_test(tc, test_cancel_running);
	tcase_add_test(tc, test_busy);
	tcase_add_test(tc, test_list_newest_first);
	tcase_add_test(tc, test_changed_while_moving);
	tcase_add_test(tc, test_copy_donate);
	tcase_add_test(tc, test_cancel_pending);
	suite_add_tcase(s, tc);

	tc = daemon_case("admission");
	tcase_add_test(tc, test_admission);
	suite_add_tcase(s, tc);

	tc = daemon_case("workloads");
	tcase_add_test(tc, test_random_sequence);
	tcase_add_test(tc, test_concurrent_clients);
	suite_add_tcase(s, tc);
	return s;
}
