/*
 * main.c - tstaged: parse the configuration, start the server, restore the
 * state dir, serve until SIGTERM or SIGINT, drain (saving the state dir)
 * and exit 0.
 *
 * Signals, as daemons take them:
 *   SIGTERM, SIGINT  drain and stop (a second one exits at once, code 3);
 *   SIGHUP           reopen --log-file (logrotate's move-then-HUP); nothing
 *                    else is reloaded: the configuration is flags and
 *                    environment, fixed for the process's life; the log
 *                    line says what was reopened;
 *   SIGUSR1          dump the state to the log (spaces, catalog, models,
 *                    operations in flight, the state dir) and keep serving.
 *
 * The stop signals are blocked before the server starts a thread, so every
 * thread it starts inherits the mask, and a handler is installed as well:
 * a library may have started threads of its own before main (OpenBLAS does,
 * from its constructor), and a stop signal delivered to one of them must
 * still be handled, never take the default action. The handler only writes
 * the signal's number to a pipe, which main reads. A second stop signal,
 * whenever it comes (draining, or stopping the workers), exits at once from
 * the handler, with a log line and exit code 3.
 *
 * Under systemd (Type=notify) readiness is a datagram to $NOTIFY_SOCKET:
 * READY=1 once the port listens, STOPPING=1 when draining starts. The
 * protocol is one AF_UNIX datagram (a path, or an abstract name written with
 * a leading '@'), so no library is needed.
 *
 * --probe URL is the container health check: one GET over a plain TCP
 * socket to a numeric address (or localhost), exit 0 on a 2xx answer and 1
 * otherwise, within PROBE_TIMEOUT_MS.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/version.h"
#include "server/config.h"
#include "server/server.h"

#define EXIT_INTERRUPTED 3
#define PROBE_TIMEOUT_MS 3000

/* The pipe the handler writes to: the one piece of process state a signal
 * handler can reach. Written once before the handler is installed. */
static int stop_pipe[2] = {-1, -1};
static _Atomic int stops_seen;

/* Writes n as width digits at p (async-signal-safe). */
static char *digits(char *p, long n, int width)
{
	for (int i = width - 1; i >= 0; i--, n /= 10)
		p[i] = (char)('0' + n % 10);
	return p + width;
}

/* The log line of an immediate exit, built with async-signal-safe calls
 * only (the log's own formatter is not). */
static void log_immediate_exit(int sig)
{
	static const char head[] = "{\"ts\":\"";
	static const char mid[] = "Z\",\"level\":\"warn\",\"msg\":\"second ";
	static const char tail[] = " while stopping; exiting now without a clean stop\",\"exit_code\":3}\n";
	const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
	struct timespec now;
	char line[256], *p = line;
	long days, secs, y, m, d, era, doe, yoe, doy, mp;

	clock_gettime(CLOCK_REALTIME, &now);
	days = (long)(now.tv_sec / 86400);
	secs = (long)(now.tv_sec % 86400);
	/* civil date from days since 1970-01-01 (H. Hinnant's algorithm) */
	days += 719468;
	era = days / 146097;
	doe = days - era * 146097;
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	mp = (5 * doy + 2) / 153;
	d = doy - (153 * mp + 2) / 5 + 1;
	m = mp < 10 ? mp + 3 : mp - 9;
	y = yoe + era * 400 + (m <= 2);
	memcpy(p, head, sizeof head - 1);
	p += sizeof head - 1;
	p = digits(p, y, 4);
	*p++ = '-';
	p = digits(p, m, 2);
	*p++ = '-';
	p = digits(p, d, 2);
	*p++ = 'T';
	p = digits(p, secs / 3600, 2);
	*p++ = ':';
	p = digits(p, secs / 60 % 60, 2);
	*p++ = ':';
	p = digits(p, secs % 60, 2);
	*p++ = '.';
	p = digits(p, now.tv_nsec / 1000000L, 3);
	memcpy(p, mid, sizeof mid - 1);
	p += sizeof mid - 1;
	memcpy(p, name, strlen(name));
	p += strlen(name);
	memcpy(p, tail, sizeof tail - 1);
	p += sizeof tail - 1;
	(void)!write(STDERR_FILENO, line, (size_t)(p - line));
}

static void on_stop_signal(int sig)
{
	unsigned char b = (unsigned char)sig;
	int saved = errno;

	if (atomic_fetch_add(&stops_seen, 1) > 0) {
		log_immediate_exit(sig);
		_exit(EXIT_INTERRUPTED);
	}
	(void)!write(stop_pipe[1], &b, 1);
	errno = saved;
}

