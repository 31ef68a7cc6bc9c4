/*
 * fleet.c - the fleet view: a poller thread that asks each peer of --peers
 * for its node (GET /v1/fleet?scope=local) with libcurl, and GET /v1/fleet,
 * which lists this node and every peer's latest node object.
 *
 * Invariant: a published node object (peer.node) is never modified; the
 * poller replaces it whole under mu, and readers copy it under mu (jansson's
 * reference counts order no reads with a free in another thread, so no
 * object is shared between threads).
 */
#include "server/fleet.h"

#include <curl/curl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/lock.h"
#include "common/log.h"
#include "common/units.h"
#include "common/version.h"
#include "handlers/handlers.h"
#include "server/config.h"
#include "server/metrics.h"
#include "server/router.h"
#include "server/server_int.h"

/* How often --peers-dns is resolved again. */
#define DNS_EVERY_NS (10ull * 1000000000ull)

/* Easy handles the pool keeps for calls to peers (ts_fleet_easy_take):
 * about the copies that run at once, each with its connections. */
#define EASY_POOL_MAX 8

/* Largest answer a peer may give (its node with its devices). */
#define ANSWER_MAX (4u << 20)

struct peer {
	char url[TS_CONFIG_PEER_URL_MAX + 1];  /* immutable: "http://host:port", no '/' */
	char poll_url[TS_CONFIG_PEER_URL_MAX + 32];  /* immutable: url + "/v1/fleet?scope=local" */
	/* the poller's own, between rounds */
	CURL *easy;
	struct ts_fleet_body answer;     /* max ANSWER_MAX */
	char errbuf[CURL_ERROR_SIZE];
	uint64_t last_contact_ns;        /* wall clock of the last good answer; 0: none */
	char host[128];                  /* host of the last good answer; "" none */
	char version[64];
	json_t *node;                    /* guarded by: mu; published, immutable */
};

struct ts_fleet {
	struct ts_mutex mu;
	/* --peers first (nstatic, in order), then --peers-dns's addresses (sorted);
	 * replaced by the poller only, under mu */
	struct peer **peers;             /* guarded by: mu (the poller reads it freely) */
	int npeers;                      /* guarded by: mu (likewise) */
	int nstatic;                     /* immutable */
	char dns[256];                   /* immutable: --peers-dns; "" none */
	char bind[64];                   /* immutable: --bind (addresses of this daemon) */
	int port;                        /* immutable: --port, the DNS peers' port too */
	bool dns_failed;                 /* the last resolution failed (logged once) */
	struct curl_slist *headers;      /* the Authorization header; immutable */
	struct ts_metrics *metrics;
	int interval_ms, timeout_ms;
	CURLM *multi;
	struct ts_mutex pool_mu;
	CURL *pool[EASY_POOL_MAX];       /* guarded by: pool_mu; idle, reset */
	int npool;                       /* guarded by: pool_mu */
	_Atomic bool stop;
	pthread_t thread;
	bool started;
	bool curl_inited;
	int forwards;                    /* guarded by: mu; ?host= reads in flight */
	pthread_cond_t forwards_cv;      /* signalled as each ends */
};

/* RFC 3339 UTC with microseconds; JSON null for 0 (never). */
static json_t *time_json(uint64_t ns)
{
	char buf[48];

	return ts_format_rfc3339(buf, sizeof buf, ns) ? json_string(buf) : json_null();
}

static json_t *str_or_null(const char *s)
{
	return s[0] ? json_string(s) : json_null();
}

size_t ts_fleet_body_write(char *data, size_t size, size_t nmemb, void *cls)
{
	struct ts_fleet_body *a = cls;
	size_t n = size * nmemb;
	char *grown;

	if (a->len + n > a->max) {
		a->too_big = true;
		return 0;
	}
	grown = realloc(a->buf, a->len + n + 1);
	if (!grown)
		return 0;
	memcpy(grown + a->len, data, n);
	a->len += n;
	grown[a->len] = '\0';
	a->buf = grown;
	return n;
}

/* The node object of an unreachable peer: what was last known of it, with
 * why it is unreachable now. */
static json_t *unreachable_node(const struct peer *p, const char *reason, const char *message)
{
	return json_pack("{s:s, s:o, s:o, s:b, s:b, s:{s:s, s:s}, s:o, s:[]}", "url", p->url,
	                 "host", str_or_null(p->host), "version", str_or_null(p->version),
	                 "self", false, "reachable", false, "error", "reason", reason,
	                 "message", message, "last_contact", time_json(p->last_contact_ns),
	                 "devices");
}

/* The node object from a peer's answer (a 200 of GET /v1/fleet?scope=local),
 * or an unreachable one naming what was wrong with it. */
