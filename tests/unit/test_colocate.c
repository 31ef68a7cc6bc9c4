/*
 * test_colocate.c - committed arrays never move and refuse to mix across
 * devices; uncommitted ones follow, byte-exact, counted once per move.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "storage/array_io.h"
#include "storage/colocate.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_stager *stg;
static struct ts_catalog *cat;

static void setup(void)
{
	static const struct ts_unit_sim_config sim = {.devices = 3, .device_memory = 16ull << 20,
	                                              .device_fraction = 0.75,
	                                              .pinned = 32ull << 20, .unpinned = 32ull << 20,
	                                              .segment = 4ull << 20};

	ts_unit_sim_new(&sim, &set, &mem, &stg);
	cat = ts_catalog_new();
}

static void teardown(void)
{
	ts_catalog_free(cat);
	ts_unit_sim_free(set, mem, stg);
}

static struct ts_device *dev(const char *id)
{
	return ts_device_set_find(set, id);
}

/* Publishes an n-byte array of known bytes with metadata meta (stolen, may
 * be NULL: set before the publish, as versions are immutable after it);
 * returns a reference. */
static struct ts_array *publish_meta(const char *name, const char *on, enum ts_memory_kind k,
                                     bool committed, uint64_t n, json_t *meta)
{
	struct ts_array_desc d = {.dtype = TS_DT_UINT8, .rank = 1, .shape = {n}};
	struct ts_placement pl;
	struct ts_array *a;
	struct ts_array_writer *w;
	struct ts_error err;
	unsigned char *bytes = malloc(n);

	for (uint64_t i = 0; i < n; i++)
		bytes[i] = (unsigned char)(i * 7 + name[0]);
	ts_error_clear(&err);
	ts_placement_single(&pl, dev(on), k, committed);
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
	ck_assert_int_eq(ts_array_new(name, &d, &pl, mem, &a, &err), TS_OK);
	ck_assert_int_eq(ts_array_writer_new(stg, a, &w, &err), TS_OK);
	ck_assert_int_eq(ts_array_writer_write(w, bytes, n, &err), TS_OK);
	ck_assert_int_eq(ts_array_writer_finish(w, &err), TS_OK);
	ts_array_writer_free(w);
	if (meta)
		ts_array_set_metadata(a, meta);
	ck_assert_int_eq(ts_catalog_put(cat, a, NULL, NULL, &err), TS_OK);
	free(bytes);
	return a;
}

static struct ts_array *publish(const char *name, const char *on, enum ts_memory_kind k,
                                bool committed, uint64_t n)
{
	return publish_meta(name, on, k, committed, n, NULL);
}

static void expect_bytes(struct ts_array *a, char seed)
{
	uint64_t n = ts_array_desc(a)->nbytes;
	unsigned char *got = malloc(n);
	struct ts_run whole = {0, 0, n};
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_array_read(stg, a, &whole, 1, got, &err), TS_OK);
	for (uint64_t i = 0; i < n; i++)
		ck_assert_uint_eq(got[i], (unsigned char)(i * 7 + seed));
	free(got);
}

START_TEST(test_uncommitted_follow_committed)
{
	struct ts_array *arrs[3] = {publish("p", "sim:1", TS_MEM_DEVICE, true, 1000),
	                            publish("x", "sim:0", TS_MEM_DEVICE, false, 3000),
	                            publish("y", "sim:1", TS_MEM_PINNED_HOST, false, 10)};
	struct ts_device *where = NULL;
	struct ts_error err;
	struct ts_array *cur;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 3, dev("sim:2"), NULL, &where, &err), TS_OK);
	ck_assert_ptr_eq(where, dev("sim:1"));
	/* x moved to sim:1, stays uncommitted and in device memory, counted */
	ck_assert_ptr_eq(ts_array_box(arrs[1], 0)->device, dev("sim:1"));
	ck_assert(!ts_array_placement(arrs[1])->committed);
	ck_assert_uint_eq(ts_array_implicit_bytes(arrs[1]), 3000);
	ck_assert_uint_eq(ts_array_version(arrs[1]), 2);
	expect_bytes(arrs[1], 'x');
	cur = ts_catalog_get(cat, "x");
	ck_assert_ptr_eq(cur, arrs[1]);
	ts_array_unref(cur);
	/* p and y were already there */
	ck_assert_uint_eq(ts_array_version(arrs[0]), 1);
	ck_assert_uint_eq(ts_array_implicit_bytes(arrs[2]), 0);
	ck_assert_uint_eq(ts_stager_implicit(stg), 3000);
	/* the old copy of x on sim:0 is gone */
	{
		struct ts_space_stats s;

		ts_space_stats(ts_memory_find(mem, "sim:0", TS_MEM_DEVICE), &s);
		ck_assert_uint_eq(s.bytes_in_use, 0);
	}
	for (int i = 0; i < 3; i++)
		ts_array_unref(arrs[i]);
}
END_TEST

