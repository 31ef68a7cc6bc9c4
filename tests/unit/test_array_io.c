/*
 * test_array_io.c - Check suite "array_io": the sharded layout and the array
 * I/O layer over it.
 *
 * The layout is checked against a brute-force reference (each byte's shard
 * and its position in the shard's box, in C order) for many shapes, element
 * sizes and shardings; the sharded writer and reads by parent offsets
 * against boxes cut out of the parent by hand; copies between differently
 * sharded arrays in every memory kind (sub-runs, skipped shards, progress,
 * cancellation between chunks, injected copy failures); buffer sharing by
 * ts_array_new_like; and exact space accounting after a seeded random
 * sequence of all of these. Per-byte checks count mismatches and assert
 * once, so the suite stays fast.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "storage/array_io.h"
#include "tests/unit/unit.h"

#define MiB (1ull << 20)

static struct ts_device_set *set;
static struct ts_memory *mem;
static struct ts_stager *stg;

static void setup(void)
{
	static const struct ts_unit_sim_config sim = {.devices = 4, .device_memory = 256 * MiB,
	                                              .device_fraction = 0.75, .pinned = 256 * MiB,
	                                              .unpinned = 512 * MiB, .segment = 8 * MiB};

	ts_unit_sim_new(&sim, &set, &mem, &stg);
}

static void teardown(void)
{
	ts_unit_sim_free(set, mem, stg);
}

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rnd(uint64_t *s)
{
	uint64_t x = *s;     /* xorshift64* */

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 2685821657736338717ull;
}

static uint64_t below(uint64_t *s, uint64_t n)
{
	return n ? rnd(s) % n : 0;
}

static void fill_random(unsigned char *p, size_t n, uint64_t seed)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t v = rnd(&s);

		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (unsigned char)rnd(&s);
}

static struct ts_device *sim(int i)
{
	char id[16];

	snprintf(id, sizeof id, "sim:%d", i);
	return ts_device_set_find(set, id);
}

/*
 * A named sharding over sim devices: mesh (m0) or (m0, m1) with axes "x",
 * "y", devices the sim ordinals in devs ("3210"), spec as PartitionSpec
 * entries separated by commas, each the axes splitting that dimension
 * ("x,y" is P('x','y'), ",x" P(None,'x'), "xy" P(('x','y')), "" P()).
 */
static void named(struct ts_sharding *s, enum ts_memory_kind kind, int naxes, int m0, int m1,
                  const char *devs, const char *spec)
{
	memset(s, 0, sizeof *s);
	s->type = TS_SHARDING_NAMED;
	s->memory_kind = kind;
	s->mesh.naxes = naxes;
	s->mesh.shape[0] = m0;
	s->mesh.shape[1] = m1;
	s->mesh.ndevices = naxes == 1 ? m0 : m0 * m1;
	snprintf(s->mesh.axis_names[0], TS_AXIS_NAME_MAX, "x");
	snprintf(s->mesh.axis_names[1], TS_AXIS_NAME_MAX, "y");
	ck_assert_int_eq((int)strlen(devs), s->mesh.ndevices);
	for (int k = 0; k < s->mesh.ndevices; k++)
		s->mesh.devices[k] = sim(devs[k] - '0');
	s->spec_rank = *spec ? 1 : 0;
	for (const char *c = spec; *c; c++) {
		if (*c == ',') {
			s->spec_rank++;
			continue;
		}
		struct ts_spec_entry *e = &s->spec[s->spec_rank - 1];

		e->axes[e->naxes++] = *c - 'x';
	}
	ck_assert_int_eq(ts_sharding_validate(s, NULL), TS_OK);
}

/* A placement described in a table: a single device, or a named sharding. */
struct pdef {
	const char *single;            /* device id, or NULL for named */
	enum ts_memory_kind kind;
	int naxes, m0, m1;
	const char *devs, *spec;
};

static void placement(struct ts_placement *pl, const struct pdef *d)
{
	memset(pl, 0, sizeof *pl);
	pl->committed = true;
	if (d->single)
		ts_placement_single(pl, ts_device_set_find(set, d->single), d->kind, true);
	else
		named(&pl->sharding, d->kind, d->naxes, d->m0, d->m1, d->devs, d->spec);
}

static struct ts_array *make(const char *name, enum ts_dtype dt, int rank, const uint64_t *shape,
                             const struct ts_placement *pl)
{
	struct ts_array_desc d = {.dtype = dt, .rank = rank};
	struct ts_array *a = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	for (int i = 0; i < rank; i++)
		d.shape[i] = shape[i];
	ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
	ck_assert_msg(ts_array_new(name, &d, pl, mem, &a, &err) == TS_OK, "%s", err.message);
	return a;
}

/* Whether box b holds parent byte p (p < the array's bytes), and where. */
static bool locate(int rank, const uint64_t *shape, size_t esz, const struct ts_shard_box *b,
                   uint64_t p, uint64_t *local)
{
	uint64_t rest = p / esz, loc = p % esz, mul = esz;

	for (int d = rank - 1; d >= 0; d--) {
		uint64_t i = rest % shape[d];

		rest /= shape[d];
		if (i < b->start[d] || i >= b->start[d] + b->count[d])
			return false;
		loc += (i - b->start[d]) * mul;
		mul *= b->count[d];
	}
	*local = loc;
	return true;
}

static uint64_t box_bytes(int rank, size_t esz, const struct ts_shard_box *b)
{
	uint64_t n = esz;

	for (int d = 0; d < rank; d++)
		n *= b->count[d];
	return n;
}

/* The bytes of box b of parent, in C order over the box, into out. */
static void box_extract(const unsigned char *parent, int rank, const uint64_t *shape, size_t esz,
                        const struct ts_shard_box *b, unsigned char *out)
{
	uint64_t idx[TS_MAX_RANK] = {0}, row;

	if (box_bytes(rank, esz, b) == 0)
		return;
	if (rank == 0) {
		memcpy(out, parent, esz);
		return;
	}
	row = b->count[rank - 1] * esz;
	for (;;) {
		uint64_t p = 0;
		int d;

		for (d = 0; d < rank; d++)
			p = p * shape[d] + b->start[d] + idx[d];
		memcpy(out, parent + p * esz, row);
		out += row;
		for (d = rank - 2; d >= 0 && ++idx[d] == b->count[d]; d--)
			idx[d] = 0;
		if (d < 0)
			break;
	}
}

static size_t esz_of(const struct ts_array *a)
{
	return ts_dtype_size(ts_array_desc(a)->dtype);
}

/* Writes parent into a through a sharded writer, in awkward piece sizes. */
static void write_all(struct ts_array *a, const unsigned char *parent)
{
	static const size_t pieces[] = {1, 3, 4095, 2, 65536, 1000003, 7, 4096};
	uint64_t n = ts_array_desc(a)->nbytes, off = 0;
	struct ts_array_writer *w;
	struct ts_error err;
	size_t i = 0;

	ts_error_clear(&err);
	ck_assert_msg(ts_array_writer_new(stg, a, &w, &err) == TS_OK, "%s", err.message);
	while (off < n) {
		uint64_t take = pieces[i++ % 8];

		take = take < n - off ? take : n - off;
		ck_assert_msg(ts_array_writer_write(w, parent + off, take, &err) == TS_OK, "%s",
		              err.message);
		off += take;
		ck_assert_uint_eq(ts_array_writer_offset(w), off);
	}
	/* a byte past the end is refused and changes nothing */
	ck_assert_int_eq(ts_array_writer_write(w, parent, 1, &err), TS_INVALID_ARGUMENT);
	ck_assert_uint_eq(ts_array_writer_offset(w), n);
	ts_error_clear(&err);
	ck_assert_msg(ts_array_writer_finish(w, &err) == TS_OK, "%s", err.message);
	ts_array_writer_free(w);
}

