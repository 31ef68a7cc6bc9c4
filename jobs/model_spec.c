/*
 * model_spec.c - strict parsing of model specs and step policies.
 */
#include "jobs/model_spec.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "device/device.h"
#include "formats/dtype.h"
#include "storage/array.h"

static ts_status bad_name(const char *field, size_t i, struct ts_error *err)
{
	char gpt[128] = "";
	size_t n = 0;

	for (int a = 0; a < TS_GPT_NACTS && n < sizeof gpt; a++)
		n += (size_t)snprintf(gpt + n, sizeof gpt - n, "%s%s", a ? ", " : "",
		                      ts_gpt_act_name((enum ts_gpt_act)a));
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
	                    "placement.activations.%s[%zu] is not an activation name: \"x\" or "
	                    "\"h\", or a GPT block's %s", field, i, gpt);
}

/* One list of placement.activations ("save" or "offload"): "x", "h" and,
 * for a GPT, its blocks' intermediates by name (gpt.h) into *names; the
 * model's kind is checked when a plan is built (ts_policy_check_names). */
static ts_status parse_names(json_t *list, const char *field, bool *x, bool *h,
                             unsigned *names, struct ts_error *err)
{
	size_t i;
	json_t *v;

	*x = *h = false;
	*names = 0;
	if (!list)
		return TS_OK;
	if (!json_is_array(list))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_POLICY",
		                    "placement.activations.%s is a list of activation names", field);
	json_array_foreach(list, i, v) {
		const char *s = json_string_value(v);
		enum ts_gpt_act a;

		if (s && strcmp(s, "x") == 0)
			*x = true;
		else if (s && strcmp(s, "h") == 0)
			*h = true;
		else if (ts_gpt_act_parse(s, &a))
			*names |= 1u << a;
		else
			return bad_name(field, i, err);
	}
	return TS_OK;
}

/* A field's expected JSON type, for errors that name the field. */
struct field {
	const char *key;
	json_type type;        /* JSON_TRUE stands for any boolean, JSON_REAL for any number,
	                          JSON_FALSE for a boolean or a string (its parser checks
	                          which strings) */
};

/* Checks obj's keys against fields: unknown keys and wrong types are
 * INVALID_ARGUMENT naming "<where>.<key>". */
static ts_status check_fields(json_t *obj, const char *where, const char *reason,
                              const struct field *fields, size_t n, struct ts_error *err)
{
	static const char *const names[] = {"an object", "a list", "a string", "an integer",
	                                    "a number", "a boolean", "a boolean or a string",
	                                    "null"};
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
		    : fields[i].type == JSON_FALSE ? !json_is_boolean(v) && !json_is_string(v)
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
	{"steps", JSON_INTEGER}, {"persist", JSON_TRUE},
};
static const struct field mlp_fields[] = {
	{"layers", JSON_INTEGER}, {"d_model", JSON_INTEGER}, {"d_hidden", JSON_INTEGER},
	{"activation", JSON_STRING}, {"residual", JSON_TRUE}, {"vocab", JSON_INTEGER},
	{"projection", JSON_TRUE},
};
static const struct field placement_fields[] = {
	{"device", JSON_STRING}, {"devices", JSON_ARRAY}, {"shard_optimizer", JSON_FALSE},
	{"params", JSON_STRING},
	{"opt_state", JSON_STRING}, {"activations", JSON_OBJECT}, {"prefetch_depth", JSON_INTEGER},
};
static const struct field activation_fields[] = {{"save", JSON_ARRAY}, {"offload", JSON_ARRAY}};
static const struct field init_fields[] = {
	{"seed", JSON_INTEGER}, {"scale", JSON_REAL}, {"constant", JSON_REAL},
};
static const struct field optimizer_fields[] = {
	{"type", JSON_STRING}, {"learning_rate", JSON_REAL}, {"b1", JSON_REAL}, {"b2", JSON_REAL},
	{"eps", JSON_REAL}, {"clip_global_norm", JSON_REAL}, {"weight_decay", JSON_REAL},
	{"decay", JSON_STRING},
	{"schedule", JSON_OBJECT},
};
static const struct field schedule_fields[] = {
	{"type", JSON_STRING}, {"value", JSON_REAL}, {"init_value", JSON_REAL},
	{"peak_value", JSON_REAL}, {"end_value", JSON_REAL}, {"warmup_steps", JSON_INTEGER},
	{"decay_steps", JSON_INTEGER},
};

