/*
 * array_io.h - moving an array's bytes by parent offsets, whatever its
 * sharding: reads into host memory, copies between two arrays, and a
 * sequential writer that splits a stream (an HTTP body) into every shard,
 * replicas included.
 *
 * Every operation splits parent ranges into per-shard pieces (layout.h) and
 * hands each shard's pieces to the stager as one batch, so an unsharded
 * array costs what a single buffer does.
 *
 * Thread-safety: reads and copies are safe from any thread; a writer
 * belongs to one request at a time.
 */
#ifndef TS_ARRAY_IO_H
#define TS_ARRAY_IO_H

#include "storage/array.h"
#include "storage/stage.h"

/* Reads runs of a (src_offset: parent offset; dst_offset: into dst) into
 * host memory dst from the primary shards, and waits. */
ts_status ts_array_read(struct ts_stager *st, const struct ts_array *a,
                        const struct ts_run *runs, size_t n, void *dst,
                        struct ts_error *err);

/*
 * Copies runs from src (src_offset: parent offset of src) to dst
 * (dst_offset: parent offset of dst), into every replica of dst, and waits.
 * Shards flagged in skip (may be NULL) are left alone (they already hold
 * the data). progress(arg, bytes), when not NULL, is called as pairs of
 * shards complete, and cancelled(arg) is checked between them (CANCELLED).
 */
ts_status ts_array_copy(struct ts_stager *st, struct ts_array *dst, const bool *skip,
                        const struct ts_array *src, const struct ts_run *runs, size_t n,
                        void (*progress)(void *arg, uint64_t bytes),
                        bool (*cancelled)(void *arg), void *arg, struct ts_error *err);

/* ts_array_copy that also counts, into paths (may be NULL), the pairs of
 * shards it copied between the device memory of two devices, by the path
 * the stager took (ts_stage_path_of: peer access or staged). */
ts_status ts_array_copy_counted(struct ts_stager *st, struct ts_array *dst, const bool *skip,
                                const struct ts_array *src, const struct ts_run *runs, size_t n,
                                void (*progress)(void *arg, uint64_t bytes),
                                bool (*cancelled)(void *arg), void *arg,
                                struct ts_stage_paths *paths, struct ts_error *err);

struct ts_array_writer;

/* A writer of a's bytes in parent order from offset 0. */
ts_status ts_array_writer_new(struct ts_stager *st, struct ts_array *a,
                              struct ts_array_writer **out, struct ts_error *err);
ts_status ts_array_writer_write(struct ts_array_writer *w, const void *data, size_t n,
                                struct ts_error *err);
uint64_t ts_array_writer_offset(const struct ts_array_writer *w);
ts_status ts_array_writer_finish(struct ts_array_writer *w, struct ts_error *err);
void ts_array_writer_free(struct ts_array_writer *w);

#endif
