/*
 * checkpoint.c - exact checkpoints of a model: GET /v1/models/{model}:export
 * and POST /v1/models:import.
 *
 * The format and its reader are jobs/checkpoint.h's (the state dir,
 * jobs/state.h, writes and reads the same files): a safetensors file of the
 * model's parameters and optimizer state, with its spec and step count in
 * "__metadata__". Importing one creates the model with exactly those bytes
 * and that t, so training continues as if it had never stopped: the same
 * losses bit for bit.
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
#include "jobs/checkpoint.h"
#include "storage/array_io.h"
#include "train/model.h"

#define NROLES TS_MODEL_NROLES

/* ---- export ----------------------------------------------------------------------- */

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
	n = ts_checkpoint_roles(&m, roles);
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
	meta = ts_checkpoint_metadata(&m);
	parts = calloc(NROLES, sizeof *parts);
	if (!meta || !parts) {
		ts_error_oom(&err, "no memory for the export");
		goto out_fail;
	}
	for (size_t i = 0; i < n; i++) {
		const struct ts_array_desc *d = ts_array_desc(arrs[i]);

		ts_checkpoint_tensor_name(&m, roles[i], tnames[i], sizeof tnames[i]);
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
	struct ts_checkpoint_rx cp;
};

static void *mimport_begin(const struct ts_call *call, uint64_t content_length,
                           struct ts_reply *reply)
{
	const char *name = ts_call_query(call, "name"), *dev = ts_call_query(call, "device");
	struct mimport *im;
	struct ts_error err;
	int persist;

	if (name && (!ts_array_name_valid(name) || strlen(name) > TS_MODEL_NAME_MAX)) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_MODEL_NAME",
		              "model name '%.120s' is invalid (array-name rules, at most %d characters)",
		              name, TS_MODEL_NAME_MAX);
		return NULL;
	}
	if (dev && strlen(dev) >= sizeof im->cp.device) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
		              "device '%.60s...' is not a device of this node", dev);
		return NULL;
	}
	ts_error_clear(&err);
	if (ts_h_persist_query(call, &persist, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return NULL;
	}
	im = calloc(1, sizeof *im);
	if (!im) {
		ts_reply_oom(reply, "no memory for an import");
		return NULL;
	}
	if (ts_checkpoint_rx_init(&im->cp, &call->core->env, call->core->default_device, name, dev,
	                          persist > 0, content_length, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		free(im);
		return NULL;
	}
	return im;
}

static bool mimport_chunk(void *state, const char *data, size_t n, struct ts_reply *reply)
{
	struct mimport *im = state;
	struct ts_error err;

	ts_error_clear(&err);
	if (ts_checkpoint_rx_bytes(&im->cp, data, n, &err) != TS_OK) {
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
	if (ts_checkpoint_rx_publish(&im->cp, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	o = ts_render_model_spec(&im->cp.model);
	if (o) {
		json_object_set_new(o, "state", json_string("READY"));
		json_object_set_new(o, "persist", json_boolean(im->cp.model.persist));
	}
	ts_reply_json(reply, TS_HTTP_CREATED, o);
}

static void mimport_release(void *state)
{
	struct mimport *im = state;

	if (!im)
		return;
	ts_checkpoint_rx_release(&im->cp);
	free(im);
}

const struct ts_upload_ops ts_h_models_import = {
	.begin = mimport_begin,
	.chunk = mimport_chunk,
	.finish = mimport_finish,
	.release = mimport_release,
};
