/*
 * checkpoint.c - exact checkpoints of a model: GET /v1/models/{model}:export
 * and POST /v1/models:import.
 *
 * A checkpoint is a safetensors file: the model's parameters and optimizer
 * state as float32 tensors named by their role ("w1", "w2", "adam.mu.w1",
 * "adam.mu.w2", "adam.nu.w1", "adam.nu.w2"; those the model has), and in
 * "__metadata__" the strings "format" ("tstage.model.v1"), "model" (the
 * model's spec as POST /v1/models takes it, without "steps") and "steps"
 * (the optimizer's step count, Adam's t, in decimal). Importing it creates
 * the model with exactly those bytes and that t, so training continues as
 * if it had never stopped: the same losses bit for bit.
 *
 * Export holds the model's arrays for an instant (409 ABORTED naming the
 * step when one runs: its weights are changing in place) so that the
 * weights and t it reads belong together, then streams the file from the
 * arrays as array exports do. Import streams the body through the
 * safetensors receiver that POST /v1/arrays:import uses: the header is
 * checked as the model's (the metadata, every tensor's name, dtype and
 * shape; a file with a tensor missing or extra is 400 naming it) before
 * any byte lands; the model is listed (not ready) and its arrays admitted
 * at once, and published all together, ready, when the last byte has
 * arrived: a refused or truncated import leaves nothing.
 */
#include "handlers/arrays_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/units.h"
#include "device/device.h"
#include "handlers/model_spec.h"
#include "jobs/import.h"
#include "storage/array_io.h"
#include "train/model.h"

#define CHECKPOINT_FORMAT "tstage.model.v1"
#define NROLES TS_MODEL_NROLES
#define all_roles ts_model_roles

/* The roles model m has, in all_roles order, into roles; their count. */
static size_t model_roles(const struct ts_model *m, enum ts_pbuf_role *roles)
{
	size_t n = 0;

	for (size_t i = 0; i < NROLES; i++) {
		enum ts_pbuf_role r = all_roles[i];

		if (ts_model_has_role(m, r))
			roles[n++] = r;
	}
	return n;
}

/* Whether the first rank dimensions of a and b agree. */
static bool same_dims(const uint64_t *a, const uint64_t *b, int rank)
{
	for (int k = 0; k < rank; k++)
		if (a[k] != b[k])
			return false;
	return true;
}

/* The tensor name of a role: the array's name after "{model}." */
static void role_tensor_name(const struct ts_model *m, enum ts_pbuf_role r, char *buf, size_t cap)
{
	char full[TS_MODEL_NAME_MAX + 32];

	ts_model_array_name(m, r, full, sizeof full);
	snprintf(buf, cap, "%s", full + strlen(m->name) + 1);
}

/* ---- export ----------------------------------------------------------------------- */

/* The checkpoint's metadata (new reference; NULL when out of memory). */
static json_t *checkpoint_metadata(const struct ts_model *m)
{
	json_t *spec = ts_render_model_spec(m), *meta = NULL;
	char *text = NULL, steps[32];

	if (spec) {
		json_object_del(spec, "steps");
		text = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS);
	}
	snprintf(steps, sizeof steps, "%" PRIu64, m->steps);
	if (text)
		meta = json_pack("{s:s, s:s, s:s}", "format", CHECKPOINT_FORMAT, "model", text,
		                 "steps", steps);
	free(text);
	json_decref(spec);
	return meta;
}

