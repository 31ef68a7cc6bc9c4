/*
 * test_common.c - the status table, error recorder, byte-size parsing and
 * formatting, log escaping, base64 decoding, and the growing text buffer.
 */
#include <check.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/base64.h"
#include "common/copy.h"
#include "common/lock.h"
#include "common/histogram.h"
#include "common/log.h"
#include "common/page_token.h"
#include "common/status.h"
#include "common/textbuf.h"
#include "common/units.h"
#include "common/utf8.h"
#include "tests/unit/unit.h"

START_TEST(test_status_canonical_mapping)
{
	static const struct {
		ts_status st;
		const char *name;
		int http;
	} want[] = {
		{TS_OK, "OK", 200},
		{TS_INVALID_ARGUMENT, "INVALID_ARGUMENT", 400},
		{TS_UNAUTHENTICATED, "UNAUTHENTICATED", 401},
		{TS_PERMISSION_DENIED, "PERMISSION_DENIED", 403},
		{TS_NOT_FOUND, "NOT_FOUND", 404},
		{TS_ALREADY_EXISTS, "ALREADY_EXISTS", 409},
		{TS_ABORTED, "ABORTED", 409},
		{TS_FAILED_PRECONDITION, "FAILED_PRECONDITION", 400},
		{TS_RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED", 429},
		{TS_CANCELLED, "CANCELLED", 499},
		{TS_INTERNAL, "INTERNAL", 500},
		{TS_UNAVAILABLE, "UNAVAILABLE", 503},
		{TS_DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", 504},
	};

	ck_assert_int_eq(TS_OK, 0);
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		ck_assert_str_eq(ts_status_name(want[i].st), want[i].name);
		ck_assert_int_eq(ts_status_http(want[i].st), want[i].http);
	}
	ck_assert_str_eq(ts_status_name((ts_status)999), "UNKNOWN");
	ck_assert_int_eq(ts_status_http((ts_status)999), 500);
}
END_TEST

START_TEST(test_status_from_errno)
{
	ck_assert_int_eq(ts_status_from_errno(0), TS_OK);
	ck_assert_int_eq(ts_status_from_errno(ENOMEM), TS_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(ts_status_from_errno(ENOENT), TS_NOT_FOUND);
	ck_assert_int_eq(ts_status_from_errno(EACCES), TS_PERMISSION_DENIED);
	ck_assert_int_eq(ts_status_from_errno(EEXIST), TS_ALREADY_EXISTS);
	ck_assert_int_eq(ts_status_from_errno(EIO), TS_INTERNAL);
}
END_TEST

START_TEST(test_error_first_wins)
{
	struct ts_error e;

	ts_error_clear(&e);
	ck_assert_int_eq(ts_error_set(&e, TS_NOT_FOUND, "A", "first %d", 1), TS_NOT_FOUND);
	ck_assert_int_eq(ts_error_set(&e, TS_INTERNAL, "B", "second"), TS_NOT_FOUND);
	ck_assert_str_eq(e.message, "first 1");
	ck_assert_str_eq(e.reason, "A");
	ts_error_meta_u64(&e, "bytes", 12345678901234ull);
	ck_assert_int_eq(e.nmeta, 1);
	ck_assert_str_eq(e.meta[0].value, "12345678901234");
	for (int i = 0; i < 20; i++)
		ts_error_meta(&e, "k", "%d", i);
	ck_assert_int_eq(e.nmeta, TS_ERROR_META_MAX);
	ck_assert_int_eq(ts_error_set(NULL, TS_ABORTED, "X", "y"), TS_ABORTED);
}
END_TEST

/* "x" then "é" repeated into big (cap bytes), NUL-terminated: a text that a
 * byte cut would split inside a character. */
static void fill_e_acute(char *big, size_t cap)
{
	size_t n = 0;

	big[n++] = 'x';
	while (n + 2 < cap - 1) {
		big[n++] = '\xc3';
		big[n++] = '\xa9';
	}
	big[n] = '\0';
}

/* The one bad-input and out-of-memory helpers: prefix, reason, status, the
 * first error kept, and a long message cut on a character boundary after
 * the prefix. */
START_TEST(test_error_bad_and_oom_helpers)
{
	struct ts_error e;
	char big[TS_ERROR_MESSAGE_MAX * 2];

	ts_error_clear(&e);
	ck_assert_int_eq(ts_error_bad(&e, "BAD_NPY_HEADER", "npy header", "rank %d", 9),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(e.reason, "BAD_NPY_HEADER");
	ck_assert_str_eq(e.message, "npy header: rank 9");
	ck_assert_int_eq(ts_error_oom(&e, "no memory for %s", "x"), TS_INVALID_ARGUMENT);
	ck_assert_str_eq(e.message, "npy header: rank 9");
	ts_error_clear(&e);
	ck_assert_int_eq(ts_error_bad(&e, "BAD_SHARDING", NULL, "mesh has %d axes", 0),
	                 TS_INVALID_ARGUMENT);
	ck_assert_str_eq(e.message, "mesh has 0 axes");
	ts_error_clear(&e);
	ck_assert_int_eq(ts_error_oom(&e, "no memory for array '%s'", "w1"), TS_RESOURCE_EXHAUSTED);
	ck_assert_str_eq(e.reason, "OUT_OF_MEMORY");
	ck_assert_str_eq(e.message, "no memory for array 'w1'");
	ck_assert_int_eq(ts_error_oom(NULL, "x"), TS_RESOURCE_EXHAUSTED);
	ck_assert_int_eq(ts_error_bad(NULL, "R", "p", "x"), TS_INVALID_ARGUMENT);
	fill_e_acute(big, sizeof big);
	ts_error_clear(&e);
	ts_error_bad(&e, "R", "safetensors header", "%s", big);
	ck_assert_int_eq(strncmp(e.message, "safetensors header: x\xc3\xa9", 23), 0);
	ck_assert_int_eq(ts_utf8_check(e.message, strlen(e.message), NULL), TS_UTF8_OK);
	ck_assert_uint_gt(strlen(e.message), TS_ERROR_MESSAGE_MAX - 4);
}
END_TEST

/* A message too long for its buffer cuts the quoted client text (with an
 * ellipsis, on a character boundary), never the words around it; several
 * quotes are cut longest first; a message with nothing quoted is cut at
 * its end as before. */
START_TEST(test_error_message_keeps_reason)
{
	struct ts_error e;
	char big[2000], big2[300], acute[1200];
	size_t len;

	memset(big, 'n', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	ts_error_clear(&e);
	ts_error_set(&e, TS_INVALID_ARGUMENT, "BAD_DEVICE",
	             "device '%s' is not a device of this node; devices: sim:0, sim:1", big);
	len = strlen(e.message);
	ck_assert_uint_lt(len, TS_ERROR_MESSAGE_MAX);
	ck_assert_uint_gt(len, TS_ERROR_MESSAGE_MAX - 8);
	ck_assert_int_eq(strncmp(e.message, "device 'nnnn", 12), 0);
	ck_assert_msg(strstr(e.message, "nnn...' is not a device of this node; devices: sim:0, sim:1"),
	              "the reason is cut: %s", e.message);

	/* two quotes: the longer one is cut, a short one stays whole */
	memset(big2, 'b', sizeof big2 - 1);
	big2[sizeof big2 - 1] = '\0';
	ts_error_clear(&e);
	ts_error_bad(&e, "R", "rows", "array 'w1' has no row '%s' nor '%s': out of range", big,
	             big2);
	ck_assert_int_eq(strncmp(e.message, "rows: array 'w1' has no row 'nnn", 32), 0);
	ck_assert_ptr_nonnull(strstr(e.message, "n...' nor 'bbb"));
	ck_assert_ptr_nonnull(strstr(e.message, "': out of range"));
	ck_assert_uint_lt(strlen(e.message), TS_ERROR_MESSAGE_MAX);

	/* a multi-byte name is cut between characters */
	fill_e_acute(acute, sizeof acute);
	ts_error_clear(&e);
	ts_error_set(&e, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found", acute);
	ck_assert_int_eq(ts_utf8_check(e.message, strlen(e.message), NULL), TS_UTF8_OK);
	ck_assert_msg(strstr(e.message, "\xc3\xa9...' not found"), "%s", e.message);

	/* an apostrophe opens no quote; nothing to cut: the end goes */
	ts_error_clear(&e);
	ts_error_set(&e, TS_INVALID_ARGUMENT, "R", "the array's text %s and more", big);
	ck_assert_int_eq(strncmp(e.message, "the array's text nnn", 20), 0);
	ck_assert_uint_eq(strlen(e.message), TS_ERROR_MESSAGE_MAX - 1);
	ck_assert_ptr_null(strstr(e.message, "and more"));

	/* short messages are untouched */
	ts_error_clear(&e);
	ts_error_set(&e, TS_INVALID_ARGUMENT, "R", "name '%s' is bad", "a'b");
	ck_assert_str_eq(e.message, "name 'a'b' is bad");
}
END_TEST

/* Page tokens: a written token reads back for its own scope only; a
 * changed digit, a cut, upper case, junk or an oversized position is
 * refused. */
START_TEST(test_page_token_codec)
{
	char tok[TS_PAGE_TOKEN_MAX], pos[TS_PAGE_TOKEN_POS_MAX + 1], name[TS_PAGE_TOKEN_POS_MAX + 1];
	long n;

	ck_assert_ptr_nonnull(ts_page_token_write(tok, sizeof tok, "arrays", "w1", 2));
	ck_assert_uint_eq(strlen(tok), 4 + 16);
	ck_assert_int_eq(strncmp(tok, "7731", 4), 0);
	n = ts_page_token_read(tok, "arrays", pos, sizeof pos);
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(memcmp(pos, "w1", 2), 0);
	ck_assert_int_eq(ts_page_token_read(tok, "arrays device=sim:0", pos, sizeof pos), -1);
	ck_assert_int_eq(ts_page_token_read(tok, "operations", pos, sizeof pos), -1);
	ck_assert_int_eq(ts_page_token_read(tok, "arrays", pos, 1), -1);    /* no room */
	tok[1] = tok[1] == '7' ? '6' : '7';                                    /* the position */
	ck_assert_int_eq(ts_page_token_read(tok, "arrays", pos, sizeof pos), -1);
	ts_page_token_write(tok, sizeof tok, "arrays", "w1", 2);
	tok[19] = tok[19] == '0' ? '1' : '0';                                  /* the check */
	ck_assert_int_eq(ts_page_token_read(tok, "arrays", pos, sizeof pos), -1);
	ts_page_token_write(tok, sizeof tok, "arrays", "w1", 2);
	tok[18] = '\0';                                                        /* cut */
	ck_assert_int_eq(ts_page_token_read(tok, "arrays", pos, sizeof pos), -1);
	for (const char *const *bad = (const char *const[]){"", "zzzz", "l0", "0000000000000000x",
	                                                    "00000000000000000", NULL};
	     *bad; bad++)
		ck_assert_int_eq(ts_page_token_read(*bad, "arrays", pos, sizeof pos), -1);
	ts_page_token_write(tok, sizeof tok, "arrays", "W", 1);
	for (char *c = tok; *c; c++)
		*c = (char)toupper((unsigned char)*c);
	ck_assert_int_eq(ts_page_token_read(tok, "arrays", pos, sizeof pos), -1);
	/* an empty position, the longest one, one too long, a buffer too small */
	ts_page_token_write(tok, sizeof tok, "s", "", 0);
	ck_assert_int_eq(ts_page_token_read(tok, "s", pos, sizeof pos), 0);
	memset(name, 'n', sizeof name);
	ck_assert_ptr_nonnull(ts_page_token_write(tok, sizeof tok, "s", name, TS_PAGE_TOKEN_POS_MAX));
	ck_assert_int_eq(ts_page_token_read(tok, "s", pos, sizeof pos), TS_PAGE_TOKEN_POS_MAX);
	ck_assert_ptr_null(ts_page_token_write(tok, sizeof tok, "s", name, sizeof name));
	ck_assert_str_eq(tok, "");
	ck_assert_ptr_null(ts_page_token_write(tok, 20, "s", "w1", 2));
}
END_TEST

/* Every out-of-memory answer with figures is worded by one builder. */
START_TEST(test_error_oom_figures)
{
	struct ts_error e;
	struct ts_oom_figures f = {
		.where = "sim:0/device", .ids = {{"space", "sim:0/device"}},
		.requested = 3ull << 30, .free_bytes = 2ull << 30, .limit = 2ull << 30,
		.largest = 1ull << 30,
	};

	ts_error_clear(&e);
	ck_assert_int_eq(ts_error_oom_bytes(&e, &f), TS_RESOURCE_EXHAUSTED);
	ck_assert_str_eq(e.reason, "OUT_OF_MEMORY");
	ck_assert_str_eq(e.message, "sim:0/device: cannot allocate 3221225472 bytes (3.00 GiB); "
	                            "2147483648 bytes (2.00 GiB) free (largest free block 1.00 GiB) "
	                            "of 2147483648 (2.00 GiB)");
	ck_assert_int_eq(e.nmeta, 5);
	ck_assert_str_eq(e.meta[0].key, "space");
	ck_assert_str_eq(e.meta[3].key, "largest_free_block_bytes");
	ck_assert_str_eq(e.meta[3].value, "1073741824");
	ck_assert_str_eq(e.meta[4].key, "limit_bytes");
	/* no largest block, a cause, two ids */
	f.largest = TS_ERROR_UNKNOWN_BYTES;
	f.cause = "cudaMalloc: out of memory";
	f.ids[0][0] = "device", f.ids[0][1] = "cuda:0";
	f.ids[1][0] = "memory_kind", f.ids[1][1] = "device";
	f.requested = 512;
	ts_error_clear(&e);
	ts_error_oom_bytes(&e, &f);
	ck_assert_str_eq(e.message, "sim:0/device: cannot allocate 512 bytes (512 B); 2147483648 "
	                            "bytes (2.00 GiB) free of 2147483648 (2.00 GiB): cudaMalloc: "
	                            "out of memory");
	ck_assert_int_eq(e.nmeta, 5);
	ck_assert_str_eq(e.meta[1].value, "device");
	ck_assert_str_eq(e.meta[2].key, "requested_bytes");
	/* the first error stays, with its own metadata only */
	ts_error_clear(&e);
	ts_error_set(&e, TS_INTERNAL, "FIRST", "first");
	ck_assert_int_eq(ts_error_oom_bytes(&e, &f), TS_INTERNAL);
	ck_assert_str_eq(e.message, "first");
	ck_assert_int_eq(e.nmeta, 0);
}
END_TEST

/* The locks that know their holder: held by the caller, not by another
 * thread; a rwlock's writer is known, its readers only counted. */
struct held_probe {
	struct ts_mutex *m;
	struct ts_rwlock *l;
	bool mutex_held, writing, held;
};

static void *probe_main(void *arg)
{
	struct held_probe *p = arg;

	p->mutex_held = ts_mutex_held(p->m);
	p->writing = ts_rwlock_writing(p->l);
	p->held = ts_rwlock_held(p->l);
	return NULL;
}

static void probe(struct held_probe *p)
{
	pthread_t t;

	ck_assert_int_eq(pthread_create(&t, NULL, probe_main, p), 0);
	pthread_join(t, NULL);
}

START_TEST(test_locks_know_their_holder)
{
	struct ts_mutex m;
	struct ts_rwlock l;
	struct held_probe p = {&m, &l, true, true, true};
	pthread_cond_t c = PTHREAD_COND_INITIALIZER;
	struct timespec past = {0, 0};

	ck_assert_int_eq(ts_mutex_init(&m), 0);
	ck_assert_int_eq(ts_rwlock_init(&l), 0);
	ck_assert(!ts_mutex_held(&m) && !ts_rwlock_held(&l) && !ts_rwlock_writing(&l));
	ts_mutex_lock(&m);
	ck_assert_int_ne(ts_mutex_wait(&m, &c, &past), 0);   /* times out, held again */
	ck_assert(ts_mutex_held(&m));
	ts_rwlock_wrlock(&l);
	ck_assert(ts_mutex_held(&m) && ts_rwlock_writing(&l) && ts_rwlock_held(&l));
	probe(&p);                    /* another thread holds neither */
	ck_assert(!p.mutex_held && !p.writing && !p.held);
	ts_rwlock_unlock(&l);
	ts_mutex_unlock(&m);
	ck_assert(!ts_mutex_held(&m) && !ts_rwlock_held(&l));
	ts_rwlock_rdlock(&l);
	ck_assert(ts_rwlock_held(&l) && !ts_rwlock_writing(&l));
	probe(&p);                    /* a reader's identity is not kept */
	ck_assert(p.held && !p.writing);
	ts_rwlock_unlock(&l);
	ck_assert(!ts_rwlock_held(&l));
	ts_rwlock_destroy(&l);
	ts_mutex_destroy(&m);
	pthread_cond_destroy(&c);
}
END_TEST

START_TEST(test_size_parse)
{
	static const struct {
		const char *s;
		uint64_t v;
	} ok[] = {
		{"0", 0}, {"512", 512}, {"512B", 512}, {"1K", 1024}, {"1KiB", 1024},
		{"1kb", 1000}, {"2GiB", 2ull << 30}, {"2gib", 2ull << 30}, {"2G", 2ull << 30},
		{"1.5MiB", 1572864}, {"3MB", 3000000}, {"1TiB", 1ull << 40}, {"64 MiB", 64ull << 20},
	};
	static const char *const bad[] = {"", "-1", "abc", "1XB", "GiB", "1e30TiB", "nan",
	                                   "inf", " 1", "1GiBx", "0x10"};
	uint64_t v;

	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		ck_assert_msg(ts_parse_size(ok[i].s, &v), "%s should parse", ok[i].s);
		ck_assert_uint_eq(v, ok[i].v);
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ck_assert_msg(!ts_parse_size(bad[i], &v), "'%s' should not parse", bad[i]);
	ck_assert(!ts_parse_size(NULL, &v));
}
END_TEST

/* RFC 3339 UTC with microseconds; 0 is never (false, empty). */
START_TEST(test_rfc3339_format)
{
	char buf[32];

	ck_assert(ts_format_rfc3339(buf, sizeof buf, 1764768498123456789ull));
	ck_assert_str_eq(buf, "2025-12-03T13:28:18.123456Z");
	ck_assert(ts_format_rfc3339(buf, sizeof buf, 1));
	ck_assert_str_eq(buf, "1970-01-01T00:00:00.000000Z");
	ck_assert(!ts_format_rfc3339(buf, sizeof buf, 0));
	ck_assert_str_eq(buf, "");
}
END_TEST

START_TEST(test_size_format)
{
	char buf[32];

	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 0), "0 B");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 1023), "1023 B");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 1024), "1.00 KiB");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 2ull << 30), "2.00 GiB");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 768ull << 20), "768.00 MiB");
	/* the device layer's messages use it too: every unit up to EiB */
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, 3ull << 60), "3.00 EiB");
	ck_assert_str_eq(ts_format_bytes(buf, sizeof buf, UINT64_MAX), "16.00 EiB");
}
END_TEST

