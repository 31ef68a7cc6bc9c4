/*
 * it_fleet.c - the fleet view against live daemons on loopback: three
 * tstaged naming each other in --peers (one token for all) each list all
 * three nodes, with every peer's devices as that peer's own /v1/devices
 * writes them; a SIGSTOPped peer (it accepts, never answers) and a killed
 * one (nothing listens) are marked unreachable with the reason within a
 * bound while /v1/fleet and /livez keep answering without waiting on them,
 * and a resumed one is reachable again (each change logged once); a peer with another token is
 * unreachable as UNAUTHENTICATED; --peers-dns's addresses are peers, the
 * daemon's own left out; bad --peers values are refused at start with the
 * item at fault named. The fleet port (UCX) admits an endpoint only with a
 * ticket from an authenticated POST /v1/fleet:ticket, once: a forged, a
 * replayed, a short or a missing ticket is closed and counted. A read with
 * ?host= is answered by that node through this one.
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "harness.h"

#define TOKEN "fleet-token-0123456789abcdefghij"
#define NODES 3
/* How long a peer may take to be seen reachable or unreachable: the daemon
 * polls every second with a one-second timeout; a sanitizer build is slower. */
#define SEEN_WITHIN_MS 15000

static const char *const auth[] = {"Authorization: Bearer " TOKEN, NULL};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* n loopback ports p, each with p + 1 free too (the fleet port's default),
 * no two pairs overlapping: all held bound until every one is chosen. */
static void free_port_pairs(int *ports, int n)
{
	int fds[2 * NODES + 2], nfd = 0;

	ck_assert_int_le(n, NODES);
	for (int i = 0; i < n;) {
		struct sockaddr_in a = {.sin_family = AF_INET,
		                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t len = sizeof a;
		int fd = socket(AF_INET, SOCK_STREAM, 0), fd2 = socket(AF_INET, SOCK_STREAM, 0);

		ck_assert(fd >= 0 && fd2 >= 0);
		ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
		ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
		a.sin_port = htons((uint16_t)(ntohs(a.sin_port) + 1));
		if (ntohs(a.sin_port) != 0 && bind(fd2, (struct sockaddr *)&a, sizeof a) == 0) {
			ports[i++] = ntohs(a.sin_port) - 1;
			fds[nfd++] = fd;
			fds[nfd++] = fd2;
		} else {
			close(fd);
			close(fd2);
		}
	}
	for (int i = 0; i < nfd; i++)
		close(fds[i]);
}

/* How many times a start whose chosen ports another process took first is
 * tried again on new ones. */
#define PORT_TRIES 5

/* Starts n daemons on free port pairs (into ports), host "node<i>", each
 * naming the others as peers, all with token_files[i], node0 with extra (two
 * flags and their values, or NULL). A port taken between its choice and a
 * daemon's start (the suites run side by side) stops those started and
 * chooses again. */
static void start_fleet_with(struct th_daemon *d, int n, int *ports,
                             char token_files[][512], const char *const *extra)
{
	for (int tries = 0;; tries++) {
		int i;

		ck_assert_msg(tries < PORT_TRIES, "no free ports for %d daemons in %d tries", n,
		              PORT_TRIES);
		free_port_pairs(ports, n);
		for (i = 0; i < n; i++) {
			char peers[512] = "", port[16], host[16];
			const char *args[] = {"--port", port, "--host-name", host, "--peers", peers,
			                      "--token-file", token_files[i], NULL, NULL, NULL};

			if (i == 0 && extra) {
				args[8] = extra[0];
				args[9] = extra[1];
			}
			for (int j = 0; j < n; j++)
				if (j != i)
					snprintf(peers + strlen(peers), sizeof peers - strlen(peers),
					         "%shttp://127.0.0.1:%d", peers[0] ? "," : "", ports[j]);
			snprintf(port, sizeof port, "%d", ports[i]);
			snprintf(host, sizeof host, "node%d", i);
			if (!th_daemon_try_start(&d[i], args))
				break;
			ck_assert_int_eq(d[i].port, ports[i]);
		}
		if (i == n)
			return;
		while (i-- > 0)
			th_daemon_stop_ok(&d[i]);
	}
}

/* One daemon with args, whose "--port" value is the buffer port (16 bytes),
 * on a free port pair: that port in *p. */
static void start_on_free_port(struct th_daemon *d, int *p, char *port, const char *const *args)
{
	for (int tries = 0;; tries++) {
		ck_assert_msg(tries < PORT_TRIES, "no free port in %d tries", PORT_TRIES);
		free_port_pairs(p, 1);
		snprintf(port, 16, "%d", *p);
		if (th_daemon_try_start(d, args))
			return;
	}
}

static void start_fleet(struct th_daemon *d, int n, int *ports, char token_files[][512])
{
	start_fleet_with(d, n, ports, token_files, NULL);
}

/* GET path with the token: 200 and a JSON object (new reference). */
static json_t *get_auth(struct th_daemon *d, const char *path)
{
	struct th_response r;
	json_t *o;

	th_request(d, "GET", path, auth, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
	o = json_incref(th_json(&r));
	ck_assert_msg(json_is_object(o), "GET %s: not a JSON object", path);
	th_response_free(&r);
	return o;
}

/* The node of d's fleet view whose url names port, borrowed from view. */
static json_t *node_at(json_t *view, int port)
{
	char url[64];
	size_t i;
	json_t *node;

	snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
	json_array_foreach(th_arr(view, "nodes"), i, node)
		if (strcmp(th_str(node, "url"), url) == 0)
			return node;
	ck_abort_msg("no node at %s in the fleet view", url);
	return NULL;
}

/* Polls d's fleet view until the node at port is (un)reachable, at most
 * SEEN_WITHIN_MS; every /v1/fleet and /livez meanwhile must answer well
 * within one peer timeout (it never waits on a peer). Returns that node's
 * object (new reference). */
static json_t *await_node(struct th_daemon *d, int port, bool reachable)
{
	double start = now_ms();

	for (;;) {
		double t0 = now_ms();
		json_t *view = get_auth(d, "/v1/fleet"), *node;
		double took = now_ms() - t0;

		ck_assert_msg(took < 900, "GET /v1/fleet took %.0f ms", took);
		t0 = now_ms();
		ck_assert_int_eq(th_get_status(d, "/livez"), 200);
		ck_assert_msg(now_ms() - t0 < 900, "GET /livez took %.0f ms", now_ms() - t0);
		node = node_at(view, port);
		if (th_bool(node, "reachable") == reachable) {
			json_incref(node);
			json_decref(view);
			return node;
		}
		json_decref(view);
		ck_assert_msg(now_ms() - start < SEEN_WITHIN_MS, "node at port %d still %s after %d ms",
		              port, reachable ? "unreachable" : "reachable", SEEN_WITHIN_MS);
		usleep(100000);
	}
}

/* Starts n daemons as start_fleet_with does, on free port pairs (into
 * ports), all with the token TOKEN (in the files tokens[i]) and the extra
 * arguments (may be NULL). */
static void start_fleet_one_token_with(struct th_daemon *d, int n, int *ports,
                                       char tokens[][512], const char *const *extra)
{
	ck_assert_int_le(n, NODES);
	for (int i = 0; i < n; i++)
		th_write_temp("token", TOKEN "\n", tokens[i], sizeof tokens[i]);
	start_fleet_with(d, n, ports, tokens, extra);
}

static void start_fleet_one_token(struct th_daemon *d, int n, int *ports)
{
	char tokens[NODES][512];

	start_fleet_one_token_with(d, n, ports, tokens, NULL);
}

/* Every node lists all three: itself first (self), then its peers in
 * --peers order, each with its host, URL, version and the devices its own
 * /v1/devices lists (their "host" its --host-name). */
START_TEST(test_fleet_lists_every_node)
{
	struct th_daemon d[NODES];
	int ports[NODES];

	start_fleet_one_token(d, NODES, ports);
	for (int i = 0; i < NODES; i++)
		for (int j = 0; j < NODES; j++)
			if (j != i)
				json_decref(await_node(&d[i], ports[j], true));
	for (int i = 0; i < NODES; i++) {
		json_t *view = get_auth(&d[i], "/v1/fleet"), *nodes = th_arr(view, "nodes");
		char host[16];
		struct th_response r;
		double v;

		snprintf(host, sizeof host, "node%d", i);
		ck_assert_str_eq(th_str(view, "host"), host);
		ck_assert_int_eq(json_array_size(nodes), NODES);
		ck_assert(th_bool(json_array_get(nodes, 0), "self"));
		ck_assert_int_eq(th_int(json_array_get(nodes, 0), "fleet_port"), ports[i] + 1);
		for (int j = 0; j < NODES; j++) {
			json_t *node = node_at(view, ports[j]);
			json_t *own = get_auth(&d[j], "/v1/devices"), *self = get_auth(&d[j], "/v1/fleet?scope=local");
			json_t *devs = th_arr(node, "devices"), *dev;
			size_t k;

			snprintf(host, sizeof host, "node%d", j);
			ck_assert_str_eq(th_str(node, "host"), host);
			ck_assert(th_bool(node, "reachable"));
			ck_assert(th_bool(node, "self") == (i == j));
			ck_assert(json_is_string(json_object_get(node, "last_contact")));
			ck_assert(!json_object_get(node, "error"));
			ck_assert_str_eq(th_str(node, "version"),
			                 th_str(json_array_get(th_arr(self, "nodes"), 0), "version"));
			ck_assert_int_eq(json_array_size(devs), json_array_size(th_arr(own, "devices")));
			json_array_foreach(devs, k, dev) {
				json_t *want = json_array_get(th_arr(own, "devices"), k);

				ck_assert_str_eq(th_str(dev, "host"), host);
				ck_assert_str_eq(th_str(dev, "id"), th_str(want, "id"));
				ck_assert_str_eq(th_str(dev, "backend"), th_str(want, "backend"));
				ck_assert_int_eq(th_int(dev, "total_memory_bytes"),
				                 th_int(want, "total_memory_bytes"));
				ck_assert_int_eq(json_array_size(th_arr(dev, "memories")),
				                 json_array_size(th_arr(want, "memories")));
			}
			json_decref(own);
			json_decref(self);
		}
		json_decref(view);
		th_get(&d[i], "/metrics", &r);
		ck_assert(th_prom_find(r.body, "tstage_fleet_peers", "state=\"reachable\"", &v));
		ck_assert(v == NODES - 1);
		ck_assert(th_prom_find(r.body, "tstage_fleet_peers", "state=\"unreachable\"", &v));
		ck_assert(v == 0);
		th_response_free(&r);
	}
	for (int i = 0; i < NODES; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* A stopped peer times out, a killed one refuses the connection: both are
 * marked unreachable with the reason (and what was last known of them)
 * while the view and /livez keep answering; a resumed peer is reachable
 * again, and the gauge follows. */
START_TEST(test_stopped_and_killed_peers)
{
	struct th_daemon d[NODES];
	int ports[NODES];
	json_t *node;
	struct th_response r;
	double v;

	start_fleet_one_token(d, NODES, ports);
	json_decref(await_node(&d[0], ports[1], true));
	json_decref(await_node(&d[0], ports[2], true));

	th_daemon_signal(&d[1], SIGSTOP);
	node = await_node(&d[0], ports[1], false);
	ck_assert_str_eq(th_str(th_obj(node, "error"), "reason"), "TIMEOUT");
	ck_assert_ptr_nonnull(strstr(th_str(th_obj(node, "error"), "message"), "/v1/fleet"));
	ck_assert_str_eq(th_str(node, "host"), "node1");    /* last known */
	ck_assert(json_is_string(json_object_get(node, "last_contact")));
	ck_assert_int_eq(json_array_size(th_arr(node, "devices")), 0);
	json_decref(node);
	{
		char *log = th_daemon_stderr(&d[0]), want[120];

		snprintf(want, sizeof want, "\"peer\":\"http://127.0.0.1:%d\",\"state\":\"unreachable\","
		         "\"reason\":\"TIMEOUT\"", ports[1]);
		ck_assert_msg(strstr(log, "\"event\":\"fleet_peer\"") && strstr(log, want),
		              "no unreachable line for the stopped peer in: %s", log);
		free(log);
	}

	th_daemon_signal(&d[2], SIGKILL);
	ck_assert_int_ne(th_daemon_wait(&d[2], 10000), -1);
	node = await_node(&d[0], ports[2], false);
	ck_assert_str_eq(th_str(th_obj(node, "error"), "reason"), "CONNECT_FAILED");
	json_decref(node);
	th_get(&d[0], "/metrics", &r);
	ck_assert(th_prom_find(r.body, "tstage_fleet_peers", "state=\"reachable\"", &v) && v == 0);
	ck_assert(th_prom_find(r.body, "tstage_fleet_peers", "state=\"unreachable\"", &v) && v == 2);
	th_response_free(&r);

	th_daemon_signal(&d[1], SIGCONT);
	node = await_node(&d[0], ports[1], true);
	ck_assert_str_eq(th_str(node, "host"), "node1");
	ck_assert_int_gt(json_array_size(th_arr(node, "devices")), 0);
	json_decref(node);
	th_get(&d[0], "/metrics", &r);
	ck_assert(th_prom_find(r.body, "tstage_fleet_peers", "state=\"reachable\"", &v) && v == 1);
	th_response_free(&r);
	th_daemon_stop_ok(&d[0]);
	th_daemon_stop_ok(&d[1]);
	th_daemon_stop(&d[2], false);   /* the killed daemon's client and files */
}
END_TEST

/* Peers present the daemon's own token: one that holds another is
 * unreachable as UNAUTHENTICATED, never listed with devices. */
START_TEST(test_peer_with_another_token)
{
	struct th_daemon d[2];
	int ports[2];
	char tokens[2][512];
	json_t *node;

	th_write_temp("token", TOKEN "\n", tokens[0], sizeof tokens[0]);
	th_write_temp("token2", "another-token-0123456789abcdef\n", tokens[1], sizeof tokens[1]);
	start_fleet(d, 2, ports, tokens);
	/* node0's first polls may end before node1 listens (CONNECT_FAILED) */
	for (double start = now_ms();; usleep(100000)) {
		node = await_node(&d[0], ports[1], false);
		if (strcmp(th_str(th_obj(node, "error"), "reason"), "UNAUTHENTICATED") == 0 ||
		    now_ms() - start > SEEN_WITHIN_MS)
			break;
		json_decref(node);
	}
	ck_assert_str_eq(th_str(th_obj(node, "error"), "reason"), "UNAUTHENTICATED");
	ck_assert_ptr_nonnull(strstr(th_str(th_obj(node, "error"), "message"), "401"));
	ck_assert(json_is_null(json_object_get(node, "host")));
	ck_assert(json_is_null(json_object_get(node, "last_contact")));
	json_decref(node);
	th_daemon_stop_ok(&d[0]);
	th_daemon_stop_ok(&d[1]);
}
END_TEST

/* Without peers the view is this node alone; scope=local is this node in
 * any case; another scope is a 400 naming it. */
START_TEST(test_view_alone_and_scopes)
{
	struct th_daemon d;
	struct th_response r;
	json_t *view, *devs;

	th_daemon_start(&d, NULL);
	view = th_get_json(&d, "/v1/fleet", &r);
	ck_assert_int_eq(json_array_size(th_arr(view, "nodes")), 1);
	ck_assert(th_bool(json_array_get(th_arr(view, "nodes"), 0), "self"));
	devs = th_arr(json_array_get(th_arr(view, "nodes"), 0), "devices");
	ck_assert_str_eq(th_str(json_array_get(devs, 0), "id"), th_dev(0));
	th_response_free(&r);
	view = th_get_json(&d, "/v1/fleet?scope=local", &r);
	ck_assert_int_eq(json_array_size(th_arr(view, "nodes")), 1);
	th_response_free(&r);
	th_get(&d, "/v1/fleet?scope=everywhere", &r);
	th_assert_error(&r, 400, "INVALID_ARGUMENT", "BAD_SCOPE");
	ck_assert_ptr_nonnull(strstr(r.body, "everywhere"));
	th_response_free(&r);
	th_daemon_stop_ok(&d);
}
END_TEST

/* --peers-dns: every address of the name is a peer at this daemon's
 * --port, less the daemon's own: of two daemons on one port, on 127.0.0.1
 * and 127.0.0.2, both with --peers-dns localhost (which the test host
 * resolves to 127.0.0.1, and perhaps ::1), the second lists the first and
 * the first never lists itself as a peer. */
START_TEST(test_peers_from_dns)
{
	struct th_daemon a, b;
	char port[16], url_b[64];
	const char *args_b[] = {"--bind", "127.0.0.1", "--port", port, "--host-name", "dns-b",
	                        "--peers-dns", "localhost", NULL};
	const char *args_a[] = {"--bind", "127.0.0.2", "--port", port, "--host-name", "dns-a",
	                        "--peers-dns", "localhost", NULL};
	json_t *node, *view;
	struct th_response r;
	size_t i;
	int p;

	for (int tries = 0;; tries++) {
		ck_assert_msg(tries < PORT_TRIES, "no free port in %d tries", PORT_TRIES);
		start_on_free_port(&b, &p, port, args_b);
		if (th_daemon_try_start(&a, args_a))
			break;
		th_daemon_stop_ok(&b);
	}
	snprintf(url_b, sizeof url_b, "http://127.0.0.1:%d", p);
	snprintf(a.base_url, sizeof a.base_url, "http://127.0.0.2:%d", p);
	node = await_node(&a, p, true);
	ck_assert_str_eq(th_str(node, "host"), "dns-b");
	ck_assert(!th_bool(node, "self"));
	json_decref(node);
	view = th_get_json(&b, "/v1/fleet", &r);
	json_array_foreach(th_arr(view, "nodes"), i, node)
		ck_assert_msg(th_bool(node, "self") || strcmp(th_str(node, "url"), url_b) != 0,
		              "dns-b lists itself as a peer");
	ck_assert_str_eq(th_str(json_array_get(th_arr(view, "nodes"), 0), "host"), "dns-b");
	th_response_free(&r);
	th_daemon_stop_ok(&a);
	th_daemon_stop_ok(&b);
}
END_TEST

START_TEST(test_bad_peers_refused_at_start)
{
	static const char *const bad[][2] = {
		{"127.0.0.1:8470", "'127.0.0.1:8470'"},
		{"http://127.0.0.1:8470,https://b:1", "'https://b:1'"},
		{"http://127.0.0.1", "'http://127.0.0.1'"},
		{"http://127.0.0.1:0", "'http://127.0.0.1:0'"},
		{"http://a:1,,http://b:2", "peer ''"},
	};

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *args[] = {"--port", "0", "--peers", bad[i][0], NULL};
		struct th_run_result res;

		th_run(args, NULL, 10000, &res);
		ck_assert_int_eq(res.status, 2);
		ck_assert_msg(strstr(res.err, "--peers") && strstr(res.err, bad[i][1]),
		              "stderr '%s' should name --peers and %s", res.err, bad[i][1]);
		th_run_free(&res);
	}
	{
		const char *args[] = {"--port", "0", "--peers-dns", "tstage.test", NULL};
		const char *args2[] = {"--port", "0", "--peers-dns", "bad name", NULL};
		struct th_run_result res;

		th_run(args, NULL, 10000, &res);
		ck_assert_int_ne(res.status, 0);
		ck_assert_msg(strstr(res.err, "--peers-dns needs a fixed --port"), "%s", res.err);
		th_run_free(&res);
		th_run(args2, NULL, 10000, &res);
		ck_assert_int_eq(res.status, 2);
		ck_assert_msg(strstr(res.err, "'bad name' for --peers-dns"), "%s", res.err);
		th_run_free(&res);
	}
}
END_TEST

/* ---- the fleet port ------------------------------------------------------ */

/* How long the daemon gives an endpoint to present its ticket (server.c),
 * and how long a test waits beyond it. */
#define HELLO_MS 5000
#define SEEN_REJECTED_MS (HELLO_MS + 10000)

/* A UCP client of a daemon's fleet port, as a peer's would be. */
struct ucx_client {
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_ep_h ep;
	bool failed;     /* the endpoint's error handler ran: the daemon closed it */
};

static void client_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	(void)ep;
	(void)status;
	((struct ucx_client *)arg)->failed = true;
}

static void ucx_connect(struct ucx_client *c, int port)
{
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
	                       .features = UCP_FEATURE_STREAM};
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	                          .thread_mode = UCS_THREAD_MODE_SINGLE};
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS |
	                                    UCP_EP_PARAM_FIELD_SOCK_ADDR |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLER |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
	                      .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
	                      .sockaddr = {.addr = (struct sockaddr *)&a, .addrlen = sizeof a},
	                      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
	                      .err_handler = {.cb = client_error, .arg = c}};
	ucp_config_t *config;

	memset(c, 0, sizeof *c);
	ep.err_handler.arg = c;
	ck_assert_int_eq(ucp_config_read(NULL, NULL, &config), UCS_OK);
	ck_assert_int_eq(ucp_init(&params, config, &c->ctx), UCS_OK);
	ucp_config_release(config);
	ck_assert_int_eq(ucp_worker_create(c->ctx, &wp, &c->worker), UCS_OK);
	ck_assert_int_eq(ucp_ep_create(c->worker, &ep, &c->ep), UCS_OK);
}

