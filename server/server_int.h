/*
 * server_int.h - the definition of struct ts_server, shared by the server's
 * own files (server.c: lifecycle; http.c: the request pipeline). Nothing
 * outside server/ includes this.
 */
#ifndef TS_SERVER_INT_H
#define TS_SERVER_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "common/lock.h"
#include "handlers/api.h"
#include "server/config.h"
#include "server/fleet.h"
#include "server/fleet_link.h"
#include "server/fleet_recv.h"
#include "server/fleet_ucx.h"
#include "server/metrics.h"
#include "server/server.h"

#define TS__ADDR_BUCKETS 256

struct ts__addr_count;
struct ts__acceptor;
struct ts__lease_service;
struct ts_history;
struct ts_trace;

/* A daemon the acceptor hands connections to, and what its connection
 * callbacks learn of it (their closure): which small-request worker it is,
 * or -1 for the bulk daemon. */
struct ts__daemon {
	struct MHD_Daemon *mhd;          /* owned */
	struct ts_server *srv;           /* borrowed; immutable after start */
	int worker;                      /* immutable after start */
};

struct ts_server {
	struct ts_config cfg;            /* immutable after init */
	struct ts_core core;             /* immutable after init */
	struct ts_device_set *devices;   /* owned */
	struct ts_topology *topology;    /* owned */
	struct ts_memory *memory;        /* owned */
	struct ts_metrics *metrics;      /* owned */
	struct ts_router *router;        /* owned; ts_routes prepared for matching */
	struct ts_catalog *catalog;      /* owned */
	struct ts_stager *stager;        /* owned */
	struct ts_fleet *fleet;          /* owned; the --peers poller (fleet.c) */
	struct ts_history *history;      /* owned; the sampler (memory_history.c) */
	struct ts_fleet_ucx *fleet_ucx;  /* owned; the fleet's data port, NULL when it is off */
	struct ts_fleet_recv *fleet_recv;  /* owned; cross-node copies arriving (fleet_recv.h) */
	struct ts_fleet_link *fleet_link;  /* owned; the copies' sending UCX (fleet_link.h);
	                                    * NULL when the fleet port is off */
	struct ts_trace *trace;          /* owned; the recorder (tracing.c) */
	char data_dir[4096];             /* realpath of cfg.data_dir; "" when none */
	/* connections that open with a request without a body, each on one of
	 * nworkers daemons of one thread each that the acceptor chooses
	 * (ts__worker_pick), and those that open with PUT, POST or PATCH, on
	 * one daemon with a pool of threads (accept.c) */
	struct ts__daemon *workers;      /* owned; nworkers, immutable after start */
	int nworkers;
	struct ts__daemon bulk;
	struct ts__acceptor *acceptor;   /* owned (accept.c) */
	bool unix_listening;             /* the --unix-socket file is ours to unlink */
	struct ts__lease_service *lease; /* owned; NULL without --unix-socket (lease.c) */
	char token[256];                 /* immutable; "" when no token is required */
	size_t token_len;
	char id_prefix[12];              /* immutable: random per process */
	int port;                        /* immutable after listen */
	/* suspended requests and their deadlines (http.c) */
	struct ts_mutex waits_mu;
	pthread_cond_t waits_cv;
	struct ts__waiting *waits;       /* guarded by: waits_mu */
	bool waits_stop;                 /* guarded by: waits_mu */
	uint64_t waits_until_ns;         /* the deadline thread's wake time, UINT64_MAX
	                                  * when it sleeps until signalled; guarded by:
	                                  * waits_mu */
	pthread_t waits_thread;
	bool waits_started;
	_Atomic uint64_t next_id;
	_Atomic bool draining;
	_Atomic bool restored;           /* the state dir has been read (or there is none) */
	/* connections served, in all and by client address (accept.c) */
	struct ts_mutex conns_mu;
	bool conns_started;
	int conns;                       /* guarded by: conns_mu */
	struct ts__addr_count *by_addr[TS__ADDR_BUCKETS];   /* guarded by: conns_mu */
	char *busy[2];                   /* immutable after start: raw 503s (all, per address) */
	size_t busy_len[2];
	_Atomic uint64_t import_header_used;   /* safetensors headers being read (jobs/import.c) */
};

struct ts__waiting;

/* Starts the MHD daemon on srv->cfg's address (http.c). */
ts_status ts__http_start(struct ts_server *srv, struct ts_error *err);

/* Answers every suspended request now (as timed out) and stops the
 * deadline thread; for draining (http.c). */
void ts__http_wake_all(struct ts_server *srv);

/* Makes the listening socket of cfg->unix_socket with its mode and group
 * (unix_socket.c): *fd, or an error naming the flag. */
ts_status ts__unix_listen(const struct ts_config *cfg, int *fd, struct ts_error *err);

/* The same for another path with cfg's mode and group (the lease socket). */
ts_status ts__unix_listen_at(const struct ts_config *cfg, const char *path, int *fd,
                             struct ts_error *err);

/* Starts the lease service on "<--unix-socket>.lease" (lease.c); stops it,
 * ending every lease (their arrays' references dropped). */
