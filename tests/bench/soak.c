/*
 * soak.c - a bounded soak of a live tstaged (make soak): SOAK_SECONDS
 * (default 60) of uploads, :put moves, :gather, slices, model :step calls,
 * deletes and /v1/memory and /v1/arrays polls from SOAK_CLIENTS (default
 * 16) connections at once, on loopback only.
 *
 * It passes when no answer is a 5xx (4xx are counted: clients race on each
 * other's names on purpose); when the daemon's resident memory after the run
 * is within SOAK_RSS_MARGIN_MIB (default 16) of what it was after a warm-up
 * of the same mix, both measured with every soak array deleted (pools are
 * preallocated, so their pages are resident from the start); and when the
 * accounting is consistent: while the run is paused, each space's
 * bytes_in_use equals the sum of the shards the array list places in it,
 * and once everything is deleted every space holds nothing.
 *
 * Prints one line of figures to stdout; why it failed, if it did, to stderr.
 * Exit status 0 on a pass.
 */
#include "tests/bench/benchlib.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_CLIENTS 64
#define NAMES 6          /* arrays each client cycles through */

struct body {
	char *p;
	size_t n, cap;
};

struct client {
	int id;
	CURL *curl;
	char base[64];
	uint64_t rng;
	struct body resp;
	uint64_t requests, c4xx, c5xx, failed;
	char last5xx[512];
};

static _Atomic bool stop_flag;
static int port;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t rnd(struct client *c)
{
	c->rng ^= c->rng << 13;
	c->rng ^= c->rng >> 7;
	c->rng ^= c->rng << 17;
	return c->rng;
}

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *arg)
{
	struct body *b = arg;
	size_t n = size * nmemb;

	if (b->n + n + 1 > b->cap) {
		size_t cap = (b->n + n + 1) * 2;
		char *p = realloc(b->p, cap);

		if (!p)
			return 0;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, ptr, n);
	b->n += n;
	b->p[b->n] = '\0';
	return n;
}

/* One request; returns the status (0 when the transfer failed). */
static long request(struct client *c, const char *method, const char *path, const char *ctype,
                    const void *body, size_t len)
{
	struct curl_slist *h = NULL;
	char url[512], hdr[96];
	long status = 0;

	snprintf(url, sizeof url, "%s%s", c->base, path);
	c->resp.n = 0;
	if (c->resp.p)
		c->resp.p[0] = '\0';
	curl_easy_setopt(c->curl, CURLOPT_URL, url);
	curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c->curl, CURLOPT_NOBODY, 0L);
	curl_easy_setopt(c->curl, CURLOPT_HTTPGET, 1L);
	if (body || (strcmp(method, "GET") != 0 && strcmp(method, "DELETE") != 0)) {
		curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body ? body : "");
		curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
	}
	curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, method);
	if (ctype) {
		snprintf(hdr, sizeof hdr, "Content-Type: %s", ctype);
		h = curl_slist_append(h, hdr);
	}
	h = curl_slist_append(h, "Expect:");
	curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, h);
	c->requests++;
	if (curl_easy_perform(c->curl) == CURLE_OK)
		curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(h);
	if (status == 0)
		c->failed++;
	else if (status >= 500) {
		c->c5xx++;
		snprintf(c->last5xx, sizeof c->last5xx, "%s %s: %ld %.400s", method, path, status,
		         c->resp.p ? c->resp.p : "");
	} else if (status >= 400)
		c->c4xx++;
	return status;
}

static const char *const kinds[] = {"device", "pinned_host", "unpinned_host"};

static void op_upload(struct client *c)
{
	static float data[64 * 256];
	int rows = 8 + 2 * (int)(rnd(c) % 29), cols = 1 + (int)(rnd(c) % 256);
	char path[256];

	snprintf(path, sizeof path, "/v1/arrays/s%d_%d?dtype=float32&shape=%d,%d&device=sim:%d"
	         "&memory_kind=%s", c->id, (int)(rnd(c) % NAMES), rows, cols, (int)(rnd(c) % 2),
	         kinds[rnd(c) % 3]);
	request(c, "PUT", path, NULL, data, (size_t)rows * (size_t)cols * sizeof(float));
}

