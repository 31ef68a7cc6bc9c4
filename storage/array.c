/*
 * array.c - immutable array versions and the name -> version catalog (a
 * common/registry.h map under a reader-writer lock, which stays here).
 */
#include "storage/array.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
#include "common/hash.h"
#include "common/lock.h"
#include "common/registry.h"
#include "common/units.h"

/* A version's last reference may go on any thread, and its metadata with it
 * (docs/ARCHITECTURE.md's jansson rule). */
#if !JANSSON_THREAD_SAFE_REFCOUNT
#error "jansson without atomic reference counts (JANSSON_THREAD_SAFE_REFCOUNT)"
#endif

struct ts_array {
	_Atomic uint32_t refs;
	char name[TS_ARRAY_NAME_MAX + 1];       /* immutable */
	struct ts_array_desc desc;              /* immutable */
	struct ts_placement placement;          /* immutable */
	int nshards;                            /* immutable */
	struct ts_buffer *bufs[TS_MESH_MAX_DEVICES];      /* immutable; own references */
	json_t *metadata;                       /* immutable after publish; own, unshared */
	uint64_t implicit_bytes;                /* immutable after publish */
	char owner[112];                        /* immutable after publish */
	char held_by[40];                       /* guarded by: the catalog's lock */
	/* the name's persist mark: before publish what this version asks (-1:
	 * keep the previous version's), then the mark itself; written under the
	 * catalog's write lock, read atomically by anyone */
	_Atomic int persist;
	/* assigned once, under the catalog's write lock, before publication */
	uint64_t version;
	char etag[24];
	uint64_t created_ns, updated_ns;
	bool published;
	uint64_t seal;                          /* TS_DEBUG: seal_of at publish */
	/* Last, and written only for the first nshards (nothing reads past
	 * them): an array on one device uses under 1 KiB of their 60 KiB, which
	 * were zeroed, or copied for a new version, each time an array was
	 * made. FIELDS_END: the fields before them. */
	struct ts_shard_box boxes[TS_MESH_MAX_DEVICES];   /* immutable */
	struct ts_layout layout;                /* immutable */
};

#define FIELDS_END offsetof(struct ts_array, boxes)

struct ts_catalog {
	struct ts_rwlock lock;
	struct ts_registry names;               /* guarded by: lock; own references */
	uint64_t bytes;                         /* guarded by: lock */
	uint64_t next_tag;                      /* guarded by: lock (write) */
};

/* ---- arrays ---------------------------------------------------------------- */

/*
 * Debug builds (TS_DEBUG: make DEBUG=1, and every sanitizer build) seal a
 * version when it is published: a hash of every field that is immutable
 * from then on (all but refs and held_by), the metadata by its text. The
 * seal is checked when the version is replaced or deleted and when its last
 * reference goes, so a published version written in place (its metadata
 * changed through the pointer ts_array_metadata lends, say) stops the
 * process there. Release builds keep neither.
 */
