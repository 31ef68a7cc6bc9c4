/*
 * benchlib.c - the benches' daemon, load generator and table rows.
 *
 * Invariants: a started daemon dies with the bench process
 * (PR_SET_PDEATHSIG); a client thread only counts and times requests that
 * complete while the window is open, and never pipelines.
 */
#include "tests/bench/benchlib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "server/http_tuning.h"
#include "tests/common/spawn.h"

#define MAX_ARGS 64
#define MAX_CLIENTS 64
#define RECV_BUF (64 * 1024)

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_s(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* ---- the daemon ----------------------------------------------------------------- */

static void remove_dir(const char *dir)
{
	char path[600];
	static const char *const names[] = {"port", "port.tmp", "stderr", "stdout"};

	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		unlink(path);
	}
	rmdir(dir);
}

static void print_stderr(const struct bench_daemon *d)
{
	FILE *f = fopen(d->stderr_path, "r");
	char line[1024];

	if (!f)
		return;
	while (fgets(line, sizeof line, f))
		fprintf(stderr, "  tstaged: %s", line);
	fclose(f);
}

static int read_port(const char *path)
{
	FILE *f = fopen(path, "r");
	int port = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%d", &port) != 1)
		port = 0;
	fclose(f);
	return port;
}

int bench_daemon_start(struct bench_daemon *d, const char *const *args)
{
	const char *tstaged = getenv("TSTAGED"), *tmp = getenv("TMPDIR");
	const char *argv[MAX_ARGS];
	uint64_t deadline;
	int n = 0, err;

	memset(d, 0, sizeof *d);
	if (!tstaged || !*tstaged)
		tstaged = "build/tstaged";
	snprintf(d->dir, sizeof d->dir, "%s/tstage-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(d->dir)) {
		fprintf(stderr, "bench: mkdtemp: %s\n", strerror(errno));
		return -1;
	}
	snprintf(d->port_file, sizeof d->port_file, "%s/port", d->dir);
	snprintf(d->stderr_path, sizeof d->stderr_path, "%s/stderr", d->dir);
	argv[n++] = tstaged;
	argv[n++] = "--port";
	argv[n++] = "0";
	argv[n++] = "--port-file";
	argv[n++] = d->port_file;
	argv[n++] = "--log-level";
	argv[n++] = "warn";
	for (; args && *args && n < MAX_ARGS - 1; args++)
		argv[n++] = *args;
	argv[n] = NULL;

	err = open(d->stderr_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (err < 0) {
		fprintf(stderr, "bench: %s: %s\n", d->stderr_path, strerror(errno));
		remove_dir(d->dir);
		return -1;
	}
	d->pid = ts_test_spawn(argv, NULL, -1, err, err, NULL);
	close(err);
	if (d->pid < 0) {
		fprintf(stderr, "bench: fork: %s\n", strerror(errno));
		remove_dir(d->dir);
		return -1;
	}
	deadline = now_ns() + 10000000000ull;
	while ((d->port = read_port(d->port_file)) <= 0) {
		int ws;

		if (waitpid(d->pid, &ws, WNOHANG) == d->pid) {
			fprintf(stderr, "bench: tstaged exited before listening:\n");
			print_stderr(d);
			d->pid = 0;
			remove_dir(d->dir);
			return -1;
		}
		if (now_ns() > deadline) {
			fprintf(stderr, "bench: tstaged did not listen within 10 s:\n");
			print_stderr(d);
			bench_daemon_stop(d);
			return -1;
		}
		sleep_s(0.005);
	}
	return 0;
}

int bench_daemon_stop(struct bench_daemon *d)
{
	uint64_t deadline = now_ns() + 20000000000ull;
	int ws = 0, st = -1;

	if (d->pid <= 0)
		return 0;
	kill(d->pid, SIGTERM);
	for (;;) {
		pid_t r = waitpid(d->pid, &ws, WNOHANG);

		if (r == d->pid) {
			st = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
			break;
		}
		if (now_ns() > deadline) {
			kill(d->pid, SIGKILL);
			waitpid(d->pid, NULL, 0);
			break;
		}
		sleep_s(0.005);
	}
	if (st != 0) {
		fprintf(stderr, "bench: tstaged stopped with status %d:\n", st);
		print_stderr(d);
	}
	d->pid = 0;
	remove_dir(d->dir);
	return st;
}

/* ---- the load generator -------------------------------------------------------------- */

struct window {
	_Atomic int open;            /* count what completes now */
	_Atomic int stop;
	_Atomic int ready;           /* event-loop threads with every connection open */
};

struct client {
	pthread_t tid;
	int port;
	int index;                   /* 0 .. threads-1 */
	const struct bench_load *load;
	const char *req;             /* the request, unless load->next_path */
	size_t req_len;
	struct window *win;
	uint64_t requests, errors;
	uint32_t *lat_ns;            /* one per counted request (capped at ~4.29 s) */
	size_t nlat, cap;
	int fd;
	char buf[RECV_BUF];
};

static int connect_to(int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct timeval tv = {5, 0};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

	if (fd < 0)
		return -1;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static bool send_all(int fd, const char *p, size_t len)
{
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

/* Content-Length of the header block [buf, buf + head); -1 when absent. */
static long long content_length(const char *buf, size_t head)
{
	const char *p = buf, *end = buf + head;

	while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
		p++;
		if ((size_t)(end - p) > 15 && strncasecmp(p, "Content-Length:", 15) == 0)
			return strtoll(p + 15, NULL, 10);
	}
	return -1;
}

/* Reads one response; returns its status code, or -1 when the connection
 * broke or the response has no Content-Length. */
static int read_response(struct client *c)
{
	size_t len = 0, head = 0;
	long long body = -1, left;
	const char *eoh = NULL;

	while (!eoh) {
		ssize_t n;

		if (len == sizeof c->buf)
			return -1;
		n = recv(c->fd, c->buf + len, sizeof c->buf - len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		len += (size_t)n;
		eoh = memmem(c->buf, len, "\r\n\r\n", 4);
	}
	head = (size_t)(eoh - c->buf) + 4;
	body = content_length(c->buf, head);
	if (body < 0 || len < 12 || strncmp(c->buf, "HTTP/1.", 7) != 0)
		return -1;
	left = (long long)head + body - (long long)len;
	if (left < 0)
		return -1;       /* more than one response: nothing is pipelined */
	while (left > 0) {
		size_t want = left < (long long)sizeof c->buf ? (size_t)left : sizeof c->buf;
		ssize_t n = recv(c->fd, c->buf, want, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		left -= n;
	}
	return atoi(c->buf + 9) ? atoi(c->buf + 9) : -1;
}

static void record(struct client *c, uint64_t ns)
{
	if (c->nlat == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 65536;
		uint32_t *grown = realloc(c->lat_ns, cap * sizeof *grown);

		if (!grown)
			return;
		c->lat_ns = grown;
		c->cap = cap;
	}
	c->lat_ns[c->nlat++] = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
}

/* The request text of a load whose paths come from its generator. */
static size_t format_request(const struct bench_load *load, int port, const char *path,
                             char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s\r\n", load->method,
	                 path, port, load->extra_headers ? load->extra_headers : "");

	return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

static void *client_main(void *arg)
{
	struct client *c = arg;
	char path[1024], req[2048];
	uint64_t seq = 0;

	c->fd = connect_to(c->port);
	while (!atomic_load_explicit(&c->win->stop, memory_order_relaxed)) {
		uint64_t t0;
		int code;

		if (c->load->next_path) {
			path[0] = '\0';
			c->load->next_path(c->load->next_path_arg, c->index, seq++, path, sizeof path);
			c->req = req;
			c->req_len = format_request(c->load, c->port, path, req, sizeof req);
		}

		if (c->fd < 0) {
			c->fd = connect_to(c->port);
			if (c->fd < 0) {
				c->errors++;
				sleep_s(0.01);
				continue;
			}
		}
		t0 = now_ns();
		code = send_all(c->fd, c->req, c->req_len) ? read_response(c) : -1;
		if (atomic_load_explicit(&c->win->open, memory_order_relaxed)) {
			if (code >= 200 && code < 300) {
				c->requests++;
				record(c, now_ns() - t0);
			} else {
				c->errors++;
			}
		}
		if (code < 0) {
			close(c->fd);
			c->fd = -1;
		}
	}
	if (c->fd >= 0)
		close(c->fd);
	return NULL;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static double percentile_us(const uint32_t *sorted, size_t n, double q)
{
	size_t i;

	if (n == 0)
		return NAN;
	i = (size_t)(q * (double)(n - 1) + 0.5);
	return (double)sorted[i] / 1000.0;
}

/* What the rounds of one load add up to. */
struct tally {
	uint64_t requests, errors;
	double seconds, cpu_s;
	uint32_t *lat_ns;
	size_t nlat, cap;
};

static bool tally_add_latencies(struct tally *t, const uint32_t *lat, size_t n)
{
	if (t->nlat + n > t->cap) {
		size_t cap = (t->nlat + n) * 2;
		uint32_t *grown = realloc(t->lat_ns, cap * sizeof *grown);

		if (!grown)
			return false;
		t->lat_ns = grown;
		t->cap = cap;
	}
	if (n)
		memcpy(t->lat_ns + t->nlat, lat, n * sizeof *lat);
	t->nlat += n;
	return true;
}

/* One warm-up and window of load with its own client threads. */
static int run_round(int port, const struct bench_load *load, double duration_s,
                     struct tally *t)
{
	struct window win = {0};
	struct client *cl;
	char req[2048];
	int nthreads = load->threads, started = 0, rc = 0;
	uint64_t t_open, t_close;

	if (nthreads < 1 || nthreads > MAX_CLIENTS)
		return -1;
	if (!load->next_path)
		format_request(load, port, load->path, req, sizeof req);
	else
		req[0] = '\0';
	cl = calloc((size_t)nthreads, sizeof *cl);
	if (!cl)
		return -1;
	for (int i = 0; i < nthreads; i++) {
		cl[i].port = port;
		cl[i].index = i;
		cl[i].load = load;
		cl[i].req = req;
		cl[i].req_len = strlen(req);
		cl[i].win = &win;
		cl[i].fd = -1;
		if (pthread_create(&cl[i].tid, NULL, client_main, &cl[i]) != 0)
			break;
		started++;
	}
	if (started < nthreads) {
		fprintf(stderr, "bench: started %d of %d client threads\n", started, nthreads);
		rc = -1;
	}
	sleep_s(load->warmup_s);
	t_open = now_ns();
	atomic_store(&win.open, 1);
	sleep_s(duration_s);
	atomic_store(&win.open, 0);
	t_close = now_ns();
	atomic_store(&win.stop, 1);
	for (int i = 0; i < started; i++) {
		pthread_join(cl[i].tid, NULL);
		t->requests += cl[i].requests;
		t->errors += cl[i].errors;
		if (!tally_add_latencies(t, cl[i].lat_ns, cl[i].nlat))
			rc = -1;
	}
	t->seconds += (double)(t_close - t_open) / 1e9;
	for (int i = 0; i < nthreads; i++)
		free(cl[i].lat_ns);
	free(cl);
	return rc;
}

static void tally_result(struct tally *t, struct bench_result *out)
{
	memset(out, 0, sizeof *out);
	qsort(t->lat_ns, t->nlat, sizeof *t->lat_ns, cmp_u32);
	out->requests = t->requests;
	out->errors = t->errors;
	out->seconds = t->seconds;
	out->rate = t->seconds > 0 ? (double)t->requests / t->seconds : 0;
	out->cpu_us = t->requests ? t->cpu_s * 1e6 / (double)t->requests : 0;
	out->p50_us = percentile_us(t->lat_ns, t->nlat, 0.50);
	out->p90_us = percentile_us(t->lat_ns, t->nlat, 0.90);
	out->p99_us = percentile_us(t->lat_ns, t->nlat, 0.99);
	out->max_us = t->nlat ? (double)t->lat_ns[t->nlat - 1] / 1000.0 : NAN;
}

int bench_load_interleaved(int port, const struct bench_load *loads, int n, int rounds,
                           struct bench_result *results)
{
	struct tally *t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
	int rc = 0;

	if (!t || n < 1 || rounds < 1) {
		free(t);
		return -1;
	}
	for (int r = 0; r < rounds && rc == 0; r++)
		for (int i = 0; i < n && rc == 0; i++)
			rc = run_round(port, &loads[i], loads[i].duration_s / rounds, &t[i]);
	for (int i = 0; i < n; i++) {
		tally_result(&t[i], &results[i]);
		if (rc == 0 && results[i].requests == 0) {
			fprintf(stderr, "bench: %s %s: no request succeeded (%llu errors)\n",
			        loads[i].method, loads[i].path ? loads[i].path : "(generated paths)",
			        (unsigned long long)results[i].errors);
			rc = -1;
		}
		free(t[i].lat_ns);
	}
	free(t);
	return rc;
}

int bench_load_run(int port, const struct bench_load *load, struct bench_result *out)
{
	return bench_load_interleaved(port, load, 1, 1, out);
}

/* ---- many connections, one event loop --------------------------------------------- */

#define MCONN_BUF (64 * 1024)

/* One connection of the event-loop generator and where its answer stands. */
struct mconn {
	int fd;
	int index;                   /* 0 .. conns-1 */
	uint64_t seq, t0;
	char req[2048];
	size_t req_len, req_off;
	bool reading;
	/* HTTP: the head gathered so far, then the body bytes still to come */
	char head[4096];
	size_t head_len;
	long long body_left;         /* -1 while in the head */
	int code;
	/* RESP: a line gathered so far, elements still to come, bulk bytes left */
	char line[64];
	size_t line_len;
	long long pending, bulk_left;
	bool resp_error;
};

struct mthread {
	pthread_t tid;
	int port;
	const struct bench_mload *load;
	struct window *win;
	struct mconn *c;
	int first, n;                /* connections first .. first + n - 1 */
	int win_threads;             /* threads of the round */
	uint64_t requests, errors;
	uint32_t *lat_ns;
	size_t nlat, cap;
	bool failed;
};

static void mrecord(struct mthread *t, uint64_t ns)
{
	if (t->nlat == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 65536;
		uint32_t *grown = realloc(t->lat_ns, cap * sizeof *grown);

		if (!grown)
			return;
		t->lat_ns = grown;
		t->cap = cap;
	}
	t->lat_ns[t->nlat++] = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
}

static bool mconn_next(struct mthread *t, struct mconn *c)
{
	const struct bench_mload *l = t->load;

	if (l->next) {
		c->req_len = l->next(l->arg, c->index, c->seq, c->req, sizeof c->req);
	} else {
		c->req_len = l->fixed_len < sizeof c->req ? l->fixed_len : 0;
		memcpy(c->req, l->fixed, c->req_len);
	}
	c->seq++;
	c->req_off = 0;
	c->reading = false;
	c->head_len = 0;
	c->body_left = -1;
	c->code = 0;
	c->line_len = 0;
	c->pending = 1;
	c->bulk_left = -1;
	c->resp_error = false;
	c->t0 = now_ns();
	return c->req_len > 0;
}

/* HTTP: takes n bytes of the answer; 1 when it is whole, 0 for more, -1 broken. */
static int http_take(struct mconn *c, const char *p, size_t n)
{
	if (c->body_left < 0) {
		size_t room = sizeof c->head - c->head_len, k = n < room ? n : room;
		const char *eoh;
		size_t hl;
		long long cl;

		memcpy(c->head + c->head_len, p, k);
		c->head_len += k;
		eoh = memmem(c->head, c->head_len, "\r\n\r\n", 4);
		if (!eoh)
			return c->head_len == sizeof c->head ? -1 : 0;
		hl = (size_t)(eoh - c->head) + 4;
		cl = content_length(c->head, hl);
		if (cl < 0 || strncmp(c->head, "HTTP/1.", 7) != 0 || c->head_len < 12)
			return -1;
		c->code = atoi(c->head + 9);
		/* the bytes of this read past the head are body */
		c->body_left = cl - (long long)(c->head_len - hl) - (long long)(n - k);
	} else {
		c->body_left -= (long long)n;
	}
	if (c->body_left < 0)
		return -1;       /* more than was asked for: nothing is pipelined */
	return c->body_left == 0;
}

/* RESP: the same, for one reply (a bulk string, or an array of them). */
static int resp_take(struct mconn *c, const char *p, size_t n, size_t expect_bulk)
{
	while (n > 0) {
		if (c->bulk_left >= 0) {
			size_t k = (long long)n < c->bulk_left ? n : (size_t)c->bulk_left;

			c->bulk_left -= (long long)k;
			p += k;
			n -= k;
			if (c->bulk_left == 0) {
				c->bulk_left = -1;
				c->pending--;
			}
			continue;
		}
		if (c->line_len == sizeof c->line)
			return -1;
		c->line[c->line_len++] = *p++;
		n--;
		if (c->line_len < 2 || c->line[c->line_len - 1] != '\n')
			continue;
		c->line[c->line_len - 2] = '\0';
		switch (c->line[0]) {
		case '*':
			c->pending += strtoll(c->line + 1, NULL, 10) - 1;
			break;
		case '$': {
			long long len = strtoll(c->line + 1, NULL, 10);

			if (len < 0 || (expect_bulk && (size_t)len != expect_bulk)) {
				c->resp_error = true;
				c->pending--;
			} else {
				c->bulk_left = len + 2;
			}
			break;
		}
		case '-':
			c->resp_error = true;
			/* fall through */
		default:
			c->pending--;
			break;
		}
		c->line_len = 0;
	}
	if (c->pending < 0)
		return -1;
	return c->pending == 0 && c->bulk_left < 0;
}

static int mconn_open(struct mthread *t, struct mconn *c, int ep)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
	int fl;

	c->fd = connect_to(t->port);
	if (c->fd < 0)
		return -1;
	fl = fcntl(c->fd, F_GETFL);
	fcntl(c->fd, F_SETFL, fl | O_NONBLOCK);
	if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) != 0) {
		close(c->fd);
		c->fd = -1;
		return -1;
	}
	return 0;
}

static void mconn_set(int ep, struct mconn *c, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = c};

	epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Sends what is left of c's request; false when the connection broke. */
static bool mconn_send(int ep, struct mconn *c)
{
	while (c->req_off < c->req_len) {
		ssize_t n = send(c->fd, c->req + c->req_off, c->req_len - c->req_off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			mconn_set(ep, c, EPOLLIN | EPOLLOUT);
			return true;
		}
		if (n <= 0)
			return false;
		c->req_off += (size_t)n;
	}
	if (!c->reading) {
		c->reading = true;
		mconn_set(ep, c, EPOLLIN);
	}
	return true;
}

static void *mthread_main(void *arg)
{
	struct mthread *t = arg;
	const struct bench_mload *l = t->load;
	struct epoll_event evs[64];
	char *buf = malloc(MCONN_BUF);
	int ep = epoll_create1(EPOLL_CLOEXEC);

	if (!buf || ep < 0)
		goto fail;
	for (int i = 0; i < t->n; i++) {
		struct mconn *c = &t->c[i];

		c->index = t->first + i;
		if (mconn_open(t, c, ep) != 0)
			goto fail;
	}
	/* the first requests go once every connection of the round is open,
	 * so that the window measures requests, not connection setup */
	atomic_fetch_add(&t->win->ready, 1);
	while (atomic_load(&t->win->ready) < t->win_threads &&
	       !atomic_load_explicit(&t->win->stop, memory_order_relaxed))
		sleep_s(0.001);
	for (int i = 0; i < t->n; i++)
		if (!mconn_next(t, &t->c[i]) || !mconn_send(ep, &t->c[i]))
			goto fail;
	while (!atomic_load_explicit(&t->win->stop, memory_order_relaxed)) {
		int ne = epoll_wait(ep, evs, 64, 20);

		for (int e = 0; e < ne; e++) {
			struct mconn *c = evs[e].data.ptr;
			int done = 0;

			if (!c->reading) {
				if (!mconn_send(ep, c))
					done = -1;
			} else {
				for (;;) {
					ssize_t n = recv(c->fd, buf, MCONN_BUF, 0);

					if (n < 0 && errno == EINTR)
						continue;
					if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
						break;
					if (n <= 0) {
						done = -1;
						break;
					}
					done = l->proto == BENCH_PROTO_HTTP
					               ? http_take(c, buf, (size_t)n)
					               : resp_take(c, buf, (size_t)n, l->expect_bulk);
					if (done != 0)
						break;
				}
			}
			if (done == 0)
				continue;
			if (atomic_load_explicit(&t->win->open, memory_order_relaxed)) {
				bool ok = done > 0 && (l->proto == BENCH_PROTO_HTTP
				                               ? c->code >= 200 && c->code < 300
				                               : !c->resp_error);

				if (ok) {
					t->requests++;
					mrecord(t, now_ns() - c->t0);
				} else {
					t->errors++;
				}
			}
			if (done < 0) {
				epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
				close(c->fd);
				if (mconn_open(t, c, ep) != 0) {
					t->errors++;
					goto fail;
				}
			}
			if (!mconn_next(t, c) || !mconn_send(ep, c))
				goto fail;
		}
	}
	goto out;
fail:
	t->failed = true;
	atomic_fetch_add(&t->win->ready, t->win_threads);  /* nobody waits for a failed thread */
out:
	for (int i = 0; i < t->n; i++)
		if (t->c[i].fd > 0)
			close(t->c[i].fd);
	if (ep >= 0)
		close(ep);
	free(buf);
	return NULL;
}

static int client_threads(const struct bench_mload *l)
{
	const char *s = getenv("BENCH_CLIENT_THREADS");
	int n = l->client_threads > 0 ? l->client_threads : (s ? atoi(s) : 1);

	if (n < 1)
		n = 1;
	return n > l->conns ? l->conns : n;
}

/* CPU seconds process pid has used (every thread, user and system); -1
 * when it cannot be read. */
static double process_cpu_s(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut, st;
	FILE *f;
	size_t n;

	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* fields after the command, which may hold spaces: state is field 3,
	 * utime 14 and stime 15 */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
	                 &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int mload_round(int port, const struct bench_mload *l, double duration_s, struct tally *ta)
{
	struct window win = {0};
	int nt, rc = 0, started = 0;
	struct mthread *th;
	struct mconn *conns;

	if (l->conns < 1 || l->conns > BENCH_MAX_CONNS)
		return -1;
	nt = client_threads(l);
	th = calloc((size_t)nt, sizeof *th);
	conns = calloc((size_t)l->conns, sizeof *conns);
	if (!th || !conns) {
		free(th);
		free(conns);
		return -1;
	}
	for (int i = 0; i < l->conns; i++)
		conns[i].fd = -1;
	for (int i = 0, first = 0; i < nt; i++) {
		int n = l->conns / nt + (i < l->conns % nt);

		th[i] = (struct mthread){.port = port, .load = l, .win = &win, .c = conns + first,
		                         .first = first, .n = n, .win_threads = nt};
		first += n;
		if (pthread_create(&th[i].tid, NULL, mthread_main, &th[i]) != 0)
			break;
		started++;
	}
	if (started < nt) {
		rc = -1;
		atomic_store(&win.stop, 1);
	}
	{
		uint64_t deadline = now_ns() + 20000000000ull;

		while (rc == 0 && atomic_load(&win.ready) < nt && now_ns() < deadline)
			sleep_s(0.001);
	}
	sleep_s(l->warmup_s);
	{
		uint64_t t_open = now_ns();
		double cpu0 = l->cpu_pid > 0 ? process_cpu_s(l->cpu_pid) : -1, cpu1;

		atomic_store(&win.open, 1);
		sleep_s(duration_s);
		atomic_store(&win.open, 0);
		ta->seconds += (double)(now_ns() - t_open) / 1e9;
		cpu1 = cpu0 >= 0 ? process_cpu_s(l->cpu_pid) : -1;
		if (cpu1 >= cpu0)
			ta->cpu_s += cpu1 - cpu0;
	}
	atomic_store(&win.stop, 1);
	for (int i = 0; i < started; i++) {
		pthread_join(th[i].tid, NULL);
		if (th[i].failed) {
			fprintf(stderr, "bench: %d connections to port %d: a connection failed\n",
			        l->conns, port);
			rc = -1;
		}
		ta->requests += th[i].requests;
		ta->errors += th[i].errors;
		if (!tally_add_latencies(ta, th[i].lat_ns, th[i].nlat))
			rc = -1;
		free(th[i].lat_ns);
	}
	free(th);
	free(conns);
	return rc;
}

int bench_mload_interleaved(const int *ports, const struct bench_mload *loads, int n, int rounds,
                            struct bench_result *results)
{
	struct tally *t = calloc((size_t)(n > 0 ? n : 1), sizeof *t);
	int rc = 0;

	if (!t || n < 1 || rounds < 1) {
		free(t);
		return -1;
	}
	for (int r = 0; r < rounds && rc == 0; r++)
		for (int i = 0; i < n && rc == 0; i++)
			rc = mload_round(ports[i], &loads[i], loads[i].duration_s / rounds, &t[i]);
	for (int i = 0; i < n; i++) {
		tally_result(&t[i], &results[i]);
		if (rc == 0 && results[i].requests == 0) {
			fprintf(stderr, "bench: port %d: no request succeeded (%llu errors)\n", ports[i],
			        (unsigned long long)results[i].errors);
			rc = -1;
		}
		free(t[i].lat_ns);
	}
	free(t);
	return rc;
}

int bench_mload_run(int port, const struct bench_mload *load, struct bench_result *out)
{
	return bench_mload_interleaved(&port, load, 1, 1, out);
}

size_t bench_http_get(char *buf, size_t cap, int port, const char *path, const char *extra)
{
	int n = snprintf(buf, cap, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s\r\n", path, port,
	                 extra ? extra : "");

	return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* ---- references: nginx, redis-server, a bare libmicrohttpd ------------------------- */

int bench_ref_dir(struct bench_ref *r, const char *what)
{
	const char *tmp = getenv("TMPDIR");
	char www[300];

	memset(r, 0, sizeof *r);
	snprintf(r->dir, sizeof r->dir, "%s/tstage-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
	if (!mkdtemp(r->dir)) {
		fprintf(stderr, "bench: mkdtemp: %s\n", strerror(errno));
		r->dir[0] = '\0';
		return -1;
	}
	snprintf(www, sizeof www, "%s/www", r->dir);
	return mkdir(www, 0700);
}

/* A loopback port nobody listens on now (bound, read, released). */
static int free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* Forks and execs argv with stdout and stderr to dir/log; the child dies
 * with the bench. */
static pid_t spawn(const char *dir, const char *const *argv)
{
	char log[300];
	pid_t pid;
	int fd;

	snprintf(log, sizeof log, "%s/log", dir);
	fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	pid = ts_test_spawn(argv, NULL, -1, fd, fd, NULL);
	close(fd);
	return pid;
}

/* Waits up to 10 s for r's port to accept; 0, or -1 after printing its log. */
static int wait_listening(struct bench_ref *r, const char *what)
{
	uint64_t deadline = now_ns() + 10000000000ull;

	for (;;) {
		int fd = connect_to(r->port), ws;

		if (fd >= 0) {
			close(fd);
			return 0;
		}
		if (waitpid(r->pid, &ws, WNOHANG) == r->pid || now_ns() > deadline) {
			char log[300], line[512];
			FILE *f;

			snprintf(log, sizeof log, "%s/log", r->dir);
			fprintf(stderr, "bench: %s did not start:\n", what);
			if ((f = fopen(log, "r")) != NULL) {
				while (fgets(line, sizeof line, f))
					fprintf(stderr, "  %s: %s", what, line);
				fclose(f);
			}
			if (waitpid(r->pid, &ws, WNOHANG) == 0) {
				kill(r->pid, SIGKILL);
				waitpid(r->pid, NULL, 0);
			}
			r->pid = 0;
			return -1;
		}
		sleep_s(0.01);
	}
}

static bool have_program(const char *name)
{
	char cmd[128];

	snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
	return system(cmd) == 0;
}

int bench_nginx_start(struct bench_ref *r, int worker_processes)
{
	static const char *const bins[] = {"nginx", "/usr/sbin/nginx"};
	const char *bin = NULL;
	char conf[300];
	FILE *f;

	for (size_t i = 0; i < sizeof bins / sizeof bins[0] && !bin; i++)
		if (have_program(bins[i]))
			bin = bins[i];
	if (!bin) {
		fprintf(stderr, "bench: nginx is not installed (make bench installs it: "
		        "TS_DEPS_EXTRA in the Makefile)\n");
		return -1;
	}
	if ((r->port = free_port()) < 0)
		return -1;
	/* a root master runs its workers as another user: they must read www */
	snprintf(conf, sizeof conf, "%s/www", r->dir);
	chmod(r->dir, 0755);
	chmod(conf, 0755);
	snprintf(conf, sizeof conf, "%s/nginx.conf", r->dir);
	if (!(f = fopen(conf, "w")))
		return -1;
	fprintf(f,
	        "daemon off;\nmaster_process on;\nworker_processes %d;\npid %s/nginx.pid;\n"
	        "error_log %s/error.log warn;\nevents { worker_connections 4096; }\n"
	        "http {\n  access_log off;\n  keepalive_requests 100000000;\n"
	        "  keepalive_timeout 300s;\n  client_body_temp_path %s;\n"
	        "  proxy_temp_path %s;\n  fastcgi_temp_path %s;\n  uwsgi_temp_path %s;\n"
	        "  scgi_temp_path %s;\n  default_type application/json;\n  sendfile on;\n"
	        "  tcp_nopush on;\n  tcp_nodelay on;\n"
	        "  server {\n    listen 127.0.0.1:%d;\n    root %s/www;\n  }\n}\n",
	        worker_processes, r->dir, r->dir, r->dir, r->dir, r->dir, r->dir, r->dir, r->port,
	        r->dir);
	fclose(f);
	{
		const char *const argv[] = {bin, "-p", r->dir, "-c", conf, "-e", "stderr", NULL};

		r->pid = spawn(r->dir, argv);
	}
	return r->pid > 0 ? wait_listening(r, "nginx") : -1;
}

int bench_redis_start(struct bench_ref *r)
{
	char port[16];

	if (!have_program("redis-server")) {
		fprintf(stderr, "bench: redis-server is not installed (make bench installs it: "
		        "TS_DEPS_EXTRA in the Makefile)\n");
		return -1;
	}
	if ((r->port = free_port()) < 0)
		return -1;
	snprintf(port, sizeof port, "%d", r->port);
	{
		const char *const argv[] = {"redis-server", "--bind", "127.0.0.1", "--port", port,
		                            "--dir", r->dir, "--save", "", "--appendonly", "no",
		                            "--protected-mode", "no", "--maxclients", "4096",
		                            "--io-threads", "1", "--daemonize", "no", NULL};

		r->pid = spawn(r->dir, argv);
	}
	return r->pid > 0 ? wait_listening(r, "redis-server") : -1;
}

int bench_resp_send(int port, const void *cmds, size_t len, int nreplies)
{
	int fd = connect_to(port), got = 0;
	char buf[4096];
	struct timeval none = {0, 0};

	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
	if (!send_all(fd, cmds, len)) {
		close(fd);
		return -1;
	}
	/* simple replies only (+OK): count the lines */
	while (got < nreplies) {
		ssize_t n = recv(fd, buf, sizeof buf, 0);

		if (n <= 0)
			break;
		for (ssize_t i = 0; i < n; i++) {
			if (buf[i] == '-')
				fprintf(stderr, "bench: redis answered an error\n");
			got += buf[i] == '\n';
		}
	}
	close(fd);
	return got == nreplies ? 0 : -1;
}

/* The bare libmicrohttpd server: the child's request handler. */
struct mhd_ref {
	char *small;                 /* BENCH_MHD_ITEMS bodies of small_len bytes */
	size_t small_len;
	char *block;
};

static ssize_t mhd_ref_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	const struct mhd_ref *m = cls;
	size_t n = max < TS_HTTP_STREAM_BLOCK ? max : TS_HTTP_STREAM_BLOCK;

	(void)pos;
	memcpy(buf, m->block, n);
	return (ssize_t)n;
}

static enum MHD_Result mhd_ref_request(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version,
                                       const char *upload_data, size_t *upload_data_size,
                                       void **req_cls)
{
	struct mhd_ref *m = cls;
	struct MHD_Response *resp;
	enum MHD_Result ret;

	(void)version;
	(void)upload_data;
	if (!*req_cls) {
		*req_cls = m;
		return MHD_YES;
	}
	if (*upload_data_size) {
		*upload_data_size = 0;      /* dropped, as a sink */
		return MHD_YES;
	}
	if (strcmp(method, "GET") == 0 && strcmp(url, "/big") == 0) {
		const char *b = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "bytes");

		resp = MHD_create_response_from_callback(b ? strtoull(b, NULL, 10) : 0,
		                                         TS_HTTP_STREAM_BLOCK, mhd_ref_read, m, NULL);
	} else if (strcmp(method, "GET") == 0 && strcmp(url, "/item") == 0) {
		const char *k = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "index");
		size_t i = k ? (size_t)strtoull(k, NULL, 10) % BENCH_MHD_ITEMS : 0;

		resp = MHD_create_response_from_buffer(m->small_len, m->small + i * m->small_len,
		                                       MHD_RESPMEM_PERSISTENT);
	} else if (strcmp(method, "GET") == 0) {
		resp = MHD_create_response_from_buffer(m->small_len, m->small,
		                                       MHD_RESPMEM_PERSISTENT);
	} else {
		resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	}
	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

static void mhd_ref_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                              enum MHD_RequestTerminationCode toe)
{
	(void)cls;
	(void)conn;
	(void)toe;
	*req_cls = NULL;
}

int bench_mhd_start(struct bench_ref *r, size_t small_len)
{
	return bench_mhd_start_pool(r, small_len, TS_HTTP_CONN_MEMORY);
}

int bench_mhd_start_pool(struct bench_ref *r, size_t small_len, size_t conn_memory)
{
	pid_t parent = getpid();
	long cores = sysconf(_SC_NPROCESSORS_ONLN);

	if ((r->port = free_port()) < 0)
		return -1;
	fflush(NULL);
	r->pid = fork();
	if (r->pid == 0) {
		struct mhd_ref m = {.small = malloc(small_len * BENCH_MHD_ITEMS + 1),
		                    .small_len = small_len, .block = malloc(TS_HTTP_STREAM_BLOCK)};
		struct MHD_Daemon *d;
		sigset_t none;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent || !m.small || !m.block)
			_exit(127);
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		for (size_t i = 0; i < small_len * BENCH_MHD_ITEMS; i++)
			m.small[i] = (char)('a' + (i / small_len) % 26);
		memset(m.block, 'y', TS_HTTP_STREAM_BLOCK);
		/* tstaged's flags and options (server/http_tuning.h), but for
		 * the connection memory when conn_memory says otherwise */
		d = MHD_start_daemon(TS_HTTP_MHD_FLAGS, (uint16_t)r->port, NULL, NULL,
		                     mhd_ref_request, &m,
		                     MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)(cores > 0 ? cores : 1),
		                     MHD_OPTION_NOTIFY_COMPLETED, mhd_ref_completed, &m,
		                     MHD_OPTION_CONNECTION_MEMORY_LIMIT, conn_memory,
		                     MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)300,
		                     MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
		                     MHD_OPTION_END);
		if (!d)
			_exit(126);
		for (;;)
			pause();
	}
	if (r->pid < 0)
		return -1;
	return wait_listening(r, "bare libmicrohttpd");
}

