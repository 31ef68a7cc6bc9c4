/*
 * test_allocator.c - Check suite "allocator" for memory/allocator.
 *
 * Directed cases pin down rounding, the best-fit choice, coalescing (and its
 * absence across regions), failures that must change nothing, region removal
 * and exact stats. A randomized case replays fixed-seed operation sequences
 * over several regions against an independent shadow model (the live blocks
 * and the regions, from which the maximal free gaps follow), so it predicts
 * every address best fit must return; ts_alloc_check runs after every step.
 * Bookkeeping failures are injected through the allocator's ts__ test hook.
 */
#include "memory/allocator.h"
#include "tests/unit/unit.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Test hook defined in memory/allocator.c: fail the next n bookkeeping
 * allocations of a. */
void ts__alloc_fail_next(struct ts_alloc *a, unsigned n);

/*
 * ck_assert without Check's mark point on success (a pipe write per call in
 * forked mode), for the loops that assert millions of times.
 */
#define HOT_ASSERT(expr)                                             \
	do {                                                         \
		if (!(expr))                                         \
			ck_abort_msg("assertion '%s' failed", #expr); \
	} while (0)

#define HOT_CMP(x, op, y)                                                  \
	do {                                                               \
		uint64_t x_ = (uint64_t)(x), y_ = (uint64_t)(y);           \
		if (!(x_ op y_))                                           \
			ck_abort_msg("assertion '%s %s %s' failed: %llu vs %llu", \
				     #x, #op, #y, (unsigned long long)x_,  \
				     (unsigned long long)y_);              \
	} while (0)

#define U 256u                       /* alignment of most cases */
#define BASE ((uintptr_t)0x7f0000000000u)

static struct ts_alloc *new_alloc(uint64_t alignment)
{
	struct ts_alloc *a = ts_alloc_new(alignment);

	ck_assert_ptr_nonnull(a);
	ck_assert(ts_alloc_check(a));
	return a;
}

static struct ts_alloc_stats stats_of(const struct ts_alloc *a)
{
	struct ts_alloc_stats st;

	memset(&st, 0xa5, sizeof(st));
	ts_alloc_get_stats(a, &st);
	return st;
}

static void assert_stats_eq(const struct ts_alloc_stats *x,
			    const struct ts_alloc_stats *y)
{
	HOT_CMP(x->bytes_in_use, ==, y->bytes_in_use);
	HOT_CMP(x->bytes_reserved, ==, y->bytes_reserved);
	HOT_CMP(x->bytes_free, ==, y->bytes_free);
	HOT_CMP(x->largest_free_block, ==, y->largest_free_block);
	HOT_CMP(x->num_live_allocs, ==, y->num_live_allocs);
	HOT_CMP(x->num_free_blocks, ==, y->num_free_blocks);
	HOT_CMP(x->num_regions, ==, y->num_regions);
}

static uintptr_t must_alloc(struct ts_alloc *a, uint64_t size)
{
	uintptr_t p = 0;

	ck_assert(ts_alloc_alloc(a, size, &p));
	ck_assert(ts_alloc_check(a));
	return p;
}

/* Fills a fresh region [BASE, BASE + n*U) with n blocks of U bytes. */
static struct ts_alloc *full_of_units(unsigned n, uintptr_t *blocks)
{
	struct ts_alloc *a = new_alloc(U);

	ck_assert(ts_alloc_add_region(a, BASE, (uint64_t)n * U));
	for (unsigned i = 0; i < n; i++) {
		blocks[i] = must_alloc(a, U);
		ck_assert_uint_eq(blocks[i], BASE + (uintptr_t)i * U);
	}
	return a;
}

/* ---- construction and rounding ------------------------------------------ */

START_TEST(test_new_alignment)
{
	static const uint64_t bad[] = {0, 3, 6, 12, 1000, UINT64_MAX};
	static const uint64_t good[] = {1, 2, 64, 4096, (uint64_t)1 << 63};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_ptr_null(ts_alloc_new(bad[i]));
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct ts_alloc *a = new_alloc(good[i]);
		struct ts_alloc_stats st = stats_of(a), zero = {0};

		assert_stats_eq(&st, &zero);
		ts_alloc_free(a);
	}
	ts_alloc_free(NULL);
}
END_TEST

START_TEST(test_round)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc *one = new_alloc(1);

	ck_assert_uint_eq(ts_alloc_round(a, 0), 0);
	ck_assert_uint_eq(ts_alloc_round(a, 1), U);
	ck_assert_uint_eq(ts_alloc_round(a, U - 1), U);
	ck_assert_uint_eq(ts_alloc_round(a, U), U);
	ck_assert_uint_eq(ts_alloc_round(a, U + 1), 2 * U);
	ck_assert_uint_eq(ts_alloc_round(a, 3 * U - 7), 3 * U); /* no power of 2 */
	ck_assert_uint_eq(ts_alloc_round(a, UINT64_MAX - U + 1), UINT64_MAX - U + 1);
	ck_assert_uint_eq(ts_alloc_round(a, UINT64_MAX - U + 2), 0);
	ck_assert_uint_eq(ts_alloc_round(a, UINT64_MAX), 0);
	ck_assert_uint_eq(ts_alloc_round(one, 7), 7);
	ck_assert_uint_eq(ts_alloc_round(one, UINT64_MAX), UINT64_MAX);
	ts_alloc_free(a);
	ts_alloc_free(one);
}
END_TEST

