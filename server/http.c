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
 *
 * Connections are limited above the library (server/accept.c counts each
 * one from its accept, in all and by client address, and answers one past
 * --max-connections or --max-connections-per-ip 503 with Retry-After at
 * once, whether or not it has sent a request); a daemon's start notice
 * counts a connection again, and answers it 503 here should the count have
 * moved past a limit since the acceptor handed it over. An upload
 * holding a memory reservation must keep sending (--body-idle-timeout) and
 * average --body-min-rate, or its connection is cut and the reservation
 * freed. Framing that could smuggle a request is refused (two different
 * Content-Length values) or closes the connection after the answer
 * (Content-Length with Transfer-Encoding, RFC 9112 section 6.1).
 */
#include "server/server_int.h"

#include <arpa/inet.h>
#include <assert.h>
#include <pthread.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/units.h"
#include "common/utf8.h"
#include "server/auth.h"
#include "server/http_tuning.h"
#include "server/router.h"
#include "server/server_routes.h"

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
	bool close;                      /* answer with Connection: close */
	bool chunked;                    /* Transfer-Encoding: the length is unknown */
	bool reserving;                  /* a streamed upload admitted: rate rules apply */
	bool cut;                        /* too slow: the connection is dropped */
	uint64_t body_start_ns;
	uint64_t body_got;
	/* for the request's log line */
	uint64_t bytes_in;               /* body bytes received */
	uint64_t bytes_out;              /* response body bytes queued */
	char user_agent[128];            /* truncated */
	char traceparent[56];            /* a valid W3C traceparent, or "" */
	/* last: a connection's next request clears only what is above it, the
	 * reply having been reset when the last one completed */
	struct ts_reply reply;
};

/* Per-connection state (MHD's socket context), from open to close. */
struct conn_ctx {
	unsigned char addr[16];          /* the client's, IPv4 mapped into IPv6 */
	bool refused;                    /* answered 503 at accept; not counted */
	bool local;                      /* on the Unix socket: no limit per address */
	bool bulk;                       /* the bulk daemon's (TS_HTTP_CONN_MEMORY_BULK) */
};

/*
 * The last completed request's memory, kept by the thread that ran it for
 * its next request on any of its connections: a request is some kilobytes,
 * and allocating and freeing it per request costs more than clearing it.
 * One per thread rather than per connection, so that at many connections
 * the request a loop clears is still in its cache. A thread's spare is freed
 * when the thread exits (the key's destructor). Debug builds (TS_DEBUG,
 * every sanitizer build) keep none, so that a stale request pointer still
 * faults there.
 */
#ifndef TS_DEBUG
#define TS_DEBUG 0
#endif

static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static bool spare_ok;

static void spare_key_make(void)
{
	spare_ok = pthread_key_create(&spare_key, free) == 0;
}

static struct request *spare_take(void)
{
	struct request *rq;

	if (TS_DEBUG || !spare_ok)
		return NULL;
	rq = pthread_getspecific(spare_key);
	if (rq)
		pthread_setspecific(spare_key, NULL);
	return rq;
}

static void spare_put(struct request *rq)
{
	if (TS_DEBUG || !spare_ok || pthread_getspecific(spare_key) ||
	    pthread_setspecific(spare_key, rq) != 0)
		free(rq);
}

static struct conn_ctx *conn_ctx_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* Whether the connection came through --unix-socket (whose file's mode and
 * group are the permission). */
static bool on_unix_socket(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

	return ci && ci->client_addr && ci->client_addr->sa_family == AF_UNIX;
}

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

static bool all_hex(const char *s, size_t n, bool *all_zero)
{
	*all_zero = true;
	for (size_t i = 0; i < n; i++) {
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		if (s[i] != '0')
			*all_zero = false;
	}
	return true;
}

/*
 * Whether s is a W3C Trace Context traceparent: version "-" trace-id "-"
 * parent-id "-" flags, lower-case hex of 2, 32, 16 and 2 digits; version ff,
 * an all-zero trace-id or parent-id are invalid. Version 00 is exactly 55
 * characters; a later version may go on after a '-' (only the first 55
 * are read).
 */
