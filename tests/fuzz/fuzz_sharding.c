/*
 * fuzz_sharding.c - libFuzzer target for sharding JSON: the input is parsed
 * as any JSON value and handed to ts_h_sharding_parse (and, when it is a
 * string, to ts_h_sharding_resolve) against a fake core of four simulated
 * devices and cpu:0 with one saved sharding. A refusal must carry a known
 * code, a reason and a message. A sharding that parses must validate, render
 * back to JSON that parses to an equal, identical sharding, and give boxes
 * for a small shape derived from the input that stay inside the array,
 * cover it once with replica 0 and number replicas in mesh order; its text
 * rendering must be terminated and report its length.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/sharding_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The fake core, built on the first input and kept for the process. */
static const struct ts_core *fake_core(void)
{
	static struct ts_core core;
	static bool ready;
	struct ts_device_config dc = {.sim_devices = 4, .sim_device_memory = 1ull << 20,
	                              .cuda = false, .host = "fuzz"};
	struct ts_sharding saved;
	struct ts_error err;

	if (ready)
		return &core;
	ts_error_clear(&err);
	if (ts_device_set_new(&dc, &core.env.devices, &err) != TS_OK)
		abort();
	core.env.shardings = ts_sharding_registry_new();
	if (!core.env.shardings)
		abort();
	core.default_device = ts_device_set_find(core.env.devices, "sim:0");
	core.default_memory_kind = TS_MEM_DEVICE;
	ts_sharding_single(&saved, ts_device_set_find(core.env.devices, "sim:1"), TS_MEM_PINNED_HOST);
	if (ts_sharding_registry_put(core.env.shardings, "saved", &saved, &err) != TS_OK)
		abort();
	ready = true;
	return &core;
}

static void check_failure(ts_status st, const struct ts_error *err)
{
	if (st != err->status || !err->message[0] || !err->reason[0])
		abort();
	if (st != TS_INVALID_ARGUMENT && st != TS_NOT_FOUND)
		abort();
}

static uint64_t fnv1a(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

/* Blocks along dimension d under s. */
static uint64_t blocks(const struct ts_sharding *s, int d)
{
	uint64_t n = 1;

	if (s->type == TS_SHARDING_NAMED && d < s->spec_rank)
		for (int i = 0; i < s->spec[d].naxes; i++)
			n *= (uint64_t)s->mesh.shape[s->spec[d].axes[i]];
	return n;
}

static void check_boxes(const struct ts_sharding *s, uint64_t h)
{
	static struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	uint64_t shape[TS_MAX_RANK], total = 1, covered = 0;
	int rank = (s->type == TS_SHARDING_NAMED ? s->spec_rank : 0) + (int)(h % 3), n = -1;
	bool overflow = false;
	struct ts_error err;
	static char text[8192];
	size_t need;
	ts_status st;

	h /= 3;
	if (rank > TS_MAX_RANK)
		rank = TS_MAX_RANK;
	for (int d = 0; d < rank; d++, h = h * 6364136223846793005ull + 1442695040888963407ull) {
		/* mostly divisible sizes (0 included), sometimes any small one */
		shape[d] = (h >> 33) % 4 ? blocks(s, d) * ((h >> 40) % 3) : (h >> 45) % 7;
		overflow = overflow || (shape[d] && __builtin_mul_overflow(total, shape[d], &total));
	}
	ts_error_clear(&err);
	st = ts_sharding_boxes(s, rank, shape, b, &n, &err);
	need = ts_sharding_render_text(s, rank, shape, text, sizeof text);
	if (strlen(text) != (need < sizeof text ? need : sizeof text - 1))
		abort();
	if (st != TS_OK) {
		check_failure(st, &err);
		return;
	}
	for (int d = 0; d < rank; d++)
		if (shape[d] == 0)
			total = 0;
	if (n != (s->type == TS_SHARDING_NAMED ? s->mesh.ndevices : 1))
		abort();
	for (int i = 0; i < n; i++) {
		uint64_t vol = 1;
		int seen = 0;

		for (int d = 0; d < rank; d++) {
			if (b[i].start[d] > shape[d] || b[i].count[d] > shape[d] - b[i].start[d])
				abort();
			vol *= b[i].count[d];
		}
		for (int j = 0; j < i; j++)
			if (memcmp(b[j].start, b[i].start, sizeof b[i].start) == 0 &&
			    memcmp(b[j].count, b[i].count, sizeof b[i].count) == 0)
				seen++;
		if (total && b[i].replica != seen)
			abort();
		if (b[i].replica == 0)
			covered += vol;
	}
	if (!overflow && covered != (rank == 0 ? 1 : total))
		abort();
}

static void check_parsed(const struct ts_core *core, const struct ts_sharding *s, uint64_t h)
{
	struct ts_sharding again;
	struct ts_error err;
	json_t *j;

	if (ts_sharding_validate(s, NULL) != TS_OK)
		abort();
	j = ts_render_sharding(s);
	if (!j)
		return;                         /* out of memory: nothing to compare */
	ts_error_clear(&err);
	memset(&again, 0, sizeof again);
	if (ts_h_sharding_parse(core, j, &again, &err) != TS_OK ||
	    !ts_sharding_equal(s, &again) || memcmp(s, &again, sizeof again) != 0)
		abort();
	json_decref(j);
	check_boxes(s, h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct ts_core *core = fake_core();
	struct ts_sharding s;
	struct ts_error err;
	json_error_t jerr;
	json_t *j;
	ts_status st;

	j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	if (!j)
		return 0;
	ts_error_clear(&err);
	st = ts_h_sharding_parse(core, j, &s, &err);
	if (st != TS_OK)
		check_failure(st, &err);
	else
		check_parsed(core, &s, fnv1a(data, size));
	ts_error_clear(&err);
	st = ts_h_sharding_resolve(core, j, &s, &err);
	if (st != TS_OK)
		check_failure(st, &err);
	else
		check_parsed(core, &s, fnv1a(data, size) >> 7);
	json_decref(j);
	return 0;
}
