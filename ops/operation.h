/*
 * operation.h - long-running operations: every move of bytes that a client
 * may want to follow (device_put, copy, import, training steps) runs as an
 * operation with an id, progress, cancellation, waiters and a result.
 *
 * Operations run on the registry's worker threads. A running operation
 * reports progress (bytes or steps done of a total) through atomics; a
 * cancel request is a flag the work checks between chunks. When the work
 * ends, the operation records its outcome (an error, or a JSON result),
 * wakes every waiter once, and stays listed until retention drops it (a
 * bounded count and age of finished operations).
 *
 * An operation may claim a target (an array name): while it runs, a second
 * operation claiming the same target is refused with ABORTED, so an array
 * with a move in flight refuses a second move.
 *
 * Thread-safety: everything here is safe from any thread. Waiter callbacks
 * run on the thread that finishes the operation (a worker, or the thread
 * cancelling a pending one or freeing the registry), with the registry's
 * lock released; they must only wake someone (no blocking, no calls back
 * in, no lock that a caller of ts_operation_unwait may hold).
 */
#ifndef TS_OPERATION_H
#define TS_OPERATION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

struct ts_trace;

struct ts_op_registry;
struct ts_operation;

enum ts_op_state { TS_OP_PENDING = 0, TS_OP_RUNNING, TS_OP_SUCCEEDED, TS_OP_FAILED, TS_OP_CANCELLED };

/* "PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED". */
const char *ts_op_state_name(enum ts_op_state s);

/* The state named name (as ts_op_state_name writes it); false for others. */
bool ts_op_state_parse(const char *name, enum ts_op_state *out);

/* What an operation's end looks like, for metrics and the log: handed to
 * the registry's `ended` hook; every pointer is borrowed for the call. */
struct ts_op_end {
	const char *id, *kind, *target, *unit;    /* target "" when none */
	enum ts_op_state state;                   /* SUCCEEDED, FAILED or CANCELLED */
	uint64_t done_units, total_units;
	uint64_t run_ns;                          /* from start to end; 0 if it never ran */
	uint64_t queued_ns;                       /* from creation to start (or end) */
	const struct ts_error *error;             /* FAILED / CANCELLED; else NULL */
};

struct ts_op_registry_config {
	int workers;                  /* threads running operations (1..1024) */
	/* called once per operation as it ends, on the finishing thread, with
	 * no lock held and before the operation shows as done (so whoever sees
	 * it done sees what the hook did); it must not call into the registry.
	 * NULL: none. */
	void (*ended)(void *cls, const struct ts_op_end *end);
	void *ended_cls;
	size_t keep_finished;         /* finished operations kept (oldest dropped first) */
	uint64_t keep_ns;             /* and for at most this long after they
	                               * finish (0: no age limit) */
	/* where operations record their spans and mark their threads for the
	 * flows to the work they cause (borrowed; NULL: none) */
	struct ts_trace *trace;
};

/* Starts a registry and its worker threads in *out. INVALID_ARGUMENT for a
 * worker count outside 1..1024, RESOURCE_EXHAUSTED when out of memory, the
 * errno's status when a thread cannot start. The registry draws a random
 * salt for its ids (getrandom). */
ts_status ts_op_registry_new(const struct ts_op_registry_config *cfg,
                             struct ts_op_registry **out, struct ts_error *err);

/* Cancels what is queued (release runs, waiters wake), requests cancellation
 * of what runs and waits for it to end, then drops the registry's references:
 * operations still referenced elsewhere stay readable (snapshot, wait,
 * block, cancel answers FAILED_PRECONDITION) until their last unref. Must
 * not race with any other call on r or on its unfinished operations. NULL
 * does nothing. */
void ts_op_registry_free(struct ts_op_registry *r);

/* The work of an operation. It returns TS_OK and sets a result through
 * ts_operation_set_result, or fails (err filled); it should check
 * ts_operation_cancelled between chunks and then return TS_CANCELLED.
 * Outcome: TS_OK is SUCCEEDED (even if cancellation was requested late),
 * TS_CANCELLED is CANCELLED with the error "operation <id> was cancelled"
 * (err is not used), anything else FAILED with err (a generic error naming
 * the operation when err was left empty); a result set by a run that did
 * not succeed is dropped. */
