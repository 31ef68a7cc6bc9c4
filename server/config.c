/*
 * config.c - the option table, and parsing of flags and TSTAGE_* variables.
 */
#include "server/config.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/units.h"
#include "common/version.h"

enum opt_type {
	OPT_INT, OPT_SIZE, OPT_SIZE_SHARE, OPT_FRACTION, OPT_BOOL, OPT_STRING, OPT_KIND, OPT_LEVEL,
	OPT_PEERS, OPT_DNS_NAME
};

struct opt {
	const char *flag;       /* without the leading "--" */
	enum opt_type type;
	size_t offset;
	size_t size;            /* buffer size for strings */
	long lo, hi;            /* bounds for OPT_INT */
	const char *def;        /* default as shown in --help */
	const char *help;
};

#define F(field) offsetof(struct ts_config, field), sizeof(((struct ts_config *)0)->field)

static const struct opt options[] = {
	{"port", OPT_INT, F(port), 0, 65535, "8470", "TCP port (0: an ephemeral port)"},
	{"bind", OPT_STRING, F(bind), 0, 0, "127.0.0.1", "address to listen on (IPv4 or IPv6)"},
	{"threads", OPT_INT, F(threads), 0, 1024, "cores", "HTTP worker threads"},
	{"worker-fill", OPT_INT, F(worker_fill), 1, 100000, "4",
	 "connections a small-request worker takes before the next worker takes any "
	 "(1: spread them evenly)"},
	{"sim-devices", OPT_INT, F(sim_devices), -1, 64, "2 without GPU",
	 "simulated accelerators (0: none; -1: 2 when no CUDA device)"},
	{"sim-device-memory", OPT_SIZE, F(sim_device_memory), 0, 0, "2GiB",
	 "device memory of each simulated accelerator"},
	{"sim-numa-nodes", OPT_STRING, F(sim_numa_nodes), 0, 0, "none",
	 "NUMA node of each simulated accelerator, one index per sim device (\"0,0,1,1\"); "
	 "GET /v1/topology reports them"},
	{"sim-peer-links", OPT_STRING, F(sim_peer_links), 0, 0, "all",
	 "which simulated accelerators have peer access to each other: all, none, or groups "
	 "of sim ordinals with an optional link kind (\"0-1-2-3:nvlink,4-5:pcie_switch\"); "
	 "other pairs copy through pinned host memory"},
	{"topology-file", OPT_STRING, F(topology_file), 0, 0, "this machine",
	 "hwloc XML file of the node's topology (lstopo --of xml), read instead of "
	 "discovering this machine's"},
	{"device-memory-fraction", OPT_FRACTION, F(device_memory_fraction), 0, 0, "0.75",
	 "share of each GPU's free memory the device pool reserves"},
	{"preallocate", OPT_BOOL, F(preallocate), 0, 0, "false",
	 "pin the whole pinned_host pool at start"},
	{"pinned-host-limit", OPT_SIZE, F(pinned_host_limit), 0, 0, "RAM/4",
	 "node-wide pinned_host budget (RAM: the cgroup memory limit when smaller)"},
	{"pinned-host-numa-split", OPT_STRING, F(pinned_host_numa_split), 0, 0,
	 "by each node's accelerators",
	 "where the accelerators sit on several NUMA nodes (one pinned_host pool each), the "
	 "budget's split as NODE:WEIGHT pairs (\"0:1,1:3\"), one for every such node"},
	{"pinned-host-keep", OPT_SIZE_SHARE, F(pinned_host_keep), 0, 0,
	 "the larger of 256MiB and limit/8",
	 "idle pinned_host segments kept reserved for reuse; segments idle beyond it go back "
	 "to the system (a size, or a share of --pinned-host-limit such as 0.125)"},
	{"unpinned-host-limit", OPT_SIZE, F(unpinned_host_limit), 0, 0, "RAM/2",
	 "node-wide unpinned_host budget"},
	{"cgroup-root", OPT_STRING, F(cgroup_root), 0, 0, "/sys/fs/cgroup",
	 "where the cgroup file systems are mounted; host budgets default to fractions "
	 "of the cgroup memory limit (not RAM) when it is smaller"},
	{"default-memory-kind", OPT_KIND, F(default_memory_kind), 0, 0, "device",
	 "memory kind of uploads that name no placement"},
	{"default-device", OPT_STRING, F(default_device), 0, 0, "first device",
	 "default device (JAX's jax_default_device)"},
	{"log-level", OPT_LEVEL, F(log_level), 0, 0, "info", "debug, info, warn or error"},
	{"cuda", OPT_BOOL, F(cuda), 0, 0, "true", "use the CUDA backend when built in"},
	{"token-file", OPT_STRING, F(token_file), 0, 0, "none",
	 "file holding the bearer token every /v1 call must present"},
	{"insecure", OPT_BOOL, F(insecure), 0, 0, "false",
	 "allow a non-loopback bind without a token"},
	{"port-file", OPT_STRING, F(port_file), 0, 0, "none",
	 "write the bound port to this file once listening"},
	{"drain-seconds", OPT_INT, F(drain_seconds), 0, 3600, "30",
	 "how long SIGTERM waits for in-flight requests and operations (then cancelled)"},
	{"data-dir", OPT_STRING, F(data_dir), 0, 0, "none",
	 "folder server-side imports ({\"path\": ...}) may read from"},
	{"state-dir", OPT_STRING, F(state_dir), 0, 0, "none",
	 "keep arrays and models marked persist here across restarts: written at drain and "
	 "by POST /v1/state:save, restored before /readyz answers ready"},
	{"log-file", OPT_STRING, F(log_file), 0, 0, "stderr",
	 "append log lines to this file instead of stderr (SIGHUP reopens it)"},
	{"import-header-limit", OPT_SIZE, F(import_header_limit), 0, 0, "16MiB",
	 "largest safetensors header an import holds in memory (at most 100MB)"},
	{"import-header-budget", OPT_SIZE, F(import_header_budget), 0, 0, "256MiB",
	 "safetensors headers all imports together may hold while they are read "
	 "(0: no budget); past it an import is refused with 429"},
	{"max-connections", OPT_INT, F(max_connections), 1, 100000, "1024",
	 "connections served at once; more are answered 503 with Retry-After"},
	{"max-connections-per-ip", OPT_INT, F(max_connections_per_ip), 0, 100000, "256",
	 "connections served at once from one client address (0: no limit of its own)"},
	{"connection-timeout", OPT_INT, F(connection_timeout), 1, 86400, "60",
	 "seconds an idle connection is kept open"},
	{"body-idle-timeout", OPT_INT, F(body_idle_timeout), 1, 3600, "15",
	 "seconds an upload holding a memory reservation may send nothing"},
	{"body-min-rate", OPT_SIZE, F(body_min_rate), 0, 0, "64KiB",
	 "bytes per second such an upload must average once body-idle-timeout has passed "
	 "(0: no minimum)"},
	{"wait-limit", OPT_INT, F(wait_limit), 1, 3600, "60",
	 "seconds a call that waits for its operation (?wait=true, Prefer: wait=N, :wait) "
	 "holds its connection; then it answers 202 with the operation still running"},
	{"host-name", OPT_STRING, F(host_name), 0, 0, "gethostname()",
	 "the host every device reports (in Kubernetes the node's name, not the pod's)"},
	{"peers", OPT_PEERS, F(peers), 0, 0, "none",
	 "the other tstaged daemons of the fleet: comma-separated http://HOST:PORT URLs "
	 "(HOST a name, an IPv4 address or a [bracketed] IPv6 address; at most 64); "
	 "GET /v1/fleet lists them"},
	{"peers-dns", OPT_DNS_NAME, F(peers_dns), 0, 0, "none",
	 "a DNS name whose A/AAAA records are the fleet's daemons (a Kubernetes headless "
	 "Service), each at this daemon's --port: peers beside --peers, resolved again "
	 "every 10 s, this daemon's own addresses left out"},
	{"fleet-port", OPT_INT, F(fleet_port), 0, 65535, "--port + 1",
	 "port of the fleet's data path, UCX (0: the one after --port); it listens with --peers, "
	 "--peers-dns or this flag; reported by GET /v1/fleet"},
	{"fleet-timeout", OPT_INT, F(fleet_timeout), 1, 3600, "30",
	 "seconds a peer of a cross-node copy may stay silent (no write completes, no answer to "
	 "its receive) before the copy ends DEADLINE_EXCEEDED naming it"},
	{"unix-socket", OPT_STRING, F(unix_socket), 0, 0, "none",
	 "also serve the HTTP API on this Unix socket (its file's mode and group are the "
	 "permission: no token is asked there)"},
	{"unix-socket-mode", OPT_STRING, F(unix_socket_mode), 0, 0, "0600",
	 "file mode of the Unix socket, octal (0600, 0660, ...)"},
	{"unix-socket-group", OPT_STRING, F(unix_socket_group), 0, 0, "the daemon's",
	 "group of the Unix socket, a name or a gid"},
};

