/*
 * units.c - byte-size parsing and formatting, integer parsing, clocks.
 */
#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static const struct {
	const char *suffix;
	double mult;
} size_units[] = {
	{"", 1.0},
	{"b", 1.0},
	{"k", 1024.0},
	{"kib", 1024.0},
	{"kb", 1e3},
	{"m", 1048576.0},
	{"mib", 1048576.0},
	{"mb", 1e6},
	{"g", 1073741824.0},
	{"gib", 1073741824.0},
	{"gb", 1e9},
	{"t", 1099511627776.0},
	{"tib", 1099511627776.0},
	{"tb", 1e12},
};

bool ts_parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v;

	const char *p = s;

	if (!s || !isdigit((unsigned char)*s))
		return false;
	/* plain decimal only: no exponent, hex or sign */
	while (isdigit((unsigned char)*p))
		p++;
	if (*p == '.')
		for (p++; isdigit((unsigned char)*p);)
			p++;
	errno = 0;
	v = strtod(s, &end);
	if (errno || end != p || !isfinite(v) || v < 0)
		return false;
	while (*end == ' ')
		end++;
	for (size_t i = 0; i < sizeof size_units / sizeof size_units[0]; i++) {
		if (strcasecmp(end, size_units[i].suffix) != 0)
			continue;
		v *= size_units[i].mult;
		if (v >= 18446744073709551616.0)
			return false;
		*out = (uint64_t)llround(v);
		return true;
	}
	return false;
}

char *ts_format_bytes(char *buf, size_t cap, uint64_t n)
{
	static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	double v = (double)n;
	size_t u = 0;

	if (n < 1024) {
		snprintf(buf, cap, "%llu B", (unsigned long long)n);
		return buf;
	}
	while (v >= 1024.0 && u + 1 < sizeof names / sizeof names[0]) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, cap, "%.2f %s", v, names[u]);
	return buf;
}

bool ts_parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	if (!s || !*s)
		return false;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

uint64_t ts_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t ts_wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool ts_format_rfc3339(char *buf, size_t cap, uint64_t ns)
{
	time_t secs = (time_t)(ns / 1000000000ull);
	struct tm tm;

	if (cap)
		buf[0] = 0;
	if (!ns || !gmtime_r(&secs, &tm))
		return false;
	snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%06uZ", tm.tm_year + 1900,
	         tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
	         (unsigned)(ns % 1000000000ull / 1000));
	return true;
}