static bool valid_traceparent(const char *s)
{
	bool zero;
	size_t n = s ? strnlen(s, 56) : 0;

	if (n < 55 || s[2] != '-' || s[35] != '-' || s[52] != '-')
		return false;
	if (!all_hex(s, 2, &zero) || strncmp(s, "ff", 2) == 0 || !all_hex(s + 53, 2, &zero))
		return false;
	if (!all_hex(s + 3, 32, &zero) || zero || !all_hex(s + 36, 16, &zero) || zero)
		return false;
	if (strncmp(s, "00", 2) == 0)
		return n == 55;
	return n == 55 || s[55] == '-';
}

/* The peer's address as text ("127.0.0.1", "::1", "unix" through
 * --unix-socket), "" when unknown. */
static void client_text(struct MHD_Connection *conn, char *buf, size_t cap)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;

	buf[0] = '\0';
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)cap);
	else if (sa && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)cap);
	else if (sa && sa->sa_family == AF_UNIX)
		snprintf(buf, cap, "unix");
}

/* Whether the request presents the token (auth.h); err and *fault say
 * what was wrong when not. */
static bool token_ok(const struct ts_server *srv, struct MHD_Connection *conn,
                     enum ts_auth_fault *fault, struct ts_error *err)
{
	const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
	                                               MHD_HTTP_HEADER_AUTHORIZATION);

	return ts_auth_check(auth, srv->token, srv->token_len, fault, err) == TS_OK;
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
	struct request *rq = spare_take();
	const char *given;

	if (rq) {
		memset(rq, 0, offsetof(struct request, reply));
	} else if (!(rq = calloc(1, sizeof *rq))) {
		return NULL;
	}
	rq->srv = srv;
	rq->start_ns = ts_now_ns();
	rq->route = ts_nroutes;
	ts_str_copy(rq->method, sizeof rq->method, method);
	ts_str_copy(rq->path, sizeof rq->path, url);
	given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
	if (valid_request_id(given))
		ts_str_copy(rq->id, sizeof rq->id, given);
	else
		format_request_id(rq->id, sizeof rq->id, srv->id_prefix,
		                  atomic_fetch_add(&srv->next_id, 1));
	/* an invalid traceparent is ignored, as Trace Context asks */
	given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "traceparent");
	if (valid_traceparent(given))
		ts_str_copy(rq->traceparent, sizeof rq->traceparent, given);
	given = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_USER_AGENT);
	if (given)
		ts_str_copy(rq->user_agent, sizeof rq->user_agent, given);
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
	if (rq->upload) {
		/* admitted: the body now holds memory, so it may not stall */
		rq->reserving = true;
		rq->body_start_ns = ts_now_ns();
		MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
		                          (unsigned int)rq->srv->cfg.body_idle_timeout);
	}
	if (!rq->upload) {
		rq->failed = true;
		if (rq->reply.kind == TS_REPLY_NONE)
			ts_reply_fail(&rq->reply, TS_INTERNAL, "NO_REPLY", "the upload was refused without a reason");
	}
}

/* libmicrohttpd's unescaper for the path and every query key and value:
 * ts_url_unescape keeps a %00 visible (see router.h). */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s)
{
	(void)cls;
	(void)conn;
	return ts_url_unescape(s);
}

/* Refuses a path that is not UTF-8 or holds a NUL (before routing, so that
 * no reply echoes it). */
static bool request_path_ok(struct request *rq, const char *url)
{
	size_t at = 0;

	switch (ts_utf8_check(url, strlen(url), &at)) {
	case TS_UTF8_OK:
		return true;
	case TS_UTF8_NUL:
		ts_reply_fail(&rq->reply, TS_INVALID_ARGUMENT, "BAD_ENCODING",
		              "the path holds a NUL byte (%%00) at byte %zu", at);
		return false;
	default:
		ts_reply_fail(&rq->reply, TS_INVALID_ARGUMENT, "BAD_ENCODING",
		              "the path is not valid UTF-8 (byte 0x%02x at offset %zu)",
		              (unsigned char)url[at], at);
		return false;
	}
}

struct arg_walk {
	const struct ts_route *route;
	uint32_t seen;
	struct ts_error err;
};

static enum MHD_Result query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                 size_t key_size, const char *value, size_t value_size)
{
	struct arg_walk *w = cls;

	(void)kind;
	return ts_query_arg_check(w->route, key ? key : "", key ? key_size : 0, value, value_size,
	                          &w->seen, &w->err) == TS_OK ? MHD_YES : MHD_NO;
}

static enum MHD_Result header_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                  size_t key_size, const char *value, size_t value_size)
{
	struct arg_walk *w = cls;
	size_t at = 0;

