/*
 * cgroup.h - the memory limit of the cgroup tstaged runs in, so that host
 * budgets follow a container's limit rather than the node's RAM.
 *
 * The process's cgroup comes from /proc/self/cgroup: the cgroup v2 line
 * ("0::/path") gives <root>/<path>/memory.max, a v1 line naming the memory
 * controller gives <root>/memory/<path>/memory.limit_in_bytes. Each folder
 * from that one up to the root is read (a parent's limit binds as well), and
 * the smallest limit wins; "max" and v1's "unlimited" (2^63 rounded to a
 * page) mean none.
 *
 * Thread-safety: reentrant; reads files only.
 */
#ifndef TS_CGROUP_H
#define TS_CGROUP_H

#include <stdbool.h>
#include <stdint.h>

/* The default places: "/sys/fs/cgroup" and "/proc/self/cgroup". */
#define TS_CGROUP_ROOT "/sys/fs/cgroup"
#define TS_CGROUP_SELF "/proc/self/cgroup"

/* The smallest memory limit that applies to the process, in *limit; false
 * when none does (or nothing could be read). root and self are the
 * folders above (injectable for tests; borrowed). */
bool ts_cgroup_memory_limit(const char *root, const char *self, uint64_t *limit);

#endif
