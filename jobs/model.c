/*
 * model.c - a model's life in the catalog: creation, deletion, and where
 * its arrays are (jobs/model.h).
 *
 * Creation is an operation: the request's model is listed (not ready) and
 * its arrays allocated on the caller's thread - admission: a model that
 * cannot fit is refused at once; the O(size) part, initialising the
 * weights, runs on an operation worker, which publishes the arrays all at
 * once and marks the model ready. A creation that fails or is cancelled
 * leaves nothing.
 */
#include "jobs/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "jobs/render.h"
#include "storage/array.h"
#include "storage/array_io.h"

#define INIT_CHUNK (1u << 20)   /* floats generated per write */

/* ---- creation ------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Fills a with its initial values: normal(0, scale) from (seed, role), a
 * constant, or zeros for optimizer state; a GPT's LayerNorm scales ones and
 * its LayerNorm shifts and biases zeros (unless a constant is asked). */
static ts_status init_array(const struct ts_jobs_env *env, struct ts_operation *op, struct ts_array *a,
                            enum ts_pbuf_role role, const struct ts_model_init *in,
                            struct ts_error *err)
{
	uint64_t n = ts_array_desc(a)->nbytes / 4, done = 0, state = in->seed * 1000003ull + (uint64_t)role;
	struct ts_array_writer *w = NULL;
	float *chunk = malloc(INIT_CHUNK * sizeof *chunk);
	int kind, t;
	bool gpt = ts_gpt_role_of(role, &kind, &t);
	/* a GPT's LayerNorm scales start at 1, its shifts and biases at 0 */
	bool one = gpt && kind == 0 && !in->constant &&
	           ts_gpt_param_is_scale((enum ts_gpt_param)t);
	bool zero = ts_role_opt_state(role) ||
	            (gpt && kind == 0 && !in->constant && !one &&
	             !ts_gpt_param_is_matrix((enum ts_gpt_param)t));
	ts_status st;