START_TEST(test_long_parse)
{
	long v;

	ck_assert(ts_parse_long("42", 0, 100, &v) && v == 42);
	ck_assert(ts_parse_long("-1", -1, 5, &v) && v == -1);
	ck_assert(!ts_parse_long("101", 0, 100, &v));
	ck_assert(!ts_parse_long("4x", 0, 100, &v));
	ck_assert(!ts_parse_long("", 0, 100, &v));
	ck_assert(!ts_parse_long("99999999999999999999999", 0, 100, &v));
}
END_TEST

START_TEST(test_json_escape)
{
	char buf[64];

	ck_assert_str_eq(ts_json_escape(buf, sizeof buf, "a\"b\\c\n"), "a\\\"b\\\\c\\u000a");
	/* truncation keeps the result a valid string */
	ts_json_escape(buf, 10, "\"\"\"\"\"\"\"\"\"\"");
	ck_assert_uint_lt(strlen(buf), 10);
	ck_assert(strlen(buf) % 2 == 0);
}
END_TEST

START_TEST(test_log_levels)
{
	enum ts_log_level l;

	ck_assert(ts_log_level_parse("debug", &l) && l == TS_LOG_DEBUG);
	ck_assert(ts_log_level_parse("WARN", &l) && l == TS_LOG_WARN);
	ck_assert(ts_log_level_parse("warning", &l) && l == TS_LOG_WARN);
	ck_assert(!ts_log_level_parse("loud", &l));
	ts_log_set_level(TS_LOG_WARN);
	ck_assert(!ts_log_enabled(TS_LOG_INFO));
	ck_assert(ts_log_enabled(TS_LOG_ERROR));
	ts_log_set_level(TS_LOG_INFO);
}
END_TEST


