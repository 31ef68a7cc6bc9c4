/*
 * server.c - tstaged's lifecycle: start (devices, memory, token, listen),
 * the server-answered routes (readiness, metrics), drain and stop.
 */
#include "server/history.h"
#include "server/server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "common/units.h"
#include "common/utf8.h"
#include "common/version.h"
#include "server/cgroup.h"
#include "server/router.h"
#include "handlers/handlers.h"
#include "server/server_routes.h"
#include "storage/array.h"
#include "ops/operation.h"
#include "storage/sharding.h"
#include "memory/space.h"
#include "storage/stage.h"
#include "train/model.h"
#include "jobs/state.h"
#include "server/fleet_xfer.h"

/* How long an endpoint on the fleet port may take to present its ticket. */
#define FLEET_HELLO_MS 5000

/* The fleet's peers are asked for their node this often, each given this
 * long to answer: one that stops answering is unreachable within about two
 * seconds, and GET /v1/fleet never waits on a peer (server/fleet.h). */
#define FLEET_POLL_MS 1000
#define FLEET_TIMEOUT_MS 1000

/* How long the drain's save waits for cancelled operations to end. */
#define DRAIN_SAVE_WAIT_NS (30ull * 1000000000ull)

static bool loopback(const char *addr)
{
	return strncmp(addr, "127.", 4) == 0 || strcmp(addr, "::1") == 0;
}

static ts_status load_token(struct ts_server *srv, struct ts_error *err)
{
	FILE *f;
	size_t n;

	if (!srv->cfg.token_file[0]) {
		if (!loopback(srv->cfg.bind) && !srv->cfg.insecure)
			return ts_error_set(err, TS_FAILED_PRECONDITION, "INSECURE_BIND",
			                    "refusing to listen on non-loopback address '%s' without "
			                    "--token-file (pass --insecure to allow it)",
			                    srv->cfg.bind);
		return TS_OK;
	}
	f = fopen(srv->cfg.token_file, "r");
	if (!f)
		return ts_error_set(err, ts_status_from_errno(errno), "TOKEN_FILE",
		                    "cannot read token file '%s': %s", srv->cfg.token_file,
		                    strerror(errno));
	n = fread(srv->token, 1, sizeof srv->token, f);
	fclose(f);
	if (n == sizeof srv->token)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "TOKEN_FILE",
		                    "token in '%s' is longer than %zu bytes", srv->cfg.token_file,
		                    sizeof srv->token - 1);
	while (n && (srv->token[n - 1] == '\n' || srv->token[n - 1] == '\r' ||
	             srv->token[n - 1] == ' '))
		n--;
	srv->token[n] = '\0';
	srv->token_len = n;
	if (n < 16)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "TOKEN_FILE",
		                    "token in '%s' is shorter than 16 characters",
		                    srv->cfg.token_file);
	return TS_OK;
}

static ts_status pick_default_device(struct ts_server *srv, struct ts_error *err)
{
	struct ts_device_set *set = srv->devices;
	enum ts_backend_kind def = ts_device_set_default_backend(set);

	if (srv->cfg.default_device[0]) {
		srv->core.default_device = ts_device_set_find(set, srv->cfg.default_device);
		if (!srv->core.default_device)
			return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_DEFAULT_DEVICE",
			                    "--default-device '%s' is not a device of this node",
			                    srv->cfg.default_device);
		return TS_OK;
	}
	for (size_t i = 0; i < ts_device_set_count(set); i++) {
		struct ts_device *d = ts_device_set_at(set, i);

		if (ts_device_props(d)->backend == def) {
			srv->core.default_device = d;
			return TS_OK;
		}
	}
	return ts_error_set(err, TS_INTERNAL, "NO_DEVICE", "no device found");
}

/* One line per device found, with what a scrape joins on. */
static void log_device_list(const struct ts_server *srv)
{
	for (size_t i = 0; i < ts_device_set_count(srv->devices); i++) {
		const struct ts_device_props *p = ts_device_props(ts_device_set_at(srv->devices, i));

		ts_log_json(TS_LOG_INFO,
		            json_pack("{s:s, s:s, s:s, s:o*, s:s, s:I, s:b, s:s, s:s}", "event", "device",
		                      "device", p->id, "backend", ts_backend_name(p->backend), "name",
		                      ts_json_text(p->name), "host", p->host, "total_memory_bytes",
		                      (json_int_t)p->total_memory, "simulated", p->simulated,
		                      "gpu_uuid", p->uuid, "pci_bus_id", p->pci_bus_id),
		            "device %s: %s", p->id, p->name);
	}
}

