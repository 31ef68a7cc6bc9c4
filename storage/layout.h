/*
 * layout.h - where each byte of a sharded array lives.
 *
 * An array's bytes are numbered in C order over its shape ("parent
 * offsets"). Each shard holds one box of the array, itself in C order in its
 * own buffer ("local offsets"). A layout splits any range of parent offsets
 * into pieces, each contiguous both in the parent and in one shard, in
 * parent order. It works at byte granularity (the element size is a
 * trailing dimension), so ranges may start and end inside an element, as
 * HTTP body pieces do.
 *
 * Cost: O(rank) per piece and O(shards) to find a piece's shard; a range
 * inside one shard whose box spans the inner dimensions is one piece.
 *
 * Thread-safety: a layout is an immutable value.
 */
#ifndef TS_LAYOUT_H
#define TS_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "storage/sharding.h"

struct ts_layout {
	int rank;                                  /* array rank + 1 (bytes) */
	uint64_t shape[TS_MAX_RANK + 1];
	uint64_t stride[TS_MAX_RANK + 1];          /* parent strides in bytes */
	int nshards;
	struct {
		uint64_t start[TS_MAX_RANK + 1];
		uint64_t stop[TS_MAX_RANK + 1];
		uint64_t stride[TS_MAX_RANK + 1];      /* local strides in bytes */
		bool primary;                          /* replica 0: the copy readers use */
	} shard[TS_MESH_MAX_DEVICES];
};

struct ts_piece {
	int shard;
	uint64_t local;      /* offset in the shard's buffer */
	uint64_t parent;     /* offset in the whole array */
	uint64_t len;
};

/* Builds the layout of an array of rank/shape/element size whose shards
 * hold boxes[0..n). Writes l's shards 0..n-1 only: the rest are never read
 * (a layout may be allocated with room for n shards alone). */
void ts_layout_init(struct ts_layout *l, int rank, const uint64_t *shape, size_t elem_size,
                    const struct ts_shard_box *boxes, int n);

/* The bytes of a layout through its first n shards: all a layout of n
 * shards uses (ts_layout_init writes no more). */
size_t ts_layout_bytes(int n);

/* Bytes shard i holds. */
uint64_t ts_layout_shard_bytes(const struct ts_layout *l, int i);

/*
 * Calls fn for every piece of [off, off+len), in parent order: with
 * primary_only, one piece per byte from the primary shard holding it (for
 * reads); otherwise one from every shard holding it (replicas, for writes),
 * replicas of one box in shard order. A failure of fn stops the walk and is
 * returned.
 */
ts_status ts_layout_split(const struct ts_layout *l, uint64_t off, uint64_t len,
                          bool primary_only,
                          ts_status (*fn)(const struct ts_piece *pc, void *arg,
                                          struct ts_error *err),
                          void *arg, struct ts_error *err);

#endif
