/*
 * test_config.c - flags, TSTAGE_* variables, precedence, and refusals that
 * name the option.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "server/config.h"
#include "tests/unit/unit.h"

static enum ts_config_result parse(struct ts_config *cfg, char *out, size_t outcap,
                                   int argc, char **argv)
{
	FILE *o = fmemopen(out, outcap, "w");
	enum ts_config_result r = ts_config_parse(cfg, argc, argv, o, o);

	fclose(o);
	return r;
}

START_TEST(test_defaults)
{
	struct ts_config c;
	char out[256] = "";
	char *argv[] = {"tstaged"};

	unsetenv("TSTAGE_PORT");
	ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv), TS_CONFIG_RUN);
	ck_assert_int_eq(c.port, 8470);
	ck_assert_str_eq(c.bind, "127.0.0.1");
	ck_assert_int_eq(c.sim_devices, -1);
	ck_assert_uint_eq(c.sim_device_memory, 2ull << 30);
	ck_assert(c.device_memory_fraction > 0.749 && c.device_memory_fraction < 0.751);
	ck_assert_int_eq(c.default_memory_kind, TS_MEM_DEVICE);
	ck_assert(!c.preallocate);
	ck_assert(c.cuda);
}
END_TEST

START_TEST(test_flags_forms)
{
	struct ts_config c;
	char out[256] = "";
	char *argv[] = {"tstaged", "--port", "0", "--sim-devices=4", "--sim-device-memory",
	                "64MiB", "--preallocate", "--no-cuda", "--default-memory-kind",
	                "pinned_host", "--log-level", "warn", "--pinned-host-limit", "1GiB",
	                "--device-memory-fraction", "0.5"};

	ck_assert_int_eq(parse(&c, out, sizeof out, sizeof argv / sizeof argv[0], argv),
	                 TS_CONFIG_RUN);
	ck_assert_int_eq(c.port, 0);
	ck_assert_int_eq(c.sim_devices, 4);
	ck_assert_uint_eq(c.sim_device_memory, 64ull << 20);
	ck_assert(c.preallocate);
	ck_assert(!c.cuda);
	ck_assert_int_eq(c.default_memory_kind, TS_MEM_PINNED_HOST);
	ck_assert_int_eq(c.log_level, TS_LOG_WARN);
	ck_assert_uint_eq(c.pinned_host_limit, 1ull << 30);
	ck_assert(c.device_memory_fraction == 0.5);
}
END_TEST

START_TEST(test_environment_and_precedence)
{
	struct ts_config c;
	char out[256] = "";
	char *argv1[] = {"tstaged"};
	char *argv2[] = {"tstaged", "--sim-devices", "1"};

	setenv("TSTAGE_SIM_DEVICES", "3", 1);
	setenv("TSTAGE_SIM_DEVICE_MEMORY", "1GiB", 1);
	ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv1), TS_CONFIG_RUN);
	ck_assert_int_eq(c.sim_devices, 3);
	ck_assert_uint_eq(c.sim_device_memory, 1ull << 30);
	ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv2), TS_CONFIG_RUN);
	ck_assert_int_eq(c.sim_devices, 1);
	setenv("TSTAGE_PORT", "notaport", 1);
	ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv1), TS_CONFIG_EXIT_USAGE);
	ck_assert_ptr_nonnull(strstr(out, "TSTAGE_PORT"));
	unsetenv("TSTAGE_PORT");
	unsetenv("TSTAGE_SIM_DEVICES");
	unsetenv("TSTAGE_SIM_DEVICE_MEMORY");
}
END_TEST

START_TEST(test_refusals_name_the_option)
{
	static const char *const bad[][3] = {
		{"--sim-devices", "abc", "--sim-devices"},
		{"--port", "70000", "--port"},
		{"--device-memory-fraction", "1.5", "--device-memory-fraction"},
		{"--default-memory-kind", "gpu", "--default-memory-kind"},
		{"--sim-device-memory", "lots", "--sim-device-memory"},
		{"--bogus", "1", "--bogus"},
	};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct ts_config c;
		char out[512] = "";
		char *argv[] = {"tstaged", (char *)bad[i][0], (char *)bad[i][1]};

		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv), TS_CONFIG_EXIT_USAGE);
		ck_assert_msg(strstr(out, bad[i][2]), "message '%s' should name %s", out, bad[i][2]);
	}
}
END_TEST

/* --pinned-host-keep: left alone the default, a size, or a share of the
 * pinned budget (a bare number between 0 and 1); from the environment too. */
