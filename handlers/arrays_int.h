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

/*
 * The receiving side of a safetensors body, streamed or read from a file:
 * the 8-byte length (checked against the server's header limit and the
 * budget all imports share), the header (validated as the reference
 * implementation does, and against the body's length when known), then the
 * data, each byte routed straight into its tensor's array. Once the header
 * is parsed, admit creates one (unpublished) array per tensor, in st
 * order, into arrays[]; it decides names, placements and what a tensor
 * must be, and may refuse the file (its error answers the request). Used
 * by POST /v1/arrays:import and POST /v1/models:import.
 *
 * init zeroes r; bytes takes the body's bytes in order; finish checks that
 * the data ended where the header says (TRUNCATED otherwise) and completes
 * the last tensor; release frees what r holds (the arrays' references, the
 * header, its budget). Fields are read only by r's user after bytes.
 */
struct ts_array_writer;
typedef ts_status ts_h_st_admit_fn(void *ctx, const struct ts_st_header *st,
                                   struct ts_array **arrays, struct ts_error *err);
struct ts_h_st_recv {
	const struct ts_core *core;
	ts_h_st_admit_fn *admit;
	void *ctx;
	uint64_t content_length;           /* UINT64_MAX: unknown */
	uint64_t received;
	char first8[8];
	char *header;                      /* the JSON header, buffered */
	uint64_t header_held;              /* of the headers' budget, given back at release */
	uint64_t header_len, header_got;
	bool parsed;
	struct ts_st_header st;
	struct ts_array **arrays;          /* one per tensor, in st order (own references) */
	size_t cur;                        /* tensor receiving data */
	struct ts_array_writer *writer;    /* into arrays[cur] */
	uint64_t data_got;                 /* bytes of the data section received */
};

void ts_h_st_recv_init(struct ts_h_st_recv *r, const struct ts_core *core,
                       uint64_t content_length, ts_h_st_admit_fn *admit, void *ctx);
ts_status ts_h_st_recv_bytes(struct ts_h_st_recv *r, const char *data, size_t n,
                             struct ts_error *err);
ts_status ts_h_st_recv_finish(struct ts_h_st_recv *r, struct ts_error *err);
void ts_h_st_recv_release(struct ts_h_st_recv *r);

#endif
