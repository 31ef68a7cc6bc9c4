/*
 * test_sharding_json.c - Check suite "sharding_json": sharding JSON parsed
 * against a core of four simulated devices and rendered back: both forms,
 * defaults, spec entries of every shape, round trips that come back equal
 * and byte-identical, every class of refusal with the field it names, and
 * saved shardings looked up by name.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "handlers/sharding_json.h"
#include "tests/unit/unit.h"

static struct ts_device_set *set;
static struct ts_sharding_registry *reg;
static struct ts_core core;

static void setup(void)
{
	struct ts_device_config dc = {.sim_devices = 4, .sim_device_memory = 1ull << 20,
	                              .cuda = false, .host = "t"};
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_device_set_new(&dc, &set, &err) == TS_OK, "%s", err.message);
	reg = ts_sharding_registry_new();
	ck_assert_ptr_nonnull(reg);
	memset(&core, 0, sizeof core);
	core.env.devices = set;
	core.env.shardings = reg;
	core.default_device = ts_device_set_find(set, "sim:0");
	core.default_memory_kind = TS_MEM_PINNED_HOST;
}

static void teardown(void)
{
	ts_sharding_registry_free(reg);
	ts_device_set_free(set);
}

static json_t *load(const char *text)
{
	json_error_t e;
	json_t *j = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);

	ck_assert_msg(j, "bad test JSON %s: %s", text, e.text);
	return j;
}

static void parse_ok(const char *text, struct ts_sharding *s)
{
	json_t *j = load(text);
	struct ts_error err;

	ts_error_clear(&err);
	ck_assert_msg(ts_h_sharding_parse(&core, j, s, &err) == TS_OK, "%s: %s", text, err.message);
	json_decref(j);
}

/* Renders s and checks that it is exactly the JSON of expected. */
static void renders_as(const struct ts_sharding *s, const char *expected)
{
	json_t *got = ts_render_sharding(s), *want = load(expected);
	char *g = json_dumps(got, JSON_SORT_KEYS | JSON_COMPACT);

	ck_assert_msg(json_equal(got, want), "rendered %s, expected %s", g, expected);
	free(g);
	json_decref(got);
	json_decref(want);
}

/* parse -> render -> parse gives an equal sharding and the same JSON. */
static void round_trip(const char *text)
{
	struct ts_sharding a, b;
	json_t *ja, *jb;
	struct ts_error err;

	parse_ok(text, &a);
	ja = ts_render_sharding(&a);
	ck_assert_ptr_nonnull(ja);
	ts_error_clear(&err);
	ck_assert_msg(ts_h_sharding_parse(&core, ja, &b, &err) == TS_OK, "%s", err.message);
	ck_assert(ts_sharding_equal(&a, &b));
	ck_assert_int_eq(memcmp(&a, &b, sizeof a), 0);
	jb = ts_render_sharding(&b);
	ck_assert(json_equal(ja, jb));
	json_decref(ja);
	json_decref(jb);
}

START_TEST(test_single_device_forms)
{
	struct ts_sharding s;

	parse_ok("{\"device\": \"sim:1\", \"memory_kind\": \"device\"}", &s);
	ck_assert_int_eq(s.type, TS_SHARDING_SINGLE);
	ck_assert_ptr_eq(s.device, ts_device_set_find(set, "sim:1"));
	ck_assert_int_eq(s.memory_kind, TS_MEM_DEVICE);
	renders_as(&s, "{\"device\": \"sim:1\", \"memory_kind\": \"device\"}");

	/* memory_kind left out or null: the server default */
	parse_ok("{\"device\": \"cpu:0\"}", &s);
	ck_assert_int_eq(s.memory_kind, TS_MEM_PINNED_HOST);
	renders_as(&s, "{\"device\": \"cpu:0\", \"memory_kind\": \"pinned_host\"}");
	parse_ok("{\"device\": \"sim:3\", \"memory_kind\": null}", &s);
	ck_assert_int_eq(s.memory_kind, TS_MEM_PINNED_HOST);
	parse_ok("{\"device\": \"sim:3\", \"memory_kind\": \"unpinned_host\"}", &s);
	ck_assert_int_eq(s.memory_kind, TS_MEM_UNPINNED_HOST);
}
END_TEST