/*
 * The configuration in effect once defaults, the environment, flags and the
 * cgroup's budgets are applied (the token itself is never logged).
 */
static void log_start(const struct ts_server *srv)
{
	const struct ts_config *c = &srv->cfg;
	uint64_t limit[TS_MEM_KIND_COUNT] = {0}, keep = 0;

	for (size_t i = 0; i < ts_memory_pool_count(srv->memory); i++) {
		struct ts_pool_stats ps;

		ts_memory_pool_stats(srv->memory, i, &ps);
		/* node-wide: the sum of the pinned pools of the NUMA nodes */
		if (!ps.device)
			limit[ps.kind] += ps.limit;
		if (ps.segmented)
			keep += ps.keep_bytes;
	}
	static const char *const levels[] = {"debug", "info", "warn", "error"};
	json_t *f;

	f = json_pack(
		"{s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:f, s:b, s:I, s:I, s:I, s:s, s:s, s:s, s:b, s:b,"
		" s:i, s:s, s:I, s:I, s:i, s:i, s:i, s:i, s:I}",
		"event", "start", "version", ts_version, "bind", c->bind, "port", srv->port,
		"threads", c->threads, "sim_devices", c->sim_devices,
		"sim_device_memory", (json_int_t)c->sim_device_memory,
		"device_memory_fraction", c->device_memory_fraction, "preallocate", c->preallocate,
		"pinned_host_limit", (json_int_t)limit[TS_MEM_PINNED_HOST],
		"pinned_host_keep", (json_int_t)keep,
		"unpinned_host_limit", (json_int_t)limit[TS_MEM_UNPINNED_HOST],
		"default_memory_kind", ts_memory_kind_name(c->default_memory_kind),
		"default_device", ts_device_props(srv->core.default_device)->id,
		"log_level", levels[c->log_level], "cuda", c->cuda, "token_required",
		srv->token_len > 0, "drain_seconds", c->drain_seconds, "data_dir", c->data_dir,
		"import_header_limit", (json_int_t)c->import_header_limit,
		"import_header_budget", (json_int_t)c->import_header_budget,
		"max_connections", c->max_connections, "max_connections_per_ip",
		c->max_connections_per_ip, "connection_timeout", c->connection_timeout,
		"body_idle_timeout", c->body_idle_timeout, "body_min_rate",
		(json_int_t)c->body_min_rate);
	if (f) {
		json_object_set_new(f, "topology_file", ts_json_text(c->topology_file));
		json_object_set_new(f, "sim_numa_nodes", json_string(c->sim_numa_nodes));
		json_object_set_new(f, "sim_peer_links", json_string(c->sim_peer_links));
	}

	ts_log_json(TS_LOG_INFO, f, "tstaged %s starting with this configuration", ts_version);
}

static void log_devices(const struct ts_server *srv)
{
	for (int k = 0; k < TS_BACKEND_COUNT; k++) {
		struct ts_backend_info bi;
		char fields[352], detail[240];

		ts_device_set_backend(srv->devices, (enum ts_backend_kind)k, &bi);
		snprintf(fields, sizeof fields,
		         "\"event\":\"backend\",\"backend\":\"%s\",\"compiled\":%s,\"devices\":%d,"
		         "\"detail\":\"%s\"",
		         ts_backend_name(bi.kind), bi.compiled ? "true" : "false", bi.device_count,
		         ts_json_escape(detail, sizeof detail, bi.detail));
		if (bi.kind == TS_BACKEND_CUDA && bi.compiled && !bi.available)
			ts_log(TS_LOG_WARN, fields, "cuda backend unavailable, falling back: %s",
			       bi.detail);
		else if (!bi.compiled)
			ts_log(TS_LOG_INFO, fields, "%s backend not compiled into this build",
			       ts_backend_name(bi.kind));
		else
			ts_log(TS_LOG_INFO, fields, "%s backend: %d device%s (%s)",
			       ts_backend_name(bi.kind), bi.device_count, bi.device_count == 1 ? "" : "s",
			       bi.detail);
	}
}

/* The node's NUMA topology and where each device sits in it: loaded, placed
 * and logged (one line, GET /v1/topology's body) before the pools exist. */
