/*
 * test_sharding.c - Check suite "sharding": meshes, partition specs and the
 * index boxes each device holds, as JAX computes them, on 1-, 2- and 3-axis
 * meshes of simulated devices; replica numbering; the refusals (uneven
 * split, spec longer than the rank, an axis used twice, bad meshes);
 * single-device shardings, with_memory_kind, equality as placements, the
 * text grid, and the saved-shardings registry under concurrent use.
 *
 * Every computed set of boxes also goes through check_tiling(): the boxes of
 * replica 0 are disjoint and cover the array, boxes of one block are equal,
 * and replicas of a block are numbered 0.. in mesh order.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/sharding.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;

static void setup(void)
{
	struct ts_device_config dc = {.sim_devices = 8, .sim_device_memory = 1ull << 20,
	                              .cuda = false, .host = "t"};
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_set_new(&dc, &set, &err) == TS_OK, "%s", err.message);
}

static void teardown(void)
{
	ts_device_set_free(set);
}

static struct ts_device *dev(int i)
{
	char id[16];

	snprintf(id, sizeof id, "sim:%d", i);
	return ts_device_set_find(set, id);
}

/*
 * A named sharding over sim:0..n-1 (n the product of shape), axes named by
 * names, spec entries as strings: "" is None, "x" one axis, "x+y" several.
 */
static void named(struct ts_sharding *s, int naxes, const int *shape, const char *const *names,
                  int nspec, const char *const *spec)
{
	memset(s, 0, sizeof *s);
	s->type = TS_SHARDING_NAMED;
	s->memory_kind = TS_MEM_DEVICE;
	s->mesh.naxes = naxes;
	s->mesh.ndevices = 1;
	for (int a = 0; a < naxes; a++) {
		snprintf(s->mesh.axis_names[a], TS_AXIS_NAME_MAX, "%s", names[a]);
		s->mesh.shape[a] = shape[a];
		s->mesh.ndevices *= shape[a];
	}
	for (int k = 0; k < s->mesh.ndevices; k++)
		s->mesh.devices[k] = dev(k);
	s->spec_rank = nspec;
	for (int d = 0; d < nspec; d++) {
		char buf[64], *save = NULL;

		snprintf(buf, sizeof buf, "%s", spec[d]);
		for (char *tok = strtok_r(buf, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
			int a = 0;

			while (a < naxes && strcmp(names[a], tok) != 0)
				a++;
			ck_assert_msg(a < naxes, "test spec names unknown axis %s", tok);
			s->spec[d].axes[s->spec[d].naxes++] = a;
		}
	}
}

static const char *const XY[] = {"x", "y"};
static const int M22[] = {2, 2};

#define SPEC(...) (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)), \
	(const char *const[]){__VA_ARGS__}

static void mesh22(struct ts_sharding *s, int nspec, const char *const *spec)
{
	named(s, 2, M22, XY, nspec, spec);
}

/* The invariants every set of boxes keeps. */
static void check_tiling(const struct ts_shard_box *b, int n, int rank, const uint64_t *shape)
{
	uint64_t total = 1, covered = 0;

	for (int d = 0; d < rank; d++)
		total *= shape[d];
	for (int i = 0; i < n; i++) {
		uint64_t vol = 1;
		int seen = 0;

		for (int d = 0; d < rank; d++) {
			ck_assert(b[i].start[d] + b[i].count[d] <= shape[d]);
			vol *= b[i].count[d];
		}
		/* replicas of this box before it, in mesh order */
		for (int j = 0; j < i; j++)
			if (memcmp(b[j].start, b[i].start, sizeof b[i].start) == 0 &&
			    memcmp(b[j].count, b[i].count, sizeof b[i].count) == 0)
				seen++;
		if (total > 0)
			ck_assert_msg(b[i].replica == seen, "box %d: replica %d, expected %d", i,
			              b[i].replica, seen);
		if (b[i].replica != 0)
			continue;
		covered += vol;
		for (int j = 0; j < i; j++) {
			bool overlap = b[j].replica == 0 && rank > 0 && vol > 0;

			for (int d = 0; overlap && d < rank; d++)
				overlap = b[i].start[d] < b[j].start[d] + b[j].count[d] &&
				          b[j].start[d] < b[i].start[d] + b[i].count[d];
			ck_assert_msg(!overlap, "boxes %d and %d overlap", j, i);
		}
	}
	ck_assert_uint_eq(covered, rank == 0 ? 1 : total);
}

static int boxes(const struct ts_sharding *s, int rank, const uint64_t *shape,
                 struct ts_shard_box *out)
{
	struct ts_error err;
	int n = -1;

	ts_error_clear(&err);
	ck_assert_msg(ts_sharding_boxes(s, rank, shape, out, &n, &err) == TS_OK, "%s", err.message);
	check_tiling(out, n, rank, shape);
	return n;
}

static void box_is(const struct ts_shard_box *b, int dev_index, uint64_t s0, uint64_t c0,
                   uint64_t s1, uint64_t c1, int replica)
{
	ck_assert_ptr_eq(b->device, dev(dev_index));
	ck_assert_msg(b->start[0] == s0 && b->count[0] == c0 && b->start[1] == s1 &&
	              b->count[1] == c1,
	              "sim:%d holds [%llu:+%llu, %llu:+%llu], expected [%llu:+%llu, %llu:+%llu]",
	              dev_index, (unsigned long long)b->start[0], (unsigned long long)b->count[0],
	              (unsigned long long)b->start[1], (unsigned long long)b->count[1],
	              (unsigned long long)s0, (unsigned long long)c0, (unsigned long long)s1,
	              (unsigned long long)c1);
	ck_assert_int_eq(b->replica, replica);
}

static void expect_invalid(const struct ts_sharding *s, int rank, const uint64_t *shape,
                           const char *message)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_error err;
	int n = -1;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_boxes(s, rank, shape, b, &n, &err), TS_INVALID_ARGUMENT);
	ck_assert_int_eq(err.status, TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_SHARDING");
	ck_assert_int_eq(n, -1);
	if (message)
		ck_assert_str_eq(err.message, message);
	ck_assert(err.message[0] >= 'a' && err.message[0] <= 'z');
}