/* Reads shard i of a whole into a new host block (caller frees). */
static unsigned char *read_shard(const struct ts_array *a, int i)
{
	struct ts_buffer *b = ts_array_shard_buffer(a, i);
	uint64_t n = ts_buffer_size(b);
	unsigned char *out = malloc(n ? n : 1);
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_ptr_nonnull(out);
	ck_assert_msg(ts_stage_read(stg, b, 0, out, n, &err) == TS_OK, "%s", err.message);
	return out;
}

/* Every shard of a, replicas included, holds its box of parent. */
static void check_shards(const struct ts_array *a, const unsigned char *parent, const char *what)
{
	const struct ts_array_desc *d = ts_array_desc(a);

	for (int i = 0; i < ts_array_nshards(a); i++) {
		const struct ts_shard_box *b = ts_array_box(a, i);
		uint64_t n = box_bytes(d->rank, esz_of(a), b);
		unsigned char *want = malloc(n ? n : 1), *got;

		ck_assert_uint_eq(ts_buffer_size(ts_array_shard_buffer(a, i)), n);
		box_extract(parent, d->rank, d->shape, esz_of(a), b, want);
		got = read_shard(a, i);
		if (memcmp(want, got, n) != 0)
			ck_abort_msg("%s: shard %d of %d does not hold its box", what, i,
			             ts_array_nshards(a));
		free(want);
		free(got);
	}
}

/* ---- 1. the layout against a brute-force reference ---------------------------- */

struct pieces {
	struct ts_piece *v;
	size_t n, cap;
	size_t fail_at;      /* 0: never; else fail on the fail_at-th piece */
};

static ts_status collect(const struct ts_piece *pc, void *arg, struct ts_error *err)
{
	struct pieces *p = arg;

	if (p->n == p->cap) {
		p->cap = p->cap ? p->cap * 2 : 64;
		p->v = realloc(p->v, p->cap * sizeof *p->v);
		ck_assert_ptr_nonnull(p->v);
	}
	p->v[p->n++] = *pc;
	if (p->fail_at && p->n == p->fail_at)
		return ts_error_set(err, TS_CANCELLED, "STOP", "stopped by the test");
	return TS_OK;
}

/* One case: an array, its boxes and layout, and each byte's reference. */
struct lcase {
	int rank, n;
	uint64_t shape[TS_MAX_RANK];
	size_t esz;
	uint64_t total;
	struct ts_shard_box boxes[TS_MESH_MAX_DEVICES];
	struct ts_layout l;
	int *prim;                     /* [total]: the primary shard holding the byte */
	uint64_t *loc;                 /* [n * total]: local offset, or UINT64_MAX */
	unsigned *hits;                /* [n * total] */
	char desc[256];
};

static void lcase_reference(struct lcase *c)
{
	size_t t = c->total ? c->total : 1;

	c->prim = malloc(t * sizeof *c->prim);
	c->loc = malloc((size_t)c->n * t * sizeof *c->loc);
	c->hits = malloc((size_t)c->n * t * sizeof *c->hits);
	ck_assert(c->prim && c->loc && c->hits);
	for (uint64_t p = 0; p < c->total; p++) {
		int primaries = 0;

		c->prim[p] = -1;
		for (int s = 0; s < c->n; s++) {
			uint64_t local;

			c->loc[(size_t)s * t + p] = UINT64_MAX;
			if (!locate(c->rank, c->shape, c->esz, &c->boxes[s], p, &local))
				continue;
			c->loc[(size_t)s * t + p] = local;
			if (c->boxes[s].replica == 0) {
				c->prim[p] = s;
				primaries++;
			}
		}
		if (primaries != 1)
			ck_abort_msg("%s: byte %llu has %d primary shards", c->desc,
			             (unsigned long long)p, primaries);
	}
}

static void lcase_free(struct lcase *c)
{
	free(c->prim);
	free(c->loc);
	free(c->hits);
}

/* With primary_only: parent order, contiguous, exact cover, right shard and
 * local offsets, and no two neighbours that could have been one piece. */
static void check_primary_split(struct lcase *c, uint64_t off, uint64_t len)
{
	struct pieces ps = {0};
	struct ts_error err;
	uint64_t at = off;
	size_t bad = 0;

	ts_error_clear(&err);
	ck_assert_int_eq(ts_layout_split(&c->l, off, len, true, collect, &ps, &err), TS_OK);
	for (size_t i = 0; i < ps.n; i++) {
		const struct ts_piece *pc = &ps.v[i];

		if (pc->parent != at || pc->len == 0 || pc->shard < 0 || pc->shard >= c->n)
			ck_abort_msg("%s: range [%llu, +%llu): piece %zu at %llu len %llu, expected at %llu",
			             c->desc, (unsigned long long)off, (unsigned long long)len, i,
			             (unsigned long long)pc->parent, (unsigned long long)pc->len,
			             (unsigned long long)at);
		for (uint64_t j = 0; j < pc->len; j++)
			bad += c->prim[pc->parent + j] != pc->shard ||
			       c->loc[(size_t)pc->shard * c->total + pc->parent + j] != pc->local + j;
		if (i > 0 && ps.v[i - 1].shard == pc->shard &&
		    ps.v[i - 1].local + ps.v[i - 1].len == pc->local)
			ck_abort_msg("%s: range [%llu, +%llu): pieces %zu and %zu of shard %d are "
			             "contiguous in both the parent and the shard, so should be one",
			             c->desc, (unsigned long long)off, (unsigned long long)len, i - 1, i,
			             pc->shard);
		at += pc->len;
	}
	if (at != off + len || bad)
		ck_abort_msg("%s: range [%llu, +%llu): covered to %llu, %zu bytes misplaced", c->desc,
		             (unsigned long long)off, (unsigned long long)len, (unsigned long long)at,
		             bad);
	free(ps.v);
}

/* Without primary_only: every holder of every byte gets it exactly once, at
 * its local offset; pieces in parent order, replicas in shard order; each
 * shard's pieces in its local order. */
static void check_replica_split(struct lcase *c, uint64_t off, uint64_t len)
{
	struct pieces ps = {0};
	struct ts_error err;
	uint64_t last_local_end[TS_MESH_MAX_DEVICES];
	size_t bad = 0, t = c->total;

	ts_error_clear(&err);
	memset(c->hits, 0, (size_t)c->n * (t ? t : 1) * sizeof *c->hits);
	for (int s = 0; s < c->n; s++)
		last_local_end[s] = 0;
	ck_assert_int_eq(ts_layout_split(&c->l, off, len, false, collect, &ps, &err), TS_OK);
	for (size_t i = 0; i < ps.n; i++) {
		const struct ts_piece *pc = &ps.v[i];

		if (pc->len == 0 || pc->shard < 0 || pc->shard >= c->n || pc->parent < off ||
		    pc->parent + pc->len > off + len)
			ck_abort_msg("%s: replica piece %zu out of range", c->desc, i);
		if (i > 0 && (ps.v[i - 1].parent > pc->parent ||
		              (ps.v[i - 1].parent == pc->parent && ps.v[i - 1].shard >= pc->shard)))
			ck_abort_msg("%s: replica pieces %zu and %zu out of order", c->desc, i - 1, i);
		if (pc->local < last_local_end[pc->shard])
			ck_abort_msg("%s: shard %d's pieces are not in its local order", c->desc,
			             pc->shard);
		last_local_end[pc->shard] = pc->local + pc->len;
		for (uint64_t j = 0; j < pc->len; j++) {
			size_t k = (size_t)pc->shard * t + pc->parent + j;

			bad += c->loc[k] != pc->local + j;
			c->hits[k]++;
		}
	}
	for (int s = 0; s < c->n; s++)
		for (uint64_t p = off; p < off + len; p++)
			bad += c->hits[(size_t)s * t + p] != (c->loc[(size_t)s * t + p] != UINT64_MAX);
	if (bad)
		ck_abort_msg("%s: range [%llu, +%llu): %zu replica bytes wrong, missing or repeated",
		             c->desc, (unsigned long long)off, (unsigned long long)len, bad);
	free(ps.v);
}