static ts_status discover_topology(struct ts_server *srv, struct ts_error *err)
{
	int sim_numa[64];
	size_t nsim = 0;
	struct ts_core view = {.env = {.devices = srv->devices}};
	ts_status st;
	json_t *f;

	if (srv->cfg.sim_numa_nodes[0]) {
		st = ts_topology_parse_list(srv->cfg.sim_numa_nodes, sim_numa,
		                            sizeof sim_numa / sizeof sim_numa[0], &nsim, err);
		if (st != TS_OK)
			return st;
	}
	st = ts_topology_new(&(struct ts_topology_config){
	                             .xml_file = srv->cfg.topology_file,
	                             .sim_peer_links = srv->cfg.sim_peer_links,
	                             .sim_numa_nodes = srv->cfg.sim_numa_nodes[0] ? sim_numa : NULL,
	                             .sim_numa_count = nsim},
	                     srv->devices, &srv->topology, err);
	if (st != TS_OK)
		return st;
	view.topology = srv->topology;
	f = ts_h_topology_json(&view);
	if (f)
		json_object_set_new(f, "event", json_string("topology"));
	ts_log_json(TS_LOG_INFO, f, "topology from %s: %zu NUMA node%s, discovered in %.1f ms",
	            ts_topology_source(srv->topology), ts_topology_numa_count(srv->topology),
	            ts_topology_numa_count(srv->topology) == 1 ? "" : "s",
	            (double)ts_topology_discovery_ns(srv->topology) / 1e6);
	return TS_OK;
}

/* Leases map host memory into clients: which pages they are handed. */
static void log_lease_pages(void)
{
	char mode[32], fields[96];
	bool huge = ts_host_shmem_huge(mode, sizeof mode);

	snprintf(fields, sizeof fields, "\"event\":\"lease_pages\",\"shmem_enabled\":\"%s\"", mode);
	if (huge)
		ts_log(TS_LOG_INFO, fields, "leased host memory takes 2 MiB pages (shmem_enabled is %s)",
		       mode);
	else
		ts_log(TS_LOG_INFO, fields,
		       "leased host memory takes 4 KiB pages: transparent_hugepage/shmem_enabled is "
		       "'%s', and 'advise' lets a lease's first mapping of 1 GiB build 512 page "
		       "table entries instead of 262144", mode);
}

static ts_status write_port_file(const struct ts_server *srv, struct ts_error *err)
{
	char tmp[600];
	FILE *f;

	if (!srv->cfg.port_file[0])
		return TS_OK;
	snprintf(tmp, sizeof tmp, "%s.tmp", srv->cfg.port_file);
	f = fopen(tmp, "w");
	if (!f || fprintf(f, "%d\n", srv->port) < 0 || fclose(f) != 0 ||
	    rename(tmp, srv->cfg.port_file) != 0)
		return ts_error_set(err, ts_status_from_errno(errno), "PORT_FILE",
		                    "cannot write port file '%s': %s", srv->cfg.port_file,
		                    strerror(errno));
	return TS_OK;
}

/*
 * Inside a container the node's RAM is not what the process may use: host
 * budgets left to their defaults become the same fractions (a quarter
 * pinned, a half pageable) of the cgroup memory limit when it is smaller,
 * so an upload past it is refused with 429 instead of the kernel's OOM kill.
 */
static void container_budgets(const struct ts_config *cfg, struct ts_memory_config *mcfg)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
	uint64_t limit;
	char fields[160];

	if (mcfg->pinned_host_limit && mcfg->unpinned_host_limit)
		return;
	if (!ts_cgroup_memory_limit(cfg->cgroup_root, TS_CGROUP_SELF, &limit) || limit >= phys)
		return;
	if (!mcfg->pinned_host_limit)
		mcfg->pinned_host_limit = limit / 4;
	if (!mcfg->unpinned_host_limit)
		mcfg->unpinned_host_limit = limit / 2;
	snprintf(fields, sizeof fields,
	         "\"cgroup_memory_limit\":%llu,\"pinned_host_limit\":%llu,\"unpinned_host_limit\":%llu",
	         (unsigned long long)limit, (unsigned long long)mcfg->pinned_host_limit,
	         (unsigned long long)mcfg->unpinned_host_limit);
	ts_log(TS_LOG_INFO, fields, "host budgets follow the cgroup memory limit");
}

