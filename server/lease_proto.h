/*
 * lease_proto.h - the messages of the lease service (server/lease.c): a
 * same-node client's requests, parsed from their frames.
 *
 * A frame is a 4-byte big-endian length (1..TS_LEASE_FRAME_MAX) and that
 * many bytes of one JSON object. Requests, by "op":
 *   {"op":"lease","name":"a"}                         read lease of a's version
 *   {"op":"create","name":"a","dtype":"float32","shape":[2,3],
 *    "memory_kind":"pinned_host","device":"cpu:0"}    writable lease, unpublished
 *   {"op":"publish","lease":7,"if_none_match":"*"}    publishes a writable lease
 *   {"op":"release","lease":7}                        ends a lease (no answer)
 *   {"op":"ping"}                                     a round trip
 * device, memory_kind and if_none_match are optional; unknown members are
 * refused (a misspelt option must not be ignored). A client may send many
 * frames before reading an answer (pipelining): ts_lease_frame_next cuts
 * them off its byte stream one by one, in order.
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_LEASE_PROTO_H
#define TS_LEASE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/name.h"
#include "common/status.h"
#include "device/device.h"
#include "formats/dtype.h"

#define TS_LEASE_FRAME_MAX 65536u

enum ts_lease_op {
	TS_LEASE_OP_LEASE = 0,
	TS_LEASE_OP_CREATE,
	TS_LEASE_OP_PUBLISH,
	TS_LEASE_OP_RELEASE,
	TS_LEASE_OP_PING,
};

struct ts_lease_req {
	enum ts_lease_op op;
	char name[TS_NAME_MAX + 1];        /* lease, create */
	uint64_t lease;                    /* publish, release */
	enum ts_dtype dtype;               /* create */
	int rank;                          /* create */
	uint64_t shape[TS_MAX_RANK];       /* create */
	bool kind_given;                   /* create: memory_kind named */
	enum ts_memory_kind kind;
	char device[64];                   /* create: "" the default device */
	bool create_only;                  /* publish: if_none_match "*" */
};

/* Where a byte stream stands, cut at its first frame. */
enum ts_lease_frame_state {
	TS_LEASE_FRAME_MORE = 0,  /* not a whole frame yet: read more */
	TS_LEASE_FRAME_WHOLE,     /* a frame: serve it, then cut again after it */
	TS_LEASE_FRAME_BAD,       /* a length that no frame has: answer, then close */
};

struct ts_lease_frame {
	const char *payload;      /* inside the stream; not NUL-terminated */
	size_t len;               /* its bytes, 1..TS_LEASE_FRAME_MAX */
	size_t size;              /* the frame's: 4 + len */
};

/*
 * Cuts the first frame off the have bytes at buf: WHOLE with *out set,
 * MORE when they hold no whole frame yet (*out untouched), BAD when its
 * length is 0 or over TS_LEASE_FRAME_MAX (INVALID_ARGUMENT, reason
 * BAD_LEASE_FRAME, in err). Reads only [buf, buf + have).
 */
enum ts_lease_frame_state ts_lease_frame_next(const unsigned char *buf, size_t have,
                                              struct ts_lease_frame *out,
                                              struct ts_error *err);

/*
 * Parses one frame's payload (len bytes, not NUL-terminated) into *out.
 * INVALID_ARGUMENT, reason BAD_LEASE_REQUEST, with a message naming the
 * member, when it is not such a request.
 */
ts_status ts_lease_parse(const char *buf, size_t len, struct ts_lease_req *out,
                         struct ts_error *err);

#endif
