/*
 * moves.c - device_put and copy: POST /v1/arrays/{array}:put moves an array
 * to a new sharding or memory kind under the same name; POST
 * /v1/arrays/{array}:copy makes a new array. Both run as operations.
 *
 * The move itself is storage/move.h's (admission before the operation
 * starts, shared shards, publish only over the version read, metadata
 * kept), run as an operation by jobs/move.h; this file parses the request
 * and answers. A :copy
 * onto an existing array needs "overwrite": true (else 409 ALREADY_EXISTS);
 * "donate" belongs to :copy (the source is deleted when the copy is
 * published) and is refused on :put. A target held by a running operation
 * is refused at once (409 ABORTED naming it). Both take "dtype" to convert
 * the elements on the way (float32, bfloat16, float16, as jnp.astype).
 */
#include "handlers/arrays_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/operations.h"
#include "formats/convert.h"
#include "handlers/sharding_json.h"
#include "jobs/move.h"

/* The destination placement: {"sharding": obj | name} or {"device", "memory_kind"}. */
static ts_status move_placement(const struct ts_core *core, const struct ts_array *src,
                                json_t *body, struct ts_placement *pl, struct ts_error *err)
{
	json_t *sh = json_object_get(body, "sharding");
	json_t *dev = json_object_get(body, "device"), *kind = json_object_get(body, "memory_kind");

	if (sh && (dev || kind))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "give either \"sharding\" or \"device\"/\"memory_kind\", not both");
	if (sh) {
		pl->committed = true;
		return ts_h_sharding_resolve(core, sh, &pl->sharding, err);
	}
	if ((dev && !json_is_string(dev)) || (kind && !json_is_string(kind)))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"device\" and \"memory_kind\" are strings");
	if (!dev && !kind)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "a move needs \"sharding\", \"device\" or \"memory_kind\"");
	if (!dev) {
		/* only the memory kind changes: the same devices and boxes (with_memory_kind) */
		enum ts_memory_kind k;

		if (!ts_memory_kind_parse(json_string_value(kind), &k))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
			                    "memory_kind '%s' is not one of device, pinned_host, unpinned_host",
			                    json_string_value(kind));
		ts_sharding_with_memory_kind(&ts_array_placement(src)->sharding, k, &pl->sharding);
		pl->committed = true;
		return TS_OK;
	}
	return ts_h_placement(core, json_string_value(dev), json_string_value(kind), pl, err);
}

/* "dtype": the destination's element type (absent: the source's). */
static ts_status move_dtype(const struct ts_array *src, json_t *v, struct ts_move_spec *spec,
                            struct ts_error *err)
{
	enum ts_dtype from = ts_array_desc(src)->dtype;
	char names[TS_DTYPE_NAMES_MAX];

	spec->dtype = from;
	if (!v)
		return TS_OK;
	if (!json_is_string(v) || !ts_dtype_parse(json_string_value(v), &spec->dtype))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE",
		                    "\"dtype\" must be a dtype name, one of %s",
		                    ts_dtype_names(names, sizeof names));
	if (!ts_convert_supported(from, spec->dtype))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "UNSUPPORTED_CONVERSION",
		                    "array '%s' is %s and cannot be converted to %s: moves convert "
		                    "between float32, bfloat16 and float16", ts_array_name(src),
		                    ts_dtype_name(from), ts_dtype_name(spec->dtype));
	spec->convert = spec->dtype != from;
	return TS_OK;
}

/* "hosts": distinct strings, none this node's (duplicates and self are
 * refused here; unknown hosts by the hook, naming them). */
static ts_status fleet_hosts(const struct ts_call *call, json_t *hosts, const char **out,
                             size_t *n, struct ts_error *err)
{
	size_t i, j;
	json_t *h;

	if (!json_is_array(hosts) || json_array_size(hosts) == 0 ||
	    json_array_size(hosts) > TS_FLEET_BROADCAST_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"hosts\" is a list of 1 to %d nodes of the fleet (their hosts "
		                    "as GET /v1/fleet lists them)", TS_FLEET_BROADCAST_MAX);
	json_array_foreach(hosts, i, h) {
		if (!json_is_string(h) || !json_string_length(h))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
			                    "\"hosts\"[%zu] is not a host name", i);
		out[i] = json_string_value(h);
		if (strcmp(out[i], call->core->host) == 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_HOST",
			                    "\"hosts\"[%zu] '%s' is this node: a broadcast goes to "
			                    "other nodes", i, out[i]);
		for (j = 0; j < i; j++)
			if (strcmp(out[j], out[i]) == 0)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "DUPLICATE_HOST",
				                    "\"hosts\" names '%s' twice", out[i]);
	}
	*n = i;
	return TS_OK;
}

/* A copy or put to another node ("host"), or a copy to several ("hosts"):
 * placement and dtype are the destination's to resolve, so they travel as
 * given (server/fleet_xfer.h). */
static ts_status fleet_start(const struct ts_call *call, struct ts_array *src, json_t *body,
                             const char *name, const struct ts_move_spec *spec, bool is_copy,
                             struct ts_operation **op, struct ts_error *err)
{
	json_t *host = json_object_get(body, "host"), *hosts = json_object_get(body, "hosts"), *pl;
	json_t *partial = json_object_get(body, "partial_ok");
	const char *list[TS_FLEET_BROADCAST_MAX];
	struct ts_fleet_copy_req req = {0};
	ts_status st;