START_TEST(test_pinned_host_keep_forms)
{
	static const struct {
		const char *value;
		uint64_t bytes;
		double share;
	} ok[] = {
		{"1GiB", 1ull << 30, 0}, {"0", 0, 0}, {"268435456", 256ull << 20, 0},
		{"0.125", 0, 0.125}, {"1", 1, 0},
	};
	struct ts_config c;
	char out[512] = "";
	char *plain[] = {"tstaged"};
	char *bad[] = {"tstaged", "--pinned-host-keep", "-0.5"};

	unsetenv("TSTAGE_PINNED_HOST_KEEP");
	ck_assert_int_eq(parse(&c, out, sizeof out, 1, plain), TS_CONFIG_RUN);
	ck_assert_uint_eq(c.pinned_host_keep.bytes, TS_CONFIG_SIZE_DEFAULT);
	ck_assert(c.pinned_host_keep.share == 0);
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		char *argv[] = {"tstaged", "--pinned-host-keep", (char *)ok[i].value};

		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv), TS_CONFIG_RUN);
		ck_assert_uint_eq(c.pinned_host_keep.bytes, ok[i].bytes);
		ck_assert(c.pinned_host_keep.share == ok[i].share);
	}
	setenv("TSTAGE_PINNED_HOST_KEEP", "0.25", 1);
	ck_assert_int_eq(parse(&c, out, sizeof out, 1, plain), TS_CONFIG_RUN);
	ck_assert(c.pinned_host_keep.share == 0.25);
	unsetenv("TSTAGE_PINNED_HOST_KEEP");
	ck_assert_int_eq(parse(&c, out, sizeof out, 3, bad), TS_CONFIG_EXIT_USAGE);
	ck_assert_ptr_nonnull(strstr(out, "--pinned-host-keep"));
}
END_TEST

START_TEST(test_help_and_version)
{
	struct ts_config c;
	char out[8192] = "";
	char *argv[] = {"tstaged", "--help"};
	char *argv2[] = {"tstaged", "--version"};
	char *argv3[] = {"tstaged", "--port"};

	ck_assert_int_eq(parse(&c, out, sizeof out, 2, argv), TS_CONFIG_EXIT_OK);
	ck_assert_ptr_nonnull(strstr(out, "--sim-devices"));
	ck_assert_ptr_nonnull(strstr(out, "TSTAGE_SIM_DEVICES"));
	ck_assert_ptr_nonnull(strstr(out, "TSTAGE_MAX_CONNECTIONS_PER_IP"));
	ck_assert_ptr_nonnull(strstr(out, "--body-idle-timeout"));
	ck_assert_int_eq(parse(&c, out, sizeof out, 2, argv2), TS_CONFIG_EXIT_OK);
	ck_assert_ptr_nonnull(strstr(out, "tstaged "));
	ck_assert_int_eq(parse(&c, out, sizeof out, 2, argv3), TS_CONFIG_EXIT_USAGE);
	ck_assert_ptr_nonnull(strstr(out, "needs a value"));
}
END_TEST

/* The limits against hostile and slow clients: defaults, flags, variables
 * and bounds. */