#if TS_DEBUG
static uint64_t seal_of(const struct ts_array *a)
{
	uint64_t h = TS_FNV1A_INIT;
	char *meta = a->metadata ? json_dumps(a->metadata, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	int n = a->nshards < TS_MESH_MAX_DEVICES ? a->nshards : TS_MESH_MAX_DEVICES;

	h = ts_fnv1a(h, a->name, sizeof a->name);
	h = ts_fnv1a(h, &a->desc, sizeof a->desc);
	h = ts_fnv1a(h, &a->placement, sizeof a->placement);
	h = ts_fnv1a(h, &a->nshards, sizeof a->nshards);
	h = ts_fnv1a(h, a->boxes, (size_t)(n > 0 ? n : 0) * sizeof a->boxes[0]);
	h = ts_fnv1a(h, a->bufs, sizeof a->bufs);
	h = ts_fnv1a(h, &a->layout, offsetof(struct ts_layout, shard));
	h = ts_fnv1a(h, a->layout.shard, (size_t)(n > 0 ? n : 0) * sizeof a->layout.shard[0]);
	h = ts_fnv1a(h, &a->metadata, sizeof a->metadata);
	h = ts_fnv1a(h, meta ? meta : "", meta ? strlen(meta) : 0);
	h = ts_fnv1a(h, &a->implicit_bytes, sizeof a->implicit_bytes);
	h = ts_fnv1a(h, a->owner, sizeof a->owner);
	h = ts_fnv1a(h, &a->version, sizeof a->version);
	h = ts_fnv1a(h, a->etag, sizeof a->etag);
	h = ts_fnv1a(h, &a->created_ns, sizeof a->created_ns);
	h = ts_fnv1a(h, &a->updated_ns, sizeof a->updated_ns);
	free(meta);
	return h;
}

static void seal(struct ts_array *a)
{
	a->seal = seal_of(a);
}

static void check_sealed(const struct ts_array *a)
{
	assert(!a->published || a->seal == seal_of(a));  /* a published version changed */
}
#else
static void seal(struct ts_array *a) { (void)a; }
static void check_sealed(const struct ts_array *a) { (void)a; }
#endif

bool ts_array_name_valid(const char *name)
{
	return ts_name_valid(name);
}

ts_status ts_array_desc_init(struct ts_array_desc *d, struct ts_error *err)
{
	if (d->rank < 0 || d->rank > TS_MAX_RANK)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHAPE",
		                    "rank %d is outside 0..%d", d->rank, TS_MAX_RANK);
	if ((int)d->dtype < 0 || d->dtype >= TS_DT_COUNT)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE", "unknown dtype");
	if (!ts_shape_nbytes(d->rank, d->shape, d->dtype, &d->nbytes))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHAPE",
		                    "shape holds more than 2^64 bytes");
	return TS_OK;
}

void ts_placement_single(struct ts_placement *pl, struct ts_device *dev,
                         enum ts_memory_kind kind, bool committed)
{
	ts_sharding_single(&pl->sharding, dev, kind);
	pl->committed = committed;
}

static bool same_box(const struct ts_shard_box *x, const struct ts_shard_box *y, int rank)
{
	if (x->device != y->device)
		return false;
	for (int d = 0; d < rank; d++)
		if (x->start[d] != y->start[d] || x->count[d] != y->count[d])
			return false;
	return true;
}

static uint64_t box_bytes(const struct ts_array *a, int i)
{
	uint64_t n = ts_dtype_size(a->desc.dtype);

	for (int k = 0; k < a->desc.rank; k++)
		n *= a->boxes[i].count[k];
	return n;
}

static bool shares_with(const struct ts_array *a, int i, const struct ts_array *src,
                        enum ts_memory_kind kind)
{
	for (int j = 0; src && j < src->nshards; j++)
		if (src->placement.sharding.memory_kind == kind &&
		    same_box(&src->boxes[j], &a->boxes[i], a->desc.rank))
			return true;
	return false;
}

/*
 * Admission of a sharded array before any shard is allocated: the shards
 * that need new memory, summed per space (host kinds: over the node-wide
 * pool), must fit now; else nothing is allocated at all. Advisory against
 * concurrent allocations; the allocation itself stays exact.
 */
static ts_status admit(const struct ts_array *a, const struct ts_array *src,
                       enum ts_memory_kind kind, struct ts_memory *mem, struct ts_error *err)
{
	bool host = kind != TS_MEM_DEVICE;
	uint64_t host_sum = 0;
	struct ts_space *host_sp = NULL;

	if (a->nshards <= 1)
		return TS_OK;    /* one allocation: its own refusal is already exact */
	for (int i = 0; i < a->nshards; i++) {
		struct ts_space *sp = ts_memory_find(mem, ts_device_props(a->boxes[i].device)->id, kind);
		uint64_t sum = 0;
		bool seen = false;

		if (!sp || shares_with(a, i, src, kind))
			continue;
		if (host) {
			host_sum += box_bytes(a, i);
			host_sp = sp;
			continue;
		}
		for (int j = 0; j < i; j++)
			if (a->boxes[j].device == a->boxes[i].device)
				seen = true;
		if (seen)
			continue;
		for (int j = i; j < a->nshards; j++)
			if (a->boxes[j].device == a->boxes[i].device && !shares_with(a, j, src, kind))
				sum += box_bytes(a, j);
		if (ts_space_check_fit(sp, sum, err) != TS_OK)
			return TS_RESOURCE_EXHAUSTED;
	}
	if (host_sp && ts_space_check_fit(host_sp, host_sum, err) != TS_OK)
		return TS_RESOURCE_EXHAUSTED;
	return TS_OK;
}

