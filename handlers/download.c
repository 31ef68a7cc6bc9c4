/*
 * download.c - GET /v1/arrays/{array}/data: the array's bytes, raw or as
 * .npy, whole or an index expression's selection (numpy basic indexing), or
 * rows of axis 0 in a given order (?rows=, or a JSON body through POST
 * /v1/arrays/{array}:rows for a list too long for a URL).
 *
 * Only the selected bytes are read: the selection becomes contiguous runs of
 * the parent, and each response block is filled from the runs it covers with
 * one read of the stager (for device memory, one staged copy per covering
 * window of the block's runs: a strided slice of a device array costs about
 * one copy per block, not one per element). A whole array in
 * host memory is answered from its buffer in place, with no copy at all.
 * The response holds a reference to the array version it reads, so a delete
 * or replace while it streams changes nothing it sends.
 */
#include "handlers/arrays_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/log.h"
#include "common/utf8.h"
#include "formats/npy.h"
#include "storage/array_io.h"

/* Runs one block may gather: a 256 KiB block of 4-byte elements at any
 * stride is one read. */
#define READER_MAX_RUNS 65536

/*
 * A reader's runs array, made at its first read with no more entries than
 * its selection has runs (nruns; at most READER_MAX_RUNS): a small body
 * allocates, and clears, nothing of a block's worst case. False without
 * memory.
 */
static bool reader_runs(struct ts_run **runs, size_t *cap, uint64_t nruns)
{
	if (*runs)
		return true;
	*cap = nruns < READER_MAX_RUNS ? (size_t)nruns : READER_MAX_RUNS;
	*cap = *cap ? *cap : 1;
	*runs = malloc(*cap * sizeof **runs);
	return *runs != NULL;
}

struct reader {
	struct ts_stager *stager;          /* borrowed from the core */
	char *prefix;                      /* owned */
	size_t prefix_len;
	uint64_t size;                     /* of the whole body (its Content-Length) */
	struct ts_h_part *parts;           /* owned, with their references */
	size_t nparts, cur;
	struct ts_run_iter it;             /* over parts[cur] */
	uint64_t run_off, run_left;        /* the unsent rest of the current run */
	uint64_t nruns;                    /* runs of every part: what a block may need */
	struct ts_run *runs;               /* owned; cap entries, made at the first read */
	size_t cap;
};

static void reader_release(void *state)
{
	struct reader *r = state;

	for (size_t i = 0; i < r->nparts; i++)
		ts_array_unref(r->parts[i].array);
	free(r->parts);
	free(r->runs);
	free(r->prefix);
	free(r);
}

/* Moves to the next run of the current part, or the next part; false at the end. */
static bool reader_next_run(struct reader *r)
{
	while (r->cur < r->nparts) {
		if (ts_run_iter_next(&r->it, &r->run_off, &r->run_left))
			return true;
		if (++r->cur < r->nparts)
			ts_run_iter_init(&r->it, &r->parts[r->cur].sel,
			                 ts_dtype_size(ts_array_desc(r->parts[r->cur].array)->dtype));
	}
	return false;
}

static long reader_read(void *state, uint64_t pos, char *buf, size_t max)
{
	struct reader *r = state;
	size_t got = 0, nruns = 0;
	const struct ts_array *src = NULL;
	struct ts_error err;

	if (pos < r->prefix_len) {
		got = r->prefix_len - pos < max ? (size_t)(r->prefix_len - pos) : max;
		memcpy(buf, r->prefix + pos, got);
		return (long)got;
	}
	if (!reader_runs(&r->runs, &r->cap, r->nruns))
		return -1;
	/* batch the runs of one part that fit in this block into one read */
	while (got < max) {
		uint64_t take;

		if (!r->run_left && !reader_next_run(r))
			break;
		if (src && src != r->parts[r->cur].array)
			break;
		src = r->parts[r->cur].array;
		take = r->run_left < max - got ? r->run_left : max - got;
		r->runs[nruns++] = (struct ts_run){.src_offset = r->run_off, .dst_offset = got,
		                                   .len = take};
		r->run_off += take;
		r->run_left -= take;
		got += take;
		if (nruns == r->cap)
			break;
	}
	if (!got)
		return -1;        /* the size promised more than the parts hold */
	ts_error_clear(&err);
	if (ts_array_read(r->stager, src, r->runs, nruns, buf, &err) != TS_OK) {
		/* the response carries Content-Length: the client sees a short body
		 * when the connection closes here, never a complete-looking one */
		char fields[160];

		snprintf(fields, sizeof fields, "\"array\":\"%s\",\"offset\":%llu,\"size\":%llu",
		         ts_array_name(src), (unsigned long long)pos, (unsigned long long)r->size);
		ts_log(TS_LOG_WARN, fields, "download cut short: %s", err.message);
		return -1;
	}
	return (long)got;
}

