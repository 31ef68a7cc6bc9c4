/*
 * fuzz_router.c - libFuzzer target: any method and path against the real
 * route table must match, 404 or 405 without reading out of bounds, and a
 * match's parameters must be non-empty substrings of the path. The table is
 * prepared once, as the server prepares it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const methods[] = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"};
	static struct ts_router *rt;
	struct ts_route_match m;
	char *path;

	if (!rt && !(rt = ts_router_new(ts_routes, ts_nroutes)))
		abort();
	if (size < 1)
		return 0;
	path = malloc(size);
	if (!path)
		return 0;
	memcpy(path, data + 1, size - 1);
	path[size - 1] = '\0';
	if (ts_router_find(rt, methods[data[0] % 6], path, &m) == TS_MATCH_FOUND) {
		if (m.index >= ts_nroutes)
			abort();
		for (int i = 0; i < m.nparams; i++)
			if (!m.params[i].value[0] || !strstr(path, m.params[i].value))
				abort();
	}
	free(path);
	return 0;
}