static json_t *node_from_answer(struct peer *p, CURLcode rc)
{
	long code = 0;
	json_t *body, *node;
	json_error_t jerr;
	const char *host = NULL, *version = NULL;
	char msg[CURL_ERROR_SIZE + 340];

	if (rc != CURLE_OK) {
		const char *reason = rc == CURLE_OPERATION_TIMEDOUT ? "TIMEOUT"
		                     : rc == CURLE_COULDNT_CONNECT ? "CONNECT_FAILED"
		                     : rc == CURLE_COULDNT_RESOLVE_HOST ? "RESOLVE_FAILED"
		                     : p->answer.too_big ? "ANSWER_TOO_LARGE" : "HTTP_FAILED";

		snprintf(msg, sizeof msg, "GET %s: %s", p->poll_url,
		         p->errbuf[0] ? p->errbuf : curl_easy_strerror(rc));
		return unreachable_node(p, reason, msg);
	}
	curl_easy_getinfo(p->easy, CURLINFO_RESPONSE_CODE, &code);
	if (code != 200) {
		snprintf(msg, sizeof msg, "GET %s answered HTTP %ld", p->poll_url, code);
		return unreachable_node(p, code == 401 || code == 403 ? "UNAUTHENTICATED"
		                                                      : "HTTP_STATUS", msg);
	}
	body = json_loadb(p->answer.buf ? p->answer.buf : "", p->answer.len, 0, &jerr);
	node = json_array_get(json_object_get(body, "nodes"), 0);
	if (json_unpack(node, "{s:s, s:s}", "host", &host, "version", &version) != 0 ||
	    !json_is_array(json_object_get(node, "devices"))) {
		json_decref(body);
		snprintf(msg, sizeof msg, "GET %s did not answer a tstaged node", p->poll_url);
		return unreachable_node(p, "BAD_ANSWER", msg);
	}
	p->last_contact_ns = ts_wall_ns();
	snprintf(p->host, sizeof p->host, "%s", host);
	snprintf(p->version, sizeof p->version, "%s", version);
	json_incref(node);
	json_decref(body);
	/* the peer's own object, now ours alone: made into our view of it */
	json_object_set_new(node, "url", json_string(p->url));
	json_object_set_new(node, "self", json_false());
	json_object_set_new(node, "reachable", json_true());
	json_object_set_new(node, "last_contact", time_json(p->last_contact_ns));
	return node;
}

/* One log line when a peer turns reachable or unreachable (the reason with
 * it), none while it stays so. */
static void log_change(const struct peer *p, json_t *old, json_t *node)
{
	bool was = json_is_true(json_object_get(old, "reachable"));
	bool is = json_is_true(json_object_get(node, "reachable"));
	json_t *error = json_object_get(node, "error");
	const char *reason = json_string_value(json_object_get(error, "reason"));

	if (was == is || (reason && strcmp(reason, "NOT_YET_POLLED") == 0))
		return;
	if (is) {
		ts_log_json(TS_LOG_INFO,
		            json_pack("{s:s, s:s, s:s, s:O*}", "event", "fleet_peer", "peer", p->url,
		                      "state", "reachable", "host", json_object_get(node, "host")),
		            "peer %s is reachable", p->url);
		return;
	}
	ts_log_json(TS_LOG_WARN,
	            json_pack("{s:s, s:s, s:s, s:s*, s:O*}", "event", "fleet_peer", "peer", p->url,
	                      "state", "unreachable", "reason", reason, "message",
	                      json_object_get(error, "message")),
	            "peer %s is unreachable: %s", p->url,
	            json_string_value(json_object_get(error, "message")));
}

static void publish(struct ts_fleet *f, struct peer *p, json_t *node)
{
	json_t *old;

	if (!node)    /* out of memory: the previous object stays */
		return;
	ts_mutex_lock(&f->mu);
	old = p->node;
	p->node = node;
	ts_mutex_unlock(&f->mu);
	log_change(p, old, node);
	json_decref(old);
}

