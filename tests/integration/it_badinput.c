/*
 * it_badinput.c - Check suite "badinput": a table of malformed requests
 * against every endpoint of a real daemon, as a hostile or careless client
 * sends them: NUL bytes and invalid UTF-8 in paths, query values and
 * headers, overlong names, huge and negative numbers, wrong JSON types,
 * duplicate keys, deep nesting, wrong content types, bad index expressions
 * and shardings, unknown query parameters, unknown custom methods and wrong
 * methods.
 *
 * Each row is answered with its HTTP status in the google.rpc.Status shape
 * (error.code, error.status the canonical name of that status, a message
 * that names the problem, an ErrorInfo). After the whole table the daemon
 * still answers, and what it holds is what it held before: the same arrays
 * (bytes and ETags), models, shardings and operations, and the same bytes
 * in use in every memory space. Failures are collected and reported
 * together, so one run shows every row that is wrong.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct th_daemon D;

/* Placeholders a row's path or body may hold, filled in at run time. */
#define L300 "@L300@"     /* 300 'a's: longer than any path parameter */
#define L129 "@L129@"     /* 129 'a's: one more than a name may hold */
/* and "sim:N" (N in 0..7) is the backend's device N (th_dev): the table runs
 * on the stand-in's GPUs too */

#define H(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A body with its exact length (for bodies holding NUL bytes). */
#define LIT(s) s, sizeof(s) - 1

struct bad {
	const char *method, *path;
	const char *const *headers;
	const char *body;               /* NULL: none; "@DEEP@", "@BIG@": generated */
	size_t body_len;                /* 0: strlen(body) */
	long http;
	const char *status;             /* NULL: the canonical one of http */
	const char *reason;             /* NULL: any */
	const char *msg;                /* a substring of error.message */
};

#define JSON_CT H("Content-Type: application/json")
#define PUTA "/v1/arrays/n1?dtype=uint8&shape=2"
#define IDX "/v1/arrays/a/data?index="
#define WAITOP "/v1/operations/nosuch:wait"
#define MLP "\"mlp\": {\"layers\": 1, \"d_model\": 4}"