/* ---- boxes on a (2, 2) mesh ---------------------------------------------------------- */

static const uint64_t S84[] = {8, 4};

START_TEST(test_mesh22_x_y)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, SPEC("x", "y"));
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	box_is(&b[0], 0, 0, 4, 0, 2, 0);
	box_is(&b[1], 1, 0, 4, 2, 2, 0);
	box_is(&b[2], 2, 4, 4, 0, 2, 0);
	box_is(&b[3], 3, 4, 4, 2, 2, 0);
}
END_TEST

START_TEST(test_mesh22_y_x)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, SPEC("y", "x"));
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	box_is(&b[0], 0, 0, 4, 0, 2, 0);
	box_is(&b[1], 1, 4, 4, 0, 2, 0);
	box_is(&b[2], 2, 0, 4, 2, 2, 0);
	box_is(&b[3], 3, 4, 4, 2, 2, 0);
}
END_TEST

START_TEST(test_mesh22_xy_on_one_dim)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, SPEC("x+y"));
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	box_is(&b[0], 0, 0, 2, 0, 4, 0);
	box_is(&b[1], 1, 2, 2, 0, 4, 0);
	box_is(&b[2], 2, 4, 2, 0, 4, 0);
	box_is(&b[3], 3, 6, 2, 0, 4, 0);
}
END_TEST

START_TEST(test_mesh22_yx_on_one_dim)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, SPEC("y+x"));
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	box_is(&b[0], 0, 0, 2, 0, 4, 0);
	box_is(&b[1], 1, 4, 2, 0, 4, 0);
	box_is(&b[2], 2, 2, 2, 0, 4, 0);
	box_is(&b[3], 3, 6, 2, 0, 4, 0);
}
END_TEST

