/*
 * move.c - admission, copy and publish of an array's move to a new
 * placement.
 */
#include "storage/move.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/convert.h"
#include "storage/array_io.h"

struct ts_move {
	struct ts_move_spec spec;
	char name[TS_ARRAY_NAME_MAX + 1];
	char holder[40];
	char src_etag[32];
	struct ts_array *src;                 /* own reference */
	struct ts_array *dst;                 /* own reference */
	bool shared[TS_MESH_MAX_DEVICES];     /* dst shards that reuse src buffers */
	bool rename;                          /* a copy: a new name */
	uint64_t bytes;
	struct ts_stage_paths paths;          /* what the run copied device to device */
};

ts_status ts_move_new(struct ts_memory *mem, struct ts_array *src,
                      const struct ts_move_spec *spec, struct ts_move **out, uint64_t *bytes,
                      struct ts_error *err)
{
	struct ts_move *mv = calloc(1, sizeof *mv);
	ts_status st;
	int reused = 0;

	*out = NULL;
	if (!mv)
		return ts_error_oom(err, "no memory to move array '%s'", ts_array_name(src));
	mv->spec = *spec;
	snprintf(mv->name, sizeof mv->name, "%s", spec->name ? spec->name : ts_array_name(src));
	snprintf(mv->holder, sizeof mv->holder, "%s", spec->holder ? spec->holder : "");
	mv->spec.name = mv->name;
	mv->spec.holder = mv->holder[0] ? mv->holder : NULL;
	mv->rename = strcmp(mv->name, ts_array_name(src)) != 0;
	snprintf(mv->src_etag, sizeof mv->src_etag, "%s", ts_array_etag(src));
	mv->spec.convert = spec->convert && spec->dtype != ts_array_desc(src)->dtype;
	if (mv->spec.convert) {
		struct ts_array_desc d = *ts_array_desc(src);

		d.dtype = spec->dtype;
		st = ts_convert_supported(ts_array_desc(src)->dtype, d.dtype)
		         ? ts_array_desc_init(&d, err)
		         : ts_error_set(err, TS_INVALID_ARGUMENT, "UNSUPPORTED_CONVERSION",
		                        "array '%s' cannot be converted from %s to %s",
		                        ts_array_name(src), ts_dtype_name(ts_array_desc(src)->dtype),
		                        ts_dtype_name(d.dtype));
		if (st == TS_OK)
			st = ts_array_new(mv->name, &d, &spec->placement, mem, &mv->dst, err);
	} else if (mv->rename && !spec->consume) {
		/* a put shares the shards that stay where they are; a copy copies all
		 * (the source lives on), unless nothing else will see the source */
		st = ts_array_new(mv->name, ts_array_desc(src), &spec->placement, mem, &mv->dst, err);
	} else {
		st = ts_array_new_like(mv->name, src, &spec->placement, mem, &mv->dst, &reused,
		                       mv->shared, err);
	}
	if (st != TS_OK) {
		free(mv);
		return st;
	}
	mv->src = ts_array_ref(src);
	for (int i = 0; i < ts_array_nshards(mv->dst); i++)
		if (!mv->shared[i])
			mv->bytes += ts_buffer_size(ts_array_shard_buffer(mv->dst, i));
	if (bytes)
		*bytes = mv->bytes;
	*out = mv;
	return TS_OK;
}

struct ts_array *ts_move_source(const struct ts_move *mv) { return mv->src; }
struct ts_array *ts_move_result(const struct ts_move *mv) { return mv->dst; }
const struct ts_stage_paths *ts_move_paths(const struct ts_move *mv) { return &mv->paths; }

/* The converting copy: chunks of the source read into host memory,
 * converted, and written in parent order through the destination's writer. */