START_TEST(test_committed_apart_refused)
{
	struct ts_array *arrs[3] = {publish("a", "sim:0", TS_MEM_DEVICE, true, 8),
	                            publish("u", "sim:2", TS_MEM_DEVICE, false, 8),
	                            publish("b", "sim:1", TS_MEM_PINNED_HOST, true, 8)};
	struct ts_device *where = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 3, dev("sim:0"), NULL, &where, &err),
	                 TS_FAILED_PRECONDITION);
	ck_assert_str_eq(err.reason, "COMMITTED_APART");
	ck_assert_ptr_nonnull(strstr(err.message, "'a' (on sim:0)"));
	ck_assert_ptr_nonnull(strstr(err.message, "'b' (on sim:1)"));
	/* nothing moved */
	ck_assert_uint_eq(ts_array_version(arrs[1]), 1);
	ck_assert_uint_eq(ts_stager_implicit(stg), 0);
	for (int i = 0; i < 3; i++)
		ts_array_unref(arrs[i]);
}
END_TEST

/* A committed array over a mesh of devices: [4] uint8, replicated (spec
 * none) or split along its one dimension, over the devices in order. */
static struct ts_array *publish_mesh(const char *name, const char *const *on, int n, bool split)
{
	struct ts_array_desc d = {.dtype = TS_DT_UINT8, .rank = 1, .shape = {4}};
	struct ts_placement pl = {.committed = true};
	struct ts_array *a;
	struct ts_error err;

	ts_error_clear(&err);
	pl.sharding.type = TS_SHARDING_NAMED;
	pl.sharding.memory_kind = TS_MEM_DEVICE;
	pl.sharding.mesh.ndevices = n;
	pl.sharding.mesh.naxes = 1;
	pl.sharding.mesh.shape[0] = n;
	snprintf(pl.sharding.mesh.axis_names[0], TS_AXIS_NAME_MAX, "data");
	for (int k = 0; k < n; k++)
		pl.sharding.mesh.devices[k] = dev(on[k]);
	if (split) {
		pl.sharding.spec_rank = 1;
		pl.sharding.spec[0].naxes = 1;
	}
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
	ck_assert_int_eq(ts_array_new(name, &d, &pl, mem, &a, &err), TS_OK);
	return a;
}

/* Arrays split differently over the same devices go together (a model's
 * replicated weights and its sharded optimizer state); over other devices,
 * or the same ones in another order, they are apart. */
START_TEST(test_meshes_of_the_same_devices_go_together)
{
	static const char *const d01[] = {"sim:0", "sim:1"}, *const d10[] = {"sim:1", "sim:0"};
	static const char *const d02[] = {"sim:0", "sim:2"};
	struct ts_array *w = publish_mesh("w", d01, 2, false), *s = publish_mesh("s", d01, 2, true);
	struct ts_array *swapped = publish_mesh("t", d10, 2, true);
	struct ts_array *other = publish_mesh("o", d02, 2, false);
	struct ts_array *one = publish("x", "sim:0", TS_MEM_DEVICE, true, 8);
	struct ts_array *arrs[3];
	struct ts_device *where = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	arrs[0] = w;
	arrs[1] = s;
	arrs[2] = one;
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 3, dev("sim:2"), NULL, &where, &err),
	                 TS_OK);
	ck_assert_ptr_eq(where, dev("sim:0"));
	arrs[1] = swapped;
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 2, dev("sim:0"), NULL, &where, &err),
	                 TS_FAILED_PRECONDITION);
	ts_error_clear(&err);
	arrs[1] = other;
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 2, dev("sim:0"), NULL, &where, &err),
	                 TS_FAILED_PRECONDITION);
	ck_assert_str_eq(err.reason, "COMMITTED_APART");
	ts_array_unref(w);
	ts_array_unref(s);
	ts_array_unref(swapped);
	ts_array_unref(other);
	ts_array_unref(one);
}
END_TEST

