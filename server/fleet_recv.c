/*
 * fleet_recv.c - the receiving end of a cross-node copy (fleet_recv.h).
 *
 * Invariant: a receive in the set owns its staging array, its prepared move
 * (the destination allocated) and nothing else; whoever unlinks it under mu
 * frees it (after its endpoint is closed and none of its bytes is landing),
 * so a commit, an abort, a failed endpoint and the deadline never both act
 * on one. A receive whose endpoint failed before all its bytes landed
 * leaves a record (its error, until its deadline) that its commit answers.
 */
#include "server/fleet_recv.h"

#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "common/base64.h"
#include "common/lock.h"
#include "common/log.h"
#include "common/units.h"
#include "formats/convert.h"
#include "handlers/arrays_int.h"
#include "handlers/handlers.h"
#include "handlers/operations.h"
#include "handlers/sharding_json.h"
#include "jobs/move.h"
#include "memory/buffer.h"
#include "server/fleet_fwd.h"
#include "server/fleet_ucx.h"
#include "server/metrics.h"
#include "server/server_int.h"

struct recv {
	struct recv *next;
	struct ts_fleet_recv *set;
	uint64_t serial;                   /* its tag on the fleet port (never reused) */
	char id[40];                       /* "rcv-" and 32 hex digits */
	char out[TS_ARRAY_NAME_MAX + 1];
	struct ts_array *staging;          /* own reference; unpublished */
	struct ts_job_move *jm;            /* owned: the prepared move */
	unsigned char *data;               /* the staging bytes; NULL when none */
	uint64_t length;                   /* their number */
	uint64_t received;                 /* bytes landed; guarded by: set->mu */
	int landing;                       /* bytes' receives in flight; guarded by: set->mu */
	char source[TS_ARRAY_NAME_MAX + 1];/* the sender's host, as it says; "" unknown */
	uint64_t deadline_ns;
	bool in_place;                     /* staging is the destination: the commit
	                                    * publishes it, copying nothing */
	struct ts_fleet_fwd *fwd;          /* owned: forwards the bytes as they land (a
	                                    * chain's middle hop); NULL when none */
};

/* What is left of a receive whose peer failed: its error, for its commit. */
struct ended {
	struct ended *next;
	char id[40];
	uint64_t deadline_ns;
	struct ts_error err;
};

/* Most ended receives remembered; the oldest go first. */
#define ENDED_MAX 64

/* Longest wait of a commit for bytes still landing. */
#define COMMIT_LAND_WAIT_S 10

struct ts_fleet_recv {
	struct ts_mutex mu;
	struct recv *open;                 /* guarded by: mu */
	int nopen;                         /* guarded by: mu */
	struct ended *ended;               /* guarded by: mu; newest first */
	pthread_cond_t landed;             /* signalled when bytes land (monotonic clock) */
	struct ts_metrics *metrics;        /* borrowed; set by the first receive */
	_Atomic uint64_t serials;
	_Atomic int releasing;             /* receives waiting for their endpoint to close */
};

struct ts_fleet_recv *ts_fleet_recv_new(void)
{
	struct ts_fleet_recv *r = calloc(1, sizeof *r);
	pthread_condattr_t ca;
	bool cond = false;

	if (!r)
		return NULL;
	if (pthread_condattr_init(&ca) == 0) {
		cond = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
		       pthread_cond_init(&r->landed, &ca) == 0;
		pthread_condattr_destroy(&ca);
	}
	if (!cond || ts_mutex_init(&r->mu) != 0) {
		if (cond)
			pthread_cond_destroy(&r->landed);
		free(r);
		return NULL;
	}
	return r;
}

static void recv_free(struct recv *v)
{
	ts_fleet_fwd_free(v->fwd);   /* its sends over before the memory goes */
	if (v->staging && v->set)
		ts_metrics_fleet_receives(v->set->metrics, 0, -(int64_t)v->length);
	ts_job_move_discard(v->jm);
	ts_array_unref(v->staging);
	free(v);
}

struct release_arg {
	struct recv *v;
	struct ts_fleet_ucx *u;
};

static void released(void *arg)
{
	struct release_arg *a = arg;
	struct ts_fleet_recv *set = a->v->set;

	recv_free(a->v);
	free(a);
	atomic_fetch_sub(&set->releasing, 1);
}

static const void *tag_of(const struct recv *v)
{
	return (const void *)(uintptr_t)v->serial;
}

/* Drops v: its endpoint closed first (no peer writes into its memory any
 * more), then its memory freed, on the fleet port's progress thread. */
