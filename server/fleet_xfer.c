/*
 * fleet_xfer.c - the sending end of a cross-node copy (fleet_xfer.h).
 */
#include "server/fleet_xfer.h"

#include <curl/curl.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "common/lock.h"
#include "common/log.h"
#include "common/units.h"
#include "memory/buffer.h"
#include "server/fleet.h"
#include "server/fleet_link.h"
#include "server/fleet_recv.h"
#include "server/fleet_ucx.h"
#include "server/metrics.h"
#include "server/server_int.h"
#include "storage/array_io.h"

/* How long one HTTP call to the peer may take (the commit waits for the
 * peer's move, up to its --wait-limit, on top). */
#define HTTP_TIMEOUT_MS 10000L
#define COMMIT_TIMEOUT_MS 600000L

/* Largest answer the peer may give. */
#define ANSWER_MAX (1u << 20)

/* One destination: its peer, its receive, its endpoint and how far it got. */
/* Chunks in flight to each destination at once: a send of a rendezvous
 * size completes only once the peer has taken its bytes, so one at a time
 * left the link idle between chunks (a round trip each). */
#define XFER_INFLIGHT 4

struct dest {
	struct xfer *x;
	char host[128];
	char url[TS_CONFIG_PEER_URL_MAX + 1];
	/* the run's */
	char rid[64];                    /* the open receive there; "" when none */
	char ticket[TS_FLEET_TICKET_LEN];/* the receive's */
	struct ts_fleet_ep *e;           /* a reference to the endpoint there, or NULL */
	bool ep_bad;                     /* a UCX call on it failed or timed out: it goes */
	uint64_t deadline_ns;            /* its receive's end there */
	/* the sends in flight, one per chunk buffer (NULL: none), their
	 * headers (the chunk's offset, the receive's ticket) and their bytes */
	void *pending[XFER_INFLIGHT];
	struct ts_fleet_am_hdr hdr[XFER_INFLIGHT];
	uint64_t pending_n[XFER_INFLIGHT];
	uint64_t done;                   /* bytes sent there */
	bool dead;                       /* failed (err says why); the others go on */
	bool relayed;                    /* a chain's later hop: its bytes come from hop from */
	int from;                        /* that hop's index; -1: from the source */
	bool fwd_failed;                 /* its own forward to the next hop failed: fwd_err */
	struct ts_error fwd_err;
	bool published;
	struct ts_error err;
	json_t *rcv;                     /* its receive's answer */
	json_t *array;                   /* what it published */
};

struct xfer {
	struct ts_server *srv;
	struct ts_array *src;            /* own reference: the version copied */
	char etag[32];
	char *body;                      /* the receive's request (JSON text) */
	bool put;
	bool broadcast;                  /* "hosts": the result lists the destinations */
	bool partial_ok;
	uint64_t silence_ns;             /* --fleet-timeout: longest wait on a silent peer */
	struct ts_fleet_link *link;      /* the daemon's sending UCX (borrowed) */
	struct ts_mutex mu;              /* a relayed dest's done, which the hop
	                                  * poller writes while the run reads it */
	size_t n;
	struct dest d[];
};

/* The peer's HTTP status mapped back to ours. */
static ts_status from_http(long code)
{
	switch (code) {
	case 400: return TS_INVALID_ARGUMENT;
	case 404: return TS_NOT_FOUND;
	case 409: return TS_ALREADY_EXISTS;
	case 429: return TS_RESOURCE_EXHAUSTED;
	case 499: return TS_CANCELLED;
	case 504: return TS_DEADLINE_EXCEEDED;
	default: return TS_UNAVAILABLE;
	}
}

/* One HTTP call to a peer, while it runs. */
/* A peer to call: its host (named by errors), its URL, and this daemon
 * (its token, its pool of kept connections, --fleet-timeout). Borrowed
 * strings, kept for the call. */
struct peer {
	struct ts_server *srv;
	const char *host;
	const char *url;
};

/* One HTTP call to a peer. */
struct call {
	struct peer p;
	CURL *e;
	struct curl_slist *h;
	struct ts_fleet_body a;          /* max ANSWER_MAX */
	const char *path;
	long timeout_ms;
	unsigned int silence_ms;         /* --fleet-timeout */
	char url[TS_CONFIG_PEER_URL_MAX + 160];
	char auth[300];
	char ebuf[CURL_ERROR_SIZE];
};

static struct peer peer_of(const struct dest *d)
{
	return (struct peer){.srv = d->x->srv, .host = d->host, .url = d->url};
}

/* Each new connection to a peer: sent bytes left unacknowledged for
 * --fleet-timeout end it (TCP_USER_TIMEOUT), so a call on a kept connection
 * over a cut link fails then, as a new connection's connect would, instead
 * of at the call's own timeout. */
