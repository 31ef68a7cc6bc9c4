/*
 * checkpoint.c - a model's exact checkpoint (jobs/checkpoint.h): its
 * metadata, and the reader that lists the model and admits its arrays
 * once the header checks out, then publishes them all at once.
 */
#include "jobs/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "device/device.h"
#include "jobs/model.h"
#include "jobs/model_spec.h"
#include "jobs/render.h"

#define NROLES TS_MODEL_NROLES
#define all_roles ts_model_roles

size_t ts_checkpoint_roles(const struct ts_model *m, enum ts_pbuf_role *roles)
{
	size_t n = 0;

	for (size_t i = 0; i < NROLES; i++) {
		enum ts_pbuf_role r = all_roles[i];

		if (ts_model_has_role(m, r))
			roles[n++] = r;
	}
	return n;
}

void ts_checkpoint_tensor_name(const struct ts_model *m, enum ts_pbuf_role r, char *buf,
                               size_t cap)
{
	char full[TS_MODEL_NAME_MAX + 32];

	ts_model_array_name(m, r, full, sizeof full);
	snprintf(buf, cap, "%s", full + strlen(m->name) + 1);
}

json_t *ts_checkpoint_metadata(const struct ts_model *m)
{
	json_t *spec = ts_render_model_spec(m), *meta = NULL;
	char *text = NULL, steps[32];

	if (spec) {
		json_object_del(spec, "steps");
		text = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS);
	}
	snprintf(steps, sizeof steps, "%" PRIu64, m->steps);
	if (text)
		meta = json_pack("{s:s, s:s, s:s}", "format", TS_CHECKPOINT_FORMAT, "model", text,
		                 "steps", steps);
	free(text);
	json_decref(spec);
	return meta;
}

static ts_status bad_checkpoint(struct ts_error *err, const char *fmt, const char *a,
                                const char *b)
{
	return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_CHECKPOINT", fmt, a, b);
}

/* The metadata string key (borrowed), or an error naming it. */
static ts_status meta_string(const json_t *meta, const char *key, const char **out,
                             struct ts_error *err)
{
	*out = json_string_value(json_object_get(meta, key));
	if (!*out)
		return bad_checkpoint(err, "the checkpoint's __metadata__ has no '%s'%s; a model "
		                      "checkpoint is written by GET /v1/models/{model}:export", key, "");
	return TS_OK;
}

/* The model the checkpoint's metadata describes, with the request's name
 * and device, into im->model. */
static ts_status import_model(struct ts_checkpoint_rx *im, const json_t *meta, struct ts_error *err)
{
	const char *format, *text, *steps_text;
	struct ts_model_init init;
	json_error_t jerr;
	json_t *spec = NULL;
	char *end = NULL;
	unsigned long long steps;
	ts_status st;

	if (!meta)
		return bad_checkpoint(err, "the safetensors file has no __metadata__%s%s; a model "
		                      "checkpoint is written by GET /v1/models/{model}:export", "", "");
	if (meta_string(meta, "format", &format, err) != TS_OK ||
	    meta_string(meta, "model", &text, err) != TS_OK ||
	    meta_string(meta, "steps", &steps_text, err) != TS_OK)
		return err->status;
	if (strcmp(format, TS_CHECKPOINT_FORMAT) != 0)
		return bad_checkpoint(err, "__metadata__ format '%.64s' is not '%s'", format,
		                      TS_CHECKPOINT_FORMAT);
	errno = 0;
	steps = steps_text[0] >= '0' && steps_text[0] <= '9' ? strtoull(steps_text, &end, 10) : 0;
	if (!end || *end || errno || steps > 1000000000ull)
		return bad_checkpoint(err, "__metadata__ steps '%.40s' is not a step count in "
		                      "0..%s", steps_text, "1000000000");
	spec = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
	if (!json_is_object(spec)) {
		json_decref(spec);
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_CHECKPOINT",
		                    "__metadata__ model is not a model spec (a JSON object): %s",
		                    spec ? "not an object" : jerr.text);
	}
	if (json_object_get(spec, "steps")) {
		json_decref(spec);
		return bad_checkpoint(err, "__metadata__ model carries steps; the step count is "
		                      "__metadata__ steps%s%s", "", "");
	}
	json_object_set_new(spec, "steps", json_integer((json_int_t)steps));
	if (im->name[0])
		json_object_set_new(spec, "name", json_string(im->name));
	if (im->device[0]) {
		json_t *pl = json_object_get(spec, "placement");

		if (!json_is_object(pl)) {
			pl = json_object();
			json_object_set_new(spec, "placement", pl);
		}
		json_object_set_new(pl, "device", json_string(im->device));
		json_object_del(pl, "devices");       /* onto that one device */
		json_object_del(pl, "shard_optimizer");
	}
	st = ts_job_model_parse(im->env, im->default_device, spec, &im->model, &init, err);
	json_decref(spec);
	if (st != TS_OK) {
		static const char pre[] = "checkpoint __metadata__ model: ";
		size_t len = strnlen(err->message, sizeof err->message - 1);

		/* the parser's message, prefixed (its end cut when it must) */
		if (len + sizeof pre > sizeof err->message)
			len = sizeof err->message - sizeof pre;
		memmove(err->message + sizeof pre - 1, err->message, len);
		memcpy(err->message, pre, sizeof pre - 1);
		err->message[sizeof pre - 1 + len] = '\0';
	}
	return st;
}

/* Whether the first rank dimensions of a and b agree. */
static bool same_dims(const uint64_t *a, const uint64_t *b, int rank)
{
	for (int k = 0; k < rank; k++)
		if (a[k] != b[k])
			return false;
	return true;
}

/* Checks the tensors against the model's arrays and admits them (all or
 * nothing): the model is listed, not ready, from here on. */