static void recv_drop(struct recv *v, struct ts_fleet_ucx *u)
{
	struct release_arg *a = u ? malloc(sizeof *a) : NULL;

	if (!a) {
		recv_free(v);
		return;
	}
	a->v = v;
	a->u = u;
	atomic_fetch_add(&v->set->releasing, 1);
	ts_fleet_ucx_release(u, tag_of(v), released, a);
}

/* The open receive whose tag is tag, or NULL; mu held. */
static struct recv *by_tag(struct ts_fleet_recv *r, const void *tag)
{
	struct recv *v = r->open;

	while (v && tag_of(v) != tag)
		v = v->next;
	return v;
}

/* Unlinks v (open); mu held. */
static void unlink_locked(struct ts_fleet_recv *r, struct recv *v)
{
	for (struct recv **pp = &r->open; *pp; pp = &(*pp)->next) {
		if (*pp == v) {
			*pp = v->next;
			r->nopen--;
			ts_metrics_fleet_receives(r->metrics, -1, 0);
			return;
		}
	}
}

/* Unlinks the receive with this id (or, id NULL, the first past its
 * deadline at now) and returns it, or NULL. */
static struct recv *take(struct ts_fleet_recv *r, const char *id, uint64_t now)
{
	struct recv *v = NULL;

	ts_mutex_lock(&r->mu);
	for (v = r->open; v; v = v->next)
		if (id ? strcmp(v->id, id) == 0 : v->deadline_ns <= now)
			break;
	if (v)
		unlink_locked(r, v);
	ts_mutex_unlock(&r->mu);
	return v;
}

/* Finds the ended receive with this id (or, id NULL, every one past its
 * deadline at now), forgets it unless keep: whether there was one; with
 * err, its error. */
static bool ended_take(struct ts_fleet_recv *r, const char *id, uint64_t now, bool keep,
                       struct ts_error *err)
{
	bool found = false;

	ts_mutex_lock(&r->mu);
	for (struct ended **pp = &r->ended; *pp;) {
		struct ended *e = *pp;

		if (id ? strcmp(e->id, id) == 0 : e->deadline_ns <= now) {
			found = true;
			if (err)
				*err = e->err;
			if (keep)
				break;
			*pp = e->next;
			free(e);
			if (id)
				break;
		} else {
			pp = &e->next;
		}
	}
	ts_mutex_unlock(&r->mu);
	return found;
}

/* Remembers that the receive v ended with err (the newest ENDED_MAX). */
static void ended_add(struct ts_fleet_recv *r, const struct recv *v, const struct ts_error *err)
{
	struct ended *e = calloc(1, sizeof *e), **pp;
	int n = 0;

	if (!e)
		return;
	snprintf(e->id, sizeof e->id, "%s", v->id);
	e->deadline_ns = v->deadline_ns;
	e->err = *err;
	ts_mutex_lock(&r->mu);
	e->next = r->ended;
	r->ended = e;
	for (pp = &r->ended; *pp && n < ENDED_MAX; pp = &(*pp)->next)
		n++;
	while (*pp) {
		struct ended *old = *pp;

		*pp = old->next;
		free(old);
	}
	ts_mutex_unlock(&r->mu);
}

void *ts_fleet_recv_land(void *cls, const void *tag, uint64_t offset, size_t len)
{
	struct ts_server *srv = cls;
	struct ts_fleet_recv *r = srv->fleet_recv;
	struct recv *v;
	void *dst = NULL;

	ts_mutex_lock(&r->mu);
	v = by_tag(r, tag);
	if (v && v->data && offset <= v->length && len <= v->length - offset) {
		v->landing++;
		dst = v->data + offset;
	}
	ts_mutex_unlock(&r->mu);
	return dst;
}

void ts_fleet_recv_landed(void *cls, const void *tag, void *dst, size_t len, bool ok)
{
	struct ts_server *srv = cls;
	struct ts_fleet_recv *r = srv->fleet_recv;
	struct recv *v;

	ts_mutex_lock(&r->mu);
	v = by_tag(r, tag);
	if (v) {
		v->landing--;
		v->received += ok ? len : 0;
		if (ok && v->fwd)
			ts_fleet_fwd_landed(v->fwd, (uint64_t)((unsigned char *)dst - v->data), len);
		pthread_cond_broadcast(&r->landed);
	}
	ts_mutex_unlock(&r->mu);
}

