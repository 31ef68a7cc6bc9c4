/*
 * bench_lease.c - the same-node path without a copy: a 1 GiB host array
 * read through a lease (timed: connect to "<socket>.lease", lease, map the
 * descriptor received, touch every byte; then, untimed, unmap and close,
 * which ends the lease) against a local
 * memcpy of 1 GiB between two buffers of this process (touched before) and
 * against the HTTP download of the same array over loopback TCP; and 1 GiB
 * written through a writable lease (timed: create, map, memcpy into it,
 * publish; then unmap) against the same memcpy. All measured in the same run, each the best of
 * a few runs.
 *
 * The daemon runs without CUDA (host memory alone is measured; with CUDA
 * and --unix-socket pinned_host is the same memfd memory, registered with
 * cudaHostRegister). Written arrays reuse the pinned pool's segment (as a
 * daemon does in steady state): the runs after the first fault no new
 * pages. Mappings are made with MAP_POPULATE (page tables filled at once:
 * the pages exist already, in the daemon).
 *
 * Rows: lease read / memcpy (target >= 0.8); lease read / HTTP download
 * (>= 5); lease write / memcpy (>= 0.8). BENCH_SECONDS below 1 makes the
 * array 1/4 GiB (and BENCH_MiB sets it outright).
 */
#include "tests/bench/benchlib.h"
#include "tests/integration/lease_wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 3

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reads every byte (as 8-byte words, summed so the loads stay). */
static uint64_t touch(const void *p, size_t n)
{
	const uint64_t *w = p;
	uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
	size_t i, k = n / 8;

	for (i = 0; i + 4 <= k; i += 4) {
		s0 += w[i];
		s1 += w[i + 1];
		s2 += w[i + 2];
		s3 += w[i + 3];
	}
	for (; i < k; i++)
		s0 += w[i];
	for (size_t b = k * 8; b < n; b++)
		s0 += ((const unsigned char *)p)[b];
	return s0 + s1 + s2 + s3;
}

static int fail(const char *what, json_t *j)
{
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

	fprintf(stderr, "bench_lease: %s: %s\n", what, text ? text : strerror(errno));
	free(text);
	json_decref(j);
	return -1;
}

/* One lease of name on a new connection: mapped, every byte touched,
 * released. *sum gets the bytes' sum (checked against the source). */
static double open_s, touch_s;   /* the last read's parts, for the notes */

static int lease_read(const char *sock, const char *name, uint64_t n, uint64_t *sum,
                      double *secs)
{
	double t0 = now_s();
	char req[160];
	int fd = lw_connect(sock), fds[LW_MAX_FDS], nfds = 0;
	json_t *a, *sh;
	const void *p;
	void *base;
	size_t maplen;

	if (fd < 0)
		return fail("connect", NULL);
	snprintf(req, sizeof req, "{\"op\":\"lease\",\"name\":\"%s\"}", name);
	a = lw_call(fd, req, fds, &nfds);
	if (!a || json_object_get(a, "error") || nfds != 1) {
		close(fd);
		return fail("lease", a);
	}
	sh = json_array_get(json_object_get(a, "shards"), 0);
	p = lw_map(fds[0], (uint64_t)json_integer_value(json_object_get(sh, "offset")), n, false,
	           MAP_POPULATE, &base, &maplen);
	close(fds[0]);
	json_decref(a);
	if (!p) {
		close(fd);
		return fail("mmap", NULL);
	}
	open_s = now_s() - t0;
	*sum = touch(p, n);
	touch_s = now_s() - t0 - open_s;
	*secs = open_s + touch_s;
	munmap(base, maplen);
	close(fd);                      /* the lease ends with its connection */
	return 0;
}

/* One writable lease of n bytes in kind: mapped, src copied in, published. */
static int lease_write(const char *sock, const char *kind, const void *src, uint64_t n,
                       double *secs)
{
	double t0 = now_s();
	char req[256];
	int fd = lw_connect(sock), fds[LW_MAX_FDS], nfds = 0;
	json_t *a, *sh, *pub;
	void *p, *base;
	size_t maplen;

	if (fd < 0)
		return fail("connect", NULL);
	snprintf(req, sizeof req, "{\"op\":\"create\",\"name\":\"w\",\"dtype\":\"uint8\","
	         "\"shape\":[%llu],\"device\":\"cpu:0\",\"memory_kind\":\"%s\"}",
	         (unsigned long long)n, kind);
	a = lw_call(fd, req, fds, &nfds);
	if (!a || json_object_get(a, "error") || nfds != 1) {
		close(fd);
		return fail("create", a);
	}
	sh = json_array_get(json_object_get(a, "shards"), 0);
	p = lw_map(fds[0], (uint64_t)json_integer_value(json_object_get(sh, "offset")), n, true,
	           MAP_POPULATE, &base, &maplen);
	close(fds[0]);
	if (!p) {
		json_decref(a);
		close(fd);
		return fail("mmap", NULL);
	}
	memcpy(p, src, n);
	snprintf(req, sizeof req, "{\"op\":\"publish\",\"lease\":%lld}",
	         (long long)json_integer_value(json_object_get(a, "lease")));
	json_decref(a);
	pub = lw_call(fd, req, NULL, &nfds);
	*secs = now_s() - t0;
	munmap(base, maplen);
	close(fd);
	if (!pub || json_object_get(pub, "error"))
		return fail("publish", pub);
	json_decref(pub);
	return 0;
}

