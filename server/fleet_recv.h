/*
 * fleet_recv.h - the destination of a cross-node copy: POST /v1/fleet:receive
 * admits an array arriving from a peer (every refusal answered before any
 * byte moves), allocates its staging array in host memory, and answers a
 * ticket for the fleet port, a receive id and a deadline; the peer sends the
 * bytes as UCX active messages on the endpoint that presented the ticket
 * (fleet_ucx.h), which land in the staging memory, and then
 * POST /v1/fleet/receives/{id}:commit runs the prepared move
 * (jobs/move.h: placement, dtype conversion, publish) as an operation, or
 * :abort drops it. A receive neither committed nor aborted by its deadline
 * is dropped by the fleet's progress thread: nothing is published, and the
 * staging and destination memory go back. One whose endpoint fails before
 * every byte landed is ended at once the same way. A small array's bytes (at
 * most TS_FLEET_RECV_INLINE_MAX) may come with the request instead: as its
 * body (Content-Type application/octet-stream, the receive's JSON object in
 * the TS_FLEET_RECV_HEADER header; what peers send) or as "data" in the JSON
 * body (base64). Then no ticket is issued and the receive is committed at
 * once.
 *
 * Thread-safety: every function may run on any thread at once.
 */
#ifndef TS_FLEET_RECV_H
#define TS_FLEET_RECV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/router.h"

struct ts_fleet_recv;
struct ts_fleet_ucx;

/* Default and longest life of a receive, in seconds. */
#define TS_FLEET_RECV_TTL_S 60
#define TS_FLEET_RECV_TTL_MAX_S 3600

/* Largest array whose bytes may come with its receive's request (the body,
 * or "data" in base64): no ticket, no endpoint, committed at once. */
#define TS_FLEET_RECV_INLINE_MAX (64u << 10)

/* The header that carries a receive's JSON object when the request's body
 * is the array's bytes. */
#define TS_FLEET_RECV_HEADER "X-Tstage-Receive"

/* Most receives open at once. */
#define TS_FLEET_RECV_MAX 64

struct ts_fleet_recv *ts_fleet_recv_new(void);

/* Drops every open receive (the fleet port u, borrowed, closes their
 * endpoints first); the set stays usable. NULL u: no endpoint to close. */
void ts_fleet_recv_drop_all(struct ts_fleet_recv *r, struct ts_fleet_ucx *u);

/* Drops the receives past their deadline; a tick of the fleet port's
 * progress thread (cls: the server). */
void ts_fleet_recv_tick(void *cls);

void ts_fleet_recv_free(struct ts_fleet_recv *r);

/* The sink of the fleet port (fleet_ucx.h's land, landed, failed; cls: the
 * server, tag: a receive's): where a receive's bytes go, that they landed,
 * and that its endpoint failed, which ends a receive still missing bytes
 * with UNAVAILABLE (PEER_FAILED) naming the peer: it is dropped at once and
 * its commit answers that error until its deadline. */
void *ts_fleet_recv_land(void *cls, const void *tag, uint64_t offset, size_t len);
void ts_fleet_recv_landed(void *cls, const void *tag, void *dst, size_t len, bool ok);
void ts_fleet_recv_failed(void *cls, const void *tag, const char *peer, const char *why);

ts_server_handler_fn ts_s_fleet_receive;
ts_server_handler_fn ts_s_fleet_receive_commit;
ts_server_handler_fn ts_s_fleet_receive_abort;
/* GET /v1/fleet/receives/{id}[?wait_ms=N]: its bytes received of its
 * length, its forward (a chain's middle hop: the next host, bytes
 * forwarded, sending/done/failed and the error), and "complete" (every
 * byte landed and, forwarding, forwarded or failed); waits up to N ms
 * (at most 60000) for complete. An ended receive answers its error. */
ts_server_handler_fn ts_s_fleet_receive_get;

#endif
