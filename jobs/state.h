/*
 * state.h - the state dir: what a restart keeps. Arrays and models marked
 * to persist (storage/array.h's persist mark, a model's persist flag) are
 * written to one directory, as Redis writes its RDB, at drain and on
 * request, and read back at the next start before the daemon says it is
 * ready.
 *
 * On disk, one save is a generation N: one file per entry
 * ("a.<array>.<N>.safetensors": the array as a one-tensor safetensors file
 * named by the array, its __metadata__ kept; "m.<model>.<N>.safetensors":
 * the model's exact checkpoint, jobs/checkpoint.h), then "manifest.json"
 * naming them with their sizes, FNV-1a hashes, placements and marks. Every
 * file is written to a temporary name, fsynced and renamed, and the
 * directory fsynced; the manifest goes last, so until its rename the
 * previous save stays whole and is what a start reads (a crash, SIGKILL
 * included, in the middle of a save loses only that save). Files of the
 * previous manifest that the new one does not name are removed after it.
 *
 * Restore reads the manifest and each entry; a manifest or entry that
 * cannot be read, is torn, fails its hash or cannot be placed is skipped
 * with a log line naming it and the reason, and counted
 * (tstage_state_restore_skipped_total{reason}); restore never fails a
 * start. An array comes back under its name, dtype, shape, bytes and
 * metadata, at its placement or, when a device is gone, on the default
 * device (logged); an uncommitted array at the current default placement.
 * A model comes back from its checkpoint: spec, optimizer state and steps.
 * Versions and ETags start again (version 1, a new ETag): clients
 * revalidate.
 *
 * One writer at a time: saves (the operation, the drain's) take the
 * state's lock for their whole run.
 *
 * Thread-safety: every function is safe from any thread; a save runs on
 * the caller's thread or an operation worker.
 */
#ifndef TS_JOBS_STATE_H
#define TS_JOBS_STATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "device/device.h"
#include "jobs/env.h"
#include "ops/operation.h"

struct ts_state;

/* Why a restore skipped an entry (the metric's reason label). */
#define TS_STATE_SKIP_REASONS(X)                                                  \
	X(MANIFEST, "manifest")       /* manifest.json unreadable or not a manifest */ \
	X(ENTRY, "entry")             /* an entry of the manifest is malformed */      \
	X(MISSING, "missing")         /* its file is gone */                           \
	X(TRUNCATED, "truncated")     /* its file is shorter or longer than saved */   \
	X(CHECKSUM, "checksum")       /* its bytes fail the saved hash */              \
	X(CORRUPT, "corrupt")         /* not a safetensors file of what it names */    \
	X(REFUSED, "refused")         /* no room, or the name is taken */

enum ts_state_skip {
#define TS_STATE_SKIP_ENUM(e, s) TS_STATE_SKIP_##e,
	TS_STATE_SKIP_REASONS(TS_STATE_SKIP_ENUM)
#undef TS_STATE_SKIP_ENUM
	TS_STATE_SKIP_COUNT
};

/* "manifest", "entry", ... */
const char *ts_state_skip_name(enum ts_state_skip r);

/* What the state has done since start. */
struct ts_state_stats {
	uint64_t skipped[TS_STATE_SKIP_COUNT];    /* restore skips by reason */
	uint64_t restored_arrays, restored_models;
	uint64_t saves, save_failures;
	uint64_t last_save_wall_ns;              /* 0: none yet */
	uint64_t last_save_bytes;
	uint64_t generation;                     /* of the last manifest read or written */
	bool restored;                           /* restore has run */
};

/*
 * A state over dir (created 0700 when missing; copied), for the objects in
 * env (borrowed, outliving it). Uncommitted arrays and arrays whose devices
 * are gone are restored at (default_device, default_kind). Fails
 * (FAILED_PRECONDITION, STATE_DIR) when dir cannot be made or opened.
 */
ts_status ts_state_new(const struct ts_jobs_env *env, struct ts_device *default_device,
                       enum ts_memory_kind default_kind, const char *dir,
                       struct ts_state **out, struct ts_error *err);
void ts_state_free(struct ts_state *s);

/* The directory, as given. */
const char *ts_state_dir(const struct ts_state *s);

/*
 * Restores the last save into the catalog and the model registry: every
 * entry that reads back whole, each skip logged and counted. Never fails;
 * call once, before the daemon is ready.
 */
void ts_state_restore(struct ts_state *s);

/*
 * Writes every marked array and model as a new generation (the lock held
 * throughout: one writer at a time). op, when not NULL, is the operation
 * running it: its progress (bytes) and cancellation. A model whose arrays a
 * step holds is waited for (until op is cancelled; without op, 30 s, then
 * ABORTED MODEL_BUSY). *result (may be NULL):
 * {"generation", "arrays", "models", "bytes", "dir"} (new reference). Fails
 * with the errno's status naming the file (the previous save stays whole),
 * or CANCELLED.
 */
ts_status ts_state_save(struct ts_state *s, struct ts_operation *op, json_t **result,
                        struct ts_error *err);

/* Submits ts_state_save as an operation of kind "save_state" (unit bytes);
 * a new reference to it in *op. */
ts_status ts_job_state_save_submit(struct ts_state *s, struct ts_operation **op,
                                   struct ts_error *err);

/* A copy of the counters. */
void ts_state_stats(struct ts_state *s, struct ts_state_stats *out);

/* {"dir", "generation", "last_save_time", "saves", "restored": {...},
 * "skipped": {reason: n}, "arrays": [names marked], "models": [...]} (new
 * reference; NULL when out of memory). */
json_t *ts_state_render(struct ts_state *s);

#endif
