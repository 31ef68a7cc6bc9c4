/*
 * accept.c - connections before libmicrohttpd has them: one thread accepts
 * on the listening sockets (TCP, and --unix-socket), counts each connection
 * (in all and by client address) or answers it 503 past a limit, waits for
 * its first bytes, and hands it by its first request to one of two daemons
 * (server/http_tuning.h says why two):
 *
 *   PUT, POST, PATCH,  the bulk daemon, whose connection memory reads an
 *   or a request line  upload's body in large pieces and holds a long
 *   of 4 KiB or more   request head;
 *   anything else      a small-request worker (one poll loop of its own,
 *                      whose connection memory is cleared for every
 *                      request at an eighth of the cost): the first that
 *                      holds fewer than --worker-fill connections, else
 *                      the least loaded (ts__worker_pick), so that a
 *                      client's few connections share a loop that seldom
 *                      sleeps between their requests.
 *
 * A connection keeps its daemon for its life: a keep-alive client that
 * starts with a GET uploads in smaller pieces, and a long request head
 * later on is refused (the Python client keeps requests with a body or a
 * long URL on connections of their own).
 *
 * A connection is counted from accept to close: while it waits here (an idle
 * one too: a flood of them is answered 503 at once, as before a byte is
 * sent), and from the daemon's start notice on (http.c counts it again there
 * and answers 503 itself should the count have moved past a limit in
 * between). A refused connection is sent the 503, half-closed, and what it
 * sends is read and dropped until it closes or a second has passed. One that
 * sends nothing within --connection-timeout is closed, as the daemons close
 * an idle one.
 */
#include "server/server_int.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/log.h"
#include "common/units.h"
#include "server/http_tuning.h"
#include "server/router.h"

/* ---- counting ------------------------------------------------------------- */

struct ts__addr_count {
	struct ts__addr_count *next;
	unsigned char addr[16];
	int n;
};

static unsigned addr_bucket(const unsigned char *a)
{
	return (unsigned)(ts_fnv1a(TS_FNV1A_INIT, a, 16) % TS__ADDR_BUCKETS);
}

