/*
 * import.c - safetensors tensors into the catalog as arrays (jobs/import.h):
 * the receiver of a body, its admission of one array per tensor, the
 * publish of all or none, and the operation that opens and reads a file
 * below the data dir.
 */
#include "jobs/import.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/beneath.h"
#include "common/units.h"
#include "jobs/render.h"
#include "storage/array_io.h"

#define FILE_CHUNK (8u << 20)

/* ---- the receiver ---------------------------------------------------------------- */

void ts_import_rx_init(struct ts_import_rx *r, const struct ts_jobs_env *env,
                       uint64_t content_length, ts_import_admit_fn *admit, void *ctx)
{
	memset(r, 0, sizeof *r);
	r->env = env;
	r->content_length = content_length;
	r->admit = admit;
	r->ctx = ctx;
}

static ts_status recv_header(struct ts_import_rx *im, struct ts_error *err)
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
static ts_status recv_data(struct ts_import_rx *im, const char *data, size_t n,
                           struct ts_error *err)
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
			s = ts_array_writer_new(im->env->stager, im->arrays[im->cur], &im->writer, err);
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
static ts_status header_budget_take(struct ts_import_rx *im, struct ts_error *err)
{
	const struct ts_jobs_env *env = im->env;
	uint64_t used, n = im->header_len;
	char have[32], limit[32];

	if (!env->import_header_budget || !env->import_header_used)
		return TS_OK;
	used = atomic_load(env->import_header_used);
	do {
		if (used + n > env->import_header_budget) {
			ts_error_set(err, TS_RESOURCE_EXHAUSTED, "HEADER_BUDGET",
			             "imports being read hold %s of safetensors headers; this one's "
			             "would pass the %s budget (--import-header-budget); retry later",
			             ts_format_bytes(have, sizeof have, used),
			             ts_format_bytes(limit, sizeof limit, env->import_header_budget));
			ts_error_meta_u64(err, "requested_bytes", n);
			ts_error_meta_u64(err, "limit_bytes", env->import_header_budget);
			return err->status;
		}
	} while (!atomic_compare_exchange_weak(env->import_header_used, &used, used + n));
	im->header_held = n;
	return TS_OK;
}

ts_status ts_import_rx_bytes(struct ts_import_rx *im, const char *data, size_t n,
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
		if (im->env->import_header_max && im->header_len > im->env->import_header_max)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "HEADER_TOO_LARGE",
			                    "the safetensors header is larger than the %" PRIu64
			                    "-byte limit of this server (--import-header-limit)",
			                    im->env->import_header_max);
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

ts_status ts_import_rx_finish(struct ts_import_rx *im, struct ts_error *err)
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

void ts_import_rx_release(struct ts_import_rx *im)
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
		atomic_fetch_sub(im->env->import_header_used, im->header_held);
	im->header_held = 0;
}

/* ---- an array import --------------------------------------------------------------- */

struct ts_import {
	const struct ts_jobs_env *env;
	struct ts_placement placement;
	char prefix[TS_ARRAY_NAME_MAX + 1];
	bool overwrite;
	int persist;                       /* the arrays' persist mark; -1 keep the names' */
	struct ts_import_rx rx;            /* the body's bytes into arrays */
	/* a file's import: what the operation reads */
	struct ts_operation *op;           /* borrowed while it runs */
	const char *data_dir;              /* borrowed */
	int fd;                            /* the open file, -1 none */
	uint64_t file_size;
	char path[PATH_MAX];               /* as the client wrote it */
	char rel[PATH_MAX];                /* relative to the data dir */
	/* the open's outcome, for a caller waiting on it */
	pthread_mutex_t open_mu;
	bool opened;                       /* guarded by: open_mu */
	struct ts_error open_err;          /* guarded by: open_mu; set once opened */
	void (*open_wake)(void *token);    /* guarded by: open_mu */
	void *open_token;                  /* guarded by: open_mu */
	_Atomic int refs;
};

/* Creates (admits) every tensor's array; all or nothing. */
static ts_status import_admit(void *ctx, const struct ts_st_header *st, struct ts_array **arrays,
                              struct ts_error *err)
{
	struct ts_import *im = ctx;

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
			s = ts_array_new(name, &d, &im->placement, im->env->memory, &arrays[i], err);
		if (s != TS_OK)
			return s;
		if (im->persist >= 0)
			ts_array_set_persist(arrays[i], im->persist > 0);
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

ts_status ts_import_new(const struct ts_jobs_env *env, const struct ts_placement *pl,
                        const char *prefix, bool overwrite, uint64_t content_length,
                        struct ts_import **out, struct ts_error *err)
{
	struct ts_import *im = calloc(1, sizeof *im);

