/*
 * models.c - training models over HTTP: POST/GET/DELETE /v1/models,
 * POST /v1/models/{model}:analyze (the memory analysis of a step, before
 * any run), POST /v1/models/{model}:step (run N steps as an operation),
 * POST /v1/models/{model}:evaluate and POST /v1/models/{model}:generate.
 *
 * Each handler parses, calls one job (jobs/model.h, jobs/step.h) and
 * answers; the work - creation's initialisation, steps, evaluations - runs
 * on operation workers in jobs/, never here. A model is known by its uid;
 * its arrays are owned by it (their dtype and shape stay, only it deletes
 * them). A step or evaluation holds the model's arrays from submission to
 * completion (every other writer is refused 409 ABORTED naming it) and a
 * step publishes new versions of what it updated once, as it ends. The
 * parameters' and optimizer state's memory kinds are read from their
 * arrays, so moving "{model}.w1" to pinned_host offloads it; the call may
 * override the activation policy and prefetch depth.
 */
#include "handlers/arrays_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs/model_spec.h"
#include "handlers/operations.h"
#include "handlers/sharding_json.h"
#include "jobs/model.h"
#include "jobs/render.h"
#include "jobs/step.h"
#include "train/model.h"

/* Answers a job's operation: the operation (202), or with ?wait= its
 * result when it ends. Takes the reference to op. */
static void reply_job(const struct ts_call *call, struct ts_reply *reply, struct ts_operation *op)
{
	uint64_t wait_ns = 0;

	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	ts_operation_unref(op);
}

/* ---- creation, listing, deletion ----------------------------------------------- */

/*
 * Creation is an operation (ts_job_model_create_submit): admission (the
 * arrays allocated) on this thread, initialisation on a worker.
 */
void ts_h_models_create(const struct ts_call *call, struct ts_reply *reply)
{
	const struct ts_core *core = call->core;
	struct ts_model m;
	struct ts_model_init init;
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);

	ts_error_clear(&err);
	if (!json_is_object(body)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "body: %s",
		             body ? "must be a JSON object" : jerr.text);
		goto out_fail;
	}
	if (ts_job_model_parse(&core->env, core->default_device, body, &m, &init, &err) != TS_OK)
		goto out_fail;
	if (m.persist && !core->state) {
		ts_error_set(&err, TS_FAILED_PRECONDITION, "NO_STATE_DIR",
		             "tstaged runs without --state-dir: nothing is kept across restarts");
		goto out_fail;
	}
	if (ts_job_model_create_submit(&core->env, &m, &init, &op, &err) != TS_OK)
		goto out_fail;
	reply_job(call, reply, op);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}

static bool model_from_path(const struct ts_call *call, struct ts_reply *reply, struct ts_model *m)
{
	const char *name = ts_call_param(call, "model");

	if (!name || !ts_model_registry_get(call->core->env.models, name, m)) {
		ts_reply_fail(reply, TS_NOT_FOUND, "MODEL_NOT_FOUND", "model '%s' not found",
		              name ? name : "");
		return false;
	}
	return true;
}

/* A ready model from the path; a model still being created is 409 ABORTED
 * naming its creation. */
static bool ready_model_from_path(const struct ts_call *call, struct ts_reply *reply,
                                  struct ts_model *m)
{
	struct ts_error err;

	if (!model_from_path(call, reply, m))
		return false;
	if (m->ready)
		return true;
	ts_error_clear(&err);
	ts_error_set(&err, TS_ABORTED, "MODEL_CREATING",
	             "model '%s' is being created by operation %s; wait for it", m->name,
	             m->creating);
	ts_error_meta(&err, "operation", "%s", m->creating);
	ts_reply_error(reply, &err);
	return false;
}

void ts_h_models_list(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model *all = malloc(1024 * sizeof *all);
	json_t *list = json_array();
	size_t n = all ? ts_model_registry_list(call->core->env.models, all, 1024) : 0;

	for (size_t i = 0; list && i < n; i++)
		json_array_append_new(list, ts_render_model(&all[i]));
	free(all);
	ts_reply_json(reply, TS_HTTP_OK, json_pack("{s:o*}", "models", list));
}

