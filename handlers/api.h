/*
 * api.h - what a handler receives and what it answers, free of any HTTP
 * library.
 *
 * The server turns each HTTP request into a ts_call (method, matched path
 * parameters, query and header lookups, the body when the route takes one)
 * and hands it to the route's handler together with an empty ts_reply. The
 * handler parses, calls the core, and fills the reply: a JSON value, text,
 * or an error in the google.rpc.Status shape. The server renders the reply.
 * Handlers never see libmicrohttpd and never write HTTP numbers: success
 * codes come from enum ts_http_ok, failures from ts_status.
 *
 * Thread-safety: a call and its reply belong to one request on one thread;
 * struct ts_core is shared by every request and holds only thread-safe
 * objects or values immutable after start.
 */
#ifndef TS_HANDLERS_API_H
#define TS_HANDLERS_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "device/topology.h"
#include "jobs/env.h"

struct ts_reply;
struct ts_view_cache;
struct ts_array;
struct ts_operation;

/* Most destinations of one broadcast (:copy with "hosts"). */
#define TS_FLEET_BROADCAST_MAX 64

/* A copy of an array to another node of the fleet (:copy or :put with
 * "host"), or to several (:copy with "hosts"): what the server's hook
 * (ts_core.fleet_copy) is given. */
struct ts_fleet_copy_req {
	const char *host;        /* the peer's --host-name, as GET /v1/fleet lists it; NULL
	                          * for a broadcast */
	const char *const *hosts;   /* a broadcast's destinations (nhosts, distinct); NULL
	                             * for one host */
	size_t nhosts;
	bool partial_ok;         /* a broadcast publishes where it succeeded */
	const char *out;         /* the array's name there */
	json_t *placement;       /* "sharding" or "device"/"memory_kind" as given; borrowed */
	const char *dtype;       /* the destination's dtype */
	bool overwrite;
	bool put;                /* a move: the source version goes once the copy is there */
};
struct ts_state;

/* The core objects every handler may use; immutable after start (the
 * objects they point to are thread-safe). env is what the jobs below the
 * handlers take (jobs/env.h); the rest is the HTTP half. */
struct ts_core {
	struct ts_jobs_env env;              /* devices, memory, catalog, stager, operations, ... */
	struct ts_view_cache *memory_view;   /* handlers/memory.c */
	const char *data_dir;                /* realpath of --data-dir, or NULL */
	const char *data_dir_given;          /* --data-dir as configured (another spelling) */
	uint64_t wait_limit_ns;              /* longest a waiting call holds its connection */
	struct ts_device *default_device;
	const struct ts_topology *topology;  /* NUMA nodes and device locality (device/topology.h) */
	enum ts_memory_kind default_memory_kind;
	const char *version;
	const char *host;
	uint64_t started_ns;         /* monotonic clock at start */
	uint64_t started_wall_ns;
	struct ts_state *state;              /* the --state-dir (jobs/state.h), or NULL */
	/* submits a cross-node copy of src as an operation (server/fleet_xfer.c);
	 * NULL when the daemon has no fleet */
	ts_status (*fleet_copy)(void *cls, struct ts_array *src, const struct ts_fleet_copy_req *req,
	                        struct ts_operation **op, struct ts_error *err);
	void *fleet_cls;
};

#define TS_CALL_MAX_PARAMS 4

struct ts_call {
	const struct ts_core *core;
	const char *method;
	const char *path;
	const char *request_id;
	int nparams;
	struct {
		const char *name;    /* from the route pattern, e.g. "device" */
		const char *value;   /* borrowed, NUL-terminated */
	} params[TS_CALL_MAX_PARAMS];
	const char *body;        /* JSON routes: the whole body, NUL-terminated; else NULL */
	size_t body_len;
	/* private: lookups answered by the server */
	void *conn;
	const char *(*lookup)(void *conn, int where, const char *key);
};