void ts_fleet_recv_failed(void *cls, const void *tag, const char *peer, const char *why)
{
	struct ts_server *srv = cls;
	struct ts_fleet_recv *r = srv->fleet_recv;
	struct ts_error err;
	struct recv *v;
	uint64_t got = 0;

	ts_mutex_lock(&r->mu);
	v = by_tag(r, tag);
	/* an endpoint closed once every byte landed is the sender's goodbye:
	 * its commit comes over HTTP */
	if (v && (v->received < v->length || v->landing > 0)) {
		got = v->received;
		unlink_locked(r, v);
		pthread_cond_broadcast(&r->landed);
	} else {
		v = NULL;
	}
	ts_mutex_unlock(&r->mu);
	if (!v)
		return;
	ts_error_clear(&err);
	ts_error_set(&err, TS_UNAVAILABLE, "PEER_FAILED",
	             "the copy of array '%s' from peer '%s' (%s) ended after %llu of %llu bytes: "
	             "its endpoint failed: %s", v->out, v->source[0] ? v->source : "unnamed", peer,
	             (unsigned long long)got, (unsigned long long)v->length, why);
	ended_add(r, v, &err);
	ts_log(TS_LOG_WARN, "\"event\":\"fleet_receive\",\"result\":\"failed\"",
	       "fleet receive %s failed: UNAVAILABLE: %s; dropped", v->id, err.message);
	recv_drop(v, srv->fleet_ucx);
}

void ts_fleet_recv_drop_all(struct ts_fleet_recv *r, struct ts_fleet_ucx *u)
{
	struct recv *v;

	if (!r)
		return;
	while ((v = take(r, NULL, UINT64_MAX)))
		recv_drop(v, u);
	/* the progress thread frees them once their endpoints are closed */
	for (int i = 0; i < 5000 && atomic_load(&r->releasing) > 0; i++)
		usleep(1000);
}

void ts_fleet_recv_tick(void *cls)
{
	struct ts_server *srv = cls;
	struct recv *v;

	(void)ended_take(srv->fleet_recv, NULL, ts_now_ns(), false, NULL);
	while ((v = take(srv->fleet_recv, NULL, ts_now_ns()))) {
		ts_log(TS_LOG_WARN, "\"event\":\"fleet_receive\",\"result\":\"expired\"",
		       "fleet receive %s of array '%s' expired uncommitted; dropped", v->id, v->out);
		recv_drop(v, srv->fleet_ucx);
	}
}

void ts_fleet_recv_free(struct ts_fleet_recv *r)
{
	if (!r)
		return;
	ts_fleet_recv_drop_all(r, NULL);
	(void)ended_take(r, NULL, UINT64_MAX, false, NULL);
	pthread_cond_destroy(&r->landed);
	ts_mutex_destroy(&r->mu);
	free(r);
}

static ts_status bad(struct ts_error *err, const char *field, const char *what)
{
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "\"%s\" %s", field, what);
}

/* The receive's request: the array's shape and dtypes and where it goes. */
static ts_status parse(const struct ts_core *core, json_t *body, struct ts_array_desc *wire,
                       struct ts_move_spec *spec, char *out, char *source, uint64_t *ttl_s,
                       struct ts_error *err)
{
	static const char *const known[] = {"out", "dtype", "source_dtype", "shape", "sharding",
	                                    "device", "memory_kind", "overwrite",
	                                    "timeout_seconds", "source_host", "data", "forward"};
	json_t *v, *sh = json_object_get(body, "sharding");
	json_t *dev = json_object_get(body, "device"), *kind = json_object_get(body, "memory_kind");
	const char *k;
	char names[TS_DTYPE_NAMES_MAX];
	size_t i;

