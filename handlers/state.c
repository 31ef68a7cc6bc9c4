/*
 * state.c - what a restart keeps: the persist marks of arrays and models
 * (POST /v1/arrays/{array}:persist and :unpersist, POST
 * /v1/models/{model}:persist and :unpersist, ?persist= on uploads and
 * imports) and the state dir itself (GET /v1/state, POST /v1/state:save,
 * an operation). The saving and restoring are jobs/state.c's.
 *
 * Without --state-dir nothing can be kept: asking to persist (a mark set,
 * a save) is 400 FAILED_PRECONDITION NO_STATE_DIR; clearing a mark is
 * always allowed.
 */
#include "handlers/arrays_int.h"

#include <string.h>

#include "handlers/operations.h"
#include "jobs/state.h"
#include "train/model.h"

static ts_status need_state_dir(const struct ts_core *core, struct ts_error *err)
{
	if (core->state)
		return TS_OK;
	return ts_error_set(err, TS_FAILED_PRECONDITION, "NO_STATE_DIR",
	                    "tstaged runs without --state-dir: nothing is kept across restarts");
}

ts_status ts_h_persist_query(const struct ts_call *call, int *persist, struct ts_error *err)
{
	const char *q = ts_call_query(call, "persist");

	*persist = q ? strcmp(q, "true") == 0 : -1;
	return *persist > 0 ? need_state_dir(call->core, err) : TS_OK;
}

static void array_mark(const struct ts_call *call, struct ts_reply *reply, bool on)
{
	const char *name = ts_h_array_name(call, reply);
	struct ts_array *a;
	struct ts_error err;

	if (!name)
		return;
	ts_error_clear(&err);
	if ((on && need_state_dir(call->core, &err) != TS_OK) ||
	    ts_catalog_set_persist(call->core->env.catalog, name, on, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	a = ts_catalog_get(call->core->env.catalog, name);
	if (!a) {
		ts_reply_fail(reply, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found", name);
		return;
	}
	ts_h_reply_array(reply, a, false);
	ts_array_unref(a);
}

void ts_h_arrays_persist(const struct ts_call *call, struct ts_reply *reply)
{
	array_mark(call, reply, true);
}

void ts_h_arrays_unpersist(const struct ts_call *call, struct ts_reply *reply)
{
	array_mark(call, reply, false);
}

static void model_mark(const struct ts_call *call, struct ts_reply *reply, bool on)
{
	const char *name = ts_call_param(call, "model");
	struct ts_model m;
	struct ts_error err;

	ts_error_clear(&err);
	if (on && need_state_dir(call->core, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	if (!name || !ts_model_registry_get(call->core->env.models, name, &m) ||
	    !ts_model_registry_set_persist(call->core->env.models, m.uid, on) ||
	    !ts_model_registry_get(call->core->env.models, name, &m)) {
		ts_reply_fail(reply, TS_NOT_FOUND, "MODEL_NOT_FOUND", "model '%s' not found",
		              name ? name : "");
		return;
	}
	ts_reply_json(reply, TS_HTTP_OK, ts_render_model(&m));
}

void ts_h_models_persist(const struct ts_call *call, struct ts_reply *reply)
{
	model_mark(call, reply, true);
}

void ts_h_models_unpersist(const struct ts_call *call, struct ts_reply *reply)
{
	model_mark(call, reply, false);
}

void ts_h_state_get(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_error err;

	ts_error_clear(&err);
	if (need_state_dir(call->core, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	ts_reply_json(reply, TS_HTTP_OK, ts_state_render(call->core->state));
}

void ts_h_state_save(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_operation *op = NULL;
	struct ts_error err;
	uint64_t wait_ns = 0;

	ts_error_clear(&err);
	if (need_state_dir(call->core, &err) != TS_OK ||
	    ts_job_state_save_submit(call->core->state, &op, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	ts_operation_unref(op);
}