/* SIGHUP and SIGUSR1: main does the work when it reads the pipe. */
static void on_other_signal(int sig)
{
	unsigned char b = (unsigned char)sig;
	int saved = errno;

	(void)!write(stop_pipe[1], &b, 1);
	errno = saved;
}

/* The signals main handles, with their handlers (the head of this file). */
static const struct {
	int sig;
	void (*fn)(int);
} handled[] = {{SIGTERM, on_stop_signal}, {SIGINT, on_stop_signal},
               {SIGHUP, on_other_signal}, {SIGUSR1, on_other_signal}};

/* handled[i]'s handler installed; -1 with errno. */
static int install_handler(size_t i)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handled[i].fn;
	sa.sa_flags = SA_RESTART;
	sigfillset(&sa.sa_mask);
	return sigaction(handled[i].sig, &sa, NULL);
}

/* The pipe the handlers write to, then every handler; -1 with errno. */
static int install_handlers(void)
{
	if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
		return -1;
	for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++)
		if (install_handler(i) != 0)
			return -1;
	return 0;
}

/* Points stderr (where log lines go) at path, appending; -1 with errno. */
static int open_log_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);

	if (fd < 0)
		return -1;
	if (fd != STDERR_FILENO && dup2(fd, STDERR_FILENO) < 0) {
		close(fd);
		return -1;
	}
	if (fd != STDERR_FILENO)
		close(fd);
	return 0;
}

/* SIGHUP: reopens the log file when there is one, and says so. */
static void on_hangup(const struct ts_config *cfg)
{
	if (!cfg->log_file[0]) {
		ts_log(TS_LOG_INFO, "\"event\":\"sighup\",\"reopened\":[],\"reloaded\":[]",
		       "SIGHUP received: logging to stderr, nothing to reopen; nothing else is "
		       "reloadable (flags and environment are fixed for the process's life)");
		return;
	}
	if (open_log_file(cfg->log_file) != 0) {
		ts_log(TS_LOG_ERROR, "\"event\":\"sighup\"",
		       "SIGHUP received: cannot reopen log file '%s': %s; still logging to the old "
		       "one", cfg->log_file, strerror(errno));
		return;
	}
	ts_log(TS_LOG_INFO, "\"event\":\"sighup\",\"reopened\":[\"log_file\"],\"reloaded\":[]",
	       "SIGHUP received: reopened log file '%s'; nothing else is reloadable",
	       cfg->log_file);
}

/* Blocks until a signal has been written to the pipe; its number. */
static int wait_stop(void)
{
	struct pollfd pfd = {.fd = stop_pipe[0], .events = POLLIN};
	unsigned char b = 0;

	for (;;) {
		if (read(stop_pipe[0], &b, 1) == 1)
			return b;
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
			return SIGTERM;
	}
}

/* Sends state ("READY=1") to the service manager when $NOTIFY_SOCKET names
 * one; a failure is logged and otherwise ignored (the service still runs). */
static void notify_service_manager(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len;
	int fd;

	if (!path || !*path)
		return;
	len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path) {
		ts_log(TS_LOG_WARN, NULL, "NOTIFY_SOCKET '%s' is not a socket path or @name", path);
		return;
	}
	memcpy(sa.sun_path, path, len);
	if (path[0] == '@')
		sa.sun_path[0] = '\0';         /* abstract: the name has no terminator */
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa,
	                     (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
		ts_log(TS_LOG_WARN, NULL, "cannot notify the service manager at '%s': %s", path,
		       strerror(errno));
	if (fd >= 0)
		close(fd);
}

/* ---- --probe ------------------------------------------------------------- */

static long long probe_now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Splits "http://HOST[:PORT][/path]" (HOST numeric, [v6] or localhost);
 * false with why filled when url is not one. */
static bool probe_parse_url(const char *url, char *host, size_t hcap, char *port,
                            size_t pcap, const char **path, char *why, size_t wcap)
{
	const char *p, *h, *hend, *slash;
	size_t hlen, plen;

	if (strncmp(url, "http://", 7) != 0) {
		snprintf(why, wcap, "only http:// URLs can be probed");
		return false;
	}
	h = url + 7;
	slash = strchr(h, '/');
	*path = slash ? slash : "/";
	if (!slash)
		slash = h + strlen(h);
	if (*h == '[') {
		hend = memchr(h, ']', (size_t)(slash - h));
		if (!hend) {
			snprintf(why, wcap, "unterminated IPv6 address");
			return false;
		}
		h++;
		p = hend + 1;
	} else {
		hend = memchr(h, ':', (size_t)(slash - h));
		if (!hend)
			hend = slash;
		p = hend;
	}
	hlen = (size_t)(hend - h);
	if (hlen == 0 || hlen >= hcap) {
		snprintf(why, wcap, "no host");
		return false;
	}
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	if (strcmp(host, "localhost") == 0)
		snprintf(host, hcap, "127.0.0.1");
	if (p == slash) {
		snprintf(port, pcap, "80");
	} else if (*p == ':') {
		plen = (size_t)(slash - p - 1);
		if (plen == 0 || plen >= pcap || strspn(p + 1, "0123456789") < plen ||
		    atoi(p + 1) < 1 || atoi(p + 1) > 65535) {
			snprintf(why, wcap, "bad port");
			return false;
		}
		memcpy(port, p + 1, plen);
		port[plen] = '\0';
	} else {
		snprintf(why, wcap, "unexpected text after the host");
		return false;
	}
	if (strpbrk(*path, " \r\n")) {
		snprintf(why, wcap, "the path holds a space or a line break");
		return false;
	}
	return true;
}

