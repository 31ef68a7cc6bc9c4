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
 *            CUDA IPC handle (lease.h) of device memory of the lease's own,
 *            a copy of the version's bytes (offset 0): CUDA IPC maps
 *            read-write whatever the lease says. The lease holds the
 *            version - its buffers and their bytes - until it is released
 *            or its connection closes, whatever the name meets meanwhile
 *            (replaced, deleted, moved): the memory goes back to its space
 *            only then.
 *   create   the same with "writable":true for a new, unpublished array
 *            (memory reserved in its space now) that the client fills: an
 *            "fd" shard is a read-write descriptor of scratch memory of the
 *            lease's own (offset 0; bytes zero), on a GPU "cuda_ipc" of
 *            zeroed device memory of its own; nothing is visible until
 *            publish.
 *   publish  {"name","version","etag","replaced"}: the scratch's bytes are
 *            copied into the array, which becomes the name's current
 *            version (the checks of an upload: holds, owners,
 *            if_none_match), and the lease ends (on a GPU, its device
 *            memory stays until it is released: the client's handle may
 *            still be open).
 *   release  no answer (garbage collectors send it without waiting): the
 *            lease ends; one not held is ignored.
 *   ping     {}: a round trip, after which every earlier release is done.
 * Descriptors travel one per "fd" shard, in the order of the shards.
 * Failures answer {"error":{...}} (google.rpc.Status, as over HTTP), after
 * which the connection goes on, except for a frame that cannot be read
 * (length 0 or over TS_LEASE_FRAME_MAX): answered, then closed. A client
 * that shuts its side down for writing is still answered what it sent.
 *
 * What a lessee can and cannot do (docs/API.md says it for users):
 *  - a read lease's descriptor names memory that holds that version's bytes
 *    and will never hold another array's: a pageable allocation's own memfd
 *    (closed, never reused, when the version is freed), or a copy of a
 *    version that lies in a pinned segment or a device region, made at its
 *    first lease in the device's unpinned_host space and freed with the
 *    version (memory/buffer.h, ts_buffer_leasable). Whatever a lessee keeps
 *    mapped after its lease ends shows the bytes of that version only;
 *  - no descriptor handed out can write any array: every pool memfd is
 *    sealed with F_SEAL_FUTURE_WRITE before its first descriptor leaves
 *    (hostmem.c), so a descriptor reopened read-write through /proc/self/fd
 *    can neither be written nor mapped writable, whoever reopens it;
 *  - a writable lease maps scratch memory of its own (a memfd outside the
 *    pools, ts_host_scratch_new); publish copies it into the array's memory
 *    reserved at create, so the writer's mapping never reaches a published
 *    version; the scratch is freed, never reused, when the lease ends;
 *  - a GPU's array is a CUDA IPC handle, which CUDA maps read-write, of
 *    device memory of the lease's own (its own cudaMalloc, outside the pool):
 *    a copy of the version for a read lease, zeroed memory that publish
 *    copies from for a writable one; what a lessee writes there reaches no
 *    version and no other lease. It is freed on release, or, once the
 *    connection has closed, when the peer process exits (struct orphan);
 *  - a client of the daemon's own uid, or root, can ptrace the daemon or open
 *    /proc/<pid>/mem, and so write anything: nothing here holds against it.
 * The memfds are sealed at their size, so no client can truncate memory
 * under the daemon.
 *
 * One thread serves every connection with poll(); requests are short (a
 * catalog lookup, an allocation, a publish's copy). Frames a client
 * pipelines are answered in order, one at a time: while an answer is not
 * sent whole (the client is not reading), the connection's next frames wait
 * and nothing more is read from it, so a client that writes many frames
 * before reading any is answered every one once it reads. Connections are
 * capped at a quarter of RLIMIT_NOFILE (at most LEASE_MAX_CONNS), and each
 * uid (SO_PEERCRED) at a quarter of that; one past either cap is answered
 * RESOURCE_EXHAUSTED and closed. When accept fails for want of descriptors
 * or memory, the listening socket is left alone for LEASE_BACKOFF_MS
 * instead of being polled again at once.
 *
 * Thread-safety: the service's state is its thread's; start and stop are
 * called from the server's lifecycle only.
 */
#include "server/server_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/hex.h"
#include "common/log.h"
#include "server/lease.h"
#include "server/lease_proto.h"
#include "storage/array.h"
#include "storage/stage.h"

#define LEASE_MAX_CONNS 1024
#define LEASE_MAX_PER_CONN 65536
#define LEASE_BACKOFF_MS 200
#define LEASE_IN_CAP (4 + TS_LEASE_FRAME_MAX)

/* A GPU lease's device memory of its own: one cudaMalloc allocation, so that
 * the CUDA IPC handle handed out names these bytes and nothing else. */
struct lease_gpu {
	struct ts_metrics *metrics;      /* borrowed: counts the memory */
	struct ts_device *dev;           /* borrowed; NULL: none */
	void *data;                      /* owned: ts_device_mem_free */
	uint64_t size;                   /* allocated (at least 1) */
};

struct lease {
	uint64_t id;
	struct ts_array *array;          /* owned reference */
	bool writable;                   /* an unpublished array of create */
	struct ts_host_scratch scratch;  /* a writable "fd" lease's memory; fd -1 otherwise */
	struct lease_gpu *gpu;           /* owned: one per shard; NULL when no shard is a GPU's */
	int ngpu;
	bool spent;                      /* published, array dropped: only its GPU memory is
	                                  * left, until release (the client's handle may
	                                  * still be open) */
	struct lease *next;
};

struct lconn {
	int fd;
	uid_t uid;                       /* the peer's (SO_PEERCRED) */
	pid_t pid;                       /* the peer's (SO_PEERCRED); 0: unknown */
	unsigned char *buf;              /* LEASE_IN_CAP bytes read, from start to have */
	size_t start, have;
	bool eof;                        /* the client sends no more */
	bool closing;                    /* close once the pending answer is sent */
	unsigned char *out;              /* the answer being sent: out_len bytes */
	size_t out_len, out_off;
	int out_fds[TS_MESH_MAX_DEVICES]; /* owned: sent with its first byte */
	int out_nfds;
	struct lease *leases;
	size_t nleases;
};

struct ts__lease_service {
	const struct ts_core *core;      /* borrowed: the server's */
	struct ts_metrics *metrics;      /* borrowed: the server's */
	int listen_fd;
	int wake[2];                     /* a pipe: written to stop the thread */
	pthread_t thread;
	bool started;
	char path[sizeof ((struct sockaddr_un *)0)->sun_path];
	struct lconn *conns[LEASE_MAX_CONNS];
	size_t nconns;
	size_t max_conns;                /* immutable after start */
	size_t max_per_uid;              /* immutable after start */
	uint64_t accept_after_ns;        /* accept again from then on (0: now) */
	uint64_t next_id;
	struct orphan *orphans;          /* GPU lease memory of closed connections */
	size_t norphans;
};

/* The GPU lease memory of a connection that closed while its process lives
 * on: that process may still have the CUDA IPC handles open (freeing the
 * memory under an open handle is undefined in CUDA), so the memory is freed
 * when the process exits (its pidfd, opened when the connection closed,
 * turns readable), or when the service stops. At most max_per_uid of them
 * hold a pidfd (descriptors are HTTP's and the memory files' too); past
 * that, and where no pidfd can be opened, the memory is freed at once. */
struct orphan {
	int pidfd;                       /* owned */
	struct lease *leases;            /* owned: spent, no array left */
	struct orphan *next;
};

/* ---- answers ----------------------------------------------------------------- */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A frame of j (stolen): a new buffer of *len bytes, or NULL (no memory). */
static unsigned char *frame_of(json_t *j, size_t *len)
{
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	size_t n = text ? strlen(text) : 0;
	unsigned char *frame = text ? malloc(4 + n) : NULL;

	json_decref(j);
	if (frame) {
		frame[0] = (unsigned char)(n >> 24);
		frame[1] = (unsigned char)(n >> 16);
		frame[2] = (unsigned char)(n >> 8);
		frame[3] = (unsigned char)n;
		memcpy(frame + 4, text, n);
		*len = 4 + n;
	}
	free(text);
	return frame;
}

/* One sendmsg of len bytes, with fds attached when nfds > 0: the bytes
 * sent, or -1 with errno. */
static ssize_t send_some(int fd, const unsigned char *p, size_t len, const int *fds, int nfds)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * TS_MESH_MAX_DEVICES)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {(void *)p, len};
	struct msghdr msg;
	ssize_t n;

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
		n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n;
}

