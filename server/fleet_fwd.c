/*
 * fleet_fwd.c - a hop of a chained broadcast (fleet_fwd.h).
 *
 * Invariant: a segment is queued only once its bytes have landed; the
 * thread sends from the data only what it took from the queue, and holds
 * its endpoint reference until it ends (flushed and kept when well,
 * killed when a call on it failed or it was stopped).
 */
#include "server/fleet_fwd.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "common/lock.h"
#include "common/log.h"
#include "common/units.h"
#include "server/fleet.h"
#include "server/fleet_link.h"
#include "server/fleet_xfer.h"
#include "server/metrics.h"
#include "server/server_int.h"
#include "storage/array.h"

/* Sends in flight to the next node at once (as the source's, XFER_INFLIGHT). */
#define FWD_INFLIGHT 4

struct seg {
	uint64_t offset, len;
};

struct ts_fleet_fwd {
	struct ts_server *srv;
	struct ts_fleet_link *link;        /* the daemon's (borrowed) */
	struct ts_fleet_fwd_spec spec;     /* immutable */
	char what[TS_ARRAY_NAME_MAX + 1];  /* the array's name, for messages */
	const unsigned char *data;         /* borrowed; immutable */
	uint64_t length;
	uint64_t deadline_ns;              /* the next receive's end */
	uint64_t silence_ns;               /* --fleet-timeout */
	pthread_t thread;
	_Atomic bool stop;
	struct ts_mutex mu;
	pthread_cond_t cv;                 /* a segment queued, or stop */
	struct seg *q;                     /* guarded by: mu; landed, not yet taken */
	size_t qn, qcap;                   /* guarded by: mu */
	bool qfail;                        /* guarded by: mu; no memory to queue one */
	uint64_t done;                     /* guarded by: mu; bytes forwarded */
	bool over, failed;                 /* guarded by: mu */
	struct ts_error err;               /* guarded by: mu; when failed */
	/* the thread's own */
	struct ts_fleet_ep *e;
	void *pending[FWD_INFLIGHT];
	struct ts_fleet_am_hdr hdr[FWD_INFLIGHT];
	uint64_t pending_n[FWD_INFLIGHT];
};

ts_status ts_fleet_fwd_parse(struct ts_server *srv, json_t *fwd, struct ts_fleet_fwd_spec *spec,
                             struct ts_error *err)
{
	const char *host = NULL, *id = NULL, *ticket = NULL, *inst = NULL;
	json_int_t port = 0, ttl = 0;
	json_error_t jerr;

	memset(spec, 0, sizeof *spec);
	if (json_unpack_ex(fwd, &jerr, JSON_STRICT, "{s:s, s:s, s:s, s:I, s:s, s:I}", "host", &host,
	                   "id", &id, "ticket", &ticket, "fleet_port", &port, "fleet_instance",
	                   &inst, "expires_in_seconds", &ttl) != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"forward\" must be the next node's receive ({\"host\", \"id\", "
		                    "\"ticket\", \"fleet_port\", \"fleet_instance\", "
		                    "\"expires_in_seconds\"}): %s", jerr.text);
	if (strlen(ticket) != TS_FLEET_TICKET_LEN || strspn(ticket, "0123456789abcdef") !=
	                                                 TS_FLEET_TICKET_LEN)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"forward\".\"ticket\" must be 64 lowercase hex digits");
	if (port < 1 || port > 65535 || ttl < 1 || ttl > 3600 || strlen(id) >= sizeof spec->id ||
	    strlen(host) >= sizeof spec->host)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_REQUEST_BODY",
		                    "\"forward\": a port from 1 to 65535, a life from 1 to 3600 s, "
		                    "a host and id of at most 63 characters");
	if (strcmp(host, srv->core.host) == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_HOST",
		                    "\"forward\".\"host\" '%s' is this node", host);
	if (ts_fleet_peer(srv->fleet, host, spec->url, sizeof spec->url, err) != TS_OK)
		return err->status;
	snprintf(spec->host, sizeof spec->host, "%s", host);
	snprintf(spec->id, sizeof spec->id, "%s", id);
	memcpy(spec->ticket, ticket, TS_FLEET_TICKET_LEN + 1);
	snprintf(spec->port, sizeof spec->port, "%lld", (long long)port);
	spec->instance = strtoull(inst, NULL, 16);
	spec->ttl_s = (uint64_t)ttl;
	return TS_OK;
}

