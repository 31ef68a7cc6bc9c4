/*
 * utf8.h - UTF-8 text as clients send it and as replies and log lines echo
 * it.
 *
 * Validation follows RFC 3629: no overlong forms, no surrogates, nothing
 * above U+10FFFF. The one overlong form given a meaning is C0 80, the way
 * the server's URL unescaper writes a decoded %00 so that a NUL stays
 * visible in text that libmicrohttpd hands over as a C string:
 * ts_utf8_check reports it (and a raw 0 byte) as TS_UTF8_NUL.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_UTF8_H
#define TS_UTF8_H

#include <jansson.h>
#include <stddef.h>

enum ts_utf8_fault {
	TS_UTF8_OK = 0,
	TS_UTF8_NUL,        /* a 0 byte, or C0 80 (a decoded %00) */
	TS_UTF8_INVALID,    /* any other byte that starts no valid sequence */
};

/* Checks s[0..len); on a fault *at (may be NULL) is the offset of the
 * first bad byte. */
enum ts_utf8_fault ts_utf8_check(const char *s, size_t len, size_t *at);

/* Cuts the NUL-terminated s before a trailing sequence that is incomplete
 * (what a byte-counting truncation leaves); returns s. */
char *ts_utf8_trim(char *s);

/* How many of s's first len bytes to echo when at most max may be: max cut
 * back to a character boundary (never inside a multi-byte sequence). */
int ts_utf8_prefix(const char *s, size_t len, size_t max);

/*
 * Copies the NUL-terminated s into dst (cap > 0 bytes, always terminated)
 * as valid UTF-8: each byte that starts no valid sequence becomes U+FFFD,
 * an incomplete trailing sequence is dropped, and the copy ends on a
 * character boundary when dst is too small. Returns dst.
 */
char *ts_utf8_sanitize(char *dst, size_t cap, const char *s);

/* Copies the NUL-terminated s into dst (cap > 0 bytes, always
 * terminated), cut to cap - 1 bytes, which may split a multi-byte
 * character: text that is echoed to a client or a log goes through
 * ts_utf8_sanitize or ts_utf8_trim first. Returns the length copied. */
size_t ts_str_copy(char *dst, size_t cap, const char *s);

/* A JSON string of s, made valid UTF-8 as ts_utf8_sanitize does (NULL is
 * ""). New reference; NULL only when out of memory. */
json_t *ts_json_text(const char *s);

#endif
