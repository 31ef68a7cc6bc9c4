/*
 * model.c - model records, their array names, and the registry (a
 * common/registry.h map of heap records under a mutex, which stays here).
 */
#include "train/model.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/lock.h"
#include "common/registry.h"
#include "common/units.h"
#include "memory/space.h"

#define MODELS_MAX 1024

struct ts_model_registry {
	struct ts_mutex mu;
	struct ts_registry names;          /* of struct ts_model (own); guarded by: mu */
	uint64_t next_uid;                 /* guarded by: mu */
	struct ts_histogram step_times;       /* atomics: every step run */
};

void ts_model_array_name(const struct ts_model *m, enum ts_pbuf_role role, char *buf, size_t cap)
{
	static const char *const suffix[] = {
		[TS_ROLE_W1] = "w1", [TS_ROLE_W2] = "w2",
		[TS_ROLE_MU_W1] = "adam.mu.w1", [TS_ROLE_MU_W2] = "adam.mu.w2",
		[TS_ROLE_NU_W1] = "adam.nu.w1", [TS_ROLE_NU_W2] = "adam.nu.w2",
		[TS_ROLE_EMBED] = "embed", [TS_ROLE_PROJ] = "proj",
		[TS_ROLE_MU_EMBED] = "adam.mu.embed", [TS_ROLE_MU_PROJ] = "adam.mu.proj",
		[TS_ROLE_NU_EMBED] = "adam.nu.embed", [TS_ROLE_NU_PROJ] = "adam.nu.proj",
	};

	static const char *const gpt_prefix[3] = {"", "adam.mu.", "adam.nu."};
	int kind, t;

	if (ts_gpt_role_of(role, &kind, &t) && kind < 3) {
		snprintf(buf, cap, "%s.%s%s", m->name, gpt_prefix[kind],
		         ts_gpt_param_name((enum ts_gpt_param)t));
		return;
	}
	snprintf(buf, cap, "%s.%s", m->name,
	         ts_role_state(role) && role < (int)(sizeof suffix / sizeof suffix[0]) && suffix[role]
	         ? suffix[role] : "?");
}

const enum ts_pbuf_role ts_model_roles[TS_MODEL_NROLES] = {
	TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_MU_W1, TS_ROLE_MU_W2, TS_ROLE_NU_W1, TS_ROLE_NU_W2,
	TS_ROLE_EMBED, TS_ROLE_PROJ, TS_ROLE_MU_EMBED, TS_ROLE_MU_PROJ, TS_ROLE_NU_EMBED,
	TS_ROLE_NU_PROJ,
#define TS_GPT_MODEL_ROLE_(id, name) TS_ROLE_GPT_##id,
#define TS_GPT_MODEL_MU_(id, name) TS_ROLE_MU_GPT_##id,
#define TS_GPT_MODEL_NU_(id, name) TS_ROLE_NU_GPT_##id,
	TS_GPT_PARAMS(TS_GPT_MODEL_ROLE_)
	TS_GPT_PARAMS(TS_GPT_MODEL_MU_)
	TS_GPT_PARAMS(TS_GPT_MODEL_NU_)
#undef TS_GPT_MODEL_ROLE_
#undef TS_GPT_MODEL_MU_
#undef TS_GPT_MODEL_NU_
};

bool ts_model_has_role(const struct ts_model *m, enum ts_pbuf_role r)
{
	bool second = r == TS_ROLE_W2 || r == TS_ROLE_MU_W2 || r == TS_ROLE_NU_W2;
	bool tok = r >= TS_ROLE_EMBED && r <= TS_ROLE_NU_PROJ;
	bool prj = r == TS_ROLE_PROJ || r == TS_ROLE_MU_PROJ || r == TS_ROLE_NU_PROJ;

	int kind, t;

	if (!ts_role_state(r))
		return false;
	if (ts_gpt_role_of(r, &kind, &t))
		return m->mlp.gpt && (kind == 0 || m->opt.type == TS_OPT_ADAM);
	if (m->mlp.gpt)
		return false;
	return (!second || ts_mlp_has_w2(&m->mlp)) &&
	       (!ts_role_opt_state(r) || m->opt.type == TS_OPT_ADAM) &&
	       (!tok || ts_mlp_tokens(&m->mlp)) && (!prj || m->mlp.proj);
}

/* Bytes of the model's arrays in kind: its params and its optimizer state. */
static void model_need(const struct ts_model *m, enum ts_memory_kind kind, uint64_t *params,
                       uint64_t *state)
{
	*params = *state = 0;
	for (size_t i = 0; i < TS_MODEL_NROLES; i++) {
		enum ts_pbuf_role r = ts_model_roles[i];
		bool param = ts_role_param(r);
		uint64_t shape[3], n = sizeof(float);
		int rank;

		if (!ts_model_has_role(m, r) || (param ? m->policy.params : m->policy.opt_state) != kind)
			continue;
		rank = ts_model_param_shape(m, r, shape);
		for (int k = 0; k < rank; k++)
			n *= shape[k];
		*(param ? params : state) += n;
	}
}