START_TEST(test_utf8_check)
{
	static const struct {
		const char *s;
		size_t len;
		enum ts_utf8_fault want;
		size_t at;
	} cases[] = {
		{"plain ascii", 11, TS_UTF8_OK, 0},
		{"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, TS_UTF8_OK, 0},
		{"a\0b", 3, TS_UTF8_NUL, 1},
		{"ab\xc0\x80", 4, TS_UTF8_NUL, 2},            /* a decoded %00 */
		{"\xff", 1, TS_UTF8_INVALID, 0},
		{"ab\x80", 3, TS_UTF8_INVALID, 2},            /* lone continuation */
		{"\xc3", 1, TS_UTF8_INVALID, 0},              /* cut */
		{"\xe2\x82", 2, TS_UTF8_INVALID, 0},
		{"\xc1\xbf", 2, TS_UTF8_INVALID, 0},          /* overlong */
		{"\xe0\x80\xaf", 3, TS_UTF8_INVALID, 0},      /* overlong '/' */
		{"\xed\xa0\x80", 3, TS_UTF8_INVALID, 0},      /* surrogate */
		{"\xf4\x90\x80\x80", 4, TS_UTF8_INVALID, 0},  /* above U+10FFFF */
		{"\xf5\x80\x80\x80", 4, TS_UTF8_INVALID, 0},
		{"x\xc3(", 3, TS_UTF8_INVALID, 1},
	};

	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		size_t at = 99;
		enum ts_utf8_fault f = ts_utf8_check(cases[i].s, cases[i].len, &at);

		ck_assert_msg(f == cases[i].want, "case %zu: fault %d, want %d", i, f, cases[i].want);
		if (f != TS_UTF8_OK)
			ck_assert_msg(at == cases[i].at, "case %zu: at %zu, want %zu", i, at, cases[i].at);
	}
}
END_TEST

