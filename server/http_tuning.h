/*
 * http_tuning.h - libmicrohttpd daemon flags and option values of tstaged's
 * HTTP server (server/http.c), chosen by measurement (README, Benchmarks),
 * and shared with the bare libmicrohttpd reference server of the benches
 * (tests/bench/benchlib.c), so that the two differ only in what runs per
 * request.
 */
#ifndef TS_HTTP_TUNING_H
#define TS_HTTP_TUNING_H

#include <microhttpd.h>

/*
 * Poll loops of one thread each (one per core) rather than a thread per
 * connection: measured with a bare libmicrohttpd answering 2 KiB on 2 cores,
 * 12-13 us of CPU per request at 4 connections and 15-16 us at 256, against
 * 14-18 and 21-23 us with a thread per connection. MHD_USE_TURBO measured
 * within the noise of a busy machine. poll, not epoll: libmicrohttpd
 * 0.9.75's edge-triggered epoll loop misses a client's close that arrives
 * together with the last body bytes, which would keep a cut-off upload's
 * reservation until the connection timeout (it_arrays' cut-off test checks
 * this), and it stalls connections handed over (MHD_add_connection) with
 * their first request already read: at 256 connections an epoll worker
 * answered 2.6-11k requests/s where a poll one answers 77-87k.
 *
 * Which loop serves a connection decides how often that loop sleeps. A loop
 * that holds one or two connections of a client waiting for each answer
 * sleeps and is woken for nearly every request; one that holds four seldom
 * does. Measured with wrk (one thread, 4 connections, 12 KiB items, 2
 * cores): spread over two loops, 0.58 context switches and 17.1 us of CPU a
 * request at 51k/s; on one loop, 0.02-0.03 and 12.8 us at 73-75k/s. So the
 * acceptor fills one small-request worker to --worker-fill (default 4)
 * before the next takes any, then gives each connection to the least loaded
 * (server/accept.c, ts__worker_pick). The bulk daemon keeps a pool, which
 * places connections by their socket's number: uploads are heavy enough to
 * want every core.
 */
#define TS_HTTP_MHD_FLAGS \
	(MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC)

/*
 * Memory per connection. libmicrohttpd 0.9.75 zeroes a connection's whole
 * pool when it resets it for the next request on a keep-alive connection,
 * so this is paid on every request; it also bounds the read buffer (half
 * the pool), thus the pieces an upload's body is read in (one poll and one
 * recv each), and the request head (URL and headers) to about half of it.
 * Measured on a busy 2-core machine, daemon CPU per request at 4
 * connections (GET /v1/memory; one 12 KiB item) and per 1 GiB upload:
 *    8 KiB  10.5 us;  12.1 us (tstaged, one loop)
 *   16 KiB  -;        13.8 us (bare server); uploads 3.05 -> 1.30 GB/s
 *   32 KiB  14-17 us; 16-20 us; 560 ms
 *   64 KiB  13-15 us; 17 us;    470 ms
 *  128 KiB  14-19 us; 18-59 us (memset up to half the profile); 1.3 s
 *    1 MiB  42-44 us; 40-45 us; 330 ms
 * Counted with callgrind (2000 keep-alive items of 12 KiB), the library
 * zeroes 96 KiB a request at 64 KiB (the pool on reset, then the read
 * buffer's half when it shrinks for the reply): 98k of the 122k
 * instructions an item took; at 16 KiB, 24 KiB (25k of 46k). Counted
 * instructions overstate it (a string store of a page counts as thousands);
 * what the zeroing costs on the machine is its cache footprint: with 256
 * connections a 16 KiB pool each is 4 MiB zeroed in turn, which evicts
 * everything else a request touches. At 256 connections (wrk, as above,
 * 2 loops) 16 KiB gave GET /v1/memory 65-66k/s at 14.6-15.4 us and items
 * 48k/s at 19.7 us; 8 KiB gave 86-89k/s at 11.2-11.7 us and 70k/s at
 * 13.7 us, and at 4 connections 76k items/s where 16 KiB gave 68k.
 *
 * The size is the library's per daemon, not per connection, so tstaged runs
 * two daemons and its acceptor (server/accept.c) gives each connection the
 * one its first request needs: TS_HTTP_CONN_MEMORY for a connection that
 * opens with a request without a body (GET, HEAD, DELETE, OPTIONS), and
 * TS_HTTP_CONN_MEMORY_BULK, whose 32 KiB pieces keep uploads at the bare
 * sink's rate, for one that opens with PUT, POST or PATCH, or with a request
 * line of 4 KiB or more (a bulk connection holds a head of about 60 KiB). A
 * small-request connection still takes an upload, in 4 KiB pieces, and a
 * request head of up to about 7.5 KiB (past it, the library answers 414 or
 * 431 with its own HTML page, which no callback can replace; nginx's default
 * limit of a request line is 8 KiB too). A later head on a bulk connection
 * is held to the first head's limits by the request pipeline (http.c,
 * request_head_ok).
 */
#define TS_HTTP_CONN_MEMORY ((size_t)8 * 1024)
#define TS_HTTP_CONN_MEMORY_BULK ((size_t)64 * 1024)

/*
 * The request head every connection holds, checked by the acceptor on a
 * connection's first request before the library reads it (server/head.c),
 * and answered in JSON when passed. Measured on libmicrohttpd 0.9.75, a
 * head costs a connection its bytes plus about 64 bytes for each field
 * (header, query parameter, cookie): the bulk daemon's 64 KiB held one
 * header to a head of 65,093 bytes, 894 tiny headers, or 400 headers and
 * a head of 36 KB; the small one's 8 KiB a head of 7,881 bytes or 110
 * tiny headers. So a head may hold TS_HTTP_HEAD_MAX bytes and
 * TS_HTTP_HEAD_FIELDS_MAX fields (at most 60.5 KiB as the library counts,
 * below its 64), and one whose bytes plus TS_HTTP_FIELD_COST a field pass
 * TS_HTTP_SMALL_HEAD goes to the bulk daemon whatever its method.
 */
#define TS_HTTP_HEAD_MAX ((size_t)48 * 1024)
#define TS_HTTP_HEAD_FIELDS_MAX 200
#define TS_HTTP_FIELD_COST 64
#define TS_HTTP_SMALL_HEAD ((size_t)6 * 1024)

/* Block size of a streamed response (MHD_create_response_from_callback). */
#define TS_HTTP_STREAM_BLOCK ((size_t)256 * 1024)

#endif