/* Shared by ts_array_new and ts_array_new_like: src may be NULL. */
static ts_status array_create(const char *name, const struct ts_array_desc *d,
                              const struct ts_placement *pl, const struct ts_array *src,
                              struct ts_memory *mem, struct ts_array **out, int *reused,
                              bool *shared, struct ts_error *err)
{
	struct ts_array *a = ts_fault_malloc(sizeof *a);
	enum ts_memory_kind kind = pl->sharding.memory_kind;
	ts_status st;

	if (!a)
		return ts_error_oom(err, "no memory for array '%s'", name);
	/* the boxes are written by ts_sharding_boxes, the layout by
	 * ts_layout_init, each for the shards there are */
	memset(a, 0, FIELDS_END);
	atomic_init(&a->refs, 1);
	atomic_init(&a->persist, -1);
	snprintf(a->name, sizeof a->name, "%s", name);
	a->desc = *d;
	a->placement = *pl;
	if (reused)
		*reused = 0;
	st = ts_sharding_boxes(&pl->sharding, d->rank, d->shape, a->boxes, &a->nshards, err);
	if (st == TS_OK)
		st = admit(a, src, kind, mem, err);
	for (int i = 0; st == TS_OK && i < a->nshards; i++) {
		const struct ts_device_props *pr = ts_device_props(a->boxes[i].device);
		struct ts_space *sp = ts_memory_find(mem, pr->id, kind);
		uint64_t n = ts_dtype_size(d->dtype);

		if (shared)
			shared[i] = false;
		for (int k = 0; k < d->rank; k++)
			n *= a->boxes[i].count[k];
		for (int j = 0; src && j < src->nshards; j++) {
			if (src->placement.sharding.memory_kind == kind &&
			    same_box(&src->boxes[j], &a->boxes[i], d->rank)) {
				a->bufs[i] = ts_buffer_ref(src->bufs[j]);
				if (shared)
					shared[i] = true;
				if (reused)
					(*reused)++;
				break;
			}
		}
		if (a->bufs[i])
			continue;
		if (!sp)
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PLACEMENT",
			                  "device '%s' has no %s memory", pr->id, ts_memory_kind_name(kind));
		else
			st = ts_buffer_new(sp, n, &a->bufs[i], err);
	}
	if (st != TS_OK) {
		ts_array_unref(a);
		return st;
	}
	ts_layout_init(&a->layout, d->rank, d->shape, ts_dtype_size(d->dtype), a->boxes, a->nshards);
	*out = a;
	return TS_OK;
}

ts_status ts_array_new(const char *name, const struct ts_array_desc *d,
                       const struct ts_placement *pl, struct ts_memory *mem,
                       struct ts_array **out, struct ts_error *err)
{
	return array_create(name, d, pl, NULL, mem, out, NULL, NULL, err);
}

ts_status ts_array_new_like(const char *name, const struct ts_array *src,
                            const struct ts_placement *pl, struct ts_memory *mem,
                            struct ts_array **out, int *reused, bool *shared,
                            struct ts_error *err)
{
	return array_create(name, &src->desc, pl, src, mem, out, reused, shared, err);
}

struct ts_array *ts_array_ref(struct ts_array *a)
{
	atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
	return a;
}

void ts_array_unref(struct ts_array *a)
{
	uint32_t was;

	if (!a)
		return;
	was = atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel);
	assert(was > 0);     /* an unref without its reference */
	if (was != 1)
		return;
	check_sealed(a);
	for (int i = 0; i < TS_MESH_MAX_DEVICES; i++)
		ts_buffer_unref(a->bufs[i]);
	json_decref(a->metadata);
	free(a);
}

const char *ts_array_name(const struct ts_array *a) { return a->name; }
const struct ts_array_desc *ts_array_desc(const struct ts_array *a) { return &a->desc; }
const struct ts_placement *ts_array_placement(const struct ts_array *a) { return &a->placement; }
int ts_array_nshards(const struct ts_array *a) { return a->nshards; }
const struct ts_shard_box *ts_array_box(const struct ts_array *a, int i) { return &a->boxes[i]; }
struct ts_buffer *ts_array_shard_buffer(const struct ts_array *a, int i) { return a->bufs[i]; }
const struct ts_layout *ts_array_layout(const struct ts_array *a) { return &a->layout; }