/* Progresses c for ms, or until its endpoint fails. */
static void ucx_progress(struct ucx_client *c, int ms)
{
	for (double end = now_ms() + ms; now_ms() < end && !c->failed;)
		if (!ucp_worker_progress(c->worker))
			usleep(1000);
}

/* Sends n bytes of msg on c's stream and waits until they have left. */
static void ucx_send(struct ucx_client *c, const char *msg, size_t n)
{
	ucp_request_param_t p = {.op_attr_mask = 0};
	void *req = ucp_stream_send_nbx(c->ep, msg, n, &p);
	double end = now_ms() + 10000;

	ck_assert(!UCS_PTR_IS_ERR(req));
	while (req && ucp_request_check_status(req) == UCS_INPROGRESS && now_ms() < end)
		if (!ucp_worker_progress(c->worker))
			usleep(1000);
	if (req) {
		ck_assert_int_eq(ucp_request_check_status(req), UCS_OK);
		ucp_request_free(req);
	}
}

static void ucx_close(struct ucx_client *c)
{
	ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
	                         .flags = UCP_EP_CLOSE_FLAG_FORCE};
	void *req = ucp_ep_close_nbx(c->ep, &p);

	while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS)
		ucp_worker_progress(c->worker);
	if (UCS_PTR_IS_PTR(req))
		ucp_request_free(req);
	ucp_worker_destroy(c->worker);
	ucp_cleanup(c->ctx);
}

/* d's tstage_fleet_ucx_connections_total{result} and the endpoints gauge. */
static double ucx_metric(struct th_daemon *d, const char *result)
{
	struct th_response r;
	double v = -1;

	th_request(d, "GET", "/metrics", auth, NULL, 0, &r);
	if (result) {
		char label[40];

		snprintf(label, sizeof label, "result=\"%s\"", result);
		ck_assert(th_prom_find(r.body, "tstage_fleet_ucx_connections_total", label, &v));
	} else {
		ck_assert(th_prom_find(r.body, "tstage_fleet_ucx_endpoints", NULL, &v));
	}
	th_response_free(&r);
	return v;
}

/* Waits (progressing c, when given) until d's counter of result reaches want. */
static void await_ucx_metric(struct th_daemon *d, struct ucx_client *c, const char *result,
                             double want, int within_ms)
{
	double start = now_ms(), v;

	while ((v = ucx_metric(d, result)) != want) {
		ck_assert_msg(now_ms() - start < within_ms, "%s is %g, not %g after %d ms",
		              result ? result : "endpoints", v, want, within_ms);
		if (c)
			ucx_progress(c, 50);
		else
			usleep(50000);
	}
}

/* A ticket from d (authenticated), into out[65]. */
static void get_ticket(struct th_daemon *d, char *out, int want_port)
{
	struct th_response r;
	json_t *o;

	th_request(d, "POST", "/v1/fleet:ticket", auth, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "POST /v1/fleet:ticket: %ld %s", r.status, r.body);
	o = th_json(&r);
	ck_assert_int_eq(strlen(th_str(o, "ticket")), 64);
	ck_assert_int_eq(strspn(th_str(o, "ticket"), "0123456789abcdef"), 64);
	ck_assert_int_eq(th_int(o, "fleet_port"), want_port);
	ck_assert_int_eq(th_int(o, "expires_in_seconds"), 30);
	snprintf(out, 65, "%s", th_str(o, "ticket"));
	th_response_free(&r);
}

/* A daemon with peers listens on the fleet port (--port + 1): tickets need
 * the token; an endpoint with a good ticket is admitted and stays; one with
 * a forged ticket, the same ticket again, a short one, or none before the
 * deadline is closed and counted; tickets differ each time. */