	json_object_foreach(body, k, v) {
		size_t j = 0;

		while (j < sizeof known / sizeof *known && strcmp(k, known[j]))
			j++;
		if (j == sizeof known / sizeof *known)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
			                    "unknown field '%s'; a receive takes \"out\", \"dtype\", "
			                    "\"source_dtype\", \"shape\", \"sharding\" or \"device\"/"
			                    "\"memory_kind\", \"overwrite\", \"timeout_seconds\", "
			                    "\"source_host\", \"data\" and \"forward\"", k);
	}
	v = json_object_get(body, "out");
	if (!json_is_string(v) || !ts_array_name_valid(json_string_value(v)))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
		                    "\"out\" must name the new array "
		                    "(^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$)");
	snprintf(out, TS_ARRAY_NAME_MAX + 1, "%s", json_string_value(v));
	v = json_object_get(body, "source_host");
	if (v && (!json_is_string(v) || !ts_array_name_valid(json_string_value(v))))
		return bad(err, "source_host", "must be the sender's host name "
		                               "(^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$)");
	snprintf(source, TS_ARRAY_NAME_MAX + 1, "%s", v ? json_string_value(v) : "");
	v = json_object_get(body, "dtype");
	if (!json_is_string(v) || !ts_dtype_parse(json_string_value(v), &spec->dtype))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE",
		                    "\"dtype\" must be a dtype name, one of %s",
		                    ts_dtype_names(names, sizeof names));
	wire->dtype = spec->dtype;
	v = json_object_get(body, "source_dtype");
	if (v && (!json_is_string(v) || !ts_dtype_parse(json_string_value(v), &wire->dtype)))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE",
		                    "\"source_dtype\" must be a dtype name, one of %s",
		                    ts_dtype_names(names, sizeof names));
	if (!ts_convert_supported(wire->dtype, spec->dtype))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "UNSUPPORTED_CONVERSION",
		                    "%s cannot be converted to %s: copies convert between float32, "
		                    "bfloat16 and float16", ts_dtype_name(wire->dtype),
		                    ts_dtype_name(spec->dtype));
	spec->convert = wire->dtype != spec->dtype;
	v = json_object_get(body, "shape");
	if (!json_is_array(v) || json_array_size(v) > TS_MAX_RANK)
		return bad(err, "shape", "must be an array of at most 32 sizes");
	wire->rank = (int)json_array_size(v);
	for (i = 0; i < json_array_size(v); i++) {
		json_t *n = json_array_get(v, i);

		if (!json_is_integer(n) || json_integer_value(n) < 0)
			return bad(err, "shape", "must hold sizes (integers >= 0)");
		wire->shape[i] = (uint64_t)json_integer_value(n);
	}
	if (ts_array_desc_init(wire, err) != TS_OK)
		return err->status;
	v = json_object_get(body, "overwrite");
	if (v && !json_is_boolean(v))
		return bad(err, "overwrite", "is a boolean");
	spec->overwrite = json_is_true(v);
	v = json_object_get(body, "timeout_seconds");
	*ttl_s = TS_FLEET_RECV_TTL_S;
	if (v && (!json_is_integer(v) || json_integer_value(v) < 1 ||
	          json_integer_value(v) > TS_FLEET_RECV_TTL_MAX_S))
		return bad(err, "timeout_seconds", "must be an integer from 1 to 3600");
	if (v)
		*ttl_s = (uint64_t)json_integer_value(v);
	if (sh && (dev || kind))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "give either \"sharding\" or \"device\"/\"memory_kind\", not both");
	if (sh) {
		spec->placement.committed = true;
		return ts_h_sharding_resolve(core, sh, &spec->placement.sharding, err);
	}
	if ((dev && !json_is_string(dev)) || (kind && !json_is_string(kind)))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"device\" and \"memory_kind\" are strings");
	return ts_h_placement(core, json_string_value(dev), json_string_value(kind),
	                      &spec->placement, err);
}

/* The staging array: the destination itself where the bytes can land
 * there (no conversion, one shard, host-visible memory: the commit then
 * publishes it without a copy, spec->consume), else host memory of the
 * default device, which the commit copies to the destination. */
static ts_status stage(struct ts_server *srv, struct recv *v, const struct ts_array_desc *wire,
                       struct ts_move_spec *spec, struct ts_error *err)
{
	const struct ts_core *core = &srv->core;
	struct ts_placement pl;
	struct ts_buffer *b;
	char name[TS_ARRAY_NAME_MAX + 1];
	ts_status st;

	snprintf(name, sizeof name, "fleet-receive-%s", v->id + 4);
	if (!spec->convert && wire->nbytes > 0 &&
	    ts_array_new(name, wire, &spec->placement, core->env.memory, &v->staging, NULL) ==
	        TS_OK) {
		b = ts_array_single_buffer(v->staging);
		spec->consume = b && ts_buffer_host_visible(b);
		v->in_place = spec->consume;
		if (!spec->consume) {
			ts_array_unref(v->staging);
			v->staging = NULL;
		}
	}
	if (!v->staging) {
		ts_placement_single(&pl, core->default_device, TS_MEM_UNPINNED_HOST, true);
		st = ts_array_new(name, wire, &pl, core->env.memory, &v->staging, err);
		if (st != TS_OK)
			return st;
	}
	v->length = wire->nbytes;
	ts_metrics_fleet_receives(srv->metrics, 0, (int64_t)v->length);
	if (wire->nbytes == 0)
		return TS_OK;   /* nothing to write */
	b = ts_array_single_buffer(v->staging);
	if (!b || !ts_buffer_host_visible(b))
		return ts_error_set(err, TS_INTERNAL, "STAGING",
		                    "the staging memory of a receive is not host memory");
	v->data = ts_buffer_data(b);
	return TS_OK;
}