#define NOPTIONS (sizeof options / sizeof options[0])

static void set_defaults(struct ts_config *cfg)
{
	memset(cfg, 0, sizeof *cfg);
	cfg->port = 8470;
	strcpy(cfg->bind, "127.0.0.1");
	cfg->sim_devices = -1;
	cfg->sim_device_memory = 2ull << 30;
	cfg->device_memory_fraction = 0.75;
	cfg->pinned_host_keep = (struct ts_size_share){.bytes = TS_CONFIG_SIZE_DEFAULT};
	cfg->default_memory_kind = TS_MEM_DEVICE;
	cfg->log_level = TS_LOG_INFO;
	cfg->cuda = true;
	cfg->drain_seconds = 30;
	strcpy(cfg->cgroup_root, "/sys/fs/cgroup");
	strcpy(cfg->unix_socket_mode, "0600");
	cfg->import_header_limit = 16ull << 20;
	cfg->import_header_budget = 256ull << 20;
	cfg->max_connections = 1024;
	cfg->max_connections_per_ip = 256;
	cfg->connection_timeout = 60;
	cfg->body_idle_timeout = 15;
	cfg->body_min_rate = 64ull << 10;
	cfg->wait_limit = 60;
	cfg->fleet_timeout = 30;
	cfg->worker_fill = 4;
}

