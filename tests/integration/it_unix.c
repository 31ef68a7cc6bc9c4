/*
 * it_unix.c - Check suite "unix": --unix-socket serves the same HTTP API on
 * a Unix socket (libcurl's CURLOPT_UNIX_SOCKET_PATH, as curl --unix-socket),
 * beside TCP: the socket file's mode and group as the flags say, no token
 * asked on the socket while TCP asks for one, the file removed at stop, a
 * stale socket of an earlier run replaced, and a live socket, a file of
 * another kind, a bad mode or group refused at start.
 *
 * Each test case runs in its own forked process with its own daemon.
 */
#include "tests/integration/harness.h"

#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct unix_response {
	long status;
	char *body;
	size_t len;
};

static size_t on_data(char *p, size_t size, size_t n, void *cls)
{
	struct unix_response *r = cls;
	char *grown = realloc(r->body, r->len + size * n + 1);

	if (!grown)
		return 0;
	memcpy(grown + r->len, p, size * n);
	r->len += size * n;
	grown[r->len] = '\0';
	r->body = grown;
	return size * n;
}

/* One request through the Unix socket at sock (body may be NULL). */
static void unix_request(const char *sock, const char *method, const char *path,
                         const char *body, size_t body_len, struct unix_response *r)
{
	char url[512], errbuf[CURL_ERROR_SIZE] = "";
	CURL *c = curl_easy_init();
	CURLcode rc;

	memset(r, 0, sizeof *r);
	ck_assert_ptr_nonnull(c);
	snprintf(url, sizeof url, "http://localhost%s", path);
	curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, sock);
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
	if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
	}
	rc = curl_easy_perform(c);
	ck_assert_msg(rc == CURLE_OK, "%s %s over %s: %s (%s)", method, path, sock,
	              curl_easy_strerror(rc), errbuf);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	curl_easy_cleanup(c);
	if (!r->body)
		r->body = calloc(1, 1);
}

static void unix_response_free(struct unix_response *r)
{
	free(r->body);
	r->body = NULL;
}

/* A socket path in a fresh temporary folder. */
static const char *socket_path(char *buf, size_t cap)
{
	char dir[256];

	th_temp_dir("unix", dir, sizeof dir);
	snprintf(buf, cap, "%s/tstaged.sock", dir);
	ck_assert_msg(strlen(buf) < sizeof ((struct sockaddr_un *)0)->sun_path, "path too long");
	return buf;
}

static void assert_socket_file(const char *path, mode_t mode, gid_t gid)
{
	struct stat st;

	ck_assert_msg(lstat(path, &st) == 0, "no socket file '%s': %s", path, strerror(errno));
	ck_assert_msg(S_ISSOCK(st.st_mode), "'%s' is not a socket", path);
	ck_assert_msg((st.st_mode & 07777) == mode, "'%s' has mode %04o, not %04o", path,
	              (unsigned)(st.st_mode & 07777), (unsigned)mode);
	ck_assert_msg(st.st_uid == getuid(), "'%s' is owned by uid %u", path, (unsigned)st.st_uid);
	ck_assert_msg(st.st_gid == gid, "'%s' has gid %u, not %u", path, (unsigned)st.st_gid,
	              (unsigned)gid);
}

START_TEST(test_same_api_on_both)
{
	static const char data[] = "0123456789abcdefghijklmnopqrstuv";  /* 32 bytes */
	char sock[300];
	const char *args[] = {"--unix-socket", socket_path(sock, sizeof sock), NULL};
	struct th_daemon d;
	struct unix_response u;
	struct th_response r;
	json_t *j;

	th_daemon_start(&d, args);
	assert_socket_file(sock, 0600, getgid());     /* the default mode */

	unix_request(sock, "GET", "/v1/devices", NULL, 0, &u);
	ck_assert_int_eq(u.status, 200);
	j = json_loads(u.body, 0, NULL);
	ck_assert_msg(j && json_array_size(json_object_get(j, "devices")) >= 1, "%s", u.body);
	json_decref(j);
	unix_response_free(&u);

	/* uploaded over the socket, read over TCP, and back */
	unix_request(sock, "PUT", "/v1/arrays/u?dtype=uint8&shape=4,8&memory_kind=pinned_host",
	             data, 32, &u);
	ck_assert_msg(u.status == 201, "%ld %s", u.status, u.body);
	unix_response_free(&u);
	th_get(&d, "/v1/arrays/u/data?rows=3,0", &r);
	ck_assert_int_eq(r.status, 200);
	th_assert_bytes("rows over TCP", r.body, r.body_len, "opqrstuv01234567", 16);
	th_response_free(&r);
	unix_request(sock, "GET", "/v1/arrays/u/data", NULL, 0, &u);
	th_assert_bytes("data over the socket", u.body, u.len, data, 32);
	unix_response_free(&u);

	/* errors are the same google.rpc.Status */
	unix_request(sock, "GET", "/v1/arrays/nope", NULL, 0, &u);
	ck_assert_int_eq(u.status, 404);
	ck_assert_msg(strstr(u.body, "ARRAY_NOT_FOUND"), "%s", u.body);
	unix_response_free(&u);

	/* a stop removes the socket file */
	ck_assert_int_eq(th_daemon_stop(&d, false), 0);
	ck_assert_msg(access(sock, F_OK) != 0, "'%s' is left after the stop", sock);
}
END_TEST

