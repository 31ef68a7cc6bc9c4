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
 * cores) rather than a thread per connection: flat from 1 to 256
 * connections on two cores. poll, not epoll: libmicrohttpd 0.9.75's
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
 * the pool), thus the pieces an upload's body is read in, and the request
 * head (URL and headers) to about half of it. Measured on 2 cores, daemon
 * CPU per GET /v1/memory and 1 GiB upload rate: 32 KiB 13.9 us, 1.4 GB/s;
 * 64 KiB 12.5 us, 1.8 GB/s; 128 KiB 14.4 us, 1.95 GB/s; 256 KiB 21 us,
 * 2.0 GB/s; 1 MiB 42 us, 2.1 GB/s. 128 KiB is the knee.
 */
#define TS_HTTP_CONN_MEMORY ((size_t)128 * 1024)

/* Block size of a streamed response (MHD_create_response_from_callback). */
#define TS_HTTP_STREAM_BLOCK ((size_t)256 * 1024)

#endif