static int call_sockopt(void *cls, curl_socket_t fd, curlsocktype purpose)
{
	const struct call *c = cls;
	unsigned int ms = c->silence_ms;

	if (purpose == CURLSOCKTYPE_IPCXN && ms > 0)
		(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
	return CURL_SOCKOPT_OK;
}

/* Prepares POST url+path on an easy handle from the daemon's pool (a kept
 * connection to the peer when it has one), with n bytes of body (kept until
 * call_end): JSON when header is NULL, else raw bytes with header (one
 * "Name: value" line) beside them. */
static ts_status call_open(const struct peer *p, struct call *c, const char *path,
                           const char *header, const void *body, size_t n, long timeout_ms,
                           struct ts_error *err)
{
	struct ts_server *srv = p->srv;
	const char *lines[4];
	struct curl_slist *h;
	size_t k = 0;

	memset(c, 0, sizeof *c);
	c->p = *p;
	c->a.max = ANSWER_MAX;
	c->path = path;
	c->timeout_ms = timeout_ms;
	c->silence_ms = (unsigned int)srv->cfg.fleet_timeout * 1000u;
	snprintf(c->url, sizeof c->url, "%s%s", p->url, path);
	if (srv->token[0])
		snprintf(c->auth, sizeof c->auth, "Authorization: Bearer %s", srv->token);
	lines[k++] = header ? "Content-Type: application/octet-stream"
	                    : "Content-Type: application/json";
	if (header) {
		lines[k++] = "Expect:";   /* raw bytes go at once: no 100 Continue */
		lines[k++] = header;
	}
	if (c->auth[0])
		lines[k++] = c->auth;
	for (size_t i = 0; i < k; i++) {
		h = curl_slist_append(c->h, lines[i]);
		if (!h) {
			curl_slist_free_all(c->h);
			c->h = NULL;
			break;
		}
		c->h = h;
	}
	c->e = c->h ? ts_fleet_easy_take(srv->fleet) : NULL;
	if (!c->e) {
		curl_slist_free_all(c->h);
		c->h = NULL;
		return ts_error_oom(err, "no memory for a call to peer '%s'", p->host);
	}
	curl_easy_setopt(c->e, CURLOPT_URL, c->url);
	curl_easy_setopt(c->e, CURLOPT_POST, 1L);
	curl_easy_setopt(c->e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)n);
	curl_easy_setopt(c->e, CURLOPT_POSTFIELDS, n ? body : "");
	curl_easy_setopt(c->e, CURLOPT_HTTPHEADER, c->h);
	curl_easy_setopt(c->e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c->e, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(c->e, CURLOPT_CONNECTTIMEOUT_MS, HTTP_TIMEOUT_MS);
	curl_easy_setopt(c->e, CURLOPT_WRITEFUNCTION, ts_fleet_body_write);
	curl_easy_setopt(c->e, CURLOPT_WRITEDATA, &c->a);
	curl_easy_setopt(c->e, CURLOPT_ERRORBUFFER, c->ebuf);
	curl_easy_setopt(c->e, CURLOPT_PROXY, "");
	curl_easy_setopt(c->e, CURLOPT_SOCKOPTFUNCTION, call_sockopt);
	curl_easy_setopt(c->e, CURLOPT_SOCKOPTDATA, c);
	return TS_OK;
}

/* call_open with a JSON body (may be NULL: none). */
static ts_status call_start(const struct peer *p, struct call *c, const char *path,
                            const char *body, long timeout_ms, struct ts_error *err)
{
	return call_open(p, c, path, NULL, body, body ? strlen(body) : 0, timeout_ms, err);
}

/* The call ended with rc (curl_easy_perform's, or the multi handle's):
 * *out the JSON answer on a 2xx, else an error naming the peer (its own
 * error message when it gave one). Frees c's.
 * A kept connection the peer closed meanwhile (it restarted, or its idle
 * connection timed out) can fail as the request goes out, with nothing
 * answered: libcurl itself sends that request again over a new connection
 * ("Connection died, retrying a fresh connect"), as it_fleet's
 * test_kept_connection_dropped_is_called_again checks, so rc is never that
 * failure. */
static ts_status call_end(struct call *c, CURLcode rc, json_t **out, struct ts_error *err)
{
	const char *host = c->p.host;
	long code = 0;
	json_t *j = NULL;
	ts_status st = TS_OK;

	*out = NULL;
	if (rc == CURLE_OPERATION_TIMEDOUT) {
		st = ts_error_set(err, TS_DEADLINE_EXCEEDED, "PEER_SILENT",
		                  "peer '%s': POST %s: no answer in %ld ms", host, c->url,
		                  c->timeout_ms);
		goto out;
	}
	if (rc != CURLE_OK) {
		st = ts_error_set(err, TS_UNAVAILABLE, "PEER_UNAVAILABLE", "peer '%s': POST %s: %s",
		                  host, c->url, c->ebuf[0] ? c->ebuf : curl_easy_strerror(rc));
		goto out;
	}
	curl_easy_getinfo(c->e, CURLINFO_RESPONSE_CODE, &code);
	j = json_loadb(c->a.buf ? c->a.buf : "", c->a.len, 0, NULL);
	if (code < 200 || code > 299) {
		json_t *pe = json_object_get(j, "error");
		const char *msg = json_string_value(json_object_get(pe, "message"));

		st = ts_error_set(err, from_http(code), "PEER_REFUSED", "peer '%s' answered %ld to %s: %s",
		                  host, code, c->path, msg ? msg : "no message");
		goto out;
	}
	if (!json_is_object(j)) {
		st = ts_error_set(err, TS_UNAVAILABLE, "PEER_BAD_ANSWER",
		                  "peer '%s' did not answer %s with a JSON object", host, c->path);
		goto out;
	}
	*out = j;
	j = NULL;
out:
	json_decref(j);
	free(c->a.buf);
	curl_slist_free_all(c->h);
	/* kept with its connection when the peer answered in full */
	ts_fleet_easy_give(c->p.srv->fleet, c->e, rc == CURLE_OK);
	c->e = NULL;
	return st;
}

/* POST p's url+path with body (may be NULL) and waits for the answer
 * (call_end's). */
static ts_status peer_call(const struct peer *p, const char *path, const char *body,
                           long timeout_ms, json_t **out, struct ts_error *err)
{
	struct call c;

	*out = NULL;
	if (call_start(p, &c, path, body, timeout_ms, err) != TS_OK)
		return err->status;
	return call_end(&c, curl_easy_perform(c.e), out, err);
}

/* peer_call to d's peer. */
static ts_status call_peer(struct dest *d, const char *path, const char *body, long timeout_ms,
                           json_t **out, struct ts_error *err)
{
	struct peer p = peer_of(d);

	return peer_call(&p, path, body, timeout_ms, out, err);
}

/* GET url+path and waits for the answer (call_end's). */
static ts_status get_peer(struct dest *d, const char *path, long timeout_ms, json_t **out,
                          struct ts_error *err)
{
	struct peer p = peer_of(d);
	struct call c;

	*out = NULL;
	if (call_start(&p, &c, path, NULL, timeout_ms, err) != TS_OK)
		return err->status;
	curl_easy_setopt(c.e, CURLOPT_HTTPGET, 1L);
	return call_end(&c, curl_easy_perform(c.e), out, err);
}

/* Drives req (a UCP request or an immediate status) of d's endpoint to its
 * end: TS_OK, or an error naming d's peer; DEADLINE_EXCEEDED when nothing
 * completes for --fleet-timeout (a silent peer) or past the receive's
 * deadline; CANCELLED when the operation is. */
static ts_status finish(struct dest *d, struct ts_operation *op, void *req, const char *what,
                        uint64_t deadline, struct ts_error *err)
{
	char peer[TS_CONFIG_PEER_URL_MAX + 160];
	bool silent;
	ucs_status_t s = ts_fleet_link_drive(d->x->link, d->e, req, deadline, d->x->silence_ns, NULL,
	                                     &silent);

	if (s == UCS_OK)
		return TS_OK;
	d->ep_bad = true;
	/* a cancel has waited for the send in flight (one chunk) */
	if (s == UCS_ERR_CANCELED && ts_operation_cancelled(op))
		return ts_error_set(err, TS_CANCELLED, "CANCELLED", "the copy to '%s' was cancelled",
		                    d->host);
	snprintf(peer, sizeof peer, "peer '%s' (%s)", d->host, d->url);
	return ts_fleet_link_error(s, silent, d->x->silence_ns, peer, what, err);
}

void ts__fleet_url_host(const char *url, char *out, size_t cap)
{
	const char *p = strstr(url, "://"), *end;

	p = p ? p + 3 : url;
	if (*p == '[') {
		p++;
		end = strchr(p, ']');
	} else {
		end = strrchr(p, ':');
	}
	if (!end)
		end = p + strlen(p);
	snprintf(out, cap, "%.*s", (int)(end - p), p);
}

/* d's endpoint to its peer's fleet port: the one the daemon keeps there,
 * or a new one, admitted by the receive's ticket (its first message). */
static ts_status ucx_open(struct dest *d, struct ts_operation *op, uint64_t deadline,
                          struct ts_error *err)
{
	struct ts_fleet_link *l = d->x->link;
	ucp_request_param_t p = {.op_attr_mask = 0};
	json_t *rcv = d->rcv;
	const char *ticket = json_string_value(json_object_get(rcv, "ticket"));
	const char *inst = json_string_value(json_object_get(rcv, "fleet_instance"));
	char host[128], port[16];
	void *req = NULL;
	bool fresh = false;
	ts_status st;

	if (!ticket || strlen(ticket) != TS_FLEET_TICKET_LEN)
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_BAD_ANSWER",
		                    "peer '%s' answered the receive without a ticket", d->host);
	memcpy(d->ticket, ticket, TS_FLEET_TICKET_LEN);
	ts__fleet_url_host(d->url, host, sizeof host);
	snprintf(port, sizeof port, "%lld",
	         (long long)json_integer_value(json_object_get(rcv, "fleet_port")));
	ts_fleet_link_lock(l);
	st = ts_fleet_link_ep_locked(l, d->host, host, port, inst ? strtoull(inst, NULL, 16) : 0,
	                             &d->e, &fresh, err);
	if (st == TS_OK && fresh)
		req = ucp_stream_send_nbx(ts_fleet_ep_ucp_locked(d->e), ticket, TS_FLEET_TICKET_LEN, &p);
	ts_fleet_link_unlock(l);
	if (st != TS_OK)
		return st;
	return finish(d, op, req, "sending the ticket", deadline, err);
}

