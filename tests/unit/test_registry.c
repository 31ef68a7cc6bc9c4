/*
 * test_registry.c - the one name -> value map (common/registry.h): puts,
 * replaces and removes kept in name order, binary-search lookup, pages
 * after a cursor, the name rule, and reserved room.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/name.h"
#include "common/registry.h"
#include "common/status.h"
#include "tests/unit/unit.h"

struct item {
	char name[TS_NAME_MAX + 1];
	int v;
};

/* Invariant: strictly increasing names, each the name of its value. */
static void check_sorted(const struct ts_registry *r)
{
	for (size_t i = 0; i < ts_registry_count(r); i++) {
		const struct item *it = ts_registry_at(r, i);

		ck_assert_ptr_eq(r->v[i].value, it);
		ck_assert_str_eq(r->v[i].name, it->name);
		if (i)
			ck_assert_int_lt(strcmp(r->v[i - 1].name, r->v[i].name), 0);
	}
}

static struct item *item_new(const char *name, int v)
{
	struct item *it = calloc(1, sizeof *it);

	ck_assert_ptr_nonnull(it);
	snprintf(it->name, sizeof it->name, "%s", name);
	it->v = v;
	return it;
}

/* Puts the names n-1 .. 0 (reverse order) as "k%03d". */
static void fill(struct ts_registry *r, struct item **items, int n)
{
	for (int i = n - 1; i >= 0; i--) {
		char name[16];
		struct ts_error err = {0};

		snprintf(name, sizeof name, "k%03d", i);
		items[i] = item_new(name, i);
		ck_assert_int_eq(ts_registry_put(r, items[i]->name, items[i], NULL, &err), TS_OK);
	}
}

static void drop_all(struct ts_registry *r, struct item **items, int n)
{
	ts_registry_release(r);
	for (int i = 0; i < n; i++)
		free(items[i]);
}

START_TEST(test_registry_put_get_in_name_order)
{
	struct ts_registry r;
	struct item *items[200];

	ts_registry_init(&r);
	ck_assert_ptr_null(ts_registry_get(&r, "k000"));
	fill(&r, items, 200);
	ck_assert_uint_eq(ts_registry_count(&r), 200);
	check_sorted(&r);
	for (int i = 0; i < 200; i++) {
		char name[16];

		snprintf(name, sizeof name, "k%03d", i);
		ck_assert_ptr_eq(ts_registry_get(&r, name), items[i]);
		ck_assert_ptr_eq(ts_registry_at(&r, (size_t)i), items[i]);
	}
	ck_assert_ptr_null(ts_registry_get(&r, "k200"));
	ck_assert_ptr_null(ts_registry_get(&r, "k"));
	ck_assert_ptr_null(ts_registry_get(&r, NULL));
	ck_assert_ptr_null(ts_registry_at(&r, 200));
	drop_all(&r, items, 200);
	ck_assert_uint_eq(ts_registry_count(&r), 0);
}
END_TEST

START_TEST(test_registry_replace_and_refuse)
{
	struct ts_registry r;
	struct ts_error err = {0};
	struct item *a = item_new("same", 1), *b = item_new("same", 2);
	void *old = a;

	ts_registry_init(&r);
	ck_assert_int_eq(ts_registry_put(&r, a->name, a, &old, &err), TS_OK);
	ck_assert_ptr_null(old);
	/* without old, a present name is refused and nothing changes */
	ck_assert_int_eq(ts_registry_put(&r, b->name, b, NULL, &err), TS_ALREADY_EXISTS);
	ck_assert_str_eq(err.reason, "NAME_EXISTS");
	ck_assert_ptr_eq(ts_registry_get(&r, "same"), a);
	/* with old, replaced; the name now borrowed from the new value */
	ck_assert_int_eq(ts_registry_put(&r, b->name, b, &old, NULL), TS_OK);
	ck_assert_ptr_eq(old, a);
	ck_assert_ptr_eq(ts_registry_get(&r, "same"), b);
	ck_assert_ptr_eq(r.v[0].name, b->name);
	ck_assert_uint_eq(ts_registry_count(&r), 1);
	free(a);
	ck_assert_ptr_eq(ts_registry_remove(&r, "same"), b);
	ck_assert_ptr_null(ts_registry_remove(&r, "same"));
	ck_assert_uint_eq(ts_registry_count(&r), 0);
	free(b);
	ts_registry_release(&r);
}
END_TEST

