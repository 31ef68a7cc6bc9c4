/*
 * fleet_ucx.c - the fleet's data port: a UCP listener on --fleet-port, one
 * progress thread that owns the worker and every endpoint, and the one-time
 * tickets that admit an endpoint (fleet_ucx.h).
 *
 * Invariants: only the progress thread calls into the worker (the others
 * only ucp_worker_signal it); an endpoint is in the HELLO state until its
 * ticket is checked, and a connection object lives until its endpoint's
 * close, its ticket receive and every receive of its data have completed
 * (UCX calls back into it, and writes into the sink's memory, until then).
 *
 * Bytes arrive as active messages (TS_FLEET_AM_DATA), never as remote
 * writes: UCX 1.13 serves a remote write over TCP (software RMA) by
 * answering it from inside its own handler, and aborts the process when
 * that answer cannot be sent because the peer has just died. An active
 * message's receive is a request of ours that UCX completes with an error
 * when the endpoint fails.
 */
#include "server/fleet_ucx.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include "common/lock.h"
#include "common/log.h"
#include "common/units.h"
#include "server/metrics.h"

/* Most tickets issued and not yet spent or expired. */
#define TICKETS_MAX 256

/* Most endpoints waiting for their ticket; more are rejected at once. */
#define HELLO_MAX 256

/* The progress thread's longest sleep (it checks deadlines and stop). */
#define SLEEP_MS 100

/* How long the thread waits, at stop, for endpoints to close. */
#define CLOSE_WAIT_NS (2ull * 1000000000ull)

/* Most receives bound to one endpoint at once (a daemon opens at most
 * TS_FLEET_RECV_MAX, 64). */
#define BINDS_MAX 64

struct ticket {
	char hex[TS_FLEET_TICKET_LEN];
	uint64_t expires_ns;             /* 0: free */
	const void *tag;                 /* given to the endpoint that spends it; may be NULL */
};

/* A ts_fleet_ucx_release asked for: closing the endpoints of tag, then done. */
struct release {
	struct release *next;
	const void *tag;
	void (*done)(void *arg);
	void *arg;
	bool closing;                    /* the progress thread has closed them */
};

enum conn_state { C_HELLO, C_OPEN, C_CLOSING };

/* A receive bound to an endpoint: the tag its ticket was issued for, the
 * ticket, and its bytes still landing. */
struct bind {
	const void *tag;
	char hex[TS_FLEET_TICKET_LEN];
	int landing;
	bool used;
};

struct conn {
	struct conn *next;
	struct ts_fleet_ucx *u;
	ucp_ep_h ep;
	enum conn_state state;
	char peer[64];                   /* the client's address, for logs */
	char hello[TS_FLEET_TICKET_LEN];
	uint64_t deadline_ns;            /* for the ticket */
	bool recv_pending;               /* the ticket's receive has not completed */
	bool hello_done;                 /* it completed with every byte */
	bool failed;                     /* the endpoint or the receive failed */
	void *close_req;                 /* the close in flight; NULL when done */
	ucs_status_t why;                /* the endpoint's failure */
	int landing;                     /* its data receives in flight */
	bool counted_open;
	struct bind binds[BINDS_MAX];    /* the receives it carries */
};

struct ts_fleet_ucx {
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_listener_h listener;
	int efd;                         /* the worker's event fd; immutable */
	int port;                        /* immutable after new */
	uint64_t hello_timeout_ns;       /* immutable */
	struct ts_metrics *metrics;      /* borrowed */
	void (*tick)(void *cls);         /* immutable; may be NULL */
	void *tick_cls;
	void *(*land)(void *cls, const void *tag, uint64_t offset, size_t len);   /* immutable */
	void (*landed)(void *cls, const void *tag, void *dst, size_t len, bool ok); /* immutable */
	void (*failed)(void *cls, const void *tag, const char *peer, const char *why);
	struct conn *conns;              /* the progress thread's */
	int nhello;                      /* the progress thread's */
	struct ts_mutex mu;
	struct ticket tickets[TICKETS_MAX];   /* guarded by: mu */
	struct release *releases;        /* guarded by: mu; the progress thread's to run */
	_Atomic bool stop;
	pthread_t thread;
	bool started;
	uint64_t instance;               /* immutable after new */
};