/* Lets go of d's endpoint: kept for the next copy when it is well (its
 * sends flushed), dropped (closed, forced) when a call on it failed. */
static void ucx_close(struct dest *d, struct ts_operation *op)
{
	struct ts_fleet_link *l = d->x->link;
	ucp_request_param_t p = {.op_attr_mask = 0};
	struct ts_error ignore;
	void *req = NULL;

	if (!d->e)
		return;
	ts_error_clear(&ignore);
	ts_fleet_link_lock(l);
	/* nothing of this copy left in flight before its receive is aborted */
	if (!d->ep_bad && !ts_fleet_ep_failed_locked(d->e, NULL))
		req = ucp_ep_flush_nbx(ts_fleet_ep_ucp_locked(d->e), &p);
	ts_fleet_link_unlock(l);
	if (req)
		(void)finish(d, op, req, "flushing the sends", ts_now_ns() + d->x->silence_ns, &ignore);
	ts_fleet_link_lock(l);
	if (d->ep_bad || ts_fleet_ep_failed_locked(d->e, NULL))
		ts_fleet_ep_kill_locked(d->e);
	ts_fleet_ep_unref_locked(d->e);
	ts_fleet_link_unlock(l);
	d->e = NULL;
}

static void ucx_stop(struct xfer *x, struct ts_operation *op)
{
	for (size_t i = 0; i < x->n; i++)
		ucx_close(&x->d[i], op);
}

/* Waits for d's send in flight from slot s (ends it once the endpoint
 * failed or the deadline passed) until UCX lets go of its buffer. */
static void drop(struct dest *d, int s, uint64_t deadline)
{
	void *req = d->pending[s];
	bool silent;

	d->pending[s] = NULL;
	if (!UCS_PTR_IS_PTR(req))
		return;
	if (ts_fleet_link_drive(d->x->link, d->e, req, deadline, d->x->silence_ns, NULL, &silent) !=
	    UCS_OK)
		d->ep_bad = true;
}

static size_t live(const struct xfer *x)
{
	size_t n = 0;

	for (size_t i = 0; i < x->n; i++)
		n += !x->d[i].dead;
	return n;
}

/* d failed with e: the whole operation fails (TS_* returned, err set)
 * unless "partial_ok" lets the others go on (TS_OK, while any is left). */
static ts_status dest_failed(struct dest *d, const struct ts_error *e, struct ts_error *err)
{
	struct xfer *x = d->x;

	d->dead = true;
	d->err = *e;
	ts_log(TS_LOG_WARN, "\"event\":\"fleet_copy\",\"result\":\"failed\"",
	       "copy of array '%s' to peer '%s' failed: %s", ts_array_name(x->src), d->host,
	       e->message);
	if (x->partial_ok && e->status != TS_CANCELLED && live(x) > 0)
		return TS_OK;
	*err = *e;
	return err->status;
}

/* Each destination's host, bytes written, state and error, as the
 * operation's metadata "destinations" (a broadcast's). */
static void show_progress(struct xfer *x, struct ts_operation *op, const char *phase)
{
	json_t *list, *o;

	if (!x->broadcast)
		return;
	list = json_array();
	ts_mutex_lock(&x->mu);
	for (size_t i = 0; list && i < x->n; i++) {
		struct dest *d = &x->d[i];
		json_t *e = d->dead ? ts_error_to_json(&d->err, 0) : NULL;

		o = json_pack("{s:s, s:I, s:s}", "host", d->host, "bytes_done", (json_int_t)d->done,
		              "state", d->dead ? "failed" : d->published ? "published" : phase);
		if (o && e)
			json_object_set(o, "error", json_object_get(e, "error"));
		json_decref(e);
		json_array_append_new(list, o);
	}
	ts_mutex_unlock(&x->mu);
	o = list ? json_pack("{s:o}", "destinations", list) : NULL;
	if (o)
		ts_operation_set_details(op, o);
}

/* d's send in flight from slot s completed: counted, or d failed. */
static ts_status complete(struct dest *d, int s, struct ts_operation *op, struct ts_error *err)
{
	struct ts_error e;
	uint64_t n = d->pending_n[s];
	void *req = d->pending[s];

	ts_error_clear(&e);
	d->pending[s] = NULL;
	if (finish(d, op, req, "sending the bytes", d->deadline_ns, &e) != TS_OK)
		return dest_failed(d, &e, err);
	d->done += n;
	ts_operation_progress_add(op, n);
	ts_metrics_fleet_bytes(d->x->srv->metrics, true, n);
	return TS_OK;
}

static ts_status chain_status(struct dest *d, struct ts_operation *op, long wait_ms,
                              long timeout_ms, bool *complete, uint64_t *moved,
                              struct ts_error *err);

