/*
 * stage.h - moving bytes between host memory and buffers of any space: the
 * sequential writer that takes an HTTP body straight into its final buffer
 * (through pinned staging slots and the device's copy queue when the buffer
 * is device memory), reads of byte ranges, and batched copies of runs
 * between two buffers.
 *
 * Host-visible buffers are written and read with memcpy. Device buffers are
 * reached only through their device's queues: one host->device and one
 * device->host queue per device, shared by every request and created once,
 * so both directions run at once. Each caller waits on its own event. A copy
 * runs on a queue that reaches both its ends (a copy with a CUDA end on a
 * stream of that GPU); pageable host memory, the pair of a GPU and a sim
 * device, which no queue reaches together, and two devices the topology's
 * peer matrix gives no peer access (ts_stager_set_topology) go through
 * pinned slots. Every pair of backends and memory kinds is served.
 *
 * Thread-safety: a stager is shared by all threads; a writer belongs to one
 * request at a time.
 */
#ifndef TS_STAGE_H
#define TS_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "device/topology.h"
#include "memory/buffer.h"

struct ts_stager;
struct ts_writer;

/* Bytes of one pinned staging slot, and how many a writer cycles through. */
#define TS_STAGE_SLOT (4u << 20)
#define TS_STAGE_SLOTS 3

/* Reads of many runs of device memory stage covering windows: runs at most
 * this many bytes apart (and within one slot) are read with one copy. */
#define TS_STAGE_GAP (64u << 10)

/* One queue pair per device of set; staging slots come from mem's pinned
 * pool. Returns a new stager (ts_stager_free), or an error. */
ts_status ts_stager_new(struct ts_device_set *set, struct ts_memory *mem,
                        struct ts_stager **out, struct ts_error *err);
void ts_stager_free(struct ts_stager *st);

/*
 * Lets the peer matrix of t (borrowed; it outlives the stager) decide
 * copies between the device memory of two devices of one backend: a pair
 * with peer access copies directly on one queue, any other pair stages
 * through pinned slots (the source's d2h queue fills them, the
 * destination's h2d queue empties them). Without a topology every such pair
 * is a peer. Call once, before the stager is shared.
 */
void ts_stager_set_topology(struct ts_stager *st, const struct ts_topology *t);

/* How a copy between dst and src goes, where both are device memory of two
 * different devices: PEER (directly, one queue reaches both) or STAGED
 * (through pinned host slots); NONE for every other copy. */
enum ts_stage_path {
	TS_STAGE_PATH_NONE = 0,
	TS_STAGE_PATH_PEER,
	TS_STAGE_PATH_STAGED,
};
enum ts_stage_path ts_stage_path_of(struct ts_stager *st, const struct ts_buffer *dst,
                                    const struct ts_buffer *src);

/* Buffer pairs a copy moved device to device, by path (ts_array_copy_counted). */
struct ts_stage_paths {
	unsigned peer;
	unsigned staged;
};

/*
 * A writer of consecutive bytes into dst from offset on. Takes its own
 * reference to dst. Staging slots, if any, are taken now, so a writer that
 * starts can finish (RESOURCE_EXHAUSTED otherwise, naming the pinned space).
 */
ts_status ts_writer_new(struct ts_stager *st, struct ts_buffer *dst, uint64_t offset,
                        struct ts_writer **out, struct ts_error *err);

/* Copies n bytes out of data before returning (data may be reused at once).
 * Writing past the end of dst is INVALID_ARGUMENT. */
ts_status ts_writer_write(struct ts_writer *w, const void *data, size_t n,
                          struct ts_error *err);

/* Bytes accepted so far. */
uint64_t ts_writer_offset(const struct ts_writer *w);

/* Flushes and waits until every byte is in dst; returns the first failure. */
ts_status ts_writer_finish(struct ts_writer *w, struct ts_error *err);

/* Waits for copies in flight, returns the slots and drops the reference. */
void ts_writer_free(struct ts_writer *w);

/* Reads len bytes of src at offset into host memory dst, and waits. */
ts_status ts_stage_read(struct ts_stager *st, struct ts_buffer *src, uint64_t offset,
                        void *dst, uint64_t len, struct ts_error *err);

/* One contiguous run of a copy between buffers. */
struct ts_run {
	uint64_t src_offset;
	uint64_t dst_offset;
	uint64_t len;
};

/*
 * Reads every run of src into host memory dst (dst_offset relative to dst)
 * and waits once. From device memory, runs close together are read as
 * covering windows (TS_STAGE_GAP) through a pinned slot, one copy each, so a
 * strided selection costs about one copy per slot of its span; runs no
 * window gathers are copied straight into dst.
 */
ts_status ts_stage_read_runs(struct ts_stager *st, struct ts_buffer *src,
                             const struct ts_run *runs, size_t n, void *dst,
                             struct ts_error *err);

/*
 * Copies every run from src to dst (any spaces, same or different devices)
 * and waits. Runs are queued back to back on one queue and waited for once,
 * so many small runs cost one synchronisation.
 */
ts_status ts_stage_copy_runs(struct ts_stager *st, struct ts_buffer *dst,
                             struct ts_buffer *src, const struct ts_run *runs,
                             size_t n, struct ts_error *err);

/* Bytes moved since start, by (source kind, destination kind): HTTP bodies
 * count as unpinned_host. Read without locks. */
void ts_stager_totals(const struct ts_stager *st,
                      uint64_t bytes[TS_MEM_KIND_COUNT][TS_MEM_KIND_COUNT]);

/* Bytes moved implicitly (an uncommitted array moved for an operation). */
void ts_stager_count_implicit(struct ts_stager *st, uint64_t bytes);
uint64_t ts_stager_implicit(const struct ts_stager *st);

#endif
