/*
 * lease.h - what the lease service (lease.c) answers for a device array on
 * a GPU, in pure functions: a CUDA IPC handle's text, and the shard that
 * names a pool chunk's handle with the array's offset in it.
 *
 * A CUDA IPC handle names a whole cudaMalloc allocation (and maps it
 * read-write), so the lease service hands out device memory of the lease's
 * own, never the pool's; a shard says which allocation (the handle,
 * "chunk_bytes"), where the array's bytes start in it ("offset", 0 for a
 * lease's own memory) and how many there are ("length"), and on which GPU
 * (ordinal, PCI bus id and UUID: a client's ordinals may differ under
 * CUDA_VISIBLE_DEVICES, the bus id does not).
 *
 * Thread-safety: pure functions.
 */
#ifndef TS_SERVER_LEASE_H
#define TS_SERVER_LEASE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"

/* Characters of a handle's text: two lower-case hex digits a byte. */
#define TS_LEASE_IPC_HEX (2 * TS_IPC_HANDLE_BYTES)

/* h as TS_LEASE_IPC_HEX lower-case hex digits and a NUL, in out. */
void ts_lease_ipc_hex(const struct ts_ipc_handle *h, char out[TS_LEASE_IPC_HEX + 1]);

/* Parses the text of ts_lease_ipc_hex (either case) into *out; false for
 * anything else (another length, a character that is no hex digit). */
bool ts_lease_ipc_unhex(const char *hex, struct ts_ipc_handle *out);

/* An allocation and its handle. */
struct ts_lease_ipc_chunk {
	struct ts_ipc_handle handle;     /* of the allocation based at base */
	const void *base;                /* the chunk's base (a device pointer) */
	uint64_t size;                   /* its bytes */
};

/*
 * Sets in shard (a JSON object, borrowed) the members of a shard handed by
 * CUDA IPC: "transport":"cuda_ipc", "offset" (of data in the chunk),
 * "length", and "cuda_ipc":{"handle","chunk_bytes","ordinal","pci_bus_id",
 * "uuid"} (the last three from props). INTERNAL, reason LEASE_CHUNK, when
 * [data, data + length) is not inside the chunk; RESOURCE_EXHAUSTED when
 * out of memory. shard may be partly filled on failure.
 */
ts_status ts_lease_ipc_shard(json_t *shard, const struct ts_lease_ipc_chunk *chunk,
                             const void *data, uint64_t length,
                             const struct ts_device_props *props, struct ts_error *err);

#endif