void ts_h_models_get(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;

	if (model_from_path(call, reply, &m))
		ts_reply_json(reply, TS_HTTP_OK, ts_render_model(&m));
}

/*
 * DELETE: the model's arrays (and gradients) go all at once, then the
 * model. While an operation holds them - a step - the delete is refused
 * (409 ABORTED naming it: cancel the step, or wait for it), and nothing
 * changes; a model being created is refused the same way.
 */
void ts_h_models_delete(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;
	struct ts_error err;

	if (!ready_model_from_path(call, reply, &m))
		return;
	ts_error_clear(&err);
	if (ts_job_model_delete(&call->core->env, &m, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	ts_reply_json(reply, TS_HTTP_OK, json_object());
}

/* ---- analysis ------------------------------------------------------------------- */

/*
 * The rows of an analysed batch [B, d] (B), or for a token model [B, T] of
 * token ids of dtype ids ("uint16" or "int32", NULL: int32): B*T rows; sets
 * m's id width. BAD_BATCH when it does not fit.
 */
static ts_status analyze_rows(struct ts_model *m, json_int_t B, json_int_t D, const char *ids,
                              int *rows, struct ts_error *err)
{
	if (!ts_mlp_tokens(&m->mlp)) {
		if (ids)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCH",
			                    "dtype is for token models' ids; model '%s' takes float32",
			                    m->name);
		if (D != m->mlp.d_model || B < 1 || B > (1 << 24))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCH",
			                    "batch [%lld, %lld] does not fit the model: [B >= 1, d_model = %d]",
			                    (long long)B, (long long)D, m->mlp.d_model);
		*rows = (int)B;
		return TS_OK;
	}
	if (ids && strcmp(ids, "uint16") != 0 && strcmp(ids, "int32") != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCH",
		                    "token ids are uint16 or int32, not '%s'", ids);
	if (B < 1 || D < 1 || B > (1 << 24) || D > (1 << 24) || B * D > (1 << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCH",
		                    "batch [%lld, %lld] of token ids does not fit: [B, T >= 1], at most "
		                    "%d tokens", (long long)B, (long long)D, 1 << 24);
	m->mlp.id_bytes = ids && strcmp(ids, "uint16") == 0 ? 2 : 4;
	*rows = (int)(B * D);
	return TS_OK;
}

static ts_status eval_outputs_parse(const struct ts_core *core, json_t *o, bool need_name,
                                    struct ts_job_outputs *s, struct ts_error *err);

/* Parses "accumulate": micro-batches an optimizer step, an integer in
 * 1..TS_PLAN_ACCUMULATE_MAX (absent: 1). BAD_ACCUMULATE otherwise. */
static ts_status accumulate_parse(json_t *v, int *k, struct ts_error *err)
{
	json_int_t n;

	*k = 1;
	if (!v)
		return TS_OK;
	n = json_is_integer(v) ? json_integer_value(v) : 0;
	if (n < 1 || n > TS_PLAN_ACCUMULATE_MAX)
		return ts_error_bad(err, "BAD_ACCUMULATE", NULL,
		                    "accumulate is an integer in 1..%d (micro-batches an optimizer "
		                    "step)", TS_PLAN_ACCUMULATE_MAX);
	*k = (int)n;
	return TS_OK;
}

/* The micro-batches of an analysed step: its rows split in k, whole
 * samples (B of them) each. */
/* rows: of one micro-batch on one device. A data-parallel model's step
 * (replicas R > 1) gives each device its R-th of the batch. */
static ts_status analyze_split(json_int_t B, int k, int R, int *rows, struct ts_error *err)
{
	if (B % k != 0)
		return ts_error_bad(err, "BAD_ACCUMULATE", NULL,
		                    "accumulate %d splits the batch's %lld rows into micro-batches: "
		                    "their count must be a multiple of it", k, (long long)B);
	if (R > 1 && B % ((json_int_t)k * R) != 0)
		return ts_error_bad(err, "BAD_BATCH", NULL,
		                    "the model runs on %d devices: the batch's %lld rows must split "
		                    "into %d equal parts (devices x accumulate)", R, (long long)B,
		                    k * R);
	*rows /= k * (R > 1 ? R : 1);
	return TS_OK;
}

/*
 * The policy a run runs with: the model's activations and prefetch, with
 * params and optimizer state where their arrays are now
 * (ts_job_model_policy). With for_run, the call may override activations
 * and prefetch only (params and state move with :put); :analyze may also
 * ask "what if" they were elsewhere.
 */
static ts_status run_policy(const struct ts_core *core, const struct ts_model *m, json_t *pl,
                            bool for_run, struct ts_policy *out, struct ts_error *err)
{
	if (ts_job_model_policy(&core->env, m, out, err) != TS_OK)
		return err->status;
	if (for_run && pl && (json_object_get(pl, "params") || json_object_get(pl, "opt_state")))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "placement.%s cannot change in a step: a step runs with the "
		                    "model's arrays where they are; move them with :put",
		                    json_object_get(pl, "params") ? "params" : "opt_state");
	if (pl && json_object_get(pl, "activations")) {
		out->save_x = out->save_h = out->offload_x = out->offload_h = false;
		out->save_acts = out->offload_acts = 0;
	}
	return pl ? ts_job_policy_parse(pl, out, err) : ts_policy_check(out, err);
}