static int http(int port, const char *method, const char *path, const void *chunk,
                uint64_t body_len, uint64_t *received, double *secs)
{
	char reply[512];
	int code = bench_http_transfer(port, method, path, NULL, chunk, chunk ? body_len : 0, body_len,
	                               reply, sizeof reply, received, secs);

	if (code < 200 || code >= 300) {
		fprintf(stderr, "bench_lease: %s %s: %d %s\n", method, path, code, reply);
		return -1;
	}
	return 0;
}

int main(void)
{
	const char *env_mib = getenv("BENCH_MiB");
	uint64_t n = env_mib ? strtoull(env_mib, NULL, 10) << 20
	             : bench_seconds(2) < 1 ? 256ull << 20 : 1ull << 30;
	char sock[320], path[256], limit[32], v[64], ref[96];
	const char *args[] = {"--no-cuda", "--sim-devices", "1", "--sim-device-memory", "64MiB",
	                      "--pinned-host-limit", limit, "--unix-socket", sock, NULL};
	const char *kind = "pinned_host";
	double best_cpy = 0, best_read = 0, best_http = 0, best_write = 0, t0, secs, ratio;
	unsigned char *src, *dst;
	uint64_t want, got, received;
	struct bench_daemon d;
	int rc = 1;

	snprintf(limit, sizeof limit, "%llu", (unsigned long long)(n + (n >> 1)));
	snprintf(sock, sizeof sock, "/tmp/tstage-bench-lease-%d", (int)getpid());
	src = malloc(n);
	dst = malloc(n);
	if (!src || !dst) {
		fprintf(stderr, "bench_lease: no memory for two buffers of %llu bytes\n",
		        (unsigned long long)n);
		return 1;
	}
	for (uint64_t i = 0; i < n / 8; i++)
		((uint64_t *)src)[i] = i * 0x9e3779b97f4a7c15ull;
	memset(dst, 0, n);
	want = touch(src, n);
	if (bench_daemon_start(&d, args) != 0)
		return 1;

	/* the reference: a local memcpy between touched buffers */
	for (int r = 0; r < RUNS; r++) {
		t0 = now_s();
		memcpy(dst, src, n);
		secs = now_s() - t0;
		if ((double)n / secs > best_cpy)
			best_cpy = (double)n / secs;
	}
	if (touch(dst, n) != want)
		goto out;

	snprintf(path, sizeof path, "/v1/arrays/big?dtype=uint8&shape=%llu&device=cpu:0&memory_kind=%s",
	         (unsigned long long)n, kind);
	if (http(d.port, "PUT", path, src, n, &received, &secs) != 0)
		goto out;

	for (int r = 0; r < RUNS; r++) {
		if (lease_read(sock, "big", n, &got, &secs) != 0)
			goto out;
		if (got != want) {
			fprintf(stderr, "bench_lease: the mapped bytes differ from those uploaded\n");
			goto out;
		}
		if ((double)n / secs > best_read)
			best_read = (double)n / secs;
		fprintf(stderr, "bench_lease: read %d: %.3f s (lease and map %.3f s, touch %.3f s)\n",
		        r, secs, open_s, touch_s);
	}
	for (int r = 0; r < 2; r++) {
		if (http(d.port, "GET", "/v1/arrays/big/data", NULL, 0, &received, &secs) != 0)
			goto out;
		if (received != n) {
			fprintf(stderr, "bench_lease: the download holds %llu bytes\n",
			        (unsigned long long)received);
			goto out;
		}
		if ((double)n / secs > best_http)
			best_http = (double)n / secs;
	}
	/* the written arrays take the pool's memory that "big" leaves */
	if (http(d.port, "DELETE", "/v1/arrays/big", NULL, 0, &received, &secs) != 0)
		goto out;
	for (int r = 0; r < RUNS; r++) {
		if (lease_write(sock, kind, src, n, &secs) != 0)
			goto out;
		if ((double)n / secs > best_write)
			best_write = (double)n / secs;
		if (r + 1 < RUNS &&
		    http(d.port, "DELETE", "/v1/arrays/w", NULL, 0, &received, &secs) != 0)
			goto out;
	}
	if (lease_read(sock, "w", n, &got, &secs) != 0 || got != want) {
		fprintf(stderr, "bench_lease: the published array differs from what was written\n");
		goto out;
	}

	{
		char c[32], h[32];

		bench_fmt_bandwidth(c, sizeof c, best_cpy);
		bench_fmt_bandwidth(h, sizeof h, best_http);
		bench_fmt_bandwidth(v, sizeof v, best_read);
		ratio = best_read / best_cpy;
		snprintf(ref, sizeof ref, "%s memcpy", c);
		bench_row("lease: read 1 GiB mapped vs memcpy", v, ref, ratio, ">= 0.80x", true,
		          ratio >= 0.8);
		ratio = best_read / best_http;
		snprintf(ref, sizeof ref, "%s HTTP GET", h);
		bench_row("lease: read 1 GiB mapped vs HTTP download", v, ref, ratio, ">= 5.00x", true,
		          ratio >= 5);
		ratio = best_write / best_cpy;
		snprintf(ref, sizeof ref, "%s memcpy", c);
		bench_fmt_bandwidth(v, sizeof v, best_write);
		bench_row("lease: write 1 GiB in place vs memcpy", v, ref, ratio, ">= 0.80x", true,
		          ratio >= 0.8);
	}
	if (n != 1ull << 30)
		fprintf(stderr, "bench_lease: measured with %llu MiB, not 1 GiB\n",
		        (unsigned long long)(n >> 20));
	rc = 0;
out:
	bench_daemon_stop(&d);
	free(src);
	free(dst);
	return rc;
}