/* Long text is scanned a word at a time: a fault is found, and at its
 * offset, wherever it falls against the words, and text around it is
 * copied by sanitize as it is. */
START_TEST(test_utf8_faults_at_every_offset)
{
	static const struct {
		const char *bytes;
		size_t len;
		enum ts_utf8_fault want;
	} faults[] = {
		{"\0", 1, TS_UTF8_NUL}, {"\xc0\x80", 2, TS_UTF8_NUL}, {"\xff", 1, TS_UTF8_INVALID},
		{"\x80", 1, TS_UTF8_INVALID}, {"\xed\xa0\x80", 3, TS_UTF8_INVALID},
	};
	char s[64], out[80];

	for (size_t f = 0; f < sizeof faults / sizeof faults[0]; f++)
		for (size_t pos = 0; pos + faults[f].len <= 40; pos++) {
			size_t at = 99;

			memset(s, 'a' + (int)(pos % 26), sizeof s);
			memcpy(s + pos, faults[f].bytes, faults[f].len);
			ck_assert_int_eq(ts_utf8_check(s, 40, &at), faults[f].want);
			ck_assert_uint_eq(at, pos);
			/* a valid character there instead: no fault */
			memset(s + pos, 'a', faults[f].len);
			if (pos + 2 <= 40)
				memcpy(s + pos, "\xc3\xa9", 2);
			ck_assert_int_eq(ts_utf8_check(s, 40, NULL), TS_UTF8_OK);
		}
	/* sanitize: ASCII runs copied whole, cut to the room there is */
	memset(s, 'x', 40);
	s[40] = '\0';
	s[20] = '\xff';
	ts_utf8_sanitize(out, sizeof out, s);
	ck_assert_uint_eq(strlen(out), 42);
	ck_assert(memcmp(out, s, 20) == 0 && memcmp(out + 20, "\xef\xbf\xbd", 3) == 0 &&
	          memcmp(out + 23, s + 21, 19) == 0);
	ts_utf8_sanitize(out, 12, s);
	ck_assert_str_eq(out, "xxxxxxxxxxx");
}
END_TEST

