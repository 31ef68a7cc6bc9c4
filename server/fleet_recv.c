/*
 * fleet_recv.c - the receiving end of a cross-node copy (fleet_recv.h).
 *
 * Invariant: a receive in the set owns its staging array (registered with
 * UCX while it is there), its prepared move (the destination allocated) and
 * nothing else; whoever unlinks it under mu frees it, so a commit, an abort
 * and the deadline never both act on one.
 */
#include "server/fleet_recv.h"

#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

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
	void *memh;                        /* the staging buffer's registration */
	uint64_t deadline_ns;
};

struct ts_fleet_recv {
	struct ts_mutex mu;
	struct recv *open;                 /* guarded by: mu */
	int nopen;                         /* guarded by: mu */
	_Atomic uint64_t serials;
	_Atomic int releasing;             /* receives waiting for their endpoint to close */
};

struct ts_fleet_recv *ts_fleet_recv_new(void)
{
	struct ts_fleet_recv *r = calloc(1, sizeof *r);

	if (r && ts_mutex_init(&r->mu) != 0) {
		free(r);
		return NULL;
	}
	return r;
}

static void recv_free(struct recv *v, struct ts_fleet_ucx *u)
{
	if (u)
		ts_fleet_ucx_unmap(u, v->memh);
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

	recv_free(a->v, a->u);
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
		recv_free(v, u);
		return;
	}
	a->v = v;
	a->u = u;
	atomic_fetch_add(&v->set->releasing, 1);
	ts_fleet_ucx_release(u, tag_of(v), released, a);
}

/* Unlinks the receive with this id (or, id NULL, the first past its
 * deadline at now) and returns it, or NULL. */
static struct recv *take(struct ts_fleet_recv *r, const char *id, uint64_t now)
{
	struct recv *v = NULL;

	ts_mutex_lock(&r->mu);
	for (struct recv **pp = &r->open; *pp; pp = &(*pp)->next) {
		if (id ? strcmp((*pp)->id, id) == 0 : (*pp)->deadline_ns <= now) {
			v = *pp;
			*pp = v->next;
			r->nopen--;
			break;
		}
	}
	ts_mutex_unlock(&r->mu);
	return v;
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
	ts_mutex_destroy(&r->mu);
	free(r);
}

static ts_status bad(struct ts_error *err, const char *field, const char *what)
{
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "\"%s\" %s", field, what);
}

/* The receive's request: the array's shape and dtypes and where it goes. */
static ts_status parse(const struct ts_core *core, json_t *body, struct ts_array_desc *wire,
                       struct ts_move_spec *spec, char *out, uint64_t *ttl_s,
                       struct ts_error *err)
{
	static const char *const known[] = {"out", "dtype", "source_dtype", "shape", "sharding",
	                                    "device", "memory_kind", "overwrite",
	                                    "timeout_seconds"};
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
			                    "\"memory_kind\", \"overwrite\" and \"timeout_seconds\"", k);
	}
	v = json_object_get(body, "out");
	if (!json_is_string(v) || !ts_array_name_valid(json_string_value(v)))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
		                    "\"out\" must name the new array "
		                    "(^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$)");
	snprintf(out, TS_ARRAY_NAME_MAX + 1, "%s", json_string_value(v));
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

/* The staging array: host memory of the default device, registered. */
static ts_status stage(struct ts_server *srv, struct recv *v, const struct ts_array_desc *wire,
                       char **rkey, struct ts_error *err)
{
	const struct ts_core *core = &srv->core;
	struct ts_placement pl;
	struct ts_buffer *b;
	char name[TS_ARRAY_NAME_MAX + 1];
	ts_status st;

	snprintf(name, sizeof name, "fleet-receive-%s", v->id + 4);
	ts_placement_single(&pl, core->default_device, TS_MEM_UNPINNED_HOST, true);
	st = ts_array_new(name, wire, &pl, core->env.memory, &v->staging, err);
	if (st != TS_OK)
		return st;
	if (wire->nbytes == 0) {
		/* nothing to write: no memory to register, no key */
		*rkey = calloc(1, 1);
		return *rkey ? TS_OK : ts_error_oom(err, "no memory for a receive");
	}
	b = ts_array_single_buffer(v->staging);
	if (!b || !ts_buffer_host_visible(b))
		return ts_error_set(err, TS_INTERNAL, "STAGING",
		                    "the staging memory of a receive is not host memory");
	return ts_fleet_ucx_map(srv->fleet_ucx, ts_buffer_data(b), (size_t)wire->nbytes, &v->memh,
	                        rkey, err);
}