/* One round: every peer asked at once, each answer (or failure) published. */
static void poll_round(struct ts_fleet *f)
{
	int running = 0, left, reachable = 0;
	CURLMsg *msg;

	for (int i = 0; i < f->npeers; i++) {
		struct peer *p = f->peers[i];

		p->answer.len = 0;
		p->answer.too_big = false;
		p->errbuf[0] = '\0';
		curl_multi_add_handle(f->multi, p->easy);
	}
	do {
		if (curl_multi_perform(f->multi, &running) != CURLM_OK)
			break;
		if (running && curl_multi_poll(f->multi, NULL, 0, 200, NULL) != CURLM_OK)
			break;
	} while (running && !atomic_load(&f->stop));
	while ((msg = curl_multi_info_read(f->multi, &left))) {
		for (int i = 0; msg->msg == CURLMSG_DONE && i < f->npeers; i++) {
			struct peer *p = f->peers[i];

			if (p->easy != msg->easy_handle)
				continue;
			publish(f, p, node_from_answer(p, msg->data.result));
		}
	}
	/* the poller is the only writer of the published objects */
	for (int i = 0; i < f->npeers; i++) {
		curl_multi_remove_handle(f->multi, f->peers[i]->easy);
		reachable += json_is_true(json_object_get(f->peers[i]->node, "reachable"));
	}
	if (!atomic_load(&f->stop))
		ts_metrics_fleet_peers(f->metrics, reachable, f->npeers - reachable);
}

static void peer_free(struct peer *p)
{
	if (!p)
		return;
	curl_easy_cleanup(p->easy);
	free(p->answer.buf);
	json_decref(p->node);
	free(p);
}

/* Sets easy up for a GET of url to a peer, the answer into body (at most
 * body->max bytes), curl's message into errbuf. */
static void get_setup(CURL *easy, const struct ts_fleet *f, const char *url, long timeout_ms,
                      struct ts_fleet_body *body, char *errbuf)
{
	curl_easy_setopt(easy, CURLOPT_URL, url);
	curl_easy_setopt(easy, CURLOPT_HTTPGET, 1L);
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, f->headers);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, ts_fleet_body_write);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, body);
	curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
	/* straight to the peer: never through an http_proxy of the environment,
	 * which would see the token */
	curl_easy_setopt(easy, CURLOPT_PROXY, "");
}

static struct peer *peer_new(struct ts_fleet *f, const char *url, size_t len)
{
	struct peer *p = calloc(1, sizeof *p);

	if (!p)
		return NULL;
	if (len && url[len - 1] == '/')
		len--;
	snprintf(p->url, sizeof p->url, "%.*s", (int)len, url);
	snprintf(p->poll_url, sizeof p->poll_url, "%s/v1/fleet?scope=local", p->url);
	p->easy = curl_easy_init();
	p->node = unreachable_node(p, "NOT_YET_POLLED", "the first poll has not ended yet");
	if (!p->easy || !p->node) {
		peer_free(p);
		return NULL;
	}
	p->answer.max = ANSWER_MAX;
	get_setup(p->easy, f, p->poll_url, (long)f->timeout_ms, &p->answer, p->errbuf);
	return p;
}

/* Whether the numeric address a is this daemon's own: its --bind address,
 * or, bound to every address, one of the host's interfaces'. */
