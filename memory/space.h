/*
 * space.h - memory spaces: one per (device, memory kind), with exact
 * accounting, drawing from pools.
 *
 * A pool owns memory and a limit: device memory is one region reserved per
 * device and carved by a best-fit allocator; pinned host memory is a node-wide
 * pool of pinned segments (pinned on demand, reused, never pinned per
 * request; a segment left with nothing in it goes back to the system unless
 * the pool's idle segments stay within its keep, and segments pinned at
 * start by preallocate stay), or, where the topology places accelerators on
 * several NUMA nodes, one such pool per node, bound to it, whose limits sum
 * to the node-wide budget; unpinned host memory is pageable memory under
 * a node-wide limit. A space is
 * the (device, memory kind) view a caller allocates from: it keeps its own
 * counters in the shape of JAX's Device.memory_stats(), while free bytes,
 * largest free block and limit are its pool's.
 *
 * Invariants: a space's bytes_in_use equals the sum of the sizes of its live
 * allocations (sizes as requested, exact); the pool's in-use bytes equal the
 * sum over the spaces drawing from it (plus alignment); an allocation that
 * cannot fit is refused before anything changes.
 *
 * Thread-safety: all functions are safe from any thread. Counters read by
 * ts_space_stats are atomics: a read never waits for an allocation.
 */
#ifndef TS_SPACE_H
#define TS_SPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"

struct ts_topology;

struct ts_space;
struct ts_memory;

/* JAX Device.memory_stats() keys, plus the pool's view. */
struct ts_space_stats {
	uint64_t bytes_in_use;
	uint64_t peak_bytes_in_use;
	uint64_t num_allocs;            /* allocations made since start */
	uint64_t largest_alloc_size;
	uint64_t bytes_limit;           /* the pool's limit */
	uint64_t bytes_reserved;        /* memory the pool holds from the system */
	uint64_t peak_bytes_reserved;
	uint64_t largest_free_block_bytes; /* largest single allocation that fits now */
	uint64_t bytes_free;            /* limit - pool bytes in use */
	uint64_t pool_bytes_in_use;     /* every space sharing the pool */
	uint64_t live_allocs;           /* allocations of this space alive now */
	uint64_t refusals;              /* allocations and admissions refused since start */
};

/* A pool's own numbers: device pools are per device, pinned_host and
 * unpinned_host pools are node-wide (every device's space draws from them). */
struct ts_pool_stats {
	const char *name;               /* "sim:0/device", "host/pinned_host"; borrowed */
	enum ts_memory_kind kind;
	const struct ts_device *device; /* a device pool's device; NULL when node-wide */
	int numa_node;                  /* pinned_host: the NUMA node it serves, -1: any */
	bool bound;                     /* its memory is bound to that node */
	uint64_t limit;
	uint64_t bytes_in_use;          /* every space drawing from it (plus alignment) */
	uint64_t bytes_reserved;        /* held from the system (a device pool's region,
	                                 * reserved at start; pinned segments) */
	uint64_t peak_bytes_reserved;
	uint64_t largest_free_block_bytes;
	/* A pool of pinned segments (segmented) only; zero elsewhere. Pinning
	 * again is what giving memory back costs: a pin is counted as a re-pin
	 * for the part of it that stays under the highest reservation the pool
	 * has had, memory it held before, gave back and had to pin anew. */
	bool segmented;
	uint64_t keep_bytes;            /* idle segment bytes kept reserved */
	uint64_t segments;              /* segments held now */
	uint64_t segments_pinned;       /* since start, preallocated ones included */
	uint64_t segments_released;     /* given back to the system since start */
	uint64_t pinned_bytes;          /* since start */
	uint64_t released_bytes;
	uint64_t repinned_bytes;
	uint64_t pin_ns;                /* time spent pinning segments */
	uint64_t repin_ns;              /* its share spent on re-pinned bytes */
};

/* NUMA nodes that get a pinned_host pool of their own, at most. */
#define TS_MEMORY_NUMA_MAX 16

/* Configuration of the node's spaces. */
struct ts_memory_config {
	double device_memory_fraction; /* of each GPU's free memory (0, 1] */
	uint64_t pinned_host_limit;    /* 0: a quarter of physical memory */
	uint64_t unpinned_host_limit;  /* 0: half of physical memory */
	uint64_t pinned_segment;       /* pinned pool growth step; 0: 256 MiB */
	uint64_t pinned_host_keep;     /* idle pinned bytes kept reserved; 0: the
	                                * default below; TS_PINNED_KEEP_NONE: none */
	double pinned_host_keep_share; /* > 0: that share of the pinned limit instead */
	bool preallocate;              /* reserve and touch pools at start */
	const struct ts_topology *topology; /* borrowed, may be NULL: one pinned_host pool
	                                * per NUMA node with accelerators, bound to it
	                                * where the topology is this machine's */
	/* the pinned budget's split over those pools: a weight per NUMA node
	 * (ts_memory_parse_numa_split); count 0: by their accelerators' share */
	size_t numa_split_count;
	struct ts_numa_weight {
		int node;                  /* NUMA OS index */
		double weight;             /* > 0 */
	} numa_split[TS_MEMORY_NUMA_MAX];
};

/*
 * Parses --pinned-host-numa-split: comma-separated NODE:WEIGHT pairs
 * ("0:1,1:3": node 1's pool gets three quarters of the pinned budget), a
 * NUMA OS index and a positive number each, every node once, at most
 * TS_MEMORY_NUMA_MAX. Fills cfg's numa_split. INVALID_ARGUMENT (reason
 * NUMA_SPLIT) naming the item at fault. Whether the nodes are those with
 * accelerators is checked by ts_memory_new (the same reason).
 */
