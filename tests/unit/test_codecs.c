/*
 * test_codecs.c - the pure tensor codecs: the dtype tables, overflow-checked
 * shape sizes and byte swapping; .npy preambles (real ones written by numpy,
 * every class of malformed header, write->parse roundtrips and byte equality
 * with numpy's writer, the Fortran-to-C reordering); safetensors headers
 * (one written by the reference package, every class of malformed header,
 * build->parse roundtrips and allocation failures injected into jansson).
 * Every refusal is checked for its status, reason and a lower-case message
 * naming the offending value.
 */
#include <check.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "formats/dtype.h"
#include "formats/npy.h"
#include "formats/safetensors.h"
#include "tests/unit/unit.h"

#define PREAMBLE(s) s, sizeof(s) - 1
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static const enum ts_dtype bf16 = TS_DT_BFLOAT16;
static const enum ts_dtype i16 = TS_DT_INT16;
static const enum ts_dtype i32 = TS_DT_INT32;

/* A preamble written by numpy and what it must parse to. */
struct numpy_case {
	const char *name;
	enum ts_dtype dtype;
	int rank;
	uint64_t shape[TS_MAX_RANK];
	bool fortran_order;
	bool big_endian;
	const enum ts_dtype *hint;
	const char *bytes;
	size_t len;
};

/* A C-order little-endian preamble numpy writes for dtype and shape. */
struct numpy_write_case {
	enum ts_dtype dtype;
	int rank;
	uint64_t shape[TS_MAX_RANK];
	const char *bytes;
	size_t len;
};

/* generated with numpy 2.4.6: numpy.lib.format.write_array(...) preambles */
static const struct numpy_case numpy_cases[] = {
	{"bool (2, 3)", TS_DT_BOOL, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '|b1', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"int8 (2, 3)", TS_DT_INT8, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '|i1', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"uint8 (2, 3)", TS_DT_UINT8, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '|u1', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"int16 (2, 3)", TS_DT_INT16, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<i2', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"uint16 (2, 3)", TS_DT_UINT16, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<u2', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"int32 (2, 3)", TS_DT_INT32, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<i4', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"uint32 (2, 3)", TS_DT_UINT32, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<u4', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"int64 (2, 3)", TS_DT_INT64, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<i8', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"uint64 (2, 3)", TS_DT_UINT64, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<u8', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"float16 (2, 3)", TS_DT_FLOAT16, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f2', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"float32 (2, 3)", TS_DT_FLOAT32, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"float64 (2, 3)", TS_DT_FLOAT64, 2, {2, 3}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f8', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{"bfloat16 as |V2 (3,)", TS_DT_BFLOAT16, 1, {3}, false, false, &bf16,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '|V2', 'fortran_order': False, 'shape': "
		"(3,), }                                                            \012")},
	{"0-d float32", TS_DT_FLOAT32, 0, {0}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': "
		"(), }                                                              \012")},
	{"empty (0, 5)", TS_DT_FLOAT32, 2, {0, 5}, false, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': "
		"(0, 5), }                                                          \012")},
	{"fortran (2, 3)", TS_DT_INT32, 2, {2, 3}, true, false, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<i4', 'fortran_order': True, 'shape': ("
		"2, 3), }                                                           \012")},
	{"big-endian >f8 (4,)", TS_DT_FLOAT64, 1, {4}, false, true, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '>f8', 'fortran_order': False, 'shape': "
		"(4,), }                                                            \012")},
	{"big-endian >i2 (1, 1, 1)", TS_DT_INT16, 3, {1, 1, 1}, false, true, NULL,
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '>i2', 'fortran_order': False, 'shape': "
		"(1, 1, 1), }                                                       \012")},
	{"version 2.0", TS_DT_FLOAT64, 1, {3}, false, false, NULL,
		PREAMBLE("\223NUMPY\002\000t\000\000\000{'descr': '<f8', 'fortran_order': False, '"
		"shape': (3,), }                                                         "
		" \012")},
	{"version 3.0", TS_DT_UINT16, 2, {5, 1}, false, false, NULL,
		PREAMBLE("\223NUMPY\003\000t\000\000\000{'descr': '<u2', 'fortran_order': False, '"
		"shape': (5, 1), }                                                       "
		" \012")},
};
static const struct numpy_write_case numpy_write_cases[] = {
	{TS_DT_FLOAT32, 2, {2, 3},
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': "
		"(2, 3), }                                                          \012")},
	{TS_DT_FLOAT32, 0, {0},
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f4', 'fortran_order': False, 'shape': "
		"(), }                                                              \012")},
	{TS_DT_UINT8, 1, {7},
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '|u1', 'fortran_order': False, 'shape': "
		"(7,), }                                                            \012")},
	{TS_DT_FLOAT64, 2, {0, 5},
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<f8', 'fortran_order': False, 'shape': "
		"(0, 5), }                                                          \012")},
	{TS_DT_INT64, 3, {1099511627776ull, 3, 1},
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<i8', 'fortran_order': False, 'shape': "
		"(1099511627776, 3, 1), }                                           \012")},
	{TS_DT_BOOL, 1, {18446744073709551615ull},
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '|b1', 'fortran_order': False, 'shape': "
		"(18446744073709551615,), }                                         \012")},
	{TS_DT_UINT16, 32, {
		 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
		 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32},
		PREAMBLE("\223NUMPY\001\000\366\000{'descr': '<u2', 'fortran_order': False, 'shape"
		"': (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 2"
		"0, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32), }                   "
		"                                                      \012")},
	{TS_DT_BFLOAT16, 2, {4, 4},
		PREAMBLE("\223NUMPY\001\000v\000{'descr': '<V2', 'fortran_order': False, 'shape': "
		"(4, 4), }                                                          \012")},
};

/* generated with safetensors 0.8.0: safetensors.numpy.save(...) header, 39 data bytes follow */
#define REF_HEADER_DATA_LEN 39
static const char ref_header[] =
	"H\001\000\000\000\000\000\000{\"__metadata__\":{\"format\":\"np\",\"note"
	"\":\"tiny\"},\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8"
	"]},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},\"h"
	"\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[32,36]},\"e\":{\"d"
	"type\":\"U8\",\"shape\":[0,4],\"data_offsets\":[36,36]},\"m\":{\"dtype\""
	":\"BOOL\",\"shape\":[3],\"data_offsets\":[36,39]}}       ";

/* ---- invariants of every refusal ------------------------------------------ */

static void check_error(const struct ts_error *e, ts_status got, ts_status want,
                        const char *reason, const char *needle)
{
	size_t n = strlen(e->message);

	ck_assert_msg(got == want, "status %s, want %s (%s)", ts_status_name(got),
	              ts_status_name(want), e->message);
	ck_assert_int_eq(e->status, want);
	ck_assert_str_eq(e->reason, reason);
	ck_assert_msg(strstr(e->message, needle), "message '%s' lacks '%s'", e->message, needle);
	ck_assert_msg(n > 0 && islower((unsigned char)e->message[0]), "'%s' not lower case",
	              e->message);
	ck_assert_msg(e->message[n - 1] != '.', "'%s' ends in a full stop", e->message);
}

/* ---- dtype ----------------------------------------------------------------- */