/* How often the source asks a chain's later hops for their bytes while it
 * sends to the head. */
#define HOP_POLL_NS (250 * 1000000ull)

/* While the source sends to a chain's head, a thread of its own asks each
 * later hop for its bytes so far every HOP_POLL_NS (its receive's state,
 * not waiting), so that the operation shows every destination's progress
 * as the bytes go, and a slow answer never holds up the sends. A failure
 * seen here is seen again, and acted on, once the source has sent
 * everything (chain_ready). */
struct hop_poller {
	struct xfer *x;
	struct ts_operation *op;
	struct ts_mutex mu;
	pthread_cond_t cv;               /* CLOCK_MONOTONIC */
	bool stop;
	bool started;
	pthread_t thread;
};

static void poll_hops(struct xfer *x, struct ts_operation *op)
{
	for (size_t k = 0; k < x->n; k++) {
		struct dest *d = &x->d[k];
		struct ts_error e;
		uint64_t moved;
		bool complete;

		if (!d->relayed || d->dead || !d->rid[0])
			continue;
		ts_error_clear(&e);
		(void)chain_status(d, op, 0, HOP_POLL_NS / 1000000u, &complete, &moved, &e);
	}
}

static void *hop_poller_main(void *arg)
{
	struct hop_poller *hp = arg;
	struct timespec until;

	ts_mutex_lock(&hp->mu);
	while (!hp->stop) {
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += (long)HOP_POLL_NS;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		while (!hp->stop && ts_mutex_wait(&hp->mu, &hp->cv, &until) != ETIMEDOUT)
			;
		if (hp->stop)
			break;
		ts_mutex_unlock(&hp->mu);
		poll_hops(hp->x, hp->op);   /* the run's next show_progress shows it */
		ts_mutex_lock(&hp->mu);
	}
	ts_mutex_unlock(&hp->mu);
	return NULL;
}

/* Starts hp's thread for x's chain (x->n > 1; without a thread, progress
 * shows the later hops' bytes only at the end). */
static void hop_poller_start(struct hop_poller *hp, struct xfer *x, struct ts_operation *op)
{
	pthread_condattr_t ca;

	memset(hp, 0, sizeof *hp);
	hp->x = x;
	hp->op = op;
	if (x->n < 2 || pthread_condattr_init(&ca) != 0)
		return;
	ts_mutex_init(&hp->mu);
	if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
	    pthread_cond_init(&hp->cv, &ca) == 0) {
		hp->started = pthread_create(&hp->thread, NULL, hop_poller_main, hp) == 0;
		if (!hp->started)
			pthread_cond_destroy(&hp->cv);
	}
	pthread_condattr_destroy(&ca);
	if (!hp->started)
		ts_mutex_destroy(&hp->mu);
}

/* Stops hp's thread (its call in flight, if any, ends first: at most
 * HOP_POLL_NS). */
static void hop_poller_stop(struct hop_poller *hp)
{
	if (!hp->started)
		return;
	ts_mutex_lock(&hp->mu);
	hp->stop = true;
	pthread_cond_signal(&hp->cv);
	ts_mutex_unlock(&hp->mu);
	pthread_join(hp->thread, NULL);
	pthread_cond_destroy(&hp->cv);
	ts_mutex_destroy(&hp->mu);
	hp->started = false;
}

/* The version's bytes when they are one host-visible buffer (the operation
 * holds the version: they cannot change or go while a send reads them),
 * else NULL: they are read into memory of the sender's. */
static const unsigned char *host_bytes(const struct ts_array *a)
{
	struct ts_buffer *whole = ts_array_single_buffer(a);

	return whole && ts_buffer_host_visible(whole) ? ts_buffer_data(whole) : NULL;
}

/* Sends the version chunk by chunk to every live destination (an active
 * message: its offset, then the bytes, which the peer receives into its
 * staging memory), up to XFER_INFLIGHT chunks in flight, then flushes each.
 * A version in one host-visible buffer is sent from its own memory (the
 * operation holds it: it cannot change or go while the sends read it);
 * any other is read chunk by chunk (once) into XFER_INFLIGHT buffers, each
 * read again once its sends have completed. */
static ts_status send_bytes(struct xfer *x, struct ts_operation *op, struct ts_error *err)
{
	uint64_t total = ts_array_desc(x->src)->nbytes;
	uint64_t chunk = total < TS_FLEET_XFER_CHUNK ? total : TS_FLEET_XFER_CHUNK;
	uint64_t n;
	void *buf[XFER_INFLIGHT] = {0};
	const unsigned char *direct = host_bytes(x->src);
	ts_status st = TS_OK;
	size_t k;
	int s = 0;

	for (s = 0; s < XFER_INFLIGHT && !direct; s++)
		if (!(buf[s] = malloc(chunk + 1))) {
			for (s = 0; s < XFER_INFLIGHT; s++)
				free(buf[s]);
			return ts_error_oom(err, "no host memory to send array '%s'",
			                    ts_array_name(x->src));
		}
	s = 0;
	for (uint64_t done = 0; st == TS_OK && done < total;
	     done += n, s = (s + 1) % XFER_INFLIGHT) {
		struct ts_run run = {done, 0, 0};

		n = total - done < chunk ? total - done : chunk;
		run.len = n;
		if (ts_operation_cancelled(op))
			st = ts_error_set(err, TS_CANCELLED, "CANCELLED", "the copy to '%s' was cancelled",
			                  x->d[0].host);
		/* buf[s] is free once the sends that last read it are done */
		for (k = 0; st == TS_OK && k < x->n; k++)
			if (x->d[k].pending[s] && !x->d[k].dead)
				st = complete(&x->d[k], s, op, err);
			else if (x->d[k].pending[s])   /* a failed one's: UCX lets go first */
				drop(&x->d[k], s, x->d[k].deadline_ns);
		if (st == TS_OK && !direct)
			st = ts_array_read(x->srv->core.env.stager, x->src, &run, 1, buf[s], err);
		if (st != TS_OK)
			break;
		show_progress(x, op, "sending");
		for (k = 0; st == TS_OK && k < x->n; k++) {
			struct dest *d = &x->d[k];
			ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
			                         .flags = UCP_AM_SEND_FLAG_REPLY};
			ucp_ep_h ep;

			if (d->dead || d->relayed)
				continue;
			d->hdr[s].offset = done;
			memcpy(d->hdr[s].ticket, d->ticket, TS_FLEET_TICKET_LEN);
			ts_fleet_link_lock(x->link);
			ep = ts_fleet_ep_ucp_locked(d->e);
			d->pending[s] = ep ? ucp_am_send_nbx(ep, TS_FLEET_AM_DATA, &d->hdr[s],
			                                     sizeof d->hdr[s],
			                                     direct ? direct + done : buf[s], (size_t)n,
			                                     &p)
			                   : UCS_STATUS_PTR(UCS_ERR_NOT_CONNECTED);
			ts_fleet_link_unlock(x->link);
			d->pending_n[s] = n;
			if (!UCS_PTR_IS_PTR(d->pending[s]))   /* done at once, or failed at once */
				st = complete(d, s, op, err);
		}
	}
	for (k = 0; k < x->n; k++) {
		struct dest *d = &x->d[k];

		for (int j = 0; j < XFER_INFLIGHT; j++) {
			if (d->pending[j] && st == TS_OK && !d->dead)
				st = complete(d, j, op, err);
			else if (d->pending[j])
				drop(d, j, d->deadline_ns);
		}
	}
	for (s = 0; s < XFER_INFLIGHT; s++)
		free(buf[s]);
	for (k = 0; st == TS_OK && k < x->n; k++) {
		struct dest *d = &x->d[k];
		ucp_request_param_t p = {.op_attr_mask = 0};
		struct ts_error e;
		ucp_ep_h ep;
		void *req;

		if (d->dead || d->relayed)
			continue;
		ts_error_clear(&e);
		ts_fleet_link_lock(x->link);
		ep = ts_fleet_ep_ucp_locked(d->e);
		req = ep ? ucp_ep_flush_nbx(ep, &p) : UCS_STATUS_PTR(UCS_ERR_NOT_CONNECTED);
		ts_fleet_link_unlock(x->link);
		if (finish(d, op, req, "flushing the sends", d->deadline_ns, &e) != TS_OK)
			st = dest_failed(d, &e, err);
	}
	show_progress(x, op, "committing");
	return st;
}