ts_status ts__lease_start(struct ts_server *srv, struct ts_error *err);
void ts__lease_stop(struct ts_server *srv);

/* Starts sampling the daemon's counters into srv->history, once the
 * memory table, devices, metrics and operations exist; stops it (before
 * any of them is freed) (memory_history.c). */
ts_status ts__history_start(struct ts_server *srv, struct ts_error *err);
void ts__history_stop(struct ts_server *srv);

/* Makes the trace recorder and gives it to the devices, once the device
 * set exists; frees it after the devices and operations are gone; records
 * a request's span when a trace is on (tracing.c). */
ts_status ts__trace_start(struct ts_server *srv, struct ts_error *err);
void ts__trace_free(struct ts_server *srv);
void ts__trace_request(struct ts_server *srv, const char *method, const char *pattern,
                       int code, uint64_t t0_ns, uint64_t t1_ns);

/* Stops the acceptor and the daemons, and frees the connection accounting
 * (http.c). */
void ts__http_stop(struct ts_server *srv);

/* Connection accounting (accept.c). ts__conns_start makes the raw 503s and
 * answers the library's own per-daemon limit in *hard; ts__conns_stop frees
 * what is left. A connection's key is its client address, IPv4 mapped into
 * IPv6 (zeros on the Unix socket). ts__conn_admit counts one and answers 0,
 * or which limit it would pass (1: --max-connections, 2: per address; local
 * ones have none) without counting it; ts__conn_leave uncounts one;
 * ts__conn_refuse counts a refusal (tstage_http_connections_refused_total),
 * logs some, and sends the raw 503 on fd (-1: none) and half-closes it.
 * Thread-safe. */
ts_status ts__conns_start(struct ts_server *srv, unsigned int *hard, struct ts_error *err);
void ts__conns_stop(struct ts_server *srv);
void ts__conn_key(const struct sockaddr *sa, unsigned char key[16]);
int ts__conn_admit(struct ts_server *srv, const unsigned char key[16], bool local);
void ts__conn_leave(struct ts_server *srv, const unsigned char key[16]);
void ts__conn_refuse(struct ts_server *srv, int fd, int which);

/* A first request line this long or longer goes to the bulk daemon, whose
 * connection memory holds a request head of about 60 KiB (the small one's,
 * about 7.5 KiB): a long ?rows= list on a new connection is served. */
#define TS__LONG_LINE 4096

/* Which daemon a connection's first bytes b[0..n) (all that has come; only
 * the first TS__LONG_LINE are looked at) choose: 1 with *bulk set when the
 * method is PUT, POST or PATCH, or the request line is TS__LONG_LINE long
 * or longer, and *bulk clear when the line is whole and shorter; 0 while
 * the method or the line is still coming (*bulk clear: the guess so far). */
int ts__first_request_class(const char *b, size_t n, bool *bulk);

/* A connection's first request head as the acceptor reads it (server/head.c). */
struct ts__head {
	size_t len;              /* its bytes, through the blank line (when whole) */
	int fields;              /* headers, query parameters and cookies so far */
	bool small;              /* a small-request connection holds it */
	int http;                /* refused: the HTTP status (400, 414, 431, 501, 505) */
	const char *reason;      /* refused: the ErrorInfo reason (static) */
	char message[200];       /* refused: why */
};

enum { TS__HEAD_MORE = 0, TS__HEAD_OK = 1, TS__HEAD_REFUSED = 2 };

/* Checks the first bytes b[0..n) (all that has come) of a connection:
 * TS__HEAD_MORE while its head is still coming and within the limits
 * (http_tuning.h); TS__HEAD_OK when it is whole and fits (h->small says
 * whether a small-request connection holds it); TS__HEAD_REFUSED, with
 * h->http, reason and message, for a head past the limits or one the
 * library would refuse itself (in HTML). Reads nothing past b + n. */
int ts__head_check(const char *b, size_t n, struct ts__head *h);

/* The small-request worker a new connection goes to, given the connections
 * open on each of n workers (n >= 1): the first with fewer than fill, so
 * that a few connections share one poll loop, which then seldom sleeps
 * between their requests; when every worker has fill or more, the one with
 * the fewest (the first of those). fill 1 spreads connections evenly. */
int ts__worker_pick(const int64_t *conns, int n, int fill);

/* Most small-request workers (--threads is at most this). */
#define TS__MAX_WORKERS 1024

/* The listening socket of cfg's --bind and --port (nonblocking): *fd, and
 * the port bound in *port (accept.c). */
ts_status ts__tcp_listen(const struct ts_config *cfg, int *fd, int *port, struct ts_error *err);

/* Starts the acceptor thread on the listening sockets fds (1 or 2; owned
 * from the call on, closed by ts__accept_stop, also when it fails); it
 * hands each connection to one of srv->workers or to srv->bulk. Stopping
 * closes the connections still waiting (accept.c). */
ts_status ts__accept_start(struct ts_server *srv, const int *fds, int nfds, struct ts_error *err);
void ts__accept_stop(struct ts_server *srv);

#endif
