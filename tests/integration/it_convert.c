/*
 * it_convert.c - Check suite "convert": :copy and :put with "dtype" convert
 * elements on the way (float32 <-> bfloat16 <-> float16), checked bit for
 * bit against numpy's and ml_dtypes' astype (py/convert_reference.py, what
 * jnp.astype does) on data that holds every class of value: random bit
 * patterns (NaNs, infinities, subnormals, signed zeros), every 16-bit
 * pattern widened, arrays larger than one conversion chunk, sharded arrays
 * over a mesh, and device, pinned and pageable destinations. Refusals (a
 * pair that does not convert, an unknown dtype, a model's array, a
 * destination that does not fit) are answered before anything moves, and
 * leave the source as it was.
 *
 * Device ids are written for sim and run on the backend under test
 * (th_on_backend). Each case runs forked with its own daemon.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct th_daemon D;

static void daemon_up(void)
{
	th_daemon_start(&D, NULL);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* Queries and bodies are written for sim and run on the backend under test. */
static void put_raw(const char *name, const char *query, const void *data, size_t n)
{
	th_put_array(&D, name, th_on_backend(query), data, n);
}

static void post_error(const char *path, const char *body, long http, const char *reason,
                       const char *word)
{
	th_post_error(&D, path, th_on_backend(body), http,
	              http == 429 ? "RESOURCE_EXHAUSTED" : "INVALID_ARGUMENT", reason, word, NULL);
}

/* The bytes of an array (new buffer), its dtype header checked. */
static char *download(const char *name, const char *dtype, size_t *n)
{
	struct th_response r;
	char path[300], *x;

	snprintf(path, sizeof path, "/v1/arrays/%s/data", name);
	th_get(&D, path, &r);
	ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
	ck_assert_str_eq(th_header(&r, "X-Tstage-Dtype"), dtype);
	*n = r.body_len;
	x = malloc(r.body_len ? r.body_len : 1);
	ck_assert_ptr_nonnull(x);
	memcpy(x, r.body, r.body_len);
	th_response_free(&r);
	return x;
}

/* Checks the conversion of src (n bytes of from) into the array name (to)
 * against astype. */
static void check_against_astype(const void *src, size_t n, const char *from, const char *name,
                                 const char *to)
{
	char dir[512], in[600], got[600], cmd[2048], out[4096];
	size_t len, k;
	char *bytes = download(name, to, &len);
	FILE *p;
	int rc;

	th_temp_dir("convert", dir, sizeof dir);
	snprintf(in, sizeof in, "%s/in.raw", dir);
	snprintf(got, sizeof got, "%s/got.raw", dir);
	th_write_file(in, src, n);
	th_write_file(got, bytes, len);
	free(bytes);
	snprintf(cmd, sizeof cmd, "python3 '%s/convert_reference.py' '%s' %s '%s' %s 2>&1",
	         th_py_dir(), in, from, got, to);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	k = fread(out, 1, sizeof out - 1, p);
	out[k] = '\0';
	rc = pclose(p);
	ck_assert_msg(rc == 0 && strncmp(out, "ok ", 3) == 0, "%s -> %s (%s): %s", from, to, name,
	              out);
}

/* n float32 elements of random bit patterns, with the special values first. */
static uint32_t *random_f32(size_t n, uint64_t seed)
{
	static const uint32_t special[] = {
		0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001,
		0x00000001, 0x00010000, 0x387fffff, 0x38800000, 0x33000000, 0x33400000, 0x477fe000,
		0x477ff000, 0x477fefff, 0x7f7fffff, 0x3f808000, 0x3f818000, 0x3f808001, 0x3f800000,
	};
	uint32_t *x = malloc(n * sizeof *x);

	ck_assert_ptr_nonnull(x);
	th_fill(x, n * sizeof *x, seed);
	for (size_t i = 0; i < n && i < sizeof special / sizeof special[0]; i++)
		x[i] = special[i];
	return x;
}

