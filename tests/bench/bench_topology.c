/*
 * bench_topology.c - what topology discovery adds to a start: this
 * machine's hwloc topology loaded and every device placed, as tstaged does
 * (CUDA devices when there are, whose placement needs the PCI scan; two sim
 * devices). The row is the slowest of several discoveries; the target is
 * 50 ms. Against the two-socket XML of tests/data too, when run from the
 * checkout's root.
 */
#include <math.h>
#include <stdio.h>
#include <unistd.h>

#include "device/device.h"
#include "device/topology.h"
#include "tests/bench/benchlib.h"

#define RUNS 5
#define TARGET_MS 50.0

/* The slowest of RUNS discoveries from xml (NULL: this machine), in ms; -1
 * when one fails. */
static double slowest(const struct ts_device_set *set, const char *xml)
{
	double worst = 0;

	for (int i = 0; i < RUNS; i++) {
		struct ts_topology *t = NULL;
		struct ts_error err;
		double ms;

		ts_error_clear(&err);
		if (ts_topology_new(&(struct ts_topology_config){.xml_file = xml}, set, &t, &err) !=
		    TS_OK) {
			fprintf(stderr, "bench_topology: %s\n", err.message);
			return -1;
		}
		ms = (double)ts_topology_discovery_ns(t) / 1e6;
		worst = ms > worst ? ms : worst;
		ts_topology_free(t);
	}
	return worst;
}

static int row(const char *name, double ms)
{
	char v[32], tgt[32];

	if (ms < 0)
		return 1;
	snprintf(v, sizeof v, "%.1f ms", ms);
	snprintf(tgt, sizeof tgt, "< %.0f ms", TARGET_MS);
	bench_row(name, v, NULL, NAN, tgt, true, ms < TARGET_MS);
	return 0;
}

int main(void)
{
	struct ts_device_config cfg = {.sim_devices = 2, .sim_device_memory = 1 << 20,
	                               .cuda = true};
	struct ts_device_set *set = NULL;
	struct ts_error err;
	int rc = 0;

	ts_error_clear(&err);
	if (ts_device_set_new(&cfg, &set, &err) != TS_OK) {
		fprintf(stderr, "bench_topology: %s\n", err.message);
		return 1;
	}
	rc |= row("topology: discovery, this machine", slowest(set, NULL));
	if (access("tests/data/two_socket.xml", R_OK) == 0)
		rc |= row("topology: discovery, two-socket XML", slowest(set, "tests/data/two_socket.xml"));
	ts_device_set_free(set);
	return rc;
}