/* A random sharding over 1, 2 or 4 sim devices (random order) with 1-2
 * axes, a random spec, and a shape that it divides (dims 0 and 1 included). */
static void random_case(uint64_t *r, struct lcase *c)
{
	static const int meshes[][3] = {{1, 1, 0}, {1, 2, 0}, {1, 4, 0}, {2, 1, 1}, {2, 1, 2},
	                                {2, 2, 1}, {2, 2, 2}, {2, 1, 4}, {2, 4, 1}};
	static const size_t eszs[] = {1, 2, 4, 8};
	struct ts_sharding s;
	struct ts_error err;
	int perm[4] = {0, 1, 2, 3}, blocks[TS_MAX_RANK], len = 0;

	memset(c, 0, sizeof *c);
	c->rank = (int)below(r, 5);
	c->esz = eszs[below(r, 4)];
	for (int i = 3; i > 0; i--) {
		int j = (int)below(r, (uint64_t)i + 1), t = perm[i];

		perm[i] = perm[j];
		perm[j] = t;
	}
	for (int d = 0; d < TS_MAX_RANK; d++)
		blocks[d] = 1;
	if (below(r, 6) == 0) {
		ts_sharding_single(&s, sim(perm[0]), TS_MEM_DEVICE);
		len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, "single sim:%d", perm[0]);
	} else {
		const int *m = meshes[below(r, sizeof meshes / sizeof meshes[0])];
		char devs[8] = {0};
		int order[2] = {0, 1};

		memset(&s, 0, sizeof s);
		s.type = TS_SHARDING_NAMED;
		s.memory_kind = TS_MEM_DEVICE;
		s.mesh.naxes = m[0];
		s.mesh.ndevices = 1;
		for (int a = 0; a < m[0]; a++) {
			snprintf(s.mesh.axis_names[a], TS_AXIS_NAME_MAX, "%c", 'x' + a);
			s.mesh.shape[a] = m[1 + a];
			s.mesh.ndevices *= m[1 + a];
		}
		for (int k = 0; k < s.mesh.ndevices; k++) {
			s.mesh.devices[k] = sim(perm[k]);
			devs[k] = (char)('0' + perm[k]);
		}
		if (below(r, 2)) {
			order[0] = 1;
			order[1] = 0;
		}
		/* each axis splits a random dimension, or none (replication) */
		for (int k = 0; k < 2; k++) {
			int a = order[k], d;

			if (a >= m[0] || c->rank == 0 || (d = (int)below(r, (uint64_t)c->rank + 1)) == c->rank)
				continue;
			s.spec[d].axes[s.spec[d].naxes++] = a;
			blocks[d] *= s.mesh.shape[a];
			if (d + 1 > s.spec_rank)
				s.spec_rank = d + 1;
		}
		if (s.spec_rank < c->rank && below(r, 2))
			s.spec_rank = c->rank;       /* trailing Nones spelled out */
		len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, "mesh %d axes [%d,%d] on %s P(",
		                m[0], m[1], m[0] > 1 ? m[2] : 1, devs);
		for (int d = 0; d < s.spec_rank; d++) {
			len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, "%s", d ? "," : "");
			for (int k = 0; k < s.spec[d].naxes; k++)
				len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, "%c",
				                'x' + s.spec[d].axes[k]);
		}
		len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, ")");
	}
	c->total = c->esz;
	len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, " shape [");
	for (int d = 0; d < c->rank; d++) {
		uint64_t f = below(r, 8) == 0 ? 0 : 1 + below(r, 3);

		c->shape[d] = (uint64_t)blocks[d] * f;
		c->total *= c->shape[d];
		len += snprintf(c->desc + len, sizeof c->desc - (size_t)len, "%s%llu", d ? "," : "",
		                (unsigned long long)c->shape[d]);
	}
	snprintf(c->desc + len, sizeof c->desc - (size_t)len, "] esz %zu", c->esz);
	ts_error_clear(&err);
	ck_assert_msg(ts_sharding_boxes(&s, c->rank, c->shape, c->boxes, &c->n, &err) == TS_OK,
	              "%s: %s", c->desc, err.message);
	ts_layout_init(&c->l, c->rank, c->shape, c->esz, c->boxes, c->n);
}

START_TEST(test_layout_matches_brute_force)
{
	uint64_t r = 0x5eed0001;
	int cases = 0, sharded = 0, replicated = 0, empty = 0;

	for (int iter = 0; iter < 600; iter++) {
		struct lcase c;
		bool has_replica = false;

		random_case(&r, &c);
		if (c.total > 6000)
			continue;
		cases++;
		lcase_reference(&c);
		for (int s = 0; s < c.n; s++) {
			ck_assert_uint_eq(ts_layout_shard_bytes(&c.l, s),
			                  box_bytes(c.rank, c.esz, &c.boxes[s]));
			has_replica |= c.boxes[s].replica != 0;
		}
		sharded += c.n > 1 && !has_replica;
		replicated += has_replica;
		empty += c.total == 0;
		check_primary_split(&c, 0, c.total);
		check_replica_split(&c, 0, c.total);
		for (int k = 0; k < 24; k++) {
			uint64_t off = below(&r, c.total + 1), len = below(&r, c.total - off + 1);

			if (k % 4 == 0) {       /* short ranges across element edges */
				uint64_t s = below(&r, c.esz * 3 + 1);

				len = s < c.total - off ? s : c.total - off;
			}
			check_primary_split(&c, off, len);
			check_replica_split(&c, off, len);
		}
		lcase_free(&c);
	}
	/* the generator reached the interesting cases */
	ck_assert_int_gt(cases, 400);
	ck_assert_int_gt(sharded, 50);
	ck_assert_int_gt(replicated, 50);
	ck_assert_int_gt(empty, 10);
}
END_TEST

/* A range inside one shard whose box spans the inner dimensions is one
 * piece, wherever it starts (layout.h's cost promise). */
START_TEST(test_layout_one_piece_inside_a_shard)
{
	struct ts_sharding s;
	struct ts_shard_box boxes[TS_MESH_MAX_DEVICES];
	uint64_t shape[3] = {8, 6, 5};
	struct ts_layout l;
	struct pieces ps = {0};
	struct ts_error err;
	int n;

	ts_error_clear(&err);
	named(&s, TS_MEM_DEVICE, 1, 2, 1, "01", "x");
	ck_assert_int_eq(ts_sharding_boxes(&s, 3, shape, boxes, &n, &err), TS_OK);
	ts_layout_init(&l, 3, shape, 4, boxes, n);
	/* rows 0..3 are shard 0: bytes [0, 480); start mid-element, mid-row */
	ck_assert_int_eq(ts_layout_split(&l, 47, 400, true, collect, &ps, &err), TS_OK);
	ck_assert_uint_eq(ps.n, 1);
	ck_assert_int_eq(ps.v[0].shard, 0);
	ck_assert_uint_eq(ps.v[0].local, 47);
	ck_assert_uint_eq(ps.v[0].len, 400);
	/* across the edge: two pieces, the second at the start of shard 1 */
	ps.n = 0;
	ck_assert_int_eq(ts_layout_split(&l, 479, 3, false, collect, &ps, &err), TS_OK);
	ck_assert_uint_eq(ps.n, 2);
	ck_assert_int_eq(ps.v[1].shard, 1);
	ck_assert_uint_eq(ps.v[1].local, 0);
	ck_assert_uint_eq(ps.v[1].len, 2);
	free(ps.v);
}
END_TEST

