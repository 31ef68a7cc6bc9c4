/*
 * test_beneath.c - client paths made relative to a directory by text, and
 * opened below it without following links, blocking on FIFOs or accepting
 * anything but a regular file; both through openat2 and the openat walk.
 */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/beneath.h"
#include "tests/unit/unit.h"

static ts_status rel_of(const char *path, char *rel, struct ts_error *err)
{
	ts_error_clear(err);
	return ts_path_beneath("/srv/data", "/link/data", path, rel, 256, err);
}

START_TEST(test_normalises_by_text)
{
	static const char *const ok[][2] = {
		{"a.safetensors", "a.safetensors"},
		{"/srv/data/a.safetensors", "a.safetensors"},
		{"/link/data/sub/a", "sub/a"},
		{"./sub//a", "sub/a"},
		{"sub/../a", "a"},
		{"/srv/data/sub/x/../../a", "a"},
		{"/srv/data", ""},
		{"/srv/data/", ""},
		{"sub/.", "sub"},
	};
	static const char *const out[] = {
		"/etc/passwd", "/srv/data-x/a", "/srv/dat", "..", "../data/a", "sub/../../a",
		"/srv/data/../data/a", "/srv/data/sub/../../etc/passwd", "missing/../../x",
	};
	struct ts_error err;
	char rel[256];

	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		ck_assert_msg(rel_of(ok[i][0], rel, &err) == TS_OK, "%s: %s", ok[i][0], err.message);
		ck_assert_str_eq(rel, ok[i][1]);
	}
	for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) {
		ck_assert_msg(rel_of(out[i], rel, &err) == TS_PERMISSION_DENIED, "%s", out[i]);
		ck_assert_str_eq(err.reason, "PATH_NOT_ALLOWED");
		ck_assert_ptr_null(strstr(err.message, "/srv/data'"));
	}
	ck_assert_int_eq(rel_of("", rel, &err), TS_INVALID_ARGUMENT);
	ts_error_clear(&err);
	ck_assert_int_eq(ts_path_beneath("/srv/data", NULL, "aaaaaaaaaa", rel, 8, &err),
	                 TS_INVALID_ARGUMENT);
}
END_TEST

static char dir[PATH_MAX], outer[256];
static int dirfd = -1;

static void make(const char *name, const char *text)
{
	char p[PATH_MAX + 64];
	FILE *f;

	snprintf(p, sizeof p, "%s/%s", dir, name);
	f = fopen(p, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static void at(const char *name, char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/%s", dir, name);
}

static void setup(void)
{
	char p[PATH_MAX + 64], q[PATH_MAX + 64];

	snprintf(outer, sizeof outer, "/tmp/test_beneath.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(outer));
	snprintf(dir, sizeof dir, "%s/data", outer);
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	make("a", "hello");
	at("sub", p, sizeof p);
	ck_assert_int_eq(mkdir(p, 0700), 0);
	make("sub/b", "xy");
	snprintf(p, sizeof p, "%s/secret", outer);
	ck_assert_int_eq(mkdir(p, 0700), 0);
	snprintf(p, sizeof p, "%s/secret/s", outer);
	fclose(fopen(p, "w"));
	at("evil", q, sizeof q);
	ck_assert_int_eq(symlink(p, q), 0);                  /* a file outside */
	at("inner", q, sizeof q);
	ck_assert_int_eq(symlink("a", q), 0);                /* a file inside, by a link */
	snprintf(p, sizeof p, "%s/secret", outer);
	at("hole", q, sizeof q);
	ck_assert_int_eq(symlink(p, q), 0);                  /* a directory outside */
	at("fifo", q, sizeof q);
	ck_assert_int_eq(mkfifo(q, 0600), 0);
	dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	ck_assert_int_ge(dirfd, 0);
}

static void teardown(void)
{
	char cmd[PATH_MAX + 32];

	close(dirfd);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", outer);
	ck_assert_int_eq(system(cmd), 0);
}

typedef ts_status opener(int, const char *, const char *, int *, uint64_t *, struct ts_error *);

static void check_opens(opener *fn)
{
	static const struct {
		const char *rel;
		ts_status st;
		const char *reason;
	} cases[] = {
		{"evil", TS_PERMISSION_DENIED, "PATH_NOT_ALLOWED"},
		{"inner", TS_PERMISSION_DENIED, "PATH_NOT_ALLOWED"},
		{"hole/s", TS_PERMISSION_DENIED, "PATH_NOT_ALLOWED"},
		{"hole/missing", TS_PERMISSION_DENIED, "PATH_NOT_ALLOWED"},
		{"missing", TS_NOT_FOUND, "FILE_NOT_FOUND"},
		{"a/x", TS_NOT_FOUND, "FILE_NOT_FOUND"},
		{"fifo", TS_INVALID_ARGUMENT, "NOT_A_REGULAR_FILE"},   /* and it does not block */
		{"sub", TS_INVALID_ARGUMENT, "NOT_A_REGULAR_FILE"},
		{"", TS_INVALID_ARGUMENT, "NOT_A_REGULAR_FILE"},
	};
	struct ts_error err;
	uint64_t size = 0;
	char buf[8];
	int fd = -1;

	ts_error_clear(&err);
	ck_assert_int_eq(fn(dirfd, "a", "a", &fd, &size, &err), TS_OK);
	ck_assert_uint_eq(size, 5);
	ck_assert_int_eq(read(fd, buf, sizeof buf), 5);
	close(fd);
	ck_assert_int_eq(fn(dirfd, "sub/b", "sub/b", &fd, &size, &err), TS_OK);
	ck_assert_uint_eq(size, 2);
	close(fd);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		ts_error_clear(&err);
		fd = 7;
		ck_assert_msg(fn(dirfd, cases[i].rel, "shown", &fd, &size, &err) == cases[i].st,
		              "%s: %s", cases[i].rel, err.message);
		ck_assert_str_eq(err.reason, cases[i].reason);
		ck_assert_int_eq(fd, -1);
		ck_assert_ptr_nonnull(strstr(err.message, "'shown'"));
		ck_assert_ptr_null(strstr(err.message, outer));
	}
}

START_TEST(test_opens_with_openat2)
{
	check_opens(ts_open_beneath);
}
END_TEST

START_TEST(test_opens_by_walk)
{
	check_opens(ts__open_beneath_walk);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("beneath");
	TCase *tc = tcase_create("text");
	TCase *fs = tcase_create("open");

	tcase_add_test(tc, test_normalises_by_text);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(fs, setup, teardown);
	tcase_add_test(fs, test_opens_with_openat2);
	tcase_add_test(fs, test_opens_by_walk);
	suite_add_tcase(s, fs);
	return s;
}