/* Opens d's receive at its peer (every refusal answered there before any
 * byte moves). */
static ts_status open_receive(struct dest *d, const char *body, struct ts_error *err)
{
	struct xfer *x = d->x;
	ts_status st;

	st = call_peer(d, "/v1/fleet:receive", body, (long)(x->silence_ns / 1000000ull),
	               &d->rcv, err);
	if (st != TS_OK)
		return st;
	snprintf(d->rid, sizeof d->rid, "%s",
	         json_string_value(json_object_get(d->rcv, "id")) ?: "");
	d->deadline_ns = ts_now_ns() +
	                 (uint64_t)json_integer_value(json_object_get(d->rcv, "expires_in_seconds")) *
	                     1000000000ull;
	if ((uint64_t)json_integer_value(json_object_get(d->rcv, "length")) !=
	    ts_array_desc(x->src)->nbytes)
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_BAD_ANSWER",
		                    "peer '%s' staged %lld bytes for an array of %llu", d->host,
		                    (long long)json_integer_value(json_object_get(d->rcv, "length")),
		                    (unsigned long long)ts_array_desc(x->src)->nbytes);
	return TS_OK;
}

/* Commits every live destination's receive at once (each publishes the
 * array there; ?wait=true: each answer is the array) and waits for all. */
static ts_status commit_all(struct xfer *x, struct ts_error *err)
{
	struct call *calls = calloc(x->n, sizeof *calls);
	struct ts_error *errs = calloc(x->n, sizeof *errs);
	CURLcode *rcs = calloc(x->n, sizeof *rcs);
	char (*paths)[128] = calloc(x->n, sizeof *paths);
	CURLM *m = curl_multi_init();
	ts_status st = TS_OK;
	int running = 0, left;
	CURLMsg *msg;
	size_t i;

	if (!calls || !errs || !rcs || !paths || !m) {
		st = ts_error_oom(err, "no memory to commit a copy");
		goto out;
	}
	for (i = 0; i < x->n; i++) {
		struct dest *d = &x->d[i];

		ts_error_clear(&errs[i]);
		rcs[i] = CURLE_RECV_ERROR;   /* until its end is read */
		if (d->dead)
			continue;
		struct peer p = peer_of(d);

		snprintf(paths[i], sizeof paths[i], "/v1/fleet/receives/%s:commit?wait=true", d->rid);
		if (call_start(&p, &calls[i], paths[i], NULL, COMMIT_TIMEOUT_MS, &errs[i]) == TS_OK)
			curl_multi_add_handle(m, calls[i].e);
	}
	do {
		if (curl_multi_perform(m, &running) != CURLM_OK)
			break;
		if (running)
			curl_multi_poll(m, NULL, 0, 1000, NULL);
	} while (running);
	while ((msg = curl_multi_info_read(m, &left)))
		for (i = 0; msg->msg == CURLMSG_DONE && i < x->n; i++)
			if (calls[i].e == msg->easy_handle)
				rcs[i] = msg->data.result;
	for (i = 0; i < x->n; i++) {
		struct dest *d = &x->d[i];
		struct ts_error scratch;

		if (d->dead)
			continue;
		if (calls[i].e) {
			curl_multi_remove_handle(m, calls[i].e);
			(void)call_end(&calls[i], rcs[i], &d->array, &errs[i]);
		}
		d->rid[0] = '\0';   /* committed or failed there: nothing to abort */
		if (errs[i].status == TS_OK && !json_object_get(d->array, "etag"))
			ts_error_set(&errs[i], TS_DEADLINE_EXCEEDED, "PEER_SLOW",
			             "peer '%s' had not published '%s' when its wait ended", d->host,
			             json_string_value(json_object_get(d->rcv, "id")));
		if (errs[i].status == TS_OK) {
			d->published = true;
			continue;
		}
		ts_error_clear(&scratch);
		if (st == TS_OK)
			st = dest_failed(d, &errs[i], err);
		else
			(void)dest_failed(d, &errs[i], &scratch);
	}
out:
	if (m)
		curl_multi_cleanup(m);
	free(calls);
	free(errs);
	free(rcs);
	free(paths);
	return st;
}

/* The broadcast's result: the source's ETag, and each destination's
 * array or error ("failed": the hosts that failed, with "partial_ok"). */
static json_t *broadcast_result(struct xfer *x)
{
	json_t *list = json_array(), *failed = json_array(), *o;

	for (size_t i = 0; list && failed && i < x->n; i++) {
		struct dest *d = &x->d[i];

		if (d->published) {
			o = json_pack("{s:s, s:s, s:O}", "host", d->host, "state", "published", "array",
			              d->array);
		} else {
			json_t *e = ts_error_to_json(&d->err, 0);

			o = json_pack("{s:s, s:s, s:O?}", "host", d->host, "state", "failed", "error",
			              json_object_get(e, "error"));
			json_decref(e);
			json_array_append_new(failed, json_string(d->host));
		}
		json_array_append_new(list, o);
	}
	return json_pack("{s:s, s:o*, s:o*}", "source_etag", x->etag, "destinations", list,
	                 "failed_hosts", failed);
}

