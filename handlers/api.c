/*
 * api.c - ts_call lookups and ts_reply builders shared by every handler.
 */
#include "handlers/api.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/hash.h"
#include "common/utf8.h"

const char *ts_call_param(const struct ts_call *c, const char *name)
{
	for (int i = 0; i < c->nparams; i++)
		if (strcmp(c->params[i].name, name) == 0)
			return c->params[i].value;
	return NULL;
}

const char *ts_call_query(const struct ts_call *c, const char *key)
{
	return c->lookup ? c->lookup(c->conn, TS_LOOKUP_QUERY, key) : NULL;
}

const char *ts_call_header(const struct ts_call *c, const char *name)
{
	return c->lookup ? c->lookup(c->conn, TS_LOOKUP_HEADER, name) : NULL;
}

static void reply_reset_body(struct ts_reply *r)
{
	json_decref(r->json);
	free(r->text);
	if (r->stream.release)
		r->stream.release(r->stream.state);
	if (r->parts.release)
		r->parts.release(r->parts.cls);
	if (r->suspend.release)
		r->suspend.release(r->suspend.state);
	r->json = NULL;
	r->text = NULL;
	r->text_len = 0;
	memset(&r->stream, 0, sizeof r->stream);
	memset(&r->parts, 0, sizeof r->parts);
	memset(&r->suspend, 0, sizeof r->suspend);
}

void ts_reply_release(struct ts_reply *r)
{
	reply_reset_body(r);
	/* as new, without zeroing the 5 KiB of header and error text (once a
	 * request on the hot path) */
	r->kind = TS_REPLY_NONE;
	r->ok = 0;
	r->content_type = NULL;
	r->nheaders = 0;
	ts_error_clear(&r->error);
}

void ts_reply_stream(struct ts_reply *r, enum ts_http_ok ok, const char *content_type,
                     const struct ts_stream *stream)
{
	reply_reset_body(r);
	r->kind = TS_REPLY_STREAM;
	r->ok = ok;
	r->content_type = content_type;
	r->stream = *stream;
}

void ts_reply_suspend(struct ts_reply *r, const struct ts_suspend *s)
{
	reply_reset_body(r);
	r->kind = TS_REPLY_SUSPEND;
	r->suspend = *s;
}

void ts_reply_buffers(struct ts_reply *r, enum ts_http_ok ok, const char *content_type,
                      const struct ts_parts *parts)
{
	reply_reset_body(r);
	r->kind = TS_REPLY_BUFFERS;
	r->ok = ok;
	r->content_type = content_type;
	r->parts = *parts;
}

void ts_reply_json(struct ts_reply *r, enum ts_http_ok ok, json_t *body)
{
	reply_reset_body(r);
	if (!body) {
		ts_reply_oom(r, "out of memory while building the response");
		return;
	}
	r->kind = TS_REPLY_JSON;
	r->ok = ok;
	r->json = body;
	r->content_type = "application/json";
}

void ts_reply_json_tagged(struct ts_reply *r, json_t *body)
{
	char *text = body ? json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	uint64_t h;
	char etag[24];

	ts_reply_json(r, TS_HTTP_OK, body);
	if (!text || r->kind != TS_REPLY_JSON) {
		free(text);
		return;
	}
	h = ts_fnv1a(TS_FNV1A_INIT, text, strlen(text));
	free(text);
	snprintf(etag, sizeof etag, "\"%016llx\"", (unsigned long long)h);
	ts_reply_header(r, "ETag", etag);
}

/* Whether the entity tag etag (quoted, maybe W/) is one of list, an
 * If-None-Match value ("*" or comma-separated tags), compared weakly as
 * RFC 9110 13.1.2 asks. */
static bool etag_listed(const char *list, const char *etag)
{
	size_t elen;

	if (strncmp(etag, "W/", 2) == 0)
		etag += 2;
	elen = strlen(etag);
	for (const char *p = list; *p;) {
		size_t len;

		p += strspn(p, " \t,");
		if (*p == '*')
			return true;
		if (strncmp(p, "W/", 2) == 0)
			p += 2;
		len = strcspn(p, " \t,");
		if (len == elen && len && memcmp(p, etag, len) == 0)
			return true;
		p += len;
	}
	return false;
}

