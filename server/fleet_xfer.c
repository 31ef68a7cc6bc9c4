/*
 * fleet_xfer.c - the sending end of a cross-node copy (fleet_xfer.h).
 */
#include "server/fleet_xfer.h"

#include <curl/curl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucp/api/ucp.h>

#include "common/log.h"
#include "common/units.h"
#include "server/fleet.h"
#include "server/fleet_ucx.h"
#include "server/server_int.h"
#include "storage/array_io.h"

/* How long one HTTP call to the peer may take (the commit waits for the
 * peer's move, up to its --wait-limit, on top). */
#define HTTP_TIMEOUT_MS 10000L
#define COMMIT_TIMEOUT_MS 600000L

/* Largest answer the peer may give. */
#define ANSWER_MAX (1u << 20)

struct xfer {
	struct ts_server *srv;
	struct ts_array *src;            /* own reference: the version copied */
	char etag[32];
	char host[128];
	char url[TS_CONFIG_PEER_URL_MAX + 1];
	char *body;                      /* the receive's request (JSON text) */
	bool put;
	/* the run's */
	char rid[64];
	bool failed;                     /* the endpoint failed */
	ucs_status_t ep_status;
};

struct answer {
	char *buf;
	size_t len;
};

static size_t on_answer(char *data, size_t size, size_t nmemb, void *cls)
{
	struct answer *a = cls;
	size_t n = size * nmemb;
	char *grown;

	if (a->len + n > ANSWER_MAX)
		return 0;
	grown = realloc(a->buf, a->len + n + 1);
	if (!grown)
		return 0;
	memcpy(grown + a->len, data, n);
	a->len += n;
	grown[a->len] = '\0';
	a->buf = grown;
	return n;
}

/* The peer's HTTP status mapped back to ours. */
static ts_status from_http(long code)
{
	switch (code) {
	case 400: return TS_INVALID_ARGUMENT;
	case 404: return TS_NOT_FOUND;
	case 409: return TS_ALREADY_EXISTS;
	case 429: return TS_RESOURCE_EXHAUSTED;
	case 499: return TS_CANCELLED;
	case 504: return TS_DEADLINE_EXCEEDED;
	default: return TS_UNAVAILABLE;
	}
}

/* POST url+path with body (may be NULL): *out the JSON answer on a 2xx,
 * else an error naming the peer (its own error message when it gave one). */
static ts_status call_peer(struct xfer *x, const char *path, const char *body, long timeout_ms,
                           json_t **out, struct ts_error *err)
{
	char url[sizeof x->url + 160], auth[300], ebuf[CURL_ERROR_SIZE] = "";
	struct curl_slist *h = NULL;
	struct answer a = {0};
	CURL *e = curl_easy_init();
	CURLcode rc;
	long code = 0;
	json_t *j = NULL;
	ts_status st = TS_OK;

	*out = NULL;
	if (!e)
		return ts_error_oom(err, "no memory for a call to peer '%s'", x->host);
	snprintf(url, sizeof url, "%s%s", x->url, path);
	h = curl_slist_append(h, "Content-Type: application/json");
	if (x->srv->token[0]) {
		snprintf(auth, sizeof auth, "Authorization: Bearer %s", x->srv->token);
		h = curl_slist_append(h, auth);
	}
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_POST, 1L);
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, body ? body : "");
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, HTTP_TIMEOUT_MS);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_answer);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, ebuf);
	curl_easy_setopt(e, CURLOPT_PROXY, "");
	rc = curl_easy_perform(e);
	if (rc != CURLE_OK) {
		st = ts_error_set(err, TS_UNAVAILABLE, "PEER_UNAVAILABLE", "peer '%s': POST %s: %s",
		                  x->host, url, ebuf[0] ? ebuf : curl_easy_strerror(rc));
		goto out;
	}
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
	j = json_loadb(a.buf ? a.buf : "", a.len, 0, NULL);
	if (code < 200 || code > 299) {
		json_t *pe = json_object_get(j, "error");
		const char *msg = json_string_value(json_object_get(pe, "message"));

		st = ts_error_set(err, from_http(code), "PEER_REFUSED", "peer '%s' answered %ld to %s: %s",
		                  x->host, code, path, msg ? msg : "no message");
		goto out;
	}
	if (!json_is_object(j)) {
		st = ts_error_set(err, TS_UNAVAILABLE, "PEER_BAD_ANSWER",
		                  "peer '%s' did not answer %s with a JSON object", x->host, path);
		goto out;
	}
	*out = j;
	j = NULL;