START_TEST(test_fleet_port_tickets)
{
	struct th_daemon d;
	struct ucx_client good, c;
	char tokens[1][512], port[16], ticket[65], ticket2[65], forged[65];
	const char *args[] = {"--port", port, "--host-name", "node0", "--peers",
	                      "http://127.0.0.1:1", "--token-file", tokens[0], NULL};
	struct th_response r;
	int p, fport;

	th_write_temp("token", TOKEN "\n", tokens[0], sizeof tokens[0]);
	start_on_free_port(&d, &p, port, args);
	fport = p + 1;

	th_request(&d, "POST", "/v1/fleet:ticket", NULL, NULL, 0, &r);
	th_assert_error(&r, 401, "UNAUTHENTICATED", NULL);
	th_response_free(&r);
	get_ticket(&d, ticket, fport);
	get_ticket(&d, ticket2, fport);
	ck_assert_str_ne(ticket, ticket2);
	ck_assert(ucx_metric(&d, "accepted") == 0 && ucx_metric(&d, "rejected") == 0);

	/* a forged ticket: one digit off a live one */
	snprintf(forged, sizeof forged, "%s", ticket2);
	forged[10] = forged[10] == '0' ? '1' : '0';
	ucx_connect(&c, fport);
	ucx_send(&c, forged, 64);
	await_ucx_metric(&d, &c, "rejected", 1, SEEN_WITHIN_MS);
	ucx_progress(&c, 3000);
	ck_assert_msg(c.failed, "the daemon kept an endpoint with a forged ticket");
	ucx_close(&c);

	/* a good one: admitted, and it stays */
	ucx_connect(&good, fport);
	ucx_send(&good, ticket, 64);
	await_ucx_metric(&d, &good, "accepted", 1, SEEN_WITHIN_MS);
	ck_assert(ucx_metric(&d, NULL) == 1);
	ucx_progress(&good, 500);
	ck_assert(!good.failed);

	/* the same ticket again: spent */
	ucx_connect(&c, fport);
	ucx_send(&c, ticket, 64);
	await_ucx_metric(&d, &c, "rejected", 2, SEEN_WITHIN_MS);
	ucx_close(&c);

	/* a short one, and nothing at all: rejected at the deadline */
	ucx_connect(&c, fport);
	ucx_send(&c, ticket2, 20);
	await_ucx_metric(&d, &c, "rejected", 3, SEEN_REJECTED_MS);
	ucx_close(&c);
	ucx_connect(&c, fport);
	await_ucx_metric(&d, &c, "rejected", 4, SEEN_REJECTED_MS);
	ucx_progress(&c, 3000);
	ck_assert(c.failed);
	ucx_close(&c);
	ck_assert(ucx_metric(&d, "accepted") == 1);

	/* the good endpoint goes: nothing open */
	ucx_close(&good);
	await_ucx_metric(&d, NULL, NULL, 0, SEEN_WITHIN_MS);
	{
		char *log = th_daemon_stderr(&d);

		ck_assert_msg(strstr(log, "\"event\":\"fleet_ucx\"") &&
		              strstr(log, "\"result\":\"rejected\"") &&
		              strstr(log, "is not a live ticket"),
		              "no rejection line in: %s", log);
		free(log);
	}
	th_daemon_stop_ok(&d);
}
END_TEST

/* Without peers or --fleet-port nothing listens: tickets are refused with
 * the reason; with peers and --port 0 the fleet port is the kernel's choice,
 * the one /v1/fleet and the tickets report, and it admits a ticket; a fleet
 * port that is taken stops the start, named. */
START_TEST(test_fleet_port_off_and_taken)
{
	struct th_daemon d;
	struct th_response r;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char fport[16];
	const char *args[] = {"--port", "0", "--fleet-port", fport, NULL};
	struct th_run_result res;

	th_daemon_start(&d, NULL);
	th_post(&d, "/v1/fleet:ticket", NULL, &r);
	th_assert_error(&r, 400, "FAILED_PRECONDITION", "NO_FLEET_PORT");
	th_response_free(&r);
	th_daemon_stop_ok(&d);

	{
		const char *eph[] = {"--port", "0", "--peers", "http://127.0.0.1:1", NULL};
		struct ucx_client c;
		char ticket[65];
		json_t *view, *self;
		int chosen;

		th_daemon_start(&d, eph);
		view = get_auth(&d, "/v1/fleet?scope=local");
		self = json_array_get(th_arr(view, "nodes"), 0);
		chosen = (int)th_int(self, "fleet_port");
		ck_assert_int_gt(chosen, 0);
		ck_assert_int_ne(chosen, (int)th_int(self, "port"));
		json_decref(view);
		get_ticket(&d, ticket, chosen);
		ucx_connect(&c, chosen);
		ucx_send(&c, ticket, 64);
		await_ucx_metric(&d, &c, "accepted", 1, SEEN_WITHIN_MS);
		ucx_close(&c);
		th_daemon_stop_ok(&d);
	}

	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	ck_assert_int_eq(listen(fd, 1), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	snprintf(fport, sizeof fport, "%d", ntohs(a.sin_port));
	th_run(args, NULL, 10000, &res);
	ck_assert_int_ne(res.status, 0);
	ck_assert_msg(strstr(res.err, "--fleet-port") && strstr(res.err, fport), "%s", res.err);
	th_run_free(&res);
	close(fd);
}
END_TEST

/* ---- cross-node copies ---------------------------------------------------- */

/* POST path (body JSON text or NULL) with the token: the answer in r. */
static void post_auth(struct th_daemon *d, const char *path, const char *body,
                      struct th_response *r)
{
	const char *h[] = {auth[0], "Content-Type: application/json", NULL};

	th_request(d, "POST", path, h, body, body ? strlen(body) : 0, r);
}

/* POST /v1/fleet:receive?wait=true with n raw bytes as the body and spec
 * (NULL: none) in its X-Tstage-Receive header, as peers send small arrays. */
static void post_raw(struct th_daemon *d, const char *spec, const void *bytes, size_t n,
                     struct th_response *r)
{
	char *hdr = spec ? th_fmt("X-Tstage-Receive: %s", spec) : NULL;
	const char *h[] = {auth[0], "Content-Type: application/octet-stream", hdr, NULL};

	th_request(d, "POST", "/v1/fleet:receive?wait=true", h, bytes, n, r);
	free(hdr);
}

/* GET path with the token: its body (caller frees), which must be a 200. */
static char *get_bytes_auth(struct th_daemon *d, const char *path, size_t *n)
{
	struct th_response r;
	char *out;

	th_request(d, "GET", path, auth, NULL, 0, &r);
	ck_assert_msg(r.status == 200, "GET %s: %ld", path, r.status);
	out = malloc(r.body_len + 1);
	ck_assert_ptr_nonnull(out);
	memcpy(out, r.body, r.body_len);
	*n = r.body_len;
	th_response_free(&r);
	return out;
}

/* Uploads n floats (a deterministic pattern) as name on d, shape rows x cols. */
static float *put_pattern(struct th_daemon *d, const char *name, size_t rows, size_t cols,
                          const char *where)
{
	float *x = malloc(rows * cols * sizeof *x);
	char *path;
	struct th_response r;
	const char *h[] = {auth[0], "Content-Type: application/octet-stream", NULL};

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < rows * cols; i++)
		x[i] = (float)((i * 2654435761u) % 100003u) / 977.0f - 50.0f;
	path = th_fmt("/v1/arrays/%s?dtype=float32&shape=%zu,%zu%s", name, rows, cols,
	              where ? where : "");
	th_request(d, "PUT", path, h, (const char *)x, rows * cols * sizeof *x, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "PUT %s: %ld %s", path, r.status, r.body);
	th_response_free(&r);
	free(path);
	return x;
}

/* Bytes in use in d's unpinned_host spaces (the receives' staging). */
static double unpinned_in_use(struct th_daemon *d)
{
	size_t n;
	char *text = get_bytes_auth(d, "/metrics", &n), *save = NULL, *line;
	double sum = 0;

	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *sp = strrchr(line, ' ');

		if (strncmp(line, "tstage_memory_in_use_bytes{", 27) == 0 && sp &&
		    strstr(line, "memory_kind=\"unpinned_host\""))
			sum += strtod(sp + 1, NULL);
	}
	free(text);
	return sum;
}

/* Polls operation id on d until it is final: the operation (new reference). */
static json_t *await_op(struct th_daemon *d, const char *id, int ms)
{
	double start = now_ms();

	for (;;) {
		char *path = th_fmt("/v1/operations/%s", id);
		json_t *op = get_auth(d, path);

		free(path);
		if (th_op_terminal(json_string_value(th_op_meta(op, "state"))))
			return op;
		json_decref(op);
		ck_assert_msg(now_ms() - start < ms, "operation %s not final after %d ms", id, ms);
		usleep(20000);
	}
}

/* POST path (body JSON text or NULL) with the token, which must answer
 * want; what names the request in the failure. */
static void post_expect(struct th_daemon *d, const char *path, const char *body, long want,
                        const char *what)
{
	struct th_response r;

	post_auth(d, path, body, &r);
	ck_assert_msg(r.status == want, "%s: %ld %s", what, r.status, r.body);
	th_response_free(&r);
}

/* The same for an answer that is a JSON object: it (new reference). */
static json_t *post_object(struct th_daemon *d, const char *path, const char *body, long want,
                           const char *what)
{
	struct th_response r;
	json_t *o;

	post_auth(d, path, body, &r);
	ck_assert_msg(r.status == want, "%s: %ld %s", what, r.status, r.body);
	o = json_incref(th_json(&r));
	th_response_free(&r);
	return o;
}

/* Polls d's unpinned_host bytes in use until they are base again, at most
 * ms; what names the memory in the failure. */
static void await_unpinned(struct th_daemon *d, double base, int ms, const char *what)
{
	for (double t0 = now_ms(); unpinned_in_use(d) != base; usleep(20000))
		ck_assert_msg(now_ms() - t0 < ms, "%s is still held", what);
}

/* POST path (body JSON text) with the token, which must start an
 * operation (202): its id into id (cap bytes). */
static void post_started(struct th_daemon *d, const char *path, const char *body,
                         const char *what, char *id, size_t cap)
{
	struct th_response r;

	post_auth(d, path, body, &r);
	ck_assert_msg(r.status == 202, "%s: %ld %s", what, r.status, r.body);
	snprintf(id, cap, "%s", th_str(th_obj(th_json(&r), "metadata"), "id"));
	th_response_free(&r);
}

/* Polls operation id on d until its first bytes have moved (or it is
 * final), at most 20 s. */
static void await_first_bytes(struct th_daemon *d, const char *id)
{
	for (double t0 = now_ms();; usleep(1000)) {
		char *path = th_fmt("/v1/operations/%s", id);
		json_t *o = get_auth(d, path);

		free(path);
		if (th_int(th_op_meta(o, "progress"), "bytes_done") > 0 ||
		    th_op_terminal(json_string_value(th_op_meta(o, "state")))) {
			json_decref(o);
			return;
		}
		json_decref(o);
		ck_assert_msg(now_ms() - t0 < 20000, "no byte moved in 20 s");
	}
}

/* GET path's body on d with the token: 200 and exactly the n bytes of want. */
static void expect_bytes(struct th_daemon *d, const char *path, const void *want, size_t n)
{
	size_t got_n;
	char *got = get_bytes_auth(d, path, &got_n);

	ck_assert_int_eq(got_n, n);
	ck_assert(memcmp(got, want, n) == 0);
	free(got);
}

/* GET path on d with the token: 404. */
static void expect_not_found(struct th_daemon *d, const char *path)
{
	struct th_response r;

	th_request(d, "GET", path, auth, NULL, 0, &r);
	ck_assert_int_eq(r.status, 404);
	th_response_free(&r);
}

/* The peak bytes in use of d's space (device, memory kind). */
static long long space_peak(struct th_daemon *d, const char *dev, const char *kind)
{
	json_t *o = get_auth(d, "/v1/memory"), *sp;
	long long peak = -1;
	size_t i;

	json_array_foreach(th_arr(o, "spaces"), i, sp)
		if (!strcmp(th_str(sp, "device"), dev) && !strcmp(th_str(sp, "memory_kind"), kind))
			peak = th_int(sp, "peak_bytes_in_use");
	json_decref(o);
	ck_assert_msg(peak >= 0, "no space %s/%s", dev, kind);
	return peak;
}

