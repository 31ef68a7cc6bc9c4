/*
 * log.c - JSON log lines on stderr.
 *
 * The level is process-wide configuration written once at start; it is an
 * atomic so that a late change is still safe. Lines are built with jansson
 * (never by pasting text), so that no byte of a client's can forge a
 * member or break a line.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/utf8.h"

static _Atomic int log_level = TS_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

bool ts_log_level_parse(const char *s, enum ts_log_level *out)
{
	for (int i = 0; i <= TS_LOG_ERROR; i++) {
		if (strcasecmp(s, level_names[i]) == 0) {
			*out = (enum ts_log_level)i;
			return true;
		}
	}
	if (strcasecmp(s, "warning") == 0) {
		*out = TS_LOG_WARN;
		return true;
	}
	return false;
}

void ts_log_set_level(enum ts_log_level lvl)
{
	atomic_store(&log_level, (int)lvl);
}

bool ts_log_enabled(enum ts_log_level lvl)
{
	return (int)lvl >= atomic_load(&log_level);
}

char *ts_json_escape(char *buf, size_t cap, const char *s)
{
	char clean[1024];
	size_t o = 0;

	ts_utf8_sanitize(clean, sizeof clean, s);
	for (const char *p = clean; *p && o + 7 < cap; p++) {
		unsigned char c = (unsigned char)*p;

		if (c == '"' || c == '\\') {
			buf[o++] = '\\';
			buf[o++] = (char)c;
		} else if (c < 0x20) {
			o += (size_t)snprintf(buf + o, cap - o, "\\u%04x", c);
		} else {
			buf[o++] = (char)c;
		}
	}
	buf[o < cap ? o : cap - 1] = '\0';
	return ts_utf8_trim(buf);
}

/* The members of a legacy fields string, or {"fields": text} when it does
 * not parse as members. New reference (NULL when out of memory). */
static json_t *parse_fields(const char *fields)
{
	char buf[2048];
	int n = snprintf(buf, sizeof buf, "{%s}", fields);
	json_t *j = NULL;

	if (n > 0 && (size_t)n < sizeof buf)
		j = json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, NULL);
	if (j && json_is_object(j))
		return j;
	json_decref(j);
	return json_pack("{s:o*}", "fields", ts_json_text(fields));
}

/* Writes one line: the core members first, then fields (stolen). */
static void emit(enum ts_log_level lvl, json_t *fields, const char *msg)
{
	char stamp[40], full[64], small[4096], *text = small;
	struct timespec now;
	struct tm tm;
	json_t *line;
	size_t n;

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(full, sizeof full, "%.32s.%03dZ", stamp, (int)(now.tv_nsec / 1000000L));
	line = json_pack("{s:s, s:s, s:o*}", "ts", full, "level", level_names[lvl], "msg",
	                 ts_json_text(msg));
	if (!line) {
		json_decref(fields);
		return;
	}
	if (json_is_object(fields))
		json_object_update_missing(line, fields);
	json_decref(fields);
	n = json_dumpb(line, small, sizeof small - 1, JSON_COMPACT | JSON_REAL_PRECISION(10));
	if (n >= sizeof small - 1) {
		text = json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(10));
		n = text ? strlen(text) : 0;
	}
	json_decref(line);
	if (!text || !n)
		goto out;
	if (text == small) {
		small[n++] = '\n';
	} else {
		char *grown = realloc(text, n + 2);

		if (!grown)
			goto out;
		text = grown;
		text[n++] = '\n';
	}
	if (write(STDERR_FILENO, text, n) < 0)
		goto out;
out:
	if (text != small)
		free(text);
}

void ts_log(enum ts_log_level lvl, const char *fields, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!ts_log_enabled(lvl))
		return;
	va_start(ap, fmt);
	if (vsnprintf(msg, sizeof msg, fmt, ap) >= (int)sizeof msg)
		ts_utf8_trim(msg);
	va_end(ap);
	emit(lvl, fields ? parse_fields(fields) : NULL, msg);
}

void ts_log_json(enum ts_log_level lvl, json_t *fields, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;

	if (!ts_log_enabled(lvl)) {
		json_decref(fields);
		return;
	}
	va_start(ap, fmt);
	if (vsnprintf(msg, sizeof msg, fmt, ap) >= (int)sizeof msg)
		ts_utf8_trim(msg);
	va_end(ap);
	emit(lvl, fields, msg);
}
