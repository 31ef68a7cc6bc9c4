/*
 * models.c - training models over HTTP: POST/GET/DELETE /v1/models,
 * POST /v1/models/{model}:analyze (the memory analysis of a step, before
 * any run) and POST /v1/models/{model}:step (run N steps as an operation).
 *
 * A step runs where the model's parameters are: committed arrays decide the
 * device, uncommitted inputs follow (counted as implicit transfers), inputs
 * taken as rows of a dataset move only those rows. The parameters' and
 * optimizer state's memory kinds are read from their arrays, so moving
 * "{model}.w1" to pinned_host offloads it; the call may override the
 * activation policy and prefetch depth.
 */
#include "handlers/arrays_int.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "handlers/operations.h"
#include "storage/array_io.h"
#include "storage/colocate.h"
#include "storage/operation.h"
#include "train/exec.h"
#include "train/model.h"

#define INIT_CHUNK (1u << 20)   /* floats generated per write */

static const enum ts_pbuf_role param_roles[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_MU_W1,
                                                TS_ROLE_MU_W2, TS_ROLE_NU_W1, TS_ROLE_NU_W2};

/* Whether the model has the array of this role. */
static bool has_role(const struct ts_model *m, enum ts_pbuf_role r)
{
	bool second = r == TS_ROLE_W2 || r == TS_ROLE_MU_W2 || r == TS_ROLE_NU_W2;
	bool state = r >= TS_ROLE_MU_W1 && r <= TS_ROLE_NU_W2;

	return (!second || ts_mlp_has_w2(&m->mlp)) && (!state || m->opt.type == TS_OPT_ADAM);
}

/* ---- parsing -------------------------------------------------------------------- */

static ts_status parse_names(json_t *list, const char *field, bool *x, bool *h,
                             struct ts_error *err)
{
	size_t i;
	json_t *v;

	*x = *h = false;
	if (!list)
		return TS_OK;
	if (!json_is_array(list))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "placement.activations.%s is a list of \"x\" and \"h\"", field);
	json_array_foreach(list, i, v) {
		const char *s = json_string_value(v);

		if (s && strcmp(s, "x") == 0)
			*x = true;
		else if (s && strcmp(s, "h") == 0)
			*h = true;
		else
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
			                    "placement.activations.%s[%zu] is not \"x\" or \"h\"", field, i);
	}
	return TS_OK;
}

/* A field's expected JSON type, for errors that name the field. */
struct field {
	const char *key;
	json_type type;        /* JSON_TRUE stands for any boolean, JSON_REAL for any number */
};

/* Checks obj's keys against fields: unknown keys and wrong types are
 * INVALID_ARGUMENT naming "<where>.<key>". */
static ts_status check_fields(json_t *obj, const char *where, const char *reason,
                              const struct field *fields, size_t n, struct ts_error *err)
{
	static const char *const names[] = {"an object", "a list", "a string", "an integer",
	                                    "a number", "a boolean", "a boolean", "null"};
	const char *key;
	json_t *v;

	if (!json_is_object(obj))
		return ts_error_set(err, TS_INVALID_ARGUMENT, reason, "%s must be an object", where);
	json_object_foreach(obj, key, v) {
		size_t i;

		for (i = 0; i < n && strcmp(fields[i].key, key) != 0; i++)
			;
		if (i == n)
			return ts_error_set(err, TS_INVALID_ARGUMENT, reason,
			                    "%s.%s is not a field this API knows", where, key);
		if (fields[i].type == JSON_TRUE ? !json_is_boolean(v)
		    : fields[i].type == JSON_REAL ? !json_is_number(v)
		                                  : json_typeof(v) != fields[i].type)
			return ts_error_set(err, TS_INVALID_ARGUMENT, reason, "%s.%s must be %s", where, key,
			                    names[fields[i].type]);
	}
	return TS_OK;
}

#define NFIELDS(f) (sizeof (f) / sizeof (f)[0])

static const struct field model_fields[] = {
	{"name", JSON_STRING}, {"mlp", JSON_OBJECT}, {"dtype", JSON_STRING}, {"init", JSON_OBJECT},
	{"loss", JSON_STRING}, {"optimizer", JSON_OBJECT}, {"placement", JSON_OBJECT},
};
static const struct field mlp_fields[] = {
	{"layers", JSON_INTEGER}, {"d_model", JSON_INTEGER}, {"d_hidden", JSON_INTEGER},
	{"activation", JSON_STRING}, {"residual", JSON_TRUE},
};
static const struct field placement_fields[] = {
	{"device", JSON_STRING}, {"params", JSON_STRING}, {"opt_state", JSON_STRING},
	{"activations", JSON_OBJECT}, {"prefetch_depth", JSON_INTEGER},
};
static const struct field activation_fields[] = {{"save", JSON_ARRAY}, {"offload", JSON_ARRAY}};
static const struct field init_fields[] = {
	{"seed", JSON_INTEGER}, {"scale", JSON_REAL}, {"constant", JSON_REAL},
};
static const struct field optimizer_fields[] = {
	{"type", JSON_STRING}, {"learning_rate", JSON_REAL}, {"b1", JSON_REAL}, {"b2", JSON_REAL},
	{"eps", JSON_REAL}, {"clip_global_norm", JSON_REAL},
};