START_TEST(test_alloc_rounds_to_alignment_only)
{
	struct ts_alloc *a = new_alloc(U);
	uintptr_t p1, p2, p3;

	ck_assert(ts_alloc_add_region(a, BASE, 64 * U));
	p1 = must_alloc(a, 1);
	p2 = must_alloc(a, 5 * U + 1);  /* 6 units, not 8 */
	p3 = must_alloc(a, 3 * U);
	ck_assert_uint_eq(p1, BASE);
	ck_assert_uint_eq(p2, BASE + U);
	ck_assert_uint_eq(p3, BASE + 7 * U);
	ck_assert_uint_eq(ts_alloc_block_size(a, p1), U);
	ck_assert_uint_eq(ts_alloc_block_size(a, p2), 6 * U);
	ck_assert_uint_eq(ts_alloc_block_size(a, p3), 3 * U);
	ck_assert_uint_eq(stats_of(a).bytes_in_use, 10 * U);
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_alignment_one)
{
	struct ts_alloc *a = new_alloc(1);

	ck_assert(ts_alloc_add_region(a, 1001, 10));
	ck_assert_uint_eq(must_alloc(a, 1), 1001);
	ck_assert_uint_eq(must_alloc(a, 2), 1002);
	ck_assert_uint_eq(must_alloc(a, 7), 1004);
	ck_assert_uint_eq(stats_of(a).bytes_free, 0);
	ts_alloc_free(a);
}
END_TEST

/* ---- regions -------------------------------------------------------------- */

START_TEST(test_add_region_args)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc_stats before;

	ck_assert(!ts_alloc_add_region(a, BASE + 1, 4 * U));   /* unaligned */
	ck_assert(!ts_alloc_add_region(a, BASE, 4 * U + 1));   /* not a multiple */
	ck_assert(!ts_alloc_add_region(a, BASE, 0));
	/* end not representable */
	ck_assert(!ts_alloc_add_region(a, (uintptr_t)0 - 4 * U, 4 * U));
	ck_assert(!ts_alloc_add_region(a, (uintptr_t)0 - 4 * U, UINT64_MAX - U + 1));
	ck_assert_uint_eq(stats_of(a).num_regions, 0);

	ck_assert(ts_alloc_add_region(a, BASE + 8 * U, 8 * U));  /* [8, 16) */
	before = stats_of(a);
	ck_assert(!ts_alloc_add_region(a, BASE + 8 * U, 8 * U));   /* same */
	ck_assert(!ts_alloc_add_region(a, BASE + 4 * U, 5 * U));   /* left edge */
	ck_assert(!ts_alloc_add_region(a, BASE + 15 * U, 2 * U));  /* right edge */
	ck_assert(!ts_alloc_add_region(a, BASE + 9 * U, 2 * U));   /* inside */
	ck_assert(!ts_alloc_add_region(a, BASE, 32 * U));          /* around */
	{
		struct ts_alloc_stats after = stats_of(a);

		assert_stats_eq(&before, &after);
	}
	ck_assert(ts_alloc_check(a));

	/* Adjacent on both sides is fine, in any order. */
	ck_assert(ts_alloc_add_region(a, BASE + 16 * U, 4 * U));
	ck_assert(ts_alloc_add_region(a, BASE + 4 * U, 4 * U));
	ck_assert(ts_alloc_add_region(a, BASE, 4 * U));
	ck_assert(ts_alloc_check(a));
	ck_assert_uint_eq(stats_of(a).num_regions, 4);
	ck_assert_uint_eq(stats_of(a).bytes_reserved, 20 * U);

	ts_alloc_free(a);

	/* The highest region whose end is representable. */
	a = new_alloc(U);
	ck_assert(ts_alloc_add_region(a, (uintptr_t)0 - 5 * U, 4 * U));
	ck_assert_uint_eq(must_alloc(a, 3 * U), (uintptr_t)0 - 5 * U);
	ck_assert_uint_eq(must_alloc(a, U), (uintptr_t)0 - 2 * U);
	ck_assert_uint_eq(stats_of(a).bytes_free, 0);
	ck_assert(ts_alloc_release(a, (uintptr_t)0 - 2 * U));
	ck_assert(ts_alloc_release(a, (uintptr_t)0 - 5 * U));
	ck_assert(ts_alloc_check(a));
	ck_assert(ts_alloc_remove_region(a, (uintptr_t)0 - 5 * U));
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_remove_region_only_when_empty)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc_stats st;
	uintptr_t p, q;

	ck_assert(ts_alloc_add_region(a, BASE, 8 * U));
	ck_assert(ts_alloc_add_region(a, BASE + 8 * U, 4 * U));
	ck_assert(!ts_alloc_remove_region(a, BASE + U));       /* not a base */
	ck_assert(!ts_alloc_remove_region(a, BASE + 64 * U));  /* nothing there */

	p = must_alloc(a, 5 * U);  /* only the 8-unit region fits */
	q = must_alloc(a, 2 * U);  /* best fit: the 3 units left there */
	ck_assert_uint_eq(p, BASE);
	ck_assert_uint_eq(q, BASE + 5 * U);
	ck_assert(!ts_alloc_remove_region(a, BASE));           /* in use */
	ck_assert(ts_alloc_release(a, p));
	ck_assert(!ts_alloc_remove_region(a, BASE));           /* still q */
	ck_assert(ts_alloc_release(a, q));
	ck_assert(ts_alloc_check(a));

	/* Split and coalesced back: whole again, so removable. */
	ck_assert(ts_alloc_remove_region(a, BASE));
	ck_assert(ts_alloc_check(a));
	st = stats_of(a);
	ck_assert_uint_eq(st.num_regions, 1);
	ck_assert_uint_eq(st.bytes_reserved, 4 * U);
	ck_assert_uint_eq(st.num_free_blocks, 1);
	ck_assert_uint_eq(st.largest_free_block, 4 * U);
	ck_assert(!ts_alloc_remove_region(a, BASE));           /* gone */

	/* The removed range is no longer handed out. */
	p = must_alloc(a, U);
	ck_assert_uint_eq(p, BASE + 8 * U);
	ck_assert(!ts_alloc_alloc(a, 4 * U, &q));

	/* ... and can be added again. */
	ck_assert(ts_alloc_add_region(a, BASE, 8 * U));
	ck_assert_uint_eq(must_alloc(a, 8 * U), BASE);
	ck_assert(ts_alloc_release(a, BASE));
	ck_assert(ts_alloc_release(a, p));
	ck_assert(ts_alloc_remove_region(a, BASE + 8 * U));
	ck_assert(ts_alloc_remove_region(a, BASE));
	st = stats_of(a);
	{
		struct ts_alloc_stats zero = {0};

		assert_stats_eq(&st, &zero);
	}
	ck_assert(ts_alloc_check(a));
	ts_alloc_free(a);
}
END_TEST