void ts__conn_key(const struct sockaddr *sa, unsigned char key[16])
{
	memset(key, 0, 16);
	if (sa && sa->sa_family == AF_INET) {
		key[10] = key[11] = 0xff;
		memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa && sa->sa_family == AF_INET6) {
		memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
}

/* The count of addr, created at 0 when absent (NULL when out of memory). */
static struct ts__addr_count *addr_count_locked(struct ts_server *srv, const unsigned char *addr,
                                                bool create)
{
	struct ts__addr_count **pp = &srv->by_addr[addr_bucket(addr)];

	assert(ts_mutex_held(&srv->conns_mu));
	for (; *pp; pp = &(*pp)->next)
		if (memcmp((*pp)->addr, addr, 16) == 0)
			return *pp;
	if (!create)
		return NULL;
	*pp = calloc(1, sizeof **pp);
	if (*pp)
		memcpy((*pp)->addr, addr, 16);
	return *pp;
}

/* Drops the count ac (at 0) from its bucket. */
static void addr_drop_locked(struct ts_server *srv, struct ts__addr_count *ac)
{
	struct ts__addr_count **pp = &srv->by_addr[addr_bucket(ac->addr)];

	assert(ts_mutex_held(&srv->conns_mu));
	while (*pp != ac)
		pp = &(*pp)->next;
	*pp = ac->next;
	free(ac);
}

int ts__conn_admit(struct ts_server *srv, const unsigned char key[16], bool local)
{
	struct ts__addr_count *ac;
	int over = 0;

	ts_mutex_lock(&srv->conns_mu);
	ac = addr_count_locked(srv, key, true);
	if (srv->conns >= srv->cfg.max_connections)
		over = 1;
	else if (srv->cfg.max_connections_per_ip && !local && ac &&
	         ac->n >= srv->cfg.max_connections_per_ip)
		over = 2;
	if (!over) {
		srv->conns++;
		if (ac)
			ac->n++;
	} else if (ac && ac->n == 0) {
		addr_drop_locked(srv, ac);    /* nothing counted for it */
	}
	ts_mutex_unlock(&srv->conns_mu);
	return over;
}

void ts__conn_leave(struct ts_server *srv, const unsigned char key[16])
{
	struct ts__addr_count *ac;

	ts_mutex_lock(&srv->conns_mu);
	srv->conns--;
	ac = addr_count_locked(srv, key, false);
	if (ac && --ac->n == 0)
		addr_drop_locked(srv, ac);
	ts_mutex_unlock(&srv->conns_mu);
}

void ts__conn_refuse(struct ts_server *srv, int fd, int which)
{
	uint64_t n = ts_metrics_connection(srv->metrics, TS_CONN_REFUSED);

	if (fd >= 0 && srv->busy[which - 1]) {
		(void)send(fd, srv->busy[which - 1], srv->busy_len[which - 1],
		           MSG_NOSIGNAL | MSG_DONTWAIT);
		shutdown(fd, SHUT_WR);
	}
	if ((n & (n - 1)) == 0) {       /* 1, 2, 4, 8, ...: not a line per connection */
		char fields[96];

		snprintf(fields, sizeof fields, "\"refused_total\":%llu,\"limit\":\"%s\"",
		         (unsigned long long)n, which == 1 ? "max-connections" : "max-connections-per-ip");
		ts_log(TS_LOG_WARN, fields, "connection refused with 503: too many connections");
	}
}

/* The raw 503 for a connection past a limit (all, or per address). */
static char *busy_reply(const char *message, size_t *len)
{
	struct ts_error err;
	json_t *j;
	char *body, *text = NULL;

	ts_error_clear(&err);
	ts_error_set(&err, TS_UNAVAILABLE, "TOO_MANY_CONNECTIONS", "%s", message);
	j = ts_error_to_json(&err, 0);
	body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (body && asprintf(&text, "HTTP/1.1 503 Service Unavailable\r\n"
	                            "Content-Type: application/json\r\n"
	                            "Retry-After: 1\r\nConnection: close\r\n"
	                            "Content-Length: %zu\r\n\r\n%s\n",
	                     strlen(body) + 1, body) < 0)
		text = NULL;
	free(body);
	*len = text ? strlen(text) : 0;
	return text;
}

/* Lets the process hold need descriptors (the soft limit raised up to the
 * hard one); returns how many it may hold. */
static unsigned long fd_limit(unsigned long need)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return need;
	if (rl.rlim_cur >= need)
		return rl.rlim_cur;
	rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0 && getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return need;
	return rl.rlim_cur;
}

/* The library's own connection limit: room to answer those past ours,
 * within the descriptors the process may hold (256 kept for files, pipes
 * and the rest); --max-connections shrinks to fit, with a warning. */
static unsigned int library_limit(struct ts_server *srv)
{
	unsigned long want = (unsigned long)srv->cfg.max_connections * 2u + 64u;
	unsigned long have = fd_limit(want + 256u);
	char fields[96];

	if (have >= want + 256u)
		return (unsigned int)want;
	want = have > 512u ? have - 256u : have / 2u;
	snprintf(fields, sizeof fields, "\"nofile\":%lu,\"max_connections\":%lu", have,
	         want / 2u > 0 ? want / 2u : 1u);
	ts_log(TS_LOG_WARN, fields, "the descriptor limit is too low for --max-connections; "
	       "serving fewer");
	srv->cfg.max_connections = want / 2u > 0 ? (int)(want / 2u) : 1;
	return (unsigned int)(want > 0 ? want : 1u);
}

ts_status ts__conns_start(struct ts_server *srv, unsigned int *hard, struct ts_error *err)
{
	char msg[200];

	*hard = library_limit(srv);         /* before the 503s quote the limit */
	ts_mutex_init(&srv->conns_mu);
	srv->conns_started = true;
	snprintf(msg, sizeof msg, "tstaged serves at most %d connections at once; retry later",
	         srv->cfg.max_connections);
	srv->busy[0] = busy_reply(msg, &srv->busy_len[0]);
	snprintf(msg, sizeof msg, "tstaged serves at most %d connections at once from one "
	         "address; retry later", srv->cfg.max_connections_per_ip);
	srv->busy[1] = busy_reply(msg, &srv->busy_len[1]);
	if (!srv->busy[0] || !srv->busy[1])
		return ts_error_oom(err, "no memory for the connection limits");
	return TS_OK;
}