static bool pending(const struct lconn *c)
{
	return c->out != NULL;
}

static void drop_pending(struct lconn *c)
{
	for (int i = 0; i < c->out_nfds; i++)
		close(c->out_fds[i]);
	c->out_nfds = 0;
	free(c->out);
	c->out = NULL;
	c->out_len = c->out_off = 0;
}

/* Sends what the socket takes of c's pending answer; false when the
 * connection must close (the client is gone). */
static bool flush(struct lconn *c)
{
	while (pending(c) && c->out_off < c->out_len) {
		ssize_t n = send_some(c->fd, c->out + c->out_off, c->out_len - c->out_off,
		                      c->out_fds, c->out_nfds);

		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK;
		for (int i = 0; i < c->out_nfds; i++)   /* they went with the first byte */
			close(c->out_fds[i]);
		c->out_nfds = 0;
		c->out_off += (size_t)n;
	}
	drop_pending(c);
	return true;
}

/* Makes one frame of j (stolen) with fds (stolen: closed once sent) c's
 * pending answer and sends what the socket takes now; false when the
 * connection must close. The next frame is served only once it is sent. */
static bool answer(struct lconn *c, json_t *j, const int *fds, int nfds)
{
	assert(!pending(c));
	c->out = frame_of(j, &c->out_len);
	c->out_off = 0;
	if (nfds > 0)
		memcpy(c->out_fds, fds, sizeof(int) * (size_t)nfds);
	c->out_nfds = nfds;
	if (!c->out) {
		drop_pending(c);
		return false;
	}
	return flush(c);
}

