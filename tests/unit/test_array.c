/*
 * test_array.c - array versions, buffers and the catalog: names, admission,
 * publish with preconditions, versions and ETags, all-or-nothing publishes,
 * listing, readers keeping old versions alive, and the catalog under
 * concurrent publish/get/delete with exact space accounting afterwards;
 * holds that refuse every writer but the holder, and owners that keep a
 * name's dtype and shape.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "storage/array.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_catalog *cat;
static struct ts_placement dev0;

static void setup(void)
{
	static const struct ts_unit_sim_config sim = {.devices = 2, .device_memory = 16ull << 20,
	                                              .device_fraction = 0.75,
	                                              .pinned = 16ull << 20, .unpinned = 16ull << 20,
	                                              .segment = 1ull << 20};

	ts_unit_sim_new(&sim, &set, &mem, NULL);
	cat = ts_catalog_new();
	ck_assert_ptr_nonnull(cat);
	ts_placement_single(&dev0, ts_device_set_find(set, "sim:0"), TS_MEM_DEVICE, true);
}

static void teardown(void)
{
	ts_catalog_free(cat);
	ts_unit_sim_free(set, mem, NULL);
}

static struct ts_array *make(const char *name, uint64_t n, const struct ts_placement *pl)
{
	struct ts_array_desc d = {.dtype = TS_DT_UINT8, .rank = 1, .shape = {n}};
	struct ts_array *a = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
	ck_assert_msg(ts_array_new(name, &d, pl, mem, &a, &err) == TS_OK, "%s", err.message);
	return a;
}

static uint64_t in_use(const char *dev, enum ts_memory_kind k)
{
	struct ts_space_stats s;

	ts_space_stats(ts_memory_find(mem, dev, k), &s);
	return s.bytes_in_use;
}

START_TEST(test_name_rules)
{
	char longest[129];

	memset(longest, 'a', 128);
	longest[128] = '\0';
	ck_assert(ts_array_name_valid("w1"));
	ck_assert(ts_array_name_valid("model.adam.mu-w_1"));
	ck_assert(ts_array_name_valid(longest));
	longest[127] = '\0';
	ck_assert(ts_array_name_valid(longest));
	memset(longest, 'a', 128);
	ck_assert(!ts_array_name_valid(""));
	ck_assert(!ts_array_name_valid(NULL));
	ck_assert(!ts_array_name_valid(".hidden"));
	ck_assert(!ts_array_name_valid("-x"));
	ck_assert(!ts_array_name_valid("a/b"));
	ck_assert(!ts_array_name_valid("a:put"));
	ck_assert(!ts_array_name_valid("a b"));
	{
		char too_long[130];

		memset(too_long, 'a', 129);
		too_long[129] = '\0';
		ck_assert(!ts_array_name_valid(too_long));
	}
}
END_TEST

START_TEST(test_desc_overflow)
{
	struct ts_array_desc d = {.dtype = TS_DT_FLOAT64, .rank = 3,
	                          .shape = {1ull << 30, 1ull << 30, 1ull << 10}};
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_INVALID_ARGUMENT);
	d = (struct ts_array_desc){.dtype = TS_DT_FLOAT32, .rank = 0};
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
	ck_assert_uint_eq(d.nbytes, 4);
	d = (struct ts_array_desc){.dtype = TS_DT_FLOAT32, .rank = 33};
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_admission_refusal_changes_nothing)
{
	struct ts_array_desc d = {.dtype = TS_DT_UINT8, .rank = 1, .shape = {17ull << 20}};
	struct ts_array *a = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
	ck_assert_int_eq(ts_array_new("big", &d, &dev0, mem, &a, &err), TS_RESOURCE_EXHAUSTED);
	ck_assert_ptr_null(a);
	ck_assert_str_eq(err.reason, "OUT_OF_MEMORY");
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 0);
}
END_TEST

START_TEST(test_publish_versions_etags)
{
	struct ts_array *a = make("w", 100, &dev0), *b = make("w", 200, &dev0), *got;
	struct ts_precondition create = {.create_only = true};
	struct ts_error err;
	bool replaced = true;
	char etag1[32];

	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, &create, &replaced, &err), TS_OK);
	ck_assert(!replaced);
	ck_assert_uint_eq(ts_array_version(a), 1);
	strcpy(etag1, ts_array_etag(a));
	ck_assert_int_eq(etag1[0], '"');
	/* create-only refuses; If-Match with a wrong tag refuses; both change nothing */
	ck_assert_int_eq(ts_catalog_put(cat, b, &create, &replaced, &err), TS_ALREADY_EXISTS);
	ts_error_clear(&err);
	{
		struct ts_precondition wrong = {.if_match = "\"nope\""};

		ck_assert_int_eq(ts_catalog_put(cat, b, &wrong, &replaced, &err), TS_FAILED_PRECONDITION);
	}
	got = ts_catalog_get(cat, "w");
	ck_assert_ptr_eq(got, a);
	ts_array_unref(got);
	ts_error_clear(&err);
	{
		struct ts_precondition right = {.if_match = etag1};

		ck_assert_int_eq(ts_catalog_put(cat, b, &right, &replaced, &err), TS_OK);
	}
	ck_assert(replaced);
	ck_assert_uint_eq(ts_array_version(b), 2);
	ck_assert_str_ne(ts_array_etag(b), etag1);
	ck_assert_uint_eq(ts_array_created_ns(b), ts_array_created_ns(a));
	/* a is out of the catalog but alive while we hold it */
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 300);
	ts_array_unref(a);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 200);
	ts_array_unref(b);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 200);    /* the catalog's */
	ck_assert_int_eq(ts_catalog_delete(cat, "w", NULL, &err), TS_OK);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 0);
	ck_assert_int_eq(ts_catalog_delete(cat, "w", NULL, &err), TS_NOT_FOUND);
}
END_TEST

