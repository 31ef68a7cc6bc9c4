/*
 * benchlib.h - what every tests/bench/bench_*.c shares: a tstaged started on
 * an ephemeral port, a keep-alive HTTP/1.1 load generator, and the row
 * printer of the one table `make bench` shows.
 *
 * The table has the columns bench | value | reference | ratio | target | ok;
 * tests/bench/run.sh prints the header once (with the same widths as
 * BENCH_ROW_FORMAT) and every bench binary prints its rows to stdout.
 * Anything else a bench says goes to stderr.
 *
 * The load generator opens one connection per client thread and sends one
 * request at a time on it (no pipelining), reading each response to its end
 * by Content-Length; it runs a warm-up, then counts the requests that finish
 * within a fixed window and records each one's latency. A load names one
 * path, or a generator that gives each request its own.
 *
 * For bulk transfers there are single requests over a raw socket (a body
 * streamed from a buffer, a response read to its end and dropped), and the
 * reference they are measured against: loopback TCP between two threads of
 * the bench, moving the same bytes the same way.
 *
 * Thread-safety: bench_load_run is called from one thread and runs its own
 * client threads; everything else belongs to the calling thread.
 */
#ifndef TS_BENCHLIB_H
#define TS_BENCHLIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- a daemon ---------------------------------------------------------------- */

struct bench_daemon {
	pid_t pid;                   /* 0 once stopped */
	int port;
	char dir[256];               /* temporary: port file, stderr */
	char port_file[300];
	char stderr_path[300];
};

/*
 * Starts $TSTAGED (default build/tstaged) with --port 0 --port-file
 * --log-level warn, then args (NULL-terminated, may be NULL), and waits up
 * to 10 s for it to listen. The daemon dies with the bench process. Returns
 * 0, or -1 after printing why (with the daemon's stderr) to stderr.
 */
int bench_daemon_start(struct bench_daemon *d, const char *const *args);

/* SIGTERM, wait (bounded), remove the files; returns the exit status
 * (128 + signal when killed, -1 when it had to be SIGKILLed). */
int bench_daemon_stop(struct bench_daemon *d);

/* ---- load ------------------------------------------------------------------------ */

struct bench_load {
	const char *method;          /* "GET" */
	const char *path;            /* "/v1/memory" */
	const char *extra_headers;   /* "Name: value\r\n..." or NULL */
	int threads;                 /* client connections, one thread each */
	double warmup_s;             /* before each window */
	double duration_s;           /* measured, in all */
	/* When set, every request's path comes from next_path instead of path:
	 * called on client thread `client` (0 .. threads-1) before each of its
	 * requests, seq counting that thread's requests from 0; it writes a
	 * NUL-terminated path of at most cap bytes into buf. Must be safe to
	 * call from several client threads at once (arg is shared). */
	void (*next_path)(void *arg, int client, uint64_t seq, char *buf, size_t cap);
	void *next_path_arg;
};

struct bench_result {
	double rate;                 /* completed requests per second in the window */
	uint64_t requests;           /* completed in the window */
	uint64_t errors;             /* non-2xx answers or broken connections */
	double p50_us, p90_us, p99_us, max_us;
	double seconds;              /* length of the window as measured */
	double cpu_us;               /* the server's CPU per request (cpu_pid), 0: not asked */
};

/* Drives load against 127.0.0.1:port. Returns 0, or -1 after printing why
 * (no connection, or every request failed). */
int bench_load_run(int port, const struct bench_load *load, struct bench_result *out);

/*
 * Compares loads fairly on a busy machine: runs each of loads[0..n) for
 * rounds rounds, interleaved (0, 1, ..., n-1, 0, 1, ...), each round a
 * warm-up and a window of duration_s / rounds, so that drift and noise
 * fall on every load alike. results[i] sums load i's rounds: rate is its
 * requests over its summed windows, percentiles are over all its requests.
 * Returns 0, or -1 after printing why.
 */
int bench_load_interleaved(int port, const struct bench_load *loads, int n, int rounds,
                           struct bench_result *results);

/* ---- bulk transfers ---------------------------------------------------------------- */

/*
 * One request on a fresh connection to 127.0.0.1:port: the head (method,
 * path, Content-Length: body_len when body_len > 0, extra_headers), then
 * body_len bytes taken from chunk (chunk_len bytes, repeated from its start
 * as often as needed), then the response read to its end (its body dropped,
 * the first reply_cap - 1 bytes kept NUL-terminated in reply when reply is
 * not NULL). *seconds is the time from the first byte sent to the last byte
 * received, *received the response body's length. Returns the status code,
 * or -1 after printing why.
 */
int bench_http_transfer(int port, const char *method, const char *path,
                        const char *extra_headers, const void *chunk, size_t chunk_len,
                        uint64_t body_len, char *reply, size_t reply_cap,
                        uint64_t *received, double *seconds);

/*
 * A model's steps through the daemon: POST /v1/models/{model}:step?wait=true
 * with the JSON body, and the answer's time.per_step_s; a negative number
 * after printing why (the status and the start of the answer).
 */
double bench_step_seconds(int port, const char *model, const char *body);

/* Opens GET /v1/trace?seconds=60 on a connection of its own and returns it
 * (the daemon records until the connection closes: close it to end the
 * trace), or -1 after printing why. */
int bench_trace_open(int port);

/*
 * The reference for bulk transfers: bytes moved from one thread of this
 * process to another over a loopback TCP connection, sent from chunk
 * (chunk_len bytes, repeated) and received into a small buffer and
 * dropped, then a one-byte answer, as an HTTP transfer does. One untimed
 * warm-up, then the best of runs. Returns bytes per second, or -1 after
 * printing why.
 */
double bench_tcp_loopback(const void *chunk, size_t chunk_len, uint64_t bytes, int runs);