START_TEST(test_connection_limits)
{
	struct ts_config c;
	char out[512] = "";
	char *argv1[] = {"tstaged"};
	char *argv2[] = {"tstaged", "--max-connections", "10", "--max-connections-per-ip=3",
	                 "--connection-timeout", "5", "--body-idle-timeout", "2",
	                 "--body-min-rate", "1KiB", "--import-header-limit", "1MiB",
	                 "--import-header-budget", "0",
	                 "--cgroup-root", "/tmp/cg"};
	static const char *const bad[][2] = {
		{"--max-connections", "0"}, {"--connection-timeout", "0"},
		{"--body-idle-timeout", "0"}, {"--import-header-limit", "0"},
		{"--import-header-limit", "200MB"}, {"--max-connections-per-ip", "-1"},
	};

	ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv1), TS_CONFIG_RUN);
	ck_assert_int_eq(c.max_connections, 1024);
	ck_assert_int_eq(c.max_connections_per_ip, 256);
	ck_assert_int_eq(c.connection_timeout, 60);
	ck_assert_int_eq(c.body_idle_timeout, 15);
	ck_assert_uint_eq(c.body_min_rate, 64u << 10);
	ck_assert_uint_eq(c.import_header_limit, 16u << 20);
	ck_assert_uint_eq(c.import_header_budget, 256u << 20);
	ck_assert_str_eq(c.cgroup_root, "/sys/fs/cgroup");
	ck_assert_int_eq(parse(&c, out, sizeof out, sizeof argv2 / sizeof argv2[0], argv2),
	                 TS_CONFIG_RUN);
	ck_assert_int_eq(c.max_connections, 10);
	ck_assert_int_eq(c.max_connections_per_ip, 3);
	ck_assert_int_eq(c.connection_timeout, 5);
	ck_assert_int_eq(c.body_idle_timeout, 2);
	ck_assert_uint_eq(c.body_min_rate, 1024);
	ck_assert_uint_eq(c.import_header_limit, 1u << 20);
	ck_assert_uint_eq(c.import_header_budget, 0);
	ck_assert_str_eq(c.cgroup_root, "/tmp/cg");
	setenv("TSTAGE_MAX_CONNECTIONS_PER_IP", "0", 1);
	setenv("TSTAGE_BODY_MIN_RATE", "0", 1);
	ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv1), TS_CONFIG_RUN);
	ck_assert_int_eq(c.max_connections_per_ip, 0);
	ck_assert_uint_eq(c.body_min_rate, 0);
	unsetenv("TSTAGE_MAX_CONNECTIONS_PER_IP");
	unsetenv("TSTAGE_BODY_MIN_RATE");
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *argv[] = {"tstaged", (char *)bad[i][0], (char *)bad[i][1]};

		ck_assert_msg(parse(&c, out, sizeof out, 3, argv) == TS_CONFIG_EXIT_USAGE, "%s %s",
		              bad[i][0], bad[i][1]);
		ck_assert_ptr_nonnull(strstr(out, bad[i][0]));
	}
}
END_TEST

/* --peers: http://HOST:PORT URLs (names, IPv4, bracketed IPv6, an optional
 * trailing '/'), comma-separated; a refusal names the item at fault;
 * --peers-dns: a DNS name;
 * --fleet-port: 0 (the one after --port) or a port; --fleet-timeout. */