START_TEST(test_mode_and_group)
{
	struct group *g = getgrgid(getgid());
	char sock[300], sock2[300], gid[16];
	const char *args[] = {"--unix-socket", socket_path(sock, sizeof sock),
	                      "--unix-socket-mode", "0660", "--unix-socket-group",
	                      g ? g->gr_name : "0", NULL};
	const char *args2[] = {"--unix-socket", socket_path(sock2, sizeof sock2),
	                       "--unix-socket-mode", "640", "--unix-socket-group", gid, NULL};
	struct th_daemon d, d2;
	struct unix_response u;

	snprintf(gid, sizeof gid, "%u", (unsigned)getgid());
	th_daemon_start(&d, args);
	assert_socket_file(sock, 0660, getgid());
	unix_request(sock, "GET", "/livez", NULL, 0, &u);
	ck_assert_int_eq(u.status, 200);
	unix_response_free(&u);
	th_daemon_stop_ok(&d);

	th_daemon_start(&d2, args2);                   /* a gid by number */
	assert_socket_file(sock2, 0640, getgid());
	th_daemon_stop_ok(&d2);
}
END_TEST

START_TEST(test_socket_is_the_permission)
{
	char sock[300], tok_buf[300];
	const char *tok = th_write_temp("token", "unix-socket-test-token-0123456789\n", tok_buf,
	                                sizeof tok_buf);
	const char *args[] = {"--unix-socket", socket_path(sock, sizeof sock), "--token-file",
	                      tok, NULL};
	struct th_daemon d;
	struct unix_response u;
	struct th_response r;

	chmod(tok, 0600);
	th_daemon_start(&d, args);
	th_get(&d, "/v1/devices", &r);
	th_assert_error(&r, 401, "UNAUTHENTICATED", "TOKEN_REQUIRED");
	th_response_free(&r);
	unix_request(sock, "GET", "/v1/devices", NULL, 0, &u);
	ck_assert_msg(u.status == 200, "%ld %s", u.status, u.body);
	unix_response_free(&u);
	th_daemon_stop_ok(&d);
}
END_TEST

/* Binds a socket at path and closes it without removing the file. */
static void leave_stale_socket(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
	memcpy(sa.sun_path, path, strlen(path));
	ck_assert_msg(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "bind: %s", strerror(errno));
	close(fd);
}

START_TEST(test_stale_socket_replaced_live_one_refused)
{
	char sock[300];
	const char *args[] = {"--unix-socket", socket_path(sock, sizeof sock), NULL};
	const char *again[] = {"--port", "0", "--sim-devices", "1", "--sim-device-memory", "64MiB",
	                       "--no-cuda", "--unix-socket", sock, NULL};
	struct th_run_result res;
	struct th_daemon d;
	struct unix_response u;

	leave_stale_socket(sock);
	th_daemon_start(&d, args);
	unix_request(sock, "GET", "/readyz", NULL, 0, &u);
	ck_assert_int_eq(u.status, 200);
	unix_response_free(&u);

	th_run(again, NULL, 20000, &res);             /* a second daemon on the same socket */
	ck_assert_msg(res.status != 0 && strstr(res.err, "in use"), "status %d: %s", res.status,
	              res.err);
	th_run_free(&res);
	unix_request(sock, "GET", "/readyz", NULL, 0, &u);   /* the first still serves */
	ck_assert_int_eq(u.status, 200);
	unix_response_free(&u);
	th_daemon_stop_ok(&d);
}
END_TEST

