/*
 * test_space.c - memory spaces over real (sim and cpu) devices: exact
 * accounting, peaks, refusal as a value with its numbers, pinned pool growth
 * in segments without rounding, idle segments given back above the pool's
 * keep (and to make room) with what pinning again costs counted, preallocated
 * segments kept, shared host pools, and a randomized sequence
 * whose every space's bytes_in_use equals the sum of its live blocks; host
 * memory shareable as (descriptor, offset, length), device memory not.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "device/topology.h"
#include "memory/buffer.h"
#include "memory/space.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;
static struct ts_memory *mem;

static void setup_keep(uint64_t sim_mem, uint64_t pinned, uint64_t unpinned, uint64_t seg,
                       uint64_t keep, bool preallocate)
{
	struct ts_unit_sim_config sim = {.devices = 2, .device_memory = sim_mem,
	                                 .device_fraction = 0.75, .pinned = pinned,
	                                 .unpinned = unpinned, .segment = seg, .pinned_keep = keep,
	                                 .preallocate = preallocate, .host = "testhost"};

	ts_unit_sim_new(&sim, &set, &mem, NULL);
}

/* Keeps every idle pinned segment (the keep is the whole limit). */
static void setup_with(uint64_t sim_mem, uint64_t pinned, uint64_t unpinned, uint64_t seg)
{
	setup_keep(sim_mem, pinned, unpinned, seg, pinned, false);
}

static void setup(void)
{
	setup_with(64ull << 20, 32ull << 20, 48ull << 20, 4ull << 20);
}

/* 4 MiB segments, 32 MiB of pinned memory, 4 MiB of idle segments kept. */
static void setup_small_keep(void)
{
	setup_keep(64ull << 20, 32ull << 20, 48ull << 20, 4ull << 20, 4ull << 20, false);
}

static void setup_preallocated(void)
{
	setup_keep(64ull << 20, 32ull << 20, 48ull << 20, 4ull << 20, 0, true);
}

static void teardown(void)
{
	ts_unit_sim_free(set, mem, NULL);
	mem = NULL;
	set = NULL;
}

START_TEST(test_spaces_per_device_and_kind)
{
	ck_assert_uint_eq(ts_memory_space_count(mem), 9);    /* sim:0, sim:1, cpu:0 x 3 */
	for (size_t i = 0; i < ts_memory_space_count(mem); i++) {
		struct ts_space *sp = ts_memory_space_at(mem, i);

		ck_assert_int_eq(ts_space_kind(sp), (enum ts_memory_kind)(i % 3));
	}
	ck_assert_str_eq(ts_space_name(ts_memory_find(mem, "sim:1", TS_MEM_DEVICE)), "sim:1/device");
	ck_assert_ptr_null(ts_memory_find(mem, "sim:7", TS_MEM_DEVICE));
}
END_TEST

START_TEST(test_exact_accounting_and_peak)
{
	struct ts_space *sp = ts_memory_find(mem, "sim:0", TS_MEM_DEVICE);
	struct ts_space_stats s;
	struct ts_error err;
	void *a, *b;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_alloc(sp, 1000, &a, &err), TS_OK);
	ck_assert_int_eq(ts_space_alloc(sp, 3, &b, &err), TS_OK);
	ts_space_stats(sp, &s);
	ck_assert_uint_eq(s.bytes_in_use, 1003);        /* exact, not rounded */
	ck_assert_uint_eq(s.peak_bytes_in_use, 1003);
	ck_assert_uint_eq(s.num_allocs, 2);
	ck_assert_uint_eq(s.largest_alloc_size, 1000);
	ck_assert_uint_eq(s.bytes_limit, 64ull << 20);
	ck_assert_uint_eq(s.live_allocs, 2);
	memset(a, 0xab, 1000);      /* sim device memory is host memory */
	ts_space_release(sp, a, 1000);
	ts_space_stats(sp, &s);
	ck_assert_uint_eq(s.bytes_in_use, 3);
	ck_assert_uint_eq(s.peak_bytes_in_use, 1003);
	ts_memory_reset_peaks(mem);
	ts_space_stats(sp, &s);
	ck_assert_uint_eq(s.peak_bytes_in_use, 3);
	ck_assert_uint_eq(s.num_allocs, 2);
	ts_space_release(sp, b, 3);
	/* the other device is untouched */
	ts_space_stats(ts_memory_find(mem, "sim:1", TS_MEM_DEVICE), &s);
	ck_assert_uint_eq(s.bytes_in_use, 0);
	ck_assert_uint_eq(s.num_allocs, 0);
}
END_TEST

START_TEST(test_refusal_is_a_value)
{
	struct ts_space *sp = ts_memory_find(mem, "sim:0", TS_MEM_DEVICE);
	struct ts_space_stats before, after;
	struct ts_error err;
	void *a, *p = NULL;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_alloc(sp, 40ull << 20, &a, &err), TS_OK);
	ts_space_stats(sp, &before);
	ck_assert_int_eq(ts_space_alloc(sp, 40ull << 20, &p, &err), TS_RESOURCE_EXHAUSTED);
	ck_assert_ptr_null(p);
	ck_assert_str_eq(err.reason, "OUT_OF_MEMORY");
	ck_assert_ptr_nonnull(strstr(err.message, "sim:0/device"));
	ck_assert_ptr_nonnull(strstr(err.message, "40.00 MiB"));
	ck_assert_ptr_nonnull(strstr(err.message, "64.00 MiB"));
	ck_assert_int_eq(err.nmeta, 5);
	ck_assert_str_eq(err.meta[0].key, "space");
	ck_assert_str_eq(err.meta[1].key, "requested_bytes");
	ck_assert_str_eq(err.meta[1].value, "41943040");
	ck_assert_str_eq(err.meta[2].key, "free_bytes");
	ck_assert_str_eq(err.meta[2].value, "25165824");
	ck_assert_str_eq(err.meta[4].key, "limit_bytes");
	ts_space_stats(sp, &after);
	/* nothing changes but the count of refusals */
	ck_assert_uint_eq(after.refusals, before.refusals + 1);
	after.refusals = before.refusals;
	ck_assert_mem_eq(&before, &after, sizeof before);
	ck_assert_int_eq(ts_space_check_fit(sp, 40ull << 20, &err), TS_RESOURCE_EXHAUSTED);
	ts_space_stats(sp, &after);
	ck_assert_uint_eq(after.refusals, before.refusals + 2);
	ck_assert(!ts_space_would_fit(sp, 40ull << 20));
	ck_assert(ts_space_would_fit(sp, 20ull << 20));
	ts_space_release(sp, a, 40ull << 20);
	ck_assert(ts_space_would_fit(sp, 40ull << 20));
}
END_TEST