static ts_status convert_copy(struct ts_move *mv, struct ts_stager *st,
                              void (*progress)(void *arg, uint64_t bytes),
                              bool (*cancelled)(void *arg), void *arg, struct ts_error *err)
{
	const struct ts_array_desc *sd = ts_array_desc(mv->src), *dd = ts_array_desc(mv->dst);
	size_t ssize = ts_dtype_size(sd->dtype), dsize = ts_dtype_size(dd->dtype);
	uint64_t total = ssize ? sd->nbytes / ssize : 0;
	uint64_t chunk = total < TS_MOVE_CONVERT_CHUNK ? total : TS_MOVE_CONVERT_CHUNK;
	void *in = malloc(chunk * ssize + 1), *conv = malloc(chunk * dsize + 1);
	struct ts_array_writer *w = NULL;
	ts_status s;

	if (!in || !conv) {
		s = ts_error_oom(err, "no host memory to convert array '%s'", ts_array_name(mv->src));
		goto out;
	}
	s = ts_array_writer_new(st, mv->dst, &w, err);
	for (uint64_t done = 0; s == TS_OK && done < total; done += chunk) {
		uint64_t n = total - done < chunk ? total - done : chunk;
		struct ts_run run = {done * ssize, 0, n * ssize};

		if (cancelled && cancelled(arg))
			s = ts_error_set(err, TS_CANCELLED, "CANCELLED", "the move was cancelled");
		if (s == TS_OK)
			s = ts_array_read(st, mv->src, &run, 1, in, err);
		if (s == TS_OK) {
			ts_convert(dd->dtype, conv, sd->dtype, in, n);
			s = ts_array_writer_write(w, conv, (size_t)(n * dsize), err);
		}
		if (s == TS_OK && progress)
			progress(arg, n * dsize);
	}
	if (s == TS_OK)
		s = ts_array_writer_finish(w, err);
out:
	ts_array_writer_free(w);
	free(in);
	free(conv);
	return s;
}

ts_status ts_move_run(struct ts_move *mv, struct ts_catalog *cat, struct ts_stager *st,
                      void (*progress)(void *arg, uint64_t bytes), bool (*cancelled)(void *arg),
                      void *arg, struct ts_error *err)
{
	struct ts_run whole = {0, 0, ts_array_desc(mv->src)->nbytes};
	struct ts_precondition pre = {.holder = mv->spec.holder};
	ts_status s;

	s = mv->spec.convert
	        ? convert_copy(mv, st, progress, cancelled, arg, err)
	        : ts_array_copy_counted(st, mv->dst, mv->shared, mv->src, &whole, 1, progress,
	                                cancelled, arg, &mv->paths, err);
	if (s != TS_OK)
		return s;
	if (cancelled && cancelled(arg))
		return ts_error_set(err, TS_CANCELLED, "CANCELLED", "the move was cancelled");
	if (ts_array_metadata(mv->src)) {
		/* a copy: the source version's value is its own (array.h) */
		json_t *meta = json_deep_copy(ts_array_metadata(mv->src));

		if (!meta)
			return ts_error_oom(err, "no memory for the metadata of array '%s'", mv->name);
		ts_array_set_metadata(mv->dst, meta);
	}
	if (mv->rename) {
		pre.create_only = !mv->spec.overwrite;
		s = ts_catalog_put(cat, mv->dst, &pre, NULL, err);
		if (s == TS_ALREADY_EXISTS) {
			ts_error_clear(err);
			s = ts_error_set(err, TS_ALREADY_EXISTS, "ARRAY_EXISTS",
			                 "array '%s' already exists; give \"overwrite\": true to replace it",
			                 mv->name);
		}
		if (s == TS_OK && mv->spec.donate) {
			struct ts_precondition same = {.if_match = mv->src_etag, .holder = mv->spec.holder};
			struct ts_error ignore;

			ts_error_clear(&ignore);
			(void)ts_catalog_delete(cat, ts_array_name(mv->src), &same, &ignore);
		}
		return s;
	}
	ts_array_set_implicit_bytes(mv->dst, ts_array_implicit_bytes(mv->src) +
	                                         (mv->spec.implicit ? whole.len : 0));
	pre.if_match = mv->src_etag;
	s = ts_catalog_put(cat, mv->dst, &pre, NULL, err);
	if (s == TS_FAILED_PRECONDITION) {
		ts_error_clear(err);
		s = ts_error_set(err, TS_ABORTED, "ARRAY_CHANGED",
		                 "array '%s' was replaced while it moved; the move was dropped",
		                 ts_array_name(mv->src));
	}
	if (s == TS_OK && mv->spec.implicit)
		ts_stager_count_implicit(st, whole.len);
	return s;
}

void ts_move_free(struct ts_move *mv)
{
	if (!mv)
		return;
	ts_array_unref(mv->src);
	ts_array_unref(mv->dst);
	free(mv);
}