START_TEST(test_f32_narrowed_to_each_space)
{
	size_t n = 4096 * 33;
	uint32_t *x;
	json_t *a;

	if (!th_second_device(&D, __func__))
		return;
	x = random_f32(n, 7);
	put_raw("x", "dtype=float32&shape=4096,33&device=sim:0&memory_kind=unpinned_host", x,
	        n * 4);
	a = th_post_json_on_backend(&D, "/v1/arrays/x:copy?wait=true",
	         "{\"out\": \"b\", \"dtype\": \"bfloat16\", \"device\": \"sim:0\", "
	         "\"memory_kind\": \"device\"}", 200);
	ck_assert_str_eq(th_str(a, "dtype"), "bfloat16");
	ck_assert_int_eq(th_int(a, "nbytes"), (json_int_t)(n * 2));
	ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), "device");
	json_decref(a);
	check_against_astype(x, n * 4, "float32", "b", "bfloat16");
	json_decref(th_post_json_on_backend(&D, "/v1/arrays/x:copy?wait=true",
	                 "{\"out\": \"h\", \"dtype\": \"float16\", \"device\": \"sim:1\", "
	                 "\"memory_kind\": \"pinned_host\"}", 200));
	check_against_astype(x, n * 4, "float32", "h", "float16");
	/* the source is untouched */
	{
		size_t len;
		char *back = download("x", "float32", &len);

		th_assert_bytes("x", back, len, x, n * 4);
		free(back);
	}
	free(x);
}
END_TEST

/* Every bfloat16 and float16 pattern widened in place by :put (same name,
 * same placement, a new version), then narrowed back by :copy. */