static bool parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};

	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(s, yes[i]) == 0)
			return (*out = true);
		if (strcasecmp(s, no[i]) == 0)
			return !(*out = false);
	}
	return false;
}

/* A size ("1GiB", "268435456") or, as a bare number strictly between 0 and
 * 1, a share of a budget ("0.125"). */
static bool parse_size_share(const char *value, struct ts_size_share *out)
{
	char *end;
	double d = strtod(value, &end);

	if (*value != '\0' && !*end && isdigit((unsigned char)*value) && d > 0.0 && d < 1.0) {
		*out = (struct ts_size_share){.share = d};
		return true;
	}
	*out = (struct ts_size_share){0};
	return ts_parse_size(value, &out->bytes);
}

/* One peer URL, s[0..n): http://HOST:PORT with an optional trailing '/'. */
static bool peer_url_ok(const char *s, size_t n)
{
	const char *p = s + 7, *end = s + n, *host_end;
	long port;
	char num[8];
	size_t len;

	if (n < 7 || n > TS_CONFIG_PEER_URL_MAX || strncmp(s, "http://", 7) != 0)
		return false;
	if (end > p && end[-1] == '/')
		end--;
	if (p < end && *p == '[') {
		host_end = memchr(p, ']', (size_t)(end - p));
		if (!host_end || host_end == p + 1)
			return false;
		for (const char *c = p + 1; c < host_end; c++)
			if (!isxdigit((unsigned char)*c) && *c != ':' && *c != '.')
				return false;
		host_end++;
	} else {
		host_end = p;
		while (host_end < end && (isalnum((unsigned char)*host_end) || *host_end == '.' ||
		                          *host_end == '-'))
			host_end++;
		if (host_end == p)
			return false;
	}
	if (host_end >= end || *host_end != ':')
		return false;
	len = (size_t)(end - host_end - 1);
	if (len == 0 || len >= sizeof num)
		return false;
	memcpy(num, host_end + 1, len);
	num[len] = '\0';
	return ts_parse_long(num, 1, 65535, &port);
}