static void op_move(struct client *c)
{
	char path[128], body[160];

	snprintf(path, sizeof path, "/v1/arrays/s%d_%d:put?wait=true", c->id, (int)(rnd(c) % NAMES));
	if (rnd(c) % 4 == 0)
		snprintf(body, sizeof body, "{\"sharding\": {\"mesh\": {\"devices\": [\"sim:0\", "
		         "\"sim:1\"], \"axis_names\": [\"x\"], \"shape\": [2]}, \"spec\": [\"x\", null], "
		         "\"memory_kind\": \"%s\"}}", kinds[rnd(c) % 3]);
	else
		snprintf(body, sizeof body, "{\"sharding\": {\"device\": \"sim:%d\", "
		         "\"memory_kind\": \"%s\"}}", (int)(rnd(c) % 2), kinds[rnd(c) % 3]);
	request(c, "POST", path, "application/json", body, strlen(body));
}

static void op_gather(struct client *c)
{
	char path[128], body[200];

	snprintf(path, sizeof path, "/v1/arrays/s%d_%d:gather?wait=true", c->id,
	         (int)(rnd(c) % NAMES));
	snprintf(body, sizeof body, "{\"rows\": [%d, %d, 0], \"out\": {\"name\": \"s%d_%d\", "
	         "\"device\": \"sim:%d\", \"memory_kind\": \"%s\"}}", (int)(rnd(c) % 8),
	         (int)(rnd(c) % 8), c->id, (int)(rnd(c) % NAMES), (int)(rnd(c) % 2),
	         kinds[rnd(c) % 3]);
	request(c, "POST", path, "application/json", body, strlen(body));
}

static void op_slice(struct client *c)
{
	char path[128];

	snprintf(path, sizeof path, "/v1/arrays/s%d_%d/data?index=%d:%d", c->id,
	         (int)(rnd(c) % NAMES), (int)(rnd(c) % 4), 4 + (int)(rnd(c) % 4));
	request(c, "GET", path, NULL, NULL, 0);
}

static void op_delete(struct client *c)
{
	char path[128];

	snprintf(path, sizeof path, "/v1/arrays/s%d_%d", c->id, (int)(rnd(c) % NAMES));
	request(c, "DELETE", path, NULL, NULL, 0);
}

static void op_step(struct client *c)
{
	static const char body[] = "{\"inputs\": \"soakx\", \"targets\": \"soaky\"}";
	char path[128];

	snprintf(path, sizeof path, "/v1/models/soak%d:step?wait=true", c->id % 4);
	request(c, "POST", path, "application/json", body, strlen(body));
}

static void op_poll(struct client *c)
{
	request(c, "GET", rnd(c) % 2 ? "/v1/memory" : "/v1/arrays?page_size=50", NULL, NULL, 0);
}

static void one_op(struct client *c)
{
	unsigned r = (unsigned)(rnd(c) % 100);

	if (r < 25)
		op_upload(c);
	else if (r < 40)
		op_move(c);
	else if (r < 50)
		op_gather(c);
	else if (r < 62)
		op_slice(c);
	else if (r < 70)
		op_step(c);
	else if (r < 80)
		op_delete(c);
	else
		op_poll(c);
}

static void *client_main(void *arg)
{
	struct client *c = arg;

	while (!atomic_load(&stop_flag))
		one_op(c);
	return NULL;
}

/* Runs every client for seconds. */
static void run_phase(struct client *cl, int n, double seconds)
{
	pthread_t th[MAX_CLIENTS];

	atomic_store(&stop_flag, false);
	for (int i = 0; i < n; i++)
		pthread_create(&th[i], NULL, client_main, &cl[i]);
	usleep((useconds_t)(seconds * 1e6));
	atomic_store(&stop_flag, true);
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
}

static json_t *get_json(struct client *c, const char *path)
{
	if (request(c, "GET", path, NULL, NULL, 0) != 200)
		return NULL;
	return json_loads(c->resp.p, 0, NULL);
}

