/*
 * bench_trace.c - what the trace recorder (common/trace.h) costs the work
 * it watches: rounds of small copies (4 KiB, the size where a queue's own
 * overhead dominates) on a sim device's queue, with no recorder, with a
 * recorder that does not record (the daemon's state when no trace runs:
 * each copy asks ts_trace_on, one relaxed load), and while it records. The
 * rounds interleave; each rate is the best of its rounds. The reference
 * measured in the same run is a bare memcpy loop of the same copies.
 *
 * Rows: a memcpy loop that makes the check every traced place makes
 * before its work, against an idle recorder, over the bare memcpy loop
 * (target >= 0.95: off costs nothing measurable); the queue's copies with
 * an idle recorder over no recorder and over memcpy (context: on this
 * shared machine their rounds vary by +-15%, far more than one load);
 * recording over idle (what a running trace costs 4 KiB copies, the
 * worst case: one event each); and the guide's step (10 layers, d 256,
 * h 1024, 256 rows, Adam) through a daemon while GET /v1/trace records
 * over the same step without a trace, alternated, best per-step time of
 * each (target <= 1.05: a trace of a step costs under 5% of it).
 */
#include "tests/bench/benchlib.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/trace.h"
#include "device/device.h"

#define COPY 4096
#define COPIES 50000
#define ROUNDS 15
#define OFF_TARGET 0.95
#define STEP_TARGET 1.05
#define STEP_ROUNDS 4

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Copies per second of one round on q, or -1. */
static double round_copies(struct ts_queue *q, char *dst, const char *src)
{
	struct ts_error err;
	double t0 = now_s();

	ts_error_clear(&err);
	for (int i = 0; i < COPIES; i++)
		if (ts_queue_copy(q, dst + (size_t)(i % 16) * COPY, src + (size_t)(i % 16) * COPY,
		                  COPY, TS_COPY_H2H, &err) != TS_OK)
			goto fail;
	if (ts_queue_sync(q, &err) != TS_OK)
		goto fail;
	return COPIES / (now_s() - t0);
fail:
	fprintf(stderr, "bench_trace: %s\n", err.message);
	return -1;
}

/* The bare memcpy loop (t NULL), or the same with the check each traced
 * place makes before its work, against an idle recorder. */
static double round_memcpy(char *dst, const char *src, struct ts_trace *t)
{
	double t0 = now_s();

	for (int i = 0; i < COPIES; i++) {
		if (t && ts_trace_on(t))
			ts_trace_span(t, 1, 1, "copy", "H2H", NULL, 0, 1, 0, COPY);
		memcpy(dst + (size_t)(i % 16) * COPY, src + (size_t)(i % 16) * COPY, COPY);
		__asm__ volatile("" : : "r"(dst) : "memory");
	}
	return COPIES / (now_s() - t0);
}

/* The guide's step traced over untraced, through a daemon: a row; 0, or -1
 * after printing why. */
static int guide_step_row(void)
{
	static const char *const args[] = {"--sim-devices", "1", "--sim-device-memory", "1GiB",
	                                   NULL};
	static const char model[] =
		"{\"name\": \"g\", \"mlp\": {\"layers\": 10, \"d_model\": 256, \"d_hidden\": 1024}, "
		"\"optimizer\": {\"type\": \"adam\", \"learning_rate\": 1e-4}}";
	static const char step[] = "{\"inputs\": \"x\", \"steps\": 4}";
	size_t xb = 256 * 256 * sizeof(float);
	float *x = malloc(xb);
	double off = INFINITY, on = INFINITY, t;
	char reply[512], v[32], rs[64], tgt[32];
	struct bench_daemon d;
	uint64_t got;
	int rc = -1;

	if (!x || bench_daemon_start(&d, args) != 0) {
		free(x);
		return -1;
	}
	for (size_t i = 0; i < xb / sizeof *x; i++)
		x[i] = (float)(i % 97) * 0.01f - 0.5f;
	if (bench_http_transfer(d.port, "PUT", "/v1/arrays/x?dtype=float32&shape=256,256", NULL, x,
	                        xb, xb, reply, sizeof reply, &got, &t) / 100 != 2 ||
	    bench_http_transfer(d.port, "POST", "/v1/models?wait=true",
	                        "Content-Type: application/json\r\n", model, strlen(model),
	                        strlen(model), reply, sizeof reply, &got, &t) / 100 != 2) {
		fprintf(stderr, "bench_trace: setting up the guide: %s\n", reply);
		goto out;
	}
	if (bench_step_seconds(d.port, "g", step) < 0)   /* warm-up */
		goto out;
	for (int k = 0; k < STEP_ROUNDS; k++)
		for (int i = 0; i < 2; i++) {
			bool traced = (i + k) % 2 == 1;   /* each first in every other round */
			int fd = traced ? bench_trace_open(d.port) : -1;

			if (traced && fd < 0)
				goto out;
			if (traced)
				usleep(100000);   /* the trace has begun */
			t = bench_step_seconds(d.port, "g", step);
			if (fd >= 0)
				close(fd);
			if (t < 0)
				goto out;
			if (traced)
				on = fmin(on, t);
			else
				off = fmin(off, t);
		}
	fprintf(stderr, "bench_trace: the guide's step %.1f ms traced, %.1f ms not\n", on * 1e3,
	        off * 1e3);
	snprintf(v, sizeof v, "%.1f ms", on * 1e3);
	snprintf(rs, sizeof rs, "%.1f ms untraced", off * 1e3);
	snprintf(tgt, sizeof tgt, "<= %.2f", STEP_TARGET);
	bench_row("trace: recording, guide step / untraced", v, rs, on / off, tgt, true,
	          on / off <= STEP_TARGET);
	rc = 0;
out:
	if (bench_daemon_stop(&d) != 0)
		rc = -1;
	free(x);
	return rc;
}