void ts__conns_stop(struct ts_server *srv)
{
	if (!srv->conns_started)
		return;
	for (int i = 0; i < TS__ADDR_BUCKETS; i++) {
		while (srv->by_addr[i]) {
			struct ts__addr_count *ac = srv->by_addr[i];

			srv->by_addr[i] = ac->next;
			free(ac);
		}
	}
	free(srv->busy[0]);
	free(srv->busy[1]);
	srv->busy[0] = srv->busy[1] = NULL;
	ts_mutex_destroy(&srv->conns_mu);
	srv->conns_started = false;
}

/* ---- the listening TCP socket --------------------------------------------- */

ts_status ts__tcp_listen(const struct ts_config *cfg, int *fd, int *port, struct ts_error *err)
{
	struct sockaddr_storage ss;
	struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
	socklen_t len;
	int s, one = 1;

	memset(&ss, 0, sizeof ss);
	if (inet_pton(AF_INET, cfg->bind, &v4->sin_addr) == 1) {
		v4->sin_family = AF_INET;
		v4->sin_port = htons((uint16_t)cfg->port);
		len = sizeof *v4;
	} else if (inet_pton(AF_INET6, cfg->bind, &v6->sin6_addr) == 1) {
		v6->sin6_family = AF_INET6;
		v6->sin6_port = htons((uint16_t)cfg->port);
		len = sizeof *v6;
	} else {
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_BIND",
		                    "--bind '%s' is not an IPv4 or IPv6 address", cfg->bind);
	}
	s = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		goto fail;
	/* SO_REUSEADDR (a restart binds past TIME_WAIT), never SO_REUSEPORT: a
	 * second daemon on the port fails to start instead of taking half of
	 * the connections; an IPv6 address serves IPv6 only */
	if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
	    (ss.ss_family == AF_INET6 &&
	     setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) != 0) ||
	    bind(s, (struct sockaddr *)&ss, len) != 0 || listen(s, SOMAXCONN) != 0)
		goto fail;
	len = sizeof ss;
	if (getsockname(s, (struct sockaddr *)&ss, &len) != 0)
		goto fail;
	*port = ntohs(ss.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);
	*fd = s;
	return TS_OK;

fail:
	if (s >= 0)
		close(s);
	return ts_error_set(err, TS_UNAVAILABLE, "LISTEN_FAILED",
	                    "cannot listen on %s port %d (%s)", cfg->bind, cfg->port,
	                    errno == EADDRINUSE ? "address in use" : strerror(errno));
}

/* ---- the acceptor ---------------------------------------------------------- */

#define ACCEPT_BATCH 64                 /* connections taken per wakeup of a socket */
#define REFUSED_LINGER_NS 1000000000ull /* a refused connection is read for 1 s */
#define PAUSE_NS 100000000ull           /* out of descriptors: accept again after */
#define MAX_LISTEN 2

enum pend_state { PEND_WAIT, PEND_REFUSED };

/* An accepted connection still here. */
struct pend {
	int fd;
	enum pend_state state;
	unsigned char key[16];
	struct sockaddr_storage addr;
	socklen_t addrlen;
	uint64_t deadline_ns;
	struct pend *prev, *next;
};

/* Connections with one timeout, so in deadline order. */
struct pend_list {
	struct pend *head, *tail;
};

struct ts__acceptor {
	struct ts_server *srv;
	int ep;                             /* epoll: the sockets below, and wake */
	int wake;                           /* eventfd: stop */
	int lfd[MAX_LISTEN];
	int nlfd;
	struct pend_list waiting;           /* admitted, before their first bytes */
	struct pend_list refused;           /* answered 503, read until they close */
	uint64_t paused_until_ns;           /* 0, or when to accept again */
	char peek[TS_HTTP_HEAD_MAX + 1];    /* a first request's head, peeked at */
	pthread_t thread;
	bool started;
};