START_TEST(test_named_forms)
{
	struct ts_sharding s;

	parse_ok("{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"], "
	         "\"shape\": [2]}, \"spec\": [\"x\", null], \"memory_kind\": \"device\"}", &s);
	ck_assert_int_eq(s.type, TS_SHARDING_NAMED);
	ck_assert_int_eq(s.mesh.ndevices, 2);
	ck_assert_int_eq(s.mesh.naxes, 1);
	ck_assert_int_eq(s.mesh.shape[0], 2);
	ck_assert_str_eq(s.mesh.axis_names[0], "x");
	ck_assert_int_eq(s.spec_rank, 2);
	ck_assert_int_eq(s.spec[0].naxes, 1);
	ck_assert_int_eq(s.spec[0].axes[0], 0);
	ck_assert_int_eq(s.spec[1].naxes, 0);

	/* shape left out on a one-axis mesh; default memory kind */
	parse_ok("{\"mesh\": {\"devices\": [\"sim:2\",\"sim:0\",\"sim:1\"], "
	         "\"axis_names\": [\"d\"]}, \"spec\": [[\"d\"]]}", &s);
	ck_assert_int_eq(s.mesh.shape[0], 3);
	ck_assert_int_eq(s.memory_kind, TS_MEM_PINNED_HOST);
	ck_assert_ptr_eq(s.mesh.devices[0], ts_device_set_find(set, "sim:2"));
	renders_as(&s, "{\"mesh\": {\"devices\": [\"sim:2\",\"sim:0\",\"sim:1\"], "
	               "\"axis_names\": [\"d\"], \"shape\": [3]}, \"spec\": [\"d\"], "
	               "\"memory_kind\": \"pinned_host\"}");

	/* lists of axes, in order; an empty list is None */
	parse_ok("{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\",\"sim:3\"], "
	         "\"axis_names\": [\"x\",\"y\"], \"shape\": [2,2]}, "
	         "\"spec\": [[\"y\",\"x\"], [], null], \"memory_kind\": \"device\"}", &s);
	ck_assert_int_eq(s.spec_rank, 3);
	ck_assert_int_eq(s.spec[0].naxes, 2);
	ck_assert_int_eq(s.spec[0].axes[0], 1);
	ck_assert_int_eq(s.spec[0].axes[1], 0);
	ck_assert_int_eq(s.spec[1].naxes, 0);
	renders_as(&s, "{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\",\"sim:3\"], "
	               "\"axis_names\": [\"x\",\"y\"], \"shape\": [2,2]}, "
	               "\"spec\": [[\"y\",\"x\"], null, null], \"memory_kind\": \"device\"}");

	/* fully replicated */
	parse_ok("{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
	         "\"spec\": []}", &s);
	ck_assert_int_eq(s.spec_rank, 0);
}
END_TEST

START_TEST(test_round_trips)
{
	static const char *const cases[] = {
		"{\"device\": \"sim:2\", \"memory_kind\": \"pinned_host\"}",
		"{\"device\": \"cpu:0\"}",
		"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
		"\"spec\": [\"x\", null]}",
		"{\"mesh\": {\"devices\": [\"sim:3\",\"sim:2\",\"sim:1\",\"sim:0\"], "
		"\"axis_names\": [\"x\",\"y\"], \"shape\": [2,2]}, \"spec\": [\"y\", \"x\"], "
		"\"memory_kind\": \"unpinned_host\"}",
		"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\",\"sim:3\"], "
		"\"axis_names\": [\"a\",\"b\",\"c\"], \"shape\": [1,2,2]}, "
		"\"spec\": [null, [\"c\",\"a\",\"b\"]]}",
		"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\",\"sim:3\"], "
		"\"axis_names\": [\"x\",\"y\"], \"shape\": [4,1]}, \"spec\": []}",
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		round_trip(cases[i]);
}
END_TEST

START_TEST(test_parse_then_boxes)
{
	struct ts_shard_box b[TS_MESH_MAX_DEVICES];
	struct ts_sharding s, single;
	struct ts_error err;
	uint64_t sh[] = {8, 6};
	int n;

	parse_ok("{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\",\"sim:3\"], "
	         "\"axis_names\": [\"x\",\"y\"], \"shape\": [2,2]}, \"spec\": [\"x\"]}", &s);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_boxes(&s, 2, sh, b, &n, &err), TS_OK);
	ck_assert_int_eq(n, 4);
	ck_assert_uint_eq(b[3].start[0], 4);
	ck_assert_int_eq(b[3].replica, 1);

	/* a one-device mesh equals the single-device form */
	parse_ok("{\"mesh\": {\"devices\": [\"sim:1\"], \"axis_names\": [\"x\"]}, "
	         "\"spec\": [\"x\"], \"memory_kind\": \"device\"}", &s);
	parse_ok("{\"device\": \"sim:1\", \"memory_kind\": \"device\"}", &single);
	ck_assert(ts_sharding_equal(&s, &single));
}
END_TEST