/* Waits for events on fd until deadline; false on timeout or error. */
static bool probe_wait(int fd, short events, long long deadline)
{
	struct pollfd pfd = {.fd = fd, .events = events};
	long long left;
	int n;

	for (;;) {
		left = deadline - probe_now_ms();
		if (left <= 0)
			return false;
		n = poll(&pfd, 1, (int)left);
		if (n > 0)
			return true;
		if (n == 0 || errno != EINTR)
			return false;
	}
}

/* GET url: 0 when it answers 2xx, 1 otherwise (why on stderr). */
static int probe(const char *url)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	long long deadline = probe_now_ms() + PROBE_TIMEOUT_MS;
	char host[64], port[8], why[128], req[1024], resp[256];
	const char *path;
	size_t got = 0, sent = 0, reqlen;
	ssize_t n;
	int fd = -1, rc = 1, soerr = 0, code = 0, gai;
	socklen_t slen = sizeof soerr;

	if (!probe_parse_url(url, host, sizeof host, port, sizeof port, &path, why, sizeof why)) {
		fprintf(stderr, "tstaged: cannot probe '%s': %s\n", url, why);
		goto out_close;
	}
	gai = getaddrinfo(host, port, &hints, &ai);
	if (gai != 0) {
		fprintf(stderr, "tstaged: cannot probe '%s': host '%s' is not a numeric address "
		                "or localhost (%s)\n", url, host, gai_strerror(gai));
		goto out_close;
	}
	reqlen = (size_t)snprintf(req, sizeof req,
	                          "GET %s HTTP/1.1\r\nHost: %s%s%s:%s\r\nUser-Agent: tstaged-probe"
	                          "\r\nConnection: close\r\n\r\n", path,
	                          ai->ai_family == AF_INET6 ? "[" : "", host,
	                          ai->ai_family == AF_INET6 ? "]" : "", port);
	if (reqlen >= sizeof req) {
		fprintf(stderr, "tstaged: cannot probe '%s': the path is too long\n", url);
		goto out_close;
	}
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0 || (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) ||
	    !probe_wait(fd, POLLOUT, deadline) ||
	    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &slen) != 0 || soerr != 0) {
		fprintf(stderr, "tstaged: probe '%s': cannot connect: %s\n", url,
		        soerr ? strerror(soerr) : fd < 0 || errno != EINPROGRESS ? strerror(errno)
		                                                                : "timed out");
		goto out_close;
	}
	while (sent < reqlen) {
		n = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
		if (n < 0 && errno == EAGAIN && probe_wait(fd, POLLOUT, deadline))
			continue;
		if (n <= 0) {
			fprintf(stderr, "tstaged: probe '%s': cannot send the request\n", url);
			goto out_close;
		}
		sent += (size_t)n;
	}
	/* the status line is all it reads: "HTTP/1.1 200 OK" */
	while (got < sizeof resp - 1 && !memchr(resp, '\n', got)) {
		if (!probe_wait(fd, POLLIN, deadline)) {
			fprintf(stderr, "tstaged: probe '%s': no answer within %d ms\n", url,
			        PROBE_TIMEOUT_MS);
			goto out_close;
		}
		n = recv(fd, resp + got, sizeof resp - 1 - got, 0);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	resp[got] = '\0';
	if (sscanf(resp, "HTTP/1.%*1[01] %3d", &code) != 1) {
		fprintf(stderr, "tstaged: probe '%s': not an HTTP answer\n", url);
		goto out_close;
	}
	if (code < 200 || code > 299) {
		fprintf(stderr, "tstaged: probe '%s': HTTP %d\n", url, code);
		goto out_close;
	}
	rc = 0;
out_close:
	if (fd >= 0)
		close(fd);
	if (ai)
		freeaddrinfo(ai);
	return rc;
}

