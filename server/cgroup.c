/*
 * cgroup.c - reading the memory limit of tstaged's cgroup (v2 memory.max or
 * v1 memory.limit_in_bytes), the smallest from its folder up to the root.
 */
#include "server/cgroup.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* v1 writes "no limit" as the largest page-aligned signed 64-bit value */
#define V1_UNLIMITED (1ull << 62)

/* One limit file: true with the value when it holds a limit. */
static bool read_limit(const char *file, uint64_t *out)
{
	char buf[64], *end;
	unsigned long long v;
	FILE *f = fopen(file, "re");
	bool ok;

	if (!f)
		return false;
	ok = fgets(buf, sizeof buf, f) != NULL;
	fclose(f);
	if (!ok || strncmp(buf, "max", 3) == 0)
		return false;
	v = strtoull(buf, &end, 10);
	if (end == buf || (*end && *end != '\n') || v >= V1_UNLIMITED)
		return false;
	*out = v;
	return true;
}

/* The smallest limit of file in base/path and each of its parents. */
static bool walk_up(const char *base, const char *path, const char *file, uint64_t *limit)
{
	char dir[PATH_MAX], full[PATH_MAX + 64];
	bool found = false;
	size_t n;

	if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
		return false;
	for (;;) {
		uint64_t v = 0;

		n = strlen(dir);
		while (n > 0 && dir[n - 1] == '/')
			dir[--n] = '\0';
		if (snprintf(full, sizeof full, "%s%s/%s", base, dir, file) < (int)sizeof full &&
		    read_limit(full, &v) && (!found || v < *limit)) {
			*limit = v;
			found = true;
		}
		if (n == 0)
			break;
		while (n > 0 && dir[n - 1] != '/')
			dir[--n] = '\0';
	}
	return found;
}

bool ts_cgroup_memory_limit(const char *root, const char *self, uint64_t *limit)
{
	char line[PATH_MAX + 128], base[PATH_MAX];
	bool found = false;
	FILE *f = fopen(self, "re");

	if (!f)
		return false;
	while (fgets(line, sizeof line, f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		const char *file;
		uint64_t v = 0;

		if (!c2)
			continue;
		*c1 = *c2 = '\0';
		c2[1 + strcspn(c2 + 1, "\n")] = '\0';
		if (strcmp(line, "0") == 0 && c1[1] == '\0') {
			snprintf(base, sizeof base, "%s", root);
			file = "memory.max";
		} else if (strstr(c1 + 1, "memory") &&
		           (strcmp(c1 + 1, "memory") == 0 || strstr(c1 + 1, ",memory") ||
		            strncmp(c1 + 1, "memory,", 7) == 0)) {
			snprintf(base, sizeof base, "%s/memory", root);
			file = "memory.limit_in_bytes";
		} else {
			continue;
		}
		if (walk_up(base, c2 + 1, file, &v) && (!found || v < *limit)) {
			*limit = v;
			found = true;
		}
	}
	fclose(f);
	return found;
}
