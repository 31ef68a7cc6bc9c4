/*
 * http.c - the request pipeline on libmicrohttpd: match the route on the
 * first callback, authenticate, take the body as it streams in, run the
 * handler on the last callback, render its reply, and on completion log the
 * request and count it.
 *
 * Per-request state lives in *req_cls and is freed only in the completion
 * callback. Errors found before the body arrives are answered at once, so a
 * client sending Expect: 100-continue never sends a body that would be
 * refused.
 */
#include "server/server_int.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/units.h"
#include "server/http_tuning.h"
#include "server/router.h"

struct request {
	struct ts_server *srv;
	size_t route;                    /* ts_nroutes when unmatched */
	uint64_t start_ns;
	char id[72];
	char method[16];
	char path[256];                  /* truncated copy for the log */
	struct ts_route_match match;
	bool failed;                     /* reply already decided (error) */
	bool queued;                     /* a response is queued */
	struct ts_reply reply;
	void *upload;                    /* TS_BODY_STREAM state, released at completion */
	/* a suspended reply: see struct ts_suspend */
	struct MHD_Connection *conn;
	struct ts_suspend susp;
	bool suspended;                  /* waiting for wake or deadline */
	bool resuming;                   /* resumed: the next callback answers */
	_Atomic bool woken;              /* first of wake / deadline wins */
	bool timed_out;
	uint64_t deadline_ns;
	char *body;
	size_t body_len, body_cap;
	int http_code;
};

static const char *lookup(void *conn, int where, const char *key)
{
	enum MHD_ValueKind kind = where == TS_LOOKUP_QUERY ? MHD_GET_ARGUMENT_KIND
	                                                   : MHD_HEADER_KIND;

	return MHD_lookup_connection_value(conn, kind, key);
}

static bool valid_request_id(const char *s)
{
	size_t n = 0;

	if (!s)
		return false;
	for (; s[n]; n++) {
		char c = s[n];

		if (n >= 64 || !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
		                 (c >= 'A' && c <= 'Z') || c == '-' || c == '_' || c == '.'))
			return false;
	}
	return n > 0;
}

/* Constant-time comparison of the presented bearer token. */
static bool token_ok(const struct ts_server *srv, const char *auth)
{
	static const char prefix[] = "Bearer ";
	unsigned char diff = 0;
	size_t n;

	if (!auth || strncmp(auth, prefix, sizeof prefix - 1) != 0)
		return false;
	auth += sizeof prefix - 1;
	n = strlen(auth);
	diff = (unsigned char)(n != srv->token_len);
	for (size_t i = 0; i < srv->token_len; i++)
		diff |= (unsigned char)(srv->token[i] ^ (i < n ? auth[i] : 0));
	return diff == 0;
}