START_TEST(test_layout_callback_failure_stops_the_walk)
{
	struct ts_sharding s;
	struct ts_shard_box boxes[TS_MESH_MAX_DEVICES];
	uint64_t shape[2] = {4, 4};
	struct ts_layout l;
	struct pieces ps = {.fail_at = 2};
	struct ts_error err;
	int n;

	ts_error_clear(&err);
	named(&s, TS_MEM_DEVICE, 2, 2, 2, "0123", ",x");     /* replicated over y */
	ck_assert_int_eq(ts_sharding_boxes(&s, 2, shape, boxes, &n, &err), TS_OK);
	ts_layout_init(&l, 2, shape, 2, boxes, n);
	ck_assert_int_eq(ts_layout_split(&l, 0, 32, false, collect, &ps, &err), TS_CANCELLED);
	ck_assert_uint_eq(ps.n, 2);
	ck_assert_str_eq(err.reason, "STOP");
	free(ps.v);
}
END_TEST

/* ---- 2. the sharded writer and reads by parent offsets ------------------------ */

/* Random runs of a's parent into a host block: disjoint destinations with
 * gaps that must stay untouched. */
static void check_reads(const struct ts_array *a, const unsigned char *parent, uint64_t *r)
{
	uint64_t n = ts_array_desc(a)->nbytes;
	struct ts_run runs[40];
	size_t nr = 0;
	uint64_t dst_size = 0;
	unsigned char *out;
	struct ts_error err;

	ts_error_clear(&err);
	runs[nr++] = (struct ts_run){.src_offset = 0, .dst_offset = 0, .len = n};
	dst_size = n + 13;
	for (int k = 0; k < 39; k++) {
		uint64_t off = below(r, n + 1), len = below(r, n - off + 1);

		if (k % 3 == 0)
			len = len < 100 ? len : below(r, 100);
		dst_size += below(r, 17);
		runs[nr++] = (struct ts_run){.src_offset = off, .dst_offset = dst_size, .len = len};
		dst_size += len;
	}
	/* in random order: reads do not depend on it */
	for (size_t i = nr - 1; i > 0; i--) {
		size_t j = (size_t)below(r, i + 1);
		struct ts_run t = runs[i];

		runs[i] = runs[j];
		runs[j] = t;
	}
	out = malloc(dst_size);
	ck_assert_ptr_nonnull(out);
	memset(out, 0xa5, dst_size);
	ck_assert_msg(ts_array_read(stg, a, runs, nr, out, &err) == TS_OK, "%s", err.message);
	{
		unsigned char *want = malloc(dst_size);

		memset(want, 0xa5, dst_size);
		for (size_t i = 0; i < nr; i++)
			memcpy(want + runs[i].dst_offset, parent + runs[i].src_offset, runs[i].len);
		if (memcmp(want, out, dst_size) != 0)
			ck_abort_msg("ts_array_read of %zu runs differs from the parent", nr);
		free(want);
	}
	free(out);
}

START_TEST(test_writer_fills_every_shard)
{
	static const struct {
		const char *spec;
		int naxes, m0, m1;
		const char *devs;
	} specs[] = {
		{"x,y", 2, 2, 2, "0123"}, {"x", 2, 2, 2, "0123"}, {",y", 2, 2, 2, "3120"},
		{"", 2, 2, 2, "0123"}, {"yx", 2, 2, 2, "0123"}, {",,xy", 2, 2, 2, "2301"},
		{"y,,x", 2, 2, 2, "1032"}, {"x", 1, 1, 1, "2"},
	};
	static const enum ts_memory_kind kinds[] = {TS_MEM_DEVICE, TS_MEM_PINNED_HOST,
	                                            TS_MEM_UNPINNED_HOST};
	uint64_t shape[3] = {8, 6, 16}, r = 0x5eed0002;
	unsigned char parent[8 * 6 * 16 * 2];

	for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
		for (size_t k = 0; k < 3; k++) {
			struct ts_placement pl = {.committed = true};
			struct ts_array *a;
			char what[64];

			named(&pl.sharding, kinds[k], specs[i].naxes, specs[i].m0, specs[i].m1,
			      specs[i].devs, specs[i].spec);
			a = make("w", TS_DT_UINT16, 3, shape, &pl);
			fill_random(parent, sizeof parent, i * 3 + k);
			write_all(a, parent);
			snprintf(what, sizeof what, "P(%s) %s", specs[i].spec, ts_memory_kind_name(kinds[k]));
			check_shards(a, parent, what);
			check_reads(a, parent, &r);
			ts_array_unref(a);
		}
	}
}
END_TEST

/* A strided read of an array sharded over two devices costs one copy per
 * shard (a covering window each), and is exact. */
START_TEST(test_strided_read_of_shards_one_copy_each)
{
	enum { ROWS = 64, COLS = 4096, N = ROWS * COLS * 4, STEP = 16 };
	uint64_t shape[2] = {ROWS, COLS};
	struct ts_placement pl = {.committed = true};
	unsigned char *parent = malloc(N), *out = malloc(N / STEP * 4);
	struct ts_run *runs = calloc(N / STEP, sizeof *runs);
	uint64_t c0, c1;
	struct ts_array *a;
	struct ts_error err;
	size_t bad = 0;

	ck_assert(parent && out && runs);
	named(&pl.sharding, TS_MEM_DEVICE, 1, 2, 0, "01", "x");
	a = make("s", TS_DT_FLOAT32, 2, shape, &pl);
	fill_random(parent, N, 77);
	write_all(a, parent);
	for (size_t i = 0; i < N / STEP; i++)      /* a[:, ::4] as runs of one float */
		runs[i] = (struct ts_run){.src_offset = i * STEP, .dst_offset = i * 4, .len = 4};
	c0 = ts_device_copies(sim(0));
	c1 = ts_device_copies(sim(1));
	ts_error_clear(&err);
	ck_assert_msg(ts_array_read(stg, a, runs, N / STEP, out, &err) == TS_OK, "%s", err.message);
	ck_assert_uint_eq(ts_device_copies(sim(0)) - c0, 1);
	ck_assert_uint_eq(ts_device_copies(sim(1)) - c1, 1);
	for (size_t i = 0; i < N / STEP; i++)
		bad += memcmp(out + i * 4, parent + i * STEP, 4) != 0;
	ck_assert_uint_eq(bad, 0);
	ts_array_unref(a);
	free(parent);
	free(out);
	free(runs);
}
END_TEST

/* Shards past the staging slot size, and the single-device path. */
START_TEST(test_writer_large_shards)
{
	static const struct pdef pls[] = {
		{NULL, TS_MEM_DEVICE, 2, 2, 2, "0123", "x,y"},
		{NULL, TS_MEM_DEVICE, 2, 2, 2, "0123", ""},
		{NULL, TS_MEM_PINNED_HOST, 1, 2, 1, "10", ",,x"},
		{"sim:3", TS_MEM_DEVICE, 0, 0, 0, NULL, NULL},
	};
	uint64_t shape[3] = {64, 48, 1024}, r = 0x5eed0003;
	size_t n = 64 * 48 * 1024 * 2;
	unsigned char *parent = malloc(n);

	ck_assert_ptr_nonnull(parent);
	for (size_t i = 0; i < sizeof pls / sizeof pls[0]; i++) {
		struct ts_placement pl;
		struct ts_array *a;

		placement(&pl, &pls[i]);
		a = make("big", TS_DT_UINT16, 3, shape, &pl);
		fill_random(parent, n, 100 + i);
		write_all(a, parent);
		check_shards(a, parent, pls[i].spec ? pls[i].spec : pls[i].single);
		check_reads(a, parent, &r);
		ts_array_unref(a);
	}
	free(parent);
}
END_TEST

