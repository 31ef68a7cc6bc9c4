/*
 * unit.c - the one main of the unit suites (tests/unit/unit.h): runs the
 * suite the file linked with it defines; the backend switch and the sim
 * fixture.
 */
#include "tests/unit/unit.h"

#include <stdlib.h>
#include <string.h>

#include "device/device.h"
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

int main(void)
{
	return ts_unit_run(ts_unit_suite());
}