START_TEST(test_fragmentation_reported)
{
	struct ts_space *sp = ts_memory_find(mem, "sim:1", TS_MEM_DEVICE);
	struct ts_space_stats s;
	struct ts_error err;
	void *blk[16];

	ts_error_clear(&err);
	for (int i = 0; i < 16; i++)
		ck_assert_int_eq(ts_space_alloc(sp, 4ull << 20, &blk[i], &err), TS_OK);
	for (int i = 0; i < 16; i += 2)
		ts_space_release(sp, blk[i], 4ull << 20);
	ts_space_stats(sp, &s);
	ck_assert_uint_eq(s.bytes_free, 32ull << 20);
	ck_assert_uint_eq(s.largest_free_block_bytes, 4ull << 20);
	ck_assert_int_eq(ts_space_alloc(sp, 8ull << 20, &blk[0], &err), TS_RESOURCE_EXHAUSTED);
	for (int i = 1; i < 16; i += 2)
		ts_space_release(sp, blk[i], 4ull << 20);
	ts_space_stats(sp, &s);
	ck_assert_uint_eq(s.largest_free_block_bytes, 64ull << 20);
}
END_TEST

START_TEST(test_pinned_pool_grows_in_segments)
{
	struct ts_space *p0 = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
	struct ts_space *p1 = ts_memory_find(mem, "sim:1", TS_MEM_PINNED_HOST);
	struct ts_space_stats s;
	struct ts_error err;
	void *a, *b, *c;

	ts_error_clear(&err);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 0);           /* nothing pinned until asked */
	ck_assert_int_eq(ts_space_alloc(p0, 1000, &a, &err), TS_OK);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 4ull << 20);  /* one segment */
	ck_assert_int_eq(ts_space_alloc(p1, 10ull << 20, &b, &err), TS_OK);
	ts_space_stats(p1, &s);
	ck_assert_uint_eq(s.bytes_in_use, 10ull << 20);
	ck_assert_uint_eq(s.pool_bytes_in_use, (10ull << 20) + 1024);   /* shared pool */
	ck_assert_uint_eq(s.bytes_reserved, (4ull << 20) + (10ull << 20)); /* exact, no 2^k */
	ts_space_release(p1, b, 10ull << 20);
	/* reuse: the freed block serves the next request without pinning more */
	ck_assert_int_eq(ts_space_alloc(p1, 9ull << 20, &c, &err), TS_OK);
	ts_space_stats(p1, &s);
	ck_assert_uint_eq(s.bytes_reserved, 14ull << 20);
	ck_assert_uint_eq(s.peak_bytes_reserved, 14ull << 20);
	ts_space_release(p1, c, 9ull << 20);
	ts_space_release(p0, a, 1000);
	/* limit: 32 MiB in all */
	ck_assert_int_eq(ts_space_alloc(p0, 33ull << 20, &a, &err), TS_RESOURCE_EXHAUSTED);
	ck_assert_ptr_nonnull(strstr(err.message, "sim:0/pinned_host"));
}
END_TEST

static void pinned_pool(const struct ts_space *sp, struct ts_pool_stats *ps)
{
	ts_space_pool_stats(sp, ps);
	ck_assert(ps->segmented);
}

/* A segment a release leaves idle goes back when the idle ones would pass
 * the keep with it, and stays below it; pinning again is counted. */
START_TEST(test_idle_segments_above_keep_go_back)
{
	struct ts_space *p0 = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
	struct ts_space *p1 = ts_memory_find(mem, "sim:1", TS_MEM_PINNED_HOST);
	struct ts_pool_stats ps;
	struct ts_space_stats s;
	struct ts_error err;
	void *x1, *x2, *y, *z;

	ts_error_clear(&err);
	pinned_pool(p0, &ps);
	ck_assert_uint_eq(ps.keep_bytes, 4ull << 20);
	ck_assert_uint_eq(ps.segments, 0);
	ck_assert_int_eq(ts_space_alloc(p0, 10ull << 20, &x1, &err), TS_OK);  /* a 10 MiB segment */
	ck_assert_int_eq(ts_space_alloc(p1, 12ull << 20, &x2, &err), TS_OK);  /* a 12 MiB one */
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 22ull << 20);

	/* idle: 10 MiB > the keep of 4 MiB, so it goes back */
	ts_space_release(p0, x1, 10ull << 20);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 12ull << 20);
	ck_assert_uint_eq(s.peak_bytes_reserved, 22ull << 20);
	pinned_pool(p0, &ps);
	ck_assert_uint_eq(ps.segments, 1);
	ck_assert_uint_eq(ps.segments_released, 1);
	ck_assert_uint_eq(ps.released_bytes, 10ull << 20);
	ck_assert_uint_eq(ps.repinned_bytes, 0);

	/* a segment pinned again below the 22 MiB once held is a re-pin */
	ck_assert_int_eq(ts_space_alloc(p0, 1ull << 20, &y, &err), TS_OK);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 16ull << 20);
	pinned_pool(p0, &ps);
	ck_assert_uint_eq(ps.segments_pinned, 3);
	ck_assert_uint_eq(ps.pinned_bytes, 26ull << 20);
	ck_assert_uint_eq(ps.repinned_bytes, 4ull << 20);
	ck_assert_uint_le(ps.repin_ns, ps.pin_ns);

	/* idle, 4 MiB: within the keep, so it stays and serves the next one */
	ts_space_release(p0, y, 1ull << 20);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 16ull << 20);
	ck_assert_int_eq(ts_space_alloc(p1, 3ull << 20, &z, &err), TS_OK);
	pinned_pool(p0, &ps);
	ck_assert_uint_eq(ps.segments_pinned, 3);                 /* nothing pinned */
	ts_space_release(p1, z, 3ull << 20);

	/* the 12 MiB one idle too: 4 + 12 > 4, it goes, the 4 MiB one stays */
	ts_space_release(p1, x2, 12ull << 20);
	ts_space_stats(p1, &s);
	ck_assert_uint_eq(s.bytes_reserved, 4ull << 20);
	ck_assert_uint_eq(s.bytes_in_use, 0);
	pinned_pool(p1, &ps);
	ck_assert_uint_eq(ps.segments, 1);
	ck_assert_uint_eq(ps.segments_released, 2);
	ck_assert_uint_eq(ps.released_bytes, 22ull << 20);
	ck_assert_uint_eq(ps.bytes_reserved, ps.pinned_bytes - ps.released_bytes);
}
END_TEST

