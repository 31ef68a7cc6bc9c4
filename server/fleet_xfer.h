/*
 * fleet_xfer.h - the sending end of a cross-node copy: the operation that
 * :copy and :put with "host" submit (handlers/api.h, ts_core.fleet_copy).
 *
 * It holds the source version (a reference, as every operation holds what
 * it reads), asks the peer's POST /v1/fleet:receive (same token; every
 * refusal answered there before any byte moves), takes the daemon's
 * endpoint to the peer's fleet port (fleet_link.h: one UCP context and
 * worker for all copies, one endpoint per peer kept between copies; a new
 * one presents the receive's ticket first), reads the version in chunks
 * into host memory and sends each as an active message naming the receive
 * (progress in bytes), flushes, and commits the receive, which publishes
 * the array there. An array of at most TS_FLEET_RECV_INLINE_MAX bytes goes
 * with its receive request instead (one HTTP call, no endpoint), except in
 * a broadcast without "partial_ok", which must publish everywhere or
 * nowhere. A :put then deletes the source version (only that version: a
 * newer one stays). Any failure aborts the receive where the peer still
 * answers, names the peer, and leaves the source untouched.
 */
#ifndef TS_FLEET_XFER_H
#define TS_FLEET_XFER_H

#include "handlers/api.h"

struct ts_server;

/* Bytes read and written per chunk. */
#define TS_FLEET_XFER_CHUNK ((uint64_t)4 << 20)

/* The hook of ts_core.fleet_copy; cls is the server. NOT_FOUND for an
 * unknown host, UNAVAILABLE for an unreachable one, INVALID_ARGUMENT for
 * this node's own. */
ts_status ts_fleet_copy_submit(void *cls, struct ts_array *src,
                               const struct ts_fleet_copy_req *req, struct ts_operation **op,
                               struct ts_error *err);

/* The host part of an "http://host:port" URL into out (cap bytes). */
void ts__fleet_url_host(const char *url, char *out, size_t cap);

/* Aborts receive id at peer host (url) over HTTP, waiting 2 s at most for
 * its answer, which is not needed: a receive that ended already answers
 * 404. For a chain's hop whose forwarding failed, so that the next hop's
 * receive ends now, not at its deadline. */
void ts__fleet_abort_at(struct ts_server *srv, const char *host, const char *url, const char *id);

#endif
