/*
 * wait.c - answering when an operation finishes, without holding a thread:
 * POST /v1/operations/{operation}:wait, and ?wait=true / Prefer: wait=N on
 * calls that start operations. The connection is suspended; the operation's
 * completion (or the deadline) resumes it.
 */
#include "handlers/handlers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/units.h"
#include "handlers/operations.h"
#include "storage/operation.h"

#define WAIT_DEFAULT_S 60
#define WAIT_MAX_S 3600

struct waiter {
	struct ts_operation *op;        /* own reference */
	bool answer_result;             /* finished: answer the result itself, not the operation */
};

static bool waiter_arm(void *state, void (*wake)(void *token), void *token)
{
	struct waiter *w = state;

	return ts_operation_wait(w->op, wake, token);
}

static void waiter_disarm(void *state, void (*wake)(void *token), void *token)
{
	struct waiter *w = state;

	ts_operation_unwait(w->op, wake, token);
}

static void waiter_resume(void *state, bool timed_out, struct ts_reply *reply)
{
	struct waiter *w = state;
	struct ts_op_snapshot snap;

	ts_operation_snapshot(w->op, &snap);
	if (!snap.done || !w->answer_result) {
		ts_h_reply_operation(reply, w->op, snap.done);
	} else if (snap.state == TS_OP_SUCCEEDED) {
		ts_reply_json(reply, TS_HTTP_OK, snap.result ? json_incref(snap.result) : json_object());
	} else {
		ts_reply_error(reply, &snap.error);
	}
	(void)timed_out;
	ts_op_snapshot_release(&snap);
}

static void waiter_release(void *state)
{
	struct waiter *w = state;

	ts_operation_unref(w->op);
	free(w);
}

void ts_h_reply_wait(struct ts_reply *reply, struct ts_operation *op, uint64_t timeout_ns,
                     bool answer_result)
{
	struct waiter *w = malloc(sizeof *w);
	struct ts_suspend s;

	if (!w) {
		ts_h_reply_operation(reply, op, false);
		return;
	}
	w->op = ts_operation_ref(op);
	w->answer_result = answer_result;
	s = (struct ts_suspend){.timeout_ns = timeout_ns, .arm = waiter_arm,
	                        .disarm = waiter_disarm, .resume = waiter_resume,
	                        .release = waiter_release, .state = w};
	ts_reply_suspend(reply, &s);
}

bool ts_h_wait_requested(const struct ts_call *call, uint64_t *timeout_ns)
{
	const char *q = ts_call_query(call, "wait"), *prefer = ts_call_header(call, "Prefer");
	long secs = WAIT_DEFAULT_S;
	const char *p;

	if (prefer && (p = strcasestr(prefer, "wait=")) != NULL) {
		char num[16];
		size_t n = strspn(p + 5, "0123456789");

		if (n && n < sizeof num) {
			memcpy(num, p + 5, n);
			num[n] = '\0';
			secs = atol(num);
			*timeout_ns = (uint64_t)(secs > WAIT_MAX_S ? WAIT_MAX_S : secs) * 1000000000ull;
			return true;
		}
	}
	if (q && (strcmp(q, "true") == 0 || strcmp(q, "1") == 0)) {
		*timeout_ns = (uint64_t)secs * 1000000000ull;
		return true;
	}
	return false;
}

void ts_h_operations_wait(const struct ts_call *call, struct ts_reply *reply)
{
	const char *id = ts_call_param(call, "operation"), *t = ts_call_query(call, "timeout");
	struct ts_operation *op = id ? ts_op_get(call->core->operations, id) : NULL;
	double secs = WAIT_DEFAULT_S;
	json_t *body = NULL;

	if (!op) {
		ts_reply_fail(reply, TS_NOT_FOUND, "OPERATION_NOT_FOUND", "operation '%s' not found",
		              id ? id : "");
		return;
	}
	/* the timeout comes as ?timeout=30s or {"timeout": "30s"} (AIP-151) */
	if (!t && call->body_len) {
		body = json_loadb(call->body, call->body_len, 0, NULL);
		t = body ? json_string_value(json_object_get(body, "timeout")) : NULL;
	}
	if (t) {
		char *end;

		secs = strtod(t, &end);
		if (end == t || (*end && strcmp(end, "s") != 0) || !(secs >= 0) || secs > WAIT_MAX_S) {
			ts_reply_fail(reply, TS_INVALID_ARGUMENT, "BAD_TIMEOUT",
			              "timeout '%s' is not a number of seconds in 0..%d, as in \"30s\"", t,
			              WAIT_MAX_S);
			goto out;
		}
	}
	ts_h_reply_wait(reply, op, (uint64_t)(secs * 1e9), false);
out:
	json_decref(body);
	ts_operation_unref(op);
}
