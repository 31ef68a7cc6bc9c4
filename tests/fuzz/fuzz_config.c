/*
 * fuzz_config.c - libFuzzer target for the flag parser: the input is split
 * at NUL bytes into argv; parsing must never crash, and a run result must
 * leave every field within its documented range.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	}
out:
	if (devnull)
		fclose(devnull);
	free(buf);
	return 0;
}