struct ts_buffer *ts_array_single_buffer(const struct ts_array *a)
{
	return a->nshards == 1 ? a->bufs[0] : NULL;
}

bool ts_array_on(const struct ts_array *a, const struct ts_device *device,
                 enum ts_memory_kind kind)
{
	if (a->placement.sharding.memory_kind != kind)
		return false;
	for (int i = 0; i < a->nshards; i++)
		if (!device || a->boxes[i].device == device)
			return true;
	return false;
}
uint64_t ts_array_version(const struct ts_array *a) { return a->version; }
const char *ts_array_etag(const struct ts_array *a) { return a->etag; }
uint64_t ts_array_created_ns(const struct ts_array *a) { return a->created_ns; }
uint64_t ts_array_updated_ns(const struct ts_array *a) { return a->updated_ns; }
const json_t *ts_array_metadata(const struct ts_array *a) { return a->metadata; }
uint64_t ts_array_implicit_bytes(const struct ts_array *a) { return a->implicit_bytes; }
void ts_array_set_implicit_bytes(struct ts_array *a, uint64_t n)
{
	assert(!a->published);
	a->implicit_bytes = n;
}

void ts_array_set_metadata(struct ts_array *a, json_t *meta)
{
	assert(!a->published);
	/* the version's alone, never shared (jansson's singletons count nothing) */
	assert(!meta || meta->refcount == 1 || meta->refcount == (size_t)-1);
	json_decref(a->metadata);
	a->metadata = meta;
}

const char *ts_array_owner(const struct ts_array *a) { return a->owner; }

void ts_array_set_persist(struct ts_array *a, bool on)
{
	assert(!a->published);
	atomic_store(&a->persist, on);
}

bool ts_array_persisted(const struct ts_array *a)
{
	return atomic_load(&a->persist) > 0;
}

void ts_array_set_owner(struct ts_array *a, const char *owner)
{
	assert(!a->published);
	snprintf(a->owner, sizeof a->owner, "%s", owner ? owner : "");
}

ts_status ts_array_new_version(const struct ts_array *a, struct ts_array **out,
                               struct ts_error *err)
{
	struct ts_array *v = malloc(sizeof *v);
	json_t *meta = a->metadata ? json_deep_copy(a->metadata) : NULL;

	if (!v || (a->metadata && !meta)) {
		free(v);
		json_decref(meta);
		return ts_error_oom(err, "no memory for a new version of array '%s'", a->name);
	}
	/* field by field: the counts and the hold are the new version's own */
	memset(v, 0, FIELDS_END);
	atomic_init(&v->refs, 1);
	atomic_init(&v->persist, -1);
	memcpy(v->name, a->name, sizeof v->name);
	v->desc = a->desc;
	v->placement = a->placement;
	v->nshards = a->nshards;
	memcpy(v->boxes, a->boxes, (size_t)a->nshards * sizeof v->boxes[0]);
	for (int i = 0; i < TS_MESH_MAX_DEVICES; i++)
		v->bufs[i] = a->bufs[i] ? ts_buffer_ref(a->bufs[i]) : NULL;
	memcpy(&v->layout, &a->layout, ts_layout_bytes(a->nshards));
	v->metadata = meta;                       /* its own copy: never shared by reference */
	v->implicit_bytes = a->implicit_bytes;
	memcpy(v->owner, a->owner, sizeof v->owner);
	*out = v;
	return TS_OK;
}

/* ---- catalog --------------------------------------------------------------- */

struct ts_catalog *ts_catalog_new(void)
{
	struct ts_catalog *c = calloc(1, sizeof *c);

	if (!c)
		return NULL;
	ts_registry_init(&c->names);
	ts_rwlock_init(&c->lock);
	return c;
}

void ts_catalog_free(struct ts_catalog *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < ts_registry_count(&c->names); i++)
		ts_array_unref(ts_registry_at(&c->names, i));
	ts_registry_release(&c->names);
	ts_rwlock_destroy(&c->lock);
	free(c);
}