/* The refusal of a model whose params and state (bytes) do not fit sp. */
static ts_status model_refuse(const struct ts_model *m, struct ts_device *dev,
                              const struct ts_space *sp, uint64_t params, uint64_t state,
                              struct ts_error *err)
{
	struct ts_space_stats s;
	char need_h[32], par_h[32], st_h[32], lim_h[32], free_h[32], parts[96];
	uint64_t need = params + state;

	ts_space_stats(sp, &s);
	/* counts the refusal in the space's stats; the answer is this one */
	(void)ts_space_check_fit(sp, need, NULL);
	ts_format_bytes(par_h, sizeof par_h, params);
	ts_format_bytes(st_h, sizeof st_h, state);
	if (params && state)
		snprintf(parts, sizeof parts, "params %s, optimizer state %s", par_h, st_h);
	else
		snprintf(parts, sizeof parts, "%s %s", params ? "params" : "optimizer state",
		         params ? par_h : st_h);
	ts_error_oom(err, "model '%s' needs %s of %s on %s (%s); the budget is %s, %s free",
	             m->name, ts_format_bytes(need_h, sizeof need_h, need),
	             ts_memory_kind_name(ts_space_kind(sp)), ts_device_props(dev)->id, parts,
	             ts_format_bytes(lim_h, sizeof lim_h, s.bytes_limit),
	             ts_format_bytes(free_h, sizeof free_h, s.bytes_free));
	ts_error_meta(err, "space", "%s", ts_space_name(sp));
	ts_error_meta_u64(err, "requested_bytes", need);
	ts_error_meta_u64(err, "free_bytes", s.bytes_free);
	ts_error_meta_u64(err, "largest_free_block_bytes", s.largest_free_block_bytes);
	ts_error_meta_u64(err, "limit_bytes", s.bytes_limit);
	ts_error_meta(err, "model", "%s", m->name);
	ts_error_meta_u64(err, "params_bytes", params);
	ts_error_meta_u64(err, "opt_state_bytes", state);
	return TS_RESOURCE_EXHAUSTED;
}

ts_status ts_model_check_fit(const struct ts_model *m, const struct ts_memory *mem,
                             struct ts_error *err)
{
	enum ts_memory_kind kinds[2] = {m->policy.params, m->policy.opt_state};
	int R = m->replicas > 1 ? m->replicas : 1;

	for (int k = 0; k < R; k++) {
		struct ts_device *dev = R > 1 ? m->replica_devs[k] : m->device;

		for (int i = 0; i < 2; i++) {
			const struct ts_space *sp;
			struct ts_space_stats s;
			uint64_t params, state;

			if (i == 1 && kinds[1] == kinds[0])
				break;
			sp = ts_memory_find(mem, ts_device_props(dev)->id, kinds[i]);
			model_need(m, kinds[i], &params, &state);
			if (m->shard_optimizer)
				state /= (uint64_t)R;       /* each device its slice */
			/* host memory: the replicas may draw on one pool, each a copy */
			if (kinds[i] != TS_MEM_DEVICE) {
				params *= (uint64_t)R;
				state *= (uint64_t)R;
			}
			if (!sp || params + state == 0)
				continue;
			ts_space_stats(sp, &s);
			if (params + state > s.bytes_free)
				return model_refuse(m, dev, sp, params, state, err);
		}
	}
	return TS_OK;
}

void ts_model_owner(const struct ts_model *m, char *buf, size_t cap)
{
	snprintf(buf, cap, "model '%s'", m->name);
}

int ts_model_param_shape(const struct ts_model *m, enum ts_pbuf_role role, uint64_t shape[3])
{
	bool second = role == TS_ROLE_W2 || role == TS_ROLE_MU_W2 || role == TS_ROLE_NU_W2;
	bool prj = role == TS_ROLE_PROJ || role == TS_ROLE_MU_PROJ || role == TS_ROLE_NU_PROJ;
	uint64_t d = (uint64_t)m->mlp.d_model, h = (uint64_t)ts_mlp_hidden(&m->mlp);
	int kind, t;

	if (ts_gpt_role_of(role, &kind, &t))
		return ts_gpt_param_shape(&m->mlp, (enum ts_gpt_param)t, shape);
	if (role >= TS_ROLE_EMBED && role <= TS_ROLE_NU_PROJ) {
		shape[0] = prj ? d : (uint64_t)m->mlp.vocab;
		shape[1] = prj ? (uint64_t)m->mlp.vocab : d;
		shape[2] = 0;
		return 2;
	}
	shape[0] = (uint64_t)m->mlp.layers;
	shape[1] = second ? h : d;
	shape[2] = second ? d : h;
	return 3;
}

struct ts_model_registry *ts_model_registry_new(void)
{
	struct ts_model_registry *r = calloc(1, sizeof *r);

	if (!r)
		return NULL;
	ts_registry_init(&r->names);
	ts_mutex_init(&r->mu);
	ts_histogram_init(&r->step_times, ts_histogram_long_bounds, ts_histogram_long_nbounds);
	return r;
}

