/*
 * safetensors_io.c - POST /v1/arrays:import and GET /v1/arrays:export.
 *
 * Import takes a safetensors body as it streams: the 8-byte length, the
 * header (validated as the reference implementation does), then the data,
 * each byte routed straight into its tensor's buffer at the requested
 * placement. Every tensor is admitted (allocated) as soon as the header is
 * read, all or nothing, and all are published together at the end, so a
 * refused, truncated or failed import leaves the catalog and the spaces as
 * they were. With a JSON body {"path": ...} the file is read on the server,
 * only from below --data-dir, so a 19 GiB file need not cross HTTP: the
 * path is checked by text on the HTTP thread, and opened (beneath the data
 * dir, no link followed, regular files only) and read by the import's
 * operation; the request is answered once the open has succeeded or failed.
 *
 * Export streams a safetensors file of the named arrays: the header, then
 * each array's bytes read from its buffer (device memory through the copy
 * queue), never assembled in memory.
 */
#include "handlers/arrays_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/beneath.h"
#include "common/units.h"
#include "formats/safetensors.h"
#include "handlers/operations.h"
#include "ops/operation.h"
#include "storage/array_io.h"

#define FILE_CHUNK (8u << 20)
#define TS_IMPORT_JSON_MAX (64u << 10)
#define OPEN_WAIT_NS (10ull * 1000000000ull)   /* a hung open answers 202 after this */

struct import {
	const struct ts_core *core;
	struct ts_placement placement;
	char prefix[TS_ARRAY_NAME_MAX + 1];
	bool overwrite;
	bool from_file;                    /* JSON body naming a server-side file */
	struct ts_h_st_recv rx;            /* the body's bytes into arrays */
	char *json;                        /* JSON body (from_file) */
	size_t json_len;
	struct ts_operation *op;           /* from_file: the operation reading it */
	int fd;                            /* from_file: the open file, -1 none */
	uint64_t file_size;
	char path[PATH_MAX];               /* from_file: as the client wrote it */
	char rel[PATH_MAX];                /* from_file: relative to the data dir */
	/* from_file: the open's outcome, for the request waiting on it */
	pthread_mutex_t open_mu;
	bool opened;                       /* guarded by: open_mu */
	struct ts_error open_err;          /* guarded by: open_mu; set once opened */
	void (*open_wake)(void *token);    /* guarded by: open_mu */
	void *open_token;                  /* guarded by: open_mu */
	_Atomic int refs;                  /* the request's, and the operation's when handed off */
};

static ts_h_st_admit_fn import_admit;

static void *import_begin(const struct ts_call *call, uint64_t content_length,
                          struct ts_reply *reply)
{
	const char *ctype = ts_call_header(call, "Content-Type");
	const char *prefix = ts_call_query(call, "prefix"), *ow = ts_call_query(call, "overwrite");
	struct import *im = calloc(1, sizeof *im);
	struct ts_error err;

	ts_error_clear(&err);
	if (!im) {
		ts_reply_oom(reply, "no memory for an import");
		return NULL;
	}
	im->core = call->core;
	atomic_init(&im->refs, 1);
	im->fd = -1;
	pthread_mutex_init(&im->open_mu, NULL);
	ts_error_clear(&im->open_err);
	ts_h_st_recv_init(&im->rx, call->core, content_length, import_admit, im);
	im->overwrite = !ow || strcmp(ow, "false") != 0;
	im->from_file = ctype && strncasecmp(ctype, "application/json", 16) == 0;
	if (prefix && strlen(prefix) > TS_ARRAY_NAME_MAX) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_PREFIX", "prefix is longer than %d characters",
		             TS_ARRAY_NAME_MAX);
		goto out_fail;
	}
	snprintf(im->prefix, sizeof im->prefix, "%s", prefix ? prefix : "");
	if (ts_h_placement_query(call, &im->placement, &err) != TS_OK)
		goto out_fail;
	if (im->from_file && content_length != UINT64_MAX && content_length > TS_IMPORT_JSON_MAX) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BODY_TOO_LARGE",
		             "an import request naming a file holds at most %u bytes of JSON",
		             TS_IMPORT_JSON_MAX);
		goto out_fail;
	}
	return im;