	if (!chunk)
		return ts_error_oom(err, "no memory to initialise");
	st = ts_array_writer_new(env->stager, a, &w, err);
	while (st == TS_OK && done < n) {
		uint64_t k = n - done < INIT_CHUNK ? n - done : INIT_CHUNK;

		for (uint64_t i = 0; i < k; i++) {
			if (zero || one) {
				chunk[i] = one ? 1.0f : 0.0f;
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

void ts_job_model_placement(const struct ts_model *m, enum ts_pbuf_role role,
                            struct ts_placement *pl)
{
	enum ts_memory_kind kind = ts_role_param(role) ? m->policy.params : m->policy.opt_state;
	struct ts_sharding *sh = &pl->sharding;

	if (m->replicas <= 1) {
		ts_placement_single(pl, m->device, kind, true);
		return;
	}
	memset(pl, 0, sizeof *pl);
	sh->type = TS_SHARDING_NAMED;
	sh->memory_kind = kind;
	sh->mesh.ndevices = m->replicas;
	sh->mesh.naxes = 1;
	snprintf(sh->mesh.axis_names[0], sizeof sh->mesh.axis_names[0], "data");
	sh->mesh.shape[0] = m->replicas;
	for (int k = 0; k < m->replicas; k++)
		sh->mesh.devices[k] = m->replica_devs[k];
	sh->spec_rank = 0;                   /* no dimension split: a replica each */
	if (m->shard_optimizer && ts_role_opt_state(role)) {
		/* ZeRO-1: each device its slice of every update (plan.h's
		 * ts_plan_build_zero): a parameter updated layer by layer [L, a,
		 * ...] split along a, a whole one along its first dimension */
		int t, which, dim;

		dim = ts_gpt_role_of(role, &which, &t)
		      ? (ts_gpt_param_per_layer((enum ts_gpt_param)t) ? 1 : 0)
		      : (role >= TS_ROLE_MU_W1 && role <= TS_ROLE_NU_W2 ? 1 : 0);
		sh->spec_rank = dim + 1;
		sh->spec[dim].naxes = 1;
		sh->spec[dim].axes[0] = 0;
	}
	pl->committed = true;
}

struct ts_buffer *ts_job_model_buffer(const struct ts_array *a, int k)
{
	return ts_array_nshards(a) == 1 && k == 0 ? ts_array_single_buffer(a)
	                                          : ts_array_shard_buffer(a, k);
}

struct create {
	const struct ts_jobs_env *env;
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
	ts_model_registry_set_ready(c->env->models, c->model.uid, false, id);
	return TS_OK;
}

static ts_status create_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct create *c = arg;
	ts_status st = TS_OK;

	for (size_t i = 0; i < c->n && st == TS_OK; i++)
		st = init_array(c->env, op, c->arrs[i], c->roles[i], &c->init, err);
	if (st == TS_OK)
		st = ts_catalog_put_all(c->env->catalog, c->arrs, c->n, false, err);
	if (st != TS_OK)
		return st;
	c->published = true;
	ts_model_registry_set_ready(c->env->models, c->model.uid, true, NULL);
	c->model.ready = true;
	ts_operation_set_result(op, ts_render_model(&c->model));
	return TS_OK;
}

static void create_release(void *arg)
{
	struct create *c = arg;

	if (!c->published && c->model.uid)
		ts_model_registry_remove(c->env->models, c->model.uid);
	for (size_t i = 0; i < c->n; i++)
		ts_array_unref(c->arrs[i]);
	free(c);
}


/* The model's arrays, allocated: every name free, every array fitting, or
 * nothing. */
static ts_status create_admit(struct create *c, uint64_t *total, struct ts_error *err)
{
	const struct ts_jobs_env *env = c->env;
	char owner[160];

	ts_model_owner(&c->model, owner, sizeof owner);
	/* the names first: a model or array name taken refuses it all */
	for (size_t i = 0; i < TS_MODEL_NROLES; i++) {
		struct ts_array *there;
		char name[256];

		if (!ts_model_has_role(&c->model, ts_model_roles[i]))
			continue;
		ts_model_array_name(&c->model, ts_model_roles[i], name, sizeof name);
		there = ts_catalog_get(env->catalog, name);
		ts_array_unref(there);
		if (there)
			return ts_error_set(err, TS_ALREADY_EXISTS, "ARRAY_EXISTS",
			                    "array '%s' already exists; model '%s' needs the name", name,
			                    c->model.name);
	}
	/* admission: the whole model against each space's free bytes, then every
	 * array allocated now, or nothing is created */
	if (ts_model_check_fit(&c->model, env->memory, err) != TS_OK)
		return err->status;
	for (size_t i = 0; i < TS_MODEL_NROLES; i++) {
		enum ts_pbuf_role role = ts_model_roles[i];
		struct ts_array_desc d = {.dtype = TS_DT_FLOAT32};
		struct ts_placement pl;
		char name[256];

		if (!ts_model_has_role(&c->model, role))
			continue;
		ts_model_array_name(&c->model, role, name, sizeof name);
		d.rank = ts_model_param_shape(&c->model, role, d.shape);
		ts_job_model_placement(&c->model, role, &pl);
		if (ts_array_desc_init(&d, err) != TS_OK ||
		    ts_array_new(name, &d, &pl, env->memory, &c->arrs[c->n], err) != TS_OK)
			return err->status;
		ts_array_set_owner(c->arrs[c->n], owner);
		c->roles[c->n++] = role;
		*total += d.nbytes;
	}
	return TS_OK;
}

ts_status ts_job_model_create_submit(const struct ts_jobs_env *env, const struct ts_model *m,
                                     const struct ts_model_init *init, struct ts_operation **op,
                                     struct ts_error *err)
{
	struct create *c = calloc(1, sizeof *c);
	uint64_t total = 0;
	ts_status st;

	*op = NULL;
	if (!c)
		return ts_error_oom(err, "no memory for a model");
	c->env = env;
	c->model = *m;
	c->init = *init;
	c->model.create_ns = ts_wall_ns();
	st = ts_model_registry_put(env->models, &c->model, &c->model.uid, err);
	if (st == TS_OK)
		st = create_admit(c, &total, err);
	if (st == TS_OK)
		st = ts_op_submit_holding(env->operations, "create", c->model.name, total, "bytes",
		                          create_run, c, create_release, create_hold, op, err);
	if (st != TS_OK)
		create_release(c);
	return st;
}

/* ---- deletion ------------------------------------------------------------------- */

ts_status ts_job_model_delete(const struct ts_jobs_env *env, const struct ts_model *m,
                              struct ts_error *err)
{
	char names[TS_MODEL_NROLES + 4][256], owner[160], holder[40];
	const char *list[TS_MODEL_NROLES + 4];
	struct ts_precondition pre = {.owner = owner};
	size_t n = 0;

	ts_model_owner(m, owner, sizeof owner);
	for (size_t i = 0; i < TS_MODEL_NROLES; i++)
		if (ts_model_has_role(m, ts_model_roles[i]))
			ts_model_array_name(m, ts_model_roles[i], names[n++], sizeof names[0]);
	for (int g = 1; g <= 2; g++)          /* gradients of earlier steps, if any */
		snprintf(names[n++], sizeof names[0], "%s.grad.w%d", m->name, g);
	if (ts_mlp_tokens(&m->mlp)) {
		snprintf(names[n++], sizeof names[0], "%s.grad.embed", m->name);
		if (m->mlp.proj)
			snprintf(names[n++], sizeof names[0], "%s.grad.proj", m->name);
	}
	for (size_t i = 0; i < n; i++) {
		list[i] = names[i];
		if (ts_catalog_held(env->catalog, names[i], holder, sizeof holder)) {
			ts_error_set(err, TS_ABORTED, "MODEL_BUSY",
			             "model '%s' is in use by operation %s (array '%s'); cancel it or "
			             "wait for it, then delete", m->name, holder, names[i]);
			ts_error_meta(err, "operation", "%s", holder);
			return err->status;
		}
	}
	if (ts_catalog_delete_all(env->catalog, list, n, &pre, err) != TS_OK)
		return err->status;
	ts_model_registry_remove(env->models, m->uid);
	return TS_OK;
}

/* ---- where the arrays are ------------------------------------------------------- */

/* The memory kind shared by the model's arrays of the given roles (where
 * they are now); mixed kinds are FAILED_PRECONDITION naming two of them. */
static ts_status arrays_kind(const struct ts_jobs_env *env, const struct ts_model *m,
                             const enum ts_pbuf_role *roles, size_t n, enum ts_memory_kind *kind,
                             struct ts_error *err)
{
	char first[256] = "", name[256];

	for (size_t i = 0; i < n; i++) {
		struct ts_array *a;
		enum ts_memory_kind k;

		if (!ts_model_has_role(m, roles[i]))
			continue;
		ts_model_array_name(m, roles[i], name, sizeof name);
		a = ts_catalog_get(env->catalog, name);
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

ts_status ts_job_model_policy(const struct ts_jobs_env *env, const struct ts_model *m,
                              struct ts_policy *out, struct ts_error *err)
{
	static const enum ts_pbuf_role params[] = {TS_ROLE_W1, TS_ROLE_W2, TS_ROLE_EMBED,
	                                           TS_ROLE_PROJ};
	static const enum ts_pbuf_role state[] = {TS_ROLE_MU_W1, TS_ROLE_MU_W2, TS_ROLE_NU_W1,
	                                          TS_ROLE_NU_W2, TS_ROLE_MU_EMBED, TS_ROLE_MU_PROJ,
	                                          TS_ROLE_NU_EMBED, TS_ROLE_NU_PROJ};

	*out = m->policy;
	if (arrays_kind(env, m, params, 4, &out->params, err) != TS_OK ||
	    arrays_kind(env, m, state, 8, &out->opt_state, err) != TS_OK)
		return err->status;
	return TS_OK;
}