static bool answer_error(struct lconn *c, const struct ts_error *err)
{
	return answer(c, ts_error_to_json(err, 0), NULL, 0);
}

/* Whether b is a GPU's memory: handed by CUDA IPC, not by a descriptor. */
static bool on_gpu(const struct ts_buffer *b)
{
	return ts_buffer_kind(b) == TS_MEM_DEVICE &&
	       ts_device_props(ts_buffer_device(b))->backend == TS_BACKEND_CUDA;
}

/* ---- a GPU lease's memory ------------------------------------------------------ */

/*
 * A CUDA IPC handle names a whole cudaMalloc allocation and maps read-write
 * in whichever process opens it, so a GPU lease never hands out the pool's:
 * it gets device memory of its own, one allocation per shard, filled from
 * the version (a read lease: a device-to-device copy) or zeroed (a writable
 * one, copied into the array at publish), and freed when the lease ends.
 * That memory lies outside the device pool, in what the pool leaves of the
 * GPU (--device-memory-fraction), and is refused when it would leave less
 * than LEASE_GPU_KEEP of it free for the runtime's own allocations.
 */
#define LEASE_GPU_KEEP (128ull << 20)
#define LEASE_GPU_ZEROS (1u << 20)

static void gpu_mem_free(struct lease_gpu *g)
{
	if (g->dev && g->data) {
		ts_device_mem_free(g->dev, TS_MEM_DEVICE, g->data, g->size);
		ts_metrics_lease_device_add(g->metrics, -(int64_t)g->size, -1);
	}
	*g = (struct lease_gpu){0};
}

static void lease_gpu_free(struct lease *l)
{
	for (int i = 0; i < l->ngpu; i++)
		gpu_mem_free(&l->gpu[i]);
	free(l->gpu);
	l->gpu = NULL;
	l->ngpu = 0;
}

/* Fills n bytes of dev's memory at dst on a queue of its own and waits:
 * from src (device memory of the same GPU), or with zeros when src is NULL
 * (zeros copied in once, then doubled within dst). */
static ts_status gpu_fill(struct ts_device *dev, void *to, const void *src, uint64_t n,
                          struct ts_error *err)
{
	unsigned char *dst = to, *zeros = NULL;
	struct ts_queue *q = NULL;
	ts_status st;

	if (n == 0)
		return TS_OK;
	st = ts_queue_new(dev, &q, err);
	if (st == TS_OK && src) {
		st = ts_queue_copy(q, dst, src, n, TS_COPY_D2D, err);
	} else if (st == TS_OK) {
		uint64_t done = n < LEASE_GPU_ZEROS ? n : LEASE_GPU_ZEROS;

		zeros = calloc(1, done ? done : 1);
		if (!zeros)
			st = ts_error_oom(err, "no memory to zero a lease's device memory");
		if (st == TS_OK)
			st = ts_queue_copy(q, dst, zeros, done, TS_COPY_H2D, err);
		for (; st == TS_OK && done < n; done *= 2)
			st = ts_queue_copy(q, dst + done, dst, n - done < done ? n - done : done,
			                   TS_COPY_D2D, err);
	}
	if (q && st == TS_OK)
		st = ts_queue_sync(q, err);
	ts_queue_free(q);            /* waits for what was queued, also on failure */
	free(zeros);
	return st;
}

/* Device memory of its own for a GPU lease of b's n bytes into *g, filled
 * from b's bytes (src true) or zeroed. RESOURCE_EXHAUSTED, reason
 * OUT_OF_MEMORY, when the GPU has not that much free beside
 * LEASE_GPU_KEEP; the device layer's errors otherwise. */
