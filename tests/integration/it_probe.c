/*
 * it_probe.c - what deployments lean on, against a live tstaged: the
 * container health check `tstaged --probe URL` (2xx exits 0; nothing
 * listening, 503 while draining, an error status and a bad URL exit 1),
 * readiness sent to systemd through $NOTIFY_SOCKET (READY=1 once the port
 * listens, STOPPING=1 on drain; a path and an abstract socket), and the
 * host devices report taken from --host-name / TSTAGE_HOST_NAME (in
 * Kubernetes the node's name).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

/* Runs `tstaged --probe url`; its exit status, with its stderr in err. */
static int run_probe(const char *url, char *err, size_t cap)
{
	const char *args[] = {"--probe", url, NULL};
	struct th_run_result res;
	int st;

	th_run(args, NULL, 10000, &res);
	snprintf(err, cap, "%s", res.err);
	st = res.status;
	th_run_free(&res);
	return st;
}

START_TEST(test_probe_ready_daemon)
{
	struct th_daemon d;
	char url[128], err[1024];

	th_daemon_start(&d, NULL);
	snprintf(url, sizeof url, "%s/readyz", d.base_url);
	ck_assert_msg(run_probe(url, err, sizeof err) == 0, "probe %s: %s", url, err);
	snprintf(url, sizeof url, "http://localhost:%d/livez", d.port);
	ck_assert_msg(run_probe(url, err, sizeof err) == 0, "probe %s: %s", url, err);
	/* an error status is not healthy */
	snprintf(url, sizeof url, "%s/no-such-path", d.base_url);
	ck_assert_int_eq(run_probe(url, err, sizeof err), 1);
	ck_assert_msg(strstr(err, "HTTP 404"), "stderr: %s", err);
	th_daemon_stop_ok(&d);
}
END_TEST

/* A port nobody listens on: bound, never listened, so connect is refused. */
START_TEST(test_probe_nothing_listening)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	char url[128], err[1024];

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/readyz", ntohs(sa.sin_port));
	ck_assert_int_eq(run_probe(url, err, sizeof err), 1);
	ck_assert_msg(strstr(err, "cannot connect"), "stderr: %s", err);
	close(fd);
}
END_TEST

/* A listener that never answers: the probe gives up within its timeout. */
START_TEST(test_probe_silent_listener)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	char url[128], err[1024];

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	ck_assert_int_eq(listen(fd, 4), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/readyz", ntohs(sa.sin_port));
	/* th_run's own limit (10 s) is far above the probe's */
	ck_assert_int_eq(run_probe(url, err, sizeof err), 1);
	ck_assert_msg(strstr(err, "no answer"), "stderr: %s", err);
	close(fd);
}
END_TEST

/* SIGTERM while a request waits for its body: /readyz answers 503 and the
 * probe fails, /livez still passes. */
START_TEST(test_probe_draining)
{
	static const char *const args[] = {"--drain-seconds", "20", NULL};
	static const char partial[] = "POST /v1/memory:resetPeak HTTP/1.1\r\nHost: t\r\n"
	                              "Content-Type: application/json\r\nContent-Length: 2\r\n"
	                              "Expect: 100-continue\r\n\r\n";
	struct th_daemon d;
	char url[128], err[1024], buf[8192];
	long long deadline;
	int slow, code, st;

	th_daemon_start(&d, args);
	slow = th_raw_connect(&d);
	th_raw_send(slow, partial);
	code = th_raw_response(slow, buf, sizeof buf, 5000);
	ck_assert_msg(code == 100, "want 100 Continue, got %d\n%s", code, buf);
	th_daemon_signal(&d, SIGTERM);
	snprintf(url, sizeof url, "%s/readyz", d.base_url);
	deadline = th_now_ms() + 5000;
	while ((st = run_probe(url, err, sizeof err)) == 0 && th_now_ms() < deadline)
		usleep(20000);
	ck_assert_msg(st == 1, "probe while draining exited %d: %s", st, err);
	ck_assert_msg(strstr(err, "HTTP 503"), "stderr: %s", err);
	snprintf(url, sizeof url, "%s/livez", d.base_url);
	ck_assert_msg(run_probe(url, err, sizeof err) == 0, "livez while draining: %s", err);
	th_raw_send(slow, "{}");
	ck_assert_int_eq(th_raw_response(slow, buf, sizeof buf, 5000), 200);
	ck_assert_int_eq(th_daemon_wait(&d, 10000), 0);
	close(slow);
	th_daemon_stop(&d, false);
}
END_TEST

START_TEST(test_probe_bad_urls)
{
	static const char *const bad[] = {
		"ftp://127.0.0.1:8470/readyz", "http://", "http://:8470/readyz",
		"http://127.0.0.1:0/readyz", "http://127.0.0.1:99999/readyz",
		"http://127.0.0.1:84x0/readyz", "http://example.invalid:8470/readyz",
		"http://[::1/readyz", "http://127.0.0.1:8470/a b", "readyz",
	};
	char err[1024];

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ck_assert_msg(run_probe(bad[i], err, sizeof err) == 1, "probe '%s' did not exit 1",
		              bad[i]);
		ck_assert_msg(strstr(err, "cannot probe"), "'%s': stderr: %s", bad[i], err);
	}
}
END_TEST

START_TEST(test_probe_needs_url)
{
	static const char *const args[] = {"--probe", NULL};
	struct th_run_result res;

	th_run(args, NULL, 10000, &res);
	ck_assert_int_eq(res.status, 2);
	ck_assert_msg(strstr(res.err, "--probe"), "stderr: %s", res.err);
	th_run_free(&res);
}
END_TEST