	if (host && hosts)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "give either \"host\" (one node) or \"hosts\" (a broadcast), "
		                    "not both");
	if (hosts && !is_copy)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"hosts\" is for :copy (a broadcast); a :put moves the array "
		                    "to one \"host\"");
	if (partial && (!hosts || !json_is_boolean(partial)))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"partial_ok\" is a boolean, and only for a broadcast "
		                    "(\"hosts\")");
	if (hosts) {
		if (fleet_hosts(call, hosts, list, &req.nhosts, err) != TS_OK)
			return err->status;
		req.hosts = list;
		req.partial_ok = json_is_true(partial);
	} else if (!json_is_string(host) || !json_string_length(host)) {
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"host\" names a node of the fleet (its host as GET /v1/fleet "
		                    "lists it)");
	}
	if (spec->donate)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"donate\" is for a copy on this node; a :put with \"host\" "
		                    "moves the array to that node");
	if (!call->core->fleet_copy)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "NO_FLEET",
		                    "this daemon has no fleet (--peers or --peers-dns) to copy to "
		                    "host '%s'", host ? json_string_value(host) : list[0]);
	pl = json_object();
	if (!pl)
		return ts_error_oom(err, "no memory for a copy");
	for (const char *const *k = (const char *const[]){"sharding", "device", "memory_kind", NULL};
	     *k; k++)
		if (json_object_get(body, *k))
			json_object_set(pl, *k, json_object_get(body, *k));
	req.host = hosts ? NULL : json_string_value(host);
	req.out = name;
	req.placement = pl;
	req.dtype = ts_dtype_name(spec->dtype);
	req.overwrite = spec->overwrite;
	req.put = !is_copy;
	st = call->core->fleet_copy(call->core->fleet_cls, src, &req, op, err);
	json_decref(pl);
	return st;
}

static void move_start(const struct ts_call *call, struct ts_reply *reply, bool is_copy)
{
	struct ts_array *src = ts_h_array_from_path(call, reply);
	struct ts_operation *op = NULL;
	struct ts_move_spec spec = {0};
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *donate, *out, *overwrite, *host;
	const char *name;
	uint64_t wait_ns = 0;

	ts_error_clear(&err);
	if (!src)
		return;
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(body)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "body: %s",
		             body ? "must be a JSON object" : jerr.text);
		goto out_fail;
	}
	{
		const char *k;
		json_t *v;

		json_object_foreach(body, k, v) {
			if (strcmp(k, "sharding") && strcmp(k, "device") && strcmp(k, "memory_kind") &&
			    strcmp(k, "dtype") && strcmp(k, "host") && strcmp(k, "hosts") &&
			    strcmp(k, "partial_ok") &&
			    !(is_copy && (strcmp(k, "out") == 0 || strcmp(k, "donate") == 0 ||
			                  strcmp(k, "overwrite") == 0))) {
				if (!is_copy && strcmp(k, "donate") == 0)
					ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
					             "\"donate\" is for :copy; a :put replaces the array's "
					             "version, and the old buffers go when their last reader "
					             "lets go");
				else
					ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
					             "unknown field '%s'; a %s takes \"sharding\" or \"device\"/"
					             "\"memory_kind\", \"dtype\", \"host\"%s", k, is_copy ? ":copy" : ":put",
					             is_copy ? ", \"hosts\", \"partial_ok\", \"out\", "
					                       "\"overwrite\" and \"donate\"" : "");
				goto out_fail;
			}
		}
	}
	donate = json_object_get(body, "donate");
	overwrite = json_object_get(body, "overwrite");
	out = json_object_get(body, "out");
	if ((donate && !json_is_boolean(donate)) || (overwrite && !json_is_boolean(overwrite))) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "\"%s\" is a boolean",
		             donate && !json_is_boolean(donate) ? "donate" : "overwrite");
		goto out_fail;
	}
	name = is_copy ? json_string_value(out) : ts_array_name(src);
	if (is_copy && !ts_array_name_valid(name)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
		             "\"out\" must name the new array (^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$)");
		goto out_fail;
	}
	if (move_dtype(src, json_object_get(body, "dtype"), &spec, &err) != TS_OK)
		goto out_fail;
	/* to other nodes; "partial_ok" alone is refused there, named */
	host = json_object_get(body, "host");
	if (!host)
		host = json_object_get(body, "hosts");
	if (!host)
		host = json_object_get(body, "partial_ok");
	spec.overwrite = json_is_true(overwrite);
	spec.donate = json_is_true(donate);
	if (host) {
		if (fleet_start(call, src, body, name, &spec, is_copy, &op, &err) != TS_OK)
			goto out_fail;
		goto answer;
	}
	if (!json_object_get(body, "sharding") && !json_object_get(body, "device") &&
	    !json_object_get(body, "memory_kind") && spec.convert)
		spec.placement = *ts_array_placement(src);   /* a conversion where it is */
	else if (move_placement(call->core, src, body, &spec.placement, &err) != TS_OK)
		goto out_fail;
	spec.name = name;
	/* refusals the publish would meet are answered now, then admission */
	if (ts_job_move_submit(&call->core->env, src, &spec, is_copy, &op, &err) != TS_OK)
		goto out_fail;
answer:
	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	goto out_free;

out_fail:
	ts_reply_error(reply, &err);
out_free:
	ts_operation_unref(op);
	ts_array_unref(src);
	json_decref(body);
}

void ts_h_arrays_put_sharding(const struct ts_call *call, struct ts_reply *reply)
{
	move_start(call, reply, false);
}

void ts_h_arrays_copy(const struct ts_call *call, struct ts_reply *reply)
{
	move_start(call, reply, true);
}