bool ts_reply_not_modified(struct ts_reply *r, const char *if_none_match)
{
	const char *etag = NULL;
	char *empty;

	if (!if_none_match || r->kind == TS_REPLY_ERROR || r->kind == TS_REPLY_SUSPEND ||
	    r->kind == TS_REPLY_NONE || r->ok != TS_HTTP_OK)
		return false;
	for (int i = 0; i < r->nheaders && !etag; i++)
		if (strcasecmp(r->headers[i].name, "ETag") == 0)
			etag = r->headers[i].value;
	if (!etag || !etag_listed(if_none_match, etag) || !(empty = calloc(1, 1)))
		return false;
	/* the headers (ETag, Location) stay: RFC 9110 15.4.5 */
	ts_reply_text_owned(r, TS_HTTP_NOT_MODIFIED, r->content_type, empty, 0);
	return true;
}

void ts_reply_text_owned(struct ts_reply *r, enum ts_http_ok ok,
                         const char *content_type, char *text, size_t len)
{
	reply_reset_body(r);
	if (!text) {
		ts_reply_oom(r, "out of memory while building the response");
		return;
	}
	r->kind = TS_REPLY_TEXT;
	r->ok = ok;
	r->text = text;
	r->text_len = len;
	r->content_type = content_type;
}

void ts_reply_text(struct ts_reply *r, enum ts_http_ok ok,
                   const char *content_type, const char *text, size_t len)
{
	char *copy = malloc(len + 1);

	if (copy) {
		memcpy(copy, text, len);
		copy[len] = '\0';
	}
	ts_reply_text_owned(r, ok, content_type, copy, len);
}

void ts_reply_error(struct ts_reply *r, const struct ts_error *err)
{
	reply_reset_body(r);
	r->kind = TS_REPLY_ERROR;
	r->error = *err;
	if (r->error.status == TS_OK)
		r->error.status = TS_INTERNAL;
	r->content_type = "application/json";
}

ts_status ts_reply_fail(struct ts_reply *r, ts_status st, const char *reason,
                        const char *fmt, ...)
{
	struct ts_error e;
	va_list ap;

	ts_error_clear(&e);
	va_start(ap, fmt);
	ts_error_vset(&e, st, reason, NULL, fmt, ap);
	va_end(ap);
	ts_reply_error(r, &e);
	return st;
}

ts_status ts_reply_oom(struct ts_reply *r, const char *fmt, ...)
{
	struct ts_error e;
	va_list ap;
	ts_status st;

	ts_error_clear(&e);
	va_start(ap, fmt);
	st = ts_error_voom(&e, fmt, ap);
	va_end(ap);
	ts_reply_error(r, &e);
	return st;
}

void ts_reply_header(struct ts_reply *r, const char *name, const char *value)
{
	if (r->nheaders >= TS_REPLY_MAX_HEADERS)
		return;
	ts_str_copy(r->headers[r->nheaders].name, sizeof r->headers[0].name, name);
	ts_utf8_sanitize(r->headers[r->nheaders].value, sizeof r->headers[0].value, value);
	r->nheaders++;
}

/* Every text of an error is echoed as valid UTF-8, whatever cut or client
 * bytes it holds: rendering an error never fails on its text. */
json_t *ts_error_to_json(const struct ts_error *err, int http_code)
{
	json_t *meta = json_object(), *info, *root;

	for (int i = 0; meta && i < err->nmeta; i++)
		json_object_set_new(meta, err->meta[i].key, ts_json_text(err->meta[i].value));
	info = json_pack("{s:s, s:s, s:s, s:o}",
	                 "@type", "type.googleapis.com/google.rpc.ErrorInfo",
	                 "reason", err->reason[0] ? err->reason : ts_status_name(err->status),
	                 "domain", "tstage", "metadata", meta ? meta : json_object());
	root = json_pack("{s:{s:i, s:s, s:o, s:[o]}}", "error",
	                 "code", http_code ? http_code : ts_status_http(err->status),
	                 "status", ts_status_name(err->status),
	                 "message", ts_json_text(err->message),
	                 "details", info ? info : json_object());
	return root;
}