static ts_status import_admit(void *ctx, const struct ts_st_header *st, struct ts_array **arrays,
                              struct ts_error *err)
{
	struct ts_checkpoint_rx *im = ctx;
	struct ts_model *m = &im->model;
	enum ts_pbuf_role roles[NROLES], of[NROLES];
	size_t n;
	char owner[TS_MODEL_NAME_MAX + 16];

	if (import_model(im, st->metadata, err) != TS_OK)
		return err->status;
	n = ts_checkpoint_roles(m, roles);
	/* every tensor is one of the model's arrays, of its dtype and shape */
	for (size_t i = 0; i < st->ntensors; i++) {
		const struct ts_st_tensor *t = &st->tensors[i];
		uint64_t shape[3];
		size_t r;
		char tn[32];
		int rank;

		for (r = 0; r < n; r++) {
			ts_checkpoint_tensor_name(m, roles[r], tn, sizeof tn);
			if (strcmp(tn, t->name) == 0)
				break;
		}
		if (r == n)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_CHECKPOINT",
			                    "tensor '%.100s' is not an array of model '%s' (%s optimizer "
			                    "'%s')", t->name, m->name, ts_mlp_has_w2(&m->mlp) ? "with w2," :
			                    "without w2,", ts_optimizer_name(&m->opt));
		rank = ts_model_param_shape(m, roles[r], shape);
		if (t->dtype != TS_DT_FLOAT32 || t->rank != rank || !same_dims(t->shape, shape, rank)) {
			char want[96];
			int at = 0;

			for (int k = 0; k < rank && at < (int)sizeof want; k++)
				at += snprintf(want + at, sizeof want - (size_t)at, "%s%" PRIu64,
				               k ? ", " : "", shape[k]);
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_CHECKPOINT",
			                    "tensor '%s' must be float32 [%s] for model '%s'", t->name,
			                    want, m->name);
		}
		of[i] = roles[r];
	}
	for (size_t r = 0; r < n; r++) {
		size_t i;
		char tn[32];

		for (i = 0; i < st->ntensors && of[i] != roles[r]; i++)
			;
		if (i == st->ntensors) {
			ts_checkpoint_tensor_name(m, roles[r], tn, sizeof tn);
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_CHECKPOINT",
			                    "the checkpoint has no tensor '%s'; model '%s' needs it", tn,
			                    m->name);
		}
	}
	/* the names: the model's, then its arrays' (a name taken refuses it all) */
	m->create_ns = ts_wall_ns();
	m->persist = im->persist;
	if (ts_model_registry_put(im->env->models, m, &m->uid, err) != TS_OK) {
		m->uid = 0;
		return err->status;
	}
	for (size_t r = 0; r < n; r++) {
		char an[TS_MODEL_NAME_MAX + 32];
		struct ts_array *there;

		ts_model_array_name(m, roles[r], an, sizeof an);
		there = ts_catalog_get(im->env->catalog, an);
		ts_array_unref(there);
		if (there)
			return ts_error_set(err, TS_ALREADY_EXISTS, "ARRAY_EXISTS",
			                    "array '%s' already exists; model '%s' needs the name", an,
			                    m->name);
	}
	ts_model_owner(m, owner, sizeof owner);
	for (size_t i = 0; i < st->ntensors; i++) {
		struct ts_array_desc d = {.dtype = TS_DT_FLOAT32};
		struct ts_placement pl;
		char an[TS_MODEL_NAME_MAX + 32];

		ts_model_array_name(m, of[i], an, sizeof an);
		d.rank = ts_model_param_shape(m, of[i], d.shape);
		ts_job_model_placement(m, of[i], &pl);     /* data parallel: every replica */
		if (ts_array_desc_init(&d, err) != TS_OK ||
		    ts_array_new(an, &d, &pl, im->env->memory, &arrays[i], err) != TS_OK)
			return err->status;
		ts_array_set_owner(arrays[i], owner);
	}
	return TS_OK;
}

ts_status ts_checkpoint_rx_init(struct ts_checkpoint_rx *c, const struct ts_jobs_env *env,
                                struct ts_device *default_device, const char *name,
                                const char *device, bool persist, uint64_t content_length,
                                struct ts_error *err)
{
	memset(c, 0, sizeof *c);
	if ((name && strlen(name) >= sizeof c->name) || (device && strlen(device) >= sizeof c->device))
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_CHECKPOINT",
		                    "the model's name or device is too long");
	c->env = env;
	c->default_device = default_device;
	c->persist = persist;
	snprintf(c->name, sizeof c->name, "%s", name ? name : "");
	snprintf(c->device, sizeof c->device, "%s", device ? device : "");
	ts_import_rx_init(&c->rx, env, content_length, import_admit, c);
	return TS_OK;
}

ts_status ts_checkpoint_rx_bytes(struct ts_checkpoint_rx *c, const char *data, size_t n,
                                 struct ts_error *err)
{
	return ts_import_rx_bytes(&c->rx, data, n, err);
}

ts_status ts_checkpoint_rx_publish(struct ts_checkpoint_rx *c, struct ts_error *err)
{
	if (ts_import_rx_finish(&c->rx, err) != TS_OK ||
	    ts_catalog_put_all(c->env->catalog, c->rx.arrays, c->rx.st.ntensors, false,
	                       err) != TS_OK)
		return err->status;
	c->published = true;
	ts_model_registry_set_ready(c->env->models, c->model.uid, true, NULL);
	c->model.ready = true;
	return TS_OK;
}

void ts_checkpoint_rx_release(struct ts_checkpoint_rx *c)
{
	if (!c->published && c->model.uid)
		ts_model_registry_remove(c->env->models, c->model.uid);
	ts_import_rx_release(&c->rx);
}