static bool own_address(const struct ts_fleet *f, const char *a, const struct ifaddrs *ifs)
{
	char buf[NI_MAXHOST];

	if (strcmp(f->bind, "0.0.0.0") != 0 && strcmp(f->bind, "::") != 0)
		return strcmp(a, f->bind) == 0;
	for (const struct ifaddrs *i = ifs; i; i = i->ifa_next) {
		socklen_t len = !i->ifa_addr ? 0
		                : i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
		                : i->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : 0;

		if (len && getnameinfo(i->ifa_addr, len, buf, sizeof buf, NULL, 0,
		                       NI_NUMERICHOST) == 0 && strcmp(buf, a) == 0)
			return true;
	}
	return false;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The peer among list[from..to) whose url is url, or NULL. */
static struct peer *find_peer(struct peer *const *list, int from, int to, const char *url)
{
	for (int i = from; i < to; i++)
		if (strcmp(list[i]->url, url) == 0)
			return list[i];
	return NULL;
}

/* Whether p is among list[from..to). */
static bool has_peer(struct peer *const *list, int from, int to, const struct peer *p)
{
	for (int i = from; i < to; i++)
		if (list[i] == p)
			return true;
	return false;
}

/* --peers-dns: the name's addresses become the peers after --peers (each at
 * this daemon's --port, sorted, its own addresses and --peers' URLs left
 * out); a peer already known keeps its state. A failed resolution keeps
 * the previous list. */
static void resolve_peers(struct ts_fleet *f)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *a;
	struct ifaddrs *ifs = NULL;
	char *urls[TS_CONFIG_MAX_PEERS];
	struct peer **list, **old;
	int n = 0, rc, nold;

	rc = getaddrinfo(f->dns, NULL, &hints, &res);
	if (rc != 0) {
		if (!f->dns_failed)
			ts_log_json(TS_LOG_WARN,
			            json_pack("{s:s, s:s, s:s}", "event", "fleet_dns", "name", f->dns,
			                      "error", gai_strerror(rc)),
			            "--peers-dns '%s' does not resolve: %s", f->dns, gai_strerror(rc));
		f->dns_failed = true;
		return;
	}
	f->dns_failed = false;
	if (getifaddrs(&ifs) != 0)
		ifs = NULL;
	for (a = res; a && n < TS_CONFIG_MAX_PEERS; a = a->ai_next) {
		char host[NI_MAXHOST], url[TS_CONFIG_PEER_URL_MAX + 1];
		bool seen = false;

		if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof host, NULL, 0,
		                NI_NUMERICHOST) != 0 || own_address(f, host, ifs))
			continue;
		snprintf(url, sizeof url, a->ai_family == AF_INET6 ? "http://[%s]:%d" : "http://%s:%d",
		         host, f->port);
		for (int i = 0; i < n && !seen; i++)
			seen = strcmp(urls[i], url) == 0;
		for (int i = 0; i < f->nstatic && !seen; i++)
			seen = strcmp(f->peers[i]->url, url) == 0;
		if (!seen && (urls[n] = strdup(url)))
			n++;
	}
	freeaddrinfo(res);
	if (ifs)
		freeifaddrs(ifs);
	qsort(urls, (size_t)n, sizeof *urls, cmp_str);
	list = calloc((size_t)(f->nstatic + n) + 1, sizeof *list);
	for (int i = 0; list && i < f->nstatic; i++)
		list[i] = f->peers[i];
	/* the poller alone changes the list: reading it here needs no lock */
	for (int i = 0; list && i < n; i++) {
		struct peer *p = find_peer(f->peers, f->nstatic, f->npeers, urls[i]);

		list[f->nstatic + i] = p ? p : peer_new(f, urls[i], strlen(urls[i]));
		if (!list[f->nstatic + i]) {   /* out of memory: the old list stays */
			for (int j = f->nstatic; j < f->nstatic + i; j++)
				if (!has_peer(f->peers, f->nstatic, f->npeers, list[j]))
					peer_free(list[j]);
			free(list);
			list = NULL;
		}
	}
	for (int i = 0; i < n; i++)
		free(urls[i]);
	if (!list)
		return;
	ts_mutex_lock(&f->mu);
	old = f->peers;
	nold = f->npeers;
	f->peers = list;
	f->npeers = f->nstatic + n;
	ts_mutex_unlock(&f->mu);
	for (int i = f->nstatic; i < nold; i++)   /* those no longer named */
		if (!has_peer(list, f->nstatic, f->nstatic + n, old[i]))
			peer_free(old[i]);
	free(old);
}

static void *poller(void *arg)
{
	struct ts_fleet *f = arg;
	uint64_t resolved = 0;

	while (!atomic_load(&f->stop)) {
		uint64_t start = ts_now_ns(), spent_ms;

		if (f->dns[0] && (!resolved || start - resolved >= DNS_EVERY_NS)) {
			resolve_peers(f);
			resolved = start;
		}
		poll_round(f);
		spent_ms = (ts_now_ns() - start) / 1000000u;
		if ((int64_t)spent_ms < f->interval_ms && !atomic_load(&f->stop))
			curl_multi_poll(f->multi, NULL, 0, f->interval_ms - (int)spent_ms, NULL);
	}
	return NULL;
}


ts_status ts_fleet_new(const struct ts_fleet_config *cfg, struct ts_fleet **out,
                       struct ts_error *err)
{
	struct ts_fleet *f = calloc(1, sizeof *f);
	const char *s = cfg->peers;
	ts_status st = TS_OK;
	char auth[300];
	int n = 0;