START_TEST(test_etag_differs_after_recreate)
{
	struct ts_array *a = make("x", 10, &dev0), *b = make("x", 10, &dev0);
	struct ts_error err;
	char first[32];

	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	strcpy(first, ts_array_etag(a));
	ck_assert_int_eq(ts_catalog_delete(cat, "x", NULL, &err), TS_OK);
	ck_assert_int_eq(ts_catalog_put(cat, b, NULL, NULL, &err), TS_OK);
	ck_assert_uint_eq(ts_array_version(b), 1);
	ck_assert_str_ne(ts_array_etag(b), first);
	ts_array_unref(a);
	ts_array_unref(b);
}
END_TEST

START_TEST(test_put_all_is_all_or_nothing)
{
	struct ts_array *x = make("x", 10, &dev0), *y = make("y", 10, &dev0), *y2 = make("y", 5, &dev0);
	struct ts_array *z = make("z", 10, &dev0);
	struct ts_array *set1[] = {y}, *set2[] = {x, y2, z}, *dup[] = {x, x};
	struct ts_error err;
	uint64_t count, bytes;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put_all(cat, set1, 1, false, &err), TS_OK);
	ck_assert_int_eq(ts_catalog_put_all(cat, set2, 3, false, &err), TS_ALREADY_EXISTS);
	ck_assert_ptr_nonnull(strstr(err.message, "'y'"));
	ts_catalog_totals(cat, &count, &bytes);
	ck_assert_uint_eq(count, 1);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put_all(cat, dup, 2, true, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put_all(cat, set2, 3, true, &err), TS_OK);
	ts_catalog_totals(cat, &count, &bytes);
	ck_assert_uint_eq(count, 3);
	ck_assert_uint_eq(bytes, 25);
	ts_array_unref(x);
	ts_array_unref(y);
	ts_array_unref(y2);
	ts_array_unref(z);
}
END_TEST

static bool only_pinned(const struct ts_array *a, void *arg)
{
	(void)arg;
	return ts_array_placement(a)->sharding.memory_kind == TS_MEM_PINNED_HOST;
}

