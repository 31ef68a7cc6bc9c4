/*
 * fleet.h - the fleet view: the other tstaged daemons that --peers names
 * (and the addresses of --peers-dns, resolved again every 10 s), polled over
 * the same HTTP API with the same token.
 *
 * A poller thread asks every peer GET /v1/fleet?scope=local (its host,
 * version and devices as /v1/devices writes them) about once a second, all
 * peers at once with a short timeout each; a peer that does not answer in
 * time, or answers anything but 200 with that body, is unreachable, with
 * the reason. Each peer's latest node object is replaced whole after each
 * poll and never changed once published; a reader copies them under a
 * short lock and formats outside it: GET /v1/fleet never waits on a peer.
 *
 * Calls to peers (the copies' receives and commits) take their libcurl
 * easy handles from a small pool, each keeping its connections to the
 * peers open between calls (HTTP keep-alive): a call then costs no TCP
 * connect, and the peer no accept. Each easy handle has its own connection
 * cache; none is shared between handles (libcurl's shared connection
 * cache, CURL_LOCK_DATA_CONNECT, has had concurrency bugs).
 *
 * Thread-safety: ts_fleet_nodes, ts_fleet_easy_take and ts_fleet_easy_give
 * may run on any threads at once; new and free on one.
 */
#ifndef TS_FLEET_H
#define TS_FLEET_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

struct ts_call;
struct ts_fleet;
struct ts_metrics;
struct ts_reply;
struct ts_route;
struct ts_server;

/* A peer's answer as libcurl reads it: a growing NUL-terminated buffer of
 * at most max bytes; past that the write fails (the transfer ends) and
 * too_big says why. Zeroed but for max to start; buf is the caller's to free. */
struct ts_fleet_body {
	char *buf;
	size_t len;
	size_t max;
	bool too_big;
};

/* CURLOPT_WRITEFUNCTION for a struct ts_fleet_body given as CURLOPT_WRITEDATA. */
size_t ts_fleet_body_write(char *data, size_t size, size_t nmemb, void *cls);

struct ts_fleet_config {
	const char *peers;               /* --peers as validated by config.c; "" none */
	const char *peers_dns;           /* --peers-dns: a name whose addresses are peers */
	const char *bind;                /* --bind: the address that is this daemon's own */
	int port;                        /* the DNS peers' port (this daemon's) */
	const char *token;               /* bearer token sent to peers; "" none */
	struct ts_metrics *metrics;      /* tstage_fleet_peers; borrowed */
	int interval_ms;                 /* between the starts of two polls */
	int timeout_ms;                  /* one poll of one peer, connecting included */
};

/* Starts polling (no thread without peers): *out, or an error. */
ts_status ts_fleet_new(const struct ts_fleet_config *cfg, struct ts_fleet **out,
                       struct ts_error *err);

/* Stops the poller (an answer in flight is abandoned) and frees f; NULL is
 * fine. */
void ts_fleet_free(struct ts_fleet *f);

/* A libcurl easy handle for one call to a peer, the caller's until
 * ts_fleet_easy_give: one the pool kept (options reset with
 * curl_easy_reset, its open connections kept) or a new one; NULL when out
 * of memory. Never use a handle on two threads at once. */
void *ts_fleet_easy_take(struct ts_fleet *f);

/* Hands back easy (a CURL *; NULL is fine): the pool keeps it with its
 * connections when keep (the call ended with an answer from the peer, so
 * the connection is well) and there is room, else it is cleaned up (its
 * connections closed). */
void ts_fleet_easy_give(struct ts_fleet *f, void *easy, bool keep);

/* A new array of copies of every peer's node object, in --peers order;
 * NULL when out of memory. */
json_t *ts_fleet_nodes(struct ts_fleet *f);

/* The URL of the peer whose --host-name is host, into url (cap bytes):
 * TS_OK; NOT_FOUND (HOST_NOT_FOUND) when no peer has answered with that
 * name; UNAVAILABLE (PEER_UNREACHABLE, naming it and why) when it has but
 * is unreachable now. */
ts_status ts_fleet_peer(struct ts_fleet *f, const char *host, char *url, size_t cap,
                        struct ts_error *err);

/* A GET whose ?host= names another node of the fleet: asks that peer the
 * same path with the route's other query arguments (and the fleet's token)
 * and answers its JSON, or its error naming it; true when it answered
 * (false: no host, or this node's own; the route serves it). HOST_NOT_FOUND
 * and PEER_UNREACHABLE as ts_fleet_peer; PEER_SILENT after 5 s. Waits on
 * the peer on the caller's thread. */
bool ts_fleet_forward(struct ts_server *srv, const struct ts_route *route,
                      const struct ts_call *call, struct ts_reply *reply);

#endif