START_TEST(test_mesh22_x_replicates_over_y)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, SPEC("x"));
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	box_is(&b[0], 0, 0, 4, 0, 4, 0);
	box_is(&b[1], 1, 0, 4, 0, 4, 1);
	box_is(&b[2], 2, 4, 4, 0, 4, 0);
	box_is(&b[3], 3, 4, 4, 0, 4, 1);
}
END_TEST

START_TEST(test_mesh22_none_y_replicates_over_x)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, SPEC("", "y"));
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	box_is(&b[0], 0, 0, 8, 0, 2, 0);
	box_is(&b[1], 1, 0, 8, 2, 2, 0);
	box_is(&b[2], 2, 0, 8, 0, 2, 1);
	box_is(&b[3], 3, 0, 8, 2, 2, 1);
}
END_TEST

START_TEST(test_mesh22_fully_replicated)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, 0, NULL);
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	for (int k = 0; k < 4; k++)
		box_is(&b[k], k, 0, 8, 0, 4, k);
	/* explicit Nones are the same */
	mesh22(&s, SPEC("", ""));
	ck_assert_int_eq(boxes(&s, 2, S84, b), 4);
	for (int k = 0; k < 4; k++)
		box_is(&b[k], k, 0, 8, 0, 4, k);
}
END_TEST

/* ---- 1- and 3-axis meshes ------------------------------------------------------------ */

START_TEST(test_mesh1_axis)
{
	static const char *const names[] = {"batch"};
	static const int shape4[] = {4};
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;
	uint64_t v[] = {8}, m[] = {3, 8};

	named(&s, 1, shape4, names, SPEC("batch"));
	ck_assert_int_eq(boxes(&s, 1, v, b), 4);
	for (int k = 0; k < 4; k++) {
		ck_assert_ptr_eq(b[k].device, dev(k));
		ck_assert_uint_eq(b[k].start[0], 2 * (uint64_t)k);
		ck_assert_uint_eq(b[k].count[0], 2);
		ck_assert_int_eq(b[k].replica, 0);
	}
	named(&s, 1, shape4, names, SPEC("", "batch"));
	ck_assert_int_eq(boxes(&s, 2, m, b), 4);
	for (int k = 0; k < 4; k++)
		box_is(&b[k], k, 0, 3, 2 * (uint64_t)k, 2, 0);
}
END_TEST

START_TEST(test_mesh3_axes)
{
	static const char *const names[] = {"a", "b", "c"};
	static const int shape[] = {2, 2, 2};
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;
	uint64_t sh[] = {8, 6, 5};

	/* device k = (a, b, c) = (k>>2, (k>>1)&1, k&1) */
	named(&s, 3, shape, names, SPEC("a+c", "b"));
	ck_assert_int_eq(boxes(&s, 3, sh, b), 8);
	for (int k = 0; k < 8; k++) {
		int a = k >> 2, bb = (k >> 1) & 1, c = k & 1;

		ck_assert_uint_eq(b[k].start[0], 2 * (uint64_t)(a * 2 + c));
		ck_assert_uint_eq(b[k].count[0], 2);
		ck_assert_uint_eq(b[k].start[1], 3 * (uint64_t)bb);
		ck_assert_uint_eq(b[k].count[1], 3);
		ck_assert_uint_eq(b[k].start[2], 0);
		ck_assert_uint_eq(b[k].count[2], 5);
		ck_assert_int_eq(b[k].replica, 0);
	}
	/* only b used: replicas over (a, c), row-major */
	named(&s, 3, shape, names, SPEC("", "b"));
	ck_assert_int_eq(boxes(&s, 3, sh, b), 8);
	for (int k = 0; k < 8; k++) {
		int a = k >> 2, bb = (k >> 1) & 1, c = k & 1;

		ck_assert_uint_eq(b[k].start[1], 3 * (uint64_t)bb);
		ck_assert_int_eq(b[k].replica, a * 2 + c);
	}
	/* c outermost on dim 2, a on dim 0 */
	named(&s, 3, shape, names, SPEC("a", "", "c+b"));
	sh[2] = 4;
	ck_assert_int_eq(boxes(&s, 3, sh, b), 8);
	for (int k = 0; k < 8; k++) {
		int a = k >> 2, bb = (k >> 1) & 1, c = k & 1;

		ck_assert_uint_eq(b[k].start[0], 4 * (uint64_t)a);
		ck_assert_uint_eq(b[k].start[2], (uint64_t)(c * 2 + bb));
		ck_assert_uint_eq(b[k].count[2], 1);
	}
}
END_TEST

