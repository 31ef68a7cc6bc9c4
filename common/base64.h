/*
 * base64.h - standard base64 (RFC 4648, section 4: the A-Z a-z 0-9 + /
 * alphabet, '=' padding), decoded from client text: the Authorization
 * header's Basic credentials and a fleet receive's "data".
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_BASE64_H
#define TS_BASE64_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Decodes the n characters at src (no NUL needed) into out (cap bytes).
 * Returns the bytes decoded, or -1 when src is not base64: a character
 * outside the alphabet, '=' other than one or two at the end, a length no
 * bytes encode to, bits left over in the last character (a non-canonical
 * encoding), or more than cap bytes. With padded, the text must be padded
 * to a multiple of four characters as RFC 4648 writes it; without, the
 * padding may be left out (but when present it must be right).
 */
long ts_base64_decode(const char *src, size_t n, bool padded, void *out, size_t cap);

#endif