/* The current version of name (borrowed), or NULL. */
static struct ts_array *find_locked(struct ts_catalog *c, const char *name)
{
	assert(ts_rwlock_held(&c->lock));
	return ts_registry_get(&c->names, name);
}

struct ts_array *ts_catalog_get(struct ts_catalog *c, const char *name)
{
	struct ts_array *a;

	ts_rwlock_rdlock(&c->lock);
	a = find_locked(c, name);
	if (a)
		ts_array_ref(a);
	ts_rwlock_unlock(&c->lock);
	return a;
}

static ts_status check_pre_locked(const struct ts_catalog *c, const struct ts_array *cur,
                                  const char *name, const struct ts_precondition *pre,
                                  struct ts_error *err)
{
	assert(ts_rwlock_held(&c->lock));
	if (!pre)
		return TS_OK;
	if (pre->create_only && cur)
		return ts_error_set(err, TS_ALREADY_EXISTS, "ARRAY_EXISTS",
		                    "array '%s' already exists (If-None-Match: *)", name);
	if (pre->if_match && (!cur || (strcmp(pre->if_match, "*") != 0 &&
	                               strcmp(pre->if_match, cur->etag) != 0)))
		return ts_error_set(err, TS_FAILED_PRECONDITION, "ETAG_MISMATCH",
		                    "array '%s' is %s, not %s (If-Match)", name,
		                    cur ? cur->etag : "absent", pre->if_match);
	return TS_OK;
}

static void format_desc(char *buf, size_t cap, const struct ts_array_desc *d)
{
	int n = snprintf(buf, cap, "%s [", ts_dtype_name(d->dtype));

	for (int i = 0; i < d->rank && n > 0 && (size_t)n < cap; i++)
		n += snprintf(buf + n, cap - (size_t)n, "%s%llu", i ? ", " : "",
		              (unsigned long long)d->shape[i]);
	if (n > 0 && (size_t)n < cap)
		snprintf(buf + n, cap - (size_t)n, "]");
}

static bool same_desc(const struct ts_array_desc *x, const struct ts_array_desc *y)
{
	if (x->dtype != y->dtype || x->rank != y->rank)
		return false;
	for (int i = 0; i < x->rank; i++)
		if (x->shape[i] != y->shape[i])
			return false;
	return true;
}

/*
 * Whether cur (the current version of name, may be NULL) may be replaced by
 * a version of desc d (NULL: deleted): a hold by another operation refuses
 * both, an owner refuses a new dtype or shape and a delete by anyone else.
 */
static ts_status check_write_locked(const struct ts_catalog *c, const struct ts_array *cur,
                                    const char *name, const struct ts_array_desc *d,
                                    const struct ts_precondition *pre, struct ts_error *err)
{
	const char *holder = pre ? pre->holder : NULL, *owner = pre ? pre->owner : NULL;

	assert(ts_rwlock_held(&c->lock));
	if (!cur)
		return TS_OK;
	if (cur->held_by[0] && !(holder && strcmp(holder, cur->held_by) == 0)) {
		ts_error_set(err, TS_ABORTED, "ARRAY_HELD",
		             "array '%s' is held by operation %s, which uses it in place; wait for "
		             "it to finish or cancel it", name, cur->held_by);
		ts_error_meta(err, "operation", "%s", cur->held_by);
		return TS_ABORTED;
	}
	if (!cur->owner[0] || (owner && strcmp(owner, cur->owner) == 0))
		return TS_OK;
	if (!d)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_OWNED",
		                    "array '%s' belongs to %s; delete the model to delete it", name,
		                    cur->owner);
	if (!same_desc(d, &cur->desc)) {
		char want[160], got[160];

		format_desc(want, sizeof want, &cur->desc);
		format_desc(got, sizeof got, d);
		return ts_error_set(err, TS_INVALID_ARGUMENT, "OWNED_SHAPE",
		                    "array '%s' belongs to %s and must stay %s, not %s", name,
		                    cur->owner, want, got);
	}
	return TS_OK;
}