	(void)kind;
	(void)key_size;
	if (!value || ts_utf8_check(value, value_size, &at) == TS_UTF8_OK)
		return MHD_YES;
	ts_error_set(&w->err, TS_INVALID_ARGUMENT, "BAD_ENCODING",
	             "header '%.64s' is not valid UTF-8 (byte 0x%02x at offset %zu)",
	             key ? key : "", (unsigned char)value[at], at);
	return MHD_NO;
}

/* Refuses query arguments the route does not take, repeated ones, and any
 * query or header text that is not UTF-8 or holds a NUL: nothing the
 * handler can read is unchecked. */
static bool request_args_ok(struct request *rq, struct MHD_Connection *conn)
{
	struct arg_walk w = {.route = &ts_routes[rq->route]};

	ts_error_clear(&w.err);
	MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, query_arg, &w);
	if (w.err.status == TS_OK)
		MHD_get_connection_values_n(conn, MHD_HEADER_KIND, header_arg, &w);
	if (w.err.status == TS_OK)
		return true;
	ts_reply_error(&rq->reply, &w.err);
	return false;
}

struct framing {
	const char *length;              /* the first Content-Length */
	bool conflict;                   /* another with a different value */
	bool chunked;                    /* Transfer-Encoding present */
};

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
	struct framing *f = cls;

	(void)kind;
	if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
		if (!f->length)
			f->length = value;
		else if (strcmp(f->length, value) != 0)
			f->conflict = true;
	} else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
		f->chunked = true;
	}
	return MHD_YES;
}

/* Refuses framing a proxy could read otherwise (RFC 9112 section 6):
 * false when rq is answered. */
static bool request_framing(struct request *rq, struct MHD_Connection *conn)
{
	struct framing f = {0};

	MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_header, &f);
	if (f.conflict) {
		rq->failed = true;
		rq->close = true;
		ts_reply_fail(&rq->reply, TS_INVALID_ARGUMENT, "CONFLICTING_CONTENT_LENGTH",
		              "the request has two different Content-Length headers");
		return false;
	}
	rq->chunked = f.chunked;  /* Transfer-Encoding overrides Content-Length */
	if (f.length && f.chunked)
		rq->close = true;     /* answered, then the connection is closed */
	return true;
}

struct head_walk {
	size_t bytes;                    /* of the head, about as sent (unescaped: no more) */
	size_t fields;                   /* headers, query parameters and cookies */
};

static enum MHD_Result head_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                  size_t key_size, const char *value, size_t value_size)
{
	struct head_walk *w = cls;

	(void)key;
	w->fields++;
	if (kind == MHD_HEADER_KIND)          /* "Name: value\r\n" */
		w->bytes += key_size + value_size + 4;
	else if (kind == MHD_GET_ARGUMENT_KIND)   /* "key=value&" (unescaped: no longer) */
		w->bytes += key_size + (value ? value_size + 1 : 0) + 1;
	return MHD_YES;                       /* a cookie's bytes are its header's */
}

/*
 * Refuses a head past the limits the acceptor holds a connection's first
 * head to (head.c: TS_HTTP_HEAD_MAX bytes, TS_HTTP_HEAD_FIELDS_MAX fields)
 * when a later request on a bulk connection brings one: that connection's
 * memory holds heads of about 60 KiB and 890 fields, which the library
 * serves. (A small-request connection holds about 7.5 KiB and 110 fields,
 * within the limits; what no connection holds the library refuses itself,
 * in HTML: docs/API.md, Limits of a request head.) 431 in JSON, then the
 * connection closes, as the acceptor's answer does. false when rq is
 * answered.
 */