	*out = NULL;
	if (!f)
		return ts_error_oom(err, "no memory for the fleet");
	ts_mutex_init(&f->mu);
	ts_mutex_init(&f->pool_mu);
	pthread_cond_init(&f->forwards_cv, NULL);
	f->metrics = cfg->metrics;
	f->interval_ms = cfg->interval_ms;
	f->timeout_ms = cfg->timeout_ms;
	f->port = cfg->port;
	snprintf(f->dns, sizeof f->dns, "%s", cfg->peers_dns ? cfg->peers_dns : "");
	snprintf(f->bind, sizeof f->bind, "%s", cfg->bind ? cfg->bind : "");
	for (const char *c = s; *s && c; c = strchr(c + 1, ','))
		n++;
	if (n == 0 && !f->dns[0]) {
		*out = f;
		return TS_OK;
	}
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		ts_fleet_free(f);
		return ts_error_set(err, TS_INTERNAL, "CURL_INIT", "libcurl failed to initialise");
	}
	f->curl_inited = true;
	f->peers = n ? calloc((size_t)n, sizeof *f->peers) : NULL;
	f->multi = curl_multi_init();
	if (cfg->token[0]) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", cfg->token);
		f->headers = curl_slist_append(NULL, auth);
		explicit_bzero(auth, sizeof auth);
	}
	if ((n && !f->peers) || !f->multi || (cfg->token[0] && !f->headers)) {
		st = ts_error_oom(err, "no memory for the fleet's %d peers", n);
		goto out_free;
	}
	for (f->npeers = 0; f->npeers < n; f->npeers++) {
		const char *comma = strchr(s, ',');
		size_t len = comma ? (size_t)(comma - s) : strlen(s);

		f->peers[f->npeers] = peer_new(f, s, len);
		if (!f->peers[f->npeers]) {
			st = ts_error_oom(err, "no memory for peer '%.*s'", (int)len, s);
			goto out_free;
		}
		s = comma ? comma + 1 : s + len;
	}
	f->nstatic = n;
	ts_metrics_fleet_peers(f->metrics, 0, n);
	if (pthread_create(&f->thread, NULL, poller, f) != 0) {
		st = ts_error_set(err, TS_INTERNAL, "FLEET_THREAD", "cannot start the fleet poller");
		goto out_free;
	}
	f->started = true;
	*out = f;
	return TS_OK;

out_free:
	ts_fleet_free(f);
	return st;
}

void ts_fleet_free(struct ts_fleet *f)
{
	if (!f)
		return;
	if (f->started) {
		atomic_store(&f->stop, true);
		curl_multi_wakeup(f->multi);
		pthread_join(f->thread, NULL);
	}
	/* the reads asked of peers end within their timeout */
	ts_mutex_lock(&f->mu);
	while (f->forwards > 0)
		ts_mutex_wait(&f->mu, &f->forwards_cv, NULL);
	ts_mutex_unlock(&f->mu);
	for (int i = 0; i < f->npeers; i++)
		peer_free(f->peers[i]);
	if (f->multi)
		curl_multi_cleanup(f->multi);
	for (int i = 0; i < f->npool; i++)
		curl_easy_cleanup(f->pool[i]);
	curl_slist_free_all(f->headers);
	free(f->peers);
	if (f->curl_inited)
		curl_global_cleanup();
	ts_mutex_destroy(&f->pool_mu);
	ts_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->forwards_cv);
	free(f);
}

void *ts_fleet_easy_take(struct ts_fleet *f)
{
	CURL *e = NULL;

	ts_mutex_lock(&f->pool_mu);
	if (f->npool > 0)
		e = f->pool[--f->npool];
	ts_mutex_unlock(&f->pool_mu);
	if (!e)
		return curl_easy_init();
	curl_easy_reset(e);   /* every option back to its default; the connections stay */
	return e;
}

void ts_fleet_easy_give(struct ts_fleet *f, void *easy, bool keep)
{
	if (!easy)
		return;
	ts_mutex_lock(&f->pool_mu);
	if (keep && f->npool < EASY_POOL_MAX) {
		f->pool[f->npool++] = easy;
		easy = NULL;
	}
	ts_mutex_unlock(&f->pool_mu);
	if (easy)
		curl_easy_cleanup(easy);
}

json_t *ts_fleet_nodes(struct ts_fleet *f)
{
	json_t *list = json_array();

	if (!list)
		return NULL;
	ts_mutex_lock(&f->mu);
	for (int i = 0; i < f->npeers; i++)
		if (json_array_append_new(list, json_deep_copy(f->peers[i]->node)) != 0) {
			json_decref(list);
			list = NULL;
			break;
		}
	ts_mutex_unlock(&f->mu);
	return list;
}

ts_status ts_fleet_peer(struct ts_fleet *f, const char *host, char *url, size_t cap,
                        struct ts_error *err)
{
	ts_status st = TS_OK;
	int found = -1;

	ts_mutex_lock(&f->mu);
	for (int i = 0; i < f->npeers && found < 0; i++)
		if (strcmp(f->peers[i]->host, host) == 0)
			found = i;
	if (found < 0) {
		st = ts_error_set(err, TS_NOT_FOUND, "HOST_NOT_FOUND",
		                  "no peer of this node's fleet is host '%s' (GET /v1/fleet lists "
		                  "them)", host);
	} else {
		json_t *node = f->peers[found]->node;
		const char *why = json_string_value(
			json_object_get(json_object_get(node, "error"), "message"));

		snprintf(url, cap, "%s", f->peers[found]->url);
		if (!json_is_true(json_object_get(node, "reachable")))
			st = ts_error_set(err, TS_UNAVAILABLE, "PEER_UNREACHABLE",
			                  "peer '%s' (%s) is unreachable: %s", host, url,
			                  why ? why : "not answering");
	}
	ts_mutex_unlock(&f->mu);
	return st;
}