/* A cut message ends on a character boundary; jansson takes the result. */
/* An echo of client text cut to a length never ends inside a character
 * (a fuzz_query finding: a 4-byte character cut after its first byte). */
START_TEST(test_utf8_prefix_on_boundaries)
{
	static const char key[] = "devit\xf4\x86\x9b\x8e" "e";   /* U+1066CE after 5 bytes */
	static const char two[] = "\xc3\xa9\xc3\xa9";                /* "éé" */

	ck_assert_int_eq(ts_utf8_prefix(key, 10, 64), 10);          /* shorter than max */
	ck_assert_int_eq(ts_utf8_prefix(key, 10, 6), 5);            /* not after \xf4 */
	ck_assert_int_eq(ts_utf8_prefix(key, 10, 8), 5);
	ck_assert_int_eq(ts_utf8_prefix(key, 10, 9), 9);            /* the whole character */
	ck_assert_int_eq(ts_utf8_prefix(two, 4, 3), 2);
	ck_assert_int_eq(ts_utf8_prefix(two, 4, 1), 0);
	ck_assert_int_eq(ts_utf8_prefix(two, 4, 0), 0);
	for (size_t max = 0; max <= 10; max++) {
		int n = ts_utf8_prefix(key, 10, max);

		ck_assert_int_eq(ts_utf8_check(key, (size_t)n, NULL), TS_UTF8_OK);
	}
}
END_TEST

START_TEST(test_utf8_trim_and_sanitize)
{
	char s[16], out[16];
	json_t *j;

	snprintf(s, sizeof s, "ab\xe2\x82");
	ck_assert_str_eq(ts_utf8_trim(s), "ab");
	snprintf(s, sizeof s, "ab\xe2\x82\xac");
	ck_assert_str_eq(ts_utf8_trim(s), "ab\xe2\x82\xac");
	snprintf(s, sizeof s, "ab\xf0");
	ck_assert_str_eq(ts_utf8_trim(s), "ab");
	snprintf(s, sizeof s, "abc");
	ck_assert_str_eq(ts_utf8_trim(s), "abc");

	ck_assert_str_eq(ts_utf8_sanitize(out, sizeof out, "a\xff" "b"), "a\xef\xbf\xbd" "b");
	ck_assert_str_eq(ts_utf8_sanitize(out, sizeof out, "ab\xe2\x82"), "ab");
	/* too small: cut before a whole character, never inside one */
	ck_assert_str_eq(ts_utf8_sanitize(out, 5, "ab\xe2\x82\xac"), "ab");
	ck_assert_str_eq(ts_utf8_sanitize(out, 6, "ab\xe2\x82\xac"), "ab\xe2\x82\xac");
	ck_assert_str_eq(ts_utf8_sanitize(out, sizeof out, NULL), "");

	j = ts_json_text("bad \xc0\x80 and \xff");
	ck_assert_ptr_nonnull(j);
	ck_assert_ptr_nonnull(strstr(json_string_value(j), "bad "));
	json_decref(j);
}
END_TEST