out_fail:
	ts_reply_error(reply, &err);
	pthread_mutex_destroy(&im->open_mu);
	free(im);
	return NULL;
}

/* Creates (admits) every tensor's array; all or nothing. */
static ts_status import_admit(void *ctx, const struct ts_st_header *st, struct ts_array **arrays,
                              struct ts_error *err)
{
	struct import *im = ctx;

	for (size_t i = 0; i < st->ntensors; i++) {
		const struct ts_st_tensor *t = &st->tensors[i];
		struct ts_array_desc d = {.dtype = t->dtype, .rank = t->rank};
		char name[2 * TS_ARRAY_NAME_MAX + 2];
		ts_status s;

		snprintf(name, sizeof name, "%s%s", im->prefix, t->name);
		if (!ts_array_name_valid(name))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
			                    "tensor '%s' would be named '%s', which is not a valid "
			                    "array name", t->name, name);
		memcpy(d.shape, t->shape, sizeof d.shape);
		s = ts_array_desc_init(&d, err);
		if (s == TS_OK)
			s = ts_array_new(name, &d, &im->placement, im->core->env.memory, &arrays[i], err);
		if (s != TS_OK)
			return s;
		if (st->metadata) {
			/* one copy per array: a version's metadata is its own */
			json_t *meta = json_deep_copy(st->metadata);

			if (!meta)
				return ts_error_oom(err, "no memory for the metadata of array '%s'",
				                    name);
			ts_array_set_metadata(arrays[i], meta);
		}
	}
	return TS_OK;
}

/* ---- the receiver of a safetensors body (shared with models:import) ----------- */

void ts_h_st_recv_init(struct ts_h_st_recv *r, const struct ts_core *core,
                       uint64_t content_length, ts_h_st_admit_fn *admit, void *ctx)
{
	memset(r, 0, sizeof *r);
	r->core = core;
	r->content_length = content_length;
	r->admit = admit;
	r->ctx = ctx;
}

static ts_status recv_header(struct ts_h_st_recv *im, struct ts_error *err)
{
	ts_status s = ts_st_parse_header(im->header, im->header_len, &im->st, err);

	if (s != TS_OK)
		return s;
	im->parsed = true;
	if (im->content_length != UINT64_MAX) {
		s = ts_st_check_total(&im->st, im->content_length, err);
		if (s != TS_OK)
			return s;
	}
	im->arrays = calloc(im->st.ntensors ? im->st.ntensors : 1, sizeof *im->arrays);
	if (!im->arrays)
		return ts_error_oom(err, "no memory for %zu tensors", im->st.ntensors);
	return im->admit(im->ctx, &im->st, im->arrays, err);
}

/* Routes data bytes to the tensors, in order of their offsets. */
static ts_status recv_data(struct ts_h_st_recv *im, const char *data, size_t n, struct ts_error *err)
{
	while (n) {
		const struct ts_st_tensor *t;
		uint64_t left;
		size_t take;
		ts_status s;

		while (im->cur < im->st.ntensors && im->st.tensors[im->cur].end <= im->data_got) {
			if (im->writer) {
				s = ts_array_writer_finish(im->writer, err);
				ts_array_writer_free(im->writer);
				im->writer = NULL;
				if (s != TS_OK)
					return s;
			}
			im->cur++;
		}
		if (im->cur == im->st.ntensors)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "TRAILING_BYTES",
			                    "safetensors body has bytes past its last tensor");
		t = &im->st.tensors[im->cur];
		if (!im->writer) {
			s = ts_array_writer_new(im->core->env.stager, im->arrays[im->cur], &im->writer, err);
			if (s != TS_OK)
				return s;
		}
		left = t->end - im->data_got;
		take = left < n ? (size_t)left : n;
		s = ts_array_writer_write(im->writer, data, take, err);
		if (s != TS_OK)
			return s;
		im->data_got += take;
		data += take;
		n -= take;
	}
	return TS_OK;
}