#define SCHEDULE_STEPS_MAX 1000000000
#define MODEL_STEPS_MAX 1000000000

/* A float32 from a JSON number that must be finite and >= lo (> lo when
 * strict), for errors naming "<where>". */
static ts_status finite_at_least(json_t *v, const char *where, double lo, bool strict,
                                 float *out, struct ts_error *err)
{
	float f = (float)json_number_value(v);

	if (!isfinite(f) || !(strict ? f > lo : f >= lo))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
		                    "%s must be a finite float32 %s %g", where, strict ? ">" : ">=", lo);
	*out = f;
	return TS_OK;
}

/* optimizer.schedule into o->schedule (and learning_rate its constant
 * value or peak). */
static ts_status parse_schedule(json_t *sc, struct ts_optimizer *o, struct ts_error *err)
{
	const char *type = json_string_value(json_object_get(sc, "type"));
	struct ts_schedule *s = &o->schedule;
	json_t *v;
	const char *key;

	if (check_fields(sc, "optimizer.schedule", "BAD_OPTIMIZER", schedule_fields,
	                 NFIELDS(schedule_fields), err) != TS_OK)
		return err->status;
	if (!type)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
		                    "optimizer.schedule.type is required: constant or "
		                    "warmup_cosine_decay");
	if (strcmp(type, "constant") == 0) {
		json_object_foreach(sc, key, v) {
			if (strcmp(key, "type") != 0 && strcmp(key, "value") != 0)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
				                    "optimizer.schedule.%s is not a field of a constant "
				                    "schedule (type, value)", key);
		}
		if (!(v = json_object_get(sc, "value")))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.schedule.value is required for a constant schedule");
		s->type = TS_SCHED_CONSTANT;
		return finite_at_least(v, "optimizer.schedule.value", 0, true, &o->learning_rate, err);
	}
	if (strcmp(type, "warmup_cosine_decay") != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
		                    "optimizer.schedule.type '%s' is not constant or warmup_cosine_decay",
		                    type);
	if (json_object_get(sc, "value"))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
		                    "optimizer.schedule.value is a constant schedule's; a "
		                    "warmup_cosine_decay schedule has init_value, peak_value, "
		                    "warmup_steps, decay_steps and end_value");
	{
		static const char *const need[] = {"init_value", "peak_value", "warmup_steps",
		                                   "decay_steps"};
		json_int_t warm, decay;

		for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
			if (!json_object_get(sc, need[i]))
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
				                    "optimizer.schedule.%s is required for a warmup_cosine_decay "
				                    "schedule", need[i]);
		s->type = TS_SCHED_WARMUP_COSINE;
		if (finite_at_least(json_object_get(sc, "init_value"), "optimizer.schedule.init_value",
		                    0, false, &s->init_value, err) != TS_OK ||
		    finite_at_least(json_object_get(sc, "peak_value"), "optimizer.schedule.peak_value",
		                    0, true, &s->peak_value, err) != TS_OK)
			return err->status;
		s->end_value = 0.0f;
		if (json_object_get(sc, "end_value") &&
		    finite_at_least(json_object_get(sc, "end_value"), "optimizer.schedule.end_value", 0,
		                    false, &s->end_value, err) != TS_OK)
			return err->status;
		warm = json_integer_value(json_object_get(sc, "warmup_steps"));
		decay = json_integer_value(json_object_get(sc, "decay_steps"));
		if (warm < 0 || warm > SCHEDULE_STEPS_MAX)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.schedule.warmup_steps must be in 0..%d",
			                    SCHEDULE_STEPS_MAX);
		if (decay <= warm || decay > SCHEDULE_STEPS_MAX)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.schedule.decay_steps must be greater than warmup_steps "
			                    "(it includes the warmup) and at most %d", SCHEDULE_STEPS_MAX);
		s->warmup_steps = (int)warm;
		s->decay_steps = (int)decay;
		o->learning_rate = s->peak_value;
	}
	return TS_OK;
}

