/*
 * sharding.c - meshes, partition specs and the boxes they give each device,
 * as JAX computes them, plus the registry of saved shardings.
 *
 * A device's block index along a dimension split by mesh axes (a1, a2, ...)
 * is its mesh coordinates on those axes read row-major (a1 outermost); its
 * replica number is its coordinates on the axes the spec leaves unused, read
 * row-major, which is its rank in mesh order among the devices holding the
 * same box. Everything here is computed from the sharding value alone; only
 * the registry holds state: a common/registry.h map behind its rwlock.
 */
#include "storage/sharding.h"

#include <assert.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/lock.h"
#include "common/name.h"
#include "common/registry.h"

/* ---- mesh geometry ------------------------------------------------------------- */

/* Coordinate of the k-th device of m (mesh order) along axis. */
static int mesh_coord(const struct ts_mesh *m, int k, int axis)
{
	int stride = 1;

	for (int a = m->naxes - 1; a > axis; a--)
		stride *= m->shape[a];
	return (k / stride) % m->shape[axis];
}

/* The spec entry of dimension d (None past the given entries). */
static const struct ts_spec_entry *spec_at(const struct ts_sharding *s, int d)
{
	static const struct ts_spec_entry none = {0};

	return s->type == TS_SHARDING_NAMED && d < s->spec_rank ? &s->spec[d] : &none;
}

/* Number of blocks dimension d is cut into. */
static int dim_blocks(const struct ts_sharding *s, int d)
{
	const struct ts_spec_entry *e = spec_at(s, d);
	int n = 1;

	for (int i = 0; i < e->naxes; i++)
		n *= s->mesh.shape[e->axes[i]];
	return n;
}

/* Block index of the k-th device along dimension d. */
static int block_of(const struct ts_sharding *s, int k, int d)
{
	const struct ts_spec_entry *e = spec_at(s, d);
	int b = 0;

	for (int i = 0; i < e->naxes; i++)
		b = b * s->mesh.shape[e->axes[i]] + mesh_coord(&s->mesh, k, e->axes[i]);
	return b;
}

/* Replica number of the k-th device: its coordinates on unused axes. */
static int replica_of(const struct ts_sharding *s, int k)
{
	bool used[TS_MESH_MAX_AXES] = {false};
	int r = 0;

	if (s->type != TS_SHARDING_NAMED)
		return 0;
	for (int d = 0; d < s->spec_rank; d++)
		for (int i = 0; i < s->spec[d].naxes; i++)
			used[s->spec[d].axes[i]] = true;
	for (int a = 0; a < s->mesh.naxes; a++)
		if (!used[a])
			r = r * s->mesh.shape[a] + mesh_coord(&s->mesh, k, a);
	return r;
}

static int sharding_ndevices(const struct ts_sharding *s)
{
	return s->type == TS_SHARDING_NAMED ? s->mesh.ndevices : 1;
}

static struct ts_device *sharding_device(const struct ts_sharding *s, int k)
{
	return s->type == TS_SHARDING_NAMED ? s->mesh.devices[k] : s->device;
}

