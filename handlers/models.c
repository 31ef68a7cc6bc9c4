/*
 * models.c - training models over HTTP: POST/GET/DELETE /v1/models,
 * POST /v1/models/{model}:analyze (the memory analysis of a step, before
 * any run) and POST /v1/models/{model}:step (run N steps as an operation).
 *
 * Creation is an operation too: admission (the arrays allocated) on the HTTP
 * thread, initialisation on a worker. A model is known by its uid; its
 * arrays are owned by it (their dtype and shape stay, only it deletes them).
 * A step holds the model's parameter and optimizer-state arrays in the
 * catalog from submission to completion (they are updated in place, so
 * every other writer is refused 409 ABORTED naming the step) and publishes
 * new versions of them as it ends. It runs where the parameters are:
 * committed arrays decide the device, uncommitted inputs follow (counted as
 * implicit transfers), inputs taken as rows of a dataset move only those
 * rows (the rows parser of :gather). The parameters' and optimizer state's
 * memory kinds are read from their arrays, so moving "{model}.w1" to
 * pinned_host offloads it; the call may override the activation policy and
 * prefetch depth.
 */
#include "handlers/arrays_int.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "handlers/operations.h"
#include "handlers/sharding_json.h"
#include "storage/array_io.h"
#include "storage/colocate.h"
#include "ops/operation.h"
#include "train/session.h"
#include "handlers/model_spec.h"
#include "train/model.h"

#define INIT_CHUNK (1u << 20)   /* floats generated per write */

#define param_roles ts_model_roles

/* Whether the model has the array of this role. */
static bool has_role(const struct ts_model *m, enum ts_pbuf_role r)
{
	return ts_model_has_role(m, r);
}

/* ---- creation ------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fills a with its initial values: normal(0, scale) from (seed, role), a
 * constant, or zeros for optimizer state. */
static ts_status init_array(const struct ts_core *core, struct ts_operation *op, struct ts_array *a,
                            enum ts_pbuf_role role, const struct ts_model_init *in,
                            struct ts_error *err)
{
	uint64_t n = ts_array_desc(a)->nbytes / 4, done = 0, state = in->seed * 1000003ull + (uint64_t)role;
	struct ts_array_writer *w = NULL;
	float *chunk = malloc(INIT_CHUNK * sizeof *chunk);
	bool zero = ts_role_opt_state(role);
	ts_status st;

	if (!chunk)
		return ts_error_oom(err, "no memory to initialise");
	st = ts_array_writer_new(core->stager, a, &w, err);
	while (st == TS_OK && done < n) {
		uint64_t k = n - done < INIT_CHUNK ? n - done : INIT_CHUNK;

		for (uint64_t i = 0; i < k; i++) {
			if (zero) {
				chunk[i] = 0.0f;
			} else if (in->constant) {
				chunk[i] = (float)in->value;
			} else {
				/* Box-Muller on two uniform draws in (0, 1] */
				double u1 = ((double)(splitmix(&state) >> 11) + 1.0) / 9007199254740992.0;
				double u2 = (double)(splitmix(&state) >> 11) / 9007199254740992.0;

				chunk[i] = (float)(in->scale * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
			}
		}
		st = ts_array_writer_write(w, chunk, k * sizeof *chunk, err);
		done += k;
		ts_operation_progress_add(op, k * sizeof *chunk);
		if (st == TS_OK && ts_operation_cancelled(op))
			st = ts_error_set(err, TS_CANCELLED, "CANCELLED", "the creation was cancelled");
	}
	if (st == TS_OK)
		st = ts_array_writer_finish(w, err);
	ts_array_writer_free(w);
	free(chunk);
	return st;
}

static json_t *model_json(const struct ts_model *m)
{
	json_t *o = ts_h_model_spec_json(m), *arrays = json_object();
	char name[256];

	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++) {
		if (!has_role(m, param_roles[i]))
			continue;
		ts_model_array_name(m, param_roles[i], name, sizeof name);
		json_object_set_new(arrays, strchr(name, '.') + 1, json_string(name));
	}
	if (o)
		json_object_set_new(o, "arrays", arrays);
	else
		json_decref(arrays);
	return o;
}

/* model_json with "state" (CREATING while its creation runs, with the
 * operation's id, then READY). */
static json_t *model_state_json(const struct ts_model *m)
{
	json_t *o = model_json(m);

	if (o) {
		json_object_set_new(o, "state", json_string(m->ready ? "READY" : "CREATING"));
		if (!m->ready && m->creating[0])
			json_object_set_new(o, "creating_operation", json_string(m->creating));
	}
	return o;
}

/*
 * Creation. The request is checked, the model listed (not ready) and its
 * arrays allocated on the HTTP thread - admission: a model that cannot fit
 * is refused at once; the O(size) part, initialising the weights, runs on an
 * operation worker, which publishes the arrays all at once and marks the
 * model ready. A creation that fails or is cancelled leaves nothing.
 */
struct create {
	const struct ts_core *core;
	struct ts_model model;                /* with its uid */
	struct ts_model_init init;
	struct ts_array *arrs[TS_MODEL_NROLES];  /* own references; unpublished until done */
	enum ts_pbuf_role roles[TS_MODEL_NROLES];
	size_t n;
	bool published;
};

static ts_status create_hold(const char *id, void *arg, struct ts_error *err)
{
	struct create *c = arg;

	(void)err;
	ts_model_registry_set_ready(c->core->models, c->model.uid, false, id);
	return TS_OK;
}

static ts_status create_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct create *c = arg;
	ts_status st = TS_OK;

	for (size_t i = 0; i < c->n && st == TS_OK; i++)
		st = init_array(c->core, op, c->arrs[i], c->roles[i], &c->init, err);
	if (st == TS_OK)
		st = ts_catalog_put_all(c->core->catalog, c->arrs, c->n, false, err);
	if (st != TS_OK)
		return st;
	c->published = true;
	ts_model_registry_set_ready(c->core->models, c->model.uid, true, NULL);
	c->model.ready = true;
	ts_operation_set_result(op, model_state_json(&c->model));
	return TS_OK;
}

static void create_release(void *arg)
{
	struct create *c = arg;

	if (!c->published && c->model.uid)
		ts_model_registry_remove(c->core->models, c->model.uid);
	for (size_t i = 0; i < c->n; i++)
		ts_array_unref(c->arrs[i]);
	free(c);
}

void ts_h_models_create(const struct ts_call *call, struct ts_reply *reply)
{
	const struct ts_core *core = call->core;
	struct create *c = calloc(1, sizeof *c);
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	uint64_t total = 0, wait_ns = 0;
	char owner[160];

	ts_error_clear(&err);
	if (!c) {
		ts_error_oom(&err, "no memory for a model");
		goto out_fail;
	}
	c->core = core;
	if (!json_is_object(body)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "body: %s",
		             body ? "must be a JSON object" : jerr.text);
		goto out_fail;
	}
	if (ts_h_model_parse(core, body, &c->model, &c->init, &err) != TS_OK)
		goto out_fail;
	c->model.create_ns = ts_wall_ns();
	ts_model_owner(&c->model, owner, sizeof owner);
	if (ts_model_registry_put(core->models, &c->model, &c->model.uid, &err) != TS_OK)
		goto out_fail;
	/* the names first: a model or array name taken refuses it all */
	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++) {
		struct ts_array *there;
		char name[256];

		if (!has_role(&c->model, param_roles[i]))
			continue;
		ts_model_array_name(&c->model, param_roles[i], name, sizeof name);
		there = ts_catalog_get(core->catalog, name);
		ts_array_unref(there);
		if (there) {
			ts_error_set(&err, TS_ALREADY_EXISTS, "ARRAY_EXISTS",
			             "array '%s' already exists; model '%s' needs the name", name,
			             c->model.name);
			goto out_fail;
		}
	}
	/* admission: the whole model against each space's free bytes, then every
	 * array allocated now, or nothing is created */
	if (ts_model_check_fit(&c->model, core->memory, &err) != TS_OK)
		goto out_fail;
	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++) {
		enum ts_pbuf_role role = param_roles[i];
		struct ts_array_desc d = {.dtype = TS_DT_FLOAT32};
		struct ts_placement pl;
		char name[256];

		if (!has_role(&c->model, role))
			continue;
		ts_model_array_name(&c->model, role, name, sizeof name);
		d.rank = ts_model_param_shape(&c->model, role, d.shape);
		ts_placement_single(&pl, c->model.device,
		                    ts_role_param(role) ? c->model.policy.params : c->model.policy.opt_state,
		                    true);
		if (ts_array_desc_init(&d, &err) != TS_OK ||
		    ts_array_new(name, &d, &pl, core->memory, &c->arrs[c->n], &err) != TS_OK)
			goto out_fail;
		ts_array_set_owner(c->arrs[c->n], owner);
		c->roles[c->n++] = role;
		total += d.nbytes;
	}
	if (ts_op_submit_holding(core->operations, "create", c->model.name, total, "bytes",
	                         create_run, c, create_release, create_hold, &op, &err) != TS_OK)
		goto out_fail;
	c = NULL;
	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	goto out_free;

