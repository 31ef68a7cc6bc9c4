/*
 * upload.c - PUT /v1/arrays/{array}: a raw body (?dtype=&shape=) or an .npy
 * file (Content-Type: application/x-npy), streamed into its final buffer.
 *
 * Admission comes first: with Content-Length known, the bytes are reserved
 * in the target space on the first callback, and an upload that cannot fit
 * is refused at once, before any of its body is read. Each piece of the body
 * is copied once, into the array's buffer (host memory) or into a pinned
 * staging slot already queued for the device. The new version is published
 * only when every byte has arrived: a short, long or cut-off body, or a
 * failed copy, leaves the previous version whole and the space's stats as
 * they were. A big-endian or Fortran-ordered .npy is converted through one
 * host copy.
 *
 * Without a placement, a replace of a committed array keeps its placement
 * (an uncommitted one goes to the default). A model's array keeps its dtype
 * and shape, and an array held by a running operation is not replaced:
 * both are refused before the body is read (and checked again, atomically,
 * when the version is published).
 */
#include "handlers/arrays_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "formats/npy.h"
#include "storage/array_io.h"

enum upload_mode { MODE_RAW, MODE_NPY };

struct upload {
	const struct ts_core *core;
	char name[TS_ARRAY_NAME_MAX + 1];
	enum upload_mode mode;
	uint64_t content_length;           /* UINT64_MAX when unknown */
	uint64_t received;                 /* body bytes seen */
	struct ts_placement placement;
	struct ts_precondition pre;
	int persist;                       /* ?persist=: -1 absent, else 0 or 1 */
	char if_match[80];
	bool have_hint;
	enum ts_dtype hint;
	/* .npy preamble, buffered until complete */
	char *hdr;
	size_t hdr_len;
	uint64_t data_offset;              /* 0 until known */
	struct ts_npy_header npy;
	/* where the data goes */
	struct ts_array *array;            /* unpublished until finish */
	struct ts_buffer *convert;         /* host copy for byte-order / layout conversion */
	struct ts_array_writer *writer;    /* into array */
	struct ts_writer *host_writer;     /* into convert */
	uint64_t expected;                 /* data bytes the dtype and shape need */
};

static ts_status upload_fail(struct ts_reply *reply, const struct ts_error *err)
{
	ts_reply_error(reply, err);
	return err->status;
}

/* Allocates the array (admission) and the writer that fills it. */
static ts_status upload_admit(struct upload *u, const struct ts_array_desc *d,
                              bool needs_conversion, struct ts_error *err)
{
	ts_status st;

	/* a model's array keeps its dtype and shape; a held one is not written */
	st = ts_catalog_check_write(u->core->env.catalog, u->name, d, NULL, err);
	if (st != TS_OK)
		return st;
	st = ts_array_new(u->name, d, &u->placement, u->core->env.memory, &u->array, err);
	if (st != TS_OK)
		return st;
	u->expected = d->nbytes;
	if (needs_conversion) {
		struct ts_space *host = ts_memory_find(u->core->env.memory,
		                                       ts_device_props(ts_array_box(u->array, 0)->device)->id,
		                                       TS_MEM_UNPINNED_HOST);

		st = ts_buffer_new(host, d->nbytes, &u->convert, err);
		if (st != TS_OK)
			return st;
		return ts_writer_new(u->core->env.stager, u->convert, 0, &u->host_writer, err);
	}
	return ts_array_writer_new(u->core->env.stager, u->array, &u->writer, err);
}

static ts_status parse_raw_desc(const struct ts_call *call, struct ts_array_desc *d,
                                struct ts_error *err)
{
	const char *dt = ts_call_query(call, "dtype"), *shape = ts_call_query(call, "shape");
	char names[TS_DTYPE_NAMES_MAX];

	if (!dt)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE",
		                    "a raw upload needs ?dtype= and ?shape= (or Content-Type: "
		                    "application/x-npy)");
	if (!ts_dtype_parse(dt, &d->dtype))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE", "dtype '%s' is not one of %s",
		                    dt, ts_dtype_names(names, sizeof names));
	if (!shape)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHAPE",
		                    "a raw upload needs ?shape= (empty for a scalar)");
	if (ts_h_parse_shape(shape, &d->rank, d->shape, err) != TS_OK)
		return TS_INVALID_ARGUMENT;
	return ts_array_desc_init(d, err);
}

static void upload_release(void *state);

static void *upload_begin(const struct ts_call *call, uint64_t content_length,
                          struct ts_reply *reply)
{
	const char *name = ts_h_array_name(call, reply);
	const char *ctype = ts_call_header(call, "Content-Type");
	const char *inm = ts_call_header(call, "If-None-Match"), *im = ts_call_header(call, "If-Match");
	const char *hint = ts_call_query(call, "dtype");
	struct upload *u;
	struct ts_array *cur;
	struct ts_error err;