static void commit_reply(struct ts_server *srv, const struct ts_call *call, struct recv *v,
                         struct ts_reply *reply);

/* A receive whose bytes came with its request (small arrays: no ticket, no
 * endpoint, one call; their count checked already): the request's body
 * itself (raw, the spec in X-Tstage-Receive) or "data" (b64, base64). They
 * land in the staging memory and the receive is committed at once. */
static void receive_inline(struct ts_server *srv, const struct ts_call *call, struct recv *v,
                           const char *b64, struct ts_reply *reply)
{
	struct ts_error err;

	ts_error_clear(&err);
	if (b64 &&
	    ts_base64_decode(b64, strlen(b64), true, v->data, v->length) != (long)v->length) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "\"data\" must be the array's %llu bytes in base64 (RFC 4648, padded)",
		             (unsigned long long)v->length);
		recv_free(v);
		ts_reply_error(reply, &err);
		return;
	}
	if (!b64 && v->length)
		memcpy(v->data, call->body, v->length);
	v->received = v->length;
	ts_log(TS_LOG_INFO, "\"event\":\"fleet_receive\",\"result\":\"inline\"",
	       "fleet receive %s of array '%s' (%llu bytes) came with its request", v->id, v->out,
	       (unsigned long long)v->length);
	commit_reply(srv, call, v, reply);
}

/* Whether the request's body is the array's bytes (Content-Type
 * application/octet-stream, parameters aside). */
static bool raw_body(const struct ts_call *call)
{
	const char *ct = ts_call_header(call, "Content-Type");
	size_t n = sizeof "application/octet-stream" - 1;

	return ct && strncasecmp(ct, "application/octet-stream", n) == 0 &&
	       (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ' || ct[n] == '\t');
}

/* The receive's spec: the JSON body, or with a raw body the JSON object in
 * X-Tstage-Receive. NULL with err set when it is not a JSON object. */
static json_t *receive_spec(const struct ts_call *call, bool raw, struct ts_error *err)
{
	const char *hdr = raw ? ts_call_header(call, TS_FLEET_RECV_HEADER) : NULL;
	json_error_t jerr;
	json_t *body;

	if (raw && !hdr) {
		ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "a body of application/octet-stream is the array's bytes: the receive's "
		             "JSON object goes in the %s header", TS_FLEET_RECV_HEADER);
		return NULL;
	}
	body = raw ? json_loads(hdr, JSON_REJECT_DUPLICATES, &jerr)
	           : json_loadb(call->body ? call->body : "", call->body_len,
	                        JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(body)) {
		ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "%s: %s",
		             raw ? TS_FLEET_RECV_HEADER : "body",
		             body ? "must be a JSON object" : jerr.text);
		json_decref(body);
		return NULL;
	}
	return body;
}