out_fail:
	ts_reply_error(reply, &err);
out_free:
	if (c)
		create_release(c);
	ts_operation_unref(op);
	json_decref(body);
}

static bool model_from_path(const struct ts_call *call, struct ts_reply *reply, struct ts_model *m)
{
	const char *name = ts_call_param(call, "model");

	if (!name || !ts_model_registry_get(call->core->models, name, m)) {
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
	size_t n = all ? ts_model_registry_list(call->core->models, all, 1024) : 0;

	for (size_t i = 0; list && i < n; i++)
		json_array_append_new(list, model_state_json(&all[i]));
	free(all);
	ts_reply_json(reply, TS_HTTP_OK, json_pack("{s:o*}", "models", list));
}

void ts_h_models_get(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;

	if (model_from_path(call, reply, &m))
		ts_reply_json(reply, TS_HTTP_OK, model_state_json(&m));
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
	char names[TS_MODEL_NROLES + 4][256], owner[160], holder[40];
	const char *list[TS_MODEL_NROLES + 4];
	struct ts_precondition pre = {.owner = owner};
	size_t n = 0;

	if (!ready_model_from_path(call, reply, &m))
		return;
	ts_error_clear(&err);
	ts_model_owner(&m, owner, sizeof owner);
	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++)
		if (has_role(&m, param_roles[i]))
			ts_model_array_name(&m, param_roles[i], names[n++], sizeof names[0]);
	for (int g = 1; g <= 2; g++)          /* gradients of earlier steps, if any */
		snprintf(names[n++], sizeof names[0], "%s.grad.w%d", m.name, g);
	if (ts_mlp_tokens(&m.mlp)) {
		snprintf(names[n++], sizeof names[0], "%s.grad.embed", m.name);
		if (m.mlp.proj)
			snprintf(names[n++], sizeof names[0], "%s.grad.proj", m.name);
	}
	for (size_t i = 0; i < n; i++) {
		list[i] = names[i];
		if (ts_catalog_held(call->core->catalog, names[i], holder, sizeof holder)) {
			ts_error_set(&err, TS_ABORTED, "MODEL_BUSY",
			             "model '%s' is in use by operation %s (array '%s'); cancel it or "
			             "wait for it, then delete", m.name, holder, names[i]);
			ts_error_meta(&err, "operation", "%s", holder);
			ts_reply_error(reply, &err);
			return;
		}
	}
	if (ts_catalog_delete_all(call->core->catalog, list, n, &pre, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	ts_model_registry_remove(call->core->models, m.uid);
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

/* An evaluation's "outputs" (below): where its outputs array goes. */
struct eval_outputs {
	bool outputs;
	char name[TS_NAME_MAX + 1];
	struct ts_device *dev;             /* NULL: where the evaluation runs */
	enum ts_memory_kind kind;
};

static ts_status eval_outputs_parse(const struct ts_core *core, json_t *o, bool need_name,
                                    struct eval_outputs *s, struct ts_error *err);

/* The policy a step would run with: the model's, with params and optimizer
 * state where their arrays are now, then the call's overrides. */
/* The memory kind shared by the model's arrays of the given roles (where
 * they are now); mixed kinds are FAILED_PRECONDITION naming two of them. */
static ts_status arrays_kind(const struct ts_core *core, const struct ts_model *m,
                             const enum ts_pbuf_role *roles, size_t n, enum ts_memory_kind *kind,
                             struct ts_error *err)
{
	char first[256] = "", name[256];

	for (size_t i = 0; i < n; i++) {
		struct ts_array *a;
		enum ts_memory_kind k;

		if (!has_role(m, roles[i]))
			continue;
		ts_model_array_name(m, roles[i], name, sizeof name);
		a = ts_catalog_get(core->catalog, name);
		if (!a)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_NOT_FOUND",
			                    "model array '%s' is missing", name);
		k = ts_array_placement(a)->sharding.memory_kind;
		ts_array_unref(a);
		if (first[0] && k != *kind)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "MIXED_MEMORY_KINDS",
			                    "'%s' is in %s but '%s' is in %s; put them in one memory kind",
			                    first, ts_memory_kind_name(*kind), name, ts_memory_kind_name(k));
		if (!first[0])
			snprintf(first, sizeof first, "%s", name);
		*kind = k;
	}
	return TS_OK;
}

/*
 * The policy a step runs with: the model's activations and prefetch, with
 * params and optimizer state where their arrays are now. With for_step, the
 * call may override activations and prefetch only (params and state move
 * with :put); :analyze may also ask "what if" they were elsewhere.
 */
static ts_status step_policy(const struct ts_core *core, const struct ts_model *m, json_t *pl,
                             bool for_step, struct ts_policy *out, struct ts_error *err)
{
	static const enum ts_pbuf_role params[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_EMBED,
	                                           TS_ROLE_PROJ};
	static const enum ts_pbuf_role state[] = {TS_ROLE_MU_W1, TS_ROLE_MU_W2, TS_ROLE_NU_W1,
	                                          TS_ROLE_NU_W2, TS_ROLE_MU_EMBED, TS_ROLE_MU_PROJ,
	                                          TS_ROLE_NU_EMBED, TS_ROLE_NU_PROJ};

	*out = m->policy;
	if (arrays_kind(core, m, params, 4, &out->params, err) != TS_OK ||
	    arrays_kind(core, m, state, 8, &out->opt_state, err) != TS_OK)
		return err->status;
	if (for_step && pl && (json_object_get(pl, "params") || json_object_get(pl, "opt_state")))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "placement.%s cannot change in a step: a step runs with the "
		                    "model's arrays where they are; move them with :put",
		                    json_object_get(pl, "params") ? "params" : "opt_state");
	if (pl && json_object_get(pl, "activations"))
		out->save_x = out->save_h = out->offload_x = out->offload_h = false;
	return pl ? ts_h_policy_parse(pl, out, err) : ts_policy_check(out, err);
}

/* Whether the call asks for the analysis' timeline (?timeline=true; the
 * route declares it a bool). */
static bool timeline_requested(const struct ts_call *call)
{
	const char *q = ts_call_query(call, "timeline");

	return q && strcmp(q, "true") == 0;
}

static json_t *analysis_json(const struct ts_plan *p, bool timeline)
{
	json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	                      "argument_size_in_bytes", (json_int_t)p->argument_size_in_bytes,
	                      "output_size_in_bytes", (json_int_t)p->output_size_in_bytes,
	                      "alias_size_in_bytes", (json_int_t)p->alias_size_in_bytes,
	                      "temp_size_in_bytes", (json_int_t)p->temp_size_in_bytes,
	                      "host_argument_size_in_bytes", (json_int_t)p->host_argument_size_in_bytes,
	                      "host_output_size_in_bytes", (json_int_t)p->host_output_size_in_bytes,
	                      "host_alias_size_in_bytes", (json_int_t)p->host_alias_size_in_bytes,
	                      "host_temp_size_in_bytes", (json_int_t)p->host_temp_size_in_bytes,
	                      "host_version_size_in_bytes", (json_int_t)p->host_version_size_in_bytes,
	                      "host_journal_size_in_bytes", (json_int_t)p->host_journal_size_in_bytes,
	                      "peak_device_bytes", (json_int_t)p->peak_device_bytes,
	                      "h2d_bytes", (json_int_t)p->h2d_bytes,
	                      "d2h_bytes", (json_int_t)p->d2h_bytes);

	if (o && timeline) {
		json_t *t = json_array();

		for (int i = 0; t && i < p->npoints; i++)
			json_array_append_new(t, json_pack("{s:s, s:i, s:I}", "phase", p->points[i].phase,
			                                   "layer", p->points[i].layer,
			                                   "live_device_bytes", (json_int_t)p->points[i].live));
		json_object_set_new(o, "timeline", t);
	}
	return o;
}