START_TEST(test_dtype_tables_roundtrip)
{
	static const struct {
		enum ts_dtype dt;
		const char *name, *st, *npy;
		size_t size;
	} want[] = {
		{TS_DT_BOOL, "bool", "BOOL", "|b1", 1},
		{TS_DT_INT8, "int8", "I8", "|i1", 1},
		{TS_DT_UINT8, "uint8", "U8", "|u1", 1},
		{TS_DT_INT16, "int16", "I16", "<i2", 2},
		{TS_DT_UINT16, "uint16", "U16", "<u2", 2},
		{TS_DT_INT32, "int32", "I32", "<i4", 4},
		{TS_DT_UINT32, "uint32", "U32", "<u4", 4},
		{TS_DT_INT64, "int64", "I64", "<i8", 8},
		{TS_DT_UINT64, "uint64", "U64", "<u8", 8},
		{TS_DT_FLOAT16, "float16", "F16", "<f2", 2},
		{TS_DT_BFLOAT16, "bfloat16", "BF16", "<V2", 2},
		{TS_DT_FLOAT32, "float32", "F32", "<f4", 4},
		{TS_DT_FLOAT64, "float64", "F64", "<f8", 8},
	};

	ck_assert_int_eq(ARRAY_LEN(want), TS_DT_COUNT);
	for (size_t i = 0; i < ARRAY_LEN(want); i++) {
		enum ts_dtype dt = TS_DT_COUNT;

		ck_assert_str_eq(ts_dtype_name(want[i].dt), want[i].name);
		ck_assert_str_eq(ts_dtype_safetensors(want[i].dt), want[i].st);
		ck_assert_str_eq(ts_dtype_npy_descr(want[i].dt), want[i].npy);
		ck_assert_uint_eq(ts_dtype_size(want[i].dt), want[i].size);
		ck_assert(ts_dtype_parse(want[i].name, &dt));
		ck_assert_int_eq(dt, want[i].dt);
		dt = TS_DT_COUNT;
		ck_assert(ts_dtype_from_safetensors(want[i].st, &dt));
		ck_assert_int_eq(dt, want[i].dt);
	}
	/* the list messages give: every name in table order; a short buffer cuts it */
	{
		char names[TS_DTYPE_NAMES_MAX], small[9];

		ck_assert_str_eq(ts_dtype_names(names, sizeof names),
		                 "bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, "
		                 "float16, bfloat16, float32, float64");
		ck_assert_str_eq(ts_dtype_names(small, sizeof small), "bool, in");
	}
}
END_TEST

START_TEST(test_dtype_rejects_other_names)
{
	static const char *const ours[] = {"f4", "Float32", "float", "FLOAT32", "F32", "", "int",
	                                   "bfloat16 ", "<f4"};
	static const char *const st[] = {"F8_E4M3", "F8_E5M2", "C64", "f32", "BF16 ", "", "float32",
	                                 "F4"};
	enum ts_dtype dt = TS_DT_INT8;

	for (size_t i = 0; i < ARRAY_LEN(ours); i++)
		ck_assert_msg(!ts_dtype_parse(ours[i], &dt), "accepted '%s'", ours[i]);
	for (size_t i = 0; i < ARRAY_LEN(st); i++)
		ck_assert_msg(!ts_dtype_from_safetensors(st[i], &dt), "accepted '%s'", st[i]);
	ck_assert(!ts_dtype_parse(NULL, &dt));
	ck_assert(!ts_dtype_from_safetensors(NULL, &dt));
	ck_assert_int_eq(dt, TS_DT_INT8);
	ck_assert_ptr_null(ts_dtype_name(TS_DT_COUNT));
	ck_assert_ptr_null(ts_dtype_name((enum ts_dtype)-1));
	ck_assert_ptr_null(ts_dtype_safetensors(TS_DT_COUNT));
	ck_assert_ptr_null(ts_dtype_npy_descr(TS_DT_COUNT));
	ck_assert_uint_eq(ts_dtype_size(TS_DT_COUNT), 0);
}
END_TEST

START_TEST(test_shape_nbytes_overflow)
{
	uint64_t n = 12345, big[3] = {1ull << 32, 1ull << 32, 0};
	uint64_t s[TS_MAX_RANK + 1];

	ck_assert(ts_shape_nbytes(0, NULL, TS_DT_FLOAT64, &n));
	ck_assert_uint_eq(n, 8);                               /* 0-d: one element */
	ck_assert(ts_shape_nbytes(2, (uint64_t[]){2, 3}, TS_DT_FLOAT32, &n));
	ck_assert_uint_eq(n, 24);
	ck_assert(ts_shape_nbytes(2, (uint64_t[]){0, 5}, TS_DT_FLOAT32, &n));
	ck_assert_uint_eq(n, 0);
	ck_assert(ts_shape_nbytes(2, (uint64_t[]){1ull << 32, (1ull << 32) - 1}, TS_DT_UINT8, &n));
	ck_assert_uint_eq(n, (1ull << 32) * ((1ull << 32) - 1));
	ck_assert(!ts_shape_nbytes(2, big, TS_DT_UINT8, &n));  /* 2^64 */
	ck_assert(!ts_shape_nbytes(3, big, TS_DT_UINT8, &n));  /* a zero does not hide it */
	big[2] = big[0];
	big[0] = 0;
	ck_assert(!ts_shape_nbytes(3, big, TS_DT_UINT8, &n));  /* wherever it sits */
	ck_assert(ts_shape_nbytes(1, (uint64_t[]){(1ull << 61) - 1}, TS_DT_FLOAT64, &n));
	ck_assert_uint_eq(n, ((1ull << 61) - 1) * 8);
	ck_assert(!ts_shape_nbytes(1, (uint64_t[]){1ull << 61}, TS_DT_FLOAT64, &n));
	ck_assert(ts_shape_nbytes(1, (uint64_t[]){UINT64_MAX}, TS_DT_BOOL, &n));
	ck_assert_uint_eq(n, UINT64_MAX);
	ck_assert(!ts_shape_nbytes(1, (uint64_t[]){UINT64_MAX}, TS_DT_INT16, &n));
	for (int i = 0; i <= TS_MAX_RANK; i++)
		s[i] = 1;
	ck_assert(ts_shape_nbytes(TS_MAX_RANK, s, TS_DT_INT32, &n));
	ck_assert_uint_eq(n, 4);
	ck_assert(!ts_shape_nbytes(TS_MAX_RANK + 1, s, TS_DT_INT32, &n));
	ck_assert(!ts_shape_nbytes(-1, s, TS_DT_INT32, &n));
	ck_assert(!ts_shape_nbytes(1, s, TS_DT_COUNT, &n));
}
END_TEST

START_TEST(test_byteswap_in_place)
{
	uint16_t a[2] = {0x0102, 0xa0b0};
	uint32_t b[2] = {0x01020304u, 0xdeadbeefu};
	uint64_t c[1] = {0x0102030405060708ull};
	unsigned char d[6] = {1, 2, 3, 4, 5, 6}, e[3] = {7, 8, 9};

	ts_byteswap(a, 2, 2);
	ck_assert_uint_eq(a[0], 0x0201);
	ck_assert_uint_eq(a[1], 0xb0a0);
	ts_byteswap(b, 2, 4);
	ck_assert_uint_eq(b[0], 0x04030201u);
	ck_assert_uint_eq(b[1], 0xefbeaddeu);
	ts_byteswap(c, 1, 8);
	ck_assert_uint_eq(c[0], 0x0807060504030201ull);
	ts_byteswap(d, 2, 3);                                  /* any size reverses */
	ck_assert_mem_eq(d, ((unsigned char[]){3, 2, 1, 6, 5, 4}), 6);
	ts_byteswap(e, 3, 1);                                  /* bytes stay */
	ck_assert_mem_eq(e, ((unsigned char[]){7, 8, 9}), 3);
	ts_byteswap(b, 0, 4);
	ck_assert_uint_eq(b[0], 0x04030201u);
	ts_byteswap(b, 2, 4);
	ck_assert_uint_eq(b[1], 0xdeadbeefu);                  /* twice is identity */
}
END_TEST

/* ---- npy ------------------------------------------------------------------- */

/* A version-`major` preamble around dict, padded with spaces and '\n' to a
 * multiple of 64 as numpy pads. Returns its length. */