/*
 * Every operation's end: counted in the metrics, and one log line with its
 * kind, outcome, times and what it moved (a failure at warn, with the
 * error's status, reason and message).
 */
static void operation_ended(void *cls, const struct ts_op_end *end)
{
	bool failed = end->state == TS_OP_FAILED;
	json_t *f;

	ts_metrics_operation_ended(cls, end);
	if (!ts_log_enabled(failed ? TS_LOG_WARN : TS_LOG_INFO))
		return;
	f = json_pack("{s:s, s:s, s:o*, s:s, s:f, s:f, s:I, s:I, s:s}", "operation", end->id,
	              "kind", end->kind, "target", end->target[0] ? ts_json_text(end->target) : NULL,
	              "outcome", ts_metrics_outcome_name(end->state),
	              "duration_ms", (double)(end->run_ns / 1000) / 1e3,
	              "queued_ms", (double)(end->queued_ns / 1000) / 1e3,
	              "done", (json_int_t)end->done_units, "total", (json_int_t)end->total_units,
	              "unit", end->unit);
	if (f && strcmp(end->unit, "bytes") == 0)
		json_object_set_new(f, "bytes", json_integer((json_int_t)end->done_units));
	if (f && end->error && end->error->status != TS_OK)
		json_object_set_new(f, "error",
		                    json_pack("{s:s, s:s, s:o*}", "status",
		                              ts_status_name(end->error->status), "reason",
		                              end->error->reason, "message",
		                              ts_json_text(end->error->message)));
	ts_log_json(failed ? TS_LOG_WARN : TS_LOG_INFO, f, "operation %s %s %s", end->id, end->kind,
	            ts_metrics_outcome_name(end->state));
}

/* The fleet's data port, on when the daemon has peers or --fleet-port is
 * given: --fleet-port, else the port after --port (the kernel's choice
 * when --port is 0). */
static ts_status fleet_ucx_start(struct ts_server *srv, struct ts_error *err)
{
	const struct ts_config *cfg = &srv->cfg;
	int port = cfg->fleet_port ? cfg->fleet_port : cfg->port ? cfg->port + 1 : 0;

	if (!cfg->peers[0] && !cfg->peers_dns[0] && !cfg->fleet_port)
		return TS_OK;
	if (port > 65535)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "FLEET_PORT",
		                    "--port %d leaves no port after it for the fleet: give --fleet-port",
		                    cfg->port);
	srv->fleet_recv = ts_fleet_recv_new();
	if (!srv->fleet_recv)
		return ts_error_oom(err, "no memory for the fleet's receives");
	if (ts_fleet_link_new(&srv->fleet_link, err) != TS_OK)
		return err->status;
	return ts_fleet_ucx_new(&(struct ts_fleet_ucx_config){.bind = cfg->bind, .port = port,
	                                                      .hello_timeout_ms = FLEET_HELLO_MS,
	                                                      .tick = ts_fleet_recv_tick,
	                                                      .tick_cls = srv,
	                                                      .land = ts_fleet_recv_land,
	                                                      .landed = ts_fleet_recv_landed,
	                                                      .failed = ts_fleet_recv_failed},
	                        srv->metrics, &srv->fleet_ucx, err);
}

ts_status ts_server_new(const struct ts_config *cfg, struct ts_server **out,
                        struct ts_error *err)
{
	struct ts_server *srv = calloc(1, sizeof *srv);
	struct ts_device_config dcfg;
	struct ts_memory_config mcfg;
	unsigned char rnd[4] = {0};
	ts_status st;

	if (!srv)
		return ts_error_oom(err, "no memory for the server");
	srv->cfg = *cfg;
	ts_log_set_level(cfg->log_level);
	if (getrandom(rnd, sizeof rnd, 0) < 0)
		memcpy(rnd, &srv, sizeof rnd);
	snprintf(srv->id_prefix, sizeof srv->id_prefix, "%02x%02x%02x%02x", rnd[0], rnd[1],
	         rnd[2], rnd[3]);
	st = load_token(srv, err);
	if (st != TS_OK)
		goto out_free;