static const struct bad rows[] = {
	/* ---- NUL and invalid UTF-8 in the path ---- */
	{"GET", "/v1/arrays/a%00b", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"PUT", "/v1/arrays/a%00b?dtype=uint8&shape=2", NULL, "xy", 0, 400, NULL, "BAD_ENCODING",
	 "NUL"},
	{"DELETE", "/v1/arrays/a%00", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"POST", "/v1/arrays/a%00x:put", NULL, "{}", 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"GET", "/v1/arrays/%ff", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/arrays/%c0%af", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/arrays/%ed%a0%80", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/arrays/ab%e2%82", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/devices/sim:0%00x", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"GET", "/v1/devices/%f4%90%80%80", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/operations/op%00x", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"POST", "/v1/operations/op%ff:cancel", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/models/m%00", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"DELETE", "/v1/models/m%c0%80", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"GET", "/v1/shardings/s1%ff", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/nothing%ff", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/livez%00", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},

	/* ---- names and ids too long ---- */
	{"GET", "/v1/arrays/" L300, NULL, NULL, 0, 400, NULL, "BAD_ARRAY_NAME", "300 bytes long"},
	{"PUT", "/v1/arrays/" L300 "?dtype=uint8&shape=1", NULL, "x", 0, 400, NULL,
	 "BAD_ARRAY_NAME", "longer than the 128"},
	{"DELETE", "/v1/arrays/" L300, NULL, NULL, 0, 400, NULL, "BAD_ARRAY_NAME", "array name"},
	{"GET", "/v1/arrays/" L300 "/data", NULL, NULL, 0, 400, NULL, "BAD_ARRAY_NAME", "array"},
	{"POST", "/v1/arrays/" L300 ":put", NULL, "{}", 0, 400, NULL, "BAD_ARRAY_NAME", "array"},
	{"GET", "/v1/arrays/" L129, NULL, NULL, 0, 400, NULL, "BAD_ARRAY_NAME", "129 bytes long"},
	{"PUT", "/v1/arrays/" L129 "?dtype=uint8&shape=1", NULL, "x", 0, 400, NULL,
	 "BAD_ARRAY_NAME", "129 bytes"},
	{"GET", "/v1/arrays/" L129 "/sharding", NULL, NULL, 0, 400, NULL, "BAD_ARRAY_NAME",
	 "array name"},
	{"POST", "/v1/arrays/" L129 ":gather", NULL, "{}", 0, 400, NULL, "BAD_ARRAY_NAME",
	 "array name"},
	{"GET", "/v1/models/" L129, NULL, NULL, 0, 400, NULL, "BAD_MODEL_NAME", "100"},
	{"DELETE", "/v1/models/" L129, NULL, NULL, 0, 400, NULL, "BAD_MODEL_NAME", "model name"},
	{"GET", "/v1/models/" L300, NULL, NULL, 0, 400, NULL, "BAD_MODEL_NAME", "model"},
	{"POST", "/v1/models/" L300 ":step", NULL, "{}", 0, 400, NULL, "BAD_MODEL_NAME", "model"},
	{"POST", "/v1/models/" L300 ":evaluate", NULL, "{}", 0, 400, NULL, "BAD_MODEL_NAME",
	 "model"},
	{"GET", "/v1/shardings/" L300, NULL, NULL, 0, 400, NULL, "BAD_SHARDING_NAME", "sharding"},
	{"GET", "/v1/shardings/" L129, NULL, NULL, 0, 400, NULL, "BAD_SHARDING_NAME", "128"},
	{"GET", "/v1/operations/" L300, NULL, NULL, 0, 400, NULL, "BAD_OPERATION_ID", "operation"},
	{"GET", "/v1/devices/" L300, NULL, NULL, 0, 400, NULL, "BAD_DEVICE_ID", "device"},
	{"GET", "/v1/devices/" L300 "/memory_stats", NULL, NULL, 0, 400, NULL, "BAD_DEVICE_ID",
	 "device"},

	/* ---- unknown paths and custom methods: 404 ---- */
	{"POST", "/v1/models/m:forward", NULL, "{}", 0, 404, NULL, "ROUTE_NOT_FOUND", "m:forward"},
	{"POST", "/v1/arrays/a:reshape", NULL, "{}", 0, 404, NULL, "ROUTE_NOT_FOUND", "a:reshape"},
	{"GET", "/v1/arrays/a:reshape", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "a:reshape"},
	{"POST", "/v1/arrays:reshape", NULL, "{}", 0, 404, NULL, "ROUTE_NOT_FOUND", "reshape"},
	{"POST", "/v1/operations/x:retry", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "retry"},
	{"POST", "/v1/shardings/s1:withDevice", NULL, "{}", 0, 404, NULL, "ROUTE_NOT_FOUND",
	 "withDevice"},
	{"POST", "/v1/memory:reset", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "reset"},
	{"GET", "/v1/devices/sim:zero", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "sim:zero"},
	{"GET", "/v1/nothing", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "/v1/nothing"},
	{"GET", "/v1/arrays/a/b/c", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "/v1/arrays/a/b/c"},
	{"GET", "/v1/arrays/a/data/x", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "data/x"},
	{"GET", "/v2/arrays", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "/v2/arrays"},
	{"GET", "/", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "'/'"},
	{"GET", "/v1//arrays", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "//"},
	{"GET", "/v1/arrays/", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "/v1/arrays/"},
	{"GET", "/v1/nothing?x=1", NULL, NULL, 0, 404, NULL, "ROUTE_NOT_FOUND", "/v1/nothing"},

	/* ---- wrong methods: 405, not UNIMPLEMENTED ---- */
	{"POST", "/v1/devices", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "GET, HEAD"},
	{"DELETE", "/v1/memory", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "not allowed"},
	{"PUT", "/v1/models", NULL, "{}", 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "POST"},
	{"PATCH", "/v1/arrays/a", NULL, "{}", 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "PATCH"},
	{"POST", "/v1/arrays/a", NULL, "{}", 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "PUT"},
	{"GET", "/v1/arrays/a:put", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "POST"},
	{"GET", "/v1/memory:resetPeak", NULL, NULL, 0, 405, "INVALID_ARGUMENT",
	 "METHOD_NOT_ALLOWED", "POST"},
	{"POST", "/livez", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED", "GET"},
	{"DELETE", "/v1/operations", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "GET"},
	{"PUT", "/v1/arrays:import", NULL, "x", 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "POST"},
	{"GET", "/v1/models/m:step", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "POST"},
	{"GET", "/v1/models/m:evaluate", NULL, NULL, 0, 405, "INVALID_ARGUMENT",
	 "METHOD_NOT_ALLOWED", "POST"},
	{"GE\"T", "/v1/devices", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "GE\"T"},
	{"DELETE", "/v1/shardings/s1", NULL, NULL, 0, 405, "INVALID_ARGUMENT", "METHOD_NOT_ALLOWED",
	 "GET"},

	/* ---- unknown, repeated and empty query parameters ---- */
	{"PUT", PUTA "&memory_knd=device", NULL, "xy", 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'memory_knd'"},
	{"PUT", PUTA "&memory_knd=device", NULL, "xy", 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "memory_kind"},
	{"GET", "/v1/arrays?page_sise=2", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "page_size, page_token"},
	{"GET", "/v1/backends?x=1", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "no query parameters"},
	{"GET", "/v1/memory?x=1", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "it takes host"},
	/* another node's view: a daemon without a fleet knows no other host */
	{"GET", "/v1/memory?host=", NULL, NULL, 0, 400, NULL, "BAD_HOST", "host"},
	{"GET", "/v1/memory/history?host=elsewhere", NULL, NULL, 0, 404, NULL, "HOST_NOT_FOUND",
	 "'elsewhere'"},
	{"GET", "/v1/devices?verbose=true", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'verbose'"},
	{"GET", "/v1/arrays/a?format=json", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'format'"},
	{"GET", IDX "0&indx=1", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER", "'indx'"},
	{"POST", "/v1/arrays/a:put?wiat=true", NULL, "{\"memory_kind\": \"pinned_host\"}", 0, 400,
	 NULL, "UNKNOWN_QUERY_PARAMETER", "'wiat'"},
	{"POST", "/v1/arrays/a:copy?force=true&wait=true", NULL, "{\"out\": {\"name\": \"c\"}}",
	 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER", "'force'"},
	{"GET", "/v1/operations?page_token=x", NULL, NULL, 0, 400, NULL, "BAD_PAGE_TOKEN", "'x'"},
	{"GET", "/v1/operations?page_tokn=x", NULL, NULL, 0, 400, NULL,
	 "UNKNOWN_QUERY_PARAMETER", "'page_tokn'"},
	{"GET", "/v1/arrays:export?name=a", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'name'"},
	{"POST", "/v1/arrays:import?prefx=x", NULL, "x", 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'prefx'"},
	{"GET", "/livez?probe=1", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER", "'probe'"},
	{"GET", "/metrics?format=json", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'format'"},
	{"POST", "/v1/models?async=true", NULL, "{}", 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'async'"},
	{"GET", "/v1/arrays?Device=sim:0", NULL, NULL, 0, 400, NULL, "UNKNOWN_QUERY_PARAMETER",
	 "'Device'"},
	{"GET", "/v1/arrays?device=sim:0&device=sim:1", NULL, NULL, 0, 400, NULL,
	 "DUPLICATE_QUERY_PARAMETER", "'device'"},
	{"PUT", "/v1/arrays/n1?dtype=uint8&dtype=int8&shape=2", NULL, "xy", 0, 400, NULL,
	 "DUPLICATE_QUERY_PARAMETER", "'dtype'"},
	{"POST", WAITOP "?timeout=1s&timeout=2s", NULL, NULL, 0, 400, NULL,
	 "DUPLICATE_QUERY_PARAMETER", "'timeout'"},
	{"GET", "/v1/arrays?device", NULL, NULL, 0, 400, NULL, "BAD_QUERY_PARAMETER",
	 "has no value"},
	{"POST", "/v1/arrays/a:put?wait", NULL, "{}", 0, 400, NULL, "BAD_QUERY_PARAMETER",
	 "'wait'"},
	{"POST", "/v1/arrays/a:put?wait=yes", NULL, "{}", 0, 400, NULL, "BAD_QUERY_PARAMETER",
	 "true or false"},
	{"POST", "/v1/arrays/a:put?wait=1", NULL, "{}", 0, 400, NULL, "BAD_QUERY_PARAMETER",
	 "true or false"},
	{"POST", "/v1/arrays:import?overwrite=no", NULL, "x", 0, 400, NULL, "BAD_QUERY_PARAMETER",
	 "'overwrite'"},
	{"POST", "/v1/models/m:step?wait=maybe", NULL, "{}", 0, 400, NULL, "BAD_QUERY_PARAMETER",
	 "'wait'"},
	{"POST", "/v1/models/m:evaluate?wait=maybe", NULL, "{}", 0, 400, NULL,
	 "BAD_QUERY_PARAMETER", "'wait'"},

	/* ---- NUL and invalid UTF-8 in query keys and values ---- */
	{"GET", "/v1/arrays?device=sim:0%00x", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"PUT", PUTA "&device=sim:0%00x", NULL, "xy", 0, 400, NULL, "BAD_ENCODING", "'device'"},
	{"PUT", PUTA "&memory_kind=device%00", NULL, "xy", 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"PUT", "/v1/arrays/n1?dtype=uint8%00&shape=2", NULL, "xy", 0, 400, NULL, "BAD_ENCODING",
	 "'dtype'"},
	{"PUT", "/v1/arrays/n1?dtype=uint8&shape=2%002", NULL, "xy", 0, 400, NULL, "BAD_ENCODING",
	 "'shape'"},
	{"GET", "/v1/arrays?memory_kind=%ff", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", IDX "%ff", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "'index'"},
	{"GET", IDX "0%00", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"PUT", PUTA "&sharding=%ff", NULL, "xy", 0, 400, NULL, "BAD_ENCODING", "'sharding'"},
	{"PUT", PUTA "&sharding=%7b%22device%22%3a%22sim%3a0%ff%22%7d", NULL, "xy", 0, 400, NULL,
	 "BAD_ENCODING", "'sharding'"},
	{"GET", "/v1/arrays?pa%ffge=1", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},
	{"GET", "/v1/arrays?%00=1", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "name"},
	{"GET", "/v1/arrays?page_token=a%00b", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"GET", "/v1/arrays:export?names=a%00", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"POST", WAITOP "?timeout=1%00s", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "NUL"},
	{"GET", "/v1/operations?state=%e2%82", NULL, NULL, 0, 400, NULL, "BAD_ENCODING", "UTF-8"},

	/* ---- NUL-free but invalid UTF-8 in headers ---- */
	{"GET", "/v1/devices", H("X-Thing: \xff\xfe"), NULL, 0, 400, NULL, "BAD_ENCODING",
	 "X-Thing"},
	{"PUT", PUTA, H("If-Match: \"1-\xff\""), "xy", 0, 400, NULL, "BAD_ENCODING", "If-Match"},
	{"GET", "/v1/arrays/a/data", H("Accept: application/\xc0\x80"), NULL, 0, 400, NULL,
	 "BAD_ENCODING", "Accept"},
	{"PUT", PUTA, H("Content-Type: application/x-npy\xe2\x82"), "xy", 0, 400, NULL,
	 "BAD_ENCODING", "Content-Type"},

	/* ---- list arguments: sizes, tokens, filters ---- */
	{"GET", "/v1/arrays?page_size=0", NULL, NULL, 0, 400, NULL, "BAD_PAGE_SIZE", "page_size"},
	{"GET", "/v1/arrays?page_size=-1", NULL, NULL, 0, 400, NULL, "BAD_PAGE_SIZE", "-1"},
	{"GET", "/v1/arrays?page_size=1001", NULL, NULL, 0, 400, NULL, "BAD_PAGE_SIZE", "1..1000"},
	{"GET", "/v1/arrays?page_size=99999999999999999999999", NULL, NULL, 0, 400, NULL,
	 "BAD_PAGE_SIZE", "page_size"},
	{"GET", "/v1/arrays?page_size=abc", NULL, NULL, 0, 400, NULL, "BAD_PAGE_SIZE", "abc"},
	{"GET", "/v1/arrays?page_size=1.5", NULL, NULL, 0, 400, NULL, "BAD_PAGE_SIZE", "1.5"},
	{"GET", "/v1/arrays?page_size=", NULL, NULL, 0, 400, NULL, "BAD_PAGE_SIZE", "page_size"},
	{"GET", "/v1/arrays?page_token=zzzz", NULL, NULL, 0, 400, NULL, "BAD_PAGE_TOKEN",
	 "'zzzz' is not one this server gave"},
	{"GET", "/v1/arrays?page_token=6130000000000000000000", NULL, NULL, 0, 400, NULL,
	 "BAD_PAGE_TOKEN", "page_token"},
	{"GET", "/v1/arrays?page_token=bad!token", NULL, NULL, 0, 400, NULL, "BAD_PAGE_TOKEN",
	 "bad!token"},
	{"GET", "/v1/arrays?page_token=" L300, NULL, NULL, 0, 400, NULL, "BAD_PAGE_TOKEN",
	 "page_token"},
	{"GET", "/v1/arrays?page_token=%e2%82%ac", NULL, NULL, 0, 400, NULL, "BAD_PAGE_TOKEN",
	 "page_token"},
	{"GET", "/v1/arrays?device=nope", NULL, NULL, 0, 400, NULL, "DEVICE_NOT_FOUND", "nope"},
	{"GET", "/v1/arrays?memory_kind=gpu", NULL, NULL, 0, 400, NULL, "BAD_MEMORY_KIND", "gpu"},
	{"GET", "/v1/operations?state=DONE", NULL, NULL, 0, 400, NULL, "BAD_STATE", "DONE"},
	{"GET", "/v1/operations?page_size=0", NULL, NULL, 0, 400, NULL, "BAD_PAGE_SIZE",
	 "page_size"},
	{"GET", "/v1/devices/sim:0/memory_stats?memory_kind=vram", NULL, NULL, 0, 400, NULL,
	 "BAD_MEMORY_KIND", "vram"},
	{"GET", "/v1/arrays/a/sharding?format=xml", NULL, NULL, 0, 400, NULL, "BAD_FORMAT", "xml"},
	{"GET", "/v1/arrays/a/data?format=csv", NULL, NULL, 0, 400, NULL, "BAD_FORMAT", "csv"},
	/* an empty format is no format (a schemathesis finding) */
	{"GET", "/v1/arrays/a/sharding?format=", NULL, NULL, 0, 400, NULL, "BAD_FORMAT", "json, text"},
	{"GET", "/v1/arrays/a/data?format=", NULL, NULL, 0, 400, NULL, "BAD_FORMAT", "raw, npy"},

	/* ---- index expressions on a: uint8 [4, 2] ---- */
	{"GET", IDX "9", NULL, NULL, 0, 400, "OUT_OF_RANGE", NULL, "9"},
	{"GET", IDX "-5", NULL, NULL, 0, 400, "OUT_OF_RANGE", NULL, "-5"},
	{"GET", IDX "0:1:0", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "step"},
	{"GET", IDX "a", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "index"},
	{"GET", IDX "0,0,0", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "index"},
	{"GET", IDX "99999999999999999999", NULL, NULL, 0, 400, NULL, NULL, "index"},
	{"GET", IDX "[0]", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "index"},
	{"GET", IDX "0:2:%2b", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "index"},
	{"GET", IDX "1::::", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "index"},
	{"GET", IDX "0,,1", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "index"},
	{"GET", IDX "%e2%82%ac", NULL, NULL, 0, 400, NULL, "BAD_INDEX", "index"},

	/* ---- uploads ---- */
	{"PUT", "/v1/arrays/n1?shape=2", NULL, "xy", 0, 400, NULL, "BAD_DTYPE", "dtype"},
	{"PUT", "/v1/arrays/n1?dtype=float128&shape=2", NULL, "xy", 0, 400, NULL, "BAD_DTYPE",
	 "float128"},
	{"PUT", "/v1/arrays/n1?dtype=uint8", NULL, "xy", 0, 400, NULL, "BAD_SHAPE", "shape"},
	{"PUT", "/v1/arrays/n1?dtype=uint8&shape=-1", NULL, "xy", 0, 400, NULL, "BAD_SHAPE",
	 "shape"},
	{"PUT", "/v1/arrays/n1?dtype=uint8&shape=2,x", NULL, "xy", 0, 400, NULL, "BAD_SHAPE",
	 "shape"},
	{"PUT", "/v1/arrays/n1?dtype=uint8&shape=99999999999999999999", NULL, "xy", 0, 400, NULL,
	 "BAD_SHAPE", "too large"},
	{"PUT", "/v1/arrays/n1?dtype=float64&shape=4294967296,4294967296,4294967296", NULL, "xy",
	 0, 400, NULL, NULL, "shape"},
	{"PUT", "/v1/arrays/n1?dtype=uint8&shape=1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
	 "1,1,1,1,1,1,1,1,1", NULL, "x", 0, 400, NULL, "BAD_SHAPE", "32"},
	{"PUT", "/v1/arrays/n1?dtype=uint8&shape=4", NULL, "xy", 0, 400, NULL, "WRONG_BYTE_COUNT",
	 "2 bytes"},
	{"PUT", PUTA, NULL, "xyz", 0, 400, NULL, "WRONG_BYTE_COUNT", "3 bytes"},
	{"PUT", "/v1/arrays/a?dtype=uint8&shape=4,2", H("If-None-Match: *"), "12345678", 0, 409,
	 NULL, NULL, "'a'"},
	{"PUT", PUTA, H("If-None-Match: \"1-1\""), "xy", 0, 400, NULL, "BAD_PRECONDITION",
	 "If-None-Match"},
	{"PUT", "/v1/arrays/a?dtype=uint8&shape=4,2", H("If-Match: \"9-9\""), "12345678", 0, 400,
	 "FAILED_PRECONDITION", "ETAG_MISMATCH", "If-Match"},
	{"PUT", PUTA, H("If-Match: \"1-1\""), "xy", 0, 400, "FAILED_PRECONDITION",
	 "ETAG_MISMATCH", "absent"},
	{"PUT", PUTA "&device=nope", NULL, "xy", 0, 400, NULL, "DEVICE_NOT_FOUND", "nope"},
	{"PUT", PUTA "&memory_kind=vram", NULL, "xy", 0, 400, NULL, "BAD_MEMORY_KIND", "vram"},
	{"PUT", PUTA "&sharding=%7b%22device%22%3a", NULL, "xy", 0, 400, NULL, "BAD_SHARDING",
	 "sharding"},
	{"PUT", PUTA "&sharding=%7b%22device%22%3a%22sim%3a0%22%2c%22device%22%3a%22sim%3a1%22%7d",
	 NULL, "xy", 0, 400, NULL, "BAD_SHARDING", "sharding"},
	{"PUT", PUTA "&sharding=s1&device=sim:0", NULL, "xy", 0, 400, NULL, "BAD_PLACEMENT",
	 "not both"},
	{"PUT", PUTA "&sharding=%7b%22device%22%3a%22sim%3a9%22%7d", NULL, "xy", 0, 400, NULL,
	 NULL, "sim:9"},
	{"PUT", PUTA "&sharding=%7b%22device%22%3a5%7d", NULL, "xy", 0, 400, NULL, NULL,
	 "device"},
	{"PUT", PUTA "&sharding=%7b%22mesh%22%3a%7b%22devices%22%3a%5b%5d%7d%7d", NULL, "xy", 0,
	 400, NULL, NULL, "mesh"},
	{"PUT", "/v1/arrays/n1", H("Content-Type: application/x-npy"), "not an npy file", 0, 400,
	 NULL, NULL, "npy"},
	{"PUT", "/v1/arrays/n1", H("Content-Type: application/x-npy"), LIT("\x93NUMPY\x01\x00\xff\xff"),
	 400, NULL, NULL, "npy"},
	{"PUT", "/v1/arrays/n1", NULL, "xy", 0, 400, NULL, "BAD_DTYPE", "dtype"},

	/* ---- JSON bodies of moves ---- */
	{"POST", "/v1/arrays/a:put", NULL, "", 0, 400, NULL, "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/arrays/a:put", NULL, "{", 0, 400, NULL, "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/arrays/a:put", NULL, "[]", 0, 400, NULL, "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/arrays/a:put", NULL, "{\"memory_kind\": \"vram\"}", 0, 400, NULL,
	 "BAD_MEMORY_KIND", "vram"},
	{"POST", "/v1/arrays/a:put", NULL, "{\"memory_kind\": 5}", 0, 400, NULL, NULL,
	 "memory_kind"},
	{"POST", "/v1/arrays/a:put", NULL,
	 "{\"memory_kind\": \"device\", \"memory_kind\": \"pinned_host\"}", 0, 400, NULL,
	 "BAD_REQUEST_BODY", "duplicate"},
	{"POST", "/v1/arrays/a:put", NULL, "{\"bogus\": 1}", 0, 400, NULL, "BAD_REQUEST_BODY",
	 "bogus"},
	{"POST", "/v1/arrays/a:put", NULL, "@DEEP@", 0, 400, NULL, "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/arrays/a:put", NULL, "{\"memory_kind\": \"de\\u0000vice\"}", 0, 400, NULL,
	 "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/arrays/a:put", NULL, "{\"memory_kind\": \"dev\xff\"}", 0, 400, NULL,
	 "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/arrays/a:put", NULL, LIT("{\"memory_kind\":\0\"device\"}"), 400, NULL,
	 "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/arrays/a:put", NULL, "@BIG@", 0, 400, NULL, "BODY_TOO_LARGE", "bytes"},
	{"POST", "/v1/arrays/nosuch:put", NULL, "{\"memory_kind\": \"device\"}", 0, 404, NULL,
	 "ARRAY_NOT_FOUND", "nosuch"},
	{"POST", "/v1/arrays/a:put", NULL, "{\"sharding\": {\"device\": \"sim:9\"}}", 0, 400, NULL,
	 NULL, "sim:9"},
	{"POST", "/v1/arrays/a:put", NULL, "{\"sharding\": \"nosuch\"}", 0, 404, NULL, NULL,
	 "nosuch"},
	{"POST", "/v1/arrays/a:copy", NULL, "{\"memory_kind\": \"device\"}", 0, 400, NULL, NULL,
	 "out"},
	{"POST", "/v1/arrays/a:copy", NULL, "{\"out\": {\"name\": \"bad name\"}}", 0, 400, NULL,
	 "BAD_ARRAY_NAME", "\"out\""},
	{"POST", "/v1/arrays/a:copy", NULL, "{\"out\": {\"name\": 7}}", 0, 400, NULL, NULL, "name"},
	{"POST", "/v1/arrays/a:copy", NULL, "{\"out\": \"c\"}", 0, 400, NULL, NULL, "needs"},

	/* ---- gather ---- */
	{"POST", "/v1/arrays/a:gather", NULL, "{\"rows\": 1, \"out\": {\"name\": \"g\"}}", 0, 400,
	 NULL, "BAD_ROWS", "rows"},
	{"POST", "/v1/arrays/a:gather", NULL, "{\"rows\": [99], \"out\": {\"name\": \"g\"}}", 0,
	 400, "OUT_OF_RANGE", "INDEX_OUT_OF_RANGE", "99"},
	{"POST", "/v1/arrays/a:gather", NULL, "{\"rows\": [-99], \"out\": {\"name\": \"g\"}}", 0,
	 400, "OUT_OF_RANGE", "INDEX_OUT_OF_RANGE", "-99"},
	{"POST", "/v1/arrays/a:gather", NULL, "{\"rows\": [1.5], \"out\": {\"name\": \"g\"}}", 0,
	 400, NULL, "BAD_ROWS", "rows[0]"},
	{"POST", "/v1/arrays/a:gather", NULL, "{\"rows\": [0, \"1\"], \"out\": {\"name\": \"g\"}}",
	 0, 400, NULL, "BAD_ROWS", "rows[1]"},
	{"POST", "/v1/arrays/a:gather", NULL, "{\"rows\": [0]}", 0, 400, NULL, "BAD_REQUEST_BODY",
	 "out"},
	{"POST", "/v1/arrays/a:gather", NULL, "{\"rows\": [0], \"out\": {\"name\": \"no/pe\"}}", 0,
	 400, NULL, "BAD_ARRAY_NAME", "no/pe"},
	{"POST", "/v1/arrays/a:gather", NULL,
	 "{\"rows\": {\"start\": \"a\"}, \"out\": {\"name\": \"g\"}}", 0, 400, NULL, "BAD_ROWS",
	 "start"},
	{"POST", "/v1/arrays/a:gather", NULL,
	 "{\"rows\": {\"step\": 0}, \"out\": {\"name\": \"g\"}}", 0, 400, NULL, NULL, "step"},
	{"POST", "/v1/arrays/a:gather", NULL,
	 "{\"rows\": [0], \"out\": {\"name\": \"g\", \"memory_kind\": \"vram\"}}", 0, 400, NULL,
	 "BAD_MEMORY_KIND", "vram"},
	{"POST", "/v1/arrays/a:gather", NULL,
	 "{\"rows\": [0], \"rows\": [1], \"out\": {\"name\": \"g\"}}", 0, 400, NULL,
	 "BAD_REQUEST_BODY", "duplicate"},
	{"POST", "/v1/arrays/nosuch:gather", NULL, "{\"rows\": [0], \"out\": {\"name\": \"g\"}}", 0,
	 404, NULL, "ARRAY_NOT_FOUND", "nosuch"},

	/* ---- shardings ---- */
	{"POST", "/v1/shardings", NULL, "", 0, 400, NULL, NULL, "body"},
	{"POST", "/v1/shardings", NULL, "{\"name\": \"bad name!\", \"sharding\": {\"device\": "
	 "\"sim:0\"}}", 0, 400, NULL, "BAD_SHARDING_NAME", "bad name!"},
	{"POST", "/v1/shardings", NULL, "{\"name\": \"x\", \"sharding\": {\"mesh\": {\"devices\": "
	 "[\"nope\"], \"axis_names\": [\"x\"]}, \"spec\": [\"x\"]}}", 0, 400, NULL, NULL, "nope"},
	{"POST", "/v1/shardings", NULL, "{\"name\": \"x\", \"sharding\": {\"mesh\": {\"devices\": "
	 "[\"sim:0\", \"sim:1\"], \"axis_names\": [\"x\"], \"shape\": [3]}, \"spec\": [\"x\"]}}", 0,
	 400, NULL, NULL, "shape"},
	{"POST", "/v1/shardings", NULL, "{\"name\": \"x\", \"sharding\": {\"mesh\": {\"devices\": "
	 "[\"sim:0\", \"sim:1\"], \"axis_names\": [\"x\"]}, \"spec\": [\"y\"]}}", 0, 400, NULL,
	 NULL, "y"},
	{"POST", "/v1/shardings", NULL, "{\"name\": \"x\", \"name\": \"y\", \"sharding\": "
	 "{\"device\": \"sim:0\"}}", 0, 400, NULL, NULL, "duplicate"},
	{"POST", "/v1/shardings", NULL, "{\"name\": \"x\", \"sharding\": {\"device\": \"sim:0\", "
	 "\"memory_kind\": \"vram\"}}", 0, 400, NULL, NULL, "vram"},
	{"POST", "/v1/shardings", NULL, "{\"name\": \"x\", \"sharding\": [1, 2]}", 0, 400, NULL,
	 NULL, "sharding"},
	{"GET", "/v1/shardings/nosuch", NULL, NULL, 0, 404, NULL, "SHARDING_NOT_FOUND", "nosuch"},
	{"POST", "/v1/shardings/s1:withMemoryKind", NULL,
	 "{\"memory_kind\": \"vram\", \"name\": \"s2\"}", 0, 400, NULL, NULL, "vram"},
	{"POST", "/v1/shardings/s1:withMemoryKind", NULL, "{}", 0, 400, NULL, NULL, "memory_kind"},
	{"POST", "/v1/shardings/nosuch:withMemoryKind", NULL, "{\"memory_kind\": \"device\"}", 0,
	 404, NULL, "SHARDING_NOT_FOUND", "nosuch"},

	/* ---- operations and :wait ---- */
	{"GET", "/v1/operations/nosuch", NULL, NULL, 0, 404, NULL, "OPERATION_NOT_FOUND", "nosuch"},
	{"POST", "/v1/operations/nosuch:cancel", NULL, NULL, 0, 404, NULL, "OPERATION_NOT_FOUND",
	 "nosuch"},
	{"POST", WAITOP, NULL, NULL, 0, 404, NULL, "OPERATION_NOT_FOUND", "nosuch"},
	{"POST", WAITOP "?timeout=abc", NULL, NULL, 0, 400, NULL, "BAD_TIMEOUT", "abc"},
	{"POST", WAITOP "?timeout=-1s", NULL, NULL, 0, 400, NULL, "BAD_TIMEOUT", "-1s"},
	{"POST", WAITOP "?timeout=99999s", NULL, NULL, 0, 400, NULL, "BAD_TIMEOUT", "99999s"},
	{"POST", WAITOP "?timeout=1e3", NULL, NULL, 0, 400, NULL, "BAD_TIMEOUT", "1e3"},
	{"POST", WAITOP "?timeout=0x10", NULL, NULL, 0, 400, NULL, "BAD_TIMEOUT", "0x10"},
	{"POST", WAITOP "?timeout=nan", NULL, NULL, 0, 400, NULL, "BAD_TIMEOUT", "nan"},
	{"POST", WAITOP "?timeout=%201s", NULL, NULL, 0, 400, NULL, "BAD_TIMEOUT", "timeout"},
	{"POST", WAITOP, NULL, "{\"timeout\": 5}", 0, 400, NULL, "BAD_REQUEST_BODY", "timeout"},
	{"POST", WAITOP, NULL, "{\"timeout\": \"1s\", \"x\": 1}", 0, 400, NULL, "BAD_REQUEST_BODY",
	 "x"},
	{"POST", WAITOP, NULL, "[", 0, 400, NULL, "BAD_REQUEST_BODY", "wait body"},
	{"POST", WAITOP, NULL, "\"1s\"", 0, 400, NULL, "BAD_REQUEST_BODY", "wait body"},
	{"POST", WAITOP, NULL, "{\"timeout\": \"1s\", \"timeout\": \"2s\"}", 0, 400, NULL,
	 "BAD_REQUEST_BODY", "duplicate"},
	{"POST", WAITOP "?timeout=1s", NULL, "{\"timeout\": \"1s\"}", 0, 400, NULL, "BAD_TIMEOUT",
	 "once"},
	{"POST", WAITOP, NULL, "{\"timeout\": \"soon\"}", 0, 400, NULL, "BAD_TIMEOUT", "soon"},

	/* ---- models ---- */
	{"POST", "/v1/models", NULL, "", 0, 400, NULL, "BAD_REQUEST_BODY", "body"},
	{"POST", "/v1/models", NULL, "{}", 0, 400, NULL, NULL, "name"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", " MLP ", \"colour\": 1}", 0, 400, NULL,
	 "BAD_MODEL", "colour"},
	{"POST", "/v1/models", NULL, "{\"name\": \"bad name\", " MLP "}", 0, 400, NULL,
	 "BAD_MODEL_NAME", "bad name"},
	{"POST", "/v1/models", NULL, "{\"name\": \"" L129 "\", " MLP "}", 0, 400, NULL,
	 "BAD_MODEL_NAME", "aaaa"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", \"mlp\": {\"layers\": -1, \"d_model\": 4}}",
	 0, 400, NULL, "BAD_MODEL", "layers"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", \"mlp\": {\"layers\": 1, \"d_model\": "
	 "99999999999999999999}}", 0, 400, NULL, NULL, "body"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", \"mlp\": {\"layers\": \"1\", \"d_model\": 4}}",
	 0, 400, NULL, NULL, "layers"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", " MLP ", \"k\xff\": 1}", 0, 400, NULL,
	 "BAD_REQUEST_BODY", "body"},
	/* positive doubles that are no float32 in range (a fuzz_model_spec finding) */
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", " MLP ", \"optimizer\": {\"type\": "
	 "\"adam\", \"learning_rate\": 1e-60}}", 0, 400, NULL, "BAD_OPTIMIZER", "float32"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", " MLP ", \"optimizer\": {\"type\": "
	 "\"adam\", \"b1\": 0.99999999999}}", 0, 400, NULL, "BAD_OPTIMIZER", "b1"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", " MLP ", \"optimizer\": {\"type\": "
	 "\"sgd\", \"learning_rate\": 1e300}}", 0, 400, NULL, "BAD_OPTIMIZER", "finite"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m\", " MLP "}", 0, 409, NULL, NULL, "'m'"},
	{"POST", "/v1/models", NULL, "{\"name\": \"m2\", \"name\": \"m3\", " MLP "}", 0, 400, NULL,
	 NULL, "duplicate"},
	{"GET", "/v1/models/nosuch", NULL, NULL, 0, 404, NULL, "MODEL_NOT_FOUND", "nosuch"},
	{"DELETE", "/v1/models/nosuch", NULL, NULL, 0, 404, NULL, "MODEL_NOT_FOUND", "nosuch"},
	{"POST", "/v1/models/nosuch:step", NULL, "{\"inputs\": \"x\"}", 0, 404, NULL,
	 "MODEL_NOT_FOUND", "nosuch"},
	{"POST", "/v1/models/nosuch:analyze", NULL, "{\"batch\": 4}", 0, 404, NULL,
	 "MODEL_NOT_FOUND", "nosuch"},
	{"POST", "/v1/models:analyze", NULL, "{", 0, 400, NULL, NULL, "body"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", \"steps\": -1}",
	 0, 400, NULL, NULL, "steps"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", \"bogus\": 1}",
	 0, 400, NULL, NULL, "bogus"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": 0}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": -1}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": 1025}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": 1e30}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": 2.5}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": \"2\"}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": true}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:step", NULL, "{\"inputs\": \"x\", \"targets\": \"t\", "
	 "\"accumulate\": null}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:analyze", NULL, "{\"batch\": [4, 8], \"accumulate\": 0}", 0, 400,
	 NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:analyze", NULL, "{\"batch\": [6, 4], \"accumulate\": 4}", 0, 400,
	 NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/m:analyze", NULL, "{\"batch\": [4, 8], \"mode\": \"evaluate\", "
	 "\"accumulate\": 2}", 0, 400, NULL, "BAD_ACCUMULATE", "accumulate"},
	{"POST", "/v1/models/nosuch:evaluate", NULL, "{\"inputs\": \"x\"}", 0, 404, NULL,
	 "MODEL_NOT_FOUND", "nosuch"},
	{"POST", "/v1/models/m:evaluate", NULL, "{\"inputs\": \"x\", \"bogus\": 1}", 0, 400, NULL,
	 NULL, "bogus"},
	{"POST", "/v1/models/m:evaluate", NULL, "{\"inputs\": 7}", 0, 400, NULL, NULL, "inputs"},
	{"POST", "/v1/models/m:evaluate", NULL, "{\"inputs\": \"x\", \"outputs\": []}", 0, 400,
	 NULL, "BAD_OUTPUTS", "outputs"},
	{"POST", "/v1/models/m:analyze", NULL, "{\"batch\": [4, 8], \"mode\": 3}", 0, 400, NULL,
	 NULL, "mode"},

	/* ---- import and export ---- */
	{"POST", "/v1/arrays:import", NULL, "garbage", 0, 400, NULL, NULL, "safetensors"},
	{"POST", "/v1/arrays:import", NULL, LIT("\xff\xff\xff\xff\xff\xff\xff\x7f{}"), 400, NULL,
	 NULL, "header"},
	{"POST", "/v1/arrays:import", NULL, LIT("\x20\x00\x00\x00\x00\x00\x00\x00"
	     "{\"t\xff\": {\"dtype\": \"U8\"}}         "), 400, NULL, NULL, "header"},
	{"POST", "/v1/arrays:import?prefix=" L300, NULL, "x", 0, 400, NULL, "BAD_PREFIX",
	 "prefix"},
	{"POST", "/v1/arrays:import?memory_kind=vram", NULL, "x", 0, 400, NULL, "BAD_MEMORY_KIND",
	 "vram"},
	{"POST", "/v1/arrays:import", JSON_CT, LIT("\x08\x00\x00\x00\x00\x00\x00\x00{}      "), 400,
	 NULL, NULL, "body"},
	{"GET", "/v1/arrays:export", NULL, NULL, 0, 400, NULL, "NO_NAMES", "names"},
	{"GET", "/v1/arrays:export?names=", NULL, NULL, 0, 400, NULL, "NO_NAMES", "names"},
	{"GET", "/v1/arrays:export?names=a,,a", NULL, NULL, 0, 400, NULL, "BAD_NAMES", "empty"},
	{"GET", "/v1/arrays:export?names=a,", NULL, NULL, 0, 400, NULL, "BAD_NAMES", "empty"},
	{"GET", "/v1/arrays:export?names=,a", NULL, NULL, 0, 400, NULL, "BAD_NAMES", "empty"},
	{"GET", "/v1/arrays:export?names=a,a", NULL, NULL, 0, 400, NULL, "BAD_NAMES",
	 "more than once"},
	{"GET", "/v1/arrays:export?names=nosuch", NULL, NULL, 0, 404, NULL, "ARRAY_NOT_FOUND",
	 "nosuch"},
	{"GET", "/v1/arrays:export?names=a,bad!", NULL, NULL, 0, 400, NULL, "BAD_ARRAY_NAME",
	 "bad!"},

	/* ---- reads of what is not there ---- */
	{"GET", "/v1/arrays/nosuch", NULL, NULL, 0, 404, NULL, "ARRAY_NOT_FOUND", "nosuch"},
	{"GET", "/v1/arrays/nosuch/data", NULL, NULL, 0, 404, NULL, "ARRAY_NOT_FOUND", "nosuch"},
	{"DELETE", "/v1/arrays/nosuch", NULL, NULL, 0, 404, NULL, NULL, "nosuch"},
	{"DELETE", "/v1/arrays/a", H("If-Match: \"9-9\""), NULL, 0, 400, "FAILED_PRECONDITION",
	 NULL, "If-Match"},
	{"GET", "/v1/arrays/bad!name", NULL, NULL, 0, 400, NULL, "BAD_ARRAY_NAME", "bad!name"},
	{"GET", "/v1/devices/nope", NULL, NULL, 0, 404, NULL, "DEVICE_NOT_FOUND", "nope"},
	{"GET", "/v1/devices/sim:9/memory_stats", NULL, NULL, 0, 404, NULL, "DEVICE_NOT_FOUND",
	 "sim:9"},
	{"POST", "/v1/memory:resetPeak", NULL, "@BIG@", 0, 400, NULL, "BODY_TOO_LARGE", "bytes"},
	/* schemathesis: resetPeak took any body and ignored it */
	{"POST", "/v1/memory:resetPeak", NULL, "[null, null]", 0, 400, NULL, "BAD_REQUEST_BODY",
	 "not an object"},
	{"POST", "/v1/memory:resetPeak", NULL, "{\"device\": \"sim:0\"}", 0, 400, NULL,
	 "BAD_REQUEST_BODY", "no members"},
	{"POST", "/v1/memory:resetPeak", NULL, "{", 0, 400, NULL, "BAD_REQUEST_BODY", "resetPeak"},
	{"POST", "/v1/memory:resetPeak", NULL, "\0", 1, 400, NULL, "BAD_REQUEST_BODY", "resetPeak"},
	{"POST", "/v1/memory:resetPeak", NULL, " \0", 2, 400, NULL, "BAD_REQUEST_BODY", "resetPeak"},
	{"POST", "/v1/memory:resetPeak", NULL, "\t", 0, 400, NULL, "BAD_REQUEST_BODY", "resetPeak"},
};

#define NROWS (sizeof rows / sizeof rows[0])

/* ---- filling in placeholders ---------------------------------------------------- */

static char *expand(const char *tmpl)
{
	size_t cap = strlen(tmpl) + 400, o = 0;
	char *out = malloc(cap);

	ck_assert_ptr_nonnull(out);
	for (const char *p = tmpl; *p;) {
		int n = 0;

		if (strncmp(p, "sim:", 4) == 0 && p[4] >= '0' && p[4] <= '7') {
			const char *id = th_dev(p[4] - '0');   /* the backend under test */

			memcpy(out + o, id, strlen(id));
			o += strlen(id);
			p += 5;
			continue;
		}
		if (strncmp(p, L300, strlen(L300)) == 0)
			n = 300;
		else if (strncmp(p, L129, strlen(L129)) == 0)
			n = 129;
		if (n) {
			memset(out + o, 'a', (size_t)n);
			o += (size_t)n;
			p += strlen(L300);
		} else {
			out[o++] = *p++;
		}
	}
	out[o] = '\0';
	return out;
}

/* The row's body as bytes (new buffer, or NULL for none) and its length. */
static char *row_body(const struct bad *b, size_t *len)
{
	char *body;

	if (!b->body) {
		*len = 0;
		return NULL;
	}
	if (strcmp(b->body, "@DEEP@") == 0) {
		*len = 100000;
		body = malloc(*len + 1);
		ck_assert_ptr_nonnull(body);
		memset(body, '[', *len);
		body[*len] = '\0';
		return body;
	}
	if (strcmp(b->body, "@BIG@") == 0) {
		*len = (2u << 20);
		body = malloc(*len + 1);
		ck_assert_ptr_nonnull(body);
		memset(body, ' ', *len);
		body[0] = '{';
		body[*len - 1] = '}';
		body[*len] = '\0';
		return body;
	}
	if (b->body_len) {
		*len = b->body_len;
		body = malloc(*len + 1);
		ck_assert_ptr_nonnull(body);
		memcpy(body, b->body, *len);
		body[*len] = '\0';
		return body;
	}
	body = expand(b->body);
	*len = strlen(body);
	return body;
}

/* ---- checking one answer ----------------------------------------------------------- */

static const char *canonical_for(long http)
{
	switch (http) {
	case 400: return "INVALID_ARGUMENT";
	case 401: return "UNAUTHENTICATED";
	case 403: return "PERMISSION_DENIED";
	case 404: return "NOT_FOUND";
	case 409: return "ALREADY_EXISTS";
	case 429: return "RESOURCE_EXHAUSTED";
	default: return "?";
	}
}

static const char *member_str(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s ? s : "";
}

/* Appends why r is not the row's answer to fails (nothing when it is). */
static void check_row(size_t i, const struct bad *b, struct th_response *r, char *fails,
                      size_t cap)
{
	const char *want_status = b->status ? b->status : canonical_for(b->http);
	const char *ct = th_header(r, "Content-Type");
	json_t *root = json_loadb(r->body, r->body_len, 0, NULL), *err, *info;
	const char *st, *msg, *reason, *problem = NULL;
	char why[256];

	err = json_object_get(root, "error");
	info = json_array_get(json_object_get(err, "details"), 0);
	st = json_string_value(json_object_get(err, "status"));
	msg = json_string_value(json_object_get(err, "message"));
	reason = json_string_value(json_object_get(info, "reason"));
	if (r->status != b->http)
		problem = "HTTP status";
	else if (!ct || strncmp(ct, "application/json", 16) != 0)
		problem = "Content-Type";
	else if (!json_is_object(err))
		problem = "no error object";
	else if (json_integer_value(json_object_get(err, "code")) != b->http)
		problem = "error.code";
	else if (!st || strcmp(st, want_status) != 0)
		problem = "error.status";
	else if (!msg || !*msg || !strstr(msg, b->msg))
		problem = "error.message";
	else if (!json_is_object(info) ||
	         strcmp(member_str(info, "@type"), "type.googleapis.com/google.rpc.ErrorInfo") != 0 ||
	         strcmp(member_str(info, "domain"), "tstage") != 0 ||
	         !json_is_object(json_object_get(info, "metadata")) || !reason || !*reason)
		problem = "ErrorInfo";
	else if (b->reason && strcmp(reason, b->reason) != 0)
		problem = "reason";
	if (problem) {
		size_t o = strlen(fails);

		snprintf(why, sizeof why, "%s (want %ld %s %s '%s')", problem, b->http, want_status,
		         b->reason ? b->reason : "*", b->msg);
		snprintf(fails + o, cap - o, "row %zu %s %.80s: %s; got %ld %.300s\n", i, b->method,
		         b->path, why, r->status, r->body);
	}
	json_decref(root);
}

/* ---- what the daemon holds ------------------------------------------------------------ */

struct holdings {
	char spaces[2048];              /* "device/kind=bytes_in_use;..." */
	json_int_t arrays, array_bytes, models, shardings, operations;
	char a_etag[64];
	char a_data[16];
	size_t a_len;
};

static json_int_t list_size(const char *path, const char *member)
{
	struct th_response r;
	json_int_t n = (json_int_t)json_array_size(th_arr(th_get_json(&D, path, &r), member));

	th_response_free(&r);
	return n;
}

static void holdings_take(struct holdings *h)
{
	struct th_response r;
	json_t *mem, *spaces;
	size_t o = 0, i;
	json_t *sp;

	memset(h, 0, sizeof *h);
	mem = th_get_json(&D, "/v1/memory", &r);
	spaces = th_arr(mem, "spaces");
	json_array_foreach(spaces, i, sp) {
		o += (size_t)snprintf(h->spaces + o, sizeof h->spaces - o, "%s/%s=%lld;",
		                      th_str(sp, "device"), th_str(sp, "memory_kind"),
		                      (long long)th_int(sp, "bytes_in_use"));
	}
	h->arrays = th_int(th_obj(mem, "arrays"), "count");
	h->array_bytes = th_int(th_obj(mem, "arrays"), "bytes");
	th_response_free(&r);
	h->models = list_size("/v1/models", "models");
	h->shardings = list_size("/v1/shardings", "shardings");
	h->operations = list_size("/v1/operations", "operations");
	snprintf(h->a_etag, sizeof h->a_etag, "%s", th_str(th_get_json(&D, "/v1/arrays/a", &r), "etag"));
	th_response_free(&r);
	th_get(&D, "/v1/arrays/a/data", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_uint_le(r.body_len, sizeof h->a_data);
	memcpy(h->a_data, r.body, r.body_len);
	h->a_len = r.body_len;
	th_response_free(&r);
}

static void holdings_assert_equal(const struct holdings *want, const struct holdings *got)
{
	ck_assert_str_eq(got->spaces, want->spaces);
	ck_assert_int_eq(got->arrays, want->arrays);
	ck_assert_int_eq(got->array_bytes, want->array_bytes);
	ck_assert_int_eq(got->models, want->models);
	ck_assert_int_eq(got->shardings, want->shardings);
	ck_assert_int_eq(got->operations, want->operations);
	ck_assert_str_eq(got->a_etag, want->a_etag);
	th_assert_bytes("array a", got->a_data, got->a_len, want->a_data, want->a_len);
}

/* ---- fixtures ------------------------------------------------------------------------- */

static void expect_status(const char *method, const char *path, const char *body, long want)
{
	struct th_response r;
	char *p = expand(path), *b = body ? expand(body) : NULL;

	th_request(&D, method, p, NULL, b, b ? strlen(b) : 0, &r);
	ck_assert_msg(r.status == want, "%s %s: %ld %s", method, p, r.status, r.body);
	th_response_free(&r);
	free(p);
	free(b);
}

static void daemon_up(void)
{
	th_daemon_start(&D, NULL);
	expect_status("PUT", "/v1/arrays/a?dtype=uint8&shape=4,2", "abcdefgh", 201);
	expect_status("PUT", "/v1/arrays/x?dtype=float32&shape=2,4", "0123456789abcdefghijklmnopqrstuv",
	              201);
	expect_status("PUT", "/v1/arrays/t?dtype=float32&shape=2,4", "0123456789abcdefghijklmnopqrstuv",
	              201);
	expect_status("POST", "/v1/shardings",
	              "{\"name\": \"s1\", \"sharding\": {\"device\": \"sim:0\"}}", 201);
	expect_status("POST", "/v1/models?wait=true", "{\"name\": \"m\", " MLP "}", 200);
}

static void daemon_down(void)
{
	th_daemon_stop_ok(&D);
}

/* ---- the table ------------------------------------------------------------------------ */

START_TEST(test_bad_requests)
{
	struct holdings before, after;
	static char fails[1 << 17];
	struct th_response r;
	int nfail = 0;

	ck_assert_uint_ge(NROWS, 150);
	holdings_take(&before);
	fails[0] = '\0';
	for (size_t i = 0; i < NROWS; i++) {
		const struct bad *b = &rows[i];
		char *path = expand(b->path), *body;
		size_t len, had = strlen(fails);

		body = row_body(b, &len);
		th_request(&D, b->method, path, b->headers, body, len, &r);
		check_row(i, b, &r, fails, sizeof fails);
		nfail += strlen(fails) != had;
		th_response_free(&r);
		free(body);
		free(path);
	}
	if (nfail)
		fputs(fails, stderr);   /* all of them; the assertion keeps the first few */
	ck_assert_msg(nfail == 0, "%d of %zu rows answered wrongly (all on stderr):\n%.3000s", nfail,
	              NROWS, fails);
	/* alive, and holding exactly what it held */
	th_get(&D, "/livez", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	holdings_take(&after);
	holdings_assert_equal(&before, &after);
}
END_TEST

/* Every message that echoes a client's text is valid UTF-8 however the
 * server cuts it: a 600-byte name of 3-byte characters. */
START_TEST(test_long_text_is_cut_on_characters)
{
	char path[4096];
	struct th_response r;
	size_t o;

	o = (size_t)snprintf(path, sizeof path, "/v1/models");
	(void)o;
	/* a model name of 200 euro signs: echoed in BAD_MODEL_NAME, cut at 512 bytes */
	{
		char body[2048];
		size_t k = (size_t)snprintf(body, sizeof body, "{\"name\": \"");

		for (int i = 0; i < 200; i++)
			k += (size_t)snprintf(body + k, sizeof body - k, "\xe2\x82\xac");
		snprintf(body + k, sizeof body - k, "\", " MLP "}");
		th_request(&D, "POST", path, NULL, body, strlen(body), &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_MODEL_NAME");
		th_response_free(&r);
	}
	/* an index expression of 300 'é': echoed in BAD_INDEX */
	o = (size_t)snprintf(path, sizeof path, "/v1/arrays/a/data?index=");
	for (int i = 0; i < 300; i++)
		o += (size_t)snprintf(path + o, sizeof path - o, "%%c3%%a9");
	th_get(&D, path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
	th_response_free(&r);
}
END_TEST

/* A long client text never pushes the explanation out of a message: the
 * quoted text is cut (with an ellipsis), the words after it stay. */
START_TEST(test_message_keeps_reason)
{
	char path[2048];
	struct th_response r;
	json_t *err;
	const char *msg;
	size_t o = (size_t)snprintf(path, sizeof path, "/v1/arrays?device=");

	while (o < 1200)
		path[o++] = 'd';
	path[o] = '\0';
	th_get(&D, path, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "DEVICE_NOT_FOUND");
	err = th_obj(th_json(&r), "error");
	msg = th_str(err, "message");
	ck_assert_msg(strstr(msg, "ddd...' is not a device of this node"), "message: %s", msg);
	ck_assert_uint_lt(strlen(msg), 512);
	th_response_free(&r);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("badinput");
	TCase *tc = tcase_create("table");

	tcase_set_timeout(tc, 300);
	tcase_add_checked_fixture(tc, daemon_up, daemon_down);
	tcase_add_test(tc, test_bad_requests);
	tcase_add_test(tc, test_long_text_is_cut_on_characters);
	tcase_add_test(tc, test_message_keeps_reason);
	suite_add_tcase(s, tc);
	return s;
}
