/*
 * log.h - structured log lines: one JSON object per line on stderr.
 *
 * Every line carries a timestamp, a level and a message, and optionally a
 * request id and extra fields. Lines below the configured level are dropped
 * before any formatting.
 *
 * Thread-safety: ts_log may be called from any thread; each line is written
 * with one write(2) so lines never interleave. The level is an atomic set
 * once at start.
 */
#ifndef TS_LOG_H
#define TS_LOG_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

enum ts_log_level { TS_LOG_DEBUG = 0, TS_LOG_INFO, TS_LOG_WARN, TS_LOG_ERROR };

/* Parses "debug", "info", "warn", "error". */
bool ts_log_level_parse(const char *s, enum ts_log_level *out);

/* Sets the lowest level written (default info). */
void ts_log_set_level(enum ts_log_level lvl);

/* true when lines at lvl are written. */
bool ts_log_enabled(enum ts_log_level lvl);

/*
 * Writes {"ts":"...","level":"info","msg":"...", <fields>} where fields is
 * either NULL or a preformatted run of JSON members without braces, e.g.
 * "\"request_id\":\"r1\",\"status\":200". The line is built with jansson:
 * fields that do not parse as JSON members are kept as one string member
 * "fields", and no field overrides ts, level or msg, so every line is one
 * valid JSON object whatever the text.
 */
void ts_log(enum ts_log_level lvl, const char *fields, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The same with fields as a JSON object (steals the reference; NULL for
 * none). Use ts_json_text (common/utf8.h) for strings from clients. */
void ts_log_json(enum ts_log_level lvl, json_t *fields, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Escapes s into buf as the inside of a JSON string (bytes that are not
 * UTF-8 become U+FFFD); returns buf. */
char *ts_json_escape(char *buf, size_t cap, const char *s);

#endif