static bool request_head_ok(struct request *rq, struct MHD_Connection *conn, const char *url,
                            const char *method)
{
	const struct conn_ctx *cc = conn_ctx_of(conn);
	struct head_walk w = {.bytes = strlen(method) + strlen(url) + sizeof " ? HTTP/1.1\r\n\r\n"};
	struct ts_error err;

	if (!cc || !cc->bulk)
		return true;
	MHD_get_connection_values_n(conn, MHD_HEADER_KIND | MHD_GET_ARGUMENT_KIND | MHD_COOKIE_KIND,
	                            head_field, &w);
	if (w.bytes <= TS_HTTP_HEAD_MAX && w.fields <= TS_HTTP_HEAD_FIELDS_MAX)
		return true;
	ts_error_clear(&err);
	if (w.bytes > TS_HTTP_HEAD_MAX)
		ts_error_set(&err, TS_INVALID_ARGUMENT, "REQUEST_HEAD_TOO_LARGE",
		             "the request head (request line and headers) is longer than %zu bytes "
		             "(about %zu)", (size_t)TS_HTTP_HEAD_MAX, w.bytes);
	else
		ts_error_set(&err, TS_INVALID_ARGUMENT, "REQUEST_HEAD_TOO_LARGE",
		             "the request head holds more than %zu fields (headers, query parameters "
		             "and cookies; %zu)", (size_t)TS_HTTP_HEAD_FIELDS_MAX, w.fields);
	ts_error_meta_u64(&err, "limit_bytes", TS_HTTP_HEAD_MAX);
	ts_error_meta_u64(&err, "limit_fields", TS_HTTP_HEAD_FIELDS_MAX);
	ts_reply_error(&rq->reply, &err);
	rq->http_code = 431;
	rq->close = true;
	return false;
}

/* New /v1 work is refused while draining. */
static bool request_draining(struct request *rq, const struct ts_route *route)
{
	if (!atomic_load(&rq->srv->draining) || strncmp(route->pattern, "/v1", 3) != 0)
		return false;
	rq->failed = true;
	rq->close = true;
	ts_reply_fail(&rq->reply, TS_UNAVAILABLE, "DRAINING",
	              "tstaged is shutting down and takes no new work; retry on another instance");
	ts_reply_header(&rq->reply, "Retry-After", "1");
	return true;
}

/* Whether url is the path of a public route (one that asks no token,
 * whatever the method). */
static bool public_path(const char *url)
{
	for (size_t i = 0; i < ts_nroutes; i++)
		if (ts_routes[i].public_route && strcmp(ts_routes[i].pattern, url) == 0)
			return true;
	return false;
}