static void list_push(struct pend_list *l, struct pend *p)
{
	p->next = NULL;
	p->prev = l->tail;
	if (l->tail)
		l->tail->next = p;
	else
		l->head = p;
	l->tail = p;
}

static void list_remove(struct pend_list *l, struct pend *p)
{
	if (p->prev)
		p->prev->next = p->next;
	else
		l->head = p->next;
	if (p->next)
		p->next->prev = p->prev;
	else
		l->tail = p->prev;
	p->prev = p->next = NULL;
}

static struct pend_list *list_of(struct ts__acceptor *acc, const struct pend *p)
{
	return p->state == PEND_WAIT ? &acc->waiting : &acc->refused;
}

/* Closes p, here or in the list it is in, and frees it; an admitted one
 * is no longer counted. */
static void pend_close(struct ts__acceptor *acc, struct pend *p, bool listed)
{
	if (listed)
		list_remove(list_of(acc, p), p);
	close(p->fd);                       /* leaves the epoll set too */
	if (p->state == PEND_WAIT)
		ts__conn_leave(acc->srv, p->key);
	free(p);
}

/* Watches p (edge-triggered: a peek does not take the bytes, so only new
 * ones wake); false when it cannot be watched (then closed). */
static bool pend_watch(struct ts__acceptor *acc, struct pend *p)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = p};

	if (epoll_ctl(acc->ep, EPOLL_CTL_ADD, p->fd, &ev) != 0) {
		pend_close(acc, p, false);
		return false;
	}
	list_push(list_of(acc, p), p);
	return true;
}

/* Reads and drops what a refused connection sends; true once it is done
 * (closed, or failed). */
static bool refused_drain(int fd)
{
	char sink[4096];

	for (;;) {
		ssize_t n = recv(fd, sink, sizeof sink, MSG_DONTWAIT);

		if (n > 0)
			continue;
		return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
	}
}

static bool body_method(const char *m, size_t len)
{
	return (len == 3 && memcmp(m, "PUT", 3) == 0) || (len == 4 && memcmp(m, "POST", 4) == 0) ||
	       (len == 5 && memcmp(m, "PATCH", 5) == 0);
}

int ts__first_request_class(const char *b, size_t n, bool *bulk)
{
	const char *sp = memchr(b, ' ', n < TS__LONG_LINE ? n : TS__LONG_LINE);

	*bulk = false;
	if (sp && body_method(b, (size_t)(sp - b))) {
		*bulk = true;
		return 1;
	}
	if (memchr(b, '\n', n < TS__LONG_LINE ? n : TS__LONG_LINE))
		return 1;
	*bulk = n >= TS__LONG_LINE;
	return *bulk ? 1 : 0;
}

/* What fd's first bytes say, peeked at (left for the daemon to read) into
 * acc->peek: 1, the head is whole and fits (*bulk: the daemon it needs, as
 * ts__first_request_class and the head's size choose); 0 while it is still
 * coming; 2, it is refused (*h says why); -1 when the connection closed or
 * failed before a byte. */
static int first_request(struct ts__acceptor *acc, int fd, bool *bulk, struct ts__head *h)
{
	ssize_t n = recv(fd, acc->peek, TS_HTTP_HEAD_MAX + 1, MSG_PEEK | MSG_DONTWAIT);
	int r;

	*bulk = false;
	if (n == 0)
		return -1;
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
	r = ts__head_check(acc->peek, (size_t)n, h);
	if (r == TS__HEAD_REFUSED)
		return 2;
	(void)ts__first_request_class(acc->peek, (size_t)n, bulk);
	if (r == TS__HEAD_MORE)
		return 0;
	*bulk = *bulk || !h->small;
	return 1;
}

int ts__worker_pick(const int64_t *conns, int n, int fill)
{
	int least = 0;

	for (int w = 0; w < n; w++) {
		if (conns[w] < fill)
			return w;
		if (conns[w] < conns[least])
			least = w;
	}
	return least;
}