/* Idle segments too small for a request go back to make room for one that
 * fits, instead of a refusal that reads like fragmentation. */
START_TEST(test_idle_segments_make_room)
{
	struct ts_space *p0 = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
	struct ts_pool_stats ps;
	struct ts_space_stats s;
	struct ts_error err;
	void *blk[7], *big, *keep;

	ts_error_clear(&err);
	for (int i = 0; i < 7; i++)                   /* seven 4 MiB segments: 28 of 32 MiB */
		ck_assert_int_eq(ts_space_alloc(p0, 4ull << 20, &blk[i], &err), TS_OK);
	for (int i = 1; i < 7; i++)                   /* all kept: the keep is the limit */
		ts_space_release(p0, blk[i], 4ull << 20);
	keep = blk[0];
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 28ull << 20);
	/* 20 MiB: no segment holds it, 4 MiB left to pin; four idle ones go */
	ck_assert_int_eq(ts_space_alloc(p0, 20ull << 20, &big, &err), TS_OK);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 32ull << 20);
	pinned_pool(p0, &ps);
	ck_assert_uint_eq(ps.segments_released, 4);
	ck_assert_uint_eq(ps.segments, 4);            /* blk[0]'s, two idle, the new one */
	ts_space_release(p0, big, 20ull << 20);
	/* past what idle segments can free: refused, and nothing given back */
	ck_assert_int_eq(ts_space_alloc(p0, 30ull << 20, &big, &err), TS_RESOURCE_EXHAUSTED);
	pinned_pool(p0, &ps);
	ck_assert_uint_eq(ps.segments_released, 4);
	ts_space_release(p0, keep, 4ull << 20);
}
END_TEST

/* Preallocated pinned memory stays, whatever the keep. */
START_TEST(test_preallocated_segments_stay)
{
	struct ts_space *p0 = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
	struct ts_pool_stats ps;
	struct ts_space_stats s;
	struct ts_error err;
	void *a;

	ts_error_clear(&err);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 32ull << 20);
	ck_assert_int_eq(ts_space_alloc(p0, 5ull << 20, &a, &err), TS_OK);
	ts_space_release(p0, a, 5ull << 20);
	ts_space_stats(p0, &s);
	ck_assert_uint_eq(s.bytes_reserved, 32ull << 20);
	pinned_pool(p0, &ps);
	ck_assert_uint_eq(ps.keep_bytes, 0);
	ck_assert_uint_eq(ps.segments, 1);
	ck_assert_uint_eq(ps.segments_pinned, 1);
	ck_assert_uint_eq(ps.segments_released, 0);
}
END_TEST

/* A configuration that names no keep gets the default one (the larger of a
 * segment and an eighth of the limit), as every other field left at 0 gets
 * its default; TS_PINNED_KEEP_NONE keeps none. */
START_TEST(test_keep_left_unnamed_is_the_default)
{
	static const struct {
		uint64_t keep, seg, want;
	} cases[] = {
		{0, 4ull << 20, 8ull << 20},           /* limit/8 = 8 MiB > 4 MiB */
		{0, 16ull << 20, 16ull << 20},         /* one segment > limit/8 */
		{TS_PINNED_KEEP_NONE, 4ull << 20, 0},
		{12ull << 20, 4ull << 20, 12ull << 20},
	};
	struct ts_device_config dc = {.sim_devices = 1, .sim_device_memory = 64ull << 20,
	                              .host = "testhost"};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct ts_memory_config mc = {.device_memory_fraction = 0.5,
		                              .pinned_host_limit = 64ull << 20,
		                              .unpinned_host_limit = 16ull << 20,
		                              .pinned_segment = cases[i].seg,
		                              .pinned_host_keep = cases[i].keep};
		struct ts_device_set *ds;
		struct ts_memory *m;
		struct ts_pool_stats ps;
		struct ts_error err;

		ts_error_clear(&err);
		TS_UNIT_OK(err, ts_device_set_new(&dc, &ds, &err));
		TS_UNIT_OK(err, ts_memory_new(ds, &mc, &m, &err));
		pinned_pool(ts_memory_find(m, "sim:0", TS_MEM_PINNED_HOST), &ps);
		ck_assert_msg(ps.keep_bytes == cases[i].want, "case %zu: keep %llu, want %llu", i,
		              (unsigned long long)ps.keep_bytes, (unsigned long long)cases[i].want);
		ts_memory_free(m);
		ts_device_set_free(ds);
	}
}
END_TEST

START_TEST(test_pageable_limit_shared_with_cpu_device)
{
	struct ts_space *u = ts_memory_find(mem, "sim:0", TS_MEM_UNPINNED_HOST);
	struct ts_space *cpu = ts_memory_find(mem, "cpu:0", TS_MEM_DEVICE);
	struct ts_space_stats s;
	struct ts_error err;
	void *a, *b;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_alloc(u, 30ull << 20, &a, &err), TS_OK);
	ck_assert_int_eq(ts_space_alloc(cpu, 30ull << 20, &b, &err), TS_RESOURCE_EXHAUSTED);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_alloc(cpu, 18ull << 20, &b, &err), TS_OK);
	ts_space_stats(cpu, &s);
	ck_assert_uint_eq(s.bytes_in_use, 18ull << 20);
	ck_assert_uint_eq(s.bytes_free, 0);
	ts_space_release(cpu, b, 18ull << 20);
	ts_space_release(u, a, 30ull << 20);
	ts_space_stats(u, &s);
	ck_assert_uint_eq(s.pool_bytes_in_use, 0);
}
END_TEST

/* Node-wide host pools are listed once, device pools once per device; a
 * pool's in-use bytes are the sum over every space drawing from it. */