/* Decides auth, routing and body admission on the first callback. */
static void request_admit(struct request *rq, struct MHD_Connection *conn,
                          const char *url, const char *method)
{
	struct ts_server *srv = rq->srv;
	const struct ts_route *route;
	enum ts_match found;
	enum ts_auth_fault fault = TS_AUTH_MISSING;
	struct ts_error err;
	const char *len_s;
	char allow[96];

	rq->failed = true;             /* until admitted */
	if (!request_head_ok(rq, conn, url, method) || !request_framing(rq, conn) ||
	    !request_path_ok(rq, url))
		return;
	found = ts_router_find(rq->srv->router, method, url, &rq->match);
	/* authenticated before routing: without the token, a path says nothing
	 * of what exists there or which methods it takes */
	ts_error_clear(&err);
	if (srv->token_len && !on_unix_socket(conn) &&
	    !(found == TS_MATCH_FOUND ? ts_routes[rq->match.index].public_route : public_path(url)) &&
	    !token_ok(srv, conn, &fault, &err)) {
		ts_reply_error(&rq->reply, &err);
		/* a browser asks for the token (as the password) on the page;
		 * a wrong Bearer token is "invalid_token" (RFC 6750) */
		ts_reply_header(&rq->reply, "WWW-Authenticate",
		                found == TS_MATCH_FOUND && ts_routes[rq->match.index].sfn == ts_s_dashboard
		                        ? "Basic realm=\"tstage\", charset=\"UTF-8\""
		                : fault == TS_AUTH_WRONG
		                        ? "Bearer realm=\"tstage\", error=\"invalid_token\""
		                        : "Bearer realm=\"tstage\"");
		return;
	}
	switch (found) {
	case TS_MATCH_NO_PATH:
		ts_reply_fail(&rq->reply, TS_NOT_FOUND, "ROUTE_NOT_FOUND",
		              "no resource at '%s'", rq->path);
		return;
	case TS_MATCH_BAD_METHOD:
		/* 405 has no canonical code of its own: the request is invalid
		 * for this resource (UNIMPLEMENTED would claim 501) */
		ts_reply_fail(&rq->reply, TS_INVALID_ARGUMENT, "METHOD_NOT_ALLOWED",
		              "method %s is not allowed on '%s'; allowed: %s", rq->method,
		              rq->path, rq->match.allow);
		snprintf(allow, sizeof allow, "%s", rq->match.allow);
		ts_reply_header(&rq->reply, "Allow", allow);
		rq->http_code = 405;
		return;
	case TS_MATCH_FOUND:
		break;
	}
	for (int i = 0; i < rq->match.nparams; i++) {
		const struct ts_param_rule *rule = ts_param_rule_find(rq->match.params[i].name);

		if (rq->match.params[i].len > rule->max) {
			ts_reply_fail(&rq->reply, TS_INVALID_ARGUMENT, rule->reason,
			              "%s '%.40s...' is %zu bytes long, longer than the %zu a %s may hold",
			              rule->what, rq->match.params[i].value, rq->match.params[i].len,
			              rule->max, rule->what);
			return;
		}
	}
	rq->route = rq->match.index;
	route = &ts_routes[rq->route];
	if (request_draining(rq, route))
		return;
	if (!request_args_ok(rq, conn))
		return;
	rq->failed = false;
	len_s = rq->chunked ? NULL : MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
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

/* Counts n more body bytes of a reserving upload; true (and rq->cut) when
 * it has averaged less than --body-min-rate past its grace period. */
static bool request_too_slow(struct request *rq, size_t n)
{
	const struct ts_config *cfg = &rq->srv->cfg;
	uint64_t elapsed = ts_now_ns() - rq->body_start_ns;
	uint64_t grace = (uint64_t)cfg->body_idle_timeout * 1000000000ull;
	char fields[160];

	rq->body_got += n;
	if (!cfg->body_min_rate || elapsed <= grace ||
	    (double)rq->body_got * 1e9 >= (double)cfg->body_min_rate * (double)elapsed)
		return false;
	rq->cut = true;
	snprintf(fields, sizeof fields, "\"request_id\":\"%s\",\"bytes\":%llu,\"seconds\":%.1f",
	         rq->id, (unsigned long long)rq->body_got, (double)elapsed / 1e9);
	ts_log(TS_LOG_WARN, fields, "upload slower than --body-min-rate; connection closed");
	return true;
}

/* Takes one piece of the body. */
static void request_take_body(struct request *rq, const char *data, size_t n)
{
	const struct ts_route *route = rq->route < ts_nroutes ? &ts_routes[rq->route] : NULL;

	if (rq->failed || !route)
		return;        /* drained and dropped */
	if (rq->reserving && request_too_slow(rq, n))
		return;
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
			ts_reply_oom(&rq->reply, "no memory for the request body");
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
	else if (ts_fleet_forward(rq->srv, route, &call, &rq->reply))
		;      /* another node's: answered by it */
	else if (route->fn)
		route->fn(&call, &rq->reply);
	else
		route->sfn(rq->srv, &call, &rq->reply);
	if (rq->reply.kind == TS_REPLY_NONE)
		ts_reply_fail(&rq->reply, TS_INTERNAL, "NO_REPLY", "the handler gave no answer");
	if (strcmp(route->method, "GET") == 0)      /* GET and HEAD: conditional */
		ts_reply_not_modified(&rq->reply, ts_call_header(&call, "If-None-Match"));
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

	assert(ts_mutex_held(&rq->srv->waits_mu));
	if (!atomic_compare_exchange_strong(&rq->woken, &expect, true))
		return;                           /* woken meanwhile */
	rq->timed_out = true;
	rq->susp.disarm(rq->susp.state, wake_request, rq);
	MHD_resume_connection(rq->conn);
}

static void *waits_main(void *arg)
{
	struct ts_server *srv = arg;

	ts_mutex_lock(&srv->waits_mu);
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
		srv->waits_until_ns = next;
		if (next == UINT64_MAX) {
			ts_mutex_wait(&srv->waits_mu, &srv->waits_cv, NULL);
		} else {
			struct timespec ts;
			uint64_t wall = ts_wall_ns() + (next - now);

			ts.tv_sec = (time_t)(wall / 1000000000ull);
			ts.tv_nsec = (long)(wall % 1000000000ull);
			ts_mutex_wait(&srv->waits_mu, &srv->waits_cv, &ts);
		}
	}
	ts_mutex_unlock(&srv->waits_mu);
	return NULL;
}

/* Removes rq from the list (if still there). */
static void waits_remove(struct ts_server *srv, struct request *rq)
{
	ts_mutex_lock(&srv->waits_mu);
	for (struct ts__waiting **pp = &srv->waits; *pp; pp = &(*pp)->next) {
		if ((*pp)->rq == rq) {
			struct ts__waiting *w = *pp;

			*pp = w->next;
			free(w);
			break;
		}
	}
	ts_mutex_unlock(&srv->waits_mu);
}