START_TEST(test_mesh_2x4_replica_numbering)
{
	static const int shape[] = {2, 4};
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;
	uint64_t sh[] = {6};

	named(&s, 2, shape, XY, SPEC("x"));
	ck_assert_int_eq(boxes(&s, 1, sh, b), 8);
	for (int k = 0; k < 8; k++) {
		ck_assert_uint_eq(b[k].start[0], 3 * (uint64_t)(k / 4));
		ck_assert_int_eq(b[k].replica, k % 4);
	}
	named(&s, 2, shape, XY, SPEC("y"));
	sh[0] = 8;
	ck_assert_int_eq(boxes(&s, 1, sh, b), 8);
	for (int k = 0; k < 8; k++) {
		ck_assert_uint_eq(b[k].start[0], 2 * (uint64_t)(k % 4));
		ck_assert_int_eq(b[k].replica, k / 4);
	}
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------- */

START_TEST(test_uneven_split_refused)
{
	struct ts_sharding s;
	uint64_t ten[] = {10}, odd[] = {8, 3};

	mesh22(&s, SPEC("x+y"));
	expect_invalid(&s, 1, ten,
	               "dimension 0 of size 10 is not divisible by 4, the size of mesh axes "
	               "('x', 'y')");
	mesh22(&s, SPEC("x", "y"));
	expect_invalid(&s, 2, odd,
	               "dimension 1 of size 3 is not divisible by 2, the size of mesh axis 'y'");
}
END_TEST

START_TEST(test_spec_longer_than_rank)
{
	struct ts_sharding s;
	uint64_t sh[] = {8, 4};

	mesh22(&s, SPEC("x", "", ""));
	expect_invalid(&s, 2, sh, "partition spec has 3 entries but the array has rank 2");
	mesh22(&s, SPEC("x"));
	expect_invalid(&s, 0, NULL, "partition spec has 1 entries but the array has rank 0");
}
END_TEST

START_TEST(test_axis_used_twice)
{
	struct ts_sharding s;
	struct ts_error err;

	mesh22(&s, SPEC("x", "x"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&s, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.message, "mesh axis 'x' is used twice in the partition spec");
	expect_invalid(&s, 2, S84, NULL);
	mesh22(&s, SPEC("y+x", "", "y"));
	expect_invalid(&s, 3, (uint64_t[]){4, 4, 4}, "mesh axis 'y' is used twice in the partition spec");
}
END_TEST

START_TEST(test_bad_meshes)
{
	struct ts_sharding s, t;
	struct ts_error err;

	mesh22(&s, SPEC("x"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&s, &err), TS_OK);

	t = s;
	t.mesh.devices[3] = t.mesh.devices[0];
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.message, "device 'sim:0' appears twice in the mesh");

	t = s;
	t.mesh.shape[1] = 3;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.message, "mesh shape (2, 3) does not hold the 4 devices the mesh lists");

	t = s;
	snprintf(t.mesh.axis_names[1], TS_AXIS_NAME_MAX, "x");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.message, "mesh axis name 'x' appears twice");

	t = s;
	t.mesh.axis_names[0][0] = '\0';
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);

	t = s;
	t.spec[0].axes[0] = 2;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);

	t = s;
	t.mesh.ndevices = 0;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);

	t = s;
	t.memory_kind = TS_MEM_KIND_COUNT;
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);

	ts_sharding_single(&t, NULL, TS_MEM_DEVICE);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_validate(&t, &err), TS_INVALID_ARGUMENT);
}
END_TEST