/* ts_error_set cuts a long message on a character boundary. */
START_TEST(test_error_message_boundary)
{
	struct ts_error e;
	char big[TS_ERROR_MESSAGE_MAX * 2];

	fill_e_acute(big, sizeof big);
	ts_error_clear(&e);
	ts_error_set(&e, TS_INVALID_ARGUMENT, "R", "%s", big);
	ck_assert_int_eq(ts_utf8_check(e.message, strlen(e.message), NULL), TS_UTF8_OK);
	ck_assert_uint_gt(strlen(e.message), TS_ERROR_MESSAGE_MAX - 4);
	ts_error_meta(&e, "k", "%s", big);
	ck_assert_int_eq(ts_utf8_check(e.meta[0].value, strlen(e.meta[0].value), NULL), TS_UTF8_OK);

	/* echoed bytes that are not UTF-8 (found by fuzz_wait: a ?timeout= of
	 * "\xdd\xc9\xe6i\"]" echoed as it came) are a valid JSON string once
	 * rendered */
	ts_error_clear(&e);
	ts_error_set(&e, TS_INVALID_ARGUMENT, "BAD_TIMEOUT", "timeout '%s' is bad", "\xdd\xc9\xe6i\"]");
	{
		json_t *j = ts_json_text(e.message);

		ck_assert_ptr_nonnull(j);
		ck_assert_ptr_nonnull(strstr(json_string_value(j), "i\"]' is bad"));
		json_decref(j);
	}
}
END_TEST

/* Runs fn with stderr going to a file; returns what it wrote (caller frees). */
static char *capture_stderr(void (*fn)(void))
{
	char path[] = "/tmp/test_common_logXXXXXX";
	int fd = mkstemp(path), saved = dup(STDERR_FILENO);
	char *text;
	long len;
	FILE *f;

	ck_assert_int_ge(fd, 0);
	dup2(fd, STDERR_FILENO);
	fn();
	dup2(saved, STDERR_FILENO);
	close(saved);
	f = fdopen(fd, "r");
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	rewind(f);
	text = calloc(1, (size_t)len + 1);
	ck_assert_int_eq(fread(text, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	unlink(path);
	return text;
}

static void hostile_lines(void)
{
	ts_log_set_level(TS_LOG_INFO);
	/* a message with quotes, newlines and bytes that are not UTF-8 */
	ts_log(TS_LOG_INFO, NULL, "method GE\"T\n\"forged\":1 \xff\xc0\x80");
	/* legacy fields that try to forge: invalid, and overriding level */
	ts_log(TS_LOG_INFO, "\"a\":\"x\",\"level\":\"error\"", "override");
	ts_log(TS_LOG_INFO, "\"a\":\"x\"},{\"b\":1", "broken");
	ts_log_json(TS_LOG_WARN, json_pack("{s:o, s:i}", "path", ts_json_text("/v1/\xff\""),
	                                   "status", 404), "request");
	ts_log_json(TS_LOG_DEBUG, json_pack("{s:i}", "x", 1), "dropped below the level");
}

/* Every line is one JSON object with ts, level and msg that fields cannot
 * override, whatever bytes the message or fields hold. */
/* Each observation lands in the first bucket whose bound holds it (a bound
 * is inclusive), past every bound in +Inf; buckets read cumulative and the
 * count is the last. */
START_TEST(test_histogram_buckets)
{
	static const double bounds[] = {0.001, 0.01, 1};
	struct ts_histogram h;
	struct ts_histogram_snapshot s;

	ts_histogram_init(&h, bounds, 3);
	ts_histogram_read(&h, &s);
	ck_assert_uint_eq(s.count, 0);
	ck_assert(s.sum_seconds == 0);
	ts_histogram_observe(&h, 0);                /* 0 s: first bucket */
	ts_histogram_observe(&h, 1000000);          /* exactly 1 ms: first bucket */
	ts_histogram_observe(&h, 1000001);          /* just past: second */
	ts_histogram_observe(&h, 500000000);        /* 0.5 s: third */
	ts_histogram_observe(&h, 3000000000ull);    /* 3 s: +Inf */
	ts_histogram_read(&h, &s);
	ck_assert_uint_eq(s.cumulative[0], 2);
	ck_assert_uint_eq(s.cumulative[1], 3);
	ck_assert_uint_eq(s.cumulative[2], 4);
	ck_assert_uint_eq(s.cumulative[3], 5);
	ck_assert_uint_eq(s.count, 5);
	ck_assert_msg(s.sum_seconds > 3.502 && s.sum_seconds < 3.503, "sum %.9f", s.sum_seconds);
	/* more bounds than fit are cut to TS_HISTOGRAM_MAX */
	{
		double many[TS_HISTOGRAM_MAX + 5];

		for (size_t i = 0; i < sizeof many / sizeof many[0]; i++)
			many[i] = (double)(i + 1);
		ts_histogram_init(&h, many, sizeof many / sizeof many[0]);
		ck_assert_uint_eq(h.nbounds, TS_HISTOGRAM_MAX);
		ts_histogram_observe(&h, 1000000000000ull);
		ts_histogram_read(&h, &s);
		ck_assert_uint_eq(s.cumulative[TS_HISTOGRAM_MAX - 1], 0);
		ck_assert_uint_eq(s.cumulative[TS_HISTOGRAM_MAX], 1);
	}
}
END_TEST

START_TEST(test_log_lines_are_json)
{
	char *text = capture_stderr(hostile_lines), *p = text;
	int lines = 0;

	while (*p) {
		char *nl = strchr(p, '\n');
		json_error_t e;
		json_t *j;

		ck_assert_ptr_nonnull(nl);
		j = json_loadb(p, (size_t)(nl - p), JSON_REJECT_DUPLICATES, &e);
		ck_assert_msg(j && json_is_object(j), "line %d is not JSON: %.*s (%s)", lines,
		              (int)(nl - p), p, e.text);
		ck_assert(json_is_string(json_object_get(j, "ts")));
		ck_assert(json_is_string(json_object_get(j, "msg")));
		ck_assert(json_is_string(json_object_get(j, "level")));
		if (lines == 0) {
			ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(j, "msg")),
			                             "GE\"T\n\"forged\":1"));
			ck_assert_ptr_null(json_object_get(j, "forged"));
		}
		if (lines == 1) {
			ck_assert_str_eq(json_string_value(json_object_get(j, "level")), "info");
			ck_assert_str_eq(json_string_value(json_object_get(j, "a")), "x");
		}
		if (lines == 2)
			ck_assert(json_is_string(json_object_get(j, "fields")));
		if (lines == 3) {
			ck_assert_str_eq(json_string_value(json_object_get(j, "level")), "warn");
			ck_assert_int_eq(json_integer_value(json_object_get(j, "status")), 404);
		}
		json_decref(j);
		lines++;
		p = nl + 1;
	}
	ck_assert_int_eq(lines, 4);
	free(text);
}
END_TEST

