/*
 * operations.c - the operation resource (AIP-151): GET /v1/operations
 * (newest first, filtered by state, paged by opaque tokens),
 * GET /v1/operations/{operation} (with an ETag for conditional GETs),
 * POST /v1/operations/{operation}:cancel, DELETE /v1/operations/{operation}
 * for finished ones, and the rendering other handlers use to answer with an
 * operation.
 */
#include "handlers/operations.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/page_token.h"
#include "common/units.h"
#include "handlers/handlers.h"

#define PAGE_SIZE_DEFAULT 100
#define PAGE_SIZE_MAX 1000

/* RFC 3339 UTC with microseconds; NULL for 0 (not yet), so that json_pack's
 * "s:o*" leaves the member out. */
static json_t *time_json(uint64_t ns)
{
	char buf[48];

	return ts_format_rfc3339(buf, sizeof buf, ns) ? json_string(buf) : NULL;
}

static json_t *progress_json(const struct ts_op_snapshot *s)
{
	bool steps = strcmp(s->unit, "steps") == 0;

	return json_pack("{s:I, s:I}", steps ? "steps_done" : "bytes_done",
	                 (json_int_t)s->done_units, steps ? "steps_total" : "bytes_total",
	                 (json_int_t)s->total_units);
}

/* The google.rpc.Status of a failed or cancelled operation (the "error"
 * member of ts_error_to_json's body). */
static json_t *status_json(const struct ts_error *err)
{
	json_t *body = ts_error_to_json(err, 0), *status;

	status = json_incref(json_object_get(body, "error"));
	json_decref(body);
	return status;
}

json_t *ts_h_operation_json(const struct ts_operation *op)
{
	struct ts_op_snapshot s;
	char name[64];
	json_t *o, *meta;

	ts_operation_snapshot(op, &s);
	snprintf(name, sizeof name, "operations/%s", s.id);
	meta = json_pack("{s:s, s:s, s:s, s:s, s:o*, s:o*, s:o*, s:o*}",
	                 "@type", TS_OP_METADATA_TYPE, "id", s.id, "kind", s.kind,
	                 "state", ts_op_state_name(s.state), "progress", progress_json(&s),
	                 "create_time", time_json(s.create_ns), "start_time", time_json(s.start_ns),
	                 "end_time", time_json(s.end_ns));
	if (meta && s.target[0])
		json_object_set_new(meta, "target", json_string(s.target));
	/* what a run that stopped early did, for the client to continue */
	if (meta && s.partial)
		json_object_set(meta, "partial_result", s.partial);
	/* how the work was done (a move's path), never replacing a member above */
	if (meta && s.details)
		json_object_update_missing(meta, s.details);
	o = json_pack("{s:s, s:o*, s:b}", "name", name, "metadata", meta, "done", s.done);
	if (o && (s.state == TS_OP_FAILED || s.state == TS_OP_CANCELLED))
		json_object_set_new(o, "error", status_json(&s.error));
	if (o && s.state == TS_OP_SUCCEEDED)
		json_object_set(o, "response", s.result ? s.result : json_object());
	ts_op_snapshot_release(&s);
	return o;
}

void ts_h_reply_operation(struct ts_reply *reply, struct ts_operation *op, bool finished)
{
	char loc[96];

	ts_reply_json(reply, finished ? TS_HTTP_OK : TS_HTTP_ACCEPTED, ts_h_operation_json(op));
	if (finished || reply->kind != TS_REPLY_JSON)
		return;
	snprintf(loc, sizeof loc, "/v1/operations/%s", ts_operation_id(op));
	ts_reply_header(reply, "Location", loc);
}

/* The operation named by the path (new reference), or NULL after a 404. */
static struct ts_operation *operation_from_path(const struct ts_call *call,
                                                struct ts_reply *reply)
{
	const char *id = ts_call_param(call, "operation");
	struct ts_operation *op = id ? ts_op_get(call->core->env.operations, id) : NULL;

	if (!op)
		ts_reply_fail(reply, TS_NOT_FOUND, "OPERATION_NOT_FOUND",
		              "operation '%.128s' not found", id ? id : "");
	return op;
}

/* ---- GET /v1/operations ----------------------------------------------------------- */

/* A page token (common/page_token.h): the sequence number of the last
 * operation listed, for the state filter it was made for. */
static void token_scope(char *buf, size_t cap, int only)
{
	snprintf(buf, cap, "operations state=%s",
	         only < 0 ? "" : ts_op_state_name((enum ts_op_state)only));
}