/* ---- refusals ---------------------------------------------------------------------------- */

struct refusal {
	const char *json;
	ts_status status;
	const char *reason;
	const char *message;     /* exact, or a prefix when it ends with '*' */
};

static const struct refusal refusals[] = {
	/* the object itself */
	{"[]", TS_INVALID_ARGUMENT, "BAD_SHARDING", "sharding: expected an object*"},
	{"\"grid\"", TS_INVALID_ARGUMENT, "BAD_SHARDING", "sharding: expected an object*"},
	{"{\"device\": \"sim:0\", \"colour\": 1}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding: unknown field 'colour' (expected device, mesh, spec, memory_kind)"},
	{"{}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding: needs device (single-device) or mesh and spec (named)"},
	{"{\"memory_kind\": \"device\"}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding: needs device*"},
	{"{\"device\": \"sim:0\", \"mesh\": {}}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding: give either device (single-device) or mesh and spec (named), not both"},
	/* single device */
	{"{\"device\": 0}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.device: expected a device id string"},
	{"{\"device\": \"sim:0\\u0000\"}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.device: expected a device id string"},
	{"{\"device\": \"sim:9\"}", TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
	 "sharding.device: device 'sim:9' is not a device of this node"},
	{"{\"device\": \"sim:0\", \"spec\": [\"x\"]}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec: only a named sharding (with a mesh) takes a spec"},
	/* memory kind */
	{"{\"device\": \"sim:0\", \"memory_kind\": \"hbm\"}", TS_INVALID_ARGUMENT,
	 "BAD_MEMORY_KIND",
	 "sharding.memory_kind: 'hbm' is not one of device, pinned_host, unpinned_host"},
	{"{\"device\": \"sim:0\", \"memory_kind\": 1}", TS_INVALID_ARGUMENT, "BAD_MEMORY_KIND",
	 "sharding.memory_kind: expected one of device, pinned_host, unpinned_host"},
	/* mesh */
	{"{\"mesh\": [], \"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh: expected an object*"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"x\"], \"rows\": 1}, "
	 "\"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh: unknown field 'rows' (expected devices, axis_names, shape)"},
	{"{\"mesh\": {\"axis_names\": [\"x\"]}, \"spec\": []}", TS_INVALID_ARGUMENT,
	 "BAD_SHARDING", "sharding.mesh: needs devices"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"]}, \"spec\": []}", TS_INVALID_ARGUMENT,
	 "BAD_SHARDING", "sharding.mesh: needs axis_names"},
	{"{\"mesh\": {\"devices\": \"sim:0\", \"axis_names\": [\"x\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.devices: expected a list of 1 to 64 device ids, or \"auto\""},
	{"{\"mesh\": {\"devices\": [], \"axis_names\": [\"x\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.devices: expected a list of 1 to 64 device ids, or \"auto\""},
	{"{\"mesh\": {\"devices\": [\"sim:0\", 1], \"axis_names\": [\"x\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.devices[1]: expected a device id string"},
	{"{\"mesh\": {\"devices\": [\"sim:0\", \"gpu:0\"], \"axis_names\": [\"x\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "DEVICE_NOT_FOUND",
	 "sharding.mesh.devices[1]: device 'gpu:0' is not a device of this node"},
	{"{\"mesh\": {\"devices\": [\"sim:0\", \"sim:0\"], \"axis_names\": [\"x\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.devices[1]: device 'sim:0' is listed twice"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": \"x\"}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.axis_names: expected a list of 1 to 8 axis names"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": []}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.axis_names: expected a list of 1 to 8 axis names"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": "
	 "[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.axis_names: expected a list of 1 to 8 axis names"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.axis_names[0]: expected a name of 1 to 31 characters"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": "
	 "[\"abcdefghijklmnopqrstuvwxyz012345\"]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.axis_names[0]: expected a name of 1 to 31 characters"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [null]}, \"spec\": []}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.axis_names[0]: expected a name of 1 to 31 characters"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"x\", \"x\"], \"shape\": [1, 1]}, "
	 "\"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.axis_names[1]: axis 'x' is named twice"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\", \"y\"]}, "
	 "\"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.shape: needed when the mesh has 2 axes"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\", \"y\"], "
	 "\"shape\": [2]}, \"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.shape: expected a list of 2 sizes, one per axis name"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"], "
	 "\"shape\": [\"2\"]}, \"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.shape[0]: expected an integer in 1..64"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\", \"y\"], "
	 "\"shape\": [2, 0]}, \"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.shape[1]: expected an integer in 1..64"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\",\"sim:2\"], \"axis_names\": [\"x\", \"y\"], "
	 "\"shape\": [2, 2]}, \"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.shape: its sizes multiply to 4 but sharding.mesh.devices lists 3 devices"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"x\", \"y\"], "
	 "\"shape\": [64, 64]}, \"spec\": []}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.mesh.shape: its sizes multiply to more than 64 but sharding.mesh.devices "
	 "lists 1 devices"},
	/* spec */
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"x\"]}}", TS_INVALID_ARGUMENT,
	 "BAD_SHARDING", "sharding.spec: a named sharding needs a spec*"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"x\"]}, \"spec\": \"x\"}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING", "sharding.spec: expected a list*"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"x\"]}, \"spec\": [1]}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec[0]: expected null, an axis name or a list of axis names"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
	 "\"spec\": [\"x\", \"z\"]}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec[1]: axis 'z' is not in the mesh"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
	 "\"spec\": [[\"x\", \"z\"]]}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec[0][1]: axis 'z' is not in the mesh"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
	 "\"spec\": [[\"x\", 2]]}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec[0][1]: expected an axis name"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
	 "\"spec\": [\"x\", null, \"x\"]}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec[2]: mesh axis 'x' already splits dimension 0; a mesh axis may split one "
	 "dimension only"},
	{"{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
	 "\"spec\": [[\"x\", \"x\"]]}", TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec[0][1]: mesh axis 'x' already splits dimension 0*"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"a\",\"b\",\"c\",\"d\",\"e\"], "
	 "\"shape\": [1,1,1,1,1]}, \"spec\": [[\"a\",\"b\",\"c\",\"d\",\"e\"]]}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec[0]: at most 4 mesh axes may split one dimension"},
	{"{\"mesh\": {\"devices\": [\"sim:0\"], \"axis_names\": [\"x\"]}, \"spec\": "
	 "[null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,"
	 "null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,null,null]}",
	 TS_INVALID_ARGUMENT, "BAD_SHARDING",
	 "sharding.spec: has 33 entries; arrays have at most 32 dimensions"},
};

