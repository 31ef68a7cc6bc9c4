/*
 * operations.h - how handlers render a long-running operation: the AIP-151
 * JSON (name, metadata, done, and error or response) and
 * the answer of a call that started one (202 Accepted with a Location, or
 * 200 once it is done).
 *
 * Thread-safety: safe on any thread; each call reads one consistent
 * snapshot of the operation.
 */
#ifndef TS_HANDLERS_OPERATIONS_H
#define TS_HANDLERS_OPERATIONS_H

#include <stdbool.h>

#include "handlers/api.h"
#include "ops/operation.h"

/* The "@type" of an operation's metadata. */
#define TS_OP_METADATA_TYPE "type.googleapis.com/tstage.v1.OperationMetadata"

/*
 * AIP-151: {"name": "operations/<id>", "metadata": {"@type", "id", "kind",
 * "target" (absent when none), "state", "progress": {"bytes_done",
 * "bytes_total"} ("steps_done", "steps_total" for steps), "create_time",
 * "start_time", "end_time" (RFC 3339 UTC with microseconds; absent until
 * they happen)}, "done", then "error" (a google.rpc.Status) when FAILED or
 * CANCELLED, or "response" ({} when the work set none) when SUCCEEDED, and
 * no other member. New reference; NULL when out of memory. op is borrowed.
 */
json_t *ts_h_operation_json(const struct ts_operation *op);

/* Answers with the operation: 200 when finished, else 202 Accepted with
 * "Location: /v1/operations/<id>". op is borrowed. */
void ts_h_reply_operation(struct ts_reply *reply, struct ts_operation *op, bool finished);

#endif