/* Whether every space's bytes_in_use equals its listed shards (why). */
static bool stats_consistent(struct client *c, bool want_empty, char *why, size_t cap)
{
	json_t *arrays = get_json(c, "/v1/arrays?page_size=1000"), *mem = NULL, *sums = json_object();
	json_t *a, *sh, *s;
	size_t i, k, o = 0;
	bool ok = arrays != NULL;

	why[0] = '\0';
	json_array_foreach(json_object_get(arrays, "arrays"), i, a)
		json_array_foreach(json_object_get(a, "shards"), k, sh) {
			char key[64];

			snprintf(key, sizeof key, "%s/%s",
			         json_string_value(json_object_get(sh, "device")),
			         json_string_value(json_object_get(sh, "memory_kind")));
			json_object_set_new(sums, key, json_integer(
				json_integer_value(json_object_get(sums, key)) +
				json_integer_value(json_object_get(sh, "nbytes"))));
		}
	mem = get_json(c, "/v1/memory");
	ok = ok && mem;
	json_array_foreach(json_object_get(mem, "spaces"), i, s) {
		char key[64];
		json_int_t in_use = json_integer_value(json_object_get(s, "bytes_in_use")), want;
		json_int_t live = json_integer_value(json_object_get(s, "live_allocations"));

		snprintf(key, sizeof key, "%s/%s", json_string_value(json_object_get(s, "device")),
		         json_string_value(json_object_get(s, "memory_kind")));
		want = json_integer_value(json_object_get(sums, key));
		if (in_use != want || (want_empty && live != 0)) {
			ok = false;
			o += (size_t)snprintf(why + o, cap > o ? cap - o : 0,
			                      "%s: %lld bytes in %lld allocations, its shards %lld; ", key,
			                      (long long)in_use, (long long)live, (long long)want);
		}
	}
	json_decref(arrays);
	json_decref(mem);
	json_decref(sums);
	return ok;
}

static bool stats_consistent_soon(struct client *c, bool want_empty, char *why, size_t cap)
{
	for (int i = 0; i < 200; i++) {
		if (stats_consistent(c, want_empty, why, cap))
			return true;
		usleep(25000);
	}
	return false;
}

static void delete_all(struct client *c, int n, bool models)
{
	char path[128];

	for (int t = 0; t < n; t++)
		for (int k = 0; k < NAMES; k++) {
			snprintf(path, sizeof path, "/v1/arrays/s%d_%d", t, k);
			request(c, "DELETE", path, NULL, NULL, 0);
		}
	for (int m = 0; models && m < 4; m++) {
		snprintf(path, sizeof path, "/v1/models/soak%d", m);
		request(c, "DELETE", path, NULL, NULL, 0);
	}
	if (models) {
		request(c, "DELETE", "/v1/arrays/soakx", NULL, NULL, 0);
		request(c, "DELETE", "/v1/arrays/soaky", NULL, NULL, 0);
	}
}

