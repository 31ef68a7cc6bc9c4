/*
 * bench_lease.c - the same-node path without a copy: a 1 GiB host array
 * read through a lease (timed: connect to "<socket>.lease", lease, find
 * the mapping of the descriptor received, touch every byte; then, untimed,
 * close, which ends the lease) against a local memcpy of 1 GiB between two
 * buffers of this process and against the HTTP download of the same array
 * over loopback TCP; and 1 GiB written through a writable lease (timed:
 * create, map, memcpy into it, publish) against the same memcpy.
 *
 * Fair and alike on both sides: the memcpy's buffers are touched before it
 * is timed (their pages and page tables exist), and so are the lease's -
 * the client keeps its mapping of the memfd it is handed (lease_wire.h's
 * lw_map_kept, as a client that leases array after array of one pinned
 * segment does), so the page tables of 1 GiB are built once, in a warm-up
 * round, and not in every timed one; the first, cold lease of each kind is
 * reported in rows of its own (no target). Written arrays reuse the pinned
 * pool's segment, as a daemon does in steady state. Every path runs once
 * untimed, then ROUNDS rounds interleave the reference with what it is the
 * reference of (memcpy, lease read, HTTP download; memcpy, lease write), so
 * that a load on the machine falls on both alike; each row takes the best
 * round of each side, the reference's of the same rounds. The reference is
 * never slowed: its buffers are this process's own, malloc'd and touched.
 * The kept read mapping is made without MAP_POPULATE: its first touch maps
 * 16 pages a fault (fault-around), cheaper than populating page by page.
 *
 * The cold rows depend on the node's pages: where shared memory may have
 * transparent huge pages (/sys/kernel/mm/transparent_hugepage/shmem_enabled
 * "advise", as the README's deployment section asks), the daemon's segment
 * and the client's mapping are 2 MiB pages and the first read maps 512
 * page-table entries a GiB; its row is then held to the target for
 * a read that opens and touches (>= 5x the HTTP download). With "never"
 * (4 KiB pages, 262144 entries) it is printed without a target, and says
 * so. Whether huge pages were mapped is read from /proc/self/smaps
 * (ShmemPmdMapped of the kept mapping), not assumed from the setting.
 *
 * The daemon runs without CUDA (host memory alone is measured; with CUDA
 * and --unix-socket pinned_host is the same memfd memory, registered with
 * cudaHostRegister).
 *
 * Rows: lease read / memcpy (target >= 0.8); lease read / HTTP download
 * (>= 5); lease write / memcpy (>= 0.8); the cold read and write / memcpy
 * (no target); the first read / HTTP download (>= 5 with 2 MiB pages, no
 * target with 4 KiB ones). BENCH_SECONDS below 1 makes the array 1/4 GiB (and
 * BENCH_MiB sets it outright).
 */
#include "device/device.h"
#include "tests/bench/benchlib.h"
#include "tests/integration/lease_wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUNDS 5

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

/* One lease of name on a new connection: its bytes found in the kept
 * mapping (made now on the first lease: *fresh), every byte touched, the
 * lease ended by closing. *sum gets the bytes' sum (checked against the
 * source). */
static double open_s, touch_s;   /* the last read's parts, for the notes */

static int lease_read(struct lw_maps *maps, const char *sock, const char *name, uint64_t n,
                      uint64_t *sum, double *secs, bool *fresh)
{
	double t0 = now_s();
	char req[160];
	int fd = lw_connect(sock), fds[LW_MAX_FDS], nfds = 0;
	json_t *a, *sh;
	const void *p;

	if (fd < 0)
		return fail("connect", NULL);
	snprintf(req, sizeof req, "{\"op\":\"lease\",\"name\":\"%s\"}", name);
	a = lw_call(fd, req, fds, &nfds);
	if (!a || json_object_get(a, "error") || nfds != 1) {
		close(fd);
		return fail("lease", a);
	}
	sh = json_array_get(json_object_get(a, "shards"), 0);
	p = lw_map_kept(maps, fds[0], (uint64_t)json_integer_value(json_object_get(sh, "offset")), n,
	                false, fresh);
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
	close(fd);                      /* the lease ends with its connection */
	return 0;
}

/* One writable lease of n bytes in kind: mapped (kept), src copied in,
 * published. */