	if (!name)
		return NULL;
	ts_error_clear(&err);
	u = calloc(1, sizeof *u);
	if (!u) {
		ts_reply_oom(reply, "no memory for an upload");
		return NULL;
	}
	u->core = call->core;
	u->content_length = content_length;
	snprintf(u->name, sizeof u->name, "%s", name);
	u->mode = ctype && strncasecmp(ctype, "application/x-npy", 17) == 0 ? MODE_NPY : MODE_RAW;
	if (inm && strcmp(inm, "*") != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_PRECONDITION",
		             "only 'If-None-Match: *' is supported on uploads");
		goto out_fail;
	}
	u->pre.create_only = inm != NULL;
	if (im) {
		snprintf(u->if_match, sizeof u->if_match, "%s", im);
		u->pre.if_match = u->if_match;
	}
	/* the refusals the publish would meet, now, so a refused upload is not sent */
	cur = ts_catalog_get(call->core->env.catalog, u->name);
	ts_catalog_check_write(call->core->env.catalog, u->name, NULL, &u->pre, &err);
	if (err.status == TS_OK)
		ts_h_persist_query(call, &u->persist, &err);
	if (err.status == TS_OK && ts_h_placement_query(call, &u->placement, &err) != TS_OK &&
	    err.status == TS_OK)
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_PLACEMENT", "the placement is invalid");
	/* no placement given over a committed array: it stays where it is */
	if (err.status == TS_OK && cur && !u->placement.committed &&
	    ts_array_placement(cur)->committed)
		u->placement = *ts_array_placement(cur);
	ts_array_unref(cur);
	if (err.status != TS_OK)
		goto out_fail;
	if (u->mode == MODE_RAW) {
		struct ts_array_desc d;

		if (parse_raw_desc(call, &d, &err) != TS_OK)
			goto out_fail;
		if (content_length != UINT64_MAX && content_length != d.nbytes) {
			ts_error_set(&err, TS_INVALID_ARGUMENT, "WRONG_BYTE_COUNT",
			             "body has %" PRIu64 " bytes; dtype %s and shape need %" PRIu64,
			             content_length, ts_dtype_name(d.dtype), d.nbytes);
			goto out_fail;
		}
		if (upload_admit(u, &d, false, &err) != TS_OK)
			goto out_fail;
		return u;
	}
	if (hint && *hint) {
		if (!ts_dtype_parse(hint, &u->hint)) {
			ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_DTYPE", "dtype '%s' is unknown", hint);
			goto out_fail;
		}
		u->have_hint = true;
	}
	/* admission before the header is known: the data is at least the body
	 * less the largest header this codec reads */
	if (content_length != UINT64_MAX) {
		uint64_t least = content_length > TS_NPY_PREAMBLE_MAX ? content_length - TS_NPY_PREAMBLE_MAX : 0;

		if (u->placement.sharding.type == TS_SHARDING_SINGLE &&
		    ts_space_check_fit(ts_memory_find(call->core->env.memory,
		                                      ts_device_props(u->placement.sharding.device)->id,
		                                      u->placement.sharding.memory_kind),
		                       least, &err) != TS_OK)
			goto out_fail;
	}
	return u;

out_fail:
	ts_reply_error(reply, &err);
	upload_release(u);    /* and what upload_admit made before it failed */
	return NULL;
}

/* Buffers the .npy preamble; once whole, parses it and admits the array.
 * Consumes from *data (and *n) what belongs to the preamble. */
static ts_status npy_take_header(struct upload *u, const char **data, size_t *n,
                                 struct ts_error *err)
{
	size_t want, take;
	struct ts_array_desc d;
	ts_status st;

	for (;;) {
		want = u->data_offset ? (size_t)u->data_offset : 12;
		if (u->hdr_len < want) {
			if (!u->hdr && !(u->hdr = malloc(TS_NPY_PREAMBLE_MAX)))
				return ts_error_oom(err, "no memory for an .npy header");
			take = want - u->hdr_len < *n ? want - u->hdr_len : *n;
			memcpy(u->hdr + u->hdr_len, *data, take);
			u->hdr_len += take;
			*data += take;
			*n -= take;
			if (u->hdr_len < want)
				return TS_OK;          /* need more of the body */
		}
		if (u->data_offset)
			break;
		st = ts_npy_preamble(u->hdr, u->hdr_len, &u->data_offset, err);
		if (st != TS_OK)
			return st;
	}
	st = ts_npy_parse_header(u->hdr, u->hdr_len, u->have_hint ? &u->hint : NULL, &u->npy, err);
	if (st != TS_OK)
		return st;
	d = (struct ts_array_desc){.dtype = u->npy.dtype, .rank = u->npy.rank};
	memcpy(d.shape, u->npy.shape, sizeof d.shape);
	st = ts_array_desc_init(&d, err);
	if (st != TS_OK)
		return st;
	if (u->content_length != UINT64_MAX && u->content_length != u->data_offset + d.nbytes)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "WRONG_BYTE_COUNT",
		                    ".npy body has %" PRIu64 " bytes; its header says %" PRIu64
		                    " (%" PRIu64 " of header, %" PRIu64 " of data)",
		                    u->content_length, u->data_offset + d.nbytes, u->data_offset, d.nbytes);
	return upload_admit(u, &d,
	                    (u->npy.big_endian && ts_dtype_size(d.dtype) > 1) || u->npy.fortran_order,
	                    err);
}