static void token_write(char *buf, size_t cap, uint64_t seq, int only)
{
	unsigned char pos[8];
	char scope[48];

	for (int i = 0; i < 8; i++)
		pos[i] = (unsigned char)(seq >> (56 - 8 * i));
	token_scope(scope, sizeof scope, only);
	ts_page_token_write(buf, cap, scope, pos, sizeof pos);
}

/* The sequence number a token resumes after, when it is one this server
 * wrote for the same state filter. */
static bool token_read(const char *t, int only, uint64_t *seq)
{
	unsigned char pos[8];
	char scope[48];

	token_scope(scope, sizeof scope, only);
	if (ts_page_token_read(t, scope, pos, sizeof pos) != (long)sizeof pos)
		return false;
	*seq = 0;
	for (int i = 0; i < 8; i++)
		*seq = *seq << 8 | pos[i];
	return *seq != 0;
}

void ts_h_operations_list(const struct ts_call *call, struct ts_reply *reply)
{
	const char *state_s = ts_call_query(call, "state"), *size_s = ts_call_query(call, "page_size");
	const char *token = ts_call_query(call, "page_token");
	enum ts_op_state state;
	struct ts_operation **ops;
	struct ts_error err;
	long page = PAGE_SIZE_DEFAULT;
	uint64_t before = 0;
	int only = -1;
	json_t *list, *root;
	bool more;
	size_t n;

	ts_error_clear(&err);
	if (size_s && !ts_parse_long(size_s, 1, PAGE_SIZE_MAX, &page)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_PAGE_SIZE",
		              "page_size '%.64s' is not an integer in 1..%d", size_s, PAGE_SIZE_MAX);
		return;
	}
	if (state_s && *state_s && !ts_op_state_parse(state_s, &state)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_STATE",
		              "state '%.64s' is not one of PENDING, RUNNING, SUCCEEDED, FAILED, "
		              "CANCELLED", state_s);
		return;
	}
	if (state_s && *state_s)
		only = (int)state;
	if (token && *token && !token_read(token, only, &before)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_PAGE_TOKEN",
		              "page_token '%.64s' is not one this server gave for this listing "
		              "(the next_page_token of an earlier page, with the same state)", token);
		return;
	}
	if (ts_op_list_before(call->core->env.operations, only, before, (size_t)page, &ops, &n, &more,
	                      &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	list = json_array();
	for (size_t i = 0; list && i < n; i++)
		json_array_append_new(list, ts_h_operation_json(ops[i]));
	root = json_pack("{s:o*}", "operations", list);
	if (root && more && n) {
		char next[TS_PAGE_TOKEN_MAX];

		token_write(next, sizeof next, ts_operation_seq(ops[n - 1]), only);
		json_object_set_new(root, "next_page_token", json_string(next));
	}
	ts_op_list_free(ops, n);
	ts_reply_json(reply, TS_HTTP_OK, root);
}

/* ---- GET /v1/operations/{operation} ------------------------------------------------ */

void ts_h_operations_get(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_operation *op = operation_from_path(call, reply);
	json_t *body;

	if (!op)
		return;
	body = ts_h_operation_json(op);
	ts_operation_unref(op);
	ts_reply_json_tagged(reply, body);
}

/* ---- POST /v1/operations/{operation}:cancel ---------------------------------------- */

void ts_h_operations_cancel(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_operation *op = operation_from_path(call, reply);
	struct ts_error err;

	if (!op)
		return;
	ts_error_clear(&err);
	if (ts_operation_cancel(op, &err) != TS_OK)
		ts_reply_error(reply, &err);
	else
		ts_reply_json(reply, TS_HTTP_OK, ts_h_operation_json(op));
	ts_operation_unref(op);
}

/* ---- DELETE /v1/operations/{operation} --------------------------------------------- */

/* A finished operation is forgotten (AIP-151 DeleteOperation); one still
 * pending or running is FAILED_PRECONDITION: the client must first change
 * the system's state (cancel it, or wait for it), so retrying as is would
 * fail again, which is what that code says (ABORTED would invite a retry). */
void ts_h_operations_delete(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_operation *op = operation_from_path(call, reply);
	struct ts_error err;

	if (!op)
		return;
	ts_error_clear(&err);
	if (ts_op_remove(call->core->env.operations, op, &err) != TS_OK)
		ts_reply_error(reply, &err);
	else
		ts_reply_json(reply, TS_HTTP_OK, json_object());
	ts_operation_unref(op);
}