/* Hot-path string copies (request_new): no printf per request. */
static void copy_trunc(char *dst, size_t cap, const char *src)
{
	size_t n = strnlen(src, cap - 1);

	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* "<prefix>-<hex n>" into dst (cap >= sizeof prefix + 18). */
static void format_request_id(char *dst, size_t cap, const char *prefix, uint64_t n)
{
	char hex[16];
	size_t len = strnlen(prefix, cap - 18), k = 0;

	memcpy(dst, prefix, len);
	dst[len++] = '-';
	do {
		hex[k++] = "0123456789abcdef"[n & 15];
		n >>= 4;
	} while (n);
	while (k)
		dst[len++] = hex[--k];
	dst[len] = '\0';
}

static struct request *request_new(struct ts_server *srv,
                                   struct MHD_Connection *conn, const char *url,
                                   const char *method)
{
	struct request *rq = calloc(1, sizeof *rq);
	const char *given;

	if (!rq)
		return NULL;
	rq->srv = srv;
	rq->start_ns = ts_now_ns();
	rq->route = ts_nroutes;
	copy_trunc(rq->method, sizeof rq->method, method);
	copy_trunc(rq->path, sizeof rq->path, url);
	given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
	if (valid_request_id(given))
		copy_trunc(rq->id, sizeof rq->id, given);
	else
		format_request_id(rq->id, sizeof rq->id, srv->id_prefix,
		                  atomic_fetch_add(&srv->next_id, 1));
	return rq;
}

static void request_call(struct request *rq, struct MHD_Connection *conn,
                         struct ts_call *call)
{
	*call = (struct ts_call){
		.core = &rq->srv->core,
		.method = rq->method,
		.path = rq->path,
		.request_id = rq->id,
		.body = rq->body,
		.body_len = rq->body_len,
		.conn = conn,
		.lookup = lookup,
	};
	call->nparams = rq->match.nparams;
	for (int i = 0; i < rq->match.nparams; i++) {
		call->params[i].name = rq->match.params[i].name;
		call->params[i].value = rq->match.params[i].value;
	}
}

/* Starts a streamed upload: the route's begin decides admission. */
static void request_begin_upload(struct request *rq, struct MHD_Connection *conn,
                                 const char *len_s)
{
	const struct ts_route *route = &ts_routes[rq->route];
	uint64_t len = UINT64_MAX;
	struct ts_call call;
	char *end;

	if (len_s) {
		len = strtoull(len_s, &end, 10);
		if (*end || end == len_s)
			len = UINT64_MAX;
	}
	request_call(rq, conn, &call);
	rq->upload = route->upload->begin(&call, len, &rq->reply);
	if (!rq->upload) {
		rq->failed = true;
		if (rq->reply.kind == TS_REPLY_NONE)
			ts_reply_fail(&rq->reply, TS_INTERNAL, "NO_REPLY", "the upload was refused without a reason");
	}
}

/* Decides routing, auth and body admission on the first callback. */
static void request_admit(struct request *rq, struct MHD_Connection *conn,
                          const char *url, const char *method)
{
	struct ts_server *srv = rq->srv;
	const struct ts_route *route;
	const char *len_s;
	char allow[96];

	switch (ts_route_find(ts_routes, ts_nroutes, method, url, &rq->match)) {
	case TS_MATCH_NO_PATH:
		rq->failed = true;
		ts_reply_fail(&rq->reply, TS_NOT_FOUND, "ROUTE_NOT_FOUND",
		              "no resource at '%s'", rq->path);
		return;
	case TS_MATCH_BAD_METHOD:
		rq->failed = true;
		ts_reply_fail(&rq->reply, TS_UNIMPLEMENTED, "METHOD_NOT_ALLOWED",
		              "method %s is not allowed on '%s'; allowed: %s", rq->method,
		              rq->path, rq->match.allow);
		snprintf(allow, sizeof allow, "%s", rq->match.allow);
		ts_reply_header(&rq->reply, "Allow", allow);
		rq->http_code = 405;
		return;
	case TS_MATCH_FOUND:
		break;
	}
	rq->route = rq->match.index;
	route = &ts_routes[rq->route];
	if (srv->token_len && !route->public_route &&
	    !token_ok(srv, MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	                                               MHD_HTTP_HEADER_AUTHORIZATION))) {
		rq->failed = true;
		ts_reply_fail(&rq->reply, TS_UNAUTHENTICATED, "TOKEN_REQUIRED",
		              "a valid 'Authorization: Bearer <token>' header is required");
		ts_reply_header(&rq->reply, "WWW-Authenticate", "Bearer realm=\"tstage\"");
		return;
	}
	len_s = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	                                    MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (route->body == TS_BODY_JSON && len_s && strtoull(len_s, NULL, 10) > TS_JSON_BODY_MAX) {
		rq->failed = true;
		ts_reply_fail(&rq->reply, TS_INVALID_ARGUMENT, "BODY_TOO_LARGE",
		              "a JSON body may hold at most %u bytes; this one has %s",
		              TS_JSON_BODY_MAX, len_s);
		return;
	}
	if (route->body == TS_BODY_STREAM)
		request_begin_upload(rq, conn, len_s);
}

