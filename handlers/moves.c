/*
 * moves.c - device_put and copy: POST /v1/arrays/{array}:put moves an array
 * to a new sharding or memory kind under the same name; POST
 * /v1/arrays/{array}:copy makes a new array. Both run as operations.
 *
 * The destination is admitted (allocated) before the operation starts, so a
 * move that cannot fit is refused at once. Shards that a put leaves exactly
 * where they are (same device, memory kind and box) are shared with the old
 * version, not copied (versions are immutable); the rest is copied shard to shard in chunks, with
 * progress, and cancellation between chunks. Readers see the old version
 * until the switch, which happens only if the array was not replaced
 * meanwhile; a failed or cancelled move leaves it whole where it was. The
 * old buffers go when the last reader lets go of the old version.
 */
#include "handlers/arrays_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/operations.h"
#include "handlers/sharding_json.h"
#include "storage/array_io.h"
#include "storage/operation.h"

struct move {
	const struct ts_core *core;
	struct ts_array *src;                 /* own reference: the version being moved */
	struct ts_array *dst;                 /* own reference: unpublished until done */
	bool shared[TS_MESH_MAX_DEVICES];     /* dst shards that reuse src buffers */
	bool rename;                          /* copy: publish under the new name */
	bool donate;                          /* copy: delete the source when done */
	char src_etag[32];
};

static void move_progress(void *arg, uint64_t bytes)
{
	ts_operation_progress_add(arg, bytes);
}

static bool move_cancelled(void *arg)
{
	return ts_operation_cancelled(arg);
}

static ts_status move_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct move *m = arg;
	struct ts_run whole = {0, 0, ts_array_desc(m->src)->nbytes};
	struct ts_precondition same = {.if_match = m->src_etag};
	ts_status s;

	s = ts_array_copy(m->core->stager, m->dst, m->shared, m->src, &whole, 1, move_progress,
	                  move_cancelled, op, err);
	if (s != TS_OK)
		return s;
	if (ts_operation_cancelled(op))
		return ts_error_set(err, TS_CANCELLED, "CANCELLED", "the move was cancelled");
	if (m->rename) {
		s = ts_catalog_put(m->core->catalog, m->dst, NULL, NULL, err);
		if (s == TS_OK && m->donate) {
			struct ts_error ignore;

			ts_error_clear(&ignore);
			(void)ts_catalog_delete(m->core->catalog, ts_array_name(m->src), &same, &ignore);
		}
	} else {
		s = ts_catalog_put(m->core->catalog, m->dst, &same, NULL, err);
		if (s == TS_FAILED_PRECONDITION) {
			ts_error_clear(err);
			s = ts_error_set(err, TS_ABORTED, "ARRAY_CHANGED",
			                 "array '%s' was replaced while it moved; the move was dropped",
			                 ts_array_name(m->src));
		}
	}
	if (s == TS_OK)
		ts_operation_set_result(op, ts_h_array_json(m->dst));
	return s;
}

static void move_release(void *arg)
{
	struct move *m = arg;

	ts_array_unref(m->src);
	ts_array_unref(m->dst);
	free(m);
}

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

static void move_start(const struct ts_call *call, struct ts_reply *reply, bool is_copy)
{
	struct ts_array *src = ts_h_array_from_path(call, reply);
	struct move *m = NULL;
	struct ts_operation *op = NULL;
	struct ts_placement pl;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *donate, *out;
	const char *name;
	uint64_t total = 0, wait_ns = 0;
	int reused = 0;

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
			    strcmp(k, "donate") && !(is_copy && strcmp(k, "out") == 0)) {
				ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
				             "unknown field '%s'", k);
				goto out_fail;
			}
		}
	}
	donate = json_object_get(body, "donate");
	out = json_object_get(body, "out");
	if (donate && !json_is_boolean(donate)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "\"donate\" is a boolean");
		goto out_fail;
	}
	name = is_copy ? json_string_value(out) : ts_array_name(src);
	if (is_copy && !ts_array_name_valid(name)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ARRAY_NAME",
		             "\"out\" must name the new array (^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$)");
		goto out_fail;
	}
	if (move_placement(call->core, src, body, &pl, &err) != TS_OK)
		goto out_fail;
	m = calloc(1, sizeof *m);
	if (!m) {
		ts_error_set(&err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", "no memory for a move");
		goto out_fail;
	}
	m->core = call->core;
	m->rename = is_copy;
	m->donate = is_copy && json_is_true(donate);
	snprintf(m->src_etag, sizeof m->src_etag, "%s", ts_array_etag(src));
	/* admission: the destination is allocated now, or the move is refused; a
	 * put shares the shards that stay where they are, a copy copies all */
	if ((is_copy ? ts_array_new(name, ts_array_desc(src), &pl, call->core->memory, &m->dst, &err)
	             : ts_array_new_like(name, src, &pl, call->core->memory, &m->dst, &reused,
	                                 m->shared, &err)) != TS_OK)
		goto out_fail;
	m->src = src;
	src = NULL;
	for (int i = 0; i < ts_array_nshards(m->dst); i++)
		if (!m->shared[i])
			total += ts_buffer_size(ts_array_shard_buffer(m->dst, i));
	if (ts_op_submit(call->core->operations, is_copy ? "copy" : "put",
	                 ts_array_name(m->src), total, "bytes", move_run, m, move_release, &op,
	                 &err) != TS_OK) {
		move_release(m);     /* not taken by the registry */
		m = NULL;
		goto out_fail;
	}
	m = NULL;
	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	goto out_free;

out_fail:
	ts_reply_error(reply, &err);
out_free:
	if (m)
		move_release(m);
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