/* The region of an address, and whether it is idle: what a pool asks of a
 * release before it gives a segment back. */
START_TEST(test_region_of_and_idle)
{
	struct ts_alloc *a = new_alloc(U);
	uintptr_t base = 0, p, q;
	uint64_t size = 0;
	bool idle = false;

	ck_assert(ts_alloc_add_region(a, BASE, 8 * U));
	ck_assert(ts_alloc_add_region(a, BASE + 16 * U, 4 * U));
	ck_assert(!ts_alloc_region_of(a, BASE - 1, &base, &size, &idle));      /* below all */
	ck_assert(!ts_alloc_region_of(a, BASE + 8 * U, &base, &size, &idle));  /* in the gap */
	ck_assert(!ts_alloc_region_of(a, BASE + 20 * U, &base, &size, &idle)); /* past the end */
	ck_assert(ts_alloc_region_of(a, BASE + 17 * U + 3, &base, &size, &idle));
	ck_assert_uint_eq(base, BASE + 16 * U);
	ck_assert_uint_eq(size, 4 * U);
	ck_assert(idle);

	p = must_alloc(a, 3 * U);   /* best fit: the 4-unit region */
	q = must_alloc(a, U);
	ck_assert_uint_eq(p, BASE + 16 * U);
	ck_assert(ts_alloc_region_of(a, p, &base, &size, &idle));
	ck_assert(!idle);
	ck_assert(ts_alloc_release(a, p));
	ck_assert(ts_alloc_region_of(a, p, &base, &size, &idle));
	ck_assert(!idle);           /* q is still there */
	ck_assert(ts_alloc_release(a, q));
	ck_assert(ts_alloc_region_of(a, q, &base, &size, &idle));
	ck_assert(idle);            /* coalesced whole again */
	ck_assert(ts_alloc_remove_region(a, base));
	ck_assert(!ts_alloc_region_of(a, q, &base, &size, &idle));
	ck_assert(ts_alloc_region_of(a, BASE, &base, &size, &idle));
	ck_assert(idle && base == BASE && size == 8 * U);
	ck_assert(ts_alloc_check(a));
	ts_alloc_free(a);
}
END_TEST

/* ---- best fit ------------------------------------------------------------ */

START_TEST(test_best_fit_smallest_then_lowest)
{
	/* Unit layout: A H H H A H A H H A H A A A A A (A allocated). */
	static const unsigned sizes[] = {1, 3, 1, 1, 1, 2, 1, 1, 1, 4};
	struct ts_alloc *a = new_alloc(U);
	uintptr_t p[10];

	ck_assert(ts_alloc_add_region(a, BASE, 16 * U));
	for (unsigned i = 0; i < 10; i++)
		p[i] = must_alloc(a, sizes[i] * U);
	ck_assert_uint_eq(stats_of(a).bytes_free, 0);
	ck_assert(ts_alloc_release(a, p[1]));  /* 3 units at 1 */
	ck_assert(ts_alloc_release(a, p[3]));  /* 1 unit at 5 */
	ck_assert(ts_alloc_release(a, p[5]));  /* 2 units at 7 */
	ck_assert(ts_alloc_release(a, p[7]));  /* 1 unit at 10 */
	ck_assert(ts_alloc_check(a));
	ck_assert_uint_eq(stats_of(a).num_free_blocks, 4);

	/* Not first fit: 3 units at 1 is lower but bigger. */
	ck_assert_uint_eq(must_alloc(a, 1), BASE + 5 * U);
	ck_assert_uint_eq(must_alloc(a, U), BASE + 10 * U);
	/* Only 2 and 3 left: the 2 is split. */
	ck_assert_uint_eq(must_alloc(a, U), BASE + 7 * U);
	/* 1 at 8 left and 3 at 1: 2 units must come from the 3. */
	ck_assert_uint_eq(must_alloc(a, 2 * U), BASE + 1 * U);
	/* Two singles, at 3 and at 8: the lower one. */
	ck_assert_uint_eq(must_alloc(a, U), BASE + 3 * U);
	ck_assert_uint_eq(must_alloc(a, U), BASE + 8 * U);
	ck_assert_uint_eq(stats_of(a).num_free_blocks, 0);
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_best_fit_ties_across_regions)
{
	struct ts_alloc *a = new_alloc(U);

	/* Equal free blocks in three regions, the lowest added last. */
	ck_assert(ts_alloc_add_region(a, BASE + 1000 * U, 4 * U));
	ck_assert(ts_alloc_add_region(a, BASE + 500 * U, 4 * U));
	ck_assert(ts_alloc_add_region(a, BASE + 100 * U, 4 * U));
	ck_assert(ts_alloc_add_region(a, BASE + 2000 * U, 3 * U));
	ck_assert_uint_eq(must_alloc(a, 4 * U), BASE + 100 * U);
	ck_assert_uint_eq(must_alloc(a, 1), BASE + 2000 * U);    /* smallest */
	ck_assert_uint_eq(must_alloc(a, 3 * U), BASE + 500 * U); /* 2 < 3 left */
	ck_assert_uint_eq(must_alloc(a, 2 * U), BASE + 2001 * U);
	ck_assert_uint_eq(must_alloc(a, 1), BASE + 503 * U);
	ts_alloc_free(a);
}
END_TEST

