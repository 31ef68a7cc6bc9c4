/*
 * safetensors_io.c - POST /v1/arrays:import and GET /v1/arrays:export.
 *
 * Import parses the placement and prefix, then hands the body to an import
 * of jobs/import.h as it streams (each byte routed straight into its
 * tensor's buffer, all tensors published together or none). With a JSON
 * body {"path": ...} the file is read on the server, only from below
 * --data-dir, so a 19 GiB file need not cross HTTP: the path is checked by
 * text on the HTTP thread, and opened (beneath the data dir, no link
 * followed, regular files only) and read by the import's operation
 * (ts_job_import_submit); the request is answered once the open has
 * succeeded or failed.
 *
 * Export streams a safetensors file of the named arrays: the header, then
 * each array's bytes read from its buffer (device memory through the copy
 * queue), never assembled in memory.
 */
#include "handlers/arrays_int.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/beneath.h"
#include "formats/safetensors.h"
#include "handlers/operations.h"
#include "jobs/import.h"
#include "ops/operation.h"

#define TS_IMPORT_JSON_MAX (64u << 10)
#define OPEN_WAIT_NS (10ull * 1000000000ull)   /* a hung open answers 202 after this */

/* The request's state: the import (jobs/import.h), and for a server-side
 * file the JSON body naming it. */
struct import_req {
	struct ts_import *im;              /* own reference */
	bool from_file;                    /* JSON body naming a server-side file */
	char *json;                        /* JSON body (from_file) */
	size_t json_len;
	char path[PATH_MAX];               /* from_file: as the client wrote it */
	char rel[PATH_MAX];                /* from_file: relative to the data dir */
};

static void *import_begin(const struct ts_call *call, uint64_t content_length,
                          struct ts_reply *reply)
{
	const char *ctype = ts_call_header(call, "Content-Type");
	const char *prefix = ts_call_query(call, "prefix"), *ow = ts_call_query(call, "overwrite");
	struct import_req *rq = calloc(1, sizeof *rq);
	struct ts_placement placement;
	struct ts_error err;
	int persist;

	ts_error_clear(&err);
	if (!rq) {
		ts_reply_oom(reply, "no memory for an import");
		return NULL;
	}
	rq->from_file = ctype && strncasecmp(ctype, "application/json", 16) == 0;
	if (prefix && strlen(prefix) > TS_ARRAY_NAME_MAX) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_PREFIX", "prefix is longer than %d characters",
		             TS_ARRAY_NAME_MAX);
		goto out_fail;
	}
	if (ts_h_placement_query(call, &placement, &err) != TS_OK)
		goto out_fail;
	if (rq->from_file && content_length != UINT64_MAX && content_length > TS_IMPORT_JSON_MAX) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BODY_TOO_LARGE",
		             "an import request naming a file holds at most %u bytes of JSON",
		             TS_IMPORT_JSON_MAX);
		goto out_fail;
	}
	if (ts_h_persist_query(call, &persist, &err) != TS_OK)
		goto out_fail;
	if (ts_import_new(&call->core->env, &placement, prefix, !ow || strcmp(ow, "false") != 0,
	                  content_length, &rq->im, &err) != TS_OK)
		goto out_fail;
	if (persist >= 0)
		ts_import_set_persist(rq->im, persist > 0);
	return rq;

out_fail:
	ts_reply_error(reply, &err);
	free(rq);
	return NULL;
}

static bool import_chunk(void *state, const char *data, size_t n, struct ts_reply *reply)
{
	struct import_req *rq = state;
	struct ts_error err;

	ts_error_clear(&err);
	if (rq->from_file) {
		char *grown;

		if (rq->json_len + n > TS_IMPORT_JSON_MAX) {
			ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BODY_TOO_LARGE",
			              "an import request naming a file holds at most %u bytes of JSON",
			              TS_IMPORT_JSON_MAX);
			return false;
		}
		grown = realloc(rq->json, rq->json_len + n + 1);
		if (!grown) {
			ts_reply_oom(reply, "no memory for the body");
			return false;
		}
		rq->json = grown;
		memcpy(rq->json + rq->json_len, data, n);
		rq->json_len += n;
		rq->json[rq->json_len] = '\0';
		return true;
	}
	if (ts_import_bytes(rq->im, data, n, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return false;
	}
	return true;
}