/* Activations and prefetch from a "placement" object (absent fields keep *p). */
ts_status ts_job_policy_parse(json_t *pl, struct ts_policy *p, struct ts_error *err)
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
		    parse_names(json_object_get(acts, "save"), "save", &p->save_x, &p->save_h,
		                &p->save_acts, err) != TS_OK ||
		    parse_names(json_object_get(acts, "offload"), "offload", &p->offload_x, &p->offload_h,
		                &p->offload_acts, err) != TS_OK)
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

/* The optimizer's and init's fields, which every kind of spec shares. */
static ts_status check_common_fields(json_t *body, struct ts_error *err)
{
	if (json_object_get(body, "optimizer") &&
	    check_fields(json_object_get(body, "optimizer"), "optimizer", "BAD_OPTIMIZER",
	                 optimizer_fields, NFIELDS(optimizer_fields), err) != TS_OK)
		return err->status;
	if (json_object_get(body, "init") &&
	    check_fields(json_object_get(body, "init"), "init", "BAD_INIT", init_fields,
	                 NFIELDS(init_fields), err) != TS_OK)
		return err->status;
	return TS_OK;
}

/* The optimizer of a model spec (opt may be NULL: none) into m->opt. */
static ts_status parse_optimizer(json_t *opt, struct ts_model *m, struct ts_error *err)
{
	json_error_t jerr;

	m->opt = (struct ts_optimizer){.type = TS_OPT_NONE, .learning_rate = 1e-3f, .b1 = 0.9f,
	                               .b2 = 0.999f, .eps = 1e-8f};
	if (opt) {
		const char *type = "none";
		double lr = m->opt.learning_rate, b1 = m->opt.b1, b2 = m->opt.b2, eps = m->opt.eps, clip = 0;
		double wd = 1e-4;        /* optax.adamw's default */
		const char *decay = "all";
		json_t *sched = NULL;

		if (json_unpack_ex(opt, &jerr, JSON_STRICT,
		                   "{s?s, s?F, s?F, s?F, s?F, s?F, s?F, s?o, s?s}",
		                   "type", &type, "learning_rate", &lr, "b1", &b1, "b2", &b2, "eps", &eps,
		                   "clip_global_norm", &clip, "weight_decay", &wd, "schedule",
		                   &sched, "decay", &decay) != 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER", "optimizer: %s", jerr.text);
		if (strcmp(type, "adamw") == 0) {
			m->opt.type = TS_OPT_ADAM;
			m->opt.adamw = true;
		} else if (!ts_opt_parse(type, &m->opt.type)) {
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.type '%s' is not none, sgd, adam or adamw", type);
		}
		if (json_object_get(opt, "weight_decay") && !m->opt.adamw)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.weight_decay is adamw's; optimizer '%s' has none", type);
		if (json_object_get(opt, "decay") && !m->opt.adamw)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.decay is adamw's; optimizer '%s' has none", type);
		if (strcmp(decay, "all") != 0 && strcmp(decay, "matrices") != 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.decay '%.32s' is not all or matrices", decay);
		m->opt.decay_matrices = strcmp(decay, "matrices") == 0;
		if (sched && json_object_get(opt, "learning_rate"))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer.learning_rate and optimizer.schedule are exclusive: "
			                    "give one");
		/* the ranges hold for the float32 values the optimizer uses: a
		 * learning rate that underflows to 0 or a b1 that rounds up to 1
		 * is refused, not trained with */
		m->opt.learning_rate = (float)lr;
		m->opt.b1 = (float)b1;
		m->opt.b2 = (float)b2;
		m->opt.eps = (float)eps;
		m->opt.clip_global_norm = (float)clip;
		if (!(m->opt.learning_rate > 0) || !isfinite(m->opt.learning_rate) ||
		    !(m->opt.b1 >= 0 && m->opt.b1 < 1) || !(m->opt.b2 >= 0 && m->opt.b2 < 1) ||
		    !(m->opt.eps >= 0) || !isfinite(m->opt.eps) || !(m->opt.clip_global_norm >= 0) ||
		    !isfinite(m->opt.clip_global_norm))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
			                    "optimizer: learning_rate > 0, b1 and b2 in [0, 1), eps and "
			                    "clip_global_norm >= 0, each a finite float32");
		if (m->opt.adamw) {
			m->opt.weight_decay = (float)wd;
			if (!(m->opt.weight_decay >= 0) || !isfinite(m->opt.weight_decay))
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_OPTIMIZER",
				                    "optimizer.weight_decay must be a finite float32 >= 0");
		}
		if (sched && parse_schedule(sched, &m->opt, err) != TS_OK)
			return err->status;
	}
	return TS_OK;
}