/* "('x', 'y')" or "'x'" for the axes of one spec entry. */
static void format_axes(const struct ts_sharding *s, const struct ts_spec_entry *e,
                        char *buf, size_t cap)
{
	size_t o = 0;

	buf[0] = '\0';
	if (e->naxes == 1) {
		snprintf(buf, cap, "'%s'", s->mesh.axis_names[e->axes[0]]);
		return;
	}
	for (int i = 0; i < e->naxes && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s'%s'%s", i ? ", " : "(",
		                      s->mesh.axis_names[e->axes[i]], i == e->naxes - 1 ? ")" : "");
}

/* ---- building and validating ------------------------------------------------------ */

void ts_sharding_single(struct ts_sharding *out, struct ts_device *dev,
                        enum ts_memory_kind kind)
{
	memset(out, 0, sizeof *out);
	out->type = TS_SHARDING_SINGLE;
	out->memory_kind = kind;
	out->device = dev;
}

void ts_sharding_with_memory_kind(const struct ts_sharding *s, enum ts_memory_kind kind,
                                  struct ts_sharding *out)
{
	if (out != s)
		memcpy(out, s, sizeof *out);
	out->memory_kind = kind;
}

/* Bad input, through the one helper (common/status.h). */
#define BAD(err, ...) ts_error_bad((err), "BAD_SHARDING", NULL, __VA_ARGS__)

static ts_status validate_mesh(const struct ts_mesh *m, struct ts_error *err)
{
	long long prod = 1;

	if (m->ndevices < 1 || m->ndevices > TS_MESH_MAX_DEVICES)
		return BAD(err, "mesh has %d devices; it must have 1 to %d", m->ndevices,
		           TS_MESH_MAX_DEVICES);
	if (m->naxes < 1 || m->naxes > TS_MESH_MAX_AXES)
		return BAD(err, "mesh has %d axes; it must have 1 to %d", m->naxes, TS_MESH_MAX_AXES);
	for (int a = 0; a < m->naxes; a++) {
		const char *name = m->axis_names[a];

		if (name[0] == '\0' || !memchr(name, '\0', TS_AXIS_NAME_MAX))
			return BAD(err, "mesh axis %d needs a name of 1 to %d characters", a,
			           TS_AXIS_NAME_MAX - 1);
		for (int b = 0; b < a; b++)
			if (strcmp(m->axis_names[b], name) == 0)
				return BAD(err, "mesh axis name '%s' appears twice", name);
		if (m->shape[a] < 1)
			return BAD(err, "mesh axis '%s' has size %d; sizes must be at least 1", name,
			           m->shape[a]);
		prod *= m->shape[a];
		if (prod > TS_MESH_MAX_DEVICES)
			break;
	}
	if (prod != m->ndevices) {
		char dims[TS_MESH_MAX_AXES * 12 + 4];
		size_t o = 0;

		for (int a = 0; a < m->naxes && o < sizeof dims; a++)
			o += (size_t)snprintf(dims + o, sizeof dims - o, "%s%d", a ? ", " : "",
			                      m->shape[a]);
		return BAD(err, "mesh shape (%s) does not hold the %d devices the mesh lists",
		           dims, m->ndevices);
	}
	for (int k = 0; k < m->ndevices; k++) {
		if (!m->devices[k])
			return BAD(err, "mesh device %d is missing", k);
		for (int j = 0; j < k; j++)
			if (m->devices[j] == m->devices[k])
				return BAD(err, "device '%s' appears twice in the mesh",
				           ts_device_props(m->devices[k])->id);
	}
	return TS_OK;
}

static ts_status validate_spec(const struct ts_sharding *s, struct ts_error *err)
{
	bool used[TS_MESH_MAX_AXES] = {false};

	if (s->spec_rank < 0 || s->spec_rank > TS_MAX_RANK)
		return BAD(err, "partition spec has %d entries; at most %d", s->spec_rank,
		           TS_MAX_RANK);
	for (int d = 0; d < s->spec_rank; d++) {
		const struct ts_spec_entry *e = &s->spec[d];

		if (e->naxes < 0 || e->naxes > TS_SPEC_MAX_AXES)
			return BAD(err, "partition spec entry %d names %d mesh axes; at most %d", d,
			           e->naxes, TS_SPEC_MAX_AXES);
		for (int i = 0; i < e->naxes; i++) {
			int a = e->axes[i];

			if (a < 0 || a >= s->mesh.naxes)
				return BAD(err, "partition spec entry %d names mesh axis %d; the mesh has %d",
				           d, a, s->mesh.naxes);
			if (used[a])
				return BAD(err, "mesh axis '%s' is used twice in the partition spec",
				           s->mesh.axis_names[a]);
			used[a] = true;
		}
	}
	return TS_OK;
}

ts_status ts_sharding_validate(const struct ts_sharding *s, struct ts_error *err)
{
	ts_status st;

	if ((unsigned)s->memory_kind >= TS_MEM_KIND_COUNT)
		return BAD(err, "memory kind %d is not one of device, pinned_host, unpinned_host",
		           (int)s->memory_kind);
	if (s->type == TS_SHARDING_SINGLE)
		return s->device ? TS_OK : BAD(err, "single-device sharding has no device");
	if (s->type != TS_SHARDING_NAMED)
		return BAD(err, "sharding type %d is unknown", (int)s->type);
	st = validate_mesh(&s->mesh, err);
	if (st == TS_OK)
		st = validate_spec(s, err);
	return st;
}

/* Whether s can shard an array of this rank and shape (valid, spec no
 * longer than rank, split dimensions divisible). */
static ts_status check_shape(const struct ts_sharding *s, int rank, const uint64_t *shape,
                             struct ts_error *err)
{
	ts_status st = ts_sharding_validate(s, err);

	if (st != TS_OK)
		return st;
	if (rank < 0 || rank > TS_MAX_RANK)
		return BAD(err, "array rank %d is outside 0..%d", rank, TS_MAX_RANK);
	if (s->type == TS_SHARDING_NAMED && s->spec_rank > rank)
		return BAD(err, "partition spec has %d entries but the array has rank %d",
		           s->spec_rank, rank);
	for (int d = 0; d < rank; d++) {
		uint64_t n = (uint64_t)dim_blocks(s, d);
		char axes[TS_SPEC_MAX_AXES * (TS_AXIS_NAME_MAX + 4) + 4];

		if (shape[d] % n == 0)
			continue;
		format_axes(s, spec_at(s, d), axes, sizeof axes);
		return BAD(err, "dimension %d of size %" PRIu64 " is not divisible by %" PRIu64
		           ", the size of mesh %s %s", d, shape[d], n,
		           spec_at(s, d)->naxes == 1 ? "axis" : "axes", axes);
	}
	return TS_OK;
}

ts_status ts_sharding_boxes(const struct ts_sharding *s, int rank, const uint64_t *shape,
                            struct ts_shard_box *out, int *n, struct ts_error *err)
{
	ts_status st = check_shape(s, rank, shape, err);
	int nd;

	if (st != TS_OK)
		return st;
	nd = sharding_ndevices(s);
	for (int k = 0; k < nd; k++) {
		struct ts_shard_box *b = &out[k];

		memset(b, 0, sizeof *b);
		b->device = sharding_device(s, k);
		b->replica = replica_of(s, k);
		for (int d = 0; d < rank; d++) {
			uint64_t size = shape[d] / (uint64_t)dim_blocks(s, d);

			b->start[d] = (uint64_t)block_of(s, k, d) * size;
			b->count[d] = size;
		}
	}
	*n = nd;
	return TS_OK;
}

bool ts_sharding_equal(const struct ts_sharding *a, const struct ts_sharding *b)
{
	int n = sharding_ndevices(a);

	if (ts_sharding_validate(a, NULL) != TS_OK || ts_sharding_validate(b, NULL) != TS_OK)
		return false;
	if (a->memory_kind != b->memory_kind || n != sharding_ndevices(b))
		return false;
	for (int d = 0; d < TS_MAX_RANK; d++)
		if (dim_blocks(a, d) != dim_blocks(b, d))
			return false;
	for (int k = 0; k < n; k++) {
		int j = 0;

		while (j < n && sharding_device(b, j) != sharding_device(a, k))
			j++;
		if (j == n)
			return false;
		for (int d = 0; d < TS_MAX_RANK; d++)
			if (block_of(a, k, d) != block_of(b, j, d))
				return false;
	}
	return true;
}

/* ---- text rendering ----------------------------------------------------------------- */

/* snprintf-style writer: counts what it needs, writes what fits. */
struct text {
	char *buf;
	size_t cap;
	size_t len;
};

static void text_printf(struct text *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void text_printf(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	if (t->len < t->cap)
		n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
	else
		n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		t->len += (size_t)n;
}

static void text_repeat(struct text *t, char c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (t->len + 1 < t->cap)
			t->buf[t->len] = c;
		t->len++;
	}
	if (t->cap)
		t->buf[t->len < t->cap ? t->len : t->cap - 1] = '\0';
}

#define CELL_MAX (TS_MESH_MAX_DEVICES * 33 + 1)

/* Linear block id of device k over the first rank dimensions (row-major). */
static int linear_block(const struct ts_sharding *s, int k, int rank)
{
	int id = 0;

	for (int d = 0; d < rank; d++)
		id = id * dim_blocks(s, d) + block_of(s, k, d);
	return id;
}

/* The devices holding block id, comma-separated, in mesh order; returns
 * the length, and the first such device in *first (-1 when none). */
static size_t cell_devices(const struct ts_sharding *s, int rank, int id, char *buf,
                           size_t cap, int *first)
{
	struct text t = {buf, cap, 0};

	buf[0] = '\0';
	*first = -1;
	for (int k = 0; k < sharding_ndevices(s); k++) {
		if (linear_block(s, k, rank) != id)
			continue;
		if (*first < 0)
			*first = k;
		text_printf(&t, "%s%s", t.len ? "," : "", ts_device_props(sharding_device(s, k))->id);
	}
	return t.len;
}

/* The index ranges of device k's box: "[0:4, :]" (":" for whole dimensions). */
static size_t cell_ranges(const struct ts_sharding *s, int rank, const uint64_t *shape, int k,
                          char *buf, size_t cap)
{
	struct text t = {buf, cap, 0};

	buf[0] = '\0';
	text_printf(&t, "[");
	for (int d = 0; d < rank; d++) {
		uint64_t size = shape[d] / (uint64_t)dim_blocks(s, d),
		         start = (uint64_t)block_of(s, k, d) * size;

		if (spec_at(s, d)->naxes == 0)
			text_printf(&t, "%s:", d ? ", " : "");
		else
			text_printf(&t, "%s%" PRIu64 ":%" PRIu64, d ? ", " : "", start, start + size);
	}
	text_printf(&t, "]");
	return t.len;
}

static void text_centered(struct text *t, const char *s, size_t len, size_t width)
{
	size_t left = (width - len) / 2;

	text_repeat(t, ' ', left);
	text_printf(t, "%s", s);
	text_repeat(t, ' ', width - len - left);
}

static void grid_rule(struct text *t, int cols, size_t width)
{
	for (int c = 0; c < cols; c++) {
		text_printf(t, "+");
		text_repeat(t, '-', width + 2);
	}
	text_printf(t, "+\n");
}

/* Rank 1 and 2: rows are blocks of dimension 0 (one row for rank 1),
 * columns blocks of the last dimension. */
static void render_grid(const struct ts_sharding *s, int rank, const uint64_t *shape,
                        struct text *t)
{
	int rows = rank == 2 ? dim_blocks(s, 0) : 1, cols = dim_blocks(s, rank - 1);
	char devs[CELL_MAX], ranges[CELL_MAX];
	size_t width = 1;
	int first;

	for (int id = 0; id < rows * cols; id++) {
		size_t a = cell_devices(s, rank, id, devs, sizeof devs, &first),
		       b = first < 0 ? 0 : cell_ranges(s, rank, shape, first, ranges, sizeof ranges);

		width = a > width ? a : width;
		width = b > width ? b : width;
	}
	grid_rule(t, cols, width);
	for (int r = 0; r < rows; r++) {
		for (int line = 0; line < 2; line++) {
			for (int c = 0; c < cols; c++) {
				int id = r * cols + c;
				size_t len = cell_devices(s, rank, id, devs, sizeof devs, &first);

				if (line == 1)
					len = first < 0 ? 0 : cell_ranges(s, rank, shape, first, ranges,
					                                  sizeof ranges);
				text_printf(t, "| ");
				text_centered(t, line == 0 ? devs : (first < 0 ? "" : ranges), len, width);
				text_printf(t, " ");
			}
			text_printf(t, "|\n");
		}
		grid_rule(t, cols, width);
	}
}

/* Other ranks: one line per distinct box, "[0:4, 0:8, :] sim:0,sim:2". */
static void render_list(const struct ts_sharding *s, int rank, const uint64_t *shape,
                        struct text *t)
{
	char devs[CELL_MAX], ranges[CELL_MAX];
	int total = 1, first;

	for (int d = 0; d < rank; d++)
		total *= dim_blocks(s, d);
	for (int id = 0; id < total; id++) {
		cell_devices(s, rank, id, devs, sizeof devs, &first);
		if (first < 0)
			continue;
		cell_ranges(s, rank, shape, first, ranges, sizeof ranges);
		text_printf(t, "%s %s\n", ranges, devs);
	}
}

size_t ts_sharding_render_text(const struct ts_sharding *s, int rank, const uint64_t *shape,
                               char *buf, size_t cap)
{
	struct text t = {buf, cap, 0};
	struct ts_error err;

	if (cap)
		buf[0] = '\0';
	ts_error_clear(&err);
	if (check_shape(s, rank, shape, &err) != TS_OK)
		text_printf(&t, "invalid sharding: %s\n", err.message);
	else if (rank == 1 || rank == 2)
		render_grid(s, rank, shape, &t);
	else
		render_list(s, rank, shape, &t);
	text_printf(&t, "memory_kind: %s\n", ts_memory_kind_name(s->memory_kind));
	return t.len;
}

/* ---- saved shardings ----------------------------------------------------------------- */

#define REGISTRY_MAX 4096

struct entry {
	char name[TS_NAME_MAX + 1];
	struct ts_sharding sharding;
};

struct ts_sharding_registry {
	struct ts_rwlock lock;
	struct ts_registry names;  /* of struct entry (own); guarded by: lock */
};

struct ts_sharding_registry *ts_sharding_registry_new(void)
{
	struct ts_sharding_registry *r = calloc(1, sizeof *r);

	if (r && ts_rwlock_init(&r->lock) != 0) {
		free(r);
		return NULL;
	}
	if (r)
		ts_registry_init(&r->names);
	return r;
}

void ts_sharding_registry_free(struct ts_sharding_registry *r)
{
	if (!r)
		return;
	ts_rwlock_destroy(&r->lock);
	for (size_t i = 0; i < ts_registry_count(&r->names); i++)
		free(ts_registry_at(&r->names, i));
	ts_registry_release(&r->names);
	free(r);
}

static ts_status insert_locked(struct ts_sharding_registry *r, const char *name,
                               const struct ts_sharding *s, struct ts_error *err)
{
	struct entry *e;
	ts_status st;

	assert(ts_rwlock_writing(&r->lock));
	if (ts_registry_get(&r->names, name))
		return ts_error_set(err, TS_ALREADY_EXISTS, "SHARDING_EXISTS",
		                    "sharding '%s' already exists", name);
	if (ts_registry_count(&r->names) == REGISTRY_MAX)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "TOO_MANY_SHARDINGS",
		                    "sharding '%s' cannot be saved: %d shardings are saved already",
		                    name, REGISTRY_MAX);
	e = calloc(1, sizeof *e);
	if (!e || ts_registry_reserve(&r->names, 1, NULL) != TS_OK) {
		free(e);
		return ts_error_oom(err, "no memory to save sharding '%s'", name);
	}
	memcpy(e->name, name, strlen(name) + 1);
	e->sharding = *s;
	st = ts_registry_put(&r->names, e->name, e, NULL, err);   /* valid, new, room reserved */
	if (st != TS_OK)
		free(e);
	return st;
}

