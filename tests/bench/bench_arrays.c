/*
 * bench_arrays.c - array data over HTTP: bulk uploads and downloads of a
 * 1 GiB uint8 array in pinned_host memory, each as a ratio to loopback TCP
 * moving the same bytes between two threads of this process in the same
 * run; the latency of fetching one [6,1024] uint16 item (?index=i) from a
 * 4 GiB parent against a 4 MiB one (an item costs the bytes it selects,
 * whatever the parent's size); and items per second over keep-alive
 * connections at random indices of the 4 GiB parent.
 *
 * Rows and targets: upload / loopback >= 0.8; download / loopback >= 0.8;
 * upload / a bare libmicrohttpd sink and download / its source (tstaged's
 * daemon flags, bodies dropped or sent from one block; benchlib) >= 0.9;
 * median item latency 4 GiB / 4 MiB parent <= 1.2; items/s >= 10000 (of 2,
 * 3 and 4 connections, the best). Warm-ups: the pinned pool is filled by a
 * first upload and a replace before a replace is timed, and one download
 * goes before the timed ones; loopback, upload and download then take turns
 * for four rounds and each keeps its best. The daemon runs with
 * --pinned-host-limit 3GiB (a replace holds both versions) and
 * --unpinned-host-limit 6GiB; the 4 GiB parent is uploaded in one PUT
 * streamed from a 64 MiB buffer, so the bench itself stays small.
 */
#include "tests/bench/benchlib.h"
#include "server/http_tuning.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GiB (1ull << 30)
#define MiB (1ull << 20)
#define CHUNK (64 * MiB)
#define ITEM_BYTES (6 * 1024 * 2)            /* one [6,1024] uint16 item */
#define BIG_ROWS (4 * GiB / ITEM_BYTES)       /* 349525 items: 4 GiB less 4 KiB */
#define SMALL_ROWS (4 * MiB / ITEM_BYTES)     /* 341 items: 4 MiB less 4 KiB */
#define RUNS 4

#define BULK_TARGET 0.8
#define BARE_TARGET 0.9
#define LATENCY_TARGET 1.2
#define ITEMS_TARGET 10000.0

/* Which parent the item generator indexes. */
struct items {
	const char *name;
	uint64_t rows;
};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

/* A random item of the parent, different for every client and request. */
static void item_path(void *arg, int client, uint64_t seq, char *buf, size_t cap)
{
	const struct items *it = arg;
	uint64_t i = mix(seq * 64 + (uint64_t)client + 1) % it->rows;

	snprintf(buf, cap, "/v1/arrays/%s/data?index=%llu", it->name, (unsigned long long)i);
}

/* One PUT (or GET with body_len 0) that must answer want: its rate (body
 * or response bytes per second), or -1. */
static double transfer_rate(int port, const char *method, const char *path, const char *chunk,
                            uint64_t body_len, uint64_t expect_bytes, int want)
{
	char reply[512];
	uint64_t got = 0;
	double secs = 0;
	int code = bench_http_transfer(port, method, path, NULL, chunk, CHUNK, body_len, reply,
	                               sizeof reply, &got, &secs);

	if (code != want || (expect_bytes && got != expect_bytes)) {
		fprintf(stderr, "bench_arrays: %s %s: %d (want %d), %llu bytes: %s\n", method, path,
		        code, want, (unsigned long long)got, reply);
		return -1;
	}
	return (double)(body_len ? body_len : got) / secs;
}

static bool put_once(int port, const char *path, const char *chunk, uint64_t len, int want)
{
	char reply[512];
	uint64_t got;
	double secs;
	int code = bench_http_transfer(port, "PUT", path, NULL, chunk, CHUNK, len, reply,
	                               sizeof reply, &got, &secs);

	if (code != want)
		fprintf(stderr, "bench_arrays: PUT %s: %d (want %d): %s\n", path, code, want, reply);
	else
		fprintf(stderr, "bench_arrays: PUT %s: %.2f GB/s\n", path, (double)len / secs / 1e9);
	return code == want;
}

static bool delete_array(int port, const char *name)
{
	char path[128], reply[256];
	uint64_t got;
	double secs;

	snprintf(path, sizeof path, "/v1/arrays/%s", name);
	return bench_http_transfer(port, "DELETE", path, NULL, NULL, 0, 0, reply, sizeof reply, &got,
	                           &secs) == 200;
}