/* Whether the call asks for the analysis' timeline (?timeline=true; the
 * route declares it a bool). */
static bool timeline_requested(const struct ts_call *call)
{
	const char *q = ts_call_query(call, "timeline");

	return q && strcmp(q, "true") == 0;
}

void ts_h_models_analyze(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;
	struct ts_policy pol;
	struct ts_plan plan;
	struct ts_error err;
	json_error_t jerr;
	json_t *body, *batch, *pl, *outs = NULL, *modej = NULL, *acc = NULL;
	json_int_t B = 0, D = 0;
	const char *ids = NULL;
	int rows = 0, k = 1;
	const char *mode = "step";
	struct ts_job_outputs ev = {.kind = TS_MEM_DEVICE};
	bool evaluate;

	if (!ready_model_from_path(call, reply, &m))
		return;
	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	pl = NULL;
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s?o, s?o, s?o, s?s, s?o}",
	                            "batch", &batch, "placement", &pl, "mode", &modej, "outputs",
	                            &outs, "dtype", &ids, "accumulate", &acc) != 0 ||
	    json_unpack_ex(batch, &jerr, JSON_STRICT, "[II]", &B, &D) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "analyze body: %s (expected {\"batch\": [B, d]})", jerr.text);
		goto out_fail;
	}
	if (modej && !json_is_string(modej)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_MODE",
		             "mode must be a string: \"step\" or \"evaluate\"");
		goto out_fail;
	}
	if (modej)
		mode = json_string_value(modej);
	if (strcmp(mode, "step") != 0 && strcmp(mode, "evaluate") != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_MODE",
		             "mode '%s' is not one of step, evaluate", mode);
		goto out_fail;
	}
	evaluate = strcmp(mode, "evaluate") == 0;
	if (outs && !evaluate) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "\"outputs\" is for mode evaluate: a step writes no outputs");
		goto out_fail;
	}
	if (acc && evaluate) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_ACCUMULATE",
		             "\"accumulate\" is for mode step: an evaluation has no optimizer step");
		goto out_fail;
	}
	if (outs && eval_outputs_parse(call->core, outs, false, &ev, &err) != TS_OK)
		goto out_fail;
	if (accumulate_parse(acc, &k, &err) != TS_OK)
		goto out_fail;
	if (analyze_rows(&m, B, D, ids, &rows, &err) != TS_OK ||
	    analyze_split(B, k, evaluate ? 1 : m.replicas, &rows, &err) != TS_OK)
		goto out_fail;
	if (run_policy(call->core, &m, pl, false, &pol, &err) != TS_OK)
		goto out_fail;
	if (evaluate ? ts_plan_build_eval(&m.mlp, rows, &pol, ev.outputs, ev.kind, &plan,
	                                  &err) != TS_OK
	             : m.shard_optimizer
	             ? (m.shard_gradients ? ts_plan_build_zero2 : ts_plan_build_zero)(
	                   &m.mlp, &m.opt, rows, k, m.replicas, &pol, &plan, &err) != TS_OK
	             : ts_plan_build_replicated(&m.mlp, &m.opt, rows, k,
	                                        m.replicas > 1 ? m.replicas : 1, &pol, &plan,
	                                        &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_OK, ts_render_plan(&plan, timeline_requested(call)));
	ts_plan_release(&plan);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}