static ts_status gpu_mem_new(const struct ts_buffer *b, bool src, struct lease_gpu *g,
                             struct ts_error *err)
{
	struct ts_device *dev = ts_buffer_device(b);
	uint64_t n = ts_buffer_size(b), want = n ? n : 1, free_b = 0, total = 0;
	char where[96];
	ts_status st;

	st = ts_device_mem_info(dev, &free_b, &total, err);
	if (st != TS_OK)
		return st;
	if (free_b < LEASE_GPU_KEEP || free_b - LEASE_GPU_KEEP < want) {
		struct ts_oom_figures f = {
			.where = where, .ids = {{"device", ts_device_props(dev)->id}},
			.requested = want,
			.free_bytes = free_b > LEASE_GPU_KEEP ? free_b - LEASE_GPU_KEEP : 0,
			.limit = total, .largest = TS_ERROR_UNKNOWN_BYTES,
			.cause = "a GPU lease takes memory of its own outside the device pool, "
			         "and 128 MiB stay free for the runtime",
		};

		snprintf(where, sizeof where, "%s lease memory", ts_device_props(dev)->id);
		return ts_error_oom_bytes(err, &f);
	}
	st = ts_device_mem_alloc(dev, TS_MEM_DEVICE, want, &g->data, err);
	if (st != TS_OK)
		return st;
	g->dev = dev;
	g->size = want;
	ts_metrics_lease_device_add(g->metrics, (int64_t)want, 1);
	st = gpu_fill(dev, g->data, src ? ts_buffer_data(b) : NULL, src ? n : want, err);
	if (st != TS_OK)
		gpu_mem_free(g);
	return st;
}

/* Device memory of its own for each of l's shards on a GPU, counted in
 * metrics; l->gpu stays NULL when none is. What was made stays with l on
 * failure. */
static ts_status lease_gpu_new(struct lease *l, struct ts_metrics *metrics,
                               struct ts_error *err)
{
	int n = ts_array_nshards(l->array);
	ts_status st = TS_OK;
	bool any = false;

	for (int i = 0; i < n; i++)
		any = any || on_gpu(ts_array_shard_buffer(l->array, i));
	if (!any)
		return TS_OK;
	l->gpu = calloc((size_t)n, sizeof *l->gpu);
	if (!l->gpu)
		return ts_error_oom(err, "no memory for a lease");
	l->ngpu = n;
	for (int i = 0; st == TS_OK && i < n; i++) {
		struct ts_buffer *b = ts_array_shard_buffer(l->array, i);

		l->gpu[i].metrics = metrics;
		if (on_gpu(b))
			st = gpu_mem_new(b, !l->writable, &l->gpu[i], err);
	}
	return st;
}

/* ---- the lease table ------------------------------------------------------------ */