/* A streaming copy is a copy: every size around the thresholds, at every
 * destination alignment, leaving the bytes around the target untouched. */
START_TEST(test_streaming_copy_exact)
{
	static const size_t sizes[] = {0, 1, 15, 63, 64, 4095, 4096, 4097, 4096 + 63, 32768, 100003};
	unsigned char *src = malloc(100003 + 64), *dst = malloc(100003 + 96);
	unsigned char *fill = malloc(100003 + 96);

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(dst);
	ck_assert_ptr_nonnull(fill);
	memset(fill, 0xA5, 100003 + 96);
	for (size_t i = 0; i < 100003 + 64; i++)
		src[i] = (unsigned char)(i * 131 + 7);
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
		for (size_t off = 0; off < 17; off++) {
			memset(dst, 0xA5, 100003 + 96);
			ts_copy_streaming(dst + 16 + off, src + (off * 3) % 64, sizes[k]);
			ck_assert_int_eq(memcmp(dst + 16 + off, src + (off * 3) % 64, sizes[k]), 0);
			ck_assert_int_eq(memcmp(dst, fill, 16 + off), 0);
			ck_assert_int_eq(memcmp(dst + 16 + off + sizes[k], fill,
			                        100003 + 96 - (16 + off + sizes[k])), 0);
		}
	free(src);
	free(dst);
	free(fill);
}
END_TEST

/* ---- the growing text buffer ------------------------------------------------------ */

/* Appends of every kind, past several growths, read back against the same
 * text printed by snprintf into one large buffer. */
START_TEST(test_textbuf_appends_grow_and_take)
{
	static const uint64_t nums[] = {0, 9, 10, 4294967295ull, 18446744073709551615ull};
	struct ts_textbuf b;
	size_t cap = 1 << 20, len = 0, got_len = 12345;
	char *want = malloc(cap), *got, big[3000];

	ck_assert_ptr_nonnull(want);
	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	ts_textbuf_init(&b);
	for (int i = 0; i < 2000; i++) {
		uint64_t v = nums[i % 5] + (uint64_t)i * (i % 5 == 4 ? 0 : 7919);

		ts_textbuf_printf(&b, "[%d:%s]", i, i % 3 ? "ab" : "");
		len += (size_t)snprintf(want + len, cap - len, "[%d:%s]", i, i % 3 ? "ab" : "");
		ts_textbuf_u64(&b, v);
		len += (size_t)snprintf(want + len, cap - len, "%llu", (unsigned long long)v);
		ts_textbuf_puts(&b, i % 2 ? "," : "");
		len += (size_t)snprintf(want + len, cap - len, "%s", i % 2 ? "," : "");
		ts_textbuf_add(&b, "yz!", 2);
		len += (size_t)snprintf(want + len, cap - len, "yz");
		if (i % 500 == 0) {       /* one print larger than the room left */
			ts_textbuf_printf(&b, "%s", big);
			len += (size_t)snprintf(want + len, cap - len, "%s", big);
		}
	}
	ck_assert(!ts_textbuf_failed(&b));
	got = ts_textbuf_take(&b, &got_len);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(got_len, len);
	ck_assert_uint_eq(strlen(got), len);
	ck_assert_int_eq(memcmp(got, want, len + 1), 0);
	/* taken: the buffer is empty again and answers an empty text */
	got_len = 12345;
	free(got);
	got = ts_textbuf_take(&b, &got_len);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(got_len, 0);
	ck_assert_str_eq(got, "");
	free(got);
	free(want);
}
END_TEST

/* A JSON string is what jansson's encoder writes for it, byte for byte. */
START_TEST(test_textbuf_json_string_as_jansson_writes_it)
{
	char every[128];
	const char *cases[] = {
		"", "plain", "sim:0", "host/pinned_host", "q\"u\"o\\te", "\"", "\\",
		"tab\there\nnl\rcr\bbs\ffeed", "\x01\x1f\x7f", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
		"/slash/", every,
	};

	for (int c = 1; c < 128; c++)
		every[c - 1] = (char)c;
	every[127] = '\0';
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct ts_textbuf b = {0};
		json_t *j = json_string(cases[i]);
		char *want = json_dumps(j, JSON_ENCODE_ANY), *got;

		ck_assert_ptr_nonnull(want);
		ts_textbuf_puts(&b, "x");
		ts_textbuf_json_string(&b, cases[i]);
		got = ts_textbuf_take(&b, NULL);
		ck_assert_ptr_nonnull(got);
		ck_assert_msg(got[0] == 'x' && strcmp(got + 1, want) == 0, "case %zu: %s, not %s", i,
		              got + 1, want);
		free(got);
		free(want);
		json_decref(j);
	}
}
END_TEST

/* The first failed append is remembered: every later one is ignored and
 * the text is answered as NULL once, at the end. */