void ts_model_registry_record_step(struct ts_model_registry *r, uint64_t ns)
{
	ts_histogram_observe(&r->step_times, ns);
}

const struct ts_histogram *ts_model_registry_step_times(const struct ts_model_registry *r)
{
	return &r->step_times;
}

void ts_model_registry_free(struct ts_model_registry *r)
{
	if (!r)
		return;
	ts_mutex_destroy(&r->mu);
	for (size_t i = 0; i < ts_registry_count(&r->names); i++)
		free(ts_registry_at(&r->names, i));
	ts_registry_release(&r->names);
	free(r);
}

ts_status ts_model_registry_put(struct ts_model_registry *r, const struct ts_model *m,
                                uint64_t *uid, struct ts_error *err)
{
	ts_status st = TS_OK;
	struct ts_model *copy = NULL;

	ts_mutex_lock(&r->mu);
	if (ts_registry_get(&r->names, m->name))
		st = ts_error_set(err, TS_ALREADY_EXISTS, "MODEL_EXISTS", "model '%s' already exists",
		                  m->name);
	else if (ts_registry_count(&r->names) == MODELS_MAX)
		st = ts_error_set(err, TS_RESOURCE_EXHAUSTED, "TOO_MANY_MODELS",
		                  "at most %d models", MODELS_MAX);
	else if (!(copy = malloc(sizeof *copy)))
		st = ts_error_oom(err, "no memory for model '%s'", m->name);
	if (st == TS_OK) {
		*copy = *m;
		st = ts_registry_put(&r->names, copy->name, copy, NULL, err);
	}
	if (st == TS_OK) {
		copy->uid = ++r->next_uid;
		if (uid)
			*uid = copy->uid;
		copy = NULL;
	}
	ts_mutex_unlock(&r->mu);
	free(copy);
	return st;
}

bool ts_model_registry_get(struct ts_model_registry *r, const char *name, struct ts_model *out)
{
	const struct ts_model *m;

	ts_mutex_lock(&r->mu);
	m = ts_registry_get(&r->names, name);
	if (m)
		*out = *m;
	ts_mutex_unlock(&r->mu);
	return m != NULL;
}

/* The model with this uid, or NULL. */
static struct ts_model *find_uid_locked(struct ts_model_registry *r, uint64_t uid)
{
	assert(ts_mutex_held(&r->mu));
	for (size_t i = 0; i < ts_registry_count(&r->names); i++) {
		struct ts_model *m = ts_registry_at(&r->names, i);

		if (m->uid == uid)
			return m;
	}
	return NULL;
}

bool ts_model_registry_remove(struct ts_model_registry *r, uint64_t uid)
{
	struct ts_model *m;

	ts_mutex_lock(&r->mu);
	m = find_uid_locked(r, uid);
	if (m)
		ts_registry_remove(&r->names, m->name);
	ts_mutex_unlock(&r->mu);
	free(m);
	return m != NULL;
}

bool ts_model_registry_set_ready(struct ts_model_registry *r, uint64_t uid, bool ready,
                                 const char *creating)
{
	struct ts_model *m;

	ts_mutex_lock(&r->mu);
	m = find_uid_locked(r, uid);
	if (m) {
		m->ready = ready;
		snprintf(m->creating, sizeof m->creating, "%s", !ready && creating ? creating : "");
	}
	ts_mutex_unlock(&r->mu);
	return m != NULL;
}

bool ts_model_registry_set_persist(struct ts_model_registry *r, uint64_t uid, bool on)
{
	struct ts_model *m;

	ts_mutex_lock(&r->mu);
	m = find_uid_locked(r, uid);
	if (m)
		m->persist = on;
	ts_mutex_unlock(&r->mu);
	return m != NULL;
}

bool ts_model_registry_add_steps(struct ts_model_registry *r, uint64_t uid, uint64_t n,
                                 uint64_t *before)
{
	struct ts_model *m;

	ts_mutex_lock(&r->mu);
	m = find_uid_locked(r, uid);
	if (m) {
		if (before)
			*before = m->steps;
		m->steps += n;
	}
	ts_mutex_unlock(&r->mu);
	return m != NULL;
}

bool ts_model_registry_step_count(struct ts_model_registry *r, uint64_t uid, uint64_t *steps)
{
	struct ts_model *m;

	ts_mutex_lock(&r->mu);
	m = find_uid_locked(r, uid);
	if (m)
		*steps = m->steps;
	ts_mutex_unlock(&r->mu);
	return m != NULL;
}

size_t ts_model_registry_list(struct ts_model_registry *r, struct ts_model *out, size_t cap)
{
	size_t n;

	ts_mutex_lock(&r->mu);
	n = ts_registry_count(&r->names) < cap ? ts_registry_count(&r->names) : cap;
	for (size_t i = 0; i < n; i++)
		out[i] = *(const struct ts_model *)ts_registry_at(&r->names, i);
	ts_mutex_unlock(&r->mu);
	return n;
}