/* Activations and prefetch from a "placement" object (absent fields keep *p). */
static ts_status parse_policy(json_t *pl, struct ts_policy *p, struct ts_error *err)
{
	json_t *acts = json_object_get(pl, "activations"), *pf = json_object_get(pl, "prefetch_depth");
	const char *params = json_string_value(json_object_get(pl, "params"));
	const char *state = json_string_value(json_object_get(pl, "opt_state"));

	if (check_fields(pl, "placement", "BAD_POLICY", placement_fields, NFIELDS(placement_fields),
	                 err) != TS_OK ||
	    (acts && check_fields(acts, "placement.activations", "BAD_POLICY", activation_fields,
	                          NFIELDS(activation_fields), err) != TS_OK))
		return err->status;
	if (params && !ts_memory_kind_parse(params, &p->params))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "placement.params '%s' is not device or pinned_host", params);
	if (state && !ts_memory_kind_parse(state, &p->opt_state))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "placement.opt_state '%s' is not device or pinned_host", state);
	if (acts) {
		if (!json_is_object(acts) ||
		    parse_names(json_object_get(acts, "save"), "save", &p->save_x, &p->save_h, err) != TS_OK ||
		    parse_names(json_object_get(acts, "offload"), "offload", &p->offload_x, &p->offload_h,
		                err) != TS_OK)
			return err->status ? err->status
			                   : ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
			                                  "placement.activations is {\"save\": [...], \"offload\": [...]}");
	}
	if (pf) {
		if (json_integer_value(pf) < 0 || json_integer_value(pf) > 1)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
			                    "placement.prefetch_depth is 0 or 1");
		p->prefetch_depth = (int)json_integer_value(pf);
	}
	return ts_policy_check(p, err);
}

struct init_spec {
	bool constant;
	double value, scale;
	uint64_t seed;
};

static ts_status parse_model(const struct ts_core *core, json_t *body, struct ts_model *m,
                             struct init_spec *init, struct ts_error *err)
{
	json_t *mlp = NULL, *opt = NULL, *pl = NULL, *in = NULL;
	const char *name = NULL, *act = "relu", *loss = "sum", *dtype = "float32", *dev = NULL;
	json_int_t layers = 0, d = 0, h = 0;
	int residual = 0;
	json_error_t jerr;