void bench_ref_stop(struct bench_ref *r)
{
	char path[600];

	if (r->pid > 0) {
		uint64_t deadline = now_ns() + 5000000000ull;

		kill(r->pid, SIGTERM);
		while (waitpid(r->pid, NULL, WNOHANG) == 0) {
			if (now_ns() > deadline) {
				kill(r->pid, SIGKILL);
				waitpid(r->pid, NULL, 0);
				break;
			}
			sleep_s(0.005);
		}
		r->pid = 0;
	}
	if (!r->dir[0])
		return;
	snprintf(path, sizeof path, "rm -rf '%s'", r->dir);
	if (system(path) != 0)
		fprintf(stderr, "bench: cannot remove %s\n", r->dir);
	r->dir[0] = '\0';
}

/* ---- bulk transfers ----------------------------------------------------------------- */

#define BULK_BUF (1u << 20)

/* Sends len bytes of chunk repeated (from its start) until total have gone. */
static bool send_repeated(int fd, const char *chunk, size_t chunk_len, uint64_t total)
{
	uint64_t sent = 0;

	while (sent < total) {
		size_t off = (size_t)(sent % chunk_len), n = chunk_len - off;
		ssize_t got;

		if ((uint64_t)n > total - sent)
			n = (size_t)(total - sent);
		got = send(fd, chunk + off, n, MSG_NOSIGNAL);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return false;
		sent += (uint64_t)got;
	}
	return true;
}

