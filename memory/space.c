/*
 * space.c - pools of memory and the (device, memory kind) spaces that draw
 * from them.
 *
 * Three pool types:
 *   REGION    one range reserved at start (device memory), carved best-fit;
 *   SEGMENTS  pinned host memory: segments of `segment` bytes pinned on demand
 *             (or all at start with preallocate), carved best-fit, kept for
 *             reuse; requests are never rounded beyond the alignment. A
 *             segment that a release leaves idle goes back to the system
 *             when the pool's idle segments would exceed `keep` with it
 *             (and idle ones go back to make room for a segment that would
 *             not fit the limit otherwise); preallocated segments stay;
 *   PAGEABLE  each allocation is its own pageable mapping, counted against the
 *             limit.
 * Pool state is guarded by the pool's mutex; the numbers readers want are
 * mirrored into atomics after each change so that stats never take a lock.
 */
#include "memory/space.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fault.h"
#include "common/lock.h"
#include "common/log.h"
#include "common/units.h"
#include "device/topology.h"
#include "memory/allocator.h"

#define POOL_ALIGN 256u
#define DEFAULT_SEGMENT (256ull << 20)

enum pool_type { POOL_REGION, POOL_SEGMENTS, POOL_PAGEABLE };

struct segment {
	void *base;
	uint64_t size;
	bool fixed;                   /* pinned at start (preallocate): never given back */
};

struct pool {
	struct ts_mutex mu;
	enum pool_type type;          /* immutable after init */
	struct ts_device *src;        /* immutable: where raw memory comes from */
	enum ts_memory_kind kind;     /* immutable */
	char name[48];                /* immutable: "sim:0/device", "host/pinned_host" */
	uint64_t limit;               /* immutable */
	uint64_t segment;             /* immutable: growth step (SEGMENTS) */
	uint64_t keep;                /* immutable: idle segment bytes kept (SEGMENTS) */
	int numa;                     /* immutable: the NUMA node (OS index) its memory is
	                               * for, -1: none */
	const struct ts_topology *topo; /* immutable; borrowed: binds to numa when it can */
	uint64_t high_water;          /* guarded by: mu: the most ever reserved */
	struct ts_alloc *alloc;       /* guarded by: mu (REGION, SEGMENTS) */
	struct segment *segs;         /* guarded by: mu */
	size_t nsegs, capsegs;        /* guarded by: mu */
	uint64_t used;                /* guarded by: mu: aligned (carved) or exact (pageable) */
	_Atomic uint64_t a_used;      /* mirrors of the guarded numbers */
	_Atomic uint64_t a_reserved;
	_Atomic uint64_t a_peak_reserved;
	_Atomic uint64_t a_largest_free;
	_Atomic uint64_t a_segs_pinned;  /* counters written under mu, read without */
	_Atomic uint64_t a_segs_released;
	_Atomic uint64_t a_pinned;
	_Atomic uint64_t a_released;
	_Atomic uint64_t a_repinned;
	_Atomic uint64_t a_pin_ns;
	_Atomic uint64_t a_repin_ns;
	_Atomic uint64_t a_nsegs;
};

struct ts_space {
	struct ts_device *dev;        /* immutable */
	enum ts_memory_kind kind;     /* immutable */
	struct pool *pool;            /* immutable; borrowed from ts_memory */
	char name[48];                /* immutable */
	_Atomic uint64_t in_use;
	_Atomic uint64_t peak;
	_Atomic uint64_t num_allocs;
	_Atomic uint64_t largest_alloc;
	_Atomic uint64_t live;
	_Atomic uint64_t refusals;
	_Atomic uint64_t *generation; /* immutable: the memory table's counter */
};

struct ts_memory {
	struct ts_device_set *set;    /* borrowed */
	struct pool **pools;          /* immutable after init */
	size_t npools;
	struct ts_space *spaces;      /* immutable after init */
	size_t nspaces;
	_Atomic uint64_t generation;  /* bumped after every change of any space */
};

static void atomic_max(_Atomic uint64_t *a, uint64_t v)
{
	uint64_t cur = atomic_load(a);

	while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
		;
}

static uint64_t round_up(uint64_t n, uint64_t a)
{
	return (n + a - 1) / a * a;
}

/* ---- pools ----------------------------------------------------------------- */

static void pool_publish_locked(struct pool *p)
{
	struct ts_alloc_stats st;
	uint64_t largest;

	assert(ts_mutex_held(&p->mu));
	if (p->type == POOL_PAGEABLE) {
		largest = p->limit > p->used ? p->limit - p->used : 0;
	} else {
		ts_alloc_get_stats(p->alloc, &st);
		largest = st.largest_free_block;
		if (p->type == POOL_SEGMENTS && p->limit > st.bytes_reserved &&
		    p->limit - st.bytes_reserved > largest)
			largest = (p->limit - st.bytes_reserved) / POOL_ALIGN * POOL_ALIGN;
		atomic_store(&p->a_reserved, st.bytes_reserved);
		atomic_max(&p->a_peak_reserved, st.bytes_reserved);
	}
	atomic_store(&p->a_used, p->used);
	atomic_store(&p->a_largest_free, largest);
}