/* Fills version, ETag and times of a from the version it replaces. */
static void stamp_locked(struct ts_catalog *c, struct ts_array *a, const struct ts_array *prev)
{
	uint64_t now = ts_wall_ns();

	assert(ts_rwlock_writing(&c->lock));
	a->version = prev ? prev->version + 1 : 1;
	a->created_ns = prev ? prev->created_ns : now;
	a->updated_ns = now;
	snprintf(a->etag, sizeof a->etag, "\"%llx-%llx\"", (unsigned long long)a->version,
	         (unsigned long long)++c->next_tag);
	a->published = true;
}

static ts_status bad_name(const char *name, struct ts_error *err)
{
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
	                    "array name '%s' is invalid: it must match "
	                    "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", name);
}

/* Enters a in place of prev, the current version of its name (or as a new
 * name, with room reserved): cannot fail. */
static void install_locked(struct ts_catalog *c, struct ts_array *prev, struct ts_array *a)
{
	void *old;
	ts_status st;

	assert(ts_rwlock_writing(&c->lock));
	stamp_locked(c, a, prev);
	if (prev && prev->owner[0] && !a->owner[0])
		snprintf(a->owner, sizeof a->owner, "%s", prev->owner);
	/* only the holder gets here over a held version: it keeps holding */
	if (prev)
		snprintf(a->held_by, sizeof a->held_by, "%s", prev->held_by);
	/* the persist mark is the name's: kept unless this version set it */
	if (atomic_load(&a->persist) < 0)
		atomic_store(&a->persist, prev && atomic_load(&prev->persist) > 0);
	seal(a);
	ts_array_ref(a);
	c->bytes += a->desc.nbytes;
	st = ts_registry_put(&c->names, a->name, a, &old, NULL);
	assert(st == TS_OK && old == prev);   /* a valid name, room reserved */
	(void)st;
	if (prev) {
		check_sealed(prev);
		c->bytes -= prev->desc.nbytes;
		ts_array_unref(prev);
	}
}

/* Takes the current version of name out; returns it (the catalog's
 * reference, for the caller to drop after unlocking). */
static struct ts_array *unlist_locked(struct ts_catalog *c, const char *name)
{
	struct ts_array *a;

	assert(ts_rwlock_writing(&c->lock));
	a = ts_registry_remove(&c->names, name);
	if (a) {
		check_sealed(a);
		c->bytes -= a->desc.nbytes;
	}
	return a;
}

ts_status ts_catalog_put(struct ts_catalog *c, struct ts_array *a,
                         const struct ts_precondition *pre, bool *replaced,
                         struct ts_error *err)
{
	struct ts_array *cur;
	ts_status st;

	if (!ts_name_valid(a->name))
		return bad_name(a->name, err);
	ts_rwlock_wrlock(&c->lock);
	cur = find_locked(c, a->name);
	st = check_pre_locked(c, cur, a->name, pre, err);
	if (st == TS_OK)
		st = check_write_locked(c, cur, a->name, &a->desc, pre, err);
	if (st == TS_OK && ts_registry_reserve(&c->names, 1, NULL) != TS_OK)
		st = ts_error_oom(err, "no memory for a catalog entry");
	if (st == TS_OK) {
		if (replaced)
			*replaced = cur != NULL;
		install_locked(c, cur, a);
	}
	ts_rwlock_unlock(&c->lock);
	return st;
}

ts_status ts_catalog_replace(struct ts_catalog *c, struct ts_array *a,
                             const struct ts_precondition *pre, struct ts_error *err)
{
	struct ts_array *cur;
	ts_status st;

	ts_rwlock_wrlock(&c->lock);
	cur = find_locked(c, a->name);
	if (!cur)
		st = ts_error_set(err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found",
		                  a->name);
	else
		st = check_pre_locked(c, cur, a->name, pre, err);
	if (st == TS_OK)
		st = check_write_locked(c, cur, a->name, &a->desc, pre, err);
	if (st == TS_OK)
		install_locked(c, cur, a);     /* an existing name: nothing allocated */
	ts_rwlock_unlock(&c->lock);
	return st;
}