/* This node: what /v1/devices writes, with the host, version and ports. */
/* The data port: the listener's when it is on, else the one it would take. */
static int fleet_port(const struct ts_server *srv)
{
	if (srv->fleet_ucx)
		return ts_fleet_ucx_port(srv->fleet_ucx);
	return srv->cfg.fleet_port ? srv->cfg.fleet_port : srv->port + 1;
}

static json_t *self_node(struct ts_server *srv, const struct ts_call *call)
{
	const struct ts_core *core = call->core;
	json_t *devs = ts_h_devices_json(core), *node;
	char url[160];
	bool v6 = strchr(srv->cfg.bind, ':') != NULL;

	snprintf(url, sizeof url, "http://%s%s%s:%d", v6 ? "[" : "", srv->cfg.bind, v6 ? "]" : "",
	         srv->port);
	node = json_pack("{s:s, s:s, s:s, s:b, s:b, s:o, s:i, s:i, s:O*, s:O*, s:O*}", "host",
	                 core->host, "url", url, "version", ts_version, "self", true, "reachable",
	                 true, "last_contact", time_json(ts_wall_ns()), "port", srv->port,
	                 "fleet_port", fleet_port(srv),
	                 "devices", json_object_get(devs, "devices"), "default_device",
	                 json_object_get(devs, "default_device"), "default_backend",
	                 json_object_get(devs, "default_backend"));
	json_decref(devs);
	return node;
}

void ts_s_fleet(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	const char *scope = ts_call_query(call, "scope");
	bool local = scope && strcmp(scope, "local") == 0;
	json_t *nodes, *peers = NULL, *self;

	if (scope && !local && strcmp(scope, "fleet") != 0) {
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_SCOPE",
		              "scope '%s' is not one of fleet, local", scope);
		return;
	}
	self = self_node(srv, call);
	nodes = json_array();
	if (!local)
		peers = ts_fleet_nodes(srv->fleet);
	if (!self || !nodes || (!local && !peers)) {
		json_decref(self);
		json_decref(nodes);
		json_decref(peers);
		ts_reply_oom(reply, "no memory for the fleet view");
		return;
	}
	json_array_append_new(nodes, self);
	if (peers)
		json_array_extend(nodes, peers);
	json_decref(peers);
	ts_reply_json(reply, TS_HTTP_OK,
	              json_pack("{s:o, s:s}", "nodes", nodes, "host", call->core->host));
}

void ts_s_fleet_ticket(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	char ticket[TS_FLEET_TICKET_LEN + 1];
	struct ts_error err;

	(void)call;
	if (!srv->fleet_ucx) {
		ts_reply_fail(reply, TS_FAILED_PRECONDITION, "NO_FLEET_PORT",
		              "this daemon has no fleet port: it listens with --peers, --peers-dns "
		              "or --fleet-port");
		return;
	}
	ts_error_clear(&err);
	if (ts_fleet_ucx_ticket(srv->fleet_ucx, ticket, &err) != TS_OK) {
		ts_reply_error(reply, &err);
		return;
	}
	ts_reply_json(reply, TS_HTTP_OK,
	              json_pack("{s:s, s:i, s:i, s:s}", "ticket", ticket, "fleet_port",
	                        ts_fleet_ucx_port(srv->fleet_ucx), "expires_in_seconds",
	                        TS_FLEET_TICKET_TTL_S, "host", call->core->host));
}

/*
 * Reads of another node (?host=): the GET is asked of that peer, with the
 * route's other query arguments and the fleet's token, and its answer is
 * this call's. The call runs on a thread of its own while the connection is
 * suspended (TS_REPLY_SUSPEND), so a slow peer holds no loop that serves
 * other connections; FORWARD_TIMEOUT_MS at most.
 */
#define FORWARD_TIMEOUT_MS 5000L
#define FORWARD_ANSWER_MAX (16u << 20)

/* The peer's google.rpc.Status code name back to ours; UNAVAILABLE when it
 * names none. */
static ts_status status_named(const char *name)
{
	for (int c = 1; c <= 16 && name; c++)
		if (strcmp(ts_status_name((ts_status)c), name) == 0)
			return (ts_status)c;
	return TS_UNAVAILABLE;
}

/* The peer's error answer as ours: its code, reason and message, the
 * message naming the peer. */