/* Takes the header's bytes from the budget every import shares, so that
 * many connections cannot hold headers past it: RESOURCE_EXHAUSTED. */
static ts_status header_budget_take(struct ts_h_st_recv *im, struct ts_error *err)
{
	const struct ts_core *core = im->core;
	uint64_t used, n = im->header_len;
	char have[32], limit[32];

	if (!core->import_header_budget || !core->import_header_used)
		return TS_OK;
	used = atomic_load(core->import_header_used);
	do {
		if (used + n > core->import_header_budget) {
			ts_error_set(err, TS_RESOURCE_EXHAUSTED, "HEADER_BUDGET",
			             "imports being read hold %s of safetensors headers; this one's "
			             "would pass the %s budget (--import-header-budget); retry later",
			             ts_format_bytes(have, sizeof have, used),
			             ts_format_bytes(limit, sizeof limit, core->import_header_budget));
			ts_error_meta_u64(err, "requested_bytes", n);
			ts_error_meta_u64(err, "limit_bytes", core->import_header_budget);
			return err->status;
		}
	} while (!atomic_compare_exchange_weak(core->import_header_used, &used, used + n));
	im->header_held = n;
	return TS_OK;
}

ts_status ts_h_st_recv_bytes(struct ts_h_st_recv *im, const char *data, size_t n,
                             struct ts_error *err)
{
	size_t take;

	if (im->received < 8) {
		take = 8 - im->received < n ? (size_t)(8 - im->received) : n;
		memcpy(im->first8 + im->received, data, take);
		im->received += take;
		data += take;
		n -= take;
		if (im->received < 8)
			return TS_OK;
		/* the length is the file's first 8 bytes: no message spells it out */
		if (ts_st_header_len(im->first8, &im->header_len, err) != TS_OK)
			return err->status;
		if (im->content_length != UINT64_MAX && im->header_len > im->content_length - 8)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SAFETENSORS_HEADER",
			                    "the header length in the first 8 bytes runs past the "
			                    "%" PRIu64 "-byte body (is it a safetensors file?)",
			                    im->content_length);
		if (im->core->import_header_max && im->header_len > im->core->import_header_max)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "HEADER_TOO_LARGE",
			                    "the safetensors header is larger than the %" PRIu64
			                    "-byte limit of this server (--import-header-limit)",
			                    im->core->import_header_max);
		if (header_budget_take(im, err) != TS_OK)
			return err->status;
		im->header = malloc(im->header_len ? im->header_len : 1);
		if (!im->header)
			return ts_error_oom(err,
			                    "no memory for a %" PRIu64 "-byte header", im->header_len);
	}
	if (!im->parsed) {
		take = im->header_len - im->header_got < n ? (size_t)(im->header_len - im->header_got) : n;
		memcpy(im->header + im->header_got, data, take);
		im->header_got += take;
		im->received += take;
		data += take;
		n -= take;
		if (im->header_got < im->header_len)
			return TS_OK;
		if (recv_header(im, err) != TS_OK)
			return err->status;
	}
	im->received += n;
	return recv_data(im, data, n, err);
}

ts_status ts_h_st_recv_finish(struct ts_h_st_recv *im, struct ts_error *err)
{
	if (!im->parsed || im->data_got != im->st.data_len)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "TRUNCATED",
		                    "safetensors body ended after %" PRIu64 " bytes, before its data did",
		                    im->received);
	if (im->writer) {
		ts_status s = ts_array_writer_finish(im->writer, err);

		ts_array_writer_free(im->writer);
		im->writer = NULL;
		if (s != TS_OK)
			return s;
	}
	return TS_OK;
}

