/*
 * lease.c - the lease service beside --unix-socket: a same-node client maps
 * arrays in host memory instead of copying them over HTTP.
 *
 * It listens on "<--unix-socket>.lease" (a socket of its own, not the HTTP
 * one: libmicrohttpd owns that socket's bytes, and descriptors travel only
 * with sendmsg), with the same mode and group: the socket's file is the
 * permission, as it is for the HTTP socket. Frames and requests are
 * lease_proto.h's; each answer is one frame, a JSON object, with the
 * descriptors of its "fd" shards attached (SCM_RIGHTS), in shard order:
 *
 *   lease    {"lease":ID,"name","dtype","shape","nbytes","version","etag",
 *             "writable":false,"shards":[{"device","memory_kind",
 *             "transport","offset","length","start","count","replica"}]}
 *            A shard in host memory, or in a sim device's (a memfd
 *            standing for a GPU's), is "transport":"fd": a descriptor is
 *            attached for it, read-only (a fresh O_RDONLY open of the
 *            memfd: the receiver can map it only PROT_READ), and offset is
 *            its bytes' in the file. A shard in a GPU's memory is
 *            "transport":"cuda_ipc" with no descriptor: "cuda_ipc" holds a
 *            CUDA IPC handle of the pool chunk holding it (lease.h), offset
 *            is its bytes' in the chunk; CUDA IPC maps read-write whatever
 *            the lease says. The lease holds the
 *            version - its buffers and their bytes - until it is released
 *            or its connection closes, whatever the name meets meanwhile
 *            (replaced, deleted, moved): the memory goes back to its space
 *            only then.
 *   create   the same with "writable":true and read-write descriptors of a
 *            new, unpublished array (bytes not initialised) that the client
 *            fills in place - in host memory, or in a device's ("fd" on
 *            sim, "cuda_ipc" on a GPU); nothing is visible until publish.
 *   publish  {"name","version","etag","replaced"}: the array becomes the
 *            name's current version (the checks of an upload: holds,
 *            owners, if_none_match) and the lease ends.
 *   release  no answer (garbage collectors send it without waiting): the
 *            lease ends; one not held is ignored.
 *   ping     {}: a round trip, after which every earlier release is done.
 * Descriptors travel one per "fd" shard, in the order of the shards.
 * Failures answer {"error":{...}} (google.rpc.Status, as over HTTP), after
 * which the connection goes on, except for a frame that cannot be read
 * (length 0 or over TS_LEASE_FRAME_MAX): answered, then closed.
 *
 * A descriptor names a whole memfd: one pageable allocation, or one pinned
 * segment that other arrays share. Anyone who may connect may read every
 * array (as over HTTP), and a writable lease's descriptor reaches its whole
 * segment: socket access is the permission. The memfds are sealed at their
 * size (hostmem.c), so no client can truncate memory under the daemon.
 *
 * One thread serves every connection with poll(); requests are short (a
 * catalog lookup, an allocation, a publish). Client sockets are
 * non-blocking: a client that does not read its answers until its socket
 * buffer fills is disconnected (its leases end).
 *
 * Thread-safety: the service's state is its thread's; start and stop are
 * called from the server's lifecycle only.
 */
#include "server/server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/hex.h"
#include "common/log.h"
#include "server/lease.h"
#include "server/lease_proto.h"
#include "storage/array.h"

#define LEASE_MAX_CONNS 1024
#define LEASE_MAX_PER_CONN 65536

struct lease {
	uint64_t id;
	struct ts_array *array;          /* owned reference */
	bool writable;                   /* an unpublished array of create */
	struct lease *next;
};

struct lconn {
	int fd;
	unsigned char *buf;              /* 4 + TS_LEASE_FRAME_MAX bytes */
	size_t have;
	struct lease *leases;
	size_t nleases;
};

struct ts__lease_service {
	const struct ts_core *core;      /* borrowed: the server's */
	int listen_fd;
	int wake[2];                     /* a pipe: written to stop the thread */
	pthread_t thread;
	bool started;
	char path[sizeof ((struct sockaddr_un *)0)->sun_path];
	struct lconn *conns[LEASE_MAX_CONNS];
	size_t nconns;
	uint64_t next_id;
};

/* ---- answers ----------------------------------------------------------------- */

/* Sends one frame of j (stolen) with fds attached; false when the client
 * cannot take it whole now (the connection is then dropped). */