START_TEST(test_no_committed_uses_fallback)
{
	struct ts_array *arrs[2] = {publish("m", "sim:0", TS_MEM_DEVICE, false, 64),
	                            publish("n", "sim:2", TS_MEM_DEVICE, false, 32)};
	struct ts_device *where = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 2, dev("sim:2"), NULL, &where, &err), TS_OK);
	ck_assert_ptr_eq(where, dev("sim:2"));
	ck_assert_uint_eq(ts_array_implicit_bytes(arrs[0]), 64);
	ck_assert_uint_eq(ts_array_implicit_bytes(arrs[1]), 0);
	/* a second use finds it in place: no new move, count unchanged */
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 2, dev("sim:2"), NULL, &where, &err), TS_OK);
	ck_assert_uint_eq(ts_stager_implicit(stg), 64);
	for (int i = 0; i < 2; i++)
		ts_array_unref(arrs[i]);
}
END_TEST

START_TEST(test_replaced_meanwhile_aborts)
{
	struct ts_array *old = publish("r", "sim:0", TS_MEM_DEVICE, false, 16);
	struct ts_array *newer = publish("r", "sim:0", TS_MEM_DEVICE, false, 16);
	struct ts_array *c = publish("c", "sim:1", TS_MEM_DEVICE, true, 16);
	struct ts_array *arrs[2] = {c, old};
	struct ts_device *where;
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 2, NULL, NULL, &where, &err), TS_ABORTED);
	ck_assert_uint_eq(ts_stager_implicit(stg), 0);
	ts_array_unref(arrs[0]);
	ts_array_unref(arrs[1]);
	ts_array_unref(newer);
}
END_TEST


/* An implicit move is the one move primitive's: metadata kept; a held array
 * moves only for its holder, and stays held by it. */
START_TEST(test_held_arrays_move_for_their_holder)
{
	struct ts_array *c = publish("c", "sim:1", TS_MEM_DEVICE, true, 16);
	struct ts_array *h = publish_meta("h", "sim:0", TS_MEM_DEVICE, false, 16,
	                                  json_pack("{s:s}", "origin", "test"));
	struct ts_array *arrs[2] = {c, h};
	struct ts_device *where;
	struct ts_error err;
	char who[40];

	ts_error_clear(&err);
	ck_assert_int_eq(ts_catalog_hold(cat, &h, 1, "op-9", &err), TS_OK);
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 2, NULL, NULL, &where, &err), TS_ABORTED);
	ck_assert_str_eq(err.reason, "ARRAY_HELD");
	ck_assert_uint_eq(ts_stager_implicit(stg), 0);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_colocate(cat, stg, mem, arrs, 2, NULL, "op-9", &where, &err), TS_OK);
	ck_assert_ptr_eq(ts_array_box(arrs[1], 0)->device, dev("sim:1"));
	ck_assert_str_eq(json_string_value(json_object_get(ts_array_metadata(arrs[1]), "origin")),
	                 "test");
	ck_assert(ts_catalog_held(cat, "h", who, sizeof who));
	ck_assert_str_eq(who, "op-9");
	expect_bytes(arrs[1], 'h');
	ts_catalog_release(cat, "op-9");
	ts_array_unref(arrs[0]);
	ts_array_unref(arrs[1]);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("colocate");
	TCase *tc = tcase_create("committed");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_uncommitted_follow_committed);
	tcase_add_test(tc, test_meshes_of_the_same_devices_go_together);
	tcase_add_test(tc, test_committed_apart_refused);
	tcase_add_test(tc, test_no_committed_uses_fallback);
	tcase_add_test(tc, test_replaced_meanwhile_aborts);
	tcase_add_test(tc, test_held_arrays_move_for_their_holder);
	suite_add_tcase(s, tc);
	return s;
}
