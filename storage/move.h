/*
 * move.h - moving an array to a new placement and publishing the result:
 * the one primitive behind :put (same name), :copy (a new name) and the
 * implicit moves of uncommitted arrays (colocate.h).
 *
 * A move is admitted first (the destination allocated, or refused at once),
 * then copied and published. A put shares the shards that stay exactly
 * where they are; the new version keeps the source's safetensors metadata
 * and its implicit-transfer count (plus the bytes moved, for an implicit
 * move, counted in the stager's total too), and is published only if the
 * source is still the current version (else ABORTED: the move is dropped
 * and the array stays whole where it was). A copy is a new array: it keeps
 * the metadata, and refuses an existing name (ALREADY_EXISTS) unless told
 * to overwrite. The catalog's holds and owners apply to every publish.
 *
 * A move may convert its elements on the way (spec.convert: float32,
 * bfloat16 and float16 either way, formats/convert.h, as jnp.astype): the
 * destination has the new dtype and shares nothing; the source is read in
 * chunks into host memory, converted there, and written through the
 * destination's writer (so into every shard and replica, through the
 * device's copy queue where the destination is a device).
 *
 * Thread-safety: a move belongs to one thread at a time; the catalog and the
 * stager are shared.
 */
#ifndef TS_MOVE_H
#define TS_MOVE_H

#include "storage/array.h"
#include "storage/stage.h"

struct ts_move_spec {
	const char *name;                   /* NULL: the source's (a put) */
	struct ts_placement placement;
	bool implicit;                      /* counted as an implicit transfer */
	bool overwrite;                     /* a copy may replace an existing array */
	bool donate;                        /* a copy deletes its source when published */
	bool consume;                       /* the source is private to the move and dropped
	                                       after it (a cross-node receive's): a copy shares
	                                       the shards that stay where they are, as a put
	                                       does, and copies only the others */
	const char *holder;                 /* the operation publishing, may be NULL */
	bool convert;                       /* the destination's elements are dtype */
	enum ts_dtype dtype;                /* (ts_convert_supported from the source's) */
};

/* Elements converted per chunk of a converting move. */
#define TS_MOVE_CONVERT_CHUNK ((uint64_t)1 << 20)

struct ts_move;

/* Admission: allocates the destination of moving src (borrowed; the move
 * takes its own reference) as spec says. *out is the move; *bytes the
 * bytes it will copy. */
ts_status ts_move_new(struct ts_memory *mem, struct ts_array *src,
                      const struct ts_move_spec *spec, struct ts_move **out, uint64_t *bytes,
                      struct ts_error *err);

/* The source and the (unpublished, then published) destination; borrowed. */
struct ts_array *ts_move_source(const struct ts_move *mv);
struct ts_array *ts_move_result(const struct ts_move *mv);

/* Copies (progress and cancelled as ts_array_copy takes them; both may be
 * NULL) and publishes. CANCELLED when cancelled before the publish. */
ts_status ts_move_run(struct ts_move *mv, struct ts_catalog *cat, struct ts_stager *st,
                      void (*progress)(void *arg, uint64_t bytes), bool (*cancelled)(void *arg),
                      void *arg, struct ts_error *err);

/* The device-to-device pairs of shards ts_move_run copied, by path
 * (borrowed; zero before the run and for a converting move). */
const struct ts_stage_paths *ts_move_paths(const struct ts_move *mv);

void ts_move_free(struct ts_move *mv);

#endif
