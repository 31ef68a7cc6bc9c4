/*
 * fuzz_config.c - libFuzzer target for the flag parser: the input is split
 * at NUL bytes into argv; parsing must never crash, and a run result must
 * leave every field within its documented range. The list flags the start
 * parses afterwards (--sim-numa-nodes, --pinned-host-numa-split) go
 * through their parsers too: accepted, every value within its range.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/topology.h"
#include "memory/space.h"
#include "server/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf = malloc(size + 1), *argv[33];
	int argc = 1;
	struct ts_config cfg;
	FILE *devnull = fopen("/dev/null", "w");

	if (!buf || !devnull)
		goto out;
	memcpy(buf, data, size);
	buf[size] = '\0';
	argv[0] = "tstaged";
	for (size_t i = 0; i <= size && argc < 32;) {
		argv[argc++] = buf + i;
		i += strlen(buf + i) + 1;
	}
	argv[argc] = NULL;
	if (ts_config_parse(&cfg, argc, argv, devnull, devnull) == TS_CONFIG_RUN) {
		if (cfg.port < 0 || cfg.port > 65535 || cfg.sim_devices < -1 ||
		    !(cfg.device_memory_fraction > 0 && cfg.device_memory_fraction <= 1) ||
		    memchr(cfg.bind, '\0', sizeof cfg.bind) == NULL)
			abort();
		{
			struct ts_memory_config mc = {0};
			struct ts_error err;
			int numa[64];
			size_t n = 0;

			ts_error_clear(&err);
			if (ts_topology_parse_list(cfg.sim_numa_nodes, numa, 64, &n, &err) == TS_OK) {
				if (n > 64)
					abort();
				for (size_t i = 0; i < n; i++)
					if (numa[i] < 0)
						abort();
			}
			ts_error_clear(&err);
			if (ts_memory_parse_numa_split(cfg.pinned_host_numa_split, &mc, &err) == TS_OK) {
				if (mc.numa_split_count > TS_MEMORY_NUMA_MAX)
					abort();
				for (size_t i = 0; i < mc.numa_split_count; i++)
					if (mc.numa_split[i].node < 0 || !(mc.numa_split[i].weight > 0) ||
					    !isfinite(mc.numa_split[i].weight))
						abort();
			}
		}
	}
out:
	if (devnull)
		fclose(devnull);
	free(buf);
	return 0;
}
