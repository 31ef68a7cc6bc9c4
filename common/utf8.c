/*
 * utf8.c - RFC 3629 validation, boundary-safe truncation and repair of
 * UTF-8 text.
 */
#include "common/utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Length of the valid sequence at p (n bytes left), or 0 when p starts
 * none; *cut is set when p is a valid but incomplete prefix of one. */
static size_t seq_len(const unsigned char *p, size_t n, int *cut)
{
	unsigned c = p[0];
	unsigned lo = 0x80, hi = 0xBF;
	size_t need, i;

	*cut = 0;
	if (c < 0x80)
		return 1;
	if (c < 0xC2)
		return 0;              /* a continuation byte, or overlong C0/C1 */
	if (c < 0xE0) {
		need = 2;
	} else if (c < 0xF0) {
		need = 3;
		if (c == 0xE0)
			lo = 0xA0;         /* overlong */
		if (c == 0xED)
			hi = 0x9F;         /* surrogates */
	} else if (c < 0xF5) {
		need = 4;
		if (c == 0xF0)
			lo = 0x90;         /* overlong */
		if (c == 0xF4)
			hi = 0x8F;         /* above U+10FFFF */
	} else {
		return 0;
	}
	for (i = 1; i < need; i++) {
		if (i >= n) {
			*cut = 1;
			return 0;
		}
		if (p[i] < lo || p[i] > hi)
			return 0;
		lo = 0x80;
		hi = 0xBF;
	}
	return need;
}

/* Bytes from p on, up to n, that are ASCII and not NUL (1 to 0x7F): eight
 * at a time while a word of them holds no byte with its top bit set and no
 * zero byte (the usual bit trick), then one at a time. */
static size_t ascii_run(const unsigned char *p, size_t n)
{
	const uint64_t ones = 0x0101010101010101ull, tops = 0x8080808080808080ull;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t w;

		memcpy(&w, p + i, 8);
		if ((w & tops) || ((w - ones) & ~w & tops))
			break;
	}
	while (i < n && p[i] != 0 && p[i] < 0x80)
		i++;
	return i;
}

enum ts_utf8_fault ts_utf8_check(const char *s, size_t len, size_t *at)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;

	while (i < len) {
		size_t k;
		int cut;

		i += ascii_run(p + i, len - i);
		if (i == len)
			break;
		if (p[i] == 0 || (p[i] == 0xC0 && i + 1 < len && p[i + 1] == 0x80)) {
			if (at)
				*at = i;
			return TS_UTF8_NUL;
		}
		k = seq_len(p + i, len - i, &cut);      /* past the run: not ASCII */
		if (!k) {
			if (at)
				*at = i;
			return TS_UTF8_INVALID;
		}
		i += k;
	}
	return TS_UTF8_OK;
}

int ts_utf8_prefix(const char *s, size_t len, size_t max)
{
	size_t n = len < max ? len : max;

	/* a continuation byte (10xxxxxx) at n means n splits a sequence */
	while (n > 0 && n < len && ((unsigned char)s[n] & 0xc0) == 0x80)
		n--;
	return (int)n;
}

char *ts_utf8_trim(char *s)
{
	size_t len = strlen(s), j = len;
	unsigned lead;
	size_t need;

	while (j > 0 && len - j < 4 && ((unsigned char)s[j - 1] & 0xC0) == 0x80)
		j--;
	if (j == 0)
		return s;
	lead = (unsigned char)s[j - 1];
	need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
	if (need > 1 && len - (j - 1) < need)
		s[j - 1] = '\0';
	return s;
}

char *ts_utf8_sanitize(char *dst, size_t cap, const char *s)
{
	static const char repl[] = "\xEF\xBF\xBD";
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t n = strlen((const char *)p), i = 0, o = 0;

	while (i < n) {
		int cut;
		size_t run = ascii_run(p + i, n - i), k;

		if (run) {               /* plain text: copied as it is, cut to fit */
			size_t fit = run < cap - 1 - o ? run : cap - 1 - o;

			memcpy(dst + o, p + i, fit);
			o += fit;
			i += fit;
			if (fit < run)
				break;
			continue;
		}
		k = seq_len(p + i, n - i, &cut);
		if (!k && cut)
			break;                       /* a cut trailing sequence: drop it */
		if (k) {
			if (o + k >= cap)
				break;
			memcpy(dst + o, p + i, k);
			o += k;
			i += k;
		} else {
			if (o + 3 >= cap)
				break;
			memcpy(dst + o, repl, 3);
			o += 3;
			i++;
		}
	}
	dst[o] = '\0';
	return dst;
}

size_t ts_str_copy(char *dst, size_t cap, const char *s)
{
	size_t n = strnlen(s, cap - 1);

	memcpy(dst, s, n);
	dst[n] = '\0';
	return n;
}

json_t *ts_json_text(const char *s)
{
	json_t *j;
	char small[512], *buf;
	size_t cap;

	if (!s)
		s = "";
	j = json_string(s);          /* jansson checks the UTF-8 itself */
	if (j)
		return j;
	cap = strlen(s) * 3 + 1;
	buf = cap <= sizeof small ? small : malloc(cap);
	if (!buf)
		return NULL;
	j = json_string(ts_utf8_sanitize(buf, cap, s));
	if (buf != small)
		free(buf);
	return j;
}