	dcfg = (struct ts_device_config){
		.sim_devices = cfg->sim_devices,
		.sim_device_memory = cfg->sim_device_memory,
		.cuda = cfg->cuda,
		.host = cfg->host_name[0] ? cfg->host_name : NULL,
		/* the lease service shares pinned memory too */
		.shareable_pinned = cfg->unix_socket[0] != '\0',
	};
	st = ts_device_set_new(&dcfg, &srv->devices, err);
	if (st != TS_OK)
		goto out_free;
	st = ts__trace_start(srv, err);
	if (st != TS_OK)
		goto out_free;
	log_devices(srv);
	log_device_list(srv);
	st = discover_topology(srv, err);
	if (st != TS_OK)
		goto out_free;
	ts_device_set_topology(srv->devices, srv->topology);
	mcfg = (struct ts_memory_config){
		.device_memory_fraction = cfg->device_memory_fraction,
		.pinned_host_limit = cfg->pinned_host_limit,
		.unpinned_host_limit = cfg->unpinned_host_limit,
		.pinned_host_keep = cfg->pinned_host_keep.bytes == TS_CONFIG_SIZE_DEFAULT ? 0
		                    : cfg->pinned_host_keep.bytes == 0 ? TS_PINNED_KEEP_NONE
		                    : cfg->pinned_host_keep.bytes,
		.pinned_host_keep_share = cfg->pinned_host_keep.share,
		.preallocate = cfg->preallocate,
		.topology = srv->topology,
	};
	st = ts_memory_parse_numa_split(cfg->pinned_host_numa_split, &mcfg, err);
	if (st != TS_OK)
		goto out_free;
	container_budgets(cfg, &mcfg);
	st = ts_memory_new(srv->devices, &mcfg, &srv->memory, err);
	if (st != TS_OK)
		goto out_free;
	st = pick_default_device(srv, err);
	if (st != TS_OK)
		goto out_free;
	st = ts_stager_new(srv->devices, srv->memory, &srv->stager, err);
	if (st != TS_OK)
		goto out_free;
	ts_stager_set_topology(srv->stager, srv->topology);
	srv->catalog = ts_catalog_new();
	if (!srv->catalog) {
		st = ts_error_oom(err, "no memory for the catalog");
		goto out_free;
	}
	if (cfg->data_dir[0] && !realpath(cfg->data_dir, srv->data_dir)) {
		st = ts_error_set(err, ts_status_from_errno(errno), "DATA_DIR",
		                  "--data-dir '%s': %s", cfg->data_dir, strerror(errno));
		goto out_free;
	}
	srv->core = (struct ts_core){
		.env = {.devices = srv->devices, .memory = srv->memory, .catalog = srv->catalog,
		        .stager = srv->stager, .import_header_max = cfg->import_header_limit,
		        .import_header_budget = cfg->import_header_budget,
		        .import_header_used = &srv->import_header_used},
		.memory_view = ts_view_cache_new(),
		.data_dir = srv->data_dir[0] ? srv->data_dir : NULL,
		.data_dir_given = srv->data_dir[0] ? srv->cfg.data_dir : NULL,
		.wait_limit_ns = (uint64_t)cfg->wait_limit * 1000000000ull,
		.default_device = srv->core.default_device,
		.topology = srv->topology,
		.default_memory_kind = cfg->default_memory_kind,
		.version = ts_version,
		.host = ts_device_props(srv->core.default_device)->host,
		.started_ns = ts_now_ns(),
		.started_wall_ns = ts_wall_ns(),
		.fleet_copy = cfg->peers[0] || cfg->peers_dns[0] ? ts_fleet_copy_submit : NULL,
		.fleet_cls = srv,
	};
	srv->core.env.shardings = ts_sharding_registry_new();
	srv->core.env.models = ts_model_registry_new();
	if (!srv->core.env.shardings) {
		st = ts_error_oom(err, "no memory for the saved shardings");
		goto out_free;
	}
	if (!srv->core.env.models) {
		st = ts_error_oom(err, "no memory for the model registry");
		goto out_free;
	}
	srv->metrics = ts_metrics_new(ts_nroutes, ts_route_patterns);
	if (!srv->metrics || !srv->core.memory_view) {
		st = ts_error_oom(err, "no memory for metrics");
		goto out_free;
	}
	srv->router = ts_router_new(ts_routes, ts_nroutes);
	if (!srv->router) {
		st = ts_error_oom(err, "no memory for the route table");
		goto out_free;
	}
	if (cfg->peers_dns[0] && cfg->port == 0) {
		st = ts_error_set(err, TS_INVALID_ARGUMENT, "PEERS_DNS_PORT",
		                  "--peers-dns needs a fixed --port: its peers listen on the same one");
		goto out_free;
	}
	st = ts_fleet_new(&(struct ts_fleet_config){.peers = cfg->peers, .token = srv->token,
	                                            .peers_dns = cfg->peers_dns,
	                                            .bind = cfg->bind, .port = cfg->port,
	                                            .metrics = srv->metrics,
	                                            .interval_ms = FLEET_POLL_MS,
	                                            .timeout_ms = FLEET_TIMEOUT_MS},
	                  &srv->fleet, err);
	if (st != TS_OK)
		goto out_free;
	st = ts_op_registry_new(&(struct ts_op_registry_config){.workers = 4, .keep_finished = 1000,
	                                                          .keep_ns = 3600ull * 1000000000ull,
	                                                          .ended = operation_ended,
	                                                          .ended_cls = srv->metrics,
	                                                          .trace = srv->trace},
	                        &srv->core.env.operations, err);
	if (st != TS_OK)
		goto out_free;
	st = ts__history_start(srv, err);
	if (st != TS_OK)
		goto out_free;
	if (cfg->state_dir[0]) {
		st = ts_state_new(&srv->core.env, srv->core.default_device, cfg->default_memory_kind,
		                  cfg->state_dir, &srv->core.state, err);
		if (st != TS_OK)
			goto out_free;
	} else {
		atomic_store(&srv->restored, true);
	}
	st = fleet_ucx_start(srv, err);   /* before the HTTP threads read srv->fleet_ucx */
	if (st == TS_OK)
		st = ts__http_start(srv, err);
	if (st == TS_OK && cfg->unix_socket[0]) {
		st = ts__lease_start(srv, err);
		if (st == TS_OK)
			log_lease_pages();
	}
	if (st != TS_OK)
		goto out_free;
	st = write_port_file(srv, err);
	if (st != TS_OK)
		goto out_free;
	log_start(srv);
	*out = srv;
	return TS_OK;

out_free:
	ts_server_free(srv);
	return st;
}