static bool send_frame(int fd, json_t *j, const int *fds, int nfds)
{
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	size_t len = text ? strlen(text) : 0;
	unsigned char *frame = text ? malloc(4 + len) : NULL;
	union {
		char buf[CMSG_SPACE(sizeof(int) * TS_MESH_MAX_DEVICES)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr msg;
	bool ok = false;
	ssize_t n;

	json_decref(j);
	if (!frame)
		goto out;
	frame[0] = (unsigned char)(len >> 24);
	frame[1] = (unsigned char)(len >> 16);
	frame[2] = (unsigned char)(len >> 8);
	frame[3] = (unsigned char)len;
	memcpy(frame + 4, text, len);
	iov = (struct iovec){frame, 4 + len};
	memset(&msg, 0, sizeof msg);
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	if (nfds > 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof ctl);
		msg.msg_control = ctl.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(fd, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	ok = n == (ssize_t)(4 + len);
out:
	free(frame);
	free(text);
	return ok;
}

static bool send_error(int fd, const struct ts_error *err)
{
	return send_frame(fd, ts_error_to_json(err, 0), NULL, 0);
}

/* ---- the lease table ------------------------------------------------------------ */

static void lease_free(struct lease *l)
{
	ts_array_unref(l->array);
	free(l);
}

static struct lease *lease_find(struct lconn *c, uint64_t id, struct lease ***link)
{
	for (struct lease **p = &c->leases; *p; p = &(*p)->next)
		if ((*p)->id == id) {
			*link = p;
			return *p;
		}
	return NULL;
}

static json_t *u64_list(const uint64_t *v, int n)
{
	json_t *l = json_array();

	for (int i = 0; l && i < n; i++)
		json_array_append_new(l, json_integer((json_int_t)v[i]));
	return l;
}

/* ---- what a shard is handed by ------------------------------------------------ */

void ts_lease_ipc_hex(const struct ts_ipc_handle *h, char out[TS_LEASE_IPC_HEX + 1])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < TS_IPC_HANDLE_BYTES; i++) {
		out[2 * i] = digits[h->bytes[i] >> 4];
		out[2 * i + 1] = digits[h->bytes[i] & 15];
	}
	out[TS_LEASE_IPC_HEX] = '\0';
}

bool ts_lease_ipc_unhex(const char *hex, struct ts_ipc_handle *out)
{
	if (!hex || strlen(hex) != TS_LEASE_IPC_HEX)
		return false;
	for (int i = 0; i < TS_IPC_HANDLE_BYTES; i++) {
		int hi = ts_hex_value(hex[2 * i]), lo = ts_hex_value(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return false;
		out->bytes[i] = (unsigned char)(hi << 4 | lo);
	}
	return true;
}

ts_status ts_lease_ipc_shard(json_t *shard, const struct ts_lease_ipc_chunk *chunk,
                             const void *data, uint64_t length,
                             const struct ts_device_props *props, struct ts_error *err)
{
	uintptr_t base = (uintptr_t)chunk->base, p = (uintptr_t)data;
	char hex[TS_LEASE_IPC_HEX + 1];
	json_t *ipc;
	uint64_t off;

	if (p < base || p - base > chunk->size || length > chunk->size - (p - base))
		return ts_error_set(err, TS_INTERNAL, "LEASE_CHUNK",
		                    "%llu bytes at %p are not inside the chunk of %llu bytes at %p "
		                    "on '%s'", (unsigned long long)length, data,
		                    (unsigned long long)chunk->size, chunk->base, props->id);
	off = (uint64_t)(p - base);
	ts_lease_ipc_hex(&chunk->handle, hex);
	ipc = json_pack("{s:s, s:I, s:i, s:s, s:s}", "handle", hex,
	                "chunk_bytes", (json_int_t)chunk->size, "ordinal", props->ordinal,
	                "pci_bus_id", props->pci_bus_id, "uuid", props->uuid);
	if (!ipc || json_object_set_new(shard, "cuda_ipc", ipc) != 0 ||
	    json_object_set_new(shard, "transport", json_string("cuda_ipc")) != 0 ||
	    json_object_set_new(shard, "offset", json_integer((json_int_t)off)) != 0 ||
	    json_object_set_new(shard, "length", json_integer((json_int_t)length)) != 0)
		return ts_error_oom(err, "no memory for a lease answer");
	return TS_OK;
}

/* Whether b is a GPU's memory: handed by CUDA IPC, not by a descriptor. */
static bool on_gpu(const struct ts_buffer *b)
{
	return ts_buffer_kind(b) == TS_MEM_DEVICE &&
	       ts_device_props(ts_buffer_device(b))->backend == TS_BACKEND_CUDA;
}

/* Fills shard with the handle of the GPU pool chunk holding b. */
static ts_status share_ipc(const struct ts_array *a, const struct ts_buffer *b, json_t *shard,
                           struct ts_error *err)
{
	struct ts_device *dev = ts_buffer_device(b);
	struct ts_lease_ipc_chunk chunk;
	void *base;
	uint64_t off;
	ts_status st;

	if (!ts_buffer_chunk(b, &base, &chunk.size, &off))
		return ts_error_set(err, TS_INTERNAL, "LEASE_CHUNK",
		                    "array '%s': its device memory on '%s' lies in no pool chunk",
		                    ts_array_name(a), ts_device_props(dev)->id);
	chunk.base = base;
	st = ts_device_ipc_handle(dev, base, &chunk.handle, err);
	if (st != TS_OK)
		return st;
	return ts_lease_ipc_shard(shard, &chunk, ts_buffer_data(b), ts_buffer_size(b),
	                          ts_device_props(dev), err);
}

/* Fills shard with the offset of b in its memfd, whose descriptor is *fd. */
static ts_status share_fd(const struct ts_array *a, const struct ts_buffer *b, bool writable,
                          json_t *shard, int *fd, struct ts_error *err)
{
	const char *dev = ts_device_props(ts_buffer_device(b))->id;
	const char *kind = ts_memory_kind_name(ts_buffer_kind(b));
	uint64_t off = 0;

	*fd = ts_buffer_share(b, writable, &off);
	if (*fd < 0)
		return *fd == -ENOENT
		       ? ts_error_set(err, TS_FAILED_PRECONDITION, "NOT_SHAREABLE",
		                      "array '%s': its %s memory on '%s' cannot be shared "
		                      "(not a memfd); use HTTP", ts_array_name(a), kind, dev)
		       : ts_error_set(err, TS_RESOURCE_EXHAUSTED, "LEASE_DESCRIPTOR",
		                      "array '%s': cannot open a descriptor of its memory: %s",
		                      ts_array_name(a), strerror(-*fd));
	if (json_object_set_new(shard, "transport", json_string("fd")) != 0 ||
	    json_object_set_new(shard, "offset", json_integer((json_int_t)off)) != 0 ||
	    json_object_set_new(shard, "length", json_integer((json_int_t)ts_buffer_size(b))) != 0)
		return ts_error_oom(err, "no memory for a lease answer");
	return TS_OK;
}

/* ---- leases ------------------------------------------------------------------ */

/*
 * The answer describing a's shards, and the descriptors of its "fd" shards;
 * closes what it opened on failure. FAILED_PRECONDITION, reason
 * NOT_SHAREABLE, for host memory that is no memfd (cudaHostAlloc), and as
 * ts_device_ipc_handle fails for a GPU's memory.
 */
static ts_status describe(const struct ts_array *a, bool writable, uint64_t id, json_t **out,
                          int *fds, int *nfds, struct ts_error *err)
{
	const struct ts_array_desc *d = ts_array_desc(a);
	int n = ts_array_nshards(a);
	json_t *shards = json_array(), *root;
	ts_status st = TS_OK;

	*nfds = 0;
	*out = NULL;
	for (int i = 0; i < n; i++) {
		struct ts_buffer *b = ts_array_shard_buffer(a, i);
		const struct ts_shard_box *box = ts_array_box(a, i);
		json_t *sh = json_pack("{s:s, s:s, s:o, s:o, s:i}",
		                       "device", ts_device_props(ts_buffer_device(b))->id,
		                       "memory_kind", ts_memory_kind_name(ts_buffer_kind(b)),
		                       "start", u64_list(box->start, d->rank),
		                       "count", u64_list(box->count, d->rank),
		                       "replica", box->replica);
		int fd = -1;

		if (!sh || json_array_append_new(shards, sh) != 0) {
			st = ts_error_oom(err, "no memory for a lease answer");
			goto fail;
		}
		st = on_gpu(b) ? share_ipc(a, b, sh, err) : share_fd(a, b, writable, sh, &fd, err);
		if (fd >= 0)
			fds[(*nfds)++] = fd;
		if (st != TS_OK)
			goto fail;
	}
	root = json_pack("{s:I, s:s, s:s, s:o, s:I, s:I, s:s, s:b, s:o}",
	                 "lease", (json_int_t)id, "name", ts_array_name(a),
	                 "dtype", ts_dtype_name(d->dtype), "shape", u64_list(d->shape, d->rank),
	                 "nbytes", (json_int_t)d->nbytes,
	                 "version", (json_int_t)ts_array_version(a), "etag", ts_array_etag(a),
	                 "writable", writable, "shards", shards);
	if (!root) {
		st = ts_error_oom(err, "no memory for a lease answer");
		goto fail_root;
	}
	*out = root;
	return TS_OK;

fail:
	json_decref(shards);
fail_root:
	for (int i = 0; i < *nfds; i++)
		close(fds[i]);
	*nfds = 0;
	return st;
}

/* Answers a lease or create of a (a reference the lease takes on success);
 * false when the connection must close. */
static bool grant(struct ts__lease_service *svc, struct lconn *c, struct ts_array *a,
                  bool writable)
{
	int fds[TS_MESH_MAX_DEVICES], nfds = 0;
	struct lease *l = NULL;
	struct ts_error err;
	json_t *answer = NULL;
	bool ok;

	ts_error_clear(&err);
	if (c->nleases >= LEASE_MAX_PER_CONN) {
		ts_error_set(&err, TS_RESOURCE_EXHAUSTED, "TOO_MANY_LEASES",
		             "this connection holds %d leases, the most it may; release some",
		             LEASE_MAX_PER_CONN);
		goto refuse;
	}
	l = calloc(1, sizeof *l);
	if (!l) {
		ts_error_oom(&err, "no memory for a lease");
		goto refuse;
	}
	l->id = ++svc->next_id;
	if (describe(a, writable, l->id, &answer, fds, &nfds, &err) != TS_OK)
		goto refuse;
	ok = send_frame(c->fd, answer, fds, nfds);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	if (!ok) {
		free(l);
		ts_array_unref(a);
		return false;
	}
	l->array = a;
	l->writable = writable;
	l->next = c->leases;
	c->leases = l;
	c->nleases++;
	return true;

refuse:
	free(l);
	ts_array_unref(a);
	return send_error(c->fd, &err);
}

static bool do_create(struct ts__lease_service *svc, struct lconn *c,
                      const struct ts_lease_req *rq)
{
	const struct ts_core *core = svc->core;
	struct ts_array_desc d = {.dtype = rq->dtype, .rank = rq->rank};
	struct ts_precondition pre = {0};
	struct ts_placement pl;
	struct ts_device *dev = core->default_device;
	enum ts_memory_kind kind = rq->kind_given ? rq->kind : TS_MEM_PINNED_HOST;
	struct ts_array *a = NULL;
	struct ts_error err;

	ts_error_clear(&err);
	memcpy(d.shape, rq->shape, sizeof d.shape);
	if (rq->device[0] && !(dev = ts_device_set_find(core->env.devices, rq->device))) {
		ts_error_set(&err, TS_NOT_FOUND, "DEVICE_NOT_FOUND", "no device '%s'", rq->device);
		goto refuse;
	}
	if (ts_array_desc_init(&d, &err) != TS_OK ||
	    ts_catalog_check_write(core->env.catalog, rq->name, &d, &pre, &err) != TS_OK)
		goto refuse;
	ts_placement_single(&pl, dev, kind, true);
	if (ts_array_new(rq->name, &d, &pl, core->env.memory, &a, &err) != TS_OK)
		goto refuse;
	return grant(svc, c, a, true);

refuse:
	return send_error(c->fd, &err);
}

static bool do_publish(struct ts__lease_service *svc, struct lconn *c,
                       const struct ts_lease_req *rq)
{
	struct ts_precondition pre = {.create_only = rq->create_only};
	struct lease **link, *l = lease_find(c, rq->lease, &link);
	struct ts_error err;
	bool replaced = false;

	ts_error_clear(&err);
	if (!l || !l->writable) {
		ts_error_set(&err, l ? TS_FAILED_PRECONDITION : TS_NOT_FOUND,
		             l ? "LEASE_READ_ONLY" : "LEASE_NOT_FOUND",
		             l ? "lease %llu is a read lease: only a lease of create publishes"
		               : "no lease %llu on this connection",
		             (unsigned long long)rq->lease);
		return send_error(c->fd, &err);
	}
	if (ts_catalog_put(svc->core->env.catalog, l->array, &pre, &replaced, &err) != TS_OK)
		return send_error(c->fd, &err);   /* the lease stays: fix and publish again */
	*link = l->next;
	c->nleases--;
	json_t *answer = json_pack("{s:s, s:I, s:s, s:b}", "name", ts_array_name(l->array),
	                           "version", (json_int_t)ts_array_version(l->array),
	                           "etag", ts_array_etag(l->array), "replaced", replaced);
	lease_free(l);
	return send_frame(c->fd, answer, NULL, 0);
}

/* Serves one request; false when the connection must close. */
static bool serve(struct ts__lease_service *svc, struct lconn *c, const char *payload,
                  size_t len)
{
	struct ts_lease_req rq;
	struct ts_error err;
	struct lease **link, *l;
	struct ts_array *a;

	ts_error_clear(&err);
	if (ts_lease_parse(payload, len, &rq, &err) != TS_OK)
		return send_error(c->fd, &err);
	switch (rq.op) {
	case TS_LEASE_OP_LEASE:
		a = ts_catalog_get(svc->core->env.catalog, rq.name);
		if (!a) {
			ts_error_set(&err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found",
			             rq.name);
			ts_error_meta(&err, "array", "%s", rq.name);
			return send_error(c->fd, &err);
		}
		return grant(svc, c, a, false);
	case TS_LEASE_OP_CREATE:
		return do_create(svc, c, &rq);
	case TS_LEASE_OP_PUBLISH:
		return do_publish(svc, c, &rq);
	case TS_LEASE_OP_RELEASE:
		/* no answer: releases come from garbage collectors, which cannot
		 * wait for one; a lease not held (already ended) is no error */
		l = lease_find(c, rq.lease, &link);
		if (l) {
			*link = l->next;
			c->nleases--;
			lease_free(l);
		}
		return true;
	case TS_LEASE_OP_PING:
	default:
		return send_frame(c->fd, json_object(), NULL, 0);
	}
}

/* ---- connections ------------------------------------------------------------- */

static void conn_close(struct lconn *c)
{
	while (c->leases) {
		struct lease *l = c->leases;

		c->leases = l->next;
		lease_free(l);
	}
	close(c->fd);
	free(c->buf);
	free(c);
}

/* Reads what the client sent and serves every whole frame; false when the
 * connection is done. */
static bool conn_read(struct ts__lease_service *svc, struct lconn *c)
{
	ssize_t n;

	do
		n = recv(c->fd, c->buf + c->have, 4 + TS_LEASE_FRAME_MAX - c->have, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK;
	if (n == 0)
		return false;
	c->have += (size_t)n;
	while (c->have >= 4) {
		uint32_t len = (uint32_t)c->buf[0] << 24 | (uint32_t)c->buf[1] << 16 |
		               (uint32_t)c->buf[2] << 8 | c->buf[3];

		if (len == 0 || len > TS_LEASE_FRAME_MAX) {
			struct ts_error err;

			ts_error_clear(&err);
			ts_error_set(&err, TS_INVALID_ARGUMENT, "BAD_LEASE_FRAME",
			             "a lease frame of %u bytes: frames hold 1 to %u bytes", len,
			             TS_LEASE_FRAME_MAX);
			send_error(c->fd, &err);
			return false;
		}
		if (c->have < 4 + (size_t)len)
			break;
		if (!serve(svc, c, (const char *)c->buf + 4, len))
			return false;
		memmove(c->buf, c->buf + 4 + len, c->have - 4 - len);
		c->have -= 4 + len;
	}
	return true;
}

static void conn_accept(struct ts__lease_service *svc)
{
	struct lconn *c;
	int fd = accept4(svc->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	if (fd < 0)
		return;
	if (svc->nconns == LEASE_MAX_CONNS) {
		struct ts_error err;

		ts_error_clear(&err);
		ts_error_set(&err, TS_UNAVAILABLE, "TOO_MANY_CONNECTIONS",
		             "the lease service serves %d connections at most", LEASE_MAX_CONNS);
		send_error(fd, &err);
		close(fd);
		return;
	}
	c = calloc(1, sizeof *c);
	if (c)
		c->buf = malloc(4 + TS_LEASE_FRAME_MAX);
	if (!c || !c->buf) {
		free(c);
		close(fd);
		return;
	}
	c->fd = fd;
	svc->conns[svc->nconns++] = c;
}

static void *lease_thread(void *arg)
{
	struct ts__lease_service *svc = arg;
	struct pollfd *pfd = calloc(LEASE_MAX_CONNS + 2, sizeof *pfd);

	if (!pfd) {
		ts_log(TS_LOG_ERROR, NULL, "lease service: no memory to poll; not serving");
		return NULL;
	}
	for (;;) {
		size_t n = svc->nconns;

		pfd[0] = (struct pollfd){.fd = svc->wake[0], .events = POLLIN};
		pfd[1] = (struct pollfd){.fd = svc->listen_fd, .events = POLLIN};
		for (size_t i = 0; i < n; i++)
			pfd[2 + i] = (struct pollfd){.fd = svc->conns[i]->fd, .events = POLLIN};
		if (poll(pfd, n + 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (pfd[0].revents)
			break;
		/* connections first (from the end, so removal keeps indices), then
		 * the new ones */
		for (size_t i = n; i-- > 0;) {
			if (!pfd[2 + i].revents)
				continue;
			if (!conn_read(svc, svc->conns[i])) {
				conn_close(svc->conns[i]);
				svc->conns[i] = svc->conns[--svc->nconns];
			}
		}
		if (pfd[1].revents & POLLIN)
			conn_accept(svc);
	}
	free(pfd);
	return NULL;
}

/* ---- lifecycle --------------------------------------------------------------- */

ts_status ts__lease_start(struct ts_server *srv, struct ts_error *err)
{
	struct ts__lease_service *svc;
	ts_status st;
	int n;

	svc = calloc(1, sizeof *svc);
	if (!svc)
		return ts_error_oom(err, "no memory for the lease service");
	svc->core = &srv->core;
	svc->listen_fd = svc->wake[0] = svc->wake[1] = -1;
	n = snprintf(svc->path, sizeof svc->path, "%s.lease", srv->cfg.unix_socket);
	if (n < 0 || (size_t)n >= sizeof svc->path) {
		st = ts_error_set(err, TS_INVALID_ARGUMENT, "BAD_FLAG",
		                  "--unix-socket '%s' is too long for its lease socket "
		                  "'<path>.lease' (at most %zu characters)", srv->cfg.unix_socket,
		                  sizeof svc->path - 1 - strlen(".lease"));
		goto fail;
	}
	if (pipe2(svc->wake, O_CLOEXEC) != 0) {
		st = ts_error_set(err, TS_UNAVAILABLE, "LEASE_SERVICE", "pipe: %s", strerror(errno));
		goto fail;
	}
	st = ts__unix_listen_at(&srv->cfg, svc->path, &svc->listen_fd, err);
	if (st != TS_OK)
		goto fail;
	if (pthread_create(&svc->thread, NULL, lease_thread, svc) != 0) {
		st = ts_error_set(err, TS_RESOURCE_EXHAUSTED, "LEASE_SERVICE",
		                  "cannot start the lease service's thread");
		unlink(svc->path);
		goto fail;
	}
	svc->started = true;
	srv->lease = svc;
	return TS_OK;

fail:
	if (svc->listen_fd >= 0)
		close(svc->listen_fd);
	if (svc->wake[0] >= 0) {
		close(svc->wake[0]);
		close(svc->wake[1]);
	}
	free(svc);
	return st;
}

void ts__lease_stop(struct ts_server *srv)
{
	struct ts__lease_service *svc = srv->lease;
	char b = 1;

	if (!svc)
		return;
	if (write(svc->wake[1], &b, 1) != 1)
		ts_log(TS_LOG_ERROR, NULL, "lease service: cannot wake its thread to stop");
	pthread_join(svc->thread, NULL);
	for (size_t i = 0; i < svc->nconns; i++)
		conn_close(svc->conns[i]);
	close(svc->listen_fd);
	unlink(svc->path);
	close(svc->wake[0]);
	close(svc->wake[1]);
	free(svc);
	srv->lease = NULL;
}