	memset(m, 0, sizeof *m);
	if (check_fields(body, "model", "BAD_MODEL", model_fields, NFIELDS(model_fields), err) != TS_OK ||
	    (json_object_get(body, "mlp") &&
	     check_fields(json_object_get(body, "mlp"), "mlp", "BAD_MODEL", mlp_fields,
	                  NFIELDS(mlp_fields), err) != TS_OK) ||
	    (json_object_get(body, "optimizer") &&
	     check_fields(json_object_get(body, "optimizer"), "optimizer", "BAD_OPTIMIZER",
	                  optimizer_fields, NFIELDS(optimizer_fields), err) != TS_OK) ||
	    (json_object_get(body, "init") &&
	     check_fields(json_object_get(body, "init"), "init", "BAD_INIT", init_fields,
	                  NFIELDS(init_fields), err) != TS_OK))
		return err->status;
	if (json_unpack_ex(body, &jerr, JSON_STRICT, "{s:s, s:{s:I, s:I, s?I, s?s, s?b}, s?s, s?o, s?s, s?o, s?o}",
	                   "name", &name, "mlp", "layers", &layers, "d_model", &d, "d_hidden", &h,
	                   "activation", &act, "residual", &residual, "dtype", &dtype, "init", &in,
	                   "loss", &loss, "optimizer", &opt, "placement", &pl) != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL", "model: %s", jerr.text);
	(void)mlp;
	if (!ts_array_name_valid(name) || strlen(name) > TS_MODEL_NAME_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL_NAME",
		                    "model name '%s' is invalid (array-name rules, at most %d characters)",
		                    name, TS_MODEL_NAME_MAX);
	snprintf(m->name, sizeof m->name, "%s", name);
	if (layers < 1 || d < 1 || h < 0 || layers > 4096 || d > 65536 || h > 65536)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "mlp.layers, mlp.d_model (and mlp.d_hidden) must be positive");
	if (strcmp(dtype, "float32") != 0)
		return ts_error_set(err, TS_UNIMPLEMENTED, "BAD_DTYPE",
		                    "models train in float32; dtype '%s' is not supported", dtype);
	m->mlp = (struct ts_mlp){.layers = (int)layers, .d_model = (int)d, .d_hidden = (int)h,
	                         .residual = residual};
	if (!ts_act_parse(act, &m->mlp.act))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "mlp.activation '%s' is not none, relu, gelu or tanh", act);
	if (!ts_loss_parse(loss, &m->mlp.loss))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL", "loss '%s' is not sum or mse", loss);
	m->opt = (struct ts_optimizer){.type = TS_OPT_NONE, .learning_rate = 1e-3f, .b1 = 0.9f,
	                               .b2 = 0.999f, .eps = 1e-8f};
	if (opt) {
		const char *type = "none";
		double lr = m->opt.learning_rate, b1 = m->opt.b1, b2 = m->opt.b2, eps = m->opt.eps, clip = 0;

		if (json_unpack_ex(opt, &jerr, JSON_STRICT, "{s?s, s?F, s?F, s?F, s?F, s?F}", "type", &type,
		                   "learning_rate", &lr, "b1", &b1, "b2", &b2, "eps", &eps,
		                   "clip_global_norm", &clip) != 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER", "optimizer: %s", jerr.text);
		if (!ts_opt_parse(type, &m->opt.type))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.type '%s' is not none, sgd or adam", type);
		if (!(lr > 0) || b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1 || eps < 0 || clip < 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer: learning_rate > 0, b1 and b2 in [0, 1), eps and "
			                    "clip_global_norm >= 0");
		m->opt.learning_rate = (float)lr;
		m->opt.b1 = (float)b1;
		m->opt.b2 = (float)b2;
		m->opt.eps = (float)eps;
		m->opt.clip_global_norm = (float)clip;
	}
	*init = (struct init_spec){.scale = 0.02};
	if (in) {
		json_int_t seed = 0;
		double c = 0, scale = 0.02;

		if (json_object_get(in, "constant")) {
			if (json_unpack_ex(in, &jerr, JSON_STRICT, "{s:F}", "constant", &c) != 0)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INIT", "init: %s", jerr.text);
			init->constant = true;
			init->value = c;
		} else {
			if (json_unpack_ex(in, &jerr, JSON_STRICT, "{s?I, s?F}", "seed", &seed, "scale", &scale) != 0)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INIT", "init: %s", jerr.text);
			init->seed = (uint64_t)seed;
			init->scale = scale;
		}
	}
	m->policy = (struct ts_policy){.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                               .save_x = true, .save_h = true};
	m->device = core->default_device;
	if (pl) {
		dev = json_string_value(json_object_get(pl, "device"));
		if (dev && !(m->device = ts_device_set_find(core->devices, dev)))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
			                    "placement.device '%s' is not a device of this node", dev);
		if (json_object_get(pl, "activations")) {
			m->policy.save_x = m->policy.save_h = false;
		}
		if (parse_policy(pl, &m->policy, err) != TS_OK)
			return err->status;
	}
	return TS_OK;
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
static ts_status init_array(const struct ts_core *core, struct ts_array *a, enum ts_pbuf_role role,
                            const struct init_spec *in, struct ts_error *err)
{
	uint64_t n = ts_array_desc(a)->nbytes / 4, done = 0, state = in->seed * 1000003ull + (uint64_t)role;
	struct ts_array_writer *w = NULL;
	float *chunk = malloc(INIT_CHUNK * sizeof *chunk);
	bool zero = role >= TS_ROLE_MU_W1;
	ts_status st;

	if (!chunk)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", "no memory to initialise");
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
	}
	if (st == TS_OK)
		st = ts_array_writer_finish(w, err);
	ts_array_writer_free(w);
	free(chunk);
	return st;
}

static json_t *model_json(const struct ts_model *m)
{
	json_t *arrays = json_object(), *save = json_array(), *offload = json_array();
	char name[256];

	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++) {
		if (!has_role(m, param_roles[i]))
			continue;
		ts_model_array_name(m, param_roles[i], name, sizeof name);
		json_object_set_new(arrays, strchr(name, '.') + 1, json_string(name));
	}
	if (m->policy.save_x)
		json_array_append_new(save, json_string("x"));
	if (m->policy.save_h)
		json_array_append_new(save, json_string("h"));
	if (m->policy.offload_x)
		json_array_append_new(offload, json_string("x"));
	if (m->policy.offload_h)
		json_array_append_new(offload, json_string("h"));
	return json_pack("{s:s, s:{s:i, s:i, s:i, s:s, s:b}, s:s, s:s, s:{s:s, s:f, s:f, s:f, s:f, s:f},"
	                 " s:{s:s, s:s, s:s, s:{s:o, s:o}, s:i}, s:o, s:I}",
	                 "name", m->name, "mlp", "layers", m->mlp.layers, "d_model", m->mlp.d_model,
	                 "d_hidden", m->mlp.d_hidden, "activation", ts_act_name(m->mlp.act),
	                 "residual", m->mlp.residual, "dtype", "float32",
	                 "loss", ts_loss_name(m->mlp.loss), "optimizer",
	                 "type", ts_opt_name(m->opt.type), "learning_rate", (double)m->opt.learning_rate,
	                 "b1", (double)m->opt.b1, "b2", (double)m->opt.b2, "eps", (double)m->opt.eps,
	                 "clip_global_norm", (double)m->opt.clip_global_norm,
	                 "placement", "device", ts_device_props(m->device)->id,
	                 "params", ts_memory_kind_name(m->policy.params),
	                 "opt_state", ts_memory_kind_name(m->policy.opt_state),
	                 "activations", "save", save, "offload", offload,
	                 "prefetch_depth", m->policy.prefetch_depth,
	                 "arrays", arrays, "steps", (json_int_t)m->steps);
}