ts_status ts_memory_parse_numa_split(const char *s, struct ts_memory_config *cfg,
                                     struct ts_error *err);

/*
 * The default keep: the larger of one segment and an eighth of the pinned
 * limit. One segment, so that small arrays coming and going never pin and
 * unpin a segment each time; an eighth of the budget, so that a burst of
 * larger arrays is served again without pinning at about 1 GB/s, while at
 * most an eighth of the budget (a thirty-second of RAM by default) stays
 * locked and idle.
 */
#define TS_PINNED_KEEP_NONE UINT64_MAX

/*
 * Device memory a GPU's pool never takes, whatever the fraction: cuBLAS
 * handles and their workspaces, lazily loaded kernel modules and the
 * runtime's own allocations are made at run time, outside the pool.
 */
#define TS_DEVICE_HEADROOM (512ull << 20)

/*
 * Bytes a GPU's device pool reserves out of free_bytes: fraction of them,
 * but never more than free_bytes less TS_DEVICE_HEADROOM (a quarter of
 * free_bytes on a GPU with less than 2 GiB free). Pure. ts_memory_new logs
 * at start, per GPU, the pool and what it leaves.
 */
uint64_t ts_device_pool_size(uint64_t free_bytes, double fraction);

/*
 * Builds every pool and space for the devices of set: per device, spaces for
 * device, pinned_host and unpinned_host memory (a device's pinned_host
 * from its NUMA node's pool where there are several). Device pools reserve their
 * region now (a range of address space on sim, cudaMalloc on CUDA); host
 * pools grow on demand unless cfg->preallocate. Returns a new object owned
 * by the caller; set is borrowed and must outlive it.
 */
ts_status ts_memory_new(struct ts_device_set *set,
                        const struct ts_memory_config *cfg,
                        struct ts_memory **out, struct ts_error *err);

/* Frees pools and spaces; every allocation must have been freed. */
void ts_memory_free(struct ts_memory *mem);

/* Number of spaces and the i-th, ordered by device then memory kind. */
size_t ts_memory_space_count(const struct ts_memory *mem);
struct ts_space *ts_memory_space_at(const struct ts_memory *mem, size_t i);

/* The space of (device id, kind), or NULL (borrowed). */
struct ts_space *ts_memory_find(const struct ts_memory *mem,
                                const char *device_id, enum ts_memory_kind kind);

/* A counter that grows after every change of any space's stats (allocation,
 * release, peak reset): equal values mean equal stats, so a rendered view
 * can be reused. */
uint64_t ts_memory_generation(const struct ts_memory *mem);

/* Resets every space's and pool's peak counters to the current values. */
void ts_memory_reset_peaks(struct ts_memory *mem);

/* Number of pools and the i-th's stats (i < count): node-wide pools first. */
size_t ts_memory_pool_count(const struct ts_memory *mem);
void ts_memory_pool_stats(const struct ts_memory *mem, size_t i, struct ts_pool_stats *out);

/* The stats of the pool a space draws from. */
void ts_space_pool_stats(const struct ts_space *sp, struct ts_pool_stats *out);

/* The name of the pool a space draws from ("host/pinned_host"; borrowed). */
const char *ts_space_pool_name(const struct ts_space *sp);

/* The device and memory kind of a space (borrowed). */
struct ts_device *ts_space_device(const struct ts_space *sp);
enum ts_memory_kind ts_space_kind(const struct ts_space *sp);

/* "sim:0/device". */
const char *ts_space_name(const struct ts_space *sp);

/*
 * Allocates size bytes (size may be 0: a unique non-NULL pointer is still
 * returned and accounted as 0 bytes). On refusal returns RESOURCE_EXHAUSTED
 * with reason OUT_OF_MEMORY and metadata space, requested_bytes, free_bytes,
 * largest_free_block_bytes, limit_bytes; nothing changes. The memory is not
 * initialised. Caller owns the block and frees it with ts_space_release
 * (same size). A refusal counts in the space's stats (refusals).
 */
ts_status ts_space_alloc(struct ts_space *sp, uint64_t size, void **out,
                         struct ts_error *err);
void ts_space_release(struct ts_space *sp, void *p, uint64_t size);

/*
 * The chunk of sp's pool that holds the allocation at p: the raw memory the
 * pool took from its device in one piece (a device pool's region, one
 * cudaMalloc on a GPU; a pinned segment), as base and size. false when p is
 * in none (pageable pools take a mapping per allocation). A chunk lives at
 * least as long as an allocation in it: a pinned segment may go back to the
 * system once nothing is allocated in it. Takes the pool's lock.
 */
bool ts_space_chunk(const struct ts_space *sp, const void *p, void **base, uint64_t *size);

/* Whether an allocation of size would fit now (advisory; racy). */
bool ts_space_would_fit(const struct ts_space *sp, uint64_t size);

/* TS_OK when size would fit now; else RESOURCE_EXHAUSTED with the same
 * message and metadata as a refused ts_space_alloc. Advisory: admission
 * before a body whose exact size is not known yet; a refusal counts in
 * refusals as ts_space_alloc's does. */
ts_status ts_space_check_fit(const struct ts_space *sp, uint64_t size,
                             struct ts_error *err);

/* Snapshot of the counters. */
void ts_space_stats(const struct ts_space *sp, struct ts_space_stats *out);

#endif