/* Upload and download of 1 GiB in pinned_host against loopback TCP,
 * measured in interleaved rounds (loopback, upload, download, loopback,
 * ...) so that whatever else the machine does falls on each alike; each
 * is the best of its rounds. */
static int bench_bulk(int port, const char *chunk)
{
	static const char put_path[] = "/v1/arrays/bulk?dtype=uint8&shape=1073741824"
	                               "&memory_kind=pinned_host";
	double tcp = 0, up = 0, down = 0, sink = 0, source = 0;
	char v[64], ref[64], tgt[32], big[64];
	struct bench_ref mhd = {0};

	/* the bare libmicrohttpd sink and source, with tstaged's flags */
	if (bench_ref_dir(&mhd, "mhd") != 0 || bench_mhd_start_pool(&mhd, 16, TS_HTTP_CONN_MEMORY_BULK) != 0) {
		bench_ref_stop(&mhd);
		return -1;
	}
	snprintf(big, sizeof big, "/big?bytes=%llu", (unsigned long long)GiB);

	/* fill the pinned pool: the first version, then a replace that holds
	 * both; the timed replaces reuse what they freed. One download warms
	 * the way out. */
	if (!put_once(port, put_path, chunk, GiB, 201) || !put_once(port, put_path, chunk, GiB, 200) ||
	    transfer_rate(port, "GET", "/v1/arrays/bulk/data", chunk, 0, GiB, 200) <= 0) {
		bench_ref_stop(&mhd);
		return -1;
	}
	for (int r = 0; r < RUNS; r++) {
		double t = bench_tcp_loopback(chunk, CHUNK, GiB, 1);
		double u = transfer_rate(port, "PUT", put_path, chunk, GiB, 0, 200);
		double g = transfer_rate(port, "GET", "/v1/arrays/bulk/data", chunk, 0, GiB, 200);
		double ks = transfer_rate(mhd.port, "PUT", "/sink", chunk, GiB, 0, 200);
		double kg = transfer_rate(mhd.port, "GET", big, chunk, 0, GiB, 200);

		if (t <= 0 || u <= 0 || g <= 0 || ks <= 0 || kg <= 0) {
			bench_ref_stop(&mhd);
			return -1;
		}
		fprintf(stderr, "bench_arrays: round %d: loopback %.2f GB/s, upload %.2f GB/s, "
		        "download %.2f GB/s, bare libmicrohttpd sink %.2f GB/s, source %.2f GB/s\n",
		        r, t / 1e9, u / 1e9, g / 1e9, ks / 1e9, kg / 1e9);
		tcp = t > tcp ? t : tcp;
		up = u > up ? u : up;
		down = g > down ? g : down;
		sink = ks > sink ? ks : sink;
		source = kg > source ? kg : source;
	}
	bench_ref_stop(&mhd);
	if (!delete_array(port, "bulk"))
		return -1;

	snprintf(tgt, sizeof tgt, ">= %.2f", BULK_TARGET);
	bench_fmt_bandwidth(ref, sizeof ref, tcp);
	snprintf(ref + strlen(ref), sizeof ref - strlen(ref), " loopback TCP");
	bench_row("arrays: upload 1 GiB pinned / loopback TCP", bench_fmt_bandwidth(v, sizeof v, up),
	          ref, up / tcp, tgt, true, up / tcp >= BULK_TARGET);
	bench_row("arrays: download 1 GiB pinned / loopback TCP",
	          bench_fmt_bandwidth(v, sizeof v, down), ref, down / tcp, tgt, true,
	          down / tcp >= BULK_TARGET);

	snprintf(tgt, sizeof tgt, ">= %.2f", BARE_TARGET);
	bench_fmt_bandwidth(ref, sizeof ref, sink);
	snprintf(ref + strlen(ref), sizeof ref - strlen(ref), " bare MHD sink");
	bench_row("arrays: upload 1 GiB pinned / bare MHD sink", bench_fmt_bandwidth(v, sizeof v, up),
	          ref, up / sink, tgt, true, up / sink >= BARE_TARGET);
	bench_fmt_bandwidth(ref, sizeof ref, source);
	snprintf(ref + strlen(ref), sizeof ref - strlen(ref), " bare MHD source");
	bench_row("arrays: download 1 GiB / bare MHD source",
	          bench_fmt_bandwidth(v, sizeof v, down), ref, down / source, tgt, true,
	          down / source >= BARE_TARGET);
	return 0;
}