/* Takes one piece of the body. */
static void request_take_body(struct request *rq, const char *data, size_t n)
{
	const struct ts_route *route = rq->route < ts_nroutes ? &ts_routes[rq->route] : NULL;

	if (rq->failed || !route)
		return;        /* drained and dropped */
	if (route->body == TS_BODY_STREAM) {
		if (!route->upload->chunk(rq->upload, data, n, &rq->reply))
			rq->failed = true;
		return;
	}
	if (route->body != TS_BODY_JSON)
		return;
	if (rq->body_len + n > TS_JSON_BODY_MAX) {
		rq->failed = true;
		ts_reply_fail(&rq->reply, TS_INVALID_ARGUMENT, "BODY_TOO_LARGE",
		              "a JSON body may hold at most %u bytes", TS_JSON_BODY_MAX);
		return;
	}
	if (rq->body_len + n + 1 > rq->body_cap) {
		size_t cap = (rq->body_len + n + 1) * 2;
		char *grown = realloc(rq->body, cap < TS_JSON_BODY_MAX + 1 ? cap : TS_JSON_BODY_MAX + 1);

		if (!grown) {
			rq->failed = true;
			ts_reply_fail(&rq->reply, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
			              "no memory for the request body");
			return;
		}
		rq->body = grown;
		rq->body_cap = cap < TS_JSON_BODY_MAX + 1 ? cap : TS_JSON_BODY_MAX + 1;
	}
	memcpy(rq->body + rq->body_len, data, n);
	rq->body_len += n;
	rq->body[rq->body_len] = '\0';
}

static void request_dispatch(struct request *rq, struct MHD_Connection *conn)
{
	const struct ts_route *route = &ts_routes[rq->route];
	struct ts_call call;

	request_call(rq, conn, &call);
	if (route->upload)
		route->upload->finish(rq->upload, &call, &rq->reply);
	else if (route->fn)
		route->fn(&call, &rq->reply);
	else
		route->sfn(rq->srv, &call, &rq->reply);
	if (rq->reply.kind == TS_REPLY_NONE)
		ts_reply_fail(&rq->reply, TS_INTERNAL, "NO_REPLY", "the handler gave no answer");
}

static enum MHD_Result request_respond(struct request *rq, struct MHD_Connection *conn);

/*
 * Suspended requests. Each sits in srv->waits until it is woken (by the
 * thing it waits for) or its deadline passes (the deadline thread). The
 * winner of rq->woken resumes the connection; the deadline thread acts
 * under waits_mu, and a resumed request leaves the list under waits_mu
 * before it answers, so no thread touches a request after it is freed.
 */
struct ts__waiting {
	struct ts__waiting *next;
	struct request *rq;
};

static void wake_request(void *token)
{
	struct request *rq = token;
	bool expect = false;

	if (atomic_compare_exchange_strong(&rq->woken, &expect, true))
		MHD_resume_connection(rq->conn);
}

/* Times out rq: called with waits_mu held. */
static void expire_locked(struct request *rq)
{
	bool expect = false;

	if (!atomic_compare_exchange_strong(&rq->woken, &expect, true))
		return;                           /* woken meanwhile */
	rq->timed_out = true;
	rq->susp.disarm(rq->susp.state, wake_request, rq);
	MHD_resume_connection(rq->conn);
}

static void *waits_main(void *arg)
{
	struct ts_server *srv = arg;

	pthread_mutex_lock(&srv->waits_mu);
	while (!srv->waits_stop) {
		uint64_t now = ts_now_ns(), next = UINT64_MAX;
		struct ts__waiting **pp = &srv->waits;

		while (*pp) {
			struct ts__waiting *w = *pp;

			if (w->rq->deadline_ns <= now) {
				*pp = w->next;
				expire_locked(w->rq);
				free(w);
				continue;
			}
			if (w->rq->deadline_ns < next)
				next = w->rq->deadline_ns;
			pp = &w->next;
		}
		if (next == UINT64_MAX) {
			pthread_cond_wait(&srv->waits_cv, &srv->waits_mu);
		} else {
			struct timespec ts;
			uint64_t wall = ts_wall_ns() + (next - now);

			ts.tv_sec = (time_t)(wall / 1000000000ull);
			ts.tv_nsec = (long)(wall % 1000000000ull);
			pthread_cond_timedwait(&srv->waits_cv, &srv->waits_mu, &ts);
		}
	}
	pthread_mutex_unlock(&srv->waits_mu);
	return NULL;
}

/* Removes rq from the list (if still there). */
static void waits_remove(struct ts_server *srv, struct request *rq)
{
	pthread_mutex_lock(&srv->waits_mu);
	for (struct ts__waiting **pp = &srv->waits; *pp; pp = &(*pp)->next) {
		if ((*pp)->rq == rq) {
			struct ts__waiting *w = *pp;

			*pp = w->next;
			free(w);
			break;
		}
	}
	pthread_mutex_unlock(&srv->waits_mu);
}