START_TEST(test_list_pages_in_name_order)
{
	static const char *const names[] = {"e", "a", "d", "c", "b", "f", "g"};
	struct ts_placement pinned = dev0;
	struct ts_array **page;
	struct ts_error err;
	size_t n;
	bool more;

	pinned.sharding.memory_kind = TS_MEM_PINNED_HOST;
	ts_error_clear(&err);
	for (size_t i = 0; i < 7; i++) {
		struct ts_array *a = make(names[i], 1, i % 2 ? &pinned : &dev0);

		ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
		ts_array_unref(a);
	}
	ck_assert_int_eq(ts_catalog_list(cat, NULL, 3, NULL, NULL, &page, &n, &more, &err), TS_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert(more);
	ck_assert_str_eq(ts_array_name(page[0]), "a");
	ck_assert_str_eq(ts_array_name(page[2]), "c");
	ts_catalog_list_free(page, n);
	ck_assert_int_eq(ts_catalog_list(cat, "c", 10, NULL, NULL, &page, &n, &more, &err), TS_OK);
	ck_assert_uint_eq(n, 4);
	ck_assert(!more);
	ck_assert_str_eq(ts_array_name(page[0]), "d");
	ts_catalog_list_free(page, n);
	ck_assert_int_eq(ts_catalog_list(cat, NULL, 10, only_pinned, NULL, &page, &n, &more, &err), TS_OK);
	ck_assert_uint_eq(n, 3);   /* a, c, d: indexes 1, 3, 5 of names */
	ts_catalog_list_free(page, n);
}
END_TEST

START_TEST(test_many_names_grow_the_table)
{
	struct ts_error err;
	char name[16];
	uint64_t count, bytes;

	ts_error_clear(&err);
	for (int i = 0; i < 2000; i++) {
		struct ts_array *a;

		snprintf(name, sizeof name, "n%d", i);
		a = make(name, 8, &dev0);
		ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
		ts_array_unref(a);
	}
	for (int i = 0; i < 2000; i += 7) {
		struct ts_array *a;

		snprintf(name, sizeof name, "n%d", i);
		a = ts_catalog_get(cat, name);
		ck_assert_ptr_nonnull(a);
		ck_assert_str_eq(ts_array_name(a), name);
		ts_array_unref(a);
	}
	ts_catalog_totals(cat, &count, &bytes);
	ck_assert_uint_eq(count, 2000);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 16000);
}
END_TEST

struct worker {
	unsigned seed;
	int iterations;
};

static void *churn(void *arg)
{
	struct worker *w = arg;
	static const char *const names[] = {"p", "q", "r", "s"};
	struct ts_placement pl[3];
	struct ts_error err;

	pl[0] = dev0;
	ts_placement_single(&pl[1], dev0.sharding.device, TS_MEM_PINNED_HOST, true);
	ts_placement_single(&pl[2], ts_device_set_find(set, "sim:1"), TS_MEM_DEVICE, true);
	for (int i = 0; i < w->iterations; i++) {
		const char *name = names[rand_r(&w->seed) % 4];
		int op = rand_r(&w->seed) % 3;

		ts_error_clear(&err);
		if (op == 0) {
			struct ts_array_desc d = {.dtype = TS_DT_UINT8, .rank = 1,
			                          .shape = {(uint64_t)(rand_r(&w->seed) % 4096)}};
			struct ts_array *a = NULL;

			ts_array_desc_init(&d, &err);
			if (ts_array_new(name, &d, &pl[rand_r(&w->seed) % 3], mem, &a, &err) == TS_OK) {
				ts_catalog_put(cat, a, NULL, NULL, &err);
				ts_array_unref(a);
			}
		} else if (op == 1) {
			struct ts_array *a = ts_catalog_get(cat, name);

			if (a && ts_buffer_size(ts_array_single_buffer(a)) != ts_array_desc(a)->nbytes)
				abort();
			ts_array_unref(a);
		} else {
			ts_catalog_delete(cat, name, NULL, &err);
		}
	}
	return NULL;
}

START_TEST(test_concurrent_churn_keeps_stats_exact)
{
	pthread_t th[4];
	struct worker w[4];
	struct ts_array **all;
	struct ts_error err;
	size_t n;
	bool more;
	uint64_t want[3] = {0, 0, 0};

	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){.seed = (unsigned)(i * 7919 + 1), .iterations = 20000};
		ck_assert_int_eq(pthread_create(&th[i], NULL, churn, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_list(cat, NULL, 100, NULL, NULL, &all, &n, &more, &err), TS_OK);
	for (size_t i = 0; i < n; i++) {
		const struct ts_placement *p = ts_array_placement(all[i]);
		int slot = p->sharding.memory_kind == TS_MEM_PINNED_HOST ? 1
		           : strcmp(ts_device_props(p->sharding.device)->id, "sim:1") == 0 ? 2 : 0;

		want[slot] += ts_array_desc(all[i])->nbytes;
	}
	ts_catalog_list_free(all, n);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), want[0]);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_PINNED_HOST), want[1]);
	ck_assert_uint_eq(in_use("sim:1", TS_MEM_DEVICE), want[2]);
}
END_TEST


