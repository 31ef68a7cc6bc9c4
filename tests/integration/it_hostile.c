/*
 * it_hostile.c - a live tstaged against hostile and careless clients, over
 * raw loopback sockets: floods of idle connections and the limits that
 * answer them 503, uploads that stall while holding memory, framing that
 * could smuggle a request, a second daemon on the same port, server-side
 * imports that try to leave --data-dir (links, "..", FIFOs, files that are
 * not safetensors), stopping (drain, a second SIGTERM, operations cut at the
 * deadline) and host budgets under a cgroup memory limit.
 *
 * Every loop is bounded; clients use 127.0.0.1 and, to play a second
 * address, 127.0.0.2 (Linux routes all of 127/8 to loopback).
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* ---- raw sockets ------------------------------------------------------------ */

/* A connection to d from source address src ("127.0.0.2"), or -1. */
static int connect_from(const struct th_daemon *d, const char *src)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->port)};
	struct sockaddr_in me = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (src) {
		ck_assert_int_eq(inet_pton(AF_INET, src, &me.sin_addr), 1);
		ck_assert_msg(bind(fd, (struct sockaddr *)&me, sizeof me) == 0, "bind %s: %s", src,
		              strerror(errno));
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Waits at most timeout_ms for the peer to close fd (reading and dropping
 * what comes); true when it did. */
static bool closed_within(int fd, int timeout_ms)
{
	long long deadline = th_now_ms() + timeout_ms;
	char buf[4096];

	for (;;) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		long long left = deadline - th_now_ms();
		ssize_t n;

		if (left <= 0)
			return false;
		if (poll(&pfd, 1, (int)left) <= 0)
			continue;
		n = recv(fd, buf, sizeof buf, 0);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
	}
}

/* A GET on a new connection from src; its status within timeout_ms (-1:
 * none) and the response in buf. */
static int get_from(const struct th_daemon *d, const char *src, const char *path, char *buf,
                    size_t cap, int timeout_ms)
{
	char req[512];
	int fd = connect_from(d, src), code;

	if (fd < 0)
		return -1;
	snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", path);
	th_raw_send(fd, req);
	code = th_raw_response(fd, buf, cap, timeout_ms);
	close(fd);
	return code;
}

/* A connection the daemon has accepted and counted: one keep-alive request
 * answered on it (a bare connect may still sit in the kernel's queue while a
 * later one is accepted first). */
static int connect_served(const struct th_daemon *d)
{
	char buf[4096];
	int fd = connect_from(d, NULL), code;

	ck_assert_int_ge(fd, 0);
	th_raw_send(fd, "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == 200, "a connection within the limits: %d\n%s", code, buf);
	return fd;
}

/* Lets this process (and the daemons it starts) hold up to n descriptors;
 * returns how many it may (the hard limit may be lower). */
static rlim_t want_fds(rlim_t n)
{
	struct rlimit rl;

	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur >= n)
		return rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= n ? n : rl.rlim_max;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	return rl.rlim_cur;
}

static void assert_busy(const char *buf, const char *words)
{
	ck_assert_msg(strstr(buf, "\r\nRetry-After: "), "no Retry-After:\n%s", buf);
	ck_assert_msg(strstr(buf, "\"status\":\"UNAVAILABLE\""), "not UNAVAILABLE:\n%s", buf);
	ck_assert_msg(strstr(buf, "TOO_MANY_CONNECTIONS"), "no reason:\n%s", buf);
	ck_assert_msg(strstr(buf, words), "the message does not say '%s':\n%s", words, buf);
}

/* ---- connection limits ------------------------------------------------------ */

#define FLOOD 1000

/* 1,000 idle connections with the default limits: a new client is answered
 * at once (503 from the address that floods, 200 from another), the
 * flooding connections past the per-address limit are told 503 without
 * having sent anything, those within it are served, and once they go the
 * address is served again. */
