/*
 * server_routes.h - the routes the server answers itself, because they read
 * server state: readiness (draining, device health) and the metrics
 * exposition (request counters); and the documents built into the binary
 * (assets.c): the OpenAPI description and the dashboard page; and the fleet
 * view (fleet.c), which reads the peers' poller, and the tickets of the
 * fleet's data port (fleet_ucx.c); and the memory history
 * (memory_history.c), which reads the sampler's rings; and the trace
 * (tracing.c), which records while it waits.
 */
#ifndef TS_SERVER_ROUTES_H
#define TS_SERVER_ROUTES_H

#include "server/fleet_recv.h"
#include "server/router.h"

ts_server_handler_fn ts_s_readyz;
ts_server_handler_fn ts_s_metrics;
ts_server_handler_fn ts_s_openapi;
ts_server_handler_fn ts_s_dashboard;
ts_server_handler_fn ts_s_fleet;         /* fleet.c */
ts_server_handler_fn ts_s_history;       /* memory_history.c */
ts_server_handler_fn ts_s_fleet_ticket;  /* fleet.c */
ts_server_handler_fn ts_s_trace;         /* tracing.c */

#endif