/* POST /v1/models:analyze {"model": <a model as POST /v1/models takes it>,
 * "batch": [B, d]}: the analysis of a model that does not exist yet (nothing
 * is allocated), so a model too large to create can be sized first. */
void ts_h_models_analyze_spec(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;
	struct ts_model_init init;
	struct ts_plan plan;
	struct ts_error err;
	json_error_t jerr;
	json_t *body, *spec = NULL, *batch = NULL, *acc = NULL;
	json_int_t B = 0, D = 0;
	const char *ids = NULL;
	int rows = 0, k = 1;

	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s:o, s?s, s?o}", "model", &spec,
	                            "batch", &batch, "dtype", &ids, "accumulate", &acc) != 0 ||
	    json_unpack_ex(batch, &jerr, JSON_STRICT, "[II]", &B, &D) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "analyze body: %s (expected {\"model\": {...}, \"batch\": [B, d]})", jerr.text);
		goto out_fail;
	}
	if (!json_object_get(spec, "name"))
		json_object_set_new(spec, "name", json_string("analysis"));
	if (ts_job_model_parse(&call->core->env, call->core->default_device, spec, &m, &init,
	                       &err) != TS_OK)
		goto out_fail;
	if (accumulate_parse(acc, &k, &err) != TS_OK)
		goto out_fail;
	if (analyze_rows(&m, B, D, ids, &rows, &err) != TS_OK ||
	    analyze_split(B, k, m.replicas, &rows, &err) != TS_OK)
		goto out_fail;
	if ((m.shard_optimizer
	     ? (m.shard_gradients ? ts_plan_build_zero2 : ts_plan_build_zero)(
	           &m.mlp, &m.opt, rows, k, m.replicas, &m.policy, &plan, &err)
	     : ts_plan_build_replicated(&m.mlp, &m.opt, rows, k, m.replicas > 1 ? m.replicas : 1,
	                                &m.policy, &plan, &err)) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_OK, ts_render_plan(&plan, timeline_requested(call)));
	ts_plan_release(&plan);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}

/* ---- steps ---------------------------------------------------------------------- */

/* Parses "batches": {"batch_size": B, "order": "sequential" | "shuffle",
 * "seed": S, "start": P}, strictly. */