static uint64_t upload_offset(const struct upload *u)
{
	return u->writer ? ts_array_writer_offset(u->writer) : ts_writer_offset(u->host_writer);
}

static bool upload_chunk(void *state, const char *data, size_t n, struct ts_reply *reply)
{
	struct upload *u = state;
	struct ts_error err;

	ts_error_clear(&err);
	u->received += n;
	if (u->mode == MODE_NPY && !u->writer && !u->host_writer) {
		if (npy_take_header(u, &data, &n, &err) != TS_OK)
			return upload_fail(reply, &err) == TS_OK;
		if (!n)
			return true;
	}
	if (n && upload_offset(u) + n > u->expected) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "WRONG_BYTE_COUNT",
		             "body is longer than the %" PRIu64 " data bytes its dtype and shape need",
		             u->expected);
		return upload_fail(reply, &err) == TS_OK;
	}
	if (n && (u->writer ? ts_array_writer_write(u->writer, data, n, &err)
	                    : ts_writer_write(u->host_writer, data, n, &err)) != TS_OK)
		return upload_fail(reply, &err) == TS_OK;
	return true;
}

/* Byte order and layout of a converted .npy, then its copy to the target. */
static ts_status upload_convert(struct upload *u, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(u->array);
	size_t es = ts_dtype_size(d->dtype);
	struct ts_buffer *tmp = NULL;
	struct ts_array_writer *w = NULL;
	ts_status st = TS_OK;
	const void *src = ts_buffer_data(u->convert);

	if (u->npy.big_endian && es > 1)
		ts_byteswap(ts_buffer_data(u->convert), d->nbytes / es, es);
	if (u->npy.fortran_order && d->rank > 1) {
		st = ts_buffer_new(ts_buffer_space(u->convert), d->nbytes, &tmp, err);
		if (st != TS_OK)
			return st;
		ts_npy_fortran_to_c(ts_buffer_data(tmp), src, es, d->rank, d->shape);
		src = ts_buffer_data(tmp);
	}
	st = ts_array_writer_new(u->core->env.stager, u->array, &w, err);
	if (st == TS_OK)
		st = ts_array_writer_write(w, src, d->nbytes, err);
	if (st == TS_OK)
		st = ts_array_writer_finish(w, err);
	ts_array_writer_free(w);
	ts_buffer_unref(tmp);
	return st;
}

static void upload_finish(void *state, const struct ts_call *call, struct ts_reply *reply)
{
	struct upload *u = state;
	struct ts_error err;
	bool replaced = false;
	uint64_t data = u->received - (u->mode == MODE_NPY ? u->hdr_len : 0);

	(void)call;
	ts_error_clear(&err);
	if (u->mode == MODE_NPY && !u->writer && !u->host_writer) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_NPY_HEADER",
		             ".npy body ended after %" PRIu64 " bytes, inside its header", u->received);
		goto out_fail;
	}
	if (data != u->expected) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "WRONG_BYTE_COUNT",
		             "body has %" PRIu64 " data bytes; dtype and shape need %" PRIu64, data,
		             u->expected);
		goto out_fail;
	}
	if ((u->writer ? ts_array_writer_finish(u->writer, &err)
	               : ts_writer_finish(u->host_writer, &err)) != TS_OK)
		goto out_fail;
	if (u->convert && upload_convert(u, &err) != TS_OK)
		goto out_fail;
	if (u->persist >= 0)
		ts_array_set_persist(u->array, u->persist > 0);
	if (ts_catalog_put(u->core->env.catalog, u->array, &u->pre, &replaced, &err) != TS_OK)
		goto out_fail;
	ts_h_reply_array(reply, u->array, !replaced);
	return;

out_fail:
	ts_reply_error(reply, &err);
}

static void upload_release(void *state)
{
	struct upload *u = state;

	ts_array_writer_free(u->writer);
	ts_writer_free(u->host_writer);
	ts_buffer_unref(u->convert);
	ts_array_unref(u->array);     /* unpublished: its buffer goes back now */
	free(u->hdr);
	free(u);
}

const struct ts_upload_ops ts_h_arrays_put = {
	.begin = upload_begin,
	.chunk = upload_chunk,
	.finish = upload_finish,
	.release = upload_release,
};