void ts_h_st_recv_release(struct ts_h_st_recv *im)
{
	ts_array_writer_free(im->writer);
	im->writer = NULL;
	for (size_t i = 0; im->arrays && i < im->st.ntensors; i++)
		ts_array_unref(im->arrays[i]);
	free(im->arrays);
	im->arrays = NULL;
	if (im->parsed)
		ts_st_header_release(&im->st);
	im->parsed = false;
	free(im->header);
	im->header = NULL;
	if (im->header_held)
		atomic_fetch_sub(im->core->import_header_used, im->header_held);
	im->header_held = 0;
}

/* ---- POST /v1/arrays:import --------------------------------------------------- */

static bool import_chunk(void *state, const char *data, size_t n, struct ts_reply *reply)
{
	struct import *im = state;
	struct ts_error err;

	ts_error_clear(&err);
	if (im->from_file) {
		char *grown;

		if (im->json_len + n > TS_IMPORT_JSON_MAX) {
			ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BODY_TOO_LARGE",
			              "an import request naming a file holds at most %u bytes of JSON",
			              TS_IMPORT_JSON_MAX);
			return false;
		}
		grown = realloc(im->json, im->json_len + n + 1);
		if (!grown) {
			ts_reply_oom(reply, "no memory for the body");
			return false;
		}
		im->json = grown;
		memcpy(im->json + im->json_len, data, n);
		im->json_len += n;
		im->json[im->json_len] = '\0';
		return true;
	}
	if (ts_h_st_recv_bytes(&im->rx, data, n, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return false;
	}
	return true;
}

/* The path named by a JSON body, made relative to the data dir by text
 * (no file is touched: this runs on the HTTP thread). */
static ts_status import_parse_path(struct import *im, struct ts_error *err)
{
	json_error_t jerr;
	json_t *body = json_loadb(im->json ? im->json : "", im->json_len, JSON_REJECT_DUPLICATES, &jerr);
	const char *path = NULL;
	ts_status s = TS_OK;

	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:s}", "path", &path) != 0) {
		s = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                 "import body: %s (expected {\"path\": \"...\"})", jerr.text);
		goto out;
	}
	if (!im->core->data_dir) {
		s = ts_error_set(err, TS_PERMISSION_DENIED, "NO_DATA_DIR",
		                 "server-side import is off: start tstaged with --data-dir");
		goto out;
	}
	if (strlen(path) >= sizeof im->path) {
		s = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PATH", "the path is longer than %zu bytes",
		                 sizeof im->path - 1);
		goto out;
	}
	snprintf(im->path, sizeof im->path, "%s", path);
	s = ts_path_beneath(im->core->data_dir, im->core->data_dir_given, im->path, im->rel,
	                    sizeof im->rel, err);
out:
	json_decref(body);
	return s;
}

/* Opens the file below the data dir (on the operation's worker) and tells
 * the request waiting for it. */