/* Formats bytes per second as "2.41 GB/s" into buf; returns buf. */
const char *bench_fmt_bandwidth(char *buf, size_t cap, double bytes_per_s);


/* ---- many connections, one event loop ------------------------------------------- */

/*
 * The load generator the references share: conns connections (up to
 * BENCH_MAX_CONNS) driven by client_threads event-loop threads (epoll, each
 * owning conns / client_threads of them), every connection sending one
 * request at a time and reading its answer whole before the next (no
 * pipelining). The same loop drives tstaged, nginx, a bare libmicrohttpd
 * server (keep-alive HTTP/1.1, answers read by Content-Length) and Redis
 * (RESP: a bulk string, or an array of them for MGET), so the targets differ
 * only in the server. A warm-up, then the requests completed within the
 * window are counted and timed.
 */
#define BENCH_MAX_CONNS 1024

enum bench_proto { BENCH_PROTO_HTTP, BENCH_PROTO_RESP };

struct bench_mload {
	enum bench_proto proto;
	int conns;
	int client_threads;          /* 0: $BENCH_CLIENT_THREADS or 1 */
	double warmup_s, duration_s;
	/* the request: fixed bytes, or from next (when set) before each one:
	 * it writes request seq of connection conn into buf (at most cap bytes)
	 * and returns its length (0: an error). Called from the client threads
	 * at once; arg is shared. */
	const char *fixed;
	size_t fixed_len;
	size_t (*next)(void *arg, int conn, uint64_t seq, char *buf, size_t cap);
	void *arg;
	/* RESP: bytes each bulk string must have (0: any) */
	size_t expect_bulk;
	/* when > 0: the server's process, whose CPU time (all threads, user and
	 * system, /proc/PID/stat) in the measured windows is reported per
	 * request (bench_result.cpu_us) */
	pid_t cpu_pid;
};

/* Runs the load against 127.0.0.1:port; 0, or -1 after printing why. */
int bench_mload_run(int port, const struct bench_mload *load, struct bench_result *out);

/* Like bench_load_interleaved, for n loads on their own ports. */
int bench_mload_interleaved(const int *ports, const struct bench_mload *loads, int n, int rounds,
                            struct bench_result *results);

/* Writes "GET path HTTP/1.1" with a Host header and extra (may be NULL)
 * into buf; returns its length, 0 when it does not fit. */
size_t bench_http_get(char *buf, size_t cap, int port, const char *path, const char *extra);

/* ---- references: nginx, redis-server, a bare libmicrohttpd ------------------------ */

/*
 * A reference server started by the bench: nginx serving a directory of
 * static files, redis-server without persistence, or a bare libmicrohttpd
 * server in a child of this process. Each listens on an ephemeral loopback
 * port, keeps its files in a temporary directory, and dies with the bench.
 */
struct bench_ref {
	pid_t pid;
	int port;
	char dir[256];
};

/* nginx, as a foreground process with worker_processes workers, no access
 * log, serving the files of ref->dir/www (the caller writes them there
 * after bench_ref_dir). Returns 0, or -1 after printing why (nginx missing:
 * the command to install it). */
int bench_ref_dir(struct bench_ref *r, const char *what);
int bench_nginx_start(struct bench_ref *r, int worker_processes);

/* redis-server: no RDB, no AOF, io-threads 1. */
int bench_redis_start(struct bench_ref *r);

/*
 * A bare libmicrohttpd server with tstaged's daemon flags and options
 * (ts_http_tuning): GET /small answers small_len bytes from a static
 * buffer; GET /item?index=k the k-th (modulo BENCH_MHD_ITEMS) of
 * BENCH_MHD_ITEMS such bodies in one buffer, as an array's items lie (so
 * that a random item's bytes are as cold as tstaged's and Redis's); GET /big?bytes=N streams N bytes from a callback in 256 KiB
 * blocks, as tstaged's downloads do; PUT drops its body and answers 200.
 * It runs in a forked child.
 */
#define BENCH_MHD_ITEMS 4096
int bench_mhd_start(struct bench_ref *r, size_t small_len);

/* The same server with conn_memory bytes per connection instead of
 * TS_HTTP_CONN_MEMORY (tstaged's small daemon's): the bulk daemon's
 * TS_HTTP_CONN_MEMORY_BULK for the upload sink, or what the library's
 * per-request cost would be with another connection memory (libmicrohttpd
 * zeroes it per request). */
int bench_mhd_start_pool(struct bench_ref *r, size_t small_len, size_t conn_memory);

/* Stops a reference (SIGTERM, then SIGKILL) and removes its directory. */
void bench_ref_stop(struct bench_ref *r);

/* Sends len bytes and reads the replies of nreplies RESP commands,
 * blocking; for loading Redis. 0 or -1. */
int bench_resp_send(int port, const void *cmds, size_t len, int nreplies);

/* ---- the table ----------------------------------------------------------------------- */

/* Column widths shared with run.sh's header: bench, value, reference,
 * ratio, target, ok. */
#define BENCH_ROW_FORMAT "%-44s | %-16s | %-26s | %-6s | %-16s | %s\n"

/*
 * Prints one row. value, reference and target are already formatted (NULL
 * prints "-"); ratio is printed with two decimals unless it is NaN ("-");
 * ok is "yes"/"no", or "-" for a row without a target (has_target false).
 */
void bench_row(const char *bench, const char *value, const char *reference,
               double ratio, const char *target, bool has_target, bool ok);

/* Formats a rate as "41.2k req/s" into buf; returns buf. */
const char *bench_fmt_rate(char *buf, size_t cap, double rate);

/* Seconds a bench should measure each load for: $BENCH_SECONDS or dflt. */
double bench_seconds(double dflt);

#endif