/* How the weights start (in may be NULL: normal(0, 0.02) from seed 0). */
static ts_status parse_init(json_t *in, struct ts_model_init *init, struct ts_error *err)
{
	json_error_t jerr;

	*init = (struct ts_model_init){.scale = 0.02};
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
	return TS_OK;
}

/* placement.devices: data parallel over 2.. devices of one backend, each
 * named once; the first is the model's device. */
static ts_status parse_devices(const struct ts_jobs_env *env, json_t *list, struct ts_model *m,
                               struct ts_error *err)
{
	size_t n = json_array_size(list);

	if (!json_is_array(list))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DEVICES",
		                    "placement.devices is a list of device ids");
	if (n < 2 || n > TS_PLAN_REPLICAS_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DEVICES",
		                    "placement.devices lists 2..%d devices a step runs on together, "
		                    "not %zu (one device: placement.device)", TS_PLAN_REPLICAS_MAX, n);
	for (size_t i = 0; i < n; i++) {
		const char *id = json_string_value(json_array_get(list, i));
		struct ts_device *d = id ? ts_device_set_find(env->devices, id) : NULL;

		if (!id)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DEVICES",
			                    "placement.devices[%zu] is not a device id", i);
		if (!d)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
			                    "placement.devices[%zu] '%.64s' is not a device of this node",
			                    i, id);
		if (ts_device_props(d)->backend == TS_BACKEND_CPU ||
		    ts_device_props(d)->backend != ts_device_props(m->replica_devs[0] ? m->replica_devs[0]
		                                                                      : d)->backend)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DEVICES",
			                    "placement.devices[%zu] '%s': data parallel runs on accelerators "
			                    "of one backend (cuda or sim)", i, id);
		for (size_t j = 0; j < i; j++)
			if (m->replica_devs[j] == d)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DEVICES",
				                    "placement.devices names '%s' twice", id);
		m->replica_devs[i] = d;
	}
	m->replicas = (int)n;
	m->device = m->replica_devs[0];
	return TS_OK;
}