static ts_status batches_parse(json_t *v, struct ts_job_batches *b, struct ts_error *err)
{
	json_error_t jerr;
	json_int_t size = 0, seed = 0, start = 0;
	const char *order = "sequential";

	if (json_unpack_ex(v, &jerr, JSON_STRICT, "{s:I, s?s, s?I, s?I}", "batch_size", &size,
	                   "order", &order, "seed", &seed, "start", &start) != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "batches: %s (expected {\"batch_size\": B, \"order\": \"sequential\" "
		                    "or \"shuffle\", \"seed\": S, \"start\": P})", jerr.text);
	if (size < 1 || size > (1 << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "batches.batch_size is in 1..%d", 1 << 24);
	if (strcmp(order, "sequential") != 0 && strcmp(order, "shuffle") != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "batches.order is \"sequential\" or \"shuffle\"");
	if (seed < 0 || start < 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "batches.%s must not be negative", seed < 0 ? "seed" : "start");
	b->on = true;
	b->shuffle = order[0] == 's' && order[1] == 'h';
	b->size = (uint64_t)size;
	b->seed = (uint64_t)seed;
	b->start = (uint64_t)start;
	return TS_OK;
}

/* Parses "windows": {"array": name, "context": T, "batch_size": B,
 * "order": "sequential" | "random", "seed": S, "start": P}, strictly
 * (jobs/step.h and docs/API.md define the windows). */
static ts_status windows_parse(json_t *v, struct ts_job_windows *w, struct ts_error *err)
{
	json_error_t jerr;
	json_int_t context = 0, size = 0, seed = 0, start = 0;
	const char *array = NULL, *order = "sequential";

	if (json_unpack_ex(v, &jerr, JSON_STRICT, "{s:s, s:I, s:I, s?s, s?I, s?I}", "array", &array,
	                   "context", &context, "batch_size", &size, "order", &order, "seed", &seed,
	                   "start", &start) != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows: %s (expected {\"array\": name, \"context\": T, "
		                    "\"batch_size\": B, \"order\": \"sequential\" or \"random\", "
		                    "\"seed\": S, \"start\": P})", jerr.text);
	if (!ts_array_name_valid(array))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.array must be the name of an array");
	if (context < 1 || context > (1 << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.context is in 1..%d (tokens a window feeds the model)",
		                    1 << 24);
	if (size < 1 || size > (1 << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.batch_size is in 1..%d", 1 << 24);
	if (strcmp(order, "sequential") != 0 && strcmp(order, "random") != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.order is \"sequential\" or \"random\", not '%s'", order);
	if (seed < 0 || start < 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows.%s must not be negative", seed < 0 ? "seed" : "start");
	w->on = true;
	w->random = order[0] == 'r';
	snprintf(w->array, sizeof w->array, "%s", array);
	w->context = (uint64_t)context;
	w->size = (uint64_t)size;
	w->seed = (uint64_t)seed;
	w->start = (uint64_t)start;
	return TS_OK;
}

static ts_status operand_parse(json_t *spec, const char *what, struct ts_job_operand *o,
                               struct ts_error *err);

/* The request's data: "windows", or "inputs" (and "targets"), not both. */
static ts_status run_data_parse(json_t *inputs, json_t *targets, json_t *windows,
                                struct ts_job_run *run, struct ts_error *err)
{
	if (windows && (inputs || targets))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		                    "windows and %s are exclusive: windows read the inputs and the "
		                    "targets from windows.array", inputs ? "inputs" : "targets");
	if (windows)
		return windows_parse(windows, &run->windows, err);
	if (!inputs)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"inputs\" is missing (or \"windows\" of a token stream)");
	if (operand_parse(inputs, "inputs", &run->inputs, err) != TS_OK ||
	    (targets && operand_parse(targets, "targets", &run->targets, err) != TS_OK))
		return err->status;
	return TS_OK;
}

/* Checks "inputs"/"targets": an array name, or {"array": name, "rows":
 * rows} (rows as :gather takes them), strictly; into o (rows borrowed from
 * spec). */
static ts_status operand_parse(json_t *spec, const char *what, struct ts_job_operand *o,
                               struct ts_error *err)
{
	const char *key, *name;
	json_t *v;

	if (json_is_string(spec)) {
		name = json_string_value(spec);
		o->rows = NULL;
	} else {
		if (!json_is_object(spec))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
			                    "%s is an array name or {\"array\": name, \"rows\": [...]}",
			                    what);
		json_object_foreach(spec, key, v) {
			if (strcmp(key, "array") != 0 && strcmp(key, "rows") != 0)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
				                    "%s.%s is not a field this API knows; it takes \"array\" "
				                    "and \"rows\"", what, key);
		}
		if (!json_is_string(json_object_get(spec, "array")))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
			                    "%s.array must be the name of an array", what);
		name = json_string_value(json_object_get(spec, "array"));
		o->rows = json_object_get(spec, "rows");
	}
	o->array = name;
	return TS_OK;
}

/*
 * POST /v1/models/{model}:step {"inputs", "targets", "steps", "placement",
 * "batches", "accumulate"} or {"windows", "steps", "placement",
 * "accumulate"}: ts_job_step_submit (jobs/step.h says what a step holds,
 * writes and publishes).
 */
void ts_h_models_step(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_job_run run = {.steps = 1};
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *inputs = NULL, *targets = NULL, *pl = NULL, *batches = NULL;
	json_t *windows = NULL, *acc = NULL;
	json_int_t steps = 1;

	if (!ready_model_from_path(call, reply, &run.model))
		return;
	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s?o, s?o, s?I, s?o, s?o, s?o, s?o}",
	                            "inputs", &inputs, "targets", &targets, "steps", &steps,
	                            "placement", &pl, "batches", &batches, "windows",
	                            &windows, "accumulate", &acc) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "step body: %s (expected {\"inputs\": ..., \"targets\": ..., \"steps\": N, "
		             "\"batches\": {...}} or {\"windows\": {...}, \"steps\": N})", jerr.text);
		goto out_fail;
	}
	if (windows && batches) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_WINDOWS",
		             "windows and batches are exclusive: windows draw their own batches");
		goto out_fail;
	}
	if (batches && batches_parse(batches, &run.batches, &err) != TS_OK)
		goto out_fail;
	if (run_data_parse(inputs, targets, windows, &run, &err) != TS_OK)
		goto out_fail;
	if (steps < 1 || steps > 1000000) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_STEPS", "steps is in 1..1000000");
		goto out_fail;
	}
	if (accumulate_parse(acc, &run.accumulate, &err) != TS_OK)
		goto out_fail;
	if (run_policy(call->core, &run.model, pl, true, &run.policy, &err) != TS_OK)
		goto out_fail;
	run.steps = (uint64_t)steps;
	if (ts_job_step_submit(&call->core->env, &run, &op, &err) != TS_OK)
		goto out_fail;
	reply_job(call, reply, op);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}