int ts_server_port(const struct ts_server *srv)
{
	return srv->port;
}

/* Operations not finished yet (queued or running). */
static uint64_t ops_unfinished(struct ts_server *srv)
{
	uint64_t counts[TS_OP_CANCELLED + 1] = {0};

	ts_op_counts(srv->core.env.operations, counts);
	return counts[TS_OP_PENDING] + counts[TS_OP_RUNNING];
}

/* Cancels every unfinished operation of state, logging each by id. */
static int cancel_state(struct ts_server *srv, enum ts_op_state state)
{
	struct ts_operation **ops = NULL;
	struct ts_error err;
	size_t n = 0;

	ts_error_clear(&err);
	if (ts_op_list(srv->core.env.operations, (int)state, SIZE_MAX, &ops, &n, &err) != TS_OK) {
		ts_log(TS_LOG_ERROR, NULL, "cannot list operations to cancel: %s", err.message);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		struct ts_op_snapshot snap;
		char fields[200], kind[40];

		ts_operation_snapshot(ops[i], &snap);
		snprintf(kind, sizeof kind, "%s", snap.kind);
		ts_op_snapshot_release(&snap);
		ts_error_clear(&err);
		(void)ts_operation_cancel(ops[i], &err);
		snprintf(fields, sizeof fields, "\"operation\":\"%s\",\"kind\":\"%s\",\"state\":\"%s\"",
		         ts_operation_id(ops[i]), kind, ts_op_state_name(state));
		ts_log(TS_LOG_WARN, fields, "operation %s cancelled at the drain deadline",
		       ts_operation_id(ops[i]));
	}
	ts_op_list_free(ops, n);
	return (int)n;
}

/* The drain's save of the state dir, once the operations it cancelled have
 * ended (a step ends at its next step; a save in flight first). */
static void drain_save(struct ts_server *srv, struct ts_drain_result *out)
{
	uint64_t until = ts_now_ns() + DRAIN_SAVE_WAIT_NS;
	struct ts_error err;

	while (ops_unfinished(srv) > 0 && ts_now_ns() < until)
		usleep(10000);
	ts_error_clear(&err);
	out->state_saved = ts_state_save(srv->core.state, NULL, NULL, &err) == TS_OK;
	out->state_dir = true;
}