static void check_refusal(const struct refusal *r, ts_status st, const struct ts_error *err)
{
	size_t len = strlen(r->message);

	ck_assert_msg(st == r->status, "%s: status %s, expected %s (%s)", r->json,
	              ts_status_name(st), ts_status_name(r->status), err->message);
	ck_assert_int_eq(err->status, st);
	ck_assert_msg(strcmp(err->reason, r->reason) == 0, "%s: reason %s, expected %s", r->json,
	              err->reason, r->reason);
	if (r->message[len - 1] == '*')
		ck_assert_msg(strncmp(err->message, r->message, len - 1) == 0,
		              "%s: message '%s', expected '%s'", r->json, err->message, r->message);
	else
		ck_assert_msg(strcmp(err->message, r->message) == 0,
		              "%s: message '%s', expected '%s'", r->json, err->message, r->message);
}

START_TEST(test_every_refusal)
{
	for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
		const struct refusal *r = &refusals[i];
		struct ts_sharding s, before;
		struct ts_error err;
		json_t *j = load(r->json);
		ts_status st;

		memset(&s, 0xab, sizeof s);
		before = s;
		ts_error_clear(&err);
		st = ts_h_sharding_parse(&core, j, &s, &err);
		check_refusal(r, st, &err);
		ck_assert_msg(memcmp(&s, &before, sizeof s) == 0, "%s: *out written on failure",
		              r->json);
		json_decref(j);
	}
}
END_TEST

