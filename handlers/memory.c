/*
 * memory.c - the dashboard feed: GET /v1/memory lists every (device, memory
 * kind) space with its live stats; POST /v1/memory:resetPeak resets the peak
 * counters. Stats are read from atomics: no lock is taken here.
 */
#include "handlers/handlers.h"

#include "common/units.h"
#include "storage/space.h"

json_t *ts_h_space_stats_json(const struct ts_space *sp)
{
	struct ts_space_stats s;

	ts_space_stats(sp, &s);
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
	                 "bytes_in_use", (json_int_t)s.bytes_in_use,
	                 "peak_bytes_in_use", (json_int_t)s.peak_bytes_in_use,
	                 "num_allocs", (json_int_t)s.num_allocs,
	                 "largest_alloc_size", (json_int_t)s.largest_alloc_size,
	                 "bytes_limit", (json_int_t)s.bytes_limit,
	                 "bytes_reserved", (json_int_t)s.bytes_reserved,
	                 "peak_bytes_reserved", (json_int_t)s.peak_bytes_reserved,
	                 "largest_free_block_bytes", (json_int_t)s.largest_free_block_bytes,
	                 "bytes_free", (json_int_t)s.bytes_free,
	                 "live_allocations", (json_int_t)s.live_allocs);
}

static json_t *memory_view(const struct ts_core *core)
{
	size_t n = ts_memory_space_count(core->memory);
	json_t *spaces = json_array();

	for (size_t i = 0; spaces && i < n; i++) {
		const struct ts_space *sp = ts_memory_space_at(core->memory, i);
		const struct ts_device_props *pr = ts_device_props(ts_space_device(sp));
		json_t *o = ts_h_space_stats_json(sp);

		if (!o)
			continue;
		json_object_set_new(o, "device", json_string(pr->id));
		json_object_set_new(o, "backend", json_string(ts_backend_name(pr->backend)));
		json_object_set_new(o, "memory_kind",
		                    json_string(ts_memory_kind_name(ts_space_kind(sp))));
		json_array_append_new(spaces, o);
	}
	return json_pack("{s:o*, s:s, s:f, s:I}", "spaces", spaces, "host", core->host,
	                 "uptime_seconds", (double)(ts_now_ns() - core->started_ns) / 1e9,
	                 "timestamp_ms", (json_int_t)(ts_wall_ns() / 1000000ull));
}

void ts_h_memory_get(const struct ts_call *call, struct ts_reply *reply)
{
	ts_reply_json(reply, TS_HTTP_OK, memory_view(call->core));
}

void ts_h_memory_reset_peak(const struct ts_call *call, struct ts_reply *reply)
{
	ts_memory_reset_peaks(call->core->memory);
	ts_reply_json(reply, TS_HTTP_OK, memory_view(call->core));
}