static size_t npy_make(char *buf, size_t cap, int major, const char *dict)
{
	size_t lf = major == 1 ? 2 : 4, n = strlen(dict), pre = 8 + lf;
	size_t pad = (64 - (pre + n + 1) % 64) % 64, hlen = n + pad + 1;

	ck_assert_uint_le(pre + hlen, cap);
	memcpy(buf, "\x93NUMPY", 6);
	buf[6] = (char)major;
	buf[7] = 0;
	for (size_t i = 0; i < lf; i++)
		buf[8 + i] = (char)((hlen >> (8 * i)) & 0xff);
	memcpy(buf + pre, dict, n);
	memset(buf + pre + n, ' ', pad);
	buf[pre + hlen - 1] = '\n';
	return pre + hlen;
}

static ts_status npy_dict(const char *dict, const enum ts_dtype *hint, struct ts_npy_header *h,
                          struct ts_error *err)
{
	char buf[8192];
	size_t len = npy_make(buf, sizeof buf, 1, dict);

	ts_error_clear(err);
	return ts_npy_parse_header(buf, len, hint, h, err);
}

START_TEST(test_npy_parses_numpy_headers)
{
	for (size_t i = 0; i < ARRAY_LEN(numpy_cases); i++) {
		const struct numpy_case *c = &numpy_cases[i];
		struct ts_npy_header h;
		struct ts_error err;
		uint64_t off = 0, nbytes;
		ts_status st;

		ts_error_clear(&err);
		ck_assert_int_eq(ts_npy_preamble(c->bytes, 12, &off, &err), TS_OK);
		ck_assert_uint_eq(off, c->len);
		ck_assert_uint_eq(off % 64, 0);
		st = ts_npy_parse_header(c->bytes, c->len, c->hint, &h, &err);
		ck_assert_msg(st == TS_OK, "%s: %s", c->name, err.message);
		ck_assert_msg(h.dtype == c->dtype, "%s: dtype %s", c->name, ts_dtype_name(h.dtype));
		ck_assert_int_eq(h.rank, c->rank);
		for (int d = 0; d < c->rank; d++)
			ck_assert_uint_eq(h.shape[d], c->shape[d]);
		ck_assert_int_eq(h.fortran_order, c->fortran_order);
		ck_assert_int_eq(h.big_endian, c->big_endian);
		ck_assert_int_eq(h.dtype_from_hint, c->hint != NULL);
		ck_assert_uint_eq(h.data_offset, c->len);
		ck_assert(ts_shape_nbytes(c->rank, c->shape, c->dtype, &nbytes));
		ck_assert_uint_eq(h.nbytes, nbytes);
		/* a hint that agrees changes nothing */
		st = ts_npy_parse_header(c->bytes, c->len, &c->dtype, &h, &err);
		ck_assert_msg(st == TS_OK, "%s with its own hint: %s", c->name, err.message);
		ck_assert_int_eq(h.dtype, c->dtype);
	}
}
END_TEST

START_TEST(test_npy_accepts_python_literal_variants)
{
	static const struct {
		const char *dict;
		enum ts_dtype dt;
		int rank;
		uint64_t d0;
		bool fortran, big;
	} ok[] = {
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", TS_DT_FLOAT32, 2, 2,
		 false, false},
		{"{\"shape\": (7,), \"descr\": \"<i8\", \"fortran_order\": True}", TS_DT_INT64, 1, 7,
		 true, false},
		{"{ 'fortran_order' :False ,'shape':( 4 , 5 , ),'descr':'>u4' , }", TS_DT_UINT32, 2, 4,
		 false, true},
		{"{'descr':\n'<f2',\n\t'fortran_order': False,\r\n 'shape': (3L, 4L), }", TS_DT_FLOAT16,
		 2, 3, false, false},
		{"  {'descr': '=i2', 'fortran_order': False, 'shape': ()}", TS_DT_INT16, 0, 0,
		 false, false},
		{"{'descr': '>u1', 'fortran_order': False, 'shape': (0,)}", TS_DT_UINT8, 1, 0,
		 false, false},
		{"{'descr': 'f8', 'fortran_order': False, 'shape': (18446744073709551615,)}",
		 TS_DT_FLOAT64, 1, 0, false, false},
		{"{'descr': '|i4', 'fortran_order': False, 'shape': (+2, -0)}", TS_DT_INT32, 2, 2,
		 false, false},
	};

	for (size_t i = 0; i < ARRAY_LEN(ok); i++) {
		struct ts_npy_header h;
		struct ts_error err;
		ts_status st = npy_dict(ok[i].dict, NULL, &h, &err);

		if (i == 6) {        /* 2^64 - 1 float64 elements: too many bytes */
			check_error(&err, st, TS_INVALID_ARGUMENT, "BAD_NPY_HEADER", "2^64 bytes");
			continue;
		}
		ck_assert_msg(st == TS_OK, "%s: %s", ok[i].dict, err.message);
		ck_assert_int_eq(h.dtype, ok[i].dt);
		ck_assert_int_eq(h.rank, ok[i].rank);
		if (ok[i].rank)
			ck_assert_uint_eq(h.shape[0], ok[i].d0);
		ck_assert_int_eq(h.fortran_order, ok[i].fortran);
		ck_assert_int_eq(h.big_endian, ok[i].big);
	}
}
END_TEST

