/*
 * array_io.c - reads, copies and writes over sharded arrays.
 */
#include "storage/array_io.h"

#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
/* A growing list of runs per shard (or per pair of shards). */
struct run_list {
	struct ts_run *runs;
	size_t n, cap;
};

static ts_status run_push(struct run_list *l, struct ts_run r, struct ts_error *err)
{
	if (l->n && l->runs[l->n - 1].src_offset + l->runs[l->n - 1].len == r.src_offset &&
	    l->runs[l->n - 1].dst_offset + l->runs[l->n - 1].len == r.dst_offset) {
		l->runs[l->n - 1].len += r.len;     /* merge with the previous run */
		return TS_OK;
	}
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct ts_run *g = realloc(l->runs, cap * sizeof *g);

		if (!g)
			return ts_error_oom(err, "no memory for a copy plan");
		l->runs = g;
		l->cap = cap;
	}
	l->runs[l->n++] = r;
	return TS_OK;
}

/* ---- reads ------------------------------------------------------------------ */

struct read_ctx {
	struct run_list per[TS_MESH_MAX_DEVICES];
	uint64_t dst_base, parent_base;
};

static ts_status read_piece(const struct ts_piece *pc, void *arg, struct ts_error *err)
{
	struct read_ctx *c = arg;

	return run_push(&c->per[pc->shard],
	                (struct ts_run){.src_offset = pc->local,
	                                .dst_offset = c->dst_base + (pc->parent - c->parent_base),
	                                .len = pc->len}, err);
}

ts_status ts_array_read(struct ts_stager *st, const struct ts_array *a,
                        const struct ts_run *runs, size_t n, void *dst,
                        struct ts_error *err)
{
	struct read_ctx *c;
	ts_status s = TS_OK;
	struct ts_buffer *single = ts_array_single_buffer(a);

	if (single)
		return ts_stage_read_runs(st, single, runs, n, dst, err);
	c = ts_fault_calloc(1, sizeof *c);
	if (!c)
		return ts_error_oom(err, "no memory to read");
	for (size_t i = 0; s == TS_OK && i < n; i++) {
		c->dst_base = runs[i].dst_offset;
		c->parent_base = runs[i].src_offset;
		s = ts_layout_split(ts_array_layout(a), runs[i].src_offset, runs[i].len, true,
		                    read_piece, c, err);
	}
	for (int k = 0; k < ts_array_nshards(a); k++) {
		if (s == TS_OK && c->per[k].n)
			s = ts_stage_read_runs(st, ts_array_shard_buffer(a, k), c->per[k].runs,
			                       c->per[k].n, dst, err);
		free(c->per[k].runs);
	}
	free(c);
	return s;
}

/* ---- copies ----------------------------------------------------------------- */

struct copy_ctx {
	const struct ts_layout *dst_layout;
	const bool *skip;
	int nsrc, ndst;
	struct run_list *pairs;           /* [dst * nsrc + src] */
	int src_shard;
	uint64_t src_local, src_parent;   /* of the current source piece */
	uint64_t dst_parent_base, src_parent_base;
};

static ts_status copy_dst_piece(const struct ts_piece *pc, void *arg, struct ts_error *err)
{
	struct copy_ctx *c = arg;
	/* pc->parent is a dst parent offset; find the matching source byte */
	uint64_t src_parent = c->src_parent_base + (pc->parent - c->dst_parent_base);

	if (c->skip && c->skip[pc->shard])
		return TS_OK;
	return run_push(&c->pairs[pc->shard * c->nsrc + c->src_shard],
	                (struct ts_run){.src_offset = c->src_local + (src_parent - c->src_parent),
	                                .dst_offset = pc->local, .len = pc->len}, err);
}

static ts_status copy_src_piece(const struct ts_piece *pc, void *arg, struct ts_error *err)
{
	struct copy_ctx *c = arg;
	uint64_t dst_off = c->dst_parent_base + (pc->parent - c->src_parent_base);
	struct copy_ctx sub = *c;

	sub.src_shard = pc->shard;
	sub.src_local = pc->local;
	sub.src_parent = pc->parent;
	return ts_layout_split(c->dst_layout, dst_off, pc->len, false, copy_dst_piece, &sub, err);
}

/*
 * Copies one pair's runs in chunks of COPY_CHUNK bytes, reporting progress
 * and checking for cancellation between chunks. Runs are consumed (their
 * offsets advance as they are split).
 */
#define COPY_CHUNK (32ull << 20)

static ts_status copy_pair(struct ts_stager *st, struct ts_buffer *d, struct ts_buffer *sb,
                           struct run_list *l, void (*progress)(void *arg, uint64_t bytes),
                           bool (*cancelled)(void *arg), void *arg, struct ts_error *err)
{
	struct ts_run batch[64];
	size_t i = 0;

	while (i < l->n) {
		uint64_t bytes = 0;
		size_t nb = 0;
		ts_status s;

		if (cancelled && cancelled(arg))
			return ts_error_set(err, TS_CANCELLED, "CANCELLED", "the copy was cancelled");
		while (i < l->n && nb < 64 && bytes < COPY_CHUNK) {
			struct ts_run *r = &l->runs[i];
			uint64_t take = r->len < COPY_CHUNK - bytes ? r->len : COPY_CHUNK - bytes;

			batch[nb++] = (struct ts_run){r->src_offset, r->dst_offset, take};
			bytes += take;
			r->src_offset += take;
			r->dst_offset += take;
			r->len -= take;
			if (!r->len)
				i++;
		}
		s = ts_stage_copy_runs(st, d, sb, batch, nb, err);
		if (s != TS_OK)
			return s;
		if (progress)
			progress(arg, bytes);
	}
	return TS_OK;
}

