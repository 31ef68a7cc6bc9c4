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
#include "memory/space.h"
#include "storage/array.h"
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

/* What a pool of pinned segments keeps, gives back and pins again (NULL for
 * other pools); the same numbers for every space drawing from it. */
static json_t *segments_json(const struct ts_space *sp)
{
	struct ts_pool_stats ps;

	ts_space_pool_stats(sp, &ps);
	if (!ps.segmented)
		return NULL;
	return json_pack("{s:s, s:o, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f}",
	                 "name", ps.name, "numa_node",
	                 ps.numa_node >= 0 ? json_integer(ps.numa_node) : json_null(), "bound",
	                 ps.bound, "limit_bytes", (json_int_t)ps.limit, "bytes_in_use",
	                 (json_int_t)ps.bytes_in_use, "bytes_reserved",
	                 (json_int_t)ps.bytes_reserved,
	                 "segments", (json_int_t)ps.segments,
	                 "keep_bytes", (json_int_t)ps.keep_bytes,
	                 "segments_pinned", (json_int_t)ps.segments_pinned,
	                 "segments_released", (json_int_t)ps.segments_released,
	                 "pinned_bytes", (json_int_t)ps.pinned_bytes,
	                 "released_bytes", (json_int_t)ps.released_bytes,
	                 "repinned_bytes", (json_int_t)ps.repinned_bytes,
	                 "pin_seconds", (double)ps.pin_ns / 1e9,
	                 "repin_seconds", (double)ps.repin_ns / 1e9);
}