ts_status ts_catalog_put_all(struct ts_catalog *c, struct ts_array *const *arrs,
                             size_t n, bool overwrite, struct ts_error *err)
{
	ts_status st = TS_OK;

	for (size_t i = 0; i < n && st == TS_OK; i++) {
		if (!ts_name_valid(arrs[i]->name))
			st = bad_name(arrs[i]->name, err);
		for (size_t j = 0; j < i && st == TS_OK; j++)
			if (strcmp(arrs[i]->name, arrs[j]->name) == 0)
				st = ts_error_set(err, TS_INVALID_ARGUMENT, "DUPLICATE_NAME",
				                  "name '%s' appears twice", arrs[i]->name);
	}
	if (st != TS_OK)
		return st;
	ts_rwlock_wrlock(&c->lock);
	for (size_t i = 0; i < n && !overwrite && st == TS_OK; i++)
		if (find_locked(c, arrs[i]->name))
			st = ts_error_set(err, TS_ALREADY_EXISTS, "ARRAY_EXISTS",
			                  "array '%s' already exists; nothing was imported",
			                  arrs[i]->name);
	for (size_t i = 0; i < n && st == TS_OK; i++)
		st = check_write_locked(c, find_locked(c, arrs[i]->name), arrs[i]->name,
		                        &arrs[i]->desc, NULL, err);
	if (st == TS_OK && ts_registry_reserve(&c->names, n, NULL) != TS_OK)
		st = ts_error_oom(err, "no memory for catalog entries");
	for (size_t i = 0; i < n && st == TS_OK; i++)
		install_locked(c, find_locked(c, arrs[i]->name), arrs[i]);
	ts_rwlock_unlock(&c->lock);
	return st;
}