/* --peers: a comma-separated list of peer URLs, none empty, at most
 * TS_CONFIG_MAX_PEERS; "" is no peers. */
static bool parse_peers(const char *value, char *field, size_t cap)
{
	const char *p = value;
	int n = 0;

	if (strlen(value) >= cap)
		return false;
	while (*value) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);

		if (!peer_url_ok(p, len) || ++n > TS_CONFIG_MAX_PEERS)
			return false;
		if (!comma)
			break;
		p = comma + 1;
	}
	strcpy(field, value);
	return true;
}

/* Why --peers value was refused, into buf: the first item that is not a
 * peer URL, or the count past the most. */
static void peers_problem(const char *value, char *buf, size_t cap)
{
	const char *p = value;
	int n = 0;

	for (;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);

		if (!peer_url_ok(p, len)) {
			snprintf(buf, cap, "peer '%.*s' is not an http://HOST:PORT URL (HOST a name, an "
			         "IPv4 address or a [bracketed] IPv6 address, PORT 1 to 65535)",
			         (int)(len > 300 ? 300 : len), p);
			return;
		}
		if (++n > TS_CONFIG_MAX_PEERS) {
			snprintf(buf, cap, "more than %d peers", TS_CONFIG_MAX_PEERS);
			return;
		}
		if (!comma)
			break;
		p = comma + 1;
	}
	snprintf(buf, cap, "the list is longer than %zu characters",
	         sizeof ((struct ts_config *)0)->peers - 1);
}

/* The refusal of value for o, to err ("for --flag" or "in TSTAGE_FLAG"). */
static void refuse(FILE *err, const struct opt *o, const char *value, const char *where)
{
	char why[640];

	if (o->type != OPT_PEERS) {
		fprintf(err, "tstaged: invalid value '%s' %s (%s)\n", value, where, o->help);
		return;
	}
	peers_problem(value, why, sizeof why);
	fprintf(err, "tstaged: invalid value for %s: %s\n", strchr(where, ' ') + 1, why);
}

/* Stores value into the field of o; false when it does not parse. */
static bool apply(struct ts_config *cfg, const struct opt *o, const char *value)
{
	char *field = (char *)cfg + o->offset;
	long l;
	double d;
	char *end;

	switch (o->type) {
	case OPT_INT:
		if (!ts_parse_long(value, o->lo, o->hi, &l))
			return false;
		*(int *)field = (int)l;
		return true;
	case OPT_SIZE:
		if (!ts_parse_size(value, (uint64_t *)field))
			return false;
		/* the format's own limit on a header */
		return field != (char *)&cfg->import_header_limit ||
		       (cfg->import_header_limit > 0 && cfg->import_header_limit <= 100000000ull);
	case OPT_SIZE_SHARE:
		return parse_size_share(value, (struct ts_size_share *)field);
	case OPT_FRACTION:
		d = strtod(value, &end);
		if (*value == '\0' || *end || !(d > 0.0 && d <= 1.0))
			return false;
		*(double *)field = d;
		return true;
	case OPT_BOOL:
		return parse_bool(value, (bool *)field);
	case OPT_STRING:
		if (strlen(value) >= o->size)
			return false;
		strcpy(field, value);
		return true;
	case OPT_KIND:
		return ts_memory_kind_parse(value, (enum ts_memory_kind *)field);
	case OPT_LEVEL:
		return ts_log_level_parse(value, (enum ts_log_level *)field);
	case OPT_PEERS:
		return parse_peers(value, field, o->size);
	case OPT_DNS_NAME:
		if (!*value || strlen(value) > 253 || strlen(value) >= o->size)
			return false;
		for (const char *c = value; *c; c++)
			if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_')
				return false;
		strcpy(field, value);
		return true;
	}
	return false;
}

static void env_name(const struct opt *o, char *buf, size_t cap)
{
	size_t i = 0, j = 0;

	j = (size_t)snprintf(buf, cap, "TSTAGE_");
	for (; o->flag[i] && j + 1 < cap; i++)
		buf[j++] = o->flag[i] == '-' ? '_' : (char)toupper((unsigned char)o->flag[i]);
	buf[j] = '\0';
}

