/*
 * fuzz_base64.c - libFuzzer target for the base64 decoder (Basic
 * credentials, a fleet receive's "data"): never writes past the buffer it
 * is given, and whatever decodes is the canonical encoding of its bytes
 * (encoded again, it gives the input back, less any padding left out).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base64.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* RFC 4648's encoding of n bytes at b into out (4 * ((n + 2) / 3) chars). */
static size_t encode(const unsigned char *b, size_t n, char *out)
{
	size_t o = 0;

	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
		             (i + 2 < n ? b[i + 2] : 0);

		out[o++] = abc[v >> 18];
		out[o++] = abc[(v >> 12) & 63];
		out[o++] = i + 1 < n ? abc[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < n ? abc[v & 63] : '=';
	}
	return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	bool padded;
	size_t cap, n, m, bare;
	unsigned char *out;
	char *text, *again;
	long got;

	if (size < 2)
		return 0;
	padded = data[0] & 1;
	cap = data[1];            /* the buffer: exact, so ASan sees an overrun */
	n = size - 2;
	text = malloc(n ? n : 1);
	out = malloc(cap ? cap : 1);
	if (!text || !out)
		abort();
	memcpy(text, data + 2, n);
	got = ts_base64_decode(text, n, padded, out, cap);
	if (got < -1 || got > (long)cap)
		abort();
	if (got >= 0) {
		again = malloc((size_t)got / 3 * 4 + 4);
		if (!again)
			abort();
		m = encode(out, (size_t)got, again);
		bare = m;
		while (bare && again[bare - 1] == '=')
			bare--;
		/* the input is the encoding, or (padding optional) it less its '=' */
		if (!((m == n && memcmp(again, text, n) == 0) ||
		      (!padded && bare == n && memcmp(again, text, n) == 0)))
			abort();
		free(again);
	}
	free(text);
	free(out);
	return 0;
}