/* Counts a segment of size bytes pinned in ns, the pool having reserved
 * before bytes: the part below the highest reservation is pinned again. */
static void pool_count_pin_locked(struct pool *p, uint64_t before, uint64_t size, uint64_t ns)
{
	uint64_t after = before + size;
	uint64_t again = p->high_water > before
	                 ? (p->high_water < after ? p->high_water : after) - before : 0;

	assert(ts_mutex_held(&p->mu));
	if (after > p->high_water)
		p->high_water = after;
	atomic_fetch_add(&p->a_segs_pinned, 1);
	atomic_fetch_add(&p->a_pinned, size);
	atomic_fetch_add(&p->a_pin_ns, ns);
	if (again) {
		atomic_fetch_add(&p->a_repinned, again);
		atomic_fetch_add(&p->a_repin_ns, (uint64_t)((double)ns * (double)again / (double)size));
	}
}

static ts_status pool_add_segment_locked(struct pool *p, uint64_t size, bool fixed,
                                         struct ts_error *err)
{
	struct ts_alloc_stats as;
	struct segment *grown;
	uint64_t t0;
	void *base;
	bool bind;
	ts_status st;

	assert(ts_mutex_held(&p->mu));
	if (p->nsegs == p->capsegs) {
		size_t cap = p->capsegs ? p->capsegs * 2 : 8;

		grown = realloc(p->segs, cap * sizeof *grown);
		if (!grown)
			return ts_error_oom(err, "%s: no memory for pool bookkeeping", p->name);
		p->segs = grown;
		p->capsegs = cap;
	}
	ts_alloc_get_stats(p->alloc, &as);
	t0 = ts_now_ns();
	bind = p->numa >= 0 && ts_topology_can_bind(p->topo);
	/* pages the allocation pins at once (the CUDA driver's) come from the
	 * thread's policy, pages touched later from the area's */
	if (bind)
		bind = ts_topology_bind_thread(p->topo, p->numa);
	st = ts_device_mem_alloc(p->src, p->kind, size, &base, err);
	if (bind)
		ts_topology_unbind_thread(p->topo);
	if (st != TS_OK)
		return st;
	if (bind)
		(void)ts_topology_bind_area(p->topo, base, size, p->numa);
	if (!ts_alloc_add_region(p->alloc, (uintptr_t)base, size)) {
		ts_device_mem_free(p->src, p->kind, base, size);
		return ts_error_set(err, TS_INTERNAL, "POOL_REGION",
		                    "%s: cannot add a region of %llu bytes", p->name,
		                    (unsigned long long)size);
	}
	p->segs[p->nsegs++] = (struct segment){base, size, fixed};
	atomic_store(&p->a_nsegs, p->nsegs);
	if (p->type == POOL_SEGMENTS)
		pool_count_pin_locked(p, as.bytes_reserved, size, ts_now_ns() - t0);
	return TS_OK;
}

/* Whether segment i has nothing allocated in it. */
static bool segment_idle_locked(const struct pool *p, size_t i)
{
	uintptr_t base;
	uint64_t size;
	bool idle = false;

	assert(ts_mutex_held(&p->mu));
	return ts_alloc_region_of(p->alloc, (uintptr_t)p->segs[i].base, &base, &size, &idle) &&
	       idle;
}

/* Bytes of the idle segments that may go back (not fixed), but segment skip. */
static uint64_t idle_bytes_locked(const struct pool *p, size_t skip)
{
	uint64_t n = 0;

	for (size_t i = 0; i < p->nsegs; i++)
		if (i != skip && !p->segs[i].fixed && segment_idle_locked(p, i))
			n += p->segs[i].size;
	return n;
}

/* Gives idle segment i back to the system (the provider's free: munmap,
 * with cudaHostUnregister or cudaFreeHost on CUDA). */
static void pool_drop_segment_locked(struct pool *p, size_t i)
{
	struct segment seg = p->segs[i];

	assert(ts_mutex_held(&p->mu));
	if (!ts_alloc_remove_region(p->alloc, (uintptr_t)seg.base))
		return;                  /* not idle after all: kept */
	p->segs[i] = p->segs[--p->nsegs];
	atomic_store(&p->a_nsegs, p->nsegs);
	ts_device_mem_free(p->src, p->kind, seg.base, seg.size);
	atomic_fetch_add(&p->a_segs_released, 1);
	atomic_fetch_add(&p->a_released, seg.size);
}

/* The segment holding addr, or nsegs. */
static size_t segment_of_locked(const struct pool *p, uintptr_t addr)
{
	for (size_t i = 0; i < p->nsegs; i++)
		if (addr - (uintptr_t)p->segs[i].base < p->segs[i].size)
			return i;
	return p->nsegs;
}