/* Where the model lives and its default policy (pl may be NULL). */
static ts_status parse_placement(const struct ts_jobs_env *env, struct ts_device *default_device,
                                 json_t *pl, struct ts_model *m, struct ts_error *err)
{
	const char *dev;
	json_t *so;

	m->policy = (struct ts_policy){.params = TS_MEM_DEVICE, .opt_state = TS_MEM_DEVICE,
	                               .save_x = true, .save_h = true};
	m->device = default_device;
	if (pl) {
		dev = json_string_value(json_object_get(pl, "device"));
		if (dev && !(m->device = ts_device_set_find(env->devices, dev)))
			return ts_error_set(err, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
			                    "placement.device '%s' is not a device of this node", dev);
		if (json_object_get(pl, "devices")) {
			struct ts_device *one = m->device;

			if (parse_devices(env, json_object_get(pl, "devices"), m, err) != TS_OK)
				return err->status;
			/* as a model renders it: device, the first of its devices */
			if (dev && one != m->device)
				return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DEVICES",
				                    "placement takes device (one) or devices (data "
				                    "parallel); given both, device '%s' must be the first of "
				                    "devices", dev);
		}
		if (json_object_get(pl, "activations")) {
			m->policy.save_x = m->policy.save_h = false;
			m->policy.save_acts = 0;
		}
		if (ts_job_policy_parse(pl, &m->policy, err) != TS_OK)
			return err->status;
	}
	so = pl ? json_object_get(pl, "shard_optimizer") : NULL;
	if (json_is_string(so) && strcmp(json_string_value(so), "state") != 0 &&
	    strcmp(json_string_value(so), "gradients") != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING",
		                    "placement.shard_optimizer is true or \"state\" (ZeRO-1: Adam's "
		                    "state) or \"gradients\" (ZeRO-2: and the gradients), not '%s'",
		                    json_string_value(so));
	m->shard_optimizer = json_is_true(so) || json_is_string(so);
	m->shard_gradients = json_is_string(so) && strcmp(json_string_value(so), "gradients") == 0;
	if (m->shard_optimizer && (m->replicas < 2 || m->opt.type != TS_OPT_ADAM ||
	                           m->policy.params != TS_MEM_DEVICE ||
	                           m->policy.opt_state != TS_MEM_DEVICE))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING",
		                    "placement.shard_optimizer slices Adam's state over the "
		                    "placement.devices (2 or more), with params and opt_state on "
		                    "the devices");
	if (m->persist && m->replicas > 1)
		return ts_error_set(err, TS_UNIMPLEMENTED, "PERSIST_REPLICAS",
		                    "persist keeps models on one device across restarts; a model on "
		                    "placement.devices is not kept (export a checkpoint instead)");
	return TS_OK;
}

/* The name and step count every spec has. */
static ts_status parse_name_steps(const char *name, json_int_t steps, struct ts_model *m,
                                  struct ts_error *err)
{
	if (steps < 0 || steps > MODEL_STEPS_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "model.steps (the optimizer's step count, Adam's t) must be in 0..%d",
		                    MODEL_STEPS_MAX);
	if (!ts_array_name_valid(name) || strlen(name) > TS_MODEL_NAME_MAX)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL_NAME",
		                    "model name '%s' is invalid (array-name rules, at most %d characters)",
		                    name, TS_MODEL_NAME_MAX);
	snprintf(m->name, sizeof m->name, "%s", name);
	m->steps = (uint64_t)steps;
	return TS_OK;
}

static const struct field gpt_model_fields[] = {
	{"name", JSON_STRING}, {"gpt", JSON_OBJECT}, {"dtype", JSON_STRING}, {"init", JSON_OBJECT},
	{"optimizer", JSON_OBJECT}, {"placement", JSON_OBJECT}, {"steps", JSON_INTEGER},
	{"persist", JSON_TRUE},
};
static const struct field gpt_fields[] = {
	{"vocab", JSON_INTEGER}, {"context", JSON_INTEGER}, {"layers", JSON_INTEGER},
	{"d_model", JSON_INTEGER}, {"heads", JSON_INTEGER}, {"d_ff", JSON_INTEGER},
};

/*
 * A GPT spec: {"name", "gpt": {"vocab", "context", "layers", "d_model",
 * "heads", "d_ff" (default 4 d_model)}, "dtype" (float32), "optimizer",
 * "init", "placement", "steps", "persist"}.
 */