/* Reads one response to its end: status code, or -1. The body is dropped
 * but for its first reply_cap - 1 bytes; *received is its length. */
static int read_bulk_response(int fd, char *buf, char *reply, size_t reply_cap,
                              uint64_t *received)
{
	size_t len = 0, head, keep = 0;
	const char *eoh = NULL;
	long long body, left;
	int code;

	while (!eoh) {
		ssize_t n = recv(fd, buf + len, BULK_BUF - len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (len += (size_t)n) == BULK_BUF)
			return -1;
		eoh = memmem(buf, len, "\r\n\r\n", 4);
	}
	head = (size_t)(eoh - buf) + 4;
	body = content_length(buf, head);
	if (body < 0 || strncmp(buf, "HTTP/1.", 7) != 0)
		return -1;
	code = atoi(buf + 9);
	left = body - (long long)(len - head);
	if (reply && reply_cap) {
		keep = len - head < reply_cap - 1 ? len - head : reply_cap - 1;
		memcpy(reply, buf + head, keep);
		reply[keep] = '\0';
	}
	while (left > 0) {
		ssize_t n = recv(fd, buf, left < BULK_BUF ? (size_t)left : BULK_BUF, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		if (reply && keep + 1 < reply_cap) {
			size_t k = (size_t)n < reply_cap - 1 - keep ? (size_t)n : reply_cap - 1 - keep;

			memcpy(reply + keep, buf, k);
			keep += k;
			reply[keep] = '\0';
		}
		left -= n;
	}
	*received = (uint64_t)body;
	return code;
}

int bench_http_transfer(int port, const char *method, const char *path,
                        const char *extra_headers, const void *chunk, size_t chunk_len,
                        uint64_t body_len, char *reply, size_t reply_cap,
                        uint64_t *received, double *seconds)
{
	char head[2048], *buf = malloc(BULK_BUF);
	int fd = connect_to(port), n, code = -1;
	struct timeval none = {0, 0};
	uint64_t t0;

	if (reply && reply_cap)
		reply[0] = '\0';
	if (fd < 0 || !buf) {
		fprintf(stderr, "bench: %s %s: cannot connect to port %d\n", method, path, port);
		goto out;
	}
	/* a bulk transfer may take longer than the load generator's 5 s */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
	if (body_len)
		n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
		             "Content-Length: %llu\r\n%s\r\n", method, path, port,
		             (unsigned long long)body_len, extra_headers ? extra_headers : "");
	else
		n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s\r\n",
		             method, path, port, extra_headers ? extra_headers : "");
	t0 = now_ns();
	if (n <= 0 || (size_t)n >= sizeof head || !send_all(fd, head, (size_t)n) ||
	    (body_len && !send_repeated(fd, chunk, chunk_len, body_len))) {
		fprintf(stderr, "bench: %s %s: sending failed: %s\n", method, path, strerror(errno));
		goto out;
	}
	code = read_bulk_response(fd, buf, reply, reply_cap, received);
	*seconds = (double)(now_ns() - t0) / 1e9;
	if (code < 0)
		fprintf(stderr, "bench: %s %s: no whole response\n", method, path);
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return code;
}