static void log_conn(const struct conn *c, const char *result, const char *why)
{
	char fields[200];

	snprintf(fields, sizeof fields, "\"event\":\"fleet_ucx\",\"peer\":\"%s\",\"result\":\"%s\"",
	         c->peer, result);
	ts_log(strcmp(result, "accepted") == 0 ? TS_LOG_INFO : TS_LOG_WARN, fields,
	       "fleet endpoint from %s %s%s%s", c->peer, result, why ? ": " : "", why ? why : "");
}

/* Nonzero unless a and b (TS_FLEET_TICKET_LEN bytes each) are equal; the
 * time taken does not depend on where they differ. */
static unsigned ct_differ(const char *a, const char *b)
{
	unsigned d = 0;

	for (size_t i = 0; i < TS_FLEET_TICKET_LEN; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)b[i];
	return d;
}

/* Spends the live ticket equal to got, if any: true when there was one.
 * Every slot is compared whole, live or not. */
static bool ticket_spend(struct ts_fleet_ucx *u, const char *got, const void **tag)
{
	uint64_t now = ts_now_ns();
	int found = -1;

	ts_mutex_lock(&u->mu);
	for (int i = 0; i < TICKETS_MAX; i++) {
		struct ticket *t = &u->tickets[i];
		unsigned bad = ct_differ(t->hex, got) | (t->expires_ns <= now);

		found = bad ? found : i;
	}
	if (found >= 0) {
		u->tickets[found].expires_ns = 0;
		*tag = u->tickets[found].tag;
	}
	ts_mutex_unlock(&u->mu);
	return found >= 0;
}

ts_status ts_fleet_ucx_ticket(struct ts_fleet_ucx *u, char *out, struct ts_error *err)
{
	return ts_fleet_ucx_ticket_tagged(u, NULL, out, err);
}

ts_status ts_fleet_ucx_ticket_tagged(struct ts_fleet_ucx *u, const void *tag, char *out,
                                     struct ts_error *err)
{
	static const char digits[] = "0123456789abcdef";
	unsigned char rnd[TS_FLEET_TICKET_LEN / 2];
	uint64_t now = ts_now_ns();
	struct ticket *slot = NULL;

	if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
		return ts_error_set(err, TS_INTERNAL, "RANDOM", "no random bytes for a ticket");
	for (size_t i = 0; i < sizeof rnd; i++) {
		out[2 * i] = digits[rnd[i] >> 4];
		out[2 * i + 1] = digits[rnd[i] & 15];
	}
	out[TS_FLEET_TICKET_LEN] = '\0';
	ts_mutex_lock(&u->mu);
	for (int i = 0; i < TICKETS_MAX && !slot; i++)
		if (u->tickets[i].expires_ns <= now)
			slot = &u->tickets[i];
	if (slot) {
		memcpy(slot->hex, out, TS_FLEET_TICKET_LEN);
		slot->tag = tag;
		slot->expires_ns = now + (uint64_t)TS_FLEET_TICKET_TTL_S * 1000000000ull;
	}
	ts_mutex_unlock(&u->mu);
	if (!slot)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "TICKETS",
		                    "%d fleet tickets are waiting for their endpoints already",
		                    TICKETS_MAX);
	return TS_OK;
}

int ts_fleet_ucx_port(const struct ts_fleet_ucx *u)
{
	return u->port;
}

uint64_t ts_fleet_ucx_instance(const struct ts_fleet_ucx *u)
{
	return u->instance;
}

static void hello_done_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
	struct conn *c = user_data;

	c->recv_pending = false;
	if (status == UCS_OK && length == TS_FLEET_TICKET_LEN)
		c->hello_done = true;
	else
		c->failed = true;
	ucp_request_free(request);
}

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct conn *c = arg;

	(void)ep;
	if (!c->failed)
		c->why = status;
	c->failed = true;
}

