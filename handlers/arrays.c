/*
 * arrays.c - the array resource: GET /v1/arrays (list), GET and DELETE
 * /v1/arrays/{array}, POST /v1/arrays/{array}:gather, and the helpers the
 * other array handlers share (placement, shapes, metadata).
 */
#include "handlers/arrays_int.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/page_token.h"
#include "common/units.h"
#include "handlers/sharding_json.h"
#include "storage/array_io.h"

/* ---- shared helpers ---------------------------------------------------------- */

ts_status ts_h_placement(const struct ts_core *core, const char *device,
                         const char *memory_kind, struct ts_placement *out,
                         struct ts_error *err)
{
	struct ts_device *dev = core->default_device;
	enum ts_memory_kind kind = core->default_memory_kind;

	if (device && *device) {
		dev = ts_device_set_find(core->env.devices, device);
		if (!dev)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
			                    "device '%s' is not a device of this node", device);
	}
	if (memory_kind && *memory_kind && !ts_memory_kind_parse(memory_kind, &kind))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
		                    "memory_kind '%s' is not one of device, pinned_host, unpinned_host",
		                    memory_kind);
	ts_placement_single(out, dev, kind, (device && *device) || (memory_kind && *memory_kind));
	return TS_OK;
}

ts_status ts_h_placement_query(const struct ts_call *call, struct ts_placement *out,
                               struct ts_error *err)
{
	const char *sh = ts_call_query(call, "sharding");
	const char *dev = ts_call_query(call, "device"), *kind = ts_call_query(call, "memory_kind");
	json_error_t jerr;
	json_t *j;
	ts_status st;

	if (!sh || !*sh)
		return ts_h_placement(call->core, dev, kind, out, err);
	if ((dev && *dev) || (kind && *kind))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PLACEMENT",
		                    "give either ?sharding= or ?device=/?memory_kind=, not both");
	if (sh[0] == '{') {
		j = json_loads(sh, JSON_REJECT_DUPLICATES, &jerr);
		if (!j)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING",
			                    "?sharding= is neither a saved sharding's name nor JSON: %s",
			                    jerr.text);
	} else {
		j = json_string(sh);   /* NULL: not UTF-8 (the server refuses that first) */
		if (!j)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING",
			                    "?sharding= is not valid UTF-8");
	}
	out->committed = true;
	st = ts_h_sharding_resolve(call->core, j, &out->sharding, err);
	json_decref(j);
	return st;
}

ts_status ts_h_parse_shape(const char *s, int *rank, uint64_t *shape, struct ts_error *err)
{
	int r = 0;

	while (*s == ' ')
		s++;
	if (*s == '\0') {
		*rank = 0;
		return TS_OK;
	}
	for (;;) {
		char *end;
		unsigned long long v;

		if (r == TS_MAX_RANK)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHAPE",
			                    "shape has more than %d dimensions", TS_MAX_RANK);
		if (*s < '0' || *s > '9')
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHAPE",
			                    "shape entry %d is not a non-negative integer", r);
		v = strtoull(s, &end, 10);
		if (end - s > 20 || (v == ULLONG_MAX))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHAPE",
			                    "shape entry %d is too large", r);
		shape[r++] = v;
		s = end;
		while (*s == ' ')
			s++;
		if (*s == '\0')
			break;
		if (*s != ',')
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHAPE",
			                    "shape must be comma-separated integers, as in shape=8,6,16");
		s++;
		while (*s == ' ')
			s++;
		if (*s == '\0')      /* a trailing comma, as in "3," */
			break;
	}
	*rank = r;
	return TS_OK;
}

/* Digits by hand: this runs for every download (X-Tstage-Shape), and printf
 * was a visible part of a small item's cost. Stops at whole numbers that fit. */
void ts_h_format_shape(char *buf, size_t cap, int rank, const uint64_t *shape)
{
	size_t o = 0;

	buf[0] = '\0';
	for (int i = 0; i < rank; i++) {
		char digits[20];
		size_t k = 0;
		uint64_t v = shape[i];

		do {
			digits[k++] = (char)('0' + v % 10);
			v /= 10;
		} while (v);
		if (o + (i > 0) + k + 1 > cap)
			break;
		if (i > 0)
			buf[o++] = ',';
		while (k)
			buf[o++] = digits[--k];
		buf[o] = '\0';
	}
}





const char *ts_h_array_name(const struct ts_call *call, struct ts_reply *reply)
{
	const char *name = ts_call_param(call, "array");

	if (!ts_array_name_valid(name)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
		              "array name '%s' is invalid: it must match "
		              "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", name ? name : "");
		return NULL;
	}
	return name;
}

struct ts_array *ts_h_array_from_path(const struct ts_call *call, struct ts_reply *reply)
{
	const char *name = ts_h_array_name(call, reply);
	struct ts_array *a;