void ts__http_wake_all(struct ts_server *srv)
{
	if (!srv->waits_started)
		return;
	pthread_mutex_lock(&srv->waits_mu);
	while (srv->waits) {
		struct ts__waiting *w = srv->waits;

		srv->waits = w->next;
		expire_locked(w->rq);
		free(w);
	}
	srv->waits_stop = true;
	pthread_cond_signal(&srv->waits_cv);
	pthread_mutex_unlock(&srv->waits_mu);
	pthread_join(srv->waits_thread, NULL);
	srv->waits_started = false;
}

/* Suspends the connection until the reply's condition is met or it times out. */
static enum MHD_Result request_suspend(struct request *rq, struct MHD_Connection *conn)
{
	struct ts_server *srv = rq->srv;
	struct ts__waiting *w = malloc(sizeof *w);

	if (!w) {
		ts_reply_fail(&rq->reply, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		              "no memory to wait");
		return request_respond(rq, conn);
	}
	rq->susp = rq->reply.suspend;
	memset(&rq->reply.suspend, 0, sizeof rq->reply.suspend);
	rq->reply.kind = TS_REPLY_NONE;
	rq->conn = conn;
	rq->suspended = true;
	rq->deadline_ns = ts_now_ns() + rq->susp.timeout_ns;
	MHD_suspend_connection(conn);
	w->rq = rq;
	pthread_mutex_lock(&srv->waits_mu);
	if (srv->waits_stop) {
		/* draining: answer at once */
		pthread_mutex_unlock(&srv->waits_mu);
		free(w);
		atomic_store(&rq->woken, true);
		rq->timed_out = true;
		MHD_resume_connection(conn);
		return MHD_YES;
	}
	w->next = srv->waits;
	srv->waits = w;
	pthread_cond_signal(&srv->waits_cv);
	pthread_mutex_unlock(&srv->waits_mu);
	if (!rq->susp.arm(rq->susp.state, wake_request, rq))
		wake_request(rq);
	return MHD_YES;
}

/* A resumed request: take it off the list, fill the real reply, answer. */
static enum MHD_Result request_resume(struct request *rq, struct MHD_Connection *conn)
{
	waits_remove(rq->srv, rq);
	rq->suspended = false;
	rq->susp.resume(rq->susp.state, rq->timed_out, &rq->reply);
	if (rq->reply.kind == TS_REPLY_NONE || rq->reply.kind == TS_REPLY_SUSPEND)
		ts_reply_fail(&rq->reply, TS_INTERNAL, "NO_REPLY", "the wait gave no answer");
	return request_respond(rq, conn);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct ts_stream *st = cls;
	long n = st->read(st->state, pos, buf, max);

	return n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR : (ssize_t)n;
}

static void stream_free(void *cls)
{
	struct ts_stream *st = cls;

	if (st->release)
		st->release(st->state);
	free(st);
}

static void reply_headers(struct request *rq, struct MHD_Response *resp)
{
	struct ts_reply *r = &rq->reply;

	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
	                        r->content_type ? r->content_type : "application/json");
	MHD_add_response_header(resp, "X-Request-Id", rq->id);
	for (int i = 0; i < r->nheaders; i++)
		MHD_add_response_header(resp, r->headers[i].name, r->headers[i].value);
}

/* libmicrohttpd callocs a stream's whole block with the response: a
 * small stream gets a block of its own size, not TS_HTTP_STREAM_BLOCK. */
static size_t stream_block(uint64_t size)
{
	if (size < 4096)
		return 4096;
	return size < TS_HTTP_STREAM_BLOCK ? (size_t)size : TS_HTTP_STREAM_BLOCK;
}

/* Streams and in-place buffers: ownership passes to the MHD response. */
static enum MHD_Result request_respond_body(struct request *rq, struct MHD_Connection *conn)
{
	struct ts_reply *r = &rq->reply;
	struct MHD_Response *resp = NULL;
	enum MHD_Result ret;