void ts_s_fleet_receive(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_fleet_recv *r = srv->fleet_recv;
	struct ts_array_desc wire = {0};
	struct ts_move_spec spec = {0};
	struct recv *v = NULL;
	char ticket[TS_FLEET_TICKET_LEN + 1], *rkey = NULL, when[48], id[40];
	unsigned char rnd[16];
	struct ts_error err;
	json_error_t jerr;
	json_t *body, *answer;
	uint64_t ttl_s = 0;
	bool full;

	ts_error_clear(&err);
	if (!srv->fleet_ucx) {
		ts_reply_fail(reply, TS_FAILED_PRECONDITION, "NO_FLEET_PORT",
		              "this daemon has no fleet port: it listens with --peers, --peers-dns "
		              "or --fleet-port");
		return;
	}
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(body)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "body: %s",
		             body ? "must be a JSON object" : jerr.text);
		goto fail;
	}
	v = calloc(1, sizeof *v);
	if (!v) {
		ts_error_oom(&err, "no memory for a receive");
		goto fail;
	}
	if (parse(call->core, body, &wire, &spec, v->out, &ttl_s, &err) != TS_OK)
		goto fail;
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
	v->serial = atomic_fetch_add(&r->serials, 1) + 1;
	memcpy(v->id, "rcv-", 4);
	for (size_t i = 0; i < sizeof rnd; i++)
		snprintf(v->id + 4 + 2 * i, 3, "%02x", rnd[i]);
	/* admission: the staging array, then the destination (both refused now) */
	if (stage(srv, v, &wire, &rkey, &err) != TS_OK)
		goto fail;
	spec.name = v->out;
	if (ts_job_move_prepare(&call->core->env, v->staging, &spec, true, &v->jm, NULL, &err) !=
	        TS_OK ||
	    ts_fleet_ucx_ticket_tagged(srv->fleet_ucx, tag_of(v), ticket, &err) != TS_OK)
		goto fail;
	v->deadline_ns = ts_now_ns() + ttl_s * 1000000000ull;
	ts_format_rfc3339(when, sizeof when, ts_wall_ns() + ttl_s * 1000000000ull);
	/* the answer and the log line first: once linked, the deadline may free v */
	answer = json_pack("{s:s, s:s, s:i, s:I, s:I, s:s, s:s, s:i, s:s}", "id", v->id, "ticket",
	                   ticket, "fleet_port", ts_fleet_ucx_port(srv->fleet_ucx), "address",
	                   (json_int_t)(uintptr_t)(
	                       wire.nbytes ? ts_buffer_data(ts_array_single_buffer(v->staging))
	                                   : NULL),
	                   "length", (json_int_t)wire.nbytes, "rkey", rkey, "expires", when,
	                   "expires_in_seconds", (int)ttl_s, "host", call->core->host);
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
	}
	ts_mutex_unlock(&r->mu);
	if (full) {
		json_decref(answer);
		ts_error_set(&err, TS_RESOURCE_EXHAUSTED, "RECEIVES",
		             "%d receives are open already", TS_FLEET_RECV_MAX);
		goto fail;
	}
	ts_log(TS_LOG_INFO, "\"event\":\"fleet_receive\",\"result\":\"open\"",
	       "fleet receive %s of array '%s' (%llu bytes) open", id, json_string_value(
	           json_object_get(body, "out")), (unsigned long long)wire.nbytes);
	ts_reply_json(reply, TS_HTTP_CREATED, answer);
	free(rkey);
	json_decref(body);
	return;
fail:
	if (v && v->set)
		recv_drop(v, srv->fleet_ucx);   /* a ticket may be out */
	else if (v)
		recv_free(v, srv->fleet_ucx);
	free(rkey);
	json_decref(body);
	ts_reply_error(reply, &err);
}

static struct recv *taken_or_fail(struct ts_server *srv, const struct ts_call *call,
                                  struct ts_reply *reply)
{
	const char *id = ts_call_param(call, "receive");
	struct recv *v = srv->fleet_recv ? take(srv->fleet_recv, id, 0) : NULL;

	if (!v)
		ts_reply_fail(reply, TS_NOT_FOUND, "RECEIVE_NOT_FOUND",
		              "receive '%s' is not open (never made, committed, aborted or expired)",
		              id);
	return v;
}

void ts_s_fleet_receive_commit(struct ts_server *srv, const struct ts_call *call,
                               struct ts_reply *reply)
{
	struct recv *v = taken_or_fail(srv, call, reply);
	struct ts_operation *op = NULL;
	struct ts_error err;
	uint64_t wait_ns = 0;
	ts_status st;

	if (!v)
		return;
	ts_error_clear(&err);
	/* the bytes are there (the peer flushed before it asked): its endpoint
	 * goes, and UCX lets go of the memory */
	ts_fleet_ucx_release(srv->fleet_ucx, tag_of(v), NULL, NULL);
	ts_fleet_ucx_unmap(srv->fleet_ucx, v->memh);
	v->memh = NULL;
	st = ts_job_move_start(v->jm, &op, &err);
	v->jm = NULL;
	if (st == TS_OK)
		ts_metrics_fleet_bytes(srv->metrics, false, ts_array_desc(v->staging)->nbytes);
	ts_log(st == TS_OK ? TS_LOG_INFO : TS_LOG_WARN,
	       "\"event\":\"fleet_receive\",\"result\":\"commit\"",
	       "fleet receive %s of array '%s' committed%s%s", v->id, v->out,
	       st == TS_OK ? "" : ": ", st == TS_OK ? "" : err.message);
	recv_free(v, NULL);
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