START_TEST(test_writer_scalar_and_empty)
{
	struct ts_placement pl = {.committed = true};
	struct ts_array *a;
	unsigned char v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0};
	struct ts_run run = {0, 0, 8};
	uint64_t shape[2] = {0, 4};
	struct ts_array_writer *w;
	struct ts_error err;

	ts_error_clear(&err);
	named(&pl.sharding, TS_MEM_DEVICE, 2, 2, 2, "0123", "");
	a = make("s", TS_DT_FLOAT64, 0, NULL, &pl);
	write_all(a, v);
	check_shards(a, v, "scalar");
	ck_assert_int_eq(ts_array_read(stg, a, &run, 1, out, &err), TS_OK);
	ck_assert(memcmp(out, v, 8) == 0);
	ts_array_unref(a);
	/* an empty array: nothing to write, finish succeeds */
	named(&pl.sharding, TS_MEM_DEVICE, 2, 2, 2, "0123", "x,y");
	a = make("e", TS_DT_FLOAT32, 2, shape, &pl);
	ck_assert_int_eq(ts_array_writer_new(stg, a, &w, &err), TS_OK);
	ck_assert_int_eq(ts_array_writer_write(w, v, 0, &err), TS_OK);
	ck_assert_int_eq(ts_array_writer_write(w, v, 1, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_array_writer_finish(w, &err), TS_OK);
	ts_array_writer_free(w);
	ts_array_unref(a);
}
END_TEST

/* ---- 3. copies between arrays ---------------------------------------------------- */

/* Placements of [8, 12, 10] float32 in every kind, across sim devices. */
static const struct pdef copy_pls[] = {
	{"sim:0", TS_MEM_DEVICE, 0, 0, 0, NULL, NULL},
	{"sim:1", TS_MEM_PINNED_HOST, 0, 0, 0, NULL, NULL},
	{"sim:2", TS_MEM_UNPINNED_HOST, 0, 0, 0, NULL, NULL},
	{"cpu:0", TS_MEM_DEVICE, 0, 0, 0, NULL, NULL},
	{NULL, TS_MEM_DEVICE, 2, 2, 2, "0123", "x,y"},
	{NULL, TS_MEM_PINNED_HOST, 2, 2, 2, "3210", "x"},
	{NULL, TS_MEM_UNPINNED_HOST, 1, 4, 1, "1302", ",x"},
	{NULL, TS_MEM_DEVICE, 2, 2, 2, "0123", ""},
	{NULL, TS_MEM_DEVICE, 1, 2, 1, "21", ",,x"},
	{NULL, TS_MEM_PINNED_HOST, 1, 1, 1, "1", "x"},
	{NULL, TS_MEM_UNPINNED_HOST, 2, 2, 2, "0123", "xy"},
	{NULL, TS_MEM_DEVICE, 2, 2, 2, "2031", "y,,x"},
};
#define NPLS (sizeof copy_pls / sizeof copy_pls[0])
static const uint64_t copy_shape[3] = {8, 12, 10};

struct prog {
	uint64_t total;
	int calls;
	int cancel_after;     /* > 0: cancelled once this many chunks completed */
	int asked;
};

static void on_progress(void *arg, uint64_t bytes)
{
	struct prog *p = arg;

	p->total += bytes;
	p->calls++;
}

static bool on_cancelled(void *arg)
{
	struct prog *p = arg;

	p->asked++;
	return p->cancel_after > 0 && p->calls >= p->cancel_after;
}

/* The expected contents of every shard of dst after copying runs of the
 * parent src into it, skipping shards flagged in skip; returns the bytes
 * that land in non-skipped shards (replicas counted). */
static uint64_t apply_runs(const struct ts_array *dst, unsigned char **want, const bool *skip,
                           const unsigned char *src, const struct ts_run *runs, size_t n)
{
	const struct ts_array_desc *d = ts_array_desc(dst);
	uint64_t moved = 0;

	for (size_t i = 0; i < n; i++) {
		for (uint64_t j = 0; j < runs[i].len; j++) {
			for (int s = 0; s < ts_array_nshards(dst); s++) {
				uint64_t local;

				if ((skip && skip[s]) ||
				    !locate(d->rank, d->shape, esz_of(dst), ts_array_box(dst, s),
				            runs[i].dst_offset + j, &local))
					continue;
				want[s][local] = src[runs[i].src_offset + j];
				moved++;
			}
		}
	}
	return moved;
}

static void check_against(const struct ts_array *a, unsigned char **want, const char *what)
{
	for (int s = 0; s < ts_array_nshards(a); s++) {
		unsigned char *got = read_shard(a, s);

		if (memcmp(got, want[s], ts_buffer_size(ts_array_shard_buffer(a, s))) != 0)
			ck_abort_msg("%s: shard %d differs", what, s);
		free(got);
	}
}

static unsigned char **shard_images(const struct ts_array *a, const unsigned char *parent)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	unsigned char **img = calloc((size_t)ts_array_nshards(a), sizeof *img);

	ck_assert_ptr_nonnull(img);
	for (int s = 0; s < ts_array_nshards(a); s++) {
		uint64_t n = box_bytes(d->rank, esz_of(a), ts_array_box(a, s));

		img[s] = malloc(n ? n : 1);
		ck_assert_ptr_nonnull(img[s]);
		box_extract(parent, d->rank, d->shape, esz_of(a), ts_array_box(a, s), img[s]);
	}
	return img;
}

static void free_images(const struct ts_array *a, unsigned char **img)
{
	for (int s = 0; s < ts_array_nshards(a); s++)
		free(img[s]);
	free(img);
}

/* Random runs: disjoint destinations in random order, sources anywhere. */
static size_t random_runs(uint64_t *r, uint64_t n, struct ts_run *runs, size_t max)
{
	size_t k = 1 + (size_t)below(r, max), nr = 0;
	uint64_t at = below(r, 50);

	for (size_t i = 0; i < k && at < n; i++) {
		uint64_t len = below(r, i % 2 ? 40 : (n - at) / 2 + 1);

		len = len < n - at ? len : n - at;
		runs[nr++] = (struct ts_run){.src_offset = below(r, n - len + 1), .dst_offset = at,
		                             .len = len};
		at += len + below(r, 64);
	}
	for (size_t i = nr; i > 1; i--) {
		size_t j = (size_t)below(r, i);
		struct ts_run t = runs[i - 1];

		runs[i - 1] = runs[j];
		runs[j] = t;
	}
	return nr;
}

static void copy_pair_case(size_t si, size_t di, uint64_t *r)
{
	struct ts_placement ps, pd;
	struct ts_array *src, *dst;
	uint64_t n = 8 * 12 * 10 * 4;
	unsigned char *sp = malloc(n), *dp = malloc(n), **want;
	struct ts_run whole = {0, 0, n}, runs[24];
	bool skip[TS_MESH_MAX_DEVICES] = {false};
	struct prog pr = {0};
	struct ts_error err;
	char what[96];
	uint64_t moved;
	size_t nr;

	ts_error_clear(&err);
	placement(&ps, &copy_pls[si]);
	placement(&pd, &copy_pls[di]);
	src = make("src", TS_DT_FLOAT32, 3, copy_shape, &ps);
	dst = make("dst", TS_DT_FLOAT32, 3, copy_shape, &pd);
	fill_random(sp, n, si * 100 + di);
	fill_random(dp, n, si * 100 + di + 7777);
	write_all(src, sp);
	write_all(dst, dp);

	/* the whole array: every replica gets everything */
	snprintf(what, sizeof what, "copy %zu -> %zu whole", si, di);
	want = shard_images(dst, dp);
	moved = apply_runs(dst, want, NULL, sp, &whole, 1);
	ck_assert_uint_eq(moved, (uint64_t)ts_array_nshards(dst) * ts_buffer_size(ts_array_shard_buffer(dst, 0)));
	ck_assert_msg(ts_array_copy(stg, dst, NULL, src, &whole, 1, on_progress, on_cancelled, &pr,
	                            &err) == TS_OK, "%s: %s", what, err.message);
	ck_assert_uint_eq(pr.total, moved);
	check_against(dst, want, what);
	check_shards(src, sp, "the source after a copy");

	/* sub-runs to other offsets, some shards skipped */
	for (int round = 0; round < 2; round++) {
		snprintf(what, sizeof what, "copy %zu -> %zu runs round %d", si, di, round);
		for (int s = 0; s < ts_array_nshards(dst); s++)
			skip[s] = ts_array_nshards(dst) > 1 && below(r, 3) == 0;
		nr = random_runs(r, n, runs, 24);
		pr = (struct prog){0};
		moved = apply_runs(dst, want, skip, sp, runs, nr);
		ck_assert_msg(ts_array_copy(stg, dst, skip, src, runs, nr, on_progress, NULL, &pr,
		                            &err) == TS_OK, "%s: %s", what, err.message);
		ck_assert_uint_eq(pr.total, moved);
		check_against(dst, want, what);
	}
	/* no callbacks at all */
	nr = random_runs(r, n, runs, 8);
	apply_runs(dst, want, NULL, sp, runs, nr);
	ck_assert_int_eq(ts_array_copy(stg, dst, NULL, src, runs, nr, NULL, NULL, NULL, &err), TS_OK);
	check_against(dst, want, "copy without callbacks");

	free_images(dst, want);
	ts_array_unref(src);
	ts_array_unref(dst);
	free(sp);
	free(dp);
}

