/*
 * import.h - safetensors tensors into the catalog as arrays, all or
 * nothing: the catalog side of POST /v1/arrays:import and of
 * POST /v1/models:import.
 *
 * A receiver (struct ts_import_rx) takes a safetensors body as it comes,
 * streamed by a request or read from a file: the 8-byte length (checked
 * against the header limit and the budget all imports share, struct
 * ts_jobs_env), the header (validated as the reference implementation
 * does), then the data, each byte routed straight into its tensor's
 * buffer. Every tensor is admitted (allocated) as soon as the header is
 * read, and all are published together at the end, so a refused,
 * truncated or failed import leaves the catalog and the spaces as they
 * were.
 *
 * An array import (struct ts_import) is a receiver whose tensors become
 * arrays named prefix + tensor name at one placement. Its bytes come from
 * the caller (ts_import_bytes, then ts_import_publish), or from a file
 * below the data dir that an operation opens and reads
 * (ts_job_import_submit); the caller may wait for the open's outcome
 * (ts_import_open_arm) before it answers.
 *
 * Thread-safety: a receiver and an import's bytes belong to one thread at
 * a time (the request's, then the operation's once submitted); the open's
 * outcome (arm, disarm, ts_import_open_failed) is safe from any thread;
 * references are atomic.
 */
#ifndef TS_JOBS_IMPORT_H
#define TS_JOBS_IMPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "formats/safetensors.h"
#include "jobs/env.h"
#include "ops/operation.h"
#include "storage/array.h"

/* ---- the receiver of a safetensors body ---------------------------------------- */

/*
 * Once the header is parsed, admit creates one (unpublished) array per
 * tensor, in st order, into arrays[]; it decides names, placements and
 * what a tensor must be, and may refuse the file (its error answers the
 * import).
 */
struct ts_array_writer;
typedef ts_status ts_import_admit_fn(void *ctx, const struct ts_st_header *st,
                                     struct ts_array **arrays, struct ts_error *err);

/* Fields are read only by the receiver's user, after bytes. */
struct ts_import_rx {
	const struct ts_jobs_env *env;
	ts_import_admit_fn *admit;
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

/* Zeroes r for a body of content_length bytes (UINT64_MAX: unknown);
 * env is borrowed for r's life. */
void ts_import_rx_init(struct ts_import_rx *r, const struct ts_jobs_env *env,
                       uint64_t content_length, ts_import_admit_fn *admit, void *ctx);

/* Takes the body's next n bytes. INVALID_ARGUMENT for a body that is not
 * safetensors or too large a header (HEADER_TOO_LARGE), RESOURCE_EXHAUSTED
 * past the headers' budget (HEADER_BUDGET), admit's refusal. */
ts_status ts_import_rx_bytes(struct ts_import_rx *r, const char *data, size_t n,
                             struct ts_error *err);

/* Checks that the data ended where the header says (TRUNCATED otherwise)
 * and completes the last tensor. */
ts_status ts_import_rx_finish(struct ts_import_rx *r, struct ts_error *err);

/* Frees what r holds: the arrays' references, the header, its budget. */
void ts_import_rx_release(struct ts_import_rx *r);

/* ---- an array import ----------------------------------------------------------- */

struct ts_import;

/*
 * A new import (one reference, the caller's) of a body of content_length
 * bytes (UINT64_MAX: unknown; a file's size replaces it) into arrays named
 * prefix (copied; at most TS_ARRAY_NAME_MAX characters) + tensor name at pl
 * (copied), replacing existing arrays when overwrite. env is borrowed for
 * the import's life. RESOURCE_EXHAUSTED when out of memory.
 */
ts_status ts_import_new(const struct ts_jobs_env *env, const struct ts_placement *pl,
                        const char *prefix, bool overwrite, uint64_t content_length,
                        struct ts_import **out, struct ts_error *err);

struct ts_import *ts_import_ref(struct ts_import *im);
void ts_import_unref(struct ts_import *im);

/* Gives every array the import publishes the persist mark on (without
 * it, each keeps its name's mark, storage/array.h). Before the first byte. */
void ts_import_set_persist(struct ts_import *im, bool on);

/* A streamed body's next n bytes (ts_import_rx_bytes' errors). */
ts_status ts_import_bytes(struct ts_import *im, const char *data, size_t n,
                          struct ts_error *err);

/*
 * Completes an import whose bytes have all arrived: publishes every array
 * or none (the catalog's refusals: ALREADY_EXISTS without overwrite, a
 * hold). *result: {"arrays": [metadata...], "metadata": {...}} (new
 * reference; NULL when out of memory after publishing).
 */
ts_status ts_import_publish(struct ts_import *im, json_t **result, struct ts_error *err);

/*
 * Submits reading the file rel (relative to data_dir, its realpath; path
 * as the client wrote it, for messages; both copied) as an operation of
 * kind "import" that opens it beneath data_dir (no link followed, regular
 * files only), reads it through the receiver and publishes as
 * ts_import_publish, leaving that result. The operation takes its own
 * reference to im; data_dir is borrowed and must outlive it. A new
 * reference to the operation in *op.
 */
ts_status ts_job_import_submit(struct ts_import *im, const char *data_dir, const char *rel,
                               const char *path, struct ts_operation **op,
                               struct ts_error *err);

/*
 * The open's outcome, for a caller that answers once the file is open:
 * arm registers wake(token), called once (under the import's lock, from
 * the operation's worker) when the open has succeeded or failed, and
 * returns false when it already has (nothing registered); disarm removes
 * that registration if it is still there. ts_import_open_failed copies the
 * open's error into err and returns true when it failed.
 */
bool ts_import_open_arm(struct ts_import *im, void (*wake)(void *token), void *token);
void ts_import_open_disarm(struct ts_import *im, void (*wake)(void *token), void *token);
bool ts_import_open_failed(struct ts_import *im, struct ts_error *err);

#endif
