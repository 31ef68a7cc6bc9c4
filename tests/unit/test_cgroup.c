/*
 * test_cgroup.c - the cgroup memory limit read from a fake tree: v2 and v1
 * layouts, a parent's tighter limit, "max" and v1's unlimited value, and
 * files that are missing or malformed.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/cgroup.h"
#include "tests/unit/unit.h"

static char root[256], self[300];

static void put(const char *rel, const char *text)
{
	char p[600], *slash;
	FILE *f;

	snprintf(p, sizeof p, "%s/%s", root, rel);
	for (slash = strchr(p + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		mkdir(p, 0700);
		*slash = '/';
	}
	f = fopen(p, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static void setup(void)
{
	snprintf(root, sizeof root, "/tmp/test_cgroup.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(self, sizeof self, "%s/self", root);
}

static void teardown(void)
{
	char cmd[300];

	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_v2_own_and_parent)
{
	uint64_t limit = 0;

	put("self", "0::/kubepods/pod1/c1\n");
	put("kubepods/pod1/c1/memory.max", "max\n");
	put("kubepods/pod1/memory.max", "1073741824\n");
	put("kubepods/memory.max", "4294967296\n");
	ck_assert(ts_cgroup_memory_limit(root, self, &limit));
	ck_assert_uint_eq(limit, 1ull << 30);
	put("kubepods/pod1/c1/memory.max", "536870912\n");
	ck_assert(ts_cgroup_memory_limit(root, self, &limit));
	ck_assert_uint_eq(limit, 512ull << 20);
}
END_TEST

START_TEST(test_v2_namespace_root)
{
	uint64_t limit = 0;

	/* inside a cgroup namespace the process sits at "/" */
	put("self", "0::/\n");
	put("memory.max", "268435456\n");
	ck_assert(ts_cgroup_memory_limit(root, self, &limit));
	ck_assert_uint_eq(limit, 256ull << 20);
	put("memory.max", "max\n");
	ck_assert(!ts_cgroup_memory_limit(root, self, &limit));
}
END_TEST

START_TEST(test_v1_memory_controller)
{
	uint64_t limit = 0;

	put("self", "9:name=systemd:/\n5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n");
	put("memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");  /* unlimited */
	put("memory/docker/memory.limit_in_bytes", "2147483648\n");
	ck_assert(ts_cgroup_memory_limit(root, self, &limit));
	ck_assert_uint_eq(limit, 2ull << 30);
	/* the controller listed with others */
	put("self", "4:cpuset,memory:/docker/abc\n");
	ck_assert(ts_cgroup_memory_limit(root, self, &limit));
	ck_assert_uint_eq(limit, 2ull << 30);
	/* a path the mount does not show: the mount's own folder still counts */
	put("self", "4:memory:/elsewhere/zzz\n");
	put("memory/memory.limit_in_bytes", "3221225472\n");
	ck_assert(ts_cgroup_memory_limit(root, self, &limit));
	ck_assert_uint_eq(limit, 3ull << 30);
}
END_TEST

START_TEST(test_nothing_to_read)
{
	uint64_t limit = 7;

	ck_assert(!ts_cgroup_memory_limit(root, self, &limit));          /* no self file */
	put("self", "4:cpu:/a\n");                                       /* no memory line */
	ck_assert(!ts_cgroup_memory_limit(root, self, &limit));
	put("self", "0::/a\n");
	put("a/memory.max", "lots\n");                                    /* malformed */
	ck_assert(!ts_cgroup_memory_limit(root, self, &limit));
	put("a/memory.max", "12x\n");
	ck_assert(!ts_cgroup_memory_limit(root, self, &limit));
	ck_assert_uint_eq(limit, 7);
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("cgroup");
	TCase *tc = tcase_create("memory_limit");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_v2_own_and_parent);
	tcase_add_test(tc, test_v2_namespace_root);
	tcase_add_test(tc, test_v1_memory_controller);
	tcase_add_test(tc, test_nothing_to_read);
	suite_add_tcase(s, tc);
	return s;
}