static void usage(FILE *out)
{
	char env[64];

	fprintf(out, "usage: tstaged [options]\n\n"
	             "tstage: a tensor staging service for GPU nodes.\n\n"
	             "options (each also read from the environment variable shown):\n");
	for (size_t i = 0; i < NOPTIONS; i++) {
		env_name(&options[i], env, sizeof env);
		fprintf(out, "  --%-24s %s [default %s] (%s)\n", options[i].flag,
		        options[i].help, options[i].def, env);
	}
	fprintf(out, "  --%-24s %s\n  --%-24s %s\n", "help", "show this text", "version",
	        "print the version");
	fprintf(out, "  --%-24s %s\n", "probe URL",
	        "GET an http://ADDRESS:PORT/path URL (numeric address or localhost) and exit "
	        "0 on a 2xx answer, 1 otherwise (a container health check)");
}

static const struct opt *find_opt(const char *name, size_t len)
{
	for (size_t i = 0; i < NOPTIONS; i++)
		if (strlen(options[i].flag) == len && strncmp(options[i].flag, name, len) == 0)
			return &options[i];
	return NULL;
}

enum ts_config_result ts_config_parse(struct ts_config *cfg, int argc,
                                      char **argv, FILE *out, FILE *err)
{
	char env[64];

	set_defaults(cfg);
	for (size_t i = 0; i < NOPTIONS; i++) {
		const char *v;

		env_name(&options[i], env, sizeof env);
		v = getenv(env);
		if (v && *v && !apply(cfg, &options[i], v)) {
			char where[80];

			snprintf(where, sizeof where, "in %s", env);
			if (options[i].type == OPT_PEERS)
				refuse(err, &options[i], v, where);
			else
				fprintf(err, "tstaged: invalid value '%s' in %s\n", v, env);
			return TS_CONFIG_EXIT_USAGE;
		}
	}
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i], *name, *eq, *value;
		const struct opt *o;

		if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
			usage(out);
			return TS_CONFIG_EXIT_OK;
		}
		if (strcmp(arg, "--version") == 0) {
			fprintf(out, "tstaged %s (%s)\n", ts_version, ts_git_rev);
			return TS_CONFIG_EXIT_OK;
		}
		if (strcmp(arg, "--probe") == 0 || strncmp(arg, "--probe=", 8) == 0) {
			value = arg[7] == '=' ? arg + 8 : i + 1 < argc ? argv[++i] : NULL;
			if (!value || !*value || strlen(value) >= sizeof cfg->probe) {
				fprintf(err, "tstaged: option '--probe' needs a URL of at most %zu "
				             "characters\n", sizeof cfg->probe - 1);
				return TS_CONFIG_EXIT_USAGE;
			}
			strcpy(cfg->probe, value);
			continue;
		}
		if (strncmp(arg, "--", 2) != 0) {
			fprintf(err, "tstaged: unexpected argument '%s' (see --help)\n", arg);
			return TS_CONFIG_EXIT_USAGE;
		}
		name = arg + 2;
		eq = strchr(name, '=');
		o = find_opt(name, eq ? (size_t)(eq - name) : strlen(name));
		if (!o && !eq && strncmp(name, "no-", 3) == 0) {
			o = find_opt(name + 3, strlen(name + 3));
			if (o && o->type == OPT_BOOL) {
				apply(cfg, o, "false");
				continue;
			}
			o = NULL;
		}
		if (!o) {
			fprintf(err, "tstaged: unknown option '%s' (see --help)\n", arg);
			return TS_CONFIG_EXIT_USAGE;
		}
		if (eq)
			value = eq + 1;
		else if (o->type == OPT_BOOL)
			value = "true";
		else if (i + 1 < argc)
			value = argv[++i];
		else {
			fprintf(err, "tstaged: option '--%s' needs a value\n", o->flag);
			return TS_CONFIG_EXIT_USAGE;
		}
		if (!apply(cfg, o, value)) {
			char where[64];

			snprintf(where, sizeof where, "for --%s", o->flag);
			refuse(err, o, value, where);
			return TS_CONFIG_EXIT_USAGE;
		}
	}
	return TS_CONFIG_RUN;
}