/* The first broken device holding a shard of a, or NULL. */
static const struct ts_device *broken_device(const struct ts_array *a)
{
	for (int i = 0; i < ts_array_nshards(a); i++) {
		const struct ts_device *dev = ts_buffer_device(ts_array_shard_buffer(a, i));

		if (!ts_buffer_host_visible(ts_array_shard_buffer(a, i)) && ts_device_broken(dev))
			return dev;
	}
	return NULL;
}

ts_status ts_h_reader_stream(const struct ts_core *core, char *prefix, size_t prefix_len,
                             struct ts_h_part *parts, size_t nparts,
                             struct ts_stream *stream, struct ts_error *err)
{
	struct reader *r = calloc(1, sizeof *r);
	uint64_t total = prefix_len;
	ts_status st = TS_OK;

	if (!r)
		st = ts_error_oom(err, "no memory for a response reader");
	/* a device known broken answers now, not with a 200 that stops short */
	for (size_t i = 0; st == TS_OK && i < nparts; i++) {
		const struct ts_device *dev = broken_device(parts[i].array);

		if (dev) {
			st = ts_error_set(err, TS_UNAVAILABLE, "DEVICE_BROKEN",
			                  "array '%s' is on %s, which is unusable after an "
			                  "unrecoverable (sticky) error", ts_array_name(parts[i].array),
			                  ts_device_props(dev)->id);
			ts_error_meta(err, "array", "%s", ts_array_name(parts[i].array));
			ts_error_meta(err, "device", "%s", ts_device_props(dev)->id);
		}
	}
	if (st != TS_OK) {
		free(r);
		free(prefix);
		for (size_t i = 0; i < nparts; i++)
			ts_array_unref(parts[i].array);
		free(parts);
		return st;
	}
	r->stager = core->env.stager;
	r->prefix = prefix;
	r->prefix_len = prefix_len;
	r->parts = parts;
	r->nparts = nparts;
	for (size_t i = 0; i < nparts; i++) {
		size_t esize = ts_dtype_size(ts_array_desc(parts[i].array)->dtype);

		total += ts_selection_elems(&parts[i].sel) * esize;
		r->nruns += ts_selection_nruns(&parts[i].sel, esize);
	}
	if (nparts)
		ts_run_iter_init(&r->it, &parts[0].sel, ts_dtype_size(ts_array_desc(parts[0].array)->dtype));
	r->size = total;
	*stream = (struct ts_stream){.size = total, .read = reader_read,
	                             .release = reader_release, .state = r};
	return TS_OK;
}

/* ---- ?rows=: rows of axis 0 in the given order ------------------------------------ */

/* Most rows one ?rows= list may name (the URL limit keeps lists far below;
 * POST :rows takes up to TS_ROWS_MAX, its JSON body's limit far below). */
#define ROWS_MAX 65536

/* The rows of one array version, each block filled from the runs it covers. */
struct rows_reader {
	struct ts_stager *stager;          /* borrowed from the core */
	struct ts_array *array;            /* a reference */
	char *prefix;                      /* owned */
	size_t prefix_len;
	uint64_t *rows;                    /* owned: normalized */
	size_t nrows;                      /* a block gathers at most one run a row */
	struct ts_rows_iter it;
	uint64_t run_off, run_left;        /* the unsent rest of the current run */
	struct ts_run *runs;               /* owned; cap entries, made at the first read */
	size_t cap;
};

static void rows_reader_release(void *state)
{
	struct rows_reader *r = state;

	ts_array_unref(r->array);
	free(r->rows);
	free(r->runs);
	free(r->prefix);
	free(r);
}

