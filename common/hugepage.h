/*
 * hugepage.h - shared mappings placed for transparent huge pages, and what a
 * mapping got: used by the daemon's shareable host memory (device/hostmem.c)
 * and by the clients of its leases (tests/integration/lease_wire.h, the
 * benches), so that both sides of a lease place a memfd alike.
 *
 * A file's pages can be mapped as whole 2 MiB pages only where the mapping's
 * address has the file offset's remainder modulo 2 MiB and the node lets
 * shared memory have them (transparent_hugepage/shmem_enabled "advise",
 * "within_size", "always"); then mapping 1 GiB builds 512 page-table
 * entries, not 262144. Elsewhere the advice is without effect.
 *
 * Thread-safety: every function is safe from any thread.
 */
#ifndef TS_HUGEPAGE_H
#define TS_HUGEPAGE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The PMD size with 4 KiB base pages (x86-64, most arm64 kernels). */
#define TS_HUGE_PAGE ((size_t)2 << 20)

/*
 * len bytes of fd from file offset start (page-aligned) mapped with prot
 * and flags (MAP_SHARED, ...; MAP_FIXED is added) at an address with
 * start's remainder modulo TS_HUGE_PAGE, then advised MADV_HUGEPAGE. A
 * mapping below TS_HUGE_PAGE holds no huge page and is mapped where the
 * kernel puts it. MAP_FAILED (errno set) on failure; munmap(result, len).
 */
static inline void *ts_mmap_huge(size_t len, int prot, int flags, int fd, uint64_t start)
{
	const size_t huge = TS_HUGE_PAGE;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t span = (len + page - 1) / page * page;
	uintptr_t r, a, phase = (uintptr_t)(start % huge);
	void *m;

	if (len < huge)
		return mmap(NULL, len, prot, flags, fd, (off_t)start);
	/* reserve the span and a huge page more, then place the file inside */
	m = mmap(NULL, span + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED)
		return MAP_FAILED;
	r = (uintptr_t)m;
	a = ((r + huge - 1) & ~(uintptr_t)(huge - 1)) + phase;
	if (a >= r + huge)
		a -= huge;
	m = mmap((void *)a, len, prot, flags | MAP_FIXED, fd, (off_t)start);
	if (m == MAP_FAILED) {
		int e = errno;

		munmap((void *)r, span + huge);
		errno = e;
		return MAP_FAILED;
	}
	if (a > r)
		munmap((void *)r, a - r);
	munmap((void *)(a + span), r + huge - a);   /* a < r + huge: the tail is never empty */
	(void)madvise(m, len, MADV_HUGEPAGE);       /* EINVAL where THP is not built */
	return m;
}

/* KiB of this process's mapping holding p that are mapped by 2 MiB
 * page-table entries (ShmemPmdMapped in /proc/self/smaps); 0 when none or
 * when it cannot be read. */
static inline unsigned long long ts_pmd_mapped_kib(const void *p)
{
	char line[256];
	unsigned long long kib = 0, v;
	unsigned long lo, hi;
	int in = 0;
	FILE *f = fopen("/proc/self/smaps", "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof line, f)) {
		/* a mapping's first line starts "lo-hi "; its fields "Name: ..." */
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
			in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
		else if (in && sscanf(line, "ShmemPmdMapped: %llu kB", &v) == 1)
			kib += v;
	}
	fclose(f);
	return kib;
}

#endif