static void lease_free(struct lease *l)
{
	lease_gpu_free(l);
	ts_host_scratch_release(&l->scratch);
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

/* Fills shard with the handle of g, the lease's own memory for b's bytes. */
static ts_status share_ipc(const struct ts_buffer *b, const struct lease_gpu *g, json_t *shard,
                           struct ts_error *err)
{
	struct ts_lease_ipc_chunk chunk = {.base = g->data, .size = g->size};
	ts_status st;

	st = ts_device_ipc_handle(g->dev, g->data, &chunk.handle, err);
	if (st != TS_OK)
		return st;
	return ts_lease_ipc_shard(shard, &chunk, g->data, ts_buffer_size(b),
	                          ts_device_props(g->dev), err);
}

/* Sets the members of an "fd" shard: its bytes are [off, off + length) of
 * the file attached. */
static ts_status fd_members(json_t *shard, uint64_t off, uint64_t length, struct ts_error *err)
{
	if (json_object_set_new(shard, "transport", json_string("fd")) != 0 ||
	    json_object_set_new(shard, "offset", json_integer((json_int_t)off)) != 0 ||
	    json_object_set_new(shard, "length", json_integer((json_int_t)length)) != 0)
		return ts_error_oom(err, "no memory for a lease answer");
	return TS_OK;
}

/* Fills shard with the offset of b's bytes in memory that holds them alone
 * (ts_buffer_leasable), whose read-only descriptor is *fd. */
static ts_status share_fd(const struct ts__lease_service *svc, const struct ts_array *a,
                          struct ts_buffer *b, json_t *shard, int *fd, struct ts_error *err)
{
	const char *dev = ts_device_props(ts_buffer_device(b))->id;
	const char *kind = ts_memory_kind_name(ts_buffer_kind(b));
	struct ts_space *copies = ts_memory_find(svc->core->env.memory, dev, TS_MEM_UNPINNED_HOST);
	struct ts_buffer *lb;
	uint64_t off = 0;
	ts_status st;

	*fd = -1;
	if (!copies)
		return ts_error_set(err, TS_INTERNAL, "LEASE_COPY",
		                    "array '%s': no unpinned_host space on '%s' for a lease copy",
		                    ts_array_name(a), dev);
	st = ts_buffer_leasable(b, copies, &lb, err);
	if (st != TS_OK)
		return st;
	*fd = ts_buffer_share(lb, &off);
	if (*fd < 0) {
		int e = -*fd;

		*fd = -1;
		return e == ENOENT
		       ? ts_error_set(err, TS_FAILED_PRECONDITION, "NOT_SHAREABLE",
		                      "array '%s': its %s memory on '%s' cannot be shared "
		                      "(not a memfd); use HTTP", ts_array_name(a), kind, dev)
		       : ts_error_set(err, TS_RESOURCE_EXHAUSTED, "LEASE_DESCRIPTOR",
		                      "array '%s': cannot open a descriptor of its memory: %s",
		                      ts_array_name(a), strerror(e));
	}
	return fd_members(shard, off, ts_buffer_size(b), err);
}

/* Fills shard for a writable lease's scratch, whose read-write descriptor is
 * *fd. */
static ts_status share_scratch(const struct ts_array *a, const struct lease *l, json_t *shard,
                               int *fd, struct ts_error *err)
{
	*fd = ts_host_scratch_share(&l->scratch);
	if (*fd < 0) {
		int e = -*fd;

		*fd = -1;
		return ts_error_set(err, TS_RESOURCE_EXHAUSTED, "LEASE_DESCRIPTOR",
		                    "array '%s': cannot open a descriptor of its memory: %s",
		                    ts_array_name(a), strerror(e));
	}
	return fd_members(shard, 0, l->scratch.size, err);
}

/* ---- leases ------------------------------------------------------------------ */

/*
 * The answer describing l's array's shards, and the descriptors of its "fd"
 * shards; closes what it opened on failure. FAILED_PRECONDITION, reason
 * NOT_SHAREABLE, for host memory that is no memfd (cudaHostAlloc), and as
 * ts_device_ipc_handle fails for a GPU's memory; RESOURCE_EXHAUSTED when a
 * lease copy does not fit its space.
 */
static ts_status describe(const struct ts__lease_service *svc, const struct lease *l,
                          json_t **out, int *fds, int *nfds, struct ts_error *err)
{
	const struct ts_array *a = l->array;
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
		if (on_gpu(b))
			st = share_ipc(b, &l->gpu[i], sh, err);
		else if (l->writable)
			st = share_scratch(a, l, sh, &fd, err);
		else
			st = share_fd(svc, a, b, sh, &fd, err);
		if (fd >= 0)
			fds[(*nfds)++] = fd;
		if (st != TS_OK)
			goto fail;
	}
	root = json_pack("{s:I, s:s, s:s, s:o, s:I, s:I, s:s, s:b, s:o}",
	                 "lease", (json_int_t)l->id, "name", ts_array_name(a),
	                 "dtype", ts_dtype_name(d->dtype), "shape", u64_list(d->shape, d->rank),
	                 "nbytes", (json_int_t)d->nbytes,
	                 "version", (json_int_t)ts_array_version(a), "etag", ts_array_etag(a),
	                 "writable", l->writable, "shards", shards);
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
	json_t *reply = NULL;

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
	l->array = a;
	l->writable = writable;
	l->scratch.fd = -1;
	/* create makes one shard (ts_placement_single); one not on a GPU is
	 * filled in scratch memory of its own */
	if (writable && !on_gpu(ts_array_shard_buffer(a, 0)) &&
	    ts_host_scratch_new(ts_buffer_size(ts_array_shard_buffer(a, 0)), &l->scratch,
	                        &err) != TS_OK)
		goto refuse;
	/* a GPU's shards: device memory of the lease's own */
	if (lease_gpu_new(l, svc->metrics, &err) != TS_OK)
		goto refuse;
	if (describe(svc, l, &reply, fds, &nfds, &err) != TS_OK)
		goto refuse;
	l->next = c->leases;
	c->leases = l;
	c->nleases++;
	return answer(c, reply, fds, nfds);

refuse:
	if (l) {
		l->array = NULL;
		lease_gpu_free(l);
		ts_host_scratch_release(&l->scratch);
		free(l);
	}
	ts_array_unref(a);
	return answer_error(c, &err);
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
	return answer_error(c, &err);
}

/* Copies a writable lease's scratch (or its device memory, on a GPU) into
 * its array's memory, and waits. */
