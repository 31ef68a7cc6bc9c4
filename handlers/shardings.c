/*
 * shardings.c - saved shardings: POST /v1/shardings (name one), GET
 * /v1/shardings and /v1/shardings/{sharding}, and POST
 * /v1/shardings/{sharding}:withMemoryKind (JAX's with_memory_kind, saved
 * under a new name). A saved sharding never changes once saved; names
 * follow the array name rule.
 */
#include "handlers/handlers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/sharding_json.h"
#include "storage/array.h"
#include "storage/sharding.h"

/* {"name", "sharding"}: new reference, NULL when out of memory. */
static json_t *saved_json(const char *name, const struct ts_sharding *s)
{
	json_t *sj = ts_render_sharding(s);

	return sj ? json_pack("{s:s, s:o}", "name", name, "sharding", sj) : NULL;
}

/* {"devices": [ids in the mesh's order], "why"}: how "devices": "auto" was
 * laid out (new reference; NULL when out of memory). */
static json_t *layout_json(const struct ts_sharding *s, const char *why)
{
	json_t *ids = json_array();

	for (int i = 0; ids && i < s->mesh.ndevices; i++)
		json_array_append_new(ids, json_string(ts_device_props(s->mesh.devices[i])->id));
	return ids ? json_pack("{s:o, s:s}", "devices", ids, "why", why) : NULL;
}

/* why: the reason for an "auto" mesh's order, "" for any other sharding. */
static void reply_saved(struct ts_reply *reply, const char *name, const struct ts_sharding *s,
                        bool created, const char *why)
{
	json_t *body = saved_json(name, s);
	char loc[200];

	if (body && why && why[0])
		json_object_set_new(body, "layout", layout_json(s, why));
	ts_reply_json(reply, created ? TS_HTTP_CREATED : TS_HTTP_OK, body);
	if (created && reply->kind == TS_REPLY_JSON) {
		snprintf(loc, sizeof loc, "/v1/shardings/%s", name);
		ts_reply_header(reply, "Location", loc);
	}
}

/* The body parsed as JSON (new reference), or NULL with err set. */
static json_t *load_body(const struct ts_call *call, const char *what, struct ts_error *err)
{
	json_error_t jerr;
	json_t *body = json_loadb(call->body ? call->body : "", call->body_len,
	                          JSON_REJECT_DUPLICATES, &jerr);

	if (!body)
		ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY", "%s body: %s", what,
		             jerr.text);
	return body;
}

static bool name_ok(const char *field, const char *name, struct ts_error *err)
{
	if (ts_array_name_valid(name))
		return true;
	ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_SHARDING_NAME",
	             "%s '%.128s' is invalid: it must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
	             field, name ? name : "");
	return false;
}

/* The saved sharding named by the path (copied into *out), or false after
 * filling err (bad name 400, absent 404). */
static bool from_path(const struct ts_call *call, const char **name, struct ts_sharding *out,
                      struct ts_error *err)
{
	*name = ts_call_param(call, "sharding");
	if (!name_ok("sharding name", *name, err))
		return false;
	if (!ts_sharding_registry_get(call->core->env.shardings, *name, out)) {
		ts_error_set(err, TS_NOT_FOUND, "SHARDING_NOT_FOUND", "sharding '%s' not found", *name);
		return false;
	}
	return true;
}

/* ---- POST /v1/shardings ------------------------------------------------------------- */

void ts_h_shardings_create(const struct ts_call *call, struct ts_reply *reply)
{
	json_t *body, *sj = NULL;
	const char *name = NULL;
	struct ts_sharding s;
	struct ts_error err;
	json_error_t jerr;
	char why[1024];

	ts_error_clear(&err);
	why[0] = 0;
	body = load_body(call, "shardings", &err);
	if (body && json_unpack_ex(body, &jerr, JSON_STRICT, "{s:s, s:o}", "name", &name,
	                           "sharding", &sj) != 0)
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "shardings body: %s (expected {\"name\": \"...\", \"sharding\": {...}})",
		             jerr.text);
	if (err.status == TS_OK && name_ok("name", name, &err) &&
	    ts_h_sharding_resolve_layout(call->core, sj, &s, why, sizeof why, &err) == TS_OK &&
	    ts_sharding_registry_put(call->core->env.shardings, name, &s, &err) == TS_OK)
		reply_saved(reply, name, &s, true, why);
	else
		ts_reply_error(reply, &err);
	json_decref(body);
}

