/*
 * lease_wire.h - a small client of tstaged's lease service (server/lease.c)
 * for the tests and benches: frames (4-byte big-endian length, JSON), the
 * descriptors of an answer received with SCM_RIGHTS, and mappings of them.
 * Static functions: each binary that includes it gets its own copy.
 * Failures return -1 / NULL with errno set or the answer's error kept.
 *
 * A shard of a lease answer says how it is handed ("transport"):
 *   "fd"        a descriptor came with the answer for it (one per "fd"
 *               shard, in shard order); its bytes are [offset, offset +
 *               length) of the file: lw_map.
 *   "cuda_ipc"  no descriptor; "cuda_ipc":{"handle": 128 hex digits, the 64
 *               bytes of a cudaIpcMemHandle_t of the GPU pool's allocation,
 *               "chunk_bytes": its size, "ordinal", "pci_bus_id", "uuid"}:
 *               pick the device by its bus id (cudaDeviceGetByPCIBusId:
 *               ordinals differ under CUDA_VISIBLE_DEVICES), open the
 *               handle (cudaIpcOpenMemHandle, lw_ipc_handle gives its
 *               bytes); the bytes are [offset, offset + length) of what it
 *               opens. Close it (cudaIpcCloseMemHandle) before releasing.
 */
#ifndef TS_TESTS_LEASE_WIRE_H
#define TS_TESTS_LEASE_WIRE_H

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/hugepage.h"

#define LW_MAX_FDS 64

/* A connection to "<sock>.lease"; -1 on failure. */
static inline int lw_connect(const char *sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(sock);
	int fd;

	if (n + sizeof ".lease" > sizeof sa.sun_path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(sa.sun_path, sock, n);
	memcpy(sa.sun_path + n, ".lease", sizeof ".lease");
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Sends len bytes of payload as one frame, with fds attached when nfds > 0. */
static inline int lw_send_frame(int fd, const void *payload, uint32_t len, const int *fds,
                                int nfds)
{
	unsigned char *frame = malloc(4 + (size_t)len);
	union {
		char buf[CMSG_SPACE(sizeof(int) * LW_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr msg = {0};
	size_t off = 0;
	ssize_t n;

	if (!frame)
		return -1;
	frame[0] = (unsigned char)(len >> 24);
	frame[1] = (unsigned char)(len >> 16);
	frame[2] = (unsigned char)(len >> 8);
	frame[3] = (unsigned char)len;
	memcpy(frame + 4, payload, len);
	while (off < 4 + (size_t)len) {
		iov = (struct iovec){frame + off, 4 + (size_t)len - off};
		memset(&msg, 0, sizeof msg);
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		if (off == 0 && nfds > 0) {
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
		n = sendmsg(fd, &msg, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			free(frame);
			return -1;
		}
		off += (size_t)n;
	}
	free(frame);
	return 0;
}

/* Reads exactly n bytes, collecting descriptors; -1 at EOF or failure. */
static inline int lw_recv_exact(int fd, void *buf, size_t n, int *fds, int *nfds)
{
	size_t got = 0;

	while (got < n) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * LW_MAX_FDS)];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = {(char *)buf + got, n - got};
		struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
		                     .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
		ssize_t r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));

			for (int i = 0; i < k; i++) {
				int v;

				memcpy(&v, CMSG_DATA(c) + i * sizeof(int), sizeof v);
				if (fds && *nfds < LW_MAX_FDS)
					fds[(*nfds)++] = v;
				else
					close(v);
			}
		}
		got += (size_t)r;
	}
	return 0;
}

/* One answer: its JSON (new reference) and descriptors; NULL at EOF. */
static inline json_t *lw_recv(int fd, int *fds, int *nfds)
{
	unsigned char h[4];
	uint32_t len;
	char *body;
	json_t *j;

	*nfds = 0;
	if (lw_recv_exact(fd, h, 4, fds, nfds) != 0)
		return NULL;
	len = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
	body = malloc(len ? len : 1);
	if (!body || lw_recv_exact(fd, body, len, fds, nfds) != 0) {
		free(body);
		return NULL;
	}
	j = json_loadb(body, len, 0, NULL);
	free(body);
	return j;
}