	*out = NULL;
	if (!im)
		return ts_error_oom(err, "no memory for an import");
	im->env = env;
	im->placement = *pl;
	snprintf(im->prefix, sizeof im->prefix, "%s", prefix ? prefix : "");
	im->overwrite = overwrite;
	im->persist = -1;
	im->fd = -1;
	atomic_init(&im->refs, 1);
	pthread_mutex_init(&im->open_mu, NULL);
	ts_error_clear(&im->open_err);
	ts_import_rx_init(&im->rx, env, content_length, import_admit, im);
	*out = im;
	return TS_OK;
}

struct ts_import *ts_import_ref(struct ts_import *im)
{
	atomic_fetch_add(&im->refs, 1);
	return im;
}

void ts_import_unref(struct ts_import *im)
{
	int was;

	if (!im)
		return;
	was = atomic_fetch_sub(&im->refs, 1);
	assert(was > 0);     /* an unref without its reference */
	if (was != 1)
		return;
	ts_import_rx_release(&im->rx);
	if (im->fd >= 0)
		close(im->fd);
	pthread_mutex_destroy(&im->open_mu);
	free(im);
}

void ts_import_set_persist(struct ts_import *im, bool on)
{
	im->persist = on;
}

ts_status ts_import_bytes(struct ts_import *im, const char *data, size_t n,
                          struct ts_error *err)
{
	return ts_import_rx_bytes(&im->rx, data, n, err);
}

ts_status ts_import_publish(struct ts_import *im, json_t **result, struct ts_error *err)
{
	json_t *list;

	*result = NULL;
	if (ts_import_rx_finish(&im->rx, err) != TS_OK)
		return err->status;
	if (ts_catalog_put_all(im->env->catalog, im->rx.arrays, im->rx.st.ntensors, im->overwrite,
	                       err) != TS_OK)
		return err->status;
	list = json_array();
	for (size_t i = 0; list && i < im->rx.st.ntensors; i++)
		json_array_append_new(list, ts_render_array(im->rx.arrays[i]));
	*result = json_pack("{s:o*}", "arrays", list);
	/* the result is the caller's alone: a copy, not the header's value */
	if (*result && im->rx.st.metadata &&
	    json_object_set_new(*result, "metadata", json_deep_copy(im->rx.st.metadata)) != 0) {
		json_decref(*result);
		*result = NULL;
	}
	return TS_OK;
}

/* ---- a file's import, on an operation worker ---------------------------------------- */

/* Opens the file below the data dir and tells the caller waiting for it. */
static ts_status import_open_file(struct ts_import *im, struct ts_error *err)
{
	int dirfd = open(im->data_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
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
static ts_status import_read_file(struct ts_import *im, struct ts_error *err)
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
		s = ts_import_rx_bytes(&im->rx, chunk, (size_t)got, err);
		off += (uint64_t)got;
		ts_operation_progress_set(im->op, off);
		if (s == TS_OK && ts_operation_cancelled(im->op))
			s = ts_error_set(err, TS_CANCELLED, "CANCELLED", "the import was cancelled");
	}
	free(chunk);
	return s;
}

static ts_status import_file_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct ts_import *im = arg;
	json_t *result = NULL;
	ts_status s;

	im->op = op;
	s = import_open_file(im, err);
	if (s == TS_OK)
		s = import_read_file(im, err);
	if (s == TS_OK)
		s = ts_import_publish(im, &result, err);
	if (s == TS_OK)
		ts_operation_set_result(op, result ? result : json_object());
	return s;
}

static void import_file_release(void *arg)
{
	ts_import_unref(arg);
}

ts_status ts_job_import_submit(struct ts_import *im, const char *data_dir, const char *rel,
                               const char *path, struct ts_operation **op,
                               struct ts_error *err)
{
	ts_status s;

	*op = NULL;
	if (strlen(rel) >= sizeof im->rel || strlen(path) >= sizeof im->path)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PATH",
		                    "the path is longer than %zu bytes", sizeof im->path - 1);
	im->data_dir = data_dir;
	snprintf(im->rel, sizeof im->rel, "%s", rel);
	snprintf(im->path, sizeof im->path, "%s", path);
	ts_import_ref(im);       /* the operation's */
	s = ts_op_submit(im->env->operations, "import", NULL, 0, "bytes", import_file_run, im,
	                 import_file_release, op, err);
	if (s != TS_OK)
		atomic_fetch_sub(&im->refs, 1);   /* not taken; the caller's remains */
	return s;
}

/* ---- the open's outcome ------------------------------------------------------------- */

bool ts_import_open_arm(struct ts_import *im, void (*wake)(void *token), void *token)
{
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

void ts_import_open_disarm(struct ts_import *im, void (*wake)(void *token), void *token)
{
	pthread_mutex_lock(&im->open_mu);
	if (im->open_wake == wake && im->open_token == token)
		im->open_wake = NULL;
	pthread_mutex_unlock(&im->open_mu);
}

bool ts_import_open_failed(struct ts_import *im, struct ts_error *err)
{
	bool failed;

	pthread_mutex_lock(&im->open_mu);
	failed = im->opened && im->open_err.status != TS_OK;
	*err = im->open_err;
	pthread_mutex_unlock(&im->open_mu);
	return failed;
}