/* A float32 array copied to another node arrives byte for byte where the
 * request placed it, its bytes landing there (host memory, no conversion:
 * no staging beside it, so that space's peak is the array's size and no
 * other space's moves); a conversion to bfloat16 there equals the local
 * :copy's; a :put moves it (the source goes only once it is there); an
 * unknown host is 404 naming it, an existing "out" 409 unless overwrite. */
START_TEST(test_cross_node_copy)
{
	struct th_daemon d[2];
	int ports[2];
	char *want;
	struct th_response r;
	json_t *o, *res;
	size_t rows = 1536, cols = 1024, m;   /* 6 MiB: two chunks */
	long long staging_peak;
	float *x;

	start_fleet_one_token(d, 2, ports);
	json_decref(await_node(&d[0], ports[1], true));
	x = put_pattern(&d[0], "x", rows, cols, NULL);
	staging_peak = space_peak(&d[1], "sim:0", "unpinned_host");

	post_auth(&d[0], "/v1/arrays/x:copy?wait=true",
	          "{\"out\": \"y\", \"host\": \"node1\", \"device\": \"sim:1\", "
	          "\"memory_kind\": \"pinned_host\"}", &r);
	ck_assert_msg(r.status == 200, "copy: %ld %s", r.status, r.body);
	res = th_json(&r);
	ck_assert_str_eq(th_str(res, "host"), "node1");
	ck_assert_str_eq(th_str(th_obj(th_obj(res, "array"), "sharding"), "device"), "sim:1");
	th_response_free(&r);
	o = get_auth(&d[1], "/v1/arrays/y");
	ck_assert_str_eq(th_str(th_obj(o, "sharding"), "device"), "sim:1");
	ck_assert_str_eq(th_str(th_obj(o, "sharding"), "memory_kind"), "pinned_host");
	ck_assert_str_eq(th_str(o, "dtype"), "float32");
	json_decref(o);
	expect_bytes(&d[1], "/v1/arrays/y/data", x, rows * cols * sizeof(float));
	ck_assert_int_eq(space_peak(&d[1], "sim:1", "pinned_host"),
	                 (long long)(rows * cols * sizeof(float)));
	ck_assert_int_eq(space_peak(&d[1], "sim:0", "unpinned_host"), staging_peak);

	/* a sharding there: split over both of its devices, the same bytes */
	post_expect(&d[0], "/v1/arrays/x:copy?wait=true",
	            "{\"out\": \"ys\", \"host\": \"node1\", \"sharding\": {\"mesh\": "
	            "{\"devices\": [\"sim:0\", \"sim:1\"], \"axis_names\": [\"x\"], "
	            "\"shape\": [2]}, \"spec\": [\"x\", null], \"memory_kind\": \"device\"}}",
	            200, "sharded copy");
	o = get_auth(&d[1], "/v1/arrays/ys");
	ck_assert_int_eq(json_array_size(th_arr(o, "shards")), 2);
	ck_assert_str_eq(th_str(json_array_get(th_arr(o, "shards"), 1), "device"), "sim:1");
	json_decref(o);
	expect_bytes(&d[1], "/v1/arrays/ys/data", x, rows * cols * sizeof(float));

	/* a conversion on the way equals the local one */
	post_expect(&d[0], "/v1/arrays/x:copy?wait=true",
	            "{\"out\": \"yb\", \"host\": \"node1\", \"dtype\": \"bfloat16\"}", 200, "copy");
	post_expect(&d[0], "/v1/arrays/x:copy?wait=true",
	            "{\"out\": \"xb\", \"dtype\": \"bfloat16\"}", 200, "local copy");
	want = get_bytes_auth(&d[0], "/v1/arrays/xb/data", &m);
	ck_assert_int_eq(m, rows * cols * 2);
	expect_bytes(&d[1], "/v1/arrays/yb/data", want, m);
	free(want);

	/* refusals: an unknown host, an existing name, a bad field there */
	post_auth(&d[0], "/v1/arrays/x:copy", "{\"out\": \"y\", \"host\": \"node9\"}", &r);
	th_expect_error(&r, "unknown host", 404, "NOT_FOUND", "HOST_NOT_FOUND", "node9", NULL);
	post_auth(&d[0], "/v1/arrays/x:copy?wait=true", "{\"out\": \"y\", \"host\": \"node1\"}", &r);
	th_expect_error(&r, "existing out", 409, "ALREADY_EXISTS", NULL, "node1", "overwrite");
	post_auth(&d[0], "/v1/arrays/x:copy?wait=true",
	          "{\"out\": \"y\", \"host\": \"node1\", \"overwrite\": true, "
	          "\"memory_kind\": \"pinned_host\", \"device\": \"sim:7\"}", &r);
	th_expect_error(&r, "bad device there", 400, "INVALID_ARGUMENT", NULL, "sim:7", NULL);

	/* an empty array arrives as one */
	th_request(&d[0], "PUT", "/v1/arrays/e?dtype=float32&shape=0,4",
	           (const char *const[]){auth[0], "Content-Type: application/octet-stream", NULL},
	           "", 0, &r);
	ck_assert_msg(r.status == 200 || r.status == 201, "PUT e: %ld %s", r.status, r.body);
	th_response_free(&r);
	post_expect(&d[0], "/v1/arrays/e:copy?wait=true", "{\"out\": \"e\", \"host\": \"node1\"}",
	            200, "copy e");
	o = get_auth(&d[1], "/v1/arrays/e");
	ck_assert_int_eq(th_int(o, "nbytes"), 0);
	json_decref(o);

	/* a :put moves it: there, and gone here */
	post_expect(&d[0], "/v1/arrays/x:put?wait=true", "{\"host\": \"node1\"}", 200, "put");
	expect_bytes(&d[1], "/v1/arrays/x/data", x, rows * cols * sizeof(float));
	expect_not_found(&d[0], "/v1/arrays/x");
	free(x);
	for (int i = 0; i < 2; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* A GET with the token on a connection of its own (raw HTTP/1.1, closed
 * after the answer), for a thread beside the harness's requests: the
 * answer's status into status, its text (head and body) into text. */
struct raw_get {
	int port;
	const char *path;
	long status;
	char text[4096];
};

static void *raw_get_main(void *arg)
{
	struct raw_get *g = arg;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g->port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	size_t n = 0;
	ssize_t got;
	char req[512];

	g->status = -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	snprintf(req, sizeof req,
	         "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " TOKEN
	         "\r\nConnection: close\r\n\r\n", g->path);
	if (write(fd, req, strlen(req)) == (ssize_t)strlen(req))
		while (n + 1 < sizeof g->text &&
		       (got = read(fd, g->text + n, sizeof g->text - 1 - n)) > 0)
			n += (size_t)got;
	g->text[n] = '\0';
	close(fd);
	if (sscanf(g->text, "HTTP/1.1 %ld", &g->status) != 1)
		g->status = -1;
	return NULL;
}

/* A fake peer on 127.0.0.1:port: it answers the fleet's poll as node
 * "fake" and a receive with an array, except that on each connection it
 * meets the second receive request with a close and no answer, as a peer
 * gone between the sender's check of a kept connection and its request;
 * GET /v1/memory it never answers, as a peer that stopped. */
struct fake_peer {
	int fd;                          /* listening */
	int port;
	atomic_int receives;             /* receive requests read */
	atomic_int dropped;              /* of those, closed unanswered */
	atomic_int held;                 /* GET /v1/memory read, never answered */
	atomic_int conns;                /* connection threads alive */
	pthread_t thread;
};

struct fake_conn {
	struct fake_peer *fp;
	int fd;
};

static void fake_answer(int fd, const char *json)
{
	char head[160];
	int n = snprintf(head, sizeof head,
	                 "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
	                 "Content-Length: %zu\r\n\r\n", strlen(json));

	if (write(fd, head, (size_t)n) != n || write(fd, json, strlen(json)) < 0)
		return;
}

static void *fake_conn_main(void *arg)
{
	struct fake_conn *c = arg;
	char *buf = malloc(1 << 16);
	size_t have = 0;
	int receives = 0;

	if (!buf)
		goto out;

	for (;;) {
		char *end, head[1024];
		size_t head_len, clen = 0;
		const char *cl;
		ssize_t got;

		while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
			got = have < (1 << 16) ? read(c->fd, buf + have, (1 << 16) - have) : -1;
			if (got <= 0)
				goto out;
			have += (size_t)got;
		}
		head_len = (size_t)(end + 4 - buf);
		snprintf(head, sizeof head, "%.*s", (int)(head_len < sizeof head ? head_len
		                                                                   : sizeof head - 1),
		         buf);
		cl = strcasestr(head, "\r\nContent-Length:");
		if (cl)
			clen = strtoul(cl + 17, NULL, 10);
		while (have < head_len + clen) {
			got = have < (1 << 16) ? read(c->fd, buf + have, (1 << 16) - have) : -1;
			if (got <= 0)
				goto out;
			have += (size_t)got;
		}
		if (strncmp(head, "GET /v1/memory", 14) == 0) {
			atomic_fetch_add(&c->fp->held, 1);   /* never answered */
		} else if (strncmp(head, "GET /v1/fleet", 13) == 0) {
			fake_answer(c->fd, "{\"nodes\": [{\"host\": \"fake\", \"version\": \"0\", "
			                   "\"devices\": []}]}");
		} else if (strncmp(head, "POST /v1/fleet:receive", 22) == 0) {
			atomic_fetch_add(&c->fp->receives, 1);
			if (++receives == 2) {
				atomic_fetch_add(&c->fp->dropped, 1);
				goto out;
			}
			fake_answer(c->fd, "{\"name\": \"y\", \"etag\": \"\\\"1-f\\\"\"}");
		} else {
			goto out;
		}
		memmove(buf, buf + head_len + clen, have - head_len - clen);
		have -= head_len + clen;
	}
out:
	free(buf);
	close(c->fd);
	atomic_fetch_sub(&c->fp->conns, 1);
	free(c);
	return NULL;
}

static void *fake_accept_main(void *arg)
{
	struct fake_peer *fp = arg;
	int fd;

	while ((fd = accept(fp->fd, NULL, NULL)) >= 0) {
		struct fake_conn *c = malloc(sizeof *c);
		pthread_t t;

		ck_assert_ptr_nonnull(c);
		c->fp = fp;
		c->fd = fd;
		atomic_fetch_add(&fp->conns, 1);
		ck_assert_int_eq(pthread_create(&t, NULL, fake_conn_main, c), 0);
		pthread_detach(t);
	}
	return NULL;
}

/* Listens on a loopback port of the kernel's choosing, into fp->port. */
static void fake_peer_start(struct fake_peer *fp)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof a;

	memset(fp, 0, sizeof *fp);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fp->fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(fp->fd, 0);
	ck_assert_int_eq(bind(fp->fd, (struct sockaddr *)&a, sizeof a), 0);
	ck_assert_int_eq(getsockname(fp->fd, (struct sockaddr *)&a, &len), 0);
	fp->port = ntohs(a.sin_port);
	ck_assert_int_eq(listen(fp->fd, 16), 0);
	ck_assert_int_eq(pthread_create(&fp->thread, NULL, fake_accept_main, fp), 0);
}

/* Stops the listener; its connections end as their client closes them. */
static void fake_peer_stop(struct fake_peer *fp)
{
	shutdown(fp->fd, SHUT_RDWR);
	close(fp->fd);
	pthread_join(fp->thread, NULL);
	for (double t0 = now_ms(); atomic_load(&fp->conns) > 0; usleep(10000))
		ck_assert_msg(now_ms() - t0 < 10000, "the fake peer's connections are still open");
}

/* Starts a fake peer and d, node0, naming it as its only peer, once node0
 * sees it reachable. */
static void start_with_fake_peer(struct th_daemon *d, struct fake_peer *fp)
{
	int p;
	char token[512], peers[64], port[16];
	const char *args[] = {"--port", port, "--host-name", "node0", "--peers", peers,
	                      "--token-file", token, NULL};

	th_write_temp("token", TOKEN "\n", token, sizeof token);
	fake_peer_start(fp);
	snprintf(peers, sizeof peers, "http://127.0.0.1:%d", fp->port);
	start_on_free_port(d, &p, port, args);
	json_decref(await_node(d, fp->port, true));
}

/* A call to a peer on a kept connection that the peer drops without an
 * answer goes once more on a new connection (libcurl's own retry, which
 * fleet_xfer.c relies on): the second small copy to a peer that closes the
 * kept connection on its second request succeeds, and the peer read three
 * receive requests, one of them dropped. */