/* f failed with e: recorded (the first error) and logged; f is over. */
static void fail(struct ts_fleet_fwd *f, const struct ts_error *e)
{
	ts_mutex_lock(&f->mu);
	if (!f->failed) {
		f->failed = true;
		f->err = *e;
	}
	f->over = true;
	ts_mutex_unlock(&f->mu);
	ts_log(TS_LOG_WARN, "\"event\":\"fleet_forward\",\"result\":\"failed\"",
	       "forwarding array '%s' to peer '%s' failed: %s", f->what, f->spec.host, e->message);
}

/* Drives req to its end: TS_OK, or an error naming the next node. */
static ts_status finish(struct ts_fleet_fwd *f, void *req, const char *what,
                        struct ts_error *err)
{
	char peer[TS_CONFIG_PEER_URL_MAX + 160];
	bool silent;
	ucs_status_t s = ts_fleet_link_drive(f->link, f->e, req, f->deadline_ns, f->silence_ns,
	                                     &f->stop, &silent);

	if (s == UCS_OK)
		return TS_OK;
	if (atomic_load(&f->stop))
		return ts_error_set(err, TS_CANCELLED, "CANCELLED",
		                    "forwarding to peer '%s' stopped: the receive here ended",
		                    f->spec.host);
	snprintf(peer, sizeof peer, "forwarding to peer '%s' (%s)", f->spec.host, f->spec.url);
	return ts_fleet_link_error(s, silent, f->silence_ns, peer, what, err);
}

/* The next segment landed (true), or false at stop; waits up to 100 ms. */
static bool take(struct ts_fleet_fwd *f, struct seg *out, bool wait, bool *qfail)
{
	bool got = false;

	ts_mutex_lock(&f->mu);
	if (f->qn == 0 && wait && !atomic_load(&f->stop)) {
		struct timespec until;

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += 100000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		(void)ts_mutex_wait(&f->mu, &f->cv, &until);
	}
	if (f->qn > 0) {
		*out = f->q[0];
		memmove(f->q, f->q + 1, (f->qn - 1) * sizeof *f->q);
		f->qn--;
		got = true;
	}
	*qfail = f->qfail;
	ts_mutex_unlock(&f->mu);
	return got;
}

/* The send from slot s is over: counted, or an error. */
static ts_status complete(struct ts_fleet_fwd *f, int s, struct ts_error *err)
{
	void *req = f->pending[s];

	f->pending[s] = NULL;
	if (finish(f, req, "sending the bytes", err) != TS_OK)
		return err->status;
	ts_mutex_lock(&f->mu);
	f->done += f->pending_n[s];
	ts_mutex_unlock(&f->mu);
	ts_metrics_fleet_bytes(f->srv->metrics, true, f->pending_n[s]);
	return TS_OK;
}

/* The endpoint to the next node (a new one presents its ticket first). */
static ts_status connect_next(struct ts_fleet_fwd *f, struct ts_error *err)
{
	ucp_request_param_t p = {.op_attr_mask = 0};
	char host[128];
	void *req = NULL;
	bool fresh = false;
	ts_status st;

	ts__fleet_url_host(f->spec.url, host, sizeof host);
	ts_fleet_link_lock(f->link);
	st = ts_fleet_link_ep_locked(f->link, f->spec.host, host, f->spec.port, f->spec.instance,
	                             &f->e, &fresh, err);
	if (st == TS_OK && fresh)
		req = ucp_stream_send_nbx(ts_fleet_ep_ucp_locked(f->e), f->spec.ticket,
		                          TS_FLEET_TICKET_LEN, &p);
	ts_fleet_link_unlock(f->link);
	if (st != TS_OK)
		return st;
	return finish(f, req, "sending the ticket", err);
}