static ts_status import_open_file(struct import *im, struct ts_error *err)
{
	int dirfd = open(im->core->data_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	ts_status s;

	if (dirfd < 0)
		s = ts_error_set(err, TS_UNAVAILABLE, "DATA_DIR_GONE",
		                 "the data dir cannot be opened: %s", strerror(errno));
	else
		s = ts_open_beneath(dirfd, im->rel, im->path, &im->fd, &im->file_size, err);
	if (dirfd >= 0)
		close(dirfd);
	pthread_mutex_lock(&im->open_mu);
	im->opened = true;
	if (s != TS_OK)
		im->open_err = *err;
	if (im->open_wake)
		im->open_wake(im->open_token);  /* under the lock: disarm cannot pass it */
	im->open_wake = NULL;
	pthread_mutex_unlock(&im->open_mu);
	return s;
}

/* Reads the whole (already opened) file through the same path a streamed
 * body takes. */
static ts_status import_file(struct import *im, struct ts_error *err)
{
	int fd = im->fd;
	uint64_t size = im->file_size, off = 0;
	char *chunk = NULL;
	ts_status s = TS_OK;

	im->rx.content_length = size;
	ts_operation_total_set(im->op, size);
	chunk = malloc(FILE_CHUNK);
	if (!chunk)
		s = ts_error_oom(err, "no memory to read");
	while (s == TS_OK && off < size) {
		ssize_t got = pread(fd, chunk, FILE_CHUNK, (off_t)off);

		if (got <= 0) {
			s = ts_error_set(err, got < 0 ? ts_status_from_errno(errno) : TS_DATA_LOSS,
			                 "READ_FAILED", "reading the file at byte %" PRIu64 ": %s", off,
			                 got < 0 ? strerror(errno) : "it got shorter");
			break;
		}
		s = ts_h_st_recv_bytes(&im->rx, chunk, (size_t)got, err);
		off += (uint64_t)got;
		ts_operation_progress_set(im->op, off);
		if (s == TS_OK && ts_operation_cancelled(im->op))
			s = ts_error_set(err, TS_CANCELLED, "CANCELLED", "the import was cancelled");
	}
	free(chunk);
	return s;
}

/* Completes an import whose bytes have all arrived: publish all, or nothing. */
static ts_status import_complete(struct import *im, json_t **result, struct ts_error *err)
{
	json_t *list;

	if (ts_h_st_recv_finish(&im->rx, err) != TS_OK)
		return err->status;
	if (ts_catalog_put_all(im->core->env.catalog, im->rx.arrays, im->rx.st.ntensors, im->overwrite,
	                       err) != TS_OK)
		return err->status;
	list = json_array();
	for (size_t i = 0; list && i < im->rx.st.ntensors; i++)
		json_array_append_new(list, ts_render_array(im->rx.arrays[i]));
	*result = json_pack("{s:o*}", "arrays", list);
	/* the result is the operation's alone: a copy, not the header's value */
	if (*result && im->rx.st.metadata &&
	    json_object_set_new(*result, "metadata", json_deep_copy(im->rx.st.metadata)) != 0) {
		json_decref(*result);
		*result = NULL;
	}
	return TS_OK;
}

static void import_free(struct import *im);
static void import_unref(struct import *im);

/* The operation reading a server-side file. */
static ts_status import_file_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct import *im = arg;
	json_t *result = NULL;
	ts_status s;

	im->op = op;
	s = import_open_file(im, err);
	if (s == TS_OK)
		s = import_file(im, err);
	if (s == TS_OK)
		s = import_complete(im, &result, err);
	if (s == TS_OK)
		ts_operation_set_result(op, result ? result : json_object());
	return s;
}

static void import_unref(struct import *im)
{
	int was = atomic_fetch_sub(&im->refs, 1);

	assert(was > 0);     /* an unref without its reference */
	if (was == 1)
		import_free(im);
}

static void import_file_release(void *arg)
{
	import_unref(arg);
}

/* A request waiting for its file to be opened: answered with the open's
 * error, or 202 and the operation. */
struct open_waiter {
	struct import *im;                 /* own reference */
	struct ts_operation *op;           /* own reference */
};

static bool open_waiter_arm(void *state, void (*wake)(void *token), void *token)
{
	struct import *im = ((struct open_waiter *)state)->im;
	bool armed;

	pthread_mutex_lock(&im->open_mu);
	armed = !im->opened;
	if (armed) {
		im->open_wake = wake;
		im->open_token = token;
	}
	pthread_mutex_unlock(&im->open_mu);
	return armed;
}

static void open_waiter_disarm(void *state, void (*wake)(void *token), void *token)
{
	struct import *im = ((struct open_waiter *)state)->im;

	pthread_mutex_lock(&im->open_mu);
	if (im->open_wake == wake && im->open_token == token)
		im->open_wake = NULL;
	pthread_mutex_unlock(&im->open_mu);
}