void ts_h_models_analyze(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;
	struct ts_policy pol;
	struct ts_plan plan;
	struct ts_error err;
	json_error_t jerr;
	json_t *body, *batch, *pl, *outs = NULL, *modej = NULL;
	json_int_t B = 0, D = 0;
	const char *ids = NULL;
	int rows = 0;
	const char *mode = "step";
	struct eval_outputs ev = {.kind = TS_MEM_DEVICE};
	bool evaluate;

	if (!ready_model_from_path(call, reply, &m))
		return;
	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	pl = NULL;
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s?o, s?o, s?o, s?s}", "batch",
	                            &batch, "placement", &pl, "mode", &modej, "outputs", &outs,
	                            "dtype", &ids) != 0 ||
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
	if (outs && eval_outputs_parse(call->core, outs, false, &ev, &err) != TS_OK)
		goto out_fail;
	if (analyze_rows(&m, B, D, ids, &rows, &err) != TS_OK)
		goto out_fail;
	if (step_policy(call->core, &m, pl, false, &pol, &err) != TS_OK)
		goto out_fail;
	if (evaluate ? ts_plan_build_eval(&m.mlp, rows, &pol, ev.outputs, ev.kind, &plan,
	                                  &err) != TS_OK
	             : ts_plan_build(&m.mlp, &m.opt, rows, &pol, &plan, &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_OK, analysis_json(&plan, timeline_requested(call)));
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
	json_t *body, *spec = NULL, *batch = NULL;
	json_int_t B = 0, D = 0;
	const char *ids = NULL;
	int rows = 0;

	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s:o, s?s}", "model", &spec,
	                            "batch", &batch, "dtype", &ids) != 0 ||
	    json_unpack_ex(batch, &jerr, JSON_STRICT, "[II]", &B, &D) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "analyze body: %s (expected {\"model\": {...}, \"batch\": [B, d]})", jerr.text);
		goto out_fail;
	}
	if (!json_object_get(spec, "name"))
		json_object_set_new(spec, "name", json_string("analysis"));
	if (ts_h_model_parse(call->core, spec, &m, &init, &err) != TS_OK)
		goto out_fail;
	if (analyze_rows(&m, B, D, ids, &rows, &err) != TS_OK)
		goto out_fail;
	if (ts_plan_build(&m.mlp, &m.opt, rows, &m.policy, &plan, &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_OK, analysis_json(&plan, timeline_requested(call)));
	ts_plan_release(&plan);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}

/* ---- steps ---------------------------------------------------------------------- */

/*
 * A step holds its model's parameter and optimizer-state arrays (by
 * identity, in the catalog) from submission to completion, so every other
 * writer is refused meanwhile (409 ABORTED naming the step). The training
 * itself is a session (train/session.h) on memory this handler binds by
 * role. Each step is atomic: one that fails leaves every array as the
 * previous step left it, and the model's step count (Adam's t) advances per
 * step that succeeded. The call publishes once, as it ends (also when it
 * failed or was cancelled after some steps): a new version (new ETag) of
 * every array its steps updated. Offloaded arrays are updated into private
 * memory (two per array, taking turns), device ones in place. What the
 * steps did is the operation's result; a run that stopped early (cancelled,
 * or failed after starting) keeps the same object as the partial result in
 * its metadata: the losses of the steps that ran, their count, the model's
 * step count and, for a data-driven run, the position to continue from.
 */
struct operand;

struct step {
	const struct ts_core *core;
	struct ts_model model;
	struct ts_policy policy;
	uint64_t steps;
	json_t *inputs, *targets;          /* copies of the request's fields (own) */
	struct ts_array *held[TS_ROLE_COUNT];  /* the model's arrays by role (own references) */
	char op_id[40];                    /* the holder, once submitted */
	struct batches {                   /* a data-driven run: a batch per step */
		bool on;
		bool shuffle;
		uint64_t size, start, seed;
		uint64_t rows;                 /* of the datasets, while it runs */
		uint64_t perm_epoch;           /* the epoch of perm (UINT64_MAX: none) */
		uint64_t *perm;                /* owned; a permutation of the rows */
	} batches;
	/* while it runs */
	struct ts_operation *op;           /* borrowed */
	struct operand *in, *tgt;          /* borrowed from step_run */
	struct ts_array *priv[TS_ROLE_COUNT][2];  /* offloaded: the private versions */
	struct ts_array *next[TS_ROLE_COUNT];  /* in place: the version the end publishes */
	uint64_t done;                     /* steps that succeeded */
	double timed_s;                    /* the report's wall time at the last step's end */
	struct eval_outputs out;           /* an evaluation's outputs array, when asked for */
};

static ts_status step_hold(const char *id, void *arg, struct ts_error *err)
{
	struct step *s = arg;
	struct ts_array *list[TS_ROLE_COUNT];
	size_t n = 0;
	ts_status st;

	for (int r = 0; r < TS_ROLE_COUNT; r++)
		if (s->held[r])
			list[n++] = s->held[r];
	st = ts_catalog_hold(s->core->catalog, list, n, id, err);
	if (st == TS_OK)
		snprintf(s->op_id, sizeof s->op_id, "%s", id);
	return st;
}

static void step_release(void *arg)
{
	struct step *s = arg;

	ts_catalog_release(s->core->catalog, s->op_id);
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		ts_array_unref(s->held[r]);
		ts_array_unref(s->next[r]);
		ts_array_unref(s->priv[r][0]);
		ts_array_unref(s->priv[r][1]);
	}
	json_decref(s->inputs);
	json_decref(s->targets);
	free(s->batches.perm);
	free(s);
}

/* A device copy of rows (or all) of a sharded array, on dev: what a session
 * cannot stage from one piece of memory. New reference, never published. */
static ts_status gather_sharded(const struct ts_core *core, struct ts_array *src,
                                const uint64_t *rows, size_t n, struct ts_device *dev,
                                struct ts_array **out, struct ts_error *err)
{
	const struct ts_array_desc *sd = ts_array_desc(src);
	struct ts_array_desc d = *sd;
	struct ts_placement pl;
	struct ts_run *runs = malloc((rows && n ? n : 1) * sizeof *runs);
	struct ts_rows_iter it;
	uint64_t off, len, at = 0;
	size_t k = 0;
	ts_status st;

	*out = NULL;
	if (!runs)
		return ts_error_oom(err, "no memory for rows");
	if (rows) {
		ts_rows_iter_init(&it, rows, n, sd->shape[0] ? sd->nbytes / sd->shape[0] : 0);
		while (ts_rows_iter_next(&it, &off, &len)) {
			runs[k++] = (struct ts_run){.src_offset = off, .dst_offset = at, .len = len};
			at += len;
		}
		d.shape[0] = n;
	} else {
		runs[k++] = (struct ts_run){0, 0, sd->nbytes};
	}
	ts_placement_single(&pl, dev, TS_MEM_DEVICE, false);
	st = ts_array_desc_init(&d, err);
	if (st == TS_OK)
		st = ts_array_new(ts_array_name(src), &d, &pl, core->memory, out, err);
	if (st == TS_OK)
		st = ts_array_copy(core->stager, *out, NULL, src, runs, k, NULL, NULL, NULL, err);
	free(runs);
	return st;
}

/* Checks "inputs"/"targets": an array name, or {"array": name, "rows":
 * rows} (rows as :gather takes them), strictly. */
static ts_status step_operand_check(json_t *spec, const char *what, struct ts_error *err)
{
	const char *key;
	json_t *v;

	if (json_is_string(spec))
		return TS_OK;
	if (!json_is_object(spec))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "%s is an array name or {\"array\": name, \"rows\": [...]}", what);
	json_object_foreach(spec, key, v) {
		if (strcmp(key, "array") != 0 && strcmp(key, "rows") != 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
			                    "%s.%s is not a field this API knows; it takes \"array\" and "
			                    "\"rows\"", what, key);
	}
	if (!json_is_string(json_object_get(spec, "array")))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "%s.array must be the name of an array", what);
	return TS_OK;
}

/* Resolves a checked "inputs"/"targets" to the current version of its array
 * and its rows (borrowed; NULL for all). */
static ts_status step_operand(const struct ts_core *core, json_t *spec, const char *what,
                              struct ts_array **arr, json_t **rows, struct ts_error *err)
{
	const char *name = json_string_value(spec);