struct tcp_sink {
	int listen_fd;
	uint64_t bytes;
	int runs;
	bool ok;
};

/* The receiving thread: each run, bytes in, one byte back. */
static void *tcp_sink_main(void *arg)
{
	struct tcp_sink *s = arg;
	char *buf = malloc(BULK_BUF);
	int fd = accept(s->listen_fd, NULL, NULL), one = 1;

	s->ok = fd >= 0 && buf;
	if (fd >= 0)
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	for (int r = 0; s->ok && r < s->runs; r++) {
		uint64_t left = s->bytes;

		while (left > 0) {
			ssize_t n = recv(fd, buf, left < BULK_BUF ? (size_t)left : BULK_BUF, 0);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				s->ok = false;
				break;
			}
			left -= (uint64_t)n;
		}
		if (s->ok && !send_all(fd, "k", 1))
			s->ok = false;
	}
	if (fd >= 0)
		close(fd);
	free(buf);
	return NULL;
}

double bench_tcp_loopback(const void *chunk, size_t chunk_len, uint64_t bytes, int runs)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof sa;
	struct tcp_sink sink = {.bytes = bytes, .runs = runs + 1};
	pthread_t tid;
	double best = -1;
	int fd = -1;
	char ack;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sink.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (sink.listen_fd < 0 || bind(sink.listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
	    listen(sink.listen_fd, 1) != 0 ||
	    getsockname(sink.listen_fd, (struct sockaddr *)&sa, &sl) != 0 ||
	    pthread_create(&tid, NULL, tcp_sink_main, &sink) != 0) {
		fprintf(stderr, "bench: loopback: %s\n", strerror(errno));
		if (sink.listen_fd >= 0)
			close(sink.listen_fd);
		return -1;
	}
	fd = connect_to(ntohs(sa.sin_port));
	if (fd >= 0) {
		struct timeval none = {0, 0};

		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
	}
	for (int r = 0; fd >= 0 && r <= runs; r++) {
		uint64_t t0 = now_ns();
		double bps;

		if (!send_repeated(fd, chunk, chunk_len, bytes) || recv(fd, &ack, 1, MSG_WAITALL) != 1) {
			best = -1;
			break;
		}
		bps = (double)bytes / ((double)(now_ns() - t0) / 1e9);
		if (r > 0 && bps > best)      /* run 0 warms up */
			best = bps;
	}
	if (fd >= 0)
		close(fd);
	else
		shutdown(sink.listen_fd, SHUT_RDWR);
	pthread_join(tid, NULL);
	close(sink.listen_fd);
	if (best < 0 || !sink.ok) {
		fprintf(stderr, "bench: loopback transfer failed\n");
		return -1;
	}
	return best;
}

