/*
 * fuzz_first_request.c - libFuzzer target for the acceptor's look at a
 * connection's first bytes (ts__first_request_class): never reads past
 * what it is given or past TS__LONG_LINE, and its answer agrees with the
 * bytes: bulk only for PUT, POST or PATCH or a line without an end in the
 * window, small only once a line end shows, undecided only while neither.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* an exact-size copy, so that ASan sees any read past the end */
	char *b = malloc(size ? size : 1);
	size_t w = size < TS__LONG_LINE ? size : TS__LONG_LINE;
	bool bulk = false, body, ended;
	int r;

	if (!b)
		return 0;
	memcpy(b, data, size);
	r = ts__first_request_class(b, size, &bulk);
	body = (w >= 4 && memcmp(b, "PUT ", 4) == 0) || (w >= 5 && memcmp(b, "POST ", 5) == 0) ||
	       (w >= 6 && memcmp(b, "PATCH ", 6) == 0);
	ended = memchr(b, '\n', w) != NULL;
	if (r == 1 && bulk && !body && (ended || size < TS__LONG_LINE))
		abort();
	if (r == 1 && !bulk && !ended)
		abort();
	if (r == 0 && (bulk || ended || body || size >= TS__LONG_LINE))
		abort();
	if (r != 0 && r != 1)
		abort();
	free(b);
	return 0;
}
