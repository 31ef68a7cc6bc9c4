/*
 * bench_fleet.c - a cross-node copy between two tstaged in network
 * namespaces, over one veth link with UCX_TLS=tcp (tests/bench/fleet.sh
 * makes the namespaces, runs the daemons and measures; this prints its
 * figures as rows).
 *
 * Rows (bytes: $BENCH_FLEET_MB MiB, default 1024, of pinned_host):
 *   - the copy (POST :copy?wait=true to the other node, whole operation,
 *     best of 3) against ucx_perftest -t ucp_am_bw of the same bytes in the
 *     copy's 4 MiB messages over the same link (target >= 0.9);
 *   - the copy against curl downloading the array over the same link
 *     (GET .../data, best of 3; target >= 1.2).
 * Not root, or without ucx_perftest (ucx-utils) or curl/jq, the rows say so
 * and carry no verdict.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/bench/benchlib.h"


int main(void)
{
	const char *bin = getenv("TSTAGED") ? getenv("TSTAGED") : "build/tstaged";
	const char *mb = getenv("BENCH_FLEET_MB") ? getenv("BENCH_FLEET_MB") : "1024";
	char cmd[1024], line[512], v[64], ref[64], vs_pt[64], vs_http[64];
	double bytes = 0, copy_s = 0, pt = 0, http = 0, copy;
	FILE *p;
	int rc;

	snprintf(vs_pt, sizeof vs_pt, "fleet: %s MiB copy / ucx_perftest am_bw", mb);
	snprintf(vs_http, sizeof vs_http, "fleet: %s MiB copy / HTTP download", mb);
	snprintf(cmd, sizeof cmd, "tests/bench/fleet.sh '%s' '%s'", bin, mb);
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
			bench_row(vs_http, line + 5, "not measurable here", NAN, ">= 1.2", false, true);
			pclose(p);
			return 0;
		}
		if (sscanf(line, "%63s %lf", what, &x) != 2)
			continue;
		if (strcmp(what, "copy_bytes") == 0)
			bytes = x;
		else if (strcmp(what, "copy_s") == 0)
			copy_s = x;
		else if (strcmp(what, "perftest_bytes_s") == 0)
			pt = x;
		else if (strcmp(what, "http_bytes_s") == 0)
			http = x;
	}
	rc = pclose(p);
	if (rc != 0 || bytes <= 0 || copy_s <= 0 || pt <= 0 || http <= 0) {
		fprintf(stderr, "bench_fleet: tests/bench/fleet.sh failed (status %d)\n", rc);
		return 1;
	}
	copy = bytes / copy_s;
	snprintf(v, sizeof v, "%.2f GB/s", copy / 1e9);
	snprintf(ref, sizeof ref, "%.2f GB/s perftest", pt / 1e9);
	bench_row(vs_pt, v, ref, copy / pt, ">= 0.9", true, copy / pt >= 0.9);
	snprintf(ref, sizeof ref, "%.2f GB/s curl", http / 1e9);
	bench_row(vs_http, v, ref, copy / http, ">= 1.2", true, copy / http >= 1.2);
	return 0;
}