/* ---- edge shapes ----------------------------------------------------------------------- */

START_TEST(test_zero_size_dims)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;
	uint64_t sh[] = {0, 4};

	mesh22(&s, SPEC("x", "y"));
	ck_assert_int_eq(boxes(&s, 2, sh, b), 4);
	for (int k = 0; k < 4; k++) {
		ck_assert_uint_eq(b[k].start[0], 0);
		ck_assert_uint_eq(b[k].count[0], 0);
		ck_assert_uint_eq(b[k].start[1], 2 * (uint64_t)(k % 2));
	}
	mesh22(&s, SPEC("x+y"));
	sh[0] = 0;
	ck_assert_int_eq(boxes(&s, 1, sh, b), 4);
}
END_TEST

START_TEST(test_rank0_arrays)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;

	mesh22(&s, 0, NULL);
	ck_assert_int_eq(boxes(&s, 0, NULL, b), 4);
	for (int k = 0; k < 4; k++) {
		ck_assert_ptr_eq(b[k].device, dev(k));
		ck_assert_int_eq(b[k].replica, k);
	}
	ts_sharding_single(&s, dev(2), TS_MEM_PINNED_HOST);
	ck_assert_int_eq(boxes(&s, 0, NULL, b), 1);
	ck_assert_ptr_eq(b[0].device, dev(2));
}
END_TEST

START_TEST(test_single_device)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s;
	uint64_t sh[] = {7, 3, 5};

	ts_sharding_single(&s, dev(1), TS_MEM_PINNED_HOST);
	ck_assert_int_eq(s.type, TS_SHARDING_SINGLE);
	ck_assert_int_eq(s.memory_kind, TS_MEM_PINNED_HOST);
	ck_assert_int_eq(boxes(&s, 3, sh, b), 1);
	ck_assert_ptr_eq(b[0].device, dev(1));
	for (int d = 0; d < 3; d++) {
		ck_assert_uint_eq(b[0].start[d], 0);
		ck_assert_uint_eq(b[0].count[d], sh[d]);
	}
	ck_assert_int_eq(b[0].replica, 0);
}
END_TEST

START_TEST(test_with_memory_kind)
{
	struct ts_sharding s, t, u;

	mesh22(&s, SPEC("x", "y"));
	ts_sharding_with_memory_kind(&s, TS_MEM_PINNED_HOST, &t);
	ck_assert_int_eq(t.memory_kind, TS_MEM_PINNED_HOST);
	ck_assert_int_eq(s.memory_kind, TS_MEM_DEVICE);
	ck_assert(!ts_sharding_equal(&s, &t));
	ts_sharding_with_memory_kind(&t, TS_MEM_DEVICE, &u);
	ck_assert(ts_sharding_equal(&s, &u));
	ck_assert_int_eq(memcmp(&s, &u, sizeof s), 0);
	/* in place */
	ts_sharding_with_memory_kind(&u, TS_MEM_UNPINNED_HOST, &u);
	ck_assert_int_eq(u.memory_kind, TS_MEM_UNPINNED_HOST);
	ck_assert_int_eq(u.mesh.ndevices, 4);

	ts_sharding_single(&s, dev(3), TS_MEM_DEVICE);
	ts_sharding_with_memory_kind(&s, TS_MEM_UNPINNED_HOST, &t);
	ck_assert_int_eq(t.type, TS_SHARDING_SINGLE);
	ck_assert_ptr_eq(t.device, dev(3));
	ck_assert_int_eq(t.memory_kind, TS_MEM_UNPINNED_HOST);
}
END_TEST

/* ---- equality ---------------------------------------------------------------------------- */