START_TEST(test_pools_listed_once)
{
	struct ts_space *p0 = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
	struct ts_space *p1 = ts_memory_find(mem, "sim:1", TS_MEM_PINNED_HOST);
	struct ts_error err;
	size_t n = ts_memory_pool_count(mem), host = 0, device = 0;
	void *a, *b;

	ts_error_clear(&err);
	ck_assert_uint_eq(n, 4);    /* pinned_host, unpinned_host, sim:0, sim:1 */
	ck_assert_int_eq(ts_space_alloc(p0, 1ull << 20, &a, &err), TS_OK);
	ck_assert_int_eq(ts_space_alloc(p1, 2ull << 20, &b, &err), TS_OK);
	ck_assert_str_eq(ts_space_pool_name(p0), "host/pinned_host");
	ck_assert_str_eq(ts_space_pool_name(p1), "host/pinned_host");
	ck_assert_str_eq(ts_space_pool_name(ts_memory_find(mem, "cpu:0", TS_MEM_DEVICE)),
	                 "host/unpinned_host");
	for (size_t i = 0; i < n; i++) {
		struct ts_pool_stats ps;

		ts_memory_pool_stats(mem, i, &ps);
		if (!ps.device) {
			host++;
			ck_assert_int_ne(ps.kind, TS_MEM_DEVICE);
		} else {
			device++;
			ck_assert_int_eq(ps.kind, TS_MEM_DEVICE);
			ck_assert_uint_eq(ps.limit, 64ull << 20);
			ck_assert_uint_eq(ps.bytes_reserved, 64ull << 20);   /* the region, at start */
			ck_assert_uint_eq(ps.bytes_in_use, 0);
		}
		if (strcmp(ps.name, "host/pinned_host") == 0) {
			ck_assert_uint_eq(ps.limit, 32ull << 20);
			ck_assert_uint_eq(ps.bytes_in_use, 3ull << 20);
		}
	}
	ck_assert_uint_eq(host, 2);
	ck_assert_uint_eq(device, 2);
	ts_space_release(p0, a, 1ull << 20);
	ts_space_release(p1, b, 2ull << 20);
}
END_TEST

/* A GPU pool leaves headroom for cuBLAS and the runtime, whatever the fraction. */
START_TEST(test_device_pool_leaves_headroom)
{
	const uint64_t gib = 1ull << 30, h200 = 140ull * gib;

	ck_assert_uint_eq(ts_device_pool_size(h200, 0.75), (uint64_t)(0.75 * (double)h200));
	ck_assert_uint_eq(ts_device_pool_size(h200, 1.0), h200 - TS_DEVICE_HEADROOM);
	ck_assert_uint_eq(ts_device_pool_size(h200, 0.999), h200 - TS_DEVICE_HEADROOM);
	ck_assert_uint_eq(ts_device_pool_size(gib, 1.0), gib - gib / 4);
	ck_assert_uint_eq(ts_device_pool_size(gib, 0.5), gib / 2);
	ck_assert_uint_eq(ts_device_pool_size(0, 1.0), 0);
}
END_TEST

START_TEST(test_zero_size)
{
	struct ts_space *sp = ts_memory_find(mem, "sim:0", TS_MEM_DEVICE);
	struct ts_space_stats s;
	struct ts_error err;
	void *a, *b;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_alloc(sp, 0, &a, &err), TS_OK);
	ck_assert_int_eq(ts_space_alloc(sp, 0, &b, &err), TS_OK);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_ne(a, b);
	ts_space_stats(sp, &s);
	ck_assert_uint_eq(s.bytes_in_use, 0);
	ck_assert_uint_eq(s.live_allocs, 2);
	ts_space_release(sp, a, 0);
	ts_space_release(sp, b, 0);
	ts_space_stats(sp, &s);
	ck_assert_uint_eq(s.live_allocs, 0);
	ck_assert_uint_eq(s.pool_bytes_in_use, 0);
}
END_TEST

START_TEST(test_randomized_exact_stats)
{
	enum { LIVE = 256 };
	struct {
		struct ts_space *sp;
		void *p;
		uint64_t n;
	} live[LIVE];
	size_t nspaces = ts_memory_space_count(mem);
	struct ts_error err;
	unsigned seed = 12345;

	memset(live, 0, sizeof live);
	for (int step = 0; step < 20000; step++) {
		int slot = rand_r(&seed) % LIVE;

		if (live[slot].sp) {
			ts_space_release(live[slot].sp, live[slot].p, live[slot].n);
			live[slot].sp = NULL;
		} else {
			struct ts_space *sp = ts_memory_space_at(mem, (size_t)rand_r(&seed) % nspaces);
			uint64_t n = (uint64_t)(rand_r(&seed) % 3 == 0 ? rand_r(&seed) % (2 << 20)
			                                               : rand_r(&seed) % 5000);

			ts_error_clear(&err);
			if (ts_space_alloc(sp, n, &live[slot].p, &err) == TS_OK) {
				live[slot].sp = sp;
				live[slot].n = n;
			} else {
				ck_assert_int_eq(err.status, TS_RESOURCE_EXHAUSTED);
			}
		}
		if (step % 97 == 0) {
			for (size_t i = 0; i < nspaces; i++) {
				struct ts_space *sp = ts_memory_space_at(mem, i);
				struct ts_space_stats s;
				uint64_t sum = 0, count = 0;

				for (int j = 0; j < LIVE; j++)
					if (live[j].sp == sp) {
						sum += live[j].n;
						count++;
					}
				ts_space_stats(sp, &s);
				ck_assert_uint_eq(s.bytes_in_use, sum);
				ck_assert_uint_eq(s.live_allocs, count);
				ck_assert_uint_le(s.bytes_in_use, s.peak_bytes_in_use);
				ck_assert_uint_le(s.pool_bytes_in_use, s.bytes_limit);
			}
		}
	}
	for (int j = 0; j < LIVE; j++)
		if (live[j].sp)
			ts_space_release(live[j].sp, live[j].p, live[j].n);
	for (size_t i = 0; i < nspaces; i++) {
		struct ts_space_stats s;

		ts_space_stats(ts_memory_space_at(mem, i), &s);
		ck_assert_uint_eq(s.bytes_in_use, 0);
		ck_assert_uint_eq(s.pool_bytes_in_use, 0);
	}
}
END_TEST

/* Maps [off, off + len) of fd read-only and checks it holds want's bytes. */
static void check_mapped(int fd, uint64_t off, const unsigned char *want, size_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t base = off / (uint64_t)page * (uint64_t)page;
	unsigned char *m = mmap(NULL, len + (off - base), PROT_READ, MAP_SHARED, fd, (off_t)base);

	ck_assert_ptr_ne(m, MAP_FAILED);
	ck_assert_int_eq(memcmp(m + (off - base), want, len), 0);
	munmap(m, len + (off - base));
}

/* fd reopened read-write through /proc/self/fd, as a lessee may. */
static int reopen_rw(int fd)
{
	char path[64];

	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	return open(path, O_RDWR | O_CLOEXEC);
}