START_TEST(test_copy_between_shardings)
{
	uint64_t r = 0x5eed0004;

	for (size_t si = 0; si < NPLS; si++)
		for (size_t di = 0; di < NPLS; di++)
			copy_pair_case(si, di, &r);
}
END_TEST

/* 80 MiB, several 32 MiB chunks per pair of shards. */
START_TEST(test_copy_large_cancel_and_fail)
{
	uint64_t shape[2] = {80, MiB}, n = 80 * MiB;
	unsigned char *parent = malloc(n), *back = malloc(n);
	struct ts_placement ps, pd = {.committed = true}, p1;
	struct ts_array *src, *dst, *one;
	struct ts_run whole = {0, 0, n};
	struct prog pr = {0};
	struct ts_error err;
	ts_status st;

	ck_assert(parent && back);
	ts_error_clear(&err);
	fill_random(parent, n, 42);
	ts_placement_single(&ps, sim(0), TS_MEM_DEVICE, true);
	named(&pd.sharding, TS_MEM_DEVICE, 1, 2, 1, "12", "x");
	ts_placement_single(&p1, sim(3), TS_MEM_DEVICE, true);
	src = make("src", TS_DT_UINT8, 2, shape, &ps);
	dst = make("dst", TS_DT_UINT8, 2, shape, &pd);
	one = make("one", TS_DT_UINT8, 2, shape, &p1);
	write_all(src, parent);

	/* sharded destination: each pair takes two chunks */
	ck_assert_msg(ts_array_copy(stg, dst, NULL, src, &whole, 1, on_progress, on_cancelled, &pr,
	                            &err) == TS_OK, "%s", err.message);
	ck_assert_uint_eq(pr.total, n);
	ck_assert_int_ge(pr.calls, 4);
	memset(back, 0, n);
	ck_assert_int_eq(ts_array_read(stg, dst, &whole, 1, back, &err), TS_OK);
	ck_assert(memcmp(back, parent, n) == 0);

	/* cancelled after the first chunk: CANCELLED, one chunk's progress */
	pr = (struct prog){.cancel_after = 1};
	st = ts_array_copy(stg, one, NULL, src, &whole, 1, on_progress, on_cancelled, &pr, &err);
	ck_assert_int_eq(st, TS_CANCELLED);
	ck_assert_int_eq(pr.calls, 1);
	ck_assert_uint_eq(pr.total, 32 * MiB);
	ts_error_clear(&err);

	/* an injected copy failure on the destination's device fails the copy ... */
	ts__sim_inject_copy_failure(sim(3), 1);
	pr = (struct prog){0};
	st = ts_array_copy(stg, one, NULL, src, &whole, 1, on_progress, on_cancelled, &pr, &err);
	ck_assert_int_ne(st, TS_OK);
	ck_assert_uint_lt(pr.total, n);
	ts_error_clear(&err);
	/* ... and the next one succeeds */
	pr = (struct prog){0};
	ck_assert_msg(ts_array_copy(stg, one, NULL, src, &whole, 1, on_progress, on_cancelled, &pr,
	                            &err) == TS_OK, "the copy after an injected failure: %s",
	              err.message);
	ck_assert_uint_eq(pr.total, n);
	memset(back, 0, n);
	ck_assert_int_eq(ts_array_read(stg, one, &whole, 1, back, &err), TS_OK);
	ck_assert(memcmp(back, parent, n) == 0);

	ts_array_unref(src);
	ts_array_unref(dst);
	ts_array_unref(one);
	free(parent);
	free(back);
}
END_TEST

/* An injected failure on one device of a sharded destination. */
START_TEST(test_copy_injected_failure_sharded)
{
	struct ts_placement ps, pd;
	struct ts_array *src, *dst;
	uint64_t n = 8 * 12 * 10 * 4;
	unsigned char *sp = malloc(n);
	struct ts_run whole = {0, 0, n};
	struct ts_error err;

	ts_error_clear(&err);
	placement(&ps, &copy_pls[1]);          /* sim:1 pinned */
	placement(&pd, &copy_pls[4]);          /* 2x2 P('x','y') device */
	src = make("src", TS_DT_FLOAT32, 3, copy_shape, &ps);
	dst = make("dst", TS_DT_FLOAT32, 3, copy_shape, &pd);
	fill_random(sp, n, 5);
	write_all(src, sp);
	ts__sim_inject_copy_failure(sim(2), 1);
	ck_assert_int_ne(ts_array_copy(stg, dst, NULL, src, &whole, 1, NULL, NULL, NULL, &err), TS_OK);
	ts_error_clear(&err);
	ck_assert_msg(ts_array_copy(stg, dst, NULL, src, &whole, 1, NULL, NULL, NULL, &err) == TS_OK,
	              "the copy after an injected failure: %s", err.message);
	check_shards(dst, sp, "after a failed copy");
	ts_array_unref(src);
	ts_array_unref(dst);
	free(sp);
}
END_TEST

/* An injected failure while writing a sharded array fails that writer; the
 * next writer of the same shards succeeds. */
START_TEST(test_writer_after_injected_failure)
{
	struct ts_placement pl;
	struct ts_array *a;
	uint64_t n = 8 * 12 * 10 * 4;
	unsigned char *p = malloc(n);
	struct ts_array_writer *w;
	struct ts_error err;
	ts_status st;

	ts_error_clear(&err);
	placement(&pl, &copy_pls[4]);          /* 2x2 P('x','y') device */
	a = make("w", TS_DT_FLOAT32, 3, copy_shape, &pl);
	fill_random(p, n, 11);
	ck_assert_int_eq(ts_array_writer_new(stg, a, &w, &err), TS_OK);
	ts__sim_inject_copy_failure(sim(1), 1);
	st = ts_array_writer_write(w, p, n, &err);
	if (st == TS_OK)
		st = ts_array_writer_finish(w, &err);
	ck_assert_int_ne(st, TS_OK);
	ts_array_writer_free(w);
	ts_error_clear(&err);
	write_all(a, p);
	check_shards(a, p, "after a failed writer");
	ts_array_unref(a);
	free(p);
}
END_TEST

/* Concurrent reads and copies of one source from several threads. */
struct worker {
	struct ts_array *src;
	const unsigned char *parent;
	int idx;
	int failures;
};

static void *copy_worker(void *arg)
{
	struct worker *w = arg;
	uint64_t n = ts_array_desc(w->src)->nbytes;
	unsigned char *back = malloc(n);
	struct ts_run whole = {0, 0, n};

	for (int it = 0; it < 6; it++) {
		struct ts_placement pd;
		struct ts_array *dst = NULL;
		struct ts_array_desc d = *ts_array_desc(w->src);
		struct ts_error err;

		ts_error_clear(&err);
		placement(&pd, &copy_pls[(size_t)(w->idx * 5 + it) % NPLS]);
		if (ts_array_new("t", &d, &pd, mem, &dst, &err) != TS_OK ||
		    ts_array_copy(stg, dst, NULL, w->src, &whole, 1, NULL, NULL, NULL, &err) != TS_OK ||
		    ts_array_read(stg, dst, &whole, 1, back, &err) != TS_OK ||
		    memcmp(back, w->parent, n) != 0)
			w->failures++;
		ts_array_unref(dst);
	}
	free(back);
	return NULL;
}