START_TEST(test_kept_connection_dropped_is_called_again)
{
	struct th_daemon d;
	struct fake_peer fp;
	json_t *o;

	start_with_fake_peer(&d, &fp);
	free(put_pattern(&d, "x", 4, 4, NULL));
	for (int i = 0; i < 2; i++) {
		o = post_object(&d, "/v1/arrays/x:copy?wait=true", "{\"out\": \"y\", \"host\": \"fake\"}",
		                200, i ? "copy on the dropped connection" : "first copy");
		ck_assert_str_eq(th_str(o, "host"), "fake");
		ck_assert_str_eq(th_str(th_obj(o, "array"), "etag"), "\"1-f\"");
		json_decref(o);
	}
	ck_assert_int_eq(atomic_load(&fp.receives), 3);
	ck_assert_int_eq(atomic_load(&fp.dropped), 1);
	th_daemon_stop_ok(&d);
	fake_peer_stop(&fp);
}
END_TEST

/* A read of a peer that has stopped answering (before a poll sees it)
 * holds no loop of node0's: its other calls answer at once meanwhile, and
 * the read ends DEADLINE_EXCEEDED naming the peer after the forward's 5 s
 * (a daemon that asked on the loop's thread held them all that long). */
START_TEST(test_read_of_silent_peer_holds_no_loop)
{
	struct th_daemon d;
	struct fake_peer fp;
	struct raw_get g = {.path = "/v1/memory?host=fake"};
	pthread_t t;
	double t0;

	start_with_fake_peer(&d, &fp);
	g.port = d.port;
	ck_assert_int_eq(pthread_create(&t, NULL, raw_get_main, &g), 0);
	for (t0 = now_ms(); atomic_load(&fp.held) == 0; usleep(10000))
		ck_assert_msg(now_ms() - t0 < 5000, "the read never reached the peer");
	for (int i = 0; i < 8; i++) {
		t0 = now_ms();
		ck_assert_int_eq(th_get_status(&d, "/livez"), 200);
		json_decref(get_auth(&d, "/v1/memory"));
		ck_assert_msg(now_ms() - t0 < 500, "node0 took %.0f ms while a read of a peer waits",
		              now_ms() - t0);
	}
	ck_assert_int_eq(pthread_join(t, NULL), 0);
	ck_assert_msg(g.status == 504 && strstr(g.text, "PEER_SILENT") && strstr(g.text, "fake"),
	              "read of a silent peer: %ld %s", g.status, g.text);
	th_daemon_stop_ok(&d);
	fake_peer_stop(&fp);
}
END_TEST

/* A receive checks its request before anything is allocated; its staging
 * memory counts while it is open, and an abort or its deadline gives it
 * back, leaving no array; a commit after that is 404. */
