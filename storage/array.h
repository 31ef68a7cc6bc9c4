/*
 * array.h - arrays and the catalog that names them.
 *
 * An array version is immutable once published: name, dtype, shape, its
 * placement (a device and memory kind, and whether it is committed), its
 * data in one buffer per shard, version, ETag and times. Replacing an array
 * publishes a new version; readers holding the old one keep it whole (and
 * its buffers alive) until they drop their reference. Nothing is ever
 * changed in place, so a failed or cut-off upload leaves the previous
 * version exactly as it was.
 *
 * The catalog maps names to their current version. Names match
 * ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$.
 *
 * Holds and owners. An operation that uses a version in place (a training
 * step updates its model's weights in their buffers) holds it, by identity,
 * from submission to completion: every publish over it and every delete of
 * it (upload, import, :put, :copy onto, colocation, DELETE) is refused with
 * ABORTED naming the operation, except a publish by the holder itself,
 * whose new version stays held. A version may carry an owner (a model):
 * replacing it keeps the owner and must keep its dtype and shape
 * (INVALID_ARGUMENT naming the owner, the array and the shape), and only
 * the owner deletes it. Both marks live with the catalog's entries and are
 * checked under its lock, so no writer can slip between a check and its
 * publish.
 *
 * Thread-safety: the catalog is guarded by a reader-writer lock held only to
 * look up, swap or list pointers and to read or change holds; array
 * versions are shared read-only between threads through reference counts.
 * A published version is never written (its buffers only by the operation
 * holding it); debug builds (TS_DEBUG) seal it at publish and check the
 * seal when it is replaced, deleted or freed. A version's metadata (a
 * jansson value) is the version's alone: other threads only read it, and
 * its reference count is never touched but by the version's last
 * ts_array_unref (the jansson rule, docs/ARCHITECTURE.md).
 */
#ifndef TS_ARRAY_H
#define TS_ARRAY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/name.h"
#include "common/status.h"
#include "formats/dtype.h"
#include "memory/buffer.h"
#include "storage/layout.h"
#include "storage/sharding.h"

#define TS_ARRAY_NAME_MAX TS_NAME_MAX

/* What an array holds. */
struct ts_array_desc {
	enum ts_dtype dtype;
	int rank;
	uint64_t shape[TS_MAX_RANK];
	uint64_t nbytes;          /* computed by ts_array_desc_init */
};

/* Where it lives: a sharding (with its memory kind), one shard per device
 * of the sharding, and whether it was placed explicitly. */
struct ts_placement {
	struct ts_sharding sharding;
	bool committed;           /* placed by an explicit request: never moved implicitly */
};

/* A placement on one device. */
void ts_placement_single(struct ts_placement *pl, struct ts_device *dev,
                         enum ts_memory_kind kind, bool committed);

struct ts_array;
struct ts_catalog;

/* Whether name is a valid array name: common/name.h's rule. */
bool ts_array_name_valid(const char *name);

/* Fills d->nbytes from dtype and shape; INVALID_ARGUMENT on rank > 32 or
 * a byte size past 2^64. */
ts_status ts_array_desc_init(struct ts_array_desc *d, struct ts_error *err);

/*
 * A new, unpublished array with one buffer per shard allocated in the
 * shard's (device, memory kind) space (this is admission: all or nothing,
 * RESOURCE_EXHAUSTED with the space's numbers when a shard does not fit).
 * INVALID_ARGUMENT when the sharding does not fit the shape (uneven split).
 * The data is uninitialised. One reference held by the caller.
 */
ts_status ts_array_new(const char *name, const struct ts_array_desc *d,
                       const struct ts_placement *pl, struct ts_memory *mem,
                       struct ts_array **out, struct ts_error *err);

struct ts_array *ts_array_ref(struct ts_array *a);
void ts_array_unref(struct ts_array *a);

const char *ts_array_name(const struct ts_array *a);
const struct ts_array_desc *ts_array_desc(const struct ts_array *a);
const struct ts_placement *ts_array_placement(const struct ts_array *a);
/* Shards: count, box, buffer (borrowed; live as long as the array). */
int ts_array_nshards(const struct ts_array *a);
const struct ts_shard_box *ts_array_box(const struct ts_array *a, int i);
struct ts_buffer *ts_array_shard_buffer(const struct ts_array *a, int i);
const struct ts_layout *ts_array_layout(const struct ts_array *a);