/* A hold refuses every writer but its holder, whose new version stays held,
 * until it is released. */
START_TEST(test_holds_refuse_other_writers)
{
	struct ts_array *a = make("w", 8, &dev0), *b = make("w", 8, &dev0), *c = make("w", 8, &dev0);
	struct ts_array *other = make("o", 8, &dev0), *got;
	struct ts_precondition mine = {.holder = "op-1"}, theirs = {.holder = "op-2"};
	const char *both[] = {"w", "o"};
	struct ts_error err;
	char who[40];

	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	ck_assert_int_eq(ts_catalog_put(cat, other, NULL, NULL, &err), TS_OK);
	ck_assert(!ts_catalog_held(cat, "w", who, sizeof who));
	ck_assert_int_eq(ts_catalog_hold(cat, &a, 1, "op-1", &err), TS_OK);
	ck_assert(ts_catalog_held(cat, "w", who, sizeof who));
	ck_assert_str_eq(who, "op-1");
	/* a second holder, a plain writer, another holder's publish and deletes: refused */
	ck_assert_int_eq(ts_catalog_hold(cat, &a, 1, "op-2", &err), TS_ABORTED);
	ck_assert_str_eq(err.reason, "ARRAY_HELD");
	ck_assert_ptr_nonnull(strstr(err.message, "op-1"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, b, NULL, NULL, &err), TS_ABORTED);
	ck_assert_ptr_nonnull(strstr(err.message, "op-1"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, b, &theirs, NULL, &err), TS_ABORTED);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put_all(cat, &b, 1, true, &err), TS_ABORTED);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_delete(cat, "w", NULL, &err), TS_ABORTED);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_delete_all(cat, both, 2, NULL, &err), TS_ABORTED);
	ck_assert_ptr_eq((got = ts_catalog_get(cat, "o")), other);   /* none of the set went */
	ts_array_unref(got);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_check_write(cat, "w", NULL, NULL, &err), TS_ABORTED);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_check_write(cat, "w", NULL, &mine, &err), TS_OK);
	/* the holder publishes; its new version stays held */
	ck_assert_int_eq(ts_catalog_put(cat, b, &mine, NULL, &err), TS_OK);
	ck_assert(ts_catalog_held(cat, "w", who, sizeof who));
	ck_assert_int_eq(ts_catalog_put(cat, c, NULL, NULL, &err), TS_ABORTED);
	ts_error_clear(&err);
	/* released: anyone writes again */
	ts_catalog_release(cat, "op-1");
	ck_assert(!ts_catalog_held(cat, "w", NULL, 0));
	ck_assert_int_eq(ts_catalog_put(cat, c, NULL, NULL, &err), TS_OK);
	/* a hold is on a version: one no longer current cannot be held */
	ck_assert_int_eq(ts_catalog_hold(cat, &b, 1, "op-3", &err), TS_ABORTED);
	ck_assert_str_eq(err.reason, "ARRAY_CHANGED");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_delete_all(cat, both, 2, NULL, &err), TS_OK);
	ck_assert_ptr_null(ts_catalog_get(cat, "w"));
	ck_assert_ptr_null(ts_catalog_get(cat, "o"));
	ts_array_unref(a);
	ts_array_unref(b);
	ts_array_unref(c);
	ts_array_unref(other);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 0);
}
END_TEST

/* A replacement prepared before bytes change publishes without allocating:
 * only over an existing name, with the holder's rights, as a new version. */
