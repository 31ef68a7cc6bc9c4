/*
 * bench_serve.c - small requests and items against servers built for them,
 * measured with one load generator (benchlib's event loop: the same
 * connections, keep-alive, one request at a time on each) in one run, in
 * interleaved rounds, at 1, 4, 16, 64 and 256 connections:
 *
 *   GET /v1/memory       vs nginx serving a static file of the same size
 *                        (and a bare libmicrohttpd server with tstaged's
 *                        daemon flags answering as many bytes from memory:
 *                        what the library allows);
 *   one 12 KiB item      (GET /v1/arrays/items/data?index=k of a [N,6,1024]
 *                        uint16 array) vs Redis GET of the same bytes, and
 *                        the bare libmicrohttpd server answering the k-th
 *                        12 KiB of as many (so its bytes are as cold)
 *                        against the same Redis: the ceiling the HTTP
 *                        library sets, measured in the same rounds; the
 *                        same bare server with 64 KiB of connection
 *                        memory (tstaged's for connections that open with
 *                        an upload) instead of 16 KiB (libmicrohttpd
 *                        zeroes the whole pool and half of it again on
 *                        every request: what the two daemons save); and
 *                        each server's CPU per item in those windows
 *                        (/proc/PID/stat, every thread): what a request
 *                        costs, which on a shared 2-core machine is
 *                        steadier than the rate it allows;
 *   32 random items      (GET ...?rows=a,b,...) vs Redis MGET of 32 keys.
 *
 * Targets: /v1/memory >= 1.0x nginx from 4 to 256 connections, and its rate
 * at 256 >= 0.8x its rate at 4; an item >= 1.0x Redis GET at 1 and 4
 * connections; a batch >= 1.0x MGET at every count. nginx runs with one
 * worker per core and Redis with one I/O thread, tstaged with its default
 * threads (one per core), and neither logs per request.
 */
#include "tests/bench/benchlib.h"
#include "server/http_tuning.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ITEM_BYTES (6 * 1024 * 2)
#define NITEMS 4096
#define BATCH 32
#define ROUNDS 3
#define NCOUNTS 5

static const int counts[NCOUNTS] = {1, 4, 16, 64, 256};

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

/* Item j of request seq of connection conn: the same sequence for every
 * target. */
static unsigned pick(int conn, uint64_t seq, int j)
{
	return (unsigned)(mix(((seq * 1024 + (uint64_t)conn) << 6) + (uint64_t)j + 1) % NITEMS);
}

/* Where a generator's requests go: the port, and for items the path's
 * format ("...?index=%u": tstaged's data path, or the bare server's
 * /item). */
struct gen {
	int port;
	const char *item_fmt;
};

static size_t item_http(void *arg, int conn, uint64_t seq, char *buf, size_t cap)
{
	const struct gen *g = arg;
	char path[96];

	snprintf(path, sizeof path, g->item_fmt, pick(conn, seq, 0));
	return bench_http_get(buf, cap, g->port, path, NULL);
}