ts_status ts_array_copy(struct ts_stager *st, struct ts_array *dst, const bool *skip,
                        const struct ts_array *src, const struct ts_run *runs, size_t n,
                        void (*progress)(void *arg, uint64_t bytes),
                        bool (*cancelled)(void *arg), void *arg, struct ts_error *err)
{
	return ts_array_copy_counted(st, dst, skip, src, runs, n, progress, cancelled, arg, NULL,
	                             err);
}

/* Counts the pair's path (device to device: peer or staged) into paths. */
static void count_path(struct ts_stager *st, struct ts_buffer *d, struct ts_buffer *sb,
                       struct ts_stage_paths *paths)
{
	switch (paths ? ts_stage_path_of(st, d, sb) : TS_STAGE_PATH_NONE) {
	case TS_STAGE_PATH_PEER:
		paths->peer++;
		break;
	case TS_STAGE_PATH_STAGED:
		paths->staged++;
		break;
	case TS_STAGE_PATH_NONE:
		break;
	}
}

ts_status ts_array_copy_counted(struct ts_stager *st, struct ts_array *dst, const bool *skip,
                                const struct ts_array *src, const struct ts_run *runs, size_t n,
                                void (*progress)(void *arg, uint64_t bytes),
                                bool (*cancelled)(void *arg), void *arg,
                                struct ts_stage_paths *paths, struct ts_error *err)
{
	struct copy_ctx c = {.dst_layout = ts_array_layout(dst), .skip = skip,
	                     .nsrc = ts_array_nshards(src), .ndst = ts_array_nshards(dst)};
	ts_status s = TS_OK;

	c.pairs = calloc((size_t)(c.nsrc * c.ndst), sizeof *c.pairs);
	if (!c.pairs)
		return ts_error_oom(err, "no memory for a copy plan");
	for (size_t i = 0; s == TS_OK && i < n; i++) {
		c.src_parent_base = runs[i].src_offset;
		c.dst_parent_base = runs[i].dst_offset;
		s = ts_layout_split(ts_array_layout(src), runs[i].src_offset, runs[i].len, true,
		                    copy_src_piece, &c, err);
	}
	for (int k = 0; k < c.nsrc * c.ndst; k++) {
		struct run_list *l = &c.pairs[k];

		if (s == TS_OK && l->n)
			count_path(st, ts_array_shard_buffer(dst, k / c.nsrc),
			           ts_array_shard_buffer(src, k % c.nsrc), paths);
		if (s == TS_OK && l->n)
			s = copy_pair(st, ts_array_shard_buffer(dst, k / c.nsrc),
			              ts_array_shard_buffer(src, k % c.nsrc), l, progress, cancelled, arg,
			              err);
		free(l->runs);
	}
	free(c.pairs);
	return s;
}

/* ---- the sharded writer ------------------------------------------------------ */

struct ts_array_writer {
	struct ts_array *a;                      /* own reference */
	uint64_t offset;
	struct ts_writer *w[TS_MESH_MAX_DEVICES];
	const char *data;                        /* the piece being written */
	uint64_t data_base;
};

ts_status ts_array_writer_new(struct ts_stager *st, struct ts_array *a,
                              struct ts_array_writer **out, struct ts_error *err)
{
	struct ts_array_writer *w = ts_fault_calloc(1, sizeof *w);
	ts_status s = TS_OK;

	if (!w)
		return ts_error_oom(err, "no memory for a writer");
	w->a = ts_array_ref(a);
	for (int i = 0; s == TS_OK && i < ts_array_nshards(a); i++)
		s = ts_writer_new(st, ts_array_shard_buffer(a, i), 0, &w->w[i], err);
	if (s != TS_OK) {
		ts_array_writer_free(w);
		return s;
	}
	*out = w;
	return TS_OK;
}

static ts_status write_piece(const struct ts_piece *pc, void *arg, struct ts_error *err)
{
	struct ts_array_writer *w = arg;

	/* pieces of a shard arrive in its local order: its writer is sequential */
	return ts_writer_write(w->w[pc->shard], w->data + (pc->parent - w->data_base),
	                       (size_t)pc->len, err);
}

ts_status ts_array_writer_write(struct ts_array_writer *w, const void *data, size_t n,
                                struct ts_error *err)
{
	ts_status s;

	if (n > ts_array_desc(w->a)->nbytes - w->offset)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "TOO_MANY_BYTES",
		                    "more bytes than the array holds");
	if (ts_array_nshards(w->a) == 1) {
		s = ts_writer_write(w->w[0], data, n, err);
	} else {
		w->data = data;
		w->data_base = w->offset;
		s = ts_layout_split(ts_array_layout(w->a), w->offset, n, false, write_piece, w, err);
	}
	if (s == TS_OK)
		w->offset += n;
	return s;
}

uint64_t ts_array_writer_offset(const struct ts_array_writer *w)
{
	return w->offset;
}

ts_status ts_array_writer_finish(struct ts_array_writer *w, struct ts_error *err)
{
	ts_status s = TS_OK;

	for (int i = 0; i < ts_array_nshards(w->a); i++) {
		ts_status e = ts_writer_finish(w->w[i], err);

		if (s == TS_OK)
			s = e;
	}
	return s;
}

void ts_array_writer_free(struct ts_array_writer *w)
{
	if (!w)
		return;
	for (int i = 0; i < TS_MESH_MAX_DEVICES; i++)
		ts_writer_free(w->w[i]);
	ts_array_unref(w->a);
	free(w);
}