out:
	json_decref(j);
	free(a.buf);
	curl_slist_free_all(h);
	curl_easy_cleanup(e);
	return st;
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
	struct xfer *x = arg;

	(void)ep;
	x->failed = true;
	x->ep_status = status;
}

/* Drives req (a UCP request or an immediate status) to its end: TS_OK, or
 * an error naming what failed; CANCELLED when the operation is. */
static ts_status finish(struct xfer *x, struct ts_operation *op, ucp_worker_h w, void *req,
                        const char *what, uint64_t deadline, struct ts_error *err)
{
	ucs_status_t s;

	if (req == NULL)
		return TS_OK;
	if (UCS_PTR_IS_ERR(req)) {
		s = UCS_PTR_STATUS(req);
		goto failed;
	}
	/* a cancel waits for the write in flight (one chunk): a peer whose
	 * writes are cut off under it fails its reply (UCX's software RMA) */
	while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		if (ucp_worker_progress(w))
			continue;
		if (ts_now_ns() >= deadline || x->failed) {
			ucp_request_cancel(w, req);
			while (ucp_request_check_status(req) == UCS_INPROGRESS)
				ucp_worker_progress(w);
			s = x->failed ? x->ep_status : UCS_ERR_TIMED_OUT;
			ucp_request_free(req);
			goto failed;
		}
	}
	ucp_request_free(req);
	if (s == UCS_OK)
		return TS_OK;
failed:
	if (s == UCS_ERR_CANCELED && ts_operation_cancelled(op))
		return ts_error_set(err, TS_CANCELLED, "CANCELLED", "the copy to '%s' was cancelled",
		                    x->host);
	return ts_error_set(err, s == UCS_ERR_TIMED_OUT ? TS_DEADLINE_EXCEEDED : TS_UNAVAILABLE,
	                    "PEER_FAILED", "peer '%s' (%s): %s: %s", x->host, x->url, what,
	                    ucs_status_string(s));
}

/* The host part of an "http://host:port" URL. */
static void url_host(const char *url, char *out, size_t cap)
{
	const char *p = strstr(url, "://"), *end;

	p = p ? p + 3 : url;
	if (*p == '[') {
		p++;
		end = strchr(p, ']');
	} else {
		end = strrchr(p, ':');
	}
	if (!end)
		end = p + strlen(p);
	snprintf(out, cap, "%.*s", (int)(end - p), p);
}

