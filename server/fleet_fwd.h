/*
 * fleet_fwd.h - a hop of a chained broadcast: the receive of a middle node
 * (fleet_recv.h, its request's "forward") sends every chunk that lands in
 * its memory on to the next node's receive as soon as it has landed, over
 * the daemon's own kept endpoint there (fleet_link.h), each message naming
 * that receive's ticket. One thread per forwarding receive; it ends once
 * every byte is forwarded and flushed, or failed (its error names the next
 * node), or stopped.
 *
 * Always: the forwarder reads only bytes that have landed, and its sends
 * are over (completed, or their endpoint killed) before ts_fleet_fwd_free
 * returns, so the receive may free its memory then.
 *
 * Thread-safety: _landed and _state may run on any thread at once;
 * _start and _free on one.
 */
#ifndef TS_FLEET_FWD_H
#define TS_FLEET_FWD_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "server/config.h"
#include "server/fleet_ucx.h"

struct ts_server;
struct ts_fleet_fwd;

/* Where a hop forwards: the receive request's "forward", resolved. */
struct ts_fleet_fwd_spec {
	char host[128];                      /* the next node, as this one's peers name it */
	char url[TS_CONFIG_PEER_URL_MAX + 1];/* its HTTP URL, from this node's peers */
	char id[64];                         /* its receive */
	char ticket[TS_FLEET_TICKET_LEN + 1];/* that receive's */
	char port[16];                       /* its fleet port */
	uint64_t instance;                   /* its fleet instance */
	uint64_t ttl_s;                      /* its receive's life from now */
};

/* Parses "forward" ({"host", "id", "ticket", "fleet_port", "fleet_instance",
 * "expires_in_seconds"}) into *spec, the host looked up among this node's
 * peers: INVALID_ARGUMENT naming the bad field, NOT_FOUND or UNAVAILABLE
 * for a host that is no reachable peer. */
ts_status ts_fleet_fwd_parse(struct ts_server *srv, json_t *fwd, struct ts_fleet_fwd_spec *spec,
                             struct ts_error *err);

/* Starts forwarding the length bytes at data (borrowed: they stay until
 * ts_fleet_fwd_free) as they land: *out, or RESOURCE_EXHAUSTED (no thread,
 * no memory), FAILED_PRECONDITION when this daemon sends nothing (no
 * --peers). what names the array, for messages. */
ts_status ts_fleet_fwd_start(struct ts_server *srv, const struct ts_fleet_fwd_spec *spec,
                             const char *what, const unsigned char *data, uint64_t length,
                             struct ts_fleet_fwd **out, struct ts_error *err);

/* [offset, offset + len) of the data has landed: forwarded next. */
void ts_fleet_fwd_landed(struct ts_fleet_fwd *f, uint64_t offset, uint64_t len);

/* Where f stands: bytes forwarded (sent and completed), whether it is over
 * (every byte forwarded, or failed) and, failed, its error in *err. */
void ts_fleet_fwd_state(struct ts_fleet_fwd *f, uint64_t *done, bool *over, bool *failed,
                        struct ts_error *err);

/* The next node's host (borrowed from f). */
const char *ts_fleet_fwd_host(const struct ts_fleet_fwd *f);

/* Stops f (unless it is over: sends in flight end with their endpoint,
 * killed), waits for its thread and frees it. NULL is fine. */
void ts_fleet_fwd_free(struct ts_fleet_fwd *f);

#endif