START_TEST(test_receive_expires_and_aborts)
{
	struct th_daemon d[2];
	int ports[2];
	char *path;
	struct th_response r;
	json_t *o;
	double base, open;

	start_fleet_one_token(d, 2, ports);
	base = unpinned_in_use(&d[1]);
	post_auth(&d[1], "/v1/fleet:receive",
	          "{\"out\": \"r\", \"dtype\": \"float32\", \"shape\": [1024, 256], \"oops\": 1}", &r);
	th_expect_error(&r, "unknown field", 400, "INVALID_ARGUMENT", NULL, "oops", NULL);
	post_auth(&d[1], "/v1/fleet:receive", "{\"out\": \"r\", \"dtype\": \"float32\"}", &r);
	th_expect_error(&r, "no shape", 400, "INVALID_ARGUMENT", NULL, "shape", NULL);
	post_auth(&d[1], "/v1/fleet:receive",
	          "{\"out\": \"r\", \"dtype\": \"float32\", \"shape\": [1024, 1024, 1024]}", &r);
	th_expect_error(&r, "too big", 429, "RESOURCE_EXHAUSTED", NULL, NULL, NULL);
	await_unpinned(&d[1], base, 2000, "a refused receive's memory");

	/* one that expires */
	o = post_object(&d[1], "/v1/fleet:receive",
	                "{\"out\": \"r\", \"dtype\": \"float32\", \"shape\": [1024, 256], "
	                "\"timeout_seconds\": 1}", 201, "receive");
	ck_assert_int_eq(th_int(o, "length"), 1024 * 256 * 4);
	ck_assert_int_eq(strlen(th_str(o, "ticket")), 64);
	ck_assert_int_eq(th_int(o, "fleet_port"), ports[1] + 1);
	/* the bytes come as active messages: no remote key, no address */
	ck_assert_ptr_null(json_object_get(o, "rkey"));
	ck_assert_ptr_null(json_object_get(o, "address"));
	open = unpinned_in_use(&d[1]);
	ck_assert_msg(open >= base + 1024 * 256 * 4, "staging not counted: %.0f -> %.0f", base, open);
	await_unpinned(&d[1], base, 5000, "the receive's memory");
	path = th_fmt("/v1/fleet/receives/%s:commit", th_str(o, "id"));
	post_auth(&d[1], path, NULL, &r);
	th_expect_error(&r, "late commit", 404, "NOT_FOUND", "RECEIVE_NOT_FOUND", NULL, NULL);
	free(path);
	json_decref(o);
	expect_not_found(&d[1], "/v1/arrays/r");

	/* a small one whose bytes come with it ("data", base64): published at
	 * once with those bytes; data of the wrong length or not base64 is
	 * refused and publishes nothing */
	post_auth(&d[1], "/v1/fleet:receive",
	          "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [5], \"data\": \"AQID\"}",
	          &r);
	th_expect_error(&r, "short data", 400, "INVALID_ARGUMENT", NULL, "base64", NULL);
	post_auth(&d[1], "/v1/fleet:receive",
	          "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [5], \"data\": \"AQ*DBA==\"}",
	          &r);
	th_expect_error(&r, "bad data", 400, "INVALID_ARGUMENT", NULL, "base64", NULL);
	expect_not_found(&d[1], "/v1/arrays/r");
	o = post_object(&d[1], "/v1/fleet:receive?wait=true",
	                "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [5], "
	                "\"memory_kind\": \"pinned_host\", \"data\": \"AQIDBAU=\"}",
	                200, "inline receive");
	ck_assert_str_eq(th_str(o, "name"), "r");
	json_decref(o);
	expect_bytes(&d[1], "/v1/arrays/r/data", "\1\2\3\4\5", 5);
	th_request(&d[1], "DELETE", "/v1/arrays/r", auth, NULL, 0, &r);
	th_response_free(&r);
	post_raw(&d[1], "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [5], "
	                "\"memory_kind\": \"pinned_host\"}",
	         "\5\4\0\2\1", 5, &r);
	ck_assert_msg(r.status == 200, "raw receive: %ld %s", r.status, r.body);
	th_response_free(&r);
	expect_bytes(&d[1], "/v1/arrays/r/data", "\5\4\0\2\1", 5);
	th_request(&d[1], "DELETE", "/v1/arrays/r", auth, NULL, 0, &r);
	th_response_free(&r);
	/* the raw form: its header is required, a JSON object, without "data"
	 * or "forward"; the body exactly the array's bytes */
	post_raw(&d[1], NULL, "\1\2\3\4\5", 5, &r);
	th_expect_error(&r, "raw, no header", 400, "INVALID_ARGUMENT", NULL, "X-Tstage-Receive",
	                NULL);
	post_raw(&d[1], "[1]", "\1\2\3\4\5", 5, &r);
	th_expect_error(&r, "raw, header an array", 400, "INVALID_ARGUMENT", NULL,
	                "X-Tstage-Receive", NULL);
	post_raw(&d[1], "{\"out\": \"r\", \"dtype\": \"uint8\", \"sh\xff\": [5]}", "\1\2\3\4\5",
	         5, &r);
	th_expect_error(&r, "raw, header not UTF-8", 400, "INVALID_ARGUMENT", NULL,
	                "X-Tstage-Receive", NULL);
	post_raw(&d[1], "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [5]}", "\1\2\3\4",
	         4, &r);
	th_expect_error(&r, "raw, short body", 400, "INVALID_ARGUMENT", NULL, "5 bytes", NULL);
	post_raw(&d[1], "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [5]}",
	         "\1\2\3\4\5\6", 6, &r);
	th_expect_error(&r, "raw, long body", 400, "INVALID_ARGUMENT", NULL, "5 bytes", NULL);
	post_raw(&d[1], "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [5], "
	                "\"data\": \"AQIDBAU=\"}",
	         "\1\2\3\4\5", 5, &r);
	th_expect_error(&r, "raw with data", 400, "INVALID_ARGUMENT", NULL, "data", NULL);
	/* an array too large to come with a request: refused before its memory
	 * is taken, in either form */
	post_raw(&d[1], "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [1048576]}",
	         "\1\2\3\4\5", 5, &r);
	th_expect_error(&r, "raw, large array", 400, "INVALID_ARGUMENT", NULL, "1048576 bytes",
	                NULL);
	post_auth(&d[1], "/v1/fleet:receive",
	          "{\"out\": \"r\", \"dtype\": \"uint8\", \"shape\": [1048576], \"data\": \"AQID\"}",
	          &r);
	th_expect_error(&r, "data, large array", 400, "INVALID_ARGUMENT", NULL, "1048576 bytes",
	                NULL);
	expect_not_found(&d[1], "/v1/arrays/r");
	await_unpinned(&d[1], base, 2000, "refused raw receives' memory");

	/* one aborted */
	o = post_object(&d[1], "/v1/fleet:receive",
	                "{\"out\": \"r\", \"dtype\": \"bfloat16\", \"source_dtype\": \"float32\", "
	                "\"shape\": [1024, 256], \"memory_kind\": \"pinned_host\"}",
	                201, "receive");
	ck_assert(unpinned_in_use(&d[1]) > base);
	path = th_fmt("/v1/fleet/receives/%s:abort", th_str(o, "id"));
	post_expect(&d[1], path, NULL, 200, "abort");
	/* freed once the fleet port has closed its endpoint (none here) */
	await_unpinned(&d[1], base, 2000, "the aborted receive's memory");
	post_auth(&d[1], path, NULL, &r);
	th_expect_error(&r, "second abort", 404, "NOT_FOUND", "RECEIVE_NOT_FOUND", NULL, NULL);
	free(path);
	json_decref(o);
	for (int i = 0; i < 2; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* The destination killed in the middle of a copy: the operation fails
 * naming the peer, and the source array is as it was (same version, same
 * bytes); a :put to it leaves the source in place. */
START_TEST(test_destination_killed_mid_copy)
{
	struct th_daemon d[2];
	int ports[2];
	char id[64];
	struct th_response r;
	json_t *o, *before, *after;
	size_t rows = 16384, cols = 4096;    /* 256 MiB */
	float *x;
	const char *msg;

	start_fleet_one_token(d, 2, ports);
	json_decref(await_node(&d[0], ports[1], true));
	x = put_pattern(&d[0], "big", rows, cols, "&device=sim:0&memory_kind=unpinned_host");
	before = get_auth(&d[0], "/v1/arrays/big");
	post_started(&d[0], "/v1/arrays/big:put", "{\"host\": \"node1\"}", "put", id, sizeof id);
	/* wait for the first bytes to land, then kill the destination */
	await_first_bytes(&d[0], id);
	th_daemon_signal(&d[1], SIGKILL);
	ck_assert_int_ne(th_daemon_wait(&d[1], 10000), -1);
	o = await_op(&d[0], id, 60000);
	ck_assert_str_eq(json_string_value(th_op_meta(o, "state")), "FAILED");
	msg = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
	ck_assert_msg(msg && strstr(msg, "node1"), "message: %s", msg ? msg : "(none)");
	json_decref(o);
	/* once the fleet view says so, a copy to it is refused at once, named */
	json_decref(await_node(&d[0], ports[1], false));
	post_auth(&d[0], "/v1/arrays/big:copy", "{\"out\": \"b2\", \"host\": \"node1\"}", &r);
	th_expect_error(&r, "unreachable host", 503, "UNAVAILABLE", "PEER_UNREACHABLE", "node1",
	                NULL);
	after = get_auth(&d[0], "/v1/arrays/big");
	ck_assert_str_eq(th_str(after, "etag"), th_str(before, "etag"));
	expect_bytes(&d[0], "/v1/arrays/big/data", x, rows * cols * sizeof(float));
	free(x);
	json_decref(before);
	json_decref(after);
	th_daemon_stop_ok(&d[0]);
	th_daemon_stop(&d[1], false);   /* the killed daemon's client and files */
}
END_TEST

/* A cross-node copy cancelled in the middle ends CANCELLED; the receive is
 * aborted there (its staging and destination memory back, no array). */
START_TEST(test_cross_node_copy_cancelled)
{
	struct th_daemon d[2];
	int ports[2];
	char id[64], *path;
	json_t *o;
	size_t rows = 16384, cols = 4096;    /* 256 MiB */
	double base;

	start_fleet_one_token(d, 2, ports);
	json_decref(await_node(&d[0], ports[1], true));
	free(put_pattern(&d[0], "big", rows, cols, "&device=sim:0&memory_kind=unpinned_host"));
	base = unpinned_in_use(&d[1]);
	post_started(&d[0], "/v1/arrays/big:copy",
	             "{\"out\": \"c\", \"host\": \"node1\", \"memory_kind\": \"unpinned_host\"}",
	             "copy", id, sizeof id);
	await_first_bytes(&d[0], id);
	path = th_fmt("/v1/operations/%s:cancel", id);
	post_expect(&d[0], path, NULL, 200, "cancel");
	free(path);
	o = await_op(&d[0], id, 60000);
	ck_assert_str_eq(json_string_value(th_op_meta(o, "state")), "CANCELLED");
	json_decref(o);
	expect_not_found(&d[1], "/v1/arrays/c");
	await_unpinned(&d[1], base, 5000, "the aborted receive's memory");
	for (int i = 0; i < 2; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* The value of the metric line that starts with name (labels included)
 * in d's /metrics; 0 when absent. */
static double metric_value(struct th_daemon *d, const char *name)
{
	size_t n, len = strlen(name);
	char *text = get_bytes_auth(d, "/metrics", &n), *save = NULL, *line;
	double v = 0;

	for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
		if (strncmp(line, name, len) == 0 && line[len] == ' ')
			v = strtod(line + len + 1, NULL);
	free(text);
	return v;
}

#define SENT "tstage_fleet_transfer_bytes_total{direction=\"sent\"}"
#define RECEIVED "tstage_fleet_transfer_bytes_total{direction=\"received\"}"

/* The broadcast's destination entry for host in list (borrowed). */
static json_t *dest_of(json_t *list, const char *host)
{
	size_t i;
	json_t *e;

	json_array_foreach(list, i, e)
		if (strcmp(th_str(e, "host"), host) == 0)
			return e;
	ck_abort_msg("no destination '%s'", host);
	return NULL;
}

/* Polls until d's fleet view has every other node reachable. */
static void await_all(struct th_daemon *d, int n, const int *ports)
{
	for (int i = 0; i < n; i++)
		for (int j = 0; j < n; j++)
			if (j != i)
				json_decref(await_node(&d[i], ports[j], true));
}

/* A broadcast to two hosts: each has the array byte for byte where the
 * request placed it; the operation's metadata lists each destination's
 * host and bytes while it runs and at its end, its progress counts every
 * destination's bytes, the source's sent counter both copies and each
 * destination's received counter one. */
START_TEST(test_broadcast_two_hosts)
{
	struct th_daemon d[3];
	int ports[3];
	char id[64], *got, *path;
	struct th_response r;
	json_t *res, *o, *o2, *list;
	size_t rows = 4096, cols = 4096, n;    /* 64 MiB: 16 chunks */
	uint64_t nbytes = rows * cols * sizeof(float);
	double sent0, sent1, recv1;
	float *x;
	bool seen_running = false;

	start_fleet_one_token(d, 3, ports);
	await_all(d, 3, ports);
	x = put_pattern(&d[0], "x", rows, cols, NULL);
	sent0 = metric_value(&d[0], SENT);
	sent1 = metric_value(&d[1], SENT);
	recv1 = metric_value(&d[1], RECEIVED);

	post_auth(&d[0], "/v1/arrays/x:copy",
	          "{\"out\": \"y\", \"hosts\": [\"node1\", \"node2\"], \"device\": \"sim:1\", "
	          "\"memory_kind\": \"pinned_host\"}", &r);
	ck_assert_msg(r.status == 202, "broadcast: %ld %s", r.status, r.body);
	snprintf(id, sizeof id, "%s", th_str(th_obj(th_json(&r), "metadata"), "id"));
	th_response_free(&r);
	for (double t0 = now_ms();; usleep(2000)) {
		path = th_fmt("/v1/operations/%s", id);
		o = get_auth(&d[0], path);
		free(path);
		if (th_op_terminal(json_string_value(th_op_meta(o, "state")))) {
			json_decref(o);
			break;
		}
		list = json_object_get(json_object_get(o, "metadata"), "destinations");
		if (json_array_size(list) == 2) {
			ck_assert_str_eq(th_str(json_array_get(list, 0), "host"), "node1");
			ck_assert_str_eq(th_str(json_array_get(list, 1), "host"), "node2");
			ck_assert_int_le(th_int(json_array_get(list, 0), "bytes_done"), nbytes);
			seen_running = true;
		}
		json_decref(o);
		ck_assert_msg(now_ms() - t0 < 60000, "broadcast not done in 60 s");
	}
	ck_assert_msg(seen_running, "no destination progress seen while it ran");
	o = await_op(&d[0], id, 1000);
	ck_assert_str_eq(json_string_value(th_op_meta(o, "state")), "SUCCEEDED");
	ck_assert_int_eq(th_int(th_op_meta(o, "progress"), "bytes_done"), 2 * nbytes);
	ck_assert_int_eq(th_int(th_op_meta(o, "progress"), "bytes_total"), 2 * nbytes);
	list = th_op_meta(o, "destinations");
	for (int i = 1; i <= 2; i++) {
		json_t *e = dest_of(list, i == 1 ? "node1" : "node2");

		ck_assert_int_eq(th_int(e, "bytes_done"), nbytes);
		ck_assert_str_eq(th_str(e, "state"), "published");
	}
	res = th_op_result(o);
	ck_assert_int_eq(json_array_size(th_arr(res, "failed_hosts")), 0);
	o2 = get_auth(&d[0], "/v1/arrays/x");
	ck_assert_str_eq(th_str(res, "source_etag"), th_str(o2, "etag"));
	json_decref(o2);
	for (int i = 1; i <= 2; i++) {
		json_t *e = dest_of(th_arr(res, "destinations"), i == 1 ? "node1" : "node2"), *a;

		ck_assert_str_eq(th_str(e, "state"), "published");
		ck_assert_str_eq(th_str(th_obj(th_obj(e, "array"), "sharding"), "device"), "sim:1");
		a = get_auth(&d[i], "/v1/arrays/y");
		ck_assert_str_eq(th_str(th_obj(a, "sharding"), "memory_kind"), "pinned_host");
		ck_assert_str_eq(th_str(a, "etag"), th_str(th_obj(e, "array"), "etag"));
		json_decref(a);
		got = get_bytes_auth(&d[i], "/v1/arrays/y/data", &n);
		ck_assert_int_eq(n, nbytes);
		ck_assert(memcmp(got, x, n) == 0);
		free(got);
	}
	json_decref(o);
	/* a chain: node0 sends the array once, to node1, which forwards it once */
	ck_assert_double_eq(metric_value(&d[0], SENT) - sent0, (double)nbytes);
	ck_assert_double_eq(metric_value(&d[1], SENT) - sent1, (double)nbytes);
	ck_assert_double_eq(metric_value(&d[1], RECEIVED) - recv1, (double)nbytes);

	/* with ?wait=true the answer is the result */
	post_auth(&d[0], "/v1/arrays/x:copy?wait=true",
	          "{\"out\": \"z\", \"hosts\": [\"node2\", \"node1\"], \"dtype\": \"bfloat16\"}", &r);
	ck_assert_msg(r.status == 200, "broadcast: %ld %s", r.status, r.body);
	res = th_json(&r);
	ck_assert_str_eq(th_str(json_array_get(th_arr(res, "destinations"), 0), "host"), "node2");
	ck_assert_str_eq(th_str(th_obj(json_array_get(th_arr(res, "destinations"), 1), "array"),
	                        "dtype"), "bfloat16");
	th_response_free(&r);
	free(x);
	for (int i = 0; i < 3; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* A broadcast's request is checked before anything moves: "host" with
 * "hosts", an empty list, a duplicate, this node, an unknown node,
 * "partial_ok" without "hosts", "hosts" on a :put. */
START_TEST(test_broadcast_refusals)
{
	struct th_daemon d[2];
	int ports[2];
	struct th_response r;

	start_fleet_one_token(d, 2, ports);
	json_decref(await_node(&d[0], ports[1], true));
	free(put_pattern(&d[0], "x", 64, 64, NULL));
	post_auth(&d[0], "/v1/arrays/x:copy",
	          "{\"out\": \"y\", \"host\": \"node1\", \"hosts\": [\"node1\"]}", &r);
	th_expect_error(&r, "host and hosts", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "hosts",
	                "not both");
	post_auth(&d[0], "/v1/arrays/x:copy", "{\"out\": \"y\", \"hosts\": []}", &r);
	th_expect_error(&r, "empty hosts", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "hosts",
	                NULL);
	post_auth(&d[0], "/v1/arrays/x:copy", "{\"out\": \"y\", \"hosts\": \"node1\"}", &r);
	th_expect_error(&r, "hosts a string", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "hosts",
	                NULL);
	post_auth(&d[0], "/v1/arrays/x:copy", "{\"out\": \"y\", \"hosts\": [\"node1\", 3]}", &r);
	th_expect_error(&r, "hosts a number", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY",
	                "hosts\"[1]", NULL);
	post_auth(&d[0], "/v1/arrays/x:copy",
	          "{\"out\": \"y\", \"hosts\": [\"node1\", \"node1\"]}", &r);
	th_expect_error(&r, "duplicate", 400, "INVALID_ARGUMENT", "DUPLICATE_HOST", "node1", "twice");
	post_auth(&d[0], "/v1/arrays/x:copy",
	          "{\"out\": \"y\", \"hosts\": [\"node1\", \"node0\"]}", &r);
	th_expect_error(&r, "self", 400, "INVALID_ARGUMENT", "BAD_HOST", "node0", "this node");
	post_auth(&d[0], "/v1/arrays/x:copy",
	          "{\"out\": \"y\", \"hosts\": [\"node1\", \"node9\"]}", &r);
	th_expect_error(&r, "unknown", 404, "NOT_FOUND", "HOST_NOT_FOUND", "node9", NULL);
	post_auth(&d[0], "/v1/arrays/x:copy",
	          "{\"out\": \"y\", \"host\": \"node1\", \"partial_ok\": true}", &r);
	th_expect_error(&r, "partial_ok with host", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY",
	                "partial_ok", NULL);
	post_auth(&d[0], "/v1/arrays/x:copy", "{\"out\": \"y\", \"partial_ok\": true}", &r);
	th_expect_error(&r, "partial_ok alone", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY",
	                "partial_ok", NULL);
	post_auth(&d[0], "/v1/arrays/x:copy",
	          "{\"out\": \"y\", \"hosts\": [\"node1\"], \"partial_ok\": 1}", &r);
	th_expect_error(&r, "partial_ok a number", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY",
	                "partial_ok", "boolean");
	post_auth(&d[0], "/v1/arrays/x:put", "{\"hosts\": [\"node1\"]}", &r);
	th_expect_error(&r, "hosts on a put", 400, "INVALID_ARGUMENT", "BAD_REQUEST_BODY", "hosts",
	                ":copy");
	/* nothing arrived anywhere */
	th_request(&d[1], "GET", "/v1/arrays/y", auth, NULL, 0, &r);
	ck_assert_int_eq(r.status, 404);
	th_response_free(&r);
	for (int i = 0; i < 2; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* One destination refuses (its "out" exists): without "partial_ok" the
 * broadcast fails naming it and the other destination publishes nothing
 * (its staging memory back); with it, the other publishes and the result
 * names the refusing one, whether it is the chain's last hop or its
 * first. */
/* node0 broadcasts "x" (nbytes, x) as out to node1 and node2 with
 * partial_ok, node `refuser` holding an array of that name already (4x4
 * float32): the operation succeeds naming only the refuser, with its
 * ALREADY_EXISTS in its destination (result and metadata), node `other`
 * publishes byte for byte, and the refuser's own array is untouched. */
static void partial_broadcast(struct th_daemon *d, const char *out, int refuser, int other,
                              const float *x, size_t nbytes)
{
	char *body = th_fmt("{\"out\": \"%s\", \"hosts\": [\"node1\", \"node2\"], "
	                    "\"partial_ok\": true}", out);
	char *refused = th_fmt("node%d", refuser), *took = th_fmt("node%d", other);
	char *data = th_fmt("/v1/arrays/%s/data", out), *meta = th_fmt("/v1/arrays/%s", out);
	struct th_response r;
	json_t *o, *res, *e;
	const char *msg;
	char *got;
	size_t n;

	post_auth(&d[0], "/v1/arrays/x:copy", body, &r);
	ck_assert_msg(r.status == 202, "broadcast: %ld %s", r.status, r.body);
	o = await_op(&d[0], th_str(th_obj(th_json(&r), "metadata"), "id"), 60000);
	th_response_free(&r);
	ck_assert_str_eq(json_string_value(th_op_meta(o, "state")), "SUCCEEDED");
	res = th_op_result(o);
	ck_assert_int_eq(json_array_size(th_arr(res, "failed_hosts")), 1);
	ck_assert_str_eq(json_string_value(json_array_get(th_arr(res, "failed_hosts"), 0)),
	                 refused);
	e = dest_of(th_arr(res, "destinations"), refused);
	ck_assert_str_eq(th_str(e, "state"), "failed");
	ck_assert_str_eq(th_str(th_obj(e, "error"), "status"), "ALREADY_EXISTS");
	msg = th_str(th_obj(e, "error"), "message");
	ck_assert_msg(strstr(msg, refused), "message: %s", msg);
	ck_assert_str_eq(th_str(dest_of(th_arr(res, "destinations"), took), "state"), "published");
	ck_assert_str_eq(th_str(dest_of(th_op_meta(o, "destinations"), refused), "state"),
	                 "failed");
	json_decref(o);
	got = get_bytes_auth(&d[other], data, &n);
	ck_assert_int_eq(n, nbytes);
	ck_assert(memcmp(got, x, n) == 0);
	free(got);
	o = get_auth(&d[refuser], meta);
	ck_assert_int_eq(th_int(o, "nbytes"), 4 * 4 * 4);   /* the refuser's own, untouched */
	json_decref(o);
	free(body);
	free(refused);
	free(took);
	free(data);
	free(meta);
}

START_TEST(test_broadcast_failed_destination)
{
	struct th_daemon d[3];
	int ports[3];
	struct th_response r;
	size_t rows = 2048, cols = 1024;    /* 8 MiB */
	double base1;
	float *x;

	start_fleet_one_token(d, 3, ports);
	await_all(d, 3, ports);
	x = put_pattern(&d[0], "x", rows, cols, NULL);
	free(put_pattern(&d[2], "y", 4, 4, NULL));   /* node2 refuses "y" */
	base1 = unpinned_in_use(&d[1]);

	post_auth(&d[0], "/v1/arrays/x:copy?wait=true",
	          "{\"out\": \"y\", \"hosts\": [\"node1\", \"node2\"]}", &r);
	th_expect_error(&r, "one refuses", 409, "ALREADY_EXISTS", NULL, "node2", NULL);
	th_request(&d[1], "GET", "/v1/arrays/y", auth, NULL, 0, &r);
	ck_assert_msg(r.status == 404, "node1 published: %ld", r.status);
	th_response_free(&r);
	for (double t0 = now_ms(); unpinned_in_use(&d[1]) != base1; usleep(20000))
		ck_assert_msg(now_ms() - t0 < 5000, "node1's aborted receive is still held");

	/* the same with partial_ok: node1 has it, node2 is named */
	partial_broadcast(d, "y", 2, 1, x, rows * cols * sizeof(float));
	/* the chain's first hop refuses: with partial_ok the chain goes around
	 * it, the source sending to node2 itself */
	free(put_pattern(&d[1], "z", 4, 4, NULL));   /* node1 refuses "z" */
	partial_broadcast(d, "z", 1, 2, x, rows * cols * sizeof(float));
	free(x);
	for (int i = 0; i < 3; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* A destination killed in the middle of a broadcast: with "partial_ok" the
 * other publishes byte for byte and the killed one is named; without it
 * the broadcast fails naming it and the other publishes nothing. */
START_TEST(test_broadcast_destination_killed)
{
	struct th_daemon d[3];
	int ports[3];
	char id[64], *got;
	json_t *o, *res;
	size_t rows = 16384, cols = 4096, n;    /* 256 MiB */
	const char *msg;
	float *x;

	start_fleet_one_token(d, 3, ports);
	await_all(d, 3, ports);
	x = put_pattern(&d[0], "big", rows, cols, "&device=sim:0&memory_kind=unpinned_host");
	post_started(&d[0], "/v1/arrays/big:copy",
	             "{\"out\": \"b\", \"hosts\": [\"node1\", \"node2\"], \"partial_ok\": true, "
	             "\"memory_kind\": \"unpinned_host\"}", "broadcast", id, sizeof id);
	await_first_bytes(&d[0], id);
	th_daemon_signal(&d[2], SIGKILL);
	ck_assert_int_ne(th_daemon_wait(&d[2], 10000), -1);
	o = await_op(&d[0], id, 120000);
	ck_assert_str_eq(json_string_value(th_op_meta(o, "state")), "SUCCEEDED");
	res = th_op_result(o);
	ck_assert_int_eq(json_array_size(th_arr(res, "failed_hosts")), 1);
	ck_assert_str_eq(json_string_value(json_array_get(th_arr(res, "failed_hosts"), 0)), "node2");
	msg = th_str(th_obj(dest_of(th_arr(res, "destinations"), "node2"), "error"), "message");
	ck_assert_msg(strstr(msg, "node2"), "message: %s", msg);
	json_decref(o);
	got = get_bytes_auth(&d[1], "/v1/arrays/b/data", &n);
	ck_assert_int_eq(n, rows * cols * sizeof(float));
	ck_assert(memcmp(got, x, n) == 0);
	free(got);
	free(x);
	th_daemon_stop_ok(&d[0]);
	th_daemon_stop_ok(&d[1]);
	th_daemon_stop(&d[2], false);   /* the killed daemon's client and files */
}
END_TEST

/* The source killed in the middle of a broadcast: every hop's receive
 * ends long before its deadline (76 s for 256 MiB), the first hop's as its
 * endpoint from the source fails, the last's as the first hop's forwarder,
 * failing, aborts it; neither publishes or holds anything. */
START_TEST(test_broadcast_source_killed)
{
	struct th_daemon d[3];
	int ports[3];
	char id[64];
	double base[3];
	struct th_response r;
	size_t rows = 16384, cols = 4096;    /* 256 MiB */

	start_fleet_one_token(d, 3, ports);
	await_all(d, 3, ports);
	for (int i = 1; i < 3; i++)
		base[i] = unpinned_in_use(&d[i]);
	free(put_pattern(&d[0], "big", rows, cols, "&device=sim:0&memory_kind=unpinned_host"));
	post_started(&d[0], "/v1/arrays/big:copy",
	             "{\"out\": \"b\", \"hosts\": [\"node1\", \"node2\"], "
	             "\"memory_kind\": \"unpinned_host\"}", "broadcast", id, sizeof id);
	await_first_bytes(&d[0], id);
	th_daemon_signal(&d[0], SIGKILL);
	ck_assert_int_ne(th_daemon_wait(&d[0], 10000), -1);
	for (int i = 1; i < 3; i++) {
		for (double t0 = now_ms();; usleep(20000)) {
			char *text = get_bytes_auth(&d[i], "/metrics", &(size_t){0});
			double open = -1, staged = -1;

			th_prom_find(text, "tstage_fleet_receives_open", NULL, &open);
			th_prom_find(text, "tstage_fleet_staging_bytes", NULL, &staged);
			free(text);
			if (open == 0 && staged == 0)
				break;
			ck_assert_msg(now_ms() - t0 < 15000,
			              "node%d still holds %.0f receives, %.0f staged bytes 15 s after "
			              "the source died", i, open, staged);
		}
		await_unpinned(&d[i], base[i], 5000, "a receive's memory");
		th_request(&d[i], "GET", "/v1/arrays/b", auth, NULL, 0, &r);
		ck_assert_msg(r.status == 404, "node%d published b: %ld %s", i, r.status, r.body);
		th_response_free(&r);
	}
	th_daemon_stop_ok(&d[1]);
	th_daemon_stop_ok(&d[2]);
	th_daemon_stop(&d[0], false);   /* the killed daemon's client and files */
}
END_TEST

/* A destination that stops answering mid-copy (SIGSTOPped) ends the copy
 * DEADLINE_EXCEEDED naming it once --fleet-timeout has passed, while the
 * source keeps serving. Resumed, the destination finds the sender's
 * endpoint closed under its receive (or the sender's abort), ends that
 * receive, frees its staging and copies anew: with
 * remote writes (UCX 1.13's software RMA over TCP) that was an abort of the
 * process, the write's acknowledgement having nowhere to go. */
START_TEST(test_silent_peer_times_out)
{
	struct th_daemon d[2];
	int ports[2];
	char tokens[2][512], id[64];
	struct th_response r;
	json_t *o;
	size_t rows = 16384, cols = 4096;    /* 256 MiB */
	double t_stop, took, base1;
	const char *msg;

	start_fleet_one_token_with(d, 2, ports, tokens,
	                           (const char *const[]){"--fleet-timeout", "2", NULL});
	json_decref(await_node(&d[0], ports[1], true));
	base1 = unpinned_in_use(&d[1]);
	free(put_pattern(&d[0], "big", rows, cols, "&device=sim:0&memory_kind=unpinned_host"));
	post_started(&d[0], "/v1/arrays/big:copy",
	             "{\"out\": \"s\", \"host\": \"node1\", \"memory_kind\": \"unpinned_host\"}",
	             "copy", id, sizeof id);
	await_first_bytes(&d[0], id);
	th_daemon_signal(&d[1], SIGSTOP);
	t_stop = now_ms();
	o = await_op(&d[0], id, 30000);
	took = now_ms() - t_stop;
	ck_assert_str_eq(json_string_value(th_op_meta(o, "state")), "FAILED");
	ck_assert_str_eq(json_string_value(json_object_get(json_object_get(o, "error"), "status")),
	                 "DEADLINE_EXCEEDED");
	msg = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
	ck_assert_msg(msg && strstr(msg, "node1") && strstr(msg, "--fleet-timeout"), "message: %s",
	              msg ? msg : "(none)");
	ck_assert_msg(took >= 1500, "failed %.0f ms after the peer stopped, before its 2 s", took);
	json_decref(o);
	ck_assert_int_eq(th_get_status(&d[0], "/livez"), 200);
	th_daemon_signal(&d[1], SIGCONT);
	/* the receive ends (its bytes stopped short) and lets go of everything */
	for (double t0 = now_ms();; usleep(20000)) {
		char *text = get_bytes_auth(&d[1], "/metrics", &(size_t){0});
		double open = -1, staged = -1;

		th_prom_find(text, "tstage_fleet_receives_open", NULL, &open);
		th_prom_find(text, "tstage_fleet_staging_bytes", NULL, &staged);
		free(text);
		if (open == 0 && staged == 0 && unpinned_in_use(&d[1]) == base1)
			break;
		ck_assert_msg(now_ms() - t0 < 10000,
		              "resumed, node1 still holds %.0f receives, %.0f staged bytes", open,
		              staged);
	}
	ck_assert_int_eq(th_get_status(&d[1], "/livez"), 200);
	/* node0 refuses a copy to a peer its last poll found unreachable (the
	 * poll during the stop); it sees node1 again within a poll */
	json_decref(await_node(&d[0], ports[1], true));
	/* the source's array is whole, and it copies to the resumed peer */
	post_auth(&d[0], "/v1/arrays/big:copy?wait=true",
	          "{\"out\": \"s\", \"host\": \"node1\", \"memory_kind\": \"unpinned_host\"}", &r);
	ck_assert_msg(r.status == 200, "copy after the timeout: %ld %s", r.status, r.body);
	th_response_free(&r);
	o = get_auth(&d[1], "/v1/arrays/s");
	ck_assert_int_eq(th_int(o, "nbytes"), rows * cols * 4);
	json_decref(o);
	for (int i = 0; i < 2; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

/* GET path with the token on d: the error th_expect_error checks. */
static void get_error(struct th_daemon *d, const char *path, long http, const char *status,
                      const char *reason, const char *word, const char *word2)
{
	struct th_response r;

	th_request(d, "GET", path, auth, NULL, 0, &r);
	th_expect_error(&r, path, http, status, reason, word, word2);
}

/* The reads with ?host=: node0 answers what node1 answers to the same call
 * (its arrays, memory, history, operations, models, topology), its own with
 * its own host or none; node1's refusal comes back with its code and reason;
 * an unknown, an empty or an unreachable host is refused; no token, no
 * call to the peer. */
START_TEST(test_reads_of_another_node)
{
	struct th_daemon d[2];
	int ports[2];
	static const char *const same[] = {
		"/v1/arrays", "/v1/arrays?page_size=1", "/v1/models", "/v1/topology",
		"/v1/operations?state=SUCCEEDED",
	};
	json_t *o, *own;
	struct th_response r;

	start_fleet_one_token(d, 2, ports);
	json_decref(await_node(&d[0], ports[1], true));
	free(put_pattern(&d[1], "on1.a", 4, 8, NULL));
	free(put_pattern(&d[1], "on1.b", 4, 8, NULL));
	free(put_pattern(&d[0], "on0.a", 2, 2, NULL));

	for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
		char *path = th_fmt("%s%shost=node1", same[i], strchr(same[i], '?') ? "&" : "?");

		o = get_auth(&d[0], path);
		own = get_auth(&d[1], same[i]);
		ck_assert_msg(json_equal(o, own), "GET %s through node0 differs from node1's own",
		              path);
		json_decref(o);
		json_decref(own);
		free(path);
	}
	o = get_auth(&d[0], "/v1/arrays?host=node1");
	ck_assert_int_eq(json_array_size(th_arr(o, "arrays")), 2);
	ck_assert_str_eq(th_str(json_array_get(th_arr(o, "arrays"), 0), "name"), "on1.a");
	json_decref(o);
	o = get_auth(&d[0], "/v1/arrays?page_size=1&host=node1");   /* the other arguments go along */
	ck_assert_int_eq(json_array_size(th_arr(o, "arrays")), 1);
	ck_assert(json_is_string(json_object_get(o, "next_page_token")));
	json_decref(o);
	o = get_auth(&d[0], "/v1/memory?host=node1");
	ck_assert_str_eq(th_str(o, "host"), "node1");
	json_decref(o);
	o = get_auth(&d[0], "/v1/memory/history?since=30s&host=node1");
	ck_assert_int_gt(json_array_size(th_arr(o, "times_unix_ms")), 0);
	json_decref(o);
	for (int own_host = 0; own_host < 2; own_host++) {
		o = get_auth(&d[0], own_host ? "/v1/arrays?host=node0" : "/v1/arrays");
		ck_assert_int_eq(json_array_size(th_arr(o, "arrays")), 1);
		ck_assert_str_eq(th_str(json_array_get(th_arr(o, "arrays"), 0), "name"), "on0.a");
		json_decref(o);
	}

	get_error(&d[0], "/v1/operations?state=BOGUS&host=node1", 400, "INVALID_ARGUMENT",
	          "BAD_STATE", "node 'node1' answered 400", "BOGUS");
	get_error(&d[0], "/v1/memory?host=node9", 404, "NOT_FOUND", "HOST_NOT_FOUND", "node9",
	          NULL);
	get_error(&d[0], "/v1/memory?host=", 400, "INVALID_ARGUMENT", "BAD_HOST", "host", NULL);
	th_request(&d[0], "GET", "/v1/memory?host=node1", NULL, NULL, 0, &r);
	th_expect_error(&r, "no token", 401, "UNAUTHENTICATED", "TOKEN_REQUIRED", NULL, NULL);
	/* the fleet's other calls take no host */
	th_request(&d[0], "GET", "/v1/arrays/on1.a?host=node1", auth, NULL, 0, &r);
	th_expect_error(&r, "host on a single array", 400, "INVALID_ARGUMENT", NULL, "host", NULL);

	th_daemon_signal(&d[1], SIGKILL);
	ck_assert_int_ne(th_daemon_wait(&d[1], 10000), -1);
	json_decref(await_node(&d[0], ports[1], false));
	get_error(&d[0], "/v1/memory/history?host=node1", 503, "UNAVAILABLE", "PEER_UNREACHABLE",
	          "node1", NULL);
	th_daemon_stop_ok(&d[0]);
	th_daemon_stop(&d[1], false);   /* the killed daemon's client and files */
}
END_TEST

/* A receive's state (GET /v1/fleet/receives/{id}) and a forwarding
 * receive's refusals: "forward" naming no peer, this node, malformed, or
 * with "data" is refused before anything is allocated; one naming a peer's
 * open receive forwards (its state says to whom), and its abort gives
 * everything back on both nodes. */
START_TEST(test_receive_state_and_forward)
{
	struct th_daemon d[2];
	int ports[2];
	char *path, *body;
	struct th_response r;
	json_t *o, *next, *st, *fwd;
	double base0, base1;
	const char *shape = "\"dtype\": \"float32\", \"shape\": [1024, 256]";

	start_fleet_one_token(d, 2, ports);
	json_decref(await_node(&d[1], ports[0], true));
	base0 = unpinned_in_use(&d[0]);
	base1 = unpinned_in_use(&d[1]);
	get_error(&d[1], "/v1/fleet/receives/rcv-00000000000000000000000000000000", 404,
	          "NOT_FOUND", "RECEIVE_NOT_FOUND", NULL, NULL);

	/* node0's receive, the next hop */
	body = th_fmt("{\"out\": \"f\", %s}", shape);
	next = post_object(&d[0], "/v1/fleet:receive", body, 201, "next receive");
	free(body);
	path = th_fmt("/v1/fleet/receives/%s", th_str(next, "id"));
	st = get_auth(&d[0], path);
	ck_assert_int_eq(th_int(st, "length"), 1024 * 256 * 4);
	ck_assert_int_eq(th_int(st, "received"), 0);
	ck_assert(json_is_false(json_object_get(st, "complete")));
	ck_assert_ptr_null(json_object_get(st, "forward"));
	json_decref(st);
	free(path);
	path = th_fmt("/v1/fleet/receives/%s?wait_ms=soon", th_str(next, "id"));
	get_error(&d[0], path, 400, "INVALID_ARGUMENT", "BAD_QUERY", "wait_ms", NULL);
	free(path);

	/* refusals, before anything is allocated */
	body = th_fmt("{\"out\": \"f\", %s, \"forward\": {\"host\": \"nowhere\", \"id\": \"%s\", "
	              "\"ticket\": \"%s\", \"fleet_port\": %d, \"fleet_instance\": \"%s\", "
	              "\"expires_in_seconds\": 60}}", shape, th_str(next, "id"),
	              th_str(next, "ticket"), (int)th_int(next, "fleet_port"),
	              th_str(next, "fleet_instance"));
	post_auth(&d[1], "/v1/fleet:receive", body, &r);
	th_expect_error(&r, "unknown next host", 404, "NOT_FOUND", "HOST_NOT_FOUND", "nowhere", NULL);
	free(body);
	body = th_fmt("{\"out\": \"f\", %s, \"forward\": {\"host\": \"node1\", \"id\": \"%s\", "
	              "\"ticket\": \"%s\", \"fleet_port\": %d, \"fleet_instance\": \"%s\", "
	              "\"expires_in_seconds\": 60}}", shape, th_str(next, "id"),
	              th_str(next, "ticket"), (int)th_int(next, "fleet_port"),
	              th_str(next, "fleet_instance"));
	post_auth(&d[1], "/v1/fleet:receive", body, &r);
	th_expect_error(&r, "itself", 400, "INVALID_ARGUMENT", "BAD_HOST", "node1", NULL);
	free(body);
	body = th_fmt("{\"out\": \"f\", %s, \"forward\": {\"host\": \"node0\"}}", shape);
	post_auth(&d[1], "/v1/fleet:receive", body, &r);
	th_expect_error(&r, "malformed", 400, "INVALID_ARGUMENT", NULL, "forward", NULL);
	free(body);
	post_auth(&d[1], "/v1/fleet:receive",
	          "{\"out\": \"f\", \"dtype\": \"uint8\", \"shape\": [3], \"data\": \"AQID\", "
	          "\"forward\": {}}", &r);
	th_expect_error(&r, "with data", 400, "INVALID_ARGUMENT", NULL, "forward", NULL);
	await_unpinned(&d[1], base1, 2000, "the refused receives' memory");

	/* node1 forwards to node0's receive */
	body = th_fmt("{\"out\": \"f\", %s, \"forward\": {\"host\": \"node0\", \"id\": \"%s\", "
	              "\"ticket\": \"%s\", \"fleet_port\": %d, \"fleet_instance\": \"%s\", "
	              "\"expires_in_seconds\": 60}}", shape, th_str(next, "id"),
	              th_str(next, "ticket"), (int)th_int(next, "fleet_port"),
	              th_str(next, "fleet_instance"));
	o = post_object(&d[1], "/v1/fleet:receive", body, 201, "forwarding receive");
	free(body);
	path = th_fmt("/v1/fleet/receives/%s?wait_ms=100", th_str(o, "id"));
	st = get_auth(&d[1], path);
	fwd = json_object_get(st, "forward");
	ck_assert_str_eq(th_str(fwd, "host"), "node0");
	ck_assert_str_eq(th_str(fwd, "state"), "sending");
	ck_assert_int_eq(th_int(fwd, "bytes_done"), 0);
	ck_assert(json_is_false(json_object_get(st, "complete")));
	json_decref(st);
	free(path);
	path = th_fmt("/v1/fleet/receives/%s:abort", th_str(o, "id"));
	post_expect(&d[1], path, NULL, 200, "abort the forwarding receive");
	free(path);
	/* the forward stops with its receive and aborts the next one: node0's
	 * receive ends by itself, long before its deadline */
	path = th_fmt("/v1/fleet/receives/%s", th_str(next, "id"));
	for (double t0 = now_ms();; usleep(20000)) {
		long code;

		th_request(&d[0], "GET", path, auth, NULL, 0, &r);
		code = r.status;
		th_response_free(&r);
		if (code == 404 || code == 503)   /* aborted, or ended with its endpoint */
			break;
		ck_assert_msg(now_ms() - t0 < 5000, "node0's next receive still there: %ld", code);
	}
	free(path);
	await_unpinned(&d[1], base1, 5000, "the forwarding receive's memory");
	await_unpinned(&d[0], base0, 5000, "the next receive's memory");
	expect_not_found(&d[0], "/v1/arrays/f");
	expect_not_found(&d[1], "/v1/arrays/f");
	json_decref(o);
	json_decref(next);
	for (int i = 0; i < 2; i++)
		th_daemon_stop_ok(&d[i]);
}
END_TEST

Suite *th_suite(void)
{
	Suite *s = suite_create("fleet");
	TCase *view = tcase_create("view"), *faults = tcase_create("faults");
	TCase *flags = tcase_create("flags"), *port = tcase_create("port");
	TCase *copy = tcase_create("copy"), *bcast = tcase_create("broadcast");

	tcase_set_timeout(view, 120);
	tcase_set_timeout(faults, 120);
	tcase_add_test(view, test_fleet_lists_every_node);
	tcase_add_test(view, test_view_alone_and_scopes);
	tcase_add_test(view, test_peers_from_dns);
	tcase_add_test(view, test_reads_of_another_node);
	tcase_add_test(faults, test_stopped_and_killed_peers);
	tcase_add_test(faults, test_peer_with_another_token);
	tcase_set_timeout(flags, 60);   /* seven daemon starts, slow under sanitizers */
	tcase_add_test(flags, test_bad_peers_refused_at_start);
	suite_add_tcase(s, view);
	suite_add_tcase(s, faults);
	tcase_set_timeout(port, 120);
	tcase_add_test(port, test_fleet_port_tickets);
	tcase_add_test(port, test_fleet_port_off_and_taken);
	suite_add_tcase(s, flags);
	suite_add_tcase(s, port);
	tcase_set_timeout(copy, 240);
	tcase_add_test(copy, test_cross_node_copy);
	tcase_add_test(copy, test_receive_expires_and_aborts);
	tcase_add_test(copy, test_kept_connection_dropped_is_called_again);
	tcase_add_test(view, test_read_of_silent_peer_holds_no_loop);
	tcase_add_test(copy, test_receive_state_and_forward);
	tcase_add_test(copy, test_destination_killed_mid_copy);
	tcase_add_test(copy, test_cross_node_copy_cancelled);
	tcase_add_test(copy, test_silent_peer_times_out);
	suite_add_tcase(s, copy);
	tcase_set_timeout(bcast, 300);
	tcase_add_test(bcast, test_broadcast_two_hosts);
	tcase_add_test(bcast, test_broadcast_refusals);
	tcase_add_test(bcast, test_broadcast_failed_destination);
	tcase_add_test(bcast, test_broadcast_destination_killed);
	tcase_add_test(bcast, test_broadcast_source_killed);
	suite_add_tcase(s, bcast);
	return s;
}