const char *bench_fmt_bandwidth(char *buf, size_t cap, double bytes_per_s)
{
	if (bytes_per_s >= 1e9)
		snprintf(buf, cap, "%.2f GB/s", bytes_per_s / 1e9);
	else
		snprintf(buf, cap, "%.0f MB/s", bytes_per_s / 1e6);
	return buf;
}

/* ---- the table ------------------------------------------------------------------------ */

void bench_row(const char *bench, const char *value, const char *reference,
               double ratio, const char *target, bool has_target, bool ok)
{
	char r[32];

	if (isnan(ratio))
		snprintf(r, sizeof r, "-");
	else
		snprintf(r, sizeof r, "%.2f", ratio);
	printf(BENCH_ROW_FORMAT, bench, value ? value : "-", reference ? reference : "-", r,
	       target ? target : "-", has_target ? (ok ? "yes" : "no") : "-");
	fflush(stdout);
}

const char *bench_fmt_rate(char *buf, size_t cap, double rate)
{
	if (rate >= 1e6)
		snprintf(buf, cap, "%.2fM req/s", rate / 1e6);
	else if (rate >= 1e4)
		snprintf(buf, cap, "%.1fk req/s", rate / 1e3);
	else
		snprintf(buf, cap, "%.0f req/s", rate);
	return buf;
}