/* ---- coalescing ---------------------------------------------------------- */

static void assert_one_hole(struct ts_alloc *a, uintptr_t at, uint64_t units)
{
	struct ts_alloc_stats st = stats_of(a);
	uintptr_t p;

	ck_assert(ts_alloc_check(a));
	ck_assert_uint_eq(st.num_free_blocks, 1);
	ck_assert_uint_eq(st.largest_free_block, units * U);
	ck_assert_uint_eq(st.bytes_free, units * U);
	ck_assert(ts_alloc_alloc(a, units * U, &p));
	ck_assert_uint_eq(p, at);
	ck_assert(ts_alloc_check(a));
}

START_TEST(test_coalesce_left)
{
	uintptr_t b[8];
	struct ts_alloc *a = full_of_units(8, b);

	ck_assert(ts_alloc_release(a, b[2]));
	ck_assert(ts_alloc_release(a, b[3]));  /* b[2] on its left is free */
	assert_one_hole(a, b[2], 2);
	/* At the region's end: no right neighbour at all. */
	ck_assert(ts_alloc_release(a, b[6]));
	ck_assert(ts_alloc_release(a, b[7]));
	assert_one_hole(a, b[6], 2);
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_coalesce_right)
{
	uintptr_t b[8];
	struct ts_alloc *a = full_of_units(8, b);

	ck_assert(ts_alloc_release(a, b[3]));
	ck_assert(ts_alloc_release(a, b[2]));  /* b[3] on its right is free */
	assert_one_hole(a, b[2], 2);
	/* At the region's start: no left neighbour at all. */
	ck_assert(ts_alloc_release(a, b[1]));
	ck_assert(ts_alloc_release(a, b[0]));
	assert_one_hole(a, b[0], 2);
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_coalesce_both)
{
	uintptr_t b[8];
	struct ts_alloc *a = full_of_units(8, b);
	struct ts_alloc_stats st;

	ck_assert(ts_alloc_release(a, b[2]));
	ck_assert(ts_alloc_release(a, b[4]));
	ck_assert_uint_eq(stats_of(a).num_free_blocks, 2);
	ck_assert(ts_alloc_release(a, b[3]));
	assert_one_hole(a, b[2], 3);

	/* Everything back (b[2] is now the 3-unit block): one block. */
	for (unsigned i = 0; i < 8; i++)
		if (i < 3 || i > 4)
			ck_assert(ts_alloc_release(a, b[i]));
	st = stats_of(a);
	ck_assert(ts_alloc_check(a));
	ck_assert_uint_eq(st.num_free_blocks, 1);
	ck_assert_uint_eq(st.largest_free_block, 8 * U);
	ck_assert_uint_eq(st.num_live_allocs, 0);
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_no_coalesce_across_regions)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc_stats st;
	uintptr_t p, q, b[8];

	ck_assert(ts_alloc_add_region(a, BASE + 4 * U, 4 * U));
	ck_assert(ts_alloc_add_region(a, BASE, 4 * U));
	st = stats_of(a);
	ck_assert_uint_eq(st.num_free_blocks, 2);
	ck_assert_uint_eq(st.largest_free_block, 4 * U);
	ck_assert(!ts_alloc_alloc(a, 5 * U, &p));  /* would straddle */

	p = must_alloc(a, 4 * U);
	q = must_alloc(a, 4 * U);
	ck_assert_uint_eq(p, BASE);
	ck_assert_uint_eq(q, BASE + 4 * U);
	ck_assert(ts_alloc_release(a, q));
	ck_assert(ts_alloc_release(a, p));
	st = stats_of(a);
	ck_assert_uint_eq(st.num_free_blocks, 2);
	ck_assert_uint_eq(st.largest_free_block, 4 * U);

	/* The blocks on either side of the boundary stay apart too. */
	for (unsigned i = 0; i < 8; i++)
		b[i] = must_alloc(a, U);
	ck_assert(ts_alloc_release(a, b[3]));
	ck_assert(ts_alloc_release(a, b[4]));
	ck_assert(ts_alloc_check(a));
	st = stats_of(a);
	ck_assert_uint_eq(st.num_free_blocks, 2);
	ck_assert_uint_eq(st.largest_free_block, U);
	ck_assert(!ts_alloc_alloc(a, 2 * U, &p));
	ts_alloc_free(a);
}
END_TEST

/* ---- failures change nothing ---------------------------------------------- */

