/*
 * bench_history.c - what recording the memory history costs: the CPU time
 * the sampler thread spends (tstage_history_sampler_cpu_seconds_total, its
 * own thread's clock) against the daemon's whole CPU time
 * (process_cpu_seconds_total) while clients drive GET /v1/memory as fast as
 * it answers. Every CPU second the sampler takes is one the feed does not
 * have, so their ratio bounds what the history costs the /v1/memory rate.
 *
 * Row: sampler CPU / daemon CPU under the load (target < 1%), with the
 * /v1/memory rate and the sampler's CPU per sample as the reference.
 */
#include "tests/bench/benchlib.h"

#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHARE_TARGET 0.01

struct body {
	char buf[1 << 20];
	size_t len;
};

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
	struct body *b = arg;
	size_t len = size * n;

	if (len > sizeof b->buf - 1 - b->len)
		return 0;
	memcpy(b->buf + b->len, p, len);
	b->len += len;
	b->buf[b->len] = '\0';
	return len;
}

/* The value of the unlabelled series name in text, or NAN. */
static double series(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = text; (p = strstr(p, name)); p += n)
		if ((p == text || p[-1] == '\n') && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return NAN;
}

/* Reads /metrics: *sampler and *process CPU seconds, *samples; -1 on failure. */
static int scrape(int port, double *sampler, double *process, double *samples)
{
	static struct body b;
	char url[64];
	CURL *c = curl_easy_init();
	CURLcode rc;

	if (!c)
		return -1;
	b.len = 0;
	snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", port);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
	rc = curl_easy_perform(c);
	curl_easy_cleanup(c);
	if (rc != CURLE_OK) {
		fprintf(stderr, "bench_history: /metrics: %s\n", curl_easy_strerror(rc));
		return -1;
	}
	*sampler = series(b.buf, "tstage_history_sampler_cpu_seconds_total");
	*process = series(b.buf, "process_cpu_seconds_total");
	*samples = series(b.buf, "tstage_history_samples_total");
	if (isnan(*sampler) || isnan(*process) || isnan(*samples)) {
		fprintf(stderr, "bench_history: /metrics lacks the history or process series\n");
		return -1;
	}
	return 0;
}

int main(void)
{
	static const char *const args[] = {"--sim-devices", "2", "--sim-device-memory", "256MiB",
	                                   NULL};
	struct bench_daemon d;
	struct bench_result res;
	struct bench_load load = {.method = "GET", .path = "/v1/memory", .threads = 2,
	                          .warmup_s = 0.1, .duration_s = bench_seconds(5)};
	double s0, p0, n0, s1, p1, n1, share;
	char v[64], ref[96], tgt[32];

	curl_global_init(CURL_GLOBAL_DEFAULT);
	if (bench_daemon_start(&d, args) != 0)
		return 1;
	if (scrape(d.port, &s0, &p0, &n0) != 0 || bench_load_run(d.port, &load, &res) != 0 ||
	    scrape(d.port, &s1, &p1, &n1) != 0) {
		bench_daemon_stop(&d);
		return 1;
	}
	if (bench_daemon_stop(&d) != 0)
		return 1;
	if (p1 - p0 <= 0 || n1 - n0 < 1) {
		fprintf(stderr, "bench_history: no CPU time or no sample in the window\n");
		return 1;
	}
	share = (s1 - s0) / (p1 - p0);
	fprintf(stderr, "bench_history: /v1/memory %.0f req/s; %.0f samples took %.6f s of CPU, "
	        "the daemon %.2f s\n", res.rate, n1 - n0, s1 - s0, p1 - p0);
	snprintf(v, sizeof v, "%.4f%%", 100 * share);
	snprintf(ref, sizeof ref, "%.0f us/sample, ", 1e6 * (s1 - s0) / (n1 - n0));
	bench_fmt_rate(ref + strlen(ref), sizeof ref - strlen(ref), res.rate);
	snprintf(tgt, sizeof tgt, "< %.0f%%", 100 * SHARE_TARGET);
	bench_row("history: sampler CPU share, GET /v1/memory", v, ref, NAN, tgt, true,
	          share < SHARE_TARGET);
	curl_global_cleanup();
	return 0;
}