static int hex_val(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

struct ucx_side {
	ucp_context_h ctx;
	ucp_worker_h worker;
	ucp_ep_h ep;
	ucp_rkey_h rkey;
};

static ts_status ucx_open(struct xfer *x, struct ts_operation *op, struct ucx_side *u,
                          json_t *rcv, uint64_t deadline, struct ts_error *err)
{
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
	                       .features = UCP_FEATURE_STREAM | UCP_FEATURE_RMA};
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
	                          .thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLER |
	                                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
	                      .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
	                      .err_mode = UCP_ERR_HANDLING_MODE_PEER,
	                      .err_handler = {.cb = ep_failed, .arg = x}};
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
	ucp_request_param_t p = {.op_attr_mask = 0};
	const char *ticket = json_string_value(json_object_get(rcv, "ticket"));
	const char *rk = json_string_value(json_object_get(rcv, "rkey"));
	char host[128], port[16];
	unsigned char *packed = NULL;
	size_t n;
	ucp_config_t *config;
	ucs_status_t s;
	ts_status st;

	if (!ticket || strlen(ticket) != TS_FLEET_TICKET_LEN || !rk || strlen(rk) % 2)
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_BAD_ANSWER",
		                    "peer '%s' answered the receive without a ticket or key", x->host);
	s = ucp_config_read(NULL, NULL, &config);
	if (s == UCS_OK) {
		s = ucp_init(&params, config, &u->ctx);
		ucp_config_release(config);
	}
	if (s == UCS_OK)
		s = ucp_worker_create(u->ctx, &wp, &u->worker);
	if (s != UCS_OK)
		return ts_error_set(err, TS_UNAVAILABLE, "UCX", "UCX for a copy to '%s': %s", x->host,
		                    ucs_status_string(s));
	url_host(x->url, host, sizeof host);
	snprintf(port, sizeof port, "%lld",
	         (long long)json_integer_value(json_object_get(rcv, "fleet_port")));
	if (getaddrinfo(host, port, &hints, &ai) != 0)
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_FAILED",
		                    "peer '%s': cannot resolve '%s'", x->host, host);
	ep.sockaddr = (ucs_sock_addr_t){.addr = ai->ai_addr, .addrlen = ai->ai_addrlen};
	s = ucp_ep_create(u->worker, &ep, &u->ep);
	freeaddrinfo(ai);
	if (s != UCS_OK) {
		u->ep = NULL;
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_FAILED",
		                    "peer '%s': no endpoint to %s:%s: %s", x->host, host, port,
		                    ucs_status_string(s));
	}
	st = finish(x, op, u->worker, ucp_stream_send_nbx(u->ep, ticket, TS_FLEET_TICKET_LEN, &p),
	            "sending the ticket", deadline, err);
	if (st != TS_OK)
		return st;
	n = strlen(rk) / 2;
	packed = malloc(n + 1);
	if (!packed)
		return ts_error_oom(err, "no memory for a remote key");
	for (size_t i = 0; i < n; i++) {
		int hi = hex_val(rk[2 * i]), lo = hex_val(rk[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			free(packed);
			return ts_error_set(err, TS_UNAVAILABLE, "PEER_BAD_ANSWER",
			                    "peer '%s' answered a remote key that is not hex", x->host);
		}
		packed[i] = (unsigned char)(hi << 4 | lo);
	}
	s = ucp_ep_rkey_unpack(u->ep, packed, &u->rkey);
	free(packed);
	if (s != UCS_OK) {
		u->rkey = NULL;
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_FAILED",
		                    "peer '%s': its remote key: %s", x->host, ucs_status_string(s));
	}
	return TS_OK;
}

static void ucx_close(struct xfer *x, struct ucx_side *u)
{
	if (u->rkey)
		ucp_rkey_destroy(u->rkey);
	if (u->ep) {
		/* a live endpoint is flushed and closed with the peer; a failed one forced */
		ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
		                         .flags = x->failed ? UCP_EP_CLOSE_FLAG_FORCE : 0};
		void *req = ucp_ep_close_nbx(u->ep, &p);

		while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS)
			ucp_worker_progress(u->worker);
		if (UCS_PTR_IS_PTR(req))
			ucp_request_free(req);
	}
	if (u->worker)
		ucp_worker_destroy(u->worker);
	if (u->ctx)
		ucp_cleanup(u->ctx);
}

/* Waits for a write in flight (cancels it once the endpoint failed or the
 * deadline passed) until UCX lets go of its buffer. */
static void drop(struct xfer *x, ucp_worker_h w, void *req, uint64_t deadline)
{
	if (!UCS_PTR_IS_PTR(req))
		return;
	while (ucp_request_check_status(req) == UCS_INPROGRESS && !x->failed &&
	       ts_now_ns() < deadline)
		ucp_worker_progress(w);
	ucp_request_cancel(w, req);
	while (ucp_request_check_status(req) == UCS_INPROGRESS)
		ucp_worker_progress(w);
	ucp_request_free(req);
}

/* Reads the version chunk by chunk and writes each into the peer's staging
 * memory, the next chunk read while the last one is written (two buffers),
 * then flushes. */