/* A small array (TS_FLEET_RECV_INLINE_MAX bytes at most): its bytes are the
 * body of each destination's receive request, the receive in a header
 * (fleet_recv.h), which the peer commits at once (one HTTP call a
 * destination, no endpoint); each answer is the array there. */
static ts_status send_inline(struct xfer *x, struct ts_operation *op, struct ts_error *err)
{
	uint64_t nbytes = ts_array_desc(x->src)->nbytes;
	struct ts_run run = {.src_offset = 0, .dst_offset = 0, .len = nbytes};
	const unsigned char *direct = host_bytes(x->src);
	unsigned char *copy = direct ? NULL : malloc(nbytes + 1);
	const unsigned char *bytes = direct ? direct : copy;
	size_t hlen = sizeof TS_FLEET_RECV_HEADER ": " + strlen(x->body);
	char *header = malloc(hlen);
	ts_status st = TS_OK;

	if ((!bytes && nbytes) || !header) {
		st = ts_error_oom(err, "no memory to send array '%s'", ts_array_name(x->src));
		goto out;
	}
	if (copy && nbytes &&
	    ts_array_read(x->srv->core.env.stager, x->src, &run, 1, copy, err) != TS_OK) {
		st = err->status;
		goto out;
	}
	snprintf(header, hlen, "%s: %s", TS_FLEET_RECV_HEADER, x->body);
	for (size_t i = 0; st == TS_OK && i < x->n; i++) {
		struct dest *d = &x->d[i];
		struct peer p = peer_of(d);
		struct ts_error e;
		struct call c;

		ts_error_clear(&e);
		if (call_open(&p, &c, "/v1/fleet:receive?wait=true", header, bytes, nbytes,
		              COMMIT_TIMEOUT_MS, &e) == TS_OK)
			(void)call_end(&c, curl_easy_perform(c.e), &d->array, &e);
		if (e.status == TS_OK && !json_object_get(d->array, "etag"))
			ts_error_set(&e, TS_DEADLINE_EXCEEDED, "PEER_SLOW",
			             "peer '%s' had not published '%s' when its wait ended", d->host,
			             ts_array_name(x->src));
		if (e.status != TS_OK) {
			st = dest_failed(d, &e, err);
			continue;
		}
		d->published = true;
		d->done = nbytes;
		ts_operation_progress_add(op, nbytes);
		ts_metrics_fleet_bytes(x->srv->metrics, true, nbytes);
	}
out:
	free(copy);
	free(header);
	return st;
}

/* ---- the chain: "hosts" sends to the first only, each hop forwards ------ */

/* Aborts receive id at peer p (best effort: its deadline ends it
 * otherwise; one that ended already answers 404). */
static void abort_at(const struct peer *p, const char *id)
{
	char path[128];
	json_t *j = NULL;
	struct ts_error e;

	snprintf(path, sizeof path, "/v1/fleet/receives/%s:abort", id);
	ts_error_clear(&e);
	(void)peer_call(p, path, NULL, 2000L, &j, &e);
	json_decref(j);
}

/* Aborts d's open receive there, if any. */
static void abort_receive(struct dest *d)
{
	struct peer p = peer_of(d);

	if (!d->rid[0])
		return;
	abort_at(&p, d->rid);
	d->rid[0] = '\0';
}

void ts__fleet_abort_at(struct ts_server *srv, const char *host, const char *url, const char *id)
{
	struct peer p = {.srv = srv, .host = host, .url = url};

	abort_at(&p, id);
}

/* The receive request for hop k: the copy's, naming its sender (the hop
 * before it in a chain, else this node) and, with n, asking it to forward
 * to n's receive. New string, or NULL when out of memory. */
static char *hop_body(struct xfer *x, size_t k, const struct dest *n, bool chained)
{
	json_t *body = json_loads(x->body, 0, NULL), *fwd = NULL;
	char *text = NULL;

	if (body && n)
		fwd = json_pack("{s:s, s:s, s:O?, s:O?, s:O?, s:O?}", "host", n->host, "id", n->rid,
		                "ticket", json_object_get(n->rcv, "ticket"), "fleet_port",
		                json_object_get(n->rcv, "fleet_port"), "fleet_instance",
		                json_object_get(n->rcv, "fleet_instance"), "expires_in_seconds",
		                json_object_get(n->rcv, "expires_in_seconds"));
	if (body && (!n || fwd)) {
		json_object_set_new(body, "source_host",
		                    json_string(chained && k > 0 ? x->d[k - 1].host
		                                                 : x->srv->core.host));
		if (fwd)
			json_object_set_new(body, "forward", fwd);
		text = json_dumps(body, JSON_COMPACT);
	}
	json_decref(body);
	return text;
}

/* A forwarding receive refused for what its forward needs (the hop does
 * not know the next as a peer, cannot reach it, or sends nothing), or the
 * hop itself unreachable: the broadcast may still go from this node. */
static bool forward_refused(ts_status st)
{
	return st == TS_NOT_FOUND || st == TS_UNAVAILABLE || st == TS_FAILED_PRECONDITION;
}

/*
 * Opens the receives from the last hop to the first, each asked to forward
 * to the next live one's receive (so every refusal, at any hop, comes
 * before any byte moves), then links the chain: the first live hop gets
 * the bytes from the source, each later one from the live one before it.
 * Where a hop cannot forward to the next (its peers are not the source's:
 * a fleet given by hand, each node's --peers naming only some), the
 * receives opened so far are aborted and every hop's is opened again
 * without forwarding: the source sends to each (a fan-out, whose cost is
 * the source's link carrying every copy).
 */
static ts_status open_chain(struct xfer *x, struct ts_error *err)
{
	ts_status st = TS_OK;
	int next = -1, prev = -1;
	bool chained = true;

	for (size_t k = x->n; st == TS_OK && k-- > 0;) {
		struct dest *d = &x->d[k];
		char *text = hop_body(x, k, chained && next >= 0 ? &x->d[next] : NULL, chained);
		struct ts_error e;

		ts_error_clear(&e);
		if (!text)
			ts_error_oom(&e, "no memory for a receive at peer '%s'", d->host);
		else
			(void)open_receive(d, text, &e);
		free(text);
		if (e.status != TS_OK && chained && next >= 0 && forward_refused(e.status)) {
			ts_log(TS_LOG_INFO, "\"event\":\"fleet_copy\",\"result\":\"fan_out\"",
			       "broadcast of array '%s': peer '%s' cannot forward to peer '%s' (%s); "
			       "sending to each from this node", ts_array_name(x->src), d->host,
			       x->d[next].host, e.message);
			for (size_t i = 0; i < x->n; i++) {
				abort_receive(&x->d[i]);
				json_decref(x->d[i].rcv);
				x->d[i].rcv = NULL;
				x->d[i].dead = false;
			}
			chained = false;
			next = -1;
			k = x->n;
			continue;
		}
		if (e.status != TS_OK)
			st = dest_failed(d, &e, err);
		else
			next = (int)k;
	}
	for (size_t k = 0; k < x->n; k++) {
		if (x->d[k].dead)
			continue;
		x->d[k].from = chained ? prev : -1;
		x->d[k].relayed = chained && prev >= 0;
		prev = (int)k;
	}
	return st;
}

