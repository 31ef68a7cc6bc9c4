/*
 * config.h - tstaged's configuration from flags and TSTAGE_* environment
 * variables.
 *
 * Every option has a flag (--sim-devices 2) and an environment variable
 * (TSTAGE_SIM_DEVICES=2); a flag wins over the environment, which wins over
 * the default. The option table is the single source of the --help text, the
 * README table and validation.
 *
 * Thread-safety: parsed once in main(); immutable afterwards.
 */
#ifndef TS_CONFIG_H
#define TS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/log.h"
#include "device/device.h"

/* A size that may be given as a share of a budget instead. */
#define TS_CONFIG_SIZE_DEFAULT UINT64_MAX
struct ts_size_share {
	uint64_t bytes;                  /* TS_CONFIG_SIZE_DEFAULT: the option's default */
	double share;                    /* > 0: this share of the budget, bytes unused */
};

/* Most peers --peers may name, and the longest URL of one (a DNS name of
 * 253 characters with the scheme, a port and a '/'). */
#define TS_CONFIG_MAX_PEERS 64
#define TS_CONFIG_PEER_URL_MAX 272

struct ts_config {
	int port;                        /* 0: ephemeral */
	char bind[64];
	int threads;                     /* 0: number of online cores */
	int worker_fill;                 /* connections a small worker takes before the next */
	int sim_devices;                 /* -1: 2 when no GPU, else 0 */
	uint64_t sim_device_memory;
	char sim_numa_nodes[256];        /* NUMA node of each sim device ("0,0,1,1"); "" none */
	char pinned_host_numa_split[256]; /* the pinned budget by NUMA node ("0:1,1:3"); "" by
	                                  * the accelerators' share */
	char sim_peer_links[256];        /* which sim pairs have peer access ("0-1,2-3"); "" all */
	char topology_file[512];         /* hwloc XML of the node; "": discover this machine */
	double device_memory_fraction;
	bool preallocate;
	uint64_t pinned_host_limit;      /* 0: a quarter of physical memory (or cgroup limit) */
	struct ts_size_share pinned_host_keep; /* idle pinned bytes kept; default: the larger
	                                  * of a segment and an eighth of the limit */
	uint64_t unpinned_host_limit;    /* 0: half of physical memory */
	char cgroup_root[256];           /* cgroup mounts: "RAM" is their limit when smaller */
	enum ts_memory_kind default_memory_kind;
	char default_device[32];         /* "" : the default backend's first device */
	enum ts_log_level log_level;
	bool cuda;                       /* false: skip the CUDA backend */
	char token_file[512];
	bool insecure;
	char port_file[512];             /* write the bound port here once listening */
	int drain_seconds;               /* how long SIGTERM waits for requests */
	char data_dir[512];              /* server-side imports only from below here; "" none */
	char state_dir[512];             /* persisted arrays and models (jobs/state.h); "" none */
	char log_file[512];              /* log lines go here (SIGHUP reopens it); "" stderr */
	uint64_t import_header_limit;    /* largest safetensors header an import buffers */
	uint64_t import_header_budget;   /* all headers being read at once; 0: none */
	int max_connections;             /* served at once; more are answered 503 */
	int max_connections_per_ip;      /* served at once from one address; 0: no own limit */
	int connection_timeout;          /* seconds an idle connection stays open */
	int body_idle_timeout;           /* seconds a reserving upload may stall */
	uint64_t body_min_rate;          /* bytes/s such an upload must average; 0: none */
	int wait_limit;                  /* seconds a waiting call holds its connection */
	char host_name[64];              /* the "host" devices report; "": gethostname() */
	char probe[512];                 /* --probe URL: check that URL and exit; "" run */
	char peers[4096];                /* --peers: comma-separated http://HOST:PORT; "" none */
	char peers_dns[256];             /* --peers-dns: a name whose addresses are peers */
	int fleet_port;                  /* the fleet's data port; 0: port + 1 */
	int fleet_timeout;               /* seconds a cross-node copy's peer may be silent */
	char unix_socket[108];           /* also serve on this Unix socket; "" none */
	char unix_socket_mode[8];        /* its file mode, octal ("0600") */
	char unix_socket_group[64];      /* its group (name or gid); "" the daemon's */
};

enum ts_config_result { TS_CONFIG_RUN, TS_CONFIG_EXIT_OK, TS_CONFIG_EXIT_USAGE };

/*
 * Fills cfg from defaults, then the environment (envp-style lookup through
 * getenv), then argv. --help and --version print to out and return
 * TS_CONFIG_EXIT_OK; a bad value prints a message naming the option to err
 * and returns TS_CONFIG_EXIT_USAGE. --probe URL (a flag only, never read from
 * the environment) fills cfg->probe: main then checks the URL instead of
 * serving.
 */
enum ts_config_result ts_config_parse(struct ts_config *cfg, int argc,
                                      char **argv, FILE *out, FILE *err);

#endif