/* ---- GET /v1/shardings --------------------------------------------------------------- */

struct saved {
	char name[TS_ARRAY_NAME_MAX + 1];
	struct ts_sharding sharding;
};

struct saved_list {
	struct saved *items;
	size_t n, cap;
	bool oom;
};

/* Copies each entry out, so that no JSON is built under the registry lock. */
static void collect(const char *name, const struct ts_sharding *s, void *arg)
{
	struct saved_list *l = arg;

	if (l->oom)
		return;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		struct saved *items = realloc(l->items, cap * sizeof *items);

		if (!items) {
			l->oom = true;
			return;
		}
		l->items = items;
		l->cap = cap;
	}
	snprintf(l->items[l->n].name, sizeof l->items[0].name, "%s", name);
	l->items[l->n++].sharding = *s;
}

void ts_h_shardings_list(const struct ts_call *call, struct ts_reply *reply)
{
	struct saved_list l = {0};
	json_t *list = NULL;

	ts_sharding_registry_each(call->core->env.shardings, collect, &l);
	if (!l.oom)
		list = json_array();
	for (size_t i = 0; list && i < l.n; i++)
		if (json_array_append_new(list, saved_json(l.items[i].name, &l.items[i].sharding))) {
			json_decref(list);
			list = NULL;
		}
	free(l.items);
	ts_reply_json(reply, TS_HTTP_OK, list ? json_pack("{s:o}", "shardings", list) : NULL);
}

/* ---- GET /v1/shardings/{sharding} ------------------------------------------------------ */

void ts_h_shardings_get(const struct ts_call *call, struct ts_reply *reply)
{
	const char *name;
	struct ts_sharding s;
	struct ts_error err;

	ts_error_clear(&err);
	if (from_path(call, &name, &s, &err))
		reply_saved(reply, name, &s, false, NULL);
	else
		ts_reply_error(reply, &err);
}

/* ---- POST /v1/shardings/{sharding}:withMemoryKind -------------------------------------- */

void ts_h_shardings_with_memory_kind(const struct ts_call *call, struct ts_reply *reply)
{
	const char *src_name, *name = NULL, *kind_s = NULL;
	enum ts_memory_kind kind = TS_MEM_DEVICE;
	struct ts_sharding src, s;
	struct ts_error err;
	json_error_t jerr;
	json_t *body = NULL;

	ts_error_clear(&err);
	if (!from_path(call, &src_name, &src, &err))
		goto out_fail;
	body = load_body(call, "withMemoryKind", &err);
	if (!body)
		goto out_fail;
	if (json_unpack_ex(body, &jerr, JSON_STRICT, "{s:s, s:s}", "memory_kind", &kind_s,
	                   "name", &name) != 0) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		             "withMemoryKind body: %s (expected {\"memory_kind\": \"pinned_host\", "
		             "\"name\": \"...\"})", jerr.text);
		goto out_fail;
	}
	if (!ts_memory_kind_parse(kind_s, &kind)) {
		ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
		             "memory_kind '%.64s' is not one of device, pinned_host, unpinned_host",
		             kind_s);
		goto out_fail;
	}
	if (!name_ok("name", name, &err))
		goto out_fail;
	ts_sharding_with_memory_kind(&src, kind, &s);
	if (ts_sharding_registry_put(call->core->env.shardings, name, &s, &err) != TS_OK)
		goto out_fail;
	reply_saved(reply, name, &s, true, NULL);
	json_decref(body);
	return;

out_fail:
	ts_reply_error(reply, &err);
	json_decref(body);
}
