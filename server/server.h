/*
 * server.h - the tstaged process: its configuration, the core objects
 * (devices, memory), the HTTP daemon and its counters.
 *
 * All state lives in struct ts_server and is passed down; there are no
 * mutable globals. Lifecycle: ts_server_new (discovers devices, builds
 * memory, starts listening), ts_server_drain (readiness false, new work
 * refused, wait for in-flight requests and operations), ts_server_free.
 *
 * Thread-safety: after ts_server_new returns, the daemon's threads use the
 * server concurrently; only the drain flag and counters change, atomically.
 */
#ifndef TS_SERVER_H
#define TS_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "server/config.h"

struct ts_server;

/* Starts tstaged with cfg (copied). Returns a new server, or an error that
 * names what failed (bind, devices, memory, token file). */
ts_status ts_server_new(const struct ts_config *cfg, struct ts_server **out,
                        struct ts_error *err);

/* The port the daemon listens on (useful with --port 0). */
int ts_server_port(const struct ts_server *srv);

struct ts_drain_result {
	int requests;          /* still in flight when the drain ended */
	int operations;        /* cancelled at the deadline (each logged by id) */
	bool state_dir;        /* a --state-dir was saved to ... */
	bool state_saved;      /* ... and the save succeeded (else logged) */
};

/*
 * Restores the --state-dir (jobs/state.h): every persisted array and model
 * that reads back whole; until it returns /readyz answers 503 RESTORING.
 * Never fails (skips are logged and counted). Without a state dir it only
 * marks the server ready. Call once, after ts_server_new.
 */
void ts_server_restore(struct ts_server *srv);

/*
 * SIGUSR1's dump: one log line per space (bytes in use, limit, peak), the
 * catalog (arrays, bytes), the models, the operations by state and each
 * unfinished one (id, kind, target, progress), and the state dir's last
 * save. Safe from any thread.
 */
void ts_server_dump(struct ts_server *srv);

/*
 * Drains: /readyz and every new /v1 call answer 503 UNAVAILABLE (the daemon
 * keeps listening, so new clients are told, not refused), suspended waits
 * answer now, and this waits up to seconds for in-flight requests and
 * unfinished operations; at the deadline those operations are cancelled
 * and each is logged with its id. With a --state-dir, the persisted arrays
 * and models are then saved there (once the cancelled operations have
 * ended, up to 30 s more).
 */
void ts_server_drain(struct ts_server *srv, int seconds, struct ts_drain_result *out);

/* Stops the daemon and frees everything. */
void ts_server_free(struct ts_server *srv);

#endif