void ts_h_models_create(const struct ts_call *call, struct ts_reply *reply)
{
	const struct ts_core *core = call->core;
	struct ts_array *arrs[6] = {NULL};
	struct ts_model m = {0};
	struct init_spec init = {.scale = 0.02};
	struct ts_error err;
	json_error_t jerr;
	json_t *body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	size_t n = 0;
	bool registered = false;

	ts_error_clear(&err);
	if (!json_is_object(body)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "body: %s",
		             body ? "must be a JSON object" : jerr.text);
		goto out_fail;
	}
	if (parse_model(core, body, &m, &init, &err) != TS_OK)
		goto out_fail;
	m.create_ns = ts_wall_ns();
	if (ts_model_registry_put(core->models, &m, &err) != TS_OK)
		goto out_fail;
	registered = true;
	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++) {
		enum ts_pbuf_role role = param_roles[i];
		struct ts_array_desc d = {.dtype = TS_DT_FLOAT32, .rank = 3};
		struct ts_placement pl;
		char name[256];

		if (!has_role(&m, role))
			continue;
		ts_model_array_name(&m, role, name, sizeof name);
		ts_model_param_shape(&m, role, d.shape);
		ts_placement_single(&pl, m.device, role <= TS_ROLE_W2 ? m.policy.params : m.policy.opt_state,
		                    true);
		if (ts_array_desc_init(&d, &err) != TS_OK ||
		    ts_array_new(name, &d, &pl, core->memory, &arrs[n], &err) != TS_OK ||
		    init_array(core, arrs[n], role, &init, &err) != TS_OK)
			goto out_fail;
		n++;
	}
	if (ts_catalog_put_all(core->catalog, arrs, n, false, &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_CREATED, model_json(&m));
	goto out_free;

out_fail:
	if (registered)
		ts_model_registry_remove(core->models, m.name);
	ts_reply_error(reply, &err);
out_free:
	for (size_t i = 0; i < n + 1 && i < 6; i++)
		ts_array_unref(arrs[i]);
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

void ts_h_models_list(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model *all = malloc(1024 * sizeof *all);
	json_t *list = json_array();
	size_t n = all ? ts_model_registry_list(call->core->models, all, 1024) : 0;

	for (size_t i = 0; list && i < n; i++)
		json_array_append_new(list, model_json(&all[i]));
	free(all);
	ts_reply_json(reply, TS_HTTP_OK, json_pack("{s:o*}", "models", list));
}

void ts_h_models_get(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;

	if (model_from_path(call, reply, &m))
		ts_reply_json(reply, TS_HTTP_OK, model_json(&m));
}

void ts_h_models_delete(const struct ts_call *call, struct ts_reply *reply)
{
	struct ts_model m;
	struct ts_error ignore;
	char name[256];

	if (!model_from_path(call, reply, &m))
		return;
	ts_model_registry_remove(call->core->models, m.name);
	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0]; i++) {
		if (!has_role(&m, param_roles[i]))
			continue;
		ts_model_array_name(&m, param_roles[i], name, sizeof name);
		ts_error_clear(&ignore);
		(void)ts_catalog_delete(call->core->catalog, name, NULL, &ignore);
	}
	for (int g = 1; g <= 2; g++) {        /* gradients of earlier steps, if any */
		snprintf(name, sizeof name, "%s.grad.w%d", m.name, g);
		ts_error_clear(&ignore);
		(void)ts_catalog_delete(call->core->catalog, name, NULL, &ignore);
	}
	ts_reply_json(reply, TS_HTTP_OK, json_object());
}

/* ---- analysis ------------------------------------------------------------------- */

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
	static const enum ts_pbuf_role params[] = {TS_ROLE_W1, TS_ROLE_W2};
	static const enum ts_pbuf_role state[] = {TS_ROLE_MU_W1, TS_ROLE_MU_W2, TS_ROLE_NU_W1,
	                                          TS_ROLE_NU_W2};

	*out = m->policy;
	if (arrays_kind(core, m, params, 2, &out->params, err) != TS_OK ||
	    arrays_kind(core, m, state, 4, &out->opt_state, err) != TS_OK)
		return err->status;
	if (for_step && pl && (json_object_get(pl, "params") || json_object_get(pl, "opt_state")))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "placement.%s cannot change in a step: a step runs with the "
		                    "model's arrays where they are; move them with :put",
		                    json_object_get(pl, "params") ? "params" : "opt_state");
	if (pl && json_object_get(pl, "activations"))
		out->save_x = out->save_h = out->offload_x = out->offload_h = false;
	return pl ? parse_policy(pl, out, err) : ts_policy_check(out, err);
}