/* Starts closing c's endpoint (forced: whatever is in flight is cancelled). */
static void conn_close(struct conn *c)
{
	ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
	                         .flags = UCP_EP_CLOSE_FLAG_FORCE};
	void *req;

	if (c->state == C_CLOSING)
		return;
	if (c->state == C_HELLO)
		c->u->nhello--;
	if (c->counted_open)
		ts_metrics_fleet_ucx_open(c->u->metrics, -1);
	c->counted_open = false;
	c->state = C_CLOSING;
	req = ucp_ep_close_nbx(c->ep, &p);
	c->close_req = UCS_PTR_IS_PTR(req) ? req : NULL;
}

static void reject(struct conn *c, const char *why)
{
	ts_metrics_fleet_ucx_conn(c->u->metrics, false);
	log_conn(c, "rejected", why);
	conn_close(c);
}

/* c's binding of the ticket hex, or NULL; every slot is compared whole. */
static struct bind *bind_find(struct conn *c, const char *hex)
{
	struct bind *found = NULL;

	for (int i = 0; i < BINDS_MAX; i++) {
		struct bind *b = &c->binds[i];
		unsigned bad = ct_differ(b->hex, hex) | !b->used;

		found = bad ? found : b;
	}
	return found;
}

/* Spends the live ticket hex and binds its tag to c: the binding, or NULL
 * when no such ticket is live or c carries BINDS_MAX receives already. */
static struct bind *bind_spend(struct conn *c, const char *hex)
{
	struct bind *b = NULL;
	const void *tag = NULL;

	for (int i = 0; i < BINDS_MAX && !b; i++)
		if (!c->binds[i].used)
			b = &c->binds[i];
	if (!b || !ticket_spend(c->u, hex, &tag))
		return NULL;
	*b = (struct bind){.tag = tag, .used = true};
	memcpy(b->hex, hex, TS_FLEET_TICKET_LEN);
	return b;
}

/* Checks the ticket hex that c sent first (its hello, or the header of its
 * first message): admitted (C_OPEN, the ticket's receive bound) or rejected. */
static void admit(struct conn *c, const char *hex)
{
	if (bind_spend(c, hex)) {
		c->state = C_OPEN;
		c->u->nhello--;
		ts_metrics_fleet_ucx_conn(c->u->metrics, true);
		ts_metrics_fleet_ucx_open(c->u->metrics, 1);
		c->counted_open = true;
		log_conn(c, "accepted", NULL);
	} else {
		reject(c, "its first message is not a live ticket");
	}
}

/* Moves c on after progress: a ticket that came is checked, a failure or a
 * passed deadline rejects, an open endpoint that failed is closed. Returns
 * whether c may be freed. */
static bool conn_step(struct conn *c, uint64_t now)
{
	switch (c->state) {
	case C_HELLO:
		if (c->hello_done) {
			admit(c, c->hello);
		} else if (c->failed) {
			reject(c, "it failed before sending a ticket");
		} else if (now >= c->deadline_ns) {
			reject(c, "no ticket in time");
		}
		break;
	case C_OPEN:
		if (c->failed) {
			log_conn(c, "closed", c->why != UCS_OK ? ucs_status_string(c->why) : NULL);
			for (int i = 0; i < BINDS_MAX && c->why != UCS_OK && c->u->failed; i++)
				if (c->binds[i].used)
					c->u->failed(c->u->tick_cls, c->binds[i].tag, c->peer,
					             ucs_status_string(c->why));
			conn_close(c);
		}
		break;
	case C_CLOSING:
		break;
	}
	if (c->state == C_CLOSING && c->close_req &&
	    ucp_request_check_status(c->close_req) != UCS_INPROGRESS) {
		ucp_request_free(c->close_req);
		c->close_req = NULL;
	}
	return c->state == C_CLOSING && !c->close_req && !c->recv_pending && c->landing == 0;
}

static void conns_step(struct ts_fleet_ucx *u)
{
	uint64_t now = ts_now_ns();

	for (struct conn **pp = &u->conns; *pp;) {
		struct conn *c = *pp;

		if (conn_step(c, now)) {
			*pp = c->next;
			free(c);
		} else {
			pp = &c->next;
		}
	}
}

/* One data receive in flight: its endpoint's connection, its receive's
 * binding there and its length. */
