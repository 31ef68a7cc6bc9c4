/*
 * hostmem.c - host memory for every backend: page-aligned shareable mappings
 * and the host's memory figures.
 *
 * Host pages (pageable host memory, and "pinned" host memory without CUDA)
 * are memfd files mapped MAP_SHARED, so that any host allocation can be
 * named as (descriptor, offset, length) and handed to a process on the same
 * node (the lease service, server/lease.c). The file is sized once and
 * sealed against shrinking and growing, so no holder of the descriptor can
 * truncate pages under the daemon, and, before any descriptor of it leaves
 * the daemon (ts_host_mem_share), with
 * F_SEAL_FUTURE_WRITE: the daemon's own mapping stays writable, but no
 * descriptor of the file - a lessee's, or one reopened from it through
 * /proc/self/fd with O_RDWR, whoever opens it - can write it or map it
 * writable, now or later (write(2), mmap PROT_WRITE MAP_SHARED and mprotect
 * to PROT_WRITE fail with EPERM). Where that seal cannot be set no
 * descriptor is handed out. Until then the daemon may fill a fresh mapping
 * through its file (ts_host_mem_fill: pwrite allocates the pages without a
 * fault each, and without zeroing them first). Each holds a descriptor until it is
 * freed: mappings take at most half of RLIMIT_NOFILE, so that connections
 * and files keep theirs; past that, or when no memfd can be made, the
 * mapping is anonymous and simply not shareable. Sim device memory
 * (noreserve) is such a memfd too, so that a lease of a sim device array has
 * the shape of a host array's (a descriptor, as a GPU's array has a CUDA IPC
 * handle): a memfd's pages, like MAP_NORESERVE ones, are charged only when
 * touched, so a capacity past what the host would commit still maps; where
 * no memfd can be had, its pages are anonymous MAP_NORESERVE ones.
 *
 * Shareable mappings of 2 MiB or more start on a 2 MiB boundary and are
 * advised for transparent huge pages (shared_pages), which the node
 * grants shared memory where transparent_hugepage/shmem_enabled allows.
 *
 * Mappings are made with exactly the size asked for and never touched here:
 * the first touch (and so the cost of faulting pages in) is the caller's; a
 * memfd's pages, like anonymous ones, exist only once touched. Without
 * CUDA, "pinned" host memory is such a mapping too; it is not locked
 * (locking needs privileges the daemon should not require).
 *
 * Scratch memory (ts_host_scratch_new) is the one memfd a lessee may write:
 * the memory of a writable lease, outside every pool, mapped read-only by
 * the daemon, which copies it into the array's own memory at publish.
 *
 * Thread-safety: every function is safe from any thread; the table of
 * shareable mappings (one per device set, backend.h) is guarded by its
 * mutex.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/hugepage.h"
#include "common/lock.h"
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

bool ts_host_shmem_huge(char *mode, size_t cap)
{
	char line[128], *open_br, *close_br;
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "re");
	bool got = false;

	if (f) {
		got = fgets(line, sizeof line, f) != NULL;
		fclose(f);
	}
	open_br = got ? strchr(line, '[') : NULL;
	close_br = open_br ? strchr(open_br, ']') : NULL;
	if (!close_br) {
		snprintf(mode, cap, "unknown");
		return false;
	}
	*close_br = '\0';
	snprintf(mode, cap, "%s", open_br + 1);
	return strcmp(mode, "never") != 0 && strcmp(mode, "deny") != 0 && strcmp(mode, "unknown") != 0;
}

/* ---- the table of shareable mappings ---------------------------------------- */

void ts__host_maps_init(struct ts__host_maps *m)
{
	ts_mutex_init(&m->mu);
	m->maps = NULL;
	m->n = m->cap = 0;
}

void ts__host_maps_release(struct ts__host_maps *m)
{
	free(m->maps);
	m->maps = NULL;
	ts_mutex_destroy(&m->mu);
}