typedef ts_status ts_op_fn(struct ts_operation *op, void *arg, struct ts_error *err);

/*
 * Creates and queues an operation of kind ("put", "copy", "import", "step")
 * on target (may be NULL: no claim) with a total of `total` units of `unit`
 * ("bytes", "steps"; NULL is "bytes"). fn(op, arg) runs on a worker;
 * release(arg) (may be NULL) runs after it, or instead of it when cancelled
 * before it started, exactly once, and before the operation shows as done.
 * The target stays claimed until the operation is done. Fails, with arg
 * still the caller's (release is not called): ABORTED, reason TARGET_BUSY,
 * naming the target and the operation holding it, when the target is
 * claimed; INVALID_ARGUMENT when kind is empty or a string does not fit its
 * snapshot field; UNAVAILABLE once the registry is being freed;
 * RESOURCE_EXHAUSTED. Returns a new reference to the operation in *out (out
 * may be NULL). Ids are "op-" and 16 hex digits, unique per registry.
 */
ts_status ts_op_submit(struct ts_op_registry *r, const char *kind, const char *target,
                       uint64_t total, const char *unit, ts_op_fn *fn, void *arg,
                       void (*release)(void *arg), struct ts_operation **out,
                       struct ts_error *err);

/*
 * ts_op_submit, and before the operation is queued, with its id assigned,
 * hold(id, arg, err): where the work takes what it uses by identity (e.g.
 * ts_catalog_hold), so that nothing can change it between the answer and
 * the run. When hold fails, nothing is submitted and its error is returned
 * (arg stays the caller's). hold runs under the registry's lock: it may
 * take only locks under which no thread calls into the registry (the
 * catalog's).
 */
ts_status ts_op_submit_holding(struct ts_op_registry *r, const char *kind, const char *target,
                               uint64_t total, const char *unit, ts_op_fn *fn, void *arg,
                               void (*release)(void *arg),
                               ts_status (*hold)(const char *id, void *arg, struct ts_error *err),
                               struct ts_operation **out, struct ts_error *err);

/*
 * ts_op_submit, but the work runs on the calling thread, as a worker runs
 * it (listed, cancellable, its release and end as a worker's), before this
 * returns, and no worker is woken: *out is then done. For work the caller
 * would wait for anyway and which takes microseconds (publishing a small
 * array that is already in place), where a worker's hand-off and the
 * waiter's wake cost more than the work: never for work that may block.
 */
ts_status ts_op_submit_here(struct ts_op_registry *r, const char *kind, const char *target,
                            uint64_t total, const char *unit, ts_op_fn *fn, void *arg,
                            void (*release)(void *arg), struct ts_operation **out,
                            struct ts_error *err);

/* New reference to the operation with this id, or NULL (never created, or
 * dropped by retention). */
struct ts_operation *ts_op_get(struct ts_op_registry *r, const char *id);

/* Up to limit operations, newest first, optionally only those whose state is
 * `only` (pass -1 for all); new references in a new array (ts_op_list_free).
 * INVALID_ARGUMENT for another `only`, RESOURCE_EXHAUSTED. */
ts_status ts_op_list(struct ts_op_registry *r, int only, size_t limit,
                     struct ts_operation ***out, size_t *n, struct ts_error *err);
void ts_op_list_free(struct ts_operation **ops, size_t n);

/* ts_op_list resuming a listing: only operations created before the one
 * whose ts_operation_seq is `before` (0: from the newest; that operation
 * need not be listed any more). *more (may be NULL) tells whether matching
 * operations remain past the last one returned. */
ts_status ts_op_list_before(struct ts_op_registry *r, int only, uint64_t before, size_t limit,
                            struct ts_operation ***out, size_t *n, bool *more,
                            struct ts_error *err);

/* Unlists a finished operation (AIP-151 DeleteOperation): it is no longer
 * found, listed or counted; references held elsewhere stay valid.
 * FAILED_PRECONDITION (reason OPERATION_RUNNING) while it is pending or
 * running; NOT_FOUND when it is no longer listed. op is borrowed. */
ts_status ts_op_remove(struct ts_op_registry *r, struct ts_operation *op, struct ts_error *err);

/* Its creation order in its registry: later operations have larger
 * numbers (from 1). For resuming listings. */
uint64_t ts_operation_seq(const struct ts_operation *op);