static void open_waiter_resume(void *state, bool timed_out, struct ts_reply *reply)
{
	struct open_waiter *w = state;
	struct ts_error err;
	bool failed;

	(void)timed_out;
	pthread_mutex_lock(&w->im->open_mu);
	failed = w->im->opened && w->im->open_err.status != TS_OK;
	err = w->im->open_err;
	pthread_mutex_unlock(&w->im->open_mu);
	if (failed)
		ts_reply_error(reply, &err);
	else
		ts_h_reply_operation(reply, w->op, false);
}

static void open_waiter_release(void *state)
{
	struct open_waiter *w = state;

	ts_operation_unref(w->op);
	import_unref(w->im);
	free(w);
}

/* Answers once the operation has opened the file (or failed to). */
static void reply_when_open(struct ts_reply *reply, struct import *im, struct ts_operation *op)
{
	struct open_waiter *w = malloc(sizeof *w);
	struct ts_suspend s;

	if (!w) {
		ts_h_reply_operation(reply, op, false);
		return;
	}
	atomic_fetch_add(&im->refs, 1);
	w->im = im;
	w->op = ts_operation_ref(op);
	s = (struct ts_suspend){.timeout_ns = OPEN_WAIT_NS, .arm = open_waiter_arm,
	                        .disarm = open_waiter_disarm, .resume = open_waiter_resume,
	                        .release = open_waiter_release, .state = w};
	ts_reply_suspend(reply, &s);
}