struct landing {
	struct conn *c;
	struct bind *b;
	void *dst;
	size_t len;
};

static void landing_done(struct ts_fleet_ucx *u, struct conn *c, struct bind *b, void *dst,
                         size_t len, bool ok)
{
	if (u->landed)
		u->landed(u->tick_cls, b->tag, dst, len, ok);
	if (!ok && !c->failed)
		c->why = UCS_ERR_IO_ERROR;
	c->failed |= !ok;
}

static void data_done_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
	struct landing *l = user_data;
	struct conn *c = l->c;

	(void)length;
	c->landing--;
	l->b->landing--;
	if (status != UCS_OK && !c->failed)
		c->why = status;
	landing_done(c->u, c, l->b, l->dst, l->len, status == UCS_OK);
	free(l);
	ucp_request_free(request);
}

/* TS_FLEET_AM_DATA: bytes for the receive of the endpoint that sent them,
 * copied (eager) or received (rendezvous) into where the sink says. */
static ucs_status_t data_cb(void *arg, const void *header, size_t header_length, void *data,
                            size_t length, const ucp_am_recv_param_t *param)
{
	struct ts_fleet_ucx *u = arg;
	struct conn *c = NULL;
	struct ts_fleet_am_hdr h;
	struct bind *b;
	void *dst;

	if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
		for (c = u->conns; c && c->ep != param->reply_ep; c = c->next)
			;
	if (!c || c->state == C_CLOSING)
		return UCS_OK;   /* dropped: no endpoint of ours, or one being closed */
	if (header_length != sizeof h || !u->land) {
		reject(c, "it sent data that is not a copy's");
		return UCS_OK;
	}
	memcpy(&h, header, sizeof h);
	if (c->state == C_HELLO && c->hello_done)
		admit(c, c->hello);   /* the ticket came first on the same endpoint */
	else if (c->state == C_HELLO)
		admit(c, h.ticket);   /* the message's ticket admits it */
	if (c->state != C_OPEN)
		return UCS_OK;
	b = bind_find(c, h.ticket);
	if (!b)
		b = bind_spend(c, h.ticket);
	if (!b) {
		reject(c, "it sent data for a receive it holds no ticket of");
		return UCS_OK;
	}
	dst = length ? u->land(u->tick_cls, b->tag, h.offset, length) : NULL;
	if (!dst) {
		if (!c->failed)
			c->why = UCS_ERR_INVALID_PARAM;
		c->failed = true;   /* closed: nothing of its receive, or out of bounds */
		return UCS_OK;
	}
	if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
		struct landing *l = malloc(sizeof *l);
		ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
		                                         UCP_OP_ATTR_FIELD_USER_DATA,
		                         .cb.recv_am = data_done_cb,
		                         .user_data = l};
		void *r;

		if (!l) {
			landing_done(u, c, b, dst, length, false);
			return UCS_OK;
		}
		l->c = c;
		l->b = b;
		l->dst = dst;
		l->len = length;
		r = ucp_am_recv_data_nbx(u->worker, data, dst, length, &p);
		if (UCS_PTR_IS_PTR(r)) {
			c->landing++;
			b->landing++;
			return UCS_OK;
		}
		free(l);
		if (UCS_PTR_IS_ERR(r) && !c->failed)
			c->why = UCS_PTR_STATUS(r);
		landing_done(u, c, b, dst, length, !UCS_PTR_IS_ERR(r));
		return UCS_OK;
	}
	memcpy(dst, data, length);
	landing_done(u, c, b, dst, length, true);
	return UCS_OK;
}