START_TEST(test_textbuf_failure_is_sticky)
{
	struct ts_textbuf b;
	size_t len = 7;

	ts_textbuf_init(&b);
	ts_textbuf_puts(&b, "before");
	ck_assert(ts_textbuf_reserve(&b, 100));
	ck_assert(!ts_textbuf_failed(&b));
	ck_assert(!ts_textbuf_reserve(&b, SIZE_MAX - 3));     /* no buffer is that large */
	ck_assert(ts_textbuf_failed(&b));
	ts_textbuf_puts(&b, "after");
	ts_textbuf_printf(&b, "%d", 42);
	ts_textbuf_u64(&b, 42);
	ts_textbuf_json_string(&b, "s");
	ck_assert(!ts_textbuf_reserve(&b, 1));
	ck_assert(ts_textbuf_failed(&b));
	ck_assert_ptr_null(ts_textbuf_take(&b, &len));
	ck_assert_uint_eq(len, 7);
	/* taken, the buffer is empty and whole again */
	ck_assert(!ts_textbuf_failed(&b));
	ts_textbuf_puts(&b, "again");
	ck_assert(!ts_textbuf_failed(&b));
	ts_textbuf_release(&b);
	ck_assert(!ts_textbuf_failed(&b));
	ck_assert_ptr_null(b.buf);
}
END_TEST

/* RFC 4648's vectors decode, padded and (when allowed) not; everything
 * that is not the canonical encoding, or too long for the buffer, is -1
 * and writes nothing past the buffer. */
START_TEST(test_base64_decode)
{
	static const char *const vec[][2] = {
		{"", ""}, {"Zg==", "f"}, {"Zm8=", "fo"}, {"Zm9v", "foo"}, {"Zm9vYg==", "foob"},
		{"Zm9vYmE=", "fooba"}, {"Zm9vYmFy", "foobar"},
	};
	static const char *const bad[] = {
		"Z", "Zg=", "Zg===", "Z===", "Zh==", "Zm9=", "Zg==Zg==", "Zm 9v", "Zm9v\n",
		"Zm-v", "Zm_v", "=Zm9", "Zm=v",
	};
	char out[16];

	for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
		size_t n = strlen(vec[i][0]), want = strlen(vec[i][1]), bare = n;

		memset(out, '#', sizeof out);
		ck_assert_int_eq(ts_base64_decode(vec[i][0], n, true, out, want), (long)want);
		ck_assert(memcmp(out, vec[i][1], want) == 0 && out[want] == '#');
		ck_assert_int_eq(ts_base64_decode(vec[i][0], n, false, out, sizeof out), (long)want);
		/* too small a buffer: refused, untouched */
		if (want) {
			memset(out, '#', sizeof out);
			ck_assert_int_eq(ts_base64_decode(vec[i][0], n, true, out, want - 1), -1);
			ck_assert_int_eq(out[0], '#');
		}
		/* without its padding: only when padding is optional */
		while (bare && vec[i][0][bare - 1] == '=')
			bare--;
		if (bare < n) {
			ck_assert_int_eq(ts_base64_decode(vec[i][0], bare, false, out, sizeof out),
			                 (long)want);
			ck_assert_int_eq(ts_base64_decode(vec[i][0], bare, true, out, sizeof out), -1);
		}
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ck_assert_msg(ts_base64_decode(bad[i], strlen(bad[i]), false, out, sizeof out) == -1,
		              "'%s' decoded", bad[i]);
		ck_assert_msg(ts_base64_decode(bad[i], strlen(bad[i]), true, out, sizeof out) == -1,
		              "'%s' decoded (padded)", bad[i]);
	}
	/* every byte value, through the whole alphabet */
	ck_assert_int_eq(ts_base64_decode("AP8Q", 4, true, out, 3), 3);
	ck_assert(memcmp(out, "\x00\xff\x10", 3) == 0);
	ck_assert_int_eq(ts_base64_decode("+/+/", 4, true, out, 3), 3);
	ck_assert(memcmp(out, "\xfb\xff\xbf", 3) == 0);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("common");
	TCase *tc = tcase_create("core"), *textbuf = tcase_create("textbuf");

	tcase_add_test(tc, test_status_canonical_mapping);
	tcase_add_test(tc, test_status_from_errno);
	tcase_add_test(tc, test_error_first_wins);
	tcase_add_test(tc, test_error_bad_and_oom_helpers);
	tcase_add_test(tc, test_error_message_keeps_reason);
	tcase_add_test(tc, test_page_token_codec);
	tcase_add_test(tc, test_error_oom_figures);
	tcase_add_test(tc, test_locks_know_their_holder);
	tcase_add_test(tc, test_size_parse);
	tcase_add_test(tc, test_size_format);
	tcase_add_test(tc, test_rfc3339_format);
	tcase_add_test(tc, test_long_parse);
	tcase_add_test(tc, test_json_escape);
	tcase_add_test(tc, test_log_levels);
	tcase_add_test(tc, test_utf8_check);
	tcase_add_test(tc, test_utf8_faults_at_every_offset);
	tcase_add_test(tc, test_utf8_trim_and_sanitize);
	tcase_add_test(tc, test_utf8_prefix_on_boundaries);
	tcase_add_test(tc, test_error_message_boundary);
	tcase_add_test(tc, test_log_lines_are_json);
	tcase_add_test(tc, test_histogram_buckets);
	tcase_add_test(tc, test_streaming_copy_exact);
	tcase_add_test(tc, test_base64_decode);
	suite_add_tcase(s, tc);
	tcase_add_test(textbuf, test_textbuf_appends_grow_and_take);
	tcase_add_test(textbuf, test_textbuf_json_string_as_jansson_writes_it);
	tcase_add_test(textbuf, test_textbuf_failure_is_sticky);
	suite_add_tcase(s, textbuf);
	return s;
}
