/*
 * units.h - byte sizes as people write them ("2GiB", "512M", "0.5TiB") and
 * as messages print them ("1.00 GiB").
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_UNITS_H
#define TS_UNITS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Parses a byte size: a non-negative decimal number with an optional unit
 * B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (case-insensitive; the SI
 * spellings KB, MB, ... are powers of 1000, K, M, KiB, MiB, ... of 1024).
 * Returns false on anything else or on overflow of 2^64.
 */
bool ts_parse_size(const char *s, uint64_t *out);

/* Formats n as "%.2f <unit>" with binary units up to EiB ("1.00 GiB",
 * "512 B") into buf; returns buf. The one byte formatter of every message. */
char *ts_format_bytes(char *buf, size_t cap, uint64_t n);

/* Parses a whole decimal integer in [lo, hi]; false otherwise. */
bool ts_parse_long(const char *s, long lo, long hi, long *out);

/* Monotonic clock in nanoseconds. */
uint64_t ts_now_ns(void);

/* Wall clock, nanoseconds since the epoch. */
uint64_t ts_wall_ns(void);

/* Formats ns since the epoch as RFC 3339 UTC with microseconds
 * ("2026-12-03T13:28:18.123456Z") into buf (32 bytes suffice); false, buf
 * empty, for 0 (never) or a time gmtime cannot break down. The one time
 * formatter of every answer. */
bool ts_format_rfc3339(char *buf, size_t cap, uint64_t ns);

#endif