static void peer_name(ucp_conn_request_h req, char *out, size_t n)
{
	ucp_conn_request_attr_t a = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
	char host[INET6_ADDRSTRLEN] = "?", port[8] = "?";

	if (ucp_conn_request_query(req, &a) == UCS_OK)
		(void)getnameinfo((struct sockaddr *)&a.client_address, sizeof a.client_address, host,
		                  sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
	snprintf(out, n, "%s:%s", host, port);
}

/* A new connection: its endpoint, and the receive of its ticket. */
static void conn_request_cb(ucp_conn_request_h req, void *arg)
{
	struct ts_fleet_ucx *u = arg;
	struct conn *c;
	ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLER |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
	                      .conn_request = req,
	                      .err_mode = UCP_ERR_HANDLING_MODE_PEER};
	ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
	                                         UCP_OP_ATTR_FIELD_USER_DATA |
	                                         UCP_OP_ATTR_FIELD_FLAGS,
	                         .flags = UCP_STREAM_RECV_FLAG_WAITALL,
	                         .cb.recv_stream = hello_done_cb};
	size_t len = 0;
	void *r;

	c = calloc(1, sizeof *c);
	if (!c || atomic_load(&u->stop) || u->nhello >= HELLO_MAX) {
		char peer[64];

		peer_name(req, peer, sizeof peer);
		ts_metrics_fleet_ucx_conn(u->metrics, false);
		ts_log(TS_LOG_WARN, "\"event\":\"fleet_ucx\",\"result\":\"rejected\"",
		       "fleet endpoint from %s rejected: %s", peer,
		       !c ? "no memory" : u->nhello >= HELLO_MAX ? "too many waiting for a ticket"
		                                                 : "stopping");
		free(c);
		(void)ucp_listener_reject(u->listener, req);
		return;
	}
	c->u = u;
	peer_name(req, c->peer, sizeof c->peer);
	c->state = C_HELLO;
	c->deadline_ns = ts_now_ns() + u->hello_timeout_ns;
	ep.err_handler = (ucp_err_handler_t){.cb = ep_error_cb, .arg = c};
	if (ucp_ep_create(u->worker, &ep, &c->ep) != UCS_OK) {
		ts_metrics_fleet_ucx_conn(u->metrics, false);
		log_conn(c, "rejected", "no endpoint");
		free(c);
		return;
	}
	c->next = u->conns;
	u->conns = c;
	u->nhello++;
	p.user_data = c;
	r = ucp_stream_recv_nbx(c->ep, c->hello, sizeof c->hello, &len, &p);
	if (r == NULL)
		c->hello_done = len == TS_FLEET_TICKET_LEN;
	else if (UCS_PTR_IS_ERR(r))
		c->failed = true;
	else
		c->recv_pending = true;
}

/* Runs the releases asked for: each ticket of its tag withdrawn and the tag
 * unbound from each endpoint that carries it; an endpoint with bytes of it
 * still landing is closed (forced) and unbound once they have ended. Once
 * no endpoint carries it, its done. With all, every one is done now (at
 * stop, the endpoints being gone). */
static void releases_step(struct ts_fleet_ucx *u, bool all)
{
	struct release *mine, *keep = NULL;

	ts_mutex_lock(&u->mu);
	mine = u->releases;
	u->releases = NULL;
	for (struct release *r = mine; r; r = r->next)
		if (!r->closing)
			for (int i = 0; i < TICKETS_MAX; i++)
				if (u->tickets[i].tag == r->tag)
					u->tickets[i].expires_ns = 0;
	ts_mutex_unlock(&u->mu);
	while (mine) {
		struct release *r = mine;
		bool left = false;

		mine = r->next;
		for (struct conn *c = u->conns; c; c = c->next) {
			for (int i = 0; i < BINDS_MAX; i++) {
				struct bind *b = &c->binds[i];

				if (!b->used || b->tag != r->tag)
					continue;
				if (b->landing == 0) {
					*b = (struct bind){0};
					continue;
				}
				conn_close(c);
				left = true;
			}
		}
		r->closing = true;
		if (left && !all) {
			r->next = keep;
			keep = r;
			continue;
		}
		if (r->done)
			r->done(r->arg);
		free(r);
	}
	if (keep) {
		ts_mutex_lock(&u->mu);
		for (struct release *r = keep, *next; r; r = next) {
			next = r->next;
			r->next = u->releases;
			u->releases = r;
		}
		ts_mutex_unlock(&u->mu);
	}
}