	*rows = NULL;
	if (!name) {
		name = json_string_value(json_object_get(spec, "array"));
		*rows = json_object_get(spec, "rows");
	}
	*arr = name ? ts_catalog_get(core->catalog, name) : NULL;
	if (!*arr)
		return ts_error_set(err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "%s array '%s' not found", what,
		                    name ? name : "");
	return TS_OK;
}

/* The memory kind shared by the held parameters (state false) or optimizer
 * state (state true); unchanged when there are none. */
static ts_status held_kind(const struct step *s, bool state, enum ts_memory_kind *kind,
                           struct ts_error *err)
{
	const struct ts_array *first = NULL;

	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++) {
		const struct ts_array *a = s->held[param_roles[i]];
		enum ts_memory_kind k;

		if (!a || ts_role_opt_state(param_roles[i]) != state)
			continue;
		k = ts_array_placement(a)->sharding.memory_kind;
		if (first && k != *kind)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "MIXED_MEMORY_KINDS",
			                    "'%s' is in %s but '%s' is in %s; put them in one memory kind",
			                    ts_array_name(first), ts_memory_kind_name(*kind),
			                    ts_array_name(a), ts_memory_kind_name(k));
		first = a;
		*kind = k;
	}
	return TS_OK;
}

/* ---- data-driven runs: the rows of each step's batch ------------------------------ */

static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The permutation of epoch e: Fisher-Yates from (seed, e). */
static ts_status epoch_perm(struct batches *b, uint64_t e, struct ts_error *err)
{
	uint64_t state = mix64(b->seed * 0x9e3779b97f4a7c15ull + e + 1);

	if (b->perm && b->perm_epoch == e)
		return TS_OK;
	if (!b->perm) {
		b->perm = malloc(b->rows * sizeof *b->perm);
		if (!b->perm)
			return ts_error_oom(err, "no memory to shuffle %llu rows", (unsigned long long)b->rows);
	}
	for (uint64_t i = 0; i < b->rows; i++)
		b->perm[i] = i;
	for (uint64_t i = b->rows - 1; i > 0; i--) {
		uint64_t j, t;

		state += 0x9e3779b97f4a7c15ull;
		j = mix64(state) % (i + 1);
		t = b->perm[i];
		b->perm[i] = b->perm[j];
		b->perm[j] = t;
	}
	b->perm_epoch = e;
	return TS_OK;
}

/* The rows of the batch of step i (0-based in this call) into rows[size]:
 * positions start + i * size onwards, wrapping into the next epoch (each
 * epoch its own order when shuffled). */
static ts_status batch_rows(struct batches *b, uint64_t i, uint64_t *rows, struct ts_error *err)
{
	for (uint64_t j = 0; j < b->size; j++) {
		uint64_t q = b->start + i * b->size + j, e = q / b->rows, k = q % b->rows;
		ts_status st;

		if (!b->shuffle) {
			rows[j] = k;
			continue;
		}
		st = epoch_perm(b, e, err);
		if (st != TS_OK)
			return st;
		rows[j] = b->perm[k];
	}
	return TS_OK;
}

/* Parses "batches": {"batch_size": B, "order": "sequential" | "shuffle",
 * "seed": S, "start": P}, strictly. */
static ts_status batches_parse(json_t *v, struct batches *b, struct ts_error *err)
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
	b->perm_epoch = UINT64_MAX;
	return TS_OK;
}

/* ---- the session's hooks: versions of the held arrays ---------------------------- */



static bool step_cancelled(void *arg)
{
	return ts_operation_cancelled(((struct step *)arg)->op);
}

/* A private version of cur, in new memory where it is (unpublished). */
static ts_status private_version(const struct ts_core *core, const struct ts_array *cur,
                                 struct ts_array **out, struct ts_error *err)
{
	const json_t *meta = ts_array_metadata(cur);
	ts_status st;

	st = ts_array_new(ts_array_name(cur), ts_array_desc(cur), ts_array_placement(cur),
	                  core->memory, out, err);
	if (st != TS_OK)
		return st;
	if (meta)
		ts_array_set_metadata(*out, json_deep_copy(meta));
	ts_array_set_implicit_bytes(*out, ts_array_implicit_bytes(cur));
	ts_array_set_owner(*out, ts_array_owner(cur));
	return TS_OK;
}

/*
 * Before each step, what it writes and what publishing will need: for an
 * offloaded array, the private version the step writes its update into
 * (the two take turns: a step reads the one the last wrote); for a device
 * array, once, the new version sharing its updated-in-place buffer. Made
 * before anything is written, so publishing allocates nothing.
 */
static ts_status step_prepare(void *arg, struct ts_session *sess, struct ts_error *err)
{
	struct step *s = arg;
	ts_status st = TS_OK;

	if (s->model.opt.type == TS_OPT_NONE)
		return st;
	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0] && st == TS_OK; i++) {
		enum ts_pbuf_role role = param_roles[i];
		struct ts_array *cur = s->held[role], **slot;

		if (!cur)
			continue;
		if (!ts_session_versioned(sess, role)) {
			if (!s->next[role])
				st = ts_array_new_version(cur, &s->next[role], err);
			continue;
		}
		slot = &s->priv[role][s->done % 2];
		if (!*slot)
			st = private_version(s->core, cur, slot, err);
		if (st == TS_OK)
			st = ts_session_set_next(sess, role, ts_buffer_data(ts_array_single_buffer(*slot)),
			                         err);
	}
	return st;
}

/* After a step that succeeded: counted, on the model (Adam's t) too. */
static ts_status step_publish(void *arg, struct ts_session *sess, float loss,
                              struct ts_error *err)
{
	struct step *s = arg;
	double wall = ts_session_report(sess)->wall_s;

	(void)loss;
	(void)err;
	s->done++;
	if (s->model.opt.type != TS_OPT_NONE)
		ts_model_registry_advance(s->core->models, s->model.uid, 1, NULL);
	ts_model_registry_step_ran(s->core->models, (uint64_t)((wall - s->timed_s) * 1e9));
	s->timed_s = wall;
	ts_operation_progress_add(s->op, 1);
	return TS_OK;
}

/* As the call ends, when some step updated them: the new versions replace
 * the held ones (allocation-free replaces, as the holder). */
static ts_status step_install(struct step *s, struct ts_error *err)
{
	struct ts_precondition pre = {.holder = s->op_id};
	ts_status st = TS_OK;

	if (!s->done || s->model.opt.type == TS_OPT_NONE)
		return TS_OK;
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		struct ts_array *v = s->priv[r][(s->done - 1) % 2] ? s->priv[r][(s->done - 1) % 2]
		                                                   : s->next[r];

		if (!v || st != TS_OK)
			continue;
		st = ts_catalog_replace(s->core->catalog, v, &pre, err);
		if (st == TS_OK) {
			ts_array_unref(s->held[r]);
			s->held[r] = ts_array_ref(v);
		}
	}
	return st;
}

static const struct ts_session_hooks step_hooks = {
	.cancelled = step_cancelled, .prepare = step_prepare, .publish = step_publish,
};

static ts_status step_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                            struct ts_session_source *src, struct ts_error *err);

static const struct ts_session_hooks batch_hooks = {
	.cancelled = step_cancelled, .prepare = step_prepare, .publish = step_publish,
	.batch = step_batch,
};

/* ---- the run ------------------------------------------------------------------------ */

/* One operand of a step: the array, its rows (normalised; NULL: all) and a
 * device copy when the array is sharded. */
struct operand {
	struct ts_array *arr;              /* own reference */
	json_t *rows_json;                 /* borrowed from the request */
	uint64_t *rows;                    /* owned */
	size_t nrows;
	struct ts_array *gathered;         /* own reference, or NULL */
};

static void operand_release(struct operand *o)
{
	ts_array_unref(o->arr);
	ts_array_unref(o->gathered);
	free(o->rows);
}

/* The rows the operand stages: parsed, and its batch rows. */
static ts_status operand_rows(struct operand *o, const char *field, uint64_t *batch,
                              struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(o->arr);
	ts_status st;

	*batch = d->rank ? d->shape[0] : 0;
	if (!o->rows_json)
		return TS_OK;
	if (d->rank == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS",
		                    "%s: array '%s' is 0-dimensional: it has no rows", field,
		                    ts_array_name(o->arr));
	st = ts_rows_parse(o->rows_json, field, d->shape[0], &o->rows, &o->nrows, err);
	if (st == TS_OK)
		*batch = o->nrows;
	return st;
}