/* ---- evaluation ----------------------------------------------------------------- */

/*
 * POST /v1/models/{model}:evaluate {"inputs", "targets", "outputs",
 * "placement"}: the loss of the model over a batch, and on request its
 * outputs (the last layer's activations) in a new array, as an operation.
 * Nothing of the model is written: its weights and optimizer state keep
 * their bytes, versions and ETags, and its step count stays.
 *
 * Holds. A step updates device weights in place, so an evaluation must not
 * read them while one runs. It takes the catalog's hold (the same,
 * exclusive, one as a step) on the model's parameter arrays from
 * submission to completion: a step (or any writer of w1, w2, embed or
 * proj: :put, upload, DELETE) submitted meanwhile is refused 409 ABORTED
 * naming the evaluation, and an evaluation submitted during a step is
 * refused naming the step - never a mix of two versions. Two evaluations of one model
 * exclude each other the same way (holds have one holder); the optimizer
 * state, which it does not read, is not held.
 *
 * "outputs": {"name": array, "device": id, "memory_kind": kind} or
 * {"name": array, "sharding": a sharding on one device} (JAX's
 * out_shardings): float32 [B, d_model] (a token model's logits: the
 * inputs' shape, then vocab) published under name when the evaluation
 * succeeded, committed to that placement, which must be on the
 * device the evaluation runs on (device or pinned_host memory).
 */

/* Parses "outputs" strictly into s (name required when need_name). */
static ts_status eval_outputs_parse(const struct ts_core *core, json_t *o, bool need_name,
                                    struct ts_job_outputs *s, struct ts_error *err)
{
	json_t *name = json_object_get(o, "name"), *sh = json_object_get(o, "sharding");
	json_t *dev = json_object_get(o, "device"), *kind = json_object_get(o, "memory_kind");
	struct ts_sharding sharding;
	const char *key;
	json_t *v;

	if (!json_is_object(o))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OUTPUTS",
		                    "outputs is {\"name\": array, \"device\": id, \"memory_kind\": kind}"
		                    " or {\"name\": array, \"sharding\": ...}");
	json_object_foreach(o, key, v) {
		if (strcmp(key, "name") && strcmp(key, "sharding") && strcmp(key, "device") &&
		    strcmp(key, "memory_kind"))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OUTPUTS",
			                    "outputs.%s is not a field this API knows; it takes \"name\", "
			                    "\"sharding\", \"device\" and \"memory_kind\"", key);
	}
	if (name && (!json_is_string(name) || !ts_array_name_valid(json_string_value(name))))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OUTPUTS",
		                    "outputs.name must be a valid array name");
	if (!name && need_name)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OUTPUTS",
		                    "outputs.name is missing: the array the outputs are written to");
	if (sh && (dev || kind))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OUTPUTS",
		                    "outputs: give either \"sharding\" or \"device\"/\"memory_kind\", "
		                    "not both");
	if ((dev && !json_is_string(dev)) || (kind && !json_is_string(kind)))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OUTPUTS",
		                    "outputs.device and outputs.memory_kind are strings");
	s->outputs = true;
	if (name)
		snprintf(s->name, sizeof s->name, "%s", json_string_value(name));
	s->kind = TS_MEM_DEVICE;
	s->dev = NULL;
	if (sh) {
		if (ts_h_sharding_resolve(core, sh, &sharding, err) != TS_OK)
			return err->status;
		if (sharding.type != TS_SHARDING_SINGLE)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OUTPUTS",
			                    "outputs.sharding must be on one device: an evaluation writes "
			                    "its outputs where it runs");
		s->dev = sharding.device;
		s->kind = sharding.memory_kind;
	} else {
		if (kind && !ts_memory_kind_parse(json_string_value(kind), &s->kind))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
			                    "outputs.memory_kind '%s' is not one of device, pinned_host",
			                    json_string_value(kind));
		if (dev) {
			struct ts_placement pl;

			if (ts_h_placement(core, json_string_value(dev), NULL, &pl, err) != TS_OK)
				return err->status;
			s->dev = pl.sharding.device;
		}
	}
	if (s->kind != TS_MEM_DEVICE && s->kind != TS_MEM_PINNED_HOST)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
		                    "outputs.memory_kind '%s': outputs are written to device or "
		                    "pinned_host memory", ts_memory_kind_name(s->kind));
	return TS_OK;
}

