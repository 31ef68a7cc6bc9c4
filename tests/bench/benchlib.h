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