	if (!name)
		return NULL;
	a = ts_catalog_get(call->core->env.catalog, name);
	if (!a)
		ts_reply_fail(reply, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found", name);
	return a;
}

void ts_h_reply_array(struct ts_reply *reply, const struct ts_array *a, bool created)
{
	char loc[200];

	ts_reply_json(reply, created ? TS_HTTP_CREATED : TS_HTTP_OK, ts_render_array(a));
	if (reply->kind != TS_REPLY_JSON)
		return;
	snprintf(loc, sizeof loc, "/v1/arrays/%s", ts_array_name(a));
	ts_reply_header(reply, "ETag", ts_array_etag(a));
	ts_reply_header(reply, "Location", loc);
}

/* ---- GET /v1/arrays/{array}/sharding ------------------------------------------- */

void ts_h_arrays_sharding(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_array *a = ts_h_array_from_path(call, reply);
	const char *fmt = ts_call_query(call, "format");
	const struct ts_array_desc *d;

	if (!a)
		return;
	d = ts_array_desc(a);
	if (fmt && strcmp(fmt, "text") == 0) {
		const struct ts_sharding *s = &ts_array_placement(a)->sharding;
		size_t need = ts_sharding_render_text(s, d->rank, d->shape, NULL, 0);
		char *text = malloc(need + 1);

		if (text)
			ts_sharding_render_text(s, d->rank, d->shape, text, need + 1);
		ts_reply_text_owned(reply, TS_HTTP_OK, "text/plain; charset=utf-8", text,
		                    text ? strlen(text) : 0);
	} else if (fmt && strcmp(fmt, "json") != 0) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_FORMAT", "format '%s' is not one of json, text",
		              fmt);
	} else {
		ts_reply_json(reply, TS_HTTP_OK,
		              json_pack("{s:o*, s:b, s:o*}", "sharding",
		                        ts_render_sharding(&ts_array_placement(a)->sharding),
		                        "committed", ts_array_placement(a)->committed,
		                        "shards", ts_render_shards(a)));
	}
	ts_array_unref(a);
}

/* ---- GET /v1/arrays ----------------------------------------------------------- */

struct list_filter {
	struct ts_device *device;
	bool any_kind;
	enum ts_memory_kind kind;
};

static bool list_keep(const struct ts_array *a, void *arg)
{
	const struct list_filter *f = arg;

	if (f->any_kind)
		for (int k = 0; k < TS_MEM_KIND_COUNT; k++)
			if (ts_array_on(a, f->device, (enum ts_memory_kind)k))
				return true;
	return !f->any_kind && ts_array_on(a, f->device, f->kind);
}

/* The listing a page token is for: the filter as the client wrote it. */
static void list_scope(char *buf, size_t cap, const char *dev, const char *kind)
{
	snprintf(buf, cap, "arrays device=%.*s memory_kind=%.16s", TS_ARRAY_NAME_MAX,
	         dev ? dev : "", kind ? kind : "");
}

/* The name a page token (common/page_token.h) resumes after, into after
 * (TS_ARRAY_NAME_MAX + 1 bytes): false unless this server wrote it for
 * scope. */
static bool list_token_read(const char *token, const char *scope, char *after)
{
	long n = ts_page_token_read(token, scope, after, TS_ARRAY_NAME_MAX);

	if (n <= 0)
		return false;
	after[n] = '\0';
	return ts_array_name_valid(after);
}

