/*
 * allocator.h - best-fit allocation with coalescing over address ranges.
 *
 * The allocator hands out blocks of regions it is given (a reserved range of
 * device memory, pinned host segments) and never touches the memory itself:
 * it works on addresses only, so it serves device pointers as well as host
 * ones. Requests are rounded up to the alignment, nothing more (no powers of
 * two). The free block chosen is the smallest that fits, the lowest address
 * among equals; a freed block merges with free neighbours of the same region.
 *
 * Invariants (checked by ts_alloc_check): within a region, blocks tile it
 * exactly in address order; no two free blocks are adjacent; the stats equal
 * what the blocks say.
 *
 * Thread-safety: none; the owner (a memory pool) serialises calls.
 */
#ifndef TS_ALLOCATOR_H
#define TS_ALLOCATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ts_alloc;

struct ts_alloc_stats {
	uint64_t bytes_in_use;        /* sum of allocated block sizes (aligned) */
	uint64_t bytes_reserved;      /* sum of region sizes */
	uint64_t bytes_free;          /* bytes_reserved - bytes_in_use */
	uint64_t largest_free_block;  /* 0 when nothing is free */
	uint64_t num_live_allocs;     /* blocks allocated now */
	uint64_t num_free_blocks;
	uint64_t num_regions;
};

/* New empty allocator; alignment is a power of two >= 1 (NULL on bad
 * alignment or out of memory). Owned by the caller. */
struct ts_alloc *ts_alloc_new(uint64_t alignment);

/* Frees the bookkeeping (not the regions' memory). */
void ts_alloc_free(struct ts_alloc *a);

/*
 * Adds the range [base, base+size) as a new free region. base must be
 * aligned and size a multiple of the alignment, and the range must not
 * overlap another region. Returns false on bad arguments or out of memory
 * (nothing changes).
 */
bool ts_alloc_add_region(struct ts_alloc *a, uintptr_t base, uint64_t size);

/*
 * Removes a region that is entirely free (for shrinking a pool); false if it
 * is not a region base or has allocated blocks.
 */
bool ts_alloc_remove_region(struct ts_alloc *a, uintptr_t base);

/*
 * Allocates size bytes (size > 0), rounded up to the alignment. On success
 * stores the block's address and returns true; false when no free block is
 * large enough, or the bookkeeping itself cannot be allocated (nothing
 * changes either way).
 */
bool ts_alloc_alloc(struct ts_alloc *a, uint64_t size, uintptr_t *addr);

/* Frees the block at addr; false (and nothing changes) when addr is not the
 * start of an allocated block. */
bool ts_alloc_release(struct ts_alloc *a, uintptr_t addr);

/*
 * The region holding addr: stores its base and size and whether nothing in
 * it is allocated (idle: one free block spans it); false when addr lies in
 * no region. O(log regions).
 */
bool ts_alloc_region_of(const struct ts_alloc *a, uintptr_t addr, uintptr_t *base,
                        uint64_t *size, bool *idle);

/* Size of the allocated block at addr (aligned), 0 if none. */
uint64_t ts_alloc_block_size(const struct ts_alloc *a, uintptr_t addr);

/* Current statistics. */
void ts_alloc_get_stats(const struct ts_alloc *a, struct ts_alloc_stats *out);

/* Rounds size up to the allocator's alignment (0 on overflow). */
uint64_t ts_alloc_round(const struct ts_alloc *a, uint64_t size);

/* Verifies every invariant against a full walk; returns true when they hold.
 * O(blocks); for tests and debug builds. */
bool ts_alloc_check(const struct ts_alloc *a);

#endif