static long rows_reader_read(void *state, uint64_t pos, char *buf, size_t max)
{
	struct rows_reader *r = state;
	size_t got = 0, nruns = 0;

	if (pos < r->prefix_len) {
		got = r->prefix_len - pos < max ? (size_t)(r->prefix_len - pos) : max;
		memcpy(buf, r->prefix + pos, got);
		return (long)got;
	}
	if (!reader_runs(&r->runs, &r->cap, r->nrows))
		return -1;
	while (got < max && nruns < r->cap) {
		uint64_t take;

		if (!r->run_left && !ts_rows_iter_next(&r->it, &r->run_off, &r->run_left))
			break;
		take = r->run_left < max - got ? r->run_left : max - got;
		r->runs[nruns++] = (struct ts_run){.src_offset = r->run_off, .dst_offset = got,
		                                   .len = take};
		r->run_off += take;
		r->run_left -= take;
		got += take;
	}
	if (!got)
		return -1;        /* the size promised more than the rows hold */
	if (ts_array_read(r->stager, r->array, r->runs, nruns, buf, NULL) != TS_OK)
		return -1;
	return (long)got;
}

/*
 * Rows of an array held in one host-visible buffer, answered from it in
 * place (no copy) when their runs, with the .npy header, fit in a reply's
 * parts; the reply then owns r. False (r untouched, the walk restarted)
 * otherwise.
 */
static bool rows_in_place(struct rows_reader *r, bool npy, struct ts_reply *reply)
{
	const struct ts_buffer *buf = ts_array_single_buffer(r->array);
	struct ts_parts parts = {0};
	struct ts_rows_iter it = r->it;
	uint64_t off, len;
	const char *base;

	if (!buf || !ts_buffer_host_visible(buf))
		return false;
	base = ts_buffer_data(buf);
	if (r->prefix_len)
		parts.part[parts.n++] = (struct ts_part){r->prefix, r->prefix_len};
	while (ts_rows_iter_next(&it, &off, &len)) {
		if (parts.n == TS_REPLY_MAX_PARTS)
			return false;
		parts.part[parts.n++] = (struct ts_part){base + off, (size_t)len};
	}
	if (parts.n == 0)
		return false;               /* an empty body: streamed */
	parts.release = rows_reader_release;
	parts.cls = r;
	ts_reply_buffers(reply, TS_HTTP_OK, npy ? "application/x-npy" : "application/octet-stream",
	                 &parts);
	return true;
}

/*
 * Parses "7,1,-2" into *out (malloc'd) and *n. Fails with BAD_ROWS naming
 * the entry that is not an integer.
 */
static ts_status rows_parse(const char *s, int64_t **out, size_t *n, struct ts_error *err)
{
	size_t cnt = 1, i = 0;
	int64_t *v;

	for (const char *p = s; *p; p++)
		cnt += *p == ',';
	if (cnt > ROWS_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		                    "rows lists %zu rows; at most %d are allowed", cnt, ROWS_MAX);
	v = malloc(cnt * sizeof *v);
	if (!v)
		return ts_error_oom(err, "no memory for %zu rows", cnt);
	for (const char *p = s;; i++) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char tok[24], *stop;

		if (len == 0 || len >= sizeof tok) {
			ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
			             "rows entry %zu '%.*s' is not an integer", i, (int)(len < 32 ? len : 32), p);
			free(v);
			return err->status;
		}
		memcpy(tok, p, len);
		tok[len] = '\0';
		errno = 0;
		v[i] = strtoll(tok, &stop, 10);
		if (*stop || errno || tok[0] == '+' || tok[0] == ' ') {
			ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
			             "rows entry %zu '%s' is not an integer", i, tok);
			free(v);
			return err->status;
		}
		if (!end)
			break;
		p = end + 1;
	}
	*out = v;
	*n = cnt;
	return TS_OK;
}

/*
 * The rows norm (n normalized rows, from ts_rows_check or ts_rows_parse) of
 * axis 0 of a, in that order, as one [n, ...] body, raw or .npy. Only those
 * rows are read. Takes over a (a reference) and norm; answers reply.
 */