static ts_status send_bytes(struct xfer *x, struct ts_operation *op, struct ucx_side *u,
                            json_t *rcv, uint64_t deadline, struct ts_error *err)
{
	uint64_t total = ts_array_desc(x->src)->nbytes;
	uint64_t addr = (uint64_t)json_integer_value(json_object_get(rcv, "address"));
	uint64_t len = (uint64_t)json_integer_value(json_object_get(rcv, "length"));
	uint64_t chunk = total < TS_FLEET_XFER_CHUNK ? total : TS_FLEET_XFER_CHUNK;
	uint64_t pending_n = 0, n;
	void *buf[2], *pending = NULL;
	ts_status st = TS_OK;
	int i = 0;

	if (len != total)
		return ts_error_set(err, TS_UNAVAILABLE, "PEER_BAD_ANSWER",
		                    "peer '%s' staged %llu bytes for an array of %llu", x->host,
		                    (unsigned long long)len, (unsigned long long)total);
	buf[0] = malloc(chunk + 1);
	buf[1] = malloc(chunk + 1);
	if (!buf[0] || !buf[1]) {
		free(buf[0]);
		free(buf[1]);
		return ts_error_oom(err, "no host memory to send array '%s'", ts_array_name(x->src));
	}
	for (uint64_t done = 0; st == TS_OK && done < total; done += n, i ^= 1) {
		struct ts_run run = {done, 0, 0};
		ucp_request_param_t p = {.op_attr_mask = 0};

		n = total - done < chunk ? total - done : chunk;
		run.len = n;
		if (ts_operation_cancelled(op))
			st = ts_error_set(err, TS_CANCELLED, "CANCELLED", "the copy to '%s' was cancelled",
			                  x->host);
		if (st == TS_OK)
			st = ts_array_read(x->srv->core.env.stager, x->src, &run, 1, buf[i], err);
		if (st == TS_OK && pending) {
			void *req = pending;

			pending = NULL;
			st = finish(x, op, u->worker, req, "writing into its memory", deadline, err);
			if (st == TS_OK)
				ts_operation_progress_add(op, pending_n);
		}
		if (st != TS_OK)
			break;
		pending = ucp_put_nbx(u->ep, buf[i], (size_t)n, addr + done, u->rkey, &p);
		pending_n = n;
		if (!UCS_PTR_IS_PTR(pending)) {
			/* done at once, or failed at once */
			st = finish(x, op, u->worker, pending, "writing into its memory", deadline, err);
			pending = NULL;
			if (st == TS_OK)
				ts_operation_progress_add(op, n);
		}
	}
	if (pending && st == TS_OK) {
		st = finish(x, op, u->worker, pending, "writing into its memory", deadline, err);
		if (st == TS_OK)
			ts_operation_progress_add(op, pending_n);
	} else if (pending) {
		drop(x, u->worker, pending, deadline);
	}
	free(buf[0]);
	free(buf[1]);
	if (st == TS_OK) {
		ucp_request_param_t p = {.op_attr_mask = 0};

		st = finish(x, op, u->worker, ucp_ep_flush_nbx(u->ep, &p), "flushing the writes",
		            deadline, err);
	}
	return st;
}

