/*
 * arrays_int.h - what the array handlers share: placement and shape
 * parsing, the metadata rendering of an array, and the streamed reader of
 * array bytes used by downloads and exports.
 *
 * Thread-safety: every function is safe on any thread; a ts_h_reader
 * belongs to one response.
 */
#ifndef TS_ARRAYS_INT_H
#define TS_ARRAYS_INT_H

#include "formats/index.h"
#include "formats/safetensors.h"
#include "handlers/handlers.h"
#include "jobs/render.h"
#include "storage/array.h"

/*
 * The placement asked for by device / memory_kind (either may be NULL):
 * neither gives the server default, uncommitted; naming either gives a
 * committed placement (the other from the defaults). Unknown device or kind
 * is INVALID_ARGUMENT naming it.
 */
ts_status ts_h_placement(const struct ts_core *core, const char *device,
                         const char *memory_kind, struct ts_placement *out,
                         struct ts_error *err);

/* The placement asked for by query parameters: ?sharding= (a saved
 * sharding's name, or an inline JSON sharding), or ?device=&memory_kind=. */
ts_status ts_h_placement_query(const struct ts_call *call, struct ts_placement *out,
                               struct ts_error *err);

/*
 * The ?persist= of an upload or import into *persist: -1 when absent (the
 * name keeps its mark), else 0 or 1 (the route declares it persist:bool).
 * persist=true without a --state-dir is FAILED_PRECONDITION
 * (NO_STATE_DIR): nothing could keep it.
 */
ts_status ts_h_persist_query(const struct ts_call *call, int *persist, struct ts_error *err);

/* Parses "8,6,16" (or "" for a scalar) into shape; INVALID_ARGUMENT naming
 * the bad entry. */
ts_status ts_h_parse_shape(const char *s, int *rank, uint64_t *shape, struct ts_error *err);

/* Formats a shape as "8,6,16" ("" for a scalar). */
void ts_h_format_shape(char *buf, size_t cap, int rank, const uint64_t *shape);


/* The array named by the path parameter "array" (new reference), or NULL
 * after filling reply (bad name 400, absent 404). */
struct ts_array *ts_h_array_from_path(const struct ts_call *call, struct ts_reply *reply);

/* The name path parameter checked for validity; NULL after filling reply. */
const char *ts_h_array_name(const struct ts_call *call, struct ts_reply *reply);

/* Answers with the metadata of a, 201 when created else 200, with ETag and
 * Location headers. */
void ts_h_reply_array(struct ts_reply *reply, const struct ts_array *a, bool created);

/*
 * A streamed body made of a prefix (owned bytes: an .npy or safetensors
 * header) followed by the selected bytes of one or more arrays, read run by
 * run straight from their buffers (device memory through the device's copy
 * queue, batched per read). Takes ownership of prefix and of the array
 * references, also on failure; fills stream. UNAVAILABLE (DEVICE_BROKEN)
 * when a part lives on a device broken by a sticky error: answered before
 * the response begins.
 */
struct ts_h_part {
	struct ts_array *array;        /* reference owned by the reader */
	struct ts_selection sel;
};
ts_status ts_h_reader_stream(const struct ts_core *core, char *prefix, size_t prefix_len,
                             struct ts_h_part *parts, size_t nparts,
                             struct ts_stream *stream, struct ts_error *err);

#endif
