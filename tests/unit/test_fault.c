/*
 * test_fault.c - Check suite "fault": the failure points of common/fault.h.
 * In a production build every point is inert whatever happens; in a fault
 * build (make FAULT=1) a kind counts its points from the last arm and fails
 * exactly the armed one, once, and no other kind's.
 */
#include "common/fault.h"
#include "tests/unit/unit.h"

#include <check.h>
#include <stdlib.h>

#ifndef TS_FAULT_BUILD

START_TEST(test_inert_in_production)
{
	for (int i = 0; i < 1000; i++)
		for (int k = 0; k < TS_FAULT_KIND_COUNT; k++)
			ck_assert(!ts_fault_fire((enum ts_fault_kind)k));
	for (int i = 0; i < 100; i++) {
		void *p = ts_fault_malloc(16), *q = ts_fault_calloc(2, 8);

		ck_assert(p && q);
		free(p);
		free(q);
	}
}
END_TEST

#else

START_TEST(test_counts_and_fails_the_armed_point)
{
	enum ts_fault_kind kind, k;
	uint64_t at;

	ts_fault_arm(TS_FAULT_ALLOC_PINNED, 0);
	for (int i = 0; i < 5; i++)
		ck_assert(!ts_fault_fire(TS_FAULT_ALLOC_PINNED));
	ck_assert_uint_eq(ts_fault_count(TS_FAULT_ALLOC_PINNED), 5);
	ck_assert_uint_eq(ts_fault_fired(), 0);

	ts_fault_arm(TS_FAULT_COPY, 3);
	ck_assert_uint_eq(ts_fault_count(TS_FAULT_ALLOC_PINNED), 0);   /* reset by the arm */
	ts_fault_armed(&kind, &at);
	ck_assert_int_eq(kind, TS_FAULT_COPY);
	ck_assert_uint_eq(at, 3);
	for (int i = 0; i < 5; i++)
		ck_assert(!ts_fault_fire(TS_FAULT_ALLOC_HEAP));   /* another kind's points */
	ck_assert(!ts_fault_fire(TS_FAULT_COPY));
	ck_assert(!ts_fault_fire(TS_FAULT_COPY));
	ck_assert(ts_fault_fire(TS_FAULT_COPY));
	ck_assert(!ts_fault_fire(TS_FAULT_COPY));               /* once */
	ck_assert_uint_eq(ts_fault_count(TS_FAULT_COPY), 4);
	ck_assert_uint_eq(ts_fault_count(TS_FAULT_ALLOC_HEAP), 5);
	ck_assert_uint_eq(ts_fault_fired(), 1);

	ts_fault_arm(TS_FAULT_ALLOC_HEAP, 1);
	ck_assert_ptr_null(ts_fault_malloc(8));
	{
		void *p = ts_fault_calloc(1, 8);

		ck_assert_ptr_nonnull(p);
		free(p);
	}
	ts_fault_arm(TS_FAULT_ALLOC_HEAP, 0);

	ck_assert(ts_fault_kind_parse("alloc_device", &k) && k == TS_FAULT_ALLOC_DEVICE);
	ck_assert(ts_fault_kind_parse("copy", &k) && k == TS_FAULT_COPY);
	ck_assert(!ts_fault_kind_parse("alloc", &k));
	ck_assert(!ts_fault_kind_parse(NULL, &k));
	ck_assert_str_eq(ts_fault_kind_name(TS_FAULT_ALLOC_PAGEABLE), "alloc_pageable");
	ck_assert(!ts_fault_fire(TS_FAULT_KIND_COUNT));
}
END_TEST

#endif

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("fault");
	TCase *tc = tcase_create("points");

#ifndef TS_FAULT_BUILD
	tcase_add_test(tc, test_inert_in_production);
#else
	tcase_add_test(tc, test_counts_and_fails_the_armed_point);
#endif
	suite_add_tcase(s, tc);
	return s;
}