/* The small-request worker for a new connection, counted on it from now
 * (its close notice uncounts it, http.c). */
static int worker_take(struct ts_server *srv)
{
	int64_t conns[TS__MAX_WORKERS];
	int w;

	for (w = 0; w < srv->nworkers; w++)
		conns[w] = ts_metrics_worker_conns(srv->metrics, w);
	w = ts__worker_pick(conns, srv->nworkers, srv->cfg.worker_fill);
	ts_metrics_worker_conns_add(srv->metrics, w, 1);
	return w;
}

/* Gives p to its daemon; the daemon's start notice counts it again. */
static void pend_hand_over(struct ts__acceptor *acc, struct pend *p, bool bulk, bool listed)
{
	struct ts_server *srv = acc->srv;
	int w = bulk ? -1 : worker_take(srv);

	if (listed) {
		list_remove(&acc->waiting, p);
		(void)epoll_ctl(acc->ep, EPOLL_CTL_DEL, p->fd, NULL);
	}
	ts__conn_leave(srv, p->key);
	ts_metrics_connection(srv->metrics, bulk ? TS_CONN_BULK : TS_CONN_SMALL);
	/* the library closes the socket when it cannot take it */
	if (MHD_add_connection(bulk ? srv->bulk.mhd : srv->workers[w].mhd, p->fd,
	                       (const struct sockaddr *)&p->addr, p->addrlen) != MHD_YES &&
	    w >= 0)
		ts_metrics_worker_conns_add(srv->metrics, w, -1);
	free(p);
}

/* The raw answer to a refused head h: a google.rpc.Status body with the
 * head's HTTP status, a request id, and Connection: close (new string, its
 * length in *len; NULL without memory). */
static char *head_reply(struct ts_server *srv, const struct ts__head *h, size_t *len)
{
	struct ts_error err;
	char id[40], *body = NULL, *text = NULL;
	const char *phrase = h->http == 414 ? "URI Too Long"
	                   : h->http == 431 ? "Request Header Fields Too Large"
	                   : h->http == 501 ? "Not Implemented"
	                   : h->http == 505 ? "HTTP Version Not Supported"
	                                    : "Bad Request";
	json_t *j;

	ts_error_clear(&err);
	ts_error_set(&err, h->http == 501 ? TS_UNIMPLEMENTED : TS_INVALID_ARGUMENT, h->reason, "%s",
	             h->message);
	if (h->http == 414 || h->http == 431) {
		ts_error_meta_u64(&err, "limit_bytes", TS_HTTP_HEAD_MAX);
		ts_error_meta_u64(&err, "limit_fields", TS_HTTP_HEAD_FIELDS_MAX);
	}
	j = ts_error_to_json(&err, h->http);
	body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	snprintf(id, sizeof id, "%s-%llx", srv->id_prefix,
	         (unsigned long long)atomic_fetch_add(&srv->next_id, 1));
	if (body && asprintf(&text, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
	                            "X-Request-Id: %s\r\nConnection: close\r\n"
	                            "Content-Length: %zu\r\n\r\n%s\n",
	                     h->http, phrase, id, strlen(body) + 1, body) < 0)
		text = NULL;
	free(body);
	*len = text ? strlen(text) : 0;
	return text;
}

/* Answers p's refused first head h in JSON (what the library would have
 * answered in HTML), half-closes it and reads what it still sends for a
 * second, as for a connection past a limit; it is no longer counted. */