void ts__http_wake_all(struct ts_server *srv)
{
	if (!srv->waits_started)
		return;
	ts_mutex_lock(&srv->waits_mu);
	while (srv->waits) {
		struct ts__waiting *w = srv->waits;

		srv->waits = w->next;
		expire_locked(w->rq);
		free(w);
	}
	srv->waits_stop = true;
	pthread_cond_signal(&srv->waits_cv);
	ts_mutex_unlock(&srv->waits_mu);
	pthread_join(srv->waits_thread, NULL);
	srv->waits_started = false;
}

/* Suspends the connection until the reply's condition is met or it times out. */
static enum MHD_Result request_suspend(struct request *rq, struct MHD_Connection *conn)
{
	struct ts_server *srv = rq->srv;
	struct ts__waiting *w = malloc(sizeof *w);

	if (!w) {
		ts_reply_oom(&rq->reply, "no memory to wait");
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
	ts_mutex_lock(&srv->waits_mu);
	if (srv->waits_stop) {
		/* draining: answer at once */
		ts_mutex_unlock(&srv->waits_mu);
		free(w);
		atomic_store(&rq->woken, true);
		rq->timed_out = true;
		MHD_resume_connection(conn);
		return MHD_YES;
	}
	w->next = srv->waits;
	srv->waits = w;
	/* armed under waits_mu: the deadline thread cannot expire (and so
	 * answer and free) rq before its waiter is registered, and a wake
	 * that comes at once resumes a request that is already listed */
	if (!rq->susp.arm(rq->susp.state, wake_request, rq))
		wake_request(rq);
	/* the deadline thread is woken only when this deadline comes before
	 * the time it sleeps until: most waits end long before their deadline,
	 * and a wake of that thread for each would cost each a context switch
	 * on the path of its answer */
	if (rq->deadline_ns < srv->waits_until_ns) {
		srv->waits_until_ns = rq->deadline_ns;
		pthread_cond_signal(&srv->waits_cv);
	}
	ts_mutex_unlock(&srv->waits_mu);
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
	if (rq->close || atomic_load(&rq->srv->draining))
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
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
			else
				rq->bytes_out = st->size;
		}
		if (resp)
			memset(&r->stream, 0, sizeof r->stream);   /* the response owns it */
	} else {
		struct MHD_IoVec iov[TS_REPLY_MAX_PARTS];

		rq->bytes_out = 0;
		for (int i = 0; i < r->parts.n; i++) {
			iov[i].iov_base = r->parts.part[i].base;
			iov[i].iov_len = r->parts.part[i].len;
			rq->bytes_out += r->parts.part[i].len;
		}
		resp = MHD_create_response_from_iovec(iov, (unsigned int)r->parts.n,
		                                      r->parts.release, r->parts.cls);
		if (resp)
			memset(&r->parts, 0, sizeof r->parts);
	}
	if (!resp) {
		ts_reply_oom(r, "out of memory while starting the response");
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
	rq->bytes_out = len;
	if (!resp) {
		free(text);
		rq->http_code = 500;
		rq->bytes_out = sizeof fallback_error - 1;
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
		const struct conn_ctx *cc = conn_ctx_of(conn);

		if (cc && cc->refused)
			return MHD_NO;          /* answered 503 at accept */
		rq = request_new(srv, conn, url, method);
		if (!rq) {
			ts_log(TS_LOG_ERROR, NULL, "no memory for a request; connection closed");
			return MHD_NO;
		}
		*req_cls = rq;
		ts_metrics_request_started(srv->metrics);
		request_admit(rq, conn, url, method);
		if (rq->failed)
			return request_respond(rq, conn);
		return MHD_YES;
	}
	if (*upload_data_size) {
		bool was_failed = rq->failed;

		rq->bytes_in += *upload_data_size;
		request_take_body(rq, upload_data, *upload_data_size);
		*upload_data_size = 0;
		if (rq->cut)
			return MHD_NO;          /* closes the connection; completion frees */
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

/*
 * The request's line: id, method, path, status, time, the client's address
 * and user agent, body bytes in and out, its traceparent when valid, and on
 * a failed request the error's status, reason and message.
 */
static void request_log(const struct request *rq, struct MHD_Connection *conn, uint64_t dur,
                        bool completed)
{
	char client[48];
	json_t *f;

	/* the address as text only when it is logged: inet_ntop formats with printf */
	client_text(conn, client, sizeof client);
	f = json_pack("{s:s, s:o*, s:o*, s:i, s:f, s:b, s:s, s:o*, s:I, s:I}",
	                      "request_id", rq->id, "method", ts_json_text(rq->method), "path",
	                      ts_json_text(rq->path), "status", rq->http_code, "duration_ms",
	                      (double)(dur / 1000) / 1e3, "completed", completed, "client",
	                      client, "user_agent",
	                      rq->user_agent[0] ? ts_json_text(rq->user_agent) : NULL,
	                      "bytes_in", (json_int_t)rq->bytes_in, "bytes_out",
	                      (json_int_t)rq->bytes_out);

	if (f && rq->traceparent[0]) {
		json_object_set_new(f, "traceparent", json_string(rq->traceparent));
		json_object_set_new(f, "trace_id", json_stringn(rq->traceparent + 3, 32));
	}
	if (f && rq->reply.kind == TS_REPLY_ERROR)
		json_object_set_new(f, "error",
		                    json_pack("{s:s, s:s, s:o*}", "status",
		                              ts_status_name(rq->reply.error.status), "reason",
		                              rq->reply.error.reason, "message",
		                              ts_json_text(rq->reply.error.message)));
	ts_log_json(TS_LOG_INFO, f, "request");
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
	struct ts_server *srv = cls;
	struct request *rq = *req_cls;
	uint64_t dur;

	if (!rq)
		return;
	dur = ts_now_ns() - rq->start_ns;
	if (rq->cut)
		rq->http_code = 408;     /* cut off for sending too slowly */
	if (!rq->http_code)
		rq->http_code = 499;     /* the client went away before an answer */
	if (rq->reserving && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
		MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
		                          (unsigned int)srv->cfg.connection_timeout);
	ts_metrics_record(srv->metrics, rq->route, rq->http_code, dur);
	ts__trace_request(srv, rq->method, rq->route < ts_nroutes ? ts_route_patterns[rq->route]
	                                   : "(no route)", rq->http_code, rq->start_ns,
	                  rq->start_ns + dur);
	if (ts_log_enabled(TS_LOG_INFO))
		request_log(rq, conn, dur, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
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
	spare_put(rq);
	*req_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];

	(void)cls;
	vsnprintf(msg, sizeof msg, fmt, ap);
	msg[strcspn(msg, "\n")] = '\0';
	/* said for every MHD_NO on_request returns: a connection refused at
	 * accept (logged, rate-limited, by ts__conn_refuse) or cut for being slow
	 * (logged by request_too_slow); a flood must not become a log flood */
	if (strncmp(msg, "Application reported internal error", 35) == 0)
		return;
	ts_log_json(TS_LOG_WARN, json_pack("{s:s}", "component", "libmicrohttpd"), "%s", msg);
}

/* ---- connections ---------------------------------------------------------- */

/* Answers a connection past a limit on its raw socket (nothing has been
 * read or written on it yet) and half-closes it; the library closes it once
 * the client does, or after a second. */
static void conn_refuse(struct ts_server *srv, struct MHD_Connection *conn, int which)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

	ts__conn_refuse(srv, ci ? ci->connect_fd : -1, which);
	MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT, 1u);
}

