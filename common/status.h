/*
 * status.h - the one list of outcomes every layer returns.
 *
 * A ts_status is a google.rpc canonical code. TS_OK is 0; every other value
 * names a failure class whose HTTP number comes from the same X-macro row, so
 * no caller ever writes a bare HTTP number. struct ts_error carries the code,
 * a machine-readable reason, a human message and optional metadata into the
 * google.rpc.Status error body.
 *
 * Thread-safety: the tables are immutable; a ts_error belongs to one thread.
 */
#ifndef TS_STATUS_H
#define TS_STATUS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* X(enum suffix, canonical name, grpc code, http status) */
#define TS_STATUS_MAP(X)                                  \
	X(OK, "OK", 0, 200)                                   \
	X(CANCELLED, "CANCELLED", 1, 499)                     \
	X(UNKNOWN, "UNKNOWN", 2, 500)                         \
	X(INVALID_ARGUMENT, "INVALID_ARGUMENT", 3, 400)       \
	X(DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED", 4, 504)     \
	X(NOT_FOUND, "NOT_FOUND", 5, 404)                     \
	X(ALREADY_EXISTS, "ALREADY_EXISTS", 6, 409)           \
	X(PERMISSION_DENIED, "PERMISSION_DENIED", 7, 403)     \
	X(RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED", 8, 429)   \
	X(FAILED_PRECONDITION, "FAILED_PRECONDITION", 9, 400) \
	X(ABORTED, "ABORTED", 10, 409)                        \
	X(OUT_OF_RANGE, "OUT_OF_RANGE", 11, 400)              \
	X(UNIMPLEMENTED, "UNIMPLEMENTED", 12, 501)            \
	X(INTERNAL, "INTERNAL", 13, 500)                      \
	X(UNAVAILABLE, "UNAVAILABLE", 14, 503)                \
	X(DATA_LOSS, "DATA_LOSS", 15, 500)                    \
	X(UNAUTHENTICATED, "UNAUTHENTICATED", 16, 401)

typedef enum ts_status {
#define TS__STATUS_ENUM(sym, name, grpc, http) TS_##sym = grpc,
	TS_STATUS_MAP(TS__STATUS_ENUM)
#undef TS__STATUS_ENUM
} ts_status;

/* Canonical name ("NOT_FOUND"); "UNKNOWN" for values outside the list. */
const char *ts_status_name(ts_status st);

/* HTTP status number of the canonical mapping; 500 for unknown values. */
int ts_status_http(ts_status st);

/* The errno of a failed system call, translated once (ENOMEM is
 * RESOURCE_EXHAUSTED, ENOENT NOT_FOUND, EACCES PERMISSION_DENIED, ...). */
ts_status ts_status_from_errno(int err);

#define TS_ERROR_MESSAGE_MAX 512
#define TS_ERROR_REASON_MAX 64
#define TS_ERROR_META_MAX 8

/*
 * A failure with its explanation. Metadata values are strings, as
 * google.rpc.ErrorInfo requires. The message and metadata values are cut
 * on a character boundary when too long; bytes of an echoed text that are
 * not UTF-8 are kept here (a caller may look for them) and replaced by
 * U+FFFD wherever the error is rendered (the reply, the log). The first error set is kept: ts_error_set()
 * on an error that already holds a failure does nothing, so cleanup paths
 * cannot overwrite the cause.
 */
struct ts_error {
	ts_status status;
	char reason[TS_ERROR_REASON_MAX];  /* UPPER_SNAKE, e.g. "OUT_OF_MEMORY" */
	char message[TS_ERROR_MESSAGE_MAX];
	int nmeta;
	struct {
		char key[32];
		char value[96];
	} meta[TS_ERROR_META_MAX];
};

/* Reset to TS_OK with no message. */
void ts_error_clear(struct ts_error *err);

/* Record a failure unless one is already recorded; returns err->status
 * (the first failure's code). err may be NULL (the status is returned). */
ts_status ts_error_set(struct ts_error *err, ts_status st, const char *reason,
                       const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* ts_error_set from a va_list, the message after prefix and ": " when
 * prefix is not NULL ("npy header" gives "npy header: ..."). */
ts_status ts_error_vset(struct ts_error *err, ts_status st, const char *reason,
                        const char *prefix, const char *fmt, va_list ap)
	__attribute__((format(printf, 5, 0)));

/* The one helper for bad input: INVALID_ARGUMENT with reason, the message
 * after prefix as ts_error_vset words it. Returns the recorded status. */
ts_status ts_error_bad(struct ts_error *err, const char *reason, const char *prefix,
                       const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* The one out-of-memory answer: RESOURCE_EXHAUSTED, reason OUT_OF_MEMORY,
 * the message as given (callers with figures add them as metadata too). */
ts_status ts_error_oom(struct ts_error *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* ts_error_oom with a va_list (for other layers' variadic wrappers). */
ts_status ts_error_voom(struct ts_error *err, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));

/* What did not fit, for ts_error_oom_bytes. */
#define TS_ERROR_UNKNOWN_BYTES UINT64_MAX
struct ts_oom_figures {
	const char *where;             /* the subject: "sim:0/device" */
	const char *ids[2][2];         /* {key, value} metadata put first; NULL key: none */
	uint64_t requested, free_bytes, limit;
	uint64_t largest;              /* largest free block; TS_ERROR_UNKNOWN_BYTES: unknown */
	const char *cause;             /* appended after ": " when not NULL */
};

/*
 * The one out-of-memory answer with figures, for every space and device:
 * "sim:0/device: cannot allocate 1048576 bytes (1.00 MiB); 512 bytes
 * (512 B) free (largest free block 512 B) of 4096 (4.00 KiB): <cause>" (the
 * largest block and the cause only when given), reason OUT_OF_MEMORY,
 * metadata: the ids, then requested_bytes, free_bytes,
 * largest_free_block_bytes (when known) and limit_bytes. Returns
 * RESOURCE_EXHAUSTED, or the error already recorded (then adds nothing).
 */
ts_status ts_error_oom_bytes(struct ts_error *err, const struct ts_oom_figures *f);

/* Add a metadata pair (silently truncated; dropped past TS_ERROR_META_MAX). */
void ts_error_meta(struct ts_error *err, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Metadata helper for byte counts. */
void ts_error_meta_u64(struct ts_error *err, const char *key, uint64_t v);

#endif