static ts_status copy_in(struct ts__lease_service *svc, const struct lease *l,
                         struct ts_error *err)
{
	struct ts_buffer *b = ts_array_shard_buffer(l->array, 0);
	struct ts_writer *w = NULL;
	ts_status st;

	if (l->gpu)
		return gpu_fill(l->gpu[0].dev, ts_buffer_data(b), l->gpu[0].data, ts_buffer_size(b),
		                err);
	if (l->scratch.fd < 0 || l->scratch.size == 0)
		return TS_OK;            /* no bytes */
	if (ts_buffer_host_visible(b)) {
		/* into the pool's pages through their file where they are fresh */
		ts_host_mem_fill(ts_buffer_device(b), ts_buffer_data(b), l->scratch.data,
		                 l->scratch.size);
		return TS_OK;
	}
	st = ts_writer_new(svc->core->env.stager, b, 0, &w, err);
	if (st == TS_OK)
		st = ts_writer_write(w, l->scratch.data, l->scratch.size, err);
	if (st == TS_OK)
		st = ts_writer_finish(w, err);
	ts_writer_free(w);
	return st;
}

static bool do_publish(struct ts__lease_service *svc, struct lconn *c,
                       const struct ts_lease_req *rq)
{
	struct ts_precondition pre = {.create_only = rq->create_only};
	struct lease **link, *l = lease_find(c, rq->lease, &link);
	struct ts_error err;
	bool replaced = false;
	json_t *reply;

	ts_error_clear(&err);
	if (!l || !l->writable || l->spent) {
		ts_error_set(&err, l ? TS_FAILED_PRECONDITION : TS_NOT_FOUND,
		             !l ? "LEASE_NOT_FOUND" : l->spent ? "LEASE_PUBLISHED" : "LEASE_READ_ONLY",
		             !l ? "no lease %llu on this connection"
		             : l->spent ? "lease %llu is published already"
		             : "lease %llu is a read lease: only a lease of create publishes",
		             (unsigned long long)rq->lease);
		return answer_error(c, &err);
	}
	/* the lease stays on failure: fix and publish again */
	if (copy_in(svc, l, &err) != TS_OK ||
	    ts_catalog_put(svc->core->env.catalog, l->array, &pre, &replaced, &err) != TS_OK)
		return answer_error(c, &err);
	reply = json_pack("{s:s, s:I, s:s, s:b}", "name", ts_array_name(l->array),
	                  "version", (json_int_t)ts_array_version(l->array),
	                  "etag", ts_array_etag(l->array), "replaced", replaced);
	if (l->gpu) {
		/* the lease's device memory may still be open in the client (CUDA
		 * IPC: freeing it under an open handle is undefined): it stays,
		 * without the array, until the client releases the lease */
		ts_array_unref(l->array);
		l->array = NULL;
		l->spent = true;
	} else {
		*link = l->next;
		c->nleases--;
		lease_free(l);
	}
	return answer(c, reply, NULL, 0);
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
		return answer_error(c, &err);
	switch (rq.op) {
	case TS_LEASE_OP_LEASE:
		a = ts_catalog_get(svc->core->env.catalog, rq.name);
		if (!a) {
			ts_error_set(&err, TS_NOT_FOUND, "ARRAY_NOT_FOUND", "array '%s' not found",
			             rq.name);
			ts_error_meta(&err, "array", "%s", rq.name);
			return answer_error(c, &err);
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
		return answer(c, json_object(), NULL, 0);
	}
}

/* ---- connections ------------------------------------------------------------- */

static void leases_free(struct lease *l)
{
	while (l) {
		struct lease *next = l->next;

		lease_free(l);
		l = next;
	}
}

static void orphan_free(struct orphan *o)
{
	leases_free(o->leases);
	close(o->pidfd);
	free(o);
}

/* Whether the process behind pidfd still runs. */
static bool pid_alive(int pidfd)
{
	struct pollfd p = {.fd = pidfd, .events = POLLIN};

	return pidfd >= 0 && poll(&p, 1, 0) == 0;
}

/* Ends c's leases and closes it. Their arrays go back now; GPU lease memory
 * waits for the peer's exit when it still runs (struct orphan). */
static void conn_close(struct ts__lease_service *svc, struct lconn *c)
{
	struct lease *gpu = NULL;
	struct orphan *o;
	int pidfd;

	while (c->leases) {
		struct lease *l = c->leases;

		c->leases = l->next;
		if (!l->gpu) {
			lease_free(l);
			continue;
		}
		ts_array_unref(l->array);
		l->array = NULL;
		l->spent = true;
		l->next = gpu;
		gpu = l;
	}
	/* the pid may have been reused since accept if the peer is gone: then
	 * the memory waits for that process instead, which only delays it */
	pidfd = gpu && c->pid > 0 && svc->norphans < svc->max_per_uid
	        ? (int)syscall(SYS_pidfd_open, c->pid, 0) : -1;
	o = pidfd >= 0 && pid_alive(pidfd) ? calloc(1, sizeof *o) : NULL;
	if (o) {
		o->pidfd = pidfd;            /* close-on-exec, as every pidfd */
		o->leases = gpu;
		o->next = svc->orphans;
		svc->orphans = o;
		svc->norphans++;
	} else {
		if (pidfd >= 0)
			close(pidfd);
		leases_free(gpu);
	}
	drop_pending(c);
	close(c->fd);
	free(c->buf);
	free(c);
}

/* Frees the GPU lease memory of processes that exited. */
static void orphans_reap(struct ts__lease_service *svc)
{
	for (struct orphan **p = &svc->orphans; *p;) {
		struct orphan *o = *p;

		if (pid_alive(o->pidfd)) {
			p = &o->next;
			continue;
		}
		*p = o->next;
		svc->norphans--;
		orphan_free(o);
	}
}

/* Serves the whole frames read, in order, while no answer is pending; false
 * when the connection must close. */
static bool conn_serve(struct ts__lease_service *svc, struct lconn *c)
{
	while (!pending(c) && !c->closing) {
		size_t at = c->start, left = c->have - c->start;
		const unsigned char *p = c->buf + at;
		struct ts_lease_frame f;
		struct ts_error err;

		ts_error_clear(&err);
		switch (ts_lease_frame_next(p, left, &f, &err)) {
		case TS_LEASE_FRAME_MORE:
			return true;
		case TS_LEASE_FRAME_BAD:
			c->closing = true;          /* answered, then closed */
			return answer_error(c, &err);
		case TS_LEASE_FRAME_WHOLE:
			break;
		}
		c->start += f.size;
		if (!serve(svc, c, f.payload, f.len))
			return false;
	}
	return true;
}

/* Reads what the client sent; false when the connection must close. */
static bool conn_read(struct lconn *c)
{
	ssize_t n;

	if (c->start > 0) {
		memmove(c->buf, c->buf + c->start, c->have - c->start);
		c->have -= c->start;
		c->start = 0;
	}
	do
		n = recv(c->fd, c->buf + c->have, LEASE_IN_CAP - c->have, 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK;
	if (n == 0)
		c->eof = true;
	c->have += (size_t)n;
	return true;
}

/* Whether c waits for more of the client's bytes (and may take them). */
static bool conn_wants_input(const struct lconn *c)
{
	return !pending(c) && !c->eof && !c->closing &&
	       (c->start > 0 || c->have < LEASE_IN_CAP);
}

/* Whether c is done: nothing left to send and nothing more to serve. */
static bool conn_done(const struct lconn *c)
{
	return !pending(c) && (c->closing || c->eof);
}

/* Answers err on a connection not taken, if the socket takes it now. */
static void refuse_conn(int fd, const struct ts_error *err)
{
	size_t len = 0;
	unsigned char *frame = frame_of(ts_error_to_json(err, 0), &len);

	if (frame)
		(void)send_some(fd, frame, len, NULL, 0);
	free(frame);
	close(fd);
}

static size_t conns_of_uid(const struct ts__lease_service *svc, uid_t uid)
{
	size_t n = 0;

	for (size_t i = 0; i < svc->nconns; i++)
		n += svc->conns[i]->uid == uid;
	return n;
}

static void conn_accept(struct ts__lease_service *svc)
{
	struct ucred cred = {.pid = 0, .uid = (uid_t)-1};
	socklen_t clen = sizeof cred;
	struct ts_error err;
	struct lconn *c;
	int fd = accept4(svc->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

	ts_error_clear(&err);
	if (fd < 0) {
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
			/* the connection stays queued; polling for it again at once
			 * would spin: leave the socket alone a while */
			ts_log(TS_LOG_WARN, NULL, "lease service: cannot accept: %s; pausing %d ms",
			       strerror(errno), LEASE_BACKOFF_MS);
			svc->accept_after_ns = now_ns() + (uint64_t)LEASE_BACKOFF_MS * 1000000u;
		}
		return;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
		cred.uid = (uid_t)-1;
		cred.pid = 0;
	}
	if (svc->nconns >= svc->max_conns) {
		ts_error_set(&err, TS_RESOURCE_EXHAUSTED, "TOO_MANY_CONNECTIONS",
		             "the lease service serves %zu connections at most (a quarter of "
		             "the daemon's descriptors); close some", svc->max_conns);
		refuse_conn(fd, &err);
		return;
	}
	if (conns_of_uid(svc, cred.uid) >= svc->max_per_uid) {
		ts_error_set(&err, TS_RESOURCE_EXHAUSTED, "TOO_MANY_CONNECTIONS",
		             "uid %ld holds %zu lease connections, the most one uid may; "
		             "close some", (long)cred.uid, svc->max_per_uid);
		ts_error_meta(&err, "uid", "%ld", (long)cred.uid);
		refuse_conn(fd, &err);
		return;
	}
	c = calloc(1, sizeof *c);
	if (c)
		c->buf = malloc(LEASE_IN_CAP);
	if (!c || !c->buf) {
		free(c);
		close(fd);
		return;
	}
	c->fd = fd;
	c->uid = cred.uid;
	c->pid = cred.pid;           /* GPU lease memory outlives the connection while it runs */
	svc->conns[svc->nconns++] = c;
}

/* Reads, serves and answers c as its poll events say; false when it is
 * done or must close. */
static bool conn_step(struct ts__lease_service *svc, struct lconn *c, short revents)
{
	if (pending(c) && !flush(c))
		return false;
	if ((revents & (POLLIN | POLLHUP | POLLERR)) && conn_wants_input(c) && !conn_read(c))
		return false;
	if (!conn_serve(svc, c))
		return false;
	return !conn_done(c);
}

static void *lease_thread(void *arg)
{
	struct ts__lease_service *svc = arg;
	struct pollfd *pfd = calloc(2 * LEASE_MAX_CONNS + 2, sizeof *pfd);

	if (!pfd) {
		ts_log(TS_LOG_ERROR, NULL, "lease service: no memory to poll; not serving");
		return NULL;
	}
	for (;;) {
		size_t n = svc->nconns;
		uint64_t now = now_ns();
		int timeout = -1;

		pfd[0] = (struct pollfd){.fd = svc->wake[0], .events = POLLIN};
		pfd[1] = (struct pollfd){.fd = svc->listen_fd, .events = POLLIN};
		if (svc->accept_after_ns > now) {
			pfd[1].fd = -1;             /* backing off: not polled */
			timeout = (int)((svc->accept_after_ns - now) / 1000000u) + 1;
		}
		for (size_t i = 0; i < n; i++) {
			struct lconn *c = svc->conns[i];

			pfd[2 + i] = (struct pollfd){
				.fd = c->fd,
				.events = (short)((pending(c) ? POLLOUT : 0) |
				                  (conn_wants_input(c) ? POLLIN : 0)),
			};
		}
		size_t k = n + 2;

		for (const struct orphan *o = svc->orphans; o; o = o->next)
			pfd[k++] = (struct pollfd){.fd = o->pidfd, .events = POLLIN};
		if (poll(pfd, k, timeout) < 0) {
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
			if (!conn_step(svc, svc->conns[i], pfd[2 + i].revents)) {
				conn_close(svc, svc->conns[i]);
				svc->conns[i] = svc->conns[--svc->nconns];
			}
		}
		if (k > n + 2)
			orphans_reap(svc);
		if (pfd[1].fd >= 0 && (pfd[1].revents & POLLIN))
			conn_accept(svc);
	}
	free(pfd);
	return NULL;
}

/* The caps on connections: a quarter of the descriptor limit (at most
 * LEASE_MAX_CONNS), the rest being HTTP's and the memory files' (which take
 * at most half), and a quarter of that per uid. */
static void caps_from_rlimit(struct ts__lease_service *svc)
{
	struct rlimit rl;
	uint64_t nofile = 4096;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		nofile = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
	svc->max_conns = nofile / 4 < LEASE_MAX_CONNS ? (size_t)(nofile / 4) : LEASE_MAX_CONNS;
	if (svc->max_conns < 1)
		svc->max_conns = 1;
	svc->max_per_uid = svc->max_conns / 4 ? svc->max_conns / 4 : 1;
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
	svc->metrics = srv->metrics;
	svc->listen_fd = svc->wake[0] = svc->wake[1] = -1;
	caps_from_rlimit(svc);
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
		conn_close(svc, svc->conns[i]);
	while (svc->orphans) {         /* stopping: their processes' handles notwithstanding */
		struct orphan *o = svc->orphans;

		svc->orphans = o->next;
		orphan_free(o);
	}
	close(svc->listen_fd);
	unlink(svc->path);
	close(svc->wake[0]);
	close(svc->wake[1]);
	free(svc);
	srv->lease = NULL;
}
