/*
 * hostmem.c - host memory for every backend: page-aligned anonymous mappings
 * and the host's memory figures.
 *
 * Mappings are made with exactly the size asked for and never touched here:
 * the first touch (and so the cost of faulting pages in) is the caller's.
 * Without CUDA, "pinned" host memory is such a mapping too; it is not locked
 * (locking needs privileges the daemon should not require).
 *
 * Thread-safety: every function is safe from any thread; nothing is shared.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "device/backend.h"

ts_status ts__host_meminfo(uint64_t *avail, uint64_t *total,
                           struct ts_error *err)
{
	char line[256];
	uint64_t a = 0, t = 0;
	int found = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f) {
		int e = errno;

		return ts_error_set(err, ts_status_from_errno(e), "HOST_MEMINFO",
		                    "cannot open '/proc/meminfo': %s", strerror(e));
	}
	while (found != 3 && fgets(line, sizeof line, f)) {
		unsigned long long kib;

		if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
			t = (uint64_t)kib * 1024;
			found |= 1;
		} else if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
			a = (uint64_t)kib * 1024;
			found |= 2;
		}
	}
	fclose(f);
	if (found != 3)
		return ts_error_set(err, TS_INTERNAL, "HOST_MEMINFO",
		                    "'/proc/meminfo' lacks MemTotal or MemAvailable");
	if (avail)
		*avail = a;
	if (total)
		*total = t;
	return TS_OK;
}

ts_status ts__host_pages_alloc(const struct ts_device *dev,
                               enum ts_memory_kind kind, size_t size,
                               bool noreserve, void **out,
                               struct ts_error *err)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
	void *p;

	*out = NULL;
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		uint64_t avail = 0, total = 0;
		char cause[96];

		if (e != ENOMEM)
			return ts_error_set(err, ts_status_from_errno(e), "HOST_MMAP",
			                    "%s/%s: mmap of %zu bytes: %s", dev->props.id,
			                    ts_memory_kind_name(kind), size, strerror(e));
		ts__host_meminfo(&avail, &total, NULL);
		snprintf(cause, sizeof cause, "mmap: %s", strerror(e));
		return ts__oom(err, dev, kind, size, avail, total, cause);
	}
	*out = p;
	return TS_OK;
}

void ts__host_pages_free(void *p, size_t size)
{
	if (p)
		munmap(p, size);
}

static ts_status pinned_pages_alloc(void *ctx, struct ts_device *dev, size_t size,
                                    void **out, struct ts_error *err)
{
	return ts__host_pages_alloc(dev, TS_MEM_PINNED_HOST, size, false, out, err);
}

static void pinned_pages_free(void *ctx, void *p, size_t size)
{
	ts__host_pages_free(p, size);
}

void ts__pinned_ops_default(struct ts__pinned_ops *ops)
{
	ops->alloc = pinned_pages_alloc;
	ops->free = pinned_pages_free;
	ops->ctx = NULL;
	ops->source = "mmap";
}