START_TEST(test_npy_refuses_malformed_dicts)
{
	static const struct {
		const char *dict;
		const enum ts_dtype *hint;
		const char *needle;
	} bad[] = {
		{"['descr', 'fortran_order', 'shape']", NULL, "not a dict literal"},
		{"", NULL, "not a dict literal (found end of header"},
		{"{'descr': '<f4', 'fortran_order': False}", NULL, "header has no 'shape' key"},
		{"{'shape': (), 'fortran_order': False}", NULL, "header has no 'descr' key"},
		{"{'descr': '<f4', 'shape': ()}", NULL, "header has no 'fortran_order' key"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", NULL,
		 "unknown key 'extra'"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'descr': '<f4'}", NULL,
		 "duplicate key 'descr'"},
		{"{'descr': '<f4', 'shape': (), 'fortran_order': False, 'shape': ()}", NULL,
		 "duplicate key 'shape'"},
		{"{'descr': '<c8', 'fortran_order': False, 'shape': ()}", NULL,
		 "descr '<c8' is not a supported dtype"},
		{"{'descr': '<f3', 'fortran_order': False, 'shape': ()}", NULL, "descr '<f3'"},
		{"{'descr': '<U5', 'fortran_order': False, 'shape': ()}", NULL, "descr '<U5'"},
		{"{'descr': '', 'fortran_order': False, 'shape': ()}", NULL, "descr ''"},
		{"{'descr': '|O', 'fortran_order': False, 'shape': ()}", NULL, "object dtype"},
		{"{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': ()}", NULL,
		 "structured dtypes are not supported"},
		{"{'descr': 4, 'fortran_order': False, 'shape': ()}", NULL, "descr must be a string"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", NULL,
		 "shape entry 1 is negative"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3.5)}", NULL,
		 "shape entry 2 ('3.5') is not an integer"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': ('3',)}", NULL,
		 "shape entry 0 (''') is not an integer"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (0x10,)}", NULL,
		 "shape entry 0 ('0x10') is not an integer"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", NULL,
		 "shape entry 0 ('99999999999999999999') does not fit in 64 bits"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", NULL,
		 "shape (4294967296, 4294967296) of float32 needs more than 2^64 bytes"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", NULL,
		 "shape (3) is not a tuple; a 1-d shape is written (3,)"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': [3]}", NULL,
		 "shape must be a tuple, not a list"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", NULL,
		 "shape entry 0 (',') is not an integer"},
		{"{'descr': ':<f2', 'fortran_order': False, 'shape': (4,   ", NULL,
		 "shape entry 1 is missing: the header ends"},           /* found by fuzz_npy */
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (-", NULL,
		 "shape entry 0 ('-"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", NULL,
		 "expected ',' or ')' after shape entry 0"},
		{"{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", NULL,
		 "fortran_order must be True or False, found '0'"},
		{"{'descr': '<f4', 'fortran_order': false, 'shape': ()}", NULL,
		 "fortran_order must be True or False, found 'false'"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': ()} x", NULL,
		 "unexpected 'x' after the header dict"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': ()}}", NULL,
		 "unexpected '}' after the header dict"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': ()", NULL, "header dict is not closed"},
		{"{'descr': '<f4' 'fortran_order': False, 'shape': ()}", NULL, "expected ',' or '}'"},
		{"{'descr' '<f4', 'fortran_order': False, 'shape': ()}", NULL,
		 "expected ':' after key 'descr'"},
		{"{'descr: '<f4', 'fortran_order': False, 'shape': ()}", NULL, "unknown key 'descr: '"},
		{"{'descr': '<f4, 'fortran_order': False, 'shape': ()}", NULL,
		 "expected ',' or '}' at offset 27, found 'fortran_order'"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x", NULL,
		 "unterminated string starting at offset 64"},
		{"{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}", NULL,
		 "escape sequence in the string at offset 20"},
		{"{,}", NULL, "expected a quoted key at offset 11, found ','"},
		{"{descr: '<f4'}", NULL, "expected a quoted key at offset 11, found 'descr'"},
		{"{'descr': '<V2', 'fortran_order': False, 'shape': ()}", NULL,
		 "descr '<V2' (bfloat16?) needs ?dtype=bfloat16"},
		{"{'descr': '|V2', 'fortran_order': False, 'shape': ()}", &i16,
		 "descr '|V2' (bfloat16?) needs ?dtype=bfloat16, not ?dtype=int16"},
		{"{'descr': '|V4', 'fortran_order': False, 'shape': ()}", &bf16, "descr '|V4'"},
		{"{'descr': '<f4', 'fortran_order': False, 'shape': ()}", &i32,
		 "descr '<f4' is float32 but ?dtype=int32 was asked for"},
		{"{'descr': '<u2', 'fortran_order': False, 'shape': ()}", &bf16,
		 "descr '<u2' is uint16 but ?dtype=bfloat16 was asked for"},
	};

	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		struct ts_npy_header h;
		struct ts_error err;
		ts_status st = npy_dict(bad[i].dict, bad[i].hint, &h, &err);

		ck_assert_msg(st != TS_OK, "accepted %s", bad[i].dict);
		check_error(&err, st, TS_INVALID_ARGUMENT, "BAD_NPY_HEADER", bad[i].needle);
	}
}
END_TEST

START_TEST(test_npy_rank_limit)
{
	char dict[1024];
	size_t o;
	struct ts_npy_header h;
	struct ts_error err;

	for (int rank = 32; rank <= 33; rank++) {
		o = (size_t)sprintf(dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
		for (int i = 0; i < rank; i++)
			o += (size_t)sprintf(dict + o, "1, ");
		sprintf(dict + o, "), }");
		if (rank == 32) {
			ck_assert_int_eq(npy_dict(dict, NULL, &h, &err), TS_OK);
			ck_assert_int_eq(h.rank, 32);
			ck_assert_uint_eq(h.nbytes, 4);
		} else {
			check_error(&err, npy_dict(dict, NULL, &h, &err), TS_INVALID_ARGUMENT,
			            "BAD_NPY_HEADER", "shape has more than 32 entries (rank 33");
		}
	}
}
END_TEST

START_TEST(test_npy_refuses_bad_preambles)
{
	static const char good[] = "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4'";
	char buf[256];
	struct ts_npy_header h;
	struct ts_error err;
	uint64_t off = 99;
	size_t len;

	/* bad magic, as soon as a byte differs */
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("\x93NUMPZ\x01\x00\x76\x00", 10, &off, &err),
	            TS_INVALID_ARGUMENT, "BAD_NPY_HEADER", "bad magic '\\x93NUMPZ'");
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("PK\x03", 3, &off, &err), TS_INVALID_ARGUMENT,
	            "BAD_NPY_HEADER", "bad magic 'PK\\x03'");
	/* too short to decide */
	for (size_t n = 0; n < 10; n++) {
		ts_error_clear(&err);
		check_error(&err, ts_npy_preamble(good, n, &off, &err), TS_UNAVAILABLE,
		            "NEED_MORE_BYTES", "need more bytes");
	}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_npy_preamble(good, 10, &off, &err), TS_OK);
	ck_assert_uint_eq(off, 128);
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("\x93NUMPY\x02\x00\x76\x00\x00", 11, &off, &err),
	            TS_UNAVAILABLE, "NEED_MORE_BYTES", "need more bytes (have 11, need 12)");
	/* versions */
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("\x93NUMPY\x04\x00\x76\x00\x00\x00", 12, &off, &err),
	            TS_INVALID_ARGUMENT, "BAD_NPY_HEADER", "unsupported version 4.0");
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("\x93NUMPY\x01\x01\x76\x00\x00\x00", 12, &off, &err),
	            TS_INVALID_ARGUMENT, "BAD_NPY_HEADER", "unsupported version 1.1");
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("\x93NUMPY\x00\x00\x76\x00\x00\x00", 12, &off, &err),
	            TS_INVALID_ARGUMENT, "BAD_NPY_HEADER", "unsupported version 0.0");
	/* header length past the cap */
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12, &off, &err),
	            TS_INVALID_ARGUMENT, "BAD_NPY_HEADER",
	            "header length 4294967295 exceeds the 1048576-byte limit");
	ts_error_clear(&err);
	ck_assert_int_eq(ts_npy_preamble("\x93NUMPY\x03\x00\xf4\xff\x0f\x00", 12, &off, &err),
	                 TS_OK);
	ck_assert_uint_eq(off, TS_NPY_PREAMBLE_MAX);
	ts_error_clear(&err);
	check_error(&err, ts_npy_preamble("\x93NUMPY\x03\x00\xf5\xff\x0f\x00", 12, &off, &err),
	            TS_INVALID_ARGUMENT, "BAD_NPY_HEADER", "exceeds");
	/* truncated header: every prefix short of data_offset asks for more */
	len = npy_make(buf, sizeof buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': ()}");
	for (size_t n = 10; n < len; n++) {
		ts_error_clear(&err);
		check_error(&err, ts_npy_parse_header(buf, n, NULL, &h, &err), TS_UNAVAILABLE,
		            "NEED_MORE_BYTES", "need more bytes");
		ck_assert_int_eq(err.nmeta, 1);
		ck_assert_str_eq(err.meta[0].key, "need_bytes");
		ck_assert_str_eq(err.meta[0].value, "64");
	}
	ts_error_clear(&err);
	ck_assert_int_eq(ts_npy_parse_header(buf, len + 5, NULL, &h, &err), TS_OK);
	ck_assert_uint_eq(h.data_offset, len);
	/* a header length that cuts the dict short */
	buf[8] = 40;
	ts_error_clear(&err);
	check_error(&err, ts_npy_parse_header(buf, len, NULL, &h, &err), TS_INVALID_ARGUMENT,
	            "BAD_NPY_HEADER", "header dict is not closed");
	ts_error_clear(&err);
	buf[8] = 14;
	check_error(&err, ts_npy_parse_header(buf, len, NULL, &h, &err), TS_INVALID_ARGUMENT,
	            "BAD_NPY_HEADER", "unterminated string starting at offset 20");
}
END_TEST