static void import_finish(void *state, const struct ts_call *call, struct ts_reply *reply)
{
	struct import *im = state;
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_t *root = NULL;
	uint64_t wait_ns;

	ts_error_clear(&err);
	if (im->from_file) {
		/* the path is checked by text now; the file is opened and read by an
		 * operation, never by this HTTP thread (an open can block: NFS, FUSE) */
		if (import_parse_path(im, &err) != TS_OK)
			goto out_fail;
		atomic_fetch_add(&im->refs, 1);       /* the operation's */
		if (ts_op_submit(im->core->env.operations, "import", NULL, 0, "bytes", import_file_run, im,
		                 import_file_release, &op, &err) != TS_OK) {
			atomic_fetch_sub(&im->refs, 1);   /* not taken */
			goto out_fail;
		}
		if (ts_h_wait_requested(call, &wait_ns))
			ts_h_reply_wait(reply, op, wait_ns, true);
		else
			reply_when_open(reply, im, op);
		ts_operation_unref(op);
		return;
	}
	if (import_complete(im, &root, &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_CREATED, root);
	return;

out_fail:
	ts_reply_error(reply, &err);
}

static void import_release(void *state)
{
	import_unref(state);
}

static void import_free(struct import *im)
{
	ts_h_st_recv_release(&im->rx);
	free(im->json);
	if (im->fd >= 0)
		close(im->fd);
	pthread_mutex_destroy(&im->open_mu);
	free(im);
}

const struct ts_upload_ops ts_h_arrays_import = {
	.begin = import_begin,
	.chunk = import_chunk,
	.finish = import_finish,
	.release = import_release,
};

/* ---- export ------------------------------------------------------------------ */

/* Merges the metadata of the arrays (NULL when none has any); new reference. */
static json_t *export_metadata(struct ts_array *const *arrs, size_t n)
{
	json_t *meta = NULL;

	for (size_t i = 0; i < n; i++) {
		const json_t *m = ts_array_metadata(arrs[i]);

		if (!m)
			continue;
		if (!meta)
			meta = json_object();
		/* copied: update_missing would take references to the version's own values */
		if (meta)
			json_object_update_missing_new(meta, json_deep_copy(m));
	}
	return meta;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Refuses two of arrs with the same name (a safetensors header holds each
 * once). O(n log n): a URL may name very many. */
static ts_status export_check_repeats(struct ts_array *const *arrs, size_t n,
                                      struct ts_error *err)
{
	const char **sorted;
	ts_status st = TS_OK;

	if (n < 2)
		return TS_OK;
	sorted = malloc(n * sizeof *sorted);
	if (!sorted)
		return ts_error_oom(err, "no memory to check %zu names", n);
	for (size_t i = 0; i < n; i++)
		sorted[i] = ts_array_name(arrs[i]);
	qsort(sorted, n, sizeof *sorted, name_cmp);
	for (size_t i = 1; i < n && st == TS_OK; i++)
		if (strcmp(sorted[i - 1], sorted[i]) == 0)
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_NAMES",
			                  "names gives array '%s' more than once", sorted[i]);
	free(sorted);
	return st;
}

void ts_h_arrays_export(const struct ts_call *call, struct ts_reply *reply)
{
	const char *names = ts_call_query(call, "names");
	struct ts_array **arrs = NULL;
	struct ts_st_tensor *tensors = NULL;
	struct ts_h_part *parts = NULL;
	struct ts_stream stream;
	struct ts_error err;
	char *list = NULL, *save = NULL, *tok, *hdr = NULL;
	size_t n = 0, cap = 1, hdr_len = 0;
	json_t *meta = NULL;

	ts_error_clear(&err);
	if (!names || !*names) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "NO_NAMES",
		              "export needs ?names=a,b naming the arrays to write");
		return;
	}
	/* one slot per comma-separated name, allocated once */
	for (const char *c = names; *c; c++)
		cap += *c == ',';
	list = strdup(names);
	arrs = calloc(cap, sizeof *arrs);
	tensors = calloc(cap, sizeof *tensors);
	parts = calloc(cap, sizeof *parts);
	if (!list || !arrs || !tensors || !parts) {
		ts_error_oom(&err, "no memory for the export");
		goto out_fail;
	}
	/* every entry names an array: no empty entries ("a,,b", "a,"), no
	 * repeats (a safetensors header holds each name once) */
	for (tok = list; tok; tok = save) {
		save = strchr(tok, ',');
		if (save)
			*save++ = '\0';
		if (!*tok) {
			ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_NAMES",
			             "names has an empty entry at position %zu; give ?names=a,b", n + 1);
			goto out_fail;
		}
		if (!ts_array_name_valid(tok)) {
			ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
			             "array name '%.140s' in names is invalid", tok);
			goto out_fail;
		}
		arrs[n] = ts_catalog_get(call->core->env.catalog, tok);
		if (!arrs[n]) {
			ts_error_set(&err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found", tok);
			goto out_fail;
		}
		n++;
	}
	if (export_check_repeats(arrs, n, &err) != TS_OK)
		goto out_fail;
	for (size_t i = 0; i < n; i++) {
		const struct ts_array_desc *d = ts_array_desc(arrs[i]);

		tensors[i] = (struct ts_st_tensor){.name = (char *)ts_array_name(arrs[i]),
		                                   .dtype = d->dtype, .rank = d->rank};
		memcpy(tensors[i].shape, d->shape, sizeof tensors[i].shape);
	}
	meta = export_metadata(arrs, n);
	if (ts_st_build_header(tensors, n, meta, &hdr, &hdr_len, &err) != TS_OK)
		goto out_fail;
	for (size_t i = 0; i < n; i++) {
		const struct ts_array_desc *d = ts_array_desc(arrs[i]);

		parts[i].array = arrs[i];
		ts_selection_all(d->rank, d->shape, &parts[i].sel);
	}
	free(arrs);
	arrs = NULL;
	if (ts_h_reader_stream(call->core, hdr, hdr_len, parts, n, &stream, &err) != TS_OK) {
		parts = NULL;
		hdr = NULL;
		goto out_fail;
	}
	hdr = NULL;
	parts = NULL;
	ts_reply_stream(reply, TS_HTTP_OK, "application/octet-stream", &stream);
	ts_reply_header(reply, "Content-Disposition", "attachment; filename=\"export.safetensors\"");
	goto out_free;

out_fail:
	ts_reply_error(reply, &err);
out_free:
	for (size_t i = 0; arrs && i < n; i++)
		ts_array_unref(arrs[i]);
	free(arrs);
	free(parts);
	free(tensors);
	free(hdr);
	free(list);
	json_decref(meta);
}