/* Stages an operand for the session: its memory as a source (gathered to
 * dev first when sharded). */
/* The memory of a one-shard array as a session's source, with rows. */
static struct ts_session_source operand_source(const struct ts_array *a, const uint64_t *rows,
                                               size_t nrows)
{
	const struct ts_array_desc *d = ts_array_desc(a);

	return (struct ts_session_source){
		.mem = ts_buffer_data(ts_array_single_buffer(a)), .bytes = d->nbytes,
		.row_bytes = d->rank && d->shape[0] ? d->nbytes / d->shape[0] : 0,
		.src_dev = ts_array_box(a, 0)->device,
		.src_kind = ts_array_placement(a)->sharding.memory_kind,
		.rows = rows, .nrows = nrows};
}

static ts_status operand_stage(const struct ts_core *core, struct ts_session *sess,
                               enum ts_pbuf_role role, struct operand *o, struct ts_device *dev,
                               struct ts_error *err)
{
	struct ts_session_source src;
	ts_status st;

	if (!ts_array_single_buffer(o->arr)) {
		st = gather_sharded(core, o->arr, o->rows, o->nrows, dev, &o->gathered, err);
		if (st != TS_OK)
			return st;
		src = operand_source(o->gathered, NULL, 0);
	} else {
		src = operand_source(o->arr, o->rows, o->nrows);
	}
	return ts_session_stage(sess, role, &src, err);
}

/* A token model's operands: ids uint16 or int32, [B] or [B, T] (B*T rows
 * of the step, one per token), targets of the inputs' dtype and shape.
 * The rows of the step into *rows, the ids' width into *id_bytes. */
static ts_status check_token_batch(const struct step *s, const struct operand *in, uint64_t bin,
                                   const struct operand *tgt, uint64_t btgt, uint64_t *rows,
                                   int *id_bytes, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(in->arr);
	uint64_t T = d->rank == 2 ? d->shape[1] : 1;

	if ((d->dtype != TS_DT_UINT16 && d->dtype != TS_DT_INT32) || d->rank < 1 || d->rank > 2 ||
	    bin == 0 || T == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs of token model '%s' must be token ids, uint16 or int32, "
		                    "[B] or [B, T] with B, T >= 1", s->model.name);
	if (bin * T > (1u << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs have %llu tokens; a step takes at most %u",
		                    (unsigned long long)(bin * T), 1u << 24);
	if (!tgt->arr)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "NO_TARGETS",
		                    "loss softmax_cross_entropy needs \"targets\" (token ids)");
	{
		const struct ts_array_desc *t = ts_array_desc(tgt->arr);

		if (t->dtype != d->dtype || t->rank != d->rank || (d->rank == 2 && t->shape[1] != T) ||
		    btgt != bin)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TARGETS",
			                    "targets must be token ids of the inputs' dtype and shape");
	}
	*rows = bin * T;
	*id_bytes = d->dtype == TS_DT_UINT16 ? 2 : 4;
	return TS_OK;
}

/* The batch of the run's step n of a data-driven run: the inputs' rows
 * drawn, the targets' the same. */
static ts_status step_batch(void *arg, uint64_t n, enum ts_pbuf_role role,
                            struct ts_session_source *src, struct ts_error *err)
{
	struct step *s = arg;
	ts_status st = TS_OK;

	if (role == TS_ROLE_INPUT) {
		st = batch_rows(&s->batches, n, s->in->rows, err);
		*src = operand_source(s->in->arr, s->in->rows, s->in->nrows);
	} else {
		memcpy(s->tgt->rows, s->in->rows, s->in->nrows * sizeof *s->in->rows);
		*src = operand_source(s->tgt->arr, s->tgt->rows, s->tgt->nrows);
	}
	return st;
}

/* A data-driven run's operands: whole datasets of the same rows, one shard
 * each; the first batch's rows. */
static ts_status batches_begin(struct step *s, struct operand *in, struct operand *tgt,
                               uint64_t *bin, uint64_t *btgt, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(in->arr);
	struct batches *b = &s->batches;
	ts_status st;

	if (in->rows_json || (tgt->arr && tgt->rows_json))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "%s.rows and batches are exclusive: batches draw the rows",
		                    in->rows_json ? "inputs" : "targets");
	if (!ts_array_single_buffer(in->arr) || (tgt->arr && !ts_array_single_buffer(tgt->arr)))
		return ts_error_set(err, TS_UNIMPLEMENTED, "SHARDED_DATASET",
		                    "batches are drawn from one-shard datasets; '%s' is sharded",
		                    ts_array_name(ts_array_single_buffer(in->arr) ? tgt->arr : in->arr));
	b->rows = d->rank ? d->shape[0] : 0;
	if (tgt->arr && (ts_array_desc(tgt->arr)->rank == 0 ||
	                 ts_array_desc(tgt->arr)->shape[0] != b->rows))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TARGETS",
		                    "targets '%s' must have the %llu rows of the inputs '%s'",
		                    ts_array_name(tgt->arr), (unsigned long long)b->rows,
		                    ts_array_name(in->arr));
	if (b->size > b->rows)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BATCHES",
		                    "batches.batch_size %llu exceeds the %llu rows of '%s'",
		                    (unsigned long long)b->size, (unsigned long long)b->rows,
		                    ts_array_name(in->arr));
	in->rows = malloc(b->size * sizeof *in->rows);
	tgt->rows = tgt->arr ? malloc(b->size * sizeof *tgt->rows) : NULL;
	if (!in->rows || (tgt->arr && !tgt->rows))
		return ts_error_oom(err, "no memory for a batch");
	in->nrows = b->size;
	st = batch_rows(b, 0, in->rows, err);
	if (st == TS_OK && tgt->arr) {
		memcpy(tgt->rows, in->rows, b->size * sizeof *in->rows);
		tgt->nrows = b->size;
	}
	*bin = *btgt = b->size;
	return st;
}

/* The operands' shapes: inputs float32 [B, d_model], targets like them. */
static ts_status check_batch(const struct step *s, const struct operand *in, uint64_t bin,
                             const struct operand *tgt, uint64_t btgt, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(in->arr);

	if (d->dtype != TS_DT_FLOAT32 || d->rank != 2 || d->shape[1] != (uint64_t)s->model.mlp.d_model ||
	    bin == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs must be float32 [B, %d] with B >= 1", s->model.mlp.d_model);
	if (bin > (1u << 24))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
		                    "inputs have %llu rows; a step takes at most %u",
		                    (unsigned long long)bin, 1u << 24);
	if (tgt && tgt->arr) {
		const struct ts_array_desc *t = ts_array_desc(tgt->arr);

		if (t->dtype != d->dtype || t->rank != 2 || t->shape[1] != d->shape[1] || btgt != bin)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TARGETS",
			                    "targets must have the shape of the inputs");
	}
	return TS_OK;
}

/* Where it runs: committed arrays decide; uncommitted operands given by
 * name follow (counted as implicit transfers); operands given as rows are
 * staged instead (only their rows move). */
static ts_status step_place(struct step *s, struct operand *in, struct operand *tgt,
                            struct ts_device **dev, struct ts_error *err)
{
	const struct ts_core *core = s->core;
	struct ts_array *use[TS_ROLE_COUNT + 2];
	enum ts_pbuf_role from[TS_ROLE_COUNT];
	size_t nuse = 0, where_in = SIZE_MAX, where_tgt = SIZE_MAX, nheld;
	ts_status st;

	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++)
		if (s->held[param_roles[i]]) {
			from[nuse] = param_roles[i];
			use[nuse++] = ts_array_ref(s->held[param_roles[i]]);
		}
	nheld = nuse;
	if (!in->rows_json && !s->batches.on) {
		where_in = nuse;
		use[nuse++] = ts_array_ref(in->arr);
	}
	if (tgt->arr && !tgt->rows_json && !s->batches.on) {
		where_tgt = nuse;
		use[nuse++] = ts_array_ref(tgt->arr);
	}
	st = ts_colocate(core->catalog, core->stager, core->memory, use, nuse, s->model.device,
	                 s->op_id, dev, err);
	/* colocation may have replaced a moved array by its new version */
	for (size_t i = 0; i < nheld; i++) {
		ts_array_unref(s->held[from[i]]);
		s->held[from[i]] = use[i];
	}
	if (where_in != SIZE_MAX) {
		ts_array_unref(in->arr);
		in->arr = use[where_in];
	}
	if (where_tgt != SIZE_MAX) {
		ts_array_unref(tgt->arr);
		tgt->arr = use[where_tgt];
	}
	return st;
}