/* Counts per state of the operations listed now (finished ones until
 * retention drops them), for metrics. counts has TS_OP_CANCELLED + 1
 * entries. */
void ts_op_counts(struct ts_op_registry *r, uint64_t *counts);

/* Reference counting (atomic); unref of the last reference frees op. Both
 * accept NULL; ref returns op. */
struct ts_operation *ts_operation_ref(struct ts_operation *op);
void ts_operation_unref(struct ts_operation *op);

/* Progress: add to or set the units done (atomic; readers never wait). */
void ts_operation_progress_add(struct ts_operation *op, uint64_t units);
void ts_operation_progress_set(struct ts_operation *op, uint64_t units);
/* Sets the total (atomic), for work that learns it late. */
void ts_operation_total_set(struct ts_operation *op, uint64_t total);

/* Requests cancellation; FAILED_PRECONDITION (reason OPERATION_FINISHED,
 * "operation <id> has already finished") if already finished. A pending
 * operation is cancelled at once (off the queue, release run and waiters
 * woken on the calling thread); a running one when its work next checks.
 * Cancelling twice is not an error. */
ts_status ts_operation_cancel(struct ts_operation *op, struct ts_error *err);

/* Whether cancellation was requested (for the work to check). */
bool ts_operation_cancelled(const struct ts_operation *op);

/* Stores the result of a successful run (steals the reference, which must
 * be the only one, asserted, to a value built of nothing another thread
 * holds; replaces an earlier one). For the work, on its thread. Once stored the value is the
 * operation's, read under its lock and copied into every snapshot, never
 * shared by reference (docs/ARCHITECTURE.md's jansson rule). */
void ts_operation_set_result(struct ts_operation *op, json_t *result);

/* Stores what the work did so far (steals the reference; replaces an
 * earlier one): kept whatever the outcome, also when the run fails or is
 * cancelled (AIP-151's partial results, rendered in the metadata), so that
 * a client can continue where the work stopped. For the work, on its
 * thread; shared and never changed once stored, like a result. */
void ts_operation_set_partial(struct ts_operation *op, json_t *partial);

/* Stores facts about how the work was done (steals the reference to an
 * object; replaces an earlier one), rendered as members of the metadata
 * (a move's "path"). For the work, on its thread; shared and never changed
 * once stored, like a result. */
void ts_operation_set_details(struct ts_operation *op, json_t *details);

/*
 * Registers wake(token) to be called once when the operation finishes.
 * Returns false, registering nothing, when it has already finished, and
 * also when out of memory (the caller then finds it not done and may poll).
 * A registered waiter can be removed with ts_operation_unwait: after it
 * returns, wake will not be called for that (wake, token) pair (nor is it
 * running). Call unwait from outside wake callbacks only.
 */
bool ts_operation_wait(struct ts_operation *op, void (*wake)(void *token), void *token);
void ts_operation_unwait(struct ts_operation *op, void (*wake)(void *token), void *token);

/* Blocks the calling thread until finished or timeout_ns passes
 * (monotonic clock; huge values wait for good); true when finished. For
 * tests and internal callers, never HTTP threads. */
bool ts_operation_block(struct ts_operation *op, uint64_t timeout_ns);

/* A consistent snapshot for rendering (progress is read from the atomics at
 * the same moment, without the registry's lock). error and result are
 * copies owned by the snapshot (ts_op_snapshot_release), the caller's to
 * reference, change or hand on. */
struct ts_op_snapshot {
	char id[40];
	char kind[16];
	char target[136];              /* "" when none */
	char unit[16];
	enum ts_op_state state;
	bool done;
	uint64_t done_units, total_units;
	uint64_t create_ns, start_ns, end_ns;   /* wall clock; 0 when not yet */
	struct ts_error error;         /* FAILED / CANCELLED */
	json_t *result;                /* SUCCEEDED: a copy (own) or NULL */
	json_t *partial;               /* what the work did so far (any state): own copy or NULL */
	json_t *details;               /* ts_operation_set_details': own copy or NULL */
};
void ts_operation_snapshot(const struct ts_operation *op, struct ts_op_snapshot *out);
void ts_op_snapshot_release(struct ts_op_snapshot *s);

/* The id ("op-" and 16 hex digits), borrowed for op's lifetime. */
const char *ts_operation_id(const struct ts_operation *op);

#endif
