/*
 * bench_fleet.c - a cross-node copy between two tstaged in network
 * namespaces, over one veth link with UCX_TLS=tcp (tests/bench/fleet.sh
 * makes the namespaces, runs the daemons and measures; this prints its
 * figures as rows).
 *
 * Rows (bytes: $BENCH_FLEET_MB MiB, default 1024, of pinned_host):
 *   - the copy (POST :copy?wait=true to the other node, whole operation,
 *     best of 3, into pinned segments the receiving node's pool kept from
 *     the copy before) against ucx_perftest -t ucp_am_bw of the same bytes
 *     in the copy's 4 MiB messages over the same link, which reuses its
 *     buffers likewise (target >= 0.9);
 *   - the first copy, into pages the receiving node never had, against the
 *     same (no target: its time is the kernel's, faulting in and zeroing
 *     each fresh page as the bytes land, and on a virtual machine the
 *     hypervisor's backing of it);
 *   - the copy against an HTTP download of the array over the same link
 *     into memory, as a client program takes an array (GET .../data by
 *     libcurl on one kept connection, its bytes written into one buffer of
 *     the array's size touched before, as the copy lands in segments the
 *     receiving pool kept; best of 3; target >= 1.2): this program itself,
 *     run in the receiving namespace as `bench_fleet --fetch`;
 *   - the same download by the curl tool into /dev/null (no target: its
 *     bytes land in one small buffer that stays in cache, and go nowhere);
 *   - on links of 1 Gbit/s each way (tc tbf at both ends of every veth, as
 *     a NIC limits its port), up to 128 MiB broadcast to two nodes at once
 *     ("hosts": a chain, each byte once on each link) against the copy to
 *     one (best of 2 each; target <= 1.3);
 *   - the same on the unlimited links above (best of 3 each; no target:
 *     there nothing but the machine's two shared cores limits a copy, and
 *     a broadcast's three daemons do twice one copy's work on them);
 *   - a 4 KiB copy (best of 10) against ucx_perftest's round trip of 4 KiB
 *     active messages (twice its ucp_am_lat figure) plus one HTTP request
 *     between the same two nodes (GET /livez, best of 10; target <= 3).
 * Not root, or without ucx_perftest (ucx-utils) or curl/jq, the rows say so
 * and carry no verdict.
 */
#include <curl/curl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/bench/benchlib.h"

/* Where a download's bytes go: buf, cap bytes, got of them written. */
struct sink {
	unsigned char *buf;
	size_t cap, got;
};

static size_t into_memory(char *data, size_t size, size_t n, void *arg)
{
	struct sink *s = arg;
	size_t len = size * n;

	if (len > s->cap - s->got)
		return 0;          /* more than the array: the transfer fails */
	memcpy(s->buf + s->got, data, len);
	s->got += len;
	return len;
}

/* bench_fleet --fetch URL BYTES TOKEN ROUNDS: GET URL (BYTES long) ROUNDS
 * times on one kept connection into one buffer, touched before the first;
 * prints "fetch_bytes_s" and the best rate. */
static int fetch(const char *url, const char *bytes_s, const char *token, const char *rounds_s)
{
	size_t bytes = strtoull(bytes_s, NULL, 10);
	int rounds = atoi(rounds_s);
	struct sink s = {.buf = malloc(bytes ? bytes : 1), .cap = bytes};
	char auth[256];
	struct curl_slist *h;
	double best = 0;
	CURL *c;

	if (!s.buf || rounds < 1 || curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
		fprintf(stderr, "bench_fleet --fetch: no memory for %zu bytes, or bad rounds\n", bytes);
		return 1;
	}
	memset(s.buf, 1, bytes);
	snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
	h = curl_slist_append(NULL, auth);
	c = curl_easy_init();
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, into_memory);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
	curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
	curl_easy_setopt(c, CURLOPT_PROXY, "");
	for (int r = 0; r < rounds; r++) {
		struct timespec t0, t1;
		long code = 0;
		CURLcode rc;
		double secs;

		s.got = 0;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		rc = curl_easy_perform(c);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
		if (rc != CURLE_OK || code != 200 || s.got != bytes) {
			fprintf(stderr, "bench_fleet --fetch %s: %s, HTTP %ld, %zu of %zu bytes\n", url,
			        curl_easy_strerror(rc), code, s.got, bytes);
			return 1;
		}
		secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
		if ((double)bytes / secs > best)
			best = (double)bytes / secs;
	}
	printf("fetch_bytes_s %.0f\n", best);
	curl_easy_cleanup(c);
	curl_slist_free_all(h);
	free(s.buf);
	return 0;
}