START_TEST(test_copy_from_many_threads)
{
	struct ts_placement ps;
	struct ts_array *src;
	uint64_t n = 8 * 12 * 10 * 4;
	unsigned char *sp = malloc(n);
	struct worker w[4];
	pthread_t th[4];

	placement(&ps, &copy_pls[4]);
	src = make("src", TS_DT_FLOAT32, 3, copy_shape, &ps);
	fill_random(sp, n, 9);
	write_all(src, sp);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){.src = src, .parent = sp, .idx = i};
		ck_assert_int_eq(pthread_create(&th[i], NULL, copy_worker, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(w[i].failures, 0);
	}
	ts_array_unref(src);
	free(sp);
}
END_TEST

/* ---- 4. new_like and 5. exact accounting ------------------------------------------ */

/* Each space's bytes_in_use and live allocations equal those of the unique
 * live buffers of arrs (NULL entries skipped). */
static void check_stats(struct ts_array *const *arrs, size_t n, const char *what)
{
	struct ts_buffer *seen[512];
	size_t nseen = 0;

	for (size_t i = 0; i < n; i++) {
		if (!arrs[i])
			continue;
		for (int s = 0; s < ts_array_nshards(arrs[i]); s++) {
			struct ts_buffer *b = ts_array_shard_buffer(arrs[i], s);
			size_t k = 0;

			ck_assert_uint_eq(ts_buffer_size(b), box_bytes(ts_array_desc(arrs[i])->rank,
			                                              esz_of(arrs[i]), ts_array_box(arrs[i], s)));
			ck_assert_int_eq(ts_buffer_kind(b), ts_array_placement(arrs[i])->sharding.memory_kind);
			ck_assert_ptr_eq(ts_buffer_device(b), ts_array_box(arrs[i], s)->device);
			while (k < nseen && seen[k] != b)
				k++;
			if (k == nseen) {
				ck_assert_uint_lt(nseen, 512);
				seen[nseen++] = b;
			}
		}
	}
	for (size_t i = 0; i < ts_memory_space_count(mem); i++) {
		struct ts_space *sp = ts_memory_space_at(mem, i);
		struct ts_space_stats st;
		uint64_t bytes = 0, live = 0;

		for (size_t k = 0; k < nseen; k++) {
			if (ts_buffer_space(seen[k]) == sp) {
				bytes += ts_buffer_size(seen[k]);
				live++;
			}
		}
		ts_space_stats(sp, &st);
		if (st.bytes_in_use != bytes || st.live_allocs != live)
			ck_abort_msg("%s: %s holds %llu bytes in %llu allocations, expected %llu in %llu",
			             what, ts_space_name(sp), (unsigned long long)st.bytes_in_use,
			             (unsigned long long)st.live_allocs, (unsigned long long)bytes,
			             (unsigned long long)live);
	}
}

/* Which shards of a new placement should share a buffer of src. */
static int expected_shared(const struct ts_array *src, const struct ts_array *dst, int *match)
{
	int count = 0, rank = ts_array_desc(src)->rank;

	for (int i = 0; i < ts_array_nshards(dst); i++) {
		const struct ts_shard_box *b = ts_array_box(dst, i);

		match[i] = -1;
		if (ts_array_placement(src)->sharding.memory_kind !=
		    ts_array_placement(dst)->sharding.memory_kind)
			continue;
		for (int j = 0; j < ts_array_nshards(src) && match[i] < 0; j++) {
			const struct ts_shard_box *c = ts_array_box(src, j);
			bool same = c->device == b->device;

			for (int d = 0; d < rank; d++)
				same = same && c->start[d] == b->start[d] && c->count[d] == b->count[d];
			if (same)
				match[i] = j;
		}
		count += match[i] >= 0;
	}
	return count;
}

static const struct pdef like_pls[] = {
	{"sim:0", TS_MEM_DEVICE, 0, 0, 0, NULL, NULL},
	{"sim:1", TS_MEM_DEVICE, 0, 0, 0, NULL, NULL},
	{"sim:0", TS_MEM_PINNED_HOST, 0, 0, 0, NULL, NULL},
	{NULL, TS_MEM_DEVICE, 2, 2, 2, "0123", "x"},          /* sim0,1: rows 0:4; sim2,3: 4:8 */
	{NULL, TS_MEM_DEVICE, 1, 2, 1, "02", "x"},            /* all reused from the one above */
	{NULL, TS_MEM_DEVICE, 1, 2, 1, "01", "x"},            /* sim:0 reused, sim:1 fresh */
	{NULL, TS_MEM_DEVICE, 2, 2, 2, "0123", "x,y"},
	{NULL, TS_MEM_DEVICE, 2, 2, 2, "0123", ""},
	{NULL, TS_MEM_PINNED_HOST, 2, 2, 2, "0123", ""},
	{NULL, TS_MEM_DEVICE, 1, 1, 1, "0", "x"},             /* the same as single sim:0 */
	{NULL, TS_MEM_DEVICE, 1, 4, 1, "0123", "x"},
	{NULL, TS_MEM_DEVICE, 2, 2, 2, "3210", "x,y"},
};
#define NLIKE (sizeof like_pls / sizeof like_pls[0])

START_TEST(test_new_like_shares_matching_shards)
{
	uint64_t n = 8 * 12 * 10 * 4;
	unsigned char *sp = malloc(n);
	int partial = 0, full = 0, none = 0;

	for (size_t si = 0; si < NLIKE; si++) {
		for (size_t di = 0; di < NLIKE; di++) {
			struct ts_placement ps, pd;
			struct ts_array *arrs[2];
			bool shared[TS_MESH_MAX_DEVICES];
			int match[TS_MESH_MAX_DEVICES], reused = -1, want;
			struct ts_run whole = {0, 0, n};
			struct ts_error err;
			char what[64];

			ts_error_clear(&err);
			snprintf(what, sizeof what, "new_like %zu -> %zu", si, di);
			placement(&ps, &like_pls[si]);
			placement(&pd, &like_pls[di]);
			arrs[0] = make("src", TS_DT_FLOAT32, 3, copy_shape, &ps);
			fill_random(sp, n, si * 31 + di);
			write_all(arrs[0], sp);
			ck_assert_msg(ts_array_new_like("like", arrs[0], &pd, mem, &arrs[1], &reused,
			                                shared, &err) == TS_OK, "%s: %s", what, err.message);
			want = expected_shared(arrs[0], arrs[1], match);
			ck_assert_int_eq(reused, want);
			for (int i = 0; i < ts_array_nshards(arrs[1]); i++) {
				struct ts_buffer *b = ts_array_shard_buffer(arrs[1], i);

				ck_assert_int_eq(shared[i], match[i] >= 0);
				if (match[i] >= 0) {
					ck_assert_ptr_eq(b, ts_array_shard_buffer(arrs[0], match[i]));
					continue;
				}
				for (int j = 0; j < ts_array_nshards(arrs[0]); j++)
					ck_assert_ptr_ne(b, ts_array_shard_buffer(arrs[0], j));
			}
			partial += want > 0 && want < ts_array_nshards(arrs[1]);
			full += want == ts_array_nshards(arrs[1]);
			none += want == 0;
			check_stats(arrs, 2, what);
			/* completing it: copy into the fresh shards only */
			ck_assert_int_eq(ts_array_copy(stg, arrs[1], shared, arrs[0], &whole, 1, NULL, NULL,
			                               NULL, &err), TS_OK);
			check_shards(arrs[1], sp, what);
			check_shards(arrs[0], sp, "the source of new_like");
			/* shared buffers outlive the source */
			ts_array_unref(arrs[0]);
			arrs[0] = NULL;
			check_stats(arrs, 2, what);
			check_shards(arrs[1], sp, what);
			ts_array_unref(arrs[1]);
			check_stats(NULL, 0, what);
		}
	}
	ck_assert_int_gt(partial, 0);
	ck_assert_int_gt(full, NLIKE);
	ck_assert_int_gt(none, 0);
	free(sp);
}
END_TEST

