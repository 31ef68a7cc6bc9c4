/*
 * fleet_link.c - the sending side's long-lived UCP context, worker and
 * endpoints (fleet_link.h).
 *
 * Invariants: every field below mu is touched with mu held; an endpoint in
 * the cache list is well or about to be found failed (its handler ran) at
 * the next ts_fleet_link_ep_locked, which drops it; an entry lives until it
 * is out of the cache and no copy holds it, and its UCP endpoint until it
 * is killed or freed (the error handler's argument is the entry).
 */
#include "server/fleet_link.h"

#include <assert.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/lock.h"
#include "common/units.h"

/* Most endpoints kept; past that the least recently used idle one goes. */
#define CACHE_MAX 64

/* How long a well endpoint's goodbye may take when the daemon stops. */
#define CLOSE_WAIT_NS (1000000000ull)

/* The longest a waiting sender sleeps on the worker's event fd before it
 * looks again (another thread's progress may have taken the event that
 * ended its request). */
#define WAIT_SLEEP_MS 2

struct ts_fleet_ep {
	struct ts_fleet_ep *next;        /* in the cache; guarded by: l->mu */
	struct ts_fleet_link *l;
	char key[320];                   /* "host:port" */
	uint64_t instance;               /* the peer's fleet instance it reaches */
	ucp_ep_h ep;                     /* NULL once closed */
	bool failed;
	ucs_status_t why;
	bool cached;
	int refs;                        /* copies holding it */
	uint64_t used_ns;                /* last handed out */
};

struct ts_fleet_link {
	struct ts_mutex mu;
	ucp_context_h ctx;               /* guarded by: mu; NULL until the first endpoint */
	ucp_worker_h worker;             /* guarded by: mu */
	int efd;                         /* the worker's event fd; set with worker */
	struct ts_fleet_ep *cache;       /* guarded by: mu */
	int ncached;                     /* guarded by: mu */
};

ts_status ts_fleet_link_new(struct ts_fleet_link **out, struct ts_error *err)
{
	struct ts_fleet_link *l = calloc(1, sizeof *l);

	if (!l || ts_mutex_init(&l->mu) != 0) {
		free(l);
		return ts_error_oom(err, "no memory for the fleet's sending side");
	}
	*out = l;
	return TS_OK;
}

void ts_fleet_link_lock(struct ts_fleet_link *l)
{
	ts_mutex_lock(&l->mu);
}

void ts_fleet_link_unlock(struct ts_fleet_link *l)
{
	ts_mutex_unlock(&l->mu);
}

ucp_worker_h ts_fleet_link_worker_locked(struct ts_fleet_link *l)
{
	assert(ts_mutex_held(&l->mu));
	return l->worker;
}

/* Closes e's endpoint: forced, or flushed with the peer for up to wait_ns. */
static void ep_close(struct ts_fleet_ep *e, bool force, uint64_t wait_ns)
{
	ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
	                         .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
	uint64_t until = ts_now_ns() + wait_ns;
	void *req;

	if (!e->ep)
		return;
	req = ucp_ep_close_nbx(e->ep, &p);
	e->ep = NULL;
	while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS &&
	       (force || ts_now_ns() < until))
		ucp_worker_progress(e->l->worker);
	if (UCS_PTR_IS_PTR(req)) {
		if (ucp_request_check_status(req) == UCS_INPROGRESS)
			ucp_request_cancel(e->l->worker, req);
		ucp_request_free(req);
	}
}

/* Takes e out of the cache (lock held); freed when no copy holds it. */
static void uncache(struct ts_fleet_ep *e)
{
	struct ts_fleet_link *l = e->l;

	if (!e->cached)
		return;
	for (struct ts_fleet_ep **pp = &l->cache; *pp; pp = &(*pp)->next)
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	e->cached = false;
	l->ncached--;
	if (e->refs == 0) {
		ep_close(e, true, 0);
		free(e);
	}
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct ts_fleet_ep *e = arg;

	(void)ep;
	if (!e->failed)
		e->why = status;
	e->failed = true;
}