/* The buffer of a one-shard array, NULL for sharded ones. */
struct ts_buffer *ts_array_single_buffer(const struct ts_array *a);

/* Whether some shard lives in (device, kind); device NULL matches any. */
bool ts_array_on(const struct ts_array *a, const struct ts_device *device,
                 enum ts_memory_kind kind);

/*
 * A new unpublished array sharing the buffers of src's shards that a new
 * placement leaves exactly where they are (same device, memory kind and
 * box), and allocating the others; *reused counts the shared shards.
 * Buffers are immutable once published, so sharing is safe.
 */
ts_status ts_array_new_like(const char *name, const struct ts_array *src,
                            const struct ts_placement *pl, struct ts_memory *mem,
                            struct ts_array **out, int *reused, bool *shared,
                            struct ts_error *err);
uint64_t ts_array_version(const struct ts_array *a);
/* Strong ETag, quoted: "\"1a2b3c\"". */
const char *ts_array_etag(const struct ts_array *a);
uint64_t ts_array_created_ns(const struct ts_array *a);
uint64_t ts_array_updated_ns(const struct ts_array *a);

/* Bytes this array has been moved implicitly (uncommitted, by operations
 * that needed it elsewhere), over all its versions. Set before publishing. */
uint64_t ts_array_implicit_bytes(const struct ts_array *a);
void ts_array_set_implicit_bytes(struct ts_array *a, uint64_t n);

/*
 * Free-form string metadata kept with the array (safetensors __metadata__);
 * borrowed, may be NULL. Each version owns its own value: it is read-only
 * for everyone (getters, iteration, json_dumps, json_deep_copy) and never
 * shared by reference, because jansson's json_incref/json_decref read the
 * count before their atomic update, so two threads counting references to
 * one value race (docs/ARCHITECTURE.md). Hence const: a reader that keeps
 * it or puts it in a reply or a result takes a copy (json_deep_copy), never
 * a reference (json_incref, json_object_set, "O" in json_pack).
 *
 * ts_array_set_metadata, only before publishing, steals meta, which must be
 * the caller's alone (a new value or a copy, one reference: asserted).
 */
const json_t *ts_array_metadata(const struct ts_array *a);
void ts_array_set_metadata(struct ts_array *a, json_t *meta);

/* The owner of an array's name ("model 'm'"), "" when none. Set only before
 * the first publish; later versions inherit it. */
const char *ts_array_owner(const struct ts_array *a);
void ts_array_set_owner(struct ts_array *a, const char *owner);

/*
 * The persist mark: the name's, not the bytes' (a server with a state dir
 * writes marked arrays there, jobs/state.h). A version published over a
 * marked one keeps the mark unless ts_array_set_persist, before publish,
 * said otherwise; deleting the name drops it. ts_array_persisted reads it
 * (any thread: an atomic). ts_catalog_set_persist sets or clears it on the
 * current version of name: NOT_FOUND, or FAILED_PRECONDITION (ARRAY_OWNED)
 * for a model's array (a model is persisted whole).
 */
void ts_array_set_persist(struct ts_array *a, bool on);
bool ts_array_persisted(const struct ts_array *a);
ts_status ts_catalog_set_persist(struct ts_catalog *c, const char *name, bool on,
                                 struct ts_error *err);

/*
 * A new unpublished version of a sharing its buffers, desc, placement,
 * implicit-transfer count and owner, with a copy of its metadata: what a
 * training step publishes after updating a's buffers in place, so that the
 * version and ETag change with the bytes. New reference in *out. Fails
 * (RESOURCE_EXHAUSTED) only when out of memory.
 */
ts_status ts_array_new_version(const struct ts_array *a, struct ts_array **out,
                               struct ts_error *err);

/* The catalog. */
struct ts_catalog *ts_catalog_new(void);
void ts_catalog_free(struct ts_catalog *c);

/* The current version of name (new reference), or NULL. */
struct ts_array *ts_catalog_get(struct ts_catalog *c, const char *name);

