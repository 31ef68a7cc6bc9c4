/*
 * faults.c - /debug/faults, the test-only control of injected failures
 * (common/fault.h). Exists only in a fault-injection build (TS_FAULT_BUILD):
 * a production daemon has neither the route nor anything it could arm.
 *
 *   GET  /debug/faults  the points of each kind reached since the last arm,
 *                       the armed kind and point, the failures injected
 *   POST /debug/faults  {"kind": "alloc_heap", "at": 3}: resets the counters
 *                       and fails the 3rd heap point from now (at 0: count)
 */
#include "handlers/handlers.h"

#ifdef TS_FAULT_BUILD

#include "common/fault.h"

static json_t *faults_json(void)
{
	json_t *counts = json_object();
	enum ts_fault_kind kind;
	uint64_t at;

	for (int k = 0; counts && k < TS_FAULT_KIND_COUNT; k++)
		json_object_set_new(counts, ts_fault_kind_name((enum ts_fault_kind)k),
		                    json_integer((json_int_t)ts_fault_count((enum ts_fault_kind)k)));
	ts_fault_armed(&kind, &at);
	return json_pack("{s:o*, s:s, s:I, s:I}", "counts", counts,
	                 "kind", ts_fault_kind_name(kind), "at", (json_int_t)at,
	                 "fired", (json_int_t)ts_fault_fired());
}

void ts_h_debug_faults_get(const struct ts_call *call, struct ts_reply *reply)
{
	(void)call;
	ts_reply_json(reply, TS_HTTP_OK, faults_json());
}

void ts_h_debug_faults_arm(const struct ts_call *call, struct ts_reply *reply)
{
	json_error_t jerr;
	json_t *body = json_loadb(call->body ? call->body : "", call->body_len,
	                          JSON_REJECT_DUPLICATES, &jerr);
	const char *name = NULL;
	json_int_t at = 0;
	enum ts_fault_kind kind;

	if (!body || json_unpack_ex(body, &jerr, JSON_STRICT, "{s:s, s:I}", "kind", &name,
	                            "at", &at) != 0) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		              "bad fault request: %s", jerr.text);
		goto out;
	}
	if (!ts_fault_kind_parse(name, &kind) || at < 0) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_FAULT",
		              "unknown fault kind or point; kinds are alloc_device, alloc_pinned, "
		              "alloc_pageable, alloc_heap and copy, points count from 1");
		goto out;
	}
	ts_fault_arm(kind, (uint64_t)at);
	ts_reply_json(reply, TS_HTTP_OK, faults_json());
out:
	json_decref(body);
}

#endif