void ts_s_fleet_receive(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_fleet_recv *r = srv->fleet_recv;
	struct ts_array_desc wire = {0};
	struct ts_move_spec spec = {0};
	struct recv *v = NULL;
	char ticket[TS_FLEET_TICKET_LEN + 1], when[48], id[40], instance[24];
	unsigned char rnd[16];
	struct ts_error err;
	json_t *body, *answer, *data, *fwd;
	struct ts_fleet_fwd_spec next;
	uint64_t ttl_s = 0;
	bool full, raw;

	ts_error_clear(&err);
	if (!srv->fleet_ucx) {
		ts_reply_fail(reply, TS_FAILED_PRECONDITION, "NO_FLEET_PORT",
		              "this daemon has no fleet port: it listens with --peers, --peers-dns "
		              "or --fleet-port");
		return;
	}
	raw = raw_body(call);
	body = receive_spec(call, raw, &err);
	if (!body)
		goto fail;
	v = calloc(1, sizeof *v);
	if (!v) {
		ts_error_oom(&err, "no memory for a receive");
		goto fail;
	}
	if (parse(call->core, body, &wire, &spec, v->out, v->source, &ttl_s, &err) != TS_OK)
		goto fail;
	data = json_object_get(body, "data");
	fwd = json_object_get(body, "forward");
	if (raw && data) {
		bad(&err, "data", "goes in a JSON body, not with the bytes as the body");
		goto fail;
	}
	if (fwd && (data || raw)) {
		bad(&err, "forward", "goes with bytes sent over the fleet port, not with the request");
		goto fail;
	}
	if (fwd && ts_fleet_fwd_parse(srv, fwd, &next, &err) != TS_OK)
		goto fail;
	/* bytes with the request: refused before anything is allocated when
	 * they cannot be the array's */
	if ((raw || data) && (wire.nbytes > TS_FLEET_RECV_INLINE_MAX ||
	                      (raw && call->body_len != wire.nbytes))) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "%s must be the array's %llu bytes, and at most %u bytes come with a "
		             "request (a larger array's receive takes none)",
		             raw ? "the body" : "\"data\"", (unsigned long long)wire.nbytes,
		             (unsigned)TS_FLEET_RECV_INLINE_MAX);
		goto fail;
	}
	ts_mutex_lock(&r->mu);
	full = r->nopen >= TS_FLEET_RECV_MAX;
	ts_mutex_unlock(&r->mu);
	if (full) {
		ts_error_set(&err, TS_RESOURCE_EXHAUSTED, "RECEIVES",
		             "%d receives are open already", TS_FLEET_RECV_MAX);
		goto fail;
	}
	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
		ts_error_set(&err, TS_INTERNAL, "RANDOM", "no random bytes for a receive id");
		goto fail;
	}
	v->set = r;
	r->metrics = srv->metrics;
	v->serial = atomic_fetch_add(&r->serials, 1) + 1;
	memcpy(v->id, "rcv-", 4);
	for (size_t i = 0; i < sizeof rnd; i++)
		snprintf(v->id + 4 + 2 * i, 3, "%02x", rnd[i]);
	/* admission: the staging array, then the destination (both refused now) */
	if (stage(srv, v, &wire, &spec, &err) != TS_OK)
		goto fail;
	spec.name = v->out;
	if (data && !json_is_string(data)) {
		bad(&err, "data", "must be the array's bytes in base64");
		goto fail;
	}
	if (data || raw) {
		if (ts_job_move_prepare(&call->core->env, v->staging, &spec, true, &v->jm, NULL,
		                        &err) != TS_OK)
			goto fail;
		receive_inline(srv, call, v, data ? json_string_value(data) : NULL, reply);
		json_decref(body);
		return;
	}
	if (ts_job_move_prepare(&call->core->env, v->staging, &spec, true, &v->jm, NULL, &err) !=
	        TS_OK ||
	    ts_fleet_ucx_ticket_tagged(srv->fleet_ucx, tag_of(v), ticket, &err) != TS_OK)
		goto fail;
	/* a chain's middle: its bytes go on to the next node's receive as they
	 * land (that receive is open: the sender opened it first) */
	if (fwd && ts_fleet_fwd_start(srv, &next, v->out, v->data, v->length, &v->fwd, &err) !=
	               TS_OK)
		goto fail;
	v->deadline_ns = ts_now_ns() + ttl_s * 1000000000ull;
	ts_format_rfc3339(when, sizeof when, ts_wall_ns() + ttl_s * 1000000000ull);
	/* the answer and the log line first: once linked, the deadline may free v */
	snprintf(instance, sizeof instance, "%016llx",
	         (unsigned long long)ts_fleet_ucx_instance(srv->fleet_ucx));
	answer = json_pack("{s:s, s:s, s:i, s:s, s:I, s:s, s:i, s:s}", "id", v->id, "ticket",
	                   ticket, "fleet_port", ts_fleet_ucx_port(srv->fleet_ucx),
	                   "fleet_instance", instance, "length", (json_int_t)wire.nbytes,
	                   "expires", when, "expires_in_seconds", (int)ttl_s, "host",
	                   call->core->host);
	if (!answer) {
		ts_error_oom(&err, "no memory for a receive");
		goto fail;
	}
	snprintf(id, sizeof id, "%s", v->id);
	ts_mutex_lock(&r->mu);
	full = r->nopen >= TS_FLEET_RECV_MAX;   /* again: others may have come meanwhile */
	if (!full) {
		v->next = r->open;
		r->open = v;
		r->nopen++;
		ts_metrics_fleet_receives(r->metrics, 1, 0);
	}
	ts_mutex_unlock(&r->mu);
	if (full) {
		json_decref(answer);
		ts_error_set(&err, TS_RESOURCE_EXHAUSTED, "RECEIVES",
		             "%d receives are open already", TS_FLEET_RECV_MAX);
		goto fail;
	}
	ts_log(TS_LOG_INFO, "\"event\":\"fleet_receive\",\"result\":\"open\"",
	       "fleet receive %s of array '%s' (%llu bytes) open%s%s", id, json_string_value(
	           json_object_get(body, "out")), (unsigned long long)wire.nbytes,
	       fwd ? ", forwarding to peer " : "", fwd ? next.host : "");
	ts_reply_json(reply, TS_HTTP_CREATED, answer);
	json_decref(body);
	return;