void ts_server_drain(struct ts_server *srv, int seconds, struct ts_drain_result *out)
{
	uint64_t deadline = ts_now_ns() + (uint64_t)seconds * 1000000000ull;

	memset(out, 0, sizeof *out);
	atomic_store(&srv->draining, true);
	ts__http_wake_all(srv);
	/* still listening: new connections learn that this instance is leaving
	 * (/readyz and /v1 answer 503) instead of being refused */
	for (;;) {
		int left = (int)ts_metrics_in_flight(srv->metrics);
		uint64_t ops = ops_unfinished(srv);

		out->requests = left;
		if ((left == 0 && ops == 0) || ts_now_ns() >= deadline)
			break;
		usleep(10000);
	}
	out->operations = cancel_state(srv, TS_OP_RUNNING) + cancel_state(srv, TS_OP_PENDING);
	if (srv->core.state)
		drain_save(srv, out);
}

void ts_server_restore(struct ts_server *srv)
{
	if (srv->core.state && !atomic_load(&srv->restored))
		ts_state_restore(srv->core.state);
	atomic_store(&srv->restored, true);
}

void ts_server_free(struct ts_server *srv)
{
	if (!srv)
		return;
	ts__http_wake_all(srv);
	ts__http_stop(srv);
	ts__lease_stop(srv);   /* leases hold arrays and buffers too */
	ts__history_stop(srv);   /* its sampler reads what follows */
	/* open receives hold staging and destination arrays, registered with UCX */
	ts_fleet_recv_drop_all(srv->fleet_recv, srv->fleet_ucx);
	/* operations hold arrays and buffers: they end before the catalog and stager */
	ts_op_registry_free(srv->core.env.operations);
	ts_state_free(srv->core.state);
	ts_fleet_free(srv->fleet);   /* its poller sets metrics */
	ts_fleet_link_free(srv->fleet_link);   /* the copies that sent on it have ended */
	ts_fleet_ucx_free(srv->fleet_ucx);   /* so does its progress thread */
	ts_fleet_recv_free(srv->fleet_recv);   /* after the thread that ticks it */
	ts_metrics_free(srv->metrics);
	ts_router_free(srv->router);
	ts_view_cache_free(srv->core.memory_view);
	ts_catalog_free(srv->catalog);
	ts_sharding_registry_free(srv->core.env.shardings);
	ts_model_registry_free(srv->core.env.models);
	ts_stager_free(srv->stager);
	ts_memory_free(srv->memory);
	ts_device_set_free(srv->devices);
	ts_topology_free(srv->topology);   /* the devices' queues borrowed it */
	ts__trace_free(srv);    /* the devices and operations held it */
	free(srv);
}

void ts_s_readyz(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	(void)call;
	if (atomic_load(&srv->draining)) {
		ts_reply_fail(reply, TS_UNAVAILABLE, "DRAINING", "tstaged is shutting down");
		return;
	}
	if (!atomic_load(&srv->restored)) {
		ts_reply_fail(reply, TS_UNAVAILABLE, "RESTORING",
		              "tstaged is restoring the state dir '%s'", srv->cfg.state_dir);
		return;
	}
	for (size_t i = 0; i < ts_device_set_count(srv->devices); i++) {
		struct ts_device *d = ts_device_set_at(srv->devices, i);

		if (ts_device_broken(d)) {
			ts_reply_fail(reply, TS_UNAVAILABLE, "DEVICE_BROKEN",
			              "device '%s' hit an unrecoverable error",
			              ts_device_props(d)->id);
			return;
		}
	}
	ts_reply_text(reply, TS_HTTP_OK, "text/plain; charset=utf-8", "ready\n", 6);
}

void ts_s_metrics(struct ts_server *srv, const struct ts_call *call, struct ts_reply *reply)
{
	size_t len = 0;
	uint64_t samples, cpu_ns;
	char *text;

	ts_history_sampler_stats(srv->history, &samples, &cpu_ns);
	ts_metrics_history(srv->metrics, samples, cpu_ns);
	text = ts_metrics_render(srv->metrics, call->core, &len);

	ts_reply_text_owned(reply, TS_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
	                    text, len);
}

/* ---- SIGUSR1's dump ------------------------------------------------------------------ */