enum ts_http_ok {
	TS_HTTP_OK = 200,
	TS_HTTP_CREATED = 201,
	TS_HTTP_ACCEPTED = 202,
	TS_HTTP_NO_CONTENT = 204,
	TS_HTTP_NOT_MODIFIED = 304,   /* only through ts_reply_not_modified */
};

enum ts_reply_kind {
	TS_REPLY_NONE = 0,
	TS_REPLY_JSON,
	TS_REPLY_TEXT,
	TS_REPLY_ERROR,
	TS_REPLY_STREAM,    /* bytes produced by a reader callback as they are sent */
	TS_REPLY_BUFFERS,   /* up to TS_REPLY_MAX_PARTS borrowed buffers, sent in place */
	TS_REPLY_SUSPEND,   /* no answer yet: the connection waits, no thread does */
};

/*
 * A reply that waits for something (an operation to finish) without holding
 * a server thread. The server suspends the connection, then calls
 * arm(state, wake, token): arm arranges for wake(token) to be called once,
 * from any thread, when the answer is ready, and returns false (arranging
 * nothing) when it is ready already. If timeout_ns passes first, the server
 * calls disarm(state, wake, token), after which wake must not be called. In
 * both cases it then calls resume(state, timed_out, reply) on a server
 * thread to fill the real reply, and release(state) once at the end.
 */
struct ts_suspend {
	uint64_t timeout_ns;
	bool (*arm)(void *state, void (*wake)(void *token), void *token);
	void (*disarm)(void *state, void (*wake)(void *token), void *token);
	void (*resume)(void *state, bool timed_out, struct ts_reply *reply);
	void (*release)(void *state);
	void *state;
};

/*
 * A streamed body. read fills buf with up to max bytes from position pos
 * (positions are consecutive) and returns the count, 0 never (the size is
 * known), or -1 on failure (the connection is then closed, since the
 * status line is already sent). release frees state; it runs once, when the
 * response is done with it.
 */
struct ts_stream {
	uint64_t size;
	long (*read)(void *state, uint64_t pos, char *buf, size_t max);
	void (*release)(void *state);
	void *state;
};

/* enough for a ?rows= batch of 63 rows answered in place (download.c) */
#define TS_REPLY_MAX_PARTS 64

/* Buffers answered in place (no copy); release(cls) runs when sent. */
struct ts_part {
	const void *base;
	size_t len;
};

struct ts_parts {
	int n;
	struct ts_part part[TS_REPLY_MAX_PARTS];
	void (*release)(void *cls);
	void *cls;
};

#define TS_REPLY_MAX_HEADERS 8

struct ts_reply {
	enum ts_reply_kind kind;
	enum ts_http_ok ok;          /* success code for JSON/TEXT */
	json_t *json;                /* owned (TS_REPLY_JSON) */
	char *text;                  /* owned, malloc'd (TS_REPLY_TEXT) */
	size_t text_len;
	const char *content_type;    /* static string */
	struct ts_error error;       /* TS_REPLY_ERROR */
	struct ts_stream stream;     /* TS_REPLY_STREAM (owned: released with the reply) */
	struct ts_parts parts;       /* TS_REPLY_BUFFERS (owned likewise) */
	struct ts_suspend suspend;   /* TS_REPLY_SUSPEND (owned likewise) */
	int nheaders;
	struct {
		char name[40];
		char value[200];
	} headers[TS_REPLY_MAX_HEADERS];
};

/* A path parameter by name (borrowed), or NULL. */
const char *ts_call_param(const struct ts_call *c, const char *name);

/* A query argument (borrowed, already percent-decoded), or NULL. */
const char *ts_call_query(const struct ts_call *c, const char *key);

/* A request header (borrowed), or NULL. */
const char *ts_call_header(const struct ts_call *c, const char *name);

/* Lookup spaces for ts_call.lookup. */
enum { TS_LOOKUP_QUERY = 1, TS_LOOKUP_HEADER = 2 };