/* The result of a run (the session's report; the plan's analysis). */
static json_t *step_result(const struct step *s, const struct ts_session *sess,
                           struct ts_device *dev)
{
	const struct ts_plan *plan = ts_session_plan(sess);
	const struct ts_session_report *rep = ts_session_report(sess);
	json_t *losses = json_array();
	double per = rep->steps ? 1.0 / (double)rep->steps : 0;
	uint64_t spare = 0, bytes = 0;

	/* a data-driven run of more than one step stages the next batch in a
	 * second buffer per operand: device memory beside the plan's */
	for (int k = 0; s->batches.on && s->steps > 1 && k < 2; k++)
		if (ts_session_slot(sess, k ? TS_ROLE_TARGET : TS_ROLE_INPUT, &bytes, NULL))
			spare += bytes;
	double busy = rep->compute_s, waits = rep->copy_wait_s;

	for (uint64_t i = 0; losses && i < rep->steps; i++)
		json_array_append_new(losses, json_real(rep->losses[i]));
	return json_pack("{s:s, s:I, s:o*, s:s, s:I, s:I, s:I, s:I, s:o*,"
	                 " s:{s:f, s:f, s:f, s:f}, s:{s:I, s:I, s:I}, s:f}",
	                 "model", s->model.name, "steps", (json_int_t)rep->steps, "losses", losses,
	                 "device", ts_device_props(dev)->id,
	                 "predicted_peak_device_bytes", (json_int_t)(plan->peak_device_bytes + spare),
	                 "measured_peak_device_bytes",
	                 (json_int_t)(plan->argument_size_in_bytes + plan->output_size_in_bytes +
	                              rep->measured_temp_peak + rep->spare_bytes),
	                 "predicted_temp_size_in_bytes", (json_int_t)plan->temp_size_in_bytes,
	                 "measured_temp_size_in_bytes", (json_int_t)rep->measured_temp_peak,
	                 "analysis", analysis_json(plan, false),
	                 "time", "wall_s", rep->wall_s, "compute_s", busy,
	                 "transfer_not_hidden_s", waits, "per_step_s", rep->wall_s * per,
	                 "bytes_moved", "h2d", (json_int_t)rep->h2d_bytes,
	                 "d2h", (json_int_t)rep->d2h_bytes,
	                 "staged_h2d", (json_int_t)rep->staged_h2d_bytes,
	                 "overlap_ratio", busy + waits > 0 ? busy / (busy + waits) : 1.0);
}

/* A run's result: step_result, the model's step count after it and, for a
 * data-driven run, where it stopped (the next call continues with start =
 * next). The same for a run that completed and one that stopped early. */
static json_t *run_json(const struct step *s, const struct ts_session *sess,
                        struct ts_device *dev)
{
	json_t *res = step_result(s, sess, dev);
	uint64_t t = 0;

	if (!res)
		return NULL;
	if (ts_model_registry_advance(s->core->models, s->model.uid, 0, &t))
		json_object_set_new(res, "model_steps", json_integer((json_int_t)t));
	if (s->batches.on) {
		const struct batches *b = &s->batches;
		uint64_t next = b->start + s->done * b->size;

		json_object_set_new(res, "batches",
		                    json_pack("{s:I, s:s, s:I, s:I, s:I, s:I, s:I}",
		                              "batch_size", (json_int_t)b->size,
		                              "order", b->shuffle ? "shuffle" : "sequential",
		                              "seed", (json_int_t)b->seed,
		                              "start", (json_int_t)b->start,
		                              "next", (json_int_t)next,
		                              "epoch", (json_int_t)(next / b->rows),
		                              "rows", (json_int_t)b->rows));
	}
	return res;
}

static ts_status step_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct step *s = arg;
	const struct ts_core *core = s->core;
	struct ts_model *m = &s->model;
	struct operand in = {0}, tgt = {0};
	struct ts_array *grads[4] = {NULL};
	enum ts_pbuf_role grad_of[4] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_EMBED, TS_ROLE_PROJ};
	enum ts_pbuf_role grad_role[4] = {TS_ROLE_GRAD_W1, TS_ROLE_GRAD_W2, TS_ROLE_GRAD_EMBED,
	                                  TS_ROLE_GRAD_PROJ};
	static const char *const grad_name[4] = {"w1", "w2", "embed", "proj"};
	uint64_t rows = 0;
	int id_bytes = 4, ng = 0;
	struct ts_session_config cfg = {.mlp = m->mlp, .opt = m->opt, .memory = core->memory};
	struct ts_session *sess = NULL;
	struct ts_device *dev = NULL;
	uint64_t bin = 0, btgt = 0, base_steps = 0;
	bool ran = false;
	ts_status st;

	s->op = op;
	s->in = &in;
	s->tgt = &tgt;
	st = step_operand(core, s->inputs, "inputs", &in.arr, &in.rows_json, err);
	if (st == TS_OK && (m->mlp.loss == TS_LOSS_MSE || m->mlp.loss == TS_LOSS_XENT)) {
		if (!s->targets)
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "NO_TARGETS", "loss mse needs \"targets\"");
		else
			st = step_operand(core, s->targets, "targets", &tgt.arr, &tgt.rows_json, err);
	}
	if (st == TS_OK)
		st = step_place(s, &in, &tgt, &dev, err);
	if (st == TS_OK && s->batches.on) {
		st = batches_begin(s, &in, &tgt, &bin, &btgt, err);
	} else {
		if (st == TS_OK)
			st = operand_rows(&in, "inputs.rows", &bin, err);
		if (st == TS_OK && tgt.arr)
			st = operand_rows(&tgt, "targets.rows", &btgt, err);
	}
	if (st == TS_OK && ts_mlp_tokens(&m->mlp))
		st = check_token_batch(s, &in, bin, &tgt, btgt, &rows, &id_bytes, err);
	else if (st == TS_OK)
		st = check_batch(s, &in, bin, &tgt, btgt, err);
	/* the plan, with params and opt state where the held arrays are (a :put
	 * before the step may have moved them) */
	if (st == TS_OK)
		st = held_kind(s, false, &s->policy.params, err);
	if (st == TS_OK)
		st = held_kind(s, true, &s->policy.opt_state, err);
	if (st == TS_OK && ts_array_box(s->held[TS_ROLE_W1], 0)->device != dev)
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "PARAMS_ELSEWHERE",
		                  "model '%s' parameters are on %s, not %s", m->name,
		                  ts_device_props(ts_array_box(s->held[TS_ROLE_W1], 0)->device)->id,
		                  ts_device_props(dev)->id);
	if (st == TS_OK) {
		cfg.dev = dev;
		cfg.policy = s->policy;
		cfg.batch = (int)(ts_mlp_tokens(&m->mlp) ? rows : bin);
		cfg.mlp.id_bytes = id_bytes;
		st = ts_session_new(&cfg, &sess, err);
	}
	/* every slot by its role: the held arrays, the gradients, the batch */
	for (int r = 0; st == TS_OK && r < TS_ROLE_COUNT; r++) {
		const struct ts_array *a = s->held[r];

		if (!a)
			continue;
		st = ts_session_bind(sess, (enum ts_pbuf_role)r,
		                     ts_buffer_data(ts_array_single_buffer(a)),
		                     ts_buffer_size(ts_array_single_buffer(a)),
		                     ts_array_placement(a)->sharding.memory_kind, err);
	}
	for (int g = 0; st == TS_OK && m->opt.type == TS_OPT_NONE && g < 4; g++) {
		struct ts_placement pl;
		char name[256];

		if (!s->held[grad_of[g]])
			continue;
		snprintf(name, sizeof name, "%s.grad.%s", m->name, grad_name[g]);
		ts_placement_single(&pl, dev, TS_MEM_DEVICE, true);
		st = ts_array_new(name, ts_array_desc(s->held[grad_of[g]]), &pl, core->memory,
		                  &grads[ng], err);
		if (st == TS_OK)
			st = ts_session_bind(sess, grad_role[g],
			                     ts_buffer_data(ts_array_single_buffer(grads[ng])),
			                     ts_array_desc(grads[ng])->nbytes, TS_MEM_DEVICE, err);
		ng++;
	}
	if (st == TS_OK)
		st = operand_stage(core, sess, TS_ROLE_INPUT, &in, dev, err);
	if (st == TS_OK && tgt.arr)
		st = operand_stage(core, sess, TS_ROLE_TARGET, &tgt, dev, err);
	if (st == TS_OK && !ts_model_registry_advance(core->models, m->uid, 0, &base_steps))
		st = ts_error_set(err, TS_ABORTED, "MODEL_GONE", "model '%s' was deleted", m->name);
	if (st == TS_OK) {
		ran = true;
		st = ts_session_run(sess, s->steps, base_steps + 1,
		                    s->batches.on ? &batch_hooks : &step_hooks, s, err);
	}
	/* what the steps that succeeded did is published, also after a failure */
	{
		struct ts_error ierr;
		ts_status ist;

		ts_error_clear(&ierr);
		ist = step_install(s, &ierr);
		if (ist != TS_OK && st == TS_OK) {
			*err = ierr;
			st = ist;
		}
	}
	if (st == TS_OK && grads[0])
		st = ts_catalog_put_all(core->catalog, grads, (size_t)ng, true, err);
	/* what the run did: its result, or, when it stopped early, the
	 * operation's partial result (the losses of the steps that ran and
	 * where to continue) */
	if (ran) {
		json_t *res = run_json(s, sess, dev);

		if (st == TS_OK)
			ts_operation_set_result(op, res);
		else
			ts_operation_set_partial(op, res);
	}
	ts_session_free(sess);
	for (int r = 0; r < TS_ROLE_COUNT; r++) {
		ts_array_unref(s->next[r]);
		ts_array_unref(s->priv[r][0]);
		ts_array_unref(s->priv[r][1]);
		s->next[r] = s->priv[r][0] = s->priv[r][1] = NULL;
	}
	for (int g = 0; g < 4; g++)
		ts_array_unref(grads[g]);
	operand_release(&in);
	operand_release(&tgt);
	return st;
}

