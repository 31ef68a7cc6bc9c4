/*
 * test_move.c - Check suite "move": storage/move.h on sim:0, the one
 * primitive behind :put, :copy and implicit moves: admission before any
 * byte moves (a destination that cannot fit is refused, nothing
 * allocated), a put that publishes a new version holding the same bytes
 * while a reader of the old one keeps it, a put that stays where it is
 * sharing its shards, publish only over the version read, a cancelled move
 * that leaves the array whole, copies that refuse an existing name unless
 * told to overwrite, donation, metadata and implicit bytes kept, and
 * conversion on the way.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "formats/convert.h"
#include "memory/buffer.h"
#include "memory/space.h"
#include "storage/array_io.h"
#include "storage/move.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_stager *stager;
static struct ts_catalog *cat;
static struct ts_device *dev;
static struct ts_error err;

#define OK(call) TS_UNIT_OK(err, call)

#define N 4096       /* floats in the test array */

static void setup(void)
{
	static const struct ts_unit_sim_config sim = {.devices = 1, .device_memory = 4ull << 20,
	                                              .device_fraction = 1.0,
	                                              .pinned = 16ull << 20, .unpinned = 16ull << 20,
	                                              .segment = 4ull << 20};

	ts_error_clear(&err);
	ts_unit_sim_new(&sim, &set, &mem, &stager);
	dev = ts_device_set_find(set, "sim:0");
	cat = ts_catalog_new();
	ck_assert_ptr_nonnull(cat);
}

static void teardown(void)
{
	ts_catalog_free(cat);
	ts_unit_sim_free(set, mem, stager);
}

static uint64_t in_use(enum ts_memory_kind k)
{
	struct ts_space_stats s;

	ts_space_stats(ts_memory_find(mem, "sim:0", k), &s);
	return s.bytes_in_use;
}

/* Publishes float32 [n] name in kind holding i * 0.5, with metadata. */
static void put(const char *name, uint64_t n, enum ts_memory_kind kind)
{
	struct ts_array_desc d = {.dtype = TS_DT_FLOAT32, .rank = 1, .shape = {n}};
	struct ts_placement pl;
	struct ts_array *a = NULL;
	struct ts_array_writer *w = NULL;
	float *v = malloc(n * sizeof *v);

	for (uint64_t i = 0; i < n; i++)
		v[i] = (float)i * 0.5f;
	ts_placement_single(&pl, dev, kind, true);
	OK(ts_array_desc_init(&d, &err));
	OK(ts_array_new(name, &d, &pl, mem, &a, &err));
	ts_array_set_metadata(a, json_pack("{s:s}", "origin", "test"));
	OK(ts_array_writer_new(stager, a, &w, &err));
	OK(ts_array_writer_write(w, v, d.nbytes, &err));
	OK(ts_array_writer_finish(w, &err));
	ts_array_writer_free(w);
	OK(ts_catalog_put(cat, a, &(struct ts_precondition){0}, NULL, &err));
	ts_array_unref(a);
	free(v);
}

/* Whether a's bytes are i * 0.5 (as float32). */
static bool holds_ramp(const struct ts_array *a)
{
	uint64_t n = ts_array_desc(a)->nbytes;
	struct ts_run run = {0, 0, n};
	float *v = malloc(n);
	bool ok = true;

	OK(ts_array_read(stager, a, &run, 1, v, &err));
	for (uint64_t i = 0; i < n / 4; i++)
		ok = ok && v[i] == (float)i * 0.5f;
	free(v);
	return ok;
}

static struct ts_move_spec spec_to(enum ts_memory_kind kind, const char *name)
{
	struct ts_move_spec s = {.name = name, .dtype = TS_DT_FLOAT32};

	ts_placement_single(&s.placement, dev, kind, true);
	return s;
}

/* Moves name as spec says, to the end; the status. */
static ts_status move(const char *name, const struct ts_move_spec *spec)
{
	struct ts_array *src = ts_catalog_get(cat, name);
	struct ts_move *mv = NULL;
	uint64_t bytes = 0;
	ts_status st;

	ck_assert_ptr_nonnull(src);
	st = ts_move_new(mem, src, spec, &mv, &bytes, &err);
	if (st == TS_OK)
		st = ts_move_run(mv, cat, stager, NULL, NULL, NULL, &err);
	ts_move_free(mv);
	ts_array_unref(src);
	return st;
}