static void forward_error(struct ts_reply *reply, const char *host, long code, json_t *body)
{
	json_t *e = json_object_get(body, "error");
	const char *msg = json_string_value(json_object_get(e, "message"));
	const char *reason = NULL;
	size_t i;
	json_t *d;

	json_array_foreach(json_object_get(e, "details"), i, d)
		if (!reason)
			reason = json_string_value(json_object_get(d, "reason"));
	ts_reply_fail(reply, status_named(json_string_value(json_object_get(e, "status"))),
	              reason ? reason : "PEER_REFUSED", "node '%s' answered %ld: %s", host, code,
	              msg ? msg : "no message");
}

/* url + path + the route's query arguments but host, percent-encoded. */
static bool forward_url(CURL *easy, const struct ts_route *route, const struct ts_call *call,
                        const char *base, char *out, size_t cap)
{
	const char *q = route->query;
	size_t n = (size_t)snprintf(out, cap, "%s%s", base, call->path);
	char sep = '?';

	while (n < cap && q && *q) {
		size_t len = strcspn(q, ",");
		size_t name_len = strcspn(q, ",:");
		char name[64];
		const char *v;

		if (name_len < sizeof name) {
			memcpy(name, q, name_len);
			name[name_len] = '\0';
			v = strcmp(name, "host") != 0 ? ts_call_query(call, name) : NULL;
			if (v) {
				char *enc = curl_easy_escape(easy, v, 0);

				if (!enc)
					return false;
				n += (size_t)snprintf(out + n, cap - n, "%c%s=%s", sep, name, enc);
				curl_free(enc);
				sep = '&';
			}
		}
		q += len;
		if (*q == ',')
			q++;
	}
	return n < cap;
}

/* One forwarded read: asked on its own thread, answered on resume. Two
 * references: the suspended reply's (release) and the thread's. */
struct forward {
	atomic_int refs;
	struct ts_fleet *fleet;          /* waits for the thread before it goes */
	struct ts_mutex mu;
	void (*wake)(void *token);       /* guarded by: mu; NULL once disarmed */
	void *token;
	bool done;                       /* guarded by: mu */
	char host[128];
	char base[TS_CONFIG_PEER_URL_MAX + 1];
	char path[1024];                 /* the call's, for messages */
	char url[TS_CONFIG_PEER_URL_MAX + 2048];
	/* the thread's result, read on resume once done */
	CURLcode rc;
	long code;
	struct ts_fleet_body a;          /* max FORWARD_ANSWER_MAX */
	char ebuf[CURL_ERROR_SIZE];
};

static void forward_unref(struct forward *f)
{
	if (atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	free(f->a.buf);
	ts_mutex_destroy(&f->mu);
	free(f);
}

static void *forward_main(void *arg)
{
	struct forward *f = arg;
	struct ts_fleet *fleet = f->fleet;
	CURL *easy = curl_easy_init();

	f->rc = CURLE_FAILED_INIT;
	if (easy) {
		get_setup(easy, fleet, f->url, FORWARD_TIMEOUT_MS, &f->a, f->ebuf);
		f->rc = curl_easy_perform(easy);
		curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &f->code);
	}
	if (easy)
		curl_easy_cleanup(easy);
	ts_mutex_lock(&f->mu);
	f->done = true;
	if (f->wake)
		f->wake(f->token);
	f->wake = NULL;
	ts_mutex_unlock(&f->mu);
	forward_unref(f);
	ts_mutex_lock(&fleet->mu);
	fleet->forwards--;
	pthread_cond_broadcast(&fleet->forwards_cv);
	ts_mutex_unlock(&fleet->mu);
	return NULL;
}

static bool forward_arm(void *state, void (*wake)(void *token), void *token)
{
	struct forward *f = state;
	pthread_attr_t attr;
	pthread_t t;
	bool started = false;

	f->wake = wake;
	f->token = token;
	atomic_fetch_add(&f->refs, 1);   /* the thread's */
	ts_mutex_lock(&f->fleet->mu);
	f->fleet->forwards++;
	ts_mutex_unlock(&f->fleet->mu);
	if (pthread_attr_init(&attr) == 0) {
		started = pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
		          pthread_create(&t, &attr, forward_main, f) == 0;
		pthread_attr_destroy(&attr);
	}
	if (!started) {
		ts_mutex_lock(&f->fleet->mu);
		f->fleet->forwards--;
		pthread_cond_broadcast(&f->fleet->forwards_cv);
		ts_mutex_unlock(&f->fleet->mu);
		f->wake = NULL;
		snprintf(f->ebuf, sizeof f->ebuf, "no thread to ask it");
		f->rc = CURLE_FAILED_INIT;
		f->done = true;
		forward_unref(f);
	}
	return started;   /* not started: answered now, from rc */
}