/* Takes into s->held the current version of each of the model's arrays of
 * roles (those it has), checking each is the model's and on one device;
 * what says what runs there ("steps", "evaluations"). */
static ts_status hold_roles(const struct ts_core *core, struct step *s,
                            const enum ts_pbuf_role *roles, size_t n, const char *what,
                            struct ts_error *err)
{
	char owner[160];

	ts_model_owner(&s->model, owner, sizeof owner);
	for (size_t i = 0; i < n; i++) {
		struct ts_array *a;
		char name[256];

		if (!has_role(&s->model, roles[i]))
			continue;
		ts_model_array_name(&s->model, roles[i], name, sizeof name);
		a = ts_catalog_get(core->catalog, name);
		if (!a)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_NOT_FOUND",
			                    "model array '%s' is missing", name);
		s->held[roles[i]] = a;
		if (strcmp(ts_array_owner(a), owner) != 0)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_NOT_OWNED",
			                    "array '%s' is not %s's", name, owner);
		if (ts_array_nshards(a) != 1)
			return ts_error_set(err, TS_UNIMPLEMENTED, "SHARDED_PARAMS",
			                    "model array '%s' is sharded; %s run on one device", name,
			                    what);
	}
	return TS_OK;
}

/* Submits s as an operation of kind holding its arrays (s is the
 * operation's once this succeeds; the caller keeps it on failure) and
 * answers the operation, or its result with ?wait=. */
static ts_status submit(const struct ts_call *call, struct ts_reply *reply, struct step *s,
                        const char *kind, uint64_t total, const char *unit,
                        ts_status (*run)(struct ts_operation *, void *, struct ts_error *),
                        struct ts_error *err)
{
	struct ts_operation *op = NULL;
	uint64_t wait_ns;

	if (ts_op_submit_holding(call->core->operations, kind, s->model.name, total, unit, run, s,
	                         step_release, step_hold, &op, err) != TS_OK)
		return err->status;
	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	ts_operation_unref(op);
	return TS_OK;
}

void ts_h_models_step(const struct ts_call *call, struct ts_reply *reply)
{
	struct step *s = calloc(1, sizeof *s);
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *inputs = NULL, *targets = NULL, *pl = NULL, *batches = NULL;
	json_int_t steps = 1;

	ts_error_clear(&err);
	if (!s) {
		ts_reply_oom(reply, "no memory for a step");
		return;
	}
	if (!ready_model_from_path(call, reply, &s->model)) {
		free(s);
		return;
	}
	s->core = call->core;
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s?o, s?I, s?o, s?o}", "inputs",
	                            &inputs, "targets", &targets, "steps", &steps, "placement", &pl,
	                            "batches", &batches) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "step body: %s (expected {\"inputs\": ..., \"targets\": ..., \"steps\": N, "
		             "\"batches\": {...}})", jerr.text);
		goto out_fail;
	}
	if (batches && batches_parse(batches, &s->batches, &err) != TS_OK)
		goto out_fail;
	if (step_operand_check(inputs, "inputs", &err) != TS_OK ||
	    (targets && step_operand_check(targets, "targets", &err) != TS_OK))
		goto out_fail;
	if (steps < 1 || steps > 1000000) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_STEPS", "steps is in 1..1000000");
		goto out_fail;
	}
	if (step_policy(call->core, &s->model, pl, true, &s->policy, &err) != TS_OK)
		goto out_fail;
	s->steps = (uint64_t)steps;
	/* copies: the worker drops them while this thread drops the body */
	s->inputs = json_deep_copy(inputs);
	s->targets = targets ? json_deep_copy(targets) : NULL;
	if (!s->inputs || (targets && !s->targets)) {
		ts_error_oom(&err, "no memory for the request's operands");
		goto out_fail;
	}
	/* the model's arrays by role, by the versions current now, to be held */
	if (hold_roles(call->core, s, param_roles, sizeof param_roles / sizeof param_roles[0],
	               "steps", &err) != TS_OK ||
	    submit(call, reply, s, "step", s->steps, "steps", step_run, &err) != TS_OK)
		goto out_fail;
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	step_release(s);
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
                                    struct eval_outputs *s, struct ts_error *err)
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

/* Whether the outputs may be published under their name: not over a held
 * array, nor over any model's array (an evaluation writes no weights). */
static ts_status eval_outputs_writable(const struct ts_core *core, const struct eval_outputs *o,
                                       struct ts_error *err)
{
	struct ts_array *a = ts_catalog_get(core->catalog, o->name);
	ts_status st = TS_OK;

	if (a && ts_array_owner(a)[0])
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_OWNED",
		                  "outputs.name '%s' is an array of %s; an evaluation writes its "
		                  "outputs to an array of its own", o->name, ts_array_owner(a));
	ts_array_unref(a);
	if (st == TS_OK)
		st = ts_catalog_check_write(core->catalog, o->name, NULL,
		                            &(struct ts_precondition){0}, err);
	return st;
}

static const struct ts_session_hooks eval_hooks = {.cancelled = step_cancelled};

static json_t *eval_result(const struct step *s, const struct ts_session *sess,
                           struct ts_device *dev, const struct ts_array *outs)
{
	const struct ts_plan *plan = ts_session_plan(sess);
	const struct ts_session_report *rep = ts_session_report(sess);
	json_t *o = json_pack("{s:s, s:f, s:I, s:s, s:I, s:I, s:I, s:I, s:o*,"
	                      " s:{s:f, s:f, s:f}, s:{s:I, s:I, s:I}}",
	                      "model", s->model.name, "loss", (double)rep->losses[0],
	                      "batch", (json_int_t)plan->batch, "device", ts_device_props(dev)->id,
	                      "predicted_peak_device_bytes", (json_int_t)plan->peak_device_bytes,
	                      "measured_peak_device_bytes",
	                      (json_int_t)(plan->argument_size_in_bytes + plan->output_size_in_bytes +
	                                   rep->measured_temp_peak),
	                      "predicted_temp_size_in_bytes", (json_int_t)plan->temp_size_in_bytes,
	                      "measured_temp_size_in_bytes", (json_int_t)rep->measured_temp_peak,
	                      "analysis", analysis_json(plan, false),
	                      "time", "wall_s", rep->wall_s, "compute_s", rep->compute_s,
	                      "transfer_not_hidden_s", rep->copy_wait_s,
	                      "bytes_moved", "h2d", (json_int_t)rep->h2d_bytes,
	                      "d2h", (json_int_t)rep->d2h_bytes,
	                      "staged_h2d", (json_int_t)rep->staged_h2d_bytes);

	if (o && outs)
		json_object_set_new(o, "outputs", ts_h_array_json(outs));
	return o;
}