START_TEST(test_replace_publishes_a_prepared_version)
{
	struct ts_array *a = make("r", 8, &dev0), *v = NULL, *w = NULL, *got;
	struct ts_precondition mine = {.holder = "op-9"}, theirs = {.holder = "op-8"};
	struct ts_error err;
	uint64_t before;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	ck_assert_int_eq(ts_catalog_hold(cat, &a, 1, "op-9", &err), TS_OK);
	before = ts_array_version(a);
	ck_assert_int_eq(ts_array_new_version(a, &v, &err), TS_OK);
	ck_assert_int_eq(ts_array_new_version(a, &w, &err), TS_OK);
	/* another holder and a plain writer are refused; nothing changes */
	ck_assert_int_eq(ts_catalog_replace(cat, v, &theirs, &err), TS_ABORTED);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_replace(cat, v, NULL, &err), TS_ABORTED);
	ts_error_clear(&err);
	ck_assert_ptr_eq((got = ts_catalog_get(cat, "r")), a);
	ts_array_unref(got);
	/* the holder: a new version, still held, the same bytes */
	ck_assert_int_eq(ts_catalog_replace(cat, v, &mine, &err), TS_OK);
	got = ts_catalog_get(cat, "r");
	ck_assert_ptr_eq(got, v);
	ck_assert_uint_eq(ts_array_version(got), before + 1);
	ck_assert_str_ne(ts_array_etag(got), ts_array_etag(a));
	ck_assert_ptr_eq(ts_array_single_buffer(got), ts_array_single_buffer(a));
	ck_assert(ts_catalog_held(cat, "r", NULL, 0));
	ts_array_unref(got);
	ts_catalog_release(cat, "op-9");
	/* only over an existing name */
	ck_assert_int_eq(ts_catalog_delete(cat, "r", NULL, &err), TS_OK);
	ck_assert_int_eq(ts_catalog_replace(cat, w, NULL, &err), TS_NOT_FOUND);
	ck_assert_ptr_null(ts_catalog_get(cat, "r"));
	ts_array_unref(a);
	ts_array_unref(v);
	ts_array_unref(w);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 0);
}
END_TEST

/* An owned name keeps its dtype and shape, passes its owner to the versions
 * that replace it, and is deleted only by its owner. */