static void pend_answer(struct ts__acceptor *acc, struct pend *p, const struct ts__head *h,
                        bool listed)
{
	struct ts_server *srv = acc->srv;
	size_t len;
	char *text = head_reply(srv, h, &len), fields[160];

	if (listed)
		list_remove(&acc->waiting, p);
	ts__conn_leave(srv, p->key);
	ts_metrics_request_started(srv->metrics);
	ts_metrics_record(srv->metrics, ts_nroutes, h->http, 0);
	if (text)
		(void)send(p->fd, text, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	free(text);
	shutdown(p->fd, SHUT_WR);
	snprintf(fields, sizeof fields, "\"status\":%d,\"reason\":\"%s\"", h->http, h->reason);
	ts_log(TS_LOG_INFO, fields, "request head refused before the HTTP server read it");
	p->state = PEND_REFUSED;
	p->deadline_ns = ts_now_ns() + REFUSED_LINGER_NS;
	if (refused_drain(p->fd)) {
		if (listed)
			(void)epoll_ctl(acc->ep, EPOLL_CTL_DEL, p->fd, NULL);
		close(p->fd);
		free(p);
		return;
	}
	if (listed)
		list_push(&acc->refused, p);
	else
		(void)pend_watch(acc, p);
}

/* Hands p over once its head is whole (its daemon chosen by it), or once it
 * hung up after some bytes (the daemon answers what they are); answers a
 * refused head itself; false while the head is still to come. */
static bool pend_try(struct ts__acceptor *acc, struct pend *p, bool listed, bool hung_up)
{
	struct ts__head h;
	bool bulk;
	int r = first_request(acc, p->fd, &bulk, &h);

	if (r == 2)
		pend_answer(acc, p, &h, listed);
	else if (r > 0 || (r == 0 && hung_up))
		pend_hand_over(acc, p, bulk, listed);
	else if (r < 0)
		pend_close(acc, p, listed);     /* gone before a byte */
	return r != 0 || hung_up;
}

/* Answers p 503 (which limit it passed: 1, all; 2, its address) and keeps
 * reading it for a second. */
static void pend_refuse(struct ts__acceptor *acc, struct pend *p, int which)
{
	ts__conn_refuse(acc->srv, p->fd, which);
	p->state = PEND_REFUSED;
	p->deadline_ns = ts_now_ns() + REFUSED_LINGER_NS;
	if (refused_drain(p->fd)) {
		close(p->fd);
		free(p);
		return;
	}
	(void)pend_watch(acc, p);
}

static void listen_pause(struct ts__acceptor *acc)
{
	for (int i = 0; i < acc->nlfd; i++) {
		struct epoll_event ev = {.events = 0, .data.ptr = &acc->lfd[i]};

		(void)epoll_ctl(acc->ep, EPOLL_CTL_MOD, acc->lfd[i], &ev);
	}
	acc->paused_until_ns = ts_now_ns() + PAUSE_NS;
	ts_log(TS_LOG_WARN, NULL, "out of descriptors or memory for new connections; "
	       "accepting again in 100 ms");
}

static void listen_resume(struct ts__acceptor *acc)
{
	for (int i = 0; i < acc->nlfd; i++) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &acc->lfd[i]};

		(void)epoll_ctl(acc->ep, EPOLL_CTL_MOD, acc->lfd[i], &ev);
	}
	acc->paused_until_ns = 0;
}