fail:
	if (v && v->set)
		recv_drop(v, srv->fleet_ucx);   /* a ticket may be out */
	else if (v)
		recv_free(v);
	json_decref(body);
	ts_reply_error(reply, &err);
}

/* The answer for receive id that is not open: its peer's failure, or 404. */
static void not_open(struct ts_server *srv, const char *id, bool forget, struct ts_reply *reply)
{
	struct ts_error err;

	ts_error_clear(&err);
	if (srv->fleet_recv && ended_take(srv->fleet_recv, id, 0, !forget, &err)) {
		if (forget)
			ts_reply_json(reply, TS_HTTP_OK, json_object());
		else
			ts_reply_error(reply, &err);
		return;
	}
	ts_reply_fail(reply, TS_NOT_FOUND, "RECEIVE_NOT_FOUND",
	              "receive '%s' is not open (never made, committed, aborted or expired)", id);
}

static struct recv *taken_or_fail(struct ts_server *srv, const struct ts_call *call,
                                  struct ts_reply *reply)
{
	const char *id = ts_call_param(call, "receive");
	struct recv *v = srv->fleet_recv ? take(srv->fleet_recv, id, 0) : NULL;

	if (!v)
		not_open(srv, id, true, reply);
	return v;
}

/* Unlinks receive id once all its bytes have landed (waiting a while for
 * the last ones): it, or NULL with the answer given. */
static struct recv *take_landed(struct ts_server *srv, const char *id, struct ts_reply *reply)
{
	struct ts_fleet_recv *r = srv->fleet_recv;
	struct timespec until;
	struct recv *v;
	uint64_t got = 0, want = 0;

	if (!r) {
		not_open(srv, id, false, reply);
		return NULL;
	}
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += COMMIT_LAND_WAIT_S;
	ts_mutex_lock(&r->mu);
	for (;;) {
		for (v = r->open; v && strcmp(v->id, id) != 0; v = v->next)
			;
		if (!v || (v->received == v->length && v->landing == 0))
			break;
		got = v->received;
		want = v->length;
		if (ts_mutex_wait(&r->mu, &r->landed, &until) != 0) {
			v = NULL;
			break;
		}
	}
	if (v)
		unlink_locked(r, v);
	ts_mutex_unlock(&r->mu);
	if (!v && want)
		ts_reply_fail(reply, TS_FAILED_PRECONDITION, "RECEIVE_INCOMPLETE",
		              "receive '%s' has %llu of its %llu bytes; commit once all are sent", id,
		              (unsigned long long)got, (unsigned long long)want);
	else if (!v)
		not_open(srv, id, false, reply);
	return v;
}

/* Publishes the receive v (taken, every byte there) by its move, an
 * operation, and answers it (the array with ?wait=true); frees v. A small
 * array received in place (its bytes came with the request) is published
 * on this thread: the move has nothing to copy, and a worker's hand-off
 * and the waiting connection's wake would cost more than the publish. */
static void commit_reply(struct ts_server *srv, const struct ts_call *call, struct recv *v,
                         struct ts_reply *reply)
{
	bool here = v->in_place && v->length <= TS_FLEET_RECV_INLINE_MAX;
	struct ts_operation *op = NULL;
	struct ts_error err;
	uint64_t wait_ns = 0;
	ts_status st;

	ts_error_clear(&err);
	st = ts_job_move_start(v->jm, here, &op, &err);
	v->jm = NULL;
	if (st == TS_OK)
		ts_metrics_fleet_bytes(srv->metrics, false, ts_array_desc(v->staging)->nbytes);
	ts_log(st == TS_OK ? TS_LOG_INFO : TS_LOG_WARN,
	       "\"event\":\"fleet_receive\",\"result\":\"commit\"",
	       "fleet receive %s of array '%s' committed%s%s", v->id, v->out,
	       st == TS_OK ? "" : ": ", st == TS_OK ? "" : err.message);
	recv_free(v);
	if (st != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	ts_operation_unref(op);
}

void ts_s_fleet_receive_commit(struct ts_server *srv, const struct ts_call *call,
                               struct ts_reply *reply)
{
	struct recv *v = take_landed(srv, ts_call_param(call, "receive"), reply);

