/*
 * bench_windows.c - a GPT's steps drawing their batches as windows of a
 * token stream (the windows path: the next step's B*T input and target ids
 * copied out of one uint16 stream on pinned_host while the current step
 * computes) against the same number of steps on one fixed batch (inputs
 * and targets arrays of [B, T] already bound), through the daemon, in the
 * same run.
 *
 * The model is issue 28's: L 4, d 256, 4 heads, context 256, d_ff 1024,
 * vocab 8192, batch 8 windows, AdamW, on sim:0. Each call runs STEPS steps;
 * a round calls the fixed batch and the windows (random order), each first
 * in every other round, and the rows compare the best per-step time (the result's time.per_step_s) of
 * ROUNDS rounds after one warm-up call of each. Row:
 *   - windows / fixed batch, per step (target <= 1.05).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/bench/benchlib.h"

#define B 8
#define T 256
#define VOCAB 8192
#define STREAM_TOKENS (1u << 20)
#define STEPS 4
#define ROUNDS 4
#define REPLY_CAP (1u << 20)

static char *reply;

/* A request with a body; the status, or -1. The answer's body in `reply`. */
static int request(int port, const char *method, const char *path, const char *type,
                   const void *body, size_t len)
{
	char extra[128];
	uint64_t got;
	double s;

	snprintf(extra, sizeof extra, "Content-Type: %s\r\n", type);
	return bench_http_transfer(port, method, path, extra, body, len ? len : 1, len, reply,
	                           REPLY_CAP, &got, &s);
}

static int post_json(int port, const char *path, const char *json)
{
	return request(port, "POST", path, "application/json", json, strlen(json));
}

/* A uint16 array of n ids (SplitMix-like, below VOCAB) at name, on pinned_host. */
static int put_ids(int port, const char *name, const char *shape, size_t n, uint64_t seed)
{
	uint16_t *ids = malloc(n * sizeof *ids);
	char path[256];
	int st;

	if (!ids)
		return -1;
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		ids[i] = (uint16_t)((seed >> 33) % VOCAB);
	}
	snprintf(path, sizeof path, "/v1/arrays/%s?dtype=uint16&shape=%s&memory_kind=pinned_host",
	         name, shape);
	st = request(port, "PUT", path, "application/octet-stream", ids, n * sizeof *ids);
	free(ids);
	return st;
}

int main(void)
{
	static const char *const args[] = {"--sim-devices", "1", "--sim-device-memory", "2GiB",
	                                   NULL};
	static const char model[] =
		"{\"name\": \"g\", \"gpt\": {\"vocab\": 8192, \"context\": 256, \"layers\": 4, "
		"\"d_model\": 256, \"heads\": 4, \"d_ff\": 1024}, \"optimizer\": {\"type\": "
		"\"adamw\", \"learning_rate\": 1e-4}, \"placement\": {\"device\": \"sim:0\"}}";
	char fixed[128], windows[256], shape[32], v[32], r[64];
	double t_fixed = INFINITY, t_win = INFINITY, t, ratio;
	struct bench_daemon d;
	int rc = 1;

	snprintf(fixed, sizeof fixed, "{\"inputs\": \"x\", \"targets\": \"y\", \"steps\": %d}",
	         STEPS);
	snprintf(windows, sizeof windows,
	         "{\"steps\": %d, \"windows\": {\"array\": \"stream\", \"context\": %d, "
	         "\"batch_size\": %d, \"order\": \"random\", \"seed\": 1}}", STEPS, T, B);
	reply = malloc(REPLY_CAP);
	if (!reply || bench_daemon_start(&d, args) != 0)
		return 1;
	snprintf(shape, sizeof shape, "%d,%d", B, T);
	if (put_ids(d.port, "stream", "1048576", STREAM_TOKENS, 1) / 100 != 2 ||
	    put_ids(d.port, "x", shape, (size_t)B * T, 2) / 100 != 2 ||
	    put_ids(d.port, "y", shape, (size_t)B * T, 3) / 100 != 2 ||
	    post_json(d.port, "/v1/models?wait=true", model) / 100 != 2) {
		fprintf(stderr, "bench_windows: setting up: %.400s\n", reply);
		goto out;
	}
	if (bench_step_seconds(d.port, "g", fixed) < 0 || bench_step_seconds(d.port, "g", windows) < 0)
		goto out;
	for (int k = 0; k < ROUNDS; k++) {
		/* alternately first, so that drift falls on both alike */
		for (int i = 0; i < 2; i++) {
			bool win = (i + k) % 2 == 1;

			if ((t = bench_step_seconds(d.port, "g", win ? windows : fixed)) < 0)
				goto out;
			if (win)
				t_win = fmin(t_win, t);
			else
				t_fixed = fmin(t_fixed, t);
		}
		fprintf(stderr, "bench_windows: round %d: windows %.1f ms a step, fixed batch %.1f ms "
		        "(best so far)\n", k, t_win * 1e3, t_fixed * 1e3);
	}
	ratio = t_win / t_fixed;
	snprintf(v, sizeof v, "%.1f ms", t_win * 1e3);
	snprintf(r, sizeof r, "%.1f ms fixed batch", t_fixed * 1e3);
	bench_row("train sim: gpt windows / fixed batch", v, r, ratio, "<= 1.05", true,
	          ratio <= 1.05);
	rc = 0;
out:
	if (bench_daemon_stop(&d) != 0)
		rc = 1;
	free(reply);
	return rc;
}