void ts_fleet_ucx_release(struct ts_fleet_ucx *u, const void *tag, void (*done)(void *arg),
                          void *arg)
{
	struct release *r = calloc(1, sizeof *r);

	if (!r) {
		/* no memory to wait with: the endpoint may outlive what it wrote into */
		ts_log(TS_LOG_ERROR, "\"event\":\"fleet_ucx\"",
		       "no memory to close a receive's endpoints before freeing it");
		if (done)
			done(arg);
		return;
	}
	r->tag = tag;
	r->done = done;
	r->arg = arg;
	ts_mutex_lock(&u->mu);
	r->next = u->releases;
	u->releases = r;
	ts_mutex_unlock(&u->mu);
	(void)ucp_worker_signal(u->worker);
}

static void *progress_main(void *arg)
{
	struct ts_fleet_ucx *u = arg;

	while (!atomic_load(&u->stop)) {
		struct pollfd pfd = {.fd = u->efd, .events = POLLIN};

		while (ucp_worker_progress(u->worker))
			;
		conns_step(u);
		if (u->tick)
			u->tick(u->tick_cls);
		releases_step(u, false);
		if (ucp_worker_arm(u->worker) == UCS_ERR_BUSY)
			continue;
		(void)poll(&pfd, 1, SLEEP_MS);
	}
	/* close every endpoint, and give the closes a moment to complete */
	for (struct conn *c = u->conns; c; c = c->next)
		conn_close(c);
	for (uint64_t until = ts_now_ns() + CLOSE_WAIT_NS; u->conns && ts_now_ns() < until;) {
		ucp_worker_progress(u->worker);
		conns_step(u);
	}
	releases_step(u, true);
	return NULL;
}

/* The socket address of bind:port. */
static ts_status listen_addr(const char *bind, int port, struct sockaddr_storage *ss,
                             socklen_t *len, struct ts_error *err)
{
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE,
	                         .ai_socktype = SOCK_STREAM},
	                *ai;
	char p[8];
	int rc;

	snprintf(p, sizeof p, "%d", port);
	rc = getaddrinfo(bind && bind[0] ? bind : NULL, p, &hints, &ai);
	if (rc != 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "FLEET_PORT",
		                    "fleet listener address '%s': %s", bind, gai_strerror(rc));
	memcpy(ss, ai->ai_addr, ai->ai_addrlen);
	*len = ai->ai_addrlen;
	freeaddrinfo(ai);
	return TS_OK;
}

static ts_status ucx_error(struct ts_error *err, const char *what, ucs_status_t s)
{
	return ts_error_set(err, TS_UNAVAILABLE, "UCX", "UCX %s: %s", what, ucs_status_string(s));
}

static ts_status start_ucx(struct ts_fleet_ucx *u, struct ts_error *err)
{
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
	                       .features = UCP_FEATURE_STREAM | UCP_FEATURE_WAKEUP |
	                                   UCP_FEATURE_AM};
	ucp_am_handler_param_t am = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
	                                           UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
	                                           UCP_AM_HANDLER_PARAM_FIELD_CB |
	                                           UCP_AM_HANDLER_PARAM_FIELD_ARG,
	                             .id = TS_FLEET_AM_DATA,
	                             .flags = UCP_AM_FLAG_WHOLE_MSG,
	                             .cb = data_cb,
	                             .arg = u};
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	                          .thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_config_t *config;
	ucs_status_t s;

	/* a daemon started again at its address binds its port although the
	 * connections that its predecessor's death closed linger (TIME_WAIT,
	 * FIN_WAIT2): senders keep their endpoints open between copies. UCX
	 * reads the connection managers' options from the environment only
	 * (ucp_config_modify does not reach them), so they are set there, at
	 * start, unless the operator set them (no overwrite). */
	(void)setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
	(void)setenv("UCX_RDMA_CM_REUSEADDR", "y", 0);
	s = ucp_config_read(NULL, NULL, &config);
	if (s != UCS_OK)
		return ucx_error(err, "configuration", s);
	s = ucp_init(&params, config, &u->ctx);
	ucp_config_release(config);
	if (s != UCS_OK)
		return ucx_error(err, "init", s);
	s = ucp_worker_create(u->ctx, &wp, &u->worker);
	if (s != UCS_OK)
		return ucx_error(err, "worker", s);
	s = ucp_worker_get_efd(u->worker, &u->efd);
	if (s != UCS_OK)
		return ucx_error(err, "worker event fd", s);
	s = ucp_worker_set_am_recv_handler(u->worker, &am);
	if (s != UCS_OK)
		return ucx_error(err, "active message handler", s);
	return TS_OK;
}