static ts_status parse_gpt(const struct ts_jobs_env *env, struct ts_device *default_device,
                           json_t *body, struct ts_model *m, struct ts_model_init *init,
                           struct ts_error *err)
{
	json_t *opt = NULL, *pl = NULL, *in = NULL;
	const char *name = NULL, *dtype = "float32";
	json_int_t vocab = 0, context = 0, layers = 0, d = 0, heads = 0, dff = 0, steps = 0;
	enum ts_compute compute = TS_COMPUTE_F32;
	int persist = 0;
	json_error_t jerr;

	if (check_fields(body, "model", "BAD_MODEL", gpt_model_fields, NFIELDS(gpt_model_fields),
	                 err) != TS_OK ||
	    check_fields(json_object_get(body, "gpt"), "gpt", "BAD_MODEL", gpt_fields,
	                 NFIELDS(gpt_fields), err) != TS_OK ||
	    check_common_fields(body, err) != TS_OK)
		return err->status;
	if (json_unpack_ex(body, &jerr, JSON_STRICT,
	                   "{s:s, s:{s:I, s:I, s:I, s:I, s:I, s?I}, s?s, s?o, s?o, s?o, s?I, s?b}",
	                   "name", &name, "gpt", "vocab", &vocab, "context", &context, "layers",
	                   &layers, "d_model", &d, "heads", &heads, "d_ff", &dff, "dtype", &dtype,
	                   "init", &in, "optimizer", &opt, "placement", &pl, "steps", &steps,
	                   "persist", &persist) != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL", "model: %s", jerr.text);
	if (parse_name_steps(name, steps, m, err) != TS_OK)
		return err->status;
	m->persist = persist;
	if (!json_object_get(json_object_get(body, "gpt"), "d_ff"))
		dff = 4 * d;
	if (layers < 1 || layers > 4096 || d < 1 || d > 65536 || dff < 1 || dff > 262144 ||
	    heads < 1 || heads > d || vocab < 1 || vocab > TS_MODEL_VOCAB_MAX || context < 1 ||
	    context > 65536)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "gpt: layers in 1..4096, d_model in 1..65536, heads in 1..d_model, "
		                    "d_ff in 1..262144, vocab in 1..%d and context in 1..65536",
		                    TS_MODEL_VOCAB_MAX);
	if (!ts_compute_parse(dtype, &compute))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE",
		                    "dtype '%.32s' is not a model's compute dtype", dtype);
	/* field by field into the zeroed record (records are compared bytewise) */
	m->mlp.gpt = true;
	m->mlp.layers = (int)layers;
	m->mlp.d_model = (int)d;
	m->mlp.d_hidden = (int)dff;
	m->mlp.act = TS_ACT_GELU;
	m->mlp.loss = TS_LOSS_XENT;
	m->mlp.vocab = (int)vocab;
	m->mlp.heads = (int)heads;
	m->mlp.context = (int)context;
	m->mlp.compute = compute;
	if (ts_gpt_check(&m->mlp, err) != TS_OK)
		return err->status;
	if (parse_optimizer(opt, m, err) != TS_OK || parse_init(in, init, err) != TS_OK ||
	    parse_placement(env, default_device, pl, m, err) != TS_OK)
		return err->status;
	return TS_OK;
}

ts_status ts_job_model_parse(const struct ts_jobs_env *env, struct ts_device *default_device,
                             json_t *body, struct ts_model *m, struct ts_model_init *init,
                             struct ts_error *err)
{
	json_t *mlp = NULL, *opt = NULL, *pl = NULL, *in = NULL;
	const char *name = NULL, *act = "relu", *loss = "sum", *dtype = "float32";
	enum ts_dtype dt;
	enum ts_compute compute = TS_COMPUTE_F32;
	json_int_t layers = 0, d = 0, h = 0, steps = 0, vocab = 0;
	int residual = 0, proj = 0, persist = 0;
	json_error_t jerr;

