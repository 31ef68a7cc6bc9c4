/*
 * page_token.h - the one codec of list page tokens (AIP-158): where a
 * listing's next page starts, bound to the listing and the filter it was
 * made for, with a check value, written as lower-case hex.
 *
 * Tokens are opaque to clients: only a token this codec wrote for the same
 * scope decodes; a garbled, invented or cut token, or one made for another
 * listing or filter, is refused. The check is FNV-1a (common/hash.h): it
 * catches mistakes and casual forgery; it is not a secret (a position is not
 * one either: a token only saves a client the listing it has already seen).
 *
 * Thread-safety: pure.
 */
#ifndef TS_PAGE_TOKEN_H
#define TS_PAGE_TOKEN_H

#include <stddef.h>

/* The longest position a token carries, and a buffer that holds any token
 * with its terminator. */
#define TS_PAGE_TOKEN_POS_MAX 128
#define TS_PAGE_TOKEN_MAX (2 * TS_PAGE_TOKEN_POS_MAX + 16 + 1)

/* Writes the token of position pos (len <= TS_PAGE_TOKEN_POS_MAX bytes) in
 * the listing scope (a text naming the listing and its filter, e.g.
 * "operations state=RUNNING") into buf (cap >= 2 * len + 17); returns buf,
 * or NULL (buf empty) when it does not fit. */
char *ts_page_token_write(char *buf, size_t cap, const char *scope, const void *pos, size_t len);

/* Decodes token, when ts_page_token_write wrote it for scope, into pos
 * (cap bytes): the position's length, or -1 for anything else. */
long ts_page_token_read(const char *token, const char *scope, void *pos, size_t cap);

#endif