ts_status ts_catalog_delete(struct ts_catalog *c, const char *name,
                            const struct ts_precondition *pre, struct ts_error *err)
{
	struct ts_array *cur, *gone = NULL;
	ts_status st;

	ts_rwlock_wrlock(&c->lock);
	cur = find_locked(c, name);
	if (!cur) {
		st = ts_error_set(err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found", name);
	} else {
		st = check_pre_locked(c, cur, name, pre, err);
		if (st == TS_OK)
			st = check_write_locked(c, cur, name, NULL, pre, err);
		if (st == TS_OK)
			gone = unlist_locked(c, name);
	}
	ts_rwlock_unlock(&c->lock);
	ts_array_unref(gone);
	return st;
}

ts_status ts_catalog_delete_all(struct ts_catalog *c, const char *const *names, size_t n,
                                const struct ts_precondition *pre, struct ts_error *err)
{
	struct ts_array **gone = calloc(n ? n : 1, sizeof *gone);
	ts_status st = TS_OK;

	if (!gone)
		return ts_error_oom(err, "no memory to delete %zu arrays", n);
	ts_rwlock_wrlock(&c->lock);
	for (size_t i = 0; i < n && st == TS_OK; i++) {
		struct ts_array *cur = find_locked(c, names[i]);

		if (cur)
			st = check_write_locked(c, cur, names[i], NULL, pre, err);
	}
	for (size_t i = 0; i < n && st == TS_OK; i++)
		gone[i] = unlist_locked(c, names[i]);
	ts_rwlock_unlock(&c->lock);
	for (size_t i = 0; i < n; i++)
		ts_array_unref(gone[i]);
	free(gone);
	return st;
}

ts_status ts_catalog_hold(struct ts_catalog *c, struct ts_array *const *arrs, size_t n,
                          const char *holder, struct ts_error *err)
{
	ts_status st = TS_OK;

	if (!holder || !*holder || strlen(holder) >= sizeof arrs[0]->held_by)
		return ts_error_set(err, TS_INTERNAL, "BAD_HOLDER", "a hold needs an operation id");
	ts_rwlock_wrlock(&c->lock);
	for (size_t i = 0; i < n && st == TS_OK; i++) {
		struct ts_array *cur = find_locked(c, arrs[i]->name);

		if (cur != arrs[i]) {
			st = ts_error_set(err, TS_ABORTED, "ARRAY_CHANGED",
			                  "array '%s' was %s while the operation started", arrs[i]->name,
			                  cur ? "replaced" : "deleted");
		} else if (cur->held_by[0] && strcmp(cur->held_by, holder) != 0) {
			st = ts_error_set(err, TS_ABORTED, "ARRAY_HELD",
			                  "array '%s' is held by operation %s, which uses it in place",
			                  arrs[i]->name, cur->held_by);
			ts_error_meta(err, "operation", "%s", cur->held_by);
		}
	}
	for (size_t i = 0; i < n && st == TS_OK; i++)
		snprintf(arrs[i]->held_by, sizeof arrs[i]->held_by, "%s", holder);
	ts_rwlock_unlock(&c->lock);
	return st;
}

void ts_catalog_release(struct ts_catalog *c, const char *holder)
{
	if (!holder || !*holder)
		return;
	ts_rwlock_wrlock(&c->lock);
	for (size_t i = 0; i < ts_registry_count(&c->names); i++) {
		struct ts_array *a = ts_registry_at(&c->names, i);

		if (strcmp(a->held_by, holder) == 0)
			a->held_by[0] = '\0';
	}
	ts_rwlock_unlock(&c->lock);
}

bool ts_catalog_held(struct ts_catalog *c, const char *name, char *holder, size_t cap)
{
	bool held = false;
	struct ts_array *cur;

	ts_rwlock_rdlock(&c->lock);
	cur = find_locked(c, name);
	if (cur && cur->held_by[0]) {
		held = true;
		if (holder && cap)
			snprintf(holder, cap, "%s", cur->held_by);
	}
	ts_rwlock_unlock(&c->lock);
	return held;
}

ts_status ts_catalog_set_persist(struct ts_catalog *c, const char *name, bool on,
                                 struct ts_error *err)
{
	struct ts_array *cur;
	ts_status st = TS_OK;

	ts_rwlock_wrlock(&c->lock);
	cur = find_locked(c, name);
	if (!cur)
		st = ts_error_set(err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found", name);
	else if (cur->owner[0])
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_OWNED",
		                  "array '%s' belongs to %s: persist the model instead", name,
		                  cur->owner);
	else
		atomic_store(&cur->persist, on);
	ts_rwlock_unlock(&c->lock);
	return st;
}

ts_status ts_catalog_check_write(struct ts_catalog *c, const char *name,
                                 const struct ts_array_desc *d,
                                 const struct ts_precondition *pre, struct ts_error *err)
{
	struct ts_array *cur;
	ts_status st;

	ts_rwlock_rdlock(&c->lock);
	cur = find_locked(c, name);
	st = check_pre_locked(c, cur, name, pre, err);
	/* without d, a write that keeps the shape (a move) */
	if (st == TS_OK)
		st = check_write_locked(c, cur, name, d ? d : cur ? &cur->desc : NULL, pre, err);
	ts_rwlock_unlock(&c->lock);
	return st;
}

struct keep_arg {
	bool (*keep)(const struct ts_array *a, void *arg);
	void *arg;
};

static bool keep_array(const void *value, void *arg)
{
	const struct keep_arg *k = arg;

	return k->keep(value, k->arg);
}

ts_status ts_catalog_list(struct ts_catalog *c, const char *after, size_t limit,
                          bool (*keep)(const struct ts_array *a, void *arg), void *arg,
                          struct ts_array ***out, size_t *n, bool *more,
                          struct ts_error *err)
{
	struct keep_arg k = {keep, arg};
	struct ts_array **page;
	size_t m = 0, cap;

	ts_rwlock_rdlock(&c->lock);
	cap = ts_registry_count(&c->names) < limit ? ts_registry_count(&c->names) : limit;
	page = malloc((cap ? cap : 1) * sizeof *page);
	if (page) {
		m = ts_registry_list(&c->names, after, limit, keep ? keep_array : NULL, &k,
		                     (void **)page, more);
		for (size_t i = 0; i < m; i++)
			ts_array_ref(page[i]);
	}
	ts_rwlock_unlock(&c->lock);
	if (!page)
		return ts_error_oom(err, "no memory to list arrays");
	*out = page;
	*n = m;
	return TS_OK;
}

void ts_catalog_list_free(struct ts_array **arrs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		ts_array_unref(arrs[i]);
	free(arrs);
}

void ts_catalog_totals(struct ts_catalog *c, uint64_t *count, uint64_t *bytes)
{
	ts_rwlock_rdlock(&c->lock);
	*count = ts_registry_count(&c->names);
	*bytes = c->bytes;
	ts_rwlock_unlock(&c->lock);
}