	if (r->kind == TS_REPLY_STREAM) {
		struct ts_stream *st = malloc(sizeof *st);

		if (st) {
			*st = r->stream;
			resp = MHD_create_response_from_callback(st->size, stream_block(st->size),
			                                         stream_read, st, stream_free);
			if (!resp)
				free(st);
		}
		if (resp)
			memset(&r->stream, 0, sizeof r->stream);   /* the response owns it */
	} else {
		struct MHD_IoVec iov[TS_REPLY_MAX_PARTS];

		for (int i = 0; i < r->parts.n; i++) {
			iov[i].iov_base = r->parts.part[i].base;
			iov[i].iov_len = r->parts.part[i].len;
		}
		resp = MHD_create_response_from_iovec(iov, (unsigned int)r->parts.n,
		                                      r->parts.release, r->parts.cls);
		if (resp)
			memset(&r->parts, 0, sizeof r->parts);
	}
	if (!resp) {
		ts_reply_fail(r, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
		              "out of memory while starting the response");
		return request_respond(rq, conn);
	}
	rq->http_code = (int)r->ok;
	reply_headers(rq, resp);
	ret = MHD_queue_response(conn, (unsigned int)rq->http_code, resp);
	MHD_destroy_response(resp);
	rq->queued = ret == MHD_YES;
	return ret;
}

static const char fallback_error[] =
	"{\"error\":{\"code\":500,\"status\":\"INTERNAL\",\"message\":\"cannot render the response\"}}";

static enum MHD_Result request_respond_body(struct request *rq, struct MHD_Connection *conn);

/* Renders rq->reply into an MHD response and queues it. */
static enum MHD_Result request_respond(struct request *rq, struct MHD_Connection *conn)
{
	struct ts_reply *r = &rq->reply;
	struct MHD_Response *resp = NULL;
	char *text = NULL;
	size_t len = 0;
	enum MHD_Result ret;

	if (r->kind == TS_REPLY_ERROR) {
		json_t *j = ts_error_to_json(&r->error, rq->http_code);

		text = j ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
		if (!rq->http_code)
			rq->http_code = ts_status_http(r->error.status);
		if (r->error.status != TS_INTERNAL && r->error.status != TS_UNKNOWN)
			; /* client-side outcomes are logged at info by the completion */
		else
			ts_log(TS_LOG_ERROR, NULL, "request %s %s failed: %s", rq->method, rq->path,
			       r->error.message);
	} else if (r->kind == TS_REPLY_JSON) {
		text = json_dumps(r->json, JSON_COMPACT);
		rq->http_code = (int)r->ok;
	} else if (r->kind == TS_REPLY_STREAM || r->kind == TS_REPLY_BUFFERS) {
		return request_respond_body(rq, conn);
	} else if (r->kind == TS_REPLY_SUSPEND) {
		return request_suspend(rq, conn);
	} else {
		text = r->text;
		len = r->text_len;
		r->text = NULL;
		rq->http_code = (int)r->ok;
	}
	if (text && r->kind != TS_REPLY_TEXT) {
		len = strlen(text);
		if (len + 1 < 64 * 1024) {      /* small JSON: add a newline for curl users */
			char *nl = realloc(text, len + 2);

			if (nl) {
				text = nl;
				text[len++] = '\n';
				text[len] = '\0';
			}
		}
	}
	if (text)
		resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(text);
		rq->http_code = 500;
		resp = MHD_create_response_from_buffer(sizeof fallback_error - 1,
		                                       (void *)fallback_error,
		                                       MHD_RESPMEM_PERSISTENT);
		if (!resp)
			return MHD_NO;
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
		MHD_add_response_header(resp, "X-Request-Id", rq->id);
	} else {
		reply_headers(rq, resp);
	}
	ret = MHD_queue_response(conn, (unsigned int)rq->http_code, resp);
	MHD_destroy_response(resp);
	rq->queued = ret == MHD_YES;
	return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
	struct ts_server *srv = cls;
	struct request *rq = *req_cls;

	(void)version;
	if (!rq) {
		rq = request_new(srv, conn, url, method);
		if (!rq)
			return MHD_NO;
		*req_cls = rq;
		atomic_fetch_add(&srv->inflight, 1);
		request_admit(rq, conn, url, method);
		if (rq->failed)
			return request_respond(rq, conn);
		return MHD_YES;
	}
	if (*upload_data_size) {
		bool was_failed = rq->failed;

		request_take_body(rq, upload_data, *upload_data_size);
		*upload_data_size = 0;
		/* a body found bad midway: try to answer now; libmicrohttpd 0.9.75
		 * refuses a response before the body is read, so then the rest is
		 * drained (not used) and the answer goes out at the end */
		if (rq->failed && !was_failed && !rq->queued)
			(void)request_respond(rq, conn);   /* else drained, answered at the end */
		return MHD_YES;
	}
	if (rq->queued)
		return MHD_YES;
	if (rq->suspended)
		return request_resume(rq, conn);
	if (!rq->failed)
		request_dispatch(rq, conn);
	return request_respond(rq, conn);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
	struct ts_server *srv = cls;
	struct request *rq = *req_cls;
	uint64_t dur;

	(void)conn;
	if (!rq)
		return;
	dur = ts_now_ns() - rq->start_ns;
	if (!rq->http_code)
		rq->http_code = 499;     /* the client went away before an answer */
	ts_metrics_record(srv->metrics, rq->route, rq->http_code, dur);
	if (ts_log_enabled(TS_LOG_INFO)) {
		char fields[640], path[300];

		snprintf(fields, sizeof fields,
		         "\"request_id\":\"%s\",\"method\":\"%s\",\"path\":\"%s\",\"status\":%d,"
		         "\"duration_ms\":%.3f,\"completed\":%s",
		         rq->id, rq->method, ts_json_escape(path, sizeof path, rq->path),
		         rq->http_code, (double)dur / 1e6,
		         toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "true" : "false");
		ts_log(TS_LOG_INFO, fields, "request");
	}
	if (rq->suspended)       /* the client left while waiting */
		waits_remove(srv, rq);
	if (rq->susp.release) {
		if (!atomic_exchange(&rq->woken, true))
			rq->susp.disarm(rq->susp.state, wake_request, rq);
		rq->susp.release(rq->susp.state);
	}
	if (rq->upload)
		ts_routes[rq->route].upload->release(rq->upload);
	ts_reply_release(&rq->reply);
	free(rq->body);
	free(rq);
	*req_cls = NULL;
	atomic_fetch_sub(&srv->inflight, 1);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];

	(void)cls;
	vsnprintf(msg, sizeof msg, fmt, ap);
	msg[strcspn(msg, "\n")] = '\0';
	ts_log(TS_LOG_WARN, "\"component\":\"libmicrohttpd\"", "%s", msg);
}

