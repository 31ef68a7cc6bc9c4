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
 * Memory per connection. libmicrohttpd zeroes a connection's whole pool
 * when it resets it for the next request on a keep-alive connection, so
 * this is paid on every request: 1 MiB made a small request ~3x dearer. It
 * also bounds the read buffer, thus the body pieces an upload is handed
 * (about half of it: 16 KiB), which measured no slower than 512 KiB pieces
 * for 1 GiB uploads, and the request head (URL and headers) to about 16 KiB.
 */
#define TS_HTTP_CONN_MEMORY ((size_t)32 * 1024)

/* Block size of a streamed response (MHD_create_response_from_callback). */
#define TS_HTTP_STREAM_BLOCK ((size_t)256 * 1024)

#endif