START_TEST(test_exhaustion)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc_stats before, after;
	uintptr_t p = 12345, b[4];

	ck_assert(!ts_alloc_alloc(a, 1, &p));  /* no region at all */
	ck_assert(ts_alloc_add_region(a, BASE, 4 * U));
	before = stats_of(a);
	ck_assert(!ts_alloc_alloc(a, 0, &p));
	ck_assert(!ts_alloc_alloc(a, 4 * U + 1, &p));
	ck_assert(!ts_alloc_alloc(a, UINT64_MAX, &p));  /* rounding overflows */
	ck_assert_uint_eq(p, 12345);
	after = stats_of(a);
	assert_stats_eq(&before, &after);

	for (unsigned i = 0; i < 4; i++)
		b[i] = must_alloc(a, 1);
	before = stats_of(a);
	ck_assert_uint_eq(before.bytes_free, 0);
	ck_assert_uint_eq(before.largest_free_block, 0);
	ck_assert(!ts_alloc_alloc(a, 1, &p));
	after = stats_of(a);
	assert_stats_eq(&before, &after);
	ck_assert(ts_alloc_check(a));

	/* Enough bytes free in total, but not in one piece. */
	ck_assert(ts_alloc_release(a, b[0]));
	ck_assert(ts_alloc_release(a, b[2]));
	before = stats_of(a);
	ck_assert_uint_eq(before.bytes_free, 2 * U);
	ck_assert(!ts_alloc_alloc(a, 2 * U, &p));
	after = stats_of(a);
	assert_stats_eq(&before, &after);
	ck_assert_uint_eq(p, 12345);
	ck_assert(ts_alloc_check(a));
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_release_bad_address)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc_stats before, after;
	uintptr_t p, q;

	ck_assert(!ts_alloc_release(a, BASE));  /* empty allocator */
	ck_assert(ts_alloc_add_region(a, BASE, 16 * U));
	p = must_alloc(a, 3 * U);
	q = must_alloc(a, U);
	ck_assert(ts_alloc_release(a, q));
	before = stats_of(a);

	ck_assert(!ts_alloc_release(a, p + U));       /* inside a block */
	ck_assert(!ts_alloc_release(a, p + 1));
	ck_assert(!ts_alloc_release(a, q));           /* double release */
	ck_assert(!ts_alloc_release(a, BASE + 8 * U));  /* inside free space */
	ck_assert(!ts_alloc_release(a, BASE - U));    /* outside any region */
	ck_assert(!ts_alloc_release(a, BASE + 16 * U));
	ck_assert(!ts_alloc_release(a, 0));
	after = stats_of(a);
	assert_stats_eq(&before, &after);
	ck_assert(ts_alloc_check(a));

	ck_assert_uint_eq(ts_alloc_block_size(a, p), 3 * U);
	ck_assert_uint_eq(ts_alloc_block_size(a, p + U), 0);
	ck_assert_uint_eq(ts_alloc_block_size(a, q), 0);
	ck_assert_uint_eq(ts_alloc_block_size(a, 0), 0);
	ck_assert(ts_alloc_release(a, p));
	ck_assert_uint_eq(ts_alloc_block_size(a, p), 0);
	ts_alloc_free(a);
}
END_TEST

/* ---- stats ---------------------------------------------------------------- */

START_TEST(test_stats_exact)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc_stats st;
	uintptr_t p, q;

	ck_assert(ts_alloc_add_region(a, BASE, 10 * U));
	ck_assert(ts_alloc_add_region(a, BASE + 100 * U, 6 * U));
	st = stats_of(a);
	ck_assert_uint_eq(st.bytes_in_use, 0);
	ck_assert_uint_eq(st.bytes_reserved, 16 * U);
	ck_assert_uint_eq(st.bytes_free, 16 * U);
	ck_assert_uint_eq(st.largest_free_block, 10 * U);
	ck_assert_uint_eq(st.num_live_allocs, 0);
	ck_assert_uint_eq(st.num_free_blocks, 2);
	ck_assert_uint_eq(st.num_regions, 2);

	p = must_alloc(a, 100);      /* 1 unit from the 6-unit region */
	q = must_alloc(a, 2 * U + 1); /* 3 units from what is left there */
	ck_assert_uint_eq(p, BASE + 100 * U);
	ck_assert_uint_eq(q, BASE + 101 * U);
	st = stats_of(a);
	ck_assert_uint_eq(st.bytes_in_use, 4 * U);
	ck_assert_uint_eq(st.bytes_reserved, 16 * U);
	ck_assert_uint_eq(st.bytes_free, 12 * U);
	ck_assert_uint_eq(st.largest_free_block, 10 * U);
	ck_assert_uint_eq(st.num_live_allocs, 2);
	ck_assert_uint_eq(st.num_free_blocks, 2);
	ck_assert_uint_eq(st.num_regions, 2);

	ck_assert(ts_alloc_release(a, p));
	st = stats_of(a);
	ck_assert_uint_eq(st.bytes_in_use, 3 * U);
	ck_assert_uint_eq(st.bytes_free, 13 * U);
	ck_assert_uint_eq(st.num_live_allocs, 1);
	ck_assert_uint_eq(st.num_free_blocks, 3);

	p = must_alloc(a, 10 * U);
	st = stats_of(a);
	ck_assert_uint_eq(p, BASE);
	ck_assert_uint_eq(st.largest_free_block, 2 * U);
	ck_assert_uint_eq(st.num_free_blocks, 2);
	ck_assert_uint_eq(st.bytes_free, 3 * U);
	ck_assert(ts_alloc_check(a));
	ts_alloc_free(a);
}
END_TEST

START_TEST(test_largest_free_block_fragmentation)
{
	enum { N = 64 };
	uintptr_t b[N], p;
	struct ts_alloc *a = full_of_units(N, b);
	struct ts_alloc_stats st;

	for (unsigned i = 0; i < N; i += 2)
		ck_assert(ts_alloc_release(a, b[i]));
	ck_assert(ts_alloc_check(a));
	st = stats_of(a);
	ck_assert_uint_eq(st.bytes_free, N / 2 * U);
	ck_assert_uint_eq(st.largest_free_block, U);
	ck_assert_uint_eq(st.num_free_blocks, N / 2);
	ck_assert(!ts_alloc_alloc(a, U + 1, &p));

	/* Freeing b[9] joins the holes at 8 and 10 into one of 3 units. */
	ck_assert(ts_alloc_release(a, b[9]));
	st = stats_of(a);
	ck_assert_uint_eq(st.largest_free_block, 3 * U);
	ck_assert_uint_eq(st.num_free_blocks, N / 2 - 1);

	for (unsigned i = 1; i < N; i += 2)
		if (i != 9)
			ck_assert(ts_alloc_release(a, b[i]));
	st = stats_of(a);
	ck_assert_uint_eq(st.largest_free_block, N * U);
	ck_assert_uint_eq(st.num_free_blocks, 1);
	ck_assert(ts_alloc_check(a));
	ts_alloc_free(a);
}
END_TEST