START_TEST(test_bad_flags_refused)
{
	char sock[300], file[300], longp[200];
	struct {
		const char *flag, *value, *want;
	} cases[] = {
		{"--unix-socket-mode", "0999", "--unix-socket-mode '0999'"},
		{"--unix-socket-mode", "rw", "--unix-socket-mode 'rw'"},
		{"--unix-socket-mode", "01777", "--unix-socket-mode '01777'"},
		{"--unix-socket-group", "no-such-group-tstage", "no-such-group-tstage"},
	};
	struct th_run_result res;
	struct stat st;

	socket_path(sock, sizeof sock);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *args[] = {"--port", "0", "--sim-devices", "1", "--sim-device-memory",
		                      "64MiB", "--no-cuda", "--unix-socket", sock, cases[i].flag,
		                      cases[i].value, NULL};

		th_run(args, NULL, 20000, &res);
		ck_assert_msg(res.status != 0 && strstr(res.err, cases[i].want), "%s %s: %d %s",
		              cases[i].flag, cases[i].value, res.status, res.err);
		ck_assert_msg(access(sock, F_OK) != 0, "%s %s left a socket", cases[i].flag,
		              cases[i].value);
		th_run_free(&res);
	}

	/* a file that is not a socket is never replaced */
	th_write_temp("not-a-socket", "keep me", file, sizeof file);
	{
		const char *args[] = {"--port", "0", "--sim-devices", "1", "--sim-device-memory",
		                      "64MiB", "--no-cuda", "--unix-socket", file, NULL};

		th_run(args, NULL, 20000, &res);
		ck_assert_msg(res.status != 0 && strstr(res.err, "is not a socket"), "%d %s",
		              res.status, res.err);
		th_run_free(&res);
		ck_assert_msg(stat(file, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 7,
		              "the file was touched");
	}

	/* longer than a socket address holds: a usage error naming the flag */
	memset(longp, 'a', sizeof longp - 1);
	longp[0] = '/';
	longp[sizeof longp - 1] = '\0';
	{
		const char *args[] = {"--port", "0", "--unix-socket", longp, NULL};

		th_run(args, NULL, 20000, &res);
		ck_assert_msg(res.status != 0 && strstr(res.err, "unix-socket"), "%d %s", res.status,
		              res.err);
		th_run_free(&res);
	}
}
END_TEST

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	memcpy(sa.sun_path, path, strlen(path));
	ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect '%s': %s", path,
	              strerror(errno));
	return fd;
}

/* Socket clients are counted in --max-connections, not as one address:
 * with a per-address limit of 1, TCP's second connection is refused and
 * the socket's second and third are served; the total still holds. */
START_TEST(test_socket_connections_not_limited_per_address)
{
	static const char req[] = "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n";
	char sock[300], buf[4096];
	const char *args[] = {"--unix-socket", socket_path(sock, sizeof sock),
	                      "--max-connections-per-ip", "1", "--max-connections", "4", NULL};
	struct th_daemon d;
	int t1, t2, u[4];

	th_daemon_start(&d, args);
	t1 = th_raw_connect(&d);
	th_raw_send(t1, req);
	ck_assert_int_eq(th_raw_response(t1, buf, sizeof buf, 10000), 200);
	t2 = th_raw_connect(&d);
	th_raw_send(t2, req);
	ck_assert_int_eq(th_raw_response(t2, buf, sizeof buf, 10000), 503);
	close(t2);
	for (int i = 0; i < 3; i++) {
		u[i] = unix_connect(sock);
		th_raw_send(u[i], req);
		ck_assert_msg(th_raw_response(u[i], buf, sizeof buf, 10000) == 200,
		              "socket connection %d: %s", i + 1, buf);
	}
	u[3] = unix_connect(sock);                   /* the fifth in all */
	th_raw_send(u[3], req);
	ck_assert_int_eq(th_raw_response(u[3], buf, sizeof buf, 10000), 503);
	for (int i = 0; i < 4; i++)
		close(u[i]);
	close(t1);
	th_daemon_stop_ok(&d);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("unix");
	TCase *tc = tcase_create("socket");

	tcase_add_test(tc, test_same_api_on_both);
	tcase_add_test(tc, test_mode_and_group);
	tcase_add_test(tc, test_socket_is_the_permission);
	tcase_add_test(tc, test_stale_socket_replaced_live_one_refused);
	tcase_add_test(tc, test_bad_flags_refused);
	tcase_add_test(tc, test_socket_connections_not_limited_per_address);
	suite_add_tcase(s, tc);
	return s;
}