START_TEST(test_peers_and_fleet_port)
{
	static const char *const good[] = {
		"http://127.0.0.1:8470",
		"http://node-a.example:1,http://10.0.0.2:65535/,http://[::1]:8470",
		"http://[fe80::1:2]:9",
	};
	static const char *const bad[][2] = {
		{"127.0.0.1:8470", "127.0.0.1:8470"},
		{"https://a:1", "https://a:1"},
		{"http://a", "http://a"},
		{"http://a:0", "http://a:0"},
		{"http://a:65536", "http://a:65536"},
		{"http://a:1/v1", "http://a:1/v1"},
		{"http://a:1,,http://b:2", "peer ''"},
		{"http://a:1,", "peer ''"},
		{"http://:1", "http://:1"},
		{"http://[]:1", "http://[]:1"},
		{"http://[x]:1", "http://[x]:1"},
		{"http://a b:1", "http://a b:1"},
		{"http://a:1x", "http://a:1x"},
	};
	char many[4000] = "";

	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		struct ts_config c;
		char out[512] = "";
		char *argv[] = {"tstaged", "--peers", (char *)good[i], "--fleet-port", "9000"};

		ck_assert_int_eq(parse(&c, out, sizeof out, 5, argv), TS_CONFIG_RUN);
		ck_assert_str_eq(c.peers, good[i]);
		ck_assert_int_eq(c.fleet_port, 9000);
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct ts_config c;
		char out[512] = "";
		char *argv[] = {"tstaged", "--peers", (char *)bad[i][0]};

		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv), TS_CONFIG_EXIT_USAGE);
		ck_assert_msg(strstr(out, "--peers") && strstr(out, bad[i][1]),
		              "message '%s' should name --peers and %s", out, bad[i][1]);
	}
	for (int i = 0; i <= TS_CONFIG_MAX_PEERS; i++)
		snprintf(many + strlen(many), sizeof many - strlen(many), "%shttp://h%d:1",
		         i ? "," : "", i);
	{
		struct ts_config c;
		char out[512] = "";
		char *argv[] = {"tstaged", "--peers", many};

		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv), TS_CONFIG_EXIT_USAGE);
		ck_assert_msg(strstr(out, "more than 64 peers"), "message '%s'", out);
		*strrchr(many, ',') = '\0';
		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv), TS_CONFIG_RUN);
		ck_assert_str_eq(c.peers, many);
	}
	{
		/* a URL longer than any DNS name allows */
		struct ts_config c;
		char out[1024] = "", url[TS_CONFIG_PEER_URL_MAX + 2];
		char *argv[] = {"tstaged", "--peers", url};

		memset(url, 'a', sizeof url - 1);
		url[sizeof url - 1] = '\0';
		memcpy(url, "http://", 7);
		memcpy(url + sizeof url - 4, ":80", 3);
		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv), TS_CONFIG_EXIT_USAGE);
		ck_assert_msg(strstr(out, "--peers") && strstr(out, "aaaa:80'"), "%s", out);
		memmove(url + 7, url + 8, strlen(url + 8) + 1);   /* TS_CONFIG_PEER_URL_MAX: fine */
		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv), TS_CONFIG_RUN);
	}
	{
		struct ts_config c;
		char out[512] = "";
		char *argv[] = {"tstaged"};
		char *argv2[] = {"tstaged", "--fleet-port", "70000"};

		setenv("TSTAGE_PEERS", "http://x:1", 1);
		ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv), TS_CONFIG_RUN);
		ck_assert_str_eq(c.peers, "http://x:1");
		ck_assert_int_eq(c.fleet_port, 0);
		setenv("TSTAGE_PEERS", "http://x", 1);
		ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv), TS_CONFIG_EXIT_USAGE);
		ck_assert_msg(strstr(out, "TSTAGE_PEERS") && strstr(out, "'http://x'"), "%s", out);
		unsetenv("TSTAGE_PEERS");
		setenv("TSTAGE_PEERS_DNS", "tstaged.tstage.svc.cluster.local", 1);
		ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv), TS_CONFIG_RUN);
		ck_assert_str_eq(c.peers_dns, "tstaged.tstage.svc.cluster.local");
		setenv("TSTAGE_PEERS_DNS", "a/b", 1);
		ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv), TS_CONFIG_EXIT_USAGE);
		ck_assert_msg(strstr(out, "TSTAGE_PEERS_DNS"), "%s", out);
		unsetenv("TSTAGE_PEERS_DNS");
		ck_assert_int_eq(parse(&c, out, sizeof out, 3, argv2), TS_CONFIG_EXIT_USAGE);
		ck_assert_ptr_nonnull(strstr(out, "--fleet-port"));
	}
	{
		/* --fleet-timeout: 30 s unless given, 1 to 3600 */
		struct ts_config c;
		char out[512] = "";
		char *argv[] = {"tstaged"};
		char *five[] = {"tstaged", "--fleet-timeout", "5"};
		char *zero[] = {"tstaged", "--fleet-timeout", "0"};
		char *big[] = {"tstaged", "--fleet-timeout", "3601"};

		ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv), TS_CONFIG_RUN);
		ck_assert_int_eq(c.fleet_timeout, 30);
		ck_assert_int_eq(parse(&c, out, sizeof out, 3, five), TS_CONFIG_RUN);
		ck_assert_int_eq(c.fleet_timeout, 5);
		setenv("TSTAGE_FLEET_TIMEOUT", "7", 1);
		ck_assert_int_eq(parse(&c, out, sizeof out, 1, argv), TS_CONFIG_RUN);
		ck_assert_int_eq(c.fleet_timeout, 7);
		unsetenv("TSTAGE_FLEET_TIMEOUT");
		ck_assert_int_eq(parse(&c, out, sizeof out, 3, zero), TS_CONFIG_EXIT_USAGE);
		ck_assert_ptr_nonnull(strstr(out, "--fleet-timeout"));
		ck_assert_int_eq(parse(&c, out, sizeof out, 3, big), TS_CONFIG_EXIT_USAGE);
		ck_assert_ptr_nonnull(strstr(out, "--fleet-timeout"));
	}
}
END_TEST

Suite *ts_unit_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("parse");

	tcase_add_test(tc, test_defaults);
	tcase_add_test(tc, test_flags_forms);
	tcase_add_test(tc, test_environment_and_precedence);
	tcase_add_test(tc, test_refusals_name_the_option);
	tcase_add_test(tc, test_pinned_host_keep_forms);
	tcase_add_test(tc, test_help_and_version);
	tcase_add_test(tc, test_connection_limits);
	tcase_add_test(tc, test_peers_and_fleet_port);
	suite_add_tcase(s, tc);
	return s;
}