START_TEST(test_host_memory_is_shareable)
{
	const enum ts_memory_kind kinds[] = {TS_MEM_PINNED_HOST, TS_MEM_UNPINNED_HOST};

	for (size_t k = 0; k < 2; k++) {
		struct ts_space *sp = ts_memory_find(mem, "cpu:0", kinds[k]);
		struct ts_space_stats st;
		struct ts_buffer *a, *b;
		struct ts_error err;
		uint64_t off_a = 1, off_b = 1;
		int fa, fb, fw;
		void *w;

		ts_error_clear(&err);
		ck_assert_int_eq(ts_buffer_new(sp, 5000, &a, &err), TS_OK);
		ck_assert_int_eq(ts_buffer_new(sp, 3000, &b, &err), TS_OK);
		ts_space_stats(sp, &st);
		ck_assert_uint_eq(st.bytes_in_use, 8000);        /* exact, as before */
		memset(ts_buffer_data(a), 0xa5, 5000);
		memset(ts_buffer_data(b), 0x5a, 3000);
		fa = ts_buffer_share(a, &off_a);
		fb = ts_buffer_share(b, &off_b);
		ck_assert_int_ge(fa, 0);
		ck_assert_int_ge(fb, 0);
		if (kinds[k] == TS_MEM_PINNED_HOST)
			ck_assert_uint_ne(off_a, off_b);             /* carved from one segment */
		else
			ck_assert_uint_eq(off_b, 0);                 /* a mapping of its own */
		check_mapped(fa, off_a, ts_buffer_data(a), 5000);
		check_mapped(fb, off_b, ts_buffer_data(b), 3000);
		/* a read-only descriptor cannot be mapped for writing, nor resized */
		w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fa, 0);
		ck_assert_ptr_eq(w, MAP_FAILED);
		ck_assert_int_ne(ftruncate(fa, 0), 0);
		/* reopened read-write (as any client may: /proc/self/fd), it still
		 * cannot write: the memfd is sealed against every writer but the
		 * daemon's own mapping, which still writes */
		fw = reopen_rw(fa);
		ck_assert_int_ge(fw, 0);
		ck_assert_ptr_eq(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fw, 0),
		                 MAP_FAILED);
		ck_assert_int_eq(errno, EPERM);
		ck_assert_int_lt(pwrite(fw, "xyz", 3, (off_t)off_a), 0);
		ck_assert_int_eq(errno, EPERM);
		w = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fw, 0);
		ck_assert_ptr_ne(w, MAP_FAILED);
		ck_assert_int_ne(mprotect(w, 4096, PROT_READ | PROT_WRITE), 0);
		munmap(w, 4096);
		ck_assert_int_ne(ftruncate(fw, 0), 0);
		memcpy(ts_buffer_data(a), "xyz", 3);
		check_mapped(fa, off_a, ts_buffer_data(a), 5000);
		close(fa);
		close(fb);
		close(fw);
		ts_buffer_unref(a);
		ts_buffer_unref(b);
		ts_space_stats(sp, &st);
		ck_assert_uint_eq(st.bytes_in_use, 0);
	}
}
END_TEST

START_TEST(test_sim_device_memory_is_shareable)
{
	struct ts_space *sp = ts_memory_find(mem, "sim:0", TS_MEM_DEVICE);
	struct ts_buffer *a, *b;
	struct ts_error err;
	uint64_t off = 0, off_b = 0;
	void *p;
	int fd;

	ts_error_clear(&err);
	/* a sim device's memory is a memfd standing for a GPU's: a lease hands
	 * it by descriptor, as a GPU's by CUDA IPC handle */
	ck_assert_int_eq(ts_buffer_new(sp, 4096, &a, &err), TS_OK);
	ck_assert_int_eq(ts_buffer_new(sp, 3000, &b, &err), TS_OK);
	memset(ts_buffer_data(b), 0x3c, 3000);
	fd = ts_buffer_share(b, &off_b);
	ck_assert_int_ge(fd, 0);
	ck_assert_uint_eq(off_b, (uintptr_t)ts_buffer_data(b) - (uintptr_t)ts_buffer_data(a));
	check_mapped(fd, off_b, ts_buffer_data(b), 3000);
	ck_assert_int_ne(ftruncate(fd, 0), 0);
	close(fd);
	ts_buffer_unref(a);
	ts_buffer_unref(b);
	/* nor is an address outside every mapping, or past one's end */
	ck_assert_int_eq(ts_host_mem_share(ts_space_device(sp), &off, 1, &off), -ENOENT);
	sp = ts_memory_find(mem, "cpu:0", TS_MEM_UNPINNED_HOST);
	ck_assert_int_eq(ts_space_alloc(sp, 4096, &p, &err), TS_OK);
	ck_assert_int_eq(ts_host_mem_share(ts_space_device(sp), p, 8192, &off), -ENOENT);
	fd = ts_host_mem_share(ts_space_device(sp), (char *)p + 4095, 1, &off);
	ck_assert_int_ge(fd, 0);
	ck_assert_uint_eq(off, 4095);
	close(fd);
	ts_space_release(sp, p, 4096);
	/* freed: no longer shareable */
	ck_assert_int_eq(ts_host_mem_share(ts_space_device(sp), p, 1, &off), -ENOENT);
}
END_TEST

/* The pool chunk of a buffer: a device pool's one region, a pinned segment;
 * none for pageable memory. */
START_TEST(test_buffers_name_their_pool_chunk)
{
	struct ts_space *dev = ts_memory_find(mem, "sim:1", TS_MEM_DEVICE);
	struct ts_space *pin = ts_memory_find(mem, "cpu:0", TS_MEM_PINNED_HOST);
	struct ts_space *page = ts_memory_find(mem, "cpu:0", TS_MEM_UNPINNED_HOST);
	struct ts_buffer *a, *b, *c, *u;
	struct ts_error err;
	void *base_a, *base_b, *base_c;
	uint64_t size_a, size_b, size_c, off_a, off_b, off_c;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_buffer_new(dev, 10000, &a, &err), TS_OK);
	ck_assert_int_eq(ts_buffer_new(dev, 777, &b, &err), TS_OK);
	ck_assert_int_eq(ts_buffer_new(pin, 5000, &c, &err), TS_OK);
	ck_assert_int_eq(ts_buffer_new(page, 5000, &u, &err), TS_OK);
	ck_assert(ts_buffer_chunk(a, &base_a, &size_a, &off_a));
	ck_assert(ts_buffer_chunk(b, &base_b, &size_b, &off_b));
	ck_assert_ptr_eq(base_a, base_b);                /* one region per device */
	ck_assert_uint_eq(size_a, 64ull << 20);
	ck_assert_uint_eq(size_b, size_a);
	ck_assert_ptr_eq((char *)base_a + off_a, ts_buffer_data(a));
	ck_assert_ptr_eq((char *)base_b + off_b, ts_buffer_data(b));
	ck_assert_uint_ne(off_a, off_b);
	ck_assert(ts_buffer_chunk(c, &base_c, &size_c, &off_c));
	ck_assert_uint_eq(size_c, 4ull << 20);           /* a pinned segment */
	ck_assert_ptr_eq((char *)base_c + off_c, ts_buffer_data(c));
	ck_assert(!ts_buffer_chunk(u, &base_c, &size_c, &off_c));
	/* an address in no chunk of the space */
	ck_assert(!ts_space_chunk(dev, ts_buffer_data(c), &base_c, &size_c));
	ts_buffer_unref(a);
	ts_buffer_unref(b);
	ts_buffer_unref(c);
	ts_buffer_unref(u);
}
END_TEST