int main(void)
{
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 64ull << 20};
	struct ts_device_set *set = NULL;
	struct ts_trace *t = NULL;
	struct ts_queue *q = NULL;
	struct ts_error err;
	double none = 0, idle = 0, on = 0, ref = 0, checked = 0, r;
	char *src = malloc(16 * COPY), *dst = malloc(16 * COPY);
	char v[64], rs[64], tgt[32];
	int rounds = (int)(ROUNDS * bench_seconds(1.0));

	ts_error_clear(&err);
	if (!src || !dst ||
	    ts_device_set_new(&dc, &set, &err) != TS_OK ||
	    ts_trace_new(&(struct ts_trace_config){.max_events = 2 * COPIES}, &t, &err) != TS_OK ||
	    ts_queue_new(ts_device_set_at(set, 0), &q, &err) != TS_OK) {
		fprintf(stderr, "bench_trace: %s\n", err.message);
		return 1;
	}
	memset(src, 1, 16 * COPY);
	memset(dst, 0, 16 * COPY);
	if (round_copies(q, dst, src) < 0)     /* warm-up: the worker, the spare jobs */
		return 1;
	for (int i = 0; i < (rounds < 3 ? 3 : rounds); i++) {
		uint64_t gen;

		ref = fmax(ref, round_memcpy(dst, src, NULL));
		checked = fmax(checked, round_memcpy(dst, src, t));
		ts_device_set_trace(set, NULL);
		none = fmax(none, r = round_copies(q, dst, src));
		if (r < 0)
			return 1;
		ts_device_set_trace(set, t);
		idle = fmax(idle, r = round_copies(q, dst, src));
		if (r < 0)
			return 1;
		gen = ts_trace_begin(t, &err);
		on = fmax(on, r = round_copies(q, dst, src));
		ts_trace_finish(t, gen, NULL, NULL);
		if (r < 0)
			return 1;
	}
	fprintf(stderr, "bench_trace: 4 KiB copies/s: no recorder %.0f, idle %.0f, recording %.0f; "
	        "memcpy %.0f, checked memcpy %.0f\n", none, idle, on, ref, checked);
	snprintf(v, sizeof v, "%.0fk copies/s", checked / 1e3);
	snprintf(rs, sizeof rs, "%.0fk copies/s memcpy", ref / 1e3);
	snprintf(tgt, sizeof tgt, ">= %.2f", OFF_TARGET);
	bench_row("trace: off check + 4 KiB memcpy / memcpy", v, rs, checked / ref, tgt, true,
	          checked / ref >= OFF_TARGET);
	snprintf(v, sizeof v, "%.0fk copies/s", idle / 1e3);
	snprintf(rs, sizeof rs, "%.0fk copies/s no recorder", none / 1e3);
	bench_row("trace: off, 4 KiB sim copies / no recorder", v, rs, idle / none, NULL, false,
	          false);
	snprintf(rs, sizeof rs, "%.0fk copies/s memcpy", ref / 1e3);
	bench_row("trace: off, 4 KiB sim copies vs memcpy", v, rs, idle / ref, NULL, false, false);
	snprintf(v, sizeof v, "%.0fk copies/s", on / 1e3);
	snprintf(rs, sizeof rs, "%.0fk copies/s off", idle / 1e3);
	bench_row("trace: recording, 4 KiB sim copies / off", v, rs, on / idle, NULL, false, false);
	ts_queue_free(q);
	ts_trace_free(t);
	ts_device_set_free(set);
	free(src);
	free(dst);
	return guide_step_row() == 0 ? 0 : 1;
}
