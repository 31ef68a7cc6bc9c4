/*
 * sharding.h - where the pieces of an array live: meshes of devices,
 * partition specs, and the index box each device holds, each sharding with
 * a memory kind (JAX's NamedSharding / SingleDeviceSharding with
 * memory_kind).
 *
 * A mesh is an n-d grid of distinct devices with named axes. A named
 * sharding gives, per array dimension, the mesh axes that split it (none:
 * the dimension is whole on every device); mesh axes that split no
 * dimension replicate the array across them. A single-device sharding puts
 * the whole array on one device. Every sharding carries a memory kind.
 *
 * Invariants: axis names are unique within a mesh; a mesh axis splits at
 * most one dimension; a split dimension's size is divisible by the product
 * of its axes' sizes (else INVALID_ARGUMENT naming the dimension, as JAX
 * refuses); boxes of different shards of one "block" are equal (replicas).
 *
 * Thread-safety: a ts_sharding is an immutable value once built; the saved
 * shardings registry is guarded by its own lock.
 */
#ifndef TS_SHARDING_H
#define TS_SHARDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "formats/dtype.h"

#define TS_MESH_MAX_DEVICES 64
#define TS_MESH_MAX_AXES 8
#define TS_AXIS_NAME_MAX 32
#define TS_SPEC_MAX_AXES 4           /* mesh axes splitting one dimension */

struct ts_mesh {
	int ndevices;
	struct ts_device *devices[TS_MESH_MAX_DEVICES];   /* row-major over shape */
	int naxes;
	char axis_names[TS_MESH_MAX_AXES][TS_AXIS_NAME_MAX];
	int shape[TS_MESH_MAX_AXES];                       /* product == ndevices */
};

/* One dimension's entry of a partition spec: the mesh axes (by index into
 * the mesh) that split it, outermost first; naxes 0 is None. */
struct ts_spec_entry {
	int naxes;
	int axes[TS_SPEC_MAX_AXES];
};

enum ts_sharding_type { TS_SHARDING_SINGLE = 0, TS_SHARDING_NAMED };

struct ts_sharding {
	enum ts_sharding_type type;
	enum ts_memory_kind memory_kind;
	struct ts_device *device;          /* SINGLE */
	struct ts_mesh mesh;               /* NAMED */
	int spec_rank;                     /* NAMED: entries given; missing trailing ones are None */
	struct ts_spec_entry spec[TS_MAX_RANK];
};

/* One shard: the box [start, start+count) of the array a device holds. */
struct ts_shard_box {
	struct ts_device *device;
	uint64_t start[TS_MAX_RANK];
	uint64_t count[TS_MAX_RANK];
	int replica;                       /* 0 for the first device holding this box */
};

/* A single-device sharding. */
void ts_sharding_single(struct ts_sharding *out, struct ts_device *dev,
                        enum ts_memory_kind kind);

/*
 * Validates a named sharding's mesh and spec on their own (unique axis
 * names, shape product == device count, distinct devices, each mesh axis
 * used at most once, axis indices in range). INVALID_ARGUMENT naming the
 * problem.
 */
ts_status ts_sharding_validate(const struct ts_sharding *s, struct ts_error *err);

/* The same sharding with another memory kind (JAX's with_memory_kind). */
void ts_sharding_with_memory_kind(const struct ts_sharding *s, enum ts_memory_kind kind,
                                  struct ts_sharding *out);

/*
 * The shards of an array of this rank and shape under s: one per device of
 * the mesh (one in all for SINGLE), in mesh order. A dimension split by
 * axes (a1, a2, ...) is cut into prod(size(ai)) equal blocks, and a device's
 * block along it is its coordinates on (a1, a2, ...) read row-major; a
 * device's replica is its coordinates on the axes the spec leaves unused,
 * read row-major (its rank in mesh order among the holders of its box).
 * Fails with INVALID_ARGUMENT (reason BAD_SHARDING) when s is invalid, the
 * spec has more entries than the array has dimensions, or a split dimension
 * is not divisible ("dimension 0 of size 10 is not divisible by 4, the size
 * of mesh axes ('x', 'y')"; "... the size of mesh axis 'y'" for one axis); a
 * dimension of size 0 always divides. shape may be NULL when rank is 0. *n
 * receives the count (<= TS_MESH_MAX_DEVICES); out must hold
 * TS_MESH_MAX_DEVICES; neither is written on failure.
 */
ts_status ts_sharding_boxes(const struct ts_sharding *s, int rank, const uint64_t *shape,
                            struct ts_shard_box *out, int *n, struct ts_error *err);

/* Whether two shardings place every box on the same device with the same
 * memory kind, for every shape both can shard (equal as placements: the
 * same devices, the same number of blocks per dimension and the same block
 * for each device). So a named sharding over a one-device mesh equals the
 * single-device sharding of that device, P(('x','y')) on a (2, 2) mesh
 * equals P('z') on a (4,) mesh of the same devices, and trailing Nones do
 * not count. An invalid sharding equals nothing. */
bool ts_sharding_equal(const struct ts_sharding *a, const struct ts_sharding *b);

/*
 * The grid of which device holds which block, as text (JAX's
 * visualize_array_sharding): for rank 1 and 2 an ASCII table (+---+ |) with
 * one cell per block (rows: blocks of dimension 0, or one row for rank 1;
 * columns: blocks of the last dimension), each cell listing its devices
 * ("sim:0,sim:2") over its index ranges ("[0:4, :]", ":" for a dimension no
 * mesh axis splits); for other ranks one line per block, "[0:4, 0:8, :]
 * sim:0". A last line names the memory kind. A sharding that cannot shard
 * this shape renders as "invalid sharding: <why>". Writes into buf (cap
 * bytes, always terminated when cap > 0; buf may be NULL when cap is 0);
 * returns the length it needed, as snprintf does.
 */
size_t ts_sharding_render_text(const struct ts_sharding *s, int rank, const uint64_t *shape,
                               char *buf, size_t cap);

/* Saved shardings: a thread-safe registry of name -> sharding (a pthread
 * rwlock; values are copied in and out). Names follow the array name rule
 * (^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$). ts_sharding_registry_new returns
 * NULL when out of memory; _free takes NULL. */
struct ts_sharding_registry;
struct ts_sharding_registry *ts_sharding_registry_new(void);
void ts_sharding_registry_free(struct ts_sharding_registry *r);

/* Saves a copy of s under name; INVALID_ARGUMENT for a bad name
 * (BAD_SHARDING_NAME) or an invalid s, ALREADY_EXISTS if the name is taken
 * (SHARDING_EXISTS; no replace), RESOURCE_EXHAUSTED past 4096 saved
 * shardings or when out of memory. */
ts_status ts_sharding_registry_put(struct ts_sharding_registry *r, const char *name,
                                   const struct ts_sharding *s, struct ts_error *err);

/* Copies the sharding saved under name into *out; false when absent. */
bool ts_sharding_registry_get(struct ts_sharding_registry *r, const char *name,
                              struct ts_sharding *out);

/* Calls fn for each saved sharding in name order (under the lock: fn must
 * not call back into the registry). */
void ts_sharding_registry_each(struct ts_sharding_registry *r,
                               void (*fn)(const char *name, const struct ts_sharding *s, void *arg),
                               void *arg);

#endif