static void rows_serve(const struct ts_call *call, struct ts_array *a, uint64_t *norm, size_t n,
                       bool npy, struct ts_reply *reply)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	struct rows_reader *r = calloc(1, sizeof *r);
	struct ts_error err;
	uint64_t shape[TS_MAX_RANK], row_bytes;
	char shape_s[TS_MAX_RANK * 21 + 3], etag[32];

	ts_error_clear(&err);
	if (!r) {
		ts_error_oom(&err, "no memory for a response");
		goto fail;
	}
	r->stager = call->core->env.stager;
	r->rows = norm;
	r->nrows = n;
	norm = NULL;
	row_bytes = ts_dtype_size(d->dtype);
	shape[0] = n;
	for (int i = 1; i < d->rank; i++) {
		shape[i] = d->shape[i];
		row_bytes *= d->shape[i];
	}
	if (npy) {
		r->prefix = malloc(TS_NPY_HEADER_MAX);
		if (!r->prefix) {
			ts_error_oom(&err, "no memory for a header");
			goto fail;
		}
		r->prefix_len = ts_npy_write_header(r->prefix, TS_NPY_HEADER_MAX, d->dtype, d->rank,
		                                    shape);
	}
	ts_rows_iter_init(&r->it, r->rows, n, row_bytes);
	ts_str_copy(etag, sizeof etag, ts_array_etag(a));
	r->array = a;
	a = NULL;
	if (!rows_in_place(r, npy, reply))
		ts_reply_stream(reply, TS_HTTP_OK,
		                npy ? "application/x-npy" : "application/octet-stream",
		                &(struct ts_stream){.size = r->prefix_len + (uint64_t)n * row_bytes,
		                                    .read = rows_reader_read,
		                                    .release = rows_reader_release, .state = r});
	shape_s[0] = '[';
	ts_h_format_shape(shape_s + 1, sizeof shape_s - 2, d->rank, shape);
	strcat(shape_s, "]");
	ts_reply_header(reply, "X-Tstage-Dtype", ts_dtype_name(d->dtype));
	ts_reply_header(reply, "X-Tstage-Shape", shape_s);
	ts_reply_header(reply, "ETag", etag);
	return;

fail:
	ts_reply_error(reply, &err);
	free(norm);
	if (r) {
		free(r->rows);
		free(r->prefix);
		free(r);
	}
	ts_array_unref(a);
}

/*
 * GET .../data?rows=7,1,2: the named rows of axis 0, in that order
 * (repeats allowed, negatives from the end), as rows_serve answers them.
 * Takes over a (a reference); answers reply.
 */
static void rows_reply(const struct ts_call *call, struct ts_array *a, const char *list, bool npy,
                       struct ts_reply *reply)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	struct ts_error err;
	int64_t *raw = NULL;
	size_t n = 0;

	ts_error_clear(&err);
	if (ts_call_query(call, "index")) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		             "rows and index cannot be given together; give one");
		goto fail;
	}
	if (d->rank < 1) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		             "rows needs an axis 0; this array is a scalar");
		goto fail;
	}
	if (rows_parse(list, &raw, &n, &err) != TS_OK)
		goto fail;
	/* normalized in place: the list is no longer needed as given */
	if (ts_rows_check(raw, n, d->shape[0], (uint64_t *)raw, &err) != TS_OK)
		goto fail;
	rows_serve(call, a, (uint64_t *)raw, n, npy, reply);
	return;

fail:
	ts_reply_error(reply, &err);
	free(raw);
	ts_array_unref(a);
}

/* ---- the handler --------------------------------------------------------------- */

struct in_place {
	struct ts_array *array;
	char *prefix;
};

static void in_place_release(void *cls)
{
	struct in_place *ip = cls;

	ts_array_unref(ip->array);
	free(ip->prefix);
	free(ip);
}

static bool wants_npy(const struct ts_call *call, struct ts_reply *reply, bool *npy)
{
	const char *fmt = ts_call_query(call, "format"), *accept = ts_call_header(call, "Accept");

	*npy = false;
	if (fmt) {
		if (strcmp(fmt, "npy") == 0)
			*npy = true;
		else if (strcmp(fmt, "raw") != 0) {
			ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_FORMAT",
			              "format '%s' is not one of raw, npy", fmt);
			return false;
		}
		return true;
	}
	*npy = accept && strstr(accept, "application/x-npy") != NULL;
	return true;
}