/* Index of the first mapping whose base is > addr (m->mu held). */
static size_t maps_upper_locked(const struct ts__host_maps *m, uintptr_t addr)
{
	size_t lo = 0, hi = m->n;

	assert(ts_mutex_held(&m->mu));
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m->maps[mid].base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static bool maps_add(struct ts__host_maps *m, uintptr_t base, size_t size, int fd)
{
	bool ok = true;
	size_t i;

	ts_mutex_lock(&m->mu);
	if (m->n == m->cap) {
		size_t cap = m->cap ? m->cap * 2 : 64;
		struct ts__host_map *grown = realloc(m->maps, cap * sizeof *grown);

		if (!grown) {
			ok = false;
			goto out;
		}
		m->maps = grown;
		m->cap = cap;
	}
	i = maps_upper_locked(m, base);
	memmove(&m->maps[i + 1], &m->maps[i], (m->n - i) * sizeof *m->maps);
	m->maps[i] = (struct ts__host_map){base, size, fd, false};
	m->n++;
out:
	ts_mutex_unlock(&m->mu);
	return ok;
}

/* Removes the mapping based at base; its descriptor, or -1 when none. */
static int maps_remove(struct ts__host_maps *m, uintptr_t base)
{
	int fd = -1;
	size_t i;

	ts_mutex_lock(&m->mu);
	i = maps_upper_locked(m, base);
	if (i > 0 && m->maps[i - 1].base == base) {
		fd = m->maps[i - 1].fd;
		memmove(&m->maps[i - 1], &m->maps[i], (m->n - i) * sizeof *m->maps);
		m->n--;
	}
	ts_mutex_unlock(&m->mu);
	return fd;
}

int ts_host_mem_share(const struct ts_device *dev, const void *p, uint64_t len,
                      uint64_t *offset)
{
	struct ts__host_maps *m = dev->host_maps;
	uintptr_t a = (uintptr_t)p;
	char path[64];
	int fd;
	size_t i;

	ts_mutex_lock(&m->mu);
	i = maps_upper_locked(m, a);
	if (i > 0 && a - m->maps[i - 1].base < m->maps[i - 1].size &&
	    len <= m->maps[i - 1].size - (a - m->maps[i - 1].base)) {
		struct ts__host_map *hm = &m->maps[i - 1];

		*offset = a - hm->base;
		/* sealed before its first descriptor leaves: from then on only
		 * the daemon's mapping writes the file (see the top) */
		if (!hm->sealed &&
		    fcntl(hm->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) == 0)
			hm->sealed = true;
		/* a read-only file description of its own, opened while the
		 * table still holds the memfd */
		snprintf(path, sizeof path, "/proc/self/fd/%d", hm->fd);
		fd = !hm->sealed ? -ENOENT : open(path, O_RDONLY | O_CLOEXEC);
		if (fd == -1)
			fd = -errno;
	} else {
		fd = -ENOENT;
	}
	ts_mutex_unlock(&m->mu);
	return fd;
}

/* The least a fill writes through the file. */
#define HOST_FILL_MIN ((size_t)256 << 10)

/* Whether no page of [p, p + n) is in memory yet (mincore; false when it
 * cannot tell): fresh pages, which a write through the file allocates
 * cheaper than faults do; pages that exist take a memcpy faster. */
static bool pages_fresh(void *p, size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)p / pg * pg, hi = ((uintptr_t)p + n + pg - 1) / pg * pg;
	size_t np = (hi - lo) / pg;
	unsigned char *vec = malloc(np ? np : 1);
	bool fresh = vec && mincore((void *)lo, hi - lo, vec) == 0;

	for (size_t i = 0; fresh && i < np; i++)
		fresh = !(vec[i] & 1);
	free(vec);
	return fresh;
}

size_t ts_host_mem_fill_file(const struct ts_device *dev, void *p, const void *src, size_t n)
{
	struct ts__host_maps *m = dev->host_maps;
	uintptr_t a = (uintptr_t)p;
	char mode[32];
	size_t i, done = 0;
	off_t at = 0;
	int fd = -1;

	/* below HOST_FILL_MIN the checks (the node's setting read from sysfs,
	 * mincore) cost more than the faults they save: many small runs of a
	 * strided copy take memcpy; where shared memory gets huge pages, the
	 * mapping's faults are 2 MiB ones, and pwrite would leave the file in
	 * 4 KiB pages */
	if (n >= HOST_FILL_MIN && !ts_host_shmem_huge(mode, sizeof mode) && pages_fresh(p, n)) {
		ts_mutex_lock(&m->mu);
		i = maps_upper_locked(m, a);
		if (i > 0 && a - m->maps[i - 1].base < m->maps[i - 1].size &&
		    n <= m->maps[i - 1].size - (a - m->maps[i - 1].base) && !m->maps[i - 1].sealed) {
			at = (off_t)(a - m->maps[i - 1].base);
			fd = fcntl(m->maps[i - 1].fd, F_DUPFD_CLOEXEC, 0);
		}
		ts_mutex_unlock(&m->mu);
	}
	while (fd >= 0 && done < n) {
		ssize_t k = pwrite(fd, (const char *)src + done, n - done, at + (off_t)done);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;               /* sealed meanwhile, or no space: the rest is the caller's */
		done += (size_t)k;
	}
	if (fd >= 0)
		close(fd);
	return done;
}

void ts_host_mem_fill(const struct ts_device *dev, void *p, const void *src, size_t n)
{
	size_t done = ts_host_mem_fill_file(dev, p, src, n);

	if (done < n)
		memcpy((char *)p + done, (const char *)src + done, n - done);
}

/* Whether another mapping may hold a descriptor (half of RLIMIT_NOFILE). */
static bool maps_budget_left(struct ts__host_maps *m)
{
	struct rlimit rl;
	size_t n;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return false;
	ts_mutex_lock(&m->mu);
	n = m->n;
	ts_mutex_unlock(&m->mu);
	return rl.rlim_cur == RLIM_INFINITY || n < rl.rlim_cur / 2;
}