	if (!v)
		return;
	/* the bytes are there (the peer flushed before it asked): the receive
	 * leaves its endpoint, and UCX lets go of the memory */
	ts_fleet_ucx_release(srv->fleet_ucx, tag_of(v), NULL, NULL);
	commit_reply(srv, call, v, reply);
}

void ts_s_fleet_receive_abort(struct ts_server *srv, const struct ts_call *call,
                              struct ts_reply *reply)
{
	struct recv *v = taken_or_fail(srv, call, reply);

	if (!v)
		return;
	ts_log(TS_LOG_INFO, "\"event\":\"fleet_receive\",\"result\":\"abort\"",
	       "fleet receive %s of array '%s' aborted", v->id, v->out);
	recv_drop(v, srv->fleet_ucx);
	ts_reply_json(reply, TS_HTTP_OK, json_object());
}

/* Longest wait of GET /v1/fleet/receives/{id}?wait_ms=. */
#define STATUS_WAIT_MAX_MS 60000

void ts_s_fleet_receive_get(struct ts_server *srv, const struct ts_call *call,
                            struct ts_reply *reply)
{
	struct ts_fleet_recv *r = srv->fleet_recv;
	const char *id = ts_call_param(call, "receive"), *w = ts_call_query(call, "wait_ms");
	uint64_t received = 0, length = 0, fdone = 0, until;
	char fhost[128] = "";
	bool found = false, complete = false, over = false, failed = false;
	struct ts_error ferr;
	json_t *answer, *fj = NULL;
	char *end = NULL;
	long wait_ms = w ? strtol(w, &end, 10) : 0;

	ts_error_clear(&ferr);
	if (w && (end == w || *end || wait_ms < 0 || wait_ms > STATUS_WAIT_MAX_MS)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_QUERY",
		              "wait_ms must be a whole number of milliseconds from 0 to %d",
		              STATUS_WAIT_MAX_MS);
		return;
	}
	until = ts_now_ns() + (uint64_t)wait_ms * 1000000ull;
	if (!r) {
		not_open(srv, id, false, reply);
		return;
	}
	ts_mutex_lock(&r->mu);
	for (;;) {
		struct recv *v;
		struct timespec t;

		for (v = r->open; v && strcmp(v->id, id) != 0; v = v->next)
			;
		found = v != NULL;
		if (!v)
			break;
		received = v->received;
		length = v->length;
		if (v->fwd) {
			ts_fleet_fwd_state(v->fwd, &fdone, &over, &failed, &ferr);
			snprintf(fhost, sizeof fhost, "%s", ts_fleet_fwd_host(v->fwd));
		}
		complete = received == length && v->landing == 0 && (!v->fwd || over);
		if (complete || ts_now_ns() >= until)
			break;
		/* a forwarder's progress does not signal: look again in 5 ms */
		clock_gettime(CLOCK_MONOTONIC, &t);
		t.tv_nsec += 5000000L;
		if (t.tv_nsec >= 1000000000L) {
			t.tv_sec++;
			t.tv_nsec -= 1000000000L;
		}
		(void)ts_mutex_wait(&r->mu, &r->landed, &t);
	}
	ts_mutex_unlock(&r->mu);
	if (!found) {
		not_open(srv, id, false, reply);
		return;
	}
	if (fhost[0]) {
		json_t *e = failed ? ts_error_to_json(&ferr, 0) : NULL;

		fj = json_pack("{s:s, s:I, s:s, s:O?}", "host", fhost, "bytes_done", (json_int_t)fdone,
		               "state", failed ? "failed" : over ? "done" : "sending", "error",
		               json_object_get(e, "error"));
		json_decref(e);
	}
	answer = json_pack("{s:s, s:I, s:I, s:b, s:o*}", "id", id, "length", (json_int_t)length,
	                   "received", (json_int_t)received, "complete", complete, "forward", fj);
	if (!answer) {
		ts_error_oom(&ferr, "no memory for the state of receive '%s'", id);
		ts_reply_error(reply, &ferr);
		return;
	}
	ts_reply_json(reply, TS_HTTP_OK, answer);
}