static void forward_disarm(void *state, void (*wake)(void *token), void *token)
{
	struct forward *f = state;

	(void)wake;
	(void)token;
	ts_mutex_lock(&f->mu);
	f->wake = NULL;
	ts_mutex_unlock(&f->mu);
}

static void forward_resume(void *state, bool timed_out, struct ts_reply *reply)
{
	struct forward *f = state;
	json_t *body = NULL;
	bool done;

	ts_mutex_lock(&f->mu);
	done = f->done;
	ts_mutex_unlock(&f->mu);
	if (done && f->rc == CURLE_OK)
		body = json_loadb(f->a.buf ? f->a.buf : "", f->a.len, 0, NULL);
	if (timed_out || !done || f->rc == CURLE_OPERATION_TIMEDOUT)
		ts_reply_fail(reply, TS_DEADLINE_EXCEEDED, "PEER_SILENT",
		              "node '%s' (%s) gave no answer to GET %s in %ld ms", f->host, f->base,
		              f->path, FORWARD_TIMEOUT_MS);
	else if (f->a.too_big)
		ts_reply_fail(reply, TS_UNAVAILABLE, "ANSWER_TOO_LARGE",
		              "node '%s' answered GET %s with more than %u bytes", f->host, f->path,
		              FORWARD_ANSWER_MAX);
	else if (f->rc != CURLE_OK)
		ts_reply_fail(reply, TS_UNAVAILABLE, "PEER_UNAVAILABLE", "node '%s' (%s): GET %s: %s",
		              f->host, f->base, f->path,
		              f->ebuf[0] ? f->ebuf : curl_easy_strerror(f->rc));
	else if (f->code < 200 || f->code > 299)
		forward_error(reply, f->host, f->code, body);
	else if (!json_is_object(body))
		ts_reply_fail(reply, TS_UNAVAILABLE, "BAD_ANSWER",
		              "node '%s' did not answer GET %s with a JSON object", f->host, f->path);
	else {
		ts_reply_json(reply, TS_HTTP_OK, body);
		body = NULL;
	}
	json_decref(body);
}

static void forward_release(void *state)
{
	forward_unref(state);
}

/* Asks peer host the call (see ts_fleet_forward) and answers its answer. */
static void forward(struct ts_server *srv, const struct ts_route *route,
                    const struct ts_call *call, const char *host, struct ts_reply *reply)
{
	struct forward *f = calloc(1, sizeof *f);
	struct ts_error err;
	struct ts_suspend s;
	CURL *easy;
	bool fits;

	ts_error_clear(&err);
	if (!f) {
		ts_reply_oom(reply, "no memory for a call to node '%s'", host);
		return;
	}
	atomic_init(&f->refs, 1);
	ts_mutex_init(&f->mu);
	f->a.max = FORWARD_ANSWER_MAX;
	snprintf(f->host, sizeof f->host, "%s", host);
	snprintf(f->path, sizeof f->path, "%s", call->path);
	f->fleet = srv->fleet;
	if (ts_fleet_peer(srv->fleet, host, f->base, sizeof f->base, &err) != TS_OK) {
		forward_unref(f);
		ts_reply_error(reply, &err);
		return;
	}
	easy = curl_easy_init();   /* for its escaping */
	fits = easy && forward_url(easy, route, call, f->base, f->url, sizeof f->url);
	if (easy)
		curl_easy_cleanup(easy);
	if (!fits) {
		forward_unref(f);
		if (!easy)
			ts_reply_oom(reply, "no memory for a call to node '%s'", host);
		else
			ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_HOST",
			              "the call to node '%s' is too long", host);
		return;
	}
	/* a second past the call's own timeout: the thread answers first */
	s = (struct ts_suspend){.timeout_ns = (FORWARD_TIMEOUT_MS + 1000) * 1000000ull,
	                        .arm = forward_arm, .disarm = forward_disarm,
	                        .resume = forward_resume, .release = forward_release, .state = f};
	ts_reply_suspend(reply, &s);
}

bool ts_fleet_forward(struct ts_server *srv, const struct ts_route *route,
                      const struct ts_call *call, struct ts_reply *reply)
{
	const char *host;

	/* only the reads that declare host take it (the others refuse it) */
	if (strcmp(route->method, "GET") != 0 || !strstr(route->query, "host"))
		return false;
	host = ts_call_query(call, "host");
	if (!host || strcmp(host, call->core->host) == 0)
		return false;      /* this node's own */
	if (!host[0])
		ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_HOST",
		              "host is empty: name a node as GET /v1/fleet lists it");
	else
		forward(srv, route, call, host, reply);
	return true;
}