START_TEST(test_descriptors_are_budgeted)
{
	struct ts_space *sp = ts_memory_find(mem, "cpu:0", TS_MEM_UNPINNED_HOST);
	struct rlimit rl = {.rlim_cur = 64, .rlim_max = 64};
	void *p[100];
	struct ts_error err;
	uint64_t off;
	int shared = 0, fd;

	/* this case runs in its own process (fork mode): the limit is its own */
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	ts_error_clear(&err);
	for (int i = 0; i < 100; i++) {
		ck_assert_msg(ts_space_alloc(sp, 4096, &p[i], &err) == TS_OK, "%s", err.message);
		fd = ts_host_mem_share(ts_space_device(sp), p[i], 4096, &off);
		if (fd >= 0) {
			shared++;
			close(fd);
		}
	}
	/* at most half the limit holds memfds (the pinned pool's none yet);
	 * the others are anonymous pages, allocated all the same */
	ck_assert_int_gt(shared, 0);
	ck_assert_int_le(shared, 32);
	for (int i = 0; i < 100; i++)
		ts_space_release(sp, p[i], 4096);
	ck_assert_int_eq(ts_space_alloc(sp, 4096, &p[0], &err), TS_OK);
	fd = ts_host_mem_share(ts_space_device(sp), p[0], 4096, &off);
	ck_assert_int_ge(fd, 0);                   /* freed ones gave theirs back */
	close(fd);
	ts_space_release(sp, p[0], 4096);
}
END_TEST

/* What a lease hands out: memory that holds one version only, never reused
 * while a client may keep it mapped: a pageable allocation itself, else a
 * copy in unpinned_host made once and freed with the version. */
START_TEST(test_leasable_memory_is_never_reused)
{
	struct ts_space *copies = ts_memory_find(mem, "cpu:0", TS_MEM_UNPINNED_HOST);
	const char *devs[] = {"cpu:0", "sim:0"};
	const enum ts_memory_kind kinds[] = {TS_MEM_PINNED_HOST, TS_MEM_DEVICE};
	struct ts_space_stats st;
	struct ts_buffer *a, *la, *again, *u, *lu, *c;
	struct ts_error err;
	uint64_t off = 1;
	unsigned char *m;
	int fd;

	ts_error_clear(&err);
	for (int k = 0; k < 2; k++) {
		struct ts_space *sp = ts_memory_find(mem, devs[k], kinds[k]);
		struct ts_space *cp = ts_memory_find(mem, devs[k], TS_MEM_UNPINNED_HOST);

		ck_assert_int_eq(ts_buffer_new(sp, 5000, &a, &err), TS_OK);
		memset(ts_buffer_data(a), 0xa5, 5000);
		ck_assert_int_eq(ts_buffer_leasable(a, cp, &la, &err), TS_OK);
		ck_assert_ptr_ne(la, a);                     /* carved: a copy */
		ck_assert_int_eq(ts_buffer_leasable(a, cp, &again, &err), TS_OK);
		ck_assert_ptr_eq(again, la);                 /* made once */
		ts_space_stats(cp, &st);
		ck_assert_uint_eq(st.bytes_in_use, 5000);
		fd = ts_buffer_share(la, &off);
		ck_assert_int_ge(fd, 0);
		ck_assert_uint_eq(off, 0);                   /* a file of its own */
		m = mmap(NULL, 5000, PROT_READ, MAP_SHARED, fd, 0);
		ck_assert_ptr_ne(m, MAP_FAILED);
		close(fd);
		ts_buffer_unref(a);                          /* the copy goes with it */
		ts_space_stats(cp, &st);
		ck_assert_uint_eq(st.bytes_in_use, 0);
		/* the memory is used again; the kept view does not change */
		ck_assert_int_eq(ts_buffer_new(sp, 5000, &c, &err), TS_OK);
		memset(ts_buffer_data(c), 0x11, 5000);
		ck_assert_int_eq(ts_buffer_new(copies, 5000, &u, &err), TS_OK);
		memset(ts_buffer_data(u), 0x22, 5000);
		for (int i = 0; i < 5000; i++)
			ck_assert_int_eq(m[i], 0xa5);
		munmap(m, 5000);
		ts_buffer_unref(c);
		ts_buffer_unref(u);
	}
	/* a pageable allocation is its own mapping: leased as it is */
	ck_assert_int_eq(ts_buffer_new(copies, 3000, &u, &err), TS_OK);
	ck_assert_int_eq(ts_buffer_leasable(u, copies, &lu, &err), TS_OK);
	ck_assert_ptr_eq(lu, u);
	ts_buffer_unref(u);
	ts_space_stats(copies, &st);
	ck_assert_uint_eq(st.bytes_in_use, 0);
}
END_TEST

/* ---- NUMA-local pinned pools ---------------------------------------------- */

/* --pinned-host-numa-split for the next numa_setup (NULL: none). */
static const char *numa_split;

/* Four sim devices placed on numa (NULL: unplaced) in the topology of xml
 * (NULL: this machine), and memory with a pinned budget of limit over it
 * (split by numa_split when set). */