static ts_status start_listener(struct ts_fleet_ucx *u, const struct ts_fleet_ucx_config *cfg,
                                struct ts_error *err)
{
	ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
	                                          UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
	                            .conn_handler = {.cb = conn_request_cb, .arg = u}};
	ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
	struct sockaddr_storage ss;
	socklen_t len = 0;
	ucs_status_t s;
	char host[INET6_ADDRSTRLEN], port[8];
	ts_status st;

	st = listen_addr(cfg->bind, cfg->port, &ss, &len, err);
	if (st != TS_OK)
		return st;
	lp.sockaddr = (ucs_sock_addr_t){.addr = (struct sockaddr *)&ss, .addrlen = len};
	s = ucp_listener_create(u->worker, &lp, &u->listener);
	if (s != UCS_OK)
		return ts_error_set(err, TS_UNAVAILABLE, "FLEET_PORT",
		                    "--fleet-port %d on '%s': cannot listen: %s", cfg->port,
		                    cfg->bind, ucs_status_string(s));
	s = ucp_listener_query(u->listener, &la);
	if (s != UCS_OK ||
	    getnameinfo((struct sockaddr *)&la.sockaddr, sizeof la.sockaddr, host, sizeof host, port,
	                sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
		return ucx_error(err, "listener address", s != UCS_OK ? s : UCS_ERR_INVALID_ADDR);
	u->port = atoi(port);
	return TS_OK;
}

ts_status ts_fleet_ucx_new(const struct ts_fleet_ucx_config *cfg, struct ts_metrics *metrics,
                           struct ts_fleet_ucx **out, struct ts_error *err)
{
	struct ts_fleet_ucx *u = calloc(1, sizeof *u);
	ts_status st;

	if (!u)
		return ts_error_oom(err, "no memory for the fleet listener");
	u->metrics = metrics;
	u->tick = cfg->tick;
	u->tick_cls = cfg->tick_cls;
	u->land = cfg->land;
	u->landed = cfg->landed;
	u->failed = cfg->failed;
	u->hello_timeout_ns = (uint64_t)cfg->hello_timeout_ms * 1000000ull;
	u->efd = -1;
	if (getrandom(&u->instance, sizeof u->instance, 0) != (ssize_t)sizeof u->instance)
		u->instance = ts_now_ns();
	u->instance |= 1;   /* never 0: a sender's "unknown" */
	if (ts_mutex_init(&u->mu) != 0) {
		free(u);
		return ts_error_oom(err, "no mutex for the fleet listener");
	}
	st = start_ucx(u, err);
	if (st == TS_OK)
		st = start_listener(u, cfg, err);
	if (st == TS_OK && pthread_create(&u->thread, NULL, progress_main, u) != 0)
		st = ts_error_set(err, TS_INTERNAL, "THREAD", "cannot start the fleet's progress thread");
	u->started = st == TS_OK;
	if (st != TS_OK) {
		ts_fleet_ucx_free(u);
		return st;
	}
	*out = u;
	return TS_OK;
}

void ts_fleet_ucx_free(struct ts_fleet_ucx *u)
{
	if (!u)
		return;
	if (u->started) {
		atomic_store(&u->stop, true);
		(void)ucp_worker_signal(u->worker);
		pthread_join(u->thread, NULL);
	}
	if (u->listener)
		ucp_listener_destroy(u->listener);
	if (u->worker)
		ucp_worker_destroy(u->worker);   /* ends what the wait did not, callbacks included */
	for (struct release *r = u->releases, *next; r; r = next) {
		next = r->next;
		if (r->done)
			r->done(r->arg);   /* the endpoints are gone with the worker */
		free(r);
	}
	for (struct conn *c = u->conns, *next; c; c = next) {
		next = c->next;
		free(c);
	}
	if (u->ctx)
		ucp_cleanup(u->ctx);
	ts_mutex_destroy(&u->mu);
	free(u);
}