START_TEST(test_put_publishes_a_new_version_readers_keep_the_old)
{
	struct ts_move_spec s = spec_to(TS_MEM_PINNED_HOST, NULL);
	struct ts_array *old, *now;

	put("a", N, TS_MEM_DEVICE);
	old = ts_catalog_get(cat, "a");
	OK(move("a", &s));
	now = ts_catalog_get(cat, "a");
	ck_assert_uint_eq(ts_array_version(now), ts_array_version(old) + 1);
	ck_assert(ts_array_placement(now)->sharding.memory_kind == TS_MEM_PINNED_HOST);
	ck_assert(holds_ramp(now));
	ck_assert(holds_ramp(old));                 /* the old version is whole */
	ck_assert_str_eq(json_string_value(json_object_get(ts_array_metadata(now), "origin")),
	                 "test");
	ck_assert_uint_eq(in_use(TS_MEM_DEVICE), N * 4);   /* ours, until we let go */
	ts_array_unref(old);
	ck_assert_uint_eq(in_use(TS_MEM_DEVICE), 0);
	ts_array_unref(now);
}
END_TEST

START_TEST(test_put_in_place_shares_its_shards)
{
	struct ts_move_spec s = spec_to(TS_MEM_DEVICE, NULL);
	struct ts_array *src, *now;
	struct ts_move *mv = NULL;
	uint64_t bytes = 99;

	put("a", N, TS_MEM_DEVICE);
	src = ts_catalog_get(cat, "a");
	OK(ts_move_new(mem, src, &s, &mv, &bytes, &err));
	ck_assert_uint_eq(bytes, 0);
	ck_assert_uint_eq(in_use(TS_MEM_DEVICE), N * 4);   /* nothing allocated */
	OK(ts_move_run(mv, cat, stager, NULL, NULL, NULL, &err));
	ts_move_free(mv);
	now = ts_catalog_get(cat, "a");
	ck_assert_ptr_eq(ts_buffer_data(ts_array_single_buffer(now)),
	                 ts_buffer_data(ts_array_single_buffer(src)));
	ts_array_unref(src);
	ts_array_unref(now);
}
END_TEST

START_TEST(test_admission_refuses_what_cannot_fit)
{
	struct ts_move_spec s = spec_to(TS_MEM_DEVICE, NULL);
	struct ts_array *src;
	struct ts_move *mv = NULL;
	uint64_t bytes = 0;

	put("big", (6ull << 20) / 4, TS_MEM_PINNED_HOST);   /* 6 MiB; the device has 4 */
	src = ts_catalog_get(cat, "big");
	ck_assert_int_eq(ts_move_new(mem, src, &s, &mv, &bytes, &err), TS_RESOURCE_EXHAUSTED);
	ck_assert_ptr_null(mv);
	ck_assert_uint_eq(in_use(TS_MEM_DEVICE), 0);
	ts_array_unref(src);
}
END_TEST

START_TEST(test_publish_only_over_the_version_read)
{
	struct ts_move_spec s = spec_to(TS_MEM_PINNED_HOST, NULL);
	struct ts_array *src = NULL, *now;
	struct ts_move *mv = NULL;
	uint64_t bytes = 0;

	put("a", N, TS_MEM_DEVICE);
	src = ts_catalog_get(cat, "a");
	OK(ts_move_new(mem, src, &s, &mv, &bytes, &err));
	put("a", 8, TS_MEM_DEVICE);                  /* replaced while it moves */
	ck_assert_int_eq(ts_move_run(mv, cat, stager, NULL, NULL, NULL, &err), TS_ABORTED);
	ck_assert_str_eq(err.reason, "ARRAY_CHANGED");
	ts_move_free(mv);
	now = ts_catalog_get(cat, "a");
	ck_assert_uint_eq(ts_array_desc(now)->shape[0], 8);
	ck_assert(ts_array_placement(now)->sharding.memory_kind == TS_MEM_DEVICE);
	ts_array_unref(now);
	ts_array_unref(src);
}
END_TEST

static bool always(void *arg)
{
	(void)arg;
	return true;
}

START_TEST(test_a_cancelled_move_leaves_the_array_whole)
{
	struct ts_move_spec s = spec_to(TS_MEM_PINNED_HOST, NULL);
	struct ts_array *src = NULL, *now;
	struct ts_move *mv = NULL;
	uint64_t bytes = 0;

	put("a", N, TS_MEM_DEVICE);
	src = ts_catalog_get(cat, "a");
	OK(ts_move_new(mem, src, &s, &mv, &bytes, &err));
	ck_assert_uint_eq(bytes, N * 4);
	ck_assert_int_eq(ts_move_run(mv, cat, stager, NULL, always, NULL, &err), TS_CANCELLED);
	ts_move_free(mv);
	now = ts_catalog_get(cat, "a");
	ck_assert_ptr_eq(now, src);
	ck_assert(holds_ramp(now));
	ck_assert_uint_eq(in_use(TS_MEM_PINNED_HOST), 0);   /* the destination went */
	ts_array_unref(now);
	ts_array_unref(src);
}
END_TEST