int main(int argc, char **argv)
{
	const char *bin = getenv("TSTAGED") ? getenv("TSTAGED") : "build/tstaged";
	const char *mb = getenv("BENCH_FLEET_MB") ? getenv("BENCH_FLEET_MB") : "1024";
	char cmd[1536], self[1024], line[512], v[64], ref[64], vs_pt[64], vs_http[64], vs_bcast[64];
	char vs_null[64];
	ssize_t n;
	char vs_first[64];
	static const char vs_lbcast[] = "fleet: to 2 hosts / to 1, 1 Gbit/s links";
	static const char vs_small[] = "fleet: 4 KiB copy / (am round trip + HTTP)";
	double bytes = 0, copy_s = 0, first_s = 0, pt = 0, http = 0, null_http = 0, bcast = 0;
	double small = 0, req = 0, lat = 0;
	double lbytes = 0, lcopy = 0, lbcast = 0;
	double copy, small_ref;
	FILE *p;
	int rc;

	snprintf(vs_pt, sizeof vs_pt, "fleet: %s MiB copy / ucx_perftest am_bw", mb);
	snprintf(vs_first, sizeof vs_first, "fleet: first %s MiB copy / ucx_perftest", mb);
	if (argc == 6 && strcmp(argv[1], "--fetch") == 0)
		return fetch(argv[2], argv[3], argv[4], argv[5]);
	snprintf(vs_http, sizeof vs_http, "fleet: %s MiB copy / HTTP download", mb);
	snprintf(vs_null, sizeof vs_null, "fleet: %s MiB copy / curl to /dev/null", mb);
	n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0) {
		fprintf(stderr, "bench_fleet: cannot find its own path (/proc/self/exe)\n");
		return 1;
	}
	self[n] = '\0';
	snprintf(vs_bcast, sizeof vs_bcast, "fleet: %s MiB to 2 hosts / to 1, veth", mb);
	snprintf(cmd, sizeof cmd, "tests/bench/fleet.sh '%s' '%s' '%s'", bin, mb, self);
	p = popen(cmd, "r");
	if (!p) {
		fprintf(stderr, "bench_fleet: cannot run tests/bench/fleet.sh\n");
		return 1;
	}
	while (fgets(line, sizeof line, p)) {
		char what[64];
		double x;

		if (strncmp(line, "skip ", 5) == 0) {
			line[strcspn(line, "\n")] = '\0';
			bench_row(vs_pt, line + 5, "not measurable here", NAN, ">= 0.9", false,
			          true);
			bench_row(vs_first, line + 5, "not measurable here", NAN, NULL, false, true);
			bench_row(vs_http, line + 5, "not measurable here", NAN, ">= 1.2", false, true);
			bench_row(vs_null, line + 5, "not measurable here", NAN, NULL, false, true);
			bench_row(vs_lbcast, line + 5, "not measurable here", NAN, "<= 1.3", false,
			          true);
			bench_row(vs_bcast, line + 5, "not measurable here", NAN, NULL, false, true);
			bench_row(vs_small, line + 5, "not measurable here", NAN, "<= 3", false, true);
			pclose(p);
			return 0;
		}
		if (sscanf(line, "%63s %lf", what, &x) != 2)
			continue;
		if (strcmp(what, "copy_bytes") == 0)
			bytes = x;
		else if (strcmp(what, "copy_s") == 0)
			copy_s = x;
		else if (strcmp(what, "first_copy_s") == 0)
			first_s = x;
		else if (strcmp(what, "perftest_bytes_s") == 0)
			pt = x;
		else if (strcmp(what, "http_bytes_s") == 0)
			http = x;
		else if (strcmp(what, "curl_null_bytes_s") == 0)
			null_http = x;
		else if (strcmp(what, "broadcast_s") == 0)
			bcast = x;
		else if (strcmp(what, "limited_bytes") == 0)
			lbytes = x;
		else if (strcmp(what, "limited_copy_s") == 0)
			lcopy = x;
		else if (strcmp(what, "limited_broadcast_s") == 0)
			lbcast = x;
		else if (strcmp(what, "small_s") == 0)
			small = x;
		else if (strcmp(what, "request_s") == 0)
			req = x;
		else if (strcmp(what, "am_lat_s") == 0)
			lat = x;
	}
	rc = pclose(p);
	if (rc != 0 || bytes <= 0 || copy_s <= 0 || first_s <= 0 || pt <= 0 || http <= 0 || null_http <= 0 ||
	    bcast <= 0 ||
	    small <= 0 || req <= 0 || lat <= 0 || lbytes <= 0 || lcopy <= 0 || lbcast <= 0) {
		fprintf(stderr, "bench_fleet: tests/bench/fleet.sh failed (status %d)\n", rc);
		return 1;
	}
	copy = bytes / copy_s;
	snprintf(v, sizeof v, "%.2f GB/s", copy / 1e9);
	snprintf(ref, sizeof ref, "%.2f GB/s perftest", pt / 1e9);
	bench_row(vs_pt, v, ref, copy / pt, ">= 0.9", true, copy / pt >= 0.9);
	snprintf(ref, sizeof ref, "%.2f GB/s into memory", http / 1e9);
	bench_row(vs_http, v, ref, copy / http, ">= 1.2", true, copy / http >= 1.2);
	snprintf(ref, sizeof ref, "%.2f GB/s curl", null_http / 1e9);
	bench_row(vs_null, v, ref, copy / null_http, NULL, false, true);
	snprintf(v, sizeof v, "%.2f GB/s", bytes / first_s / 1e9);
	snprintf(ref, sizeof ref, "%.2f GB/s perftest", pt / 1e9);
	bench_row(vs_first, v, ref, bytes / first_s / pt, NULL, false, true);
	fprintf(stderr, "bench_fleet: on 1 Gbit/s links, %.0f MiB: copy %.3f s (%.2f GB/s), "
	        "broadcast to 2 %.3f s\n", lbytes / 1048576, lcopy, lbytes / lcopy / 1e9, lbcast);
	snprintf(v, sizeof v, "%.2f s", lbcast);
	snprintf(ref, sizeof ref, "%.2f s to one", lcopy);
	bench_row(vs_lbcast, v, ref, lbcast / lcopy, "<= 1.3", true, lbcast / lcopy <= 1.3);
	snprintf(v, sizeof v, "%.2f s", bcast);
	snprintf(ref, sizeof ref, "%.2f s to one", copy_s);
	bench_row(vs_bcast, v, ref, bcast / copy_s, NULL, false, true);
	small_ref = 2 * lat + req;
	fprintf(stderr, "bench_fleet: 4 KiB copy %.2f ms; ucx_perftest am latency %.1f us (half a "
	        "round trip), one HTTP request %.2f ms\n", small * 1e3, lat * 1e6, req * 1e3);
	snprintf(v, sizeof v, "%.2f ms", small * 1e3);
	snprintf(ref, sizeof ref, "%.2f ms rtt + request", small_ref * 1e3);
	bench_row(vs_small, v, ref, small / small_ref, "<= 3", true, small / small_ref <= 3);
	return 0;
}