static ts_status xfer_run(struct ts_operation *op, void *arg, struct ts_error *err)
{
	struct xfer *x = arg;
	struct ucx_side u = {0};
	json_t *rcv = NULL, *done = NULL;
	char path[128];
	uint64_t deadline;
	ts_status st;

	st = call_peer(x, "/v1/fleet:receive", x->body, HTTP_TIMEOUT_MS, &rcv, err);
	if (st != TS_OK)
		goto out;
	snprintf(x->rid, sizeof x->rid, "%s", json_string_value(json_object_get(rcv, "id")) ?: "");
	deadline = ts_now_ns() +
	           (uint64_t)json_integer_value(json_object_get(rcv, "expires_in_seconds")) *
	               1000000000ull;
	if (ts_array_desc(x->src)->nbytes) {   /* an empty array has no bytes to send */
		st = ucx_open(x, op, &u, rcv, deadline, err);
		if (st == TS_OK)
			st = send_bytes(x, op, &u, rcv, deadline, err);
	}
	ucx_close(x, &u);
	if (st == TS_OK) {
		snprintf(path, sizeof path, "/v1/fleet/receives/%s:commit?wait=true", x->rid);
		st = call_peer(x, path, NULL, COMMIT_TIMEOUT_MS, &done, err);
		x->rid[0] = '\0';   /* committed or failed there: nothing to abort */
	}
	if (st == TS_OK && !json_object_get(done, "etag"))
		st = ts_error_set(err, TS_DEADLINE_EXCEEDED, "PEER_SLOW",
		                  "peer '%s' had not published '%s' when its wait ended", x->host,
		                  json_string_value(json_object_get(rcv, "id")));
	if (st == TS_OK && x->put) {
		struct ts_precondition same = {.if_match = x->etag};
		struct ts_error ignore;

		ts_error_clear(&ignore);
		(void)ts_catalog_delete(x->srv->core.env.catalog, ts_array_name(x->src), &same, &ignore);
	}
	if (st == TS_OK) {
		ts_operation_set_result(op, json_pack("{s:s, s:s, s:O}", "host", x->host, "source_etag",
		                                      x->etag, "array", done));
		ts_log(TS_LOG_INFO, "\"event\":\"fleet_copy\",\"result\":\"ok\"",
		       "array '%s' copied to peer '%s'", ts_array_name(x->src), x->host);
	}
out:
	if (st != TS_OK && x->rid[0]) {
		struct ts_error ignore;
		json_t *j = NULL;

		snprintf(path, sizeof path, "/v1/fleet/receives/%s:abort", x->rid);
		ts_error_clear(&ignore);
		(void)call_peer(x, path, NULL, 2000L, &j, &ignore);
		json_decref(j);
	}
	if (st != TS_OK)
		ts_log(TS_LOG_WARN, "\"event\":\"fleet_copy\",\"result\":\"failed\"",
		       "copy of array '%s' to peer '%s' failed: %s", ts_array_name(x->src), x->host,
		       err->message);
	json_decref(rcv);
	json_decref(done);
	return st;
}

static void xfer_release(void *arg)
{
	struct xfer *x = arg;

	ts_array_unref(x->src);
	free(x->body);
	free(x);
}

/* How long the peer keeps the receive: a minute, and a second more for
 * every 16 MiB (1 GiB in about two minutes at the slowest link assumed),
 * at most an hour. */
static uint64_t receive_ttl(uint64_t nbytes)
{
	uint64_t s = 60 + nbytes / (16u << 20);

	return s < 3600 ? s : 3600;
}

ts_status ts_fleet_copy_submit(void *cls, struct ts_array *src,
                               const struct ts_fleet_copy_req *req, struct ts_operation **op,
                               struct ts_error *err)
{
	struct ts_server *srv = cls;
	const struct ts_array_desc *d = ts_array_desc(src);
	struct xfer *x;
	json_t *body, *shape;
	ts_status st;

	*op = NULL;
	if (strcmp(req->host, srv->core.host) == 0)
		return ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_HOST",
		                    "host '%s' is this node: copy without \"host\"", req->host);
	x = calloc(1, sizeof *x);
	if (!x)
		return ts_error_oom(err, "no memory for a copy to '%s'", req->host);
	x->srv = srv;
	x->put = req->put;
	snprintf(x->host, sizeof x->host, "%s", req->host);
	if (ts_fleet_peer(srv->fleet, req->host, x->url, sizeof x->url, err) != TS_OK) {
		free(x);
		return err->status;
	}
	shape = json_array();
	for (int i = 0; shape && i < d->rank; i++)
		json_array_append_new(shape, json_integer((json_int_t)d->shape[i]));
	body = json_pack("{s:s, s:s, s:s, s:o, s:b, s:I}", "out", req->out, "dtype", req->dtype,
	                 "source_dtype", ts_dtype_name(d->dtype), "shape", shape, "overwrite",
	                 req->overwrite, "timeout_seconds", (json_int_t)receive_ttl(d->nbytes));
	if (body && req->placement)
		json_object_update(body, req->placement);
	x->body = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	if (!x->body) {
		free(x);
		return ts_error_oom(err, "no memory for a copy to '%s'", req->host);
	}
	x->src = ts_array_ref(src);
	snprintf(x->etag, sizeof x->etag, "%s", ts_array_etag(src));
	st = ts_op_submit(srv->core.env.operations, req->put ? "put" : "copy", ts_array_name(src),
	                  d->nbytes, "bytes", xfer_run, x, xfer_release, op, err);
	if (st != TS_OK)
		xfer_release(x);
	return st;
}