/* ---- injected bookkeeping failures ------------------------------------------ */

START_TEST(test_injected_failures)
{
	struct ts_alloc *a = new_alloc(U);
	struct ts_alloc_stats before, after;
	uintptr_t p = 777, b[4];

	/* add_region allocates twice; either failing leaves nothing behind. */
	for (unsigned n = 1; n <= 2; n++) {
		ts__alloc_fail_next(a, n);
		ck_assert(!ts_alloc_add_region(a, BASE, 8 * U));
		ts__alloc_fail_next(a, 0);
		ck_assert(ts_alloc_check(a));
		ck_assert_uint_eq(stats_of(a).num_regions, 0);
	}
	ck_assert(ts_alloc_add_region(a, BASE, 8 * U));

	/* A split needs a new block; its failure changes nothing. */
	before = stats_of(a);
	ts__alloc_fail_next(a, 1);
	ck_assert(!ts_alloc_alloc(a, U, &p));
	ck_assert_uint_eq(p, 777);
	after = stats_of(a);
	assert_stats_eq(&before, &after);
	ck_assert(ts_alloc_check(a));
	ck_assert_uint_eq(must_alloc(a, U), BASE);  /* the hook fired once */

	/* An exact fit and every release need no bookkeeping. */
	ts__alloc_fail_next(a, 1000);
	ck_assert(ts_alloc_alloc(a, 7 * U, &p));
	ck_assert_uint_eq(p, BASE + U);
	ck_assert(ts_alloc_release(a, BASE));
	ck_assert(ts_alloc_release(a, p));
	ck_assert(ts_alloc_check(a));
	ck_assert(!ts_alloc_alloc(a, U, &p));       /* split: still failing */
	ts__alloc_fail_next(a, 0);

	/* Failure in the middle of a busy region. */
	for (unsigned i = 0; i < 4; i++)
		b[i] = must_alloc(a, U);
	ck_assert(ts_alloc_release(a, b[1]));
	before = stats_of(a);
	ts__alloc_fail_next(a, 1);
	ck_assert(!ts_alloc_alloc(a, 2 * U, &p));
	after = stats_of(a);
	assert_stats_eq(&before, &after);
	ck_assert(ts_alloc_check(a));
	ck_assert_uint_eq(must_alloc(a, 2 * U), BASE + 4 * U);
	ck_assert(ts_alloc_remove_region(a, BASE) == false);
	ts_alloc_free(a);  /* frees live blocks' bookkeeping too */
}
END_TEST

/* ---- randomized against a shadow model ------------------------------------ */

struct rng {
	uint64_t s;
};

static uint64_t rng_next(struct rng *r)  /* splitmix64 */
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15u);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static uint64_t rng_below(struct rng *r, uint64_t n)
{
	return rng_next(r) % n;
}

#define SH_ALIGN 64u
#define SH_SLOTS 5
#define SH_MAX_LIVE 8192

struct span {
	uintptr_t addr;
	uint64_t size;
};

/* Region slots: 0 and 1 are adjacent, 2 and 3 too; 4 stands apart. */
static const struct span sh_slot[SH_SLOTS] = {
	{0x10000000u, 64 * SH_ALIGN * 16},
	{0x10000000u + 64 * SH_ALIGN * 16, 40 * SH_ALIGN * 16},
	{0x20000000u, 32 * SH_ALIGN * 16},
	{0x20000000u + 32 * SH_ALIGN * 16, 8 * SH_ALIGN * 16},
	{0x30000000u, 128 * SH_ALIGN * 16},
};

struct shadow {
	bool present[SH_SLOTS];
	struct span live[SH_MAX_LIVE];  /* kept sorted by address */
	size_t nlive;
};

/* What the shadow says about the free space: maximal gaps per region. */
struct shadow_view {
	uint64_t in_use, reserved, nfree, largest, nregions;
	uintptr_t fit_addr;   /* best fit for `want`, valid if fit_found */
	uint64_t fit_size;    /* the size of the gap at fit_addr */
	bool fit_found;
};