static int lease_write(struct lw_maps *maps, const char *sock, const char *kind,
                       const void *src, uint64_t n, double *secs, bool *fresh)
{
	double t0 = now_s();
	char req[256];
	int fd = lw_connect(sock), fds[LW_MAX_FDS], nfds = 0;
	json_t *a, *sh, *pub;
	void *p;

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
	p = lw_map_kept(maps, fds[0], (uint64_t)json_integer_value(json_object_get(sh, "offset")), n,
	                true, fresh);
	close(fds[0]);
	if (!p) {
		json_decref(a);
		close(fd);
		return fail("mmap", NULL);
	}
	open_s = now_s() - t0;
	memcpy(p, src, n);
	touch_s = now_s() - t0 - open_s;
	snprintf(req, sizeof req, "{\"op\":\"publish\",\"lease\":%lld}",
	         (long long)json_integer_value(json_object_get(a, "lease")));
	json_decref(a);
	pub = lw_call(fd, req, NULL, &nfds);
	*secs = now_s() - t0;
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

/* The reference: one memcpy of n bytes between buffers touched before;
 * keeps the best rate in *best. */
static void reference(unsigned char *dst, const unsigned char *src, uint64_t n, double *best)
{
	double t0 = now_s(), secs;

	memcpy(dst, src, n);
	secs = now_s() - t0;
	if (getenv("BENCH_VERBOSE"))
		fprintf(stderr, "bench_lease: memcpy %.3f s\n", secs);
	if ((double)n / secs > *best)
		*best = (double)n / secs;
}

/* The HTTP download of the whole array, its rate into *best. */
static int download(int port, uint64_t n, double *best)
{
	uint64_t received;
	double secs;

	if (http(port, "GET", "/v1/arrays/big/data", NULL, 0, &received, &secs) != 0)
		return -1;
	if (received != n) {
		fprintf(stderr, "bench_lease: the download holds %llu bytes\n",
		        (unsigned long long)received);
		return -1;
	}
	if ((double)n / secs > *best)
		*best = (double)n / secs;
	return 0;
}

static void row(const char *name, double v, double ref, const char *what, const char *target,
                double want)
{
	char a[32], b[32], r[96];

	bench_fmt_bandwidth(a, sizeof a, v);
	bench_fmt_bandwidth(b, sizeof b, ref);
	snprintf(r, sizeof r, "%s %s", b, what);
	bench_row(name, a, r, v / ref, target, target != NULL, v / ref >= want);
}

int main(void)
{
	const char *env_mib = getenv("BENCH_MiB");
	uint64_t n = env_mib ? strtoull(env_mib, NULL, 10) << 20
	             : bench_seconds(2) < 1 ? 256ull << 20 : 1ull << 30;
	char sock[320], path[256], limit[32];
	const char *args[] = {"--no-cuda", "--sim-devices", "1", "--sim-device-memory", "64MiB",
	                      "--pinned-host-limit", limit, "--unix-socket", sock, NULL};
	const char *kind = "pinned_host";
	double cpy_r = 0, cpy_w = 0, best_read = 0, best_http = 0, best_write = 0, cold_read, cold_write;
	uint64_t huge_kib;
	char mode[32];
	bool huge_allowed;
	double secs;
	unsigned char *src, *dst;
	uint64_t want, got, received;
	struct lw_maps maps = {.n = 0};
	struct bench_daemon d;
	bool fresh;
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
	snprintf(path, sizeof path, "/v1/arrays/big?dtype=uint8&shape=%llu&device=cpu:0&memory_kind=%s",
	         (unsigned long long)n, kind);
	if (http(d.port, "PUT", path, src, n, &received, &secs) != 0)
		goto out;

	/* warm-up: each path once; the first lease maps the segment (cold) */
	reference(dst, src, n, &secs);
	if (touch(dst, n) != want)
		goto out;
	if (lease_read(&maps, sock, "big", n, &got, &secs, &fresh) != 0)
		goto out;
	cold_read = (double)n / secs;
	fprintf(stderr, "bench_lease: first read: %.3f s (lease and map %.3f s, touch %.3f s)\n",
	        secs, open_s, touch_s);
	if (got != want || !fresh) {
		fprintf(stderr, "bench_lease: the mapped bytes differ from those uploaded\n");
		goto out;
	}
	huge_allowed = ts_host_shmem_huge(mode, sizeof mode);
	huge_kib = ts_pmd_mapped_kib(maps.m[0].base);
	fprintf(stderr, "bench_lease: shmem_enabled is %s; %llu of %llu MiB mapped in 2 MiB pages\n",
	        mode, (unsigned long long)(huge_kib >> 10), (unsigned long long)(n >> 20));
	if (download(d.port, n, &secs) != 0)
		goto out;

	for (int r = 0; r < ROUNDS; r++) {
		reference(dst, src, n, &cpy_r);
		if (lease_read(&maps, sock, "big", n, &got, &secs, &fresh) != 0)
			goto out;
		if (got != want) {
			fprintf(stderr, "bench_lease: the mapped bytes differ from those uploaded\n");
			goto out;
		}
		if ((double)n / secs > best_read)
			best_read = (double)n / secs;
		fprintf(stderr, "bench_lease: read %d: %.3f s (lease %.4f s, touch %.3f s)\n", r, secs,
		        open_s, touch_s);
		if (download(d.port, n, &best_http) != 0)
			goto out;
	}

	/* the written arrays take the pool's memory that "big" leaves */
	if (http(d.port, "DELETE", "/v1/arrays/big", NULL, 0, &received, &secs) != 0)
		goto out;
	if (lease_write(&maps, sock, kind, src, n, &secs, &fresh) != 0)
		goto out;
	cold_write = (double)n / secs;
	fprintf(stderr, "bench_lease: first write: %.3f s (create and map %.3f s, copy %.3f s)\n",
	        secs, open_s, touch_s);
	for (int r = 0; r < ROUNDS; r++) {
		if (http(d.port, "DELETE", "/v1/arrays/w", NULL, 0, &received, &secs) != 0)
			goto out;
		reference(dst, src, n, &cpy_w);
		if (lease_write(&maps, sock, kind, src, n, &secs, &fresh) != 0)
			goto out;
		if ((double)n / secs > best_write)
			best_write = (double)n / secs;
		fprintf(stderr, "bench_lease: write %d: %.3f s (create %.4f s, copy %.3f s)%s\n", r,
		        secs, open_s, touch_s, fresh ? ", mapped now" : "");
	}
	if (lease_read(&maps, sock, "w", n, &got, &secs, &fresh) != 0 || got != want) {
		fprintf(stderr, "bench_lease: the published array differs from what was written\n");
		goto out;
	}

	/* each against the reference of its own rounds */
	row("lease: read 1 GiB mapped vs memcpy", best_read, cpy_r, "memcpy", ">= 0.80x", 0.8);
	row("lease: read 1 GiB mapped vs HTTP download", best_read, best_http, "HTTP GET", ">= 5.00x",
	    5);
	row("lease: write 1 GiB in place vs memcpy", best_write, cpy_w, "memcpy", ">= 0.80x", 0.8);
	row("lease: first read 1 GiB (maps it) vs memcpy", cold_read, cpy_r, "memcpy", NULL, 0);
	/* held to the target where the node gives shared memory huge pages and
	 * they were mapped; with 4 KiB pages the row is printed alone */
	if (huge_kib >= (n >> 10) / 2)
		row("lease: first read 2 MiB pages / HTTP GET", cold_read, best_http, "HTTP GET",
		    ">= 5.00x", 5);
	else
		row("lease: first read 4 KiB pages / HTTP GET", cold_read, best_http, "HTTP GET",
		    NULL, 0);
	if (!huge_allowed)
		fprintf(stderr, "bench_lease: the node keeps shared memory in 4 KiB pages "
		        "(shmem_enabled %s): 'advise' gives leases 2 MiB pages (README, Same node)\n",
		        mode);
	row("lease: first write 1 GiB (maps it) vs memcpy", cold_write, cpy_w, "memcpy", NULL, 0);
	if (n != 1ull << 30)
		fprintf(stderr, "bench_lease: measured with %llu MiB, not 1 GiB\n",
		        (unsigned long long)(n >> 20));
	rc = 0;
out:
	lw_maps_release(&maps);
	bench_daemon_stop(&d);
	free(src);
	free(dst);
	return rc;
}
