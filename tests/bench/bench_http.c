/*
 * bench_http.c - small requests over keep-alive connections: the rate of
 * GET /v1/memory (the dashboard feed: every space's stats as JSON) beside
 * the rate of GET /livez (the cheapest route: the HTTP pipeline alone),
 * measured in the same run against the same daemon, in interleaved rounds,
 * so that the ratio says what building the feed costs on top of the
 * pipeline whatever the machine and its other load.
 *
 * Rows: memory/livez ratio (target >= 0.5); the absolute /v1/memory rate
 * (target >= 20000 req/s on a 2-core machine, clients included); latency
 * percentiles (no target). The daemon runs with its default threads and
 * --log-level warn; of 2, 3 and 4 client connections the count with the
 * best /v1/memory rate is reported.
 */
#include "tests/bench/benchlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RATIO_TARGET 0.5
#define RATE_TARGET 20000.0
#define ROUNDS 6

int main(void)
{
	static const char *const args[] = {"--sim-devices", "2", "--sim-device-memory", "256MiB",
	                                   NULL};
	struct bench_daemon d;
	struct bench_result res[2], best[2] = {{0}};
	int best_threads = 0;
	double secs = bench_seconds(1.5), ratio;
	char v[64], ref[64], tgt[64], name[64];

	if (bench_daemon_start(&d, args) != 0)
		return 1;
	for (int t = 2; t <= 4; t++) {
		struct bench_load loads[2] = {
			{.method = "GET", .path = "/livez", .threads = t, .warmup_s = 0.05,
			 .duration_s = secs},
			{.method = "GET", .path = "/v1/memory", .threads = t, .warmup_s = 0.05,
			 .duration_s = secs},
		};

		if (bench_load_interleaved(d.port, loads, 2, ROUNDS, res) != 0) {
			bench_daemon_stop(&d);
			return 1;
		}
		fprintf(stderr, "bench_http: %d conns: /livez %.0f req/s (p50 %.0f us, p99 %.0f us), "
		        "/v1/memory %.0f req/s (p50 %.0f us, p99 %.0f us), errors %llu+%llu\n", t,
		        res[0].rate, res[0].p50_us, res[0].p99_us, res[1].rate, res[1].p50_us,
		        res[1].p99_us, (unsigned long long)res[0].errors,
		        (unsigned long long)res[1].errors);
		if (res[1].rate > best[1].rate) {
			best[0] = res[0];
			best[1] = res[1];
			best_threads = t;
		}
	}
	if (bench_daemon_stop(&d) != 0)
		return 1;

	ratio = best[1].rate / best[0].rate;
	bench_fmt_rate(v, sizeof v, best[1].rate);
	bench_fmt_rate(ref, sizeof ref, best[0].rate);
	snprintf(ref + strlen(ref), sizeof ref - strlen(ref), " /livez");
	snprintf(tgt, sizeof tgt, ">= %.2f", RATIO_TARGET);
	bench_row("http: GET /v1/memory vs GET /livez", v, ref, ratio, tgt, true,
	          ratio >= RATIO_TARGET);

	snprintf(name, sizeof name, "http: GET /v1/memory rate (%d conns)", best_threads);
	snprintf(tgt, sizeof tgt, ">= %.0f req/s", RATE_TARGET);
	bench_row(name, v, NULL, NAN, tgt, true, best[1].rate >= RATE_TARGET);

	snprintf(v, sizeof v, "%.0f/%.0f us", best[1].p50_us, best[1].p99_us);
	snprintf(ref, sizeof ref, "%.0f/%.0f us /livez", best[0].p50_us, best[0].p99_us);
	bench_row("http: GET /v1/memory latency p50/p99", v, ref, NAN, NULL, false, false);
	return 0;
}