static size_t shadow_lower(const struct shadow *sh, uintptr_t addr)
{
	size_t lo = 0, hi = sh->nlive;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (sh->live[mid].addr < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void shadow_gap(struct shadow_view *v, uintptr_t at, uint64_t len,
		       uint64_t want)
{
	if (len == 0)
		return;
	v->nfree++;
	if (len > v->largest)
		v->largest = len;
	/* Smallest fitting gap, the lowest among equals (gaps come in
	 * increasing address order). */
	if (want && len >= want) {
		if (!v->fit_found || len < v->fit_size) {
			v->fit_found = true;
			v->fit_addr = at;
			v->fit_size = len;
		}
	}
}

/*
 * Walks regions and live blocks in address order, asserting that live
 * blocks are aligned, lie inside present regions and never overlap; fills
 * v, including the best fit for `want` bytes (0: none wanted).
 */
static void shadow_scan(const struct shadow *sh, uint64_t want,
			struct shadow_view *v)
{
	size_t i = 0;

	memset(v, 0, sizeof(*v));
	for (int s = 0; s < SH_SLOTS; s++) {
		uintptr_t at, end;

		if (!sh->present[s]) {
			/* No live block may sit in an absent region. */
			size_t k = shadow_lower(sh, sh_slot[s].addr);

			HOT_ASSERT(k == sh->nlive ||
				  sh->live[k].addr >= sh_slot[s].addr + sh_slot[s].size);
			continue;
		}
		at = sh_slot[s].addr;
		end = at + sh_slot[s].size;
		v->reserved += sh_slot[s].size;
		v->nregions++;
		HOT_ASSERT(i == sh->nlive || sh->live[i].addr >= at);
		for (; i < sh->nlive && sh->live[i].addr < end; i++) {
			const struct span *b = &sh->live[i];

			HOT_CMP(b->addr, >=, at);
			HOT_CMP(b->addr % SH_ALIGN, ==, 0);
			HOT_CMP(b->size % SH_ALIGN, ==, 0);
			HOT_CMP(b->addr + b->size, <=, end);
			shadow_gap(v, at, b->addr - at, want);
			at = b->addr + b->size;
			v->in_use += b->size;
		}
		shadow_gap(v, at, end - at, want);
	}
	HOT_CMP(i, ==, sh->nlive);  /* every block was in some region */
}

static void shadow_insert(struct shadow *sh, uintptr_t addr, uint64_t size)
{
	size_t k = shadow_lower(sh, addr);

	HOT_CMP(sh->nlive, <, SH_MAX_LIVE);
	memmove(&sh->live[k + 1], &sh->live[k], (sh->nlive - k) * sizeof(sh->live[0]));
	sh->live[k].addr = addr;
	sh->live[k].size = size;
	sh->nlive++;
}

static void shadow_erase(struct shadow *sh, size_t k)
{
	memmove(&sh->live[k], &sh->live[k + 1],
		(sh->nlive - k - 1) * sizeof(sh->live[0]));
	sh->nlive--;
}

/* Allocator and shadow agree on everything the API shows. */
static void shadow_compare(const struct ts_alloc *a, const struct shadow *sh,
			   bool sizes_too)
{
	struct shadow_view v;
	struct ts_alloc_stats st = stats_of(a);

	HOT_ASSERT(ts_alloc_check(a));
	shadow_scan(sh, 0, &v);
	HOT_CMP(st.bytes_in_use, ==, v.in_use);
	HOT_CMP(st.bytes_reserved, ==, v.reserved);
	HOT_CMP(st.bytes_free, ==, v.reserved - v.in_use);
	HOT_CMP(st.largest_free_block, ==, v.largest);
	HOT_CMP(st.num_live_allocs, ==, sh->nlive);
	HOT_CMP(st.num_free_blocks, ==, v.nfree);
	HOT_CMP(st.num_regions, ==, v.nregions);
	if (sizes_too)
		for (size_t k = 0; k < sh->nlive; k++)
			HOT_CMP(ts_alloc_block_size(a, sh->live[k].addr), ==, sh->live[k].size);
}

static uint64_t random_size(struct rng *r)
{
	switch (rng_below(r, 8)) {
	case 0:
		return 1 + rng_below(r, 64 * SH_ALIGN * 8);  /* large */
	case 1:
		return SH_ALIGN * (1 + rng_below(r, 4));     /* exact multiples */
	default:
		return 1 + rng_below(r, SH_ALIGN * 16);      /* small */
	}
}

static void random_alloc(struct ts_alloc *a, struct shadow *sh, struct rng *r)
{
	uint64_t size = random_size(r), need = ts_alloc_round(a, size);
	bool inject = rng_below(r, 32) == 0;
	struct ts_alloc_stats before = stats_of(a), after;
	struct shadow_view v;
	uintptr_t p = 1;
	bool ok;

	HOT_CMP(need, ==, (size + SH_ALIGN - 1) / SH_ALIGN * SH_ALIGN);
	shadow_scan(sh, need, &v);
	if (inject)
		ts__alloc_fail_next(a, 1);
	ok = ts_alloc_alloc(a, size, &p);
	ts__alloc_fail_next(a, 0);
	if (!ok) {
		/* Only a split may fail when the hook is armed. */
		HOT_ASSERT(!v.fit_found || (inject && v.fit_size > need));
		HOT_CMP(p, ==, 1);
		after = stats_of(a);
		assert_stats_eq(&before, &after);
		return;
	}
	HOT_ASSERT(v.fit_found);
	HOT_CMP(p, ==, v.fit_addr);
	HOT_CMP(ts_alloc_block_size(a, p), ==, need);
	shadow_insert(sh, p, need);
}

static void random_release(struct ts_alloc *a, struct shadow *sh, struct rng *r)
{
	size_t k;

	if (sh->nlive == 0)
		return;
	k = rng_below(r, sh->nlive);
	HOT_ASSERT(ts_alloc_release(a, sh->live[k].addr));
	shadow_erase(sh, k);
}

/* A random address in a present region that is not a live block's start. */
static void random_bad_release(struct ts_alloc *a, struct shadow *sh,
			       struct rng *r)
{
	int s = (int)rng_below(r, SH_SLOTS);
	uintptr_t addr = sh_slot[s].addr + rng_below(r, sh_slot[s].size + 1);
	size_t k = shadow_lower(sh, addr);
	struct ts_alloc_stats before = stats_of(a), after;

	if (k < sh->nlive && sh->live[k].addr == addr)
		return;
	HOT_ASSERT(!ts_alloc_release(a, addr));
	after = stats_of(a);
	assert_stats_eq(&before, &after);
}

static void random_region_op(struct ts_alloc *a, struct shadow *sh,
			     struct rng *r)
{
	int s = (int)rng_below(r, SH_SLOTS);

	if (sh->present[s]) {
		size_t k = shadow_lower(sh, sh_slot[s].addr);
		bool empty = k == sh->nlive ||
			     sh->live[k].addr >= sh_slot[s].addr + sh_slot[s].size;

		HOT_CMP(ts_alloc_remove_region(a, sh_slot[s].addr), ==, empty);
		if (empty)
			sh->present[s] = false;
	} else {
		bool inject = rng_below(r, 4) == 0;

		if (inject)
			ts__alloc_fail_next(a, 1 + (unsigned)rng_below(r, 2));
		HOT_CMP(ts_alloc_add_region(a, sh_slot[s].addr,
						     sh_slot[s].size), ==, !inject);
		ts__alloc_fail_next(a, 0);
		sh->present[s] = !inject;
	}
}

static void random_run(uint64_t seed, int ops)
{
	struct ts_alloc *a = new_alloc(SH_ALIGN);
	struct shadow *sh = calloc(1, sizeof(*sh));
	struct rng r = {seed};

	HOT_ASSERT(sh != NULL);
	for (int s = 0; s < SH_SLOTS; s++) {
		if (s == 3)
			continue;  /* starts absent */
		HOT_ASSERT(ts_alloc_add_region(a, sh_slot[s].addr, sh_slot[s].size));
		sh->present[s] = true;
	}
	shadow_compare(a, sh, true);

	for (int i = 0; i < ops; i++) {
		/* Phases of growth and shrinkage reach both full and empty. */
		unsigned alloc_pct = (i / 500) % 2 ? 35 : 65;
		uint64_t dice = rng_below(&r, 100);

		if (dice < 2)
			random_region_op(a, sh, &r);
		else if (dice < 4)
			random_bad_release(a, sh, &r);
		else if (dice < 4 + alloc_pct)
			random_alloc(a, sh, &r);
		else
			random_release(a, sh, &r);
		shadow_compare(a, sh, i % 64 == 0);
	}

	/* Drain: everything coalesces back to one block per region. */
	while (sh->nlive > 0) {
		HOT_ASSERT(ts_alloc_release(a, sh->live[sh->nlive - 1].addr));
		sh->nlive--;
	}
	shadow_compare(a, sh, true);
	for (int s = 0; s < SH_SLOTS; s++)
		if (sh->present[s])
			HOT_ASSERT(ts_alloc_remove_region(a, sh_slot[s].addr));
	HOT_ASSERT(ts_alloc_check(a));
	HOT_CMP(stats_of(a).num_regions, ==, 0);
	free(sh);
	ts_alloc_free(a);
}

START_TEST(test_random_against_shadow)
{
	static const uint64_t seeds[] = {
		1, 2, 3, 42, 0xdeadbeef, 0x5eed0001, 0x5eed0002, 20240601,
	};

	random_run(seeds[_i], 6000);
}
END_TEST

/* ---- scale ----------------------------------------------------------------- */

/* Tens of thousands of blocks: O(n) per operation would not finish in time. */
START_TEST(test_many_blocks)
{
	enum { N = 60000 };
	struct ts_alloc *a = new_alloc(U);
	uintptr_t *p = malloc(N * sizeof(*p));
	struct rng r = {7};
	struct ts_alloc_stats st;
	uint64_t reserved = (uint64_t)1 << 40;

	HOT_ASSERT(p != NULL);
	HOT_ASSERT(ts_alloc_add_region(a, BASE, reserved));
	for (size_t i = 0; i < N; i++)
		HOT_ASSERT(ts_alloc_alloc(a, 1 + rng_below(&r, 64 * U), &p[i]));
	/* Free a random half: many free blocks of many sizes. */
	for (size_t i = N - 1; i > 0; i--) {
		size_t j = rng_below(&r, i + 1);
		uintptr_t t = p[i];

		p[i] = p[j];
		p[j] = t;
	}
	for (size_t i = 0; i < N / 2; i++)
		HOT_ASSERT(ts_alloc_release(a, p[i]));
	HOT_ASSERT(ts_alloc_check(a));
	st = stats_of(a);
	HOT_CMP(st.num_free_blocks, >, N / 8);
	/* Refill from the holes (best fit searches a big free tree). */
	for (size_t i = 0; i < N / 2; i++)
		HOT_ASSERT(ts_alloc_alloc(a, 1 + rng_below(&r, 16 * U), &p[i]));
	HOT_ASSERT(ts_alloc_check(a));
	for (size_t i = 0; i < N; i++)
		HOT_ASSERT(ts_alloc_release(a, p[i]));
	st = stats_of(a);
	HOT_CMP(st.num_free_blocks, ==, 1);
	HOT_CMP(st.largest_free_block, ==, reserved);
	HOT_CMP(st.bytes_in_use, ==, 0);
	HOT_ASSERT(ts_alloc_check(a));
	free(p);
	ts_alloc_free(a);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("allocator");
	TCase *basic = tcase_create("basic");
	TCase *random = tcase_create("random");
	TCase *scale = tcase_create("scale");

	tcase_add_test(basic, test_new_alignment);
	tcase_add_test(basic, test_round);
	tcase_add_test(basic, test_alloc_rounds_to_alignment_only);
	tcase_add_test(basic, test_alignment_one);
	tcase_add_test(basic, test_add_region_args);
	tcase_add_test(basic, test_remove_region_only_when_empty);
	tcase_add_test(basic, test_region_of_and_idle);
	tcase_add_test(basic, test_best_fit_smallest_then_lowest);
	tcase_add_test(basic, test_best_fit_ties_across_regions);
	tcase_add_test(basic, test_coalesce_left);
	tcase_add_test(basic, test_coalesce_right);
	tcase_add_test(basic, test_coalesce_both);
	tcase_add_test(basic, test_no_coalesce_across_regions);
	tcase_add_test(basic, test_exhaustion);
	tcase_add_test(basic, test_release_bad_address);
	tcase_add_test(basic, test_stats_exact);
	tcase_add_test(basic, test_largest_free_block_fragmentation);
	tcase_add_test(basic, test_injected_failures);
	suite_add_tcase(s, basic);

	tcase_add_loop_test(random, test_random_against_shadow, 0, 8);
	tcase_set_timeout(random, 60);
	suite_add_tcase(s, random);

	tcase_add_test(scale, test_many_blocks);
	tcase_set_timeout(scale, 60);
	suite_add_tcase(s, scale);
	return s;
}
