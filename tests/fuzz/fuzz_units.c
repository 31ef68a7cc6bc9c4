/*
 * fuzz_units.c - libFuzzer target for the byte-size parser (flags and
 * environment variables): never crashes, and whatever parses formats back
 * to a non-empty string.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1), out[32];
	uint64_t v;
	long l;

	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	if (ts_parse_size(s, &v) && !ts_format_bytes(out, sizeof out, v)[0])
		abort();
	(void)ts_parse_long(s, -5, 5, &l);
	free(s);
	return 0;
}
