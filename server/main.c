/*
 * main.c - tstaged: parse the configuration, start the server, wait for
 * SIGTERM or SIGINT, drain and exit 0.
 *
 * The stop signals are blocked before the server starts a thread, so every
 * thread it starts inherits the mask, and a handler is installed as well:
 * a library may have started threads of its own before main (OpenBLAS does,
 * from its constructor), and a stop signal delivered to one of them must
 * still be handled, never take the default action. The handler only writes
 * the signal's number to a pipe, which main reads. A second stop signal,
 * whenever it comes (draining, or stopping the workers), exits at once from
 * the handler, with a log line and exit code 3.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/version.h"
#include "server/config.h"
#include "server/server.h"

#define EXIT_INTERRUPTED 3

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

static int install_stop_handler(void)
{
	struct sigaction sa;

	if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
		return -1;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop_signal;
	sa.sa_flags = SA_RESTART;
	sigfillset(&sa.sa_mask);
	if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
		return -1;
	return 0;
}

/* Blocks until a stop signal has been written to the pipe; its number. */
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

static const char *sig_name(int sig)
{
	return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "signal";
}

int main(int argc, char **argv)
{
	struct ts_config cfg;
	struct ts_server *srv = NULL;
	struct ts_drain_result dr;
	struct ts_error err;
	sigset_t sigs;
	int sig;
	char fields[64];

	switch (ts_config_parse(&cfg, argc, argv, stdout, stderr)) {
	case TS_CONFIG_EXIT_OK:
		return 0;
	case TS_CONFIG_EXIT_USAGE:
		return 2;
	case TS_CONFIG_RUN:
		break;
	}
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (install_stop_handler() != 0) {
		ts_log(TS_LOG_ERROR, NULL, "cannot install the stop signal handler: %s",
		       strerror(errno));
		return 1;
	}

	ts_error_clear(&err);
	if (ts_server_new(&cfg, &srv, &err) != TS_OK) {
		ts_log(TS_LOG_ERROR, NULL, "cannot start: %s", err.message);
		return 1;
	}
	/* the server's threads keep the mask; main takes the signals */
	pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
	snprintf(fields, sizeof fields, "\"port\":%d", ts_server_port(srv));
	ts_log(TS_LOG_INFO, fields, "tstaged %s listening on %s:%d", ts_version, cfg.bind,
	       ts_server_port(srv));
	sig = wait_stop();
	ts_log(TS_LOG_INFO, NULL, "%s received; draining (a second one exits at once)",
	       sig_name(sig));
	ts_server_drain(srv, cfg.drain_seconds, &dr);
	if (dr.requests)
		ts_log(TS_LOG_WARN, NULL, "%d requests still in flight at shutdown", dr.requests);
	if (dr.operations)
		ts_log(TS_LOG_WARN, NULL, "%d operations cancelled at shutdown", dr.operations);
	ts_server_free(srv);
	ts_log(TS_LOG_INFO, NULL, "stopped");
	return 0;
}
