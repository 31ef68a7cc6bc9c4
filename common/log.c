/*
 * log.c - JSON log lines on stderr.
 *
 * The level is process-wide configuration written once at start; it is an
 * atomic so that a late change is still safe.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

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
	size_t o = 0;

	for (; *s && o + 7 < cap; s++) {
		unsigned char c = (unsigned char)*s;

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
	return buf;
}

void ts_log(enum ts_log_level lvl, const char *fields, const char *fmt, ...)
{
	char msg[1024], esc[2048], line[4096], stamp[40];
	struct timespec now;
	struct tm tm;
	va_list ap;
	int n;

	if (!ts_log_enabled(lvl))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
	n = snprintf(line, sizeof line, "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"msg\":\"%s\"%s%s}\n",
	             stamp, now.tv_nsec / 1000000L, level_names[lvl],
	             ts_json_escape(esc, sizeof esc, msg), fields ? "," : "",
	             fields ? fields : "");
	if (n < 0)
		return;
	if ((size_t)n >= sizeof line) {
		n = (int)sizeof line - 1;
		line[n - 2] = '}';
		line[n - 1] = '\n';
	}
	if (write(STDERR_FILENO, line, (size_t)n) < 0)
		return;
}
