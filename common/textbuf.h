/*
 * textbuf.h - a growing text buffer: the answers the daemon writes as text
 * (/metrics, /v1/trace, /v1/memory/history) are appended to one piece by
 * piece and taken whole at the end.
 *
 * Invariants: buf[0..len) is the text appended so far, NUL-terminated once
 * anything was appended (buf is NULL before); the first append that cannot
 * grow the buffer marks it failed, every later append is ignored, and
 * ts_textbuf_take answers NULL: a writer checks once, at the end.
 *
 * Thread-safety: none; a buffer belongs to the one thread writing it.
 */
#ifndef TS_TEXTBUF_H
#define TS_TEXTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ts_textbuf {
	char *buf;          /* private */
	size_t len, cap;    /* private */
	bool failed;        /* private: an append ran out of memory */
};

/* Sets b empty (no memory held); a zeroed struct is empty too. */
void ts_textbuf_init(struct ts_textbuf *b);

/* Makes room for n more bytes, so that that much text is appended without
 * growing again; false (and b failed) when out of memory or already
 * failed. */
bool ts_textbuf_reserve(struct ts_textbuf *b, size_t n);

/* Appends n bytes (copied). */
void ts_textbuf_add(struct ts_textbuf *b, const void *bytes, size_t n);

/* Appends the NUL-terminated s. */
void ts_textbuf_puts(struct ts_textbuf *b, const char *s);

/* Appends what printf would print; a format error marks b failed. */
void ts_textbuf_printf(struct ts_textbuf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Appends v in decimal (what "%llu" prints, without parsing a format: the
 * long columns of numbers in the history). */
void ts_textbuf_u64(struct ts_textbuf *b, uint64_t v);

/*
 * Appends s as a JSON string, quotes included, escaped as jansson's encoder
 * writes it: '"' and '\\' and the control characters (\b \f \n \r \t, the
 * others as \u00XX); every other byte is copied as it is (s is UTF-8).
 */
void ts_textbuf_json_string(struct ts_textbuf *b, const char *s);

/* Whether an append failed. */
bool ts_textbuf_failed(const struct ts_textbuf *b);

/*
 * The text, NUL-terminated (new; the caller frees it), its length in *len
 * (may be NULL); NULL when an append failed (or no memory for an empty
 * text). b is empty afterwards either way.
 */
char *ts_textbuf_take(struct ts_textbuf *b, size_t *len);

/* Frees what b holds and sets it empty. */
void ts_textbuf_release(struct ts_textbuf *b);

#endif