/* cls: the connection's struct ts__daemon */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
	const struct ts__daemon *dm = cls;
	struct ts_server *srv = dm->srv;
	struct conn_ctx *cc = *socket_context;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *ci =
			MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		int over;

		cc = calloc(1, sizeof *cc);
		if (!cc) {
			/* served uncounted: refusing needs no memory, counting does */
			if (dm->worker >= 0)
				ts_metrics_worker_conns_add(srv->metrics, dm->worker, -1);
			return;
		}
		ts__conn_key(ci ? ci->client_addr : NULL, cc->addr);
		cc->local = on_unix_socket(conn);
		cc->bulk = dm->worker < 0;
		over = ts__conn_admit(srv, cc->addr, cc->local);
		cc->refused = over != 0;
		*socket_context = cc;
		if (over)
			conn_refuse(srv, conn, over);
		return;
	}
	if (!cc)
		return;
	if (!cc->refused)
		ts__conn_leave(srv, cc->addr);
	if (dm->worker >= 0)
		ts_metrics_worker_conns_add(srv->metrics, dm->worker, -1);
	free(cc);
	*socket_context = NULL;
}

void ts__http_stop(struct ts_server *srv)
{
	/* no connection is handed to a daemon once the acceptor has stopped */
	ts__accept_stop(srv);
	for (int w = 0; w < srv->nworkers; w++)
		if (srv->workers[w].mhd)
			MHD_stop_daemon(srv->workers[w].mhd);
	free(srv->workers);
	srv->workers = NULL;
	srv->nworkers = 0;
	if (srv->bulk.mhd)
		MHD_stop_daemon(srv->bulk.mhd);
	srv->bulk.mhd = NULL;
	if (srv->unix_listening)
		unlink(srv->cfg.unix_socket);
	srv->unix_listening = false;
	ts__conns_stop(srv);
}