START_TEST(test_equality_as_placements)
{
	static const char *const z[] = {"z"};
	static const int one[] = {1}, four[] = {4};
	struct ts_sharding a, b;

	/* a 1-device mesh is a single-device sharding */
	named(&a, 1, one, z, SPEC("z"));
	ts_sharding_single(&b, dev(0), TS_MEM_DEVICE);
	ck_assert(ts_sharding_equal(&a, &b));
	ck_assert(ts_sharding_equal(&b, &a));
	ts_sharding_single(&b, dev(1), TS_MEM_DEVICE);
	ck_assert(!ts_sharding_equal(&a, &b));
	ts_sharding_single(&b, dev(0), TS_MEM_PINNED_HOST);
	ck_assert(!ts_sharding_equal(&a, &b));

	/* P(('x','y')) on (2,2) is P('z') on (4,) with the same devices */
	mesh22(&a, SPEC("x+y"));
	named(&b, 1, four, z, SPEC("z"));
	ck_assert(ts_sharding_equal(&a, &b));
	mesh22(&a, SPEC("y+x"));
	ck_assert(!ts_sharding_equal(&a, &b));

	/* trailing Nones do not matter */
	mesh22(&a, SPEC("x"));
	mesh22(&b, SPEC("x", "", ""));
	ck_assert(ts_sharding_equal(&a, &b));
	mesh22(&b, SPEC("y"));
	ck_assert(!ts_sharding_equal(&a, &b));
	mesh22(&b, SPEC("", "x"));
	ck_assert(!ts_sharding_equal(&a, &b));

	/* the same spec over other devices differs */
	mesh22(&a, SPEC("x", "y"));
	mesh22(&b, SPEC("x", "y"));
	b.mesh.devices[3] = dev(7);
	ck_assert(!ts_sharding_equal(&a, &b));
	/* ... and over the same devices in another order too */
	b.mesh.devices[3] = dev(2);
	b.mesh.devices[2] = dev(3);
	ck_assert(!ts_sharding_equal(&a, &b));
	/* fully replicated over a permuted mesh is the same placement */
	mesh22(&a, 0, NULL);
	mesh22(&b, 0, NULL);
	b.mesh.devices[0] = dev(3);
	b.mesh.devices[3] = dev(0);
	ck_assert(ts_sharding_equal(&a, &b));
	/* invalid shardings equal nothing */
	mesh22(&a, SPEC("x", "x"));
	ck_assert(!ts_sharding_equal(&a, &a));
}
END_TEST

/* ---- text --------------------------------------------------------------------------------- */

static char *render(const struct ts_sharding *s, int rank, const uint64_t *shape)
{
	size_t need = ts_sharding_render_text(s, rank, shape, NULL, 0);
	char *buf = malloc(need + 1);

	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(ts_sharding_render_text(s, rank, shape, buf, need + 1), need);
	ck_assert_uint_eq(strlen(buf), need);
	return buf;
}

static void contains_devices(const char *text, int n)
{
	for (int k = 0; k < n; k++) {
		char id[16];

		snprintf(id, sizeof id, "sim:%d", k);
		ck_assert_msg(strstr(text, id), "%s missing from:\n%s", id, text);
	}
}