START_TEST(test_npy_write_matches_numpy)
{
	for (size_t i = 0; i < ARRAY_LEN(numpy_write_cases); i++) {
		const struct numpy_write_case *c = &numpy_write_cases[i];
		char buf[TS_NPY_HEADER_MAX];
		size_t n = ts_npy_write_header(buf, sizeof buf, c->dtype, c->rank, c->shape);

		ck_assert_msg(n == c->len, "case %zu: %zu bytes, numpy writes %zu", i, n, c->len);
		ck_assert_msg(memcmp(buf, c->bytes, n) == 0, "case %zu: bytes differ", i);
		ck_assert_uint_eq(ts_npy_write_header(buf, c->len - 1, c->dtype, c->rank, c->shape), 0);
		ck_assert_uint_eq(ts_npy_write_header(buf, c->len, c->dtype, c->rank, c->shape), c->len);
	}
}
END_TEST

START_TEST(test_npy_write_parse_roundtrip)
{
	static const uint64_t shapes[][4] = {{0}, {5}, {2, 3}, {0, 5}, {1ull << 20, 1, 3},
	                                     {7, 0, 9, 1}};
	static const int ranks[] = {0, 1, 2, 2, 3, 4};
	uint64_t big[TS_MAX_RANK];
	char buf[TS_NPY_HEADER_MAX];
	struct ts_npy_header h;
	struct ts_error err;
	size_t n;

	for (int dt = 0; dt < TS_DT_COUNT; dt++) {
		const enum ts_dtype hint = (enum ts_dtype)dt;

		for (size_t s = 0; s < ARRAY_LEN(ranks); s++) {
			uint64_t nbytes;

			n = ts_npy_write_header(buf, sizeof buf, (enum ts_dtype)dt, ranks[s], shapes[s]);
			ck_assert_uint_gt(n, 0);
			ck_assert_uint_eq(n % 64, 0);
			ck_assert_int_eq(buf[n - 1], '\n');
			ts_error_clear(&err);
			ck_assert_msg(ts_npy_parse_header(buf, n, dt == TS_DT_BFLOAT16 ? &hint : NULL, &h,
			                                  &err) == TS_OK, "%s", err.message);
			ck_assert_int_eq(h.dtype, dt);
			ck_assert_int_eq(h.rank, ranks[s]);
			ck_assert_mem_eq(h.shape, shapes[s], sizeof(uint64_t) * (size_t)ranks[s]);
			ck_assert(!h.fortran_order && !h.big_endian);
			ck_assert_int_eq(h.dtype_from_hint, dt == TS_DT_BFLOAT16);
			ck_assert_uint_eq(h.data_offset, n);
			ck_assert(ts_shape_nbytes(ranks[s], shapes[s], (enum ts_dtype)dt, &nbytes));
			ck_assert_uint_eq(h.nbytes, nbytes);
		}
	}
	/* the widest header: rank 32 of 20-digit dimensions (the byte count
	 * overflows, so only the preamble is checked) */
	for (int i = 0; i < TS_MAX_RANK; i++)
		big[i] = UINT64_MAX - (uint64_t)i;
	n = ts_npy_write_header(buf, sizeof buf, TS_DT_FLOAT64, TS_MAX_RANK, big);
	ck_assert_uint_gt(n, 0);
	ck_assert_uint_le(n, TS_NPY_HEADER_MAX);
	ck_assert_uint_eq(n % 64, 0);
	ts_error_clear(&err);
	check_error(&err, ts_npy_parse_header(buf, n, NULL, &h, &err), TS_INVALID_ARGUMENT,
	            "BAD_NPY_HEADER", "needs more than 2^64 bytes");
	/* arguments outside the contract */
	ck_assert_uint_eq(ts_npy_write_header(buf, sizeof buf, TS_DT_COUNT, 0, NULL), 0);
	ck_assert_uint_eq(ts_npy_write_header(buf, sizeof buf, TS_DT_INT8, TS_MAX_RANK + 1, big), 0);
	ck_assert_uint_eq(ts_npy_write_header(buf, sizeof buf, TS_DT_INT8, -1, big), 0);
	ck_assert_uint_eq(ts_npy_write_header(buf, 10, TS_DT_INT8, 0, NULL), 0);
}
END_TEST

/* Element (i, j, k) of a 2x3x4 array, spread over `size` bytes. */
static void put_elem(unsigned char *p, size_t size, unsigned v)
{
	for (size_t b = 0; b < size; b++)
		p[b] = (unsigned char)(v + 31 * b);
}

START_TEST(test_npy_fortran_to_c)
{
	static const size_t sizes[] = {1, 2, 3, 4, 8};
	const uint64_t shape[3] = {2, 3, 4};

	for (size_t z = 0; z < ARRAY_LEN(sizes); z++) {
		size_t sz = sizes[z];
		unsigned char src[24 * 8], dst[24 * 8 + 1], want[8];

		for (unsigned i = 0; i < 2; i++)
			for (unsigned j = 0; j < 3; j++)
				for (unsigned k = 0; k < 4; k++)
					put_elem(src + (i + 2 * j + 6 * k) * sz, sz, 100 * i + 10 * j + k);
		memset(dst, 0xee, sizeof dst);
		ts_npy_fortran_to_c(dst, src, sz, 3, shape);
		for (unsigned i = 0; i < 2; i++)
			for (unsigned j = 0; j < 3; j++)
				for (unsigned k = 0; k < 4; k++) {
					put_elem(want, sz, 100 * i + 10 * j + k);
					ck_assert_mem_eq(dst + ((i * 3 + j) * 4 + k) * sz, want, sz);
				}
		ck_assert_uint_eq(dst[24 * sz], 0xee);           /* nothing past the end */
	}
	/* the typed view: int32 F-order 2x3 [[0,1,2],[3,4,5]] is stored 0,3,1,4,2,5 */
	{
		const int32_t f[6] = {0, 3, 1, 4, 2, 5};
		int32_t c[6];

		ts_npy_fortran_to_c(c, f, 4, 2, (uint64_t[]){2, 3});
		for (int i = 0; i < 6; i++)
			ck_assert_int_eq(c[i], i);
	}
	/* rank 0 and 1 copy; an empty array touches nothing */
	{
		int64_t a = 42, b = 0, v[3] = {1, 2, 3}, w[3] = {0};
		unsigned char e = 0x5a;

		ts_npy_fortran_to_c(&b, &a, 8, 0, NULL);
		ck_assert_int_eq(b, 42);
		ts_npy_fortran_to_c(w, v, 8, 1, (uint64_t[]){3});
		ck_assert_mem_eq(w, v, sizeof v);
		ts_npy_fortran_to_c(&e, v, 8, 3, (uint64_t[]){2, 0, 3});
		ck_assert_uint_eq(e, 0x5a);
	}
}
END_TEST

/* ---- safetensors ----------------------------------------------------------- */