/*
 * A route that takes its body as a stream (uploads). begin runs on the first
 * callback, with the request headers and Content-Length (UINT64_MAX when
 * absent): it returns the upload's state, or NULL after filling reply with a
 * refusal, which is then sent at once without reading the body (so a client
 * that sent "Expect: 100-continue" never sends it). chunk takes each piece
 * of the body where it lands and returns false after filling reply with an
 * error (the rest of the body is not used). finish runs once the body is
 * complete and fills reply. release frees the state and runs exactly once,
 * whether the upload finished, failed or the client went away; it must undo
 * whatever an unfinished upload holds, so that nothing changes.
 */
struct ts_upload_ops {
	void *(*begin)(const struct ts_call *call, uint64_t content_length,
	               struct ts_reply *reply);
	bool (*chunk)(void *state, const char *data, size_t n, struct ts_reply *reply);
	void (*finish)(void *state, const struct ts_call *call, struct ts_reply *reply);
	void (*release)(void *state);
};

/* Answers with a JSON value; steals the reference to body. */
void ts_reply_json(struct ts_reply *r, enum ts_http_ok ok, json_t *body);

/* ts_reply_json with 200 and an ETag that names body's content (a hash of
 * its canonical form), for resources that have no version of their own:
 * a conditional GET of an unchanged one is then 304. Steals body. */
void ts_reply_json_tagged(struct ts_reply *r, json_t *body);

/*
 * Conditional GET (RFC 9110 13.1.2): when the 200 reply r carries an ETag
 * that if_none_match (the request's header, may be NULL) lists, or
 * if_none_match is "*", replaces its body with none and its code with 304,
 * keeping its headers, and returns true. The server calls it for GET and
 * HEAD after the handler ran.
 */
bool ts_reply_not_modified(struct ts_reply *r, const char *if_none_match);

/* Answers with text (copied). */
void ts_reply_text(struct ts_reply *r, enum ts_http_ok ok,
                   const char *content_type, const char *text, size_t len);

/* Answers with text the reply takes ownership of (malloc'd). */
void ts_reply_text_owned(struct ts_reply *r, enum ts_http_ok ok,
                         const char *content_type, char *text, size_t len);

/* Answers with the error err (copied). */
void ts_reply_error(struct ts_reply *r, const struct ts_error *err);

/* Answers with a new error; returns st. */
ts_status ts_reply_fail(struct ts_reply *r, ts_status st, const char *reason,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Answers RESOURCE_EXHAUSTED OUT_OF_MEMORY (ts_error_oom's); returns it. */
ts_status ts_reply_oom(struct ts_reply *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Answers with a stream; the reply owns it from now on (released even if
 * the reply is replaced by an error). */
void ts_reply_stream(struct ts_reply *r, enum ts_http_ok ok, const char *content_type,
                     const struct ts_stream *stream);

/* Answers with borrowed buffers; the reply owns parts->cls from now on. */
void ts_reply_buffers(struct ts_reply *r, enum ts_http_ok ok, const char *content_type,
                      const struct ts_parts *parts);

/* Answers later (see struct ts_suspend); the reply owns s->state now. */
void ts_reply_suspend(struct ts_reply *r, const struct ts_suspend *s);

/* Adds a response header (copied; dropped past TS_REPLY_MAX_HEADERS). */
void ts_reply_header(struct ts_reply *r, const char *name, const char *value);

/* Frees what the reply owns and resets it: as a zeroed reply, for every
 * function here (header and error text past their ends may remain). */
void ts_reply_release(struct ts_reply *r);

/*
 * The google.rpc.Status body of err:
 * {"error": {"code", "status", "message", "details": [ErrorInfo]}}, where
 * code is http_code when non-zero (405 for a wrong method), else the status'
 * canonical HTTP number. Returns a new reference (NULL when out of memory).
 */
json_t *ts_error_to_json(const struct ts_error *err, int http_code);

#endif