START_TEST(test_render_text_grids)
{
	static const int m41[] = {4, 1};
	struct ts_sharding s;
	uint64_t sq[] = {8, 8}, v[] = {8}, cube[] = {4, 8, 2};
	char *t, small[16];
	size_t need;

	mesh22(&s, SPEC("x", "y"));
	t = render(&s, 2, sq);
	contains_devices(t, 4);
	ck_assert_ptr_nonnull(strstr(t, "+-"));
	ck_assert_ptr_nonnull(strstr(t, "[0:4, 4:8]"));
	ck_assert_ptr_nonnull(strstr(t, "[4:8, 0:4]"));
	free(t);

	mesh22(&s, SPEC("x"));
	t = render(&s, 2, sq);
	contains_devices(t, 4);
	ck_assert_ptr_nonnull(strstr(t, "sim:0,sim:1"));
	ck_assert_ptr_nonnull(strstr(t, "[4:8, :]"));
	free(t);

	named(&s, 2, m41, XY, SPEC("x", "y"));
	t = render(&s, 2, sq);
	contains_devices(t, 4);
	ck_assert_ptr_nonnull(strstr(t, "[6:8, 0:8]"));
	free(t);

	mesh22(&s, SPEC("y+x"));
	t = render(&s, 1, v);
	contains_devices(t, 4);
	free(t);

	mesh22(&s, SPEC("x", "", "y"));
	t = render(&s, 3, cube);
	contains_devices(t, 4);
	ck_assert_ptr_nonnull(strstr(t, "[2:4, :, 0:1] sim:2"));
	free(t);

	mesh22(&s, 0, NULL);
	t = render(&s, 0, NULL);
	ck_assert_ptr_nonnull(strstr(t, "[] sim:0,sim:1,sim:2,sim:3"));
	free(t);

	ts_sharding_single(&s, dev(5), TS_MEM_PINNED_HOST);
	t = render(&s, 2, sq);
	ck_assert_ptr_nonnull(strstr(t, "sim:5"));
	ck_assert_ptr_nonnull(strstr(t, "pinned_host"));
	free(t);

	/* truncation: always terminated, the full length returned */
	mesh22(&s, SPEC("x", "y"));
	need = ts_sharding_render_text(&s, 2, sq, small, sizeof small);
	ck_assert_uint_gt(need, sizeof small);
	ck_assert_uint_eq(strlen(small), sizeof small - 1);

	/* an unusable sharding says why */
	t = render(&s, 2, (uint64_t[]){7, 8});
	ck_assert_ptr_nonnull(strstr(t, "not divisible"));
	free(t);
}
END_TEST

/* ---- registry ------------------------------------------------------------------------------- */

START_TEST(test_registry_basics)
{
	struct ts_sharding_registry *r = ts_sharding_registry_new();
	struct ts_sharding s, got;
	struct ts_error err;

	ck_assert_ptr_nonnull(r);
	mesh22(&s, SPEC("x", "y"));
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_registry_put(r, "grid", &s, &err), TS_OK);
	ck_assert(ts_sharding_registry_get(r, "grid", &got));
	ck_assert_int_eq(memcmp(&s, &got, sizeof s), 0);
	ck_assert(!ts_sharding_registry_get(r, "nope", &got));
	ck_assert(!ts_sharding_registry_get(r, NULL, &got));

	ts_sharding_single(&s, dev(0), TS_MEM_PINNED_HOST);
	ck_assert_int_eq(ts_sharding_registry_put(r, "grid", &s, &err), TS_ALREADY_EXISTS);
	ck_assert_str_eq(err.reason, "SHARDING_EXISTS");
	ck_assert_str_eq(err.message, "sharding 'grid' already exists");
	ck_assert(ts_sharding_registry_get(r, "grid", &got));
	ck_assert_int_eq(got.type, TS_SHARDING_NAMED);

	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_registry_put(r, ".bad", &s, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "BAD_SHARDING_NAME");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_registry_put(r, NULL, &s, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	mesh22(&got, SPEC("x", "x"));
	ck_assert_int_eq(ts_sharding_registry_put(r, "twice", &got, &err), TS_INVALID_ARGUMENT);
	ck_assert(!ts_sharding_registry_get(r, "twice", &got));
	ts_sharding_registry_free(r);
	ts_sharding_registry_free(NULL);
}
END_TEST

struct seen {
	int n;
	char last[TS_MESH_MAX_DEVICES * 4];
	bool ordered;
};

static void count_each(const char *name, const struct ts_sharding *s, void *arg)
{
	struct seen *v = arg;

	if (v->n && strcmp(v->last, name) >= 0)
		v->ordered = false;
	snprintf(v->last, sizeof v->last, "%s", name);
	ck_assert_int_eq(ts_sharding_validate(s, NULL), TS_OK);
	v->n++;
}