/* After a release at addr: gives its segment back when it is idle and the
 * pool's idle segments would exceed the keep with it. */
static void pool_trim_locked(struct pool *p, uintptr_t addr)
{
	size_t i = segment_of_locked(p, addr);

	assert(ts_mutex_held(&p->mu));
	if (i == p->nsegs || p->segs[i].fixed || !segment_idle_locked(p, i))
		return;
	if (idle_bytes_locked(p, i) + p->segs[i].size > p->keep)
		pool_drop_segment_locked(p, i);
}

/* Gives idle segments back, largest first, until need bytes fit under the
 * limit beside what stays reserved; nothing when they cannot make room. */
static void pool_make_room_locked(struct pool *p, uint64_t need)
{
	struct ts_alloc_stats as;
	uint64_t room;

	assert(ts_mutex_held(&p->mu));
	ts_alloc_get_stats(p->alloc, &as);
	room = p->limit > as.bytes_reserved ? p->limit - as.bytes_reserved : 0;
	if (room >= need || room + idle_bytes_locked(p, SIZE_MAX) < need)
		return;
	while (room < need) {
		size_t best = p->nsegs;

		for (size_t i = 0; i < p->nsegs; i++)
			if (!p->segs[i].fixed && segment_idle_locked(p, i) &&
			    (best == p->nsegs || p->segs[i].size > p->segs[best].size))
				best = i;
		if (best == p->nsegs)
			return;
		room += p->segs[best].size;
		pool_drop_segment_locked(p, best);
	}
}

static void pool_destroy(struct pool *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->nsegs; i++)
		ts_device_mem_free(p->src, p->kind, p->segs[i].base, p->segs[i].size);
	free(p->segs);
	ts_alloc_free(p->alloc);
	ts_mutex_destroy(&p->mu);
	free(p);
}

/* Where a pool's memory is to lie: a NUMA node, and the topology that binds
 * it there (NULL: anywhere). */
struct pool_place {
	int numa;
	const struct ts_topology *topo;
};

static ts_status pool_create(enum pool_type type, struct ts_device *src,
                             enum ts_memory_kind kind, const char *name,
                             uint64_t limit, uint64_t segment, uint64_t keep,
                             bool preallocate, const struct pool_place *place,
                             struct pool **out, struct ts_error *err)
{
	struct pool *p = calloc(1, sizeof *p);
	ts_status st = TS_OK;

	if (!p)
		return ts_error_oom(err, "no memory for pool '%s'", name);
	ts_mutex_init(&p->mu);
	p->type = type;
	p->src = src;
	p->kind = kind;
	p->limit = limit / POOL_ALIGN * POOL_ALIGN;
	p->segment = segment ? round_up(segment, POOL_ALIGN) : DEFAULT_SEGMENT;
	p->keep = keep;
	p->numa = place ? place->numa : -1;
	p->topo = place ? place->topo : NULL;
	snprintf(p->name, sizeof p->name, "%s", name);
	if (type != POOL_PAGEABLE) {
		p->alloc = ts_alloc_new(POOL_ALIGN);
		if (!p->alloc) {
			st = ts_error_oom(err, "no memory for pool '%s'", name);
			goto out_destroy;
		}
	}
	ts_mutex_lock(&p->mu);      /* not shared yet; held as the _locked helpers assert */
	if (type == POOL_REGION && p->limit > 0)
		st = pool_add_segment_locked(p, p->limit, true, err);
	else if (type == POOL_SEGMENTS && preallocate && p->limit > 0)
		st = pool_add_segment_locked(p, p->limit, true, err);
	if (st == TS_OK)
		pool_publish_locked(p);
	ts_mutex_unlock(&p->mu);
	if (st != TS_OK)
		goto out_destroy;
	*out = p;
	return TS_OK;

out_destroy:
	pool_destroy(p);
	return st;
}

static ts_status pool_refuse(struct pool *p, const char *space, uint64_t size,
                             struct ts_error *err)
{
	uint64_t used = atomic_load(&p->a_used);
	struct ts_oom_figures f = {
		.where = space, .ids = {{"space", space}}, .requested = size,
		.free_bytes = p->limit > used ? p->limit - used : 0, .limit = p->limit,
		.largest = atomic_load(&p->a_largest_free),
	};

	return ts_error_oom_bytes(err, &f);
}

/* Carves from the allocator, growing a pinned pool by one segment if needed. */
static ts_status pool_carve_locked(struct pool *p, uint64_t size, void **out,
                                   struct ts_error *err)
{
	uint64_t need = round_up(size, POOL_ALIGN);
	struct ts_alloc_stats st;
	uintptr_t addr;
	ts_status s;