static json_t *analysis_json(const struct ts_plan *p, bool timeline)
{
	json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	                      "argument_size_in_bytes", (json_int_t)p->argument_size_in_bytes,
	                      "output_size_in_bytes", (json_int_t)p->output_size_in_bytes,
	                      "alias_size_in_bytes", (json_int_t)p->alias_size_in_bytes,
	                      "temp_size_in_bytes", (json_int_t)p->temp_size_in_bytes,
	                      "host_argument_size_in_bytes", (json_int_t)p->host_argument_size_in_bytes,
	                      "host_output_size_in_bytes", (json_int_t)p->host_output_size_in_bytes,
	                      "host_alias_size_in_bytes", (json_int_t)p->host_alias_size_in_bytes,
	                      "host_temp_size_in_bytes", (json_int_t)p->host_temp_size_in_bytes,
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
	json_t *body, *batch, *pl;
	json_int_t B = 0, D = 0;

	if (!model_from_path(call, reply, &m))
		return;
	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	pl = NULL;
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s?o}", "batch", &batch,
	                            "placement", &pl) != 0 ||
	    json_unpack_ex(batch, &jerr, JSON_STRICT, "[II]", &B, &D) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "analyze body: %s (expected {\"batch\": [B, d]})", jerr.text);
		goto out_fail;
	}
	if (D != m.mlp.d_model || B < 1 || B > (1 << 24)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_BATCH",
		             "batch [%lld, %lld] does not fit the model: [B >= 1, d_model = %d]",
		             (long long)B, (long long)D, m.mlp.d_model);
		goto out_fail;
	}
	if (step_policy(call->core, &m, pl, false, &pol, &err) != TS_OK ||
	    ts_plan_build(&m.mlp, &m.opt, (int)B, &pol, &plan, &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_OK, analysis_json(&plan, true));
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
	struct init_spec init;
	struct ts_plan plan;
	struct ts_error err;
	json_error_t jerr;
	json_t *body, *spec = NULL, *batch = NULL;
	json_int_t B = 0, D = 0;

	ts_error_clear(&err);
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s:o}", "model", &spec, "batch",
	                            &batch) != 0 ||
	    json_unpack_ex(batch, &jerr, JSON_STRICT, "[II]", &B, &D) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "analyze body: %s (expected {\"model\": {...}, \"batch\": [B, d]})", jerr.text);
		goto out_fail;
	}
	if (!json_object_get(spec, "name"))
		json_object_set_new(spec, "name", json_string("analysis"));
	if (parse_model(call->core, spec, &m, &init, &err) != TS_OK)
		goto out_fail;
	if (D != m.mlp.d_model || B < 1 || B > (1 << 24)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_BATCH",
		             "batch [%lld, %lld] does not fit the model: [B >= 1, d_model = %d]",
		             (long long)B, (long long)D, m.mlp.d_model);
		goto out_fail;
	}
	if (ts_plan_build(&m.mlp, &m.opt, (int)B, &m.policy, &plan, &err) != TS_OK)
		goto out_fail;
	ts_reply_json(reply, TS_HTTP_OK, analysis_json(&plan, true));
	ts_plan_release(&plan);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}

/* ---- steps ---------------------------------------------------------------------- */

struct step {
	const struct ts_core *core;
	struct ts_model model;
	struct ts_policy policy;
	uint64_t steps;
	json_t *inputs, *targets;          /* the request's fields (own references) */
};

static void step_release(void *arg)
{
	struct step *s = arg;

	json_decref(s->inputs);
	json_decref(s->targets);
	free(s);
}

/* A device-memory copy of rows (or all) of a catalog array, on dev: only the
 * selected rows cross. New reference, never published. */
static ts_status stage_rows(const struct ts_core *core, struct ts_array *src, json_t *rows,
                            struct ts_device *dev, struct ts_array **out, struct ts_error *err)
{
	const struct ts_array_desc *sd = ts_array_desc(src);
	struct ts_array_desc d = *sd;
	struct ts_placement pl;
	struct ts_run *runs = NULL;
	uint64_t row_bytes = sd->rank ? (sd->shape[0] ? sd->nbytes / sd->shape[0] : 0) : sd->nbytes;
	size_t n = 1;
	ts_status st;

	if (!rows && ts_array_single_buffer(src) && ts_array_box(src, 0)->device == dev &&
	    ts_array_placement(src)->sharding.memory_kind == TS_MEM_DEVICE) {
		*out = ts_array_ref(src);      /* already where the step needs it: no copy */
		return TS_OK;
	}
	ts_placement_single(&pl, dev, TS_MEM_DEVICE, false);
	if (rows && sd->rank >= 1) {
		size_t cnt = json_is_array(rows) ? json_array_size(rows) : 0;
		int64_t *raw = calloc(cnt ? cnt : 1, sizeof *raw);
		uint64_t *norm = calloc(cnt ? cnt : 1, sizeof *norm);

		if (!json_is_array(rows) || !raw || !norm) {
			free(raw);
			free(norm);
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_ROWS", "\"rows\" is a list of integers");
		}
		for (size_t i = 0; i < cnt; i++)
			raw[i] = (int64_t)json_integer_value(json_array_get(rows, i));
		st = ts_rows_check(raw, cnt, sd->shape[0], norm, err);
		free(raw);
		if (st != TS_OK) {
			free(norm);
			return st;
		}
		runs = calloc(cnt ? cnt : 1, sizeof *runs);
		for (size_t i = 0; runs && i < cnt; i++)
			runs[i] = (struct ts_run){norm[i] * row_bytes, i * row_bytes, row_bytes};
		free(norm);
		n = cnt;
		d.shape[0] = cnt;
	} else {
		runs = calloc(1, sizeof *runs);
		if (runs)
			runs[0] = (struct ts_run){0, 0, sd->nbytes};
	}
	if (!runs)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", "no memory for rows");
	st = ts_array_desc_init(&d, err);
	if (st == TS_OK)
		st = ts_array_new(ts_array_name(src), &d, &pl, core->memory, out, err);
	if (st == TS_OK)
		st = ts_array_copy(core->stager, *out, NULL, src, runs, n, NULL, NULL, NULL, err);
	free(runs);
	return st;
}