START_TEST(test_registry_refuses_bad_names)
{
	static const char *const bad[] = {"", ".a", "-a", "a/b", "a b", "a:b", NULL};
	char long_name[TS_NAME_MAX + 2];
	struct ts_registry r;
	int x;

	ts_registry_init(&r);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct ts_error err = {0};

		ck_assert_int_eq(ts_registry_put(&r, bad[i], &x, NULL, &err), TS_INVALID_ARGUMENT);
		ck_assert_str_eq(err.reason, "BAD_NAME");
	}
	memset(long_name, 'a', sizeof long_name - 1);
	long_name[sizeof long_name - 1] = '\0';
	ck_assert_int_eq(ts_registry_put(&r, long_name, &x, NULL, NULL), TS_INVALID_ARGUMENT);
	long_name[TS_NAME_MAX - 1] = '\0';    /* the longest valid name */
	ck_assert_int_eq(ts_registry_put(&r, long_name, &x, NULL, NULL), TS_OK);
	ck_assert_uint_eq(ts_registry_count(&r), 1);
	ts_registry_release(&r);
}
END_TEST

START_TEST(test_registry_remove_keeps_order)
{
	struct ts_registry r;
	struct item *items[50];

	ts_registry_init(&r);
	fill(&r, items, 50);
	for (int i = 0; i < 50; i += 3)
		ck_assert_ptr_eq(ts_registry_remove(&r, items[i]->name), items[i]);
	check_sorted(&r);
	ck_assert_uint_eq(ts_registry_count(&r), 50 - 17);
	for (int i = 0; i < 50; i++)
		ck_assert_ptr_eq(ts_registry_get(&r, items[i]->name), i % 3 ? items[i] : NULL);
	drop_all(&r, items, 50);
}
END_TEST

static bool even(const void *value, void *arg)
{
	(void)arg;
	return ((const struct item *)value)->v % 2 == 0;
}

START_TEST(test_registry_pages_after_a_cursor)
{
	struct ts_registry r;
	struct item *items[30];
	void *page[7];
	const char *after = NULL;
	bool more = true;
	int seen = 0;

	ts_registry_init(&r);
	fill(&r, items, 30);
	ck_assert_uint_eq(ts_registry_seek(&r, NULL), 0);
	ck_assert_uint_eq(ts_registry_seek(&r, "k004"), 5);
	ck_assert_uint_eq(ts_registry_seek(&r, "k004a"), 5);   /* absent cursors work too */
	ck_assert_uint_eq(ts_registry_seek(&r, "zzz"), 30);
	/* walk every page of the even values: each once, in order */
	while (more) {
		size_t n = ts_registry_list(&r, after, 7, even, NULL, page, &more);

		for (size_t i = 0; i < n; i++, seen++)
			ck_assert_ptr_eq(page[i], items[seen * 2]);
		ck_assert(n == 7 || !more);
		if (n)
			after = ((struct item *)page[n - 1])->name;
	}
	ck_assert_int_eq(seen, 15);
	/* an exact page says nothing more remains */
	ck_assert_uint_eq(ts_registry_list(&r, "k015", 7, NULL, NULL, page, &more), 7);
	ck_assert(more);
	ck_assert_uint_eq(ts_registry_list(&r, "k022", 7, NULL, NULL, page, &more), 7);
	ck_assert(!more);
	ck_assert_ptr_eq(page[0], items[23]);
	ck_assert_uint_eq(ts_registry_list(&r, "k029", 7, NULL, NULL, page, &more), 0);
	ck_assert(!more);
	ck_assert_uint_eq(ts_registry_list(&r, NULL, 0, NULL, NULL, page, &more), 0);
	ck_assert(more);
	drop_all(&r, items, 30);
}
END_TEST

START_TEST(test_registry_reserved_room_is_kept)
{
	struct ts_registry r;
	struct item *items[40];
	struct ts_error err = {0};

	ts_registry_init(&r);
	ck_assert_int_eq(ts_registry_reserve(&r, 40, &err), TS_OK);
	ck_assert_uint_ge(r.cap, 40);
	{
		struct ts_registry_entry *v = r.v;

		fill(&r, items, 40);
		ck_assert_ptr_eq(r.v, v);      /* no growth after the reserve */
	}
	ck_assert_int_eq(ts_registry_reserve(&r, (size_t)-1 / 2, &err), TS_RESOURCE_EXHAUSTED);
	ck_assert_str_eq(err.reason, "OUT_OF_MEMORY");
	ck_assert_uint_eq(ts_registry_count(&r), 40);
	check_sorted(&r);
	drop_all(&r, items, 40);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("registry");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_registry_put_get_in_name_order);
	tcase_add_test(tc, test_registry_replace_and_refuse);
	tcase_add_test(tc, test_registry_refuses_bad_names);
	tcase_add_test(tc, test_registry_remove_keeps_order);
	tcase_add_test(tc, test_registry_pages_after_a_cursor);
	tcase_add_test(tc, test_registry_reserved_room_is_kept);
	suite_add_tcase(s, tc);
	return s;
}