	assert(ts_mutex_held(&p->mu));
	if (!ts_alloc_alloc(p->alloc, need, &addr)) {
		if (p->type != POOL_SEGMENTS)
			return TS_RESOURCE_EXHAUSTED;
		pool_make_room_locked(p, need);
		ts_alloc_get_stats(p->alloc, &st);
		if (st.bytes_reserved >= p->limit || p->limit - st.bytes_reserved < need)
			return TS_RESOURCE_EXHAUSTED;
		uint64_t grow = need > p->segment ? need : p->segment;

		if (grow > p->limit - st.bytes_reserved)
			grow = p->limit - st.bytes_reserved;
		s = pool_add_segment_locked(p, grow, false, err);
		if (s != TS_OK)
			return s;
		if (!ts_alloc_alloc(p->alloc, need, &addr))
			return TS_RESOURCE_EXHAUSTED;
	}
	p->used += ts_alloc_block_size(p->alloc, addr);
	*out = (void *)addr;
	return TS_OK;
}

/* The failure point an allocation of p is (fault.h). */
static enum ts_fault_kind pool_fault_kind(const struct pool *p)
{
	return p->type == POOL_REGION ? TS_FAULT_ALLOC_DEVICE
	       : p->type == POOL_SEGMENTS ? TS_FAULT_ALLOC_PINNED : TS_FAULT_ALLOC_PAGEABLE;
}

static ts_status pool_alloc(struct pool *p, const char *space, uint64_t size,
                            void **out, struct ts_error *err)
{
	uint64_t want = size ? size : 1;
	struct ts_error inner;
	ts_status st;

	ts_error_clear(&inner);
	ts_mutex_lock(&p->mu);
	if (ts_fault_fire(pool_fault_kind(p))) {
		st = TS_RESOURCE_EXHAUSTED;   /* injected: refused as a full pool is */
	} else if (p->type == POOL_PAGEABLE) {
		if (want > p->limit || p->used > p->limit - want) {
			st = TS_RESOURCE_EXHAUSTED;
		} else {
			st = ts_device_mem_alloc(p->src, p->kind, want, out, &inner);
			if (st == TS_OK)
				p->used += want;
		}
	} else {
		st = pool_carve_locked(p, want, out, &inner);
	}
	pool_publish_locked(p);
	ts_mutex_unlock(&p->mu);
	if (st == TS_RESOURCE_EXHAUSTED)
		return pool_refuse(p, space, size, err);
	if (st != TS_OK) {
		ts_error_set(err, inner.status, inner.reason, "%s", inner.message);
		return st;
	}
	return TS_OK;
}

static void pool_release(struct pool *p, void *ptr, uint64_t size)
{
	uint64_t want = size ? size : 1;

	ts_mutex_lock(&p->mu);
	if (p->type == POOL_PAGEABLE) {
		ts_device_mem_free(p->src, p->kind, ptr, want);
		p->used -= want;
	} else {
		uint64_t blk = ts_alloc_block_size(p->alloc, (uintptr_t)ptr);

		if (ts_alloc_release(p->alloc, (uintptr_t)ptr)) {
			p->used -= blk;
			if (p->type == POOL_SEGMENTS)
				pool_trim_locked(p, (uintptr_t)ptr);
		} else
			ts_log(TS_LOG_ERROR, NULL, "%s: release of unknown block %p", p->name, ptr);
	}
	pool_publish_locked(p);
	ts_mutex_unlock(&p->mu);
}

/* ---- spaces ---------------------------------------------------------------- */

struct ts_device *ts_space_device(const struct ts_space *sp)
{
	return sp->dev;
}

enum ts_memory_kind ts_space_kind(const struct ts_space *sp)
{
	return sp->kind;
}

const char *ts_space_name(const struct ts_space *sp)
{
	return sp->name;
}

const char *ts_space_pool_name(const struct ts_space *sp)
{
	return sp->pool->name;
}

ts_status ts_space_alloc(struct ts_space *sp, uint64_t size, void **out,
                         struct ts_error *err)
{
	ts_status st = pool_alloc(sp->pool, sp->name, size, out, err);
	uint64_t now;

	if (st != TS_OK) {
		if (st == TS_RESOURCE_EXHAUSTED)
			atomic_fetch_add(&sp->refusals, 1);
		return st;
	}
	now = atomic_fetch_add(&sp->in_use, size) + size;
	atomic_max(&sp->peak, now);
	atomic_max(&sp->largest_alloc, size);
	atomic_fetch_add(&sp->num_allocs, 1);
	atomic_fetch_add(&sp->live, 1);
	atomic_fetch_add(sp->generation, 1);
	return TS_OK;
}

void ts_space_release(struct ts_space *sp, void *p, uint64_t size)
{
	if (!p)
		return;
	pool_release(sp->pool, p, size);
	atomic_fetch_sub(&sp->in_use, size);
	atomic_fetch_sub(&sp->live, 1);
	atomic_fetch_add(sp->generation, 1);
}