/* d's bytes landed as its receive says (received): counted as progress. */
static void chain_done(struct dest *d, struct ts_operation *op, uint64_t received)
{
	ts_mutex_lock(&d->x->mu);
	if (received > d->done) {
		ts_operation_progress_add(op, received - d->done);
		d->done = received;
	}
	ts_mutex_unlock(&d->x->mu);
}

/* Why relayed d cannot get the rest of its bytes: the hop before it
 * failed, or its forward did. */
static void chain_broken(struct dest *d, struct ts_error *e)
{
	struct dest *up = &d->x->d[d->from];

	if (up->dead)
		ts_error_set(e, TS_UNAVAILABLE, "CHAIN_BROKEN",
		             "peer '%s' gets its bytes through peer '%s', which failed: %s", d->host,
		             up->host, up->err.message);
	else
		ts_error_set(e, up->fwd_err.status ? up->fwd_err.status : TS_UNAVAILABLE,
		             "FORWARD_FAILED", "peer '%s' could not forward to peer '%s': %s", up->host,
		             d->host, up->fwd_err.message);
}

/* The status a peer's error names (its "status"), UNAVAILABLE when none. */
static ts_status status_named(const char *name)
{
	for (int i = TS_CANCELLED; name && i <= TS_UNAUTHENTICATED; i++)
		if (strcmp(ts_status_name((ts_status)i), name) == 0)
			return (ts_status)i;
	return TS_UNAVAILABLE;
}

/* Asks d's receive where it stands, waiting up to wait_ms for it to be
 * complete, and for the answer timeout_ms beyond that: *complete, and its
 * forward's failure into d. */
static ts_status chain_status(struct dest *d, struct ts_operation *op, long wait_ms,
                              long timeout_ms, bool *complete, uint64_t *moved,
                              struct ts_error *err)
{
	char path[160];
	json_t *j = NULL, *f;
	const char *state;

	*complete = false;
	snprintf(path, sizeof path, "/v1/fleet/receives/%s?wait_ms=%ld", d->rid, wait_ms);
	if (get_peer(d, path, wait_ms + timeout_ms, &j, err) != TS_OK)
		return err->status;
	chain_done(d, op, (uint64_t)json_integer_value(json_object_get(j, "received")));
	*complete = json_is_true(json_object_get(j, "complete"));
	f = json_object_get(j, "forward");
	*moved = d->done + (uint64_t)json_integer_value(json_object_get(f, "bytes_done"));
	state = json_string_value(json_object_get(f, "state"));
	if (state && strcmp(state, "failed") == 0 && !d->fwd_failed) {
		json_t *e = json_object_get(f, "error");
		const char *msg = json_string_value(json_object_get(e, "message"));

		d->fwd_failed = true;
		ts_error_clear(&d->fwd_err);
		ts_error_set(&d->fwd_err, status_named(json_string_value(json_object_get(e, "status"))),
		             "FORWARD_FAILED", "%s", msg ? msg : "no message");
	}
	json_decref(j);
	return TS_OK;
}

/* Once the source has sent every byte to the chain's head: waits for each
 * live hop in turn to have every byte and, forwarding, to have forwarded
 * them (each progress is its receive's); a hop whose bytes stopped coming
 * (the one before it failed, or its forward) fails, and so does one silent
 * for --fleet-timeout. */
static ts_status chain_ready(struct xfer *x, struct ts_operation *op, struct ts_error *err)
{
	ts_status st = TS_OK;

	for (size_t k = 0; st == TS_OK && k < x->n; k++) {
		struct dest *d = &x->d[k];
		bool broken = d->relayed && (x->d[d->from].dead || x->d[d->from].fwd_failed);
		uint64_t last = 0, moved = 0, silent = ts_now_ns() + x->silence_ns;
		bool complete = false;
		struct ts_error e;

		if (d->dead)
			continue;
		ts_error_clear(&e);
		for (;;) {
			if (chain_status(d, op, broken ? 0 : 1000, HTTP_TIMEOUT_MS, &complete, &moved,
			                 &e) != TS_OK ||
			    complete)
				break;
			if (broken) {
				chain_broken(d, &e);
				break;
			}
			if (ts_operation_cancelled(op)) {
				ts_error_set(&e, TS_CANCELLED, "CANCELLED", "the copy to '%s' was cancelled",
				             d->host);
				break;
			}
			if (moved > last) {
				last = moved;
				silent = ts_now_ns() + x->silence_ns;
			} else if (ts_now_ns() >= silent) {
				ts_error_set(&e, TS_DEADLINE_EXCEEDED, "PEER_SILENT",
				             "peer '%s' (%s): no byte landed or forwarded in %llu s "
				             "(--fleet-timeout)", d->host, d->url,
				             (unsigned long long)(x->silence_ns / 1000000000ull));
				break;
			}
			show_progress(x, op, "sending");
		}
		if (e.status != TS_OK && broken && e.reason[0] && strcmp(e.reason, "CHAIN_BROKEN") &&
		    strcmp(e.reason, "FORWARD_FAILED"))
			chain_broken(d, &e);   /* what it says matters less than why */
		if (e.status != TS_OK)
			st = dest_failed(d, &e, err);
	}
	show_progress(x, op, "committing");
	return st;
}

/* After a failure: every hop still waiting for bytes through a failed one
 * is failed too, naming it (nothing is published anywhere). */
static void chain_unwind(struct xfer *x)
{
	for (size_t k = 0; k < x->n; k++) {
		struct dest *d = &x->d[k];

		if (!d->dead && d->relayed && (x->d[d->from].dead || x->d[d->from].fwd_failed)) {
			ts_error_clear(&d->err);
			chain_broken(d, &d->err);
			d->dead = true;
		}
	}
}