/* Item latency from a 4 GiB against a 4 MiB parent, and items/s. */
static int bench_items(int port, const char *chunk, double secs)
{
	static struct items big = {"parent4g", BIG_ROWS}, small = {"parent4m", SMALL_ROWS};
	struct bench_result res[2], best = {0};
	int best_threads = 0;
	char path[200], v[64], ref[64], tgt[32], name[64];
	double ratio;

	snprintf(path, sizeof path, "/v1/arrays/%s?dtype=uint16&shape=%llu,6,1024"
	         "&memory_kind=unpinned_host", big.name, (unsigned long long)big.rows);
	if (!put_once(port, path, chunk, big.rows * ITEM_BYTES, 201))
		return -1;
	snprintf(path, sizeof path, "/v1/arrays/%s?dtype=uint16&shape=%llu,6,1024"
	         "&memory_kind=unpinned_host", small.name, (unsigned long long)small.rows);
	if (!put_once(port, path, chunk, small.rows * ITEM_BYTES, 201))
		return -1;

	{
		struct bench_load loads[2] = {
			{.method = "GET", .threads = 1, .warmup_s = 0.05, .duration_s = secs,
			 .next_path = item_path, .next_path_arg = &big},
			{.method = "GET", .threads = 1, .warmup_s = 0.05, .duration_s = secs,
			 .next_path = item_path, .next_path_arg = &small},
		};

		if (bench_load_interleaved(port, loads, 2, 6, res) != 0)
			return -1;
	}
	fprintf(stderr, "bench_arrays: item of 4 GiB: p50 %.0f us p99 %.0f us (%llu, %llu errors); "
	        "of 4 MiB: p50 %.0f us p99 %.0f us (%llu, %llu errors)\n", res[0].p50_us,
	        res[0].p99_us, (unsigned long long)res[0].requests,
	        (unsigned long long)res[0].errors, res[1].p50_us, res[1].p99_us,
	        (unsigned long long)res[1].requests, (unsigned long long)res[1].errors);
	ratio = res[0].p50_us / res[1].p50_us;
	snprintf(v, sizeof v, "%.0f us", res[0].p50_us);
	snprintf(ref, sizeof ref, "%.0f us of 4 MiB parent", res[1].p50_us);
	snprintf(tgt, sizeof tgt, "<= %.2f", LATENCY_TARGET);
	bench_row("arrays: item p50, 4 GiB / 4 MiB parent", v, ref, ratio, tgt, true,
	          ratio <= LATENCY_TARGET && res[0].errors == 0);

	for (int t = 2; t <= 4; t++) {
		struct bench_load load = {.method = "GET", .threads = t, .warmup_s = 0.05,
		                          .duration_s = secs, .next_path = item_path,
		                          .next_path_arg = &big};
		struct bench_result r;

		if (bench_load_run(port, &load, &r) != 0)
			return -1;
		fprintf(stderr, "bench_arrays: %d conns: %.0f items/s (p50 %.0f us, p99 %.0f us, "
		        "%llu errors)\n", t, r.rate, r.p50_us, r.p99_us, (unsigned long long)r.errors);
		if (r.rate > best.rate) {
			best = r;
			best_threads = t;
		}
	}
	snprintf(name, sizeof name, "arrays: random items of 4 GiB (%d conns)", best_threads);
	snprintf(v, sizeof v, "%.1fk items/s", best.rate / 1e3);
	snprintf(tgt, sizeof tgt, ">= %.0f items/s", ITEMS_TARGET);
	bench_row(name, v, NULL, NAN, tgt, true, best.rate >= ITEMS_TARGET && best.errors == 0);
	return delete_array(port, big.name) && delete_array(port, small.name) ? 0 : -1;
}

int main(void)
{
	static const char *const args[] = {"--sim-devices", "1", "--sim-device-memory", "256MiB",
	                                   "--pinned-host-limit", "3GiB",
	                                   "--unpinned-host-limit", "6GiB", NULL};
	struct bench_daemon d;
	char *chunk = malloc(CHUNK);
	int rc = 0;

	if (!chunk)
		return 1;
	for (size_t i = 0; i < CHUNK; i += 8) {
		uint64_t x = i * 0x9e3779b97f4a7c15ull;

		memcpy(chunk + i, &x, 8);
	}
	if (bench_daemon_start(&d, args) != 0) {
		free(chunk);
		return 1;
	}
	if (bench_bulk(d.port, chunk) != 0 || bench_items(d.port, chunk, bench_seconds(1.5)) != 0)
		rc = 1;
	if (bench_daemon_stop(&d) != 0)
		rc = 1;
	free(chunk);
	return rc;
}