void ts_h_models_evaluate(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_job_run run = {.steps = 1};
	struct ts_model *m = &run.model;
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *inputs = NULL, *targets = NULL, *pl = NULL, *outs = NULL;
	json_t *windows = NULL;
	const char *positions = "all";

	if (!ready_model_from_path(call, reply, m))
		return;
	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s?o, s?o, s?o, s?o, s?o, s?s}",
	                            "inputs", &inputs, "targets", &targets, "outputs", &outs,
	                            "placement", &pl, "windows", &windows, "positions",
	                            &positions) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "evaluate body: %s (expected {\"inputs\": ..., \"targets\": ..., "
		             "\"outputs\": {\"name\": ...}} or {\"windows\": {...}, ...})", jerr.text);
		goto out_fail;
	}
	if (run_data_parse(inputs, targets, windows, &run, &err) != TS_OK)
		goto out_fail;
	if (targets && m->mlp.loss != TS_LOSS_MSE && m->mlp.loss != TS_LOSS_XENT) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "UNEXPECTED_TARGETS",
		             "model '%s' has loss %s, which takes no \"targets\"", m->name,
		             ts_loss_name(m->mlp.loss));
		goto out_fail;
	}
	if (!targets && !windows && m->mlp.loss == TS_LOSS_MSE) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "NO_TARGETS", "loss %s needs \"targets\"",
		             ts_loss_name(m->mlp.loss));
		goto out_fail;
	}
	/* a token model without targets: its logits, all or the last positions */
	if (!targets && !windows && ts_mlp_tokens(&m->mlp) && !outs) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "NO_OUTPUTS",
		             "an evaluation without \"targets\" answers the logits only: name the "
		             "array they go to in \"outputs\"");
		goto out_fail;
	}
	if (strcmp(positions, "all") != 0 && strcmp(positions, "last") != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_POSITIONS",
		             "positions '%s' is not one of all, last", positions);
		goto out_fail;
	}
	run.last = strcmp(positions, "last") == 0;
	if (run.last && !m->mlp.gpt) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_POSITIONS",
		             "positions last is a GPT's (windows of tokens); model '%s' is no GPT",
		             m->name);
		goto out_fail;
	}
	if (outs && eval_outputs_parse(call->core, outs, true, &run.outputs, &err) != TS_OK)
		goto out_fail;
	if (run.outputs.outputs && ts_job_outputs_writable(&call->core->env, &run.outputs, &err) != TS_OK)
		goto out_fail;
	if (run_policy(call->core, m, pl, true, &run.policy, &err) != TS_OK ||
	    ts_job_eval_submit(&call->core->env, &run, &op, &err) != TS_OK)
		goto out_fail;
	reply_job(call, reply, op);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}

/* ---- generation ----------------------------------------------------------------- */

/* "prompt": a non-empty array of token ids in [0, vocab), into a new
 * array *ids of *n (the caller frees it); BAD_TOKEN naming the first bad
 * one and its index. */
