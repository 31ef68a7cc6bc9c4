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
 * A thread pool (one poll loop per thread, MHD_OPTION_THREAD_POOL_SIZE =
 * cores) rather than a thread per connection: measured with a bare
 * libmicrohttpd answering 2 KiB on 2 cores, 12-13 us of CPU per request at
 * 4 connections and 15-16 us at 256, against 14-18 and 21-23 us with a
 * thread per connection. MHD_USE_TURBO and epoll measured within the noise
 * of a busy machine (no gain to take the risk for). poll, not epoll: libmicrohttpd 0.9.75's
 * edge-triggered epoll loop misses a client's close that arrives together
 * with the last body bytes, which would keep a cut-off upload's
 * reservation until the connection timeout (it_arrays' cut-off test checks
 * this).
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
 *   32 KiB  14-17 us; 16-20 us; 560 ms
 *   64 KiB  13-15 us; 17 us;    470 ms
 *  128 KiB  14-19 us; 18-59 us (memset up to half the profile); 1.3 s
 *    1 MiB  42-44 us; 40-45 us; 330 ms
 * 64 KiB keeps small requests at the 32 KiB cost and takes uploads in
 * 32 KiB pieces. Counted with callgrind (2000 keep-alive items of 12 KiB),
 * the library zeroes 96 KiB a request at 64 KiB (the pool on reset, then
 * the read buffer's half when it shrinks for the reply): 98k of the 122k
 * instructions an item takes. A bare server with 16 KiB answers an item
 * for 10.6-13.6 us of CPU where 64 KiB takes 12.6-19.8 (bench_serve's
 * "bare MHD 16 KiB pool" rows), but reads uploads in 8 KiB pieces: a 1 GiB
 * upload fell from 3.05 to 1.30 GB/s (the bare sink from 3.50 to 2.76), so
 * the pool stays at 64 KiB. One daemon cannot have both: the size is the
 * library's per daemon, not per connection.
 */
#define TS_HTTP_CONN_MEMORY ((size_t)64 * 1024)

/* Block size of a streamed response (MHD_create_response_from_callback). */
#define TS_HTTP_STREAM_BLOCK ((size_t)256 * 1024)

#endif