/* Sends the JSON text req and answers the reply (NULL when none came). */
static inline json_t *lw_call(int fd, const char *req, int *fds, int *nfds)
{
	*nfds = 0;
	if (lw_send_frame(fd, req, (uint32_t)strlen(req), NULL, 0) != 0)
		return NULL;
	return lw_recv(fd, fds, nfds);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22   /* Linux 5.14 */
#endif

/* Write faults map a page each: a writable mapping is populated at once,
 * after the huge-page advice, as MAP_POPULATE would before it. Read faults
 * populate (16 pages a fault) and, in a shared writable mapping of memfd
 * pages, map them writable; writing faults 262144 times a GiB (measured: 0.17-0.2 s
 * against 0.06 s). A kernel before 5.14 leaves it to faults. */
static inline void lw_populate_writable(void *m, size_t len, bool writable)
{
	if (writable)
		(void)madvise(m, len, MADV_POPULATE_READ);
}

/* A mapping of [off, off + len) of fd; *base and *maplen are what to munmap. */
static inline void *lw_map(int fd, uint64_t off, uint64_t len, bool writable, int extra_flags,
                           void **base, size_t *maplen)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t start = off / (uint64_t)page * (uint64_t)page;
	void *m;

	*maplen = (size_t)(len + (off - start));
	m = ts_mmap_huge(*maplen, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED | extra_flags,
	                 fd, start);
	if (m == MAP_FAILED)
		return NULL;
	*base = m;
	return (char *)m + (off - start);
}

/*
 * Mappings a client keeps: each memfd it was handed (known by device and
 * inode: every descriptor of one memfd names the same file) mapped whole,
 * once per protection, and reused by later leases of arrays in it - a
 * pinned segment holds many arrays, and one version after another. Mapping
 * 1 GiB of 4 KiB pages costs the page tables of 262144 pages (tens of
 * milliseconds, more than reading it); a kept mapping costs them once, as a
 * process's own buffers do (512 where the node gives shared memory 2 MiB
 * pages: ts_mmap_huge). A kept mapping outlives the leases: the bytes
 * of a released lease may hold another array later.
 */
#define LW_MAX_KEPT 16

struct lw_kept {
	dev_t dev;
	ino_t ino;
	bool writable;
	void *base;
	size_t len;
};

struct lw_maps {
	struct lw_kept m[LW_MAX_KEPT];
	int n;
};

/* [off, off + len) of fd through the kept mapping of its file (made now,
 * of the whole file, when there is none yet); *fresh says whether it was
 * made now. NULL (errno set) when it cannot be mapped or maps is full. */
static inline void *lw_map_kept(struct lw_maps *maps, int fd, uint64_t off, uint64_t len,
                                bool writable, bool *fresh)
{
	struct stat st;
	struct lw_kept *k;
	void *m;

	*fresh = false;
	if (fstat(fd, &st) != 0)
		return NULL;
	if (off > (uint64_t)st.st_size || len > (uint64_t)st.st_size - off) {
		errno = EINVAL;
		return NULL;
	}
	for (int i = 0; i < maps->n; i++) {
		k = &maps->m[i];
		if (k->dev == st.st_dev && k->ino == st.st_ino && k->writable == writable &&
		    off + len <= k->len)
			return (char *)k->base + off;
	}
	if (maps->n == LW_MAX_KEPT) {
		errno = ENOSPC;
		return NULL;
	}
	/* a write fault maps one 4 KiB page: writable mappings are populated at
	 * once; a read fault maps 16 (fault-around), cheaper than populating */
	m = ts_mmap_huge((size_t)st.st_size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED,
	                 fd, 0);
	if (m == MAP_FAILED)
		return NULL;
	lw_populate_writable(m, (size_t)st.st_size, writable);
	maps->m[maps->n++] = (struct lw_kept){st.st_dev, st.st_ino, writable, m,
	                                      (size_t)st.st_size};
	*fresh = true;
	return (char *)m + off;
}

/* Unmaps every kept mapping. */
static inline void lw_maps_release(struct lw_maps *maps)
{
	for (int i = 0; i < maps->n; i++)
		munmap(maps->m[i].base, maps->m[i].len);
	maps->n = 0;
}

/* The value of one hex digit, or -1. */
static inline int lw_hex_digit(char c)
{
	return c >= '0' && c <= '9' ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The 64 bytes of a "cuda_ipc" shard's handle, for cudaIpcOpenMemHandle; -1
 * (errno EINVAL) when the shard has none or it is not 128 hex digits. */
static inline int lw_ipc_handle(json_t *shard, unsigned char out[64])
{
	const char *hex = json_string_value(json_object_get(json_object_get(shard, "cuda_ipc"),
	                                                    "handle"));

	if (!hex || strlen(hex) != 128) {
		errno = EINVAL;
		return -1;
	}
	for (int i = 0; i < 64; i++) {
		int hi = lw_hex_digit(hex[2 * i]), lo = lw_hex_digit(hex[2 * i + 1]);

		if (hi < 0 || lo < 0) {
			errno = EINVAL;
			return -1;
		}
		out[i] = (unsigned char)(hi << 4 | lo);
	}
	return 0;
}

#endif