bool ts_space_chunk(const struct ts_space *sp, const void *p, void **base, uint64_t *size)
{
	struct pool *pl = sp->pool;
	uintptr_t a = (uintptr_t)p;
	bool found = false;

	ts_mutex_lock(&pl->mu);
	for (size_t i = 0; !found && pl->type != POOL_PAGEABLE && i < pl->nsegs; i++) {
		uintptr_t b = (uintptr_t)pl->segs[i].base;

		if (a >= b && a - b < pl->segs[i].size) {
			*base = pl->segs[i].base;
			*size = pl->segs[i].size;
			found = true;
		}
	}
	ts_mutex_unlock(&pl->mu);
	return found;
}

bool ts_space_would_fit(const struct ts_space *sp, uint64_t size)
{
	return round_up(size ? size : 1, POOL_ALIGN) <= atomic_load(&sp->pool->a_largest_free);
}

ts_status ts_space_check_fit(const struct ts_space *sp, uint64_t size,
                             struct ts_error *err)
{
	if (ts_space_would_fit(sp, size))
		return TS_OK;
	atomic_fetch_add(&((struct ts_space *)sp)->refusals, 1);   /* a counter, not state */
	return pool_refuse(sp->pool, sp->name, size, err);
}

void ts_space_stats(const struct ts_space *sp, struct ts_space_stats *out)
{
	const struct pool *p = sp->pool;
	uint64_t used = atomic_load(&p->a_used);

	out->bytes_in_use = atomic_load(&sp->in_use);
	out->peak_bytes_in_use = atomic_load(&sp->peak);
	out->num_allocs = atomic_load(&sp->num_allocs);
	out->largest_alloc_size = atomic_load(&sp->largest_alloc);
	out->live_allocs = atomic_load(&sp->live);
	out->refusals = atomic_load(&sp->refusals);
	out->bytes_limit = p->limit;
	out->pool_bytes_in_use = used;
	out->bytes_free = p->limit > used ? p->limit - used : 0;
	out->largest_free_block_bytes = atomic_load(&p->a_largest_free);
	if (p->type == POOL_PAGEABLE) {
		out->bytes_reserved = used;
		out->peak_bytes_reserved = used;
	} else {
		out->bytes_reserved = atomic_load(&p->a_reserved);
		out->peak_bytes_reserved = atomic_load(&p->a_peak_reserved);
	}
}

/* ---- the node's memory ----------------------------------------------------- */

static uint64_t physical_memory(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : (8ull << 30);
}

uint64_t ts_device_pool_size(uint64_t free_bytes, double fraction)
{
	uint64_t share = (uint64_t)((double)free_bytes * fraction);
	uint64_t headroom = free_bytes / 4 < TS_DEVICE_HEADROOM ? free_bytes / 4 : TS_DEVICE_HEADROOM;

	return share < free_bytes - headroom ? share : free_bytes - headroom;
}

/* Says at start what a GPU's pool takes and what it leaves to the rest. */
static void log_device_pool(const char *id, uint64_t pool, uint64_t free_b, double fraction)
{
	char fields[192], pool_h[32], free_h[32], left_h[32];

	ts_format_bytes(pool_h, sizeof pool_h, pool);
	ts_format_bytes(free_h, sizeof free_h, free_b);
	ts_format_bytes(left_h, sizeof left_h, free_b - pool);
	snprintf(fields, sizeof fields,
	         "\"device\":\"%s\",\"pool_bytes\":%llu,\"free_bytes\":%llu,\"left_bytes\":%llu",
	         id, (unsigned long long)pool, (unsigned long long)free_b,
	         (unsigned long long)(free_b - pool));
	ts_log(TS_LOG_INFO, fields,
	       "%s: device pool of %s (--device-memory-fraction %.2f of %s free); %s left to the "
	       "CUDA runtime, cuBLAS workspaces and kernel modules", id, pool_h, fraction, free_h,
	       left_h);
}

static ts_status device_pool_limit(struct ts_device *dev,
                                   const struct ts_memory_config *cfg,
                                   uint64_t *limit, struct ts_error *err)
{
	const struct ts_device_props *pr = ts_device_props(dev);
	uint64_t free_b, total;
	ts_status st;

	if (pr->backend == TS_BACKEND_SIM) {
		*limit = pr->total_memory;   /* the simulated capacity, whole */
		return TS_OK;
	}
	st = ts_device_mem_info(dev, &free_b, &total, err);
	if (st != TS_OK)
		return st;
	*limit = ts_device_pool_size(free_b, cfg->device_memory_fraction);
	log_device_pool(pr->id, *limit, free_b, cfg->device_memory_fraction);
	return TS_OK;
}

/* Idle pinned bytes the pool keeps reserved: 0 is the default, as every
 * other field of the configuration (a configuration that does not name the
 * keep must not unpin and pin again around every call). */
static uint64_t pinned_keep(const struct ts_memory_config *cfg, uint64_t limit)
{
	uint64_t seg = cfg->pinned_segment ? round_up(cfg->pinned_segment, POOL_ALIGN)
	                                   : DEFAULT_SEGMENT;

	if (cfg->pinned_host_keep_share > 0)
		return (uint64_t)((double)limit * cfg->pinned_host_keep_share);
	if (cfg->pinned_host_keep == TS_PINNED_KEEP_NONE)
		return 0;
	if (cfg->pinned_host_keep)
		return cfg->pinned_host_keep;
	return seg > limit / 8 ? seg : limit / 8;
}