START_TEST(test_idle_flood_defaults)
{
	static int fds[FLOOD];
	struct th_daemon d;
	char buf[8192];
	long long t0, deadline;
	int code, served = 0, refused = 0, flood = FLOOD;
	rlim_t fds_max = want_fds(2 * FLOOD + 3000);

	/* a host with a low hard limit floods less (still well past 256) */
	if (fds_max < 2 * FLOOD + 3000)
		flood = (int)(fds_max - 100) / 2 < FLOOD ? (int)(fds_max - 100) / 2 : FLOOD;
	ck_assert_msg(flood > 300, "the descriptor limit %llu is too low for this test",
	              (unsigned long long)fds_max);
	th_daemon_start(&d, NULL);
	for (int i = 0; i < flood; i++) {
		fds[i] = connect_from(&d, NULL);
		ck_assert_msg(fds[i] >= 0, "connection %d: %s", i, strerror(errno));
	}
	t0 = th_now_ms();
	code = get_from(&d, NULL, "/livez", buf, sizeof buf, 3000);
	ck_assert_msg(code == 503 || code == 200, "a new client from the flooding address: %d\n%s",
	              code, buf);
	if (code == 503)
		assert_busy(buf, "from one address");
	code = get_from(&d, "127.0.0.2", "/livez", buf, sizeof buf, 3000);
	ck_assert_msg(code == 200, "a client from another address: %d\n%s", code, buf);
	ck_assert_msg(th_now_ms() - t0 < 3000, "answers took %lld ms", th_now_ms() - t0);
	/* the flood's own connections: those past the per-address limit have
	 * been told 503 without asking; the others are served */
	usleep(300000);
	for (int i = 0; i < flood; i++) {
		struct pollfd pfd = {.fd = fds[i], .events = POLLIN};

		if (poll(&pfd, 1, 0) == 1) {
			code = th_raw_response(fds[i], buf, sizeof buf, 2000);
			ck_assert_msg(code == 503, "flood connection %d was sent %d\n%s", i, code, buf);
			assert_busy(buf, "256 connections");
			refused++;
			continue;
		}
		th_raw_send(fds[i], "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
		code = th_raw_response(fds[i], buf, sizeof buf, 5000);
		ck_assert_msg(code == 200, "flood connection %d: %d\n%s", i, code, buf);
		served++;
	}
	ck_assert_int_eq(served, 256);
	ck_assert_int_eq(refused, flood - 256);
	for (int i = 0; i < flood; i++)
		close(fds[i]);
	/* the address is served again once its connections have gone */
	deadline = th_now_ms() + 5000;
	do {
		code = get_from(&d, NULL, "/livez", buf, sizeof buf, 2000);
	} while (code != 200 && th_now_ms() < deadline && usleep(20000) == 0);
	ck_assert_msg(code == 200, "after the flood: %d\n%s", code, buf);
	th_daemon_stop_ok(&d);
}
END_TEST

/* --max-connections-per-ip and --max-connections, each answered 503 with
 * Retry-After before the client sends a byte. */
START_TEST(test_connection_limit_flags)
{
	static const char *const per_ip[] = {"--max-connections-per-ip", "3", NULL};
	static const char *const total[] = {"--max-connections", "3", "--max-connections-per-ip",
	                                    "0", NULL};
	struct th_daemon d;
	char buf[8192];
	int fds[3], fd, code;
	long long deadline;

	th_daemon_start(&d, per_ip);
	for (int i = 0; i < 3; i++)
		fds[i] = connect_served(&d);
	fd = connect_from(&d, NULL);
	ck_assert_int_ge(fd, 0);
	code = th_raw_response(fd, buf, sizeof buf, 3000);     /* nothing sent */
	ck_assert_msg(code == 503, "the 4th connection from one address: %d\n%s", code, buf);
	assert_busy(buf, "at most 3 connections at once from one address");
	ck_assert_msg(closed_within(fd, 3000), "a refused connection stays open");
	close(fd);
	ck_assert_int_eq(get_from(&d, "127.0.0.2", "/livez", buf, sizeof buf, 3000), 200);
	close(fds[0]);
	deadline = th_now_ms() + 5000;
	do {
		code = get_from(&d, NULL, "/livez", buf, sizeof buf, 2000);
	} while (code != 200 && th_now_ms() < deadline && usleep(20000) == 0);
	ck_assert_msg(code == 200, "a freed slot is not reused: %d\n%s", code, buf);
	close(fds[1]);
	close(fds[2]);
	th_daemon_stop_ok(&d);

	th_daemon_start(&d, total);
	for (int i = 0; i < 3; i++)
		fds[i] = connect_served(&d);
	code = get_from(&d, "127.0.0.2", "/livez", buf, sizeof buf, 3000);
	ck_assert_msg(code == 503, "past --max-connections: %d\n%s", code, buf);
	assert_busy(buf, "at most 3 connections at once;");
	for (int i = 0; i < 20; i++)            /* refusals log a line now and then, not each */
		ck_assert_int_eq(get_from(&d, "127.0.0.2", "/livez", buf, sizeof buf, 3000), 503);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	th_daemon_stop(&d, true);
	{
		char *log = th_daemon_stderr(&d), *p = log;
		int lines = 0;

		while ((p = strstr(p, "\n")) != NULL) {
			lines++;
			p++;
		}
		ck_assert_msg(lines < 12, "21 refusals logged %d lines:\n%s", lines, log);
		free(log);
	}
	th_daemon_cleanup(&d);
}
END_TEST

/* ---- slow bodies ------------------------------------------------------------ */

/* bytes_in_use of the first device's device memory: what an upload holds. */
static json_int_t device_in_use(struct th_daemon *d)
{
	struct th_response r;
	json_t *spaces = th_arr(th_get_json(d, "/v1/memory", &r), "spaces"), *s;
	json_int_t v = -1;
	char dev[32];
	size_t i;

	th_device_id(0, dev, sizeof dev);
	json_array_foreach(spaces, i, s)
		if (strcmp(th_str(s, "device"), dev) == 0 &&
		    strcmp(th_str(s, "memory_kind"), "device") == 0)
			v = th_int(s, "bytes_in_use");
	th_response_free(&r);
	ck_assert_int_ge(v, 0);
	return v;
}

/* A 32 MiB upload's request line and headers, onto the first device. */
static void send_big_put(int fd)
{
	char req[300], dev[32];

	snprintf(req, sizeof req, "PUT /v1/arrays/big?dtype=uint8&shape=33554432&device=%s"
	         "&memory_kind=device HTTP/1.1\r\nHost: t\r\nContent-Length: 33554432\r\n\r\n",
	         th_device_id(0, dev, sizeof dev));
	th_raw_send(fd, req);
}

/* An upload admitted (32 MiB held on the first device) that then sends one byte and
 * stalls: the connection is cut after --body-idle-timeout and the memory is
 * free again. */
START_TEST(test_stalled_body_cut)
{
	static const char *const args[] = {"--body-idle-timeout", "1", NULL};
	struct th_daemon d;
	long long t0, deadline;
	json_int_t held = 0;
	int fd;

	th_daemon_start(&d, args);
	ck_assert_int_eq(device_in_use(&d), 0);
	fd = th_raw_connect(&d);
	send_big_put(fd);
	th_raw_send_bytes(fd, "x", 1);
	deadline = th_now_ms() + 3000;
	while ((held = device_in_use(&d)) == 0 && th_now_ms() < deadline)
		usleep(10000);
	ck_assert_msg(held >= 32 << 20, "the upload holds %lld bytes", (long long)held);
	t0 = th_now_ms();
	ck_assert_msg(closed_within(fd, 8000), "a stalled upload is still connected after 8 s");
	ck_assert_msg(th_now_ms() - t0 >= 300, "cut after %lld ms: too early", th_now_ms() - t0);
	close(fd);
	deadline = th_now_ms() + 3000;
	while ((held = device_in_use(&d)) != 0 && th_now_ms() < deadline)
		usleep(10000);
	ck_assert_int_eq(held, 0);
	th_daemon_stop_ok(&d);
}
END_TEST

/* An upload that trickles (a byte every 200 ms: never idle) is cut once it
 * averages less than --body-min-rate after the grace period. */
START_TEST(test_trickling_body_cut)
{
	static const char *const args[] = {"--body-idle-timeout", "1", "--body-min-rate", "1MiB",
	                                   NULL};
	struct th_daemon d;
	long long deadline;
	bool cut = false;
	int fd;

	th_daemon_start(&d, args);
	fd = th_raw_connect(&d);
	send_big_put(fd);
	deadline = th_now_ms() + 8000;
	while (!cut && th_now_ms() < deadline) {
		if (send(fd, "x", 1, MSG_NOSIGNAL) != 1)
			break;
		cut = closed_within(fd, 200);
	}
	ck_assert_msg(cut || th_now_ms() < deadline, "a trickling upload still runs after 8 s");
	close(fd);
	deadline = th_now_ms() + 3000;
	while (device_in_use(&d) != 0 && th_now_ms() < deadline)
		usleep(10000);
	ck_assert_int_eq(device_in_use(&d), 0);
	{
		char *log = th_daemon_stderr(&d);

		ck_assert_msg(strstr(log, "slower than --body-min-rate"), "no log line:\n%s", log);
		free(log);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

/* A long step as an operation on d; its id in id. */
static void start_long_step(struct th_daemon *d, char *id, size_t cap)
{
	static const char *const json_h[] = {"Content-Type: application/json", NULL};
	static const char model[] = "{\"name\": \"m\", \"mlp\": {\"layers\": 4, \"d_model\": 128}}";
	static const char step[] = "{\"inputs\": \"x\", \"steps\": 1000000}";
	struct th_response r;
	char *x;

	th_request(d, "POST", "/v1/models?wait=true", json_h, model, sizeof model - 1, &r);
	ck_assert_msg(r.status == 200, "model: %ld %s", r.status, r.body);
	th_response_free(&r);
	x = calloc(256 * 128, 4);
	th_request(d, "PUT", "/v1/arrays/x?dtype=float32&shape=256,128", NULL, x, 256 * 128 * 4, &r);
	ck_assert_msg(r.status == 201, "inputs: %ld %s", r.status, r.body);
	th_response_free(&r);
	free(x);
	th_request(d, "POST", "/v1/models/m:step", json_h, step, sizeof step - 1, &r);
	ck_assert_msg(r.status == 202, "step: %ld %s", r.status, r.body);
	snprintf(id, cap, "%s", json_string_value(th_op_meta(th_json(&r), "id")));
	th_response_free(&r);
}

/* The idle timeout is for idle connections: a request waiting on an
 * operation (suspended) outlives it, and answers when its own wait ends. */
START_TEST(test_wait_outlives_connection_timeout)
{
	static const char *const args[] = {"--connection-timeout", "1", "--drain-seconds", "1", NULL};
	struct th_daemon d;
	struct th_response r;
	char id[64], path[128];
	long long t0;

	th_daemon_start(&d, args);
	start_long_step(&d, id, sizeof id);
	snprintf(path, sizeof path, "/v1/operations/%s:wait?timeout=3s", id);
	t0 = th_now_ms();
	th_request(&d, "POST", path, NULL, NULL, 0, &r);
	ck_assert_msg(r.status == 202, "wait: %ld %s", r.status, r.body);   /* not done yet */
	ck_assert(!th_bool(th_json(&r), "done"));
	ck_assert_msg(th_now_ms() - t0 >= 2500, "the wait ended after %lld ms", th_now_ms() - t0);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- framing ---------------------------------------------------------------- */

START_TEST(test_framing)
{
	static const char dup[] = "PUT /v1/arrays/f1?dtype=uint8&shape=4 HTTP/1.1\r\nHost: t\r\n"
	                          "Content-Length: 4\r\nContent-Length: 6\r\n\r\nabcdef";
	static const char same[] = "PUT /v1/arrays/f2?dtype=uint8&shape=4 HTTP/1.1\r\nHost: t\r\n"
	                           "Content-Length: 4\r\nContent-Length: 4\r\n\r\nabcd";
	static const char both[] = "PUT /v1/arrays/f3?dtype=uint8&shape=4 HTTP/1.1\r\nHost: t\r\n"
	                           "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
	                           "4\r\nabcd\r\n0\r\n\r\n"
	                           "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n";
	struct th_daemon d;
	struct th_response r;
	char buf[8192];
	int fd, code;

	th_daemon_start(&d, NULL);
	fd = th_raw_connect(&d);
	th_raw_send(fd, dup);
	code = th_raw_response(fd, buf, sizeof buf, 3000);
	ck_assert_msg(code == 400, "two Content-Length values: %d\n%s", code, buf);
	ck_assert_ptr_nonnull(strstr(buf, "CONFLICTING_CONTENT_LENGTH"));
	ck_assert_ptr_nonnull(strcasestr(buf, "\r\nConnection: close"));
	ck_assert_msg(closed_within(fd, 3000), "the connection stays open");
	close(fd);
	th_get(&d, "/v1/arrays/f1", &r);
	ck_assert_int_eq(r.status, 404);
	th_response_free(&r);

	fd = th_raw_connect(&d);                 /* the same value twice is one length */
	th_raw_send(fd, same);
	code = th_raw_response(fd, buf, sizeof buf, 3000);
	ck_assert_msg(code == 201, "the same Content-Length twice: %d\n%s", code, buf);
	close(fd);

	fd = th_raw_connect(&d);                 /* answered, then closed: no second request */
	th_raw_send(fd, both);
	code = th_raw_response(fd, buf, sizeof buf, 3000);
	ck_assert_msg(code == 201, "Content-Length with chunked: %d\n%s", code, buf);
	ck_assert_ptr_nonnull(strcasestr(buf, "\r\nConnection: close"));
	ck_assert_msg(closed_within(fd, 3000), "the connection is kept after CL + TE");
	close(fd);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- request heads the HTTP library would refuse -------------------------- */

/* Sends len bytes of text on a new connection (as much as the daemon takes
 * before it answers) and checks the answer is a google.rpc.Status of http
 * and reason in JSON, with a request id, and that the connection closes. */
static void head_refused(struct th_daemon *d, const char *what, const char *text, size_t len,
                         int http, const char *reason)
{
	static char buf[16384];
	int fd = th_raw_connect(d), code;
	size_t sent = 0;

	while (sent < len) {
		ssize_t n = send(fd, text + sent, len - sent, MSG_NOSIGNAL);

		if (n <= 0)
			break;                   /* answered and half-closed: the rest is not read */
		sent += (size_t)n;
	}
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == http, "%s: %d\n%.600s", what, code, buf);
	ck_assert_msg(strcasestr(buf, "\r\nContent-Type: application/json"), "%s: not JSON\n%.600s",
	              what, buf);
	ck_assert_msg(strcasestr(buf, "\r\nX-Request-Id: "), "%s: no request id", what);
	ck_assert_msg(strstr(buf, reason) && strstr(buf, "\"domain\":\"tstage\"") &&
	              strstr(buf, "type.googleapis.com/google.rpc.ErrorInfo"),
	              "%s: not the documented shape\n%.600s", what, buf);
	ck_assert_msg(!strstr(buf, "<html>"), "%s: HTML\n%.600s", what, buf);
	ck_assert_msg(closed_within(fd, 3000), "%s: the connection stays open", what);
	close(fd);
}

/* A text of "GET path HTTP/1.1", then headers: n copies of one. */
static char *head_of(const char *line, const char *header, size_t n, size_t *len)
{
	size_t ll = strlen(line), hl = strlen(header), o = 0;
	char *t = malloc(ll + n * hl + 64);

	ck_assert_ptr_nonnull(t);
	memcpy(t + o, line, ll);
	o += ll;
	o += (size_t)sprintf(t + o, "Host: t\r\n");
	for (size_t i = 0; i < n; i++, o += hl)
		memcpy(t + o, header, hl);
	memcpy(t + o, "\r\n", 3);
	*len = o + 2;
	return t;
}

/* Every answer is JSON in the documented shape, those to request heads the
 * HTTP library refuses itself included: a 1 MiB header and 20,000 headers
 * (431), 10^5 rows in a URL (414), a header line without a colon, a
 * request line without a version, a Content-Length that is no number
 * (400), HTTP/2.0 (505), a Transfer-Encoding other than chunked (501); a
 * head within the limits (48 KiB, 200 fields) is served on a new
 * connection whatever its method, and the daemon is unharmed. */
START_TEST(test_heads_answered_in_json)
{
	struct th_daemon d;
	struct th_response r;
	char *t, *big = malloc((1u << 20) + 32);
	size_t len, o;
	static char buf[8192];
	int fd, code;

	ck_assert_ptr_nonnull(big);
	th_daemon_start(&d, NULL);
	o = (size_t)sprintf(big, "X-Big: ");
	memset(big + o, 'a', 1u << 20);
	memcpy(big + o + (1u << 20), "\r\n", 3);
	t = head_of("GET /v1/arrays HTTP/1.1\r\n", big, 1, &len);
	head_refused(&d, "a 1 MiB header", t, len, 431, "REQUEST_HEAD_TOO_LARGE");
	free(t);
	t = head_of("GET /v1/arrays HTTP/1.1\r\n", "X-A: 1\r\n", 20000, &len);
	head_refused(&d, "20,000 headers", t, len, 431, "REQUEST_HEAD_TOO_LARGE");
	free(t);
	o = (size_t)sprintf(big, "GET /v1/arrays/a/data?rows=");
	for (int i = 0; i < 100000; i++)
		o += (size_t)sprintf(big + o, "%s%d", i ? "," : "", i);
	o += (size_t)sprintf(big + o, " HTTP/1.1\r\n");
	big[o] = '\0';
	t = head_of(big, "", 0, &len);
	head_refused(&d, "10^5 rows in a URL", t, len, 414, "URI_TOO_LONG");
	free(t);
	{
		static const struct {
			const char *what, *text, *reason;
			int http;
		} cases[] = {
			{"a header line without a colon", "GET /livez HTTP/1.1\r\nHost: t\r\ngarbage\r\n\r\n",
			 "MALFORMED_HEADER", 400},
			{"no version", "GET /livez\r\nHost: t\r\n\r\n", "MALFORMED_REQUEST", 400},
			{"no request line", "GARBAGE\r\n\r\n", "MALFORMED_REQUEST", 400},
			{"HTTP/2.0", "GET /livez HTTP/2.0\r\nHost: t\r\n\r\n", "HTTP_VERSION_NOT_SUPPORTED",
			 505},
			{"Content-Length: abc", "POST /v1/models HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
			 "BAD_CONTENT_LENGTH", 400},
			{"Transfer-Encoding: gzip",
			 "POST /v1/models HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
			 "UNSUPPORTED_TRANSFER_ENCODING", 501},
		};

		for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
			head_refused(&d, cases[i].what, cases[i].text, strlen(cases[i].text), cases[i].http,
			             cases[i].reason);
	}
	/* within the limits: a 40 KB header on a GET, 190 headers */
	memset(big, 'b', 40000);
	big[40000] = '\0';
	fd = th_raw_connect(&d);
	t = th_fmt("GET /livez HTTP/1.1\r\nHost: t\r\nX-Big: %s\r\n\r\n", big);
	th_raw_send(fd, t);
	free(t);
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == 200, "a 40 KB header: %d\n%.300s", code, buf);
	close(fd);
	fd = th_raw_connect(&d);
	t = head_of("GET /livez HTTP/1.1\r\n", "X-A: 1\r\n", 190, &len);
	th_raw_send_bytes(fd, t, len);
	free(t);
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == 200, "190 headers: %d\n%.300s", code, buf);
	close(fd);
	th_get(&d, "/livez", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	free(big);
	th_daemon_stop_ok(&d);
}
END_TEST

/* A later request on a kept-alive bulk connection (one that opened with a
 * PUT: memory for heads of about 60 KiB and 890 fields, which the library
 * reads itself) is held to the same limits as a first head: a 52 KB header
 * or 300 headers are 431 in JSON, the connection then closed; a 40 KB
 * header is served, and the connection goes on. */
START_TEST(test_later_heads_answered_in_json)
{
	static char buf[16384];
	static const char put[] = "PUT /v1/arrays/lh?dtype=uint8&shape=4 HTTP/1.1\r\nHost: t\r\n"
	                          "Content-Length: 4\r\n\r\nabcd";
	struct th_daemon d;
	char *big = malloc(52001), *t;
	size_t len;
	int fd, code;

	ck_assert_ptr_nonnull(big);
	th_daemon_start(&d, NULL);
	for (int k = 0; k < 2; k++) {
		fd = th_raw_connect(&d);
		th_raw_send(fd, put);
		code = th_raw_response(fd, buf, sizeof buf, 5000);
		ck_assert_msg(code == 201 || code == 200, "PUT: %d", code);
		memset(big, 'c', 52000);
		big[52000] = '\0';
		if (k == 0) {
			t = th_fmt("GET /livez HTTP/1.1\r\nHost: t\r\nX-Big: %s\r\n\r\n", big);
			len = strlen(t);
		} else {
			t = head_of("GET /livez HTTP/1.1\r\n", "X-A: 1\r\n", 300, &len);
		}
		th_raw_send_bytes(fd, t, len);
		free(t);
		code = th_raw_response(fd, buf, sizeof buf, 5000);
		ck_assert_msg(code == 431, "later head %d: %d\n%.600s", k, code, buf);
		ck_assert_msg(strcasestr(buf, "\r\nContent-Type: application/json") &&
		              strstr(buf, "\"reason\":\"REQUEST_HEAD_TOO_LARGE\"") &&
		              strstr(buf, "\"limit_bytes\":\"49152\"") &&
		              strstr(buf, "\"limit_fields\":\"200\"") && !strstr(buf, "<html>"),
		              "later head %d: not the documented JSON\n%.600s", k, buf);
		ck_assert_ptr_nonnull(strcasestr(buf, "\r\nConnection: close"));
		ck_assert_msg(closed_within(fd, 3000), "later head %d: the connection stays open", k);
		close(fd);
	}
	/* within the limits: served, and the connection goes on */
	fd = th_raw_connect(&d);
	th_raw_send(fd, put);
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	big[40000] = '\0';
	t = th_fmt("GET /livez HTTP/1.1\r\nHost: t\r\nX-Big: %s\r\n\r\n", big);
	th_raw_send(fd, t);
	free(t);
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	th_raw_send(fd, "GET /v1/arrays/lh/data HTTP/1.1\r\nHost: t\r\n\r\n");
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	close(fd);
	free(big);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- connection classes ---------------------------------------------------- */

/* The sample family{labels} of /metrics, read over the raw connection fd
 * (so reading it opens none). */
static double metric_over(int fd, const char *family, const char *labels)
{
	static char buf[1 << 17];
	double v = -1;
	int code;

	th_raw_send(fd, "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == 200, "/metrics: %d", code);
	ck_assert_msg(th_prom_find(strstr(buf, "\r\n\r\n") + 4, family, labels, &v),
	              "no %s{%s}", family, labels);
	return v;
}

/* tstage_http_connections_total{daemon=which}, read over fd. */
static double conns_of(int fd, const char *which)
{
	char labels[32];

	snprintf(labels, sizeof labels, "daemon=\"%s\"", which);
	return metric_over(fd, "tstage_http_connections_total", labels);
}

/* Each connection goes to the daemon its first request chose (its method,
 * read however it is split, or a long request line); one that leaves before
 * a byte goes to neither; a connection that opens with a GET still takes an
 * upload (in smaller pieces) byte for byte, and one that opens with a PUT
 * serves GETs after it. */
START_TEST(test_connections_by_first_method)
{
	static char big[32768], reply[16384];
	struct th_daemon d;
	char buf[8192], req[256];
	double small0, bulk0;
	size_t n = (size_t)3 << 20;
	unsigned char *data = malloc(n);
	struct th_response r;
	int mfd, fd, code;

	ck_assert_ptr_nonnull(data);
	for (size_t i = 0; i < n; i++)
		data[i] = (unsigned char)(i * 131 + (i >> 12));
	th_daemon_start(&d, NULL);
	mfd = th_raw_connect(&d);
	small0 = conns_of(mfd, "small");
	bulk0 = conns_of(mfd, "bulk");
	ck_assert(small0 >= 1);

	fd = th_raw_connect(&d);                 /* split within the method: small */
	th_raw_send(fd, "GE");
	usleep(200000);
	th_raw_send(fd, "T /livez HTTP/1.1\r\nHost: t\r\n\r\n");
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	close(fd);

	fd = th_raw_connect(&d);                 /* split, a PUT: bulk; then a GET on it */
	th_raw_send(fd, "PU");
	usleep(200000);
	th_raw_send(fd, "T /v1/arrays/cls1?dtype=uint8&shape=4 HTTP/1.1\r\nHost: t\r\n"
	                "Content-Length: 4\r\n\r\nabcd");
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == 201, "a split PUT: %d\n%s", code, buf);
	th_raw_send(fd, "GET /v1/arrays/cls1/data HTTP/1.1\r\nHost: t\r\n\r\n");
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	ck_assert_msg(strstr(buf, "\r\n\r\nabcd"), "GET after a PUT:\n%s", buf);
	close(fd);

	fd = th_raw_connect(&d);                 /* gone before a byte: neither */
	close(fd);
	fd = th_raw_connect(&d);                 /* gone within its method: the small */
	th_raw_send(fd, "POS");                  /* daemon reads what came, and closes */
	usleep(100000);
	close(fd);

	/* a first request line of 4 KiB or more goes to the bulk daemon, whose
	 * connection memory holds it; a small-daemon connection answers 414 */
	fd = th_raw_connect(&d);
	th_raw_send(fd, "PUT /v1/arrays/cls3?dtype=uint8&shape=4096 HTTP/1.1\r\nHost: t\r\n"
	                "Content-Length: 4096\r\n\r\n");
	th_raw_send_bytes(fd, data, 4096);
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 201);
	close(fd);
	{
		size_t o = (size_t)snprintf(big, sizeof big, "GET /v1/arrays/cls3/data?rows=");

		for (int i = 0; i < 4000; i++)
			o += (size_t)snprintf(big + o, sizeof big - o, "%s%d", i ? "," : "", i % 4096);
		snprintf(big + o, sizeof big - o, " HTTP/1.1\r\nHost: t\r\n\r\n");
	}
	ck_assert(strlen(big) > 16384);
	fd = th_raw_connect(&d);
	th_raw_send(fd, big);
	code = th_raw_response(fd, reply, sizeof reply, 5000);
	ck_assert_msg(code == 200, "a 19 KB request line on a new connection: %d", code);
	ck_assert_ptr_nonnull(strstr(reply, "X-Tstage-Shape: [4000]"));
	close(fd);
	fd = th_raw_connect(&d);
	th_raw_send(fd, "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	th_raw_send(fd, big);
	code = th_raw_response(fd, reply, sizeof reply, 5000);
	ck_assert_msg(code == 414, "a 19 KB request line on a small-daemon connection: %d", code);
	close(fd);

	fd = th_raw_connect(&d);                 /* a GET, then a 3 MiB upload on it */
	th_raw_send(fd, "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	snprintf(req, sizeof req, "PUT /v1/arrays/cls2?dtype=uint8&shape=%zu HTTP/1.1\r\n"
	         "Host: t\r\nContent-Length: %zu\r\n\r\n", n, n);
	th_raw_send(fd, req);
	th_raw_send_bytes(fd, data, n);
	code = th_raw_response(fd, buf, sizeof buf, 10000);
	ck_assert_msg(code == 201, "an upload on a GET's connection: %d\n%s", code, buf);
	close(fd);
	th_get(&d, "/v1/arrays/cls2/data", &r);
	ck_assert_int_eq(r.status, 200);
	ck_assert_uint_eq(r.body_len, n);
	ck_assert(memcmp(r.body, data, n) == 0);
	th_response_free(&r);

	/* small: the split GET, the one within its method, the GET before the
	 * 414, the GET before the upload and th_get's; bulk: the split PUT,
	 * the PUT of cls3 and the long line */
	usleep(100000);
	ck_assert_msg(conns_of(mfd, "bulk") == bulk0 + 3, "bulk %g, was %g",
	              conns_of(mfd, "bulk"), bulk0);
	ck_assert_msg(conns_of(mfd, "small") == small0 + 5, "small %g, was %g",
	              conns_of(mfd, "small"), small0);
	close(mfd);
	free(data);
	th_daemon_stop_ok(&d);
}
END_TEST

/* A connection that never sends is closed after --connection-timeout (while
 * it waits for its first bytes, before a daemon has it), and uncounted: with
 * --max-connections 2, two silent ones leave no room until they are closed. */
START_TEST(test_silent_connection_timeout)
{
	static const char *const args[] = {"--connection-timeout", "1", "--max-connections", "2",
	                                   NULL};
	struct th_daemon d;
	char buf[8192];
	int a, b, code;
	long long t0;

	th_daemon_start(&d, args);
	a = th_raw_connect(&d);
	b = th_raw_connect(&d);
	usleep(200000);
	code = get_from(&d, "127.0.0.2", "/livez", buf, sizeof buf, 3000);
	ck_assert_msg(code == 503, "past two silent connections: %d\n%s", code, buf);
	t0 = th_now_ms();
	ck_assert_msg(closed_within(a, 4000), "a silent connection stays open");
	ck_assert_msg(closed_within(b, 4000), "a silent connection stays open");
	ck_assert_msg(th_now_ms() - t0 < 4000, "closed after %lld ms", th_now_ms() - t0);
	close(a);
	close(b);
	code = get_from(&d, "127.0.0.2", "/livez", buf, sizeof buf, 3000);
	ck_assert_msg(code == 200, "after the silent ones closed: %d\n%s", code, buf);
	th_daemon_stop_ok(&d);
}
END_TEST

/* tstage_http_worker_connections{worker=w}, read over fd (itself a
 * small-request connection, counted on its worker). */
static double worker_conns(int fd, int w)
{
	char labels[32];

	snprintf(labels, sizeof labels, "worker=\"%d\"", w);
	return metric_over(fd, "tstage_http_worker_connections", labels);
}

/* Whether the workers' gauges reach want[] within ms (a close is counted
 * when its worker notices it). */
static bool workers_reach(int fd, const double *want, int n, int ms)
{
	long long end = th_now_ms() + ms;

	do {
		bool all = true;

		for (int w = 0; w < n && all; w++)
			all = worker_conns(fd, w) == want[w];
		if (all)
			return true;
		usleep(20000);
	} while (th_now_ms() < end);
	return false;
}

/* A kept-alive connection that has been answered once (so that the
 * acceptor has handed it to a worker). */
static int answered_connection(struct th_daemon *d)
{
	char buf[4096];
	int fd = th_raw_connect(d);

	th_raw_send(fd, "GET /livez HTTP/1.1\r\nHost: t\r\n\r\n");
	ck_assert_int_eq(th_raw_response(fd, buf, sizeof buf, 5000), 200);
	return fd;
}

/* Small-request connections fill one worker to --worker-fill before the next
 * worker takes any, then go to the least loaded; a closed one frees its
 * place, and every connection is served wherever it went. */
START_TEST(test_workers_fill_then_balance)
{
	static const char *const args[] = {"--threads", "3", "--worker-fill", "2", NULL};
	static const double after_six[3] = {3, 2, 2}, after_closes[3] = {2, 1, 2},
	                    after_seventh[3] = {2, 2, 2}, bulk_not_counted[3] = {2, 2, 2};
	struct th_daemon d;
	char buf[4096];
	int mfd, fd[7];

	th_daemon_start(&d, args);
	mfd = answered_connection(&d);           /* worker 0: 1 */
	for (int i = 0; i < 6; i++)              /* 0: 2, 1: 2, 2: 2, then 0: 3 */
		fd[i] = answered_connection(&d);
	ck_assert_msg(workers_reach(mfd, after_six, 3, 3000), "workers: %g %g %g",
	              worker_conns(mfd, 0), worker_conns(mfd, 1), worker_conns(mfd, 2));
	close(fd[0]);                            /* worker 0 (its second) */
	close(fd[2]);                            /* worker 1 (its second) */
	ck_assert_msg(workers_reach(mfd, after_closes, 3, 3000), "after two closes: %g %g %g",
	              worker_conns(mfd, 0), worker_conns(mfd, 1), worker_conns(mfd, 2));
	fd[0] = answered_connection(&d);         /* worker 1 is below the fill */
	ck_assert_msg(workers_reach(mfd, after_seventh, 3, 3000), "after a new one: %g %g %g",
	              worker_conns(mfd, 0), worker_conns(mfd, 1), worker_conns(mfd, 2));
	/* a connection that opens with a PUT is the bulk daemon's */
	fd[2] = th_raw_connect(&d);
	th_raw_send(fd[2], "PUT /v1/arrays/wf?dtype=uint8&shape=4 HTTP/1.1\r\nHost: t\r\n"
	                   "Content-Length: 4\r\n\r\nabcd");
	ck_assert_int_eq(th_raw_response(fd[2], buf, sizeof buf, 5000), 201);
	ck_assert(workers_reach(mfd, bulk_not_counted, 3, 1000));
	/* every connection is served, on whichever worker */
	for (int i = 0; i < 6; i++) {
		th_raw_send(fd[i], "GET /v1/arrays/wf/data HTTP/1.1\r\nHost: t\r\n\r\n");
		ck_assert_int_eq(th_raw_response(fd[i], buf, sizeof buf, 5000), 200);
		ck_assert_msg(strstr(buf, "\r\n\r\nabcd"), "connection %d:\n%s", i, buf);
	}
	for (int i = 0; i < 6; i++)
		close(fd[i]);
	close(mfd);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- the port --------------------------------------------------------------- */

START_TEST(test_second_daemon_same_port)
{
	struct th_daemon d;
	struct th_run_result res;
	struct th_response r;
	char port[16];
	const char *args[] = {"--port", port, "--sim-devices", "1", "--no-cuda", NULL};

	th_daemon_start(&d, NULL);
	snprintf(port, sizeof port, "%d", d.port);
	th_run(args, NULL, 10000, &res);
	ck_assert_msg(res.status == 1, "a second daemon on port %s: status %d\n%s", port, res.status,
	              res.err);
	ck_assert_msg(strstr(res.err, "address in use"), "no reason:\n%s", res.err);
	th_run_free(&res);
	/* and the first one still answers every request */
	for (int i = 0; i < 20; i++) {
		th_get(&d, "/readyz", &r);
		ck_assert_int_eq(r.status, 200);
		th_response_free(&r);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- stopping --------------------------------------------------------------- */

static const char held_request[] = "POST /v1/memory:resetPeak HTTP/1.1\r\nHost: t\r\n"
                                   "Content-Type: application/json\r\nContent-Length: 2\r\n"
                                   "Expect: 100-continue\r\n\r\n";

/* A request left waiting for its body keeps the drain going. */
static int hold_request(struct th_daemon *d)
{
	char buf[4096];
	int fd = th_raw_connect(d), code;

	th_raw_send(fd, held_request);
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == 100, "want 100 Continue, got %d\n%s", code, buf);
	return fd;
}

/* Polls new connections until /readyz answers 503 (draining has begun). */
static void wait_draining(struct th_daemon *d)
{
	long long deadline = th_now_ms() + 5000;
	char buf[8192];
	int code;

	do {
		code = get_from(d, NULL, "/readyz", buf, sizeof buf, 2000);
	} while (code == 200 && th_now_ms() < deadline && usleep(10000) == 0);
	ck_assert_msg(code == 503, "/readyz on a new connection while draining: %d\n%s", code, buf);
	ck_assert_ptr_nonnull(strstr(buf, "DRAINING"));
}

/* While draining the daemon still listens: new connections get /readyz
 * 503, new /v1 work 503 UNAVAILABLE (Connection: close), /livez 200. */
START_TEST(test_drain_answers_new_connections)
{
	static const char *const args[] = {"--drain-seconds", "20", NULL};
	struct th_daemon d;
	char buf[8192];
	int fd, code;

	th_daemon_start(&d, args);
	fd = hold_request(&d);
	th_daemon_signal(&d, SIGTERM);
	wait_draining(&d);
	code = get_from(&d, NULL, "/v1/devices", buf, sizeof buf, 2000);
	ck_assert_msg(code == 503, "new /v1 work while draining: %d\n%s", code, buf);
	ck_assert_ptr_nonnull(strstr(buf, "\"status\":\"UNAVAILABLE\""));
	ck_assert_ptr_nonnull(strstr(buf, "DRAINING"));
	ck_assert_ptr_nonnull(strcasestr(buf, "\r\nConnection: close"));
	ck_assert_int_eq(get_from(&d, NULL, "/livez", buf, sizeof buf, 2000), 200);
	th_raw_send(fd, "{}");
	code = th_raw_response(fd, buf, sizeof buf, 5000);
	ck_assert_msg(code == 200, "the held request: %d\n%s", code, buf);
	close(fd);
	ck_assert_int_eq(th_daemon_wait(&d, 10000), 0);
	th_daemon_stop(&d, false);
}
END_TEST

/* A second SIGTERM while draining exits at once, with a log line and a
 * non-zero code, not by the signal. */
START_TEST(test_sigterm_twice)
{
	static const char *const args[] = {"--drain-seconds", "30", NULL};
	struct th_daemon d;
	long long t0;
	char *log;
	int fd, st;

	th_daemon_start(&d, args);
	fd = hold_request(&d);
	th_daemon_signal(&d, SIGTERM);
	wait_draining(&d);
	t0 = th_now_ms();
	th_daemon_signal(&d, SIGTERM);
	st = th_daemon_wait(&d, 3000);
	ck_assert_msg(st == 3, "after a second SIGTERM: status %d (-1: still running)", st);
	ck_assert_msg(th_now_ms() - t0 < 3000, "exit took %lld ms", th_now_ms() - t0);
	log = th_daemon_stderr(&d);
	ck_assert_msg(strstr(log, "second SIGTERM"), "no log line:\n%s", log);
	free(log);
	close(fd);
	th_daemon_stop(&d, false);
}
END_TEST

/* An operation still running at the drain deadline is cancelled and logged
 * with its id; the daemon then exits 0. */
START_TEST(test_drain_cancels_operations)
{
	static const char *const args[] = {"--drain-seconds", "1", NULL};
	struct th_daemon d;
	char id[64], *log;
	long long t0;
	int st;

	th_daemon_start(&d, args);
	start_long_step(&d, id, sizeof id);
	t0 = th_now_ms();
	th_daemon_signal(&d, SIGTERM);
	st = th_daemon_wait(&d, 15000);
	ck_assert_msg(st == 0, "exit status %d (-1: still running after 15 s)", st);
	ck_assert_msg(th_now_ms() - t0 >= 900, "exited after %lld ms, before the deadline",
	              th_now_ms() - t0);
	log = th_daemon_stderr(&d);
	ck_assert_msg(strstr(log, "cancelled at the drain deadline") && strstr(log, id),
	              "operation %s not logged as cancelled:\n%s", id, log);
	free(log);
	th_daemon_stop(&d, false);
}
END_TEST

/* ---- server-side import below --data-dir ------------------------------------ */

static void import_path(struct th_daemon *d, const char *query, const char *path,
                        struct th_response *r)
{
	json_t *j = json_pack("{s:s}", "path", path);
	char *text = json_dumps(j, JSON_COMPACT), url[256];

	snprintf(url, sizeof url, "/v1/arrays:import%s%s", query ? "?" : "", query ? query : "");
	th_post(d, url, text, r);
	free(text);
	json_decref(j);
}

/* Refused as outside, without naming the data dir. */
static void assert_outside(struct th_daemon *d, const char *query, const char *path,
                           const char *dir)
{
	struct th_response r;

	import_path(d, query, path, &r);
	ck_assert_msg(r.status == 403, "'%s' (%s): %ld %s", path, query ? query : "", r.status,
	              r.body);
	th_assert_error(&r, 403, "PERMISSION_DENIED", "PATH_NOT_ALLOWED");
	ck_assert_msg(!strstr(r.body, dir) || strncmp(path, dir, strlen(dir)) == 0,
	              "the message shows the data dir: %s", r.body);
	th_response_free(&r);
}

START_TEST(test_import_stays_below_data_dir)
{
	static const char *const queries[] = {NULL, "wait=true"};
	char dir[1200], outer[512], path[1400], real[1100];
	const char *args[] = {"--data-dir", dir, NULL};
	struct th_daemon d;
	struct th_response r;

	th_temp_dir("hostile", outer, sizeof outer);
	ck_assert_ptr_nonnull(realpath(outer, real));
	snprintf(dir, sizeof dir, "%s/data", real);
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	snprintf(path, sizeof path, "%s/secret.safetensors", real);
	th_write_file(path, "12345678", 8);
	snprintf(path, sizeof path, "%s/pipe", dir);
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	snprintf(path, sizeof path, "%s/out", dir);
	ck_assert_int_eq(symlink(real, path), 0);          /* a directory outside */
	snprintf(path, sizeof path, "%s/text.safetensors", dir);
	th_write_file(path, "hello, world: this is not a safetensors file", 44);
	th_daemon_start(&d, args);

	for (size_t q = 0; q < 2; q++) {
		/* outside: the same answer whether or not the file exists */
		snprintf(path, sizeof path, "%s/secret.safetensors", real);
		assert_outside(&d, queries[q], path, dir);
		snprintf(path, sizeof path, "%s/missing.safetensors", real);
		assert_outside(&d, queries[q], path, dir);
		assert_outside(&d, queries[q], "../secret.safetensors", dir);
		assert_outside(&d, queries[q], "../missing.safetensors", dir);
		assert_outside(&d, queries[q], "nowhere/../../secret.safetensors", dir);
		assert_outside(&d, queries[q], "out/secret.safetensors", dir);     /* through a link */
		assert_outside(&d, queries[q], "out/missing.safetensors", dir);
		snprintf(path, sizeof path, "%s/out/secret.safetensors", dir);
		assert_outside(&d, queries[q], path, dir);
		/* a FIFO is refused at once, and never blocks a thread: twice */
		for (int i = 0; i < 2; i++) {
			long long t0 = th_now_ms();

			import_path(&d, queries[q], "pipe", &r);
			th_assert_error(&r, 400, "INVALID_ARGUMENT", "NOT_A_REGULAR_FILE");
			ck_assert_msg(th_now_ms() - t0 < 3000, "a FIFO took %lld ms", th_now_ms() - t0);
			th_response_free(&r);
		}
		/* not safetensors: nothing of the file's bytes in the answer */
		import_path(&d, "wait=true", "text.safetensors", &r);
		th_assert_error(&r, 400, "INVALID_ARGUMENT", NULL);
		/* "hello, w" read as a little-endian u64 */
		ck_assert_msg(!strstr(r.body, "8583909746840200552"), "bytes echoed: %s", r.body);
		th_response_free(&r);
		import_path(&d, queries[q], "missing.safetensors", &r);
		th_assert_error(&r, 404, "NOT_FOUND", "FILE_NOT_FOUND");
		ck_assert_msg(!strstr(r.body, dir), "the message shows the data dir: %s", r.body);
		th_response_free(&r);
	}
	th_get(&d, "/livez", &r);
	ck_assert_int_eq(r.status, 200);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

/* A streamed import whose header is past --import-header-limit is refused
 * before the header is buffered. */
START_TEST(test_import_header_limit)
{
	static const char *const args[] = {"--import-header-limit", "1MiB", NULL};
	static const char *const octets[] = {"Content-Type: application/octet-stream", NULL};
	size_t n = 2u << 20;
	char *body = calloc(1, 8 + n);
	struct th_daemon d;
	struct th_response r;

	ck_assert_ptr_nonnull(body);
	for (int i = 0; i < 8; i++)
		body[i] = (char)(unsigned char)((uint64_t)n >> (8 * i));
	th_daemon_start(&d, args);
	th_request(&d, "POST", "/v1/arrays:import", octets, body, 8 + n, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "HEADER_TOO_LARGE");
	ck_assert_ptr_nonnull(strstr(r.body, "--import-header-limit"));
	th_response_free(&r);
	/* a header within the limit is read as before (and here, refused as not JSON) */
	body[2] = 0;
	body[1] = 4;                                              /* 1 KiB */
	th_request(&d, "POST", "/v1/arrays:import", octets, body, 8 + 1024, &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_SAFETENSORS_HEADER");
	th_response_free(&r);
	free(body);
	th_daemon_stop_ok(&d);
}
END_TEST

/* Headers being read share --import-header-budget: while one import holds
 * 2 MiB of a 3 MiB budget, another 2 MiB header is refused with 429; once
 * the first goes, the budget is whole again. */
START_TEST(test_import_header_budget)
{
	static const char *const args[] = {"--import-header-limit", "2MiB",
	                                   "--import-header-budget", "3MiB", NULL};
	static const char *const octets[] = {"Content-Type: application/octet-stream", NULL};
	size_t n = 2u << 20;
	char *body = calloc(1, 8 + n), req[300];
	struct th_daemon d;
	struct th_response r;
	long long deadline;
	int fd;

	ck_assert_ptr_nonnull(body);
	body[2] = 0x20;                                  /* N = 2 MiB; zeros: not JSON */
	th_daemon_start(&d, args);
	fd = th_raw_connect(&d);
	snprintf(req, sizeof req, "POST /v1/arrays:import HTTP/1.1\r\nHost: t\r\n"
	         "Content-Type: application/octet-stream\r\nContent-Length: %zu\r\n\r\n", 8 + n);
	th_raw_send(fd, req);
	th_raw_send_bytes(fd, body, 8 + 1024);           /* holds its header's budget */
	usleep(200000);
	th_request(&d, "POST", "/v1/arrays:import", octets, body, 8 + n, &r);
	th_assert_error(&r, 429, "RESOURCE_EXHAUSTED", "HEADER_BUDGET");
	ck_assert_ptr_nonnull(strstr(r.body, "--import-header-budget"));
	th_response_free(&r);
	close(fd);
	deadline = th_now_ms() + 5000;
	for (;;) {
		th_request(&d, "POST", "/v1/arrays:import", octets, body, 8 + n, &r);
		if (r.status != 429 || th_now_ms() > deadline)
			break;
		th_response_free(&r);
		usleep(20000);
	}
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_SAFETENSORS_HEADER");
	th_response_free(&r);
	free(body);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- memory defaults under a cgroup limit ----------------------------------- */

/* With a 256 MiB cgroup limit, host budgets are a quarter and a half of it,
 * and an upload past them is a clean 429. */
START_TEST(test_cgroup_budgets)
{
	char root[512], p[700];
	const char *args[] = {"--cgroup-root", root, NULL};
	struct th_daemon d;
	struct th_response r;
	json_t *spaces, *s;
	size_t i;
	char *big;
	int seen = 0;

	th_temp_dir("cgroup", root, sizeof root);
	/* both layouts: v2 at the root, v1 under memory/ */
	snprintf(p, sizeof p, "%s/memory.max", root);
	th_write_file(p, "268435456\n", 10);
	snprintf(p, sizeof p, "%s/memory", root);
	ck_assert_int_eq(mkdir(p, 0700), 0);
	snprintf(p, sizeof p, "%s/memory/memory.limit_in_bytes", root);
	th_write_file(p, "268435456\n", 10);
	th_daemon_start(&d, args);
	spaces = th_arr(th_get_json(&d, "/v1/memory", &r), "spaces");   /* once: the macro
	                                                                  * evaluates it per item */
	json_array_foreach(spaces, i, s) {
		const char *kind = th_str(s, "memory_kind");

		if (strcmp(kind, "pinned_host") == 0) {
			ck_assert_int_eq(th_int(s, "bytes_limit"), 64 << 20);
			seen++;
		} else if (strcmp(kind, "unpinned_host") == 0) {
			ck_assert_int_eq(th_int(s, "bytes_limit"), 128 << 20);
			seen++;
		}
	}
	ck_assert_int_gt(seen, 0);
	th_response_free(&r);
	big = calloc(1, 160 << 20);
	ck_assert_ptr_nonnull(big);
	{
		char dev[32], url[200];

		snprintf(url, sizeof url, "/v1/arrays/big?dtype=uint8&shape=167772160&device=%s"
		         "&memory_kind=unpinned_host", th_device_id(0, dev, sizeof dev));
		th_request(&d, "PUT", url, NULL, big, 160 << 20, &r);
	}
	free(big);
	th_assert_error(&r, 429, "RESOURCE_EXHAUSTED", NULL);
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

/* ---- the suite -------------------------------------------------------------- */

Suite *th_suite(void)
{
	Suite *s = suite_create("hostile");
	TCase *tc;

	tc = tcase_create("connections");
	tcase_add_test(tc, test_idle_flood_defaults);
	tcase_add_test(tc, test_connection_limit_flags);
	tcase_add_test(tc, test_stalled_body_cut);
	tcase_add_test(tc, test_trickling_body_cut);
	tcase_add_test(tc, test_wait_outlives_connection_timeout);
	tcase_add_test(tc, test_framing);
	tcase_add_test(tc, test_heads_answered_in_json);
	tcase_add_test(tc, test_later_heads_answered_in_json);
	tcase_add_test(tc, test_second_daemon_same_port);
	tcase_add_test(tc, test_connections_by_first_method);
	tcase_add_test(tc, test_silent_connection_timeout);
	tcase_add_test(tc, test_workers_fill_then_balance);
	suite_add_tcase(s, tc);

	tc = tcase_create("stopping");
	tcase_add_test(tc, test_drain_answers_new_connections);
	tcase_add_test(tc, test_sigterm_twice);
	tcase_add_test(tc, test_drain_cancels_operations);
	suite_add_tcase(s, tc);

	tc = tcase_create("import");
	tcase_add_test(tc, test_import_stays_below_data_dir);
	tcase_add_test(tc, test_import_header_limit);
	tcase_add_test(tc, test_import_header_budget);
	suite_add_tcase(s, tc);

	tc = tcase_create("memory");
	tcase_add_test(tc, test_cgroup_budgets);
	suite_add_tcase(s, tc);
	return s;
}