START_TEST(test_owners_keep_shape)
{
	struct ts_array *a = make("m.w1", 8, &dev0), *same = make("m.w1", 8, &dev0);
	struct ts_array *wider = make("m.w1", 9, &dev0), *v = NULL;
	struct ts_precondition owner = {.owner = "model 'm'"};
	struct ts_array_desc d = {.dtype = TS_DT_FLOAT32, .rank = 1, .shape = {2}};
	struct ts_error err;

	ts_error_clear(&err);
	ts_array_set_owner(a, "model 'm'");
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	ck_assert_int_eq(ts_catalog_put(cat, wider, NULL, NULL, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "OWNED_SHAPE");
	ck_assert_ptr_nonnull(strstr(err.message, "model 'm'"));
	ck_assert_ptr_nonnull(strstr(err.message, "uint8 [8]"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
	ck_assert_int_eq(ts_catalog_check_write(cat, "m.w1", &d, NULL, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, same, NULL, NULL, &err), TS_OK);
	ck_assert_str_eq(ts_array_owner(same), "model 'm'");
	ck_assert_int_eq(ts_catalog_delete(cat, "m.w1", NULL, &err), TS_FAILED_PRECONDITION);
	ck_assert_str_eq(err.reason, "ARRAY_OWNED");
	ts_error_clear(&err);
	/* a new version of the same buffers: a new ETag, the owner kept */
	ck_assert_int_eq(ts_array_new_version(same, &v, &err), TS_OK);
	ck_assert_ptr_eq(ts_array_single_buffer(v), ts_array_single_buffer(same));
	ck_assert_int_eq(ts_catalog_put(cat, v, NULL, NULL, &err), TS_OK);
	ck_assert_uint_eq(ts_array_version(v), ts_array_version(same) + 1);
	ck_assert_str_ne(ts_array_etag(v), ts_array_etag(same));
	ck_assert_str_eq(ts_array_owner(v), "model 'm'");
	ck_assert_int_eq(ts_catalog_delete(cat, "m.w1", &owner, &err), TS_OK);
	ts_array_unref(a);
	ts_array_unref(same);
	ts_array_unref(wider);
	ts_array_unref(v);
	ck_assert_uint_eq(in_use("sim:0", TS_MEM_DEVICE), 0);
}
END_TEST

/* A published version is never written: its setters stop the process (an
 * assertion, in every build with assertions). */
START_TEST(test_setters_refuse_published)
{
	struct ts_array *a = make("sealed", 64, &dev0);
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	ts_array_set_owner(a, "model 'm'");       /* aborts here */
	ts_array_unref(a);
}
END_TEST

START_TEST(test_unpublished_setters_work)
{
	struct ts_array *a = make("open", 64, &dev0), *b;
	struct ts_precondition owner = {.owner = "model 'm'"};
	struct ts_error err;

	ts_array_set_owner(a, "model 'm'");
	ts_array_set_implicit_bytes(a, 7);
	ts_array_set_metadata(a, json_pack("{s:s}", "k", "v"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	b = ts_catalog_get(cat, "open");
	ck_assert_str_eq(ts_array_owner(b), "model 'm'");
	ck_assert_uint_eq(ts_array_implicit_bytes(b), 7);
	ck_assert_str_eq(json_string_value(json_object_get(ts_array_metadata(b), "k")), "v");
	ck_assert_int_eq(ts_catalog_delete(cat, "open", &owner, &err), TS_OK);   /* seal intact */
	ts_array_unref(b);
	ts_array_unref(a);
}
END_TEST

/* A version's metadata is its own: a new version of it carries an equal
 * copy, never the same value, so no two versions (which other threads drop
 * whenever they like) count references to one jansson value. */
START_TEST(test_new_version_copies_metadata)
{
	struct ts_array *a = make("mv", 64, &dev0), *v;
	struct ts_error err;

	ts_array_set_metadata(a, json_pack("{s:s}", "k", "v"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	ck_assert_int_eq(ts_array_new_version(a, &v, &err), TS_OK);
	ck_assert_ptr_nonnull(ts_array_metadata(v));
	ck_assert_ptr_ne(ts_array_metadata(v), ts_array_metadata(a));
	ck_assert(json_equal((json_t *)ts_array_metadata(v), (json_t *)ts_array_metadata(a)));
	ck_assert_uint_eq(ts_array_metadata(a)->refcount, 1);
	ck_assert_uint_eq(ts_array_metadata(v)->refcount, 1);
	ck_assert_int_eq(ts_catalog_replace(cat, v, NULL, &err), TS_OK);
	ts_array_unref(a);               /* the old version goes with its own value */
	ck_assert_str_eq(json_string_value(json_object_get(ts_array_metadata(v), "k")), "v");
	ck_assert_int_eq(ts_catalog_delete(cat, "mv", NULL, &err), TS_OK);
	ts_array_unref(v);
}
END_TEST

/* Metadata someone else still holds a reference to is refused (an
 * assertion): the version would share it with that holder's thread. */
START_TEST(test_shared_metadata_refused)
{
	struct ts_array *a = make("shared", 64, &dev0);
	json_t *meta = json_pack("{s:s}", "k", "v");

	ts_array_set_metadata(a, json_incref(meta));     /* aborts here */
	json_decref(meta);
	ts_array_unref(a);
}
END_TEST

#if TS_DEBUG
/* Debug builds seal a version at publish: metadata changed in place through
 * the borrowed pointer is caught when the version is deleted. */
START_TEST(test_seal_catches_a_changed_version)
{
	struct ts_array *a = make("meta", 64, &dev0);
	struct ts_error err;

	ts_array_set_metadata(a, json_pack("{s:s}", "k", "v"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	/* what the const forbids, done on purpose */
	json_object_set_new((json_t *)ts_array_metadata(a), "k", json_string("changed"));
	ts_catalog_delete(cat, "meta", NULL, &err);     /* aborts here */
	ts_array_unref(a);
}
END_TEST
#endif

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("array");
	TCase *tc = tcase_create("catalog");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_name_rules);
	tcase_add_test(tc, test_desc_overflow);
	tcase_add_test(tc, test_admission_refusal_changes_nothing);
	tcase_add_test(tc, test_publish_versions_etags);
	tcase_add_test(tc, test_etag_differs_after_recreate);
	tcase_add_test(tc, test_put_all_is_all_or_nothing);
	tcase_add_test(tc, test_list_pages_in_name_order);
	tcase_add_test(tc, test_many_names_grow_the_table);
	tcase_add_test(tc, test_concurrent_churn_keeps_stats_exact);
	tcase_add_test(tc, test_holds_refuse_other_writers);
	tcase_add_test(tc, test_owners_keep_shape);
	tcase_add_test(tc, test_replace_publishes_a_prepared_version);
	tcase_add_test(tc, test_unpublished_setters_work);
	tcase_add_test_raise_signal(tc, test_setters_refuse_published, SIGABRT);
	tcase_add_test(tc, test_new_version_copies_metadata);
	tcase_add_test_raise_signal(tc, test_shared_metadata_refused, SIGABRT);
#if TS_DEBUG
	tcase_add_test_raise_signal(tc, test_seal_catches_a_changed_version, SIGABRT);
#endif
	suite_add_tcase(s, tc);
	return s;
}