void ts_h_arrays_list(const struct ts_call *call, struct ts_reply *reply)
{
	const char *dev = ts_call_query(call, "device"), *kind = ts_call_query(call, "memory_kind");
	const char *size_s = ts_call_query(call, "page_size"), *token = ts_call_query(call, "page_token");
	struct list_filter f = {.any_kind = true};
	char scope[TS_ARRAY_NAME_MAX + 64], after[TS_ARRAY_NAME_MAX + 1];
	struct ts_array **arrs;
	struct ts_error err;
	size_t n;
	bool more;
	long page = 100;
	json_t *list, *root;

	ts_error_clear(&err);
	if (size_s && !ts_parse_long(size_s, 1, 1000, &page)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_PAGE_SIZE",
		              "page_size '%.64s' is not an integer in 1..1000", size_s);
		return;
	}
	if (dev && *dev && !(f.device = ts_device_set_find(call->core->env.devices, dev))) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
		              "device '%s' is not a device of this node", dev);
		return;
	}
	if (kind && *kind) {
		if (!ts_memory_kind_parse(kind, &f.kind)) {
			ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
			              "memory_kind '%s' is not one of device, pinned_host, unpinned_host",
			              kind);
			return;
		}
		f.any_kind = false;
	}
	list_scope(scope, sizeof scope, dev, kind);
	if (token && *token && !list_token_read(token, scope, after)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_PAGE_TOKEN",
		              "page_token '%s' is not one this server gave for this listing "
		              "(the next_page_token of an earlier page, with the same device and "
		              "memory_kind)", token);
		return;
	}
	if (ts_catalog_list(call->core->env.catalog, token && *token ? after : NULL, (size_t)page,
	                    list_keep, &f, &arrs, &n, &more, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	list = json_array();
	for (size_t i = 0; list && i < n; i++)
		json_array_append_new(list, ts_render_array(arrs[i]));
	root = json_pack("{s:o*}", "arrays", list);
	if (root && more && n) {
		const char *last = ts_array_name(arrs[n - 1]);
		char next[TS_PAGE_TOKEN_MAX];

		if (ts_page_token_write(next, sizeof next, scope, last, strlen(last)))
			json_object_set_new(root, "next_page_token", json_string(next));
	}
	ts_catalog_list_free(arrs, n);
	ts_reply_json(reply, TS_HTTP_OK, root);
}

/* ---- GET / DELETE /v1/arrays/{array} ------------------------------------------- */

void ts_h_arrays_get(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_array *a = ts_h_array_from_path(call, reply);

	if (!a)
		return;
	ts_h_reply_array(reply, a, false);
	ts_array_unref(a);
}

void ts_h_arrays_delete(const struct ts_call *call, struct ts_reply *reply)
{
	const char *name = ts_h_array_name(call, reply);
	struct ts_precondition pre = {.if_match = ts_call_header(call, "If-Match")};
	struct ts_error err;

	if (!name)
		return;
	ts_error_clear(&err);
	if (ts_catalog_delete(call->core->env.catalog, name, &pre, &err) != TS_OK)
		ts_reply_error(reply, &err);
	else
		ts_reply_json(reply, TS_HTTP_OK, json_object());
}

/* ---- POST /v1/arrays/{array}:gather ---------------------------------------------- */

/* Copies the rows of src into dst as merged runs. */
static ts_status gather_copy(const struct ts_core *core, struct ts_array *dst,
                             struct ts_array *src, const uint64_t *rows, size_t n,
                             uint64_t row_bytes, struct ts_error *err)
{
	struct ts_run *runs = malloc((n ? n : 1) * sizeof *runs);
	struct ts_rows_iter it;
	uint64_t off, len, at = 0;
	size_t k = 0;
	ts_status st;

	if (!runs)
		return ts_error_oom(err, "no memory for runs");
	ts_rows_iter_init(&it, rows, n, row_bytes);
	while (ts_rows_iter_next(&it, &off, &len)) {
		runs[k++] = (struct ts_run){.src_offset = off, .dst_offset = at, .len = len};
		at += len;
	}
	st = ts_array_copy(core->env.stager, dst, NULL, src, runs, k, NULL, NULL, NULL, err);
	free(runs);
	return st;
}

void ts_h_arrays_gather(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_array *src = ts_h_array_from_path(call, reply), *dst = NULL;
	json_t *body = NULL, *rows = NULL, *out = NULL;
	const char *out_name = NULL, *dev = NULL, *kind = NULL;
	struct ts_array_desc d;
	struct ts_placement pl;
	struct ts_error err;
	json_error_t jerr;
	uint64_t *norm = NULL, row_bytes;
	size_t n = 0;
	bool replaced = false;

	ts_error_clear(&err);
	if (!src)
		return;
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s:{s:s, s?s, s?s}}", "rows",
	                            &rows, "out", "name", &out_name, "device", &dev,
	                            "memory_kind", &kind) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "gather body: %s (expected {\"rows\": [...], \"out\": {\"name\", "
		             "\"device\", \"memory_kind\"}})", jerr.text);
		goto out_fail;
	}
	(void)out;
	d = *ts_array_desc(src);
	if (d.rank == 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		             "array '%s' is 0-dimensional: it has no rows", ts_array_name(src));
		goto out_fail;
	}
	if (!ts_array_name_valid(out_name)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
		             "out.name '%s' is invalid", out_name);
		goto out_fail;
	}
	row_bytes = d.shape[0] ? d.nbytes / d.shape[0] : 0;
	if (ts_rows_parse(rows, "rows", d.shape[0], &norm, &n, &err) != TS_OK ||
	    ts_h_placement(call->core, dev, kind, &pl, &err) != TS_OK)
		goto out_fail;
	d.shape[0] = n;
	if (ts_array_desc_init(&d, &err) != TS_OK ||
	    ts_array_new(out_name, &d, &pl, call->core->env.memory, &dst, &err) != TS_OK ||
	    gather_copy(call->core, dst, src, norm, n, row_bytes, &err) != TS_OK ||
	    ts_catalog_put(call->core->env.catalog, dst, NULL, &replaced, &err) != TS_OK)
		goto out_fail;
	ts_h_reply_array(reply, dst, !replaced);
	goto out_free;

out_fail:
	ts_reply_error(reply, &err);
out_free:
	free(norm);
	json_decref(body);
	ts_array_unref(dst);
	ts_array_unref(src);
}