void ts_h_models_export(const struct ts_call *call, struct ts_reply *reply)
{
	static _Atomic uint64_t exports;
	const char *name = ts_call_param(call, "model");
	struct ts_array *arrs[NROLES] = {0};
	struct ts_st_tensor tensors[NROLES];
	char tnames[NROLES][32], holder[64], disp[TS_MODEL_NAME_MAX + 64];
	enum ts_pbuf_role roles[NROLES];
	struct ts_h_part *parts = NULL;
	struct ts_stream stream;
	struct ts_model m;
	struct ts_error err;
	char *hdr = NULL;
	size_t n = 0, hdr_len = 0;
	json_t *meta = NULL;

	ts_error_clear(&err);
	if (!name || !ts_model_registry_get(call->core->env.models, name, &m)) {
		ts_reply_fail(reply, TS_NOT_FOUND, "MODEL_NOT_FOUND", "model '%s' not found",
		              name ? name : "");
		return;
	}
	if (!m.ready) {
		ts_error_set(&err, TS_ABORTED, "MODEL_CREATING",
		             "model '%s' is being created by operation %s; wait for it", m.name,
		             m.creating);
		goto out_fail;
	}
	n = model_roles(&m, roles);
	for (size_t i = 0; i < n; i++) {
		char an[TS_MODEL_NAME_MAX + 32];

		ts_model_array_name(&m, roles[i], an, sizeof an);
		if (!(arrs[i] = ts_catalog_get(call->core->env.catalog, an))) {
			ts_error_set(&err, TS_NOT_FOUND, "ARRAY_NOT_FOUND",
			             "array '%s' of model '%s' not found", an, m.name);
			goto out_fail;
		}
	}
	/* an instant's hold: no step runs on these versions (it would hold them),
	 * so the step count read now is theirs */
	snprintf(holder, sizeof holder, "export %" PRIu64 ".%" PRIu64, m.uid,
	         atomic_fetch_add(&exports, 1));
	if (ts_catalog_hold(call->core->env.catalog, arrs, n, holder, &err) != TS_OK)
		goto out_fail;
	if (!ts_model_registry_get(call->core->env.models, name, &m) || m.uid == 0) {
		ts_catalog_release(call->core->env.catalog, holder);
		ts_error_set(&err, TS_ABORTED, "MODEL_GONE", "model '%s' was deleted", name);
		goto out_fail;
	}
	ts_catalog_release(call->core->env.catalog, holder);
	meta = checkpoint_metadata(&m);
	parts = calloc(NROLES, sizeof *parts);
	if (!meta || !parts) {
		ts_error_oom(&err, "no memory for the export");
		goto out_fail;
	}
	for (size_t i = 0; i < n; i++) {
		const struct ts_array_desc *d = ts_array_desc(arrs[i]);

		role_tensor_name(&m, roles[i], tnames[i], sizeof tnames[i]);
		tensors[i] = (struct ts_st_tensor){.name = tnames[i], .dtype = d->dtype, .rank = d->rank};
		memcpy(tensors[i].shape, d->shape, sizeof tensors[i].shape);
	}
	if (ts_st_build_header(tensors, n, meta, &hdr, &hdr_len, &err) != TS_OK)
		goto out_fail;
	for (size_t i = 0; i < n; i++) {
		const struct ts_array_desc *d = ts_array_desc(arrs[i]);

		parts[i].array = arrs[i];
		arrs[i] = NULL;
		ts_selection_all(d->rank, d->shape, &parts[i].sel);
	}
	if (ts_h_reader_stream(call->core, hdr, hdr_len, parts, n, &stream, &err) != TS_OK) {
		parts = NULL;
		hdr = NULL;
		goto out_fail;
	}
	hdr = NULL;
	parts = NULL;
	ts_reply_stream(reply, TS_HTTP_OK, "application/octet-stream", &stream);
	snprintf(disp, sizeof disp, "attachment; filename=\"%s.safetensors\"", m.name);
	ts_reply_header(reply, "Content-Disposition", disp);
	goto out_free;

out_fail:
	ts_reply_error(reply, &err);
out_free:
	for (size_t i = 0; i < NROLES; i++)
		ts_array_unref(arrs[i]);
	free(parts);
	free(hdr);
	json_decref(meta);
}

/* ---- import ----------------------------------------------------------------------- */

struct mimport {
	const struct ts_core *core;
	struct ts_import_rx rx;
	char name[TS_MODEL_NAME_MAX + 1];      /* ?name=, "" for the checkpoint's */
	char device[64];                       /* ?device=, "" for the checkpoint's */
	struct ts_model model;                 /* once admitted: with its uid */
	bool published;
};

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
static ts_status import_model(struct mimport *im, const json_t *meta, struct ts_error *err)
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
	if (strcmp(format, CHECKPOINT_FORMAT) != 0)
		return bad_checkpoint(err, "__metadata__ format '%.64s' is not '%s'", format,
		                      CHECKPOINT_FORMAT);
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
	}
	st = ts_h_model_parse(im->core, spec, &im->model, &init, err);
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

/* Checks the tensors against the model's arrays and admits them (all or
 * nothing): the model is listed, not ready, from here on. */
static ts_status import_admit(void *ctx, const struct ts_st_header *st, struct ts_array **arrays,
                              struct ts_error *err)
{
	struct mimport *im = ctx;
	struct ts_model *m = &im->model;
	enum ts_pbuf_role roles[NROLES], of[NROLES];
	size_t n;
	char owner[TS_MODEL_NAME_MAX + 16];

