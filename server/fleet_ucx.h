/*
 * fleet_ucx.h - the fleet's data port: a UCX (UCP) listener on --fleet-port
 * over a TCP socket address, served by one progress thread, and the one-time
 * tickets that admit a peer's endpoint to it.
 *
 * An endpoint is accepted only after its first message (UCP stream, the
 * first TS_FLEET_TICKET_LEN bytes) is a ticket that this daemon issued by an
 * authenticated HTTP call (POST /v1/fleet:ticket) and that has neither been
 * used nor expired; the comparison runs in constant time over every live
 * ticket. Anything else - another ticket, a replayed one, too few bytes
 * before the deadline, an endpoint that fails first - is closed and counted
 * (tstage_fleet_ucx_connections_total{result="rejected"}, and a log line). A ticket is spent
 * by the first endpoint that presents it, whether or not that one stays.
 *
 * Thread-safety: ts_fleet_ucx_ticket and _port may run on any
 * threads at once; new and free on one. The UCP worker is the progress
 * thread's alone.
 */
#ifndef TS_FLEET_UCX_H
#define TS_FLEET_UCX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* A ticket's length on the wire and as text: 64 lowercase hex digits. */
#define TS_FLEET_TICKET_LEN 64

/* How long an issued ticket may wait for its endpoint. */
#define TS_FLEET_TICKET_TTL_S 30

/* The active message that carries a copy's bytes: its header is a struct
 * ts_fleet_am_hdr (the offset of its data in the array and the ticket of
 * the receive it belongs to); the data is eager or rendezvous, as UCX
 * picks. Sent with UCP_AM_SEND_FLAG_REPLY on an admitted endpoint. */
#define TS_FLEET_AM_DATA 1

/* One endpoint carries the bytes of any number of receives (a sender keeps
 * its endpoint to a peer for every copy there): each message names its
 * receive by that receive's ticket. The first message with a ticket spends
 * it and binds the receive to the endpoint; later ones are matched against
 * the endpoint's bound tickets (in constant time). A ticket neither bound
 * to the endpoint nor live closes the endpoint. */
struct ts_fleet_am_hdr {
	uint64_t offset;                  /* the sender's byte order */
	char ticket[TS_FLEET_TICKET_LEN];
};

struct ts_fleet_ucx;
struct ts_metrics;

struct ts_fleet_ucx_config {
	const char *bind;        /* the address to listen on (--bind) */
	int port;                /* the fleet port; 0: the kernel's choice */
	int hello_timeout_ms;    /* how long an endpoint may take to send its ticket */
	void (*tick)(void *cls); /* called by the progress thread at least every 100 ms;
	                          * may be NULL */
	void *tick_cls;
	/* The sink of the bytes that admitted endpoints send (TS_FLEET_AM_DATA),
	 * all called on the progress thread with tick_cls and the tag of the
	 * endpoint's ticket; NULL: every such message closes its endpoint.
	 * land: where [offset, offset + len) goes, NULL to refuse (the endpoint
	 * is closed); that memory must stay until landed is called for it.
	 * landed: those bytes, at dst (land's answer), arrived (ok) or not.
	 * failed: the endpoint of tag failed (the peer is gone or its link):
	 * peer is its address, why UCX's words (for each receive bound to
	 * it). */
	void *(*land)(void *cls, const void *tag, uint64_t offset, size_t len);
	void (*landed)(void *cls, const void *tag, void *dst, size_t len, bool ok);
	void (*failed)(void *cls, const void *tag, const char *peer, const char *why);
};

/* Reads UCX's configuration, makes the context, the worker and the listener,
 * and starts the progress thread: *out, or an error (FLEET_PORT when the
 * port cannot be bound, UCX when UCX cannot start). metrics (borrowed)
 * counts the endpoints. */
ts_status ts_fleet_ucx_new(const struct ts_fleet_ucx_config *cfg, struct ts_metrics *metrics,
                           struct ts_fleet_ucx **out, struct ts_error *err);

/* Stops the thread, closes every endpoint and the listener, and frees u;
 * NULL is fine. */
void ts_fleet_ucx_free(struct ts_fleet_ucx *u);

/* The port the listener is bound to. */
int ts_fleet_ucx_port(const struct ts_fleet_ucx *u);

/* Issues a one-time ticket into out[TS_FLEET_TICKET_LEN + 1] (NUL ended):
 * TS_OK, or RESOURCE_EXHAUSTED (reason TICKETS) when too many are live. */
ts_status ts_fleet_ucx_ticket(struct ts_fleet_ucx *u, char *out, struct ts_error *err);

/* ts_fleet_ucx_ticket for one purpose: the endpoint that spends it (as its
 * first message, or in a TS_FLEET_AM_DATA header) is bound to tag. */
ts_status ts_fleet_ucx_ticket_tagged(struct ts_fleet_ucx *u, const void *tag, char *out,
                                     struct ts_error *err);

/* Withdraws tag's ticket if unspent and unbinds tag from the endpoint that
 * spent it, so that no peer writes into what tag stands for any more (a
 * later message naming it closes its endpoint); an endpoint with bytes of
 * tag still landing is closed (forced) first. Once none of its bytes is
 * landing, done(arg) runs (done may be NULL) on the progress thread, or in
 * ts_fleet_ucx_free. Any thread. */
void ts_fleet_ucx_release(struct ts_fleet_ucx *u, const void *tag, void (*done)(void *arg),
                          void *arg);

/* This daemon's fleet port instance: a random number drawn at start, which
 * a sender compares to know that its endpoint still reaches the same
 * daemon (a peer restarted at the same address draws another). */
uint64_t ts_fleet_ucx_instance(const struct ts_fleet_ucx *u);

#endif