static struct ts_topology *numa_setup(const char *xml, const int *numa, uint64_t limit)
{
	struct ts_device_config dcfg = {.sim_devices = 4, .sim_device_memory = 16ull << 20,
	                                .cuda = false, .host = "testhost"};
	struct ts_memory_config mcfg = {.device_memory_fraction = 0.75, .pinned_host_limit = limit,
	                                .unpinned_host_limit = 64ull << 20,
	                                .pinned_segment = 4ull << 20};
	struct ts_topology *t = NULL;
	struct ts_error err;
	const char *path = xml ? ts_unit_data(xml) : NULL;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_set_new(&dcfg, &set, &err) == TS_OK, "%s", err.message);
	ck_assert_msg(ts_topology_new(&(struct ts_topology_config){.xml_file = path,
	                                                           .sim_numa_nodes = numa,
	                                                           .sim_numa_count = numa ? 4 : 0},
	                              set, &t, &err) == TS_OK,
	              "%s", err.message);
	mcfg.topology = t;
	ck_assert_msg(ts_memory_parse_numa_split(numa_split, &mcfg, &err) == TS_OK, "%s",
	              err.message);
	ck_assert_msg(ts_memory_new(set, &mcfg, &mem, &err) == TS_OK, "%s", err.message);
	return t;
}

static void numa_teardown(struct ts_topology *t)
{
	ts_memory_free(mem);
	ts_topology_free(t);
	ts_device_set_free(set);
	mem = NULL;
	set = NULL;
}

static void pinned_pool_of(const char *dev, struct ts_pool_stats *out)
{
	struct ts_space *sp = ts_memory_find(mem, dev, TS_MEM_PINNED_HOST);

	ck_assert_ptr_nonnull(sp);
	ts_space_pool_stats(sp, out);
}

START_TEST(test_two_socket_pinned_pools_per_node)
{
	static const int numa[] = {0, 0, 0, 1};
	struct ts_topology *t = numa_setup("two_socket.xml", numa, 64ull << 20);
	struct ts_pool_stats ps, ps2;
	uint64_t sum_limit = 0, sum_used = 0, spaces_used = 0;
	size_t pinned_pools = 0;
	struct ts_error err;
	void *a, *b, *c;

	/* split by the devices' share: 3 of 4 on node 0 */
	pinned_pool_of("sim:0", &ps);
	ck_assert_str_eq(ps.name, "numa0/pinned_host");
	ck_assert_int_eq(ps.numa_node, 0);
	ck_assert_uint_eq(ps.limit, 48ull << 20);
	ck_assert(!ps.bound);                 /* a file: nothing is bound */
	pinned_pool_of("sim:3", &ps);
	ck_assert_str_eq(ps.name, "numa1/pinned_host");
	ck_assert_int_eq(ps.numa_node, 1);
	ck_assert_uint_eq(ps.limit, 16ull << 20);
	/* the host spans both nodes: the first node's pool */
	pinned_pool_of("cpu:0", &ps);
	ck_assert_str_eq(ps.name, "numa0/pinned_host");

	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_alloc(ts_memory_find(mem, "sim:3", TS_MEM_PINNED_HOST), 5 << 20,
	                                &a, &err),
	                 TS_OK);
	ck_assert_int_eq(ts_space_alloc(ts_memory_find(mem, "sim:1", TS_MEM_PINNED_HOST), 1 << 20,
	                                &b, &err),
	                 TS_OK);
	pinned_pool_of("sim:3", &ps);
	pinned_pool_of("sim:0", &ps2);
	ck_assert_uint_eq(ps.bytes_in_use, 5 << 20);
	ck_assert_uint_eq(ps2.bytes_in_use, 1 << 20);
	/* node 1's pool is full at 16 MiB, whatever node 0 has left */
	ck_assert_int_eq(ts_space_alloc(ts_memory_find(mem, "sim:2", TS_MEM_PINNED_HOST), 12 << 20,
	                                &c, &err),
	                 TS_OK);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_check_fit(ts_memory_find(mem, "sim:3", TS_MEM_PINNED_HOST),
	                                    12 << 20, &err),
	                 TS_RESOURCE_EXHAUSTED);
	/* the node-wide figures are the sums of the pools' */
	for (size_t i = 0; i < ts_memory_pool_count(mem); i++) {
		ts_memory_pool_stats(mem, i, &ps);
		if (ps.kind != TS_MEM_PINNED_HOST)
			continue;
		pinned_pools++;
		sum_limit += ps.limit;
		sum_used += ps.bytes_in_use;
	}
	for (size_t i = 0; i < ts_memory_space_count(mem); i++) {
		struct ts_space_stats ss;

		if (ts_space_kind(ts_memory_space_at(mem, i)) != TS_MEM_PINNED_HOST)
			continue;
		ts_space_stats(ts_memory_space_at(mem, i), &ss);
		spaces_used += ss.bytes_in_use;
	}
	ck_assert_uint_eq(pinned_pools, 2);
	ck_assert_uint_eq(sum_limit, 64ull << 20);
	ck_assert_uint_eq(sum_used, spaces_used);
	ck_assert_uint_eq(sum_used, 18u << 20);
	ts_space_release(ts_memory_find(mem, "sim:3", TS_MEM_PINNED_HOST), a, 5 << 20);
	ts_space_release(ts_memory_find(mem, "sim:1", TS_MEM_PINNED_HOST), b, 1 << 20);
	ts_space_release(ts_memory_find(mem, "sim:2", TS_MEM_PINNED_HOST), c, 12 << 20);
	numa_teardown(t);
}
END_TEST

/* --pinned-host-numa-split: the budget by the weights given (1:3 where the
 * devices' share would be 3:1), the pools still summing to it; bad lists
 * refused naming the item; a list that leaves out a node with accelerators
 * or names one without is refused by ts_memory_new. */
