/*
 * base64.c - standard base64 decoding (base64.h).
 */
#include "common/base64.h"

/* The six bits of c, or -1 outside the alphabet. */
static int value(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	return c == '+' ? 62 : c == '/' ? 63 : -1;
}

long ts_base64_decode(const char *src, size_t n, bool padded, void *out, size_t cap)
{
	unsigned char *o = out;
	size_t pad = 0, data, len = 0;
	unsigned acc = 0;
	int bits = 0;

	while (pad < n && src[n - 1 - pad] == '=')
		pad++;
	data = n - pad;
	/* one character left over encodes no byte; padding fills the last
	 * group of four, so with it the text is whole groups */
	if (pad > 2 || data % 4 == 1 || ((padded || pad) && n % 4 != 0))
		return -1;
	if (data / 4 * 3 + (data % 4 ? data % 4 - 1 : 0) > cap)
		return -1;
	for (size_t i = 0; i < data; i++) {
		int v = value((unsigned char)src[i]);

		if (v < 0)
			return -1;
		acc = (acc << 6 | (unsigned)v) & 0xffffff;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			o[len++] = (unsigned char)(acc >> bits & 0xff);
		}
	}
	/* the bits past the last byte are zero in the canonical encoding */
	if (bits && (acc & ((1u << bits) - 1)) != 0)
		return -1;
	return (long)len;
}