/* Resolves "inputs"/"targets": a name, or {"array": name, "rows": [...]}. */
static ts_status step_operand(const struct ts_core *core, json_t *spec, const char *what,
                              struct ts_array **arr, json_t **rows, struct ts_error *err)
{
	const char *name = json_string_value(spec);

	*rows = NULL;
	if (!name && json_is_object(spec)) {
		name = json_string_value(json_object_get(spec, "array"));
		*rows = json_object_get(spec, "rows");
	}
	if (!name)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"%s\" is an array name or {\"array\": name, \"rows\": [...]}", what);
	*arr = ts_catalog_get(core->catalog, name);
	if (!*arr)
		return ts_error_set(err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "%s array '%s' not found", what, name);
	return TS_OK;
}

static ts_status step_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct step *s = arg;
	const struct ts_core *core = s->core;
	struct ts_model *m = &s->model;
	struct ts_array *arrs[8] = {NULL}, *grads[2] = {NULL}, *in_dev = NULL, *tgt_dev = NULL;
	size_t narrs = 0, nparams = 0;
	json_t *in_rows = NULL, *tgt_rows = NULL, *losses = json_array(), *result = NULL;
	struct ts_device *dev = NULL;
	struct ts_kernels *k = NULL;
	struct ts_exec_env env = {0};
	struct ts_plan plan = {0};
	void **args = NULL;
	uint64_t base_steps, measured_temp = 0, measured_host = 0, h2d = 0, d2h = 0;
	uint64_t dev_args = 0;
	double wall = 0, compute = 0, waits = 0;
	ts_status st = TS_OK;
	char name[256];

	/* the model's arrays (committed) and the operands */
	for (size_t i = 0; i < sizeof param_roles / sizeof param_roles[0] && st == TS_OK; i++) {
		if (!has_role(m, param_roles[i]))
			continue;
		ts_model_array_name(m, param_roles[i], name, sizeof name);
		arrs[narrs] = ts_catalog_get(core->catalog, name);
		if (!arrs[narrs])
			st = ts_error_set(err, TS_FAILED_PRECONDITION, "ARRAY_NOT_FOUND",
			                  "model array '%s' is missing", name);
		else if (ts_array_nshards(arrs[narrs]) != 1)
			st = ts_error_set(err, TS_UNIMPLEMENTED, "SHARDED_PARAMS",
			                  "model array '%s' is sharded; steps run on one device", name);
		narrs++;
	}
	nparams = narrs;
	if (st == TS_OK)
		st = step_operand(core, s->inputs, "inputs", &arrs[narrs++], &in_rows, err);
	if (st == TS_OK && m->mlp.loss == TS_LOSS_MSE) {
		if (!s->targets)
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "NO_TARGETS", "loss mse needs \"targets\"");
		else
			st = step_operand(core, s->targets, "targets", &arrs[narrs++], &tgt_rows, err);
	}
	/* where it runs: committed arrays decide; uncommitted operands follow
	 * (rows of a dataset are gathered instead: only they move) */
	if (st == TS_OK) {
		/* the params and every operand given by name are used together; an
		 * operand given as rows is gathered instead (only its rows move) */
		struct ts_array *use[8];
		size_t nuse = 0, where_in = SIZE_MAX, where_tgt = SIZE_MAX;

		for (size_t i = 0; i < nparams; i++)
			use[nuse++] = arrs[i];
		if (!in_rows) {
			where_in = nuse;
			use[nuse++] = arrs[nparams];
		}
		if (m->mlp.loss == TS_LOSS_MSE && !tgt_rows) {
			where_tgt = nuse;
			use[nuse++] = arrs[nparams + 1];
		}
		st = ts_colocate(core->catalog, core->stager, core->memory, use, nuse, m->device, &dev, err);
		/* colocation may have replaced a moved operand by its new version */
		if (where_in != SIZE_MAX)
			arrs[nparams] = use[where_in];
		if (where_tgt != SIZE_MAX)
			arrs[nparams + 1] = use[where_tgt];
		for (size_t i = 0; i < nparams; i++)
			arrs[i] = use[i];
	}
	if (st == TS_OK)
		st = stage_rows(core, arrs[nparams], in_rows, dev, &in_dev, err);
	if (st == TS_OK && m->mlp.loss == TS_LOSS_MSE)
		st = stage_rows(core, arrs[nparams + 1], tgt_rows, dev, &tgt_dev, err);
	if (st == TS_OK) {
		const struct ts_array_desc *d = ts_array_desc(in_dev);

		if (d->dtype != TS_DT_FLOAT32 || d->rank != 2 || d->shape[1] != (uint64_t)m->mlp.d_model ||
		    d->shape[0] == 0)
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_INPUTS",
			                  "inputs must be float32 [B, %d] with B >= 1", m->mlp.d_model);
		else if (tgt_dev && memcmp(ts_array_desc(tgt_dev)->shape, d->shape, 2 * sizeof d->shape[0]))
			st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_TARGETS",
			                  "targets must have the shape of the inputs");
	}
	/* the plan, with params and opt state where their arrays are */
	if (st == TS_OK) {
		/* where the arrays are at run time (a :put may have moved them since) */
		static const enum ts_pbuf_role pr[] = {TS_ROLE_W1, TS_ROLE_W2};
		static const enum ts_pbuf_role sr[] = {TS_ROLE_MU_W1, TS_ROLE_MU_W2, TS_ROLE_NU_W1,
		                                       TS_ROLE_NU_W2};

		st = arrays_kind(core, m, pr, 2, &s->policy.params, err);
		if (st == TS_OK)
			st = arrays_kind(core, m, sr, 4, &s->policy.opt_state, err);
	}
	if (st == TS_OK) {
		st = ts_plan_build(&m->mlp, &m->opt, (int)ts_array_desc(in_dev)->shape[0], &s->policy,
		                   &plan, err);
	}
	if (st == TS_OK && ts_array_box(arrs[0], 0)->device != dev)
		st = ts_error_set(err, TS_FAILED_PRECONDITION, "PARAMS_ELSEWHERE",
		                  "model '%s' parameters are on %s, not %s", m->name,
		                  ts_device_props(ts_array_box(arrs[0], 0)->device)->id,
		                  ts_device_props(dev)->id);
	/* outputs: gradients when there is no optimizer */
	if (st == TS_OK && m->opt.type == TS_OPT_NONE) {
		for (int g = 0; g < (ts_mlp_has_w2(&m->mlp) ? 2 : 1) && st == TS_OK; g++) {
			struct ts_placement pl;

			snprintf(name, sizeof name, "%s.grad.w%d", m->name, g + 1);
			ts_placement_single(&pl, dev, TS_MEM_DEVICE, true);
			st = ts_array_new(name, ts_array_desc(arrs[g]), &pl, core->memory, &grads[g], err);
		}
	}
	/* bind arguments and outputs to memory */
	if (st == TS_OK) {
		args = calloc((size_t)plan.nbufs, sizeof *args);
		if (!args)
			st = ts_error_set(err, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", "no memory to bind");
	}
	for (int i = 0; st == TS_OK && i < plan.nbufs; i++) {
		const struct ts_pbuf *b = &plan.bufs[i];
		struct ts_array *a = NULL;

		if (b->cls == TS_PB_TEMP)
			continue;
		switch (b->role) {
		case TS_ROLE_W1: a = arrs[0]; break;
		case TS_ROLE_W2: a = arrs[1]; break;
		case TS_ROLE_MU_W1: a = arrs[ts_mlp_has_w2(&m->mlp) ? 2 : 1]; break;
		case TS_ROLE_MU_W2: a = arrs[3]; break;
		case TS_ROLE_NU_W1: a = arrs[ts_mlp_has_w2(&m->mlp) ? 4 : 2]; break;
		case TS_ROLE_NU_W2: a = arrs[5]; break;
		case TS_ROLE_INPUT: a = in_dev; break;
		case TS_ROLE_TARGET: a = tgt_dev; break;
		case TS_ROLE_GRAD_W1: a = grads[0]; break;
		case TS_ROLE_GRAD_W2: a = grads[1]; break;
		default: break;
		}
		if (!a || ts_buffer_size(ts_array_single_buffer(a)) != b->bytes ||
		    ts_array_placement(a)->sharding.memory_kind != b->kind) {
			st = ts_error_set(err, TS_FAILED_PRECONDITION, "BAD_BINDING",
			                  "array for plan buffer %d does not match the plan", i);
			break;
		}
		args[i] = ts_buffer_data(ts_array_single_buffer(a));
		if (b->kind == TS_MEM_DEVICE)
			dev_args += b->bytes;
	}
	/* the environment: kernels and three queues on the device */
	if (st == TS_OK) {
		env.dev = dev;
		env.device_space = ts_memory_find(core->memory, ts_device_props(dev)->id, TS_MEM_DEVICE);
		env.pinned_space = ts_memory_find(core->memory, ts_device_props(dev)->id, TS_MEM_PINNED_HOST);
		st = ts_kernels_new(dev, &k, err);
		env.kernels = k;
	}
	if (st == TS_OK)
		st = ts_queue_new(dev, &env.compute, err);
	if (st == TS_OK)
		st = ts_queue_new(dev, &env.h2d, err);
	if (st == TS_OK)
		st = ts_queue_new(dev, &env.d2h, err);
	base_steps = ts_model_registry_advance(core->models, m->name, 0);
	for (uint64_t i = 0; st == TS_OK && i < s->steps; i++) {
		struct ts_exec_result r;

		if (ts_operation_cancelled(op)) {
			st = ts_error_set(err, TS_CANCELLED, "CANCELLED", "the steps were cancelled after %llu",
			                  (unsigned long long)i);
			break;
		}
		st = ts_exec_run(&plan, &env, args, (int)(base_steps + i + 1), &r, err);
		if (st != TS_OK)
			break;
		if (m->opt.type != TS_OPT_NONE)
			ts_model_registry_advance(core->models, m->name, 1);
		json_array_append_new(losses, json_real(r.loss));
		if (r.measured_temp_peak > measured_temp)
			measured_temp = r.measured_temp_peak;
		if (r.measured_host_temp_peak > measured_host)
			measured_host = r.measured_host_temp_peak;
		h2d += r.h2d_bytes;
		d2h += r.d2h_bytes;
		wall += r.wall_s;
		compute += r.compute_s;
		waits += r.copy_wait_s;
		ts_operation_progress_add(op, 1);
	}
	if (st == TS_OK && grads[0])
		st = ts_catalog_put_all(core->catalog, grads, ts_mlp_has_w2(&m->mlp) ? 2 : 1, true, err);
	if (st == TS_OK) {
		double per = s->steps ? 1.0 / (double)s->steps : 0;

		result = json_pack("{s:s, s:I, s:o, s:s, s:I, s:I, s:I, s:I, s:o,"
		                   " s:{s:f, s:f, s:f, s:f}, s:{s:I, s:I}, s:f}",
		                   "model", m->name, "steps", (json_int_t)s->steps, "losses", losses,
		                   "device", ts_device_props(dev)->id,
		                   "predicted_peak_device_bytes", (json_int_t)plan.peak_device_bytes,
		                   "measured_peak_device_bytes",
		                   (json_int_t)(plan.argument_size_in_bytes + plan.output_size_in_bytes +
		                                measured_temp),
		                   "predicted_temp_size_in_bytes", (json_int_t)plan.temp_size_in_bytes,
		                   "measured_temp_size_in_bytes", (json_int_t)measured_temp,
		                   "analysis", analysis_json(&plan, false),
		                   "time", "wall_s", wall, "compute_s", compute,
		                   "transfer_not_hidden_s", waits, "per_step_s", wall * per,
		                   "bytes_moved", "h2d", (json_int_t)h2d, "d2h", (json_int_t)d2h,
		                   "overlap_ratio", compute + waits > 0 ? compute / (compute + waits) : 1.0);
		losses = NULL;
		(void)dev_args;
		(void)measured_host;
		ts_operation_set_result(op, result);
	}
	json_decref(losses);
	if (env.compute)
		ts_queue_free(env.compute);
	if (env.h2d)
		ts_queue_free(env.h2d);
	if (env.d2h)
		ts_queue_free(env.d2h);
	ts_kernels_free(k);
	free(args);
	ts_plan_release(&plan);
	for (size_t i = 0; i < 8; i++)
		ts_array_unref(arrs[i]);
	ts_array_unref(grads[0]);
	ts_array_unref(grads[1]);
	ts_array_unref(in_dev);
	ts_array_unref(tgt_dev);
	return st;
}