	memset(m, 0, sizeof *m);
	if (json_is_object(body) && json_object_get(body, "gpt"))
		return parse_gpt(env, default_device, body, m, init, err);
	if (check_fields(body, "model", "BAD_MODEL", model_fields, NFIELDS(model_fields), err) != TS_OK ||
	    (json_object_get(body, "mlp") &&
	     check_fields(json_object_get(body, "mlp"), "mlp", "BAD_MODEL", mlp_fields,
	                  NFIELDS(mlp_fields), err) != TS_OK) ||
	    check_common_fields(body, err) != TS_OK)
		return err->status;
	if (json_unpack_ex(body, &jerr, JSON_STRICT,
	                   "{s:s, s:{s:I, s:I, s?I, s?s, s?b, s?I, s?b}, s?s, s?o, s?s, s?o, s?o, s?I,"
	                   " s?b}",
	                   "name", &name, "mlp", "layers", &layers, "d_model", &d, "d_hidden", &h,
	                   "activation", &act, "residual", &residual, "vocab", &vocab,
	                   "projection", &proj, "dtype", &dtype, "init", &in,
	                   "loss", &loss, "optimizer", &opt, "placement", &pl, "steps", &steps,
	                   "persist", &persist) != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL", "model: %s", jerr.text);
	(void)mlp;
	if (parse_name_steps(name, steps, m, err) != TS_OK)
		return err->status;
	if (layers < 1 || d < 1 || h < 0 || layers > 4096 || d > 65536 || h > 65536)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "mlp.layers, mlp.d_model (and mlp.d_hidden) must be positive");
	if (!ts_dtype_parse(dtype, &dt))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE",
		                    "dtype '%.32s' is not a dtype (a model's is float32, bfloat16 or "
		                    "float16)", dtype);
	if (!ts_compute_parse(dtype, &compute))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DTYPE",
		                    "dtype '%s' is not a model's compute dtype: float32, bfloat16 or "
		                    "float16 (float32 master weights either way)", dtype);
	if (vocab < 0 || vocab > TS_MODEL_VOCAB_MAX || (proj && !vocab) ||
	    (json_object_get(json_object_get(body, "mlp"), "vocab") && vocab < 1))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "mlp.vocab must be in 1..%d (and mlp.projection needs it)",
		                    TS_MODEL_VOCAB_MAX);
	if (vocab && !proj && vocab != d)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "mlp.vocab %lld without mlp.projection must equal mlp.d_model %lld "
		                    "(the last layer's outputs are the logits)", (long long)vocab,
		                    (long long)d);
	/* field by field into the zeroed record: a compound literal may leave
	 * its padding undefined, and records are compared bytewise */
	m->mlp.layers = (int)layers;
	m->mlp.d_model = (int)d;
	m->mlp.d_hidden = (int)h;
	m->mlp.residual = residual;
	m->mlp.vocab = (int)vocab;
	m->mlp.proj = proj;
	m->mlp.compute = compute;
	if (!ts_act_parse(act, &m->mlp.act))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "mlp.activation '%s' is not none, relu, gelu or tanh", act);
	if (!ts_loss_parse(loss, &m->mlp.loss))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    "loss '%s' is not sum, mse or softmax_cross_entropy", loss);
	if (!json_object_get(body, "loss") && vocab)
		m->mlp.loss = TS_LOSS_XENT;
	if ((m->mlp.loss == TS_LOSS_XENT) != (vocab > 0))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_MODEL",
		                    vocab ? "a token model (mlp.vocab) takes loss softmax_cross_entropy, "
		                            "not '%s'"
		                          : "loss '%s' needs token ids: give mlp.vocab", loss);
	m->persist = persist;
	if (parse_optimizer(opt, m, err) != TS_OK || parse_init(in, init, err) != TS_OK ||
	    parse_placement(env, default_device, pl, m, err) != TS_OK)
		return err->status;
	return ts_policy_check_names(&m->policy, &m->mlp, err);
}