START_TEST(test_copies_refuse_an_existing_name_unless_told)
{
	struct ts_move_spec s = spec_to(TS_MEM_PINNED_HOST, "b");
	struct ts_array *a, *b;

	put("a", N, TS_MEM_DEVICE);
	put("b", 8, TS_MEM_DEVICE);
	ck_assert_int_eq(move("a", &s), TS_ALREADY_EXISTS);
	ck_assert_str_eq(err.reason, "ARRAY_EXISTS");
	b = ts_catalog_get(cat, "b");
	ck_assert_uint_eq(ts_array_desc(b)->shape[0], 8);
	ts_array_unref(b);
	s.overwrite = true;
	ts_error_clear(&err);
	OK(move("a", &s));
	b = ts_catalog_get(cat, "b");
	a = ts_catalog_get(cat, "a");
	ck_assert_uint_eq(ts_array_desc(b)->shape[0], N);
	ck_assert(holds_ramp(b));
	ck_assert_uint_eq(ts_array_version(a), 1);   /* the source is untouched */
	ck_assert(ts_array_placement(a)->sharding.memory_kind == TS_MEM_DEVICE);
	ts_array_unref(a);
	ts_array_unref(b);
}
END_TEST

START_TEST(test_donate_deletes_the_source)
{
	struct ts_move_spec s = spec_to(TS_MEM_PINNED_HOST, "b");
	struct ts_array *b;

	put("a", N, TS_MEM_DEVICE);
	s.donate = true;
	OK(move("a", &s));
	ck_assert_ptr_null(ts_catalog_get(cat, "a"));
	b = ts_catalog_get(cat, "b");
	ck_assert(holds_ramp(b));
	ck_assert_uint_eq(in_use(TS_MEM_DEVICE), 0);
	ts_array_unref(b);
}
END_TEST

START_TEST(test_implicit_moves_are_counted)
{
	struct ts_move_spec s = spec_to(TS_MEM_PINNED_HOST, NULL);
	struct ts_array *a;

	put("a", N, TS_MEM_DEVICE);
	s.implicit = true;
	OK(move("a", &s));
	a = ts_catalog_get(cat, "a");
	ck_assert_uint_eq(ts_array_implicit_bytes(a), N * 4);
	ts_array_unref(a);
}
END_TEST

START_TEST(test_conversion_on_the_way)
{
	struct ts_move_spec s = spec_to(TS_MEM_DEVICE, NULL);
	struct ts_array *a;
	uint16_t v[16];
	struct ts_run run = {0, 0, sizeof v};

	put("a", N, TS_MEM_PINNED_HOST);
	s.convert = true;
	s.dtype = TS_DT_BFLOAT16;
	OK(move("a", &s));
	a = ts_catalog_get(cat, "a");
	ck_assert_int_eq(ts_array_desc(a)->dtype, TS_DT_BFLOAT16);
	ck_assert_uint_eq(ts_array_desc(a)->nbytes, N * 2);
	OK(ts_array_read(stager, a, &run, 1, v, &err));
	/* i * 0.5 for small i is exact in bfloat16: the top half of the float */
	for (int i = 0; i < 16; i++) {
		float f = (float)i * 0.5f;
		uint32_t bits;

		memcpy(&bits, &f, 4);
		ck_assert_uint_eq(v[i], bits >> 16);
	}
	ts_array_unref(a);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("move");
	TCase *c = tcase_create("move");

	tcase_add_checked_fixture(c, setup, teardown);
	tcase_add_test(c, test_put_publishes_a_new_version_readers_keep_the_old);
	tcase_add_test(c, test_put_in_place_shares_its_shards);
	tcase_add_test(c, test_admission_refuses_what_cannot_fit);
	tcase_add_test(c, test_publish_only_over_the_version_read);
	tcase_add_test(c, test_a_cancelled_move_leaves_the_array_whole);
	tcase_add_test(c, test_copies_refuse_an_existing_name_unless_told);
	tcase_add_test(c, test_donate_deletes_the_source);
	tcase_add_test(c, test_implicit_moves_are_counted);
	tcase_add_test(c, test_conversion_on_the_way);
	suite_add_tcase(s, c);
	return s;
}
