/*
 * fuzz_first_head.c - libFuzzer target for the acceptor's check of a
 * connection's first request head (ts__head_check): never reads past what
 * it is given, and its answer agrees with the bytes: refused with a status,
 * a reason and a message; whole only when a blank line has come and within
 * the limits; still coming only within the limits.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_tuning.h"
#include "server/server_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* an exact-size copy, so that ASan sees any read past the end */
	char *b = malloc(size ? size : 1);
	struct ts__head h;
	int r;

	if (!b)
		return 0;
	memcpy(b, data, size);
	r = ts__head_check(b, size, &h);
	if (r == TS__HEAD_REFUSED &&
	    (!h.reason || !h.message[0] || h.http < 400 || h.http > 505))
		abort();
	if (r == TS__HEAD_OK &&
	    (h.len < 4 || h.len > size || h.len > TS_HTTP_HEAD_MAX || b[h.len - 1] != '\n' ||
	     h.fields > TS_HTTP_HEAD_FIELDS_MAX))
		abort();
	if (r == TS__HEAD_MORE && (size > TS_HTTP_HEAD_MAX || h.fields > TS_HTTP_HEAD_FIELDS_MAX))
		abort();
	if (r != TS__HEAD_OK && r != TS__HEAD_MORE && r != TS__HEAD_REFUSED)
		abort();
	free(b);
	return 0;
}