ts_status ts_sharding_registry_put(struct ts_sharding_registry *r, const char *name,
                                   const struct ts_sharding *s, struct ts_error *err)
{
	ts_status st;

	if (!ts_name_valid(name))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING_NAME",
		                    "sharding name '%s' is invalid: it must match "
		                    "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", name ? name : "");
	st = ts_sharding_validate(s, err);
	if (st != TS_OK)
		return st;
	ts_rwlock_wrlock(&r->lock);
	st = insert_locked(r, name, s, err);
	ts_rwlock_unlock(&r->lock);
	return st;
}

bool ts_sharding_registry_get(struct ts_sharding_registry *r, const char *name,
                              struct ts_sharding *out)
{
	const struct entry *e;

	ts_rwlock_rdlock(&r->lock);
	e = ts_registry_get(&r->names, name);
	if (e)
		*out = e->sharding;
	ts_rwlock_unlock(&r->lock);
	return e != NULL;
}

void ts_sharding_registry_each(struct ts_sharding_registry *r,
                               void (*fn)(const char *name, const struct ts_sharding *s, void *arg),
                               void *arg)
{
	ts_rwlock_rdlock(&r->lock);
	for (size_t i = 0; i < ts_registry_count(&r->names); i++) {
		const struct entry *e = ts_registry_at(&r->names, i);

		fn(e->name, &e->sharding, arg);
	}
	ts_rwlock_unlock(&r->lock);
}