/* The path named by a JSON body, made relative to the data dir by text
 * (no file is touched: this runs on the HTTP thread). */
static ts_status import_parse_path(struct import_req *rq, const struct ts_core *core,
                                   struct ts_error *err)
{
	json_error_t jerr;
	json_t *body = json_loadb(rq->json ? rq->json : "", rq->json_len, JSON_REJECT_DUPLICATES, &jerr);
	const char *path = NULL;
	ts_status s = TS_OK;

	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:s}", "path", &path) != 0) {
		s = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                 "import body: %s (expected {\"path\": \"...\"})", jerr.text);
		goto out;
	}
	if (!core->data_dir) {
		s = ts_error_set(err, TS_PERMISSION_DENIED, "NO_DATA_DIR",
		                 "server-side import is off: start tstaged with --data-dir");
		goto out;
	}
	if (strlen(path) >= sizeof rq->path) {
		s = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PATH", "the path is longer than %zu bytes",
		                 sizeof rq->path - 1);
		goto out;
	}
	snprintf(rq->path, sizeof rq->path, "%s", path);
	s = ts_path_beneath(core->data_dir, core->data_dir_given, rq->path, rq->rel,
	                    sizeof rq->rel, err);
out:
	json_decref(body);
	return s;
}

/* A request waiting for its file to be opened: answered with the open's
 * error, or 202 and the operation. */
struct open_waiter {
	struct ts_import *im;              /* own reference */
	struct ts_operation *op;           /* own reference */
};

static bool open_waiter_arm(void *state, void (*wake)(void *token), void *token)
{
	return ts_import_open_arm(((struct open_waiter *)state)->im, wake, token);
}

static void open_waiter_disarm(void *state, void (*wake)(void *token), void *token)
{
	ts_import_open_disarm(((struct open_waiter *)state)->im, wake, token);
}

static void open_waiter_resume(void *state, bool timed_out, struct ts_reply *reply)
{
	struct open_waiter *w = state;
	struct ts_error err;

	(void)timed_out;
	if (ts_import_open_failed(w->im, &err))
		ts_reply_error(reply, &err);
	else
		ts_h_reply_operation(reply, w->op, false);
}

static void open_waiter_release(void *state)
{
	struct open_waiter *w = state;

	ts_operation_unref(w->op);
	ts_import_unref(w->im);
	free(w);
}

/* Answers once the operation has opened the file (or failed to). */
static void reply_when_open(struct ts_reply *reply, struct ts_import *im, struct ts_operation *op)
{
	struct open_waiter *w = malloc(sizeof *w);
	struct ts_suspend s;

	if (!w) {
		ts_h_reply_operation(reply, op, false);
		return;
	}
	w->im = ts_import_ref(im);
	w->op = ts_operation_ref(op);
	s = (struct ts_suspend){.timeout_ns = OPEN_WAIT_NS, .arm = open_waiter_arm,
	                        .disarm = open_waiter_disarm, .resume = open_waiter_resume,
	                        .release = open_waiter_release, .state = w};
	ts_reply_suspend(reply, &s);
}

static void import_finish(void *state, const struct ts_call *call, struct ts_reply *reply)
{
	struct import_req *rq = state;
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_t *root = NULL;
	uint64_t wait_ns;

	ts_error_clear(&err);
	if (rq->from_file) {
		/* the path is checked by text now; the file is opened and read by an
		 * operation, never by this HTTP thread (an open can block: NFS, FUSE) */
		if (import_parse_path(rq, call->core, &err) != TS_OK ||
		    ts_job_import_submit(rq->im, call->core->data_dir, rq->rel, rq->path, &op,
		                         &err) != TS_OK)
			goto out_fail;
		if (ts_h_wait_requested(call, &wait_ns))
			ts_h_reply_wait(reply, op, wait_ns, true);
		else
			reply_when_open(reply, rq->im, op);
		ts_operation_unref(op);
		return;
	}
	if (ts_import_publish(rq->im, &root, &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_CREATED, root);
	return;

out_fail:
	ts_reply_error(reply, &err);
}

static void import_release(void *state)
{
	struct import_req *rq = state;

	ts_import_unref(rq->im);
	free(rq->json);
	free(rq);
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