START_TEST(test_numa_split_by_weights)
{
	static const int numa[] = {0, 0, 0, 1};
	static const char *const bad[] = {"0", "0:", ":1", "0:0", "0:-1", "0:1,", "0:1,0:2",
	                                  "x:1", "-1:1", "0:1;1:2", "0:inf", "0:nan", " 0:1"};
	struct ts_memory_config cfg = {0};
	struct ts_topology *t;
	struct ts_pool_stats ps;
	struct ts_error err;

	numa_split = "0:1,1:3";
	t = numa_setup("two_socket.xml", numa, 64ull << 20);
	numa_split = NULL;
	pinned_pool_of("sim:0", &ps);
	ck_assert_str_eq(ps.name, "numa0/pinned_host");
	ck_assert_uint_eq(ps.limit, 16ull << 20);
	pinned_pool_of("sim:3", &ps);
	ck_assert_str_eq(ps.name, "numa1/pinned_host");
	ck_assert_uint_eq(ps.limit, 48ull << 20);
	numa_teardown(t);

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ts_error_clear(&err);
		ck_assert_msg(ts_memory_parse_numa_split(bad[i], &cfg, &err) == TS_INVALID_ARGUMENT,
		              "'%s' accepted", bad[i]);
		ck_assert_str_eq(err.reason, "NUMA_SPLIT");
		ck_assert_msg(strstr(err.message, "--pinned-host-numa-split"), "%s", err.message);
	}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_memory_parse_numa_split("1:2.5,0:0.5", &cfg, &err), TS_OK);
	ck_assert_uint_eq(cfg.numa_split_count, 2);
	ck_assert_int_eq(cfg.numa_split[0].node, 1);
	ck_assert(cfg.numa_split[0].weight == 2.5);

	/* a node with accelerators left out, and a node without them named */
	{
		static const char *const refused[][2] = {
			{"0:1", "gives no weight to NUMA node 1"},
			{"0:1,1:1,2:1", "names NUMA node 2, which has no pinned_host pool"},
		};
		struct ts_device_config dcfg = {.sim_devices = 4, .sim_device_memory = 16ull << 20,
		                                .cuda = false, .host = "testhost"};
		struct ts_memory_config mcfg = {.device_memory_fraction = 0.75,
		                                .pinned_host_limit = 64ull << 20,
		                                .unpinned_host_limit = 64ull << 20,
		                                .pinned_segment = 4ull << 20};
		struct ts_memory *m = NULL;

		ts_error_clear(&err);
		ck_assert_int_eq(ts_device_set_new(&dcfg, &set, &err), TS_OK);
		ck_assert_int_eq(ts_topology_new(&(struct ts_topology_config){
		                                         .xml_file = ts_unit_data("two_socket.xml"),
		                                         .sim_numa_nodes = numa,
		                                         .sim_numa_count = 4},
		                                 set, &t, &err),
		                 TS_OK);
		mcfg.topology = t;
		for (size_t i = 0; i < 2; i++) {
			ts_error_clear(&err);
			ck_assert_int_eq(ts_memory_parse_numa_split(refused[i][0], &mcfg, &err), TS_OK);
			ck_assert_int_eq(ts_memory_new(set, &mcfg, &m, &err), TS_INVALID_ARGUMENT);
			ck_assert_ptr_null(m);
			ck_assert_str_eq(err.reason, "NUMA_SPLIT");
			ck_assert_msg(strstr(err.message, refused[i][1]), "%s", err.message);
		}
		ts_topology_free(t);
		ts_device_set_free(set);
		set = NULL;
	}
}
END_TEST

START_TEST(test_this_machine_binds_its_pool)
{
	struct ts_topology *t = numa_setup(NULL, NULL, 16ull << 20);
	struct ts_space *sp = ts_memory_find(mem, "sim:0", TS_MEM_PINNED_HOST);
	struct ts_pool_stats ps;
	struct ts_error err;
	size_t pinned_pools = 0;
	void *p;
	int node;

	for (size_t i = 0; i < ts_memory_pool_count(mem); i++) {
		ts_memory_pool_stats(mem, i, &ps);
		pinned_pools += ps.kind == TS_MEM_PINNED_HOST;
	}
	pinned_pool_of("sim:0", &ps);
	if (ts_topology_numa_count(t) > 1) {
		fprintf(stderr, "space: %zu NUMA nodes here, sim devices unplaced: one pool\n",
		        ts_topology_numa_count(t));
		ck_assert_int_eq(ps.numa_node, -1);
		numa_teardown(t);
		return;
	}
	/* one NUMA node: one pool, on it */
	ck_assert_uint_eq(pinned_pools, 1);
	ck_assert_str_eq(ps.name, "host/pinned_host");
	ck_assert_int_eq(ps.numa_node, ts_topology_numa_at(t, 0)->index);
	ck_assert_int_eq(ps.bound, ts_topology_can_bind(t));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_space_alloc(sp, 1 << 20, &p, &err), TS_OK);
	memset(p, 1, 1 << 20);
	node = ts_topology_node_of(t, p, 1 << 20);
	fprintf(stderr, "space: pinned pages on NUMA node %d, bound to %d (pool bound: %d)\n",
	        node, ts_topology_area_binding(t, p, 1 << 20), ps.bound);
	if (ps.bound) {
		ck_assert_int_eq(ts_topology_area_binding(t, p, 1 << 20), ps.numa_node);
		ck_assert_int_eq(node, ps.numa_node);
	}
	ts_space_release(sp, p, 1 << 20);
	numa_teardown(t);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("space");
	TCase *tc = tcase_create("accounting");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_spaces_per_device_and_kind);
	tcase_add_test(tc, test_exact_accounting_and_peak);
	tcase_add_test(tc, test_refusal_is_a_value);
	tcase_add_test(tc, test_fragmentation_reported);
	tcase_add_test(tc, test_pinned_pool_grows_in_segments);
	tcase_add_test(tc, test_pageable_limit_shared_with_cpu_device);
	tcase_add_test(tc, test_pools_listed_once);
	tcase_add_test(tc, test_zero_size);
	tcase_add_test(tc, test_device_pool_leaves_headroom);
	tcase_add_test(tc, test_randomized_exact_stats);
	tcase_add_test(tc, test_host_memory_is_shareable);
	tcase_add_test(tc, test_sim_device_memory_is_shareable);
	tcase_add_test(tc, test_buffers_name_their_pool_chunk);
	tcase_add_test(tc, test_descriptors_are_budgeted);
	tcase_add_test(tc, test_leasable_memory_is_never_reused);
	tcase_add_test(tc, test_idle_segments_make_room);
	suite_add_tcase(s, tc);

	tc = tcase_create("give_back");
	tcase_add_checked_fixture(tc, setup_small_keep, teardown);
	tcase_add_test(tc, test_idle_segments_above_keep_go_back);
	suite_add_tcase(s, tc);

	tc = tcase_create("preallocated");
	tcase_add_checked_fixture(tc, setup_preallocated, teardown);
	tcase_add_test(tc, test_preallocated_segments_stay);
	suite_add_tcase(s, tc);

	tc = tcase_create("numa");
	tcase_add_test(tc, test_two_socket_pinned_pools_per_node);
	tcase_add_test(tc, test_numa_split_by_weights);
	tcase_add_test(tc, test_this_machine_binds_its_pool);
	suite_add_tcase(s, tc);

	tc = tcase_create("keep_default");
	tcase_add_test(tc, test_keep_left_unnamed_is_the_default);
	suite_add_tcase(s, tc);
	return s;
}
