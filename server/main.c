/*
 * main.c - tstaged: parse the configuration, start the server, wait for
 * SIGTERM or SIGINT, drain in-flight requests and exit 0.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/log.h"
#include "server/config.h"
#include "server/server.h"

int main(int argc, char **argv)
{
	struct ts_config cfg;
	struct ts_server *srv = NULL;
	struct ts_error err;
	sigset_t sigs;
	int sig = 0, left;
	char fields[64];

	switch (ts_config_parse(&cfg, argc, argv, stdout, stderr)) {
	case TS_CONFIG_EXIT_OK:
		return 0;
	case TS_CONFIG_EXIT_USAGE:
		return 2;
	case TS_CONFIG_RUN:
		break;
	}
	/* block the stop signals in every thread; main waits for them */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	ts_error_clear(&err);
	if (ts_server_new(&cfg, &srv, &err) != TS_OK) {
		ts_log(TS_LOG_ERROR, NULL, "cannot start: %s", err.message);
		return 1;
	}
	snprintf(fields, sizeof fields, "\"port\":%d", ts_server_port(srv));
	ts_log(TS_LOG_INFO, fields, "tstaged %s listening on %s:%d", TS_VERSION, cfg.bind,
	       ts_server_port(srv));
	sigwait(&sigs, &sig);
	ts_log(TS_LOG_INFO, NULL, "%s received; draining", sig == SIGTERM ? "SIGTERM" : "SIGINT");
	left = ts_server_drain(srv, cfg.drain_seconds);
	if (left)
		ts_log(TS_LOG_WARN, NULL, "%d requests still in flight at shutdown", left);
	ts_server_free(srv);
	ts_log(TS_LOG_INFO, NULL, "stopped");
	return 0;
}