static ts_status ucx_start_locked(struct ts_fleet_link *l, struct ts_error *err)
{
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
	                       .features = UCP_FEATURE_STREAM | UCP_FEATURE_AM |
	                                   UCP_FEATURE_WAKEUP};
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	                          .thread_mode = UCS_THREAD_MODE_SERIALIZED};
	ucp_config_t *config;
	ucs_status_t s;

	if (l->worker)
		return TS_OK;
	s = ucp_config_read(NULL, NULL, &config);
	if (s == UCS_OK) {
		s = ucp_init(&params, config, &l->ctx);
		ucp_config_release(config);
		if (s != UCS_OK)
			l->ctx = NULL;
	}
	if (s == UCS_OK && (s = ucp_worker_create(l->ctx, &wp, &l->worker)) != UCS_OK)
		l->worker = NULL;
	if (s == UCS_OK && (s = ucp_worker_get_efd(l->worker, &l->efd)) != UCS_OK) {
		ucp_worker_destroy(l->worker);
		l->worker = NULL;
	}
	if (s != UCS_OK) {
		if (l->ctx)
			ucp_cleanup(l->ctx);
		l->ctx = NULL;
		return ts_error_set(err, TS_UNAVAILABLE, "UCX", "UCX for the fleet's copies: %s",
		                    ucs_status_string(s));
	}
	return TS_OK;
}

/* The least recently used endpoint that no copy holds, or NULL. */
static struct ts_fleet_ep *idlest(struct ts_fleet_link *l)
{
	struct ts_fleet_ep *best = NULL;

	for (struct ts_fleet_ep *e = l->cache; e; e = e->next)
		if (e->refs == 0 && (!best || e->used_ns < best->used_ns))
			best = e;
	return best;
}

ts_status ts_fleet_link_ep_locked(struct ts_fleet_link *l, const char *peer, const char *host,
                                  const char *port, uint64_t instance, struct ts_fleet_ep **out,
                                  bool *fresh, struct ts_error *err)
{
	ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLER |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
	                      .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
	                      .err_mode = UCP_ERR_HANDLING_MODE_PEER};
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
	struct ts_fleet_ep *e;
	char key[320];
	ucs_status_t s;

	assert(ts_mutex_held(&l->mu));
	*out = NULL;
	*fresh = false;
	if (ucx_start_locked(l, err) != TS_OK)
		return err->status;
	snprintf(key, sizeof key, "%s:%s", host, port);
	/* what the peers said since the last copy: a closed endpoint's handler */
	while (ucp_worker_progress(l->worker))
		;
	for (e = l->cache; e; e = e->next)
		if (strcmp(e->key, key) == 0)
			break;
	if (e && (e->failed || !e->ep || e->instance != instance)) {
		uncache(e);   /* failed, or the peer restarted: another daemon there now */
		e = NULL;
	}
	if (e) {
		e->refs++;
		e->used_ns = ts_now_ns();
		*out = e;
		return TS_OK;
	}
	if (l->ncached >= CACHE_MAX && idlest(l))
		uncache(idlest(l));
	e = calloc(1, sizeof *e);
	if (!e)
		return ts_error_oom(err, "no memory for an endpoint to peer '%s'", peer);
	e->l = l;
	snprintf(e->key, sizeof e->key, "%s", key);
	e->instance = instance;
	if (getaddrinfo(host, port, &hints, &ai) != 0) {
		free(e);
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_FAILED", "peer '%s': cannot resolve '%s'",
		                    peer, host);
	}
	ep.sockaddr = (ucs_sock_addr_t){.addr = ai->ai_addr, .addrlen = ai->ai_addrlen};
	ep.err_handler = (ucp_err_handler_t){.cb = ep_failed, .arg = e};
	s = ucp_ep_create(l->worker, &ep, &e->ep);
	freeaddrinfo(ai);
	if (s != UCS_OK) {
		free(e);
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_FAILED",
		                    "peer '%s': no endpoint to %s:%s: %s", peer, host, port,
		                    ucs_status_string(s));
	}
	e->refs = 1;
	e->used_ns = ts_now_ns();
	e->cached = true;
	e->next = l->cache;
	l->cache = e;
	l->ncached++;
	*fresh = true;
	*out = e;
	return TS_OK;
}

ucp_ep_h ts_fleet_ep_ucp_locked(const struct ts_fleet_ep *e)
{
	return e->ep;
}

bool ts_fleet_ep_failed_locked(const struct ts_fleet_ep *e, ucs_status_t *why)
{
	if (why)
		*why = e->failed ? e->why : UCS_OK;
	return e->failed || !e->ep;
}

void ts_fleet_ep_kill_locked(struct ts_fleet_ep *e)
{
	assert(ts_mutex_held(&e->l->mu));
	if (!e->failed)
		e->why = UCS_ERR_CANCELED;
	e->failed = true;
	ep_close(e, true, 0);
	uncache(e);   /* frees e only when no copy holds it: one does */
}

/* Sleeps until efd is readable, WAIT_SLEEP_MS at most, and not past
 * deadline (ts_now_ns). */