/* Sends each landed segment on, FWD_INFLIGHT at most in flight, until every
 * byte is sent; then flushes. */
static ts_status forward(struct ts_fleet_fwd *f, struct ts_error *err)
{
	uint64_t issued = 0;
	ts_status st = TS_OK;
	int s = 0;

	while (st == TS_OK && issued < f->length) {
		ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
		                         .flags = UCP_AM_SEND_FLAG_REPLY};
		struct seg g;
		bool qfail, any = false;
		int j;

		for (j = 0; j < FWD_INFLIGHT; j++)
			any |= f->pending[(s + j) % FWD_INFLIGHT] != NULL;
		if (!take(f, &g, !any, &qfail)) {
			if (atomic_load(&f->stop))
				return finish(f, UCS_STATUS_PTR(UCS_ERR_CANCELED), "waiting", err);
			if (qfail)
				return ts_error_oom(err, "no memory to forward array '%s' to peer '%s'",
				                    f->what, f->spec.host);
			/* nothing landed: the oldest send in flight, if any */
			for (j = 0; j < FWD_INFLIGHT && !f->pending[(s + j) % FWD_INFLIGHT]; j++)
				;
			if (j < FWD_INFLIGHT)
				st = complete(f, (s + j) % FWD_INFLIGHT, err);
			continue;
		}
		if (f->pending[s] && complete(f, s, err) != TS_OK)
			return err->status;
		f->hdr[s].offset = g.offset;
		memcpy(f->hdr[s].ticket, f->spec.ticket, TS_FLEET_TICKET_LEN);
		f->pending_n[s] = g.len;
		ts_fleet_link_lock(f->link);
		f->pending[s] = ts_fleet_ep_ucp_locked(f->e)
		                    ? ucp_am_send_nbx(ts_fleet_ep_ucp_locked(f->e), TS_FLEET_AM_DATA,
		                                      &f->hdr[s], sizeof f->hdr[s],
		                                      f->data + g.offset, (size_t)g.len, &p)
		                    : UCS_STATUS_PTR(UCS_ERR_NOT_CONNECTED);
		ts_fleet_link_unlock(f->link);
		issued += g.len;
		if (!UCS_PTR_IS_PTR(f->pending[s]))
			st = complete(f, s, err);
		s = (s + 1) % FWD_INFLIGHT;
	}
	for (int j = 0; j < FWD_INFLIGHT; j++)
		if (f->pending[j] && st == TS_OK)
			st = complete(f, j, err);
	if (st == TS_OK) {
		ucp_request_param_t p = {.op_attr_mask = 0};
		void *req;

		ts_fleet_link_lock(f->link);
		req = ts_fleet_ep_ucp_locked(f->e) ? ucp_ep_flush_nbx(ts_fleet_ep_ucp_locked(f->e), &p)
		                                   : UCS_STATUS_PTR(UCS_ERR_NOT_CONNECTED);
		ts_fleet_link_unlock(f->link);
		st = finish(f, req, "flushing the sends", err);
	}
	return st;
}

static void *fwd_main(void *arg)
{
	struct ts_fleet_fwd *f = arg;
	struct ts_error err;
	ts_status st;

	ts_error_clear(&err);
	st = connect_next(f, &err);
	if (st == TS_OK)
		st = forward(f, &err);
	/* whatever is still in flight (a failure's) ends with the endpoint */
	for (int j = 0; j < FWD_INFLIGHT; j++) {
		void *req = f->pending[j];

		f->pending[j] = NULL;
		if (UCS_PTR_IS_PTR(req)) {
			atomic_store(&f->stop, true);
			(void)ts_fleet_link_wait(f->link, f->e, req, 0, &f->stop);
		}
	}
	if (f->e) {
		ts_fleet_link_lock(f->link);
		if (st != TS_OK)
			ts_fleet_ep_kill_locked(f->e);   /* the next receive ends at once there */
		ts_fleet_ep_unref_locked(f->e);
		ts_fleet_link_unlock(f->link);
		f->e = NULL;
	}
	if (st != TS_OK) {
		fail(f, &err);
		/* the next receive ends now, not at its deadline: it may never
		 * have been bound to the endpoint killed above (a kept one, before
		 * the first chunk), and the sender that opened it may be gone */
		ts__fleet_abort_at(f->srv, f->spec.host, f->spec.url, f->spec.id);
	} else {
		ts_mutex_lock(&f->mu);
		f->over = true;
		ts_mutex_unlock(&f->mu);
		ts_log(TS_LOG_INFO, "\"event\":\"fleet_forward\",\"result\":\"ok\"",
		       "array '%s' forwarded to peer '%s' (%llu bytes)", f->what, f->spec.host,
		       (unsigned long long)f->length);
	}
	return NULL;
}