	if (import_model(im, st->metadata, err) != TS_OK)
		return err->status;
	n = model_roles(m, roles);
	/* every tensor is one of the model's arrays, of its dtype and shape */
	for (size_t i = 0; i < st->ntensors; i++) {
		const struct ts_st_tensor *t = &st->tensors[i];
		uint64_t shape[3];
		size_t r;
		char tn[32];
		int rank;

		for (r = 0; r < n; r++) {
			role_tensor_name(m, roles[r], tn, sizeof tn);
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
			role_tensor_name(m, roles[r], tn, sizeof tn);
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_CHECKPOINT",
			                    "the checkpoint has no tensor '%s'; model '%s' needs it", tn,
			                    m->name);
		}
	}
	/* the names: the model's, then its arrays' (a name taken refuses it all) */
	m->create_ns = ts_wall_ns();
	if (ts_model_registry_put(im->core->env.models, m, &m->uid, err) != TS_OK) {
		m->uid = 0;
		return err->status;
	}
	for (size_t r = 0; r < n; r++) {
		char an[TS_MODEL_NAME_MAX + 32];
		struct ts_array *there;

		ts_model_array_name(m, roles[r], an, sizeof an);
		there = ts_catalog_get(im->core->env.catalog, an);
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
		ts_placement_single(&pl, m->device,
		                    ts_role_param(of[i]) ? m->policy.params : m->policy.opt_state, true);
		if (ts_array_desc_init(&d, err) != TS_OK ||
		    ts_array_new(an, &d, &pl, im->core->env.memory, &arrays[i], err) != TS_OK)
			return err->status;
		ts_array_set_owner(arrays[i], owner);
	}
	return TS_OK;
}

static void *mimport_begin(const struct ts_call *call, uint64_t content_length,
                           struct ts_reply *reply)
{
	const char *name = ts_call_query(call, "name"), *dev = ts_call_query(call, "device");
	struct mimport *im;

	if (name && (!ts_array_name_valid(name) || strlen(name) > TS_MODEL_NAME_MAX)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_MODEL_NAME",
		              "model name '%.120s' is invalid (array-name rules, at most %d characters)",
		              name, TS_MODEL_NAME_MAX);
		return NULL;
	}
	if (dev && strlen(dev) >= sizeof im->device) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
		              "device '%.60s...' is not a device of this node", dev);
		return NULL;
	}
	im = calloc(1, sizeof *im);
	if (!im) {
		ts_reply_oom(reply, "no memory for an import");
		return NULL;
	}
	im->core = call->core;
	snprintf(im->name, sizeof im->name, "%s", name ? name : "");
	snprintf(im->device, sizeof im->device, "%s", dev ? dev : "");
	ts_import_rx_init(&im->rx, &call->core->env, content_length, import_admit, im);
	return im;
}

static bool mimport_chunk(void *state, const char *data, size_t n, struct ts_reply *reply)
{
	struct mimport *im = state;
	struct ts_error err;

	ts_error_clear(&err);
	if (ts_import_rx_bytes(&im->rx, data, n, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return false;
	}
	return true;
}

static void mimport_finish(void *state, const struct ts_call *call, struct ts_reply *reply)
{
	struct mimport *im = state;
	struct ts_error err;
	json_t *o;

	(void)call;
	ts_error_clear(&err);
	if (ts_import_rx_finish(&im->rx, &err) != TS_OK ||
	    ts_catalog_put_all(im->core->env.catalog, im->rx.arrays, im->rx.st.ntensors, false,
	                       &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	im->published = true;
	ts_model_registry_set_ready(im->core->env.models, im->model.uid, true, NULL);
	im->model.ready = true;
	o = ts_render_model_spec(&im->model);
	if (o)
		json_object_set_new(o, "state", json_string("READY"));
	ts_reply_json(reply, TS_HTTP_CREATED, o);
}

static void mimport_release(void *state)
{
	struct mimport *im = state;

	if (!im)
		return;
	if (!im->published && im->model.uid)
		ts_model_registry_remove(im->core->env.models, im->model.uid);
	ts_import_rx_release(&im->rx);
	free(im);
}

const struct ts_upload_ops ts_h_models_import = {
	.begin = mimport_begin,
	.chunk = mimport_chunk,
	.finish = mimport_finish,
	.release = mimport_release,
};