/* A whole file: 8-byte length, json, then data_len zero bytes. */
static char *st_file(const char *json, uint64_t data_len, size_t *len)
{
	size_t n = strlen(json);
	char *buf = calloc(1, 8 + n + data_len + 1);

	ck_assert_ptr_nonnull(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (char)(((uint64_t)n >> (8 * i)) & 0xff);
	memcpy(buf + 8, json, n);
	*len = 8 + n + data_len;
	return buf;
}

static ts_status st_json(const char *json, struct ts_st_header *h, struct ts_error *err)
{
	ts_error_clear(err);
	return ts_st_parse_header(json, strlen(json), h, err);
}

static const struct ts_st_tensor *st_find(const struct ts_st_header *h, const char *name)
{
	for (size_t i = 0; i < h->ntensors; i++)
		if (strcmp(h->tensors[i].name, name) == 0)
			return &h->tensors[i];
	return NULL;
}

START_TEST(test_st_parses_reference_header)
{
	static const char *const order[] = {"s", "w", "h", "e", "m"};
	size_t len = sizeof ref_header - 1 + REF_HEADER_DATA_LEN;
	char *file = calloc(1, len);
	struct ts_st_header h;
	struct ts_error err;
	const struct ts_st_tensor *t;
	uint64_t n = 0;

	memcpy(file, ref_header, sizeof ref_header - 1);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_st_header_len(file, &n, &err), TS_OK);
	ck_assert_uint_eq(8 + n, sizeof ref_header - 1);
	ck_assert_uint_eq((8 + n) % 8, 0);
	ck_assert_msg(ts_st_parse_buffer(file, len, &h, &err) == TS_OK, "%s", err.message);
	ck_assert_uint_eq(h.header_len, n);
	ck_assert_uint_eq(h.data_len, REF_HEADER_DATA_LEN);
	ck_assert_uint_eq(h.ntensors, 5);
	for (size_t i = 0; i < 5; i++)
		ck_assert_str_eq(h.tensors[i].name, order[i]);     /* sorted by offset */
	t = st_find(&h, "w");
	ck_assert_int_eq(t->dtype, TS_DT_FLOAT32);
	ck_assert_int_eq(t->rank, 2);
	ck_assert_uint_eq(t->shape[0], 2);
	ck_assert_uint_eq(t->shape[1], 3);
	ck_assert_uint_eq(t->begin, 8);
	ck_assert_uint_eq(t->end, 32);
	t = st_find(&h, "s");
	ck_assert_int_eq(t->dtype, TS_DT_INT64);
	ck_assert_int_eq(t->rank, 0);
	t = st_find(&h, "e");
	ck_assert_int_eq(t->dtype, TS_DT_UINT8);
	ck_assert_uint_eq(t->begin, t->end);
	ck_assert_int_eq(st_find(&h, "m")->dtype, TS_DT_BOOL);
	ck_assert_int_eq(st_find(&h, "h")->dtype, TS_DT_FLOAT16);
	ck_assert_ptr_nonnull(h.metadata);
	ck_assert_str_eq(json_string_value(json_object_get(h.metadata, "format")), "np");
	ck_assert_int_eq(ts_st_check_total(&h, len, &err), TS_OK);
	ts_st_header_release(&h);
	ck_assert_ptr_null(h.tensors);
	ck_assert_ptr_null(h.metadata);
	ts_st_header_release(&h);                              /* twice is harmless */
	free(file);
}
END_TEST

START_TEST(test_st_accepts_valid_headers)
{
	static const struct {
		const char *json;
		size_t ntensors;
		uint64_t data_len;
		bool metadata;
	} ok[] = {
		{"{}", 0, 0, false},
		{"{\"__metadata__\":{}}", 0, 0, true},
		{"{\"__metadata__\":null,\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}",
		 1, 3, false},
		{"{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 1, 16, false},
		{"{\"b\":{\"data_offsets\":[8,16],\"shape\":[2],\"dtype\":\"I32\"},"
		 "\"a\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}", 2, 16, false},
		{"{\"z\":{\"dtype\":\"BF16\",\"shape\":[0,7],\"data_offsets\":[0,0]},"
		 "\"y\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		 "\"x\":{\"dtype\":\"U64\",\"shape\":[0],\"data_offsets\":[1,1]}}", 3, 1, false},
		{"{\"a\":{\"dtype\":\"I16\",\"shape\":[1,1,1],\"data_offsets\":[0,2]},"
		 "\"__metadata__\":{\"k\":\"v\",\"\xc3\xa9\":\"\xe2\x82\xac\"}}     ", 1, 2, true},
		{"{\"\xe6\x9d\x83\xe9\x87\x8d\":{\"dtype\":\"U16\",\"shape\":[2],\"data_offsets\":[0,4]}}"
		 "\n \t", 1, 4, false},
	};

	for (size_t i = 0; i < ARRAY_LEN(ok); i++) {
		struct ts_st_header h;
		struct ts_error err;
		size_t len;
		char *file = st_file(ok[i].json, ok[i].data_len, &len);

		ck_assert_msg(st_json(ok[i].json, &h, &err) == TS_OK, "%s: %s", ok[i].json,
		              err.message);
		ck_assert_uint_eq(h.ntensors, ok[i].ntensors);
		ck_assert_uint_eq(h.data_len, ok[i].data_len);
		ck_assert_int_eq(h.metadata != NULL, ok[i].metadata);
		ck_assert_uint_eq(h.header_len, strlen(ok[i].json));
		for (size_t t = 1; t < h.ntensors; t++)
			ck_assert_uint_le(h.tensors[t - 1].end, h.tensors[t].begin);
		ck_assert_int_eq(ts_st_check_total(&h, len, &err), TS_OK);
		ts_st_header_release(&h);
		ck_assert_msg(ts_st_parse_buffer(file, len, &h, &err) == TS_OK, "%s", err.message);
		ts_st_header_release(&h);
		free(file);
	}
}
END_TEST

#define T(name, body) "\"" name "\":{" body "}"

START_TEST(test_st_refuses_malformed_headers)
{
	static const struct {
		const char *json;
		const char *needle;
	} bad[] = {
		{"", "header does not start with '{'"},
		{"[1]", "header does not start with '{'"},
		{" {}", "header does not start with '{'"},
		{"\"{\"", "header does not start with '{'"},
		{"{", "header is not valid JSON"},
		{"{\"a\":1,}", "header is not valid JSON"},
		{"{} x", "header is not valid JSON"},
		{"{}\n{}", "header is not valid JSON"},
		{"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		 "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
		 "duplicate object key"},
		{"{\"" "\xff" "\":{}}", "header is not valid JSON: unable to decode byte 0xff"},
		{"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}\xc3",
		 "header is not valid JSON"},
		{"{\"__metadata__\":{\"k\":\"\xed\xa0\x80\"}}", "header is not valid JSON"},
		{"{" T("w", "\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]") "}",
		 "tensor 'w': unknown dtype 'F8_E4M3'"},
		{"{" T("w", "\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]") "}",
		 "tensor 'w': unknown dtype 'f32'"},
		{"{" T("w", "\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]") "}",
		 "tensor 'w': dtype must be a string"},
		{"{" T("w", "\"shape\":[1],\"data_offsets\":[0,4]") "}",
		 "tensor 'w': missing field 'dtype'"},
		{"{" T("w", "\"dtype\":\"F32\",\"data_offsets\":[0,4]") "}",
		 "tensor 'w': missing field 'shape'"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1]") "}",
		 "tensor 'w': missing field 'data_offsets'"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1") "}",
		 "tensor 'w': unknown field 'x'"},
		{"{\"w\":[1]}", "tensor 'w' is not an object"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,4]") "}",
		 "tensor 'w': shape entry 1 (-1) is not a non-negative integer"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]") "}",
		 "tensor 'w': shape entry 0 (1.5) is not a non-negative integer"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]") "}",
		 "tensor 'w': shape entry 0 (a string) is not a non-negative integer"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]") "}",
		 "tensor 'w': shape must be an array"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
		           "1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]") "}",
		 "tensor 'w': rank 33 exceeds the maximum of 32"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
		           "\"data_offsets\":[0,4]") "}",
		 "tensor 'w': F32 shape [4294967296, 4294967296] needs more than 2^64 bytes"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]") "}",
		 "tensor 'w': data_offsets [4, 0] are reversed"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]") "}",
		 "tensor 'w': data_offsets must be an array [begin, end]"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]") "}",
		 "tensor 'w': data_offsets must be an array [begin, end]"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]") "}",
		 "tensor 'w': data_offsets [-4, 0] are not non-negative integers"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]") "}",
		 "tensor 'w': data_offsets [0, 12] hold 12 bytes but F32 shape [2, 2] needs 16"},
		{"{" T("a", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]") ","
		     T("b", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]") "}",
		 "gap of 2 bytes between tensor 'a' (ends at 4) and tensor 'b' (begins at 6)"},
		{"{" T("a", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]") ","
		     T("b", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]") "}",
		 "tensors 'a' [0, 4) and 'b' [2, 6) overlap"},
		{"{" T("b", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]") ","
		     T("a", "\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]") "}",
		 "tensors 'a' [0, 4) and 'b' [0, 4) overlap"},
		{"{" T("a", "\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]") ","
		     T("z", "\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]") "}",
		 "tensors 'a' [0, 8) and 'z' [4, 4) overlap"},
		{"{" T("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]") "}",
		 "tensor 'w' begins at 4: the first tensor must begin at 0"},
		{"{\"__metadata__\":{\"k\":1}}", "__metadata__ value of 'k' is 1, not a string"},
		{"{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}",
		 "__metadata__ value of 'k' is an object, not a string"},
		{"{\"__metadata__\":[\"k\"]}", "__metadata__ must be an object of strings, not an array"},
		{"{\"__metadata__\":\"k\"}", "__metadata__ must be an object of strings, not a string"},
	};

	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		struct ts_st_header h;
		struct ts_error err;
		ts_status st = st_json(bad[i].json, &h, &err);

		ck_assert_msg(st != TS_OK, "accepted %s", bad[i].json);
		check_error(&err, st, TS_INVALID_ARGUMENT, "BAD_SAFETENSORS_HEADER", bad[i].needle);
	}
}
END_TEST