double bench_seconds(double dflt)
{
	const char *s = getenv("BENCH_SECONDS");
	double v = s ? strtod(s, NULL) : 0;

	return v > 0 ? v : dflt;
}

/* ---- a model's steps, a trace ------------------------------------------------------- */

#define STEP_REPLY_CAP (1u << 20)

double bench_step_seconds(int port, const char *model, const char *body)
{
	char path[256], *reply = malloc(STEP_REPLY_CAP);
	json_t *root, *t;
	double per = -1, s;
	uint64_t got;
	int st;

	if (!reply)
		return -1;
	snprintf(path, sizeof path, "/v1/models/%s:step?wait=true", model);
	st = bench_http_transfer(port, "POST", path, "Content-Type: application/json\r\n", body,
	                         strlen(body), strlen(body), reply, STEP_REPLY_CAP, &got, &s);
	if (st != 200) {
		fprintf(stderr, "bench: %s:step answered %d: %.400s\n", model, st, reply);
		free(reply);
		return -1;
	}
	root = json_loads(reply, 0, NULL);
	t = root ? json_object_get(json_object_get(root, "time"), "per_step_s") : NULL;
	if (json_is_number(t))
		per = json_number_value(t);
	else
		fprintf(stderr, "bench: no time.per_step_s in %s's step result\n", model);
	json_decref(root);
	free(reply);
	return per;
}

int bench_trace_open(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	static const char req[] = "GET /v1/trace?seconds=60 HTTP/1.1\r\nHost: bench\r\n\r\n";
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
	    send(fd, req, sizeof req - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof req - 1)) {
		fprintf(stderr, "bench: GET /v1/trace: %s\n", strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}