void ts_h_models_step(const struct ts_call *call, struct ts_reply *reply)
{
	struct step *s = calloc(1, sizeof *s);
	struct ts_operation *op = NULL;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL, *inputs = NULL, *targets = NULL, *pl = NULL;
	json_int_t steps = 1;
	uint64_t wait_ns;

	ts_error_clear(&err);
	if (!s) {
		ts_reply_fail(reply, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", "no memory for a step");
		return;
	}
	if (!model_from_path(call, reply, &s->model)) {
		free(s);
		return;
	}
	s->core = call->core;
	body = json_loadb(call->body ? call->body : "", call->body_len, JSON_REJECT_DUPLICATES, &jerr);
	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:o, s?o, s?I, s?o}", "inputs", &inputs,
	                            "targets", &targets, "steps", &steps, "placement", &pl) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "step body: %s (expected {\"inputs\": ..., \"targets\": ..., \"steps\": N})",
		             jerr.text);
		goto out_fail;
	}
	if (steps < 1 || steps > 1000000) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_STEPS", "steps is in 1..1000000");
		goto out_fail;
	}
	if (step_policy(call->core, &s->model, pl, true, &s->policy, &err) != TS_OK)
		goto out_fail;
	s->steps = (uint64_t)steps;
	s->inputs = json_incref(inputs);
	s->targets = targets ? json_incref(targets) : NULL;
	if (ts_op_submit(call->core->operations, "step", s->model.name, s->steps, "steps", step_run, s,
	                 step_release, &op, &err) != TS_OK)
		goto out_fail;
	s = NULL;
	if (ts_h_wait_requested(call, &wait_ns))
		ts_h_reply_wait(reply, op, wait_ns, true);
	else
		ts_h_reply_operation(reply, op, false);
	ts_operation_unref(op);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	if (s)
		step_release(s);
	json_decref(body);
}
