/*
 * model.c - model records, their array names, and the registry.
 */
#include "train/model.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODELS_MAX 1024

struct ts_model_registry {
	pthread_mutex_t mu;
	size_t n;                          /* guarded by: mu */
	uint64_t next_uid;                 /* guarded by: mu */
	struct ts_model *models;           /* guarded by: mu; sorted by name */
	struct ts_histogram steps;         /* atomics: every step run */
};

void ts_model_array_name(const struct ts_model *m, enum ts_pbuf_role role, char *buf, size_t cap)
{
	static const char *const suffix[] = {
		[TS_ROLE_W1] = "w1", [TS_ROLE_W2] = "w2",
		[TS_ROLE_MU_W1] = "adam.mu.w1", [TS_ROLE_MU_W2] = "adam.mu.w2",
		[TS_ROLE_NU_W1] = "adam.nu.w1", [TS_ROLE_NU_W2] = "adam.nu.w2",
	};

	snprintf(buf, cap, "%s.%s", m->name, role <= TS_ROLE_NU_W2 ? suffix[role] : "?");
}

void ts_model_owner(const struct ts_model *m, char *buf, size_t cap)
{
	snprintf(buf, cap, "model '%s'", m->name);
}

void ts_model_param_shape(const struct ts_model *m, enum ts_pbuf_role role, uint64_t shape[3])
{
	bool second = role == TS_ROLE_W2 || role == TS_ROLE_MU_W2 || role == TS_ROLE_NU_W2;
	uint64_t d = (uint64_t)m->mlp.d_model, h = (uint64_t)ts_mlp_hidden(&m->mlp);

	shape[0] = (uint64_t)m->mlp.layers;
	shape[1] = second ? h : d;
	shape[2] = second ? d : h;
}

struct ts_model_registry *ts_model_registry_new(void)
{
	struct ts_model_registry *r = calloc(1, sizeof *r);

	if (!r)
		return NULL;
	r->models = calloc(MODELS_MAX, sizeof *r->models);
	if (!r->models) {
		free(r);
		return NULL;
	}
	pthread_mutex_init(&r->mu, NULL);
	ts_histogram_init(&r->steps, ts_histogram_long_bounds, ts_histogram_long_nbounds);
	return r;
}

void ts_model_registry_step_ran(struct ts_model_registry *r, uint64_t ns)
{
	ts_histogram_observe(&r->steps, ns);
}

const struct ts_histogram *ts_model_registry_steps(const struct ts_model_registry *r)
{
	return &r->steps;
}

void ts_model_registry_free(struct ts_model_registry *r)
{
	if (!r)
		return;
	pthread_mutex_destroy(&r->mu);
	free(r->models);
	free(r);
}

static size_t find_locked(const struct ts_model_registry *r, const char *name, bool *found)
{
	size_t lo = 0, hi = r->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(r->models[mid].name, name);

		if (c == 0) {
			*found = true;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = false;
	return lo;
}

ts_status ts_model_registry_put(struct ts_model_registry *r, const struct ts_model *m,
                                uint64_t *uid, struct ts_error *err)
{
	ts_status st = TS_OK;
	bool found;
	size_t at;

	pthread_mutex_lock(&r->mu);
	at = find_locked(r, m->name, &found);
	if (found)
		st = ts_error_set(err, TS_ALREADY_EXISTS, "MODEL_EXISTS", "model '%s' already exists",
		                  m->name);
	else if (r->n == MODELS_MAX)
		st = ts_error_set(err, TS_RESOURCE_EXHAUSTED, "TOO_MANY_MODELS",
		                  "at most %d models", MODELS_MAX);
	if (st == TS_OK) {
		memmove(&r->models[at + 1], &r->models[at], (r->n - at) * sizeof *r->models);
		r->models[at] = *m;
		r->models[at].uid = ++r->next_uid;
		if (uid)
			*uid = r->models[at].uid;
		r->n++;
	}
	pthread_mutex_unlock(&r->mu);
	return st;
}

bool ts_model_registry_get(struct ts_model_registry *r, const char *name, struct ts_model *out)
{
	bool found;
	size_t at;

	pthread_mutex_lock(&r->mu);
	at = find_locked(r, name, &found);
	if (found)
		*out = r->models[at];
	pthread_mutex_unlock(&r->mu);
	return found;
}

/* The index of the model with this uid, or r->n. */
static size_t find_uid_locked(const struct ts_model_registry *r, uint64_t uid)
{
	size_t i;

	for (i = 0; i < r->n && r->models[i].uid != uid; i++)
		;
	return i;
}

bool ts_model_registry_remove(struct ts_model_registry *r, uint64_t uid)
{
	bool found;
	size_t at;

	pthread_mutex_lock(&r->mu);
	at = find_uid_locked(r, uid);
	found = at < r->n;
	if (found) {
		memmove(&r->models[at], &r->models[at + 1], (r->n - at - 1) * sizeof *r->models);
		r->n--;
	}
	pthread_mutex_unlock(&r->mu);
	return found;
}

bool ts_model_registry_set_ready(struct ts_model_registry *r, uint64_t uid, bool ready,
                                 const char *creating)
{
	bool found;
	size_t at;

	pthread_mutex_lock(&r->mu);
	at = find_uid_locked(r, uid);
	found = at < r->n;
	if (found) {
		r->models[at].ready = ready;
		snprintf(r->models[at].creating, sizeof r->models[at].creating, "%s",
		         !ready && creating ? creating : "");
	}
	pthread_mutex_unlock(&r->mu);
	return found;
}

bool ts_model_registry_advance(struct ts_model_registry *r, uint64_t uid, uint64_t n,
                               uint64_t *before)
{
	bool found;
	size_t at;

	pthread_mutex_lock(&r->mu);
	at = find_uid_locked(r, uid);
	found = at < r->n;
	if (found) {
		if (before)
			*before = r->models[at].steps;
		r->models[at].steps += n;
	}
	pthread_mutex_unlock(&r->mu);
	return found;
}

size_t ts_model_registry_list(struct ts_model_registry *r, struct ts_model *out, size_t cap)
{
	size_t n;

	pthread_mutex_lock(&r->mu);
	n = r->n < cap ? r->n : cap;
	memcpy(out, r->models, n * sizeof *out);
	pthread_mutex_unlock(&r->mu);
	return n;
}
