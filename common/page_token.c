/*
 * page_token.c - page tokens: hex(position) then 16 hex digits of FNV-1a
 * over a domain tag, the scope and the position (see page_token.h).
 */
#include "common/page_token.h"

#include <stdint.h>
#include <string.h>

#include "common/hash.h"
#include "common/hex.h"

static uint64_t token_check(const char *scope, const void *pos, size_t len)
{
	static const char tag[] = "tstage page token";
	uint64_t h = ts_fnv1a(TS_FNV1A_INIT, tag, sizeof tag);

	h = ts_fnv1a(h, scope, strlen(scope) + 1);     /* the NUL ends the scope */
	return ts_fnv1a(h, pos, len);
}

static void put_hex(char *dst, const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		dst[2 * i] = "0123456789abcdef"[b[i] >> 4];
		dst[2 * i + 1] = "0123456789abcdef"[b[i] & 15];
	}
}

char *ts_page_token_write(char *buf, size_t cap, const char *scope, const void *pos, size_t len)
{
	uint64_t h = token_check(scope, pos, len);
	unsigned char check[8];

	if (len > TS_PAGE_TOKEN_POS_MAX || cap < 2 * len + 17) {
		if (cap)
			buf[0] = '\0';
		return NULL;
	}
	for (int i = 0; i < 8; i++)
		check[i] = (unsigned char)(h >> (56 - 8 * i));
	put_hex(buf, pos, len);
	put_hex(buf + 2 * len, check, 8);
	buf[2 * len + 16] = '\0';
	return buf;
}

long ts_page_token_read(const char *token, const char *scope, void *pos, size_t cap)
{
	size_t n = strnlen(token, TS_PAGE_TOKEN_MAX), len;
	unsigned char *out = pos;
	uint64_t check = 0;

	if (n < 16 || n >= TS_PAGE_TOKEN_MAX || n % 2 != 0)
		return -1;
	len = (n - 16) / 2;
	if (len > cap)
		return -1;
	for (size_t i = 0; i < n; i++) {
		/* lower case only: one token per position */
		if (!((token[i] >= '0' && token[i] <= '9') || (token[i] >= 'a' && token[i] <= 'f')))
			return -1;
	}
	for (size_t i = 0; i < len; i++)
		out[i] = (unsigned char)(ts_hex_value(token[2 * i]) << 4 | ts_hex_value(token[2 * i + 1]));
	for (size_t i = 2 * len; i < n; i++)
		check = check << 4 | (uint64_t)ts_hex_value(token[i]);
	return check == token_check(scope, pos, len) ? (long)len : -1;
}