/* ---- sd_notify ------------------------------------------------------------- */

/* A datagram socket bound at name ('@' first: abstract). */
static int notify_socket(const char *name)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(name);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	ck_assert(fd >= 0 && len < sizeof sa.sun_path);
	memcpy(sa.sun_path, name, len);
	if (name[0] == '@')
		sa.sun_path[0] = '\0';
	ck_assert_msg(bind(fd, (struct sockaddr *)&sa,
	                   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) == 0,
	              "bind %s: %s", name, strerror(errno));
	return fd;
}

/* The next datagram within timeout_ms into buf; false when none came. */
static bool notify_recv(int fd, char *buf, size_t cap, int timeout_ms)
{
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	ssize_t n;

	if (poll(&pfd, 1, timeout_ms) != 1)
		return false;
	n = recv(fd, buf, cap - 1, 0);
	if (n < 0)
		return false;
	buf[n] = '\0';
	return true;
}

static void check_notify(const char *name)
{
	static const char *const args[] = {"--drain-seconds", "5", NULL};
	struct th_start how = {.args = args};
	struct th_daemon d;
	struct th_response r;
	char env[160], msg[256];
	const char *envs[] = {env, NULL};
	int fd = notify_socket(name);

	snprintf(env, sizeof env, "NOTIFY_SOCKET=%s", name);
	how.env = envs;
	th_daemon_start_ex(&d, &how);
	ck_assert_msg(notify_recv(fd, msg, sizeof msg, 10000), "no READY=1 at %s", name);
	ck_assert_str_eq(msg, "READY=1");
	/* ready means serving */
	th_get(&d, "/readyz", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	ck_assert(!notify_recv(fd, msg, sizeof msg, 0));
	th_daemon_signal(&d, SIGTERM);
	ck_assert_msg(notify_recv(fd, msg, sizeof msg, 10000), "no STOPPING=1 at %s", name);
	ck_assert_str_eq(msg, "STOPPING=1");
	ck_assert_int_eq(th_daemon_wait(&d, 10000), 0);
	th_daemon_stop(&d, false);
	close(fd);
}

START_TEST(test_notify_path)
{
	char dir[256], name[300];

	th_temp_dir("notify", dir, sizeof dir);
	snprintf(name, sizeof name, "%s/notify.sock", dir);
	check_notify(name);
	unlink(name);
}
END_TEST

START_TEST(test_notify_abstract)
{
	char name[64];

	snprintf(name, sizeof name, "@tstage-it-notify-%d", (int)getpid());
	check_notify(name);
}
END_TEST

/* A NOTIFY_SOCKET nobody listens on is logged; the daemon still serves. */
START_TEST(test_notify_unreachable)
{
	static const char *const envs[] = {"NOTIFY_SOCKET=@tstage-it-nobody-listens", NULL};
	struct th_start how = {.env = envs};
	struct th_daemon d;
	struct th_response r;
	char *log;

	th_daemon_start_ex(&d, &how);
	th_get(&d, "/readyz", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	log = th_daemon_stderr(&d);
	ck_assert_msg(strstr(log, "cannot notify the service manager"), "log: %s", log);
	free(log);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- the host devices report ------------------------------------------------ */

static void check_host(const struct th_start *how, const char *want)
{
	struct th_daemon d;
	struct th_response r;
	json_t *devs, *body;
	size_t i;
	json_t *dev;

	th_daemon_start_ex(&d, how);
	body = th_get_json(&d, "/v1/devices", &r);
	devs = th_arr(body, "devices");
	ck_assert_int_gt(json_array_size(devs), 0);
	json_array_foreach(devs, i, dev)
		ck_assert_str_eq(th_str(dev, "host"), want);
	th_response_free(&r);
	body = th_get_json(&d, "/v1/memory", &r);
	ck_assert_str_eq(th_str(body, "host"), want);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}

START_TEST(test_host_name_flag)
{
	static const char *const args[] = {"--host-name", "gpu-node-7", NULL};
	struct th_start how = {.args = args};

	check_host(&how, "gpu-node-7");
}
END_TEST

START_TEST(test_host_name_env)
{
	static const char *const envs[] = {"TSTAGE_HOST_NAME=node-from-env", NULL};
	struct th_start how = {.env = envs};

	check_host(&how, "node-from-env");
}
END_TEST

START_TEST(test_host_name_default)
{
	struct th_start how = {0};
	char host[64];

	ck_assert_int_eq(gethostname(host, sizeof host), 0);
	host[sizeof host - 1] = '\0';
	check_host(&how, host);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("deploy");
	TCase *probe = tcase_create("probe"), *notify = tcase_create("notify");
	TCase *host = tcase_create("host_name");

	tcase_add_test(probe, test_probe_ready_daemon);
	tcase_add_test(probe, test_probe_nothing_listening);
	tcase_add_test(probe, test_probe_silent_listener);
	tcase_add_test(probe, test_probe_draining);
	tcase_add_test(probe, test_probe_bad_urls);
	tcase_add_test(probe, test_probe_needs_url);
	tcase_add_test(notify, test_notify_path);
	tcase_add_test(notify, test_notify_abstract);
	tcase_add_test(notify, test_notify_unreachable);
	tcase_add_test(host, test_host_name_flag);
	tcase_add_test(host, test_host_name_env);
	tcase_add_test(host, test_host_name_default);
	suite_add_tcase(s, probe);
	suite_add_tcase(s, notify);
	suite_add_tcase(s, host);
	return s;
}