/* Takes the connections waiting on the listening socket lfd. */
static void accept_some(struct ts__acceptor *acc, int lfd)
{
	struct ts_server *srv = acc->srv;

	for (int i = 0; i < ACCEPT_BATCH; i++) {
		struct pend *p = malloc(sizeof *p);
		int over;

		if (!p) {
			listen_pause(acc);
			return;
		}
		p->addrlen = sizeof p->addr;
		p->fd = accept4(lfd, (struct sockaddr *)&p->addr, &p->addrlen,
		                SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (p->fd < 0) {
			int e = errno;

			free(p);
			if (e == EINTR || e == ECONNABORTED || e == EPROTO)
				continue;
			if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
				listen_pause(acc);
			return;
		}
		ts__conn_key((const struct sockaddr *)&p->addr, p->key);
		over = ts__conn_admit(srv, p->key, p->addr.ss_family == AF_UNIX);
		if (over) {
			pend_refuse(acc, p, over);
			continue;
		}
		p->state = PEND_WAIT;
		p->deadline_ns = ts_now_ns() + (uint64_t)srv->cfg.connection_timeout * 1000000000ull;
		if (!pend_try(acc, p, false, false))
			(void)pend_watch(acc, p);
	}
}

/* Closes what has waited past its deadline; answers the milliseconds to
 * the next one (-1: none). */
static int expire(struct ts__acceptor *acc)
{
	uint64_t now = ts_now_ns(), next = UINT64_MAX;
	struct pend_list *lists[2] = {&acc->waiting, &acc->refused};

	if (acc->paused_until_ns && now >= acc->paused_until_ns)
		listen_resume(acc);
	if (acc->paused_until_ns)
		next = acc->paused_until_ns;
	for (int i = 0; i < 2; i++) {
		while (lists[i]->head && lists[i]->head->deadline_ns <= now)
			pend_close(acc, lists[i]->head, true);
		if (lists[i]->head && lists[i]->head->deadline_ns < next)
			next = lists[i]->head->deadline_ns;
	}
	if (next == UINT64_MAX)
		return -1;
	return (int)((next - now) / 1000000u) + 1;
}

static void *acceptor_main(void *arg)
{
	struct ts__acceptor *acc = arg;
	struct epoll_event evs[64];

	for (;;) {
		int n = epoll_wait(acc->ep, evs, 64, expire(acc));

		for (int i = 0; i < n; i++) {
			void *tag = evs[i].data.ptr;
			struct pend *p = tag;

			if (tag == &acc->wake)
				return NULL;
			if (tag == &acc->lfd[0] || (acc->nlfd > 1 && tag == &acc->lfd[1])) {
				accept_some(acc, *(int *)tag);
				continue;
			}
			if (p->state == PEND_REFUSED) {
				if (refused_drain(p->fd))
					pend_close(acc, p, true);
				continue;
			}
			(void)pend_try(acc, p, true,
			               (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
		}
	}
}

ts_status ts__accept_start(struct ts_server *srv, const int *fds, int nfds, struct ts_error *err)
{
	struct ts__acceptor *acc = calloc(1, sizeof *acc);
	struct epoll_event ev = {.events = EPOLLIN};

	assert(nfds >= 1 && nfds <= MAX_LISTEN);
	if (!acc) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return ts_error_oom(err, "no memory for the acceptor");
	}
	acc->srv = srv;
	acc->ep = acc->wake = -1;
	for (int i = 0; i < nfds; i++) {
		acc->lfd[acc->nlfd++] = fds[i];
		(void)fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
	}
	srv->acceptor = acc;
	acc->ep = epoll_create1(EPOLL_CLOEXEC);
	acc->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (acc->ep < 0 || acc->wake < 0)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "ACCEPTOR",
		                    "cannot make the acceptor's descriptors: %s", strerror(errno));
	ev.data.ptr = &acc->wake;
	if (epoll_ctl(acc->ep, EPOLL_CTL_ADD, acc->wake, &ev) != 0)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "ACCEPTOR",
		                    "cannot watch the acceptor's wake: %s", strerror(errno));
	for (int i = 0; i < acc->nlfd; i++) {
		ev.data.ptr = &acc->lfd[i];
		if (epoll_ctl(acc->ep, EPOLL_CTL_ADD, acc->lfd[i], &ev) != 0)
			return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "ACCEPTOR",
			                    "cannot watch a listening socket: %s", strerror(errno));
	}
	if (pthread_create(&acc->thread, NULL, acceptor_main, acc) != 0)
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "THREAD",
		                    "cannot start the acceptor thread");
	acc->started = true;
	return TS_OK;
}

void ts__accept_stop(struct ts_server *srv)
{
	struct ts__acceptor *acc = srv->acceptor;
	struct pend_list *lists[2];

	if (!acc)
		return;
	if (acc->started) {
		uint64_t one = 1;

		(void)!write(acc->wake, &one, sizeof one);
		pthread_join(acc->thread, NULL);
	}
	lists[0] = &acc->waiting;
	lists[1] = &acc->refused;
	for (int i = 0; i < 2; i++)
		while (lists[i]->head)
			pend_close(acc, lists[i]->head, true);
	for (int i = 0; i < acc->nlfd; i++)
		close(acc->lfd[i]);
	if (acc->wake >= 0)
		close(acc->wake);
	if (acc->ep >= 0)
		close(acc->ep);
	free(acc);
	srv->acceptor = NULL;
}