static size_t item_resp(void *arg, int conn, uint64_t seq, char *buf, size_t cap)
{
	char key[32];
	int k = snprintf(key, sizeof key, "item:%u", pick(conn, seq, 0));
	int n = snprintf(buf, cap, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", k, key);

	(void)arg;
	return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

static size_t batch_http(void *arg, int conn, uint64_t seq, char *buf, size_t cap)
{
	const struct gen *g = arg;
	char path[512];
	size_t o = (size_t)snprintf(path, sizeof path, "/v1/arrays/items/data?rows=");

	for (int j = 0; j < BATCH; j++)
		o += (size_t)snprintf(path + o, sizeof path - o, "%s%u", j ? "," : "",
		                      pick(conn, seq, j));
	return bench_http_get(buf, cap, g->port, path, NULL);
}

static size_t batch_resp(void *arg, int conn, uint64_t seq, char *buf, size_t cap)
{
	size_t o = (size_t)snprintf(buf, cap, "*%d\r\n$4\r\nMGET\r\n", BATCH + 1);

	(void)arg;
	for (int j = 0; j < BATCH && o < cap; j++) {
		char key[32];
		int k = snprintf(key, sizeof key, "item:%u", pick(conn, seq, j));

		o += (size_t)snprintf(buf + o, cap - o, "$%d\r\n%s\r\n", k, key);
	}
	return o < cap ? o : 0;
}

static double secs;

static struct bench_mload load_of(enum bench_proto proto, int conns)
{
	return (struct bench_mload){.proto = proto, .conns = conns, .warmup_s = 0.1,
	                            .duration_s = secs};
}

/* A server's CPU per request against another's (lower is cheaper). */
static void cpu_row(const char *name, int conns, double us, double ref_us, const char *ref_name)
{
	char row[96], vs[64], rs[64];

	snprintf(row, sizeof row, "%s (%d conns)", name, conns);
	snprintf(vs, sizeof vs, "%.1f us", us);
	snprintf(rs, sizeof rs, "%.1f us %s", ref_us, ref_name);
	bench_row(row, vs, rs, ref_us > 0 ? us / ref_us : 0, NULL, false, false);
}

static void rate_row(const char *name, int conns, double v, double ref, const char *ref_name,
                     double target, bool has_target)
{
	char row[96], vs[64], rs[64], tg[32];

	snprintf(row, sizeof row, "%s (%d conns)", name, conns);
	bench_fmt_rate(vs, sizeof vs, v);
	bench_fmt_rate(rs, sizeof rs, ref);
	snprintf(rs + strlen(rs), sizeof rs - strlen(rs), " %s", ref_name);
	snprintf(tg, sizeof tg, ">= %.2f", target);
	bench_row(row, vs, rs, v / ref, has_target ? tg : NULL, has_target, v / ref >= target);
}

/* GET /v1/memory against nginx and the bare libmicrohttpd server. */
static int bench_memory(const struct bench_daemon *d)
{
	struct bench_ref ngx = {0}, mhd = {0};
	char reply[65536], path[400], req[3][512];
	double rate[NCOUNTS] = {0};
	uint64_t got = 0;
	double t;
	int rc = -1, ports[3];
	FILE *f;

	if (bench_http_transfer(d->port, "GET", "/v1/memory", NULL, NULL, 0, 0, reply, sizeof reply,
	                        &got, &t) != 200 || got >= sizeof reply) {
		fprintf(stderr, "bench_serve: GET /v1/memory failed\n");
		return -1;
	}
	if (bench_ref_dir(&ngx, "nginx") != 0)
		goto out;
	snprintf(path, sizeof path, "%s/www/memory.json", ngx.dir);
	if (!(f = fopen(path, "w")) || fwrite(reply, 1, got, f) != got || fclose(f) != 0) {
		fprintf(stderr, "bench_serve: cannot write %s\n", path);
		goto out;
	}
	if (bench_nginx_start(&ngx, (int)sysconf(_SC_NPROCESSORS_ONLN)) != 0 ||
	    bench_ref_dir(&mhd, "mhd") != 0 || bench_mhd_start(&mhd, got) != 0)
		goto out;
	fprintf(stderr, "bench_serve: /v1/memory answers %llu bytes; nginx on %d, bare "
	        "libmicrohttpd on %d\n", (unsigned long long)got, ngx.port, mhd.port);
	ports[0] = d->port;
	ports[1] = ngx.port;
	ports[2] = mhd.port;
	bench_http_get(req[0], sizeof req[0], d->port, "/v1/memory", NULL);
	bench_http_get(req[1], sizeof req[1], ngx.port, "/memory.json", NULL);
	bench_http_get(req[2], sizeof req[2], mhd.port, "/small", NULL);
	for (int i = 0; i < NCOUNTS; i++) {
		struct bench_mload loads[3];
		struct bench_result res[3];

		for (int k = 0; k < 3; k++) {
			loads[k] = load_of(BENCH_PROTO_HTTP, counts[i]);
			loads[k].fixed = req[k];
			loads[k].fixed_len = strlen(req[k]);
		}
		if (bench_mload_interleaved(ports, loads, 3, ROUNDS, res) != 0)
			goto out;
		fprintf(stderr, "bench_serve: %3d conns: /v1/memory %.0f req/s (p50 %.0f us, p99 %.0f "
		        "us, %llu errors), nginx %.0f, bare libmicrohttpd %.0f\n", counts[i],
		        res[0].rate, res[0].p50_us, res[0].p99_us, (unsigned long long)res[0].errors,
		        res[1].rate, res[2].rate);
		rate[i] = res[0].errors ? 0 : res[0].rate;
		rate_row("http: /v1/memory / nginx", counts[i], rate[i], res[1].rate,
		         "nginx", 1.0, counts[i] >= 4);
		rate_row("http: /v1/memory / bare MHD", counts[i], rate[i], res[2].rate,
		         "bare MHD", 0, false);
	}
	{
		char v[64], r[64];

		bench_fmt_rate(v, sizeof v, rate[NCOUNTS - 1]);
		bench_fmt_rate(r, sizeof r, rate[1]);
		snprintf(r + strlen(r), sizeof r - strlen(r), " at 4 conns");
		bench_row("http: /v1/memory 256 conns / 4 conns", v, r, rate[NCOUNTS - 1] / rate[1],
		          ">= 0.80", true, rate[NCOUNTS - 1] / rate[1] >= 0.8);
	}
	rc = 0;
out:
	bench_ref_stop(&ngx);
	bench_ref_stop(&mhd);
	return rc;
}

/* Items and batches of items against Redis GET and MGET. */
static int bench_items(const struct bench_daemon *d, const char *data)
{
	static const char put[] = "/v1/arrays/items?dtype=uint16&shape=4096,6,1024"
	                          "&memory_kind=unpinned_host";
	struct bench_ref rds = {0}, mhd = {0}, mhd_bulk = {0};
	struct gen g = {.port = d->port, .item_fmt = "/v1/arrays/items/data?index=%u"},
	           gb = {.item_fmt = "/item?index=%u"}, gs = {.item_fmt = "/item?index=%u"};
	char reply[512], *cmds = NULL;
	uint64_t got;
	double t;
	size_t o = 0;
	int rc = -1, ports[4];

	if (bench_http_transfer(d->port, "PUT", put, NULL, data, (size_t)NITEMS * ITEM_BYTES,
	                        (uint64_t)NITEMS * ITEM_BYTES, reply, sizeof reply, &got,
	                        &t) != 201) {
		fprintf(stderr, "bench_serve: PUT %s: %s\n", put, reply);
		return -1;
	}
	if (bench_ref_dir(&rds, "redis") != 0 || bench_redis_start(&rds) != 0 ||
	    bench_ref_dir(&mhd, "mhd-item") != 0 || bench_mhd_start(&mhd, ITEM_BYTES) != 0 ||
	    bench_ref_dir(&mhd_bulk, "mhd-item-bulk") != 0 ||
	    /* the bulk daemon's connection memory: what libmicrohttpd's zeroing
	     * of the whole pool per request would cost an item there */
	    bench_mhd_start_pool(&mhd_bulk, ITEM_BYTES, TS_HTTP_CONN_MEMORY_BULK) != 0)
		goto out;
	gb.port = mhd.port;
	gs.port = mhd_bulk.port;
	/* the same bytes under item:<row> */
	cmds = malloc((size_t)NITEMS * (ITEM_BYTES + 64));
	if (!cmds)
		goto out;
	for (int i = 0; i < NITEMS; i++) {
		char key[32];
		int k = snprintf(key, sizeof key, "item:%d", i);

		o += (size_t)sprintf(cmds + o, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n", k, key,
		                     ITEM_BYTES);
		memcpy(cmds + o, data + (size_t)i * ITEM_BYTES, ITEM_BYTES);
		o += ITEM_BYTES;
		memcpy(cmds + o, "\r\n", 2);
		o += 2;
	}
	if (bench_resp_send(rds.port, cmds, o, NITEMS) != 0) {
		fprintf(stderr, "bench_serve: loading redis failed\n");
		goto out;
	}
	ports[0] = d->port;
	ports[1] = rds.port;
	ports[2] = mhd.port;
	ports[3] = mhd_bulk.port;
	for (int batch = 0; batch < 2; batch++) {
		for (int i = 0; i < NCOUNTS; i++) {
			struct bench_mload loads[4] = {load_of(BENCH_PROTO_HTTP, counts[i]),
			                               load_of(BENCH_PROTO_RESP, counts[i]),
			                               load_of(BENCH_PROTO_HTTP, counts[i]),
			                               load_of(BENCH_PROTO_HTTP, counts[i])};
			struct bench_result res[4];

			loads[0].next = batch ? batch_http : item_http;
			loads[0].arg = &g;
			loads[1].next = batch ? batch_resp : item_resp;
			loads[1].expect_bulk = ITEM_BYTES;
			loads[2].next = item_http;
			loads[2].arg = &gb;
			loads[0].cpu_pid = d->pid;
			loads[1].cpu_pid = rds.pid;
			loads[2].cpu_pid = mhd.pid;
			loads[3].next = item_http;
			loads[3].arg = &gs;
			loads[3].cpu_pid = mhd_bulk.pid;
			/* the bare servers take part in the item rounds only */
			if (bench_mload_interleaved(ports, loads, batch ? 2 : 4, ROUNDS, res) != 0)
				goto out;
			fprintf(stderr, "bench_serve: %3d conns: %s %.0f req/s (p50 %.0f us, p99 %.0f us, "
			        "%llu errors), redis %.0f (%llu errors)\n", counts[i],
			        batch ? "32 items" : "item", res[0].rate, res[0].p50_us, res[0].p99_us,
			        (unsigned long long)res[0].errors, res[1].rate,
			        (unsigned long long)res[1].errors);
			if (res[0].errors)
				res[0].rate = 0;
			if (batch)
				rate_row("batch: ?rows= 32 items / MGET", counts[i], res[0].rate,
				         res[1].rate, "MGET", 1.0, true);
			else {
				rate_row("items: 12 KiB item / redis GET", counts[i], res[0].rate,
				         res[1].rate, "GET", 1.0, counts[i] <= 4);
				rate_row("items: bare MHD 12 KiB / redis GET", counts[i], res[2].rate,
				         res[1].rate, "GET", 0, false);
				rate_row("items: 12 KiB item / bare MHD 12 KiB", counts[i], res[0].rate,
				         res[2].rate, "bare MHD", 0, false);
				rate_row("items: bare MHD 64 KiB pool / redis GET", counts[i], res[3].rate,
				         res[1].rate, "GET", 0, false);
				fprintf(stderr, "bench_serve: %3d conns: CPU per item: tstaged %.1f us, "
				        "bare libmicrohttpd %.1f us, redis %.1f us\n", counts[i],
				        res[0].cpu_us, res[2].cpu_us, res[1].cpu_us);
				if (counts[i] <= 4) {
					cpu_row("items: CPU/item tstaged / redis", counts[i], res[0].cpu_us,
					        res[1].cpu_us, "redis");
					cpu_row("items: CPU/item bare MHD / redis", counts[i], res[2].cpu_us,
					        res[1].cpu_us, "redis");
					cpu_row("items: CPU/item bare 64 KiB pool / redis", counts[i],
					        res[3].cpu_us, res[1].cpu_us, "redis");
				}
			}
		}
	}
	rc = 0;
out:
	free(cmds);
	bench_ref_stop(&rds);
	bench_ref_stop(&mhd);
	bench_ref_stop(&mhd_bulk);
	return rc;
}

int main(void)
{
	static const char *const args[] = {"--sim-devices", "1", "--sim-device-memory", "256MiB",
	                                   NULL};
	struct bench_daemon d;
	char *data = malloc((size_t)NITEMS * ITEM_BYTES);
	int rc = 0;

	if (!data)
		return 1;
	for (size_t i = 0; i < (size_t)NITEMS * ITEM_BYTES; i += 8) {
		uint64_t x = mix(i);

		memcpy(data + i, &x, 8);
	}
	secs = bench_seconds(1.5);
	if (bench_daemon_start(&d, args) != 0) {
		free(data);
		return 1;
	}
	if (bench_memory(&d) != 0 || bench_items(&d, data) != 0)
		rc = 1;
	if (bench_daemon_stop(&d) != 0)
		rc = 1;
	free(data);
	return rc;
}
