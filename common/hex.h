/*
 * hex.h - hexadecimal digits, for the escapes and handles clients send.
 *
 * Thread-safety: pure.
 */
#ifndef TS_HEX_H
#define TS_HEX_H

/* The value of one hexadecimal digit (either case), or -1. */
static inline int ts_hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

#endif