static const char *sig_name(int sig)
{
	return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP"
	       : sig == SIGUSR1 ? "SIGUSR1" : "signal";
}

/*
 * main's handlers, checked again once the server has started: a library it
 * loads on the way (the CUDA runtime's, NCCL's, UCX's) may have put its own
 * on one of these signals (NCCL's proxy thread caught SIGUSR1 in some
 * releases), which would leave the signal doing nothing of what the head of
 * this file says. Each one taken is logged, naming the signal, and
 * installed again.
 */
static void reclaim_signal_handlers(void)
{
	for (size_t i = 0; i < sizeof handled / sizeof handled[0]; i++) {
		const char *name = sig_name(handled[i].sig);
		struct sigaction cur;
		char fields[96];

		if (sigaction(handled[i].sig, NULL, &cur) != 0 ||
		    (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == handled[i].fn))
			continue;
		snprintf(fields, sizeof fields, "\"event\":\"signal_handler_taken\",\"signal\":\"%s\"",
		         name);
		ts_log(TS_LOG_WARN, fields,
		       "%s's handler was replaced while the server started (by a library it loaded); "
		       "tstaged's own is installed again", name);
		if (install_handler(i) != 0)
			ts_log(TS_LOG_ERROR, NULL, "cannot install the %s handler again: %s", name,
			       strerror(errno));
	}
}

int main(int argc, char **argv)
{
	struct ts_config cfg;
	struct ts_server *srv = NULL;
	struct ts_drain_result dr;
	struct ts_error err;
	sigset_t sigs;
	int sig;
	char fields[160];

	switch (ts_config_parse(&cfg, argc, argv, stdout, stderr)) {
	case TS_CONFIG_EXIT_OK:
		return 0;
	case TS_CONFIG_EXIT_USAGE:
		return 2;
	case TS_CONFIG_RUN:
		break;
	}
	if (cfg.probe[0])
		return probe(cfg.probe);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (cfg.log_file[0] && open_log_file(cfg.log_file) != 0) {
		fprintf(stderr, "tstaged: cannot open log file '%s': %s\n", cfg.log_file,
		        strerror(errno));
		return 1;
	}
	if (install_handlers() != 0) {
		ts_log(TS_LOG_ERROR, NULL, "cannot install the signal handlers: %s",
		       strerror(errno));
		return 1;
	}

	ts_error_clear(&err);
	if (ts_server_new(&cfg, &srv, &err) != TS_OK) {
		ts_log(TS_LOG_ERROR, NULL, "cannot start: %s", err.message);
		return 1;
	}
	reclaim_signal_handlers();
	/* the server's threads keep the mask; main takes the signals */
	pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
	snprintf(fields, sizeof fields, "\"event\":\"listening\",\"port\":%d", ts_server_port(srv));
	ts_log(TS_LOG_INFO, fields, "tstaged %s listening on %s:%d", ts_version, cfg.bind,
	       ts_server_port(srv));
	if (cfg.unix_socket[0])
		ts_log(TS_LOG_INFO, NULL, "and on unix socket %s (mode %s, group %s; no token asked)",
		       cfg.unix_socket, cfg.unix_socket_mode,
		       cfg.unix_socket_group[0] ? cfg.unix_socket_group : "the daemon's");
	ts_server_restore(srv);
	notify_service_manager("READY=1");
	for (;;) {
		sig = wait_stop();
		if (sig == SIGHUP)
			on_hangup(&cfg);
		else if (sig == SIGUSR1)
			ts_server_dump(srv);
		else
			break;
	}
	snprintf(fields, sizeof fields, "\"event\":\"drain\",\"signal\":\"%s\",\"drain_seconds\":%d",
	         sig_name(sig), cfg.drain_seconds);
	ts_log(TS_LOG_INFO, fields, "%s received; draining (a second one exits at once)",
	       sig_name(sig));
	notify_service_manager("STOPPING=1");
	ts_server_drain(srv, cfg.drain_seconds, &dr);
	if (dr.requests)
		ts_log(TS_LOG_WARN, NULL, "%d requests still in flight at shutdown", dr.requests);
	if (dr.operations)
		ts_log(TS_LOG_WARN, NULL, "%d operations cancelled at shutdown", dr.operations);
	if (dr.state_dir && !dr.state_saved)
		ts_log(TS_LOG_ERROR, "\"event\":\"state_not_saved\"",
		       "the state dir was not saved at shutdown; the next start reads the save before");
	ts_server_free(srv);
	snprintf(fields, sizeof fields,
	         "\"event\":\"exit\",\"code\":0,\"requests_left\":%d,\"operations_cancelled\":%d",
	         dr.requests, dr.operations);
	ts_log(TS_LOG_INFO, fields, "stopped");
	return 0;
}