START_TEST(test_every_pattern_widened_in_place)
{
	static const char *const kinds[] = {"bfloat16", "float16"};
	uint16_t *h;

	if (!th_second_device(&D, __func__))
		return;
	h = malloc(65536 * 2);
	ck_assert_ptr_nonnull(h);
	for (uint32_t i = 0; i < 65536; i++)
		h[i] = (uint16_t)i;
	for (int k = 0; k < 2; k++) {
		char query[128], body[160];
		json_t *before, *after;

		snprintf(query, sizeof query, "dtype=%s&shape=256,256&device=sim:1", kinds[k]);
		put_raw("p", query, h, 65536 * 2);
		before = th_array_meta(&D, "p");
		after = th_post_json_on_backend(&D, "/v1/arrays/p:put?wait=true", "{\"dtype\": \"float32\"}", 200);
		ck_assert_str_eq(th_str(after, "dtype"), "float32");
		ck_assert_str_eq(th_str(th_obj(after, "sharding"), "device"), th_dev(1));
		ck_assert_int_ne(th_int(after, "version"), th_int(before, "version"));
		json_decref(before);
		json_decref(after);
		check_against_astype(h, 65536 * 2, kinds[k], "p", "float32");
		snprintf(body, sizeof body, "{\"out\": \"q\", \"dtype\": \"%s\", \"overwrite\": true, "
		         "\"memory_kind\": \"device\"}", kinds[k]);
		json_decref(th_post_json_on_backend(&D, "/v1/arrays/p:copy?wait=true", body, 200));
		{
			size_t len;
			char *back = download("q", kinds[k], &len);
			uint16_t *b = (uint16_t *)back;

			ck_assert_uint_eq(len, 65536 * 2);
			for (uint32_t i = 0; i < 65536; i++) {
				bool nan = k == 0 ? (i & 0x7f80) == 0x7f80 && (i & 0x7f)
				                  : (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
				uint16_t want = (uint16_t)(nan ? i | (k == 0 ? 0x40 : 0x200) : i);

				ck_assert_msg(b[i] == want, "%s %04x came back as %04x", kinds[k], i, b[i]);
			}
			free(back);
		}
	}
	free(h);
}
END_TEST

/* Larger than one conversion chunk (1M elements), sharded over both devices:
 * every shard converted, progress counting the destination's bytes. */
START_TEST(test_sharded_and_chunked)
{
	size_t n = 3 * 1024 * 1024 + 8 * 17;        /* 3M + a partial chunk */
	uint32_t *x;
	json_t *op, *res, *shards;
	char id[80];

	if (!th_second_device(&D, __func__))
		return;
	x = random_f32(n, 11);
	put_raw("big", "dtype=float32&shape=8,393233&device=sim:0&memory_kind=pinned_host", x,
	        n * 4);
	json_decref(th_post_json_on_backend(&D, "/v1/shardings",
	                 "{\"name\": \"rows2\", \"sharding\": {\"mesh\": {\"devices\": "
	                 "[\"sim:0\", \"sim:1\"], \"axis_names\": [\"x\"]}, \"spec\": [\"x\"], "
	                 "\"memory_kind\": \"device\"}}", 201));
	op = th_post_json_on_backend(&D, "/v1/arrays/big:copy", "{\"out\": \"big16\", \"dtype\": \"bfloat16\", "
	          "\"sharding\": \"rows2\"}", 202);
	snprintf(id, sizeof id, "%s", th_str(op, "name"));
	ck_assert_int_eq(th_int(th_op_meta(op, "progress"), "bytes_total"), (json_int_t)(n * 2));
	json_decref(op);
	{
		char path[160];

		snprintf(path, sizeof path, "/v1/%s:wait?timeout=120s", id);
		op = th_post_json_on_backend(&D, path, "{}", 200);
	}
	ck_assert(th_bool(op, "done"));
	ck_assert_int_eq(th_int(th_op_meta(op, "progress"), "bytes_done"), (json_int_t)(n * 2));
	res = th_op_result(op);
	shards = th_arr(res, "shards");
	ck_assert_int_eq(json_array_size(shards), 2);
	ck_assert_int_eq(th_int(json_array_get(shards, 0), "nbytes"), (json_int_t)(n));
	json_decref(op);
	check_against_astype(x, n * 4, "float32", "big16", "bfloat16");
	free(x);
}
END_TEST

START_TEST(test_refusals_leave_everything)
{
	int32_t ints[64] = {0};
	float fl[64] = {0};
	json_t *after;

	put_raw("i", "dtype=int32&shape=64&device=sim:0", ints, sizeof ints);
	put_raw("f", "dtype=float32&shape=64&device=sim:0", fl, sizeof fl);
	post_error("/v1/arrays/i:copy?wait=true", "{\"out\": \"j\", \"dtype\": \"bfloat16\"}", 400,
	           "UNSUPPORTED_CONVERSION", "int32");
	post_error("/v1/arrays/i:put?wait=true", "{\"dtype\": \"float32\"}", 400,
	           "UNSUPPORTED_CONVERSION", "'i'");
	post_error("/v1/arrays/f:put?wait=true", "{\"dtype\": \"float99\"}", 400, "BAD_DTYPE",
	           "dtype");
	post_error("/v1/arrays/f:put?wait=true", "{\"dtype\": 16}", 400, "BAD_DTYPE", "dtype");
	post_error("/v1/arrays/f:put?wait=true", "{\"dtype\": \"float64\"}", 400,
	           "UNSUPPORTED_CONVERSION", "float64");
	/* a model's arrays keep their dtype */
	json_decref(th_post_json_on_backend(&D, "/v1/models?wait=true",
	                 "{\"name\": \"m\", \"mlp\": {\"layers\": 1, \"d_model\": 8}, "
	                 "\"placement\": {\"device\": \"sim:0\"}}", 200));
	post_error("/v1/arrays/m.w1:put?wait=true", "{\"dtype\": \"bfloat16\"}", 400, "OWNED_SHAPE",
	           "m.w1");
	/* a conversion that cannot fit: float16 -> float32 of 40 MiB onto a 64 MiB sim
	 * device already holding 40 MiB (a GPU's memory is too large to fill here) */
	if (th_backend_is_sim()) {
		size_t n = 20u << 20;
		char *z = calloc(1, n);

		ck_assert_ptr_nonnull(z);
		put_raw("z", "dtype=float16&shape=10485760&device=sim:1", z, n);
		put_raw("w", "dtype=uint8&shape=20971520&device=sim:1", z, n);
		post_error("/v1/arrays/z:put?wait=true", "{\"dtype\": \"float32\"}", 429,
		           "OUT_OF_MEMORY", NULL);
		free(z);
	}
	if (th_backend_is_sim()) {
		after = th_array_meta(&D, "z");
		ck_assert_str_eq(th_str(after, "dtype"), "float16");
		json_decref(after);
	}
	after = th_array_meta(&D, "m.w1");
	ck_assert_str_eq(th_str(after, "dtype"), "float32");
	json_decref(after);
	after = th_array_meta(&D, "f");
	ck_assert_int_eq(th_int(after, "version"), 1);
	json_decref(after);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("convert");
	TCase *tc = tcase_create("convert");

	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_f32_narrowed_to_each_space);
	tcase_add_test(tc, test_every_pattern_widened_in_place);
	tcase_add_test(tc, test_sharded_and_chunked);
	tcase_add_test(tc, test_refusals_leave_everything);
	suite_add_tcase(s, tc);
	return s;
}
