/*
 * memory.c - the dashboard feed: GET /v1/memory lists every (device, memory
 * kind) space with its live stats; POST /v1/memory:resetPeak resets the peak
 * counters. Stats are read from atomics; the rendered list of spaces is
 * kept and reused until the memory table's generation moves, so a dashboard
 * polling many times a second costs a copy, not a render. The cache lock is
 * held only to swap or copy a string, never while rendering.
 */
#include "handlers/handlers.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/units.h"
#include "storage/array.h"
#include "storage/space.h"
#include "storage/stage.h"

struct ts_view_cache {
	pthread_mutex_t mu;
	bool valid;               /* guarded by: mu */
	uint64_t generation;      /* guarded by: mu */
	char *text;               /* guarded by: mu; owned */
	size_t len;               /* guarded by: mu */
};

struct ts_view_cache *ts_view_cache_new(void)
{
	struct ts_view_cache *c = calloc(1, sizeof *c);

	if (c)
		pthread_mutex_init(&c->mu, NULL);
	return c;
}

void ts_view_cache_free(struct ts_view_cache *c)
{
	if (!c)
		return;
	free(c->text);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

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

static json_t *spaces_json(const struct ts_core *core)
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
	return spaces;
}

/* Copies the cached spaces list rendered at generation gen into *out
 * (malloc'd, with room for extra more bytes); false on a miss. */
static bool cache_get(struct ts_view_cache *c, uint64_t gen, size_t extra,
                      char **out, size_t *len)
{
	bool hit = false;

	pthread_mutex_lock(&c->mu);
	if (c->valid && c->generation == gen) {
		*out = malloc(c->len + extra);
		if (*out) {
			memcpy(*out, c->text, c->len);
			*len = c->len;
			hit = true;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return hit;
}

/* Stores text (copied) as the list rendered at generation gen. */
static void cache_put(struct ts_view_cache *c, uint64_t gen, const char *text, size_t len)
{
	char *copy = malloc(len);
	char *old;

	if (!copy)
		return;
	memcpy(copy, text, len);
	pthread_mutex_lock(&c->mu);
	old = c->text;
	c->text = copy;
	c->len = len;
	c->generation = gen;
	c->valid = true;
	pthread_mutex_unlock(&c->mu);
	free(old);
}

#define VIEW_TAIL_MAX 1024

/* "arrays": {...}, "transfers": {...}} - counters read without the cache */
static int render_totals(const struct ts_core *core, char *p, size_t cap)
{
	uint64_t count = 0, bytes = 0, moved[TS_MEM_KIND_COUNT][TS_MEM_KIND_COUNT] = {{0}};
	size_t o = 0;

	if (core->catalog)
		ts_catalog_totals(core->catalog, &count, &bytes);
	if (core->stager)
		ts_stager_totals(core->stager, moved);
	o += (size_t)snprintf(p + o, cap - o, "\"arrays\":{\"count\":%llu,\"bytes\":%llu},"
	                      "\"transfers\":{\"implicit_transfer_bytes\":%llu,\"bytes\":{",
	                      (unsigned long long)count, (unsigned long long)bytes,
	                      (unsigned long long)(core->stager ? ts_stager_implicit(core->stager) : 0));
	for (int a = 0; a < TS_MEM_KIND_COUNT; a++)
		for (int b = 0; b < TS_MEM_KIND_COUNT; b++)
			o += (size_t)snprintf(p + o, cap - o, "%s\"%s->%s\":%llu", a + b ? "," : "",
			                      ts_memory_kind_name((enum ts_memory_kind)a),
			                      ts_memory_kind_name((enum ts_memory_kind)b),
			                      (unsigned long long)moved[a][b]);
	o += (size_t)snprintf(p + o, cap - o, "}}}\n");
	return (int)o;
}

/* {"spaces":[...],"host":"...","uptime_seconds":...,"timestamp_ms":..., "arrays", "transfers"} */
static void memory_view(const struct ts_core *core, struct ts_reply *reply)
{
	static const char head[] = "{\"spaces\":";
	uint64_t gen = ts_memory_generation(core->memory);
	char *body = NULL, *list, host[160];
	size_t len = 0, tail_room = VIEW_TAIL_MAX + sizeof host;
	int n;

	if (!cache_get(core->memory_view, gen, tail_room + sizeof head, &body, &len)) {
		json_t *spaces = spaces_json(core);

		list = spaces ? json_dumps(spaces, JSON_COMPACT) : NULL;
		json_decref(spaces);
		if (!list) {
			ts_reply_fail(reply, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
			              "out of memory while rendering the memory view");
			return;
		}
		len = strlen(list);
		cache_put(core->memory_view, gen, list, len);
		body = malloc(len + tail_room + sizeof head);
		if (body)
			memcpy(body, list, len);
		free(list);
		if (!body) {
			ts_reply_fail(reply, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY",
			              "out of memory while rendering the memory view");
			return;
		}
	}
	/* the list was copied to the front: slide it behind the head */
	memmove(body + sizeof head - 1, body, len);
	memcpy(body, head, sizeof head - 1);
	len += sizeof head - 1;
	n = snprintf(body + len, tail_room, ",\"host\":\"%s\",\"uptime_seconds\":%.3f,"
	             "\"timestamp_ms\":%llu,",
	             ts_json_escape(host, sizeof host, core->host),
	             (double)(ts_now_ns() - core->started_ns) / 1e9,
	             (unsigned long long)(ts_wall_ns() / 1000000ull));
	n += render_totals(core, body + len + n, tail_room - (size_t)n);
	ts_reply_text_owned(reply, TS_HTTP_OK, "application/json", body, len + (size_t)n);
}

void ts_h_memory_get(const struct ts_call *call, struct ts_reply *reply)
{
	memory_view(call->core, reply);
}

void ts_h_memory_reset_peak(const struct ts_call *call, struct ts_reply *reply)
{
	ts_memory_reset_peaks(call->core->memory);
	memory_view(call->core, reply);
}