static ts_status memory_add_pool(struct ts_memory *m, struct pool *p,
                                 struct ts_error *err)
{
	struct pool **grown = realloc(m->pools, (m->npools + 1) * sizeof *grown);

	if (!grown) {
		pool_destroy(p);
		return ts_error_oom(err, "no memory for the pool table");
	}
	m->pools = grown;
	m->pools[m->npools++] = p;
	return TS_OK;
}

static void space_init(struct ts_memory *m, struct ts_space *sp,
                       struct ts_device *dev, enum ts_memory_kind kind,
                       struct pool *p)
{
	sp->generation = &m->generation;
	sp->dev = dev;
	sp->kind = kind;
	sp->pool = p;
	snprintf(sp->name, sizeof sp->name, "%s/%s", ts_device_props(dev)->id,
	         ts_memory_kind_name(kind));
}

/* The NUMA node of an accelerator of the topology, or -1 (the host, an
 * unplaced device, no topology). */
static int device_numa(const struct ts_topology *t, const struct ts_device *dev)
{
	const struct ts_device_props *pr = ts_device_props(dev);
	const struct ts_topology_device *d = ts_topology_device_find(t, pr->id);

	return d && pr->backend != TS_BACKEND_CPU ? d->numa_node : -1;
}

ts_status ts_memory_parse_numa_split(const char *s, struct ts_memory_config *cfg,
                                     struct ts_error *err)
{
	const char *at = s;

	cfg->numa_split_count = 0;
	if (!s || !*s)
		return TS_OK;
	for (;;) {
		char *end;
		long node;
		double w;

		errno = 0;
		node = strtol(at, &end, 10);
		if (end == at || *end != ':' || errno || node < 0 || node > 4095 || *at == '+' ||
		    *at == '-' || *at == ' ')
			return ts_error_set(err, TS_INVALID_ARGUMENT, "NUMA_SPLIT",
			                    "--pinned-host-numa-split: '%.40s' is not NODE:WEIGHT (a NUMA "
			                    "node index, a colon, a positive weight), e.g. 0:1,1:3", at);
		at = end + 1;
		errno = 0;
		w = strtod(at, &end);
		if (end == at || errno || !(w > 0) || !isfinite(w) || (*end && *end != ','))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "NUMA_SPLIT",
			                    "--pinned-host-numa-split: node %ld's weight '%.40s' is not a "
			                    "positive number", node, at);
		for (size_t i = 0; i < cfg->numa_split_count; i++)
			if (cfg->numa_split[i].node == (int)node)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "NUMA_SPLIT",
				                    "--pinned-host-numa-split: node %ld is given twice", node);
		if (cfg->numa_split_count == TS_MEMORY_NUMA_MAX)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "NUMA_SPLIT",
			                    "--pinned-host-numa-split: more than %d nodes",
			                    TS_MEMORY_NUMA_MAX);
		cfg->numa_split[cfg->numa_split_count].node = (int)node;
		cfg->numa_split[cfg->numa_split_count++].weight = w;
		if (!*end)
			return TS_OK;
		at = end + 1;
	}
}

/* The weight --pinned-host-numa-split gives node, or -1 when it names none. */
static double split_weight(const struct ts_memory_config *cfg, int node)
{
	for (size_t i = 0; i < cfg->numa_split_count; i++)
		if (cfg->numa_split[i].node == node)
			return cfg->numa_split[i].weight;
	return -1;
}

/* Refuses a --pinned-host-numa-split that leaves out a node with
 * accelerators (node[0..n)) or names another. */
static ts_status check_split(const struct ts_memory_config *cfg, const int *node, size_t n,
                             struct ts_error *err)
{
	char have[128] = "";
	size_t len = 0;

	for (size_t k = 0; k < n; k++)
		len += (size_t)snprintf(have + len, len < sizeof have ? sizeof have - len : 0, "%s%d",
		                        k ? ", " : "", node[k]);
	for (size_t k = 0; k < n; k++)
		if (split_weight(cfg, node[k]) < 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "NUMA_SPLIT",
			                    "--pinned-host-numa-split gives no weight to NUMA node %d, "
			                    "which has accelerators (nodes with accelerators: %s)",
			                    node[k], have);
	for (size_t i = 0; i < cfg->numa_split_count; i++) {
		size_t k = 0;

		while (k < n && node[k] != cfg->numa_split[i].node)
			k++;
		if (k == n)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "NUMA_SPLIT",
			                    "--pinned-host-numa-split names NUMA node %d, which has no "
			                    "pinned_host pool (nodes with accelerators: %s%s)",
			                    cfg->numa_split[i].node, n > 1 ? have : "",
			                    n > 1 ? "" : "one or none: a single pool takes the budget");
	}
	return TS_OK;
}