static ts_status xfer_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct xfer *x = arg;
	struct ts_error e;
	ts_status st = TS_OK;
	size_t i;

	show_progress(x, op, "receiving");
	/* a small array's bytes go with its request, unless a broadcast must
	 * publish on all destinations or none (one commit after all bytes) */
	if (ts_array_desc(x->src)->nbytes <= TS_FLEET_RECV_INLINE_MAX &&
	    (x->n == 1 || x->partial_ok)) {
		st = send_inline(x, op, err);
		goto done;
	}
	/* a broadcast goes along a chain: to the first host, which forwards */
	if (x->n > 1) {
		st = open_chain(x, err);
	} else {
		ts_error_clear(&e);
		if (open_receive(&x->d[0], x->body, &e) != TS_OK)
			st = dest_failed(&x->d[0], &e, err);
	}
	if (st == TS_OK) {
		for (i = 0; st == TS_OK && i < x->n; i++) {
			struct dest *d = &x->d[i];

			ts_error_clear(&e);
			if (!d->dead && !d->relayed && ucx_open(d, op, d->deadline_ns, &e) != TS_OK)
				st = dest_failed(d, &e, err);
		}
		if (st == TS_OK) {
			struct hop_poller hp;

			hop_poller_start(&hp, x, op);
			st = send_bytes(x, op, err);
			hop_poller_stop(&hp);
		}
	}
	ucx_stop(x, op);
	if (st == TS_OK && x->n > 1)
		st = chain_ready(x, op, err);
	if (st != TS_OK && x->n > 1)
		chain_unwind(x);
	/* the commits, all at once, when every destination has all its bytes */
	if (st == TS_OK)
		st = commit_all(x, err);
done:
	if (st == TS_OK && x->put) {
		struct ts_precondition same = {.if_match = x->etag};
		struct ts_error ignore;

		ts_error_clear(&ignore);
		(void)ts_catalog_delete(x->srv->core.env.catalog, ts_array_name(x->src), &same, &ignore);
	}
	if (st == TS_OK) {
		ts_operation_set_result(op, x->broadcast ? broadcast_result(x)
		                                         : json_pack("{s:s, s:s, s:O}", "host",
		                                                     x->d[0].host, "source_etag",
		                                                     x->etag, "array", x->d[0].array));
		for (i = 0; i < x->n; i++)
			if (x->d[i].published)
				ts_log(TS_LOG_INFO, "\"event\":\"fleet_copy\",\"result\":\"ok\"",
				       "array '%s' copied to peer '%s'", ts_array_name(x->src), x->d[i].host);
	}
	/* every receive neither committed nor failed there is aborted */
	for (i = 0; i < x->n; i++)
		abort_receive(&x->d[i]);
	if (st != TS_OK)
		ts_log(TS_LOG_WARN, "\"event\":\"fleet_copy\",\"result\":\"failed\"",
		       "copy of array '%s' to %s'%s'%s failed: %s", ts_array_name(x->src),
		       x->broadcast ? "peers " : "peer ", x->d[0].host,
		       x->n > 1 ? " and others" : "", err->message);
	show_progress(x, op, st == TS_OK ? "published" : "failed");
	return st;
}

static void xfer_release(void *arg)
{
	struct xfer *x = arg;

	for (size_t i = 0; i < x->n; i++) {
		json_decref(x->d[i].rcv);
		json_decref(x->d[i].array);
	}
	ts_array_unref(x->src);
	ts_mutex_destroy(&x->mu);
	free(x->body);
	free(x);
}

/* How long the peer keeps the receive: a minute, and a second more for
 * every 16 MiB (1 GiB in about two minutes at the slowest link assumed),
 * at most an hour. */
static uint64_t receive_ttl(uint64_t nbytes)
{
	uint64_t s = 60 + nbytes / (16u << 20);

	return s < 3600 ? s : 3600;
}

ts_status ts_fleet_copy_submit(void *cls, struct ts_array *src,
                               const struct ts_fleet_copy_req *req, struct ts_operation **op,
                               struct ts_error *err)
{
	struct ts_server *srv = cls;
	const struct ts_array_desc *d = ts_array_desc(src);
	const char *const *hosts = req->hosts ? req->hosts : &req->host;
	size_t n = req->hosts ? req->nhosts : 1;
	struct xfer *x;
	json_t *body, *shape;
	ts_status st;

	*op = NULL;
	for (size_t i = 0; i < n; i++)
		if (strcmp(hosts[i], srv->core.host) == 0)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_HOST",
			                    "host '%s' is this node: copy without \"host\"", hosts[i]);
	if (!srv->fleet_link)
		return ts_error_set(err, TS_FAILED_PRECONDITION, "NO_FLEET_PORT",
		                    "this daemon has no fleet port: it sends with --peers, "
		                    "--peers-dns or --fleet-port");
	x = calloc(1, sizeof *x + n * sizeof x->d[0]);
	if (!x)
		return ts_error_oom(err, "no memory for a copy to '%s'", hosts[0]);
	x->srv = srv;
	x->link = srv->fleet_link;
	x->put = req->put;
	x->broadcast = req->hosts != NULL;
	x->partial_ok = req->partial_ok;
	x->silence_ns = (uint64_t)srv->cfg.fleet_timeout * 1000000000ull;
	x->n = n;
	for (size_t i = 0; i < n; i++) {
		x->d[i].x = x;
		snprintf(x->d[i].host, sizeof x->d[i].host, "%s", hosts[i]);
		if (ts_fleet_peer(srv->fleet, hosts[i], x->d[i].url, sizeof x->d[i].url, err) !=
		    TS_OK) {
			free(x);
			return err->status;
		}
	}
	shape = json_array();
	for (int i = 0; shape && i < d->rank; i++)
		json_array_append_new(shape, json_integer((json_int_t)d->shape[i]));
	body = json_pack("{s:s, s:s, s:s, s:o, s:b, s:I, s:s}", "out", req->out, "dtype",
	                 req->dtype, "source_dtype", ts_dtype_name(d->dtype), "shape", shape,
	                 "overwrite", req->overwrite, "timeout_seconds",
	                 (json_int_t)receive_ttl(d->nbytes), "source_host", srv->core.host);
	if (body && req->placement)
		json_object_update(body, req->placement);
	/* ASCII: it goes as a header too (send_inline) */
	x->body = body ? json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
	json_decref(body);
	if (!x->body) {
		free(x);
		return ts_error_oom(err, "no memory for a copy to '%s'", hosts[0]);
	}
	x->src = ts_array_ref(src);
	ts_mutex_init(&x->mu);
	snprintf(x->etag, sizeof x->etag, "%s", ts_array_etag(src));
	st = ts_op_submit(srv->core.env.operations, req->put ? "put" : "copy", ts_array_name(src),
	                  d->nbytes * n, "bytes", xfer_run, x, xfer_release, op, err);
	if (st != TS_OK)
		xfer_release(x);
	return st;
}
