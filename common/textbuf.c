/*
 * textbuf.c - the growing text buffer (textbuf.h): doubling growth, a
 * sticky failure, printf and the JSON string encoding.
 */
#include "common/textbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ts_textbuf_init(struct ts_textbuf *b)
{
	memset(b, 0, sizeof *b);
}

bool ts_textbuf_reserve(struct ts_textbuf *b, size_t n)
{
	size_t cap;
	char *grown;

	if (b->failed)
		return false;
	if (n < b->cap - b->len)        /* room for n and the NUL */
		return true;
	if (n > SIZE_MAX / 2 - b->len - 1) {
		b->failed = true;
		return false;
	}
	cap = b->cap ? b->cap : 256;
	while (cap < b->len + n + 1)
		cap *= 2;
	grown = realloc(b->buf, cap);
	if (!grown) {
		b->failed = true;
		return false;
	}
	b->buf = grown;
	b->cap = cap;
	return true;
}

void ts_textbuf_add(struct ts_textbuf *b, const void *bytes, size_t n)
{
	if (!ts_textbuf_reserve(b, n))
		return;
	memcpy(b->buf + b->len, bytes, n);
	b->len += n;
	b->buf[b->len] = '\0';
}

void ts_textbuf_puts(struct ts_textbuf *b, const char *s)
{
	ts_textbuf_add(b, s, strlen(s));
}

void ts_textbuf_printf(struct ts_textbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->failed)
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->buf ? b->buf + b->len : NULL, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->failed = true;
		return;
	}
	if ((size_t)n >= b->cap - b->len) {          /* it did not fit: grow, print again */
		if (!ts_textbuf_reserve(b, (size_t)n))
			return;
		va_start(ap, fmt);
		vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t)n;
}

void ts_textbuf_u64(struct ts_textbuf *b, uint64_t v)
{
	char tmp[20];
	size_t n = 0;

	do {
		tmp[sizeof tmp - ++n] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	ts_textbuf_add(b, tmp + sizeof tmp - n, n);
}

void ts_textbuf_json_string(struct ts_textbuf *b, const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	const char *run = s;

	ts_textbuf_add(b, "\"", 1);
	for (;; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[6] = {'\\', 0, '0', '0', 0, 0};
		size_t n = 2;

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		ts_textbuf_add(b, run, (size_t)(s - run));   /* the bytes that need none */
		if (!c)
			break;
		run = s + 1;
		switch (c) {
		case '"': esc[1] = '"'; break;
		case '\\': esc[1] = '\\'; break;
		case '\b': esc[1] = 'b'; break;
		case '\f': esc[1] = 'f'; break;
		case '\n': esc[1] = 'n'; break;
		case '\r': esc[1] = 'r'; break;
		case '\t': esc[1] = 't'; break;
		default:
			esc[1] = 'u';
			esc[4] = hex[c >> 4];
			esc[5] = hex[c & 15];
			n = 6;
		}
		ts_textbuf_add(b, esc, n);
	}
	ts_textbuf_add(b, "\"", 1);
}

bool ts_textbuf_failed(const struct ts_textbuf *b)
{
	return b->failed;
}

char *ts_textbuf_take(struct ts_textbuf *b, size_t *len)
{
	char *text = NULL;

	if (!b->failed && ts_textbuf_reserve(b, 0)) {   /* an empty text has its NUL too */
		b->buf[b->len] = '\0';
		text = b->buf;
		if (len)
			*len = b->len;
		b->buf = NULL;
	}
	ts_textbuf_release(b);
	return text;
}

void ts_textbuf_release(struct ts_textbuf *b)
{
	free(b->buf);
	ts_textbuf_init(b);
}