/*
 * The pinned_host pools: one per NUMA node that has accelerators (in the
 * topology's order), bound to it where the topology can bind, each with the
 * share of limit its accelerators are of all placed ones, or its weight's
 * share of all weights where --pinned-host-numa-split gives them; a single
 * pool, named "host/pinned_host" as without a topology, where there is one
 * such node or none (a split naming nodes then is refused).
 */
static ts_status pinned_pools(struct ts_memory *m, struct ts_device *host,
                              const struct ts_memory_config *cfg, uint64_t limit,
                              struct pool **pools, size_t *n, struct ts_error *err)
{
	const struct ts_topology *t = cfg->topology;
	size_t count[TS_MEMORY_NUMA_MAX] = {0}, placed = 0, given = 0;
	int node[TS_MEMORY_NUMA_MAX];
	ts_status st = TS_OK;

	*n = 0;
	for (size_t i = 0; t && i < ts_topology_numa_count(t) && *n < TS_MEMORY_NUMA_MAX; i++) {
		int idx = ts_topology_numa_at(t, i)->index;

		for (size_t j = 0; j < ts_device_set_count(m->set); j++)
			count[*n] += device_numa(t, ts_device_set_at(m->set, j)) == idx;
		if (count[*n]) {
			placed += count[*n];
			node[(*n)++] = idx;
		}
	}
	if (cfg->numa_split_count) {
		st = check_split(cfg, node, *n <= 1 ? 0 : *n, err);
		if (st != TS_OK) {
			*n = 0;
			return st;
		}
	}
	if (*n <= 1) {
		struct pool_place where = {.numa = *n ? node[0] : -1, .topo = t};

		*n = 1;
		st = pool_create(POOL_SEGMENTS, host, TS_MEM_PINNED_HOST, "host/pinned_host", limit,
		                 cfg->pinned_segment, pinned_keep(cfg, limit), cfg->preallocate,
		                 &where, &pools[0], err);
		return st == TS_OK ? memory_add_pool(m, pools[0], err) : st;
	}
	for (size_t k = 0; st == TS_OK && k < *n; k++) {
		struct pool_place where = {.numa = node[k], .topo = t};
		uint64_t share = limit / placed * count[k] / POOL_ALIGN * POOL_ALIGN;
		char name[48];

		if (cfg->numa_split_count) {
			double total = 0;

			for (size_t i = 0; i < cfg->numa_split_count; i++)
				total += cfg->numa_split[i].weight;
			share = (uint64_t)((double)limit * (split_weight(cfg, node[k]) / total)) /
			        POOL_ALIGN * POOL_ALIGN;
		}
		if (k + 1 == *n)
			share = limit - given;

		given += share;
		snprintf(name, sizeof name, "numa%d/pinned_host", node[k]);
		st = pool_create(POOL_SEGMENTS, host, TS_MEM_PINNED_HOST, name, share,
		                 cfg->pinned_segment, pinned_keep(cfg, share), cfg->preallocate,
		                 &where, &pools[k], err);
		if (st == TS_OK)
			st = memory_add_pool(m, pools[k], err);
	}
	return st;
}

/* The pinned_host pool of dev: its NUMA node's, else the first. */
static struct pool *pinned_pool_of(const struct ts_topology *t, const struct ts_device *dev,
                                   struct pool **pools, size_t n)
{
	int node = device_numa(t, dev);

	for (size_t k = 0; node >= 0 && k < n; k++)
		if (pools[k]->numa == node)
			return pools[k];
	return pools[0];
}

ts_status ts_memory_new(struct ts_device_set *set,
                        const struct ts_memory_config *cfg,
                        struct ts_memory **out, struct ts_error *err)
{
	struct ts_memory *m = calloc(1, sizeof *m);
	size_t ndev = ts_device_set_count(set);
	struct ts_device *host = ts_device_set_find(set, "cpu:0");
	struct pool *pinned[TS_MEMORY_NUMA_MAX] = {0}, *pageable = NULL, *p;
	size_t npinned = 0;
	uint64_t phys = physical_memory(), limit;
	ts_status st;