static ts_status prompt_parse(json_t *v, int vocab, int32_t **ids, size_t *n,
                              struct ts_error *err)
{
	size_t i, len = json_array_size(v);
	json_t *t;

	*ids = NULL;
	*n = 0;
	if (!json_is_array(v) || len < 1 || len > TS_GENERATE_PROMPT_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_PROMPT",
		                    "prompt must be an array of 1..%d token ids",
		                    TS_GENERATE_PROMPT_MAX);
	*ids = malloc(len * sizeof **ids);
	if (!*ids)
		return ts_error_oom(err, "no memory for a prompt of %zu tokens", len);
	json_array_foreach(v, i, t) {
		json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;

		if (!json_is_integer(t) || id < 0 || id >= vocab) {
			if (json_is_integer(t))
				ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TOKEN",
				             "prompt[%zu]: token id %lld is outside the vocabulary [0, %d)", i,
				             (long long)id, vocab);
			else
				ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TOKEN",
				             "prompt[%zu] is not a token id (an integer in [0, %d))", i, vocab);
			ts_error_meta(err, "index", "%zu", i);
			free(*ids);
			*ids = NULL;
			return TS_INVALID_ARGUMENT;
		}
		(*ids)[i] = (int32_t)id;
	}
	*n = len;
	return TS_OK;
}

/*
 * POST /v1/models/{model}:generate {"prompt": [ids], "max_tokens": n,
 * "temperature": t, "top_k": K, "seed": S, "placement": {"prefetch_depth"}}:
 * ts_job_generate_submit (jobs/step.h: a token a pass, greedy at
 * temperature 0, else sampled as train/sample.h draws). Answers
 * {"tokens": [...]} with the rest of the result.
 */
void ts_h_models_generate(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_job_generate req = {.max_tokens = 0};
	struct ts_model *m = &req.model;
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *prompt = NULL, *pl = NULL;
	json_int_t max_tokens = -1, top_k = 0, seed = 0;
	double temperature = 0;
	int32_t *ids = NULL;

	if (!ready_model_from_path(call, reply, m))
		return;
	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s:I, s?F, s?I, s?I, s?o}",
	                            "prompt", &prompt, "max_tokens", &max_tokens, "temperature",
	                            &temperature, "top_k", &top_k, "seed", &seed, "placement",
	                            &pl) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "generate body: %s (expected {\"prompt\": [ids], \"max_tokens\": n, "
		             "\"temperature\": t, \"top_k\": k, \"seed\": s})", jerr.text);
		goto out_fail;
	}
	if (!m->mlp.gpt) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		             "model '%s' is no GPT: generation is a GPT's", m->name);
		goto out_fail;
	}
	if (max_tokens < 1 || max_tokens > TS_GENERATE_MAX_TOKENS) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_MAX_TOKENS",
		             "max_tokens %lld is outside 1..%d", (long long)max_tokens,
		             TS_GENERATE_MAX_TOKENS);
		goto out_fail;
	}
	if (!(temperature >= 0 && temperature <= 1e6)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_TEMPERATURE",
		             "temperature must be a number in [0, 1e6]; 0 is greedy");
		goto out_fail;
	}
	if (top_k < 0 || top_k > m->mlp.vocab) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_TOP_K",
		             "top_k %lld is outside 0..%d (0: every id)", (long long)top_k,
		             m->mlp.vocab);
		goto out_fail;
	}
	if (seed < 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_SEED", "seed must be >= 0");
		goto out_fail;
	}
	if (prompt_parse(prompt, m->mlp.vocab, &ids, &req.nprompt, &err) != TS_OK)
		goto out_fail;
	if (pl && (json_object_get(pl, "activations"))) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		             "placement.activations: a generation keeps no activations");
		goto out_fail;
	}
	if (run_policy(call->core, m, pl, true, &req.policy, &err) != TS_OK)
		goto out_fail;
	req.prompt = ids;
	req.max_tokens = (uint64_t)max_tokens;
	req.temperature = (float)temperature;
	req.top_k = (int)top_k;
	req.seed = (uint64_t)seed;
	if (ts_job_generate_submit(&call->core->env, &req, &op, &err) != TS_OK)
		goto out_fail;
	reply_job(call, reply, op);
	free(ids);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	free(ids);
	json_decref(body);
}