/* A memfd of size bytes mapped shared, sealed at its size (and against
 * writes through any other descriptor or mapping when it is first shared),
 * and entered in m; NULL (errno set) when no memfd can be made or the
 * descriptor budget is spent (EMFILE). */
static void *shared_pages(struct ts__host_maps *m, size_t size)
{
	void *p = MAP_FAILED;
	int fd, e;

	if (!maps_budget_left(m)) {
		errno = EMFILE;
		return NULL;
	}
	fd = memfd_create("tstage-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, (off_t)size) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
		goto fail;
	/* on a 2 MiB boundary and advised for transparent huge pages
	 * (common/hugepage.h): where the node lets shared memory have them
	 * (shmem_enabled "advise", "within_size", "always"), the pages are 2 MiB
	 * ones here and in each lease's mapping placed alike, and a first
	 * mapping of 1 GiB builds 512 page-table entries, not 262144 (on a
	 * 2-core VM: 1 GiB read through a fresh mapping in 100 ms with 4 KiB
	 * pages, 36-49 ms with 2 MiB ones); elsewhere the advice does nothing */
	p = ts_mmap_huge(size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	if (!maps_add(m, (uintptr_t)p, size, fd)) {
		errno = ENOMEM;
		goto fail;
	}
	return p;

fail:
	e = errno;
	if (p != MAP_FAILED)
		munmap(p, size);
	close(fd);
	errno = e;
	return NULL;
}

/* ---- host pages ------------------------------------------------------------- */

ts_status ts__host_pages_alloc(const struct ts_device *dev,
                               enum ts_memory_kind kind, size_t size,
                               bool noreserve, void **out,
                               struct ts_error *err)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0);
	void *p = NULL;

	*out = NULL;
	p = shared_pages(dev->host_maps, size);
	/* ENOMEM and ENOSPC (memory or tmpfs limits) are an answer; any other
	 * failure (descriptors exhausted), and any at all for noreserve pages,
	 * falls back to anonymous pages */
	if (!p && !noreserve && (errno == ENOMEM || errno == ENOSPC))
		p = MAP_FAILED;
	else if (!p)
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

static void pages_free(struct ts__host_maps *m, void *p, size_t size)
{
	int fd;

	if (!p)
		return;
	fd = maps_remove(m, (uintptr_t)p);
	munmap(p, size);
	if (fd >= 0)
		close(fd);
}

void ts__host_pages_free(const struct ts_device *dev, void *p, size_t size)
{
	pages_free(dev->host_maps, p, size);
}

static ts_status pinned_pages_alloc(void *ctx, struct ts_device *dev, size_t size,
                                    void **out, struct ts_error *err)
{
	return ts__host_pages_alloc(dev, TS_MEM_PINNED_HOST, size, false, out, err);
}

static void pinned_pages_free(void *ctx, void *p, size_t size)
{
	pages_free(ctx, p, size);
}

void ts__pinned_ops_default(struct ts__pinned_ops *ops, struct ts__host_maps *maps)
{
	ops->alloc = pinned_pages_alloc;
	ops->free = pinned_pages_free;
	ops->ctx = maps;
	ops->source = "memfd";
}

/* ---- scratch memory of writable leases --------------------------------------- */

ts_status ts_host_scratch_new(size_t size, struct ts_host_scratch *out, struct ts_error *err)
{
	int fd, e;
	void *p = NULL;

	out->fd = -1;
	out->data = NULL;
	out->size = 0;
	fd = memfd_create("tstage-lease-write", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		goto fail;
	/* sealed at its size: a writer cannot truncate pages the daemon reads */
	if (ftruncate(fd, (off_t)size) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
		goto fail;
	if (size > 0) {
		p = ts_mmap_huge(size, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED) {
			p = NULL;
			goto fail;
		}
	}
	out->fd = fd;
	out->data = p;
	out->size = size;
	return TS_OK;

fail:
	e = errno;
	if (fd >= 0)
		close(fd);
	if (e == ENOMEM || e == ENOSPC || e == EMFILE || e == ENFILE)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "LEASE_SCRATCH",
		                    "no memory file of %zu bytes for a writable lease: %s", size,
		                    strerror(e));
	return ts_error_set(err, ts_status_from_errno(e), "LEASE_SCRATCH",
	                    "no memory file of %zu bytes for a writable lease: %s", size,
	                    strerror(e));
}

int ts_host_scratch_share(const struct ts_host_scratch *s)
{
	int fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);

	return fd < 0 ? -errno : fd;
}

void ts_host_scratch_release(struct ts_host_scratch *s)
{
	if (s->data)
		munmap((void *)(uintptr_t)s->data, s->size);
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	s->data = NULL;
	s->size = 0;
}
