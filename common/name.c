/*
 * name.c - the one rule for client-given names (name.h).
 */
#include "common/name.h"

#include <stddef.h>

bool ts_name_valid(const char *name)
{
	size_t n = 0;

	if (!name)
		return false;
	for (; name[n]; n++) {
		char c = name[n];
		bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');

		if (n >= TS_NAME_MAX || !(alnum || (n > 0 && (c == '.' || c == '_' || c == '-'))))
			return false;
	}
	return n > 0;
}
