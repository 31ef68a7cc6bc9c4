/*
 * unit.c - the one main of the unit suites (tests/unit/unit.h): runs the
 * suite the file linked with it defines; the backend switch, the sim
 * fixture and the topology fixtures.
 */
#include "tests/unit/unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/device.h"
#include "device/topology.h"
#include "memory/space.h"
#include "storage/stage.h"

int ts_unit_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

bool ts_unit_cuda(void)
{
	const char *backend = getenv("TS_TEST_BACKEND");

	return backend && strcmp(backend, "cuda") == 0;
}

void ts_unit_sim_new(const struct ts_unit_sim_config *c, struct ts_device_set **set,
                     struct ts_memory **mem, struct ts_stager **stager)
{
	struct ts_device_config dc = {.sim_devices = c->devices,
	                              .sim_device_memory = c->device_memory, .cuda = false,
	                              .host = c->host ? c->host : "t"};
	struct ts_memory_config mc = {.device_memory_fraction = c->device_fraction,
	                              .pinned_host_limit = c->pinned,
	                              .unpinned_host_limit = c->unpinned,
	                              .pinned_segment = c->segment,
	                              .pinned_host_keep = c->pinned_keep ? c->pinned_keep
	                                                                 : TS_PINNED_KEEP_NONE,
	                              .preallocate = c->preallocate};
	struct ts_error err;

	ts_error_clear(&err);
	TS_UNIT_OK(err, ts_device_set_new(&dc, set, &err));
	TS_UNIT_OK(err, ts_memory_new(*set, &mc, mem, &err));
	if (stager)
		TS_UNIT_OK(err, ts_stager_new(*set, *mem, stager, &err));
}

void ts_unit_sim_free(struct ts_device_set *set, struct ts_memory *mem, struct ts_stager *stager)
{
	ts_stager_free(stager);
	ts_memory_free(mem);
	ts_device_set_free(set);
}

const char *ts_unit_data(const char *name)
{
	static char paths[4][512];
	static unsigned next;
	const char *dir = getenv("TS_TEST_DATA");
	char *p = paths[next++ % 4];

	snprintf(p, sizeof paths[0], "%s/%s", dir ? dir : "tests/data", name);
	return p;
}

struct ts_device_set *ts_unit_sims(int n)
{
	struct ts_device_config cfg = {.sim_devices = n, .sim_device_memory = 1 << 20,
	                               .cuda = false, .host = "testhost"};
	struct ts_device_set *set = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	TS_UNIT_OK(err, ts_device_set_new(&cfg, &set, &err));
	return set;
}

struct ts_topology *ts_unit_topology(const char *xml, const struct ts_device_set *set,
                                     const int *numa, size_t n, const char *links)
{
	struct ts_topology *t = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	TS_UNIT_OK(err, ts_topology_new(&(struct ts_topology_config){.xml_file = xml,
	                                                             .sim_peer_links = links,
	                                                             .sim_numa_nodes = numa,
	                                                             .sim_numa_count = n},
	                                set, &t, &err));
	return t;
}

int main(void)
{
	return ts_unit_run(ts_unit_suite());
}