static void sleep_on(int efd, uint64_t deadline)
{
	struct pollfd pfd = {.fd = efd, .events = POLLIN};
	uint64_t now = ts_now_ns();
	int ms = WAIT_SLEEP_MS;

	if (deadline <= now)
		return;
	if (deadline - now < (uint64_t)ms * 1000000u)
		ms = (int)((deadline - now + 999999u) / 1000000u);
	(void)poll(&pfd, 1, ms);
}

ucs_status_t ts_fleet_link_wait(struct ts_fleet_link *l, struct ts_fleet_ep *e, void *req,
                                uint64_t deadline, const _Atomic bool *stop)
{
	ucs_status_t s, why = UCS_OK;

	for (;;) {
		bool failed;

		ts_mutex_lock(&l->mu);
		s = ucp_request_check_status(req);
		if (s == UCS_INPROGRESS && ucp_worker_progress(l->worker)) {
			ts_mutex_unlock(&l->mu);
			continue;
		}
		s = ucp_request_check_status(req);
		failed = ts_fleet_ep_failed_locked(e, &why);
		if (s == UCS_INPROGRESS &&
		    (ts_now_ns() >= deadline || failed || (stop && atomic_load(stop)))) {
			/* a send cannot be cancelled: the endpoint goes, and with it
			 * what is in flight on it */
			ucp_request_cancel(l->worker, req);
			if (ucp_request_check_status(req) == UCS_INPROGRESS)
				ts_fleet_ep_kill_locked(e);
			while (ucp_request_check_status(req) == UCS_INPROGRESS)
				ucp_worker_progress(l->worker);
			s = failed && why != UCS_OK ? why : UCS_ERR_TIMED_OUT;
		}
		if (s != UCS_INPROGRESS) {
			ucp_request_free(req);
			ts_mutex_unlock(&l->mu);
			return s;
		}
		/* nothing to progress: sleep until the worker has an event (a
		 * socket ready, a peer's answer) rather than spin, which on a
		 * busy node takes the core the peer's or the kernel's side of the
		 * transfer needs */
		if (ucp_worker_arm(l->worker) == UCS_ERR_BUSY) {
			ts_mutex_unlock(&l->mu);
			continue;
		}
		ts_mutex_unlock(&l->mu);
		sleep_on(l->efd, deadline);
	}
}

ucs_status_t ts_fleet_link_drive(struct ts_fleet_link *l, struct ts_fleet_ep *e, void *req,
                                 uint64_t deadline, uint64_t silence_ns,
                                 const _Atomic bool *stop, bool *silent)
{
	uint64_t quiet = ts_now_ns() + silence_ns;

	*silent = false;
	if (req == NULL)
		return UCS_OK;
	if (UCS_PTR_IS_ERR(req))
		return UCS_PTR_STATUS(req);
	if (quiet < deadline) {
		deadline = quiet;
		*silent = true;
	}
	return ts_fleet_link_wait(l, e, req, deadline, stop);
}

ts_status ts_fleet_link_error(ucs_status_t s, bool silent, uint64_t silence_ns,
                              const char *peer, const char *what, struct ts_error *err)
{
	if (s == UCS_ERR_TIMED_OUT && silent)
		return ts_error_set(err, TS_DEADLINE_EXCEEDED, "PEER_SILENT",
		                    "%s: %s: nothing completed in %llu s (--fleet-timeout)", peer, what,
		                    (unsigned long long)(silence_ns / 1000000000ull));
	return ts_error_set(err, s == UCS_ERR_TIMED_OUT ? TS_DEADLINE_EXCEEDED : TS_UNAVAILABLE,
	                    "PEER_FAILED", "%s: %s: %s", peer, what, ucs_status_string(s));
}

void ts_fleet_ep_unref_locked(struct ts_fleet_ep *e)
{
	assert(ts_mutex_held(&e->l->mu));
	if (--e->refs > 0 || e->cached)
		return;
	ep_close(e, true, 0);
	free(e);
}

void ts_fleet_link_free(struct ts_fleet_link *l)
{
	if (!l)
		return;
	ts_mutex_lock(&l->mu);
	while (l->cache) {
		struct ts_fleet_ep *e = l->cache;

		ep_close(e, e->failed, CLOSE_WAIT_NS);
		l->cache = e->next;
		free(e);
	}
	if (l->worker)
		ucp_worker_destroy(l->worker);
	if (l->ctx)
		ucp_cleanup(l->ctx);
	ts_mutex_unlock(&l->mu);
	ts_mutex_destroy(&l->mu);
	free(l);
}