ts_status ts_fleet_fwd_start(struct ts_server *srv, const struct ts_fleet_fwd_spec *spec,
                             const char *what, const unsigned char *data, uint64_t length,
                             struct ts_fleet_fwd **out, struct ts_error *err)
{
	struct ts_fleet_fwd *f;
	pthread_condattr_t ca;

	*out = NULL;
	if (!srv->fleet_link)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "NO_FLEET_PORT",
		                    "this daemon sends nothing (no --peers or --peers-dns): it cannot "
		                    "forward to '%s'", spec->host);
	f = calloc(1, sizeof *f);
	if (!f || ts_mutex_init(&f->mu) != 0) {
		free(f);
		return ts_error_oom(err, "no memory to forward to '%s'", spec->host);
	}
	if (pthread_condattr_init(&ca) != 0 || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
	    pthread_cond_init(&f->cv, &ca) != 0) {
		ts_mutex_destroy(&f->mu);
		free(f);
		return ts_error_oom(err, "no memory to forward to '%s'", spec->host);
	}
	pthread_condattr_destroy(&ca);
	f->srv = srv;
	f->link = srv->fleet_link;
	f->spec = *spec;
	snprintf(f->what, sizeof f->what, "%s", what);
	f->data = data;
	f->length = length;
	f->deadline_ns = ts_now_ns() + spec->ttl_s * 1000000000ull;
	f->silence_ns = (uint64_t)srv->cfg.fleet_timeout * 1000000000ull;
	if (pthread_create(&f->thread, NULL, fwd_main, f) != 0) {
		pthread_cond_destroy(&f->cv);
		ts_mutex_destroy(&f->mu);
		free(f);
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "THREADS",
		                    "no thread to forward to '%s'", spec->host);
	}
	*out = f;
	return TS_OK;
}

void ts_fleet_fwd_landed(struct ts_fleet_fwd *f, uint64_t offset, uint64_t len)
{
	ts_mutex_lock(&f->mu);
	if (f->qn == f->qcap) {
		size_t cap = f->qcap ? 2 * f->qcap : 16;
		struct seg *q = realloc(f->q, cap * sizeof *q);

		if (!q) {
			f->qfail = true;
			goto out;
		}
		f->q = q;
		f->qcap = cap;
	}
	f->q[f->qn++] = (struct seg){offset, len};
out:
	pthread_cond_signal(&f->cv);
	ts_mutex_unlock(&f->mu);
}

void ts_fleet_fwd_state(struct ts_fleet_fwd *f, uint64_t *done, bool *over, bool *failed,
                        struct ts_error *err)
{
	ts_mutex_lock(&f->mu);
	*done = f->done;
	*over = f->over;
	*failed = f->failed;
	if (f->failed && err)
		*err = f->err;
	ts_mutex_unlock(&f->mu);
}

const char *ts_fleet_fwd_host(const struct ts_fleet_fwd *f)
{
	return f->spec.host;
}

void ts_fleet_fwd_free(struct ts_fleet_fwd *f)
{
	if (!f)
		return;
	ts_mutex_lock(&f->mu);
	atomic_store(&f->stop, true);
	pthread_cond_signal(&f->cv);
	ts_mutex_unlock(&f->mu);
	pthread_join(f->thread, NULL);
	pthread_cond_destroy(&f->cv);
	ts_mutex_destroy(&f->mu);
	free(f->q);
	free(f);
}