/* Shapes for the random sequence, each with a dtype. */
static const struct {
	enum ts_dtype dt;
	int rank;
	uint64_t shape[3];
} seq_shapes[] = {
	{TS_DT_FLOAT32, 3, {8, 12, 10}},
	{TS_DT_UINT8, 2, {4, 4}},
	{TS_DT_UINT16, 1, {16}},
	{TS_DT_FLOAT64, 0, {0}},
	{TS_DT_FLOAT32, 2, {0, 4}},
	{TS_DT_INT64, 3, {4, 2, 2}},
};
#define NSEQ_SHAPES (sizeof seq_shapes / sizeof seq_shapes[0])

static void random_placement(uint64_t *r, struct ts_placement *pl)
{
	static const enum ts_memory_kind kinds[] = {TS_MEM_DEVICE, TS_MEM_PINNED_HOST,
	                                            TS_MEM_UNPINNED_HOST};
	const struct pdef *d = &like_pls[below(r, NLIKE)];

	placement(pl, d);
	if (below(r, 2)) {
		enum ts_memory_kind k = kinds[below(r, 3)];

		if (pl->sharding.type == TS_SHARDING_SINGLE)
			pl->sharding.memory_kind = k;
		else
			ts_sharding_with_memory_kind(&pl->sharding, k, &pl->sharding);
	}
}

/* Whether a shard of a shares its buffer with a shard of b. */
static void shared_with(const struct ts_array *a, const struct ts_array *b, bool *skip)
{
	for (int i = 0; i < ts_array_nshards(a); i++) {
		skip[i] = false;
		for (int j = 0; j < ts_array_nshards(b); j++)
			skip[i] |= ts_array_shard_buffer(a, i) == ts_array_shard_buffer(b, j);
	}
}

START_TEST(test_random_sequence_exact_stats)
{
	enum { POOL = 12, STEPS = 400 };
	struct ts_array *pool[POOL] = {NULL};
	size_t shape_of[POOL] = {0};
	uint64_t r = 0x5eed0005;
	unsigned char *buf = malloc(8 * 12 * 10 * 4);
	int ops[5] = {0};

	for (int step = 0; step < STEPS; step++) {
		int op = (int)below(&r, 5), i = (int)below(&r, POOL), j = (int)below(&r, POOL);
		struct ts_placement pl;
		struct ts_error err;
		char what[64];

		ts_error_clear(&err);
		snprintf(what, sizeof what, "step %d op %d", step, op);
		switch (op) {
		case 0: {     /* create */
			size_t k = (size_t)below(&r, NSEQ_SHAPES);
			struct ts_array_desc d = {.dtype = seq_shapes[k].dt, .rank = seq_shapes[k].rank};
			struct ts_array *a = NULL;
			ts_status st;

			memcpy(d.shape, seq_shapes[k].shape, sizeof seq_shapes[k].shape);
			ck_assert_int_eq(ts_array_desc_init(&d, &err), TS_OK);
			random_placement(&r, &pl);
			st = ts_array_new("r", &d, &pl, mem, &a, &err);
			if (st == TS_INVALID_ARGUMENT) {      /* uneven split: nothing changed */
				ck_assert_ptr_null(a);
				break;
			}
			ck_assert_msg(st == TS_OK, "%s: %s", what, err.message);
			ts_array_unref(pool[i]);
			pool[i] = a;
			shape_of[i] = k;
			ops[0]++;
			break;
		}
		case 1:       /* write */
			if (!pool[i])
				break;
			fill_random(buf, ts_array_desc(pool[i])->nbytes, (uint64_t)step);
			write_all(pool[i], buf);
			ops[1]++;
			break;
		case 2: {     /* copy between two arrays of one shape, sharing respected */
			bool skip[TS_MESH_MAX_DEVICES];
			struct ts_run whole;

			for (int k = 0; pool[i] && k < POOL; k++, j = (j + 1) % POOL)
				if (pool[j] && pool[j] != pool[i] && shape_of[j] == shape_of[i])
					break;      /* the next array of the same shape */
			if (!pool[i] || !pool[j] || pool[i] == pool[j] || shape_of[i] != shape_of[j])
				break;
			whole = (struct ts_run){0, 0, ts_array_desc(pool[i])->nbytes};
			shared_with(pool[j], pool[i], skip);
			ck_assert_msg(ts_array_copy(stg, pool[j], skip, pool[i], &whole, 1, NULL, NULL,
			                            NULL, &err) == TS_OK, "%s: %s", what, err.message);
			ops[2]++;
			break;
		}
		case 3: {     /* new_like */
			struct ts_array *a = NULL;
			int reused;
			ts_status st;

			if (!pool[i])
				break;
			random_placement(&r, &pl);
			st = ts_array_new_like("l", pool[i], &pl, mem, &a, &reused, NULL, &err);
			if (st == TS_INVALID_ARGUMENT)
				break;
			ck_assert_msg(st == TS_OK, "%s: %s", what, err.message);
			ts_array_unref(pool[j]);
			pool[j] = a;
			shape_of[j] = shape_of[i];
			ops[3]++;
			break;
		}
		default:      /* drop a reference, or take another into a second slot */
			if (below(&r, 2) && pool[i] && i != j) {
				ts_array_unref(pool[j]);
				pool[j] = ts_array_ref(pool[i]);
				shape_of[j] = shape_of[i];
			} else {
				ts_array_unref(pool[i]);
				pool[i] = NULL;
			}
			ops[4]++;
			break;
		}
		check_stats(pool, POOL, what);
	}
	for (int k = 0; k < 5; k++)
		ck_assert_msg(ops[k] > 20, "op %d ran %d times", k, ops[k]);
	for (int i = 0; i < POOL; i++) {
		ts_array_unref(pool[i]);
		pool[i] = NULL;
		check_stats(pool, POOL, "dropping everything");
	}
	free(buf);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("array_io");
	TCase *tl = tcase_create("layout");
	TCase *tw = tcase_create("writer");
	TCase *tc = tcase_create("copy");
	TCase *ta = tcase_create("accounting");

	tcase_add_test(tl, test_layout_matches_brute_force);
	tcase_add_checked_fixture(tl, setup, teardown);
	tcase_add_test(tl, test_layout_one_piece_inside_a_shard);
	tcase_add_test(tl, test_layout_callback_failure_stops_the_walk);
	tcase_set_timeout(tl, 120);
	tcase_add_checked_fixture(tw, setup, teardown);
	tcase_add_test(tw, test_writer_fills_every_shard);
	tcase_add_test(tw, test_writer_large_shards);
	tcase_add_test(tw, test_writer_scalar_and_empty);
	tcase_add_test(tw, test_strided_read_of_shards_one_copy_each);
	tcase_set_timeout(tw, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_copy_between_shardings);
	tcase_add_test(tc, test_copy_large_cancel_and_fail);
	tcase_add_test(tc, test_copy_injected_failure_sharded);
	tcase_add_test(tc, test_writer_after_injected_failure);
	tcase_add_test(tc, test_copy_from_many_threads);
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(ta, setup, teardown);
	tcase_add_test(ta, test_new_like_shares_matching_shards);
	tcase_add_test(ta, test_random_sequence_exact_stats);
	tcase_set_timeout(ta, 120);
	suite_add_tcase(s, tl);
	suite_add_tcase(s, tw);
	suite_add_tcase(s, tc);
	suite_add_tcase(s, ta);
	return s;
}