START_TEST(test_st_refuses_bad_lengths)
{
	static const char json[] = "{" T("w", "\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]")
	                           "}";
	unsigned char first8[8] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0};  /* 100000001 */
	struct ts_st_header h;
	struct ts_error err;
	uint64_t n = 0;
	size_t len;
	char *file;

	ts_error_clear(&err);
	check_error(&err, ts_st_header_len(first8, &n, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "exceeds the 100000000-byte limit");
	ck_assert_ptr_null(strstr(err.message, "100000001"));
	first8[0] = 0x00;                                        /* exactly 100 MB is allowed */
	ts_error_clear(&err);
	ck_assert_int_eq(ts_st_header_len(first8, &n, &err), TS_OK);
	ck_assert_uint_eq(n, 100000000);
	memset(first8, 0xff, 8);
	ts_error_clear(&err);
	check_error(&err, ts_st_header_len(first8, &n, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "header length in the first 8 bytes exceeds");
	ck_assert_ptr_null(strstr(err.message, "18446744073709551615"));

	file = st_file(json, 8, &len);
	/* N larger than the bytes supplied */
	file[0] = (char)(strlen(json) + 9);
	ts_error_clear(&err);
	check_error(&err, ts_st_parse_buffer(file, strlen(json) + 16, &h, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "exceeds the 62 bytes that follow it");
	file[0] = (char)strlen(json);
	ts_error_clear(&err);
	check_error(&err, ts_st_parse_buffer(file, 7, &h, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "file is 7 bytes, too short");
	/* trailing bytes and truncation */
	ck_assert_int_eq(st_json(json, &h, &err), TS_OK);
	ck_assert_int_eq(ts_st_check_total(&h, len, &err), TS_OK);
	check_error(&err, ts_st_check_total(&h, len + 3, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER",
	            "3 trailing bytes: file is 73 bytes, but 8 + 54 (header) + 8 (data) = 70");
	ck_assert_str_eq(err.meta[0].key, "expected_bytes");
	ck_assert_str_eq(err.meta[0].value, "70");
	ck_assert_str_eq(err.meta[1].value, "73");
	ts_error_clear(&err);
	check_error(&err, ts_st_check_total(&h, len - 1, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER",
	            "file is truncated: 69 bytes, but 8 + 54 (header) + 8 (data) = 70 are needed");
	ts_error_clear(&err);
	check_error(&err, ts_st_check_total(&h, 0, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "file is truncated");
	ts_error_clear(&err);
	check_error(&err, ts_st_parse_buffer(file, len + 1, &h, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "1 trailing bytes");
	ts_error_clear(&err);
	check_error(&err, ts_st_parse_buffer(file, len - 8, &h, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "file is truncated");
	h.data_len = UINT64_MAX - 20;
	ts_error_clear(&err);
	check_error(&err, ts_st_check_total(&h, 5, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "more than any file holds");
	ts_st_header_release(&h);
	free(file);
}
END_TEST

static void st_tensor(struct ts_st_tensor *t, const char *name, enum ts_dtype dt, int rank,
                      const uint64_t *shape)
{
	memset(t, 0, sizeof *t);
	t->name = (char *)name;
	t->dtype = dt;
	t->rank = rank;
	if (rank)
		memcpy(t->shape, shape, sizeof(uint64_t) * (size_t)rank);
	t->begin = 777;
	t->end = 3;
}

START_TEST(test_st_build_parse_roundtrip)
{
	struct ts_st_tensor in[6];
	json_t *meta = json_pack("{s:s, s:s}", "format", "pt", "\xc3\xa9t\xc3\xa9", "\"q\\\"");
	struct ts_st_header h;
	struct ts_error err;
	char *out = NULL, *file;
	size_t out_len = 0;
	uint64_t n = 0, at = 0;

	st_tensor(&in[0], "layer.0.weight", TS_DT_BFLOAT16, 2, (uint64_t[]){3, 5});
	st_tensor(&in[1], "scalar", TS_DT_FLOAT64, 0, NULL);
	st_tensor(&in[2], "empty", TS_DT_INT32, 2, (uint64_t[]){0, 9});
	st_tensor(&in[3], "mask", TS_DT_BOOL, 1, (uint64_t[]){7});
	st_tensor(&in[4], "\xe6\x9d\x83\xe9\x87\x8d \"quoted\"", TS_DT_UINT64, 3,
	          (uint64_t[]){1, 2, 1});
	st_tensor(&in[5], "zero", TS_DT_FLOAT16, 1, (uint64_t[]){0});
	ts_error_clear(&err);
	ck_assert_msg(ts_st_build_header(in, 6, meta, &out, &out_len, &err) == TS_OK, "%s",
	              err.message);
	ck_assert_uint_eq(out_len % 8, 0);
	ck_assert_int_eq(ts_st_header_len(out, &n, &err), TS_OK);
	ck_assert_uint_eq(8 + n, out_len);
	ck_assert_int_eq(out[8], '{');
	for (int i = 0; i < 6; i++) {
		uint64_t nbytes;

		ck_assert(ts_shape_nbytes(in[i].rank, in[i].shape, in[i].dtype, &nbytes));
		ck_assert_uint_eq(in[i].begin, at);
		ck_assert_uint_eq(in[i].end, at + nbytes);
		at += nbytes;
	}
	ck_assert_uint_eq(at, 30 + 8 + 0 + 7 + 16 + 0);

	file = calloc(1, out_len + at);
	memcpy(file, out, out_len);
	ck_assert_msg(ts_st_parse_buffer(file, out_len + at, &h, &err) == TS_OK, "%s", err.message);
	ck_assert_uint_eq(h.ntensors, 6);
	ck_assert_uint_eq(h.data_len, at);
	for (int i = 0; i < 6; i++) {
		const struct ts_st_tensor *t = st_find(&h, in[i].name);

		ck_assert_ptr_nonnull(t);
		ck_assert_int_eq(t->dtype, in[i].dtype);
		ck_assert_int_eq(t->rank, in[i].rank);
		ck_assert_mem_eq(t->shape, in[i].shape, sizeof(uint64_t) * (size_t)in[i].rank);
		ck_assert_uint_eq(t->begin, in[i].begin);
		ck_assert_uint_eq(t->end, in[i].end);
	}
	ck_assert(json_equal(h.metadata, meta));
	ts_st_header_release(&h);
	free(file);
	free(out);

	/* no tensors, no metadata: "{}" padded to 8 */
	ck_assert_int_eq(ts_st_build_header(NULL, 0, NULL, &out, &out_len, &err), TS_OK);
	ck_assert_uint_eq(out_len, 16);
	ck_assert_mem_eq(out, "\x08\0\0\0\0\0\0\0{}      ", 16);
	ck_assert_int_eq(ts_st_parse_buffer(out, out_len, &h, &err), TS_OK);
	ck_assert_uint_eq(h.ntensors, 0);
	ck_assert_ptr_null(h.metadata);
	ts_st_header_release(&h);
	free(out);
	json_decref(meta);
}
END_TEST

START_TEST(test_st_build_refuses)
{
	struct ts_st_tensor in[2];
	json_t *meta = json_pack("{s:i}", "k", 1), *arr = json_array();
	struct ts_error err;
	char *out = (char *)"untouched";
	size_t out_len = 42;
	static const struct {
		const char *name0, *name1;
		enum ts_dtype dt;
		int rank;
		uint64_t d0;
		const char *needle;
	} bad[] = {
		{"a", "a", TS_DT_INT8, 1, 1, "duplicate tensor name 'a'"},
		{"a", "__metadata__", TS_DT_INT8, 1, 1, "tensor 1: the name '__metadata__' is reserved"},
		{"a", "b\xff", TS_DT_INT8, 1, 1, "tensor 1: name 'b\xff' is not valid UTF-8"},
		{"a", "\xed\xa0\x80", TS_DT_INT8, 1, 1, "is not valid UTF-8"},
		{"a", "\xc0\xaf", TS_DT_INT8, 1, 1, "is not valid UTF-8"},
		{"a", NULL, TS_DT_INT8, 1, 1, "tensor 1 has no name"},
		{"a", "b", TS_DT_COUNT, 1, 1, "tensor 'b': dtype 13 is not a known dtype"},
		{"a", "b", TS_DT_INT8, 33, 1, "tensor 'b': rank 33 is outside [0, 32]"},
		{"a", "b", TS_DT_INT8, -1, 1, "tensor 'b': rank -1 is outside [0, 32]"},
		{"a", "b", TS_DT_INT8, 1, 1ull << 63, "tensor 'b': shape entry 0 (9223372036854775808)"},
		{"a", "b", TS_DT_FLOAT64, 1, 1ull << 62, "needs more than 2^64 bytes"},
		{"a", "b", TS_DT_INT8, 1, (1ull << 63) - 1, "tensor 'b': data_offsets would pass"},
	};

	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		st_tensor(&in[0], bad[i].name0, TS_DT_INT8, 1, (uint64_t[]){1});
		st_tensor(&in[1], bad[i].name1, bad[i].dt, 0, NULL);
		in[1].rank = bad[i].rank;
		in[1].shape[0] = bad[i].d0;
		ts_error_clear(&err);
		check_error(&err, ts_st_build_header(in, 2, NULL, &out, &out_len, &err),
		            TS_INVALID_ARGUMENT, "BAD_SAFETENSORS_HEADER", bad[i].needle);
		ck_assert_uint_eq(in[0].begin, 777);               /* untouched on failure */
		ck_assert_uint_eq(in[1].end, 3);
		ck_assert_str_eq(out, "untouched");
		ck_assert_uint_eq(out_len, 42);
	}
	st_tensor(&in[0], "a", TS_DT_INT8, 1, (uint64_t[]){1});
	ts_error_clear(&err);
	check_error(&err, ts_st_build_header(in, 1, meta, &out, &out_len, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "__metadata__ value of 'k' is 1, not a string");
	ts_error_clear(&err);
	check_error(&err, ts_st_build_header(in, 1, arr, &out, &out_len, &err), TS_INVALID_ARGUMENT,
	            "BAD_SAFETENSORS_HEADER", "__metadata__ must be an object of strings, not an array");
	json_decref(meta);
	json_decref(arr);
}
END_TEST

/* jansson's allocations fail once `budget` of them have succeeded (test-only
 * state; each Check case runs in its own process). */
static int budget;

static void *budget_malloc(size_t n)
{
	if (budget == 0)
		return NULL;
	budget--;
	return malloc(n);
}

START_TEST(test_st_out_of_memory_is_a_value)
{
	struct ts_st_tensor in[3];
	json_t *meta = json_pack("{s:s}", "format", "pt");
	bool built = false, parsed = false;

	st_tensor(&in[0], "a", TS_DT_FLOAT32, 2, (uint64_t[]){2, 2});
	st_tensor(&in[1], "b", TS_DT_INT8, 0, NULL);
	st_tensor(&in[2], "c", TS_DT_UINT16, 1, (uint64_t[]){3});
	for (int k = 0; k < 1000 && !(built && parsed); k++) {
		struct ts_st_header h;
		struct ts_error err;
		char *out = NULL;
		size_t out_len;
		ts_status st;

		ts_error_clear(&err);
		budget = k;
		json_set_alloc_funcs(budget_malloc, free);
		st = ts_st_build_header(in, 3, meta, &out, &out_len, &err);
		json_set_alloc_funcs(malloc, free);
		if (st == TS_OK) {
			built = true;
			free(out);
		} else {
			check_error(&err, st, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", "out of memory for");
		}
		ts_error_clear(&err);
		budget = k;
		json_set_alloc_funcs(budget_malloc, free);
		st = ts_st_parse_header(ref_header + 8, sizeof ref_header - 9, &h, &err);
		json_set_alloc_funcs(malloc, free);
		if (st == TS_OK) {
			parsed = true;
			ck_assert_uint_eq(h.ntensors, 5);
			ts_st_header_release(&h);
		} else if (st == TS_INVALID_ARGUMENT) {
			/* jansson reports some failed allocations inside its lexer as
			 * syntax errors; they are still values, never aborts */
			check_error(&err, st, TS_INVALID_ARGUMENT, "BAD_SAFETENSORS_HEADER",
			            "header is not valid JSON");
		} else {
			check_error(&err, st, TS_RESOURCE_EXHAUSTED, "OUT_OF_MEMORY", "out of memory for");
		}
	}
	ck_assert(built && parsed);
	json_decref(meta);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("codecs");
	TCase *dtype = tcase_create("dtype");
	TCase *npy = tcase_create("npy");
	TCase *st = tcase_create("safetensors");

	tcase_add_test(dtype, test_dtype_tables_roundtrip);
	tcase_add_test(dtype, test_dtype_rejects_other_names);
	tcase_add_test(dtype, test_shape_nbytes_overflow);
	tcase_add_test(dtype, test_byteswap_in_place);
	suite_add_tcase(s, dtype);

	tcase_add_test(npy, test_npy_parses_numpy_headers);
	tcase_add_test(npy, test_npy_accepts_python_literal_variants);
	tcase_add_test(npy, test_npy_refuses_malformed_dicts);
	tcase_add_test(npy, test_npy_rank_limit);
	tcase_add_test(npy, test_npy_refuses_bad_preambles);
	tcase_add_test(npy, test_npy_write_matches_numpy);
	tcase_add_test(npy, test_npy_write_parse_roundtrip);
	tcase_add_test(npy, test_npy_fortran_to_c);
	suite_add_tcase(s, npy);

	tcase_add_test(st, test_st_parses_reference_header);
	tcase_add_test(st, test_st_accepts_valid_headers);
	tcase_add_test(st, test_st_refuses_malformed_headers);
	tcase_add_test(st, test_st_refuses_bad_lengths);
	tcase_add_test(st, test_st_build_parse_roundtrip);
	tcase_add_test(st, test_st_build_refuses);
	tcase_add_test(st, test_st_out_of_memory_is_a_value);
	suite_add_tcase(s, st);
	return s;
}
