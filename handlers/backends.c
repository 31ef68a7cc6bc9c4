/*
 * backends.c - GET /v1/backends: every backend this binary knows, whether it
 * was compiled in and found devices, and which one is the default (the first
 * of cuda, sim, cpu with devices).
 */
#include "handlers/handlers.h"

void ts_h_backends_list(const struct ts_call *call, struct ts_reply *reply)
{
	const struct ts_core *core = call->core;
	enum ts_backend_kind def = ts_device_set_default_backend(core->env.devices);
	json_t *list = json_array(), *root;

	for (int k = 0; list && k < TS_BACKEND_COUNT; k++) {
		struct ts_backend_info bi;

		ts_device_set_backend(core->env.devices, (enum ts_backend_kind)k, &bi);
		json_array_append_new(list, json_pack("{s:s, s:b, s:b, s:i, s:s, s:b}",
		                                      "name", ts_backend_name(bi.kind),
		                                      "compiled", bi.compiled,
		                                      "available", bi.available,
		                                      "device_count", bi.device_count,
		                                      "detail", bi.detail,
		                                      "default", bi.kind == def));
	}
	root = json_pack("{s:o*, s:s}", "backends", list, "default_backend",
	                 ts_backend_name(def));
	ts_reply_json(reply, TS_HTTP_OK, root);
}