/* Preconditions of a publish or delete. */
struct ts_precondition {
	bool create_only;         /* If-None-Match: *  -> ALREADY_EXISTS if present */
	const char *if_match;     /* If-Match: an ETag, or "*"; FAILED_PRECONDITION if not current */
	const char *holder;       /* the operation publishing: a version it holds may be
	                           * replaced (the new one stays held by it) */
	const char *owner;        /* acting for this owner: its arrays may be deleted */
};

/*
 * Publishes a as the current version of its name (the catalog takes its own
 * reference), assigning version, ETag and times; the previous version, if
 * any, is dropped from the catalog. *replaced says whether one existed.
 * Refused when the current version is held by another operation (ABORTED,
 * reason ARRAY_HELD, naming it) or owned and a changes its dtype or shape
 * (INVALID_ARGUMENT, reason OWNED_SHAPE).
 */
ts_status ts_catalog_put(struct ts_catalog *c, struct ts_array *a,
                         const struct ts_precondition *pre, bool *replaced,
                         struct ts_error *err);

/*
 * Publishes a in place of the array of the same name, which must exist
 * (NOT_FOUND otherwise), with the checks of ts_catalog_put; allocates
 * nothing, so a writer that prepared a (e.g. with ts_array_new_version)
 * before changing bytes cannot fail for memory when it publishes.
 * Borrows a (the catalog takes its own reference). Thread-safe.
 */
ts_status ts_catalog_replace(struct ts_catalog *c, struct ts_array *a,
                             const struct ts_precondition *pre, struct ts_error *err);

/* Publishes all of arrs at once or none: with overwrite false, any existing
 * name refuses the whole set (ALREADY_EXISTS naming it). Duplicate names in
 * arrs are INVALID_ARGUMENT. */
ts_status ts_catalog_put_all(struct ts_catalog *c, struct ts_array *const *arrs,
                             size_t n, bool overwrite, struct ts_error *err);

/* Removes name (its buffers go when the last reader lets go). Refused when
 * held (ABORTED, ARRAY_HELD) or owned by another than pre->owner
 * (FAILED_PRECONDITION, ARRAY_OWNED). */
ts_status ts_catalog_delete(struct ts_catalog *c, const char *name,
                            const struct ts_precondition *pre, struct ts_error *err);

/* Removes every one of names that exists, all or none (the refusals of
 * ts_catalog_delete, for any of them, refuse the whole set). */
ts_status ts_catalog_delete_all(struct ts_catalog *c, const char *const *names, size_t n,
                                const struct ts_precondition *pre, struct ts_error *err);

/*
 * Marks arrs[0..n) as held by operation holder, all or none: each must
 * still be the current version of its name (else ABORTED, ARRAY_CHANGED)
 * and not held by another operation (ABORTED, ARRAY_HELD naming it).
 */
ts_status ts_catalog_hold(struct ts_catalog *c, struct ts_array *const *arrs, size_t n,
                          const char *holder, struct ts_error *err);

/* Clears every hold of holder (a finished operation). */
void ts_catalog_release(struct ts_catalog *c, const char *holder);

/* Whether the current version of name is held; the holder's id into
 * holder (cap bytes) when it is. */
bool ts_catalog_held(struct ts_catalog *c, const char *name, char *holder, size_t cap);

/* The refusal a write of name would meet now (pre's If-None-Match or
 * If-Match, a hold by another than pre->holder, or an owner's shape, d;
 * NULL for a write that keeps the shape, as a move does), without writing:
 * for handlers that check before a body is read. TS_OK when none. */
ts_status ts_catalog_check_write(struct ts_catalog *c, const char *name,
                                 const struct ts_array_desc *d,
                                 const struct ts_precondition *pre, struct ts_error *err);

/* A page of arrays in name order, after the name `after` (NULL: from the
 * start), at most limit, keeping those for which keep returns true (keep may
 * be NULL). *out is a new array of new references (ts_catalog_list_free);
 * *more says whether arrays remain past the page. */
ts_status ts_catalog_list(struct ts_catalog *c, const char *after, size_t limit,
                          bool (*keep)(const struct ts_array *a, void *arg), void *arg,
                          struct ts_array ***out, size_t *n, bool *more,
                          struct ts_error *err);
void ts_catalog_list_free(struct ts_array **arrs, size_t n);

/* Number of arrays and their bytes. */
void ts_catalog_totals(struct ts_catalog *c, uint64_t *count, uint64_t *bytes);

#endif