/* Starts dm (its srv and worker set), a daemon that accept.c hands
 * connections to: the same callbacks and limits everywhere, conn_memory of
 * connection memory, and threads > 1 a pool of that many threads (the
 * library places each connection by its socket's number), else one thread
 * of its own. False when it could not start. */
static bool daemon_start(struct ts__daemon *dm, int threads, unsigned int hard,
                         size_t conn_memory)
{
	struct ts_server *srv = dm->srv;
	struct MHD_OptionItem opts[] = {
		{MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log, NULL},
		{MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, srv},
		{MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)unescape, NULL},
		{MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)on_connection, dm},
		{MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)conn_memory, NULL},
		{MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)srv->cfg.connection_timeout, NULL},
		{MHD_OPTION_CONNECTION_LIMIT, (intptr_t)hard, NULL},
		{threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (intptr_t)threads, NULL},
		{MHD_OPTION_END, 0, NULL},
	};

	dm->mhd = MHD_start_daemon(TS_HTTP_MHD_FLAGS | MHD_USE_NO_LISTEN_SOCKET, 0, NULL, NULL,
	                           on_request, srv, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
	return dm->mhd != NULL;
}

/* The bulk daemon, a pool of threads, and the small-request workers:
 * threads daemons of one thread each. */
static bool daemons_start(struct ts_server *srv, int threads, unsigned int hard)
{
	srv->bulk = (struct ts__daemon){.srv = srv, .worker = -1};
	if (!daemon_start(&srv->bulk, threads, hard, TS_HTTP_CONN_MEMORY_BULK))
		return false;
	srv->workers = calloc((size_t)threads, sizeof *srv->workers);
	if (!srv->workers || ts_metrics_set_workers(srv->metrics, threads) != TS_OK)
		return false;
	srv->nworkers = threads;
	for (int w = 0; w < threads; w++) {
		srv->workers[w] = (struct ts__daemon){.srv = srv, .worker = w};
		if (!daemon_start(&srv->workers[w], 1, hard, TS_HTTP_CONN_MEMORY))
			return false;
	}
	return true;
}

ts_status ts__http_start(struct ts_server *srv, struct ts_error *err)
{
	int threads = srv->cfg.threads, fds[2], nfds = 0;
	/* the library's own limit leaves room to answer those past ours */
	unsigned int hard;
	ts_status st;

	pthread_once(&spare_once, spare_key_make);
	if (threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		threads = n > 0 ? (int)n : 1;
	}
	if (threads > TS__MAX_WORKERS)
		threads = TS__MAX_WORKERS;
	st = ts__conns_start(srv, &hard, err);
	if (st != TS_OK)
		return st;
	/* the deadline thread and its lock exist before any worker can suspend */
	ts_mutex_init(&srv->waits_mu);
	pthread_cond_init(&srv->waits_cv, NULL);
	srv->waits_until_ns = UINT64_MAX;
	if (pthread_create(&srv->waits_thread, NULL, waits_main, srv) != 0)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "THREAD", "cannot start the wait thread");
	srv->waits_started = true;
	if (!daemons_start(srv, threads, hard))
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "HTTP_START",
		                    "cannot start the HTTP server's threads");
	st = ts__tcp_listen(&srv->cfg, &fds[nfds], &srv->port, err);
	if (st != TS_OK)
		return st;
	nfds++;
	if (srv->cfg.unix_socket[0]) {
		st = ts__unix_listen(&srv->cfg, &fds[nfds], err);
		if (st != TS_OK) {
			close(fds[0]);
			return st;
		}
		nfds++;
		srv->unix_listening = true;
	}
	return ts__accept_start(srv, fds, nfds, err);   /* owns the sockets now */
}