struct worker {
	struct ts_sharding_registry *r;
	int id;
	int won;       /* puts of the shared name that succeeded */
};

#define PER_THREAD 200

static void *put_many(void *arg)
{
	struct worker *w = arg;
	struct ts_sharding s, got;
	struct ts_error err;
	char name[32];

	for (int i = 0; i < PER_THREAD; i++) {
		ts_sharding_single(&s, dev((w->id + i) % 8), (enum ts_memory_kind)(i % 3));
		snprintf(name, sizeof name, "w%d-%03d", w->id, (i * 37) % PER_THREAD);
		ts_error_clear(&err);
		if (ts_sharding_registry_put(w->r, name, &s, &err) != TS_OK)
			abort();
		if (!ts_sharding_registry_get(w->r, name, &got) || !ts_sharding_equal(&s, &got))
			abort();
		ts_error_clear(&err);
		if (ts_sharding_registry_put(w->r, "shared", &s, &err) == TS_OK)
			w->won++;
		else if (err.status != TS_ALREADY_EXISTS)
			abort();
	}
	return NULL;
}

START_TEST(test_registry_threads)
{
	struct ts_sharding_registry *r = ts_sharding_registry_new();
	struct worker w[4];
	pthread_t th[4];
	struct seen v = {.ordered = true};
	int won = 0;

	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){.r = r, .id = i};
		ck_assert_int_eq(pthread_create(&th[i], NULL, put_many, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		won += w[i].won;
	}
	ck_assert_int_eq(won, 1);
	ts_sharding_registry_each(r, count_each, &v);
	ck_assert_int_eq(v.n, 4 * PER_THREAD + 1);
	ck_assert(v.ordered);
	ts_sharding_registry_free(r);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("sharding");
	TCase *boxes_tc = tcase_create("boxes"), *refuse = tcase_create("refusals"),
	      *misc = tcase_create("values"), *reg = tcase_create("registry");

	tcase_add_checked_fixture(boxes_tc, setup, teardown);
	tcase_add_test(boxes_tc, test_mesh22_x_y);
	tcase_add_test(boxes_tc, test_mesh22_y_x);
	tcase_add_test(boxes_tc, test_mesh22_xy_on_one_dim);
	tcase_add_test(boxes_tc, test_mesh22_yx_on_one_dim);
	tcase_add_test(boxes_tc, test_mesh22_x_replicates_over_y);
	tcase_add_test(boxes_tc, test_mesh22_none_y_replicates_over_x);
	tcase_add_test(boxes_tc, test_mesh22_fully_replicated);
	tcase_add_test(boxes_tc, test_mesh1_axis);
	tcase_add_test(boxes_tc, test_mesh3_axes);
	tcase_add_test(boxes_tc, test_mesh_2x4_replica_numbering);
	tcase_add_test(boxes_tc, test_zero_size_dims);
	tcase_add_test(boxes_tc, test_rank0_arrays);
	tcase_add_test(boxes_tc, test_single_device);
	suite_add_tcase(s, boxes_tc);

	tcase_add_checked_fixture(refuse, setup, teardown);
	tcase_add_test(refuse, test_uneven_split_refused);
	tcase_add_test(refuse, test_spec_longer_than_rank);
	tcase_add_test(refuse, test_axis_used_twice);
	tcase_add_test(refuse, test_bad_meshes);
	suite_add_tcase(s, refuse);

	tcase_add_checked_fixture(misc, setup, teardown);
	tcase_add_test(misc, test_with_memory_kind);
	tcase_add_test(misc, test_equality_as_placements);
	tcase_add_test(misc, test_render_text_grids);
	suite_add_tcase(s, misc);

	tcase_add_checked_fixture(reg, setup, teardown);
	tcase_add_test(reg, test_registry_basics);
	tcase_add_test(reg, test_registry_threads);
	suite_add_tcase(s, reg);
	return s;
}