void ts_h_arrays_data(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_array *a = ts_h_array_from_path(call, reply);
	const struct ts_array_desc *d;
	struct ts_h_part *part = NULL;
	struct ts_selection sel;
	struct ts_stream stream;
	struct ts_error err;
	char shape[TS_MAX_RANK * 21 + 3], etag[32], *prefix = NULL;
	size_t prefix_len = 0, esize;
	uint64_t off, len;
	bool npy;

	ts_error_clear(&err);
	if (!a)
		return;
	d = ts_array_desc(a);
	ts_str_copy(etag, sizeof etag, ts_array_etag(a));
	esize = ts_dtype_size(d->dtype);
	if (!wants_npy(call, reply, &npy))
		goto out_unref;
	if (ts_call_query(call, "rows")) {
		rows_reply(call, a, ts_call_query(call, "rows"), npy, reply);
		return;
	}
	if (ts_index_parse(ts_call_query(call, "index"), d->rank, d->shape, &sel, &err) != TS_OK)
		goto out_fail;
	if (npy) {
		prefix = malloc(TS_NPY_HEADER_MAX);
		if (!prefix) {
			ts_error_oom(&err, "no memory for a header");
			goto out_fail;
		}
		prefix_len = ts_npy_write_header(prefix, TS_NPY_HEADER_MAX, d->dtype, sel.out_rank,
		                                 sel.out_shape);
	}
	if (ts_array_single_buffer(a) && ts_buffer_host_visible(ts_array_single_buffer(a)) &&
	    ts_selection_contiguous(&sel, esize, &off, &len)) {
		struct in_place *ip = malloc(sizeof *ip);
		struct ts_parts parts = {0};

		if (!ip) {
			ts_error_oom(&err, "no memory for a response");
			goto out_fail;
		}
		ip->array = a;
		ip->prefix = prefix;
		if (prefix_len)
			parts.part[parts.n++] = (struct ts_part){prefix, prefix_len};
		parts.part[parts.n++] = (struct ts_part){(char *)ts_buffer_data(ts_array_single_buffer(a)) + off,
		                                                (size_t)len};
		parts.release = in_place_release;
		parts.cls = ip;
		a = NULL;
		prefix = NULL;
		ts_reply_buffers(reply, TS_HTTP_OK, npy ? "application/x-npy" : "application/octet-stream",
		                 &parts);
	} else {
		part = malloc(sizeof *part);
		if (!part) {
			ts_error_oom(&err, "no memory for a response");
			goto out_fail;
		}
		part->array = ts_array_ref(a);
		part->sel = sel;
		if (ts_h_reader_stream(call->core, prefix, prefix_len, part, 1, &stream, &err) != TS_OK) {
			prefix = NULL;
			goto out_fail;
		}
		prefix = NULL;
		ts_reply_stream(reply, TS_HTTP_OK, npy ? "application/x-npy" : "application/octet-stream",
		                &stream);
	}
	/* "[8,6,16]", "[]" for a scalar (a header value cannot be empty) */
	shape[0] = '[';
	ts_h_format_shape(shape + 1, sizeof shape - 2, sel.out_rank, sel.out_shape);
	strcat(shape, "]");
	ts_reply_header(reply, "X-Tstage-Dtype", ts_dtype_name(d->dtype));
	ts_reply_header(reply, "X-Tstage-Shape", shape);
	ts_reply_header(reply, "ETag", etag);
	goto out_unref;

out_fail:
	ts_reply_error(reply, &err);
out_unref:
	free(prefix);
	ts_array_unref(a);
}

/* ---- POST /v1/arrays/{array}:rows --------------------------------------------- */

/*
 * The rows a JSON body names ({"rows": [7, 1, -2]} or {"rows": {"start",
 * "stop", "step"}}, as :gather takes them), answered as GET
 * .../data?rows= answers: for lists too long for a URL.
 */
void ts_h_arrays_rows(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_array *a = ts_h_array_from_path(call, reply);
	json_t *body = NULL, *rows = NULL;
	struct ts_error err;
	json_error_t jerr;
	uint64_t *norm = NULL;
	size_t n = 0;
	bool npy;

	ts_error_clear(&err);
	if (!a)
		return;
	if (!wants_npy(call, reply, &npy))
		goto out;
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o}", "rows", &rows) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "rows body: %s (expected {\"rows\": [...]} or {\"rows\": {\"start\", "
		             "\"stop\", \"step\"}})", jerr.text);
		goto out_fail;
	}
	if (ts_array_desc(a)->rank < 1) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		             "rows needs an axis 0; array '%s' is a scalar", ts_array_name(a));
		goto out_fail;
	}
	if (ts_rows_parse(rows, "rows", ts_array_desc(a)->shape[0], &norm, &n, &err) != TS_OK)
		goto out_fail;
	json_decref(body);
	rows_serve(call, a, norm, n, npy, reply);
	return;

out_fail:
	ts_reply_error(reply, &err);
out:
	json_decref(body);
	ts_array_unref(a);
}