static json_t *spaces_json(const struct ts_core *core)
{
	size_t n = ts_memory_space_count(core->env.memory);
	json_t *spaces = json_array();

	for (size_t i = 0; spaces && i < n; i++) {
		const struct ts_space *sp = ts_memory_space_at(core->env.memory, i);
		const struct ts_device_props *pr = ts_device_props(ts_space_device(sp));
		json_t *o = ts_h_space_stats_json(sp), *seg;

		if (!o)
			continue;
		json_object_set_new(o, "device", json_string(pr->id));
		json_object_set_new(o, "backend", json_string(ts_backend_name(pr->backend)));
		json_object_set_new(o, "memory_kind",
		                    json_string(ts_memory_kind_name(ts_space_kind(sp))));
		json_object_set_new(o, "pool", json_string(ts_space_pool_name(sp)));
		seg = segments_json(sp);
		if (seg)
			json_object_set_new(o, "pinned_pool", seg);
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
#define KIND_NAME_MAX 24

/* Room for the totals: a key pair of kind names and a number per pair,
 * and the arrays and implicit counters. */
_Static_assert(TS_MEM_KIND_COUNT * TS_MEM_KIND_COUNT * (2 * KIND_NAME_MAX + 28) + 200 <=
               VIEW_TAIL_MAX, "VIEW_TAIL_MAX holds the transfer totals");

/* The tail is built on every request: plain appends, no printf. */
static char *put(char *p, const char *s, size_t n)
{
	memcpy(p, s, n);
	return p + n;
}

#define PUT_LIT(p, lit) put((p), (lit), sizeof(lit) - 1)

static char *put_u64(char *p, uint64_t v)
{
	char tmp[20];
	size_t n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		*p++ = tmp[--n];
	return p;
}

/* A memory kind's name, at most KIND_NAME_MAX bytes. */
static char *put_kind(char *p, int k)
{
	const char *name = ts_memory_kind_name((enum ts_memory_kind)k);
	size_t n = strlen(name);

	return put(p, name, n < KIND_NAME_MAX ? n : KIND_NAME_MAX);
}

/* "arrays": {...}, "transfers": {...}} - counters read without the cache */
static char *render_totals(const struct ts_core *core, char *p)
{
	uint64_t count = 0, bytes = 0, moved[TS_MEM_KIND_COUNT][TS_MEM_KIND_COUNT] = {{0}};

	if (core->env.catalog)
		ts_catalog_totals(core->env.catalog, &count, &bytes);
	if (core->env.stager)
		ts_stager_totals(core->env.stager, moved);
	p = PUT_LIT(p, "\"arrays\":{\"count\":");
	p = put_u64(p, count);
	p = PUT_LIT(p, ",\"bytes\":");
	p = put_u64(p, bytes);
	p = PUT_LIT(p, "},\"transfers\":{\"implicit_transfer_bytes\":");
	p = put_u64(p, core->env.stager ? ts_stager_implicit(core->env.stager) : 0);
	p = PUT_LIT(p, ",\"bytes\":{");
	for (int a = 0; a < TS_MEM_KIND_COUNT; a++) {
		for (int b = 0; b < TS_MEM_KIND_COUNT; b++) {
			if (a + b)
				*p++ = ',';
			*p++ = '"';
			p = put_kind(p, a);
			p = PUT_LIT(p, "->");
			p = put_kind(p, b);
			p = PUT_LIT(p, "\":");
			p = put_u64(p, moved[a][b]);
		}
	}
	return PUT_LIT(p, "}}}\n");
}

/* ,"host":"...","uptime_seconds":1.234,"timestamp_ms":...,<totals> */
static size_t render_tail(const struct ts_core *core, char *p, char *host, size_t host_cap)
{
	char *start = p;
	uint64_t up_ms = (ts_now_ns() - core->started_ns + 500000ull) / 1000000ull;
	unsigned frac = (unsigned)(up_ms % 1000);

	p = PUT_LIT(p, ",\"host\":\"");
	ts_json_escape(host, host_cap, core->host);
	p = put(p, host, strlen(host));
	p = PUT_LIT(p, "\",\"uptime_seconds\":");
	p = put_u64(p, up_ms / 1000);
	*p++ = '.';
	*p++ = (char)('0' + frac / 100);
	*p++ = (char)('0' + frac / 10 % 10);
	*p++ = (char)('0' + frac % 10);
	p = PUT_LIT(p, ",\"timestamp_ms\":");
	p = put_u64(p, ts_wall_ns() / 1000000ull);
	*p++ = ',';
	p = render_totals(core, p);
	return (size_t)(p - start);
}

/* {"spaces":[...],"host":"...","uptime_seconds":...,"timestamp_ms":..., "arrays", "transfers"} */
static void memory_view(const struct ts_core *core, struct ts_reply *reply)
{
	static const char head[] = "{\"spaces\":";
	uint64_t gen = ts_memory_generation(core->env.memory);
	char *body = NULL, *list, host[160];
	size_t len = 0, tail_room = VIEW_TAIL_MAX + sizeof host;

	if (!cache_get(core->memory_view, gen, tail_room + sizeof head, &body, &len)) {
		json_t *spaces = spaces_json(core);

		list = spaces ? json_dumps(spaces, JSON_COMPACT) : NULL;
		json_decref(spaces);
		if (!list) {
			ts_reply_oom(reply, "out of memory while rendering the memory view");
			return;
		}
		len = strlen(list);
		cache_put(core->memory_view, gen, list, len);
		body = malloc(len + tail_room + sizeof head);
		if (body)
			memcpy(body, list, len);
		free(list);
		if (!body) {
			ts_reply_oom(reply, "out of memory while rendering the memory view");
			return;
		}
	}
	/* the list was copied to the front: slide it behind the head */
	memmove(body + sizeof head - 1, body, len);
	memcpy(body, head, sizeof head - 1);
	len += sizeof head - 1;
	len += render_tail(core, body + len, host, sizeof host);
	ts_reply_text_owned(reply, TS_HTTP_OK, "application/json", body, len);
}

void ts_h_memory_get(const struct ts_call *call, struct ts_reply *reply)
{
	memory_view(call->core, reply);
}

/* The body is none (no bytes), or an empty object: it takes no options,
 * and one that names some (or is no object, or no JSON) is refused rather
 * than ignored. */
void ts_h_memory_reset_peak(const struct ts_call *call, struct ts_reply *reply)
{
	json_error_t jerr;
	json_t *j;

	/* a body of whitespace is no JSON, not "none" (a schemathesis finding) */
	if (call->body_len) {
		j = json_loadb(call->body, call->body_len, JSON_REJECT_DUPLICATES, &jerr);
		if (!json_is_object(j) || json_object_size(j) != 0) {
			ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
			              "resetPeak body: %s (expected {} or none)",
			              !j ? jerr.text : json_is_object(j) ? "it takes no members"
			                                                 : "not an object");
			json_decref(j);
			return;
		}
		json_decref(j);
	}
	ts_memory_reset_peaks(call->core->env.memory);
	memory_view(call->core, reply);
}