	if (!m)
		return ts_error_oom(err, "no memory for the memory table");
	m->set = set;
	m->spaces = calloc(ndev * TS_MEM_KIND_COUNT, sizeof *m->spaces);
	if (!m->spaces || !host) {
		st = ts_error_set(err, m->spaces ? TS_INTERNAL : TS_RESOURCE_EXHAUSTED,
		                  "SETUP", "cannot build the memory table");
		goto out_free;
	}
	limit = cfg->pinned_host_limit ? cfg->pinned_host_limit : phys / 4;
	st = pinned_pools(m, host, cfg, limit, pinned, &npinned, err);
	if (st == TS_OK)
		st = pool_create(POOL_PAGEABLE, host, TS_MEM_UNPINNED_HOST,
		                 "host/unpinned_host",
		                 cfg->unpinned_host_limit ? cfg->unpinned_host_limit : phys / 2,
		                 0, 0, false, NULL, &pageable, err);
	if (st == TS_OK)
		st = memory_add_pool(m, pageable, err);
	for (size_t i = 0; st == TS_OK && i < ndev; i++) {
		struct ts_device *dev = ts_device_set_at(set, i);
		const struct ts_device_props *pr = ts_device_props(dev);
		char name[48];

		if (pr->backend == TS_BACKEND_CPU) {
			p = pageable;    /* cpu:0's device memory is host RAM */
		} else {
			st = device_pool_limit(dev, cfg, &limit, err);
			if (st != TS_OK)
				break;
			snprintf(name, sizeof name, "%s/device", pr->id);
			st = pool_create(POOL_REGION, dev, TS_MEM_DEVICE, name, limit, 0, 0,
			                 cfg->preallocate, NULL, &p, err);
			if (st == TS_OK)
				st = memory_add_pool(m, p, err);
			if (st != TS_OK)
				break;
		}
		space_init(m, &m->spaces[m->nspaces++], dev, TS_MEM_DEVICE, p);
		space_init(m, &m->spaces[m->nspaces++], dev, TS_MEM_PINNED_HOST,
		           pinned_pool_of(cfg->topology, dev, pinned, npinned));
		space_init(m, &m->spaces[m->nspaces++], dev, TS_MEM_UNPINNED_HOST, pageable);
	}
	if (st != TS_OK)
		goto out_free;
	*out = m;
	return TS_OK;

out_free:
	ts_memory_free(m);
	return st;
}

void ts_memory_free(struct ts_memory *mem)
{
	if (!mem)
		return;
	for (size_t i = 0; i < mem->npools; i++)
		pool_destroy(mem->pools[i]);
	free(mem->pools);
	free(mem->spaces);
	free(mem);
}

size_t ts_memory_space_count(const struct ts_memory *mem)
{
	return mem->nspaces;
}

struct ts_space *ts_memory_space_at(const struct ts_memory *mem, size_t i)
{
	return i < mem->nspaces ? &mem->spaces[i] : NULL;
}

struct ts_space *ts_memory_find(const struct ts_memory *mem,
                                const char *device_id, enum ts_memory_kind kind)
{
	for (size_t i = 0; i < mem->nspaces; i++)
		if (mem->spaces[i].kind == kind &&
		    strcmp(ts_device_props(mem->spaces[i].dev)->id, device_id) == 0)
			return &mem->spaces[i];
	return NULL;
}

void ts_memory_reset_peaks(struct ts_memory *mem)
{
	for (size_t i = 0; i < mem->nspaces; i++)
		atomic_store(&mem->spaces[i].peak, atomic_load(&mem->spaces[i].in_use));
	for (size_t i = 0; i < mem->npools; i++)
		atomic_store(&mem->pools[i]->a_peak_reserved,
		             atomic_load(&mem->pools[i]->a_reserved));
	atomic_fetch_add(&mem->generation, 1);
}

size_t ts_memory_pool_count(const struct ts_memory *mem)
{
	return mem->npools;
}

static void pool_stats(const struct pool *p, struct ts_pool_stats *out)
{
	uint64_t used = atomic_load(&p->a_used);

	memset(out, 0, sizeof *out);

	out->name = p->name;
	out->kind = p->kind;
	out->numa_node = p->numa;
	out->bound = p->numa >= 0 && ts_topology_can_bind(p->topo);
	out->device = p->type == POOL_REGION ? p->src : NULL;
	out->limit = p->limit;
	out->bytes_in_use = used;
	out->largest_free_block_bytes = atomic_load(&p->a_largest_free);
	if (p->type == POOL_PAGEABLE) {
		out->bytes_reserved = used;
		out->peak_bytes_reserved = used;
	} else {
		out->bytes_reserved = atomic_load(&p->a_reserved);
		out->peak_bytes_reserved = atomic_load(&p->a_peak_reserved);
	}
	if (p->type != POOL_SEGMENTS)
		return;
	out->segmented = true;
	out->keep_bytes = p->keep;
	out->segments = atomic_load(&p->a_nsegs);
	out->segments_pinned = atomic_load(&p->a_segs_pinned);
	out->segments_released = atomic_load(&p->a_segs_released);
	out->pinned_bytes = atomic_load(&p->a_pinned);
	out->released_bytes = atomic_load(&p->a_released);
	out->repinned_bytes = atomic_load(&p->a_repinned);
	out->pin_ns = atomic_load(&p->a_pin_ns);
	out->repin_ns = atomic_load(&p->a_repin_ns);
}

void ts_memory_pool_stats(const struct ts_memory *mem, size_t i, struct ts_pool_stats *out)
{
	pool_stats(mem->pools[i], out);
}

void ts_space_pool_stats(const struct ts_space *sp, struct ts_pool_stats *out)
{
	pool_stats(sp->pool, out);
}

uint64_t ts_memory_generation(const struct ts_memory *mem)
{
	return atomic_load(&((struct ts_memory *)mem)->generation);
}