START_TEST(test_too_many_devices)
{
	json_t *j = load("{\"mesh\": {\"axis_names\": [\"x\"]}, \"spec\": []}"), *devs = json_array();
	struct ts_sharding s;
	struct ts_error err;

	for (int i = 0; i < TS_MESH_MAX_DEVICES + 1; i++)
		json_array_append_new(devs, json_string("sim:0"));
	json_object_set_new(json_object_get(j, "mesh"), "devices", devs);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_h_sharding_parse(&core, j, &s, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.message,
	                 "sharding.mesh.devices: expected a list of 1 to 64 device ids, or \"auto\"");
	json_decref(j);
}
END_TEST

/* ---- saved shardings by name -------------------------------------------------------------- */

START_TEST(test_resolve_names)
{
	struct ts_sharding s, got;
	struct ts_error err;
	json_t *j;

	parse_ok("{\"mesh\": {\"devices\": [\"sim:0\",\"sim:1\"], \"axis_names\": [\"x\"]}, "
	         "\"spec\": [\"x\"]}", &s);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_sharding_registry_put(reg, "rows", &s, &err), TS_OK);

	j = json_string("rows");
	ck_assert_int_eq(ts_h_sharding_resolve(&core, j, &got, &err), TS_OK);
	ck_assert(ts_sharding_equal(&s, &got));
	json_decref(j);

	j = json_string("cols");
	ck_assert_int_eq(ts_h_sharding_resolve(&core, j, &got, &err), TS_NOT_FOUND);
	ck_assert_str_eq(err.reason, "SHARDING_NOT_FOUND");
	ck_assert_str_eq(err.message, "sharding 'cols' not found");
	json_decref(j);

	ts_error_clear(&err);
	j = json_integer(3);
	ck_assert_int_eq(ts_h_sharding_resolve(&core, j, &got, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.message,
	                 "sharding: expected an object or the name of a saved sharding");
	json_decref(j);

	/* objects are parsed as such */
	ts_error_clear(&err);
	j = load("{\"device\": \"sim:3\"}");
	ck_assert_int_eq(ts_h_sharding_resolve(&core, j, &got, &err), TS_OK);
	ck_assert_ptr_eq(got.device, ts_device_set_find(set, "sim:3"));
	json_decref(j);
	ts_error_clear(&err);
	j = load("{\"device\": \"sim:7\"}");
	ck_assert_int_eq(ts_h_sharding_resolve(&core, j, &got, &err), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(err.reason, "DEVICE_NOT_FOUND");
	json_decref(j);

	/* no registry at all: nothing is saved */
	core.env.shardings = NULL;
	ts_error_clear(&err);
	j = json_string("rows");
	ck_assert_int_eq(ts_h_sharding_resolve(&core, j, &got, &err), TS_NOT_FOUND);
	json_decref(j);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("sharding_json");
	TCase *tc = tcase_create("json");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_single_device_forms);
	tcase_add_test(tc, test_named_forms);
	tcase_add_test(tc, test_round_trips);
	tcase_add_test(tc, test_parse_then_boxes);
	tcase_add_test(tc, test_every_refusal);
	tcase_add_test(tc, test_too_many_devices);
	tcase_add_test(tc, test_resolve_names);
	suite_add_tcase(s, tc);
	return s;
}