static void dump_spaces(struct ts_server *srv)
{
	size_t n = ts_memory_space_count(srv->memory);

	for (size_t i = 0; i < n; i++) {
		const struct ts_space *sp = ts_memory_space_at(srv->memory, i);
		struct ts_space_stats st;
		json_t *f;

		ts_space_stats(sp, &st);
		f = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I}", "event", "dump_space",
		              "device", ts_device_props(ts_space_device(sp))->id,
		              "memory_kind", ts_memory_kind_name(ts_space_kind(sp)),
		              "bytes_in_use", (json_int_t)st.bytes_in_use,
		              "peak_bytes_in_use", (json_int_t)st.peak_bytes_in_use,
		              "bytes_limit", (json_int_t)st.bytes_limit,
		              "live_allocs", (json_int_t)st.live_allocs);
		ts_log_json(TS_LOG_INFO, f, "space %s: %" PRIu64 " bytes in use of %" PRIu64,
		            ts_space_name(sp), st.bytes_in_use, st.bytes_limit);
	}
}

static void dump_operations(struct ts_server *srv)
{
	uint64_t counts[TS_OP_CANCELLED + 1] = {0};
	struct ts_operation **ops = NULL;
	struct ts_error err;
	size_t n = 0;

	ts_op_counts(srv->core.env.operations, counts);
	ts_log_json(TS_LOG_INFO, json_pack("{s:s, s:I, s:I, s:I, s:I, s:I}", "event",
	                                   "dump_operations", "pending", (json_int_t)counts[TS_OP_PENDING],
	                                   "running", (json_int_t)counts[TS_OP_RUNNING],
	                                   "succeeded", (json_int_t)counts[TS_OP_SUCCEEDED],
	                                   "failed", (json_int_t)counts[TS_OP_FAILED],
	                                   "cancelled", (json_int_t)counts[TS_OP_CANCELLED]),
	            "operations: %" PRIu64 " in flight (%" PRIu64 " running, %" PRIu64 " queued)",
	            counts[TS_OP_PENDING] + counts[TS_OP_RUNNING], counts[TS_OP_RUNNING],
	            counts[TS_OP_PENDING]);
	ts_error_clear(&err);
	if (ts_op_list(srv->core.env.operations, TS_OP_RUNNING, 64, &ops, &n, &err) != TS_OK)
		return;
	for (size_t i = 0; i < n; i++) {
		struct ts_op_snapshot snap;

		ts_operation_snapshot(ops[i], &snap);
		ts_log_json(TS_LOG_INFO, json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:s}", "event",
		                                   "dump_operation", "operation", snap.id, "kind",
		                                   snap.kind, "target", snap.target, "done",
		                                   (json_int_t)snap.done_units, "total",
		                                   (json_int_t)snap.total_units, "unit", snap.unit),
		            "operation %s (%s) running: %" PRIu64 " of %" PRIu64 " %s", snap.id,
		            snap.kind, snap.done_units, snap.total_units, snap.unit);
		ts_op_snapshot_release(&snap);
	}
	ts_op_list_free(ops, n);
}

void ts_server_dump(struct ts_server *srv)
{
	uint64_t count = 0, bytes = 0;
	struct ts_model *ms = calloc(1024, sizeof *ms);
	size_t nmodels = ms ? ts_model_registry_list(srv->core.env.models, ms, 1024) : 0;

	free(ms);
	ts_log(TS_LOG_INFO, "\"event\":\"dump\",\"signal\":\"SIGUSR1\"",
	       "SIGUSR1: the state of tstaged follows");
	dump_spaces(srv);
	ts_catalog_totals(srv->catalog, &count, &bytes);
	ts_log_json(TS_LOG_INFO, json_pack("{s:s, s:I, s:I, s:I}", "event", "dump_catalog",
	                                   "arrays", (json_int_t)count, "array_bytes",
	                                   (json_int_t)bytes, "models", (json_int_t)nmodels),
	            "catalog: %" PRIu64 " arrays (%" PRIu64 " bytes), %zu models", count, bytes,
	            nmodels);
	dump_operations(srv);
	if (srv->core.state) {
		struct ts_state_stats st;

		ts_state_stats(srv->core.state, &st);
		ts_log_json(TS_LOG_INFO, json_pack("{s:s, s:s, s:I, s:I, s:I}", "event", "dump_state",
		                                   "dir", ts_state_dir(srv->core.state),
		                                   "generation", (json_int_t)st.generation,
		                                   "saves", (json_int_t)st.saves,
		                                   "save_failures", (json_int_t)st.save_failures),
		            "state dir '%s': generation %" PRIu64 ", %" PRIu64 " saves since start",
		            ts_state_dir(srv->core.state), st.generation, st.saves);
	}
}
