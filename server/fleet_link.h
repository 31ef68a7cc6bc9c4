/*
 * fleet_link.h - the sending side's UCX: one UCP context and worker for
 * every cross-node copy this daemon sends (fleet_xfer.h), made at the first
 * copy and kept until the daemon stops, and its endpoints, one per peer
 * fleet port, kept between copies.
 *
 * An endpoint is made for a copy whose peer has none yet (that copy sends
 * its receive's ticket as the endpoint's first message, which admits it);
 * later copies to the same peer send on it, each message naming its
 * receive (fleet_ucx.h). An endpoint is dropped - closed, never handed out
 * again - when it fails (its error handler ran), when a copy on it fails
 * or times out (ts_fleet_ep_kill: whatever else is in flight on it ends,
 * cancelled), or when the peer's receive names another fleet instance than
 * the one it was made for (the peer restarted at the same address).
 *
 * Thread-safety: one lock (ts_fleet_link_lock) guards the worker, every
 * endpoint and the cache: every call into UCX on them, ucp_worker_progress
 * included, is made with it held, by whichever copy's thread holds it (the
 * worker is made UCS_THREAD_MODE_SERIALIZED); the endpoints' error handlers
 * run inside progress, so with it held too. new and free on one thread.
 */
#ifndef TS_FLEET_LINK_H
#define TS_FLEET_LINK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "common/status.h"

struct ts_fleet_link;
struct ts_fleet_ep;

/* A link with no UCX yet (made at the first ts_fleet_link_ep): *out, or
 * RESOURCE_EXHAUSTED. */
ts_status ts_fleet_link_new(struct ts_fleet_link **out, struct ts_error *err);

/* Closes every endpoint (forced) and frees l; no copy may be running. NULL
 * is fine. */
void ts_fleet_link_free(struct ts_fleet_link *l);

void ts_fleet_link_lock(struct ts_fleet_link *l);
void ts_fleet_link_unlock(struct ts_fleet_link *l);

/* The worker (lock held; NULL before the first endpoint was asked for). */
ucp_worker_h ts_fleet_link_worker_locked(struct ts_fleet_link *l);

/* An endpoint to the fleet port host:port of the peer instance (lock
 * held): a new reference to the one kept, when it is well and was made for
 * that instance, else a new one, kept (*fresh: the caller sends it the
 * ticket first). UNAVAILABLE (UCX, or PEER_FAILED naming peer) when UCX
 * cannot start or the endpoint cannot be made. */
ts_status ts_fleet_link_ep_locked(struct ts_fleet_link *l, const char *peer, const char *host,
                                  const char *port, uint64_t instance, struct ts_fleet_ep **out,
                                  bool *fresh, struct ts_error *err);

/* e's UCP endpoint, or NULL once it is closed (lock held). */
ucp_ep_h ts_fleet_ep_ucp_locked(const struct ts_fleet_ep *e);

/* Whether e failed (its handler ran, or it was killed), and UCX's status
 * (lock held). */
bool ts_fleet_ep_failed_locked(const struct ts_fleet_ep *e, ucs_status_t *why);

/* Drops e from the cache and closes it now, forced (lock held): every
 * request in flight on it, any copy's, completes cancelled. */
void ts_fleet_ep_kill_locked(struct ts_fleet_ep *e);

/* Waits for req (a UCP request on e; the lock NOT held) to end,
 * progressing the worker, until deadline, until e fails, or until *stop
 * (may be NULL) is set: its status; UCS_ERR_TIMED_OUT at the deadline or
 * on stop. A request that cannot end otherwise ends with e, which is
 * killed (every request on it, any copy's, completes cancelled). Frees
 * req. */
ucs_status_t ts_fleet_link_wait(struct ts_fleet_link *l, struct ts_fleet_ep *e, void *req,
                                uint64_t deadline, const _Atomic bool *stop);

/* Drives req (a UCP request on e, an immediate status as UCX returns one,
 * or NULL: done at once) to its end as ts_fleet_link_wait does, until
 * deadline or until silence_ns pass (the peer's allowance, --fleet-timeout),
 * whichever comes first; *silent tells the second. Its status. */
ucs_status_t ts_fleet_link_drive(struct ts_fleet_link *l, struct ts_fleet_ep *e, void *req,
                                 uint64_t deadline, uint64_t silence_ns,
                                 const _Atomic bool *stop, bool *silent);

/* The error of a request that ended with s (not UCS_OK): DEADLINE_EXCEEDED
 * PEER_SILENT when nothing completed for silence_ns (silent), else
 * PEER_FAILED, DEADLINE_EXCEEDED past the deadline and UNAVAILABLE
 * otherwise; the message is "PEER: WHAT: why" (peer names the peer, e.g.
 * "peer 'h2' (http://...)"). Returns its status. */
ts_status ts_fleet_link_error(ucs_status_t s, bool silent, uint64_t silence_ns,
                              const char *peer, const char *what, struct ts_error *err);

/* Drops the caller's reference (lock held); e is freed once it is out of
 * the cache and unreferenced. */
void ts_fleet_ep_unref_locked(struct ts_fleet_ep *e);

#endif