static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* A settled reading: the smallest of a few, a moment apart (freed pages and
 * the allocator's trims land a little after the answers). */
static long rss_settled(pid_t pid)
{
	long best = -1;

	for (int i = 0; i < 10; i++) {
		long v = rss_kib(pid);

		if (v >= 0 && (best < 0 || v < best))
			best = v;
		usleep(50000);
	}
	return best;
}

static int setup_models(struct client *c)
{
	static float x[16 * 32], y[16 * 32];
	char body[512];

	for (size_t i = 0; i < 16 * 32; i++) {
		x[i] = (float)(i % 17) / 17.0f - 0.5f;
		y[i] = (float)(i % 13) / 13.0f - 0.5f;
	}
	if (request(c, "PUT", "/v1/arrays/soakx?dtype=float32&shape=16,32&device=sim:0", NULL, x,
	            sizeof x) >= 300 ||
	    request(c, "PUT", "/v1/arrays/soaky?dtype=float32&shape=16,32&device=sim:0", NULL, y,
	            sizeof y) >= 300)
		return -1;
	for (int m = 0; m < 4; m++) {
		long st;

		snprintf(body, sizeof body,
		         "{\"name\": \"soak%d\", \"mlp\": {\"layers\": 2, \"d_model\": 32, "
		         "\"d_hidden\": 64}, \"loss\": \"mse\", \"optimizer\": {\"type\": \"adam\", "
		         "\"learning_rate\": 0.001}, \"placement\": {\"device\": \"sim:0\", "
		         "\"params\": \"%s\", \"opt_state\": \"pinned_host\"}}",
		         m, m % 2 ? "pinned_host" : "device");
		st = request(c, "POST", "/v1/models?wait=true", "application/json", body, strlen(body));
		if (st != 200 && st != 201 && st != 202)
			return -1;
	}
	return 0;
}

static double env_num(const char *name, double def)
{
	const char *v = getenv(name);

	return v && *v ? atof(v) : def;
}

int main(void)
{
	static const char *const args[] = {"--sim-devices", "2", "--sim-device-memory", "64MiB",
	                                   "--pinned-host-limit", "128MiB", "--unpinned-host-limit",
	                                   "256MiB", "--preallocate", "--no-cuda", NULL};
	double seconds = env_num("SOAK_SECONDS", 60), margin_mib = env_num("SOAK_RSS_MARGIN_MIB", 16);
	int n = (int)env_num("SOAK_CLIENTS", 16);
	struct bench_daemon d;
	struct client *cl, ctl;
	uint64_t req = 0, c4 = 0, c5 = 0, fail = 0;
	long rss0, rss1;
	char why[8192];
	double t0;
	int rc = 0;

	if (n < 1 || n > MAX_CLIENTS)
		n = 16;
	curl_global_init(CURL_GLOBAL_ALL);
	if (bench_daemon_start(&d, args) != 0)
		return 1;
	port = d.port;
	cl = calloc((size_t)n + 1, sizeof *cl);
	if (!cl)
		return 1;
	for (int i = 0; i <= n; i++) {
		struct client *c = i < n ? &cl[i] : &ctl;

		memset(c, 0, sizeof *c);
		c->id = i;
		c->rng = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
		c->curl = curl_easy_init();
		snprintf(c->base, sizeof c->base, "http://127.0.0.1:%d", port);
		curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &c->resp);
		curl_easy_setopt(c->curl, CURLOPT_TIMEOUT, 60L);
		curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
	}
	if (setup_models(&ctl) != 0) {
		fprintf(stderr, "soak: setting up the models failed: %s\n", ctl.resp.p);
		return 1;
	}
	/* warm-up: the same mix, a tenth of the time (at least 2 s) */
	run_phase(cl, n, seconds / 10 > 2 ? seconds / 10 : 2);
	delete_all(&ctl, n, false);
	if (!stats_consistent_soon(&ctl, false, why, sizeof why)) {
		fprintf(stderr, "soak: after the warm-up the accounting is off: %s\n", why);
		rc = 1;
	}
	rss0 = rss_settled(d.pid);
	t0 = now_s();
	run_phase(cl, n, seconds);
	t0 = now_s() - t0;
	if (!stats_consistent_soon(&ctl, false, why, sizeof why)) {
		fprintf(stderr, "soak: after the run the accounting is off: %s\n", why);
		rc = 1;
	}
	delete_all(&ctl, n, false);
	rss1 = rss_settled(d.pid);
	delete_all(&ctl, n, true);
	if (!stats_consistent_soon(&ctl, true, why, sizeof why)) {
		fprintf(stderr, "soak: with everything deleted, spaces still hold: %s\n", why);
		rc = 1;
	}
	for (int i = 0; i < n; i++) {
		req += cl[i].requests;
		c4 += cl[i].c4xx;
		c5 += cl[i].c5xx;
		fail += cl[i].failed;
		if (cl[i].c5xx)
			fprintf(stderr, "soak: client %d: %llu 5xx, the last %s\n", i,
			        (unsigned long long)cl[i].c5xx, cl[i].last5xx);
	}
	if (c5 || fail) {
		fprintf(stderr, "soak: %llu answers were 5xx, %llu requests got no answer\n",
		        (unsigned long long)c5, (unsigned long long)fail);
		rc = 1;
	}
	if (rss0 < 0 || rss1 < 0 || (double)(rss1 - rss0) > margin_mib * 1024) {
		fprintf(stderr, "soak: resident memory grew from %ld KiB to %ld KiB (margin %.0f MiB)\n",
		        rss0, rss1, margin_mib);
		rc = 1;
	}
	printf("soak: %.0f s, %d clients: %llu requests (%.0f/s), %llu 4xx, %llu 5xx, %llu without "
	       "an answer; RSS %.1f MiB after warm-up, %.1f MiB after the run (%+.1f MiB); "
	       "accounting %s\n",
	       t0, n, (unsigned long long)req, (double)req / t0, (unsigned long long)c4,
	       (unsigned long long)c5, (unsigned long long)fail, rss0 / 1024.0, rss1 / 1024.0,
	       (rss1 - rss0) / 1024.0, rc ? "checked (see above)" : "consistent");
	if (bench_daemon_stop(&d) != 0) {
		fprintf(stderr, "soak: the daemon did not stop cleanly\n");
		rc = 1;
	}
	for (int i = 0; i <= n; i++) {
		struct client *c = i < n ? &cl[i] : &ctl;

		curl_easy_cleanup(c->curl);
		free(c->resp.p);
	}
	free(cl);
	curl_global_cleanup();
	return rc;
}