static ts_status eval_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct step *s = arg;
	const struct ts_core *core = s->core;
	struct ts_model *m = &s->model;
	struct operand in = {0}, tgt = {0};
	struct ts_array *outs = NULL;
	struct ts_session_config cfg = {.mlp = m->mlp, .memory = core->memory, .evaluate = true};
	struct ts_session *sess = NULL;
	struct ts_device *dev = NULL;
	uint64_t bin = 0, btgt = 0, rows = 0;
	int id_bytes = 4;
	ts_status st;

	s->op = op;
	st = step_operand(core, s->inputs, "inputs", &in.arr, &in.rows_json, err);
	if (st == TS_OK && (m->mlp.loss == TS_LOSS_MSE || m->mlp.loss == TS_LOSS_XENT)) {
		if (!s->targets)
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "NO_TARGETS", "loss mse needs \"targets\"");
		else
			st = step_operand(core, s->targets, "targets", &tgt.arr, &tgt.rows_json, err);
	}
	if (st == TS_OK)
		st = step_place(s, &in, &tgt, &dev, err);
	if (st == TS_OK)
		st = operand_rows(&in, "inputs.rows", &bin, err);
	if (st == TS_OK && tgt.arr)
		st = operand_rows(&tgt, "targets.rows", &btgt, err);
	if (st == TS_OK && ts_mlp_tokens(&m->mlp))
		st = check_token_batch(s, &in, bin, &tgt, btgt, &rows, &id_bytes, err);
	else if (st == TS_OK)
		st = check_batch(s, &in, bin, &tgt, btgt, err);
	if (st == TS_OK)
		st = held_kind(s, false, &s->policy.params, err);
	if (st == TS_OK && ts_array_box(s->held[TS_ROLE_W1], 0)->device != dev)
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "PARAMS_ELSEWHERE",
		                  "model '%s' parameters are on %s, not %s", m->name,
		                  ts_device_props(ts_array_box(s->held[TS_ROLE_W1], 0)->device)->id,
		                  ts_device_props(dev)->id);
	if (st == TS_OK && s->out.outputs && s->out.dev && s->out.dev != dev)
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "OUTPUTS_ELSEWHERE",
		                  "outputs '%s' are asked for on %s, but the evaluation runs on %s, "
		                  "where model '%s' is", s->out.name, ts_device_props(s->out.dev)->id,
		                  ts_device_props(dev)->id, m->name);
	if (st == TS_OK) {
		cfg.dev = dev;
		cfg.policy = s->policy;
		cfg.batch = (int)(ts_mlp_tokens(&m->mlp) ? rows : bin);
		cfg.mlp.id_bytes = id_bytes;
		cfg.outputs = s->out.outputs;
		cfg.outputs_kind = s->out.kind;
		st = ts_session_new(&cfg, &sess, err);
	}
	for (int r = 0; st == TS_OK && r < TS_ROLE_COUNT; r++) {
		const struct ts_array *a = s->held[r];

		if (!a)
			continue;
		st = ts_session_bind(sess, (enum ts_pbuf_role)r,
		                     ts_buffer_data(ts_array_single_buffer(a)),
		                     ts_buffer_size(ts_array_single_buffer(a)),
		                     ts_array_placement(a)->sharding.memory_kind, err);
	}
	if (st == TS_OK && s->out.outputs) {
		struct ts_array_desc d = {.dtype = TS_DT_FLOAT32, .rank = 2,
		                          .shape = {bin, (uint64_t)m->mlp.d_model}};
		struct ts_placement pl;

		/* a token model's are the logits: the inputs' shape, then vocab */
		if (ts_mlp_tokens(&m->mlp)) {
			const struct ts_array_desc *id = ts_array_desc(in.arr);

			d.rank = id->rank + 1;
			d.shape[0] = bin;
			if (id->rank == 2)
				d.shape[1] = id->shape[1];
			d.shape[d.rank - 1] = (uint64_t)m->mlp.vocab;
		}

		ts_placement_single(&pl, dev, s->out.kind, true);
		st = ts_array_desc_init(&d, err);
		if (st == TS_OK)
			st = ts_array_new(s->out.name, &d, &pl, core->memory, &outs, err);
		if (st == TS_OK)
			st = ts_session_bind(sess, TS_ROLE_OUTPUT,
			                     ts_buffer_data(ts_array_single_buffer(outs)), d.nbytes,
			                     s->out.kind, err);
	}
	if (st == TS_OK)
		st = operand_stage(core, sess, TS_ROLE_INPUT, &in, dev, err);
	if (st == TS_OK && tgt.arr)
		st = operand_stage(core, sess, TS_ROLE_TARGET, &tgt, dev, err);
	if (st == TS_OK)
		st = ts_session_run(sess, 1, 1, &eval_hooks, s, err);
	/* the pass itself runs to its end; a cancel that came meanwhile drops it */
	if (st == TS_OK && ts_operation_cancelled(op))
		st = ts_error_set(err, TS_CANCELLED, "CANCELLED",
		                  "the evaluation of model '%s' was cancelled; no outputs were "
		                  "published", m->name);
	if (st == TS_OK && outs)
		st = eval_outputs_writable(core, &s->out, err);
	if (st == TS_OK && outs) {
		struct ts_precondition pre = {0};

		st = ts_catalog_put(core->catalog, outs, &pre, NULL, err);
	}
	if (st == TS_OK) {
		ts_operation_progress_add(op, 1);
		ts_operation_set_result(op, eval_result(s, sess, dev, outs));
	}
	ts_session_free(sess);
	ts_array_unref(outs);
	operand_release(&in);
	operand_release(&tgt);
	return st;
}

/* What an evaluation reads, and so holds: the weights (those the model has). */
static const enum ts_pbuf_role eval_roles[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_EMBED,
                                               TS_ROLE_PROJ};

void ts_h_models_evaluate(const struct ts_call *call, struct ts_reply *reply)
{
	struct step *s = calloc(1, sizeof *s);
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *inputs = NULL, *targets = NULL, *pl = NULL, *outs = NULL;

	ts_error_clear(&err);
	if (!s) {
		ts_reply_oom(reply, "no memory for an evaluation");
		return;
	}
	if (!ready_model_from_path(call, reply, &s->model)) {
		free(s);
		return;
	}
	s->core = call->core;
	s->steps = 1;
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s?o, s?o, s?o}", "inputs",
	                            &inputs, "targets", &targets, "outputs", &outs, "placement",
	                            &pl) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "evaluate body: %s (expected {\"inputs\": ..., \"targets\": ..., "
		             "\"outputs\": {\"name\": ...}})", jerr.text);
		goto out_fail;
	}
	if (step_operand_check(inputs, "inputs", &err) != TS_OK ||
	    (targets && step_operand_check(targets, "targets", &err) != TS_OK))
		goto out_fail;
	if (targets && s->model.mlp.loss != TS_LOSS_MSE && s->model.mlp.loss != TS_LOSS_XENT) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "UNEXPECTED_TARGETS",
		             "model '%s' has loss %s, which takes no \"targets\"", s->model.name,
		             ts_loss_name(s->model.mlp.loss));
		goto out_fail;
	}
	if (!targets && (s->model.mlp.loss == TS_LOSS_MSE || s->model.mlp.loss == TS_LOSS_XENT)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "NO_TARGETS", "loss %s needs \"targets\"",
		             ts_loss_name(s->model.mlp.loss));
		goto out_fail;
	}
	if (outs && eval_outputs_parse(call->core, outs, true, &s->out, &err) != TS_OK)
		goto out_fail;
	if (s->out.outputs && eval_outputs_writable(call->core, &s->out, &err) != TS_OK)
		goto out_fail;
	if (step_policy(call->core, &s->model, pl, true, &s->policy, &err) != TS_OK)
		goto out_fail;
	/* copies: the worker drops them while this thread drops the body */
	s->inputs = json_deep_copy(inputs);
	s->targets = targets ? json_deep_copy(targets) : NULL;
	if (!s->inputs || (targets && !s->targets)) {
		ts_error_oom(&err, "no memory for the request's operands");
		goto out_fail;
	}
	/* the parameters by role, as current now, held for reading */
	if (hold_roles(call->core, s, eval_roles, sizeof eval_roles / sizeof eval_roles[0], "evaluations", &err) != TS_OK ||
	    submit(call, reply, s, "evaluate", 1, "passes", eval_run, &err) != TS_OK)
		goto out_fail;
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	step_release(s);
	json_decref(body);
}