ts_status ts__http_start(struct ts_server *srv, struct ts_error *err)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
	/* flags and option values: server/http_tuning.h */
	unsigned int flags = TS_HTTP_MHD_FLAGS;
	const union MHD_DaemonInfo *info;
	int threads = srv->cfg.threads;

	memset(&ss, 0, sizeof ss);
	if (inet_pton(AF_INET, srv->cfg.bind, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)srv->cfg.port);
	} else if (inet_pton(AF_INET6, srv->cfg.bind, &v6->sin6_addr) == 1) {
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)srv->cfg.port);
		flags |= MHD_USE_IPv6;
	} else {
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BIND",
		                    "--bind '%s' is not an IPv4 or IPv6 address", srv->cfg.bind);
	}
	if (threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		threads = n > 0 ? (int)n : 1;
	}
	/* the deadline thread and its lock exist before any worker can suspend */
	pthread_mutex_init(&srv->waits_mu, NULL);
	pthread_cond_init(&srv->waits_cv, NULL);
	if (pthread_create(&srv->waits_thread, NULL, waits_main, srv) != 0)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "THREAD", "cannot start the wait thread");
	srv->waits_started = true;
	srv->daemon = MHD_start_daemon(
		flags, 0, NULL, NULL, on_request, srv,
		MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
		MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
		MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)threads,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, TS_HTTP_CONN_MEMORY,
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)300,
		MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
		MHD_OPTION_END);
	if (!srv->daemon)
		return ts_error_set(err, TS_UNAVAILABLE, "LISTEN_FAILED",
		                    "cannot listen on %s port %d (in use, or not allowed)",
		                    srv->cfg.bind, srv->cfg.port);
	info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
	srv->port = info ? (int)info->port : srv->cfg.port;
	return TS_OK;
}
